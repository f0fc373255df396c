//! A primary's engine that outlives its log (a switchover's old primary that follows the
//! new primary in place, docs/cluster.md): its log closed and the directory given up
//! (`Durable::close_and_release`), its own log sealed at the point (`sealed::seal_own_log`),
//! the same engine opened again as a primary of a later epoch (a promotion in place) takes
//! commits through the workers it had, into the new log, and a recovery finds them all.

use std::sync::Arc;
use std::time::Duration;

use ditto_engine::{Ts, WorkerId};
use ditto_log::storage::RealStorage;
use ditto_log::{Epoch, OpenOptions};

#[test]
fn an_engine_whose_log_was_released_commits_into_the_next_log() {
    let dir = tempfile::tempdir().unwrap();
    let d = ditto_log::open(dir.path(), OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let db = Arc::clone(d.db());
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..50u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), b"one")).unwrap().1.wait().unwrap();
    }
    let epoch = d.logger().epoch();
    d.close_and_release();
    assert!(d.checkpoint().is_err(), "no checkpoint once the directory is given up");
    assert_eq!(db.clock().visible_ts(), last);
    ditto_log::sealed::seal_own_log(dir.path(), last, &RealStorage).unwrap();
    drop(d);
    // Promoted in place later: the same engine, and the same worker, on a new log.
    let o = OpenOptions {
        workers: 1,
        epoch: Some(Epoch(epoch.0 + 2)),
        ts_above: Ts(last.0 + 3),
        recovered: Some(ditto_log::Recovered(Arc::clone(&db))),
        checkpoint_sealed: false,
        ..Default::default()
    };
    let d2 = ditto_log::open(dir.path(), o).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut newest = Ts::ZERO;
        for i in 50..80u32 {
            newest = w.run(|x| x.put(t, &i.to_be_bytes(), b"two")).unwrap().1.wait().unwrap();
        }
        tx.send(newest).unwrap();
    });
    let newest = rx.recv_timeout(Duration::from_secs(20)).expect("commits on the new log are made durable");
    assert!(newest > last);
    d2.close();
    drop(d2);
    let again = ditto_log::open(dir.path(), OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let r = again.db().read();
    for i in 0..80u32 {
        let want: &[u8] = if i < 50 { b"one" } else { b"two" };
        assert_eq!(r.get(t, &i.to_be_bytes()).unwrap().as_deref(), Some(want), "key {i}");
    }
}

/// A crash between `seal_own_log`'s two steps (its cut file written into `log/`, the rename
/// not done): a primary's open finishes the seal, opens a fresh log beside the link, and
/// recovers every commit.
#[test]
fn a_primary_open_finishes_a_seal_of_its_own_log_cut_short_by_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let d = ditto_log::open(dir.path(), OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..20u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.wait().unwrap();
    }
    drop(w);
    d.close();
    drop(d);
    let cut = dir.path().join("log").join(ditto_log::sealed::CUT_FILE);
    std::fs::write(&cut, ditto_log::sealed::encode_cut(last)).unwrap();
    let again = ditto_log::open(dir.path(), OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let r = again.db().read();
    for i in 0..20u32 {
        assert_eq!(r.get(t, &i.to_be_bytes()).unwrap().as_deref(), Some(&b"v"[..]), "key {i}");
    }
    let mut w = again.db().worker(WorkerId(0)).unwrap();
    w.run(|x| x.put(t, b"after", b"1")).unwrap().1.wait().unwrap();
}
