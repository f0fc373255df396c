#!/usr/bin/env bash
# Hot-standby scaling on a machine with more cores than the 2-core development VM
# (docs/replication.md, "Figures: scaling on 16 cores" and "The dependency replay mode"):
# for each workload and worker count, a replay-only run (the run's log replayed in each
# MODE, checked against the primary's contents) and a cluster run (one backup process,
# the primary pinned to the first half of the CPUs and the backup to the other).
# Appends one {"mode","wl","workers","result"} record per run to OUTDIR/replay.jsonl and
# OUTDIR/cluster.jsonl; prints each run's progress lines.
#
#   MODES=serial,parallel,dependency REPLAY=serial,parallel \
#     scripts/replication-scaling.sh path/to/ditto OUTDIR [SECONDS] [WORKERS...]
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DITTO OUTDIR [SECONDS] [WORKERS...]" >&2; exit 2; }
ditto=$1 outdir=$2 seconds=${3:-8}
shift $(($# < 3 ? $# : 3))
workers=${*:-1 2 4 8 16}
mkdir -p "$outdir"
echo "machine: $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
run() { # kind workload workers args...
    local kind=$1 wl=$2 w=$3; shift 3
    echo "=== $kind $wl workers=$w $(date +%T)"
    timeout 300 "$ditto" bench "$wl" --workers "$w" --seconds "$seconds" --log every-batch "$@" --json >/tmp/rs.json 2>/tmp/rs.err
    echo "rc=$?"; grep -v '^\s*$' /tmp/rs.err | tail -4
    { echo "{\"mode\":\"$kind\",\"wl\":\"$wl\",\"workers\":$w,\"result\":"; cat /tmp/rs.json; echo "}"; } >>"$outdir/$kind.jsonl"
}
for w in $workers; do
    for wl in tpcc ycsb; do
        run replay "$wl" "$w" --one-process --replay-only "${MODES:-serial,parallel,dependency}"
        run cluster "$wl" "$w" --backups 1 --pin --backup-replay "${REPLAY:-serial,parallel}"
    done
done
