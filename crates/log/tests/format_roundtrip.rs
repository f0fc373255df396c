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
    key: Vec<u8>,
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
            t.writes.iter().map(|w| (TableId(w.table), RecordId(w.rid), &w.key[..], w.value.as_deref())),
        );
    }
}

fn assert_same_txns(decoded: &[TxnRecord], expected: &[T]) {
    assert_eq!(decoded.len(), expected.len(), "txn count");
    for (d, e) in decoded.iter().zip(expected) {
        assert_eq!(d.ts, Ts(e.ts));
        assert_eq!(d.writes.len(), e.writes.len(), "write count of txn {}", e.ts);
        for (dw, ew) in d.writes.iter().zip(&e.writes) {
            assert_eq!(dw.table, TableId(ew.table));
            assert_eq!(dw.rid, RecordId(ew.rid));
            assert_eq!(&dw.key[..], &ew.key[..]);
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
/// offset of each batch. Reuses one builder, as the log writer does.
fn build_segment(batches: &[Vec<T>], compress: &[bool]) -> (Vec<u8>, Vec<u64>) {
    let mut file = SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 11 }.encode().to_vec();
    let mut offsets = Vec::new();
    let mut b = BatchBuilder::new();
    for (i, txns) in batches.iter().enumerate() {
        b.clear();
        push_all(&mut b, txns);
        offsets.push(file.len() as u64);
        let bound = txns.last().map_or(0, |t| t.ts);
        let h = b.finish_into(STREAM, EPOCH, Ts(bound), compress[i % compress.len()], &mut file);
        assert_eq!(file.len() as u64, offsets[i] + h.total_len() as u64);
    }
    (file, offsets)
}

/// Deterministic data for the damage tests: `n` txns starting at `ts0`, mixing puts,
/// deletes, empty keys and values, and some repetition so compression kicks in.
fn sample_txns(ts0: u64, n: usize) -> Vec<T> {
    (0..n)
        .map(|i| T {
            ts: ts0 + 3 * i as u64,
            writes: (0..(i % 4))
                .map(|j| W {
                    table: j as u32,
                    rid: (i * 100 + j) as u64,
                    key: format!("key-{i}-{j}").into_bytes(),
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
        assert_same_txns(&b.txns, &batches[i]);
    }
}

// ---------------------------------------------------------------------------------------
// 1. Property: round trip of batches and segments
// ---------------------------------------------------------------------------------------

fn arb_write() -> impl Strategy<Value = W> {
    (
        any::<u32>(),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..40),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
    )
        .prop_map(|(table, rid, key, value)| W { table, rid, key, value })
}

/// 1..20 txns with strictly increasing ts (starting anywhere, gaps of 1..1000).
fn arb_txns() -> impl Strategy<Value = Vec<T>> {
    (0u64..(1 << 40), prop::collection::vec((1u64..1000, prop::collection::vec(arb_write(), 0..10)), 1..20)).prop_map(
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
        // Trailing bytes after the batch are not part of it.
        let mut with_tail = bytes.clone();
        with_tail.extend_from_slice(b"trailing");
        for buf in [bytes, with_tail] {
            let (batch, used) = decode_batch(&Bytes::from(buf)).expect("decodes");
            prop_assert_eq!(used, h.total_len());
            prop_assert_eq!(batch.header, h);
            assert_same_txns(&batch.txns, &txns);
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
        prop_assert_eq!(scan.header, SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 11 });
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
        assert!(batch.txns.is_empty());
    }
    // A segment of heartbeats only.
    let (file, offsets) = build_segment(&[vec![], vec![], vec![]], &[true]);
    let scan = read_segment(&Bytes::from(file)).unwrap();
    assert_eq!(scan.end, SegmentEnd::Clean);
    assert_eq!(offsets, vec![48, 112, 176]);
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
    assert_same_txns(&decode_batch(&Bytes::from(out)).unwrap().0.txns, &again);
}

#[test]
#[should_panic(expected = "not above previous")]
fn push_txn_rejects_non_increasing_ts() {
    let mut b = BatchBuilder::new();
    b.push_txn(Ts(5), std::iter::empty());
    b.push_txn(Ts(5), std::iter::empty());
}

/// An iterator whose `len()` is wrong: the builder must encode what it yields.
struct LyingLen<I>(I);
impl<I: Iterator> Iterator for LyingLen<I> {
    type Item = I::Item;
    fn next(&mut self) -> Option<I::Item> {
        self.0.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (5, Some(5))
    }
}
impl<I: Iterator> ExactSizeIterator for LyingLen<I> {}

#[test]
fn write_count_is_what_was_written() {
    let w = [(TableId(1), RecordId(1), &b"a"[..], Some(&b"x"[..])), (TableId(1), RecordId(2), &b"b"[..], None)];
    let mut b = BatchBuilder::new();
    b.push_txn(Ts(1), LyingLen(w.into_iter()));
    let mut out = Vec::new();
    b.finish_into(STREAM, EPOCH, Ts(1), false, &mut out);
    let (batch, _) = decode_batch(&Bytes::from(out)).unwrap();
    assert_eq!(batch.txns[0].writes.len(), 2);
    assert_eq!(batch.txns[0].writes[1].value, None);
}

#[test]
fn compression_shrinks_repetitive_payload() {
    let txns: Vec<T> = (0..100)
        .map(|i| T {
            ts: 1000 + i,
            writes: vec![W {
                table: 1,
                rid: i,
                key: format!("customer:{:08}", i % 10).into_bytes(),
                value: Some(b"the same value again and again ".repeat(8)),
            }],
        })
        .collect();
    let (bytes, h) = encode_batch(&txns, 1099, true);
    assert!(h.compressed);
    assert!(h.stored_len < h.raw_len / 2, "stored {} raw {}", h.stored_len, h.raw_len);
    let (batch, _) = decode_batch(&Bytes::from(bytes)).unwrap();
    assert_same_txns(&batch.txns, &txns);
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
            key: noise[4000..].to_vec(),
            value: Some(noise[..4000].to_vec()),
        }],
    }];
    let (bytes, h) = encode_batch(&txns, 1, true);
    assert!(!h.compressed);
    assert_eq!(h.stored_len, h.raw_len);
    assert_same_txns(&decode_batch(&Bytes::from(bytes)).unwrap().0.txns, &txns);
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
                    SegmentEnd::Torn { offset, reason } => {
                        assert_eq!(*offset, offsets[i], "len {len}");
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

    // Preallocated / extended file: zeros after the last complete batch.
    let mut padded = file.clone();
    padded.resize(file.len() + 4096, 0);
    let scan = read_segment(&Bytes::from(padded)).unwrap();
    assert_eq!(scan.end, SegmentEnd::Torn { offset: file.len() as u64, reason: FormatError::BadMagic });
    assert_prefix(&scan, &batches, &offsets, 3);
    assert_eq!(scan.valid_len(), file.len() as u64);

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
    h.payload_crc = crc32c::crc32c(payload);
    let mut v = h.encode().to_vec();
    v.extend_from_slice(payload);
    v
}

fn header(txn_count: u32, first: u64, last: u64, raw_len: u32) -> BatchHeader {
    BatchHeader {
        stream: STREAM,
        epoch: EPOCH,
        compressed: false,
        first_ts: Ts(first),
        last_ts: Ts(last),
        bound_ts: Ts(last),
        txn_count,
        raw_len,
        stored_len: 0,
        payload_crc: 0,
    }
}

/// (op, key, value) of a hand-encoded write.
type RawWrite<'a> = (u8, &'a [u8], Option<&'a [u8]>);

/// Hand-encodes one txn (table 1, rid 2 for every write), bypassing the builder's checks.
fn txn_bytes(ts: u64, writes: &[RawWrite]) -> Vec<u8> {
    let mut v = ts.to_le_bytes().to_vec();
    v.extend_from_slice(&(writes.len() as u32).to_le_bytes());
    for (op, key, value) in writes {
        v.push(*op);
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&2u64.to_le_bytes());
        v.extend_from_slice(&(key.len() as u32).to_le_bytes());
        v.extend_from_slice(key);
        if let Some(val) = value {
            v.extend_from_slice(&(val.len() as u32).to_le_bytes());
            v.extend_from_slice(val);
        }
    }
    v
}

