#!/bin/bash
# Where the lag at 2-8 workers comes from, on a lent 16-core machine (docs/replication.md,
# "A held snapshot no longer slows replay"): cluster TPC-C with one backup (parallel
# replay, majority-durable, primary on CPUs 0-7, backup on 8-15) with the backup
# checkpointing by its default policy and with its checkpoints off (--backup-config
# .devbin/nockpt.toml), alternated, at 1, 2, 4 and 8 workers. Stripped release binary at
# .devbin/ditto; JSON lines to $OUT/ckpt-lag.jsonl.
set -u
nproc; grep -m1 "model name" /proc/cpuinfo
for w in 1 2 4 8; do
  for c in default off; do
    extra=; [ $c = off ] && extra="--backup-config .devbin/nockpt.toml"
    echo -n "=== tpcc w=$w backup checkpoints $c $(date +%T): "
    timeout 60 .devbin/ditto bench tpcc --workers $w --seconds 4 --log every-batch --backups 1 --pin --backup-replay parallel $extra --json > /tmp/j 2>/dev/null
    echo -n "rc=$? "
    grep -o '"backup_[a-z_]*lag_ms_p[0-9]*":[0-9.]*\|"throughput_ratio_vs_standalone":[0-9.]*\|"freshness_score":[0-9.]*\|"replay_cost_ratio":[0-9.]*' /tmp/j | sort -u | tr '\n' ' '; echo
    (echo "{\"backup_checkpoints\":\"$c\",\"wl\":\"tpcc\",\"workers\":$w,\"result\":"; cat /tmp/j; echo "}") | tr -d '\n' >> $OUT/ckpt-lag.jsonl; echo >> $OUT/ckpt-lag.jsonl
  done
done
echo "=== done $(date +%T)"
