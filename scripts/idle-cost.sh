#!/bin/bash
# Idle cost of a primary and one backup (docs/replication.md, "Idle cost"): starts a
# `majority-received` pair of BINARY on loopback, writes 20,000 SETs, waits 2 s, then
# reports each process's CPU time and wake-ups (voluntary context switches, all threads)
# over 10 s of quiet. With SPARSE=1 it also times 80 SETs, each after 150 ms of quiet
# (needs redis-py), and a DITTO.WAITTS on the backup.
# Usage: scripts/idle-cost.sh BINARY [BASE_PORT]
set -euo pipefail
bin=$1; base=${2:-7011}
dir=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
mkdir "$dir/p" "$dir/b"
"$bin" server --data-dir "$dir/p" --port "$base" --metrics off --repl-port $((base + 1)) \
  --commit-policy majority-received --backups 1 > "$dir/p.log" 2>&1 &
P=$!
sleep 0.7
"$bin" server --data-dir "$dir/b" --port $((base + 2)) --metrics off --replica-of 127.0.0.1:$((base + 1)) \
  > "$dir/b.log" 2>&1 &
B=$!
for _ in $(seq 100); do redis-cli -p "$base" info replication | grep -q connected_slaves:1 && break; sleep 0.1; done
redis-benchmark -p "$base" -t set -n 20000 -c 10 -q > /dev/null 2>&1
sleep 2
wakeups() { for t in /proc/$1/task/*; do awk '/^voluntary_ctxt_switches/ {print $2}' "$t/status"; done | awk '{s += $1} END {print s}'; }
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
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
