//! Differential test: ditto against a real Redis 7 (`redis-server`, installed by `.ci/deps`).
//!
//! The same seeded random command streams go to both servers, one command at a time, and
//! every reply must be the same value: the same type (simple string, error, integer, bulk,
//! array; RESP3's maps, sets, nulls and doubles after `HELLO 3`), the same bytes, the same
//! error text. The commands are the string and hash commands ditto implements, over a small
//! keyspace so that keys collide, change type and overflow, with wrong arities, bad
//! integers, option combinations and MULTI/EXEC blocks mixed in.
//!
//! What is compared as a set rather than a sequence, and why: HGETALL, HKEYS, HVALS and KEYS
//! (Redis answers in its hash table's order, ditto in key order; neither promises one).
//! Nothing else is excused: a difference is a bug in ditto, or goes into the list of
//! documented differences in docs/server.md and is left out of the generator here with the
//! reason (key expiry options, which ditto refuses).
//!
//! The replies are read by a small parser here, not `redis-protocol`'s decoders (the
//! server's oracle in resp.rs): the streams switch a connection between RESP2 and RESP3
//! with HELLO mid-stream, the crate has one decoder per version, and the comparison needs
//! RESP2's nil bulk and nil array kept apart and values that sort (HGETALL, KEYS).
//!
//! `DITTO_DIFF_SEED=N` runs one seed; on a difference the test prints the seed, the
//! protocol and the commands that led to it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A RESP2 or RESP3 reply, as both servers are compared on it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// RESP2's nil bulk and nil array, and RESP3's `_`.
    Nil,
    NilArray,
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Set(Vec<Value>),
    Double(String),
    Bool(bool),
    Verbatim(String, Vec<u8>),
}

impl Value {
    fn is_error(&self) -> bool {
        matches!(self, Value::Error(_))
    }

    /// The reply with the order removed where neither server promises one.
    fn unordered(self) -> Value {
        match self {
            Value::Array(mut v) => {
                v.sort();
                Value::Array(v)
            }
            Value::Set(mut v) => {
                v.sort();
                Value::Set(v)
            }
            Value::Map(mut v) => {
                v.sort();
                Value::Map(v)
            }
            other => other,
        }
    }

    /// HGETALL in RESP2 is a flat array of field, value: sorted as pairs.
    fn unordered_pairs(self) -> Value {
        match self {
            Value::Array(v) if v.len() % 2 == 0 => {
                let mut pairs: Vec<(Value, Value)> = Vec::new();
                let mut it = v.into_iter();
                while let (Some(a), Some(b)) = (it.next(), it.next()) {
                    pairs.push((a, b));
                }
                pairs.sort();
                Value::Array(pairs.into_iter().flat_map(|(a, b)| [a, b]).collect())
            }
            other => other.unordered(),
        }
    }
}

/// A blocking RESP client on any stream (TCP to ditto, a Unix socket to Redis).
struct Client<S: Read + Write> {
    w: S,
    r: BufReader<S>,
}

/// Another connection to the same server.
trait Another {
    fn another(&self) -> Self;
}

impl Another for Client<UnixStream> {
    fn another(&self) -> Self {
        let s = UnixStream::connect(self.w.peer_addr().unwrap().as_pathname().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client::new(s.try_clone().unwrap(), s)
    }
}

impl Another for Client<TcpStream> {
    fn another(&self) -> Self {
        let s = TcpStream::connect(self.w.peer_addr().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Client::new(s.try_clone().unwrap(), s)
    }
}

impl<S: Read + Write + Send> Client<S> {
    fn new(w: S, r: S) -> Self {
        Client { w, r: BufReader::new(r) }
    }

    fn cmd(&mut self, args: &[Vec<u8>]) -> Value {
        self.pipeline(std::slice::from_ref(&args.to_vec())).pop().expect("one reply")
    }

