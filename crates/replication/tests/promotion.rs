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

mod common;
#[path = "../../log/tests/common/missed_epoch.rs"]
mod missed_epoch;
use common::wait_until;

fn start_primary(d: &ditto_log::Durable, resume_from: Option<(Epoch, Ts, Ts)>) -> (Arc<Primary>, String) {
    start_primary_under(d, resume_from, "local")
}

fn start_primary_under(
    d: &ditto_log::Durable,
    resume_from: Option<(Epoch, Ts, Ts)>,
    policy: &str,
) -> (Arc<Primary>, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let policy = CommitPolicy::parse(policy).unwrap();
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
    let a_run = pa_repl.run();
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
    // Its record of following goes, the run that served epoch 1 kept (as a server's
    // promotion does): the primary it becomes takes a backup of that run only.
    backup::forget_followed(&b1).unwrap();
    assert_eq!(ditto_replication::identity::run_of(&b1, epoch1).unwrap(), a_run);
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

/// Epoch 1 under `policy` with backups held at the release (a cluster's), 100 commits of
/// key i -> "v{i}"; returns the primary's pieces, the held backup, each commit's ts, and
/// the primary's replication address.
fn held_backup_under(
    policy: &str,
    pa: &std::path::Path,
    b1: &std::path::Path,
) -> (ditto_log::Durable, Arc<Primary>, backup::Backup, Vec<Ts>, String) {
    let (a, pa_repl, bk1, _, ts, a_addr) = held_backups_under(policy, pa, b1, None);
    (a, pa_repl, bk1, ts, a_addr)
}

thread_local! {
    /// The replay mode `held_backups_under` starts its backups with (the default's unless
    /// a test sets it).
    static HELD_MODE: std::cell::Cell<Option<ditto_replication::ReplayMode>> = const { std::cell::Cell::new(None) };
}

/// `held_backup_under`, with a second backup in `b2` (if given) that also joins before the
/// writes, so that its replica log holds them (not a checkpoint above them).
#[allow(clippy::type_complexity)]
fn held_backups_under(
    policy: &str,
    pa: &std::path::Path,
    b1: &std::path::Path,
    b2: Option<&std::path::Path>,
) -> (ditto_log::Durable, Arc<Primary>, backup::Backup, Option<backup::Backup>, Vec<Ts>, String) {
    let a = ditto_log::open(pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (pa_repl, a_addr) = start_primary_under(&a, None, policy);
    let mut opts = BackupOptions { hold_replay_at_release: true, ..BackupOptions::new(&a_addr, b1, 1, "b1") };
    if let Some(m) = HELD_MODE.get() {
        opts.replay = m;
    }
    let bk1 = backup::start(opts).unwrap();
    let bk2 = b2.map(|b2| {
        let opts = BackupOptions { hold_replay_at_release: true, ..BackupOptions::new(&a_addr, b2, 1, "b2") };
        let bk = backup::start(opts).unwrap();
        wait_until("the second backup to join", Duration::from_secs(20), || bk.state.link_up());
        bk
    });
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    // Committed without waiting, so that batches hold many (a point within one cuts it).
    let tickets: Vec<_> =
        (0..100u32).map(|i| w.run(|x| x.put(t, &i.to_be_bytes(), format!("v{i}").as_bytes())).unwrap().1).collect();
    let ts: Vec<Ts> = tickets.iter().map(|k| k.ts()).collect();
    let last = tickets.into_iter().last().unwrap().wait().unwrap();
    wait_until("the backup to hold epoch 1", Duration::from_secs(20), || {
        bk1.state.durable.load(std::sync::atomic::Ordering::SeqCst) >= last.0
    });
    (a, pa_repl, bk1, bk2, ts, a_addr)
}

/// `fetch_floor(dir)` says exactly where a failover's fetch from `dir` can start: a fetch
/// of stream 0 from there is answered, one from just below it is refused. Returns it.
fn fetch_floor_is_exact(dir: &std::path::Path) -> Ts {
    let floor = ditto_log::replica::fetch_floor(dir).unwrap();
    assert!(ditto_log::replica::replica_stream_batches(dir, 0, floor).is_ok(), "a fetch from {floor:?}");
    if floor > Ts::ZERO {
        let below = ditto_log::replica::replica_stream_batches(dir, 0, Ts(floor.0 - 1));
        assert!(below.is_err(), "a fetch from below {floor:?} answered");
    }
    floor
}

fn value_on(db: &ditto_engine::Database, i: u32) -> Option<Vec<u8>> {
    let t = db.table_id("t").unwrap();
    db.read().get(t, &i.to_be_bytes()).unwrap().map(|v| v.to_vec())
}

/// A held backup replays only what the primary released; promoted in place at a point
/// within what it holds, it replays up to the point exactly (a batch straddling it is
/// cut), and its engine, sealed into a checkpoint there, is the next epoch's primary's.
#[test]
fn a_backup_held_at_the_release_is_promoted_in_place_cut_exactly_at_the_point() {
    promoted_in_place_cut_exactly_at_the_point();
}

/// The same with one serial replayer: it replays what the cut releases after the fence
/// (before 2026-12-02 it ended at the fence, and the cut waited out its timeout: every
/// promotion or follow in place of a node replaying serially fell back to a restart).
#[test]
fn a_serial_backup_held_at_the_release_is_promoted_in_place_cut_exactly_at_the_point() {
    HELD_MODE.set(Some(ditto_replication::ReplayMode::Serial));
    promoted_in_place_cut_exactly_at_the_point();
}

fn promoted_in_place_cut_exactly_at_the_point() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    // Under `all` with two backups expected and one there, nothing is released.
    let (a, pa_repl, bk1, ts, _) = held_backup_under("all-durable", &pa, &b1);
    std::thread::sleep(Duration::from_millis(100));
    let replayed = bk1.state.replayed.load(std::sync::atomic::Ordering::SeqCst);
    assert!(replayed < ts[0].0, "nothing released, nothing replayed (replayed to {replayed})");
    assert_eq!(value_on(&bk1.db, 0), None);
    let epoch1 = a.logger().epoch();
    pa_repl.stop();
    a.close();
    // The point: commit 59.
    let p = ts[59];
    let (db, lock) = bk1.cut_at(p, "promoted", Duration::from_secs(20)).unwrap();
    for i in 0..100u32 {
        let want = (i <= 59).then(|| format!("v{i}").into_bytes());
        assert_eq!(value_on(&db, i), want, "key {i} after a promotion at commit 59");
    }
    let storage = RealStorage;
    let info = ditto_log::replica::seal_at_point(&db, &b1, &storage).unwrap();
    assert_eq!(info.ts, p, "the checkpoint is at the point");
    assert!(!ditto_log::replica::replica_dir(&b1).exists(), "the replica log is gone");
    drop(lock);
    let start = Ts(ts[99].0 + 7);
    let o = OpenOptions {
        workers: 1,
        epoch: Some(Epoch(epoch1.0 + 1)),
        ts_above: start,
        recovered: Some(ditto_log::Recovered(Arc::clone(&db))),
        ..Default::default()
    };
    let bp = ditto_log::open(&b1, o).unwrap();
    assert!(Arc::ptr_eq(bp.db(), &db), "the backup's engine is the primary's");
    let t = bp.db().table_id("t").unwrap();
    let mut w = bp.db().worker(WorkerId(0)).unwrap();
    let newest = w.run(|x| x.put(t, &70u32.to_be_bytes(), b"new")).unwrap().1.wait().unwrap();
    assert!(newest > start, "new commits are above start");
    assert_eq!(value_on(bp.db(), 70).as_deref(), Some(&b"new"[..]));
    assert_eq!(value_on(bp.db(), 71), None, "what lay above the point stays discarded");
    drop(w);
    bp.close();
    drop((bp, db));
    // Recovered from its directory (the checkpoint at the point and its own log), the
    // same.
    let again = ditto_log::open(&b1, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    assert_eq!(value_on(again.db(), 70).as_deref(), Some(&b"new"[..]));
    assert_eq!(value_on(again.db(), 59).as_deref(), Some(&b"v59"[..]));
    assert_eq!(value_on(again.db(), 71), None);
}

/// Under `local` the primary releases what no backup may hold: a backup that replayed
/// above the point refuses to be promoted in place, and its directory is left as it was
/// (the node then recovers from it, cut at the point).
#[test]
fn a_backup_that_replayed_above_the_point_refuses_a_promotion_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let (a, pa_repl, bk1, ts, _) = held_backup_under("local", &pa, &b1);
    wait_until("the backup to replay everything", Duration::from_secs(20), || {
        bk1.state.visible.load(std::sync::atomic::Ordering::SeqCst) >= ts[99].0
    });
    pa_repl.stop();
    a.close();
    let e = bk1.cut_at(ts[59], "promoted", Duration::from_secs(20)).err().expect("refused");
    assert!(e.contains("above the point"), "{e}");
    // The directory still holds everything; the restart path cuts it at the point.
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let opened = ditto_log::replica::open_replica_at(&b1, 1, &storage, ts[59], &[]).unwrap();
    assert_eq!(value_on(&opened.db, 59).as_deref(), Some(&b"v59"[..]));
    assert_eq!(value_on(&opened.db, 60), None);
}

/// A backup whose run began from a checkpoint copy above a failover's point (it joined
/// after the commits; under `local` the copy may hold what no quorum acknowledged) is
/// refused a cut there in place: its engine holds the copy's commits, which no cut takes
/// out (before, the cut succeeded and its seal was written; the next open then refused
/// the engine).
#[test]
fn a_backup_whose_run_began_above_the_point_is_refused_a_cut_in_place_there() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (pa_repl, a_addr) = start_primary_under(&a, None, "local");
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts: Vec<Ts> = (0..100u32)
        .map(|i| w.run(|x| x.put(t, &i.to_be_bytes(), format!("v{i}").as_bytes())).unwrap().1.wait().unwrap())
        .collect();
    let opts = BackupOptions { hold_replay_at_release: true, ..BackupOptions::new(&a_addr, &b1, 1, "b1") };
    let bk1 = backup::start(opts).unwrap();
    wait_until("the backup to join from a copy", Duration::from_secs(20), || {
        bk1.state.link_up() && bk1.state.durable.load(std::sync::atomic::Ordering::SeqCst) >= ts[99].0
    });
    pa_repl.stop();
    a.close();
    let e = bk1.cut_at(ts[59], "promoted", Duration::from_secs(20)).err().expect("refused");
    assert!(e.contains("cannot be cut there in place"), "{e}");
}

