//! A record id the primary gave a new key, its lives reaching a backup the other way round.
//!
//! The primary gives a deleted record's id to a new key once a durable checkpoint covers
//! the delete. A backup far behind is sent its gap from the primary's disk one stream at a
//! time (`replica::Gap`), so the new life's writes, on one stream, can reach it before the
//! old life's, on another. A keyless update names no life: installed before the old life's
//! insert, it was taken for the old life's (wrong reads, and a wrong value kept for good).
//! Each batch now says below which timestamp the old lives of the ids it reuses ended
//! (`BatchHeader::reuse_ts`, the primary's newest durable checkpoint when it framed the
//! batch), and a replayer installs nothing above that before everything below it is.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ditto_engine::{Database, Options, TableId, Ts, WorkerId};
use ditto_log::format::{decode_batch_checksums, BatchBuilder, Marks};
use ditto_log::{Durability, LogOptions, OpenOptions};
use ditto_replication::{replay_recorded, ReplayMode, ReplayRun};
use parking_lot::Mutex;

/// Keeps every batch the primary frames, as it ships them.
#[derive(Default)]
struct Shipped(Mutex<Vec<Bytes>>);

impl ditto_log::ShipTap for Shipped {
    fn batch(&self, _: &ditto_log::format::BatchHeader, frame: &[u8], _: bool) {
        self.0.lock().push(Bytes::copy_from_slice(frame));
    }
    fn table_created(&self, _: TableId, _: &str) {}
}

type State = BTreeMap<Vec<u8>, Vec<u8>>;

