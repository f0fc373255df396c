//! A backup's own log: the primary's batches, in the order received
//! =================================================================
//! A backup persists every batch the primary ships before it acknowledges or replays it
//! (Query Fresh 3.2: replay pipelining). It keeps them in one sequence of files, in
//! receive order, not one file per primary stream:
//!
//! ```text
//!  dir/replica/rlog-QQQQQQQQQQ.seg   header (32 B) | entry | entry | ...
//!  entry = len u32 | flags u8 | synced u24 | crc32c u32 of those 8 bytes | the batch as the primary framed it
//!  flags bit 0: FLOOR_TRUSTED (the batch's floor_ts may vouch for other streams)
//!  synced: how much of this file its syncs had made durable when the entry was appended,
//!          in 256-byte units, rounded down (format 2; three zero bytes in format 1)
//! ```
//!
//! Why one sequence: a batch's floor vouches for other streams' batches that were durable
//! on the primary when it was framed (crates/log/src/writer.rs). The primary ships batches
//! in the order it frames them, so every batch a floor vouches for reached the backup
//! before the batch carrying it. With one file, what survives a backup's crash is a prefix
//! of what it received, so a floor found on disk is still true on the backup's disk; with a
//! file per stream, a later batch's file could be synced while an earlier one's was not.
//! Batches the primary reads back from its own segments to fill a gap are not shipped in
//! that order, so their floors are not trusted (flag clear).
//!
//! Recovery (`open_replica`) is the primary's, fed from these files: the newest checkpoint,
//! then every entry checked, each stream's highest bound and the highest trusted floor make
//! the cut, and the batches are replayed up to it on every core (`recovery::replay_kept`).
//! A torn tail of the last file is cut; damage anywhere else stops the open with the file
//! and offset. A failed entry of the newest file followed by whole ones is a torn write
//! (the backup writes a burst of entries in one write before one fsync, and a power cut
//! may keep a later page of it and not an earlier one) unless a later entry's `synced`
//! claims the failed bytes had been synced: then it is damage (`torn_entries_after`). The open writes a checkpoint at the cut and deletes the files, so a
//! restarted backup asks the primary for everything above its cut.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use ditto_engine::{Database, Options, Ts};

use crate::catalog::Catalog;
use crate::format::{decode_batch_checksums, Batch, Epoch};
use crate::recovery::{recovery_threads, replay_kept, Kept};
use crate::storage::{LogFile, Storage};
use crate::{checkpoint, CheckpointInfo, LogError, RecoveryReport};

pub const REPLICA_MAGIC: [u8; 8] = *b"DITTORPL";
/// 2 (2026-12-05): each entry's header claims how far its file was synced
/// (`ENTRY_SYNCED_UNIT`); 1 had three zero bytes there, and a file of 1 is still read,
/// its damage told as before (any whole entry after a failed one makes it damage).
pub const REPLICA_FORMAT_VERSION: u32 = 2;
/// The unit of an entry's synced claim: its three bytes count 256 bytes (4 GiB at most; a
/// longer file claims that much, which claims less).
pub const ENTRY_SYNCED_UNIT: u64 = 256;
/// The first format whose entries claim how far their file was synced.
const ENTRY_SYNCED_VERSION: u32 = 2;
pub const REPLICA_HEADER_LEN: usize = 32;
pub const ENTRY_HEADER_LEN: usize = 12;
/// Entry flag: the batch's floor may vouch for other streams (it was shipped in framing order).
pub const FLOOR_TRUSTED: u8 = 1;

/// The directory of a backup's received log.
pub fn replica_dir(data: &Path) -> PathBuf {
    data.join("replica")
}

fn file_path(data: &Path, seq: u64) -> PathBuf {
    replica_dir(data).join(format!("rlog-{seq:010}.seg"))
}

fn encode_header(streams: u32, seq: u64) -> [u8; REPLICA_HEADER_LEN] {
    let mut b = [0u8; REPLICA_HEADER_LEN];
    b[..8].copy_from_slice(&REPLICA_MAGIC);
    b[8..12].copy_from_slice(&REPLICA_FORMAT_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&streams.to_le_bytes());
    b[16..24].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&b[..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A replica log file's header: its primary's stream count, its sequence number, its
/// format version (1 or 2).
struct FileHeader {
    streams: u32,
    seq: u64,
    version: u32,
}

/// A file's header, or why not.
fn decode_header(b: &[u8]) -> Result<FileHeader, String> {
    if b.len() < REPLICA_HEADER_LEN || b[..8] != REPLICA_MAGIC {
        return Err("not a replica log file (bad magic or too short)".into());
    }
    let crc = u32::from_le_bytes(b[28..32].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&b[..28]) {
        return Err("replica log header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if !(1..=REPLICA_FORMAT_VERSION).contains(&version) {
        return Err(format!(
            "replica log format version {version} is not supported (this build reads 1 to {REPLICA_FORMAT_VERSION})"
        ));
    }
    Ok(FileHeader {
        streams: u32::from_le_bytes(b[12..16].try_into().expect("4")),
        seq: u64::from_le_bytes(b[16..24].try_into().expect("8")),
        version,
    })
}

/// The entry header in front of a batch of `len` bytes, in a file whose syncs had made
/// `synced` bytes of it durable when the entry was appended.
pub fn entry_header(len: usize, flags: u8, synced: u64) -> [u8; ENTRY_HEADER_LEN] {
    let mut h = [0u8; ENTRY_HEADER_LEN];
    h[..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4] = flags;
    let units = (synced / ENTRY_SYNCED_UNIT).min(0xFF_FFFF) as u32;
    h[5..8].copy_from_slice(&units.to_le_bytes()[..3]);
    let crc = crc32c::crc32c(&h[..8]);
    h[8..12].copy_from_slice(&crc.to_le_bytes());
    h
}

/// How much of its file an entry header claims was synced when it was appended (0 in a
/// file of format 1).
fn entry_synced(h: &[u8]) -> u64 {
    u64::from(u32::from_le_bytes([h[5], h[6], h[7], 0])) * ENTRY_SYNCED_UNIT
}

/// Appends received batches to the backup's replica log; `sync` makes them durable.
/// Invariant: entries reach the disk in the order `append` was called, and `sync` returns
/// only once every appended entry is durable (one file at a time, rolled at a size limit).
pub struct ReplicaLog {
    data: PathBuf,
    storage: Arc<dyn Storage>,
    streams: u32,
    file: Box<dyn LogFile>,
    seq: u64,
    bytes: u64,
    bytes_max: u64,
    pending: Vec<u8>,
    /// The highest batch bound appended so far (not reset when a file rolls), and the
    /// closed files with it as it was when each closed: a file is deleted once a
    /// checkpoint covers that bound. (A batch a backup holds at the release and reads
    /// back from its file, `read_appended`, relies on it: the bound recorded is at least
    /// that of every batch appended before the file closed.)
    cur_max_ts: Ts,
    closed: Vec<(PathBuf, Ts)>,
}

impl ReplicaLog {
    /// Starts a new replica log file `seq` for a primary with `streams` streams.
    pub fn create(
        data: &Path,
        storage: Arc<dyn Storage>,
        streams: u32,
        seq: u64,
        bytes_max: u64,
    ) -> std::io::Result<ReplicaLog> {
        // `replica/`'s entry in the data directory durable before anything in it is
        // acknowledged, whoever made the directory (the file's and `replica/`'s own syncs
        // do not make it so).
        std::fs::create_dir_all(replica_dir(data))?;
        storage.sync_dir(data)?;
        let file = Self::open_file(data, &*storage, streams, seq)?;
        Ok(ReplicaLog {
            data: data.to_path_buf(),
            storage,
            streams,
            file,
            seq,
            bytes: REPLICA_HEADER_LEN as u64,
            // (Recovery refuses a file longer than any this writes.)
            bytes_max: bytes_max.min(crate::options::SEGMENT_BYTES_LIMIT),
            pending: Vec::new(),
            cur_max_ts: Ts::ZERO,
            closed: Vec::new(),
        })
    }

    fn open_file(data: &Path, storage: &dyn Storage, streams: u32, seq: u64) -> std::io::Result<Box<dyn LogFile>> {
        let path = file_path(data, seq);
        let mut f = storage.create_new(&path)?;
        f.write_all(&encode_header(streams, seq))?;
        f.sync()?;
        storage.sync_dir(&replica_dir(data))?;
        Ok(f)
    }

    pub fn streams(&self) -> u32 {
        self.streams
    }

    /// Queues one batch (as the primary framed it) for the next `sync`. `high` is its
    /// highest timestamp (`BatchHeader::high_ts`: its bound, or a transaction above it,
    /// which the format allows; before 2026-12-06 its bound alone was counted, so a file
    /// holding such a transaction could be deleted by a checkpoint below it; a review),
    /// for deciding later which files a checkpoint covers. Returns where the
    /// batch will lie once synced (`read_appended`): a file rolls only after a sync, so
    /// every batch of one sync lies in the file now open.
    pub fn append(&mut self, batch: &[u8], floor_trusted: bool, high: Ts) -> Appended {
        let at = Appended { seq: self.seq, offset: self.bytes + (self.pending.len() + ENTRY_HEADER_LEN) as u64 };
        // (What earlier syncs made durable: every entry of one sync claims the same.)
        let flags = if floor_trusted { FLOOR_TRUSTED } else { 0 };
        self.pending.extend_from_slice(&entry_header(batch.len(), flags, self.bytes));
        self.pending.extend_from_slice(batch);
        self.cur_max_ts = self.cur_max_ts.max(high);
        at
    }

    /// Writes and fsyncs everything appended. After an error the log must not be used again
    /// (no fsync retry on the same file, see `LogFile::sync`), and the file is cut back to
    /// what earlier syncs made durable: left, the failed bytes stay in the page cache, and
    /// a later fsync through another descriptor (a holdings report, which a failover's
    /// plan trusts) succeeds on them and counts them as held, though they may never reach
    /// the disk (the primary's log does the same, `Logger::unwritten`; found by a review,
    /// 2026-12-05). If the cut fails too, it is logged: the backup has stopped all the same.
    pub fn sync(&mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.file.write_all(&self.pending).and_then(|()| self.file.sync()) {
            if let Err(t) = self.file.truncate(self.bytes) {
                tracing::error!(
                    "{}: cutting the failed write back to offset {}: {t}",
                    file_path(&self.data, self.seq).display(),
                    self.bytes
                );
            }
            return Err(e);
        }
        self.bytes += self.pending.len() as u64;
        self.pending.clear();
        if self.pending.capacity() > 1 << 20 {
            self.pending = Vec::new();
        }
        if self.bytes >= self.bytes_max {
            let next = Self::open_file(&self.data, &*self.storage, self.streams, self.seq + 1)?;
            self.closed.push((file_path(&self.data, self.seq), self.cur_max_ts));
            self.file = next;
            self.seq += 1;
            self.bytes = REPLICA_HEADER_LEN as u64;
        }
        Ok(())
    }

    /// Deletes the closed files whose every batch a checkpoint at `ts` covers (a file that
    /// cannot be deleted is logged and kept for the next checkpoint).
    pub fn remove_covered_by(&mut self, ts: Ts) {
        let storage = &self.storage;
        self.closed.retain(|(path, max)| {
            if *max > ts {
                return true;
            }
            match storage.remove(path) {
                Ok(()) => false,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => {
                    tracing::warn!("deleting {} after a checkpoint: {e}; the next one tries again", path.display());
                    true
                }
            }
        });
    }
}

/// Where `ReplicaLog::append` put a batch: its file's number and the batch's offset in it
/// (behind its entry header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub offset: u64,
}

/// Reads back the `len` bytes of a batch appended at `at` to `data`'s replica log and
/// synced since (a backup whose replay is held at the release keeps the batches above
/// what it can hold in memory there, not twice). The file is kept until a checkpoint
/// covers its every batch (`ReplicaLog::remove_covered_by`), which a batch not yet
/// replayed is not.
pub fn read_appended(data: &Path, at: Appended, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(file_path(data, at.seq))?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, at.offset)?;
    Ok(buf)
}

/// A backup's database recovered from its data directory.
pub struct ReplicaOpen {
    pub db: Arc<Database>,
    /// Everything at or below this is in `db`, and nothing above it.
    pub cut: Ts,
    /// The primary's stream count the replica log named (None: no replica log was found).
    pub streams: Option<u32>,
    /// The point of the sealed replica log the directory still holds (`sealed`): a
    /// checkpoint is due at once, and the sealed log goes with it (`checkpoint_replica`).
    pub sealed: Option<Ts>,
    pub report: RecoveryReport,
    /// The directory lock (held while the backup runs).
    pub lock: std::fs::File,
}

/// Opens a backup's data directory: the newest checkpoint, then the replica log replayed
/// up to its cut (see the module notes). Leaves a checkpoint at the cut and no replica log.
pub fn open_replica(dir: &Path, workers: usize, storage: &Arc<dyn Storage>) -> Result<ReplicaOpen, LogError> {
    open_replica_upto(dir, workers, storage, None)
}

/// `open_replica`, with the cut at most `limit`: a failover's recovery point (everything
/// above it is discarded, docs/cluster.md). What lies above is dropped with the replica
/// log files, and counted in `report.log_txns_dropped_above_cut`.
pub fn open_replica_upto(
    dir: &Path,
    workers: usize,
    storage: &Arc<dyn Storage>,
    limit: Option<Ts>,
) -> Result<ReplicaOpen, LogError> {
    open_replica_inner(dir, workers, storage, limit, false, &[], None)
}

/// Where a failover cut an older epoch than the one a promotion recovers: batches of
/// epochs up to `epoch` hold commits that count only up to `point`.
///
/// A backup's replica log is cut at its followed epoch's point when its server starts
/// or follows in place. A node down through the failover away from that epoch and back
/// during the next one starts no server, so its log may still hold that epoch's batches
/// above the point: commits that failover discarded, which the other nodes cut. If such a
/// node is chosen, what it fetched of the next epoch follows them in its log; its
/// promotion replays neither them nor anything of theirs (docs/cluster.md, "A node that
/// missed an epoch").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochCut {
    pub epoch: Epoch,
    pub point: Ts,
}

/// `open_replica_upto(point)` for a node promoted at a failover's recovery point: it must
/// hold everything up to `point`; if it does not, the directory is refused before anything
/// in it is rewritten. With `older` (the cuts of the epochs between the one its directory
/// followed and the recovered one), a batch of epoch x is cut at the lowest point of the
/// cuts of epochs x and later too; a directory whose checkpoint or seal lies above the
/// lowest (it holds commits a failover discarded, and cannot be cut back) is refused.
pub fn open_replica_at(
    dir: &Path,
    workers: usize,
    storage: &Arc<dyn Storage>,
    point: Ts,
    older: &[EpochCut],
) -> Result<ReplicaOpen, LogError> {
    open_replica_inner(dir, workers, storage, Some(point), true, older, None)
}

/// An old primary's directory cut at a failover's recovery point `point`, to serve the
/// next epoch from (a failover's last resort, `ditto_cluster::TailReport::last_resort`):
/// as `open_replica_upto` cuts it for a rejoin, but refused, before anything in the
/// directory is rewritten, unless its own log reaches the point on every stream. (A
/// `replica/` left empty by an earlier try cut short is no matter.)
pub fn open_own_log_at(
    dir: &Path,
    workers: usize,
    storage: &Arc<dyn Storage>,
    point: Ts,
) -> Result<ReplicaOpen, LogError> {
    let t0 = Instant::now();
    let (lock, own_log) = lock_and_list_own_log(dir, storage, None)?;
    if own_log.segments.is_empty() {
        return Err(LogError::Corrupt {
            file: dir.join("log"),
            offset: 0,
            what: "no log segments of its own to cut".into(),
        });
    }
    for d in [replica_dir(dir), checkpoint::checkpoints_dir(dir)] {
        std::fs::create_dir_all(&d).map_err(|e| LogError::io(&d, e))?;
    }
    open_old_primary(dir, workers, storage, point, true, own_log, lock, t0)
}

/// `open_replica` of a directory whose lock the caller holds (`lock_replica_dir`): a
/// backup that replaced what it held with a checkpoint copy opens it without letting the
/// lock go between (another process could have opened the directory half replaced).
pub fn open_replica_locked(
    dir: &Path,
    workers: usize,
    storage: &Arc<dyn Storage>,
    lock: std::fs::File,
) -> Result<ReplicaOpen, LogError> {
    open_replica_inner(dir, workers, storage, None, false, &[], Some(lock))
}

/// Takes `dir`'s lock (unless `held`), finishes a seal a crash cut short, and lists the
/// primary's own log segments the directory holds (none for a backup's).
fn lock_and_list_own_log(
    dir: &Path,
    storage: &Arc<dyn Storage>,
    held: Option<std::fs::File>,
) -> Result<(std::fs::File, crate::recovery::LogDir), LogError> {
    let lock = match held {
        Some(l) => l,
        None => crate::lock_dir(dir)?,
    };
    crate::sealed::finish_seal(dir, &**storage)?;
    Ok((lock, crate::recovery::list_segments(dir)?))
}

