//! `ditto bench`: the embedded benchmarks, each run once per `--log` mode so that the log's
//! cost is a ratio measured on the same machine in the same run.
//!
//! Each mode runs in a fresh child process (this executable again, with `--one-process` and
//! that mode alone): a mode that ran after another in the same process ran on a heap the
//! first had used and freed, and was slower for it whether it logged or not (TPC-C,
//! `--log off,interval,off,interval,off` in one process on a 16-core machine: 106k, 86k,
//! 90k, 94k, 89k tps with 2 workers; docs/results.md), which read as a cost of the log.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ditto_bench::harness::{Probe, Report, RunConfig};
use ditto_bench::{index, tpcc, ycsb};
use ditto_engine::{Database, Options};
use ditto_log::{LogOptions, OpenOptions};

use crate::logmode::{create_empty_dir, log_options, LogMode, ScratchDir};
use crate::memory::{self, Prefault};

#[derive(clap::Subcommand)]
pub enum BenchCmd {
    /// TPC-C full mix with consistency checks after every run.
    Tpcc(TpccArgs),
    /// YCSB++ (Rolis 6.1): 50% read-only txns of 4 reads, 50% txns of 4 read-modify-writes.
    Ycsb(YcsbArgs),
    /// The ordered-index candidates (docs/index-choice.md).
    Index(IndexArgs),
    /// Recovery speed: log a TPC-C run, then time checkpoint load and log replay.
    Recovery(RecoveryArgs),
    /// The log's LZ4 compressor on real TPC-C batch payloads: MB/s and ratio, and what the
    /// log holds per table.
    Lz4(Lz4Args),
    /// redis-benchmark against `ditto server` and a real Redis (appendfsync everysec).
    Redis(crate::redisbench::RedisBenchArgs),
    /// Writes per second around SIGKILLs of a three-node cluster's primary, clients
    /// following the primary (Rolis figure 14); every acknowledged write checked.
    Failover(crate::failoverbench::FailoverBenchArgs),
}

#[derive(clap::Args, Clone)]
pub struct Common {
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Seconds of measured run per log mode.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Log modes to run, in order (comma-separated): off, nosync, interval, every-batch.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "off,interval")]
    pub log: Vec<LogMode>,
    /// Group-commit interval for `interval` and `nosync`.
    #[arg(long, default_value_t = 10)]
    pub interval_ms: u64,
    /// LZ4-compress log batches (off by default, as in the log's own default).
    #[arg(long)]
    pub compress: bool,
    /// Write log segments through the page cache instead of with direct I/O.
    #[arg(long)]
    pub buffered_log: bool,
    /// Data directory for a logged run, new or empty, so one logged mode per run (default: a
    /// scratch directory per mode, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// End with one JSON object holding every figure.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run every log mode in this process, one after the other, instead of each in a fresh
    /// child process (later modes then run on a heap the earlier ones used).
    #[arg(long)]
    pub one_process: bool,
    /// MiB of heap to pre-fault after the load, before the measured run, as Silo does
    /// (see memory.rs): `auto` (256 MiB per worker and second of run, at most a quarter of
    /// the available memory), `off`, or a number.
    #[arg(long, default_value = "auto")]
    pub prefault: Prefault,
    /// Cluster runs: after each logged mode, run it again as a primary with this many
    /// backups (each a `ditto server --replica-of` process), once per --backup-replay mode,
    /// all in this process (see cluster.rs).
    #[arg(long, default_value_t = 0)]
    pub backups: usize,
    /// The cluster runs' commit policy: local, majority, all, each -durable or -received.
    #[arg(long, default_value = "majority-durable")]
    pub commit_policy: String,
    /// The cluster runs' backup replay modes (comma-separated): serial, parallel,
    /// dependency (KuaFu's graph, a barrier every 1024 transactions), dependency:N.
    #[arg(long, value_delimiter = ',', default_value = "parallel")]
    pub backup_replay: Vec<String>,
    /// Cluster runs: pin this process (the primary) to the first half of the CPUs and the
    /// backups to the other half.
    #[arg(long)]
    pub pin: bool,
    /// Cluster runs: a server config file (docs/server.md) each backup starts with, e.g.
    /// to set its checkpoint policy (by default backups checkpoint as a server does).
    #[arg(long)]
    pub backup_config: Option<std::path::PathBuf>,
    /// Replay-only runs: record each logged mode's log, then replay it into a fresh
    /// database as fast as the backups' replay goes, once per mode given (serial,
    /// parallel, dependency, dependency:N; see replaybench.rs), and check it holds the
    /// primary's keys and values.
    #[arg(long, value_delimiter = ',')]
    pub replay_only: Vec<String>,
    /// Logged runs: an online checkpoint every this many milliseconds, load and run (0:
    /// none), on the standalone run and on a cluster run's primary (before 2026-12-04 only
    /// the standalone one). Ids of deleted rows are reused after each, so replay then meets
    /// batches with a reuse bound (`BatchHeader::reuse_ts`), and says how often it waited.
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every_ms: u64,
    /// The time slice in us that the threads on a commit's path ask for (Linux 6.12+), in
    /// this process and in the backups, as a server's `commit_thread_slice_us`; 0: the
    /// kernel's default (docs/replication.md, "Short time slices for the commit path").
    #[arg(long, default_value_t = 0)]
    pub commit_thread_slice_us: u64,
    /// The time slice in us that a primary's replication links and ack readers ask for
    /// (Linux 6.12+), as a server's `link_thread_slice_us`; 0: the kernel's default
    /// (docs/replication.md, "A short slice for the links").
    #[arg(long, default_value_t = 300)]
    pub link_thread_slice_us: u64,
    /// Cluster runs: each worker frames and ships its own batches, at the end of its first
    /// commit 200 us after its last batch (`ditto_log::defer_flushes`, as a server's busy
    /// runtime threads do), where by default the log's flusher threads do it: lower backup
    /// lag and commit latency, more CPU per transaction (docs/replication.md, "Commits
    /// shipped by the committing thread").
    #[arg(long)]
    pub workers_ship: bool,
    /// Cluster runs: no standalone run after them. By default each logged mode with
    /// backups runs standalone again after its cluster runs, and their
    /// `throughput_ratio_vs_standalone` is against the mean of the runs before and after
    /// (both kept, `_before` and `_after`); not with --replay-only, whose standalone run is
    /// recorded.
    #[arg(long)]
    pub no_bracket: bool,
}