    /// Sends every request before reading any reply (from another thread, so that a server
    /// that stops reading while its replies wait cannot deadlock the test), then reads the
    /// replies.
    fn pipeline(&mut self, batch: &[Vec<Vec<u8>>]) -> Vec<Value> {
        let mut req = Vec::new();
        for args in batch {
            req.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in args {
                req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                req.extend_from_slice(a);
                req.extend_from_slice(b"\r\n");
            }
        }
        let (w, r) = (&mut self.w, &mut self.r);
        std::thread::scope(|scope| {
            let sender = scope.spawn(move || w.write_all(&req).expect("send"));
            let replies = batch.iter().map(|_| Self::read(r)).collect();
            sender.join().expect("the sender");
            replies
        })
    }

    fn line(r: &mut BufReader<S>) -> String {
        let mut line = Vec::new();
        let n = r.read_until(b'\n', &mut line).expect("read a reply");
        assert!(n >= 2 && line.ends_with(b"\r\n"), "reply line cut short: {line:?}");
        line.truncate(line.len() - 2);
        // A line naming a client's bytes that are not UTF-8 (an unknown command's name)
        // is kept byte for byte, escaped: both servers' lines compare as they came.
        String::from_utf8(line).unwrap_or_else(|e| e.as_bytes().escape_ascii().to_string())
    }

    fn bytes(r: &mut BufReader<S>, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n + 2];
        r.read_exact(&mut buf).expect("read a bulk");
        assert_eq!(&buf[n..], b"\r\n", "bulk not ended by CRLF");
        buf.truncate(n);
        buf
    }

    fn read(r: &mut BufReader<S>) -> Value {
        let line = Self::line(r);
        let (kind, rest) = line.split_at(1);
        let len = || rest.parse::<i64>().unwrap_or_else(|_| panic!("bad length in {line:?}"));
        match kind {
            "+" => Value::Simple(rest.into()),
            "-" => Value::Error(rest.into()),
            ":" => Value::Int(len()),
            "$" if len() < 0 => Value::Nil,
            "$" => Value::Bulk(Self::bytes(r, len() as usize)),
            "*" if len() < 0 => Value::NilArray,
            "*" => Value::Array((0..len()).map(|_| Self::read(r)).collect()),
            "~" => Value::Set((0..len()).map(|_| Self::read(r)).collect()),
            "%" => Value::Map((0..len()).map(|_| (Self::read(r), Self::read(r))).collect()),
            "_" => Value::Nil,
            "," => Value::Double(rest.into()),
            "#" => Value::Bool(rest == "t"),
            "=" => {
                let b = Self::bytes(r, len() as usize);
                Value::Verbatim(String::from_utf8_lossy(&b[..3]).into(), b[4..].to_vec())
            }
            _ => panic!("unknown reply type in {line:?}"),
        }
    }
}

/// Runs a SCAN iteration with `opts` from cursor 0 to its end (bounded in steps): the
/// keys it found, sorted, or the first reply that is not a SCAN page (an error).
fn scan_all<S: Read + Write + Send>(c: &mut Client<S>, opts: &[Vec<u8>]) -> Value {
    let mut cursor = b"0".to_vec();
    let mut found = Vec::new();
    for _ in 0..10_000 {
        let reply = c.cmd(&[[b"SCAN".to_vec(), cursor].as_slice(), opts].concat());
        let Value::Array(mut page) = reply else { return reply };
        assert_eq!(page.len(), 2, "a SCAN page is a cursor and the keys");
        let (Value::Array(keys), Value::Bulk(next)) = (page.pop().unwrap(), page.pop().unwrap()) else {
            panic!("a SCAN page is a cursor and the keys")
        };
        found.extend(keys);
        if next == b"0" {
            found.sort();
            found.dedup();
            return Value::Array(found);
        }
        cursor = next;
    }
    panic!("SCAN did not end in 10,000 calls");
}

struct Proc(Child);

impl Proc {
    /// Kills the process with SIGKILL and waits for it.
    fn sigkill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.sigkill();
    }
}

