#!/usr/bin/env bash
# Multi-core scaling of the embedded engine: TPC-C (warehouses = workers) and YCSB++ with
# 1, 2, 4, ... workers, each with the log off and on (fsync every 10 ms), so every logged
# figure has its unlogged baseline from the same run. Made for a machine with more cores
# than the 2-core development VM (docs/results.md, "Engine scaling"). Writes one JSON object per
# benchmark run to OUTDIR/scaling.jsonl and a table to stdout.
#
#   scripts/scaling.sh path/to/ditto OUTDIR [SECONDS] [WORKERS...]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DITTO OUTDIR [SECONDS] [WORKERS...]" >&2; exit 2; }
ditto=$1 outdir=$2 seconds=${3:-8}
shift $(($# < 3 ? $# : 3))
workers=${*:-1 2 4 8 16}
mkdir -p "$outdir"
jsonl=$outdir/scaling.jsonl
: >"$jsonl"
echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"; echo
for w in $workers; do
    for bench in tpcc ycsb; do
        "$ditto" bench "$bench" --workers "$w" --seconds "$seconds" --log off,interval --json 2>/dev/null |
            tail -1 >>"$jsonl"
        tail -1 "$jsonl" | python3 -c '
import json, sys
o = json.loads(sys.stdin.read())
for r in o["runs"]:
    p = r["report"]
    print("%-5s workers=%2d log=%-20s %10.0f tps %.3fx  abort=%.4f  p50=%dus p99=%dus  cpu/txn=%.1fus  log B/txn=%.0f" % (
        o["benchmark"], p["workers"], r["log"], p["throughput_tps"], r["ratio_to_first"], p["abort_rate"],
        p["latency_us_p50"], p["latency_us_p99"], p["cpu_s_per_txn"] * 1e6, p["log_bytes_per_txn"]))
'
    done
done
