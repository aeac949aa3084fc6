#!/usr/bin/env bash
# The MPI tests' program under a real Slurm: a one-node cluster on this machine (munged, slurmctld,
# slurmd, all in a temporary directory, on ports of their own), and the program launched by it
#   1. directly:          srun -n 2 --mpi=pmix PROGRAM --run_test=strategy,collectives
#   2. inside an allocation: salloc -n 2 MPIEXEC -n 2 [PREFLAGS] PROGRAM --run_test=...
#   3. preemption:        srun -n 2 --mpi=pmix PROGRAM --scenario=preempt, a SIGUSR1 from Slurm to the
#                         job's tasks (scancel --signal, the way Slurm signals a job it preempts or
#                         whose time runs out under srun --signal), then the job again: it resumes
#
#   run_slurm_test.sh PROGRAM STATE_DIR MPIEXEC [MPIEXEC_PREFLAGS...]
#   run_slurm_test.sh --cleanup STATE_DIR        stop what a killed run left behind
#
# Exit status: 0 passed, 1 failed, 77 skipped (Slurm and munge missing and not installable, or not
# root: slurmd starts job steps as root). Where `slurm-wlm` or `munge` is missing and we are root,
# they are installed with apt-get (DISTRIBUTE_SLURM_INSTALL=0 skips instead).
#
# Nothing outlives the run. Every process it starts carries DISTRIBUTE_SLURM_RUN=<its temp dir> in
# its environment (slurmstepd and the tasks inherit it: they put themselves in sessions of their own,
# so neither a process group nor the process tree finds them), and the temp dir, the daemons' pids
# and that marker are written to STATE_DIR/run.env before anything starts. Cleanup (scancel, TERM
# the daemons, then KILL whatever still carries the marker, remove the temp dir) runs
#   - on exit, from the EXIT trap (INT, TERM and HUP exit through it);
#   - from a watchdog, outside ctest's process tree, that waits for this script to end: ctest kills a
#     test that runs past its TIMEOUT with SIGKILL, which no trap sees;
#   - at the start of the next run, from STATE_DIR/run.env, should both have been killed too.
# The script leads a session and process group of its own (the daemons and launchers run in it), so
# that on exit it can kill that group without reaching ctest or the shell that started it. The
# cluster has its own slurm.conf (SLURM_CONF), munge socket and ports: a Slurm or munged already
# running on the machine is never talked to.
set -uo pipefail

self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
readonly self
readonly marker_name=DISTRIBUTE_SLURM_RUN
t0=$SECONDS

log() { printf '[%3ds] %s\n' "$((SECONDS - t0))" "$*"; }
skip() { log "SKIP: $*"; exit 77; }
fail() { log "FAIL: $*"; exit 1; }

