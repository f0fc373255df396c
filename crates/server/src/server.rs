//! The TCP server: threads, connections, durability release
//! =======================================================
//! ```text
//!  accept loop (tokio, main thread) --spawn--> connection task, one per client
//!                                                 read -> RequestParser -> Session::handle
//!                                                 (runs on a runtime thread, which owns one
//!                                                  engine Worker = one log stream)
//!                                                 replies encoded; the batch waits until the
//!                                                 log watermark covers its newest commit
//!                                                 -> write
//!  releaser thread: Logger::wait_watermark_past -> watch channel -> waiting connections
//! ```
//!
//! Each runtime thread owns an engine worker, taken the first time that thread runs a
//! command; commands run to completion without awaiting, so a worker is never shared.
//! A connection handles every complete request it has buffered (a pipeline) before it
//! waits for durability once and writes every reply at once: one wait per pipeline, not
//! per command. A write is acknowledged only when the watermark covers it; if the log
//! fails, the batch's replies are replaced by errors and the connection is closed.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ditto_engine::{Database, Ts, Worker, WorkerId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::config::{Config, ConfigError};
use crate::metrics::{self, Metrics};
use crate::resp::{Limits, Reply, RequestParser};
use crate::session::{Outcome, Session, Shared};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("opening the database: {0}")]
    Open(#[from] ditto_log::LogError),
    #[error("engine: {0}")]
    Engine(#[from] ditto_engine::Error),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io { what, source }
}

/// The durability state connections wait on.
#[derive(Clone, Debug)]
struct Durability {
    watermark: Ts,
    failed: Option<Arc<str>>,
}

thread_local! {
    /// This runtime thread's engine worker (see the module notes).
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's worker, taking a free one the first time.
fn with_worker<R>(db: &Arc<Database>, f: impl FnOnce(&mut Worker) -> R) -> Result<R, &'static str> {
    WORKER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = (0..db.workers()).find_map(|i| db.worker(WorkerId(i as u32)));
        }
        match slot.as_mut() {
            Some(w) => Ok(f(w)),
            None => Err("no free engine worker for this server thread"),
        }
    })
}

struct Conn {
    sh: Arc<Shared>,
    limits: Limits,
    max_output: usize,
    durable: Option<watch::Receiver<Durability>>,
    metrics: Arc<Metrics>,
}

