//! ditto's redo log: durability for the engine
//! ==========================================
//! ```text
//!  ditto_log::open(dir) --recover--> Database + Logger (attached as the engine's CommitLog)
//!
//!  dir/LOCK                      held (flock) while open: one process per data directory
//!  dir/CATALOG                   table names (catalog.rs)
//!  dir/log/stream-S-eE-sQ.seg    one stream per worker, segments rolled at a size limit
//!  dir/checkpoints/ckpt-C/       parallel checkpoint parts + MANIFEST (checkpoint.rs)
//! ```
//! - `format`: the batch and segment byte format (docs/log-format.md).
//! - `writer`: per-stream buffers, group commit, durable watermark, failure handling.
//! - `checkpoint`: online, parallel, transaction-consistent checkpoints.
//! - `recovery`: newest complete checkpoint + parallel replay up to the recomputed watermark.
//!
//! Redo only: batches carry after-images (table, record id, value or tombstone, and the key
//! when the write gives the record a value it did not have), so replay never needs undo and
//! never needs the index to apply an update.

mod arena;
pub mod catalog;
pub mod checkpoint;
pub mod format;
pub mod identity;
pub mod options;
pub mod power_cut;
pub mod recovery;
pub mod replica;
pub mod sched;
pub mod sealed;
pub mod storage;
pub mod writer;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Database, Options, Ts};
use parking_lot::Mutex;

pub use checkpoint::CheckpointInfo;
pub use format::{Epoch, StreamId};
pub use options::{Durability, LogOptions};
pub use recovery::RecoveryReport;
pub use writer::{defer_flushes, flush_before_sleeping, flush_deferred, LogStats, Logger, ProgressListener, ShipTap};

use crate::catalog::Catalog;

/// Lowers the calling thread's CPU priority (nice 10; the threads it starts inherit it):
/// for background checkpoints, which write the whole database while the node serves and
/// must not take the cores from its commits and its replication (seen after failovers with
/// 1.9M keys, three nodes on two cores: docs/cluster.md). Best effort: a failure is ignored
/// (the thread then runs at the process's priority).
pub fn background_priority() {
    // SAFETY: setpriority on this thread's own id (Linux: each thread is a task with its
    // own nice value); no memory is passed.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

#[derive(thiserror::Error, Debug)]
pub enum LogError {
    /// An operating-system error on a file (missing permissions, full disk, ...).
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// Bytes on disk are not what ditto wrote. Never retryable: the node refuses to start
    /// rather than silently drop data; a person has to look at the file.
    #[error("corrupt {file} at offset {offset}: {what}")]
    Corrupt { file: PathBuf, offset: u64, what: String },
    /// A log file written in a format version this build does not read (e.g. version 1,
    /// written before the varint payload). Not corruption: the file is intact, but must be
    /// recovered by a build that reads its version (or the data reloaded).
    #[error("{file}: log format version {version} is not supported (this build reads versions {oldest} to {newest})")]
    UnsupportedVersion { file: PathBuf, version: u32, oldest: u32, newest: u32 },
    #[error("data directory {0} is in use by another process")]
    InUse(PathBuf),
    /// A directory that holds another role's data than the open asked for (a backup's
    /// live replica log, opened as a primary's): refused, changing nothing.
    #[error("data directory {dir}: {what}")]
    WrongRole { dir: PathBuf, what: String },
    #[error(transparent)]
    Engine(ditto_engine::Error),
    /// A thread of the log panicked doing it (a bug): what it was doing and the panic's
    /// message. Nothing it wrote counts (a checkpoint without its manifest is none).
    #[error("{0} panicked ({1})")]
    Panicked(&'static str, String),
}

impl LogError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> LogError {
        LogError::Io { path: path.to_path_buf(), source }
    }
}

#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub workers: usize,
    pub log: LogOptions,
    /// Print recovery progress to stderr.
    pub progress: bool,
    /// Write this epoch rather than the one after the newest found (a cluster's control
    /// plane names it, docs/cluster.md); refused if it is not above every epoch found.
    pub epoch: Option<Epoch>,
    /// New commit timestamps start above this (a failover's `start`: above everything any
    /// node held of the epoch it cut).
    pub ts_above: Ts,
    /// An engine that already holds exactly the newest checkpoint in the directory, its
    /// indexes built (a promoted backup's, `replica::open_replica_at`, which wrote that
    /// checkpoint from it): used as it is instead of loading the checkpoint again. Refused
    /// (an error, nothing changed) if the directory holds log segments or its newest
    /// checkpoint is not at the engine's read view.
    pub recovered: Option<Recovered>,
    /// With `recovered` on a directory whose replica log is sealed at the engine's read view
    /// (`sealed`): write a checkpoint in the background once the log runs, which takes the
    /// sealed log away (default). Off, the sealed log stays until the next checkpoint
    /// (recovery replays it): for tests of recovery from such a directory.
    pub checkpoint_sealed: bool,
}

/// An engine already recovered to the newest checkpoint (`OpenOptions::recovered`).
#[derive(Clone)]
pub struct Recovered(pub Arc<Database>);

impl std::fmt::Debug for Recovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recovered(at ts {})", self.0.clock().visible_ts().0)
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            workers: Options::default().workers,
            log: LogOptions::default(),
            progress: false,
            epoch: None,
            ts_above: Ts::ZERO,
            recovered: None,
            checkpoint_sealed: true,
        }
    }
}