/// `redis-server` with no persistence, listening only on a Unix socket in `dir` (no port
/// to race for).
fn start_redis(dir: &Path) -> (Proc, Client<UnixStream>) {
    let sock = dir.join("redis.sock");
    let child = Command::new("redis-server")
        .args(["--port", "0", "--unixsocket", sock.to_str().unwrap(), "--save", "", "--appendonly", "no"])
        .args(["--dir", dir.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("redis-server is not installed ({e}): apt-get install redis-server (see .ci/deps)"));
    let p = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = UnixStream::connect(&sock) {
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let c = Client::new(s.try_clone().unwrap(), s);
            return (p, c);
        }
        assert!(Instant::now() < deadline, "redis-server did not listen on {sock:?} in 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ditto server` on a free loopback port, with data in `dir`.
fn start_ditto(dir: &Path) -> (Proc, Client<TcpStream>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["server", "--port", "0", "--metrics", "off", "--data-dir", dir.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ditto server");
    let out = child.stdout.take().unwrap();
    let p = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let port: u16 = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx.recv_timeout(left).expect("ditto did not report its address in 60 s");
        if let Some(rest) = line.strip_prefix("ditto server listening on ") {
            break rest.split(' ').next().unwrap().rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (p, Client::new(s.try_clone().unwrap(), s))
}

/// Draws commands over a small keyspace, so that keys collide and change type.
struct Gen {
    rng: StdRng,
    /// Whether the connection the next command goes to has a MULTI open.
    in_multi: bool,
}

// (The empty key too: Redis's glob matches it only with `*` and the empty pattern.)
const KEYS: &[&str] = &["a", "b", "c", "h1", "h2", "n", ""];
const FIELDS: &[&str] = &["f", "g", "x", "1"];

impl Gen {
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.rng.gen_range(0..from.len())]
    }

    fn key(&mut self) -> Vec<u8> {
        self.pick(KEYS).into()
    }

    fn field(&mut self) -> Vec<u8> {
        self.pick(FIELDS).into()
    }

    fn value(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..16) {
            0 => Vec::new(),
            1 => b"\x00\xff\r\n binary".to_vec(),
            2 => vec![b'v'; self.rng.gen_range(40..300)],
            3..=9 => self.int(),
            _ => self.pick(&["abc", "hello", "x", "3.5", "1e3", "0x10", " 1", "1 ", "+1", "01", "-0"]).into(),
        }
    }

    /// Integers, most in range, some at and past the i64 edges, some not integers at all.
    fn int(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..12) {
            0 => b"9223372036854775807".to_vec(),
            1 => b"-9223372036854775808".to_vec(),
            2 => b"9223372036854775808".to_vec(),
            3 => b"9223372036854775806".to_vec(),
            4 => b"-9223372036854775807".to_vec(),
            5 => self.pick(&["1.5", "abc", "", "-", "1a", "+5", "007"]).into(),
            _ => self.rng.gen_range(-20i64..20).to_string().into_bytes(),
        }
    }

    fn small(&mut self) -> Vec<u8> {
        self.rng.gen_range(-12i64..12).to_string().into_bytes()
    }

    fn keys(&mut self, min: usize) -> Vec<Vec<u8>> {
        let n = self.rng.gen_range(min..min + 3);
        (0..n).map(|_| self.key()).collect()
    }

    fn pairs(&mut self, field: bool) -> Vec<Vec<u8>> {
        let n = self.rng.gen_range(1..4);
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(if field { self.field() } else { self.key() });
            v.push(self.value());
        }
        v
    }

    fn next(&mut self) -> Vec<Vec<u8>> {
        let mut c = self.command();
        // Now and then a wrong arity: one argument too few or one too many. (Not one too
        // few for COMMAND: its answers with fewer arguments list the commands, which
        // differ by design.)
        if self.rng.gen_ratio(1, 25) {
            if self.rng.gen_bool(0.5) && c.len() > 1 && !c[0].eq_ignore_ascii_case(b"COMMAND") {
                c.pop();
            } else {
                c.push(b"extra".to_vec());
            }
        }
        c
    }

    fn command(&mut self) -> Vec<Vec<u8>> {
        let w = |s: &str| s.as_bytes().to_vec();
        let mut c: Vec<Vec<u8>>;
        match self.rng.gen_range(0..50) {
            0 | 1 => c = vec![w("GET"), self.key()],
            2..=4 => {
                c = vec![w("SET"), self.key(), self.value()];
                for opt in [["NX", "XX"], ["GET", "GET"], ["KEEPTTL", "KEEPTTL"]] {
                    if self.rng.gen_ratio(1, 3) {
                        c.push(w(opt[self.rng.gen_range(0..2)]));
                    }
                }
                // Now and then options in any order, repeated or clashing.
                if self.rng.gen_ratio(1, 6) {
                    let n = self.rng.gen_range(1..4);
                    for _ in 0..n {
                        c.push(w(self.pick(&["NX", "XX", "GET", "KEEPTTL", "nx", "Get", "BOGUS"])));
                    }
                }
            }
            5 => c = vec![w("GETSET"), self.key(), self.value()],
            6 => c = vec![w("SETNX"), self.key(), self.value()],
            7 => c = [vec![w("DEL")], self.keys(1)].concat(),
            8 => c = [vec![w("EXISTS")], self.keys(1)].concat(),
            9 => c = vec![w("TYPE"), self.key()],
            10 => c = vec![w(self.pick(&["INCR", "DECR"])), self.key()],
            11 | 12 => c = vec![w(self.pick(&["INCRBY", "DECRBY"])), self.key(), self.int()],
            13 => c = vec![w("APPEND"), self.key(), self.value()],
            14 => c = vec![w("STRLEN"), self.key()],
            15 => c = [vec![w("MGET")], self.keys(1)].concat(),
            16 => c = [vec![w("MSET")], self.pairs(false)].concat(),
            17 => c = [vec![w("MSETNX")], self.pairs(false)].concat(),
            18 | 19 => c = [vec![w("HSET"), self.key()], self.pairs(true)].concat(),
            20 => c = [vec![w("HMSET"), self.key()], self.pairs(true)].concat(),
            21 => c = vec![w("HGET"), self.key(), self.field()],
            22 => {
                let n = self.rng.gen_range(1..4);
                c = vec![w("HMGET"), self.key()];
                c.extend((0..n).map(|_| self.field()));
            }
            23 => {
                let n = self.rng.gen_range(1..3);
                c = vec![w("HDEL"), self.key()];
                c.extend((0..n).map(|_| self.field()));
            }
            24 => c = vec![w(self.pick(&["HGETALL", "HKEYS", "HVALS", "HLEN"])), self.key()],
            25 => c = vec![w("HINCRBY"), self.key(), self.field(), self.int()],
            26 => c = vec![w("HEXISTS"), self.key(), self.field()],
            27 => c = [vec![w("UNLINK")], self.keys(1)].concat(),
            28 => c = vec![w("GETDEL"), self.key()],
            29 => c = vec![w("GETRANGE"), self.key(), self.small(), self.small()],
            30 => {
                let off = self.rng.gen_range(-1i64..12).to_string().into_bytes();
                c = vec![w("SETRANGE"), self.key(), off, self.value()];
            }
            31 => c = vec![w("HSETNX"), self.key(), self.field(), self.value()],
            32 => c = vec![w("HSTRLEN"), self.key(), self.field()],
            33 => c = vec![w(self.pick(&["RENAME", "RENAMENX"])), self.key(), self.key()],
            34 => c = vec![w(self.pick(&["TTL", "PTTL"])), self.key()],
            35 => c = vec![w("ECHO"), self.value()],
            36 => c = [vec![w("PING")], if self.rng.gen_bool(0.5) { vec![self.value()] } else { vec![] }].concat(),
            37 => c = vec![w("DBSIZE")],
            38 => c = vec![w("KEYS"), w(self.pick(&["*", "h*", "?", "[ab]", "n", "[h-]*", "**", "", "*?*"]))],
            39 => {
                // Unknown commands, their names and arguments echoed as they came, bytes
                // that are not UTF-8 too.
                let name = match self.rng.gen_range(0..3) {
                    0 => w("NOSUCHCOMMAND"),
                    1 => w("get\u{e9}"),
                    _ => b"get\xe9".to_vec(),
                };
                c = vec![name, self.key()];
                if self.rng.gen_bool(0.3) {
                    c.push(b"\xff\xfe".to_vec());
                }
            }
            40 => {
                // MULTI, EXEC, DISCARD and WATCH, in and out of order.
                c = if self.in_multi {
                    vec![w(self.pick(&["EXEC", "EXEC", "DISCARD", "MULTI", "WATCH"])), self.key()]
                } else {
                    vec![w(self.pick(&["MULTI", "MULTI", "EXEC", "DISCARD", "UNWATCH"]))]
                };
                if c[0] != b"WATCH" {
                    c.truncate(1);
                }
            }
            41 => c = vec![w("WATCH"), self.key()],
            42 => {
                c = vec![w("SELECT"), self.pick(&["0", "0", "1", "16", "-1", "x", "2147483648", "-2147483649"]).into()]
            }
            43 => {
                // Long strings: SETRANGE far out, APPEND of a long value.
                c = match self.rng.gen_bool(0.5) {
                    true => vec![
                        w("SETRANGE"),
                        self.key(),
                        self.rng.gen_range(1_000..200_000).to_string().into_bytes(),
                        w("z"),
                    ],
                    false => vec![w("APPEND"), self.key(), vec![b'q'; self.rng.gen_range(1_000..70_000)]],
                };
            }
            44 => c = vec![w("SCAN")],
            45 => {
                // Connection commands with their errors (no password is configured).
                c = match self.rng.gen_range(0..9) {
                    0 => vec![w("AUTH"), w("secret")],
                    1 => vec![w("AUTH"), w("default"), w("secret")],
                    2 => vec![w("CLIENT"), w("SETNAME"), w(self.pick(&["conn", "a b", "", "x\ny"]))],
                    3 => vec![w("CLIENT"), w("GETNAME")],
                    // (No count above 0: with no replica it would wait for its timeout.)
                    4 => vec![w("WAIT"), w(self.pick(&["0", "-1", "x"])), w(self.pick(&["0", "1", "-1", "x"]))],
                    5 => match self.rng.gen_range(0..5) {
                        0 => vec![w("COMMAND"), w("COUNT"), w("x")],
                        1 => vec![w("COMMAND"), w("NOPE")],
                        2 => vec![w("COMMAND"), w("LIST"), w("x")],
                        3 => vec![w("COMMAND"), w("LIST"), w("FILTERBY"), w(self.pick(&["NOPE", "MODULE"])), w("m")],
                        _ => vec![w("COMMAND"), w("INFO"), w("nosuchcommand")],
                    },
                    _ => vec![w("HELLO"), w(self.pick(&["2", "3", "4", "x", "0"]))],
                };
            }
            46 if self.rng.gen_ratio(1, 100) => c = vec![w(self.pick(&["FLUSHDB", "FLUSHALL"]))],
            47 => c = vec![w("EXISTS"), self.key(), self.key(), self.key()],
            _ => c = vec![w("INCRBY"), self.key(), self.small()],
        }
        // Command names in any case.
        if self.rng.gen_ratio(1, 8) {
            c[0] = c[0].iter().map(|b| if self.rng.gen_bool(0.5) { b.to_ascii_lowercase() } else { *b }).collect();
        }
        c
    }

    /// A command of a pipeline: mostly a plain GET or SET (the runs ditto answers together),
    /// else any command but a bare SCAN (its iteration is not pipelined).
    fn pipelined(&mut self) -> Vec<Vec<u8>> {
        match self.rng.gen_range(0..10) {
            0..=3 => vec![b"GET".to_vec(), self.key()],
            4..=6 => vec![b"SET".to_vec(), self.key(), self.value()],
            _ => loop {
                let c = self.next();
                if !(c.len() == 1 && c[0].eq_ignore_ascii_case(b"SCAN")) {
                    break c;
                }
            },
        }
    }

    /// SCAN's options for a whole iteration (its cursors are the servers' own, so the
    /// test runs the iteration to the end on each and compares the keys found).
    fn scan_options(&mut self) -> Vec<Vec<u8>> {
        let mut o = Vec::new();
        if self.rng.gen_bool(0.5) {
            o.extend([b"MATCH".to_vec(), self.pick(&["*", "h*", "?", "[a-c]", "n*", "**"]).into()]);
        }
        if self.rng.gen_bool(0.5) {
            o.extend([b"COUNT".to_vec(), self.pick(&["1", "2", "5", "100"]).into()]);
        }
        if self.rng.gen_bool(0.3) {
            o.extend([b"TYPE".to_vec(), self.pick(&["string", "hash", "HASH", "list"]).into()]);
        }
        o
    }
}

