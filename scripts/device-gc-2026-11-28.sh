#!/bin/bash
# Two GC horizons on a lent 16-core machine (docs/replication.md, "A held snapshot no
# longer slows replay"): cluster TPC-C (one backup, parallel replay, majority-durable,
# the backup checkpointing by its default policy) at 1, 2, 4 and 8 workers, and YCSB at
# 8, the build before (.devbin/ditto-base, a0d87a6) and after (.devbin/ditto) alternated.
# Stripped release binaries; JSON lines to $OUT/gc.jsonl.
set -u
nproc; grep -m1 "model name" /proc/cpuinfo
for wl in "tpcc 1" "tpcc 2" "tpcc 4" "tpcc 8" "ycsb 8"; do
  set -- $wl
  for b in ditto-base ditto; do
    echo -n "=== $1 w=$2 $b $(date +%T): "
    timeout 60 .devbin/$b bench $1 --workers $2 --seconds 4 --log every-batch --backups 1 --pin --backup-replay parallel --json > /tmp/j 2>/dev/null
    echo -n "rc=$? "
    grep -o '"backup_[a-z_]*lag_ms_p[0-9]*":[0-9.]*\|"throughput_ratio_vs_standalone":[0-9.]*\|"freshness_score":[0-9.]*\|"replay_cost_ratio":[0-9.]*' /tmp/j | sort -u | tr '\n' ' '; echo
    (echo "{\"build\":\"$b\",\"wl\":\"$1\",\"workers\":$2,\"result\":"; cat /tmp/j; echo "}") | tr -d '\n' >> $OUT/gc.jsonl; echo >> $OUT/gc.jsonl
  done
done
echo "=== done $(date +%T)"