/// Under `local` a backup may replay, and checkpoint, above a failover's point. Asked to
/// open at the point (a promotion), its directory is refused, not cut at its checkpoint
/// (the cut went there silently: the promoted node would have served commits every other
/// node discarded), and nothing in it changes.
#[test]
fn a_backup_checkpointed_above_the_point_is_refused_a_promotion_at_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (pa_repl, a_addr) = start_primary_under(&a, None, "local");
    let opts = BackupOptions {
        hold_replay_at_release: true,
        checkpoint_every: Duration::from_millis(20),
        ..BackupOptions::new(&a_addr, &b1, 1, "b1")
    };
    let bk1 = backup::start(opts).unwrap();
    wait_until("the backup to join", Duration::from_secs(20), || bk1.state.link_up());
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts: Vec<Ts> = (0..100u32)
        .map(|i| w.run(|x| x.put(t, &i.to_be_bytes(), format!("v{i}").as_bytes())).unwrap().1.wait().unwrap())
        .collect();
    wait_until("a backup checkpoint above commit 59", Duration::from_secs(20), || {
        bk1.state.checkpoint_ts.load(std::sync::atomic::Ordering::SeqCst) > ts[59].0
    });
    pa_repl.stop();
    a.close();
    bk1.fence("promoted", Duration::from_secs(20)).unwrap();
    bk1.release();
    let listing = |d: &std::path::Path| {
        let mut v: Vec<(String, u64)> = walkdir(d);
        v.sort();
        v
    };
    let before = listing(&b1);
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    match ditto_log::replica::open_replica_at(&b1, 1, &storage, ts[59], &[]) {
        Err(e) => assert!(e.to_string().contains("above the point"), "{e}"),
        Ok(o) => panic!("opened, cut at ts {} for the point {}", o.report.cut_ts.0, ts[59].0),
    }
    assert_eq!(listing(&b1), before, "the refused open changed the directory");
}

/// The bounds of the batches a primary at `addr` sends, within 2 s of its welcome, to a
/// backup named `node` that says it follows `epoch` and holds up to `have`.
fn bounds_sent_to_a_hello(addr: &str, epoch: Epoch, have: Ts, node: &str) -> Vec<Ts> {
    use ditto_replication::protocol::{read_frame, Frame, Start, PROTOCOL_VERSION};
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let hello = Frame::Hello {
        version: PROTOCOL_VERSION,
        epoch,
        have_ts: have,
        node: node.into(),
        learner: false,
        proves: None,
        database: 0,
        run: 0,
    };
    s.write_all(&hello.encode()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let welcome = loop {
        match read_frame(&mut s).unwrap() {
            Some(Frame::Heartbeat { .. }) => continue,
            other => break other,
        }
    };
    assert!(matches!(welcome, Some(Frame::Welcome { start: Start::Resume, .. })), "{welcome:?}");
    let mut bounds = Vec::new();
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        match read_frame(&mut s) {
            Ok(Some(Frame::Batch { batch, .. })) => {
                bounds.push(ditto_log::format::decode_batch_checksums(&batch).unwrap().0.header.bound_ts)
            }
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("{e}"),
        }
    }
    bounds
}

/// Every file under `d` (not the lock file, and not `trash/`: what the backup's own
/// checkpoints retired is deleted there by a thread of its own, which may still be at it),
/// with its length.
fn walkdir(d: &std::path::Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.ends_with(ditto_log::replica::TRASH_DIR) {
            continue;
        }
        if p.is_dir() {
            out.extend(walkdir(&p));
        } else if !p.ends_with("LOCK") {
            out.push((p.display().to_string(), e.metadata().unwrap().len()));
        }
    }
    out
}

/// A held backup that follows the next epoch's primary in place: cut at the point and
/// sealed there, it joins the new primary with the engine it kept (nothing loaded, no
/// checkpoint copied: it resumes from the new primary's log) and receives its commits.
#[test]
fn a_held_backup_follows_the_next_primary_in_place_with_the_engine_it_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, b2) = (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("b2"));
    let (a, pa_repl, bk1, ts, a_addr) = held_backup_under("local", &pa, &b1);
    let opts = BackupOptions { hold_replay_at_release: true, ..BackupOptions::new(&a_addr, &b2, 1, "b2") };
    let bk2 = backup::start(opts).unwrap();
    let p = ts[99];
    wait_until("the second backup to hold epoch 1", Duration::from_secs(20), || {
        bk2.state.durable.load(std::sync::atomic::Ordering::SeqCst) >= p.0
    });
    let epoch1 = a.logger().epoch();
    pa_repl.stop();
    a.close();
    let storage = RealStorage;
    // B1 is promoted in place: its replica log sealed at the point, checkpointed away in
    // the background once it serves.
    let (db1, lock1) = bk1.cut_at(p, "promoted", Duration::from_secs(20)).unwrap();
    ditto_log::sealed::seal_tail(&b1, p, &storage).unwrap();
    drop(lock1);
    let start = Ts(p.0 + 7);
    let o = OpenOptions {
        workers: 1,
        epoch: Some(Epoch(epoch1.0 + 1)),
        ts_above: start,
        recovered: Some(ditto_log::Recovered(db1)),
        ..Default::default()
    };
    let bp = ditto_log::open(&b1, o).unwrap();
    let (bp_repl, bp_addr) = start_primary(&bp, Some((epoch1, p, start)));
    // B2 follows it in place, sealed the same way; from the cut on, its old run reads
    // nothing (its connections move to the next run, which holds its reads in turn), and
    // its gate's generation moved (a read that ran across the cut is run again).
    let old_run = Arc::clone(&bk2.state);
    let gen = old_run.gate_gen.load(std::sync::atomic::Ordering::SeqCst);
    let (db2, lock2) = bk2.cut_at(p, "follows", Duration::from_secs(20)).unwrap();
    assert!(old_run.reads_held().is_some(), "the old run's reads are held after its cut");
    assert_eq!(old_run.gate_gen.load(std::sync::atomic::Ordering::SeqCst), gen + 1);
    ditto_log::sealed::seal_tail(&b2, p, &storage).unwrap();
    // A seal below the point of the last one is refused, changing nothing.
    let e = ditto_log::sealed::seal_tail(&b2, Ts(p.0 - 1), &storage).unwrap_err();
    assert!(e.to_string().contains("below the point"), "{e}");
    assert_eq!(ditto_log::sealed::sealed(&b2).unwrap().len(), 1);
    drop(lock2);
    // An engine that does not hold the seal's point is refused.
    let other = ditto_engine::Database::new(ditto_engine::Options { workers: 1 });
    match ditto_log::replica::open_replica_with(&b2, other) {
        Err(e) => assert!(e.to_string().contains("but the replica log is sealed at ts"), "{e}"),
        Ok(_) => panic!("an engine not at the seal's point was taken"),
    }
    let opts = BackupOptions {
        engine: Some(Arc::clone(&db2)),
        hold_replay_at_release: true,
        checkpoint_log_min_bytes: 1,
        checkpoint_log_growth_percent: 1,
        keep_what_the_primary_lost: false,
        ..BackupOptions::new(&bp_addr, &b2, 1, "b2")
    };
    let bk2 = backup::start(opts).unwrap();
    assert!(Arc::ptr_eq(&bk2.db, &db2), "the kept engine serves");
    // Its data, cut at the point, is read only once the new primary has released the
    // point: a later failover could set a lower one (before, the kept engine was read at
    // once).
    assert_eq!(bk2.state.reads_from.load(std::sync::atomic::Ordering::SeqCst), p.0);
    assert_eq!(bp_repl.checkpoints_sent.load(std::sync::atomic::Ordering::SeqCst), 0, "resumed from the log");
    let tb = bp.db().table_id("t").unwrap();
    let mut w = bp.db().worker(WorkerId(0)).unwrap();
    let newest = w.run(|x| x.put(tb, &5u32.to_be_bytes(), b"two")).unwrap().1.wait().unwrap();
    wait_until("the backup to see epoch 2's commit", Duration::from_secs(20), || {
        bk2.state.visible.load(std::sync::atomic::Ordering::SeqCst) >= newest.0
    });
    assert_eq!(value_on(&bk2.db, 5).as_deref(), Some(&b"two"[..]));
    assert_eq!(value_on(&bk2.db, 99).as_deref(), Some(&b"v99"[..]));
    wait_until("the point released", Duration::from_secs(20), || bk2.state.reads_held().is_none());
    // A chain of one is not checkpointed at once (`sealed::CHECKPOINT_AT_LINKS`): the
    // backup's policy takes it, its bytes counted as received (1% of the checkpoint under
    // it makes this one's log-growth trigger due: the chain alone does), and the primary's
    // next checkpoint.
    wait_until("the backup's sealed log to be checkpointed away", Duration::from_secs(20), || {
        ditto_log::sealed::sealed(&b2).unwrap().is_empty()
            && bk2.state.checkpoints.load(std::sync::atomic::Ordering::SeqCst) >= 1
    });
    assert_eq!(ditto_log::sealed::sealed(&b1).unwrap().len(), 1, "no checkpoint was written at once");
    bp.checkpoint().unwrap();
    assert!(ditto_log::sealed::sealed(&b1).unwrap().is_empty());
    bp_repl.stop();
}

