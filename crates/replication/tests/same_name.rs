//! Two backups sharing a name (docs/replication.md, "Backups sharing a name"), with real
//! files and TCP: the quorum's record knows backups by name, so a second live link of a
//! name is refused, saying why; a link of that name silent for longer than a live one
//! should be (a half-open connection of the same backup) is closed, and the backup that
//! connects again is taken; two Hellos of one name at once register one link.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::Epoch;
use ditto_replication::protocol::{read_frame, Frame, PROTOCOL_VERSION};
use ditto_replication::{backup, BackupError, BackupOptions, CommitPolicy, Primary, PrimaryOptions};

mod common;
use common::wait_until;

/// A primary in `dir` under `majority-received` counting two backups, with a table "t",
/// keeping its quorum's record on disk as a standalone server does.
fn start_primary(dir: &std::path::Path) -> (ditto_log::Durable, ditto_engine::TableId, Arc<Primary>, String) {
    let record = ditto_replication::QuorumRecord::new(2, CommitPolicy::parse("majority-received").unwrap());
    let opts =
        PrimaryOptions { backups_expected: 2, quorum_record: Some((dir.to_path_buf(), record)), ..Default::default() };
    common::start_primary(dir, Default::default(), "majority-received", opts)
}

/// The Hello of a backup named "b" that holds nothing.
fn hello_from_b() -> Frame {
    common::empty_hello("b")
}

fn links_named(p: &Primary, name: &str) -> usize {
    p.backups().iter().filter(|b| b.node == name).count()
}

#[test]
fn a_second_live_backup_of_a_name_is_refused_and_the_first_keeps_its_link() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, t, p, addr) = start_primary(&tmp.path().join("p"));
    let first = backup::start(BackupOptions::new(&addr, &tmp.path().join("b1"), 1, "b")).unwrap();
    wait_until("the first backup's link", Duration::from_secs(20), || links_named(&p, "b") == 1);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts = w.run(|x| x.put(t, b"k", b"v")).unwrap().1.ts();
    wait_until("the first backup to acknowledge", Duration::from_secs(20), || {
        p.backups().iter().any(|b| b.node == "b" && b.received >= ts)
    });
    // A second backup, its own directory, the same name: refused, for as long as it tries
    // (`NAME_TAKEN_WAIT`), saying whose link has the name and what to do.
    let started = Instant::now();
    let second = backup::start(BackupOptions::new(&addr, &tmp.path().join("b2"), 1, "b"));
    let took = started.elapsed();
    match second {
        Err(BackupError::Refused(why)) => {
            assert!(why.starts_with("this backup's name is taken"), "{why}");
            assert!(why.contains("was heard from") && why.contains("--replica-name"), "{why}");
        }
        other => panic!("a second backup named b was not refused: {:?}", other.map(|_| ())),
    }
    assert!(took >= Duration::from_secs(5), "it should have tried again for a while: {took:?}");
    // The first keeps its one link, and goes on acknowledging.
    assert_eq!(links_named(&p, "b"), 1);
    let ts = w.run(|x| x.put(t, b"k2", b"v")).unwrap().1.ts();
    wait_until("the first backup to acknowledge after", Duration::from_secs(20), || {
        p.backups().iter().any(|b| b.node == "b" && b.received >= ts)
    });
    assert!(first.state.connected.load(std::sync::atomic::Ordering::Acquire));
    // Once the first has stopped, its name is free: a backup of that name joins.
    first.stop("done", Duration::from_secs(10)).unwrap();
    wait_until("the first link to go", Duration::from_secs(20), || links_named(&p, "b") == 0);
    let again = backup::start(BackupOptions::new(&addr, &tmp.path().join("b3"), 1, "b")).unwrap();
    wait_until("the new backup's link", Duration::from_secs(20), || links_named(&p, "b") == 1);
    again.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    a.close();
}

