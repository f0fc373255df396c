//! `ditto demo`: the most complete thing ditto shows today, on one machine.
//!
//! ```text
//!  parent                                   child (`ditto demo-child`, a real process)
//!  ------                                   -----
//!  spawn child  ---------------------------> open data dir, load TPC-C (durable), run the
//!                                             full mix with online checkpoints; prints
//!  read "ACKED <ts>" lines  <----------------  the durable watermark every 100 ms and its
//!                                             report; keeps running under load
//!  SIGKILL at a random moment under load --> X
//!  open the same dir: recovery with progress
//!  check: recovered cut >= every ACKED ts, TPC-C consistency 1-4, mix still runs
//!  then the server part (demo_server.rs): `ditto server` as a process, clients over TCP,
//!  SIGKILL under load, restart, every acknowledged write present
//!  print the report
//! ```

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ditto_bench::harness::{Probe, Report, RunConfig};
use ditto_bench::tpcc;
use ditto_log::OpenOptions;
use rand::Rng;

use crate::logmode::{log_options, LogMode, ScratchDir};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Data directory, new or empty (default: a scratch directory, removed afterwards); the
    /// server part uses DIR.server beside it.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seconds of the measured TPC-C run before the crash.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Warehouses (default: one per worker).
    #[arg(long)]
    warehouses: Option<u32>,
    /// Reduced TPC-C sizes (a faster load).
    #[arg(long)]
    small: bool,
    #[arg(long, value_enum, default_value_t = LogMode::Interval)]
    log: LogMode,
    #[arg(long, default_value_t = 10)]
    interval_ms: u64,
    /// LZ4-compress log batches (off by default, as in the log's own default).
    #[arg(long)]
    compress: bool,
    /// Seconds of client load on the Redis-protocol server before its SIGKILL (0: skip
    /// the server part).
    #[arg(long, default_value_t = 5.0)]
    server_seconds: f64,
    /// Client connections in the server part.
    #[arg(long, default_value_t = 8)]
    server_clients: usize,
    /// Workers of every `ditto server` the server, standby and cluster parts start (the
    /// TPC-C part's are `--workers`) [default: the server's own, the cores less one].
    #[arg(long, default_value_t = ditto_server::config::default_workers())]
    server_workers: usize,
    /// Seconds of client load on a primary with a backup (0: skip the hot-standby part).
    #[arg(long, default_value_t = 3.0)]
    standby_seconds: f64,
    /// Failovers of a three-node cluster (SIGKILL of the primary's node under load; 0:
    /// skip the failover part).
    #[arg(long, default_value_t = 3)]
    failovers: usize,
}

#[derive(clap::Args)]
pub struct DemoChildArgs {
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    seconds: f64,
    #[arg(long)]
    workers: usize,
    #[arg(long)]
    warehouses: u32,
    #[arg(long)]
    small: bool,
    #[arg(long, value_enum)]
    log: LogMode,
    #[arg(long)]
    interval_ms: u64,
    #[arg(long)]
    compress: bool,
}

