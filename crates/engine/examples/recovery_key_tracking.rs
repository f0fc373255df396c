//! What recovery's key tracking costs (`Database::recovery_log_begins`, which a backup's
//! restart or promotion turns on for its replica log: a record id may have two lives in
//! it, and each record must take the key of its newest keyed write). The same writes are
//! installed into a fresh database with tracking off and on, alternating, and the index
//! then built (`recovery_finish`): a keyed write per record (an insert) and, for half of
//! them, a second keyed write later (a reinsert over a tombstone) and an update. Prints
//! ns per write for each, their ratio, and JSON with `--json`. Records are written in a
//! scattered order, as commits touch them.
//!
//! `cargo run --release -p ditto-engine --example recovery_key_tracking [-- --json]`

use ditto_engine::{Bytes, Database, Options, RecordId, Ts};

const RECORDS: u64 = 1 << 20;
const ROUNDS: usize = 3;

/// Installs the writes (newest first, as recovery's replay goes) and builds the index;
/// (install ns per write, finish ms).
fn run(tracking: bool) -> (f64, f64) {
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    if tracking {
        db.recovery_log_begins();
    }
    let key = |rid: u64, life: u64| Bytes::from(format!("key:{rid:012}:{life}"));
    let mut writes = 0u64;
    let t0 = std::time::Instant::now();
    for i in 0..RECORDS {
        // Records in a scattered order (an odd multiplier permutes 0..2^20), as commits
        // touch them.
        let rid = i.wrapping_mul(0x9E37_79B1) & (RECORDS - 1);
        let rec = RecordId(rid);
        let ts = 2 * RECORDS + i + 1;
        if rid.is_multiple_of(2) {
            // A later life: an update above it, then its keyed write, then the first life.
            db.recovery_install(t, rec, None::<fn() -> Bytes>, Ts(ts + 4 * RECORDS), Some(b"updated")).unwrap();
            db.recovery_install(t, rec, Some(|| key(rid, 1)), Ts(ts + 2 * RECORDS), Some(b"second")).unwrap();
            writes += 2;
        }
        db.recovery_install(t, rec, Some(|| key(rid, 0)), Ts(ts), Some(b"first")).unwrap();
        writes += 1;
    }
    let install = t0.elapsed().as_nanos() as f64 / writes as f64;
    let t1 = std::time::Instant::now();
    let keys = db.recovery_finish(Ts(7 * RECORDS), 2).unwrap();
    assert_eq!(keys, RECORDS, "one key per record");
    (install, t1.elapsed().as_secs_f64() * 1e3)
}

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        off.push(run(false));
        on.push(run(true));
    }
    let median = |v: &mut Vec<(f64, f64)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    };
    let ((off_ns, off_ms), (on_ns, on_ms)) = (median(&mut off), median(&mut on));
    if json {
        println!(
            "{{\"install_ns_off\":{off_ns:.1},\"install_ns_on\":{on_ns:.1},\"ratio\":{:.3},\"finish_ms_off\":{off_ms:.1},\"finish_ms_on\":{on_ms:.1}}}",
            on_ns / off_ns
        );
    } else {
        println!(
            "{RECORDS} records, 2.5 writes each: install {off_ns:.1} ns per write untracked, {on_ns:.1} tracked ({:.2}x); index built in {off_ms:.0} / {on_ms:.0} ms (median of {ROUNDS})",
            on_ns / off_ns
        );
    }
}
