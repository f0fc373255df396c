//! Durability, recovery and fault handling of the log, in-process. (Crash tests that
//! SIGKILL a real process live in crates/ditto/tests/crash.rs.)

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ditto_engine::{Error, TableId, WorkerId};
use ditto_log::storage::{LogFile, RealStorage, Storage};
use ditto_log::{open, Durability, LogError, LogOptions, OpenOptions};

fn opts(workers: usize, durability: Durability) -> OpenOptions {
    OpenOptions {
        workers,
        log: LogOptions { durability, segment_bytes_max: 64 << 10, ..LogOptions::default() },
        progress: false,
    }
}

fn put_n(d: &ditto_log::Durable, t: TableId, worker: u32, from: u64, n: u64) {
    let mut w = d.db().worker(WorkerId(worker)).unwrap();
    for i in from..from + n {
        w.run(|x| x.put(t, &i.to_be_bytes(), &i.to_le_bytes().repeat(8)).map(|_| ())).unwrap().1.wait().unwrap();
    }
}

fn count(d: &ditto_log::Durable, t: TableId) -> u64 {
    d.db().count(t).unwrap()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("log")).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

#[test]
fn acknowledged_commits_survive_reopen_in_every_durability() {
    for dur in [
        Durability::EveryBatch,
        Durability::Interval(Duration::from_millis(5)),
        Durability::NoSync(Duration::from_millis(5)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        {
            let d = open(dir.path(), opts(2, dur)).unwrap();
            let t = d.db().create_table("t").unwrap();
            put_n(&d, t, 0, 0, 300);
            put_n(&d, t, 1, 300, 300);
            d.close();
        }
        let d = open(dir.path(), opts(2, dur)).unwrap();
        let t = d.db().table_id("t").expect("table recovered from the catalog");
        assert_eq!(count(&d, t), 600, "{dur:?}");
        assert_eq!(d.db().read().get(t, &599u64.to_be_bytes()).unwrap().unwrap()[..8], 599u64.to_le_bytes());
        // New commits get timestamps after everything recovered.
        let ts = d.db().worker(WorkerId(0)).unwrap().run(|x| x.put(t, b"new", b"1")).unwrap().1.wait().unwrap();
        assert!(ts > d.recovery().cut_ts);
    }
}

#[test]
fn deletes_and_updates_replay_to_the_last_state() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
        let t = d.db().create_table("t").unwrap();
        let mut w = d.db().worker(WorkerId(0)).unwrap();
        w.run(|x| x.insert(t, b"a", b"1")).unwrap().1.wait().unwrap();
        w.run(|x| x.insert(t, b"b", b"1")).unwrap().1.wait().unwrap();
        w.run(|x| x.update(t, b"a", b"2")).unwrap().1.wait().unwrap();
        w.run(|x| x.delete(t, b"b")).unwrap().1.wait().unwrap();
        d.close();
    }
    let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
    let t = d.db().table_id("t").unwrap();
    let r = d.db().read();
    assert_eq!(r.get(t, b"a").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(r.get(t, b"b").unwrap(), None);
}

#[test]
fn torn_tail_is_truncated_and_recovery_continues() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
        let t = d.db().create_table("t").unwrap();
        put_n(&d, t, 0, 0, 50);
        d.close();
    }
    // Half of a batch appended to the last segment: a torn write.
    let segs = segments(dir.path());
    let last = segs.last().unwrap();
    let good_len = std::fs::metadata(last).unwrap().len();
    let whole = bytes::Bytes::from(std::fs::read(last).unwrap());
    let scan = ditto_log::format::read_segment(&whole).unwrap();
    let (off, _) = scan.batches.iter().rev().find(|(_, b)| b.header.txn_count > 0).unwrap();
    let batch = &whole[*off as usize..];
    let mut f = std::fs::OpenOptions::new().append(true).open(last).unwrap();
    io::Write::write_all(&mut f, &batch[..batch.len() / 2]).unwrap();
    drop(f);
    let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
    let t = d.db().table_id("t").unwrap();
    assert_eq!(count(&d, t), 50);
    assert_eq!(d.recovery().torn_tails_truncated, vec![(last.clone(), good_len)]);
}

