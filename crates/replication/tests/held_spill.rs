//! A backup whose replay is held at the primary's release (a cluster's) while the release
//! stalls and commits go on: what it holds past `BackupOptions::held_in_memory_max` lies
//! in its replica log alone and is read back when released, or when a promotion's cut
//! takes it; read back damaged, replay stops saying so. Real files and TCP; the release
//! the primary tells is held back by the test (`Primary::start`'s release function).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ditto_engine::{TableId, Ts, WorkerId};
use ditto_log::OpenOptions;
use ditto_replication::{backup, Backup, BackupOptions, CommitPolicy, Primary, PrimaryOptions, ReplayMode};

mod common;
use common::wait_until;

/// The in-memory bound the tests hold the backup to.
const HELD_MAX: u64 = 64 << 10;

struct Held {
    _tmp: tempfile::TempDir,
    a: ditto_log::Durable,
    p: Arc<Primary>,
    bk: Backup,
    bdir: std::path::PathBuf,
    t: TableId,
    /// What the primary tells as released.
    tell_upto: Arc<AtomicU64>,
    /// Released before the stall (visible on the backup).
    released: Ts,
    /// Committed (and durable on the backup) during the stall, with its keys.
    stalled: Vec<(Ts, u32)>,
}

fn value(k: u32) -> Vec<u8> {
    format!("{k}:").repeat(200).into_bytes()
}

/// A primary with two streams and a held backup; 100 commits released, then 1,000 of
/// about 1 KiB each (two streams) while the release stalls.
fn held_past_memory() -> Held {
    held_past_memory_with(ReplayMode::Parallel, 64 << 20)
}

/// `held_past_memory` with the backup replaying in `mode`, its replica log files rolled
/// past `file_bytes`.
fn held_past_memory_with(mode: ReplayMode, file_bytes: u64) -> Held {
    held(mode, file_bytes, HELD_MAX, 1000, true)
}

/// A held backup kept to `held_max` bytes in memory, and `stalled` commits made while
/// the release stalls (each waited for when `wait_each`, else only the last).
fn held(mode: ReplayMode, file_bytes: u64, held_max: u64, stalled: u32, wait_each: bool) -> Held {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 2, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let tell_upto = Arc::new(AtomicU64::new(u64::MAX));
    let policy = CommitPolicy::parse("majority-received").unwrap();
    let cap = Arc::clone(&tell_upto);
    let release = Box::new(move |h: &ditto_replication::Holdings| {
        ditto_replication::release_watermark(policy, h).min(Ts(cap.load(Ordering::Acquire)))
    });
    let p =
        Primary::start(&a, listener, PrimaryOptions { backups_expected: 1, ..Default::default() }, release).unwrap();
    let p2 = Arc::clone(&p);
    a.logger().set_progress_listener(Box::new(move |_, _| p2.recompute())).unwrap();
    let bk = backup::start(BackupOptions {
        hold_replay_at_release: true,
        held_in_memory_max: held_max,
        replay: mode,
        replica_file_bytes: file_bytes,
        // Its own checkpoints during the stall, which delete the files they cover.
        checkpoint_every: Duration::from_millis(50),
        ..BackupOptions::new(&addr, &pb, 2, "b")
    })
    .unwrap();
    wait_until("the backup to join", Duration::from_secs(30), || bk.state.link_up());
    let commit_then = |w: &mut ditto_engine::Worker, k: u32, wait: bool| {
        let ticket = w.run(|x| x.put(t, &k.to_be_bytes(), &value(k))).unwrap().1;
        match wait {
            true => ticket.wait().unwrap(),
            false => ticket.ts(),
        }
    };
    let commit = |w: &mut ditto_engine::Worker, k: u32| commit_then(w, k, true);
    let mut w0 = a.db().worker(WorkerId(0)).unwrap();
    let mut w1 = a.db().worker(WorkerId(1)).unwrap();
    let released = (0..100u32).map(|k| commit(if k % 2 == 0 { &mut w0 } else { &mut w1 }, k)).max().unwrap();
    wait_until("the first commits to be visible on the backup", Duration::from_secs(30), || {
        bk.state.visible.load(Ordering::Acquire) >= released.0
    });
    tell_upto.store(released.0, Ordering::Release);
    let end = 100 + stalled;
    let stalled: Vec<(Ts, u32)> = (100..end)
        .map(|k| (commit_then(if k % 2 == 0 { &mut w0 } else { &mut w1 }, k, wait_each || k + 2 >= end), k))
        .collect();
    let last = stalled.iter().map(|(ts, _)| *ts).max().unwrap();
    wait_until("the backup to make the stalled commits durable", Duration::from_secs(30), || {
        bk.state.durable.load(Ordering::Acquire) >= last.0
    });
    wait_until("a checkpoint of the backup's at the release", Duration::from_secs(30), || {
        bk.state.checkpoint_ts.load(Ordering::Acquire) >= released.0
    });
    drop((w0, w1));
    Held { _tmp: tmp, a, p, bk, bdir: pb, t, tell_upto, released, stalled }
}