/// A primary of three streams: stream 2 makes 60 keys and deletes them (and is idle from
/// then on); a checkpoint lets
/// their ids be reused; stream 1 makes 60 new keys (on those ids), stream 0 updates and
/// deletes some of them. Returns what it shipped, the checkpoint's timestamp, and what it
/// holds at the end.
fn primary_history() -> (Vec<Bytes>, Ts, State) {
    let dir = tempfile::tempdir().unwrap();
    let opts = OpenOptions {
        workers: 3,
        log: LogOptions { durability: Durability::EveryBatch, ..LogOptions::default() },
        progress: false,
        ..Default::default()
    };
    let d = ditto_log::open(dir.path(), opts).unwrap();
    let shipped = Arc::new(Shipped::default());
    d.logger().set_ship_tap(Arc::clone(&shipped) as Arc<dyn ditto_log::ShipTap>).unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = (0..3).map(|i| d.db().worker(WorkerId(i)).unwrap()).collect::<Vec<_>>();
    let old = |i: u32| format!("old-{i:03}").into_bytes();
    let new = |i: u32| format!("new-{i:03}").into_bytes();
    for i in 0..60 {
        w[2].run(|x| x.insert(t, &old(i), &old(i))).unwrap().1.wait().unwrap();
    }
    for i in 0..60 {
        w[2].run(|x| x.delete(t, &old(i))).unwrap().1.wait().unwrap();
    }
    let used = |d: &ditto_log::Durable| d.db().record_ids_used(t).unwrap();
    for _ in 0..2000 {
        d.db().reclaim();
        if used(&d) == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(used(&d), 0, "the deleted records' ids were not given back");
    // Stream 2 is idle from here: the last bound it frames lies below the checkpoint, and
    // only a floor says it has nothing more (in a gap, the one that closes it).
    w[0].run(|x| x.put(t, b"other", b"x")).unwrap().1.wait().unwrap();
    let ckpt = d.checkpoint().unwrap().ts;
    for i in 0..60 {
        w[1].run(|x| x.insert(t, &new(i), &new(i))).unwrap().1.wait().unwrap();
    }
    assert_eq!(
        d.db().read().rid_limit(t).unwrap(),
        61,
        "the new keys did not take the old ids (\"other\" took one more)"
    );
    for i in (0..60).step_by(2) {
        w[0].run(|x| x.update(t, &new(i), &[b"u-".as_slice(), &new(i)].concat())).unwrap().1.wait().unwrap();
    }
    for i in (0..60).step_by(5) {
        w[0].run(|x| x.delete(t, &new(i)).map(|_| ())).unwrap().1.wait().unwrap();
    }
    for i in (1..60).step_by(3).filter(|i| i % 5 != 0) {
        w[0].run(|x| x.update(t, &new(i), &[b"v-".as_slice(), &new(i)].concat())).unwrap().1.wait().unwrap();
    }
    let all = d.db().read().scan(
        t,
        std::ops::Bound::Unbounded,
        std::ops::Bound::Unbounded,
        ditto_engine::Direction::Forward,
        0,
    );
    let state = all.unwrap().into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect();
    drop(w);
    d.close();
    let batches = std::mem::take(&mut *shipped.0.lock());
    (batches, ckpt, state)
}

/// `batches` as a gap sends them: stream by stream in `order`, each batch with
/// transactions framed again
/// without its floor (a gap's floors are not trusted: not in framing order), its bound and
/// reuse bound kept; then one empty batch vouching for everything, as the primary closes a
/// gap (`send_gap`).
fn as_a_gap(batches: &[Bytes], order: &[u32]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut top = Ts::ZERO;
    for &s in order {
        for b in batches {
            let (batch, _) = decode_batch_checksums(b).unwrap();
            let h = batch.header;
            // (Heartbeats left out: a log whose idle streams wrote none, their floors
            // vouching for them, is as valid; then only the gap's closing vouch does.)
            if h.stream.0 != s || h.txn_count == 0 {
                continue;
            }
            top = top.max(h.bound_ts).max(h.last_ts);
            let mut builder = BatchBuilder::new();
            let mut scratch = Vec::new();
            for txn in batch.checked_payload_in(&mut scratch).unwrap().txns() {
                builder.push_txn(txn.ts, txn.writes().map(|w| (w.table, w.rid, w.key, w.value)));
            }
            let marks = Marks { bound_ts: h.bound_ts, floor_ts: Ts::ZERO, reuse_ts: h.reuse_ts, ..Marks::default() };
            let mut framed = Vec::new();
            builder.finish_marked_into(h.stream, h.epoch, marks, false, &mut framed);
            out.push(Bytes::from(framed));
        }
    }
    let epoch = decode_batch_checksums(&batches[0]).unwrap().0.header.epoch;
    let mut vouch = Vec::new();
    let marks = Marks { bound_ts: top, floor_ts: top, reuse_ts: Ts::ZERO, ..Marks::default() };
    BatchBuilder::new().finish_marked_into(ditto_log::StreamId(0), epoch, marks, false, &mut vouch);
    out.push(Bytes::from(vouch));
    out
}

/// Replays `batches` of `streams` streams into a fresh database of one table ("t") in
/// `mode`, failing the test (named `what`) if it fails or takes over 30 s.
fn replay(streams: usize, mode: ReplayMode, batches: Vec<Bytes>, what: &str) -> (Arc<Database>, ReplayRun) {
    let db = Database::new(Options { workers: streams });
    db.create_table("t").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let d = Arc::clone(&db);
    std::thread::spawn(move || {
        let _ = tx.send(replay_recorded(d, streams, Ts::ZERO, mode, None, &batches));
    });
    let run = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what}: replay still waiting after 30 s"))
        .unwrap_or_else(|e| panic!("{what}: replay failed: {e}"));
    (db, run)
}

/// Every batch framed after the checkpoint says so; none before it claims anything.
#[test]
fn batches_framed_after_a_checkpoint_carry_its_reuse_bound() {
    let (batches, ckpt, _) = primary_history();
    let mut after = 0;
    for b in &batches {
        let h = decode_batch_checksums(b).unwrap().0.header;
        if h.txn_count == 0 {
            continue;
        }
        if h.first_ts > ckpt {
            assert!(
                h.reuse_ts >= ckpt,
                "a batch at {:?} after the checkpoint at {ckpt:?}: {:?}",
                h.first_ts,
                h.reuse_ts
            );
            after += 1;
        } else {
            assert!(h.reuse_ts < h.first_ts || h.reuse_ts == Ts::ZERO, "{h:?}");
        }
        if h.last_ts <= ckpt {
            assert_eq!(h.reuse_ts, Ts::ZERO, "a batch before the checkpoint: {h:?}");
        }
    }
    assert!(after >= 100, "{after} batches after the checkpoint");
}

