//! A running backup whose primary can no longer resume it says how it may join again
//! (`Backup::join_again`): with a fresh copy (`BackupOptions::fresh_copy`), which brings
//! it back, and which, cut short mid-copy (`JoinCancel`), leaves the directory as it
//! was; or, when the primary restarted into a new epoch below what the backup holds, cut
//! at the primary's point and resumed from the log (`JoinAgain::CutAt`), the commits the
//! primary lost gone from the backup too (real files and TCP). The server's use of both, between real processes, is tested in
//! crates/ditto/tests/replication_rejoin.rs.

mod common;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::{Epoch, OpenOptions};
use ditto_replication::protocol::{read_frame, Frame, Start};
use ditto_replication::{
    backup, BackupError, BackupOptions, CommitPolicy, JoinAgain, JoinCancel, Primary, PrimaryOptions,
};

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Replication of `d` under `local` on `listener`.
fn ship(d: &ditto_log::Durable, listener: std::net::TcpListener) -> Arc<Primary> {
    ship_under(d, listener, "local", None, None)
}

/// Replication of `d` under `policy` on `listener`, one backup expected.
fn ship_under(
    d: &ditto_log::Durable,
    listener: std::net::TcpListener,
    policy: &str,
    resume_from: Option<(Epoch, Ts, Ts)>,
    acknowledged: Option<Arc<std::sync::atomic::AtomicU64>>,
) -> Arc<Primary> {
    ship_telling(d, listener, policy, resume_from, acknowledged, Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)))
}

/// `ship_under`, but the release the backups are told of (in batches and heartbeats)
/// stops at `tell_upto`: as if the primary acknowledged commits to clients and died
/// before it said so.
fn ship_telling(
    d: &ditto_log::Durable,
    listener: std::net::TcpListener,
    policy: &str,
    resume_from: Option<(Epoch, Ts, Ts)>,
    acknowledged: Option<Arc<std::sync::atomic::AtomicU64>>,
    tell_upto: Arc<std::sync::atomic::AtomicU64>,
) -> Arc<Primary> {
    let policy = CommitPolicy::parse(policy).unwrap();
    // (A restart waits, as a server's does where its record counts backups: what the
    // backups' Hellos said is kept for `heard_since_restart` only then.)
    let opts = PrimaryOptions {
        backups_expected: 1,
        restart_wait: resume_from.is_some(),
        resume_from,
        acknowledged,
        policy: Some(policy),
        ..Default::default()
    };
    let on_change = Box::new(move |h: &ditto_replication::Holdings| {
        let w = ditto_replication::release_watermark(policy, h);
        w.min(Ts(tell_upto.load(std::sync::atomic::Ordering::Acquire)))
    });
    Primary::start(d, listener, opts, on_change).unwrap()
}

/// A primary on `pa` (one stream, table `t`, shipping under `local` on a free port) and
/// its backup on `pb` replaying in `replay` mode.
fn primary_and_backup(
    pa: &std::path::Path,
    pb: &std::path::Path,
    replay: ditto_replication::ReplayMode,
) -> (ditto_log::Durable, ditto_engine::TableId, std::net::SocketAddr, Arc<Primary>, ditto_replication::Backup) {
    let a = ditto_log::open(pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap();
    let p = ship(&a, listener);
    let bk = backup::start(BackupOptions { replay, ..BackupOptions::new(&addr.to_string(), pb, 1, "b") }).unwrap();
    (a, t, addr, p, bk)
}

/// Commits keys `keys` to table `t`, one transaction each; the last commit's ts.
fn commit(d: &ditto_log::Durable, t: ditto_engine::TableId, keys: std::ops::Range<u32>) -> Ts {
    commit_on(d, t, 0, keys)
}

/// `commit` on worker `worker` (its log stream).
fn commit_on(d: &ditto_log::Durable, t: ditto_engine::TableId, worker: u32, keys: std::ops::Range<u32>) -> Ts {
    let mut w = d.db().worker(WorkerId(worker)).unwrap();
    let mut last = Ts::ZERO;
    for k in keys {
        let (_, h) = w.run(|x| x.put(t, &k.to_be_bytes(), &k.to_le_bytes())).unwrap();
        last = last.max(h.wait().unwrap());
    }
    last
}

#[test]
fn a_backup_its_restarted_primary_cannot_resume_needs_a_fresh_copy_and_one_brings_it_back() {
    copy_brings_it_back(ditto_replication::ReplayMode::Parallel);
}

#[test]
fn the_same_with_serial_and_dependency_replay_whose_threads_end_too() {
    copy_brings_it_back(ditto_replication::ReplayMode::Serial);
    copy_brings_it_back(ditto_replication::ReplayMode::parse("dependency").unwrap());
}

fn copy_brings_it_back(replay: ditto_replication::ReplayMode) {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a, t, addr, p, bk) = primary_and_backup(&pa, &pb, replay);
    let first = commit(&a, t, 0..100);
    wait_until("the backup to replay the first commits", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= first.0
    });
    assert_eq!(bk.join_again(), None);
    // The primary stops and opens its directory again: a new epoch, whose log starts
    // above everything the backup holds, so it cannot be resumed from the log.
    // (The lock is given up here: a link thread the stop killed may still hold the
    // database for a moment, and the open below failed with `InUse` once in CI.)
    p.stop();
    a.close_and_release();
    drop((p, a));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let p = ship(&a, std::net::TcpListener::bind(addr).unwrap());
    // (Started without `resume_from`, the primary cannot resume it at all: a copy.)
    wait_until("the backup to say it needs a fresh copy", Duration::from_secs(30), || bk.join_again().is_some());
    assert_eq!(bk.join_again(), Some(JoinAgain::Copy));
    assert!(bk.failure().unwrap().contains("needs a fresh copy"), "{:?}", bk.failure());
    let after = commit(&a, t, 100..150);
    bk.fence("joining again", Duration::from_secs(10)).unwrap();
    // Let go, its replay threads and checkpointer end, and with them their hold on its
    // database (before `release`, the replayers kept it for good: one more database in
    // memory at every rejoin).
    let old_db = Arc::downgrade(&bk.db);
    bk.release();
    wait_until("the old database to be freed", Duration::from_secs(5), || old_db.upgrade().is_none());
    let bk =
        backup::start(BackupOptions { fresh_copy: true, replay, ..BackupOptions::new(&addr.to_string(), &pb, 1, "b") })
            .unwrap();
    let last = commit(&a, t, 150..200).max(after);
    wait_until("the fresh copy to replay everything", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= last.0
    });
    let s = bk.db.read();
    for k in 0..200u32 {
        assert_eq!(s.get(t, &k.to_be_bytes()).unwrap().as_deref(), Some(&k.to_le_bytes()[..]), "key {k}");
    }
    assert!(bk.join_again().is_none() && bk.failure().is_none());
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
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap().to_string();
    let (hello_tx, hello_rx) = std::sync::mpsc::channel();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let hello = read_frame(&mut s).unwrap();
        hello_tx.send(hello).unwrap();
        let welcome = Frame::Welcome {
            epoch: Epoch(3),
            streams: 1,
            tables: vec![],
            start: Start::Checkpoint { ts: Ts(9), bytes: 0 },
            database: 0,
            run: 0,
        };
        s.write_all(&welcome.encode()).unwrap();
        let part = Frame::File { name: "part-0000.dat".into(), offset: 0, data: vec![1u8; 100].into(), last: false };
        s.write_all(&part.encode()).unwrap();
        // Held open until the backup's end of it is shut down.
        let mut buf = [0u8; 64];
        let _ = std::io::Read::read(&mut s, &mut buf);
    });
    let cancel = JoinCancel::default();
    let opts =
        BackupOptions { fresh_copy: true, cancel: Some(cancel.clone()), ..BackupOptions::new(&addr, &dir, 1, "b") };
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

