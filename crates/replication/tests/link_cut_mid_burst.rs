//! A link cut in the middle of a frame, after complete frames that the receiver has not
//! yet handed to the persister (a proxy holds a burst, then passes all of it but its last
//! byte and closes). Those frames are handed over all the same: what the backup says it
//! received counts only what was handed over, and a resume asks for what lies above it,
//! so nothing is skipped (found by a review: the backup had acknowledged them, resumed
//! above them and never had them).
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::OpenOptions;
use ditto_replication::{backup, BackupOptions, CommitPolicy, Primary, PrimaryOptions};

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while !f() {
        if Instant::now() > end {
            eprintln!("timed out waiting for {what}");
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// 0: pass; 1: hold what the primary sends; 2: cut (send all held but the last byte, then close).
fn proxy(upstream: String, mode: Arc<AtomicU8>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(down) = c else { continue };
            let up = TcpStream::connect(&upstream).unwrap();
            let (mut d2, mut u2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut b = [0u8; 65536];
                loop {
                    match d2.read(&mut b) {
                        Ok(0) | Err(_) => {
                            let _ = u2.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        Ok(n) => {
                            if u2.write_all(&b[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
            let mode = Arc::clone(&mode);
            std::thread::spawn(move || {
                let (mut up, mut down) = (up, down);
                up.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
                let mut held = Vec::new();
                let mut b = vec![0u8; 1 << 20];
                loop {
                    let m = mode.load(Ordering::SeqCst);
                    if m == 2 && !held.is_empty() {
                        eprintln!("proxy: cutting after {} held bytes", held.len());
                        down.write_all(&held[..held.len() - 1]).unwrap();
                        down.flush().unwrap();
                        std::thread::sleep(Duration::from_millis(200));
                        let _ = down.shutdown(std::net::Shutdown::Both);
                        let _ = up.shutdown(std::net::Shutdown::Both);
                        mode.store(0, Ordering::SeqCst);
                        return;
                    }
                    match up.read(&mut b) {
                        Ok(0) => return,
                        Ok(n) => {
                            if m == 1 {
                                held.extend_from_slice(&b[..n]);
                            } else if down.write_all(&b[..n]).is_err() {
                                return;
                            }
                        }
                        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        }
                        Err(_) => return,
                    }
                }
            });
        }
    });
    addr
}

/// A primary (one worker, `local`, one backup expected) in `dir` with a table `t`, shipping
/// on a free port: the database, the table, the shipper and its address.
fn primary_at(dir: &std::path::Path) -> (ditto_log::Durable, ditto_engine::TableId, Arc<Primary>, String) {
    let a = ditto_log::open(dir, OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let policy = CommitPolicy::parse("local").unwrap();
    let opts = PrimaryOptions { backups_expected: 1, ..Default::default() };
    let p =
        Primary::start(&a, listener, opts, Box::new(move |h| ditto_replication::release_watermark(policy, h))).unwrap();
    let p2 = Arc::clone(&p);
    a.logger().set_progress_listener(Box::new(move |_, _| p2.recompute())).unwrap();
    (a, t, p, addr)
}

#[test]
fn a_link_cut_mid_frame_after_a_held_burst_leaves_no_hole() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a, t, p, a_addr) = primary_at(&pa);
    let mode = Arc::new(AtomicU8::new(0));
    let px = proxy(a_addr, Arc::clone(&mode));
    let bk = backup::start(BackupOptions::new(&px, &pb, 1, "b")).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    let mut commit = |from: u32, to: u32, last: &mut Ts| {
        for i in from..to {
            *last = w.run(|x| x.put(t, &i.to_be_bytes(), &[7u8; 100])).unwrap().1.wait().unwrap();
        }
    };
    commit(0, 100, &mut last);
    assert!(wait_until("durable 1", Duration::from_secs(20), || bk.state.durable.load(Ordering::SeqCst) >= last.0));
    mode.store(1, Ordering::SeqCst);
    commit(100, 400, &mut last);
    std::thread::sleep(Duration::from_millis(100));
    mode.store(2, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(400));
    commit(400, 500, &mut last);
    let ok = wait_until("durable 2", Duration::from_secs(20), || bk.state.durable.load(Ordering::SeqCst) >= last.0);
    eprintln!(
        "backup durable ack {} (last commit {}), reconnects {}",
        bk.state.durable.load(Ordering::SeqCst),
        last.0,
        bk.state.reconnects.load(Ordering::SeqCst)
    );
    wait_until("visible", Duration::from_secs(5), || bk.state.visible.load(Ordering::SeqCst) >= last.0);
    let r = bk.db.read();
    let tb = bk.db.table_id("t").unwrap();
    let missing: Vec<u32> = (0..500u32).filter(|i| r.get(tb, &i.to_be_bytes()).unwrap().is_none()).collect();
    eprintln!("missing on the backup's read view: {} rows {:?}", missing.len(), &missing[..missing.len().min(20)]);
    drop(r);
    bk.stop("done", Duration::from_secs(10)).unwrap();
    drop(bk);
    let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
    let h = ditto_log::replica::replica_holdings(&pb, 1, None).unwrap();
    eprintln!("holdings after stop: {:?}", h.streams);
    let o = ditto_log::replica::open_replica(&pb, 1, &storage).unwrap();
    let t2 = o.db.table_id("t").unwrap();
    let rv = o.db.read();
    let missing2: Vec<u32> = (0..500u32).filter(|i| rv.get(t2, &i.to_be_bytes()).unwrap().is_none()).collect();
    eprintln!(
        "recovered cut {:?}; missing after recovery: {} rows {:?}",
        o.cut,
        missing2.len(),
        &missing2[..missing2.len().min(20)]
    );
    assert!(ok);
    assert!(missing.is_empty() && missing2.is_empty(), "a hole");
    p.stop();
}

/// A backup's first join through a front that resets its first connection (SO_LINGER 0)
/// and closes its second before any answer: the join tries again, as it does for a refused
/// connection, and then holds what the primary committed (it used to fail at once).
#[test]
fn a_first_join_retries_a_reset_or_closed_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a, t, p, a_addr) = primary_at(&pa);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..50u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), &[1u8; 10])).unwrap().1.wait().unwrap();
    }
    // The front: the first connection reset, the second closed after its Hello arrived,
    // then a plain proxy.
    let front = TcpListener::bind("127.0.0.1:0").unwrap();
    let front_addr = front.local_addr().unwrap().to_string();
    let pass = proxy(a_addr, Arc::new(AtomicU8::new(0)));
    let seen = Arc::new(AtomicU8::new(0));
    let s2 = Arc::clone(&seen);
    std::thread::spawn(move || {
        for c in front.incoming() {
            let Ok(mut down) = c else { continue };
            match s2.fetch_add(1, Ordering::SeqCst) {
                0 => {
                    // SO_LINGER with a zero timeout: the close sends a reset.
                    let l = libc::linger { l_onoff: 1, l_linger: 0 };
                    // SAFETY: setsockopt on a socket this thread owns, with a valid linger.
                    unsafe {
                        use std::os::fd::AsRawFd;
                        libc::setsockopt(
                            down.as_raw_fd(),
                            libc::SOL_SOCKET,
                            libc::SO_LINGER,
                            &l as *const libc::linger as *const libc::c_void,
                            std::mem::size_of::<libc::linger>() as libc::socklen_t,
                        );
                    }
                    drop(down);
                }
                1 => {
                    let mut b = [0u8; 64];
                    let _ = down.read(&mut b);
                    drop(down);
                }
                _ => {
                    let up = TcpStream::connect(&pass).unwrap();
                    let (mut d2, mut u2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
                    std::thread::spawn(move || std::io::copy(&mut d2, &mut u2));
                    std::thread::spawn(move || {
                        let (mut up, mut down) = (up, down);
                        std::io::copy(&mut up, &mut down)
                    });
                }
            }
        }
    });
    let bk =
        backup::start(BackupOptions::new(&front_addr, &pb, 1, "b")).expect("the join goes through at the third try");
    assert!(seen.load(Ordering::SeqCst) >= 3, "it tried again: {} connections", seen.load(Ordering::SeqCst));
    assert!(wait_until("the backup holding every commit", Duration::from_secs(20), || bk
        .state
        .durable
        .load(Ordering::SeqCst)
        >= last.0));
    bk.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
}
