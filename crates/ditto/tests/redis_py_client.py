"""redis-py against a running ditto server: usage redis_py_client.py PORT PASSWORD.

Run by crates/ditto/tests/server.rs. Prints ALL OK and exits 0 when every check holds;
an assertion error otherwise."""
import sys
import threading

import redis

port, password = int(sys.argv[1]), sys.argv[2]


def client(**kw):
    return redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=20, **kw)


# Auth: no password and a wrong one are refused, the right one works.
try:
    redis.Redis(host="127.0.0.1", port=port, socket_timeout=20).get("x")
    raise AssertionError("a command without AUTH succeeded")
except redis.AuthenticationError:
    pass
try:
    redis.Redis(host="127.0.0.1", port=port, password="wrong", socket_timeout=20).ping()
    raise AssertionError("a wrong password was accepted")
except redis.AuthenticationError:
    pass
r = client()
assert r.ping()

# Strings, integers, hashes.
assert r.set("s", "v") is True
assert r.set("s", "w", nx=True) is None
assert r.set("s", "w", xx=True, get=True) == b"v"
assert r.getset("s", "x") == b"w"
assert r.setnx("s", "y") is False and r.setnx("fresh", "y") is True
assert r.incr("n") == 1 and r.incrby("n", 10) == 11 and r.decr("n") == 10 and r.decrby("n", 5) == 5
assert r.strlen("s") == 1 and r.append("s", "yz") == 3
assert r.mset({"m1": "1", "m2": "2"}) and r.mget("m1", "m2", "none") == [b"1", b"2", None]
assert r.msetnx({"m1": "9", "m3": "3"}) is False and r.get("m3") is None
assert r.hset("h", mapping={"a": "1", "b": "2"}) == 2
assert r.hget("h", "a") == b"1" and r.hmget("h", "a", "zz") == [b"1", None]
assert r.hincrby("h", "a", 5) == 6 and r.hexists("h", "a") and r.hlen("h") == 2
assert r.hgetall("h") == {b"a": b"6", b"b": b"2"}
assert r.hdel("h", "a", "zz") == 1 and r.hlen("h") == 1
# MGET over more keys than one batched read (16): present, missing and a hash (nil).
assert r.mset({f"mg{i}": str(i * i) for i in range(0, 40, 2)})
names = [f"mg{i}" for i in range(40)] + ["h", "mg4"]
assert r.mget(names) == [str(i * i).encode() if i % 2 == 0 else None for i in range(40)] + [None, b"16"]
try:
    r.get("h")
    raise AssertionError("GET on a hash succeeded")
except redis.ResponseError as e:
    assert str(e).startswith("WRONGTYPE"), e
assert r.exists("s", "h", "nope") == 2 and r.delete("s", "nope") == 1
assert r.type("h") == b"hash"

# SELECT isolates databases.
r1 = client(db=1)
r1.set("only-in-1", "x")
assert r.get("only-in-1") is None and r1.dbsize() == 1

# SCAN with MATCH and COUNT through scan_iter visits every key once.
for i in range(300):
    r.set(f"scan:{i}", i)
keys = list(r.scan_iter(match="scan:*", count=17))
assert len(keys) == 300 and len(set(keys)) == 300, len(keys)

# Pipelines, with and without a transaction.
p = r.pipeline(transaction=False)
for i in range(500):
    p.set(f"p:{i}", i)
    p.get(f"p:{i}")
out = p.execute()
assert out[1::2] == [str(i).encode() for i in range(500)]
p = r.pipeline(transaction=True)
p.incr("tx").incr("tx").get("tx")
assert p.execute() == [1, 2, b"2"]

# MULTI/EXEC with WATCH: two clients race to increment one counter with check-and-set;
# every successful EXEC counts exactly once.
r.set("cas", 0)
N = 150
wins = [0, 0]
retries = [0, 0]


def racer(idx):
    c = client()
    while wins[idx] < N:
        with c.pipeline() as p:
            try:
                p.watch("cas")
                v = int(p.get("cas"))
                p.multi()
                p.set("cas", v + 1)
                p.execute()
                wins[idx] += 1
            except redis.WatchError:
                retries[idx] += 1


