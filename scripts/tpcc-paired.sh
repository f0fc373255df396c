#!/usr/bin/env bash
# Compares two ditto builds on TPC-C (1 worker, log off unless LOG names a mode; ARGS adds
# arguments to both builds' `ditto bench tpcc`) on a noisy 2-core machine: each
# round runs both at the same time, one pinned to each core (with its log flusher, so a
# logged run measures the whole CPU cost of a transaction), so both see the same
# neighbours; the cores swap every round. Prints one line per build per round
# (tps, CPU us per transaction, p50 per transaction type); compare the pairs' ratios.
#
#   [LOG=interval] [ARGS=--compress] scripts/tpcc-paired.sh ROUNDS SECONDS path/to/ditto-A path/to/ditto-B
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 ROUNDS SECONDS DITTO_A DITTO_B" >&2; exit 2; }
rounds=$1 seconds=$2 a=$3 b=$4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
one() { # core binary label
    taskset -c "$1" "$2" bench tpcc --workers 1 --seconds "$seconds" --log "${LOG:-off}" ${ARGS:-} --json 2>/dev/null | tail -1 |
        python3 -c '
import json, sys
r = json.loads(sys.stdin.read())["runs"][0]["report"]
print(sys.argv[1], round(r["throughput_tps"]), round(r["cpu_s_per_txn"] * 1e6, 1),
      {t["name"]: t["latency_us_p50"] for t in r["per_type"]})' "$3"
}
for i in $(seq "$rounds"); do
    if [ $((i % 2)) = 1 ]; then ca=0 cb=1; else ca=1 cb=0; fi
    one "$ca" "$a" A >"$out/a" &
    pa=$!
    one "$cb" "$b" B >"$out/b" || { wait "$pa"; exit 1; }
    wait "$pa" # a failed run of A stops the script too
    echo "round $i (A on core $ca)"
    cat "$out/a" "$out/b"
done