/// A durable database: the engine with its log attached. Clones share it.
#[derive(Clone)]
pub struct Durable {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<Database>,
    logger: Arc<Logger>,
    dir: PathBuf,
    opts: LogOptions,
    checkpointing: Mutex<()>,
    /// Set by `fence`: a checkpoint under way stops short (`storage::Cancellable`), and no
    /// other is begun.
    fenced: Arc<std::sync::atomic::AtomicBool>,
    /// Callers waiting for `checkpointing`: while there are any, the checkpoint being
    /// written goes unpaced (checkpoint.rs, `Pace`).
    checkpoint_waiters: AtomicUsize,
    /// The last checkpoint `checkpoint` wrote, and the log's `bytes_written` when it began
    /// (`link_recent_checkpoint`).
    last_checkpoint: Mutex<Option<(CheckpointInfo, u64)>>,
    recovery: RecoveryReport,
    /// The data directory's lock (`lock_dir`), held until the last handle goes, or until
    /// `close_and_release` gives the directory up.
    lock: Mutex<Option<std::fs::File>>,
    /// What a checkpoint keeps of the log for backups (`keep_log_for`).
    keeper: Mutex<Option<LogKeeper>>,
    /// The newest log a checkpoint deleted though a backup still needed it (past the
    /// bound): no later checkpoint keeps anything for a position below it (that backup is
    /// sent a checkpoint anyway).
    dropped_for_backups: AtomicU64,
    /// The directory's database id (`identity`), made by its first open.
    database: identity::DatabaseId,
}

/// Says, when a checkpoint is done, the lowest timestamp the backups may still need the
/// log above, among those at or above its argument (below it, the log already went past
/// the bound: such a backup is sent a checkpoint): log segments holding anything above it
/// are kept, though the checkpoint covers them (`Durable::keep_log_for`).
pub type LogKeeper = Box<dyn Fn(Ts) -> Ts + Send + Sync>;

/// Opens (creating if needed) and recovers the database in `dir`.
pub fn open(dir: &Path, mut opts: OpenOptions) -> Result<Durable, LogError> {
    let t0 = Instant::now();
    for d in [dir.to_path_buf(), dir.join("log"), dir.join("checkpoints")] {
        std::fs::create_dir_all(&d).map_err(|e| LogError::io(&d, e))?;
    }
    // Their entries durable before anything is written in them (a `log/` made again
    // beside an existing CATALOG was otherwise made durable by nothing).
    opts.log.storage.sync_dir(dir).map_err(|e| LogError::io(dir, e))?;
    let lock = lock_dir(dir)?;
    sealed::finish_seal(dir, &*opts.log.storage)?;
    // (A crash between an old primary's seal's steps left its `log/` sealed: the rename
    // just finished took it away.)
    std::fs::create_dir_all(dir.join("log")).map_err(|e| LogError::io(&dir.join("log"), e))?;
    let catalog = Catalog::load(dir)?;
    // A damaged database id refuses the open here, before recovery changes anything (a
    // torn tail cut, the log folded into a checkpoint and deleted, older checkpoints gone):
    // it was read only once logging started, after all of that (found by a review,
    // 2026-12-06). A missing one is made there, as before.
    identity::read(dir).map_err(|e| LogError::io(&dir.join(identity::DATABASE_ID_FILE), e))?;
    let mut report = RecoveryReport::default();
    let (newest, stale_ckpts) = checkpoint::find_newest(dir)?;
    // A promoted backup's replica logs sealed at failovers' points (`sealed`).
    let base = sealed::base(dir)?;
    if let Some(Recovered(db)) = opts.recovered.take() {
        return open_recovered(dir, opts, db, lock, catalog, newest, base.chain.len(), stale_ckpts, t0);
    }
    refuse_a_backups_directory(dir)?;
    let db = Database::new(Options { workers: opts.workers });
    for (id, name) in &catalog.tables {
        db.restore_table(*id, name);
    }
    let epoch_min = match &newest {
        Some((cdir, m)) => {
            let t = Instant::now();
            if opts.progress {
                eprintln!("recovery: loading checkpoint at ts {} ({} parts)", m.ts.0, m.parts.len());
            }
            let (rows, bytes) = checkpoint::load(&db, cdir, m, recovery::recovery_threads())?;
            report.checkpoint_ts = Some(m.ts);
            report.checkpoint_rows = rows;
            report.checkpoint_bytes = bytes;
            report.checkpoint_seconds = t.elapsed().as_secs_f64();
            if opts.progress {
                eprintln!(
                    "recovery: checkpoint loaded: {rows} rows, {:.1} MB in {:.2} s ({:.0} MB/s)",
                    bytes as f64 / 1e6,
                    report.checkpoint_seconds,
                    report.checkpoint_mb_per_s()
                );
            }
            m.log_epoch_min
        }
        None => Epoch(0),
    };
    // The sealed logs up to the last one's point, then the primary's log above it.
    let ckpt_ts = sealed::replay_chain(&db, &base, &mut report)?;
    // An old primary's log sealed in the chain names an epoch this one must lie above.
    let chain_epoch = report.max_epoch;
    let recovery::LogDir { segments, unfinished } = recovery::list_segments(dir)?;
    let cut = recovery::replay_log(&db, &segments, epoch_min, ckpt_ts, None, &mut report, opts.progress, false)?;
    report.max_epoch = report.max_epoch.max(chain_epoch);
    let recovered_ts = cut.max(ckpt_ts);
    let t = Instant::now();
    report.index_keys = db.recovery_finish(recovered_ts, recovery::recovery_threads()).map_err(LogError::Engine)?;
    report.index_seconds = t.elapsed().as_secs_f64();
    report.previous_epoch = report.max_epoch.max(epoch_min.0.saturating_sub(1));
    let mut epoch = Epoch(report.previous_epoch + 1);
    if let Some(e) = opts.epoch {
        if e < epoch {
            return Err(LogError::Corrupt {
                file: dir.join("log"),
                offset: 0,
                what: format!("asked to write epoch {}, but this directory already holds epoch {}", e.0, epoch.0 - 1),
            });
        }
        epoch = e;
    }
    // Only once nothing more refuses the open (a refused open changes nothing): torn tails
    // cut, and the segments a crash left unfinished (no batch in them) removed.
    recovery::cut_torn_tails(&report, &*opts.log.storage)?;
    for path in unfinished {
        tracing::warn!("{}: a segment left unfinished by a crash (no batch in it); removing", path.display());
        opts.log.storage.remove(&path).map_err(|e| LogError::io(&path, e))?;
        report.unfinished_segments_removed.push(path);
    }
    if opts.progress && !segments.is_empty() {
        eprintln!(
            "recovery: replayed {} txns ({:.0} MB/s of log), dropped {} unacknowledged above the cut",
            report.log_txns_replayed,
            report.log_mb_per_s(),
            report.log_txns_dropped_above_cut
        );
    }
    if opts.progress {
        eprintln!("recovery: indexed {} keys in {:.2} s", report.index_keys, report.index_seconds);
    }
    // Everything recovered goes into a fresh checkpoint that names the new epoch, so the old
    // segments (and whatever they hold above the cut) can never be replayed again.
    // Nothing else runs yet, so it takes every core (and leaves more parts for the next load).
    // The newest durable checkpoint, which the next recovery starts from (or a newer one).
    let mut durable_ckpt_ts = ckpt_ts;
    if !segments.is_empty() || !base.chain.is_empty() {
        let threads = recovery::recovery_threads().max(opts.log.checkpoint_threads);
        let info = checkpoint::write(
            &db,
            db.read(),
            dir,
            threads,
            opts.log.checkpoint_part_bytes,
            epoch,
            &*opts.log.storage,
            None,
            None,
            // (Nothing is logged yet: what it holds was recovered from disk.)
            None,
        )?;
        report.checkpoint_write_seconds = info.seconds;
        report.checkpoint_written_bytes = info.bytes;
        durable_ckpt_ts = info.ts;
        if opts.progress {
            eprintln!(
                "recovery: wrote checkpoint at ts {} ({} rows, {} parts) for epoch {} in {:.2} s",
                info.ts.0, info.rows, info.parts, epoch.0, info.seconds
            );
        }
        // The checkpoint names the new epoch, so these segments are obsolete whether or
        // not they go now: one that cannot be deleted is left for the next open.
        for s in &segments {
            remove_or_warn(&*opts.log.storage, &s.path, "after recovery; the next open tries again");
        }
        remove_checkpoints_except(dir, &info.dir)?;
        sealed::remove_sealed(dir, info.ts, &*opts.log.storage)?;
    } else {
        for d in &stale_ckpts {
            std::fs::remove_dir_all(d).map_err(|e| LogError::io(d, e))?;
        }
    }
    start_logging(dir, opts, db, lock, catalog, epoch, recovered_ts, durable_ckpt_ts, report, t0)
}

