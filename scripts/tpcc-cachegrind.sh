#!/usr/bin/env bash
# Instructions and simulated cache misses per committed TPC-C transaction (1 worker, log
# off unless LOG names a mode, e.g. LOG=interval; then the flusher's instructions count
# too, since valgrind runs every thread), under cachegrind: a run of SECONDS minus a run
# of 1 s, so loading cancels out. Deterministic where wall-clock figures on a shared
# machine are not; compare builds whose runs committed similar numbers of transactions
# (the tables grow as they run, and the final consistency check is counted too). Under
# valgrind a logged run's batches are tiny and compress poorly, so the log stores them
# uncompressed: LZ4's cost at real speed does not show here.
#
#   [LOG=interval] [ARGS=--compress] [KEEP=dir] scripts/tpcc-cachegrind.sh path/to/ditto [SECONDS (default 20)]
#
# ARGS adds arguments to `ditto bench tpcc`. KEEP=dir keeps the two cachegrind files there
# (cg.SECONDS, cg.1) for cg_diff.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DITTO [SECONDS]" >&2; exit 2; }
ditto=$1 seconds=${2:-20} log=${LOG:-off}
out=$(mktemp -d)
trap 'if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$out"/cg.* "$KEEP"/; fi; rm -rf "$out"' EXIT
for s in "$seconds" 1; do
    valgrind --tool=cachegrind --cache-sim=yes --cachegrind-out-file="$out/cg.$s" \
        "$ditto" bench tpcc --workers 1 --seconds "$s" --log "$log" ${ARGS:-} >"$out/$s.txt" 2>&1 ||
        { cat "$out/$s.txt" >&2; exit 1; }
done
python3 - "$out" "$seconds" <<'PY'
import re, sys
out, long = sys.argv[1], sys.argv[2]
def figures(s):
    t = open(f"{out}/{s}.txt").read()
    count = lambda name: int(re.search(name + r":\s+([\d,]+)", t).group(1).replace(",", ""))
    return (int(re.search(r"committed\s+(\d+)", t).group(1)),
            count("I   refs"), count("D1  misses"), count("LL misses"))
a, b = figures(long), figures(1)
n = a[0] - b[0]
print(f"transactions {n}: instructions/txn {(a[1]-b[1])/n:.0f}, "
      f"D1 misses/txn {(a[2]-b[2])/n:.1f}, LL misses/txn {(a[3]-b[3])/n:.1f}")
PY
