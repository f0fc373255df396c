//! A cluster primary's lease stands on its backups' acks (docs/cluster.md, "The old
//! primary's lease"), counted as of when the primary sent the heartbeat an ack echoes
//! (`Frame::Heartbeat::sent_us`, `Frame::Ack::echo_us`), not when the ack arrived: an ack
//! that a network held (TCP's retransmissions through a partition that then healed) does
//! not stretch the lease by its delay. Real files and TCP; the backup here is a stand-in
//! speaking the protocol, so that its acks can be held back.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::Ts;
use ditto_replication::primary::LEASE_HEARTBEAT;
use ditto_replication::protocol::{read_frame, Frame};
use ditto_replication::{Primary, PrimaryOptions};

mod common;
use common::wait_until;

fn info_of(p: &Primary, name: &str) -> Option<ditto_replication::BackupInfo> {
    p.backups().into_iter().find(|b| b.node == name)
}

/// A stand-in backup named `name`: its Hello sent, a thread reading every frame and
/// keeping the newest heartbeat time (and the first nonzero one); acks are sent by hand.
struct StandIn {
    sock: std::net::TcpStream,
    newest: Arc<AtomicU64>,
    first: Arc<AtomicU64>,
}

impl StandIn {
    fn join(addr: &str, name: &str) -> StandIn {
        let sock = std::net::TcpStream::connect(addr).unwrap();
        (&sock).write_all(&common::empty_hello(name).encode()).unwrap();
        let (newest, first) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (n, f, mut r) = (Arc::clone(&newest), Arc::clone(&first), sock.try_clone().unwrap());
        std::thread::spawn(move || {
            while let Ok(Some(frame)) = read_frame(&mut r) {
                if let Frame::Heartbeat { sent_us, .. } = frame {
                    if sent_us > 0 {
                        let _ = f.compare_exchange(0, sent_us, Ordering::AcqRel, Ordering::Acquire);
                        n.fetch_max(sent_us, Ordering::AcqRel);
                    }
                }
            }
        });
        StandIn { sock, newest, first }
    }

    fn ack(&self, echo_us: u64) {
        let ack = Frame::Ack { received: Ts::ZERO, durable: Ts::ZERO, replayed: Ts::ZERO, echo_us };
        (&self.sock).write_all(&ack.encode()).unwrap();
    }
}

/// An ack that arrives late, echoing an old heartbeat, refreshes when the backup was last
/// heard (`heard_ago`) but not the lease (`lease_ago`): that stays as old as the heartbeat
/// it echoes. An ack echoing the newest heartbeat refreshes both. (Before protocol 6 the
/// lease was the ack's arrival, which is `heard_ago`.)
#[test]
fn a_late_ack_refreshes_no_lease_beyond_the_heartbeat_it_echoes() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = PrimaryOptions { backups_expected: 1, lease_beat: Some(LEASE_HEARTBEAT), ..Default::default() };
    let (a, _t, p, addr) = common::start_primary(&tmp.path().join("p"), Default::default(), "majority", opts);
    let b = StandIn::join(&addr, "b");
    wait_until("a heartbeat with its time", Duration::from_secs(20), || b.first.load(Ordering::Acquire) > 0);
    let first = b.first.load(Ordering::Acquire);
    b.ack(0);
    wait_until("the link to be heard", Duration::from_secs(20), || {
        info_of(&p, "b").is_some_and(|i| i.heard_ago < Duration::from_secs(5))
    });
    assert_eq!(info_of(&p, "b").unwrap().lease_ago, Duration::MAX, "an ack that echoes nothing gives no lease");
    // Held back 400 ms, then sent echoing the first heartbeat: as a delayed ack arrives.
    std::thread::sleep(Duration::from_millis(400));
    let sent = Instant::now();
    b.ack(first);
    wait_until("the late ack to arrive", Duration::from_secs(20), || {
        info_of(&p, "b").is_some_and(|i| i.heard_ago < sent.elapsed())
    });
    let i = info_of(&p, "b").unwrap();
    assert!(i.lease_ago >= Duration::from_millis(400), "the late ack stretched the lease: {:?}", i.lease_ago);
    // An ack echoing the newest heartbeat gives a fresh lease (heartbeats every 10 ms).
    let newest = b.newest.load(Ordering::Acquire);
    assert!(newest > first);
    b.ack(newest);
    wait_until("a fresh lease", Duration::from_secs(20), || {
        info_of(&p, "b").is_some_and(|i| i.lease_ago < Duration::from_millis(300))
    });
    // An echo of a time the primary has not reached yet (a backup's bug) counts as now.
    b.ack(u64::MAX);
    std::thread::sleep(Duration::from_millis(100));
    let i = info_of(&p, "b").unwrap();
    assert!(i.lease_ago >= Duration::from_millis(50), "a future echo held the lease: {:?}", i.lease_ago);
    p.stop();
    a.close();
}

/// A cluster primary's idle links beat every `LEASE_HEARTBEAT`, so that a backup's acks
/// keep its lease fresh with no writes; a standalone primary's idle links beat every
/// `IDLE_HEARTBEAT` (200 ms), and may doze until then.
#[test]
fn a_cluster_primarys_idle_links_beat_often_enough_for_its_lease() {
    for (lease_beat, at_least, at_most) in [(Some(LEASE_HEARTBEAT), 30, u64::MAX), (None, 2, 10)] {
        let tmp = tempfile::tempdir().unwrap();
        let opts = PrimaryOptions { backups_expected: 1, lease_beat, ..Default::default() };
        let (a, _t, p, addr) = common::start_primary(&tmp.path().join("p"), Default::default(), "majority", opts);
        let b = StandIn::join(&addr, "b");
        wait_until("a heartbeat with its time", Duration::from_secs(20), || b.first.load(Ordering::Acquire) > 0);
        // Heartbeats counted over one idle second (each one's time is new).
        let mut seen = std::collections::BTreeSet::new();
        let end = Instant::now() + Duration::from_secs(1);
        while Instant::now() < end {
            seen.insert(b.newest.load(Ordering::Acquire));
            std::thread::sleep(Duration::from_millis(1));
        }
        let beats = seen.len() as u64;
        eprintln!("lease beat {lease_beat:?}: {beats} heartbeats in an idle second");
        assert!((at_least..=at_most).contains(&beats), "{lease_beat:?}: {beats} heartbeats in an idle second");
        p.stop();
        a.close();
    }
}
