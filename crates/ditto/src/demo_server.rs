//! The second half of `ditto demo`: the Redis-protocol server as a real process, real
//! clients over TCP, a SIGKILL under write load, a restart, and checks.
//!
//! ```text
//!  demo (parent)                                ditto server (child process)
//!  clients (threads, RESP over TCP) ---------->  INCR demo:counter:<i>        (each reply
//!                                    ---------->  MULTI DECRBY a / INCRBY b    = fsynced)
//!                                                 EXEC (a transfer)
//!  SIGKILL under load ------------------------> X
//!  restart on the same data dir, time to PONG
//!  check: every counter >= its last acknowledged value (<= one more: a write can be
//!         durable before its reply is lost), accounts still sum to their total
//! ```
//!
//! The clients are a minimal RESP client here, so the demo needs nothing installed; the
//! test suite drives the server with redis-cli, redis-py and redis-benchmark.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

pub(crate) const ACCOUNTS: u64 = 10;
pub(crate) const BALANCE: i64 = 1000;

/// A RESP reply, as much of it as the demo reads.
#[derive(Debug, PartialEq)]
pub(crate) enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// The longest reply line `Client` reads, the longest string and the longest array.
const REPLY_LINE_MAX: u64 = 64 << 10;
const REPLY_BULK_MAX: i64 = 512 << 20;
const REPLY_ARRAY_MAX: i64 = 1 << 24;