/// The comparison key for `args`' reply: some replies are compared without their order.
fn normalize(args: &[Vec<u8>], v: Value, in_multi: bool) -> Value {
    let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    match (name.as_str(), v) {
        // Queued inside MULTI: the reply is +QUEUED, not the command's own.
        (_, v) if in_multi => v,
        ("HGETALL", v) => v.unordered_pairs(),
        // HELLO's map describes the server (name, version, id): only its type is compared.
        ("HELLO", Value::Map(_) | Value::Array(_)) => Value::Simple("(server description)".into()),
        ("HKEYS" | "HVALS" | "KEYS", v) => v.unordered(),
        (_, v) => v,
    }
}

/// EXEC's array holds each queued command's reply: normalized one by one.
fn normalize_exec(queued: &[Vec<Vec<u8>>], v: Value) -> Value {
    match v {
        Value::Array(items) if items.len() == queued.len() => {
            Value::Array(queued.iter().zip(items).map(|(a, v)| normalize(a, v, false)).collect())
        }
        other => other,
    }
}

fn show(args: &[Vec<u8>]) -> String {
    let one = |a: &Vec<u8>| match a.len() {
        0..=60 => format!("{:?}", String::from_utf8_lossy(a)),
        n => format!("{:?}...({n} bytes)", String::from_utf8_lossy(&a[..20])),
    };
    args.iter().map(one).collect::<Vec<_>>().join(" ")
}