/// A checkpoint copy that is not whole or not right is refused before anything the backup
/// held is moved aside: a part damaged on the primary's disk (its checksum is not its
/// MANIFEST's), a copy that ends before its MANIFEST or before a file's last piece, a piece
/// at the wrong offset, a file name that is not a checkpoint's, an end at another
/// timestamp than the welcome's. Each is answered with an error saying so, and the
/// directory holds what it held. (Before, the copy was moved into place first and checked
/// by the open, after the backup's own data had gone.) The whole copy is taken.
#[test]
fn a_checkpoint_copy_that_is_not_whole_or_not_right_is_refused_and_the_directory_kept() {
    let tmp = tempfile::tempdir().unwrap();
    // A real checkpoint, its files as the primary sends them.
    let d = ditto_log::open(&tmp.path().join("p"), OpenOptions { workers: 1, progress: false, ..Default::default() })
        .unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    w.run(|x| (0..2000u32).try_for_each(|k| x.put(t, &k.to_be_bytes(), &[7u8; 300]).map(|_| ())))
        .unwrap()
        .1
        .wait()
        .unwrap();
    let info = d.checkpoint().unwrap();
    assert!(info.parts >= 1);
    let files: Vec<(String, Vec<u8>)> = (0..info.parts)
        .map(ditto_log::checkpoint::part_name)
        .chain(["MANIFEST".to_string()])
        .map(|n| (n.clone(), std::fs::read(info.dir.join(&n)).unwrap()))
        .collect();
    let pieces = |files: &[(String, Vec<u8>)]| -> Vec<Frame> {
        files
            .iter()
            .flat_map(|(name, b)| {
                let n = b.chunks(64 << 10).count();
                b.chunks(64 << 10).enumerate().map(move |(i, c)| Frame::File {
                    name: name.clone(),
                    offset: (i * (64 << 10)) as u64,
                    data: c.to_vec().into(),
                    last: i + 1 == n,
                })
            })
            .collect()
    };
    let done = Frame::CheckpointDone { ts: info.ts };
    let whole = [pieces(&files), vec![done.clone()]].concat();
    let mut damaged = files.clone();
    let mid = damaged[0].1.len() / 2;
    damaged[0].1[mid] ^= 0x40;
    let mut gap = whole.clone();
    if let Frame::File { offset, .. } = &mut gap[1] {
        *offset += 1;
    }
    let named = |name: &str| {
        [vec![Frame::File { name: name.into(), offset: 0, data: vec![1u8; 10].into(), last: true }], whole.clone()]
            .concat()
    };
    // The MANIFEST's last piece not marked so: the copy ends with a file open.
    let cut_short = whole.iter().map(|f| match f {
        Frame::File { name, offset, data, last: true } if name == "MANIFEST" => {
            Frame::File { name: name.clone(), offset: *offset, data: data.clone(), last: false }
        }
        f => f.clone(),
    });
    // Rows its load would refuse, the part's and the manifest's checksums made to agree (a
    // primary's bug, not damage on the way): a table the welcome does not name, a record
    // id past the limit, the last row's key running past the part. (Row 0 begins after the
    // part's 32-byte header: its table, record id, timestamp and key length; rows are 24 +
    // 4 + 4 + 300 bytes.)
    let row0 = 32;
    let last = row0 + 1999 * 332;
    let other_table = rewritten(&files, |b| b[row0..row0 + 4].copy_from_slice(&5u32.to_le_bytes()));
    let far_record = rewritten(&files, |b| {
        b[row0 + 4..row0 + 12].copy_from_slice(&ditto_engine::RECORDS_PER_TABLE_MAX.to_le_bytes())
    });
    let long_key = rewritten(&files, |b| b[last + 20..last + 24].copy_from_slice(&1000u32.to_le_bytes()));
    let cases: Vec<(&str, Vec<Frame>, &str)> = vec![
        ("a damaged part", [pieces(&damaged), vec![done.clone()]].concat(), "another checksum"),
        ("a table not named", [pieces(&other_table), vec![done.clone()]].concat(), "does not name"),
        ("a record id past the limit", [pieces(&far_record), vec![done.clone()]].concat(), "record id limit"),
        ("a row key past the part", [pieces(&long_key), vec![done.clone()]].concat(), "runs past"),
        ("no MANIFEST", [pieces(&files[..files.len() - 1]), vec![done.clone()]].concat(), "no MANIFEST"),
        ("a file cut short", cut_short.collect(), "cut short"),
        ("a piece at the wrong offset", gap, "where"),
        ("a path", named("../escape"), "a file named"),
        ("another name", named("notes.txt"), "a file named"),
        (
            "another timestamp",
            [pieces(&files), vec![Frame::CheckpointDone { ts: Ts(info.ts.0 + 1) }]].concat(),
            "ended at ts",
        ),
    ];
    for (i, (case, frames, says)) in cases.into_iter().enumerate() {
        let dir = tmp.path().join(format!("b{i}"));
        let kept = [dir.join("checkpoints").join("ckpt-00000000000000000007"), dir.join("replica")];
        for k in &kept {
            std::fs::create_dir_all(k).unwrap();
            std::fs::write(k.join("held"), b"held").unwrap();
        }
        let r = fake_copy(&dir, info.ts, frames, None, 0, t_alone());
        match r {
            Err(BackupError::Protocol(e)) => assert!(e.contains(says), "{case}: {e}"),
            other => panic!("{case}: {other:?}"),
        }
        for k in &kept {
            assert_eq!(std::fs::read(k.join("held")).unwrap(), b"held", "{case}: {} changed", k.display());
        }
    }
    // The whole copy is taken: in place, the backup's own data moved aside.
    let dir = tmp.path().join("whole");
    let cancel = JoinCancel::default();
    let r = fake_copy(&dir, info.ts, whole.clone(), Some(cancel), 0, t_alone());
    // (Opened and following by then, or cancelled while it opened.)
    assert!(matches!(r, Ok(()) | Err(BackupError::Stopped)), "{r:?}");
    let ckpt = dir.join("checkpoints").join(format!("ckpt-{:020}", info.ts.0));
    assert!(ckpt.join("MANIFEST").exists(), "the whole copy in place");
    // A welcome that comes 7 s after the hello, the primary saying every second that it is
    // writing the checkpoint: the backup waits for it on the same connection (before, it
    // gave the connection up after 5 s of silence, and asked again).
    let dir = tmp.path().join("slow");
    let r = fake_copy(&dir, info.ts, whole, Some(JoinCancel::default()), 7, t_alone());
    assert!(matches!(r, Ok(()) | Err(BackupError::Stopped)), "{r:?}");
    let ckpt = dir.join("checkpoints").join(format!("ckpt-{:020}", info.ts.0));
    assert!(ckpt.join("MANIFEST").exists(), "the copy after a slow welcome in place");
}

