#!/usr/bin/env bash
# `ditto bench redis` at several server worker counts, for a machine with more cores than
# the 2-core development VM (docs/server.md, "Scaling on 16 cores"): every-batch durability against
# Redis (appendfsync everysec and always) at the largest worker count, ditto alone at the
# others, and the interval durability with pipelining once. redis-benchmark runs with
# BENCH_THREADS threads (default 4) so the client is not the limit. Writes each run's
# JSON to OUTDIR and the tables to stdout.
#
#   [REQUESTS=500000] [BENCH_THREADS=4] scripts/redis-scaling.sh path/to/ditto OUTDIR [WORKERS...]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DITTO OUTDIR [WORKERS...]" >&2; exit 2; }
ditto=$1 outdir=$2
shift 2
workers=${*:-1 2 4 8}
last=${workers##* }
mkdir -p "$outdir"
common=(--requests "${REQUESTS:-500000}" --bench-threads "${BENCH_THREADS:-4}" --rounds 2 --json)
for w in $workers; do
    extra=(--no-redis)
    [ "$w" = "$last" ] && extra=()
    echo "== ditto server --workers $w (every-batch)"
    "$ditto" bench redis --workers "$w" --durability every-batch "${extra[@]}" "${common[@]}" 2>/dev/null |
        tee "$outdir/redis-w$w.txt" | grep -v '^{'
done
echo "== ditto server --workers $last (interval, pipeline 16)"
"$ditto" bench redis --workers "$last" --durability interval --pipeline 16 --no-redis "${common[@]}" 2>/dev/null |
    tee "$outdir/redis-interval-w$last.txt" | grep -v '^{'
