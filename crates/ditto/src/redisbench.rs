//! `ditto bench redis`: redis-benchmark against `ditto server` and against a real Redis
//! (`redis-server --appendonly yes --appendfsync everysec`) on this machine, in the same
//! run, one after the other, and their ratios.
//!
//! The two are not equally durable: Redis with `everysec` acknowledges a write before it
//! is fsynced (up to a second of acknowledged writes can be lost), ditto acknowledges it
//! only once fsynced. The table says so next to the figures.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

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
    /// Skip the Redis baseline.
    #[arg(long)]
    no_redis: bool,
    /// End with one JSON object holding every figure.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize, Clone)]
struct Row {
    server: String,
    test: String,
    pipeline: u32,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

fn start_ditto(dir: &Path, durability: &str, workers: usize) -> Result<(Proc, u16), Box<dyn std::error::Error>> {
    let port = free_port()?;
    let child = Command::new(std::env::current_exe()?)
        .args(["server", "--port", &port.to_string(), "--data-dir", dir.to_str().ok_or("data dir path")?])
        .args(["--durability", durability, "--workers", &workers.to_string(), "--metrics", "off"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let p = Proc(child);
    wait_ping(port)?;
    Ok((p, port))
}

fn start_redis(dir: &Path) -> Result<(Proc, u16), Box<dyn std::error::Error>> {
    let port = free_port()?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--dir", dir.to_str().ok_or("dir")?])
        .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting redis-server (apt-get install redis-server): {e}"))?;
    let p = Proc(child);
    wait_ping(port)?;
    Ok((p, port))
}

/// Runs redis-benchmark SET and GET and parses its CSV.
fn bench(port: u16, a: &RedisBenchArgs, pipeline: u32, server: &str) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
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
    for (i, server) in servers.iter().enumerate() {
        let dir: PathBuf = scratch.path.join(format!("s{i}"));
        std::fs::create_dir_all(&dir)?;
        let (_proc, port) = match server.strip_prefix("ditto/") {
            Some(d) => start_ditto(&dir, d, a.workers)?,
            None => start_redis(&dir)?,
        };
        for &p in &a.pipeline {
            eprintln!("{server}: SET, GET with {} clients, pipeline {p} ...", a.clients);
            rows.extend(bench(port, &a, p, server)?);
        }
    }
    println!(
        "\n{:<22} {:>4} {:>3} {:>12} {:>9} {:>9} {:>10}",
        "server", "test", "-P", "requests/s", "p50 ms", "p99 ms", "vs redis"
    );
    for r in &rows {
        let base = rows.iter().find(|b| b.server.starts_with("redis/") && b.test == r.test && b.pipeline == r.pipeline);
        let ratio = base.map_or("-".to_string(), |b| format!("{:.2}x", r.rps / b.rps));
        println!(
            "{:<22} {:>4} {:>3} {:>12.0} {:>9.3} {:>9.3} {:>10}",
            r.server, r.test, r.pipeline, r.rps, r.p50_ms, r.p99_ms, ratio
        );
    }
    println!(
        "\nditto acknowledges a write once it is fsynced (every-batch: group commit, fsyncs back to back;\n\
         interval: group commit every 10 ms); Redis with appendfsync everysec acknowledges before its\n\
         fsync. Both servers and redis-benchmark share this machine's cores."
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "bench": "redis", "clients": a.clients, "requests": a.requests, "keyspace": a.keyspace, "rows": rows })
        );
    }
    Ok(())
}
