//! Versions a backup's replay trims are freed: replayed batches, each under its
//! `ReplayPin` as a replay thread holds one, leave a few versions per record in memory,
//! not every one written. The counting allocator is this binary's global allocator; one
//! test, so nothing else allocates beside it.

use ditto_engine::alloc::{allocated_bytes, Counting};
use ditto_engine::{Database, Options, RecordId, Ts};

#[global_allocator]
static ALLOC: Counting<std::alloc::System> = Counting::new(std::alloc::System);

#[test]
fn versions_trimmed_under_replay_pins_are_freed() {
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    let keys = 64u64;
    let value = vec![7u8; 1024];
    let base = allocated_bytes() as i64;
    let mut ts = 0u64;
    // 256 batches of 1,000 writes over 64 keys (a quarter of a GiB written in all), each
    // under its own pin, with the read view moved to the batch's last write after it. A
    // snapshot is held over the middle half (as the backup's own checkpoint holds one):
    // then the versions between it and the view go (`record::free_piece`), the rest at once
    // otherwise (`free_chain`).
    let mut held = None;
    for batch in 0..256 {
        match batch {
            64 => held = Some(db.read()),
            192 => drop(held.take()),
            _ => {}
        }
        {
            let _pin = db.replay_pin();
            for _ in 0..1000 {
                ts += 1;
                let rid = RecordId(ts % keys);
                let key = (ts % keys).to_be_bytes();
                let first = ts <= keys;
                db.replay_install(t, rid, first.then_some(&key[..]), Ts(ts), Some(&value)).unwrap();
            }
        }
        db.publish_read_view(Ts(ts)).unwrap();
    }
    // Let the epoch GC run what was deferred (each pin may advance it and collect).
    for _ in 0..1000 {
        crossbeam_epoch::pin().flush();
    }
    let kept = allocated_bytes() as i64 - base;
    // 64 records with a few versions each, the index and the tables: a few MiB, not the
    // 256 MiB written (the counter is exact to within 256 KiB per running thread).
    assert!(kept < 16 << 20, "{} MiB still allocated after 256 MiB of replayed versions", kept >> 20);
    let r = db.read();
    assert_eq!(r.get(t, &5u64.to_be_bytes()).unwrap().as_deref(), Some(&value[..]));
}
