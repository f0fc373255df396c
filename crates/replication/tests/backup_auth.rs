//! A primary with a password (a server's `requirepass`) serves only backups that give it
//! (`masterauth`): a backup receives everything a client could read. Real files and TCP.

use std::time::Duration;

use ditto_engine::WorkerId;
use std::sync::Arc;

use ditto_replication::{backup, BackupError, BackupOptions, Primary, PrimaryOptions};

mod common;
use common::wait_until;

#[test]
fn a_primary_with_a_password_serves_only_a_backup_that_gives_it() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = PrimaryOptions { password: Some("sesame-9".into()), ..Default::default() };
    let (a, t, p, addr) = common::start_primary(&tmp.path().join("p"), Default::default(), "local", opts);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts = w.run(|x| x.put(t, b"secret", b"v")).unwrap().1.wait().unwrap();
    for (dir, auth, says) in [
        ("none", None, "requires a password of its backups"),
        ("wrong", Some("sesame-8"), "is not this primary's requirepass"),
        ("longer", Some("sesame-99"), "is not this primary's requirepass"),
    ] {
        let opts = BackupOptions {
            auth: auth.map(ditto_replication::protocol::Secret::from),
            ..BackupOptions::new(&addr, &tmp.path().join(dir), 1, dir)
        };
        match backup::start(opts) {
            Err(BackupError::Refused(why)) => assert!(why.contains(says), "{dir}: {why}"),
            other => panic!("a backup with {auth:?} was not refused: {:?}", other.map(|_| ())),
        }
        assert!(p.backups().iter().all(|b| b.node != dir), "{dir} has no link");
        // It received nothing: its directory holds its lock and no other file.
        assert_eq!(walk(&tmp.path().join(dir)), ["LOCK"], "{dir}");
    }
    let opts = BackupOptions {
        auth: Some("sesame-9".into()),
        ..BackupOptions::new(&addr, &tmp.path().join("right"), 1, "right")
    };
    let bk = backup::start(opts).unwrap();
    wait_until("the backup with the password to replay the commit", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= ts.0
    });
    assert_eq!(bk.db.read().get(t, b"secret").unwrap().as_deref(), Some(&b"v"[..]));
    bk.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    a.close();
}

/// Every file under `dir`, as paths relative to it.
fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out
}

/// A backup whose primary, started again on the same address, no longer takes its password
/// goes on trying, and says why in its state (INFO's `ditto_master_link_refused`); once a
/// primary takes it again, the reason is cleared (that primary, of a new epoch, then has
/// the backup join again).
#[test]
fn a_backup_refused_on_a_reconnect_says_why_until_it_is_taken_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("p");
    let opts = PrimaryOptions { password: Some("first".into()), ..Default::default() };
    let (a, t, p, addr) = common::start_primary(&dir, Default::default(), "local", opts);
    let opts = BackupOptions { auth: Some("first".into()), ..BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b") };
    let bk = backup::start(opts).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts = w.run(|x| x.put(t, b"k", b"1")).unwrap().1.wait().unwrap();
    wait_until("the backup to replay", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= ts.0
    });
    let connected = || bk.state.connected.load(std::sync::atomic::Ordering::Acquire);
    // The primary's directory opened again, served with another password, then the first.
    let serve_again = |p: Arc<Primary>, a: ditto_log::Durable, password: &str| {
        p.stop();
        a.close_and_release();
        drop((p, a));
        let a = ditto_log::open(&dir, ditto_log::OpenOptions { workers: 1, ..Default::default() }).unwrap();
        let opts = PrimaryOptions { password: Some(password.into()), ..Default::default() };
        let listener = std::net::TcpListener::bind(&addr).unwrap();
        let release = Box::new(|h: &ditto_replication::Holdings| h.primary_durable);
        let p = Primary::start(&a, listener, opts, release).unwrap();
        (p, a)
    };
    drop(w);
    let (p, a) = serve_again(p, a, "second");
    wait_until("the refusal to show", Duration::from_secs(30), || bk.state.refused.lock().is_some());
    let why = bk.state.refused.lock().clone().unwrap();
    assert!(why.contains("authentication failed") && why.contains("is not this primary's requirepass"), "{why}");
    assert!(!connected());
    let (p, a) = serve_again(p, a, "first");
    wait_until("the refusal to be cleared", Duration::from_secs(30), || bk.state.refused.lock().is_none());
    let _ = bk.stop("done", Duration::from_secs(10));
    p.stop();
    a.close();
}

