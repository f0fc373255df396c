//! The redo-log wire format
//! ========================
//!
//! What
//! ----
//! This module is the codec, and only the codec, for ditto's redo log: it turns committed
//! transactions into bytes (`BatchBuilder`), bytes back into transactions (`decode_batch`),
//! and a whole segment file into "these batches, then this kind of ending"
//! (`read_segment`). It performs no I/O. The byte-by-byte layout is specified in
//! `docs/log-format.md`; the constants and `encode`/`decode` functions below are the
//! executable form of that document and must change together with it.
//!
//! A log is a set of *streams* (one per worker). A stream is a sequence of *segment
//! files*; each starts with a 48-byte `SegmentHeader` and continues with *batches* back to
//! back. A batch is the unit of group commit: a 64-byte header followed by a payload of
//! transactions, optionally LZ4-compressed as a whole.
//!
//! Why it looks like this
//! ----------------------
//! * **One checksum per batch header and one per payload** (CRC32C, hardware-accelerated).
//!   The header checksum lets a reader trust `stored_len` before it looks at the payload,
//!   so a corrupt length can never send it reading (or allocating) gigabytes. It is also
//!   what makes "is there a valid batch further on?" cheap to answer when classifying a
//!   damaged tail.
//! * **Compression per batch, not per write.** Writes of one batch are often similar (same
//!   tables, neighbouring keys), small values compress poorly alone, and one LZ4 call per
//!   group commit is cheap. The raw length is stored in the header, so decompression needs
//!   exactly one allocation. When LZ4 does not shrink the payload it is stored raw.
//! * **Zero-copy decode.** Decoded keys and values are `Bytes` slices of the (decompressed)
//!   payload, which is itself a slice of the file buffer when uncompressed: recovery of an
//!   uncompressed segment performs no per-write copies, only reference-count increments.
//! * **Encode appends into reusable buffers.** `BatchBuilder` keeps its payload `Vec`
//!   across batches, and `finish_into` compresses straight into the caller's output `Vec`,
//!   so the commit path allocates nothing in the steady state.
//! * **Little endian, fixed widths, no varints.** Parsing is a handful of bounds-checked
//!   loads; the space varints would save is mostly recovered by LZ4 anyway.
//!
//! Invariants
//! ----------
//! Enforced by the encoder (panics: they are programming errors) and checked by the
//! decoder (errors: the bytes cannot be trusted):
//! * transactions in a batch have strictly increasing `ts`; `first_ts`/`last_ts` are the
//!   ts of the first/last transaction, both 0 for a batch with no transactions
//!   (a *heartbeat*, which only advances `bound_ts`);
//! * `bound_ts` is *not* related to `last_ts`: a writer may include transactions whose ts
//!   is above the bound it can prove;
//! * the payload is consumed exactly (no trailing bytes), lengths respect the `MAX_*`
//!   limits, and the decoder refuses oversize lengths before allocating anything;
//! * within one segment every batch carries the segment's stream id and epoch
//!   (checked by `read_segment`, not by `decode_batch`, which does not know the segment).
//!
//! The torn-vs-corrupt rule (`read_segment`): at the first batch that fails to decode, if
//! a valid batch header of this segment follows anywhere later, the damage is in the
//! middle (`SegmentEnd::Corrupt`); otherwise it is a torn or zero-filled tail
//! (`SegmentEnd::Torn`) that the caller may truncate away. A failure in a batch whose
//! checksums verify cannot come from a torn write, so it is always `Corrupt`.
//!
//! Non-goals
//! ---------
//! * I/O, fsync, segment rotation and naming, and deciding whether `Torn` is acceptable
//!   (only in a stream's last segment) all belong to the caller.
//! * Cross-batch invariants (ts increasing across batches, `bound_ts` monotone) are stream
//!   semantics and are left to recovery.
//! * No attempt to salvage data after a corrupt point, and no backwards compatibility
//!   machinery beyond the version fields (there is exactly one version).

use bytes::Bytes;
use ditto_engine::{RecordId, TableId, Ts};