#[test]
fn corruption_in_the_middle_refuses_to_start_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut o = opts(1, Durability::EveryBatch);
        o.log.compress = false;
        let d = open(dir.path(), o).unwrap();
        let t = d.db().create_table("t").unwrap();
        put_n(&d, t, 0, 0, 20);
        d.close();
    }
    let seg = segments(dir.path()).pop().unwrap();
    let mut b = std::fs::read(&seg).unwrap();
    // Flip a byte inside the payload of the first batch (offset 48 + 64 + 10); valid batches follow.
    b[48 + 64 + 10] ^= 0xFF;
    std::fs::write(&seg, &b).unwrap();
    match open(dir.path(), opts(1, Durability::EveryBatch)) {
        Err(LogError::Corrupt { file, offset, .. }) => {
            assert_eq!(file, seg);
            assert_eq!(offset, 48);
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("recovery must refuse a corrupt log"),
    }
    // And it refused without changing the file.
    assert_eq!(std::fs::read(&seg).unwrap(), b);
}

#[test]
fn online_checkpoint_truncates_covered_segments_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after);
    {
        let d = open(dir.path(), opts(2, Durability::NoSync(Duration::from_millis(2)))).unwrap();
        let t = d.db().create_table("t").unwrap();
        put_n(&d, t, 0, 0, 2000);
        before = segments(dir.path()).len();
        assert!(before > 2, "small segments should have rolled: {before}");
        let info = d.checkpoint().unwrap();
        assert_eq!(info.rows, 2000);
        after = segments(dir.path()).len();
        put_n(&d, t, 1, 2000, 100);
        d.close();
    }
    assert!(after < before, "checkpoint must delete covered segments ({before} -> {after})");
    let d = open(dir.path(), opts(2, Durability::EveryBatch)).unwrap();
    let t = d.db().table_id("t").unwrap();
    assert_eq!(count(&d, t), 2100);
    assert!(d.recovery().checkpoint_ts.is_some());
}

#[test]
fn half_written_checkpoint_is_ignored_for_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
        let t = d.db().create_table("t").unwrap();
        put_n(&d, t, 0, 0, 100);
        d.checkpoint().unwrap();
        put_n(&d, t, 0, 100, 10);
        d.close();
    }
    // A newer checkpoint directory with a part but no MANIFEST: a crash mid-checkpoint.
    let half = dir.path().join("checkpoints").join(format!("ckpt-{:020}", u64::MAX >> 3));
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(half.join("part-0000.dat"), b"DITTOCKP partial").unwrap();
    let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
    let t = d.db().table_id("t").unwrap();
    assert_eq!(count(&d, t), 110);
    assert!(!half.exists(), "the half-written checkpoint is cleaned up");
}

#[test]
fn corrupt_checkpoint_part_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
        let t = d.db().create_table("t").unwrap();
        put_n(&d, t, 0, 0, 100);
        d.checkpoint().unwrap();
        d.close();
    }
    let ck = std::fs::read_dir(dir.path().join("checkpoints")).unwrap().next().unwrap().unwrap().path();
    let part = ck.join("part-0000.dat");
    let mut b = std::fs::read(&part).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 1;
    std::fs::write(&part, b).unwrap();
    match open(dir.path(), opts(1, Durability::EveryBatch)) {
        Err(LogError::Corrupt { file, .. }) => assert_eq!(file, part),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("must refuse a corrupt checkpoint"),
    }
}

/// Storage whose fsyncs (or writes) start failing on demand: a disk-fault simulator.
struct FaultyStorage {
    fail_sync: Arc<AtomicBool>,
    fail_write_enospc: Arc<AtomicBool>,
    syncs: Arc<AtomicU64>,
}

struct FaultyFile {
    inner: Box<dyn LogFile>,
    fail_sync: Arc<AtomicBool>,
    fail_write_enospc: Arc<AtomicBool>,
    syncs: Arc<AtomicU64>,
}

