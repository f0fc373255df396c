//! A batch whose checksums hold but whose payload does not parse (a primary's bug, not a
//! torn or flipped byte, which the checksums catch) is refused by the backup before it
//! acknowledges anything of it: the link drops with the reason, and the batch is never
//! counted as received. Before 2026-12-04 the backup acknowledged it (its checksums
//! held), and its replay failed afterwards: a commit could be released on an
//! acknowledgement from a backup that could never apply it. A backup refused the same
//! batch again links again further and further apart, and says so in its state.

use std::io::Write;
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ditto_engine::Ts;
use ditto_log::Epoch;
use ditto_replication::protocol::{read_frame, Frame};
use ditto_replication::{backup, BackupOptions};

mod common;

/// One transaction at `ts` inserting a key, as stream 0 of `epoch` frames it; with
/// `malformed`, its header claims two transactions (the header's checksum made to match),
/// so only the payload's structure is wrong.
fn batch(epoch: Epoch, ts: Ts, malformed: bool) -> Bytes {
    let mut out = common::one_insert_batch(epoch, ts);
    if malformed {
        let count = u32::from_le_bytes(out[44..48].try_into().unwrap());
        out[44..48].copy_from_slice(&(count + 1).to_le_bytes());
        let crc = crc32c::crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
    }
    let out = Bytes::from(out);
    // Its checksums hold either way; only the malformed one's records do not parse.
    let (b, _) = ditto_log::format::decode_batch_checksums(&out).expect("checksums hold");
    assert_eq!(b.checked_payload_in(&mut Vec::new()).is_err(), malformed);
    out
}

/// What a stand-in primary saw of one link: the highest `received` acknowledged, and
/// whether the backup closed the link.
#[derive(Debug)]
struct Seen {
    acked: Ts,
    closed_by_backup: bool,
    /// Why the backup refused, if it said.
    refused: Option<String>,
    /// When the backup's Hello came, and when the link ended here.
    opened: Instant,
    ended: Instant,
}

/// Serves each connection as a primary of `epoch` resuming the backup would: a Welcome,
/// then one batch above what the backup holds, malformed on the first `malformed_links`
/// links; reports what the backup answered within 5 s.
fn stand_in_primary(l: TcpListener, epoch: Epoch, malformed_links: usize, seen: mpsc::Sender<(Ts, Seen)>) {
    for (link, s) in l.incoming().enumerate() {
        let malformed = link < malformed_links;
        let Ok(mut s) = s else { return };
        let Ok(Some(Frame::Hello { have_ts, .. })) = read_frame(&mut s) else { continue };
        let opened = Instant::now();
        let welcome = common::resume_welcome(epoch);
        let next = Ts(have_ts.0 + 1);
        let b = Frame::Batch {
            epoch,
            released: next,
            floor_trusted: true,
            counted: true,
            batch: batch(epoch, next, malformed),
        };
        if s.write_all(&welcome.encode()).and_then(|()| s.write_all(&b.encode())).is_err() {
            continue;
        }
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let end = Instant::now() + Duration::from_secs(5);
        let mut out = Seen { acked: Ts::ZERO, closed_by_backup: false, refused: None, opened, ended: opened };
        while Instant::now() < end {
            match read_frame(&mut s) {
                Ok(Some(Frame::Ack { received, .. })) => out.acked = out.acked.max(received),
                Ok(Some(Frame::Refuse { reason })) => out.refused = Some(reason),
                Ok(Some(_)) => {}
                Ok(None) => {
                    out.closed_by_backup = true;
                    break;
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    // A valid batch's acknowledgement has come: nothing more to wait for.
                    if !malformed && out.acked >= next {
                        break;
                    }
                }
                Err(_) => {
                    out.closed_by_backup = true;
                    break;
                }
            }
        }
        out.ended = Instant::now();
        if seen.send((have_ts, out)).is_err() {
            return;
        }
    }
}

#[test]
fn a_batch_whose_payload_does_not_parse_is_refused_unacknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let pb = tmp.path().join("b");
    let (epoch, ts) = common::backup_dir_holding_a_row(&tmp.path().join("p"), &pb);

    // A stand-in primary sends the batch malformed on its first four links, then well
    // formed (the test's control: the same batch is then acknowledged).
    const MALFORMED_LINKS: usize = 4;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let stand_in = l.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || stand_in_primary(l, epoch, MALFORMED_LINKS, tx));
    let b = backup::start(BackupOptions::new(&stand_in, &pb, 1, "b")).unwrap();
    let refused_now = || (b.state.batches_refused.load(Ordering::SeqCst), b.state.batch_refused.lock().clone());
    let mut links: Vec<Seen> = Vec::new();
    for link in 0..=MALFORMED_LINKS {
        let (have, seen) = rx.recv_timeout(Duration::from_secs(20)).expect("the backup links to the stand-in");
        // It resumes from the same point each time.
        assert_eq!(have, ts, "link {link}: {seen:?}");
        if link < MALFORMED_LINKS {
            assert!(seen.closed_by_backup, "link {link}: the backup dropped the link: {seen:?}");
            assert!(seen.acked < Ts(ts.0 + 1), "link {link}: the malformed batch was acknowledged: {seen:?}");
            assert_eq!(b.state.received.load(Ordering::SeqCst), ts.0, "nothing counted");
            // The primary is told why, and the backup's state says it.
            let why = seen.refused.as_deref().unwrap_or_default();
            assert!(why.contains("records do not parse") && why.contains("not acknowledged"), "{seen:?}");
            let (count, standing) = refused_now();
            assert_eq!(count, link as u64 + 1);
            assert_eq!(standing.as_deref(), Some(why));
            assert_eq!(b.failure(), None, "a link's fault, not the backup's");
        } else {
            assert!(seen.acked >= Ts(ts.0 + 1), "the valid batch was not acknowledged: {seen:?}");
            assert_eq!(seen.refused, None);
            // The refusal no longer stands; the count stays.
            assert_eq!(refused_now(), (MALFORMED_LINKS as u64, None));
        }
        links.push(seen);
    }
    // Each link after a refusal came later than the one before (100, 200, 400, 800 ms):
    // before 2026-12-04 every 100 ms, ten refusals a second logged on both nodes.
    let gaps: Vec<Duration> = links.windows(2).map(|w| w[1].opened.saturating_duration_since(w[0].ended)).collect();
    assert!(gaps[2] >= Duration::from_millis(200) && gaps[3] >= Duration::from_millis(600), "{gaps:?}");
    assert!(gaps[3] > gaps[1], "{gaps:?}");
    b.stop("done", Duration::from_secs(10)).unwrap();
}
