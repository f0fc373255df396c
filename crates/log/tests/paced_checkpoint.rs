//! Checkpoints written while a node serves (checkpoint.rs, `Pace`): a paced checkpoint
//! writes no faster than its pace and is the same image as an unpaced one; a checkpoint
//! whose storage is cancelled mid-write (a fence) stops short and leaves nothing behind;
//! a backup's checkpoint holds the replay gate only until its snapshot is taken. Real files.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Database, Options, RecordId, ReplayGate, Ts, WorkerId};
use ditto_log::catalog::Catalog;
use ditto_log::replica::{checkpoint_replica, open_replica};
use ditto_log::storage::{Cancellable, LogFile, RealStorage, Storage};
use ditto_log::{open, Durability, LogOptions, OpenOptions};

const ROWS: u64 = 24_000;
const VALUE: usize = 1000;

/// A database of `ROWS` keys with values of `VALUE` bytes (about 24 MB), in `dir`, whose
/// online checkpoints write at most `pace` bytes a second (0: unpaced).
fn filled_paced(dir: &Path, pace: u64) -> ditto_log::Durable {
    let o = OpenOptions {
        workers: 2,
        log: LogOptions {
            durability: Durability::EveryBatch,
            checkpoint_write_bytes_per_s: pace,
            ..LogOptions::default()
        },
        ..Default::default()
    };
    let d = open(dir, o).unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    for chunk in (0..ROWS).collect::<Vec<_>>().chunks(500) {
        let mut last = None;
        for &i in chunk {
            let v = vec![(i % 251) as u8; VALUE];
            last = Some(w.run(|x| x.put(t, &i.to_be_bytes(), &v).map(|_| ())).unwrap().1);
        }
        last.unwrap().wait().unwrap();
    }
    d
}

/// The replay gate a backup's checkpoint takes (no key's late old life is being replayed in
/// these databases).
fn gate(db: &Database) -> ReplayGate<'_> {
    db.replay_checkpoint_gate().expect("nothing is being redirected")
}

fn filled(dir: &Path) -> ditto_log::Durable {
    filled_paced(dir, 0)
}

/// Sorted (key, value) pairs of every table of the database a checkpoint directory holds.
fn rows_of(dir: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let opened = open_replica(dir, 2, &storage).unwrap();
    let db = &opened.db;
    let t = db.table_id("t").unwrap();
    let snap = db.read();
    let mut rows = Vec::new();
    let limit = snap.rid_limit(t).unwrap();
    snap.for_each_record(t, 0..limit, |_, k, _, v| {
        rows.push((k.to_vec(), v.to_vec()));
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    rows.sort();
    rows
}

#[test]
fn a_paced_checkpoint_writes_no_faster_than_its_pace_and_holds_the_same_rows() {
    let src = tempfile::tempdir().unwrap();
    let d = filled(src.path());
    let (fast, paced) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for dir in [&fast, &paced] {
        std::fs::copy(src.path().join("CATALOG"), dir.path().join("CATALOG")).unwrap();
    }
    let unpaced = checkpoint_replica(d.db(), gate(d.db()), fast.path(), &RealStorage, 0).unwrap();
    let rate = 40_000_000u64;
    let t = Instant::now();
    let info = checkpoint_replica(d.db(), gate(d.db()), paced.path(), &RealStorage, rate).unwrap();
    let took = t.elapsed();
    assert_eq!((info.rows, info.bytes), (unpaced.rows, unpaced.bytes));
    assert!(info.bytes > 20_000_000, "enough to pace: {} bytes", info.bytes);
    // Each writer thread tells the pace every 4 MiB, so up to 4 MiB a thread (2 threads)
    // may go unpaced; the rest takes at least its size / the rate.
    let paced_bytes = info.bytes - 2 * (4 << 20);
    let least = Duration::from_secs_f64(paced_bytes as f64 / rate as f64);
    assert!(took >= least, "{} bytes at {} B/s took {:?}, less than {:?}", info.bytes, rate, took, least);
    let rows = rows_of(paced.path());
    assert_eq!(rows.len() as u64, ROWS);
    assert_eq!(rows, rows_of(fast.path()), "a paced checkpoint is the same image");
    d.close();
}

/// Real files; sets `cancel` on the `after`-th write, as a fence would mid-checkpoint.
struct CancelMidWrite {
    writes: Arc<AtomicUsize>,
    after: usize,
    cancel: Arc<AtomicBool>,
}

struct CancelMidWriteFile {
    inner: Box<dyn LogFile>,
    writes: Arc<AtomicUsize>,
    after: usize,
    cancel: Arc<AtomicBool>,
}

impl Storage for CancelMidWrite {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(CancelMidWriteFile {
            inner: RealStorage.create_new(path)?,
            writes: Arc::clone(&self.writes),
            after: self.after,
            cancel: Arc::clone(&self.cancel),
        }))
    }
}

