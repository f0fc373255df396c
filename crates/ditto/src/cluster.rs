//! Cluster runs of `ditto bench tpcc|ycsb --backups N`: the benchmark runs embedded in this
//! process as a primary (its log shipped by `ditto_replication::Primary`), with N backups,
//! each a `ditto server --replica-of` child process replaying it; a commit counts once the
//! commit policy releases it (the harness's `Probe::released`).
//!
//! ```text
//!  this process (pinned to the first half of the CPUs with --pin)     N x `ditto server --replica-of`
//!   workers -> log -> Primary --TCP batches--------------------------->  receive, fsync, ack, replay
//!   harness counts a commit at release_watermark(policy, acks) <--acks--  (pinned to the other half)
//!   sampler: every 5 ms, the backups' lags and freshness (Primary::backups)
//! ```
//!
//! Figures: the run's report, plus `throughput_ratio_vs_standalone` (filled in by the
//! caller from the same mode run without backups in the same process, just before),
//! `replay_cost_ratio` (the CPU a backup spends making the run's transactions its own, per
//! transaction: its replayers' (from its INFO) and its receiver thread's, which checks and
//! parses each batch so that replay need not, over the CPU the primary's worker threads
//! spend per logged transaction, its read-only transactions' CPU taken out: thread against
//! thread; the worst backup), `replay_cost_ratio_process` (the same, process against
//! process: the backup's whole CPU, its fsyncs, acks and checkpoints included, per
//! transaction it replayed, over this process's per logged transaction, its read-only
//! transactions' and checkpoints' CPU taken out; both sides count their logging and
//! links), `replay_cost_ratio_replayers` (the replayers alone over the workers: the
//! receiver's parse, which replay would otherwise do, left out, so a bound below), and
//! `replay_cost_ratio_replayers_over_process` (the definition before
//! 2026-12-06, kept to compare with earlier runs: the replayers alone over this whole
//! process, read-only transactions' CPU left in, which a review found biased low); `backup_lag_ms_p50/_p99` (how long the oldest
//! shipped commit not yet replayed has waited, sampled over the run, worst backup; and the
//! same for its stages, `backup_received_lag_ms_*` and `backup_durable_lag_ms_*`, so a lag
//! can be placed: on the link, at the backup's fsync, or in its replay) and
//! `freshness_score` (Query Fresh: a backup's read view over the primary's, mean over the
//! samples, worst backup).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_bench::harness::{Probe, Report, RunConfig};
use ditto_log::{Durability, LogOptions, OpenOptions};
use ditto_replication::{release_watermark, CommitPolicy, Primary, PrimaryOptions};
use parking_lot::Mutex;

use crate::demo_server::{Client, Reply};
use crate::logmode::log_options;

type Error = Box<dyn std::error::Error>;

/// How long a cluster run waits, before its clock starts, for the backups to replay the load.
const LOAD_REPLAY_WAIT_MAX: Duration = Duration::from_secs(120);

/// What a cluster run needs besides the benchmark body.
pub struct ClusterSpec<'a> {
    pub backups: usize,
    pub policy: CommitPolicy,
    pub replay: &'a str,
    /// The CPUs the backups are pinned to (`halves`, taken before this process pinned
    /// itself), or none.
    pub backup_cpus: Option<Vec<usize>>,
    /// MiB of heap each backup pre-faults (what this process pre-faults for its run, so
    /// that replay and execution pay the same for fresh memory).
    pub prefault_mib: u64,
    /// A server config file each backup starts with (`--config`).
    pub config: Option<&'a Path>,
    pub workers: usize,
    pub durability: Durability,
    pub compress: bool,
    pub direct_io: bool,
    /// The primary checkpoints this often (`--checkpoint-every-ms`; 0: never), as the
    /// standalone run does: a checkpoint lets record ids be reused, which replay then meets.
    pub checkpoint_every_ms: u64,
    /// The slice the commit path's threads ask for, here and in the backups
    /// (`--commit-thread-slice-us`; 0: the kernel's default).
    pub commit_thread_slice_us: u64,
    /// The slice a primary's links and ack readers ask for, here and in the backups
    /// (`--link-thread-slice-us`; 0: the kernel's default).
    pub link_thread_slice_us: u64,
    /// The workers ship the primary's batches, not the flushers (`--workers-ship`).
    pub workers_ship: bool,
}

struct BackupProc {
    child: Child,
    port: u16,
}

