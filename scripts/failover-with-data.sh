#!/bin/bash
# A failover with more data: 3 nodes on fixed ports 17001-17203, N keys of 200 B loaded with
# redis-benchmark, SIGKILL of the primary's node, time to the first write, then the rejoin.
# It kills every cluster node (`server --node-id`, whatever the binary is named) on this
# machine first. Usage: scripts/failover-with-data.sh [N]
# PROMOTION=restart compares the promotion that recovers from the directory (default in-place);
# WORKERS sets each server's workers (default 2); SETTLE the seconds between the end of
# the load and the kill (default 1; 0 kills while the backups may still be checkpointing).
N=${1:-500000}
PROMOTION=${PROMOTION:-in-place}
WORKERS=${WORKERS:-2}
SETTLE=${SETTLE:-1}
pkill -f "server --node-id"; sleep 0.3
B=${DITTO:-target/release/ditto}
rm -rf /tmp/big && mkdir -p /tmp/big
M="1=127.0.0.1:17001/17101/17201,2=127.0.0.1:17002/17102/17202,3=127.0.0.1:17003/17103/17203"
for i in 1 2 3; do ($B server --node-id $i --members $M --data-dir /tmp/big/n$i --workers $WORKERS --promotion $PROMOTION > /tmp/big/out$i 2>&1 &); done
sleep 2
P=""; for t in $(seq 1 50); do for p in 17001 17002 17003; do r=$(redis-cli -p $p SET probe 1 2>/dev/null); [ "$r" = "OK" ] && P=$p && break 2; done; sleep 0.1; done
echo "primary $P (promotion $PROMOTION)"
T=$(date +%s%N)
redis-benchmark -p $P -t set -n $N -r $N -d 200 -P 64 -c 8 -q 2>&1 | tail -1
echo "load $(( ($(date +%s%N)-T)/1000000 )) ms; dbsize $(redis-cli -p $P dbsize)"
sleep $SETTLE
N_ID=$((P-17000))
T0=$(date +%s%N)
kill -9 $(pgrep -f "node-id $N_ID ")
NEW=""
for t in $(seq 1 3000); do for p in 17001 17002 17003; do [ $p = $P ] && continue; r=$(timeout 1 redis-cli -p $p SET after x 2>/dev/null); [ "$r" = "OK" ] && NEW=$p && break 2; done; sleep 0.01; done
echo "first write on $NEW after $(( ($(date +%s%N)-T0)/1000000 )) ms"
echo "dbsize on new primary: $(redis-cli -p $NEW dbsize)"
grep -h "failover to\|opened\|stopped\|started" /tmp/big/out* | sort | cut -c1-150 | tail -12
# rejoin
T1=$(date +%s%N)
($B server --node-id $N_ID --members $M --data-dir /tmp/big/n$N_ID --workers $WORKERS --promotion $PROMOTION >> /tmp/big/out$N_ID 2>&1 &)
for t in $(seq 1 600); do redis-cli -p $P info replication 2>/dev/null | grep -q "master_link_status:up" && break; sleep 0.1; done
echo "rejoined (link up) after $(( ($(date +%s%N)-T1)/1000000 )) ms; its dbsize $(redis-cli -p $P dbsize)"
pkill -f "server --node-id"
