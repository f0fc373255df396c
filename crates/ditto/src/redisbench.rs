//! `ditto bench redis`: redis-benchmark against `ditto server` and against a real Redis
//! (`redis-server --appendonly yes`, with `appendfsync everysec` and `always`) on this
//! machine, in the same run, and their ratios.
//!
//! Every server is started first; then each round runs each pipeline depth against each
//! server in turn (in the reverse order in even rounds, `round_order`: with the same order
//! every round, the second of two builds compared with `--other-ditto` won in both orders,
//! 2026-12-04), so the servers are measured minutes apart at most, interleaved. The
//! table shows each configuration's median over the rounds (ratios are median to median)
//! and the range: on a shared VM a burst of CPU steal can halve one measurement, and
//! interleaving spreads such bursts over all servers instead of landing on one.
//!
//! The two are not equally durable: Redis with `everysec` acknowledges a write before it
//! is fsynced (up to a second of acknowledged writes can be lost), ditto acknowledges it
//! only once fsynced. Redis with `always` is the like-for-like durable baseline (it
//! fsyncs each event-loop iteration's writes before answering them): the table gives the
//! ratio to both. The issue's target is the ratio to `everysec`.
//!
//! Each server's CPU time (user + system, all threads, from `/proc/PID/stat`) is read
//! before and after each test, so the table also gives the server's CPU microseconds per
//! request: steadier than throughput on a machine whose cores are shared (CPU steal slows a
//! run down but does not make it use more CPU per request).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::demo_server::{start_ditto_server, ServerProcess};
use crate::logmode::ScratchDir;

#[derive(clap::Args)]
pub struct RedisBenchArgs {
    /// Requests per redis-benchmark test.
    #[arg(long, default_value_t = 200_000)]
    requests: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 50)]
    clients: u32,
    /// Pipeline depths to run (comma-separated; 1 = no pipelining).
    #[arg(long, value_delimiter = ',', default_value = "16,1")]
    pipeline: Vec<u32>,
    /// Random keys drawn from this many (redis-benchmark -r).
    #[arg(long, default_value_t = 100_000)]
    keyspace: u64,
    /// redis-benchmark's own threads (its --threads; 1 = its single-threaded client). One
    /// client thread tops out at a few hundred thousand requests per second; give it more
    /// on a machine with cores to spare, or it measures itself.
    #[arg(long, default_value_t = 1)]
    bench_threads: u32,
    /// ditto durabilities to run (comma-separated): every-batch, interval, nosync.
    #[arg(long, value_delimiter = ',', default_value = "every-batch,interval")]
    durability: Vec<String>,
    /// ditto servers' fsync interval (interval and nosync durabilities), ms [default: the
    /// server's].
    #[arg(long)]
    fsync_interval_ms: Option<u64>,
    /// ditto server workers (the server's own default: the cores less one, at least one).
    #[arg(long, default_value_t = ditto_server::config::default_workers())]
    workers: usize,
    /// Rounds; each runs every server once per pipeline depth, interleaved.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Redis baselines to run (comma-separated appendfsync policies): everysec, always.
    #[arg(long, value_delimiter = ',', default_value = "everysec,always")]
    redis_fsync: Vec<String>,
    /// Also run this other ditto executable (an older build, say) with the same
    /// durabilities and replicated policies, interleaved with this one, as servers named
    /// `other/<durability>` and `other+backup/<policy>` (its primary and backup both that
    /// build).
    #[arg(long)]
    other_ditto: Option<PathBuf>,
    /// ditto commit policies to run with one backup (a second `ditto server --replica-of`
    /// process), comma-separated, or "none"; compared with a Redis primary and replica
    /// (`replicaof`, appendfsync everysec, no WAIT).
    #[arg(long, value_delimiter = ',', default_value = "majority-received")]
    replicated: Vec<String>,
    /// Durabilities each replicated policy runs with, on both the primary and its backup
    /// (comma-separated): `every-batch` as `ditto+backup/POLICY`, any other as
    /// `ditto+backup/POLICY@DURABILITY` (`interval`: both nodes fsync at most once per
    /// interval, as Redis everysec fsyncs once a second; the reply still waits for the
    /// backup to hold the write).
    #[arg(long, value_delimiter = ',', default_value = "every-batch,interval")]
    pair_durability: Vec<String>,
    /// Also run each replicated policy with TLS between the primary and its backup
    /// (`--tls-replication`), with this certificate (which must name 127.0.0.1), its key
    /// and their CA: the servers `ditto+backup+tls/POLICY`.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key_file", "tls_ca_cert_file"])]
    tls_cert_file: Option<PathBuf>,
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    tls_ca_cert_file: Option<PathBuf>,
    /// Skip the Redis baselines.
    #[arg(long)]
    no_redis: bool,
    /// End with one JSON object holding every figure.
    #[arg(long)]
    json: bool,
}

