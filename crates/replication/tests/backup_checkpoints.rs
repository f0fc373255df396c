//! A backup checkpoints by the log it has received, not only by time (as a primary does):
//! what a promotion replays before it serves stays bounded (docs/cluster.md).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::OpenOptions;
use ditto_replication::{backup, BackupOptions, CommitPolicy, Primary, PrimaryOptions};

mod common;
use common::noise_from;

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a checkpoint is being written in the backup directory `b` (its directory is
/// there, its MANIFEST not yet).
fn checkpoint_under_way(b: &std::path::Path) -> bool {
    std::fs::read_dir(b.join("checkpoints")).is_ok_and(|rd| {
        rd.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("ckpt-") && !e.path().join("MANIFEST").exists())
    })
}

/// Replication of `a` under `local` on a free loopback port, `backups` expected; the
/// primary and its address.
fn primary_under_local(a: &ditto_log::Durable, backups: usize) -> (Arc<Primary>, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let policy = CommitPolicy::parse("local").unwrap();
    let opts = PrimaryOptions { backups_expected: backups, ..Default::default() };
    let p =
        Primary::start(a, listener, opts, Box::new(move |h| ditto_replication::release_watermark(policy, h))).unwrap();
    (p, addr)
}

#[test]
fn a_backup_checkpoints_once_it_has_received_enough_log() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (p, addr) = primary_under_local(&a, 1);
    // An hour between checkpoints by time; one per 2 MiB received.
    let opts = BackupOptions {
        checkpoint_every: Duration::from_secs(3600),
        checkpoint_log_min_bytes: 2 << 20,
        ..BackupOptions::new(&addr, &b1, 1, "b1")
    };
    let bk = backup::start(opts).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    // About 8 MiB of writes that do not compress, 20 keys a transaction, waited for at the
    // end only.
    let mut noise = noise_from(0x9e37_79b9_7f4a_7c15);
    let mut pending = Vec::new();
    for i in 0..200u32 {
        let (_, h) = w
            .run(|x| {
                for k in 0..20u32 {
                    x.put(t, &(i * 20 + k).to_be_bytes(), &noise(2000))?;
                }
                Ok(())
            })
            .unwrap();
        pending.push(h);
    }
    let mut last = Ts::ZERO;
    for h in pending {
        last = last.max(h.wait().unwrap());
    }
    wait_until("the backup to replay everything", Duration::from_secs(30), || {
        bk.state.visible.load(Ordering::SeqCst) >= last.0
    });
    let received = bk.state.bytes_received.load(Ordering::SeqCst);
    assert!(received > 6 << 20, "the log received: {received} bytes");
    wait_until("a checkpoint by log growth (the time trigger is an hour away)", Duration::from_secs(30), || {
        bk.state.checkpoints.load(Ordering::SeqCst) >= 1
    });
    assert!(bk.state.checkpoint_ts.load(Ordering::SeqCst) > 0);
    // Less than the threshold since (1 MiB of 2, and of 100% of the ~8 MiB checkpoint):
    // no other checkpoint.
    let n = bk.state.checkpoints.load(Ordering::SeqCst);
    let mut more = Ts::ZERO;
    for i in 0..25u32 {
        more = w.run(|x| x.put(t, &(100_000 + i).to_be_bytes(), &noise(40_000))).unwrap().1.wait().unwrap();
    }
    wait_until("the backup to replay the rest", Duration::from_secs(30), || {
        bk.state.visible.load(Ordering::SeqCst) >= more.0
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(bk.state.checkpoints.load(Ordering::SeqCst), n, "no checkpoint below the threshold");
    bk.stop("done", Duration::from_secs(10)).unwrap();
    drop(w);
    p.stop();
    a.close();
}

/// Real files; a checkpoint's are written slowly (every write of its parts takes 300 ms).
struct SlowCheckpoints;

struct SlowFile(Box<dyn ditto_log::storage::LogFile>, bool);

impl ditto_log::storage::Storage for SlowCheckpoints {
    fn create_new(&self, path: &std::path::Path) -> std::io::Result<Box<dyn ditto_log::storage::LogFile>> {
        let slow = path.components().any(|c| c.as_os_str() == "checkpoints");
        Ok(Box::new(SlowFile(ditto_log::storage::RealStorage.create_new(path)?, slow)))
    }
}

impl ditto_log::storage::LogFile for SlowFile {
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if self.1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        self.0.write_all(buf)
    }
    fn extend_zeroed(&mut self, len: u64) -> std::io::Result<()> {
        self.0.extend_zeroed(len)
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.0.truncate(len)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        self.0.sync()
    }
}