/// A chain of `CHECKPOINT_AT_LINKS` seals is checkpointed away in the background as soon
/// as the node serves; a shorter one is not, and the checkpoint policy counts its bytes as
/// log written since the last checkpoint (so its log-growth trigger takes it away).
#[test]
fn a_long_chain_is_checkpointed_away_at_once_and_a_short_one_when_the_policy_says() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = RealStorage;
    let open = |dir: &std::path::Path, p: Ts, db| {
        let o = OpenOptions {
            workers: 1,
            epoch: Some(Epoch(2)),
            ts_above: Ts(p.0 + 1),
            recovered: Some(ditto_log::Recovered(db)),
            ..Default::default()
        };
        ditto_log::open(dir, o).unwrap()
    };
    // Four links (seals at the same point: changes of role with nothing between).
    let (long, ts, db, lock) = cut_at_commit_59(&tmp.path().join("long"));
    for _ in 0..ditto_log::sealed::CHECKPOINT_AT_LINKS {
        ditto_log::sealed::seal_tail(&long, ts[59], &storage).unwrap();
    }
    drop(lock);
    let d = open(&long, ts[59], db);
    wait_until("the long chain to be checkpointed away", Duration::from_secs(20), || {
        ditto_log::sealed::sealed(&long).unwrap().is_empty()
    });
    d.close();
    // Three: it stays until the policy's checkpoint.
    let (short, ts, db, lock) = cut_at_commit_59(&tmp.path().join("short"));
    for _ in 1..ditto_log::sealed::CHECKPOINT_AT_LINKS {
        ditto_log::sealed::seal_tail(&short, ts[59], &storage).unwrap();
    }
    drop(lock);
    let d = open(&short, ts[59], db);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(ditto_log::sealed::sealed(&short).unwrap().len(), ditto_log::sealed::CHECKPOINT_AT_LINKS - 1);
    assert!(ditto_log::sealed::chain_bytes(&short) > 0);
    // Log growth of at least 1 byte and 1% of the checkpoint under the chain: the chain's
    // bytes alone make it due.
    let policy = ditto_log::CheckpointPolicy { every: None, log_growth_percent: 1, log_min_bytes: 1, reuse_min_ids: 0 };
    let _t = d.spawn_checkpointer(policy);
    wait_until("the policy to checkpoint the short chain away", Duration::from_secs(20), || {
        ditto_log::sealed::sealed(&short).unwrap().is_empty()
    });
    d.close();
}

/// Epoch 1 on A (keys 0-99 `v{i}`), with held backups B1 and B2 in `tmp` joined before
/// its writes; B1 promoted in place at P1 (epoch 1's last commit), and B2 following it in
/// place, run by `follow` (given its options: to follow B1 with the engine it kept, cut at
/// P1, its replay held at the release); epoch 2 on B1 (keys 100-149, and 0-9 written again, `two{i}`), replayed
/// by B2; B1's primary closed.
struct TwoEpochs {
    b2: std::path::PathBuf,
    bk2: backup::Backup,
    p1: Ts,
    p2: Ts,
    /// Epoch 1's and epoch 2's commits.
    ts: Vec<Ts>,
    ts2: Vec<Ts>,
    epoch2: Epoch,
}

fn two_epochs(tmp: &std::path::Path, follow: impl FnOnce(BackupOptions) -> backup::Backup) -> TwoEpochs {
    let (pa, b1, b2) = (tmp.join("a"), tmp.join("b1"), tmp.join("b2"));
    let storage = RealStorage;
    let (a, pa_repl, bk1, bk2, ts, _) = held_backups_under("local", &pa, &b1, Some(&b2));
    let bk2 = bk2.unwrap();
    let visible = |b: &backup::Backup| b.state.visible.load(std::sync::atomic::Ordering::SeqCst);
    let p1 = ts[99];
    wait_until("both backups to replay epoch 1", Duration::from_secs(20), || {
        visible(&bk1) >= p1.0 && visible(&bk2) >= p1.0
    });
    let epoch1 = a.logger().epoch();
    pa_repl.stop();
    a.close();
    // B1 promoted in place at P1 (not checkpointing its seal away), B2 follows it in place.
    let (db1, lock1) = bk1.cut_at(p1, "promoted", Duration::from_secs(20)).unwrap();
    ditto_log::sealed::seal_tail(&b1, p1, &storage).unwrap();
    drop(lock1);
    let start2 = Ts(p1.0 + 7);
    let bp1 = ditto_log::open(&b1, opened_at(epoch1.0 + 1, start2, db1)).unwrap();
    let (bp1_repl, bp1_addr) = start_primary(&bp1, Some((epoch1, p1, start2)));
    let (db2, lock2) = bk2.cut_at(p1, "follows", Duration::from_secs(20)).unwrap();
    ditto_log::sealed::seal_tail(&b2, p1, &storage).unwrap();
    drop(lock2);
    let bk2 = follow(BackupOptions {
        engine: Some(db2),
        hold_replay_at_release: true,
        ..BackupOptions::new(&bp1_addr, &b2, 1, "b2")
    });
    let tb = bp1.db().table_id("t").unwrap();
    let mut w = bp1.db().worker(WorkerId(0)).unwrap();
    let tickets: Vec<_> = (100..150u32)
        .chain(0..10)
        .map(|i| w.run(|x| x.put(tb, &i.to_be_bytes(), format!("two{i}").as_bytes())).unwrap().1)
        .collect();
    let ts2: Vec<Ts> = tickets.iter().map(|k| k.ts()).collect();
    let p2 = tickets.into_iter().last().unwrap().wait().unwrap();
    wait_until("B2 to replay epoch 2", Duration::from_secs(20), || visible(&bk2) >= p2.0);
    let epoch2 = bp1.logger().epoch();
    drop(w);
    bp1_repl.stop();
    bp1.close();
    TwoEpochs { b2, bk2, p1, p2, ts, ts2, epoch2 }
}

/// A primary's log opened from an engine kept through a promotion in place, for `epoch`
/// with timestamps above `start`, its seal left for the policy's checkpoint.
fn opened_at(epoch: u64, start: Ts, db: Arc<ditto_engine::Database>) -> OpenOptions {
    OpenOptions {
        workers: 1,
        epoch: Some(Epoch(epoch)),
        ts_above: start,
        recovered: Some(ditto_log::Recovered(db)),
        checkpoint_sealed: false,
        ..Default::default()
    }
}

