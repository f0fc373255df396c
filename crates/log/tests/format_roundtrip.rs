//! Round-trip and robustness tests for the redo-log codec (`ditto_log::format`).
//!
//! The robustness tests build a real 3-batch segment and then damage it every way a disk
//! or a crash can (truncation at every length, every byte flipped, zero-filled tails,
//! garbage), checking that `read_segment` classifies each case exactly (Clean / Torn /
//! Corrupt at the right offset, earlier batches intact) and never panics.

use bytes::Bytes;
use ditto_engine::{RecordId, TableId, Ts};
use ditto_log::format::*;
use proptest::prelude::*;

const STREAM: StreamId = StreamId(7);
const EPOCH: Epoch = Epoch(3);

/// A write as the test generates it (owned), to compare against what decodes.
#[derive(Clone, Debug)]
struct W {
    table: u32,
    rid: u64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
}

#[derive(Clone, Debug)]
struct T {
    ts: u64,
    writes: Vec<W>,
}

fn push_all(b: &mut BatchBuilder, txns: &[T]) {
    for t in txns {
        b.push_txn(
            Ts(t.ts),
            t.writes.iter().map(|w| (TableId(w.table), RecordId(w.rid), w.key.as_deref(), w.value.as_deref())),
        );
    }
}

/// Checks a decoded batch against what was encoded, through every way of reading it: the
/// borrowed views (`payload_in`), flat above each cut (`writes_above`) and the owned
/// records.
fn assert_same_txns(batch: &Batch, expected: &[T]) {
    let mut scratch = Vec::new();
    let p = batch.payload_in(&mut scratch);
    assert_eq!(p.txns().len(), expected.len(), "txn count");
    for (d, e) in p.txns().zip(expected) {
        assert_eq!(d.ts, Ts(e.ts));
        assert_eq!(d.writes().len(), e.writes.len(), "write count of txn {}", e.ts);
        for (dw, ew) in d.writes().zip(&e.writes) {
            assert_eq!(dw.table, TableId(ew.table));
            assert_eq!(dw.rid, RecordId(ew.rid));
            assert_eq!(dw.key, ew.key.as_deref());
            assert_eq!(dw.value, ew.value.as_deref());
        }
    }
    // And flat (`writes_above`), above every cut a replayer may resume from.
    for skip in std::iter::once(0).chain(expected.iter().map(|t| t.ts)) {
        let above: Vec<&T> = expected.iter().filter(|t| t.ts > skip).collect();
        let want: Vec<(u64, &W)> = above.iter().flat_map(|t| t.writes.iter().map(move |w| (t.ts, w))).collect();
        let mut flat = p.writes_above(Ts(skip));
        let got: Vec<_> = flat.by_ref().collect();
        assert_eq!(got.len(), want.len(), "writes above {skip}");
        for ((ts, dw), (ets, ew)) in got.iter().zip(&want) {
            assert_eq!(*ts, Ts(*ets));
            assert_eq!(dw.table, TableId(ew.table));
            assert_eq!(dw.rid, RecordId(ew.rid));
            assert_eq!(dw.key, ew.key.as_deref());
            assert_eq!(dw.value, ew.value.as_deref());
        }
        assert_eq!(flat.txns, above.len() as u64, "transactions above {skip}, empty ones too");
    }
    let decoded = batch.records();
    assert_eq!(decoded.len(), expected.len(), "txn count");
    for (d, e) in decoded.iter().zip(expected) {
        assert_eq!(d.ts, Ts(e.ts));
        assert_eq!(d.writes.len(), e.writes.len(), "write count of txn {}", e.ts);
        for (dw, ew) in d.writes.iter().zip(&e.writes) {
            assert_eq!(dw.table, TableId(ew.table));
            assert_eq!(dw.rid, RecordId(ew.rid));
            assert_eq!(dw.key.as_deref(), ew.key.as_deref());
            assert_eq!(dw.value.as_deref(), ew.value.as_deref());
        }
    }
}

/// Encodes one batch of `txns` on its own.
fn encode_batch(txns: &[T], bound: u64, compress: bool) -> (Vec<u8>, BatchHeader) {
    let mut b = BatchBuilder::new();
    push_all(&mut b, txns);
    let mut out = Vec::new();
    let h = b.finish_into(STREAM, EPOCH, Ts(bound), compress, &mut out);
    (out, h)
}

/// A segment file holding one batch per element of `batches`; returns the file and the
/// offset of each batch. Reuses one builder, as the log writer does. Each batch claims
/// the one before it synced (`synced_ts`), as a writer that fsyncs every batch before it
/// frames the next: damage before a later batch is then damage to synced bytes.
fn build_segment(batches: &[Vec<T>], compress: &[bool]) -> (Vec<u8>, Vec<u64>) {
    build_segment_synced(batches, compress, |_, previous| previous)
}

/// `build_segment` with each batch's `synced_ts` given by `synced(i, bound of batch i-1)`.
fn build_segment_synced(
    batches: &[Vec<T>],
    compress: &[bool],
    synced: impl Fn(usize, Ts) -> Ts,
) -> (Vec<u8>, Vec<u64>) {
    let mut file =
        SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 11, streams: 8, prev_ts: Ts(0) }.encode().to_vec();
    let mut offsets = Vec::new();
    let mut b = BatchBuilder::new();
    let mut previous = Ts(0);
    for (i, txns) in batches.iter().enumerate() {
        b.clear();
        push_all(&mut b, txns);
        offsets.push(file.len() as u64);
        let bound = Ts(txns.last().map_or(previous.0, |t| t.ts));
        let marks = Marks { bound_ts: bound, synced_ts: synced(i, previous).min(bound), ..Marks::default() };
        let h = b.finish_marked_into(STREAM, EPOCH, marks, compress[i % compress.len()], &mut file);
        assert_eq!(file.len() as u64, offsets[i] + h.total_len() as u64);
        previous = bound;
    }
    (file, offsets)
}

/// Deterministic data for the damage tests: `n` txns starting at `ts0`, mixing puts,
/// deletes, writes with and without keys, empty values, rids of one and two varint bytes,
/// and some repetition so compression kicks in.
fn sample_txns(ts0: u64, n: usize) -> Vec<T> {
    (0..n)
        .map(|i| T {
            ts: ts0 + 3 * i as u64,
            writes: (0..(i % 4))
                .map(|j| W {
                    table: j as u32,
                    rid: (i * 100 + j) as u64,
                    key: ((i + j) % 2 == 1).then(|| format!("key-{i}-{j}").into_bytes()),
                    value: match (i + j) % 3 {
                        0 => None,
                        1 => Some(Vec::new()),
                        _ => Some(vec![b'a' + (i % 26) as u8; 20 + i]),
                    },
                })
                .collect(),
        })
        .collect()
}

fn three_batches() -> Vec<Vec<T>> {
    vec![sample_txns(10, 6), sample_txns(100, 5), sample_txns(200, 7)]
}

/// Checks that the first `n` batches of a scan are exactly the first `n` written.
fn assert_prefix(scan: &SegmentScan, batches: &[Vec<T>], offsets: &[u64], n: usize) {
    assert_eq!(scan.batches.len(), n, "intact batch count");
    for (i, (off, b)) in scan.batches.iter().enumerate() {
        assert_eq!(*off, offsets[i]);
        assert_same_txns(b, &batches[i]);
    }
}

// ---------------------------------------------------------------------------------------
// 1. Property: round trip of batches and segments
// ---------------------------------------------------------------------------------------

/// An integer that is often at a varint width boundary (2^(7k) - 1 or 2^(7k)) or small,
/// else anything.
fn arb_varint_edge(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        (0u32..10, any::<bool>()).prop_map(move |(k, over)| {
            let edge = 1u64.checked_shl(7 * k).unwrap_or(0).wrapping_sub(1);
            edge.saturating_add(over as u64).min(max)
        }),
        0..300u64.min(max),
        0..=max,
    ]
}

/// A table id: often one of a few (so rids get deltas from a previous write of the same
/// table), often at the packing boundary, else any valid one.
fn arb_table() -> impl Strategy<Value = u32> {
    let max = MAX_TABLES as u32 - 1;
    prop_oneof![0u32..4, PACKED_TABLE_LIMIT - 2..PACKED_TABLE_LIMIT + 2, max - 1..=max, 0..=max]
}

/// A record id: often small or near a previous one, at a varint width boundary, or at
/// the top of the range (large negative and positive deltas), else any valid one.
fn arb_rid() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..8, arb_varint_edge(RID_LIMIT - 1), RID_LIMIT - 3..RID_LIMIT, 0..RID_LIMIT]
}

fn arb_write() -> impl Strategy<Value = W> {
    (
        arb_table(),
        arb_rid(),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..200)),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
    )
        .prop_map(|(table, rid, key, value)| W { table, rid, key, value })
}

/// 1..20 txns with strictly increasing ts (starting anywhere, gaps of 1..1000 or huge).
fn arb_txns() -> impl Strategy<Value = Vec<T>> {
    let gap = prop_oneof![4 => 1u64..1000, 1 => arb_varint_edge(1 << 40).prop_map(|g| g.max(1))];
    (arb_varint_edge(1 << 62), prop::collection::vec((gap, prop::collection::vec(arb_write(), 0..10)), 1..20)).prop_map(
        |(base, raw)| {
            let mut ts = base;
            raw.into_iter()
                .map(|(gap, writes)| {
                    ts += gap;
                    T { ts, writes }
                })
                .collect()
        },
    )
}

