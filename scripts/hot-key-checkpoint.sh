#!/bin/bash
# A hot key while checkpoints run (docs/architecture.md, "Garbage"): a server preloaded
# with N keys of 100 B, checkpointing every second (paced at 32 MB/s, so each one holds
# its snapshot for seconds), then INCR of one key (redis-benchmark -t incr, 50 clients,
# no pipelining) and SET of random keys; the same without checkpoints for the baseline.
# Prints rq/s, the server's resident size and its checkpoints (ditto_checkpoints_total). Usage: hot-key-checkpoint.sh BINARY [N]
set -u
B=$1; N=${2:-1000000}
for ckpt in 1 0; do
  D=$(mktemp -d)
  read -r P M < <(python3 -c 'import socket
ss=[socket.socket() for _ in range(2)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])')
  printf 'checkpoint_interval_s = %d\ncheckpoint_log_growth_percent = 0\ncheckpoint_write_mb_per_s = 32\n' $ckpt > $D/c.toml
  $B server --port $P --data-dir $D/d --config $D/c.toml --metrics 127.0.0.1:$M > $D/log 2>&1 & sp=$!
  sleep 1
  redis-benchmark -p $P -t set -d 100 -n $N -r $N -P 32 -q > /dev/null
  sleep 2
  incr=$(redis-benchmark -p $P -t incr -n 200000 -c 50 -q | grep -o "[0-9.]* requests per second" | cut -d' ' -f1)
  set_=$(redis-benchmark -p $P -t set -d 100 -n 200000 -r $N -c 50 -q | grep -o "[0-9.]* requests per second" | cut -d' ' -f1)
  rss=$(($(grep VmRSS /proc/$sp/status | awk '{print $2}') / 1024))
  n=$(curl -s http://127.0.0.1:$M/metrics | awk '/^ditto_checkpoints_total/ {print $2}')
  echo "$(basename $B) checkpoints-every-s=$ckpt: INCR one key $incr rq/s, SET $set_ rq/s, RSS $rss MiB, checkpoints: $n"
  kill $sp; wait $sp 2>/dev/null; rm -rf $D
done