/// Anyone who reaches the replication port may open connections and say nothing: past
/// `UNHELLOED_PER_ADDRESS_MAX` of one address's the oldest of that address's is closed, past
/// `UNHELLOED_MAX` in all the oldest of all (each held a thread for up to 20 s, without
/// bound), so a backup with the password joins while they are still open, and one host's
/// flood does not close another's connections.
#[test]
fn silent_connections_to_the_replication_port_are_bounded() {
    use ditto_replication::primary::UNHELLOED_PER_ADDRESS_MAX;
    use std::io::Read;
    let tmp = tempfile::tempdir().unwrap();
    let opts = PrimaryOptions { password: Some("sesame-9".into()), ..Default::default() };
    let (a, t, p, addr) = common::start_primary(&tmp.path().join("p"), Default::default(), "local", opts);
    let target: std::net::SocketAddr = addr.parse().unwrap();
    // Another host's (127.0.0.2) silent connections, first, so the oldest of all.
    let other: Vec<std::net::TcpStream> = (0..UNHELLOED_PER_ADDRESS_MAX)
        .map(|_| {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            s.bind(&"127.0.0.2:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
            s.connect(&target.into()).unwrap();
            s.into()
        })
        .collect();
    // Then a flood from 127.0.0.1.
    let mut silent: Vec<std::net::TcpStream> =
        (0..ditto_replication::primary::UNHELLOED_MAX).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts = w.run(|x| x.put(t, b"k", b"v")).unwrap().1.wait().unwrap();
    // Accepted after them all (the kernel's queue is in order): an older one makes room.
    let opts =
        BackupOptions { auth: Some("sesame-9".into()), ..BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b") };
    let bk = backup::start(opts).expect("a backup joins past the silent connections");
    wait_until("the backup to replay the commit", Duration::from_secs(30), || {
        bk.state.visible.load(std::sync::atomic::Ordering::Acquire) >= ts.0
    });
    let closed = |s: &mut std::net::TcpStream, wait: Duration| {
        s.set_read_timeout(Some(wait)).unwrap();
        match s.read(&mut [0u8; 16]) {
            Ok(0) => true,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => false,
            other => panic!("{other:?}"),
        }
    };
    // The flood's oldest were closed, its newest not (its 10 s to say its hello are not
    // over); the other host's, older than all of them, were left alone.
    assert!(closed(&mut silent[0], Duration::from_secs(5)), "the oldest silent connection was not closed");
    assert!(!closed(silent.last_mut().unwrap(), Duration::from_millis(200)), "the newest was closed too");
    for (i, mut s) in other.into_iter().enumerate() {
        assert!(!closed(&mut s, Duration::from_millis(50)), "another host's connection {i} was closed by the flood");
    }
    drop(silent);
    bk.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    a.close();
}

/// A backup proves its password only to a primary that proved it first, and never sends
/// the password itself (until 2026-12-06 its hello carried it, in the clear, to whoever
/// listened on the primary's port: a process on the primary's machine while it was down
/// took it and could then copy all the data). A stranger on the port that welcomes it at
/// once, or answers with a challenge of its own making, is refused by the backup, which
/// sends it nothing after its hello; and a primary that asks no password is refused by a
/// backup that has one, as a backup without one is by a primary that asks one.
#[test]
fn a_backup_proves_its_password_only_to_a_primary_that_proved_it_first() {
    use ditto_replication::protocol::{read_frame, Frame, Start};
    use std::io::{Read, Write};
    const PASSWORD: &str = "sesame-9";
    let tmp = tempfile::tempdir().unwrap();
    for (way, says) in [("welcome", "asks no password of its backups"), ("challenge", "did not prove it holds")] {
        let l = common::listener_below_the_ephemeral_range();
        let addr = l.local_addr().unwrap().to_string();
        let stranger = std::thread::spawn(move || {
            // (Bounded: a backup that failed before it connected must not hang the test.)
            l.set_nonblocking(true).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut s = loop {
                match l.accept() {
                    Ok((s, _)) => break s,
                    Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                    Err(e) => panic!("no backup connected within 30 s: {e}"),
                }
            };
            s.set_nonblocking(false).unwrap();
            let mut got = Vec::new();
            // The hello, read whole as bytes (the frame is then decoded from them).
            let mut head = [0u8; 8];
            s.read_exact(&mut head).unwrap();
            let mut body = vec![0u8; u32::from_le_bytes(head[..4].try_into().unwrap()) as usize];
            s.read_exact(&mut body).unwrap();
            got.extend_from_slice(&head);
            got.extend_from_slice(&body);
            let hello = read_frame(&mut &got[..]).unwrap().unwrap();
            let answer = match way {
                "welcome" => Frame::Welcome {
                    epoch: ditto_log::Epoch(1),
                    streams: 1,
                    tables: vec![],
                    start: Start::Resume,
                    database: 0,
                    run: 0,
                },
                _ => Frame::Challenge { salt: 1, nonce: ditto_replication::proof::nonce(), proof: [0x5a; 32] },
            };
            s.write_all(&answer.encode()).unwrap();
            // Whatever the backup sends after the answer, until it closes (or 5 s).
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut after = Vec::new();
            let _ = s.read_to_end(&mut after);
            (hello, got, after)
        });
        let opts =
            BackupOptions { auth: Some(PASSWORD.into()), ..BackupOptions::new(&addr, &tmp.path().join(way), 1, way) };
        match backup::start(opts) {
            Err(BackupError::Refused(why)) => {
                assert!(why.contains("authentication failed") && why.contains(says), "{way}: {why}")
            }
            other => panic!("{way}: the backup took the stranger: {:?}", other.map(|_| ())),
        }
        let (hello, sent, after) = stranger.join().unwrap();
        assert!(matches!(hello, Frame::Hello { proves: Some(_), .. }), "{way}: {hello:?}");
        assert!(!sent.windows(PASSWORD.len()).any(|w| w == PASSWORD.as_bytes()), "{way}: the password was sent");
        assert_eq!(after, Vec::<u8>::new(), "{way}: the backup sent more after the stranger's answer (a proof?)");
        assert_eq!(walk(&tmp.path().join(way)), ["LOCK"], "{way}: nothing taken from the stranger");
    }
    // The primary's own check of a backup's proof: a stand-in backup that answers the
    // challenge with a proof made up, or with one made with the password for another
    // connection (another nonce), is refused, and nothing is sent it.
    let opts = PrimaryOptions { password: Some(PASSWORD.into()), ..Default::default() };
    let (a, _t, p, addr) = common::start_primary(&tmp.path().join("p2"), Default::default(), "local", opts);
    for (i, made_up) in [true, false].into_iter().enumerate() {
        let node = format!("stand-in-{i}");
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let ours = ditto_replication::proof::nonce();
        let hello = Frame::Hello {
            version: ditto_replication::protocol::PROTOCOL_VERSION,
            epoch: ditto_log::Epoch(0),
            have_ts: ditto_engine::Ts::ZERO,
            node: node.clone(),
            learner: false,
            proves: Some(ours),
            database: 0,
            run: 0,
        };
        s.write_all(&hello.encode()).unwrap();
        let Some(Frame::Challenge { salt, nonce, .. }) = read_frame(&mut s).unwrap() else { panic!("a challenge") };
        let proof = if made_up {
            [0x5a; 32]
        } else {
            let salted = salt.to_le_bytes();
            let other = ditto_replication::proof::nonce();
            let t = ditto_replication::protocol::link_transcript(&node, &salted, &other, &nonce);
            ditto_replication::proof::prove(&PASSWORD.into(), ditto_replication::proof::Side::Connects, &t)
        };
        s.write_all(&Frame::Proof { proof }.encode()).unwrap();
        match read_frame(&mut s).unwrap() {
            Some(Frame::Refuse { reason }) => assert!(
                reason.contains("authentication failed") && reason.contains("is not this primary's requirepass"),
                "{reason}"
            ),
            other => panic!("made up {made_up}: the primary took the proof: {other:?}"),
        }
        assert_eq!(read_frame(&mut s).unwrap(), None, "nothing more sent");
    }
    assert!(p.backups().is_empty());
    p.stop();
    a.close();
    // A real primary without a password: refused by a backup with one, at once.
    let (a, _t, p, addr) =
        common::start_primary(&tmp.path().join("p"), Default::default(), "local", Default::default());
    let opts =
        BackupOptions { auth: Some(PASSWORD.into()), ..BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b") };
    match backup::start(opts) {
        Err(BackupError::Refused(why)) => assert!(why.contains("this primary asks no password"), "{why}"),
        other => panic!("a backup with a password joined a primary without one: {:?}", other.map(|_| ())),
    }
    assert!(p.backups().is_empty());
    p.stop();
    a.close();
}
