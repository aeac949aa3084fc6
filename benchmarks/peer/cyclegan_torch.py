#!/usr/bin/env python3
"""The peer of bench_cyclegan: one CycleGAN training step in PyTorch, on CPU.

A port of examples/cyclegan/models.hpp (the networks) and of the `full` placement of
examples/cyclegan/trainer.hpp (the step), layer for layer and in the same order of forward and
backward passes, so that both sides do the same arithmetic:

  generator     c7s1-f (reflect pad 3, no bias), IN, ReLU; d2f, d4f (3x3 stride 2, zero pad 1, no
                bias), IN, ReLU; `blocks` residual blocks x + IN(conv(ReLU(IN(conv(x))))) (3x3,
                reflect pad 1, no bias); u2f, uf (transposed 3x3 stride 2 pad 1 output_padding 1, no
                bias), IN, ReLU; c7s1-C (reflect pad 3, WITH bias); tanh. IN = instance norm
                without affine parameters, eps 1e-5.
  discriminator 4x4 conv stride 2 pad 1 (bias), LeakyReLU 0.2; for i in 1..d_layers-1 a stage
                conv 4x4 stride 2 pad 1 (no bias) -> IN -> LeakyReLU 0.2 with f*2^min(i,3)
                channels; one stride-1 stage with f*2^min(d_layers,3) channels; a 4x4 stride-1 conv
                (bias) to 1 channel.
  step          generators: zero their gradients; identity G_AB(b)~b and G_BA(a)~a (L1, weight
                0.5*lambda), each backward right after its forward; path A: fake_b = G_AB(a),
                cycle L1(G_BA(fake_b), a)*lambda + LSGAN mse(D_B(fake_b), 1), one backward; path B
                alike with G_BA, G_AB, D_A; Adam on G_AB, then on G_BA. Discriminators: the fakes go
                through a 50-image pool; D_A: zero grad, 0.5*mse(D_A(real_a), 1) backward,
                0.5*mse(D_A(pool(fake_a)), 0) backward, Adam; then D_B alike. lambda = 10;
                Adam lr 2e-4, betas (0.5, 0.999), eps 1e-8.

As in the C++ trainer, the discriminators' parameter gradients are computed during the generators'
backward too (and then zeroed): the same compute on both sides.

With --ddp the step runs under DistributedDataParallel (gloo) on --world-size processes of one
thread each, started here with torch.multiprocessing; the global batch is split between the ranks.
Backward passes that the C++ trainer does not all-reduce run under no_sync(), so each network's
gradients are all-reduced once per half-step, as the C++ trainer does. Each rank keeps its own image
pool (the C++ trainer pools the gathered global batch on the primary; the arithmetic is a copy).

--check-dir DIR (written by `bench_cyclegan --check-dir DIR`) loads the C++ side's initial parameters
and input batch, runs one step (in float32, and in float64 as the reference) and compares the step's
losses, every parameter's gradient and the parameters after the step with the C++ side's; exits 1 if
they disagree (see run_check for the rule).
"""

import argparse
import contextlib
import json
import os
import random
import resource
import socket
import statistics
import sys
import time
from contextlib import ExitStack

import torch
import torch.nn as nn
import torch.nn.functional as F

# What importing torch alone costs in resident memory, to read the peak RSS beside.
IMPORT_RSS_MIB = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

INIT_STDDEV = 0.02  # distribute::nn::init_stddev


# ---------------------------------------------------------------------------------------------
# Networks


class Residual(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(ch, ch, 3, 1, 1, padding_mode="reflect", bias=False),
            nn.InstanceNorm2d(ch, affine=False),
            nn.ReLU(inplace=True),
            nn.Conv2d(ch, ch, 3, 1, 1, padding_mode="reflect", bias=False),
            nn.InstanceNorm2d(ch, affine=False),
        )

    def forward(self, x):
        return x + self.body(x)


def make_generator(channels, filters, blocks):
    c, f = channels, filters

    def inr(ch):
        return [nn.InstanceNorm2d(ch, affine=False), nn.ReLU(inplace=True)]

    layers = [nn.Conv2d(c, f, 7, 1, 3, padding_mode="reflect", bias=False), *inr(f),
              nn.Conv2d(f, 2 * f, 3, 2, 1, bias=False), *inr(2 * f),
              nn.Conv2d(2 * f, 4 * f, 3, 2, 1, bias=False), *inr(4 * f)]
    layers += [Residual(4 * f) for _ in range(blocks)]
    layers += [nn.ConvTranspose2d(4 * f, 2 * f, 3, 2, 1, output_padding=1, bias=False), *inr(2 * f),
               nn.ConvTranspose2d(2 * f, f, 3, 2, 1, output_padding=1, bias=False), *inr(f),
               nn.Conv2d(f, c, 7, 1, 3, padding_mode="reflect", bias=True),
               nn.Tanh()]
    return nn.Sequential(*layers)


