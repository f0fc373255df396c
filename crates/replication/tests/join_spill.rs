//! A backup's join whose checkpoint copy takes longer than the primary's live queue holds
//! at its write rate. Before, the link was dropped when the queue passed its bound, and
//! the backup, holding nothing until its copy is whole, was sent a copy again from scratch,
//! for ever under a steady write rate. Now the queue spills: the primary keeps the log
//! above the join's start on disk and sends what the queue dropped after the copy
//! (`Primary::catch_up`), unless the bound on the log kept for backups took it meanwhile,
//! when the link ends saying so and the backup starts again from what it holds.
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{noise_from, start_primary, wait_until};
use ditto_engine::{Ts, WorkerId};
use ditto_log::LogOptions;
use ditto_replication::{backup, BackupOptions, JoinAgain, PrimaryOptions};

/// A loopback proxy to `upstream`. Its first connection, once 64 KiB of what the primary
/// sends passed (the welcome, the copy's start), reads no more of it while `stall` is set
/// (so the primary's writes to it block once the sockets' buffers are full); the others,
/// and that one once `stall` is cleared, pass everything.
fn stalling_proxy(upstream: String, stall: Arc<AtomicBool>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let conns = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(down) = c else { continue };
            let Ok(up) = TcpStream::connect(&upstream) else { continue };
            let first = conns.fetch_add(1, Ordering::SeqCst) == 0;
            let pass = |mut from: TcpStream, mut to: TcpStream, stall: Option<Arc<AtomicBool>>| {
                std::thread::spawn(move || {
                    let mut b = vec![0u8; 1 << 16];
                    let mut passed = 0;
                    loop {
                        if passed >= b.len() && stall.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                            std::thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        // (Up to 64 KiB exactly, then whole buffers.)
                        let room = if stall.is_some() && passed < b.len() { b.len() - passed } else { b.len() };
                        match from.read(&mut b[..room]) {
                            Ok(0) | Err(_) => break,
                            Ok(n) if to.write_all(&b[..n]).is_ok() => passed += n,
                            Ok(_) => break,
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Both);
                    let _ = from.shutdown(std::net::Shutdown::Both);
                });
            };
            pass(down.try_clone().unwrap(), up.try_clone().unwrap(), None);
            pass(up, down, first.then(|| Arc::clone(&stall)));
        }
    });
    addr
}