/// A backup process's CPU so far, in seconds: all of it (`/proc/PID/stat`'s user and
/// system time, its ended threads included), and its receiver thread's
/// (`ditto-repl-recv`'s `schedstat`; a receiver of an earlier link, ended, is not counted).
fn backup_cpu(pid: u32) -> Result<(f64, f64), Error> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').ok_or("an unreadable /proc stat")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    // (Fields 14 and 15 of the line, 12th and 13th after the name's end.)
    let ticks = f.get(11).zip(f.get(12)).ok_or("a short /proc stat")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let process = (ticks.0.parse::<u64>()? + ticks.1.parse::<u64>()?) as f64 / hz;
    let mut receiver = 0.0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == "ditto-repl-recv" {
            let s = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            receiver += s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) as f64 / 1e9;
        }
    }
    Ok((process, receiver))
}

impl Drop for BackupProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CPUs this process may use.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![];
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// With `--pin`: the CPUs of this process (the primary, and the standalone runs, pinned the
/// same way so the ratio compares like with like) and of the backups: the first and the
/// second half of the allowed ones. `None` with fewer than two.
pub fn halves() -> Option<(Vec<usize>, Vec<usize>)> {
    let all = allowed_cpus();
    (all.len() >= 2).then(|| (all[..all.len() / 2].to_vec(), all[all.len() / 2..].to_vec()))
}

/// Pins the calling thread (and the threads it starts from now on) to `cpus`.
pub fn pin_to(cpus: &[usize]) -> Result<(), Error> {
    // SAFETY: as in `allowed_cpus`; CPU_SET writes inside the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!("sched_setaffinity({cpus:?}): {}", std::io::Error::last_os_error()).into());
        }
    }
    Ok(())
}

pub fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

fn start_backup(dir: &Path, primary: &str, spec: &ClusterSpec<'_>) -> Result<BackupProc, Error> {
    let cpus = spec.backup_cpus.as_deref();
    let exe = std::env::current_exe()?;
    let mut cmd = match cpus {
        Some(c) => {
            let mut t = Command::new("taskset");
            t.args(["-c", &cpu_list(c)]).arg(exe);
            t
        }
        None => Command::new(exe),
    };
    let mut child = cmd
        .args(["server", "--port", "0", "--metrics", "off", "--data-dir", dir.to_str().ok_or("dir is not UTF-8")?])
        .args(["--workers", &spec.workers.to_string(), "--replica-of", primary, "--replay", spec.replay])
        .args(["--prefault-mib", &spec.prefault_mib.to_string()])
        .args(["--commit-thread-slice-us", &spec.commit_thread_slice_us.to_string()])
        .args(["--link-thread-slice-us", &spec.link_thread_slice_us.to_string()])
        .args(spec.config.iter().flat_map(|c| [std::ffi::OsStr::new("--config"), c.as_os_str()]))
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(dir.with_extension("log"))?))
        .spawn()
        .map_err(|e| format!("starting a backup process (taskset is in util-linux): {e}"))?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let line = lines.next().ok_or("the backup exited before listening")??;
    let addr = line.strip_prefix("ditto server listening on ").ok_or(format!("unexpected line {line:?}"))?;
    let port = addr.split(' ').next().and_then(|a| a.rsplit(':').next()).ok_or("no port")?.parse()?;
    Ok(BackupProc { child, port })
}

/// (replay CPU ms, transactions replayed) from a backup's INFO.
fn replay_counters(port: u16) -> Result<(f64, f64), Error> {
    let mut c = Client::connect_to("127.0.0.1", port).map_err(|e| e.to_string())?;
    let text = match c.call(&["INFO", "replication"]).map_err(|e| e.to_string())? {
        Reply::Bulk(Some(b)) => String::from_utf8(b)?,
        other => return Err(format!("INFO replication: {other:?}").into()),
    };
    let (f, _) = crate::status::parse_info(&text);
    let num = |k: &str| -> Result<f64, Error> {
        Ok(f.get(k).ok_or(format!("no {k} in the backup's INFO"))?.trim().parse::<f64>()?)
    };
    Ok((num("ditto_replay_cpu_ms")?, num("ditto_txns_replayed")?))
}