fn decode_err(bytes: Vec<u8>) -> FormatError {
    decode_batch(&Bytes::from(bytes)).expect_err("must not decode")
}

#[test]
fn forged_batches_are_rejected() {
    let t1 = txn_bytes(5, &[(0, b"k", Some(b"v")), (1, b"gone", None)]);
    let t2 = txn_bytes(9, &[]);
    let both = [t1.clone(), t2.clone()].concat();
    let n = both.len() as u32;

    // The forge itself is sound: a correct batch decodes.
    let (ok, _) = decode_batch(&Bytes::from(forge(header(2, 5, 9, n), &both))).unwrap();
    assert_eq!(ok.txns.len(), 2);
    assert_eq!(ok.txns[0].writes[1].value, None);
    assert_eq!(ok.txns[0].writes[0].value.as_deref(), Some(&b"v"[..]));

    let malformed = |e: FormatError| matches!(e, FormatError::Malformed(_));
    // Non-increasing ts.
    let dup = [t1.clone(), t1.clone()].concat();
    assert!(malformed(decode_err(forge(header(2, 5, 5, dup.len() as u32), &dup))));
    let rev = [t2.clone(), t1.clone()].concat();
    assert!(malformed(decode_err(forge(header(2, 9, 5, n), &rev))));
    assert!(malformed(decode_err(forge(header(2, 9, 9, n), &rev))));
    // first_ts / last_ts not matching the txns.
    assert!(malformed(decode_err(forge(header(2, 4, 9, n), &both))));
    assert!(malformed(decode_err(forge(header(2, 5, 10, n), &both))));
    // Trailing bytes, and too few bytes for txn_count.
    let mut trailing = both.clone();
    trailing.push(0);
    assert!(malformed(decode_err(forge(header(2, 5, 9, n + 1), &trailing))));
    assert!(malformed(decode_err(forge(header(3, 5, 9, n), &both))));
    // Unknown op.
    let bad_op = txn_bytes(5, &[(2, b"k", None)]);
    assert!(malformed(decode_err(forge(header(1, 5, 5, bad_op.len() as u32), &bad_op))));
    // raw_len != stored_len for an uncompressed batch.
    assert!(malformed(decode_err(forge(header(2, 5, 9, n + 3), &both))));
    // Empty batch with ts set.
    assert!(malformed(decode_err(forge(header(0, 5, 5, 0), &[]))));
    // Oversize key, refused before reading it.
    let mut huge_key = txn_bytes(5, &[(1, b"", None)]);
    let kl = huge_key.len() - 4;
    huge_key[kl..].copy_from_slice(&(MAX_KEY_LEN as u32 + 1).to_le_bytes());
    let e = decode_err(forge(header(1, 5, 5, huge_key.len() as u32), &huge_key));
    assert!(matches!(e, FormatError::TooLarge { what: "key_len", .. }), "{e:?}");
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
    // Future version.
    v[7] = 0;
    v[4] = 2;
    let crc = crc32c::crc32c(&v[..60]);
    v[60..64].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(decode_err(v), FormatError::UnsupportedVersion(2));
}