/// A primary whose live queue holds 256 KiB and whose log segments are 256 KiB, with
/// about 24 MiB of rows (more than loopback's socket buffers hold, so a stalled copy
/// blocks the link's thread), then a backup joining through a proxy that stalls its copy
/// while 2 MiB of log is written and a checkpoint is taken. Returns (the primary's copies
/// sent, fresh copies the backup was told to join again with, catch-ups) once the backup
/// holds every row.
fn join_under_writes(keep_for_backups_max_bytes: u64) -> (u64, u64, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let log = LogOptions { segment_bytes_max: 256 << 10, keep_for_backups_max_bytes, ..Default::default() };
    let opts = PrimaryOptions { backups_expected: 1, queue_bytes_max: 256 << 10, ..Default::default() };
    let (a, t, p, addr) = start_primary(&pa, log, "local", opts);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut noise = noise_from(0x2545_f491_4f6c_dd1d);
    let mut rows = Vec::new();
    let mut last = Ts::ZERO;
    let mut commit_to = |t: ditto_engine::TableId, from: u32, to: u32, size: usize, rows: &mut Vec<(u32, Vec<u8>)>| {
        let mut pending = Vec::new();
        for i in from..to {
            let v = noise(size);
            pending.push(w.run(|x| x.put(t, &i.to_be_bytes(), &v)).unwrap().1);
            rows.push((i, v));
        }
        for h in pending {
            last = last.max(h.wait().unwrap());
        }
    };
    commit_to(t, 0, 384, 64 << 10, &mut rows);
    let stall = Arc::new(AtomicBool::new(true));
    let px = stalling_proxy(addr, Arc::clone(&stall));
    // (Its start returns once the copy is in place.)
    let (px2, pb2) = (px.clone(), pb.clone());
    let starting = std::thread::spawn(move || backup::start(BackupOptions::new(&px2, &pb2, 1, "b")).unwrap());
    wait_until("the copy to start", Duration::from_secs(30), || p.checkpoints_sent.load(Ordering::SeqCst) == 1);
    // Eight times the queue, in 4 KiB rows, while the copy cannot move; then a checkpoint,
    // which deletes the segments below it that nothing keeps.
    commit_to(t, 1000, 1512, 4 << 10, &mut rows);
    // A table created meanwhile: its frame is dropped with the rest, and the catch-up
    // names it before the writes to it.
    let t2 = a.db().create_table("t2").unwrap();
    let mut rows2 = Vec::new();
    commit_to(t2, 0, 16, 100, &mut rows2);
    a.checkpoint().unwrap();
    commit_to(t, 2000, 2064, 4 << 10, &mut rows);
    std::thread::sleep(Duration::from_millis(300));
    // Its state says where its start is, and how much of the copy went.
    let b = p.backups().into_iter().next().expect("the backup's link");
    assert_eq!(b.state, "send_bulk");
    assert!(b.copy_total_bytes > 24 << 20 && b.copy_sent_bytes < b.copy_total_bytes, "{b:?}");
    stall.store(false, Ordering::SeqCst);
    let mut bk = starting.join().unwrap();
    // And more while it catches up, and after.
    commit_to(t, 3000, 3064, 4 << 10, &mut rows);
    // A backup whose primary could not send what it missed is told to join again with a
    // fresh copy (`JoinAgain::Copy`), as a server does then.
    wait_until("the backup to replay everything, or to need a copy", Duration::from_secs(60), || {
        bk.state.visible.load(Ordering::SeqCst) >= last.0 || bk.join_again().is_some() || bk.failure().is_some()
    });
    let mut copies_asked = 0;
    if let Some(again) = bk.join_again() {
        assert_eq!(again, JoinAgain::Copy, "{:?}", bk.failure());
        copies_asked += 1;
        bk.fence("joining again", Duration::from_secs(10)).unwrap();
        bk.release();
        bk = backup::start(BackupOptions { fresh_copy: true, ..BackupOptions::new(&px, &pb, 1, "b") }).unwrap();
        wait_until("the fresh copy to replay everything", Duration::from_secs(60), || {
            bk.state.visible.load(Ordering::SeqCst) >= last.0
        });
    }
    assert!(bk.join_again().is_none() && bk.failure().is_none(), "{:?}", bk.failure());
    wait_until("the link to be live", Duration::from_secs(10), || {
        p.backups().iter().any(|b| b.state == "online" && b.copy_sent_bytes == b.copy_total_bytes)
    });
    let r = bk.db.read();
    let tb = bk.db.table_id("t").unwrap();
    for (k, v) in &rows {
        assert_eq!(r.get(tb, &k.to_be_bytes()).unwrap().as_deref(), Some(&v[..]), "key {k} on the backup");
    }
    let tb2 = bk.db.table_id("t2").expect("the table made during the copy");
    for (k, v) in &rows2 {
        assert_eq!(r.get(tb2, &k.to_be_bytes()).unwrap().as_deref(), Some(&v[..]), "key {k} of t2 on the backup");
    }
    drop(r);
    let figures = (p.checkpoints_sent.load(Ordering::SeqCst), copies_asked, p.catch_up_rounds.load(Ordering::SeqCst));
    bk.stop("done", Duration::from_secs(10)).unwrap();
    drop(w);
    p.stop();
    a.close();
    figures
}

#[test]
fn a_copy_longer_than_the_queue_holds_is_followed_by_the_log_it_missed_not_sent_again() {
    let (copies, asked, caught_up) = join_under_writes(1 << 30);
    assert_eq!((copies, asked), (1, 0), "one copy");
    assert!(caught_up >= 1, "the queue spilled and was caught up from disk: {caught_up}");
}

#[test]
fn a_copy_whose_missed_log_went_past_the_kept_bound_is_sent_again_and_nothing_is_lost() {
    // The checkpoint during the stalled copy keeps at most 64 KiB of log for it: the
    // segments it missed are deleted, so the catch-up cannot be sent and the link ends;
    // the backup, holding the copy, finds the log above it gone, and joins again.
    let (copies, asked, caught_up) = join_under_writes(64 << 10);
    // (Three: the first, one the primary starts when the backup comes back, which a running
    // backup does not take, and the fresh one it joins again with.)
    assert_eq!(asked, 1, "joined again once");
    assert!(copies >= 2, "the copy sent again: {copies}");
    assert!(caught_up >= 1, "{caught_up}");
}

