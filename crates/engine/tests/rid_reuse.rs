//! Record ids of deleted keys are reused (crates/engine/src/table.rs): a workload that keeps
//! making new keys and deleting them stays within the ids it needs at once, and reuse never
//! lets one key see another's record: under concurrent churn, readers and snapshot scans,
//! every value read is the one its key was written with.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Database, Direction, Options, WorkerId};

#[test]
fn churned_keys_reuse_record_ids() {
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();
    for round in 0..50u32 {
        for i in 0..1000u32 {
            let k = format!("r{round:03}-{i:04}");
            w.run(|x| x.insert(t, k.as_bytes(), k.as_bytes())).unwrap().1.wait().unwrap();
        }
        for i in 0..1000u32 {
            let k = format!("r{round:03}-{i:04}");
            assert!(w.run(|x| x.delete(t, k.as_bytes())).unwrap().0);
        }
        // Ids come back through the epoch GC, which the other test's threads (in this
        // process) can hold back for a while on a loaded machine: wait for them (bounded),
        // so that what is measured is reuse, not how soon the GC ran.
        let deadline = Instant::now() + Duration::from_secs(10);
        db.reclaim();
        while db.record_ids_used(t).unwrap() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            db.reclaim();
        }
    }
    // Without reuse the table would have handed out 50,000 ids; with it, each round takes
    // the ids the last one gave back (about 1,000 in all; the CI run that failed the older
    // form of this test, which did not wait for the GC, was at 13,000 in use).
    let allocated = db.record_ids_allocated(t).unwrap();
    assert!(allocated <= 5_000, "50,000 keys made and deleted 1,000 at a time took {allocated} record ids");
    assert_eq!(db.record_ids_used(t).unwrap(), 0, "every id is back once the GC has run");
    // The ids are whole again for new keys.
    for i in 0..2000u32 {
        let k = format!("final-{i:04}");
        w.run(|x| x.insert(t, k.as_bytes(), k.as_bytes())).unwrap().1.wait().unwrap();
    }
    assert_eq!(db.count(t).unwrap(), 2000);
    let all = db.read().scan(t, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, Direction::Forward, 0).unwrap();
    assert_eq!(all.len(), 2000);
    assert!(all.iter().all(|(k, v)| k == v), "a key with another key's value");
}

