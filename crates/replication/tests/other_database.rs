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

/// A primary on a fresh log in `dir`, on `listener`, keeping its quorum's record in `dir`
/// as a standalone server does (under `local`, counting one backup): (its log, table "t",
/// the primary).
fn primary_on(dir: &std::path::Path, listener: std::net::TcpListener) -> (ditto_log::Durable, TableId, Arc<Primary>) {
    let d = ditto_log::open(dir, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    let policy = ditto_replication::CommitPolicy::parse("local").unwrap();
    let record = ditto_replication::QuorumRecord::new(1, policy);
    let opts =
        PrimaryOptions { backups_expected: 1, quorum_record: Some((dir.to_path_buf(), record)), ..Default::default() };
    let p =
        Primary::start(&d, listener, opts, Box::new(move |h| ditto_replication::release_watermark(policy, h))).unwrap();
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

/// A directory `pa` with a first epoch (keys 0..10 of table "t"), then copied to `pc`.
fn served_then_copied(pa: &std::path::Path, pc: &std::path::Path) {
    {
        let a = ditto_log::open(pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
        let t = a.db().create_table("t").unwrap();
        commit(&a, t, 0..10, b"first");
        a.close();
    }
    let copy = std::process::Command::new("cp").arg("-a").arg(pa).arg(pc).status().unwrap();
    assert!(copy.success());
}

/// `dir` opened again (its next epoch) and served under `local`; with `resume`, resuming
/// its backups of the epoch before as a standalone server does (`Durable::opened_from`):
/// (its log, the primary, its address).
fn served_again(dir: &std::path::Path, resume: bool) -> (ditto_log::Durable, Arc<Primary>, String) {
    let d = ditto_log::open(dir, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let resume_from = d.opened_from().filter(|_| resume).map(|(e, p)| (e, p, p));
    let (p, addr) = common::ship(&d, "local", PrimaryOptions { resume_from, ..Default::default() });
    (d, p, addr)
}

/// What `original_followed` left: the table, the epoch the original served, its last
/// commit, its run, and what the backup's directory holds.
struct Original {
    t: TableId,
    epoch: ditto_log::Epoch,
    last: Ts,
    run: u64,
    held: Vec<(u32, Vec<u8>)>,
}

/// The original directory `pa` served again (`served_again`, `resume` as there), keys
/// 10..30 committed, backup `pb` following it up to the last; then both stopped.
fn original_followed(pa: &std::path::Path, pb: &std::path::Path, resume: bool) -> Original {
    let (a, p, addr) = served_again(pa, resume);
    let t = a.db().table_id("t").unwrap();
    let epoch = a.logger().epoch();
    let last = commit(&a, t, 10..30, b"a");
    common::backup_holding(&addr, pb, last);
    let run = p.run();
    p.stop();
    a.close();
    Original { t, epoch, last, run, held: held(pb, t) }
}

/// What the backup directory `dir` holds of keys 0..300: (key, value) pairs.
fn held(dir: &std::path::Path, t: TableId) -> Vec<(u32, Vec<u8>)> {
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
    let kept = ditto_log::replica::open_replica(dir, 1, &storage).unwrap();
    let r = kept.db.read();
    (0..300u32).filter_map(|k| r.get(t, &k.to_be_bytes()).unwrap().map(|v| (k, v.to_vec()))).collect()
}

/// Each link's hello, and the last frame the backup sent on it.
type Said = Vec<(Option<ditto_replication::protocol::Frame>, Option<ditto_replication::protocol::Frame>)>;

/// A stand-in primary of `epoch` on a free port: its i-th link welcomes the backup with
/// `links[i]` (database id, streams, run), resuming it, and a heartbeat at `ts`, then holds
/// the link until the backup closes it or is silent for 1 s: (its address, what each link
/// heard).
fn stand_in(epoch: ditto_log::Epoch, ts: Ts, links: Vec<(u64, u32, u64)>) -> (String, std::thread::JoinHandle<Said>) {
    use ditto_replication::protocol::{read_frame, Frame, Start};
    use std::io::Write;
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap().to_string();
    let peer = std::thread::spawn(move || {
        let mut said = Vec::new();
        for (database, streams, run) in links {
            let (mut s, _) = listener.accept().unwrap();
            let hello = read_frame(&mut s).unwrap();
            let tables = vec![(0u32, "t".to_string())];
            let welcome = Frame::Welcome { epoch, streams, tables, start: Start::Resume, database, run };
            let _ = s.write_all(&welcome.encode());
            let _ = s.write_all(&Frame::Heartbeat { released: ts, acknowledged: ts, sent_us: 0 }.encode());
            s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let mut last = None;
            while let Ok(Some(f)) = read_frame(&mut s) {
                last = Some(f);
            }
            said.push((hello, last));
        }
        said
    });
    (addr, peer)
}

#[test]
fn a_backup_takes_nothing_from_a_primary_of_another_database_at_its_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb, pc) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    // Backup b holds primary a's keys 0..40, and a's id.
    let listener = common::listener_below_the_ephemeral_range();
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
    let listener = common::listener_below_the_ephemeral_range();
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
    // The primary refused it at its hello (its id): nothing recorded, no link, no copy.
    assert_eq!(p2.checkpoints_sent.load(Ordering::Relaxed), 0, "no copy was sent");
    assert!(p2.backups().is_empty());
    let record = ditto_replication::QuorumRecord::read(&pc).unwrap().unwrap();
    assert!(record.backups.is_empty(), "the refused backup was recorded: {:?}", record.backups);
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
    let listener = common::listener_below_the_ephemeral_range();
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
    wait_until("c to drop the refused link", Duration::from_secs(10), || p2.backups().is_empty());
    let record = ditto_replication::QuorumRecord::read(&pc).unwrap().unwrap();
    assert!(record.backups.is_empty(), "the refused backup was recorded: {:?}", record.backups);
    let _ = bk.stop("done", Duration::from_secs(10));
    drop(bk);
    let kept = held(&pb, t);
    assert_eq!(kept.len(), 40);
    assert!(kept.iter().all(|(k, v)| *k < 40 && v == b"a"));
    assert_eq!(identity::read(&pb).unwrap(), Some(a_id));
    p2.stop();
    c.close();
}

/// The backup's own check of the welcome's id (a primary that did not check the hello's,
/// a stand-in here): refused, told why, nothing taken. And a directory that names no
/// database yet takes a primary's id only once the welcome's other checks pass: one
/// refused for another reason (a welcome naming no stream) names none after.
#[test]
fn a_welcome_of_another_database_is_refused_by_the_backup_and_an_id_is_taken_only_with_the_welcome() {
    use ditto_replication::protocol::Frame;
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let (epoch, ts) = common::backup_dir_holding_a_row(&pa, &pb);
    let a_id = identity::read(&pb).unwrap().expect("taken from a");
    // Another database's welcome: refused by the backup, which says why to the primary.
    let other = identity::DatabaseId::new_random();
    let (addr, peer) = stand_in(epoch, ts, vec![(other.to_wire(), 1, 0)]);
    match backup::start(BackupOptions::new(&addr, &pb, 1, "b")) {
        Err(BackupError::OtherDatabase(why)) => assert!(why.contains(&other.to_string()), "{why}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a welcome of another database was taken"),
    }
    let (hello, answer) = peer.join().unwrap().remove(0);
    assert!(
        matches!(hello, Some(Frame::Hello { database, have_ts, .. }) if database == a_id.to_wire() && have_ts == ts)
    );
    assert!(matches!(&answer, Some(Frame::Refuse { reason }) if reason.starts_with(OTHER_DATABASE)), "{answer:?}");
    assert_eq!(identity::read(&pb).unwrap(), Some(a_id));
    // A directory that names none (an older build's), refused for the welcome's streams:
    // still none.
    std::fs::remove_file(pb.join(identity::DATABASE_ID_FILE)).unwrap();
    let (addr, peer) = stand_in(epoch, ts, vec![(other.to_wire(), 0, 0)]);
    match backup::start(BackupOptions::new(&addr, &pb, 1, "b")) {
        Err(BackupError::Protocol(e)) => assert!(e.contains("0 streams"), "{e}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a welcome of no stream was taken"),
    }
    let _ = peer.join();
    assert_eq!(identity::read(&pb).unwrap(), None, "it named a database it took nothing from");
}

/// Two copies of one data directory, each served as a primary, open the same next epoch
/// number with the same database id: a backup of one is refused by the other, which serves
/// that epoch in another run (`identity::check_run`), even where the other's clock is past
/// what the backup holds. Before, it was resumed from the other's log and served the two
/// histories mixed.
#[test]
fn a_backup_takes_nothing_from_another_run_of_its_epoch_number() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb, pc) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"));
    served_then_copied(&pa, &pc);
    // The original serves its next epoch; backup b follows it there.
    let reopen = |dir: &std::path::Path| served_again(dir, false);
    let Original { t, epoch, last, run: a_run, held: before } = original_followed(&pa, &pb, false);
    // The copy serves the same next epoch, in another run, its clock past b's.
    let (c, p2, addr) = reopen(&pc);
    assert_eq!(c.logger().epoch(), epoch, "the same epoch number");
    commit(&c, t, 100..250, b"c");
    assert!(c.db().clock().now() > last);
    assert_eq!(identity::read(&pc).unwrap(), identity::read(&pb).unwrap(), "one database id");
    match backup::start(BackupOptions::new(&addr, &pb, 1, "b")) {
        Err(BackupError::OtherDatabase(why)) => {
            assert!(why.contains(&format!("{a_run:016x}")) && why.contains(&format!("{:016x}", p2.run())), "{why}");
            assert!(why.contains("two primaries served the same epoch number"), "{why}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a backup of another run of its epoch was resumed"),
    }
    assert_eq!(p2.checkpoints_sent.load(Ordering::Relaxed), 0, "no copy was sent");
    assert!(p2.backups().is_empty());
    assert_eq!(held(&pb, t), before, "the backup's directory changed");
    p2.stop();
    c.close();
}

/// A copy of a directory that served an epoch number beside its original, restarted into
/// the next epoch from it: a backup of the original's run of that epoch, holding exactly
/// the point the copy opened from, is refused, where it was resumed from the copy's log,
/// taking the copy's history above its own (the directory records the run that served
/// the epoch it opens from: `EPOCH_RUN`). A backup of the copy's own run is resumed.
#[test]
fn a_backup_of_another_run_of_the_epoch_a_restarted_primary_opened_from_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb, pc, pd) = (tmp.path().join("a"), tmp.path().join("b"), tmp.path().join("c"), tmp.path().join("d"));
    served_then_copied(&pa, &pc);
    // As a standalone server does: a primary that reopened its log into a new epoch
    // resumes its backups of the epoch before (`Durable::opened_from`).
    let reopen = |dir: &std::path::Path| served_again(dir, true);
    // The original serves epoch 2 (run A); backup b follows it to ts `last`.
    let Original { t, epoch, last, run: a_run, held: before } = original_followed(&pa, &pb, true);
    // The copy serves epoch 2 too (run C), as many commits of other values, so that it
    // stamps exactly what b holds, and backup d follows it; then it restarts into epoch
    // 3, opened from epoch 2 at that point: b holds "exactly the point".
    let (c, p2, addr) = reopen(&pc);
    assert_eq!(c.logger().epoch(), epoch, "the same epoch number");
    let c_last = commit(&c, t, 10..30, b"c");
    assert_eq!(c_last, last, "the copy stamped what b holds");
    common::backup_holding(&addr, &pd, c_last);
    let c_run = p2.run();
    p2.stop();
    c.close_and_release();
    let (c, p3, addr) = reopen(&pc);
    assert_eq!(c.opened_from(), Some((epoch, c_last)), "epoch 3 opened from epoch 2 at the copy's last commit");
    match backup::start(BackupOptions::new(&addr, &pb, 1, "b")) {
        Err(BackupError::OtherDatabase(why)) => {
            assert!(why.contains(&format!("{a_run:016x}")) && why.contains(&format!("{c_run:016x}")), "{why}");
            assert!(why.contains("two primaries served the same epoch number"), "{why}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a backup of another run of the epoch opened from was taken"),
    }
    assert_eq!(p3.checkpoints_sent.load(Ordering::Relaxed), 0, "no copy was sent");
    assert_eq!(held(&pb, t), before, "the backup's directory changed");
    assert_eq!(backup::read_followed(&pb).unwrap(), Some((epoch, a_run)), "its record changed");
    // The copy's own backup of epoch 2 holds exactly the point: resumed from the log.
    let bk = backup::start(BackupOptions::new(&addr, &pd, 1, "d")).expect("a backup of the run opened from");
    let more = commit(&c, t, 200..203, b"c3");
    wait_until("d to hold the new epoch's commits", Duration::from_secs(20), || {
        bk.state.received.load(Ordering::Acquire) >= more.0
    });
    assert_eq!(p3.checkpoints_sent.load(Ordering::Relaxed), 0, "d was resumed, not sent a copy");
    let _ = bk.stop("done", Duration::from_secs(10));
    drop(bk);
    p3.stop();
    c.close();
}

