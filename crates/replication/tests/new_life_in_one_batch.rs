//! A key's or a record id's new life in the same batch as the end of its old one.
//!
//! Replay gives a key a new record, or a record a new key, only once every snapshot sees
//! the old life's tombstone (crates/engine/src/replay.rs), and that wait is on the read
//! view. When the delete and the new life come in one batch of one stream, the read view
//! cannot pass the batch's start until the batch is done: the wait must not depend on it.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ditto_engine::{Database, Options, RecordId, TableId, Ts};
use ditto_log::format::BatchBuilder;
use ditto_log::{Epoch, StreamId};
use ditto_replication::{replay_recorded, ReplayMode};

type Wr<'a> = (TableId, RecordId, Option<&'a [u8]>, Option<&'a [u8]>);
type W = Wr<'static>;

fn batch(txns: &[(u64, Vec<W>)]) -> Bytes {
    batch_of(0, txns.last().unwrap().0, txns)
}

/// A batch of `stream` with the given bound (at least its last transaction's timestamp).
fn batch_of(stream: u32, bound: u64, txns: &[(u64, Vec<W>)]) -> Bytes {
    let mut b = BatchBuilder::new();
    for (ts, writes) in txns {
        b.push_txn(Ts(*ts), writes.iter().copied());
    }
    let mut out = Vec::new();
    b.finish_into(StreamId(stream), Epoch(1), Ts(bound), false, &mut out);
    Bytes::from(out)
}

/// Replays `batches` (one stream) in `mode`, failing the test if it takes over 10 s.
fn replay(mode: ReplayMode, batches: Vec<Bytes>) -> Arc<Database> {
    replay_streams(mode, 1, batches, Ts(4))
}

/// Replays `batches` of `streams` streams, which must end with everything up to `want`
/// replayed.
fn replay_streams(mode: ReplayMode, streams: usize, batches: Vec<Bytes>, want: Ts) -> Arc<Database> {
    let db = Database::new(Options { workers: streams });
    assert_eq!(db.create_table("t").unwrap(), TableId(0));
    let (tx, rx) = mpsc::channel();
    let d = Arc::clone(&db);
    std::thread::spawn(move || {
        let _ = tx.send(replay_recorded(d, streams, Ts::ZERO, mode, None, &batches));
    });
    let run = rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{mode:?}: replay still waiting after 10 s"))
        .unwrap_or_else(|e| panic!("{mode:?}: replay failed: {e}"));
    assert_eq!(run.replayed, want, "{mode:?}");
    db
}

const T: TableId = TableId(0);

fn modes() -> [ReplayMode; 3] {
    [ReplayMode::Serial, ReplayMode::Parallel, ReplayMode::Dependency { barrier_every: 0 }]
}

#[test]
fn a_key_deleted_and_given_a_new_record_in_one_batch_is_replayed_without_waiting() {
    for mode in modes() {
        let db = replay(
            mode,
            vec![batch(&[
                (1, vec![(T, RecordId(0), Some(b"k"), Some(b"old"))]),
                (2, vec![(T, RecordId(0), None, None)]),
                // The primary unlinked record 0 and gave "k" record 1.
                (3, vec![(T, RecordId(1), Some(b"k"), Some(b"new"))]),
                (4, vec![(T, RecordId(1), None, Some(b"newer"))]),
            ])],
        );
        let r = db.read();
        assert_eq!(r.get(T, b"k").unwrap().as_deref(), Some(&b"newer"[..]), "{mode:?}");
        assert_eq!(db.count(T).unwrap(), 1, "{mode:?}");
    }
}

#[test]
fn a_record_id_deleted_and_given_a_new_key_in_one_batch_is_replayed_without_waiting() {
    for mode in modes() {
        let db = replay(
            mode,
            vec![batch(&[
                (1, vec![(T, RecordId(0), Some(b"a"), Some(b"1"))]),
                (2, vec![(T, RecordId(0), None, None)]),
                // The primary unlinked record 0 and reused its id for "b".
                (3, vec![(T, RecordId(0), Some(b"b"), Some(b"2"))]),
                (4, vec![(T, RecordId(0), None, Some(b"3"))]),
            ])],
        );
        let r = db.read();
        assert_eq!(r.get(T, b"a").unwrap(), None, "{mode:?}");
        assert_eq!(r.get(T, b"b").unwrap().as_deref(), Some(&b"3"[..]), "{mode:?}");
        assert_eq!(db.count(T).unwrap(), 1, "{mode:?}");
    }
}

