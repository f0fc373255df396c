//! Deletes while a snapshot holds the GC horizon back (a checkpoint's does for its whole
//! write): each commit's look for deletes due to unlink must not read every delete queued
//! since (`DeletedList`, crates/engine/src/db.rs). Prints the cost per delete for growing
//! counts: flat means linear, growing means quadratic.
//!
//! `cargo run --release -p ditto-engine --example deletes_under_snapshot`
//! (2026-12-03, 2-core VM: before the change 1.10 us per delete at 200k and 3.69 at 1M;
//! after, 0.63 and 0.58.)

use ditto_engine::{Database, Options, WorkerId};

fn main() {
    for n in [200_000u32, 1_000_000] {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        for i in 0..n {
            let _ = w.run(|x| x.insert(t, &i.to_be_bytes(), b"v")).unwrap();
        }
        let snap = db.read();
        let t0 = std::time::Instant::now();
        for i in 0..n {
            let _ = w.run(|x| x.delete(t, &i.to_be_bytes())).unwrap();
        }
        let el = t0.elapsed();
        drop(snap);
        println!(
            "{n} deletes under a held snapshot: {:.3} s, {:.2} us per delete",
            el.as_secs_f64(),
            el.as_secs_f64() * 1e6 / f64::from(n)
        );
    }
}