/// Identifies a log stream (one per worker; see `ditto_engine::WorkerId`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

/// A log generation. A new epoch starts (in new segments) every time the database
/// reopens the log, so bytes left behind by an earlier incarnation are recognisable.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub u64);

/// The format version written in segment headers (u32) and batch headers (u16).
pub const LOG_FORMAT_VERSION: u32 = 1;
pub const SEGMENT_MAGIC: [u8; 8] = *b"DITTOLOG";
pub const BATCH_MAGIC: [u8; 4] = *b"DBAT";
pub const SEGMENT_HEADER_LEN: usize = 48;
pub const BATCH_HEADER_LEN: usize = 64;

/// Largest key a write may carry.
pub const MAX_KEY_LEN: usize = 64 * 1024;
/// Largest value a write may carry.
pub const MAX_VALUE_LEN: usize = 64 * 1024 * 1024;
/// Largest uncompressed payload of one batch.
pub const MAX_RAW_LEN: usize = 256 * 1024 * 1024;
/// Largest stored (possibly compressed) payload of one batch.
pub const MAX_STORED_LEN: usize = 256 * 1024 * 1024;

/// Bytes a transaction occupies in a payload before its writes: ts u64, write_count u32.
pub const TXN_HEADER_LEN: usize = 12;
/// Smallest encoded write: a delete with an empty key (op, table, rid, key_len).
const MIN_WRITE_LEN: usize = 1 + 4 + 8 + 4;

/// Batch header flag: the payload is one LZ4 block.
const FLAG_COMPRESSED: u8 = 1;
const OP_PUT: u8 = 0;
const OP_DELETE: u8 = 1;

/// LZ4 cannot expand more than 255 output bytes per input byte (a 0xFF length byte is
/// worth 255 bytes of match), so a header claiming more is lying: refuse it before
/// allocating `raw_len` bytes.
const LZ4_MAX_RATIO: u64 = 255;

/// Bytes one write occupies in an uncompressed payload. Lets callers check a transaction
/// against `MAX_RAW_LEN` before handing it to `BatchBuilder::push_txn`.
pub const fn write_encoded_len(key_len: usize, value_len: Option<usize>) -> usize {
    match value_len {
        Some(v) => MIN_WRITE_LEN + key_len + 4 + v,
        None => MIN_WRITE_LEN + key_len,
    }
}