pub(crate) struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Client {
    fn connect(port: u16) -> Result<Client, Error> {
        Client::connect_to("127.0.0.1", port)
    }

    pub(crate) fn connect_to(host: &str, port: u16) -> Result<Client, Error> {
        use std::net::ToSocketAddrs;
        // Each address in turn, 5 s each (a host that drops the SYN held `ditto status`
        // for the kernel's connect timeout, about two minutes).
        let mut last = None;
        let mut s = None;
        for addr in (host, port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                Ok(c) => {
                    s = Some(c);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let s = match (s, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => return Err(format!("{host}: no address").into()),
        };
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Client { r: BufReader::new(s.try_clone()?), w: s })
    }

    fn send(&mut self, cmds: &[&[&str]]) -> std::io::Result<()> {
        let mut buf = Vec::new();
        for args in cmds {
            buf.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in *args {
                buf.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
            }
        }
        self.w.write_all(&buf)
    }

    fn read(&mut self) -> Result<Reply, Error> {
        self.read_nested(0)
    }

    /// A reply inside `depth` arrays (at most 32: a deeper nesting would run the stack out).
    fn read_nested(&mut self, depth: usize) -> Result<Reply, Error> {
        if depth > 32 {
            return Err("a reply nested more than 32 arrays deep".into());
        }
        let mut line = String::new();
        // A reply's line, its bulk and its array are bounded (`REPLY_LINE_MAX`,
        // `REPLY_BULK_MAX`, `REPLY_ARRAY_MAX`): a peer's `$999999999999999` aborted the
        // process allocating it (found by a review, 2026-12-06).
        if (&mut self.r).take(REPLY_LINE_MAX).read_line(&mut line)? == 0 {
            return Err("connection closed".into());
        }
        if !line.ends_with('\n') {
            return Err(format!("a reply line over {REPLY_LINE_MAX} bytes").into());
        }
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(1.min(line.len()));
        Ok(match kind {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(rest.parse()?),
            "$" => match rest.parse::<i64>()? {
                n if n < 0 => Reply::Bulk(None),
                n if n > REPLY_BULK_MAX => {
                    return Err(format!("a reply's string of {n} bytes, over {REPLY_BULK_MAX}").into())
                }
                n => {
                    let mut b = vec![0; n as usize + 2];
                    self.r.read_exact(&mut b)?;
                    b.truncate(n as usize);
                    Reply::Bulk(Some(b))
                }
            },
            "*" => match rest.parse::<i64>()? {
                n if n < 0 => Reply::Array(None),
                n if n > REPLY_ARRAY_MAX => {
                    return Err(format!("a reply's array of {n} elements, over {REPLY_ARRAY_MAX}").into())
                }
                n => Reply::Array(Some((0..n).map(|_| self.read_nested(depth + 1)).collect::<Result<_, _>>()?)),
            },
            _ => return Err(format!("unexpected reply line {line:?}").into()),
        })
    }

    /// `AUTH password`, where one is given: an error that says why if refused.
    pub(crate) fn auth(&mut self, password: Option<&str>) -> Result<(), Error> {
        let Some(p) = password else { return Ok(()) };
        match self.call(&["AUTH", p])? {
            Reply::Simple(_) => Ok(()),
            other => Err(format!("AUTH: {other:?}").into()),
        }
    }

    /// How long a reply may take before the call fails (30 s from `connect_to`).
    pub(crate) fn set_read_timeout(&mut self, d: Duration) -> std::io::Result<()> {
        self.w.set_read_timeout(Some(d))
    }

    /// Sends `cmds` at once (a pipeline), then reads their replies.
    pub(crate) fn pipeline(&mut self, cmds: &[&[&str]]) -> Result<Vec<Reply>, Error> {
        self.send(cmds)?;
        cmds.iter().map(|_| self.read()).collect()
    }

    pub(crate) fn call(&mut self, args: &[&str]) -> Result<Reply, Error> {
        self.send(&[args])?;
        self.read()
    }

    pub(crate) fn int(&mut self, args: &[&str]) -> Result<i64, Error> {
        match self.call(args)? {
            Reply::Int(n) => Ok(n),
            Reply::Bulk(Some(b)) => Ok(String::from_utf8(b)?.parse()?),
            Reply::Bulk(None) => Ok(0),
            other => Err(format!("{args:?}: {other:?}").into()),
        }
    }
}

/// A server child process (ditto's or Redis's), killed when dropped, with its backup (or
/// replica) process if it has one, killed first.
pub(crate) struct ServerProcess {
    pub child: Child,
    pub port: u16,
    /// A ditto primary's replication address (with `--repl-port`).
    pub repl: Option<String>,
    pub backup: Option<Box<ServerProcess>>,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.backup.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `ditto server` (this executable, or `exe`) on `dir` on a free loopback port
/// (metrics off, `args` added, its stderr to `stderr`) and waits until it listens (and,
/// with `--repl-port`, accepts backups). Shared by the demo and `ditto bench redis`.
pub(crate) fn start_ditto_server(
    exe: Option<&Path>,
    dir: &Path,
    args: &[&str],
    stderr: Stdio,
) -> Result<ServerProcess, Error> {
    let exe = match exe {
        Some(e) => e.to_path_buf(),
        None => std::env::current_exe()?,
    };
    let mut child = Command::new(exe)
        .args(["server", "--port", "0", "--data-dir", dir.to_str().ok_or("data dir is not UTF-8")?])
        .args(["--metrics", "off"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    // The server prints its address once it serves; recovery comes before that.
    let line = lines.next().ok_or("the server exited before listening")??;
    let addr = line.strip_prefix("ditto server listening on ").ok_or(format!("unexpected line {line:?}"))?;
    let port = addr.split(' ').next().and_then(|a| a.rsplit(':').next()).ok_or("no port")?.parse()?;
    let repl = if args.contains(&"--repl-port") {
        let line = lines.next().ok_or("the server exited before accepting backups")??;
        let a = line.strip_prefix("ditto server accepting backups on ").ok_or(format!("unexpected line {line:?}"))?;
        Some(a.trim().to_string())
    } else {
        None
    };
    Ok(ServerProcess { child, port, repl, backup: None })
}

fn start_server(dir: &Path, workers: usize) -> Result<ServerProcess, Error> {
    start_ditto_server(None, dir, &["--workers", &workers.to_string()], Stdio::null())
}

/// What one client thread saw.
#[derive(Default)]
pub(crate) struct ClientLog {
    pub counter_acked: i64,
    pub transfers: u64,
    pub ops: u64,
    pub latencies_us: Vec<u32>,
}

pub(crate) fn client_loop(port: u16, i: usize, stop: &AtomicBool) -> ClientLog {
    let mut log = ClientLog::default();
    let Ok(mut c) = Client::connect(port) else { return log };
    let counter = format!("demo:counter:{i}");
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let t = Instant::now();
        let ok = if n.is_multiple_of(4) {
            // A transfer between two accounts: one MULTI/EXEC transaction.
            let (a, b) =
                (format!("demo:acct:{}", n % ACCOUNTS), format!("demo:acct:{}", (n * 7 + i as u64) % ACCOUNTS));
            let amt = (n % 50).to_string();
            let sent = c.send(&[&["MULTI"], &["DECRBY", &a, &amt], &["INCRBY", &b, &amt], &["EXEC"]]);
            let replies: Result<Vec<Reply>, Error> =
                sent.map_err(Error::from).and_then(|_| (0..4).map(|_| c.read()).collect());
            match replies {
                Ok(r) if matches!(r.last(), Some(Reply::Array(Some(_)))) => {
                    log.transfers += 1;
                    true
                }
                _ => false,
            }
        } else {
            match c.call(&["INCR", &counter]) {
                Ok(Reply::Int(v)) => {
                    log.counter_acked = v;
                    true
                }
                _ => false,
            }
        };
        if !ok {
            break; // the server is gone (killed): stop, keeping what was acknowledged
        }
        log.ops += 1;
        log.latencies_us.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
    }
    log
}

pub struct ServerDemo {
    pub clients: usize,
    pub ops: u64,
    pub seconds: f64,
    pub p50_us: u32,
    pub p99_us: u32,
    pub transfers: u64,
    pub back_up_s: f64,
    pub counters_checked: usize,
    pub counters_ahead: usize,
    pub dbsize: i64,
}

/// Runs the server part; `dir` is an empty data directory.
pub fn run(dir: &Path, workers: usize, clients: usize, seconds: f64) -> Result<ServerDemo, Error> {
    println!("\n== the Redis-protocol server: {clients} clients over TCP, then SIGKILL under load");
    let mut srv = start_server(dir, workers)?;
    let mut setup = Client::connect(srv.port)?;
    for k in 0..ACCOUNTS {
        let key = format!("demo:acct:{k}");
        if setup.call(&["SET", &key, &BALANCE.to_string()])? != Reply::Simple("OK".into()) {
            return Err("SET of an account failed".into());
        }
    }
    drop(setup);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let port = srv.port;
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || client_loop(port, i, &stop))
        })
        .collect();
    while started.elapsed().as_secs_f64() < seconds {
        std::thread::sleep(Duration::from_millis(200));
    }
    // SIGKILL while the clients are still writing.
    srv.child.kill()?;
    srv.child.wait()?;
    let killed = Instant::now();
    let ran = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let logs: Vec<ClientLog> = handles.into_iter().map(|h| h.join().expect("client thread")).collect();
    drop(srv);
    println!("killed the server with SIGKILL after {ran:.1} s under load; restarting on the same data directory");

    let srv = start_server(dir, workers)?;
    let mut c = Client::connect(srv.port)?;
    if c.call(&["PING"])? != Reply::Simple("PONG".into()) {
        return Err("no PONG after restart".into());
    }
    let back_up_s = killed.elapsed().as_secs_f64();
    let mut ahead = 0;
    for (i, log) in logs.iter().enumerate() {
        let now = c.int(&["GET", &format!("demo:counter:{i}")])?;
        if now < log.counter_acked {
            return Err(format!(
                "LOST ACKNOWLEDGED WRITES: demo:counter:{i} is {now} after restart, {} was acknowledged",
                log.counter_acked
            )
            .into());
        }
        if now > log.counter_acked + 1 {
            return Err(format!(
                "demo:counter:{i} is {now}, more than one past its acknowledged {} (one request was in flight)",
                log.counter_acked
            )
            .into());
        }
        ahead += usize::from(now > log.counter_acked);
    }
    let mut sum = 0;
    for k in 0..ACCOUNTS {
        sum += c.int(&["GET", &format!("demo:acct:{k}")])?;
    }
    if sum != BALANCE * ACCOUNTS as i64 {
        return Err(format!(
            "accounts sum to {sum} after restart, not {}: a transfer was torn",
            BALANCE * ACCOUNTS as i64
        )
        .into());
    }
    let dbsize = c.int(&["DBSIZE"])?;
    let mut lat: Vec<u32> = logs.iter().flat_map(|l| l.latencies_us.iter().copied()).collect();
    lat.sort_unstable();
    let pct =
        |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0);
    // (Its "OK" says the transfers kept the sum: with none, nothing was checked.)
    if logs.iter().all(|l| l.transfers == 0) {
        return Err("no MULTI/EXEC transfer was acknowledged".into());
    }
    Ok(ServerDemo {
        clients,
        ops: logs.iter().map(|l| l.ops).sum(),
        seconds: ran,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        transfers: logs.iter().map(|l| l.transfers).sum(),
        back_up_s,
        counters_checked: logs.len(),
        counters_ahead: ahead,
        dbsize,
    })
}

