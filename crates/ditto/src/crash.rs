//! `ditto crash-child`: the workload the crash tests SIGKILL.
//!
//! Bank transfers between `accounts` accounts, each transfer also inserting an event
//! (worker, seq) -> (from, to, amount). A line `COMMIT <worker> <seq> <ts>` is printed
//! once the commit has its timestamp, and `ACK <worker> <seq> <ts>` only after it is
//! durable. After any crash, the checker (crates/ditto/tests/crash.rs) expects: every
//! ACKed event present; the events present a prefix of the commit order (each worker's
//! gap-free, and none missing below the newest present or acknowledged); each balance
//! what the events present make it (no partial transfer).
//! `--active-workers` and `--pause-pct` leave log streams idle, for good or at random
//! moments, so crashes also land while busy streams vouch for idle ones (the log's floor).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ditto_engine::{Direction, Error, WorkerId};
use ditto_log::OpenOptions;
use rand::{Rng, SeedableRng};

use crate::logmode::{log_options, LogMode};

pub const START_BALANCE: i64 = 1_000_000;

#[derive(clap::Args)]
pub struct CrashArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Workers that run transfers (the first ones); the rest stay idle, so their log
    /// streams are vouched for by the busy ones (default: all).
    #[arg(long)]
    active_workers: Option<usize>,
    /// Percent of transfers after which the worker pauses for up to 3 ms, so streams go
    /// idle and busy again at random.
    #[arg(long, default_value_t = 0)]
    pause_pct: u32,
    #[arg(long, value_enum, default_value_t = LogMode::EveryBatch)]
    log: LogMode,
    #[arg(long, default_value_t = 2)]
    interval_ms: u64,
    #[arg(long, default_value_t = 64)]
    accounts: u64,
    /// Online checkpoint every this many ms (0: none).
    #[arg(long, default_value_t = 0)]
    checkpoint_ms: u64,
    /// Small segments so that crashes land around segment rolls too.
    #[arg(long, default_value_t = 256 * 1024)]
    segment_bytes: u64,
    /// Stop by itself after this long.
    #[arg(long, default_value_t = 60)]
    max_seconds: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

pub fn event_key(worker: u32, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&worker.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub fn run(a: CrashArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dur = a.log.durability(a.interval_ms).ok_or("crash-child needs a log")?;
    let mut log = log_options(dur, true);
    log.segment_bytes_max = a.segment_bytes;
    let d = ditto_log::open(&a.dir, OpenOptions { workers: a.workers, log, progress: false, ..Default::default() })?;
    let db = d.db().clone();
    let accounts = db.open_table("accounts")?;
    let events = db.open_table("events")?;
    {
        let mut w = db.worker(WorkerId(0)).expect("worker 0");
        let n = a.accounts;
        w.run(|x| {
            for i in 0..n {
                if x.get(accounts, &i.to_be_bytes())?.is_none() {
                    x.insert(accounts, &i.to_be_bytes(), &START_BALANCE.to_le_bytes())?;
                }
            }
            Ok(())
        })?
        .1
        .wait()?;
    }
    if a.checkpoint_ms > 0 {
        // By time only, so the crash rounds checkpoint at the pace they ask for.
        d.spawn_checkpointer(ditto_log::CheckpointPolicy {
            every: Some(Duration::from_millis(a.checkpoint_ms)),
            log_growth_percent: 0,
            log_min_bytes: 0,
            reuse_min_ids: 0,
        });
    }
    println!("READY");
    std::io::stdout().flush()?;
    let deadline = Instant::now() + Duration::from_secs(a.max_seconds);
    std::thread::scope(|s| {
        for wi in 0..a.active_workers.unwrap_or(a.workers).min(a.workers) as u32 {
            let db = &db;
            let a = &a;
            s.spawn(move || -> Result<(), Error> {
                let mut w = db.worker(WorkerId(wi)).expect("worker");
                // Continue after the last event this worker made durable before a crash.
                let last = db.read().scan(
                    events,
                    std::ops::Bound::Included(&event_key(wi, 0)[..]),
                    std::ops::Bound::Included(&event_key(wi, u64::MAX)[..]),
                    Direction::Reverse,
                    1,
                )?;
                let mut seq =
                    last.first().map(|(k, _)| u64::from_be_bytes(k[4..12].try_into().unwrap()) + 1).unwrap_or(0);
                let mut rng = rand::rngs::SmallRng::seed_from_u64(a.seed * 1000 + wi as u64 + seq);
                while Instant::now() < deadline {
                    let (from, to) = (rng.gen_range(0..a.accounts), rng.gen_range(0..a.accounts));
                    let amount: i64 = rng.gen_range(1..100);
                    let (_, ticket) = w.run(|x| {
                        let f =
                            i64::from_le_bytes(x.get(accounts, &from.to_be_bytes())?.unwrap()[..].try_into().unwrap());
                        x.update(accounts, &from.to_be_bytes(), &(f - amount).to_le_bytes())?;
                        let t =
                            i64::from_le_bytes(x.get(accounts, &to.to_be_bytes())?.unwrap()[..].try_into().unwrap());
                        x.update(accounts, &to.to_be_bytes(), &(t + amount).to_le_bytes())?;
                        let mut ev = [0u8; 24];
                        ev[..8].copy_from_slice(&from.to_le_bytes());
                        ev[8..16].copy_from_slice(&to.to_le_bytes());
                        ev[16..].copy_from_slice(&amount.to_le_bytes());
                        x.insert(events, &event_key(wi, seq), &ev)
                    })?;
                    {
                        // Its timestamp before it is durable: the checker's prefix check
                        // across workers needs those it may lose too.
                        let mut out = std::io::stdout().lock();
                        let _ = writeln!(out, "COMMIT {wi} {seq} {}", ticket.ts().0);
                        let _ = out.flush();
                    }
                    let ts = ticket.wait()?;
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "ACK {wi} {seq} {}", ts.0);
                    let _ = out.flush();
                    seq += 1;
                    if rng.gen_range(0..100) < a.pause_pct {
                        std::thread::sleep(Duration::from_micros(rng.gen_range(0..3000)));
                    }
                }
                Ok(())
            });
        }
    });
    d.close();
    Ok(())
}
