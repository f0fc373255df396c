//! A backup checkpoints by the log it has received, not only by time (as a primary does):
//! what a promotion replays before it serves stays bounded (docs/cluster.md).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::OpenOptions;
use ditto_replication::{backup, BackupOptions, CommitPolicy, Primary, PrimaryOptions};

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_backup_checkpoints_once_it_has_received_enough_log() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let a = ditto_log::open(&pa, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let policy = CommitPolicy::parse("local").unwrap();
    let opts = PrimaryOptions { backups_expected: 1, ..Default::default() };
    let p: Arc<Primary> =
        Primary::start(&a, listener, opts, Box::new(move |h| ditto_replication::release_watermark(policy, h))).unwrap();
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
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
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
