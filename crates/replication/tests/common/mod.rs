//! What the replication crate's tests share: a bounded wait, and a primary started on a
//! fresh log with a table "t".
#![allow(dead_code)] // each test file uses its own part

use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_log::{LogOptions, OpenOptions};
use ditto_replication::{CommitPolicy, Primary, PrimaryOptions};

mod ports;
#[allow(unused_imports)] // (each test file uses its own part)
pub use ports::listener_below_the_ephemeral_range;

/// Waits until `f` holds, for at most `limit` (then fails, naming `what`).
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A backup named "b" of one worker joins the primary at `addr` in `dir`, replays
/// everything up to `ts`, and stops: its directory then holds it, to be resumed.
pub fn backup_holding(addr: &str, dir: &std::path::Path, ts: ditto_engine::Ts) {
    let b = ditto_replication::backup::start(ditto_replication::BackupOptions::new(addr, dir, 1, "b")).unwrap();
    wait_until("the backup to replay up to the timestamp", Duration::from_secs(20), || {
        b.state.visible.load(std::sync::atomic::Ordering::SeqCst) >= ts.0
    });
    b.stop("done", Duration::from_secs(10)).unwrap();
}

/// A primary on a fresh one-stream log in `dir` (with `log`'s options), with a table "t",
/// releasing under `policy` with `opts`, its watermark recomputed as the log moves: (its
/// log, the table, the primary, the address backups connect to).
pub fn start_primary(
    dir: &std::path::Path,
    log: LogOptions,
    policy: &str,
    opts: PrimaryOptions,
) -> (ditto_log::Durable, ditto_engine::TableId, Arc<Primary>, String) {
    let a = ditto_log::open(dir, OpenOptions { workers: 1, log, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let (p, addr) = ship(&a, policy, opts);
    (a, t, p, addr)
}

/// A primary shipping `a`'s log on a free loopback port, releasing under `policy` with
/// `opts`, its watermark recomputed as the log moves: (the primary, its address).
pub fn ship(a: &ditto_log::Durable, policy: &str, opts: PrimaryOptions) -> (Arc<Primary>, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let policy = CommitPolicy::parse(policy).unwrap();
    let p: Arc<Primary> =
        Primary::start(a, listener, opts, Box::new(move |h| ditto_replication::release_watermark(policy, h))).unwrap();
    let p2 = Arc::clone(&p);
    a.logger().set_progress_listener(Box::new(move |_, _| p2.recompute())).unwrap();
    (p, addr)
}

/// A backup's directory `b` holding one row, joined from a real primary in `a` that is
/// then stopped: (the primary's epoch, the row's commit timestamp). A stand-in primary of
/// that epoch can then resume the backup (`Frame::Welcome` with `Start::Resume`).
pub fn backup_dir_holding_a_row(a: &std::path::Path, b: &std::path::Path) -> (ditto_log::Epoch, ditto_engine::Ts) {
    let (d, t, p, addr) = start_primary(a, Default::default(), "local", Default::default());
    let epoch = d.logger().epoch();
    let mut w = d.db().worker(ditto_engine::WorkerId(0)).unwrap();
    let ts = w.run(|x| x.put(t, b"k", b"v")).unwrap().1.wait().unwrap();
    backup_holding(&addr, b, ts);
    drop(w);
    p.stop();
    d.close();
    (epoch, ts)
}

/// A batch of stream 0 of `epoch` holding one transaction at `ts` that inserts key "new"
/// (record 7 of table 0) with value "v", as a primary frames it.
pub fn one_insert_batch(epoch: ditto_log::Epoch, ts: ditto_engine::Ts) -> Vec<u8> {
    use ditto_engine::{RecordId, TableId};
    let mut b = ditto_log::format::BatchBuilder::new();
    b.push_txn(ts, [(TableId(0), RecordId(7), Some(&b"new"[..]), Some(&b"v"[..]))].into_iter());
    let mut out = Vec::new();
    b.finish_into(ditto_log::StreamId(0), epoch, ts, false, &mut out);
    out
}

/// Bytes that do not compress: `n` at a time from a xorshift generator seeded with `x`.
pub fn noise_from(mut x: u64) -> impl FnMut(usize) -> Vec<u8> {
    move |n| {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }
}

/// The Hello of a backup named `name` that holds nothing, of this protocol version.
pub fn empty_hello(name: &str) -> ditto_replication::protocol::Frame {
    ditto_replication::protocol::Frame::Hello {
        version: ditto_replication::protocol::PROTOCOL_VERSION,
        epoch: ditto_log::Epoch(0),
        have_ts: ditto_engine::Ts::ZERO,
        node: name.into(),
        learner: false,
        proves: None,
        database: 0,
        run: 0,
    }
}

/// A stand-in primary's welcome of `epoch` resuming a one-stream backup, with table "t"
/// (no database id and no run said: a stand-in's).
pub fn resume_welcome(epoch: ditto_log::Epoch) -> ditto_replication::protocol::Frame {
    ditto_replication::protocol::Frame::Welcome {
        epoch,
        streams: 1,
        tables: vec![(0, "t".into())],
        start: ditto_replication::protocol::Start::Resume,
        database: 0,
        run: 0,
    }
}
