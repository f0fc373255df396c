//! Recovery
//! ========
//! ```text
//!  1. CATALOG                 -> tables
//!  2. newest complete checkpoint (MANIFEST present) at ts C -> loaded in parallel
//!  3. every segment of every stream (epoch >= the manifest's log_epoch_min), read and
//!     checked in parallel, one thread per stream:
//!       - a torn tail in a stream's LAST segment is truncated away (it was never durable,
//!         so it held nothing acknowledged);
//!       - any other damage stops recovery with the file and offset.
//!  4. cut = min over streams of max(C, highest bound_ts the stream made durable)
//!     (the durable watermark the primary had, recomputed from the disk: Rolis 3.3)
//!  5. replay, one thread per stream, every transaction with C < ts <= cut; a version is
//!     installed only if newer than what the record holds, so streams need no ordering
//!     among themselves. Transactions above the cut were never acknowledged and are dropped
//!     (their streams may hold them, others may not: keeping them would break the prefix).
//!  6. indexes rebuilt from the live records; clock moved past everything recovered.
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::Bytes;
use ditto_engine::{Database, Ts};

use crate::format::{read_segment, Batch, Epoch, SegmentEnd};
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
    pub cut_ts: Ts,
    pub log_seconds: f64,
    pub total_seconds: f64,
    /// Highest epoch seen in the log (new writes use a higher one).
    pub max_epoch: u64,
}

impl RecoveryReport {
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

pub(crate) fn list_segments(data: &Path) -> Result<Vec<SegmentFile>, LogError> {
    let dir = data.join("log");
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LogError::io(&dir, e)),
    };
    let mut out = Vec::new();
    for e in rd {
        let path = e.map_err(|e| LogError::io(&dir, e))?.path();
        match parse_name(&path) {
            Some((stream, epoch, seq)) => out.push(SegmentFile { path, stream, epoch, seq }),
            None => {
                return Err(LogError::Corrupt {
                    file: path,
                    offset: 0,
                    what: "unexpected file in the log directory".into(),
                })
            }
        }
    }
    out.sort_by_key(|s| (s.stream, s.epoch, s.seq));
    Ok(out)
}

struct StreamLog {
    batches: Vec<Batch>,
    bound: Ts,
    bytes: u64,
    torn: Option<(PathBuf, u64)>,
}

fn read_stream(files: &[&SegmentFile]) -> Result<StreamLog, LogError> {
    let mut out = StreamLog { batches: Vec::new(), bound: Ts::ZERO, bytes: 0, torn: None };
    let mut last_ts = Ts::ZERO;
    for (i, f) in files.iter().enumerate() {
        let is_last = i + 1 == files.len();
        let raw = std::fs::read(&f.path).map_err(|e| LogError::io(&f.path, e))?;
        let raw = Bytes::from(raw);
        let scan = read_segment(&raw).map_err(|e| LogError::Corrupt {
            file: f.path.clone(),
            offset: 0,
            what: format!("segment header: {e}"),
        })?;
        if scan.header.stream.0 != f.stream || scan.header.epoch != f.epoch || scan.header.seq != f.seq {
            return Err(LogError::Corrupt {
                file: f.path.clone(),
                offset: 0,
                what: "segment header does not match its file name".into(),
            });
        }
        match scan.end {
            SegmentEnd::Clean => {}
            SegmentEnd::Torn { offset, reason } if is_last => {
                tracing::warn!("{}: torn tail at offset {offset} ({reason}); truncating", f.path.display());
                truncate(&f.path, offset)?;
                out.torn = Some((f.path.clone(), offset));
            }
            SegmentEnd::Torn { offset, reason } | SegmentEnd::Corrupt { offset, reason } => {
                return Err(LogError::Corrupt { file: f.path.clone(), offset, what: reason.to_string() });
            }
        }
        out.bytes += raw.len() as u64;
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
            out.batches.push(b);
        }
    }
    Ok(out)
}

fn truncate(path: &Path, len: u64) -> Result<(), LogError> {
    let f = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| LogError::io(path, e))?;
    f.set_len(len).map_err(|e| LogError::io(path, e))?;
    f.sync_all().map_err(|e| LogError::io(path, e))
}

/// Steps 3-5 above: reads the log of epochs >= `epoch_min` and replays it after `ckpt_ts`.
pub(crate) fn replay_log(
    db: &Database,
    segments: &[SegmentFile],
    epoch_min: Epoch,
    ckpt_ts: Ts,
    report: &mut RecoveryReport,
    progress: bool,
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
    // Read and check every stream in parallel.
    let logs: Vec<StreamLog> = std::thread::scope(|sc| {
        let hs: Vec<_> = by_stream.values().map(|files| sc.spawn(move || read_stream(files))).collect();
        hs.into_iter().map(|h| h.join().expect("log reader panicked")).collect::<Result<Vec<_>, _>>()
    })?;
    let cut = logs.iter().map(|l| l.bound.max(ckpt_ts)).min().unwrap_or(ckpt_ts);
    report.cut_ts = cut;
    report.log_bytes = logs.iter().map(|l| l.bytes).sum();
    report.torn_tails_truncated = logs.iter().filter_map(|l| l.torn.clone()).collect();
    if progress && report.segments > 0 {
        eprintln!(
            "recovery: {} stream(s), {} segment(s), {:.1} MB of log; replaying ({}, {}]",
            report.streams,
            report.segments,
            report.log_bytes as f64 / 1e6,
            ckpt_ts.0,
            cut.0
        );
    }
    // Replay every stream in parallel; newest version wins per record.
    let counts: Vec<(u64, u64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = logs
            .iter()
            .map(|l| {
                sc.spawn(move || -> Result<(u64, u64), LogError> {
                    let (mut replayed, mut dropped) = (0, 0);
                    for b in &l.batches {
                        for t in &b.txns {
                            if t.ts <= ckpt_ts {
                                continue;
                            }
                            if t.ts > cut {
                                dropped += 1;
                                continue;
                            }
                            for w in &t.writes {
                                db.recovery_install(w.table, w.rid, &w.key, t.ts, w.value.clone())
                                    .map_err(LogError::Engine)?;
                            }
                            replayed += 1;
                        }
                    }
                    Ok((replayed, dropped))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("replayer panicked")).collect::<Result<Vec<_>, _>>()
    })?;
    report.log_txns_replayed = counts.iter().map(|c| c.0).sum();
    report.log_txns_dropped_above_cut = counts.iter().map(|c| c.1).sum();
    report.max_epoch = segments.iter().map(|s| s.epoch.0).max().unwrap_or(0);
    report.log_seconds = t0.elapsed().as_secs_f64();
    Ok(cut)
}
