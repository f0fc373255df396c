//! YCSB++ on 10k keys, uniform and zipfian, with and without a (mock) log.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ditto_bench::harness::{Probe, RunConfig};
use ditto_bench::ycsb::{self, YcsbConfig, Zipfian};
use ditto_engine::{CommitLog, Database, LoggedWrite, Options, Result, TableId, Ts, WorkerId};

fn small(theta: Option<f64>) -> YcsbConfig {
    YcsbConfig { keys: 10_000, zipf_theta: theta, ..YcsbConfig::default() }
}

fn run_small(theta: Option<f64>) {
    let db = Database::new(Options { workers: 2 });
    let y = ycsb::load(&db, &small(theta), false).expect("load");
    assert_eq!(ycsb::check(&db, &y).expect("rows"), 10_000);
    let cfg = RunConfig { workers: 2, duration: Duration::from_secs(1), seed: 11, progress: false };
    let rep = ycsb::run(&db, &y, &cfg, &Probe::NONE).expect("run");
    println!("{}", rep.to_text());
    assert!(rep.committed > 0);
    for ty in &rep.per_type {
        assert!(ty.committed > 0, "no {} committed", ty.name);
    }
    assert_eq!(rep.user_aborts, 0);
    assert_eq!(ycsb::check(&db, &y).expect("rows"), 10_000);
    let reopened = ycsb::open(&db, &YcsbConfig::default()).expect("open");
    assert_eq!(reopened.config.keys, 10_000);
}

#[test]
fn uniform() {
    run_small(None);
}

#[test]
fn zipfian() {
    run_small(Some(0.99));
}

#[test]
fn zipfian_is_skewed() {
    let z = Zipfian::new(10_000, 0.99);
    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
    let mut counts = vec![0u32; 10_000];
    for _ in 0..100_000 {
        let r = z.next_rank(&mut rng);
        assert!(r < 10_000);
        counts[r as usize] += 1;
    }
    // Rank 0 gets about 1 / zeta(10000, 0.99) ~ 10% of the draws; rank 1 about half that.
    assert!(counts[0] > 7_000 && counts[0] < 13_000, "rank 0: {}", counts[0]);
    assert!(counts[1] > 3_000 && counts[1] < 7_000, "rank 1: {}", counts[1]);
    assert!(counts[0] > counts[10] * 5);
    let k = z.next_scrambled(&mut rng);
    assert!(k < 10_000);
}

/// A log that only counts bytes and makes commits durable a little later, from a thread.
#[derive(Default)]
struct MockLog {
    appended: AtomicU64,
    durable: AtomicU64,
    bytes: AtomicU64,
    stop: AtomicBool,
}

impl CommitLog for MockLog {
    fn check_writable(&self) -> Result<()> {
        Ok(())
    }
    fn append(&self, _w: WorkerId, ts: Ts, writes: &mut dyn ExactSizeIterator<Item = LoggedWrite<'_>>) {
        let n: usize = writes.map(|w| 16 + w.key.map_or(0, |k| k.len()) + w.value.map_or(0, |v| v.len())).sum();
        self.bytes.fetch_add(n as u64 + 16, Ordering::Relaxed);
        self.appended.fetch_max(ts.0, Ordering::SeqCst);
    }
    fn wait_durable(&self, ts: Ts) -> Result<()> {
        while self.durable.load(Ordering::SeqCst) < ts.0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(())
    }
    fn is_durable(&self, ts: Ts) -> Result<bool> {
        Ok(self.durable.load(Ordering::SeqCst) >= ts.0)
    }
    fn table_created(&self, _id: TableId, _name: &str) -> Result<()> {
        Ok(())
    }
}

#[test]
fn with_a_log_latency_and_bytes_are_measured() {
    let db = Database::new(Options { workers: 2 });
    let log = Arc::new(MockLog::default());
    db.attach_log(log.clone());
    std::thread::scope(|s| {
        s.spawn(|| {
            while !log.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
                log.durable.store(log.appended.load(Ordering::SeqCst), Ordering::SeqCst);
            }
        });
        let y = ycsb::load(&db, &small(None), false).expect("load");
        let bytes = || log.bytes.load(Ordering::Relaxed);
        let cfg = RunConfig { workers: 2, duration: Duration::from_millis(500), seed: 5, progress: false };
        let rep = ycsb::run(&db, &y, &cfg, &Probe { log_bytes: &bytes, ..Probe::NONE }).expect("run");
        log.stop.store(true, Ordering::Relaxed);
        println!("{}", rep.to_text());
        assert!(rep.committed > 0);
        assert!(rep.log_bytes > 0 && rep.log_bytes_per_txn > 0.0);
        // Read-write commits wait for the mock's ~2 ms durability.
        assert!(rep.per_type[1].latency_us_p50 >= 200, "{rep:?}");
        assert!(rep.cpu_s_per_txn > 0.0);
        assert_eq!(ycsb::check(&db, &y).expect("rows"), 10_000);
    });
}
