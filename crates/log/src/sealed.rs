//! A replica log sealed at a failover's point
//! ==========================================
//! A backup that changes its role in place (promoted, or following the next primary,
//! docs/cluster.md) holds exactly the failover's recovery point P in memory, and its
//! directory must say the same: every transaction at or below P, none above. Writing the
//! engine as a checkpoint at P says it, but takes a second or more at hundreds of MB, and
//! the node serves nothing meanwhile. A seal says it in two small steps instead:
//!
//! ```text
//!  1. dir/replica/CUT = "DITTOCUT" | version u32 | point u64 | crc32c u32 of those   (fsynced)
//!  2. rename dir/replica -> dir/sealed                                              (fsynced)
//! ```
//!
//! The directory then holds: the newest checkpoint (at or below P), the sealed replica log
//! cut at P, and what the node writes next (a primary's log, or a new replica log, both
//! above P). Every open replays the sealed log up to P before anything else
//! (`replay_sealed`), and every reader of what a directory holds counts it as held up to P
//! (`base`). The node's next checkpoint takes the sealed log away (`remove_sealed`): at
//! once when it serves if the chain below is long (`CHECKPOINT_AT_LINKS`), else when its
//! checkpoint policy says, the chain's bytes counted as log since the last checkpoint.
//!
//! A node that must change role in place again before that checkpoint (failovers seconds
//! apart) seals again: its new replica log, which
//! holds everything above the first point, becomes `dir/sealed.2` cut at the second point,
//! and so on, a chain of at most `MAX_SEALED` links, each lying on the point of the one
//! before (the first on the checkpoint). Recovery replays them in order (`replay_chain`),
//! and the next checkpoint takes them all. Before the chain, a second change wrote the
//! whole engine as a checkpoint before the node served (0.3-0.6 s at 450 MB), and a backup
//! that lacked the end of the epoch was then sent a whole checkpoint (4.5 s), having no
//! sealed log to be sent the rest from. With a full chain the node still does that
//! (`replica::seal_at_point`, which takes the chain with the rest). Links are taken away
//! newest first, so a crash midway leaves the oldest, numbered without a gap; a gap is
//! refused.
//!
//! A crash between steps 1 and 2 leaves `replica/CUT`: every reader takes that directory as
//! the chain's newest link, and the next open finishes the rename (`finish_seal`).

use std::path::{Path, PathBuf};

use ditto_engine::{Database, Ts};

use crate::checkpoint::{self, Manifest};
use crate::recovery::{recovery_threads, replay_kept, Kept};
use crate::replica::{replica_dir, scan_sealed_dir};
use crate::storage::Storage;
use crate::{Epoch, LogError, RecoveryReport};

pub const CUT_MAGIC: [u8; 8] = *b"DITTOCUT";
pub const CUT_FORMAT_VERSION: u32 = 1;
pub const CUT_LEN: usize = 24;
/// The file that names the point a sealed replica log is cut at.
pub const CUT_FILE: &str = "CUT";
/// Where a sealed replica log lies.
pub const SEALED_DIR: &str = "sealed";
/// The most sealed logs a directory holds at once (one per change of role in place before
/// a checkpoint takes them away); a node that must seal again writes a checkpoint at the
/// point instead. Each is only what its node received between two failovers, so the
/// bound keeps recovery's work, not their size, in check.
pub const MAX_SEALED: usize = 8;
/// A node whose chain holds this many links writes a checkpoint at once when it next serves
/// (in the background, paced), which takes the chain away. With fewer, its checkpoint
/// policy decides, the chain's bytes counted as log written since the last checkpoint
/// (`chain_bytes`): a checkpoint due at once after every change of role in place wrote
/// each node's whole engine within seconds of a failover, on the disk the next failover's
/// fsyncs wait on, and a chain replays no more log than the policy allows anyway.
pub const CHECKPOINT_AT_LINKS: usize = MAX_SEALED / 2;
/// A sealed log that its checkpoint took away, kept (until the next checkpoint) only to send
/// a backup that rejoins below the point what it lacks (`retire_sealed`). Recovery never
/// reads it.
pub const SERVED_DIR: &str = "sealed-served";
/// In `SERVED_DIR`: the timestamp its replica log holds every stream from (the checkpoint
/// it lay on), as a cut (`encode_cut`).
pub const FLOOR_FILE: &str = "FLOOR";

