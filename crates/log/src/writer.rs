//! Group commit
//! ============
//! Each worker appends its committed write sets to its own stream buffer (no global log
//! latch); each stream has a flusher thread that frames the buffer as one batch, writes it
//! to the stream's current segment and, depending on the durability, fsyncs it. One fsync
//! covers the whole batch.
//!
//! ```text
//!  worker w --append(ts, writes)--> buffer[w] --flusher[w]: bound = clock.stream_bound(w)
//!                                                          take buffer, frame, write, fsync
//!                                                          durable[w] = max(durable[w], bound)
//!  watermark = min over w of durable[w]   -->  commits with ts <= watermark are released
//! ```
//!
//! The bound is read *before* the buffer is taken, so every transaction of the stream at or
//! below it is in this batch or an earlier one; the batch's last transaction is such a bound
//! too (one worker per stream commits in timestamp order), and the larger of the two is used.
//! It is written into the batch header, so recovery can recompute the same watermark from
//! the disk (Rolis 3.3).
//!
//! Idle streams and the floor
//! --------------------------
//! The minimum alone would make every stream write and fsync something for every commit
//! anywhere: an idle stream's bound must pass a commit before the commit is released.
//! Instead, each batch also vouches for the other streams. When the flusher of stream w
//! frames a batch, it looks at every other stream v:
//!
//! ```text
//!  b = clock.stream_bound(v)            read first: v's commits <= b are appended by now
//!  appended[v] <= durable[v]?           then they are all durable:  vouch[v] = max(durable[v], b)
//!                 otherwise                                          vouch[v] = durable[v]
//!  floor = min(this batch's bound, every vouch[v])      written into the batch header
//!  after this batch's fsync: watermark = max(min over v of durable[v], every floor made durable)
//! ```
//!
//! So a commit on a busy stream is released by its own batch's fsync while the other
//! streams sleep: one fsync per group of commits, not one per stream. The floor is a fact
//! about the disk (every transaction of every stream at or below it was durable once this
//! batch was), so recovery takes the largest floor it finds as well. A floor is dragged
//! down by a stream that was mid-batch when it was framed; so a stream that has just made
//! a batch durable checks whether it owes a *heartbeat* (a batch with no transactions):
//! whether some stream's durable bound is past the watermark and a floor framed now would
//! lift it. If not, a stream still mid-batch holds it back and will ask the same when it
//! is done; the last to finish finds every stream vouchable. Idle streams never write
//! (but for a check at their idle timeout, a safety net).
//!
//! With `Durability::Interval(d)` a stream starts at most one batch per `d`: under load its
//! batches are `d` apart, but a commit to a stream that wrote nothing for `d` goes out at
//! once (it used to wait for the next tick of a fixed timer). With a shipping tap (a
//! primary with backups) whose commit policy waits for no fsync here
//! (`Logger::ship_at_commit_pace`), the batches are framed and shipped as commits come, and
//! the disk thread keeps the pace instead: at most one write and fsync per `d`, of
//! everything framed meanwhile (and at once at the close). Such a release then waits for
//! no interval to be framed (before 2026-11-29 each waited up to `d`), but with more than
//! one stream it may still wait for another stream's write: a batch vouches for another
//! stream only once that stream's appends are durable here (the floor, above). So the
//! disk thread keeps the pace only while its stream keeps framing batches, and writes a
//! stream that has been quiet for `PACE_QUIET` (1 ms) at once.
//!
//! Flushing before sleeping
//! ------------------------
//! With a shipping tap and every-batch durability (or batches framed as commits come), a
//! thread that runs many connections' commits (a server's runtime thread) need not wake
//! the flusher at all: its appends are
//! deferred, and it frames, ships and queues every stream it appended to when it is about
//! to park (`flush_before_sleeping`; Redis's `beforeSleep`). A turn of the flush
//! (`flush_once`) runs under the stream's flush lock, on the flusher or on such a thread,
//! so batches still leave one at a time, in order; the disk thread still writes them. A
//! thread that deferred and does not sleep flushes at the end of its first commit past
//! `DEFER_TIME_MAX` (`Logger::committed`, once the commit's locks are let go); a thread
//! that commits back to back (a benchmark's worker) may defer from its start
//! (`defer_flushes`) and so ship its own batches, `DEFER_TIME_MAX` apart. The flusher
//! looks at its buffer every `HEARTBEAT_EVERY` anyway, but while the whole
//! log is quiet (nothing appended for `DOZE_AFTER`, nothing owed or on its way to disk): it
//! then dozes, up to `DOZE_MAX`, and the next append to its stream wakes it (`Logger::doze`).
//!
//! Invariants: durable[w] and the floor only grow; floor <= bound in every batch; the
//! watermark is at most max(min over w of durable[w], the largest durable floor), the cut
//! recovery recomputes from the disk; a commit is acknowledged only if its ts <= watermark;
//! after the first write or fsync error the log is failed for good: nothing more is
//! acknowledged and commits are refused.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ditto_engine::{CommitClock, CommitLog, Error, LoggedWrite, TableId, Ts, WorkerId};
use parking_lot::{Condvar, Mutex};

use crate::catalog::Catalog;
use crate::format::{BatchBuilder, Epoch, SegmentHeader, StreamId, SEGMENT_HEADER_LEN};
use crate::options::{Durability, LogOptions};
use crate::storage::{LogFile, Storage};

/// How often an idle flusher checks whether it owes a heartbeat (EveryBatch mode, or
/// batches framed as commits come; with an interval otherwise, every interval): a safety
/// net, since a flusher asks right after each of its batches (see `owes_heartbeat`). It
/// also takes then what a thread that deferred its flush left in the buffer
/// (`flush_before_sleeping`).
const HEARTBEAT_EVERY: Duration = Duration::from_millis(1);

/// A flusher whose stream has seen no append for this long dozes while the whole log is
/// quiet (`Logger::doze`): an idle server's flushers no longer wake a thousand times a
/// second each.
const DOZE_AFTER: Duration = Duration::from_millis(50);
/// The longest a dozing flusher sleeps (a safety net; an append wakes it).
const DOZE_MAX: Duration = Duration::from_secs(1);

/// After a batch that LZ4 did not shrink by at least 1/8, this many batches are stored
/// without trying (incompressible values, such as YCSB's random bytes, would otherwise pay
/// for compression and gain nothing); then the flusher tries again.
const COMPRESS_SKIP_BATCHES: u32 = 32;

/// How far a segment is zeroed ahead of small batches (never past the segment's size limit
/// unless one batch goes past it). Appending to a file makes every fsync persist the new
/// size and allocate and map new blocks; overwriting zeros that are already on disk does
/// not. But the zeros are written too, and the fsync after an extension carries them, so
/// the step is kept small: 256 KiB makes that fsync about 1 ms on this project's disk where
/// 4 MiB made it 5-40 ms (`docs/durability.md` has the figures).
const ZERO_AHEAD: u64 = 256 << 10;

/// Batches larger than this are appended, not zeroed ahead of: writing as many zeros again
/// costs more than the block allocation it saves (`docs/durability.md`).
const ZERO_BATCH_MAX: u64 = 64 << 10;

/// A flusher keeps buffers (the stream's two batch builders, the framed batch, the direct
/// I/O staging) up to this size between batches; one grown past it by a large batch (up to
/// 128 MiB, the largest transaction) is let go after that batch, so one large write does
/// not pin four times its size per stream for good. Batches this large are rare enough
/// that allocating their buffers anew costs nothing that shows.
const BUFFER_KEEP_MAX: usize = 1 << 20;

/// Appended to a segment's file name while its header is written (`Logger::open_segment`).
pub(crate) const UNFINISHED_SUFFIX: &str = ".new";

/// A closed segment: once a checkpoint covers `last_ts`, it can be deleted.
#[derive(Debug, Clone)]
pub(crate) struct ClosedSegment {
    pub path: PathBuf,
    /// The highest transaction ts *or bound* the segment holds. A bound counts: recovery
    /// takes each stream's highest durable bound, and a deleted segment's bound above the
    /// checkpoint could be what released a commit of another stream that the checkpoint
    /// does not hold.
    pub last_ts: Ts,
}

/// A flusher's batches framed and not yet on disk, for its disk thread. With a shipping
/// tap, the flusher frames a batch, hands it to the tap and queues it here, then frames the
/// next at once; the disk thread writes what is queued (back to back, in one write),
/// fsyncs it and publishes it exactly as the flusher does inline: the floor, the durable
/// bound, the watermark. So what a floor means, and what recovery finds, do not change;
/// only the flusher waits for neither the write nor the fsync, and backups receive batches
/// at the pace of commits, not of this disk (a `received` commit policy waits for no
/// disk here at all, and a write that stalls for a moment stalls no shipping). At most
/// `AHEAD_BYTES_MAX` wait here; past it the flusher waits for the disk. The log closes
/// only once the disk thread has written and synced everything queued.
#[derive(Default)]
struct WriteAhead {
    state: Mutex<AheadState>,
    cv: Condvar,
}