/// A failover's fence does not wait for a backup's checkpoint to be written: it stops it
/// short, and nothing of it is left; the directory still holds everything received.
#[test]
fn a_fence_stops_a_checkpoint_being_written_short() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (p, addr) = primary_under_local(&a, 1);
    let opts = BackupOptions {
        checkpoint_every: Duration::from_millis(100),
        storage: Some(Arc::new(SlowCheckpoints)),
        ..BackupOptions::new(&addr, &b1, 1, "b1")
    };
    let bk = backup::start(opts).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    // About 8 MiB (eight or more slow writes of 1 MiB: over 2 s of checkpoint).
    let value: Vec<u8> = (0..2000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut last = Ts::ZERO;
    for i in 0..200u32 {
        let (_, h) = w
            .run(|x| {
                for k in 0..20u32 {
                    x.put(t, &(i * 20 + k).to_be_bytes(), &value)?;
                }
                Ok(())
            })
            .unwrap();
        last = last.max(h.wait().unwrap());
    }
    wait_until("the backup to replay everything", Duration::from_secs(30), || {
        bk.state.visible.load(Ordering::SeqCst) >= last.0
    });
    // A checkpoint at the read view that holds everything is being written.
    let in_progress = || checkpoint_under_way(&b1);
    wait_until("a checkpoint to be under way", Duration::from_secs(30), in_progress);
    let before = bk.state.checkpoints.load(Ordering::SeqCst);
    bk.fence("failover", Duration::from_secs(20)).unwrap();
    assert_eq!(bk.state.checkpoints.load(Ordering::SeqCst), before, "the checkpoint under way did not complete");
    assert!(!in_progress(), "nothing of the stopped checkpoint is left");
    drop(w);
    p.stop();
    a.close();
    drop(bk);
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
    let opened = ditto_log::replica::open_replica(&b1, 1, &storage).unwrap();
    assert!(opened.cut >= last, "the directory holds everything received");
}

/// A key's new life (deleted, cleaned up on the primary, written again: another record)
/// replayed while the backup's own paced checkpoint reads below it: the replayed write
/// waits for the checkpoint's snapshot to end, the checkpoint goes unpaced meanwhile, and
/// the wait does not count toward the replay's limit. Before 2026-12-07 the reads stayed
/// below the write for the whole paced checkpoint (16 s here), and past the limit (5 ms
/// here, 60 s in a server) the backup's replay failed for good (found by a review).
#[test]
fn a_new_life_replayed_under_the_backups_own_checkpoint_hurries_it_and_does_not_fail() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (p, addr) = primary_under_local(&a, 1);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    // About 16 MB that does not compress, before the backup joins: each of its own
    // checkpoints, 16 s at 1 MB/s, holds all of it.
    let mut noise = noise_from(7);
    let mut last = Ts::ZERO;
    for i in 0..200u32 {
        let values: Vec<Vec<u8>> = (0..20).map(|_| noise(4000)).collect();
        let (_, h) = w
            .run(|x| {
                for (k, v) in values.iter().enumerate() {
                    x.put(t, &(i * 20 + k as u32).to_be_bytes(), v)?;
                }
                Ok(())
            })
            .unwrap();
        last = last.max(h.wait().unwrap());
    }
    let opts = BackupOptions {
        checkpoint_every: Duration::from_millis(300),
        checkpoint_write_bytes_per_s: 1 << 20,
        ..BackupOptions::new(&addr, &b1, 1, "b1")
    };
    let bk = backup::start(opts).unwrap();
    // (Shorter than the hurried checkpoint's write, about 50 ms: the wait must not count it.)
    bk.db.set_replay_wait_max(Duration::from_millis(5));
    // (A commit after the copy: a backup checkpoints only past its last one.)
    let last = w.run(|x| x.put(t, b"moved", b"on")).unwrap().1.wait().unwrap();
    wait_until("the backup to hold everything", Duration::from_secs(30), || {
        bk.state.visible.load(Ordering::SeqCst) >= last.0
    });
    let in_progress = || checkpoint_under_way(&b1);
    wait_until("a checkpoint to be under way", Duration::from_secs(30), in_progress);
    let before = bk.state.checkpoints.load(Ordering::SeqCst);
    // A key's life ended, its record cleaned up on the primary, then a new life.
    w.run(|x| x.put(t, b"k", b"first")).unwrap().1.wait().unwrap();
    assert!(w.run(|x| x.delete(t, b"k")).unwrap().0);
    a.db().reclaim();
    let t0 = Instant::now();
    let again = w.run(|x| x.put(t, b"k", b"second")).unwrap().1.wait().unwrap();
    wait_until("the backup to read the new life", Duration::from_secs(30), || {
        bk.state.visible.load(Ordering::SeqCst) >= again.0 || bk.state.failure.lock().is_some()
    });
    let took = t0.elapsed();
    assert_eq!(bk.state.failure.lock().clone(), None, "the backup's replay failed");
    assert_eq!(bk.db.read().get(t, b"k").unwrap().as_deref(), Some(&b"second"[..]));
    assert!(bk.state.checkpoints.load(Ordering::SeqCst) > before, "the checkpoint it waited for completed");
    // Paced, the checkpoint had most of its 16 s left.
    assert!(took < Duration::from_secs(8), "the new life waited {took:?}: the checkpoint did not hurry");
    drop(w);
    p.stop();
    a.close();
    bk.stop("done", Duration::from_secs(10)).unwrap();
}