/// The order in which round `round` (from 1) measures `n` servers: as given in odd rounds,
/// reversed in even ones, so that over the rounds no server always runs right after
/// another (on a shared VM the position in a round can be worth more than a change).
fn round_order(n: usize, round: u32) -> Vec<usize> {
    match round % 2 {
        1 => (0..n).collect(),
        _ => (0..n).rev().collect(),
    }
}

/// One redis-benchmark test of one round.
#[derive(Serialize, Clone)]
struct Row {
    server: String,
    test: String,
    pipeline: u32,
    round: u32,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The server's CPU time (user + system, every thread) per request, microseconds.
    cpu_us_per_req: f64,
    /// Its backup's (or replica's) CPU time per request, where it has one.
    backup_cpu_us_per_req: Option<f64>,
    /// The server's resident memory right after the test, MiB.
    rss_mib: f64,
}

/// One configuration over all rounds: medians and the throughput range.
#[derive(Serialize, Clone)]
struct Summary {
    server: String,
    test: String,
    pipeline: u32,
    rounds: usize,
    rps_median: f64,
    rps_min: f64,
    rps_max: f64,
    p50_ms_median: f64,
    p99_ms_median: f64,
    cpu_us_per_req_median: f64,
    backup_cpu_us_per_req_median: Option<f64>,
    /// The server's largest resident memory after this test in any round, MiB: a server
    /// that keeps growing over the rounds shows here (the seventeenth session found the
    /// epoch GC falling behind under pipelined SETs this way, by hand).
    rss_mib_max: f64,
    /// Median throughput over Redis everysec's median for the same test (absent without
    /// it): for a ditto primary with a backup, over Redis everysec with a replica.
    vs_redis: Option<f64>,
    /// The same over Redis with appendfsync always.
    vs_redis_always: Option<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn summarize(rows: &[Row]) -> Vec<Summary> {
    let mut out: Vec<Summary> = Vec::new();
    for r in rows {
        if out.iter().any(|s| s.server == r.server && s.test == r.test && s.pipeline == r.pipeline) {
            continue;
        }
        let same: Vec<&Row> =
            rows.iter().filter(|x| x.server == r.server && x.test == r.test && x.pipeline == r.pipeline).collect();
        let rps: Vec<f64> = same.iter().map(|x| x.rps).collect();
        out.push(Summary {
            server: r.server.clone(),
            test: r.test.clone(),
            pipeline: r.pipeline,
            rounds: same.len(),
            rps_median: median(rps.clone()),
            rps_min: rps.iter().copied().fold(f64::INFINITY, f64::min),
            rps_max: rps.iter().copied().fold(0.0, f64::max),
            p50_ms_median: median(same.iter().map(|x| x.p50_ms).collect()),
            p99_ms_median: median(same.iter().map(|x| x.p99_ms).collect()),
            cpu_us_per_req_median: median(same.iter().map(|x| x.cpu_us_per_req).collect()),
            backup_cpu_us_per_req_median: same
                .iter()
                .map(|x| x.backup_cpu_us_per_req)
                .collect::<Option<Vec<f64>>>()
                .map(median),
            rss_mib_max: same.iter().map(|x| x.rss_mib).fold(0.0, f64::max),
            vs_redis: None,
            vs_redis_always: None,
        });
    }
    let base = |server: &str| -> Vec<(String, u32, f64)> {
        out.iter().filter(|s| s.server == server).map(|s| (s.test.clone(), s.pipeline, s.rps_median)).collect()
    };
    let (everysec, always) = (base("redis/everysec"), base("redis/always"));
    let (everysec_replica, everysec_replica_tls) = (base(REDIS_REPLICA), base(REDIS_REPLICA_TLS));
    let ratio = |base: &[(String, u32, f64)], s: &Summary| {
        base.iter().find(|b| b.0 == s.test && b.1 == s.pipeline).map(|b| s.rps_median / b.2)
    };
    for s in &mut out {
        // Each to its like: one replica, and TLS between the two where ditto has it.
        let base = match (s.server.contains("+backup/"), s.server.contains("+backup+tls/")) {
            (_, true) => &everysec_replica_tls,
            (true, false) => &everysec_replica,
            _ => &everysec,
        };
        s.vs_redis = ratio(base, s);
        s.vs_redis_always = ratio(&always, s);
    }
    out
}

/// Resident memory of process `pid` now, MiB, from `/proc/PID/statm`.
fn resident_mib(pid: u32) -> Result<f64, String> {
    let path = format!("/proc/{pid}/statm");
    let statm = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let pages: u64 =
        statm.split_whitespace().nth(1).and_then(|f| f.parse().ok()).ok_or(format!("{path}: {statm:?}"))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page <= 0 {
        return Err("sysconf(_SC_PAGESIZE) failed".into());
    }
    Ok((pages * page as u64) as f64 / (1 << 20) as f64)
}

/// CPU time (user + system, all threads) of process `pid` so far, from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Result<Duration, String> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or(format!("{path}: no ')' in {stat:?}"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks = |i: usize| -> Result<u64, String> {
        fields.get(i).and_then(|f| f.parse().ok()).ok_or(format!("{path}: bad field {} in {stat:?}", i + 3))
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return Err("sysconf(_SC_CLK_TCK) failed".into());
    }
    Ok(Duration::from_secs_f64((ticks(11)? + ticks(12)?) as f64 / hz as f64))
}