#[derive(Default)]
struct AheadState {
    /// Framed batches not yet written, back to back, and the largest bound and floor of any
    /// batch queued so far (both only grow).
    frames: Vec<u8>,
    bound: Ts,
    floor: Ts,
    /// The disk thread is writing or syncing what it took.
    busy: bool,
    /// The disk thread keeps an interval's pace: a queued batch does not wake it (it
    /// wakes at the interval's end, or once `queued_at` is `PACE_QUIET` old), unless
    /// `AHEAD_BYTES_MAX` is queued. Before 2026-12-04 every batch woke it, to go back to
    /// sleep at once: under SET without pipelining and `interval` durability, 0.08 wake-ups
    /// and 1.0 us of CPU per SET per disk thread, against 0.03 and 0.4 now.
    pacing: bool,
    /// When the last batch was queued.
    queued_at: Option<Instant>,
    /// A batch other than a vouch is queued (`Logger::owes_vouch`): the next write is
    /// fsynced. A write of vouches alone is not, nor published.
    sync_owed: bool,
    stop: bool,
}

/// A disk thread that keeps an interval's pace (`disk_thread`) writes at once once its
/// stream has framed nothing for this long: the stream is quiet, and another stream's
/// commits may wait for its durability (a batch's floor vouches for a stream only once
/// what it appended is durable), so a connection whose commits move between runtime
/// threads, or a thread that parks with all its connections waiting, is not held for
/// the whole interval.
const PACE_QUIET: Duration = Duration::from_millis(1);

/// The longest durability interval a log takes (`Logger::start`).
const INTERVAL_MAX: Duration = Duration::from_secs(3600);

/// A flusher paced by its interval sleeps in steps of at most this, looking at the close
/// and a failure between (`flush_loop`).
const PACE_STEP: Duration = Duration::from_millis(20);

/// Framed batches waiting for the disk thread at most (per stream): a disk that stalls
/// holds the flusher back once this much is queued, so memory stays bounded.
const AHEAD_BYTES_MAX: usize = 32 << 20;

/// A stream's open segment and where its writes stand; the flusher's while it writes
/// inline, the disk thread's once batches are written ahead.
struct Segment {
    file: Box<dyn LogFile>,
    seq: u64,
    path: PathBuf,
    /// The write position (the header included); the file holds zeros up to `zeroed`
    /// (see `ZERO_AHEAD`).
    end: u64,
    zeroed: u64,
    /// The highest bound written to this segment.
    last_ts: Ts,
}

impl Segment {
    fn new((file, seq, path): (Box<dyn LogFile>, u64, PathBuf)) -> Segment {
        let end = SEGMENT_HEADER_LEN as u64;
        Segment { file, seq, path, end, zeroed: end, last_ts: Ts::ZERO }
    }
}
struct Stream {
    buf: Mutex<BatchBuilder>,
    /// What the stream's flushes carry from one batch to the next; held while a batch is
    /// framed, shipped and queued, by the flusher or by a server thread flushing before it
    /// sleeps (`flush_deferred`), so batches go out one at a time, in order.
    flush: Mutex<FlushState>,
    /// The largest bound framed so far (`FlushState::written_bound`, readable without
    /// the flush lock, for the flusher's wait under the buffer's lock).
    written: AtomicU64,
    /// The largest floor framed so far, durable or not (`owes_heartbeat`).
    framed_floor: AtomicU64,
    /// Batches framed and not yet on disk, for the disk thread.
    ahead: WriteAhead,
    /// Signalled when a worker appends (the flusher waits).
    cv: Condvar,
    /// The buffer passed `stream_buffer_bytes_max` at an append (set by the stream's
    /// worker, under `buf`; cleared when a flush takes the buffer): `reserve` takes the
    /// buffer's lock only then, so a commit pays one load for the check, not a lock.
    full: AtomicBool,
    /// Signalled when a flush takes the buffer (a worker under backpressure waits). Apart
    /// from `cv`, so a flush made off the flusher thread does not wake the flusher.
    space: Condvar,
    durable: AtomicU64,
    /// The largest bound of this epoch's batches that an fsync made durable (0 before the
    /// first, and always without fsyncs): each batch framed claims it (`synced_ts`), so
    /// that recovery can tell a write torn out of order from damage (`format::damaged_end`).
    synced: AtomicU64,
    /// The largest `synced` a framed batch claimed. Below `synced`, the stream's last
    /// synced write is vouched for by no batch after it, and damage to it would read as a
    /// torn write: a quiet stream, and a closing one, frame an empty batch that claims it
    /// (`owes_vouch`).
    vouched: AtomicU64,
    /// The ts of the last transaction appended (stored before its committer leaves its
    /// commit slot). Every appended transaction is durable once `durable` reaches it.
    appended: AtomicU64,
    closed: Mutex<Vec<ClosedSegment>>,
    /// Its flusher dozes (`Logger::doze`): set under `buf`'s lock by the flusher, and
    /// cleared under it by the flusher or by an append that wakes it (`append`).
    dozing: AtomicBool,
}

/// See `Stream::flush`.
struct FlushState {
    /// The buffer swapped in for the stream's appends while a batch is framed from the other.
    spare: BatchBuilder,
    frame: Vec<u8>,
    written_bound: Ts,
    compress_skip: u32,
}

/// What one turn of a stream's flush did.
enum Flushed {
    Batch,
    /// An empty batch vouching for the last synced write (`owes_vouch`): it starts no
    /// interval, so the next commit goes out at once as after any quiet spell.
    Vouch,
    Nothing,
    /// The log failed, or closed: the flusher stops.
    Closed,
}

/// Counters for reports and metrics.
#[derive(Default, Debug)]
pub struct LogStats {
    pub bytes_written: AtomicU64,
    pub batches: AtomicU64,
    pub fsyncs: AtomicU64,
    pub fsync_ns_total: AtomicU64,
    /// The slowest fsync so far: stalls of the disk show here, and in commit latency.
    pub fsync_ns_max: AtomicU64,
    /// Batches stored without trying LZ4 because recent ones did not shrink.
    pub compress_skipped: AtomicU64,
    pub txns: AtomicU64,
    /// Batches with no transactions, written only to move the watermark (see the module
    /// notes: most idle streams are vouched for by the busy ones instead).
    pub heartbeats: AtomicU64,
    /// Empty batches framed only to vouch for a quiet or closing stream's last synced
    /// write (`Logger::owes_vouch`); not counted as heartbeats.
    pub vouches: AtomicU64,
    /// Online checkpoints completed, and those that failed (a full disk, a failed fsync:
    /// the log goes on, and the previous checkpoint stays; see `Durable::checkpoint`).
    pub checkpoints: AtomicU64,
    pub checkpoint_failures: AtomicU64,
    /// The CPU time online checkpoints took to write, in nanoseconds, summed over their
    /// threads, failed attempts' too, counted as it is spent (a part writer's after each
    /// task; `checkpoint::write`).
    pub checkpoint_cpu_ns: AtomicU64,
    /// The background checkpointer's completed checkpoints by trigger
    /// (`CheckpointPolicy`); checkpoints asked for directly count in none.
    pub checkpoints_by_time: AtomicU64,
    pub checkpoints_by_log_growth: AtomicU64,
    pub checkpoints_by_id_reuse: AtomicU64,
    /// Covered segments a checkpoint failed to delete (they are tried again by the next).
    pub segment_delete_failures: AtomicU64,
    /// Times a flusher dozed, the whole log quiet (`Logger::doze`).
    pub flusher_dozes: AtomicU64,
}

/// Told, on a flusher thread, each time the watermark moves (with the new watermark), and
/// when the log fails (with the reason), on the thread that failed it. It must not block:
/// it runs between a stream's fsync and its next batch. Calls from different streams may
/// arrive out of order, so a listener keeps the largest watermark it has seen; a failure
/// that races with `set_progress_listener` may be told twice, so a listener keeps the first.
pub type ProgressListener = Box<dyn Fn(Ts, Option<&Arc<str>>) + Send + Sync>;

/// Sees every batch as it is framed (but a vouch, `Logger::owes_vouch`, which is for this
/// log's reader alone), before it is written (the replication layer ships it
/// from here, so shipping overlaps the local write and fsync), and every table created.
/// Calls come on the stream's flusher, or (for `batch`) on a thread flushing what it
/// deferred (`flush_before_sleeping`: a server's runtime thread about to park), and must
/// not block: a tap that cannot keep up drops its receiver, it never holds the flusher. A batch is told before its
/// stream's durable bound moves, so a batch whose floor vouches for another stream's batch
/// is always told after that batch (the order backups rely on, crates/log/src/replica.rs).
pub trait ShipTap: Send + Sync {
    /// `at_once`: the batch was flushed off the flusher, by a thread whose commits wait for
    /// it (about to park, `flush_before_sleeping`, or to wait for durability): it is best sent now, on this thread. Otherwise (the
    /// flusher's batches, back to back under load) a sender that gathers several batches
    /// into one write costs less.
    fn batch(&self, header: &crate::format::BatchHeader, frame: &[u8], at_once: bool);
    fn table_created(&self, id: TableId, name: &str);
}