/// A backup that joins is sent the primary's recent checkpoint and the log above it, not a
/// checkpoint written for it, while little log has been written since (after a failover,
/// the one the new primary writes in the background); after more log, a new one.
#[test]
fn a_joining_backup_is_sent_a_recent_checkpoint_and_the_log_above_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, b2) = (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("b2"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let value = vec![7u8; 1000];
    let mut put = |range: std::ops::Range<u32>| {
        let mut last = Ts::ZERO;
        for i in range {
            last = w.run(|x| x.put(t, &i.to_be_bytes(), &value)).unwrap().1.wait().unwrap();
        }
        last
    };
    put(0..300);
    let ckpt = a.checkpoint().unwrap();
    let last = put(300..320);
    let (p, addr) = primary_under_local(&a, 2);
    let written = || a.logger().stats.checkpoints.load(Ordering::SeqCst);
    let before = written();
    let bk1 = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
    wait_until("the first backup to hold everything", Duration::from_secs(30), || {
        bk1.state.visible.load(Ordering::SeqCst) >= last.0
    });
    assert_eq!(p.checkpoints_sent.load(Ordering::SeqCst), 1);
    assert_eq!(written(), before, "the checkpoint at ts {} was sent, none written for the backup", ckpt.ts.0);
    let table = bk1.db.table_id("t").unwrap();
    for i in 0..320u32 {
        assert_eq!(bk1.db.read().get(table, &i.to_be_bytes()).unwrap().as_deref(), Some(&value[..]), "key {i}");
    }
    // More log since than half the checkpoint: the next backup gets one written for it.
    let last = put(320..800);
    let bk2 = backup::start(BackupOptions::new(&addr, &b2, 1, "b2")).unwrap();
    wait_until("the second backup to hold everything", Duration::from_secs(30), || {
        bk2.state.visible.load(Ordering::SeqCst) >= last.0
    });
    assert_eq!(p.checkpoints_sent.load(Ordering::SeqCst), 2);
    assert_eq!(written(), before + 1, "a checkpoint written for the second backup");
    let table = bk2.db.table_id("t").unwrap();
    assert_eq!(bk2.db.read().get(table, &799u32.to_be_bytes()).unwrap().as_deref(), Some(&value[..]));
    drop(w);
    p.stop();
    a.close();
}

/// A backup that was down while its primary checkpointed resumes from the log when it
/// returns: the primary's checkpoint keeps the log segments the backup had not made
/// durable (`Primary::log_needed_above`, `Durable::keep_log_for`). With the bound on that
/// log at 0 (`keep_for_backups_max_bytes`), the segments go and it is sent a checkpoint,
/// as every returning backup was before.
#[test]
fn a_backup_that_returns_after_a_checkpoint_resumes_from_the_log_kept_for_it() {
    for (bound, copies) in [(1u64 << 30, 0u64), (0, 1)] {
        let tmp = tempfile::tempdir().unwrap();
        let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
        let log = ditto_log::LogOptions {
            segment_bytes_max: 64 << 10,
            keep_for_backups_max_bytes: bound,
            ..Default::default()
        };
        let a = ditto_log::open(&pa, OpenOptions { workers: 1, log, ..Default::default() }).unwrap();
        let t = a.db().create_table("t").unwrap();
        let mut w = a.db().worker(WorkerId(0)).unwrap();
        let value = vec![7u8; 1000];
        // Ten keys a transaction (each commit waits for its fsync).
        let mut put = |range: std::ops::Range<u32>| {
            let mut last = Ts::ZERO;
            for k in range.step_by(10) {
                let ten = w.run(|x| (k..k + 10).try_for_each(|i| x.put(t, &i.to_be_bytes(), &value).map(|_| ())));
                last = ten.unwrap().1.wait().unwrap();
            }
            last
        };
        let last = put(0..100);
        let (p, addr) = primary_under_local(&a, 1);
        let bk = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
        // (As the primary knows it: from the backup's acknowledgements.)
        wait_until("the primary to know the backup holds everything", Duration::from_secs(30), || {
            p.backups().iter().any(|b| b.durable >= last)
        });
        let sent = p.checkpoints_sent.load(Ordering::SeqCst);
        bk.stop("down for a while", Duration::from_secs(10)).unwrap();
        drop(bk);
        // About 1 MB of log in segments of 64 KiB, then a checkpoint that covers it all.
        let last = put(100..1100);
        let ckpt = a.checkpoint().unwrap();
        assert!(ckpt.ts >= last);
        let bk = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
        wait_until("the backup to hold everything again", Duration::from_secs(30), || {
            bk.state.visible.load(Ordering::SeqCst) >= last.0
        });
        assert_eq!(p.checkpoints_sent.load(Ordering::SeqCst) - sent, copies, "bound {bound}");
        let table = bk.db.table_id("t").unwrap();
        assert_eq!(bk.db.read().get(table, &1099u32.to_be_bytes()).unwrap().as_deref(), Some(&value[..]));
        drop(bk);
        drop(w);
        p.stop();
        a.close();
    }
}

/// A primary that starts removes the checkpoint links a killed process left for a joining
/// backup (`ship-PID-SLOT`, another pid than its own), and leaves its own process's.
#[test]
fn a_primary_removes_the_ship_directories_a_killed_process_left() {
    let tmp = tempfile::tempdir().unwrap();
    let pa = tmp.path().join("a");
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let other = pa.join(format!("ship-{}-0", std::process::id().wrapping_add(1)));
    let other_learner = pa.join(format!("ship-{}-l3", std::process::id().wrapping_add(7)));
    let own = pa.join(format!("ship-{}-1", std::process::id()));
    for d in [&other, &other_learner, &own] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("part-0"), b"linked checkpoint bytes").unwrap();
    }
    let (p, _) = primary_under_local(&a, 0);
    assert!(!other.exists() && !other_learner.exists(), "a killed process's links removed");
    assert!(own.join("part-0").exists(), "this process's own left alone");
    p.stop();
}