fn open_replica_inner(
    dir: &Path,
    workers: usize,
    storage: &Arc<dyn Storage>,
    limit: Option<Ts>,
    require_limit: bool,
    older: &[EpochCut],
    held: Option<std::fs::File>,
) -> Result<ReplicaOpen, LogError> {
    let t0 = Instant::now();
    for d in [dir.to_path_buf(), replica_dir(dir), checkpoint::checkpoints_dir(dir)] {
        std::fs::create_dir_all(&d).map_err(|e| LogError::io(&d, e))?;
    }
    // An old primary that rejoins as a backup: its own log, cut at the failover's recovery
    // point (`limit`), becomes the backup's starting point (see `open_old_primary`).
    let (lock, own_log) = lock_and_list_own_log(dir, storage, held)?;
    if !own_log.segments.is_empty() {
        let Some(point) = limit.filter(|_| !require_limit) else {
            return Err(LogError::Corrupt {
                file: dir.join("log"),
                offset: 0,
                what: "this data directory holds a primary's log segments: a backup needs an empty \
                       directory, one it wrote itself, or an old primary's cut at a failover's recovery point"
                    .into(),
            });
        };
        return open_old_primary(dir, workers, storage, point, false, own_log, lock, t0);
    }
    // A cut an earlier open began and did not finish (a crash between its checkpoint at
    // the point and the removal of the files above it): it still applies, or what it
    // dropped would be replayed back.
    let mark = read_cut_mark(dir)?;
    let limit = match (mark, limit) {
        (Some(m), Some(l)) if require_limit && m < l => {
            return Err(LogError::Corrupt {
                file: dir.join(CUT_MARK_FILE),
                offset: 0,
                what: format!(
                    "asked to hold everything up to ts {}, but an earlier open began to cut this directory at ts {}",
                    l.0, m.0
                ),
            })
        }
        (Some(m), l) => Some(l.map_or(m, |l| l.min(m))),
        (None, l) => l,
    };
    // (A checkpoint at the point itself is this promotion's own, written before a crash
    // cut it short: the node chose this directory knowing what it held, `holding_now`.)
    let lowest = older.iter().min_by_key(|c| c.point).copied();
    let above = |b: crate::sealed::Base| b.ts > lowest.map_or(Ts(u64::MAX), |o| o.point) && Some(b.ts) != limit;
    if let Some(o) = lowest.filter(|_| crate::sealed::base(dir).is_ok_and(above)) {
        // Refused before anything is loaded or rewritten.
        return Err(LogError::Corrupt {
            file: dir.to_path_buf(),
            offset: 0,
            what: format!(
                "holds a checkpoint or a seal above ts {}, the point epoch {} was cut at: it holds commits that failover discarded and cannot be cut back there (its node copies the primary's data instead)",
                o.point.0, o.epoch.0
            ),
        });
    }
    // (With it, the check of a seal above the limit below serves `open_replica_upto`.)
    // A promotion's point below the directory's checkpoint: the checkpoint holds commits
    // the failover discarded, and a cut cannot go below it (it went to the checkpoint
    // instead, silently: the new primary would have served them). Refused before
    // anything is loaded or rewritten; its node copies the primary's data instead.
    if let (true, Some(l)) = (require_limit, limit) {
        if let Some(b) = crate::sealed::base(dir).ok().filter(|b| b.ts > l) {
            return Err(LogError::Corrupt {
                file: dir.to_path_buf(),
                offset: 0,
                what: format!(
                    "holds a checkpoint or a seal at ts {}, above the point ts {} it is asked to be cut at: it holds commits that failover discarded",
                    b.ts.0, l.0
                ),
            });
        }
    }
    let (db, mut report, base) = load_base_checkpoint(dir, workers)?;
    let t = Instant::now();
    // The sealed logs first (everything up to the last one's point), then the live one
    // above it.
    if let Some(s) = base.chain.last().filter(|s| limit.is_some_and(|l| l < s.point)) {
        return Err(LogError::Corrupt {
            file: s.dir.clone(),
            offset: 0,
            what: format!(
                "asked to cut at ts {}, below the point ts {} this directory was sealed at",
                limit.unwrap_or_default().0,
                s.point.0
            ),
        });
    }
    let ckpt_ts = crate::sealed::replay_chain(&db, &base, &mut report)?;
    let scan = scan(dir, ckpt_ts)?;
    report.log_bytes += scan.log_bytes;
    let mut cut = scan.cut();
    let whole = cut;
    if let Some(limit) = limit {
        if require_limit && cut < limit {
            return Err(LogError::Corrupt {
                file: replica_dir(dir),
                offset: 0,
                what: format!(
                    "asked to hold everything up to ts {}, but this replica log holds every stream only up to {} (per stream: {:?})",
                    limit.0, cut.0, scan.bounds
                ),
            });
        }
        cut = cut.min(limit.max(ckpt_ts));
    }
    report.cut_ts = cut;
    report.streams = scan.bounds.len();
    report.segments += scan.files.len();
    report.log_check_seconds = t.elapsed().as_secs_f64();
    let kept: Vec<Kept> = scan
        .kept
        .into_iter()
        .map(|(batch, i, offset)| {
            // (What this node fetched of the recovered epoch is cut at `cut`.)
            let upto = older.iter().filter(|c| c.epoch >= batch.header.epoch).map(|c| c.point).min();
            let upto = upto.unwrap_or(Ts(u64::MAX));
            Kept { batch, file: scan.files[i].1.as_path(), offset, upto }
        })
        .collect();
    // Above the backup's own checkpoint, a record id may have two lives
    // (`Database::recovery_log_begins`).
    db.recovery_log_begins();
    let (replayed, dropped) = replay_kept(&db, kept.iter().collect(), ckpt_ts, cut, recovery_threads())?;
    report.log_txns_replayed = replayed;
    report.log_txns_dropped_above_cut = dropped;
    report.log_seconds = t.elapsed().as_secs_f64();
    let ti = Instant::now();
    report.index_keys = db.recovery_finish(cut, recovery_threads()).map_err(LogError::Engine)?;
    report.index_seconds = ti.elapsed().as_secs_f64();
    db.publish_read_view(cut).map_err(LogError::Engine)?;
    // Everything recovered goes into a checkpoint, so the files can go (a torn tail with
    // them: it was never acknowledged; and what lies above a limit).
    // Cutting something off: said durably first (`CUT_MARK_FILE`), until it is gone.
    let marked = cut < whole && !scan.files.is_empty();
    if marked {
        write_cut_mark(dir, cut, &**storage)?;
    }
    if !scan.files.is_empty() || !base.chain.is_empty() {
        let info = checkpoint::write(
            &db,
            db.read(),
            dir,
            recovery_threads(),
            64 << 20,
            Epoch(0),
            &**storage,
            None,
            None,
            None,
        )?;
        report.checkpoint_write_seconds = info.seconds;
        report.checkpoint_written_bytes = info.bytes;
        for (_, p) in &scan.files {
            storage.remove(p).map_err(|e| LogError::io(p, e))?;
        }
        // Gone for good before anything later is made durable (a followed epoch written
        // next): back after a crash, files above a limit would be replayed at the next open.
        if !scan.files.is_empty() {
            let rdir = replica_dir(dir);
            storage.sync_dir(&rdir).map_err(|e| LogError::io(&rdir, e))?;
        }
        crate::remove_checkpoints_except(dir, &info.dir)?;
        crate::sealed::remove_sealed(dir, info.ts, &**storage)?;
    }
    if marked || mark.is_some() {
        remove_cut_mark(dir, &**storage)?;
    }
    report.total_seconds = t0.elapsed().as_secs_f64();
    Ok(ReplicaOpen { db, cut, streams: scan.streams, sealed: None, report, lock })
}

/// A new engine with `dir`'s tables and its newest checkpoint loaded (the report says
/// which, `checkpoint_ts`), and what the directory holds beneath what its node wrote since
/// its last change of role (`sealed::base`).
fn load_base_checkpoint(
    dir: &Path,
    workers: usize,
) -> Result<(Arc<Database>, RecoveryReport, crate::sealed::Base), LogError> {
    let catalog = Catalog::load(dir)?;
    let db = Database::new(Options { workers });
    for (id, name) in &catalog.tables {
        db.restore_table(*id, name);
    }
    let mut report = RecoveryReport::default();
    let base = crate::sealed::base(dir)?;
    if let Some((cdir, m)) = &base.ckpt {
        let t = Instant::now();
        let (rows, bytes) = checkpoint::load(&db, cdir, m, recovery_threads())?;
        report.checkpoint_ts = Some(m.ts);
        report.checkpoint_rows = rows;
        report.checkpoint_bytes = bytes;
        report.checkpoint_seconds = t.elapsed().as_secs_f64();
    }
    Ok((db, report, base))
}

/// Where what `dir` holds beneath its live log begins: its newest checkpoint's or seal's
/// timestamp (0 if none).
pub fn base_ts(dir: &Path) -> Result<Ts, LogError> {
    Ok(crate::sealed::base(dir)?.ts)
}

/// The timestamp of `dir`'s newest checkpoint, if it has one (a seal above it is not
/// counted: `base_ts` counts both).
pub fn newest_checkpoint_ts(dir: &Path) -> Result<Option<Ts>, LogError> {
    Ok(crate::sealed::base(dir)?.ckpt.map(|(_, m)| m.ts))
}

/// Whether an old primary's directory can be cut at `point`: its newest checkpoint and
/// its seal, if any, are at or below it. A primary's checkpoint holds what its engine had,
/// commits above a later recovery point included, so one above the point cannot be cut
/// back to it: that node copies the new primary's data instead.
pub fn can_cut_at(dir: &Path, point: Ts) -> Result<bool, LogError> {
    Ok(crate::sealed::base(dir)?.ts <= point)
}

/// An old primary's directory opened as a backup's, cut at `point` (a failover's recovery
/// point for the epoch its log holds): the newest checkpoint, its sealed logs if it changed
/// role in place, then its own log replayed up to the lower of its durable cut and the
/// point; everything above is dropped (its own count of what it discards was taken before,
/// `primary_log_holdings`). Its own log is then sealed at the cut as the chain's newest
/// link (`sealed::seal_own_log`: a cut file and two renames), and the backup's next
/// checkpoint (its policy's, the chain's bytes counted) takes the chain away; a crash at
/// any step leaves either the
/// old directory, which the next open cuts the same way, or a backup's directory holding
/// the cut. With the chain full, the result is written as a checkpoint at the cut instead,
/// and only then are the log's segments (and the sealed logs, and older checkpoints)
/// removed.
///
/// This is the rejoin of an old primary without copying the new primary's data: every
/// commit at or below the point is the same on both (the new primary holds exactly the
/// old epoch's history up to it), and a log whose durable cut lies below the point (it
/// shipped batches it had not yet made durable) is sent the rest by the new primary, as a
/// backup behind the point is.
#[allow(clippy::too_many_arguments)]
fn open_old_primary(
    dir: &Path,
    workers: usize,
    storage: &Arc<dyn Storage>,
    point: Ts,
    require_point: bool,
    own_log: crate::recovery::LogDir,
    lock: std::fs::File,
    t0: Instant,
) -> Result<ReplicaOpen, LogError> {
    let rdir = replica_dir(dir);
    if rdir.exists() && std::fs::read_dir(&rdir).map_err(|e| LogError::io(&rdir, e))?.next().is_some() {
        return Err(LogError::Corrupt {
            file: rdir,
            offset: 0,
            what: "holds both a primary's log segments and a live replica log".into(),
        });
    }
    if !can_cut_at(dir, point)? {
        return Err(LogError::Corrupt {
            file: dir.to_path_buf(),
            offset: 0,
            what: format!(
                "holds a checkpoint or a seal above the recovery point ts {}: it cannot be cut there (its node copies the primary's data instead)",
                point.0
            ),
        });
    }
    let (db, mut report, base) = load_base_checkpoint(dir, workers)?;
    let epoch_min = base.ckpt.as_ref().map_or(Epoch(0), |(_, m)| m.log_epoch_min);
    let ckpt_ts = crate::sealed::replay_chain(&db, &base, &mut report)?;
    let t = Instant::now();
    let cut = crate::recovery::replay_log(
        &db,
        &own_log.segments,
        epoch_min,
        ckpt_ts,
        Some(point),
        &mut report,
        false,
        false,
    )?
    .max(ckpt_ts)
    .min(point.max(ckpt_ts));
    report.log_seconds = t.elapsed().as_secs_f64();
    if require_point && cut < point {
        // Refused before anything in the directory is rewritten.
        return Err(LogError::Corrupt {
            file: dir.join("log"),
            offset: 0,
            what: format!("its own log holds every stream only up to ts {}, below the point ts {}", cut.0, point.0),
        });
    }
    let ti = Instant::now();
    report.index_keys = db.recovery_finish(cut, recovery_threads()).map_err(LogError::Engine)?;
    report.index_seconds = ti.elapsed().as_secs_f64();
    db.publish_read_view(cut).map_err(LogError::Engine)?;
    // Nothing more refuses it: its torn tails are cut (before it is sealed, whose replay
    // takes a torn tail for damage) and its unfinished segments removed.
    crate::recovery::cut_torn_tails(&report, &**storage)?;
    for p in &own_log.unfinished {
        storage.remove(p).map_err(|e| LogError::io(p, e))?;
    }
    let logdir = dir.join("log");
    if crate::sealed::can_seal(dir)? {
        // Its own log, cut at `cut`, becomes the chain's newest link: nothing is written but
        // a cut file and two renames, and the backup's next checkpoint (in the background,
        // when its policy says: `sealed::CHECKPOINT_AT_LINKS`) takes the chain away. Before, the whole engine was written here,
        // unpaced, before the node could join.
        storage.sync_dir(&logdir).map_err(|e| LogError::io(&logdir, e))?;
        crate::sealed::seal_own_log(dir, cut, &**storage)?;
        std::fs::create_dir_all(&rdir).map_err(|e| LogError::io(&rdir, e))?;
        report.cut_ts = cut;
        report.total_seconds = t0.elapsed().as_secs_f64();
        return Ok(ReplicaOpen { db, cut, streams: None, sealed: Some(cut), report, lock });
    }
    // A full chain: the engine is written as a checkpoint at the cut, and the rest goes.
    let info =
        checkpoint::write(&db, db.read(), dir, recovery_threads(), 64 << 20, Epoch(0), &**storage, None, None, None)?;
    report.checkpoint_write_seconds = info.seconds;
    report.checkpoint_written_bytes = info.bytes;
    for s in &own_log.segments {
        storage.remove(&s.path).map_err(|e| LogError::io(&s.path, e))?;
    }
    storage.sync_dir(&logdir).map_err(|e| LogError::io(&logdir, e))?;
    crate::remove_checkpoints_except(dir, &info.dir)?;
    crate::sealed::remove_sealed(dir, info.ts, &**storage)?;
    std::fs::create_dir_all(&rdir).map_err(|e| LogError::io(&rdir, e))?;
    report.cut_ts = cut;
    report.total_seconds = t0.elapsed().as_secs_f64();
    Ok(ReplicaOpen { db, cut, streams: None, sealed: None, report, lock })
}

/// Takes a backup's data directory's lock (creating the directory if need be) without
/// opening what it holds: a backup that joins again with a fresh copy of its primary's
/// checkpoint replaces it all once the copy is whole.
pub fn lock_replica_dir(dir: &Path) -> Result<std::fs::File, LogError> {
    std::fs::create_dir_all(dir).map_err(|e| LogError::io(dir, e))?;
    crate::lock_dir(dir)
}

/// Opens a backup's data directory with an engine kept from before (a cluster backup that
/// follows the next epoch's primary in place: `ditto_replication::Backup::cut_at`, then
/// `sealed::seal_tail` or `seal_at_point`): the directory must hold what the engine holds
/// (a replica log sealed at its read view, or a checkpoint there) and no live replica log,
/// and nothing is loaded. Refused otherwise, changing nothing.
pub fn open_replica_with(dir: &Path, db: Arc<Database>) -> Result<ReplicaOpen, LogError> {
    let refuse = |what: String| LogError::Corrupt { file: dir.to_path_buf(), offset: 0, what };
    let lock = crate::lock_dir(dir)?;
    if !crate::recovery::list_segments(dir)?.segments.is_empty() {
        return Err(refuse("this data directory holds a primary's log segments".into()));
    }
    crate::check_engine_at_base(dir, &db)?;
    let view = db.clock().visible_ts();
    let rdir = replica_dir(dir);
    if !crate::sealed::replica_is_sealed(dir)
        && rdir.exists()
        && std::fs::read_dir(&rdir).map_err(|e| LogError::io(&rdir, e))?.next().is_some()
    {
        return Err(refuse("given an engine, but the directory still holds a replica log".into()));
    }
    let sealed = crate::sealed::sealed(dir)?.last().map(|s| s.point);
    Ok(ReplicaOpen { db, cut: view, streams: None, sealed, report: RecoveryReport::default(), lock })
}

/// What a backup's data directory holds, read without changing it (a failover's tail
/// report, docs/cluster.md): per primary stream, every batch up to this timestamp is held
/// (its highest bound, the highest trusted floor, the checkpoint); the newest timestamp
/// held at all; and how many transactions lie above `above` (when given: counting
/// decodes those batches).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaHoldings {
    pub streams: Vec<Ts>,
    pub newest: Ts,
    /// Transactions above the `above` timestamp asked for (0 when none was).
    pub txns_above: u64,
    /// What `open_replica` would cut at.
    pub cut: Ts,
}

