#!/bin/bash
# Paced checkpoints on a lent 16-core machine (docs/cluster.md, "Paced checkpoints"):
# `ditto bench failover --preload 1900000` (1.9M keys of 200 B per node, 3 failovers
# each), switchovers and SIGKILLs, the build before (.devbin/ditto-base, unpaced) and
# after (.devbin/ditto, 128 MB/s) alternated, ROUNDS times (default 2). Stripped release
# binaries; the JSON and the nodes' logs go to $OUT as one archive.
set -u
nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1
mkdir -p /tmp/p
for r in $(seq 1 ${ROUNDS:-2}); do
  for kind in switchover sigkill; do
    for b in ditto-base ditto; do
      n=$kind-$b-$r; extra=; [ $kind = switchover ] && extra=--switchover
      echo "=== $n $(date +%T)"
      timeout 45 .devbin/$b bench failover --clients 8 --workers 4 --preload 1900000 --kills 3 --between-s 2 $extra --dir /tmp/fo-$n --json > /tmp/p/$n.json 2> /tmp/p/$n.err
      echo "rc=$?"; grep "^failover [0-9]" /tmp/p/$n.err
      grep -o '"after_over_before":[0-9.]*' /tmp/p/$n.json | tr '\n' ' '; echo
      rm -rf /tmp/fo-$n
    done
  done
done
tar czf $OUT/pace.tgz -C /tmp p
echo "=== done $(date +%T)"