/// What `write_encoded_len` promises: a transaction takes at most `TXN_HEADER_MAX_LEN`
/// plus the bound of each write.
fn encoded_len_bound(txns: &[T]) -> usize {
    txns.iter()
        .map(|t| {
            TXN_HEADER_MAX_LEN
                + t.writes
                    .iter()
                    .map(|w| write_encoded_len(w.key.as_ref().map(Vec::len), w.value.as_ref().map(Vec::len)))
                    .sum::<usize>()
        })
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn batch_round_trip(txns in arb_txns(), bound in any::<u64>(), compress in any::<bool>()) {
        let (bytes, h) = encode_batch(&txns, bound, compress);
        prop_assert_eq!(bytes.len(), BATCH_HEADER_LEN + h.stored_len as usize);
        prop_assert_eq!(h.stream, STREAM);
        prop_assert_eq!(h.epoch, EPOCH);
        prop_assert_eq!(h.txn_count as usize, txns.len());
        prop_assert_eq!(h.first_ts, Ts(txns[0].ts));
        prop_assert_eq!(h.last_ts, Ts(txns[txns.len() - 1].ts));
        prop_assert_eq!(h.bound_ts, Ts(bound));
        if !compress {
            prop_assert!(!h.compressed);
        }
        if h.compressed {
            prop_assert!(h.stored_len < h.raw_len);
        } else {
            prop_assert_eq!(h.stored_len, h.raw_len);
        }
        prop_assert!(h.raw_len as usize <= encoded_len_bound(&txns), "write_encoded_len is an upper bound");
        // Trailing bytes after the batch are not part of it.
        let mut with_tail = bytes.clone();
        with_tail.extend_from_slice(b"trailing");
        for buf in [bytes, with_tail] {
            let (batch, used) = decode_batch(&Bytes::from(buf)).expect("decodes");
            prop_assert_eq!(used, h.total_len());
            prop_assert_eq!(batch.header, h);
            assert_same_txns(&batch, &txns);
        }
    }

    #[test]
    fn segment_round_trip(
        batches in prop::collection::vec(arb_txns(), 1..5),
        compress in prop::collection::vec(any::<bool>(), 1..5),
    ) {
        // Make ts increase across batches too, as a real stream would.
        let mut batches = batches;
        let mut floor = 0;
        for b in &mut batches {
            let shift = floor + 1 - b[0].ts.min(floor + 1);
            for t in b.iter_mut() {
                t.ts += shift;
            }
            floor = b[b.len() - 1].ts;
        }
        let (file, offsets) = build_segment(&batches, &compress);
        let scan = read_segment(&Bytes::from(file.clone())).expect("header ok");
        prop_assert_eq!(&scan.end, &SegmentEnd::Clean);
        prop_assert_eq!(scan.header, SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 11, streams: 8, prev_ts: Ts(0) });
        prop_assert_eq!(scan.valid_len(), file.len() as u64);
        assert_prefix(&scan, &batches, &offsets, batches.len());
        for (i, (_, b)) in scan.batches.iter().enumerate() {
            prop_assert!(compress[i % compress.len()] || !b.header.compressed);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 2. Heartbeats, builder reuse, compression
// ---------------------------------------------------------------------------------------

#[test]
fn heartbeat_round_trip() {
    for compress in [false, true] {
        let b = BatchBuilder::new();
        assert!(b.is_empty());
        assert_eq!((b.first_ts(), b.last_ts(), b.payload_len()), (None, None, 0));
        let mut out = b"prefix".to_vec();
        let h = b.finish_into(STREAM, EPOCH, Ts(42), compress, &mut out);
        assert_eq!(out.len(), 6 + BATCH_HEADER_LEN);
        assert_eq!((h.txn_count, h.raw_len, h.stored_len, h.compressed), (0, 0, 0, false));
        assert_eq!((h.first_ts, h.last_ts, h.bound_ts), (Ts(0), Ts(0), Ts(42)));
        let (batch, used) = decode_batch(&Bytes::from(out).slice(6..)).unwrap();
        assert_eq!(used, BATCH_HEADER_LEN);
        assert_eq!(batch.header, h);
        assert!(batch.records().is_empty());
        assert_eq!(batch.payload_in(&mut Vec::new()).txns().count(), 0);
    }
    // A segment of heartbeats only.
    let (file, offsets) = build_segment(&[vec![], vec![], vec![]], &[true]);
    let scan = read_segment(&Bytes::from(file)).unwrap();
    assert_eq!(scan.end, SegmentEnd::Clean);
    assert_eq!(offsets, vec![48, 136, 224]);
    assert_eq!(scan.batches.len(), 3);
}

#[test]
fn builder_is_reusable_and_tracks_ts() {
    let mut b = BatchBuilder::new();
    let txns = sample_txns(5, 4);
    push_all(&mut b, &txns);
    assert_eq!(b.txn_count(), 4);
    assert_eq!(b.first_ts(), Some(Ts(5)));
    assert_eq!(b.last_ts(), Some(Ts(14)));
    let raw_len = b.payload_len();
    assert_eq!(b.payload().len(), raw_len);
    let mut out = Vec::new();
    let h1 = b.finish_into(STREAM, EPOCH, Ts(14), false, &mut out);
    // finish_into does not clear: framing twice gives identical batches.
    let h2 = b.finish_into(STREAM, EPOCH, Ts(14), false, &mut out);
    assert_eq!(h1, h2);
    assert_eq!(out[..h1.total_len()], out[h1.total_len()..]);
    b.clear();
    assert!(b.is_empty());
    assert_eq!((b.first_ts(), b.last_ts(), b.payload_len()), (None, None, 0));
    // After clear, a ts below the previous batch's is fine.
    let again = sample_txns(1, 2);
    push_all(&mut b, &again);
    let mut out = Vec::new();
    b.finish_into(STREAM, EPOCH, Ts(0), true, &mut out);
    assert_same_txns(&decode_batch(&Bytes::from(out)).unwrap().0, &again);
}

#[test]
#[should_panic(expected = "not above previous")]
fn push_txn_rejects_non_increasing_ts() {
    let mut b = BatchBuilder::new();
    b.push_txn(Ts(5), std::iter::empty());
    b.push_txn(Ts(5), std::iter::empty());
}

/// An iterator whose `len()` claims `N` items, whatever it yields: the builder must encode
/// what it yields.
struct LyingLen<I, const N: usize>(I);
impl<I: Iterator, const N: usize> Iterator for LyingLen<I, N> {
    type Item = I::Item;
    fn next(&mut self) -> Option<I::Item> {
        self.0.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (N, Some(N))
    }
}
impl<I: Iterator, const N: usize> ExactSizeIterator for LyingLen<I, N> {}

#[test]
fn write_count_is_what_was_written() {
    let w = [(TableId(1), RecordId(1), Some(&b"a"[..]), Some(&b"x"[..])), (TableId(1), RecordId(2), None, None)];
    let mut b = BatchBuilder::new();
    b.push_txn(Ts(1), LyingLen::<_, 5>(w.into_iter()));
    // Also a claimed length whose varint is longer than the true count's (200 vs 2 writes).
    b.push_txn(Ts(2), LyingLen::<_, 200>(w.into_iter()));
    let mut out = Vec::new();
    b.finish_into(STREAM, EPOCH, Ts(2), false, &mut out);
    let (batch, _) = decode_batch(&Bytes::from(out)).unwrap();
    let txns = batch.records();
    for t in &txns {
        assert_eq!(t.writes.len(), 2);
        assert_eq!(t.writes[0].key.as_deref(), Some(&b"a"[..]));
        assert_eq!(t.writes[1].key, None);
        assert_eq!(t.writes[1].value, None);
    }
}

#[test]
fn compression_shrinks_repetitive_payload() {
    let txns: Vec<T> = (0..100)
        .map(|i| T {
            ts: 1000 + i,
            writes: vec![W {
                table: 1,
                rid: i,
                key: Some(format!("customer:{:08}", i % 10).into_bytes()),
                value: Some(b"the same value again and again ".repeat(8)),
            }],
        })
        .collect();
    let (bytes, h) = encode_batch(&txns, 1099, true);
    assert!(h.compressed);
    assert!(h.stored_len < h.raw_len / 2, "stored {} raw {}", h.stored_len, h.raw_len);
    let (batch, _) = decode_batch(&Bytes::from(bytes)).unwrap();
    assert_same_txns(&batch, &txns);
    // Same txns without compression: same raw payload, stored raw.
    let (_, plain) = encode_batch(&txns, 1099, false);
    assert!(!plain.compressed);
    assert_eq!((plain.raw_len, plain.stored_len), (h.raw_len, h.raw_len));
}

#[test]
fn incompressible_payload_is_stored_raw() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise: Vec<u8> = (0..4040)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let txns = vec![T {
        ts: 1,
        writes: vec![W {
            table: 0,
            rid: 0,
            // Disjoint from the value, or LZ4 would find the repeat.
            key: Some(noise[4000..].to_vec()),
            value: Some(noise[..4000].to_vec()),
        }],
    }];
    let (bytes, h) = encode_batch(&txns, 1, true);
    assert!(!h.compressed);
    assert_eq!(h.stored_len, h.raw_len);
    assert_same_txns(&decode_batch(&Bytes::from(bytes)).unwrap().0, &txns);
}

// ---------------------------------------------------------------------------------------
// 3-5. Damage: truncation, flipped bytes, zero-filled tails
// ---------------------------------------------------------------------------------------

#[test]
fn truncation_at_every_length() {
    let batches = three_batches();
    for compress in [[false], [true]] {
        let (file, offsets) = build_segment(&batches, &compress);
        let mut ends = offsets.clone();
        ends.push(file.len() as u64);
        for len in 0..=file.len() {
            let cut = Bytes::from(file[..len].to_vec());
            if len < SEGMENT_HEADER_LEN {
                assert!(matches!(read_segment(&cut), Err(FormatError::Truncated { .. })), "len {len}");
                continue;
            }
            let scan = read_segment(&cut).unwrap();
            let len = len as u64;
            if len == SEGMENT_HEADER_LEN as u64 || ends.contains(&len) {
                assert_eq!(scan.end, SegmentEnd::Clean, "len {len}");
                let n = ends.iter().position(|&e| e == len).unwrap_or(0);
                assert_prefix(&scan, &batches, &offsets, n);
                assert_eq!(scan.valid_len(), len);
            } else {
                // The cut batch is the last one starting before `len`.
                let i = offsets.iter().rposition(|&o| o < len).unwrap();
                match &scan.end {
                    SegmentEnd::Torn { offset, reason, whole_after } => {
                        assert_eq!(*offset, offsets[i], "len {len}");
                        assert_eq!(*whole_after, 0, "len {len}");
                        assert!(matches!(reason, FormatError::Truncated { .. }), "len {len}: {reason:?}");
                    }
                    other => panic!("len {len}: expected Torn, got {other:?}"),
                }
                assert_prefix(&scan, &batches, &offsets, i);
                assert_eq!(scan.valid_len(), offsets[i]);
            }
        }
    }
}

#[test]
fn flipped_bytes() {
    let batches = three_batches();
    for compress in [[false], [true]] {
        let (file, offsets) = build_segment(&batches, &compress);
        let check = |pos: usize| {
            let mut damaged = file.clone();
            damaged[pos] ^= 0xFF;
            read_segment(&Bytes::from(damaged))
        };
        // Segment header: the whole file is unreadable.
        for pos in 0..SEGMENT_HEADER_LEN {
            assert!(check(pos).is_err(), "header byte {pos}");
        }
        // Middle batch: valid data follows, so it is corruption.
        for pos in offsets[1] as usize..offsets[2] as usize {
            let scan = check(pos).unwrap();
            assert!(
                matches!(scan.end, SegmentEnd::Corrupt { offset, .. } if offset == offsets[1]),
                "byte {pos}: {:?}",
                scan.end
            );
            assert_prefix(&scan, &batches, &offsets, 1);
        }
        // Last batch: nothing valid follows, so it looks like a torn write.
        for pos in offsets[2] as usize..file.len() {
            let scan = check(pos).unwrap();
            assert!(
                matches!(scan.end, SegmentEnd::Torn { offset, .. } if offset == offsets[2]),
                "byte {pos}: {:?}",
                scan.end
            );
            assert_prefix(&scan, &batches, &offsets, 2);
        }
        // First batch: two valid batches follow.
        for pos in offsets[0] as usize..offsets[1] as usize {
            let scan = check(pos).unwrap();
            assert!(
                matches!(scan.end, SegmentEnd::Corrupt { offset, .. } if offset == offsets[0]),
                "byte {pos}: {:?}",
                scan.end
            );
            assert!(scan.batches.is_empty());
        }
    }
}

#[test]
fn zero_filled_tails() {
    let batches = three_batches();
    let (file, offsets) = build_segment(&batches, &[false, true]);

    // Zeroed ahead by the writer: zeros after the last complete batch.
    let mut padded = file.clone();
    padded.resize(file.len() + 4096, 0);
    let scan = read_segment(&Bytes::from(padded.clone())).unwrap();
    assert_eq!(scan.end, SegmentEnd::Zeros { offset: file.len() as u64 });
    assert_prefix(&scan, &batches, &offsets, 3);
    assert_eq!(scan.valid_len(), file.len() as u64);
    // Zeros after the header only: a fresh segment.
    let mut fresh = file[..SEGMENT_HEADER_LEN].to_vec();
    fresh.resize(SEGMENT_HEADER_LEN + 4096, 0);
    let scan = read_segment(&Bytes::from(fresh)).unwrap();
    assert_eq!(scan.end, SegmentEnd::Zeros { offset: SEGMENT_HEADER_LEN as u64 });
    assert!(scan.batches.is_empty());
    // One non-zero byte anywhere in the zeros: not zeros, but damage after the last batch.
    for pos in [file.len(), file.len() + 1000, padded.len() - 1] {
        let mut b = padded.clone();
        b[pos] = 1;
        let scan = read_segment(&Bytes::from(b)).unwrap();
        assert!(
            matches!(scan.end, SegmentEnd::Torn { offset, .. } if offset == file.len() as u64),
            "{pos}: {:?}",
            scan.end
        );
    }

    // Last batch partially written: its second half (and beyond) reads as zeros.
    let last = offsets[2] as usize;
    for keep in [last + 8, last + 40, last + 70, (last + file.len()) / 2] {
        let mut torn = file[..keep].to_vec();
        torn.resize(file.len() + 512, 0);
        let scan = read_segment(&Bytes::from(torn)).unwrap();
        assert!(
            matches!(scan.end, SegmentEnd::Torn { offset, .. } if offset == offsets[2]),
            "keep {keep}: {:?}",
            scan.end
        );
        assert_prefix(&scan, &batches, &offsets, 2);
    }

    // A segment that is only a header (fresh file) is clean and empty.
    let scan = read_segment(&Bytes::from(file[..SEGMENT_HEADER_LEN].to_vec())).unwrap();
    assert_eq!(scan.end, SegmentEnd::Clean);
    assert!(scan.batches.is_empty());
}

// ---------------------------------------------------------------------------------------
// Checksum-valid but wrong batches: decoded errors, and always Corrupt (never Torn)
// ---------------------------------------------------------------------------------------

/// A batch with the given header fields and payload and correct checksums.
fn forge(mut h: BatchHeader, payload: &[u8]) -> Vec<u8> {
    h.stored_len = payload.len() as u32;
    h.payload_crc = h.payload_checksum(payload);
    let mut v = h.encode().to_vec();
    v.extend_from_slice(payload);
    v
}

fn header(txn_count: u32, first: u64, last: u64, raw_len: u32) -> BatchHeader {
    BatchHeader {
        version: LOG_FORMAT_VERSION as u16,
        stream: STREAM,
        epoch: EPOCH,
        compressed: false,
        first_ts: Ts(first),
        last_ts: Ts(last),
        bound_ts: Ts(last),
        floor_ts: Ts(0),
        reuse_ts: Ts(0),
        synced_ts: Ts(0),
        txn_count,
        raw_len,
        stored_len: 0,
        payload_crc: 0,
    }
}

/// LEB128 in its shortest form, as the format writes it.
fn varint(mut x: u64) -> Vec<u8> {
    let mut v = Vec::new();
    while x >= 0x80 {
        v.push(x as u8 | 0x80);
        x >>= 7;
    }
    v.push(x as u8);
    v
}

/// (flags, key, value) of a hand-encoded write.
type RawWrite<'a> = (u8, Option<&'a [u8]>, Option<&'a [u8]>);

/// Zigzag, as the format codes rid deltas: 0, -1, 1, -2 ... -> 0, 1, 2, 3 ...
fn zz(delta: i64) -> u64 {
    ((delta << 1) ^ (delta >> 63)) as u64
}

/// Bits 2-7 of a write's flags byte for a packed table.
fn packed(table: u32) -> u8 {
    assert!(table < PACKED_TABLE_LIMIT);
    ((table + 1) as u8) << 2
}

/// Hand-encodes one txn (table 1, rid delta 0, i.e. rid 0, for every write), bypassing
/// the builder's checks: ts delta, write count, then per write the flags byte as given
/// with table 1 packed into it, the rid delta, a key length if there is a key, a value
/// length if there is a value, the key, the value.
fn txn_bytes(delta: u64, writes: &[RawWrite]) -> Vec<u8> {
    let mut v = varint(delta);
    v.extend(varint(writes.len() as u64));
    for (flags, key, value) in writes {
        v.push(*flags | packed(1));
        v.extend(varint(0));
        if let Some(k) = key {
            v.extend(varint(k.len() as u64));
        }
        if let Some(val) = value {
            v.extend(varint(val.len() as u64));
        }
        v.extend_from_slice(key.unwrap_or_default());
        v.extend_from_slice(value.unwrap_or_default());
    }
    v
}

fn decode_err(bytes: Vec<u8>) -> FormatError {
    decode_batch(&Bytes::from(bytes)).expect_err("must not decode")
}

/// Decodes a one-batch payload with the given ts range and txn count, as uncompressed.
fn decode_payload(txn_count: u32, first: u64, last: u64, payload: &[u8]) -> Result<Batch, FormatError> {
    decode_batch(&Bytes::from(forge(header(txn_count, first, last, payload.len() as u32), payload))).map(|(b, _)| b)
}

#[test]
fn forged_batches_are_rejected() {
    let t1 = txn_bytes(0, &[(2, Some(b"k"), Some(b"v")), (3, Some(b"gone"), None), (0, None, Some(b"w"))]);
    let t2 = txn_bytes(4, &[(1, None, None)]);
    let both = [t1.clone(), t2.clone()].concat();
    let n = both.len() as u32;

    // The forge itself is sound: a correct batch decodes.
    let (ok, _) = decode_batch(&Bytes::from(forge(header(2, 5, 9, n), &both))).unwrap();
    let txns = ok.records();
    assert_eq!(txns.len(), 2);
    assert_eq!((txns[0].ts, txns[1].ts), (Ts(5), Ts(9)));
    let w = &txns[0].writes;
    assert_eq!((w[0].key.as_deref(), w[0].value.as_deref()), (Some(&b"k"[..]), Some(&b"v"[..])));
    assert_eq!((w[1].key.as_deref(), w[1].value.as_deref()), (Some(&b"gone"[..]), None));
    assert_eq!((w[2].key.as_deref(), w[2].value.as_deref()), (None, Some(&b"w"[..])));
    assert_eq!((txns[1].writes[0].key.as_deref(), txns[1].writes[0].value.as_deref()), (None, None));

    let malformed = |e: FormatError| matches!(e, FormatError::Malformed(_));
    // Non-increasing ts (a later txn with delta 0).
    let dup = [t1.clone(), t1.clone()].concat();
    assert!(malformed(decode_err(forge(header(2, 5, 5, dup.len() as u32), &dup))));
    let rev = [t2.clone(), t1.clone()].concat();
    assert!(malformed(decode_err(forge(header(2, 9, 5, n), &rev))));
    // The first txn's delta must be 0 (its ts is first_ts).
    assert!(malformed(decode_err(forge(header(2, 9, 9, n), &rev))));
    let late_first = txn_bytes(1, &[]);
    assert!(malformed(decode_payload(1, 5, 6, &late_first).unwrap_err()));
    // first_ts / last_ts not matching the txns.
    assert!(malformed(decode_err(forge(header(2, 4, 9, n), &both))));
    assert!(malformed(decode_err(forge(header(2, 5, 10, n), &both))));
    // Trailing bytes, and too few bytes for txn_count.
    let mut trailing = both.clone();
    trailing.push(0);
    assert!(malformed(decode_err(forge(header(2, 5, 9, n + 1), &trailing))));
    assert!(malformed(decode_err(forge(header(3, 5, 9, n), &both))));
    // txn_count impossible for raw_len (each txn takes at least 2 bytes).
    assert!(malformed(decode_err(forge(header(n / 2 + 1, 5, 9, n), &both))));
    // Table ids: the long form for a table that fits the flags byte (non-canonical), and
    // ids beyond TABLES_MAX, in either form's reach.
    for (table, what) in [
        (0, "table id in long form fits the flags byte"),
        (PACKED_TABLE_LIMIT as u64 - 1, "table id in long form fits the flags byte"),
        (MAX_TABLES as u64, "table id beyond TABLES_MAX"),
        (u32::MAX as u64 + 1, "table id beyond TABLES_MAX"),
        (u64::MAX, "table id beyond TABLES_MAX"),
    ] {
        let bad = [varint(0), varint(1), vec![0x00], varint(table), varint(0), varint(1), b"v".to_vec()].concat();
        let e = decode_payload(1, 5, 5, &bad).unwrap_err();
        assert_eq!(e, FormatError::Malformed(what), "table {table}");
    }
    // write_count larger than the payload could hold.
    let mut many = varint(0);
    many.extend(varint(1000));
    many.extend(txn_bytes(0, &[(1, None, None)])[2..].iter());
    assert!(malformed(decode_payload(1, 5, 5, &many).unwrap_err()));
    // raw_len != stored_len for an uncompressed batch.
    assert!(malformed(decode_err(forge(header(2, 5, 9, n + 3), &both))));
    // Empty batch with ts set.
    assert!(malformed(decode_err(forge(header(0, 5, 5, 0), &[]))));
    // Oversize key and value lengths, refused before anything is read for them.
    let oversize = |flags: u8, len: usize| {
        let mut v = [varint(0), varint(1), vec![flags | packed(1)], varint(zz(2)), varint(len as u64)].concat();
        v.extend_from_slice(&[0; 16]);
        decode_payload(1, 5, 5, &v).unwrap_err()
    };
    let e = oversize(3, MAX_KEY_LEN + 1);
    assert!(matches!(e, FormatError::TooLarge { what: "key_len", len, .. } if len == MAX_KEY_LEN as u64 + 1), "{e:?}");
    let e = oversize(0, MAX_VALUE_LEN + 1);
    assert!(matches!(e, FormatError::TooLarge { what: "value_len", .. }), "{e:?}");
    let e = oversize(3, usize::MAX);
    assert!(matches!(e, FormatError::TooLarge { what: "key_len", .. }), "{e:?}");
    // Lengths within the limits but beyond the payload's end.
    assert!(malformed(oversize(3, 17)));
    assert!(malformed(oversize(0, 17)));
    let put_with_key =
        [varint(0), varint(1), vec![2 | packed(1)], varint(zz(2)), varint(10), varint(10), vec![0; 19]].concat();
    assert!(malformed(decode_payload(1, 5, 5, &put_with_key).unwrap_err()), "key and value together too long");
    // Oversize raw_len in the header, refused before allocating.
    let mut h = header(1, 5, 5, MAX_RAW_LEN as u32 + 1);
    h.compressed = true;
    let e = decode_err(forge(h, &[0; 16]));
    assert!(matches!(e, FormatError::TooLarge { what: "raw_len", .. }), "{e:?}");
    // raw_len impossible for LZ4 to reach from stored_len.
    let mut h = header(1, 5, 5, 1 << 20);
    h.compressed = true;
    assert!(malformed(decode_err(forge(h, &[0; 16]))));
    // Compressed flag with a payload that is not LZ4.
    let mut h = header(1, 5, 5, 100);
    h.compressed = true;
    let e = decode_err(forge(h, &[0xFF; 16]));
    assert!(matches!(e, FormatError::Decompress(_) | FormatError::Malformed(_)), "{e:?}");
    // Unknown flag bits and reserved byte (header checksum recomputed over them).
    let mut v = forge(header(2, 5, 9, n), &both);
    v[6] |= 0x80;
    let crc = crc32c::crc32c(&v[..60]);
    v[60..64].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(decode_err(v.clone()), FormatError::BadFlags(0x80));
    v[6] &= 0x7F;
    v[7] = 1;
    let crc = crc32c::crc32c(&v[..60]);
    v[60..64].copy_from_slice(&crc.to_le_bytes());
    assert!(malformed(decode_err(v.clone())));
    // Other versions: the previous one (fixed-width payload) and a future one.
    v[7] = 0;
    for version in [1u16, LOG_FORMAT_VERSION as u16 + 1] {
        v[4..6].copy_from_slice(&version.to_le_bytes());
        let crc = crc32c::crc32c(&v[..60]);
        v[60..64].copy_from_slice(&crc.to_le_bytes());
        let e = decode_err(v.clone());
        assert_eq!(e, FormatError::UnsupportedVersion(version.into()));
        assert!(e.to_string().contains(&format!("version {version}")), "{e}");
    }
}

/// The varints of one write (flags 3: a delete with a key; table 100, in the long form;
/// rid 2), as (name, bytes), so that any one can be replaced by a bad encoding.
fn write_fields() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("delta", varint(0)),
        ("count", varint(1)),
        ("flags", vec![3]),
        ("table", varint(100)),
        ("rid", varint(zz(2))),
        ("key_len", varint(1)),
        ("key", b"k".to_vec()),
    ]
}