/// Why bytes could not be decoded. Every variant means the bytes themselves are bad (or
/// missing); see `is_retryable`.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u32),
    #[error("unknown flags {0:#04x}")]
    BadFlags(u8),
    #[error("header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderChecksum { stored: u32, computed: u32 },
    #[error("payload checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    PayloadChecksum { stored: u32, computed: u32 },
    #[error("{what} of {len} exceeds the limit of {max}")]
    TooLarge { what: &'static str, len: u64, max: u64 },
    #[error("LZ4 decompression failed: {0}")]
    Decompress(String),
    #[error("malformed: {0}")]
    Malformed(&'static str),
    #[error("batch belongs to stream {found}, segment to stream {expected}")]
    StreamMismatch { expected: u32, found: u32 },
    #[error("batch belongs to epoch {found}, segment to epoch {expected}")]
    EpochMismatch { expected: u64, found: u64 },
}

impl FormatError {
    /// Whether reading the same bytes again could succeed. Always false: every variant
    /// describes the bytes, not the act of reading them. (I/O errors, which can be
    /// transient, are the caller's and never become a `FormatError`.)
    pub fn is_retryable(&self) -> bool {
        // Exhaustive on purpose: a new variant must decide.
        match self {
            FormatError::Truncated { .. }
            | FormatError::BadMagic
            | FormatError::UnsupportedVersion(_)
            | FormatError::BadFlags(_)
            | FormatError::HeaderChecksum { .. }
            | FormatError::PayloadChecksum { .. }
            | FormatError::TooLarge { .. }
            | FormatError::Decompress(_)
            | FormatError::Malformed(_)
            | FormatError::StreamMismatch { .. }
            | FormatError::EpochMismatch { .. } => false,
        }
    }

    /// Whether a crash during a write could have produced this error: missing bytes, or
    /// bytes that do not match their checksum. Anything else was detected *after* the
    /// checksums verified, so the bytes are exactly what some writer wrote, and a torn
    /// write cannot explain them.
    fn could_be_torn(&self) -> bool {
        matches!(
            self,
            FormatError::Truncated { .. }
                | FormatError::BadMagic
                | FormatError::HeaderChecksum { .. }
                | FormatError::PayloadChecksum { .. }
        )
    }
}

// Fixed-offset little-endian loads from fixed-size arrays. The offsets are constants, so
// the bounds checks are resolved at compile time; there is nothing to unwrap.
#[inline(always)]
fn le16<const N: usize>(b: &[u8; N], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
#[inline(always)]
fn le32<const N: usize>(b: &[u8; N], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
#[inline(always)]
fn le64<const N: usize>(b: &[u8; N], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
#[inline(always)]
fn put<const N: usize, const M: usize>(b: &mut [u8; N], at: usize, v: [u8; M]) {
    b[at..at + M].copy_from_slice(&v);
}

// ---------------------------------------------------------------------------------------
// Segment header
// ---------------------------------------------------------------------------------------

/// The 48 bytes at offset 0 of every segment file.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct SegmentHeader {
    pub stream: StreamId,
    pub epoch: Epoch,
    /// Position of this segment within its stream, from 0.
    pub seq: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        put(&mut b, 0, SEGMENT_MAGIC);
        put(&mut b, 8, LOG_FORMAT_VERSION.to_le_bytes());
        put(&mut b, 12, self.stream.0.to_le_bytes());
        put(&mut b, 16, self.epoch.0.to_le_bytes());
        put(&mut b, 24, self.seq.to_le_bytes());
        // 32..44 reserved, already zero.
        let crc = crc32c::crc32c(&b[..44]);
        put(&mut b, 44, crc.to_le_bytes());
        b
    }

    /// Decodes the header at the start of `buf` (which may extend beyond it).
    pub fn decode(buf: &[u8]) -> Result<Self, FormatError> {
        let b: &[u8; SEGMENT_HEADER_LEN] =
            buf.first_chunk().ok_or(FormatError::Truncated { needed: SEGMENT_HEADER_LEN, available: buf.len() })?;
        if b[..8] != SEGMENT_MAGIC {
            return Err(FormatError::BadMagic);
        }
        // Checksum before version: the magic and checksum positions are fixed for all
        // versions, so a damaged header is reported as damaged, not as "from the future".
        let stored = le32(b, 44);
        let computed = crc32c::crc32c(&b[..44]);
        if stored != computed {
            return Err(FormatError::HeaderChecksum { stored, computed });
        }
        let version = le32(b, 8);
        if version != LOG_FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion(version));
        }
        if b[32..44].iter().any(|&x| x != 0) {
            return Err(FormatError::Malformed("segment header reserved bytes are not zero"));
        }
        Ok(SegmentHeader { stream: StreamId(le32(b, 12)), epoch: Epoch(le64(b, 16)), seq: le64(b, 24) })
    }
}

// ---------------------------------------------------------------------------------------
// Batch header
// ---------------------------------------------------------------------------------------

/// The 64-byte header in front of every batch's payload.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchHeader {
    pub stream: StreamId,
    pub epoch: Epoch,
    /// The payload is one LZ4 block (`stored_len` bytes decompressing to `raw_len`).
    pub compressed: bool,
    /// Ts of the first transaction; 0 when `txn_count == 0`.
    pub first_ts: Ts,
    /// Ts of the last transaction; 0 when `txn_count == 0`.
    pub last_ts: Ts,
    /// Every transaction of this stream with ts <= `bound_ts` is in this batch or an
    /// earlier one.
    pub bound_ts: Ts,
    pub txn_count: u32,
    /// Uncompressed payload length.
    pub raw_len: u32,
    /// Payload bytes following the header.
    pub stored_len: u32,
    /// CRC32C of the stored payload bytes.
    pub payload_crc: u32,
}