/// Reads what `dir` holds (see [`ReplicaHoldings`]); the files are fsynced first, so what
/// a process that was stopped had written is durable before it is reported. If no file
/// changed since the last call read this directory (same files, inodes, lengths and
/// modification times, same checkpoint or seal), what that call read is used, and
/// only the entries above `above` are read again. `streams` is
/// the primary's stream count, used when a checkpoint but no replica log file is found; a
/// directory holding nothing reports no stream. The directory must not be in use by a
/// running backup.
pub fn replica_holdings(dir: &Path, streams: usize, above: Option<Ts>) -> Result<ReplicaHoldings, LogError> {
    // A sealed log holds every stream up to its point, as a checkpoint there would.
    let ckpt_ts = crate::sealed::base(dir)?.ts;
    let files = live_files(dir)?;
    let states = file_states(files.iter().map(|(_, p)| p.as_path()))?;
    // A failover's report and then its prepare's check read the same fenced directory:
    // the second reads nothing again if no file changed since (on 16 cores with 1.9M keys
    // the second read took 150 ms, its fsyncs 65 ms of it behind a cancelled
    // checkpoint's write-back).
    let cached = LAST_HELD
        .lock()
        .as_ref()
        .filter(|h| h.dir == dir && h.ckpt_ts == ckpt_ts && h.streams_asked == streams && h.states == states)
        .cloned();
    let held = match cached {
        Some(h) => h,
        None => {
            let h = read_held(dir, streams, ckpt_ts, files, states)?;
            *LAST_HELD.lock() = Some(h.clone());
            h
        }
    };
    let mut txns_above = 0;
    if let Some(above) = above {
        let mut scratch = Vec::new();
        // Counting decodes the payload: only when asked, and only above the point.
        for k in held.entries.iter().filter(|k| k.header.last_ts > above) {
            let (path, batch) = read_entry(&held.files, k)?;
            txns_above += crate::recovery::count_txns_above(&batch, above, ckpt_ts, &mut scratch)
                .map_err(|e| LogError::Corrupt { file: path.to_path_buf(), offset: k.offset, what: e.to_string() })?;
        }
    }
    Ok(ReplicaHoldings { streams: held.streams, newest: held.newest, txns_above, cut: held.cut })
}

/// Makes what the files hold durable (their data and length: `fdatasync`), then their
/// directory (`dir`, if they are any). A report fsyncs what a stopped server wrote; where
/// that server had synced it already, this commits nothing. (`fsync` would commit the
/// files' modification times too: a journal commit, which on 16 cores with 1.9M keys waited
/// 65 ms behind a cancelled checkpoint's write-back.)
pub(crate) fn sync_data_and_dir<'a>(files: impl Iterator<Item = &'a Path>, dir: &Path) -> Result<(), LogError> {
    let mut any = false;
    for p in files {
        let f = std::fs::File::open(p).map_err(|e| LogError::io(p, e))?;
        f.sync_data().map_err(|e| LogError::io(p, e))?;
        any = true;
    }
    if any {
        crate::storage::sync_dir(dir).map_err(|e| LogError::io(dir, e))?;
    }
    Ok(())
}

/// What `replica_holdings` read last, and the state of the files it read then.
static LAST_HELD: parking_lot::Mutex<Option<Held>> = parking_lot::Mutex::new(None);

/// Forgets what `replica_holdings` and `recovery::primary_log_holdings` read last: a
/// process that lets a writer into a directory (a node starting its server, or adding
/// fetched batches) calls it, so that a write in the same clock tick as the last read's
/// look at the files, which a coarse file time would not show, is never missed.
pub fn forget_holdings() {
    *LAST_HELD.lock() = None;
    let (mut cache, mut older) = (VERIFIED.lock(), OLDER.lock());
    VERIFIED_GEN.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    *cache = None;
    *older = None;
    crate::recovery::forget_primary_holdings();
}

/// A log file as `replica_holdings` found it: its path, inode, length,
/// and modification and change times. A backup only appends to, truncates, creates or
/// removes these files, and each of those changes one of them; any write changes the
/// change time, which no process can set back.
pub(crate) type FileState = (PathBuf, u64, u64, (i64, i64), (i64, i64));

pub(crate) fn file_states<'a>(files: impl Iterator<Item = &'a Path>) -> Result<Vec<FileState>, LogError> {
    use std::os::unix::fs::MetadataExt;
    files
        .map(|p| {
            let m = std::fs::metadata(p).map_err(|e| LogError::io(p, e))?;
            Ok((p.to_path_buf(), m.ino(), m.len(), (m.mtime(), m.mtime_nsec()), (m.ctime(), m.ctime_nsec())))
        })
        .collect()
}

/// What a directory's replica log holds (`replica_holdings`), read once its files were
/// fsynced: every entry with transactions above the checkpoint is kept as a header, for
/// counting what lies above a point.
#[derive(Clone)]
struct Held {
    dir: PathBuf,
    ckpt_ts: Ts,
    /// The stream count asked with (used when a checkpoint but no file is found).
    streams_asked: usize,
    states: Vec<FileState>,
    files: Vec<(u64, PathBuf)>,
    streams: Vec<Ts>,
    newest: Ts,
    cut: Ts,
    entries: Vec<KeptHeader>,
}

fn read_held(
    dir: &Path,
    streams: usize,
    ckpt_ts: Ts,
    files: Vec<(u64, PathBuf)>,
    states: Vec<FileState>,
) -> Result<Held, LogError> {
    let t = Instant::now();
    sync_data_and_dir(files.iter().map(|(_, p)| p.as_path()), &replica_dir(dir))?;
    let synced = t.elapsed();
    let nfiles = files.len();
    let scan = {
        let _one = LOOKING.lock();
        scan_headers(files, ckpt_ts)?
    };
    // A failover waits for this (a report, or a prepare's check): where its time went.
    if t.elapsed() > std::time::Duration::from_millis(20) {
        tracing::info!(
            "{}: holdings read in {:.1} ms ({nfiles} files fsynced in {:.1} ms)",
            replica_dir(dir).display(),
            t.elapsed().as_secs_f64() * 1e3,
            synced.as_secs_f64() * 1e3
        );
    }
    let cut = scan.cut();
    let mut bounds = scan.bounds.clone();
    if bounds.is_empty() && ckpt_ts > Ts::ZERO {
        // A checkpoint (or a sealed log) and no replica log file (a running backup always
        // has one, naming the primary's streams): every stream is held up to it.
        bounds = vec![Ts::ZERO; streams];
    }
    let held: Vec<Ts> = bounds.iter().map(|b| held_up_to(*b, scan.floor, ckpt_ts)).collect();
    let mut newest = held.iter().copied().max().unwrap_or(ckpt_ts);
    let HeaderScan { files, kept_headers, .. } = scan;
    for k in &kept_headers {
        newest = newest.max(k.header.last_ts);
    }
    Ok(Held {
        dir: dir.to_path_buf(),
        ckpt_ts,
        streams_asked: streams,
        states,
        files,
        streams: held,
        newest,
        cut,
        entries: kept_headers,
    })
}

/// An entry of an older file that a header scan kept (its payload not read).
#[derive(Clone)]
struct KeptHeader {
    header: crate::format::BatchHeader,
    file: usize,
    /// Of the entry header.
    offset: u64,
    /// Of the batch (the entry header not counted).
    len: usize,
}

/// What `scan_headers` found: a `Scan` of the newest file, with the older files' entries
/// merged into its bounds and floor, and kept as headers.
struct HeaderScan {
    files: Vec<(u64, PathBuf)>,
    bounds: Vec<Ts>,
    floor: Ts,
    ckpt_ts: Ts,
    /// Every file's entries with transactions above the checkpoint.
    kept_headers: Vec<KeptHeader>,
}

impl HeaderScan {
    fn cut(&self) -> Ts {
        cut_of(&self.bounds, self.floor, self.ckpt_ts)
    }
}

/// A file's header (`n` streams, sequence `hseq`, named `seq`) against the files before it:
/// the first one's stream count is taken (and `bounds` sized by it), the others' must
/// match.
fn take_file_header(
    n: u32,
    hseq: u64,
    seq: u64,
    streams: &mut Option<u32>,
    bounds: &mut Vec<Ts>,
) -> Result<(), String> {
    if hseq != seq {
        return Err("header does not match the file name".into());
    }
    match *streams {
        None => {
            *streams = Some(n);
            *bounds = vec![Ts::ZERO; n as usize];
        }
        Some(m) if m != n => return Err(format!("names {n} primary streams, an earlier file {m}")),
        Some(_) => {}
    }
    Ok(())
}

/// Where a stream with highest bound `bound` is held up to, in a log with the highest
/// trusted `floor` on a checkpoint at `ckpt_ts`: what a report says (`replica_holdings`)
/// and what a fetch's read must reach (`replica_stream_batches_each`).
fn held_up_to(bound: Ts, floor: Ts, ckpt_ts: Ts) -> Ts {
    bound.max(floor).max(ckpt_ts)
}

/// Where a log lies on `ckpt_ts` with per-stream `bounds` and the highest trusted `floor`,
/// recovery cuts: every stream is held up to it.
fn cut_of(bounds: &[Ts], floor: Ts, ckpt_ts: Ts) -> Ts {
    bounds.iter().map(|b| (*b).max(ckpt_ts)).min().unwrap_or(ckpt_ts).max(floor).max(ckpt_ts)
}

/// One entry read whole and checked (a kept header's).
fn read_entry<'f>(files: &'f [(u64, PathBuf)], k: &KeptHeader) -> Result<(&'f Path, Batch), LogError> {
    read_entry_framed(files, k).map(|(path, _, batch)| (path, batch))
}

/// `read_entry`, with the batch as framed too.
fn read_entry_framed<'f>(files: &'f [(u64, PathBuf)], k: &KeptHeader) -> Result<(&'f Path, Bytes, Batch), LogError> {
    use std::os::unix::fs::FileExt;
    let path = files[k.file].1.as_path();
    let f = std::fs::File::open(path).map_err(|e| LogError::io(path, e))?;
    let mut buf = vec![0u8; k.len];
    f.read_exact_at(&mut buf, k.offset + ENTRY_HEADER_LEN as u64).map_err(|e| LogError::io(path, e))?;
    let raw = Bytes::from(buf);
    let (batch, _) = decode_batch_checksums(&raw).map_err(|e| LogError::Corrupt {
        file: path.to_path_buf(),
        offset: k.offset,
        what: e.to_string(),
    })?;
    Ok((path, raw, batch))
}

/// The replica log files read for a report (`replica_holdings`), entry header by entry
/// header: every entry's own checksum and its batch header's are checked, the newest file
/// is read and checked whole (a torn tail can be only there: the older files were synced
/// before the next was begun), and the batch that carries the highest trusted floor is
/// read whole too (its floor is covered by its payload checksum). The other payloads are
/// not read; recovery checks every byte (`scan`). A report after a fast load reads a few
/// MB instead of hundreds (docs/cluster.md).
fn scan_headers(mut files: Vec<(u64, PathBuf)>, ckpt_ts: Ts) -> Result<HeaderScan, LogError> {
    let Some(newest) = files.pop() else {
        return Ok(HeaderScan { files, bounds: Vec::new(), floor: Ts::ZERO, ckpt_ts, kept_headers: Vec::new() });
    };
    let tail = scan_newest(&newest, false)?;
    // The older files' streams and bounds (merged with the newest file's below).
    let mut streams: Option<u32> = None;
    let mut bounds: Vec<Ts> = Vec::new();
    let older = files.len();
    let mut kept_headers = Vec::new();
    // The highest floor an older file's trusted entry names, and where (checked below).
    let mut floor_at: Option<(Ts, KeptHeader)> = None;
    for (i, file) in files.iter().enumerate() {
        let o = scan_older(file)?;
        take_file_header(o.streams, file.0, file.0, &mut streams, &mut bounds).map_err(|what| LogError::Corrupt {
            file: file.1.clone(),
            offset: 0,
            what,
        })?;
        for (b, f) in bounds.iter_mut().zip(&o.bounds) {
            *b = (*b).max(*f);
        }
        if let Some((f, k)) = &o.floor_at {
            if floor_at.as_ref().is_none_or(|(g, _)| f > g) {
                floor_at = Some((*f, KeptHeader { file: i, ..k.clone() }));
            }
        }
        kept_headers.extend(
            o.entries
                .iter()
                .filter(|k| k.header.txn_count > 0 && k.header.last_ts > ckpt_ts)
                .map(|k| KeptHeader { file: i, ..k.clone() }),
        );
    }
    if let Some(dir) = newest.1.parent() {
        forget_older_than(dir, &files);
    }
    match (streams, tail.streams) {
        (Some(m), Some(n)) if m != n => {
            return Err(LogError::Corrupt {
                file: newest.1.clone(),
                offset: 0,
                what: format!("names {n} primary streams, an earlier file {m}"),
            })
        }
        (None, _) => bounds = tail.bounds.clone(),
        _ => {
            for (b, t) in bounds.iter_mut().zip(&tail.bounds) {
                *b = (*b).max(*t);
            }
        }
    }
    let mut floor = tail.floor;
    if let Some((f, k)) = floor_at.filter(|(f, _)| *f > floor) {
        // Trusted only once its payload checksum, which covers it, is checked.
        read_entry(&files, &k)?;
        floor = f;
    }
    files.push(newest);
    kept_headers.extend(
        tail.entries
            .iter()
            .filter(|k| k.header.txn_count > 0 && k.header.last_ts > ckpt_ts)
            .map(|k| KeptHeader { file: older, ..k.clone() }),
    );
    Ok(HeaderScan { files, bounds, floor, ckpt_ts, kept_headers })
}

/// What `scan_newest` verified of a replica log file, so that the next look reads only
/// what was appended since: the file's identity, the end of its last whole, checked entry,
/// and what the entries up to there gave.
#[derive(Clone)]
struct Verified {
    ino: u64,
    born: std::time::SystemTime,
    /// The end of the verified entries (the file may be longer: an entry being written).
    len: u64,
    /// None: a file cut short in its header (it holds nothing).
    streams: Option<u32>,
    /// The file's format version (`REPLICA_FORMAT_VERSION` where it holds nothing).
    version: u32,
    bounds: Vec<Ts>,
    floor: Ts,
    /// Every verified entry (file index 0).
    entries: Vec<KeptHeader>,
}

/// Per file, what `scan_newest` verified of it (`forget_holdings` empties it).
static VERIFIED: parking_lot::Mutex<Option<std::collections::HashMap<PathBuf, Arc<Verified>>>> =
    parking_lot::Mutex::new(None);