fn with_field(name: &str, bytes: &[u8]) -> Vec<u8> {
    write_fields().into_iter().flat_map(|(n, b)| if n == name { bytes.to_vec() } else { b }).collect()
}

#[test]
fn forged_varints_are_rejected() {
    // The unmodified fields decode.
    let good = with_field("", &[]);
    let b = decode_payload(1, 5, 5, &good).unwrap();
    let w = &b.records()[0].writes[0];
    assert_eq!(
        (w.table, w.rid, w.key.as_deref(), w.value.as_deref()),
        (TableId(100), RecordId(2), Some(&b"k"[..]), None)
    );

    let malformed = |e: &FormatError, what: &str| matches!(e, FormatError::Malformed(m) if *m == what);
    for field in ["delta", "count", "table", "rid", "key_len"] {
        // Overlong: the same value in more bytes than needed (a final zero byte).
        for bad in
            [&[0x80, 0x00][..], &[0x81, 0x80, 0x00], &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x80, 0x00]]
        {
            let e = decode_payload(1, 5, 5, &with_field(field, bad)).unwrap_err();
            assert!(malformed(&e, "overlong varint"), "{field} {bad:x?}: {e:?}");
        }
        // Overflow: a tenth byte above 1, or an eleventh byte.
        let mut ten = vec![0xFF; 9];
        ten.push(0x02);
        let mut eleven = vec![0xFF; 10];
        eleven.push(0x01);
        for bad in [ten, eleven] {
            let e = decode_payload(1, 5, 5, &with_field(field, &bad)).unwrap_err();
            assert!(malformed(&e, "varint overflows 64 bits"), "{field} {bad:x?}: {e:?}");
        }
        // Truncated: the payload ends inside the varint (after a checksummed, complete
        // batch: a malformed payload, not a torn write).
        let cut = with_field(field, &[0x80, 0x80]);
        let end = write_fields().iter().position(|(n, _)| *n == field).unwrap();
        let prefix: usize = write_fields()[..end].iter().map(|(_, b)| b.len()).sum();
        let e = decode_payload(1, 5, 5, &cut[..prefix + 2]).unwrap_err();
        assert!(malformed(&e, "payload ends inside a record"), "{field}: {e:?}");
    }
    // The write count refuses values above u32::MAX, even in canonical form; the table
    // id anything from TABLES_MAX on.
    let e = decode_payload(1, 5, 5, &with_field("count", &varint(1 << 32))).unwrap_err();
    assert!(malformed(&e, "varint overflows 32 bits"), "{e:?}");
    let e = decode_payload(1, 5, 5, &with_field("table", &varint(1 << 32))).unwrap_err();
    assert!(malformed(&e, "table id beyond TABLES_MAX"), "{e:?}");
    // Rid deltas: the largest valid rid, then every way of leaving the valid range,
    // including the largest u64 (ten bytes, the last one 1) and deltas that wrap around.
    let top = RID_LIMIT - 1;
    let b = decode_payload(1, 5, 5, &with_field("rid", &varint(zz(top as i64)))).unwrap();
    assert_eq!(b.records()[0].writes[0].rid, RecordId(top));
    let mut max = vec![0xFF; 9];
    max.push(0x01);
    assert_eq!(max, varint(u64::MAX));
    for bad in [varint(zz(RID_LIMIT as i64)), varint(zz(-1)), varint(zz(i64::MIN)), varint(zz(i64::MAX)), max] {
        let e = decode_payload(1, 5, 5, &with_field("rid", &bad)).unwrap_err();
        assert!(malformed(&e, "record id beyond RECORDS_PER_TABLE_MAX"), "{bad:x?}: {e:?}");
    }
    // A ts delta that overflows u64.
    let t = [txn_bytes(0, &[]), txn_bytes(5, &[])].concat();
    let e = decode_payload(2, u64::MAX - 1, u64::MAX, &t).unwrap_err();
    assert!(malformed(&e, "txn ts overflows"), "{e:?}");
}

