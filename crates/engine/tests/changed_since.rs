//! `Transaction::version` and `changed_since`, which the server's WATCH is built on: a key
//! read in one transaction is asked about in a later one. Each way a key can change, or
//! seem to while it does not (its own tombstone cleaned up from the index), is taken in
//! turn, with the cleanup (`Database::reclaim`) run where it makes the record disappear.

use ditto_engine::{Database, KeyVersion, Options, TableId, Worker, WorkerId};

fn read(w: &mut Worker, t: TableId, key: &str) -> KeyVersion {
    w.run(|x| x.version(t, key.as_bytes())).unwrap().0
}

fn changed(w: &mut Worker, t: TableId, key: &str, then: KeyVersion) -> bool {
    w.run(|x| x.changed_since(t, key.as_bytes(), then)).unwrap().0
}

fn put(w: &mut Worker, t: TableId, key: &str, v: &str) {
    w.run(|x| x.put(t, key.as_bytes(), v.as_bytes())).unwrap().1.wait().unwrap();
}

fn del(w: &mut Worker, t: TableId, key: &str) {
    let (existed, ticket) = w.run(|x| x.delete(t, key.as_bytes())).unwrap();
    ticket.wait().unwrap();
    assert!(existed);
}

#[test]
fn each_change_is_seen_and_a_cleanup_is_not_one() {
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();

    // Present, untouched: unchanged; overwritten, even with the same value: changed.
    put(&mut w, t, "k", "1");
    let then = read(&mut w, t, "k");
    assert!(then.present);
    assert!(!changed(&mut w, t, "k", then));
    put(&mut w, t, "k", "1");
    assert!(changed(&mut w, t, "k", then));

    // Present, then deleted: changed, before and after the tombstone leaves the index.
    let then = read(&mut w, t, "k");
    del(&mut w, t, "k");
    assert!(changed(&mut w, t, "k", then));
    db.reclaim();
    assert!(changed(&mut w, t, "k", then));

    // Absent with a tombstone: its cleanup alone is no change.
    put(&mut w, t, "gone", "1");
    del(&mut w, t, "gone");
    let then = read(&mut w, t, "gone");
    assert!(!then.present);
    db.reclaim();
    assert_eq!(read(&mut w, t, "gone").ts.0, 0, "the cleanup took the record");
    assert!(!changed(&mut w, t, "gone", then));

    // Absent (no record, or a tombstone), then created: changed; created and deleted again:
    // changed, while the new tombstone is there and after it too is cleaned up.
    for key in ["never", "gone"] {
        let then = read(&mut w, t, key);
        assert!(!then.present);
        put(&mut w, t, key, "2");
        assert!(changed(&mut w, t, key, then), "{key}: created");
        del(&mut w, t, key);
        assert!(changed(&mut w, t, key, then), "{key}: created and deleted");
        db.reclaim();
        assert_eq!(read(&mut w, t, key).ts.0, 0, "the cleanup took the record");
        assert!(changed(&mut w, t, key, then), "{key}: created, deleted and cleaned up");
    }

    // A key nobody touched is unchanged, cleanups of other keys' tombstones or not.
    let then = read(&mut w, t, "other");
    db.reclaim();
    assert!(!changed(&mut w, t, "other", then));
}

/// The read `changed_since` makes is validated at commit: a write of the key between it
/// and the commit aborts the transaction, whose retry then sees the change.
#[test]
fn a_change_racing_with_the_check_aborts_it() {
    let db = Database::new(Options { workers: 2 });
    let t = db.create_table("t").unwrap();
    let mut a = db.worker(WorkerId(0)).unwrap();
    let mut b = db.worker(WorkerId(1)).unwrap();
    put(&mut a, t, "k", "1");
    let then = read(&mut a, t, "k");
    let mut txn = a.begin();
    assert!(!txn.changed_since(t, b"k", then).unwrap());
    txn.put(t, b"out", b"written only if k is unchanged").unwrap();
    put(&mut b, t, "k", "2");
    assert!(matches!(txn.commit(), Err(e) if e.is_retryable()), "the racing write aborts the check");
    assert!(changed(&mut a, t, "k", then));
    let out = db.read().get(t, b"out").unwrap();
    assert_eq!(out, None, "nothing of the aborted transaction is visible");
}