/// `files` (a checkpoint's parts, then its MANIFEST) with `f` applied to the first part,
/// and the part's checksum in the MANIFEST (and the MANIFEST's own) made to agree.
fn rewritten(files: &[(String, Vec<u8>)], f: impl FnOnce(&mut Vec<u8>)) -> Vec<(String, Vec<u8>)> {
    let mut files = files.to_vec();
    f(&mut files[0].1);
    let (name, manifest) = files.last().unwrap();
    assert_eq!(name, "MANIFEST");
    let mut m = ditto_log::checkpoint::Manifest::decode(manifest, std::path::Path::new("MANIFEST")).unwrap();
    m.parts[0].crc = crc32c::crc32c(&files[0].1);
    files.last_mut().unwrap().1 = m.encode();
    files
}

/// The tables of the primary `fake_copy` fakes, most often: table 0, "t".
fn t_alone() -> Vec<(u32, String)> {
    vec![(0, "t".into())]
}

/// A backup joining afresh a fake primary at `addr` that welcomes it with a checkpoint at
/// `ts` of `tables` and sends `frames`, then holds the connection; `cancel`, if given, is cancelled
/// once the frames are sent (after a moment to take them). What the join ended with.
fn fake_copy(
    dir: &std::path::Path,
    ts: Ts,
    frames: Vec<Frame>,
    cancel: Option<JoinCancel>,
    beats: u32,
    tables: Vec<(u32, String)>,
) -> Result<(), BackupError> {
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap().to_string();
    let (sent_tx, sent) = std::sync::mpsc::channel();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _hello = read_frame(&mut s).unwrap();
        // A primary writing the checkpoint it will send says so every second.
        for _ in 0..beats {
            std::thread::sleep(Duration::from_secs(1));
            let beat = Frame::Heartbeat { released: Ts::ZERO, acknowledged: Ts::ZERO, sent_us: 0 };
            if s.write_all(&beat.encode()).is_err() {
                return;
            }
        }
        let welcome = Frame::Welcome {
            epoch: Epoch(3),
            streams: 1,
            tables,
            start: Start::Checkpoint { ts, bytes: 0 },
            database: 0,
            run: 0,
        };
        let _ = s.write_all(&welcome.encode());
        for f in frames {
            if s.write_all(&f.encode()).is_err() {
                break;
            }
        }
        let _ = sent_tx.send(());
        // Held until the backup ends it, or 3 s.
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 64];
        while matches!(std::io::Read::read(&mut s, &mut buf), Ok(n) if n > 0) {}
    });
    let opts = BackupOptions { fresh_copy: true, cancel: cancel.clone(), ..BackupOptions::new(&addr, dir, 1, "b") };
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || done_tx.send(backup::start(opts).map(|_| ())).unwrap());
    sent.recv_timeout(Duration::from_secs(30)).expect("the fake primary sent its frames");
    if let Some(c) = cancel {
        std::thread::sleep(Duration::from_millis(500));
        c.cancel();
    }
    let r = done.recv_timeout(Duration::from_secs(30)).expect("the join ended");
    fake.join().unwrap();
    r
}

/// Copies directory `from` to `to`, files as they are on disk now.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

#[test]
fn a_backup_holding_more_than_its_restarted_primary_is_cut_at_its_point_and_resumed_from_the_log() {
    primary_restarts_without_commits_the_backup_holds("local", Acked::No);
}

#[test]
fn a_backup_holding_acknowledged_commits_its_restarted_primary_lost_keeps_them_and_stays_stopped() {
    primary_restarts_without_commits_the_backup_holds("majority-received", Acked::Released);
}

/// The same under `local`, but with the lost commits acknowledged under another policy
/// than the server's (a connection's `DITTO.POLICY majority-received`): the release
/// watermark does not cover them, the acknowledged one (`Frame::Heartbeat`) does.
#[test]
fn commits_acknowledged_under_a_connections_own_policy_are_kept_too() {
    primary_restarts_without_commits_the_backup_holds("local", Acked::ByAConnection);
}

/// The same under `majority-received`, but the primary dies before it tells the backup
/// they were released (a millisecond's window: the release follows the backup's
/// acknowledgement, the word of it the next frame): the backup received them `counted`,
/// so it knows its acknowledgement may have released them, and keeps them all the same.
#[test]
fn commits_released_on_this_backups_acknowledgement_are_kept_before_it_hears_so() {
    primary_restarts_without_commits_the_backup_holds("majority-received", Acked::Unheard);
}