#[test]
fn varint_edges_round_trip() {
    assert_eq!([0, 127, 128, 16383, 16384, u32::MAX.into(), u64::MAX].map(varint_len), [1, 1, 2, 2, 3, 5, 10],);
    for x in [0, 1, 127, 128, 255, 16383, 16384, 1 << 35, u64::MAX - 1, u64::MAX] {
        assert_eq!(varint(x).len(), varint_len(x), "{x}");
    }
    let long_key = [7u8; 128];
    let long_value = vec![9u8; 16384];
    let mut writes = Vec::new();
    let top = RID_LIMIT - 1;
    for (table, rid) in [(0, 0), (127, 127), (128, 128), (255, 16383), (1, 16384), (2, top)] {
        for (key, value) in [
            (None, None),
            (Some(&long_key[..127]), Some(&long_value[..127])),
            (Some(&long_key[..]), Some(&long_value[..128])),
            (Some(&long_key[..0]), Some(&long_value[..])),
            (None, Some(&long_value[..0])),
        ] {
            writes.push(W { table, rid, key: key.map(<[u8]>::to_vec), value: value.map(<[u8]>::to_vec) });
        }
    }
    // ts deltas of 1, 127, 128 and the largest possible.
    let txns: Vec<T> = [0, 1, 128, 256, u64::MAX]
        .into_iter()
        .enumerate()
        .map(|(i, ts)| T { ts, writes: writes[i * 6..i * 6 + 6].to_vec() })
        .collect();
    for compress in [false, true] {
        let (bytes, h) = encode_batch(&txns, 0, compress);
        let (batch, _) = decode_batch(&Bytes::from(bytes)).unwrap();
        assert_same_txns(&batch, &txns);
        // The exact size: every varint in its shortest form, tables below 63 packed, rids
        // as zigzag deltas from the table's previous rid in the batch.
        let mut expect = 0;
        let mut prev = txns[0].ts;
        let mut rids = [0u64; 256];
        for t in &txns {
            expect += varint_len(t.ts - prev) + varint_len(t.writes.len() as u64);
            prev = t.ts;
            for w in &t.writes {
                let table_len = if w.table < PACKED_TABLE_LIMIT { 0 } else { varint_len(w.table.into()) };
                let delta = w.rid as i64 - rids[w.table as usize] as i64;
                rids[w.table as usize] = w.rid;
                expect += 1 + table_len + varint_len(zz(delta));
                expect += w.key.as_ref().map_or(0, |k| varint_len(k.len() as u64) + k.len());
                expect += w.value.as_ref().map_or(0, |v| varint_len(v.len() as u64) + v.len());
            }
        }
        assert_eq!(h.raw_len as usize, expect);
        assert!(expect <= encoded_len_bound(&txns));
    }
}

/// The uncompressed payload of one batch of `txns`.
fn raw_payload(txns: &[T]) -> Vec<u8> {
    let (bytes, h) = encode_batch(txns, 0, false);
    assert!(!h.compressed);
    let (batch, _) = decode_batch(&Bytes::from(bytes.clone())).unwrap();
    assert_same_txns(&batch, txns);
    bytes[BATCH_HEADER_LEN..].to_vec()
}

fn one_txn(writes: Vec<W>) -> Vec<T> {
    vec![T { ts: 1, writes }]
}

fn del(table: u32, rid: u64) -> W {
    W { table, rid, key: None, value: None }
}

#[test]
fn rid_deltas_are_per_table_per_batch() {
    let top = RID_LIMIT - 1;
    // (writes, the rid delta bytes expected for each write). Deletes without keys, all
    // in packed tables, so a write is its flags byte then its rid delta.
    let cases: Vec<(Vec<W>, Vec<Vec<u8>>)> = vec![
        // Rid 0 first: delta 0 from the batch's start.
        (vec![del(0, 0)], vec![varint(0)]),
        // The same rid twice: delta 0 the second time.
        (vec![del(3, 7), del(3, 7)], vec![varint(zz(7)), varint(0)]),
        // Going down: negative deltas, down to the largest.
        (vec![del(3, 7), del(3, 6), del(3, 0)], vec![varint(zz(7)), varint(zz(-1)), varint(zz(-6))]),
        (
            vec![del(0, top), del(0, 0), del(0, top)],
            vec![varint(zz(top as i64)), varint(zz(-(top as i64))), varint(zz(top as i64))],
        ),
        // Interleaved tables: each table's delta is from its own previous rid.
        (
            vec![del(1, 100), del(2, 5000), del(1, 101), del(2, 4999), del(62, 1), del(1, 102)],
            vec![varint(zz(100)), varint(zz(5000)), varint(zz(1)), varint(zz(-1)), varint(zz(1)), varint(zz(1))],
        ),
    ];
    for (writes, deltas) in cases {
        let p = raw_payload(&one_txn(writes.clone()));
        let mut expect = [varint(0), varint(writes.len() as u64)].concat();
        for (w, d) in writes.iter().zip(&deltas) {
            expect.push(1 | ((w.table as u8 + 1) << 2));
            expect.extend(d);
        }
        assert_eq!(p, expect, "{writes:?}");
    }

    // Deltas carry across transactions of a batch, not across batches: a new batch (and a
    // cleared builder) starts every table at 0 again.
    let txns = vec![T { ts: 1, writes: vec![del(5, 1000)] }, T { ts: 2, writes: vec![del(5, 1001)] }];
    let p = raw_payload(&txns);
    assert_eq!(p, [&[0, 1, 1 | packed(5)][..], &varint(zz(1000)), &[1, 1, 1 | packed(5)], &varint(zz(1))].concat());
    let mut b = BatchBuilder::new();
    push_all(&mut b, &txns);
    b.clear();
    push_all(&mut b, &txns[1..]);
    assert_eq!(b.payload(), &[&[0, 1, 1 | packed(5)][..], &varint(zz(1001))].concat()[..]);
    // Two batches of one segment decode independently.
    let (file, offsets) = build_segment(&[txns.clone(), txns[1..].to_vec()], &[false]);
    let scan = read_segment(&Bytes::from(file)).unwrap();
    assert_eq!(scan.end, SegmentEnd::Clean);
    assert_prefix(&scan, &[txns.clone(), txns[1..].to_vec()], &offsets, 2);
}

#[test]
fn rids_outside_the_limit_are_refused() {
    // Wrapping around u64 from a valid previous rid lands far outside the range.
    let first = [varint(0), varint(2), vec![1 | packed(0)], varint(zz(5))].concat();
    for (bad, what) in [
        (zz(-6), "below 0 (wraps to u64::MAX)"),
        (zz(i64::MIN), "wraps to 2^63 + 5"),
        (zz((RID_LIMIT - 5) as i64), "RID_LIMIT exactly"),
        (u64::MAX, "largest zigzag value"),
    ] {
        let p = [first.clone(), vec![1 | packed(0)], varint(bad)].concat();
        let e = decode_payload(1, 5, 5, &p).unwrap_err();
        assert_eq!(e, FormatError::Malformed("record id beyond RECORDS_PER_TABLE_MAX"), "{what}");
    }
    // The edges that are valid.
    for (d, rid) in [(zz(-5), 0), (zz((RID_LIMIT - 6) as i64), RID_LIMIT - 1)] {
        let p = [first.clone(), vec![1 | packed(0)], varint(d)].concat();
        let b = decode_payload(1, 5, 5, &p).unwrap();
        assert_eq!(b.records()[0].writes[1].rid, RecordId(rid));
    }
}

#[test]
#[should_panic(expected = "beyond RECORDS_PER_TABLE_MAX")]
fn push_txn_rejects_rid_beyond_limit() {
    BatchBuilder::new().push_txn(Ts(1), [(TableId(0), RecordId(RID_LIMIT), None, None)].into_iter());
}

#[test]
#[should_panic(expected = "beyond TABLES_MAX")]
fn push_txn_rejects_table_beyond_limit() {
    BatchBuilder::new().push_txn(Ts(1), [(TableId(MAX_TABLES as u32), RecordId(0), None, None)].into_iter());
}

#[test]
fn table_ids_pack_into_the_flags_byte_when_small() {
    assert_eq!((PACKED_TABLE_LIMIT, MAX_TABLES), (63, 256));
    // (table, the flags byte of a delete without key, the table varint after it)
    for (table, flags, long) in [
        (0u32, 0x05, vec![]),
        (1, 0x09, vec![]),
        (62, 0xFD, vec![]),
        (63, 0x01, vec![63]),
        (127, 0x01, vec![127]),
        (128, 0x01, vec![0x80, 0x01]),
        (255, 0x01, vec![0xFF, 0x01]),
    ] {
        let p = raw_payload(&one_txn(vec![del(table, 0)]));
        assert_eq!(p, [&[0, 1, flags][..], &long, &[0]].concat(), "table {table}");
        // The other form of the same table is refused: packed for 63 and up is out of
        // reach of bits 2-7; long for 62 and below is not canonical.
        if table < PACKED_TABLE_LIMIT {
            let bad = [&[0, 1, 0x01][..], &varint(table.into()), &[0]].concat();
            let e = decode_payload(1, 5, 5, &bad).unwrap_err();
            assert_eq!(e, FormatError::Malformed("table id in long form fits the flags byte"), "table {table}");
        }
    }
    // Table 256 and beyond decode as errors, never as a panic or an allocation.
    for table in [256u64, 257, 16383, 16384, u32::MAX.into(), u64::MAX] {
        let bad = [&[0, 1, 0x01][..], &varint(table), &[0]].concat();
        let e = decode_payload(1, 5, 5, &bad).unwrap_err();
        assert_eq!(e, FormatError::Malformed("table id beyond TABLES_MAX"), "table {table}");
    }
    // Every flags byte is meaningful now: bits 0-1 the kind of write, bits 2-7 the table.
    for flags in 0..=255u8 {
        let table_bits = flags >> 2;
        // Fields in order: flags, table (long form only), rid delta 0, key_len, value_len,
        // key, value.
        let mut p = vec![0, 1, flags];
        if table_bits == 0 {
            p.push(100);
        }
        p.push(0);
        if flags & 2 != 0 {
            p.push(1);
        }
        if flags & 1 == 0 {
            p.push(1);
        }
        if flags & 2 != 0 {
            p.push(b'k');
        }
        if flags & 1 == 0 {
            p.push(b'v');
        }
        let b = decode_payload(1, 5, 5, &p).unwrap_or_else(|e| panic!("flags {flags:#04x}: {e:?}"));
        let w = &b.records()[0].writes[0];
        let table = if table_bits == 0 { 100 } else { u32::from(table_bits) - 1 };
        assert_eq!(w.table, TableId(table), "flags {flags:#04x}");
        assert_eq!(w.key.is_some(), flags & 2 != 0);
        assert_eq!(w.value.is_none(), flags & 1 != 0);
    }
}