impl BatchHeader {
    /// Header plus stored payload: the bytes this batch occupies in a segment.
    pub fn total_len(&self) -> usize {
        BATCH_HEADER_LEN + self.stored_len as usize
    }

    /// Serializes the header, computing the header checksum. Does not validate: the
    /// encoder only builds consistent headers, and tests need to build inconsistent ones.
    pub fn encode(&self) -> [u8; BATCH_HEADER_LEN] {
        let mut b = [0u8; BATCH_HEADER_LEN];
        put(&mut b, 0, BATCH_MAGIC);
        put(&mut b, 4, (LOG_FORMAT_VERSION as u16).to_le_bytes());
        b[6] = if self.compressed { FLAG_COMPRESSED } else { 0 };
        // b[7] reserved, zero.
        put(&mut b, 8, self.stream.0.to_le_bytes());
        put(&mut b, 12, self.epoch.0.to_le_bytes());
        put(&mut b, 20, self.first_ts.0.to_le_bytes());
        put(&mut b, 28, self.last_ts.0.to_le_bytes());
        put(&mut b, 36, self.bound_ts.0.to_le_bytes());
        put(&mut b, 44, self.txn_count.to_le_bytes());
        put(&mut b, 48, self.raw_len.to_le_bytes());
        put(&mut b, 52, self.stored_len.to_le_bytes());
        put(&mut b, 56, self.payload_crc.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        put(&mut b, 60, crc.to_le_bytes());
        b
    }
}

/// Decodes and validates the batch header at the start of `buf`: magic, header checksum,
/// version, flags, reserved byte, size limits, and the consistency of the header fields
/// among themselves. Does not look at the payload.
pub fn decode_batch_header(buf: &[u8]) -> Result<BatchHeader, FormatError> {
    let b: &[u8; BATCH_HEADER_LEN] =
        buf.first_chunk().ok_or(FormatError::Truncated { needed: BATCH_HEADER_LEN, available: buf.len() })?;
    if b[..4] != BATCH_MAGIC {
        return Err(FormatError::BadMagic);
    }
    // Checksum first (see SegmentHeader::decode): everything reported after this point
    // is about bytes a writer deliberately produced.
    let stored = le32(b, 60);
    let computed = crc32c::crc32c(&b[..60]);
    if stored != computed {
        return Err(FormatError::HeaderChecksum { stored, computed });
    }
    let version = le16(b, 4);
    if u32::from(version) != LOG_FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion(version.into()));
    }
    let flags = b[6];
    if flags & !FLAG_COMPRESSED != 0 {
        return Err(FormatError::BadFlags(flags));
    }
    if b[7] != 0 {
        return Err(FormatError::Malformed("batch header reserved byte is not zero"));
    }
    let h = BatchHeader {
        stream: StreamId(le32(b, 8)),
        epoch: Epoch(le64(b, 12)),
        compressed: flags & FLAG_COMPRESSED != 0,
        first_ts: Ts(le64(b, 20)),
        last_ts: Ts(le64(b, 28)),
        bound_ts: Ts(le64(b, 36)),
        txn_count: le32(b, 44),
        raw_len: le32(b, 48),
        stored_len: le32(b, 52),
        payload_crc: le32(b, 56),
    };
    check_len("raw_len", h.raw_len, MAX_RAW_LEN)?;
    check_len("stored_len", h.stored_len, MAX_STORED_LEN)?;
    let (raw, stored) = (u64::from(h.raw_len), u64::from(h.stored_len));
    if h.compressed {
        if raw > stored * LZ4_MAX_RATIO {
            return Err(FormatError::Malformed("raw_len is impossible for stored_len"));
        }
    } else if raw != stored {
        return Err(FormatError::Malformed("uncompressed batch with raw_len != stored_len"));
    }
    if h.txn_count == 0 {
        if h.first_ts != Ts(0) || h.last_ts != Ts(0) || h.raw_len != 0 {
            return Err(FormatError::Malformed("empty batch with non-zero ts or payload"));
        }
    } else {
        if h.first_ts > h.last_ts {
            return Err(FormatError::Malformed("first_ts > last_ts"));
        }
        // Also bounds what decode_batch pre-allocates for the transaction list.
        if u64::from(h.txn_count) * TXN_HEADER_LEN as u64 > raw {
            return Err(FormatError::Malformed("txn_count too large for raw_len"));
        }
    }
    Ok(h)
}

