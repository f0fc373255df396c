//! Deleted values are freed: by `Database::reclaim` at once, and by the workers' own
//! periodic unlinking and collection under further commits. Before the unlink freed the
//! versions under a tombstone, a deleted value stayed allocated for good whenever the
//! delete's own install could not trim it (its horizon was older than the value).
//! Memory is counted by the engine's counting allocator (to within 256 KiB per thread).

use ditto_engine::alloc::{allocated_bytes, Counting};
use ditto_engine::{Database, Options, WorkerId};

#[global_allocator]
static A: Counting<std::alloc::System> = Counting::new(std::alloc::System);

const MIB: i64 = 1 << 20;

fn mib_now() -> i64 {
    allocated_bytes() as i64 / MIB
}

#[test]
fn deleted_values_are_freed_by_reclaim_and_by_later_commits() {
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();
    let value = vec![7u8; MIB as usize];
    let mut round = |prefix: u8| {
        for i in 0..64u8 {
            w.run(|x| x.insert(t, &[prefix, i], &value)).unwrap().1.wait().unwrap();
        }
        let full = mib_now();
        for i in 0..64u8 {
            w.run(|x| x.delete(t, &[prefix, i])).unwrap().1.wait().unwrap();
        }
        (full, w.run(|x| x.get(t, &[prefix, 0]).map(|v| v.is_none())).unwrap().0)
    };

    let base = mib_now();
    let (full, gone) = round(1);
    assert!(gone && full >= base + 64, "64 MiB inserted: {base} -> {full} MiB");
    db.reclaim();
    let after = mib_now();
    assert!(after <= base + 4, "deleted 64 MiB, reclaimed: {after} MiB allocated, {base} before inserting");

    // Without reclaim: the worker unlinks every 128 commits and collects every 128 installs.
    let (full, _) = round(2);
    assert!(full >= after + 64);
    for i in 0..300u32 {
        w.run(|x| x.put(t, &[3, (i % 4) as u8], b"small")).unwrap().1.wait().unwrap();
    }
    let later = mib_now();
    assert!(later <= after + 4, "deleted 64 MiB, 300 commits later: {later} MiB allocated, {after} before");
    assert_eq!(db.count(t).unwrap(), 4);
}