#[test]
fn txn_views_walk_on_their_own_in_any_order() {
    // Recovery collects a batch's transaction views and walks them newest first; every
    // view must know its tables' previous rids, also for a transaction writing more
    // tables than a view keeps inline (then it keeps them all).
    let mut txns = Vec::new();
    for i in 0..6u64 {
        let tables = [1usize, 3, 8, 9, 12][i as usize % 5];
        let writes = (0..tables as u32)
            .flat_map(|t| {
                let table = if t % 2 == 0 { t * 20 } else { t };
                [del(table, 1000 * i + u64::from(t)), del(table, 1000 * i + u64::from(t) + 2)]
            })
            .chain([del(0, 7 * i)])
            .collect();
        txns.push(T { ts: 10 + i, writes });
    }
    for compress in [false, true] {
        round_trip_views_newest_first(&txns, compress);
    }
}

/// Encodes `txns` as one batch, decodes it, and walks the transaction views newest first
/// (as recovery does), each twice and through a clone: walking does not consume a view, and
/// every view knows its rid deltas' starting points.
fn round_trip_views_newest_first(txns: &[T], compress: bool) {
    let (bytes, _) = encode_batch(txns, 0, compress);
    let (batch, _) = decode_batch(&Bytes::from(bytes)).unwrap();
    assert_same_txns(&batch, txns);
    let mut scratch = Vec::new();
    let p = batch.payload_in(&mut scratch);
    let views: Vec<_> = p.txns().collect();
    for (v, t) in views.iter().zip(txns).rev() {
        for v in [v, &v.clone()] {
            let got: Vec<_> = v.writes().map(|w| (w.table.0, w.rid.0)).collect();
            let want: Vec<_> = t.writes.iter().map(|w| (w.table, w.rid)).collect();
            assert_eq!(got, want, "txn {}", t.ts);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Many writes to few tables and nearby rids (the case the rid deltas are for), with
    /// views walked newest first as recovery does.
    #[test]
    fn clustered_round_trip(
        raw in prop::collection::vec(prop::collection::vec((0u32..12, -3i64..4, any::<bool>()), 0..12), 1..30),
        compress in any::<bool>(),
    ) {
        let mut at = [0u64; 12];
        let txns: Vec<T> = raw
            .into_iter()
            .enumerate()
            .map(|(i, writes)| T {
                ts: i as u64 + 1,
                writes: writes
                    .into_iter()
                    .map(|(t, step, put)| {
                        at[t as usize] = at[t as usize].saturating_add_signed(step).min(RID_LIMIT - 1);
                        let table = if t < 6 { t } else { 60 + t * 10 };
                        W { table, rid: at[t as usize], key: None, value: put.then(|| vec![t as u8; 3]) }
                    })
                    .collect(),
            })
            .collect();
        round_trip_views_newest_first(&txns, compress);
    }
}

#[test]
fn checksum_valid_bad_last_batch_is_corrupt_not_torn() {
    let batches = three_batches();
    let (file, offsets) = build_segment(&batches[..2], &[false]);
    let t = txn_bytes(0, &[(2, Some(b"k"), Some(b"v"))]);
    let h = header(1, 500, 500, t.len() as u32);
    type IsExpected = fn(&FormatError) -> bool;
    let cases: Vec<(Vec<u8>, IsExpected)> = vec![
        // Another stream's batch.
        (forge(BatchHeader { stream: StreamId(8), ..h }, &t), |e| {
            matches!(e, FormatError::StreamMismatch { expected: 7, found: 8 })
        }),
        // Another epoch's batch.
        (forge(BatchHeader { epoch: Epoch(2), ..h }, &t), |e| {
            matches!(e, FormatError::EpochMismatch { expected: 3, found: 2 })
        }),
        // A well-framed batch with a bad payload.
        (forge(BatchHeader { txn_count: 1, last_ts: Ts(501), ..h }, &t), |e| matches!(e, FormatError::Malformed(_))),
    ];
    for (bad, is_expected) in cases {
        let mut f = file.clone();
        f.extend_from_slice(&bad);
        let scan = read_segment(&Bytes::from(f)).unwrap();
        match &scan.end {
            SegmentEnd::Corrupt { offset, reason } => {
                assert_eq!(*offset, file.len() as u64);
                assert!(is_expected(reason), "{reason:?}");
                assert!(!reason.is_retryable());
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_prefix(&scan, &batches, &offsets, 2);
    }
}

#[test]
fn later_batch_of_other_stream_does_not_make_a_torn_tail_corrupt() {
    // Only headers of this segment's stream and epoch count as "valid data follows".
    let batches = three_batches();
    let (mut file, offsets) = build_segment(&batches[..2], &[false]);
    let torn_at = file.len() as u64;
    file.extend_from_slice(&[0xAB; 30]); // a torn batch
    let (other, _) = {
        let mut b = BatchBuilder::new();
        push_all(&mut b, &batches[2]);
        let mut out = Vec::new();
        let h = b.finish_into(StreamId(99), EPOCH, Ts(0), false, &mut out);
        (out, h)
    };
    file.extend_from_slice(&other);
    let scan = read_segment(&Bytes::from(file)).unwrap();
    assert!(matches!(scan.end, SegmentEnd::Torn { offset, .. } if offset == torn_at), "{:?}", scan.end);
    assert_prefix(&scan, &batches, &offsets, 2);
}

/// A torn last batch whose payload holds, in a client's value, the bytes of a whole valid
/// batch of the segment's own stream and epoch is still a torn tail: a later header is
/// looked for past the torn batch's own bytes (it was looked for inside them, found the
/// client's, and called the tail damage: a node whose last write was cut by a crash then
/// refused to start).
#[test]
fn a_header_inside_a_torn_batchs_value_does_not_make_the_tail_corrupt() {
    let batches = three_batches();
    let (mut file, offsets) = build_segment(&batches[..2], &[false]);
    let torn_at = file.len() as u64;
    // A value that is a whole batch of stream 7, epoch 3.
    let mut forged = Vec::new();
    let mut b = BatchBuilder::new();
    push_all(&mut b, &batches[2]);
    b.finish_into(STREAM, EPOCH, Ts(300), false, &mut forged);
    let txn = vec![T { ts: 400, writes: vec![W { table: 1, rid: 5, key: Some(b"k".to_vec()), value: Some(forged) }] }];
    let mut b = BatchBuilder::new();
    push_all(&mut b, &txn);
    let mut last = Vec::new();
    b.finish_into(STREAM, EPOCH, Ts(400), false, &mut last);
    // Cut by a crash 3 bytes short of its end (its value whole inside it).
    file.extend_from_slice(&last[..last.len() - 3]);
    let scan = read_segment(&Bytes::from(file.clone())).unwrap();
    assert!(matches!(scan.end, SegmentEnd::Torn { offset, .. } if offset == torn_at), "{:?}", scan.end);
    assert_prefix(&scan, &batches, &offsets, 2);
    // Its whole length there, the payload's checksum failing, and a batch after it that
    // claims it synced: damage.
    file.extend_from_slice(&last[last.len() - 3..]);
    let n = file.len();
    file[n - 10] ^= 0x20;
    let after = |synced: u64| {
        let mut after = Vec::new();
        let mut b = BatchBuilder::new();
        push_all(&mut b, &sample_txns(500, 2));
        let marks = Marks { bound_ts: Ts(510), synced_ts: Ts(synced), ..Marks::default() };
        b.finish_marked_into(STREAM, EPOCH, marks, false, &mut after);
        after
    };
    let mut damaged = file.clone();
    damaged.extend_from_slice(&after(400));
    let scan = read_segment(&Bytes::from(damaged)).unwrap();
    assert!(matches!(scan.end, SegmentEnd::Corrupt { offset, .. } if offset == torn_at), "{:?}", scan.end);
    // One that claims no more than what lies before it synced: a write torn out of order.
    let last_before = batches[1].last().unwrap().ts;
    file.extend_from_slice(&after(last_before));
    let scan = read_segment(&Bytes::from(file)).unwrap();
    assert!(matches!(scan.end, SegmentEnd::Torn { offset, .. } if offset == torn_at), "{:?}", scan.end);
}

#[test]
fn segment_header_round_trip_and_errors() {
    let h = SegmentHeader {
        stream: StreamId(u32::MAX - 1),
        epoch: Epoch(u64::MAX - 1),
        seq: 12345,
        streams: u32::MAX,
        prev_ts: Ts(0x0102_0304_0506_0708),
    };
    let b = h.encode();
    assert_eq!(&b[..8], b"DITTOLOG");
    assert_eq!(&b[8..12], &LOG_FORMAT_VERSION.to_le_bytes());
    assert_eq!(&b[32..36], &u32::MAX.to_le_bytes());
    assert_eq!(&b[36..44], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(SegmentHeader::decode(&b), Ok(h));
    // Version 4: the stream id must be below the epoch's stream count.
    let mut bad = SegmentHeader { stream: StreamId(3), streams: 3, ..h }.encode();
    assert!(matches!(SegmentHeader::decode(&bad), Err(FormatError::Malformed(_))));
    bad[32] = 4;
    let crc = crc32c::crc32c(&bad[..44]);
    bad[44..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(SegmentHeader::decode(&bad).map(|h| h.streams), Ok(4));
    assert_eq!(SegmentHeader::decode(&b[..47]), Err(FormatError::Truncated { needed: 48, available: 47 }));
    let mut bad = b;
    bad[0] = b'X';
    assert_eq!(SegmentHeader::decode(&bad), Err(FormatError::BadMagic));
    let mut bad = b;
    bad[30] ^= 1;
    assert!(matches!(SegmentHeader::decode(&bad), Err(FormatError::HeaderChecksum { .. })));
    assert_eq!(LOG_FORMAT_VERSION, 6);
    // Version 4's and 5's segment headers are version 6's.
    for version in [4, 5] {
        let mut old = b;
        old[8] = version;
        let crc = crc32c::crc32c(&old[..44]);
        old[44..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(SegmentHeader::decode(&old), Ok(h));
    }
    // Versions 2 and 3 (no stream count or prev_ts: bytes 32..44 reserved, zero) are
    // still read, as "not recorded"; non-zero reserved bytes there are refused.
    for version in [2, 3] {
        let mut old = b;
        old[8] = version;
        old[32..44].fill(0);
        let crc = crc32c::crc32c(&old[..44]);
        old[44..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(SegmentHeader::decode(&old), Ok(SegmentHeader { streams: 0, prev_ts: Ts(0), ..h }));
        old[40] = 1;
        let crc = crc32c::crc32c(&old[..44]);
        old[44..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(SegmentHeader::decode(&old), Err(FormatError::Malformed(_))));
    }
    for version in [1, 7] {
        let mut bad = b;
        bad[8] = version;
        let crc = crc32c::crc32c(&bad[..44]);
        bad[44..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(SegmentHeader::decode(&bad), Err(FormatError::UnsupportedVersion(version.into())));
    }
}

#[test]
fn batch_header_layout_is_as_documented() {
    let txns = sample_txns(77, 3);
    let (bytes, h) = encode_batch(&txns, 1234, false);
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    assert_eq!(&bytes[..4], b"DBAT");
    assert_eq!(&bytes[4..6], &(LOG_FORMAT_VERSION as u16).to_le_bytes());
    assert_eq!((bytes[6], bytes[7]), (0, 0));
    assert_eq!(u32_at(8), STREAM.0);
    assert_eq!(u64_at(12), EPOCH.0);
    assert_eq!(u64_at(20), 77);
    assert_eq!(u64_at(28), 83);
    assert_eq!(u64_at(36), 1234);
    assert_eq!(u32_at(44), 3);
    assert_eq!(u32_at(48), h.raw_len);
    assert_eq!(u32_at(52), h.stored_len);
    // floor_ts (0: `finish_into` vouches for no other stream), reuse_ts and synced_ts (0:
    // they claim nothing), then the payload; the payload checksum covers all four, the
    // header checksum the first 60 bytes only.
    assert_eq!((u64_at(64), u64_at(72), u64_at(80)), (0, 0, 0));
    assert_eq!(u32_at(56), crc32c::crc32c(&bytes[64..]));
    assert_eq!(u32_at(60), crc32c::crc32c(&bytes[..60]));
    // The payload, byte by byte: the worked example of docs/log-format.md.
    #[rustfmt::skip]
    let expected: Vec<u8> = [
        &[0x00, 0x00][..],             // txn ts 77: delta 0 (from first_ts), 0 writes
        &[0x03, 0x01],                 // txn ts 80: delta 3, 1 write
        &[0x06, 0xC8, 0x01, 0x07, 0x00], //   put with key, table 0; rid 100 (+100 from 0), key_len 7, value_len 0
        b"key-1-0",                    //   key; the value is empty
        &[0x03, 0x02],                 // txn ts 83: delta 3, 2 writes
        &[0x04, 0xC8, 0x01, 0x16],     //   put without key, table 0; rid 200 (+100 from 100), value_len 22
        &[b'c'; 22],                   //   value
        &[0x0B, 0x92, 0x03, 0x07],     //   delete with key, table 1; rid 201 (+201 from 0), key_len 7
        b"key-2-1",                    //   key
    ]
    .concat();
    assert_eq!(&bytes[88..], &expected[..]);
    assert_eq!(decode_batch_header(&bytes), Ok(h));
}

/// The floor a writer vouches with: at offset 64, covered by the payload checksum (not the
/// header checksum, whose place and span every version shares), never above the bound.
#[test]
fn floor_is_written_checked_and_bounded() {
    let mut b = BatchBuilder::new();
    push_all(&mut b, &sample_txns(77, 3));
    let mut bytes = Vec::new();
    let h = b.finish_vouching_into(STREAM, EPOCH, Ts(1234), Ts(1000), false, &mut bytes);
    assert_eq!((h.bound_ts, h.floor_ts), (Ts(1234), Ts(1000)));
    assert_eq!(u64::from_le_bytes(bytes[64..72].try_into().unwrap()), 1000);
    let (batch, used) = decode_batch(&Bytes::from(bytes.clone())).unwrap();
    assert_eq!((batch.header, used), (h, bytes.len()));
    // Any damaged floor byte is a payload checksum failure: a torn write, not a new version.
    for i in 64..72 {
        let mut bad = bytes.clone();
        bad[i] ^= 0x10;
        assert!(matches!(decode_err(bad), FormatError::PayloadChecksum { .. }), "byte {i}");
    }
    // A floor above the bound, checksums correct, is malformed.
    let e = decode_err(forge(BatchHeader { floor_ts: Ts(1235), ..h }, &bytes[BATCH_HEADER_LEN..]));
    assert_eq!(e, FormatError::Malformed("floor_ts above bound_ts"));
    // A header cut inside the floor is truncated (so may be a torn tail).
    assert_eq!(decode_batch_header(&bytes[..70]), Err(FormatError::Truncated { needed: 88, available: 70 }));
    // Heartbeats carry a floor too.
    let mut hb = Vec::new();
    let h = BatchBuilder::new().finish_vouching_into(STREAM, EPOCH, Ts(50), Ts(50), true, &mut hb);
    assert_eq!(decode_batch(&Bytes::from(hb)).unwrap().0.header, h);
}

/// A log written by the previous version (64-byte batch headers, no floor) is still read:
/// the same batches, re-framed as version 2, decode to the same transactions with floor 0.
#[test]
fn version_2_batches_are_still_read() {
    let txns = sample_txns(5, 4);
    let (v3, h3) = encode_batch(&txns, 20, false);
    let payload = &v3[BATCH_HEADER_LEN..];
    let h2 = BatchHeader { version: 2, ..h3 };
    let v2 = forge(h2, payload);
    assert_eq!(v2.len(), 64 + payload.len());
    assert_eq!(&v2[4..6], &2u16.to_le_bytes());
    assert_eq!(u32::from_le_bytes(v2[56..60].try_into().unwrap()), crc32c::crc32c(payload));
    let (b2, used) = decode_batch(&Bytes::from(v2.clone())).unwrap();
    assert_eq!((b2.header.floor_ts, b2.header.header_len(), used), (Ts(0), 64, v2.len()));
    let (b3, _) = decode_batch(&Bytes::from(v3)).unwrap();
    assert_eq!(b2.records(), b3.records());
    // A whole version-2 segment: header version 2, then version-2 batches.
    let mut seg = SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 11, streams: 8, prev_ts: Ts(0) }.encode().to_vec();
    seg[8] = 2;
    seg[32..44].fill(0);
    let crc = crc32c::crc32c(&seg[..44]);
    seg[44..48].copy_from_slice(&crc.to_le_bytes());
    seg.extend_from_slice(&v2);
    seg.extend_from_slice(&forge(BatchHeader { version: 2, ..header(0, 0, 0, 0) }, &[]));
    let scan = read_segment(&Bytes::from(seg.clone())).unwrap();
    assert_eq!(scan.end, SegmentEnd::Clean);
    assert_eq!(scan.batches.iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![48, 48 + v2.len() as u64]);
    // A batch of the other version in a segment is corruption (its checksums verify, so no
    // torn write explains it), whichever way round.
    let mut mixed = seg;
    mixed.extend_from_slice(&v3_heartbeat());
    let scan = read_segment(&Bytes::from(mixed.clone())).unwrap();
    let at = (48 + v2.len() + 64) as u64;
    assert!(matches!(scan.end, SegmentEnd::Corrupt { offset, .. } if offset == at), "{:?}", scan.end);
    let mut mixed =
        SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 11, streams: 8, prev_ts: Ts(0) }.encode().to_vec();
    mixed.extend_from_slice(&v3_heartbeat());
    mixed.extend_from_slice(&v2);
    let scan = read_segment(&Bytes::from(mixed)).unwrap();
    assert!(matches!(scan.end, SegmentEnd::Corrupt { offset: 136, .. }), "{:?}", scan.end);
}

/// The reuse bound a writer frames (version 5): at offset 72, covered by the payload
/// checksum as the floor is, any value (it may lie above the batch's transactions: they
/// may have been taken before the bound moved).
#[test]
fn reuse_bound_is_written_and_checked() {
    let mut b = BatchBuilder::new();
    push_all(&mut b, &sample_txns(78, 3));
    let mut bytes = Vec::new();
    let marks = Marks { bound_ts: Ts(1234), floor_ts: Ts(1000), reuse_ts: Ts(4321), ..Marks::default() };
    let h = b.finish_marked_into(STREAM, EPOCH, marks, true, &mut bytes);
    assert_eq!((h.bound_ts, h.floor_ts, h.reuse_ts, h.header_len()), (Ts(1234), Ts(1000), Ts(4321), 88));
    assert_eq!(u64::from_le_bytes(bytes[72..80].try_into().unwrap()), 4321);
    let (batch, used) = decode_batch(&Bytes::from(bytes.clone())).unwrap();
    assert_eq!((batch.header, used), (h, bytes.len()));
    for i in 72..80 {
        let mut bad = bytes.clone();
        bad[i] ^= 0x01;
        assert!(matches!(decode_err(bad), FormatError::PayloadChecksum { .. }), "byte {i}");
    }
    assert_eq!(decode_batch_header(&bytes[..76]), Err(FormatError::Truncated { needed: 88, available: 76 }));
    // A failover's cut keeps it.
    let mut cut = Vec::new();
    let c = ditto_log::format::cut_batch(&batch, Ts(u64::MAX), &mut cut).unwrap();
    assert_eq!(c.reuse_ts, Ts(4321));
}

/// A log written by version 4 (72-byte batch headers: a floor, no reuse bound) is still
/// read: the same batches, re-framed as version 4, decode to the same transactions with
/// reuse bound 0 (which claims nothing).
#[test]
fn version_4_batches_are_still_read() {
    let txns = sample_txns(6, 4);
    let mut v5 = Vec::new();
    let mut b = BatchBuilder::new();
    push_all(&mut b, &txns);
    let marks = Marks { bound_ts: Ts(20), floor_ts: Ts(7), reuse_ts: Ts(9), ..Marks::default() };
    let h5 = b.finish_marked_into(STREAM, EPOCH, marks, false, &mut v5);
    let payload = &v5[BATCH_HEADER_LEN..];
    let h4 = BatchHeader { version: 4, reuse_ts: Ts(0), ..h5 };
    let v4 = forge(h4, payload);
    assert_eq!(v4.len(), 72 + payload.len());
    assert_eq!(u64::from_le_bytes(v4[64..72].try_into().unwrap()), 7);
    let (b4, used) = decode_batch(&Bytes::from(v4.clone())).unwrap();
    assert_eq!((b4.header.floor_ts, b4.header.reuse_ts, b4.header.header_len(), used), (Ts(7), Ts(0), 72, v4.len()));
    let (b5, _) = decode_batch(&Bytes::from(v5)).unwrap();
    assert_eq!(b4.records(), b5.records());
    // A whole version-4 segment.
    let mut seg = SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 3, streams: 8, prev_ts: Ts(0) }.encode().to_vec();
    seg[8] = 4;
    let crc = crc32c::crc32c(&seg[..44]);
    seg[44..48].copy_from_slice(&crc.to_le_bytes());
    seg.extend_from_slice(&v4);
    seg.extend_from_slice(&forge(BatchHeader { version: 4, ..header(0, 0, 0, 0) }, &[]));
    let scan = read_segment(&Bytes::from(seg)).unwrap();
    assert_eq!(scan.end, SegmentEnd::Clean);
    assert_eq!(scan.batches.iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![48, 48 + v4.len() as u64]);
}

fn v3_heartbeat() -> Vec<u8> {
    let mut out = Vec::new();
    BatchBuilder::new().finish_into(STREAM, EPOCH, Ts(30), false, &mut out);
    out
}

#[test]
fn errors_are_not_retryable() {
    for e in [
        FormatError::Truncated { needed: 1, available: 0 },
        FormatError::BadMagic,
        FormatError::UnsupportedVersion(9),
        FormatError::BadFlags(2),
        FormatError::HeaderChecksum { stored: 1, computed: 2 },
        FormatError::PayloadChecksum { stored: 1, computed: 2 },
        FormatError::TooLarge { what: "x", len: 2, max: 1 },
        FormatError::Decompress("x".into()),
        FormatError::Malformed("x"),
    ] {
        assert!(!e.is_retryable(), "{e}");
    }
}

// ---------------------------------------------------------------------------------------
// 6. Property: garbage never panics
// ---------------------------------------------------------------------------------------

/// Whatever decodes from garbage must be internally consistent and re-encode to the
/// same transactions.
fn check_decoded(batch: &Batch, used: usize, avail: usize) {
    assert!(used <= avail);
    assert_eq!(used, batch.header.total_len());
    let txns = batch.records();
    assert_eq!(txns.len(), batch.header.txn_count as usize);
    let mut b = BatchBuilder::new();
    for t in &txns {
        b.push_txn(t.ts, t.writes.iter().map(|w| (w.table, w.rid, w.key.as_deref(), w.value.as_deref())));
    }
    assert_eq!(b.payload_len(), batch.header.raw_len as usize);
    // The encoding is canonical: what decoded re-encodes to the same payload bytes.
    assert_eq!(b.payload(), &batch.payload()[..]);
    let mut out = Vec::new();
    b.finish_into(batch.header.stream, batch.header.epoch, batch.header.bound_ts, false, &mut out);
    let (again, _) = decode_batch(&Bytes::from(out)).unwrap();
    assert_eq!(again.records(), txns);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn garbage_never_panics(data in prop::collection::vec(any::<u8>(), 0..600)) {
        let bytes = Bytes::from(data.clone());
        if let Ok((b, used)) = decode_batch(&bytes) {
            check_decoded(&b, used, bytes.len());
        }
        let _ = decode_batch_header(&data);
        let _ = read_segment(&bytes);
        // Behind a valid segment header, so the batch walk is exercised.
        let mut seg = SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 0, streams: 8, prev_ts: Ts(0) }.encode().to_vec();
        seg.extend_from_slice(&data);
        let scan = read_segment(&Bytes::from(seg.clone())).unwrap();
        for (off, b) in &scan.batches {
            check_decoded(b, b.header.total_len(), seg.len() - *off as usize);
        }
    }

    /// Garbage behind valid checksums, so the payload parser and decompressor see it.
    #[test]
    fn checksummed_garbage_never_panics(
        payload in prop::collection::vec(any::<u8>(), 0..400),
        txn_count in 0u32..8,
        first in 0u64..4,
        span in 0u64..4,
        compressed in any::<bool>(),
        raw_slack in 0u32..64,
    ) {
        let raw_len = if compressed { payload.len() as u32 + raw_slack } else { payload.len() as u32 };
        let mut h = header(txn_count, first, first + span, raw_len);
        h.compressed = compressed;
        let bytes = Bytes::from(forge(h, &payload));
        if let Ok((b, used)) = decode_batch(&bytes) {
            check_decoded(&b, used, bytes.len());
        }
    }

    /// Random damage to a real segment: never panics, and whatever is reported as intact
    /// really is the original data.
    #[test]
    fn damaged_segment_never_lies(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let batches = three_batches();
        let (file, offsets) = build_segment(&batches, &[true, false]);
        let mut damaged = file.clone();
        for (i, v) in &edits {
            let i = i.index(damaged.len());
            damaged[i] = *v;
        }
        if do_cut {
            damaged.truncate(cut.index(damaged.len() + 1));
        }
        if let Ok(scan) = read_segment(&Bytes::from(damaged.clone())) {
            for (i, (off, b)) in scan.batches.iter().enumerate() {
                prop_assert_eq!(*off, offsets[i]);
                assert_same_txns(b, &batches[i]);
            }
            if scan.end == SegmentEnd::Clean {
                prop_assert_eq!(scan.valid_len(), damaged.len() as u64);
            }
        }
    }
}

/// A batch cut at a timestamp holds exactly its transactions at or below it, written the
/// same, its bound capped there; cut above its last it is the same transactions; cut below
/// its first it holds none. Compressed or not.
#[test]
fn a_batch_cut_at_a_timestamp_keeps_exactly_what_lies_at_or_below_it() {
    let txns = sample_txns(100, 12);
    for compress in [false, true] {
        let (raw, h) = encode_batch(&txns, 200, compress);
        let (batch, _) = decode_batch_checksums(&Bytes::from(raw)).unwrap();
        for upto in [99u64, 100, 112, 113, 133, 150, 200, 300] {
            let mut out = Vec::new();
            let ch = cut_batch(&batch, Ts(upto), &mut out).unwrap();
            let (cut, used) = decode_batch_checksums(&Bytes::from(out.clone())).unwrap();
            assert_eq!(used, out.len());
            let want: Vec<T> = txns.iter().filter(|t| t.ts <= upto).cloned().collect();
            assert_same_txns(&cut, &want);
            assert_eq!(ch.bound_ts, Ts(upto.min(200)), "cut at {upto}");
            assert_eq!((ch.stream, ch.epoch), (h.stream, h.epoch));
            assert!(ch.floor_ts <= ch.bound_ts);
        }
    }
}

// ---------------------------------------------------------------------------------------
// `scan_segment`: `read_segment`'s answer, a batch at a time
// ---------------------------------------------------------------------------------------

/// What a scan says of a segment: its end, valid length and batch offsets, or its error.
type Said = Result<(SegmentEnd, u64, Vec<u64>), String>;

fn said_by_read(file: &[u8]) -> Said {
    let scan = read_segment(&Bytes::from(file.to_vec())).map_err(|e| e.to_string())?;
    let offsets = scan.batches.iter().map(|(o, _)| *o).collect();
    Ok((scan.end.clone(), scan.valid_len(), offsets))
}

/// `scan_segment` over `file`, and the largest read it asked for.
fn said_by_scan(file: &[u8]) -> (Said, usize) {
    let mut largest = 0;
    let mut offsets = Vec::new();
    let mut read_at = |off: u64, buf: &mut [u8]| {
        largest = largest.max(buf.len());
        let off = off as usize;
        match file.get(off..off + buf.len()) {
            Some(b) => {
                buf.copy_from_slice(b);
                Ok(())
            }
            None => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "past the end")),
        }
    };
    let s = scan_segment(file.len() as u64, &mut read_at, &mut |off, _| offsets.push(off));
    let said = match s {
        Ok(s) => Ok((s.end, s.valid_len, offsets)),
        Err(ScanError::Format(e)) => Err(e.to_string()),
        Err(ScanError::Io(e)) => panic!("the scan read past the end: {e}"),
    };
    (said, largest)
}

/// Every cut, every flipped byte, zero tails with and without a stray byte, and a
/// half-written last batch: `scan_segment` says what `read_segment` says.
#[test]
fn scan_segment_answers_as_read_segment_does_for_every_damage() {
    let batches = three_batches();
    for compress in [[false], [true]] {
        let (file, offsets) = build_segment(&batches, &compress);
        let same = |f: &[u8], what: &str| assert_eq!(said_by_scan(f).0, said_by_read(f), "{what}");
        for len in 0..=file.len() {
            same(&file[..len], &format!("cut at {len}"));
        }
        for pos in 0..file.len() {
            let mut d = file.clone();
            d[pos] ^= 0xFF;
            same(&d, &format!("byte {pos} flipped"));
        }
        let mut padded = file.clone();
        padded.resize(file.len() + 4096, 0);
        same(&padded, "zeros after the last batch");
        for pos in [file.len(), file.len() + 1000, padded.len() - 1] {
            let mut d = padded.clone();
            d[pos] = 1;
            same(&d, &format!("a stray byte at {pos} in the zeros"));
        }
        let last = offsets[2] as usize;
        for keep in [last + 8, last + 40, last + 70, (last + file.len()) / 2] {
            let mut torn = file[..keep].to_vec();
            torn.resize(file.len() + 512, 0);
            same(&torn, &format!("the last batch cut at {keep}, zeros after"));
        }
    }
}

/// A segment of many batches and 8 MiB of zeros ahead is scanned reading at most one
/// batch, or 256 KiB of zeros, at a time: never the file whole.
#[test]
fn scan_segment_reads_a_batch_at_a_time() {
    let batches: Vec<Vec<T>> = (0..400).map(|i| sample_txns(1 + i * 10, 10)).collect();
    let (mut file, offsets) = build_segment(&batches, &[false]);
    let largest_batch = offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap();
    let written = file.len();
    file.resize(written + (8 << 20), 0);
    let (said, largest) = said_by_scan(&file);
    assert_eq!(said, said_by_read(&file));
    assert_eq!(said.unwrap().0, SegmentEnd::Zeros { offset: written as u64 });
    assert!(largest <= largest_batch.max(256 << 10), "read {largest} bytes at once of a {} byte file", file.len());
    assert!(file.len() > 4 * largest, "the file is larger than any one read");
}

/// A segment still being written: the scan first reads its last batch half written (zeros
/// after), then, reading the rest at once, finds it whole. It takes the batch, whole and
/// checked in that one read (read through a window, the scan's own later reads of the
/// spot could still see the older bytes).
#[test]
fn scan_segment_takes_a_batch_written_while_it_scans() {
    let batches = three_batches();
    let (file, offsets) = build_segment(&batches, &[false]);
    let last = offsets[2] as usize;
    let mut torn = file[..(last + file.len()) / 2].to_vec();
    torn.resize(file.len(), 0);
    // The scan reads from the last batch's start to the end three times: the batch (torn),
    // the check for zeros (torn, not zeros), the rest at once (whole by then).
    let mut whole_reads = 0;
    let mut read_at = |off: u64, buf: &mut [u8]| {
        if off as usize == last && buf.len() == file.len() - last {
            whole_reads += 1;
        }
        let src = if whole_reads >= 3 { &file } else { &torn };
        buf.copy_from_slice(&src[off as usize..off as usize + buf.len()]);
        Ok(())
    };
    let mut seen = Vec::new();
    let s = scan_segment(file.len() as u64, &mut read_at, &mut |off, _| seen.push(off)).unwrap();
    assert_eq!(whole_reads, 3, "the rest was read at once");
    assert_eq!(s.end, SegmentEnd::Clean);
    assert_eq!(seen, offsets);
    assert_eq!(s.valid_len, file.len() as u64);
}

/// `decode_batch_verified_before` decodes what `decode_batch_checksums` does, checks the
/// header (its checksum too) and the length, and does not compute the payload's checksum
/// again: for bytes verified before (a backup's received batch, in replay).
#[test]
fn decoding_a_batch_verified_before_skips_the_payload_checksum_only() {
    let txns = sample_txns(10, 5);
    let (bytes, _) = encode_batch(&txns, 20, false);
    let good = Bytes::from(bytes.clone());
    let (a, used_a) = decode_batch_checksums(&good).unwrap();
    let (b, used_b) = decode_batch_verified_before(&good).unwrap();
    assert_eq!((a.header, used_a), (b.header, used_b));
    assert_same_txns(&b, &txns);
    // A flipped payload byte: the full decode refuses it, this one does not look.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    let flipped = Bytes::from(flipped);
    assert!(matches!(decode_batch_checksums(&flipped), Err(FormatError::PayloadChecksum { .. })));
    assert!(decode_batch_verified_before(&flipped).is_ok());
    // A flipped header byte, or a cut batch: refused by both.
    let mut head = bytes.clone();
    head[20] ^= 1;
    assert!(matches!(decode_batch_verified_before(&Bytes::from(head)), Err(FormatError::HeaderChecksum { .. })));
    let cut = good.slice(..good.len() - 1);
    assert!(matches!(decode_batch_verified_before(&cut), Err(FormatError::Truncated { .. })));
}

/// The synced claim a writer frames (version 6): at offset 80, covered by the payload
/// checksum as the floor and the reuse bound are, never above the bound; a failover's cut
/// keeps it, capped at the cut's bound.
#[test]
fn synced_claim_is_written_checked_and_bounded() {
    let mut b = BatchBuilder::new();
    push_all(&mut b, &sample_txns(78, 3));
    let mut bytes = Vec::new();
    let marks = Marks { bound_ts: Ts(1234), floor_ts: Ts(1000), reuse_ts: Ts(4321), synced_ts: Ts(1200) };
    let h = b.finish_marked_into(STREAM, EPOCH, marks, false, &mut bytes);
    assert_eq!((h.synced_ts, h.header_len()), (Ts(1200), 88));
    assert_eq!(u64::from_le_bytes(bytes[80..88].try_into().unwrap()), 1200);
    let (batch, used) = decode_batch(&Bytes::from(bytes.clone())).unwrap();
    assert_eq!((batch.header, used), (h, bytes.len()));
    for i in 80..88 {
        let mut bad = bytes.clone();
        bad[i] ^= 0x04;
        assert!(matches!(decode_err(bad), FormatError::PayloadChecksum { .. }), "byte {i}");
    }
    let e = decode_err(forge(BatchHeader { synced_ts: Ts(1235), ..h }, &bytes[BATCH_HEADER_LEN..]));
    assert_eq!(e, FormatError::Malformed("synced_ts above bound_ts"));
    assert_eq!(decode_batch_header(&bytes[..84]), Err(FormatError::Truncated { needed: 88, available: 84 }));
    let mut cut = Vec::new();
    assert_eq!(cut_batch(&batch, Ts(u64::MAX), &mut cut).unwrap().synced_ts, Ts(1200));
    let mut cut = Vec::new();
    assert_eq!(cut_batch(&batch, Ts(81), &mut cut).unwrap().synced_ts, Ts(81));
}

/// A log written by version 5 (80-byte batch headers: no synced claim) is still read, and
/// its damage is told as before: a damaged batch with any valid batch after it is damage.
#[test]
fn version_5_batches_are_still_read_and_their_damage_told_as_before() {
    let batches = three_batches();
    let mut seg = SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 3, streams: 8, prev_ts: Ts(0) }.encode().to_vec();
    seg[8] = 5;
    let crc = crc32c::crc32c(&seg[..44]);
    seg[44..48].copy_from_slice(&crc.to_le_bytes());
    let mut offsets = Vec::new();
    for txns in &batches {
        let (v6, h6) = encode_batch(txns, txns.last().unwrap().ts, false);
        let v5 = forge(BatchHeader { version: 5, ..h6 }, &v6[BATCH_HEADER_LEN..]);
        assert_eq!(v5.len(), v6.len() - 8);
        offsets.push(seg.len() as u64);
        seg.extend_from_slice(&v5);
    }
    let scan = read_segment(&Bytes::from(seg.clone())).unwrap();
    assert_eq!(scan.end, SegmentEnd::Clean);
    assert_prefix(&scan, &batches, &offsets, 3);
    assert!(scan.batches.iter().all(|(_, b)| b.header.header_len() == 80 && b.header.synced_ts == Ts(0)));
    let mut damaged = seg;
    damaged[offsets[1] as usize + 100] ^= 0x01;
    let scan = read_segment(&Bytes::from(damaged.clone())).unwrap();
    assert!(matches!(scan.end, SegmentEnd::Corrupt { offset, .. } if offset == offsets[1]), "{:?}", scan.end);
    assert_eq!(said_by_scan(&damaged).0, said_by_read(&damaged));
}

/// Pages of one write reach the disk in any order before its fsync: a power cut may keep
/// a later batch of the write and not an earlier one. Two batches synced one at a time,
/// then four written together (each claiming the second synced): damage anywhere in the
/// four but the last, with whole batches after it, is a torn write (cut at the damaged
/// batch: none of the four was ever acknowledged under a durability that syncs), where
/// before it was damage and the node needed a person; damage in a synced batch, which the
/// later ones' claims prove was synced, is still damage. `scan_segment` says the same.
#[test]
fn a_write_torn_out_of_order_is_a_torn_tail_and_damage_to_synced_batches_is_not() {
    let batches: Vec<Vec<T>> = (0..6).map(|i| sample_txns(10 + 100 * i, 5)).collect();
    let synced_alone = 2;
    let last_synced = Ts(batches[synced_alone - 1].last().unwrap().ts);
    for compress in [false, true] {
        let (file, offsets) =
            build_segment_synced(
                &batches,
                &[compress],
                |i, previous| if i < synced_alone { previous } else { last_synced },
            );
        let batch_of = |pos: usize| offsets.iter().rposition(|&o| o as usize <= pos).unwrap();
        // Whether a batch after batch `j` is still as written (its claim proves the synced
        // ones were; with none, nothing tells the damage from a torn tail, as before).
        let ends: Vec<usize> = offsets[1..].iter().map(|&o| o as usize).chain([file.len()]).collect();
        let intact = |damaged: &[u8], j: usize| {
            (j + 1..batches.len())
                .filter(|&k| damaged[offsets[k] as usize..ends[k]] == file[offsets[k] as usize..ends[k]])
                .count() as u32
        };
        let intact_after = |damaged: &[u8], j: usize| intact(damaged, j) > 0;
        for pos in SEGMENT_HEADER_LEN..file.len() {
            for how in ["flip", "zero page"] {
                let mut damaged = file.clone();
                match how {
                    "flip" => damaged[pos] ^= 0x20,
                    // A 512-byte sector that never reached the disk: zeros.
                    _ => {
                        let end = (pos + 512).min(file.len());
                        if damaged[pos..end].iter().all(|&b| b == 0) {
                            continue;
                        }
                        damaged[pos..end].fill(0);
                    }
                }
                // (The first byte the damage changed: a zero it wrote over a zero is none.)
                let first = (pos..file.len()).find(|&p| damaged[p] != file[p]).unwrap();
                let j = batch_of(first);
                let said = said_by_read(&damaged);
                assert_eq!(said_by_scan(&damaged).0, said, "{how} at {pos}: the scan differs");
                let (end, valid_len, kept) = said.unwrap();
                assert_eq!(kept, offsets[..j].to_vec(), "{how} at {pos} (batch {j}): {end:?}");
                assert_eq!(valid_len, offsets[j]);
                match end {
                    SegmentEnd::Torn { offset, whole_after, .. } => {
                        assert!(
                            j >= synced_alone || !intact_after(&damaged, j),
                            "{how} at {pos}: damage to synced batch {j} read as torn"
                        );
                        assert_eq!(offset, offsets[j]);
                        // The whole batches cut with it, for the recovery's warning.
                        assert_eq!(whole_after, intact(&damaged, j), "{how} at {pos}: batches after it");
                    }
                    SegmentEnd::Corrupt { offset, .. } => {
                        assert!(
                            j < synced_alone && intact_after(&damaged, j),
                            "{how} at {pos}: a write torn out of order in batch {j} read as damage"
                        );
                        assert_eq!(offset, offsets[j]);
                    }
                    SegmentEnd::Zeros { offset } => {
                        // (A sector zeroed from a batch's start to the file's end.)
                        assert!(damaged[offsets[j] as usize..].iter().all(|&b| b == 0), "{how} at {pos}: zeros");
                        assert_eq!(offset, offsets[j]);
                    }
                    SegmentEnd::Clean => panic!("{how} at {pos}: clean"),
                }
            }
        }
    }
}

/// What a damaged batch is compared with (`damaged_end`'s `before`): the segment header's
/// `prev_ts` where it is the segment's first, and each earlier batch's larger of its bound
/// and its last transaction (a batch may hold transactions above its bound). A later
/// batch claiming exactly that much proves nothing (torn); one more proves the damaged
/// batch synced (damage). And a later header of an older version, which claims nothing,
/// still makes it damage.
#[test]
fn a_damaged_batch_is_weighed_against_prev_ts_and_the_highest_timestamp_before_it() {
    let txns = |ts0: u64| sample_txns(ts0, 3);
    let frame = |txns: &[T], bound: u64, synced: u64| {
        let mut b = BatchBuilder::new();
        push_all(&mut b, txns);
        let mut out = Vec::new();
        let marks = Marks { bound_ts: Ts(bound), synced_ts: Ts(synced), ..Marks::default() };
        b.finish_marked_into(STREAM, EPOCH, marks, false, &mut out);
        out
    };
    let segment = |prev_ts: u64, batches: &[Vec<u8>]| {
        let mut f =
            SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 12, streams: 8, prev_ts: Ts(prev_ts) }.encode().to_vec();
        let mut offsets = Vec::new();
        for b in batches {
            offsets.push(f.len());
            f.extend_from_slice(b);
        }
        (f, offsets)
    };
    let end_with = |f: &[u8], damaged: usize| {
        let mut f = f.to_vec();
        f[damaged + BATCH_HEADER_LEN + 2] ^= 0x08;
        let said = said_by_read(&f);
        assert_eq!(said_by_scan(&f).0, said);
        said.unwrap().0
    };
    let torn = |e: &SegmentEnd| matches!(e, SegmentEnd::Torn { .. });
    let corrupt = |e: &SegmentEnd| matches!(e, SegmentEnd::Corrupt { .. });
    // The segment's first batch damaged: weighed against prev_ts (500).
    for (claim, damage) in [(500, false), (501, true)] {
        let (f, at) = segment(500, &[frame(&txns(510), 520, 500), frame(&txns(530), 540, claim)]);
        let e = end_with(&f, at[0]);
        assert!(if damage { corrupt(&e) } else { torn(&e) }, "claim {claim}: {e:?}");
    }
    // After a batch whose last transaction (516) lies above its bound (515): weighed
    // against 516, not 515.
    for (claim, damage) in [(516, false), (517, true)] {
        let (f, at) =
            segment(500, &[frame(&txns(510), 515, 500), frame(&txns(530), 540, 500), frame(&txns(550), 560, claim)]);
        let e = end_with(&f, at[1]);
        assert!(if damage { corrupt(&e) } else { torn(&e) }, "claim {claim}: {e:?}");
    }
    // A valid header of version 5 after the damage: damage, whatever it would claim.
    let (v6, h6) = encode_batch(&txns(530), 540, false);
    let v5 = forge(BatchHeader { version: 5, ..h6 }, &v6[BATCH_HEADER_LEN..]);
    let (f, at) = segment(500, &[frame(&txns(510), 520, 500), v5]);
    let e = end_with(&f, at[0]);
    assert!(corrupt(&e), "{e:?}");
}

/// A later batch proves the damaged bytes synced only if it is whole and its payload
/// checks (its claim is covered by the payload checksum): one whose header checks out but
/// whose payload does not (torn too) claims nothing, however much it would claim.
#[test]
fn a_torn_later_batch_proves_nothing() {
    let frame = |ts0: u64, bound: u64, synced: u64| {
        let mut b = BatchBuilder::new();
        push_all(&mut b, &sample_txns(ts0, 3));
        let mut out = Vec::new();
        let marks = Marks { bound_ts: Ts(bound), synced_ts: Ts(synced), ..Marks::default() };
        b.finish_marked_into(STREAM, EPOCH, marks, false, &mut out);
        out
    };
    let mut f = SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 12, streams: 8, prev_ts: Ts(0) }.encode().to_vec();
    let first = f.len();
    f.extend_from_slice(&frame(10, 20, 0));
    let damaged = f.len();
    f.extend_from_slice(&frame(30, 40, 0));
    // Claims batch two synced, but its own payload is damaged.
    let later = f.len();
    f.extend_from_slice(&frame(50, 60, 40));
    f[damaged + BATCH_HEADER_LEN + 1] ^= 0x10;
    f[later + BATCH_HEADER_LEN + 1] ^= 0x10;
    let said = said_by_read(&f);
    assert_eq!(said_by_scan(&f).0, said);
    let (end, valid_len, kept) = said.unwrap();
    assert!(matches!(end, SegmentEnd::Torn { offset, .. } if offset == damaged as u64), "{end:?}");
    assert_eq!((valid_len, kept), (damaged as u64, vec![first as u64]));
    // Whole, the same claim proves it: damage.
    f[later + BATCH_HEADER_LEN + 1] ^= 0x10;
    let end = said_by_read(&f).unwrap().0;
    assert!(matches!(end, SegmentEnd::Corrupt { offset, .. } if offset == damaged as u64), "{end:?}");
}