fn check_len(what: &'static str, len: u32, max: usize) -> Result<(), FormatError> {
    if len as usize > max {
        return Err(FormatError::TooLarge { what, len: len.into(), max: max as u64 });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------

/// Accumulates transactions for one batch; reused across batches (`clear()`), so that in
/// the steady state encoding allocates nothing.
#[derive(Debug, Default, Clone)]
pub struct BatchBuilder {
    /// The uncompressed payload so far.
    payload: Vec<u8>,
    txn_count: u32,
    first_ts: Option<Ts>,
    last_ts: Option<Ts>,
}

impl BatchBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.txn_count == 0
    }

    pub fn txn_count(&self) -> u32 {
        self.txn_count
    }

    /// Uncompressed payload bytes accumulated so far (the batch's `raw_len`).
    pub fn payload_len(&self) -> usize {
        self.payload.len()
    }

    /// The uncompressed payload accumulated so far, exactly as it will be framed.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    pub fn first_ts(&self) -> Option<Ts> {
        self.first_ts
    }

    pub fn last_ts(&self) -> Option<Ts> {
        self.last_ts
    }

    /// Appends one transaction. `writes` yields (table, rid, key, value); `None` is a
    /// delete (tombstone).
    ///
    /// # Panics
    /// If `ts` is not greater than the previous transaction's, if a key or value exceeds
    /// `MAX_KEY_LEN`/`MAX_VALUE_LEN`, or if the payload would exceed `MAX_RAW_LEN`. These
    /// would produce a batch that no reader accepts, so they are caller bugs: check sizes
    /// (see `write_encoded_len`) before committing. The builder is left unchanged by a
    /// failed ts check but may hold a partial transaction after a failed size check.
    pub fn push_txn<'a, I>(&mut self, ts: Ts, writes: I)
    where
        I: ExactSizeIterator<Item = (TableId, RecordId, &'a [u8], Option<&'a [u8]>)>,
    {
        if let Some(last) = self.last_ts {
            assert!(ts > last, "log: txn ts {ts:?} not above previous {last:?} in batch");
        }
        assert!(self.txn_count < u32::MAX, "log: more than u32::MAX txns in one batch");

        let p = &mut self.payload;
        p.reserve(TXN_HEADER_LEN + writes.len().saturating_mul(MIN_WRITE_LEN));
        p.extend_from_slice(&ts.0.to_le_bytes());
        // The count is patched in after the loop: `len()` sizes the reservation, but the
        // count written is the number of writes actually encoded, so an iterator that
        // misreports its length cannot produce an undecodable batch.
        let count_at = p.len();
        p.extend_from_slice(&[0; 4]);
        let mut write_count: u32 = 0;
        for (table, rid, key, value) in writes {
            assert!(key.len() <= MAX_KEY_LEN, "log: key of {} bytes too long", key.len());
            // One fixed-size record per write, copied in one go, then the variable parts.
            let mut fixed = [0u8; MIN_WRITE_LEN];
            fixed[0] = if value.is_some() { OP_PUT } else { OP_DELETE };
            put(&mut fixed, 1, table.0.to_le_bytes());
            put(&mut fixed, 5, rid.0.to_le_bytes());
            put(&mut fixed, 13, (key.len() as u32).to_le_bytes());
            p.reserve(write_encoded_len(key.len(), value.map(<[u8]>::len)));
            p.extend_from_slice(&fixed);
            p.extend_from_slice(key);
            if let Some(v) = value {
                assert!(v.len() <= MAX_VALUE_LEN, "log: value of {} bytes too long", v.len());
                p.extend_from_slice(&(v.len() as u32).to_le_bytes());
                p.extend_from_slice(v);
            }
            write_count = write_count.checked_add(1).expect("log: more than u32::MAX writes in one txn");
        }
        p[count_at..count_at + 4].copy_from_slice(&write_count.to_le_bytes());
        assert!(p.len() <= MAX_RAW_LEN, "log: batch payload of {} bytes exceeds MAX_RAW_LEN", p.len());
        self.txn_count += 1;
        self.first_ts.get_or_insert(ts);
        self.last_ts = Some(ts);
    }

    /// Frames the accumulated transactions as one batch appended to `out` (header, then
    /// payload), LZ4-compressing the payload when `compress` is true and that makes it
    /// smaller. Returns the header written. Does not clear the builder.
    pub fn finish_into(
        &self,
        stream: StreamId,
        epoch: Epoch,
        bound_ts: Ts,
        compress: bool,
        out: &mut Vec<u8>,
    ) -> BatchHeader {
        let raw = &self.payload[..];
        let start = out.len();
        let body = start + BATCH_HEADER_LEN;
        // Reserve header space now and fill it in last, once the payload is known; the
        // compressor writes straight into `out`, avoiding a scratch buffer and a copy.
        out.resize(body, 0);
        let mut compressed = false;
        if compress && !raw.is_empty() {
            out.resize(body + lz4_flex::block::get_maximum_output_size(raw.len()), 0);
            match lz4_flex::block::compress_into(raw, &mut out[body..]) {
                Ok(n) if n < raw.len() => {
                    out.truncate(body + n);
                    compressed = true;
                }
                // Did not shrink (or could not compress at all): store raw.
                _ => out.truncate(body),
            }
        }
        if !compressed {
            out.extend_from_slice(raw);
        }
        let stored = &out[body..];
        let header = BatchHeader {
            stream,
            epoch,
            compressed,
            first_ts: self.first_ts.unwrap_or(Ts(0)),
            last_ts: self.last_ts.unwrap_or(Ts(0)),
            bound_ts,
            txn_count: self.txn_count,
            // Both fit: push_txn keeps raw <= MAX_RAW_LEN and compressed < raw.
            raw_len: raw.len() as u32,
            stored_len: stored.len() as u32,
            payload_crc: crc32c::crc32c(stored),
        };
        out[start..body].copy_from_slice(&header.encode());
        header
    }

    /// Forgets the accumulated transactions, keeping the buffer for the next batch.
    pub fn clear(&mut self) {
        self.payload.clear();
        self.txn_count = 0;
        self.first_ts = None;
        self.last_ts = None;
    }
}