def make_discriminator(channels, filters, d_layers):
    if d_layers < 1:
        raise ValueError("--d-layers must be at least 1")
    f = filters
    layers = [nn.Conv2d(channels, f, 4, 2, 1, bias=True), nn.LeakyReLU(0.2, inplace=True)]
    ch = f
    for i in range(1, d_layers):
        nxt = f * (1 << min(i, 3))
        layers += [nn.Conv2d(ch, nxt, 4, 2, 1, bias=False), nn.InstanceNorm2d(nxt, affine=False),
                   nn.LeakyReLU(0.2, inplace=True)]
        ch = nxt
    last = f * (1 << min(d_layers, 3))
    layers += [nn.Conv2d(ch, last, 4, 1, 1, bias=False), nn.InstanceNorm2d(last, affine=False),
               nn.LeakyReLU(0.2, inplace=True)]
    layers += [nn.Conv2d(last, 1, 4, 1, 1, bias=True)]
    return nn.Sequential(*layers)


def init_weights(m, gen):
    """The C++ layers' initialisation: weights N(0, 0.02), biases zero (values differ, the law not)."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, INIT_STDDEV, generator=gen)


def count(m):
    return sum(p.numel() for p in m.parameters())


# ---------------------------------------------------------------------------------------------
# The step


class ImagePool:
    """CycleGAN's history of fakes (50 images): until full, every fake is stored and returned; then
    each fake is, half of the time, swapped for a random stored one."""

    def __init__(self, capacity, seed):
        self.capacity = capacity
        self.images = []
        self.rng = random.Random(seed)

    def query(self, fakes):
        fakes = fakes.detach()
        if self.capacity == 0:
            return fakes
        out = []
        for img in fakes:
            img = img.unsqueeze(0)
            if len(self.images) < self.capacity:
                self.images.append(img.clone())
                out.append(img)
            elif self.rng.random() < 0.5:
                k = self.rng.randrange(self.capacity)
                out.append(self.images[k])
                self.images[k] = img.clone()
            else:
                out.append(img)
        return torch.cat(out, 0)


def no_sync(stack, *modules):
    """Enter no_sync() of every DDP-wrapped module (a no-op for plain modules)."""
    for m in modules:
        if hasattr(m, "no_sync"):
            stack.enter_context(m.no_sync())


class Step:
    def __init__(self, g_ab, g_ba, d_a, d_b, lam=10.0, idt=0.5, lr=2e-4, betas=(0.5, 0.999), pool=50, seed=1):
        self.g_ab, self.g_ba, self.d_a, self.d_b = g_ab, g_ba, d_a, d_b
        self.w_cyc, self.w_idt = lam, lam * idt
        adam = lambda m: torch.optim.Adam(m.parameters(), lr=lr, betas=betas, eps=1e-8)
        self.o_gab, self.o_gba, self.o_da, self.o_db = adam(g_ab), adam(g_ba), adam(d_a), adam(d_b)
        self.pool_a, self.pool_b = ImagePool(pool, seed * 16 + 5), ImagePool(pool, seed * 16 + 6)

    def __call__(self, a, b):
        g_ab, g_ba, d_a, d_b = self.g_ab, self.g_ba, self.d_a, self.d_b
        losses = {}
        # Generators.
        self.o_gab.zero_grad(set_to_none=False)
        self.o_gba.zero_grad(set_to_none=False)
        with ExitStack() as s:
            no_sync(s, g_ab, g_ba)
            idt_b = F.l1_loss(g_ab(b), b)
            (self.w_idt * idt_b).backward()
            idt_a = F.l1_loss(g_ba(a), a)
            (self.w_idt * idt_a).backward()
        losses["identity"] = self.w_idt * (idt_a.item() + idt_b.item())

        def path(real, g, back, d):
            fake = g(real)
            cyc = F.l1_loss(back(fake), real)
            score = d(fake)
            adv = F.mse_loss(score, torch.ones_like(score))
            (self.w_cyc * cyc + adv).backward()
            return fake, cyc.item(), adv.item()

        with ExitStack() as s:  # path A: nothing all-reduced yet
            no_sync(s, g_ab, g_ba, d_b)
            fake_b, cyc_a, losses["gan_ab"] = path(a, g_ab, g_ba, d_b)
        with ExitStack() as s:  # path B: the generators' gradients are all-reduced here
            no_sync(s, d_a)
            fake_a, cyc_b, losses["gan_ba"] = path(b, g_ba, g_ab, d_a)
        losses["cycle"] = self.w_cyc * (cyc_a + cyc_b)
        self.o_gab.step()
        self.o_gba.step()

        # Discriminators.
        pooled_a = self.pool_a.query(fake_a)
        pooled_b = self.pool_b.query(fake_b)

        def one(d, opt, real, fake):
            opt.zero_grad(set_to_none=False)
            with ExitStack() as s:
                no_sync(s, d)
                sr = d(real)
                lr_ = F.mse_loss(sr, torch.ones_like(sr))
                (0.5 * lr_).backward()
            sf = d(fake)
            lf = F.mse_loss(sf, torch.zeros_like(sf))
            (0.5 * lf).backward()
            opt.step()
            return 0.5 * (lr_.item() + lf.item())

        losses["d_a"] = one(d_a, self.o_da, a, pooled_a)
        losses["d_b"] = one(d_b, self.o_db, b, pooled_b)
        return losses


# ---------------------------------------------------------------------------------------------
# Running


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "unknown"


def networks(o, seed):
    gen = torch.Generator().manual_seed(seed)
    g_ab = make_generator(o.channels, o.filters, o.blocks)
    g_ba = make_generator(o.channels, o.filters, o.blocks)
    d_a = make_discriminator(o.channels, o.filters, o.d_layers)
    d_b = make_discriminator(o.channels, o.filters, o.d_layers)
    for m in (g_ab, g_ba, d_a, d_b):
        init_weights(m, gen)
    return g_ab, g_ba, d_a, d_b


def batches(o, n, seed):
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    shape = (n, o.channels, o.size, o.size)
    return torch.rand(shape, generator=gen) * 2 - 1, torch.rand(shape, generator=gen) * 2 - 1


def timed_steps(step, a, b, o, barrier=None):
    first = None
    for i in range(o.warmup):
        l = step(a, b)
        first = first or l
    times = []
    for i in range(o.steps):
        if barrier:
            barrier()
        t0 = time.perf_counter()
        l = step(a, b)
        times.append(time.perf_counter() - t0)
        first = first or l
    return times, first


def report(o, mode, world, threads, g_params, d_params, times, first, rss, import_rss, device_mib=None):
    per_step = statistics.median(times)
    mean = statistics.fmean(times)
    images = o.batch / per_step
    label = f"DDP gloo {world}x{threads} thread" if mode == "ddp" else f"{threads} threads"
    if o.device == "cuda":
        label = f"{torch.cuda.get_device_name(0)}, " + (f"autocast {o.amp}" if o.amp != "none" else ("TF32" if o.tf32 else "float32"))
        label += ", CUDA graphs" if getattr(o, "graphs", False) else ""
    elif getattr(o, "amp", "none") != "none":
        label += f", autocast {o.amp}"

    print(f"cyclegan_torch: torch {torch.__version__}, {label}, {o.size}x{o.size}x{o.channels}, {o.filters} filters, "
          f"{o.blocks} blocks, {o.d_layers} d-layers, global batch {o.batch}")
    print(f"  parameters: G {g_params}, D {d_params} (each of two)")
    print("  step-1 losses: " + ", ".join(f"{k} {first[k]:.6f}" for k in ("d_a", "d_b", "gan_ab", "gan_ba", "cycle", "identity")))
    print(f"  {per_step:.4f} s/step (median of {o.steps}, mean {mean:.4f}; {o.warmup} warm-up), {images:.4g} images/s, "
          f"peak RSS {rss:.1f} MiB{' (max over ranks)' if mode == 'ddp' else ''}, {import_rss:.1f} MiB of it after importing torch"
          + (f", peak device memory {device_mib:.1f} MiB" if device_mib is not None else ""))
    print(json.dumps({
        "bench": "cyclegan", "side": "peer", "framework": "torch", "version": torch.__version__, "mode": mode,
        "device": torch.cuda.get_device_name(0) if o.device == "cuda" else "cpu", "tf32": o.tf32, "autotune": getattr(o, "autotune", False), "precision": getattr(o, "amp", "none"),
        "graphs": getattr(o, "graphs", False),
        "peak_device_mib": round(device_mib, 1) if device_mib is not None else -1,
        "world_size": world, "threads": threads, "size": o.size, "channels": o.channels, "filters": o.filters,
        "blocks": o.blocks, "d_layers": o.d_layers, "global_batch": o.batch, "steps": o.steps, "warmup": o.warmup,
        "g_params": g_params, "d_params": d_params, "s_per_step": round(per_step, 6), "s_per_step_mean": round(mean, 6),
        "images_per_s": round(images, 4), "peak_rss_mib": round(rss, 1), "import_rss_mib": round(import_rss, 1),
        "step1_losses": {k: first[k] for k in ("d_a", "d_b", "gan_ab", "gan_ba", "cycle", "identity")}, "load": load_average(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}), flush=True)


def graph_networks(step, sample, o):
    """CUDA graphs as PyTorch users write them for modules: torch.cuda.make_graphed_callables, each
    network's forward and backward captured once and replayed (each network on its own, since the
    step calls them in no fixed order). Every call must match the sample's requires_grad, so inputs
    that do not require grad are given copies that do (the networks then also compute those inputs'
    gradients, which the eager step and the C++ side skip); the outputs alias the graph's own memory,
    so each is cloned (the C++ side copies them too)."""
    ctx = (torch.autocast(device_type="cuda", dtype=torch.bfloat16 if o.amp == "bf16" else torch.float16, cache_enabled=False)
           if o.amp != "none" else contextlib.nullcontext())
    x = sample.detach().clone().requires_grad_(True)

    def graphed(m):
        with ctx:
            f = torch.cuda.make_graphed_callables(m, (x,))
        return lambda t: f(t if t.requires_grad else t.detach().requires_grad_(True)).clone()

    step.g_ab, step.g_ba, step.d_a, step.d_b = (graphed(m) for m in (step.g_ab, step.g_ba, step.d_a, step.d_b))


def run_single(o):
    torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    g_ab, g_ba, d_a, d_b = networks(o, o.seed)
    a, b = batches(o, o.batch, o.seed)
    device_mib = None
    if o.device == "cuda":
        # Eager mode as users run it; TF32 only when asked (both sides then use tensor cores).
        torch.backends.cuda.matmul.allow_tf32 = o.tf32
        torch.backends.cudnn.allow_tf32 = o.tf32
        # --autotune: cuDNN's algorithms timed per shape (ours: engine_options::conv_autotune).
        torch.backends.cudnn.benchmark = o.autotune
        dev = torch.device("cuda", 0)
        g_ab, g_ba, d_a, d_b = (m.to(dev) for m in (g_ab, g_ba, d_a, d_b))
        a, b = a.to(dev), b.to(dev)
    step = Step(g_ab, g_ba, d_a, d_b, seed=o.seed)
    if o.amp != "none":
        # Automatic mixed precision as users write it: the whole step under autocast (convolutions and
        # matrix products in 16 bits, fp32 parameters and optimiser state).
        dtype = torch.bfloat16 if o.amp == "bf16" else torch.float16
        fp32_step = step

        def step(a, b):
            with torch.autocast(device_type=o.device, dtype=dtype):
                return fp32_step(a, b)
    if o.graphs:
        graph_networks(step, a, o)
    if o.device == "cuda":
        for _ in range(o.warmup):  # warm-up outside the peak: the timed steps' memory is what is compared
            step(a, b)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        o = argparse.Namespace(**{**vars(o), "warmup": 0})
    times, first = timed_steps(step, a, b, o)  # every step ends in .item(): the GPU's work is done
    if o.device == "cuda":
        device_mib = torch.cuda.max_memory_allocated() / (1024.0 * 1024.0)
    report(o, "single", 1, torch.get_num_threads(), count(g_ab), count(d_a), times, first, peak_rss_mib(), IMPORT_RSS_MIB,
           device_mib)


def ddp_worker(rank, o, port):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=o.world_size)
    torch.manual_seed(o.seed)
    g_ab, g_ba, d_a, d_b = networks(o, o.seed)  # the same seed: every rank starts from the same weights
    g_params, d_params = count(g_ab), count(d_a)
    a, b = batches(o, o.batch, o.seed)
    share = o.batch // o.world_size
    a, b = a[rank * share:(rank + 1) * share], b[rank * share:(rank + 1) * share]
    wrap = lambda m: DDP(m)  # no buffers to broadcast: instance norm keeps no running statistics
    step = Step(wrap(g_ab), wrap(g_ba), wrap(d_a), wrap(d_b), seed=o.seed + rank)
    if o.amp != "none":  # the step under autocast, as in the single process
        fp32_step = step

        def step(a, b):
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                return fp32_step(a, b)
    times, first = timed_steps(step, a, b, o, barrier=dist.barrier)
    # Losses are per-rank means; the global mean is their average. Times are rank 0's, RSS the maximum.
    keys = ("d_a", "d_b", "gan_ab", "gan_ba", "cycle", "identity")
    lt = torch.tensor([first[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(lt)
    rss = torch.tensor([peak_rss_mib(), IMPORT_RSS_MIB], dtype=torch.float64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank ends
    if rank == 0:
        first = {k: v / o.world_size for k, v in zip(keys, lt.tolist())}
        report(o, "ddp", o.world_size, 1, g_params, d_params, tt.tolist(), first, rss[0].item(), rss[1].item())
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(o):
    import torch.multiprocessing as mp

    if o.batch % o.world_size:
        sys.exit("cyclegan_torch: --batch (global) must be a multiple of --world-size")
    mp.spawn(ddp_worker, args=(o, free_port()), nprocs=o.world_size, join=True)


# ---------------------------------------------------------------------------------------------
# The step-1 check against the C++ trainer


def read_floats(path):
    with open(path, "rb") as f:
        data = f.read()
    return torch.frombuffer(bytearray(data), dtype=torch.float32)


def loaded_step(o, dtype):
    """The networks with the C++ side's initial parameters, and one step of them in `dtype`."""
    d = o.check_dir
    g_ab, g_ba, d_a, d_b = networks(o, o.seed)
    nets = (("G_AB", g_ab), ("G_BA", g_ba), ("D_A", d_a), ("D_B", d_b))
    params = [p for _, m in nets for p in m.parameters()]
    init = read_floats(os.path.join(d, "init.bin"))
    total = sum(p.numel() for p in params)
    if init.numel() != total:
        sys.exit(f"check: the C++ side wrote {init.numel()} parameters, the port has {total}")
    off = 0
    with torch.no_grad():
        for p in params:
            p.copy_(init[off:off + p.numel()].view_as(p))
            off += p.numel()
    for _, m in nets:
        m.to(dtype)
    data = read_floats(os.path.join(d, "data.bin"))
    n = data.numel() // (2 * o.channels * o.size * o.size)
    if n != o.batch:
        sys.exit(f"check: data.bin holds {n} images per domain, --batch is {o.batch}")
    a, b = data.to(dtype).view(2, n, o.channels, o.size, o.size).unbind(0)
    losses = Step(g_ab, g_ba, d_a, d_b, seed=o.seed)(a.contiguous(), b.contiguous())
    grads = {name: torch.cat([p.grad.reshape(-1).double() for p in m.parameters()]) for name, m in nets}
    after = {name: torch.cat([p.detach().reshape(-1).double() for p in m.parameters()]) for name, m in nets}
    return nets, total, losses, grads, after


