//! Live replay on a backup (crates/engine/src/replay.rs): versions installed out of order
//! across threads, snapshots at the published read view, a key given a new record and a
//! record given a new key by the primary.

use std::sync::Arc;

use ditto_engine::{Database, Options, RecordId, TableId, Ts};

fn db() -> (Arc<Database>, TableId) {
    let db = Database::new(Options { workers: 2 });
    let t = db.create_table("t").unwrap();
    (db, t)
}

#[test]
fn versions_slot_in_by_timestamp_and_snapshots_read_at_the_view() {
    let (db, t) = db();
    let rid = RecordId(3);
    // Arrival order 5, 2 (the insert), 9, 7: two streams' writes to one record.
    let inserted = db.replay_install(t, rid, Some(b"k"), Ts(2), Some(b"v2")).unwrap();
    assert_eq!(
        (inserted.delta, db.with_delta_key(&inserted, <[u8]>::to_vec)),
        (1, Some(b"k".to_vec())),
        "an insert names its key"
    );
    assert_eq!(db.replay_install(t, rid, None, Ts(9), Some(b"v9")).unwrap().delta, 0);
    assert_eq!(db.replay_install(t, rid, None, Ts(5), Some(b"v5")).unwrap().delta, 0);
    assert_eq!(db.replay_install(t, rid, None, Ts(7), None).unwrap().delta, 0);
    // A duplicate changes nothing.
    assert_eq!(db.replay_install(t, rid, None, Ts(5), Some(b"other")).unwrap().delta, 0);
    for (view, want) in
        [(1, None), (2, Some("v2")), (4, Some("v2")), (5, Some("v5")), (7, None), (8, None), (9, Some("v9"))]
    {
        db.publish_read_view(Ts(view)).unwrap();
        let r = db.read();
        assert_eq!(r.ts(), Ts(view), "the snapshot reads at the published view");
        let got = r.get(t, b"k").unwrap();
        assert_eq!(got.as_deref(), want.map(str::as_bytes), "at view {view}");
    }
}

#[test]
fn a_snapshot_taken_before_a_view_moves_keeps_reading_its_own_view() {
    let (db, t) = db();
    db.replay_install(t, RecordId(0), Some(b"a"), Ts(1), Some(b"1")).unwrap();
    db.publish_read_view(Ts(1)).unwrap();
    let old = db.read();
    db.replay_install(t, RecordId(0), None, Ts(2), Some(b"2")).unwrap();
    db.replay_install(t, RecordId(1), Some(b"b"), Ts(3), Some(b"3")).unwrap();
    db.publish_read_view(Ts(3)).unwrap();
    let new = db.read();
    assert_eq!(old.get(t, b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(old.get(t, b"b").unwrap(), None, "an insert above the view is invisible");
    assert_eq!(new.get(t, b"a").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(new.get(t, b"b").unwrap().as_deref(), Some(&b"3"[..]));
    // The read view never goes back.
    db.publish_read_view(Ts(2)).unwrap();
    assert_eq!(db.read().ts(), Ts(3));
}

#[test]
fn a_key_given_a_new_record_moves_once_its_old_life_is_over() {
    let (db, t) = db();
    db.replay_install(t, RecordId(0), Some(b"k"), Ts(1), Some(b"old")).unwrap();
    let deleted = db.replay_install(t, RecordId(0), None, Ts(2), None).unwrap();
    assert_eq!(
        (deleted.delta, db.with_delta_key(&deleted, <[u8]>::to_vec)),
        (-1, Some(b"k".to_vec())),
        "a delete names its record's key"
    );
    db.publish_read_view(Ts(2)).unwrap();
    // The primary unlinked record 0 and inserted "k" again as record 5 at ts 3.
    assert_eq!(db.replay_install(t, RecordId(5), Some(b"k"), Ts(3), Some(b"new")).unwrap().delta, 1);
    db.publish_read_view(Ts(3)).unwrap();
    assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), Some(&b"new"[..]));
    assert_eq!(db.count(t).unwrap(), 1);
}

#[test]
fn a_record_id_given_a_new_key_waits_for_its_old_tombstone() {
    let (db, t) = db();
    let rid = RecordId(7);
    db.replay_install(t, rid, Some(b"first"), Ts(1), Some(b"a")).unwrap();
    db.publish_read_view(Ts(1)).unwrap();
    let db2 = Arc::clone(&db);
    // The new life (ts 4) arrives before the old life's tombstone (ts 3, another stream).
    let reuse = std::thread::spawn(move || db2.replay_install(t, rid, Some(b"second"), Ts(4), Some(b"b")));
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!reuse.is_finished(), "the reuse waits until everything before it is seen by every snapshot");
    db.replay_install(t, rid, None, Ts(3), None).unwrap();
    db.publish_read_view(Ts(3)).unwrap();
    assert_eq!(reuse.join().unwrap().unwrap().delta, 1);
    db.publish_read_view(Ts(4)).unwrap();
    let r = db.read();
    assert_eq!(r.get(t, b"first").unwrap(), None);
    assert_eq!(r.get(t, b"second").unwrap().as_deref(), Some(&b"b"[..]));
}

