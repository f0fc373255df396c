#!/bin/bash
# A backup away while clients SET and DEL the same 1,000 keys (or, with KIND set, only SET
# them), then its catch-up timed, with its replay CPU (docs/replication.md: the wait of a key's
# new life on another record, not given a bound). Usage: churn-catch-up.sh BINARY [N] [churn|set]
set -u
B=$1; N=${2:-200000}; KIND=${3:-churn}
. "$(dirname "$0")/pair-setup.sh"
$B server --port $P --data-dir $D/p --repl-port $R --commit-policy local --metrics off > $D/p.log 2>&1 & pp=$!
sleep 1
$B server --port $Q --data-dir $D/b --replica-of 127.0.0.1:$R --metrics off > $D/b.log 2>&1 & bp=$!
for i in $(seq 1 100); do redis-cli -p $Q info replication 2>/dev/null | grep -q "ditto_link_up:1\|master_link_status:up" && break; sleep 0.1; done
redis-cli -p $P set warm 1 > /dev/null; sleep 0.5
kill -9 $bp; wait $bp 2>/dev/null
if [ $KIND = churn ]; then
  redis-benchmark -p $P -c 25 -n $N -r 1000 -P 16 -q SET key:__rand_int__ v > /dev/null & b1=$!
  redis-benchmark -p $P -c 25 -n $N -r 1000 -P 16 -q DEL key:__rand_int__ > /dev/null & b2=$!
  wait $b1 $b2
else
  redis-benchmark -p $P -c 25 -n $N -r 1000 -P 16 -q SET key:__rand_int__ v > /dev/null & b1=$!
  redis-benchmark -p $P -c 25 -n $N -r 1000 -P 16 -q SET key:__rand_int__ w > /dev/null & b2=$!
  wait $b1 $b2
fi
sleep 1
want=$(redis-cli -p $P dbsize)
t0=$(date +%s.%N)
$B server --port $Q --data-dir $D/b --replica-of 127.0.0.1:$R --metrics off >> $D/b.log 2>&1 & bp=$!
pv=$(redis-cli -p $P info replication | grep -o "ditto_durable_ts:[0-9]*" | cut -d: -f2)
for i in $(seq 1 1200); do
  vis=$(redis-cli -p $Q info replication 2>/dev/null | grep -o "ditto_replayed_ts:[0-9]*" | cut -d: -f2)
  [ -n "$vis" ] && [ "$vis" -ge "$pv" ] 2>/dev/null && break; sleep 0.02
done
t1=$(date +%s.%N)
got=$(redis-cli -p $Q dbsize 2>/dev/null)
cpu=$(redis-cli -p $Q info replication | grep -o "ditto_replay_cpu_ms:[0-9]*" | cut -d: -f2)
txns=$(redis-cli -p $Q info replication | grep -o "ditto_txns_replayed:[0-9]*" | cut -d: -f2)
echo "replay cpu ms $cpu for $txns txns"
printf '%s %s: backup %s keys of %s, caught up in %.2f s (visible %s of %s)\n' "$(basename $B)" $KIND "$got" "$want" $(echo "$t1 - $t0" | bc) "$vis" "$pv"
