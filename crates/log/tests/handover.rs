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

/// A primary in `dir` with one worker and 50 commits of `value` (keys 0-49) in table "t":
/// its log, engine, table, worker and last commit's timestamp.
fn primary_with_50_commits(
    dir: &std::path::Path,
    value: &[u8],
) -> (ditto_log::Durable, Arc<ditto_engine::Database>, ditto_engine::TableId, ditto_engine::Worker, Ts) {
    let d = ditto_log::open(dir, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let db = Arc::clone(d.db());
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..50u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), value)).unwrap().1.wait().unwrap();
    }
    (d, db, t, w, last)
}

#[test]
fn an_engine_whose_log_was_released_commits_into_the_next_log() {
    let dir = tempfile::tempdir().unwrap();
    let (d, db, t, mut w, last) = primary_with_50_commits(dir.path(), b"one");
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

/// A switchover's old primary is fenced (`Durable::fence`) while its background checkpoint
/// is being written: the checkpoint stops short, leaving nothing, and the fence returns
/// only once it has, so nothing writes the directory after it (its node then reads the
/// log; a checkpoint that went on deleted segments under that read). No checkpoint is
/// begun after it, and every commit is still recovered from the log.
#[test]
fn a_fence_stops_a_checkpoint_under_way_and_leaves_the_log_whole() {
    let dir = tempfile::tempdir().unwrap();
    // Paced at 1 MB/s: the 4 MB checkpoint would take about 4 s.
    let log = ditto_log::LogOptions { checkpoint_write_bytes_per_s: 1_000_000, ..Default::default() };
    let d = ditto_log::open(dir.path(), OpenOptions { workers: 1, log, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let value = [7u8; 200];
    for chunk in 0..20u32 {
        w.run(|x| {
            for i in chunk * 1000..(chunk + 1) * 1000 {
                x.put(t, &i.to_be_bytes(), &value)?;
            }
            Ok(())
        })
        .unwrap()
        .1
        .wait()
        .unwrap();
    }
    drop(w);
    let listing = |sub: &str| {
        let mut v: Vec<_> = std::fs::read_dir(dir.path().join(sub)).unwrap().map(|e| e.unwrap().file_name()).collect();
        v.sort();
        v
    };
    let segments = listing("log");
    let d2 = d.clone();
    let writer = std::thread::spawn(move || d2.checkpoint());
    // Until the checkpoint has begun writing its parts.
    let t0 = std::time::Instant::now();
    while listing("checkpoints").is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the checkpoint began");
        std::thread::sleep(Duration::from_millis(5));
    }
    let t1 = std::time::Instant::now();
    d.fence();
    // The checkpoint has ended (its thread returns its error right after): well before
    // the 4 s it would have taken.
    while !writer.is_finished() && t1.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(writer.is_finished(), "the fence stops the checkpoint short");
    let e = writer.join().unwrap().expect_err("the checkpoint stopped short");
    assert!(e.to_string().contains("fenced"), "{e}");
    assert!(
        !listing("checkpoints").iter().any(|c| dir.path().join("checkpoints").join(c).join("MANIFEST").exists()),
        "no checkpoint completed"
    );
    assert_eq!(listing("log"), segments, "no segment deleted");
    assert!(d.checkpoint().is_err(), "no checkpoint after a fence");
    drop(d);
    let again = ditto_log::open(dir.path(), OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let r = again.db().read();
    for i in 0..20_000u32 {
        assert_eq!(r.get(t, &i.to_be_bytes()).unwrap().as_deref(), Some(&value[..]), "key {i}");
    }
}

/// An old primary's own log sealed at the point had its torn tails cut before the seal: a
/// last batch that does not check in it now is damage. The open refuses it, naming it, and
/// cuts nothing (before, it was cut back as a torn tail, on disk, before the open found the
/// stream short of the point; with another stream's floor above the point, the open went on
/// without the commits it held).
#[test]
fn a_sealed_own_log_whose_last_batch_does_not_check_is_refused_and_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (d, _, _, _, last) = primary_with_50_commits(dir.path(), &[5u8; 100]);
    d.close_and_release();
    ditto_log::sealed::seal_own_log(dir.path(), last, &RealStorage).unwrap();
    drop(d);
    // The sealed link's newest segment, a byte of its last batch flipped.
    let link = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with(ditto_log::sealed::SEALED_DIR))
        .expect("a sealed link");
    let mut segs: Vec<_> = std::fs::read_dir(&link)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    let seg = segs.last().expect("a segment").clone();
    let mut raw = std::fs::read(&seg).unwrap();
    let n = raw.len();
    raw[n - 20] ^= 0x10;
    std::fs::write(&seg, &raw).unwrap();
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(RealStorage);
    let e = ditto_log::replica::open_replica(dir.path(), 1, &storage).err().expect("refused").to_string();
    assert!(e.contains("sealed log") && e.contains("damage"), "{e}");
    assert_eq!(std::fs::read(&seg).unwrap(), raw, "the sealed segment was cut");
}
