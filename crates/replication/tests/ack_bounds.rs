//! A backup's acknowledgements, as the primary reads them. One counts for no more than the
//! primary's clock: a commit made after it is not released on it (an ack naming more than
//! was ever committed, a backup's bug, counted before 2026-12-06 for every commit still to
//! come, each then released on receipt by no one). And they are read while a backup's
//! start is sent, not only once it is live (before 2026-12-06 a long start stalled on the
//! acks left unread).

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
    // Read (the link heard its first ack: `heard_ago` was `MAX` before) and counted, at
    // most the clock. (Waiting for `received` to reach the clock instead passed at once on
    // a clock of 0, and the ack, read after the commit below, counted up to it: CI met it.)
    let clock = || a.db().clock().now();
    common::wait_until("the ack to be read", Duration::from_secs(20), || {
        p.backups().first().is_some_and(|b| b.heard_ago != Duration::MAX)
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

/// A backup acks as its start comes (a resume's gap read from disk), once per batch, from
/// the thread that reads the start, as a backup's receiver does. The primary reads the
/// acks while it sends the start: what it has not read of the link's socket stays small
/// throughout (the kernel's count, `/proc/net/tcp`), and the start goes on to its end.
/// Before 2026-12-06 it read none until the start was sent: on a network the acks filled
/// its receive buffer and the backup's send buffer, the backup blocked writing one and
/// read no more, and the start stalled until the primary gave the link up (found by a
/// review). That stall cannot be made here: this kernel grows an unread socket's buffer
/// toward `tcp_rmem`'s maximum (32 MB), so the test looks at the unread acks instead (with
/// the reader started after the start, as before, they grew to 500-650 KB; checked).
#[test]
fn acks_sent_while_a_start_comes_are_read_as_it_is_sent() {
    use ditto_replication::protocol::{Start, PROTOCOL_VERSION};
    const BATCHES: u32 = 16_000;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let opts = PrimaryOptions { start_stall_max: Duration::from_secs(5), ..Default::default() };
    // Written per commit without an fsync: a batch each, quickly.
    let log = ditto_log::LogOptions {
        durability: ditto_log::Durability::NoSync(Duration::from_micros(1)),
        ..Default::default()
    };
    let (a, t, p, addr) = common::start_primary(&dir, log, "local", opts);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let have = w.run(|x| x.put(t, b"first", b"v")).unwrap().1.wait().unwrap();
    // 16,000 batches of a 1 KiB value (16 MB: more than the link's 1 MiB write buffer and
    // the 4 MiB its socket's grows to, so the gap goes out as the stand-in reads it), and
    // 16,000 acks of 41 bytes back (656 KB: more than the primary's unread socket holds).
    let mut last = have;
    for i in 0..BATCHES {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), &[7u8; 1024])).unwrap().1.wait().unwrap();
    }
    // Both of its buffers small, set before it connects: the primary's writes of the
    // start then wait for the stand-in's reads, as on a network (on loopback a socket's
    // buffers grow to megabytes, and the whole start fitted in them).
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_send_buffer_size(4096).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let to: std::net::SocketAddr = addr.parse().unwrap();
    sock.connect(&to.into()).unwrap();
    let s: std::net::TcpStream = sock.into();
    let hello = Frame::Hello {
        version: PROTOCOL_VERSION,
        epoch: a.logger().epoch(),
        have_ts: have,
        node: "b".into(),
        learner: false,
        proves: None,
        database: 0,
        run: 0,
    };
    (&s).write_all(&hello.encode()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    // What the primary has not read of the link's socket: the receive queue of its end.
    let (primary_port, mine) = (to.port(), s.local_addr().unwrap().port());
    let unread = || {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let (local, remote) = (format!(":{primary_port:04X} "), format!(":{mine:04X} "));
        tcp.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() > 4 && format!("{} ", f[1]).ends_with(&local) && format!("{} ", f[2]).ends_with(&remote))
            .map(|f| u64::from_str_radix(f[4].split(':').nth(1).unwrap(), 16).unwrap())
            .expect("the primary's end of the link in /proc/net/tcp")
    };
    let mut unread_max = 0;
    let (mut batches, mut held, mut welcomed) = (0u64, have, false);
    let end = Instant::now() + Duration::from_secs(60);
    while held < last {
        assert!(Instant::now() < end, "the start never ended: {batches} batches, up to {held:?} of {last:?}");
        match read_frame(&mut &s) {
            Ok(Some(Frame::Welcome { start, .. })) => {
                assert_eq!(start, Start::Resume, "a resume from the log");
                welcomed = true;
            }
            Ok(Some(Frame::Heartbeat { .. })) => {}
            Ok(Some(Frame::Batch { batch, .. })) => {
                assert!(welcomed);
                batches += 1;
                let h = ditto_log::format::decode_batch_header(&batch).unwrap();
                held = held.max(h.bound_ts);
                let ack = Frame::Ack { received: held, durable: held, replayed: held, echo_us: 0 };
                if let Err(e) = (&s).write_all(&ack.encode()) {
                    panic!("the ack after batch {batches} was not taken: {e}");
                }
                if batches % 500 == 0 {
                    unread_max = unread_max.max(unread());
                }
            }
            Ok(Some(f)) => panic!("unexpected {f:?}"),
            Ok(None) => panic!("the primary closed the link after {batches} batches (up to {held:?} of {last:?})"),
            Err(e) => panic!("reading the start after {batches} batches: {e}"),
        }
    }
    assert!(batches >= u64::from(BATCHES), "{batches} batches");
    // 256 KB: 6,400 acks, as many batches' worth of the reader's falling behind.
    assert!(unread_max < 256 << 10, "the primary left {unread_max} bytes of acks unread during the start");
    // The primary heard the backup's acks, the last of the gap's among them.
    common::wait_until("the primary to read the last ack", Duration::from_secs(20), || {
        p.backups().first().is_some_and(|b| b.received >= last)
    });
    drop(s);
    p.stop();
}