/// Refuses, changing nothing, a backup's data directory whose replica log is live (not
/// sealed at a failover's point, which the chain below replays): a primary's open reads
/// its checkpoint and its own log only, so what the backup received since its last
/// checkpoint would be left out without a word. (Found so: a standalone backup restarted
/// without `--replica-of` came up without its newest writes.) A cluster promotes a
/// backup's directory itself first (`replica::open_replica_at`, then the replica log
/// goes).
fn refuse_a_backups_directory(dir: &Path) -> Result<(), LogError> {
    let rdir = replica::replica_dir(dir);
    if sealed::replica_is_sealed(dir) || !rdir.exists() {
        return Ok(());
    }
    let holds = std::fs::read_dir(&rdir)
        .map_err(|e| LogError::io(&rdir, e))?
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with("rlog-"));
    if holds {
        return Err(LogError::WrongRole {
            dir: dir.to_path_buf(),
            what: "this is a backup's data directory (its replica log holds what it received since its last \
                   checkpoint, which a primary's open would leave out): start it as a backup (--replica-of), \
                   or promote it whole (ditto server --promote)"
                .into(),
        });
    }
    Ok(())
}

/// An engine given to open `dir` with (`open`'s `OpenOptions::recovered`, a backup's
/// `replica::open_replica_with`) must hold exactly what the directory holds: its read view
/// is the point of the directory's sealed replica log if it has one (`sealed`), else its
/// newest checkpoint's.
pub(crate) fn check_engine_at_base(dir: &Path, db: &Database) -> Result<(), LogError> {
    let view = db.clock().visible_ts();
    let refuse = |file: PathBuf, what: String| Err(LogError::Corrupt { file, offset: 0, what });
    let base = sealed::base(dir)?;
    match (base.chain.last(), base.ckpt) {
        (Some(s), _) if view != s.point => refuse(
            s.dir.clone(),
            format!("given an engine recovered to ts {}, but the replica log is sealed at ts {}", view.0, s.point.0),
        ),
        (Some(_), _) => Ok(()),
        // An empty engine for an empty directory: a backup that never joined, promoted at a
        // failover whose point is 0 (its primary died before anything was committed; seen
        // in a test: that promotion failed, and its node gave the epoch up).
        (None, None) if view == Ts::ZERO => Ok(()),
        (None, None) => {
            refuse(dir.to_path_buf(), "given a recovered engine, but the directory holds no checkpoint".into())
        }
        (None, Some((_, m))) if m.ts != view => refuse(
            dir.to_path_buf(),
            format!("given an engine recovered to ts {}, but the newest checkpoint is at ts {}", view.0, m.ts.0),
        ),
        (None, Some(_)) => Ok(()),
    }
}