/// The Redis baseline with a replica.
const REDIS_REPLICA: &str = "redis+replica/everysec";
/// The same with TLS between them, the baseline of `ditto+backup+tls`.
const REDIS_REPLICA_TLS: &str = "redis+replica+tls/everysec";

fn tls_files(a: &RedisBenchArgs) -> Option<(&Path, &Path, &Path)> {
    Some((a.tls_cert_file.as_deref()?, a.tls_key_file.as_deref()?, a.tls_ca_cert_file.as_deref()?))
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_ping(port: u16) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let ok = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "PING"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG");
        if ok {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("no PONG on port {port} within 60 s"))
}

fn start_ditto(
    exe: Option<&Path>,
    dir: &Path,
    durability: &str,
    a: &RedisBenchArgs,
) -> Result<ServerProcess, Box<dyn std::error::Error>> {
    let (workers, ms) = (a.workers.to_string(), a.fsync_interval_ms.map(|ms| ms.to_string()));
    let args = [durability_args(durability, ms.as_deref()), vec!["--workers", &workers]].concat();
    Ok(start_ditto_server(exe, dir, &args, Stdio::inherit()).map_err(|e| e.to_string())?)
}

/// A ditto server's flags for `durability`, with the run's fsync interval if one was given.
fn durability_args<'a>(durability: &'a str, interval_ms: Option<&'a str>) -> Vec<&'a str> {
    let mut args = vec!["--durability", durability];
    if let Some(ms) = interval_ms {
        args.extend(["--fsync-interval-ms", ms]);
    }
    args
}