/// One cluster run (see the module notes). `body` loads and runs the benchmark.
pub fn run(
    name: &str,
    spec: &ClusterSpec<'_>,
    run: &RunConfig,
    body: &crate::bench::Body<'_>,
) -> Result<Report, Error> {
    let scratch = crate::logmode::ScratchDir::new(None, &format!("{name}-cluster"))?;
    // The caller pinned this process to the first half (`halves`) before any run.
    let theirs = spec.backup_cpus.clone();
    if let Some(t) = &theirs {
        eprintln!("  pinned: the backups to CPU(s) {}", cpu_list(t));
    }
    let out = (|| -> Result<Report, Error> {
        let d = ditto_log::open(
            &scratch.path.join("primary"),
            OpenOptions {
                workers: spec.workers,
                log: LogOptions { direct_io: spec.direct_io, ..log_options(spec.durability, spec.compress) },
                progress: run.progress,
                ..Default::default()
            },
        )?;
        // The backups are `ditto server`s, which serve the Redis keyspace: it exists before
        // they join (a backup never creates a table of its own).
        ditto_server::keyspace::Keyspace::open(d.db())?;
        // Closed and its checkpointer waited for however this returns: an early error
        // leaves the primary's log held by the primary (its release listener holds the
        // primary, which holds the log), and its checkpointer would go on writing into the
        // scratch directory as it is deleted (found by a review).
        let _closing = crate::logmode::CloseOnDrop(
            &d,
            (spec.checkpoint_every_ms > 0).then(|| {
                d.spawn_checkpointer(ditto_log::CheckpointPolicy {
                    every: Some(Duration::from_millis(spec.checkpoint_every_ms)),
                    log_growth_percent: 0,
                    log_min_bytes: 0,
                    reuse_min_ids: 0,
                })
            }),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let policy = spec.policy;
        let opts = PrimaryOptions { backups_expected: spec.backups, ..Default::default() };
        let primary = Primary::start(&d, listener, opts, Box::new(move |h| release_watermark(policy, h)))?;
        // The release moves when the local log's watermark does too (a backup may ack a
        // batch before this node's own fsync of it ends), as the server's listener does.
        let p2 = Arc::clone(&primary);
        d.logger()
            .set_progress_listener(Box::new(move |_, _| p2.recompute()))
            .map_err(|e| format!("installing the release listener: {e}"))?;
        let mut backups = Vec::new();
        for i in 0..spec.backups {
            let dir = scratch.path.join(format!("backup-{i}"));
            backups.push(start_backup(&dir, &addr, spec)?);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while primary.backups().len() < spec.backups {
            if Instant::now() > deadline {
                return Err(format!("{} backups did not connect within 60 s", spec.backups).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The sampler: from the run's start, the worst backup's replay lag and freshness.
        let started = AtomicBool::new(false);
        let done = AtomicBool::new(false);
        // The worst backup's lag at each stage: received, durable, replayed (where a lag that
        // is high in replay only is the backup's replay, and one high from `received` on is
        // the shipping or the link).
        let hist = || hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
        let lags = Mutex::new([hist(), hist(), hist()]);
        let fresh = Mutex::new((0.0f64, 0u64));
        let counters0: Mutex<Vec<Result<(f64, f64), String>>> = Mutex::new(Vec::new());
        let cpu0: Mutex<Vec<Result<(f64, f64), String>>> = Mutex::new(Vec::new());
        // Samples taken while a backup was not linked (its lag unknown): not recorded, and
        // counted in the report.
        let missing = AtomicU64::new(0);
        let logged0 = AtomicU64::new(0);
        let ckpt_cpu0 = AtomicU64::new(0);
        // The primary's logged transactions and checkpoint CPU at the run's end (`on_end`).
        let at_end: Mutex<Option<(u64, u64)>> = Mutex::new(None);
        let caught_up: Mutex<Result<(), String>> = Mutex::new(Ok(()));
        let on_start = || {
            // The backups replay the load first (its chunks of hundreds of rows each), so
            // that none of it counts as the run's replay (a review found the counters read
            // while a backup could still be replaying the load's tail). Before the run's
            // clock starts (`harness::run` calls this first).
            let target = d.db().clock().visible_ts();
            let waited = Instant::now();
            let deadline = waited + LOAD_REPLAY_WAIT_MAX;
            let behind = || {
                let bs = primary.backups();
                bs.len() < backups.len() || bs.iter().any(|b| b.replayed < target)
            };
            while behind() {
                if Instant::now() > deadline {
                    *caught_up.lock() = Err(format!(
                        "the backups had not replayed the load (up to ts {}) {} s after it ended",
                        target.0,
                        LOAD_REPLAY_WAIT_MAX.as_secs()
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            eprintln!("  the backups held the load replayed {} ms after it ended", waited.elapsed().as_millis());
            logged0.store(d.logger().stats.txns.load(Ordering::Relaxed), Ordering::Relaxed);
            ckpt_cpu0.store(d.logger().stats.checkpoint_cpu_ns.load(Ordering::Relaxed), Ordering::Relaxed);
            *counters0.lock() = backups.iter().map(|b| replay_counters(b.port).map_err(|e| e.to_string())).collect();
            *cpu0.lock() = backups.iter().map(|b| backup_cpu(b.child.id()).map_err(|e| e.to_string())).collect();
            started.store(true, Ordering::Release);
        };
        let released = || primary.released();
        let logger = d.logger().clone();
        let bytes = move || logger.stats.bytes_written.load(Ordering::Relaxed);
        let report = std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                    if !started.load(Ordering::Acquire) {
                        continue;
                    }
                    let bs = primary.backups();
                    if bs.len() < backups.len() {
                        missing.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let visible = d.db().clock().visible_ts().0;
                    let rel = primary.released().0;
                    {
                        let mut lags = lags.lock();
                        let stages: [fn(&ditto_replication::BackupInfo) -> Duration; 3] =
                            [|b| b.received_lag, |b| b.durable_lag, |b| b.replay_lag];
                        for (h, lag_of) in lags.iter_mut().zip(stages) {
                            let lag = bs.iter().map(lag_of).max().unwrap_or_default();
                            let _ = h.record(lag.as_micros() as u64);
                        }
                    }
                    let f = bs
                        .iter()
                        .map(|b| ditto_server::replinfo::freshness_pct(b.replayed.0.min(rel), visible))
                        .fold(100.0, f64::min);
                    let mut fr = fresh.lock();
                    fr.0 += f;
                    fr.1 += 1;
                }
            });
            // Sampled over the run alone: not while the benchmark checks its data after it
            // (before 2026-12-04, those idle 200 ms and more were sampled too).
            // (The primary's logged transactions and checkpoint CPU as the run's CPU is read,
            // not after the benchmark's checks, which the checkpointer runs beside.)
            let on_end = || {
                let stats = &d.logger().stats;
                *at_end.lock() =
                    Some((stats.txns.load(Ordering::Relaxed), stats.checkpoint_cpu_ns.load(Ordering::Relaxed)));
                done.store(true, Ordering::Release);
            };
            let probe = Probe {
                log_bytes: &bytes,
                released: Some(&released),
                on_run_start: Some(&on_start),
                on_run_end: Some(&on_end),
                // With `--workers-ship`, each worker ships its own batches
                // (`ditto_log::defer_flushes`), as a server's busy runtime threads do.
                on_worker_start: spec.workers_ship.then_some(&ditto_log::defer_flushes as &(dyn Fn() + Sync)),
            };
            let r = body(d.db(), run, &probe);
            done.store(true, Ordering::Release);
            r
        });
        let mut report = report?;
        // Execution CPU per transaction that the backups replay (read-only ones are not
        // logged): this process's CPU over the run (workers, log, shipping) per logged one.
        caught_up.into_inner()?;
        // (A body that never reported its run's end: read now.)
        let stats = &d.logger().stats;
        let (logged1, ckpt_cpu1) = at_end
            .into_inner()
            .unwrap_or_else(|| (stats.txns.load(Ordering::Relaxed), stats.checkpoint_cpu_ns.load(Ordering::Relaxed)));
        let logged = logged1 - logged0.load(Ordering::Relaxed);
        let exec_s_per_txn = report.cpu_s_per_txn * report.committed as f64 / logged.max(1) as f64;
        // The primary's checkpoints are not execution (a backup's replay CPU counts none of
        // its own): taken out of the ratio's denominator.
        let ckpt_ns = ckpt_cpu1 - ckpt_cpu0.load(Ordering::Relaxed);
        let ckpt_s_per_txn = ckpt_ns as f64 / 1e9 / logged.max(1) as f64;
        let exec_excl =
            crate::logmode::exec_without_checkpoints(report.cpu_s_per_txn * report.committed as f64, ckpt_ns, logged);
        let c1: Vec<(f64, f64)> = backups.iter().map(|b| replay_counters(b.port)).collect::<Result<_, _>>()?;
        let c0: Vec<(f64, f64)> = counters0
            .lock()
            .clone()
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("a backup's replay counters could not be read at the run's start: {e}"))?;
        // Replay CPU per transaction: the most expensive backup.
        let replay_s_per_txn =
            c0.iter().zip(&c1).map(|(a, b)| ((b.0 - a.0) / 1e3) / (b.1 - a.1).max(1.0)).fold(0.0, f64::max);
        // The backups' whole CPU and their receivers', per transaction each replayed.
        let p1: Vec<(f64, f64)> = backups.iter().map(|b| backup_cpu(b.child.id())).collect::<Result<_, _>>()?;
        let p0: Vec<(f64, f64)> = cpu0
            .lock()
            .clone()
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(|e| format!("a backup's CPU could not be read at the run's start: {e}"))?;
        let replayed: Vec<f64> = c0.iter().zip(&c1).map(|(a, b)| (b.1 - a.1).max(1.0)).collect();
        // Per backup, per transaction it replayed: its whole process, its receiver, and its
        // receiver and replayers together; the worst backup's of each.
        let per_backup = |i: usize| {
            let receiver = (p1[i].1 - p0[i].1) / replayed[i];
            ((p1[i].0 - p0[i].0) / replayed[i], receiver, (c1[i].0 - c0[i].0) / 1e3 / replayed[i] + receiver)
        };
        let (backup_process_s, receiver_s, replay_threads_s) = (0..backups.len())
            .map(per_backup)
            .fold((0.0f64, 0.0f64, 0.0f64), |(a, b, c), (x, y, z)| (a.max(x), b.max(y), c.max(z)));
        // This side: the workers' CPU on the logged transactions, and the whole process's
        // with the read-only transactions' and the checkpoints' taken out.
        let workers_s = (report.worker_cpu_s - report.worker_read_only_cpu_s).max(0.0) / logged.max(1) as f64;
        let process_s =
            (exec_excl * logged.max(1) as f64 - report.worker_read_only_cpu_s).max(0.0) / logged.max(1) as f64;
        let lags = lags.lock();
        let fr = *fresh.lock();
        if let serde_json::Value::Object(m) = &mut report.extra {
            m.insert("backups".into(), spec.backups.into());
            m.insert("commit_policy".into(), spec.policy.name().into());
            m.insert("commit_thread_slice_us".into(), spec.commit_thread_slice_us.into());
            m.insert("link_thread_slice_us".into(), spec.link_thread_slice_us.into());
            m.insert("shipped_by".into(), if spec.workers_ship { "workers" } else { "flushers" }.into());
            m.insert("backup_replay".into(), spec.replay.into());
            m.insert("pinned".into(), spec.backup_cpus.is_some().into());
            if let Some(c) = spec.config {
                m.insert("backup_config".into(), std::fs::read_to_string(c).unwrap_or_default().into());
            }
            m.insert("replay_cpu_s_per_txn".into(), replay_s_per_txn.into());
            m.insert("exec_cpu_s_per_logged_txn".into(), exec_s_per_txn.into());
            m.insert("checkpoint_cpu_s_per_logged_txn".into(), ckpt_s_per_txn.into());
            m.insert("receiver_cpu_s_per_txn".into(), receiver_s.into());
            m.insert("exec_worker_cpu_s_per_logged_txn".into(), workers_s.into());
            m.insert("worker_read_only_cpu_s".into(), report.worker_read_only_cpu_s.into());
            m.insert("backup_process_cpu_s_per_txn".into(), backup_process_s.into());
            m.insert("primary_process_cpu_s_per_logged_txn".into(), process_s.into());
            m.insert("replay_cost_ratio".into(), (replay_threads_s / workers_s.max(1e-12)).into());
            m.insert("replay_cost_ratio_process".into(), (backup_process_s / process_s.max(1e-12)).into());
            // (The replayers alone over the workers: the receiver's share left out.)
            m.insert("replay_cost_ratio_replayers".into(), (replay_s_per_txn / workers_s.max(1e-12)).into());
            m.insert(
                "replay_cost_ratio_replayers_over_process".into(),
                (replay_s_per_txn / exec_excl.max(1e-12)).into(),
            );
            let ms = |us: u64| us as f64 / 1e3;
            // (No sample, no figure: null, not a lag of 0; a review found an empty
            // histogram read as 0 ms, 2026-12-06.)
            for (h, stage) in lags.iter().zip(["backup_received_lag", "backup_durable_lag", "backup_lag"]) {
                let at = |q: f64| (!h.is_empty()).then(|| ms(h.value_at_quantile(q)));
                m.insert(format!("{stage}_ms_p50"), at(0.5).into());
                m.insert(format!("{stage}_ms_p99"), at(0.99).into());
                m.insert(format!("{stage}_ms_max"), (!h.is_empty()).then(|| ms(h.max())).into());
            }
            m.insert("lag_samples".into(), lags[2].len().into());
            m.insert("lag_samples_missing_a_backup".into(), missing.load(Ordering::Relaxed).into());
            // (No sample, no figure: null.)
            m.insert("freshness_score".into(), (fr.1 > 0).then(|| fr.0 / fr.1 as f64).into());
            m.insert("commit_latency_us_p50".into(), report.latency_us_p50.into());
            m.insert("commit_latency_us_p99".into(), report.latency_us_p99.into());
        }
        primary.stop();
        drop(backups);
        Ok(report)
    })();
    out
}