/// An epoch's first segment names the checkpoint under the epoch in its `prev_ts`, not a
/// timestamp of the stream's batches: a damaged first batch there is weighed against
/// nothing before it (`SegmentHeader::epoch_ts_before`). A heartbeat at the checkpoint's
/// very bound, synced, then a batch claiming it synced: damage to the heartbeat is damage,
/// as it is in a segment whose `prev_ts` is 0; in a later segment (whose `prev_ts` is its
/// stream's last timestamp) the same claim proves nothing.
#[test]
fn an_epochs_first_segment_weighs_its_first_batch_against_nothing_before_it() {
    let frame = |txns: bool, bound: u64, synced: u64| {
        let mut b = BatchBuilder::new();
        if txns {
            push_all(&mut b, &sample_txns(bound - 5, 3));
        }
        let mut out = Vec::new();
        let marks = Marks { bound_ts: Ts(bound), synced_ts: Ts(synced), ..Marks::default() };
        b.finish_marked_into(STREAM, EPOCH, marks, false, &mut out);
        out
    };
    for (seq, damage) in [(1, true), (0, true), (2, false)] {
        let mut f = SegmentHeader { stream: STREAM, epoch: EPOCH, seq, streams: 8, prev_ts: Ts(500) }.encode().to_vec();
        let heartbeat = f.len();
        f.extend_from_slice(&frame(false, 500, 0));
        f.extend_from_slice(&frame(true, 520, 500));
        f[heartbeat + 20] ^= 0x10;
        let said = said_by_read(&f);
        assert_eq!(said_by_scan(&f).0, said, "seq {seq}");
        let end = said.unwrap().0;
        if damage {
            assert!(
                matches!(end, SegmentEnd::Corrupt { offset, .. } if offset == heartbeat as u64),
                "seq {seq}: {end:?}"
            );
        } else {
            assert!(matches!(end, SegmentEnd::Torn { offset, .. } if offset == heartbeat as u64), "seq {seq}: {end:?}");
        }
    }
}
