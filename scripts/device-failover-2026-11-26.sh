#!/bin/bash
# Failover figures on a lent 16-core machine (docs/cluster.md): `ditto bench failover`
# (20 SIGKILLs of the primary under 8 writing clients), then scripts/failover-with-data.sh
# at 1.9M keys (466 MB per node), in place and by restart, alternated. Run from the
# repository root with a stripped release binary at .devbin/ditto and redis-cli and
# redis-benchmark in .devbin/bin (the lent machine has no Redis); results go to $OUT.
set -u
export PATH=$PWD/.devbin/bin:$PATH LD_LIBRARY_PATH=$PWD/.devbin/lib DITTO=$PWD/.devbin/ditto
nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1
echo "=== bench failover $(date +%T)"
timeout 120 $DITTO bench failover --kills 20 --between-s 1.0 --clients 8 --workers 4 --dir /tmp/fb --json > $OUT/failover.json 2> $OUT/failover.err
echo "rc=$?"; grep -v '^\s*$' $OUT/failover.err | grep -iv "^20..-" | tail -30
for run in 1 2 3; do
  for mode in in-place restart; do
    echo "=== with data, $mode, run $run $(date +%T)"
    PROMOTION=$mode WORKERS=4 timeout 150 scripts/failover-with-data.sh 1900000 2>&1 | tee -a $OUT/with-data.txt | grep -v "^\s*$" | tail -16
  done
done
echo "=== done $(date +%T)"