/// An update parked after a delete, whose new life never comes: the error names the
/// record's key and versions, newest first, a tombstone marked `-`.
#[test]
fn an_update_never_given_its_value_is_reported_with_the_records_state() {
    let (db, t) = db();
    db.replay_install(t, RecordId(3), Some(b"j"), Ts(1), Some(b"v")).unwrap();
    db.replay_install(t, RecordId(3), None, Ts(2), None).unwrap();
    assert_eq!(db.replay_install(t, RecordId(3), None, Ts(4), Some(b"y")).unwrap().delta, 0, "parked");
    db.publish_read_view(Ts(3)).unwrap();
    let err = db.publish_read_view(Ts(4)).unwrap_err().to_string();
    assert!(err.contains("record 3 at ts 4"), "{err}");
    assert!(err.ends_with("the record: key \"j\", tid ts 2, versions newest first [2- 1]"), "{err}");
}

#[test]
fn a_new_life_over_a_live_value_is_refused_as_corruption() {
    let (db, t) = db();
    db.replay_install(t, RecordId(0), Some(b"k"), Ts(1), Some(b"v")).unwrap();
    db.publish_read_view(Ts(5)).unwrap();
    let err = db.replay_install(t, RecordId(1), Some(b"k"), Ts(6), Some(b"w")).unwrap_err();
    assert!(err.to_string().contains("still holds a value"), "{err}");
    // An update whose insert never comes waits for it, and the read view cannot pass it.
    assert_eq!(db.replay_install(t, RecordId(9), None, Ts(7), Some(b"x")).unwrap().delta, 0);
    db.publish_read_view(Ts(6)).unwrap();
    let err = db.publish_read_view(Ts(7)).unwrap_err();
    assert!(err.to_string().contains("its insert was never received"), "{err}");
    // It says what the record held (here nothing: no key, no version).
    assert!(err.to_string().ends_with("the record: key \"none\", tid ts 0, versions newest first []"), "{err}");
    assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), Some(&b"v"[..]), "the view stayed at 6");
}

/// Parallel replay: the insert is on one stream and the record's updates and delete on
/// another, whose replayer gets there first. They wait for the insert and are installed
/// by it, in timestamp order; the key count moves once each way.
#[test]
fn updates_that_come_before_their_insert_wait_for_it() {
    let (db, t) = db();
    assert_eq!(db.replay_install(t, RecordId(3), None, Ts(12), None).unwrap().delta, 0);
    assert_eq!(db.replay_install(t, RecordId(3), None, Ts(11), Some(b"b")).unwrap().delta, 0);
    assert_eq!(db.replay_install(t, RecordId(3), Some(b"k"), Ts(10), Some(b"a")).unwrap().delta, 0, "+1, then -1");
    for (view, want) in [(10, Some(&b"a"[..])), (11, Some(&b"b"[..])), (12, None)] {
        db.publish_read_view(Ts(view)).unwrap();
        assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), want, "at {view}");
    }
    // Threads: many records, inserts on one thread, two updates each on two others, all
    // started together; every record ends at its newest update.
    let n = 2_000u64;
    std::thread::scope(|sc| {
        let db = &db;
        sc.spawn(move || {
            for i in 0..n {
                let key = format!("r{i}");
                db.replay_install(t, RecordId(100 + i), Some(key.as_bytes()), Ts(100 + 3 * i), Some(b"0")).unwrap();
            }
        });
        for u in 1..=2u64 {
            sc.spawn(move || {
                for i in (0..n).rev() {
                    let v = u.to_string();
                    db.replay_install(t, RecordId(100 + i), None, Ts(100 + 3 * i + u), Some(v.as_bytes())).unwrap();
                }
            });
        }
    });
    db.publish_read_view(Ts(100 + 3 * n)).unwrap();
    let r = db.read();
    for i in 0..n {
        assert_eq!(r.get(t, format!("r{i}").as_bytes()).unwrap().as_deref(), Some(&b"2"[..]), "record {i}");
    }
}