/// Two changes of role in place before a checkpoint (failovers seconds apart: the
/// checkpoint that takes a seal away is paced): the backup that follows the second primary
/// in place, and is then promoted in place itself, seals its replica log again as the
/// second link of a chain instead of writing its whole engine as a checkpoint before it
/// serves. The directory says exactly what the engine holds (epoch 1 up to the first
/// point, epoch 2 up to the second, nothing above), recovers to it before and after its
/// checkpoint, and serves a backup that lacks the end of epoch 2 from the second link,
/// before and after that checkpoint (which keeps only that link, lying on the first point).
#[test]
fn a_second_change_in_place_before_the_checkpoint_seals_a_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = RealStorage;
    // B2 follows B1 in place without checkpointing the seal away.
    let two = two_epochs(tmp.path(), |opts| backup::start(BackupOptions { checkpoint_sealed: false, ..opts }).unwrap());
    let TwoEpochs { b2, bk2, p1, p2, ts, ts2, epoch2 } = two;
    let o = opened_at;
    // B2 promoted in place at P2: its replica log of epoch 2 becomes the chain's second link.
    let (db2, lock2) = bk2.cut_at(p2, "promoted", Duration::from_secs(20)).unwrap();
    assert!(ditto_log::sealed::can_seal(&b2).unwrap());
    ditto_log::sealed::seal_tail(&b2, p2, &storage).unwrap();
    drop(lock2);
    let chain = ditto_log::sealed::sealed(&b2).unwrap();
    assert_eq!(chain.iter().map(|s| s.point).collect::<Vec<_>>(), vec![p1, p2], "{chain:?}");
    assert!(chain[1].dir.ends_with("sealed.2"), "{chain:?}");
    // A checkpoint copy cut short by a crash (links named `sealed` and `sealed.2`).
    let history: Vec<(u32, String)> = (0..100u32)
        .map(|i| (i, format!("v{i}")))
        .chain((100..150).chain(0..10).map(|i| (i, format!("two{i}"))))
        .collect();
    let prefixes = checkpoint_copy_cut_short_opens_as_an_older_state(&b2, &history);
    assert_eq!(prefixes, [160, 100, 0, 0], "epoch 2 to P2, epoch 1 to P1, the checkpoint at 0, nothing");
    let expect = |db: &ditto_engine::Database, what: &str| {
        for i in 0..150u32 {
            let want = match i {
                0..10 | 100..150 => format!("two{i}"),
                _ => format!("v{i}"),
            };
            assert_eq!(value_on(db, i), Some(want.into_bytes()), "{what}: key {i}");
        }
    };
    // What a failover's report reads: every stream held up to P2, nothing above.
    let h = ditto_log::replica::replica_holdings(&b2, 1, Some(p2)).unwrap();
    assert!(h.streams.iter().all(|t| *t == p2) && h.newest == p2 && h.txns_above == 0, "{h:?}");
    // The rest for a backup that lacks the end of epoch 2 comes from the second link, cut
    // at P2; for one that lacks part of epoch 1 too, from the first link (cut at P1) and
    // then the second: every commit above what it holds, once, in order, none above P2.
    // (Whole batches bounded above it: the receiver skips what it holds.)
    let rest = ditto_log::replica::sealed_batches_above(&b2, ts2[29], p2).unwrap().expect("from the second link");
    let commits_above = |batches: &[bytes::Bytes], after: Ts| -> Vec<Ts> {
        let all: Vec<Ts> = batches
            .iter()
            .flat_map(|b| ditto_log::format::decode_batch(b).unwrap().0.records().into_iter().map(|r| r.ts))
            .collect();
        assert!(all.iter().all(|t| *t <= p2), "nothing above the point: {all:?}");
        all.into_iter().filter(|t| *t > after).collect()
    };
    assert_eq!(commits_above(&rest, ts2[29]), ts2[30..].to_vec(), "the end of epoch 2");
    let both = ditto_log::replica::sealed_batches_above(&b2, ts[50], p2).unwrap().expect("from both links");
    let want: Vec<Ts> = ts[51..].iter().chain(&ts2).copied().collect();
    assert_eq!(commits_above(&both, ts[50]), want, "the end of epoch 1, then epoch 2");
    // What a new primary sends such a backup reads the same batches again as it sends them
    // (`sealed_gap_above`: counted now, nothing kept), before the gap of its own log.
    let sealed_gap = |after: Ts| {
        let part = ditto_log::replica::sealed_gap_above(&b2, after, p2).unwrap().expect("reaches");
        ditto_log::replica::Gap::default().after_sealed(part)
    };
    let gap = sealed_gap(ts[50]);
    assert_eq!(gap.len(), both.len());
    assert_eq!(gap.collect().unwrap(), both, "read again as sent: the same batches");
    assert_eq!(sealed_gap(ts2[29]).collect().unwrap(), rest);
    assert!(ditto_log::replica::sealed_gap_above(&b2, ts[50], Ts(p2.0 + 1)).unwrap().is_none(), "no seal there");
    // Taken now and sent after the checkpoint below (which takes the first link away).
    let (early_both, early_rest) = (sealed_gap(ts[50]), sealed_gap(ts2[29]));
    // And a failover's fetch of the stream from this directory (the chain read link by link),
    // which can start below both links (its report says so: `fetch_floor`).
    assert!(fetch_floor_is_exact(&b2) <= ts[50], "the chain reaches below both links");
    let fetched = ditto_log::replica::replica_stream_batches(&b2, 0, ts[50]).unwrap();
    assert_eq!(commits_above(&fetched, ts[50]), want, "a fetch behind both links");
    // Recovered from the files alone (a crash before its first checkpoint): the same.
    {
        let storage: Arc<dyn Storage> = Arc::new(RealStorage);
        let h = ditto_log::replica::open_replica_upto(&b2, 1, &storage, Some(Ts(p1.0 + 1)));
        assert!(h.err().expect("refused").to_string().contains("below the point"));
        assert_eq!(ditto_log::sealed::sealed(&b2).unwrap().len(), 2, "the refusal changed nothing");
    }
    // The new primary of epoch 3, from the engine it kept.
    let start3 = Ts(p2.0 + 5);
    let bp2 = ditto_log::open(&b2, o(epoch2.0 + 1, start3, db2)).unwrap();
    assert_eq!(bp2.recovery().checkpoint_rows, 0, "nothing loaded");
    let tb = bp2.db().table_id("t").unwrap();
    let mut w = bp2.db().worker(WorkerId(0)).unwrap();
    let p3 = w.run(|x| x.put(tb, &500u32.to_be_bytes(), b"three")).unwrap().1.wait().unwrap();
    drop(w);
    expect(bp2.db(), "the new primary");
    // A crash now leaves what this copy holds (epoch 3's commit is durable).
    let crashed = tmp.path().join("b2-crashed");
    copy_dir(&b2, &crashed);
    std::fs::remove_file(crashed.join("LOCK")).ok();
    // Its first checkpoint takes the chain away, keeping the second link (on P1) to serve.
    let info = bp2.checkpoint().unwrap();
    assert!(info.ts >= p3);
    assert!(ditto_log::sealed::sealed(&b2).unwrap().is_empty(), "recovery no longer sees the chain");
    let (_, point, floor) = ditto_log::sealed::served(&b2).expect("the newest link kept to serve");
    assert_eq!((point, floor), (p2, p1));
    let rest = ditto_log::replica::sealed_batches_above(&b2, ts2[29], p2).unwrap().expect("from the kept link");
    assert!(!rest.is_empty());
    assert_eq!(ditto_log::replica::sealed_batches_above(&b2, ts[50], p2).unwrap(), None);
    // A gap taken before, sent now: from the kept link, the same; reaching into the link
    // taken away, an error (never a gap sent with a hole).
    assert_eq!(early_rest.collect().unwrap(), rest, "the kept link serves what the chain did");
    let e = early_both.collect().expect_err("the first link is gone");
    assert!(e.to_string().contains("no longer reaching down"), "{e}");
    // A failover's fetch from it (its own log, then) starts at that checkpoint, or below
    // where its own log reaches: to where epoch 3 began (its one segment is still open,
    // so the checkpoint deleted none of it).
    assert_eq!(ditto_log::replica::fetch_floor(&b2).unwrap(), info.ts);
    let floor = ditto_log::recovery::primary_fetch_floor(&b2, start3).unwrap();
    assert_eq!(floor, start3);
    bp2.close();
    let from_log = |after: Ts| ditto_log::recovery::primary_stream_batches(&b2, 0, after, start3);
    assert!(from_log(floor).is_ok() && from_log(Ts(floor.0 - 1)).is_err(), "exactly there");
    assert!(from_log(floor).unwrap().iter().any(|b| ditto_log::format::decode_batch_header(b).unwrap().last_ts == p3));
    drop(bp2);
    for (dir, what) in
        [(&b2, "recovered after its checkpoint"), (&crashed, "recovered from the chain and epoch 3's log")]
    {
        let again =
            ditto_log::open(dir, OpenOptions { workers: 1, checkpoint_sealed: false, ..Default::default() }).unwrap();
        expect(again.db(), what);
        assert_eq!(value_on(again.db(), 500).as_deref(), Some(&b"three"[..]), "{what}");
        // The open's checkpoint took any chain away.
        assert!(ditto_log::sealed::link_paths(dir).unwrap().is_empty(), "{what}");
    }
}

/// A checkpoint copy cut short by a crash (docs/cluster.md, "A checkpoint copy's removal
/// order"), where it matters most: a sealed link lying on a checkpoint that holds data
/// (a backup that followed a new primary in place and checkpointed the seal away, then was
/// promoted in place itself). Each prefix of the renames leaves a directory that opens as
/// an older state; the checkpoints moved first would leave the link alone, which the open
/// refuses ("recovered state is inconsistent": checked).
#[test]
fn a_checkpoint_copy_cut_short_by_a_crash_leaves_an_older_state_that_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = RealStorage;
    // B2 follows B1 in place; its first checkpoint (due within 100 ms) takes the seal away;
    // then it is stopped and started again, checkpointing no more within the test.
    let two = two_epochs(tmp.path(), |opts| {
        let (addr, b2) = (opts.primary.clone(), opts.data_dir.clone());
        let bk2 = backup::start(BackupOptions { checkpoint_every: Duration::from_millis(100), ..opts }).unwrap();
        wait_until("B2's checkpoint at P1 to take the seal away", Duration::from_secs(20), || {
            ditto_log::sealed::sealed(&b2).unwrap().is_empty()
        });
        bk2.stop("restarted", Duration::from_secs(10)).unwrap();
        drop(bk2);
        backup::start(BackupOptions { hold_replay_at_release: true, ..BackupOptions::new(&addr, &b2, 1, "b2") })
            .unwrap()
    });
    let (b2, p2) = (two.b2.as_path(), two.p2);
    // B2 promoted in place at P2: its replica log of epoch 2 is sealed on the checkpoint at P1.
    let (_db, lock2) = two.bk2.cut_at(p2, "promoted", Duration::from_secs(20)).unwrap();
    ditto_log::sealed::seal_tail(b2, p2, &storage).unwrap();
    drop(lock2);
    let history: Vec<(u32, String)> = (0..100u32)
        .map(|i| (i, format!("v{i}")))
        .chain((100..150).chain(0..10).map(|i| (i, format!("two{i}"))))
        .collect();
    let prefixes = checkpoint_copy_cut_short_opens_as_an_older_state(b2, &history);
    assert_eq!(prefixes, [160, 100, 0], "epoch 2 to P2, the checkpoint at P1, nothing");
}

