//! Recovery
//! ========
//! ```text
//!  1. CATALOG                 -> tables
//!  2. newest complete checkpoint (MANIFEST present) at ts C -> loaded in parallel
//!  3. every segment of every stream (epoch >= the manifest's log_epoch_min), read and
//!     checked in parallel (one segment per task, largest first, on as many threads as
//!     cores), then each stream checked as a whole:
//!       - every batch's checksums here; the inside of a batch (decompressed, every
//!         record decoded) here if replay will not read it, else by the replayer in step
//!         5, so no payload is decompressed twice;
//!       - a torn tail in a stream's LAST segment is truncated away (it was never durable,
//!         so it held nothing acknowledged), once the whole log has been checked and
//!         replayed and nothing more refuses the open (`cut_torn_tails`);
//!       - any other damage, here or in step 5, stops recovery with the file and offset,
//!         changing nothing on disk.
//!  4. cut = max(min over streams of max(C, highest bound_ts the stream made durable),
//!               highest floor_ts of any intact batch)
//!     (the durable watermark the primary had, recomputed from the disk: Rolis 3.3; a
//!     floor vouches for every stream, docs/log-format.md)
//!  5. replay every transaction with C < ts <= cut; a version is installed only if newer
//!     than what the record holds, so streams need no ordering among themselves, and
//!     batches of all streams are shared out to as many threads as cores, newest first
//!     (once a frequently updated record holds its newest version, every older write to it
//!     is a timestamp comparison, not a version installed). Transactions above the cut
//!     were never acknowledged and are dropped (their streams may hold them, others may
//!     not: keeping them would break the prefix).
//!     Writes carry a record's key only when they bring it a value it did not have (insert,
//!     or write over a tombstone); any write that brings a key sets it, whatever the order,
//!     so an update replayed before the insert that names its key is fine, and a record
//!     left with a value but no key means the log lost its insert (step 6 refuses it).
//!  6. indexes rebuilt from the live records; clock moved past everything recovered.
//!
//! Memory: the segment files are held as read (compressed) until replay ends; batches are
//! decompressed into one reused buffer per thread; the keys replay keeps are copied into
//! shared 1 MiB chunks (`KeyArena`), the values into their versions.
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use ditto_engine::{Database, Ts};

use crate::arena::KeyArena;

use crate::format::{
    read_segment_checking, Batch, Epoch, FormatError, SegmentEnd, SegmentScan, LOG_FORMAT_VERSION,
    OLDEST_READABLE_VERSION,
};
use crate::storage::{Storage, DIRECT_ALIGN};
use crate::writer::UNFINISHED_SUFFIX;
use crate::LogError;

#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub checkpoint_ts: Option<Ts>,
    pub checkpoint_rows: u64,
    pub checkpoint_bytes: u64,
    pub checkpoint_seconds: f64,
    pub streams: usize,
    pub segments: usize,
    pub log_bytes: u64,
    pub log_txns_replayed: u64,
    pub log_txns_dropped_above_cut: u64,
    pub torn_tails_truncated: Vec<(PathBuf, u64)>,
    /// Segments a crash left while their header was being written (`*.seg.new`): they
    /// held no batch, and recovery removed them.
    pub unfinished_segments_removed: Vec<PathBuf>,
    pub cut_ts: Ts,
    /// Of `log_seconds`, the part spent reading and checking the segments (the rest is
    /// replay).
    pub log_check_seconds: f64,
    pub log_seconds: f64,
    /// Keys put into the indexes after replay, and the time that took.
    pub index_keys: u64,
    pub index_seconds: f64,
    /// Writing the checkpoint that closes recovery (0 when there was no log to replay).
    pub checkpoint_write_seconds: f64,
    /// That checkpoint's size (0 when none was written).
    pub checkpoint_written_bytes: u64,
    pub total_seconds: f64,
    /// Highest epoch seen in the log (new writes use a higher one).
    pub max_epoch: u64,
    /// The epoch before the one this open begins: the log's highest, or the one before
    /// the epoch the loaded checkpoint names for the log after it (0: none).
    pub previous_epoch: u64,
}

impl RecoveryReport {
    /// The size of the checkpoint the database stands on once open: the one recovery wrote
    /// to close, else the one it loaded (0 for a new database). The log-growth trigger
    /// counts from it (`CheckpointPolicy`).
    pub fn open_checkpoint_bytes(&self) -> u64 {
        if self.checkpoint_written_bytes > 0 {
            self.checkpoint_written_bytes
        } else {
            self.checkpoint_bytes
        }
    }

    pub fn log_mb_per_s(&self) -> f64 {
        if self.log_seconds > 0.0 {
            self.log_bytes as f64 / 1e6 / self.log_seconds
        } else {
            0.0
        }
    }

    pub fn checkpoint_mb_per_s(&self) -> f64 {
        if self.checkpoint_seconds > 0.0 {
            self.checkpoint_bytes as f64 / 1e6 / self.checkpoint_seconds
        } else {
            0.0
        }
    }
}

pub(crate) struct SegmentFile {
    pub path: PathBuf,
    pub stream: u32,
    pub epoch: Epoch,
    pub seq: u64,
    /// The next segment of its stream was begun (an unfinished one, `UNFINISHED_SUFFIX`,
    /// is there): this one had been cut to its last batch and synced before it was, so it
    /// must end whole (`check_stream`).
    pub successor_begun: bool,
}

/// Parses `stream-SSSS-eEEEEEEEEEE-sQQQQQQQQQQ.seg`.
fn parse_name(path: &Path) -> Option<(u32, Epoch, u64)> {
    let name = path.file_name()?.to_str()?;
    let rest = name.strip_prefix("stream-")?.strip_suffix(".seg")?;
    let mut it = rest.split('-');
    let s = it.next()?.parse().ok()?;
    let e = it.next()?.strip_prefix('e')?.parse().ok()?;
    let q = it.next()?.strip_prefix('s')?.parse().ok()?;
    Some((s, Epoch(e), q))
}

/// What the log directory holds: the segments, sorted by (stream, epoch, seq), and the
/// unfinished ones (`UNFINISHED_SUFFIX`): a crash came while their header was written, so
/// they hold nothing but at most that header and are removed once recovery succeeds.
pub(crate) struct LogDir {
    pub segments: Vec<SegmentFile>,
    pub unfinished: Vec<PathBuf>,
}

