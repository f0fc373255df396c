//! Checkpoints
//! ===========
//! A checkpoint is a transaction-consistent image of every table at one snapshot
//! timestamp `C`, taken through an ordinary read-only snapshot, so workers never stop.
//! Threads split the tables into record-id ranges and each writes its own part files, a new
//! one whenever its part has grown past `LogOptions::checkpoint_part_bytes` (so recovery,
//! which has every core, loads it on more threads than wrote it):
//!
//! ```text
//!  checkpoints/ckpt-<C:020>/part-0000.dat ... part-NNNN.dat   (rows: table, rid, ts, key, value)
//!  checkpoints/ckpt-<C:020>/MANIFEST                          (written last, atomically)
//! ```
//!
//! A checkpoint exists only once its MANIFEST does; a directory without one is a
//! half-written checkpoint and is ignored (and deleted) in favour of the previous one. A
//! complete checkpoint is never removed to write the same timestamp again (see `write`). Once
//! the manifest is durable, log segments whose transactions are all at or below `C` and
//! older checkpoints are deleted. The manifest also names the oldest log epoch still
//! relevant (`log_epoch_min`): segments of older epochs were superseded by recovery.
//!
//! Formats are in docs/checkpoint-format.md.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ditto_engine::{Database, ReadTxn, RecordId, TableId, Ts};

use crate::arena::KeyArena;

use crate::catalog::write_atomically;
use crate::format::Epoch;
use crate::storage::{LogFile, LogFileWriter, Storage};
use crate::LogError;

const PART_MAGIC: &[u8; 8] = b"DITTOCKP";
const END_MAGIC: &[u8; 8] = b"DITTOEND";
const MANIFEST_MAGIC: &[u8; 8] = b"DITTOMAN";
pub const CHECKPOINT_FORMAT_VERSION: u32 = 1;
const PART_HEADER_LEN: usize = 32;
const PART_TRAILER_LEN: usize = 24;
const RIDS_PER_TASK: u64 = 1 << 16;

/// The most parts a checkpoint has (4M: 256 TiB at the default 64 MiB a part), and so
/// the longest its manifest can be: a longer MANIFEST's size is damaged, and is refused
/// before it is read (read whole, a damaged inode's 40 GiB would have held the open in
/// memory until the process was killed, as the log's segments could before 2026-12-06).
pub const PARTS_MAX: usize = 1 << 22;
pub const MANIFEST_BYTES_MAX: u64 = 36 + 20 * PARTS_MAX as u64;
/// A paced checkpoint's writer checks its pace, and starts the write-back of what it
/// wrote, every `Pace::step` bytes: about 8 ms of its pace (so a writer sleeps about that
/// long at a time, and a cancelled one stops that soon: a fence waits for it), between
/// these bounds. A fixed 1 MiB step made a writer at a backup's 32 MB/s sleep 32 ms at a
/// time, and one at 8 MB/s 128 ms.
const PACE_STEP_MAX: u64 = 1 << 20;
const PACE_STEP_MIN: u64 = 64 << 10;

/// How fast a checkpoint taken while the node serves may write: its writer threads
/// together write at most `bytes_per_s`, and each starts the write-back of its part every
/// `step` bytes (`LogFile::write_back`). Unpaced, three nodes writing a 466 MB checkpoint
/// each (the seals and the rejoin after a failover) filled the disk's queue, so every
/// commit's fsync waited behind it (docs/cluster.md, "Paced checkpoints"). What the pace
/// costs is time: a checkpoint of B bytes takes at least B / `bytes_per_s`, unless
/// someone waits for it (`hurry` above 0: a backup joining, which needs it, or another
/// checkpoint asked for), and then it goes as fast as it can.
#[derive(Debug)]
pub(crate) struct Pace<'a> {
    start: Instant,
    bytes_per_s: f64,
    written: AtomicU64,
    hurry: Option<&'a AtomicUsize>,
    /// Bytes between looks at the pace (see `PACE_STEP_MAX`).
    step: u64,
}