/// The same, but the backup restarts (a crash, an upgrade) after it acknowledged them and
/// before the primary dies: its new process resumes from its directory, told nothing of
/// the release, and has received nothing `counted`. It keeps them all the same, as a
/// backup told to cut at its join does (before 2026-12-03 it was cut). A resume waits for
/// the primary's log to hold what the backup has, so only a primary restarted from a disk
/// that lost synced writes (or an older copy of its directory) lacks them then.
#[test]
fn commits_released_on_the_acknowledgement_of_a_backups_last_process_are_kept_too() {
    primary_restarts_without_commits_the_backup_holds("majority-received", Acked::UnheardAcrossItsRestart);
}

#[test]
fn a_backup_holding_acknowledged_commits_keeps_them_where_the_restarted_log_cannot_be_read() {
    primary_restarts_without_commits_the_backup_holds("majority-received", Acked::ReleasedAndTheLogUnreadable);
}

/// Under `majority-durable` with one backup the primary's own fsync is needed for every
/// release: nothing above its disk's point was acknowledged, the batches are not marked
/// `counted`, and the backup is cut there (found by review: every batch was marked under
/// any policy but `local`, and such a backup stayed stopped after every crash under load).
#[test]
fn under_majority_durable_with_one_backup_what_the_primary_lost_is_cut() {
    primary_restarts_without_commits_the_backup_holds("majority-durable", Acked::No);
}

/// A cluster's backup takes no account of `counted`: a failover's point lies above every
/// commit acknowledged, and it is cut there.
#[test]
fn a_clusters_backup_is_cut_whatever_it_received_counted() {
    primary_restarts_without_commits_the_backup_holds("majority-received", Acked::UnheardInACluster);
}

/// How the commits the primary will lose were acknowledged to their clients, and what
/// the backup was told of it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Acked {
    /// Not at all (`local`, the primary's disk stalled).
    No,
    /// As `Released`, but the restarted primary's log cannot be read (a damaged segment
    /// header), so it cannot resume the backup after a cut: it tells it to cut all the
    /// same, and the backup keeps what it knows was acknowledged (before 2026-12-03 it was
    /// sent a copy at once, which discarded them, and its next hello counted as clear).
    ReleasedAndTheLogUnreadable,
    /// By the server's policy; the backup was told (the release watermark).
    Released,
    /// By a connection's own policy; the backup was told (`Frame::Heartbeat::acknowledged`).
    ByAConnection,
    /// By the server's policy, on this backup's acknowledgement; the backup was not told.
    Unheard,
    /// As `Unheard`, and the backup restarted before the primary died.
    UnheardAcrossItsRestart,
    /// As `Unheard`, but the backup is a cluster's (what it received above a failover's
    /// point was never acknowledged there): it is cut, as under `No`.
    UnheardInACluster,
}

