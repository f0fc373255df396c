//! Replay-only runs (`ditto bench tpcc|ycsb --replay-only serial,parallel`): the logged run
//! is recorded as the primary frames it (a shipping tap keeps every batch), then replayed
//! into a fresh database by the backups' live replay (`ditto_replication::replay_recorded`)
//! as fast as it goes, once per replay mode: first the load's batches (not timed), then the
//! run's (timed). Each replayed database must then hold exactly the primary's keys and
//! values (`contents`), or the run fails.
//!
//! Figures per mode: transactions replayed per second, replay CPU per transaction (the
//! replayers', which check each batch too: these were never received), and
//! `replay_cost_ratio`: that over the CPU the recorded run's worker threads spent per
//! logged transaction, the read-only transactions' CPU taken out (thread against thread).
//! Recording copies every batch, and a tap moves the log's writes and fsyncs to disk
//! threads (crates/log/src/writer.rs): neither is on the workers. Until 2026-12-06 the
//! ratio was over the whole recorded process's CPU per logged transaction, recording and
//! read-only transactions included, which a review found biased it low (about 24 us of
//! execution per transaction against 15-19 in unrecorded runs); that figure is still
//! given, `replay_cost_ratio_over_process`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use ditto_engine::{Database, Options, TableId, Ts};
use ditto_log::format::BatchHeader;
use parking_lot::Mutex;

type Error = Box<dyn std::error::Error>;

/// Keeps every batch the log frames, and where the measured run starts.
#[derive(Default)]
pub struct Recorder {
    frames: Mutex<Vec<Bytes>>,
    tables: Mutex<Vec<(TableId, String)>>,
    run_start: AtomicUsize,
    /// The log's transaction count when the run started.
    pub logged_at_start: AtomicU64,
}

impl ditto_log::ShipTap for Recorder {
    fn batch(&self, _header: &BatchHeader, frame: &[u8], _at_once: bool) {
        self.frames.lock().push(Bytes::copy_from_slice(frame));
    }

    fn table_created(&self, id: TableId, name: &str) {
        self.tables.lock().push((id, name.to_string()));
    }
}

impl Recorder {
    /// The measured run starts: batches from here on are the run's.
    pub fn mark_run_start(&self, logged: u64) {
        self.run_start.store(self.frames.lock().len(), Ordering::Release);
        self.logged_at_start.store(logged, Ordering::Release);
    }
}

/// Every table's present keys and values as (name, count, CRC32C over them in key order):
/// a replayed database must give the primary's.
pub fn contents(db: &Database) -> Result<Vec<(String, u64, u32)>, Error> {
    let mut out = Vec::new();
    let r = db.read();
    for (id, name) in db.tables() {
        let (mut n, mut crc) = (0u64, 0u32);
        r.for_each(id, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, |k, v| {
            n += 1;
            for part in [&(k.len() as u32).to_le_bytes()[..], k, &(v.len() as u32).to_le_bytes()[..], v] {
                crc = crc32c::crc32c_append(crc, part);
            }
            true
        })?;
        out.push((name, n, crc));
    }
    out.sort();
    Ok(out)
}

/// Replays what `rec` recorded in `mode`; `exec_s_per_txn` is the recorded run's CPU per
/// logged transaction; `primary` is the primary's `contents` after the run, which the
/// replayed database must match; `prefault_mib` is pre-faulted after the load is replayed
/// and before the run is, as it was for the recorded run (`crate::memory`). Every mode
/// gets its own: without it, the mode replayed second grew its heap on fresh pages and
/// paid about twice the CPU per transaction (docs/replication.md). Returns the figures as
/// JSON (and prints a line).
pub fn replay(
    rec: &Recorder,
    streams: usize,
    mode: &str,
    (exec_s_per_txn, process_s_per_txn): (f64, f64),
    primary: &[(String, u64, u32)],
    prefault_mib: u64,
) -> Result<serde_json::Value, Error> {
    let (mode_v, share) = ditto_replication::parse_replay(mode).map_err(|e| format!("--replay-only: {e}"))?;
    let frames = rec.frames.lock();
    let split = rec.run_start.load(Ordering::Acquire).min(frames.len());
    let db = Database::new(Options { workers: streams });
    let mut tables = rec.tables.lock().clone();
    tables.sort_by_key(|t| t.0 .0);
    for (id, name) in &tables {
        let got = db.create_table(name)?;
        if got != *id {
            return Err(format!("table {name} got id {} on replay, {} when recorded", got.0, id.0).into());
        }
    }
    let load = ditto_replication::replay_recorded(Arc::clone(&db), streams, Ts::ZERO, mode_v, share, &frames[..split])?;
    let prefaulted = crate::memory::prefault(prefault_mib, streams);
    let run =
        ditto_replication::replay_recorded(Arc::clone(&db), streams, load.replayed, mode_v, share, &frames[split..])?;
    let replayed = contents(&db)?;
    if replayed != primary {
        let diff: Vec<String> = primary
            .iter()
            .zip(&replayed)
            .filter(|(a, b)| a != b)
            .map(|(a, b)| {
                format!("{}: primary {} keys crc {:08x}, replayed {} keys crc {:08x}", a.0, a.1, a.2, b.1, b.2)
            })
            .collect();
        return Err(format!(
            "replay-only {mode}: the replayed database differs from the primary's: {}",
            diff.join("; ")
        )
        .into());
    }
    let per_txn = run.cpu_seconds / run.txns.max(1) as f64;
    let ratio = per_txn / exec_s_per_txn.max(1e-12);
    println!(
        "  replay-only {mode:<8}  {:>10.0} txn/s ({} txns, {} batches in {:.2} s); replay CPU {:.2} us/txn = {:.3}x of execution; {} waits for a reused id's old life",
        run.txns as f64 / run.seconds.max(1e-9),
        run.txns,
        run.batches,
        run.seconds,
        per_txn * 1e6,
        ratio,
        run.reuse_waits
    );
    Ok(serde_json::json!({
        "mode": mode,
        "txns": run.txns,
        "batches": run.batches,
        "seconds": run.seconds,
        "txns_per_s": run.txns as f64 / run.seconds.max(1e-9),
        "replay_cpu_s_per_txn": per_txn,
        "exec_worker_cpu_s_per_logged_txn": exec_s_per_txn,
        "exec_cpu_s_per_logged_txn": process_s_per_txn,
        "replay_cost_ratio": ratio,
        "replay_cost_ratio_over_process": per_txn / process_s_per_txn.max(1e-12),
        "reuse_waits": run.reuse_waits,
        "load_txns_replayed": load.txns,
        "prefault_mib": prefaulted.mib,
        "matches_primary": true,
    }))
}
