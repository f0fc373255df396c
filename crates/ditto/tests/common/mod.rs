//! What the real-process replication tests share: a `ditto server` child process (killed
//! when dropped) and a minimal RESP client.
#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port free now, from 20000 to 31999, below Linux's ephemeral range (32768 and up):
/// for a server restarted on the port it had (a primary's replication port, which its
/// backups name). A port the kernel handed out (`--repl-port 0`) is in that range, and
/// once its server stops any outgoing connection may take it as its local end before the
/// restart binds it again (seen in CI, 2026-12-06: "binding the replication port ...:
/// Address already in use", another test's connection on it).
pub fn port_below_the_ephemeral_range() -> u16 {
    // (The listener is let go on return: the port is free for the server.)
    ports::listener_below_the_ephemeral_range().local_addr().unwrap().port()
}

#[path = "../../../replication/tests/common/ports.rs"]
mod ports;

pub struct Node {
    pub child: Child,
    pub port: u16,
    pub repl: Option<String>,
}

impl Node {
    pub fn start(dir: &Path, extra: &[&str]) -> Node {
        Node::start_logged(dir, extra, None)
    }

    /// As `start`, with the server's log (stderr) going to `log` if given.
    pub fn start_logged(dir: &Path, extra: &[&str], log: Option<&Path>) -> Node {
        Node::start_with_env(dir, extra, log, &[])
    }

    /// `start_logged` with environment variables set for the server (`DITTO_FAILPOINTS`).
    pub fn start_with_env(dir: &Path, extra: &[&str], log: Option<&Path>, env: &[(&str, &str)]) -> Node {
        let stderr = match log {
            Some(p) => Stdio::from(std::fs::File::create(p).expect("create the server's log file")),
            None => Stdio::inherit(),
        };
        // (Metrics off unless `extra` asks for them: the default port is shared.)
        let metrics: &[&str] = if extra.contains(&"--metrics") { &[] } else { &["--metrics", "off"] };
        let mut child = Command::new(env!("CARGO_BIN_EXE_ditto"))
            .args(["server", "--port", "0", "--workers", "2", "--data-dir", dir.to_str().unwrap()])
            .args(metrics)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn ditto server");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let want_repl = extra.contains(&"--repl-port");
        let (mut port, mut repl) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(60);
        while port.is_none() || (want_repl && repl.is_none()) {
            let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
                // (Killed before the panic: no Node guards it yet.)
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server did not report its addresses within 60 s, or exited");
            };
            if let Some(rest) = line.strip_prefix("ditto server listening on ") {
                port = Some(rest.split(' ').next().unwrap().rsplit(':').next().unwrap().parse().unwrap());
            } else if let Some(rest) = line.strip_prefix("ditto server accepting backups on ") {
                repl = Some(rest.trim().to_string());
            }
        }
        Node { child, port: port.unwrap(), repl }
    }

    /// Runs `ditto server` on `dir` with `extra`, its stderr to `log`, expecting it to
    /// stop by itself (a start that is refused) within 30 s: its exit status and its log.
    pub fn run_to_exit(dir: &Path, extra: &[&str], log: &Path) -> (std::process::ExitStatus, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ditto"))
            .args(["server", "--port", "0", "--metrics", "off", "--workers", "2", "--data-dir", dir.to_str().unwrap()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("create the server's log file"))
            .spawn()
            .expect("spawn ditto server");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the server on {} still ran after 30 s: {}",
                    dir.display(),
                    std::fs::read_to_string(log).unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (status, std::fs::read_to_string(log).unwrap())
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A minimal RESP client (simple, error, integer, bulk and array-of-bulk replies).
pub struct Client {
    s: TcpStream,
    r: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(port: u16) -> std::io::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let r = BufReader::new(s.try_clone()?);
        Ok(Client { s, r })
    }

    pub fn set_read_timeout(&mut self, d: Duration) {
        self.s.set_read_timeout(Some(d)).unwrap();
    }

    pub fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        if self.r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(line.trim_end().to_string())
    }

    pub fn reply(&mut self) -> std::io::Result<Vec<String>> {
        let l = self.line()?;
        if let Some(n) = l.strip_prefix('*') {
            let n: i64 = n.parse().unwrap();
            let mut out = Vec::new();
            for _ in 0..n.max(0) {
                out.extend(self.reply()?);
            }
            return Ok(out);
        }
        if let Some(n) = l.strip_prefix('$') {
            let n: i64 = n.parse().unwrap();
            if n < 0 {
                return Ok(vec!["(nil)".into()]);
            }
            let mut buf = vec![0; n as usize + 2];
            self.r.read_exact(&mut buf)?;
            return Ok(vec![String::from_utf8_lossy(&buf[..n as usize]).into_owned()]);
        }
        Ok(vec![l])
    }

    pub fn cmd(&mut self, args: &[&str]) -> std::io::Result<Vec<String>> {
        self.send(&[args])?;
        self.reply()
    }

    /// Sends requests in one write (a pipeline); read their replies with `reply`.
    pub fn send(&mut self, reqs: &[&[&str]]) -> std::io::Result<()> {
        let mut req = String::new();
        for args in reqs {
            req.push_str(&format!("*{}\r\n", args.len()));
            for a in *args {
                req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
            }
        }
        self.s.write_all(req.as_bytes())
    }

    pub fn one(&mut self, args: &[&str]) -> String {
        self.cmd(args).unwrap().remove(0)
    }
}

/// Process `pid`'s `THP_enabled` (/proc/PID/status, Linux 5.0+): "0" once it turned
/// transparent huge pages off (`prctl(PR_SET_THP_DISABLE)`), or inherited that. None
/// where the process is gone (or a zombie: no such line) or the kernel says nothing.
pub fn thp_enabled(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("THP_enabled:")).map(|v| v.trim().to_string())
}