/// Two workers insert, overwrite and delete keys of a small key space at random, while a
/// reader runs snapshot scans and `reclaim` runs on its own thread, so record ids go round
/// fast. Every value is its key plus a counter: a reader that ever got a value of another
/// key, through a reused record, fails.
#[test]
fn reuse_under_concurrent_churn_never_mixes_keys() {
    let db = Database::new(Options { workers: 2 });
    let t = db.create_table("t").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Puts of absent keys: each needs a record, new or reused.
    let created = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(3);
    let check = |k: &[u8], v: &[u8]| {
        assert!(v.len() == k.len() + 8 && &v[..k.len()] == k, "key {k:?} read value {v:?}");
    };
    std::thread::scope(|s| {
        for wid in 0..2u32 {
            let (db, created) = (&db, &created);
            s.spawn(move || {
                let mut w = db.worker(WorkerId(wid)).unwrap();
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(wid);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let k = format!("k{:03}", rng % 300).into_bytes();
                    n += 1;
                    let mut v = k.clone();
                    v.extend_from_slice(&n.to_le_bytes());
                    let r = w.run(|x| {
                        let old = x.get(t, &k)?;
                        if let Some(old) = &old {
                            check(&k, old);
                        }
                        match (rng >> 40) % 3 {
                            0 => x.delete(t, &k).map(|_| false),
                            _ => x.put(t, &k, &v).map(|_| old.is_none()),
                        }
                    });
                    let (made, ticket) = r.unwrap();
                    ticket.wait().unwrap();
                    if made {
                        created.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        let (db2, stop2) = (&db, Arc::clone(&stop));
        s.spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                db2.reclaim();
                std::thread::yield_now();
            }
        });
        let (db3, stop3) = (&db, Arc::clone(&stop));
        s.spawn(move || {
            let mut scans = 0u64;
            while !stop3.load(Ordering::Relaxed) {
                let rows = db3
                    .read()
                    .scan(t, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, Direction::Forward, 0)
                    .unwrap();
                for (k, v) in &rows {
                    check(k, v);
                }
                scans += 1;
            }
            assert!(scans > 0);
        });
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
    });
    db.reclaim();
    let live = db.count(t).unwrap();
    assert!(live <= 300);
    let used = db.record_ids_used(t).unwrap();
    let created = created.load(Ordering::Relaxed);
    assert!(used <= 300 + 2000, "{live} live keys hold {used} record ids after the churn");
    assert!(created > 10 * used, "only {created} keys made: too few to have reused ids");
}

/// A backup's engine (the hazard behind `Database::forget_reusable_rids`): the directory's
/// open gives back the ids of records absent then (`recovery_finish`), and replay then
/// installs the primary's records at the primary's ids, some of them among those. If that
/// engine were promoted and reused such an id, a new key would take a record that holds
/// another key's value. Forgetting the list at the promotion makes new keys take fresh ids.
#[test]
fn a_replayed_record_at_an_id_given_back_is_never_reused_after_a_promotion() {
    use ditto_engine::{RecordId, Ts};
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    // The state the backup opened with: ids 0 and 2 hold keys, id 1 is absent (an insert
    // in flight when the primary's checkpoint was written).
    db.recovery_install(t, RecordId(0), Some(|| bytes::Bytes::from_static(b"a")), Ts(1), Some(&b"va"[..])).unwrap();
    db.recovery_install(t, RecordId(2), Some(|| bytes::Bytes::from_static(b"c")), Ts(2), Some(&b"vc"[..])).unwrap();
    db.recovery_finish(Ts(2), 1).unwrap();
    db.publish_read_view(Ts(2)).unwrap();
    // Replay then brings that insert: key b at id 1.
    db.replay_install(t, RecordId(1), Some(b"b"), Ts(3), Some(b"vb")).unwrap();
    db.publish_read_view(Ts(3)).unwrap();
    assert!(db.record_ids_used(t).unwrap() < 3, "the hazard: id 1 is still listed for reuse");
    // The promotion: nothing listed before is reused.
    db.forget_reusable_rids();
    let mut w = db.worker(WorkerId(0)).unwrap();
    w.run(|x| x.insert(t, b"d", b"vd")).unwrap().1.wait().unwrap();
    let r = db.read();
    for (k, v) in [(&b"a"[..], &b"va"[..]), (b"b", b"vb"), (b"c", b"vc"), (b"d", b"vd")] {
        assert_eq!(r.get(t, k).unwrap().as_deref(), Some(v), "key {:?}", String::from_utf8_lossy(k));
    }
}

/// A backup's engine keeps no ids for reuse: record ids are the primary's, and the
/// cleanup of replayed deletes gave each back to a list nothing took from (it grew by an
/// entry per delete for the backup's life; `record_ids_used` then read 0).
#[test]
fn a_backups_cleanup_keeps_no_ids_for_reuse() {
    use ditto_engine::{RecordId, Ts};
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    for i in 0..2000u64 {
        let key = format!("k{i}");
        db.replay_install(t, RecordId(0), Some(key.as_bytes()), Ts(2 * i + 1), Some(b"v")).unwrap();
        db.replay_install(t, RecordId(0), None, Ts(2 * i + 2), None).unwrap();
        db.publish_read_view(Ts(2 * i + 2)).unwrap();
        db.reclaim();
    }
    for _ in 0..10 {
        db.reclaim();
    }
    assert_eq!(db.record_ids_used(t).unwrap(), 1, "ids listed for reuse on a backup");
}

/// Ids whose giving back was deferred before a promotion's `forget_reusable_rids` (a pin
/// held elsewhere delays it) are dropped when it runs after: they could name records a
/// replayer gave new lives meanwhile.
#[test]
fn ids_given_back_after_a_promotion_forgot_the_list_are_dropped() {
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();
    w.run(|x| x.insert(t, b"a", b"v")).unwrap().1.wait().unwrap();
    assert!(w.run(|x| x.delete(t, b"a")).unwrap().0);
    let (pinned_tx, pinned) = std::sync::mpsc::channel();
    let (release_tx, release) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _pin = crossbeam_epoch::pin();
        pinned_tx.send(()).unwrap();
        release.recv().unwrap();
    });
    pinned.recv().unwrap();
    db.reclaim(); // unlinks "a": its id's giving back waits for the pin
    db.forget_reusable_rids();
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    for _ in 0..10 {
        db.reclaim();
    }
    assert_eq!(db.record_ids_used(t).unwrap(), 1, "the id deferred before the promotion was given back");
    w.run(|x| x.insert(t, b"b", b"v")).unwrap().1.wait().unwrap();
    assert_eq!(db.record_ids_allocated(t).unwrap(), 2, "a fresh id for the new key");
}

/// Recovery from a backup's directory meets two lives of one record id: the backup's own
/// checkpoint (taken on its own schedule) can be older than the tombstone the primary's
/// checkpoint covered when it reused the id, so the replica log above it holds the old
/// life's end and the new life's insert. The record takes the key of its newest life,
/// whatever order the writes are replayed in (recovery goes newest first, on several
/// threads): before 2026-12-03 the checkpoint's key stayed, and the new key's value was
/// read under the old key (found by a review).
#[test]
fn recovery_gives_a_reused_record_id_the_key_of_its_newest_life() {
    use ditto_engine::{RecordId, Ts};
    type Key = fn() -> bytes::Bytes;
    let (k1, k2): (Key, Key) = (|| bytes::Bytes::from_static(b"k1"), || bytes::Bytes::from_static(b"k2"));
    // Every order of the log's three writes: k1's delete at 10, k2's insert at 20, k2's
    // keyless update at 30.
    type Write = (Option<Key>, u64, Option<&'static [u8]>);
    let writes: [Write; 3] = [(Some(k1), 10, None), (Some(k2), 20, Some(b"v2")), (None, 30, Some(b"v2b"))];
    for order in [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        // The checkpoint: id 0 holds k1 (written at 5).
        db.recovery_install(t, RecordId(0), Some(k1), Ts(5), Some(&b"v1"[..])).unwrap();
        db.recovery_log_begins();
        for i in order {
            let (key, ts, value) = writes[i];
            db.recovery_install(t, RecordId(0), key, Ts(ts), value).unwrap();
        }
        db.recovery_finish(Ts(30), 1).unwrap();
        let r = db.read();
        assert_eq!(r.get(t, b"k2").unwrap().as_deref(), Some(&b"v2b"[..]), "order {order:?}");
        assert_eq!(r.get(t, b"k1").unwrap(), None, "order {order:?}");
    }
}
