//! Backup upkeep with real files and TCP: its own checkpoints delete the replica log they
//! cover. And: a backup whose disk fills (its writes fail with ENOSPC) stops acknowledging: under
//! `majority-durable` with one backup the primary then releases nothing more, and says why
//! on the backup; nothing acknowledged is lost, and the commit that waited is released once
//! a healthy backup joins. A backup whose disk stalls still acknowledges receipt, and
//! nothing more, until it answers. A primary and backups in this process, over real TCP on
//! loopback, with real files; only the failing backup's storage is simulated.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::storage::{LogFile, RealStorage, StallingStorage, Storage};
use ditto_log::OpenOptions;
use ditto_replication::{backup, release_watermark, BackupOptions, CommitPolicy, Primary, PrimaryOptions};

/// Real files whose writes fail with ENOSPC once `full` is set.
struct FillingDisk {
    full: Arc<AtomicBool>,
}

struct FillingFile {
    inner: Box<dyn LogFile>,
    full: Arc<AtomicBool>,
}

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(28)
}

impl Storage for FillingDisk {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        if self.full.load(Ordering::SeqCst) {
            return Err(enospc());
        }
        Ok(Box::new(FillingFile { inner: RealStorage.create_new(path)?, full: Arc::clone(&self.full) }))
    }
}

impl LogFile for FillingFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(enospc());
        }
        self.inner.write_all(buf)
    }
    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(enospc());
        }
        self.inner.extend_zeroed(len)
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
    fn sync(&mut self) -> io::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(enospc());
        }
        self.inner.sync()
    }
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A primary in this process: its log in `dir`, a table `t`, replication on a free
/// loopback port under `majority-durable` with one backup counted, and the release
/// watermark it computes.
struct TestPrimary {
    d: ditto_log::Durable,
    t: ditto_engine::TableId,
    released: Arc<AtomicU64>,
    addr: String,
    p: Arc<Primary>,
}

impl TestPrimary {
    fn start(dir: &Path) -> TestPrimary {
        let d = ditto_log::open(dir, OpenOptions { workers: 1, progress: false, ..Default::default() }).unwrap();
        let t = d.db().create_table("t").unwrap();
        let policy = CommitPolicy::parse("majority-durable").unwrap();
        let released = Arc::new(AtomicU64::new(0));
        let r2 = Arc::clone(&released);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let p = Primary::start(
            &d,
            listener,
            PrimaryOptions { backups_expected: 1, ..Default::default() },
            Box::new(move |h| {
                let w = release_watermark(policy, h);
                r2.fetch_max(w.0, Ordering::SeqCst);
                w
            }),
        )
        .unwrap();
        // The release moves with the local watermark too (as the server does it).
        let p2 = Arc::clone(&p);
        d.logger().set_progress_listener(Box::new(move |_, _| p2.recompute())).unwrap();
        TestPrimary { d, t, released, addr, p }
    }
}

fn backup_opts(primary: &str, dir: &Path, node: &str, storage: Option<Arc<dyn Storage>>) -> BackupOptions {
    BackupOptions { storage, ..BackupOptions::new(primary, dir, 1, node) }
}

#[test]
fn a_backup_whose_disk_fills_stops_acknowledging_and_nothing_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released, addr, p } = TestPrimary::start(&tmp.path().join("p"));

    let full = Arc::new(AtomicBool::new(false));
    let disk: Arc<dyn Storage> = Arc::new(FillingDisk { full: Arc::clone(&full) });
    let b1 = backup::start(backup_opts(&addr, &tmp.path().join("b1"), "b1", Some(disk))).unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..200u32 {
        let (_, ticket) = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap();
        last = ticket.wait().unwrap();
    }
    wait_until("the first 200 commits released", Duration::from_secs(20), || released.load(Ordering::SeqCst) >= last.0);

    // The disk fills: the next commit is durable on the primary but never released.
    full.store(true, Ordering::SeqCst);
    let (_, ticket) = w.run(|x| x.put(t, b"after", b"full")).unwrap();
    let stuck = ticket.wait().unwrap();
    wait_until("the backup to stop on its full disk", Duration::from_secs(20), || b1.failure().is_some());
    let why = b1.failure().unwrap();
    assert!(why.contains("persisting received batches failed"), "{why}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(released.load(Ordering::SeqCst) < stuck.0, "a commit was released that only the primary held");
    assert!(b1.state.durable.load(Ordering::SeqCst) < stuck.0, "the backup claims durable what its disk refused");

    // Nothing acknowledged is lost: a healthy backup joins and the commit is released.
    let b2 = backup::start(backup_opts(&addr, &tmp.path().join("b2"), "b2", None)).unwrap();
    wait_until("the waiting commit released with a healthy backup", Duration::from_secs(20), || {
        released.load(Ordering::SeqCst) >= stuck.0
    });
    wait_until("the healthy backup's read view", Duration::from_secs(20), || {
        b2.state.visible.load(Ordering::SeqCst) >= stuck.0
    });
    let r = b2.db.read();
    let tb = b2.db.table_id("t").unwrap();
    assert_eq!(r.get(tb, b"after").unwrap().as_deref(), Some(&b"full"[..]));
    for i in 0..200u32 {
        assert_eq!(r.get(tb, &i.to_be_bytes()).unwrap().as_deref(), Some(&b"v"[..]), "row {i}");
    }
    p.stop();
}