/// `open` with an engine that already holds what the directory holds
/// (`OpenOptions::recovered`): its newest checkpoint, or its chain of sealed logs (`links`
/// of them), the last at a failover's point. A chain of `sealed::CHECKPOINT_AT_LINKS` or
/// more is checkpointed away in the background once the log runs (`Durable::checkpoint`);
/// a shorter one when the checkpoint policy says (its bytes counted as log).
#[allow(clippy::too_many_arguments)]
fn open_recovered(
    dir: &Path,
    opts: OpenOptions,
    db: Arc<Database>,
    lock: std::fs::File,
    catalog: Catalog,
    newest: Option<(PathBuf, checkpoint::Manifest)>,
    links: usize,
    stale_ckpts: Vec<PathBuf>,
    t0: Instant,
) -> Result<Durable, LogError> {
    let refuse = |what: String| LogError::Corrupt { file: dir.to_path_buf(), offset: 0, what };
    check_engine_at_base(dir, &db)?;
    if !recovery::list_segments(dir)?.segments.is_empty() {
        return Err(refuse("given a recovered engine, but the directory holds log segments to replay".into()));
    }
    let (ckpt_ts, epoch_min) = newest.as_ref().map_or((Ts::ZERO, Epoch(0)), |(_, m)| (m.ts, m.log_epoch_min));
    let view = db.clock().visible_ts();
    let epoch = Epoch(epoch_min.0.max(1));
    let epoch = match opts.epoch {
        Some(e) if e < epoch => {
            return Err(refuse(format!("asked to write epoch {}, but the checkpoint names epoch {}", e.0, epoch.0)))
        }
        Some(e) => e,
        None => epoch,
    };
    for d in &stale_ckpts {
        std::fs::remove_dir_all(d).map_err(|e| LogError::io(d, e))?;
    }
    let report = RecoveryReport { checkpoint_ts: newest.as_ref().map(|_| ckpt_ts), cut_ts: view, ..Default::default() };
    // A backup's engine: the ids it would reuse were listed before replay filled some of
    // them (`Database::forget_reusable_rids`).
    db.forget_reusable_rids();
    let in_background = links >= sealed::CHECKPOINT_AT_LINKS && opts.checkpoint_sealed;
    let durable = start_logging(dir, opts, db, lock, catalog, epoch, view, ckpt_ts, report, t0)?;
    if in_background {
        let weak = Arc::downgrade(&durable.inner);
        let _ = std::thread::Builder::new().name("ditto-seal-ckpt".into()).spawn(move || {
            background_priority();
            let Some(inner) = weak.upgrade() else { return };
            let t = Instant::now();
            match (Durable { inner }).checkpoint() {
                Ok(info) => tracing::info!(
                    "the sealed replica log is checkpointed away: a checkpoint at ts {} ({:.1} MB) in {:.2} s",
                    info.ts.0,
                    info.bytes as f64 / 1e6,
                    t.elapsed().as_secs_f64()
                ),
                // The sealed log stays, and recovery replays it; the checkpointer tries later.
                Err(e) => tracing::warn!("checkpointing the sealed replica log away: {e}"),
            }
        });
    }
    Ok(durable)
}

/// The end of `open`: the log starts writing `epoch` on top of what was recovered.
#[allow(clippy::too_many_arguments)]
fn start_logging(
    dir: &Path,
    opts: OpenOptions,
    db: Arc<Database>,
    lock: std::fs::File,
    catalog: Catalog,
    epoch: Epoch,
    recovered_ts: Ts,
    durable_ckpt_ts: Ts,
    mut report: RecoveryReport,
    t0: Instant,
) -> Result<Durable, LogError> {
    // The directory's database id (`identity`), from its first open on (a promotion's
    // keeps the one its backup took): its copies carry it.
    let database = identity::load_or_create(dir, &*opts.log.storage)
        .map_err(|e| LogError::io(&dir.join(identity::DATABASE_ID_FILE), e))?;
    // New commits, and the streams' durable positions, start above `ts_above`: nothing
    // lies between what was recovered and it (a failover discarded it), so the watermark
    // covers it at once (a backup registering waits for the watermark to reach the clock).
    db.clock().advance_to(opts.ts_above);
    // The epoch's first segments name the checkpoint its log stands on (the newest durable
    // one, which the next recovery starts from, or a newer one): a recovery that finds
    // only an older one, or none, refuses the log rather than open without what lay
    // between (`SegmentHeader::prev_ts`).
    let from = recovered_ts.max(opts.ts_above);
    let logger = Logger::start(dir, epoch, opts.log.clone(), Arc::clone(db.clock()), catalog, from, durable_ckpt_ts)
        .map_err(|e| LogError::io(&dir.join("log"), e))?;
    db.attach_log(Arc::clone(&logger) as Arc<dyn ditto_engine::CommitLog>);
    // Record ids whose former life a checkpoint covers may be reused: recovery never meets
    // that life again (crates/engine/src/table.rs).
    db.allow_rid_reuse_up_to(durable_ckpt_ts);
    report.total_seconds = t0.elapsed().as_secs_f64();
    Ok(Durable {
        inner: Arc::new(Inner {
            db,
            logger,
            dir: dir.to_path_buf(),
            opts: opts.log,
            checkpointing: Mutex::new(()),
            fenced: Arc::default(),
            checkpoint_waiters: AtomicUsize::new(0),
            last_checkpoint: Mutex::new(None),
            recovery: report,
            lock: Mutex::new(Some(lock)),
            keeper: Mutex::new(None),
            dropped_for_backups: AtomicU64::new(0),
            database,
        }),
    })
}