/// A primary that cannot record its run of its epoch (`EPOCH_RUN`; here a directory where
/// its temporary file goes) does not start, and so welcomes no backup that a later
/// primary opened from this epoch could not tell from another run's.
#[test]
fn a_primary_that_cannot_record_its_run_does_not_start() {
    let tmp = tempfile::tempdir().unwrap();
    let pa = tmp.path().join("a");
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    std::fs::create_dir_all(pa.join(format!("{}.tmp", identity::EPOCH_RUN_FILE)).join("in the way")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let local = ditto_replication::CommitPolicy::parse("local").unwrap();
    let on_change = Box::new(move |h: &ditto_replication::Holdings| ditto_replication::release_watermark(local, h));
    match Primary::start(&a, listener, PrimaryOptions::default(), on_change) {
        Err(e) => assert!(e.to_string().contains("recording this primary's run"), "{e}"),
        Ok(_) => panic!("a primary that could not record its run started"),
    }
    assert!(!pa.join(identity::EPOCH_RUN_FILE).exists());
    a.close();
}

/// The backup's own check of the run (a primary that did not check the hello's, a
/// stand-in here), at its start and on a reconnect: a welcome of the epoch it follows in
/// another run is refused, told why, and nothing is taken; the run it recorded is taken.
#[test]
fn a_welcome_of_another_run_of_the_followed_epoch_is_refused_by_the_backup() {
    use ditto_replication::protocol::Frame;
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let (epoch, ts) = common::backup_dir_holding_a_row(&pa, &pb);
    let id = identity::read(&pb).unwrap().expect("taken from a").to_wire();
    let (followed, run) = backup::read_followed(&pb).unwrap().expect("recorded");
    assert_eq!(followed, epoch);
    assert_ne!(run, 0);
    // A stand-in primary of that epoch and database, in `runs[i]` on its i-th link.
    let in_runs = |runs: Vec<u64>| stand_in(epoch, ts, runs.into_iter().map(|run| (id, 1, run)).collect());
    // At its start.
    let (addr, peer) = in_runs(vec![run ^ 1]);
    match backup::start(BackupOptions::new(&addr, &pb, 1, "b")) {
        Err(BackupError::OtherDatabase(why)) => {
            assert!(why.contains("two primaries served the same epoch number"), "{why}");
            assert!(why.contains(&format!("{run:016x}")) && why.contains(&format!("{:016x}", run ^ 1)), "{why}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a welcome of another run of its epoch was taken"),
    }
    let said: Vec<_> = peer.join().unwrap().into_iter().map(|(_, last)| last).collect();
    assert!(matches!(&said[0], Some(Frame::Refuse { reason }) if reason.starts_with(OTHER_DATABASE)), "{said:?}");
    assert_eq!(backup::read_followed(&pb).unwrap(), Some((epoch, run)), "its record changed");
    // On a reconnect: its own run first (taken), then, on the next link, another.
    let (addr, peer) = in_runs(vec![run, run ^ 1]);
    let bk = backup::start(BackupOptions::new(&addr, &pb, 1, "b")).expect("its own primary's run");
    wait_until("the backup to stop", Duration::from_secs(20), || bk.state.failure.lock().is_some());
    let why = bk.state.failure.lock().clone().unwrap();
    assert!(why.contains("two primaries served the same epoch number"), "{why}");
    assert_eq!(bk.state.received.load(Ordering::Acquire), ts.0, "it took something");
    let _ = bk.stop("done", Duration::from_secs(10));
    drop(bk);
    let said: Vec<_> = peer.join().unwrap().into_iter().map(|(_, last)| last).collect();
    assert!(matches!(&said[1], Some(Frame::Refuse { reason }) if reason.starts_with(OTHER_DATABASE)), "{said:?}");
    assert_eq!(backup::read_followed(&pb).unwrap(), Some((epoch, run)), "its record changed");
}

/// Real files, except that creating the database id's file fails with ENOSPC.
struct NoRoomForTheId;

impl ditto_log::storage::Storage for NoRoomForTheId {
    fn create_new(&self, path: &std::path::Path) -> std::io::Result<Box<dyn ditto_log::storage::LogFile>> {
        if path.to_string_lossy().contains(identity::DATABASE_ID_FILE) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        ditto_log::storage::RealStorage.create_new(path)
    }
}

/// A backup whose disk has no room for the primary's id takes nothing: its start fails
/// saying so, before any of the primary's data is written, and its directory names no
/// database (a later start, with room, takes the id and the data).
#[test]
fn a_backup_that_cannot_save_the_primarys_id_takes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let listener = common::listener_below_the_ephemeral_range();
    let addr = listener.local_addr().unwrap().to_string();
    let (a, t, p) = primary_on(&pa, listener);
    let last = commit(&a, t, 0..10, b"a");
    let opts = BackupOptions { storage: Some(Arc::new(NoRoomForTheId)), ..BackupOptions::new(&addr, &pb, 1, "b") };
    match backup::start(opts) {
        Err(BackupError::Io { what, source }) => {
            assert!(what.contains("saving the database id"), "{what}: {source}");
            assert_eq!(source.kind(), std::io::ErrorKind::StorageFull, "{source}");
        }
        Err(e) => panic!("failed for another reason: {e}"),
        Ok(_) => panic!("a backup that could not save the primary's id started"),
    }
    assert_eq!(identity::read(&pb).unwrap(), None);
    assert_eq!(backup::read_followed(&pb).unwrap(), None, "it recorded an epoch it took nothing of");
    common::backup_holding(&addr, &pb, last);
    assert_eq!(identity::read(&pb).unwrap(), Some(p.database()));
    assert_eq!(held(&pb, t).len(), 10);
    p.stop();
    a.close();
}
