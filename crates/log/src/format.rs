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
//! back. A batch is the unit of group commit: an 88-byte header followed by a payload of
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
//!   at most one allocation (none into a reused buffer). When LZ4 does not shrink the
//!   payload it is stored raw.
//! * **Check once, keep the stored bytes, walk without allocating.** `decode_batch` checks
//!   a batch completely (decompressing into a reusable scratch buffer), and the `Batch` it
//!   returns keeps only the header and the *stored* bytes (a slice of the file buffer).
//!   Reading it again (`Batch::payload_in`) decompresses into the caller's scratch buffer
//!   and walks the payload as borrowed views (`TxnView`, `WriteView`), allocating nothing.
//!   Recovery thus never holds every decompressed payload at once (fresh memory that would
//!   have to be page-faulted in) and only copies out the keys and values it keeps; for an
//!   uncompressed batch `Payload::bytes` even hands those out as zero-copy slices.
//! * **Encode appends into reusable buffers.** `BatchBuilder` keeps its payload `Vec`
//!   across batches, and `finish_into` compresses straight into the caller's output `Vec`,
//!   so the commit path allocates nothing in the steady state.
//! * **Fixed-width headers, varint payload (version 2).** Both headers are fixed-width
//!   little endian, so they can be found and checked at known offsets. Inside the payload
//!   every integer is an LEB128 varint, timestamps are deltas, and a write carries its key
//!   only when the record had no value before it (replay addresses records by record id):
//!   most table ids, record ids, lengths and ts deltas fit in one to three bytes, which LZ4
//!   alone did not recover. A table id below 63 is packed into the write's flags byte, and
//!   a record id is a zigzag varint of its difference from the previous record id of the
//!   same table *in the same batch* (0 at the start of every batch, so each batch decodes
//!   on its own): writes to neighbouring records (order lines, inserts in key order) take
//!   one byte for the rid instead of three to five. The encoding is canonical (shortest
//!   varints, packed table ids whenever they fit), so an uncompressed payload re-encodes
//!   to the same bytes.
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
//! * the payload is consumed exactly (no trailing bytes), varints are canonical and fit
//!   their field, lengths respect the `MAX_*` limits and the bytes remaining, and the
//!   decoder refuses oversize lengths before allocating anything;
//! * table ids are below `MAX_TABLES` (the engine's `TABLES_MAX`) and packed into the
//!   flags byte when below `PACKED_TABLE_LIMIT`; record ids are below `RID_LIMIT` (the
//!   engine's `RECORDS_PER_TABLE_MAX`);
//! * within one segment every batch carries the segment's stream id and epoch
//!   (checked by `read_segment`, not by `decode_batch`, which does not know the segment).
//!
//! The torn-vs-corrupt rule (`read_segment`): at the first batch that fails to decode, if
//! only zero bytes follow up to the end, they are space zeroed ahead by the writer
//! (`SegmentEnd::Zeros`); else, if a later batch of this segment proves the damaged bytes
//! had been synced (one of version 6 claiming, in `synced_ts`, more synced than what lies
//! before the damage; or any valid header of an older version, which claims nothing), the
//! damage is to durable bytes (`SegmentEnd::Corrupt`); otherwise it is a torn write, its
//! later batches perhaps reaching the disk before it (`SegmentEnd::Torn`), that the caller
//! may truncate away. A failure in a batch whose checksums verify cannot come from a torn
//! write, so it is always `Corrupt`.
//!
//! Non-goals
//! ---------
//! * I/O, fsync, segment rotation and naming, and deciding whether `Torn` is acceptable
//!   (only in a stream's last segment) all belong to the caller.
//! * Cross-batch invariants (ts increasing across batches, `bound_ts` monotone) are stream
//!   semantics and are left to recovery.
//! * No attempt to salvage data after a corrupt point, and no backwards compatibility
//!   machinery beyond the version fields: this build writes version 6, reads versions 2
//!   to 6 (2 lacks `floor_ts`, 2 to 4 lack `reuse_ts`, 2 to 5 lack `synced_ts`), and
//!   reports any other version (e.g. a version-1 file) as `UnsupportedVersion`.

use bytes::Bytes;
use ditto_engine::{RecordId, TableId, Ts, RECORDS_PER_TABLE_MAX, TABLES_MAX};

/// Identifies a log stream (one per worker; see `ditto_engine::WorkerId`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

/// A log generation. A new epoch starts (in new segments) every time the database
/// reopens the log, so bytes left behind by an earlier incarnation are recognisable.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub u64);

/// The format version this build writes in segment headers (u32) and batch headers (u16).
/// It reads every version from `OLDEST_READABLE_VERSION` up to this one: version 5 is
/// version 6 without the batch header's `synced_ts` (read as 0, and a damaged batch
/// followed by any valid one is damage, as before: see `damaged_end`); version 4 is
/// version 5 without the batch header's `reuse_ts` (read as 0: claims nothing); version 3
/// is version 4 without the segment header's `streams` and `prev_ts` (read as 0: not
/// recorded); version 2 is version 3 without the batch header's `floor_ts` (read as 0);
/// version 1 (fixed-width payload) is refused as `UnsupportedVersion(1)`.
pub const LOG_FORMAT_VERSION: u32 = 6;
pub const OLDEST_READABLE_VERSION: u32 = 2;
pub const SEGMENT_MAGIC: [u8; 8] = *b"DITTOLOG";
pub const BATCH_MAGIC: [u8; 4] = *b"DBAT";
pub const SEGMENT_HEADER_LEN: usize = 48;
/// A batch header since version 6: the 64 bytes every version shares, then `floor_ts`,
/// `reuse_ts` and `synced_ts`.
pub const BATCH_HEADER_LEN: usize = 88;
/// A batch header of version 5: the 64 bytes every version shares, then `floor_ts` and
/// `reuse_ts`.
pub const BATCH_HEADER_V5_LEN: usize = 80;
/// The first version whose batches claim how far their stream was synced (`synced_ts`):
/// damage with only older batches after it is told by the rule before (`synced_after`).
const SYNCED_TS_VERSION: u16 = 6;
/// A batch header of versions 3 and 4: the 64 bytes every version shares, then `floor_ts`.
pub const BATCH_HEADER_V3_LEN: usize = 72;
/// The part of a batch header whose layout every version shares (magic, version, header
/// checksum at fixed offsets): a whole version-2 header.
pub const BATCH_HEADER_FIXED_LEN: usize = 64;

/// Whether this build reads log format `version`.
pub fn readable_version(version: u32) -> bool {
    (OLDEST_READABLE_VERSION..=LOG_FORMAT_VERSION).contains(&version)
}

/// Largest key a write may carry.
pub const MAX_KEY_LEN: usize = 64 * 1024;
/// Largest value a write may carry.
pub const MAX_VALUE_LEN: usize = 64 * 1024 * 1024;
/// Largest uncompressed payload of one batch.
pub const MAX_RAW_LEN: usize = 256 * 1024 * 1024;
/// Largest stored (possibly compressed) payload of one batch.
pub const MAX_STORED_LEN: usize = 256 * 1024 * 1024;

/// Table ids a write may carry are below this (the engine's `TABLES_MAX`).
pub const MAX_TABLES: usize = TABLES_MAX;
/// Table ids below this are packed into a write's flags byte (bits 2-7 hold table + 1);
/// others (up to `MAX_TABLES - 1`) follow it as a varint, with bits 2-7 zero.
pub const PACKED_TABLE_LIMIT: u32 = 63;
/// Record ids a write may carry are below this (the engine's `RECORDS_PER_TABLE_MAX`).
pub const RID_LIMIT: u64 = RECORDS_PER_TABLE_MAX;

// The decoder keeps one u32 "previous rid" per table, and Bases stores table ids as u8.
const _: () = assert!(MAX_TABLES <= 256 && MAX_TABLES > PACKED_TABLE_LIMIT as usize);
const _: () = assert!(RID_LIMIT > 0 && RID_LIMIT <= 1 << 32);

