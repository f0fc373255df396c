#!/bin/bash
# Failover figures on a lent 16-core machine (docs/cluster.md): `ditto bench failover`
# (20 SIGKILLs of the primary under 8 writing clients; BENCH=0 skips it), then
# scripts/failover-with-data.sh with N SETs (default 1,900,000: 1.2M keys, 295 MB per
# node; 3,000,000: 1.9M keys, 466 MB), in place and by restart, alternated, RUNS times
# each (default 3), with the failover's lines from the nodes' logs. Run from the repository
# root with a stripped release binary at .devbin/ditto and redis-cli and redis-benchmark
# in .devbin/bin (the lent machine has no Redis); results go to $OUT.
set -u
export PATH=$PWD/.devbin/bin:$PATH LD_LIBRARY_PATH=$PWD/.devbin/lib DITTO=$PWD/.devbin/ditto
N=${N:-1900000}
nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1
if [ "${BENCH:-1}" != 0 ]; then
  echo "=== bench failover $(date +%T)"
  timeout 120 $DITTO bench failover --kills 20 --between-s 1.0 --clients 8 --workers 4 --dir /tmp/fb --json > $OUT/failover.json 2> $OUT/failover.err
  echo "rc=$?"; grep -v '^\s*$' $OUT/failover.err | grep -iv "^20..-" | tail -30
fi
for run in $(seq 1 ${RUNS:-3}); do
  for mode in in-place restart; do
    echo "=== with data ($N), $mode, run $run $(date +%T)"
    PROMOTION=$mode WORKERS=4 timeout 150 scripts/failover-with-data.sh $N 2>&1 | grep -E "primary|load|first write|dbsize on|rejoined" | tee -a $OUT/with-data.txt
    grep -h "fenced its\|phases_ms\|(in place)\|promotion:\|writes taken" /tmp/big/out* | grep -v "epoch 1 opened" | sort | cut -c1-300 | tee -a $OUT/with-data.txt | tail -8
  done
done
echo "=== done $(date +%T)"