pub struct Logger {
    /// This logger, for the threads that defer its flushes (`flush_before_sleeping`).
    me: std::sync::Weak<Logger>,
    dir: PathBuf,
    epoch: Epoch,
    opts: LogOptions,
    clock: Arc<CommitClock>,
    streams: Box<[Stream]>,
    /// The largest floor of a durable batch (see the module notes).
    floor: AtomicU64,
    watermark: AtomicU64,
    failed: OnceLock<Arc<str>>,
    wait_lock: Mutex<()>,
    wait_cv: Condvar,
    listener: OnceLock<ProgressListener>,
    tap: OnceLock<Arc<dyn ShipTap>>,
    /// With a tap and an interval: batches are framed and shipped as commits come, and the
    /// disk thread keeps the interval (`ship_at_commit_pace`).
    eager: AtomicBool,
    shutdown: AtomicBool,
    /// Shut down and every flusher and disk thread ended: nothing appended now is ever
    /// made durable, and a wait for it fails (`wait_durable`).
    flushers_ended: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    catalog: Mutex<Catalog>,
    pub stats: LogStats,
}

/// Creates the segment `header` names in `dir`'s log, open for appending after its
/// header. A file with a segment's name always holds its whole header, durably: the header
/// is written and synced under the name plus `.new` (`UNFINISHED_SUFFIX`), which is then
/// renamed. A crash in between leaves a `.new` file, which recovery removes; without it, a
/// crash between creating the file and syncing its header left a segment with no header,
/// which recovery must refuse as damage. (The writer's, and a last resort's fetched
/// batches: `recovery::append_own_fetched`.)
pub(crate) fn create_segment(
    storage: &dyn Storage,
    dir: &Path,
    header: &SegmentHeader,
    direct: bool,
) -> std::io::Result<(Box<dyn LogFile>, PathBuf)> {
    let path = Logger::segment_path(dir, header.stream.0 as usize, header.epoch, header.seq);
    let mut unfinished = path.clone().into_os_string();
    unfinished.push(UNFINISHED_SUFFIX);
    let unfinished = PathBuf::from(unfinished);
    let mut f = storage.create_segment(&unfinished, direct)?;
    f.write_all(&header.encode())?;
    f.sync()?;
    storage.rename(&unfinished, &path)?;
    storage.sync_dir(&dir.join("log"))?;
    Ok((f, path))
}