/// Most bytes a transaction occupies in a payload before its writes: ts delta (a u64
/// varint, at most 10 bytes) and write count (a u32 varint, at most 5).
pub const TXN_HEADER_MAX_LEN: usize = 10 + 5;
/// Fewest bytes a transaction occupies: a one-byte ts delta and a one-byte write count.
const MIN_TXN_LEN: usize = 2;
/// Most bytes of a write before its key and value: flags, table varint (only for a table
/// of `PACKED_TABLE_LIMIT` or more), rid delta (a zigzag varint of a difference between two
/// record ids, so at most 2 * (RID_LIMIT - 1)).
const WRITE_FIXED_MAX_LEN: usize = 1 + varint_len(MAX_TABLES as u64 - 1) + varint_len(2 * (RID_LIMIT - 1));
/// Smallest encoded write: a delete without a key (flags with the table packed, one-byte
/// rid delta).
const MIN_WRITE_LEN: usize = 2;

/// Batch header flag: the payload is one LZ4 block.
const FLAG_COMPRESSED: u8 = 1;
/// Write flags (the first byte of every write): bit 0 set is a delete (no value), clear a
/// put; bit 1 set means a key follows; bits 2-7 (`flags >> TABLE_SHIFT`) are table + 1 for
/// a table below `PACKED_TABLE_LIMIT`, else 0 and a table varint follows.
const WRITE_DELETE: u8 = 1;
const WRITE_HAS_KEY: u8 = 2;
const TABLE_SHIFT: u32 = 2;

/// LZ4 cannot expand more than 255 output bytes per input byte (a 0xFF length byte is
/// worth 255 bytes of match), so a header claiming more is lying: refuse it before
/// allocating `raw_len` bytes.
const LZ4_MAX_RATIO: u64 = 255;

/// Bytes LEB128 needs for `x`: 7 bits per byte, at least one byte.
pub const fn varint_len(x: u64) -> usize {
    let bits = 64 - (x | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// An upper bound of the bytes one write occupies in an uncompressed payload (exact but for
/// the table varint and rid delta, counted at their widest). `key_len` is `None` for a write
/// without a key, `value_len` `None` for a delete. Lets callers check a transaction against
/// `MAX_RAW_LEN` before handing it to `BatchBuilder::push_txn`: a transaction needs at most
/// `TXN_HEADER_MAX_LEN` plus the sum of this over its writes.
pub const fn write_encoded_len(key_len: Option<usize>, value_len: Option<usize>) -> usize {
    let key = match key_len {
        Some(k) => varint_len(k as u64) + k,
        None => 0,
    };
    let value = match value_len {
        Some(v) => varint_len(v as u64) + v,
        None => 0,
    };
    WRITE_FIXED_MAX_LEN + key + value
}

// The engine refuses transactions whose log size it estimates over `TXN_BYTES_MAX` with
// per-transaction and per-write overheads of its own; they must bound this encoding's.
const _: () = {
    use ditto_engine::{KEY_LEN_MAX, LOG_TXN_OVERHEAD_MAX, LOG_WRITE_OVERHEAD_MAX, VALUE_LEN_MAX};
    assert!(KEY_LEN_MAX <= MAX_KEY_LEN && VALUE_LEN_MAX <= MAX_VALUE_LEN);
    assert!(TXN_HEADER_MAX_LEN <= LOG_TXN_OVERHEAD_MAX);
    // The widest write the engine can produce, less its key and value bytes.
    assert!(
        write_encoded_len(Some(KEY_LEN_MAX), Some(VALUE_LEN_MAX)) - KEY_LEN_MAX - VALUE_LEN_MAX
            <= LOG_WRITE_OVERHEAD_MAX
    );
};

/// Why bytes could not be decoded. Every variant means the bytes themselves are bad (or
/// missing); see `is_retryable`.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported log format version {0} (this build reads versions {o} to {v})", o = OLDEST_READABLE_VERSION, v = LOG_FORMAT_VERSION)]
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
    /// How many streams the epoch's log has (version 4; 0 in older versions: not
    /// recorded). Recovery refuses a log missing one of them.
    pub streams: u32,
    /// The highest timestamp, of a transaction or a bound, in this stream's earlier
    /// segments of the epoch (version 4; 0 in older versions). For an epoch's first
    /// segment, the timestamp of the checkpoint the epoch's log stands on (since
    /// 2026-12-05, night; 0 before): everything older lies at or below it. A checkpoint
    /// deletes the oldest segments it covers, so recovery accepts that earlier segments
    /// are missing only if this is at or below its checkpoint; so a log whose checkpoint
    /// went missing (its MANIFEST deleted) is refused, where before its first segments
    /// let recovery open on an older checkpoint, or none, without the commits between.
    pub prev_ts: Ts,
}

impl SegmentHeader {
    /// The highest timestamp the stream's batches of this epoch hold before this segment
    /// (`damaged_end`'s `before`): `prev_ts`, but for an epoch's first segment, whose
    /// `prev_ts` names the checkpoint under the epoch, none. (Seeded with that checkpoint,
    /// a batch claiming a heartbeat at its very bound synced would prove nothing, and
    /// damage to the heartbeat would be cut with the acknowledged batch after it; found by
    /// a review, 2026-12-05, night.)
    pub fn epoch_ts_before(&self) -> Ts {
        if self.seq <= 1 {
            Ts::ZERO
        } else {
            self.prev_ts
        }
    }

    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        put(&mut b, 0, SEGMENT_MAGIC);
        put(&mut b, 8, LOG_FORMAT_VERSION.to_le_bytes());
        put(&mut b, 12, self.stream.0.to_le_bytes());
        put(&mut b, 16, self.epoch.0.to_le_bytes());
        put(&mut b, 24, self.seq.to_le_bytes());
        put(&mut b, 32, self.streams.to_le_bytes());
        put(&mut b, 36, self.prev_ts.0.to_le_bytes());
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
        if !readable_version(version) {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let stream = StreamId(le32(b, 12));
        let (streams, prev_ts) = if version >= 4 {
            let streams = le32(b, 32);
            if stream.0 >= streams {
                return Err(FormatError::Malformed("segment header: stream id not below the epoch's stream count"));
            }
            (streams, Ts(le64(b, 36)))
        } else {
            if b[32..44].iter().any(|&x| x != 0) {
                return Err(FormatError::Malformed("segment header reserved bytes are not zero"));
            }
            (0, Ts::ZERO)
        };
        Ok(SegmentHeader { stream, epoch: Epoch(le64(b, 16)), seq: le64(b, 24), streams, prev_ts })
    }
}

// ---------------------------------------------------------------------------------------
// Batch header
// ---------------------------------------------------------------------------------------

/// What a batch says beyond its transactions (`BatchBuilder::finish_marked_into`; each
/// field is `BatchHeader`'s of the same name).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    pub bound_ts: Ts,
    pub floor_ts: Ts,
    pub reuse_ts: Ts,
    pub synced_ts: Ts,
}

/// The header in front of every batch's payload (88 bytes since version 6, 80 in version
/// 5, 72 in versions 3 and 4, 64 in version 2).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BatchHeader {
    /// The format version of this batch: `LOG_FORMAT_VERSION` for every batch this build
    /// writes; 2 for a batch of an older log (then `floor_ts` is 0).
    pub version: u16,
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
    /// Every transaction of *every* stream with ts <= `floor_ts` is in this batch or an
    /// earlier one of its stream, or was durable in another stream when this batch was
    /// framed (the writer vouched for idle streams, `crates/log/src/writer.rs`). At most
    /// `bound_ts`; 0 vouches for nothing.
    pub floor_ts: Ts,
    /// Every record id a transaction of this batch gives a new life (another key) had its
    /// previous life end at or below this: the primary reuses an id only once a durable
    /// checkpoint covers the old life's end, and this is its newest durable checkpoint's
    /// timestamp when the batch was framed. A replayer installs a write above it only once
    /// every transaction at or below it is installed (and one at or below it only once
    /// every transaction below its own is), so no new life overtakes an old one. 0 (and in
    /// versions before 5) claims nothing.
    pub reuse_ts: Ts,
    /// The highest timestamp (a transaction's or a bound) of this stream's batches of this
    /// epoch that an fsync had made durable when this batch was framed; 0 if none (and in
    /// versions before 6, and under a durability that never fsyncs). At most `bound_ts`.
    /// What it is for: a batch that follows a damaged one and claims no more than was
    /// durable before the damage proves the damage was never synced, a torn write whose
    /// pages reached the disk out of order, not damage to durable bytes (`damaged_end`).
    pub synced_ts: Ts,
    pub txn_count: u32,
    /// Uncompressed payload length.
    pub raw_len: u32,
    /// Payload bytes following the header.
    pub stored_len: u32,
    /// CRC32C of the stored payload bytes, after the header's bytes past its fixed 64
    /// (versions 3 and 4: `floor_ts`'s 8 bytes; version 5: `floor_ts`'s and `reuse_ts`'s;
    /// version 6: those and `synced_ts`'s), the header checksum covering only the fixed
    /// part.
    pub payload_crc: u32,
}