/// A backup writes its own checkpoints at its read view and deletes the replica log files
/// they cover, so its disk use stays bounded while the primary writes on.
#[test]
fn a_backup_checkpoints_and_deletes_the_replica_log_it_covers() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let bdir = tmp.path().join("b");
    let opts = BackupOptions {
        checkpoint_every: Duration::from_millis(100),
        replica_file_bytes: 16 << 10,
        ..BackupOptions::new(&addr, &bdir, 1, "b")
    };
    let b = backup::start(opts).unwrap();
    let files = || std::fs::read_dir(bdir.join("replica")).map(|r| r.count()).unwrap_or(0);
    // The highest replica log file number there: how many files the log has gone through.
    let newest = || {
        std::fs::read_dir(bdir.join("replica"))
            .map(|r| {
                r.filter_map(|e| {
                    let n = e.ok()?.file_name().to_string_lossy().to_string();
                    n.strip_prefix("rlog-")?.strip_suffix(".seg")?.parse::<u64>().ok()
                })
                .max()
                .unwrap_or(0)
            })
            .unwrap_or(0)
    };
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut most = 0;
    let mut last = Ts::ZERO;
    for i in 0..1000u32 {
        let (_, ticket) = w.run(|x| x.put(t, &(i % 500).to_be_bytes(), &[i as u8; 400])).unwrap();
        last = ticket.wait().unwrap();
        most = most.max(files());
    }
    wait_until("every commit released", Duration::from_secs(20), || released.load(Ordering::SeqCst) >= last.0);
    wait_until("a backup checkpoint covering the last commit", Duration::from_secs(20), || {
        b.state.checkpoint_ts.load(Ordering::SeqCst) >= last.0
    });
    // The receiver deletes after its next sync: one more commit.
    let (_, ticket) = w.run(|x| x.put(t, b"last", b"1")).unwrap();
    let fence = ticket.wait().unwrap();
    wait_until("the covered replica log files deleted", Duration::from_secs(20), || files() <= 2);
    assert!(b.state.checkpoints.load(Ordering::SeqCst) >= 1);
    assert!(newest() >= 10, "the replica log went through only {} files: the test did not make it grow", newest());
    assert!(most as u64 <= newest() / 2, "{most} files at once of {}: they were not deleted as it went", newest());
    let ckpts = std::fs::read_dir(bdir.join("checkpoints")).unwrap().count();
    assert_eq!(ckpts, 1, "older checkpoints are deleted");
    wait_until("the backup's read view", Duration::from_secs(20), || b.state.visible.load(Ordering::SeqCst) >= fence.0);
    let r = b.db.read();
    let tb = b.db.table_id("t").unwrap();
    assert_eq!(r.get(tb, &499u32.to_be_bytes()).unwrap().as_deref(), Some(&[999u32 as u8; 400][..]));
    p.stop();
}

/// Real files, except that creating or writing a checkpoint file fails with ENOSPC while
/// `full` is set (the replica log's files are untouched).
struct FullForCheckpoints {
    full: Arc<AtomicBool>,
}

impl Storage for FullForCheckpoints {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        if !path.to_string_lossy().contains("checkpoint") {
            return RealStorage.create_new(path);
        }
        if self.full.load(Ordering::SeqCst) {
            return Err(enospc());
        }
        Ok(Box::new(FillingFile { inner: RealStorage.create_new(path)?, full: Arc::clone(&self.full) }))
    }
}

