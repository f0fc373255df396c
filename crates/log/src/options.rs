//! Durability and log options.

use std::sync::Arc;
use std::time::Duration;

use crate::storage::{RealStorage, Storage};

/// When a commit counts as durable, and so when it may be acknowledged. Every variant
/// acknowledges a commit only after the batch holding it (and every batch of every stream
/// holding an earlier timestamp) has reached the point named here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Group commit with an fsync per batch: a stream's flusher writes whatever accumulated
    /// while the previous fsync ran, then fsyncs. Survives process crashes, OS crashes and
    /// power loss (given a disk that honours fsync). Lowest latency of the fsync modes.
    EveryBatch,
    /// Group commit at most once per interval: each stream writes and fsyncs a batch no
    /// sooner than an interval after its previous one, so under load every commit of an
    /// interval shares one fsync; a commit to a stream that wrote nothing for an interval
    /// goes out at once. Survives the same failures as `EveryBatch`; acknowledgement waits
    /// up to one interval (plus the fsync).
    Interval(Duration),
    /// Write to the OS at most once per interval (as `Interval`), never fsync. Survives a
    /// process crash (the page cache outlives the process), NOT an OS crash or power loss.
    /// For benchmarks and tests.
    NoSync(Duration),
}

impl Durability {
    /// The interval that paces writes (`Interval`, `NoSync`); `None` for `EveryBatch`.
    pub fn interval(&self) -> Option<Duration> {
        match self {
            Durability::EveryBatch => None,
            Durability::Interval(d) | Durability::NoSync(d) => Some(*d),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Durability::EveryBatch => "fsync-every-batch".into(),
            Durability::Interval(d) => format!("fsync-interval-{}ms", d.as_millis()),
            Durability::NoSync(d) => format!("no-fsync-{}ms", d.as_millis()),
        }
    }
}

#[derive(Clone)]
pub struct LogOptions {
    pub durability: Durability,
    /// LZ4-compress each batch (kept uncompressed when that does not shrink it; after a
    /// batch that shrank by less than 1/8, the next 32 are stored without trying). Off by
    /// default: on TPC-C it saves 17% of the log's bytes (546 -> 452 per transaction) for
    /// about 6% more CPU per transaction, which a machine whose flushers share the workers'
    /// cores pays in throughput (docs/durability.md, "Compression"). Turn it on where disk
    /// or network bandwidth, not CPU, is what runs out.
    pub compress: bool,
    /// Write log segments with direct I/O (`O_DIRECT`, whole 4 KiB blocks, past the page
    /// cache) where the file system allows it; on by default. It cuts the flusher's CPU per
    /// batch (docs/durability.md, "Direct I/O"). Checkpoints always go through the page cache.
    pub direct_io: bool,
    /// A segment file is closed and a new one started once it is over this size; at most
    /// `SEGMENT_BYTES_LIMIT` is used, whatever is set.
    pub segment_bytes_max: u64,
    /// A worker's commit blocks while its stream has more than this many bytes buffered.
    /// At most `MAX_RAW_LEN - TXN_BYTES_MAX` (128 MiB) is used, whatever is set: one more
    /// transaction on a buffer above that could pass a batch's limit, which the writer
    /// cannot cut (it asserted, in the middle of a commit, before 2026-12-02).
    pub stream_buffer_bytes_max: usize,
    /// Threads writing an online checkpoint (recovery loads and writes with every core).
    pub checkpoint_threads: usize,
    /// A checkpoint writer starts a new part file once its part is over this size (at the
    /// row that finds it so: a part holds at most this and one row), so recovery can load
    /// a checkpoint on more threads than wrote it, each part read whole.
    pub checkpoint_part_bytes: u64,
    /// The most an online checkpoint (`Durable::checkpoint`: the periodic one, the one
    /// that takes a sealed log away, SAVE) writes a second, its threads together; each
    /// also starts the write-back of its part every MiB. 0 (the default here): as fast
    /// as the disk takes it. A server paces its checkpoints (`checkpoint_write_mb_per_s`,
    /// docs/server.md) so that a commit's fsync never queues behind one (docs/cluster.md,
    /// "Paced checkpoints"). Checkpoints written by recovery, before the node serves, are
    /// never paced.
    pub checkpoint_write_bytes_per_s: u64,
    /// The most log a checkpoint keeps, past what it covers, for backups that have not
    /// made it durable (`Durable::keep_log_for`). Past this, it is deleted as if no backup
    /// needed it (such a backup is sent a checkpoint when it returns).
    pub keep_for_backups_max_bytes: u64,
    /// Where files go; tests substitute a fault-injecting storage.
    pub storage: Arc<dyn Storage>,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            durability: Durability::Interval(Duration::from_millis(10)),
            compress: false,
            direct_io: true,
            segment_bytes_max: 64 << 20,
            stream_buffer_bytes_max: 64 << 20,
            checkpoint_threads: 2,
            checkpoint_part_bytes: 64 << 20,
            checkpoint_write_bytes_per_s: 0,
            keep_for_backups_max_bytes: 1 << 30,
            storage: Arc::new(RealStorage),
        }
    }
}