#[test]
fn parallel_replayers_build_the_same_state_as_serial_replay() {
    // 4 threads each replay one "stream": stream s writes ts = 4*i + s + 1 to record i % 64.
    let (db, t) = db();
    let n = 20_000u64;
    std::thread::scope(|sc| {
        for s in 0..4u64 {
            let db = &db;
            sc.spawn(move || {
                for i in 0..n {
                    let ts = 4 * i + s + 1;
                    let rid = (i * 4 + s) % 64;
                    let key = format!("k{rid}");
                    let first = i * 4 + s < 64;
                    db.replay_install(
                        t,
                        RecordId(rid),
                        first.then_some(key.as_bytes()),
                        Ts(ts),
                        Some(&ts.to_le_bytes()),
                    )
                    .unwrap();
                }
            });
        }
    });
    db.publish_read_view(Ts(4 * n)).unwrap();
    let r = db.read();
    for rid in 0..64u64 {
        // The newest write to rid: the largest j = i*4+s with j % 64 == rid, ts = j + 1.
        let j = (4 * n - 64) + rid;
        let got = r.get(t, format!("k{rid}").as_bytes()).unwrap().unwrap();
        assert_eq!(u64::from_le_bytes(got[..8].try_into().unwrap()), j + 1, "record {rid}");
    }
}

/// A backup cleans up deleted records as the primary does: once every snapshot sees a
/// replayed delete, the record leaves the index (its id is given back); a snapshot from
/// before still reads the keys; the primary may then give the id the same key anew, or
/// another key.
#[test]
fn replayed_deletes_leave_the_index_once_every_snapshot_sees_them() {
    let (db, t) = db();
    for i in 0..10u64 {
        let key = format!("k{i}");
        db.replay_install(t, RecordId(i), Some(key.as_bytes()), Ts(i + 1), Some(b"v")).unwrap();
    }
    for i in 0..10u64 {
        assert_eq!(db.replay_install(t, RecordId(i), None, Ts(20 + i), None).unwrap().delta, -1);
    }
    db.publish_read_view(Ts(15)).unwrap();
    let old = db.read();
    db.publish_read_view(Ts(30)).unwrap();
    db.reclaim();
    assert_eq!(db.record_ids_released(), 0, "a snapshot at 15 still reads them");
    for i in 0..10u64 {
        assert_eq!(old.get(t, format!("k{i}").as_bytes()).unwrap().as_deref(), Some(&b"v"[..]), "k{i} at 15");
    }
    drop(old);
    // The ids go back through the epoch GC, which is shared by every test thread in this
    // process: a pin held elsewhere can hold the epoch back for a moment, so ask again
    // (bounded) rather than expect one round of collection to be enough.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    db.reclaim();
    while db.record_ids_released() < 10 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
        db.reclaim();
    }
    assert_eq!(db.record_ids_released(), 10, "every deleted record unlinked");
    assert_eq!(db.read().get(t, b"k3").unwrap(), None);
    // Id 3 gets its key anew, id 4 another key.
    assert_eq!(db.replay_install(t, RecordId(3), Some(b"k3"), Ts(40), Some(b"again")).unwrap().delta, 1);
    assert_eq!(db.replay_install(t, RecordId(4), Some(b"other"), Ts(41), Some(b"x")).unwrap().delta, 1);
    assert_eq!(db.replay_install(t, RecordId(3), None, Ts(42), Some(b"updated")).unwrap().delta, 0);
    db.publish_read_view(Ts(42)).unwrap();
    let r = db.read();
    assert_eq!(r.get(t, b"k3").unwrap().as_deref(), Some(&b"updated"[..]));
    assert_eq!(r.get(t, b"other").unwrap().as_deref(), Some(&b"x"[..]));
    assert_eq!(r.get(t, b"k4").unwrap(), None);
    assert_eq!(db.count(t).unwrap(), 2);
}