impl Common {
    /// Runs `measure` (the measured run, after the load) on a heap pre-faulted for it, says
    /// so, and records what was pre-faulted in the report's extra figures.
    fn prefaulted(
        &self,
        run: &RunConfig,
        measure: impl FnOnce() -> Result<Report, ditto_engine::Error>,
    ) -> Result<Report, ditto_engine::Error> {
        let p = memory::prefault(self.prefault.mib(run.workers, run.duration.as_secs_f64()), run.workers);
        if run.progress && p.mib > 0 {
            eprintln!(
                "pre-faulted {} MiB of heap for the run in {:.1} s (--prefault off to skip)",
                p.mib,
                p.took.as_secs_f64()
            );
        }
        let mut r = measure()?;
        if let serde_json::Value::Object(m) = &mut r.extra {
            m.insert("prefault_mib".into(), p.mib.into());
            m.insert("prefault_s".into(), p.took.as_secs_f64().into());
        }
        Ok(r)
    }
}

#[derive(clap::Args)]
pub struct TpccArgs {
    #[command(flatten)]
    c: Common,
    /// Warehouses (default: one per worker).
    #[arg(long)]
    warehouses: Option<u32>,
    /// Reduced sizes (1,000 items, 100 customers per district) for quick runs.
    #[arg(long)]
    small: bool,
}

#[derive(clap::Args)]
pub struct YcsbArgs {
    #[command(flatten)]
    c: Common,
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    #[arg(long, default_value_t = 100)]
    value_len: usize,
    /// Zipfian skew (e.g. 0.99); uniform if absent.
    #[arg(long)]
    zipf: Option<f64>,
}

#[derive(clap::Args)]
pub struct IndexArgs {
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// random8 (8 random bytes) or redis (the server's layout of redis-benchmark keys, 17 bytes).
    #[arg(long, default_value = "random8")]
    key_shape: index::KeyShape,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct RecoveryArgs {
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seconds of TPC-C to log (no checkpoint in between, so it all has to be replayed).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long)]
    warehouses: Option<u32>,
    #[arg(long)]
    small: bool,
    /// LZ4-compress log batches.
    #[arg(long)]
    compress: bool,
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Copy the data directory, as the run left it, to this new directory before
    /// recovering it (for `--from`).
    #[arg(long)]
    save: Option<PathBuf>,
    /// Recover a copy of a directory saved with `--save` instead of loading and running
    /// TPC-C: recovery alone, in a fresh process, on the same input each time.
    #[arg(long, conflicts_with = "save")]
    from: Option<PathBuf>,
    /// Recover in the process that ran TPC-C, on the heap the run used and freed (by
    /// default a child process runs TPC-C and this process, fresh as after a crash,
    /// recovers).
    #[arg(long)]
    same_process: bool,
    /// Internal: load and run TPC-C into `--dir`, close, print the commit count, exit.
    #[arg(long, hide = true, requires = "dir")]
    run_only: bool,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct Lz4Args {
    /// Seconds of TPC-C (1 worker, uncompressed log) whose batches are compressed.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Timed passes over all payloads; the best is reported.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Reduced TPC-C sizes (quick runs; smaller rows, so a different ratio).
    #[arg(long)]
    small: bool,
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: BenchCmd) -> Result<(), Box<dyn std::error::Error>> {
    match cmd {
        BenchCmd::Tpcc(a) => {
            a.c.prefault.check()?;
            let w = a.warehouses.unwrap_or(a.c.workers as u32);
            let cfg = if a.small { tpcc::TpccConfig::small(w) } else { tpcc::TpccConfig::new(w) };
            run_modes("tpcc", &a.c, |db, run, probe| {
                let t = tpcc::load(db, &cfg, run.progress)?;
                let report = a.c.prefaulted(run, || tpcc::run(db, &t, run, probe))?;
                let c = tpcc::check_consistency(db, &t).map_err(|e| format!("TPC-C consistency check failed: {e}"))?;
                if run.progress {
                    eprintln!(
                        "consistency conditions 1-4 and stock hold ({} districts, {} orders, {} order lines)",
                        c.districts, c.orders, c.order_lines
                    );
                }
                Ok(report)
            })
        }
        BenchCmd::Ycsb(a) => {
            a.c.prefault.check()?;
            let cfg = ycsb::YcsbConfig {
                keys: a.keys,
                value_len: a.value_len,
                zipf_theta: a.zipf,
                ..ycsb::YcsbConfig::default()
            };
            run_modes("ycsb", &a.c, |db, run, probe| {
                let y = ycsb::load(db, &cfg, run.progress)?;
                let report = a.c.prefaulted(run, || ycsb::run(db, &y, run, probe))?;
                let rows = ycsb::check(db, &y)?;
                if run.progress {
                    eprintln!("check: {rows} rows present");
                }
                Ok(report)
            })
        }
        BenchCmd::Index(a) => {
            let res = index::run(&index::IndexBenchConfig {
                keys: a.keys,
                threads: a.threads,
                seconds_per_case: a.seconds,
                shape: a.key_shape,
            });
            index::print(&res);
            if a.json {
                println!("{}", serde_json::to_string(&res)?);
            }
            Ok(())
        }
        BenchCmd::Recovery(a) => recovery(a),
        BenchCmd::Lz4(a) => lz4(a),
        BenchCmd::Redis(a) => crate::redisbench::run(a),
        BenchCmd::Failover(a) => crate::failoverbench::run(a),
    }
}

