#!/bin/bash
# A backup's clients through failovers on a lent 16-core machine (docs/cluster.md,
# "Clients' connections through a change in place"): `ditto bench failover
# --backup-reader` (one client reading DBSIZE without pause on a backup, moved to a backup
# before each failover), 100 SIGKILLs, 100 switchovers, and 3 SIGKILLs with 1.9M keys per
# node. A stripped release binary at .devbin/ditto; the JSON and nodes' logs go to $OUT
# as one archive.
set -u
nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1
mkdir -p /tmp/r
run() {
  n=$1; shift
  echo "=== $n $(date +%T)"
  timeout 200 .devbin/ditto bench failover --clients 8 --workers 4 --backup-reader --dir /tmp/fo-$n --json "$@" > /tmp/r/$n.json 2> /tmp/r/$n.err
  echo "rc=$?"; tail -4 /tmp/r/$n.json | head -3
  grep -h "panicked\|error" /tmp/r/$n.err | head -5
  mkdir -p /tmp/r/logs-$n; cp /tmp/fo-$n/node*.log /tmp/r/logs-$n/ 2>/dev/null; rm -rf /tmp/fo-$n
}
run sigkill-100 --kills 100 --between-s 0.5
run switchover-100 --switchover --kills 100 --between-s 0.3
run sigkill-data-3 --preload 1900000 --kills 3 --between-s 2
tar czf $OUT/readers.tgz -C /tmp r
echo "=== done $(date +%T)"
