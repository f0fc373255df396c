"""redis-py's Sentinel support following a ditto cluster through failovers, unchanged.

usage: redis_py_sentinel.py PORT,PORT,PORT N

Every node answers SENTINEL for the service "ditto" with the primary it knows. Writes
k0..k(N-1) one at a time through `Sentinel(...).master_for("ditto")`, retrying a write
until it is acknowledged (a failover shows up as refused connections, READONLY, or no
primary found for a moment); prints "acked I" for each, flushed, and "done" at the end.
"""
import sys
import time

import redis
from redis.sentinel import Sentinel, MasterNotFoundError

ports = [int(p) for p in sys.argv[1].split(",")]
n = int(sys.argv[2])
sentinel = Sentinel([("127.0.0.1", p) for p in ports], socket_timeout=0.5)
master = sentinel.master_for("ditto", socket_timeout=2, retry_on_timeout=False)
deadline = time.monotonic() + 120
for i in range(n):
    while True:
        if time.monotonic() > deadline:
            print(f"gave up at k{i}", flush=True)
            sys.exit(1)
        try:
            assert master.set(f"k{i}", str(i)) is True
            break
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError, MasterNotFoundError):
            time.sleep(0.01)
    print(f"acked {i}", flush=True)
host, port = sentinel.discover_master("ditto")
print(f"done; primary at {host}:{port}", flush=True)