/// Bumped by `forget_holdings`: a look begun before is not kept.
static VERIFIED_GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The newest replica log file read and checked entry by entry, as `scan_files` reads it
/// (each entry's header and payload checksums; a torn tail ends it), but from where the
/// last look at the same file stopped: a backup only appends to its newest file, so what
/// was checked stays as it was while the file is the same one (its inode and birth time)
/// and no shorter. The entry before that point is checked again. A report right after a
/// load read 100+ MB here whole (161-244 ms on the 2-core VM with 1.9M keys), on a
/// failover's path; `warm_holdings` keeps it read ahead while the backup runs. `quiet`:
/// an entry cut short is one being written (a running backup's), not worth a warning.
fn scan_newest(newest: &(u64, PathBuf), quiet: bool) -> Result<Arc<Verified>, LogError> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let (seq, path) = newest;
    let corrupt = |offset: u64, what: String| LogError::Corrupt { file: path.clone(), offset, what };
    let generation = VERIFIED_GEN.load(std::sync::atomic::Ordering::Acquire);
    let f = std::fs::File::open(path).map_err(|e| LogError::io(path, e))?;
    let m = f.metadata().map_err(|e| LogError::io(path, e))?;
    let (ino, size) = (m.ino(), m.len());
    // A size no replica log file can have is damaged: refused before what lies past the
    // last look is read whole (as `read_files` refuses it; before 2026-12-06 this look, a
    // running backup's now and then and a failover's report, allocated it, found by a
    // review).
    let max = crate::options::LOG_FILE_BYTES_MAX;
    if size > max {
        return Err(crate::options::too_long(path, size, max, "a replica log file"));
    }
    // Without a birth time the file's identity is not sure: read whole each time.
    let born = m.created().ok();
    let cached = born.and_then(|born| {
        // Taken out while it is read on (put back below): no copy of its entries.
        let v = VERIFIED.lock().as_mut()?.remove(path)?;
        let v = Arc::try_unwrap(v).unwrap_or_else(|v| (*v).clone());
        (v.ino == ino && v.born == born && v.len <= size).then_some(v)
    });
    // The last verified entry still reads the same, its entry header included (a file cut
    // and written again would not). What lies before it is trusted as read: a backup only
    // appends to its newest file, and whatever cuts one (a server's recovery, a fetch's
    // append) is let in only after `forget_holdings`.
    let cached = cached.filter(|v| match v.entries.last() {
        Some(k) => {
            let mut eh = [0u8; ENTRY_HEADER_LEN];
            let same_entry = f.read_exact_at(&mut eh, k.offset).is_ok()
                && u32::from_le_bytes(eh[..4].try_into().expect("4")) as usize == k.len
                && u32::from_le_bytes(eh[8..12].try_into().expect("4")) == crc32c::crc32c(&eh[..8]);
            same_entry
                && read_entry(&[(*seq, path.clone())], &KeptHeader { file: 0, ..k.clone() })
                    .is_ok_and(|(_, b)| b.header == k.header)
        }
        None => true,
    });
    let mut v = match cached {
        Some(v) => v,
        None => {
            let mut head = [0u8; REPLICA_HEADER_LEN];
            // A crash while its header was written: it holds nothing (as `scan_files`
            // reads it: no more than a header's bytes, and not a whole one).
            let nothing = || {
                Ok(Arc::new(Verified {
                    ino,
                    born: born.unwrap_or(std::time::UNIX_EPOCH),
                    len: 0,
                    streams: None,
                    version: REPLICA_FORMAT_VERSION,
                    bounds: Vec::new(),
                    floor: Ts::ZERO,
                    entries: Vec::new(),
                }))
            };
            if size < REPLICA_HEADER_LEN as u64 {
                return nothing();
            }
            f.read_exact_at(&mut head, 0).map_err(|e| LogError::io(path, e))?;
            let fh = match decode_header(&head) {
                Ok(h) => h,
                Err(_) if size == REPLICA_HEADER_LEN as u64 => return nothing(),
                Err(e) => return Err(corrupt(0, e)),
            };
            let (mut streams, mut bounds) = (None, Vec::new());
            take_file_header(fh.streams, fh.seq, *seq, &mut streams, &mut bounds).map_err(|e| corrupt(0, e))?;
            Verified {
                ino,
                born: born.unwrap_or(std::time::UNIX_EPOCH),
                len: REPLICA_HEADER_LEN as u64,
                streams: Some(fh.streams),
                version: fh.version,
                bounds,
                floor: Ts::ZERO,
                entries: Vec::new(),
            }
        }
    };
    let mut raw = vec![0u8; (size - v.len) as usize];
    f.read_exact_at(&mut raw, v.len).map_err(|e| LogError::io(path, e))?;
    let raw = Bytes::from(raw);
    let mut off = 0usize;
    while off < raw.len() {
        match decode_entry(&raw, off, v.version) {
            Ok((batch, flags, used)) => {
                let h = &batch.header;
                let s = h.stream.0 as usize;
                if s >= v.bounds.len() {
                    return Err(corrupt(
                        v.len + off as u64,
                        format!("batch of stream {s}, of {} streams", v.bounds.len()),
                    ));
                }
                v.bounds[s] = v.bounds[s].max(h.bound_ts);
                if flags & FLOOR_TRUSTED != 0 {
                    v.floor = v.floor.max(h.floor_ts);
                }
                v.entries.push(KeptHeader {
                    header: *h,
                    file: 0,
                    offset: v.len + off as u64,
                    len: used - ENTRY_HEADER_LEN,
                });
                off += used;
            }
            // The tail of the newest file may be torn (never acknowledged), or, in a running
            // backup's, being written; a valid entry after it is damage.
            Err(e) => {
                let Some(after) = torn_entries_after(&raw, off, v.len, v.version) else {
                    return Err(corrupt(v.len + off as u64, format!("{e}, with valid entries after it")));
                };
                if !quiet {
                    let (at, after) = (v.len + off as u64, crate::format::cut_along(after, "entry", "entries"));
                    tracing::warn!("{}: torn tail at offset {at} ({e}){after}; dropped", path.display());
                }
                break;
            }
        }
    }
    v.len += off as u64;
    let v = Arc::new(v);
    let mut cache = VERIFIED.lock();
    if born.is_some() && VERIFIED_GEN.load(std::sync::atomic::Ordering::Acquire) == generation {
        // (Only the newest file of a directory is looked at again: one entry per directory.)
        let cache = cache.get_or_insert_with(Default::default);
        cache.retain(|p, _| p.parent() != path.parent());
        cache.insert(path.clone(), Arc::clone(&v));
    }
    Ok(v)
}

/// What `scan_file_headers` read of an older replica log file (one the backup no longer
/// appends to), kept while the file is the same (inode, birth and change times, length):
/// a report reads only the files that are new since the last look.
#[derive(Clone)]
struct Older {
    state: (u64, std::time::SystemTime, (i64, i64), u64),
    streams: u32,
    bounds: Vec<Ts>,
    floor_at: Option<(Ts, KeptHeader)>,
    /// Every entry with transactions (file index 0).
    entries: Vec<KeptHeader>,
}

/// Per older file, what `scan_older` read of it (`forget_holdings` empties it).
static OLDER: parking_lot::Mutex<Option<std::collections::HashMap<PathBuf, Arc<Older>>>> =
    parking_lot::Mutex::new(None);

/// Drops what `scan_older` kept of `rdir`'s files that are no longer among `files` (a
/// checkpoint removed them).
fn forget_older_than(rdir: &Path, files: &[(u64, PathBuf)]) {
    if let Some(cache) = OLDER.lock().as_mut() {
        cache.retain(|p, _| p.parent() != Some(rdir) || files.iter().any(|(_, f)| f == p));
    }
}

/// An older file read header by header (`scan_file_headers`), or what an earlier read of
/// the same file found.
fn scan_older(file: &(u64, PathBuf)) -> Result<Arc<Older>, LogError> {
    use std::os::unix::fs::MetadataExt;
    let (seq, path) = file;
    let generation = VERIFIED_GEN.load(std::sync::atomic::Ordering::Acquire);
    let m = std::fs::metadata(path).map_err(|e| LogError::io(path, e))?;
    let born = m.created().ok();
    let state = born.map(|b| (m.ino(), b, (m.ctime(), m.ctime_nsec()), m.len()));
    if let Some(o) = state.and_then(|st| OLDER.lock().as_ref()?.get(path).filter(|o| o.state == st).cloned()) {
        return Ok(o);
    }
    let (mut streams, mut bounds, mut floor_at, mut entries) = (None, Vec::new(), None, Vec::new());
    // (Only entries with transactions are ever looked at again: the rest are not kept.)
    scan_file_headers(0, *seq, path, &mut streams, &mut bounds, &mut floor_at, |k| {
        if k.header.txn_count > 0 {
            entries.push(k)
        }
    })?;
    let o = Arc::new(Older {
        state: state.unwrap_or((0, std::time::UNIX_EPOCH, (0, 0), 0)),
        streams: streams.unwrap_or(0),
        bounds,
        floor_at,
        entries,
    });
    let mut cache = OLDER.lock();
    if state.is_some() && VERIFIED_GEN.load(std::sync::atomic::Ordering::Acquire) == generation {
        cache.get_or_insert_with(Default::default).insert(path.clone(), Arc::clone(&o));
    }
    Ok(o)
}

/// One entry of a replica log file of format `version` at `off` of `raw`: the batch
/// (payload checked), its flags, and the bytes it takes with its entry header.
fn decode_entry(raw: &Bytes, off: usize, version: u32) -> Result<(Batch, u8, usize), String> {
    let rest = &raw[off..];
    if rest.len() < ENTRY_HEADER_LEN {
        return Err("entry header cut short".into());
    }
    let len = u32::from_le_bytes(rest[..4].try_into().expect("4")) as usize;
    let flags = rest[4];
    let crc = u32::from_le_bytes(rest[8..12].try_into().expect("4"));
    if crc != crc32c::crc32c(&rest[..8]) || !entry_header_fields_ok(&rest[..8], version) {
        return Err("entry header checksum mismatch".into());
    }
    if rest.len() < ENTRY_HEADER_LEN + len {
        return Err(format!("entry of {len} bytes cut short"));
    }
    let body = raw.slice(off + ENTRY_HEADER_LEN..off + ENTRY_HEADER_LEN + len);
    let (batch, used) = decode_batch_checksums(&body).map_err(|e| e.to_string())?;
    if used != len {
        return Err(format!("entry of {len} bytes holds a batch of {used}"));
    }
    Ok((batch, flags, ENTRY_HEADER_LEN + len))
}

/// Whether an entry header's flags and synced claim are ones format `version` writes
/// (its checksum aside).
fn entry_header_fields_ok(h: &[u8], version: u32) -> bool {
    h[4] & !FLOOR_TRUSTED == 0 && (version >= ENTRY_SYNCED_VERSION || h[5..8] == [0, 0, 0])
}

/// None if the failed entry at `off` of a newest file of format `version` is damage rather
/// than a torn write, else how many whole entries after it it cuts with it (`raw` is the
/// file from offset `base` on). Damage: a whole valid entry (its
/// header's checksum, its batch's) after it claims that the failed entry's bytes had been
/// synced (format 2), or any whole valid entry follows it (format 1, whose entries claim
/// nothing). A power cut keeps only what was synced whole, and of a write not yet synced
/// any of its pages (a backup writes a burst of entries in one write before one fsync):
/// entries after the failure that claim no more synced than what lies before it are of
/// the same unsynced write, never acknowledged, and the tail is cut there. One that claims
/// more means bytes that were durable changed: acknowledged entries would be dropped as
/// torn. Looked for past the failed entry's own bytes where its header checks out (inside
/// them lies a client's data, which may hold an entry's bytes), else from the next byte.
fn torn_entries_after(raw: &Bytes, off: usize, base: u64, version: u32) -> Option<u32> {
    let rest = &raw[off..];
    let header_ok = |h: &[u8]| {
        h.len() >= ENTRY_HEADER_LEN && u32::from_le_bytes(h[8..12].try_into().expect("4")) == crc32c::crc32c(&h[..8])
    };
    let failed_at = base + off as u64;
    let mut p = match header_ok(rest) {
        true => off.saturating_add(ENTRY_HEADER_LEN + u32::from_le_bytes(rest[..4].try_into().expect("4")) as usize),
        false => off + 1,
    };
    if raw.get(p..).is_none_or(|t| t.iter().all(|&b| b == 0)) {
        return Some(0);
    }
    let mut whole_after = 0;
    while p + ENTRY_HEADER_LEN <= raw.len() {
        if header_ok(&raw[p..]) {
            if let Ok((_, _, used)) = decode_entry(raw, p, version) {
                // (An entry claims at most its own offset: one that claims more is a
                // client's value holding an entry's bytes, and proves nothing.)
                let claim = entry_synced(&raw[p..]);
                let claims = version >= ENTRY_SYNCED_VERSION;
                if claims && claim > base + p as u64 {
                    p += 1;
                    continue;
                }
                if !claims || claim > failed_at {
                    return None;
                }
                // Of the same unsynced write: it vouches for nothing before it.
                whole_after += 1;
                p += used;
                continue;
            }
        }
        p += 1;
    }
    Some(whole_after)
}

/// Reads ahead what a report of `dir`'s replica log would read (its newest file checked
/// from where the last look stopped, its older files' headers once), without fsyncing
/// anything: a node calls it now and
/// then while its backup runs, so that a failover's report reads only the last moments'
/// appends (`scan_newest`).
pub fn warm_holdings(dir: &Path) -> Result<(), LogError> {
    if crate::sealed::replica_is_sealed(dir) {
        return Ok(());
    }
    // One look at a time, a report's included (`read_held`): a report never finds the
    // newest file's look taken out by a warm one under way, and reads it whole.
    let _one = LOOKING.lock();
    let rdir = replica_dir(dir);
    let mut files = list_files(&rdir)?;
    forget_older_than(&rdir, &files);
    if let Some(newest) = files.pop() {
        scan_newest(&newest, true)?;
    }
    for f in &files {
        scan_older(f)?;
    }
    Ok(())
}

/// Held by a look at a replica log (`warm_holdings`, `read_held`): one at a time.
static LOOKING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// One replica log file read entry header by entry header (`scan_headers`): each entry's
/// own checksum and its batch header are checked, and the entry must lie within the file
/// (so none may be cut short: not the newest file, or a sealed log's); its stream's bound
/// goes into `bounds`, the highest trusted floor and where it is into `floor_at` (its
/// payload is not read here: the caller checks it before it trusts it), and each entry
/// to `each` (file index `i`).
fn scan_file_headers(
    i: usize,
    seq: u64,
    path: &Path,
    streams: &mut Option<u32>,
    bounds: &mut Vec<Ts>,
    floor_at: &mut Option<(Ts, KeptHeader)>,
    mut each: impl FnMut(KeptHeader),
) -> Result<(), LogError> {
    use std::os::unix::fs::FileExt;
    let corrupt = |offset: u64, what: String| LogError::Corrupt { file: path.to_path_buf(), offset, what };
    let f = std::fs::File::open(path).map_err(|e| LogError::io(path, e))?;
    let size = f.metadata().map_err(|e| LogError::io(path, e))?.len();
    let mut head = [0u8; REPLICA_HEADER_LEN];
    f.read_exact_at(&mut head, 0).map_err(|e| LogError::io(path, e))?;
    let fh = decode_header(&head).map_err(|e| corrupt(0, e))?;
    take_file_header(fh.streams, fh.seq, seq, streams, bounds).map_err(|e| corrupt(0, e))?;
    let mut off = REPLICA_HEADER_LEN as u64;
    let mut h = [0u8; ENTRY_HEADER_LEN + crate::format::BATCH_HEADER_LEN];
    while off < size {
        if size - off < (ENTRY_HEADER_LEN + crate::format::BATCH_HEADER_FIXED_LEN) as u64 {
            return Err(corrupt(off, "entry cut short (not the newest file)".into()));
        }
        let want = h.len().min((size - off) as usize);
        f.read_exact_at(&mut h[..want], off).map_err(|e| LogError::io(path, e))?;
        let len = u32::from_le_bytes(h[..4].try_into().expect("4")) as usize;
        let flags = h[4];
        let crc = u32::from_le_bytes(h[8..12].try_into().expect("4"));
        if crc != crc32c::crc32c(&h[..8]) || !entry_header_fields_ok(&h[..8], fh.version) {
            return Err(corrupt(off, "entry header checksum mismatch".into()));
        }
        let header =
            crate::format::decode_batch_header(&h[ENTRY_HEADER_LEN..want]).map_err(|e| corrupt(off, e.to_string()))?;
        if header.total_len() != len || off + (ENTRY_HEADER_LEN + len) as u64 > size {
            return Err(corrupt(off, format!("entry of {len} bytes does not hold its batch (not the newest file)")));
        }
        let s = header.stream.0 as usize;
        if s >= bounds.len() {
            return Err(corrupt(off, format!("batch of stream {s}, of {} streams", fh.streams)));
        }
        bounds[s] = bounds[s].max(header.bound_ts);
        let k = KeptHeader { header, file: i, offset: off, len };
        if flags & FLOOR_TRUSTED != 0 && floor_at.as_ref().is_none_or(|(f, _)| header.floor_ts > *f) {
            *floor_at = Some((header.floor_ts, KeptHeader { ..k }));
        }
        each(k);
        off += (ENTRY_HEADER_LEN + len) as u64;
    }
    Ok(())
}