impl Storage for FaultyStorage {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(FaultyFile {
            inner: RealStorage.create_new(path)?,
            fail_sync: self.fail_sync.clone(),
            fail_write_enospc: self.fail_write_enospc.clone(),
            syncs: self.syncs.clone(),
        }))
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        RealStorage.sync_dir(dir)
    }
}

impl LogFile for FaultyFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.fail_write_enospc.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc_enospc()));
        }
        self.inner.write_all(buf)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        self.inner.sync()
    }
}

fn libc_enospc() -> i32 {
    28
}

fn faulty() -> (Arc<dyn Storage>, Arc<AtomicBool>, Arc<AtomicBool>) {
    let fail_sync = Arc::new(AtomicBool::new(false));
    let fail_write = Arc::new(AtomicBool::new(false));
    let s = FaultyStorage {
        fail_sync: fail_sync.clone(),
        fail_write_enospc: fail_write.clone(),
        syncs: Arc::new(AtomicU64::new(0)),
    };
    (Arc::new(s), fail_sync, fail_write)
}

fn fault_case(make_fail: impl Fn(&AtomicBool, &AtomicBool)) {
    let dir = tempfile::tempdir().unwrap();
    let (storage, fail_sync, fail_write) = faulty();
    let mut o = opts(1, Durability::EveryBatch);
    o.log.storage = storage;
    let acked: u64;
    {
        let d = open(dir.path(), o).unwrap();
        let t = d.db().create_table("t").unwrap();
        put_n(&d, t, 0, 0, 20);
        acked = 20;
        make_fail(&fail_sync, &fail_write);
        let mut w = d.db().worker(WorkerId(0)).unwrap();
        // The commit installs in memory but must never be acknowledged.
        let r = w.run(|x| x.put(t, b"doomed", b"1")).and_then(|(_, ticket)| ticket.wait());
        assert!(matches!(r, Err(Error::LogFailed(_))), "a commit whose fsync failed must not be acknowledged: {r:?}");
        // And writes stop: the next commit is refused up front.
        let r = w.run(|x| x.put(t, b"later", b"1"));
        assert!(matches!(r, Err(Error::LogFailed(_))), "writes must stop after a log failure");
        assert!(d.logger().failure().is_some());
    }
    fail_sync.store(false, Ordering::SeqCst);
    fail_write.store(false, Ordering::SeqCst);
    let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
    let t = d.db().table_id("t").unwrap();
    let r = d.db().read();
    for i in 0..acked {
        assert!(r.get(t, &i.to_be_bytes()).unwrap().is_some(), "acknowledged commit {i} lost");
    }
    // The failed commit's outcome is unknown (its bytes may have reached the disk before
    // the fsync failed); the refused one never happened.
    assert!(r.get(t, b"later").unwrap().is_none());
    assert!(count(&d, t) <= acked + 1);
}

#[test]
fn failed_fsync_fails_the_commit_and_stops_writes() {
    fault_case(|sync, _| sync.store(true, Ordering::SeqCst));
}

#[test]
fn full_disk_fails_the_commit_and_stops_writes() {
    fault_case(|_, write| write.store(true, Ordering::SeqCst));
}

#[test]
fn a_second_process_cannot_open_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
    assert!(matches!(open(dir.path(), opts(1, Durability::EveryBatch)), Err(LogError::InUse(_))));
}

#[test]
fn recovery_works_with_a_different_worker_count() {
    let dir = tempfile::tempdir().unwrap();
    {
        let d = open(dir.path(), opts(3, Durability::EveryBatch)).unwrap();
        let t = d.db().create_table("t").unwrap();
        for w in 0..3 {
            put_n(&d, t, w, w as u64 * 100, 100);
        }
        d.close();
    }
    let d = open(dir.path(), opts(1, Durability::EveryBatch)).unwrap();
    let t = d.db().table_id("t").unwrap();
    assert_eq!(count(&d, t), 300);
    put_n(&d, t, 0, 300, 10);
    d.close();
    drop(d);
    let d = open(dir.path(), opts(2, Durability::EveryBatch)).unwrap();
    assert_eq!(count(&d, d.db().table_id("t").unwrap()), 310);
}