/// A backup whose checkpoints fail (its disk refuses checkpoint files) goes on receiving,
/// acknowledging and replaying, keeps every replica log file (nothing is covered), and
/// leaves no checkpoint behind; once the disk has room again its next checkpoint covers
/// everything and the replica log files go.
#[test]
fn a_failing_backup_checkpoint_keeps_the_replica_log_and_the_backup_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let bdir = tmp.path().join("b");
    let full = Arc::new(AtomicBool::new(true));
    let opts = BackupOptions {
        checkpoint_every: Duration::from_millis(50),
        replica_file_bytes: 16 << 10,
        storage: Some(Arc::new(FullForCheckpoints { full: Arc::clone(&full) })),
        ..BackupOptions::new(&addr, &bdir, 1, "b")
    };
    let b = backup::start(opts).unwrap();
    let files = || std::fs::read_dir(bdir.join("replica")).map(|r| r.count()).unwrap_or(0);
    // Complete checkpoints (an attempt in flight has a directory, but no MANIFEST yet).
    let checkpoints = || {
        let mut c: Vec<std::path::PathBuf> = std::fs::read_dir(bdir.join("checkpoints"))
            .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("MANIFEST").exists()).collect())
            .unwrap_or_default();
        c.sort();
        c
    };
    // The one the backup joined from (streamed by the primary).
    let joined = checkpoints();
    assert_eq!(joined.len(), 1, "{joined:?}");
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..600u32 {
        let (_, ticket) = w.run(|x| x.put(t, &(i % 300).to_be_bytes(), &[i as u8; 400])).unwrap();
        last = ticket.wait().unwrap();
    }
    wait_until("every commit released while checkpoints fail", Duration::from_secs(20), || {
        released.load(Ordering::SeqCst) >= last.0
    });
    wait_until("the backup's read view", Duration::from_secs(20), || b.state.visible.load(Ordering::SeqCst) >= last.0);
    // Many checkpoint rounds pass, each failing.
    std::thread::sleep(Duration::from_millis(500));
    assert!(b.failure().is_none(), "a failing checkpoint stopped the backup: {:?}", b.failure());
    assert_eq!(b.state.checkpoints.load(Ordering::SeqCst), 0, "a checkpoint was counted that the disk refused");
    assert_eq!(b.state.checkpoint_ts.load(Ordering::SeqCst), 0);
    assert_eq!(checkpoints(), joined, "a failed checkpoint was left behind as one");
    let kept = files();
    assert!(kept >= 10, "the replica log holds {kept} files: the test did not make it grow");

    // Room again: the next checkpoint covers everything, and the covered files go.
    full.store(false, Ordering::SeqCst);
    wait_until("a checkpoint once the disk has room", Duration::from_secs(20), || {
        b.state.checkpoint_ts.load(Ordering::SeqCst) >= last.0
    });
    let (_, ticket) = w.run(|x| x.put(t, b"last", b"1")).unwrap();
    let fence = ticket.wait().unwrap();
    wait_until("the covered replica log files deleted", Duration::from_secs(20), || files() <= 2);
    let now = checkpoints();
    assert!(now.len() == 1 && now != joined, "the backup's own checkpoint replaced the one it joined from: {now:?}");
    wait_until("the read view", Duration::from_secs(20), || b.state.visible.load(Ordering::SeqCst) >= fence.0);
    let r = b.db.read();
    let tb = b.db.table_id("t").unwrap();
    assert_eq!(r.get(tb, &299u32.to_be_bytes()).unwrap().as_deref(), Some(&[599u32 as u8; 400][..]));
    p.stop();
}

