#!/bin/bash
# Failovers with data on a lent 16-core machine (docs/cluster.md): `ditto bench failover`
# with N keys of 200 B preloaded (default 1,900,000), KILLS SIGKILLs of the primary
# (default 20) under 8 writing clients, 4 workers per node. Run from the repository root
# with a stripped release binary at .devbin/ditto; results go to $OUT.
set -u
N=${N:-1900000}
nproc; grep -m1 "model name" /proc/cpuinfo
echo "=== bench failover, $N keys preloaded $(date +%T)"
timeout 400 .devbin/ditto bench failover --preload $N --kills ${KILLS:-20} --between-s ${BETWEEN:-2.5} --clients 8 --workers 4 --dir /tmp/fd --json > $OUT/failover-data.json 2> $OUT/failover-data.err
echo "rc=$?"; grep -v '^\s*$' $OUT/failover-data.err | grep -iv "^20..-" | tail -25; grep -v '^{' $OUT/failover-data.json | tail -4
grep -h "phases_ms\|(in place)\|promotion:\|held every stream\|role in place failed" /tmp/fd/node*.log | sort | cut -c1-260 > $OUT/nodes.txt
echo "=== done $(date +%T)"