/// A primary under `policy` with two log streams ships 50 commits, all on one stream,
/// that its stalled disk never makes durable, then restarts from its directory as the
/// disk holds it. The backup then holds that stream above its watermark: without the cut,
/// it would take the new epoch's transactions of that stream at or below what it holds
/// for ones it has, and skip them. Under `local` none of them was
/// acknowledged: the backup is cut at the restart point and resumed from the log. Under
/// `majority-received` all were (the backup had them): it keeps them and stays stopped.
fn primary_restarts_without_commits_the_backup_holds(policy: &str, how: Acked) {
    // A cluster's backup cuts what it received above a failover's point, which lies
    // above every commit acknowledged (`keep_what_the_primary_lost` off).
    let cluster = how == Acked::UnheardInACluster;
    let acked = how != Acked::No && !cluster;
    let acked_by_a_connection = how == Acked::ByAConnection;
    let tell_upto = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let acknowledged = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb, pc) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("a-after"));
    let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut o = OpenOptions { workers: 2, ..Default::default() };
    o.log.storage = Arc::new(ditto_log::storage::StallingStorage { stalled: Arc::clone(&stalled) });
    let a = ditto_log::open(&pa, o).unwrap();
    // Dropped before `a` (a failed check included): its stalled writes then end at once.
    let _unstall = Unstall(Arc::clone(&stalled));
    let t = a.db().create_table("t").unwrap();
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap();
    let p = ship_telling(&a, listener, policy, None, Some(Arc::clone(&acknowledged)), Arc::clone(&tell_upto));
    let bk = backup::start(BackupOptions {
        keep_what_the_primary_lost: !cluster,
        ..BackupOptions::new(&addr.to_string(), &pb, 1, "b")
    })
    .unwrap();
    let first = commit(&a, t, 0..100);
    wait_until("the backup to replay the first commits", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= first.0
    });
    if matches!(how, Acked::Unheard | Acked::UnheardAcrossItsRestart | Acked::UnheardInACluster) {
        wait_until("the backup to hear the first commits released", Duration::from_secs(30), || {
            bk.state.acknowledged.load(std::sync::atomic::Ordering::Acquire) >= first.0
        });
        tell_upto.store(first.0, std::sync::atomic::Ordering::Release);
    }
    // Commits made while the primary's disk stalls are shipped and received, but never
    // durable on the primary: its restart will not have them.
    stalled.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let lost: Vec<Ts> =
        (100..150u32).map(|k| w.run(|x| x.put(t, &k.to_be_bytes(), &k.to_le_bytes())).unwrap().1.ts()).collect();
    let last_lost = *lost.last().unwrap();
    wait_until("the backup to receive the commits the primary will lose", Duration::from_secs(30), || {
        bk.state.received.load(std::sync::atomic::Ordering::Acquire) >= last_lost.0
    });
    if acked_by_a_connection {
        // (As the server's releases do for each commit they acknowledge.)
        acknowledged.fetch_max(last_lost.0, std::sync::atomic::Ordering::AcqRel);
        wait_until("the backup to learn they were acknowledged", Duration::from_secs(30), || {
            bk.state.acknowledged.load(std::sync::atomic::Ordering::Acquire) >= last_lost.0
        });
        assert!(bk.state.released.load(std::sync::atomic::Ordering::Acquire) < lost[0].0, "released under `local`");
    } else if matches!(how, Acked::Released | Acked::ReleasedAndTheLogUnreadable) {
        wait_until("the backup to learn they were released", Duration::from_secs(30), || {
            bk.state.released.load(std::sync::atomic::Ordering::Acquire) >= last_lost.0
        });
    } else if matches!(how, Acked::Unheard | Acked::UnheardAcrossItsRestart | Acked::UnheardInACluster) {
        // Released (the primary's own watermark covers them: the backup acknowledged
        // them), and the backup told nothing of it.
        wait_until("the primary to release them", Duration::from_secs(30), || {
            let h = p.holdings();
            ditto_replication::release_watermark(CommitPolicy::parse(policy).unwrap(), &h) >= last_lost
        });
        let told = bk
            .state
            .released
            .load(std::sync::atomic::Ordering::Acquire)
            .max(bk.state.acknowledged.load(std::sync::atomic::Ordering::Acquire));
        assert!(told < lost[0].0, "the backup was told of the release (up to {told})");
    }
    let bk = if how == Acked::UnheardAcrossItsRestart {
        // A backup's resume waits until the primary's own log holds what it registered at
        // (`primary::wait_logged`), so on a sound disk the primary's restart holds all the
        // backup resumed with. The restart here is from the image of its disk taken before
        // (a disk that lost synced writes, or a directory restored from an older copy).
        copy_dir(&pa, &pc);
        stalled.store(false, std::sync::atomic::Ordering::SeqCst);
        bk.fence("restarting", Duration::from_secs(10)).unwrap();
        bk.release();
        let bk = backup::start(BackupOptions::new(&addr.to_string(), &pb, 1, "b")).unwrap();
        wait_until("the restarted backup to resume", Duration::from_secs(30), || bk.state.link_up());
        assert!(bk.state.durable.load(std::sync::atomic::Ordering::Acquire) >= last_lost.0, "resumed below them");
        let told = bk
            .state
            .released
            .load(std::sync::atomic::Ordering::Acquire)
            .max(bk.state.acknowledged.load(std::sync::atomic::Ordering::Acquire))
            .max(bk.state.counted.load(std::sync::atomic::Ordering::Acquire));
        assert!(
            told < lost[0].0,
            "the restarted backup was told of the release, or received them again (up to {told})"
        );
        bk
    } else {
        bk
    };
    // The primary dies: what a restart finds is its directory as the disk holds it now.
    if how != Acked::UnheardAcrossItsRestart {
        copy_dir(&pa, &pc);
    }
    p.stop();
    let c = ditto_log::open(&pc, OpenOptions { workers: 2, ..Default::default() }).unwrap();
    let (old, point) = c.opened_from().expect("a new epoch above the one the log held");
    assert!(point >= first && point < lost[0], "recovered up to {point:?}: first {first:?}, lost from {:?}", lost[0]);
    if how == Acked::ReleasedAndTheLogUnreadable {
        let epoch = format!("-e{:010}-", old.0 + 1);
        for e in std::fs::read_dir(pc.join("log")).unwrap().flatten() {
            if e.file_name().to_string_lossy().contains(&epoch) {
                let mut b = std::fs::read(e.path()).unwrap();
                b[20] ^= 0xff;
                std::fs::write(e.path(), b).unwrap();
            }
        }
    }
    let p2 = ship_under(&c, std::net::TcpListener::bind(addr).unwrap(), policy, Some((old, point, point)), None);
    if acked {
        wait_until("the backup to stop", Duration::from_secs(30), || bk.failure().is_some());
        let why = bk.failure().unwrap();
        assert!(why.contains("it may have acknowledged") && why.contains("stays stopped"), "{why}");
        assert_eq!(bk.join_again(), None, "a backup holding acknowledged commits must not join again by itself");
        // The restarted primary heard it hold more: a server takes no writes then.
        let (clear, more) = p2.heard_since_restart(old, point);
        assert_eq!((clear.len(), more.len()), (0, 1), "{more:?}");
        let why = ditto_replication::restart_settled(&quorum_of(policy), old, point, &clear, &more).unwrap_err();
        assert!(why.contains("backup b holds commits up to ts") && why.contains("takes no writes"), "{why}");
        // Read where the release covers them (under `local` it does not: held, not
        // visible; the directory below holds them either way).
        let r = bk.db.read();
        let released = matches!(how, Acked::Released | Acked::ReleasedAndTheLogUnreadable);
        for k in 0..if released { 150 } else { 100u32 } {
            assert_eq!(r.get(t, &k.to_be_bytes()).unwrap().as_deref(), Some(&k.to_le_bytes()[..]), "key {k}");
        }
        drop(r);
        // Restarted (what a person does with a stopped backup; a crash does the same), it
        // does not know how far the primary acknowledged: it keeps them, and does not join.
        bk.fence("restarting", Duration::from_secs(10)).unwrap();
        bk.release();
        match backup::start(BackupOptions::new(&addr.to_string(), &pb, 1, "b")) {
            Err(BackupError::HoldsWhatThePrimaryLost(why)) => assert!(why.contains("does not join"), "{why}"),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("a restarted backup joined, discarding commits its primary lost"),
        }
        assert_eq!(p2.checkpoints_sent.load(std::sync::atomic::Ordering::Relaxed), 0, "no copy was sent");
        let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
        let kept = ditto_log::replica::open_replica(&pb, 1, &storage).unwrap();
        let r = kept.db.read();
        for k in 0..150u32 {
            assert!(
                r.get(t, &k.to_be_bytes()).unwrap().is_some(),
                "key {k} gone from the restarted backup's directory"
            );
        }
        drop(r);
        drop(kept);
        if how == Acked::Unheard {
            // The primary restarts again before the backup came back (the first restart's
            // wait never settled): the backup now follows an older epoch than the one the
            // primary restarted from, and a copy would discard what it holds. A primary
            // waiting for its backups refuses it instead, and counts it as holding more.
            let pd = tmp.path().join("a-again");
            copy_dir(&pc, &pd);
            p2.stop();
            drop(p2);
            let d = ditto_log::open(&pd, OpenOptions { workers: 2, ..Default::default() }).unwrap();
            let (old2, point2) = d.opened_from().expect("a third epoch");
            assert_eq!(old2, Epoch(old.0 + 1));
            let opts = PrimaryOptions {
                backups_expected: 1,
                resume_from: Some((old2, point2, point2)),
                policy: Some(CommitPolicy::parse(policy).unwrap()),
                restart_wait: true,
                ..Default::default()
            };
            let listener = std::net::TcpListener::bind(addr).unwrap();
            let p3 = Primary::start(&d, listener, opts, Box::new(|_| Ts::ZERO)).unwrap();
            match backup::start(BackupOptions::new(&addr.to_string(), &pb, 1, "b")) {
                Err(BackupError::Refused(why)) => assert!(why.contains("it is sent no copy"), "{why}"),
                Err(e) => panic!("refused for another reason: {e}"),
                Ok(_) => panic!("a backup of an older epoch joined a primary still waiting for its backups"),
            }
            let (clear, more) = p3.heard_since_restart(old2, point2);
            assert_eq!((clear.len(), more.len()), (0, 1), "{more:?}");
            let why = ditto_replication::restart_settled(&quorum_of(policy), old2, point2, &clear, &more).unwrap_err();
            assert!(why.contains(&format!("follows epoch {}, older", old.0)), "{why}");
            assert_eq!(p3.checkpoints_sent.load(std::sync::atomic::Ordering::Relaxed), 0, "no copy was sent");
            let kept = ditto_log::replica::open_replica(&pb, 1, &storage).unwrap();
            let r = kept.db.read();
            assert!((0..150u32).all(|k| r.get(t, &k.to_be_bytes()).unwrap().is_some()), "the backup kept its keys");
        }
        return;
    }
    wait_until("the backup to be told to cut", Duration::from_secs(30), || bk.join_again().is_some());
    assert_eq!(bk.join_again(), Some(JoinAgain::CutAt(point)), "{:?}", bk.failure());
    bk.fence("joining again", Duration::from_secs(10)).unwrap();
    bk.release();
    let bk = backup::start(BackupOptions {
        recover_upto: Some(point),
        ..BackupOptions::new(&addr.to_string(), &pb, 1, "b")
    })
    .unwrap();
    // The new epoch's commits on both streams, those of the stream the backup held more
    // of first (their timestamps lie where the lost ones did).
    let more = commit_on(&c, t, 0, 200..250).max(commit_on(&c, t, 1, 250..300));
    assert!(more > lost[0], "the new epoch's timestamps reach where the lost commits were");
    wait_until("the cut backup to replay the new epoch", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= more.0
    });
    assert_eq!(p2.checkpoints_sent.load(std::sync::atomic::Ordering::Relaxed), 0, "resumed from the log, not copied");
    // Cut, it holds nothing above the point: the restarted primary may take writes.
    let (clear, more) = p2.heard_since_restart(old, point);
    assert_eq!((clear.iter().map(|b| b.as_str()).collect::<Vec<_>>(), more.len()), (vec!["b"], 0), "{more:?}");
    assert_eq!(ditto_replication::restart_settled(&quorum_of("majority-received"), old, point, &clear, &more), Ok(()));
    let r = bk.db.read();
    for k in (0..100u32).chain(200..300) {
        assert_eq!(r.get(t, &k.to_be_bytes()).unwrap().as_deref(), Some(&k.to_le_bytes()[..]), "key {k}");
    }
    for k in 100..150u32 {
        assert_eq!(r.get(t, &k.to_be_bytes()).unwrap(), None, "key {k}, which the primary lost, is on the backup");
    }
    drop(r);
    drop((p2, bk));
}