def run_check(o):
    """Step 1 from the C++ side's weights and batch, in float32 (the port as timed) and in float64 (the
    reference). Losses must agree within --loss-tol. Gradients: the networks have ReLU, LeakyReLU and
    L1 kinks and instance norms, and two correct float32 implementations can differ in the last bits
    enough to move a generator's gradient by 1e-3 (torch's own float32 step differs from its float64
    step by that much at some shapes). So the C++ gradients agree when they are within --grad-tol of
    torch's float32 ones, or at most twice as far from the float64 ones as torch's float32 ones are;
    they are flagged (WARN) up to 1e-2, and disagree beyond it (a wrong layer or term gives O(1))."""
    torch.set_num_threads(o.threads)
    d = o.check_dir
    nets, total, losses, g32, p32 = loaded_step(o, torch.float32)
    _, _, losses64, g64, _ = loaded_step(o, torch.float64)
    with open(os.path.join(d, "ours.json")) as f:
        ours = json.load(f)
    grads = read_floats(os.path.join(d, "grads.bin")).double()
    after = read_floats(os.path.join(d, "after.bin")).double()
    if grads.numel() != total or after.numel() != total:
        sys.exit("check: grads.bin or after.bin does not hold one value per parameter")
    ok, warn = True, False
    print(f"step-1 check: {o.size}x{o.size}x{o.channels}, {o.filters} filters, {o.blocks} blocks, {o.d_layers} d-layers, "
          f"batch {o.batch}, {total} parameters")
    print(f"  {'loss':<10} {'ours':>14} {'torch f32':>14} {'torch f64':>14} {'rel. diff f32':>13}")
    worst_loss = 0.0
    for k in ("d_a", "d_b", "gan_ab", "gan_ba", "cycle", "identity"):
        rel = abs(ours[k] - losses[k]) / max(abs(losses[k]), 1e-12)
        worst_loss = max(worst_loss, rel)
        print(f"  {k:<10} {ours[k]:>14.8f} {losses[k]:>14.8f} {losses64[k]:>14.8f} {rel:>13.2e}")
    if worst_loss > o.loss_tol:
        ok = False
    rel = lambda x, y: ((x - y).norm() / y.norm().clamp_min(1e-30)).item()
    print("  gradients, relative L2 distance per network:")
    print(f"  {'network':<8} {'ours-f32':>10} {'ours-f64':>10} {'f32-f64':>10} {'verdict':>9} {'params after: max |ours-f32|':>30}")
    worst = {}
    off = 0
    for name, m in nets:
        k = g32[name].numel()
        go, po = grads[off:off + k], after[off:off + k]
        off += k
        e32, e64, noise = rel(go, g32[name]), rel(go, g64[name]), rel(g32[name], g64[name])
        if e32 <= o.grad_tol or e64 <= max(o.grad_tol, 2 * noise):
            verdict = "agree"
        elif min(e32, e64) <= 1e-2:
            verdict, warn = "WARN", True
        else:
            verdict, ok = "DISAGREE", False
        worst[name] = {"ours_f32": e32, "ours_f64": e64, "f32_f64": noise, "verdict": verdict}
        pd = (po - p32[name]).abs().max().item()
        print(f"  {name:<8} {e32:>10.2e} {e64:>10.2e} {noise:>10.2e} {verdict:>9} {pd:>30.2e}")
    print(json.dumps({"bench": "cyclegan_check", "size": o.size, "filters": o.filters, "blocks": o.blocks,
                      "d_layers": o.d_layers, "batch": o.batch, "parameters": total,
                      "worst_loss_rel_diff": worst_loss, "gradients": worst, "ok": ok, "warn": warn}))
    # Parameters after one Adam step differ by up to 2 lr where a gradient is near zero and its sign
    # is a matter of rounding (Adam's first step is lr * sign(g)); they are shown, not judged.
    verdict = "DISAGREE" if not ok else "AGREE, with gradient warnings" if warn else "AGREE"
    print(f"  {verdict} (losses within {o.loss_tol:g} relative; gradients: see above)")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=28)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--filters", type=int, default=16)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--d-layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8, help="global batch (split between the ranks under --ddp)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (single process)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel, gloo, --world-size ranks of 1 thread")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the step on GPU 0 (single process)")
    p.add_argument("--tf32", action="store_true", help="cuda: allow TF32 in convolutions and matrix products")
    p.add_argument("--autotune", action="store_true", help="cuda: torch.backends.cudnn.benchmark (time cuDNN's algorithms per shape)")
    p.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none",
                   help="the step under torch.autocast in bfloat16 (cpu or cuda) or float16 (cuda; no GradScaler, as the C++ side's trainer)")
    p.add_argument("--graphs", action="store_true",
                   help="cuda: each network's forward and backward as CUDA graphs (torch.cuda.make_graphed_callables)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--params-only", action="store_true", help="print the parameter counts as JSON and exit")
    p.add_argument("--check-dir", help="compare one step with the C++ side's (bench_cyclegan --check-dir)")
    p.add_argument("--loss-tol", type=float, default=1e-5)
    p.add_argument("--grad-tol", type=float, default=1e-4)
    o = p.parse_args()
    if o.amp == "fp16" and o.device != "cuda":
        p.error("--amp fp16 needs --device cuda (on the CPU: --amp bf16)")
    if o.graphs and (o.device != "cuda" or o.ddp):
        p.error("--graphs needs --device cuda (single process)")
    if o.params_only:
        g = make_generator(o.channels, o.filters, o.blocks)
        d = make_discriminator(o.channels, o.filters, o.d_layers)
        print(json.dumps({"g_params": count(g), "d_params": count(d)}))
        return 0
    if o.check_dir:
        return run_check(o)
    if o.ddp:
        if o.device != "cpu":
            p.error("--ddp runs on the CPU (gloo); --device cuda is single-process")
        run_ddp(o)
    else:
        run_single(o)
    return 0


if __name__ == "__main__":
    sys.exit(main())