pub(crate) type Body<'a> =
    dyn Fn(&Arc<Database>, &RunConfig, &Probe<'_>) -> Result<Report, Box<dyn std::error::Error>> + 'a;

fn run_modes(
    name: &str,
    c: &Common,
    body: impl Fn(&Arc<Database>, &RunConfig, &Probe<'_>) -> Result<Report, Box<dyn std::error::Error>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let slice = ditto_log::sched::slice_from_us(c.commit_thread_slice_us)
        .map_err(|e| format!("--commit-thread-slice-us {e}"))?;
    let link_slice =
        ditto_log::sched::slice_from_us(c.link_thread_slice_us).map_err(|e| format!("--link-thread-slice-us {e}"))?;
    if c.workers_ship && c.backups == 0 {
        // (Without backups nothing is shipped: the flag would be silently without effect.)
        return Err("--workers-ship needs --backups: only a cluster run ships its batches".into());
    }
    if c.log.len() > 1 && !c.one_process && c.backups == 0 {
        return run_modes_in_children(name, c);
    }
    ditto_log::sched::set_commit_thread_slice(slice);
    ditto_log::sched::set_link_thread_slice(link_slice);
    let policy = ditto_replication::CommitPolicy::parse(&c.commit_policy)?;
    if let Some(path) = &c.backup_config {
        // Read here, so that a file the backups would refuse says why (their logs go with
        // the scratch directory); the settings a backup of a benchmark cannot take too.
        let cfg =
            ditto_server::config::Config::load(path).map_err(|e| format!("--backup-config {}: {e}", path.display()))?;
        if cfg.requirepass.is_some() || cfg.tls_only {
            return Err(format!(
                "--backup-config {}: requirepass and tls_only are not for a benchmark's backups",
                path.display()
            )
            .into());
        }
    }
    // With --pin: every run of this process, standalone ones included, on the primary's
    // CPUs (before any log thread starts, so they inherit it), the backups on the others.
    let mut backup_cpus = None;
    if c.pin && c.backups > 0 {
        let (mine, theirs) = crate::cluster::halves().ok_or("--pin needs at least two CPUs")?;
        crate::cluster::pin_to(&mine)?;
        eprintln!(
            "pinned: this process (standalone runs and the primary) to CPU(s) {}, the backups to CPU(s) {}",
            crate::cluster::cpu_list(&mine),
            crate::cluster::cpu_list(&theirs)
        );
        backup_cpus = Some(theirs);
    }
    let body: &Body = &body;
    let run = RunConfig {
        workers: c.workers,
        duration: Duration::from_secs_f64(c.seconds),
        seed: c.seed,
        progress: !c.json || atty_stderr(),
    };
    let mut results: Vec<(String, Report)> = Vec::new();
    for mode in &c.log {
        let label = mode.name(c.interval_ms);
        eprintln!("== {name}: {} worker(s), log {label}", c.workers);
        // A standalone run of this mode (with --replay-only, its recorded run and replays).
        let standalone = || -> Result<Report, Box<dyn std::error::Error>> {
            Ok(match mode.durability(c.interval_ms) {
                None => {
                    let db = Database::new(Options { workers: c.workers });
                    body(&db, &run, &Probe::NONE)?
                }
                Some(dur) => {
                    // One run of this mode, recorded (`--replay-only`) or not; `unrecorded`, the
                    // workers' CPU per logged transaction of an unrecorded run, for the replay's
                    // ratio.
                    let run_logged = |recording: bool,
                                      unrecorded: Option<f64>|
                     -> Result<Report, Box<dyn std::error::Error>> {
                        let scratch = ScratchDir::new(c.dir.clone(), name)?;
                        let d = ditto_log::open(
                            &scratch.path,
                            OpenOptions {
                                workers: c.workers,
                                log: LogOptions { direct_io: !c.buffered_log, ..log_options(dur, c.compress) },
                                progress: run.progress,
                                ..Default::default()
                            },
                        )?;
                        // (Closed, its checkpointer waited for, before the scratch directory goes,
                        // on an early error too.)
                        let mut closing = crate::logmode::CloseOnDrop(
                            &d,
                            (c.checkpoint_every_ms > 0).then(|| {
                                d.spawn_checkpointer(ditto_log::CheckpointPolicy {
                                    every: Some(std::time::Duration::from_millis(c.checkpoint_every_ms)),
                                    log_growth_percent: 0,
                                    log_min_bytes: 0,
                                    reuse_min_ids: 0,
                                })
                            }),
                        );
                        let logger = d.logger().clone();
                        let stats = d.logger().clone();
                        let bytes = move || logger.stats.bytes_written.load(std::sync::atomic::Ordering::Relaxed);
                        // --replay-only: record every batch, and where the run starts.
                        let recorder = recording.then(|| Arc::new(crate::replaybench::Recorder::default()));
                        if let Some(rec) = &recorder {
                            d.logger()
                                .set_ship_tap(Arc::clone(rec) as Arc<dyn ditto_log::ShipTap>)
                                .map_err(|e| format!("recording the log: {e}"))?;
                        }
                        let l2 = d.logger().clone();
                        // The checkpoints' CPU when the run starts: taken out of the execution the
                        // replay is compared with, as in a cluster run (`cluster.rs`).
                        let ckpt_cpu0 = std::sync::atomic::AtomicU64::new(0);
                        let mark = || {
                            if let Some(rec) = &recorder {
                                rec.mark_run_start(l2.stats.txns.load(std::sync::atomic::Ordering::Relaxed));
                                ckpt_cpu0.store(
                                    l2.stats.checkpoint_cpu_ns.load(std::sync::atomic::Ordering::Relaxed),
                                    std::sync::atomic::Ordering::Relaxed,
                                );
                            }
                        };
                        let probe = Probe {
                            log_bytes: &bytes,
                            on_run_start: recorder.as_ref().map(|_| &mark as &(dyn Fn() + Sync)),
                            ..Probe::NONE
                        };
                        let mut r = body(d.db(), &run, &probe)?;
                        // (Read as the run ends, before the checkpoint under way is waited for.)
                        let ckpt_ns = d.logger().stats.checkpoint_cpu_ns.load(std::sync::atomic::Ordering::Relaxed)
                            - ckpt_cpu0.load(std::sync::atomic::Ordering::Relaxed);
                        let logged_in_run = d.logger().stats.txns.load(std::sync::atomic::Ordering::Relaxed)
                            - recorder
                                .as_ref()
                                .map_or(0, |rec| rec.logged_at_start.load(std::sync::atomic::Ordering::Relaxed));
                        let primary_contents = match &recorder {
                            Some(_) => crate::replaybench::contents(d.db())?,
                            None => Vec::new(),
                        };
                        // A checkpoint under way ends here, before the replay-only runs and before
                        // the scratch directory goes (before 2026-12-04 the directory could be
                        // deleted under it, which then failed, an ERROR in the next run's output).
                        closing.close_now();
                        if let Some(rec) = &recorder {
                            let process = crate::logmode::exec_without_checkpoints(
                                r.cpu_s_per_txn * r.committed as f64,
                                ckpt_ns,
                                logged_in_run,
                            );
                            // (The workers' CPU of the unrecorded run before, where there was one:
                            // recording slows this run's workers, 31 against 18 us per transaction
                            // measured on TPC-C at one worker.)
                            let workers = unrecorded.unwrap_or(
                                (r.worker_cpu_s - r.worker_read_only_cpu_s).max(0.0) / logged_in_run.max(1) as f64,
                            );
                            let exec = (workers, process);
                            let mut out = Vec::new();
                            for m in &c.replay_only {
                                let mib = c.prefault.mib(c.workers, c.seconds);
                                out.push(crate::replaybench::replay(rec, c.workers, m, exec, &primary_contents, mib)?);
                            }
                            if let serde_json::Value::Object(m) = &mut r.extra {
                                m.insert("replay_only".into(), out.into());
                            }
                        }
                        // fsync latency over the whole process (load included): how the disk behaved.
                        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
                        let fsyncs = load(&stats.stats.fsyncs);
                        let mean_ms = load(&stats.stats.fsync_ns_total) as f64 / fsyncs.max(1) as f64 / 1e6;
                        let max_ms = load(&stats.stats.fsync_ns_max) as f64 / 1e6;
                        eprintln!("  log fsyncs {fsyncs}, mean {mean_ms:.2} ms, max {max_ms:.1} ms (load and run)");
                        if let serde_json::Value::Object(m) = &mut r.extra {
                            m.insert("log_fsyncs".into(), fsyncs.into());
                            m.insert("log_fsync_ms_mean".into(), mean_ms.into());
                            m.insert("log_fsync_ms_max".into(), max_ms.into());
                        }
                        Ok(r)
                    };
                    if c.replay_only.is_empty() {
                        run_logged(false, None)?
                    } else {
                        // The replay is weighed against an unrecorded run of the same mode and
                        // seed first (a review found, 2026-12-06, that the recorded run's own
                        // execution, slowed by the recording, made the ratio look better).
                        eprintln!("  (an unrecorded run first, for the execution the replay is weighed against)");
                        let base = run_logged(false, None)?;
                        let logged = base.committed.saturating_sub(base.read_only_committed).max(1) as f64;
                        let per = (base.worker_cpu_s - base.worker_read_only_cpu_s).max(0.0) / logged;
                        let mut r = run_logged(true, Some(per))?;
                        if let serde_json::Value::Object(m) = &mut r.extra {
                            m.insert("unrecorded_worker_cpu_s_per_logged_txn".into(), per.into());
                            m.insert("unrecorded_throughput_tps".into(), base.throughput_tps.into());
                        }
                        r
                    }
                }
            })
        };
        let report = standalone()?;
        report.print();
        let standalone_tps = report.throughput_tps;
        results.push((label.clone(), report));
        let Some(dur) = mode.durability(c.interval_ms).filter(|_| c.backups > 0) else { continue };
        let first_cluster_run = results.len();
        for replay in &c.backup_replay {
            let cl = format!("{label}+{}x{}/{}", c.backups, policy.name(), replay);
            eprintln!(
                "== {name}: {} worker(s), log {label}, {} backup(s), {}, {replay} replay",
                c.workers,
                c.backups,
                policy.name()
            );
            let spec = crate::cluster::ClusterSpec {
                backups: c.backups,
                policy,
                replay,
                backup_cpus: backup_cpus.clone(),
                prefault_mib: c.prefault.mib(c.workers, c.seconds),
                config: c.backup_config.as_deref(),
                workers: c.workers,
                durability: dur,
                compress: c.compress,
                direct_io: !c.buffered_log,
                checkpoint_every_ms: c.checkpoint_every_ms,
                commit_thread_slice_us: c.commit_thread_slice_us,
                link_thread_slice_us: c.link_thread_slice_us,
                workers_ship: c.workers_ship,
            };
            let mut r = crate::cluster::run(name, &spec, &run, body)?;
            if let serde_json::Value::Object(m) = &mut r.extra {
                m.insert("throughput_ratio_vs_standalone".into(), (r.throughput_tps / standalone_tps).into());
            }
            r.print();
            let x = &r.extra;
            let freshness = x["freshness_score"].as_f64().map_or("n/a (no sample)".into(), |f| format!("{f:.3}%"));
            let lag = |k: &str| x[k].as_f64().map_or("n/a".into(), |v| format!("{v:.2} ms"));
            println!(
                "  cluster              {:.3}x of standalone; replay {:.3}x of execution CPU per txn (threads: receiver and replayers over workers; process over process {:.3}x); backup lag p50 {}, p99 {} ({} samples, {} skipped with a backup unlinked); freshness {freshness}",
                r.throughput_tps / standalone_tps,
                x["replay_cost_ratio"].as_f64().unwrap_or(0.0),
                x["replay_cost_ratio_process"].as_f64().unwrap_or(0.0),
                lag("backup_lag_ms_p50"),
                lag("backup_lag_ms_p99"),
                x["lag_samples"].as_u64().unwrap_or(0),
                x["lag_samples_missing_a_backup"].as_u64().unwrap_or(0),
            );
            results.push((cl, r));
        }
        // The standalone run again after the cluster runs, so that their ratio is against
        // the mean of a run on either side: this VM drifts between runs, and a ratio
        // against the run before alone read the drift as the cluster's cost, either way.
        if c.no_bracket || !c.replay_only.is_empty() {
            continue;
        }
        eprintln!(
            "== {name}: {} worker(s), log {label} again, after the cluster runs (their ratio is against both)",
            c.workers
        );
        let after = standalone()?;
        after.print();
        let mean = (standalone_tps + after.throughput_tps) / 2.0;
        for (cl, r) in &mut results[first_cluster_run..] {
            let tps = r.throughput_tps;
            println!(
                "  {cl}: {:.3}x of the standalone run before, {:.3}x of the one after, {:.3}x of their mean",
                tps / standalone_tps,
                tps / after.throughput_tps,
                tps / mean
            );
            if let serde_json::Value::Object(m) = &mut r.extra {
                m.insert("throughput_ratio_vs_standalone".into(), (tps / mean).into());
                m.insert("throughput_ratio_vs_standalone_before".into(), (tps / standalone_tps).into());
                m.insert("throughput_ratio_vs_standalone_after".into(), (tps / after.throughput_tps).into());
                m.insert("standalone_tps_before".into(), standalone_tps.into());
                m.insert("standalone_tps_after".into(), after.throughput_tps.into());
            }
        }
        results.push((format!("{label} (after)"), after));
    }
    if results.len() > 1 {
        let base = results[0].1.throughput_tps;
        println!("\n{name}: throughput relative to log {}", results[0].0);
        for (label, r) in &results {
            println!("  {:<24} {:>12.0} tps  {:>6.3}x", label, r.throughput_tps, r.throughput_tps / base);
        }
    }
    if c.json {
        let runs: Vec<_> = results
            .iter()
            .map(|(label, r)| serde_json::json!({ "log": label, "report": r, "ratio_to_first": r.throughput_tps / results[0].1.throughput_tps }))
            .collect();
        println!("{}", serde_json::json!({ "benchmark": name, "machine": machine(), "runs": runs }));
    }
    Ok(())
}

/// Runs each log mode in a child process: this executable with this process's arguments,
/// `--log` set to that mode, and `--one-process --json`. The children's reports pass
/// through; their JSON is gathered into one summary, as `run_modes` prints it.
fn run_modes_in_children(name: &str, c: &Common) -> Result<(), Box<dyn std::error::Error>> {
    use clap::ValueEnum;
    let exe = std::env::current_exe()?;
    let mut base: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--log" => {
                args.next();
            }
            "--json" | "--one-process" => {}
            _ if a.starts_with("--log=") => {}
            _ => base.push(a),
        }
    }
    let mut runs: Vec<(String, serde_json::Value)> = Vec::new();
    for mode in &c.log {
        let value = mode.to_possible_value().expect("every mode has a name");
        let out = std::process::Command::new(&exe)
            .args(&base)
            .args(["--log", value.get_name(), "--one-process", "--json"])
            .stderr(std::process::Stdio::inherit())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            print!("{text}");
            return Err(format!("{name} with log {} failed ({})", value.get_name(), out.status).into());
        }
        let (report, json) = text.trim_end().rsplit_once('\n').unwrap_or(("", &text));
        println!("{report}");
        let v: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| format!("{name} with log {}: no JSON summary: {e}", value.get_name()))?;
        let run = &v["runs"][0];
        runs.push((run["log"].as_str().unwrap_or("?").to_string(), run["report"].clone()));
    }
    let tps = |r: &serde_json::Value| r["throughput_tps"].as_f64().unwrap_or(0.0);
    let base_tps = tps(&runs[0].1);
    println!("\n{name}: throughput relative to log {} (each mode in a fresh process)", runs[0].0);
    for (label, r) in &runs {
        println!("  {:<24} {:>12.0} tps  {:>6.3}x", label, tps(r), tps(r) / base_tps);
    }
    if c.json {
        let runs: Vec<_> = runs
            .iter()
            .map(|(label, r)| serde_json::json!({ "log": label, "report": r, "ratio_to_first": tps(r) / base_tps }))
            .collect();
        println!("{}", serde_json::json!({ "benchmark": name, "machine": machine(), "runs": runs }));
    }
    Ok(())
}