# Field N of /proc/PID/stat (5: process group, 6: session, 22: start time).
proc_field() {
  local stat n=$(($2 - 2))
  stat=$(<"/proc/$1/stat") 2>/dev/null || return 1
  stat=${stat##*) }  # past "pid (comm) ": the rest starts at field 3
  # shellcheck disable=SC2086
  set -- $stat
  echo "${!n}"
}
# Processes whose environment holds marker=value exactly (the caller's own environment does not).
marked_pids() {
  local f
  grep -lzxF "$marker_name=$1" /proc/[0-9]*/environ 2>/dev/null | while read -r f; do
    f=${f#/proc/}
    echo "${f%/environ}"
  done
}

is_marked() { grep -qzxF "$marker_name=$2" "/proc/$1/environ" 2>/dev/null; }
any_marked() {  # RUN_ID PID...
  local run=$1 pid
  shift
  for pid; do is_marked "$pid" "$run" && return 0; done
  return 1
}

# Stops everything the run recorded in STATE_DIR/run.env started, and removes its files. Safe to run
# more than once, and from several places at the same time.
cleanup_run() {
  local state_dir=$1 env_file=$1/run.env
  [[ -f $env_file ]] || return 0
  local run_id='' run_tmp='' run_shm='' munged_pid='' slurmctld_pid='' slurmd_pid='' pid name i
  # shellcheck disable=SC1090
  source "$env_file" 2>/dev/null || true
  if [[ -z $run_id ]]; then rm -f "$env_file"; return 0; fi

  # Jobs first, while the controller is there to end them: slurmstepd then stops its tasks.
  if [[ -n $slurmctld_pid ]] && is_marked "$slurmctld_pid" "$run_id" && [[ -f $run_tmp/slurm.conf ]]; then
    env SLURM_CONF="$run_tmp/slurm.conf" timeout 10 scancel --quiet --user="$(id -un)" 2>/dev/null
    for ((i = 0; i < 20; i++)); do
      [[ -z $(env SLURM_CONF="$run_tmp/slurm.conf" timeout 5 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.25
    done
  fi
  # The daemons, given up to 5 s to exit (a killed one is a zombie, whose environment is empty).
  local daemons=()
  for name in slurmd slurmctld munged; do
    pid=${name}_pid; pid=${!pid}
    [[ -n $pid ]] && is_marked "$pid" "$run_id" && kill -TERM "$pid" 2>/dev/null && daemons+=("$pid")
  done
  for ((i = 0; i < 20; i++)); do
    any_marked "$run_id" "${daemons[@]}" || break
    sleep 0.25
  done
  # Whatever still carries the marker: daemons that would not stop, job steps and tasks whose
  # slurmd was killed, launchers. Again while any is left (one may have forked meanwhile).
  local left
  for ((i = 0; i < 5; i++)); do
    left=$(marked_pids "$run_id")
    [[ -n $left ]] || break
    for pid in $left; do
      log "cleanup: killing $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-80))"
      kill -KILL "$pid" 2>/dev/null
    done
    sleep 0.2
  done
  case $run_tmp in */distribute-slurm.*) rm -rf "$run_tmp" ;; esac
  case $run_shm in */distribute-slurm.*) rm -rf "$run_shm" ;; esac
  rm -f "$env_file"
}

# --cleanup STATE_DIR
if [[ ${1:-} == --cleanup ]]; then
  cleanup_run "$2"
  exit 0
fi

# --watch PID START_TIME STATE_DIR: wait for the test script to end, however it ends, then clean up.
if [[ ${1:-} == --watch ]]; then
  watched=$2 watched_start=$3 state_dir=$4
  echo $$ >"$state_dir/watchdog.pid"
  while [[ $(proc_field "$watched" 22 2>/dev/null) == "$watched_start" ]]; do sleep 1; done
  if [[ -f $state_dir/run.env ]]; then
    log "watchdog: test script $watched is gone; cleaning up after it"
    cleanup_run "$state_dir"
  fi
  rm -f "$state_dir/watchdog.pid"
  exit 0
fi

if (($# < 3)); then
  echo "usage: $0 PROGRAM STATE_DIR MPIEXEC [MPIEXEC_PREFLAGS...] | --cleanup STATE_DIR" >&2
  exit 2
fi

# A session and process group of our own (setsid forks only where we already lead a group; -w keeps
# the exit status).
if [[ $(proc_field $$ 6) != "$$" && -z ${DISTRIBUTE_SLURM_SETSID:-} ]]; then
  DISTRIBUTE_SLURM_SETSID=1 exec setsid -w "$BASH" "$self" "$@"
fi

program=$1 state_dir=$2 mpiexec=$3
shift 3
mpiexec_preflags=("$@")
[[ -x $program ]] || fail "no test program at $program (build the distribute_mpi_tests target)"
program=$(cd "$(dirname "$program")" && pwd)/$(basename "$program")  # the jobs run elsewhere
mkdir -p "$state_dir" || fail "cannot create $state_dir"
state_dir=$(cd "$state_dir" && pwd)

# What a killed run left behind.
if [[ -f $state_dir/run.env ]]; then
  log "a previous run did not clean up ($state_dir/run.env); cleaning up after it"
  cleanup_run "$state_dir"
fi

# ---- Slurm and munge, installed if missing ----------------------------------------------------
missing_packages() {
  local names=() c
  for c in slurmctld slurmd srun salloc sinfo squeue scancel; do
    command -v "$c" >/dev/null || { names+=(slurm-wlm); break; }
  done
  for c in munged munge; do
    command -v "$c" >/dev/null || { names+=(munge); break; }
  done
  echo "${names[*]}"
}
PATH=$PATH:/usr/sbin:/sbin
missing=$(missing_packages)
if [[ -n $missing ]]; then
  [[ ${DISTRIBUTE_SLURM_INSTALL:-1} != 0 ]] || skip "$missing not installed (DISTRIBUTE_SLURM_INSTALL=0)"
  ((EUID == 0)) || skip "$missing not installed, and not root to install them (apt-get install $missing)"
  command -v apt-get >/dev/null || skip "$missing not installed, and no apt-get to install them"
  apt_log=$state_dir/apt.log
  apt_install() {
    DEBIAN_FRONTEND=noninteractive timeout 150 apt-get install -y -q --no-install-recommends \
      -o DPkg::Lock::Timeout=60 "$@" >>"$apt_log" 2>&1
  }
  : >"$apt_log"
  log "installing $missing (apt-get install --no-install-recommends; log in $apt_log)"
  # shellcheck disable=SC2086
  if ! apt_install $missing; then
    log "apt-get install failed; apt-get update, then once more"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive timeout 60 apt-get update -q >>"$apt_log" 2>&1 && apt_install $missing
  fi
  missing=$(missing_packages)
  [[ -z $missing ]] || skip "could not install $missing: $(grep -E '^(E|W):' "$apt_log" | tail -n 1)"
  log "installed $(dpkg-query -W -f='slurm ${Version}' slurmd 2>/dev/null), $(dpkg-query -W -f='munge ${Version}' munge 2>/dev/null)"
fi
((EUID == 0)) || skip "not root: slurmd starts job steps as root"

# ---- The run's files, recorded before anything starts ----------------------------------------
# Short path: munged's socket must fit in a sockaddr_un (108 bytes).
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/distribute-slurm.XXXXXX") || fail "mktemp failed"
chmod 755 "$run_tmp"  # munged wants the socket's directories searchable by all
run_id=$run_tmp
# Open MPI's shared-memory files, which a killed task leaves behind, in a directory of the run's.
run_shm=$run_tmp/shm
if [[ -d /dev/shm && -w /dev/shm ]]; then
  run_shm=$(mktemp -d /dev/shm/distribute-slurm.XXXXXX) || run_shm=$run_tmp/shm
fi
munged_pid='' slurmctld_pid='' slurmd_pid=''
write_state() {
  {
    printf 'run_id=%q\nrun_tmp=%q\nrun_shm=%q\n' "$run_id" "$run_tmp" "$run_shm"
    printf 'munged_pid=%q\nslurmctld_pid=%q\nslurmd_pid=%q\n' "$munged_pid" "$slurmctld_pid" "$slurmd_pid"
    printf 'script_pid=%q\n' "$$"
  } >"$state_dir/run.env.new" && mv -f "$state_dir/run.env.new" "$state_dir/run.env"
}
write_state

# shellcheck disable=SC2317  # called by the EXIT trap
on_exit() {
  local status=$?
  trap - EXIT INT TERM HUP
  trap '' INT TERM HUP
  if ((status == 1)) && [[ -d $run_tmp/log ]]; then
    local name f
    for name in munged slurmctld slurmd; do
      f=$run_tmp/log/$name.log
      [[ -s $f ]] || f=$run_tmp/log/$name.out  # munged -F, and a daemon that failed early: stderr
      [[ -s $f ]] || continue
      echo "---- last lines of $f ----"
      tail -n 20 "$f"
    done
  fi
  cleanup_run "$state_dir"
  # Anything else of our process group (helpers without the marker), but this shell.
  if [[ $(proc_field $$ 5) == "$$" ]]; then
    local pid
    for pid in $(pgrep -g "$$"); do
      ((pid != $$)) && kill -KILL "$pid" 2>/dev/null
    done
  fi
  local watchdog
  watchdog=$(cat "$state_dir/watchdog.pid" 2>/dev/null)
  if [[ -n $watchdog ]] && grep -qzxF -- --watch "/proc/$watchdog/cmdline" 2>/dev/null; then
    kill -TERM "$watchdog" 2>/dev/null
    rm -f "$state_dir/watchdog.pid"
  fi
  log "cleaned up; exit $status"
  exit "$status"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

setsid -f "$BASH" "$self" --watch $$ "$(proc_field $$ 22)" "$state_dir" \
  </dev/null >"$state_dir/watchdog.log" 2>&1

# Everything below runs with the marker and our cluster's configuration, and nothing of an
# enclosing Slurm job or MPI launcher.
unset "${!SLURM_@}" "${!PMIX_@}" "${!OMPI_@}" "${!PMI_@}" 2>/dev/null
export SLURM_CONF=$run_tmp/slurm.conf
mkdir -p "$run_shm"
export OMPI_MCA_btl_vader_backing_directory=$run_shm OMPI_MCA_osc_sm_backing_directory=$run_shm \
  OMPI_MCA_osc_rdma_backing_directory=$run_shm
# (A command word, not a function: "${marked[@]}" daemon & makes $! the daemon's pid.)
marked=(env "$marker_name=$run_id")
# waited OUTPUT_FILE COMMAND...: runs the command in the background and waits for it, so that a
# signal is handled at once (and by a trap that writes to our own output, not to OUTPUT_FILE).
waited() {
  local out=$1
  shift
  "$@" >"$out" 2>&1 &
  wait $!
}

mkdir -p "$run_tmp"/{state,spool,log,work} || fail "cannot populate $run_tmp"
chmod 700 "$run_tmp/state" "$run_tmp/spool"

# ---- munged, with a key of its own -----------------------------------------------------------
if command -v mungekey >/dev/null; then
  mungekey --create --keyfile="$run_tmp/munge.key" || fail "mungekey failed"
else
  (umask 077 && head -c 1024 /dev/urandom >"$run_tmp/munge.key") || fail "cannot write a munge key"
fi
chmod 600 "$run_tmp/munge.key"
munge_socket=$run_tmp/munge.sock
"${marked[@]}" munged --foreground --socket="$munge_socket" --key-file="$run_tmp/munge.key" \
  --pid-file="$run_tmp/munged.pid" --log-file="$run_tmp/log/munged.log" \
  --seed-file="$run_tmp/munged.seed" </dev/null >"$run_tmp/log/munged.out" 2>&1 &
munged_pid=$!
write_state
for ((i = 0; i < 40; i++)); do
  [[ -S $munge_socket ]] && break
  kill -0 "$munged_pid" 2>/dev/null || fail "munged exited: $(tail -n 1 "$run_tmp/log/munged.out")"
  sleep 0.25
done
munge --socket="$munge_socket" --no-input | unmunge --socket="$munge_socket" >/dev/null \
  || fail "munged does not answer on $munge_socket"
log "munged $munged_pid on $munge_socket"

# ---- slurm.conf: two free ports, this machine as the one node ---------------------------------
used_ports() {  # local TCP ports in use, any state
  local f sl local_address rest
  for f in /proc/net/tcp /proc/net/tcp6; do
    [[ -r $f ]] || continue
    while read -r sl local_address rest; do
      [[ $sl == sl ]] || echo $((16#${local_address##*:}))
    done <"$f"
  done
}
pick_ports() {
  local used p picked=()
  used=" $(used_ports | tr '\n' ' ') "
  while ((${#picked[@]} < 2)); do
    p=$((20000 + RANDOM % 20000))
    [[ $used == *" $p "* || $used == *" $((p + 1)) "* ]] && continue
    picked=("$p" "$((p + 1))")
  done
  echo "${picked[@]}"
}
read -r ctld_port slurmd_port < <(pick_ports)
node=$(uname -n)
node=${node%%.*}
ncpus=4  # whatever this machine has: slurmd takes the configured count (config_overrides)
: >"$run_tmp/plugstack.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=distribute-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket
StateSaveLocation=$run_tmp/state
SlurmdSpoolDir=$run_tmp/spool
SlurmctldPidFile=$run_tmp/slurmctld.pid
SlurmdPidFile=$run_tmp/slurmd.pid
SlurmctldLogFile=$run_tmp/log/slurmctld.log
SlurmdLogFile=$run_tmp/log/slurmd.log
PlugStackConfig=$run_tmp/plugstack.conf
TmpFS=$run_tmp/work
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
InactiveLimit=0
NodeName=$node NodeAddr=127.0.0.1 CPUs=$ncpus State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=5 State=UP
EOF

# ---- slurmctld and slurmd, in the foreground of this script -----------------------------------
"${marked[@]}" slurmctld -D -c -f "$SLURM_CONF" </dev/null >"$run_tmp/log/slurmctld.out" 2>&1 &
slurmctld_pid=$!
write_state
"${marked[@]}" slurmd -D -N "$node" -f "$SLURM_CONF" </dev/null >"$run_tmp/log/slurmd.out" 2>&1 &
slurmd_pid=$!
write_state
node_state=''
for ((i = 0; i < 120; i++)); do
  kill -0 "$slurmctld_pid" 2>/dev/null || fail "slurmctld exited"
  kill -0 "$slurmd_pid" 2>/dev/null || fail "slurmd exited"
  node_state=$(timeout 5 sinfo -h -n "$node" -o %T 2>/dev/null)
  [[ $node_state == idle ]] && break
  sleep 0.25
done
[[ $node_state == idle ]] || fail "node $node not idle after 30 s (state: '${node_state:-no answer}')"
log "slurmctld $slurmctld_pid (port $ctld_port) and slurmd $slurmd_pid (port $slurmd_port): node $node idle, $ncpus CPUs"

# ---- The program, launched by Slurm -----------------------------------------------------------
suites=strategy,collectives
cd "$run_tmp/work" || fail "cannot enter $run_tmp/work"
test_args=(--run_test="$suites" --report_level=short --color_output=no)
failures=0

# Every task must have run the suites and passed (a task that came up as a singleton fails them:
# the strategy suite checks num_workers() >= 2).
check_job() {  # NAME STATUS OUTPUT_FILE SECONDS
  local passed
  passed=$(grep -c 'Test module "distribute_mpi" has passed' "$3")
  if (($2 == 0 && passed == 2)); then
    log "PASS: $1: 2 workers passed $suites ($4 s)"
    grep -v '^ *$' "$3" | sed 's/^/    /'
  else
    log "FAIL: $1: exit status $2, $passed of 2 workers passed; its output:"
    cat "$3"
    failures=$((failures + 1))
  fi
}

mpi_list=$(timeout 20 srun --mpi=list 2>&1)
log "srun --mpi=list: $(echo "$mpi_list" | tr -s '\n\t' '  ')"
mpi_flavour=$("$mpiexec" --version 2>&1 | head -n 1)

# 1. Direct launch: srun starts the MPI processes and serves PMIx to them.
if ! grep -qw pmix <<<"$mpi_list"; then
  log "NOTE: this Slurm has no PMIx plugin, so srun cannot start Open MPI's processes itself; only salloc + mpiexec is tested"
elif [[ $mpi_flavour != *"Open MPI"* && $mpi_flavour != *OpenRTE* ]]; then
  log "NOTE: $mpiexec is not Open MPI ($mpi_flavour); srun --mpi=pmix is not tried"
else
  cmd=(srun -n 2 --mpi=pmix --time=2 --kill-on-bad-exit=1 "$program" "${test_args[@]}")
  log "\$ ${cmd[*]}"
  start=$SECONDS
  waited "$run_tmp/log/srun_pmix.txt" "${marked[@]}" timeout -k 5 60 "${cmd[@]}"
  check_job "srun --mpi=pmix" $? "$run_tmp/log/srun_pmix.txt" $((SECONDS - start))
fi

# 2. An allocation, and Open MPI's launcher inside it (it finds the allocation's slots itself).
cmd=(salloc -n 2 --time=2 "$mpiexec" -n 2 "${mpiexec_preflags[@]}" "$program" "${test_args[@]}")
log "\$ ${cmd[*]}"
start=$SECONDS
waited "$run_tmp/log/salloc_mpiexec.txt" "${marked[@]}" timeout -k 5 60 "${cmd[@]}"
check_job "salloc + mpiexec" $? "$run_tmp/log/salloc_mpiexec.txt" $((SECONDS - start))

# 3. Preemption: Slurm signals the job's tasks (scancel --signal=USR1, as srun --signal=USR1@T does T
# seconds before the time limit, within Slurm's minute of resolution, which is why the test does not
# wait for one); preemption_checkpoint stops both workers after the same step with one checkpoint,
# and the job run again resumes from it.
if grep -qw pmix <<<"$mpi_list" && [[ $mpi_flavour == *"Open MPI"* || $mpi_flavour == *OpenRTE* ]]; then
  preempt_dir=$run_tmp/work/preempt
  mkdir -p "$preempt_dir"
  cmd=(srun -n 2 --mpi=pmix --time=2 --job-name=distribute_preempt "$program" --scenario=preempt --replicas=1 --steps=2000
       --pid-dir="$preempt_dir" --dir="$preempt_dir")
  log "\$ ${cmd[*]}"
  start=$SECONDS
  "${marked[@]}" timeout -k 5 90 "${cmd[@]}" >"$run_tmp/log/preempt.txt" 2>&1 &
  launcher=$!
  for ((i = 0; i < 240; i++)); do
    [[ -f $preempt_dir/pid-0 && -f $preempt_dir/pid-1 ]] && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.25
  done
  sleep 0.5  # a few steps in
  jobid=$(timeout 10 squeue -h -n distribute_preempt -o %i | head -n 1)
  log "\$ scancel --signal=USR1 $jobid"
  [[ -n $jobid ]] && timeout 10 scancel --signal=USR1 "$jobid"
  wait "$launcher"
  status=$?
  stopped=$(grep -o 'worker [01] stopped after step [0-9]*' "$run_tmp/log/preempt.txt" | awk '{print $NF}' | sort -u)
  if ((status == 0)) && [[ $(grep -c 'stopped after step' "$run_tmp/log/preempt.txt") == 2 && $(wc -l <<<"$stopped") == 1 ]] &&
    [[ -n $stopped ]] && grep -q 'SIGUSR1 after step' "$run_tmp/log/preempt.txt" &&
    [[ $(ls "$preempt_dir/checkpoints") == "$(printf 'ckpt-%010d.dck' "$stopped")" ]]; then
    log "PASS: preemption: both workers stopped after step $stopped with one checkpoint ($((SECONDS - start)) s)"
    cmd=(srun -n 2 --mpi=pmix --time=2 "$program" --scenario=preempt --replicas=1 --steps=$((stopped + 3)) --dir="$preempt_dir")
    log "\$ ${cmd[*]}"
    waited "$run_tmp/log/preempt_resume.txt" "${marked[@]}" timeout -k 5 60 "${cmd[@]}"
    status=$?
    if ((status == 0)) && grep -q "resumed at step $((stopped + 1))" "$run_tmp/log/preempt_resume.txt" &&
      [[ $(grep -c "trained to step $((stopped + 3))" "$run_tmp/log/preempt_resume.txt") == 2 ]]; then
      log "PASS: preemption: the job run again resumed at step $((stopped + 1))"
    else
      log "FAIL: preemption: the job run again: exit status $status; its output:"
      cat "$run_tmp/log/preempt_resume.txt"
      failures=$((failures + 1))
    fi
  else
    log "FAIL: preemption: exit status $status, steps stopped after: '${stopped//$'\n'/ }', checkpoints: $(ls "$preempt_dir/checkpoints" 2>&1 | tr '\n' ' '); its output:"
    cat "$run_tmp/log/preempt.txt"
    failures=$((failures + 1))
  fi
else
  log "NOTE: without srun --mpi=pmix for Open MPI the preemption case is not run"
fi

((failures == 0)) || exit 1
log "all launches passed"
exit 0
