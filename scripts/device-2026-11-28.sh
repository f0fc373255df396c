#!/bin/bash
# The 2026-11-28 run on a lent 16-core machine (docs/replication.md and docs/cluster.md,
# "16 cores, 2026-11-28"): cluster TPC-C at 4 and 8 workers with every thread's CPU
# (utime+stime) and context switches sampled from /proc twice a second in both
# processes (where does the received lag at 4-8 workers come from?), then 30 SIGKILL
# failovers and 30 switchovers of the current build. Run from the repository root with a
# stripped release binary at .devbin/ditto; results go to $OUT.
set -u
B=$PWD/.devbin/ditto
nproc; grep -m1 "model name" /proc/cpuinfo; df -h /tmp | tail -1; command -v python3 perf
sample() { # every 0.5 s, one line per thread of every ditto process: time pid tid stat-tail | ctxt
  while :; do
    t=$(date +%s.%N)
    for p in $(pgrep -x ditto); do
      for d in /proc/$p/task/*; do
        read -r s < $d/stat 2>/dev/null || continue
        c=
        while read -r k v _; do case $k in voluntary_ctxt_switches:|nonvoluntary_ctxt_switches:) c="$c $v";; esac; done < $d/status 2>/dev/null
        echo "$t $p ${d##*/} ${s#*(} |$c"
      done
    done
    sleep 0.5
  done
}
for w in 4 8; do
  echo "=== cluster tpcc w=$w $(date +%T)"
  sample > $OUT/threads-tpcc-w$w.txt 2>/dev/null & sp=$!
  timeout 60 $B bench tpcc --workers $w --seconds 4 --log every-batch --backups 1 --pin --backup-replay parallel --json > /tmp/j 2>$OUT/tpcc-w$w.err
  echo "rc=$?"; kill $sp; wait $sp 2>/dev/null
  grep -o '"backup_[a-z_]*lag_ms_p[0-9]*":[0-9.]*\|"throughput_ratio_vs_standalone":[0-9.]*\|"freshness_score":[0-9.]*\|"replay_cost_ratio":[0-9.]*' /tmp/j | sort -u | tr '\n' ' '; echo
  (echo "{\"mode\":\"cluster\",\"wl\":\"tpcc\",\"workers\":$w,\"result\":"; cat /tmp/j; echo "}") >> $OUT/cluster.jsonl
done
summary() { grep -v '^\s*$' "$1" | grep -v "^20..-" | tail -${2:-12}; }
run_failover() { # name timeout args...
  local name=$1 t=$2; shift 2
  echo "=== failover $name $(date +%T)"
  timeout "$t" "$B" bench failover --clients 8 --workers 4 --dir /tmp/fo-$name "$@" --json > $OUT/$name.json 2> $OUT/$name.err
  echo "rc=$?"; summary $OUT/$name.err 14
  grep -h "replay refused\|still holds a value\|panicked" /tmp/fo-$name/*.log 2>/dev/null | head -3
  rm -rf /tmp/fo-$name
}
run_failover sigkill-30 100 --kills 30 --between-s 0.5
run_failover switchover-30 70 --switchover --kills 30 --between-s 0.3
echo "=== done $(date +%T)"