/// A backup whose disk stalls goes on acknowledging receipt (what a `received` commit
/// policy waits for), but claims nothing durable, and replays nothing, until the disk
/// answers; then everything is durable, released under `majority-durable`, and readable.
#[test]
fn a_backup_whose_disk_stalls_still_acknowledges_receipt_and_nothing_more() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let stalled = Arc::new(AtomicBool::new(false));
    let disk: Arc<dyn Storage> = Arc::new(StallingStorage { stalled: Arc::clone(&stalled) });
    let b = backup::start(backup_opts(&addr, &tmp.path().join("b"), "b", Some(disk))).unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut put = |from: u32, to: u32| {
        let mut last = Ts::ZERO;
        for i in from..to {
            last = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.wait().unwrap();
        }
        last
    };
    let before = put(0, 50);
    wait_until("the first commits released", Duration::from_secs(20), || released.load(Ordering::SeqCst) >= before.0);

    stalled.store(true, Ordering::SeqCst);
    let received = || p.backups().first().map_or(0, |i| i.received.0);
    // Two rounds: the second is sent once the first is received, so it arrives while the
    // backup's disk holds the first.
    let mut last = Ts::ZERO;
    for round in [(50, 100), (100, 150)] {
        last = put(round.0, round.1);
        wait_until("receipt acknowledged while the backup's disk stalls", Duration::from_secs(10), || {
            received() >= last.0
        });
    }
    assert!(b.state.durable.load(Ordering::SeqCst) < last.0, "durable claimed while the disk hangs");
    assert!(b.state.replayed.load(Ordering::SeqCst) < last.0, "replayed before it was persisted");
    assert!(released.load(Ordering::SeqCst) < last.0, "released under majority-durable without the backup's disk");

    stalled.store(false, Ordering::SeqCst);
    wait_until("released once the disk answers", Duration::from_secs(20), || released.load(Ordering::SeqCst) >= last.0);
    wait_until("the backup's read view", Duration::from_secs(20), || b.state.visible.load(Ordering::SeqCst) >= last.0);
    let r = b.db.read();
    let tb = b.db.table_id("t").unwrap();
    for i in 0..150u32 {
        assert_eq!(r.get(tb, &i.to_be_bytes()).unwrap().as_deref(), Some(&b"v"[..]), "row {i}");
    }
    assert!(b.failure().is_none());
    p.stop();
}

/// Real files whose every fsync first calls `before_sync` (to count them, or to panic).
struct SyncHookDisk {
    before_sync: Arc<dyn Fn() + Send + Sync>,
}

struct SyncHookFile {
    inner: Box<dyn LogFile>,
    before_sync: Arc<dyn Fn() + Send + Sync>,
}

impl Storage for SyncHookDisk {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(SyncHookFile { inner: RealStorage.create_new(path)?, before_sync: Arc::clone(&self.before_sync) }))
    }
}

impl LogFile for SyncHookFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all(buf)
    }
    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        self.inner.extend_zeroed(len)
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
    fn sync(&mut self) -> io::Result<()> {
        (self.before_sync)();
        self.inner.sync()
    }
}

/// A backup given an interval (`BackupOptions::persist_interval`, a server's
/// `--durability interval`) fsyncs its replica log at most once per interval while the
/// primary commits without pause, and everything is still made durable and released; an
/// every-batch backup beside it, fed the same commits, fsyncs far more often.
#[test]
fn a_paced_backup_fsyncs_at_most_once_per_interval_and_releases_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let interval = Duration::from_millis(100);
    let (paced_syncs, eager_syncs) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let disk = |syncs: &Arc<AtomicU64>| -> Option<Arc<dyn Storage>> {
        Some(Arc::new(SyncHookDisk {
            before_sync: Arc::new({
                let syncs = Arc::clone(syncs);
                move || {
                    syncs.fetch_add(1, Ordering::SeqCst);
                }
            }),
        }))
    };
    let paced = backup::start(BackupOptions {
        persist_interval: Some(interval),
        ..backup_opts(&addr, &tmp.path().join("paced"), "paced", disk(&paced_syncs))
    })
    .unwrap();
    let _eager = backup::start(backup_opts(&addr, &tmp.path().join("eager"), "eager", disk(&eager_syncs))).unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    // Counted from the first commit: the joins' own syncs are not the pacing's.
    let (p0, e0) = (paced_syncs.load(Ordering::SeqCst), eager_syncs.load(Ordering::SeqCst));
    let t0 = Instant::now();
    let mut last = Ts::ZERO;
    let mut i = 0u32;
    while t0.elapsed() < Duration::from_millis(1000) {
        let (_, ticket) = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap();
        last = ticket.wait().unwrap();
        i += 1;
    }
    wait_until("every commit durable on the paced backup", Duration::from_secs(20), || {
        paced.state.durable.load(Ordering::SeqCst) >= last.0
    });
    let elapsed = t0.elapsed();
    wait_until("every commit released", Duration::from_secs(20), || released.load(Ordering::SeqCst) >= last.0);
    let (paced_n, eager_n) = (paced_syncs.load(Ordering::SeqCst) - p0, eager_syncs.load(Ordering::SeqCst) - e0);
    // At most one per interval over the time it took, plus the first (which waits for no
    // interval) and a file rolled over.
    let most = elapsed.as_millis() as u64 / interval.as_millis() as u64 + 3;
    assert!(paced_n <= most, "{paced_n} fsyncs in {elapsed:?} at one per {interval:?}");
    assert!(paced_n >= 1 && eager_n > paced_n, "paced {paced_n}, every batch {eager_n}, {i} commits");
    wait_until("the paced backup's read view", Duration::from_secs(20), || {
        paced.state.visible.load(Ordering::SeqCst) >= last.0
    });
    let r = paced.db.read();
    let tb = paced.db.table_id("t").unwrap();
    for k in 0..i {
        assert_eq!(r.get(tb, &k.to_be_bytes()).unwrap().as_deref(), Some(&b"v"[..]), "row {k}");
    }
    p.stop();
}

