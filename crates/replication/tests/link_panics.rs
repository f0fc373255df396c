//! A panic on a primary's link thread or on the thread reading its acks (a bug there, or
//! in the listener they call) ends that link as a broken connection does: the backup
//! connects again, commits counting it are released, and the dead link leaves the list.
//! Before, the panic ended its thread alone: a link whose ack reader died shipped on with
//! its acks unread (a `majority` release stalled for good); one whose link thread died
//! stayed in the primary's list for good (its backup's silence timeout made it link again).
//! Real files and TCP; the panic is the release listener's, on the named thread, once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ditto_engine::WorkerId;
use ditto_log::{Durability, LogOptions, OpenOptions};
use ditto_replication::{backup, release_watermark, BackupOptions, CommitPolicy, Primary, PrimaryOptions};

mod common;

/// A primary under `majority` with one backup, whose release listener panics the first
/// time it is called on a thread named `thread` (armed before the backup links); with
/// `acks_on_a_runtime`, acks are read on a runtime's thread of that name, as in a server
/// (that case passed before the change too: the task's `KillOnDrop` ended its link).
fn a_panic_on(thread: &'static str, acks_on_a_runtime: bool) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name(thread).enable_all().build().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let log = LogOptions { durability: Durability::EveryBatch, ..LogOptions::default() };
    let a = ditto_log::open(&tmp.path().join("p"), OpenOptions { workers: 1, log, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let policy = CommitPolicy::parse("majority-received").unwrap();
    let armed = Arc::new(AtomicBool::new(true));
    let fired = Arc::new(AtomicBool::new(false));
    let (a2, f2) = (Arc::clone(&armed), Arc::clone(&fired));
    let acks_on = acks_on_a_runtime.then(|| rt.handle().clone());
    let opts = PrimaryOptions { backups_expected: 1, acks_on, ..Default::default() };
    let p: Arc<Primary> = Primary::start(
        &a,
        listener,
        opts,
        Box::new(move |h| {
            if std::thread::current().name() == Some(thread) && a2.swap(false, Ordering::SeqCst) {
                f2.store(true, Ordering::SeqCst);
                panic!("a listener's bug");
            }
            release_watermark(policy, h)
        }),
    )
    .unwrap();
    let p2 = Arc::clone(&p);
    a.logger().set_progress_listener(Box::new(move |_, _| p2.recompute())).unwrap();
    // A commit before the backup joins, so that what it is sent holds something: a backup
    // that holds nothing when its link drops is sent a copy again, which a server does
    // (`JoinAgain::Copy`) and this library's backup leaves to its caller.
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let _first = w.run(|x| x.put(t, b"first", b"v")).unwrap();
    let b = backup::start(BackupOptions::new(&addr, &tmp.path().join("b"), 1, "b")).unwrap();
    // Each commit is released, the panic notwithstanding, and reaches the backup.
    for i in 0..20u32 {
        let ts = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.ts();
        common::wait_until("the commit's release", Duration::from_secs(30), || p.released() >= ts);
        common::wait_until("the backup's replay", Duration::from_secs(30), || {
            b.state.replayed.load(Ordering::Acquire) >= ts.0
        });
        if i == 0 {
            // (The ack that released it may have been read just before the panic.)
            common::wait_until("the listener's panic", Duration::from_secs(30), || fired.load(Ordering::SeqCst));
        }
    }
    assert!(b.state.reconnects.load(Ordering::Relaxed) >= 1, "the backup's link was not ended and made again");
    // The ended link left the primary's list (INFO, the quorum's count read it).
    common::wait_until("one link listed", Duration::from_secs(10), || p.backups().len() == 1);
    b.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    a.close();
}

#[test]
fn a_panic_on_the_link_thread_ends_the_link_and_the_backup_links_again() {
    a_panic_on("ditto-repl-link", false);
}

#[test]
fn a_panic_on_the_ack_reader_ends_the_link_and_the_backup_links_again() {
    a_panic_on("ditto-repl-acks", false);
}

#[test]
fn a_panic_reading_acks_on_a_runtime_ends_the_link_and_the_backup_links_again() {
    a_panic_on("test-acks-runtime", true);
}