#[test]
fn a_silent_link_of_the_name_is_closed_and_the_backup_connecting_again_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _t, p, addr) = start_primary(&tmp.path().join("p"));
    // A connection that says it is backup "b", acknowledges once, and then says nothing
    // more: as the primary sees a half-open connection whose backup has gone.
    let mut ghost = std::net::TcpStream::connect(&addr).unwrap();
    let hello = hello_from_b();
    ghost.write_all(&hello.encode()).unwrap();
    wait_until("the ghost's link", Duration::from_secs(20), || links_named(&p, "b") == 1);
    ghost
        .write_all(&Frame::Ack { received: Ts::ZERO, durable: Ts::ZERO, replayed: Ts::ZERO, echo_us: 0 }.encode())
        .unwrap();
    wait_until("the ghost's acknowledgement", Duration::from_secs(20), || {
        p.backups().iter().any(|b| b.node == "b" && b.heard_ago < Duration::from_secs(60))
    });
    // Within 4 s of it, a backup of that name is refused (the link is live as far as anyone
    // can tell: a busy backup may be silent that long); after, the silent link is closed
    // and the backup joins.
    let early = std::net::TcpStream::connect(&addr).unwrap();
    (&early).write_all(&hello.encode()).unwrap();
    match read_frame(&mut &early).unwrap() {
        Some(Frame::Refuse { reason }) => assert!(reason.contains("was heard from"), "{reason}"),
        other => panic!("expected a refusal while the ghost's link is live, got {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(4100));
    let started = Instant::now();
    let b = backup::start(BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b")).unwrap();
    wait_until("the backup's link, and only it", Duration::from_secs(20), || {
        let named: Vec<_> = p.backups().into_iter().filter(|b| b.node == "b").collect();
        named.len() == 1 && named[0].heard_ago < Duration::from_millis(500)
    });
    eprintln!("the backup joined {:?} after it started, the silent link closed", started.elapsed());
    // The ghost's connection was closed by the primary.
    ghost.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = Vec::new();
    let end = std::io::Read::read_to_end(&mut ghost, &mut sink);
    assert!(end.is_ok() || end.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset), "{end:?}");
    b.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    a.close();
}

/// Many connections say they are backup "b" at once: the name is checked again under the
/// links' lock as each registers, so one link of the name is registered, not several (the
/// first check alone let two through while the primary recorded its quorum on disk).
#[test]
fn hellos_of_one_name_at_once_register_one_link() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _t, p, addr) = start_primary(&tmp.path().join("p"));
    let hello = hello_from_b();
    let go = Arc::new(std::sync::Barrier::new(8));
    let conns: Vec<_> = (0..8)
        .map(|_| {
            let (addr, hello, go) = (addr.clone(), hello.encode(), Arc::clone(&go));
            std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(&addr).unwrap();
                go.wait();
                c.write_all(&hello).unwrap();
                c
            })
        })
        .collect();
    let conns: Vec<std::net::TcpStream> = conns.into_iter().map(|t| t.join().unwrap()).collect();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(links_named(&p, "b"), 1, "{:?}", p.backups().iter().map(|b| &b.addr).collect::<Vec<_>>());
    drop(conns);
    p.stop();
    a.close();
}

/// A hello whose name has a line break or a comma, or is empty, is refused saying why, and
/// registers nothing (its name went into `INFO replication`, one line per backup, as sent,
/// and a comma split its `slaveN` line's fields: refused since 2026-12-06).
#[test]
fn a_backup_name_with_a_line_break_or_none_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (_a, _t, p, addr) = start_primary(&tmp.path().join("p"));
    for name in ["b\r\nrole:master", "", "b,state=online"] {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(&common::empty_hello(name).encode()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        match read_frame(&mut s).unwrap() {
            Some(Frame::Refuse { reason }) => assert!(reason.contains("without control characters"), "{reason}"),
            other => panic!("{name:?}: {other:?}"),
        }
    }
    assert!(p.backups().is_empty(), "nothing registered");
}

