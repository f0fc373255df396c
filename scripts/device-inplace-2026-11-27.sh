#!/bin/bash
# Two builds on a lent 16-core machine, alternated (docs/cluster.md, "16 cores,
# 2026-11-27 afternoon"): .devbin/ditto-base and .devbin/ditto. With 1.9M keys per node,
# 4 SIGKILLs and 4 switchovers 1 s apart (within the last seal's paced checkpoint), then
# 30 switchovers on small data (and 30 SIGKILLs with SIGKILL30=1); rounds of the 1.9M runs
# repeat while fewer than BUDGET_S (default 330) seconds have passed. Prints each run's
# summary; the JSON, the bench's output and the nodes' logs go to $OUT/inplace.tgz.
# First run: ditto-base = 93e40ff, ditto = 708330f, BUDGET_S=200 SIGKILL30=1 (the chain of
# seals, the old primary's seal, the switchover in place); second: ditto-base = 708330f,
# ditto = 8007741 (the fence, the holdings cache, fdatasync, the gap read from headers);
# third: ditto-base = 708330f, ditto = 655abda (reports read off the control thread),
# KINDS=switchover SMALL=0 BUDGET_S=150. (KINDS: which 1.9M runs; SMALL=0: no small runs.)
set -u
start=$(date +%s)
nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1
mkdir -p /tmp/f
run() { # name build timeout args...
  local n=$1 b=$2 t=$3; shift 3
  echo "=== $n $(date +%T)"
  RUST_LOG=info timeout "$t" .devbin/$b bench failover --clients 8 --workers 4 --dir /tmp/fo-$n "$@" --json > /tmp/f/$n.json 2> /tmp/f/$n.err
  echo "rc=$?"; grep -v "^20..-\|^\s*$" /tmp/f/$n.err | tail -9
  pkill -f "server --node-id"; sleep 0.5
  mkdir -p /tmp/f/logs-$n; cp /tmp/fo-$n/node*.log /tmp/f/logs-$n/ 2>/dev/null; rm -rf /tmp/fo-$n
}
r=1
while :; do
  for kind in ${KINDS:-sigkill switchover}; do
    for b in ditto-base ditto; do
      extra=; [ $kind = switchover ] && extra=--switchover
      run $kind-1.9M-$b-$r $b 90 --preload 1900000 --kills 4 --between-s 1 $extra
    done
  done
  [ $r = 1 ] && [ "${SMALL:-1}" = 1 ] && for b in ditto-base ditto; do
    run switchover-30-$b $b 45 --switchover --kills 30 --between-s 0.3
    [ "${SIGKILL30:-}" = 1 ] && run sigkill-30-$b $b 60 --kills 30 --between-s 0.5
  done
  r=$((r + 1))
  [ $(( $(date +%s) - start )) -lt ${BUDGET_S:-330} ] || break
done
tar czf $OUT/inplace.tgz -C /tmp f
echo "=== done $(date +%T) after $(( $(date +%s) - start )) s"