/// Runs `count` commands of `seed` against both servers in `proto` (2 or 3); the number of
/// keys whose data was compared.
fn run_seed(seed: u64, proto: u8, count: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let (_redis, redis_first) = start_redis(dir.path());
    let ditto_dir = dir.path().join("ditto");
    let (p, ditto_first) = start_ditto(&ditto_dir);
    let mut ditto_proc = p;
    // Two connections to each: writes on one between the other's WATCH and EXEC must make
    // that EXEC fail on both servers.
    let ([mut redis, mut redis2], [mut ditto, mut ditto2]) =
        (connections(redis_first, proto), connections(ditto_first, proto));
    let mut gen = Gen { rng: StdRng::seed_from_u64(seed), in_multi: false };
    // Once, midway, ditto is killed with SIGKILL and restarted on its data: both servers'
    // connections start again (so no MULTI, WATCH or SELECT survives on either side), and
    // the data must be Redis's.
    let restart_at = gen.rng.gen_range(count / 4..count * 3 / 4);
    let mut restarted = false;
    // Keys compared at the restart and at the end.
    let mut keys = 0;
    let mut history: Vec<String> = Vec::new();
    // Per connection: the commands queued by its open MULTI, as both servers accepted them.
    let mut multi: [Option<Vec<Vec<Vec<u8>>>>; 2] = [None, None];
    let mut compared = 0usize;
    // With DITTO_DIFF_DUMP=FILE, every command sent, as `conn hex-arg hex-arg...` lines.
    let mut dump = std::env::var_os("DITTO_DIFF_DUMP").map(|f| std::fs::File::create(f).expect("create the dump"));
    while compared < count {
        if !restarted && compared >= restart_at {
            restarted = true;
            for (conn, open) in multi.iter_mut().enumerate() {
                if open.take().is_some() {
                    let discard = [b"DISCARD".to_vec()];
                    let (r, d) = match conn {
                        0 => (redis.cmd(&discard), ditto.cmd(&discard)),
                        _ => (redis2.cmd(&discard), ditto2.cmd(&discard)),
                    };
                    assert_eq!(r, d);
                }
            }
            ditto_proc.sigkill();
            let (p, first) = start_ditto(&ditto_dir);
            ditto_proc = p;
            [ditto, ditto2] = connections(first, proto);
            [redis, redis2] = connections(redis.another(), proto);
            history.push(format!("(ditto killed with SIGKILL and restarted after {compared} commands)"));
            keys += same_data(
                &mut redis,
                &mut ditto,
                proto,
                &format!("seed {seed}, RESP{proto}, after a SIGKILL and a restart"),
            );
        }
        let conn = usize::from(gen.rng.gen_ratio(1, 5));
        gen.in_multi = multi[conn].is_some();
        let (redis, ditto) = match conn {
            0 => (&mut redis, &mut ditto),
            _ => (&mut redis2, &mut ditto2),
        };
        // One command at a time, or now and then a pipeline: sent whole before any reply
        // is read, mostly plain GETs and SETs, which ditto answers together in one
        // transaction per run (`Session::handle_run`).
        let batch: Vec<Vec<Vec<u8>>> = match gen.rng.gen_ratio(1, 6) {
            false => vec![gen.next()],
            true => {
                let n = gen.rng.gen_range(2..40);
                (0..n).map(|_| gen.pipelined()).collect()
            }
        };
        let first = batch[0].clone();
        if batch.len() == 1 && first[0].eq_ignore_ascii_case(b"SCAN") && first.len() == 1 && !gen.in_multi {
            let opts = gen.scan_options();
            history.push(format!("[{conn}] a whole SCAN iteration with {}", show(&opts)));
            let (r, d) = (scan_all(redis, &opts), scan_all(ditto, &opts));
            if r != d {
                fail(seed, proto, &history, &r, &d);
            }
            compared += 1;
            continue;
        }
        for args in &batch {
            if let Some(f) = dump.as_mut() {
                let hex: Vec<String> = args.iter().map(|a| a.iter().map(|b| format!("{b:02x}")).collect()).collect();
                writeln!(f, "{conn} {}", hex.join(" ")).unwrap();
            }
        }
        let (rs, ds) = (redis.pipeline(&batch), ditto.pipeline(&batch));
        let piped = if batch.len() > 1 { " piped" } else { "" };
        for ((args, r), d) in batch.into_iter().zip(rs).zip(ds) {
            let in_multi = multi[conn].is_some();
            history.push(format!("[{conn}{}{piped}] {}", if in_multi { " multi" } else { "" }, show(&args)));
            let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
            let (r, d) = match &multi[conn] {
                Some(queued) if name == "EXEC" => (normalize_exec(queued, r), normalize_exec(queued, d)),
                _ => (normalize(&args, r, in_multi), normalize(&args, d, in_multi)),
            };
            if r != d {
                fail(seed, proto, &history, &r, &d);
            }
            compared += 1;
            if let Some(last) = history.last_mut() {
                let shown = format!("{r:?}");
                last.push_str(&format!("  -> {}", &shown[..shown.len().min(60)]));
            }
            // Follow the connection's MULTI state from the reply both servers gave.
            let ended = match (name.as_str(), &r) {
                ("EXEC", Value::Array(_) | Value::NilArray | Value::Nil) => true,
                ("EXEC", Value::Error(e)) => e.starts_with("EXECABORT"),
                ("DISCARD", Value::Simple(_)) => true,
                _ => false,
            };
            match (&mut multi[conn], &r) {
                (None, Value::Simple(ok)) if name == "MULTI" && ok == "OK" => multi[conn] = Some(Vec::new()),
                (Some(_), _) if ended => multi[conn] = None,
                (Some(queued), Value::Simple(q)) if q == "QUEUED" => queued.push(args.clone()),
                _ => {}
            }
        }
    }
    assert!(compared >= count);
    if multi[0].is_some() {
        let discard = [b"DISCARD".to_vec()];
        assert_eq!(redis.cmd(&discard), ditto.cmd(&discard));
    }
    keys += same_data(&mut redis, &mut ditto, proto, &format!("seed {seed}, RESP{proto}, at the end"));
    // Every reply was read, so every write was acknowledged, hence durable: after a SIGKILL
    // and a restart, ditto holds what Redis holds.
    ditto_proc.sigkill();
    let (_ditto_proc, first) = start_ditto(&ditto_dir);
    let [mut ditto, _] = connections(first, proto);
    same_data(
        &mut redis,
        &mut ditto,
        proto,
        &format!("seed {seed}, RESP{proto}, after a SIGKILL and a restart at the end"),
    );
    keys
}