/// A ditto primary under commit policy `policy` with one backup, each in its own process
/// on its own data directory; returns once the backup is connected.
fn start_ditto_pair(
    exe: Option<&Path>,
    dir: &Path,
    policy: &str,
    a: &RedisBenchArgs,
    tls: bool,
) -> Result<ServerProcess, Box<dyn std::error::Error>> {
    let (policy, durability) = policy.split_once('@').unwrap_or((policy, "every-batch"));
    ditto_replication::CommitPolicy::parse(policy).map_err(|e| format!("--replicated: {e}"))?;
    let ms = a.fsync_interval_ms.map(|ms| ms.to_string());
    let durability_args = durability_args(durability, ms.as_deref());
    let (pdir, bdir) = (dir.join("primary"), dir.join("backup"));
    std::fs::create_dir_all(&pdir)?;
    let workers = a.workers.to_string();
    let mut tls_args: Vec<String> = Vec::new();
    if tls {
        let (Some(c), Some(k), Some(ca)) = (&a.tls_cert_file, &a.tls_key_file, &a.tls_ca_cert_file) else {
            return Err("TLS between nodes needs --tls-cert-file, --tls-key-file and --tls-ca-cert-file".into());
        };
        tls_args.push("--tls-replication".into());
        for (flag, f) in [("--tls-cert-file", c), ("--tls-key-file", k), ("--tls-ca-cert-file", ca)] {
            tls_args.extend([flag.to_string(), f.display().to_string()]);
        }
    }
    let tls_args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
    let args = ["--workers", &workers, "--repl-port", "0", "--commit-policy", policy, "--backups", "1"];
    let mut p = start_ditto_server(exe, &pdir, &[&args[..], &durability_args, &tls_args].concat(), Stdio::inherit())
        .map_err(|e| e.to_string())?;
    let repl = p.repl.clone().ok_or("the primary printed no replication address")?;
    let bargs = ["--workers", &workers, "--replica-of", &repl];
    let b = start_ditto_server(exe, &bdir, &[&bargs[..], &durability_args, &tls_args].concat(), Stdio::inherit())
        .map_err(|e| e.to_string())?;
    p.backup = Some(Box::new(b));
    wait_info(p.port, "connected_slaves:1")?;
    Ok(p)
}

/// Waits until `INFO replication` on `port` holds `want`.
fn wait_info(port: u16, want: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let out = Command::new("redis-cli").args(["-p", &port.to_string(), "INFO", "replication"]).output();
        if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(want)) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("no {want:?} in INFO replication on port {port} within 60 s"))
}

/// A Redis server: a replica of `replica_of` if given, and with `tls` (certificate, key,
/// CA) a TLS port too, which the primary's replica dials with TLS (`tls-replication`);
/// clients use the plaintext port.
fn start_redis(
    dir: &Path,
    fsync: &str,
    replica_of: Option<u16>,
    tls: Option<(&Path, &Path, &Path)>,
) -> Result<(ServerProcess, Option<u16>), Box<dyn std::error::Error>> {
    if !["everysec", "always"].contains(&fsync) {
        return Err(format!("--redis-fsync: unknown policy {fsync:?} (everysec, always)").into());
    }
    let port = free_port()?;
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir", dir.to_str().ok_or("dir")?]).args([
        "--appendonly",
        "yes",
        "--appendfsync",
        fsync,
        "--save",
        "",
    ]);
    if let Some(primary) = replica_of {
        cmd.args(["--replicaof", "127.0.0.1", &primary.to_string()]);
    }
    let tls_port = match tls {
        Some((cert, key, ca)) => {
            let t = free_port()?;
            cmd.args(["--tls-port", &t.to_string(), "--tls-replication", "yes"]);
            cmd.args(["--tls-cert-file", cert.to_str().ok_or("cert")?, "--tls-key-file", key.to_str().ok_or("key")?]);
            cmd.args(["--tls-ca-cert-file", ca.to_str().ok_or("ca")?]);
            Some(t)
        }
        None => None,
    };
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting redis-server (apt-get install redis-server): {e}"))?;
    let p = ServerProcess { child, port, repl: None, backup: None };
    wait_ping(port)?;
    Ok((p, tls_port))
}

/// A Redis primary and its replica (each appendfsync `fsync`), with TLS between them where
/// `tls` is given; returns once the replica's link is up.
fn start_redis_pair(
    dir: &Path,
    fsync: &str,
    tls: Option<(&Path, &Path, &Path)>,
) -> Result<ServerProcess, Box<dyn std::error::Error>> {
    let (pdir, rdir) = (dir.join("primary"), dir.join("replica"));
    std::fs::create_dir_all(&pdir)?;
    std::fs::create_dir_all(&rdir)?;
    let (mut p, tls_port) = start_redis(&pdir, fsync, None, tls)?;
    let (r, _) = start_redis(&rdir, fsync, Some(tls_port.unwrap_or(p.port)), tls)?;
    let rport = r.port;
    p.backup = Some(Box::new(r));
    wait_info(rport, "master_link_status:up")?;
    Ok(p)
}

