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
//! (`base`). As soon as the node serves, it writes a checkpoint in the background; once
//! that is durable, the sealed log goes (`remove_sealed`). There is at most one sealed log:
//! a node that must seal again before that checkpoint writes the checkpoint at the point
//! instead (`replica::seal_at_point`, which takes the sealed log with the rest).
//!
//! A crash between steps 1 and 2 leaves `replica/CUT`: every reader takes that directory as
//! the sealed log, and the next open finishes the rename (`finish_seal`).

use std::path::{Path, PathBuf};

use ditto_engine::{Database, Ts};

use crate::checkpoint::{self, Manifest};
use crate::recovery::{recovery_threads, replay_kept, Kept};
use crate::replica::{replica_dir, scan_sealed_dir};
use crate::storage::Storage;
use crate::{LogError, RecoveryReport};

pub const CUT_MAGIC: [u8; 8] = *b"DITTOCUT";
pub const CUT_FORMAT_VERSION: u32 = 1;
pub const CUT_LEN: usize = 24;
/// The file that names the point a sealed replica log is cut at.
pub const CUT_FILE: &str = "CUT";
/// Where a sealed replica log lies.
pub const SEALED_DIR: &str = "sealed";
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

/// The sealed replica log of `data`, if it holds one (see the module notes).
pub fn sealed(data: &Path) -> Result<Option<Sealed>, LogError> {
    let sdir = data.join(SEALED_DIR);
    for dir in [sdir.clone(), replica_dir(data)] {
        let f = dir.join(CUT_FILE);
        match std::fs::read(&f) {
            Ok(b) => {
                let point = decode_cut(&b).map_err(|what| LogError::Corrupt { file: f, offset: 0, what })?;
                return Ok(Some(Sealed { dir, point }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io(&f, e)),
        }
    }
    if sdir.exists() {
        return Err(LogError::Corrupt { file: sdir, offset: 0, what: "a sealed replica log without its cut".into() });
    }
    Ok(None)
}

/// Whether `data`'s replica directory is a sealed log (a crash between the seal's two
/// steps): then it holds no live replica log.
pub(crate) fn replica_is_sealed(data: &Path) -> bool {
    replica_dir(data).join(CUT_FILE).exists()
}

/// Seals `data`'s replica log at `point` (the module notes). The caller's engine holds
/// exactly `point`, and the replica log every stream up to it, durably
/// (`ditto_replication::Backup::cut_at` checked both). Refused, changing nothing, if the
/// directory already holds a sealed log: the caller writes a checkpoint at the point
/// instead.
pub fn seal_tail(data: &Path, point: Ts, storage: &dyn Storage) -> Result<(), LogError> {
    if let Some(s) = sealed(data)? {
        return Err(LogError::Corrupt {
            file: s.dir,
            offset: 0,
            what: format!("already holds a replica log sealed at ts {}, not yet checkpointed", s.point.0),
        });
    }
    let rdir = replica_dir(data);
    std::fs::create_dir_all(&rdir).map_err(|e| LogError::io(&rdir, e))?;
    // Written beside the replica log, then moved in: a crash leaves no partial CUT there.
    let tmp = data.join("CUT.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = storage.create_new(&tmp).map_err(|e| LogError::io(&tmp, e))?;
    f.write_all(&encode_cut(point)).and_then(|_| f.sync()).map_err(|e| LogError::io(&tmp, e))?;
    drop(f);
    let cut = rdir.join(CUT_FILE);
    storage.rename(&tmp, &cut).map_err(|e| LogError::io(&cut, e))?;
    storage.sync_dir(&rdir).map_err(|e| LogError::io(&rdir, e))?;
    finish_seal(data, storage)
}

/// The seal's second step, if a crash left only the first done (a no-op otherwise).
pub(crate) fn finish_seal(data: &Path, storage: &dyn Storage) -> Result<(), LogError> {
    let sdir = data.join(SEALED_DIR);
    if !replica_is_sealed(data) || sdir.exists() {
        return Ok(());
    }
    // A damaged cut stops here, naming the file, with nothing moved.
    sealed(data)?;
    let rdir = replica_dir(data);
    storage.rename(&rdir, &sdir).map_err(|e| LogError::io(&rdir, e))?;
    storage.sync_dir(data).map_err(|e| LogError::io(data, e))
}

/// What a directory holds before anything its node wrote since it last changed role: its
/// newest checkpoint, its sealed log, and the timestamp up to which these hold every
/// stream (the newer of the checkpoint and the seal's point).
pub(crate) struct Base {
    pub ckpt: Option<(PathBuf, Manifest)>,
    pub sealed: Option<Sealed>,
    pub ts: Ts,
}

pub(crate) fn base(data: &Path) -> Result<Base, LogError> {
    let ckpt = checkpoint::find_newest(data)?.0;
    let sealed = sealed(data)?;
    let ckpt_ts = ckpt.as_ref().map_or(Ts::ZERO, |(_, m)| m.ts);
    if let Some(s) = &sealed {
        if ckpt_ts > s.point {
            // A checkpoint newer than the seal is written only from an engine that holds the
            // point, and the sealed log goes once one is durable: this one's delete failed.
            // It is covered; nothing reads it.
            tracing::warn!("{}: a sealed replica log that the checkpoint at ts {} covers", s.dir.display(), ckpt_ts.0);
            return Ok(Base { ckpt, sealed: None, ts: ckpt_ts });
        }
    }
    let ts = sealed.as_ref().map_or(ckpt_ts, |s| s.point.max(ckpt_ts));
    Ok(Base { ckpt, sealed, ts })
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
    let scan = scan_sealed_dir(&s.dir, ckpt_ts, s.point)?;
    let (files, log_bytes) = (scan.files, scan.log_bytes);
    let kept: Vec<Kept> =
        scan.kept.into_iter().map(|(batch, i, offset)| Kept { batch, file: files[i].1.as_path(), offset }).collect();
    let (replayed, dropped) = replay_kept(db, kept.iter().collect(), ckpt_ts, s.point, recovery_threads())?;
    report.log_bytes += log_bytes;
    report.log_txns_replayed += replayed;
    report.log_txns_dropped_above_cut += dropped;
    report.segments += files.len();
    Ok(s.point)
}

/// Once a primary's checkpoint at or above its sealed log's point is durable: the sealed
/// log, which lay on a checkpoint at `floor`, is kept as `SERVED_DIR` (any older one goes
/// to the trash), so that an old primary which rejoins with its own log cut below the
/// point can still be sent the rest from it (`replica::sealed_batches_above`) instead of a
/// whole checkpoint; `floor` is `None` when there was no sealed log, and then a kept one
/// goes to the trash (the primary's next checkpoint after the seal's). Recovery reads
/// neither: a crash at any step leaves a directory it opens the same.
pub(crate) fn retire_sealed(data: &Path, floor: Option<Ts>, storage: &dyn Storage) -> Result<(), LogError> {
    finish_seal(data, storage)?;
    let (sdir, served) = (data.join(SEALED_DIR), data.join(SERVED_DIR));
    let floor = floor.filter(|_| sdir.exists());
    if served.exists() {
        crate::replica::to_trash(data, std::slice::from_ref(&served))?;
    }
    let Some(floor) = floor else { return Ok(()) };
    let f = sdir.join(FLOOR_FILE);
    let _ = std::fs::remove_file(&f);
    let mut file = storage.create_new(&f).map_err(|e| LogError::io(&f, e))?;
    file.write_all(&encode_cut(floor)).and_then(|_| file.sync()).map_err(|e| LogError::io(&f, e))?;
    drop(file);
    storage.rename(&sdir, &served).map_err(|e| LogError::io(&sdir, e))?;
    storage.sync_dir(data).map_err(|e| LogError::io(data, e))
}

/// The kept sealed log (`retire_sealed`): its directory, point and floor. `None` if there
/// is none, or if it is damaged (it is only ever a shortcut: the caller then sends a
/// checkpoint).
pub fn served(data: &Path) -> Option<(PathBuf, Ts, Ts)> {
    let dir = data.join(SERVED_DIR);
    let read = |name: &str| -> Option<Ts> {
        match std::fs::read(dir.join(name)) {
            Ok(b) => decode_cut(&b).map_err(|e| tracing::warn!("{}: {e}; not used", dir.join(name).display())).ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!("{}: {e}; not used", dir.join(name).display());
                None
            }
        }
    };
    Some((dir.clone(), read(CUT_FILE)?, read(FLOOR_FILE)?))
}

/// Moves `data`'s sealed log to the trash once a checkpoint at or above its point is
/// durable (a no-op if there is none).
pub(crate) fn remove_sealed(data: &Path, storage: &dyn Storage) -> Result<(), LogError> {
    finish_seal(data, storage)?;
    let sdir = data.join(SEALED_DIR);
    if sdir.exists() {
        crate::replica::to_trash(data, &[sdir])?;
    }
    Ok(())
}