/// Asks the kernel to drop the cached pages of every file under `dir` (synced already:
/// `POSIX_FADV_DONTNEED` drops clean pages only), so that what is read next comes from
/// the disk (or, on a VM, from whatever caches the host keeps).
fn evict_from_page_cache(dir: &std::path::Path) {
    use std::os::fd::AsRawFd;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            evict_from_page_cache(&path);
        } else if let Ok(f) = std::fs::File::open(&path) {
            let _ = f.sync_all();
            // SAFETY: an open file's descriptor; the call only advises the kernel.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// What reading spilled batches back costs a held backup's catch-up: 200,000 commits of
/// about 1 KiB held while the release stalls, with 64 KiB in memory (nearly all spilled)
/// and with 1 GiB (none), then released; prints the time from the release to the last
/// commit visible, for each: spilled with the replica log in the page cache (it was just
/// written), spilled with its pages dropped first ("cold"), and in memory.
/// `cargo test --release -p ditto-replication --test held_spill -- --ignored --nocapture`
#[test]
#[ignore]
fn catch_up_after_a_stall_with_and_without_spilling() {
    for round in 0..2 {
        for (name, max) in [("spilled", HELD_MAX), ("spilled, cold", HELD_MAX), ("in memory", 1 << 30)] {
            let h = held(ReplayMode::Parallel, 64 << 20, max, 200_000, false);
            if name.ends_with("cold") {
                evict_from_page_cache(&h.bdir);
            }
            let last = h.stalled.iter().map(|(ts, _)| *ts).max().unwrap();
            let (spilled_now, in_memory) = (spilled(&h.bk), held_bytes(&h.bk));
            let t0 = std::time::Instant::now();
            h.tell_upto.store(u64::MAX, Ordering::Release);
            h.p.recompute();
            wait_until("the released commits to be visible", Duration::from_secs(120), || {
                h.bk.state.visible.load(Ordering::Acquire) >= last.0
            });
            let el = t0.elapsed();
            println!(
                "round {round}, {name}: {spilled_now} batches spilled, {} MB held in memory; visible {:.0} ms after the release",
                in_memory / 1_000_000,
                el.as_secs_f64() * 1e3
            );
            h.p.stop();
            h.a.close();
        }
    }
}

fn held_bytes(bk: &Backup) -> u64 {
    bk.state.held_bytes.load(Ordering::Acquire)
}

fn spilled(bk: &Backup) -> u64 {
    bk.state.held_spilled.load(Ordering::Acquire)
}

/// Held past the bound: most of the stalled commits lie in the replica log alone, memory
/// holds at most the bound, nothing above the release is visible; released, every one
/// is read back and replayed, with its value.
#[test]
fn batches_held_past_the_memory_bound_are_read_back_from_the_replica_log_when_released() {
    read_back_when_released(held_past_memory());
}

/// The same in the dependency mode (held batches go in the shipping order), with replica
/// log files rolled every 64 KiB (a batch's place names its file).
#[test]
fn the_same_in_the_dependency_mode_with_the_replica_log_rolling_often() {
    let h = held_past_memory_with(ReplayMode::Dependency { barrier_every: 1024 }, 64 << 10);
    let files = std::fs::read_dir(ditto_log::replica::replica_dir(&h.bdir)).unwrap().count();
    assert!(files > 4, "{files} replica log files");
    read_back_when_released(h);
}

fn read_back_when_released(h: Held) {
    assert!(spilled(&h.bk) > 0, "nothing spilled ({} bytes held in memory)", held_bytes(&h.bk));
    assert!(held_bytes(&h.bk) <= HELD_MAX, "{} bytes held in memory, past {HELD_MAX}", held_bytes(&h.bk));
    assert!(h.bk.state.visible.load(Ordering::Acquire) <= h.released.0, "visible above the release");
    assert_eq!(h.bk.db.read().get(h.t, &1099u32.to_be_bytes()).unwrap(), None, "an unreleased commit is readable");
    let spilled_before = spilled(&h.bk);
    h.tell_upto.store(u64::MAX, Ordering::Release);
    h.p.recompute();
    let last = h.stalled.iter().map(|(ts, _)| *ts).max().unwrap();
    wait_until("the released commits to be visible", Duration::from_secs(30), || {
        h.bk.state.visible.load(Ordering::Acquire) >= last.0
    });
    assert!(
        h.bk.state.held_read_back.load(Ordering::Acquire) >= spilled_before,
        "read back {} of {spilled_before} spilled",
        h.bk.state.held_read_back.load(Ordering::Acquire)
    );
    assert_eq!((spilled(&h.bk), held_bytes(&h.bk)), (0, 0), "nothing is held once everything is released");
    let r = h.bk.db.read();
    for k in 0..1100u32 {
        assert_eq!(r.get(h.t, &k.to_be_bytes()).unwrap().as_deref(), Some(&value(k)[..]), "key {k}");
    }
    drop(r);
    assert_eq!(h.bk.failure(), None);
    h.p.stop();
    h.a.close();
}

/// A promotion's cut at a point inside the spilled commits replays them up to it, read
/// back from the replica log, and nothing above it.
#[test]
fn a_cut_takes_spilled_batches_up_to_its_point_from_the_replica_log() {
    let h = held_past_memory();
    assert!(spilled(&h.bk) > 0);
    let (point, _) = h.stalled[700];
    h.p.stop();
    h.a.close();
    let (db, _lock) = h.bk.cut_at(point, "promoted", Duration::from_secs(30)).unwrap();
    let r = db.read();
    for (ts, k) in &h.stalled {
        let got = r.get(h.t, &k.to_be_bytes()).unwrap();
        if *ts <= point {
            assert_eq!(got.as_deref(), Some(&value(*k)[..]), "key {k} at ts {} below the point", ts.0);
        } else {
            assert_eq!(got, None, "key {k} at ts {} above the point {}", ts.0, point.0);
        }
    }
}

/// A spilled batch damaged in the replica log is not replayed: the backup stops, saying
/// what it read back was not what it received, and shows nothing of it.
#[test]
fn a_spilled_batch_damaged_in_the_replica_log_stops_replay_saying_so() {
    let h = held_past_memory();
    assert!(spilled(&h.bk) > 0);
    // The newest file's last bytes are the newest batch's, held past the bound.
    let rdir = ditto_log::replica::replica_dir(&h.bdir);
    let newest = std::fs::read_dir(&rdir).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    let mut b = std::fs::read(&newest).unwrap();
    let at = b.len() - 10;
    b[at] ^= 0xff;
    std::fs::write(&newest, b).unwrap();
    h.tell_upto.store(u64::MAX, Ordering::Release);
    h.p.recompute();
    wait_until("the backup to stop", Duration::from_secs(30), || h.bk.failure().is_some());
    let why = h.bk.failure().unwrap();
    assert!(why.contains("is not what was received"), "{why}");
    let (last, k) = *h.stalled.iter().max().unwrap();
    assert!(h.bk.state.visible.load(Ordering::Acquire) < last.0, "the damaged batch was made visible");
    assert_eq!(h.bk.db.read().get(h.t, &k.to_be_bytes()).unwrap(), None);
    h.p.stop();
    h.a.close();
}