/// The wait for the old life also needs another stream's transaction below the new life,
/// shipped after the batch that waits: replayers of their own (`parallel`) or executors
/// (`dependency`) get there, and the serial replayer replays that batch while it waits.
#[test]
fn a_new_life_waiting_on_another_streams_later_batch_is_replayed_in_every_mode() {
    for mode in modes() {
        let db = replay_streams(
            mode,
            2,
            vec![
                batch_of(
                    0,
                    4,
                    &[
                        (1, vec![(T, RecordId(0), Some(b"k"), Some(b"old"))]),
                        (2, vec![(T, RecordId(0), None, None)]),
                        (4, vec![(T, RecordId(1), Some(b"k"), Some(b"new"))]),
                    ],
                ),
                batch_of(1, 4, &[(3, vec![(T, RecordId(2), Some(b"other"), Some(b"x"))])]),
            ],
            Ts(4),
        );
        let r = db.read();
        assert_eq!(r.get(T, b"k").unwrap().as_deref(), Some(&b"new"[..]), "{mode:?}");
        assert_eq!(r.get(T, b"other").unwrap().as_deref(), Some(&b"x"[..]), "{mode:?}");
    }
}

/// The other order across streams: a key's new life (stream 1) reaches a replayer before
/// its old life's insert (stream 0, whose replayer is behind a batch of 100,000 writes).
/// The new life is bound at once, as the key is absent; the old life then goes below it
/// on the new life's record (crates/engine/src/replay.rs; the reads at every view are
/// checked in crates/engine/tests/replay.rs).
#[test]
fn a_new_life_replayed_before_its_old_life_on_a_lagging_stream() {
    let (db, filler) = behind_a_filler();
    let run = vec![
        batch_of(
            0,
            6,
            &[
                (2, filler),
                (3, vec![(T, RecordId(0), Some(b"k"), Some(b"old"))]),
                (4, vec![(T, RecordId(0), None, None)]),
            ],
        ),
        batch_of(1, 6, &[(6, vec![(T, RecordId(1), Some(b"k"), Some(b"new"))])]),
    ];
    let got = replay_recorded(Arc::clone(&db), 2, Ts(1), ReplayMode::Parallel, None, &run);
    assert!(got.is_ok(), "{got:?}");
    assert_eq!(db.read().get(T, b"k").unwrap().as_deref(), Some(&b"new"[..]));
}

/// A database of two tables whose "filler" table holds 100,000 records, replayed, and an
/// update of each of them: a batch of stream 0 that starts with it keeps that stream's
/// replayer behind the other's.
fn behind_a_filler() -> (Arc<Database>, Vec<W>) {
    let filler: Vec<W> = (0..100_000u64).map(|i| (TableId(1), RecordId(i), None, Some(&b"f"[..]))).collect();
    let db = Database::new(Options { workers: 2 });
    db.create_table("t").unwrap();
    db.create_table("filler").unwrap();
    // The filler records need a value to update: inserted first, in the load.
    let load: Vec<Bytes> = {
        let keys: Vec<Vec<u8>> = (0..100_000u64).map(|i| i.to_be_bytes().to_vec()).collect();
        let writes: Vec<Wr<'_>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (TableId(1), RecordId(i as u64), Some(&k[..]), Some(&b"0"[..])))
            .collect();
        let mut b = BatchBuilder::new();
        b.push_txn(Ts(1), writes.into_iter());
        let mut out = Vec::new();
        b.finish_into(StreamId(0), Epoch(1), Ts(1), false, &mut out);
        vec![Bytes::from(out), batch_of(1, 1, &[])]
    };
    replay_recorded(Arc::clone(&db), 2, Ts::ZERO, ReplayMode::Parallel, None, &load).unwrap();
    (db, filler)
}

/// A record id's lives the other way round across streams: the primary gave record 0 to
/// key b (stream 1, ts 6) after key a's life there (stream 0: insert 3, delete 4) was
/// over, and stream 0's replayer is behind 100,000 writes, so b's life is installed on
/// record 0 first. a's life then goes to a record of the backup's own
/// (crates/engine/src/replay.rs; the reads at every view are checked in
/// crates/engine/tests/replay.rs). Before 2026-11-29 replay stopped here: "record 0 still
/// holds a value when the primary gave its key or id a new life at ts 3".
#[test]
fn a_record_ids_new_life_replayed_before_its_old_life_on_a_lagging_stream() {
    let (db, filler) = behind_a_filler();
    let run = vec![
        batch_of(
            0,
            7,
            &[
                (2, filler),
                (3, vec![(T, RecordId(0), Some(b"a"), Some(b"a1"))]),
                (4, vec![(T, RecordId(0), None, None)]),
            ],
        ),
        batch_of(
            1,
            7,
            &[(6, vec![(T, RecordId(0), Some(b"b"), Some(b"b1"))]), (7, vec![(T, RecordId(0), None, Some(b"b2"))])],
        ),
    ];
    let got = replay_recorded(Arc::clone(&db), 2, Ts(1), ReplayMode::Parallel, None, &run);
    assert!(got.is_ok(), "{got:?}");
    let r = db.read();
    assert_eq!(r.get(T, b"b").unwrap().as_deref(), Some(&b"b2"[..]));
    assert_eq!(r.get(T, b"a").unwrap(), None);
    assert_eq!(db.count(T).unwrap(), 1);
    assert_eq!(db.replay_own_records(), 1, "a's life went to a record of the backup's own");
}