impl BatchHeader {
    /// The bytes this header occupies: 88 (version 6), 80 (version 5), 72 (versions 3 and
    /// 4) or 64 (version 2).
    pub fn header_len(&self) -> usize {
        batch_header_len(self.version)
    }

    /// The highest timestamp this batch holds, a transaction's or its bound.
    pub fn high_ts(&self) -> Ts {
        self.bound_ts.max(self.last_ts)
    }

    /// Header plus stored payload: the bytes this batch occupies in a segment.
    pub fn total_len(&self) -> usize {
        self.header_len() + self.stored_len as usize
    }

    /// The payload checksum of `stored` under this header's version.
    pub fn payload_checksum(&self, stored: &[u8]) -> u32 {
        let mut tail = [0u8; BATCH_HEADER_LEN - BATCH_HEADER_FIXED_LEN];
        let n = self.header_len() - BATCH_HEADER_FIXED_LEN;
        self.encode_tail(&mut tail[..n]);
        crc32c::crc32c_append(crc32c::crc32c(&tail[..n]), stored)
    }

    /// The fields after the fixed 64 bytes: `floor_ts` (version 3 on), then `reuse_ts`
    /// (version 5 on), then `synced_ts` (version 6 on).
    fn encode_tail(&self, out: &mut [u8]) {
        for (i, field) in [self.floor_ts, self.reuse_ts, self.synced_ts].into_iter().enumerate() {
            if let Some(at) = out.get_mut(i * 8..i * 8 + 8) {
                at.copy_from_slice(&field.0.to_le_bytes());
            }
        }
    }

    /// Serializes the header (`header_len()` bytes), computing the header checksum. Does
    /// not validate: the encoder only builds consistent headers, and tests need to build
    /// inconsistent ones (and older versions', which lack `floor_ts` or `reuse_ts`).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.header_len()];
        self.encode_into(&mut b);
        b
    }

    /// `encode` into `out`, which must be exactly `header_len()` bytes long.
    pub fn encode_into(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.header_len(), "batch header buffer");
        let mut b = [0u8; BATCH_HEADER_FIXED_LEN];
        put(&mut b, 0, BATCH_MAGIC);
        put(&mut b, 4, self.version.to_le_bytes());
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
        out[..BATCH_HEADER_FIXED_LEN].copy_from_slice(&b);
        self.encode_tail(&mut out[BATCH_HEADER_FIXED_LEN..]);
    }
}

/// The bytes a batch header of `version` occupies (a readable version's).
fn batch_header_len(version: u16) -> usize {
    match version {
        2 => BATCH_HEADER_FIXED_LEN,
        3 | 4 => BATCH_HEADER_V3_LEN,
        5 => BATCH_HEADER_V5_LEN,
        _ => BATCH_HEADER_LEN,
    }
}