/// A sealed log's batches (`sealed/`, or the kept `sealed-served/`) with a bound above
/// `after` (of `stream` only, if named: a failover's fetch of one stream reads no other's
/// payloads), in the order received, as framed: what a new primary sends a backup behind its
/// point (`sealed_batches_above`). The log lies on `ckpt_ts` and is sealed at `point`.
/// Every entry's header is checked, with none cut short (a sealed log has no torn tail,
/// as `scan_sealed_dir` says), and the log must hold every stream up to the point; the
/// payloads are read, and checked, only of the batches returned (and of the one that
/// carries the highest trusted floor). After a load of 1.9M keys, reading the whole 466 MB
/// sealed log for the few batches a backup lacked held that backup's join 160 ms, and with
/// it the first write under `majority` when it was the only backup left.
/// Each is handed to `each` as it is read, after every check of the headers (returning
/// false asks for no more; the read's result then says it stopped: false).
fn sealed_entries_above(
    rdir: &Path,
    ckpt_ts: Ts,
    point: Ts,
    after: Ts,
    stream: Option<usize>,
    each: &mut dyn FnMut(Ts, Bytes, Batch) -> Result<bool, LogError>,
) -> Result<bool, LogError> {
    let files = list_files(rdir)?;
    let (mut streams, mut bounds, mut floor_at) = (None, Vec::new(), None);
    let mut above = Vec::new();
    for (i, (seq, path)) in files.iter().enumerate() {
        scan_file_headers(i, *seq, path, &mut streams, &mut bounds, &mut floor_at, |k| {
            if k.header.bound_ts > after && stream.is_none_or(|s| k.header.stream.0 as usize == s) {
                above.push(k);
            }
        })?;
    }
    let mut floor = Ts::ZERO;
    if let Some((f, k)) = floor_at {
        // Trusted only once its payload checksum, which covers it, is checked.
        read_entry(&files, &k)?;
        floor = f;
    }
    let cut = cut_of(&bounds, floor, ckpt_ts);
    if cut < point {
        return Err(LogError::Corrupt {
            file: rdir.to_path_buf(),
            offset: 0,
            what: format!(
                "sealed at ts {}, but it holds every stream only up to ts {} (per stream: {bounds:?})",
                point.0, cut.0
            ),
        });
    }
    for k in &above {
        let (_, raw, batch) = match read_entry_framed(&files, k) {
            Ok(e) => e,
            Err(LogError::Corrupt { file, offset, what }) => {
                return Err(LogError::Corrupt { file, offset, what: format!("a sealed log is damaged: {what}") })
            }
            Err(e) => return Err(e),
        };
        if !each(k.header.bound_ts, raw, batch)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The replica log files of a directory, checked entry by entry.
pub(crate) struct Scan {
    /// (seq, path), in sequence order.
    pub files: Vec<(u64, PathBuf)>,
    pub streams: Option<u32>,
    /// Per stream: the highest bound.
    pub bounds: Vec<Ts>,
    /// The highest trusted floor.
    pub floor: Ts,
    pub ckpt_ts: Ts,
    /// Batches with transactions above the checkpoint: (batch, file index, offset).
    pub kept: Vec<(Batch, usize, u64)>,
    pub log_bytes: u64,
    /// The newest file's torn tail: the file and the length that checks.
    pub torn: Option<(PathBuf, u64)>,
}

impl Scan {
    pub(crate) fn cut(&self) -> Ts {
        cut_of(&self.bounds, self.floor, self.ckpt_ts)
    }
}

/// The live replica log of the data directory `dir` (none while its replica directory is
/// a sealed log: `sealed::replica_is_sealed`), checked entry by entry; `ckpt_ts` is what the
/// directory holds without it (`sealed::base`).
fn scan(dir: &Path, ckpt_ts: Ts) -> Result<Scan, LogError> {
    if crate::sealed::replica_is_sealed(dir) {
        return scan_files(Vec::new(), ckpt_ts);
    }
    scan_dir(&replica_dir(dir), ckpt_ts)
}

/// The replica log files in `rdir` (a data directory's `replica/`), checked entry by
/// entry.
pub(crate) fn scan_dir(rdir: &Path, ckpt_ts: Ts) -> Result<Scan, LogError> {
    scan_files(list_files(rdir)?, ckpt_ts)
}

/// A sealed log's files (`sealed/`, or the kept `sealed-served/`), on a checkpoint at
/// `ckpt_ts`, sealed at `point`: checked entry by entry, with no torn tail allowed (a log
/// is sealed by a running backup, fenced, everything it received durable, and opened
/// earlier, a torn tail left by a crash cut then; so a checksum that fails anywhere in it,
/// its newest file included, is damage: read as a torn tail, it would be dropped silently,
/// and the batches after it with it), and holding every stream up to the point.
pub(crate) fn scan_sealed_dir(rdir: &Path, ckpt_ts: Ts, point: Ts) -> Result<Scan, LogError> {
    // Damage found by the scan itself (a checksum that fails with valid entries after it)
    // is said to be a sealed log's too, as a torn tail is below. (Before, which of the two
    // messages came depended on where in the file the damage lay: a test that flips a byte
    // at a file's middle failed about one run in twelve, its batches laid out otherwise.)
    let scan = scan_files(list_files(rdir)?, ckpt_ts).map_err(|e| match e {
        LogError::Corrupt { file, offset, what } => {
            LogError::Corrupt { file, offset, what: format!("a sealed log is damaged: {what}") }
        }
        e => e,
    })?;
    if let Some((file, offset)) = &scan.torn {
        return Err(LogError::Corrupt {
            file: file.clone(),
            offset: *offset,
            what: "a sealed log is damaged (a checksum fails; a sealed log has no torn tail)".into(),
        });
    }
    if scan.cut() < point {
        return Err(LogError::Corrupt {
            file: rdir.to_path_buf(),
            offset: 0,
            what: format!(
                "sealed at ts {}, but it holds every stream only up to ts {} (per stream: {:?})",
                point.0,
                scan.cut().0,
                scan.bounds
            ),
        });
    }
    Ok(scan)
}

/// The files of `dir`'s live replica log, in order: none while its replica directory is a
/// sealed log (`sealed::replica_is_sealed`).
fn live_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, LogError> {
    if crate::sealed::replica_is_sealed(dir) {
        return Ok(Vec::new());
    }
    list_files(&replica_dir(dir))
}

/// The replica log files in `rdir`, in sequence order.
fn list_files(rdir: &Path) -> Result<Vec<(u64, PathBuf)>, LogError> {
    let mut files: Vec<(u64, PathBuf)> = Vec::new();
    if rdir.exists() {
        for e in std::fs::read_dir(rdir).map_err(|e| LogError::io(rdir, e))? {
            let path = e.map_err(|e| LogError::io(rdir, e))?.path();
            if path.file_name().is_some_and(|n| n == crate::sealed::CUT_FILE || n == crate::sealed::FLOOR_FILE) {
                continue;
            }
            let seq = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("rlog-")?.strip_suffix(".seg")?.parse().ok());
            match seq {
                Some(seq) => files.push((seq, path)),
                None => {
                    return Err(LogError::Corrupt {
                        file: path,
                        offset: 0,
                        what: "unexpected file in the replica log".into(),
                    })
                }
            }
        }
    }
    files.sort();
    Ok(files)
}

fn scan_files(files: Vec<(u64, PathBuf)>, ckpt_ts: Ts) -> Result<Scan, LogError> {
    let mut kept: Vec<(Batch, usize, u64)> = Vec::new();
    let read = read_files(&files, |e| {
        let h = &e.batch.header;
        if h.txn_count > 0 && h.last_ts > ckpt_ts {
            kept.push((e.batch, e.file, e.offset as u64));
        }
        true
    })?;
    let FilesRead { streams, bounds, floor, log_bytes, torn } = read;
    Ok(Scan { files, streams, bounds, floor, ckpt_ts, kept, log_bytes, torn })
}

/// One entry of a replica log file, as `read_files` hands it over.
struct FileEntry<'a> {
    /// The file's index in the list read, and its whole bytes.
    file: usize,
    raw: &'a Bytes,
    /// Where the entry starts in `raw`, and its length (entry header included).
    offset: usize,
    used: usize,
    stream: usize,
    batch: Batch,
}

/// What `read_files` found besides the entries.
#[derive(Default)]
struct FilesRead {
    streams: Option<u32>,
    /// Per stream: the highest bound.
    bounds: Vec<Ts>,
    /// The highest trusted floor.
    floor: Ts,
    log_bytes: u64,
    /// The newest file's torn tail: the file and the length that checks.
    torn: Option<(PathBuf, u64)>,
}