// ---------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------

/// One transaction as read back from the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnRecord {
    pub ts: Ts,
    pub writes: Vec<WriteRecord>,
}

/// One write as read back from the log. `key` and `value` are zero-copy slices of the
/// batch's (decompressed) payload; holding one keeps that whole payload alive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    pub table: TableId,
    pub rid: RecordId,
    pub key: Bytes,
    /// `None` is a delete (tombstone).
    pub value: Option<Bytes>,
}

/// One decoded batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub header: BatchHeader,
    pub txns: Vec<TxnRecord>,
}

/// Decodes one whole batch at the start of `buf`: header, payload checksum,
/// decompression, transactions. Returns the batch and the bytes it occupies
/// (`BATCH_HEADER_LEN + stored_len`); `buf` may continue beyond it.
pub fn decode_batch(buf: &Bytes) -> Result<(Batch, usize), FormatError> {
    let header = decode_batch_header(buf)?;
    let total = header.total_len();
    if buf.len() < total {
        return Err(FormatError::Truncated { needed: total, available: buf.len() });
    }
    let stored = buf.slice(BATCH_HEADER_LEN..total);
    let computed = crc32c::crc32c(&stored);
    if computed != header.payload_crc {
        return Err(FormatError::PayloadChecksum { stored: header.payload_crc, computed });
    }
    let payload = if header.compressed {
        // raw_len was bounded by decode_batch_header, so this allocation is too.
        let mut raw = vec![0u8; header.raw_len as usize];
        let n =
            lz4_flex::block::decompress_into(&stored, &mut raw).map_err(|e| FormatError::Decompress(e.to_string()))?;
        if n != raw.len() {
            return Err(FormatError::Malformed("decompressed length differs from raw_len"));
        }
        Bytes::from(raw)
    } else {
        stored
    };
    let txns = parse_payload(&header, &payload)?;
    Ok((Batch { header, txns }, total))
}