/// The gap in every order of its three streams, replayed serially and in parallel: each
/// ends holding exactly what the primary held, every key with its own value. Before the
/// reuse bound, an order that brought stream 0's keyless updates first left values of
/// deleted keys, or of another life, behind.
#[test]
fn a_gap_that_brings_a_reused_ids_new_life_first_replays_to_the_primarys_state() {
    let (batches, _, want) = primary_history();
    let orders: [[u32; 3]; 6] = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    for mode in [ReplayMode::Serial, ReplayMode::Parallel, ReplayMode::Dependency { barrier_every: 0 }] {
        let mut waited = 0;
        for order in orders {
            let (db, run) = replay(3, mode, as_a_gap(&batches, &order), &format!("{mode:?} {order:?}"));
            let t = TableId(0);
            waited += run.reuse_waits;
            let got: State = db
                .read()
                .scan(t, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, ditto_engine::Direction::Forward, 0)
                .unwrap()
                .into_iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect();
            let differ: Vec<_> = want
                .keys()
                .chain(got.keys())
                .filter(|k| want.get(*k) != got.get(*k))
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            assert!(
                differ.is_empty(),
                "{mode:?} {order:?}: {} keys differ from the primary's: {differ:?}",
                differ.len()
            );
            assert_eq!(db.count(t).unwrap(), want.len() as u64, "{mode:?} {order:?}");
            for k in want.keys() {
                assert_eq!(db.read().get(t, k).unwrap().as_deref(), want.get(k).map(|v| &v[..]), "{mode:?} {order:?}");
            }
            if !matches!(mode, ReplayMode::Dependency { .. }) {
                assert_eq!(
                    db.replay_own_records(),
                    0,
                    "{mode:?} {order:?}: no late life needed a record of the backup's own"
                );
            }
        }
        // The dependency mode installs each record's writes in timestamp order already.
        if !matches!(mode, ReplayMode::Dependency { .. }) {
            assert!(waited > 0, "{mode:?}: no order made a new life wait for its old one");
        }
    }
}

/// A batch straddling its reuse bound: a transaction at or below it (taken before the
/// bound moved, framed after) waits for everything below its own timestamp, one above it
/// for everything up to the bound. Stream 0's batch (reuse bound 6) gives record 0 to key
/// b at ts 4 and updates it at 7; stream 1's, behind it, holds key a's life on record 0
/// (insert 1, delete 2). Either way round, b's life is installed after a's, on record 0
/// itself.
#[test]
fn a_batch_straddling_its_reuse_bound_waits_below_and_above_it() {
    type W = (TableId, ditto_engine::RecordId, Option<&'static [u8]>, Option<&'static [u8]>);
    let frame = |stream: u32, bound: u64, reuse: u64, txns: &[(u64, Vec<W>)]| {
        let mut b = BatchBuilder::new();
        for (ts, writes) in txns {
            b.push_txn(Ts(*ts), writes.iter().copied());
        }
        let mut out = Vec::new();
        let marks = Marks { bound_ts: Ts(bound), floor_ts: Ts::ZERO, reuse_ts: Ts(reuse), ..Marks::default() };
        b.finish_marked_into(ditto_log::StreamId(stream), ditto_log::Epoch(1), marks, false, &mut out);
        Bytes::from(out)
    };
    let (t, r0) = (TableId(0), ditto_engine::RecordId(0));
    let new_life =
        frame(0, 7, 6, &[(4, vec![(t, r0, Some(b"b"), Some(b"b4"))]), (7, vec![(t, r0, None, Some(b"b7"))])]);
    let old_life = frame(1, 7, 0, &[(1, vec![(t, r0, Some(b"a"), Some(b"a1"))]), (2, vec![(t, r0, None, None)])]);
    for mode in [ReplayMode::Serial, ReplayMode::Parallel] {
        for batches in [vec![new_life.clone(), old_life.clone()], vec![old_life.clone(), new_life.clone()]] {
            let first = if batches[0] == new_life { "new life first" } else { "old life first" };
            let (db, run) = replay(2, mode, batches, &format!("{mode:?}, {first}"));
            assert_eq!(run.replayed, Ts(7), "{mode:?}, {first}");
            let r = db.read();
            assert_eq!(r.get(t, b"b").unwrap().as_deref(), Some(&b"b7"[..]), "{mode:?}, {first}");
            assert_eq!(r.get(t, b"a").unwrap(), None, "{mode:?}, {first}");
            assert_eq!(db.count(t).unwrap(), 1, "{mode:?}, {first}");
            assert_eq!(db.replay_own_records(), 0, "{mode:?}, {first}: b's life went onto record 0 itself");
        }
    }
}