/// The quorum's record of a primary under `policy` whose one backup, `b`, counted.
fn quorum_of(policy: &str) -> ditto_replication::QuorumRecord {
    let mut r = ditto_replication::QuorumRecord::new(1, CommitPolicy::parse(policy).unwrap());
    r.add_backup("b");
    r
}

/// Lets a stalled disk go on when dropped.
struct Unstall(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Unstall {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_backups_directory_opened_as_a_primarys_is_refused_and_left_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a, t, _, p, bk) = primary_and_backup(&pa, &pb, ditto_replication::ReplayMode::Parallel);
    let last = commit(&a, t, 0..50);
    wait_until("the backup to make everything durable", Duration::from_secs(30), || {
        bk.state.durable.load(std::sync::atomic::Ordering::Acquire) >= last.0
    });
    bk.fence("stopped", Duration::from_secs(10)).unwrap();
    bk.release();
    drop(p);
    let listing = |d: &std::path::Path| {
        let mut v: Vec<(String, u64)> = walk(d).into_iter().map(|(p, n)| (p.display().to_string(), n)).collect();
        v.sort();
        v
    };
    let before = listing(&pb);
    assert!(before.iter().any(|(p, _)| p.contains("rlog-")), "the backup's replica log: {before:?}");
    // Opened as a primary's, its newest writes (in the replica log, above its checkpoint)
    // would be left out: refused.
    match ditto_log::open(&pb, OpenOptions { workers: 1, ..Default::default() }) {
        Err(ditto_log::LogError::WrongRole { what, .. }) => assert!(what.contains("backup's data directory"), "{what}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a backup's directory opened as a primary's"),
    }
    assert_eq!(listing(&pb), before, "the refusal changed the directory");
    // As a backup's it opens, everything there.
    let r = ditto_log::replica::open_replica(&pb, 1, &(Arc::new(ditto_log::storage::RealStorage) as _)).unwrap();
    let t = r.db.table_id("t").unwrap();
    for k in 0..50u32 {
        assert!(r.db.read().get(t, &k.to_be_bytes()).unwrap().is_some(), "key {k}");
    }
}

/// Every file under `d` (but the lock, and `trash/`, which a thread of its own empties)
/// with its length.
fn walk(d: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap() {
        let e = e.unwrap();
        if e.file_name() == ditto_log::replica::TRASH_DIR {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else if e.file_name() != "LOCK" {
            out.push((e.path(), e.metadata().unwrap().len()));
        }
    }
    out
}

/// A standalone backup restarted while it holds commits its primary has not released
/// (under `all-durable`, the second backup it waits for not there) opens its whole replica
/// log, but holds its data reads until the primary releases that far, as a running
/// backup's read view and a cluster's backup's start do. Before, its restart served
/// commits no client had been answered for.
#[test]
fn a_restarted_backup_holds_reads_of_what_its_primary_has_not_released() {
    use std::sync::atomic::Ordering::Acquire;
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb, pc) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap().to_string();
    let policy = CommitPolicy::parse("all-durable").unwrap();
    let opts = PrimaryOptions { backups_expected: 2, policy: Some(policy), ..Default::default() };
    let on_change = Box::new(move |h: &ditto_replication::Holdings| ditto_replication::release_watermark(policy, h));
    let p = Primary::start(&a, listener, opts, on_change).unwrap();
    let bk = backup::start(BackupOptions::new(&addr, &pb, 1, "b")).unwrap();
    let last = commit(&a, t, 0..50);
    wait_until("the commits durable on the backup", Duration::from_secs(30), || {
        bk.state.durable.load(Acquire) >= last.0
    });
    assert!(bk.state.released.load(Acquire) < last.0, "released without the second backup");
    assert!(bk.state.visible.load(Acquire) < last.0, "a running backup reads at the release");
    bk.stop("restarted", Duration::from_secs(10)).unwrap();
    drop(bk);
    let bk = backup::start(BackupOptions::new(&addr, &pb, 1, "b")).unwrap();
    assert!(bk.state.visible.load(Acquire) >= last.0, "its open replayed its whole replica log");
    let (from, released) = bk.state.reads_held().expect("its reads are held");
    assert!(from >= last.0 && released < last.0, "held from {from}, released {released}");
    // The second backup joins: the primary releases everything, and the reads open.
    let bk2 = backup::start(BackupOptions::new(&addr, &pc, 1, "c")).unwrap();
    wait_until("the reads to open", Duration::from_secs(30), || bk.state.reads_held().is_none());
    assert!(bk.state.released.load(Acquire) >= last.0);
    bk2.stop("done", Duration::from_secs(10)).unwrap();
    bk.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
}