impl Logger {
    /// Starts one flusher per stream, each with a fresh segment of `epoch` whose header
    /// names `base`, the checkpoint the epoch's log stands on (`SegmentHeader::prev_ts`).
    pub(crate) fn start(
        dir: &Path,
        epoch: Epoch,
        mut opts: LogOptions,
        clock: Arc<CommitClock>,
        catalog: Catalog,
        durable_from: Ts,
        base: Ts,
    ) -> std::io::Result<Arc<Logger>> {
        // A zero interval spun every flusher at full CPU, and one past `Instant`'s range
        // panicked a flusher (the server's configuration refuses both; a library user was
        // not told).
        if let Some(d) = opts.durability.interval().filter(|d| d.is_zero() || *d > INTERVAL_MAX) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a log's durability interval must be above zero and at most an hour, not {d:?}"),
            ));
        }
        // (Bounded so that one more transaction, at most TXN_BYTES_MAX, always fits a batch.)
        opts.stream_buffer_bytes_max =
            opts.stream_buffer_bytes_max.min(crate::format::MAX_RAW_LEN - ditto_engine::TXN_BYTES_MAX);
        let n = clock.workers();
        let streams = (0..n)
            .map(|_| Stream {
                buf: Mutex::new(BatchBuilder::new()),
                flush: Mutex::new(FlushState {
                    spare: BatchBuilder::new(),
                    frame: Vec::new(),
                    written_bound: durable_from,
                    compress_skip: 0,
                }),
                written: AtomicU64::new(durable_from.0),
                framed_floor: AtomicU64::new(durable_from.0),
                ahead: WriteAhead::default(),
                cv: Condvar::new(),
                full: AtomicBool::new(false),
                space: Condvar::new(),
                durable: AtomicU64::new(durable_from.0),
                synced: AtomicU64::new(0),
                vouched: AtomicU64::new(0),
                appended: AtomicU64::new(durable_from.0),
                closed: Mutex::new(Vec::new()),
                dozing: AtomicBool::new(false),
            })
            .collect();
        let logger = Arc::new_cyclic(|me| Logger {
            me: me.clone(),
            dir: dir.to_path_buf(),
            epoch,
            opts,
            clock,
            streams,
            floor: AtomicU64::new(durable_from.0),
            watermark: AtomicU64::new(durable_from.0),
            failed: OnceLock::new(),
            wait_lock: Mutex::new(()),
            wait_cv: Condvar::new(),
            listener: OnceLock::new(),
            tap: OnceLock::new(),
            eager: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            flushers_ended: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            catalog: Mutex::new(catalog),
            stats: LogStats::default(),
        });
        let mut files = Vec::with_capacity(n);
        for w in 0..n {
            files.push(logger.open_segment(w, 1, base)?);
        }
        for (w, file) in files.into_iter().enumerate() {
            let l = Arc::clone(&logger);
            match std::thread::Builder::new().name(format!("ditto-log-{w}")).spawn(move || l.flusher(w, file)) {
                Ok(h) => logger.threads.lock().push(h),
                // The flushers started end (each held the logger and its segment for the
                // process's life; found by a review).
                Err(e) => {
                    logger.shutdown();
                    return Err(e);
                }
            }
        }
        Ok(logger)
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    pub fn durability(&self) -> Durability {
        self.opts.durability
    }

    /// Every commit at or below this timestamp is durable.
    pub fn watermark(&self) -> Ts {
        Ts(self.watermark.load(Ordering::Acquire))
    }

    pub fn failure(&self) -> Option<Arc<str>> {
        self.failed.get().cloned()
    }

    pub(crate) fn segment_path(dir: &Path, stream: usize, epoch: Epoch, seq: u64) -> PathBuf {
        dir.join("log").join(format!("stream-{stream:04}-e{:010}-s{seq:010}.seg", epoch.0))
    }

    /// Creates segment `seq` of stream `w` (`create_segment`); `prev_ts` is the highest
    /// timestamp in the stream's earlier segments of this epoch (see
    /// `SegmentHeader::prev_ts`).
    fn open_segment(&self, w: usize, seq: u64, prev_ts: Ts) -> std::io::Result<(Box<dyn LogFile>, u64, PathBuf)> {
        let header = SegmentHeader {
            stream: StreamId(w as u32),
            epoch: self.epoch,
            seq,
            streams: self.streams.len() as u32,
            prev_ts,
        };
        let (f, path) = create_segment(&*self.opts.storage, &self.dir, &header, self.opts.direct_io)?;
        Ok((f, seq, path))
    }

    fn fail(&self, what: String) {
        // Only the first failure is the log's reason, and only it is reported (last: a
        // listener that panics, as one may that a log thread's panic came from, leaves
        // every waiter woken all the same). Set before anything else, the log line too:
        // until it is, another thread may frame and ship (found by a review, 2026-12-06).
        let line = format!("log failed, writes stopped: {what}");
        let first = self.failed.set(what.into()).is_ok();
        tracing::error!("{line}");
        {
            let _g = self.wait_lock.lock();
            self.wait_cv.notify_all();
        }
        for s in self.streams.iter() {
            // Under the buffer's lock: a flusher about to doze looks at the failure under it.
            let _g = s.buf.lock();
            s.cv.notify_all();
            s.space.notify_all();
        }
        if first {
            if let (Some(f), Some(why)) = (self.listener.get(), self.failed.get()) {
                f(self.watermark(), Some(why));
            }
        }
    }

    /// The log is closing or has failed: a flusher stops waiting, pacing and dozing.
    fn ending(&self) -> bool {
        self.shutdown.load(Ordering::Acquire) || self.failed.get().is_some()
    }

    /// Runs `body`, a log thread's (`what`); a panic in it is the log's failure. Before
    /// 2026-12-03 a panicking flusher or disk thread left the log open with a stream that
    /// never became durable again: the watermark stopped below its next batch, every commit
    /// waited for good, its worker blocked in `append` once its buffer filled, and a close
    /// waited for the flusher's scope for ever (found by a review).
    fn failing_on_panic(&self, what: impl FnOnce() -> String, body: impl FnOnce()) {
        if let Err(msg) = ditto_engine::catch_panic(body) {
            // (A listener that panics again here is the log's last word: the failure is
            // set and every waiter woken before it is called.)
            let _ = ditto_engine::catch_panic(|| self.fail(format!("{} panicked: {msg}", what())));
        }
    }

    /// Stream `w`'s flusher thread, with its disk thread beside it (see `WriteAhead`).
    fn flusher(&self, w: usize, first: (Box<dyn LogFile>, u64, PathBuf)) {
        crate::sched::commit_thread();
        let ahead = &self.streams[w].ahead;
        let seg = Mutex::new(Segment::new(first));
        std::thread::scope(|sc| {
            let disk = std::thread::Builder::new().name(format!("ditto-disk-{w}")).spawn_scoped(sc, || {
                self.failing_on_panic(
                    || format!("the disk thread of log stream {w}"),
                    || self.disk_thread(w, &seg, ahead),
                )
            });
            // (Failed to start, the log fails: before, the flusher panicked, and its stream
            // never became durable again, the log still taking commits.)
            let disk = match disk {
                Ok(d) => d,
                Err(e) => return self.fail(format!("starting the disk thread of log stream {w}: {e}")),
            };
            self.failing_on_panic(|| format!("the flusher of log stream {w}"), || self.flush_loop(w, &seg, ahead));
            ahead.state.lock().stop = true;
            ahead.cv.notify_all();
            let _ = disk.join();
        });
    }

    /// Writes, fsyncs and publishes what stream `w`'s flusher queued (see `WriteAhead`),
    /// then closes a full segment.
    ///
    /// With an interval and batches framed as commits come (`Logger::ship_at_commit_pace`),
    /// it writes (and syncs) at most once per interval: what is framed meanwhile, shipped
    /// already, waits and goes in one write, unless the log closes or `AHEAD_BYTES_MAX` is
    /// queued. A `received` commit policy then waits for no fsync and no interval, where
    /// pacing the flusher would hold every batch, and so every release, up to an interval
    /// before it is shipped.
    fn disk_thread(&self, w: usize, seg: &Mutex<Segment>, ahead: &WriteAhead) {
        crate::sched::commit_thread();
        let stream = &self.streams[w];
        let fsync = !matches!(self.opts.durability, Durability::NoSync(_));
        let interval = self.opts.durability.interval();
        // When the last write began.
        let mut last_start: Option<Instant> = None;
        let mut frames = Vec::new();
        loop {
            let (bound, floor, sync_owed) = {
                let mut st = ahead.state.lock();
                while st.frames.is_empty() && !st.stop {
                    ahead.cv.wait(&mut st);
                }
                if let (Some(d), Some(t), true) = (interval, last_start, self.eager()) {
                    let next = t + d;
                    // Waits while batches keep coming: a stream that has framed nothing
                    // for `PACE_QUIET` is written at once, since its durability may be
                    // what another stream's release waits for (the floor).
                    // (Batches queued meanwhile do not wake it: `AheadState::pacing`.)
                    st.pacing = true;
                    while !st.stop
                        && !self.shutdown.load(Ordering::Acquire)
                        && st.frames.len() < AHEAD_BYTES_MAX
                        && self.failed.get().is_none()
                    {
                        let now = Instant::now();
                        let quiet = st.queued_at.map_or(now, |q| q + PACE_QUIET);
                        if now >= next || now >= quiet {
                            break;
                        }
                        ahead.cv.wait_for(&mut st, next.min(quiet) - now);
                    }
                    st.pacing = false;
                }
                if st.frames.is_empty() || self.failed.get().is_some() {
                    st.frames.clear();
                    return;
                }
                std::mem::swap(&mut st.frames, &mut frames);
                st.busy = true;
                // (A write of vouches alone starts no interval, as on the flusher.)
                if st.sync_owed {
                    last_start = Some(Instant::now());
                }
                // A flusher held back by `AHEAD_BYTES_MAX` goes on.
                ahead.cv.notify_all();
                (st.bound, st.floor, std::mem::take(&mut st.sync_owed))
            };
            let done = self.write_batches(w, &mut seg.lock(), &frames, bound, floor, fsync, !sync_owed);
            frames.clear();
            if frames.capacity() > BUFFER_KEEP_MAX {
                frames = Vec::new();
            }
            // The failure first: a flusher draining for a close that saw the queue idle
            // before it trimmed and synced the same segment again, an fsync retried after
            // one failed (found by a review).
            let failed = match done {
                Err(e) => {
                    self.fail(e);
                    true
                }
                Ok(()) => false,
            };
            {
                let mut st = ahead.state.lock();
                st.busy = false;
                ahead.cv.notify_all();
            }
            if failed {
                return;
            }
            // The flusher asks again whether it owes a heartbeat, if it may (it also asks
            // at its idle timeout).
            if self.owes(w, Ts(stream.written.load(Ordering::Acquire))) {
                let _g = stream.buf.lock();
                stream.cv.notify_all();
            }
        }
    }

    /// Writes framed batches (one or more, back to back; `bound` and `floor` the largest
    /// of theirs) to stream `w`'s segment, fsyncs them (with `fsync`), publishes them, and
    /// closes the segment if it is full. An error is the log's failure. With `vouches`
    /// (the frames are vouches alone, `owes_vouch`) nothing is fsynced or published: a
    /// vouch moves no bound, and is made durable by the stream's next fsync (its next
    /// commit, the close, or a full segment's trim), so a stream committing less often
    /// than `DOZE_AFTER` pays one fsync per commit, not two (2026-12-05). One a power cut
    /// loses before then is as if never framed: damage to the write it vouched for,
    /// outside the disk model, reads as a torn write again.
    #[allow(clippy::too_many_arguments)]
    fn write_batches(
        &self,
        w: usize,
        seg: &mut Segment,
        frames: &[u8],
        bound: Ts,
        floor: Ts,
        fsync: bool,
        vouches: bool,
    ) -> Result<(), String> {
        let end = seg.end + frames.len() as u64;
        if end > seg.zeroed && frames.len() as u64 <= ZERO_BATCH_MAX {
            seg.zeroed =
                (end + ZERO_AHEAD).min(end.max(self.opts.segment_bytes_max.min(crate::options::SEGMENT_BYTES_LIMIT)));
            seg.file.extend_zeroed(seg.zeroed).map_err(|e| format!("write to {}: {e}", seg.path.display()))?;
        }
        // A large batch written past the zeros appends; the file ends at the batch.
        seg.zeroed = seg.zeroed.max(end);
        let start = seg.end;
        if let Err(e) = seg.file.write_all(frames) {
            return Err(Self::unwritten(seg, start, format!("write to {}: {e}", seg.path.display())));
        }
        seg.end = end;
        seg.last_ts = seg.last_ts.max(bound);
        if fsync && !vouches {
            let t0 = Instant::now();
            if let Err(e) = seg.file.sync() {
                return Err(Self::unwritten(seg, start, format!("fsync of {}: {e}", seg.path.display())));
            }
            self.count_fsync(t0);
            self.streams[w].synced.fetch_max(bound.0, Ordering::Release);
        }
        self.stats.bytes_written.fetch_add(frames.len() as u64, Ordering::Relaxed);
        if !vouches {
            self.publish_durable(&self.streams[w], bound, floor);
        }
        if seg.end < self.opts.segment_bytes_max.min(crate::options::SEGMENT_BYTES_LIMIT) {
            return Ok(());
        }
        // Only a stream's last segment may end in zeros (recovery refuses them in any
        // other): cut them before the next segment exists.
        seg.file
            .truncate(seg.end)
            .and_then(|()| seg.file.sync())
            .map_err(|e| format!("trimming {}: {e}", seg.path.display()))?;
        // The full segment may go (a checkpoint covering it) only once the next exists,
        // durably named: until then it is the stream's last, which recovery needs (offered
        // before, a checkpoint could delete it while the next failed to be created, or a
        // power cut came between, and every open refused the directory: a stream with no
        // segment; found by a review).
        let next = seg.seq + 1;
        let opened = self.open_segment(w, next, seg.last_ts).map_err(|e| {
            format!("opening segment {}: {e}", Self::segment_path(&self.dir, w, self.epoch, next).display())
        })?;
        self.streams[w].closed.lock().push(ClosedSegment { path: seg.path.clone(), last_ts: seg.last_ts });
        *seg = Segment::new(opened);
        Ok(())
    }

    /// A write or fsync of the batches from `start` failed (`why`, returned): the segment is
    /// cut back to `start`, what earlier fsyncs made durable. Left, the failed bytes stay
    /// in the page cache, and a later fsync through another descriptor (a holdings report,
    /// an open in the same boot) succeeds on them and counts them as held, though they may
    /// never reach the disk (the kernel reports a writeback error once; found by a
    /// review). If the cut fails too, the log has failed all the same; it is said.
    fn unwritten(seg: &mut Segment, start: u64, why: String) -> String {
        if let Err(e) = seg.file.truncate(start) {
            tracing::error!("{}: cutting the failed write back to offset {start}: {e}", seg.path.display());
        }
        (seg.end, seg.zeroed) = (start, start);
        why
    }

    /// An fsync that began at `t0` ended: the figures.
    fn count_fsync(&self, t0: Instant) {
        let ns = t0.elapsed().as_nanos() as u64;
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.stats.fsync_ns_total.fetch_add(ns, Ordering::Relaxed);
        self.stats.fsync_ns_max.fetch_max(ns, Ordering::Relaxed);
    }

    /// A batch with `bound` and `floor` of `stream` is durable (its fsync returned, on the
    /// flusher or its disk thread). The floor first: whoever sees the new durable bound
    /// sees the floor with it (`durable_state`), so no stream mistakes the moment between
    /// for a lagging watermark and writes a heartbeat nobody needs.
    fn publish_durable(&self, stream: &Stream, bound: Ts, floor: Ts) {
        // Nothing more is acknowledged once the log has failed (the module notes): a
        // batch written by another stream's thread meanwhile is durable, and recovery
        // keeps it, but no waiter is told so (before 2026-12-05 the watermark still rose;
        // found by a review).
        if self.failed.get().is_some() {
            return;
        }
        // Sequentially consistent, with `durable_state`'s loads: two streams publishing at
        // once each store their own bound, then load the other's (the store-buffering
        // pattern); under acquire and release alone both may read the other's old bound,
        // and neither move the watermark to the new minimum (x86's locked operations and
        // ARMv8's release-then-acquire order happen to forbid it; a review, 2026-12-05).
        self.floor.fetch_max(floor.0, Ordering::SeqCst);
        stream.durable.fetch_max(bound.0, Ordering::SeqCst);
        self.advance_watermark();
    }

    /// Waits until everything queued for the disk thread is written and synced. False if
    /// the log failed.
    fn drain_ahead(&self, ahead: &WriteAhead) -> bool {
        let mut st = ahead.state.lock();
        while (!st.frames.is_empty() || st.busy) && self.failed.get().is_none() {
            ahead.cv.wait_for(&mut st, Duration::from_millis(10));
        }
        self.failed.get().is_none()
    }

    /// Queues a framed batch for the disk thread (see `WriteAhead`); waits while too much
    /// is queued. False if the log failed.
    fn queue_ahead(&self, ahead: &WriteAhead, frame: &mut Vec<u8>, bound: Ts, floor: Ts, vouch: bool) -> bool {
        let mut st = ahead.state.lock();
        while st.frames.len() >= AHEAD_BYTES_MAX && self.failed.get().is_none() {
            ahead.cv.wait_for(&mut st, Duration::from_millis(10));
        }
        if self.failed.get().is_some() {
            return false;
        }
        if st.frames.is_empty() {
            // The disk thread's emptied buffer comes back for the next batch.
            std::mem::swap(&mut st.frames, frame);
        } else {
            st.frames.extend_from_slice(frame);
        }
        st.bound = st.bound.max(bound);
        st.floor = st.floor.max(floor);
        st.sync_owed |= !vouch;
        // (Read only where an interval paces the disk thread: no clock read per batch else.)
        if self.opts.durability.interval().is_some() {
            st.queued_at = Some(Instant::now());
        }
        if !st.pacing || st.frames.len() >= AHEAD_BYTES_MAX {
            ahead.cv.notify_all();
        }
        true
    }

    fn flush_loop(&self, w: usize, seg: &Mutex<Segment>, ahead: &WriteAhead) {
        let stream = &self.streams[w];
        // When the last batch was started: with an interval, the next starts no sooner than
        // one interval later.
        let mut last_start: Option<Instant> = None;
        let interval = self.opts.durability.interval();
        // The last append this flusher saw, and since when it has seen no other.
        let (mut seen, mut still_since) = (stream.appended.load(Ordering::Acquire), Instant::now());
        loop {
            let stopping = self.shutdown.load(Ordering::Acquire);
            if self.failed.get().is_some() {
                return;
            }
            // A closing stream, and one quiet for `DOZE_AFTER`, vouch for their last synced
            // write (`owes_vouch`).
            let mut vouch = stopping && self.owes_vouch(w);
            // Wait for work: a commit (appends wake us, unless their thread flushes before
            // it sleeps), or, idle, the timeout; but not if we owe a heartbeat (checked
            // first, so right after each of our batches). A batch queued for the disk
            // thread and not yet synced will ask again once it is.
            if !stopping {
                let mut buf = stream.buf.lock();
                if buf.is_empty() && !self.owes(w, Ts(stream.written.load(Ordering::Acquire))) {
                    let now = stream.appended.load(Ordering::Acquire);
                    if now != seen {
                        (seen, still_since) = (now, Instant::now());
                    }
                    // (The close and a failure are looked at again under the lock they notify
                    // under: one between the look above and this wait was missed, and the
                    // close waited up to an interval, then the pacing below, for nothing.)
                    let still = still_since.elapsed() >= DOZE_AFTER;
                    if still && self.owes_vouch(w) {
                        vouch = true;
                    } else if !self.ending() && (!still || !self.doze(w, &mut buf)) {
                        let look = interval.filter(|_| !self.eager()).unwrap_or(HEARTBEAT_EVERY);
                        stream.cv.wait_for(&mut buf, look);
                    }
                }
            }
            // With an interval, at most one batch per interval: a commit to a stream that
            // wrote nothing for an interval goes out at once, under load batches are an
            // interval apart (and every commit of the interval shares one fsync). With a
            // tap the disk thread keeps that pace instead, and batches are framed and
            // shipped as commits come (`disk_thread`).
            if let (Some(d), false, false, false) = (interval, stopping, self.eager(), vouch) {
                // (In steps of at most `PACE_STEP`, the close or a failure looked at between:
                // a close waited out the whole interval, up to a minute. Not on the stream's
                // condition, which every append notifies.)
                if let Some(next) = last_start.map(|t| t + d) {
                    while let Some(wait) = next.checked_duration_since(Instant::now()).filter(|w| !w.is_zero()) {
                        if self.ending() {
                            break;
                        }
                        std::thread::sleep(wait.min(PACE_STEP));
                    }
                }
            }
            // (When the batch started, not when its write and fsync ended: batches an
            // interval apart, not an interval plus an fsync, as docs/durability.md says.)
            let started = Instant::now();
            // A panic while the batch is taken from the buffer (framing it, or in the
            // shipping tap) fails the log with the flush lock still held, as `flush_now`
            // does: let go first, a runtime thread's flush could take the next batch, whose
            // bound covers the lost one, and ship it or make it durable before the failure
            // was set (found by a review, 2026-12-06; a window of microseconds, mended by
            // reading: no test makes it).
            let mut st = stream.flush.lock();
            let mut flushed = None;
            self.failing_on_panic(
                || format!("the flusher of log stream {w}"),
                || flushed = Some(self.flush_once(w, &mut st, Some(seg), ahead, stopping, vouch)),
            );
            drop(st);
            match flushed {
                Some(Flushed::Batch) => last_start = Some(started),
                Some(Flushed::Vouch | Flushed::Nothing) => {}
                Some(Flushed::Closed) | None => return,
            }
        }
    }

    /// Dozes stream `w`'s flusher (the caller holds its buffer's lock, `buf`, empty) if the
    /// whole log is quiet: nothing appended or framed that is not durable, and the
    /// watermark at the top of every stream, so no stream owes a heartbeat. It then sleeps
    /// up to `DOZE_MAX` instead of looking every `HEARTBEAT_EVERY`. False if not quiet.
    ///
    /// What wakes it: an append to its stream (`append`: one that is left for its thread
    /// to flush clears `dozing`, and the flusher then looks again after `HEARTBEAT_EVERY`,
    /// as it would have without dozing, rather than take the batch from that thread; one
    /// that is not wakes it to flush at once), its disk thread finding that it owes a
    /// heartbeat, a flush that needs it (`flush_now`), the close or a failure. Other
    /// streams' appends need not wake it: their batches vouch for this idle stream, and a
    /// heartbeat is owed by a stream that has just made a batch durable (module notes),
    /// whose own disk thread wakes it; while any is owed, no flusher dozes.
    fn doze(&self, w: usize, buf: &mut parking_lot::MutexGuard<'_, BatchBuilder>) -> bool {
        let stream = &self.streams[w];
        let quiet = self.streams.iter().all(|s| {
            let d = s.durable.load(Ordering::Acquire);
            d >= s.appended.load(Ordering::Acquire) && d >= s.written.load(Ordering::Acquire)
        }) && {
            let (wm, top) = self.durable_state();
            wm >= top
        };
        // (The close and a failure notify under this lock: seen here, or they wake the wait.)
        if !quiet || self.ending() {
            return false;
        }
        self.stats.flusher_dozes.fetch_add(1, Ordering::Relaxed);
        stream.dozing.store(true, Ordering::Relaxed);
        stream.cv.wait_for(buf, DOZE_MAX);
        if !stream.dozing.swap(false, Ordering::Relaxed) && !self.shutdown.load(Ordering::Acquire) {
            // Woken by an append its thread flushes before it sleeps: looked at again
            // after the usual wait (an append that needs it, or the close, still wakes it).
            stream.cv.wait_for(buf, HEARTBEAT_EVERY);
        }
        true
    }

    /// Whether stream `w`'s last synced write is vouched for by no batch after it: no batch
    /// framed since its fsync claims it synced. Damage to it would then read as a torn
    /// write (`format::damaged_end`), and be cut at the next open where it should be
    /// refused; an empty batch claiming it is owed once the stream is quiet, and at its
    /// close. (A stream that goes on committing vouches with its next batch.)
    fn owes_vouch(&self, w: usize) -> bool {
        let s = &self.streams[w];
        s.synced.load(Ordering::Acquire) > s.vouched.load(Ordering::Acquire)
    }

    /// Whether stream `w`, having framed everything up to `written`, owes a heartbeat.
    fn owes(&self, w: usize, written: Ts) -> bool {
        written.0 <= self.streams[w].durable.load(Ordering::Acquire) && self.owes_heartbeat(w)
    }

    /// One turn of stream `w`'s flush: takes the buffer, frames it as one batch (or a
    /// heartbeat owed), and ships and queues it for the disk thread (with a tap), or writes
    /// and syncs it here (`seg`, without one). With `stopping`, an idle stream drains and
    /// closes its segment. With `vouch`, an idle stream that owes it frames an empty batch
    /// vouching for its last synced write (`owes_vouch`). The caller holds the stream's
    /// flush lock (`st`).
    fn flush_once(
        &self,
        w: usize,
        st: &mut FlushState,
        seg: Option<&Mutex<Segment>>,
        ahead: &WriteAhead,
        stopping: bool,
        vouch: bool,
    ) -> Flushed {
        // A failed log frames and ships nothing more: a turn that waited for the flush lock
        // while another thread's turn panicked with a batch it had taken (failing the log
        // before letting the lock go) would frame the commits appended since, and ship a
        // batch whose bound covers the lost one's: a backup would hold later commits of
        // the stream without the earlier ones (found by a review, 2026-12-05).
        if self.failed.get().is_some() {
            return Flushed::Closed;
        }
        let stream = &self.streams[w];
        let fsync = !matches!(self.opts.durability, Durability::NoSync(_));
        let bound = self.clock.stream_bound(w);
        {
            let mut buf = stream.buf.lock();
            std::mem::swap(&mut *buf, &mut st.spare);
            stream.full.store(false, Ordering::Relaxed);
            stream.space.notify_all();
        }
        // The batch's last transaction is a bound too: the stream's worker commits one
        // transaction at a time, in timestamp order, so every transaction of this stream
        // up to it is in this batch or an earlier one. It matters when an append wakes us
        // before its committer has left its commit slot: the clock's bound still stops
        // below that commit, which would then wait for the next batch.
        let bound = bound.max(st.spare.last_ts().unwrap_or(Ts::ZERO));
        // An idle stream writes a heartbeat it owes, or its last bound at close.
        let written_bound = st.written_bound;
        let idle =
            st.spare.is_empty() && !(stopping && bound > written_bound) && (stopping || !self.owes(w, written_bound));
        // The empty batch owed (`owes_vouch`), at the bound already written: once it is
        // synced, nothing more is owed.
        let vouching = idle && vouch && self.owes_vouch(w);
        if idle && !vouching {
            if stopping {
                let Some(seg) = seg else { return Flushed::Nothing };
                if !self.drain_ahead(ahead) {
                    return Flushed::Closed;
                }
                // The last write drained is vouched for before the close: the loop comes
                // back with `vouch`.
                if self.owes_vouch(w) {
                    return Flushed::Nothing;
                }
                // A clean close leaves no zeros past the last batch. Everything is
                // durable already but the last vouch, which this sync makes durable: if
                // it fails, recovery reads the zeros as the end, and the vouch may be
                // lost (the damage check on the last write, not data).
                let seg = &mut *seg.lock();
                if let Err(e) = seg.file.truncate(seg.end).and_then(|()| seg.file.sync()) {
                    tracing::warn!("trimming {} at close: {e}", seg.path.display());
                }
                return Flushed::Closed;
            }
            return Flushed::Nothing;
        }
        let bound = if vouching { written_bound } else { bound };
        st.frame.clear();
        // A vouch claims no floor: it is neither shipped nor published, so a floor of its
        // could lift this log's watermark once a later write's fsync published it, and
        // never the backups' (found by a review, 2026-12-05, night), and would stand in
        // `framed_floor` for a heartbeat owed.
        let floor = if vouching { Ts::ZERO } else { self.floor_for(w, bound) };
        stream.framed_floor.fetch_max(floor.0, Ordering::AcqRel);
        // Heartbeats (no transactions) neither try LZ4 nor count towards the skip.
        let has_txns = !st.spare.is_empty();
        let try_compress = self.opts.compress && has_txns && st.compress_skip == 0;
        // Read after the buffer was taken: at least what any transaction in it read when it
        // gave a record id a new life (`CommitClock::reuse_bound`). Unbounded only before
        // a log is attached, when nothing commits through one.
        let reuse = match self.clock.reuse_bound() {
            Ts(u64::MAX) => Ts::ZERO,
            r => r,
        };
        // (At most the bound: a bound framed at a close may lie below one written before.)
        let synced = Ts(stream.synced.load(Ordering::Acquire)).min(bound);
        stream.vouched.fetch_max(synced.0, Ordering::AcqRel);
        let marks = crate::format::Marks { bound_ts: bound, floor_ts: floor, reuse_ts: reuse, synced_ts: synced };
        let header = st.spare.finish_marked_into(StreamId(w as u32), self.epoch, marks, try_compress, &mut st.frame);
        if try_compress {
            if u64::from(header.stored_len) * 8 > u64::from(header.raw_len) * 7 {
                st.compress_skip = COMPRESS_SKIP_BATCHES;
            }
        } else if self.opts.compress && has_txns {
            st.compress_skip -= 1;
            self.stats.compress_skipped.fetch_add(1, Ordering::Relaxed);
        }
        debug_assert_eq!(header.bound_ts, bound);
        let txns = st.spare.txn_count() as u64;
        st.spare.clear_keeping(BUFFER_KEEP_MAX);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.txns.fetch_add(txns, Ordering::Relaxed);
        if vouching {
            self.stats.vouches.fetch_add(1, Ordering::Relaxed);
        } else if !has_txns {
            self.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
        }
        st.written_bound = written_bound.max(bound);
        stream.written.store(st.written_bound.0, Ordering::Release);
        // With a shipping tap, the batch is shipped now and written by the disk thread
        // (see `WriteAhead`); without one, this thread writes and fsyncs it.
        if let Some(tap) = self.tap.get() {
            // (Again: the log may have failed while this batch was framed.)
            if self.failed.get().is_some() {
                return Flushed::Closed;
            }
            // Only a flush off the flusher (`flush_now`) has no segment to write to. A
            // vouch is for this log's reader alone: not shipped (it moves no bound, and,
            // not fsynced, a backup holding it could hold more than this log after a
            // power cut).
            if !vouching {
                tap.batch(&header, &st.frame, seg.is_none());
            }
            if !self.queue_ahead(ahead, &mut st.frame, bound, floor, vouching) {
                return Flushed::Closed;
            }
        } else {
            let seg = seg.expect("a stream is flushed off its flusher thread only with a tap");
            if let Err(e) = self.write_batches(w, &mut seg.lock(), &st.frame, bound, floor, fsync, vouching) {
                self.fail(e);
                return Flushed::Closed;
            }
        }
        if st.frame.capacity() > BUFFER_KEEP_MAX {
            st.frame = Vec::new();
        }
        if vouching {
            Flushed::Vouch
        } else {
            Flushed::Batch
        }
    }

    /// The floor for a batch of stream `w` with bound `bound` (see the module notes).
    fn floor_for(&self, w: usize, bound: Ts) -> Ts {
        let mut floor = bound.0;
        for (v, s) in self.streams.iter().enumerate() {
            if v == w {
                continue;
            }
            // First the clock: every commit of stream v at or below `b` has been appended,
            // and its store of `appended` is visible to us (the clock's SeqCst loads of v's
            // commit slot synchronise with the store that left it). No lock is taken.
            let b = self.clock.stream_bound(v).0;
            let appended = s.appended.load(Ordering::Acquire);
            let durable = s.durable.load(Ordering::Acquire);
            // Everything v appended is durable, so every commit at or below `b` is.
            let vouch = if appended <= durable { durable.max(b) } else { durable };
            floor = floor.min(vouch);
        }
        Ts(floor)
    }

    /// Whether idle stream `w` owes a heartbeat: some stream made a bound durable that the
    /// watermark has not reached, and a batch `w` framed now would carry a floor above the
    /// watermark. Only the streams that finish a batch ask at once (the others when their
    /// idle timeout comes round). One that does not owe, after its batch, is held back by a
    /// stream that has not made its own batch durable yet, and that stream asks in turn when
    /// it has; the last to finish finds every stream vouchable. So no one is woken for it,
    /// and an idle stream that others vouch for never writes. Nor does one whose last batch
    /// already carries that floor and is not durable yet: framing it again would add
    /// nothing, and, since the disk thread publishes a floor only once it is synced, a
    /// stream would otherwise frame the same heartbeat again and again meanwhile.
    fn owes_heartbeat(&self, w: usize) -> bool {
        let (wm, top) = self.durable_state();
        if wm >= top {
            return false;
        }
        let floor = self.floor_for(w, self.clock.stream_bound(w)).0;
        floor > wm && floor > self.streams[w].framed_floor.load(Ordering::Acquire)
    }

    /// The watermark the durable bounds and floors make now (what `advance_watermark`
    /// publishes), and the highest durable bound of any stream. The bounds are read before
    /// the floor, which each flusher stores before its bound.
    fn durable_state(&self) -> (u64, u64) {
        let (mut min, mut top) = (u64::MAX, 0);
        for s in self.streams.iter() {
            let d = s.durable.load(Ordering::SeqCst);
            (min, top) = (min.min(d), top.max(d));
        }
        debug_assert!(!self.streams.is_empty(), "a log has at least one stream");
        (min.max(self.floor.load(Ordering::SeqCst)), top)
    }

    fn advance_watermark(&self) {
        let (min, _) = self.durable_state();
        let prev = self.watermark.fetch_max(min, Ordering::AcqRel);
        if min > prev {
            {
                let _g = self.wait_lock.lock();
                self.wait_cv.notify_all();
            }
            if let Some(f) = self.listener.get() {
                f(Ts(min), None);
            }
        }
    }

    /// Closed segments whose every transaction is at or below `ts` (so a checkpoint at `ts`
    /// covers them): removed from the list and returned for deletion.
    pub(crate) fn take_segments_covered_by(&self, ts: Ts) -> Vec<(usize, ClosedSegment)> {
        let mut out = Vec::new();
        for (w, s) in self.streams.iter().enumerate() {
            let mut closed = s.closed.lock();
            let (done, keep): (Vec<_>, Vec<_>) = closed.drain(..).partition(|c| c.last_ts <= ts);
            *closed = keep;
            out.extend(done.into_iter().map(|c| (w, c)));
        }
        out
    }

    /// Gives back covered segments a checkpoint could not delete, for the next one to try.
    /// They go first: a stream's closed segments stay oldest first.
    pub(crate) fn return_segments(&self, segments: Vec<(usize, ClosedSegment)>) {
        for (w, c) in segments.into_iter().rev() {
            self.streams[w].closed.lock().insert(0, c);
        }
    }

    /// Installs the one progress listener (see [`ProgressListener`]): whoever releases many
    /// waiting commits at once (the server) learns of durability on the flusher's own thread,
    /// with no thread of its own in between. Progress before the call is not reported: read
    /// [`Logger::watermark`] and [`Logger::failure`] after it. Refused if one is installed.
    pub fn set_progress_listener(&self, f: ProgressListener) -> Result<(), &'static str> {
        self.listener.set(f).map_err(|_| "a progress listener is already installed")?;
        // A failure before the call is reported now, so it cannot be missed.
        if let (Some(f), Some(why)) = (self.listener.get(), self.failed.get()) {
            f(self.watermark(), Some(why));
        }
        Ok(())
    }

    /// Installs the one shipping tap (see [`ShipTap`]); batches framed before the call are
    /// not told. Refused if one is installed.
    pub fn set_ship_tap(&self, tap: Arc<dyn ShipTap>) -> Result<(), &'static str> {
        self.tap.set(tap).map_err(|_| "a shipping tap is already installed")
    }

    /// From now on, with a tap and an interval, batches are framed and shipped as commits
    /// come and the disk thread keeps the interval (one write and fsync per interval at
    /// most), as they are with every-batch durability: for a commit policy that waits for
    /// backups' memory and no fsync here, which would otherwise wait up to an interval for
    /// its batch to be framed. Without it an interval paces the framing (fewer, larger
    /// batches to ship: cheaper where a release waits for this disk anyway). For good.
    pub fn ship_at_commit_pace(&self) {
        self.eager.store(true, Ordering::Release);
    }

    /// Whether batches are framed as commits come rather than an interval apart.
    fn eager(&self) -> bool {
        self.tap.get().is_some() && self.eager.load(Ordering::Acquire)
    }

    /// The number of streams (one per worker).
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Each stream's durable bound (highest bound made durable locally).
    pub fn durable_bounds(&self) -> Vec<Ts> {
        self.streams.iter().map(|s| Ts(s.durable.load(Ordering::Acquire))).collect()
    }

    /// The watermark, if everything appended so far is durable and the watermark covers
    /// every stream's durable bound (nothing buffered, nothing being flushed, no heartbeat
    /// owed): a primary that takes no more commits then holds exactly what this says.
    pub fn settled_watermark(&self) -> Option<Ts> {
        let wm = self.watermark.load(Ordering::Acquire);
        let mut top = 0;
        for s in self.streams.iter() {
            let durable = s.durable.load(Ordering::Acquire);
            if s.appended.load(Ordering::Acquire) > durable {
                return None;
            }
            top = top.max(durable);
        }
        (wm >= top).then_some(Ts(wm))
    }

    /// Whether the log is at rest: every stream's flusher dozes (so each stream's last
    /// write is vouched for, `owes_vouch`) and no disk thread holds or writes a frame.
    /// Nothing more is written until the next commit or the close; tests wait for it
    /// before reading the segments as they will stay (a quiet stream's vouch is framed
    /// `DOZE_AFTER` after its last commit).
    pub fn at_rest(&self) -> bool {
        self.streams.iter().all(|s| {
            let ahead = s.ahead.state.lock();
            s.dozing.load(Ordering::Relaxed) && ahead.frames.is_empty() && !ahead.busy
        })
    }

    /// The tables the catalog holds, in id order.
    pub fn catalog_tables(&self) -> Vec<(TableId, String)> {
        self.catalog.lock().tables.clone()
    }

    /// False once shut down.
    pub fn check_open(&self) -> bool {
        !self.shutdown.load(Ordering::Acquire)
    }

    /// Stops the flushers after a final flush of everything appended so far.
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::Release);
        for s in self.streams.iter() {
            // Under the buffer's lock: a flusher about to doze looks at the flag under it.
            let _g = s.buf.lock();
            s.cv.notify_all();
            s.space.notify_all();
        }
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
        // A commit that passed its check before the shutdown and appended after the last
        // flush waited for ever, neither acknowledged nor failed (found by a review,
        // 2026-12-02): now its wait fails.
        self.flushers_ended.store(true, Ordering::Release);
        let _g = self.wait_lock.lock();
        self.wait_cv.notify_all();
    }

    /// Why a wait for `ts`, not durable when its caller looked, fails: the log failed, or it
    /// was closed after its last flush and the watermark, read again once that is seen
    /// (the last flush may have made `ts` durable since the caller looked), is below it.
    fn never_durable(&self, ts: Ts) -> Option<Error> {
        if let Some(msg) = self.failed.get() {
            return Some(Error::LogFailed(msg.clone()));
        }
        (self.flushers_ended.load(Ordering::Acquire) && self.watermark() < ts)
            .then(|| Error::LogFailed("the log was closed before this commit was made durable".into()))
    }
}