/// A backup that its primary sends a whole checkpoint moves what it held aside, a rename
/// each (`replaced_by_a_checkpoint_copy`, `to_trash`). After a crash after any number of
/// those renames, the directory `dir` opens as an older state: the state after a prefix
/// of `history` (the puts of keys 0..150 in commit order), shorter the more renames were
/// done, and nothing after the last. Returns the prefix's length after each number of
/// renames.
fn checkpoint_copy_cut_short_opens_as_an_older_state(dir: &std::path::Path, history: &[(u32, String)]) -> Vec<usize> {
    let gone = ditto_log::replica::replaced_by_a_checkpoint_copy(dir).unwrap();
    let names: Vec<_> = gone.iter().map(|p| p.strip_prefix(dir).unwrap().to_path_buf()).collect();
    assert!(names.last().is_some_and(|n| n.ends_with("checkpoints")), "the checkpoints go last: {names:?}");
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let tmp = tempfile::tempdir().unwrap();
    let mut prefixes = Vec::new();
    for k in 0..=names.len() {
        let d = tmp.path().join(format!("cut-after-{k}"));
        copy_dir(dir, &d);
        std::fs::remove_file(d.join("LOCK")).ok();
        let moved: Vec<_> = names[..k].iter().map(|n| d.join(n)).collect();
        ditto_log::replica::to_trash(&d, &moved).unwrap();
        let what = format!("after {k} of the renames {names:?}");
        let opened =
            ditto_log::replica::open_replica(&d, 1, &storage).unwrap_or_else(|e| panic!("{what}: refused: {e}"));
        let held: Vec<Option<Vec<u8>>> = (0..150u32).map(|i| value_on(&opened.db, i)).collect();
        let n = (0..=history.len()).rev().find(|&n| {
            let mut state: Vec<Option<Vec<u8>>> = vec![None; 150];
            for (key, v) in &history[..n] {
                state[*key as usize] = Some(v.clone().into_bytes());
            }
            state == held
        });
        let n = n.unwrap_or_else(|| panic!("{what}: not a state the history went through: {held:?}"));
        assert!(prefixes.last().is_none_or(|&before| n <= before), "{what}: newer than with fewer renames");
        prefixes.push(n);
    }
    assert_eq!(prefixes[0], history.len(), "nothing moved: all of it");
    assert_eq!(*prefixes.last().unwrap(), 0, "everything moved: nothing");
    prefixes
}

/// Copies the files under `from` to `to` (but its trash, which a thread may be emptying).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for f in walk(from).into_iter().filter(|f| !f.starts_with(from.join(ditto_log::replica::TRASH_DIR))) {
        let dest = to.join(f.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&f, &dest).unwrap();
    }
}

/// The chain's bounds and its damage: at most `MAX_SEALED` links (then the node writes a
/// checkpoint at the point instead); a crash between the second seal's steps is read as
/// the chain's newest link and finished by the next open; a missing link in the middle,
/// or a link sealed below the one before it, is refused, naming it, with nothing changed.
#[test]
fn a_chain_of_seals_is_bounded_and_its_damage_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (b1, ts, db, lock) = cut_at_commit_59(tmp.path());
    let p = ts[59];
    drop((db, lock));
    let storage = RealStorage;
    let cut = ditto_log::replica::replica_dir(&b1).join(ditto_log::sealed::CUT_FILE);
    ditto_log::sealed::seal_tail(&b1, p, &storage).unwrap();
    // A crash between the second seal's steps: `replica/CUT` is the newest link.
    std::fs::create_dir_all(cut.parent().unwrap()).unwrap();
    std::fs::write(&cut, ditto_log::sealed::encode_cut(p)).unwrap();
    let chain = ditto_log::sealed::sealed(&b1).unwrap();
    assert_eq!(chain.len(), 2);
    assert!(chain[1].dir.ends_with("replica"), "{chain:?}");
    // Seals at the same point (changes of role with nothing between) fill the chain; the
    // first of them finishes the one a crash cut short.
    for n in 3..=ditto_log::sealed::MAX_SEALED {
        ditto_log::sealed::seal_tail(&b1, p, &storage).unwrap();
        assert_eq!(ditto_log::sealed::sealed(&b1).unwrap().len(), n);
        assert!(b1.join(format!("sealed.{n}")).exists() && b1.join("sealed.2").exists());
    }
    assert!(!ditto_log::sealed::can_seal(&b1).unwrap());
    let e = ditto_log::sealed::seal_tail(&b1, p, &storage).unwrap_err();
    assert!(e.to_string().contains("at most"), "{e}");
    // A link sealed below the one before it is refused.
    let last = b1.join(format!("sealed.{}", ditto_log::sealed::MAX_SEALED));
    std::fs::write(last.join(ditto_log::sealed::CUT_FILE), ditto_log::sealed::encode_cut(ts[10])).unwrap();
    let e = ditto_log::sealed::sealed(&b1).unwrap_err();
    assert!(e.to_string().contains("below the point") && e.to_string().contains("sealed.8"), "{e}");
    std::fs::write(last.join(ditto_log::sealed::CUT_FILE), ditto_log::sealed::encode_cut(p)).unwrap();
    // A missing link in the middle.
    std::fs::rename(b1.join("sealed.3"), tmp.path().join("aside")).unwrap();
    let storage_arc: Arc<dyn Storage> = Arc::new(RealStorage);
    match ditto_log::replica::open_replica_upto(&b1, 1, &storage_arc, None) {
        Err(e) => assert!(e.to_string().contains("sealed.3 is missing"), "{e}"),
        Ok(_) => panic!("a chain with a gap was taken"),
    }
    std::fs::rename(tmp.path().join("aside"), b1.join("sealed.3")).unwrap();
    // Whole again, it opens at the point, and the open's checkpoint takes every link away.
    let opened = ditto_log::replica::open_replica_upto(&b1, 1, &storage_arc, None).unwrap();
    assert_eq!(opened.cut, p);
    for i in 0..100u32 {
        let want = (i <= 59).then(|| format!("v{i}").into_bytes());
        assert_eq!(value_on(&opened.db, i), want, "key {i}");
    }
    drop(opened);
    assert!(ditto_log::sealed::sealed(&b1).unwrap().is_empty());
    assert!(ditto_log::sealed::link_paths(&b1).unwrap().is_empty());
}

/// A promoted backup's directory after a seal in place (its replica log sealed at the point,
/// no checkpoint there yet) and the new primary's first commits, as a crash leaves it:
/// what the directory reports holding, and what recovery makes of it, are exactly the point
/// plus the new commits.
#[test]
fn a_directory_sealed_in_place_recovers_to_the_point_and_what_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let (a, pa_repl, bk1, ts, _) = held_backup_under("all-durable", &pa, &b1);
    let epoch1 = a.logger().epoch();
    pa_repl.stop();
    a.close();
    let p = ts[59];
    let (db, lock) = bk1.cut_at(p, "promoted", Duration::from_secs(20)).unwrap();
    let storage = RealStorage;
    ditto_log::sealed::seal_tail(&b1, p, &storage).unwrap();
    drop(lock);
    let s = ditto_log::sealed::sealed(&b1).unwrap().pop().expect("sealed");
    assert_eq!(s.point, p);
    assert!(!ditto_log::replica::replica_dir(&b1).exists(), "the replica log was moved");
    // Reported as held up to the point on every stream, with nothing above it.
    let h = ditto_log::replica::replica_holdings(&b1, 1, Some(p)).unwrap();
    assert!(h.streams.iter().all(|t| *t >= p), "{h:?}");
    assert_eq!(h.txns_above, 0, "what lay above the point is not counted: it is discarded");
    // A failover's fetch below the point is given the sealed log's batches, cut at it (it
    // was refused before, and a plan that needed it could never be prepared).
    assert!(fetch_floor_is_exact(&b1) <= ts[10]);
    let fetched = ditto_log::replica::replica_stream_batches(&b1, 0, ts[10]).unwrap();
    assert!(!fetched.is_empty());
    for b in &fetched {
        let (batch, _) = ditto_log::format::decode_batch_checksums(b).unwrap();
        let h = batch.header;
        assert!(h.stream.0 == 0 && h.bound_ts > ts[10] && h.last_ts <= p, "{h:?}");
    }
    let last = fetched.iter().map(|b| ditto_log::format::decode_batch_header(b).unwrap().bound_ts).max().unwrap();
    assert!(last >= p, "the fetch reaches the point: {last:?} < {p:?}");
    let start = Ts(ts[99].0 + 7);
    let o = OpenOptions {
        workers: 1,
        epoch: Some(Epoch(epoch1.0 + 1)),
        ts_above: start,
        recovered: Some(ditto_log::Recovered(Arc::clone(&db))),
        checkpoint_sealed: false,
        ..Default::default()
    };
    let bp = ditto_log::open(&b1, o).unwrap();
    let t = bp.db().table_id("t").unwrap();
    let mut w = bp.db().worker(WorkerId(0)).unwrap();
    let newest = w.run(|x| x.put(t, &70u32.to_be_bytes(), b"new")).unwrap().1.wait().unwrap();
    drop(w);
    bp.close();
    drop((bp, db));
    assert!(!ditto_log::sealed::sealed(&b1).unwrap().is_empty(), "no checkpoint took the sealed log");
    // An old primary's report reads its own log over the seal.
    let (h, epoch) = ditto_log::recovery::primary_log_holdings(&b1, Some(p)).unwrap();
    assert_eq!(epoch, Epoch(epoch1.0 + 1));
    assert!(h.streams.iter().all(|t| *t >= p) && h.newest >= newest, "{h:?}");
    assert_eq!(h.txns_above, 1, "the one commit of the new epoch");
    // A fetch from it below the seal's point: the sealed log's batches above, cut at the
    // point, then its own log's (the new epoch's commit).
    let fetched = ditto_log::recovery::primary_stream_batches(&b1, 0, ts[10], start).unwrap();
    let headers: Vec<_> =
        fetched.iter().map(|b| ditto_log::format::decode_batch_checksums(b).unwrap().0.header).collect();
    assert!(headers.iter().all(|h| h.stream.0 == 0 && h.bound_ts > ts[10]), "{headers:?}");
    assert!(headers.iter().any(|h| h.txn_count > 0 && h.last_ts <= p), "the sealed log's part: {headers:?}");
    assert!(headers.iter().any(|h| h.last_ts == newest), "its own log's part: {headers:?}");
    assert!(headers.iter().all(|h| h.last_ts <= p || h.first_ts > p), "nothing of epoch 1 above the point");
    // Rejoining as a backup, as an old primary (copies of the directory): its own log, cut
    // at the next failover's point, becomes the chain's second link, behind the first
    // (its replica log, sealed at P); nothing is written but the seal.
    for (point, key70) in [(newest, Some(b"new".to_vec())), (p, None)] {
        let copy = tmp.path().join(format!("b1-rejoin-{}", point.0));
        copy_dir(&b1, &copy);
        let storage: Arc<dyn Storage> = Arc::new(RealStorage);
        let o = ditto_log::replica::open_replica_upto(&copy, 1, &storage, Some(point)).unwrap();
        assert_eq!((o.cut, o.sealed), (point, Some(point)));
        let chain = ditto_log::sealed::sealed(&copy).unwrap();
        let kinds: Vec<_> = chain.iter().map(|s| (s.point, s.primary_log)).collect();
        assert_eq!(kinds, vec![(p, false), (point, true)], "{chain:?}");
        assert_eq!(o.report.checkpoint_written_bytes, 0, "no checkpoint written");
        drop(o);
        // And recovered from the chain (a crash before the backup's first checkpoint).
        let r = ditto_log::replica::open_replica(&copy, 1, &storage).unwrap();
        for i in 0..100u32 {
            let want = match i {
                0..=59 => Some(format!("v{i}").into_bytes()),
                70 => key70.clone(),
                _ => None,
            };
            assert_eq!(value_on(&r.db, i), want, "key {i} after the rejoin at {}", point.0);
        }
        assert_eq!(r.cut, point);
    }
    // Recovery: the checkpoint (none here), the sealed log up to the point, the new log.
    let again = ditto_log::open(&b1, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    for i in 0..100u32 {
        let want = match i {
            0..=59 => Some(format!("v{i}").into_bytes()),
            70 => Some(b"new".to_vec()),
            _ => None,
        };
        assert_eq!(value_on(again.db(), i), want, "key {i} after recovery");
    }
    assert!(again.db().clock().visible_ts() >= newest);
    assert!(ditto_log::sealed::sealed(&b1).unwrap().is_empty(), "recovery's checkpoint took the sealed log");
}

