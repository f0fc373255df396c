#!/bin/bash
# The 2026-11-27 run on a lent 16-core machine (docs/cluster.md and docs/replication.md,
# "16 cores, 2026-11-27"): the final failover code's SIGKILLs and switchovers, on small
# data and with 1.9M keys per node; cluster TPC-C at 1-8 workers; SET without pipelining
# against Redis with a replica. Run from the repository root with a stripped release
# binary at .devbin/ditto, redis-server/-cli/-benchmark in .devbin/bin and their shared
# libraries in .devbin/lib (the lent machine has no Redis); results go to $OUT.
set -u
export PATH=$PWD/.devbin/bin:$PATH LD_LIBRARY_PATH=$PWD/.devbin/lib
B=$PWD/.devbin/ditto
nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1
summary() { grep -v '^\s*$' "$1" | grep -v "^20..-" | tail -${2:-12}; }
run_failover() { # name timeout args...
  local name=$1 t=$2; shift 2
  echo "=== failover $name $(date +%T)"
  timeout "$t" "$B" bench failover --clients 8 --workers 4 --dir /tmp/fo-$name "$@" --json > $OUT/$name.json 2> $OUT/$name.err
  echo "rc=$?"; summary $OUT/$name.err 14
  grep -h "replay refused\|still holds a value\|panicked" /tmp/fo-$name/*.log 2>/dev/null | head -3
  rm -rf /tmp/fo-$name
}
run_failover sigkill-30 100 --kills 30 --between-s 0.5
run_failover switchover-30 70 --switchover --kills 30 --between-s 0.3
run_failover sigkill-1.9M 100 --preload 1900000 --kills 3 --between-s 2
run_failover switchover-1.9M 100 --preload 1900000 --switchover --kills 3 --between-s 2
for w in 1 2 4 8; do
  echo "=== cluster tpcc w=$w $(date +%T)"
  timeout 40 $B bench tpcc --workers $w --seconds 4 --log every-batch --backups 1 --pin --backup-replay parallel --json > /tmp/j 2>/dev/null
  echo "rc=$?"
  grep -o '"backup_[a-z_]*lag_ms_p[0-9]*":[0-9.]*\|"throughput_ratio_vs_standalone":[0-9.]*\|"freshness_score":[0-9.]*\|"replay_cost_ratio":[0-9.]*' /tmp/j | sort -u | tr '\n' ' '; echo
  (echo "{\"mode\":\"cluster\",\"wl\":\"tpcc\",\"workers\":$w,\"result\":"; cat /tmp/j; echo "}") >> $OUT/cluster.jsonl
done
echo "=== redis $(date +%T)"
timeout 100 $B bench redis --requests 200000 --rounds 2 --pipeline 1 --durability every-batch --redis-fsync everysec --workers 4 --bench-threads 4 --json > $OUT/redis.json 2> $OUT/redis.err
echo "rc=$?"; summary $OUT/redis.err 20
echo "=== done $(date +%T)"
