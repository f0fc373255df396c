//! `Database::replay_prefetch` is a hint (crates/engine/src/replay.rs): it must never
//! allocate a record chunk, fail, or change what is read, whatever ids it is given. Its own
//! binary, with the counting allocator, so that nothing else allocates beside it.

use ditto_engine::alloc::{allocated_bytes, Counting};
use ditto_engine::{Database, Options, Prefetch, RecordId, TableId, Ts, RECORDS_PER_TABLE_MAX};

#[global_allocator]
static ALLOC: Counting<std::alloc::System> = Counting::new(std::alloc::System);

#[test]
fn prefetching_allocates_nothing_fails_on_nothing_and_changes_nothing() {
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    db.replay_install(t, RecordId(5), Some(b"k"), Ts(2), Some(b"v2")).unwrap();
    db.replay_install(t, RecordId(5), None, Ts(4), Some(b"v4")).unwrap();
    db.publish_read_view(Ts(4)).unwrap();

    let targets = [
        (t, RecordId(5)),                     // a record with versions
        (t, RecordId(6)),                     // allocated, never written
        (t, RecordId(1 << 20)),               // in a chunk never allocated
        (t, RecordId(RECORDS_PER_TABLE_MAX)), // past the limit
        (t, RecordId(u64::MAX)),              // far past it
        (TableId(t.0 + 7), RecordId(5)),      // no such table
    ];
    // The prefetches run under a snapshot held below the view (two horizons: `Prefetch::BelowHead` reads
    // the newest version's header there).
    db.replay_install(t, RecordId(5), None, Ts(6), Some(b"v6")).unwrap();
    let held = db.read();
    db.replay_install(t, RecordId(5), None, Ts(8), Some(b"v8")).unwrap();
    db.replay_install(t, RecordId(5), None, Ts(10), Some(b"v10")).unwrap();
    db.publish_read_view(Ts(10)).unwrap();
    // Warm up thread-locals (the epoch's handle) so only the prefetches are measured.
    db.replay_prefetch(t, RecordId(5), Prefetch::Head);
    let before = allocated_bytes();
    for _ in 0..10_000 {
        for (table, rid) in targets {
            db.replay_prefetch(table, rid, Prefetch::Record);
            db.replay_prefetch(table, rid, Prefetch::Head);
            db.replay_prefetch(table, rid, Prefetch::BelowHead);
        }
    }
    assert_eq!(held.get(t, b"k").unwrap().as_deref(), Some(&b"v4"[..]), "the held snapshot reads as before");
    drop(held);
    let grown = allocated_bytes() as i64 - before as i64;
    // A record chunk is 64 Ki records; the counter flushes per thread every 256 KiB.
    assert!(grown.abs() < 256 << 10, "prefetching allocated {grown} bytes");

    assert_eq!(db.record_ids_allocated(t).unwrap(), 6, "no record id was taken");
    let r = db.read();
    assert_eq!(r.get(t, b"k").unwrap().as_deref(), Some(&b"v10"[..]));
    assert_eq!(db.count(t).unwrap(), 1);
}
