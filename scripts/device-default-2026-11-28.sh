#!/bin/bash
# The final build's defaults (a backup's checkpoints at backup_checkpoint_write_mb_per_s =
# 32) on a lent 16-core machine: cluster TPC-C with one backup (parallel replay,
# majority-durable, pinned halves) at 1, 2 and 4 workers. JSON lines to $OUT/default.jsonl.
set -u
for w in 1 2 4; do
  echo -n "=== tpcc w=$w $(date +%T): "
  timeout 50 .devbin/ditto bench tpcc --workers $w --seconds 4 --log every-batch --backups 1 --pin --backup-replay parallel --json > /tmp/j 2>/dev/null
  echo -n "rc=$? "
  grep -o '"backup_[a-z_]*lag_ms_p99":[0-9.]*\|"freshness_score":[0-9.]*\|"replay_cost_ratio":[0-9.]*\|"throughput_ratio_vs_standalone":[0-9.]*' /tmp/j | sort -u | tr '\n' ' '; echo
  (echo "{\"wl\":\"tpcc\",\"workers\":$w,\"result\":"; cat /tmp/j; echo "}") | tr -d '\n' >> $OUT/default.jsonl; echo >> $OUT/default.jsonl
done