/// Opens the database in `cfg.data_dir`, recovers it, and serves until SIGINT or SIGTERM.
/// `ready` is called with the bound address once clients can connect.
pub fn run(cfg: Config, ready: impl FnOnce(SocketAddr)) -> Result<(), ServerError> {
    cfg.validate()?;
    let dir = cfg.data_dir.clone().expect("validated");
    let log = ditto_log::LogOptions { durability: cfg.durability()?, compress: cfg.compress_log, ..Default::default() };
    let durable = ditto_log::open(&dir, ditto_log::OpenOptions { workers: cfg.workers, log, progress: true })?;
    let logger = Arc::clone(durable.logger());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.workers)
        .thread_name("ditto-server")
        .enable_all()
        .build()
        .map_err(io("starting the runtime"))?;
    let listener = rt
        .block_on(TcpListener::bind((cfg.bind.as_str(), cfg.port)))
        .map_err(io(format!("binding {}:{}", cfg.bind, cfg.port)))?;
    let addr = listener.local_addr().map_err(io("reading the bound address"))?;
    let sh = Arc::new(Shared::new(
        Arc::clone(durable.db()),
        Some(Arc::clone(&logger)),
        cfg.requirepass.clone(),
        addr.port(),
    )?);
    let metrics = Arc::new(Metrics::default());
    if cfg.metrics != "off" {
        let m = rt
            .block_on(TcpListener::bind(cfg.metrics.as_str()))
            .map_err(io(format!("binding the metrics endpoint {}", cfg.metrics)))?;
        tracing::info!("metrics on http://{}/metrics", m.local_addr().map_err(io("metrics address"))?);
        rt.spawn(metrics::serve(m, Arc::clone(&sh), Arc::clone(&metrics)));
    }
    let checkpointer = (cfg.checkpoint_interval_s > 0)
        .then(|| durable.spawn_checkpointer(Duration::from_secs(cfg.checkpoint_interval_s)));

    // The releaser: one thread turns watermark progress into wake-ups.
    let (tx, rx) = watch::channel(Durability { watermark: logger.watermark(), failed: None });
    let stop = Arc::new(AtomicBool::new(false));
    let releaser = {
        let (logger, stop) = (Arc::clone(&logger), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("ditto-release".into())
            .spawn(move || {
                let mut seen = logger.watermark();
                while !stop.load(Ordering::Acquire) {
                    let w = logger.wait_watermark_past(seen, Duration::from_millis(100));
                    let failed = logger.failure();
                    if w > seen || failed.is_some() {
                        seen = w;
                        tx.send_replace(Durability { watermark: w, failed: failed.clone() });
                    }
                    if failed.is_some() {
                        return;
                    }
                }
            })
            .map_err(io("starting the releaser"))?
    };

    let conn = Arc::new(Conn {
        sh: Arc::clone(&sh),
        limits: cfg.limits(),
        max_output: cfg.max_output_bytes,
        durable: Some(rx),
        metrics,
    });
    ready(addr);
    let max_clients = cfg.max_clients;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(io("installing the SIGTERM handler"))?;
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, _) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of file descriptors and the like: back off, keep serving.
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    sh.stats.connections_received.fetch_add(1, Ordering::Relaxed);
                    // Counted here, before the task starts, so a burst of connections cannot
                    // all pass the check; `serve` gives the slot back.
                    if sh.stats.connected_clients.fetch_add(1, Ordering::AcqRel) >= max_clients {
                        sh.stats.connected_clients.fetch_sub(1, Ordering::AcqRel);
                        sh.stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(async move {
                            let mut s = stream;
                            let _ = s.write_all(b"-ERR max number of clients reached\r\n").await;
                        });
                        continue;
                    }
                    let conn = Arc::clone(&conn);
                    tokio::spawn(async move { conn.serve(stream).await });
                }
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
            }
        }
        Ok::<(), ServerError>(())
    })?;
    tracing::info!("shutting down: flushing the log");
    stop.store(true, Ordering::Release);
    durable.close();
    let _ = releaser.join();
    drop(checkpointer);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

impl Conn {
    /// Serves one client; the accept loop has counted it in `connected_clients`.
    async fn serve(&self, mut stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        if let Err(e) = self.serve_inner(&mut stream).await {
            tracing::debug!("connection closed: {e}");
        }
        self.sh.stats.connected_clients.fetch_sub(1, Ordering::AcqRel);
    }

    async fn serve_inner(&self, stream: &mut TcpStream) -> std::io::Result<()> {
        let mut session = Session::new(&self.sh);
        let mut parser = RequestParser::default();
        let mut inbuf = BytesMut::with_capacity(16 * 1024);
        let mut out = BytesMut::with_capacity(16 * 1024);
        let mut started: Vec<Instant> = Vec::new();
        loop {
            // Handle every complete request buffered (up to the output bound).
            let mut wait = Ts(0);
            let mut close = false;
            let mut replies = 0usize;
            while out.len() < self.max_output {
                match parser.next(&mut inbuf, &self.limits) {
                    Ok(None) => break,
                    Ok(Some(args)) if args.is_empty() => continue,
                    Ok(Some(args)) => {
                        started.push(Instant::now());
                        let o = with_worker(&self.sh.db, |w| session.handle(args, &self.sh, w)).unwrap_or_else(|e| {
                            Outcome { reply: Reply::err(format!("ERR {e}")), wait: Ts(0), close: true }
                        });
                        let before = out.len();
                        o.reply.encode(session.proto, &mut out);
                        let size = out.len() - before;
                        if size > self.max_output {
                            out.truncate(before);
                            Reply::err(format!(
                                "ERR reply of {size} bytes is over max_output_bytes ({})",
                                self.max_output
                            ))
                            .encode(session.proto, &mut out);
                        }
                        replies += 1;
                        wait = wait.max(o.wait);
                        if o.close {
                            close = true;
                            break;
                        }
                    }
                    Err(e) => {
                        self.sh.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        Reply::err(format!("ERR {e}")).encode(session.proto, &mut out);
                        close = true;
                        break;
                    }
                }
            }
            if !out.is_empty() {
                if let Err(failed) = self.wait_durable(wait).await {
                    out.clear();
                    for _ in 0..replies {
                        Reply::err(format!("ERR log failure, writes stopped (outcome unknown): {failed}"))
                            .encode(session.proto, &mut out);
                    }
                    close = true;
                }
                stream.write_all(&out).await?;
                out.clear();
                let now = Instant::now();
                for t in started.drain(..) {
                    self.metrics.latency.record(now - t);
                }
                if out.capacity() > 1 << 20 {
                    out = BytesMut::with_capacity(16 * 1024);
                }
                if !close {
                    continue;
                }
            }
            if close {
                stream.shutdown().await?;
                return Ok(());
            }
            inbuf.reserve(16 * 1024);
            if stream.read_buf(&mut inbuf).await? == 0 {
                return Ok(());
            }
        }
    }