impl<'a> Pace<'a> {
    /// `None` for 0 (unpaced).
    pub(crate) fn new(bytes_per_s: u64, hurry: Option<&'a AtomicUsize>) -> Option<Pace<'a>> {
        (bytes_per_s > 0).then(|| Pace {
            start: Instant::now(),
            bytes_per_s: bytes_per_s as f64,
            written: AtomicU64::new(0),
            hurry,
            step: (bytes_per_s / 128).clamp(PACE_STEP_MIN, PACE_STEP_MAX),
        })
    }

    /// Counts `n` more bytes written, and sleeps until the pace allows them.
    fn wrote(&self, n: u64) {
        let total = self.written.fetch_add(n, Ordering::Relaxed) + n;
        if self.hurry.is_some_and(|h| h.load(Ordering::Relaxed) > 0) {
            return;
        }
        let due = self.start + Duration::from_secs_f64(total as f64 / self.bytes_per_s);
        // In steps, so that a hurry that comes while it sleeps ends the sleep.
        loop {
            let now = Instant::now();
            if due <= now || self.hurry.is_some_and(|h| h.load(Ordering::Relaxed) > 0) {
                return;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(20)));
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    pub rows: u64,
    pub bytes: u64,
    pub crc: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub ts: Ts,
    pub log_epoch_min: Epoch,
    pub parts: Vec<PartInfo>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MANIFEST_MAGIC);
        b.extend_from_slice(&CHECKPOINT_FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.ts.0.to_le_bytes());
        b.extend_from_slice(&self.log_epoch_min.0.to_le_bytes());
        b.extend_from_slice(&(self.parts.len() as u32).to_le_bytes());
        for p in &self.parts {
            b.extend_from_slice(&p.rows.to_le_bytes());
            b.extend_from_slice(&p.bytes.to_le_bytes());
            b.extend_from_slice(&p.crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8], file: &Path) -> Result<Manifest, LogError> {
        let bad = |offset: u64, what: &str| LogError::Corrupt { file: file.to_path_buf(), offset, what: what.into() };
        if b.len() < 36 || &b[..8] != MANIFEST_MAGIC {
            return Err(bad(0, "not a checkpoint manifest"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
            return Err(bad(0, "manifest checksum mismatch"));
        }
        let u32_at = |p: usize| u32::from_le_bytes(body[p..p + 4].try_into().unwrap());
        let u64_at = |p: usize| u64::from_le_bytes(body[p..p + 8].try_into().unwrap());
        let version = u32_at(8);
        if version != CHECKPOINT_FORMAT_VERSION {
            return Err(bad(8, &format!("unsupported checkpoint version {version}")));
        }
        let n = u32_at(28) as usize;
        if n > PARTS_MAX {
            return Err(bad(28, &format!("a part count of {n}, more than the {PARTS_MAX} a checkpoint has")));
        }
        if body.len() != 32 + n * 20 {
            return Err(bad(28, "manifest length does not match its part count"));
        }
        let parts = (0..n)
            .map(|i| {
                let p = 32 + i * 20;
                PartInfo { rows: u64_at(p), bytes: u64_at(p + 8), crc: u32_at(p + 16) }
            })
            .collect();
        Ok(Manifest { ts: Ts(u64_at(12)), log_epoch_min: Epoch(u64_at(20)), parts })
    }
}

/// What a checkpoint wrote.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    pub ts: Ts,
    pub dir: PathBuf,
    pub rows: u64,
    pub bytes: u64,
    pub parts: usize,
    pub seconds: f64,
    /// The CPU time its writing took, summed over its threads (`write`; next to none for
    /// one found already written at its timestamp).
    pub cpu_seconds: f64,
}

impl CheckpointInfo {
    /// What the checkpoint in `dir` with manifest `m` holds, `started` being when writing it began.
    fn of(m: &Manifest, dir: PathBuf, started: Instant) -> CheckpointInfo {
        CheckpointInfo {
            ts: m.ts,
            dir,
            rows: m.parts.iter().map(|p| p.rows).sum(),
            bytes: m.parts.iter().map(|p| p.bytes).sum(),
            parts: m.parts.len(),
            seconds: started.elapsed().as_secs_f64(),
            cpu_seconds: 0.0,
        }
    }
}

/// Hard-links the checkpoint in `dir`, its MANIFEST and the parts it names, into the new
/// directory `to` (so the files stay while a later checkpoint deletes `dir`: a copy being
/// sent to a backup); returns their names. Nothing else in `dir` goes: before 2026-12-06
/// every file did, and a `MANIFEST.tmp` left by a crash while the manifest was rewritten
/// (`raise_manifest_epoch`) went to every backup that joined, which refused the copy (only
/// a MANIFEST and its parts may come), join after join (found by a review).
pub fn link_files(dir: &Path, to: &Path) -> Result<Vec<String>, LogError> {
    let mpath = dir.join("MANIFEST");
    let m = match read_manifest(&mpath)? {
        Some(b) => Manifest::decode(&b, &mpath)?,
        None => return Err(LogError::io(&mpath, std::io::ErrorKind::NotFound.into())),
    };
    std::fs::create_dir_all(to).map_err(|e| LogError::io(to, e))?;
    let mut files: Vec<String> = (0..m.parts.len()).map(part_name).collect();
    files.push("MANIFEST".into());
    for name in &files {
        let p = dir.join(name);
        std::fs::hard_link(&p, to.join(name)).map_err(|e| LogError::io(&p, e))?;
    }
    Ok(files)
}

/// The bytes of the MANIFEST at `mpath`, `None` where there is none; one longer than any
/// manifest can be (`MANIFEST_BYTES_MAX`) is refused before it is read.
pub fn read_manifest(mpath: &Path) -> Result<Option<Vec<u8>>, LogError> {
    match crate::options::read_file_at_most(mpath, MANIFEST_BYTES_MAX, "a checkpoint's MANIFEST") {
        Ok(b) => Ok(Some(b)),
        Err(LogError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn checkpoints_dir(data: &Path) -> PathBuf {
    data.join("checkpoints")
}

fn ckpt_dir(data: &Path, ts: Ts) -> PathBuf {
    checkpoints_dir(data).join(format!("ckpt-{:020}", ts.0))
}

/// Refuses a manifest (at `mpath`) whose timestamp is not `ts`, the one its directory's
/// name gives. The name orders the checkpoints: one whose manifest says another time (a
/// directory renamed, or a manifest copied in) could be taken for the newest where it is
/// not, or the newest passed over.
fn named_ts(m: &Manifest, ts: Ts, mpath: &Path) -> Result<(), LogError> {
    if m.ts == ts {
        return Ok(());
    }
    Err(LogError::Corrupt {
        file: mpath.to_path_buf(),
        offset: 12,
        what: format!("the manifest is of ts {}, its directory's name says ts {}", m.ts.0, ts.0),
    })
}

/// The timestamp a checkpoint directory's name gives (`ckpt-` and 20 digits, as
/// `ckpt_dir` makes it), or `None` for any other name.
fn parse_ckpt_name(name: &std::ffi::OsStr) -> Option<Ts> {
    let digits = name.to_str()?.strip_prefix("ckpt-")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Ts)
}

fn part_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(part_name(i))
}

/// The name of a checkpoint's part `i` in its directory.
pub fn part_name(i: usize) -> String {
    format!("part-{i:04}.dat")
}

/// Raises the newest checkpoint's `log_epoch_min` to `epoch` where it is lower (its
/// manifest rewritten atomically), so that `data` opened as a primary's from then on writes
/// `epoch` at least, even once what else recorded it is gone: a promoted backup's followed
/// epoch goes with its replica log before the primary's first segments exist, and a crash
/// between the two opened epoch 1 (a backup of the old primary could then have been resumed
/// from the new one's log as if it were the same history; found by a review, 2026-12-03).
/// Nothing without a checkpoint.
pub fn raise_epoch_floor(data: &Path, epoch: Epoch, storage: &dyn Storage) -> Result<(), LogError> {
    let Some((dir, mut m)) = crate::sealed::base(data)?.ckpt else { return Ok(()) };
    raise_manifest_epoch(&dir, &mut m, epoch, storage)?;
    storage.sync_dir(&dir).map_err(|e| LogError::io(&dir, e))?;
    // The checkpoint's own name too: an attempt that died after its manifest's rename but
    // before `checkpoints/` was synced left a checkpoint a power cut may still take away,
    // and the raised floor with it (`write` syncs it on its same-timestamp path for the
    // same reason; found by a review, 2026-12-05).
    let root = checkpoints_dir(data);
    storage.sync_dir(&root).map_err(|e| LogError::io(&root, e))
}

/// Moves the manifest `m` of the checkpoint in `dir` to `epoch` where its
/// `log_epoch_min` is lower, in one atomic write.
fn raise_manifest_epoch(dir: &Path, m: &mut Manifest, epoch: Epoch, storage: &dyn Storage) -> Result<(), LogError> {
    if m.log_epoch_min < epoch {
        m.log_epoch_min = epoch;
        write_atomically(dir, "MANIFEST", &m.encode(), storage).map_err(|e| LogError::io(dir, e))?;
    }
    Ok(())
}

/// Writes a checkpoint of `db` at its snapshot `snap` (`db.read()`, taken by the caller: a
/// backup takes it under its replay gate and lets the gate go before the write, see
/// `replica::checkpoint_replica`) with `threads` writers, each starting a new part once its
/// part is over `part_bytes`, every file through `storage`. Deletes nothing older; the
/// caller does that once this returns. On an error (a full disk, a failed fsync) the new
/// checkpoint's directory is removed and the previous one stays.
///
/// With `cpu`, the CPU time its threads take is added to it (nanoseconds) as they go, a
/// part writer's after each of its tasks, a failed or cancelled attempt's too: a reader of
/// `cpu` over a window sees what was spent in it, to a task's worth (the log's
/// `checkpoint_cpu_ns`; before 2026-12-04 a checkpoint's CPU was counted whole when it
/// completed, and a benchmark's window took in what was spent before it, or after).
///
/// With `durable`, it is asked, once the parts are written and before the manifest makes
/// the checkpoint complete, to wait until the log has made every commit up to the
/// snapshot's timestamp durable: a snapshot sees commits installed and not yet durable,
/// and one whose fsync then failed (answered as failed to its client, the log failed)
/// would otherwise be made durable by the checkpoint, and come back at the next open
/// (found by a review, 2026-12-05, night). An error fails the attempt.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write(
    db: &Database,
    snap: ReadTxn<'_>,
    data: &Path,
    threads: usize,
    part_bytes: u64,
    log_epoch_min: Epoch,
    storage: &dyn Storage,
    pace: Option<Pace<'_>>,
    cpu: Option<&AtomicU64>,
    durable: Option<&DurableGate<'_>>,
) -> Result<CheckpointInfo, LogError> {
    let t0 = Instant::now();
    let ts = snap.ts();
    let dir = ckpt_dir(data, ts);
    let root = checkpoints_dir(data);
    // (Not `exists`, which says no on any error: then the directory made below would be
    // a complete checkpoint's, and the failed attempt's clean-up would remove it.)
    if dir.try_exists().map_err(|e| LogError::io(&dir, e))? {
        let mpath = dir.join("MANIFEST");
        match read_manifest(&mpath)? {
            // A complete checkpoint at this very timestamp (nothing committed since it was
            // taken, as after a recovery that replayed nothing): the same image. It may be the
            // only complete checkpoint, so it is kept, never removed and rewritten (a crash
            // in between would leave none); only its manifest moves to the newer epoch, in
            // one atomic write.
            Some(b) => {
                let mut m = Manifest::decode(&b, &mpath)?;
                named_ts(&m, ts, &mpath)?;
                raise_manifest_epoch(&dir, &mut m, log_epoch_min, storage)?;
                // Durable under its name before the caller deletes segments it covers: the
                // attempt that wrote it may have died before it synced `checkpoints/`
                // (before 2026-12-02 this path synced neither; the normal path does both).
                storage.sync_dir(&dir).map_err(|e| LogError::io(&dir, e))?;
                storage.sync_dir(&root).map_err(|e| LogError::io(&root, e))?;
                return Ok(CheckpointInfo::of(&m, dir, t0));
            }
            // A leftover of an earlier attempt at the same timestamp, never complete.
            None => std::fs::remove_dir_all(&dir).map_err(|e| LogError::io(&dir, e))?,
        }
    }
    std::fs::create_dir_all(&root).map_err(|e| LogError::io(&root, e))?;
    // Made here, never found: one that exists is not this attempt's to clean up.
    std::fs::create_dir(&dir).map_err(|e| LogError::io(&dir, e))?;
    // A panic fails the attempt as an error does, and is cleaned up as one (uncaught, it
    // left the directory, nearly a whole checkpoint, behind at every retry; found by a
    // review).
    let cpu0 = crate::thread_cpu_ns();
    let writers_cpu = AtomicU64::new(0);
    let written = ditto_engine::catch_panic(|| {
        write_new(
            db,
            &snap,
            &dir,
            threads,
            part_bytes,
            log_epoch_min,
            storage,
            pace.as_ref(),
            &writers_cpu,
            cpu,
            durable,
        )
    })
    .unwrap_or_else(|msg| Err(LogError::Panicked("the checkpoint writer", msg)))
    .and_then(|m| storage.sync_dir(&root).map(|()| m).map_err(|e| LogError::io(&root, e)));
    // This thread's share (the tasks' list, the joins, the manifest), whatever the outcome.
    let own = crate::thread_cpu_ns().saturating_sub(cpu0);
    if let Some(c) = cpu {
        c.fetch_add(own, Ordering::Relaxed);
    }
    let writers_cpu_ns = writers_cpu.into_inner();
    match written {
        Ok(manifest) => Ok(CheckpointInfo {
            cpu_seconds: (own + writers_cpu_ns) as f64 / 1e9,
            ..CheckpointInfo::of(&manifest, dir, t0)
        }),
        Err(e) => {
            // A full disk, or a failed write or fsync: the attempt leaves nothing behind,
            // and the caller deletes no segment, so the previous checkpoint and the log
            // still hold everything. The manifest goes first, so a directory that lost some
            // of its parts never looks complete; if it cannot be removed, the checkpoint
            // was complete (parts and manifest synced) and may stay.
            //
            // Its files are moved to the trash (a rename) and deleted there on a thread of
            // their own: unlinking hundreds of MB whose write-back is under way took 155 ms
            // on the VM, and a fence that stops a backup's checkpoint (with a failover
            // behind it) waited for that. Where the rename fails (a full disk may refuse
            // the trash directory), they are deleted here.
            let t = Instant::now();
            match std::fs::remove_file(dir.join("MANIFEST")) {
                Err(r) if r.kind() != std::io::ErrorKind::NotFound => {}
                _ => {
                    // The removal durable before the parts go (a review, 2026-12-06): a
                    // file system that keeps no order among metadata operations could
                    // otherwise bring the manifest back after a power cut without its
                    // parts, a newest checkpoint that refuses to load where the one
                    // before it and the log hold everything. (If this sync fails, the
                    // parts still go: the manifest's removal may then not be durable.)
                    let _ = storage.sync_dir(&dir);
                    if crate::replica::to_trash_unsynced(data, std::slice::from_ref(&dir)).is_err() {
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                }
            }
            tracing::info!(
                "checkpoint at ts {} failed after {:.1} ms, its files put aside in {:.1} ms: {e}",
                ts.0,
                (t - t0).as_secs_f64() * 1e3,
                t.elapsed().as_secs_f64() * 1e3
            );
            Err(e)
        }
    }
}

/// Waits until the log has made every commit up to a timestamp durable, or says why it
/// never will (`write`'s `durable`).
pub(crate) type DurableGate<'a> = dyn Fn(Ts) -> Result<(), LogError> + Sync + 'a;

/// Writes the parts, then the manifest, of a new checkpoint of `snap` into `dir`, at
/// `pace` if given.
#[allow(clippy::too_many_arguments)]
fn write_new(
    db: &Database,
    snap: &ReadTxn<'_>,
    dir: &Path,
    threads: usize,
    part_bytes: u64,
    log_epoch_min: Epoch,
    storage: &dyn Storage,
    pace: Option<&Pace<'_>>,
    writers_cpu: &AtomicU64,
    cpu: Option<&AtomicU64>,
    durable: Option<&DurableGate<'_>>,
) -> Result<Manifest, LogError> {
    let ts = snap.ts();
    let mut tasks = Vec::new();
    for (table, _) in db.tables() {
        let limit = snap.rid_limit(table).map_err(LogError::Engine)?;
        let mut start = 0;
        while start < limit {
            tasks.push((table, start..(start + RIDS_PER_TASK).min(limit)));
            start += RIDS_PER_TASK;
        }
    }
    let next = AtomicUsize::new(0);
    let next_part = AtomicUsize::new(0);
    // Set by a writer that failed or panicked: the others stop before their next task (the
    // attempt has failed; they wrote on to its end before).
    let failed = AtomicBool::new(false);
    let threads = threads.clamp(1, tasks.len().max(1));
    let written: Vec<Result<Vec<(usize, PartInfo)>, LogError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (tasks, next, next_part, failed) = (&tasks, &next, &next_part, &failed);
                // Adds this writer's CPU since the last call to `writers_cpu` and `cpu`.
                let account = move |last: &std::cell::Cell<u64>| {
                    let now = crate::thread_cpu_ns();
                    let d = now.saturating_sub(last.replace(now));
                    writers_cpu.fetch_add(d, Ordering::Relaxed);
                    if let Some(c) = cpu {
                        c.fetch_add(d, Ordering::Relaxed);
                    }
                };
                let part_writer = move |last: &std::cell::Cell<u64>| -> Result<Vec<(usize, PartInfo)>, LogError> {
                    // Every part number handed out gets its file and its manifest entry, so
                    // the numbers are 0..n without gaps.
                    let start = || -> Result<(usize, PathBuf, PartWriter), LogError> {
                        let i = next_part.fetch_add(1, Ordering::Relaxed);
                        let path = part_path(dir, i);
                        let f = storage.create_new(&path).map_err(|e| LogError::io(&path, e))?;
                        Ok((i, path, PartWriter::new(f, i as u32, ts, pace)))
                    };
                    let mut done = Vec::new();
                    let (mut i, mut path, mut w) = start()?;
                    loop {
                        if failed.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some((table, rids)) = tasks.get(k) else { break };
                        let mut err = None;
                        // A part is rolled at the row that finds it full, so none is longer
                        // than `part_bytes` and one row: a load reads each part whole, on
                        // each of its threads. (Before 2026-12-05 a part was rolled between
                        // tasks, 65,536 record ids each: a task of large values made one
                        // part of gigabytes, which a load then read into memory whole.)
                        // The first failed write ends the walk (a cancelled checkpoint stops
                        // at once, not after the rest of the task's records).
                        snap.for_each_record(*table, rids.clone(), |rid, key, vts, val| {
                            let mut row = || -> Result<(), LogError> {
                                if w.bytes >= part_bytes {
                                    let (ni, npath, nw) = start()?;
                                    let full = std::mem::replace(&mut w, nw);
                                    done.push((i, full.finish().map_err(|e| LogError::io(&path, e))?));
                                    (i, path) = (ni, npath);
                                }
                                w.row(*table, rid, vts, key, val).map_err(|e| LogError::io(&path, e))
                            };
                            match row() {
                                Ok(()) => std::ops::ControlFlow::Continue(()),
                                Err(e) => {
                                    err = Some(e);
                                    std::ops::ControlFlow::Break(())
                                }
                            }
                        })
                        .map_err(LogError::Engine)?;
                        if let Some(e) = err {
                            return Err(e);
                        }
                        account(last);
                    }
                    done.push((i, w.finish().map_err(|e| LogError::io(&path, e))?));
                    Ok(done)
                };
                s.spawn(move || {
                    let last = std::cell::Cell::new(crate::thread_cpu_ns());
                    let r = ditto_engine::catch_panic(|| part_writer(&last))
                        .unwrap_or_else(|msg| Err(LogError::Panicked("the checkpoint writer", msg)));
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    account(&last);
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let mut numbered = Vec::new();
    for w in written {
        numbered.extend(w?);
    }
    numbered.sort_unstable_by_key(|(i, _)| *i);
    debug_assert!(numbered.iter().enumerate().all(|(k, (i, _))| k == *i), "part numbers 0..n");
    let parts: Vec<PartInfo> = numbered.into_iter().map(|(_, p)| p).collect();
    let manifest = Manifest { ts, log_epoch_min, parts };
    if let Some(wait) = durable {
        wait(ts)?;
    }
    storage.sync_dir(dir).map_err(|e| LogError::io(dir, e))?;
    write_atomically(dir, "MANIFEST", &manifest.encode(), storage)
        .map_err(|e| LogError::io(&dir.join("MANIFEST"), e))?;
    Ok(manifest)
}

/// One part file being written, through the storage and a 1 MiB buffer, at the
/// checkpoint's pace if it has one.
struct PartWriter<'p, 'h> {
    out: BufWriter<LogFileWriter>,
    crc: u32,
    bytes: u64,
    rows: u64,
    pace: Option<&'p Pace<'h>>,
    /// Bytes put since the pace was last told.
    unpaced: u64,
}

impl<'p, 'h> PartWriter<'p, 'h> {
    fn new(file: Box<dyn LogFile>, part: u32, ts: Ts, pace: Option<&'p Pace<'h>>) -> Self {
        let out = BufWriter::with_capacity(1 << 20, LogFileWriter(file));
        let mut w = PartWriter { out, crc: 0, bytes: 0, rows: 0, pace, unpaced: 0 };
        let mut h = [0u8; PART_HEADER_LEN];
        h[..8].copy_from_slice(PART_MAGIC);
        h[8..12].copy_from_slice(&CHECKPOINT_FORMAT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&part.to_le_bytes());
        h[16..24].copy_from_slice(&ts.0.to_le_bytes());
        let hc = crc32c::crc32c(&h[..28]);
        h[28..32].copy_from_slice(&hc.to_le_bytes());
        w.pending_err(&h);
        w
    }

    fn pending_err(&mut self, b: &[u8]) {
        // Header write errors surface at the first row or at finish (BufWriter buffers).
        let _ = self.put(b);
    }

    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, b);
        self.bytes += b.len() as u64;
        self.out.write_all(b)?;
        if let Some(pace) = self.pace {
            self.unpaced += b.len() as u64;
            if self.unpaced >= pace.step {
                // A hint: a file system without it leaves the write-back to the part's
                // fsync, which reports any write error.
                let _ = self.out.get_mut().0.write_back();
                pace.wrote(std::mem::take(&mut self.unpaced));
            }
        }
        Ok(())
    }

    fn row(&mut self, table: TableId, rid: RecordId, ts: Ts, key: &[u8], val: &[u8]) -> std::io::Result<()> {
        let mut h = [0u8; 24];
        h[..4].copy_from_slice(&table.0.to_le_bytes());
        h[4..12].copy_from_slice(&rid.0.to_le_bytes());
        h[12..20].copy_from_slice(&ts.0.to_le_bytes());
        h[20..24].copy_from_slice(&(key.len() as u32).to_le_bytes());
        self.put(&h)?;
        self.put(key)?;
        self.put(&(val.len() as u32).to_le_bytes())?;
        self.put(val)?;
        self.rows += 1;
        Ok(())
    }

    fn finish(mut self) -> std::io::Result<PartInfo> {
        let mut t = [0u8; PART_TRAILER_LEN];
        t[..8].copy_from_slice(END_MAGIC);
        t[8..16].copy_from_slice(&self.rows.to_le_bytes());
        t[16..20].copy_from_slice(&self.crc.to_le_bytes());
        self.out.write_all(&t)?;
        self.bytes += PART_TRAILER_LEN as u64;
        let mut file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.0.sync()?;
        let crc = crc32c::crc32c_append(self.crc, &t);
        Ok(PartInfo { rows: self.rows, bytes: self.bytes, crc })
    }
}

/// The newest complete checkpoint, if any. Directories without a MANIFEST are half-written
/// and returned in `incomplete` for deletion. A MANIFEST that does not decode is corruption.
/// The newest complete checkpoint (directory and manifest), and the directories to delete.
pub(crate) type Found = (Option<(PathBuf, Manifest)>, Vec<PathBuf>);

/// The newest complete checkpoint of data directory `data`, if any: its directory and
/// manifest (`find_newest`, for a reader outside the crate: `ditto bench recovery` times a
/// backup's `check` of it).
pub fn newest(data: &Path) -> Result<Option<(PathBuf, Manifest)>, LogError> {
    Ok(find_newest(data)?.0)
}

pub(crate) fn find_newest(data: &Path) -> Result<Found, LogError> {
    let root = checkpoints_dir(data);
    // An entry that cannot be read is an error, not skipped: the listing stops at it, and
    // the checkpoints after it (the newest among them, maybe) would be passed over for an
    // older one, silently (found by a review, 2026-12-05).
    //
    // `checkpoints/` is ditto's alone, as `log/` is: anything else in it is refused, naming
    // it, as an unexpected file in `log/` is. Before 2026-12-05 any entry whose name began
    // with `ckpt-` was taken for a checkpoint and others were passed over: a plain file so
    // named stopped the open with "Not a directory", and a directory a person made there
    // (`ckpt-old`, say) sorted above every real one, was taken for the newest checkpoint
    // left half-written, and deleted with what it held (found by a review).
    let mut dirs: Vec<(Ts, PathBuf)> = Vec::new();
    match std::fs::read_dir(&root) {
        Ok(rd) => {
            for e in rd {
                let e = e.map_err(|e| LogError::io(&root, e))?;
                let p = e.path();
                let unexpected = |what: &str| LogError::Corrupt { file: p.clone(), offset: 0, what: what.into() };
                let Some(ts) = parse_ckpt_name(&e.file_name()) else {
                    return Err(unexpected(
                        "unexpected entry in the checkpoints directory (only ditto's checkpoints, \
                         ckpt-<20-digit timestamp> directories, belong there)",
                    ));
                };
                match std::fs::metadata(&p) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => return Err(unexpected("a checkpoint's name on something that is not a directory")),
                    // Gone since the listing: a running node moves older checkpoints, and a
                    // failed attempt's, to the trash while others read this directory (a
                    // report's `sealed::base`); it was none to take (a review, 2026-12-06).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(LogError::io(&p, e)),
                }
                dirs.push((ts, p));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(LogError::io(&root, e)),
    }
    dirs.sort();
    let mut incomplete = Vec::new();
    let mut found = None;
    while let Some((ts, d)) = dirs.pop() {
        let mpath = d.join("MANIFEST");
        if found.is_some() {
            // Older checkpoints, complete or not: superseded.
            incomplete.push(d);
            continue;
        }
        match read_manifest(&mpath)? {
            Some(b) => {
                let m = Manifest::decode(&b, &mpath)?;
                named_ts(&m, ts, &mpath)?;
                found = Some((d, m));
            }
            None => incomplete.push(d),
        }
    }
    Ok((found, incomplete))
}

/// Loads a checkpoint into `db` (tables already restored), parts in parallel.
/// Returns (rows, bytes).
pub(crate) fn load(db: &Database, dir: &Path, m: &Manifest, threads: usize) -> Result<(u64, u64), LogError> {
    for_each_part(dir, m, threads, |i, path, b, info| load_part(db, path, b, i as u32, m.ts, info))
}

/// Checks a checkpoint as its load would, row by row, installing nothing: every part's
/// length, checksum, header, trailer and row count, and every row's bounds, key length,
/// timestamp, record id and value length, and its table is one `known` names. A backup
/// checks a received copy so before its own data goes (a copy whose checksums pass but
/// whose rows its load refuses, a primary's bug, left before a backup that failed every
/// start until a person acted). Not checked: two records with the same key (the load's
/// index build refuses them), which needs every key at once. Returns (rows, bytes).
pub fn check(
    dir: &Path,
    m: &Manifest,
    threads: usize,
    known: impl Fn(TableId) -> bool + Sync,
) -> Result<(u64, u64), LogError> {
    for_each_part(dir, m, threads, |i, path, b, info| check_part(path, &b, i as u32, m.ts, info, &known))
}

/// `check` of one part: part `part` of a checkpoint at `ts`, its bytes `b` read from
/// `path` (named in an error), against its manifest's `info`. Returns its rows.
pub fn check_part(
    path: &Path,
    b: &[u8],
    part: u32,
    ts: Ts,
    info: &PartInfo,
    known: impl Fn(TableId) -> bool,
) -> Result<u64, LogError> {
    parse_part(path, b, part, ts, info, |p, table, rid, _key, vts, value| {
        if !known(table) {
            return Err(format!("a row of table {}, which the copy's catalog does not name", table.0));
        }
        ditto_engine::check_recovered_row(&table.0, rid, vts, Some(value.len()))
            .map_err(|e| format!("the engine would refuse the row at {p}: {e}"))
    })
}

/// Runs `part` on each part of the checkpoint in `dir` that `m` names, read whole (at most
/// its manifest's length and a byte), `threads` parts at a time. Returns the rows `part`
/// counted and the parts' bytes.
fn for_each_part(
    dir: &Path,
    m: &Manifest,
    threads: usize,
    part: impl Fn(usize, &Path, Bytes, &PartInfo) -> Result<u64, LogError> + Sync,
) -> Result<(u64, u64), LogError> {
    let next = AtomicUsize::new(0);
    let rows = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads.max(1))
            .map(|_| {
                // A loader's panic (a bug the rows' checks did not catch) fails the open
                // with an error naming the loader, as a damaged part does, where it took the
                // whole process down (found by a review, 2026-12-05).
                s.spawn(|| -> Result<(), LogError> {
                    ditto_engine::catch_panic(|| loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(info) = m.parts.get(i) else { return Ok(()) };
                        let path = part_path(dir, i);
                        // At most the bytes its manifest names (and one more, so that a
                        // longer file is refused by `parse_part`), never the file's own
                        // length whole: a damaged size (a 40 GiB sparse file) was read
                        // into memory until the process was killed (a review, 2026-12-06).
                        let read = std::fs::File::open(&path).and_then(|f| crate::options::read_up_to(f, info.bytes));
                        let b = read.map_err(|e| match e.kind() {
                            // Its manifest names it: a checkpoint that lost a part is
                            // damaged, not a passing I/O failure worth retrying.
                            std::io::ErrorKind::NotFound => LogError::Corrupt {
                                file: path.clone(),
                                offset: 0,
                                what: format!("part {i} of the {} the manifest names is missing", m.parts.len()),
                            },
                            _ => LogError::io(&path, e),
                        })?;
                        let n = part(i, &path, Bytes::from(b), info)?;
                        rows.fetch_add(n, Ordering::Relaxed);
                        bytes.fetch_add(info.bytes, Ordering::Relaxed);
                    })
                    .unwrap_or_else(|msg| Err(LogError::Panicked("the checkpoint loader", msg)))
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().expect("a loader's panics are caught"))
    })?;
    Ok((rows.into_inner(), bytes.into_inner()))
}

fn load_part(db: &Database, path: &Path, b: Bytes, part: u32, ts: Ts, info: &PartInfo) -> Result<u64, LogError> {
    let mut keys = KeyArena::default();
    parse_part(path, &b, part, ts, info, |_, table, rid, key, vts, value| {
        // Checkpoint rows are whole records: they always carry the key.
        // A row whose checksums pass but which the engine refuses (an unknown table, a
        // record id past its limit, a value too large) names the part and the row, as
        // other damage does (before 2026-12-05 the engine's error alone; a review).
        db.recovery_install(table, rid, Some(|| keys.copy(key)), vts, Some(value))
            .map_err(|e| format!("the engine refused the row: {e}"))
    })
}

/// Checks part `part` of a checkpoint at `ts` (its bytes `b`, read from `path`) against its
/// manifest's `info`, and hands each row to `row` (its offset, table, record id, key,
/// version timestamp and value); an error `row` returns names the part and the row.
/// Returns the rows.
fn parse_part(
    path: &Path,
    b: &[u8],
    part: u32,
    ts: Ts,
    info: &PartInfo,
    mut row: impl FnMut(usize, TableId, RecordId, &[u8], Ts, &[u8]) -> Result<(), String>,
) -> Result<u64, LogError> {
    let bad = |offset: usize, what: &str| LogError::Corrupt {
        file: path.to_path_buf(),
        offset: offset as u64,
        what: what.into(),
    };
    if b.len() as u64 != info.bytes {
        // (One read past the manifest's length: the file is longer still, perhaps much.)
        let what = match b.len() as u64 > info.bytes {
            true => format!("part is longer than the {} bytes its manifest says", info.bytes),
            false => format!("part is {} bytes, manifest says {}", b.len(), info.bytes),
        };
        return Err(bad(b.len(), &what));
    }
    if crc32c::crc32c(b) != info.crc {
        return Err(bad(0, "part checksum does not match the manifest"));
    }
    if b.len() < PART_HEADER_LEN + PART_TRAILER_LEN || &b[..8] != PART_MAGIC {
        return Err(bad(0, "not a checkpoint part"));
    }
    let u32_at = |p: usize| u32::from_le_bytes(b[p..p + 4].try_into().unwrap());
    let u64_at = |p: usize| u64::from_le_bytes(b[p..p + 8].try_into().unwrap());
    if u32_at(8) != CHECKPOINT_FORMAT_VERSION || u32_at(12) != part || u64_at(16) != ts.0 {
        return Err(bad(8, "part header does not match the manifest"));
    }
    let end = b.len() - PART_TRAILER_LEN;
    if &b[end..end + 8] != END_MAGIC || u64_at(end + 8) != info.rows {
        return Err(bad(end, "bad part trailer"));
    }
    let mut p = PART_HEADER_LEN;
    let mut n = 0;
    while p < end {
        if p + 24 > end {
            return Err(bad(p, "row header runs past the end"));
        }
        let table = TableId(u32_at(p));
        let rid = RecordId(u64_at(p + 4));
        let vts = Ts(u64_at(p + 12));
        let klen = u32_at(p + 20) as usize;
        if klen > ditto_engine::KEY_LEN_MAX {
            // (Log replay refuses such a key too; loaded, no client could ever name it.)
            return Err(bad(p + 20, &format!("a row key of {klen} bytes, longer than any key ditto takes")));
        }
        let kstart = p + 24;
        if kstart + klen + 4 > end {
            return Err(bad(p, "row key runs past the end"));
        }
        let vlen = u32_at(kstart + klen) as usize;
        let vstart = kstart + klen + 4;
        if vstart + vlen > end {
            return Err(bad(p, "row value runs past the end"));
        }
        if vts > ts {
            return Err(bad(p, "row version is newer than the checkpoint"));
        }
        row(p, table, rid, &b[kstart..kstart + klen], vts, &b[vstart..vstart + vlen]).map_err(|what| bad(p, &what))?;
        p = vstart + vlen;
        n += 1;
    }
    if n != info.rows {
        return Err(bad(end, "row count does not match the manifest"));
    }
    Ok(n)
}