/// Query Fresh's log-as-database: replayed values shared with the buffer they came in (not
/// copied) read back as installed, out of order and through parking, and the buffer is
/// let go once every version pointing into it is freed.
#[test]
fn shared_values_point_into_their_buffer_and_let_it_go_once_freed() {
    let (db, t) = db();
    let buf = bytes::Bytes::from((0..64u8).collect::<Vec<u8>>());
    let part = |a: usize, b: usize| buf.slice(a..b);
    // An update parked before its insert, both shared; one slotted below the head; a
    // copied one on top.
    db.replay_install_shared(t, RecordId(1), None, Ts(5), Some(&part(10, 20))).unwrap();
    db.replay_install_shared(t, RecordId(1), Some(b"k"), Ts(2), Some(&part(0, 10))).unwrap();
    db.replay_install_shared(t, RecordId(1), None, Ts(3), Some(&part(20, 30))).unwrap();
    db.replay_install(t, RecordId(1), None, Ts(7), Some(b"copied")).unwrap();
    db.replay_install_shared(t, RecordId(2), Some(b"gone"), Ts(4), Some(&part(30, 64))).unwrap();
    db.replay_install(t, RecordId(2), None, Ts(6), None).unwrap();
    for (view, want) in
        [(2, part(0, 10)), (3, part(20, 30)), (5, part(10, 20)), (7, bytes::Bytes::from_static(b"copied"))]
    {
        db.publish_read_view(Ts(view)).unwrap();
        assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), Some(&want[..]), "at view {view}");
        let gone = db.read().get(t, b"gone").unwrap();
        assert_eq!(gone.as_deref(), (view == 5).then(|| &buf[30..64]), "at view {view}");
    }
    assert!(!buf.is_unique(), "the versions hold the buffer");
    // Newer versions supersede the shared ones; the deleted record is cleaned up. Once the
    // GC has freed them all, the buffer is ours alone again.
    db.publish_read_view(Ts(7)).unwrap();
    for ts in 8..12 {
        db.replay_install(t, RecordId(1), None, Ts(ts), Some(b"newer")).unwrap();
        db.publish_read_view(Ts(ts)).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !buf.is_unique() {
        assert!(std::time::Instant::now() < deadline, "the shared versions were never freed");
        db.reclaim();
        crossbeam_epoch::pin().flush();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), Some(&b"newer"[..]));
}

/// Parallel replayers may bind a key's new life (on a new record) before a lagging stream
/// brings its old life: the old life's writes then go below the new life, on its record,
/// and every view reads what the primary had at that timestamp. An update of the old life
/// that came before its insert (parked) follows it there.
#[test]
fn a_late_old_life_goes_below_the_new_one_and_every_view_reads_the_primarys_history() {
    let (db, t) = db();
    let (old, new) = (RecordId(0), RecordId(1));
    let mut keys = 0;
    // The primary: insert k on record 0 at 3, update at 4, delete at 5, clean record 0 up,
    // give k record 1 at 7. The replayers see 7, then 4, 3 and 5.
    keys += db.replay_install(t, new, Some(b"k"), Ts(7), Some(b"new")).unwrap().delta;
    keys += db.replay_install(t, old, None, Ts(4), Some(b"old2")).unwrap().delta;
    assert!(!db.replay_redirecting(), "nothing to redirect yet: the update waits for its insert");
    keys += db.replay_install(t, old, Some(b"k"), Ts(3), Some(b"old")).unwrap().delta;
    assert!(db.replay_redirecting());
    keys += db.replay_install(t, old, None, Ts(5), None).unwrap().delta;
    assert_eq!(keys, 1, "one key with a value in the end, as on the primary");
    for (view, want) in [(2, None), (3, Some("old")), (4, Some("old2")), (5, None), (6, None), (7, Some("new"))] {
        db.publish_read_view(Ts(view)).unwrap();
        let got = db.read().get(t, b"k").unwrap();
        assert_eq!(got.as_deref(), want.map(str::as_bytes), "at view {view}");
        // No write below 7 can come once the view is at 6: the redirect is over.
        assert_eq!(db.replay_redirecting(), view < 6, "at view {view}");
    }
    assert_eq!(db.count(t).unwrap(), 1);
    // Record 0 goes on to a life of its own, with another key (once every snapshot is past
    // 8, as for any reuse of a record id).
    db.publish_read_view(Ts(8)).unwrap();
    db.replay_install(t, old, Some(b"j"), Ts(9), Some(b"j1")).unwrap();
    db.publish_read_view(Ts(9)).unwrap();
    let r = db.read();
    assert_eq!(r.get(t, b"j").unwrap().as_deref(), Some(&b"j1"[..]));
    assert_eq!(r.get(t, b"k").unwrap().as_deref(), Some(&b"new"[..]));
}

