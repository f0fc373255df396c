//! A backup and a primary of another database (crates/replication/src/identity.rs), with
//! real files and TCP: a backup's directory names the database whose history it holds,
//! and a primary of another (an unrelated one, or its own primary's directory made anew
//! at the same address) is taken nothing from, neither a resume nor a copy, whether the
//! backup meets it at its start or on a reconnect. Before, both histories being epoch 1
//! from timestamp 0, the backup resumed from the other primary's log above what it held,
//! and served the two mixed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ditto_engine::{TableId, Ts, WorkerId};
use ditto_log::OpenOptions;
use ditto_replication::identity::{self, OTHER_DATABASE};
use ditto_replication::{backup, BackupError, BackupOptions, Primary, PrimaryOptions};

mod common;
use common::wait_until;

/// A primary on a fresh log in `dir`, on `listener`: (its log, table "t", the primary).
fn primary_on(dir: &std::path::Path, listener: std::net::TcpListener) -> (ditto_log::Durable, TableId, Arc<Primary>) {
    let d = ditto_log::open(dir, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    let policy = ditto_replication::CommitPolicy::parse("local").unwrap();
    let p = Primary::start(
        &d,
        listener,
        PrimaryOptions::default(),
        Box::new(move |h| ditto_replication::release_watermark(policy, h)),
    )
    .unwrap();
    let p2 = Arc::clone(&p);
    d.logger().set_progress_listener(Box::new(move |_, _| p2.recompute())).unwrap();
    (d, t, p)
}

/// Commits key `k` = value `tag` for each `k` in `keys`; the last commit's timestamp.
fn commit(d: &ditto_log::Durable, t: TableId, keys: std::ops::Range<u32>, tag: &[u8]) -> Ts {
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for k in keys {
        last = w.run(|x| x.put(t, &k.to_be_bytes(), tag)).unwrap().1.wait().unwrap();
    }
    last
}

/// What the backup directory `dir` holds of keys 0..300: (key, value) pairs.
fn held(dir: &std::path::Path, t: TableId) -> Vec<(u32, Vec<u8>)> {
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
    let kept = ditto_log::replica::open_replica(dir, 1, &storage).unwrap();
    let r = kept.db.read();
    (0..300u32).filter_map(|k| r.get(t, &k.to_be_bytes()).unwrap().map(|v| (k, v.to_vec()))).collect()
}

#[test]
fn a_backup_takes_nothing_from_a_primary_of_another_database_at_its_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb, pc) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    // Backup b holds primary a's keys 0..40, and a's id.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (a, t, p) = primary_on(&pa, listener);
    let a_id = p.database();
    let last = commit(&a, t, 0..40, b"a");
    common::backup_holding(&addr, &pb, last);
    assert_eq!(identity::read(&pb).unwrap(), Some(a_id), "the backup took its primary's id");
    p.stop();
    a.close();
    let before = held(&pb, t);
    assert_eq!(before.len(), 40);
    // An unrelated primary c: epoch 1 too, and its clock past what b holds, so that the
    // epoch and the clock checks let a resume through.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (c, tc, p2) = primary_on(&pc, listener);
    assert_eq!(tc, t);
    assert_eq!(c.logger().epoch(), a.logger().epoch(), "the same epoch number");
    commit(&c, t, 100..250, b"c");
    let c_id = p2.database();
    assert_ne!(c_id, a_id);
    match backup::start(BackupOptions::new(&addr, &pb, 1, "b")) {
        Err(BackupError::OtherDatabase(why)) => {
            assert!(why.starts_with(OTHER_DATABASE), "{why}");
            assert!(why.contains(&a_id.to_string()) && why.contains(&c_id.to_string()), "{why}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a backup of another database was taken"),
    }
    assert_eq!(p2.checkpoints_sent.load(Ordering::Relaxed), 0, "no copy was sent");
    // Its directory is as it was: a's keys, a's id.
    assert_eq!(held(&pb, t), before);
    assert_eq!(identity::read(&pb).unwrap(), Some(a_id));
    // A backup that holds nothing takes c's id, and c's data.
    let fresh = tmp.path().join("fresh");
    common::backup_holding(&addr, &fresh, Ts(1));
    assert_eq!(identity::read(&fresh).unwrap(), Some(c_id));
    p2.stop();
    c.close();
}

#[test]
fn a_running_backup_whose_primary_is_made_anew_at_its_address_stops_and_keeps_what_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb, pc) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (a, t, p) = primary_on(&pa, listener);
    let a_id = p.database();
    let bk = backup::start(BackupOptions::new(&addr.to_string(), &pb, 1, "b")).unwrap();
    let last = commit(&a, t, 0..40, b"a");
    wait_until("the backup to hold every commit", Duration::from_secs(20), || {
        bk.state.visible.load(Ordering::SeqCst) >= last.0
    });
    assert_eq!(bk.state.database.load(Ordering::Acquire), a_id.to_wire());
    // Primary a goes; a new one, on an empty directory, takes its address.
    p.stop();
    a.close();
    let listener = std::net::TcpListener::bind(addr).unwrap();
    let (c, _, p2) = primary_on(&pc, listener);
    commit(&c, t, 100..250, b"c");
    let c_id = p2.database();
    wait_until("the backup to stop", Duration::from_secs(20), || bk.state.failure.lock().is_some());
    let why = bk.state.failure.lock().clone().unwrap();
    assert!(why.starts_with(OTHER_DATABASE), "{why}");
    assert!(why.contains(&a_id.to_string()) && why.contains(&c_id.to_string()), "{why}");
    // Nothing of c's was taken: the backup still reads a's keys and none of c's.
    assert_eq!(bk.state.received.load(Ordering::Acquire), last.0);
    {
        let r = bk.db.read();
        assert!((0..40u32).all(|k| r.get(t, &k.to_be_bytes()).unwrap().as_deref() == Some(&b"a"[..])));
        assert!((100..250u32).all(|k| r.get(t, &k.to_be_bytes()).unwrap().is_none()), "c's keys were taken");
    }
    assert!(p2.backups().is_empty(), "c kept a link to the backup: {:?}", p2.backups());
    let _ = bk.stop("done", Duration::from_secs(10));
    drop(bk);
    let kept = held(&pb, t);
    assert_eq!(kept.len(), 40);
    assert!(kept.iter().all(|(k, v)| *k < 40 && v == b"a"));
    assert_eq!(identity::read(&pb).unwrap(), Some(a_id));
    p2.stop();
    c.close();
}
