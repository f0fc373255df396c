#!/usr/bin/env bash
# Where a logged TPC-C transaction spends its worker's time, against the log off:
#
#   scripts/worker-profile.sh DITTO [ROUNDS (2)] [WORKERS (1)] [MODE (interval)]
#
# Each round runs `DITTO bench tpcc --one-process` once with the log off and once with
# MODE, interleaved, and `perf record`s only the first worker thread (tpcc-0) for 3 s of
# the run phase (after the load). Samples are divided by the transactions the run
# committed in those 3 s (throughput x 3), so the figures are samples per 1,000
# transactions at 1,999 Hz (1 sample = 0.5 us): the worker's time per transaction, by
# symbol, which a whole-run wall-clock ratio cannot separate from the VM's noise. Prints,
# per round, the total and the symbols that grew or shrank most. Needs perf.
set -euo pipefail
DITTO=${1:?usage: worker-profile.sh DITTO [ROUNDS] [WORKERS] [MODE]}
ROUNDS=${2:-2}
WORKERS=${3:-1}
MODE=${4:-interval}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

record() { # mode tag
  "$DITTO" bench tpcc --workers "$WORKERS" --seconds 5 --log "$1" --one-process --json >"$OUT/$2.json" 2>/dev/null &
  local pid=$! tid=""
  for _ in $(seq 1 1200); do
    tid=$(grep -ls '^tpcc-0$' /proc/$pid/task/*/comm 2>/dev/null | head -1 | cut -d/ -f5 || true)
    [ -n "$tid" ] && break
    sleep 0.05
  done
  [ -n "$tid" ] || { echo "no worker thread appeared" >&2; kill $pid; exit 1; }
  sleep 0.5
  perf record -q -F 1999 -t "$tid" -o "$OUT/$2.data" -- sleep 3 >/dev/null 2>&1
  wait $pid
  perf report -i "$OUT/$2.data" --sort sym -F sample,sym --stdio -t ';' 2>/dev/null |
    grep -v '^#' | grep ';' >"$OUT/$2.txt" || true
}

for r in $(seq 1 "$ROUNDS"); do
  record off "off$r"
  record "$MODE" "log$r"
  python3 - "$OUT" "$r" "$MODE" <<'EOF'
import json, sys
out, r, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def load(tag):
    tps = json.loads(open(f"{out}/{tag}.json").read().strip().splitlines()[-1])["runs"][0]["report"]["throughput_tps"]
    d = {}
    for line in open(f"{out}/{tag}.txt"):
        n, _, rest = line.strip().partition(";")
        sym = rest.split(";")[0].strip()
        if n.strip().isdigit():
            d[sym] = d.get(sym, 0) + int(n)
    ktxn = tps * 3 / 1000
    return tps, {k: v / ktxn for k, v in d.items()}
(ta, a), (tb, b) = load(f"off{r}"), load(f"log{r}")
print(f"round {r}: off {ta:,.0f} tps, {sum(a.values()):.1f} samples per 1k txns; "
      f"{mode} {tb:,.0f} tps, {sum(b.values()):.1f}")
keys = sorted(set(a) | set(b), key=lambda k: b.get(k, 0) - a.get(k, 0))
print("  change     off    log  symbol")
for k in keys[::-1][:10] + ["..."] + keys[:4]:
    if k == "...":
        print("  ...")
        continue
    print(f"  {b.get(k, 0) - a.get(k, 0):+6.2f} {a.get(k, 0):6.2f} {b.get(k, 0):6.2f}  {k[:90]}")
EOF
done