/// A stream's appends past this many bytes wake its flusher even on a thread that defers
/// (a large batch goes out at once, and the buffer's bound is never reached by deferring).
const DEFER_BYTES_MAX: usize = 256 << 10;

/// A thread that deferred a flush this long ago and has not slept since flushes at the end
/// of its next commit (`Logger::committed`): a runtime thread kept busy, or a benchmark's
/// worker, holds no commit back by much more than this (or than the flusher's own check,
/// `HEARTBEAT_EVERY`, for one that stops committing). Before 2026-12-04 its next appends
/// woke the flusher instead, as a thread that does not defer does.
const DEFER_TIME_MAX: Duration = Duration::from_micros(200);

/// A stream of a log that a thread appended to without waking its flusher.
type DeferredStream = (std::sync::Weak<Logger>, usize);

/// This thread's deferred flushes (see `flush_before_sleeping`).
struct Deferred {
    /// This thread defers its appends' flushes.
    on: bool,
    /// When the first of `streams` was deferred.
    since: Option<Instant>,
    /// An append found `since` older than `DEFER_TIME_MAX`: the commit's end flushes
    /// (`Logger::committed`).
    due: bool,
    /// The streams it appended to since it last flushed them.
    streams: Vec<DeferredStream>,
}

thread_local! {
    static DEFERRED: std::cell::RefCell<Deferred> =
        const { std::cell::RefCell::new(Deferred { on: false, since: None, due: false, streams: Vec::new() }) };
}