/// Runs redis-benchmark's `test` (set or get) against `server`, parses its CSV and reads the
/// server's CPU time around it.
fn bench(
    proc: &ServerProcess,
    a: &RedisBenchArgs,
    test: &str,
    pipeline: u32,
    server: &str,
    round: u32,
) -> Result<Row, Box<dyn std::error::Error>> {
    let pid = proc.child.id();
    let cpu0 = cpu_time(pid)?;
    let backup_pid = proc.backup.as_ref().map(|b| b.child.id());
    let bcpu0 = backup_pid.map(cpu_time).transpose()?;
    let out = Command::new("redis-benchmark")
        .args(["-p", &proc.port.to_string(), "-t", test, "--csv"])
        .args(["-n", &a.requests.to_string(), "-c", &a.clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-r", &a.keyspace.to_string()])
        .args(if a.bench_threads > 1 { vec!["--threads".to_string(), a.bench_threads.to_string()] } else { vec![] })
        .output()
        .map_err(|e| format!("running redis-benchmark (apt-get install redis-tools): {e}"))?;
    if !out.status.success() {
        return Err(format!("redis-benchmark failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let cpu = cpu_time(pid)?.saturating_sub(cpu0);
    let bcpu = match (backup_pid, bcpu0) {
        (Some(b), Some(c0)) => Some(cpu_time(b)?.saturating_sub(c0)),
        _ => None,
    };
    let rss_mib = resident_mib(pid)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    let mut header: Vec<String> = Vec::new();
    for line in text.lines() {
        let cells: Vec<String> = line.split(',').map(|c| c.trim_matches('"').to_string()).collect();
        if cells.first().is_some_and(|c| c == "test") {
            header = cells;
            continue;
        }
        let col = |name: &str| -> Result<f64, String> {
            let i = header.iter().position(|h| h == name).ok_or(format!("no {name} column in {text}"))?;
            cells.get(i).and_then(|v| v.parse().ok()).ok_or(format!("bad {name} in {line}"))
        };
        rows.push(Row {
            server: server.into(),
            test: cells[0].clone(),
            pipeline,
            round,
            rps: col("rps")?,
            p50_ms: col("p50_latency_ms")?,
            p99_ms: col("p99_latency_ms")?,
            cpu_us_per_req: cpu.as_secs_f64() * 1e6 / a.requests as f64,
            backup_cpu_us_per_req: bcpu.map(|c| c.as_secs_f64() * 1e6 / a.requests as f64),
            rss_mib,
        });
    }
    match <[Row; 1]>::try_from(rows) {
        Ok([row]) => Ok(row),
        Err(_) => Err(format!("expected one {test} row from redis-benchmark, got: {text}").into()),
    }
}

/// The Redis programs this run starts, each found on `PATH` before any server starts: a
/// missing one is named with its package at once, rather than found as a wait that times
/// out (a missing redis-cli looked like a backup that never connected).
fn require_tools(a: &RedisBenchArgs) -> Result<(), String> {
    let mut tools = vec![("redis-benchmark", "redis-tools"), ("redis-cli", "redis-tools")];
    if !a.no_redis {
        tools.push(("redis-server", "redis-server"));
    }
    for (tool, package) in tools {
        if let Err(e) = Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
            return Err(format!(
                "ditto bench redis needs {tool}, which could not be run ({e}): install {package} \
                 (Debian: apt-get install {package}; .ci/deps installs every tool the tests use)"
            ));
        }
    }
    Ok(())
}

pub fn run(a: RedisBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    require_tools(&a)?;
    let scratch = ScratchDir::new(None, "redisbench")?;
    let mut rows = Vec::new();
    let mut servers: Vec<String> = a.durability.iter().map(|d| format!("ditto/{d}")).collect();
    if a.other_ditto.is_some() {
        servers.extend(a.durability.iter().map(|d| format!("other/{d}")));
    }
    // Each policy at each pair durability: `POLICY` (every-batch) or `POLICY@DURABILITY`.
    let replicated: Vec<String> = a
        .replicated
        .iter()
        .filter(|p| p.as_str() != "none")
        .flat_map(|p| {
            a.pair_durability.iter().map(move |d| match d.as_str() {
                "every-batch" => p.clone(),
                d => format!("{p}@{d}"),
            })
        })
        .collect();
    servers.extend(replicated.iter().map(|p| format!("ditto+backup/{p}")));
    if a.tls_cert_file.is_some() {
        servers.extend(replicated.iter().map(|p| format!("ditto+backup+tls/{p}")));
    }
    if a.other_ditto.is_some() {
        servers.extend(replicated.iter().map(|p| format!("other+backup/{p}")));
    }
    if !a.no_redis {
        servers.extend(a.redis_fsync.iter().map(|f| format!("redis/{f}")));
        if !replicated.is_empty() {
            servers.push(REDIS_REPLICA.to_string());
            if a.tls_cert_file.is_some() {
                servers.push(REDIS_REPLICA_TLS.to_string());
            }
        }
    }
    let mut running = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let dir: PathBuf = scratch.path.join(format!("s{i}"));
        std::fs::create_dir_all(&dir)?;
        let (kind, what) = server.split_once('/').expect("servers are named kind/what");
        running.push(match kind {
            "ditto" => start_ditto(None, &dir, what, &a)?,
            "other" => start_ditto(a.other_ditto.as_deref(), &dir, what, &a)?,
            "ditto+backup" => start_ditto_pair(None, &dir, what, &a, false)?,
            "ditto+backup+tls" => start_ditto_pair(None, &dir, what, &a, true)?,
            "other+backup" => start_ditto_pair(a.other_ditto.as_deref(), &dir, what, &a, false)?,
            "redis+replica" => start_redis_pair(&dir, what, None)?,
            "redis+replica+tls" => start_redis_pair(&dir, what, tls_files(&a))?,
            _ => start_redis(&dir, what, None, None)?.0,
        });
    }
    for round in 1..=a.rounds.max(1) {
        for &p in &a.pipeline {
            for i in round_order(servers.len(), round) {
                let (server, proc) = (&servers[i], &running[i]);
                eprintln!("round {round}: {server}: SET, GET with {} clients, pipeline {p} ...", a.clients);
                // SET first, so GET finds the keys.
                for test in ["set", "get"] {
                    rows.push(bench(proc, &a, test, p, server, round)?);
                }
            }
        }
    }
    drop(running);
    let summary = summarize(&rows);
    println!(
        "\n{:<32} {:>4} {:>3} {:>11} {:>21} {:>7} {:>7} {:>7} {:>9} {:>8} {:>9} {:>9}",
        "server",
        "test",
        "-P",
        "median rq/s",
        "range (rounds)",
        "p50 ms",
        "p99 ms",
        "CPU us",
        "backup us",
        "RSS MiB",
        "/everysec",
        "/always"
    );
    let show = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.2}x"));
    for s in &summary {
        let range = format!("{:.0}-{:.0} ({})", s.rps_min, s.rps_max, s.rounds);
        println!(
            "{:<32} {:>4} {:>3} {:>11.0} {:>21} {:>7.3} {:>7.3} {:>7.1} {:>9} {:>8.0} {:>9} {:>9}",
            s.server,
            s.test,
            s.pipeline,
            s.rps_median,
            range,
            s.p50_ms_median,
            s.p99_ms_median,
            s.cpu_us_per_req_median,
            s.backup_cpu_us_per_req_median.map_or("-".to_string(), |c| format!("{c:.1}")),
            s.rss_mib_max,
            show(s.vs_redis),
            show(s.vs_redis_always)
        );
    }
    println!(
        "\nMedians over the rounds (p50, p99 and CPU too); ratios are median to median. CPU us: the\n\
         server's CPU time per request (user + system, all its threads). RSS MiB: the server's\n\
         resident memory after the test, the largest over the rounds. backup us: the same for its\n\
         backup (ditto --replica-of) or replica (Redis replicaof) process.\n\
         ditto acknowledges a write once it is fsynced (every-batch: group commit, fsyncs back to back;\n\
         interval: group commit at most every {} ms). Redis with appendfsync everysec acknowledges\n\
         before its fsync; with always, after it. ditto+backup/POLICY: a primary and one backup process\n\
         (majority-received: the reply waits until the backup has the write in memory, no fsync on the\n\
         commit path); its /everysec ratio is to Redis everysec with one replica and no WAIT (the reply\n\
         waits for nothing); ditto+backup+tls/POLICY: the same with TLS between them (--tls-replication),\n\
         to Redis with TLS to its replica (tls-replication yes).\n\
         The servers and redis-benchmark share this machine's cores.",
        a.fsync_interval_ms.unwrap_or(ditto_server::config::Config::default().fsync_interval_ms)
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "redis",
                "clients": a.clients,
                "requests": a.requests,
                "keyspace": a.keyspace,
                "rounds": a.rounds,
                "workers": a.workers,
                "bench_threads": a.bench_threads,
                "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
                "summary": summary,
                "rows": rows,
            })
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_the_servers_order() {
        assert_eq!(round_order(3, 1), vec![0, 1, 2]);
        assert_eq!(round_order(3, 2), vec![2, 1, 0]);
        assert_eq!(round_order(3, 3), vec![0, 1, 2]);
        assert_eq!(round_order(0, 2), Vec::<usize>::new());
    }

    fn row(server: &str, round: u32, rps: f64) -> Row {
        let (p50_ms, cpu_us_per_req, rss_mib) = (rps / 1e4, rps / 10.0, 100.0 - rps);
        let test = "SET".into();
        let backup_cpu_us_per_req = None;
        Row {
            server: server.into(),
            test,
            pipeline: 1,
            round,
            rps,
            p50_ms,
            p99_ms: 1.0,
            cpu_us_per_req,
            backup_cpu_us_per_req,
            rss_mib,
        }
    }

    #[test]
    fn summaries_take_medians_and_ratios_of_medians() {
        let rows = vec![
            row("ditto/every-batch", 1, 10.0),
            row("redis/everysec", 1, 40.0),
            row("ditto/every-batch", 2, 30.0),
            row("redis/everysec", 2, 20.0),
            row("ditto/every-batch", 3, 20.0),
            row("redis/everysec", 3, 10.0),
            row("redis/always", 1, 5.0),
            row("redis/always", 2, 8.0),
        ];
        let s = summarize(&rows);
        assert_eq!(s.len(), 3);
        let d = &s[0];
        assert_eq!((d.rounds, d.rps_median, d.rps_min, d.rps_max), (3, 20.0, 10.0, 30.0));
        assert_eq!((d.p50_ms_median, d.cpu_us_per_req_median), (0.002, 2.0));
        assert_eq!(d.rss_mib_max, 90.0, "the largest over the rounds, not the median");
        assert_eq!(d.vs_redis, Some(1.0));
        assert_eq!(d.vs_redis_always, Some(20.0 / 6.5));
        assert_eq!(s[2].vs_redis, Some(6.5 / 20.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    /// This process's CPU time is read from /proc and grows as it works. (It spins until
    /// the reading shows 100 ms more, for at most 30 s: a busy machine gives a spin of
    /// 300 ms of wall time less than 100 ms of CPU, which failed this once in CI.)
    #[test]
    fn cpu_time_of_this_process_grows_with_work() {
        let me = std::process::id();
        let before = cpu_time(me).unwrap();
        let t = Instant::now();
        let mut x = 0u64;
        let mut used = Duration::ZERO;
        while used < Duration::from_millis(100) && t.elapsed() < Duration::from_secs(30) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            used = cpu_time(me).unwrap() - before;
        }
        assert!(used >= Duration::from_millis(100), "{:?} of spinning counted as {used:?}", t.elapsed());
        assert!(cpu_time(u32::MAX).is_err());
    }

    /// This process's resident memory is read from /proc and grows with what it touches.
    #[test]
    fn resident_memory_of_this_process_is_read() {
        let me = std::process::id();
        let before = resident_mib(me).unwrap();
        let touched = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = resident_mib(me).unwrap();
        assert!(after >= before + 32.0, "{before} MiB, then {after} MiB with 64 MiB touched");
        drop(touched);
        assert!(resident_mib(u32::MAX).is_err());
    }
}