/// Decodes and validates the batch header at the start of `buf`: magic, header checksum,
/// version, flags, reserved byte, size limits, and the consistency of the header fields
/// among themselves. Does not look at the payload. `floor_ts` (version 3 on), `reuse_ts`
/// (version 5 on) and `synced_ts` (version 6 on) are read but not yet trusted: the
/// payload checksum covers them, and `decode_batch_checksums` checks it.
pub fn decode_batch_header(buf: &[u8]) -> Result<BatchHeader, FormatError> {
    let b: &[u8; BATCH_HEADER_FIXED_LEN] =
        buf.first_chunk().ok_or(FormatError::Truncated { needed: BATCH_HEADER_FIXED_LEN, available: buf.len() })?;
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
    if !readable_version(version.into()) {
        return Err(FormatError::UnsupportedVersion(version.into()));
    }
    let len = batch_header_len(version);
    let whole = buf.get(..len).ok_or(FormatError::Truncated { needed: len, available: buf.len() })?;
    let tail = |at: usize| match whole.get(at..at + 8) {
        Some(f) => Ts(u64::from_le_bytes(f.try_into().expect("8 bytes"))),
        None => Ts(0),
    };
    let (floor_ts, reuse_ts, synced_ts) =
        (tail(BATCH_HEADER_FIXED_LEN), tail(BATCH_HEADER_FIXED_LEN + 8), tail(BATCH_HEADER_FIXED_LEN + 16));
    let flags = b[6];
    if flags & !FLAG_COMPRESSED != 0 {
        return Err(FormatError::BadFlags(flags));
    }
    if b[7] != 0 {
        return Err(FormatError::Malformed("batch header reserved byte is not zero"));
    }
    let h = BatchHeader {
        version,
        stream: StreamId(le32(b, 8)),
        epoch: Epoch(le64(b, 12)),
        compressed: flags & FLAG_COMPRESSED != 0,
        first_ts: Ts(le64(b, 20)),
        last_ts: Ts(le64(b, 28)),
        bound_ts: Ts(le64(b, 36)),
        floor_ts,
        reuse_ts,
        synced_ts,
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
        // Every transaction takes at least MIN_TXN_LEN bytes; this also bounds what
        // `Batch::records` pre-allocates for the transaction list.
        if u64::from(h.txn_count) * MIN_TXN_LEN as u64 > raw {
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
// Varints
// ---------------------------------------------------------------------------------------

/// Appends `x` as an LEB128 varint: 7 bits per byte, least significant first, the high bit
/// set on every byte but the last. Always the shortest form.
#[inline]
fn put_varint(out: &mut Vec<u8>, mut x: u64) {
    while x >= 0x80 {
        out.push(x as u8 | 0x80);
        x >>= 7;
    }
    out.push(x as u8);
}

/// Zigzag: a signed difference (as the u64 of `wrapping_sub`) to an unsigned varint
/// value, small for small differences either way (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...).
#[inline]
fn zigzag(delta: u64) -> u64 {
    (delta << 1) ^ ((delta as i64 >> 63) as u64)
}

/// Inverse of `zigzag`.
#[inline]
fn unzigzag(z: u64) -> u64 {
    (z >> 1) ^ (z & 1).wrapping_neg()
}

/// The previous record id of each table while walking one batch (all 0 at its start).
type Rids = [u32; MAX_TABLES];

/// The rid a write's zigzag delta `z` designates after `prev` (the table's previous rid in
/// the batch), which becomes the new `prev`. Wrapping arithmetic: any result outside
/// `RID_LIMIT` is refused, so each rid has exactly one encoding.
#[inline]
fn next_rid(prev: &mut u32, z: u64) -> Result<RecordId, FormatError> {
    let rid = u64::from(*prev).wrapping_add(unzigzag(z));
    if rid >= RID_LIMIT {
        return Err(FormatError::Malformed("record id beyond RECORDS_PER_TABLE_MAX"));
    }
    *prev = rid as u32;
    Ok(RecordId(rid))
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
    /// The previous rid of each table in this batch (`MAX_TABLES` entries once the first
    /// write is pushed; empty means all 0).
    rids: Vec<u32>,
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

    /// Appends one transaction. `writes` yields (table, rid, key, value): `key` is `Some`
    /// when the write must carry the record's key (the record had no value before it), and
    /// `value` `None` is a delete (tombstone).
    ///
    /// # Panics
    /// If `ts` is not greater than the previous transaction's, if a table id is not below
    /// `MAX_TABLES` or a record id not below `RID_LIMIT`, if a key or value exceeds
    /// `MAX_KEY_LEN`/`MAX_VALUE_LEN`, or if the payload would exceed `MAX_RAW_LEN`. These
    /// would produce a batch that no reader accepts, so they are caller bugs: check sizes
    /// (see `write_encoded_len`) before committing. The builder is left unchanged by a
    /// failed ts check but may hold a partial transaction after a failed size check.
    pub fn push_txn<'a, I>(&mut self, ts: Ts, writes: I)
    where
        I: ExactSizeIterator<Item = (TableId, RecordId, Option<&'a [u8]>, Option<&'a [u8]>)>,
    {
        // The first transaction is encoded relative to the batch's first_ts, i.e. itself.
        let prev = match self.last_ts {
            Some(last) => {
                assert!(ts > last, "log: txn ts {ts:?} not above previous {last:?} in batch");
                last
            }
            None => ts,
        };
        assert!(self.txn_count < u32::MAX, "log: more than u32::MAX txns in one batch");
        let claimed = u32::try_from(writes.len()).expect("log: more than u32::MAX writes in one txn");

        if self.rids.is_empty() {
            self.rids.resize(MAX_TABLES, 0);
        }
        let p = &mut self.payload;
        p.reserve(TXN_HEADER_MAX_LEN + writes.len().saturating_mul(MIN_WRITE_LEN));
        put_varint(p, ts.0 - prev.0);
        // The count is written from `len()` and corrected after the loop if the iterator
        // yielded a different number of writes, so an iterator that misreports its length
        // cannot produce an undecodable batch.
        let count_at = p.len();
        put_varint(p, claimed.into());
        let mut write_count: u32 = 0;
        for (table, rid, key, value) in writes {
            assert!((table.0 as usize) < MAX_TABLES, "log: table id {} beyond TABLES_MAX", table.0);
            assert!(rid.0 < RID_LIMIT, "log: record id {} beyond RECORDS_PER_TABLE_MAX", rid.0);
            let mut flags = 0;
            if let Some(k) = key {
                assert!(k.len() <= MAX_KEY_LEN, "log: key of {} bytes too long", k.len());
                flags |= WRITE_HAS_KEY;
            }
            match value {
                Some(v) => assert!(v.len() <= MAX_VALUE_LEN, "log: value of {} bytes too long", v.len()),
                None => flags |= WRITE_DELETE,
            }
            p.reserve(write_encoded_len(key.map(<[u8]>::len), value.map(<[u8]>::len)));
            let prev = std::mem::replace(&mut self.rids[table.0 as usize], rid.0 as u32);
            if table.0 < PACKED_TABLE_LIMIT {
                p.push(flags | ((table.0 + 1) as u8) << TABLE_SHIFT);
            } else {
                p.push(flags);
                put_varint(p, table.0.into());
            }
            put_varint(p, zigzag(rid.0.wrapping_sub(u64::from(prev))));
            if let Some(k) = key {
                put_varint(p, k.len() as u64);
            }
            if let Some(v) = value {
                put_varint(p, v.len() as u64);
            }
            if let Some(k) = key {
                p.extend_from_slice(k);
            }
            if let Some(v) = value {
                p.extend_from_slice(v);
            }
            write_count = write_count.checked_add(1).expect("log: more than u32::MAX writes in one txn");
        }
        if write_count != claimed {
            let mut count = Vec::with_capacity(5);
            put_varint(&mut count, write_count.into());
            p.splice(count_at..count_at + varint_len(claimed.into()), count);
        }
        assert!(p.len() <= MAX_RAW_LEN, "log: batch payload of {} bytes exceeds MAX_RAW_LEN", p.len());
        self.txn_count += 1;
        self.first_ts.get_or_insert(ts);
        self.last_ts = Some(ts);
    }

    /// Frames the accumulated transactions as one batch appended to `out` (header, then
    /// payload), LZ4-compressing the payload when `compress` is true and that makes it
    /// smaller. Returns the header written. Does not clear the builder. The batch vouches
    /// for no other stream (`floor_ts` 0): see `finish_vouching_into`.
    pub fn finish_into(
        &self,
        stream: StreamId,
        epoch: Epoch,
        bound_ts: Ts,
        compress: bool,
        out: &mut Vec<u8>,
    ) -> BatchHeader {
        self.finish_vouching_into(stream, epoch, bound_ts, Ts(0), compress, out)
    }

    /// `finish_into` with a `floor_ts` (at most `bound_ts`; see `BatchHeader::floor_ts`).
    pub fn finish_vouching_into(
        &self,
        stream: StreamId,
        epoch: Epoch,
        bound_ts: Ts,
        floor_ts: Ts,
        compress: bool,
        out: &mut Vec<u8>,
    ) -> BatchHeader {
        let marks = Marks { bound_ts, floor_ts, ..Marks::default() };
        self.finish_marked_into(stream, epoch, marks, compress, out)
    }

    /// `finish_into` with every mark a batch header carries (see `Marks`).
    pub fn finish_marked_into(
        &self,
        stream: StreamId,
        epoch: Epoch,
        marks: Marks,
        compress: bool,
        out: &mut Vec<u8>,
    ) -> BatchHeader {
        let Marks { bound_ts, floor_ts, reuse_ts, synced_ts } = marks;
        assert!(floor_ts <= bound_ts, "log: floor {floor_ts:?} above bound {bound_ts:?}");
        assert!(synced_ts <= bound_ts, "log: synced {synced_ts:?} above bound {bound_ts:?}");
        let raw = &self.payload[..];
        let start = out.len();
        let body = start + BATCH_HEADER_LEN;
        // Reserve header space now and fill it in last, once the payload is known; the
        // compressor writes straight into `out`, avoiding a scratch buffer and a copy.
        out.resize(body, 0);
        let mut compressed = false;
        if compress && !raw.is_empty() {
            match compress_payload(raw, out) {
                Some(_) => compressed = true,
                // Did not shrink (or could not compress at all): store raw.
                None => out.truncate(body),
            }
        }
        if !compressed {
            out.extend_from_slice(raw);
        }
        let stored = &out[body..];
        let mut header = BatchHeader {
            version: LOG_FORMAT_VERSION as u16,
            stream,
            epoch,
            compressed,
            first_ts: self.first_ts.unwrap_or(Ts(0)),
            last_ts: self.last_ts.unwrap_or(Ts(0)),
            bound_ts,
            floor_ts,
            reuse_ts,
            synced_ts,
            txn_count: self.txn_count,
            // Both fit: push_txn keeps raw <= MAX_RAW_LEN and compressed < raw.
            raw_len: raw.len() as u32,
            stored_len: stored.len() as u32,
            payload_crc: 0,
        };
        header.payload_crc = header.payload_checksum(stored);
        header.encode_into(&mut out[start..body]);
        header
    }

    /// Forgets the accumulated transactions, keeping the buffer for the next batch, up to
    /// `keep` bytes of it: a larger one (left by a large batch) is let go.
    pub fn clear_keeping(&mut self, keep: usize) {
        self.clear();
        if self.payload.capacity() > keep {
            self.payload = Vec::new();
        }
    }

    /// Forgets the accumulated transactions, keeping the buffer for the next batch.
    pub fn clear(&mut self) {
        self.payload.clear();
        self.rids.fill(0);
        self.txn_count = 0;
        self.first_ts = None;
        self.last_ts = None;
    }
}

// ---------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------

/// One decoded batch: its header and its stored payload bytes (compressed or not), which
/// `decode_batch` has checked completely against every rule of docs/log-format.md. Only
/// `decode_batch` and `read_segment` build one.
///
/// Reading the transactions needs the uncompressed payload: `payload_in` decompresses it
/// into a caller's reusable buffer (nothing allocated, nothing kept), `payload` into a new
/// shared buffer, and `records` returns owned records whose keys and values share one such
/// buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub header: BatchHeader,
    /// Exactly the `stored_len` bytes after the header (a slice of the buffer decoded).
    stored: Bytes,
}

/// A batch's uncompressed payload, ready to be walked (`txns`).
#[derive(Clone, Copy, Debug)]
pub struct Payload<'a> {
    header: &'a BatchHeader,
    bytes: &'a [u8],
    /// The `Bytes` that `bytes` is a slice of, when there is one (zero-copy `bytes()`).
    shared: Option<&'a Bytes>,
}

/// One transaction of a batch, borrowed from the batch's payload.
#[derive(Clone, Debug)]
pub struct TxnView<'a> {
    pub ts: Ts,
    pub write_count: u32,
    /// The payload from this transaction's first write on.
    rest: &'a [u8],
    /// The previous rids its writes' deltas start from, so that it can be walked on its
    /// own (recovery keeps a batch's views and walks them newest first).
    bases: Bases,
}

/// Most distinct tables whose base rids a `TxnView` keeps inline.
const FEW_TABLES: usize = 8;

/// The previous rid, at the start of one transaction, of each table it writes.
#[derive(Clone, Debug)]
enum Bases {
    /// The first `n` entries of `tables`/`rids`: every table the transaction writes.
    Few { n: u8, tables: [u8; FEW_TABLES], rids: [u32; FEW_TABLES] },
    /// Every table's, for a transaction that writes more than `FEW_TABLES` tables (rare:
    /// one allocation per such transaction).
    All(Box<Rids>),
}

