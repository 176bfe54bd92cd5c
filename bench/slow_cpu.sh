#!/usr/bin/env bash
# Run a command as if on a CPU FACTOR times slower per core: a cgroup CPU quota of
# (cores / FACTOR) CPUs over a 10 ms period, for the command and everything it starts.
# CPU-bound work takes FACTOR times as long; sleeps, timeouts and waits on other
# processes stay as they are, as on a slower machine. Not a slower core: a lone busy
# thread may use up to cores / FACTOR CPUs (a real slow core gives it 1 / FACTOR).
#
#   sudo bench/slow_cpu.sh 2.25 bash .ci/run      # ~Cascade Lake from Sapphire Rapids / Zen 4
#
# Needs root and the cpu controller (cgroup v1 cpu.cfs_quota_us, or v2 cpu.max).
set -euo pipefail
factor=$1
shift
cores=$(nproc)
period=10000
quota=$(python3 -c "print(round($cores * $period / $factor))")
name="slotserve-slow-$$"
if [ -d /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.cfs_period_us ]; then  # v1
  group=/sys/fs/cgroup/cpu/$name
  mkdir "$group"
  echo "$period" > "$group/cpu.cfs_period_us"
  echo "$quota" > "$group/cpu.cfs_quota_us"
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # v2
  group=/sys/fs/cgroup/$name
  mkdir "$group"
  echo "$quota $period" > "$group/cpu.max"
else
  echo "slow_cpu.sh: no cgroup cpu controller here" >&2
  exit 2
fi
trap 'rmdir "$group" 2>/dev/null || true' EXIT
echo "slow_cpu.sh: $cores cores / $factor = $(python3 -c "print(round($cores / $factor, 3))") CPUs for: $*" >&2
start=$(date +%s.%N)
rc=0
sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$group" "$@" || rc=$?
echo "slow_cpu.sh: exit $rc after $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s" >&2
exit $rc