/// Called by a thread about to sleep that runs many connections' commits (a server's
/// runtime thread, before it parks): flushes, on this thread, every stream it appended to
/// since it last slept, and from now on its appends to a shipping log do not wake the
/// stream's flusher. Like Redis writing its AOF buffer and replica buffers in
/// `beforeSleep`: every commit of a round of the event loop goes out in one batch, framed
/// and shipped here, with no hand-off to the flusher thread on the commit's path (the
/// disk thread still writes and syncs it). Where the flusher is framing a batch at that
/// moment, or its disk queue is full, it is woken instead. A thread that defers and then
/// does not sleep is covered by `DEFER_TIME_MAX` (it flushes at the end of its first
/// commit past it), `DEFER_BYTES_MAX` (its later appends wake the flusher) and the
/// flusher's own check every `HEARTBEAT_EVERY`.
pub fn flush_before_sleeping() {
    defer_flushes();
    flush_deferred();
}

/// From now on this thread's appends to a shipping log do not wake the stream's flusher:
/// this thread frames and ships them itself, at the end of its first commit more than
/// `DEFER_TIME_MAX` after the first it deferred, or before it waits for durability, or when
/// it calls `flush_deferred` or `flush_before_sleeping`. For a thread that commits back to
/// back and never sleeps (a benchmark's worker): its batches then leave every
/// `DEFER_TIME_MAX` with no thread woken to frame and ship them. Where the flusher shares a
/// busy core with such threads, it waits out their time slices before it can frame what
/// they woke it for (on a saturated core, a millisecond and more per batch: the cluster
/// runs' backup lag, docs/replication.md "Commits shipped by the committing thread").
pub fn defer_flushes() {
    DEFERRED.with(|d| d.borrow_mut().on = true);
}

