#!/bin/bash
# A returning backup's gap and the primary's memory (docs/replication.md, "A returning
# backup's gap is read a segment at a time"): a primary and a backup (`ditto server`,
# commit policy `local`, so that the primary goes on alone), the backup SIGKILLed,
# N SETs of 1000-byte values written (redis-benchmark, -P 16), the primary's peak
# resident size reset (/proc/PID/clear_refs), the backup started again, and the primary's
# peak read once the backup has caught up. Usage: gap-memory.sh BINARY [N]
set -u
B=$1; N=${2:-300000}
. "$(dirname "$0")/pair-setup.sh"
RUST_LOG=info $B server --port $P --data-dir $D/p --repl-port $R --commit-policy local --metrics off > $D/p.log 2>&1 & pp=$!
sleep 1
kill -0 $pp || { echo "the primary did not start:"; cat $D/p.log; exit 1; }
$B server --port $Q --data-dir $D/b --replica-of 127.0.0.1:$R --metrics off > $D/b.log 2>&1 & bp=$!
for i in $(seq 1 100); do redis-cli -p $Q info replication 2>/dev/null | grep -q "ditto_link_up:1\|master_link_status:up" && break; sleep 0.1; done
redis-cli -p $P set warm 1 > /dev/null; sleep 0.5
kill -9 $bp; wait $bp 2>/dev/null
redis-benchmark -p $P -t set -d 1000 -n $N -r $N -P 16 -q > /dev/null
sleep 1
rss() { grep "$1" /proc/$pp/status | awk '{print $2}'; }
echo 5 > /proc/$pp/clear_refs
before=$(rss VmRSS)
t0=$(date +%s.%N)
$B server --port $Q --data-dir $D/b --replica-of 127.0.0.1:$R --metrics off >> $D/b.log 2>&1 & bp=$!
want=$(redis-cli -p $P dbsize)
for i in $(seq 1 600); do
  got=$(redis-cli -p $Q dbsize 2>/dev/null); [ "$got" = "$want" ] && break; sleep 0.1
done
t1=$(date +%s.%N)
sleep 0.5
printf '%s: %s keys on the backup of %s; primary RSS before %d MiB, peak while the backup resumed %d MiB (+%d MiB); caught up in %.1f s\n' \
  "$(basename $B)" "$got" "$want" $((before / 1024)) $(($(rss VmHWM) / 1024)) $((($(rss VmHWM) - before) / 1024)) $(echo "$t1 - $t0" | bc)
grep -h "resuming above\|sending a checkpoint" $D/p.log | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200 | tail -1
[ "$got" = "$want" ] || { echo "FAILED: the backup holds $got keys of $want"; exit 1; }
grep -q "resuming above" $D/p.log || { echo "FAILED: the backup did not resume from the log"; exit 1; }