/// A running backup whose primary went away reconnects; the primary that answers must
/// write a checkpoint first and says so every second (heartbeats before its welcome),
/// then welcomes it with a copy: the backup waits through the heartbeats and says it
/// needs a fresh copy. Before, its reconnect took the first heartbeat for a wrong answer,
/// dropped the connection and asked again, for ever behind the same checkpoint.
#[test]
fn a_reconnect_waits_through_heartbeats_before_its_welcome() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a, t, addr, p, bk) = primary_and_backup(&pa, &pb, ditto_replication::ReplayMode::Parallel);
    let first = commit(&a, t, 0..20);
    wait_until("the backup to replay the first commits", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= first.0
    });
    p.stop();
    drop(p);
    // The primary's stand-in, on its address: two heartbeats, then a copy's welcome.
    let listener = std::net::TcpListener::bind(addr).unwrap();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _hello = read_frame(&mut s).unwrap();
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(300));
            let beat = Frame::Heartbeat { released: Ts::ZERO, acknowledged: Ts::ZERO, sent_us: 0 };
            s.write_all(&beat.encode()).unwrap();
        }
        let tables = vec![(0u32, "t".to_string())];
        let start = Start::Checkpoint { ts: Ts(first.0 + 1000), bytes: 0 };
        s.write_all(&Frame::Welcome { epoch: Epoch(9), streams: 1, tables, start, database: 0, run: 0 }.encode())
            .unwrap();
        // Held until the backup ends it, or 3 s.
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 64];
        while matches!(std::io::Read::read(&mut s, &mut buf), Ok(n) if n > 0) {}
    });
    wait_until("the backup to say it needs a fresh copy", Duration::from_secs(30), || bk.join_again().is_some());
    assert_eq!(bk.join_again(), Some(JoinAgain::Copy));
    fake.join().unwrap();
}

/// A fresh copy (a running backup's join again, `JoinAgain::Copy`, whose hello says it
/// holds nothing) from a primary of an older epoch than the one its directory follows is
/// refused as stale, and the directory keeps what it held: before 2026-12-06 the backup
/// skipped the check for a fresh copy, so a primary restored from an older copy (or a
/// backup behind it promoted) at the same address would have had its history copied over
/// this one's.
#[test]
fn a_fresh_copy_from_a_primary_older_than_the_epoch_followed_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    let kept = dir.join("checkpoints").join("ckpt-00000000000000000007");
    std::fs::create_dir_all(&kept).unwrap();
    std::fs::write(kept.join("held"), b"held").unwrap();
    std::fs::write(dir.join("REPLICA_STATE"), "epoch 5\n").unwrap();
    // (The fake primary welcomes it at epoch 3.)
    match fake_copy(&dir, Ts(7), Vec::new(), None, 0, t_alone()) {
        Err(BackupError::Refused(e)) => assert!(e.contains("older than epoch 5"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(kept.join("held")).unwrap(), b"held");
    assert_eq!(backup::read_followed_epoch(&dir).unwrap(), Some(Epoch(5)), "the epoch followed is kept");
}

/// A copy that is in place but does not load (here a checkpoint with two records of one
/// key, which the check of a received copy does not look for, as a crash while it loads
/// leaves it) leaves the directory following no epoch: its next start is sent a copy.
/// Before, the epoch it followed before the copy stayed named, and its next start asked
/// to resume the copy's checkpoint as that epoch's history.
#[test]
fn a_copy_that_does_not_load_leaves_the_directory_following_no_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    let d = ditto_log::open(&tmp.path().join("p"), OpenOptions { workers: 1, progress: false, ..Default::default() })
        .unwrap();
    let _first = d.db().create_table("a").unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    w.run(|x| (0..100u32).try_for_each(|k| x.put(t, &k.to_be_bytes(), &[7u8; 30]).map(|_| ())))
        .unwrap()
        .1
        .wait()
        .unwrap();
    let info = d.checkpoint().unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..info.parts)
        .map(ditto_log::checkpoint::part_name)
        .chain(["MANIFEST".to_string()])
        .map(|name| (name.clone(), std::fs::read(info.dir.join(&name)).unwrap()))
        .collect();
    // Row 1's key made row 0's (rows of table 1: 32-byte part header, rows of 24 + 4 + 4 +
    // 30 bytes, the key at 24).
    let key_at = |row: usize| 32 + row * 62 + 24;
    let good = files.clone();
    let files = rewritten(&files, |b| {
        let k: Vec<u8> = b[key_at(0)..key_at(0) + 4].to_vec();
        b[key_at(1)..key_at(1) + 4].copy_from_slice(&k);
    });
    let mut frames: Vec<Frame> =
        files.into_iter().map(|(name, data)| Frame::File { name, offset: 0, data: data.into(), last: true }).collect();
    frames.push(Frame::CheckpointDone { ts: info.ts });
    let dir = tmp.path().join("b");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("REPLICA_STATE"), "epoch 2\n").unwrap();
    assert_eq!(backup::read_followed_epoch(&dir).unwrap(), Some(Epoch(2)));
    let r = fake_copy(&dir, info.ts, frames, None, 0, vec![(0, "a".into()), (1, "t".into())]);
    assert!(format!("{r:?}").contains("same key"), "{r:?}");
    assert!(dir.join("checkpoints").join(format!("ckpt-{:020}", info.ts.0)).join("MANIFEST").exists());
    assert_eq!(backup::read_followed_epoch(&dir).unwrap(), Some(Epoch(0)), "the old epoch is no longer named");
    // Its next start says it holds nothing the primary can resume: epoch 0 and ts 0 (a
    // hello of epoch 0 holding the copy's timestamp would count, to a restarted primary, as
    // holding what it lost). (The copy's part and manifest put back as they were, so that
    // the copy opens, as one whose load a crash cut short does.)
    let ckpt = dir.join("checkpoints").join(format!("ckpt-{:020}", info.ts.0));
    for (name, data) in &good {
        std::fs::write(ckpt.join(name), data).unwrap();
    }
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let hello = read_frame(&mut s).unwrap();
        let _ = s.write_all(&Frame::Refuse { reason: "seen".into() }.encode());
        hello
    });
    let r = backup::start(BackupOptions::new(&addr, &dir, 1, "b"));
    assert!(matches!(r, Err(BackupError::Refused(_))), "{:?}", r.err());
    match fake.join().unwrap() {
        Some(Frame::Hello { epoch, have_ts, .. }) => assert_eq!((epoch, have_ts), (Epoch(0), Ts::ZERO)),
        other => panic!("{other:?}"),
    }
}

