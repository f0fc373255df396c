#!/bin/bash
# Does a backup's checkpoint pace decide its durable lag? On a lent 16-core machine
# (docs/replication.md, "A held snapshot no longer slows replay"): cluster TPC-C with one
# backup at 2 and 4 workers, the backup's checkpoints written at 128 MB/s (the default),
# 32, 8, or off (--backup-config .devbin/{pace32,pace8,nockpt}.toml), alternated.
# JSON lines to $OUT/ckpt-pace.jsonl. Run before `backup_checkpoint_write_mb_per_s`
# existed (485b66d), when a backup's pace was `checkpoint_write_mb_per_s`, the key the
# .devbin/pace*.toml files set; to rerun it now, set `backup_checkpoint_write_mb_per_s`.
set -u
for w in 2 4; do
  for c in default pace32 pace8 nockpt; do
    extra=; [ $c != default ] && extra="--backup-config .devbin/$c.toml"
    echo -n "=== tpcc w=$w $c $(date +%T): "
    timeout 60 .devbin/ditto bench tpcc --workers $w --seconds 4 --log every-batch --backups 1 --pin --backup-replay parallel $extra --json > /tmp/j 2>/dev/null
    echo -n "rc=$? "
    grep -o '"backup_[a-z_]*lag_ms_p99":[0-9.]*\|"freshness_score":[0-9.]*\|"replay_cost_ratio":[0-9.]*' /tmp/j | sort -u | tr '\n' ' '; echo
    (echo "{\"backup\":\"$c\",\"wl\":\"tpcc\",\"workers\":$w,\"result\":"; cat /tmp/j; echo "}") | tr -d '\n' >> $OUT/ckpt-pace.jsonl; echo >> $OUT/ckpt-pace.jsonl
  done
done
echo "=== done $(date +%T)"
