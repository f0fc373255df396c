#!/usr/bin/env bash
# Redis's WAIT after each SET, one client, no pipelining between pairs: the latency of
# "SET k v; WAIT 1 1000" (sent together, answered when one backup has received the SET),
# against a ditto primary and backup (each binary given, so two builds compare in one run)
# and a Redis primary and replica, started the same way. Prints p50/p99/mean per server
# and round, and a JSON line per server (docs/results.md, "WAIT").
#
#   scripts/wait-latency.sh DITTO [DITTO_OTHER ...] [-- ROUNDS=3 PAIRS=3000]
#
# DITTO_ARGS adds options to both ditto servers (`--durability nosync`: the SET's reply
# waits for no fsync, so the pair's latency is the WAIT's).
set -euo pipefail
dittos=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do dittos+=("$1"); shift; done
[ "${#dittos[@]}" -ge 1 ] || { echo "usage: $0 DITTO [DITTO ...] [-- ROUNDS PAIRS]" >&2; exit 2; }
[ $# -gt 0 ] && shift
rounds=${1:-3} pairs=${2:-3000}
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up() { for _ in $(seq 100); do redis-cli -p "$1" ping 2>/dev/null | grep -q PONG && return 0; sleep 0.1; done; echo "no server on $1" >&2; exit 1; }
measure() { # NAME PORT
    python3 - "$1" "$2" "$pairs" <<'EOF'
import json, socket, sys, time
name, port, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f = s.makefile("rb")
def pair(i):
    k = b"k%d" % (i % 1000)
    s.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$3\r\nabc\r\n*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$4\r\n1000\r\n" % (len(k), k))
    a, b = f.readline(), f.readline()
    assert a == b"+OK\r\n", a
    return b == b":1\r\n"
# The replica is connected once a WAIT says 1 (up to 30 tries of a second each).
assert any(pair(0) for _ in range(30)), "no replica acknowledged"
for i in range(300):  # warm-up
    assert pair(i)
lat = []
for i in range(pairs):
    t = time.perf_counter()
    ok = pair(i)
    assert ok, "a WAIT 1 1000 timed out"
    lat.append((time.perf_counter() - t) * 1e6)
lat.sort()
p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
mean = sum(lat) / len(lat)
print(f"{name:<28} p50 {p(0.5):8.1f} us   p99 {p(0.99):8.1f} us   mean {mean:8.1f} us")
print(json.dumps({"server": name, "pairs": pairs, "p50_us": round(p(0.5), 1), "p99_us": round(p(0.99), 1), "mean_us": round(mean, 1)}))
EOF
}
for r in $(seq "$rounds"); do
    echo "round $r"
    p=$(port) q=$(port)
    redis-server --port "$p" --dir "$work" --dbfilename p.rdb --appendonly no --save "" >/dev/null 2>&1 &
    pids+=("$!"); up "$p"
    redis-server --port "$q" --dir "$work" --dbfilename r.rdb --appendonly no --save "" --replicaof 127.0.0.1 "$p" >/dev/null 2>&1 &
    pids+=("$!"); up "$q"
    measure "redis+replica" "$p"
    kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
    i=0
    for d in "${dittos[@]}"; do
        i=$((i + 1))
        p=$(port) rp=$(port) b=$(port)
        rm -rf "$work/p" "$work/b"
        "$d" server --port "$p" --data-dir "$work/p" --repl-port "$rp" --metrics off ${DITTO_ARGS:-} >/dev/null 2>&1 &
        pids+=("$!"); up "$p"
        "$d" server --port "$b" --data-dir "$work/b" --replica-of "127.0.0.1:$rp" --metrics off ${DITTO_ARGS:-} >/dev/null 2>&1 &
        pids+=("$!"); up "$b"
        measure "ditto#$i+backup" "$p"
        kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
    done
done
