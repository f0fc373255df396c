//! A backup tells its primary how far it has replayed even when nothing more comes to
//! acknowledge. The receiver acks what it received and the persister what it made durable
//! (the persister's ack goes before it hands the batch to replay), so replay of a primary's
//! last batch went unreported until the next frame: on an idle primary the idle heartbeat,
//! 200 ms later. The primary's replay lag and freshness read that stale, and its benchmarks
//! counted it as a 200 ms replay stall (found 2026-12-04). A stand-in primary here sends
//! one batch and then nothing at all, so without the replay's own ack (`ReplayAcks`) its
//! replay is never reported (within the 3 s the stand-in waits, under the 5 s after which
//! a backup hearing nothing drops its link).

use std::io::Write;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ditto_engine::Ts;
use ditto_replication::protocol::{read_frame, Frame};
use ditto_replication::{backup, BackupOptions};

mod common;

#[test]
fn replay_of_the_last_batch_is_acked_without_another_frame() {
    let tmp = tempfile::tempdir().unwrap();
    let pb = tmp.path().join("b");
    let (epoch, ts) = common::backup_dir_holding_a_row(&tmp.path().join("p"), &pb);

    // The stand-in resumes the backup with one batch, then sends nothing, and reads every
    // ack until 500 ms after the one that says the batch is replayed, or 3 s.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let stand_in = l.local_addr().unwrap().to_string();
    let next = Ts(ts.0 + 1);
    let serve = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let Some(Frame::Hello { have_ts, .. }) = read_frame(&mut s).unwrap() else { panic!("no hello") };
        assert_eq!(have_ts, ts);
        let welcome = common::resume_welcome(epoch);
        let batch = Frame::Batch {
            epoch,
            released: next,
            floor_trusted: true,
            counted: true,
            batch: Bytes::from(common::one_insert_batch(epoch, next)),
        };
        s.write_all(&welcome.encode()).unwrap();
        let sent = Instant::now();
        s.write_all(&batch.encode()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let (mut acks, mut replayed_at) = (Vec::new(), None);
        let end = sent + Duration::from_secs(3);
        while Instant::now() < end && replayed_at.is_none_or(|at: Instant| at.elapsed() < Duration::from_millis(500)) {
            match read_frame(&mut s) {
                Ok(Some(Frame::Ack { received, durable, replayed, .. })) => {
                    acks.push((received.0, durable.0, replayed.0));
                    if replayed >= next && replayed_at.is_none() {
                        replayed_at = Some(Instant::now());
                    }
                }
                Ok(Some(f)) => panic!("unexpected frame {f:?}"),
                Ok(None) => panic!("the backup closed the link; acks {acks:?}"),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading acks: {e}"),
            }
        }
        (acks, sent, replayed_at, s)
    });
    let b = backup::start(BackupOptions::new(&stand_in, &pb, 1, "b")).unwrap();
    let (acks, sent, replayed_at, _link) = serve.join().unwrap();
    // The backup did replay it (its own state says so)...
    common::wait_until("the backup to replay the batch", Duration::from_secs(10), || {
        b.state.replayed.load(std::sync::atomic::Ordering::SeqCst) >= next.0
    });
    // ...and said so with no frame after the batch: before, no ack ever did.
    let at = replayed_at.unwrap_or_else(|| panic!("replay of the batch was never acked; acks {acks:?}"));
    println!("replay acked {:?} after the batch was sent; acks {acks:?}", at.duration_since(sent));
    // One ack says it, and none follows: the acker does not go on sending. (How many acks
    // say the batch durable depends on whether the receiver's ack comes after the sync.)
    assert_eq!(acks.iter().filter(|a| a.2 >= next.0).count(), 1, "{acks:?}");
    assert!(acks.last().is_some_and(|a| a.2 >= next.0), "an ack after replay's: {acks:?}");
    b.stop("done", Duration::from_secs(10)).unwrap();
}