threads = [threading.Thread(target=racer, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert int(r.get("cas")) == 2 * N, (r.get("cas"), wins, retries)
print("watch retries:", retries)

# A WATCHed key changed by another client: EXEC answers nil (WatchError in redis-py).
other = client()
with r.pipeline() as p:
    p.watch("w")
    other.set("w", "changed")
    p.multi()
    p.set("w", "mine")
    try:
        p.execute()
        raise AssertionError("EXEC succeeded although the watched key changed")
    except redis.WatchError:
        pass
assert r.get("w") == b"changed"

# EXECABORT after a refused command inside MULTI.
raw = client()
conn = raw.connection_pool.get_connection("MULTI")
conn.send_command("MULTI")
assert conn.read_response() == b"OK"
conn.send_command("SET", "ea", "1")
assert conn.read_response() == b"QUEUED"
conn.send_command("GET")
try:
    conn.read_response()
    raise AssertionError("GET with no key was queued")
except redis.ResponseError:
    pass
conn.send_command("EXEC")
try:
    conn.read_response()
    raise AssertionError("EXEC ran after a refused command")
except redis.ResponseError as e:
    assert str(e).startswith("Transaction discarded"), e
raw.connection_pool.release(conn)
assert r.get("ea") is None

# RESP3: maps come back as dicts through HELLO 3.
r3 = client(protocol=3)
assert r3.hgetall("h") == {b"b": b"2"}
assert r3.get("missing") is None
assert r3.execute_command("HELLO", "3")[b"proto"] == 3
# INFO under RESP3 is a verbatim string, as Redis 7's: redis-py parses it the same.
assert r3.info("replication")["role"] == "master"

# Commit timestamps: a write's timestamp is readable and grows; a node can be asked to
# wait for one.
r.set("t1", "a")
t1 = r.execute_command("DITTO.LASTCOMMIT")
r.set("t2", "b")
t2 = r.execute_command("DITTO.LASTCOMMIT")
assert 0 < t1 < t2, (t1, t2)
assert r.execute_command("DITTO.WAITTS", t2) == b"OK"
try:
    r.execute_command("DITTO.WAITTS", t2 + 10**12)
    raise AssertionError("a timestamp from the future was accepted")
except redis.ResponseError:
    pass

# CLIENT, INFO, COMMAND.
assert r.client_setname("tester") and r.client_getname() == "tester" or r.client_getname() == b"tester"
assert isinstance(r.client_id(), int)
info = r.info()
assert info["role"] == "master" and info["connected_slaves"] == 0
assert r.command_count() > 30
assert "get" in r.command()
assert r.info("replication")["role"] == "master"

# Commands beyond the list that applications commonly use (docs/server.md).
r.set("range", "Hello,World")
assert r.getrange("range", 0, 4) == b"Hello" and r.getrange("range", -5, -1) == b"World"
assert r.setrange("range", 6, "Redis") == 11 and r.get("range") == b"Hello,Redis"
assert r.getdel("range") == b"Hello,Redis" and r.get("range") is None
assert r.hsetnx("hx", "f", "1") == 1 and r.hsetnx("hx", "f", "2") == 0
assert r.hkeys("hx") == [b"f"] and r.hvals("hx") == [b"1"] and r.hstrlen("hx", "f") == 1
assert r.ttl("hx") == -1 and r.pttl("hx") == -1 and r.ttl("no-such-key") == -2
assert r.rename("hx", "hy") and r.hgetall("hy") == {b"f": b"1"} and not r.exists("hx")
r.set("rn", "v")
assert r.renamenx("rn", "hy") is False and r.renamenx("rn", "rn2") is True
assert r.unlink("rn2", "no-such-key") == 1
assert sorted(r.keys("scan:1?")) == sorted(f"scan:{i}".encode() for i in range(10, 20))
assert r1.dbsize() == 1
assert r.flushdb() and r.dbsize() == 0 and r.keys("*") == []
assert r1.dbsize() == 1, "FLUSHDB leaves the other databases"
assert r.flushall() and r1.dbsize() == 0
print("ALL OK")