/// Takes the data directory's lock (`dir/LOCK`, flock): one process per directory.
pub(crate) fn lock_dir(dir: &Path) -> Result<std::fs::File, LogError> {
    let lock_path = dir.join("LOCK");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| LogError::io(&lock_path, e))?;
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(LogError::InUse(dir.to_path_buf()));
    }
    Ok(lock)
}

/// This thread's CPU time in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// `clock`'s reading in nanoseconds (`None` if it cannot be read: an unknown clock, or a
/// thread's that has ended).
pub fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the struct we pass.
    match unsafe { libc::clock_gettime(clock, &mut ts) } {
        0 => Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64),
        _ => None,
    }
}

/// Deletes a log segment that a complete checkpoint made obsolete; whether it is gone (a
/// file already missing is). A failure only costs disk, so it is logged (`when` says when
/// and what happens next), not returned.
fn remove_or_warn(storage: &dyn storage::Storage, path: &Path, when: &str) -> bool {
    match storage.remove(path) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            tracing::warn!("deleting {} {when}: {e}", path.display());
            false
        }
    }
}

/// Removes every checkpoint of `dir` but `keep` (the one just written).
///
/// They go to the trash (a rename each) and are deleted there by a thread of their own:
/// unlinking a checkpoint of hundreds of MB took 130 ms on a 16-core machine, and a
/// backup's fence, with a failover behind it, waited for its checkpointer to finish that.
/// The renames are not made durable: a crash may bring an older checkpoint back, and the
/// newest complete one is what an open reads, and what the next call keeps.
pub(crate) fn remove_checkpoints_except(dir: &Path, keep: &Path) -> Result<(), LogError> {
    let root = checkpoint::checkpoints_dir(dir);
    let mut gone = Vec::new();
    for e in std::fs::read_dir(&root).map_err(|e| LogError::io(&root, e))? {
        let p = e.map_err(|e| LogError::io(&root, e))?.path();
        if p != keep {
            gone.push(p);
        }
    }
    if !gone.is_empty() && replica::to_trash_unsynced(dir, &gone).is_err() {
        // A full disk may refuse the trash directory: deleted here instead.
        for p in &gone {
            if p.exists() {
                std::fs::remove_dir_all(p).map_err(|e| LogError::io(p, e))?;
            }
        }
    }
    Ok(())
}

/// How long the background checkpointer waits after a failed checkpoint before it tries
/// again (the time trigger, too, counts from the failed one).
pub const CHECKPOINT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// When the background checkpointer (`Durable::spawn_checkpointer`) writes a checkpoint:
/// as soon as any one trigger is due. A checkpoint bounds what recovery replays and the
/// log kept on disk, and lets deleted records' ids be reused (a record id is reused only
/// once a checkpoint covers the delete that freed it, crates/engine/src/table.rs). By time
/// alone, a busy database could write far more log than it holds, and keep every record
/// deleted since the last checkpoint: the two other triggers bound both by what the
/// database holds, as Redis's `auto-aof-rewrite-percentage` and `-min-size` bound its AOF.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPolicy {
    /// This long after the last checkpoint began (`None`: not by time).
    pub every: Option<Duration>,
    /// Once the log written since the last checkpoint is this percentage of that
    /// checkpoint's size (0: not by log growth)...
    pub log_growth_percent: u64,
    /// ...and at least this many bytes.
    pub log_min_bytes: u64,
    /// Once this many record ids were given back since the last checkpoint (0: not by ids),
    /// and at least as many as are in use: deleted records wait in memory (their key and
    /// tombstone) until the next checkpoint lets their ids be reused.
    pub reuse_min_ids: u64,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        CheckpointPolicy {
            every: Some(Duration::from_secs(300)),
            log_growth_percent: 100,
            log_min_bytes: 64 << 20,
            reuse_min_ids: 100_000,
        }
    }
}

/// Why a checkpoint is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Time,
    LogGrowth,
    IdReuse,
}

/// What `CheckpointPolicy::due` decides on, all since the last checkpoint began.
#[derive(Clone, Copy, Debug)]
pub struct Due {
    pub elapsed: Duration,
    pub log_bytes: u64,
    pub last_checkpoint_bytes: u64,
    pub ids_released: u64,
    pub ids_used: u64,
}

impl CheckpointPolicy {
    /// The first trigger that is due, if any. No I/O: the checkpointer feeds it counters.
    pub fn due(&self, d: Due) -> Option<Trigger> {
        if self.every.is_some_and(|every| d.elapsed >= every) {
            return Some(Trigger::Time);
        }
        let growth = d.last_checkpoint_bytes.saturating_mul(self.log_growth_percent) / 100;
        if self.log_growth_percent > 0 && d.log_bytes >= growth.max(self.log_min_bytes) {
            return Some(Trigger::LogGrowth);
        }
        if self.reuse_min_ids > 0 && d.ids_released >= d.ids_used.max(self.reuse_min_ids) {
            return Some(Trigger::IdReuse);
        }
        None
    }