impl Bases {
    const EMPTY: Bases = Bases::Few { n: 0, tables: [0; FEW_TABLES], rids: [0; FEW_TABLES] };

    /// Records table `t`'s base `rids[t]` unless already recorded, before a write of the
    /// transaction changes it (`rids` holds the batch's state after the writes so far).
    #[inline]
    fn note(&mut self, t: usize, rids: &Rids) {
        let Bases::Few { n, tables, rids: base } = self else { return };
        let k = usize::from(*n);
        if tables[..k].contains(&(t as u8)) {
            return;
        }
        if k < FEW_TABLES {
            tables[k] = t as u8;
            base[k] = rids[t];
            *n += 1;
            return;
        }
        // Too many tables: keep them all, undoing the transaction's writes so far (each
        // listed table's base is its value before them; the others were not written).
        let mut all = Box::new(*rids);
        for (&t, &r) in tables.iter().zip(base.iter()) {
            all[usize::from(t)] = r;
        }
        *self = Bases::All(all);
    }

    /// The running previous rid of table `t` (which the transaction writes).
    #[inline]
    fn get(&mut self, t: u32) -> &mut u32 {
        match self {
            Bases::Few { n, tables, rids } => {
                let i = tables[..usize::from(*n)].iter().position(|&x| u32::from(x) == t).expect(VALIDATED);
                &mut rids[i]
            }
            Bases::All(all) => &mut all[t as usize],
        }
    }
}

/// One write, borrowed from the batch's payload (see `Payload::bytes` to keep parts).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WriteView<'a> {
    pub table: TableId,
    pub rid: RecordId,
    /// Present when the record had no value before this write (insert, or write over a
    /// tombstone); otherwise replay finds the record by `rid`.
    pub key: Option<&'a [u8]>,
    /// `None` is a delete (tombstone).
    pub value: Option<&'a [u8]>,
}

/// One transaction as read back from the log, owned (see `Batch::records`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnRecord {
    pub ts: Ts,
    pub writes: Vec<WriteRecord>,
}

/// One write as read back from the log, owned. `key` and `value` are zero-copy slices of
/// one buffer holding the batch's uncompressed payload; holding one keeps it all alive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    pub table: TableId,
    pub rid: RecordId,
    /// See `WriteView::key`.
    pub key: Option<Bytes>,
    /// `None` is a delete (tombstone).
    pub value: Option<Bytes>,
}

/// Why walking a `Batch` cannot fail: `decode_batch` walked the same bytes successfully.
const VALIDATED: &str = "log: a Batch's payload was checked by decode_batch";

impl Batch {
    /// The payload bytes as stored (LZ4-compressed when `header.compressed`).
    pub fn stored(&self) -> &Bytes {
        &self.stored
    }

    /// The uncompressed payload, decompressed into `scratch` if the batch is compressed
    /// (reusing its allocation), else borrowed from the stored bytes. Allocates nothing
    /// once `scratch` is large enough. Only for a batch whose payload was checked
    /// (`decode_batch`, or `checked_payload_in` before).
    pub fn payload_in<'a>(&'a self, scratch: &'a mut Vec<u8>) -> Payload<'a> {
        self.decompressed_in(scratch).expect(VALIDATED)
    }

    /// The second step of `decode_batch` (after `decode_batch_checksums`): decompresses the
    /// payload into `scratch` if needed and checks every record in it. Recovery runs it
    /// once per batch, in the replayer, so that replay does not decompress twice.
    pub fn checked_payload_in<'a>(&'a self, scratch: &'a mut Vec<u8>) -> Result<Payload<'a>, FormatError> {
        let p = self.decompressed_in(scratch)?;
        validate_payload(&self.header, p.bytes)?;
        Ok(p)
    }

    fn decompressed_in<'a>(&'a self, scratch: &'a mut Vec<u8>) -> Result<Payload<'a>, FormatError> {
        Ok(if self.header.compressed {
            let bytes = decompress(&self.stored, self.header.raw_len, scratch)?;
            Payload { header: &self.header, bytes, shared: None }
        } else {
            Payload { header: &self.header, bytes: &self.stored, shared: Some(&self.stored) }
        })
    }

    /// The uncompressed payload as a `Bytes` of its own (the stored bytes themselves when
    /// uncompressed, else a new buffer).
    pub fn payload(&self) -> Bytes {
        if self.header.compressed {
            let mut raw = Vec::new();
            decompress(&self.stored, self.header.raw_len, &mut raw).expect(VALIDATED);
            Bytes::from(raw)
        } else {
            self.stored.clone()
        }
    }

    /// The transactions as owned records, sharing one uncompressed payload buffer.
    pub fn records(&self) -> Vec<TxnRecord> {
        let payload = self.payload();
        let view = Payload { header: &self.header, bytes: &payload, shared: Some(&payload) };
        view.txns()
            .map(|t| TxnRecord {
                ts: t.ts,
                writes: t
                    .writes()
                    .map(|w| WriteRecord {
                        table: w.table,
                        rid: w.rid,
                        key: w.key.map(|k| view.bytes(k)),
                        value: w.value.map(|v| view.bytes(v)),
                    })
                    .collect(),
            })
            .collect()
    }
}

impl<'a> Payload<'a> {
    /// The uncompressed payload bytes.
    pub fn as_slice(&self) -> &'a [u8] {
        self.bytes
    }

    /// The transactions, in payload (= ts) order.
    pub fn txns(&self) -> Txns<'a> {
        Txns {
            r: Reader { buf: self.bytes, pos: 0 },
            prev: None,
            first_ts: self.header.first_ts,
            left: self.header.txn_count,
            rids: [0; MAX_TABLES],
        }
    }

    /// Every write of the transactions above `skip_to`, with its transaction's timestamp,
    /// in payload order, each decoded once (`txns` then `writes` decodes each twice: once
    /// to find where the next transaction starts). A replayer's loop; `FlatWrites::txns`
    /// counts the transactions it went through above `skip_to`, empty ones included.
    pub fn writes_above(&self, skip_to: Ts) -> FlatWrites<'a> {
        FlatWrites {
            r: Reader { buf: self.bytes, pos: 0 },
            prev: None,
            first_ts: self.header.first_ts,
            txns_left: self.header.txn_count,
            writes_left: 0,
            ts: Ts(0),
            skip_to,
            txns: 0,
            rids: [0; MAX_TABLES],
        }
    }

    /// `part` (a key or value of one of this payload's writes) as `Bytes`: a zero-copy
    /// slice when the payload is itself a `Bytes` (an uncompressed batch, or `records`),
    /// else a copy.
    ///
    /// # Panics
    /// If `part` is not a slice of this payload.
    pub fn bytes(&self, part: &[u8]) -> Bytes {
        match self.shared {
            Some(b) => b.slice_ref(part),
            None => {
                let range = self.bytes.as_ptr_range();
                assert!(
                    range.start <= part.as_ptr() && part.as_ptr_range().end <= range.end,
                    "log: Payload::bytes of a slice from elsewhere"
                );
                Bytes::copy_from_slice(part)
            }
        }
    }
}

/// Iterator over a batch's transactions (`Payload::txns`).
pub struct Txns<'a> {
    r: Reader<'a>,
    prev: Option<Ts>,
    first_ts: Ts,
    left: u32,
    /// Each table's previous rid after the transactions returned so far.
    rids: Rids,
}

impl<'a> Iterator for Txns<'a> {
    type Item = TxnView<'a>;

    fn next(&mut self) -> Option<TxnView<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (t, end) = next_txn(&mut self.r, self.prev, self.first_ts, &mut self.rids, true).expect(VALIDATED);
        self.r.pos = end;
        self.prev = Some(t.ts);
        Some(t)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Txns<'_> {}

impl<'a> TxnView<'a> {
    /// The transaction's writes, in the order they were logged.
    pub fn writes(&self) -> Writes<'a> {
        Writes { r: Reader { buf: self.rest, pos: 0 }, left: self.write_count, rids: self.bases.clone() }
    }
}

/// Iterator over a batch's writes above a timestamp (`Payload::writes_above`).
pub struct FlatWrites<'a> {
    r: Reader<'a>,
    prev: Option<Ts>,
    first_ts: Ts,
    txns_left: u32,
    /// Writes left in the transaction at `ts`.
    writes_left: u32,
    ts: Ts,
    skip_to: Ts,
    /// Transactions above `skip_to` gone through so far.
    pub txns: u64,
    rids: Rids,
}