/// Three lives of one key, replayed newest first: the middle one, late as well, goes
/// between the other two on the newest record (a redirected version below does not make
/// it look older). A write parked on the first life's record for that record's next life
/// (another key) stays there, and is installed by that life.
#[test]
fn three_lives_of_a_key_replayed_newest_first_and_the_old_records_next_life() {
    let (db, t) = db();
    let (a, b, c) = (RecordId(0), RecordId(1), RecordId(2));
    let mut keys = 0;
    keys += db.replay_install(t, b, Some(b"k"), Ts(20), Some(b"B")).unwrap().delta;
    // Record 0's next life (key j, from 25): its update comes first and waits.
    keys += db.replay_install(t, a, None, Ts(27), Some(b"j2")).unwrap().delta;
    keys += db.replay_install(t, a, Some(b"k"), Ts(10), Some(b"A")).unwrap().delta;
    keys += db.replay_install(t, a, None, Ts(15), None).unwrap().delta;
    keys += db.replay_install(t, c, Some(b"k"), Ts(16), Some(b"C")).unwrap().delta;
    keys += db.replay_install(t, c, None, Ts(18), None).unwrap().delta;
    for (view, want) in [(9, None), (10, Some("A")), (15, None), (16, Some("C")), (18, None), (20, Some("B"))] {
        db.publish_read_view(Ts(view)).unwrap();
        assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), want.map(str::as_bytes), "at view {view}");
    }
    db.publish_read_view(Ts(24)).unwrap();
    keys += db.replay_install(t, a, Some(b"j"), Ts(25), Some(b"j1")).unwrap().delta;
    db.publish_read_view(Ts(27)).unwrap();
    let r = db.read();
    assert_eq!(r.get(t, b"j").unwrap().as_deref(), Some(&b"j2"[..]), "the parked update found its life");
    assert_eq!(r.get(t, b"k").unwrap().as_deref(), Some(&b"B"[..]));
    assert_eq!(keys, 2, "k and j, as on the primary");
    assert_eq!(db.count(t).unwrap(), 2);
}

/// A record id's lives replayed the other way round: the primary ended key a's life on
/// record 0 (insert 3, update 4, delete 5), cleaned it up and, once a checkpoint covered
/// it, gave record 0 to key b (insert 7, update 8). A lagging stream brings a's life after
/// b's start: two keys cannot share a chain, so a's life goes to a record of the backup's
/// own, and every view reads what the primary had. a's update, which came before its
/// insert (parked on record 0), follows it there; b's life on record 0 is untouched.
#[test]
fn a_record_ids_late_old_life_goes_to_a_record_of_the_backups_own_and_every_view_reads_the_primarys_history() {
    let (db, t) = db();
    let r = RecordId(0);
    let mut keys = 0;
    keys += db.replay_install(t, r, Some(b"b"), Ts(7), Some(b"b1")).unwrap().delta;
    keys += db.replay_install(t, r, None, Ts(4), Some(b"a2")).unwrap().delta;
    assert!(!db.replay_redirecting(), "nothing to redirect yet: the update waits for its insert");
    keys += db.replay_install(t, r, Some(b"a"), Ts(3), Some(b"a1")).unwrap().delta;
    assert!(db.replay_redirecting(), "a's life is replayed elsewhere: no checkpoint meanwhile");
    keys += db.replay_install(t, r, None, Ts(8), Some(b"b2")).unwrap().delta;
    keys += db.replay_install(t, r, None, Ts(5), None).unwrap().delta;
    assert_eq!(keys, 1, "one key with a value in the end, as on the primary");
    let want = |view: u64| -> (Option<&str>, Option<&str>) {
        match view {
            3 => (Some("a1"), None),
            4 => (Some("a2"), None),
            7 => (None, Some("b1")),
            8.. => (None, Some("b2")),
            _ => (None, None),
        }
    };
    for view in 1..=9 {
        db.publish_read_view(Ts(view)).unwrap();
        let snap = db.read();
        let (a, b) = want(view);
        assert_eq!(snap.get(t, b"a").unwrap().as_deref(), a.map(str::as_bytes), "a at view {view}");
        assert_eq!(snap.get(t, b"b").unwrap().as_deref(), b.map(str::as_bytes), "b at view {view}");
        assert_eq!(db.count(t).unwrap(), u64::from(a.is_some()) + u64::from(b.is_some()), "count at view {view}");
        assert_eq!(db.replay_redirecting(), view < 6, "at view {view}");
    }
    // b's life goes on on record 0; a comes back on a record of the primary's.
    db.replay_install(t, r, None, Ts(10), None).unwrap();
    db.publish_read_view(Ts(11)).unwrap();
    db.replay_install(t, RecordId(1), Some(b"a"), Ts(12), Some(b"a3")).unwrap();
    db.publish_read_view(Ts(12)).unwrap();
    let snap = db.read();
    assert_eq!(snap.get(t, b"a").unwrap().as_deref(), Some(&b"a3"[..]));
    assert_eq!(snap.get(t, b"b").unwrap(), None);
    assert_eq!(db.record_ids_allocated(t).unwrap(), 2, "the backup's own record is no id a primary hands out");
}

