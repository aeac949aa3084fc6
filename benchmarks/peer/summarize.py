#!/usr/bin/env python3
"""The table of run_peer.sh: one row per configuration, medians over the rounds.

  summarize.py RESULTS.jsonl LOAD_AT_START LOAD_AT_END

ratio = ours' images/s / the peer's images/s (above 1: ours is faster), the median of the rounds'
ratios, with their range; peak RSS is the largest of the rounds (the peer's includes what importing
torch takes, shown in brackets); load is the 1-minute load average before the configuration's first
run and after its last.
"""

import json
import statistics
import sys

TITLES = {
    "a": "(a) demo, one_device vs torch, all cores",
    "b": "(b) demo, 1 thread vs 1 thread (core 0)",
    "c": "(c) demo, mirrored 2 vs torch DDP gloo 2x1",
    "d": "(d) paper 256x256x3, one_device vs torch",
    "g1": "(g1) GPU demo, one_device vs torch eager",
    "g2": "(g2) GPU paper, batch 1, vs torch eager",
    "g3": "(g3) GPU paper, batch 4, vs torch eager",
    "g4": "(g4) GPU demo, 2 logical replicas vs torch",
}


def main():
    path, load_start, load_end = sys.argv[1:4]
    rows = [json.loads(l) for l in open(path) if l.strip()]
    print()
    print(f"{'configuration':<44} {'ours s/step':>11} {'img/s':>7} {'peer s/step':>11} {'img/s':>7} "
          f"{'ours/peer':>9} {'(range)':>13} {'RSS ours':>9} {'RSS peer (import)':>18} {'load start->end':>16}")
    for c in sorted({r["config"] for r in rows}):
        ours = {r["round"]: r for r in rows if r["config"] == c and r["side"] == "ours"}
        peer = {r["round"]: r for r in rows if r["config"] == c and r["side"] == "peer"}
        rounds = sorted(set(ours) & set(peer))
        if not rounds:
            continue
        os_ = statistics.median(ours[k]["s_per_step"] for k in rounds)
        ps_ = statistics.median(peer[k]["s_per_step"] for k in rounds)
        oi = statistics.median(ours[k]["images_per_s"] for k in rounds)
        pi = statistics.median(peer[k]["images_per_s"] for k in rounds)
        ratios = [ours[k]["images_per_s"] / peer[k]["images_per_s"] for k in rounds]
        ratio = statistics.median(ratios)
        rss_o = max(ours[k]["peak_rss_mib"] for k in rounds)
        rss_p = max(peer[k]["peak_rss_mib"] for k in rounds)
        imp = max(peer[k].get("import_rss_mib", 0) for k in rounds)
        runs = sorted((r for r in rows if r["config"] == c), key=lambda r: (r["round"], r["side"] != "ours"))
        l0 = runs[0]["load_start"].split()[0]
        l1 = runs[-1]["load_end"].split()[0]
        print(f"{TITLES.get(c, c):<44} {os_:>11.4f} {oi:>7.3g} {ps_:>11.4f} {pi:>7.3g} {ratio:>9.2f} "
              f"{f'{min(ratios):.2f}-{max(ratios):.2f}':>13} {rss_o:>7.0f}Mi {f'{rss_p:.0f}Mi ({imp:.0f})':>18} "
              f"{f'{l0}->{l1}':>16}")
        aborted = [k for k in rounds if peer[k].get("exit_status", 0) != 0]
        if aborted:
            print(f"{'':<44} the peer exited with a failure after reporting its result in round(s) "
                  f"{', '.join(str(k) for k in aborted)} (kept: the measurement had ended)")
        dev_o = max(ours[k].get("peak_device_mib", -1) for k in rounds)
        dev_p = max(peer[k].get("peak_device_mib", -1) for k in rounds)
        if dev_o >= 0 or dev_p >= 0:
            print(f"{'':<44} {ours[rounds[0]].get('device', '')}: peak device memory ours {dev_o:.0f} MiB, torch {dev_p:.0f} MiB; "
                  f"s/step ours/torch {os_ / ps_:.2f} (goal at paper size: at most 0.8)")
    print(f"\n{len(rounds)} rounds; load average (1, 5, 15 min) at start {load_start}, at end {load_end}")


if __name__ == "__main__":
    main()
