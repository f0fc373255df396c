# Sourced by scripts/idle-cost.sh and scripts/paced-cost.sh: starts a `majority-received`
# pair of $bin on loopback (client ports $base and $base+2, replication port $base+1), each
# node also given "$@", in a fresh directory ($dir, removed at exit with both processes),
# waits for the link, and writes 20,000 SETs. Sets P and B (the primary's and the backup's
# pids); `wakeups PID` and `cpu PID` read a process's voluntary context switches (all
# threads) and CPU ticks.
start_pair() {
  dir=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
  mkdir "$dir/p" "$dir/b"
  "$bin" server --data-dir "$dir/p" --port "$base" --metrics off --repl-port $((base + 1)) \
    --commit-policy majority-received --backups 1 "$@" > "$dir/p.log" 2>&1 &
  P=$!
  sleep 0.7
  "$bin" server --data-dir "$dir/b" --port $((base + 2)) --metrics off --replica-of 127.0.0.1:$((base + 1)) \
    "$@" > "$dir/b.log" 2>&1 &
  B=$!
  for _ in $(seq 100); do redis-cli -p "$base" info replication | grep -q connected_slaves:1 && break; sleep 0.1; done
  redis-benchmark -p "$base" -t set -n 20000 -c 10 -q > /dev/null 2>&1
}
wakeups() { for t in /proc/$1/task/*; do awk '/^voluntary_ctxt_switches/ {print $2}' "$t/status"; done | awk '{s += $1} END {print s}'; }
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
