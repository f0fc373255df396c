#!/bin/bash
# Freshness of a cluster's backups under load, replay held at the primary's release
# (`--promotion in-place`, the default: a failover can promote a backup in place) against
# replay running ahead of it (`--promotion restart`), one after the other: 3 nodes on fixed
# ports 17001-17203, redis-benchmark SET (8 clients, no pipelining) for N requests, and the
# primary's INFO replication sampled every 10 ms meanwhile (each backup's replay_lag_ms,
# commit to its replay as the primary sees it, and freshness_pct). It kills every cluster
# node on this machine first. Usage: scripts/cluster-freshness.sh [N]
N=${1:-400000}
B=${DITTO:-target/release/ditto}
M="1=127.0.0.1:17001/17101/17201,2=127.0.0.1:17002/17102/17202,3=127.0.0.1:17003/17103/17203"
for mode in restart in-place; do
  pkill -f "server --node-id"; sleep 0.5
  rm -rf /tmp/fresh && mkdir -p /tmp/fresh
  for i in 1 2 3; do ($B server --node-id $i --members $M --data-dir /tmp/fresh/n$i --workers 2 --promotion $mode > /tmp/fresh/out$i 2>&1 &); done
  P=""; for t in $(seq 1 100); do for p in 17001 17002 17003; do r=$(redis-cli -p $p SET probe 1 2>/dev/null); [ "$r" = "OK" ] && P=$p && break 2; done; sleep 0.1; done
  redis-benchmark -p $P -t set -n $N -r 100000 -d 100 -c 8 -q > /tmp/fresh/bench 2>&1 &
  BENCH=$!
  sleep 1
  : > /tmp/fresh/samples
  while kill -0 $BENCH 2>/dev/null; do
    redis-cli -p $P info replication 2>/dev/null | grep '^slave' | tr ',' '\n' | grep -E '^(replay_lag_ms|freshness_pct)=' >> /tmp/fresh/samples
    sleep 0.01
  done
  pct() { grep "^$1=" /tmp/fresh/samples | cut -d= -f2 | sort -g | awk -v q=$2 '{a[NR]=$1} END {i=int(NR*q); if (i<1) i=1; printf "%s", a[i]}'; }
  n=$(grep -c '^replay_lag_ms=' /tmp/fresh/samples)
  echo "$mode: $(tr -d '\r' < /tmp/fresh/bench | grep -o 'SET: [0-9.]* requests per second' | tail -1); $n samples of replay_lag_ms: p50 $(pct replay_lag_ms 0.5), p99 $(pct replay_lag_ms 0.99); freshness_pct p50 $(pct freshness_pct 0.5), p1 $(pct freshness_pct 0.01)"
done
pkill -f "server --node-id"
