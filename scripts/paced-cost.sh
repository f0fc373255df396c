#!/bin/bash
# CPU and wake-ups of a primary and one backup under SETs at a paced rate (docs/replication.md,
# "CPU per SET at moderate rates"). Starts a `majority-received` pair of
# BINARY on loopback, warms it with 20,000 SETs, then sends SECONDS of SETs, one at a time,
# at RATE a second (redis-py, each sent at its scheduled time), and reports each process's
# CPU time and voluntary context switches (all threads) per SET over that time.
# Both nodes run at DURABILITY (every-batch unless given) with WORKERS runtime threads and log
# streams (2 unless given); DETAIL=1 adds each thread's share.
# RATE max: SECONDS x 20,000 SETs from redis-benchmark's 50 clients instead, as fast as they go.
# Usage: [DURABILITY=interval] [WORKERS=1] [DETAIL=1] scripts/paced-cost.sh BINARY BASE_PORT RATE|max [SECONDS]
set -euo pipefail
bin=$1; base=$2; rate=$3; secs=${4:-10}
. "$(dirname "$0")/pair.sh"
start_pair --durability "${DURABILITY:-every-batch}" --workers "${WORKERS:-2}"
sleep 1
# Per thread: its id, name, voluntary context switches and CPU ticks (DETAIL=1).
threads() { for t in /proc/$1/task/*; do printf '%s %s %s %s\n' "${t##*/}" "$(tr ' ' _ < "$t/comm")" \
  "$(awk '/^voluntary_ctxt_switches/ {print $2}' "$t/status")" "$(awk '{print $14 + $15}' "$t/stat")"; done | sort; }
[ "${DETAIL:-0}" = 1 ] && { threads $P > "$dir/p0"; threads $B > "$dir/b0"; }
shipped() { redis-cli -p "$base" info replication | tr -d '\r' | awk -F: '/^ditto_batches_shipped:/ {print $2}'; }
acks() { redis-cli -p $((base + 2)) info replication | tr -d '\r' | awk -F: '/^ditto_acks_sent:/ {print $2}'; }
s0=$(shipped); a0=$(acks)
w0p=$(wakeups $P); w0b=$(wakeups $B); c0p=$(cpu $P); c0b=$(cpu $B)
if [ "$rate" = max ]; then
  # As fast as 50 clients go, one request each at a time (redis-benchmark), for comparison.
  n=$((secs * 20000))
  redis-benchmark -p "$base" -t set -n "$n" -c 50 -P 1 -r 100000 -q > /dev/null 2>&1
else
n=$(python3 - "$base" "$rate" "$secs" <<'PY'
import redis, sys, time
r = redis.Redis(port=int(sys.argv[1])); rate = float(sys.argv[2]); secs = float(sys.argv[3])
t0 = time.perf_counter(); n = 0
while True:
    due = t0 + n / rate
    now = time.perf_counter()
    if due - t0 >= secs:
        break
    if due > now:
        time.sleep(due - now)
    r.set(f"paced{n % 10000}", n); n += 1
print(n)
PY
)
fi
w1p=$(wakeups $P); w1b=$(wakeups $B); c1p=$(cpu $P); c1b=$(cpu $B)
s1=$(shipped); a1=$(acks)
if [ "${DETAIL:-0}" = 1 ]; then
  threads $P > "$dir/p1"; threads $B > "$dir/b1"
  for who in p b; do
    # Joined by thread id, summed by name; a thread that came or went in between is left out.
    join "$dir/${who}0" "$dir/${who}1" |
      awk -v n="$n" -v who="$who" -v tck="$(getconf CLK_TCK)" '{w[$2] += $6 - $3; c[$2] += $7 - $4}
        END {for (k in w) if (w[k] > 0 || c[k] > 0) printf "  %s %-18s %.2f wake-ups/SET %.1f us/SET\n", who, k, w[k] / n, c[k] * 1e6 / tck / n}' | sort -k3 -nr
  done
fi
tck=$(getconf CLK_TCK)
awk -v n="$n" -v cp=$((c1p - c0p)) -v cb=$((c1b - c0b)) -v wp=$((w1p - w0p)) -v wb=$((w1b - w0b)) -v tck="$tck" -v rate="$rate" -v sh=$((s1 - s0)) -v a0="${a0:-0}" -v a1="${a1:-0}" 'BEGIN {
  printf "rate %s/s, %d SETs: primary %.1f us CPU and %.2f wake-ups per SET; backup %.1f us and %.2f; %.2f batches shipped and %.2f acks sent per SET\n",
    rate, n, cp * 1e6 / tck / n, wp / n, cb * 1e6 / tck / n, wb / n, sh / n, (a1 - a0) / n }'