/// The same, where the late life's key already lives again on another record (the primary
/// gave a record 1 at 6): the late life goes below that life, as a key's late old life does.
#[test]
fn a_record_ids_late_old_life_whose_key_lives_again_goes_below_that_life() {
    let (db, t) = db();
    let mut keys = 0;
    keys += db.replay_install(t, RecordId(0), Some(b"b"), Ts(7), Some(b"b1")).unwrap().delta;
    keys += db.replay_install(t, RecordId(1), Some(b"a"), Ts(6), Some(b"a-new")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), Some(b"a"), Ts(3), Some(b"a1")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), None, Ts(5), None).unwrap().delta;
    assert_eq!(keys, 2);
    reads_at_views(
        &db,
        t,
        &[
            (2, None, None),
            (3, Some("a1"), None),
            (5, None, None),
            (6, Some("a-new"), None),
            (7, Some("a-new"), Some("b1")),
        ],
    );
    assert_eq!(db.count(t).unwrap(), 2);
}

/// A log that takes every commit (an engine promoted in place starts committing).
struct TakesAll;

impl ditto_engine::CommitLog for TakesAll {
    fn check_writable(&self) -> ditto_engine::Result<()> {
        Ok(())
    }
    fn append(
        &self,
        _: ditto_engine::WorkerId,
        _: Ts,
        _: &mut dyn ExactSizeIterator<Item = ditto_engine::LoggedWrite<'_>>,
    ) {
    }
    fn wait_durable(&self, _: Ts) -> ditto_engine::Result<()> {
        Ok(())
    }
    fn is_durable(&self, _: Ts) -> ditto_engine::Result<bool> {
        Ok(true)
    }
    fn table_created(&self, _: TableId, _: &str) -> ditto_engine::Result<()> {
        Ok(())
    }
}

/// An engine promoted after a record id's late old life: the backup's own record leaves
/// the index as the engine starts to commit, so a write of the key takes a record of the
/// primary's (a backup's own id cannot be logged), and the old life still reads where a
/// snapshot taken before the promotion looks.
#[test]
fn a_promoted_engine_writes_no_key_onto_a_record_of_the_backups_own() {
    let (db, t) = db();
    db.replay_install(t, RecordId(0), Some(b"b"), Ts(7), Some(b"b1")).unwrap();
    db.replay_install(t, RecordId(0), Some(b"a"), Ts(3), Some(b"a1")).unwrap();
    db.publish_read_view(Ts(4)).unwrap();
    let old = db.read();
    db.replay_install(t, RecordId(0), None, Ts(5), None).unwrap();
    db.publish_read_view(Ts(7)).unwrap();
    drop(old);
    db.attach_log(Arc::new(TakesAll));
    let mut w = db.worker(ditto_engine::WorkerId(0)).unwrap();
    w.run(|tx| tx.put(t, b"a", b"a-primary")).unwrap().1.wait().unwrap();
    let snap = db.read();
    assert_eq!(snap.get(t, b"a").unwrap().as_deref(), Some(&b"a-primary"[..]));
    assert_eq!(snap.get(t, b"b").unwrap().as_deref(), Some(&b"b1"[..]));
    let mut rids = Vec::new();
    snap.for_each_record(t, 0..u64::MAX, |rid, key, _, _| {
        rids.push((rid.0, key.to_vec()));
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    rids.sort();
    assert_eq!(rids, vec![(0, b"b".to_vec()), (1, b"a".to_vec())], "a took the primary's next id");
}

/// A record id's late old life on a record that also holds, below its key's life, that
/// key's own earlier life put there from another record: the late life is told by there
/// being nothing with a value at its timestamp, not by every version lying above it.
#[test]
fn a_record_ids_late_old_life_below_a_key_redirected_onto_the_same_record() {
    let (db, t) = db();
    let mut keys = 0;
    keys += db.replay_install(t, RecordId(0), Some(b"b"), Ts(7), Some(b"b7")).unwrap().delta;
    // b's earlier life, on record 5 (insert 1, delete 2), goes below b's life on record 0.
    keys += db.replay_install(t, RecordId(5), Some(b"b"), Ts(1), Some(b"b1")).unwrap().delta;
    keys += db.replay_install(t, RecordId(5), None, Ts(2), None).unwrap().delta;
    db.publish_read_view(Ts(2)).unwrap();
    // a's life on record 0 (insert 3, update 4, delete 5), before record 0 went to b.
    keys += db.replay_install(t, RecordId(0), Some(b"a"), Ts(3), Some(b"a3")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), None, Ts(4), Some(b"a4")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), None, Ts(5), None).unwrap().delta;
    assert_eq!(keys, 1);
    assert_eq!(db.replay_own_records(), 1);
    reads_at_views(
        &db,
        t,
        &[(2, None, None), (3, Some("a3"), None), (4, Some("a4"), None), (5, None, None), (7, None, Some("b7"))],
    );
    assert_eq!(db.count(t).unwrap(), 1);
}

