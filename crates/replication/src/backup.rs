//! The backup's side: receive, persist, acknowledge, replay, publish the read view
//! ==============================================================================
//! ```text
//!  receiver thread:  frames from the primary ... burst read: queue it -> Ack{received}
//!  persister thread: the queued bursts -> replica log (write, fsync) -> Ack{durable}
//!                    -> batches to the replayers
//!  replayer[s] (one per primary stream, or one for all in `serial` mode):
//!                   install every write (Database::replay_install) -> complete(seq)
//!  or, in `dependency` mode (dependency.rs): a dispatcher puts transactions in commit-ts
//!                   order into KuaFu's write-set graph; executors install them
//!                   (Database::replay_install) -> the per-transaction replayed watermark
//!  read view = min(released watermark from the primary, replayed prefix watermark)
//!              -> Database::publish_read_view: snapshots read there, never blocked
//! ```
//! A batch is persisted before it is acknowledged as durable and before it is replayed
//! (Query Fresh's replay pipelining: replay is never on the primary's commit path). The
//! receiver never waits for this node's disk: it acknowledges receipt while the persister
//! writes and fsyncs the bursts before (so a `received` commit policy waits for no disk
//! anywhere, and a stalled fsync here holds up neither receipt nor its acks); at most
//! `PERSIST_BYTES_MAX` wait to be persisted, then the receiver waits too. A
//! batch of an older epoch is refused; a batch the backup has (its stream's bound is at or
//! below what it holds) is skipped, and within a batch every transaction at or below what
//! the stream held, so nothing is applied twice after a resume. A stream's batches are
//! replayed in order by one thread (`Database::replay_install` relies on it to wait for an
//! old record life without deadlock); streams in parallel. The dependency mode keeps the
//! same guarantee another way (see dependency.rs).

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ditto_engine::{Database, Prefetch, Ts};
use ditto_log::catalog::Catalog;
use ditto_log::format::{decode_batch_checksums, FormatError, WriteView};
use ditto_log::replica::{open_replica, ReplicaLog};
use ditto_log::storage::{RealStorage, Storage};
use ditto_log::Epoch;
use parking_lot::{Condvar, Mutex};

use crate::protocol::{read_frame, Frame, Start, PROTOCOL_VERSION};
use crate::watermark::{Ordered, Prefix};

/// How a backup replays (for comparison; `Parallel` is the default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayMode {
    /// One thread for every stream, as classic replicas do.
    Serial,
    /// One thread per primary stream.
    Parallel,
    /// KuaFu's write-set dependency graph (crates/replication/src/dependency.rs): one
    /// dispatcher and one executor per primary stream; a barrier every `barrier_every`
    /// transactions (0: none).
    Dependency { barrier_every: u32 },
}

impl ReplayMode {
    /// `serial`, `parallel`, `dependency` (KuaFu's barrier every 1024 transactions) or
    /// `dependency:N` (a barrier every N; 0: none).
    pub fn parse(s: &str) -> Result<ReplayMode, String> {
        let bad = || format!("unknown replay mode '{s}' (serial, parallel, dependency or dependency:N)");
        match s {
            "serial" => Ok(ReplayMode::Serial),
            "parallel" => Ok(ReplayMode::Parallel),
            "dependency" => Ok(ReplayMode::Dependency { barrier_every: crate::dependency::KUAFU_BARRIER_EVERY }),
            _ => match s.strip_prefix("dependency:") {
                Some(n) => Ok(ReplayMode::Dependency { barrier_every: n.parse().map_err(|_| bad())? }),
                None => Err(bad()),
            },
        }
    }
}

/// A replay setting as written on the command line: a mode (`ReplayMode::parse`),
/// optionally followed by `+shared` (every replayed value points into its received batch
/// instead of being copied: Query Fresh's log-as-database) or `+shared:N` (values of N
/// bytes or more). Returns the mode and the smallest value shared.
pub fn parse_replay(s: &str) -> Result<(ReplayMode, Option<usize>), String> {
    let (mode, share) = match s.split_once('+') {
        None => (s, None),
        Some((m, "shared")) => (m, Some(0)),
        Some((m, rest)) => {
            let n = rest.strip_prefix("shared:").and_then(|n| n.parse().ok());
            (m, Some(n.ok_or_else(|| format!("unknown replay option '+{rest}' (+shared or +shared:N)"))?))
        }
    };
    Ok((ReplayMode::parse(mode)?, share))
}

impl std::fmt::Display for ReplayMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayMode::Serial => f.write_str("serial"),
            ReplayMode::Parallel => f.write_str("parallel"),
            ReplayMode::Dependency { barrier_every } if *barrier_every == crate::dependency::KUAFU_BARRIER_EVERY => {
                f.write_str("dependency")
            }
            ReplayMode::Dependency { barrier_every } => write!(f, "dependency:{barrier_every}"),
        }
    }
}

#[derive(Clone)]
pub struct BackupOptions {
    /// The primary's replication address, host:port.
    pub primary: String,
    pub data_dir: PathBuf,
    /// Engine workers of this node (its snapshot readers; replay has its own threads).
    pub workers: usize,
    /// This node's name, as the primary shows it.
    pub node: String,
    /// A cluster's learner: the primary does not count its acknowledgements in its commit
    /// quorum (`Frame::Hello::learner`).
    pub learner: bool,
    pub replay: ReplayMode,
    /// Values of at least this many bytes are shared with their received batch, not
    /// copied (`parse_replay`'s `+shared`); `None`: every value is copied.
    pub share_values_from: Option<usize>,
    /// Print join progress to stderr.
    pub progress: bool,
    /// Told every replayed write that gave a key a value or took it away: (table, key,
    /// commit ts, +1 or -1), on a replay thread, when installed (the server keeps its key
    /// counts with it). Must not block.
    pub on_keys: Option<KeysHook>,
    /// Where its files go (`None`: the real file system; tests inject full disks and
    /// failed fsyncs here).
    pub storage: Option<Arc<dyn Storage>>,
    /// How often the backup writes its own checkpoint (at its read view) and deletes the
    /// replica log files it covers, so its disk use stays bounded.
    pub checkpoint_every: Duration,
    /// Also checkpoint once it has received this many bytes since its last checkpoint
    /// (and at least `checkpoint_log_growth_percent` of that checkpoint's size), as a
    /// primary does: a cluster node promoted from this backup replays at most that much of
    /// its replica log before it serves (docs/cluster.md). 0: time only.
    pub checkpoint_log_min_bytes: u64,
    pub checkpoint_log_growth_percent: u64,
    /// The most its checkpoints write a second (0: unpaced;
    /// `ditto_log::LogOptions::checkpoint_write_bytes_per_s`).
    pub checkpoint_write_bytes_per_s: u64,
    /// Replica log files are closed past this size (only closed ones are deleted).
    pub replica_file_bytes: u64,
    /// Recover at most up to this timestamp at the start (a failover's recovery point:
    /// what lies above it is discarded, docs/cluster.md).
    pub recover_upto: Option<Ts>,
    /// Replay only what the primary has released (`Hold`): a cluster node's backup, so
    /// that a failover can promote it in place (`Backup::cut_at`).
    pub hold_replay_at_release: bool,
    /// Most bytes of batches held at the release kept in memory; those above it are read
    /// back from the replica log when released (`Hold`). Default `HELD_IN_MEMORY_MAX`.
    pub held_in_memory_max: u64,
    /// An engine kept from this node's previous backup run, cut where the directory was
    /// sealed (`Backup::cut_at`, then `ditto_log::sealed::seal_tail` or `seal_at_point`):
    /// taken as it is instead of loading the directory (`open_replica_with`);
    /// `recover_upto` does not apply.
    pub engine: Option<Arc<Database>>,
    /// With `engine` and a directory sealed at a failover's point: write the first
    /// checkpoint at once, which takes the sealed logs away (default). Off, they stay
    /// until the policy's next checkpoint (tests of a second change in place before it).
    pub checkpoint_sealed: bool,
    /// Any of them set stops: a backup still trying to join its primary gives up at once
    /// (`BackupError::Stopped`); it has acknowledged nothing. (A cluster node's server
    /// passes its supervisor's stop and the stop signals: a SIGTERM during a join that
    /// follows a new primary in place waited for the join before.)
    pub stop: Vec<Arc<AtomicBool>>,
    /// Join with a fresh copy of the primary's checkpoint, whatever the directory holds
    /// (it is not loaded; it is replaced once the copy is whole): a running backup whose
    /// primary can no longer resume it (`Backup::join_again`, `JoinAgain::Copy`) joins
    /// again so.
    pub fresh_copy: bool,
    /// Where the join's connection is put while it is made, so that another thread can
    /// cut it short (`JoinCancel`): a checkpoint copy is read without a timeout.
    pub cancel: Option<JoinCancel>,
    /// Told at its start that it holds more than its restarted primary's point, it keeps
    /// what it holds and does not join (`BackupError::HoldsWhatThePrimaryLost`: those
    /// commits may have been acknowledged), rather than copy the primary's checkpoint
    /// over it. On by default; a cluster's backups turn it off: a failover's point lies
    /// above every commit ever acknowledged, so what a backup holds above it was not.
    pub keep_what_the_primary_lost: bool,
    /// A cluster's backup: its primary must write as many log streams as this node has
    /// workers, or it is refused. Every node of a cluster runs the same number: a
    /// failover's plan takes each node's report of its streams as the cluster's, and a
    /// node reporting more (its own, from a checkpoint) would lower the recovery point
    /// below acknowledged commits (`ditto_cluster::failover::plan` refuses such reports
    /// too). Off by default: a standalone backup replays any number.
    pub same_streams: bool,
    /// The password its primary asks of backups (a server's `masterauth`: the primary's
    /// `requirepass`; in a cluster, its secret): proved on every connection, never sent
    /// (`Frame::Challenge`), and asked of the primary first. A backup with one takes no
    /// primary that cannot prove it holds it (or one of `auth_also`).
    pub auth: Option<crate::protocol::Secret>,
    /// Other passwords it takes of its primary's proof, while a cluster's secret is
    /// rotated (the primary shows one of them, or `auth`).
    pub auth_also: Vec<crate::protocol::Secret>,
    /// TLS to the primary (`tls_replication`): `None`, plaintext.
    pub tls: Option<Arc<crate::tls::LinkTls>>,
    /// Paces the fsyncs of the replica log as a primary's `interval` durability paces its
    /// log's (a server's `--durability interval|nosync`): at most one per interval, and
    /// everything received meanwhile shares it. `None` (`every-batch`): one per burst, as
    /// soon as the last is done. The replica log is fsynced under every setting, and
    /// receipt is acknowledged as it comes under every setting: only the `durable`
    /// acknowledgements (and replay, which follows them) wait. A stop (a cluster's fence)
    /// or a full queue does not wait.
    pub persist_interval: Option<Duration>,
}

/// Cuts a join short from another thread (`BackupOptions::cancel`): sets the stop flag
/// and shuts the join's connection down, so a checkpoint copy being read ends at once
/// with an error (`BackupError::Stopped` before it connects).
#[derive(Clone, Default)]
pub struct JoinCancel {
    stop: Arc<AtomicBool>,
    conn: Arc<Mutex<Option<TcpStream>>>,
}

