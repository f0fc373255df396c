# Sourced by the scripts that start a ditto primary and backup by hand: a fresh directory
# D, three free ports on 127.0.0.1 (P the primary's client port, R its replication port,
# Q the backup's), and a cleanup on exit that kills the two servers ($pp, $bp, set by
# the script) and removes D.
D=$(mktemp -d)
read -r P R Q < <(python3 -c 'import socket
ss=[socket.socket() for _ in range(3)]
[s.bind(("127.0.0.1",0)) for s in ss]
print(*[s.getsockname()[1] for s in ss])')
pp=; bp=
cleanup() { kill -9 $pp $bp 2>/dev/null; wait 2>/dev/null; rm -rf $D; }
trap cleanup EXIT