/// A key's late old life redirected from record 0 to the key's later record, then an
/// earlier life of record 0 itself (another key) that comes after: record 0's redirect
/// gives way to it (the earlier life is installed on record 0), as before the record-id
/// case was handled.
#[test]
fn an_earlier_life_of_a_redirected_record_is_installed_on_it() {
    let (db, t) = db();
    let mut keys = 0;
    keys += db.replay_install(t, RecordId(1), Some(b"b"), Ts(9), Some(b"b9")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), Some(b"b"), Ts(7), Some(b"b7")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), None, Ts(8), None).unwrap().delta;
    db.publish_read_view(Ts(2)).unwrap();
    keys += db.replay_install(t, RecordId(0), Some(b"a"), Ts(3), Some(b"a3")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), None, Ts(5), None).unwrap().delta;
    assert_eq!(keys, 1, "b in the end; a's +1 and -1 counted on its own record");
    assert_eq!(db.replay_own_records(), 0);
    reads_at_views(
        &db,
        t,
        &[(3, Some("a3"), None), (5, None, None), (7, None, Some("b7")), (8, None, None), (9, None, Some("b9"))],
    );
    assert_eq!(db.count(t).unwrap(), 1);
}

/// A record id's late old life that comes while the record's new life waits to be bound
/// (its key's previous record, 5, has not ended for every snapshot yet): the record has
/// its new key and no version then. The late life must not take the record for itself:
/// before 2026-11-29 it did, and the waiting life's value was then installed on a record
/// whose key was the old one (a read of a returned b's value; found by a review).
#[test]
fn a_record_ids_late_old_life_while_its_new_life_waits_to_be_bound() {
    let (db, t) = db();
    let mut keys = 0;
    keys += db.replay_install(t, RecordId(5), Some(b"b"), Ts(1), Some(b"b1")).unwrap().delta;
    keys += db.replay_install(t, RecordId(5), None, Ts(2), None).unwrap().delta;
    db.publish_read_view(Ts(2)).unwrap();
    let db2 = Arc::clone(&db);
    let new_life = std::thread::spawn(move || db2.replay_install(t, RecordId(0), Some(b"b"), Ts(7), Some(b"b7")));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while db.replay_binds_waiting() == 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(db.replay_binds_waiting(), 1, "b's new life waits for every snapshot to see its old one end");
    assert!(!new_life.is_finished());
    keys += db.replay_install(t, RecordId(0), Some(b"a"), Ts(3), Some(b"a3")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), None, Ts(5), None).unwrap().delta;
    // The views while b's new life still waits (each snapshot holds it back).
    db.publish_read_view(Ts(3)).unwrap();
    let at3 = db.read();
    db.publish_read_view(Ts(5)).unwrap();
    let at5 = db.read();
    assert_eq!(at3.get(t, b"a").unwrap().as_deref(), Some(&b"a3"[..]));
    assert_eq!(at5.get(t, b"a").unwrap(), None);
    assert_eq!(at3.get(t, b"b").unwrap(), None);
    drop((at3, at5));
    db.publish_read_view(Ts(6)).unwrap();
    keys += new_life.join().unwrap().unwrap().delta;
    assert_eq!(keys, 1);
    assert_eq!(db.replay_own_records(), 1, "a's life went to a record of the backup's own");
    db.publish_read_view(Ts(7)).unwrap();
    let snap = db.read();
    assert_eq!(snap.get(t, b"a").unwrap(), None, "a's key does not read b's value");
    assert_eq!(snap.get(t, b"b").unwrap().as_deref(), Some(&b"b7"[..]));
    assert_eq!(db.count(t).unwrap(), 1);
}