/// A replica log sealed at `point`, in `dir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    pub dir: PathBuf,
    pub point: Ts,
    /// It holds an old primary's own log (`seal_own_log`), not a replica log.
    pub primary_log: bool,
}

/// Whether the link `dir` holds a primary's log segments (`seal_own_log`) rather than a
/// replica log's files.
fn holds_primary_segments(dir: &Path) -> Result<bool, LogError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(LogError::io(dir, e)),
    };
    for e in rd {
        let name = e.map_err(|e| LogError::io(dir, e))?.file_name();
        if name.to_str().is_some_and(|n| n.starts_with("stream-")) {
            return Ok(true);
        }
    }
    Ok(false)
}

pub fn encode_cut(point: Ts) -> [u8; CUT_LEN] {
    let mut b = [0u8; CUT_LEN];
    b[..8].copy_from_slice(&CUT_MAGIC);
    b[8..12].copy_from_slice(&CUT_FORMAT_VERSION.to_le_bytes());
    b[12..20].copy_from_slice(&point.0.to_le_bytes());
    let crc = crc32c::crc32c(&b[..20]);
    b[20..24].copy_from_slice(&crc.to_le_bytes());
    b
}

pub fn decode_cut(b: &[u8]) -> Result<Ts, String> {
    if b.len() != CUT_LEN || b[..8] != CUT_MAGIC {
        return Err(format!("not a seal's cut ({} bytes, or a bad magic)", b.len()));
    }
    if u32::from_le_bytes(b[20..24].try_into().expect("4 bytes")) != crc32c::crc32c(&b[..20]) {
        return Err("the seal's cut fails its checksum".into());
    }
    let version = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if version != CUT_FORMAT_VERSION {
        return Err(format!("seal format version {version} is not supported (this build reads 1)"));
    }
    Ok(Ts(u64::from_le_bytes(b[12..20].try_into().expect("8 bytes"))))
}

/// The name of the `n`th link of a directory's chain of sealed logs (1: the oldest).
fn link_name(n: usize) -> String {
    if n == 1 {
        SEALED_DIR.to_string()
    } else {
        format!("{SEALED_DIR}.{n}")
    }
}

/// The directories of `data`'s chain of sealed logs that exist (`sealed`, `sealed.2`, ...),
/// oldest first, and the number of the next link. A gap in the numbers is refused: links
/// are taken away newest first (`trash_links`), so a crash leaves the oldest ones.
fn link_dirs(data: &Path) -> Result<(Vec<PathBuf>, usize), LogError> {
    let mut numbers = Vec::new();
    let entries = match std::fs::read_dir(data) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 1)),
        Err(e) => return Err(LogError::io(data, e)),
    };
    for e in entries {
        let name = e.map_err(|e| LogError::io(data, e))?.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == SEALED_DIR {
            numbers.push(1);
        } else if let Some(n) = name.strip_prefix(SEALED_DIR).and_then(|r| r.strip_prefix('.')) {
            match n.parse::<usize>() {
                Ok(n) if n >= 2 => numbers.push(n),
                _ => {
                    return Err(LogError::Corrupt {
                        file: data.join(name),
                        offset: 0,
                        what: "not a sealed log's name (sealed, sealed.2, sealed.3, ...)".into(),
                    })
                }
            }
        }
    }
    numbers.sort_unstable();
    for (i, n) in numbers.iter().enumerate() {
        if *n != i + 1 {
            return Err(LogError::Corrupt {
                file: data.join(link_name(*n)),
                offset: 0,
                what: format!("a sealed log without the one before it ({} is missing)", link_name(i + 1)),
            });
        }
    }
    Ok((numbers.iter().map(|n| data.join(link_name(*n))).collect(), numbers.len() + 1))
}

fn read_cut(dir: &Path) -> Result<Option<Ts>, LogError> {
    let f = dir.join(CUT_FILE);
    // (A byte more than a cut, which `decode_cut` refuses: a damaged size is not read whole.)
    match crate::options::read_small(&f, CUT_LEN as u64) {
        Ok(Some(b)) => decode_cut(&b).map(Some).map_err(|what| LogError::Corrupt { file: f, offset: 0, what }),
        Ok(None) => Ok(None),
        Err(e) => Err(LogError::io(&f, e)),
    }
}

