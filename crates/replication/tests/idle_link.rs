//! An idle link dozes (`Primary::serve_link`: no look every millisecond once nothing has
//! been queued or released for a while), with real files and TCP: a release that moves
//! while it dozes still reaches the backup at once (`set_released` sends it), not at the
//! link's next idle heartbeat (up to 200 ms later).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ditto_engine::WorkerId;
use ditto_log::{Durability, LogOptions};
use ditto_replication::{backup, BackupOptions, PrimaryOptions};

mod common;

#[test]
fn a_release_made_while_the_link_dozes_reaches_the_backup_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    // Every-batch durability: a thread defers its flushes only under it.
    let log = LogOptions { durability: Durability::EveryBatch, ..LogOptions::default() };
    let opts = PrimaryOptions { backups_expected: 1, ..Default::default() };
    let (a, t, p, addr) = common::start_primary(&tmp.path().join("p"), log, "majority-received", opts);
    let b = backup::start(BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b")).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    // This thread ships its commits itself, at once, as a server's runtime thread does
    // before it parks (`ditto_log::flush_before_sleeping`): the batch goes straight onto
    // the link's socket and its thread, dozing, is not woken.
    ditto_log::flush_before_sleeping();
    let mut slowest = Duration::ZERO;
    // Five rounds, each after 300 ms idle (the link dozes after 50 ms): at a random point
    // of the link's 200 ms heartbeat period, so a release that waited for the heartbeat
    // would take over 100 ms in most rounds.
    for i in 0..5u32 {
        std::thread::sleep(Duration::from_millis(300 + 37 * u64::from(i)));
        let ts = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.ts();
        ditto_log::flush_before_sleeping();
        let started = Instant::now();
        while p.released() < ts {
            assert!(started.elapsed() < Duration::from_secs(10), "never released");
            std::thread::sleep(Duration::from_micros(200));
        }
        let released_at = Instant::now();
        while b.state.released.load(Ordering::Acquire) < ts.0 {
            assert!(released_at.elapsed() < Duration::from_secs(10), "the backup never learned the release");
            std::thread::sleep(Duration::from_micros(200));
        }
        slowest = slowest.max(released_at.elapsed());
    }
    eprintln!(
        "the backup learned each release at most {slowest:?} after it was made; {} frames sent directly",
        p.frames_sent_directly.load(Ordering::Relaxed)
    );
    assert!(slowest < Duration::from_millis(100), "a release reached the backup only {slowest:?} after");
    b.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    a.close();
}
