//! A backup cut in place (a promotion's or a follow's `cut_at`) ends its replay threads:
//! they hold its engine, and ran on for good (a set per change of role in place). Alone in
//! its test binary, so that the threads counted are this test's.

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
}
