#!/bin/bash
# The fence's wait for a cancelled checkpoint on a lent 16-core machine (docs/cluster.md,
# "Where a fence's wait for a cancelled checkpoint went"): `ditto bench failover --preload
# 1900000 --backup-reader` with RUST_LOG=info, 3 SIGKILLs and 3 switchovers, the build
# before (.devbin/ditto-base: the cancelled checkpoint's files unlinked in the fence's
# wait) and after (.devbin/ditto: moved to the trash) alternated, ROUNDS times (default 2).
# (BUILDS="ditto" runs the new build only.) Prints every fence's time and the slow fences' parts; the JSON and logs go to $OUT.
set -u
nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1
mkdir -p /tmp/f
for r in $(seq 1 ${ROUNDS:-2}); do
  for kind in sigkill switchover; do
    for b in ${BUILDS:-ditto-base ditto}; do
      n=$kind-$b-$r; extra=; [ $kind = switchover ] && extra=--switchover
      echo "=== $n $(date +%T)"
      RUST_LOG=info timeout 60 .devbin/$b bench failover --clients 8 --workers 4 --preload 1900000 --kills 3 --between-s 2 --backup-reader $extra --dir /tmp/fo-$n --json > /tmp/f/$n.json 2> /tmp/f/$n.err
      echo "rc=$?"; grep "^failover [0-9]" /tmp/f/$n.err
      grep -h "fenced its backup in place in" /tmp/fo-$n/node*.log | awk '{print $(NF-4)}' | tr '\n' ' '; echo
      grep -h "fence: \|files removed in\|stalled\|not heard from" /tmp/fo-$n/node*.log | sed 's/.*\(fence: \)/\1/; s/.*\(checkpoint at ts\)/\1/; s/.*\(control: \)/\1/' | cut -c1-160
      mkdir -p /tmp/f/logs-$n; cp /tmp/fo-$n/node*.log /tmp/f/logs-$n/ 2>/dev/null; rm -rf /tmp/fo-$n
    done
  done
done
tar czf $OUT/fence.tgz -C /tmp f
echo "=== done $(date +%T)"