/// Two connections to a server, the first given, in `proto`.
fn connections<S: Read + Write + Send>(first: Client<S>, proto: u8) -> [Client<S>; 2]
where
    Client<S>: Another,
{
    let second = first.another();
    let mut both = [first, second];
    if proto == 3 {
        for c in &mut both {
            let hello = vec![b"HELLO".to_vec(), b"3".to_vec()];
            assert!(matches!(c.cmd(&hello), Value::Map(_)));
        }
    }
    both
}

/// Compares the data of both servers in the databases the streams reach: the keys, and
/// each key's type and value. Leaves both connections in database 0; the number of keys.
fn same_data<A: Read + Write + Send, B: Read + Write + Send>(
    redis: &mut Client<A>,
    ditto: &mut Client<B>,
    proto: u8,
    when: &str,
) -> usize {
    let w = |s: &str| s.as_bytes().to_vec();
    // The stream may have switched protocols (HELLO): back to the run's.
    let hello = [w("HELLO"), proto.to_string().into_bytes()];
    assert_eq!((redis.cmd(&hello).is_error(), ditto.cmd(&hello).is_error()), (false, false));
    let mut keys_seen = 0;
    for db in ["1", "0"] {
        let select = [w("SELECT"), w(db)];
        assert_eq!((redis.cmd(&select), ditto.cmd(&select)), (Value::Simple("OK".into()), Value::Simple("OK".into())));
        let all = [w("KEYS"), w("*")];
        let (rk, dk) = (redis.cmd(&all).unordered(), ditto.cmd(&all).unordered());
        assert_eq!(rk, dk, "{when}: the keys in db {db} differ");
        let Value::Array(keys) = rk else { panic!("KEYS answered {rk:?}") };
        for k in keys {
            let Value::Bulk(k) = k else { panic!("a key is {k:?}") };
            keys_seen += 1;
            let ty = [w("TYPE"), k.clone()];
            let t = redis.cmd(&ty);
            assert_eq!(t, ditto.cmd(&ty), "{when}: TYPE {k:?}");
            let read = match &t {
                Value::Simple(t) if t == "hash" => vec![w("HGETALL"), k.clone()],
                _ => vec![w("GET"), k.clone()],
            };
            let (rv, dv) = (normalize(&read, redis.cmd(&read), false), normalize(&read, ditto.cmd(&read), false));
            assert_eq!(rv, dv, "{when}: the value of {k:?} in db {db} differs");
        }
    }
    keys_seen
}

fn fail(seed: u64, proto: u8, history: &[String], r: &Value, d: &Value) -> ! {
    let show = std::env::var("DITTO_DIFF_SHOW").ok().and_then(|n| n.parse().ok()).unwrap_or(30);
    let from = history.len().saturating_sub(show);
    panic!(
        "seed {seed}, RESP{proto}, command {}: replies differ\n  redis: {r:?}\n  ditto: {d:?}\nlast commands:\n  {}",
        history.len(),
        history[from..].join("\n  ")
    );
}

fn seeds() -> Vec<u64> {
    match std::env::var("DITTO_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("DITTO_DIFF_SEED is a number")],
        Err(_) => (1..=6).collect(),
    }
}

#[test]
fn replies_match_redis_over_resp2() {
    let keys: usize = seeds().into_iter().map(|seed| run_seed(seed, 2, 2_000)).sum();
    assert!(keys > 0, "no data was left to compare");
}

#[test]
fn replies_match_redis_over_resp3() {
    let keys: usize = seeds().into_iter().map(|seed| run_seed(seed + 1_000, 3, 2_000)).sum();
    assert!(keys > 0, "no data was left to compare");
}