pub(crate) fn list_segments(data: &Path) -> Result<LogDir, LogError> {
    if data.join("log").join(crate::sealed::CUT_FILE).exists() {
        // Sealed as the newest link of the chain (a crash between `sealed::seal_own_log`'s
        // steps): no live log; the next open finishes the rename.
        return Ok(LogDir { segments: Vec::new(), unfinished: Vec::new() });
    }
    list_segments_in(&data.join("log"))
}

/// `list_segments` of the directory `dir` itself (a data directory's `log/`, or a sealed
/// link that holds a primary's log: `sealed::seal_own_log`), its cut file left out.
pub(crate) fn list_segments_in(dir: &Path) -> Result<LogDir, LogError> {
    let dir = dir.to_path_buf();
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogDir { segments: Vec::new(), unfinished: Vec::new() })
        }
        Err(e) => return Err(LogError::io(&dir, e)),
    };
    let mut out = Vec::new();
    let mut unfinished = Vec::new();
    for e in rd {
        let path = e.map_err(|e| LogError::io(&dir, e))?.path();
        if path.file_name().is_some_and(|n| n == crate::sealed::CUT_FILE || n == crate::sealed::FLOOR_FILE) {
            continue;
        }
        let corrupt = |what: &str| LogError::Corrupt { file: path.clone(), offset: 0, what: what.into() };
        if let Some(seg) = path.to_str().and_then(|p| p.strip_suffix(UNFINISHED_SUFFIX)) {
            let name = parse_name(Path::new(seg)).ok_or_else(|| corrupt("unexpected file in the log directory"))?;
            // The writer writes the header in one write (one block with direct I/O) and
            // renames before any batch: anything longer was not left by it.
            let len = std::fs::metadata(&path).map_err(|e| LogError::io(&path, e))?.len();
            if len > DIRECT_ALIGN as u64 {
                return Err(corrupt(&format!("an unfinished segment holds {len} bytes, more than a header")));
            }
            unfinished.push((name, path));
            continue;
        }
        match parse_name(&path) {
            Some((stream, epoch, seq)) => out.push(SegmentFile { path, stream, epoch, seq, successor_begun: false }),
            None => return Err(corrupt("unexpected file in the log directory")),
        }
    }
    // Segments are created one after another, so only a stream's last can be unfinished.
    for ((stream, epoch, seq), path) in &unfinished {
        if out.iter().any(|s| s.stream == *stream && s.epoch == *epoch && s.seq >= *seq) {
            return Err(LogError::Corrupt {
                file: path.clone(),
                offset: 0,
                what: "an unfinished segment is not its stream's last".into(),
            });
        }
    }
    for s in &mut out {
        s.successor_begun = unfinished
            .iter()
            .any(|((stream, epoch, seq), _)| (*stream, *epoch, *seq) == (s.stream, s.epoch, s.seq + 1));
    }
    out.sort_by_key(|s| (s.stream, s.epoch, s.seq));
    Ok(LogDir { segments: out, unfinished: unfinished.into_iter().map(|(_, p)| p).collect() })
}

/// Whether replay will read this batch (it holds transactions above the checkpoint).
fn replays(b: &Batch, ckpt_ts: Ts) -> bool {
    b.header.txn_count > 0 && b.header.last_ts > ckpt_ts
}

/// One segment file, read and checked on its own, plus its length. Every batch's checksums
/// are checked here; the inside of a batch only if replay will not read it (the replayer
/// checks the others as it decompresses them, so each payload is decompressed once).
fn read_one(f: &SegmentFile, ckpt_ts: Ts) -> Result<(SegmentScan, u64), LogError> {
    let raw =
        Bytes::from(crate::options::read_file_at_most(&f.path, crate::options::LOG_FILE_BYTES_MAX, "a log segment")?);
    let scan = read_segment_checking(&raw, |b| !replays(b, ckpt_ts)).map_err(|e| match e {
        FormatError::UnsupportedVersion(version) => LogError::UnsupportedVersion {
            file: f.path.clone(),
            version,
            oldest: OLDEST_READABLE_VERSION,
            newest: LOG_FORMAT_VERSION,
        },
        e => LogError::Corrupt { file: f.path.clone(), offset: 0, what: format!("segment header: {e}") },
    })?;
    if scan.header.stream.0 != f.stream || scan.header.epoch != f.epoch || scan.header.seq != f.seq {
        return Err(LogError::Corrupt {
            file: f.path.clone(),
            offset: 0,
            what: "segment header does not match its file name".into(),
        });
    }
    Ok((scan, raw.len() as u64))
}

/// A batch replay will read, and where it is (for errors).
pub(crate) struct Kept<'s> {
    pub batch: Batch,
    pub file: &'s Path,
    pub offset: u64,
    /// Its transactions above this are not replayed, whatever the cut: a batch of an
    /// epoch that a failover cut below it (`replica::EpochCut`). `Ts(u64::MAX)` if none.
    pub upto: Ts,
}

/// What one stream's segments hold, checked as a stream.
struct StreamLog<'s> {
    /// The batches holding transactions above the checkpoint (checksums checked, insides
    /// not yet).
    batches: Vec<Kept<'s>>,
    /// The highest `bound_ts` the stream made durable.
    bound: Ts,
    /// The highest `floor_ts` in the stream's batches.
    floor: Ts,
    bytes: u64,
    /// A torn tail of the stream's last segment: the file and the length to truncate to.
    torn: Option<(&'s Path, u64)>,
    /// The epoch's stream count its segment headers name (0: not recorded, before version 4).
    streams: u32,
    /// Whether any segment of the stream holds a batch (so the epoch's writer ran, and had
    /// created the first segment of every stream before it did).
    wrote: bool,
}

