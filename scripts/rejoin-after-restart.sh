#!/bin/bash
# A backup after its primary restarts (docs/replication.md, "A backup its primary can no
# longer resume"): a primary and a backup (`ditto server`, majority-durable), N SETs of
# 100-byte values loaded, then the primary stopped (SIGTERM, or SIGKILL with
# SIG=KILL) and started again on the same ports. Measured: how long until the backup
# holds a write made on the restarted primary (DITTO.WAITTS), its resident size then, how
# it joined (cut and resumed from the log, or a checkpoint copy), and whether it holds
# every key. With OLD=1 (a build before 2026-11-28, whose backup stops for good when
# its primary restarts), the backup process is restarted by hand as soon as its link
# reads down, which copies the primary's checkpoint: what a person had to do before.
# RESTARTS=K restarts the primary K times in a row (one JSON line each; the backup's
# resident size after each shows whether a rejoin lets the old database go).
# POLICY=majority-received: a restarted primary under it refuses writes until its backup
# says it holds nothing above its restart point (docs/replication.md, "A primary
# restarted under a policy that counts backups"); the first write is tried again until
# acknowledged, and first_write_ok_after_primary_up_s says when it was.
# Usage: rejoin-after-restart.sh BINARY [N]
set -u
B=$1; N=${2:-1000000}; SIG=${SIG:-TERM}; OLD=${OLD:-0}; RESTARTS=${RESTARTS:-1}; POLICY=${POLICY:-majority-durable}
. "$(dirname "$0")/pair-setup.sh"
primary() { $B server --port $P --data-dir $D/p --repl-port $R --commit-policy $POLICY --backups 1 --metrics off >> $D/p.log 2>&1 & pp=$!; }
backup() { $B server --port $Q --data-dir $D/b --replica-of 127.0.0.1:$R --metrics off >> $D/b.log 2>&1 & bp=$!; }
up() { for i in $(seq 1 600); do redis-cli -p $1 ping 2>/dev/null | grep -q PONG && return 0; sleep 0.1; done; return 1; }
primary; up $P || { echo "the primary did not start"; cat $D/p.log; exit 1; }
backup; up $Q || { echo "the backup did not start"; cat $D/b.log; exit 1; }
bp0=$bp
for i in $(seq 1 100); do redis-cli -p $P info replication | grep -q connected_slaves:1 && break; sleep 0.1; done
redis-benchmark -p $P -t set -d 100 -n $N -r $N -P 16 -c 50 -q > /dev/null
keys=$(redis-cli -p $P dbsize)
for round in $(seq 1 $RESTARTS); do
kill -$SIG $pp; wait $pp 2>/dev/null
t0=$(date +%s.%N)
primary; up $P || { echo "the primary did not restart"; cat $D/p.log; exit 1; }
t_primary=$(date +%s.%N)
( for i in $(seq 1 1200); do [ "$(redis-cli -p $P set after-restart-$round 1 2>/dev/null)" = "OK" ] && break; sleep 0.05; done; date +%s.%N > $D/write-ok ) &
setter=$!
if [ "$OLD" = 1 ]; then
  for i in $(seq 1 600); do redis-cli -p $Q info replication 2>/dev/null | grep -q "master_link_status:down" && break; sleep 0.05; done
  kill $bp; wait $bp 2>/dev/null
  backup
fi
wait $setter
ts=$(redis-cli -p $P ditto.lastcommit)
# DITTO.WAITTS answers within 5 s or errs: asked until it answers OK.
for i in $(seq 1 600); do
  [ "$(redis-cli -p $Q ditto.waitts $ts 2>/dev/null)" = "OK" ] && break
  sleep 0.1
done
t1=$(date +%s.%N)
bkeys=$(redis-cli -p $Q dbsize)
rss=$(grep VmRSS /proc/$bp/status | awk '{print $2}')
hwm=$(grep VmHWM /proc/$bp/status | awk '{print $2}')
how=$(grep -o -E "backup: resuming from ts [0-9]+|backup: checkpoint at ts [0-9]+ loaded: [0-9]+ rows in [0-9.]+ s" $D/b.log | tail -1)
python3 - "$t0" "$t_primary" "$t1" "$(cat $D/write-ok)" <<EOF
import sys, json
t0, tp, t1, tw = map(float, sys.argv[1:])
print(json.dumps({"restart": $round, "keys": $keys, "signal": "$SIG", "old_build": $OLD == 1,
  "policy": "$POLICY", "primary_up_s": round(tp - t0, 3), "first_write_ok_after_primary_up_s": round(tw - tp, 3),
  "backup_holds_new_write_after_primary_up_s": round(t1 - tp, 3),
  "backup_keys": $bkeys, "backup_rss_mib": round($rss / 1024), "backup_peak_rss_mib": round($hwm / 1024),
  "backup_pid_same": $bp0 == $bp, "how": "$how"}))
EOF
[ "$bkeys" = "$((keys + round))" ] || { echo "the backup holds $bkeys keys, the primary $((keys + round))"; exit 1; }
done
