//! Feeds arbitrary bytes to the log codec's decoders (`decode_batch`, `read_segment`)
//! and checks that they never panic and that whatever they accept re-encodes to the same
//! transactions.
//!
//! Random bytes almost never carry valid CRC32Cs, which would confine the fuzzer to the
//! checksum checks. So the first input byte selects a mode that repairs checksums before
//! decoding, letting the fuzzer reach the payload parser and the LZ4 decompressor:
//!   bit 0: prepend a valid segment header (exercise `read_segment`'s batch walk)
//!   bit 1: recompute the header and payload checksums of the batch at the start
//!   bit 2: give that batch the segment's stream and epoch (before repairing checksums)
#![no_main]

use bytes::Bytes;
use ditto_log::format::{
    decode_batch, read_segment, Batch, BatchBuilder, Epoch, SegmentEnd, SegmentHeader, StreamId, BATCH_HEADER_FIXED_LEN,
    BATCH_HEADER_LEN, LOG_FORMAT_VERSION, SEGMENT_HEADER_LEN,
};
use libfuzzer_sys::fuzz_target;

const STREAM: StreamId = StreamId(7);
const EPOCH: Epoch = Epoch(3);

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let mut batch = data.to_vec();
    if mode & 4 != 0 && batch.len() >= 20 {
        batch[8..12].copy_from_slice(&STREAM.0.to_le_bytes());
        batch[12..20].copy_from_slice(&EPOCH.0.to_le_bytes());
    }
    if mode & 2 != 0 {
        fix_checksums(&mut batch);
    }

    let bytes = Bytes::from(batch.clone());
    if let Ok((b, used)) = decode_batch(&bytes) {
        assert_eq!(used, b.header.total_len());
        assert!(used <= bytes.len());
        check_reencodes(&b, &bytes[..used]);
    }

    let file = if mode & 1 != 0 {
        let seg = SegmentHeader { stream: STREAM, epoch: EPOCH, seq: 0, streams: STREAM.0 + 1, prev_ts: Default::default() };
        [&seg.encode()[..], &batch].concat()
    } else {
        batch
    };
    let file = Bytes::from(file);
    if let Ok(scan) = read_segment(&file) {
        let mut expect = SEGMENT_HEADER_LEN as u64;
        for (off, b) in &scan.batches {
            // Batches are reported back to back, each within the file.
            assert_eq!(*off, expect);
            assert_eq!(b.header.stream, scan.header.stream);
            assert_eq!(b.header.epoch, scan.header.epoch);
            expect += b.header.total_len() as u64;
            assert!(expect <= file.len() as u64);
            check_reencodes(b, &file[*off as usize..expect as usize]);
        }
        assert_eq!(scan.valid_len(), expect);
        match scan.end {
            SegmentEnd::Clean => assert_eq!(expect, file.len() as u64),
            SegmentEnd::Zeros { offset } => {
                assert_eq!(offset, expect);
                assert!(file[offset as usize..].iter().all(|&b| b == 0));
            }
            SegmentEnd::Torn { offset, .. } | SegmentEnd::Corrupt { offset, .. } => {
                assert_eq!(offset, expect);
                assert!(offset < file.len() as u64);
            }
        }
    }
});

/// Re-encodes a decoded batch and checks that it decodes to the same transactions. The
/// payload encoding is canonical (shortest varints, no slack), so the re-encoded payload
/// must equal the decoded one byte for byte, and an uncompressed batch must re-encode to
/// the same bytes altogether.
fn check_reencodes(batch: &Batch, original: &[u8]) {
    let h = &batch.header;
    let txns = batch.records();
    // The borrowed views (what recovery uses) agree with the owned records.
    let mut scratch = Vec::new();
    let view = batch.payload_in(&mut scratch);
    assert_eq!(view.as_slice(), &batch.payload()[..]);
    assert_eq!(view.txns().len(), txns.len());
    for (v, t) in view.txns().zip(&txns) {
        assert_eq!(v.ts, t.ts);
        let owned = t.writes.iter().map(|w| (w.table, w.rid, w.key.as_deref(), w.value.as_deref()));
        assert!(v.writes().map(|w| (w.table, w.rid, w.key, w.value)).eq(owned));
    }
    let mut builder = BatchBuilder::new();
    for t in &txns {
        builder.push_txn(t.ts, t.writes.iter().map(|w| (w.table, w.rid, w.key.as_deref(), w.value.as_deref())));
    }
    assert_eq!(builder.txn_count(), h.txn_count);
    assert_eq!(builder.payload_len(), h.raw_len as usize);
    assert_eq!(builder.payload(), view.as_slice());
    if !txns.is_empty() {
        assert_eq!(builder.first_ts(), Some(h.first_ts));
        assert_eq!(builder.last_ts(), Some(h.last_ts));
    }
    let mut out = Vec::new();
    let h2 = builder.finish_vouching_into(h.stream, h.epoch, h.bound_ts, h.floor_ts, h.compressed, &mut out);
    assert_eq!((h2.txn_count, h2.raw_len, h2.bound_ts, h2.floor_ts), (h.txn_count, h.raw_len, h.bound_ts, h.floor_ts));
    // The builder writes the current version: an older batch re-encodes to other header bytes.
    if !h.compressed && u32::from(h.version) == LOG_FORMAT_VERSION {
        assert_eq!(&out[..], original);
    }
    let (again, used) = decode_batch(&Bytes::from(out)).expect("re-encoded batch decodes");
    assert_eq!(used, h2.total_len());
    assert_eq!(again.records(), txns);
}

/// Makes the batch header at the start of `buf` carry correct checksums for its payload
/// (clamping `stored_len` to the bytes present), under the version the header names (2:
/// 64-byte header; any other: 72 bytes, the floor covered by the payload checksum).
fn fix_checksums(buf: &mut [u8]) {
    let v2 = buf.len() >= 6 && buf[4..6] == 2u16.to_le_bytes();
    let len = if v2 { BATCH_HEADER_FIXED_LEN } else { BATCH_HEADER_LEN };
    if buf.len() < len {
        return;
    }
    let avail = (buf.len() - len) as u32;
    let stored_len = u32::from_le_bytes([buf[52], buf[53], buf[54], buf[55]]).min(avail);
    buf[52..56].copy_from_slice(&stored_len.to_le_bytes());
    let end = len + stored_len as usize;
    let payload_crc = if v2 {
        crc32c::crc32c(&buf[len..end])
    } else {
        crc32c::crc32c(&buf[BATCH_HEADER_FIXED_LEN..end])
    };
    buf[56..60].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&buf[..60]);
    buf[60..64].copy_from_slice(&header_crc.to_le_bytes());
}