/// A join waiting for its welcome while the primary writes the checkpoint it will send
/// (saying so every second, for as long as that takes) ends once it is cancelled, or its
/// backup stopped: before, the heartbeats kept it reading, and a stop or a rejoin's cancel
/// waited for the whole checkpoint, or for good. Both ways, with a primary that never
/// stops saying so.
#[test]
fn a_join_waiting_out_a_primarys_checkpoint_ends_when_cancelled_or_stopped() {
    for by_cancel in [true, false] {
        let listener = common::listener_below_the_ephemeral_range();
        let addr = listener.local_addr().unwrap().to_string();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _hello = read_frame(&mut s).unwrap();
            let beat = Frame::Heartbeat { released: Ts::ZERO, acknowledged: Ts::ZERO, sent_us: 0 };
            // (Bounded: a test that fails ends anyway.)
            for _ in 0..300 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(&beat.encode()).is_err() {
                    return;
                }
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let cancel = JoinCancel::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let opts = BackupOptions {
            fresh_copy: true,
            cancel: by_cancel.then(|| cancel.clone()),
            // (Any of the flags stops it: a cluster node's server passes its supervisor's
            // stop and the stop signals.)
            stop: vec![Arc::new(std::sync::atomic::AtomicBool::new(false)), Arc::clone(&stop)],
            ..BackupOptions::new(&addr, dir.path(), 1, "b")
        };
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || done_tx.send(backup::start(opts).map(|_| ())).unwrap());
        std::thread::sleep(Duration::from_millis(500));
        let t = Instant::now();
        if by_cancel {
            cancel.cancel();
        } else {
            stop.store(true, std::sync::atomic::Ordering::Release);
        }
        match done.recv_timeout(Duration::from_secs(10)) {
            Ok(Err(BackupError::Stopped)) => {}
            Ok(other) => panic!("the join ended with {other:?}"),
            Err(_) => panic!("the join went on 10 s after it was {}", if by_cancel { "cancelled" } else { "stopped" }),
        }
        assert!(t.elapsed() < Duration::from_secs(5), "ended {:?} after", t.elapsed());
        fake.join().unwrap();
    }
}

/// A backup of the primary's own epoch number that holds more than this primary ever
/// stamped in it has another primary's history (epochs are numbered per data directory: a
/// copy of an older directory started as a primary opens the same next epoch its original
/// did). It is refused, not resumed (which would skip this primary's commits up to what it
/// holds and acknowledge them), and keeps what it holds.
#[test]
fn a_backup_of_the_same_epoch_number_holding_more_than_the_primary_stamped_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb, pc) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("a-copy"));
    // A primary with 20 commits, stopped; its directory is copied.
    {
        let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
        let t = a.db().create_table("t").unwrap();
        commit(&a, t, 0..20);
        a.close();
    }
    copy_dir(&pa, &pc);
    // The original goes on, with a backup, to 60 commits.
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().table_id("t").unwrap();
    let epoch = a.logger().epoch();
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap();
    let p = ship(&a, listener);
    let bk = backup::start(BackupOptions::new(&addr.to_string(), &pb, 1, "b")).unwrap();
    let last = commit(&a, t, 20..60);
    wait_until("the backup to hold every commit", Duration::from_secs(20), || {
        bk.state.durable.load(std::sync::atomic::Ordering::SeqCst) >= last.0
    });
    bk.stop("done", Duration::from_secs(10)).unwrap();
    drop(bk);
    p.stop();
    drop(p);
    a.close();
    // The copy, started as a primary, opens the same epoch number with less in it.
    let c = ditto_log::open(&pc, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    assert_eq!(c.logger().epoch(), epoch, "the same epoch number");
    assert!(c.db().clock().now() < last);
    let listener = std::net::TcpListener::bind(addr).unwrap();
    let p2 = ship(&c, listener);
    // The backup says which run of a primary served its epoch: the copy's is another, and
    // refuses it for that first (`identity::check_run`). A record without the run (an
    // older build's) is refused by the clock.
    match backup::start(BackupOptions::new(&addr.to_string(), &pb, 1, "b")) {
        Err(BackupError::OtherDatabase(why)) => {
            assert!(why.contains("two primaries served the same epoch number"), "{why}")
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a backup holding another primary's history of the same epoch was resumed"),
    }
    std::fs::write(pb.join("REPLICA_STATE"), format!("epoch {}\n", epoch.0)).unwrap();
    match backup::start(BackupOptions::new(&addr.to_string(), &pb, 1, "b")) {
        Err(BackupError::Refused(why)) => assert!(why.contains("past everything this primary stamped"), "{why}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a backup holding another primary's history of the same epoch was resumed"),
    }
    assert_eq!(p2.checkpoints_sent.load(std::sync::atomic::Ordering::Relaxed), 0, "no copy was sent");
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
    let kept = ditto_log::replica::open_replica(&pb, 1, &storage).unwrap();
    let r = kept.db.read();
    assert!((0..60u32).all(|k| r.get(t, &k.to_be_bytes()).unwrap().is_some()), "the backup kept its keys");
    drop(r);
    drop(kept);
    p2.stop();
    c.close();
}