/// Reads replica log `files` (in sequence order) one at a time, checking each file's
/// header and each entry, and hands every entry to `on_entry`: a file's bytes are let go
/// once it is read, unless `on_entry` keeps a slice of them. The tail of the newest file
/// may be torn (never acknowledged) and ends the read; damage anywhere else is an error.
fn read_files(
    files: &[(u64, PathBuf)],
    mut on_entry: impl FnMut(FileEntry<'_>) -> bool,
) -> Result<FilesRead, LogError> {
    let mut read = FilesRead::default();
    for (i, (seq, path)) in files.iter().enumerate() {
        let raw = Bytes::from(crate::options::read_file_at_most(
            path,
            crate::options::LOG_FILE_BYTES_MAX,
            "a replica log file",
        )?);
        let last = i + 1 == files.len();
        let corrupt = |offset: u64, what: String| LogError::Corrupt { file: path.clone(), offset, what };
        let FileHeader { streams: n, seq: hseq, version } = match decode_header(&raw) {
            Ok(h) => h,
            // A crash while the header of the newest file was written: it holds nothing.
            Err(_) if last && raw.len() <= REPLICA_HEADER_LEN => break,
            Err(e) => return Err(corrupt(0, e)),
        };
        take_file_header(n, hseq, *seq, &mut read.streams, &mut read.bounds).map_err(|e| corrupt(0, e))?;
        let mut off = REPLICA_HEADER_LEN;
        while off < raw.len() {
            match decode_entry(&raw, off, version) {
                Ok((batch, flags, used)) => {
                    let stream = read.take(n, &batch, flags, used).map_err(|e| corrupt(off as u64, e))?;
                    if !on_entry(FileEntry { file: i, raw: &raw, offset: off, used, stream, batch }) {
                        // Asked for no more: what was read so far.
                        return Ok(read);
                    }
                    off += used;
                }
                // The tail of the newest file may be torn (never acknowledged); all zeros
                // is the same. Anything else is damage, a valid entry after it included.
                Err(e) if last => {
                    let Some(after) = torn_entries_after(&raw, off, 0, version) else {
                        return Err(corrupt(off as u64, format!("{e}, with valid entries after it")));
                    };
                    read.torn_at(path, off, &e, after);
                    break;
                }
                Err(e) => return Err(corrupt(off as u64, e)),
            }
        }
    }
    Ok(read)
}

impl FilesRead {
    /// An entry's batch of a file of `n` streams, `used` bytes, counted: its stream.
    fn take(&mut self, n: u32, batch: &Batch, flags: u8, used: usize) -> Result<usize, String> {
        let h = &batch.header;
        let s = h.stream.0 as usize;
        if s >= self.bounds.len() {
            return Err(format!("batch of stream {s}, of {n} streams"));
        }
        self.bounds[s] = self.bounds[s].max(h.bound_ts);
        if flags & FLOOR_TRUSTED != 0 {
            self.floor = self.floor.max(h.floor_ts);
        }
        self.log_bytes += used as u64;
        Ok(s)
    }

    /// The newest file's tail from `off` does not check (`why`): torn, dropped.
    fn torn_at(&mut self, path: &Path, off: usize, why: &str, whole_after: u32) {
        let after = crate::format::cut_along(whole_after, "entry", "entries");
        tracing::warn!("{}: torn tail at offset {off} ({why}){after}; dropped", path.display());
        self.torn = Some((path.to_path_buf(), off as u64));
    }
}

/// `read_files`, one entry at a time: a file is never held whole, only the entry being
/// handed over (at most one batch, and a read buffer of 1 MiB). The same checks, the same
/// torn tail; `on_entry`'s `raw` is the entry alone (its `offset` 0). What a failover's
/// fetch reads (a fetch of a few batches held one 64 MiB file before, 2026-12-01).
fn read_files_each(
    files: &[(u64, PathBuf)],
    mut on_entry: impl FnMut(FileEntry<'_>) -> bool,
) -> Result<FilesRead, LogError> {
    use std::io::Read;
    let mut read = FilesRead::default();
    // Fills `buf` from `r` as far as the file goes: how many bytes it read.
    let fill = |r: &mut dyn Read, buf: &mut [u8], path: &Path| -> Result<usize, LogError> {
        let mut got = 0;
        while got < buf.len() {
            match r.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(LogError::io(path, e)),
            }
        }
        Ok(got)
    };
    for (i, (seq, path)) in files.iter().enumerate() {
        let last = i + 1 == files.len();
        let corrupt = |offset: u64, what: String| LogError::Corrupt { file: path.clone(), offset, what };
        let file = std::fs::File::open(path).map_err(|e| LogError::io(path, e))?;
        // A size no replica log file can have is damaged: refused, as `read_files` refuses
        // it, before the rest of such a file is read to tell a torn tail from damage
        // (before 2026-12-06 a failover's fetch read it into memory; found by a review).
        let size = file.metadata().map_err(|e| LogError::io(path, e))?.len();
        let max = crate::options::LOG_FILE_BYTES_MAX;
        if size > max {
            return Err(crate::options::too_long(path, size, max, "a replica log file"));
        }
        let mut r = std::io::BufReader::with_capacity(1 << 20, file);
        let mut head = [0u8; REPLICA_HEADER_LEN];
        let got = fill(&mut r, &mut head, path)?;
        let FileHeader { streams: n, seq: hseq, version } = match decode_header(&head[..got]) {
            Ok(h) => h,
            // A crash while the header of the newest file was written: it holds nothing.
            Err(_) if last && fill(&mut r, &mut [0u8; 1], path)? == 0 => break,
            Err(e) => return Err(corrupt(0, e)),
        };
        take_file_header(n, hseq, *seq, &mut read.streams, &mut read.bounds).map_err(|e| corrupt(0, e))?;
        let mut off = REPLICA_HEADER_LEN;
        loop {
            let mut eh = [0u8; ENTRY_HEADER_LEN];
            let got = fill(&mut r, &mut eh, path)?;
            if got == 0 {
                break;
            }
            // The entry whole (its header says how long), then checked as `read_files`
            // checks it, on its own bytes.
            let len =
                if got == ENTRY_HEADER_LEN { u32::from_le_bytes(eh[..4].try_into().expect("4")) as usize } else { 0 };
            let mut entry = Vec::new();
            let mut short = got < ENTRY_HEADER_LEN;
            // (A length read from a damaged header is checked against its checksum before
            // anything that large is allocated, and no more is allocated than the file
            // holds after the header: a length past it is an entry cut short.)
            if !short && crc32c::crc32c(&eh[..8]) == u32::from_le_bytes(eh[8..12].try_into().expect("4")) {
                let room = size.saturating_sub((off + ENTRY_HEADER_LEN) as u64).min(len as u64) as usize;
                entry.reserve_exact(ENTRY_HEADER_LEN + room);
                entry.extend_from_slice(&eh);
                entry.resize(ENTRY_HEADER_LEN + room, 0);
                let n = fill(&mut r, &mut entry[ENTRY_HEADER_LEN..], path)?;
                short = n < len;
                // (Cut short: only the bytes the file holds, so that what follows, read to
                // tell a torn tail from damage, lies at its own offset.)
                entry.truncate(ENTRY_HEADER_LEN + n);
            } else {
                entry.extend_from_slice(&eh[..got]);
            }
            let entry = Bytes::from(entry);
            let decoded = if short && entry.len() >= ENTRY_HEADER_LEN && len > 0 {
                Err(format!("entry of {len} bytes cut short"))
            } else {
                decode_entry(&entry, 0, version)
            };
            match decoded {
                Ok((batch, flags, used)) => {
                    let stream = read.take(n, &batch, flags, used).map_err(|e| corrupt(off as u64, e))?;
                    if !on_entry(FileEntry { file: i, raw: &entry, offset: 0, used, stream, batch }) {
                        return Ok(read);
                    }
                    off += used;
                }
                Err(e) if last => {
                    // (The rest of the file read to tell a torn tail from damage: only
                    // where an entry fails, the newest file's end as a rule.)
                    let mut tail = entry.to_vec();
                    r.read_to_end(&mut tail).map_err(|e| LogError::io(path, e))?;
                    let Some(after) = torn_entries_after(&Bytes::from(tail), 0, off as u64, version) else {
                        return Err(corrupt(off as u64, format!("{e}, with valid entries after it")));
                    };
                    read.torn_at(path, off, &e, after);
                    break;
                }
                Err(e) => return Err(corrupt(off as u64, e)),
            }
        }
    }
    Ok(read)
}

/// The batches of primary stream `stream` that `dir`'s replica log holds with a bound above
/// `after`, in order, as the primary framed them: what a failover's chosen node fetches
/// from a peer that holds more of the stream (docs/cluster.md). Read without changing the
/// directory; its backup must not be running.
pub fn replica_stream_batches(dir: &Path, stream: usize, after: Ts) -> Result<Vec<Bytes>, LogError> {
    let mut out = Vec::new();
    replica_stream_batches_each(dir, stream, after, &mut |b| {
        out.push(b);
        true
    })?;
    Ok(out)
}

/// `replica_stream_batches`, each batch handed to `sink` in order as it is read, so that
/// the answer is never held whole (a failover's fetch sends it in pieces as they fill);
/// `sink` returning false asks for no more.
///
/// Returns where the read showed the stream held up to (as `replica_holdings` counts it:
/// its highest bound, the highest trusted floor, the checkpoint), `Ts::ZERO` if `sink`
/// stopped it. A caller that reported a position checks the read still reaches it: the
/// newest file's damaged tail reads as a torn one (the read ends there quietly), and an
/// answer that ended there, taken as whole, would let the fetcher believe it holds the
/// rest.
pub fn replica_stream_batches_each(
    dir: &Path,
    stream: usize,
    after: Ts,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<Ts, LogError> {
    let ckpt_ts = crate::sealed::base(dir)?.ts;
    if ckpt_ts > after {
        // Below a sealed log's point (this node changed its role in place since), from that
        // sealed log, if it reaches down to `after`, then the log above its point.
        match sealed_stream_batches(dir, stream, after, ckpt_ts, sink)? {
            Some(Reached::Stopped) => return Ok(Ts::ZERO),
            Some(Reached::End) => return replica_stream_batches_each(dir, stream, ckpt_ts, sink),
            None => {}
        }
        // The batches up to the checkpoint are gone with the files it covered.
        return Err(LogError::Corrupt {
            file: checkpoint::checkpoints_dir(dir),
            offset: 0,
            what: format!(
                "a checkpoint or seal at ts {} covers what lies above ts {}: no batches to give",
                ckpt_ts.0, after.0
            ),
        });
    }
    // Entry by entry, the batches asked for handed on: at most one batch in memory, not
    // a file, nor the whole log of every stream, nor the answer.
    let files = live_files(dir)?;
    let mut stopped = false;
    let read = read_files_each(&files, |e| {
        let go = e.stream != stream
            || e.batch.header.bound_ts <= after
            || sink(e.raw.slice(e.offset + ENTRY_HEADER_LEN..e.offset + e.used));
        stopped |= !go;
        go
    })?;
    if stopped {
        return Ok(Ts::ZERO);
    }
    Ok(held_up_to(read.bounds.get(stream).copied().unwrap_or(Ts::ZERO), read.floor, ckpt_ts))
}

/// The batches of `stream` above `after` in `data`'s sealed log at `point` (the newest link,
/// or the one kept for serving), cut at the point (`sealed_batches_above`); `None` if there
/// is none at `point` or it does not reach down to `after`. A failover's fetch from a node
/// that changed its role in place since the fetcher's position: its seal took those
/// batches out of the log a fetch reads (seen in CI, 2026-11-27: a plan that needed such a
/// fetch could never be prepared, and the cluster failed over every 5 s).
/// Each batch is handed to `sink` as it is read (false: no more), never the answer whole;
/// `None`, before any is, where the log does not reach down to `after`.
pub(crate) fn sealed_stream_batches(
    data: &Path,
    stream: usize,
    after: Ts,
    point: Ts,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<Option<Reached>, LogError> {
    // Only that stream's entries are read (the others' headers are, for the checks).
    sealed_batches_of(data, after, point, Some(stream), sink)
}

/// How a read that reached down to where it was asked ended: at the end of what it read,
/// or stopped by its sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reached {
    End,
    Stopped,
}

impl Reached {
    fn of(went_on: bool) -> Reached {
        if went_on {
            Reached::End
        } else {
            Reached::Stopped
        }
    }
}

/// What `data`'s replica log sealed at `point` holds above `after`, cut at the point: every
/// stream's batches with a bound above `after`, in the order received, each re-framed with
/// its transactions at or below the point only (`format::cut_batch`). What a new primary,
/// promoted in place, sends a backup that held less than the point, before its own log.
/// Below the newest link's floor, the links before it give the rest (`link_batches_above`).
/// `None` if there is no sealed log at `point`, or if the chain does not reach down to
/// `after` (a checkpoint lies above it, or only the newest link was kept when a checkpoint
/// took the chain away): what the backup lacks is not all in it.
pub fn sealed_batches_above(data: &Path, after: Ts, point: Ts) -> Result<Option<Vec<Bytes>>, LogError> {
    let mut out = Vec::new();
    let reached = sealed_batches_of(data, after, point, None, &mut |b| {
        out.push(b);
        true
    })?;
    Ok(reached.map(|_| out))
}

/// `sealed_batches_above` as the first part of a gap, read again when the gap is sent
/// (`Gap::for_each`) instead of held: here it is read through once, to count its batches
/// and to find a damaged or unreachable sealed log before anything is sent (`None` where
/// it does not reach down to `after`), and nothing of it is kept. Before 2026-12-03 the
/// sealed part was held in memory whole for as long as its link was sent its start: up
/// to what the sealed log held above its checkpoint, per link.
pub fn sealed_gap_above(data: &Path, after: Ts, point: Ts) -> Result<Option<SealedPart>, LogError> {
    let mut batches = 0;
    let reached = sealed_batches_of(data, after, point, None, &mut |_| {
        batches += 1;
        true
    })?;
    Ok(reached.map(|_| SealedPart { data: data.to_path_buf(), after, point, batches }))
}

/// What `sealed_gap_above` found: where to read it again, and how many batches it held.
#[derive(Debug)]
pub struct SealedPart {
    data: PathBuf,
    after: Ts,
    point: Ts,
    batches: usize,
}

/// `sealed_batches_above`, of one stream only where `stream` names it, each batch handed
/// to `sink` as it is read.
fn sealed_batches_of(
    data: &Path,
    after: Ts,
    point: Ts,
    stream: Option<usize>,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<Option<Reached>, LogError> {
    let base = crate::sealed::base(data)?;
    // The newest sealed log, on what it lies on; or, once a checkpoint took the chain
    // away, the copy kept for this (`sealed::retire_sealed`), with the floor it lay on.
    // (A link that holds an old primary's own log is not read for this: `None`.)
    let newest = base.chain.len().checked_sub(1).filter(|&i| base.chain[i].point == point);
    if newest.is_some_and(|i| base.chain[i].primary_log) {
        return Ok(None);
    }
    match newest {
        Some(i) if link_reaches(&base, i, after) => link_batches_above(&base, i, after, stream, sink).map(Some),
        Some(_) => Ok(None),
        None => match crate::sealed::served(data) {
            Some((dir, p, floor)) if p == point && floor <= after => {
                Ok(Some(Reached::of(link_entries_above(&dir, floor, p, after, stream, sink)?)))
            }
            _ => Ok(None),
        },
    }
}

/// Whether link `i` of the chain, with the links before it, holds everything above
/// `after`: below its floor the link before it does, if its point is that floor (not a
/// checkpoint's), and so on down. A link holding an old primary's own log is not read.
/// Decided before anything is read, so that a read that cannot reach sends nothing.
fn link_reaches(base: &crate::sealed::Base, i: usize, after: Ts) -> bool {
    let link = &base.chain[i];
    if link.primary_log {
        return false;
    }
    let floor = base.floor_of(i);
    floor <= after || (i > 0 && base.chain[i - 1].point == floor && link_reaches(base, i - 1, after))
}

/// The lowest `after` from which a fetch of `data` (`replica_stream_batches`, or
/// `recovery::primary_stream_batches` on an old primary's directory) is answered: the
/// point of its checkpoint or newest seal, or lower where the chain of sealed links (or
/// the copy kept for serving) reaches down, as those reads walk it. A failover's plan
/// fetches from a node only above this (`ditto_cluster::TailReport::serves_above`).
pub fn fetch_floor(data: &Path) -> Result<Ts, LogError> {
    let base = crate::sealed::base(data)?;
    let point = base.ts;
    let Some(mut i) = base.chain.len().checked_sub(1).filter(|&i| base.chain[i].point == point) else {
        return Ok(match crate::sealed::served(data) {
            Some((_, p, floor)) if p == point => floor.min(point),
            _ => point,
        });
    };
    if base.chain[i].primary_log {
        return Ok(point);
    }
    // Down the chain while each link lies on the one before it (`link_batches_above`).
    while i > 0 && base.chain[i - 1].point == base.floor_of(i) && !base.chain[i - 1].primary_log {
        i -= 1;
    }
    Ok(base.floor_of(i))
}

/// The batches above `after` of the chain's `i`th link and, where `after` lies below what
/// that link lies on, of the links before it, oldest first, each cut at its own point:
/// a fetch or a rejoining backup behind two changes in place made before a checkpoint
/// took the chain away. `None` where the chain does not reach down to `after` (the
/// checkpoint lies above it) or passes through an old primary's own log.
/// Link `i`'s batches above `after` with those of the links before it below its floor,
/// oldest first, each handed to `sink` (where `link_reaches`).
fn link_batches_above(
    base: &crate::sealed::Base,
    i: usize,
    after: Ts,
    stream: Option<usize>,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<Reached, LogError> {
    let link = &base.chain[i];
    let floor = base.floor_of(i);
    // What lies below this link is in the one before it.
    if floor > after && link_batches_above(base, i - 1, after, stream, sink)? == Reached::Stopped {
        return Ok(Reached::Stopped);
    }
    // (Batches of this link bounded at or below its floor hold nothing above it.)
    Ok(Reached::of(link_entries_above(&link.dir, floor, link.point, after.max(floor), stream, sink)?))
}

/// One sealed link's batches bounded above `after` (of `stream` only, if named), cut at
/// its `point`.
/// Each handed to `sink` as it is read: false once it asked for no more.
fn link_entries_above(
    dir: &Path,
    floor: Ts,
    point: Ts,
    after: Ts,
    stream: Option<usize>,
    sink: &mut dyn FnMut(Bytes) -> bool,
) -> Result<bool, LogError> {
    sealed_entries_above(dir, floor, point, after, stream, &mut |bound, raw, batch| {
        if bound <= point && batch.header.last_ts <= point {
            // (As read: its own buffer.)
            return Ok(sink(raw));
        }
        let mut framed = Vec::with_capacity(raw.len());
        crate::format::cut_batch(&batch, point, &mut framed).map_err(|e| LogError::Corrupt {
            file: dir.to_path_buf(),
            offset: 0,
            what: e.to_string(),
        })?;
        Ok(sink(Bytes::from(framed)))
    })
}

/// Names, in a replica directory, the point an open is cutting it at (`open_replica_upto`
/// with a limit below what it holds: a standalone backup's rejoin at its restarted
/// primary's point, a promotion's cut): written and synced before the checkpoint at the
/// point, removed once the files above it are gone, and applied by every open while it is
/// there. Before 2026-12-02 the point was held in memory only, and a crash between the
/// checkpoint and the removals brought back, at the next plain open, what the cut had
/// dropped (a backup then found itself holding more than its primary's point, and stayed
/// stopped at every start).
pub const CUT_MARK_FILE: &str = "REPLICA_CUT";

fn read_cut_mark(dir: &Path) -> Result<Option<Ts>, LogError> {
    let path = dir.join(CUT_MARK_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => match s.trim().strip_prefix("upto ").and_then(|n| n.parse().ok()) {
            Some(ts) => Ok(Some(Ts(ts))),
            None => Err(LogError::Corrupt { file: path, offset: 0, what: format!("not a cut's mark: {s:?}") }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LogError::io(&path, e)),
    }
}

fn write_cut_mark(dir: &Path, upto: Ts, storage: &dyn Storage) -> Result<(), LogError> {
    crate::catalog::write_atomically(dir, CUT_MARK_FILE, format!("upto {}\n", upto.0).as_bytes(), storage)
        .map_err(|e| LogError::io(&dir.join(CUT_MARK_FILE), e))
}

fn remove_cut_mark(dir: &Path, storage: &dyn Storage) -> Result<(), LogError> {
    let path = dir.join(CUT_MARK_FILE);
    storage.remove(&path).map_err(|e| LogError::io(&path, e))?;
    storage.sync_dir(dir).map_err(|e| LogError::io(dir, e))
}

/// Adds batches fetched from a peer to `dir`'s replica log: checked (checksums and every
/// record of the payload), written to a new file
/// after the existing ones (their floors not trusted: they were not shipped in framing
/// order), fsynced. The next `open_replica_upto` replays them with the rest. `streams` is
/// the primary's stream count, used when no replica log file names it.
pub fn append_fetched(dir: &Path, streams: u32, batches: &[Bytes], storage: &Arc<dyn Storage>) -> Result<(), LogError> {
    crate::sealed::finish_seal(dir, &**storage)?;
    let rdir = replica_dir(dir);
    std::fs::create_dir_all(&rdir).map_err(|e| LogError::io(&rdir, e))?;
    // Only the newest file is read, an entry at a time: its torn tail is cut below, and
    // the older files were checked when the log opened. A fetch adds its answer piece by
    // piece, and reading the whole log for each piece (before 2026-12-02) held every batch
    // above the checkpoint in memory, once per piece, on a failover's path.
    let files = live_files(dir)?;
    let newest = match files.last() {
        Some(f) => read_files_each(std::slice::from_ref(f), |_| true)?,
        None => FilesRead::default(),
    };
    let streams = newest.streams.unwrap_or(streams);
    // Every record of every payload is checked, not just the checksums: a batch from a
    // peer whose payload does not parse would be written here and then fail the open of
    // this directory, at the promotion that needed it.
    let mut scratch = Vec::new();
    for b in batches {
        let (batch, used) = crate::format::decode_batch_in(b, &mut scratch).map_err(|e| LogError::Corrupt {
            file: rdir.clone(),
            offset: 0,
            what: format!("a fetched batch: {e}"),
        })?;
        if used != b.len() {
            return Err(LogError::Corrupt {
                file: rdir.clone(),
                offset: 0,
                what: "a fetched batch with trailing bytes".into(),
            });
        }
        if batch.header.stream.0 >= streams {
            return Err(LogError::Corrupt {
                file: rdir.clone(),
                offset: 0,
                what: format!("a fetched batch of stream {}, of {streams}", batch.header.stream.0),
            });
        }
    }
    // A torn tail of the newest file is cut first: after the new file it would no longer
    // be the newest's, and the directory would not open. A whole one is made durable
    // first, for the same reason (what a killed backup wrote and never fsynced could be
    // torn by a power cut after the new file's fsync: the directory would not open).
    match (&newest.torn, files.last()) {
        (Some((path, len)), _) => storage.truncate_existing(path, *len).map_err(|e| LogError::io(path, e))?,
        (None, Some((_, path))) if newest.streams.is_some() => {
            storage.sync_existing(path).map_err(|e| LogError::io(path, e))?
        }
        _ => {}
    }
    let mut seq = files.last().map_or(1, |(seq, _)| seq + 1);
    // A newest file with no header (a crash while it was being created: it holds nothing)
    // goes, and the new one takes its number: behind a newer file it would be refused as
    // "not a replica log file", and the directory would not open.
    if let (Some((s, path)), None) = (files.last(), newest.streams) {
        storage.remove(path).map_err(|e| LogError::io(path, e))?;
        storage.sync_dir(&rdir).map_err(|e| LogError::io(&rdir, e))?;
        seq = *s;
    }
    let mut log =
        ReplicaLog::create(dir, Arc::clone(storage), streams, seq, u64::MAX).map_err(|e| LogError::io(&rdir, e))?;
    for b in batches {
        let (batch, _) = decode_batch_checksums(b).expect("checked above");
        log.append(b, false, batch.header.high_ts());
    }
    // A failed fsync leaves the file's state unknown, and a later fsync through another
    // descriptor (a holdings report's) would succeed on what the page cache holds and
    // count it as held: the file goes instead (its batches fetched again next round).
    if let Err(e) = log.sync() {
        let path = file_path(dir, seq);
        drop(log);
        let gone = storage.remove(&path).and_then(|()| storage.sync_dir(&rdir));
        forget_holdings();
        return Err(match gone {
            Ok(()) => LogError::io(&rdir, e),
            Err(g) => {
                LogError::io(&path, std::io::Error::other(format!("{e}; and removing the file then failed: {g}")))
            }
        });
    }
    Ok(())
}

/// The batches of the primary's log in `data` (its current epoch `epoch`) that hold
/// anything above `after`: every stream's batches with a bound above it, the streams
/// merged in timestamp order (`Gap::for_each`), for shipping to a backup that has
/// everything at or below `after`. `None` when
/// the log no longer holds all of them (a checkpoint deleted a segment the backup still
/// needs): the backup must then be sent a checkpoint. The files are read as they are; a
/// batch still being written at the end of a stream's last segment is left out (the caller
/// waits until what was framed before it asked is durable, and ships later batches live).
///
/// Every segment is read and checked here, a batch at a time (`format::scan_segment`,
/// through a 256 KiB window), and kept open: what is returned holds each segment's file
/// with the length found whole, and `Gap::for_each` reads them again a batch at a time. So
/// a backup that returns after a long absence (its gap up to the log kept for backups, 1
/// GiB by default) costs the primary a window and a batch of memory while the gap is
/// taken, and a window and a batch per stream while it is sent, not the whole gap (before
/// 2026-11-28 the gap was read whole into memory here; until 2026-12-03 the send read a
/// segment at a time too, and until 2026-12-04 the taking did); and a checkpoint that deletes a segment while the gap is being sent
/// (nothing keeps the log for a backup before its first ack) takes only its name: the
/// open file is read all the same.
pub fn batches_after(data: &Path, epoch: Epoch, after: Ts) -> Result<Option<Gap>, LogError> {
    gap_in(data, epoch, after, None)
}

/// `batches_after` for primary stream `stream` alone (a failover's fetch).
pub fn stream_batches_after(data: &Path, epoch: Epoch, after: Ts, stream: usize) -> Result<Option<Gap>, LogError> {
    gap_in(data, epoch, after, Some(stream))
}

fn gap_in(data: &Path, epoch: Epoch, after: Ts, only: Option<usize>) -> Result<Option<Gap>, LogError> {
    let segs: Vec<_> = crate::recovery::list_segments(data)?
        .segments
        .into_iter()
        .filter(|s| s.epoch == epoch && only.is_none_or(|o| s.stream as usize == o))
        .collect();
    gap_in_listed(&segs, after)
}

/// `gap_in` of the segments `segs` listed (one epoch's, by stream, then sequence).
fn gap_in_listed(segs: &[crate::recovery::SegmentFile], after: Ts) -> Result<Option<Gap>, LogError> {
    let mut gap = Gap::default();
    // The files kept open are shared out among the streams, each's first segments: the
    // merge reads every stream's from the start, and a checkpoint deletes the oldest.
    let streams = segs.iter().map(|s| s.stream).collect::<std::collections::BTreeSet<_>>().len();
    let keep_open = (GAP_OPEN_MAX / streams.max(1)).max(1);
    let mut i = 0;
    while i < segs.len() {
        let stream = segs[i].stream;
        let mut kept = 0;
        let mut first = true;
        let mut prev_seq = 0;
        while i < segs.len() && segs[i].stream == stream {
            let f = &segs[i];
            let last_of_stream = i + 1 == segs.len() || segs[i + 1].stream != stream;
            let file = match std::fs::File::open(&f.path) {
                Ok(file) => file,
                // Deleted by a checkpoint since the listing (closed segments only, never a
                // stream's last): what it held is judged by the next one's `prev_ts`, as a
                // segment missing from the listing is (before 2026-12-06 the gap failed,
                // and the backup was sent a whole checkpoint copy; found by a review).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !last_of_stream => {
                    i += 1;
                    continue;
                }
                Err(e) => return Err(LogError::io(&f.path, e)),
            };
            let (file, scan, batches) = scan_gap_segment(file, after, |_| {});
            let scan = scan.map_err(|e| match e {
                crate::format::ScanError::Io(e) => LogError::io(&f.path, e),
                crate::format::ScanError::Format(e) => {
                    LogError::Corrupt { file: f.path.clone(), offset: 0, what: format!("segment header: {e}") }
                }
            })?;
            if scan.header.stream.0 != stream || scan.header.seq != f.seq {
                return Err(LogError::Corrupt {
                    file: f.path.clone(),
                    offset: 0,
                    what: format!(
                        "the header says stream {} segment {}, the name stream {stream} segment {}",
                        scan.header.stream.0, scan.header.seq, f.seq
                    ),
                });
            }
            // A missing earlier segment held something the backup lacks: no gap can be sent.
            let missing_before = first || f.seq != prev_seq + 1;
            if missing_before && scan.header.prev_ts > after {
                return Ok(None);
            }
            // Only a stream's last segment may end short (its tail being written, or torn by
            // a crash); an earlier one that does leaves a hole, which is not sent as if whole.
            match &scan.end {
                crate::format::SegmentEnd::Clean => {}
                crate::format::SegmentEnd::Zeros { .. } | crate::format::SegmentEnd::Torn { .. } if last_of_stream => {}
                end => {
                    return Err(LogError::Corrupt {
                        file: f.path.clone(),
                        offset: 0,
                        what: format!("a segment before the stream's last ends short ({end:?}): the log has a hole"),
                    })
                }
            }
            if batches > 0 {
                gap.batches += batches;
                // Past its share, a stream's others are opened again by name when sent.
                let file = (kept < keep_open).then_some(file);
                kept += 1;
                let (path, len) = (f.path.clone(), scan.valid_len);
                gap.parts.push(GapPart::Segment(SegmentPart { stream, file, path, len, after, batches }));
            }
            first = false;
            prev_seq = f.seq;
            i += 1;
        }
    }
    Ok(Some(gap))
}

/// Scans a gap's segment `file` a batch at a time, counting the batches above `after` (a
/// whole segment in memory per returning backup before 2026-12-04). A stream's last
/// segment loses the zeros written ahead of its batches when the next one starts: a scan
/// that meets the file's end short of the length it began with scans again, up to three
/// times in all. `before_scan` runs once the length is read, before each scan (a test
/// trims the file there).
fn scan_gap_segment(
    mut file: std::fs::File,
    after: Ts,
    mut before_scan: impl FnMut(&std::fs::File),
) -> (std::fs::File, Result<crate::format::SegmentSummary, crate::format::ScanError>, usize) {
    let mut tries = 0;
    loop {
        let len = match file.metadata() {
            Ok(m) => m.len(),
            Err(e) => return (file, Err(e.into()), 0),
        };
        before_scan(&file);
        let mut batches = 0;
        let mut window = ReadWindow::new(file, len);
        let scan = crate::format::scan_segment(len, &mut |off, buf| window.read_at(off, buf), &mut |_, b| {
            batches += usize::from(b.header.bound_ts > after);
        });
        file = window.into_file();
        tries += 1;
        match scan {
            Err(crate::format::ScanError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof && tries < 3 => {}
            scan => return (file, scan, batches),
        }
    }
}

/// Reads of the first `len` bytes of a file served from a window of up to `READ_WINDOW`
/// bytes read at once: a scan a batch at a time (`format::scan_segment`) then makes a
/// system call per window, not two per batch. A gap of about 150,000 batches of about 1 KB
/// (138 MB, page cache warm): taken in 0.050 s with 0.48 MB of heap at the peak, sent
/// (read back) in 0.047 s; the segment read whole took 0.104 s and 89 MB, and the send's
/// two reads per batch 0.157 s; a batch at a time without the window, 0.157 s to take
/// (the ignored test in crates/log/tests/gap_memory.rs). A read as large as the window
/// goes to the file.
struct ReadWindow {
    file: std::fs::File,
    len: u64,
    /// The file's bytes from `start`.
    start: u64,
    buf: Vec<u8>,
}

const READ_WINDOW: usize = 256 << 10;

impl ReadWindow {
    fn new(file: std::fs::File, len: u64) -> Self {
        ReadWindow { file, len, start: 0, buf: Vec::new() }
    }

    fn into_file(self) -> std::fs::File {
        self.file
    }

    fn read_at(&mut self, off: u64, out: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let end = off + out.len() as u64;
        if off < self.start || end > self.start + self.buf.len() as u64 {
            if out.len() >= READ_WINDOW || end > self.len {
                return self.file.read_exact_at(out, off);
            }
            let n = (READ_WINDOW as u64).min(self.len - off) as usize;
            self.buf.resize(n, 0);
            self.file.read_exact_at(&mut self.buf, off)?;
            self.start = off;
        }
        let at = (off - self.start) as usize;
        out.copy_from_slice(&self.buf[at..at + out.len()]);
        Ok(())
    }
}

/// A gap keeps at most this many segments open (a default-sized one holds up to 16 GiB so,
/// past any kept log; with small segments, more), each stream's first ones: the others are
/// opened again by name when sent, and a checkpoint that deletes one meanwhile ends the
/// send there.
const GAP_OPEN_MAX: usize = 256;

/// Batches for a backup (`batches_after`), read when they are sent: open segments with
/// the length of each found whole then, and a sealed log's part (`sealed_gap_above`).
#[derive(Debug, Default)]
pub struct Gap {
    parts: Vec<GapPart>,
    batches: usize,
}

#[derive(Debug)]
enum GapPart {
    Segment(SegmentPart),
    Sealed(SealedPart),
}

/// One segment's part of a gap: its batches with a bound above `after`, `batches` of
/// them within its first `len` bytes when the gap was taken.
#[derive(Debug)]
struct SegmentPart {
    stream: u32,
    file: Option<std::fs::File>,
    path: PathBuf,
    len: u64,
    after: Ts,
    batches: usize,
}

impl Gap {
    /// How many batches it holds.
    pub fn len(&self) -> usize {
        self.batches
    }

    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }

    /// A sealed log's part first (`sealed_gap_above`), then this gap's.
    pub fn after_sealed(mut self, sealed: SealedPart) -> Gap {
        self.batches += sealed.batches;
        self.parts.insert(0, GapPart::Sealed(sealed));
        self
    }

    /// Hands each batch to `f`: a sealed log's part first, then the segments' batches of
    /// every stream merged in timestamp order (by each batch's first transaction, a
    /// heartbeat's bound), each stream's in its own order, read a batch at a time. A
    /// segment that no longer reads as it did when the gap was taken (cut short or damaged
    /// since) is an error after the batches before it: never a stream sent with a hole.
    ///
    /// Merged, not stream after stream (as before 2026-12-03): a backup given one
    /// stream's whole part before the next's replayed one stream at a time, and a
    /// batch's writes above its reuse bound (`BatchHeader::reuse_ts`) waited, holding
    /// every batch received meanwhile in memory, until the later streams' parts came.
    pub fn for_each(self, mut f: impl FnMut(Bytes) -> std::io::Result<()>) -> std::io::Result<()> {
        self.for_each_ahead_of(|b, _| f(b))
    }

    /// `for_each`, telling `f` with each batch of the segments the key every batch still to
    /// come lies at or above (`None` after the last, and for a sealed part's): every
    /// transaction of the gap's segments below it has been handed over (a sender vouches
    /// with it, `send_gap`).
    pub fn for_each_ahead_of(self, mut f: impl FnMut(Bytes, Option<Ts>) -> std::io::Result<()>) -> std::io::Result<()> {
        let mut streams: Vec<std::collections::VecDeque<SegmentPart>> = Vec::new();
        for part in self.parts {
            match part {
                GapPart::Sealed(SealedPart { data, after, point, batches }) => {
                    // Read as it is sent; one that no longer reads as it was counted (a
                    // checkpoint retired the sealed log meanwhile, say) ends the send after
                    // what was sent before, as a changed segment does.
                    let changed = |what: String| {
                        std::io::Error::other(format!(
                            "{}: the sealed log above ts {}: {what} since the gap was taken",
                            data.display(),
                            after.0
                        ))
                    };
                    let (mut sent, mut failed) = (0, None);
                    let reached = sealed_batches_of(&data, after, point, None, &mut |b| {
                        sent += 1;
                        if sent > batches {
                            return false;
                        }
                        match f(b, None) {
                            Ok(()) => true,
                            Err(e) => {
                                failed = Some(e);
                                false
                            }
                        }
                    });
                    if let Some(e) = failed {
                        return Err(e);
                    }
                    match reached {
                        Ok(Some(Reached::End)) if sent == batches => {}
                        Ok(Some(_)) => {
                            return Err(changed(format!("more than the {batches} batches it held, or fewer ({sent})")))
                        }
                        Ok(None) => return Err(changed("no longer reaching down".into())),
                        Err(e) => return Err(changed(format!("{e}"))),
                    }
                }
                GapPart::Segment(seg) => match streams.last_mut() {
                    Some(q) if q.back().is_some_and(|l| l.stream == seg.stream) => q.push_back(seg),
                    _ => streams.push([seg].into()),
                },
            }
        }
        let mut cursors = Vec::with_capacity(streams.len());
        for parts in streams {
            let mut c = StreamCursor { parts, open: None, next: None, scratch: Vec::new() };
            c.advance()?;
            cursors.push(c);
        }
        // The stream whose next batch comes first (few streams: a scan is cheap).
        let head = |cursors: &[StreamCursor]| cursors.iter().filter_map(|c| c.next.as_ref().map(|n| n.0)).min();
        while let Some(c) = cursors.iter_mut().filter(|c| c.next.is_some()).min_by_key(|c| c.next.as_ref().map(|n| n.0))
        {
            let (_, batch) = c.next.take().expect("a stream with a next batch");
            c.advance()?;
            f(batch, head(&cursors))?;
        }
        Ok(())
    }

    /// Every batch, in memory at once.
    pub fn collect(self) -> Result<Vec<Bytes>, LogError> {
        let mut out = Vec::with_capacity(self.batches);
        self.each(&mut |b| {
            out.push(b);
            true
        })?;
        Ok(out)
    }

    /// Hands each batch to `sink`, in order, a batch at a time (`for_each`), until it
    /// returns false, and reads no further then; whether it took them all.
    pub fn each(self, sink: &mut dyn FnMut(Bytes) -> bool) -> Result<bool, LogError> {
        #[derive(Debug)]
        struct Stopped;
        impl std::fmt::Display for Stopped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("asked for no more")
            }
        }
        impl std::error::Error for Stopped {}
        match self.for_each(|b| if sink(b) { Ok(()) } else { Err(std::io::Error::other(Stopped)) }) {
            Ok(()) => Ok(true),
            Err(e) if e.get_ref().is_some_and(|i| i.is::<Stopped>()) => Ok(false),
            Err(e) => Err(LogError::Corrupt { file: PathBuf::new(), offset: 0, what: e.to_string() }),
        }
    }
}

/// One stream's segments of a gap, read a batch at a time (`Gap::for_each`).
struct StreamCursor {
    parts: std::collections::VecDeque<SegmentPart>,
    /// The segment being read.
    open: Option<OpenSegment>,
    /// The next batch to send, and its place in the merge (first transaction, or bound).
    next: Option<(Ts, Bytes)>,
    /// For a compressed payload's check.
    scratch: Vec<u8>,
}

/// A gap's segment being read (`StreamCursor`).
struct OpenSegment {
    part: SegmentPart,
    /// Its first `part.len` bytes.
    file: ReadWindow,
    /// Where its next batch starts.
    off: u64,
    /// Its batches above the gap's start read so far.
    read: usize,
    /// What its header names: every batch is of them.
    epoch: Epoch,
    version: u16,
}

impl StreamCursor {
    /// Reads the stream's next batch above the gap's start into `next` (none at the end).
    fn advance(&mut self) -> std::io::Result<()> {
        loop {
            let Some(OpenSegment { part, file, off, read, epoch, version }) = &mut self.open else {
                let Some(mut part) = self.parts.pop_front() else { return Ok(()) };
                let file = match part.file.take() {
                    Some(f) => f,
                    None => std::fs::File::open(&part.path).map_err(|e| {
                        std::io::Error::other(format!("{}: could not be opened again: {e}", part.path.display()))
                    })?,
                };
                let mut file = ReadWindow::new(file, part.len);
                let mut head = [0u8; crate::format::SEGMENT_HEADER_LEN];
                file.read_at(0, &mut head).map_err(|e| changed(&part.path, format!("{e}")))?;
                let h = crate::format::SegmentHeader::decode(&head).map_err(|e| changed(&part.path, format!("{e}")))?;
                if h.stream.0 != part.stream {
                    return Err(changed(&part.path, format!("its header names stream {}", h.stream.0)));
                }
                let version = u16::from_le_bytes([head[8], head[9]]);
                let off = crate::format::SEGMENT_HEADER_LEN as u64;
                self.open = Some(OpenSegment { part, file, off, read: 0, epoch: h.epoch, version });
                continue;
            };
            if *off >= part.len {
                if *read != part.batches {
                    let what = format!("{read} batches above ts {} where {} were", part.after.0, part.batches);
                    return Err(changed(&part.path, what));
                }
                self.open = None;
                continue;
            }
            let damaged = |what: String| changed(&part.path, format!("damaged at offset {off} ({what})"));
            let mut head = [0u8; crate::format::BATCH_HEADER_LEN];
            let want = head.len().min((part.len - *off) as usize);
            file.read_at(*off, &mut head[..want]).map_err(|e| damaged(e.to_string()))?;
            let h = crate::format::decode_batch_header(&head[..want]).map_err(|e| damaged(e.to_string()))?;
            let total = h.total_len() as u64;
            if *off + total > part.len || h.stream.0 != part.stream || h.epoch != *epoch || h.version != *version {
                return Err(damaged(format!("a batch of stream {} and {total} bytes, not of its segment", h.stream.0)));
            }
            let mut buf = vec![0u8; total as usize];
            file.read_at(*off, &mut buf).map_err(|e| damaged(e.to_string()))?;
            let batch = Bytes::from(buf);
            // Checked whole, as when the gap was taken (`read_segment`).
            let (checked, _) = crate::format::decode_batch_checksums(&batch).map_err(|e| damaged(e.to_string()))?;
            checked.checked_payload_in(&mut self.scratch).map_err(|e| damaged(e.to_string()))?;
            *off += total;
            if h.bound_ts > part.after {
                *read += 1;
                let at = if h.txn_count > 0 { h.first_ts } else { h.bound_ts };
                self.next = Some((at, batch));
                return Ok(());
            }
        }
    }
}

/// A gap's segment that no longer reads as it did when the gap was taken.
fn changed(path: &Path, what: String) -> std::io::Error {
    std::io::Error::other(format!("{}: {what} since the gap was taken", path.display()))
}

/// A backup promoted in place at a failover's recovery point (its engine replayed up to
/// the point and nothing above, at read view there: `ditto_replication::Backup::cut_at`):
/// the engine is written as a checkpoint at the point, the primary's log starts from it
/// (`OpenOptions::recovered`), and the replica log goes, with what it held above the
/// point. The checkpoint is durable before any replica file is removed; a crash between
/// leaves a backup's directory whose newest checkpoint is at the point.
///
/// The replica log and the older checkpoints are moved into `trash/` (a rename each) and
/// deleted there by a thread of their own: deleting hundreds of MB takes a fifth of a
/// second or more, which a failover need not wait for (nothing reads `trash/`; what a
/// crash leaves there is deleted by the next seal).
pub fn seal_at_point(db: &Database, data: &Path, storage: &dyn Storage) -> Result<CheckpointInfo, LogError> {
    let info =
        checkpoint::write(db, db.read(), data, recovery_threads(), 64 << 20, Epoch(0), storage, None, None, None)?;
    let root = checkpoint::checkpoints_dir(data);
    let mut gone: Vec<PathBuf> = Vec::new();
    for e in std::fs::read_dir(&root).map_err(|e| LogError::io(&root, e))? {
        let p = e.map_err(|e| LogError::io(&root, e))?.path();
        if p != info.dir {
            gone.push(p);
        }
    }
    if replica_dir(data).exists() {
        gone.push(replica_dir(data));
    }
    // The chain of sealed logs, newest first (`sealed::trash_links`).
    gone.extend(crate::sealed::link_paths(data)?.into_iter().rev());
    to_trash(data, &gone)?;
    crate::storage::sync_dir(&root).map_err(|e| LogError::io(&root, e))?;
    Ok(info)
}

/// Moves `paths` (inside `data`) into `data/trash/`, in their order, and deletes them
/// there on a thread of their own: nothing reads `trash/`, and what a crash leaves there
/// is deleted by the next call. Each rename is made durable (the directory it left
/// fsynced) before the next, so a crash leaves a prefix of them done, whatever the file
/// system orders. (`trash/` is not fsynced: a move a crash loses there is garbage anyway.)
pub fn to_trash(data: &Path, paths: &[PathBuf]) -> Result<(), LogError> {
    move_to_trash_with(data, paths, &mut |moved: &Path| {
        let dir = moved.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(data);
        crate::storage::sync_dir(dir).map_err(|e| LogError::io(dir, e))
    })?;
    delete_trash(data);
    Ok(())
}

/// What a backup sent a whole checkpoint by its primary moves aside (`to_trash`) before it
/// puts that checkpoint in place, in this order: the live replica log, the sealed links
/// newest first, then the checkpoints. A crash after any prefix of these renames leaves an
/// older state that opens as it is, never a replica log or sealed links without the
/// checkpoint they lie on (which an open would replay from ts 0).
pub fn replaced_by_a_checkpoint_copy(data: &Path) -> Result<Vec<PathBuf>, LogError> {
    let mut gone = vec![replica_dir(data)];
    gone.extend(crate::sealed::link_paths(data)?.into_iter().rev());
    gone.push(checkpoint::checkpoints_dir(data));
    gone.retain(|p| p.exists());
    Ok(gone)
}

/// `to_trash` for what no crash can bring back into use (an incomplete checkpoint: no
/// manifest): the renames are not made durable.
pub(crate) fn to_trash_unsynced(data: &Path, paths: &[PathBuf]) -> Result<(), LogError> {
    move_to_trash(data, paths)?;
    delete_trash(data);
    Ok(())
}

fn move_to_trash(data: &Path, paths: &[PathBuf]) -> Result<(), LogError> {
    move_to_trash_with(data, paths, &mut |_: &Path| Ok(()))
}

/// Renames each of `paths` into `data/trash/`, calling `after(path)` once it is moved.
fn move_to_trash_with(
    data: &Path,
    paths: &[PathBuf],
    after: &mut dyn FnMut(&Path) -> Result<(), LogError>,
) -> Result<(), LogError> {
    let trash = data.join(TRASH_DIR);
    std::fs::create_dir_all(&trash).map_err(|e| LogError::io(&trash, e))?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    for (i, p) in paths.iter().enumerate() {
        let to = trash.join(format!("{stamp}-{i}"));
        std::fs::rename(p, &to).map_err(|e| LogError::io(p, e))?;
        after(p)?;
    }
    Ok(())
}

/// Deletes what `data/trash/` holds, on a thread of its own.
fn delete_trash(data: &Path) {
    let trash = data.join(TRASH_DIR);
    let _ = std::thread::Builder::new().name("ditto-trash".into()).spawn(move || {
        if let Ok(entries) = std::fs::read_dir(&trash) {
            for e in entries.flatten() {
                // Another call's thread may delete the same entry: either is fine.
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    });
}

/// Where `seal_at_point` moves what it discards, to be deleted in the background.
pub const TRASH_DIR: &str = "trash";

/// A backup's own checkpoint: writes one of `db` at its read view (every transaction at or
/// below it installed, as a snapshot sees it), then deletes the older checkpoints. Its
/// replica log files that the new checkpoint covers may then go
/// (`ReplicaLog::remove_covered_by` with the returned timestamp); `open_replica` loads it
/// and replays only what lies above it. It writes at most `write_bytes_per_s` (0: as fast
/// as it goes; `LogOptions::checkpoint_write_bytes_per_s`), and goes unpaced while a
/// replayed write waits for its snapshot to end (`Database::checkpoint_reading`).
///
/// `gate` (`Database::replay_checkpoint_gate`) is held until the snapshot is taken, and no
/// longer: a redirect made after it moves only writes above the snapshot's timestamp (every
/// write at or below the read view is installed), which the snapshot does not read, so a
/// replayer that adds one need not wait out the paced write (30 s for 1 GB at the default
/// pace, with the replay budget full meanwhile).
pub fn checkpoint_replica(
    db: &Database,
    gate: ditto_engine::ReplayGate<'_>,
    data: &Path,
    storage: &dyn Storage,
    write_bytes_per_s: u64,
) -> Result<CheckpointInfo, LogError> {
    let threads = recovery_threads().min(2);
    let snap = db.read();
    // Replayed writes that wait for this snapshot to end (a key's new life) do not fail
    // for it, and make the write go unpaced while they wait.
    let _reading = db.checkpoint_reading(snap.ts());
    drop(gate);
    let info = checkpoint::write(
        db,
        snap,
        data,
        threads,
        64 << 20,
        Epoch(0),
        storage,
        checkpoint::Pace::new(write_bytes_per_s, Some(db.horizon_waiters())),
        None,
        // (A backup's replay follows its replica log's fsync: what it installed is
        // durable here.)
        None,
    )?;
    crate::remove_checkpoints_except(data, &info.dir)?;
    // At the read view, so at or above the sealed logs' points: they can go.
    crate::sealed::remove_sealed(data, info.ts, storage)?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{open, Durability, LogOptions, OpenOptions};
    use ditto_engine::WorkerId;

    /// What a reader of replica log files saw: each entry (file, stream, its bytes) and the
    /// totals, or the error it stopped on.
    type Seen = Result<(Vec<(usize, usize, Vec<u8>)>, Option<u32>, Vec<Ts>, Ts, u64, Option<(PathBuf, u64)>), String>;

    fn whole(files: &[(u64, PathBuf)]) -> Seen {
        let mut out = Vec::new();
        let r = read_files(files, |e| {
            out.push((e.file, e.stream, e.raw[e.offset..e.offset + e.used].to_vec()));
            true
        });
        r.map(|f| (out, f.streams, f.bounds, f.floor, f.log_bytes, f.torn)).map_err(|e| e.to_string())
    }

    fn each(files: &[(u64, PathBuf)]) -> Seen {
        let mut out = Vec::new();
        let r = read_files_each(files, |e| {
            out.push((e.file, e.stream, e.raw[e.offset..e.offset + e.used].to_vec()));
            true
        });
        r.map(|f| (out, f.streams, f.bounds, f.floor, f.log_bytes, f.torn)).map_err(|e| e.to_string())
    }

    /// A segment a checkpoint deletes between a gap's listing and its read: where it held
    /// nothing above the gap's start (the next segment's `prev_ts` says so), the gap is the
    /// same as one listed after the deletion; where it did, no gap (a copy is sent); a
    /// stream's last segment missing is an error, never skipped.
    #[test]
    fn a_segment_deleted_after_the_gap_listed_it_is_judged_by_the_next() {
        let primary = tempfile::tempdir().unwrap();
        let log =
            LogOptions { durability: Durability::EveryBatch, segment_bytes_max: 16 << 10, ..LogOptions::default() };
        let o = OpenOptions { workers: 1, log, ..Default::default() };
        let d = open(primary.path(), o).unwrap();
        let t = d.db().create_table("t").unwrap();
        let mut w = d.db().worker(WorkerId(0)).unwrap();
        for i in 0..200u64 {
            w.run(|x| x.put(t, &i.to_be_bytes(), &[7u8; 400]).map(|_| ())).unwrap().1.wait().unwrap();
        }
        drop(w);
        let epoch = d.logger().epoch();
        d.close();
        let listed = || -> Vec<crate::recovery::SegmentFile> {
            crate::recovery::list_segments(primary.path())
                .unwrap()
                .segments
                .into_iter()
                .filter(|s| s.epoch == epoch)
                .collect()
        };
        let segs = listed();
        assert!(segs.len() >= 4, "{} segments", segs.len());
        // Above what the first two segments hold: the third's `prev_ts`.
        let header = |p: &Path| crate::format::SegmentHeader::decode(&std::fs::read(p).unwrap()).unwrap();
        let after = header(&segs[2].path).prev_ts;
        let before_it = header(&segs[1].path).prev_ts;
        assert!(after > before_it && before_it > Ts::ZERO);
        let count = |g: Option<Gap>| g.map(|g| g.batches);
        let whole = count(gap_in_listed(&segs, after).unwrap());
        assert!(whole.is_some_and(|n| n > 0));
        // The first segment goes (a checkpoint covering it): the gap above `after` is the
        // same, listed before or after.
        std::fs::remove_file(&segs[0].path).unwrap();
        assert_eq!(count(gap_in_listed(&segs, after).unwrap()), whole);
        assert_eq!(count(gap_in_listed(&listed(), after).unwrap()), whole);
        // A gap from below the second segment's start, which held what it lacks, once the
        // second goes too: none (as from a listing without it).
        std::fs::remove_file(&segs[1].path).unwrap();
        assert_eq!(count(gap_in_listed(&segs, before_it).unwrap()), None);
        assert_eq!(count(gap_in_listed(&listed(), before_it).unwrap()), None);
        // The stream's last segment missing: an error naming it.
        let last = segs.last().unwrap();
        std::fs::remove_file(&last.path).unwrap();
        let e = match gap_in_listed(&segs, after) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a missing last segment fails the gap"),
        };
        assert!(e.contains(&last.path.display().to_string()), "{e}");
    }

    /// A gap's segment whose zeros written ahead are trimmed while it is scanned (the
    /// writer starting the stream's next segment) is scanned again at its new length: its
    /// batches are taken, the end clean. A segment trimmed at every scan is given up on
    /// after three, with the read's error.
    #[test]
    fn a_gap_segment_trimmed_under_its_scan_is_scanned_again() {
        let primary = tempfile::tempdir().unwrap();
        let o = OpenOptions { workers: 1, ..Default::default() };
        let d = open(primary.path(), o).unwrap();
        let t = d.db().create_table("t").unwrap();
        let mut w = d.db().worker(WorkerId(0)).unwrap();
        // Larger than the read window (256 KiB), so that the first scan counts batches
        // before it meets the trimmed end (a count carried over to the next would show).
        for i in 0..50u64 {
            w.run(|x| x.put(t, &i.to_be_bytes(), &[7u8; 8 << 10]).map(|_| ())).unwrap().1.wait().unwrap();
        }
        drop(w);
        d.close();
        let segs = crate::recovery::list_segments(primary.path()).unwrap().segments;
        // The segment as its writer leaves it while it is the stream's last: its batches,
        // then zeros written ahead.
        let path = primary.path().join("trimmed");
        let mut bytes = std::fs::read(&segs[0].path).unwrap();
        let whole = crate::format::read_segment(&Bytes::from(bytes.clone())).unwrap();
        let (valid, taken) = (whole.valid_len(), whole.batches.len());
        assert!(taken > 0 && valid > READ_WINDOW as u64, "{valid}");
        bytes.truncate(valid as usize);
        bytes.resize(valid as usize + (1 << 20), 0);
        let file_of = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap()
        };
        // Trimmed to its batches once its length was read, at the first scan only.
        let mut scans = 0;
        let trim_first = |f: &std::fs::File| {
            scans += 1;
            if scans == 1 {
                f.set_len(valid).unwrap();
            }
        };
        let (_, scan, batches) = scan_gap_segment(file_of(&bytes), Ts::ZERO, trim_first);
        let scan = scan.expect("scanned again at its new length");
        assert_eq!((scans, scan.valid_len, batches), (2, valid, taken));
        assert!(matches!(scan.end, crate::format::SegmentEnd::Clean), "{:?}", scan.end);
        // Untouched, one scan (the control): the zeros end it.
        let mut scans = 0;
        let (_, scan, batches) = scan_gap_segment(file_of(&bytes), Ts::ZERO, |_| scans += 1);
        assert_eq!((scans, scan.unwrap().valid_len, batches), (1, valid, taken));
        // Shorter at every scan: three, then the error.
        let mut scans = 0;
        let trim_each = |f: &std::fs::File| {
            scans += 1;
            f.set_len(f.metadata().unwrap().len() - 1000).unwrap();
        };
        let (_, scan, _) = scan_gap_segment(file_of(&bytes), Ts::ZERO, trim_each);
        match scan {
            Err(crate::format::ScanError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            other => panic!("{other:?}"),
        }
        assert_eq!(scans, 3);
    }

    /// A replica log of 400 commits over two streams, in files of about 2 KiB.
    fn small_files_log() -> (tempfile::TempDir, tempfile::TempDir) {
        let primary = tempfile::tempdir().unwrap();
        let o = OpenOptions {
            workers: 2,
            log: LogOptions { durability: Durability::EveryBatch, ..LogOptions::default() },
            ..Default::default()
        };
        let d = open(primary.path(), o).unwrap();
        let t = d.db().create_table("t").unwrap();
        for (worker, base) in [(0u32, 0u64), (1, 1000)] {
            let mut w = d.db().worker(WorkerId(worker)).unwrap();
            for i in base..base + 200 {
                w.run(|x| x.put(t, &i.to_be_bytes(), &i.to_le_bytes()).map(|_| ())).unwrap().1.wait().unwrap();
            }
        }
        let epoch = d.logger().epoch();
        d.close();
        let batches = batches_after(primary.path(), epoch, Ts::ZERO).unwrap().unwrap().collect().unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(primary.path().join("CATALOG"), dir.path().join("CATALOG")).unwrap();
        let storage: Arc<dyn Storage> = Arc::new(crate::storage::RealStorage);
        let mut log = ReplicaLog::create(dir.path(), storage, 2, 1, 2048).unwrap();
        for x in &batches {
            let h = crate::format::decode_batch_checksums(x).unwrap().0.header;
            log.append(x, h.stream.0 == 0, h.bound_ts);
            // (A file is closed at a sync once full.)
            log.sync().unwrap();
        }
        (primary, dir)
    }

    /// Read an entry at a time, a replica log gives exactly what it gives read a file at a
    /// time: the same entries, totals and torn tail, whole; cut short at every length of
    /// its newest file; and with any one byte changed, of the newest file or an older one
    /// (the same entries up to the damage, or the same error, where and why).
    #[test]
    fn read_an_entry_at_a_time_the_log_reads_as_a_file_at_a_time_whatever_its_damage() {
        let (_primary, dir) = small_files_log();
        let files = live_files(dir.path()).unwrap();
        assert!(files.len() >= 4, "several files: {}", files.len());
        let read = whole(&files);
        let (entries, ..) = read.as_ref().unwrap();
        assert!(entries.len() > 20 && entries.iter().any(|e| e.1 == 0) && entries.iter().any(|e| e.1 == 1));
        assert_eq!(each(&files), read);

        let (newest, older) = (&files[files.len() - 1].1, &files[1].1);
        for path in [newest, older] {
            let good = std::fs::read(path).unwrap();
            let mut outcomes = std::collections::BTreeSet::new();
            for at in 0..good.len() {
                let mut bad = good.clone();
                bad[at] ^= 0x5a;
                std::fs::write(path, &bad).unwrap();
                let read = whole(&files);
                assert_eq!(each(&files), read, "{} with byte {at} changed", path.display());
                outcomes.insert(read.map(|r| r.5.is_some()).map_err(|_| ()));
            }
            if path == newest {
                for len in 0..good.len() {
                    std::fs::write(path, &good[..len]).unwrap();
                    let read = whole(&files);
                    assert_eq!(each(&files), read, "{} cut at {len}", path.display());
                    outcomes.insert(read.map(|r| r.5.is_some()).map_err(|_| ()));
                }
            }
            std::fs::write(path, &good).unwrap();
            // (Both kinds of outcome came up: the comparison covered each.)
            let kinds = if path == newest { vec![Ok(true), Err(())] } else { vec![Err(())] };
            for k in kinds {
                assert!(outcomes.contains(&k), "{}: {k:?} in {outcomes:?}", path.display());
            }
        }
        assert_eq!(each(&files), whole(&files));
    }

    /// A burst of five entries after 4 KiB synced, each claiming those 4 KiB: damage to
    /// one is a torn write, cut with the whole entries after it, which the warning counts
    /// (`torn_entries_after`); where a later entry claims the damaged bytes synced, damage.
    #[test]
    fn a_burst_torn_out_of_order_counts_the_whole_entries_cut_with_it() {
        let base = 4096u64;
        let burst = |claims: &[u64]| {
            let (mut raw, mut at) = (Vec::new(), Vec::new());
            for (i, &claim) in claims.iter().enumerate() {
                let mut batch = Vec::new();
                let bound = Ts(100 + 10 * i as u64);
                crate::format::BatchBuilder::new().finish_into(
                    crate::format::StreamId(0),
                    Epoch(1),
                    bound,
                    false,
                    &mut batch,
                );
                at.push(raw.len());
                raw.extend_from_slice(&entry_header(batch.len(), 0, claim));
                raw.extend_from_slice(&batch);
            }
            (raw, at)
        };
        let damaged = |raw: &[u8], at: usize| {
            let mut raw = raw.to_vec();
            raw[at + ENTRY_HEADER_LEN + 20] ^= 0x10;
            let raw = Bytes::from(raw);
            assert!(decode_entry(&raw, at, ENTRY_SYNCED_VERSION).is_err());
            torn_entries_after(&raw, at, base, ENTRY_SYNCED_VERSION)
        };
        let (raw, at) = burst(&[base; 5]);
        for (i, &off) in at.iter().enumerate() {
            assert_eq!(damaged(&raw, off), Some((at.len() - 1 - i) as u32), "entry {i} damaged");
        }
        // The last entry claims 256 bytes more synced (claims are in 256-byte units): damage
        // to an entry below that is damage, to one at or past it a torn write.
        let claim = base + ENTRY_SYNCED_UNIT;
        let (raw, at) = burst(&[base, base, base, base, claim]);
        assert!(at[1] < ENTRY_SYNCED_UNIT as usize && at[4] >= ENTRY_SYNCED_UNIT as usize, "{at:?}");
        for (i, &off) in at.iter().enumerate() {
            let want = (base + off as u64 >= claim).then_some((at.len() - 1 - i) as u32);
            assert_eq!(damaged(&raw, off), want, "entry {i} damaged, at {off}");
        }
        // In a format-1 file any whole entry after the damage is damage.
        let (raw, at) = burst(&[0; 5]);
        let mut bad = raw.clone();
        bad[at[1] + ENTRY_HEADER_LEN + 20] ^= 0x10;
        assert_eq!(torn_entries_after(&Bytes::from(bad), at[1], base, 1), None);
    }
}