/// Flushes what this thread deferred (see `flush_before_sleeping`), without making it a
/// thread that defers.
pub fn flush_deferred() {
    let pending = DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        d.since = None;
        d.due = false;
        std::mem::take(&mut d.streams)
    });
    if pending.is_empty() {
        return;
    }
    for (log, w) in &pending {
        if let Some(log) = log.upgrade() {
            log.flush_now(*w);
        }
    }
    // The list's allocation is kept for the next round.
    let mut pending = pending;
    pending.clear();
    DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        if d.streams.is_empty() {
            d.streams = pending;
        }
    });
}

impl Logger {
    /// Whether this append to stream `w` is left for its thread to flush before it sleeps
    /// (recorded if so): only on a thread that defers, with every-batch durability or
    /// batches framed as commits come (an interval's pacing is otherwise the flusher's) and
    /// a tap (the flush then ships and queues for the disk thread, which keeps an
    /// interval's pace; it never writes or syncs on the caller's thread). Past
    /// `DEFER_TIME_MAX` since its first deferral the commit's end flushes (`due`,
    /// `Logger::committed`).
    fn defer_flush(&self, w: usize) -> bool {
        if self.tap.get().is_none() || (self.opts.durability != Durability::EveryBatch && !self.eager()) {
            return false;
        }
        DEFERRED.with(|d| {
            let mut d = d.borrow_mut();
            if !d.on {
                return false;
            }
            // (Once due, the clock is not read again until the flush.)
            if !d.due {
                let now = Instant::now();
                match d.since {
                    Some(t) if now.duration_since(t) > DEFER_TIME_MAX => d.due = true,
                    Some(_) => {}
                    None => d.since = Some(now),
                }
            }
            if !d.streams.iter().any(|(l, v)| *v == w && std::ptr::eq(l.as_ptr(), self)) {
                d.streams.push((self.me.clone(), w));
            }
            true
        })
    }