fn atty_stderr() -> bool {
    // SAFETY: isatty on a standard descriptor.
    unsafe { libc::isatty(2) == 1 }
}

pub fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
    })
}

fn recovery(a: RecoveryArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(save) = a.save.as_deref().filter(|_| !a.run_only) {
        // Refused before the run, not after it.
        create_empty_dir(save)?;
    }
    let scratch = ScratchDir::new(a.dir.clone(), "recovery")?;
    let w = a.warehouses.unwrap_or(a.workers as u32);
    let cfg = if a.small { tpcc::TpccConfig::small(w) } else { tpcc::TpccConfig::new(w) };
    let open = |progress| {
        ditto_log::open(
            &scratch.path,
            OpenOptions {
                workers: a.workers,
                log: log_options(ditto_log::Durability::NoSync(Duration::from_millis(10)), a.compress),
                progress,
                ..Default::default()
            },
        )
    };
    let mut txns = None;
    if let Some(from) = &a.from {
        copy_dir(from, &scratch.path)?;
    } else if !a.same_process && !a.run_only {
        // A recovery runs in a new process after a crash, so the run goes into a child
        // and this process recovers on a heap nothing has used yet. (In the process that
        // ran, log replay was 169-187 MB/s where a fresh process did 341-385, three
        // interleaved rounds: docs/results.md, fifteenth session.)
        let mut args: Vec<String> = std::env::args().skip(1).filter(|x| x != "--json").collect();
        if a.dir.is_none() {
            args.extend(["--dir".to_string(), scratch.path.display().to_string()]);
        }
        let out = std::process::Command::new(std::env::current_exe()?)
            .args(&args)
            .arg("--run-only")
            .stderr(std::process::Stdio::inherit())
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!("the TPC-C run to recover failed ({}): {text}", out.status).into());
        }
        let n = text.lines().last().and_then(|l| l.strip_prefix("committed ")).and_then(|n| n.parse().ok());
        txns = Some(n.ok_or_else(|| format!("unexpected output of the TPC-C run: {text}"))?);
    } else {
        let d = open(false)?;
        let t = tpcc::load(d.db(), &cfg, true)?;
        // The load is folded into a checkpoint, so the measured log is the run's alone.
        let ck = d.checkpoint()?;
        eprintln!("checkpoint after load: {} rows, {:.1} MB", ck.rows, ck.bytes as f64 / 1e6);
        let run =
            RunConfig { workers: a.workers, duration: Duration::from_secs_f64(a.seconds), seed: 7, progress: true };
        let logger = d.logger().clone();
        let bytes = move || logger.stats.bytes_written.load(std::sync::atomic::Ordering::Relaxed);
        let r = tpcc::run(d.db(), &t, &run, &Probe { log_bytes: &bytes, ..Probe::NONE })?;
        txns = Some(r.committed);
        d.close();
        if let Some(save) = &a.save {
            copy_dir(&scratch.path, save)?;
            eprintln!("saved the data directory to {}", save.display());
        }
        if a.run_only {
            println!("committed {}", r.committed);
            return Ok(());
        }
    }
    let d = open(true)?;
    let rep = d.recovery().clone();
    let t = tpcc::open(d.db())?;
    tpcc::check_consistency(d.db(), &t).map_err(|e| format!("consistency after recovery: {e}"))?;
    match (txns, &a.from) {
        (Some(n), _) => println!(
            "recovery of {n} logged TPC-C transactions with {} workers ({}):",
            a.workers,
            if a.same_process { "in the process that ran them" } else { "in a new process" }
        ),
        (None, Some(from)) => println!("recovery of a copy of {}:", from.display()),
        (None, None) => unreachable!("either a run or --from"),
    }
    println!(
        "  checkpoint: {:>8.1} MB, {:>10} rows in {:>6.2} s = {:>7.0} MB/s",
        rep.checkpoint_bytes as f64 / 1e6,
        rep.checkpoint_rows,
        rep.checkpoint_seconds,
        rep.checkpoint_mb_per_s()
    );
    println!(
        "  log:        {:>8.1} MB, {:>10} txns in {:>6.2} s = {:>7.0} MB/s ({} streams)",
        rep.log_bytes as f64 / 1e6,
        rep.log_txns_replayed,
        rep.log_seconds,
        rep.log_mb_per_s(),
        rep.streams
    );
    println!("  index rebuild: {:>10} keys in {:>6.2} s", rep.index_keys, rep.index_seconds);
    println!("  new checkpoint written in {:.2} s", rep.checkpoint_write_seconds);
    println!("  total open (all of the above, and the rest): {:.2} s", rep.total_seconds);
    println!("  TPC-C consistency conditions 1-4 and stock hold after recovery");
    // A backup's check of a received copy (`checkpoint::check`: every row as the load checks
    // it, installing nothing), timed on the checkpoint the open wrote: what it adds to a
    // join, against the load above.
    let tables: Vec<u32> = d.db().tables().iter().map(|(id, _)| id.0).collect();
    d.close();
    let (check_s, check_mb) = checkpoint_check_time(&scratch.path, &tables)?;
    println!(
        "  a backup's check of a copy of the checkpoint written: {:>8.1} MB in {:>6.2} s = {:>7.0} MB/s",
        check_mb,
        check_s,
        check_mb / check_s.max(1e-9)
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "benchmark": "recovery", "machine": machine(), "workers": a.workers,
                "recovered_in": if a.same_process { "the process that ran" } else { "a new process" },
                "checkpoint_mb": rep.checkpoint_bytes as f64 / 1e6, "checkpoint_mb_per_s": rep.checkpoint_mb_per_s(),
                "log_mb": rep.log_bytes as f64 / 1e6, "log_mb_per_s": rep.log_mb_per_s(),
                "log_txns_replayed": rep.log_txns_replayed, "total_open_s": rep.total_seconds,
                "index_keys": rep.index_keys, "index_s": rep.index_seconds,
                "checkpoint_write_s": rep.checkpoint_write_seconds,
                "checkpoint_check_mb": check_mb, "checkpoint_check_s": check_s,
            })
        );
    }
    Ok(())
}

