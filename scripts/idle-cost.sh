#!/bin/bash
# Idle cost of a primary and one backup (docs/replication.md, "Idle cost"): starts a
# `majority-received` pair of BINARY on loopback, writes 20,000 SETs, waits 2 s, then
# reports each process's CPU time and wake-ups (voluntary context switches, all threads)
# over 10 s of quiet. With SPARSE=1 it also times 80 SETs, each after 150 ms of quiet
# (needs redis-py), and a DITTO.WAITTS on the backup.
# Usage: scripts/idle-cost.sh BINARY [BASE_PORT]
set -euo pipefail
bin=$1; base=${2:-7011}
. "$(dirname "$0")/pair.sh"
start_pair
sleep 2
w0p=$(wakeups $P); w0b=$(wakeups $B); c0p=$(cpu $P); c0b=$(cpu $B)
sleep 10
w1p=$(wakeups $P); w1b=$(wakeups $B); c1p=$(cpu $P); c1b=$(cpu $B)
tck=$(getconf CLK_TCK)
echo "primary: $(( (c1p - c0p) * 1000 / tck )) ms CPU in 10 s, $(( (w1p - w0p) / 10 )) wake-ups/s"
echo "backup:  $(( (c1b - c0b) * 1000 / tck )) ms CPU in 10 s, $(( (w1b - w0b) / 10 )) wake-ups/s"
if [ "${SPARSE:-0}" = 1 ]; then
  python3 - "$base" $((base + 2)) <<'PY'
import redis, statistics, sys, time
r, b = redis.Redis(port=int(sys.argv[1])), redis.Redis(port=int(sys.argv[2]))
lat = []
for i in range(80):
    time.sleep(0.15)
    t = time.perf_counter(); r.set(f"sparse{i}", i); lat.append((time.perf_counter() - t) * 1e3)
ts = r.execute_command("DITTO.LASTCOMMIT")
t = time.perf_counter(); b.execute_command("DITTO.WAITTS", ts); w = (time.perf_counter() - t) * 1e3
lat.sort()
print(f"SET after 150 ms of quiet: median {statistics.median(lat):.3f} ms, max {lat[-1]:.3f} ms; WAITTS on the backup {w:.3f} ms")
PY
fi
