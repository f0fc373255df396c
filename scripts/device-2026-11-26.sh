#!/bin/bash
# The 2026-11-26 run on a lent 16-core machine (docs/replication.md, "The same machine a
# day later"): SET without pipelining against Redis with a replica, cluster TPC-C at 1-8
# workers, replay-only TPC-C at 1-16. Run from the repository root with a stripped release
# binary at .devbin/ditto, redis-server/-cli/-benchmark in .devbin/bin and their shared
# libraries in .devbin/lib (the lent machine has no Redis); results go to $OUT.
set -u
export PATH=$PWD/.devbin/bin:$PATH LD_LIBRARY_PATH=$PWD/.devbin/lib
B=$PWD/.devbin/ditto
nproc; grep -m1 "model name" /proc/cpuinfo; redis-server --version | head -1
echo "=== redis $(date +%T)"
timeout 150 $B bench redis --requests 200000 --rounds 3 --pipeline 1 --durability every-batch --redis-fsync everysec --workers 4 --bench-threads 4 --json > $OUT/redis.json 2> $OUT/redis.err
echo "rc=$?"; grep -E "^(ditto|redis)" $OUT/redis.json | head; tail -20 $OUT/redis.err
for w in 1 2 4 8; do
  echo "=== cluster tpcc w=$w $(date +%T)"
  timeout 60 $B bench tpcc --workers $w --seconds 4 --log every-batch --backups 1 --pin --backup-replay parallel --json > /tmp/j 2> /tmp/e
  echo "rc=$?"; grep -v '^\s*$' /tmp/e | tail -6
  (echo "{\"mode\":\"cluster\",\"wl\":\"tpcc\",\"workers\":$w,\"result\":"; cat /tmp/j; echo "}") >> $OUT/cluster.jsonl
done
for w in 1 2 4 8 16; do
  echo "=== replay tpcc w=$w $(date +%T)"
  timeout 70 $B bench tpcc --workers $w --seconds 3 --log every-batch --one-process --replay-only serial,parallel,dependency --json > /tmp/j 2> /tmp/e
  echo "rc=$?"; grep -v '^\s*$' /tmp/e | tail -8
  (echo "{\"mode\":\"replay\",\"wl\":\"tpcc\",\"workers\":$w,\"result\":"; cat /tmp/j; echo "}") >> $OUT/replay.jsonl
done
echo "=== done $(date +%T)"