impl<'a> Iterator for FlatWrites<'a> {
    type Item = (Ts, WriteView<'a>);

    #[inline]
    fn next(&mut self) -> Option<(Ts, WriteView<'a>)> {
        loop {
            while self.writes_left == 0 {
                if self.txns_left == 0 {
                    return None;
                }
                self.txns_left -= 1;
                let delta = self.r.varint().expect(VALIDATED);
                self.ts = match self.prev {
                    None => self.first_ts,
                    Some(p) => Ts(p.0 + delta),
                };
                self.prev = Some(self.ts);
                self.writes_left = self.r.varint_u32().expect(VALIDATED);
                if self.ts > self.skip_to {
                    self.txns += 1;
                }
            }
            self.writes_left -= 1;
            let w = self.r.write().expect(VALIDATED);
            // Skipped writes still move their table's rid, which the next deltas start from.
            let rid = next_rid(&mut self.rids[w.table as usize], w.rid_delta).expect(VALIDATED);
            if self.ts > self.skip_to {
                return Some((self.ts, WriteView { table: TableId(w.table), rid, key: w.key, value: w.value }));
            }
        }
    }
}

/// Iterator over one transaction's writes (`TxnView::writes`).
pub struct Writes<'a> {
    r: Reader<'a>,
    left: u32,
    /// The previous rid of each table the transaction writes, as of the next write.
    rids: Bases,
}

impl<'a> Iterator for Writes<'a> {
    type Item = WriteView<'a>;

    #[inline]
    fn next(&mut self) -> Option<WriteView<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let w = self.r.write().expect(VALIDATED);
        let rid = next_rid(self.rids.get(w.table), w.rid_delta).expect(VALIDATED);
        Some(WriteView { table: TableId(w.table), rid, key: w.key, value: w.value })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for Writes<'_> {}

/// Decodes one whole batch at the start of `buf`: header, payload checksum,
/// decompression, and every transaction and write of the payload. Returns the batch and
/// the bytes it occupies (`header_len() + stored_len`); `buf` may continue beyond it.
pub fn decode_batch(buf: &Bytes) -> Result<(Batch, usize), FormatError> {
    decode_batch_in(buf, &mut Vec::new())
}

/// `decode_batch`, decompressing (to check the payload) into `scratch`, whose allocation
/// is reused from one batch to the next.
pub fn decode_batch_in(buf: &Bytes, scratch: &mut Vec<u8>) -> Result<(Batch, usize), FormatError> {
    let (batch, used) = decode_batch_checksums(buf)?;
    batch.checked_payload_in(scratch)?;
    Ok((batch, used))
}

/// `batch` cut at `upto`: a batch of the same stream and epoch holding only its
/// transactions at or below `upto` (none, when all lie above), its bound and floor capped
/// there, appended to `out` as it would be framed. What a failover's recovery point keeps
/// of a batch that straddles it, for shipping (the new primary's gap to a backup that held
/// less than the point). The payload is checked first.
pub fn cut_batch(batch: &Batch, upto: Ts, out: &mut Vec<u8>) -> Result<BatchHeader, FormatError> {
    let h = &batch.header;
    let mut scratch = Vec::new();
    let payload = batch.checked_payload_in(&mut scratch)?;
    let mut b = BatchBuilder::new();
    for txn in payload.txns().filter(|t| t.ts <= upto) {
        b.push_txn(txn.ts, txn.writes().map(|w| (w.table, w.rid, w.key, w.value)));
    }
    let bound = h.bound_ts.min(upto);
    let marks = Marks {
        bound_ts: bound,
        floor_ts: h.floor_ts.min(bound),
        reuse_ts: h.reuse_ts,
        synced_ts: h.synced_ts.min(bound),
    };
    Ok(b.finish_marked_into(h.stream, h.epoch, marks, h.compressed, out))
}

/// The first step of `decode_batch`: header and payload checksums, no decompression and
/// no look inside the payload. A batch that passes is intact as written (so no torn write
/// explains a later `checked_payload_in` failure: that is corruption); its payload must
/// still pass `checked_payload_in` before anything reads it.
pub fn decode_batch_checksums(buf: &Bytes) -> Result<(Batch, usize), FormatError> {
    decode_batch_with(buf, true)
}

/// `decode_batch_checksums` for bytes whose payload checksum was verified before, these
/// same bytes in memory (a backup's received batch, checked before it was acknowledged,
/// or read back only if it is what was received): the header is decoded and checked
/// (its own checksum too), the payload's is not computed again.
pub fn decode_batch_verified_before(buf: &Bytes) -> Result<(Batch, usize), FormatError> {
    decode_batch_with(buf, false)
}

fn decode_batch_with(buf: &Bytes, verify_payload: bool) -> Result<(Batch, usize), FormatError> {
    let header = decode_batch_header(buf)?;
    let total = header.total_len();
    if buf.len() < total {
        return Err(FormatError::Truncated { needed: total, available: buf.len() });
    }
    let body = header.header_len();
    if verify_payload {
        let computed = header.payload_checksum(&buf[body..total]);
        if computed != header.payload_crc {
            return Err(FormatError::PayloadChecksum { stored: header.payload_crc, computed });
        }
    }
    // The floor is trusted only now that the payload checksum has vouched for its bytes
    // (and `synced_ts` with it).
    if header.floor_ts > header.bound_ts {
        return Err(FormatError::Malformed("floor_ts above bound_ts"));
    }
    if header.synced_ts > header.bound_ts {
        return Err(FormatError::Malformed("synced_ts above bound_ts"));
    }
    Ok((Batch { header, stored: buf.slice(body..total) }, total))
}

/// Decompresses an LZ4 block that must yield exactly `raw_len` bytes into `scratch`.
fn decompress<'s>(stored: &[u8], raw_len: u32, scratch: &'s mut Vec<u8>) -> Result<&'s [u8], FormatError> {
    // raw_len was bounded by decode_batch_header, so this allocation is too. Only the
    // growth is zeroed: a reused buffer is overwritten, never read before written.
    let raw_len = raw_len as usize;
    scratch.resize(raw_len, 0);
    let n = lz4_flex::block::decompress_into(stored, scratch).map_err(|e| FormatError::Decompress(e.to_string()))?;
    if n != raw_len {
        return Err(FormatError::Malformed("decompressed length differs from raw_len"));
    }
    Ok(&scratch[..])
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
    #[inline]
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, FormatError> {
        let b = *self.buf.get(self.pos).ok_or(SHORT_PAYLOAD)?;
        self.pos += 1;
        Ok(b)
    }

    /// An LEB128 varint of at most 64 bits, in its shortest form. Refuses a varint that
    /// runs past the payload, that is overlong (a final byte of zero after the first: the
    /// same value fits in fewer bytes), or that overflows (a tenth byte above 1, or an
    /// eleventh byte).
    #[inline]
    fn varint(&mut self) -> Result<u64, FormatError> {
        let b = self.u8()?;
        if b < 0x80 {
            return Ok(b.into());
        }
        let mut x = u64::from(b & 0x7F);
        let mut shift = 7;
        loop {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(FormatError::Malformed("varint overflows 64 bits"));
            }
            x |= u64::from(b & 0x7F) << shift;
            if b < 0x80 {
                if b == 0 {
                    return Err(FormatError::Malformed("overlong varint"));
                }
                return Ok(x);
            }
            shift += 7;
        }
    }

    #[inline]
    fn varint_u32(&mut self) -> Result<u32, FormatError> {
        u32::try_from(self.varint()?).map_err(|_| FormatError::Malformed("varint overflows 32 bits"))
    }

    /// A varint length, checked against `max` (`TooLarge`) and the bytes left (`Malformed`).
    #[inline]
    fn len(&mut self, what: &'static str, max: usize) -> Result<usize, FormatError> {
        let len = self.varint()?;
        if len > max as u64 {
            return Err(FormatError::TooLarge { what, len, max: max as u64 });
        }
        let len = len as usize;
        if len > self.remaining() {
            return Err(SHORT_PAYLOAD);
        }
        Ok(len)
    }

    /// The next `len` bytes (checked by the caller to be present).
    #[inline]
    fn take(&mut self, len: usize) -> Result<&'a [u8], FormatError> {
        let s = self.buf.get(self.pos..self.pos + len).ok_or(SHORT_PAYLOAD)?;
        self.pos += len;
        Ok(s)
    }

    /// One write: flags (with the table packed, or a table varint after it), rid delta,
    /// key_len if keyed, value_len if a put, key, value. The table id is checked (below
    /// `MAX_TABLES`, in the packed form whenever it fits); the rid delta is left to the
    /// caller, which knows the table's previous rid (`next_rid`).
    #[inline]
    fn write(&mut self) -> Result<RawWrite<'a>, FormatError> {
        let flags = self.u8()?;
        let table = match flags >> TABLE_SHIFT {
            0 => {
                let t = self.varint()?;
                if t < u64::from(PACKED_TABLE_LIMIT) {
                    return Err(FormatError::Malformed("table id in long form fits the flags byte"));
                }
                if t >= MAX_TABLES as u64 {
                    return Err(FormatError::Malformed("table id beyond TABLES_MAX"));
                }
                t as u32
            }
            packed => u32::from(packed - 1),
        };
        let rid_delta = self.varint()?;
        let key_len = if flags & WRITE_HAS_KEY != 0 { Some(self.len("key_len", MAX_KEY_LEN)?) } else { None };
        let value_len = if flags & WRITE_DELETE == 0 { Some(self.len("value_len", MAX_VALUE_LEN)?) } else { None };
        let key = match key_len {
            Some(n) => Some(self.take(n)?),
            None => None,
        };
        let value = match value_len {
            Some(n) => Some(self.take(n)?),
            None => None,
        };
        Ok(RawWrite { table, rid_delta, key, value })
    }
}