    /// Waits until every commit up to `ts` is durable.
    async fn wait_durable(&self, ts: Ts) -> Result<(), Arc<str>> {
        let Some(rx) = &self.durable else { return Ok(()) };
        if ts == Ts(0) || rx.borrow().watermark >= ts {
            return Ok(());
        }
        let mut rx = rx.clone();
        let state = rx.wait_for(|d| d.watermark >= ts || d.failed.is_some()).await;
        match state {
            Ok(d) if d.watermark >= ts => Ok(()),
            Ok(d) => Err(d.failed.clone().unwrap_or_else(|| "log failed".into())),
            Err(_) => Err("the server is shutting down".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ditto_engine::Options;

    /// A connection's replies leave only once the watermark covers its commits; if the log
    /// fails instead, every reply of the waiting pipeline becomes an error and the
    /// connection is closed. Driven through a real socket, with the durability state set by
    /// the test in place of the releaser.
    #[test]
    fn replies_wait_for_durability_and_a_log_failure_turns_them_into_errors() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let db = Database::new(Options { workers: 1 });
        let sh = Arc::new(Shared::new(Arc::clone(&db), None, None, 0).unwrap());
        let (tx, rx) = watch::channel(Durability { watermark: Ts(0), failed: None });
        let conn = Arc::new(Conn {
            sh: Arc::clone(&sh),
            limits: Limits::default(),
            max_output: 1 << 20,
            durable: Some(rx),
            metrics: Arc::new(Metrics::default()),
        });
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let c = Arc::clone(&conn);
            tokio::spawn(async move {
                loop {
                    let (s, _) = listener.accept().await.unwrap();
                    c.sh.stats.connected_clients.fetch_add(1, Ordering::AcqRel);
                    let c = Arc::clone(&c);
                    tokio::spawn(async move { c.serve(s).await });
                }
            });
            let quiet = Duration::from_millis(300);
            let mut buf = vec![0u8; 256];

            let mut a = TcpStream::connect(addr).await.unwrap();
            a.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n").await.unwrap();
            assert!(tokio::time::timeout(quiet, a.read(&mut buf)).await.is_err(), "answered before durable");
            let committed = db.clock().visible_ts();
            assert!(committed > Ts(0));
            tx.send_replace(Durability { watermark: committed, failed: None });
            let n = tokio::time::timeout(Duration::from_secs(10), a.read(&mut buf)).await.unwrap().unwrap();
            assert_eq!(&buf[..n], b"+OK\r\n");

            // A pipeline of a write and a read: both wait, then both fail with the log.
            let mut b = TcpStream::connect(addr).await.unwrap();
            b.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nw\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").await.unwrap();
            assert!(tokio::time::timeout(quiet, b.read(&mut buf)).await.is_err(), "answered before durable");
            tx.send_replace(Durability { watermark: committed, failed: Some("fsync failed: EIO".into()) });
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), b.read_to_end(&mut got)).await.unwrap().unwrap();
            let text = String::from_utf8(got).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 2, "{text}");
            assert!(
                lines.iter().all(|l| l.starts_with("-ERR log failure") && l.contains("fsync failed: EIO")),
                "{text}"
            );
        });
    }
}