impl std::fmt::Debug for LogOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogOptions")
            .field("durability", &self.durability)
            .field("compress", &self.compress)
            .field("direct_io", &self.direct_io)
            .field("segment_bytes_max", &self.segment_bytes_max)
            .finish()
    }
}

/// The most `LogOptions::segment_bytes_max` (the server's `log_segment_bytes`) may be, and
/// a backup's replica log file's size likewise: recovery reads a file whole, and refuses
/// one longer than any this log writes (`LOG_FILE_BYTES_MAX`) before reading it.
pub const SEGMENT_BYTES_LIMIT: u64 = 1 << 30;

/// The longest a log segment or replica log file can be: `SEGMENT_BYTES_LIMIT`, the write
/// that crosses it (several batches, each at most the largest), and the zeros written
/// ahead. A longer file's size is damaged (a file system's inode, a hole): read whole, a
/// 40 GiB sparse file held the open in memory until the process was killed (found by a
/// review, 2026-12-06).
pub const LOG_FILE_BYTES_MAX: u64 =
    SEGMENT_BYTES_LIMIT + 4 * (crate::format::MAX_STORED_LEN + crate::format::BATCH_HEADER_LEN) as u64 + (1 << 20);

/// `path`'s bytes, refused with a clear error, before anything is read, if the file is
/// longer than `max` (`what` names what it is, for the error).
pub(crate) fn read_file_at_most(path: &std::path::Path, max: u64, what: &str) -> Result<Vec<u8>, crate::LogError> {
    let f = std::fs::File::open(path).map_err(|e| crate::LogError::io(path, e))?;
    let too_long = |len: u64| too_long(path, len, max, what);
    let len = f.metadata().map_err(|e| crate::LogError::io(path, e))?.len();
    if len > max {
        return Err(too_long(len));
    }
    // (A file that grew since is refused too.)
    let out = read_up_to(f, max).map_err(|e| crate::LogError::io(path, e))?;
    if out.len() as u64 > max {
        return Err(too_long(out.len() as u64));
    }
    Ok(out)
}

/// The refusal of `path`, `what` (a log segment, a replica log file), found `len` bytes long
/// where it can be at most `max`.
pub(crate) fn too_long(path: &std::path::Path, len: u64, max: u64, what: &str) -> crate::LogError {
    crate::LogError::Corrupt {
        file: path.to_path_buf(),
        offset: max,
        what: format!("{what} is {len} bytes, more than the {max} it can be: its size is damaged"),
    }
}

/// The bytes of the small file at `path`, at most `max` and one more however long the
/// file says it is (its decoder refuses a longer one: a damaged inode's size is not read
/// whole), `None` where there is no such file.
pub fn read_small(path: &std::path::Path, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::File::open(path) {
        Ok(f) => read_up_to(f, max).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// `f`'s bytes, at most `max` and one more (so that a longer file is told apart), however
/// long the file says it is.
pub(crate) fn read_up_to(f: std::fs::File, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::with_capacity(f.metadata()?.len().min(max + 1) as usize);
    f.take(max + 1).read_to_end(&mut out)?;
    Ok(out)
}