/// A backup being sent the log above where it asked, not yet heard from (a new primary's
/// first look at it after a failover, or a node it never counted before), has that log
/// kept for it through checkpoints (`Primary::log_needed_above`, `Link::asked_from`); once
/// it is gone, no more. Here a peer that says it holds ts 1 and then reads nothing holds
/// its gap's send (megabytes) open.
#[test]
fn the_log_a_backup_is_being_sent_is_kept_for_it_before_its_first_ack() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let pa = tmp.path().join("a");
    // Segments of 1 MiB, so that a checkpoint has closed ones to delete.
    let log = ditto_log::LogOptions { segment_bytes_max: 1 << 20, ..Default::default() };
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, log, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    // About 16 MB that does not compress, more than the loopback socket buffers hold.
    // Ten keys a transaction, waited for at the end only.
    let mut noise = noise_from(0x2545_f491_4f6c_dd1d);
    let mut pending = Vec::new();
    for i in 0..400u64 {
        let vals: Vec<Vec<u8>> = (0..10).map(|_| noise(4000)).collect();
        let (_, ticket) = w
            .run(|tx| {
                vals.iter()
                    .enumerate()
                    .try_for_each(|(k, v)| tx.put(t, &(i * 10 + k as u64).to_be_bytes(), v).map(|_| ()))
            })
            .unwrap();
        pending.push(ticket);
    }
    for tk in pending {
        tk.wait().unwrap();
    }
    let (p, addr) = primary_under_local(&a, 1);
    assert_eq!(p.log_needed_above(Ts::ZERO), Ts(u64::MAX), "no backup: nothing kept");
    // Its receive buffer small, set before it connects: this kernel grows an unread
    // socket's buffer toward 32 MB, and the whole gap fitted in it now and then, the send
    // ending before the test looked (CI met it, 2026-12-06).
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let to: std::net::SocketAddr = addr.parse().unwrap();
    sock.connect(&to.into()).unwrap();
    let mut peer: std::net::TcpStream = sock.into();
    let hello = ditto_replication::protocol::Frame::Hello {
        version: ditto_replication::protocol::PROTOCOL_VERSION,
        epoch: a.logger().epoch(),
        have_ts: Ts(1),
        node: "reads-nothing".into(),
        learner: false,
        proves: None,
        database: 0,
        run: 0,
    };
    peer.write_all(&hello.encode()).unwrap();
    wait_until("the gap's send to begin", Duration::from_secs(10), || p.log_needed_above(Ts::ZERO) == Ts(1));
    // Held there while the send waits on the peer, which reads nothing: a checkpoint now
    // keeps every segment above ts 1 (one that deleted them would leave no gap to send).
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(p.log_needed_above(Ts::ZERO), Ts(1));
    a.checkpoint().unwrap();
    let epoch = a.logger().epoch();
    assert!(ditto_log::replica::batches_after(&pa, epoch, Ts(1)).unwrap().is_some(), "the log above ts 1 kept");
    drop(peer);
    wait_until("the link to go", Duration::from_secs(10), || p.log_needed_above(Ts::ZERO) == Ts(u64::MAX));
    // Gone: the next checkpoint keeps nothing for it.
    a.checkpoint().unwrap();
    assert!(ditto_log::replica::batches_after(&pa, epoch, Ts(1)).unwrap().is_none(), "the log above ts 1 went");
    p.stop();
}