impl LogFile for CancelMidWriteFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if self.writes.fetch_add(1, Ordering::SeqCst) + 1 == self.after {
            self.cancel.store(true, Ordering::SeqCst);
        }
        self.inner.write_all(buf)
    }
    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        self.inner.extend_zeroed(len)
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.inner.sync()
    }
}

#[test]
fn a_checkpoint_cancelled_mid_write_stops_short_and_leaves_nothing() {
    let src = tempfile::tempdir().unwrap();
    let d = filled(src.path());
    for pace in [0u64, 40_000_000] {
        let out = tempfile::tempdir().unwrap();
        std::fs::copy(src.path().join("CATALOG"), out.path().join("CATALOG")).unwrap();
        let cancel = Arc::new(AtomicBool::new(false));
        let inner = CancelMidWrite { writes: Arc::new(AtomicUsize::new(0)), after: 3, cancel: Arc::clone(&cancel) };
        let storage = Cancellable { inner: Arc::new(inner), cancel: Arc::clone(&cancel) };
        // On a thread, so that a checkpoint that never stops fails the test instead of
        // hanging it (a BufWriter retries an `Interrupted` error forever).
        let (tx, rx) = std::sync::mpsc::channel();
        let (db, dir) = (Arc::clone(d.db()), out.path().to_path_buf());
        std::thread::spawn(move || {
            let _ = tx.send(checkpoint_replica(&db, gate(&db), &dir, &storage, pace).map(|i| i.rows));
        });
        let r = rx.recv_timeout(Duration::from_secs(30)).expect("the cancelled checkpoint stopped within 30 s");
        let e = r.expect_err("a cancelled checkpoint fails");
        assert!(e.to_string().contains("cancelled"), "{e}");
        assert!(cancel.load(Ordering::SeqCst), "cancelled mid-write");
        let left: Vec<_> = std::fs::read_dir(out.path().join("checkpoints"))
            .map(|r| r.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "pace {pace}: the cancelled checkpoint left {left:?}");
        // Its files went to the trash (a rename: the fence does not wait for the unlinks)
        // and are deleted there in the background.
        let trash = out.path().join(ditto_log::replica::TRASH_DIR);
        let end = Instant::now() + Duration::from_secs(10);
        while std::fs::read_dir(&trash).is_ok_and(|mut d| d.next().is_some()) {
            assert!(Instant::now() < end, "pace {pace}: the trash was not emptied");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    d.close();
}

#[test]
fn a_paced_checkpoint_that_someone_waits_for_goes_unpaced() {
    let src = tempfile::tempdir().unwrap();
    // 1 MB/s: about 24 s for this database, paced all the way.
    let rate = 1_000_000;
    let d = Arc::new(filled_paced(src.path(), rate));
    let t = Instant::now();
    let writer = {
        let d = Arc::clone(&d);
        std::thread::spawn(move || d.checkpoint().unwrap())
    };
    // Under way and paced, then a joining backup's link (which waits for it).
    std::thread::sleep(Duration::from_millis(500));
    assert!(!writer.is_finished(), "paced at 1 MB/s, the checkpoint is still being written");
    let to = tempfile::tempdir().unwrap();
    let linked = d.link_recent_checkpoint(&to.path().join("ckpt")).unwrap();
    let info = writer.join().unwrap();
    let took = t.elapsed();
    assert!(info.bytes > 20_000_000, "{} bytes", info.bytes);
    let paced_all_the_way = Duration::from_secs_f64((info.bytes - 2 * (1 << 20)) as f64 / rate as f64);
    assert!(took < paced_all_the_way / 2, "waited for, it went unpaced: {took:?} (paced: {paced_all_the_way:?})");
    let (linked, files) = linked.expect("the checkpoint just written is recent");
    assert_eq!(linked.ts, info.ts);
    assert!(!files.is_empty());
    Arc::try_unwrap(d).ok().unwrap().close();
}

/// Where the trash cannot be made (a full disk may refuse a new directory; here a file
/// stands at its name), what would go there is deleted in place instead: the checkpoint
/// an online checkpoint replaces, and the parts of one cancelled mid-write. Nothing is
/// left in `checkpoints/` but the newest complete checkpoint.
#[test]
fn where_the_trash_cannot_be_made_checkpoints_are_deleted_in_place() {
    let src = tempfile::tempdir().unwrap();
    let d = filled(src.path());
    let trash = src.path().join(ditto_log::replica::TRASH_DIR);
    std::fs::write(&trash, b"not a directory").unwrap();
    let first = d.checkpoint().unwrap();
    let t = d.db().table_id("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    w.run(|x| x.put(t, b"one more", b"v").map(|_| ())).unwrap().1.wait().unwrap();
    drop(w);
    let second = d.checkpoint().unwrap();
    assert_ne!(first.dir, second.dir, "a second checkpoint, at a newer timestamp");
    let left: Vec<_> = std::fs::read_dir(src.path().join("checkpoints")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(left, vec![second.dir.clone()], "the first checkpoint was deleted in place");
    assert!(trash.is_file(), "the file at the trash's name is left as it was");

    // A checkpoint cancelled mid-write, with the same obstacle.
    let out = tempfile::tempdir().unwrap();
    std::fs::copy(src.path().join("CATALOG"), out.path().join("CATALOG")).unwrap();
    std::fs::write(out.path().join(ditto_log::replica::TRASH_DIR), b"not a directory").unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    let inner = CancelMidWrite { writes: Arc::new(AtomicUsize::new(0)), after: 3, cancel: Arc::clone(&cancel) };
    let storage = Cancellable { inner: Arc::new(inner), cancel: Arc::clone(&cancel) };
    let e =
        checkpoint_replica(d.db(), gate(d.db()), out.path(), &storage, 0).expect_err("a cancelled checkpoint fails");
    assert!(e.to_string().contains("cancelled"), "{e}");
    let left: Vec<_> = std::fs::read_dir(out.path().join("checkpoints"))
        .map(|r| r.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the cancelled checkpoint left {left:?}");
    d.close();
}

/// A backup's checkpoint holds the replay gate (`Database::replay_checkpoint_gate`) until
/// its snapshot is taken, not through its paced write: a replayer that meanwhile replays a
/// key's late old life onto its later record (a redirect, which takes the gate) goes on at
/// once. The checkpoint is the image at its snapshot, which no such write lies below.
#[test]
fn a_backups_checkpoint_lets_replay_redirect_once_its_snapshot_is_taken() {
    // A backup's database: about 16 MB replayed at ts 1 (past the 4 MiB each of the two
    // writer threads writes before its pace is first told), then key k's later life on
    // record 1 at ts 7, above the read view.
    let db = Database::new(Options { workers: 2 });
    let t = db.create_table("t").unwrap();
    let rows = 16_000u64;
    for i in 0..rows {
        let v = vec![(i % 251) as u8; VALUE];
        db.replay_install(t, RecordId(10 + i), Some(&i.to_be_bytes()), Ts(1), Some(&v)).unwrap();
    }
    db.publish_read_view(Ts(1)).unwrap();
    db.replay_install(t, RecordId(1), Some(b"k"), Ts(7), Some(b"new")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut cat = Catalog::default();
    cat.add(t, "t");
    cat.save(out.path(), &RealStorage).unwrap();
    // 4 MB/s: at least 2 s for what lies past the unpaced start.
    let rate = 4_000_000;
    let writer = {
        let (db, dir) = (Arc::clone(&db), out.path().to_path_buf());
        std::thread::spawn(move || checkpoint_replica(&db, gate(&db), &dir, &RealStorage, rate).unwrap())
    };
    // Its directory is made once the snapshot is taken.
    let end = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(out.path().join("checkpoints")).map_or(true, |mut d| d.next().is_none()) {
        assert!(Instant::now() < end && !writer.is_finished(), "the checkpoint's directory never appeared");
        std::thread::sleep(Duration::from_millis(1));
    }
    // k's old life, on record 0 at ts 3, comes late: it goes below the later life.
    db.replay_install(t, RecordId(0), Some(b"k"), Ts(3), Some(b"old")).unwrap();
    assert!(db.replay_redirecting(), "k's old life is replayed onto record 1");
    assert!(!writer.is_finished(), "the redirect did not wait for the paced write");
    assert!(db.replay_checkpoint_gate().is_none(), "no next checkpoint is started while it lasts");
    let info = writer.join().unwrap();
    assert_eq!((info.ts, info.rows), (Ts(1), rows), "the image at the snapshot: k has no life at 1");
    let read = rows_of(out.path());
    assert_eq!(read.len() as u64, rows);
    assert!(read.iter().all(|(k, _)| k.as_slice() != b"k"));
    // Replay goes on as before: every view reads the primary's history.
    for (view, want) in [(3, Some("old")), (6, None), (7, Some("new"))] {
        if view == 6 {
            db.replay_install(t, RecordId(0), None, Ts(5), None).unwrap();
        }
        db.publish_read_view(Ts(view)).unwrap();
        assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), want.map(str::as_bytes), "at view {view}");
    }
    assert!(!db.replay_redirecting());
}