/// A stop (a cluster's fence) does not wait out a paced backup's interval: what was
/// received and not yet fsynced is made durable at once, and the stop returns well within
/// its limit although the interval is 60 s.
#[test]
fn a_stop_makes_a_paced_backup_durable_without_waiting_for_its_interval() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released: _, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let b = backup::start(BackupOptions {
        persist_interval: Some(Duration::from_secs(60)),
        ..backup_opts(&addr, &tmp.path().join("b"), "b", None)
    })
    .unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let (_, ticket) = w.run(|x| x.put(t, b"first", b"1")).unwrap();
    let first = ticket.wait().unwrap();
    wait_until("the first commit durable (no interval before the first fsync)", Duration::from_secs(20), || {
        b.state.durable.load(Ordering::SeqCst) >= first.0
    });
    let mut last = first;
    for i in 0..50u32 {
        let (_, ticket) = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap();
        last = ticket.wait().unwrap();
    }
    wait_until("the rest received", Duration::from_secs(20), || b.state.received.load(Ordering::SeqCst) >= last.0);
    assert!(b.state.durable.load(Ordering::SeqCst) < last.0, "made durable within the 60 s interval");
    let t0 = Instant::now();
    b.stop("the test fences it", Duration::from_secs(10)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "the stop took {:?}", t0.elapsed());
    assert!(b.state.durable.load(Ordering::SeqCst) >= last.0, "what it received is durable after the stop");
    p.stop();
}

/// A stop (a cluster's fence) does not wait for a receiver that is reconnecting: here its
/// primary is gone and a listener on its port takes the connection and never answers, so
/// the receiver waits up to 5 s for a welcome (a host gone silent holds a connect as
/// long). The stop returns at once with everything received durable (before, it waited
/// for the receiver to give up; a fence's timeout could pass first and fail a failover).
#[test]
fn a_stop_does_not_wait_for_a_receiver_that_is_reconnecting() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released: _, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let b = backup::start(backup_opts(&addr, &tmp.path().join("b"), "b", None)).unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..20u32 {
        let (_, ticket) = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap();
        last = ticket.wait().unwrap();
    }
    wait_until("the commits durable on the backup", Duration::from_secs(20), || {
        b.state.durable.load(Ordering::SeqCst) >= last.0
    });
    p.stop();
    drop(d);
    // The primary's port, taken by a listener that holds every connection and says nothing.
    let mut silent = None;
    let t0 = Instant::now();
    while silent.is_none() {
        silent = std::net::TcpListener::bind(&addr).ok();
        assert!(t0.elapsed() < Duration::from_secs(10), "the primary's port stayed taken");
        std::thread::sleep(Duration::from_millis(5));
    }
    let silent = silent.unwrap();
    let (held_tx, held) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in silent.incoming() {
            if held_tx.send(s).is_err() {
                return;
            }
        }
    });
    let conn = held.recv_timeout(Duration::from_secs(20)).expect("the backup connects again");
    let t0 = Instant::now();
    b.fence("the test fences it", Duration::from_secs(10)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "the fence took {:?}", t0.elapsed());
    assert!(b.state.durable.load(Ordering::SeqCst) >= last.0);
    drop(conn);
}