/// Two streams, each with a new life waiting for the other: the serial replayer, waiting
/// in stream 0's batch, replays stream 1's, which waits for stream 0's waiting write; that
/// batch is put off (what it installed stays), stream 0's goes on, and the rest of stream
/// 1's follows.
#[test]
fn new_lives_waiting_on_each_other_across_two_streams() {
    for mode in modes() {
        let db = replay_streams(
            mode,
            2,
            vec![
                batch_of(
                    0,
                    6,
                    &[
                        (1, vec![(T, RecordId(0), Some(b"k"), Some(b"k-old"))]),
                        (2, vec![(T, RecordId(0), None, None)]),
                        (5, vec![(T, RecordId(1), Some(b"k"), Some(b"k-new"))]),
                    ],
                ),
                batch_of(
                    1,
                    6,
                    &[
                        (3, vec![(T, RecordId(2), Some(b"j"), Some(b"j-old"))]),
                        (4, vec![(T, RecordId(2), None, None)]),
                        (6, vec![(T, RecordId(3), Some(b"j"), Some(b"j-new"))]),
                    ],
                ),
            ],
            Ts(6),
        );
        let r = db.read();
        assert_eq!(r.get(T, b"k").unwrap().as_deref(), Some(&b"k-new"[..]), "{mode:?}");
        assert_eq!(r.get(T, b"j").unwrap().as_deref(), Some(&b"j-new"[..]), "{mode:?}");
        assert_eq!(db.count(T).unwrap(), 2, "{mode:?}");
    }
}

/// Three streams whose new lives wait at 100, 60 and 80: the serial replayer, waiting at
/// 100 in stream 0's batch, helps stream 1's, which waits at 60 and helps stream 2's,
/// which needs 60 and is put off; once stream 1's is done, stream 2's must be taken up
/// again while stream 0's still waits.
#[test]
fn a_put_off_batch_is_taken_up_again_once_what_it_needs_is_free() {
    let lives = |stream: u32, k: &'static [u8], base: u64, new_at: u64| {
        let r = u64::from(stream) * 2;
        batch_of(
            stream,
            100,
            &[
                (base, vec![(T, RecordId(r), Some(k), Some(&b"old"[..]))]),
                (base + 1, vec![(T, RecordId(r), None, None)]),
                (new_at, vec![(T, RecordId(r + 1), Some(k), Some(&b"new"[..]))]),
            ],
        )
    };
    for mode in modes() {
        let batches = vec![lives(0, b"k0", 1, 100), lives(1, b"k1", 3, 60), lives(2, b"k2", 5, 80)];
        let db = replay_streams(mode, 3, batches, Ts(100));
        let r = db.read();
        for k in [&b"k0"[..], b"k1", b"k2"] {
            assert_eq!(r.get(T, k).unwrap().as_deref(), Some(&b"new"[..]), "{mode:?}");
        }
    }
}

/// A batch that cannot be replayed (a write to a table this node does not have) stops
/// replay with the reason, in every mode: also when the serial replayer meets it while
/// helping, its own batch waiting for a new life (the wait gives up, nothing goes on).
#[test]
fn a_batch_that_cannot_be_replayed_stops_replay_even_one_replayed_while_waiting() {
    for mode in modes() {
        let db = Database::new(Options { workers: 2 });
        assert_eq!(db.create_table("t").unwrap(), TableId(0));
        let batches = vec![
            batch_of(
                0,
                4,
                &[
                    (1, vec![(T, RecordId(0), Some(b"k"), Some(b"old"))]),
                    (2, vec![(T, RecordId(0), None, None)]),
                    (4, vec![(T, RecordId(1), Some(b"k"), Some(b"new"))]),
                ],
            ),
            batch_of(1, 4, &[(3, vec![(TableId(5), RecordId(0), Some(b"x"), Some(b"y"))])]),
        ];
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(replay_recorded(db, 2, Ts::ZERO, mode, None, &batches));
        });
        let got = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{mode:?}: replay hung"));
        let why = got.expect_err("a write to an unknown table cannot be replayed");
        assert!(why.contains("no such table"), "{mode:?}: {why}");
    }
}