/// A sealed log has no torn tail (it was fenced durable, and opened before): a checksum
/// that fails in its newest file is damage, and recovery refuses it, naming the file,
/// rather than dropping the rest of the file as a crash's torn tail.
#[test]
fn a_sealed_log_damaged_in_its_newest_file_is_refused_not_read_as_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let (b1, ts, db, lock) = cut_at_commit_59(tmp.path());
    let p = ts[59];
    ditto_log::sealed::seal_tail(&b1, p, &RealStorage).unwrap();
    drop((lock, db));
    let s = ditto_log::sealed::sealed(&b1).unwrap().pop().expect("sealed");
    let mut segs: Vec<_> = walk(&s.dir).into_iter().filter(|f| f.extension().is_some_and(|e| e == "seg")).collect();
    segs.sort();
    let newest = segs.last().expect("a segment").clone();
    let before = std::fs::read(&newest).unwrap();
    flip_a_byte(&newest, before.len() as u64 / 2);
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    match ditto_log::replica::open_replica_upto(&b1, 1, &storage, None) {
        Err(e) => assert!(e.to_string().contains("sealed log is damaged"), "{e}"),
        Ok(_) => panic!("a damaged sealed log was opened"),
    }
    assert!(!ditto_log::sealed::sealed(&b1).unwrap().is_empty(), "nothing changed");
    assert_eq!(std::fs::read(&newest).unwrap().len(), before.len(), "the file was not cut");
}

/// A crash between the seal's two steps leaves the cut inside the replica directory: it
/// is read as the sealed log, cut at the point. A damaged cut stops the open, naming the
/// file, and changes nothing.
#[test]
fn a_seal_cut_short_by_a_crash_is_read_as_sealed_and_a_damaged_cut_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (b1, ts, db, lock) = cut_at_commit_59(tmp.path());
    let p = ts[59];
    drop((db, lock));
    let cut = ditto_log::replica::replica_dir(&b1).join(ditto_log::sealed::CUT_FILE);
    let mut bytes = ditto_log::sealed::encode_cut(p);
    bytes[14] ^= 1;
    std::fs::write(&cut, bytes).unwrap();
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    match ditto_log::replica::open_replica_upto(&b1, 1, &storage, None) {
        Err(e) => assert!(e.to_string().contains("checksum") && e.to_string().contains("CUT"), "{e}"),
        Ok(_) => panic!("a damaged cut was taken"),
    }
    assert!(cut.exists(), "nothing changed");
    std::fs::write(&cut, ditto_log::sealed::encode_cut(p)).unwrap();
    let h = ditto_log::replica::replica_holdings(&b1, 1, Some(p)).unwrap();
    assert!(h.streams.iter().all(|t| *t >= p) && h.txns_above == 0, "{h:?}");
    // A cut below the seal's point is refused.
    match ditto_log::replica::open_replica_upto(&b1, 1, &storage, Some(ts[10])) {
        Err(e) => assert!(e.to_string().contains("below the point"), "{e}"),
        Ok(_) => panic!("cut below the seal"),
    }
    let opened = ditto_log::replica::open_replica_upto(&b1, 1, &storage, None).unwrap();
    assert_eq!(opened.cut, p);
    for i in 0..100u32 {
        let want = (i <= 59).then(|| format!("v{i}").into_bytes());
        assert_eq!(value_on(&opened.db, i), want, "key {i}");
    }
    drop(opened);
    assert!(ditto_log::sealed::sealed(&b1).unwrap().is_empty(), "the open checkpointed the sealed log away");
    assert!(!b1.join(ditto_log::sealed::SEALED_DIR).exists());
}

/// A failover's report reads a replica log of many files by its entries' headers (the
/// newest file whole): what it says is what recovery finds, and its count above a point
/// is exact. A damaged entry header in an older file stops it, naming the file.
#[test]
fn a_report_read_by_headers_says_what_recovery_finds() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 2, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (pa_repl, a_addr) = start_primary_under(&a, None, "local");
    // Files of 16 KiB: the log spans many.
    let opts = BackupOptions { replica_file_bytes: 16 << 10, ..BackupOptions::new(&a_addr, &b1, 2, "b1") };
    let bk = backup::start(opts).unwrap();
    let mut ts = Vec::new();
    for i in 0..400u32 {
        let mut w = a.db().worker(WorkerId(i % 2)).unwrap();
        ts.push(w.run(|x| x.put(t, &i.to_be_bytes(), &[i as u8; 300])).unwrap().1.wait().unwrap());
    }
    let last = *ts.iter().max().unwrap();
    wait_until("the backup to hold everything", Duration::from_secs(20), || {
        bk.state.durable.load(std::sync::atomic::Ordering::SeqCst) >= last.0
    });
    bk.stop("report", Duration::from_secs(10)).unwrap();
    drop(bk);
    pa_repl.stop();
    a.close();
    let files = std::fs::read_dir(ditto_log::replica::replica_dir(&b1)).unwrap().count();
    assert!(files >= 4, "the log spans {files} files");
    let p = ts[250];
    let h = ditto_log::replica::replica_holdings(&b1, 2, Some(p)).unwrap();
    assert_eq!(h.newest, last);
    assert_eq!(h.txns_above, ts.iter().filter(|x| **x > p).count() as u64, "{h:?}");
    // A damaged entry header in the oldest file stops the report.
    let mut names: Vec<_> =
        std::fs::read_dir(ditto_log::replica::replica_dir(&b1)).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    let mut bytes = std::fs::read(&names[0]).unwrap();
    let keep = bytes.clone();
    bytes[ditto_log::replica::REPLICA_HEADER_LEN + 1] ^= 0x40;
    std::fs::write(&names[0], &bytes).unwrap();
    let e = ditto_log::replica::replica_holdings(&b1, 2, None).unwrap_err();
    assert!(e.to_string().contains("rlog-0000000001.seg") && e.to_string().contains("checksum"), "{e}");
    std::fs::write(&names[0], keep).unwrap();
    // Recovery cuts where the report said, and holds every commit.
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let opened = ditto_log::replica::open_replica(&b1, 2, &storage).unwrap();
    assert_eq!(opened.cut, h.cut, "the report's cut is recovery's");
    assert!(opened.cut >= last);
    for i in 0..400u32 {
        assert_eq!(value_on(&opened.db, i), Some(vec![i as u8; 300]), "key {i}");
    }
}

/// A backup that held less than the point (the old primary's last batches reached the other
/// backup only) still follows in place: cut where it holds every stream, it joins the new
/// primary, which sends it the rest from its replica log sealed at the point, cut there,
/// then its own log. No checkpoint is copied, and nothing above the point arrives.
#[test]
fn a_backup_behind_the_point_follows_in_place_and_is_sent_the_rest() {
    behind_the_point(Served::NotYet);
}