/// The chain of sealed replica logs of `data`, oldest first (see the module notes): one
/// per change of role in place since its last checkpoint, each cut at its point, the
/// points never decreasing; a replica directory sealed but not yet renamed (a crash
/// between the seal's steps) is the newest. Empty if it holds none.
pub fn sealed(data: &Path) -> Result<Vec<Sealed>, LogError> {
    let mut chain = Vec::new();
    // A reader beside the directory's backup (a report's read ahead) may list a link that
    // a checkpoint then moves away (`retire_sealed`): listed again, a few times.
    let mut tries = 0;
    'listing: loop {
        chain.clear();
        for dir in link_dirs(data)?.0 {
            let read = read_cut(&dir).and_then(|cut| match cut {
                Some(point) => holds_primary_segments(&dir).map(|p| Some((point, p))),
                None => Ok(None),
            });
            match read {
                Ok(Some((point, primary_log))) => chain.push(Sealed { dir, point, primary_log }),
                // Moved away since it was listed.
                _ if !dir.exists() && tries < 3 => {
                    tries += 1;
                    continue 'listing;
                }
                Err(e) => return Err(e),
                Ok(None) => {
                    return Err(LogError::Corrupt {
                        file: dir,
                        offset: 0,
                        what: "a sealed replica log without its cut".into(),
                    })
                }
            }
        }
        break;
    }
    // A crash between a seal's steps: the replica log, or an old primary's own log.
    let (rdir, ldir) = (replica_dir(data), data.join("log"));
    match (read_cut(&rdir)?, read_cut(&ldir)?) {
        (Some(_), Some(_)) => {
            return Err(LogError::Corrupt {
                file: ldir,
                offset: 0,
                what: "both the replica log and the primary's log are sealed (one is, at most)".into(),
            })
        }
        (Some(point), None) => chain.push(Sealed { dir: rdir, point, primary_log: false }),
        (None, Some(point)) => chain.push(Sealed { dir: ldir, point, primary_log: true }),
        (None, None) => {}
    }
    for w in chain.windows(2) {
        if w[1].point < w[0].point {
            return Err(LogError::Corrupt {
                file: w[1].dir.clone(),
                offset: 0,
                what: format!(
                    "sealed at ts {}, below the point ts {} of the log sealed before it",
                    w[1].point.0, w[0].point.0
                ),
            });
        }
    }
    Ok(chain)
}

/// Whether `data`'s replica directory is a sealed log (a crash between the seal's two
/// steps): then it holds no live replica log.
pub(crate) fn replica_is_sealed(data: &Path) -> bool {
    replica_dir(data).join(CUT_FILE).exists()
}

/// Seals `data`'s replica log at `point` (the module notes), as the newest link of its
/// chain. The caller's engine holds exactly `point`, and the replica log every stream up
/// to it, durably (`ditto_replication::Backup::cut_at` checked both). Refused, changing
/// nothing, if the chain already holds `MAX_SEALED` logs (the caller writes a checkpoint at
/// the point instead: `can_seal`) or one sealed above `point`.
pub fn seal_tail(data: &Path, point: Ts, storage: &dyn Storage) -> Result<(), LogError> {
    finish_seal(data, storage)?;
    let rdir = replica_dir(data);
    std::fs::create_dir_all(&rdir).map_err(|e| LogError::io(&rdir, e))?;
    seal_dir(data, &rdir, point, storage)
}