/// A backup's directory holds a record id's two lives when its own checkpoint is older
/// than the tombstone the primary's checkpoint covered when it reused the id: here the
/// backup's checkpoint is the copy it joined from (key `old` at the id), and the primary
/// then deletes `old`, checkpoints, and gives the id to `new`. Reopened from its directory
/// (a restart, a promotion), the backup reads `new` with its value and no `old` (before
/// 2026-12-03 the record kept the copy's key: `old` read `new`'s value, and `new` was
/// missing; `Database::recovery_log_begins`).
#[test]
fn a_backup_reopened_over_a_reused_record_id_reads_the_new_key() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (p, addr) = primary_under_local(&a, 1);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    w.run(|x| x.insert(t, b"old", b"old value")).unwrap().1.wait().unwrap();
    a.checkpoint().unwrap();
    // Joins now: its copy (its directory's checkpoint) holds `old`.
    let opts = BackupOptions { checkpoint_every: Duration::from_secs(3600), ..BackupOptions::new(&addr, &b1, 1, "b1") };
    let bk = backup::start(opts).unwrap();
    wait_until("the backup to join", Duration::from_secs(20), || bk.state.link_up());
    assert!(w.run(|x| x.delete(t, b"old")).unwrap().0);
    // The id comes back once the primary's checkpoint covers the tombstone and the epoch
    // GC has let it go; `new` takes it.
    let used = a.db().record_ids_used(t).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.db().record_ids_used(t).unwrap() >= used {
        assert!(Instant::now() < deadline, "the deleted record's id never came back");
        a.checkpoint().unwrap();
        a.db().reclaim();
        std::thread::sleep(Duration::from_millis(10));
    }
    let last = w.run(|x| x.insert(t, b"new", b"new value")).unwrap().1.wait().unwrap();
    assert_eq!(a.db().record_ids_used(t).unwrap(), used, "`new` took the id `old` had");
    wait_until("the backup to hold everything", Duration::from_secs(20), || {
        bk.state.durable.load(Ordering::SeqCst) >= last.0
    });
    bk.stop("done", Duration::from_secs(10)).unwrap();
    bk.release();
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
    let opened = ditto_log::replica::open_replica_upto(&b1, 1, &storage, None).unwrap();
    let r = opened.db.read();
    assert_eq!(r.get(t, b"new").unwrap().as_deref(), Some(&b"new value"[..]));
    assert_eq!(r.get(t, b"old").unwrap(), None);
    drop(w);
    p.stop();
    a.close();
}