/// A backup whose persister panics stops, saying which thread panicked and why, and its
/// link goes down (the primary stops counting it; the commit that waited on it is not
/// released); a fence of it ends at once instead of waiting out its timeout. Before, the
/// backup stayed linked and silent, acknowledging nothing, and a fence waited for the
/// persister's end for its whole timeout.
#[test]
fn a_backup_whose_persister_panics_stops_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let bug = Arc::new(AtomicBool::new(false));
    // (Its fsync panics once `bug` is set: a storage layer's bug, say.)
    let b2 = Arc::clone(&bug);
    let disk: Arc<dyn Storage> = Arc::new(SyncHookDisk {
        before_sync: Arc::new(move || {
            if b2.load(Ordering::SeqCst) {
                panic!("a storage layer's bug");
            }
        }),
    });
    let b1 = backup::start(backup_opts(&addr, &tmp.path().join("b1"), "b1", Some(disk))).unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..50u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.wait().unwrap();
    }
    wait_until("the first commits released", Duration::from_secs(20), || released.load(Ordering::SeqCst) >= last.0);
    bug.store(true, Ordering::SeqCst);
    let stuck = w.run(|x| x.put(t, b"after", b"bug")).unwrap().1.wait().unwrap();
    wait_until("the backup to stop", Duration::from_secs(20), || b1.failure().is_some());
    let why = b1.failure().unwrap();
    assert!(why.contains("the persister of this backup panicked (a storage layer's bug)"), "{why}");
    wait_until("its link to go", Duration::from_secs(20), || p.backups().is_empty());
    assert!(released.load(Ordering::SeqCst) < stuck.0, "not released on a backup that did not persist it");
    let t0 = Instant::now();
    assert!(b1.fence("test", Duration::from_secs(10)).is_err(), "its persisting failed");
    assert!(t0.elapsed() < Duration::from_secs(5), "the fence waited {:?}", t0.elapsed());
}

/// A disk whose files under a checkpoint's directory cannot be created while `armed`:
/// the creation panics (a storage layer's bug, say), counted in `panics`.
struct PanickingCheckpointDisk {
    armed: Arc<AtomicBool>,
    panics: Arc<AtomicU64>,
}

impl Storage for PanickingCheckpointDisk {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        if self.armed.load(Ordering::SeqCst) && path.to_string_lossy().contains("ckpt-") {
            self.panics.fetch_add(1, Ordering::SeqCst);
            panic!("a storage layer's bug");
        }
        RealStorage.create_new(path)
    }
}

/// A backup whose checkpointer panics goes on: still linked and acknowledging, and its
/// next rounds checkpoint once the fault is gone (at the same read view as the round that
/// panicked, which left its checkpoint's directory behind), and it opens again from that
/// checkpoint. Before, the panic ended the checkpointer's thread without a word: the
/// backup never checkpointed again, and its replica log grew until its disk filled.
#[test]
fn a_backup_whose_checkpointer_panics_goes_on_and_checkpoints_once_it_can() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let (armed, panics) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicU64::new(0)));
    let disk: Arc<dyn Storage> =
        Arc::new(PanickingCheckpointDisk { armed: Arc::clone(&armed), panics: Arc::clone(&panics) });
    let dir = tmp.path().join("b1");
    let opts =
        BackupOptions { checkpoint_every: Duration::from_millis(50), ..backup_opts(&addr, &dir, "b1", Some(disk)) };
    let b1 = backup::start(opts.clone()).unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..50u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.wait().unwrap();
    }
    wait_until("the commits released", Duration::from_secs(20), || released.load(Ordering::SeqCst) >= last.0);
    wait_until("two checkpoints to panic", Duration::from_secs(20), || panics.load(Ordering::SeqCst) >= 2);
    assert_eq!(b1.state.checkpoints.load(Ordering::SeqCst), 0);
    assert_eq!(b1.failure(), None, "the backup goes on");
    let more = w.run(|x| x.put(t, b"after", b"the panics")).unwrap().1.wait().unwrap();
    wait_until("a commit after the panics released", Duration::from_secs(20), || {
        released.load(Ordering::SeqCst) >= more.0
    });
    assert_eq!(p.backups().len(), 1, "still linked");
    // (Released once durable there: replayed and visible a little later.)
    wait_until("the backup's view to reach it", Duration::from_secs(20), || {
        b1.state.visible.load(Ordering::SeqCst) >= more.0
    });
    let view = b1.state.visible.load(Ordering::SeqCst);
    wait_until("a round at the view it has now to panic", Duration::from_secs(20), || {
        let n = panics.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(200));
        panics.load(Ordering::SeqCst) > n
    });
    armed.store(false, Ordering::SeqCst);
    wait_until("a checkpoint once the fault is gone", Duration::from_secs(20), || {
        b1.state.checkpoints.load(Ordering::SeqCst) >= 1
    });
    assert_eq!(b1.state.checkpoint_ts.load(Ordering::SeqCst), view, "at the view the panicked rounds had");
    assert_eq!(b1.failure(), None);
    b1.fence("the test restarts it", Duration::from_secs(10)).unwrap();
    b1.release();
    // It opens again, from that checkpoint, holding every commit.
    let b2 = backup::start(BackupOptions { storage: None, ..opts }).unwrap();
    wait_until("the reopened backup to replay every commit", Duration::from_secs(20), || {
        b2.state.visible.load(Ordering::SeqCst) >= more.0
    });
    let r = b2.db.read();
    assert_eq!(r.get(t, b"after").unwrap().as_deref(), Some(&b"the panics"[..]));
    assert_eq!(r.get(t, &49u32.to_be_bytes()).unwrap().as_deref(), Some(&b"v"[..]));
}