/// A backup of an older build (replication protocol 4: it cannot read log format 5's
/// batches, and dropped its link at the first one, again and again) is refused at its
/// hello, saying which version the primary speaks, and registers nothing.
#[test]
fn a_backup_of_an_older_protocol_is_refused_saying_which_the_primary_speaks() {
    let tmp = tempfile::tempdir().unwrap();
    let (_a, _t, p, addr) = start_primary(&tmp.path().join("p"));
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let Frame::Hello { epoch, have_ts, node, learner, proves, .. } = hello_from_b() else { unreachable!() };
    let old =
        Frame::Hello { version: PROTOCOL_VERSION - 1, epoch, have_ts, node, learner, proves, database: 0, run: 0 };
    s.write_all(&old.encode()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    match read_frame(&mut s).unwrap() {
        Some(Frame::Refuse { reason }) => assert!(
            reason.contains(&format!(
                "protocol version {} is not supported (this primary speaks {PROTOCOL_VERSION})",
                PROTOCOL_VERSION - 1
            )),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(p.backups().is_empty(), "nothing registered");
}

/// A backup following a later epoch than the primary's is refused, saying so, and sent no
/// copy (which would discard what it holds): the primary is stale (a deposed one still
/// listening, or one restored from an older copy). Its own epoch's backups are taken.
#[test]
fn a_backup_of_a_later_epoch_is_refused_and_sent_no_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _t, p, addr) = start_primary(&tmp.path().join("p"));
    let mine = a.logger().epoch();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let hello = Frame::Hello {
        version: PROTOCOL_VERSION,
        epoch: Epoch(mine.0 + 1),
        have_ts: Ts(5),
        node: "later".into(),
        learner: false,
        proves: None,
        database: 0,
        run: 0,
    };
    s.write_all(&hello.encode()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    match read_frame(&mut s).unwrap() {
        Some(Frame::Refuse { reason }) => {
            assert!(reason.contains(&format!("later than this primary's epoch {}", mine.0)), "{reason}")
        }
        other => panic!("a backup of epoch {} was not refused: {other:?}", mine.0 + 1),
    }
    assert!(p.backups().is_empty(), "nothing registered");
    let same = backup::start(BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b")).unwrap();
    wait_until("a backup of no epoch yet taken", Duration::from_secs(20), || links_named(&p, "b") == 1);
    same.stop("done", Duration::from_secs(10)).unwrap();
}

/// A backup told by a primary of an older epoch than the one it follows to take a copy (a
/// stale primary of an older build, which does not refuse it itself) refuses, saying so,
/// and keeps what it holds.
#[test]
fn a_backup_refuses_a_primary_of_an_older_epoch_and_keeps_what_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("p"), tmp.path().join("b"));
    // The primary's directory opened a second time: epoch 2.
    ditto_log::open(&pa, ditto_log::OpenOptions { workers: 1, ..Default::default() }).unwrap().close();
    let (a, t, p, addr) = common::start_primary(&pa, Default::default(), "local", Default::default());
    let followed = a.logger().epoch();
    assert!(followed.0 >= 2, "{followed:?}");
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts = w.run(|x| x.put(t, b"k", b"v")).unwrap().1.wait().unwrap();
    common::backup_holding(&addr, &pb, ts);
    // A stale primary: whatever the hello, a welcome of epoch 1 with a checkpoint.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stale = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            let _ = read_frame(&mut s);
            let welcome = Frame::Welcome {
                epoch: Epoch(followed.0 - 1),
                streams: 1,
                tables: vec![(0, "t".into())],
                start: ditto_replication::protocol::Start::Checkpoint { ts: Ts(1), bytes: 0 },
                database: 0,
                run: 0,
            };
            let _ = s.write_all(&welcome.encode());
        }
    });
    match backup::start(BackupOptions::new(&stale, &pb, 1, "b")) {
        Err(BackupError::Refused(why)) => {
            assert!(why.contains(&format!("older than epoch {} that this backup follows", followed.0)), "{why}")
        }
        other => panic!("a stale primary's copy was not refused: {:?}", other.map(|_| ())),
    }
    // What it holds is there: it resumes from its own primary, sent no copy.
    let b = backup::start(BackupOptions::new(&addr, &pb, 1, "b")).unwrap();
    let tb = b.db.table_id("t").unwrap();
    assert_eq!(b.db.read().get(tb, b"k").unwrap().as_deref(), Some(&b"v"[..]), "the backup kept its row");
    assert_eq!(p.checkpoints_sent.load(std::sync::atomic::Ordering::SeqCst), 1, "the first join's copy alone");
    b.stop("done", Duration::from_secs(10)).unwrap();
    drop(w);
    p.stop();
}

/// The names backups' Hellos give are kept only while a restart waits (which alone reads
/// them): a primary that waits for none keeps none, however many names connect (before,
/// each new name stayed for the primary's life).
#[test]
fn a_primary_that_waits_for_no_restart_keeps_no_names_heard() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _t, p, addr) = start_primary(&tmp.path().join("p"));
    assert!(p.restart_record().is_none(), "a fresh primary waits for no restart");
    for i in 0..20 {
        let s = std::net::TcpStream::connect(&addr).unwrap();
        let hello = Frame::Hello {
            version: PROTOCOL_VERSION,
            epoch: Epoch(0),
            have_ts: Ts::ZERO,
            node: format!("b{i}"),
            learner: false,
            proves: None,
            database: 0,
            run: 0,
        };
        (&s).write_all(&hello.encode()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // The primary's first answer: the Hello was read and judged.
        assert!(read_frame(&mut &s).unwrap().is_some(), "backup b{i} was answered");
    }
    let (clear, more) = p.heard_since_restart(Epoch(0), Ts::ZERO);
    assert_eq!((clear.len(), more.len()), (0, 0), "names kept: {clear:?} {more:?}");
    p.stop();
    a.close();
}

/// A cluster's backup (`same_streams`) refuses a primary writing another number of log
/// streams than it has workers, saying so; a standalone backup follows it.
#[test]
fn a_clusters_backup_refuses_a_primary_of_another_stream_count() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, _t, p, addr) = start_primary(&tmp.path().join("p"));
    let opts = BackupOptions { same_streams: true, ..BackupOptions::new(&addr, &tmp.path().join("b1"), 2, "b") };
    match backup::start(opts) {
        Err(BackupError::Refused(why)) => {
            assert!(why.contains("1 log streams") && why.contains("2 workers"), "{why}")
        }
        other => panic!("a cluster's backup of 2 workers followed a primary of 1 stream: {:?}", other.map(|_| ())),
    }
    let b = backup::start(BackupOptions::new(&addr, &tmp.path().join("b2"), 2, "b")).unwrap();
    wait_until("the standalone backup's link", Duration::from_secs(20), || links_named(&p, "b") == 1);
    b.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    a.close();
}