/// The same when the new primary's first checkpoint has already taken its sealed log away
/// before the backup joins (an old primary's recovery takes seconds with data): the sealed
/// log was kept for this (`sealed::retire_sealed`), so the rest still comes from it and no
/// checkpoint is copied; the primary's next checkpoint lets it go.
#[test]
fn a_backup_behind_the_point_is_sent_the_rest_after_the_seals_checkpoint_too() {
    behind_the_point(Served::Kept);
}

/// A kept sealed log that is damaged is only a shortcut lost: the backup is sent a
/// checkpoint instead, and ends with the same data. Its floor file damaged (`served`
/// refuses it), or one of the batches of the gap (the read of the gap fails its
/// checksum).
#[test]
fn a_damaged_kept_sealed_log_sends_a_checkpoint_instead() {
    behind_the_point(Served::FloorDamaged);
    behind_the_point(Served::BatchDamaged);
}

/// Where the new primary's sealed log is when the backup behind the point joins.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Served {
    /// Still sealed (no checkpoint yet).
    NotYet,
    /// Kept after the seal's checkpoint (`sealed::retire_sealed`).
    Kept,
    /// Kept, and its FLOOR file damaged.
    FloorDamaged,
    /// Kept, and a byte of its replica log flipped.
    BatchDamaged,
}