    /// Flushes stream `w` on this thread (see `flush_before_sleeping`), or wakes its flusher
    /// where that cannot be done here: the flusher is framing a batch, the log is closing
    /// or failed, or the disk thread's queue is full (a runtime thread never waits for the
    /// disk).
    fn flush_now(&self, w: usize) {
        let stream = &self.streams[w];
        if let Some(mut st) = stream.flush.try_lock() {
            // Under the lock: once the flusher has made its last flush (under the lock,
            // after the shutdown was set) or stopped on a failure, nothing more is framed;
            // and only the lock's holder adds to the disk queue.
            let closing = self.ending();
            let ahead_full = stream.ahead.state.lock().frames.len() >= AHEAD_BYTES_MAX;
            if closing {
                return;
            }
            if !ahead_full {
                // (A panic here, framing or in the shipping tap, would leave a batch taken
                // from the buffer and never written, and the next batch's bound would
                // carry the watermark past it: the log fails instead; found by a review.)
                self.failing_on_panic(
                    || format!("a flush of log stream {w} on thread {:?}", std::thread::current().name()),
                    || {
                        self.flush_once(w, &mut st, None, &stream.ahead, false, false);
                    },
                );
                return;
            }
        }
        let _g = stream.buf.lock();
        stream.cv.notify_one();
    }
}

impl CommitLog for Logger {
    fn check_writable(&self) -> ditto_engine::Result<()> {
        match self.failed.get() {
            Some(msg) => Err(Error::LogFailed(msg.clone())),
            None if self.shutdown.load(Ordering::Acquire) => Err(Error::LogFailed("log is shut down".into())),
            None => Ok(()),
        }
    }

    fn reserve(&self, worker: WorkerId) -> ditto_engine::Result<()> {
        // Backpressure: while the stream's buffer is over its limit (the disk behind), the
        // commit waits for the flusher to take it, before it locks anything. Only this
        // worker appends to its stream, so the room is still there at its `append`.
        // (Only this worker sets `full`, at its own appends: read here, it is never stale
        // the unsafe way.)
        let stream = &self.streams[worker.0 as usize];
        if stream.full.load(Ordering::Relaxed) {
            let mut buf = stream.buf.lock();
            while buf.payload_len() > self.opts.stream_buffer_bytes_max
                && self.failed.get().is_none()
                && !self.shutdown.load(Ordering::Acquire)
            {
                stream.space.wait_for(&mut buf, Duration::from_millis(10));
            }
        }
        self.check_writable()
    }

    fn append(&self, worker: WorkerId, ts: Ts, writes: &mut dyn ExactSizeIterator<Item = LoggedWrite<'_>>) {
        let stream = &self.streams[worker.0 as usize];
        let mut buf = stream.buf.lock();
        // (`reserve` waited for room before the commit's locks; this never waits but for
        // a caller that skipped it.)
        while buf.payload_len() > self.opts.stream_buffer_bytes_max && self.failed.get().is_none() {
            stream.space.wait_for(&mut buf, Duration::from_millis(10));
        }
        buf.push_txn(ts, writes.map(|w| (w.table, w.rid, w.key, w.value)));
        if buf.payload_len() > self.opts.stream_buffer_bytes_max {
            stream.full.store(true, Ordering::Relaxed);
        }
        stream.appended.store(ts.0, Ordering::Release);
        if buf.payload_len() > DEFER_BYTES_MAX || !self.defer_flush(worker.0 as usize) {
            stream.cv.notify_one();
        } else if stream.dozing.load(Ordering::Relaxed) {
            // Its flusher dozes (`doze`): woken to look again within `HEARTBEAT_EVERY`, in
            // case this thread does not sleep soon. (Read, then cleared, under the buffer's
            // lock, as the flusher sets it: no read-modify-write on every deferred append.)
            stream.dozing.store(false, Ordering::Relaxed);
            stream.cv.notify_one();
        }
        // Idle streams are not woken: this stream's batch vouches for them (module notes).
    }

    fn committed(&self) {
        if DEFERRED.with(|d| d.borrow().due) {
            flush_deferred();
        }
    }

    fn wait_durable(&self, ts: Ts) -> ditto_engine::Result<()> {
        if self.watermark() >= ts {
            return Ok(());
        }
        // This thread is about to sleep: what it deferred goes out first.
        flush_deferred();
        let mut g = self.wait_lock.lock();
        loop {
            if self.watermark() >= ts {
                return Ok(());
            }
            if let Some(e) = self.never_durable(ts) {
                return Err(e);
            }
            self.wait_cv.wait_for(&mut g, Duration::from_millis(50));
        }
    }

    fn is_durable(&self, ts: Ts) -> ditto_engine::Result<bool> {
        if self.watermark() >= ts {
            return Ok(true);
        }
        match self.never_durable(ts) {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    fn table_created(&self, id: TableId, name: &str) -> ditto_engine::Result<()> {
        self.check_writable()?;
        let mut cat = self.catalog.lock();
        cat.add(id, name);
        if let Err(e) = cat.save(&self.dir, &*self.opts.storage) {
            let msg = format!("saving the catalog: {e}");
            self.fail(msg.clone());
            return Err(Error::LogFailed(msg.into()));
        }
        // Under the catalog lock, so backups learn of tables in id order, and before any
        // batch can write to the table.
        if let Some(tap) = self.tap.get() {
            tap.table_created(id, name);
        }
        Ok(())
    }
}
