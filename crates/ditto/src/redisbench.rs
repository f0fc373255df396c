//! `ditto bench redis`: redis-benchmark against `ditto server` and against a real Redis
//! (`redis-server --appendonly yes --appendfsync everysec`) on this machine, in the same
//! run, and their ratios.
//!
//! Every server is started first; then each round runs each pipeline depth against each
//! server in turn, so the servers are measured minutes apart at most, interleaved. The
//! table shows each configuration's median over the rounds (ratios are median to median)
//! and the range: on a shared VM a burst of CPU steal can halve one measurement, and
//! interleaving spreads such bursts over all servers instead of landing on one.
//!
//! The two are not equally durable: Redis with `everysec` acknowledges a write before it
//! is fsynced (up to a second of acknowledged writes can be lost), ditto acknowledges it
//! only once fsynced. The table says so next to the figures.

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
    /// ditto durabilities to run (comma-separated): every-batch, interval, nosync.
    #[arg(long, value_delimiter = ',', default_value = "every-batch,interval")]
    durability: Vec<String>,
    /// ditto server workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Rounds; each runs every server once per pipeline depth, interleaved.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Skip the Redis baseline.
    #[arg(long)]
    no_redis: bool,
    /// End with one JSON object holding every figure.
    #[arg(long)]
    json: bool,
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
    /// Median throughput over Redis's median for the same test (absent without Redis).
    vs_redis: Option<f64>,
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
            vs_redis: None,
        });
    }
    let base: Vec<(String, u32, f64)> = out
        .iter()
        .filter(|s| s.server.starts_with("redis/"))
        .map(|s| (s.test.clone(), s.pipeline, s.rps_median))
        .collect();
    for s in &mut out {
        s.vs_redis = base.iter().find(|b| b.0 == s.test && b.1 == s.pipeline).map(|b| s.rps_median / b.2);
    }
    out
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

fn start_ditto(dir: &Path, durability: &str, workers: usize) -> Result<ServerProcess, Box<dyn std::error::Error>> {
    let args = ["--durability", durability, "--workers", &workers.to_string()];
    Ok(start_ditto_server(dir, &args, Stdio::inherit()).map_err(|e| e.to_string())?)
}

fn start_redis(dir: &Path) -> Result<ServerProcess, Box<dyn std::error::Error>> {
    let port = free_port()?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir", dir.to_str().ok_or("dir")?])
        .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting redis-server (apt-get install redis-server): {e}"))?;
    let p = ServerProcess { child, port };
    wait_ping(port)?;
    Ok(p)
}

/// Runs redis-benchmark SET and GET and parses its CSV.
fn bench(
    port: u16,
    a: &RedisBenchArgs,
    pipeline: u32,
    server: &str,
    round: u32,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-t", "set,get", "--csv"])
        .args(["-n", &a.requests.to_string(), "-c", &a.clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-r", &a.keyspace.to_string()])
        .output()
        .map_err(|e| format!("running redis-benchmark (apt-get install redis-tools): {e}"))?;
    if !out.status.success() {
        return Err(format!("redis-benchmark failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
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
        });
    }
    if rows.len() != 2 {
        return Err(format!("expected SET and GET rows from redis-benchmark, got: {text}").into());
    }
    Ok(rows)
}

pub fn run(a: RedisBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let scratch = ScratchDir::new(None, "redisbench")?;
    let mut rows = Vec::new();
    let mut servers: Vec<String> = a.durability.iter().map(|d| format!("ditto/{d}")).collect();
    if !a.no_redis {
        servers.push("redis/everysec".into());
    }
    let mut running = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let dir: PathBuf = scratch.path.join(format!("s{i}"));
        std::fs::create_dir_all(&dir)?;
        running.push(match server.strip_prefix("ditto/") {
            Some(d) => start_ditto(&dir, d, a.workers)?,
            None => start_redis(&dir)?,
        });
    }
    for round in 1..=a.rounds.max(1) {
        for &p in &a.pipeline {
            for (server, proc) in servers.iter().zip(&running) {
                eprintln!("round {round}: {server}: SET, GET with {} clients, pipeline {p} ...", a.clients);
                rows.extend(bench(proc.port, &a, p, server, round)?);
            }
        }
    }
    drop(running);
    let summary = summarize(&rows);
    println!(
        "\n{:<20} {:>4} {:>3} {:>11} {:>21} {:>8} {:>8} {:>9}",
        "server", "test", "-P", "median rq/s", "range (rounds)", "p50 ms", "p99 ms", "vs redis"
    );
    for s in &summary {
        let ratio = s.vs_redis.map_or("-".to_string(), |r| format!("{r:.2}x"));
        let range = format!("{:.0}-{:.0} ({})", s.rps_min, s.rps_max, s.rounds);
        println!(
            "{:<20} {:>4} {:>3} {:>11.0} {:>21} {:>8.3} {:>8.3} {:>9}",
            s.server, s.test, s.pipeline, s.rps_median, range, s.p50_ms_median, s.p99_ms_median, ratio
        );
    }
    println!(
        "\nMedians over the rounds (p50 and p99 too); ratios are median to median.\n\
         ditto acknowledges a write once it is fsynced (every-batch: group commit, fsyncs back to back;\n\
         interval: group commit every 10 ms); Redis with appendfsync everysec acknowledges before its\n\
         fsync. Both servers and redis-benchmark share this machine's cores."
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

    fn row(server: &str, round: u32, rps: f64) -> Row {
        Row { server: server.into(), test: "SET".into(), pipeline: 1, round, rps, p50_ms: rps / 1e4, p99_ms: 1.0 }
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
        ];
        let s = summarize(&rows);
        assert_eq!(s.len(), 2);
        let d = &s[0];
        assert_eq!((d.rounds, d.rps_median, d.rps_min, d.rps_max), (3, 20.0, 10.0, 30.0));
        assert_eq!(d.vs_redis, Some(1.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