/// Times `checkpoint::check` of the newest checkpoint in data directory `dir` (of tables
/// `tables`), as a backup checks a received copy: (seconds, MB).
fn checkpoint_check_time(dir: &std::path::Path, tables: &[u32]) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let (newest, m) = ditto_log::checkpoint::newest(dir)?.ok_or("no checkpoint to check")?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let t0 = std::time::Instant::now();
    let (_, bytes) = ditto_log::checkpoint::check(&newest, &m, threads, |t| tables.contains(&t.0))?;
    Ok((t0.elapsed().as_secs_f64(), bytes as f64 / 1e6))
}

/// Copies a closed data directory (files and folders, recursively) to `to`, which must not
/// exist yet or be empty. Each file is fsynced and then dropped from the page cache, so
/// recovery reads it from the disk, as after a crash (the log is written with direct I/O
/// and was never in the cache).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    create_empty_dir(to)?;
    fn walk(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        for e in std::fs::read_dir(from)? {
            let e = e?;
            let target = to.join(e.file_name());
            if e.file_type()?.is_dir() {
                std::fs::create_dir(&target)?;
                walk(&e.path(), &target)?;
            } else {
                std::fs::copy(e.path(), &target)?;
                let f = std::fs::File::open(&target)?;
                f.sync_all()?;
                use std::os::fd::AsRawFd;
                // SAFETY: a valid open descriptor; the call only advises the kernel.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
        }
        Ok(())
    }
    walk(from, to)
        .map_err(|e| std::io::Error::new(e.kind(), format!("copying {} to {}: {e}", from.display(), to.display())))
}