    /// Whether any trigger is on (else no checkpointer is needed).
    pub fn any(&self) -> bool {
        self.every.is_some() || self.log_growth_percent > 0 || self.reuse_min_ids > 0
    }
}

impl Durable {
    pub fn db(&self) -> &Arc<Database> {
        &self.inner.db
    }

    pub fn logger(&self) -> &Arc<Logger> {
        &self.inner.logger
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The id of the database this directory holds (`identity`), read or made by the open.
    pub fn database(&self) -> identity::DatabaseId {
        self.inner.database
    }

    /// What recovery found and did when this database was opened.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.inner.recovery
    }

    /// The epoch this directory's log held and the point recovery cut it at, when the
    /// open began a new epoch above it: the new epoch's log begins right above the point
    /// (nothing lies between), so a backup of the old epoch that holds exactly the point
    /// can be resumed from this log (`ditto_replication::PrimaryOptions::resume_from`).
    /// The point is 0 where the old epoch's log held nothing durable (a primary killed
    /// before its first batch reached its disk, which its backups may hold). `None` for a
    /// new directory or an engine kept.
    ///
    /// A recovery writes a checkpoint naming the new epoch, removes the old segments, and
    /// only then makes the new epoch's: a crash between leaves the checkpoint alone, and
    /// the next open begins that epoch again. The epoch before it was cut at the
    /// checkpoint's ts, and that is what this says then (found by review, 2026-11-29:
    /// it said `None`, and a restarted primary then waited for no backup).
    pub fn opened_from(&self) -> Option<(Epoch, Ts)> {
        let r = self.recovery();
        let old = Epoch(r.previous_epoch);
        let point = Ts(r.cut_ts.0.max(r.checkpoint_ts.map_or(0, |t| t.0)));
        (old.0 > 0 && old < self.logger().epoch()).then_some((old, point))
    }