impl JoinCancel {
    pub fn cancel(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(s) = self.conn.lock().as_ref() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn cancelled(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Keeps (a clone of) the join's connection; false, and the connection shut down, if
    /// the join was cancelled already.
    fn hold(&self, s: &TcpStream) -> bool {
        let mut c = self.conn.lock();
        *c = s.try_clone().ok();
        if self.cancelled() {
            let _ = s.shutdown(std::net::Shutdown::Both);
            return false;
        }
        true
    }
}

impl BackupOptions {
    /// Defaults for everything but where the primary is and where the data goes.
    pub fn new(primary: &str, data_dir: &Path, workers: usize, node: &str) -> BackupOptions {
        BackupOptions {
            primary: primary.to_string(),
            data_dir: data_dir.to_path_buf(),
            workers,
            node: node.to_string(),
            learner: false,
            replay: ReplayMode::Parallel,
            share_values_from: None,
            progress: false,
            on_keys: None,
            storage: None,
            checkpoint_every: Duration::from_secs(300),
            checkpoint_log_min_bytes: 0,
            checkpoint_log_growth_percent: 100,
            checkpoint_write_bytes_per_s: 0,
            replica_file_bytes: 64 << 20,
            recover_upto: None,
            hold_replay_at_release: false,
            held_in_memory_max: HELD_IN_MEMORY_MAX,
            engine: None,
            checkpoint_sealed: true,
            stop: Vec::new(),
            fresh_copy: false,
            cancel: None,
            keep_what_the_primary_lost: true,
            same_streams: false,
            auth: None,
            auth_also: Vec::new(),
            tls: None,
            persist_interval: None,
        }
    }
}

/// See [`BackupOptions::on_keys`].
pub type KeysHook = Arc<dyn Fn(ditto_engine::TableId, &[u8], Ts, i64) + Send + Sync>;

/// Figures of one backup (all timestamps are the primary's).
#[derive(Default, Debug)]
pub struct BackupState {
    /// The id of the database this backup holds (`crate::identity`; 0: none said).
    pub database: AtomicU64,
    pub received: AtomicU64,
    pub durable: AtomicU64,
    pub replayed: AtomicU64,
    pub released: AtomicU64,
    /// What snapshots read at: min(released, replayed).
    pub visible: AtomicU64,
    pub connected: AtomicBool,
    pub batches_received: AtomicU64,
    pub batches_skipped: AtomicU64,
    /// Bytes of received batches held for replay (`REPLAY_QUEUE_BYTES_MAX`).
    pub replay_queued_bytes: AtomicU64,
    /// Replay held at the release (`Hold`): bytes of held batches in memory
    /// (`BackupOptions::held_in_memory_max`), held batches that lie in the replica log
    /// alone, and how many such were read back from it since the start.
    pub held_bytes: AtomicU64,
    pub held_spilled: AtomicU64,
    pub held_read_back: AtomicU64,
    /// Replay's queues past `REPLAY_QUEUE_BYTES_MAX` while a replayer waits for the read
    /// view (`Engine::dispatch`): queued batches that lie in the replica log alone, and how
    /// many such were read back from it since the start.
    pub replay_spilled: AtomicU64,
    pub replay_read_back: AtomicU64,
    pub txns_replayed: AtomicU64,
    pub bytes_received: AtomicU64,
    pub reconnects: AtomicU64,
    /// Replay CPU: the replay threads' own CPU time (`replay_cpu_ns`).
    pub replay_cpu: Arc<crate::cpu::ThreadCpu>,
    /// Acks sent to the primary, and the replayed watermark the last one sent said
    /// (`ReplayAcks`).
    pub acks_sent: AtomicU64,
    pub acked_replayed: AtomicU64,
    /// When this backup last sent (or began to send) an ack: the primary's lease stands on
    /// its acks, so a cluster's failover waits until it has run out (`Backup::last_acked`).
    pub last_ack: Mutex<Option<Instant>>,
    /// The newest `Frame::Heartbeat::sent_us` received on the current link (0: none), which
    /// every ack echoes (`Frame::Ack::echo_us`).
    pub echo_us: AtomicU64,
    /// Transactions whose install waited for what lies below a batch's `reuse_ts` (a
    /// reused record id's old life, `Engine::await_replayed`).
    pub reuse_waits: AtomicU64,
    /// When the newest frame of any kind (heartbeats too) arrived, on a monotonic clock
    /// (`heard_ago`; 0: none yet): a cluster's failure detector hears the primary by it.
    /// (Unix milliseconds until 2026-12-07: a backup that had heard nothing reported the
    /// Unix time as its age, and a wall clock stepped back read "heard just now" for as
    /// long; found by a review.)
    last_frame_mono_us: AtomicU64,
    /// The timestamp of this backup's newest own checkpoint (0: none yet this run), and
    /// how many it wrote.
    pub checkpoint_ts: AtomicU64,
    pub checkpoints: AtomicU64,
    pub failure: Mutex<Option<String>>,
    /// Why the primary last refused this backup's reconnection (a password it no longer
    /// takes, a name taken), while the link is down; cleared when the link resumes. The
    /// backup goes on trying and serving its reads meanwhile.
    pub refused: Mutex<Option<String>>,
    /// Batches refused unacknowledged because their records do not parse (a primary's
    /// bug), and why the last was, until its stream is received that far (`Refusal`).
    pub batches_refused: AtomicU64,
    pub batch_refused: Mutex<Option<String>>,
    /// The replay mode, as `ReplayMode` prints it.
    pub replay_mode: Mutex<String>,
    /// A cluster's learner (`BackupOptions::learner`) until `Backup::count_in_quorum`.
    pub learner: AtomicBool,
    /// The highest commit the primary said it had acknowledged under any policy
    /// (`Frame::Heartbeat::acknowledged`; `released` counts too).
    pub acknowledged: AtomicU64,
    /// The last transaction of any batch received `counted` (`Frame::Batch`): the primary
    /// may have released it on this backup's own acknowledgement, before saying so in
    /// `acknowledged`.
    pub counted: AtomicU64,
    /// Stopped because the primary can no longer resume it as it stands; how it may join
    /// again (`Backup::join_again`).
    pub join_again: Mutex<Option<JoinAgain>>,
    /// The read view this run started at (its log replayed up to its own cut, the primary's checkpoint copied, a
    /// cut at a failover's point, or an engine kept through a change of role in place), or
    /// the point it was cut at to follow the next primary. Its data is not read until the
    /// primary has released that far (`reads_held`): a failover that goes ahead without
    /// this node's report may discard what lies above the release, and so may a later
    /// failover that sets a lower point than the one it was cut at. 0: reads are never
    /// held.
    pub reads_from: AtomicU64,
    /// Data reads that waited for the release (`reads_held`) before they were answered,
    /// the longest wait (microseconds), and reads answered LOADING after it (the server's
    /// counts: INFO replication).
    pub reads_waited: AtomicU64,
    pub reads_waited_us_max: AtomicU64,
    pub reads_refused: AtomicU64,
    /// Bumped when this run's reads become held after being open (`Backup::cut`): a read
    /// that ran across the bump may have taken its snapshot at the view published since,
    /// and is run again (its server compares this before and after).
    pub gate_gen: AtomicU64,
}

impl BackupState {
    /// Whether reads of this backup's data wait: its read view lies above what the
    /// primary has released (`reads_from`).
    pub fn reads_held(&self) -> Option<(u64, u64)> {
        let from = self.reads_from.load(Ordering::Acquire);
        let released = self.released.load(Ordering::Acquire);
        (released < from).then_some((from, released))
    }
}

/// How a running backup that its primary can no longer resume as it stands joins again
/// (`Backup::join_again`; a standalone backup server does so by itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinAgain {
    /// With a fresh copy of the primary's checkpoint (`BackupOptions::fresh_copy`): the
    /// primary's log no longer holds what it lacks, or it restarted and began its new
    /// epoch above a point this backup does not hold.
    Copy,
    /// Cut at this point of the epoch it follows (everything above dropped), then resumed
    /// from the log (`BackupOptions::recover_upto`): the primary restarted into a new
    /// epoch that begins there, and this backup holds at least that much (more, when the
    /// old primary died before making what it shipped durable). If the cut cannot be made
    /// (its own checkpoint lies above the point), the primary sends a copy instead.
    CutAt(Ts),
}

/// A running backup: its database (read it through snapshots) and its figures.
pub struct Backup {
    pub db: Arc<Database>,
    pub state: Arc<BackupState>,
    pub primary: String,
    link: AckLink,
    persist: Arc<ToPersist>,
    engine: Arc<Engine>,
    /// Held by the checkpointer while it writes (a fence stops it short, then waits for it).
    ckpt_busy: Arc<Mutex<()>>,
    /// Set by a fence: a checkpoint being written stops short (`storage::Cancellable`).
    ckpt_cancel: Arc<AtomicBool>,
    /// The persister thread has ended (a fence waits for it: it deletes replica log files).
    persister_done: Arc<AtomicBool>,
    _lock: std::fs::File,
}

#[derive(thiserror::Error, Debug)]
pub enum BackupError {
    #[error("{0}")]
    Log(#[from] ditto_log::LogError),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("the primary refused: {0}")]
    Refused(String),
    /// The primary serves another database than the one its directory holds
    /// (`crate::identity::check`): it takes nothing from it, keeping what it holds.
    #[error("{0}")]
    OtherDatabase(String),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("stopped before it joined its primary")]
    Stopped,
    /// It holds commits its primary lost when it restarted (see `backup::start`): it does
    /// not join, keeping them.
    #[error("{0}")]
    HoldsWhatThePrimaryLost(String),
}

/// Runs `body`, a backup thread's (`what`); if it panics, the backup stops (its failure
/// says which thread panicked, unless it had failed already) and its link is shut, so the
/// primary sees it go and the receiver ends, as after any failure. Whether it panicked.
fn stopping_on_panic(state: &BackupState, link: &AckLink, what: &str, body: impl FnOnce()) -> bool {
    let ran = ditto_engine::catch_panic(body);
    if let Err(msg) = &ran {
        let why = format!("{what} of this backup panicked ({msg}); it stops acknowledging");
        tracing::error!("backup stopped: {why}");
        // Over a stop's reason too (a panic while a fence drains): the fence then says why
        // it failed, not only that the backup was stopped.
        let mut failure = state.failure.lock();
        match &*failure {
            Some(f) if !f.starts_with("stopped: ") => {}
            _ => *failure = Some(why),
        }
        drop(failure);
        let _ = link.lock().shutdown(std::net::Shutdown::Both);
    }
    ran.is_err()
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackupError {
    let what = what.into();
    move |source| BackupError::Io { what, source }
}

const STATE_FILE: &str = "REPLICA_STATE";

/// The primary's epoch a backup's directory `dir` last followed (`None`: none recorded).
/// A record that cannot be read, or does not parse, is an error: read as none, a backup
/// asked its primary for a copy and set aside what it held, commits a restarted primary
/// lost included (before 2026-12-05; found by a review).
pub fn read_followed_epoch(dir: &Path) -> std::io::Result<Option<Epoch>> {
    Ok(read_followed(dir)?.map(|(e, _)| e))
}

/// `read_followed_epoch`, and the run of the primary that served it (`Primary::run`; 0:
/// not recorded: the old primary's own epoch, a record of an older build).
pub fn read_followed(dir: &Path) -> std::io::Result<Option<(Epoch, u64)>> {
    crate::identity::read_epoch_run(&dir.join(STATE_FILE))
}

fn write_followed_epoch(dir: &Path, e: Epoch, run: u64, storage: &dyn Storage) -> std::io::Result<()> {
    crate::identity::write_epoch_run(dir, STATE_FILE, e, run, storage)
}

const PROMOTION_FILE: &str = "PROMOTION";

/// Records, durably, that a cluster's promotion of the backup's directory `dir`, which
/// followed epoch `followed`, is about to cut it at a failover's point `point` and write
/// a checkpoint there (`promote_replica_dir` in the server). Only a promotion that also
/// cuts older epochs needs it (the directory missed a failover): should it be cut short
/// after its checkpoint, the directory then holds a checkpoint above the point its
/// followed epoch was cut at, which a node reports as not eligible, although it holds
/// exactly the recovered history; `finish_cut_short_promotion` tells the two apart. The
/// record also names where the directory's base lay before (a base already at the point
/// is no checkpoint of this promotion's).
pub fn mark_promotion(dir: &Path, followed: Epoch, point: Ts) -> std::io::Result<()> {
    let before = ditto_log::replica::base_ts(dir).map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = dir.join(format!("{PROMOTION_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "followed {} point {} base {}", followed.0, point.0, before.0)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(PROMOTION_FILE))?;
    ditto_log::storage::sync_dir(dir)
}

/// Removes `mark_promotion`'s record (the promotion done, abandoned, or its record read).
pub fn clear_promotion_mark(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(PROMOTION_FILE)) {
        Ok(()) => ditto_log::storage::sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The record's followed epoch, point and base before.
fn read_promotion_mark(dir: &Path) -> Option<(Epoch, Ts, Ts)> {
    let s = std::fs::read_to_string(dir.join(PROMOTION_FILE)).ok()?;
    let w: Vec<&str> = s.split_whitespace().collect();
    match w[..] {
        ["followed", e, "point", p, "base", b] => {
            Some((Epoch(e.parse().ok()?), Ts(p.parse().ok()?), Ts(b.parse().ok()?)))
        }
        _ => None,
    }
}

/// Finishes a promotion of `dir` that a crash cut short once its checkpoint at the point
/// was written: `mark_promotion`'s record names the epoch the directory followed, which it
/// still names, and a point above where its base lay before, where its newest checkpoint
/// now lies (a seal there is not the promotion's). As the promotion would have, the
/// replica log (all of it at or below the point is in that checkpoint, and what lies above
/// was discarded) and then the followed epoch go, each removal durable before the next,
/// and the record last. The directory is then a primary's holding the recovered history up
/// to the point, as after a promotion whose server stopped before it wrote. A record that
/// does not match (the promotion stopped before its checkpoint, and the directory is as it
/// was; or it was done) is removed. Call it only while no server runs on `dir`. Returns
/// the point if it finished one.
pub fn finish_cut_short_promotion(dir: &Path) -> Result<Option<Ts>, BackupError> {
    let record = dir.join(PROMOTION_FILE);
    if !record.exists() {
        return Ok(None);
    }
    let clear = |why: &str| clear_promotion_mark(dir).map_err(io(format!("removing a promotion record ({why})")));
    let Some((followed, point, before)) = read_promotion_mark(dir) else {
        clear("unreadable")?;
        return Ok(None);
    };
    let recorded = read_followed_epoch(dir).map_err(io("reading the followed epoch, to finish a promotion"))?;
    if recorded != Some(followed) || before >= point {
        clear("it does not match")?;
        return Ok(None);
    }
    let read = |what: &str, e: ditto_log::LogError| BackupError::Io {
        what: format!("reading {}'s {what}, to finish the promotion its record names", dir.display()),
        source: std::io::Error::other(e.to_string()),
    };
    let base = ditto_log::replica::base_ts(dir).map_err(|e| read("base", e))?;
    let ckpt = ditto_log::replica::newest_checkpoint_ts(dir).map_err(|e| read("checkpoint", e))?;
    if base != point || ckpt != Some(point) {
        clear("it does not match")?;
        return Ok(None);
    }
    end_promotion(dir)?;
    Ok(Some(point))
}

/// The last steps of a promotion of the backup's directory `dir`, once its checkpoint at
/// the point is written: the replica log (all of it at or below the point is in that
/// checkpoint), then the followed epoch, each removal durable before the next (a power
/// loss must not leave the followed epoch gone with the replica log still there), then
/// `mark_promotion`'s record. Each step may be cut short and done again.
pub fn end_promotion(dir: &Path) -> Result<(), BackupError> {
    let rdir = ditto_log::replica::replica_dir(dir);
    if rdir.exists() {
        std::fs::remove_dir_all(&rdir).map_err(io(format!("removing {}", rdir.display())))?;
        ditto_log::storage::sync_dir(dir).map_err(io(format!("syncing {}", dir.display())))?;
    }
    forget_followed(dir)?;
    clear_promotion_mark(dir).map_err(io("removing the promotion's record"))
}

/// Removes the record of the epoch a backup's directory `dir` followed, durably, as its
/// promotion to a primary ends. The run that served that epoch is kept first, where
/// recorded (`identity::EPOCH_RUN_FILE`): the primary that opens the next epoch from it
/// then refuses a backup of that epoch number served by another run (another history),
/// where it would have resumed it or told it to cut. Cut short, it may be done again.
pub fn forget_followed(dir: &Path) -> Result<(), BackupError> {
    if let Some((e, run)) = read_followed(dir).map_err(io("reading the followed epoch"))?.filter(|&(_, r)| r != 0) {
        crate::identity::write_epoch_run(dir, crate::identity::EPOCH_RUN_FILE, e, run, &RealStorage)
            .map_err(io("keeping the followed epoch's run"))?;
    }
    match std::fs::remove_file(dir.join(STATE_FILE)) {
        Ok(()) => ditto_log::storage::sync_dir(dir).map_err(io(format!("syncing {}", dir.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("removing the followed epoch")(e)),
    }
}

/// Tells the primary at the other end of `stream` why this backup refuses it, and closes.
fn refuse_and_close(stream: &TcpStream, reason: &str) {
    let _ = (&*stream).write_all(&Frame::Refuse { reason: reason.to_string() }.encode());
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// A primary's refusal as an error: of another database (`crate::identity`), or any other.
fn refused(reason: String) -> BackupError {
    match reason.starts_with(crate::identity::OTHER_DATABASE) {
        true => BackupError::OtherDatabase(reason),
        false => BackupError::Refused(reason),
    }
}

/// Whether a first join that failed with `e` is worth another try: the primary not (yet)
/// listening, the connection reset, aborted or closed before the welcome, or no welcome
/// within the read timeout. Other errors (a damaged frame, say) are reported.
fn retryable(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | WouldBlock | TimedOut
    )
}

/// How long a backup that starts tries again while its primary refuses it because a live
/// link has its name (`primary::NAME_TAKEN`): its own older connection is closed within
/// this (one it closed, at once; a half-open one silent for 4 s, once it is), another
/// backup's is not.
const NAME_TAKEN_WAIT: Duration = Duration::from_secs(6);

/// How long a backup waits for any frame from its primary before it drops the link.
pub const SILENCE_MAX: Duration = Duration::from_secs(5);

/// A backup's checkpointer looks this often whether the backup has stopped.
const CHECKPOINTER_STEP: Duration = Duration::from_millis(100);

/// A connection to the primary, its hello said: the stream, its reader, and where the
/// password's exchange ended it, the refusal (the primary's, or this backup's own).
type Connected = (TcpStream, BufReader<TcpStream>, Option<Frame>);

fn connect(
    addr: &str,
    tls: Option<&crate::tls::LinkTls>,
    hello: &Frame,
    auth: Option<&crate::protocol::Secret>,
    auth_also: &[crate::protocol::Secret],
) -> std::io::Result<Connected> {
    // Bounded, so that a stop asked meanwhile (`BackupOptions::stop`) is seen: a host that
    // drops packets would otherwise hold a connect for minutes.
    let mut last = None;
    let mut connected = None;
    for a in std::net::ToSocketAddrs::to_socket_addrs(addr)? {
        match TcpStream::connect_timeout(&a, SILENCE_MAX) {
            Ok(s) => {
                connected = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let s = connected.ok_or_else(|| {
        last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr}: no address")))
    })?;
    // (On the real socket: with TLS, the tunnel's ends with it.)
    crate::tls::keep_alive(&s)?;
    let s = match tls {
        Some(t) => t.connect(s, addr)?,
        None => s,
    };
    s.set_nodelay(true)?;
    // A fresh nonce on each connection, where this backup holds a password.
    let mut hello = hello.clone();
    let ours = match &mut hello {
        Frame::Hello { proves, .. } => {
            *proves = auth.map(|_| crate::proof::nonce());
            *proves
        }
        _ => None,
    };
    (&s).write_all(&hello.encode())?;
    let r = BufReader::with_capacity(4 << 20, s.try_clone()?);
    let (Some(auth), Some(ours), Frame::Hello { node, .. }) = (auth, ours, &hello) else { return Ok((s, r, None)) };
    // The primary proves it holds the password before this backup proves anything: a
    // process on the primary's port that cannot is refused here, as a primary refuses a
    // backup without it (and is told nothing it could show anyone).
    s.set_read_timeout(Some(SILENCE_MAX))?;
    let not_proved = |why: &str| {
        Frame::Refuse {
        reason: format!(
            "{}: the peer at {addr} {why}: it is not the primary, or the backup's masterauth is not this primary's requirepass (in a cluster: their cluster secrets differ)",
            crate::primary::AUTH_REFUSED
        ),
    }
    };
    // Bounded in size and in time as a whole, as a primary reads a hello: a peer that has
    // proved nothing allocates no large frame, nor holds this side past `SILENCE_MAX`.
    // (Read from the socket itself: `r` has buffered nothing yet.)
    let first = crate::protocol::read_frame_at_most(
        &mut crate::tls::Until::new(&s, Instant::now() + SILENCE_MAX),
        1 + 4 + crate::protocol::REFUSE_REASON_MAX,
    )?;
    let why = match first {
        Some(Frame::Challenge { salt, nonce, proof }) => {
            let salted = salt.to_le_bytes();
            let t = crate::protocol::link_transcript(node, &salted, &ours, &nonce);
            // (Proved with the password the primary proved it holds: either may show either
            // of a rotation's secrets.)
            let taken = std::iter::once(auth).chain(auth_also);
            if let Some(held) = crate::proof::matching(taken, crate::proof::Side::Accepts, &t, &proof) {
                let proof = crate::proof::prove(held, crate::proof::Side::Connects, &t);
                (&s).write_all(&Frame::Proof { proof }.encode())?;
                return Ok((s, r, None));
            }
            "did not prove it holds this backup's password"
        }
        Some(f @ Frame::Refuse { .. }) => return Ok((s, r, Some(f))),
        None => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before its welcome")),
        Some(_) => "asks no password of its backups, so cannot prove it holds this one's",
    };
    // This backup's own refusal: the connection closed, nothing more sent.
    let _ = s.shutdown(std::net::Shutdown::Both);
    Ok((s, r, Some(not_proved(why))))
}

/// Joins the primary (a checkpoint if this node holds nothing the primary can resume,
/// else the log above what it holds) and starts receiving and replaying. Returns once the
/// database is loaded and the live log flows; the backup then runs on its own threads.
pub fn start(opts: BackupOptions) -> Result<Backup, BackupError> {
    let storage: Arc<dyn Storage> = opts.storage.clone().unwrap_or_else(|| Arc::new(RealStorage));
    let dir = opts.data_dir.clone();
    std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    let recorded = read_followed(&dir).map_err(io("reading the epoch this backup followed"))?;
    let mut followed = recorded.map(|(e, _)| e);
    // The run of the primary that served it (`Primary::run`), where recorded: a primary of
    // that epoch number in another run is another history (`crate::identity::check_run`).
    let followed_run = recorded.map_or(0, |(_, r)| r);
    // The database whose history the directory holds, if any primary was followed (or
    // served) here: a primary of another is taken nothing from (`identity::check_welcome`).
    let mut database = crate::identity::read(&dir).map_err(io("reading the directory's database id"))?;
    if followed.is_none() && opts.recover_upto.is_some() {
        // An old primary that rejoins: its own log (of this epoch) is cut at the recovery
        // point and kept (`open_replica_upto`), and it follows on from there. The epoch is
        // saved first, so a crash during or after the cut still resumes from what it kept.
        // (A switchover's old primary that follows in place sealed its log already.)
        let own = match ditto_log::recovery::primary_log_epoch(&dir)? {
            Epoch(0) => ditto_log::sealed::own_log_epoch(&dir)?,
            e => e,
        };
        if own.0 > 0 {
            // The run it served that epoch in, where recorded: its next primary, promoted
            // from a backup of that run, then takes it as of one history.
            let run = crate::identity::run_of(&dir, own).map_err(io("reading the run of its own epoch"))?;
            write_followed_epoch(&dir, own, run, &*storage).map_err(io("saving the followed epoch"))?;
            followed = Some(own);
        }
    }
    // A fresh copy loads nothing: it takes the directory's lock, and what the directory
    // holds is replaced once the copy is whole (below), as for a backup that held nothing
    // the primary could resume.
    let (opened, fresh_lock) = match &opts.engine {
        _ if opts.fresh_copy => (None, Some(ditto_log::replica::lock_replica_dir(&dir)?)),
        Some(db) => (Some(ditto_log::replica::open_replica_with(&dir, Arc::clone(db))?), None),
        None => (Some(ditto_log::replica::open_replica_upto(&dir, opts.workers, &storage, opts.recover_upto)?), None),
    };
    // With the directory opened (and locked): a promotion a record still names is
    // abandoned (a cluster node finished or removed it before; a standalone backup never
    // finishes one), and its record must not be taken for this run's later.
    clear_promotion_mark(&dir).map_err(io("removing an abandoned promotion's record"))?;
    // A copy an earlier run did not finish (it may be gigabytes): a copy starts afresh, and
    // a resume needs none of it.
    match std::fs::remove_dir_all(dir.join("incoming-checkpoint")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!("could not remove an unfinished checkpoint copy: {e}")
        }
        _ => {}
    }
    if let Some(o) = opened.as_ref().filter(|o| o.report.log_txns_dropped_above_cut > 0) {
        tracing::warn!(
            "recovery left out {} transactions above the cut at ts {}",
            o.report.log_txns_dropped_above_cut,
            o.cut.0
        );
    }
    // (Following epoch 0: a copy moved in and not loaded, its epoch not saved. It holds
    // nothing the primary can resume, and says so: a hello of epoch 0 holding more would
    // count as holding what a restarted primary lost.)
    let have = match (followed, &opened) {
        (Some(e), Some(o)) if e > Epoch(0) && o.cut > Ts::ZERO => o.cut,
        _ => Ts::ZERO,
    };
    let cancelled = || {
        opts.stop.iter().any(|s| s.load(Ordering::Acquire)) || opts.cancel.as_ref().is_some_and(JoinCancel::cancelled)
    };
    let hello = Frame::Hello {
        version: PROTOCOL_VERSION,
        // Holding nothing the primary can resume: it sends its checkpoint.
        epoch: if opts.fresh_copy { Epoch(0) } else { followed.unwrap_or(Epoch(0)) },
        have_ts: have,
        node: opts.node.clone(),
        learner: opts.learner,
        proves: None,
        database: database.map_or(0, crate::identity::DatabaseId::to_wire),
        run: if opts.fresh_copy { 0 } else { followed_run },
    };
    // The primary may not be up yet (a cluster starts its new primary and its backups at
    // once): try often, for a while, saying so once a second.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut said = Instant::now() - Duration::from_secs(1);
    let mut first_refused: Option<Instant> = None;
    type Joined = (TcpStream, BufReader<TcpStream>, Option<Frame>);
    let mut join = |hello: &Frame| -> Result<Joined, BackupError> {
        loop {
            // A connection refused (the primary not up yet), reset or closed before its welcome
            // (a primary stopping, a proxy's first connection), or a welcome that does not come
            // within `SILENCE_MAX` (a peer that accepts and never answers): tried again until
            // the deadline. The checkpoint that may follow is read without a timeout.
            let attempt = connect(&opts.primary, opts.tls.as_deref(), hello, opts.auth.as_ref(), &opts.auth_also)
                .and_then(|(s, mut r, refused)| {
                    if refused.is_some() {
                        return Ok((s, r, refused));
                    }
                    s.set_read_timeout(Some(SILENCE_MAX))?;
                    // Held from here, so that a cancel shuts it and the read below ends.
                    if opts.cancel.as_ref().is_some_and(|c| !c.hold(&s)) {
                        return Err(std::io::Error::other("the join was cancelled"));
                    }
                    let w = loop {
                        match read_frame(&mut r)? {
                            // The primary is writing the checkpoint it will send (it says so
                            // every second): the welcome comes after, however long that takes,
                            // unless the backup is stopped or its join cancelled meanwhile
                            // (before, the start waited for it, or for good while the primary
                            // went on saying so).
                            Some(Frame::Heartbeat { .. }) if cancelled() => {
                                return Err(std::io::Error::other("the join was cancelled"))
                            }
                            Some(Frame::Heartbeat { .. }) => continue,
                            Some(w) => break w,
                            None => {
                                return Err(std::io::Error::new(
                                    std::io::ErrorKind::UnexpectedEof,
                                    "closed before its welcome",
                                ))
                            }
                        }
                    };
                    s.set_read_timeout(None)?;
                    Ok((s, r, Some(w)))
                });
            match attempt {
                // A live link has this backup's name: its own older connection, closing or
                // being closed, or another backup's (`Primary::name_taken`). Tried again
                // for `NAME_TAKEN_WAIT` from the first such refusal, then refused for good.
                Ok((_, _, Some(Frame::Refuse { reason })))
                    if reason.starts_with(crate::primary::NAME_TAKEN)
                        && first_refused.get_or_insert_with(Instant::now).elapsed() < NAME_TAKEN_WAIT =>
                {
                    if said.elapsed() >= Duration::from_secs(1) {
                        tracing::warn!("joining the primary at {}: it refused: {reason}; retrying", opts.primary);
                        said = Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(c) => return Ok(c),
                Err(_) if cancelled() => return Err(BackupError::Stopped),
                Err(e) if Instant::now() < deadline && retryable(&e) => {
                    if said.elapsed() >= Duration::from_secs(1) {
                        tracing::warn!("joining the primary at {}: {e}; retrying", opts.primary);
                        said = Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => {
                    return Err(BackupError::Io { what: format!("joining the primary at {}", opts.primary), source: e })
                }
            }
        }
    };
    // Each welcome checked for its database and, for the epoch it follows, the primary's
    // run (`identity::check_welcome`) before anything of it is taken; the id to take, where
    // the directory names none, is written once the welcome's other checks pass (below).
    // (A fresh copy's too: its hello names no run, see the epoch's check below.)
    let followed_as = followed.map(|e| (e.0, followed_run));
    let check_identity = |welcome: &Option<Frame>, stream: &TcpStream| {
        let Some(Frame::Welcome { epoch, database: theirs, run, .. }) = welcome else { return Ok(None) };
        crate::identity::check_welcome(database, followed_as, epoch.0, *theirs, *run, &dir, &opts.primary).map_err(
            |reason| {
                refuse_and_close(stream, &reason);
                BackupError::OtherDatabase(reason)
            },
        )
    };
    let (mut stream, mut reader, mut welcome) = join(&hello)?;
    let mut adopt = check_identity(&welcome, &stream)?;
    if let (Some(Frame::Welcome { start: Start::CutAt { .. }, .. }), false) =
        (&welcome, opts.keep_what_the_primary_lost)
    {
        // (A cluster's backup: what it holds above the point was never acknowledged.)
        let fresh = Frame::Hello {
            version: PROTOCOL_VERSION,
            epoch: Epoch(0),
            have_ts: Ts::ZERO,
            node: opts.node.clone(),
            learner: opts.learner,
            proves: None,
            database: database.map_or(0, crate::identity::DatabaseId::to_wire),
            run: 0,
        };
        (stream, reader, welcome) = join(&fresh)?;
        adopt = check_identity(&welcome, &stream)?;
    }
    if let (Some(Frame::Welcome { epoch: now, start: Start::CutAt { point }, .. }), Some(o)) = (&welcome, &opened) {
        // The primary restarted from below what this backup holds: it lost commits this
        // backup has. Opened already (its log above its own cut folded into a checkpoint),
        // it cannot cut lower; and unlike a running backup (`Receiver`), it does not know
        // how far the primary had acknowledged, so it cannot tell whether they were
        // acknowledged writes (under a `received` policy, or released by a quorum of
        // backups alone). It keeps them and does not join: a person decides.
        return Err(BackupError::HoldsWhatThePrimaryLost(format!(
            "this backup holds commits of epoch {} up to ts {}, above ts {}, where its primary restarted into epoch {}: the primary lost them, and they may have been acknowledged (under a `received` policy, or by a quorum of backups alone), so it does not join, which would discard them; its directory {} keeps them. To keep them, stop the primary and serve this directory as the primary (`ditto server --promote`); to discard them and copy the primary's data instead, empty the directory and start the backup again",
            followed.unwrap_or(Epoch(0)).0,
            o.cut.0,
            point.0,
            now.0,
            dir.display()
        )));
    }
    // (Its connection is held for a cancel since its connect, in `join`.)
    if opts.cancel.as_ref().is_some_and(JoinCancel::cancelled) {
        return Err(BackupError::Stopped);
    }
    let (epoch, streams, tables, start, run) = match welcome {
        Some(Frame::Welcome { epoch, streams, tables, start, run, .. }) => {
            check_welcome(streams, &tables)?;
            // A primary of an older epoch than the one this backup follows is stale
            // (deposed, or restored from an older copy): whatever it offers would discard
            // commits a later primary released with this backup in its quorum. (A primary
            // refuses such a backup itself; this is the backup's own check. A fresh copy's
            // too, since 2026-12-06: its hello says it holds nothing, so the primary checks
            // nothing of it, and a primary restored from an older copy, or a backup behind
            // this one promoted, at the same address before the copy came would have had
            // its older history copied over this one's; found by a review.)
            if let Some(f) = followed.filter(|&f| epoch < f) {
                return Err(BackupError::Refused(format!(
                    "the primary at {} is of epoch {}, older than epoch {} that this backup follows: it is stale (deposed, or restored from an older copy); this backup keeps what it holds in {} (point it at the current primary)",
                    opts.primary,
                    epoch.0,
                    f.0,
                    dir.display()
                )));
            }
            if opts.same_streams && streams as usize != opts.workers {
                return Err(BackupError::Refused(format!(
                    "the primary writes {streams} log streams and this node runs {} workers: every node of a cluster must run the same --workers",
                    opts.workers
                )));
            }
            (epoch, streams, tables, start, run)
        }
        Some(Frame::Refuse { reason }) => return Err(refused(reason)),
        other => return Err(BackupError::Protocol(format!("expected Welcome, got {other:?}"))),
    };
    // Taken from here (whatever follows is written to the directory): a directory that
    // names no database takes the primary's first, durably. (Not before the welcome's
    // checks: a refused one would name a database it took nothing from.)
    if let Some(id) = adopt.take().filter(|_| !matches!(start, Start::CutAt { .. })) {
        crate::identity::write(&dir, id, &*storage).map_err(io("saving the database id"))?;
        database = Some(id);
    }
    let resumed = matches!(start, Start::Resume);
    let (base, opened) = match start {
        Start::CutAt { point } => {
            return Err(BackupError::Protocol(format!(
                "told to cut at ts {} holding nothing the primary could resume",
                point.0
            )))
        }
        Start::Resume => {
            let Some(opened) = opened else {
                return Err(BackupError::Protocol(
                    "asked for a fresh copy of its checkpoint, the primary offered to resume instead".into(),
                ));
            };
            if opened.streams.is_some_and(|n| n != streams) {
                return Err(BackupError::Protocol(format!(
                    "the primary has {streams} streams, this backup's log {}",
                    opened.streams.unwrap_or(0)
                )));
            }
            add_tables(&opened.db, &dir, &tables, &*storage)?;
            if opts.progress {
                eprintln!("backup: resuming from ts {} (epoch {})", have.0, epoch.0);
            }
            (have, opened)
        }
        Start::Checkpoint { ts, bytes } => {
            let t0 = Instant::now();
            let progress = opts.progress.then_some(bytes);
            let incoming = receive_checkpoint(&mut reader, &dir, ts, &tables, progress).map_err(|e| {
                if cancelled() {
                    BackupError::Stopped
                } else {
                    e
                }
            })?;
            // Replace whatever this node held with the primary's checkpoint: its engine
            // goes, its directory's lock stays held until the copy is opened (let go here
            // before, another process could open the directory half replaced).
            let lock = fresh_lock.or(opened.map(|o| o.lock));
            // First, it follows no epoch (`Epoch(0)`, read as "holding nothing the primary
            // can resume": its next start is sent a copy) until the copy is loaded and the
            // new epoch saved below. Before 2026-12-02 the old epoch stayed named while the
            // copy loaded (seconds, for a large one), and a crash then left the new epoch's
            // checkpoint under the old epoch's name: the next start asked to resume it as
            // the old epoch's history, and a primary that restarted below it answered with
            // a cut the backup refused at every start.
            write_followed_epoch(&dir, Epoch(0), 0, &*storage).map_err(io("saving the followed epoch"))?;
            // Moved aside (a rename each, durable before the next), from the newest of what
            // it held to the oldest: a crash midway leaves an older state that opens as it is.
            let gone = ditto_log::replica::replaced_by_a_checkpoint_copy(&dir)?;
            ditto_log::replica::to_trash(&dir, &gone)?;
            // The checkpoint's tables first: a crash after this opens an empty directory
            // (which copies again), where a checkpoint in place with the catalog of what was
            // moved aside would be refused at every start ("no such table").
            let mut cat = Catalog::default();
            for (id, name) in &tables {
                cat.add(ditto_engine::TableId(*id), name);
            }
            cat.save(&dir, &*storage).map_err(io("saving the catalog"))?;
            std::fs::create_dir_all(dir.join("checkpoints")).map_err(io("creating checkpoints"))?;
            let ckpt = dir.join("checkpoints").join(format!("ckpt-{:020}", ts.0));
            std::fs::rename(&incoming, &ckpt).map_err(io("moving the received checkpoint in place"))?;
            storage.sync_dir(&dir.join("checkpoints")).map_err(io("syncing checkpoints"))?;
            storage.sync_dir(&dir).map_err(io("syncing the data directory"))?;
            let opened = match lock {
                Some(lock) => ditto_log::replica::open_replica_locked(&dir, opts.workers, &storage, lock)?,
                None => open_replica(&dir, opts.workers, &storage)?,
            };
            if opts.progress {
                eprintln!(
                    "backup: checkpoint at ts {} loaded: {} rows in {:.2} s",
                    ts.0,
                    opened.report.checkpoint_rows,
                    t0.elapsed().as_secs_f64()
                );
            }
            (ts, opened)
        }
    };
    write_followed_epoch(&dir, epoch, run, &*storage).map_err(io("saving the followed epoch"))?;
    let db = Arc::clone(&opened.db);
    // The size of the checkpoint this run started from (written by the open, or loaded).
    let opened_checkpoint_bytes = match opened.report.checkpoint_written_bytes.max(opened.report.checkpoint_bytes) {
        // An engine kept through a change of role in place: the checkpoint under it.
        0 => ditto_log::sealed::base_checkpoint_bytes(&dir),
        b => b,
    };
    // A replica log sealed at a failover's point (the engine kept through a change of role
    // in place): the first checkpoint is due at once, and takes it away.
    // With a long chain of them, the first checkpoint is due at once (and takes it away);
    // with a short one, the policy decides, counting the chain's bytes as received since
    // the last checkpoint (`ditto_log::sealed::CHECKPOINT_AT_LINKS`).
    let links = if opened.sealed.is_some() { ditto_log::sealed::sealed(&dir)?.len() } else { 0 };
    let mut seal_pending = links >= ditto_log::sealed::CHECKPOINT_AT_LINKS && opts.checkpoint_sealed;
    let chain_bytes = if links > 0 { ditto_log::sealed::chain_bytes(&dir) } else { 0 };
    let state = Arc::new(BackupState::default());
    state.learner.store(opts.learner, Ordering::Release);
    state.database.store(database.map_or(0, crate::identity::DatabaseId::to_wire), Ordering::Release);
    *state.replay_mode.lock() = match opts.share_values_from {
        None => opts.replay.to_string(),
        Some(0) => format!("{}+shared", opts.replay),
        Some(n) => format!("{}+shared:{n}", opts.replay),
    };
    for a in [&state.received, &state.durable, &state.replayed, &state.visible] {
        a.store(base.0, Ordering::Release);
    }
    // Whether or not its replay holds at the release, a backup's read view is the released
    // watermark once it runs, but its start's is its own: its replica log replayed to its
    // own cut, which may lie above what the primary released (a commit durable here that
    // a quorum had not acknowledged, under `all` with a backup down, say), so its reads
    // wait for the release. A cluster's backup: that holds of a cut at a failover's point
    // too (its cut there, or its engine kept through a change of role in place): a later
    // failover may set a lower point, if the new primary dies before a quorum holds what
    // it recovered, and discard what lies above it (taken as final before: found by the
    // simulation, docs/cluster.md). (A standalone backup's reads were not held before
    // 2026-12-02: restarted, it served commits no client had been answered for.)
    state.reads_from.store(base.0, Ordering::Release);
    // (A heartbeat time is of its primary's clock: none echoed from another link.)
    state.echo_us.store(0, Ordering::Release);
    state.connected.store(true, Ordering::Release);
    let rlog = ReplicaLog::create(&dir, Arc::clone(&storage), streams, 1, opts.replica_file_bytes.max(1 << 12))
        .map_err(io("creating the replica log"))?;
    let engine = Engine::start(
        Arc::clone(&db),
        Arc::clone(&state),
        streams as usize,
        base,
        opts.replay,
        opts.on_keys.clone(),
        Some(dir.clone()),
        opts.hold_replay_at_release.then_some(opts.held_in_memory_max),
    );
    engine.set_share_from(opts.share_values_from);
    let run_storage = Arc::clone(&storage);
    let persist = Arc::new(ToPersist::default());
    let link: AckLink = Arc::new(Mutex::new(stream.try_clone().map_err(io("cloning the link"))?));
    let persister = Persister {
        rlog,
        engine: Arc::clone(&engine),
        state: Arc::clone(&state),
        link: Arc::clone(&link),
        removed_to: base,
        interval: opts.persist_interval,
    };
    let persister_done = Arc::new(AtomicBool::new(false));
    // (Both threads below stop the backup, saying so, if they panic: before 2026-12-03 a
    // panicking persister left the backup linked and silent, acknowledging nothing, and
    // a fence waited for its end until its timeout.)
    {
        let (persist, done) = (Arc::clone(&persist), Arc::clone(&persister_done));
        let (state, link) = (Arc::clone(&state), Arc::clone(&link));
        std::thread::Builder::new()
            .name("ditto-repl-persist".into())
            .spawn(move || {
                ditto_log::sched::commit_thread();
                // (Failed by a panic, it takes no more jobs, as after a failed sync. Not
                // after a stop's end: a fence would then be told persisting failed.)
                if stopping_on_panic(&state, &link, "the persister", || persister.run(&persist)) {
                    persist.q.lock().failed = true;
                    persist.cv.notify_all();
                }
                done.store(true, Ordering::Release);
            })
            .map_err(io("starting the persister"))?;
    }
    let run = Receiver {
        opts: opts.clone(),
        storage,
        epoch,
        streams,
        received: Prefix::new(streams as usize, base),
        engine: Arc::clone(&engine),
        state: Arc::clone(&state),
        seq: 0,
        persist: Arc::clone(&persist),
        link: Arc::clone(&link),
        link_learner: opts.learner,
        held_at_start: if resumed { base } else { Ts::ZERO },
        scratch: Vec::new(),
        refusal: None,
        ended_on_refusal: false,
        run,
    };
    {
        let (state, link, persist) = (Arc::clone(&state), Arc::clone(&link), Arc::clone(&persist));
        std::thread::Builder::new()
            .name("ditto-repl-recv".into())
            .spawn(move || {
                ditto_log::sched::commit_thread();
                let mut run = run;
                stopping_on_panic(&state, &link, "the receiver", || run.follow(stream, reader));
                // Stopped for good (the backup failed, or its receiver panicked): the
                // persister ends once what is queued is durable, and no link will carry
                // replay's acks again.
                persist.close();
                run.engine.replay_acks.close();
            })
            .map_err(io("starting the receiver"))?;
    }
    // Its own checkpoints, at its read view, off the receiving path; the persister then
    // deletes the replica log files they cover (after each sync).
    let ckpt_busy = Arc::new(Mutex::new(()));
    let ckpt_cancel = Arc::new(AtomicBool::new(false));
    {
        let (db, state, dir, every) = (Arc::clone(&db), Arc::clone(&state), dir.clone(), opts.checkpoint_every);
        let pace = opts.checkpoint_write_bytes_per_s;
        // A fence stops a checkpoint short rather than wait for it (a second or more at
        // hundreds of MB, with a failover waiting on the fence).
        let cancel = Arc::clone(&ckpt_cancel);
        let storage = ditto_log::storage::Cancellable { inner: Arc::clone(&run_storage), cancel: Arc::clone(&cancel) };
        let busy = Arc::clone(&ckpt_busy);
        // The primary's rule (`CheckpointPolicy::due`), by time and by the log received.
        let min_bytes = opts.checkpoint_log_min_bytes;
        let policy = ditto_log::CheckpointPolicy {
            every: Some(every),
            log_growth_percent: if min_bytes > 0 { opts.checkpoint_log_growth_percent } else { 0 },
            log_min_bytes: min_bytes,
            reuse_min_ids: 0,
        };
        let poll = if min_bytes > 0 { every.min(Duration::from_millis(500)) } else { every };
        // When the last checkpoint was taken (or this run began), the bytes received then,
        // and that checkpoint's size.
        let (mut last_at, mut last_bytes, mut last_size) =
            (Instant::now(), state.bytes_received.load(Ordering::Acquire), opened_checkpoint_bytes);
        // The chain of sealed logs counts as received since the last checkpoint.
        let mut carried = chain_bytes;
        std::thread::Builder::new()
            .name("ditto-repl-ckpt".into())
            .spawn(move || {
                ditto_log::background_priority();
                loop {
                    if !seal_pending {
                        // In steps, so that a backup stopped (and let go) ends this thread,
                        // which holds its database, soon rather than a `poll` later.
                        let end = Instant::now() + poll;
                        while Instant::now() < end && state.failure.lock().is_none() {
                            std::thread::sleep(CHECKPOINTER_STEP.min(end.saturating_duration_since(Instant::now())));
                        }
                    }
                    if state.failure.lock().is_some() {
                        return;
                    }
                    let due = policy.due(ditto_log::Due {
                        elapsed: last_at.elapsed(),
                        log_bytes: state.bytes_received.load(Ordering::Acquire).saturating_sub(last_bytes) + carried,
                        last_checkpoint_bytes: last_size,
                        ids_released: 0,
                        ids_used: 0,
                    });
                    if due.is_none() && !seal_pending {
                        continue;
                    }
                    let view = state.visible.load(Ordering::Acquire);
                    if view <= state.checkpoint_ts.load(Ordering::Acquire) && !seal_pending {
                        continue; // nothing new since the last one
                    }
                    let Some(gate) = db.replay_checkpoint_gate() else {
                        // A key's late old life is being replayed onto its later record: a cut
                        // now would hold it under the wrong record id. It is over once the
                        // read view passes the later life's start; the next round will do.
                        tracing::info!("backup checkpoint put off: a key's earlier life is still being replayed");
                        if seal_pending {
                            std::thread::sleep(poll.min(Duration::from_millis(50)));
                        }
                        continue;
                    };
                    let bytes_then = state.bytes_received.load(Ordering::Acquire);
                    // A fence waits for this (`Backup::fence`); one that came first stops it.
                    let _busy = busy.lock();
                    if state.failure.lock().is_some() {
                        return;
                    }
                    // Once, whatever comes of it: after a failure the sealed log stays (recovery
                    // replays it), and the policy's next checkpoint takes it away.
                    seal_pending = false;
                    // A panic in it fails this round as an error does (and is told as one):
                    // the thread goes on. (Before 2026-12-03 it ended the thread without a
                    // word: the backup took no checkpoint again, its replica log grew until
                    // its disk filled, and a restart replayed all of it.)
                    let taken = ditto_engine::catch_panic(|| {
                        ditto_log::replica::checkpoint_replica(&db, gate, &dir, &storage, pace)
                    })
                    .unwrap_or_else(|msg| Err(ditto_log::LogError::Panicked("the backup's checkpointer", msg)));
                    match taken {
                        Ok(info) => {
                            (last_at, last_bytes, last_size, carried) = (Instant::now(), bytes_then, info.bytes, 0);
                            state.checkpoint_ts.fetch_max(info.ts.0, Ordering::AcqRel);
                            state.checkpoints.fetch_add(1, Ordering::Relaxed);
                            tracing::info!("backup checkpoint at ts {} ({} rows)", info.ts.0, info.rows);
                        }
                        Err(_) if cancel.load(Ordering::Acquire) => {
                            tracing::info!("backup checkpoint stopped short by a fence (nothing of it is left)");
                            return;
                        }
                        // A full disk or failed fsync: the replica log still holds everything;
                        // the next round tries again.
                        Err(e) => tracing::warn!("backup checkpoint failed (the replica log keeps everything): {e}"),
                    }
                }
            })
            .map_err(io("starting the checkpointer"))?;
    }
    // Last: an error return above leaves no acker behind.
    engine.start_replay_acks(&link).map_err(io("starting the replay acker"))?;
    Ok(Backup {
        db,
        state,
        primary: opts.primary,
        link,
        persist,
        engine,
        ckpt_busy,
        ckpt_cancel,
        persister_done,
        _lock: opened.lock,
    })
}

fn add_tables(db: &Database, dir: &Path, tables: &[(u32, String)], storage: &dyn Storage) -> Result<(), BackupError> {
    let mut have = db.tables();
    let mut new = Vec::new();
    for (id, name) in tables {
        match have.iter().find(|(i, _)| i.0 == *id) {
            Some((_, n)) if n == name => {}
            Some((_, n)) => {
                return Err(BackupError::Protocol(format!("table {id} is '{name}' on the primary, '{n}' here")))
            }
            None => {
                // Checked before the engine is asked (it asserts them): the next id, a name
                // not taken, within the limits. A primary only ever sends such; a peer that
                // did not stopped the receiver's thread without a word.
                check_new_table(*id, name, have.len(), have.iter().any(|(_, n)| n == name))?;
                have.push((ditto_engine::TableId(*id), name.clone()));
                new.push((ditto_engine::TableId(*id), name));
            }
        }
    }
    if new.is_empty() {
        return Ok(());
    }
    // The catalog first, durably, and only then the engine: a save that fails (a full
    // disk, a failed fsync) leaves the engine without the tables, so the next welcome
    // adds and saves them again. (Before 2026-12-06 the engine took them first: after a
    // failed save the link's next welcome found them there and saved nothing, batches of
    // the new table were acknowledged durable and replayed, and every later start of the
    // backup refused its own log, "no such table"; found by a review.)
    let mut cat = Catalog::default();
    for (id, name) in &have {
        cat.add(*id, name);
    }
    cat.save(dir, storage).map_err(io("saving the catalog"))?;
    for (id, name) in new {
        db.restore_table(id, name);
    }
    Ok(())
}

/// Refuses a table the primary names that this backup could not add as it is: `id` must be
/// the next one (`next`), below the engine's limit, its name new and within its limit.
fn check_new_table(id: u32, name: &str, next: usize, name_taken: bool) -> Result<(), BackupError> {
    let bad = |why: String| Err(BackupError::Protocol(format!("the primary names table {id} '{name}': {why}")));
    if id as usize != next {
        return bad(format!("the next table is {next}"));
    }
    if next >= ditto_engine::TABLES_MAX {
        return bad(format!("at most {} tables", ditto_engine::TABLES_MAX));
    }
    if name_taken {
        return bad("that name is another table's".into());
    }
    if name.len() > ditto_engine::TABLE_NAME_MAX {
        return bad(format!("a name of {} bytes, over {}", name.len(), ditto_engine::TABLE_NAME_MAX));
    }
    Ok(())
}

/// The stream count and tables a primary's welcome names, checked before anything of this
/// backup is changed: a stream count it could not hold (one a primary never has: each
/// stream is a worker), and tables not numbered 0, 1, 2... with names unique.
fn check_welcome(streams: u32, tables: &[(u32, String)]) -> Result<(), BackupError> {
    if streams == 0 || streams as usize > ditto_engine::WORKERS_MAX {
        return Err(BackupError::Protocol(format!(
            "the primary's welcome names {streams} streams (1 to {})",
            ditto_engine::WORKERS_MAX
        )));
    }
    for (i, (id, name)) in tables.iter().enumerate() {
        check_new_table(*id, name, i, tables[..i].iter().any(|(_, n)| n == name))?;
    }
    Ok(())
}

/// Receives the checkpoint at `ts` the welcome announced into `incoming-checkpoint/`, and
/// checks it whole before anything of this node's is moved aside for it: each file comes
/// in order from offset 0 and ends with its last piece, only a MANIFEST and the parts it
/// names come, the MANIFEST decodes and is at `ts`, and each part has the length and
/// checksum the MANIFEST gives (checked as the bytes arrive). A copy that fails any of
/// these is refused, and the node keeps what it had (before, a part damaged on the
/// primary's disk was found only by the open, after this node's own data had gone).
fn receive_checkpoint(
    r: &mut BufReader<TcpStream>,
    dir: &Path,
    ts: Ts,
    tables: &[(u32, String)],
    progress: Option<u64>,
) -> Result<PathBuf, BackupError> {
    let bad = |what: String| BackupError::Protocol(format!("the checkpoint copy: {what}"));
    let incoming = dir.join("incoming-checkpoint");
    let _ = std::fs::remove_dir_all(&incoming);
    std::fs::create_dir_all(&incoming).map_err(io("creating incoming-checkpoint"))?;
    // The file being received: its name, its file, its bytes so far and their checksum.
    let mut open: Option<(String, std::fs::File, u64, u32)> = None;
    // The files received whole: their lengths and checksums.
    let mut done: std::collections::BTreeMap<String, (u64, u32)> = Default::default();
    let mut bytes = 0u64;
    let mut last_print = Instant::now();
    loop {
        match read_frame(r).map_err(io("receiving the checkpoint"))? {
            Some(Frame::File { name, offset, data, last }) => {
                let part = name.strip_prefix("part-").and_then(|n| n.strip_suffix(".dat"));
                if name != "MANIFEST" && !part.is_some_and(|n| n.len() >= 4 && n.bytes().all(|b| b.is_ascii_digit())) {
                    return Err(bad(format!("a file named '{name}' (a MANIFEST and part-NNNN.dat only)")));
                }
                match &open {
                    Some((n, _, at, _)) if *n == name && offset != *at => {
                        return Err(bad(format!("a piece of {name} at offset {offset}, where {at} was due")))
                    }
                    Some((n, ..)) if *n != name => return Err(bad(format!("{name} began before {n} ended"))),
                    Some(_) => {}
                    None if done.contains_key(&name) => return Err(bad(format!("{name} came twice"))),
                    None if offset != 0 => return Err(bad(format!("{name} does not start at offset 0"))),
                    None => {
                        let f = std::fs::File::create(incoming.join(&name)).map_err(io(format!("creating {name}")))?;
                        open = Some((name.clone(), f, 0, 0));
                    }
                }
                let (_, f, at, crc) = open.as_mut().expect("opened above");
                f.write_all(&data).map_err(io(format!("writing {name}")))?;
                *at += data.len() as u64;
                *crc = crc32c::crc32c_append(*crc, &data);
                bytes += data.len() as u64;
                if last {
                    f.sync_all().map_err(io(format!("syncing {name}")))?;
                    let (name, _, at, crc) = open.take().expect("opened above");
                    done.insert(name, (at, crc));
                }
                if let (Some(total), true) = (progress, last_print.elapsed() > Duration::from_millis(500)) {
                    eprintln!(
                        "backup: received {:.1} of {:.1} MB of checkpoint ({:.0}%)",
                        bytes as f64 / 1e6,
                        total as f64 / 1e6,
                        100.0 * bytes as f64 / total.max(1) as f64
                    );
                    last_print = Instant::now();
                }
            }
            Some(Frame::CheckpointDone { ts: at }) => {
                if let Some((n, ..)) = &open {
                    return Err(bad(format!("{n} was cut short (the copy ended before its last piece)")));
                }
                if at != ts {
                    return Err(bad(format!("it ended at ts {}, the welcome announced ts {}", at.0, ts.0)));
                }
                break;
            }
            Some(Frame::Refuse { reason }) => return Err(refused(reason)),
            other => return Err(BackupError::Protocol(format!("expected checkpoint files, got {other:?}"))),
        }
    }
    let mpath = incoming.join("MANIFEST");
    if !done.contains_key("MANIFEST") {
        return Err(bad("no MANIFEST came".into()));
    }
    // (Refused if it is longer than any manifest can be, before it is read.)
    let m = ditto_log::checkpoint::read_manifest(&mpath)?.ok_or_else(|| bad("the received MANIFEST is gone".into()))?;
    let m = ditto_log::checkpoint::Manifest::decode(&m, &mpath)?;
    if m.ts != ts {
        return Err(bad(format!("its MANIFEST is at ts {}, the welcome announced ts {}", m.ts.0, ts.0)));
    }
    for (i, p) in m.parts.iter().enumerate() {
        let name = ditto_log::checkpoint::part_name(i);
        match done.get(&name) {
            Some(&(len, crc)) if len == p.bytes && crc == p.crc => {}
            Some(&(len, _)) => {
                return Err(bad(format!(
                    "{name} is {len} bytes with another checksum than its MANIFEST gives ({} bytes): damaged",
                    p.bytes
                )))
            }
            None => return Err(bad(format!("{name}, which its MANIFEST names, did not come"))),
        }
    }
    if done.len() != m.parts.len() + 1 {
        return Err(bad(format!("{} files came for a MANIFEST of {} parts", done.len(), m.parts.len())));
    }
    // Every row checked as the load will check it, before the caller lets this backup's
    // own data go: a copy whose checksums pass but whose rows a load refuses (a primary's
    // bug) is refused here, the backup keeping what it held (before 2026-12-06 it was
    // found only at the open after the move, and the backup failed every start after).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    ditto_log::checkpoint::check(&incoming, &m, threads, |t| tables.iter().any(|(id, _)| *id == t.0))
        .map_err(|e| bad(format!("a row its load would refuse: {e}")))?;
    ditto_log::storage::sync_dir(&incoming).map_err(io("syncing incoming-checkpoint"))?;
    Ok(incoming)
}

/// One batch for a replayer.
struct Job {
    seq: u64,
    stream: usize,
    bound: Ts,
    /// Its highest timestamp, its bound's or a transaction's above it
    /// (`BatchHeader::high_ts`): what its replica log file covers.
    high: Ts,
    floor: Option<Ts>,
    /// Transactions at or below this were held before (a resume overlaps).
    skip_to: Ts,
    /// Transactions above this are not installed (a promotion's cut, `Hold`; else
    /// `Ts(u64::MAX)`).
    upto: Ts,
    /// Empty while `spilled`.
    batch: Bytes,
    /// The bytes replay's budget counts for it (`Engine::dispatch`: its length, or 0 when
    /// it was handed over spilled), given back when replay is done with it.
    charged: usize,
    /// Where the persister put it in the replica log (`None` before it did).
    at: Option<ditto_log::replica::Appended>,
    /// Held at the release above what memory holds (`Hold`): the batch is read back from
    /// `at` when released, checked against what it was.
    spilled: Option<Spilled>,
    /// Its bound lay above everything received before it (`HoldQ::hold`).
    spillable: bool,
    /// Its checksums and records were checked when it was received (`Receiver::serve_link`,
    /// before it was acknowledged): replay decodes it without checking either again
    /// (`decode_job`). A spilled batch keeps the mark, as it is read back only if it is
    /// what was received (`read_back`).
    parsed: bool,
}

impl Job {
    /// Lets go of the batch's bytes, keeping where the persister put it in the replica log,
    /// its length and its checksum, to be read back (`read_back`); false (nothing changed)
    /// for a batch not in the log, empty, spilled already, or that may lie below the read
    /// view before it is replayed (`spillable`).
    fn spill(&mut self) -> bool {
        if self.at.is_none() || !self.spillable || self.spilled.is_some() || self.batch.is_empty() {
            return false;
        }
        self.spilled = Some(Spilled { len: self.batch.len(), crc: crc32c::crc32c(&self.batch) });
        self.batch = Bytes::new();
        true
    }
}

/// A held batch's length and checksum, kept while it lies in the replica log alone.
#[derive(Clone, Copy)]
struct Spilled {
    len: usize,
    crc: u32,
}

/// Most bytes of batches held at the release kept in memory (`Hold`).
pub const HELD_IN_MEMORY_MAX: u64 = 256 << 20;

/// Most bytes of received batches held in memory for replay (queued, or being replayed)
/// before the persister waits: a backup whose replay stays behind the primary then slows
/// its receipt (and, through TCP, the primary's shipping to it) instead of growing without
/// bound. See `QueueBudget`.
pub const REPLAY_QUEUE_BYTES_MAX: u64 = 256 << 20;

/// How recent a replayer's wait for the read view lifts the bound (see `QueueBudget`).
const WAIT_LIFTS_FOR: Duration = Duration::from_millis(50);

/// The bytes of batches handed to replay and not yet done with, against a bound; no I/O.
///
/// A replayer that waits for the read view (a key's new life, crates/engine/src/replay.rs)
/// may be waiting for a batch of another stream that is still to be handed over; were the
/// bound to hold then, the batches ahead of it would never drain and the wait would never
/// end. So a wait within `WAIT_LIFTS_FOR` lifts it: such waits last until other streams
/// catch up, which is what letting batches through makes happen.
#[derive(Debug)]
struct QueueBudget {
    bytes: u64,
    max: u64,
    last_wait: Option<Instant>,
}

impl QueueBudget {
    fn new(max: u64) -> QueueBudget {
        assert!(max > 0, "a replay budget of 0 bytes would hand nothing over");
        QueueBudget { bytes: 0, max, last_wait: None }
    }

    /// Whether a batch may be handed over now (one always may when none is held).
    fn may_take(&self, now: Instant) -> bool {
        self.bytes < self.max || self.last_wait.is_some_and(|t| now.duration_since(t) < WAIT_LIFTS_FOR)
    }

    fn took(&mut self, len: u64) {
        self.bytes += len;
    }

    fn released(&mut self, len: u64) {
        debug_assert!(self.bytes >= len, "released more than was taken");
        self.bytes = self.bytes.saturating_sub(len);
    }
}

/// `QueueBudget` shared by the persister (which waits on it), the replayers and the
/// dependency mode's dispatcher (which release).
struct ReplayBudget {
    budget: Mutex<QueueBudget>,
    room: Condvar,
    /// Where the held bytes show (`replay_queued_bytes`).
    state: Arc<BackupState>,
}

impl ReplayBudget {
    fn took(&self, b: &mut QueueBudget, len: u64) {
        b.took(len);
        self.state.replay_queued_bytes.store(b.bytes, Ordering::Relaxed);
    }

    fn released(&self, len: usize) {
        let mut b = self.budget.lock();
        b.released(len as u64);
        self.state.replay_queued_bytes.store(b.bytes, Ordering::Relaxed);
        drop(b);
        self.room.notify_all();
    }

    fn note_wait(&self) {
        self.budget.lock().last_wait = Some(Instant::now());
        self.room.notify_all();
    }
}

/// Replay held at the primary's release (`BackupOptions::hold_replay_at_release`): a
/// persisted batch goes to the replayers only once the primary's released watermark
/// covers its bound, so this node's engine never holds a version the primary has not
/// released. A failover's recovery point is at or above every released commit (under
/// `majority` and `all`), so the engine then holds nothing above it, and a promotion
/// keeps it as it is: it lets through what lies up to the point, cut there
/// (`Hold::cut_at`), and drops the rest (docs/cluster.md, "In-place promotion and following").
///
/// What it costs: a batch becomes visible once its whole bound is released, not each
/// transaction as it is (the read view is the minimum of the two anyway), and replay
/// starts when the release arrives instead of overlapping with the round trip.
///
/// What it holds is what this node has persisted and the primary has not released. While
/// the release moves that is a round trip's worth; while it stalls (under `all` with a
/// backup down, say) and writes go on (under a connection's `local`), it grows for as long
/// as the stall lasts. So at most `held_in_memory_max` bytes of it stay in memory (and
/// the few batches that are never spilled, `HoldQ::hold`): a batch held above that keeps
/// only where the persister put it in the replica log, its length and its checksum
/// (`Spilled`), and is read back when released, or a cut takes it (`Hold::read_back`). Blocking the persister instead would deadlock under a `durable`
/// policy: the release may need a later batch of another stream acknowledged as durable.
struct Hold {
    q: Mutex<HoldQ>,
    cv: Condvar,
    /// The data directory, whose replica log spilled batches are read back from.
    dir: PathBuf,
    /// Where the held bytes and spilled batches show.
    state: Arc<BackupState>,
}

#[derive(Default)]
struct HoldQ {
    /// Per stream, in shipping order (a stream's batches go in its order; streams are
    /// independent, as replay treats them).
    streams: Vec<std::collections::VecDeque<Job>>,
    /// Batches with a bound at or below this go now.
    limit: Ts,
    /// The highest bound handed to replay (after a cut: at most the cut).
    handed_to: Ts,
    /// A promotion's cut: every batch goes, cut at it.
    cut: Option<Ts>,
    /// Replay stopped (failed): nothing more goes.
    stopped: bool,
    /// Batches go in the shipping order across streams, the first that may not go holding
    /// back those after it: the dependency mode's merge reads a batch's floor as vouching
    /// for every stream's transactions up to it that came *earlier in that order*, and
    /// drops what comes after at or below it as a resend's overlap. Handed over stream by
    /// stream, one stream's floors passed the other's batches still to come, and a held
    /// backup in that mode lost them without a word (found 2026-11-29:
    /// `a_held_backup_replays_every_commit_of_two_streams_in_every_mode` lacked half of one
    /// stream's keys). The other modes number the batches and put them in order themselves.
    in_order: bool,
    /// Bytes of held batches in memory, and the most there may be.
    bytes: u64,
    max: u64,
    /// Held batches that lie in the replica log alone.
    spilled: u64,
}

impl HoldQ {
    /// What may go now: in each stream's order, or, with `in_order`, in the shipping order.
    fn take_ready(&mut self) -> Vec<Job> {
        let mut out = Vec::new();
        let (cut, limit) = (self.cut, self.limit);
        // A promotion's cut: the batch goes, cut there.
        let capped = |mut j: Job| {
            if let Some(cut) = cut {
                j.upto = cut;
                j.bound = j.bound.min(cut);
                // A floor vouches for every stream up to it; capped, for as much.
                j.floor = j.floor.map(|f| f.min(cut));
            }
            j
        };
        let ready = |j: &Job| cut.is_some() || j.bound <= limit;
        // (At a cut every batch goes: in the shipping order, so that those at or below
        // its point come first, not one stream's whole backlog above it first, read back
        // from the replica log, ahead of another's below it.)
        if self.in_order || cut.is_some() {
            loop {
                let first = self.streams.iter_mut().filter(|q| !q.is_empty()).min_by_key(|q| q[0].seq);
                match first {
                    Some(q) if ready(&q[0]) => out.push(capped(q.pop_front().expect("a front"))),
                    _ => break,
                }
            }
        } else {
            for q in &mut self.streams {
                while q.front().is_some_and(ready) {
                    out.push(capped(q.pop_front().expect("a front")));
                }
            }
        }
        for j in &out {
            self.handed_to = self.handed_to.max(j.bound);
            match j.spilled {
                Some(_) => self.spilled -= 1,
                None => self.bytes -= j.batch.len() as u64,
            }
        }
        out
    }

    /// Holds `j`, in memory while there is room, else in the replica log alone; but only
    /// a batch whose bound lay above everything received before it, floors included
    /// (`Job::spillable`): the replayed prefix of the batches before it cannot pass that,
    /// so the read view stays below its bound until it is replayed, and so does its file's
    /// recorded bound (`ReplicaLog::remove_covered_by`), which no checkpoint then covers.
    /// Any other (a heartbeat kept for its floor, a batch under another stream's floor)
    /// brings no transaction the view lacks, and may lie below it: a checkpoint could
    /// delete its file before it was read back. Such a batch stays in memory.
    fn hold(&mut self, mut j: Job) {
        let len = j.batch.len() as u64;
        if self.bytes + len > self.max && j.spill() {
            self.spilled += 1;
        } else {
            self.bytes += len;
        }
        if self.streams.len() <= j.stream {
            self.streams.resize_with(j.stream + 1, Default::default);
        }
        self.streams[j.stream].push_back(j);
    }
}

impl Hold {
    /// Holds `jobs` until the release covers them; false (nothing held) once replay stopped.
    fn push(&self, jobs: Vec<Job>) -> bool {
        let mut q = self.q.lock();
        if q.stopped {
            return false;
        }
        for j in jobs {
            q.hold(j);
        }
        self.show(&q);
        self.cv.notify_all();
        true
    }

    /// `j` with its batch in memory (`read_back`).
    fn read_back(&self, j: Job) -> Result<Job, String> {
        let was = j.spilled.is_some();
        let j = read_back(&self.dir, j)?;
        if was {
            self.state.held_read_back.fetch_add(1, Ordering::Relaxed);
        }
        Ok(j)
    }

    fn show(&self, q: &HoldQ) {
        self.state.held_bytes.store(q.bytes, Ordering::Relaxed);
        self.state.held_spilled.store(q.spilled, Ordering::Relaxed);
    }

    /// The primary released everything up to `ts`.
    fn lift(&self, ts: Ts) {
        let mut q = self.q.lock();
        if ts > q.limit {
            q.limit = ts;
            self.cv.notify_all();
        }
    }

    /// The highest bound handed to replay so far.
    fn handed_to(&self) -> Ts {
        self.q.lock().handed_to
    }

    /// A promotion at `point`: everything held goes, cut there. Refused if replay was
    /// handed anything above it (a release above the point: under `local`).
    fn cut_at(&self, point: Ts) -> Result<(), String> {
        let mut q = self.q.lock();
        if q.handed_to > point {
            return Err(format!(
                "this backup replayed up to ts {}, above the point {} (the primary released it: a `local` policy)",
                q.handed_to.0, point.0
            ));
        }
        q.cut = Some(point);
        self.cv.notify_all();
        Ok(())
    }

    /// The next batches that may go (waits for them); `None` once replay stopped.
    fn next(&self) -> Option<Vec<Job>> {
        let mut q = self.q.lock();
        loop {
            if q.stopped {
                return None;
            }
            let ready = q.take_ready();
            if !ready.is_empty() {
                self.show(&q);
                return Some(ready);
            }
            self.cv.wait(&mut q);
        }
    }

    fn stop(&self) {
        self.q.lock().stopped = true;
        self.cv.notify_all();
    }
}

/// `j` with its batch in memory: read back from the replica log in `dir` if it was
/// spilled, and refused unless it is what was received (its length and checksum).
fn read_back(dir: &Path, mut j: Job) -> Result<Job, String> {
    let (Some(s), Some(at)) = (j.spilled, j.at) else { return Ok(j) };
    let what = || format!("batch {} of stream {} (bound ts {})", j.seq, j.stream, j.bound.0);
    let b = ditto_log::replica::read_appended(dir, at, s.len).map_err(|e| {
        format!("reading back spilled {} from replica log file {} at offset {}: {e}", what(), at.seq, at.offset)
    })?;
    if crc32c::crc32c(&b) != s.crc {
        return Err(format!(
            "spilled {} read back from replica log file {} at offset {} is not what was received (checksum): damage",
            what(),
            at.seq,
            at.offset
        ));
    }
    j.batch = Bytes::from(b);
    j.spilled = None;
    Ok(j)
}

/// Why a batch's replay stopped short.
#[derive(Debug)]
enum Stop {
    /// A write at this timestamp was put off while it waited for the read view (the serial
    /// replayer's `help` said so); everything of the batch below it is installed.
    PutOff(Ts),
    /// Replay failed: the backup stops, saying why.
    Failed(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::PutOff(ts) => write!(f, "put off at ts {}", ts.0),
            Stop::Failed(why) => f.write_str(why),
        }
    }
}

/// The replayers and the read view.
struct Engine {
    db: Arc<Database>,
    state: Arc<BackupState>,
    replayed: Mutex<Ordered>,
    /// Emptied when the backup ends for good (`Engine::shut_down`): the replayers, which
    /// hold the engine, then end.
    queues: Mutex<Vec<std::sync::mpsc::Sender<Job>>>,
    mode: ReplayMode,
    on_keys: Option<KeysHook>,
    /// Values at least this long are shared with their batch (`BackupOptions`); 0 set
    /// before any batch comes, as `usize::MAX` for none.
    share_from: AtomicUsize,
    /// The dependency mode's dispatcher and executors.
    graph: std::sync::OnceLock<Arc<crate::dependency::Shared>>,
    /// What replay holds in memory (see `QueueBudget`).
    budget: Arc<ReplayBudget>,
    /// Replay held at the primary's release (`Hold`), if asked.
    hold: Option<Arc<Hold>>,
    /// The data directory, whose replica log a batch handed to replay past its budget
    /// while a replayer waits for the read view lies in alone (`dispatch`), read back when
    /// its replayer reaches it; `None` (a replay-only run, nothing persisted): never so.
    spill_dir: Option<PathBuf>,
    /// Why replay failed, if it did (kept apart from `BackupState::failure`, which a stop
    /// sets first: a promotion must know whether replay reached its point).
    replay_error: Mutex<Option<String>>,
    /// Acks for replay's progress (`ReplayAcks`), sent once `start_replay_acks` has run.
    replay_acks: Arc<ReplayAcks>,
    /// Set by `shut_down`: a write waiting for the read view gives way (its wait has no
    /// limit while the view is held below it, and a run let go will see no view move
    /// again: the thread, pinned, would have held back the process's memory reclamation
    /// for good).
    halted: AtomicBool,
}

impl Engine {
    /// The engine with its replayers running.
    #[allow(clippy::too_many_arguments)]
    fn start(
        db: Arc<Database>,
        state: Arc<BackupState>,
        streams: usize,
        base: Ts,
        mode: ReplayMode,
        on_keys: Option<KeysHook>,
        // The data directory, whose replica log spilled batches are read back from (`None`
        // where nothing is persisted), and, held at the release, the most bytes held in
        // memory.
        dir: Option<PathBuf>,
        hold: Option<u64>,
    ) -> Arc<Engine> {
        let hold = hold.map(|max| (dir.clone().expect("a held replay's batches are persisted"), max));
        let threads = match mode {
            ReplayMode::Serial | ReplayMode::Dependency { .. } => 1,
            ReplayMode::Parallel => streams,
        };
        let mut queues = Vec::new();
        let mut rxs = Vec::new();
        for _ in 0..threads {
            let (tx, rx) = std::sync::mpsc::channel::<Job>();
            queues.push(tx);
            rxs.push(rx);
        }
        let budget = Arc::new(ReplayBudget {
            budget: Mutex::new(QueueBudget::new(REPLAY_QUEUE_BYTES_MAX)),
            room: Condvar::new(),
            state: Arc::clone(&state),
        });
        let e = Arc::new(Engine {
            db,
            state: Arc::clone(&state),
            replayed: Mutex::new(Ordered::new(Prefix::new(streams, base), 1)),
            halted: AtomicBool::new(false),
            queues: Mutex::new(queues),
            mode,
            on_keys,
            share_from: AtomicUsize::new(usize::MAX),
            graph: std::sync::OnceLock::new(),
            budget: Arc::clone(&budget),
            hold: hold.map(|(dir, max)| {
                let in_order = matches!(mode, ReplayMode::Dependency { .. });
                Arc::new(Hold {
                    q: Mutex::new(HoldQ { limit: base, in_order, max, ..Default::default() }),
                    cv: Condvar::new(),
                    dir,
                    state: Arc::clone(&state),
                })
            }),
            replay_error: Mutex::new(None),
            replay_acks: Arc::default(),
            spill_dir: dir,
        });
        if let Some(h) = &e.hold {
            let (e2, h2) = (Arc::clone(&e), Arc::clone(h));
            std::thread::Builder::new()
                .name("ditto-repl-hold".into())
                .spawn(move || {
                    let ran = ditto_engine::catch_panic(|| {
                        while let Some(jobs) = h2.next() {
                            for j in jobs {
                                if j.spilled.is_some() && e2.stopped() {
                                    // (Let go, or failed: what is left is not read back;
                                    // its file may be gone with the run.)
                                    return;
                                }
                                let j = match h2.read_back(j) {
                                    Ok(j) => j,
                                    Err(why) => {
                                        // As a replayer's failure: the backup stops, saying why.
                                        crate::dependency::Sink::failed(&*e2, why);
                                        return;
                                    }
                                };
                                if !e2.dispatch(j) {
                                    h2.stop();
                                    return;
                                }
                            }
                            e2.publish();
                        }
                    });
                    // (A panic stops replay as a failed read-back does.)
                    if let Err(msg) = ran {
                        crate::dependency::Sink::failed(&*e2, format!("the replay hold panicked ({msg})"));
                        h2.stop();
                    }
                })
                .expect("starting the replay hold");
        }
        match mode {
            ReplayMode::Dependency { barrier_every } => {
                let rx = rxs.pop().expect("one queue");
                let mut scratch = Vec::new();
                // The graph bounds what the dispatcher holds (`MAX_IN_FLIGHT`): a batch
                // leaves the budget once decoded into it.
                let e2 = Arc::clone(&e);
                let decode = move |job: Job| {
                    let charged = job.charged;
                    let work = e2.unspill(job).and_then(|job| decode_for_graph(&job, &mut scratch));
                    budget.released(charged);
                    work
                };
                let sink = Arc::clone(&e) as Arc<dyn crate::dependency::Sink>;
                let shared = crate::dependency::start(sink, rx, decode, streams, base, streams, barrier_every);
                let _ = e.graph.set(shared);
            }
            ReplayMode::Serial | ReplayMode::Parallel => start_replayers(&e, rxs),
        }
        e
    }

    /// Hands `job` to its replayer once the budget has room (see `QueueBudget`); false if
    /// the replayers stopped (replay failed: the backup says why).
    ///
    /// Past the budget while a replayer waits for the read view (which lifts it), a batch
    /// that lies in the replica log and above the read view until it is replayed
    /// (`Job::spillable`, as `HoldQ::hold` asks) is handed over without its bytes, read
    /// back when its replayer reaches it: a wait the primary's stalled release holds (under
    /// `all` with a backup away, others writing under `local`) would otherwise let the
    /// queues grow in memory for as long as the stall.
    fn dispatch(&self, mut job: Job) -> bool {
        let len = job.batch.len() as u64;
        {
            let mut b = self.budget.budget.lock();
            loop {
                if b.may_take(Instant::now()) {
                    // Over the bound (a wait lifts it): lying in the replica log alone if it can.
                    if b.bytes >= b.max && self.spill_dir.is_some() && job.spill() {
                        self.state.replay_spilled.fetch_add(1, Ordering::Relaxed);
                    } else {
                        job.charged = len as usize;
                        self.budget.took(&mut b, len);
                    }
                    break;
                }
                // A replay that stopped frees no room. A stop or fence of the backup
                // (`BackupState::failure`) ends a wait of the persister's (a backup not held
                // at the release, which no cut replays up to a point: its stop waits for no
                // replay), but not the hold's: a cut after the fence replays what is held up
                // to its point (before 2026-12-02 the hold stopped here too, and a promotion
                // in place with a full budget waited out its 60 s; found by a review).
                if self.stopped() || (self.hold.is_none() && self.state.failure.lock().is_some()) {
                    return false;
                }
                self.budget.room.wait_for(&mut b, Duration::from_millis(10));
            }
        }
        let i = match self.mode {
            ReplayMode::Serial | ReplayMode::Dependency { .. } => 0,
            ReplayMode::Parallel => job.stream,
        };
        // (The dependency mode keeps its own watermark, `Tracker`.)
        if !matches!(self.mode, ReplayMode::Dependency { .. }) {
            self.replayed.lock().started(job.seq, job.stream, job.floor);
        }
        self.queues.lock().get(i).is_some_and(|q| q.send(job).is_ok())
    }

    /// Ends replay for good (the backup is let go, `Backup::release`): the queues close,
    /// so the replayers (or the dependency mode's dispatcher) end, the executors and the
    /// hold stop; each held the engine, and with it the database.
    fn shut_down(&self) {
        self.halted.store(true, Ordering::Release);
        self.replay_acks.close();
        if let Some(h) = &self.hold {
            h.stop();
        }
        self.queues.lock().clear();
        if let Some(g) = self.graph.get() {
            g.stop();
        }
    }

    /// Persisted batches for replay: held until released (`Hold`), or handed over now.
    /// False if replay stopped.
    fn hand_over(&self, jobs: Vec<Job>) -> bool {
        match &self.hold {
            Some(h) => h.push(jobs),
            None => jobs.into_iter().all(|j| self.dispatch(j)),
        }
    }

    /// The primary released everything up to `ts`.
    fn note_released(&self, ts: Ts) {
        // Every frame carries the release; the hold's lock is taken only when it rose.
        let before = self.state.released.fetch_max(ts.0, Ordering::AcqRel);
        if let (Some(h), true) = (&self.hold, ts.0 > before) {
            h.lift(ts);
        }
    }

    /// Replay ended: it failed (`replay_error`), or the run was let go (`halted`). A stop or
    /// fence of the backup alone does not end it: a cut after a fence replays up to its
    /// point.
    fn stopped(&self) -> bool {
        self.halted.load(Ordering::Acquire) || self.replay_error.lock().is_some()
    }

    /// Records why replay failed (the first reason), where a stop cannot hide it.
    fn replay_failed(&self, why: &str) {
        self.replay_error.lock().get_or_insert_with(|| why.to_string());
        if let Some(h) = &self.hold {
            h.stop();
        }
    }

    /// Installs one transaction's writes; `on_wait` as for `Database::replay_install_with`.
    fn install(&self, t: &crate::dependency::Txn, on_wait: &mut dyn FnMut(Ts) -> bool) -> Result<(), String> {
        let share_from = self.share_from.load(Ordering::Relaxed);
        self.install_ahead(
            t.writes.len(),
            |i| {
                let (table, rid, _, _) = t.write(i);
                (table, rid)
            },
            |i| {
                let (table, rid, key, value) = t.write(i);
                let shared = value.filter(|v| v.len() >= share_from).map(|v| t.batch.payload.slice_ref(v));
                self.install_write(
                    WriteView { table, rid, key, value },
                    t.ts,
                    shared.as_ref(),
                    t.batch.reuse_bound,
                    on_wait,
                )
                .map_err(|e| e.to_string())
            },
        )
    }

    /// Installs writes `0..n` in order with `install(i)`, `row(j)` naming write `j`'s
    /// record: before write `i`, it prefetches the record of write `i +
    /// PREFETCH_RECORD_AHEAD`, the newest version of write `i + PREFETCH_HEAD_AHEAD` (by
    /// then in cache) and the version below it of write `i + PREFETCH_BELOW_HEAD_AHEAD`
    /// where the trim will load it, so the cache misses of several writes overlap instead of
    /// following one another (`Database::replay_prefetch`); and it pins the engine's
    /// memory once for them all (`Database::replay_pin`).
    fn install_ahead<E>(
        &self,
        n: usize,
        row: impl Fn(usize) -> (ditto_engine::TableId, ditto_engine::RecordId),
        mut install: impl FnMut(usize) -> Result<(), E>,
    ) -> Result<(), E> {
        let _pin = self.db.replay_pin();
        for i in 0..n {
            if i + PREFETCH_RECORD_AHEAD < n {
                let (table, rid) = row(i + PREFETCH_RECORD_AHEAD);
                self.db.replay_prefetch(table, rid, Prefetch::Record);
            }
            if i + PREFETCH_HEAD_AHEAD < n {
                let (table, rid) = row(i + PREFETCH_HEAD_AHEAD);
                self.db.replay_prefetch(table, rid, Prefetch::Head);
            }
            if i + PREFETCH_BELOW_HEAD_AHEAD < n {
                let (table, rid) = row(i + PREFETCH_BELOW_HEAD_AHEAD);
                self.db.replay_prefetch(table, rid, Prefetch::BelowHead);
            }
            install(i)?;
        }
        Ok(())
    }

    fn set_share_from(&self, from: Option<usize>) {
        self.share_from.store(from.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    /// Installs one write (its value shared with the batch when `shared` is that value as
    /// a slice of it) and tells the key-count hook what it did; `on_wait` as for
    /// `Database::replay_install_with`.
    fn install_write(
        &self,
        w: WriteView<'_>,
        ts: Ts,
        shared: Option<&Bytes>,
        reuse_bound: Ts,
        on_wait: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<(), Stop> {
        let WriteView { table, rid, key, value } = w;
        // A replayer waiting for the read view lifts the replay budget (`QueueBudget`).
        let mut wait = |need: Ts| {
            self.budget.note_wait();
            on_wait(need)
        };
        let d = self.db.replay_install_with(table, rid, key, ts, value, shared, reuse_bound, &mut wait).map_err(
            |e| match e {
                ditto_engine::Error::ReplayPutOff(at) => Stop::PutOff(Ts(at)),
                e => Stop::Failed(e.to_string()),
            },
        )?;
        if let Some(f) = &self.on_keys {
            self.db.with_delta_key(&d, |key| f(table, key, ts, d.delta));
        }
        Ok(())
    }

    /// Every replay thread has counted the transactions it installed (the dependency
    /// mode's threads count theirs when they go idle; the others as they complete a batch).
    fn quiet(&self) -> bool {
        self.graph.get().is_none_or(|g| g.quiet())
    }

    /// Installs one batch; returns the transactions replayed. `help(need)` runs while a
    /// write waits for the read view to reach `need` (after this batch's progress is
    /// reported): the serial replayer replays other streams' queued batches there, and
    /// puts this batch off if it returns false (`SerialQueue`).
    fn replay(&self, job: &Job, scratch: &mut Vec<u8>, help: &mut dyn FnMut(Ts) -> bool) -> Result<u64, Stop> {
        let failed = |e: ditto_log::format::FormatError| Stop::Failed(e.to_string());
        let (batch, _) = decode_job(job).map_err(failed)?;
        let payload = match job.parsed {
            true => batch.payload_in(scratch),
            false => batch.checked_payload_in(scratch).map_err(failed)?,
        };
        // A compressed batch's payload is in `scratch`, reused: its values are copied.
        let share_from = if batch.header.compressed { usize::MAX } else { self.share_from.load(Ordering::Relaxed) };
        let mut flat = payload.writes_above(job.skip_to);
        // Within a batch, transactions come in commit order: a cut takes a prefix. Into
        // this thread's vector of the last batch (`BATCH_WRITES`).
        let mut writes = recycle(BATCH_WRITES.take());
        writes.extend(flat.by_ref().take_while(|w| w.0 <= job.upto));
        let n = match job.upto {
            Ts(u64::MAX) => flat.txns,
            _ => txns_of(writes.iter().map(|w| w.0)),
        };
        // Each table's ids reserved once for the batch (`Database::replay_reserve_rids`).
        let mut limits: Vec<(ditto_engine::TableId, u64)> = Vec::new();
        for (_, w) in &writes {
            match limits.iter_mut().find(|l| l.0 == w.table) {
                Some(l) => l.1 = l.1.max(w.rid.0 + 1),
                None => limits.push((w.table, w.rid.0 + 1)),
            }
        }
        for (table, limit) in limits {
            self.db.replay_reserve_rids(table, limit);
        }
        // A record id the primary gave a new life had its old life end at or below
        // `reuse`: a transaction above it is installed only once everything at or below it
        // is, one at or below it once everything below its own timestamp is (it may give
        // an id a new life under an older bound), so no new life overtakes an old one on
        // its record (`BatchHeader::reuse_ts`; a replayer further behind than the primary's
        // checkpoint interval brought new lives first).
        let reuse = batch.header.reuse_ts;
        let mut reuse_passed = reuse == Ts::ZERO;
        let reuse_bound = engine_reuse_bound(reuse);
        // The first transaction's wait before the batch's pin (`install_ahead`): held
        // through a wait, the pin would hold the engine's reclamation back meanwhile.
        if let Some(&(ts, _)) = writes.first() {
            self.await_reuse(job, ts, reuse, &mut reuse_passed, help)?;
        }
        let installed = self.install_ahead(
            writes.len(),
            |i| (writes[i].1.table, writes[i].1.rid),
            |i| {
                let (ts, w) = writes[i];
                if i == 0 || writes[i - 1].0 != ts {
                    self.await_reuse(job, ts, reuse, &mut reuse_passed, help)?;
                }
                let shared = w.value.filter(|v| v.len() >= share_from).map(|v| payload.bytes(v));
                // Waiting for the read view mid-batch: what this batch installed so far
                // must count, or the wait is for itself (`Ordered::progress`). All of it
                // below `ts`, even where the wait needs less (a reuse bound): the serial
                // replayer puts a helped batch off only while what it reported covers the
                // waits below it (`SerialQueue::help`), and a batch put off having reported
                // less could hold a wait below it for good (found by a review).
                self.install_write(w, ts, shared.as_ref(), reuse_bound, &mut |need| {
                    self.progressed(job, Ts(ts.0 - 1));
                    help(need)
                })
            },
        );
        let out = match installed {
            Ok(()) => Ok(n),
            Err(Stop::PutOff(at)) => {
                // The transactions below it are installed, and skipped when the batch is
                // taken up again: counted now.
                let done = txns_of(writes.iter().map(|w| w.0).take_while(|&ts| ts < at));
                self.state.txns_replayed.fetch_add(done, Ordering::Relaxed);
                Err(Stop::PutOff(at))
            }
            Err(e) => Err(e),
        };
        BATCH_WRITES.set(recycle(writes));
        out
    }

    /// Before the transaction at `ts` of a batch with reuse bound `reuse`: waits, unless
    /// `passed` (the bound was reached already) and `ts` lies above it, for everything up to
    /// the bound, or, at or below it, for everything below `ts` (`replay`).
    fn await_reuse(
        &self,
        job: &Job,
        ts: Ts,
        reuse: Ts,
        passed: &mut bool,
        help: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<(), Stop> {
        if *passed && ts > reuse {
            return Ok(());
        }
        let need = if ts > reuse { reuse } else { Ts(ts.0 - 1) };
        self.await_replayed(job, ts, need, help)?;
        *passed |= ts > reuse;
        Ok(())
    }

    /// Waits until every transaction at or below `need` is installed, before the
    /// transaction at `at` of `job` is (`replay`'s wait for a reused id's old life). What
    /// this batch installed below `at` counts first, or the wait could be for itself;
    /// `help` as for `replay` (false: the batch is put off at `at`).
    ///
    /// No deadlock: `need` is below `at`, so the smallest transaction not yet installed
    /// anywhere waits for nothing that is not installed already, once every stream's
    /// progress is counted (a stream's replayer blocked on `need` reports its own first,
    /// and the receiver goes on: the wait lifts the replay budget).
    fn await_replayed(&self, job: &Job, at: Ts, need: Ts, help: &mut dyn FnMut(Ts) -> bool) -> Result<(), Stop> {
        let replayed = || Ts(self.state.replayed.load(Ordering::Acquire));
        if replayed() >= need {
            return Ok(());
        }
        self.state.reuse_waits.fetch_add(1, Ordering::Relaxed);
        loop {
            // Each time: a floor that counts only while a replayer waits may have come
            // (`Ordered::progress`).
            self.progressed(job, Ts(at.0 - 1));
            if replayed() >= need {
                break;
            }
            self.budget.note_wait();
            if !help(need) {
                return Err(Stop::PutOff(at));
            }
            if replayed() >= need {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// `job` is in progress with everything of it at or below `upto` installed.
    fn progressed(&self, job: &Job, upto: Ts) {
        let w = self.replayed.lock().progress(job.seq, job.stream, upto, job.floor);
        self.raise_replayed(w);
        self.publish();
    }

    fn completed(&self, job: &Job) {
        let w = self.replayed.lock().complete(job.seq, job.stream, job.bound, job.floor);
        self.raise_replayed(w);
        self.publish();
    }

    /// The replayed watermark is at least `w` now; whether it rose. The one place it is
    /// raised during a run, so that the acker hears of every rise (`ReplayAcks`).
    fn raise_replayed(&self, w: Ts) -> bool {
        let rose = self.state.replayed.fetch_max(w.0, Ordering::AcqRel) < w.0;
        if rose {
            self.replay_acks.moved(&self.state, w.0);
        }
        rose
    }

    /// Replay's progress is acked on `link` from now on when no other ack carries it
    /// (`ReplayAcks`), on a thread of its own, which `shut_down` ends.
    fn start_replay_acks(&self, link: &AckLink) -> std::io::Result<()> {
        let (acks, link, state) = (Arc::clone(&self.replay_acks), Arc::downgrade(link), Arc::clone(&self.state));
        std::thread::Builder::new().name("ditto-repl-acks".into()).spawn(move || {
            ditto_log::sched::commit_thread();
            acks.run(&link, &state)
        })?;
        Ok(())
    }

    fn publish(&self) {
        let view = self.state.replayed.load(Ordering::Acquire).min(self.state.released.load(Ordering::Acquire));
        let prev = self.state.visible.load(Ordering::Acquire);
        if view > prev {
            // The engine's view first (it only moves forward): `visible` never claims more.
            match self.db.publish_read_view(Ts(view)) {
                Ok(()) => {
                    self.state.visible.fetch_max(view, Ordering::AcqRel);
                }
                Err(e) => {
                    self.replay_failed(&format!("the read view stays at ts {prev}: {e}"));
                    // Said once: later publications fail the same way.
                    let mut failure = self.state.failure.lock();
                    if failure.is_none() {
                        let msg = format!("the read view stays at ts {prev}: {e}");
                        tracing::error!("{msg}");
                        *failure = Some(msg);
                    }
                }
            }
        }
    }
}

thread_local! {
    /// A replay thread's vector of a batch's writes, kept empty from one batch to the next
    /// (`Engine::replay`). Collected afresh for each batch, it grew by doubling, about a
    /// thousand writes of a TPC-C batch copied twice over: collecting them took 9.0% of a
    /// loaded backup's replay thread, 5.0% kept (`perf record --call-graph dwarf`,
    /// docs/results.md, 2026-12-05, morning).
    static BATCH_WRITES: std::cell::Cell<Vec<(Ts, WriteView<'static>)>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `v` emptied, its allocation kept, for writes borrowed from another batch (an in-place
/// collect of an empty iterator: the element types differ only in their lifetime).
fn recycle<'b>(mut v: Vec<(Ts, WriteView<'_>)>) -> Vec<(Ts, WriteView<'b>)> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied")).collect()
}

/// How many transactions the writes of these timestamps (in commit order, a batch's) are.
fn txns_of(ts: impl Iterator<Item = Ts>) -> u64 {
    let mut last = None;
    ts.filter(|&t| last.replace(t) != Some(t)).count() as u64
}

/// How many writes ahead of the one it installs a replayer prefetches a record, its
/// newest version (which needs the record in cache to find), and the version below that
/// which the install's trim will load (which needs the newest in cache; under a snapshot
/// held below the view, as the backup's own checkpoint holds one, it took TPC-C replay's
/// cost from 0.284-0.292 to 0.262-0.275 of the primary's in four alternated cluster runs,
/// docs/results.md, 2026-12-05). On TPC-C replay (2-core VM),
/// distances from 4/2 to 32/16 measured within the noise of each other and all well
/// ahead of none (docs/replication.md); 8/4 reaches across most of a transaction's writes
/// in the dependency mode, which prefetches within a transaction.
const PREFETCH_RECORD_AHEAD: usize = 8;
const PREFETCH_HEAD_AHEAD: usize = 4;
const PREFETCH_BELOW_HEAD_AHEAD: usize = 2;

/// A batch's reuse bound (`BatchHeader::reuse_ts`) as the engine's wait for a reused id's
/// old life takes it (`Database::replay_install_with`): 0, a batch that reuses no id or of
/// a format before the bound, says nothing (`Ts::MAX`).
fn engine_reuse_bound(reuse_ts: Ts) -> Ts {
    if reuse_ts == Ts::ZERO {
        Ts::MAX
    } else {
        reuse_ts
    }
}

/// `job`'s batch decoded: its checksums verified, unless the receiver verified them and
/// its records on these same bytes (`Job::parsed`), which replay then does not do again.
fn decode_job(job: &Job) -> Result<(ditto_log::format::Batch, usize), FormatError> {
    match job.parsed {
        true => ditto_log::format::decode_batch_verified_before(&job.batch),
        false => decode_batch_checksums(&job.batch),
    }
}

/// A batch for the dependency mode: every write located in one shared payload (the
/// stored bytes themselves when the batch is not compressed).
fn decode_for_graph(job: &Job, scratch: &mut Vec<u8>) -> Result<crate::dependency::Work, String> {
    use crate::dependency::{Decoded, Txn, WriteAt};
    let (batch, _) = decode_job(job).map_err(|e| e.to_string())?;
    let mut writes = Vec::new();
    let mut spans = Vec::new();
    {
        let p = match job.parsed {
            true => batch.payload_in(scratch),
            false => batch.checked_payload_in(scratch).map_err(|e| e.to_string())?,
        };
        let base = p.as_slice().as_ptr() as usize;
        let at = |part: &[u8]| ((part.as_ptr() as usize - base) as u32, part.len() as u32);
        for t in p.txns() {
            if t.ts <= job.skip_to {
                continue;
            }
            if t.ts > job.upto {
                break; // a promotion's cut (`Hold`): commit order within the batch
            }
            let start = writes.len();
            writes.extend(t.writes().map(|w| WriteAt {
                table: w.table,
                rid: w.rid,
                key: w.key.map(at),
                value: w.value.map(at),
            }));
            spans.push((t.ts, start..writes.len()));
        }
    }
    let payload = if batch.header.compressed { Bytes::from(std::mem::take(scratch)) } else { batch.stored().clone() };
    let d = Arc::new(Decoded { payload, writes, reuse_bound: engine_reuse_bound(batch.header.reuse_ts) });
    let txns = spans.into_iter().map(|(ts, writes)| Txn { ts, batch: Arc::clone(&d), writes }).collect();
    Ok(crate::dependency::Work { stream: job.stream, bound: job.bound, floor: job.floor, txns })
}

impl crate::dependency::Sink for Engine {
    fn install(&self, txn: &crate::dependency::Txn, on_wait: &mut dyn FnMut(Ts) -> bool) -> Result<(), String> {
        Engine::install(self, txn, on_wait)
    }

    fn replayed(&self, ts: Ts) {
        if self.raise_replayed(ts) {
            self.publish();
        }
    }

    fn failed(&self, why: String) {
        self.replay_failed(&why);
        let mut failure = self.state.failure.lock();
        if failure.is_none() {
            let msg = format!("replay failed: {why}");
            tracing::error!("{msg}");
            *failure = Some(msg);
        }
    }

    fn add_done(&self, txns: u64) {
        self.state.txns_replayed.fetch_add(txns, Ordering::Relaxed);
    }

    fn count_cpu(&self) -> Option<crate::cpu::Counted> {
        Some(self.state.replay_cpu.count_this_thread())
    }
}

struct Receiver {
    opts: BackupOptions,
    storage: Arc<dyn Storage>,
    epoch: Epoch,
    streams: u32,
    received: Prefix,
    engine: Arc<Engine>,
    state: Arc<BackupState>,
    seq: u64,
    persist: Arc<ToPersist>,
    link: AckLink,
    /// The link now was opened with a `Hello` that said learner (`BackupState::learner`
    /// may have turned false since: that link is then dropped and opened again).
    link_learner: bool,
    /// What this run held when it resumed from its own directory (`Ts::ZERO` after a
    /// copy): the primary may have released it on the acknowledgement of this backup's
    /// last process, which this one was never told. A primary that restarts below it is
    /// answered as at the join (`BackupError::HoldsWhatThePrimaryLost`): kept, not cut.
    held_at_start: Ts,
    /// For a compressed batch's payload, checked before it is acknowledged.
    scratch: Vec<u8>,
    /// The batch this backup last refused for records that do not parse, until a batch of
    /// its stream reaching as far is taken: the links it ends are tried again further and
    /// further apart (`refusal_backoff`), the primary sending it again each time.
    refusal: Option<Refusal>,
    /// The link last ended on such a refusal (only then is the next link put off longer).
    ended_on_refusal: bool,
    /// The run of the primary it follows (`Primary::run`; 0: not said): on a reconnect, a
    /// primary of the same epoch in another run is another history of that number.
    run: u64,
}

/// A batch refused as malformed (its stream and first timestamp), and how many links in
/// a row ended on it.
#[derive(Clone, Copy, Debug)]
struct Refusal {
    stream: usize,
    first_ts: Ts,
    times: u32,
}

/// How long the receiver waits before it links again after an interruption: 100 ms, or,
/// where the same malformed batch was refused `times` times in a row, twice as long each
/// time up to 5 s (a primary that frames it wrong sends it again at every link: ten links
/// a second and a warning on each node for each, before).
fn refusal_backoff(refusal: Option<Refusal>) -> Duration {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);
    match refusal {
        None => FIRST,
        Some(r) => FIRST.saturating_mul(1 << r.times.saturating_sub(1).min(16)).min(MAX),
    }
}

/// The most room the receiver keeps for decompressing a batch to check it.
const SCRATCH_KEPT_MAX: usize = 4 << 20;

/// Whether `batch`'s records parse (decompressed into `scratch` if compressed). A large
/// compressed batch's room is not kept for the link's life: `scratch` is let go past
/// `SCRATCH_KEPT_MAX`.
fn records_parse(batch: &ditto_log::format::Batch, scratch: &mut Vec<u8>) -> Result<(), FormatError> {
    let parsed = batch.checked_payload_in(scratch).map(drop);
    if scratch.capacity() > SCRATCH_KEPT_MAX {
        *scratch = Vec::new();
    }
    parsed
}

/// Why a learner's link is dropped when it is promoted (`Backup::count_in_quorum`): it is
/// opened again at once.
const COUNTED_NOW: &str = "counted in the quorum from now on: connecting again";

/// The link to the primary as both threads that acknowledge write to it (the receiver
/// and the persister; one frame at a time, under the lock). The receiver swaps in each
/// new connection.
type AckLink = Arc<Mutex<TcpStream>>;

/// Under a steady stream (a burst that never ends), receipt is acknowledged at least this
/// often: a commit under a `received` policy waits for it.
const ACK_EVERY: Duration = Duration::from_millis(1);

/// At most this many bytes of received batches wait to be persisted (see the module notes).
const PERSIST_BYTES_MAX: usize = 64 << 20;

/// Received bursts for the persister thread, in order.
#[derive(Default)]
struct ToPersist {
    q: Mutex<PersistQueue>,
    cv: Condvar,
    /// Wakes a persister waiting out its interval (`Persister::interval`): a stop, or a
    /// queue grown full. (Not `cv`, which every burst notifies.)
    pace: Condvar,
    /// How many pushes the persister has made durable (`PersistQueue::pushed` when it took
    /// them): a stop waits for this, not for replay.
    synced: AtomicU64,
}

#[derive(Default)]
struct PersistQueue {
    /// The batches to persist and then replay, in arrival order.
    jobs: Vec<Job>,
    bytes: usize,
    /// What the receiver held once the last of `jobs` had arrived: durable once they are.
    received: Option<Prefix>,
    failed: bool,
    /// The receiver stopped for good (the backup failed), or the backup is stopped
    /// (`Backup::stop`): nothing more is queued, and the persister ends once it has made
    /// what is queued durable.
    stop: bool,
    /// Pushes so far.
    pushed: u64,
}

impl ToPersist {
    /// Nothing more is queued (`Queue::stop`): a push is refused, and the persister ends
    /// once what is queued is durable, without waiting out its pace.
    fn close(&self) {
        self.q.lock().stop = true;
        self.pace.notify_all();
        self.cv.notify_all();
    }

    /// Queues a burst; waits while too much is queued. False if the persister failed.
    fn push(&self, jobs: &mut Vec<Job>, received: &Prefix) -> bool {
        let mut q = self.q.lock();
        while q.bytes >= PERSIST_BYTES_MAX && !q.failed && !q.stop {
            self.cv.wait_for(&mut q, Duration::from_millis(10));
        }
        if q.failed || q.stop {
            return false;
        }
        q.bytes += jobs.iter().map(|j| j.batch.len()).sum::<usize>();
        q.jobs.append(jobs);
        q.pushed += 1;
        q.received = Some(received.clone());
        self.cv.notify_all();
        if q.bytes >= PERSIST_BYTES_MAX {
            self.pace.notify_all();
        }
        true
    }
}

/// Writes and fsyncs what the receiver queued, acknowledges it as durable, hands it to
/// the replayers, and deletes the replica log files this node's checkpoints cover.
struct Persister {
    rlog: ReplicaLog,
    engine: Arc<Engine>,
    state: Arc<BackupState>,
    link: AckLink,
    /// Replica log files covered up to here are deleted.
    removed_to: Ts,
    /// At most one fsync per this (`BackupOptions::persist_interval`).
    interval: Option<Duration>,
}

impl Persister {
    fn run(mut self, persist: &ToPersist) {
        let mut replaying = true;
        // When the last write and fsync began.
        let mut last: Option<Instant> = None;
        loop {
            let (jobs, received, taken) = {
                let mut q = persist.q.lock();
                while q.received.is_none() && !q.stop {
                    persist.cv.wait(&mut q);
                }
                if q.received.is_none() {
                    return;
                }
                // (An interval past what an `Instant` holds waits a day at a time.)
                let until = |(d, t): (Duration, Instant)| t.checked_add(d).unwrap_or(t + Duration::from_secs(86_400));
                if let Some(until) = self.interval.zip(last).map(until) {
                    while !q.stop && !q.failed && q.bytes < PERSIST_BYTES_MAX && Instant::now() < until {
                        persist.pace.wait_until(&mut q, until);
                    }
                }
                last = Some(Instant::now());
                q.bytes = 0;
                persist.cv.notify_all();
                (std::mem::take(&mut q.jobs), q.received.take().expect("checked"), q.pushed)
            };
            let mut jobs = jobs;
            for j in &mut jobs {
                j.at = Some(self.rlog.append(&j.batch, j.floor.is_some(), j.high));
            }
            if let Err(e) = self.rlog.sync() {
                let why = format!("persisting received batches failed ({e}); this backup stops acknowledging");
                tracing::error!("backup stopped: {why}");
                *self.state.failure.lock() = Some(why);
                persist.q.lock().failed = true;
                persist.cv.notify_all();
                // The receiver stops at once: its link goes down.
                let _ = self.link.lock().shutdown(std::net::Shutdown::Both);
                return;
            }
            self.state.durable.fetch_max(received.watermark().0, Ordering::AcqRel);
            persist.synced.store(taken, Ordering::Release);
            // This node's own checkpoint covers replica log files: they can go.
            let ckpt = Ts(self.state.checkpoint_ts.load(Ordering::Acquire));
            if ckpt > self.removed_to {
                self.rlog.remove_covered_by(ckpt);
                self.removed_to = ckpt;
            }
            // Durable now, whatever replay does: said first (a link that is down takes the
            // ack with it; the next link's first ack says it).
            let _ = send_ack(&self.link, &self.state);
            // Once replay has stopped (a replayer failed, or the backup is stopping), what
            // is still queued is made durable all the same: it may have been acknowledged
            // as received.
            if replaying {
                replaying = self.engine.hand_over(jobs);
                if replaying {
                    self.engine.publish();
                }
            }
        }
    }
}

/// Tells the primary what this node holds.
fn send_ack(link: &AckLink, state: &BackupState) -> Result<(), String> {
    let replayed = state.replayed.load(Ordering::Acquire);
    let f = Frame::Ack {
        received: Ts(state.received.load(Ordering::Acquire)),
        durable: Ts(state.durable.load(Ordering::Acquire)),
        replayed: Ts(replayed),
        echo_us: state.echo_us.load(Ordering::Acquire),
    };
    // (Before the write: an ack cut short may still reach the primary.)
    *state.last_ack.lock() = Some(Instant::now());
    {
        let s = link.lock();
        if let Err(e) = (&*s).write_all(&f.encode()) {
            // Shut down under the lock: the writers queued behind this one (the receiver,
            // the persister, the replay acker) fail at once rather than each wait out the
            // write timeout, and nothing follows a frame cut short.
            let _ = s.shutdown(std::net::Shutdown::Both);
            return Err(format!("sending an ack: {e}"));
        }
    }
    state.acked_replayed.fetch_max(replayed, Ordering::AcqRel);
    state.acks_sent.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// How long replay's progress waits for an ack of the receiver or the persister to carry
/// it before `ReplayAcks` sends one of its own.
const REPLAY_ACK_DELAY: Duration = Duration::from_millis(1);

/// Acks for replay's progress alone. The receiver acks what it received and the persister
/// what it made durable, each ack saying how far replay is; replay that finishes after the
/// last of those went unreported until the next frame came, which an idle primary sends
/// every `primary::IDLE_HEARTBEAT` (200 ms): the primary's replay lag (`INFO`, `ditto
/// status`, the benchmarks' `backup_lag_ms`) and freshness read up to 200 ms stale, and
/// its lag samples were let go that much later. (Found 2026-12-04: the cluster runs' "200 ms
/// replay stall" was this, at the run's end.) Now a replayer that moves the watermark past
/// what the last ack said arms this acker, which waits `REPLAY_ACK_DELAY` and sends an ack
/// if none went out meanwhile and replay is still unreported; if one did, it waits again.
/// Where the other acks come at least once a `REPLAY_ACK_DELAY` (a busy link) they carry
/// replay's progress and this one sends none; with batches further apart it sends about
/// one ack per batch more, at most one per `REPLAY_ACK_DELAY`.
///
/// A replayer pays a fence and a load while the acker is armed (every step under load),
/// and a lock and a wake-up only to arm it: `due` is set (and the waiting acker woken
/// under the lock, so that a wake between its look and its wait is not lost) only by the
/// step that finds it clear, and the acker clears it before it reads the watermark (the
/// two fences order each side's store before its load, so a step that saw it still set
/// has its watermark read by the acker).
#[derive(Default)]
struct ReplayAcks {
    /// Replay moved past the last ack, and the acker has not looked since.
    due: AtomicBool,
    /// The acker is to end: the backup stopped for good, or its replayers were let go.
    closed: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl ReplayAcks {
    /// Replay's watermark rose to `w` (stored before this is called).
    fn moved(&self, state: &BackupState, w: u64) {
        if w <= state.acked_replayed.load(Ordering::Acquire) {
            return;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.due.load(Ordering::Relaxed) || self.due.swap(true, Ordering::AcqRel) {
            return;
        }
        let _g = self.lock.lock();
        self.cv.notify_one();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _g = self.lock.lock();
        self.cv.notify_one();
    }

    /// Until closed. `link` is held weakly: the receiver and the persister hold it, and
    /// once both have ended this holds no socket open.
    fn run(&self, link: &std::sync::Weak<Mutex<TcpStream>>, state: &BackupState) {
        loop {
            {
                let mut g = self.lock.lock();
                while !self.due.load(Ordering::Acquire) && !self.closed.load(Ordering::Acquire) {
                    self.cv.wait(&mut g);
                }
            }
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            self.due.store(false, Ordering::SeqCst);
            let sent = state.acks_sent.load(Ordering::Acquire);
            std::thread::sleep(REPLAY_ACK_DELAY);
            std::sync::atomic::fence(Ordering::SeqCst);
            if state.replayed.load(Ordering::Acquire) <= state.acked_replayed.load(Ordering::Acquire)
                || state.failure.lock().is_some()
            {
                continue;
            }
            if state.acks_sent.load(Ordering::Acquire) == sent {
                let Some(link) = link.upgrade() else { return };
                // (A link that is down takes it with it; the next link's first ack says it.)
                let _ = send_ack(&link, state);
            } else {
                // Others are acking: one more wait, which their acks likely make needless.
                self.due.store(true, Ordering::Release);
            }
        }
    }
}

impl Receiver {
    /// Follows the primary, resuming after each interruption, until the backup fails.
    fn follow(&mut self, stream: TcpStream, reader: BufReader<TcpStream>) {
        let (mut stream, mut reader) = (stream, reader);
        loop {
            let why = match self.serve(&stream, &mut reader) {
                Ok(()) => "the primary closed the connection".to_string(),
                Err(e) => e,
            };
            self.state.connected.store(false, Ordering::Release);
            let _ = stream.shutdown(std::net::Shutdown::Both);
            if let Some(fatal) = self.state.failure.lock().clone() {
                tracing::error!("backup stopped: {fatal}");
                return;
            }
            // (A promotion drops a learner's link on purpose: opened again at once.)
            let promoted = self.link_learner && !self.state.learner.load(Ordering::Acquire);
            let mut wait = !promoted;
            // Longer only after a link that ended on a refused batch; tries that fail to
            // connect, and any other interruption, wait 100 ms as before.
            let refused = std::mem::take(&mut self.ended_on_refusal).then_some(self.refusal).flatten();
            let mut backoff = refusal_backoff(refused);
            if wait {
                match refused {
                    Some(r) => tracing::warn!(
                        "replication from {} interrupted: {why}; refused {} time(s) in a row, resuming in {} ms",
                        self.opts.primary,
                        r.times,
                        backoff.as_millis()
                    ),
                    None => tracing::warn!("replication from {} interrupted: {why}; resuming", self.opts.primary),
                }
            } else {
                tracing::info!("replication from {}: {COUNTED_NOW}", self.opts.primary);
            }
            // Resume above what every stream holds (each stream's surplus is skipped).
            let mut refused_said = None;
            let mut tls_said = None;
            loop {
                // 100 ms between tries (more after refused batches, `refusal_backoff`), in
                // steps, so that a stop (`Backup::stop`) is seen soon.
                let steps = (backoff.as_millis() / 5).max(1);
                for _ in 0..if wait { steps } else { 1 } {
                    if self.state.failure.lock().is_some() {
                        return; // stopped meanwhile
                    }
                    // A learner promoted meanwhile connects at once (`count_in_quorum`).
                    if self.link_learner && !self.state.learner.load(Ordering::Acquire) {
                        break;
                    }
                    if wait {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                wait = true;
                backoff = refusal_backoff(None);
                let have = self.received.watermark();
                let learner = self.state.learner.load(Ordering::Acquire);
                self.link_learner = learner;
                let hello = Frame::Hello {
                    version: PROTOCOL_VERSION,
                    epoch: self.epoch,
                    have_ts: have,
                    node: self.opts.node.clone(),
                    learner,
                    proves: None,
                    database: self.state.database.load(Ordering::Acquire),
                    run: self.run,
                };
                let (s, mut r, refused) = match connect(
                    &self.opts.primary,
                    self.opts.tls.as_deref(),
                    &hello,
                    self.opts.auth.as_ref(),
                    &self.opts.auth_also,
                ) {
                    Ok(c) => c,
                    // A primary down is the common case, and said once above; a handshake
                    // that failed (certificates changed on one side, a primary restarted
                    // in plaintext) is said, at most every 10 s.
                    Err(e) if crate::tls::is_handshake_failure(&e) => {
                        if tls_said.is_none_or(|t: Instant| t.elapsed() >= Duration::from_secs(10)) {
                            tracing::warn!("replication from {}: {e}; trying again", self.opts.primary);
                            tls_said = Some(Instant::now());
                        }
                        continue;
                    }
                    Err(_) => continue,
                };
                // A peer that accepts and never answers (a partition's dropped packets) must
                // not hold this thread: a stop waits for it.
                if s.set_read_timeout(Some(SILENCE_MAX)).is_err() {
                    continue;
                }
                // The primary writing the checkpoint it will send says so every second
                // (`saying_alive`): the welcome comes after, as at the start (before
                // 2026-12-02 this loop took such a heartbeat for a wrong answer, dropped the
                // connection and asked again, behind the same checkpoint).
                // A run stopped or fenced meanwhile gives the connection up at the next
                // heartbeat (this socket is not the link a stop shuts down).
                let answer = if let Some(f) = refused {
                    Ok(Some(f))
                } else {
                    loop {
                        match read_frame(&mut r) {
                            Ok(Some(Frame::Heartbeat { .. })) if self.state.failure.lock().is_none() => continue,
                            Ok(Some(Frame::Heartbeat { .. })) => {
                                let _ = s.shutdown(std::net::Shutdown::Both);
                                return;
                            }
                            other => break other,
                        }
                    }
                };
                if let Ok(Some(Frame::Welcome { database, epoch, run, .. })) = &answer {
                    // Not a primary of another database (one made anew at this address), nor
                    // of the epoch it follows in another run: nothing of it is taken, and
                    // the backup stops, keeping what it holds.
                    let mine = crate::identity::DatabaseId::from_wire(self.state.database.load(Ordering::Acquire));
                    let (dir, primary) = (&self.opts.data_dir, &self.opts.primary);
                    match crate::identity::check_welcome(
                        mine,
                        Some((self.epoch.0, self.run)),
                        epoch.0,
                        *database,
                        *run,
                        dir,
                        primary,
                    ) {
                        Ok(None) => {}
                        // (Its first primary said none: a test's stand-in.)
                        Ok(Some(id)) => match crate::identity::write(dir, id, &*self.storage) {
                            Ok(()) => self.state.database.store(id.to_wire(), Ordering::Release),
                            Err(e) => {
                                self.fatal(format!("saving the database id: {e}"));
                                return;
                            }
                        },
                        Err(reason) => {
                            refuse_and_close(&s, &reason);
                            self.fatal(reason);
                            return;
                        }
                    }
                    // Taken (whatever follows): no refusal stands.
                    *self.state.refused.lock() = None;
                }
                match answer {
                    Ok(Some(Frame::Welcome { epoch, streams, tables, start: Start::Resume, .. })) => {
                        if streams != self.streams {
                            self.must_join_again(
                                format!("the primary has {streams} streams now, {} before", self.streams),
                                JoinAgain::Copy,
                            );
                            return;
                        }
                        if epoch != self.epoch {
                            // Its new epoch begins where this backup holds every stream (the
                            // primary checked); but a stream may hold more, which the old
                            // primary lost: cut there first, whatever replay installed.
                            self.must_join_again(
                                format!(
                                    "the primary restarted into epoch {} from epoch {}, at ts {}",
                                    epoch.0, self.epoch.0, have.0
                                ),
                                JoinAgain::CutAt(have),
                            );
                            return;
                        }
                        match self.add_tables_unless_stopped(&tables) {
                            Ok(Ok(())) => {}
                            Ok(Err(_stopped)) => return,
                            Err(e) => {
                                self.fatal(e.to_string());
                                return;
                            }
                        }
                        (stream, reader) = (s, r);
                        self.state.reconnects.fetch_add(1, Ordering::Relaxed);
                        self.state.echo_us.store(0, Ordering::Release);
                        self.state.connected.store(true, Ordering::Release);
                        tracing::info!("replication resumed above ts {}", have.0);
                        break;
                    }
                    Ok(Some(Frame::Welcome { epoch, start: Start::CutAt { point }, .. })) => {
                        // Commits the old primary released (acknowledged to their clients)
                        // that this backup holds whole, above the point: a cut would
                        // destroy the last copy of acknowledged writes (a quorum of
                        // backups alone may release one, `majority` with two or more).
                        // They are kept, and the backup stays stopped, saying so. Those it
                        // was told of, and those it received `counted`: the primary may
                        // have released them on this backup's acknowledgement and died
                        // before it said so; and what it held when it resumed from its
                        // directory, which its last process may have acknowledged so
                        // (`held_at_start`). (Not a cluster's backup: a failover's point
                        // lies above every commit acknowledged, so what it received above
                        // the point was not, `counted` or not.)
                        let counted = match self.opts.keep_what_the_primary_lost {
                            true => self.state.counted.load(Ordering::Acquire).max(self.held_at_start.0),
                            false => 0,
                        };
                        let acked = Ts(self
                            .state
                            .released
                            .load(Ordering::Acquire)
                            .max(self.state.acknowledged.load(Ordering::Acquire))
                            .max(counted))
                        .min(have);
                        if acked > point {
                            self.fatal(format!(
                                "the primary restarted into epoch {} from epoch {} at ts {}, without commits up to ts {} that it may have acknowledged and this backup holds: it stays stopped, keeping them in its directory, rather than join again, which would discard them: to keep them, stop the primary and serve this backup's directory as the primary (`ditto server --promote`); to discard them, restart the backup on an empty directory (a cluster, `ditto server --node-id`, fails over to such a backup by itself)",
                                epoch.0, self.epoch.0, point.0, acked.0
                            ));
                            return;
                        }
                        self.must_join_again(
                            format!(
                                "the primary restarted into epoch {} from epoch {} at ts {}, below what this backup holds (ts {})",
                                epoch.0, self.epoch.0, point.0, have.0
                            ),
                            JoinAgain::CutAt(point),
                        );
                        return;
                    }
                    Ok(Some(Frame::Welcome { .. })) => {
                        self.must_join_again("the primary can no longer resume it from its log (it restarted into a new epoch, or its log no longer holds what this backup lacks)".into(), JoinAgain::Copy);
                        return;
                    }
                    // Said at most once a second (a refusal may last: `primary::NAME_TAKEN`).
                    // The primary serves another database (it checked this backup's id):
                    // stopped, as for the welcome's, keeping what it holds.
                    Ok(Some(Frame::Refuse { reason })) if reason.starts_with(crate::identity::OTHER_DATABASE) => {
                        self.fatal(reason);
                        return;
                    }
                    Ok(Some(Frame::Refuse { reason })) => {
                        *self.state.refused.lock() = Some(reason.clone());
                        if refused_said.is_none_or(|t: Instant| t.elapsed() >= Duration::from_secs(1)) {
                            tracing::warn!("the primary refused: {reason}");
                            refused_said = Some(Instant::now());
                        }
                    }
                    other => tracing::warn!("unexpected answer from the primary: {other:?}"),
                }
            }
        }
    }

    /// Stops the run for `why`, unless it was stopped already (a stop or fence that landed
    /// while the receiver reconnected: its reason stands, and false is returned).
    fn fatal(&self, why: String) -> bool {
        let first = {
            let mut failure = self.state.failure.lock();
            let first = failure.clone();
            if first.is_none() {
                *failure = Some(why.clone());
            }
            first
        };
        // (Said with the lock let go: a stop, the persister and the replayers take it.)
        match &first {
            Some(first) => tracing::info!("backup: {why} (after it stopped: {first})"),
            None => tracing::error!("backup stopped: {why}"),
        }
        first.is_none()
    }

    /// `add_tables` unless the backup was stopped: checked under the link's lock, which
    /// `Backup::stop` takes after setting the failure, so a fence that returned has no
    /// catalog written behind it (a receiver resuming, or reading a buffered `Table`
    /// frame, wrote it into a directory the next run was cutting or replacing).
    /// `Ok(Err(why))` if stopped.
    fn add_tables_unless_stopped(&self, tables: &[(u32, String)]) -> Result<Result<(), String>, BackupError> {
        let _link = self.link.lock();
        if let Some(why) = self.state.failure.lock().clone() {
            return Ok(Err(why));
        }
        add_tables(&self.engine.db, &self.opts.data_dir, tables, &*self.storage).map(Ok)
    }

    /// Stopped for good, but joining again as `how` says brings it back
    /// (`Backup::join_again`).
    fn must_join_again(&self, why: String, how: JoinAgain) {
        let stopped_now = self.fatal(match how {
            JoinAgain::Copy => format!("{why}: it needs a fresh copy of the primary's checkpoint"),
            JoinAgain::CutAt(p) => format!("{why}: it must be cut at ts {} and join again", p.0),
        });
        if stopped_now {
            *self.state.join_again.lock() = Some(how);
        }
    }

    fn ack(&self) -> Result<(), String> {
        send_ack(&self.link, &self.state)
    }

    /// Serves one link. Whichever way it ends, the batches it received in full are handed
    /// to the persister first: `received` (what acks say) counts only what was handed
    /// over, and a resume asks for what lies above it, so a batch held here and dropped
    /// would be skipped for good.
    fn serve(&mut self, stream: &TcpStream, reader: &mut BufReader<TcpStream>) -> Result<(), String> {
        let mut jobs: Vec<Job> = Vec::new();
        let r = self.serve_link(stream, reader, &mut jobs);
        if !jobs.is_empty() && !self.persist.push(&mut jobs, &self.received) {
            return Err("the persister stopped".into());
        }
        self.state.received.store(self.received.watermark().0, Ordering::Release);
        r
    }

    fn serve_link(
        &mut self,
        stream: &TcpStream,
        reader: &mut BufReader<TcpStream>,
        jobs: &mut Vec<Job>,
    ) -> Result<(), String> {
        let mut last_ack = Instant::now();
        // A live primary sends at least a heartbeat every `primary::IDLE_HEARTBEAT`: one
        // silent for much longer is gone or cut off (or a damaged length field has us
        // waiting for bytes that never come); drop the link and resume.
        stream.set_read_timeout(Some(SILENCE_MAX)).map_err(|e| format!("setting the link's read timeout: {e}"))?;
        // Acks (and a refusal) are written under the link's lock, which a stop or a fence
        // takes to shut the link down: a primary that reads none of them for long enough to
        // fill both sockets' buffers (tens of thousands of acks, seconds at the least)
        // would hold that write, and the stop, for as long as it kept the link open. A
        // write blocked this long fails and shuts the link down (`send_ack`), so the
        // writers queued behind it fail at once (found by a review, 2026-12-06; not made
        // in a test: the buffers take seconds of unread acks).
        stream.set_write_timeout(Some(SILENCE_MAX)).map_err(|e| format!("setting the link's write timeout: {e}"))?;
        // What the join brought (a checkpoint, or what this node held) counts at once: an
        // idle primary sends nothing more, and a commit waiting on this backup (under
        // `all`) would wait for the next write.
        {
            // Checked under the link's lock: `Backup::stop` sets the failure before it takes
            // the lock to shut the link down, so a link swapped in here is either shut down
            // by it or never served.
            let mut link = self.link.lock();
            if let Some(why) = self.state.failure.lock().clone() {
                return Err(why);
            }
            // Likewise `count_in_quorum`: it clears the flag before it takes the lock, so a
            // link opened as a learner's is dropped by it or here, never served on.
            if self.link_learner && !self.state.learner.load(Ordering::Acquire) {
                return Err(COUNTED_NOW.into());
            }
            *link = stream.try_clone().map_err(|e| format!("cloning the link: {e}"))?;
        }
        self.ack()?;
        loop {
            let frame = match read_frame(reader) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Err(format!("nothing from the primary for {} s", SILENCE_MAX.as_secs()))
                }
                Err(e) => return Err(format!("reading from the primary: {e}")),
            };
            // The backup failed elsewhere (its replay, its persister's fsync, a stop): the
            // link ends here too, and the backup with it (`follow`). Before 2026-12-06 a
            // failed replay left the receiver and the persister acknowledging for good,
            // the replica log growing with no checkpoint to trim it (found by a review).
            if let Some(why) = self.state.failure.lock().clone() {
                return Err(why);
            }
            self.state.last_frame_mono_us.store(mono_us(), Ordering::Relaxed);
            match frame {
                Frame::Batch { epoch, released, floor_trusted, counted, batch } => {
                    if epoch < self.epoch {
                        return Err(format!("refused a batch of epoch {} (following {})", epoch.0, self.epoch.0));
                    }
                    if epoch > self.epoch {
                        self.fatal(format!("the primary moved to epoch {}: restart this backup", epoch.0));
                        return Err("epoch changed".into());
                    }
                    let (b, used) = decode_batch_checksums(&batch).map_err(|e| format!("a corrupt batch: {e}"))?;
                    if used != batch.len() {
                        return Err("a batch frame with trailing bytes".into());
                    }
                    // Its records parse, or it is not acknowledged: checksums that hold
                    // over a payload that does not (a primary's bug, not damage on the
                    // way) would have been acknowledged, and a commit released on it,
                    // by a backup whose replay then failed on it. The one pass over the
                    // records: replay trusts it (`Job::parsed`; a compressed payload is
                    // decompressed here and again in replay).
                    let parsed = records_parse(&b, &mut self.scratch);
                    let (stream, first_ts) = (b.header.stream.0 as usize, b.header.first_ts);
                    if let Err(e) = parsed {
                        let why = format!(
                            "a batch of stream {} (ts {}..={}) whose checksums hold but whose records do not parse ({e}): not acknowledged",
                            b.header.stream.0, b.header.first_ts.0, b.header.last_ts.0
                        );
                        self.refusal = Some(match self.refusal {
                            Some(r) if r.stream == stream && r.first_ts == first_ts => {
                                Refusal { times: r.times.saturating_add(1), ..r }
                            }
                            _ => Refusal { stream, first_ts, times: 1 },
                        });
                        self.ended_on_refusal = true;
                        self.state.batches_refused.fetch_add(1, Ordering::Relaxed);
                        *self.state.batch_refused.lock() = Some(why.clone());
                        // The primary is told why (it logs the link's end with the reason),
                        // best effort: the link drops either way.
                        let refuse = Frame::Refuse { reason: why.clone() };
                        let _ = (&*self.link.lock()).write_all(&refuse.encode());
                        return Err(why);
                    }
                    // The primary sent its stream that far in a batch that parses.
                    if self.refusal.is_some_and(|r| r.stream == stream && b.header.last_ts >= r.first_ts) {
                        self.refusal = None;
                        *self.state.batch_refused.lock() = None;
                    }
                    let h = b.header;
                    let s = h.stream.0 as usize;
                    if s >= self.streams as usize {
                        return Err(format!("a batch of stream {s}, of {}", self.streams));
                    }
                    self.state.bytes_received.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    let held = self.received.stream_bound(s);
                    // Nothing new on its stream: skip it, unless it is a heartbeat whose
                    // floor lifts the watermark (an idle stream's bound may not move).
                    // (What was received before it, read once: the skip and the spill both ask.)
                    let before = self.received.watermark();
                    let lifts = floor_trusted && h.floor_ts > before;
                    if h.bound_ts <= held && !lifts {
                        self.state.batches_skipped.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let floor = floor_trusted.then_some(h.floor_ts);
                        // Above everything received before it (floors included), and new
                        // on its stream, it lies above the read view until it is replayed
                        // (`HoldQ::hold`). A heartbeat kept for its floor whose bound is at
                        // or below its stream's (`lifts`) is not: the batches before it on
                        // its stream take the view past its bound, and a checkpoint could
                        // delete its file before it was read back (found by a review,
                        // 2026-12-06).
                        let spillable = h.bound_ts > before && h.bound_ts > held;
                        self.received.push(s, h.bound_ts, floor);
                        if counted {
                            // Before it is acknowledged, so before it can be released.
                            self.state.counted.fetch_max(h.last_ts.0, Ordering::AcqRel);
                        }
                        self.seq += 1;
                        jobs.push(Job {
                            seq: self.seq,
                            stream: s,
                            bound: h.bound_ts,
                            high: h.high_ts(),
                            floor,
                            skip_to: held,
                            upto: Ts(u64::MAX),
                            batch,
                            at: None,
                            spilled: None,
                            spillable,
                            parsed: true,
                            charged: 0,
                        });
                        self.state.batches_received.fetch_add(1, Ordering::Relaxed);
                    }
                    self.engine.note_released(released);
                }
                Frame::Heartbeat { released, acknowledged, sent_us } => {
                    self.state.echo_us.fetch_max(sent_us, Ordering::AcqRel);
                    self.engine.note_released(released);
                    self.state.acknowledged.fetch_max(acknowledged.0, Ordering::AcqRel);
                }
                Frame::Table { id, name } => {
                    self.add_tables_unless_stopped(&[(id, name)]).map_err(|e| e.to_string())??
                }
                Frame::Refuse { reason } => return Err(format!("the primary refused: {reason}")),
                other => return Err(format!("unexpected frame {other:?}")),
            }
            // A burst is done when nothing more is buffered: hand it to the persister (which
            // makes it durable, says so, and has it replayed) and acknowledge receipt now.
            if reader.buffer().is_empty() || jobs.len() >= 1024 || last_ack.elapsed() >= ACK_EVERY {
                if !jobs.is_empty() && !self.persist.push(jobs, &self.received) {
                    return Err("the persister stopped".into());
                }
                // What acks say is received: only what was handed to the persister.
                self.state.received.store(self.received.watermark().0, Ordering::Release);
                // A heartbeat may have moved the release: the read view follows.
                self.engine.publish();
                self.ack()?;
                last_ack = Instant::now();
            }
        }
    }
}

/// Starts the replay threads of `engine` (one per queue; the serial mode's one thread
/// runs `SerialQueue`).
fn start_replayers(engine: &Arc<Engine>, rxs: Vec<std::sync::mpsc::Receiver<Job>>) {
    let serial = engine.mode == ReplayMode::Serial;
    for (i, rx) in rxs.into_iter().enumerate() {
        let e = Arc::clone(engine);
        std::thread::Builder::new()
            .name(format!("ditto-replay-{i}"))
            .spawn(move || {
                // A replayer that panics stops replay as a failed batch does, saying so
                // (before 2026-12-03 replay stopped without a word: reads on the backup
                // stayed at the view of its last batch for good, and nothing said why).
                // (As a failed batch's: `Sink::failed`, as the hold's and the dependency
                // mode's threads do.)
                if let Err(msg) = ditto_engine::catch_panic(|| replay_queue(&e, rx, serial)) {
                    crate::dependency::Sink::failed(&*e, format!("replayer {i} panicked ({msg})"));
                }
            })
            .expect("starting a replayer");
    }
}

/// One replayer's loop over its queue `rx` (`start_replayers`).
fn replay_queue(e: &Arc<Engine>, rx: std::sync::mpsc::Receiver<Job>, serial: bool) {
    let _cpu = e.state.replay_cpu.count_this_thread();
    if serial {
        let q = SerialQueue {
            rx,
            deferred: Default::default(),
            busy: Default::default(),
            waiting: Default::default(),
            scratch: Default::default(),
        };
        while let Some(job) = q.next() {
            if !q.run(e, job) {
                return;
            }
        }
        return;
    }
    let mut scratch = Vec::new();
    while let Ok(job) = rx.recv() {
        let Some(job) = e.unspilled(job) else { return };
        // (A write waiting for the read view stops waiting once replay failed elsewhere,
        // as the serial replayer's does: the view never moves again. Before, a sibling of
        // a failed replayer waited, its pin held, until the run was let go or cut.)
        let replayed = e.replay(&job, &mut scratch, &mut |_| !e.stopped());
        e.budget.released(job.charged);
        if !e.finish(&job, replayed) {
            return;
        }
    }
}

impl Engine {
    /// `job` with its batch in memory, read back from the replica log if `dispatch`
    /// spilled it; `Err` if it cannot be (gone, or not what was received).
    fn unspill(&self, job: Job) -> Result<Job, String> {
        if job.spilled.is_none() {
            return Ok(job);
        }
        let Some(dir) = self.spill_dir.as_deref() else {
            return Err("a spilled batch with no directory to read it back from".into());
        };
        let job = read_back(dir, job)?;
        self.state.replay_spilled.fetch_sub(1, Ordering::Relaxed);
        self.state.replay_read_back.fetch_add(1, Ordering::Relaxed);
        Ok(job)
    }

    /// `unspill` for a replayer: `None` once it cannot go on (replay fails, saying why,
    /// unless the run was let go or failed already: its files may be gone with it).
    fn unspilled(&self, job: Job) -> Option<Job> {
        match self.unspill(job) {
            Ok(job) => Some(job),
            Err(_) if self.stopped() => None,
            Err(why) => {
                crate::dependency::Sink::failed(self, why);
                None
            }
        }
    }

    /// Completes a replayed batch, or records why it failed (then returns false: the
    /// replayer stops).
    fn finish(&self, job: &Job, replayed: Result<u64, Stop>) -> bool {
        let replayed = match replayed {
            Ok(_) if crate::failpoint("replay-fails") => {
                Err(Stop::Failed("refused by the failpoint replay-fails (DITTO_FAILPOINTS)".into()))
            }
            r => r,
        };
        match replayed {
            Ok(n) => {
                self.state.txns_replayed.fetch_add(n, Ordering::Relaxed);
                self.completed(job);
                true
            }
            // A write that waited for the read view gave way because replay ended (the
            // backup was let go, or replay failed elsewhere and said so): no failure of
            // this batch. (Before 2026-12-04 it was reported as one: an ERROR line at
            // every release of a backup whose replayer waited, as the serial replayer's
            // `run` does not.)
            Err(Stop::PutOff(_)) if self.stopped() => false,
            Err(why) => {
                let msg = format!("replaying a batch of stream {} failed: {why}", job.stream);
                tracing::error!("{msg}");
                self.replay_failed(&msg);
                let mut failure = self.state.failure.lock();
                if failure.is_none() {
                    *failure = Some(msg);
                }
                false
            }
        }
    }
}

/// The serial mode's one replayer: batches in shipping order, one at a time, except while
/// a write waits for the read view (a key's or record id's new life, see
/// crates/engine/src/replay.rs). What it waits for may be in batches of other streams
/// shipped later, which one thread in shipping order would never reach: so while it waits
/// it replays the queued batches of every stream that has none in progress or put off,
/// in their order (`help`). Such a helped batch may wait too; if it waits for a
/// transaction that a waiting batch below it holds, it is put off (`Stop::PutOff`: what it
/// installed stays, the rest is taken up again once the batches below are done), else it
/// helps in turn. Each stream's batches still complete in its own order (`Ordered`
/// asserts it).
struct SerialQueue {
    rx: std::sync::mpsc::Receiver<Job>,
    /// Batches put off or queued behind one, in order; with the timestamp of the write a
    /// batch was put off at, if it was (`help` takes it up again only once no write
    /// waiting below holds a transaction it needs).
    deferred: std::cell::RefCell<std::collections::VecDeque<(Job, Option<Ts>)>>,
    /// Streams with a batch in progress (nested, innermost last).
    busy: std::cell::RefCell<Vec<usize>>,
    /// The timestamps of the writes waiting in those batches.
    waiting: std::cell::RefCell<Vec<Ts>>,
    scratch: std::cell::RefCell<Vec<Vec<u8>>>,
}

impl SerialQueue {
    /// The next batch: a deferred one first (in order), else the next to arrive.
    fn next(&self) -> Option<Job> {
        let deferred = self.deferred.borrow_mut().pop_front().map(|d| d.0);
        deferred.or_else(|| self.rx.recv().ok())
    }

    /// Replays `job`, and completes it or puts it off; false once replay failed (here, or
    /// in a batch it helped).
    fn run(&self, e: &Engine, job: Job) -> bool {
        // (Not on the backup's stop or fence: see `Engine::stopped`. Before 2026-12-02 the
        // serial replayer ended at a fence, and every promotion or follow in place of a
        // node replaying serially waited out its 60 s for the point; found by a review.)
        if e.stopped() {
            return false;
        }
        let Some(job) = e.unspilled(job) else { return false };
        self.busy.borrow_mut().push(job.stream);
        // One buffer per nesting level, kept (a compressed batch is decompressed into it).
        let mut scratch = self.scratch.borrow_mut().pop().unwrap_or_default();
        let replayed = e.replay(&job, &mut scratch, &mut |need| {
            // It needs every transaction up to `need`: one held by a waiting write below
            // can only come after this batch gives way.
            if self.waiting.borrow().iter().any(|&w| w <= need) {
                return false;
            }
            self.waiting.borrow_mut().push(Ts(need.0 + 1));
            self.help(e, need);
            self.waiting.borrow_mut().pop();
            // A helped batch failed, or the run was let go: stop waiting, and stop.
            !e.stopped()
        });
        self.busy.borrow_mut().pop();
        self.scratch.borrow_mut().push(scratch);
        match replayed {
            Err(Stop::PutOff(_)) if e.stopped() => false,
            Err(Stop::PutOff(at)) => {
                // Ahead of every later batch of its stream, which `help` then leaves too.
                // Still held: it stays in the budget.
                let rest = Job { skip_to: job.skip_to.max(Ts(at.0 - 1)), ..job };
                self.deferred.borrow_mut().push_front((rest, Some(at)));
                true
            }
            r => {
                e.budget.released(job.charged);
                e.finish(&job, r)
            }
        }
    }

    /// Replays what can go ahead of the batches in progress (see the type's notes).
    /// Stops once everything up to `need` is replayed: the waiting write goes on then,
    /// and the read view with it. (Before 2026-12-03 it replayed every batch it could, the
    /// rest of the other streams' queues, while the view stood at the waiting write: the
    /// hot rows' version chains grew with every helped install, which each walked them to
    /// trim, and a TPC-C replay whose primary checkpointed, reusing ids, ran 4-5x slower.)
    fn help(&self, e: &Engine, need: Ts) {
        while let Ok(job) = self.rx.try_recv() {
            self.deferred.borrow_mut().push_back((job, None));
        }
        loop {
            if Ts(e.state.replayed.load(Ordering::Acquire)) >= need {
                return;
            }
            // The first deferred batch whose stream is idle and has no earlier one
            // deferred, and, if it was put off at `at`, needs nothing a waiting write holds.
            let runnable = {
                let deferred = self.deferred.borrow();
                let (busy, waiting) = (self.busy.borrow(), self.waiting.borrow());
                (0..deferred.len()).find(|&i| {
                    let (job, put_off) = &deferred[i];
                    put_off.is_none_or(|at| waiting.iter().all(|&w| w.0 > at.0 - 1))
                        && !busy.contains(&job.stream)
                        && !deferred.iter().take(i).any(|d| d.0.stream == job.stream)
                })
            };
            let Some(i) = runnable else { return };
            let (job, _) = self.deferred.borrow_mut().remove(i).expect("an index just found");
            if !self.run(e, job) {
                return;
            }
        }
    }
}

impl BackupState {
    /// How long ago the newest frame from the primary came (`None`: none yet).
    pub fn heard_ago(&self) -> Option<Duration> {
        match self.last_frame_mono_us.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_micros(mono_us().saturating_sub(at))),
        }
    }

    /// Replay CPU (thread time) in nanoseconds so far, summed over the replay threads
    /// (`crate::cpu`).
    pub fn replay_cpu_ns(&self) -> u64 {
        self.replay_cpu.total_ns()
    }

    /// Connected to the primary and not stopped by a failure.
    pub fn link_up(&self) -> bool {
        self.connected.load(Ordering::Acquire) && self.failure.lock().is_none()
    }
}

impl Backup {
    /// How long ago this backup last sent its primary an ack (`None`: never, this run).
    /// Final once `fence` or `stop` has returned: nothing is acked after.
    pub fn last_acked(&self) -> Option<Duration> {
        self.state.last_ack.lock().map(|t| t.elapsed())
    }

    /// Whether the primary counts this backup in no quorum (a cluster's learner).
    pub fn is_learner(&self) -> bool {
        self.state.learner.load(Ordering::Acquire)
    }

    /// A learner promoted in place: it says so to its primary by connecting again (the
    /// link is dropped, and resumed at once above what it holds, as after any drop, with a
    /// `Hello` that names no learner), so that the primary counts it from then on. Its
    /// engine, directory and readers are untouched.
    pub fn count_in_quorum(&self) {
        if self.state.learner.swap(false, Ordering::AcqRel) {
            let _ = self.link.lock().shutdown(std::net::Shutdown::Both);
        }
    }

    /// Lets go of a backup that has stopped for good (after `fence`, which leaves nothing
    /// writing its directory): its replay threads end (`Engine::shut_down`) and its
    /// directory's lock goes, so that another run may take the directory; its database
    /// stays with whoever else holds it (the connections reading its last view), and is
    /// freed with them. Without it, the replayers, which hold the engine, kept the
    /// database alive for good.
    pub fn release(self) {
        self.engine.shut_down();
    }

    /// The failure that stopped this backup, if any (it then serves its last read view).
    pub fn failure(&self) -> Option<String> {
        self.state.failure.lock().clone()
    }

    /// Stopped because its primary can no longer resume it as it stands (it restarted
    /// into a new epoch, or its log no longer holds what this backup lacks): how joining
    /// again brings it back (`JoinAgain`).
    pub fn join_again(&self) -> Option<JoinAgain> {
        *self.state.join_again.lock()
    }

    /// Stops following the primary: the link goes down (nothing more is received or
    /// acknowledged), and everything received is made durable before this returns (a
    /// cluster's fence, docs/cluster.md: what the backup acknowledged, `received`
    /// included, is then on its disk for the failover's report). Reads go on at the last
    /// read view. `Err` if the persister did not finish within `timeout` or had failed.
    pub fn stop(&self, why: &str, timeout: Duration) -> Result<(), String> {
        {
            let mut f = self.state.failure.lock();
            if f.is_none() {
                *f = Some(format!("stopped: {why}"));
            }
        }
        let _ = self.link.lock().shutdown(std::net::Shutdown::Both);
        // Nothing more is queued from here (a receiver that pushes now is refused, and ends:
        // the failure above is set), so the persister ends once what is queued is durable;
        // a receiver that is connecting meanwhile (5 s a try to a primary gone silent) is
        // not waited for.
        self.persist.close();
        // Done once the persister has made every push durable (replay may still be
        // running, or waiting: it does not matter for what was acknowledged).
        let deadline = Instant::now() + timeout;
        loop {
            {
                let q = self.persist.q.lock();
                if q.failed {
                    return Err(self.failure().unwrap_or_else(|| "persisting what was received failed".into()));
                }
                if q.stop && self.persist.synced.load(Ordering::Acquire) >= q.pushed {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("what was received was not persisted within {} ms", timeout.as_millis()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Backup {
    /// A cluster's fence that keeps the server serving reads: `stop`, then waits until
    /// nothing of this backup writes its directory any more (the persister has ended; a
    /// checkpoint being written is stopped short, and what it wrote removed), so a failover
    /// may read it while reads go on.
    pub fn fence(&self, why: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let t = Instant::now();
        self.stop(why, timeout)?;
        let stopped = t.elapsed();
        self.ckpt_cancel.store(true, Ordering::Release);
        drop(self.ckpt_busy.lock());
        let left = t.elapsed();
        while !self.persister_done.load(Ordering::Acquire) {
            if Instant::now() > deadline {
                return Err(format!("the persister did not end within {} ms", timeout.as_millis()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // Where a slow fence's time went (a failover waits for it); over a second, a warning.
        let took = t.elapsed();
        if took > Duration::from_millis(20) {
            let line = format!(
                "fence: {:.1} ms (the link stopped after {:.1} ms, the checkpointer left after {:.1} ms)",
                took.as_secs_f64() * 1e3,
                stopped.as_secs_f64() * 1e3,
                left.as_secs_f64() * 1e3
            );
            match took > Duration::from_secs(1) {
                true => tracing::warn!("{line}"),
                false => tracing::info!("{line}"),
            }
        }
        Ok(())
    }

    /// Promotes this backup in place at a failover's recovery point `point`: fenced, it
    /// replays what it holds up to the point (cut there: `Hold`), and its engine, with
    /// its indexes, is the new primary's (`ditto_log::OpenOptions::recovered`, once the
    /// caller has sealed the directory: `ditto_log::sealed::seal_tail`). Returns the
    /// engine, at read view `point`, and the directory's lock. Refused, changing nothing
    /// on disk, if it does not hold every stream up to the point, if its replay is not
    /// held at the release or was handed anything above the point, or if replay failed or
    /// did not reach the point within `timeout`: the caller then recovers from the
    /// directory instead.
    ///
    /// The same for a backup that follows the next epoch's primary in place: the engine,
    /// cut at `point` and the directory sealed there, is taken by the next backup run
    /// (`BackupOptions::engine`).
    pub fn cut_at(self, point: Ts, why: &str, timeout: Duration) -> Result<(Arc<Database>, std::fs::File), String> {
        self.cut(point, false, why, timeout).map(|(db, lock, _)| (db, lock))
    }

    /// `cut_at` for a backup that follows the next primary: cut at the point, or, if it
    /// holds every stream only up to an earlier timestamp, there (the new primary sends it
    /// the rest, cut at the point: `PrimaryOptions::resume_from`). Returns the cut too.
    pub fn cut_at_most(
        self,
        point: Ts,
        why: &str,
        timeout: Duration,
    ) -> Result<(Arc<Database>, std::fs::File, Ts), String> {
        self.cut(point, true, why, timeout)
    }

    fn cut(
        self,
        point: Ts,
        at_most: bool,
        why: &str,
        timeout: Duration,
    ) -> Result<(Arc<Database>, std::fs::File, Ts), String> {
        let deadline = Instant::now() + timeout;
        // Its replay threads end however the cut ends, once it has what it needs of them
        // (they hold the engine: without it they ran on for good, a set per promotion or
        // follow in place).
        struct ShutDown(Arc<Engine>);
        impl Drop for ShutDown {
            fn drop(&mut self) {
                self.0.shut_down();
            }
        }
        let _replay_ends = ShutDown(Arc::clone(&self.engine));
        // From here on this run's connections read nothing: the view goes to the point
        // below, above what any primary has released (a later failover may set a lower
        // point), and this run will see no release again; its connections wait, and move
        // to the next role, whose run holds its reads until its primary has released the
        // point. (`note_released` below moves `released`, which the gate cannot use here.)
        self.state.reads_from.store(u64::MAX, Ordering::Release);
        self.state.gate_gen.fetch_add(1, Ordering::AcqRel);
        self.fence(why, timeout)?;
        let durable = self.state.durable.load(Ordering::Acquire);
        let point = if at_most { point.min(Ts(durable)) } else { point };
        if durable < point.0 {
            return Err(format!("this backup holds every stream only up to ts {durable}, below the point {}", point.0));
        }
        let hold = self.engine.hold.as_ref().ok_or("its replay is not held at the primary's release")?;
        hold.cut_at(point)?;
        // The engine's read view goes to the point, whatever the old primary had released:
        // a write of the tail above the old release that waits for the read view (a key's
        // new life, crates/engine/src/replay.rs) would otherwise wait for a release that
        // never comes. (Reads were held above.)
        self.engine.note_released(point);
        self.engine.publish();
        let waiting = Instant::now();
        let mut said = waiting;
        loop {
            if let Some(e) = self.engine.replay_error.lock().clone() {
                return Err(format!("replay failed: {e}"));
            }
            if self.state.replayed.load(Ordering::Acquire) >= point.0 {
                break;
            }
            // A slow cut says where replay stands, every 2 s (the log of a stall).
            if said.elapsed() >= Duration::from_secs(2) {
                said = Instant::now();
                tracing::warn!(
                    "cut at ts {}: replay at ts {} after {:.1} s (visible {}, durable {}, handed {})",
                    point.0,
                    self.state.replayed.load(Ordering::Acquire),
                    waiting.elapsed().as_secs_f64(),
                    self.state.visible.load(Ordering::Acquire),
                    self.state.durable.load(Ordering::Acquire),
                    hold.handed_to().0
                );
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "replay reached ts {} of the point {} within {} ms",
                    self.state.replayed.load(Ordering::Acquire),
                    point.0,
                    timeout.as_millis()
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // An engine already past the point (its run began from a checkpoint copy, or from
        // an earlier change in place, above it: a later failover may set a lower point)
        // holds commits above it that no cut here can take out; publishing the point would
        // not move its view back. Refused, so that the node falls back to recovering from
        // its directory (found by a review, 2026-12-03: the cut succeeded, and its seal was
        // written, before the next open refused the engine).
        let at = self.db.clock().visible_ts();
        if at > point {
            return Err(format!(
                "this backup's engine holds commits up to ts {} (where its run began), above the point {}: it cannot be cut there in place",
                at.0, point.0
            ));
        }
        self.db.publish_read_view(point).map_err(|e| e.to_string())?;
        self.state.visible.fetch_max(point.0, Ordering::AcqRel);
        Ok((self.db, self._lock, point))
    }
}

/// Microseconds on a monotonic clock since this process first asked, plus one (never 0).
fn mono_us() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// What [`replay_recorded`] did.
#[derive(Clone, Debug)]
pub struct ReplayRun {
    pub batches: u64,
    pub txns: u64,
    pub seconds: f64,
    /// The replay threads' CPU time.
    pub cpu_seconds: f64,
    /// The replayed watermark at the end (every transaction at or below it is installed).
    pub replayed: Ts,
    /// Transactions that waited for a reused record id's old life (`BackupState::reuse_waits`).
    pub reuse_waits: u64,
}

/// Replays recorded batches (each a framed batch as the primary's log wrote it, in the
/// order the primary framed them) into `db` with this module's live replay, as fast as it
/// goes: the replay-only benchmark. `db` holds the primary's tables with their ids and
/// everything at or below `base`. Returns once every batch is installed.
pub fn replay_recorded(
    db: Arc<Database>,
    streams: usize,
    base: Ts,
    mode: ReplayMode,
    share_values_from: Option<usize>,
    batches: &[Bytes],
) -> Result<ReplayRun, String> {
    let state = Arc::new(BackupState::default());
    // Snapshots may read at the replayed view; nothing waits for a primary's release.
    state.released.store(u64::MAX >> 8, Ordering::Release);
    let engine = Engine::start(db, Arc::clone(&state), streams, base, mode, None, None, None);
    engine.set_share_from(share_values_from);
    let t0 = Instant::now();
    let mut prefix = Prefix::new(streams, base);
    for (i, b) in batches.iter().enumerate() {
        let (decoded, _) = decode_batch_checksums(b).map_err(|e| format!("recorded batch {i}: {e}"))?;
        let h = decoded.header;
        let s = h.stream.0 as usize;
        if s >= streams {
            return Err(format!("recorded batch {i} is of stream {s}, of {streams}"));
        }
        prefix.push(s, h.bound_ts, Some(h.floor_ts));
        let job = Job {
            seq: i as u64 + 1,
            stream: s,
            bound: h.bound_ts,
            high: h.high_ts(),
            floor: Some(h.floor_ts),
            skip_to: base,
            upto: Ts(u64::MAX),
            batch: b.clone(),
            at: None,
            spilled: None,
            spillable: false,
            // (Checked by replay: the run counts what a backup's receiver does besides.)
            parsed: false,
            charged: 0,
        };
        if !engine.dispatch(job) {
            return Err(state.failure.lock().clone().unwrap_or_else(|| "a replayer stopped".to_string()));
        }
    }
    let last = prefix.watermark();
    // Done when the replayed prefix covers the last batch (or a replayer failed).
    loop {
        if let Some(why) = state.failure.lock().clone() {
            return Err(why);
        }
        if state.replayed.load(Ordering::Acquire) >= last.0 && engine.quiet() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let seconds = t0.elapsed().as_secs_f64();
    // (The replay threads' clocks are read now, `crate::cpu`: a batch seen complete is
    // counted.)
    Ok(ReplayRun {
        batches: batches.len() as u64,
        txns: state.txns_replayed.load(Ordering::Acquire),
        seconds,
        cpu_seconds: state.replay_cpu_ns() as f64 / 1e9,
        replayed: Ts(state.replayed.load(Ordering::Acquire)),
        reuse_waits: state.reuse_waits.load(Ordering::Acquire),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backup that has heard nothing says so (`None`: -1 in INFO), not the Unix time.
    #[test]
    fn a_backup_that_heard_nothing_says_so() {
        let state = BackupState::default();
        assert_eq!(state.heard_ago(), None);
        state.last_frame_mono_us.store(mono_us(), Ordering::Relaxed);
        assert!(state.heard_ago().is_some_and(|d| d < Duration::from_secs(5)));
    }

    #[test]
    fn a_recycled_vector_of_writes_is_empty_and_keeps_its_allocation() {
        let payload = b"key".to_vec();
        let w = WriteView {
            table: ditto_engine::TableId(0),
            rid: ditto_engine::RecordId(1),
            key: Some(&payload[..]),
            value: None,
        };
        let mut v = Vec::with_capacity(1000);
        v.extend(std::iter::repeat_n((Ts(1), w), 700));
        let (at, cap) = (v.as_ptr() as usize, v.capacity());
        let kept: Vec<(Ts, WriteView<'static>)> = recycle(v);
        drop(payload);
        assert!(kept.is_empty());
        assert_eq!((kept.as_ptr() as usize, kept.capacity()), (at, cap), "the allocation is the same");
    }

    /// One write of a test batch: (ts, record id, key, value), in table 0.
    type TestWrite<'a> = (u64, ditto_engine::RecordId, Option<&'a [u8]>, Option<&'a [u8]>);

    /// A batch of stream `stream` (epoch 1, bound `bound`) of one-write transactions.
    fn test_batch(stream: u32, bound: Ts, txns: &[TestWrite]) -> Bytes {
        test_batch_as(stream, bound, txns, false)
    }

    /// `test_batch`, LZ4-compressed if `compressed`.
    fn test_batch_as(stream: u32, bound: Ts, txns: &[TestWrite], compressed: bool) -> Bytes {
        let mut b = ditto_log::format::BatchBuilder::new();
        for &(ts, rid, key, value) in txns {
            b.push_txn(Ts(ts), [(ditto_engine::TableId(0), rid, key, value)].into_iter());
        }
        let mut out = Vec::new();
        b.finish_into(ditto_log::StreamId(stream), Epoch(1), bound, compressed, &mut out);
        Bytes::from(out)
    }

    /// A received job of `batch` (not spilled, records not checked by a receiver).
    fn test_job(seq: u64, stream: usize, bound: Ts, batch: Bytes) -> Job {
        Job {
            seq,
            stream,
            bound,
            high: bound,
            floor: None,
            skip_to: Ts::ZERO,
            upto: Ts(u64::MAX),
            batch,
            at: None,
            spilled: None,
            spillable: false,
            parsed: false,
            charged: 0,
        }
    }

    /// The receiver's check of a batch's records keeps a small compressed batch's room
    /// and lets a large one's go (`SCRATCH_KEPT_MAX`: before, a link kept the room of the
    /// largest compressed batch it ever checked for its life; found by a review).
    #[test]
    fn the_receivers_check_keeps_no_more_than_its_bound_of_room() {
        let compressed = |n: usize| {
            let value = vec![7u8; n];
            let txn = (1, ditto_engine::RecordId(0), Some(&b"k"[..]), Some(&value[..]));
            let (batch, _) = decode_batch_checksums(&test_batch_as(0, Ts(1), &[txn], true)).unwrap();
            assert!(batch.header.compressed && batch.header.raw_len as usize > n);
            batch
        };
        let mut scratch = Vec::new();
        records_parse(&compressed(64 << 10), &mut scratch).unwrap();
        let kept = scratch.capacity();
        assert!(kept >= 64 << 10, "{kept}");
        records_parse(&compressed(SCRATCH_KEPT_MAX + (1 << 20)), &mut scratch).unwrap();
        assert_eq!(scratch.capacity(), 0, "a large batch's room is let go");
        records_parse(&compressed(64 << 10), &mut scratch).unwrap();
        assert_eq!(scratch.capacity(), kept);
    }

    /// What a primary names that this backup could not take as it is (a stream count it
    /// never has, tables out of order, a name twice, a table id not the next) is refused
    /// with a protocol error before anything is changed; the engine's asserts panicked the
    /// receiver before (found by a review).
    #[test]
    fn tables_and_streams_a_backup_cannot_take_are_refused_not_panicked_on() {
        let t = |v: &[(u32, &str)]| v.iter().map(|(i, n)| (*i, n.to_string())).collect::<Vec<_>>();
        assert!(check_welcome(2, &t(&[(0, "a"), (1, "b")])).is_ok());
        for (streams, tables, says) in [
            (0, t(&[]), "streams"),
            (u32::MAX, t(&[]), "streams"),
            (2, t(&[(1, "a")]), "the next table is 0"),
            (2, t(&[(0, "a"), (1, "a")]), "another table's"),
        ] {
            match check_welcome(streams, &tables) {
                Err(BackupError::Protocol(e)) => assert!(e.contains(says), "{e}"),
                other => panic!("{streams} {tables:?}: {other:?}"),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let db = Database::new(ditto_engine::Options { workers: 1 });
        let storage = RealStorage;
        let added = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            add_tables(&db, dir.path(), &t(&[(5, "t")]), &storage)
        }));
        match added {
            Ok(Err(BackupError::Protocol(e))) => assert!(e.contains("the next table is 0"), "{e}"),
            other => panic!("{:?}", other.map(|r| r.map_err(|e| e.to_string()))),
        }
        assert!(db.tables().is_empty(), "nothing added");
        add_tables(&db, dir.path(), &t(&[(0, "t")]), &storage).unwrap();
        match add_tables(&db, dir.path(), &t(&[(1, "t")]), &storage) {
            Err(BackupError::Protocol(e)) => assert!(e.contains("another table's"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_replay_budget_holds_its_bound_unless_a_replayer_waits_for_the_read_view() {
        let t0 = Instant::now();
        let mut b = QueueBudget::new(100);
        assert!(b.may_take(t0), "empty");
        b.took(250);
        assert!(!b.may_take(t0), "over the bound");
        b.released(200);
        assert!(b.may_take(t0), "under it again");
        b.took(60);
        assert!(!b.may_take(t0));
        // A replayer waiting for the read view may be waiting for a batch still to come.
        b.last_wait = Some(t0);
        assert!(b.may_take(t0 + WAIT_LIFTS_FOR / 2), "a recent wait lifts the bound");
        assert!(!b.may_take(t0 + WAIT_LIFTS_FOR * 2), "an old one does not");
        b.released(110);
        assert_eq!(b.bytes, 0);
        // One batch may always go when nothing is held, however large.
        b.took(1000);
        assert!(!b.may_take(t0 + WAIT_LIFTS_FOR * 2));
        b.released(1000);
        assert!(b.may_take(t0 + WAIT_LIFTS_FOR * 2));
    }

    /// A replayer whose write waits for the read view the primary's release holds (a
    /// standalone backup: under `all` with a backup away, others writing under `local`)
    /// lifts the replay budget, and the batches that come meanwhile are handed over past
    /// it: those above the bound lie in the replica log alone (spilled), the bytes queued
    /// in memory stay within the bound and a batch, and once the release moves each is
    /// read back and replayed, every value as written, in every mode. (Before, the queues
    /// held every batch in memory for as long as the stall.)
    #[test]
    fn batches_handed_to_replay_past_its_budget_while_the_release_stalls_lie_in_the_replica_log() {
        use ditto_engine::{RecordId, WorkerId};
        const MAX: u64 = 64 << 10;
        const LATER: u64 = 60;
        const TXNS: u64 = 100;
        // A batch's bytes, about: 100 transactions of a key and a 160-byte value.
        const BATCH: u64 = 24 << 10;
        for mode in [ReplayMode::Serial, ReplayMode::Parallel, ReplayMode::Dependency { barrier_every: 0 }] {
            let dir = tempfile::tempdir().unwrap();
            let storage: Arc<dyn Storage> = Arc::new(RealStorage);
            let mut rlog = ReplicaLog::create(dir.path(), storage, 2, 1, 1 << 30).unwrap();
            let db = Database::new(ditto_engine::Options { workers: 2 });
            let t = db.create_table("t").unwrap();
            let state = Arc::new(BackupState::default());
            // The primary has released up to ts 2: the read view stays there.
            state.released.store(2, Ordering::Release);
            let engine = Engine::start(
                Arc::clone(&db),
                Arc::clone(&state),
                2,
                Ts::ZERO,
                mode,
                None,
                Some(dir.path().into()),
                None,
            );
            engine.budget.budget.lock().max = MAX;
            let mut persisted = |seq: u64, stream: usize, bound: u64, batch: Bytes| {
                let mut j = test_job(seq, stream, Ts(bound), batch);
                j.at = Some(rlog.append(&j.batch, false, j.high));
                rlog.sync().unwrap();
                j.spillable = true;
                j
            };
            // "k" inserted, deleted, and given a new record at ts 4, which waits until
            // every snapshot sees the delete: for the view to pass ts 3, held at 2.
            let s0 = test_batch(
                0,
                Ts(4),
                &[
                    (1, RecordId(0), Some(b"k"), Some(b"old")),
                    (2, RecordId(0), None, None),
                    (4, RecordId(1), Some(b"k"), Some(b"new")),
                ],
            );
            let s1 = test_batch(1, Ts(4), &[(3, RecordId(2), Some(b"other"), Some(b"x"))]);
            assert!(engine.dispatch(persisted(1, 0, 4, s0)), "{mode:?}");
            assert!(engine.dispatch(persisted(2, 1, 4, s1)), "{mode:?}");
            let deadline = Instant::now() + Duration::from_secs(20);
            while engine.budget.budget.lock().last_wait.is_none() {
                assert!(Instant::now() < deadline, "{mode:?}: the write never waited");
                std::thread::sleep(Duration::from_millis(1));
            }
            // Then batches of 100 transactions of 160-byte values on stream 0, behind the
            // waiting write, and some on stream 1: more transactions than the dependency
            // mode's graph takes (`MAX_IN_FLIGHT`).
            let key = |ts: u64| format!("key{ts}").into_bytes();
            let value = |ts: u64| vec![ts as u8; 160];
            let ts_of = |i: u64, j: u64| 5 + i * TXNS + j;
            let mut queued_max = 0;
            for i in 0..LATER {
                let (keys, values): (Vec<_>, Vec<_>) =
                    (0..TXNS).map(|j| (key(ts_of(i, j)), value(ts_of(i, j)))).unzip();
                let txns: Vec<TestWrite> = (0..TXNS)
                    .map(|j| {
                        (ts_of(i, j), RecordId(ts_of(i, j)), Some(&keys[j as usize][..]), Some(&values[j as usize][..]))
                    })
                    .collect();
                let stream = usize::from(i % 4 == 3);
                let bound = ts_of(i, TXNS - 1);
                let b = test_batch(stream as u32, Ts(bound), &txns);
                assert!(engine.dispatch(persisted(i + 3, stream, bound, b)), "{mode:?}");
                queued_max = queued_max.max(state.replay_queued_bytes.load(Ordering::Relaxed));
            }
            // (Stream 0 vouches for up to the last, stream 1's: the watermark reaches it.)
            let end = ts_of(LATER - 1, TXNS - 1);
            assert!(engine.dispatch(persisted(LATER + 3, 0, end, test_batch(0, Ts(end), &[]))), "{mode:?}");
            let spilled = state.replay_spilled.load(Ordering::Relaxed);
            // (The dependency mode runs the later transactions, which need nothing of the
            // waiting one, as they come: its queue does not fill.)
            if !matches!(mode, ReplayMode::Dependency { .. }) {
                assert!(spilled > LATER / 2, "{mode:?}: {spilled} lie in the replica log alone");
            }
            assert!(queued_max <= MAX + BATCH, "{mode:?}: {queued_max} bytes queued in memory");
            assert!(state.replayed.load(Ordering::Acquire) < 4, "{mode:?}: the write at 4 still waits");
            // The release moves: everything is replayed, the spilled batches read back.
            state.released.store(end, Ordering::Release);
            while state.visible.load(Ordering::Acquire) < end {
                assert!(Instant::now() < deadline, "{mode:?}: replay stopped at {:?}", state.replayed);
                assert_eq!(*state.failure.lock(), None, "{mode:?}");
                engine.publish();
                std::thread::sleep(Duration::from_millis(1));
            }
            // (Stream 1's replayer, not held, may have read its own back before.)
            let read_back = state.replay_read_back.load(Ordering::Relaxed);
            assert!(read_back >= spilled, "{mode:?}: {read_back} read back of {spilled}");
            assert_eq!(state.replay_spilled.load(Ordering::Relaxed), 0, "{mode:?}");
            let mut reader = db.worker(WorkerId(0)).unwrap();
            let mut x = reader.begin_snapshot();
            assert_eq!(x.get(t, b"k").unwrap().map(|v| v.to_vec()), Some(b"new".to_vec()), "{mode:?}");
            for ts in 5..=end {
                assert_eq!(x.get(t, &key(ts)).unwrap().map(|v| v.to_vec()), Some(value(ts)), "{mode:?} {ts}");
            }
            drop(x);
            engine.shut_down();
        }
    }

    /// A replayer whose write waits for the read view when its backup is let go
    /// (`Backup::release`, which halts the engine) ends quietly in every mode: the wait
    /// gives way, and that is no failure of replay. The parallel and dependency replayers
    /// reported it as a failed batch (an ERROR line, and `failure` set on a backup already
    /// let go).
    #[test]
    fn a_replayer_waiting_for_the_read_view_ends_quietly_when_its_backup_is_let_go() {
        use ditto_engine::RecordId;
        let batch = |stream: u32, txns: &[TestWrite]| test_batch(stream, Ts(4), txns);
        let job = |seq: u64, stream: usize, batch: Bytes| test_job(seq, stream, Ts(4), batch);
        for mode in [ReplayMode::Serial, ReplayMode::Parallel, ReplayMode::Dependency { barrier_every: 0 }] {
            let db = Database::new(ditto_engine::Options { workers: 2 });
            db.create_table("t").unwrap();
            let state = Arc::new(BackupState::default());
            // The primary has released up to ts 2: the read view stays there.
            state.released.store(2, Ordering::Release);
            let engine = Engine::start(db, Arc::clone(&state), 2, Ts::ZERO, mode, None, None, None);
            // "k" inserted, deleted, and given a new record at ts 4, which waits until
            // every snapshot sees the delete: for the view to pass ts 3, held at 2.
            let s0 = batch(
                0,
                &[
                    (1, RecordId(0), Some(b"k"), Some(b"old")),
                    (2, RecordId(0), None, None),
                    (4, RecordId(1), Some(b"k"), Some(b"new")),
                ],
            );
            let s1 = batch(1, &[(3, RecordId(2), Some(b"other"), Some(b"x"))]);
            assert!(engine.dispatch(job(1, 0, s0)), "{mode:?}");
            assert!(engine.dispatch(job(2, 1, s1)), "{mode:?}");
            let deadline = Instant::now() + Duration::from_secs(10);
            while engine.budget.budget.lock().last_wait.is_none() {
                assert!(Instant::now() < deadline, "{mode:?}: the write never waited");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(state.replayed.load(Ordering::Acquire) < 4, "{mode:?}: the write at 4 still waits");
            engine.shut_down();
            // The replay threads end (they hold the engine), having said nothing failed.
            while Arc::strong_count(&engine) > 1 {
                assert!(Instant::now() < deadline, "{mode:?}: a replayer still runs after the release");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(*state.failure.lock(), None, "{mode:?}");
            assert_eq!(*engine.replay_error.lock(), None, "{mode:?}");
        }
    }

    /// The serial replayer's help nested two deep, with a put-off inside it (left by a
    /// review as traced by reading only, AJ2): stream 0's new life of "a" at ts 10 waits
    /// for everything up to 9; helping, stream 1's new life of "b" at 8 waits for 7 and
    /// helps in turn; there stream 2's new life of "c" at 12 needs 11, which the write
    /// waiting at 10 below holds, so it is put off (what it installed, 5 and 6, stays);
    /// stream 3's batch brings 7, 9 and 11, and the waits unwind: 8, then 10, then the
    /// put-off batch's 12. Every key ends at its last value, in order, nothing failed.
    /// A snapshot taken at the start holds the read horizon at 0 for the first 300 ms:
    /// the waits hold on (the writes do not go ahead of it) and go on once it is gone.
    #[test]
    fn the_serial_replayer_puts_a_batch_off_inside_a_nested_help_and_takes_it_up_again() {
        use ditto_engine::{RecordId, WorkerId};
        let batch = |stream: u32, txns: &[TestWrite]| test_batch(stream, Ts(12), txns);
        let job = |seq: u64, stream: usize, batch: Bytes| test_job(seq, stream, Ts(12), batch);
        let db = Database::new(ditto_engine::Options { workers: 2 });
        let t = db.create_table("t").unwrap();
        let state = Arc::new(BackupState::default());
        // Nothing waits for a primary's release: the view is the replayed prefix.
        state.released.store(u64::MAX >> 8, Ordering::Release);
        let mut reader = db.worker(WorkerId(0)).unwrap();
        let engine =
            Engine::start(Arc::clone(&db), Arc::clone(&state), 4, Ts::ZERO, ReplayMode::Serial, None, None, None);
        let read = |reader: &mut ditto_engine::Worker, key: &[u8]| {
            let mut x = reader.begin_snapshot();
            x.get(t, key).unwrap().map(|v| v.to_vec())
        };
        let held = std::thread::scope(|scope| {
            // A snapshot at the start, held 300 ms.
            let (tx, rx) = std::sync::mpsc::channel();
            let db = Arc::clone(&db);
            let holder = scope.spawn(move || {
                let mut w = db.worker(WorkerId(1)).unwrap();
                let mut x = w.begin_snapshot();
                assert_eq!(x.get(t, b"a").unwrap(), None);
                tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(300));
                drop(x);
            });
            rx.recv().unwrap();
            let jobs = [
                (
                    0,
                    batch(
                        0,
                        &[
                            (1, RecordId(0), Some(b"a"), Some(b"a1")),
                            (2, RecordId(0), None, None),
                            (10, RecordId(1), Some(b"a"), Some(b"a2")),
                        ],
                    ),
                ),
                (
                    1,
                    batch(
                        1,
                        &[
                            (3, RecordId(2), Some(b"b"), Some(b"b1")),
                            (4, RecordId(2), None, None),
                            (8, RecordId(3), Some(b"b"), Some(b"b2")),
                        ],
                    ),
                ),
                (
                    2,
                    batch(
                        2,
                        &[
                            (5, RecordId(4), Some(b"c"), Some(b"c1")),
                            (6, RecordId(4), None, None),
                            (12, RecordId(5), Some(b"c"), Some(b"c2")),
                        ],
                    ),
                ),
                (
                    3,
                    batch(
                        3,
                        &[
                            (7, RecordId(6), Some(b"e"), Some(b"e")),
                            (9, RecordId(7), Some(b"f"), Some(b"f")),
                            (11, RecordId(8), Some(b"g"), Some(b"g")),
                        ],
                    ),
                ),
            ];
            let t0 = Instant::now();
            for (i, (stream, b)) in jobs.into_iter().enumerate() {
                assert!(engine.dispatch(job(i as u64 + 1, stream, b)));
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while state.replayed.load(Ordering::Acquire) < 12 {
                assert!(state.failure.lock().is_none(), "{:?}", state.failure.lock());
                assert!(Instant::now() < deadline, "replay stalled at ts {}", state.replayed.load(Ordering::Acquire));
                std::thread::sleep(Duration::from_millis(1));
            }
            holder.join().unwrap();
            t0.elapsed()
        });
        assert!(held >= Duration::from_millis(250), "the writes went ahead of the snapshot: {held:?}");
        for (key, want) in
            [(&b"a"[..], &b"a2"[..]), (b"b", b"b2"), (b"c", b"c2"), (b"e", b"e"), (b"f", b"f"), (b"g", b"g")]
        {
            assert_eq!(read(&mut reader, key).as_deref(), Some(want), "{}", String::from_utf8_lossy(key));
        }
        assert_eq!(state.txns_replayed.load(Ordering::Acquire), 12);
        assert_eq!(*state.failure.lock(), None);
        assert_eq!(*engine.replay_error.lock(), None);
        engine.shut_down();
    }

    #[test]
    fn replay_settings_parse_and_bad_ones_say_why() {
        assert_eq!(parse_replay("parallel"), Ok((ReplayMode::Parallel, None)));
        assert_eq!(parse_replay("serial+shared"), Ok((ReplayMode::Serial, Some(0))));
        assert_eq!(
            parse_replay("dependency:0+shared:512"),
            Ok((ReplayMode::Dependency { barrier_every: 0 }, Some(512)))
        );
        assert_eq!(parse_replay("dependency").map(|r| r.0.to_string()), Ok("dependency".to_string()));
        assert!(parse_replay("parallel+copied").unwrap_err().contains("+shared or +shared:N"));
        assert!(parse_replay("paralel").unwrap_err().contains("unknown replay mode"));
        assert!(parse_replay("dependency:x").is_err());
    }
}