/// A write as it is in the payload: its rid still a zigzag delta.
struct RawWrite<'a> {
    table: u32,
    rid_delta: u64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
}

/// Reads the header of the transaction at `r`'s position (ts delta, write count) and walks
/// its writes. Returns the transaction and the position after it; `r` is left at the
/// first write. `prev` is the previous transaction's ts (`None` for the first, whose delta
/// is from `first_ts` and must be 0). `rids` is each table's previous rid before the
/// transaction, and after it on return. The view's bases are filled in only if `bases`
/// (validation does not need them).
fn next_txn<'a>(
    r: &mut Reader<'a>,
    prev: Option<Ts>,
    first_ts: Ts,
    rids: &mut Rids,
    bases: bool,
) -> Result<(TxnView<'a>, usize), FormatError> {
    let delta = r.varint()?;
    let ts = match prev {
        None if delta != 0 => return Err(FormatError::Malformed("first txn ts differs from first_ts")),
        None => first_ts,
        Some(_) if delta == 0 => return Err(FormatError::Malformed("txn ts not strictly increasing")),
        Some(p) => Ts(p.0.checked_add(delta).ok_or(FormatError::Malformed("txn ts overflows"))?),
    };
    let write_count = r.varint_u32()?;
    // Refuse early: each write needs at least MIN_WRITE_LEN bytes.
    if write_count as usize > r.remaining() / MIN_WRITE_LEN {
        return Err(FormatError::Malformed("write_count too large for payload"));
    }
    let rest = &r.buf[r.pos..];
    let mut walk = Reader { buf: r.buf, pos: r.pos };
    let mut b = Bases::EMPTY;
    for _ in 0..write_count {
        let w = walk.write()?;
        let t = w.table as usize;
        if bases {
            b.note(t, rids);
        }
        next_rid(&mut rids[t], w.rid_delta)?;
    }
    Ok((TxnView { ts, write_count, rest, bases: b }, walk.pos))
}

/// Checks a whole payload against its header: exactly `txn_count` well-formed
/// transactions with strictly increasing ts from `first_ts` to `last_ts`, and nothing after
/// them. After this, walking the payload (`Payload::txns`) cannot fail.
fn validate_payload(header: &BatchHeader, payload: &[u8]) -> Result<(), FormatError> {
    let mut r = Reader { buf: payload, pos: 0 };
    let mut prev: Option<Ts> = None;
    let mut rids: Rids = [0; MAX_TABLES];
    for _ in 0..header.txn_count {
        let (t, end) = next_txn(&mut r, prev, header.first_ts, &mut rids, false)?;
        r.pos = end;
        prev = Some(t.ts);
    }
    if r.remaining() != 0 {
        return Err(FormatError::Malformed("trailing bytes after last txn"));
    }
    // For an empty batch the header check already required first_ts == last_ts == 0.
    if prev.is_some_and(|last| last != header.last_ts) {
        return Err(FormatError::Malformed("last txn ts differs from last_ts"));
    }
    Ok(())
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
    /// Only zero bytes follow the last batch, from `offset` to the end: space the writer
    /// zeroed ahead of its batches and had not used yet. Acceptable only in a stream's
    /// last segment (the writer cuts the zeros off a segment before it starts the next).
    Zeros { offset: u64 },
    /// The batch at `offset` is damaged and nothing after it proves it was synced: a torn
    /// or zero-filled tail. Acceptable only in a stream's last segment, where the caller
    /// may truncate the file to `offset`. `whole_after` whole batches of the stream follow
    /// it (of the same unsynced write, whose pages reached the disk out of order, and cut
    /// with it); usually none.
    Torn { offset: u64, reason: FormatError, whole_after: u32 },
    /// The batch at `offset` is damaged but valid data follows it (or its checksums
    /// verify, so no torn write explains it): the log is corrupt.
    Corrupt { offset: u64, reason: FormatError },
}

/// LZ4-compresses a batch payload onto the end of `out`. Returns the compressed length, or
/// `None` (with `out` as it was) if LZ4 did not make it shorter. The flusher's only
/// compressor; `ditto bench lz4` times it on real TPC-C payloads.
pub fn compress_payload(raw: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    let start = out.len();
    out.resize(start + lz4_flex::block::get_maximum_output_size(raw.len()), 0);
    match lz4_flex::block::compress_into(raw, &mut out[start..]) {
        Ok(n) if n < raw.len() => {
            out.truncate(start + n);
            Some(n)
        }
        _ => {
            out.truncate(start);
            None
        }
    }
}

/// Walks a whole segment file: header, then batches until the end of the file or the
/// first batch that does not decode, which is classified as `Torn` or `Corrupt` (see the
/// module docs). Errs only if the segment header itself is bad. Never panics.
pub fn read_segment(file: &Bytes) -> Result<SegmentScan, FormatError> {
    read_segment_checking(file, |_| true)
}

/// `read_segment` that looks inside only the payloads `check_inside` is given: a batch
/// `check_inside` returns false for has passed its checksums alone, and its reader must
/// call `Batch::checked_payload_in` before anything else (recovery's replayer does).
pub fn read_segment_checking(
    file: &Bytes,
    mut check_inside: impl FnMut(&Batch) -> bool,
) -> Result<SegmentScan, FormatError> {
    let mut scratch = Vec::new();
    let mut inside = |b: &Batch| if check_inside(b) { b.checked_payload_in(&mut scratch).map(drop) } else { Ok(()) };
    let header = SegmentHeader::decode(file)?;
    // Decoded, so the version is one this build reads; every batch must carry it too.
    let version = u16::from_le_bytes([file[8], file[9]]);
    let mut batches = Vec::new();
    let mut off = SEGMENT_HEADER_LEN;
    // The highest timestamp the stream's batches hold up to `off` (`damaged_end`).
    let mut before = header.epoch_ts_before();
    let end = loop {
        if off == file.len() {
            break SegmentEnd::Clean;
        }
        let rest = file.slice(off..);
        let decoded = decode_batch_checksums(&rest).and_then(|b| inside(&b.0).map(|()| b));
        let reason = match decoded.and_then(|b| belongs(&header, version, b)) {
            Ok((batch, used)) => {
                before = before.max(batch.header.high_ts());
                batches.push((off as u64, batch));
                off += used;
                continue;
            }
            Err(e) => e,
        };
        let offset = off as u64;
        if file[off..].iter().all(|&b| b == 0) {
            break SegmentEnd::Zeros { offset };
        }
        break damaged_end(&rest, offset, reason, &header, before);
    };
    Ok(SegmentScan { header, batches, end })
}