fn behind_the_point(served: Served) {
    let checkpoint_first = served != Served::NotYet;
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, b2) = (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("b2"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    // Under `all` with both backups, what one of them lacks is never released: the other
    // holds it unreplayed, and can be cut inside it.
    let (pa_repl, a_addr) = start_primary_under(&a, None, "all-durable");
    let held = |dir: &std::path::Path, name: &str| {
        let opts = BackupOptions { hold_replay_at_release: true, ..BackupOptions::new(&a_addr, dir, 1, name) };
        backup::start(opts).unwrap()
    };
    let (bk1, bk2) = (held(&b1, "b1"), held(&b2, "b2"));
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut put = |range: std::ops::Range<u32>| -> Vec<Ts> {
        let tickets: Vec<_> =
            range.map(|i| w.run(|x| x.put(t, &i.to_be_bytes(), format!("v{i}").as_bytes())).unwrap().1).collect();
        tickets.into_iter().map(|k| k.wait().unwrap()).collect()
    };
    let mut ts = put(0..50);
    let durable = |b: &backup::Backup| b.state.durable.load(std::sync::atomic::Ordering::SeqCst);
    wait_until("both backups to hold the first 50", Duration::from_secs(20), || {
        durable(&bk1) >= ts[49].0 && durable(&bk2) >= ts[49].0
    });
    // The second backup's link goes down; the first receives 50 more.
    bk2.stop("cut off", Duration::from_secs(10)).unwrap();
    ts.extend(put(50..100));
    wait_until("the first backup to hold all 100", Duration::from_secs(20), || durable(&bk1) >= ts[99].0);
    let epoch1 = a.logger().epoch();
    pa_repl.stop();
    a.close();
    // The point inside what only the first backup holds: commit 79 of 100.
    let p = ts[79];
    let storage = RealStorage;
    let (db1, lock1) = bk1.cut_at(p, "promoted", Duration::from_secs(20)).unwrap();
    ditto_log::sealed::seal_tail(&b1, p, &storage).unwrap();
    drop(lock1);
    let start = Ts(p.0 + 7);
    let o = OpenOptions {
        workers: 1,
        epoch: Some(Epoch(epoch1.0 + 1)),
        ts_above: start,
        recovered: Some(ditto_log::Recovered(db1)),
        // Kept, so that the sealed log is there when the backup joins (in a cluster it
        // joins within milliseconds; after the checkpoint, it would be sent that).
        checkpoint_sealed: false,
        ..Default::default()
    };
    let bp = ditto_log::open(&b1, o).unwrap();
    let (bp_repl, bp_addr) = start_primary(&bp, Some((epoch1, p, start)));
    let (sealed_dir, served_dir) = (b1.join(ditto_log::sealed::SEALED_DIR), b1.join(ditto_log::sealed::SERVED_DIR));
    if checkpoint_first {
        let info = bp.checkpoint().unwrap();
        assert!(info.ts >= p, "the seal's checkpoint is at or above the point");
        assert!(!sealed_dir.exists() && served_dir.exists(), "the sealed log is kept for serving only");
        assert!(ditto_log::sealed::sealed(&b1).unwrap().is_empty(), "recovery no longer sees a sealed log");
        match served {
            Served::FloorDamaged => flip_a_byte(&served_dir.join(ditto_log::sealed::FLOOR_FILE), 10),
            Served::BatchDamaged => {
                // A byte near the end of the newest file: inside the last batch, which is
                // in the gap sent (only the gap's payloads are read: a damaged batch below
                // it is not sent, and not read).
                let mut files: Vec<_> =
                    walk(&served_dir).into_iter().filter(|f| f.extension().is_some_and(|e| e == "seg")).collect();
                files.sort();
                let f = files.last().expect("a replica log file with batches in the kept sealed log");
                let len = std::fs::metadata(f).unwrap().len();
                flip_a_byte(f, len - 6);
            }
            _ => {}
        }
    }
    if served == Served::NotYet {
        // A backup already of the new epoch that holds less than the point (welcomed as
        // one behind it, its link dropped while the sealed part came): it is sent the
        // sealed part again, not only the new epoch's log, which vouched past the hole.
        let got = bounds_sent_to_a_hello(&bp_addr, Epoch(epoch1.0 + 1), ts[49], "b3");
        assert!(
            got.iter().any(|&b| b > ts[49] && b <= p),
            "no batch between ts {} and the point {} was sent: {got:?}",
            ts[49].0,
            p.0
        );
    }
    // The second backup: cut where it holds everything, below the point.
    let (db2, lock2, cut) = bk2.cut_at_most(p, "follows", Duration::from_secs(20)).unwrap();
    assert!(cut >= ts[49] && cut < p, "cut at {} (point {})", cut.0, p.0);
    ditto_log::sealed::seal_tail(&b2, cut, &storage).unwrap();
    drop(lock2);
    let opts = BackupOptions {
        engine: Some(Arc::clone(&db2)),
        hold_replay_at_release: true,
        ..BackupOptions::new(&bp_addr, &b2, 1, "b2")
    };
    let bk2 = backup::start(opts).unwrap();
    wait_until("the backup to hold the point", Duration::from_secs(20), || {
        bk2.state.visible.load(std::sync::atomic::Ordering::SeqCst) >= p.0
    });
    let copies = match served {
        Served::NotYet | Served::Kept => 0,
        Served::FloorDamaged | Served::BatchDamaged => 1,
    };
    assert_eq!(bp_repl.checkpoints_sent.load(std::sync::atomic::Ordering::SeqCst), copies, "{served:?}");
    for i in 0..100u32 {
        let want = (i <= 79).then(|| format!("v{i}").into_bytes());
        assert_eq!(value_on(&bk2.db, i), want, "key {i}: nothing above the point arrives");
    }
    let tb = bp.db().table_id("t").unwrap();
    let mut w = bp.db().worker(WorkerId(0)).unwrap();
    let newest = w.run(|x| x.put(tb, &500u32.to_be_bytes(), b"two")).unwrap().1.wait().unwrap();
    wait_until("the backup to see epoch 2's commit", Duration::from_secs(20), || {
        bk2.state.visible.load(std::sync::atomic::Ordering::SeqCst) >= newest.0
    });
    assert_eq!(value_on(&bk2.db, 500).as_deref(), Some(&b"two"[..]));
    if copies == 0 && checkpoint_first {
        // The primary's next checkpoint lets the kept log go.
        bp.checkpoint().unwrap();
        assert!(!served_dir.exists(), "the kept sealed log goes at the next checkpoint");
    }
    bk2.stop("done", Duration::from_secs(10)).unwrap();
    drop(bk2);
    drop(db2);
    bp_repl.stop();
    // Its directory (sealed below the point, then the rest and epoch 2) recovers the same.
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let opened = ditto_log::replica::open_replica(&b2, 1, &storage).unwrap();
    for i in 0..100u32 {
        let want = (i <= 79).then(|| format!("v{i}").into_bytes());
        assert_eq!(value_on(&opened.db, i), want, "key {i} recovered");
    }
    assert_eq!(value_on(&opened.db, 500).as_deref(), Some(&b"two"[..]));
}

/// A backup held at the release under `all-durable` (`held_backup_under`, in `tmp`), its
/// primary stopped, cut at the 60th commit: its directory, the commits' timestamps, and
/// the engine and directory lock `Backup::cut_at` returns.
fn cut_at_commit_59(
    tmp: &std::path::Path,
) -> (std::path::PathBuf, Vec<Ts>, Arc<ditto_engine::Database>, std::fs::File) {
    let (pa, b1) = (tmp.join("a"), tmp.join("b1"));
    let (a, pa_repl, bk1, ts, _) = held_backup_under("all-durable", &pa, &b1);
    pa_repl.stop();
    a.close();
    let (db, lock) = bk1.cut_at(ts[59], "promoted", Duration::from_secs(20)).unwrap();
    (b1, ts, db, lock)
}

/// Flips the byte at `at` of file `f`.
fn flip_a_byte(f: &std::path::Path, at: u64) {
    let mut b = std::fs::read(f).unwrap();
    b[at as usize] ^= 0x40;
    std::fs::write(f, b).unwrap();
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A promotion of a directory that missed a failover (it followed epoch 1, cut at 5 by
/// the failover it missed; it is promoted at epoch 2's point 9) cut short by a crash once
/// its checkpoint at 9 is written, before the replica log and the followed epoch go: the
/// directory then reads as a backup of epoch 1 holding a checkpoint above that epoch's
/// point, which cannot be cut back there (its node would report itself not eligible).
/// The promotion's record tells it apart, and `finish_cut_short_promotion` finishes it:
/// a primary's directory holding the recovered history, opened as such. A record that
/// does not match (the crash came before the checkpoint) is removed, changing nothing
/// else.
#[test]
fn a_promotion_cut_short_after_its_checkpoint_is_finished_from_its_record() {
    use ditto_log::replica::{open_replica_at, open_replica_upto, replica_dir, EpochCut};
    let catalog = tempfile::tempdir().unwrap();
    let d = ditto_log::open(catalog.path(), OpenOptions { workers: 2, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    d.close();
    drop(d);
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    // It followed epoch 1 (its `REPLICA_STATE`).
    let make = || {
        let dir = missed_epoch::missed_epoch_dir(catalog.path(), t, &storage);
        std::fs::write(dir.path().join("REPLICA_STATE"), "epoch 1\n").unwrap();
        dir
    };
    let rows = |db: &ditto_engine::Database| missed_epoch::rows(db, t);
    let want = missed_epoch::recovered();
    let cut = EpochCut { epoch: Epoch(1), point: Ts(5) };

    // The promotion's steps up to its checkpoint, then the crash.
    let dir = make();
    backup::mark_promotion(dir.path(), Epoch(1), Ts(9)).unwrap();
    let o = open_replica_at(dir.path(), 2, &storage, Ts(9), &[cut]).unwrap();
    assert_eq!(rows(&o.db), want);
    drop(o);
    assert!(
        !ditto_log::replica::can_cut_at(dir.path(), Ts(5)).unwrap(),
        "cut short, it reads as holding above epoch 1's point (what made its node not eligible)"
    );
    assert_eq!(backup::finish_cut_short_promotion(dir.path()).unwrap(), Some(Ts(9)));
    assert_eq!(backup::read_followed_epoch(dir.path()).unwrap(), None, "a primary's directory now");
    assert!(!replica_dir(dir.path()).exists() && !dir.path().join("PROMOTION").exists());
    let h = ditto_log::replica::replica_holdings(dir.path(), 2, None).unwrap();
    assert_eq!(h.streams, vec![Ts(9), Ts(9)], "it holds the recovered history up to the point");
    assert_eq!(backup::finish_cut_short_promotion(dir.path()).unwrap(), None, "done once");
    let o = open_replica_upto(dir.path(), 2, &storage, None).unwrap();
    assert_eq!((o.cut, rows(&o.db)), (Ts(9), want.clone()), "it opens to the recovered history");
    drop(o);

    // Cut short before its checkpoint: the record does not match the directory, and is
    // removed; the backup's directory is left as it was, and its promotion can run again.
    let dir = make();
    backup::mark_promotion(dir.path(), Epoch(1), Ts(9)).unwrap();
    let before = ditto_log::replica::replica_holdings(dir.path(), 2, None).unwrap();
    assert_eq!(backup::finish_cut_short_promotion(dir.path()).unwrap(), None);
    assert!(!dir.path().join("PROMOTION").exists());
    assert_eq!(backup::read_followed_epoch(dir.path()).unwrap(), Some(Epoch(1)));
    assert_eq!(ditto_log::replica::replica_holdings(dir.path(), 2, None).unwrap(), before);
    let o = open_replica_at(dir.path(), 2, &storage, Ts(9), &[cut]).unwrap();
    assert_eq!(rows(&o.db), want);
    drop(o);

    // A record made when the base already lay at the point names no checkpoint of its
    // promotion's: not finished, removed.
    let dir = make();
    drop(open_replica_at(dir.path(), 2, &storage, Ts(9), &[cut]).unwrap());
    backup::mark_promotion(dir.path(), Epoch(1), Ts(9)).unwrap();
    assert_eq!(backup::finish_cut_short_promotion(dir.path()).unwrap(), None);
    assert!(!dir.path().join("PROMOTION").exists());
    assert_eq!(backup::read_followed_epoch(dir.path()).unwrap(), Some(Epoch(1)));
}

/// A cluster's backup holds its replay at the release (`hold_replay_at_release`) and hands
/// the batches on when the release covers them; in the dependency mode they go through the
/// graph's merge, which takes a batch's floor as vouching for every stream's transactions
/// up to it that came earlier in the shipping order. Two streams whose commits alternate,
/// so that one stream's batches carry floors over the other's: every commit is replayed,
/// in every replay mode.
#[test]
fn a_held_backup_replays_every_commit_of_two_streams_in_every_mode() {
    for mode in ["serial", "parallel", "dependency", "dependency:0"] {
        let tmp = tempfile::tempdir().unwrap();
        let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
        let a = ditto_log::open(&pa, OpenOptions { workers: 2, ..Default::default() }).unwrap();
        let t = a.db().create_table("t").unwrap();
        let (pa_repl, a_addr) = start_primary_under(&a, None, "local");
        let (replay, _) = ditto_replication::backup::parse_replay(mode).unwrap();
        let opts = BackupOptions { hold_replay_at_release: true, replay, ..BackupOptions::new(&a_addr, &b1, 2, "b1") };
        let bk = backup::start(opts).unwrap();
        wait_until("the backup to join", Duration::from_secs(20), || bk.state.link_up());
        let (mut w0, mut w1) = (a.db().worker(WorkerId(0)).unwrap(), a.db().worker(WorkerId(1)).unwrap());
        let mut last = Ts::ZERO;
        for i in 0..400u32 {
            let w = if i % 2 == 0 { &mut w1 } else { &mut w0 };
            let (_, ticket) = w.run(|x| x.put(t, &i.to_be_bytes(), format!("v{i}").as_bytes())).unwrap();
            // Now and then a wait, so that batches are both small and many.
            if i % 7 == 0 {
                last = last.max(ticket.wait().unwrap());
            } else {
                last = last.max(ticket.ts());
            }
        }
        drop((w0, w1));
        let visible = |b: &backup::Backup| b.state.visible.load(std::sync::atomic::Ordering::SeqCst);
        let end = Instant::now() + Duration::from_secs(20);
        while visible(&bk) < last.0 {
            if let Some(f) = bk.failure() {
                panic!("{mode}: the backup failed: {f}");
            }
            assert!(Instant::now() < end, "{mode}: the backup's view stayed at {} below {}", visible(&bk), last.0);
            std::thread::sleep(Duration::from_millis(5));
        }
        pa_repl.stop();
        a.close();
        let (db, _lock) = bk.cut_at(last, "checked", Duration::from_secs(20)).unwrap();
        let missing: Vec<u32> = (0..400u32).filter(|&i| value_on(&db, i).is_none()).collect();
        assert!(missing.is_empty(), "{mode}: the backup lacks keys {missing:?}");
    }
}

/// A backup whose record of the epoch it followed is damaged refuses to start, naming the
/// file, and keeps what it holds: read as no record, it asked its primary for a copy and
/// set its replica log aside, commits a restarted primary lost included (found by a
/// review, 2026-12-05).
#[test]
fn a_damaged_record_of_the_followed_epoch_stops_the_backup_and_keeps_its_data() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    common::backup_dir_holding_a_row(&a, &b);
    assert!(backup::read_followed_epoch(&b).unwrap().is_some());
    // (With the run of the primary that served it.)
    let recorded = backup::read_followed(&b).unwrap();
    assert!(recorded.is_some_and(|(_, run)| run != 0), "the run was not recorded: {recorded:?}");
    let files = |d: &std::path::Path| {
        let mut v: Vec<_> = std::fs::read_dir(d.join("replica")).unwrap().map(|e| e.unwrap().file_name()).collect();
        v.sort();
        v
    };
    let before = files(&b);
    assert!(!before.is_empty());
    // Damage of any bytes that read as text, multi-byte characters across the 64th byte
    // included (the message quotes the start of it).
    std::fs::write(b.join("REPLICA_STATE"), format!("x{}", "é".repeat(40))).unwrap();
    let err = backup::read_followed_epoch(&b).unwrap_err().to_string();
    assert!(err.contains("REPLICA_STATE") && err.contains("damaged"), "{err}");
    // The epoch alone (an older build's record), and with the run that served it; and
    // damaged forms of either.
    for (text, read) in [("epoch 3\n", Some((Epoch(3), 0))), ("epoch 3 run 00000000000000ff\n", Some((Epoch(3), 255)))]
    {
        std::fs::write(b.join("REPLICA_STATE"), text).unwrap();
        assert_eq!(backup::read_followed(&b).unwrap(), read, "{text}");
    }
    for text in [
        "epoch x\n",
        "epoch 3 run 0000000000000000\n",
        "epoch 3 run ff\n",
        "epoch 3 run 00000000000000fg\n",
        "epoch 3 ran 00000000000000ff\n",
    ] {
        std::fs::write(b.join("REPLICA_STATE"), text).unwrap();
        let err = backup::read_followed_epoch(&b).unwrap_err().to_string();
        assert!(err.contains("REPLICA_STATE") && err.contains("damaged"), "{text}: {err}");
    }
    // (No primary is needed: the record is read before anything is asked of one.)
    let started = backup::start(BackupOptions::new("127.0.0.1:1", &b, 1, "b"));
    let Err(e) = started else { panic!("a backup with a damaged record started") };
    let e = e.to_string();
    assert!(e.contains("REPLICA_STATE"), "{e}");
    assert_eq!(files(&b), before, "the replica log was touched");
}