/// A cursor over a checksum-verified payload. Running out of bytes here is `Malformed`,
/// never `Truncated`: the payload is complete, it is its contents that are inconsistent
/// (and `Truncated` would wrongly suggest a torn write).
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

const SHORT_PAYLOAD: FormatError = FormatError::Malformed("payload ends inside a record");

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let a: &[u8; N] = self.buf[self.pos..].first_chunk().ok_or(SHORT_PAYLOAD)?;
        self.pos += N;
        Ok(*a)
    }
    #[inline]
    fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }
    #[inline]
    fn u32(&mut self) -> Result<u32, FormatError> {
        self.array().map(u32::from_le_bytes)
    }
    #[inline]
    fn u64(&mut self) -> Result<u64, FormatError> {
        self.array().map(u64::from_le_bytes)
    }
    /// Skips `len` bytes, returning their range.
    #[inline]
    fn skip(&mut self, len: usize) -> Result<std::ops::Range<usize>, FormatError> {
        if self.remaining() < len {
            return Err(SHORT_PAYLOAD);
        }
        let start = self.pos;
        self.pos += len;
        Ok(start..self.pos)
    }
}

fn parse_payload(header: &BatchHeader, payload: &Bytes) -> Result<Vec<TxnRecord>, FormatError> {
    let mut r = Reader { buf: payload, pos: 0 };
    // Bounded by raw_len / TXN_HEADER_LEN (checked in decode_batch_header).
    let mut txns = Vec::with_capacity(header.txn_count as usize);
    let mut prev: Option<Ts> = None;
    for _ in 0..header.txn_count {
        let ts = Ts(r.u64()?);
        if prev.is_some_and(|p| ts <= p) {
            return Err(FormatError::Malformed("txn ts not strictly increasing"));
        }
        prev = Some(ts);
        let write_count = r.u32()? as usize;
        // Refuse before allocating: each write needs at least MIN_WRITE_LEN bytes.
        if write_count > r.remaining() / MIN_WRITE_LEN {
            return Err(FormatError::Malformed("write_count too large for payload"));
        }
        let mut writes = Vec::with_capacity(write_count);
        for _ in 0..write_count {
            let op = r.u8()?;
            let table = TableId(r.u32()?);
            let rid = RecordId(r.u64()?);
            let key_len = r.u32()?;
            if key_len as usize > MAX_KEY_LEN {
                return Err(too_large("key_len", key_len, MAX_KEY_LEN));
            }
            let key = payload.slice(r.skip(key_len as usize)?);
            let value = match op {
                OP_PUT => {
                    let value_len = r.u32()?;
                    if value_len as usize > MAX_VALUE_LEN {
                        return Err(too_large("value_len", value_len, MAX_VALUE_LEN));
                    }
                    Some(payload.slice(r.skip(value_len as usize)?))
                }
                OP_DELETE => None,
                _ => return Err(FormatError::Malformed("unknown write op")),
            };
            writes.push(WriteRecord { table, rid, key, value });
        }
        txns.push(TxnRecord { ts, writes });
    }
    if r.remaining() != 0 {
        return Err(FormatError::Malformed("trailing bytes after last txn"));
    }
    // For an empty batch the header check already required first_ts == last_ts == 0.
    if let (Some(first), Some(last)) = (txns.first(), txns.last()) {
        if first.ts != header.first_ts || last.ts != header.last_ts {
            return Err(FormatError::Malformed("first_ts/last_ts do not match the txns"));
        }
    }
    Ok(txns)
}

