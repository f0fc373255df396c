//! A running backup whose primary can no longer resume it says so
//! (`Backup::needs_fresh_copy`), and a join with `BackupOptions::fresh_copy` brings it
//! back (real files and TCP); such a join cut short mid-copy (`JoinCancel`) leaves the
//! directory as it was. The server's use of both, between real processes, is tested in
//! crates/ditto/tests/replication_rejoin.rs.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::{Epoch, OpenOptions};
use ditto_replication::protocol::{read_frame, Frame, Start};
use ditto_replication::{backup, BackupError, BackupOptions, CommitPolicy, JoinCancel, Primary, PrimaryOptions};

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Replication of `d` under `local` on `listener`.
fn ship(d: &ditto_log::Durable, listener: std::net::TcpListener) -> Arc<Primary> {
    let policy = CommitPolicy::parse("local").unwrap();
    let opts = PrimaryOptions { backups_expected: 1, ..Default::default() };
    Primary::start(d, listener, opts, Box::new(move |h| ditto_replication::release_watermark(policy, h))).unwrap()
}

/// Commits keys `keys` to table `t`, one transaction each; the last commit's ts.
fn commit(d: &ditto_log::Durable, t: ditto_engine::TableId, keys: std::ops::Range<u32>) -> Ts {
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for k in keys {
        let (_, h) = w.run(|x| x.put(t, &k.to_be_bytes(), &k.to_le_bytes())).unwrap();
        last = last.max(h.wait().unwrap());
    }
    last
}

#[test]
fn a_backup_its_restarted_primary_cannot_resume_needs_a_fresh_copy_and_one_brings_it_back() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let p = ship(&a, listener);
    let bk = backup::start(BackupOptions::new(&addr.to_string(), &pb, 1, "b")).unwrap();
    let first = commit(&a, t, 0..100);
    wait_until("the backup to replay the first commits", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= first.0
    });
    assert!(!bk.needs_fresh_copy());
    // The primary stops and opens its directory again: a new epoch, whose log starts
    // above everything the backup holds, so it cannot be resumed from the log.
    p.stop();
    a.close();
    drop((p, a));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let p = ship(&a, std::net::TcpListener::bind(addr).unwrap());
    wait_until("the backup to say it needs a fresh copy", Duration::from_secs(30), || bk.needs_fresh_copy());
    assert!(bk.failure().unwrap().contains("needs a fresh copy"), "{:?}", bk.failure());
    let after = commit(&a, t, 100..150);
    bk.fence("joining again", Duration::from_secs(10)).unwrap();
    drop(bk);
    let bk = backup::start(BackupOptions { fresh_copy: true, ..BackupOptions::new(&addr.to_string(), &pb, 1, "b") })
        .unwrap();
    let last = commit(&a, t, 150..200).max(after);
    wait_until("the fresh copy to replay everything", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= last.0
    });
    let s = bk.db.read();
    for k in 0..200u32 {
        assert_eq!(s.get(t, &k.to_be_bytes()).unwrap().as_deref(), Some(&k.to_le_bytes()[..]), "key {k}");
    }
    assert!(!bk.needs_fresh_copy() && bk.failure().is_none());
    drop(p);
}

#[test]
fn a_fresh_join_cut_short_mid_copy_leaves_the_directory_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    // What a backup held: never loaded by a fresh join, and replaced only once its copy
    // is whole.
    let kept = [dir.join("checkpoints").join("ckpt-00000000000000000007"), dir.join("replica")];
    for d in &kept {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("held"), b"held").unwrap();
    }
    // A primary that starts sending a checkpoint and then goes quiet (a copy that takes
    // long: a fresh join reads it without a timeout).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (hello_tx, hello_rx) = std::sync::mpsc::channel();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let hello = read_frame(&mut s).unwrap();
        hello_tx.send(hello).unwrap();
        let welcome =
            Frame::Welcome { epoch: Epoch(3), streams: 1, tables: vec![], start: Start::Checkpoint { ts: Ts(9) } };
        s.write_all(&welcome.encode()).unwrap();
        let part = Frame::File { name: "part-0".into(), offset: 0, data: vec![1u8; 100].into(), last: false };
        s.write_all(&part.encode()).unwrap();
        // Held open until the backup's end of it is shut down.
        let mut buf = [0u8; 64];
        let _ = std::io::Read::read(&mut s, &mut buf);
    });
    let cancel = JoinCancel::default();
    let opts = BackupOptions {
        fresh_copy: true,
        cancel: Some(cancel.clone()),
        ..BackupOptions::new(&addr, &dir, 1, "b")
    };
    let (done_tx, done) = std::sync::mpsc::channel();
    let join = std::thread::spawn(move || done_tx.send(backup::start(opts).map(|_| ())).unwrap());
    let hello = hello_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    match hello {
        Some(Frame::Hello { epoch, have_ts, .. }) => {
            assert_eq!((epoch, have_ts), (Epoch(0), Ts::ZERO), "a fresh join asks for everything")
        }
        other => panic!("expected Hello, got {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(!join.is_finished(), "the copy should still be waiting for the quiet primary");
    let t = Instant::now();
    cancel.cancel();
    let r = done.recv_timeout(Duration::from_secs(5)).expect("the join did not end within 5 s of its cancel");
    assert!(matches!(r, Err(BackupError::Stopped)), "{r:?}");
    eprintln!("the join ended {:?} after its cancel", t.elapsed());
    join.join().unwrap();
    fake.join().unwrap();
    for d in &kept {
        assert_eq!(std::fs::read(d.join("held")).unwrap(), b"held", "{} changed", d.display());
    }
}