/// Real files, but the catalog's save fails once (ENOSPC on its temporary file) after
/// `armed` is set.
struct CatalogFailsOnce {
    armed: Arc<AtomicBool>,
    failed: Arc<AtomicBool>,
}

impl Storage for CatalogFailsOnce {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let catalog =
            path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(ditto_log::catalog::CATALOG_FILE));
        if catalog && self.armed.load(Ordering::SeqCst) && !self.failed.swap(true, Ordering::SeqCst) {
            return Err(enospc());
        }
        RealStorage.create_new(path)
    }
}

/// A table the primary creates while a backup follows, whose save in the backup's catalog
/// fails once: the link drops, the next welcome saves it, and the rows of the table that
/// the backup then acknowledges are there when its directory is opened again. (Before
/// 2026-12-06 the engine took the table before the catalog was saved: the next welcome
/// found it there and saved nothing, and every later open of the backup's directory was
/// refused, "no such table", holding what it had acknowledged durable.)
#[test]
fn a_table_whose_catalog_save_failed_is_saved_at_the_next_welcome() {
    let tmp = tempfile::tempdir().unwrap();
    let TestPrimary { d, t, released, addr, p } = TestPrimary::start(&tmp.path().join("p"));
    let (armed, failed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let disk: Arc<dyn Storage> = Arc::new(CatalogFailsOnce { armed: Arc::clone(&armed), failed: Arc::clone(&failed) });
    let bdir = tmp.path().join("b");
    let b = backup::start(backup_opts(&addr, &bdir, "b", Some(disk))).unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let (_, ticket) = w.run(|x| x.put(t, b"first", b"row")).unwrap();
    let first = ticket.wait().unwrap();
    wait_until("the first row durable on the backup", Duration::from_secs(20), || {
        b.state.durable.load(Ordering::SeqCst) >= first.0
    });
    armed.store(true, Ordering::SeqCst);
    let u = d.db().create_table("u").unwrap();
    let mut last = Ts::ZERO;
    for i in 0..50u32 {
        let (_, ticket) = w.run(|x| x.put(u, &i.to_be_bytes(), b"v")).unwrap();
        last = ticket.wait().unwrap();
    }
    wait_until("the rows of u released", Duration::from_secs(30), || released.load(Ordering::SeqCst) >= last.0);
    assert!(failed.load(Ordering::SeqCst), "the catalog's save failed once");
    assert!(b.failure().is_none(), "{:?}", b.failure());
    wait_until("the backup durable to the last row", Duration::from_secs(20), || {
        b.state.durable.load(Ordering::SeqCst) >= last.0
    });
    b.stop("the test is done", Duration::from_secs(10)).unwrap();
    drop(b);
    p.stop();
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let opened = ditto_log::replica::open_replica(&bdir, 1, &storage).unwrap_or_else(|e| panic!("reopened: {e}"));
    let tu = opened.db.table_id("u").unwrap();
    let r = opened.db.read();
    for i in 0..50u32 {
        assert_eq!(r.get(tu, &i.to_be_bytes()).unwrap().as_deref(), Some(&b"v"[..]), "row {i}");
    }
}