    /// The turn to checkpoint (one at a time). A caller that has to wait counts as a
    /// waiter meanwhile, so the checkpoint it waits for stops pacing itself (`Pace`).
    fn checkpoint_turn(&self) -> parking_lot::MutexGuard<'_, ()> {
        if let Some(g) = self.inner.checkpointing.try_lock() {
            return g;
        }
        let waiters = &self.inner.checkpoint_waiters;
        waiters.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let g = self.inner.checkpointing.lock();
        waiters.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        g
    }

    /// Writes an online checkpoint (workers keep running), then deletes the log segments and
    /// older checkpoints it covers. If it fails, nothing is deleted and the log goes on: the
    /// previous checkpoint and the segments still hold everything.
    pub fn checkpoint(&self) -> Result<CheckpointInfo, LogError> {
        let _one = self.checkpoint_turn();
        let i = &self.inner;
        if i.lock.lock().is_none() {
            return Err(LogError::Corrupt {
                file: i.dir.clone(),
                offset: 0,
                what: "the directory was given up (`close_and_release`): no checkpoint is written".into(),
            });
        }
        if i.fenced.load(std::sync::atomic::Ordering::Acquire) {
            return Err(LogError::Corrupt {
                file: i.dir.clone(),
                offset: 0,
                what: "the log is fenced (`Durable::fence`): no checkpoint is written".into(),
            });
        }
        // A failed log: the engine holds commits whose log write failed (answered as
        // failed), which a checkpoint would make durable, and covered segments are what
        // recovery needs while the log is in doubt. (Found by a review.)
        if let Some(why) = i.logger.failure() {
            return Err(LogError::Engine(ditto_engine::Error::LogFailed(
                format!("no checkpoint is written on a failed log: {why}").into(),
            )));
        }
        let bytes_then = i.logger.stats.bytes_written.load(std::sync::atomic::Ordering::Acquire);
        // The newest sealed log's floor (what it lies on), for keeping it once this
        // checkpoint takes the chain away (`sealed::retire_sealed`).
        let base = sealed::base(&i.dir)?;
        let sealed_floor = base.chain.len().checked_sub(1).map(|last| base.floor_of(last));
        // A panic in it fails it as an error does: counted, retried by the checkpointer
        // after its pause. (Before 2026-12-03 it ended the background checkpointer's thread
        // without a word: the primary never checkpointed again, its log grew until its
        // disk filled, and a restart replayed all of it.) `write` catches its writers'
        // panics itself, to clean up after them; this catches the rest of it (the
        // snapshot, the same-timestamp path).
        let written = ditto_engine::catch_panic(|| {
            checkpoint::write(
                &i.db,
                i.db.read(),
                &i.dir,
                i.opts.checkpoint_threads,
                i.opts.checkpoint_part_bytes,
                i.logger.epoch(),
                &storage::Cancellable { inner: Arc::clone(&i.opts.storage), cancel: Arc::clone(&i.fenced) },
                checkpoint::Pace::new(i.opts.checkpoint_write_bytes_per_s, Some(&i.checkpoint_waiters)),
                Some(&i.logger.stats.checkpoint_cpu_ns),
                Some(&|ts| i.db.wait_durable(ts).map_err(LogError::Engine)),
            )
        })
        .unwrap_or_else(|msg| Err(LogError::Panicked("the checkpoint writer", msg)));
        let stats = &i.logger.stats;
        let counter = if written.is_ok() { &stats.checkpoints } else { &stats.checkpoint_failures };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let info = written?;
        i.db.allow_rid_reuse_up_to(info.ts);
        // The checkpoint is complete: a segment that cannot be deleted now costs only disk
        // space, so it is logged, counted and left for the next checkpoint to delete
        // (recovery reads a covered segment and skips it).
        //
        // A panic in what follows (the keeper is the replication layer's, the removal the
        // storage's) does not undo the checkpoint: it is logged and counted as a failed
        // deletion, and every segment not yet deleted goes back to the list for the next
        // checkpoint. (Before 2026-12-04 it ended the checkpointer's thread, and the
        // segments taken from the list were neither deleted nor given back: the log kept
        // them on disk until a restart. Found by a review.)
        let mut covered: std::collections::VecDeque<_> = i.logger.take_segments_covered_by(info.ts).into();
        let mut kept = Vec::new();
        let swept = ditto_engine::catch_panic(|| {
            // What backups have not made durable stays (a backup that returns, or a
            // failover's fetch from this log, reads it), up to `keep_for_backups_max_bytes`.
            let dropped = &i.dropped_for_backups;
            let gone_below = Ts(dropped.load(std::sync::atomic::Ordering::Acquire));
            let mut needed = i.keeper.lock().as_ref().map_or(Ts(u64::MAX), |f| f(gone_below)).max(gone_below);
            // (A size that cannot be read counts as the bound: nothing is kept past it blindly.)
            let size = |p: &Path| std::fs::metadata(p).map_or(i.opts.keep_for_backups_max_bytes, |m| m.len());
            let wanted: u64 = covered.iter().filter(|(_, s)| s.last_ts > needed).map(|(_, s)| size(&s.path)).sum();
            if wanted > i.opts.keep_for_backups_max_bytes {
                tracing::warn!(
                    "{}: {wanted} bytes of log kept for a backup that has not made them durable, over {}: deleted (that backup is sent a checkpoint when it returns)",
                    i.dir.display(),
                    i.opts.keep_for_backups_max_bytes
                );
                let newest = covered.iter().map(|(_, s)| s.last_ts.0).max().unwrap_or(0);
                dropped.fetch_max(newest, std::sync::atomic::Ordering::AcqRel);
                needed = Ts(u64::MAX);
            }
            // A segment leaves `covered` only once dealt with: one whose removal panicked
            // is still there.
            while let Some((_, seg)) = covered.front() {
                let keep = seg.last_ts > needed
                    || !remove_or_warn(&*i.opts.storage, &seg.path, "after a checkpoint; the next one tries again")
                        && {
                            stats.segment_delete_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            true
                        };
                let taken = covered.pop_front().expect("looked at");
                if keep {
                    kept.push(taken);
                }
            }
        });
        if let Err(msg) = swept {
            tracing::error!(
                "{}: deleting the log segments a checkpoint covers panicked ({msg}); the checkpoint stands, and the segments not deleted are left for the next one",
                i.dir.display()
            );
            stats.segment_delete_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        kept.extend(covered);
        i.logger.return_segments(kept);
        *i.last_checkpoint.lock() = Some((info.clone(), bytes_then));
        // The checkpoint is complete and counted: what is left (older checkpoints, a
        // sealed log it covers) only costs disk if it cannot go now, and goes at the next
        // checkpoint. (Before 2026-12-02 such a failure made the call an error after its
        // success: the checkpointer backed off as if it had failed, and the last
        // checkpoint was not recorded. Found by a review.)
        // (A panic there is taken as such a failure.)
        let removed =
            ditto_engine::catch_panic(|| remove_checkpoints_except(&i.dir, &info.dir).map_err(|e| e.to_string()));
        if let Err(e) = removed.unwrap_or_else(|m| Err(format!("panicked: {m}"))) {
            tracing::warn!("{}: older checkpoints not removed (the next checkpoint tries again): {e}", i.dir.display());
        }
        // At the read view, so above a sealed log's point: that log is no longer recovery's.
        // It is kept until the next checkpoint, for a backup that rejoins below its point.
        let retired = ditto_engine::catch_panic(|| {
            sealed::retire_sealed(&i.dir, sealed_floor, &*i.opts.storage).map_err(|e| e.to_string())
        });
        if let Err(e) = retired.unwrap_or_else(|m| Err(format!("panicked: {m}"))) {
            tracing::warn!("{}: a sealed log not retired (the next checkpoint tries again): {e}", i.dir.display());
        }
        Ok(info)
    }

    /// Has every later checkpoint keep the log segments that hold anything above what
    /// `keeper` says (the lowest position the primary's backups have made durable), though
    /// the checkpoint covers them, up to `LogOptions::keep_for_backups_max_bytes`: a backup
    /// that returns resumes from the log instead of being sent a checkpoint, and a
    /// failover's fetch from this log can start below the checkpoint
    /// (`recovery::primary_stream_batches`, `recovery::primary_fetch_floor`). Once the
    /// bound made a checkpoint delete what a backup needed, nothing is kept again for a
    /// position below what it deleted (the keeper is asked for the lowest position at or
    /// above that). `None`: none kept.
    pub fn keep_log_for(&self, keeper: Option<LogKeeper>) {
        *self.inner.keeper.lock() = keeper;
    }

    /// The last checkpoint this database wrote, hard-linked into the new directory `to`
    /// (so a later checkpoint may delete it meanwhile), if the log written since it began
    /// is at most half its size: a backup that joins is then sent it and the log above it
    /// rather than a checkpoint written for it (after a failover, the one the new primary
    /// writes in the background). `None` if there is none, or too much log since. Waits
    /// for a checkpoint being written. Returns the checkpoint and its files' names.
    pub fn link_recent_checkpoint(&self, to: &Path) -> Result<Option<(CheckpointInfo, Vec<String>)>, LogError> {
        let _one = self.checkpoint_turn();
        let Some((info, bytes_then)) = self.inner.last_checkpoint.lock().clone() else { return Ok(None) };
        let since = self.inner.logger.stats.bytes_written.load(std::sync::atomic::Ordering::Acquire) - bytes_then;
        if since > info.bytes / 2 || !info.dir.join("MANIFEST").exists() {
            return Ok(None);
        }
        let files = checkpoint::link_files(&info.dir, to)?;
        Ok(Some((info, files)))
    }

    /// Checkpoints on a background thread, whenever `policy` says one is due, until the
    /// database is closed.
    pub fn spawn_checkpointer(&self, policy: CheckpointPolicy) -> std::thread::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        std::thread::spawn(move || {
            background_priority();
            let step = Duration::from_millis(50);
            let counters = |i: &Inner| {
                (i.logger.stats.bytes_written.load(std::sync::atomic::Ordering::Relaxed), i.db.record_ids_released())
            };
            let Some(first) = weak.upgrade() else { return };
            // Since the last checkpoint: when it began (for the one the database was opened
            // on, the open: recovery wrote it then, or loaded it), the counters then, and its
            // size. Recovery leaves no log behind the checkpoint it opens on, so the log
            // written since the open is all there is.
            let last_bytes = match first.recovery.open_checkpoint_bytes() {
                // An engine kept through a change of role in place: the checkpoint under it.
                0 => sealed::base_checkpoint_bytes(&first.dir),
                b => b,
            };
            let (mut since, mut at, mut last_bytes) = (Instant::now(), counters(&first), last_bytes);
            // A chain of sealed logs the database was opened on (a backup promoted in place)
            // is log a recovery would replay too, until a checkpoint takes it away.
            let mut carried = sealed::chain_bytes(&first.dir);
            drop(first);
            // After a failure, when to try again.
            let mut retry_at: Option<Instant> = None;
            loop {
                std::thread::sleep(step);
                let Some(inner) = weak.upgrade() else { return };
                if inner.logger.failure().is_some() || !inner.logger.check_open() {
                    return;
                }
                if retry_at.is_some_and(|t| Instant::now() < t) {
                    continue;
                }
                if carried > 0 {
                    // Another checkpoint (a long chain's, at once) may have taken it away.
                    carried = sealed::chain_bytes(&inner.dir);
                }
                let now = counters(&inner);
                let Some(why) = policy.due(Due {
                    elapsed: since.elapsed(),
                    log_bytes: now.0.saturating_sub(at.0) + carried,
                    last_checkpoint_bytes: last_bytes,
                    ids_released: now.1.saturating_sub(at.1),
                    ids_used: inner.db.record_ids_used_total(),
                }) else {
                    continue;
                };
                let stats = &inner.logger.stats;
                let started = Instant::now();
                match (Durable { inner: Arc::clone(&inner) }).checkpoint() {
                    Ok(info) => {
                        (at, last_bytes, retry_at, carried) = (now, info.bytes, None, 0);
                        let by = match why {
                            Trigger::Time => &stats.checkpoints_by_time,
                            Trigger::LogGrowth => &stats.checkpoints_by_log_growth,
                            Trigger::IdReuse => &stats.checkpoints_by_id_reuse,
                        };
                        by.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    // The counters stay, so the same trigger is due again: after a pause, not
                    // at once, as a full disk rarely clears in 50 ms.
                    Err(e) if inner.fenced.load(std::sync::atomic::Ordering::Acquire) => {
                        tracing::info!("background checkpoint ({why:?}) stopped short by a fence: {e}");
                        return;
                    }
                    Err(e) => {
                        tracing::error!("background checkpoint ({why:?}) failed: {e}");
                        retry_at = Some(Instant::now() + CHECKPOINT_RETRY_AFTER);
                    }
                }
                since = started;
            }
        })
    }

    /// Flushes what was appended, stops the flushers. Commits after this fail.
    pub fn close(&self) {
        self.inner.logger.shutdown();
    }

    /// Closes the log and stops a checkpoint under way short (it leaves nothing behind, as
    /// after a full disk), waiting for it to end; no checkpoint is written after this. From
    /// its return nothing of this database writes its directory: a switchover's old primary
    /// is fenced so, and its node then reads what its log holds (a checkpoint that went on
    /// would delete segments under that read).
    pub fn fence(&self) {
        self.inner.fenced.store(true, std::sync::atomic::Ordering::Release);
        self.close();
        drop(self.checkpoint_turn());
    }

    /// Closes the log, waits for a checkpoint under way to end, and gives up the data
    /// directory's lock though other handles to this database remain: a switchover's old
    /// primary that follows the new one in place seals the directory and opens it as a
    /// backup's. The engine's log is detached (`Database::detach_log`), so that another may
    /// be attached if it is promoted in place later. No checkpoint is written after this
    /// (`checkpoint` refuses).
    pub fn close_and_release(&self) {
        self.close();
        let _turn = self.checkpoint_turn();
        // The engine lives on without this log (a backup's, until a log is attached again).
        self.inner.db.detach_log();
        drop(self.inner.lock.lock().take());
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.logger.shutdown();
    }
}