/// Seals the log directory `ldir` of `data` (its replica log, or its own primary log) at
/// `point`: its cut written in, then the directory renamed to the chain's next link.
fn seal_dir(data: &Path, ldir: &Path, point: Ts, storage: &dyn Storage) -> Result<(), LogError> {
    finish_seal(data, storage)?;
    let chain = sealed(data)?;
    if chain.len() >= MAX_SEALED {
        return Err(LogError::Corrupt {
            file: data.join(SEALED_DIR),
            offset: 0,
            what: format!("already holds {} sealed logs, not yet checkpointed (at most {MAX_SEALED})", chain.len()),
        });
    }
    if let Some(last) = chain.last().filter(|s| s.point > point) {
        return Err(LogError::Corrupt {
            file: last.dir.clone(),
            offset: 0,
            what: format!("asked to seal at ts {}, below the point ts {} of the last seal", point.0, last.point.0),
        });
    }
    // Written beside the log, then moved in: a crash leaves no partial CUT there.
    let tmp = data.join("CUT.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = storage.create_new(&tmp).map_err(|e| LogError::io(&tmp, e))?;
    f.write_all(&encode_cut(point)).and_then(|_| f.sync()).map_err(|e| LogError::io(&tmp, e))?;
    drop(f);
    let cut = ldir.join(CUT_FILE);
    storage.rename(&tmp, &cut).map_err(|e| LogError::io(&cut, e))?;
    storage.sync_dir(ldir).map_err(|e| LogError::io(ldir, e))?;
    finish_seal(data, storage)
}

/// Whether `data` can take another seal (`seal_tail`); if not, its node writes a
/// checkpoint at the point instead (`replica::seal_at_point`).
pub fn can_seal(data: &Path) -> Result<bool, LogError> {
    Ok(sealed(data)?.len() < MAX_SEALED)
}

/// The seal's second step, if a crash left only the first done (a no-op otherwise): the
/// replica directory (or the primary's log directory, `seal_own_log`) becomes the chain's
/// next link.
pub(crate) fn finish_seal(data: &Path, storage: &dyn Storage) -> Result<(), LogError> {
    let ldir = data.join("log");
    let from = if replica_is_sealed(data) {
        replica_dir(data)
    } else if ldir.join(CUT_FILE).exists() {
        ldir
    } else {
        return Ok(());
    };
    // A damaged cut, or a damaged chain, stops here, naming the file, with nothing moved.
    sealed(data)?;
    let next = data.join(link_name(link_dirs(data)?.1));
    storage.rename(&from, &next).map_err(|e| LogError::io(&from, e))?;
    storage.sync_dir(data).map_err(|e| LogError::io(data, e))
}

/// Seals an old primary's own log (`data/log/`, which it has replayed up to `point`, and
/// which holds every stream up to it) as the chain's newest link, as `seal_tail` does a
/// replica log: its rejoin as a backup then writes no checkpoint before it serves
/// (`replica::open_replica_upto`; the backup's first checkpoint takes the chain away).
/// Refused, changing nothing, with a full chain or a last seal above `point`.
pub fn seal_own_log(data: &Path, point: Ts, storage: &dyn Storage) -> Result<(), LogError> {
    seal_dir(data, &data.join("log"), point, storage)
}

/// What a directory holds before anything its node wrote since it last changed role: its
/// newest checkpoint, the sealed logs above it, and the timestamp up to which these hold
/// every stream (the newer of the checkpoint and the last seal's point).
pub(crate) struct Base {
    pub ckpt: Option<(PathBuf, Manifest)>,
    /// The chain's links above the checkpoint, oldest first.
    pub chain: Vec<Sealed>,
    pub ts: Ts,
}

impl Base {
    pub fn ckpt_ts(&self) -> Ts {
        self.ckpt.as_ref().map_or(Ts::ZERO, |(_, m)| m.ts)
    }

    /// What the `i`th link lies on: the checkpoint, or the point of the link before it.
    pub fn floor_of(&self, i: usize) -> Ts {
        let ckpt_ts = self.ckpt_ts();
        if i == 0 {
            ckpt_ts
        } else {
            self.chain[i - 1].point.max(ckpt_ts)
        }
    }
}

pub(crate) fn base(data: &Path) -> Result<Base, LogError> {
    let ckpt = checkpoint::find_newest(data)?.0;
    let ckpt_ts = ckpt.as_ref().map_or(Ts::ZERO, |(_, m)| m.ts);
    let mut chain = sealed(data)?;
    // A checkpoint newer than a seal is written only from an engine that holds its point,
    // and the sealed logs go once one is durable: these ones' delete failed, or a crash
    // cut it short. They are covered; nothing reads them.
    for s in chain.iter().filter(|s| s.point < ckpt_ts) {
        tracing::warn!("{}: a sealed replica log that the checkpoint at ts {} covers", s.dir.display(), ckpt_ts.0);
    }
    chain.retain(|s| s.point >= ckpt_ts);
    let ts = chain.last().map_or(ckpt_ts, |s| s.point.max(ckpt_ts));
    Ok(Base { ckpt, chain, ts })
}

/// Replays `base`'s chain of sealed logs into `db`, which holds its checkpoint (nothing
/// else yet), oldest first: each link's transactions above what it lies on and at or below
/// its point. Each must hold every stream up to its point, or the open is refused. Returns
/// the last point (the checkpoint's timestamp if there is no chain).
pub(crate) fn replay_chain(db: &Database, base: &Base, report: &mut RecoveryReport) -> Result<Ts, LogError> {
    for (i, s) in base.chain.iter().enumerate() {
        replay_sealed(db, s, base.floor_of(i), report)?;
    }
    Ok(base.ts)
}

/// Replays `s` into `db`, which holds the checkpoint at `ckpt_ts` (nothing else yet): every
/// transaction above the checkpoint and at or below the point. The log must hold every
/// stream up to the point, or the open is refused. Returns the point.
pub(crate) fn replay_sealed(
    db: &Database,
    s: &Sealed,
    ckpt_ts: Ts,
    report: &mut RecoveryReport,
) -> Result<Ts, LogError> {
    if s.primary_log {
        return replay_own_log(db, s, ckpt_ts, report);
    }
    let scan = scan_sealed_dir(&s.dir, ckpt_ts, s.point)?;
    let (files, log_bytes) = (scan.files, scan.log_bytes);
    let kept: Vec<Kept> = scan
        .kept
        .into_iter()
        .map(|(batch, i, offset)| Kept { batch, file: files[i].1.as_path(), offset, upto: Ts(u64::MAX) })
        .collect();
    // A replica log: a record id may have two lives in it (`Database::recovery_log_begins`).
    db.recovery_log_begins();
    let (replayed, dropped) = replay_kept(db, kept.iter().collect(), ckpt_ts, s.point, recovery_threads())?;
    report.log_bytes += log_bytes;
    report.log_txns_replayed += replayed;
    report.log_txns_dropped_above_cut += dropped;
    report.segments += files.len();
    Ok(s.point)
}

/// `replay_sealed` of an old primary's own log sealed as a link (`seal_own_log`): its
/// newest epoch's segments (older ones are leftovers a checkpoint already covered), which
/// must hold every stream up to the point.
fn replay_own_log(db: &Database, s: &Sealed, floor: Ts, report: &mut RecoveryReport) -> Result<Ts, LogError> {
    let segments = crate::recovery::list_segments_in(&s.dir)?.segments;
    let epoch = crate::recovery::newest_epoch(&segments);
    let (bytes, replayed, dropped, files) =
        (report.log_bytes, report.log_txns_replayed, report.log_txns_dropped_above_cut, report.segments);
    // It was replayed, and any torn tail cut, before it was sealed: a torn tail now is
    // damage, and drops nothing it must hold, or the cut below refuses it.
    let cut = crate::recovery::replay_log(db, &segments, epoch, floor, Some(s.point), report, false, true)?;
    if cut < s.point {
        return Err(LogError::Corrupt {
            file: s.dir.clone(),
            offset: 0,
            what: format!("sealed at ts {}, but it holds every stream only up to ts {}", s.point.0, cut.0),
        });
    }
    report.log_bytes += bytes;
    report.log_txns_replayed += replayed;
    report.log_txns_dropped_above_cut += dropped;
    report.segments += files;
    report.max_epoch = report.max_epoch.max(epoch.0);
    Ok(s.point)
}

/// Once a primary's checkpoint at or above its sealed logs' points is durable: the newest
/// sealed log, which lay on `floor` (a checkpoint, or the point of the log before it), is
/// kept as `SERVED_DIR` (any older one goes to the trash, and so do the other links), so
/// that a backup which rejoins with a log cut below its point can still be sent the rest
/// from it (`replica::sealed_batches_above`) instead of a whole checkpoint; `floor` is
/// `None` when there was no sealed log, and then a kept one goes to the trash (the
/// primary's next checkpoint after the seal's). Recovery reads neither: a crash at any
/// step leaves a directory it opens the same.
pub(crate) fn retire_sealed(data: &Path, floor: Option<Ts>, storage: &dyn Storage) -> Result<(), LogError> {
    finish_seal(data, storage)?;
    let served = data.join(SERVED_DIR);
    let mut links = link_dirs(data)?.0;
    if served.exists() {
        crate::replica::to_trash(data, std::slice::from_ref(&served))?;
    }
    let Some(floor) = floor else {
        // No chain above the checkpoint: any link left (covered, a crash cut its removal
        // short) goes too.
        return trash_links(data, links);
    };
    let Some(newest) = links.pop() else { return Ok(()) };
    let f = newest.join(FLOOR_FILE);
    let _ = std::fs::remove_file(&f);
    let mut file = storage.create_new(&f).map_err(|e| LogError::io(&f, e))?;
    file.write_all(&encode_cut(floor)).and_then(|_| file.sync()).map_err(|e| LogError::io(&f, e))?;
    drop(file);
    storage.rename(&newest, &served).map_err(|e| LogError::io(&newest, e))?;
    storage.sync_dir(data).map_err(|e| LogError::io(data, e))?;
    trash_links(data, links)
}

/// The kept sealed log (`retire_sealed`): its directory, point and floor. `None` if there
/// is none, or if it is damaged (it is only ever a shortcut: the caller then sends a
/// checkpoint).
pub fn served(data: &Path) -> Option<(PathBuf, Ts, Ts)> {
    let dir = data.join(SERVED_DIR);
    let read = |name: &str| -> Option<Ts> {
        match crate::options::read_small(&dir.join(name), CUT_LEN as u64) {
            Ok(Some(b)) => {
                decode_cut(&b).map_err(|e| tracing::warn!("{}: {e}; not used", dir.join(name).display())).ok()
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("{}: {e}; not used", dir.join(name).display());
                None
            }
        }
    };
    // Batches are read from a replica log only; an old primary's own log is not served.
    if holds_primary_segments(&dir).unwrap_or(true) {
        return None;
    }
    Some((dir.clone(), read(CUT_FILE)?, read(FLOOR_FILE)?))
}

/// Moves `data`'s sealed logs to the trash once a checkpoint at `covered`, at or above
/// their points, is durable (a no-op if there is none, or if the newest lies above it:
/// then the checkpoint does not cover the chain, which stays whole).
pub(crate) fn remove_sealed(data: &Path, covered: Ts, storage: &dyn Storage) -> Result<(), LogError> {
    finish_seal(data, storage)?;
    let chain = sealed(data)?;
    match chain.last() {
        None => Ok(()),
        Some(last) if last.point > covered => {
            tracing::warn!(
                "{}: sealed at ts {}, above the checkpoint at ts {}: kept",
                last.dir.display(),
                last.point.0,
                covered.0
            );
            Ok(())
        }
        Some(_) => trash_links(data, chain.into_iter().map(|s| s.dir).collect()),
    }
}

/// The bytes `data`'s chain of sealed logs holds: log a recovery would replay beyond its
/// checkpoint, which a checkpoint policy counts as written since it (`CHECKPOINT_AT_LINKS`).
pub fn chain_bytes(data: &Path) -> u64 {
    let Ok(chain) = sealed(data) else { return 0 };
    chain
        .iter()
        .filter_map(|s| std::fs::read_dir(&s.dir).ok())
        .flat_map(|rd| rd.flatten())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// The size of `data`'s newest checkpoint (0 if none): what a checkpoint policy's log
/// growth is measured against when the engine was not loaded from it (kept through a
/// change of role in place).
pub fn base_checkpoint_bytes(data: &Path) -> u64 {
    let Ok((Some((dir, _)), _)) = checkpoint::find_newest(data) else { return 0 };
    std::fs::read_dir(dir).map_or(0, |rd| rd.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
}

/// The epoch of the primary's log that `data`'s newest sealed link holds, if that link is
/// an old primary's own log (`seal_own_log`): the epoch a backup that starts from it
/// followed. `Epoch(0)` otherwise.
pub fn own_log_epoch(data: &Path) -> Result<Epoch, LogError> {
    match sealed(data)?.pop() {
        Some(s) if s.primary_log => {
            Ok(crate::recovery::newest_epoch(&crate::recovery::list_segments_in(&s.dir)?.segments))
        }
        _ => Ok(Epoch(0)),
    }
}

/// Every sealed log's directory in `data`, oldest first (for a node that replaces all it
/// holds with a primary's checkpoint).
pub fn link_paths(data: &Path) -> Result<Vec<PathBuf>, LogError> {
    Ok(link_dirs(data)?.0)
}

/// Moves the chain's `links` (oldest first) to the trash, newest first, so that a crash
/// midway leaves the oldest ones, numbered without a gap.
fn trash_links(data: &Path, mut links: Vec<PathBuf>) -> Result<(), LogError> {
    if links.is_empty() {
        return Ok(());
    }
    links.reverse();
    crate::replica::to_trash(data, &links)
}
