//! The TCP server: threads, connections, durability release
//! =======================================================
//! ```text
//!  accept loop (tokio, main thread) --spawn--> connection task, one per client
//!   (plaintext port, TLS port)                    [TLS handshake, bounded in time]
//!                                                 read -> RequestParser -> Session::handle
//!                                                 (runs on a runtime thread, which owns one
//!                                                  engine Worker = one log stream)
//!                                                 replies encoded; the batch waits until the
//!                                                 log watermark covers its newest commit
//!                                                 -> write
//!  log flusher threads: after each fsync, the progress listener -> Release (release.rs)
//!                       -> the waiting connections its new watermark covers
//!  before a runtime thread parks: its streams' batches framed and shipped
//!                       (ditto_log::flush_before_sleeping); backups' acks read on the
//!                       runtime -> Release -> the connections they release
//! ```
//!
//! Each runtime thread owns an engine worker, taken the first time that thread runs a
//! command; commands run to completion without awaiting, so a worker is never shared.
//! A connection handles every complete request it has buffered (a pipeline) before it
//! waits for durability once and writes every reply at once: one wait per pipeline, not
//! per command. A write is acknowledged only when the watermark covers it; if the log
//! fails, the batch's replies are replaced by errors and the connection is closed.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ditto_engine::{Database, Ts, Worker, WorkerId};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::config::{Config, ConfigError};
use crate::metrics::{self, Metrics};
use crate::release::Release;
use crate::resp::{Limits, ProtocolError, Reply, RequestParser};
use crate::session::{Outcome, RunKind, Session, Shared};
use crate::tls::{self, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("opening the database: {0}")]
    Open(#[from] ditto_log::LogError),
    #[error("engine: {0}")]
    Engine(#[from] ditto_engine::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ServerError {
    let what = what.into();
    move |source| ServerError::Io { what, source }
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

/// At most this many pipelined GETs (or SETs) in a row are answered in one transaction.
const RUN_MAX: usize = 64;

/// A request as the parser gives it: a request, nothing complete yet, or a protocol error.
type Parsed = Result<Option<Vec<Bytes>>, ProtocolError>;

/// The next request: one set aside earlier (`pending`), else the next parsed from `inbuf`.
fn next_request(
    pending: &mut VecDeque<Parsed>,
    parser: &mut RequestParser,
    inbuf: &mut BytesMut,
    limits: &Limits,
) -> Parsed {
    pending.pop_front().unwrap_or_else(|| parser.next(inbuf, limits))
}

/// What the connection runs next: one request, or a run of GETs or SETs.
enum Work {
    One(Vec<Bytes>),
    Run(RunKind, Vec<Vec<Bytes>>),
}

/// How often the server frees deleted data on its own (`Database::reclaim`).
const RECLAIM_EVERY: Duration = Duration::from_millis(100);

/// The outcome of a request when this thread has no engine worker.
fn no_worker(e: &'static str) -> Outcome {
    Outcome { reply: Reply::err(format!("ERR {e}")), wait: Ts(0), close: true, cmd: None, replicas: None, policy: None }
}

struct Conn {
    sh: Arc<Shared>,
    limits: Limits,
    max_clients: usize,
    tls_handshake_timeout: Duration,
    /// TCP keepalive's idle time on clients' sockets (`Config::tcp_keepalive_s`; None: off).
    tcp_keepalive: Option<Duration>,
    durable: Option<Arc<Release>>,
    /// On a primary: one release per commit policy, for connections that chose their own
    /// (DITTO.POLICY); the server's policy's is `durable`.
    by_policy: Vec<(ditto_replication::CommitPolicy, Arc<Release>)>,
    /// On a backup: how long a reply waits for the read view (DITTO.WAITTS).
    wait_timeout: Option<Duration>,
    /// How long a DITTO.WAITTS waits (`waitts_timeout_ms`), on either role and across a
    /// change of role meanwhile; a primary's write replies wait without a bound.
    waitts_timeout: Duration,
    metrics: Arc<Metrics>,
}

/// The addresses a running server listens on.
#[derive(Clone, Copy, Debug)]
pub struct Listening {
    /// Plaintext RESP; `None` with `tls_only`.
    pub plain: Option<SocketAddr>,
    /// RESP over TLS; `None` without `tls_port`.
    pub tls: Option<SocketAddr>,
    /// Where backups connect (a primary with `repl_port`).
    pub repl: Option<SocketAddr>,
}

async fn bind(host: &str, port: u16) -> Result<(TcpListener, SocketAddr), ServerError> {
    let l = TcpListener::bind((host, port)).await.map_err(io(format!("binding {host}:{port}")))?;
    let a = l.local_addr().map_err(io("reading the bound address"))?;
    Ok((l, a))
}

/// Accepts on `l`, or waits forever when there is no such listener.
async fn accept_on(l: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match l {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Opens the database in `cfg.data_dir`, recovers it, and serves until SIGINT or SIGTERM.
/// `ready` is called with the bound addresses once clients can connect.
pub fn run(cfg: Config, ready: impl Fn(&Listening)) -> Result<(), ServerError> {
    let (mut cfg, mut kept, mut lasting) = (cfg, None, None);
    // A cluster's backup that changes its role in place serves again, as the primary or as
    // the next epoch's backup, from the engine it kept (`RoleRequest`), on the same
    // runtime, listeners and connections (`Lasting`).
    let mut joined = None;
    let signals = StopSignals::watch()?;
    // Before any log or link starts: their threads ask for it as they start.
    ditto_log::sched::set_commit_thread_slice(cfg.commit_thread_slice());
    ditto_log::sched::set_link_thread_slice(cfg.link_thread_slice());
    if cfg.cluster.as_ref().is_some_and(|c| c.epoch >= 2) && cfg.replica_of.is_none() && failpoint("primary-start-slow")
    {
        // A cluster primary's start after a failover that takes 4 s before it opens
        // anything (a large recovery, say), for the test of a supervisor restarted
        // meanwhile; it ends at once if its supervisor goes.
        let parent = std::os::unix::process::parent_id();
        for _ in 0..80 {
            std::thread::sleep(Duration::from_millis(50));
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(1);
            }
        }
    }
    while let Some(next) = run_role(cfg, kept.take(), joined.take(), &mut lasting, &signals, &ready)? {
        (cfg, kept, joined) = (next.cfg, next.kept, next.joined);
    }
    if let Some(l) = lasting {
        l.rt.shutdown_timeout(Duration::from_secs(1));
    }
    Ok(())
}

/// SIGTERM and SIGINT, watched once for the process (`run`), not once per role: one that
/// comes while roles change over (a backup's rejoin, a change in place) is not lost. (Per
/// role, it was: tokio had taken over the signal's default action, and one that came with
/// no role listening did nothing, the server running on.) A role's loop stops on it
/// (`asked`); before the first role serves (while a log is recovered, or a backup first
/// joins its primary) it ends the process at once, as the default action did: nothing has
/// been acknowledged yet.
struct StopSignals {
    asked: Arc<AtomicBool>,
    notify: tokio::sync::Notify,
    /// A role has served (set once its loop starts).
    served: AtomicBool,
}

impl StopSignals {
    fn watch() -> Result<Arc<StopSignals>, ServerError> {
        static WATCHING: std::sync::OnceLock<Arc<StopSignals>> = std::sync::OnceLock::new();
        if let Some(s) = WATCHING.get() {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(StopSignals {
            asked: Arc::new(AtomicBool::new(false)),
            notify: tokio::sync::Notify::new(),
            served: AtomicBool::new(false),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io("starting the signal watcher"))?;
        // Installed before this returns, so that none is missed from here on.
        let (mut term, mut int) = {
            let _in = rt.enter();
            use tokio::signal::unix::{signal, SignalKind};
            (
                signal(SignalKind::terminate()).map_err(io("installing the SIGTERM handler"))?,
                signal(SignalKind::interrupt()).map_err(io("installing the SIGINT handler"))?,
            )
        };
        let watcher = Arc::clone(&s);
        std::thread::Builder::new()
            .name("ditto-signals".into())
            .spawn(move || {
                rt.block_on(async move {
                    loop {
                        let sig = tokio::select! {
                            _ = term.recv() => libc::SIGTERM,
                            _ = int.recv() => libc::SIGINT,
                        };
                        if !watcher.served.load(Ordering::Acquire) {
                            // The signal's own default action: the process ends by it.
                            // SAFETY: signal(2) and raise(3) with a valid signal number.
                            unsafe {
                                libc::signal(sig, libc::SIG_DFL);
                                libc::raise(sig);
                            }
                            std::process::exit(128 + sig);
                        }
                        watcher.asked.store(true, Ordering::Release);
                        watcher.notify.notify_waiters();
                    }
                })
            })
            .map_err(io("starting the signal watcher"))?;
        let _ = WATCHING.set(Arc::clone(&s));
        Ok(s)
    }

    /// Returns once a stop was asked for (at once if it was already).
    async fn asked(&self) {
        loop {
            let woken = self.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.asked.load(Ordering::Acquire) {
                return;
            }
            woken.await;
        }
    }
}

/// How long a data read on a backup whose reads are held waits for its primary's release
/// before it is answered LOADING (`Conn::wait_reads_released`).
const READS_HELD_WAIT: Duration = Duration::from_millis(500);

/// How a wait for held reads ended.
enum Waited {
    Released,
    /// The connection's role changed: the next role handles the read.
    Moved,
    /// Still held after `READS_HELD_WAIT`: the read answers LOADING.
    GaveUp,
}

/// Which role's `Conn` serves a server's connections now. A server that changes its role
/// in place keeps its runtime, listeners and clients' connections (`Lasting`); each
/// connection moves to the new role's `Conn` before the next request it handles
/// (docs/cluster.md, "Clients' connections through a change in place").
#[derive(Default)]
struct Hub {
    conn: parking_lot::Mutex<Option<Arc<Conn>>>,
    /// Raised at every `set`: a connection compares it with the one it last saw (one
    /// atomic load per read from its socket).
    generation: std::sync::atomic::AtomicU64,
    /// Wakes the replies waiting on the previous role's release (`Conn::wait_moving`).
    changed: tokio::sync::Notify,
}

impl Hub {
    fn set(&self, c: Arc<Conn>) {
        *self.conn.lock() = Some(c);
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// Moves `conn` to the role that serves now if the hub changed since `seen`.
    fn follow(&self, conn: &mut Arc<Conn>, seen: &mut u64) {
        let generation = self.generation.load(Ordering::Acquire);
        if generation != *seen {
            *seen = generation;
            if let Some(next) = self.current() {
                // Only a role that serves the same engine keeps the connections.
                debug_assert!(Arc::ptr_eq(&next.sh.db, &conn.sh.db));
                *conn = next;
            }
        }
    }

    fn current(&self) -> Option<Arc<Conn>> {
        self.conn.lock().clone()
    }
}

/// What outlives a role (`run_role`) when the next one serves the same engine: the
/// runtime that runs the connections, the client listeners, the metrics, and the tasks of
/// the role that serves now (stopped when the next one takes over).
struct Lasting {
    rt: tokio::runtime::Runtime,
    plain: Option<(TcpListener, SocketAddr)>,
    tls: Option<(TcpListener, SocketAddr)>,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    role_tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Lasting {
    /// Binds the listeners (and the metrics endpoint, which then answers for whichever
    /// role serves) on a new runtime.
    fn start(cfg: &Config) -> Result<Lasting, ServerError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.workers)
            .thread_name("ditto-server")
            // A runtime thread ships its round's commits itself before it sleeps, in one
            // batch (crates/log/src/writer.rs, `flush_before_sleeping`).
            .on_thread_park(ditto_log::flush_before_sleeping)
            .enable_all()
            .build()
            .map_err(io("starting the runtime"))?;
        let plain = match cfg.tls_only {
            false => Some(rt.block_on(bind(&cfg.bind, cfg.port))?),
            true => None,
        };
        let tls = match cfg.tls_port {
            Some(port) => Some(rt.block_on(bind(&cfg.bind, port))?),
            None => None,
        };
        let hub = Arc::new(Hub::default());
        let metrics = Arc::new(Metrics::new(cfg.workers));
        if cfg.metrics != "off" {
            let m = rt
                .block_on(TcpListener::bind(cfg.metrics.as_str()))
                .map_err(io(format!("binding the metrics endpoint {}", cfg.metrics)))?;
            tracing::info!("metrics on http://{}/metrics", m.local_addr().map_err(io("metrics address"))?);
            let h = Arc::clone(&hub);
            let current = move || h.current().map(|c| Arc::clone(&c.sh));
            rt.spawn(metrics::serve(m, current, Arc::clone(&metrics)));
        }
        Ok(Lasting { rt, plain, tls, hub, metrics, role_tasks: Vec::new() })
    }
}

/// What a server that changes its role in place hands to its next run.
struct Kept {
    /// The engine, at the failover's point.
    db: ditto_log::Recovered,
    /// The per-database key counts, at `db`'s read view (replay kept them).
    counts: [i64; crate::keyspace::DBS],
}

/// A backup that joined its primary again with a fresh copy of its checkpoint while the
/// role before served (`rejoin`), and the key counts its replay keeps.
struct Joined {
    backup: ditto_replication::Backup,
    key_counts: Arc<crate::keyspace::ReplayKeyCounts>,
}

/// The role a server serves next, and what it takes over from the one before.
struct NextRole {
    cfg: Config,
    /// The engine, kept through a change in place.
    kept: Option<Kept>,
    /// A backup joined already (`rejoin`).
    joined: Option<Joined>,
}

/// A standalone backup joining its primary again with a fresh copy of its checkpoint,
/// on a thread of its own, while the role before serves its last read view.
struct Rejoin {
    done: tokio::sync::oneshot::Receiver<Result<Joined, ditto_replication::BackupError>>,
    cancel: ditto_replication::JoinCancel,
    thread: std::thread::JoinHandle<()>,
}

/// How often a standalone backup looks whether its primary can no longer resume it, and
/// how long it waits before it tries a failed fresh join again.
const REJOIN_CHECK_EVERY: Duration = Duration::from_millis(100);
const REJOIN_RETRY_AFTER: Duration = Duration::from_secs(1);
const REJOIN_RETRY_MAX: Duration = Duration::from_secs(30);

/// The options of this server's backup of `primary`; replay keeps `rkc`'s key counts.
fn backup_options(
    cfg: &Config,
    primary: &str,
    dir: &std::path::Path,
    rkc: &Arc<crate::keyspace::ReplayKeyCounts>,
    engine: Option<Arc<Database>>,
    signals: &StopSignals,
) -> Result<ditto_replication::BackupOptions, ServerError> {
    let rkc = Arc::clone(rkc);
    let (replay, share_values_from) = ditto_replication::parse_replay(&cfg.replay).map_err(ConfigError::Invalid)?;
    Ok(ditto_replication::BackupOptions {
        primary: primary.to_string(),
        data_dir: dir.to_path_buf(),
        workers: cfg.workers,
        node: replica_name(cfg),
        learner: cfg.cluster.as_ref().is_some_and(|c| c.learner),
        replay,
        share_values_from,
        progress: true,
        on_keys: Some(Arc::new(move |table, key: &[u8], ts, delta| rkc.record(table, key, ts, delta))),
        storage: None,
        // Its own checkpoints follow the server's checkpoint interval (a primary's
        // is one trigger of several; a backup's replica log is deleted after them).
        checkpoint_every: Duration::from_secs(match cfg.checkpoint_interval_s {
            0 => 300,
            s => s,
        }),
        // ... and its log growth, as a primary's do: a promoted backup replays at
        // most that much before it serves (docs/cluster.md).
        checkpoint_log_min_bytes: cfg.checkpoint_log_min_bytes,
        checkpoint_log_growth_percent: cfg.checkpoint_log_growth_percent,
        checkpoint_write_bytes_per_s: cfg.backup_checkpoint_write_mb_per_s * 1_000_000,
        replica_file_bytes: 64 << 20,
        recover_upto: cfg.cluster.as_ref().and_then(|c| c.upto).map(Ts),
        // A cluster node's backup may be promoted in place: it replays only what
        // the primary released (docs/cluster.md).
        hold_replay_at_release: cfg.cluster.as_ref().is_some_and(|c| c.hold_replay_at_release),
        held_in_memory_max: cfg.replay_held_memory_mb * 1_000_000,
        // Kept from this server's previous run (it follows the next epoch's
        // primary in place, `RoleRequest::Follow`).
        engine,
        checkpoint_sealed: true,
        // A cluster node's stop, or a stop signal, ends a join that has not happened yet
        // (both for a cluster node: a SIGTERM to a server following a new primary in
        // place waited for its join before).
        stop: std::iter::once(Arc::clone(&signals.asked))
            .chain(cfg.write_gate.as_ref().map(|g| g.stop_flag()))
            .collect(),
        fresh_copy: false,
        cancel: None,
        // A cluster's failover points lie above every acknowledged commit.
        keep_what_the_primary_lost: cfg.cluster.is_none(),
        same_streams: cfg.cluster.is_some(),
        auth: cfg.link_secret.as_deref().or(cfg.masterauth.as_deref()).map(Into::into),
        // The cluster's other secrets while it is rotated: its primary may show one.
        auth_also: match cfg.link_secret {
            Some(_) => cfg.link_secret_also.iter().map(|s| s.as_str().into()).collect(),
            None => Vec::new(),
        },
        tls: link_tls(cfg)?,
        // Its fsyncs paced as the server's durability paces a primary's.
        persist_interval: cfg.durability()?.interval(),
    })
}

/// TLS on the replication links (`tls_replication`), its files read now: each start of a
/// role reads them again, so renewed certificates are taken at the next change of role.
fn link_tls(cfg: &Config) -> Result<Option<Arc<ditto_replication::tls::LinkTls>>, ServerError> {
    if !cfg.tls_replication {
        return Ok(None);
    }
    let files = cfg.node_tls()?.expect("tls_replication is set");
    let handshake = Duration::from_secs(cfg.tls_handshake_timeout_s);
    Ok(Some(ditto_replication::tls::LinkTls::new(&files, handshake)?))
}

/// `--promote`: a standalone backup's directory opened as a primary's. Its checkpoint and
/// its replica log up to its cut become the engine (as a cluster's promotion does,
/// `promote_replica`), the replica log and the followed epoch go, and the primary writes
/// the epoch after the one it followed, so that a backup of the old primary is never
/// resumed from this one's log as if it were the same history. A directory that is no
/// backup's is opened as it is. The open writes a checkpoint at the cut before anything
/// is removed, so a crash at any step leaves a directory that opens whole.
fn promote_standalone(
    dir: &std::path::Path,
    workers: usize,
) -> Result<(Option<ditto_log::Recovered>, Option<ditto_log::Epoch>), ServerError> {
    let followed =
        ditto_replication::backup::read_followed_epoch(dir).map_err(io("reading the epoch this backup followed"))?;
    if !ditto_log::replica::replica_dir(dir).exists() && followed.is_none() {
        return Ok((None, None));
    }
    crate::say!(
        "promotion: a backup's directory (it followed epoch {}) opened as a primary's",
        followed.map_or(0, |e| e.0)
    );
    let next = followed.map(|e| ditto_log::Epoch(e.0 + 1));
    let db = promote_replica_dir(dir, workers, None, &[], next)?;
    Ok((Some(db), next))
}

/// Starts a standalone backup's join again (`Rejoin`), as `how` says: with a fresh copy
/// of the primary's checkpoint, or its directory cut at a point and resumed from the log.
/// Its old run is fenced (nothing of it writes the directory any more) and let go (the
/// directory's lock with it) by the caller first; its engine stays with the
/// connections, which read it meanwhile.
fn rejoin(
    cfg: &Config,
    primary: &str,
    dir: &std::path::Path,
    how: ditto_replication::JoinAgain,
    signals: &StopSignals,
) -> Result<Rejoin, ServerError> {
    let key_counts = Arc::new(crate::keyspace::ReplayKeyCounts::default());
    let mut opts = backup_options(cfg, primary, dir, &key_counts, None, signals)?;
    let cancel = ditto_replication::JoinCancel::default();
    match how {
        ditto_replication::JoinAgain::Copy => opts.fresh_copy = true,
        ditto_replication::JoinAgain::CutAt(point) => opts.recover_upto = Some(point),
    }
    opts.cancel = Some(cancel.clone());
    let (tx, done) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("ditto-rejoin".into())
        .spawn(move || {
            let r = ditto_replication::backup::start(opts).map(|backup| Joined { backup, key_counts });
            if let Err(Ok(j)) = tx.send(r) {
                // Nobody waits any more (the server stops): what it received is made
                // durable, as at any backup's stop.
                let _ = j.backup.stop("the server is shutting down", Duration::from_secs(10));
            }
        })
        .map_err(io("starting the rejoin"))?;
    Ok(Rejoin { done, cancel, thread })
}

/// Serves in one role until the server stops (`None`) or changes its role
/// (`Some`): a cluster's backup promoted in place or following the next primary (the
/// engine kept), or a standalone backup that joined its primary again with a fresh copy.
fn run_role(
    cfg: Config,
    kept: Option<Kept>,
    joined: Option<Joined>,
    lasting: &mut Option<Lasting>,
    signals: &StopSignals,
    ready: &dyn Fn(&Listening),
) -> Result<Option<NextRole>, ServerError> {
    cfg.validate()?;
    let t_role = Instant::now();
    let counted = kept.as_ref().map(|k| (Arc::clone(&k.db.0), k.counts, k.db.0.clock().visible_ts()));
    let recovered = kept.map(|k| k.db);
    // Certificates are read before the database is opened, so a bad file fails fast.
    let acceptor = match cfg.tls()? {
        Some(files) => Some(TlsAcceptor::from(tls::server_config(&files)?)),
        None => None,
    };
    let dir = cfg.data_dir.clone().expect("validated");
    let policy = cfg.policy()?;
    // On a backup, replay moves DBSIZE's counts (attached once the server has counted).
    let replay_key_counts = joined.as_ref().map_or_else(Default::default, |j: &Joined| Arc::clone(&j.key_counts));
    let joined_before = joined.is_some();
    // A backup joins its primary (a checkpoint or the log above what it holds) before it
    // serves (or joined already, `rejoin`); a primary opens and recovers its own directory.
    let (mut durable, mut backup) = match &cfg.replica_of {
        Some(primary) => {
            if cfg.masterauth.is_some() && cfg.requirepass.is_none() {
                tracing::warn!(
                    "masterauth is set but requirepass is not: this backup's clients read without a password what its primary asks one for"
                );
            }
            let opts = backup_options(&cfg, primary, &dir, &replay_key_counts, recovered.map(|r| r.0), signals)?;
            let started = match joined {
                Some(j) => Ok(j.backup),
                None => ditto_replication::backup::start(opts),
            };
            let b = match started {
                Ok(b) => b,
                Err(ditto_replication::BackupError::Stopped) => {
                    tracing::info!("stopped before it joined its primary at {primary}: nothing acknowledged");
                    return Ok(None);
                }
                Err(e) => {
                    // (A failed connection says where already.)
                    let what = format!("joining the primary at {primary}");
                    let why = e.to_string();
                    let why = why.strip_prefix(&format!("{what}: ")).unwrap_or(&why).to_string();
                    return Err(ServerError::Io { what, source: std::io::Error::other(why) });
                }
            };
            // From here it may acknowledge what it receives: a cluster node's supervisor
            // reads this line (a server stopped uncleanly after it may have lost acks).
            // Only there: other readers of a server's output expect its listening lines.
            if cfg.cluster.is_some() {
                crate::say!("ditto server joined its primary at {primary}");
            }
            (None, Some(b))
        }
        None => {
            let log = ditto_log::LogOptions {
                durability: cfg.durability()?,
                compress: cfg.compress_log,
                checkpoint_write_bytes_per_s: cfg.checkpoint_write_mb_per_s * 1_000_000,
                keep_for_backups_max_bytes: cfg.log_keep_for_backups_mb.saturating_mul(1_000_000),
                segment_bytes_max: cfg.log_segment_bytes,
                ..Default::default()
            };
            let mut open = ditto_log::OpenOptions { workers: cfg.workers, log, progress: true, ..Default::default() };
            // Promoted in place: the engine was kept (not recovered from the directory).
            let in_place = recovered.is_some();
            if let Some(c) = &cfg.cluster {
                open.recovered = match recovered {
                    Some(r) => Some(r),
                    None => promote_replica(&dir, cfg.workers, c)?,
                };
                open.epoch = Some(ditto_log::Epoch(c.epoch));
                open.ts_above = Ts(c.ts_above);
            } else if cfg.promote {
                (open.recovered, open.epoch) = promote_standalone(&dir, cfg.workers)?;
                if failpoint("promotion-crash-before-log") {
                    eprintln!("failpoint promotion-crash-before-log: aborting");
                    std::process::abort();
                }
            }
            let d = ditto_log::open(&dir, open)?;
            // A standalone primary that did not stop cleanly: the open has begun a new epoch
            // from the point it recovered (`old`'s), so the restart joins the record's chain
            // now (`QuorumRecord::restarts`), before anything else can fail. A start that
            // failed after the open (refused below for want of --repl-port, a port taken, a
            // TLS setting) wrote it only in `Primary::start`, which it never reached: the
            // next start then recovered from the empty new epoch, and its backups of the
            // epoch before were refused as holding more, for good (found by a review).
            let record = match (&cfg.cluster, d.opened_from()) {
                (None, Some((old, point))) => {
                    // (Whenever the wait below will be, by the last run's record merged
                    // with this run's: a policy changed at this restart may need a wait
                    // the last record alone does not; found by a review, 2026-12-03.)
                    let mine = ditto_replication::QuorumRecord::new(cfg.backups, policy);
                    let read = ditto_replication::QuorumRecord::read(&dir).and_then(|r| match r {
                        Some(mut r) if r.merged(&mine).need() > 0 => {
                            r.add_restart(old, point);
                            r.write(&dir).map(|()| Some(r))
                        }
                        r => Ok(r),
                    });
                    read.map_err(|e| {
                        d.close();
                        ServerError::Io { what: "reading or writing the quorum's record".into(), source: e }
                    })?
                }
                _ => None,
            };
            // Started without replication, it would take writes without asking the backups
            // that may hold commits it lost.
            if let (None, None, Some((old, point))) = (&cfg.repl_port, &cfg.cluster, d.opened_from()) {
                if let Some(r) = record.filter(|r| r.need() > 0) {
                    d.close();
                    return Err(ConfigError::Invalid(format!(
                        "this directory's primary did not stop cleanly (it restarts at ts {} of epoch {}), and its backups {} may hold commits they acknowledged that it lacks: start it with --repl-port, so that it waits for them to say what they hold (one gone for good is declared lost there with DITTO.FORGETBACKUP); or, if none of them holds anything it lacks, remove the file {}",
                        point.0,
                        old.0,
                        r.remaining().collect::<Vec<_>>().join(", "),
                        dir.join(ditto_replication::restart::QUORUM_FILE).display()
                    ))
                    .into());
                }
            }
            if in_place && cfg.cluster.is_some() && failpoint("promotion-fails-after-log") {
                // As a promotion in place whose server fails once its new log has begun
                // (its segments written): its node gives the epoch up.
                d.close();
                return Err(ServerError::Io {
                    what: "starting the promoted primary".into(),
                    source: std::io::Error::other(
                        "refused by the failpoint promotion-fails-after-log (DITTO_FAILPOINTS)",
                    ),
                });
            }
            (Some(d), None)
        }
    };
    let t_opened = t_role.elapsed();
    // Opened or joined: a backup may have acknowledged what it received from here on, so
    // a stop signal is acted on as a stop (a backup's makes it durable), not by ending
    // the process at once (`StopSignals`).
    signals.served.store(true, Ordering::Release);
    // A failure from here until the role serves ends the process: a backup first makes
    // what it received durable, as at any stop (it may have acknowledged it as received).
    let stop_backup = |e: ServerError| {
        if let Some(b) = &backup {
            if let Err(why) = b.stop(&format!("this server cannot serve: {e}"), Duration::from_secs(10)) {
                tracing::error!("stopping the backup: {why}");
            }
        }
        e
    };
    if joined_before && failpoint("serve-fails-after-rejoin") {
        return Err(stop_backup(ServerError::Io {
            what: "serving after joining again".into(),
            source: std::io::Error::other("refused by the failpoint serve-fails-after-rejoin (DITTO_FAILPOINTS)"),
        }));
    }
    let db = match (&durable, &backup) {
        (Some(d), _) => Arc::clone(d.db()),
        (None, Some(b)) => Arc::clone(&b.db),
        (None, None) => unreachable!("a primary or a backup"),
    };
    let logger = durable.as_ref().map(|d| Arc::clone(d.logger()));
    // The connections of the previous role stay open when this one serves the same engine
    // (a change in place that kept it); otherwise (a first role, or a backup whose new
    // primary sent it a checkpoint copy) they close with that role's runtime. An engine
    // worker a server thread holds belongs to one engine (`with_worker`): a thread of the
    // old runtime would keep the old engine alive.
    if lasting.as_ref().is_some_and(|l| l.hub.current().is_some_and(|c| !Arc::ptr_eq(&c.sh.db, &db))) {
        if let Some(old) = lasting.take() {
            old.rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
    if lasting.is_none() {
        *lasting = Some(Lasting::start(&cfg).map_err(&stop_backup)?);
    }
    let lasting = lasting.as_mut().expect("started above");
    let rt = &lasting.rt;
    let (plain, tls_listener) = (&lasting.plain, &lasting.tls);
    let mut listening =
        Listening { plain: plain.as_ref().map(|p| p.1), tls: tls_listener.as_ref().map(|p| p.1), repl: None };
    let port = listening.plain.or(listening.tls).map_or(0, |a| a.port());
    // A backup's tables are the primary's (ids included): it must never create one. A
    // ditto server primary creates its keyspace before any backup joins.
    if let (Some(b), Some(_)) = (&backup, &cfg.replica_of) {
        let missing =
            [crate::keyspace::KEYS_TABLE, crate::keyspace::FIELDS_TABLE].into_iter().find(|t| db.table_id(t).is_none());
        if let Some(t) = missing {
            return Err(stop_backup(ConfigError::Invalid(format!(
                "the primary at {} holds no table {t}: a backup serves Redis clients only for a primary that has the Redis keyspace (a ditto server, or a benchmark that creates it)",
                b.primary
            ))
            .into()));
        }
    }
    // The counts kept hold for the engine kept (a backup whose new primary sent it a
    // checkpoint copy instead has another: counted afresh).
    let counted = counted.filter(|(kept, ..)| Arc::ptr_eq(kept, &db)).map(|(_, n, at)| (n, at));
    let mut sh = Shared::with_counts(Arc::clone(&db), logger.clone(), cfg.requirepass.clone(), port, counted)
        .map_err(|e| stop_backup(e.into()))?;
    let t_shared = t_role.elapsed();
    replay_key_counts.attach(Arc::clone(&sh.key_counts), sh.ks.keys, sh.key_counts_at, Arc::clone(&db));
    sh.read_only = backup.is_some();
    sh.config_view = cfg.view();
    sh.max_output_bytes = cfg.max_output_bytes;
    sh.memory.max = cfg.maxmemory.bytes().map_err(|e| stop_backup(e.into()))?;
    if let Some(used) = cfg.used_memory {
        sh.memory.used = used;
    }
    if sh.memory.max != 0 && (sh.memory.used)() > sh.memory.max {
        tracing::warn!(
            "the recovered data already uses {} of maxmemory {}: writes that may grow it are refused \
             until keys are deleted",
            crate::memory::human((sh.memory.used)()),
            crate::memory::human(sh.memory.max)
        );
    }
    // The bound ports (0 in the config asks for any free one).
    for (k, v) in sh.config_view.iter_mut() {
        match k.as_str() {
            "port" => *v = listening.plain.map_or(0, |a| a.port()).to_string(),
            "tls-port" => *v = listening.tls.map_or(0, |a| a.port()).to_string(),
            _ => {}
        }
    }
    // Durability progress reaches connections from the log's flusher threads (no thread of
    // ours in between: one wake-up fewer per commit), waking only those it covers. With
    // backups, what releases a commit is the commit policy's quorum (ditto_replication).
    // On a primary with backups, every policy's release raises `acknowledged` to each
    // commit it acknowledges (shipped to its backups); elsewhere nobody reads it.
    let acknowledged = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counting = || match (&durable, cfg.repl_port) {
        (Some(_), Some(_)) => Release::counting_into(Arc::clone(&acknowledged)),
        _ => Release::default(),
    };
    let release = Arc::new(counting());
    let mut primary = None;
    // A restarted primary's wait for its backups (see below): the primary, and the epoch
    // and point it restarted from.
    let mut restart_wait = None;
    let mut restart_refusal = None;
    // Every policy a connection may choose on a primary (the server's own is `release`).
    let by_policy: Vec<(ditto_replication::CommitPolicy, Arc<Release>)> = match cfg.repl_port {
        Some(_) if durable.is_some() => {
            ["local", "majority-received", "majority-durable", "all-received", "all-durable"]
                .into_iter()
                .map(|n| ditto_replication::CommitPolicy::parse(n).expect("a known policy"))
                .filter(|p| *p != policy)
                .map(|p| (p, Arc::new(counting())))
                .collect()
        }
        _ => Vec::new(),
    };
    if let (Some(d), Some(port)) = (&durable, cfg.repl_port) {
        let l = std::net::TcpListener::bind((cfg.bind.as_str(), port))
            .map_err(io(format!("binding the replication port {}:{port}", cfg.bind)))?;
        let l_addr = Some(l.local_addr().map_err(io("reading the replication address"))?);
        let repl_addr = l_addr.map(|a| a.to_string()).unwrap_or_default();
        // A cluster's new primary names the epoch it opened from and where; a standalone
        // one that recovered its log into a new epoch, its own (`Durable::opened_from`):
        // its backups are then cut there and resumed from the log, not sent a copy.
        let reopened = d.opened_from();
        let resume_from = match &cfg.cluster {
            Some(c) => (|| Some((ditto_log::Epoch(c.resume_epoch?), Ts(c.upto?), Ts(c.ts_above))))(),
            None => reopened.map(|(e, point)| (e, point, point)),
        };
        // A standalone primary keeps its quorum's record on disk; one that restarted
        // waits for its backups by the last run's record (docs/replication.md, "A primary
        // restarted under a policy that counts backups"; `ditto_replication::restart`).
        let mine = ditto_replication::QuorumRecord::new(cfg.backups, policy);
        // (The primary waits by the last run's record merged with its own: `restart_record`.)
        let (quorum_record, restart_waits) = match (&cfg.cluster, reopened) {
            (Some(_), _) => (None, false),
            (None, restarted) => {
                let last = ditto_replication::QuorumRecord::read(&dir)
                    .map_err(io("reading the quorum's record"))?
                    .unwrap_or_else(|| mine.clone());
                match restarted {
                    Some(_) if last.merged(&mine).need() > 0 => (Some((dir.clone(), last)), true),
                    _ => (Some((dir.clone(), mine.clone())), false),
                }
            }
        };
        let opts = ditto_replication::PrimaryOptions {
            backups_expected: cfg.backups,
            members_config: cfg.cluster.as_ref().map_or(0, |c| c.members_config),
            resume_from,
            // The highest commit acknowledged to a client under any policy (a backup will
            // not cut away what it holds below it).
            acknowledged: Some(Arc::clone(&acknowledged)),
            policy: Some(policy),
            quorum_record,
            restart_wait: restart_waits,
            // Acks are read on the connections' runtime: the replies they release are
            // woken on the thread that read them.
            acks_on: Some(rt.handle().clone()),
            // A backup receives everything a client could read: it gives the password too.
            password: cfg.link_secret.as_deref().or(cfg.requirepass.as_deref()).map(Into::into),
            also_accepted: cfg.link_secret_also.iter().map(|s| s.as_str().into()).collect(),
            tls: link_tls(&cfg)?,
            // A cluster primary's lease stands on its backups' acks echoing its heartbeats.
            lease_beat: cfg.cluster.as_ref().map(|_| ditto_replication::primary::LEASE_HEARTBEAT),
            ..Default::default()
        };
        let r = Arc::clone(&release);
        let others = by_policy.clone();
        let on_change = Box::new(move |h: &ditto_replication::Holdings| {
            let w = ditto_replication::release_watermark(policy, h);
            r.advance(w, None);
            for (p, rel) in &others {
                rel.advance(ditto_replication::release_watermark(*p, h), None);
            }
            w
        });
        let p = ditto_replication::Primary::start(d, l, opts, on_change).map_err(io("starting replication"))?;
        if let Some(g) = &cfg.write_gate {
            let w = Arc::downgrade(&p);
            g.on_backups(crate::session::BackupsHook(Box::new(move |n, config, nodes| {
                if let Some(p) = w.upgrade() {
                    if let Some(nodes) = nodes {
                        p.set_counted_nodes(Some(nodes.iter().cloned().collect()));
                    }
                    p.set_backups_expected(n, config);
                }
            })));
        }
        tracing::info!("accepting backups on {repl_addr} (commit policy {})", policy.name());
        // A standalone primary that restarted under a policy that releases on backups'
        // acknowledgements takes writes only once enough of its backups say they hold
        // nothing above its restart point (`restart_settled`; docs/replication.md, "A
        // primary restarted under a policy that counts backups").
        if let (Some(record), Some((old, point))) = (p.restart_record(), reopened) {
            let (clear, more) = p.heard_since_restart(old, point);
            restart_refusal = ditto_replication::restart_settled(&record, old, point, &clear, &more).err();
            restart_wait = Some((Arc::downgrade(&p), old, point));
        }
        listening.repl = l_addr;
        sh.replication = crate::session::Replication::Primary { primary: Arc::clone(&p), policy, repl_addr };
        primary = Some(p);
    }
    if let Some(b) = &backup {
        sh.replication =
            crate::session::Replication::Backup { state: Arc::clone(&b.state), primary: b.primary.clone() };
    }
    if let Some(g) = &cfg.write_gate {
        sh.write_gate = Arc::clone(g);
    }
    // Closed, and said in the log, before the first connection is served (the gate the
    // connections see); the wait below says it again only when the reason changes.
    if let Some(why) = &restart_refusal {
        tracing::warn!("{why}");
        sh.write_gate.set(Some(why.clone()));
    }
    sh.primary_addr = match &backup {
        None => Some(crate::config::ClientAddr::new(
            format!("{}:{port}", cfg.bind),
            listening.tls.filter(|_| listening.plain.is_some()).map(|a| format!("{}:{}", cfg.bind, a.port())),
        )),
        Some(_) => cfg.cluster.as_ref().and_then(|c| c.primary_addr.clone()),
    };
    // Counters, uptime, client ids and (the engine being the same) SCAN cursors go on
    // from the role before.
    if let Some(prev) = lasting.hub.current() {
        sh.carry_over(&prev.sh);
    }
    let sh = Arc::new(sh);
    let metrics = Arc::clone(&lasting.metrics);
    // The previous role's tasks (its read view's ticker, its reclaimer) stop here: its
    // connections move to this role's as they next read.
    for t in lasting.role_tasks.drain(..) {
        t.abort();
    }
    // Deleted data is freed as the workers commit (every 128 commits or installs); this
    // frees it on an idle server too, so memory in use (and maxmemory) sees deletes soon.
    let db2 = Arc::clone(&db);
    let reclaimer = rt.spawn(async move {
        let mut tick = tokio::time::interval(RECLAIM_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            db2.reclaim();
        }
    });
    let ckpt_policy = cfg.checkpoint_policy();
    let checkpointer = durable.as_ref().and_then(|d| ckpt_policy.any().then(|| d.spawn_checkpointer(ckpt_policy)));
    if let Some(logger) = &logger {
        let releases = every_release(&release, &by_policy);
        logger.set_progress_listener(durability_listener(primary.as_ref(), releases)).map_err(|e| ServerError::Io {
            what: "installing the durability listener".into(),
            source: std::io::Error::other(e),
        })?;
        match &primary {
            Some(p) => p.recompute(),
            // (A log that failed before the listener was installed says so as the listener
            // would.)
            None => crate::release::on_log_progress(
                None,
                std::slice::from_ref(&release),
                logger.watermark(),
                logger.failure().as_ref(),
            ),
        }
    }
    // A backup's replies wait for its read view (DITTO.WAITTS, bounded); it moves as replay
    // and the primary's releases do. Polled every millisecond while someone waits; idle,
    // the task sleeps until a waiter queues (it polled a thousand times a second before).
    let wait_timeout = backup.as_ref().map(|_| Duration::from_millis(cfg.waitts_timeout_ms));
    if let Some(b) = &backup {
        let state = Arc::clone(&b.state);
        let r = Arc::clone(&release);
        let queued = r.new_waiters();
        lasting.role_tasks.push(rt.spawn(async move {
            loop {
                r.advance(Ts(state.visible.load(Ordering::Acquire)), None);
                // (Those that gave up are not counted: one whose ts never comes would keep
                // the task polling for good.)
                match r.waiting_still() {
                    0 => queued.notified().await,
                    _ => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
        }));
    }
    lasting.role_tasks.push(reclaimer);
    if let Some((p, old, point)) = restart_wait {
        let gate = Arc::clone(&sh.write_gate);
        lasting.role_tasks.push(rt.spawn(async move {
            let mut said = restart_refusal;
            loop {
                let Some(primary) = p.upgrade() else { return };
                // Read each turn: it changes when a person declares a backup lost.
                let Some(record) = primary.restart_record() else { return };
                let (clear, more) = primary.heard_since_restart(old, point);
                // Settled: the record is this run's alone from now on; a failed write keeps
                // the wait (and says why), tried again less often.
                let (outcome, again) = match ditto_replication::restart_settled(&record, old, point, &clear, &more) {
                    Ok(()) => (
                        primary
                            .settle_restart()
                            .map_err(|e| format!("this primary cannot record that its restart settled: {e}")),
                        Duration::from_millis(100),
                    ),
                    Err(why) => (Err(why), Duration::from_millis(10)),
                };
                drop(primary);
                match outcome {
                    Ok(()) => {
                        let heard: Vec<&str> = clear.iter().map(|b| b.as_str()).collect();
                        tracing::warn!(
                            "taking writes: backups {} hold nothing above ts {} of epoch {}, where this primary restarted",
                            heard.join(", "),
                            point.0,
                            old.0
                        );
                        gate.set(None);
                        return;
                    }
                    Err(why) if said.as_ref() != Some(&why) => {
                        tracing::warn!("{why}");
                        gate.set(Some(why.clone()));
                        said = Some(why);
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(again).await;
            }
        }));
    }

    let conn = Arc::new(Conn {
        sh: Arc::clone(&sh),
        limits: cfg.limits(),
        max_clients: cfg.max_clients,
        tls_handshake_timeout: Duration::from_secs(cfg.tls_handshake_timeout_s),
        tcp_keepalive: (cfg.tcp_keepalive_s > 0).then(|| Duration::from_secs(cfg.tcp_keepalive_s)),
        durable: Some(Arc::clone(&release)),
        by_policy: by_policy.clone(),
        wait_timeout,
        waitts_timeout: Duration::from_millis(cfg.waitts_timeout_ms),
        metrics,
    });
    let hub = Arc::clone(&lasting.hub);
    hub.set(Arc::clone(&conn));
    // A new role is not draining (the write gate outlives roles, with the connections: a
    // switchover's old primary that followed in place kept its drain until now).
    sh.write_gate.end_drains();
    // A failover waits for a promoted node's role to start: where its time went.
    if t_role.elapsed() > Duration::from_millis(20) {
        tracing::info!(
            "role started in {:.1} ms: {} in {:.1} ms, the keyspace in {:.1} ms",
            t_role.elapsed().as_secs_f64() * 1e3,
            if backup.is_some() { "joined the primary" } else { "the log opened" },
            t_opened.as_secs_f64() * 1e3,
            (t_shared - t_opened).as_secs_f64() * 1e3
        );
    }
    ready(&listening);
    // A standalone backup whose primary can no longer resume it from the log joins again
    // with a fresh copy of its checkpoint, on a thread (`rejoin`), while this role serves
    // its last read view (docs/replication.md, "A backup its primary can no longer resume").
    // A cluster's backups change roles as their supervisor says.
    let mut standalone_backup = backup.is_some() && cfg.cluster.is_none();
    let mut rejoin_how: Option<ditto_replication::JoinAgain> = None;
    let mut rejoining: Option<Rejoin> = None;
    let mut fencing: Option<tokio::task::JoinHandle<(ditto_replication::Backup, Result<(), String>)>> = None;
    let mut rejoin_retry: Option<Instant> = None;
    let mut rejoin_failures = 0u32;
    let mut rejoined: Option<Joined> = None;
    // The next role binds its listeners again (it serves another engine): on the ports
    // bound now, whatever the configuration asked (0 asks for any).
    let mut rejoin_cfg = cfg.clone();
    // (Its name, as the primary knows it, stays what it was.)
    rejoin_cfg.replica_name = Some(replica_name(&cfg));
    if let Some(a) = listening.plain {
        rejoin_cfg.port = a.port();
    }
    if let Some(a) = listening.tls {
        rejoin_cfg.tls_port = Some(a.port());
    }
    // A join again started (`rejoin`), or, if it could not be, when to try again.
    let start_rejoin = |how| {
        let primary = cfg.replica_of.as_deref().unwrap_or_default();
        match rejoin(&rejoin_cfg, primary, &dir, how, signals) {
            Ok(r) => (Some(r), None),
            Err(e) => {
                tracing::error!("joining the primary at {primary} again: {e}; trying again shortly");
                (None, Some(Instant::now() + REJOIN_RETRY_AFTER))
            }
        }
    };
    let change = rt.block_on(async {
        let mut change = None;
        let mut check = tokio::time::interval(REJOIN_CHECK_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = check.tick(), if standalone_backup && rejoining.is_none() && fencing.is_none() => {
                    if rejoin_how.is_none() {
                        rejoin_how = backup.as_ref().and_then(|b| b.join_again());
                    }
                    let Some(how) = rejoin_how else { continue };
                    if rejoin_retry.is_some_and(|t| Instant::now() < t) {
                        continue;
                    }
                    rejoin_retry = None;
                    if let Some(b) = backup.take() {
                        tracing::warn!(
                            "{}; joining it again, reads served at the last read view meanwhile",
                            b.failure().unwrap_or_default()
                        );
                        // Nothing of the old run may write the directory any more: the
                        // join cuts or replaces what it holds. (A task of its own: this
                        // loop goes on accepting clients and hearing signals meanwhile.)
                        fencing = Some(tokio::task::spawn_blocking(move || {
                            let r = b.fence("joining again", Duration::from_secs(10));
                            (b, r)
                        }));
                        continue;
                    }
                    (rejoining, rejoin_retry) = start_rejoin(how);
                }
                f = async { fencing.as_mut().expect("guarded").await }, if fencing.is_some() => {
                    fencing = None;
                    let (b, fenced) = f.expect("the fence's thread");
                    if let Err(e) = fenced {
                        tracing::error!("the backup could not be stopped to join again ({e}): it stays stopped");
                        backup = Some(b);
                        standalone_backup = false;
                        continue;
                    }
                    // Its replay threads end, and the directory's lock goes; the database
                    // stays with the connections reading it.
                    b.release();
                    (rejoining, rejoin_retry) = start_rejoin(rejoin_how.expect("decided"));
                }
                r = async { (&mut rejoining.as_mut().expect("guarded").done).await }, if rejoining.is_some() => {
                    if let Some(Rejoin { thread, .. }) = rejoining.take() {
                        // It has answered: it ends at once.
                        let _ = tokio::task::block_in_place(|| thread.join());
                    }
                    match r {
                        Ok(Ok(j)) => {
                            rejoined = Some(j);
                            break;
                        }
                        r => {
                            // 1 s, then twice as long after each failure, up to 30 s.
                            let wait = REJOIN_RETRY_AFTER.saturating_mul(1 << rejoin_failures.min(5)).min(REJOIN_RETRY_MAX);
                            rejoin_failures += 1;
                            let how = rejoin_how.unwrap_or(ditto_replication::JoinAgain::Copy);
                            // A cut that cannot be made (its own checkpoint lies above the
                            // point, so the primary says it holds more) is not tried again:
                            // a copy is, which discards nothing acknowledged (the running
                            // backup checked, `JoinAgain::CutAt`). Any other failure (the
                            // primary not there) tries the same again.
                            let cut_failed = matches!(
                                r,
                                Ok(Err(ditto_replication::BackupError::HoldsWhatThePrimaryLost(_) | ditto_replication::BackupError::Log(_)))
                            );
                            if cut_failed {
                                rejoin_how = Some(ditto_replication::JoinAgain::Copy);
                            }
                            let why = r.map_or_else(|_| "the join's thread ended".to_string(), |r| r.err().map(|e| e.to_string()).unwrap_or_default());
                            tracing::warn!(
                                "joining the primary at {} again ({how:?}) failed: {why}; trying again in {} s{}",
                                cfg.replica_of.as_deref().unwrap_or_default(),
                                wait.as_secs(),
                                if cut_failed { ", with a copy" } else { "" }
                            );
                            rejoin_retry = Some(Instant::now() + wait);
                        }
                    }
                }
                a = accept_on(plain.as_ref().map(|p| &p.0)) => Arc::clone(&conn).admit(a, None, &hub).await,
                a = accept_on(tls_listener.as_ref().map(|p| &p.0)) => Arc::clone(&conn).admit(a, acceptor.clone(), &hub).await,
                _ = signals.asked() => break,
                _ = sh.write_gate.stop_requested() => break,
                r = sh.write_gate.role_requested() => match (r, &backup) {
                    (crate::session::RoleRequest::Fence, Some(b)) => {
                        // Reads go on meanwhile on the runtime's workers; this waits at most
                        // the drain's bound.
                        let fence = || {
                            if failpoint("fence-in-place") {
                                // As a fence that stopped the link, then failed (a persister
                                // that did not end in time, say).
                                let _ = b.stop("fenced by the cluster", Duration::from_secs(10));
                                return Err("refused by the failpoint fence-in-place (DITTO_FAILPOINTS)".to_string());
                            }
                            b.fence("fenced by the cluster", Duration::from_secs(10))
                        };
                        match tokio::task::block_in_place(fence) {
                            // With how long ago it last acked its primary (final now): a
                            // failover waits for that primary's lease, which stands on it.
                            Ok(()) => match b.last_acked() {
                                Some(ago) => crate::say!("ditto server fenced, its last ack {} us ago", ago.as_micros()),
                                None => crate::say!("ditto server fenced, it never acked"),
                            },
                            Err(e) => crate::say!("ditto server fence failed: {e}"),
                        }
                    }
                    (r @ (crate::session::RoleRequest::Promote { .. } | crate::session::RoleRequest::Follow { .. }), Some(_)) => {
                        change = Some(r);
                        break;
                    }
                    (crate::session::RoleRequest::Drain { target, within }, None) => {
                        match (&primary, &logger) {
                            (Some(p), Some(l)) => {
                                // Off the accept loop: clients are answered (writes refused)
                                // while it waits.
                                let (sh, p, l, db) = (Arc::clone(&sh), Arc::clone(p), Arc::clone(l), Arc::clone(&db));
                                tokio::task::spawn_blocking(move || {
                                    match drain_for_switchover(&sh, &p, &l, &db, &target, within) {
                                        Ok((ts, took)) => crate::say!(
                                            "ditto server drained at ts {} in {:.1} ms",
                                            ts.0,
                                            took.as_secs_f64() * 1e3
                                        ),
                                        Err(e) => crate::say!("ditto server drain failed: {e}"),
                                    }
                                });
                            }
                            _ => crate::say!("ditto server drain failed: this server is not a primary with a log"),
                        }
                    }
                    // A switchover's old primary, drained, is fenced in place: it ships and
                    // releases nothing more, and its log is closed (what it holds is final,
                    // for the failover's report); it serves reads until it follows.
                    (crate::session::RoleRequest::Fence, None) if primary.is_some() && sh.write_gate.draining() => {
                        tokio::task::block_in_place(|| {
                            if let Some(p) = &primary {
                                p.stop();
                            }
                            if let Some(d) = &durable {
                                d.fence();
                            }
                        });
                        give_up_waits(primary.as_deref(), &release, &by_policy, "this primary was fenced for a switchover");
                        crate::say!("ditto server fenced");
                    }
                    // A switchover's old primary, drained, follows the new primary in place
                    // (`primary_follows_in_place` refuses, and the server exits, if it is not
                    // drained: its supervisor then restarts it as a backup).
                    (r @ crate::session::RoleRequest::Follow { .. }, None) if primary.is_some() => {
                        change = Some(r);
                        break;
                    }
                    (crate::session::RoleRequest::Drain { .. }, Some(_)) => {
                        crate::say!("ditto server drain failed: this server is a backup")
                    }
                    (crate::session::RoleRequest::CountInQuorum, Some(_))
                        if failpoint("count-ignored-once") && !COUNT_IGNORED.swap(true, Ordering::AcqRel) =>
                    {
                        crate::say!("ditto server ignored count (the failpoint count-ignored-once, DITTO_FAILPOINTS)")
                    }
                    (crate::session::RoleRequest::CountInQuorum, Some(b)) => {
                        b.count_in_quorum();
                        crate::say!("ditto server counts in the quorum");
                    }
                    (r, None) => crate::say!("ditto server {} refused: this server is not a backup", match r {
                        crate::session::RoleRequest::Fence => "fence",
                        crate::session::RoleRequest::Promote { .. } => "promotion",
                        crate::session::RoleRequest::Follow { .. } => "follow",
                        crate::session::RoleRequest::Drain { .. } => unreachable!("matched above"),
                        crate::session::RoleRequest::CountInQuorum => "count in the quorum",
                    }),
                },
            }
        }
        Ok::<_, ServerError>(change)
    })?;
    if let Some(r) = change {
        drop(checkpointer);
        // Connections already open go on reading (at the point, once it is reached) while
        // the engine is cut and sealed, and while the next role starts; then they move to
        // it (`Hub`), unless that role serves another engine.
        let next = match (r, backup.take()) {
            (crate::session::RoleRequest::Promote { run, repl_port, backups }, Some(b)) => {
                promote_in_place(&cfg, b, run, repl_port, backups)?
            }
            (crate::session::RoleRequest::Follow { primary: to, primary_addr, upto }, Some(b)) => {
                follow_in_place(&cfg, b, to, primary_addr, upto)?
            }
            (crate::session::RoleRequest::Follow { primary: to, primary_addr, upto }, None) => {
                let p = primary.take();
                let next = primary_follows_in_place(&cfg, &sh, p.clone(), durable.take(), &db, to, primary_addr, upto);
                give_up_waits(p.as_deref(), &release, &by_policy, "this primary follows another now");
                next?
            }
            _ => unreachable!("a change in place is a backup's, or a drained primary's follow"),
        };
        // Replay moved them up to the point and stopped there (nothing above is installed).
        let counts = sh.key_counts.values(Ts::MAX);
        return Ok(Some(NextRole { cfg: next.0, kept: Some(Kept { db: next.1, counts }), joined: None }));
    }
    if let Some(j) = rejoined {
        // The next role serves the fresh copy's engine: this role's connections close as
        // it starts (another engine), and its listeners are bound again on the same ports.
        return Ok(Some(NextRole { cfg: rejoin_cfg, kept: None, joined: Some(j) }));
    }
    // A fresh join still under way is cut short; one that joined meanwhile is stopped as
    // any backup is below (what it received made durable).
    if let Some(r) = rejoining.take() {
        r.cancel.cancel();
        let _ = r.thread.join();
        if let Ok(Ok(j)) = r.done.blocking_recv() {
            backup = Some(j.backup);
        }
    }
    tracing::info!("shutting down: flushing the log");
    if let Some(p) = &primary {
        p.stop();
    }
    // A backup makes what it received durable (a cluster's supervisor stops it so to fence
    // it, docs/cluster.md).
    if let Some(b) = &backup {
        if let Err(e) = b.stop("the server is shutting down", Duration::from_secs(10)) {
            tracing::error!("stopping replication: {e}");
            // What it acknowledged may not all be on disk: the exit status says so (a
            // cluster node then does not report this node's holdings).
            return Err(ServerError::Io { what: "stopping replication".into(), source: std::io::Error::other(e) });
        }
    }
    if let Some(d) = &durable {
        d.close();
    }
    // Stopped cleanly, everything shipped durable here: the next start waits for no backup.
    if let Some(p) = &primary {
        match p.forget_backups_after_clean_stop() {
            Ok(true) => tracing::info!("stopped cleanly: the next start waits for no backup"),
            Ok(false) => {}
            Err(e) => tracing::warn!("recording the clean stop in the quorum's record: {e}"),
        }
    }
    drop(checkpointer);
    Ok(None)
}

/// A primary that stops being one in place (fenced for a switchover, or following the
/// new primary) releases nothing more: what its policies hold is released first, and every
/// reply still waiting then fails with `why` (its commit may or may not survive: the
/// outcome is unknown), rather than wait for good.
fn give_up_waits(
    primary: Option<&ditto_replication::Primary>,
    release: &Arc<Release>,
    by_policy: &[(ditto_replication::CommitPolicy, Arc<Release>)],
    why: &str,
) {
    let recompute = primary.map(|p| move || p.recompute());
    let releases = every_release(release, by_policy);
    crate::release::give_up(recompute.as_ref().map(|f| f as &dyn Fn()), &releases, &why.into());
}

/// The server's policy's release and each other policy's.
/// The log's progress listener: the primary recomputes its releases, or without one the
/// releases move with the log's durability. It holds the primary weakly: the logger keeps
/// its listener for its life, and the primary holds the log (`Durable`, which holds the
/// logger): a strong handle made a cycle, and a primary that followed the next one in
/// place (a switchover) kept its log, its links and its engine for the process's life, one
/// more set per switchover (found by a review).
fn durability_listener(
    primary: Option<&Arc<ditto_replication::Primary>>,
    releases: Vec<Arc<Release>>,
) -> ditto_log::ProgressListener {
    let p = primary.map(Arc::downgrade);
    Box::new(move |w, failed| {
        // A primary gone releases nothing more (its replies were given up when it
        // stopped): never by this log's durability alone.
        let p = match &p {
            Some(weak) => match weak.upgrade() {
                Some(p) => Some(p),
                None => return,
            },
            None => None,
        };
        let recompute = p.as_ref().map(|p| move || p.recompute());
        crate::release::on_log_progress(recompute.as_ref().map(|f| f as &dyn Fn()), &releases, w, failed)
    })
}

fn every_release(
    release: &Arc<Release>,
    by_policy: &[(ditto_replication::CommitPolicy, Arc<Release>)],
) -> Vec<Arc<Release>> {
    std::iter::once(Arc::clone(release)).chain(by_policy.iter().map(|(_, r)| Arc::clone(r))).collect()
}

/// The failpoint `count-ignored-once` has ignored a `count` (it ignores the first only).
static COUNT_IGNORED: AtomicBool = AtomicBool::new(false);

/// A backup's name as its primary knows it: `--replica-name`, or the address and port it
/// serves on, the host's name standing for an address that means every interface
/// (backups on other hosts, each bound to 0.0.0.0:6380, say, are told apart: a restarted
/// primary counts its backups by name, `ditto_replication::restart`, and refuses a second
/// live link of a name, `ditto_replication::primary::NAME_TAKEN`).
fn replica_name(cfg: &Config) -> String {
    if let Some(n) = &cfg.replica_name {
        return n.clone();
    }
    let any = matches!(cfg.bind.as_str(), "0.0.0.0" | "::" | "[::]");
    let host = match any {
        true => host_name().unwrap_or_else(|| cfg.bind.clone()),
        false => cfg.bind.clone(),
    };
    match (cfg.port, &cfg.data_dir) {
        // Any port (`--port 0`): every such backup on the host would be `host:0` (and the
        // port it gets is known only once bound, and differs at its next start). Its data
        // directory tells it apart, and stays the same across its restarts.
        (0, Some(dir)) => {
            // Resolved (links, `..`, a trailing `/`), so that the same directory named
            // another way at the next start gives the same name; kept to what the quorum's
            // record and INFO can hold (no comma, no control character).
            let dir = std::fs::canonicalize(dir)
                .or_else(|_| std::path::absolute(dir).map(|d| d.components().collect::<std::path::PathBuf>()))
                .unwrap_or_else(|_| dir.clone());
            let dir: String = dir
                .display()
                .to_string()
                .chars()
                .map(|c| if crate::config::replica_name_char(c) { c } else { '_' })
                .collect();
            format!("{host}:0:{dir}")
        }
        (port, _) => format!("{host}:{port}"),
    }
}

/// This host's name (`gethostname`), if it has one.
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0)?;
    (rc == 0 && end > 0).then(|| String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Whether the failpoint `name` is set in `DITTO_FAILPOINTS` (`ditto_replication::failpoint`),
/// for the tests of a cluster's fallbacks: `fence-in-place`, `role-change-in-place`,
/// `role-change-crash-after-seal`, `promotion-fails-after-log`, `primary-start-slow`.
fn failpoint(name: &str) -> bool {
    ditto_replication::failpoint(name)
}

/// A fenced cluster backup cut in place at a failover's point `point` (`Backup::cut_at`:
/// it replays what it holds up to the point, and nothing above), its replica log sealed
/// there (`ditto_log::sealed`); `what` names the change in the line it prints
/// (on standard output: a cluster node prints it with the failover's other phases).
/// With `at_most` (a follower), it is cut where it holds every stream instead, if that is
/// earlier (`Backup::cut_at_most`). Returns the engine and the cut.
fn cut_and_seal(
    cfg: &Config,
    b: ditto_replication::Backup,
    point: Ts,
    at_most: bool,
    what: &str,
) -> Result<(Arc<Database>, Ts), ServerError> {
    let dir = cfg.data_dir.clone().expect("validated");
    let t0 = std::time::Instant::now();
    let failed = |e: String| ServerError::Io { what: format!("{what} in place"), source: std::io::Error::other(e) };
    if failpoint("role-change-in-place") {
        return Err(failed("refused by the failpoint role-change-in-place (DITTO_FAILPOINTS)".into()));
    }
    let (db, lock, point) = if at_most {
        b.cut_at_most(point, what, Duration::from_secs(60)).map_err(failed)?
    } else {
        let (db, lock) = b.cut_at(point, what, Duration::from_secs(60)).map_err(failed)?;
        (db, lock, point)
    };
    let replayed_s = t0.elapsed().as_secs_f64();
    let storage = ditto_log::storage::RealStorage;
    // The replica log sealed at the point (milliseconds; the checkpoint follows once the
    // node serves), as the newest of a chain if earlier seals are not yet checkpointed
    // away; with the chain full, the checkpoint at the point, before it serves
    // (docs/cluster.md).
    let t1 = std::time::Instant::now();
    let earlier = ditto_log::sealed::sealed(&dir)?.len();
    let sealed = if earlier < ditto_log::sealed::MAX_SEALED {
        ditto_log::sealed::seal_tail(&dir, point, &storage)?;
        let chain = if earlier == 0 { String::new() } else { format!(" (after {earlier} not yet checkpointed)") };
        format!("its replica log sealed at the point in {:.1} ms{chain}", t1.elapsed().as_secs_f64() * 1e3)
    } else {
        let info = ditto_log::replica::seal_at_point(&db, &dir, &storage)?;
        format!(
            "a checkpoint of {:.1} MB written in {:.2} s ({earlier} seals not yet checkpointed)",
            info.bytes as f64 / 1e6,
            info.seconds,
        )
    };
    if failpoint("role-change-crash-after-seal") {
        eprintln!("failpoint role-change-crash-after-seal: aborting");
        std::process::abort();
    }
    drop(lock);
    crate::say!(
        "{what} (in place): replayed to the point {} in {:.3} s, {sealed}; {:.3} s in all",
        point.0,
        replayed_s,
        t0.elapsed().as_secs_f64()
    );
    Ok((db, point))
}

/// A fenced cluster backup that follows the next epoch's primary in place
/// (`cut_and_seal`), then joins it with the engine it kept (`BackupOptions::engine`):
/// holding exactly the point, it resumes from the new primary's log. Returns the
/// backup's configuration and the engine.
fn follow_in_place(
    cfg: &Config,
    b: ditto_replication::Backup,
    primary: String,
    primary_addr: crate::config::ClientAddr,
    upto: u64,
) -> Result<(Config, ditto_log::Recovered), ServerError> {
    // A follower that held less than the point is cut where it holds everything; the new
    // primary sends it the rest, cut at the point (`PrimaryOptions::resume_from`).
    let learner = b.is_learner();
    let (db, cut) = cut_and_seal(cfg, b, Ts(upto), true, "follow")?;
    if cut.0 < upto {
        crate::say!(
            "follow: held every stream up to ts {} only; the new primary sends it the rest up to {upto}",
            cut.0
        );
    }
    let mut next = cfg.clone();
    next.replica_of = Some(primary);
    next.cluster = Some(crate::config::ClusterRun {
        upto: Some(upto),
        primary_addr: Some(primary_addr),
        hold_replay_at_release: true,
        // A learner follows the next primary as a learner (unless promoted meanwhile).
        learner,
        ..Default::default()
    });
    Ok((next, ditto_log::Recovered(db)))
}

/// A switchover's old primary, drained (writes refused; everything it committed durable,
/// and held by the new primary, up to `upto`: the switchover's point), follows the new
/// primary in place (docs/cluster.md, "A switchover's old primary follows in place"): its
/// log stops, is sealed at the point as the chain's newest link (`sealed::seal_own_log`),
/// and the engine it kept joins the new primary as a backup's, as a backup that follows in
/// place does. Its clients' connections stay open (the engine is the same), their writes
/// refused with the new primary's address from then on. Refused, before anything is
/// written, if it is not drained, if its engine's read view is not the point, or if its
/// log is not durable up to it: the server then exits, and its supervisor restarts it as a
/// backup from its directory (the old primary's rejoin).
#[allow(clippy::too_many_arguments)]
fn primary_follows_in_place(
    cfg: &Config,
    sh: &Shared,
    repl: Option<Arc<ditto_replication::Primary>>,
    durable: Option<ditto_log::Durable>,
    db: &Arc<Database>,
    to: String,
    primary_addr: crate::config::ClientAddr,
    upto: u64,
) -> Result<(Config, ditto_log::Recovered), ServerError> {
    let t0 = std::time::Instant::now();
    let failed = |e: String| ServerError::Io { what: "follow in place".into(), source: std::io::Error::other(e) };
    let d = durable.ok_or_else(|| failed("this server has no log".into()))?;
    if !sh.write_gate.draining() {
        return Err(failed("this primary is not drained for a switchover".into()));
    }
    if failpoint("role-change-in-place") {
        return Err(failed("refused by the failpoint role-change-in-place (DITTO_FAILPOINTS)".into()));
    }
    if let Some(p) = repl {
        p.stop();
    }
    // Other handles to the log (the stopped primary's threads, connections' release
    // paths) may outlive this one: the directory is given up explicitly. The engine's log
    // is detached: a commit would now be refused (`Database::detach_log`).
    d.close_and_release();
    drop(d);
    let (view, now) = (db.clock().visible_ts(), db.clock().now());
    let dir = cfg.data_dir.clone().expect("validated");
    // What the log holds on disk, not what its watermark says: a log that wrote no batch
    // in its epoch vouches on disk only for where it began, which a sealed link must reach.
    // Read from its batch headers; if that does not show it, the whole log is read.
    let on_disk = match ditto_log::recovery::primary_log_reach(&dir) {
        Ok(t) if t >= Ts(upto) => t,
        _ => {
            let (held, _) = ditto_log::recovery::primary_log_holdings(&dir, None)?;
            held.streams.iter().copied().min().unwrap_or(Ts::ZERO)
        }
    };
    if view != Ts(upto) || now != Ts(upto) || on_disk < Ts(upto) {
        return Err(failed(format!(
            "its engine reads at ts {} (clock at {}) and its log holds every stream on disk up to ts {}, not the point ts {upto}",
            view.0, now.0, on_disk.0
        )));
    }
    let t1 = std::time::Instant::now();
    ditto_log::sealed::seal_own_log(&dir, Ts(upto), &ditto_log::storage::RealStorage)?;
    crate::say!(
        "follow (in place): the drained primary's log sealed at the point {upto} in {:.1} ms; {:.3} s in all",
        t1.elapsed().as_secs_f64() * 1e3,
        t0.elapsed().as_secs_f64()
    );
    // The drain's refusal stays until the next role's connections are in place (`run_role`
    // clears it once the hub holds them): meanwhile the kept connections still belong to
    // this role, whose engine has no log.
    let mut next = cfg.clone();
    next.replica_of = Some(to);
    next.repl_port = None;
    next.cluster = Some(crate::config::ClusterRun {
        upto: Some(upto),
        primary_addr: Some(primary_addr),
        hold_replay_at_release: true,
        ..Default::default()
    });
    Ok((next, ditto_log::Recovered(Arc::clone(db))))
}

/// A fenced cluster backup promoted in place (docs/cluster.md, "In-place promotion and following"): it
/// keeps its engine, indexes and all, cut at the failover's point (`cut_and_seal`); the
/// primary's log starts from the checkpoint written there. Returns the primary's
/// configuration and the engine.
fn promote_in_place(
    cfg: &Config,
    b: ditto_replication::Backup,
    run: crate::config::ClusterRun,
    repl_port: u16,
    backups: usize,
) -> Result<(Config, ditto_log::Recovered), ServerError> {
    let point =
        Ts(run.upto.ok_or_else(|| ConfigError::Invalid("a promotion in place needs the recovery point".into()))?);
    let (db, _) = cut_and_seal(cfg, b, point, false, "promotion")?;
    let dir = cfg.data_dir.clone().expect("validated");
    // The followed epoch's run is kept (the primary refuses a backup of another run of
    // it); where that fails, the primary only checks less, as before it was kept, and the
    // followed epoch's record goes all the same.
    if let Err(e) = ditto_replication::backup::forget_followed(&dir) {
        tracing::warn!("promotion: {e}");
        let _ = std::fs::remove_file(dir.join("REPLICA_STATE"));
    }
    let mut next = cfg.clone();
    next.replica_of = None;
    next.repl_port = Some(repl_port);
    next.backups = backups;
    next.cluster = Some(crate::config::ClusterRun { primary_addr: None, ..run });
    Ok((next, ditto_log::Recovered(db)))
}

/// A cluster node promoted from a backup: its replica log, cut at the failover's recovery
/// point, becomes a checkpoint that the primary's log then starts from (docs/cluster.md),
/// and the engine it was replayed into is handed to the log as it is (not loaded again
/// from that checkpoint). It must hold everything up to the point (the failover fetched
/// what it lacked first); what it holds above is discarded.
fn promote_replica(
    dir: &std::path::Path,
    workers: usize,
    c: &crate::config::ClusterRun,
) -> Result<Option<ditto_log::Recovered>, ServerError> {
    let rdir = ditto_log::replica::replica_dir(dir);
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
    // A primary's own log of an earlier epoch: an old primary chosen as a failover's last
    // resort (no backup could fetch what it lacked). Its log is cut at the point first,
    // as an old primary that rejoins cuts it, and refused, before anything is rewritten,
    // unless it reaches the point. (Decided on its segments: a `replica/` left empty by a
    // try cut short does not make it a backup's directory.)
    let own = ditto_log::recovery::primary_log_epoch(dir).map_or(0, |e| e.0);
    if let (Some(p), true) = (c.upto, own > 0 && own < c.epoch) {
        let opened = ditto_log::replica::open_own_log_at(dir, workers, &storage, Ts(p))?;
        crate::say!(
            "promotion: its own log of epoch {own} cut at the point {p} in {:.2} s",
            opened.report.total_seconds
        );
        let ditto_log::replica::ReplicaOpen { db, lock, .. } = opened;
        drop(lock);
        let _ = std::fs::remove_dir(&rdir);
        return Ok(Some(ditto_log::Recovered(db)));
    }
    if !rdir.exists() {
        return Ok(None); // a primary's own directory (the first epoch, or a restart)
    }
    // (A cluster's promotion is given its epoch by its node at every start, and a crash
    // mid-way is finished from its record: `backup::finish_cut_short_promotion`.)
    promote_replica_dir(dir, workers, c.upto.map(Ts), &c.epoch_cuts, None).map(Some)
}

/// A backup's directory opened whole as a primary's (a cluster's promotion, `--promote`):
/// its checkpoint and its replica log up to its cut (refused, before anything is
/// rewritten, if it does not hold everything up to `upto` when given), then the replica
/// log and the followed epoch go. The open writes a checkpoint at the cut first, so a
/// crash at any step leaves a directory that opens whole.
fn promote_replica_dir(
    dir: &std::path::Path,
    workers: usize,
    upto: Option<Ts>,
    older: &[ditto_log::replica::EpochCut],
    next_epoch: Option<ditto_log::Epoch>,
) -> Result<ditto_log::Recovered, ServerError> {
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
    // A directory that missed a failover: a crash after the checkpoint at the point below
    // would leave it looking as if it held what that failover discarded; the record lets
    // its node tell (`backup::finish_cut_short_promotion`).
    let followed =
        ditto_replication::backup::read_followed_epoch(dir).map_err(io("reading the epoch this backup followed"))?;
    let marked = matches!((upto, followed, older.is_empty()), (Some(_), Some(_), false));
    if let (Some(p), Some(f), true) = (upto, followed, marked) {
        ditto_replication::backup::mark_promotion(dir, f, p).map_err(io("recording the promotion"))?;
    }
    let opened = match upto {
        Some(p) => ditto_log::replica::open_replica_at(dir, workers, &storage, p, older)?,
        None => ditto_log::replica::open_replica_upto(dir, workers, &storage, None)?,
    };
    if marked && failpoint("promotion-crash-after-checkpoint") {
        eprintln!("failpoint promotion-crash-after-checkpoint: aborting");
        std::process::abort();
    }
    let r = &opened.report;
    // On standard output: a cluster node prints it with the failover's other phases.
    crate::say!(
        "promotion: checkpoint at ts {} loaded in {:.2} s, {} transactions of the replica log replayed in {:.2} s ({} above the point discarded), {} keys indexed in {:.2} s, a checkpoint of {:.1} MB written in {:.2} s; {:.2} s in all",
        r.checkpoint_ts.map_or(0, |t| t.0),
        r.checkpoint_seconds,
        r.log_txns_replayed,
        r.log_seconds,
        r.log_txns_dropped_above_cut,
        r.index_keys,
        r.index_seconds,
        r.checkpoint_written_bytes as f64 / 1e6,
        r.checkpoint_write_seconds,
        r.total_seconds
    );
    let ditto_log::replica::ReplicaOpen { db, lock, .. } = opened;
    drop(lock);
    // The epoch the primary is to write, on disk before the followed one goes with the
    // replica log (`raise_epoch_floor`).
    if let Some(e) = next_epoch {
        ditto_log::checkpoint::raise_epoch_floor(dir, e, &*storage)?;
    }
    ditto_replication::backup::end_promotion(dir).map_err(|e| io("ending the promotion")(std::io::Error::other(e)))?;
    Ok(ditto_log::Recovered(db))
}

impl Conn {
    /// Takes one accepted connection: counts it against `max_clients` and starts its task.
    async fn admit(
        self: Arc<Self>,
        accepted: std::io::Result<(TcpStream, SocketAddr)>,
        tls: Option<TlsAcceptor>,
        hub: &Arc<Hub>,
    ) {
        let sh = &self.sh;
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                return;
            }
        };
        sh.stats.connections_received.fetch_add(1, Ordering::Relaxed);
        // Counted here, before the task starts, so a burst of connections cannot all pass
        // the check; `serve` gives the slot back.
        if sh.stats.connected_clients.fetch_add(1, Ordering::AcqRel) >= self.max_clients {
            sh.stats.connected_clients.fetch_sub(1, Ordering::AcqRel);
            sh.stats.rejected_connections.fetch_add(1, Ordering::Relaxed);
            // A TLS client cannot read a plaintext error; it just sees the close.
            if tls.is_none() {
                tokio::spawn(async move {
                    let mut s = stream;
                    let _ = s.write_all(b"-ERR max number of clients reached\r\n").await;
                });
            }
            return;
        }
        let hub = Arc::clone(hub);
        tokio::spawn(async move { self.serve(stream, tls, hub).await });
    }

    /// Serves one client, over TLS when `tls` is set; `admit` has counted it in
    /// `connected_clients`, and it is counted out however its task ends (`Admitted`).
    async fn serve(self: Arc<Self>, stream: TcpStream, tls: Option<TlsAcceptor>, hub: Arc<Hub>) {
        let _admitted = Admitted(Arc::clone(&self.sh.stats));
        let _ = stream.set_nodelay(true);
        // As Redis's `tcp-keepalive`: probes every third of the idle time, three unanswered
        // close it. Before 2026-12-06 clients' sockets had none, and one whose host died
        // idle held its slot and buffers for the process's life (found by a review).
        if let Some(idle) = self.tcp_keepalive {
            let ka = socket2::TcpKeepalive::new()
                .with_time(idle)
                .with_interval((idle / 3).max(Duration::from_secs(1)))
                .with_retries(3);
            if let Err(e) = socket2::SockRef::from(&stream).set_tcp_keepalive(&ka) {
                tracing::debug!("TCP keepalive on a client's connection: {e}");
            }
        }
        // (The socket's, under TLS too: open for as long as the connection is served.)
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        let done = match tls {
            None => Arc::clone(&self).serve_inner(stream, fd, false, &hub).await,
            Some(acceptor) => match tokio::time::timeout(self.tls_handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(s)) => Arc::clone(&self).serve_inner(s, fd, true, &hub).await,
                Ok(Err(e)) => {
                    self.sh.stats.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
                    Err(e)
                }
                Err(_) => {
                    self.sh.stats.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
                    Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"))
                }
            },
        };
        if let Err(e) = done {
            tracing::debug!("connection closed: {e}");
        }
    }

    /// Serves one client's requests until it closes. The connection moves to the next
    /// role's `Conn` (`Hub`) when its server changes its role in place, between two
    /// requests: its session (database, name, authentication, MULTI and WATCH state) goes
    /// on, as it does on a Redis replica that is promoted or follows another primary.
    /// `fd` is the connection's socket (`stream`'s, or the one under its TLS).
    async fn serve_inner<S: AsyncRead + AsyncWrite + Unpin>(
        self: Arc<Self>,
        mut stream: S,
        fd: std::os::fd::RawFd,
        tls: bool,
        hub: &Hub,
    ) -> std::io::Result<()> {
        let mut conn = self;
        // The hub's generation last seen (none yet: a role may have changed between the
        // accept and now).
        let mut seen = u64::MAX;
        let mut session = Session::new(&conn.sh);
        session.tls = tls;
        let mut parser = RequestParser::default();
        let mut inbuf = BytesMut::with_capacity(16 * 1024);
        // Whether `inbuf` grew past 1 MiB for a large request: once that request is handled
        // the buffer is replaced, as parsed requests are split off it and its remainder
        // would otherwise keep the whole allocation alive.
        let mut inbuf_large = false;
        let mut out = BytesMut::with_capacity(16 * 1024);
        // When each buffered request was parsed, and which command it was.
        let mut started: Vec<(Instant, Option<usize>)> = Vec::new();
        // The metrics shard: the engine worker of the thread that ran the last command.
        let mut shard = 0usize;
        // Requests parsed but not handled yet, handled before any further parsing: the one
        // that ended a run of GETs or SETs, and the part of a run of GETs left for later
        // because its replies reached the output bound.
        let mut pending = VecDeque::new();
        // The outcomes of the request (or run) being handled; reused.
        let mut outcomes: Vec<Outcome> = Vec::new();
        // What the replies wait for, per commit policy (a connection's policy may change
        // mid-pipeline, and a transaction may choose its own): each reply waits under the
        // policy it was given, and none leaves before all are released. Drained at each
        // flush; reused.
        let mut waits: Vec<(Option<ditto_replication::CommitPolicy>, Ts)> = Vec::new();
        // Each reply's end in `out`, what it waits for, and whether its request may have
        // written (a write, an EXEC, a request not known: its outcome is unknown if the wait
        // fails on a primary).
        let mut marks: Vec<(usize, Ts, bool)> = Vec::new();
        // What the last wait for held reads that gave up saw (`Conn::gate_marker`).
        let mut gave_up: Option<(u64, u64)> = None;
        // The hub's generation whose role the session last told of its commit policy
        // (`Session::role_changed`): both places that follow the hub move `seen`.
        let mut told = seen;
        loop {
            hub.follow(&mut conn, &mut seen);
            if told != seen {
                told = seen;
                session.role_changed(&conn.sh);
            }
            // Handle every complete request buffered (up to the output bound).
            let mut close = false;
            // The server changed its role in place while a WAIT blocked (a drained primary
            // following the new one): the requests after it are handled in the next round,
            // under the new role (`hub.follow`), not with this one's (a SET got "log
            // detached" rather than READONLY naming the new primary; found by a review).
            let mut role_moved = false;
            let mut replies = 0usize;
            // The batch is a DITTO.WAITTS alone (`Session::may_block` and `ends_batch`):
            // on a primary its wait is bounded (`waitts_timeout`).
            let mut lone_waitts = false;
            // Where each reply ends in `out`, and the timestamp it waits for: on a backup a
            // wait that times out fails only the replies it covers.
            marks.clear();
            while out.len() < conn.sh.max_output_bytes && started.len() < BATCH_REQUESTS_MAX {
                match next_request(&mut pending, &mut parser, &mut inbuf, &session.limits(&conn.limits)) {
                    Ok(None) => break,
                    Ok(Some(args)) if args.is_empty() => continue,
                    Ok(Some(args)) => {
                        // The role changed since this batch began (`hub.follow` above):
                        // this request and those after it are handled in the next round,
                        // under the new role. Before 2026-12-06 the rest of a pipeline ran
                        // with the old one: a SET on a demoted primary got "log detached"
                        // rather than READONLY naming the new primary, a promoted backup
                        // answered READONLY naming the old one (found by a review).
                        if hub.generation.load(Ordering::Acquire) != seen {
                            pending.push_front(Ok(Some(args)));
                            break;
                        }
                        if session.may_block(&args) && !out.is_empty() {
                            pending.push_front(Ok(Some(args)));
                            break;
                        }
                        if session.read_held(&args, &conn.sh) && gave_up != Some(conn.gate_marker(hub)) {
                            if !out.is_empty() {
                                // The replies before it go out first: it may wait.
                                pending.push_front(Ok(Some(args)));
                                break;
                            }
                            match conn.wait_reads_released(hub, seen).await {
                                // The role changed meanwhile: the next one handles it.
                                Waited::Moved => {
                                    pending.push_front(Ok(Some(args)));
                                    break;
                                }
                                Waited::Released => {}
                                // Answered LOADING; the held reads after it are too, at
                                // once, until the release or the role moves.
                                Waited::GaveUp => gave_up = Some(conn.gate_marker(hub)),
                            }
                        }
                        // Where reads could become held while it runs (a cut to follow a
                        // new primary), it is handled again if they did (below).
                        let gate = session.read_gate(&args, &conn.sh).map(|g| (g, args.clone()));
                        let ends_batch = session.ends_batch(&args);
                        lone_waitts = ends_batch && out.is_empty();
                        // A run of plain GETs, or of plain SETs, is answered together
                        // (`Session::handle_run`).
                        let work = match session.run_kind(&args, &conn.sh) {
                            None => Work::One(args),
                            Some(kind) => {
                                let mut run = vec![args];
                                while run.len() < RUN_MAX {
                                    match next_request(
                                        &mut pending,
                                        &mut parser,
                                        &mut inbuf,
                                        &session.limits(&conn.limits),
                                    ) {
                                        Ok(Some(a)) if a.is_empty() => continue,
                                        Ok(Some(a)) if session.run_kind(&a, &conn.sh) == Some(kind) => run.push(a),
                                        // Nothing complete yet: not set aside, or, read
                                        // again after bytes came in (while the replies
                                        // waited), it would end the next turn with those
                                        // bytes unparsed, and the connection would wait
                                        // for more input with a request in its buffer.
                                        Ok(None) => break,
                                        other => {
                                            pending.push_front(other);
                                            break;
                                        }
                                    }
                                }
                                match run.len() {
                                    1 => Work::One(run.pop().expect("one request")),
                                    _ => Work::Run(kind, run),
                                }
                            }
                        };
                        let t = Instant::now();
                        match work {
                            Work::One(args) => {
                                // (Where it may be answered LOADING below: an EXEC on a
                                // backup, whose queued SELECT, HELLO, CLIENT SETNAME and
                                // AUTH are then undone.)
                                let exec = args[0].eq_ignore_ascii_case(b"EXEC");
                                let before = gate.as_ref().filter(|_| exec).map(|_| session.conn_state());
                                if exec {
                                    session.set_exec_gate(gate.as_ref().map(|(g, _)| *g));
                                }
                                let o = with_worker(&conn.sh.db, |w| {
                                    shard = w.id().0 as usize;
                                    session.handle(args, &conn.sh, w)
                                });
                                let mut o = o.unwrap_or_else(no_worker);
                                // A data read its session refused because reads became held
                                // after this loop looked (a cut to follow a new primary began
                                // between the two, and the generation it bumps may come only
                                // after the refusal): handled again, through the wait a read
                                // that meets held reads is given, as the refusal changed
                                // nothing (before 2026-12-06 it went out as "LOADING ...
                                // changing its role", seen once in CI; not an EXEC, whose
                                // queue is gone, nor once a wait gave up).
                                if let Some((_, args)) = gate.as_ref().filter(|(_, a)| {
                                    o.reply.is_error()
                                        && !a[0].eq_ignore_ascii_case(b"EXEC")
                                        && session.read_held(a, &conn.sh)
                                        && gave_up != Some(conn.gate_marker(hub))
                                }) {
                                    pending.push_front(Ok(Some(args.clone())));
                                    break;
                                }
                                // (Not where the EXEC compared the gate after it read, and then
                                // ran a command acting outside the connection: its reads
                                // stand, and what it ran cannot be undone.)
                                let changed = gate.filter(|(g, _)| conn.gate_gen() != *g).filter(|(_, a)| {
                                    !a[0].eq_ignore_ascii_case(b"EXEC") || !session.exec_gate_checked()
                                });
                                if let Some((_, args)) = changed {
                                    if !args[0].eq_ignore_ascii_case(b"EXEC") {
                                        pending.push_front(Ok(Some(args)));
                                        break;
                                    }
                                    // A transaction is not run twice (its queue is gone):
                                    // it read nothing that may be shown, and what its queued
                                    // connection commands changed (the database, the name,
                                    // the protocol, the authentication) is undone, as its
                                    // other refusals undo it (before 2026-12-06 the
                                    // database alone: a queued HELLO 3 left a client told
                                    // "run it again" speaking RESP3; found by a review).
                                    if let Some(b) = before {
                                        session.restore(b);
                                    }
                                    o.reply = Reply::err(crate::session::EXEC_ROLE_CHANGED);
                                }
                                outcomes.push(o);
                            }
                            Work::Run(kind, mut run) => {
                                let budget = conn.sh.max_output_bytes - out.len();
                                match with_worker(&conn.sh.db, |w| {
                                    shard = w.id().0 as usize;
                                    session.handle_run(kind, &run, budget, &conn.sh, w)
                                }) {
                                    Ok(_) if gate.as_ref().is_some_and(|(g, _)| conn.gate_gen() != *g) => {
                                        // Reads became held while the run of GETs read: it is
                                        // handled again, each GET alone.
                                        for r in run.drain(..).rev() {
                                            pending.push_front(Ok(Some(r)));
                                        }
                                        break;
                                    }
                                    Ok(v) => {
                                        // What the output bound left for later, in order.
                                        for r in run.drain(v.len()..).rev() {
                                            pending.push_front(Ok(Some(r)));
                                        }
                                        outcomes.extend(v);
                                    }
                                    Err(e) => outcomes.extend(run.iter().map(|_| no_worker(e))),
                                }
                            }
                        }
                        for o in outcomes.drain(..) {
                            started.push((t, o.cmd));
                            let before = out.len();
                            let reply = match o.replicas {
                                Some(w) => match conn.wait_replicas(w, &mut stream, &mut inbuf, hub, seen).await {
                                    Some(n) => {
                                        inbuf_large |= inbuf.capacity() > 1 << 20;
                                        role_moved |= hub.generation.load(Ordering::Acquire) != seen;
                                        Reply::Int(n as i64)
                                    }
                                    // The client left while it waited: nothing to answer.
                                    None => return Ok(()),
                                },
                                None => o.reply,
                            };
                            reply.encode(session.proto, &mut out);
                            let size = out.len() - before;
                            if size > conn.sh.max_output_bytes {
                                out.truncate(before);
                                Reply::err(format!(
                                    "ERR reply of {size} bytes is over max_output_bytes ({})",
                                    conn.sh.max_output_bytes
                                ))
                                .encode(session.proto, &mut out);
                            }
                            replies += 1;
                            let may_write = o.cmd.is_none_or(|i| {
                                crate::commands::SPECS[i].write || crate::commands::SPECS[i].name == "EXEC"
                            });
                            marks.push((out.len(), o.wait, may_write));
                            let p = o.policy.or(session.policy());
                            match waits.iter_mut().find(|w| w.0 == p) {
                                Some(w) => w.1 = w.1.max(o.wait),
                                None => waits.push((p, o.wait)),
                            }
                            close |= o.close;
                        }
                        if close || ends_batch || role_moved {
                            break;
                        }
                    }
                    Err(e) => {
                        conn.sh.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                        Reply::err(format!("ERR {e}")).encode(session.proto, &mut out);
                        close = true;
                        break;
                    }
                }
            }
            if !out.is_empty() {
                let handled = Instant::now();
                // Made on a backup (its replies read at its view): decided before the wait,
                // which may move the connection to a new primary's role meanwhile.
                let made_on_backup = conn.wait_timeout.is_some();
                // A DITTO.WAITTS waits for the read view on a backup, for the release on a
                // primary (as a write's reply does), bounded on both and across a change
                // of role meanwhile: past it only its own reply fails, nothing written and
                // the connection going on (before 2026-12-04 a primary's had no bound, nor
                // one a backup promoted in place moved to its release).
                let bound = lone_waitts.then_some(conn.waitts_timeout);
                let mut timed_out = None;
                let waited;
                {
                    let wait_all = async {
                        let each = async {
                            for (p, ts) in waits.drain(..) {
                                Conn::wait_moving(&mut conn, hub, &mut seen, ts, p).await?;
                            }
                            Ok(())
                        };
                        let Some(t) = bound else { return each.await };
                        match tokio::time::timeout(t, each).await {
                            Ok(r) => r,
                            Err(_) => {
                                timed_out = Some(t);
                                Ok(())
                            }
                        }
                    };
                    tokio::pin!(wait_all);
                    // The client is read meanwhile (`watch_while_waiting`): one gone while
                    // the release stalls held its slot and buffers for good.
                    match watch_while_waiting(&mut wait_all, &mut stream, fd, &mut inbuf).await {
                        Some(w) => waited = w,
                        None => return Ok(()),
                    }
                    // (What it read ahead may have grown the buffer: given back once used.)
                    inbuf_large |= inbuf.capacity() > 1 << 20;
                }
                if let (Some(t), Ok(())) = (timed_out, &waited) {
                    let &(_, ts, _) = marks.last().expect("the DITTO.WAITTS's reply");
                    out.clear();
                    Reply::err(conn.waitts_timed_out(t, ts, session.policy())).encode(session.proto, &mut out);
                }
                // What this reply says was written (or read) is the server's to show from
                // now on: a later SCAN or KEYS, this client's or another's, takes its
                // snapshot at or above it (`session::fresh_snapshot`).
                if waited.is_ok() && timed_out.is_none() && !made_on_backup {
                    // (Looked at first: a read-modify-write of the line every connection
                    // shares only where this batch moves it.)
                    if let Some(top) = marks.iter().map(|&(_, ts, _)| ts.0).max() {
                        if top > conn.sh.acked.load(Ordering::Acquire) {
                            conn.sh.acked.fetch_max(top, Ordering::AcqRel);
                        }
                    }
                }
                if let Err(failed) = waited {
                    // On a backup the only wait that fails is a read view that did not get
                    // there in time: nothing was written, the connection goes on, and only
                    // the replies that read above where the view got fail; the others (a
                    // SELECT, a MULTI, an AUTH, reads below it) went through and say so.
                    // On a primary every reply fails, saying why (its log failed; it was
                    // fenced for a switchover; it follows another primary now), and the
                    // connection closes where a request that may have written is among them,
                    // whose outcome is unknown; one that cannot have (a read, a SELECT)
                    // says it was not answered and nothing was written, and the connection
                    // goes on (before 2026-12-06 a read on a switchover's old primary,
                    // between its join of the new one and its move to the backup role, was
                    // answered "outcome unknown" and its connection closed; a review). A backup's batch moved to a new primary (promoted in
                    // place) is still a backup's: before, every reply of it failed,
                    // a SELECT's whose effect stood too, and the connection closed.
                    let reached = match made_on_backup {
                        true => Some(conn.durable.as_ref().map_or(Ts(0), |r| r.watermark())),
                        false => None,
                    };
                    let all = std::mem::take(&mut out);
                    let mut start = 0;
                    for &(end, ts, may_write) in &marks {
                        match reached {
                            Some(r) if ts <= r => out.extend_from_slice(&all[start..end]),
                            Some(_) => Reply::err(format!("ERR {failed}")).encode(session.proto, &mut out),
                            None if may_write => {
                                Reply::err(format!("ERR {failed} (outcome unknown)")).encode(session.proto, &mut out)
                            }
                            None => Reply::err(format!("ERR {failed} (not answered; it wrote nothing)"))
                                .encode(session.proto, &mut out),
                        }
                        start = end;
                    }
                    // (A protocol error's reply, which ends the batch, waits for nothing.)
                    out.extend_from_slice(&all[start..]);
                    debug_assert_eq!(marks.len(), replies);
                    close |= reached.is_none() && marks.iter().any(|&(_, _, may_write)| may_write);
                }
                // (The client's requests are read meanwhile: one that sends a whole pipeline
                // before it reads a reply would otherwise never finish sending.)
                // (Flushed too: TLS buffers records until flushed.) A connection that has
                // not authenticated reads little ahead: before 2026-12-07 it was held to
                // Redis's request limits (`Limits::unauthenticated`) but not here, and a
                // client without the password that sent 80 MB of PINGs and read nothing
                // made the server hold 64 MiB of them, then their NOAUTH replies (found by
                // a review).
                let ahead = match session.authed() {
                    true => conn.sh.max_output_bytes,
                    false => UNAUTHENTICATED_READ_AHEAD_MAX,
                };
                write_reading_ahead(&mut stream, &out, &mut inbuf, ahead).await?;
                inbuf_large |= inbuf.capacity() > 1 << 20;
                out.clear();
                // Latency: parsed to written. Handling time (INFO commandstats): the gap to
                // the next request's start, or to the end of handling for the last one.
                let now = Instant::now();
                for (k, &(t, cmd)) in started.iter().enumerate() {
                    conn.metrics.record(shard, cmd, now - t);
                    if let Some(c) = cmd {
                        let next = started.get(k + 1).map_or(handled, |n| n.0);
                        let ns = next.saturating_duration_since(t).as_nanos() as u64;
                        conn.sh.stats.command(shard, c).nanos.fetch_add(ns, Ordering::Relaxed);
                    }
                }
                started.clear();
                if out.capacity() > 1 << 20 {
                    out = BytesMut::with_capacity(16 * 1024);
                }
                // The per-request bookkeeping of a batch too, as its output is: a batch of
                // half a million requests (read ahead while a release stalled) left each
                // about 25 MB for the connection's life (found by a review, 2026-12-05).
                if started.capacity() > REQUESTS_KEPT_MAX {
                    started = Vec::new();
                }
                if marks.capacity() > REQUESTS_KEPT_MAX {
                    marks = Vec::new();
                }
                if !close {
                    continue;
                }
            }
            if close {
                stream.shutdown().await?;
                return Ok(());
            }
            // A large request grew the buffer: give the memory back once it is consumed (as
            // `out` above), or an idle connection would keep it for good.
            if inbuf_large && inbuf.is_empty() {
                inbuf = BytesMut::with_capacity(16 * 1024);
                inbuf_large = false;
            }
            if !pending.is_empty() {
                continue; // a request set aside for the next role
            }
            inbuf.reserve(16 * 1024);
            if stream.read_buf(&mut inbuf).await? == 0 {
                return Ok(());
            }
            inbuf_large |= inbuf.capacity() > 1 << 20;
        }
    }

    /// A data read on a backup whose reads are held (`BackupState::reads_held`: its run
    /// started, or it was cut to follow a new primary, above what its primary has
    /// released) waits for the release, polled every millisecond, up to
    /// `READS_HELD_WAIT`: as a rule the new primary's first frames bring it within
    /// milliseconds. False if the role changed meanwhile (the hub's generation is no
    /// longer `seen`: the next role handles the read); true otherwise (still held after the
    /// wait, the read answers LOADING).
    async fn wait_reads_released(&self, hub: &Hub, seen: u64) -> Waited {
        let Some(state) = self.backup() else { return Waited::Released };
        let t0 = Instant::now();
        let until = t0 + READS_HELD_WAIT;
        let waited = loop {
            if state.reads_held().is_none() {
                break Waited::Released;
            }
            if hub.generation.load(Ordering::Acquire) != seen {
                break Waited::Moved;
            }
            if Instant::now() >= until {
                break Waited::GaveUp;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        state.reads_waited.fetch_add(1, Ordering::Relaxed);
        state.reads_waited_us_max.fetch_max(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        waited
    }

    /// This role's backup state, if it is a backup.
    fn backup(&self) -> Option<&ditto_replication::BackupState> {
        match &self.sh.replication {
            crate::session::Replication::Backup { state, .. } => Some(state),
            _ => None,
        }
    }

    /// The backup's gate generation (`BackupState::gate_gen`; 0 on a primary).
    fn gate_gen(&self) -> u64 {
        self.backup().map_or(0, |s| s.gate_gen.load(Ordering::Acquire))
    }

    /// What a wait for held reads that gave up saw: the release and the role. Until one of
    /// them moves, held reads are answered LOADING without waiting again (a pipeline of
    /// them would otherwise wait 500 ms each).
    fn gate_marker(&self, hub: &Hub) -> (u64, u64) {
        let released = self.backup().map_or(0, |s| s.released.load(Ordering::Acquire));
        (released, hub.generation.load(Ordering::Acquire))
    }

    /// Redis's WAIT: waits until `w.n` backups have received every commit up to `w.ts`, or
    /// the timeout passes, or the server changes its role in place (the hub's generation
    /// moves from `seen`); how many have. It wakes when a backup's acknowledgements are read
    /// (`Primary::holdings_moved`; it polled the links every millisecond before 2026-12-02). Meanwhile it reads what the
    /// client sends into `inbuf` (handled after the WAIT), so that a client that closes its
    /// connection ends the wait: `None` (a `WAIT n 0` that can never be met held its task
    /// and its client slot for good). A client that sends `WAIT_READ_AHEAD` behind it gets
    /// its answer then, as at its timeout (the read-ahead, and the watch, are bounded).
    async fn wait_replicas<S: AsyncRead + Unpin>(
        &self,
        w: crate::session::WaitReplicas,
        stream: &mut S,
        inbuf: &mut BytesMut,
        hub: &Hub,
        seen: u64,
    ) -> Option<usize> {
        let deadline = (!w.timeout.is_zero()).then(|| tokio::time::Instant::now() + w.timeout);
        let primary = match &self.sh.replication {
            crate::session::Replication::Primary { primary, .. } => Some(Arc::clone(primary)),
            _ => None,
        };
        loop {
            // Both enabled before the count is read: a move between is not missed.
            let moved = primary.as_ref().map(|p| p.holdings_moved());
            let changed = hub.changed.notified();
            tokio::pin!(moved, changed);
            if let Some(m) = moved.as_mut().as_pin_mut() {
                m.enable();
            }
            changed.as_mut().enable();
            let n = primary.as_ref().map_or(0, |p| p.replicas_received(w.ts));
            if n >= w.n
                || deadline.is_some_and(|d| tokio::time::Instant::now() >= d)
                || hub.generation.load(Ordering::Acquire) != seen
                || inbuf.len() >= WAIT_READ_AHEAD
            {
                return Some(n);
            }
            tokio::select! {
                // (No primary: nothing moves the count, so only the timeout or the client ends it.)
                _ = async { match moved.as_mut().as_pin_mut() { Some(m) => m.await, None => std::future::pending().await } } => {}
                _ = &mut changed => {}
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {}
                // (`read_buf` is cancel safe: if the sleep ends first, nothing was read.)
                r = stream.read_buf(inbuf) => match r {
                    Ok(0) => return None,
                    Err(e) => {
                        tracing::debug!("a connection waiting in WAIT: {e}");
                        return None;
                    }
                    Ok(_) => {}
                },
            }
        }
    }

    /// `wait_durable` on `conn`'s role, moving to the next role if the server changes
    /// its role meanwhile and waiting there instead. A backup's read handled just before
    /// a promotion in place may read at a timestamp its old role's read view never reaches
    /// (the new primary's clock starts above the point): the new role releases it.
    async fn wait_moving(
        conn: &mut Arc<Conn>,
        hub: &Hub,
        seen: &mut u64,
        ts: Ts,
        policy: Option<ditto_replication::CommitPolicy>,
    ) -> Result<(), Arc<str>> {
        // Only a backup changes its role in place: a primary's replies (the commit path)
        // wait on its own release alone, without registering with the hub.
        if !conn.sh.read_only {
            return conn.wait_durable(ts, policy).await;
        }
        loop {
            // Registered before the generation is read, so a change between is not missed.
            let changed = hub.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            hub.follow(conn, seen);
            // Moved to a primary: a timestamp past everything it has committed (a client's
            // DITTO.WAITTS ahead of the cluster) is refused as a primary's DITTO.WAITTS is;
            // its release, unbounded, would never reach it.
            if !conn.sh.read_only && ts > conn.sh.db.clock().now() {
                return Err(format!(
                    "timestamp {} is ahead of this node (at {}), which became the primary meanwhile",
                    ts.0,
                    conn.sh.db.clock().now().0
                )
                .into());
            }
            tokio::select! {
                r = conn.wait_durable(ts, policy) => return r,
                _ = &mut changed => {}
            }
        }
    }

    /// The release of a connection's own commit policy, where it has one on this primary.
    fn policy_release(&self, policy: Option<ditto_replication::CommitPolicy>) -> Option<&Arc<Release>> {
        policy.and_then(|p| self.by_policy.iter().find(|(q, _)| *q == p)).map(|(_, r)| r)
    }

    /// Why a DITTO.WAITTS for `ts` under `policy` (the connection's) gave up after `t`: on
    /// a backup, where its read view got; on a primary, where its release got, and what
    /// holds it (`policy::blocked_by`).
    fn waitts_timed_out(&self, t: Duration, ts: Ts, policy: Option<ditto_replication::CommitPolicy>) -> String {
        if self.sh.read_only {
            let view = self.durable.as_ref().map_or(Ts(0), |r| r.watermark());
            return format!("ERR {}", view_timed_out(t, view, ts));
        }
        let released = self.policy_release(policy).or(self.durable.as_ref()).map_or(Ts(0), |r| r.watermark());
        let blocked = match &self.sh.replication {
            crate::session::Replication::Primary { primary, policy: server, .. } => {
                ditto_replication::blocked_by(policy.unwrap_or(*server), &primary.holdings())
            }
            _ => None,
        };
        format!(
            "ERR timed out after {} ms waiting for commits up to ts {} to be released on this primary (released up to ts {}{})",
            t.as_millis(),
            ts.0,
            released.0,
            blocked.map_or(String::new(), |why| format!(": {why}"))
        )
    }

    /// Waits until every commit up to `ts` is durable (released under `policy`, or the
    /// server's policy).
    async fn wait_durable(&self, ts: Ts, policy: Option<ditto_replication::CommitPolicy>) -> Result<(), Arc<str>> {
        if let Some(r) = self.policy_release(policy) {
            return r.wait(ts).await;
        }
        match (&self.durable, self.wait_timeout) {
            (Some(release), None) => release.wait(ts).await,
            (Some(release), Some(t)) => match tokio::time::timeout(t, release.wait(ts)).await {
                Ok(r) => r,
                Err(_) => Err(view_timed_out(t, release.watermark(), ts).into()),
            },
            (None, _) => Ok(()),
        }
    }
}

/// Why a backup's reply gave up after `t` waiting for its read view (at `view`) to reach
/// `ts`.
fn view_timed_out(t: Duration, view: Ts, ts: Ts) -> String {
    format!(
        "timed out after {} ms waiting for this backup's read view (at {}) to reach ts {}",
        t.as_millis(),
        view.0,
        ts.0
    )
}

/// How much a connection blocked in WAIT reads ahead of it (requests it then handles in
/// turn), watching for the client closing its connection.
const WAIT_READ_AHEAD: usize = 1 << 20;

/// A connection keeps its per-request bookkeeping (when each request was parsed, where each
/// reply ends) up to this many requests' room between batches; a larger batch's is let go.
const REQUESTS_KEPT_MAX: usize = 4096;

/// What a connection that has not authenticated (a password set) reads ahead of its
/// requests while its replies wait for room (`write_reading_ahead`): 64 KiB, four of
/// Redis's reads.
const UNAUTHENTICATED_READ_AHEAD_MAX: usize = 64 * 1024;

/// Requests handled in one batch before its replies are written: each holds about 56
/// bytes of bookkeeping (`started`, `marks`) against a reply as short as 7 (`+PONG`), so
/// a batch bounded by `max_output_bytes` alone held 9.6 million of them after a read-ahead
/// of 64 MiB of PINGs (940 MB for one connection, found by a review, 2026-12-07), and
/// handled them without a pause for the runtime's other connections. 16,384 keep it under
/// a megabyte; writing a batch yields to the runtime as its budget says.
const BATCH_REQUESTS_MAX: usize = 16 * 1024;

/// A client counted in `connected_clients` (`Conn::admit`), counted out when its task ends
/// however it does: a panic in a command's handler unwinds through `serve`, and its place
/// under `max_clients` was kept for good (found by a review, 2026-12-05).
struct Admitted(Arc<crate::session::Stats>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.connected_clients.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long replies wait, once their client's input has ended (a close, or a half-close
/// that still reads), before the connection ends: past it the client is taken for gone.
const WAIT_AFTER_INPUT_ENDS: Duration = Duration::from_secs(10);

/// How often a waiting connection that stopped reading ahead asks its socket whether the
/// client closed it (`peer_state`).
const WAIT_CLOSE_POLL: Duration = Duration::from_millis(500);

/// What became of the peer of TCP socket `fd` (from its state in the kernel, which moves
/// on however much of what came before is still unread): a FIN received moves it from
/// ESTABLISHED to CLOSE_WAIT, a reset to CLOSE. What a connection that stopped reading at
/// `WAIT_READ_AHEAD` asks instead of reading. `Open` where it cannot be told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    Open,
    Closed,
    Reset,
}

fn peer_state(fd: std::os::fd::RawFd) -> Peer {
    // SAFETY: `tcp_info` is plain data, zeroed is a valid value; the kernel writes at
    // most `len` bytes of it, and `fd` is the caller's open socket.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, (&raw mut info).cast(), &mut len) };
    // (The kernel's enum, which libc does not name: 1 TCP_ESTABLISHED, 7 TCP_CLOSE. This
    // side shuts its socket down only after the wait, so any other state is the peer's.)
    match (rc == 0 && len >= 1).then_some(info.tcpi_state) {
        None | Some(1) => Peer::Open,
        Some(7) => Peer::Reset,
        Some(_) => Peer::Closed,
    }
}

/// Drives `wait` (a connection's replies waiting for their release) while reading the
/// client ahead (up to `WAIT_READ_AHEAD`, requests it then handles in turn): `None`, the
/// connection is to end, if the client reset its connection, or if its input ended and
/// `WAIT_AFTER_INPUT_ENDS` passed without the wait ending (a half-closed client that
/// reads gets its replies within that). Before, a primary whose release stalled (under
/// `all` with a backup away, or cut off from its quorum) kept each gone client's task,
/// slot and buffers for good, until `max_clients` refused everyone. Once it has read
/// `WAIT_READ_AHEAD`, the socket `fd` is asked every `WAIT_CLOSE_POLL` whether the client
/// closed it (`peer_state`): before, a client that pipelined that much and then left was
/// not seen gone until the release moved.
async fn watch_while_waiting<S: AsyncRead + Unpin>(
    wait: &mut (impl std::future::Future<Output = Result<(), Arc<str>>> + Unpin),
    stream: &mut S,
    fd: std::os::fd::RawFd,
    inbuf: &mut BytesMut,
) -> Option<Result<(), Arc<str>>> {
    let mut ended: Option<tokio::time::Instant> = None;
    loop {
        let reading = ended.is_none() && inbuf.len() < WAIT_READ_AHEAD;
        // (Polled only once the input ended.)
        let give_up = ended.map_or_else(tokio::time::Instant::now, |e| e + WAIT_AFTER_INPUT_ENDS);
        let full = ended.is_none() && !reading;
        tokio::select! {
            w = &mut *wait => return Some(w),
            // (Its socket asked, the input unread: as if a read had met the close, or the
            // reset.)
            _ = tokio::time::sleep(WAIT_CLOSE_POLL), if full => match peer_state(fd) {
                Peer::Open => {}
                Peer::Closed => ended = Some(tokio::time::Instant::now()),
                Peer::Reset => {
                    tracing::debug!("a connection whose replies wait: reset by its client");
                    return None;
                }
            },
            // (`read_buf` is cancel safe: if the wait ends first, nothing was read.)
            r = stream.read_buf(inbuf), if reading => match r {
                Ok(0) => ended = Some(tokio::time::Instant::now()),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!("a connection whose replies wait: {e}");
                    return None;
                }
            },
            _ = tokio::time::sleep_until(give_up), if ended.is_some() => return None,
        }
    }
}

/// Writes `out` whole and flushes it; while the socket takes no more, reads what the client
/// sends into `inbuf`, up to `ahead_max` bytes held there. A client that sends a whole pipeline before
/// it reads any reply (redis-py's `pipeline().execute()`, Jedis's `sync()`) otherwise
/// deadlocked with the server once the replies filled both sockets' buffers: the server
/// stopped reading while its write waited, and the client's send waited on the server's
/// reading (found by a review, 2026-12-06; Redis reads on while its output waits). A
/// client whose unread pipeline passes `ahead_max` as well still waits, as before.
/// What ended the input (the client's half-close) is found by the next read, as before.
async fn write_reading_ahead<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    out: &[u8],
    inbuf: &mut BytesMut,
    ahead_max: usize,
) -> std::io::Result<()> {
    use std::pin::Pin;
    use std::task::Poll;
    let mut written = 0;
    let mut input_ended = false;
    // (On the heap, and only once the socket is full: kept in the connection's future, an
    // array would make every connection's larger.)
    let mut chunk: Vec<u8> = Vec::new();
    std::future::poll_fn(|cx| loop {
        // Written whole, then flushed: TLS takes a write into its own buffer (up to 64 KiB)
        // before the socket has room, so the wait for room may be the flush's, and reading
        // stopped there until 2026-12-07 (a TLS client sending a whole pipeline first
        // deadlocked as a plaintext one had; found by a review). Plain TCP's flush does
        // nothing.
        let polled = match written == out.len() {
            true => Pin::new(&mut *stream).poll_flush(cx).map_ok(|()| None),
            false => Pin::new(&mut *stream).poll_write(cx, &out[written..]).map_ok(Some),
        };
        match polled {
            Poll::Ready(Ok(None)) => return Poll::Ready(Ok(())),
            Poll::Ready(Ok(Some(0))) => return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(Some(n))) => {
                written += n;
                continue;
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {}
        }
        // The socket is full (its waker is set): read what has come meanwhile.
        if input_ended || inbuf.len() >= ahead_max {
            return Poll::Pending;
        }
        chunk.resize(16 * 1024, 0);
        let room = chunk.len().min(ahead_max - inbuf.len());
        let mut rb = tokio::io::ReadBuf::new(&mut chunk[..room]);
        match Pin::new(&mut *stream).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => input_ended = true,
            Poll::Ready(Ok(())) => inbuf.extend_from_slice(rb.filled()),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
    })
    .await
}

/// A switchover's drain on a primary (`RoleRequest::Drain`): refuses writes, then waits
/// until no commit is under way, the log holds every commit durably (its settled
/// watermark W), and the backup `target` has acknowledged W durably; W must then hold
/// still for a moment (a write that passed the gate just before it closed commits within
/// microseconds). Returns W and how long it took. On failure the gate opens again.
///
/// What it buys: the old primary's log then holds nothing the target lacks, so the
/// failover that follows needs no fetch and promotes the target in place, and nothing the
/// old primary logged is discarded, whatever the commit policy. A write that slipped past
/// the gate later than that costs a fetch (a slower promotion), never a lost commit: the
/// failover's reports cover it.
fn drain_for_switchover(
    sh: &crate::session::Shared,
    p: &ditto_replication::Primary,
    log: &ditto_log::Logger,
    db: &ditto_engine::Database,
    target: &crate::config::ClientAddr,
    within: Duration,
) -> Result<(Ts, Duration), String> {
    const SETTLE: Duration = Duration::from_millis(2);
    let t = std::time::Instant::now();
    let drain = sh.write_gate.drain_to(target, |to| {
        format!(
            "this node is handing its primary role to {to} (a switchover): writes go to the new primary in a moment"
        )
    });
    let mut held: Option<(Ts, std::time::Instant)> = None;
    loop {
        let clock = db.clock().now();
        let quiet = db.clock().visible_ts() >= clock;
        let wm = if quiet { log.settled_watermark() } else { None };
        let acked = p.backups().iter().find(|b| b.node == target.plain).map(|b| b.durable);
        match (wm, acked) {
            (Some(w), Some(a)) if a >= w && db.clock().now() == clock => match held {
                Some((h, since)) if h == clock => {
                    if since.elapsed() >= SETTLE {
                        return Ok((w, t.elapsed()));
                    }
                }
                _ => held = Some((clock, std::time::Instant::now())),
            },
            _ => held = None,
        }
        if t.elapsed() >= within {
            sh.write_gate.end_drain(drain);
            return Err(match (wm, acked) {
                (_, None) => format!("{target} is not connected as a backup"),
                (None, _) => format!("the log did not settle within {within:?} (commits still being made durable)"),
                (Some(w), Some(a)) => {
                    format!("{target} acknowledged ts {} durably, not the log's ts {} within {within:?}", a.0, w.0)
                }
            });
        }
        if let Some(f) = log.failure() {
            sh.write_gate.end_drain(drain);
            return Err(format!("the log failed: {f}"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ditto_engine::Options;

    /// A primary that stops being one in place gives up its waiting replies: each policy's
    /// release keeps what it covers, and every reply above it, and every later wait, fails
    /// with the reason, where before they waited for good (nothing moved those releases
    /// again).
    #[test]
    fn a_primary_changing_its_role_in_place_fails_the_replies_still_waiting() {
        use crate::release::poll_once;
        let policy = ditto_replication::CommitPolicy::parse("majority-durable").unwrap();
        let (release, majority) = (Arc::new(Release::default()), Arc::new(Release::default()));
        release.advance(Ts(5), None);
        let mut covered = std::pin::pin!(release.wait(Ts(5)));
        let mut above = std::pin::pin!(release.wait(Ts(9)));
        let mut other = std::pin::pin!(majority.wait(Ts(3)));
        assert_eq!(poll_once(above.as_mut()), None);
        assert_eq!(poll_once(other.as_mut()), None);
        give_up_waits(None, &release, &[(policy, Arc::clone(&majority))], "this primary follows another now");
        assert_eq!(poll_once(covered.as_mut()), Some(Ok(())));
        for w in [above.as_mut(), other.as_mut()] {
            assert!(poll_once(w).is_some_and(|r| r.is_err_and(|e| e.contains("follows another"))));
        }
        assert!(poll_once(std::pin::pin!(majority.wait(Ts(1)))).is_some_and(|r| r.is_err()), "later waits too");
    }

    /// The log's progress listener holds the primary weakly (a strong handle made a cycle
    /// through the log, and a primary that followed another in place was never freed), and
    /// once the primary is gone it releases nothing by the log's durability alone.
    #[test]
    fn the_durability_listener_holds_the_primary_weakly_and_releases_nothing_once_it_is_gone() {
        use crate::release::poll_once;
        let dir = tempfile::tempdir().unwrap();
        let d = ditto_log::open(dir.path(), ditto_log::OpenOptions { workers: 1, ..Default::default() }).unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p =
            ditto_replication::Primary::start(&d, l, ditto_replication::PrimaryOptions::default(), Box::new(|_| Ts(0)))
                .unwrap();
        let strong = Arc::strong_count(&p);
        let release = Arc::new(Release::default());
        let listener = durability_listener(Some(&p), vec![Arc::clone(&release)]);
        assert_eq!(Arc::strong_count(&p), strong, "the listener holds the primary");
        p.stop();
        let weak = Arc::downgrade(&p);
        drop(p);
        let gone = Instant::now() + Duration::from_secs(10);
        while weak.upgrade().is_some() && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(weak.upgrade().is_none(), "the primary outlived its stop and every handle");
        // Gone: the log's progress moves no release.
        listener(Ts(7), None);
        assert_eq!(poll_once(std::pin::pin!(release.wait(Ts(7)))), None, "released by the log alone");
        drop(d);
    }

    /// Backups on other hosts bound to every interface on the same port get other names
    /// (a restarted primary counts its backups by name).
    #[test]
    fn a_backups_default_name_tells_hosts_apart_where_it_binds_every_interface() {
        let mut cfg = Config { port: 6380, ..Config::default() };
        cfg.bind = "127.0.0.1".into();
        assert_eq!(replica_name(&cfg), "127.0.0.1:6380");
        cfg.bind = "0.0.0.0".into();
        let host = host_name().expect("this host has a name");
        assert_eq!(replica_name(&cfg), format!("{host}:6380"));
        cfg.replica_name = Some("b1".into());
        assert_eq!(replica_name(&cfg), "b1");
    }

    /// Backups on one host that each take any port (`--port 0`) are told apart by their
    /// data directories; the same directory gives the same name at its next start.
    #[test]
    fn backups_on_any_port_are_named_by_their_data_directories() {
        let mut cfg = Config { port: 0, data_dir: Some("/srv/b1".into()), ..Config::default() };
        cfg.bind = "127.0.0.1".into();
        assert_eq!(replica_name(&cfg), "127.0.0.1:0:/srv/b1");
        let other = Config { data_dir: Some("/srv/b2".into()), ..cfg.clone() };
        assert_ne!(replica_name(&cfg), replica_name(&other));
        assert_eq!(replica_name(&cfg), replica_name(&cfg.clone()));
        // The same directory named another way gives the same name; what the quorum's
        // record cannot hold is replaced.
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("b1");
        std::fs::create_dir(&d).unwrap();
        let named = |p: std::path::PathBuf| replica_name(&Config { data_dir: Some(p), ..cfg.clone() });
        assert_eq!(named(d.clone()), named(tmp.path().join("b1/")));
        assert_eq!(named(d.clone()), named(tmp.path().join("b1/../b1")));
        assert!(!named("/srv/a,b\nc".into()).contains([',', '\n']));
        // An explicit name that the record could not hold is refused.
        for bad in ["", " ", "a,b", "a\nb"] {
            let c = Config { replica_name: Some(bad.into()), ..Config::default() };
            assert!(c.validate().is_err(), "{bad:?} was taken");
        }
    }

    /// A connection's replies leave only once the watermark covers its commits; if the log
    /// fails instead, every reply of the waiting pipeline becomes an error and the
    /// connection is closed. Driven through a real socket, with the durability state set by
    /// the test in place of the log's progress listener.
    fn test_conn(durable: Option<Arc<Release>>, handshake: Duration) -> Arc<Conn> {
        let db = Database::new(Options { workers: 1 });
        let mut sh = Shared::new(db, None, None, 0).unwrap();
        sh.max_output_bytes = 1 << 20;
        Arc::new(Conn {
            sh: Arc::new(sh),
            limits: Limits::default(),
            max_clients: 100,
            tls_handshake_timeout: handshake,
            tcp_keepalive: None,
            durable,
            by_policy: Vec::new(),
            wait_timeout: None,
            waitts_timeout: Duration::from_secs(5),
            metrics: Arc::new(Metrics::new(1)),
        })
    }

    /// Serves `conn` on a free loopback port through `admit`, as `run` does.
    async fn listen(conn: Arc<Conn>, tls: Option<TlsAcceptor>) -> SocketAddr {
        listen_with(conn, tls, Arc::new(Hub::default())).await
    }

    /// `listen`, with `hub` (set to `conn`) naming the role that serves.
    async fn listen_with(conn: Arc<Conn>, tls: Option<TlsAcceptor>, hub: Arc<Hub>) -> SocketAddr {
        hub.set(Arc::clone(&conn));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                Arc::clone(&conn).admit(listener.accept().await, tls.clone(), &hub).await;
            }
        });
        addr
    }

    /// A connection moves to the role the hub names before its next request, with its
    /// session: opened on a read-only role (a backup), it is refused a write, keeps its
    /// SELECTed database and client id, and once the next role (the primary, same
    /// engine) is set, its next write on the same connection is taken; the stats go on.
    #[test]
    fn a_connection_moves_to_the_next_role_with_its_session() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let base = test_conn(None, Duration::from_secs(10));
        let db = Arc::clone(&base.sh.db);
        let role = |read_only: bool, before: Option<&Shared>| {
            let mut s = Shared::new(Arc::clone(&db), None, None, 0).unwrap();
            s.max_output_bytes = 1 << 20;
            s.read_only = read_only;
            if let Some(b) = before {
                s.carry_over(b);
            }
            Arc::new(Conn { sh: Arc::new(s), ..clone_conn(&base) })
        };
        let read_only = role(true, None);
        let primary = role(false, Some(&read_only.sh));
        let hub = Arc::new(Hub::default());
        rt.block_on(async move {
            let addr = listen_with(Arc::clone(&read_only), None, Arc::clone(&hub)).await;
            let mut a = TcpStream::connect(addr).await.unwrap();
            assert_eq!(ask(&mut a, b"*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n").await, "+OK\r\n");
            let id = ask(&mut a, b"*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n").await;
            let refused = ask(&mut a, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n").await;
            assert!(refused.starts_with("-READONLY"), "{refused}");
            assert_eq!(read_only.sh.stats.connected_clients.load(Ordering::Acquire), 1);

            hub.set(Arc::clone(&primary));
            assert_eq!(ask(&mut a, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n").await, "+OK\r\n");
            assert_eq!(ask(&mut a, b"*2\r\n$6\r\nCLIENT\r\n$2\r\nID\r\n").await, id, "the same client");
            // Written in the database the connection had selected.
            assert_eq!(ask(&mut a, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").await, "$1\r\nv\r\n");
            assert_eq!(ask(&mut a, b"*2\r\n$6\r\nSELECT\r\n$1\r\n0\r\n").await, "+OK\r\n");
            assert_eq!(ask(&mut a, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").await, "$-1\r\n");
            // One client, counted once, in the counters both roles share.
            assert_eq!(primary.sh.stats.connected_clients.load(Ordering::Acquire), 1);
            assert!(Arc::ptr_eq(&primary.sh.stats, &read_only.sh.stats));
        });
    }

    /// A backup's read waiting for its read view when the role changes in place is
    /// answered by the next role's release (`Conn::wait_moving`), not left to time out on
    /// the old role's, which no longer moves.
    #[test]
    fn a_reply_waiting_on_the_old_roles_read_view_is_released_by_the_next_role() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let old_release = Arc::new(Release::default());
        let base = test_conn(None, Duration::from_secs(10));
        let db = Arc::clone(&base.sh.db);
        // A committed key: the read's snapshot is above the old role's read view (0).
        {
            let mut w = db.worker(ditto_engine::WorkerId(0)).unwrap();
            let ks = crate::keyspace::Keyspace::open(&db).unwrap();
            let mut t = w.begin();
            t.put(ks.keys, &crate::keyspace::Keyspace::key_row(0, b"k"), b"v").unwrap();
            t.commit().unwrap();
        }
        let backup = backup_conn(&base, &db, Arc::clone(&old_release), Duration::from_secs(30), Duration::from_secs(5));
        let next = promoted_conn(&base, &backup, None, Duration::from_secs(5));
        let hub = Arc::new(Hub::default());
        rt.block_on(async move {
            let addr = listen_with(backup, None, Arc::clone(&hub)).await;
            let mut a = TcpStream::connect(addr).await.unwrap();
            a.write_all(b"*1\r\n$6\r\nDBSIZE\r\n").await.unwrap();
            let mut buf = vec![0u8; 64];
            let quiet = Duration::from_millis(300);
            assert!(tokio::time::timeout(quiet, a.read(&mut buf)).await.is_err(), "answered above the read view");
            hub.set(next);
            let n = tokio::time::timeout(Duration::from_secs(5), a.read(&mut buf)).await.unwrap().unwrap();
            assert_eq!(&buf[..n], b":1\r\n");
        });
    }

    /// A backup's DITTO.WAITTS for a timestamp ahead of everything, waiting when the node
    /// is promoted in place, is refused by the new primary as its own DITTO.WAITTS would be
    /// (it moved to the primary's release, which has no timeout, and waited for good).
    #[test]
    fn a_waitts_ahead_of_everything_moved_to_a_new_primary_is_refused() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let base = test_conn(None, Duration::from_secs(10));
        let db = Arc::clone(&base.sh.db);
        let five = Duration::from_secs(5);
        let backup = backup_conn(&base, &db, Arc::new(Release::default()), Duration::from_secs(30), five);
        let next = promoted_conn(&base, &backup, Some(Arc::new(Release::default())), five);
        let hub = Arc::new(Hub::default());
        rt.block_on(async move {
            let addr = listen_with(backup, None, Arc::clone(&hub)).await;
            let mut a = TcpStream::connect(addr).await.unwrap();
            // Pipelined behind a SELECT: its reply goes out at once (the replies before a
            // DITTO.WAITTS go out before it waits, since 2026-12-04; a batch that mixes
            // them is `a_backups_batch_whose_wait_times_out_fails_only_the_replies_above_the_view`),
            // the wait's is refused, and the connection goes on.
            a.write_all(b"*2\r\n$6\r\nSELECT\r\n$1\r\n1\r\n*2\r\n$12\r\nDITTO.WAITTS\r\n$7\r\n1000000\r\n")
                .await
                .unwrap();
            let mut buf = vec![0u8; 256];
            let n = tokio::time::timeout(Duration::from_secs(5), a.read(&mut buf)).await.expect("an answer").unwrap();
            assert_eq!(&buf[..n], b"+OK\r\n");
            assert!(tokio::time::timeout(Duration::from_millis(300), a.read(&mut buf)).await.is_err());
            hub.set(next);
            let n = tokio::time::timeout(Duration::from_secs(5), a.read(&mut buf)).await.expect("an answer").unwrap();
            let got = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(got.starts_with("-ERR timestamp 1000000 is ahead of this node"), "{got}");
            assert_eq!(ask(&mut a, b"*1\r\n$4\r\nPING\r\n").await, "+PONG\r\n", "the connection goes on");
        });
    }

    /// A backup's DITTO.WAITTS for a timestamp the new primary has reached but not
    /// released, waiting when the node is promoted in place, gives up after
    /// `waitts_timeout` with the primary's reason; the connection goes on. (It moved to
    /// the primary's release, which has no bound of its own, and waited for good; found by
    /// a review, 2026-12-04.)
    #[test]
    fn a_waitts_moved_to_a_new_primary_that_does_not_release_it_gives_up() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let base = test_conn(None, Duration::from_secs(10));
        let db = Database::new(Options { workers: 2 });
        let t = db.create_table("t").unwrap();
        let bound = Duration::from_millis(800);
        let backup = backup_conn(&base, &db, Arc::new(Release::default()), Duration::from_secs(30), bound);
        // The new primary's release stays at 0.
        let next = promoted_conn(&base, &backup, Some(Arc::new(Release::default())), bound);
        let hub = Arc::new(Hub::default());
        rt.block_on(async move {
            let addr = listen_with(backup, None, Arc::clone(&hub)).await;
            let mut a = TcpStream::connect(addr).await.unwrap();
            a.write_all(b"*2\r\n$12\r\nDITTO.WAITTS\r\n$1\r\n1\r\n").await.unwrap();
            // It waits on the backup (for its read view)...
            let mut buf = vec![0u8; 512];
            assert!(tokio::time::timeout(Duration::from_millis(300), a.read(&mut buf)).await.is_err());
            // ...when the node commits at ts 1 and more (it is the primary now), and the
            // connection moves to it.
            let mut w = db.worker(ditto_engine::WorkerId(1)).unwrap();
            for i in 0..3u8 {
                w.run(|x| x.put(t, &[i], b"v").map(drop)).unwrap().1.wait().unwrap();
            }
            assert!(db.clock().now() >= Ts(1));
            let started = Instant::now();
            hub.set(next);
            let n = tokio::time::timeout(Duration::from_secs(10), a.read(&mut buf)).await.expect("an answer").unwrap();
            let got = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(
                got.starts_with("-ERR timed out after 800 ms waiting for commits up to ts 1 to be released on this primary (released up to ts 0"),
                "{got}"
            );
            assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
            assert_eq!(ask(&mut a, b"*1\r\n$4\r\nPING\r\n").await, "+PONG\r\n", "the connection goes on");
        });
    }

    /// On a backup, a batch of replies whose wait for the read view times out fails only
    /// the replies that read above where the view got: a SELECT before a read keeps its
    /// reply (its effect stands), the read fails, and the connection goes on.
    #[test]
    fn a_backups_batch_whose_wait_times_out_fails_only_the_replies_above_the_view() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let base = test_conn(None, Duration::from_secs(10));
        let db = Database::new(Options { workers: 2 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(ditto_engine::WorkerId(1)).unwrap();
        w.run(|x| x.put(t, b"k", b"v").map(drop)).unwrap().1.wait().unwrap();
        // The read view stays at 0, below the write.
        let backup =
            backup_conn(&base, &db, Arc::new(Release::default()), Duration::from_millis(300), Duration::from_secs(5));
        rt.block_on(async move {
            let addr = listen(backup, None).await;
            let mut a = TcpStream::connect(addr).await.unwrap();
            a.write_all(b"*2\r\n$6\r\nSELECT\r\n$1\r\n1\r\n*1\r\n$6\r\nDBSIZE\r\n").await.unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 512];
            while !got.ends_with(b"\r\n") || got.iter().filter(|&&c| c == b'\n').count() < 2 {
                let n =
                    tokio::time::timeout(Duration::from_secs(10), a.read(&mut buf)).await.expect("answers").unwrap();
                assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
            }
            let got = String::from_utf8_lossy(&got).into_owned();
            assert!(
                got.starts_with(
                    "+OK\r\n-ERR timed out after 300 ms waiting for this backup's read view (at 0) to reach ts "
                ),
                "{got}"
            );
            assert_eq!(ask(&mut a, b"*1\r\n$4\r\nPING\r\n").await, "+PONG\r\n", "the connection goes on");
        });
    }

    /// Sends one request on `a` and reads its reply (one read: the replies are short).
    async fn ask(a: &mut TcpStream, req: &[u8]) -> String {
        a.write_all(req).await.unwrap();
        let mut buf = vec![0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(10), a.read(&mut buf)).await.unwrap().unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// A backup's `Conn` over `db` like `base`, its read view `view`, its replies waiting
    /// for it at most `wait`, a DITTO.WAITTS at most `waitts`.
    fn backup_conn(base: &Conn, db: &Arc<Database>, view: Arc<Release>, wait: Duration, waitts: Duration) -> Arc<Conn> {
        let mut s = Shared::new(Arc::clone(db), None, None, 0).unwrap();
        s.read_only = true;
        Arc::new(Conn {
            sh: Arc::new(s),
            durable: Some(view),
            wait_timeout: Some(wait),
            waitts_timeout: waitts,
            ..clone_conn(base)
        })
    }

    /// The primary's `Conn` that `backup`'s node serves as once promoted in place (its
    /// connections carried over), releasing through `release` (`base`'s when `None`).
    fn promoted_conn(base: &Conn, backup: &Conn, release: Option<Arc<Release>>, waitts: Duration) -> Arc<Conn> {
        let mut s = Shared::new(Arc::clone(&backup.sh.db), None, None, 0).unwrap();
        s.carry_over(&backup.sh);
        let c = clone_conn(base);
        Arc::new(Conn { sh: Arc::new(s), durable: release.or(c.durable.clone()), waitts_timeout: waitts, ..c })
    }

    /// A `Conn` like `c` (the fields other than `sh`).
    fn clone_conn(c: &Conn) -> Conn {
        Conn {
            sh: Arc::clone(&c.sh),
            limits: c.limits,
            max_clients: c.max_clients,
            tls_handshake_timeout: c.tls_handshake_timeout,
            tcp_keepalive: c.tcp_keepalive,
            durable: c.durable.clone(),
            by_policy: c.by_policy.clone(),
            wait_timeout: c.wait_timeout,
            waitts_timeout: c.waitts_timeout,
            metrics: Arc::clone(&c.metrics),
        }
    }

    /// Clients that leave while their replies wait for a stalled release do not keep
    /// their connections: one that resets at once, one that closes within
    /// `WAIT_AFTER_INPUT_ENDS`; a client that half-closes and reads still gets its reply
    /// if the release comes within it. Before, each kept its task and client slot for as
    /// long as the release stalled.
    #[test]
    fn clients_gone_while_their_replies_wait_let_their_connections_go() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let release = Arc::new(Release::default());
        let conn = test_conn(Some(Arc::clone(&release)), Duration::from_secs(10));
        let (db, stats) = (Arc::clone(&conn.sh.db), Arc::clone(&conn.sh.stats));
        rt.block_on(async move {
            let addr = listen(conn, None).await;
            let clients = || stats.connected_clients.load(Ordering::Acquire);
            let set = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
            let wait_for = |n: usize, limit: Duration| {
                let clients = &clients;
                async move {
                    let end = Instant::now() + limit;
                    while clients() != n {
                        assert!(Instant::now() < end, "{} clients after {limit:?}, {n} expected", clients());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            };
            // A client that pipelined more than a waiting connection reads ahead: the SET,
            // then PINGs to 1.5 MiB, sent, and 300 ms for the server to read what it reads.
            let past_read_ahead = || async move {
                let mut big = TcpStream::connect(addr).await.unwrap();
                let mut pipeline = set.to_vec();
                while pipeline.len() < WAIT_READ_AHEAD + WAIT_READ_AHEAD / 2 {
                    pipeline.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
                }
                tokio::time::timeout(Duration::from_secs(10), big.write_all(&pipeline)).await.unwrap().unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
                big
            };
            // Reset: gone at once; one that pipelined more than is read ahead too (its
            // socket says so, `peer_state`).
            let big = past_read_ahead().await;
            #[allow(deprecated)] // (as below)
            big.set_linger(Some(Duration::ZERO)).unwrap();
            drop(big);
            for _ in 0..5 {
                let mut a = TcpStream::connect(addr).await.unwrap();
                a.write_all(set).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
                #[allow(deprecated)] // (a linger of 0 resets at once: nothing blocks)
                a.set_linger(Some(Duration::ZERO)).unwrap();
                drop(a);
            }
            wait_for(0, Duration::from_secs(5)).await;
            // Closed: gone within WAIT_AFTER_INPUT_ENDS. So is one that pipelined more than
            // the connection reads ahead while it waits, then closed (the rest of its
            // requests unread: its socket says it closed, `peer_state`; before, it was
            // held until the release moved).
            let mut a = TcpStream::connect(addr).await.unwrap();
            a.write_all(set).await.unwrap();
            let big = past_read_ahead().await;
            drop(a);
            drop(big);
            wait_for(2, Duration::from_secs(1)).await;
            wait_for(0, WAIT_AFTER_INPUT_ENDS + Duration::from_secs(5)).await;
            // Half-closed, reading: answered once the release comes.
            let mut a = TcpStream::connect(addr).await.unwrap();
            a.write_all(set).await.unwrap();
            a.shutdown().await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            release.advance(db.clock().visible_ts(), None);
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), a.read_to_end(&mut got)).await.unwrap().unwrap();
            assert_eq!(&got[..], b"+OK\r\n");
        });
    }

    #[test]
    fn replies_wait_for_durability_and_a_log_failure_turns_them_into_errors() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let release = Arc::new(Release::default());
        let conn = test_conn(Some(Arc::clone(&release)), Duration::from_secs(10));
        let db = Arc::clone(&conn.sh.db);
        rt.block_on(async move {
            let addr = listen(conn, None).await;
            let quiet = Duration::from_millis(300);
            let mut buf = vec![0u8; 256];

            let mut a = TcpStream::connect(addr).await.unwrap();
            a.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n").await.unwrap();
            assert!(tokio::time::timeout(quiet, a.read(&mut buf)).await.is_err(), "answered before durable");
            let committed = db.clock().visible_ts();
            assert!(committed > Ts(0));
            release.advance(committed, None);
            let n = tokio::time::timeout(Duration::from_secs(10), a.read(&mut buf)).await.unwrap().unwrap();
            assert_eq!(&buf[..n], b"+OK\r\n");

            // A pipeline of a write and a read: both wait, then both fail with the log.
            let mut b = TcpStream::connect(addr).await.unwrap();
            b.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nw\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").await.unwrap();
            assert!(tokio::time::timeout(quiet, b.read(&mut buf)).await.is_err(), "answered before durable");
            // A read alone of what that write wrote waits too.
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").await.unwrap();
            assert!(tokio::time::timeout(quiet, c.read(&mut buf)).await.is_err(), "answered before durable");
            // (As the log's progress listener fails it: `on_log_progress`, standalone.)
            crate::release::on_log_progress(
                None,
                &[Arc::clone(&release)],
                committed,
                Some(&"fsync failed: EIO".into()),
            );
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), b.read_to_end(&mut got)).await.unwrap().unwrap();
            let text = String::from_utf8(got).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 2, "{text}");
            assert!(
                lines.iter().all(|l| l.starts_with("-ERR log failure, writes stopped: fsync failed: EIO")),
                "{text}"
            );
            // The write's outcome is unknown; the read wrote nothing, and says so (the
            // connection closes for the write).
            assert!(lines[0].ends_with("(outcome unknown)") && lines[1].ends_with("(not answered; it wrote nothing)"));
            // The read alone fails so too, and its connection goes on (before 2026-12-06 it
            // was answered "outcome unknown" and closed).
            let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await.unwrap().unwrap();
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            assert!(
                text.starts_with("-ERR log failure") && text.ends_with("(not answered; it wrote nothing)\r\n"),
                "{text}"
            );
            c.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
            let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await.unwrap().unwrap();
            assert_eq!(&buf[..n], b"+PONG\r\n");
        });
    }

    /// Runs of pipelined GETs and SETs are answered together (`Session::handle_run`) and
    /// the request that ends a run is still handled, in order: a write between reads, a GET
    /// inside MULTI, and a malformed frame after a run, which is answered after the run's
    /// replies.
    #[test]
    fn pipelined_runs_of_gets_keep_every_reply_in_order() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let conn = test_conn(None, Duration::from_secs(10));
        rt.block_on(async move {
            let addr = listen(conn, None).await;
            let mut c = TcpStream::connect(addr).await.unwrap();
            let req = |args: &[&str]| {
                let mut r = format!("*{}\r\n", args.len());
                for a in args {
                    r += &format!("${}\r\n{a}\r\n", a.len());
                }
                r
            };
            let mut pipeline = String::new();
            for a in [
                &["SET", "a", "1"][..],
                &["GET", "a"],
                &["GET", "b"],
                &["SET", "b", "2"],
                &["GET", "b"],
                &["GET", "a"],
                &["MULTI"],
                &["GET", "a"],
                &["GET", "b"],
                &["EXEC"],
            ] {
                pipeline += &req(a);
            }
            // 70 GETs in a row: more than one run.
            for i in 0..70 {
                pipeline += &req(&["GET", if i % 2 == 0 { "a" } else { "zz" }]);
            }
            pipeline += &req(&["GET", "b"]);
            // A run of SETs, then reads of what it wrote: in order, the later write wins.
            for a in [&["SET", "x", "1"][..], &["SET", "y", "2"], &["SET", "x", "3"], &["GET", "x"], &["GET", "y"]] {
                pipeline += &req(a);
            }
            pipeline += "*1\r\n:5\r\n";
            c.write_all(pipeline.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut got)).await.unwrap().unwrap();
            let mut want = String::from("+OK\r\n$1\r\n1\r\n$-1\r\n+OK\r\n$1\r\n2\r\n$1\r\n1\r\n");
            want += "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n$1\r\n1\r\n$1\r\n2\r\n";
            for i in 0..70 {
                want += if i % 2 == 0 { "$1\r\n1\r\n" } else { "$-1\r\n" };
            }
            want += "$1\r\n2\r\n";
            want += "+OK\r\n+OK\r\n+OK\r\n$1\r\n3\r\n$1\r\n2\r\n";
            let got = String::from_utf8(got).unwrap();
            assert!(got.starts_with(&want), "got {got:?}");
            let rest = &got[want.len()..];
            assert!(rest.starts_with("-ERR Protocol error") && rest.ends_with("\r\n"), "then {rest:?}");
        });
    }

    /// A run of GETs whose replies pass `max_output_bytes` is answered in parts, each part
    /// written before the next is read from the database, every reply in order.
    #[test]
    fn a_run_of_gets_past_the_output_bound_is_answered_in_parts() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let conn = Arc::try_unwrap(test_conn(None, Duration::from_secs(10))).ok().expect("the only handle");
        let mut sh = Shared::new(Arc::clone(&conn.sh.db), None, None, 0).unwrap();
        sh.max_output_bytes = 100;
        let conn = Arc::new(Conn { sh: Arc::new(sh), ..conn });
        let sh = Arc::clone(&conn.sh);
        rt.block_on(async move {
            let addr = listen(conn, None).await;
            let mut c = TcpStream::connect(addr).await.unwrap();
            let value = "v".repeat(40);
            let mut pipeline = format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$40\r\n{value}\r\n");
            for _ in 0..20 {
                pipeline += "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
            }
            pipeline += "*1\r\n$4\r\nQUIT\r\n";
            c.write_all(pipeline.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut got)).await.unwrap().unwrap();
            let want = format!("+OK\r\n{}+OK\r\n", format!("$40\r\n{value}\r\n").repeat(20));
            assert_eq!(String::from_utf8(got).unwrap(), want);
        });
        let get = crate::commands::lookup_index(b"GET").unwrap();
        assert_eq!(sh.stats.command_totals(get)[0], 20, "every GET counted once");
    }

    /// TLS through a real socket: a client that trusts the CA is served; plaintext on the
    /// TLS port, a client that does not trust the certificate, and (with mutual TLS) a client
    /// without a certificate are refused and counted; a client that never finishes its
    /// handshake is dropped after the timeout; the listener keeps serving throughout.
    #[test]
    fn tls_clients_are_served_and_bad_handshakes_are_refused() {
        use tokio_rustls::TlsConnector;
        let dir = tempfile::tempdir().unwrap();
        let pki = tls::pki::make(dir.path());
        let files = tls::TlsFiles {
            cert_file: pki.server_cert.clone(),
            key_file: pki.server_key.clone(),
            ca_cert_file: Some(pki.ca.clone()),
            auth_clients: false,
        };
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        rt.block_on(async move {
            let conn = test_conn(None, Duration::from_millis(500));
            let sh = Arc::clone(&conn.sh);
            let one_way = TlsAcceptor::from(tls::server_config(&files).unwrap());
            let addr = listen(Arc::clone(&conn), Some(one_way)).await;
            let mutual = TlsAcceptor::from(tls::server_config(&tls::TlsFiles { auth_clients: true, ..files }).unwrap());
            let mutual_addr = listen(conn, Some(mutual)).await;
            let name = tls::server_name("127.0.0.1").unwrap();
            let trusting = TlsConnector::from(tls::client_config(&pki.ca, None).unwrap());
            let with_cert =
                TlsConnector::from(tls::client_config(&pki.ca, Some((&pki.client_cert, &pki.client_key))).unwrap());
            let limit = Duration::from_secs(10);

            async fn roundtrip<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Vec<u8> {
                s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").await.unwrap();
                s.flush().await.unwrap();
                let mut got = Vec::new();
                let mut buf = [0u8; 64];
                while got.len() < 13 {
                    let n = s.read(&mut buf).await.unwrap();
                    assert!(n > 0, "closed after {got:?}");
                    got.extend_from_slice(&buf[..n]);
                }
                got
            }
            let tcp = TcpStream::connect(addr).await.unwrap();
            let mut good = tokio::time::timeout(limit, trusting.connect(name.clone(), tcp)).await.unwrap().unwrap();
            assert_eq!(roundtrip(&mut good).await, b"+OK\r\n$2\r\nv1\r\n");

            // Plaintext RESP on the TLS port: no reply, closed, counted.
            let mut plain = TcpStream::connect(addr).await.unwrap();
            plain.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
            let mut got = Vec::new();
            let _ = tokio::time::timeout(limit, plain.read_to_end(&mut got)).await.unwrap();
            assert!(!got.windows(4).any(|w| w == b"PONG"), "plaintext answered: {got:?}");

            // A client that trusts another CA refuses the server's certificate.
            let other = tempfile::tempdir().unwrap();
            let stranger = TlsConnector::from(tls::client_config(&tls::pki::make(other.path()).ca, None).unwrap());
            let tcp = TcpStream::connect(addr).await.unwrap();
            assert!(tokio::time::timeout(limit, stranger.connect(name.clone(), tcp)).await.unwrap().is_err());

            // A client that connects and says nothing is dropped after the handshake timeout.
            let mut silent = TcpStream::connect(addr).await.unwrap();
            let t = Instant::now();
            let n = tokio::time::timeout(limit, silent.read(&mut [0u8; 16])).await.unwrap().unwrap_or(0);
            assert_eq!(n, 0, "the silent client was sent bytes");
            assert!(t.elapsed() >= Duration::from_millis(400), "dropped before the timeout");

            // Mutual TLS: without a client certificate the handshake (or the first read) fails.
            let tcp = TcpStream::connect(mutual_addr).await.unwrap();
            match tokio::time::timeout(limit, trusting.connect(name.clone(), tcp)).await.unwrap() {
                Err(_) => {}
                Ok(mut s) => {
                    // TLS 1.3 finishes the client's side before the server checks it.
                    let _ = s.write_all(b"*1\r\n$4\r\nPING\r\n").await;
                    let _ = s.flush().await;
                    let mut got = Vec::new();
                    let r = tokio::time::timeout(limit, s.read_to_end(&mut got)).await.unwrap();
                    assert!(r.is_err() || got.is_empty(), "served without a client certificate: {got:?}");
                }
            }
            let tcp = TcpStream::connect(mutual_addr).await.unwrap();
            let mut ok = tokio::time::timeout(limit, with_cert.connect(name.clone(), tcp)).await.unwrap().unwrap();
            assert_eq!(roundtrip(&mut ok).await, b"+OK\r\n$2\r\nv1\r\n");

            // The first connection was served throughout; four handshakes failed.
            assert_eq!(roundtrip(&mut good).await, b"+OK\r\n$2\r\nv1\r\n");
            // (The server may see a refused handshake end after the client has moved on.)
            let counted = || sh.stats.tls_handshake_failures.load(Ordering::Relaxed);
            let t = Instant::now();
            while counted() < 4 && t.elapsed() < limit {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(counted(), 4, "plaintext, wrong CA, silent, no client certificate");
        });
    }
}