#[test]
fn a_joining_backup_that_reads_nothing_of_its_copy_is_given_up_and_its_name_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let opts = PrimaryOptions {
        backups_expected: 1,
        queue_bytes_max: 256 << 10,
        start_stall_max: Duration::from_secs(2),
        ..Default::default()
    };
    let (a, t, p, addr) = start_primary(&pa, LogOptions::default(), "local", opts);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut noise = noise_from(0x9e37_79b9_7f4a_7c15);
    let mut last = Ts::ZERO;
    for i in 0..384u32 {
        last = last.max(w.run(|x| x.put(t, &i.to_be_bytes(), &noise(64 << 10))).unwrap().1.wait().unwrap());
    }
    // A backup that says hello and then reads nothing: the copy fills the sockets' buffers
    // and the primary's write waits on it; its queue spills, so only the stall ends it.
    let mut mute = TcpStream::connect(&addr).unwrap();
    let hello = ditto_replication::protocol::Frame::Hello {
        version: ditto_replication::protocol::PROTOCOL_VERSION,
        epoch: a.logger().epoch(),
        have_ts: Ts::ZERO,
        node: "b".into(),
        learner: false,
        proves: None,
        database: 0,
        run: 0,
    };
    mute.write_all(&hello.encode()).unwrap();
    wait_until("the copy to start", Duration::from_secs(30), || p.checkpoints_sent.load(Ordering::SeqCst) == 1);
    for i in 1000..1512u32 {
        last = last.max(w.run(|x| x.put(t, &i.to_be_bytes(), &noise(4 << 10))).unwrap().1.wait().unwrap());
    }
    wait_until("the mute link to be given up", Duration::from_secs(30), || p.backups().is_empty());
    assert_eq!(p.log_needed_above(Ts::ZERO), Ts(u64::MAX), "nothing kept for it any more");
    // Its name is free: a backup of that name joins and holds everything.
    let bk = backup::start(BackupOptions::new(&addr, &pb, 1, "b")).unwrap();
    wait_until("the backup to replay everything", Duration::from_secs(60), || {
        bk.state.visible.load(Ordering::SeqCst) >= last.0
    });
    assert_eq!(p.checkpoints_sent.load(Ordering::SeqCst), 2);
    bk.stop("done", Duration::from_secs(10)).unwrap();
    drop((w, mute));
    p.stop();
    a.close();
}

/// A backup joining while a recent checkpoint would do, but the log above it cannot be
/// read whole (a damaged segment): it is sent a checkpoint written for it, as a resumed
/// backup is, and joins with every row; no directory of hard links is left behind (before,
/// the join failed, every try again the same way, each leaving its `ship-*` directory
/// pinning the checkpoint's files).
#[test]
fn a_join_whose_log_above_the_recent_checkpoint_is_damaged_gets_a_fresh_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let log = LogOptions { segment_bytes_max: 64 << 10, ..Default::default() };
    let (a, t, p, addr) = start_primary(&pa, log, "local", PrimaryOptions::default());
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut noise = noise_from(0x9e37_79b9_7f4a_7c15);
    let mut rows = Vec::new();
    let mut put = |from: u32, to: u32, size: usize, rows: &mut Vec<(u32, Vec<u8>)>| {
        for i in from..to {
            let v = noise(size);
            w.run(|x| x.put(t, &i.to_be_bytes(), &v)).unwrap().1.wait().unwrap();
            rows.push((i, v));
        }
    };
    put(0, 128, 32 << 10, &mut rows); // a 4 MiB checkpoint
    a.checkpoint().unwrap();
    put(1000, 1128, 4 << 10, &mut rows); // 512 KiB of log above it: eight segments
    let mut segs: Vec<_> = std::fs::read_dir(pa.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    assert!(segs.len() >= 3, "{segs:?}");
    // A byte in the middle of the oldest (closed) segment.
    let mut bytes = std::fs::read(&segs[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&segs[0], &bytes).unwrap();
    let bk = backup::start(BackupOptions::new(&addr, &pb, 1, "b")).unwrap();
    wait_until("the backup to replay everything", Duration::from_secs(60), || {
        rows.iter().all(|(k, v)| {
            let tb = bk.db.table_id("t").unwrap();
            bk.db.read().get(tb, &k.to_be_bytes()).unwrap().as_deref() == Some(&v[..])
        })
    });
    assert_eq!(p.checkpoints_sent.load(Ordering::SeqCst), 1);
    let ship: Vec<_> = std::fs::read_dir(&pa)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ship-"))
        .collect();
    assert!(ship.is_empty(), "directories of hard links left: {ship:?}");
    bk.stop("done", Duration::from_secs(10)).unwrap();
    drop(w);
    p.stop();
}