/// How a segment ends at `offset`, where `rest` (the file from there on, not all zeros)
/// failed to read as a batch for `reason`: torn, or damage. `before` is the highest
/// timestamp (a transaction's or a bound) of the stream's batches of this epoch before
/// `offset`: the segment header's `prev_ts` and each earlier batch's `high_ts`.
///
/// Damage is a torn write when nothing after it proves that it had been synced: no later
/// batch of version 6 or on, whole and checked, claims a `synced_ts` above `before` (an
/// fsync had then made a batch at or past `offset` durable, and every byte before it), and
/// no later batch of an older version, which claims nothing, checks out at all. Pages of
/// one write reach a disk in any order before its fsync: a power cut in between may keep a
/// later batch of the write and not an earlier one, and no batch of such a write was ever
/// acknowledged under a durability that syncs (its fsync would have covered the damage).
/// Before version 6 any later batch meant damage, and such a log needed a person.
fn damaged_end(rest: &[u8], offset: u64, reason: FormatError, header: &SegmentHeader, before: Ts) -> SegmentEnd {
    // A later header is looked for past the failed batch's own bytes where its header
    // checks out: inside them lies a client's data, which may hold a header's bytes (a
    // value that does would otherwise turn a torn tail into damage, and the node would
    // not start). A header that does not check out is looked past byte by byte.
    let from = match decode_batch_header(rest) {
        Ok(h) => h.total_len(),
        Err(_) => 1,
    };
    if !reason.could_be_torn() {
        return SegmentEnd::Corrupt { offset, reason };
    }
    match synced_after(rest, from, header, before) {
        Some(whole_after) => SegmentEnd::Torn { offset, reason, whole_after },
        None => SegmentEnd::Corrupt { offset, reason },
    }
}

/// What a torn tail's warning adds where `n` whole batches (`one`, `many`: a replica log's
/// entries) after it, of the same unsynced write, are cut with it: a power cut kept that
/// write's pages out of order (`SegmentEnd::Torn::whole_after`). Nothing where none are.
pub(crate) fn cut_along(n: u32, one: &str, many: &str) -> String {
    match n {
        0 => String::new(),
        1 => format!(
            ", with 1 whole {one} after it from the same unsynced write (its pages reached the disk out of order)"
        ),
        n => format!(
            ", with {n} whole {many} after it from the same unsynced write (its pages reached the disk out of order)"
        ),
    }
}

/// What `scan_segment` found: `read_segment`'s answer without the batches.
#[derive(Debug)]
pub struct SegmentSummary {
    pub header: SegmentHeader,
    pub end: SegmentEnd,
    /// As `SegmentScan::valid_len`.
    pub valid_len: u64,
}

/// Why `scan_segment` found no answer.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Format(#[from] FormatError),
}

/// Zeros are checked this many bytes at a time (`scan_segment`).
const SCAN_ZEROS_CHUNK: usize = 256 << 10;

/// `read_segment` of a segment of `len` bytes read through `read_at` (offset, buffer to
/// fill) a batch at a time: each intact batch goes to `each` with its offset, and is let go.
/// A scan holds one batch in memory (and 256 KiB while it checks a tail of zeros), not
/// the file: a segment is up to 64 MiB, and a primary scanned one whole per returning
/// backup's gap before 2026-12-04. Only where the segment ends in damage (not zeros) is
/// its rest read at once, to tell a torn tail from damage as `read_segment` does. Its
/// answer is `read_segment`'s for the same bytes (a test compares them); for a file
/// still being written, a batch found whole in the rest read at once is taken.
pub fn scan_segment(
    len: u64,
    read_at: &mut dyn FnMut(u64, &mut [u8]) -> std::io::Result<()>,
    each: &mut dyn FnMut(u64, &Batch),
) -> Result<SegmentSummary, ScanError> {
    let mut head = vec![0u8; SEGMENT_HEADER_LEN.min(len as usize)];
    read_at(0, &mut head)?;
    let header = SegmentHeader::decode(&head)?;
    let version = u16::from_le_bytes([head[8], head[9]]);
    let mut scratch = Vec::new();
    let mut read = |b: &Bytes| -> Result<(Batch, usize), FormatError> {
        let (batch, used) = decode_batch_checksums(b)?;
        batch.checked_payload_in(&mut scratch)?;
        belongs(&header, version, (batch, used))
    };
    let mut off = SEGMENT_HEADER_LEN as u64;
    let mut valid_len = off;
    let mut before = header.epoch_ts_before();
    let end = loop {
        if off == len {
            break SegmentEnd::Clean;
        }
        let mut bh = [0u8; BATCH_HEADER_LEN];
        let n = (BATCH_HEADER_LEN as u64).min(len - off) as usize;
        read_at(off, &mut bh[..n])?;
        if let Ok(h) = decode_batch_header(&bh[..n]) {
            let total = h.total_len() as u64;
            if off + total <= len {
                let mut buf = vec![0u8; total as usize];
                read_at(off, &mut buf)?;
                if let Ok((batch, used)) = read(&Bytes::from(buf)) {
                    before = before.max(batch.header.high_ts());
                    each(off, &batch);
                    off += used as u64;
                    valid_len = off;
                    continue;
                }
            }
        }
        // Not a batch here: zeros to the end, or a tail read whole to say what it is.
        let mut chunk = vec![0u8; SCAN_ZEROS_CHUNK.min((len - off) as usize)];
        let (mut p, mut zeros) = (off, true);
        while p < len {
            let n = (chunk.len() as u64).min(len - p) as usize;
            read_at(p, &mut chunk[..n])?;
            if chunk[..n].iter().any(|&b| b != 0) {
                zeros = false;
                break;
            }
            p += n as u64;
        }
        if zeros {
            break SegmentEnd::Zeros { offset: off };
        }
        let mut rest = vec![0u8; (len - off) as usize];
        read_at(off, &mut rest)?;
        let rest = Bytes::from(rest);
        match read(&rest) {
            Err(reason) => break damaged_end(&rest, off, reason, &header, before),
            // Written meanwhile (a file still being written, whose older bytes the batch's
            // own reads saw: through a caller's window, say, where a rest at least as
            // large as the window is read from the file): whole and checked in this one
            // buffer, so taken.
            Ok((batch, used)) => {
                before = before.max(batch.header.high_ts());
                each(off, &batch);
                off += used as u64;
                valid_len = off;
            }
        }
    };
    Ok(SegmentSummary { header, end, valid_len })
}

fn belongs(seg: &SegmentHeader, version: u16, b: (Batch, usize)) -> Result<(Batch, usize), FormatError> {
    let h = &b.0.header;
    if h.version != version {
        return Err(FormatError::Malformed("batch of another format version than its segment"));
    }
    if h.stream != seg.stream {
        return Err(FormatError::StreamMismatch { expected: seg.stream.0, found: h.stream.0 });
    }
    if h.epoch != seg.epoch {
        return Err(FormatError::EpochMismatch { expected: seg.epoch.0, found: h.epoch.0 });
    }
    Ok(b)
}

/// None if anything at an offset >= `from` proves that bytes before it had been synced
/// (`damaged_end`): a valid batch header of this segment (magic, checksum, version, and the
/// segment's stream and epoch) of a version before 6, or a whole batch of version 6 or on
/// whose payload checksum verifies and which claims a `synced_ts` above `before`; else
/// how many whole batches claiming no more it found (the recovery's warning). Linear:
/// jumps between occurrences of the magic's first byte, checksums only candidates that
/// carry the whole magic, and goes past a whole batch by its length (its payload is a
/// client's data).
fn synced_after(file: &[u8], from: usize, seg: &SegmentHeader, before: Ts) -> Option<u32> {
    let (mut p, mut whole_after) = (from, 0);
    while p + BATCH_HEADER_FIXED_LEN <= file.len() {
        let Some(i) = file[p..file.len() - BATCH_HEADER_FIXED_LEN + 1].iter().position(|&x| x == BATCH_MAGIC[0]) else {
            break;
        };
        let cand = &file[p + i..];
        let header = if cand.starts_with(&BATCH_MAGIC) { decode_batch_header(cand).ok() } else { None };
        let Some(h) = header.filter(|h| h.stream == seg.stream && h.epoch == seg.epoch) else {
            p += i + 1;
            continue;
        };
        if h.version < SYNCED_TS_VERSION {
            return None;
        }
        let total = h.total_len();
        let whole = cand.get(h.header_len()..total).filter(|stored| h.payload_checksum(stored) == h.payload_crc);
        match whole {
            Some(_) if h.synced_ts > before => return None,
            // Whole, and claiming no more: of the same unsynced write; looked past.
            Some(_) => {
                whole_after += 1;
                p += i + total;
            }
            // Not whole, or its payload does not check: torn too, and it claims nothing;
            // or a header's bytes in a client's value, whose length may hide a real batch
            // after it: looked past byte by byte.
            None => p += i + 1,
        }
    }
    Some(whole_after)
}
