//! Release-mode measurements at the spec's sizes (ignored by default):
//! `cargo test -p ditto-bench --release --test perf -- --ignored --nocapture`
//! DITTO_PERF_WORKERS (default 1) and DITTO_PERF_SECS (default 5) adjust the run.

use std::time::{Duration, Instant};

use ditto_bench::harness::{Probe, RunConfig};
use ditto_bench::{tpcc, ycsb};
use ditto_engine::{Database, Options};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run_config() -> RunConfig {
    let workers = env("DITTO_PERF_WORKERS", 1) as usize;
    RunConfig { workers, duration: Duration::from_secs(env("DITTO_PERF_SECS", 5)), seed: 1, progress: false }
}

#[test]
#[ignore]
fn tpcc_full_size() {
    let cfg = run_config();
    let db = Database::new(Options { workers: cfg.workers });
    let t0 = Instant::now();
    let t = tpcc::load(&db, &tpcc::TpccConfig::new(cfg.workers as u32), false).expect("load");
    println!("tpcc load: {:.2} s", t0.elapsed().as_secs_f64());
    let rep = tpcc::run(&db, &t, &cfg, &Probe::NONE).expect("run");
    rep.print();
    let t0 = Instant::now();
    tpcc::check_consistency(&db, &t).expect("consistent");
    println!("consistency check: {:.2} s", t0.elapsed().as_secs_f64());
}

#[test]
#[ignore]
fn ycsb_full_size() {
    let cfg = run_config();
    for theta in [None, Some(0.99)] {
        let db = Database::new(Options { workers: cfg.workers });
        let t0 = Instant::now();
        let y = ycsb::load(&db, &ycsb::YcsbConfig { zipf_theta: theta, ..Default::default() }, false).expect("load");
        println!("ycsb load: {:.2} s", t0.elapsed().as_secs_f64());
        let rep = ycsb::run(&db, &y, &cfg, &Probe::NONE).expect("run");
        rep.print();
        ycsb::check(&db, &y).expect("rows");
    }
}