#[test]
fn checksum_valid_bad_last_batch_is_corrupt_not_torn() {
    let batches = three_batches();
    let (file, offsets) = build_segment(&batches[..2], &[false]);
    let t = txn_bytes(500, &[(0, b"k", Some(b"v"))]);
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

#[test]
fn segment_header_round_trip_and_errors() {
    let h = SegmentHeader { stream: StreamId(u32::MAX), epoch: Epoch(u64::MAX - 1), seq: 12345 };
    let b = h.encode();
    assert_eq!(&b[..8], b"DITTOLOG");
    assert_eq!(&b[8..12], &LOG_FORMAT_VERSION.to_le_bytes());
    assert!(b[32..44].iter().all(|&x| x == 0));
    assert_eq!(SegmentHeader::decode(&b), Ok(h));
    assert_eq!(SegmentHeader::decode(&b[..47]), Err(FormatError::Truncated { needed: 48, available: 47 }));
    let mut bad = b;
    bad[0] = b'X';
    assert_eq!(SegmentHeader::decode(&bad), Err(FormatError::BadMagic));
    let mut bad = b;
    bad[30] ^= 1;
    assert!(matches!(SegmentHeader::decode(&bad), Err(FormatError::HeaderChecksum { .. })));
    let mut bad = b;
    bad[8] = 2;
    let crc = crc32c::crc32c(&bad[..44]);
    bad[44..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(SegmentHeader::decode(&bad), Err(FormatError::UnsupportedVersion(2)));
}

#[test]
fn batch_header_layout_is_as_documented() {
    let txns = sample_txns(77, 3);
    let (bytes, h) = encode_batch(&txns, 1234, false);
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    assert_eq!(&bytes[..4], b"DBAT");
    assert_eq!(&bytes[4..6], &1u16.to_le_bytes());
    assert_eq!((bytes[6], bytes[7]), (0, 0));
    assert_eq!(u32_at(8), STREAM.0);
    assert_eq!(u64_at(12), EPOCH.0);
    assert_eq!(u64_at(20), 77);
    assert_eq!(u64_at(28), 83);
    assert_eq!(u64_at(36), 1234);
    assert_eq!(u32_at(44), 3);
    assert_eq!(u32_at(48), h.raw_len);
    assert_eq!(u32_at(52), h.stored_len);
    assert_eq!(u32_at(56), crc32c::crc32c(&bytes[64..]));
    assert_eq!(u32_at(60), crc32c::crc32c(&bytes[..60]));
    // First txn: ts u64, write_count u32 (sample txn 0 has no writes), then txn 1.
    assert_eq!(u64_at(64), 77);
    assert_eq!(u32_at(72), 0);
    assert_eq!(u64_at(76), 80);
    assert_eq!(u32_at(84), 1);
    assert_eq!(bytes[88], 0, "op of txn 1's write: (1+0)%3 == 1 is a put");
    assert_eq!(u32_at(89), 0, "table");
    assert_eq!(u64_at(93), 100, "rid");
    assert_eq!(u32_at(101), 7, "key_len of \"key-1-0\"");
    assert_eq!(&bytes[105..112], b"key-1-0");
    assert_eq!(u32_at(112), 0, "value_len of the empty value");
    assert_eq!(decode_batch_header(&bytes), Ok(h));
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
    assert_eq!(batch.txns.len(), batch.header.txn_count as usize);
    let mut b = BatchBuilder::new();
    for t in &batch.txns {
        b.push_txn(t.ts, t.writes.iter().map(|w| (w.table, w.rid, &w.key[..], w.value.as_deref())));
    }
    assert_eq!(b.payload_len(), batch.header.raw_len as usize);
    let mut out = Vec::new();
    b.finish_into(batch.header.stream, batch.header.epoch, batch.header.bound_ts, false, &mut out);
    let (again, _) = decode_batch(&Bytes::from(out)).unwrap();
    assert_eq!(again.txns, batch.txns);
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
        let mut seg = SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 0 }.encode().to_vec();
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
                assert_same_txns(&b.txns, &batches[i]);
            }
            if scan.end == SegmentEnd::Clean {
                prop_assert_eq!(scan.valid_len(), damaged.len() as u64);
            }
        }
    }
}
