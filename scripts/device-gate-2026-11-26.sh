#!/bin/bash
# The release gate on 16 cores (docs/cluster.md, "Replay waits for release"): cluster
# TPC-C at 1-8 workers, the build before (.devbin/ditto-base) and after (.devbin/ditto),
# alternated; stripped release binaries, results to $OUT.
set -u
nproc; grep -m1 "model name" /proc/cpuinfo
for w in 1 2 4 8; do
  for b in ditto-base ditto; do
    echo "=== $b w=$w $(date +%T)"
    timeout 60 .devbin/$b bench tpcc --workers $w --seconds 4 --log every-batch --backups 1 --pin --backup-replay parallel --json > /tmp/j 2>/dev/null
    echo "rc=$?"
    grep -o '"backup_[a-z_]*lag_ms_p[0-9]*":[0-9.]*\|"throughput_ratio_vs_standalone":[0-9.]*\|"freshness_score":[0-9.]*\|"replay_cost_ratio":[0-9.]*' /tmp/j | sort -u | tr '\n' ' '; echo
    (echo "{\"build\":\"$b\",\"workers\":$w,\"result\":"; cat /tmp/j; echo "}") >> $OUT/gate.jsonl
  done
done
echo "=== done $(date +%T)"
