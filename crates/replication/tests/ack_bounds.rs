//! A backup's acknowledgement counts for no more than the primary's clock: a commit made
//! after it is not released on it. An ack naming more than was ever committed (a backup's
//! bug) counted before 2026-12-06 for every commit still to come, each then released on
//! receipt by no one.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_replication::protocol::{read_frame, Frame};
use ditto_replication::{CommitPolicy, PrimaryOptions, QuorumRecord};

mod common;

#[test]
fn an_ack_beyond_the_primarys_clock_releases_no_later_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let record = QuorumRecord::new(1, CommitPolicy::parse("majority-received").unwrap());
    let opts = PrimaryOptions { backups_expected: 1, quorum_record: Some((dir.clone(), record)), ..Default::default() };
    let (a, t, p, addr) = common::start_primary(&dir, Default::default(), "majority-received", opts);
    // A stand-in backup: its hello, then whatever the primary sends is read and dropped.
    let s = std::net::TcpStream::connect(&addr).unwrap();
    (&s).write_all(&common::empty_hello("b").encode()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (reader, d2) = (s.try_clone().unwrap(), Arc::clone(&done));
    let drain = std::thread::spawn(move || {
        reader.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        while !d2.load(Ordering::Acquire) {
            match read_frame(&mut &reader) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading the primary's frames: {e}"),
            }
        }
    });
    common::wait_until("the stand-in's link", Duration::from_secs(20), || p.backups().len() == 1);
    let beyond = Ts(1 << 40);
    let ack = |ts: Ts| Frame::Ack { received: ts, durable: ts, replayed: ts, echo_us: 0 }.encode();
    (&s).write_all(&ack(beyond)).unwrap();
    // Read and counted (at most the clock).
    let clock = || a.db().clock().now();
    common::wait_until("the ack to be read", Duration::from_secs(20), || {
        p.backups().first().is_some_and(|b| b.received >= clock())
    });
    let b = &p.backups()[0];
    assert!(b.received <= clock() && b.durable <= clock() && b.replayed <= clock(), "{:?} {:?}", b.received, clock());
    // A commit after it waits for the backup's own word.
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts = w.run(|x| x.put(t, b"k", b"v")).unwrap().1.ts();
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        assert!(p.released() < ts, "released at {:?} on an ack of ts {} sent before it", p.released(), beyond.0);
        std::thread::sleep(Duration::from_millis(5));
    }
    (&s).write_all(&ack(ts)).unwrap();
    common::wait_until("the commit's release on the backup's ack of it", Duration::from_secs(20), || {
        p.released() >= ts
    });
    done.store(true, Ordering::Release);
    drop(s);
    drain.join().unwrap();
    p.stop();
}