fn too_large(what: &'static str, len: u32, max: usize) -> FormatError {
    FormatError::TooLarge { what, len: len.into(), max: max as u64 }
}

// ---------------------------------------------------------------------------------------
// Segments
// ---------------------------------------------------------------------------------------

/// What `read_segment` found in a segment file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentScan {
    pub header: SegmentHeader,
    /// Every batch before the end, with its offset in the file, in file order.
    pub batches: Vec<(u64, Batch)>,
    pub end: SegmentEnd,
}

impl SegmentScan {
    /// Length of the valid prefix of the file: header plus intact batches. For a `Torn`
    /// segment this is the length to truncate to (equal to the torn offset).
    pub fn valid_len(&self) -> u64 {
        match self.batches.last() {
            Some((off, b)) => off + b.header.total_len() as u64,
            None => SEGMENT_HEADER_LEN as u64,
        }
    }
}

/// How a segment file ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SegmentEnd {
    /// The file ends exactly after its last batch (or after its header).
    Clean,
    /// The batch at `offset` is damaged and nothing valid follows it: a torn or
    /// zero-filled tail. Acceptable only in a stream's last segment, where the caller may
    /// truncate the file to `offset`.
    Torn { offset: u64, reason: FormatError },
    /// The batch at `offset` is damaged but valid data follows it (or its checksums
    /// verify, so no torn write explains it): the log is corrupt.
    Corrupt { offset: u64, reason: FormatError },
}

/// Walks a whole segment file: header, then batches until the end of the file or the
/// first batch that does not decode, which is classified as `Torn` or `Corrupt` (see the
/// module docs). Errs only if the segment header itself is bad. Never panics.
pub fn read_segment(file: &Bytes) -> Result<SegmentScan, FormatError> {
    let header = SegmentHeader::decode(file)?;
    let mut batches = Vec::new();
    let mut off = SEGMENT_HEADER_LEN;
    let end = loop {
        if off == file.len() {
            break SegmentEnd::Clean;
        }
        let rest = file.slice(off..);
        let reason = match decode_batch(&rest).and_then(|b| belongs(&header, b)) {
            Ok((batch, used)) => {
                batches.push((off as u64, batch));
                off += used;
                continue;
            }
            Err(e) => e,
        };
        let offset = off as u64;
        break if !reason.could_be_torn() || valid_header_after(file, off + 1, &header) {
            SegmentEnd::Corrupt { offset, reason }
        } else {
            SegmentEnd::Torn { offset, reason }
        };
    };
    Ok(SegmentScan { header, batches, end })
}

fn belongs(seg: &SegmentHeader, b: (Batch, usize)) -> Result<(Batch, usize), FormatError> {
    let h = &b.0.header;
    if h.stream != seg.stream {
        return Err(FormatError::StreamMismatch { expected: seg.stream.0, found: h.stream.0 });
    }
    if h.epoch != seg.epoch {
        return Err(FormatError::EpochMismatch { expected: seg.epoch.0, found: h.epoch.0 });
    }
    Ok(b)
}

/// Whether a valid batch header of this segment (magic, checksum, version, and the
/// segment's stream and epoch) starts at any offset >= `from`. Linear: jumps between
/// occurrences of the magic's first byte and checksums only candidates that carry the
/// whole magic.
fn valid_header_after(file: &[u8], from: usize, seg: &SegmentHeader) -> bool {
    let mut p = from;
    while p + BATCH_HEADER_LEN <= file.len() {
        let Some(i) = file[p..file.len() - BATCH_HEADER_LEN + 1].iter().position(|&x| x == BATCH_MAGIC[0]) else {
            return false;
        };
        let cand = &file[p + i..];
        if cand.starts_with(&BATCH_MAGIC) {
            if let Ok(h) = decode_batch_header(cand) {
                if h.stream == seg.stream && h.epoch == seg.epoch {
                    return true;
                }
            }
        }
        p += i + 1;
    }
    false
}