/// Logs a short TPC-C run uncompressed, reads every batch payload back from the segment
/// files, and times the flusher's compressor over them (best of `rounds` passes).
fn lz4(a: Lz4Args) -> Result<(), Box<dyn std::error::Error>> {
    let scratch = ScratchDir::new(None, "lz4")?;
    let cfg = if a.small { tpcc::TpccConfig::small(1) } else { tpcc::TpccConfig::new(1) };
    let (tables, loaded) = {
        let d = ditto_log::open(
            &scratch.path,
            OpenOptions {
                workers: 1,
                log: log_options(ditto_log::Durability::NoSync(Duration::from_millis(10)), false),
                progress: false,
                ..Default::default()
            },
        )?;
        let t = tpcc::load(d.db(), &cfg, true)?;
        // Only the run's batches count: the load's are folded into a checkpoint, and batches
        // that hold load transactions (at or below its timestamp) are skipped below.
        let loaded = d.checkpoint()?.ts;
        let run = RunConfig { workers: 1, duration: Duration::from_secs_f64(a.seconds), seed: 7, progress: true };
        let zero = || 0u64;
        tpcc::run(d.db(), &t, &run, &Probe { log_bytes: &zero, ..Probe::NONE })?;
        let tables = d.db().tables();
        d.close();
        (tables, loaded)
    };
    let mut payloads = Vec::new();
    // Per table: writes, key bytes and value bytes the run logged.
    let mut per_table = vec![(0u64, 0u64, 0u64); tables.iter().map(|(id, _)| id.0 as usize + 1).max().unwrap_or(0)];
    let (mut txns, mut decompressed) = (0u64, Vec::new());
    for e in std::fs::read_dir(scratch.path.join("log"))? {
        let path = e?.path();
        let file = ditto_engine::Bytes::from(std::fs::read(&path)?);
        let scan = ditto_log::format::read_segment(&file).map_err(|e| format!("{}: {e}", path.display()))?;
        let batches: Vec<_> = scan.batches.iter().map(|(_, b)| b).filter(|b| b.header.first_ts > loaded).collect();
        for b in &batches {
            for txn in b.payload_in(&mut decompressed).txns() {
                txns += 1;
                for w in txn.writes() {
                    let t = per_table.get_mut(w.table.0 as usize).ok_or("the log names a table the run never made")?;
                    *t = (
                        t.0 + 1,
                        t.1 + w.key.map_or(0, |k| k.len() as u64),
                        t.2 + w.value.map_or(0, |v| v.len() as u64),
                    );
                }
            }
        }
        payloads.extend(batches.iter().map(|b| b.payload()).filter(|p| !p.is_empty()));
    }
    let raw: usize = payloads.iter().map(|p| p.len()).sum();
    if raw == 0 {
        return Err("the TPC-C run logged nothing".into());
    }
    let (mut best, mut stored) = (f64::MAX, 0usize);
    let mut out = Vec::new();
    for _ in 0..a.rounds.max(1) {
        let t0 = std::time::Instant::now();
        stored = 0;
        for p in &payloads {
            out.clear();
            stored += ditto_log::format::compress_payload(p, &mut out).unwrap_or(p.len());
        }
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let mb_per_s = raw as f64 / 1e6 / best;
    println!(
        "per transaction ({txns} logged), by table: writes, key bytes, value bytes (raw payload {:.1} B)",
        raw as f64 / txns.max(1) as f64
    );
    let per_txn = |x: u64| x as f64 / txns.max(1) as f64;
    let mut by_table = serde_json::Map::new();
    for (id, name) in &tables {
        let (n, k, v) = per_table[id.0 as usize];
        if n > 0 {
            println!("  {name:<20} {:>6.2} {:>7.1} {:>7.1}", per_txn(n), per_txn(k), per_txn(v));
            by_table.insert(
                name.clone(),
                serde_json::json!({"writes": per_txn(n), "key_bytes": per_txn(k), "value_bytes": per_txn(v)}),
            );
        }
    }
    println!(
        "lz4: {} TPC-C batches, {:.1} MB raw -> {:.1} MB ({:.3}), {:.0} MB/s",
        payloads.len(),
        raw as f64 / 1e6,
        stored as f64 / 1e6,
        stored as f64 / raw as f64,
        mb_per_s
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "benchmark": "lz4", "machine": machine(), "batches": payloads.len(),
                "raw_mb": raw as f64 / 1e6, "ratio": stored as f64 / raw as f64, "compress_mb_per_s": mb_per_s,
                "raw_bytes_per_txn": raw as f64 / txns.max(1) as f64, "per_txn_by_table": by_table,
            })
        );
    }
    Ok(())
}