impl ServerDemo {
    pub fn print(&self) {
        println!("Redis-protocol server (a separate process; replies only once fsynced, every-batch)");
        println!(
            "  {} clients         {:>10.0} acknowledged commands/s over {:.1} s (INCR, and MULTI/EXEC transfers)",
            self.clients,
            self.ops as f64 / self.seconds.max(1e-9),
            self.seconds
        );
        println!(
            "  latency to reply    p50 {} us, p99 {} us (each reply waits for its fsync)",
            self.p50_us, self.p99_us
        );
        println!("crash: SIGKILL under load; back up and answering PING {:.2} s after the kill", self.back_up_s);
        println!(
            "checks:   every acknowledged INCR present ({} counters; {} one ahead: durable, reply lost in the crash)  OK",
            self.counters_checked, self.counters_ahead
        );
        println!(
            "          {} MULTI/EXEC transfers acknowledged, accounts still sum to {}  OK",
            self.transfers,
            BALANCE * ACCOUNTS as i64
        );
        println!("          {} keys after the restart (DBSIZE)", self.dbsize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_including_nested_arrays() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"+OK\r\n-ERR no\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n*1\r\n+x\r\n*-1\r\n").unwrap();
        });
        let mut c = Client::connect(port).unwrap();
        t.join().unwrap();
        assert_eq!(c.read().unwrap(), Reply::Simple("OK".into()));
        assert_eq!(c.read().unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(c.read().unwrap(), Reply::Int(42));
        assert_eq!(c.read().unwrap(), Reply::Bulk(Some(b"abc".to_vec())));
        assert_eq!(c.read().unwrap(), Reply::Bulk(None));
        assert_eq!(
            c.read().unwrap(),
            Reply::Array(Some(vec![Reply::Int(1), Reply::Array(Some(vec![Reply::Simple("x".into())]))]))
        );
        assert_eq!(c.read().unwrap(), Reply::Array(None));
        assert!(c.read().is_err(), "closed");
    }

    /// A reply past what the client takes is an error, not an abort or a stack overflow:
    /// a string of 10^15 bytes, an array of 2^40 elements, a line with no end, arrays
    /// nested 100,000 deep (each answer on a connection of its own).
    #[test]
    fn replies_past_the_bounds_are_errors_not_aborts() {
        let nested = b"*1\r\n".repeat(100_000);
        let line = vec![b'+'; 100 << 10];
        let answers: Vec<Vec<u8>> =
            vec![b"$999999999999999\r\n".to_vec(), b"*1099511627776\r\n".to_vec(), line, nested];
        for (i, a) in answers.into_iter().enumerate() {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let t = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let _ = s.write_all(&a);
                s
            });
            let mut c = Client::connect(port).unwrap();
            let e = c.read().map(|_| ()).unwrap_err().to_string();
            assert!(e.contains("over") || e.contains("deep"), "answer {i}: {e}");
            drop(t.join().unwrap());
        }
    }
}