/// A key's late life on record 0 redirected to the key's later record, then an earlier
/// life of record 0 itself (another key) that comes after: that life is installed on
/// record 0, and the redirected life's later writes still follow the redirect (before,
/// the earlier life's key ended the redirect at its own timestamp, and the redirected
/// life's delete then waited on record 0 for ever: found by a review).
#[test]
fn an_earlier_life_of_a_redirected_record_leaves_the_redirect_for_the_later_one() {
    let (db, t) = db();
    let mut keys = 0;
    keys += db.replay_install(t, RecordId(9), Some(b"b"), Ts(12), Some(b"b12")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), Some(b"b"), Ts(7), Some(b"b7")).unwrap().delta;
    db.publish_read_view(Ts(2)).unwrap();
    keys += db.replay_install(t, RecordId(0), Some(b"a"), Ts(3), Some(b"a3")).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), None, Ts(5), None).unwrap().delta;
    keys += db.replay_install(t, RecordId(0), None, Ts(8), None).unwrap().delta;
    assert_eq!(keys, 1);
    reads_at_views(
        &db,
        t,
        &[(3, Some("a3"), None), (5, None, None), (7, None, Some("b7")), (8, None, None), (12, None, Some("b12"))],
    );
    assert_eq!(db.count(t).unwrap(), 1);
}

/// At each view in turn (published then), keys a and b read as given, and the table
/// counts the keys present.
fn reads_at_views(db: &Database, t: TableId, views: &[(u64, Option<&str>, Option<&str>)]) {
    for &(view, a, b) in views {
        db.publish_read_view(Ts(view)).unwrap();
        let snap = db.read();
        assert_eq!(snap.get(t, b"a").unwrap().as_deref(), a.map(str::as_bytes), "a at view {view}");
        assert_eq!(snap.get(t, b"b").unwrap().as_deref(), b.map(str::as_bytes), "b at view {view}");
        assert_eq!(db.count(t).unwrap(), u64::from(a.is_some()) + u64::from(b.is_some()), "count at view {view}");
    }
}

/// A second earlier life of a record id (key c, below key a's late life, which is
/// replayed elsewhere already) is not handled: replay stops with a clear error naming the
/// record, and what was replayed still reads as before.
#[test]
fn a_second_earlier_life_of_a_redirected_record_id_is_refused_clearly() {
    let (db, t) = db();
    db.replay_install(t, RecordId(0), Some(b"b"), Ts(7), Some(b"b7")).unwrap();
    db.replay_install(t, RecordId(0), Some(b"a"), Ts(3), Some(b"a3")).unwrap();
    let err = db.replay_install(t, RecordId(0), Some(b"c"), Ts(1), Some(b"c1")).unwrap_err().to_string();
    assert!(err.contains("record 0 at ts 1: a second earlier life of the record id"), "{err}");
    assert_eq!(db.replay_own_records(), 1, "no record taken for it");
    db.publish_read_view(Ts(3)).unwrap();
    assert_eq!(db.read().get(t, b"a").unwrap().as_deref(), Some(&b"a3"[..]));
    assert_eq!(db.read().get(t, b"c").unwrap(), None);
}

/// A promoted engine whose backup's own record still has a snapshot that reads its life:
/// the record stays in the index, a write of its key is refused as a conflict (its id
/// cannot be logged), and once the snapshot is gone and the cleanup runs, the write takes
/// a record of the primary's.
#[test]
fn a_write_of_a_key_on_a_backups_own_record_waits_as_a_conflict_until_the_cleanup() {
    let (db, t) = db();
    db.replay_install(t, RecordId(0), Some(b"b"), Ts(7), Some(b"b7")).unwrap();
    db.replay_install(t, RecordId(0), Some(b"a"), Ts(3), Some(b"a3")).unwrap();
    db.publish_read_view(Ts(4)).unwrap();
    let old = db.read();
    db.replay_install(t, RecordId(0), None, Ts(5), None).unwrap();
    db.publish_read_view(Ts(7)).unwrap();
    db.attach_log(Arc::new(TakesAll));
    let mut w = db.worker(ditto_engine::WorkerId(0)).unwrap();
    let mut tx = w.begin();
    let refused = tx.put(t, b"a", b"a-primary").unwrap_err();
    assert!(matches!(refused, ditto_engine::Error::Conflict(_)), "{refused:?}");
    drop(tx);
    assert_eq!(old.get(t, b"a").unwrap().as_deref(), Some(&b"a3"[..]), "the old snapshot still reads a's life");
    drop(old);
    db.reclaim();
    w.run(|tx| tx.put(t, b"a", b"a-primary")).unwrap().1.wait().unwrap();
    assert_eq!(db.read().get(t, b"a").unwrap().as_deref(), Some(&b"a-primary"[..]));
}