/// Checks one stream's segments (`scans`, in stream order, as read by `read_one`) as a
/// stream: only the last segment may end torn, batches carry the stream's id and epoch,
/// timestamps increase across batches, and a segment missing before a present one held
/// nothing above the checkpoint (`SegmentHeader::prev_ts`; a checkpoint deletes the oldest
/// segments it covers, and nothing else deletes any). Keeps the batches with transactions
/// above `ckpt_ts`.
fn check_stream<'s>(
    files: &[&'s SegmentFile],
    scans: Vec<Result<(SegmentScan, u64), LogError>>,
    ckpt_ts: Ts,
) -> Result<StreamLog<'s>, LogError> {
    let mut out = StreamLog {
        batches: Vec::new(),
        bound: Ts::ZERO,
        floor: Ts::ZERO,
        bytes: 0,
        torn: None,
        streams: 0,
        wrote: false,
    };
    let mut last_ts = Ts::ZERO;
    for (i, (f, scan)) in files.iter().zip(scans).enumerate() {
        let (scan, len) = scan?;
        // A stream's last segment may end torn or in zeros, unless its successor was begun:
        // the writer (and a fetch's append) cuts a segment to its last batch and syncs it
        // before it begins the next, so such a tail is damage to bytes that were durable
        // (before 2026-12-05 it was cut as torn; found by a review).
        let is_last = i + 1 == files.len() && !f.successor_begun;
        // The segment before this one is missing (or, for the first file, may be): what
        // the stream wrote before this segment must be in the checkpoint.
        let predecessor_missing = i == 0 || files[i - 1].seq + 1 != f.seq;
        if predecessor_missing && scan.header.prev_ts > ckpt_ts {
            let (prev, ckpt) = (scan.header.prev_ts.0, ckpt_ts.0);
            let what = if f.seq <= 1 {
                // The epoch's first segment: it names the checkpoint its log stands on.
                format!(
                    "the checkpoint this log's epoch began on (ts {prev}) is missing: what was found reaches ts \
                     {ckpt} only (its newest checkpoint, or sealed log above it; a checkpoint directory or its \
                     MANIFEST deleted?); opened, the database would lack the commits between"
                )
            } else {
                format!(
                    "segment {} of stream {} is missing: the stream's segments before this one held \
                     commits up to ts {prev}, above the checkpoint (ts {ckpt})",
                    f.seq - 1,
                    f.stream,
                )
            };
            return Err(LogError::Corrupt { file: f.path.clone(), offset: 0, what });
        }
        if i > 0 && scan.header.streams != out.streams {
            return Err(LogError::Corrupt {
                file: f.path.clone(),
                offset: 0,
                what: format!(
                    "segment header names {} streams, an earlier segment of the stream {}",
                    scan.header.streams, out.streams
                ),
            });
        }
        out.streams = scan.header.streams;
        out.wrote |= !scan.batches.is_empty();
        // Zeros the writer laid ahead are not log: recovery speed counts only what was read.
        let len = match scan.end {
            SegmentEnd::Zeros { offset } => offset,
            _ => len,
        };
        match scan.end {
            SegmentEnd::Clean | SegmentEnd::Zeros { .. } if is_last => {}
            SegmentEnd::Clean => {}
            SegmentEnd::Zeros { offset } => {
                return Err(LogError::Corrupt {
                    file: f.path.clone(),
                    offset,
                    what: "zeros up to the end of a segment that is not its stream's last \
                           (the writer cuts them before starting the next segment)"
                        .into(),
                });
            }
            SegmentEnd::Torn { offset, reason, whole_after } if is_last => {
                // Whole batches after the damage are of the same unsynced write (nothing
                // after it claims it was synced), kept by a power cut out of order: cut
                // with it, and said, lest a reader of the log take them for lost.
                let after = crate::format::cut_along(whole_after, "batch", "batches");
                tracing::warn!("{}: torn tail at offset {offset} ({reason}){after}; truncating", f.path.display());
                out.torn = Some((&f.path, offset));
            }
            SegmentEnd::Torn { offset, reason, .. } | SegmentEnd::Corrupt { offset, reason } => {
                return Err(LogError::Corrupt { file: f.path.clone(), offset, what: reason.to_string() });
            }
        }
        out.bytes += len;
        for (offset, b) in scan.batches {
            let h = &b.header;
            if h.stream.0 != f.stream || h.epoch != f.epoch {
                return Err(LogError::Corrupt {
                    file: f.path.clone(),
                    offset,
                    what: "batch of another stream or epoch".into(),
                });
            }
            if h.txn_count > 0 {
                if h.first_ts <= last_ts {
                    return Err(LogError::Corrupt {
                        file: f.path.clone(),
                        offset,
                        what: "timestamps went backwards".into(),
                    });
                }
                last_ts = h.last_ts;
            }
            out.bound = out.bound.max(h.bound_ts);
            out.floor = out.floor.max(h.floor_ts);
            if replays(&b, ckpt_ts) {
                out.batches.push(Kept { batch: b, file: &f.path, offset, upto: Ts(u64::MAX) });
            }
        }
    }
    Ok(out)
}

/// Runs `f` on every item on up to `threads` threads, which take the items in order from a
/// shared counter; returns the results in item order.
fn parallel_map<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let threads = threads.clamp(1, items.len().max(1));
    let mut out: Vec<(usize, R)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { return done };
                        done.push((i, f(item)));
                    }
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().expect("recovery thread panicked")).collect()
    });
    out.sort_unstable_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// Replays every transaction with `ckpt_ts` < ts <= `cut` (and <= its batch's `upto`) of
