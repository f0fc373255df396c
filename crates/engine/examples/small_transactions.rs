//! The engine's fixed cost per transaction: one worker, no log, transactions of one read
//! (a GET), of a read and a write of the same key (a SET's type check and write), and a
//! read-only snapshot transaction of one read (a backup's GET). Prints ns per
//! transaction, and JSON with `--json`. Rounds alternate the kinds so a noisy machine
//! slows all of them alike; the median round is printed.
//!
//! `cargo run --release -p ditto-engine --example small_transactions [-- --json]`

use ditto_engine::{Database, Options, WorkerId};

const KEYS: u32 = 100_000;
const PER_ROUND: u32 = 1_000_000;
const ROUNDS: usize = 5;

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();
    for i in 0..KEYS {
        let _ = w.run(|x| x.put(t, &i.to_be_bytes(), b"value")).unwrap();
    }
    let key = |i: u32| (i.wrapping_mul(2_654_435_761) % KEYS).to_be_bytes();
    let mut get = Vec::new();
    let mut set = Vec::new();
    let mut snap = Vec::new();
    for _ in 0..ROUNDS {
        let t0 = std::time::Instant::now();
        for i in 0..PER_ROUND {
            let v = w.run(|x| x.get(t, &key(i))).unwrap().0;
            assert!(v.is_some());
        }
        get.push(t0.elapsed().as_nanos() as f64 / f64::from(PER_ROUND));
        let t0 = std::time::Instant::now();
        for i in 0..PER_ROUND {
            let _ = w
                .run(|x| {
                    let k = key(i);
                    x.get(t, &k)?;
                    x.put(t, &k, b"value")
                })
                .unwrap();
        }
        set.push(t0.elapsed().as_nanos() as f64 / f64::from(PER_ROUND));
        let t0 = std::time::Instant::now();
        for i in 0..PER_ROUND {
            let mut s = w.begin_snapshot();
            assert!(s.get(t, &key(i)).unwrap().is_some());
            drop(s);
        }
        snap.push(t0.elapsed().as_nanos() as f64 / f64::from(PER_ROUND));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (g, s, r) = (median(&mut get), median(&mut set), median(&mut snap));
    if json {
        println!("{{\"get_ns\":{g:.1},\"get_put_ns\":{s:.1},\"snapshot_get_ns\":{r:.1}}}");
    } else {
        println!("one get: {g:.1} ns; a get and a put: {s:.1} ns; a snapshot's get: {r:.1} ns (median of {ROUNDS} rounds of {PER_ROUND})");
    }
}