pub fn run(a: DemoArgs) -> Result<(), Box<dyn std::error::Error>> {
    if a.log == LogMode::Off {
        return Err("the demo crashes and recovers, so it needs a log (--log nosync|interval|every-batch)".into());
    }
    let scratch = ScratchDir::new(a.dir.clone(), "demo")?;
    let warehouses = a.warehouses.unwrap_or(a.workers as u32);
    println!(
        "ditto demo: TPC-C, {warehouses} warehouse(s), {} worker(s), log {}",
        a.workers,
        a.log.name(a.interval_ms)
    );
    println!("data directory: {}", scratch.path.display());
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("demo-child")
        .args(["--dir", scratch.path.to_str().ok_or("data dir is not UTF-8")?])
        .args(["--seconds", &a.seconds.to_string()])
        .args(["--workers", &a.workers.to_string()])
        .args(["--warehouses", &warehouses.to_string()])
        .args(["--log", &format!("{:?}", a.log).to_lowercase().replace("everybatch", "every-batch")])
        .args(["--interval-ms", &a.interval_ms.to_string()])
        .args(if a.small { vec!["--small"] } else { vec![] })
        .args(if a.compress { vec!["--compress"] } else { vec![] })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut acked = 0u64;
    let mut report: Option<Report> = None;
    let mut checkpoints = 0u64;
    let mut lines = BufReader::new(stdout).lines();
    // Bounded: the child reports within load time + run time; give it generous room.
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds + 900.0);
    while report.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("the demo child did not report in time".into());
        }
        let Some(line) = lines.next() else {
            let status = child.wait()?;
            return Err(format!("the demo child ended early ({status})").into());
        };
        let line = line?;
        if let Some(ts) = line.strip_prefix("ACKED ") {
            acked = acked.max(ts.trim().parse()?);
        } else if let Some(json) = line.strip_prefix("REPORT ") {
            report = Some(serde_json::from_str::<ReportLine>(json)?.into_report());
        } else if line.starts_with("CHECKPOINT ") {
            checkpoints += 1;
        }
    }
    let report = report.expect("loop exits with a report");
    // Keep reading acknowledgements while the child runs on, then kill it under load.
    let kill_after = Duration::from_millis(rand::thread_rng().gen_range(300..1500));
    let reader = std::thread::spawn(move || {
        let mut acked = acked;
        for line in lines.map_while(Result::ok) {
            if let Some(ts) = line.strip_prefix("ACKED ") {
                if let Ok(ts) = ts.trim().parse::<u64>() {
                    acked = acked.max(ts);
                }
            }
        }
        acked
    });
    std::thread::sleep(kill_after);
    let killed_at = Instant::now();
    child.kill()?; // SIGKILL
    let status = child.wait()?;
    let acked = reader.join().expect("reader thread");
    println!("\nkilled the database process with SIGKILL under load ({status}); last acknowledged commit ts {acked}");
    println!("\n== recovery");
    let d = ditto_log::open(
        &scratch.path,
        OpenOptions {
            workers: a.workers,
            log: log_options(a.log.durability(a.interval_ms).expect("checked above"), a.compress),
            progress: true,
            ..Default::default()
        },
    )?;
    let recovered_in = killed_at.elapsed();
    let rep = d.recovery().clone();
    let cut = rep.cut_ts.max(rep.checkpoint_ts.unwrap_or_default());
    if cut.0 < acked {
        return Err(
            format!("LOST ACKNOWLEDGED COMMITS: recovered up to ts {} but ts {acked} was acknowledged", cut.0).into()
        );
    }
    let t = tpcc::open(d.db())?;
    let c = tpcc::check_consistency(d.db(), &t).map_err(|e| format!("TPC-C consistency after recovery: {e}"))?;
    // The recovered database keeps working.
    let after = tpcc::run(
        d.db(),
        &t,
        &RunConfig { workers: a.workers, duration: Duration::from_secs(2), seed: 99, progress: false },
        &Probe { log_bytes: &|| 0, ..Probe::NONE },
    )?;
    tpcc::check_consistency(d.db(), &t).map_err(|e| format!("TPC-C consistency after the post-recovery run: {e}"))?;
    // (Its "OK" below says transactions ran: none is a failure, not a pass.)
    if after.committed == 0 {
        return Err("no transaction committed after recovery".into());
    }
    d.close();

    let server = if a.server_seconds > 0.0 {
        let dir = ScratchDir::new(a.dir.as_ref().map(|d| d.with_extension("server")), "demo-server")?;
        Some(
            crate::demo_server::run(&dir.path, a.server_workers, a.server_clients.max(1), a.server_seconds)
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };

    let standby = if a.standby_seconds > 0.0 {
        let dir = ScratchDir::new(a.dir.as_ref().map(|d| d.with_extension("standby")), "demo-standby")?;
        Some(
            crate::demo_standby::run(&dir.path, a.server_workers, a.server_clients.max(1), a.standby_seconds)
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };

    let failover = if a.failovers > 0 {
        let dir = ScratchDir::new(a.dir.as_ref().map(|d| d.with_extension("failover")), "demo-failover")?;
        Some(crate::demo_failover::run(&dir.path, a.server_workers, a.failovers).map_err(|e| e.to_string())?)
    } else {
        None
    };

    println!("\n================ ditto demo report ================");
    println!("TPC-C full mix, {} worker(s), {} warehouse(s), log {}", a.workers, warehouses, a.log.name(a.interval_ms));
    println!("  throughput          {:>10.0} txn/s over {:.1} s", report.throughput_tps, report.duration_s);
    println!(
        "  committed           {:>10}   aborts {} ({:.2}%)",
        report.committed,
        report.aborts,
        report.abort_rate * 100.0
    );
    println!("  latency to durable  p50 {} us, p99 {} us", report.latency_us_p50, report.latency_us_p99);
    println!(
        "  log                 {:>10.0} bytes/txn ({})",
        report.log_bytes_per_txn,
        if a.compress { "LZ4" } else { "uncompressed; --compress for LZ4" }
    );
    println!("  CPU                 {:>10.1} us/txn", report.cpu_s_per_txn * 1e6);
    println!("  online checkpoints  {checkpoints} during the run");
    println!("crash: SIGKILL {} ms after the run, under load", kill_after.as_millis());
    println!(
        "recovery: checkpoint at ts {} ({} rows, {:.0} MB/s) + {} txns replayed from {:.1} MB of log ({:.0} MB/s)",
        rep.checkpoint_ts.map(|t| t.0).unwrap_or(0),
        rep.checkpoint_rows,
        rep.checkpoint_mb_per_s(),
        rep.log_txns_replayed,
        rep.log_bytes as f64 / 1e6,
        rep.log_mb_per_s()
    );
    println!(
        "          {} unacknowledged txns above the cut dropped; torn tails truncated: {}",
        rep.log_txns_dropped_above_cut,
        rep.torn_tails_truncated.len()
    );
    println!(
        "          indexes rebuilt ({} keys) in {:.2} s; new checkpoint written in {:.2} s",
        rep.index_keys, rep.index_seconds, rep.checkpoint_write_seconds
    );
    println!("          back up {:.2} s after the kill", recovered_in.as_secs_f64());
    println!("checks:   every acknowledged commit recovered (cut ts {} >= acked ts {acked})  OK", cut.0);
    println!(
        "          TPC-C consistency conditions 1-4 and stock ({} districts, {} orders, {} order lines)  OK",
        c.districts, c.orders, c.order_lines
    );
    println!("          {} more transactions ran after recovery, consistency still holds  OK", after.committed);
    if let Some(s) = server {
        println!("---------------------------------------------------");
        s.print();
    }
    if let Some(s) = standby {
        println!("---------------------------------------------------");
        s.print();
    }
    if let Some(f) = failover {
        println!("---------------------------------------------------");
        f.print();
    }
    println!("===================================================");
    Ok(())
}

/// The child's report as it crosses the pipe.
#[derive(serde::Deserialize)]
struct ReportLine {
    throughput_tps: f64,
    duration_s: f64,
    committed: u64,
    aborts: u64,
    abort_rate: f64,
    latency_us_p50: u64,
    latency_us_p99: u64,
    log_bytes_per_txn: f64,
    cpu_s_per_txn: f64,
}

impl ReportLine {
    fn into_report(self) -> Report {
        Report {
            benchmark: "tpcc".into(),
            workers: 0,
            duration_s: self.duration_s,
            committed: self.committed,
            aborts: self.aborts,
            user_aborts: 0,
            throughput_tps: self.throughput_tps,
            abort_rate: self.abort_rate,
            latency_us_p50: self.latency_us_p50,
            latency_us_p99: self.latency_us_p99,
            latency_us_max: 0,
            worker_cpu_s: 0.0,
            worker_read_only_cpu_s: 0.0,
            read_only_committed: 0,
            log_bytes: 0,
            log_bytes_per_txn: self.log_bytes_per_txn,
            cpu_s_per_txn: self.cpu_s_per_txn,
            per_type: Vec::new(),
            extra: serde_json::Value::Null,
        }
    }
}

pub fn child(a: DemoChildArgs) -> Result<(), Box<dyn std::error::Error>> {
    let dur = a.log.durability(a.interval_ms).ok_or("needs a log")?;
    let d = ditto_log::open(
        &a.dir,
        OpenOptions { workers: a.workers, log: log_options(dur, a.compress), progress: true, ..Default::default() },
    )?;
    let cfg = if a.small { tpcc::TpccConfig::small(a.warehouses) } else { tpcc::TpccConfig::new(a.warehouses) };
    eprintln!("== load");
    let t = tpcc::load(d.db(), &cfg, true)?;
    // Report the durable watermark as the "last acknowledged" point, from a side thread.
    let logger = d.logger().clone();
    std::thread::spawn(move || loop {
        let w = logger.watermark();
        let mut out = std::io::stdout().lock();
        if writeln!(out, "ACKED {}", w.0).and_then(|_| out.flush()).is_err() {
            return;
        }
        drop(out);
        std::thread::sleep(Duration::from_millis(100));
    });
    // Online checkpoints while the workers run.
    let dd = d.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(5));
        match dd.checkpoint() {
            Ok(info) => {
                eprintln!(
                    "checkpoint at ts {}: {} rows, {:.1} MB in {:.2} s",
                    info.ts.0,
                    info.rows,
                    info.bytes as f64 / 1e6,
                    info.seconds
                );
                println!("CHECKPOINT {}", info.ts.0);
            }
            Err(e) => eprintln!("checkpoint failed: {e}"),
        }
    });
    eprintln!("== run ({} s)", a.seconds);
    let logger = d.logger().clone();
    let bytes = move || logger.stats.bytes_written.load(Ordering::Relaxed);
    let run = RunConfig { workers: a.workers, duration: Duration::from_secs_f64(a.seconds), seed: 42, progress: true };
    let report = tpcc::run(d.db(), &t, &run, &Probe { log_bytes: &bytes, ..Probe::NONE })?;
    report.print();
    println!("REPORT {}", serde_json::to_string(&report)?);
    std::io::stdout().flush()?;
    // Keep the load on until the parent kills us.
    eprintln!("== running on until killed");
    let run = RunConfig { workers: a.workers, duration: Duration::from_secs(600), seed: 43, progress: false };
    tpcc::run(d.db(), &t, &run, &Probe { log_bytes: &bytes, ..Probe::NONE })?;
    Ok(())
}