/// `batches` on `threads` threads; returns (transactions replayed, transactions dropped
/// above the cut).
pub(crate) fn replay_kept(
    db: &Database,
    mut batches: Vec<&Kept>,
    ckpt_ts: Ts,
    cut: Ts,
    threads: usize,
) -> Result<(u64, u64), LogError> {
    // Replay. A version is installed only if newer than the record's, so batches can go in
    // any order on any thread: all streams' batches together, newest first, shared out
    // batch by batch, and within a batch newest transaction first. A frequently written
    // record then gets its newest version early, and its older writes cost one timestamp
    // comparison each.
    batches.sort_unstable_by_key(|k| std::cmp::Reverse(k.batch.header.last_ts));
    let replayed = AtomicU64::new(0);
    let dropped = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads.min(batches.len()).max(1))
            .map(|_| {
                sc.spawn(|| -> Result<(), LogError> {
                    let mut scratch = Vec::new();
                    let arena = RefCell::new(KeyArena::default());
                    let (mut n_replayed, mut n_dropped) = (0, 0);
                    while let Some(k) = batches.get(next.fetch_add(1, Ordering::Relaxed)) {
                        // Checked even if all of it is above the cut: damage anywhere is
                        // refused, and nothing has been written to disk yet.
                        let p = k.batch.checked_payload_in(&mut scratch).map_err(|e| LogError::Corrupt {
                            file: k.file.to_path_buf(),
                            offset: k.offset,
                            what: e.to_string(),
                        })?;
                        let cut = cut.min(k.upto);
                        if k.batch.header.first_ts > cut {
                            n_dropped += u64::from(k.batch.header.txn_count);
                            continue;
                        }
                        // Keys that are kept are copied into the arena, not sliced out of the
                        // payload, so that no segment buffer outlives replay for the sake of a
                        // few keys. Values are copied into their versions.
                        let keep = |part: &[u8]| arena.borrow_mut().copy(part);
                        let txns: Vec<_> = p.txns().filter(|t| t.ts > ckpt_ts).collect();
                        for t in txns.iter().rev() {
                            if t.ts > cut {
                                n_dropped += 1;
                                continue;
                            }
                            for w in t.writes() {
                                let key = w.key.map(|k| move || keep(k));
                                // Refused by the engine (an unknown table, a record id past
                                // its limit, a value too large, in a batch whose checksums
                                // pass): named by its segment and batch, as other damage
                                // is (before 2026-12-05 the engine's error alone; a review).
                                db.recovery_install(w.table, w.rid, key, t.ts, w.value).map_err(|e| {
                                    LogError::Corrupt {
                                        file: k.file.to_path_buf(),
                                        offset: k.offset,
                                        what: format!(
                                            "the engine refused a write of the transaction at ts {}: {e}",
                                            t.ts.0
                                        ),
                                    }
                                })?;
                            }
                            n_replayed += 1;
                        }
                    }
                    replayed.fetch_add(n_replayed, Ordering::Relaxed);
                    dropped.fetch_add(n_dropped, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().expect("replayer panicked"))
    })?;
    Ok((replayed.into_inner(), dropped.into_inner()))
}

/// Threads for recovery: reading and replaying the log, loading the checkpoint, rebuilding
/// the indexes and writing the new checkpoint (nothing else runs yet).
pub(crate) fn recovery_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Steps 3-5 above: reads the log of epochs >= `epoch_min` and replays it after `ckpt_ts`,
/// up to the cut it computes, or `limit` if that is lower (an old primary's log cut at a
/// failover's recovery point: what lies above is dropped, counted in the report).
#[allow(clippy::too_many_arguments)]
pub(crate) fn replay_log(
    db: &Database,
    segments: &[SegmentFile],
    epoch_min: Epoch,
    ckpt_ts: Ts,
    limit: Option<Ts>,
    report: &mut RecoveryReport,
    progress: bool,
    sealed: bool,
) -> Result<Ts, LogError> {
    let t0 = Instant::now();
    let live: Vec<&SegmentFile> = segments.iter().filter(|s| s.epoch >= epoch_min).collect();
    let epochs: std::collections::BTreeSet<Epoch> = live.iter().map(|s| s.epoch).collect();
    if epochs.len() > 1 {
        // Recovery always checkpoints before a new epoch writes, so two live epochs mean the
        // directory was assembled by hand or damaged.
        return Err(LogError::Corrupt {
            file: live[0].path.clone(),
            offset: 0,
            what: format!("log holds segments of several live epochs {epochs:?}"),
        });
    }
    let mut by_stream: BTreeMap<u32, Vec<&SegmentFile>> = BTreeMap::new();
    for s in &live {
        by_stream.entry(s.stream).or_default().push(s);
    }
    report.streams = by_stream.len();
    report.segments = live.len();
    let threads = recovery_threads();

    // Read and check every segment in parallel, largest first (segment files are read
    // whole; the longest one bounds the phase), then every stream as a whole.
    let mut order: Vec<usize> = (0..live.len()).collect();
    let sizes: Vec<u64> = live.iter().map(|s| std::fs::metadata(&s.path).map_or(0, |m| m.len())).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    let mut scans: Vec<Option<Result<(SegmentScan, u64), LogError>>> = {
        let read = parallel_map(&order, threads, |&i| read_one(live[i], ckpt_ts));
        let mut by_index: Vec<_> = (0..live.len()).map(|_| None).collect();
        for (i, r) in order.iter().zip(read) {
            by_index[*i] = Some(r);
        }
        by_index
    };
    let mut logs = Vec::with_capacity(by_stream.len());
    let mut first = 0;
    for files in by_stream.values() {
        // `live` is sorted by (stream, epoch, seq), so each stream's files are contiguous.
        let mine = scans[first..first + files.len()].iter_mut().map(|s| s.take().expect("each scan taken once"));
        logs.push(check_stream(files, mine.collect(), ckpt_ts)?);
        first += files.len();
    }
    // Every stream of the epoch must be there (version-4 headers say how many): the writer
    // creates each stream's first segment before any stream writes, and a checkpoint never
    // deletes a stream's last segment. Without the check, the other streams' bounds and
    // floors would carry the cut past the missing stream's commits.
    let counts: std::collections::BTreeSet<u32> = logs.iter().map(|l| l.streams).filter(|&n| n > 0).collect();
    if let (Some(&n), Some(first)) = (counts.first(), live.first()) {
        let dir = first.path.parent().unwrap_or(Path::new("log")).to_path_buf();
        if counts.len() > 1 {
            return Err(LogError::Corrupt {
                file: dir,
                offset: 0,
                what: format!("the epoch's segments name different stream counts {counts:?}"),
            });
        }
        // The writer creates the first segments in stream order, each durable before the
        // next: a stream missing below one that is there is damage whether or not any
        // stream wrote (before 2026-12-06 only where one had: a lost segment of the one
        // stream that wrote, the others idle, opened at the checkpoint without a word; a
        // review). Missing top streams with nothing written are a crash while they were
        // created, which held no commit.
        let top = by_stream.keys().copied().max().unwrap_or(0);
        let wrote = logs.iter().any(|l| l.wrote);
        if let Some(k) = (0..if wrote { n } else { top }).find(|k| !by_stream.contains_key(k)) {
            let why = if k < top { format!("stream {top} has one") } else { "wrote batches".to_string() };
            return Err(LogError::Corrupt {
                file: dir,
                offset: 0,
                what: format!(
                    "stream {k} of epoch {} has no segment file, though the epoch has {n} streams and {why}",
                    first.epoch.0
                ),
            });
        }
    }
    // A sealed log (`sealed`: a promoted node's own log of its epoch, `crate::sealed`) had
    // its torn tails cut before it was sealed: one now is damage, refused before anything
    // is cut (cut, it could drop commits at or below the point that other streams' floors
    // would hide).
    if let Some((path, len)) = logs.iter().filter_map(|l| l.torn).next().filter(|_| sealed) {
        return Err(LogError::Corrupt {
            file: path.to_path_buf(),
            offset: len,
            what: "a sealed log's stream ends in a batch that does not check: damage (its torn tails were cut before it was sealed)".into(),
        });
    }
    let floor = logs.iter().map(|l| l.floor).max().unwrap_or(Ts::ZERO);
    let cut = logs.iter().map(|l| l.bound.max(ckpt_ts)).min().unwrap_or(ckpt_ts).max(floor);
    let cut = limit.map_or(cut, |l| cut.min(l.max(ckpt_ts)));
    report.cut_ts = cut;
    report.log_bytes = logs.iter().map(|l| l.bytes).sum();
    report.torn_tails_truncated = logs.iter().filter_map(|l| l.torn.map(|(p, len)| (p.to_path_buf(), len))).collect();
    report.log_check_seconds = t0.elapsed().as_secs_f64();
    if progress && report.segments > 0 {
        eprintln!(
            "recovery: {} stream(s), {} segment(s), {:.1} MB of log read and checked in {:.2} s; replaying ({}, {}]",
            report.streams,
            report.segments,
            report.log_bytes as f64 / 1e6,
            report.log_check_seconds,
            ckpt_ts.0,
            cut.0
        );
    }

    let batches: Vec<&Kept> = logs.iter().flat_map(|l| &l.batches).collect();
    let (replayed, dropped) = replay_kept(db, batches, ckpt_ts, cut, threads)?;
    report.log_txns_replayed = replayed;
    report.log_txns_dropped_above_cut = dropped;
    report.max_epoch = segments.iter().map(|s| s.epoch.0).max().unwrap_or(0);
    report.log_seconds = t0.elapsed().as_secs_f64();
    Ok(cut)
}

/// Cuts away the torn tails `replay_log` found (`RecoveryReport::torn_tails_truncated`):
/// they were never durable, so they held nothing acknowledged. An open calls it once
/// nothing more can refuse it, so that a refused open leaves the directory as it was
/// (before 2026-12-03 the cut came as soon as the log replayed, ahead of the engine's
/// index check and the asked epoch's).
pub(crate) fn cut_torn_tails(report: &RecoveryReport, storage: &dyn Storage) -> Result<(), LogError> {
    for (path, len) in &report.torn_tails_truncated {
        storage.truncate_existing(path, *len).map_err(|e| LogError::io(path, e))?;
    }
    Ok(())
}

/// What a primary's own log in `data` holds, read without changing it (a failover's
/// report from an old primary, docs/cluster.md): per stream, the highest durable bound (or
/// the checkpoint, or the highest floor, whichever is higher) as recovery computes them;
/// the newest timestamp written; the cut recovery would make; the log's epoch; and, when
/// `above` is given, how many transactions of its epoch lie above it (counting decodes
/// those batches: an old primary's commits that a failover's recovery point discards).
/// The segments are fsynced first (the process that wrote them may not have).
pub fn primary_log_holdings(
    data: &Path,
    above: Option<Ts>,
) -> Result<(crate::replica::ReplicaHoldings, Epoch), LogError> {
    // A promoted backup's sealed replica log holds every stream up to its point, as a
    // checkpoint there would (`crate::sealed`).
    let base = crate::sealed::base(data)?;
    let (ckpt_ts, epoch_min) = (base.ts, base.ckpt.map_or(Epoch(0), |(_, m)| m.log_epoch_min));
    let segments = list_segments(data)?.segments;
    // A failover asks an old primary for its report again until the round is planned: a
    // log that did not change since the last read is not read again (`replica_holdings`
    // does the same; 466 MB after a load of 1.9M keys took 380 ms on 2 cores).
    let states = crate::replica::file_states(segments.iter().map(|s| s.path.as_path()))?;
    let key = (data.to_path_buf(), base.ts, epoch_min, states);
    if above.is_none() {
        if let Some((k, held)) = LAST_PRIMARY_HELD.lock().as_ref() {
            if *k == key {
                return Ok(held.clone());
            }
        }
    }
    crate::replica::sync_data_and_dir(segments.iter().map(|s| s.path.as_path()), &data.join("log"))?;
    let (epoch, by_stream) = newest_epoch_by_stream(&segments, epoch_min);
    let mut logs = Vec::new();
    for files in by_stream.values() {
        let scans = files.iter().map(|f| read_one(f, ckpt_ts)).collect();
        logs.push((files[0].stream, check_stream(files, scans, ckpt_ts)?));
    }
    // (Version-3 headers record no stream count: the highest stream id counts too, so that
    // a log whose stream 0 has no file left indexes no stream past the end.)
    let highest = logs.iter().map(|(s, _)| *s as usize + 1).max().unwrap_or(0);
    let n = logs.iter().map(|(_, l)| l.streams as usize).max().unwrap_or(0).max(logs.len()).max(highest);
    let floor = logs.iter().map(|(_, l)| l.floor).max().unwrap_or(Ts::ZERO);
    let mut streams = vec![ckpt_ts.max(floor); n];
    let mut newest = ckpt_ts;
    for (s, l) in &logs {
        streams[*s as usize] = l.bound.max(ckpt_ts).max(floor);
        newest = newest.max(l.bound).max(l.batches.iter().map(|k| k.batch.header.last_ts).max().unwrap_or(Ts::ZERO));
    }
    let cut = streams.iter().copied().min().unwrap_or(ckpt_ts);
    let mut txns_above = 0;
    let mut scratch = Vec::new();
    if let Some(above) = above {
        for k in logs.iter().flat_map(|(_, l)| &l.batches) {
            txns_above += count_txns_above(&k.batch, above, ckpt_ts, &mut scratch).map_err(|e| LogError::Corrupt {
                file: k.file.to_path_buf(),
                offset: k.offset,
                what: e.to_string(),
            })?;
        }
    }
    let held = (crate::replica::ReplicaHoldings { streams, newest, txns_above, cut }, epoch);
    if above.is_none() {
        *LAST_PRIMARY_HELD.lock() = Some((key, held.clone()));
    }
    Ok(held)
}

/// The segments of the newest epoch at or above `epoch_min` (the one a checkpoint's log
/// lies on), by stream, each stream's in name order; and that epoch.
fn newest_epoch_by_stream(segments: &[SegmentFile], epoch_min: Epoch) -> (Epoch, BTreeMap<u32, Vec<&SegmentFile>>) {
    let live: Vec<&SegmentFile> = segments.iter().filter(|s| s.epoch >= epoch_min).collect();
    let epoch = live.iter().map(|s| s.epoch).max().unwrap_or(epoch_min);
    let mut by_stream: BTreeMap<u32, Vec<&SegmentFile>> = BTreeMap::new();
    for s in live.into_iter().filter(|s| s.epoch == epoch) {
        by_stream.entry(s.stream).or_default().push(s);
    }
    (epoch, by_stream)
}

/// How far the primary's own log in `data` (its newest epoch) holds every stream on disk,
/// read batch header by batch header (each carries its own checksum) rather than whole:
/// per stream, the highest bound among the batches up to the first header that does not
/// check (a torn tail, or the zeros laid ahead of the next batch), or the `prev_ts` its
/// newest segment's header vouches for; with the highest floor of the streams' last
/// batches, and the checkpoint or sealed log under it. The payload of each stream's last
/// batch is read and checked (its floor is covered by it): if one fails, `Err`, and the
/// caller reads the whole log (`primary_log_holdings`). A switchover's drained primary,
/// fenced, checks so that its log reaches the point before it is sealed: reading its
/// whole log after a load (466 MB) took 245 ms on 2 cores. Payloads before the last are
/// not read: damage there is found when the sealed log is replayed.
pub fn primary_log_reach(data: &Path) -> Result<Ts, LogError> {
    use std::os::unix::fs::FileExt;
    let base = crate::sealed::base(data)?;
    let (ckpt_ts, epoch_min) = (base.ts, base.ckpt.map_or(Epoch(0), |(_, m)| m.log_epoch_min));
    let segments = list_segments(data)?.segments;
    // What a stopped writer left unsynced is made durable first, as the whole read does.
    crate::replica::sync_data_and_dir(segments.iter().map(|s| s.path.as_path()), &data.join("log"))?;
    // (Each stream's segments in sequence order: `list_segments` sorts them.)
    let (epoch, by_stream) = newest_epoch_by_stream(&segments, epoch_min);
    let (mut n, mut floor) = (by_stream.len(), Ts::ZERO);
    let mut bounds: BTreeMap<u32, Ts> = BTreeMap::new();
    for (stream, files) in &by_stream {
        let Some(newest) = files.last() else { continue };
        let path = &newest.path;
        let corrupt = |offset: u64, what: String| LogError::Corrupt { file: path.clone(), offset, what };
        let f = std::fs::File::open(path).map_err(|e| LogError::io(path, e))?;
        let size = f.metadata().map_err(|e| LogError::io(path, e))?.len();
        let mut head = [0u8; crate::format::SEGMENT_HEADER_LEN];
        f.read_exact_at(&mut head, 0).map_err(|e| LogError::io(path, e))?;
        let h = crate::format::SegmentHeader::decode(&head).map_err(|e| corrupt(0, format!("segment header: {e}")))?;
        if h.stream.0 != newest.stream || h.epoch != newest.epoch || h.seq != newest.seq {
            return Err(corrupt(0, "segment header does not match its file name".into()));
        }
        n = n.max(h.streams as usize);
        // The earlier segments vouch for `prev_ts` only if they are there (the whole read's
        // check, `check_stream`): the one before the newest, at least.
        let predecessor = files.len() >= 2 && files[files.len() - 2].seq + 1 == newest.seq;
        if h.prev_ts > ckpt_ts && !predecessor {
            return Err(corrupt(0, format!("the segment before it is missing (it vouches for ts {})", h.prev_ts.0)));
        }
        let mut bound = h.prev_ts;
        let mut last: Option<(u64, crate::format::BatchHeader)> = None;
        let mut off = crate::format::SEGMENT_HEADER_LEN as u64;
        let mut buf = [0u8; crate::format::BATCH_HEADER_LEN];
        while size - off >= crate::format::BATCH_HEADER_FIXED_LEN as u64 {
            let want = buf.len().min((size - off) as usize);
            f.read_exact_at(&mut buf[..want], off).map_err(|e| LogError::io(path, e))?;
            let Ok(b) = crate::format::decode_batch_header(&buf[..want]) else { break };
            if b.stream.0 != *stream || b.epoch != epoch || off + b.total_len() as u64 > size {
                break;
            }
            bound = bound.max(b.bound_ts);
            last = Some((off, b));
            off += b.total_len() as u64;
        }
        if let Some((at, b)) = last {
            let mut whole = vec![0u8; b.total_len()];
            f.read_exact_at(&mut whole, at).map_err(|e| LogError::io(path, e))?;
            let (checked, _) = crate::format::decode_batch_checksums(&Bytes::from(whole))
                .map_err(|e| corrupt(at, format!("the stream's last batch: {e}")))?;
            floor = floor.max(checked.header.floor_ts);
        }
        bounds.insert(*stream, bound);
    }
    // (No stream at all vouches for nothing, as `primary_log_holdings` reads it.)
    let reach = (0..n as u32).map(|s| bounds.get(&s).copied().unwrap_or(Ts::ZERO).max(floor).max(ckpt_ts)).min();
    Ok(reach.unwrap_or(Ts::ZERO))
}

/// What `primary_log_holdings` read last without counting, and the log's state then: the
/// directory, what its log lies on, and its segments (`replica::file_states`).
type PrimaryHeldKey = (PathBuf, Ts, Epoch, Vec<crate::replica::FileState>);
static LAST_PRIMARY_HELD: parking_lot::Mutex<Option<(PrimaryHeldKey, (crate::replica::ReplicaHoldings, Epoch))>> =
    parking_lot::Mutex::new(None);

pub(crate) fn forget_primary_holdings() {
    *LAST_PRIMARY_HELD.lock() = None;
}

/// How many of `batch`'s transactions lie above `above` and above the checkpoint at
/// `ckpt_ts` (what a cut at `above` discards). The payload is decoded, and checked, only
/// when the batch reaches above `above`.
pub(crate) fn count_txns_above(
    batch: &crate::format::Batch,
    above: Ts,
    ckpt_ts: Ts,
    scratch: &mut Vec<u8>,
) -> Result<u64, crate::format::FormatError> {
    if batch.header.last_ts <= above {
        return Ok(0);
    }
    let p = batch.checked_payload_in(scratch)?;
    Ok(p.txns().filter(|t| t.ts > above && t.ts > ckpt_ts).count() as u64)
}

/// The epoch of the primary's log in `data`, from its segments' names (0: none).
pub fn primary_log_epoch(data: &Path) -> Result<Epoch, LogError> {
    Ok(newest_epoch(&list_segments(data)?.segments))
}

/// The newest epoch among `segments` (`Epoch(0)` if none).
pub(crate) fn newest_epoch(segments: &[SegmentFile]) -> Epoch {
    segments.iter().map(|s| s.epoch).max().unwrap_or(Epoch(0))
}

/// The lowest `after` from which `primary_stream_batches` answers for `data`, whose own
/// log's epoch began above `epoch_start` (its `EpochRecord::start`: everything of older
/// epochs lies at or below it): `replica::fetch_floor`, or lower where the log, kept past
/// its checkpoint for backups (`Durable::keep_log_for`), reaches down: the highest
/// `prev_ts` of a stream's first segment or of one after a gap, and at least
/// `epoch_start`. A segment whose header cannot be read leaves the log out.
pub fn primary_fetch_floor(data: &Path, epoch_start: Ts) -> Result<Ts, LogError> {
    let base = crate::replica::fetch_floor(data)?;
    let segs = list_segments(data)?.segments;
    let epoch = newest_epoch(&segs);
    let mut floor = epoch_start;
    let mut prev: Option<(u32, u64)> = None;
    let (mut streams, mut seen) = (0u32, std::collections::BTreeSet::new());
    for s in segs.iter().filter(|s| s.epoch == epoch) {
        if prev.is_none_or(|(stream, seq)| stream != s.stream || s.seq != seq + 1) {
            let mut b = [0u8; crate::format::SEGMENT_HEADER_LEN];
            let read = std::fs::File::open(&s.path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
            match read.ok().and_then(|_| crate::format::SegmentHeader::decode(&b).ok()) {
                Some(h) => {
                    floor = floor.max(h.prev_ts);
                    streams = streams.max(h.streams);
                }
                None => return Ok(base),
            }
        }
        seen.insert(s.stream);
        prev = Some((s.stream, s.seq));
    }
    // Every stream of the epoch must have its segments here (a stream with none would be
    // answered with nothing); a log that does not say how many it has is not used.
    if streams == 0 || (0..streams).any(|s| !seen.contains(&s)) {
        return Ok(base);
    }
    Ok(base.min(floor))
}

/// The batches of stream `stream` in the primary's own log in `data` with a bound above
/// `after`, as written (a failover's fetch from an old primary). Its log's epoch began
/// above `epoch_start` (`primary_fetch_floor`); `Ts(u64::MAX)` if not known.
pub fn primary_stream_batches(data: &Path, stream: usize, after: Ts, epoch_start: Ts) -> Result<Vec<Bytes>, LogError> {
    let mut out = Vec::new();
    primary_stream_batches_each(data, stream, after, epoch_start, &mut |b| {
        out.push(b);
        true
    })?;
    Ok(out)
}

/// `primary_stream_batches`, each batch handed to `sink` in order as it is read (a
/// batch at a time), so that the answer is never held whole; `sink` returning false
/// asks for no more.
pub fn primary_stream_batches_each(
    data: &Path,
    stream: usize,
    after: Ts,
    epoch_start: Ts,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<(), LogError> {
    // The log's epoch, from the file names (the segments are read once, below).
    let epoch = primary_log_epoch(data)?;
    let base = crate::sealed::base(data)?.ts;
    if base > after && after >= epoch_start {
        // Below the checkpoint, from the log kept for backups, if it reaches down to
        // `after` (nothing of older epochs lies above `epoch_start`).
        if let Some(gap) = crate::replica::stream_batches_after(data, epoch, after, stream)? {
            return gap.each(sink).map(|_| ());
        }
    }
    if base > after {
        // Below the point of the sealed log this log lies on, from that sealed log.
        match crate::replica::sealed_stream_batches(data, stream, after, base, sink)? {
            Some(crate::replica::Reached::Stopped) => return Ok(()),
            Some(crate::replica::Reached::End) => {
                return primary_stream_batches_each(data, stream, base, epoch_start, sink)
            }
            None => {}
        }
        return Err(LogError::Corrupt {
            file: data.join("checkpoints"),
            offset: 0,
            what: format!(
                "a checkpoint or seal at ts {} covers what lies above ts {}: no batches to give",
                base.0, after.0
            ),
        });
    }
    let gap = crate::replica::stream_batches_after(data, epoch, after, stream)?.ok_or_else(|| LogError::Corrupt {
        file: data.join("log"),
        offset: 0,
        what: format!("the log no longer holds stream {stream} above ts {}", after.0),
    })?;
    gap.each(sink).map(|_| ())
}

/// What `append_own_fetched` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnFetched {
    /// Batches written, as a new segment of the stream.
    pub written: usize,
    /// Batches the log already held (bounded at or below its stream's bound).
    pub held: usize,
    /// Batches of older epochs: each lies above the point its epoch was cut at (a fetch
    /// asks from at or above this log's epoch start), so it was discarded, and is dropped.
    pub older: usize,
}

/// Adds fetched batches of stream `stream` to the primary's own log in `data`, as that
/// stream's next segment: a failover's last resort (an old primary, not eligible) that
/// lacks part of what it shipped, because it crashed before that part was durable, takes
/// it back from a backup that received it (docs/cluster.md, "A last resort fetches what it
/// lacks"). The batches are the ones this log's writer made (a backup keeps them as
/// shipped), so the log then reads as if the writer had made them durable itself:
/// recovery, the holdings, a later fetch from it and the cut at the point all see them.
///
/// Everything is checked before anything is written: each batch whole and of this stream,
/// none of a newer epoch, and timestamps increasing on from what the stream holds. The
/// directory's lock is held throughout. Then the stream's last segment is cut to its last
/// whole batch (a torn tail or the zeros laid ahead, which a segment that is not the
/// stream's last may not end with), unfinished segments (a header at most) are removed,
/// and the new segment is made as the writer makes one: its header under a temporary
/// name, synced and renamed, then the batches, synced. A crash at any step leaves a log
/// that opens, holding some of the batches or none (a torn tail, cut at the next open or
/// call).
///
/// A fetched batch's floor (every stream durable up to it, when its writer made it)
/// vouches for the other streams: true of what survived on this disk under a durability
/// that fsyncs before it publishes a floor (`EveryBatch`, `Interval`). Not under
/// `NoSync` (for benchmarks and tests), after a power loss: what a floor vouches for may be
/// lost there, as is whatever that log acknowledged.
pub fn append_own_fetched(
    data: &Path,
    stream: usize,
    batches: &[Bytes],
    storage: &dyn Storage,
) -> Result<OwnFetched, LogError> {
    // No server may write the log meanwhile (one that did not stop holds the lock).
    let _lock = crate::lock_dir(data)?;
    let base = crate::sealed::base(data)?;
    let (ckpt_ts, epoch_min) = (base.ts, base.ckpt.map_or(Epoch(0), |(_, m)| m.log_epoch_min));
    let LogDir { segments, unfinished } = list_segments(data)?;
    let (epoch, by_stream) = newest_epoch_by_stream(&segments, epoch_min);
    let logdir = data.join("log");
    let corrupt = |file: &Path, what: String| LogError::Corrupt { file: file.to_path_buf(), offset: 0, what };
    let files = by_stream
        .get(&(stream as u32))
        .ok_or_else(|| corrupt(&logdir, format!("no segment of stream {stream} in epoch {} to add to", epoch.0)))?;
    let last = *files.last().expect("a stream listed has a segment");
    let scans: Vec<_> = files.iter().map(|f| read_one(f, ckpt_ts)).collect();
    // Where the last segment's whole batches end, and the highest timestamp before the new
    // segment (the last one's `prev_ts` where it holds no batch).
    let (last_end, last_prev) = match scans.last() {
        Some(Ok((scan, len))) => (
            match &scan.end {
                SegmentEnd::Zeros { offset } | SegmentEnd::Torn { offset, .. } => *offset,
                SegmentEnd::Clean | SegmentEnd::Corrupt { .. } => *len,
            },
            scan.header.prev_ts,
        ),
        _ => (0, Ts::ZERO),
    };
    let log = check_stream(files, scans, ckpt_ts)?;
    // A log of a format before 4 (an older build's; its headers record no stream count):
    // the new segment, and the batches fetched into it, would be of this build's format,
    // which a stream's segments may not mix, and its header could name no stream count
    // its own stream lies below. Refused with the way out instead of leaving a directory
    // no open takes (found by a review, 2026-12-03).
    if log.streams == 0 {
        return Err(corrupt(
            &logdir,
            format!(
                "stream {stream}'s log of epoch {} was written by an older ditto (log format before 4): a fetch cannot be added to it; start this node's server once with this build (its open moves the log to a new epoch in this format), or rejoin it as a new member",
                epoch.0,
            ),
        ));
    }
    let mut last_ts = log.batches.iter().map(|k| k.batch.header.last_ts).max().unwrap_or(Ts::ZERO).max(last_prev);
    // The highest timestamp in the segments before the new one (`SegmentHeader::prev_ts`).
    let prev_ts = last_ts.max(log.bound);
    let mut bound = log.bound.max(ckpt_ts).max(log.floor);
    let mut out = OwnFetched::default();
    let mut keep = Vec::new();
    // Every record of every payload checked, not just the checksums (as `append_fetched`
    // does): a payload that does not parse, written here, would fail this log's next open.
    let mut scratch = Vec::new();
    for b in batches {
        let (batch, used) = crate::format::decode_batch_in(b, &mut scratch)
            .map_err(|e| corrupt(&logdir, format!("a fetched batch: {e}")))?;
        let h = &batch.header;
        if used != b.len() {
            return Err(corrupt(&logdir, "a fetched batch with trailing bytes".into()));
        }
        if h.stream.0 as usize != stream {
            return Err(corrupt(&logdir, format!("a fetched batch of stream {}, not {stream}", h.stream.0)));
        }
        if h.epoch > epoch {
            return Err(corrupt(
                &logdir,
                format!("a fetched batch of epoch {}, after this log's epoch {}", h.epoch.0, epoch.0),
            ));
        }
        if h.epoch < epoch {
            out.older += 1;
            continue;
        }
        if h.bound_ts <= bound {
            out.held += 1;
            continue;
        }
        // The new segment is of this build's format, and a segment's batches are of its
        // version: a batch an older build framed cannot go into it (found by a review,
        // 2026-12-03, when format 5 came: the next open refused the segment).
        if u32::from(h.version) != crate::format::LOG_FORMAT_VERSION {
            return Err(corrupt(
                &logdir,
                format!(
                    "a fetched batch of stream {stream} is of log format {}, written by an older ditto: it cannot be added to this log (format {}); start this node's server once with this build (its open moves the log to a new epoch in this format), or rejoin it as a new member",
                    h.version,
                    crate::format::LOG_FORMAT_VERSION
                ),
            ));
        }
        if h.txn_count > 0 {
            if h.first_ts <= last_ts {
                return Err(corrupt(
                    &logdir,
                    format!(
                        "a fetched batch of stream {stream} starts at ts {}, not above ts {} held",
                        h.first_ts.0, last_ts.0
                    ),
                ));
            }
            last_ts = h.last_ts;
        }
        bound = h.bound_ts;
        keep.push(b);
    }
    if keep.is_empty() {
        return Ok(out);
    }
    if last_end > 0 {
        storage.truncate_existing(&last.path, last_end).map_err(|e| LogError::io(&last.path, e))?;
    }
    // Segments the writer (or an earlier call) began and never named hold at most a
    // header: they go, as an open removes them, or the new one could not be created.
    for p in &unfinished {
        storage.remove(p).map_err(|e| LogError::io(p, e))?;
    }
    let seq = last.seq + 1;
    let header = crate::format::SegmentHeader {
        stream: crate::format::StreamId(stream as u32),
        epoch,
        seq,
        streams: log.streams,
        prev_ts,
    };
    // As the writer makes a segment (its header durable under its name first); then the
    // batches (a crash among them leaves a torn tail of the stream's last segment, which
    // recovery and this function cut).
    let (mut f, path) =
        crate::writer::create_segment(storage, data, &header, false).map_err(|e| LogError::io(&logdir, e))?;
    for b in &keep {
        f.write_all(b).map_err(|e| LogError::io(&path, e))?;
    }
    f.sync().map_err(|e| LogError::io(&path, e))?;
    drop(f);
    forget_primary_holdings();
    out.written = keep.len();
    Ok(out)
}
