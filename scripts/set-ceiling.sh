#!/usr/bin/env bash
# SET without pipelining (50 clients, random keys of 100k) against Redis with appendfsync
# everysec and always, and against ditto (every-batch) with its log on the disk and on
# tmpfs, where fdatasync returns at once: what the disk costs, and what is left when it
# costs nothing (docs/results.md, "Twenty-first session"). Prints, per server and round,
# requests/s, the server's CPU per request (/proc/PID/stat) and the whole machine's busy
# CPU per request (/proc/stat: user, nice, system, irq, softirq), all in microseconds.
#
#   scripts/set-ceiling.sh path/to/ditto [ROUNDS=3] [REQUESTS=300000]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DITTO [ROUNDS] [REQUESTS]" >&2; exit 2; }
ditto=$1 rounds=${2:-3} n=${3:-300000}
work=$(mktemp -d) shm=$(mktemp -d -p /dev/shm)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work" "$shm"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
busy() { awk '/^cpu / {print $2+$3+$4+$7+$8}' /proc/stat; }
up() { for _ in $(seq 100); do redis-cli -p "$1" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.1; done; echo "no server on $1" >&2; exit 1; }
measure() { # NAME PID PORT
    local hz s0 t0 out s1 t1
    hz=$(getconf CLK_TCK)
    redis-benchmark -p "$3" -r 100000 -c 50 -t set -n 50000 -q >/dev/null 2>&1
    s0=$(busy) t0=$(ticks "$2")
    out=$(redis-benchmark -p "$3" -r 100000 -c 50 -t set -n "$n" -q 2>/dev/null | tr '\r' '\n' | grep "requests per second" | tail -1)
    s1=$(busy) t1=$(ticks "$2")
    awk -v name="$1" -v rps="$(echo "$out" | awk '{print $2}')" -v srv=$((t1 - t0)) -v all=$((s1 - s0)) -v n="$n" -v hz="$hz" \
        'BEGIN { printf "%-22s %10.0f requests/s   server %5.2f us   machine %5.2f us\n", name, rps, srv * 1e6 / hz / n, all * 1e6 / hz / n }'
}
for r in $(seq "$rounds"); do
    echo "round $r"
    for policy in everysec always; do
        p=$(port) dir="$work/redis-$policy"
        rm -rf "$dir"; mkdir -p "$dir"
        redis-server --port "$p" --dir "$dir" --appendonly yes --appendfsync "$policy" --save "" >/dev/null 2>&1 &
        pid=$!; pids+=("$pid"); up "$p"
        measure "redis/$policy" "$pid" "$p"
        kill "$pid"; wait "$pid" 2>/dev/null || true
    done
    for where in disk tmpfs; do
        p=$(port) dir="$work/ditto"
        [ "$where" = tmpfs ] && dir="$shm/ditto"
        rm -rf "$dir"
        "$ditto" server --port "$p" --data-dir "$dir" --metrics off >/dev/null 2>&1 &
        pid=$!; pids+=("$pid"); up "$p"
        measure "ditto/$where" "$pid" "$p"
        kill "$pid"; wait "$pid" 2>/dev/null || true
        rm -rf "$dir"
    done
done
