//! A failover's promotion, with real files and TCP (docs/cluster.md): a backup's directory
//! cut at the recovery point becomes a primary of the next epoch whose timestamps start
//! above `start` (here above the point, as when a node held commits above it); another
//! backup, cut at the same point, resumes from the new primary's log without a checkpoint
//! copy, and receives what the new primary commits. (The regression: the new primary's
//! durable watermark stayed at the point while its clock stood at `start`, so a backup's
//! registration waited for a watermark no commit could move.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::storage::{RealStorage, Storage};
use ditto_log::{Epoch, OpenOptions};
use ditto_replication::{backup, BackupOptions, CommitPolicy, Primary, PrimaryOptions};

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn start_primary(d: &ditto_log::Durable, resume_from: Option<(Epoch, Ts, Ts)>) -> (Arc<Primary>, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let policy = CommitPolicy::parse("local").unwrap();
    let opts = PrimaryOptions { backups_expected: 2, resume_from, ..Default::default() };
    let p =
        Primary::start(d, listener, opts, Box::new(move |h| ditto_replication::release_watermark(policy, h))).unwrap();
    let p2 = Arc::clone(&p);
    d.logger().set_progress_listener(Box::new(move |_, _| p2.recompute())).unwrap();
    (p, addr)
}

#[test]
fn a_promoted_backup_starts_above_the_point_and_a_backup_cut_there_resumes_from_its_log() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, b2) = (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("b2"));
    // Epoch 1: primary A, backups B1 and B2.
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (pa_repl, a_addr) = start_primary(&a, None);
    let bk1 = backup::start(BackupOptions::new(&a_addr, &b1, 1, "b1")).unwrap();
    let bk2 = backup::start(BackupOptions::new(&a_addr, &b2, 1, "b2")).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..100u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), b"one")).unwrap().1.wait().unwrap();
    }
    for b in [&bk1, &bk2] {
        wait_until("the backups to hold epoch 1", Duration::from_secs(20), || {
            b.state.durable.load(std::sync::atomic::Ordering::SeqCst) >= last.0
        });
    }
    let epoch1 = a.logger().epoch();
    // The fence: both backups stop; A is gone.
    bk1.stop("fenced", Duration::from_secs(10)).unwrap();
    bk2.stop("fenced", Duration::from_secs(10)).unwrap();
    drop((bk1, bk2, w));
    pa_repl.stop();
    a.close();

    // The plan: point p = last, new timestamps above start = p + 7.
    let (p, start) = (last, Ts(last.0 + 7));
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    // B1 is promoted: its replica log cut at p becomes a checkpoint, then its own log opens
    // in epoch 2 above `start`.
    let opened = ditto_log::replica::open_replica_upto(&b1, 1, &storage, Some(p)).unwrap();
    assert_eq!(opened.cut, p);
    let ditto_log::replica::ReplicaOpen { db, lock, .. } = opened;
    drop(lock);
    std::fs::remove_dir_all(ditto_log::replica::replica_dir(&b1)).unwrap();
    // The engine replayed from the replica log becomes the primary's as it is (no second
    // load of the checkpoint it wrote); one that does not match the checkpoint is refused.
    let o = |recovered| OpenOptions {
        workers: 1,
        epoch: Some(Epoch(epoch1.0 + 1)),
        ts_above: start,
        recovered: Some(ditto_log::Recovered(recovered)),
        ..Default::default()
    };
    let other = ditto_engine::Database::new(ditto_engine::Options { workers: 1 });
    match ditto_log::open(&b1, o(other)) {
        Err(e) => assert!(e.to_string().contains("newest checkpoint is at ts"), "{e}"),
        Ok(_) => panic!("an engine that does not hold the checkpoint was taken"),
    }
    let bp = ditto_log::open(&b1, o(Arc::clone(&db))).unwrap();
    assert!(Arc::ptr_eq(bp.db(), &db), "the replayed engine is the primary's");
    assert_eq!(bp.recovery().checkpoint_rows, 0, "nothing loaded again");
    assert_eq!(bp.logger().epoch(), Epoch(epoch1.0 + 1));
    assert!(bp.logger().watermark() >= start, "the watermark covers the empty stretch up to start");
    let (bp_repl, bp_addr) = start_primary(&bp, Some((epoch1, p, start)));
    // B2, cut at p, follows B1: it resumes from the log (no checkpoint copy).
    let opts = BackupOptions { recover_upto: Some(p), ..BackupOptions::new(&bp_addr, &b2, 1, "b2") };
    let t0 = Instant::now();
    let bk2 = backup::start(opts).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "registration did not wait out its deadline");
    assert_eq!(
        bp_repl.checkpoints_sent.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "resumed from the log: no checkpoint was copied in"
    );
    let tb = bp.db().table_id("t").unwrap();
    let mut w = bp.db().worker(WorkerId(0)).unwrap();
    let mut newest = Ts::ZERO;
    for i in 0..50u32 {
        newest = w.run(|x| x.put(tb, &i.to_be_bytes(), b"two")).unwrap().1.wait().unwrap();
    }
    assert!(newest > start, "new commits are above start");
    wait_until("the resumed backup to see epoch 2's commits", Duration::from_secs(20), || {
        bk2.state.visible.load(std::sync::atomic::Ordering::SeqCst) >= newest.0
    });
    let r = bk2.db.read();
    let t2 = bk2.db.table_id("t").unwrap();
    for i in 0..100u32 {
        let want: &[u8] = if i < 50 { b"two" } else { b"one" };
        assert_eq!(r.get(t2, &i.to_be_bytes()).unwrap().as_deref(), Some(want), "row {i}");
    }
    bp_repl.stop();
}
