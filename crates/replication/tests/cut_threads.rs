//! A backup cut in place (a promotion's or a follow's `cut_at`) ends its replay threads:
//! they hold its engine, and ran on for good (a set per change of role in place). And a
//! backup let go (`release`) while a replayer waits for a read view its stalled primary
//! will never move ends that replayer too. Alone in its test binary, one test, so that
//! the threads counted are this test's.

use std::time::{Duration, Instant};

use ditto_engine::WorkerId;
use ditto_log::OpenOptions;
use ditto_replication::{backup, BackupOptions, PrimaryOptions, ReplayMode};

mod common;

/// The threads of this process whose names start with one of `prefixes`.
fn threads_named(prefixes: &[&str]) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|name| prefixes.iter().any(|p| name.trim().starts_with(p)))
        .count()
}

#[test]
fn a_cut_in_place_ends_the_backups_replay_threads() {
    for mode in [ReplayMode::Parallel, ReplayMode::Dependency { barrier_every: 1024 }] {
        let tmp = tempfile::tempdir().unwrap();
        let a = ditto_log::open(&tmp.path().join("a"), OpenOptions { workers: 1, ..Default::default() }).unwrap();
        let t = a.db().create_table("t").unwrap();
        // Under `all` with two backups expected and one there, nothing is released.
        let (p, addr) = common::ship(&a, "all-durable", PrimaryOptions { backups_expected: 2, ..Default::default() });
        let opts = BackupOptions {
            hold_replay_at_release: true,
            replay: mode,
            ..BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b")
        };
        let bk = backup::start(opts).unwrap();
        let mut w = a.db().worker(WorkerId(0)).unwrap();
        let mut last = ditto_engine::Ts::ZERO;
        for i in 0..50u32 {
            last = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.wait().unwrap();
        }
        let end = Instant::now() + Duration::from_secs(20);
        while bk.state.durable.load(std::sync::atomic::Ordering::SeqCst) < last.0 {
            assert!(Instant::now() < end, "the backup did not hold the commits");
            std::thread::sleep(Duration::from_millis(5));
        }
        let names = ["ditto-replay", "ditto-repl-hold"];
        let before = threads_named(&names);
        assert!(before > 0, "{mode:?}: no replay thread to count");
        p.stop();
        a.close();
        let (db, _lock) = bk.cut_at(last, "promoted", Duration::from_secs(20)).unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        while threads_named(&names) > 0 {
            assert!(
                Instant::now() < end,
                "{mode:?}: {} of {before} replay threads left after the cut",
                threads_named(&names)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(db);
    }
    a_backup_let_go_ends_a_replayer_waiting_for_a_stalled_release();
}

/// A standalone backup replays ahead of its primary's release; a key's new life on
/// another record waits for the read view to pass its old life's end, and the view is
/// capped by the release, which stalls here (under `all`, a backup expected and away).
/// Let go (`stop`, `release`), the backup's waiting replayer gives way and ends: its wait
/// has no limit while the view is held, and it held a pin that stops the process's memory
/// reclamation.
fn a_backup_let_go_ends_a_replayer_waiting_for_a_stalled_release() {
    let tmp = tempfile::tempdir().unwrap();
    let a = ditto_log::open(&tmp.path().join("a"), OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (p, addr) = common::ship(&a, "all-durable", PrimaryOptions { backups_expected: 2, ..Default::default() });
    let bk = backup::start(BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b")).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    w.run(|x| x.put(t, b"k", b"v1")).unwrap().1.wait().unwrap();
    w.run(|x| x.delete(t, b"k").map(|_| ())).unwrap().1.wait().unwrap();
    // The primary's cleanup unlinks the deleted record: the key's next life takes a new
    // record id (no checkpoint covers the old one's life, so it is not reused).
    a.db().reclaim();
    let last = w.run(|x| x.put(t, b"k", b"v2")).unwrap().1.wait().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while bk.state.durable.load(std::sync::atomic::Ordering::SeqCst) < last.0 {
        assert!(Instant::now() < end, "the backup did not hold the commits");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(bk.state.replayed.load(std::sync::atomic::Ordering::SeqCst) < last.0, "the new life waits");
    let names = ["ditto-replay", "ditto-repl-hold"];
    assert!(threads_named(&names) > 0, "no replayer to count");
    bk.stop("let go", Duration::from_secs(10)).unwrap();
    bk.release();
    let end = Instant::now() + Duration::from_secs(5);
    while threads_named(&names) > 0 {
        assert!(Instant::now() < end, "{} replay threads left after the backup was let go", threads_named(&names));
        std::thread::sleep(Duration::from_millis(10));
    }
    p.stop();
    a.close();
}
