//! The replication protocol's frames
//! =================================
//! One TCP connection per backup. Every frame is
//!
//! ```text
//!  len u32 (of kind + body) | crc32c u32 (of kind + body) | kind u8 | body
//! ```
//!
//! little endian throughout (docs/replication.md has each body byte by byte). A frame whose
//! checksum does not match, whose kind is unknown or whose body does not parse is a
//! `ProtocolError`: the connection is dropped with that reason logged, and the backup
//! connects again and resumes from what it holds; nothing of a bad frame is applied.
//! Encoding and decoding do no I/O.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ditto_engine::Ts;
use ditto_log::Epoch;

pub const MAGIC: [u8; 8] = *b"DITTOREP";
/// 2 (2026-11-28): `Start::CutAt`, and `Heartbeat::acknowledged`. 3 (2026-11-28):
/// `Batch::counted`. 4 (2026-12-02): `Start::Checkpoint::bytes`. 5 (2026-12-03): batches
/// of log format 5 (`BatchHeader::reuse_ts`), which a backup of an older build cannot read
/// (it dropped the link at the first batch and connected again, for ever). 6 (2026-12-05):
/// `Heartbeat::sent_us` and `Ack::echo_us` (a cluster primary's lease). 7 (2026-12-05):
/// `Hello::database`, `Hello::run`, `Welcome::database` and `Welcome::run`
/// (`crate::identity`; the runs came a few hours after the ids, at 0e71915, before any
/// build of 7 left the day's commits; a Hello of 7 lays out its
/// trailing fields anew, decoded by its version, so a backup of 6 is still told which
/// version the primary speaks). 8 (2026-12-05): batches of log format 6
/// (`BatchHeader::synced_ts`), which a backup of an older build cannot read; frames as in
/// 7. 9 (2026-12-06): a password is proved, never sent (`Hello::proves`, `Challenge`,
/// `Proof`: docs/replication.md, "A password proved, not sent"); a Hello of 9 ends with
/// the backup's nonce, or nothing. A primary refuses a backup of another version, saying
/// which it speaks.
pub const PROTOCOL_VERSION: u32 = 9;
/// The first version whose `Hello` carries a nonce where older ones carried the password.
const HELLO_WITH_PROOF: u32 = 9;
/// What a replication link's proofs are for (`proof::Transcript::purpose`): a proof made
/// for the control plane's hello is not taken here, nor the other way.
pub const LINK_PROOF_PURPOSE: &str = "ditto replication hello 9";

/// What both sides' proofs cover on a replication link: the purpose, the backup's name
/// (the primary names nothing: a backup dials an address, and whoever serves it the
/// database it asks for is its primary), and both nonces; the password's stretch is
/// salted by the primary's `salt` (its database id, LE).
pub fn link_transcript<'a>(
    node: &'a str,
    salt: &'a [u8; 8],
    backup: &'a crate::proof::Nonce,
    primary: &'a crate::proof::Nonce,
) -> crate::proof::Transcript<'a> {
    crate::proof::Transcript {
        purpose: LINK_PROOF_PURPOSE,
        salt,
        connects: node.as_bytes(),
        accepts: b"",
        connects_nonce: backup,
        accepts_nonce: primary,
    }
}
/// The largest frame accepted: the largest batch the log writes (its header and a payload
/// of `MAX_STORED_LEN`, 256 MiB), and change. (160 MiB before 2026-12-03, below what a
/// stream's buffer of up to 64 MiB and one more transaction of up to 128 MiB make: such a
/// batch was refused by every backup, which then asked for it again from disk, for ever;
/// found by a review.)
pub const FRAME_BYTES_MAX: usize = ditto_log::format::MAX_STORED_LEN + (1 << 20);
const _: () = assert!(
    FRAME_BYTES_MAX >= ditto_log::format::BATCH_HEADER_LEN + ditto_log::format::MAX_STORED_LEN + 64,
    "a frame holds the largest batch with its frame's own fields"
);
pub const FRAME_HEADER_LEN: usize = 8;
/// The first version whose `Hello` carries `database` (and always its learner byte).
const HELLO_WITH_DATABASE: u32 = 7;

/// A password (a server's `requirepass` and `masterauth`, or a cluster's secret), as a
/// primary and a backup keep it: proved on the link, never sent (`crate::proof`), never
/// printed (its `Debug` hides it, so options printed for a log do too).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.to_string())
    }
}

#[derive(Clone, PartialEq, Eq)]
pub enum Frame {
    /// Backup -> primary, first: who it follows and what it holds; `learner`: a cluster's
    /// learner, whose acknowledgements the primary never counts in its commit quorum
    /// (a byte after `node`; absent, as a peer before it sends it, means a backup);
    /// `proves`: where the backup holds a password (its `masterauth`, or the cluster's
    /// secret), its nonce: the primary answers with a `Challenge`, and the backup proves
    /// it holds the password only once the primary proved it holds one the backup takes
    /// (`Proof`). Before version 9 the password itself came here, in the clear; a Hello of
    /// an older version is decoded without it (to be told the version), the password
    /// dropped unread.
    /// `database`: the id of the database the backup's directory holds (`crate::identity`;
    /// 0: none), which a primary of another refuses before it records or sends anything.
    /// `run`: the run of the primary that served the epoch it follows (`Primary::run`; 0:
    /// not recorded), which a primary serving that epoch number in another run refuses.
    /// From version 7 the learner byte, the id and the run (u64 each) always follow
    /// `node`, then `auth` where given; a Hello of an older version is laid out (and
    /// decoded) as that version's, without them.
    Hello {
        version: u32,
        epoch: Epoch,
        have_ts: Ts,
        node: String,
        learner: bool,
        proves: Option<crate::proof::Nonce>,
        database: u64,
        run: u64,
    },
    /// Primary -> backup, right after a `Hello` that `proves`, where the primary asks a
    /// password of its backups: the salt of the password's stretch (its database id), its
    /// nonce, and its proof that it holds its password (`crate::proof`, `Side::Accepts`,
    /// over `link_transcript`).
    Challenge { salt: u64, nonce: crate::proof::Nonce, proof: crate::proof::Proof },
    /// Backup -> primary, once it took the `Challenge`'s proof: its own (`Side::Connects`).
    Proof { proof: crate::proof::Proof },
    /// Primary -> backup: the answer to `Hello`. `database`: the id of the database the
    /// primary serves (`crate::identity`; 0: none said), which a backup holding another
    /// refuses; `run`: this run of the primary (`Primary::run`), which a backup that
    /// followed the same epoch number in another run refuses.
    Welcome { epoch: Epoch, streams: u32, tables: Vec<(u32, String)>, start: Start, database: u64, run: u64 },
    /// Primary -> backup: a piece of a checkpoint file (`start` was `Checkpoint`).
    File { name: String, offset: u64, data: Bytes, last: bool },
    /// Primary -> backup: every file of the checkpoint at `ts` was sent.
    CheckpointDone { ts: Ts },
    /// Primary -> backup: a table was created (before any batch writes to it).
    Table { id: u32, name: String },
    /// Primary -> backup: one log batch as the primary framed it. `released` is the
    /// primary's release watermark when it was sent; `floor_trusted` says whether it was
    /// shipped in framing order (live) or read back from disk (a gap); `counted`, that a
    /// commit of it may be acknowledged to its client on backups' acknowledgements alone
    /// (a policy in use on the primary when it was sent lets backups release without its
    /// fsync, `QuorumRecord::backups_release`), so the backup's own acknowledgement of it
    /// may be what released it.
    Batch { epoch: Epoch, released: Ts, floor_trusted: bool, counted: bool, batch: Bytes },
    /// Primary -> backup, when there is nothing to send: the release watermark; and the
    /// highest release of any commit policy (a connection may choose a weaker one than the
    /// server's), at or above it: no commit above it has been acknowledged to a client. A
    /// backup reads at `released`, and will not cut away what it holds at or below
    /// `acknowledged` (`JoinAgain::CutAt`). Sent when either moves, within a millisecond
    /// while the link is busy; an idle link (`Primary::serve_link` dozing) sends a move of
    /// `released` at once, but one of `acknowledged` alone at its next idle heartbeat
    /// (within 200 ms: a commit acknowledged under `local` is on the primary's disk, and
    /// one released on backups' acknowledgements was shipped `counted`). `sent_us`: when
    /// the primary made it, in microseconds on its own clock (0: no time said); the backup
    /// echoes the newest it received in its acks (`Ack::echo_us`).
    Heartbeat { released: Ts, acknowledged: Ts, sent_us: u64 },
    /// Backup -> primary: its watermarks (every commit at or below each is received, made
    /// durable, replayed on the backup); `echo_us`: the newest `Heartbeat::sent_us` it had
    /// received on this link when it sent this (0: none). A cluster primary counts the
    /// backup heard as of that time, not this ack's arrival, which a network can delay
    /// without bound (its lease stands on it: docs/cluster.md, "The old primary's lease").
    Ack { received: Ts, durable: Ts, replayed: Ts, echo_us: u64 },
    /// Either way, before closing: why.
    Refuse { reason: String },
}

/// How a backup starts after `Welcome`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// The backup's `have_ts` is served from the log: batches follow.
    Resume,
    /// A checkpoint at `ts` follows (`File`s, `CheckpointDone`), then batches; its files
    /// hold `bytes` in all (for the backup's progress).
    Checkpoint { ts: Ts, bytes: u64 },
    /// Nothing follows (the primary closes the link): this primary's epoch opened from
    /// the epoch the backup follows, cut at `point`, and the backup holds more than that
    /// (what the old primary lost). Cut at `point` (everything above dropped), it is
    /// resumed from the log; one that cannot cut so asks for a checkpoint instead.
    CutAt { point: Ts },
}

#[derive(thiserror::Error, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("frame checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("frame of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

mod kind {
    pub const HELLO: u8 = 1;
    pub const WELCOME: u8 = 2;
    pub const FILE: u8 = 3;
    pub const CHECKPOINT_DONE: u8 = 4;
    pub const TABLE: u8 = 5;
    pub const BATCH: u8 = 6;
    pub const HEARTBEAT: u8 = 7;
    pub const ACK: u8 = 8;
    pub const REFUSE: u8 = 9;
    pub const CHALLENGE: u8 = 10;
    pub const PROOF: u8 = 11;
}

fn put_str(b: &mut BytesMut, s: &str) {
    b.put_u32_le(s.len() as u32);
    b.put_slice(s.as_bytes());
}

fn get_str(b: &mut Bytes) -> Result<String, ProtocolError> {
    let n = get_u32(b)? as usize;
    if b.remaining() < n {
        return Err(ProtocolError::Malformed("string cut short"));
    }
    String::from_utf8(b.split_to(n).to_vec()).map_err(|_| ProtocolError::Malformed("string not UTF-8"))
}

fn get_u32(b: &mut Bytes) -> Result<u32, ProtocolError> {
    if b.remaining() < 4 {
        return Err(ProtocolError::Malformed("cut short"));
    }
    Ok(b.get_u32_le())
}

fn get_u64(b: &mut Bytes) -> Result<u64, ProtocolError> {
    if b.remaining() < 8 {
        return Err(ProtocolError::Malformed("cut short"));
    }
    Ok(b.get_u64_le())
}

fn get_array<const N: usize>(b: &mut Bytes) -> Result<[u8; N], ProtocolError> {
    if b.remaining() < N {
        return Err(ProtocolError::Malformed("cut short"));
    }
    let mut a = [0u8; N];
    b.copy_to_slice(&mut a);
    Ok(a)
}

fn get_u8(b: &mut Bytes) -> Result<u8, ProtocolError> {
    if b.remaining() < 1 {
        return Err(ProtocolError::Malformed("cut short"));
    }
    Ok(b.get_u8())
}

/// At most this many characters of a peer's string in a frame's `Debug` output.
const DEBUG_STR_MAX: usize = 200;

/// Short, whatever the frame holds: its bytes by their count and its strings cut, since a
/// frame that was not expected is written into an error and a log line (before
/// 2026-12-02 a 160 MiB frame became a 640 MiB string, on every reconnect).
impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = |s: &str| -> String {
            match s.char_indices().nth(DEBUG_STR_MAX) {
                Some((at, _)) => format!("{:?}.. ({} bytes)", &s[..at], s.len()),
                None => format!("{s:?}"),
            }
        };
        match self {
            Frame::Hello { version, epoch, have_ts, node, learner, proves, database, run } => write!(
                f,
                "Hello {{ version: {version}, epoch: {epoch:?}, have_ts: {have_ts:?}, node: {}, learner: {learner}, proves: {}, database: {database:016x}, run: {run:016x} }}",
                cut(node),
                proves.is_some()
            ),
            Frame::Challenge { .. } => write!(f, "Challenge {{ .. }}"),
            Frame::Proof { .. } => write!(f, "Proof {{ .. }}"),
            Frame::Welcome { epoch, streams, tables, start, database, run } => {
                let names: Vec<String> = tables.iter().take(8).map(|(id, n)| format!("{id}={}", cut(n))).collect();
                write!(
                    f,
                    "Welcome {{ epoch: {epoch:?}, streams: {streams}, tables: {} [{}{}], start: {start:?}, database: {database:016x}, run: {run:016x} }}",
                    tables.len(),
                    names.join(", "),
                    if tables.len() > 8 { ", .." } else { "" }
                )
            }
            Frame::File { name, offset, data, last } => {
                write!(f, "File {{ name: {}, offset: {offset}, data: {} bytes, last: {last} }}", cut(name), data.len())
            }
            Frame::CheckpointDone { ts } => write!(f, "CheckpointDone {{ ts: {ts:?} }}"),
            Frame::Table { id, name } => write!(f, "Table {{ id: {id}, name: {} }}", cut(name)),
            Frame::Batch { epoch, released, floor_trusted, counted, batch } => write!(
                f,
                "Batch {{ epoch: {epoch:?}, released: {released:?}, floor_trusted: {floor_trusted}, counted: {counted}, batch: {} bytes }}",
                batch.len()
            ),
            Frame::Heartbeat { released, acknowledged, sent_us } => {
                write!(f, "Heartbeat {{ released: {released:?}, acknowledged: {acknowledged:?}, sent_us: {sent_us} }}")
            }
            Frame::Ack { received, durable, replayed, echo_us } => write!(
                f,
                "Ack {{ received: {received:?}, durable: {durable:?}, replayed: {replayed:?}, echo_us: {echo_us} }}"
            ),
            Frame::Refuse { reason } => write!(f, "Refuse {{ reason: {} }}", cut(reason)),
        }
    }
}

impl Frame {
    /// The whole frame, header included.
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64);
        b.put_bytes(0, FRAME_HEADER_LEN);
        match self {
            Frame::Hello { version, epoch, have_ts, node, learner, proves, database, run } => {
                b.put_u8(kind::HELLO);
                b.put_slice(&MAGIC);
                b.put_u32_le(*version);
                b.put_u64_le(epoch.0);
                b.put_u64_le(have_ts.0);
                put_str(&mut b, node);
                if *version >= HELLO_WITH_DATABASE {
                    b.put_u8(u8::from(*learner));
                    b.put_u64_le(*database);
                    b.put_u64_le(*run);
                } else if *learner {
                    b.put_u8(u8::from(*learner));
                }
                // (A nonce only from version 9; an older version's Hello is made only by
                // tests, to see it refused.)
                if let Some(n) = proves.filter(|_| *version >= HELLO_WITH_PROOF) {
                    b.put_slice(&n);
                }
            }
            Frame::Challenge { salt, nonce, proof } => {
                b.put_u8(kind::CHALLENGE);
                b.put_u64_le(*salt);
                b.put_slice(nonce);
                b.put_slice(proof);
            }
            Frame::Proof { proof } => {
                b.put_u8(kind::PROOF);
                b.put_slice(proof);
            }
            Frame::Welcome { epoch, streams, tables, start, database, run } => {
                b.put_u8(kind::WELCOME);
                b.put_slice(&MAGIC);
                b.put_u64_le(epoch.0);
                b.put_u32_le(*streams);
                b.put_u32_le(tables.len() as u32);
                for (id, name) in tables {
                    b.put_u32_le(*id);
                    put_str(&mut b, name);
                }
                match start {
                    Start::Resume => b.put_u8(0),
                    Start::CutAt { point } => {
                        b.put_u8(2);
                        b.put_u64_le(point.0);
                    }
                    Start::Checkpoint { ts, bytes } => {
                        b.put_u8(1);
                        b.put_u64_le(ts.0);
                        b.put_u64_le(*bytes);
                    }
                }
                b.put_u64_le(*database);
                b.put_u64_le(*run);
            }
            Frame::File { name, offset, data, last } => {
                b.put_u8(kind::FILE);
                put_str(&mut b, name);
                b.put_u64_le(*offset);
                b.put_u8(u8::from(*last));
                b.put_slice(data);
            }
            Frame::CheckpointDone { ts } => {
                b.put_u8(kind::CHECKPOINT_DONE);
                b.put_u64_le(ts.0);
            }
            Frame::Table { id, name } => {
                b.put_u8(kind::TABLE);
                b.put_u32_le(*id);
                put_str(&mut b, name);
            }
            Frame::Batch { epoch, released, floor_trusted, counted, batch } => {
                put_batch_body(
                    &mut b,
                    *epoch,
                    *released,
                    BatchFlags { floor_trusted: *floor_trusted, counted: *counted },
                    batch,
                );
            }
            Frame::Heartbeat { released, acknowledged, sent_us } => {
                b.put_u8(kind::HEARTBEAT);
                b.put_u64_le(released.0);
                b.put_u64_le(acknowledged.0);
                b.put_u64_le(*sent_us);
            }
            Frame::Ack { received, durable, replayed, echo_us } => {
                b.put_u8(kind::ACK);
                b.put_u64_le(received.0);
                b.put_u64_le(durable.0);
                b.put_u64_le(replayed.0);
                b.put_u64_le(*echo_us);
            }
            Frame::Refuse { reason } => {
                b.put_u8(kind::REFUSE);
                let mut cut = REFUSE_REASON_MAX.min(reason.len());
                while !reason.is_char_boundary(cut) {
                    cut -= 1;
                }
                put_str(&mut b, &reason[..cut]);
            }
        }
        seal(b)
    }

    /// The body length a frame header announces (checked against the limit).
    pub fn body_len(header: &[u8; FRAME_HEADER_LEN]) -> Result<usize, ProtocolError> {
        let len = u32::from_le_bytes(header[..4].try_into().expect("4")) as usize;
        if len > FRAME_BYTES_MAX {
            return Err(ProtocolError::TooLarge(len));
        }
        if len == 0 {
            return Err(ProtocolError::Malformed("empty frame"));
        }
        Ok(len)
    }

    /// Decodes a frame from its header and its body (`body_len` bytes).
    pub fn decode(header: &[u8; FRAME_HEADER_LEN], body: Bytes) -> Result<Frame, ProtocolError> {
        let stored = u32::from_le_bytes(header[4..8].try_into().expect("4"));
        let computed = crc32c::crc32c(&body);
        if stored != computed {
            return Err(ProtocolError::Checksum { stored, computed });
        }
        let mut b = body;
        let k = get_u8(&mut b)?;
        let magic = |b: &mut Bytes| -> Result<(), ProtocolError> {
            if b.remaining() < 8 || b.split_to(8)[..] != MAGIC {
                return Err(ProtocolError::Malformed("not a ditto replication peer (bad magic)"));
            }
            Ok(())
        };
        let f = match k {
            kind::HELLO => {
                magic(&mut b)?;
                let (version, epoch, have_ts, node) =
                    (get_u32(&mut b)?, Epoch(get_u64(&mut b)?), Ts(get_u64(&mut b)?), get_str(&mut b)?);
                let (learner, database, run) = if version >= HELLO_WITH_DATABASE {
                    let learner = match get_u8(&mut b)? {
                        0 => false,
                        1 => true,
                        _ => return Err(ProtocolError::Malformed("a learner flag other than 0 or 1")),
                    };
                    (learner, get_u64(&mut b)?, get_u64(&mut b)?)
                } else {
                    let learner = match b.has_remaining() {
                        false => false,
                        true => match get_u8(&mut b)? {
                            1 => true,
                            // (0 only where a password follows.)
                            0 if b.has_remaining() => false,
                            _ => return Err(ProtocolError::Malformed("a learner flag other than 1")),
                        },
                    };
                    (learner, 0, 0)
                };
                let proves = if version >= HELLO_WITH_PROOF {
                    match b.remaining() {
                        0 => None,
                        crate::proof::NONCE_BYTES => Some(get_array(&mut b)?),
                        _ => return Err(ProtocolError::Malformed("a hello's nonce of another length")),
                    }
                } else {
                    // An older version's password: dropped unread (the version is refused).
                    if b.has_remaining() {
                        get_str(&mut b)?;
                    }
                    None
                };
                Frame::Hello { version, epoch, have_ts, node, learner, proves, database, run }
            }
            kind::WELCOME => {
                magic(&mut b)?;
                let epoch = Epoch(get_u64(&mut b)?);
                let streams = get_u32(&mut b)?;
                let n = get_u32(&mut b)? as usize;
                if n > ditto_engine::TABLES_MAX {
                    return Err(ProtocolError::Malformed("too many tables"));
                }
                let mut tables = Vec::with_capacity(n);
                for _ in 0..n {
                    tables.push((get_u32(&mut b)?, get_str(&mut b)?));
                }
                let start = match get_u8(&mut b)? {
                    0 => Start::Resume,
                    1 => Start::Checkpoint { ts: Ts(get_u64(&mut b)?), bytes: get_u64(&mut b)? },
                    2 => Start::CutAt { point: Ts(get_u64(&mut b)?) },
                    _ => return Err(ProtocolError::Malformed("unknown start")),
                };
                let database = get_u64(&mut b)?;
                Frame::Welcome { epoch, streams, tables, start, database, run: get_u64(&mut b)? }
            }
            kind::FILE => {
                let name = get_str(&mut b)?;
                let offset = get_u64(&mut b)?;
                let last = get_u8(&mut b)? != 0;
                Frame::File { name, offset, data: std::mem::take(&mut b), last }
            }
            kind::CHECKPOINT_DONE => Frame::CheckpointDone { ts: Ts(get_u64(&mut b)?) },
            kind::TABLE => Frame::Table { id: get_u32(&mut b)?, name: get_str(&mut b)? },
            kind::BATCH => {
                let epoch = Epoch(get_u64(&mut b)?);
                let released = Ts(get_u64(&mut b)?);
                let flags = get_u8(&mut b)?;
                if flags & !(FLOOR_TRUSTED | COUNTED) != 0 {
                    return Err(ProtocolError::Malformed("batch flag"));
                }
                let (floor_trusted, counted) = (flags & FLOOR_TRUSTED != 0, flags & COUNTED != 0);
                Frame::Batch { epoch, released, floor_trusted, counted, batch: std::mem::take(&mut b) }
            }
            kind::HEARTBEAT => Frame::Heartbeat {
                released: Ts(get_u64(&mut b)?),
                acknowledged: Ts(get_u64(&mut b)?),
                sent_us: get_u64(&mut b)?,
            },
            kind::ACK => Frame::Ack {
                received: Ts(get_u64(&mut b)?),
                durable: Ts(get_u64(&mut b)?),
                replayed: Ts(get_u64(&mut b)?),
                echo_us: get_u64(&mut b)?,
            },
            kind::REFUSE => Frame::Refuse { reason: get_str(&mut b)? },
            kind::CHALLENGE => {
                Frame::Challenge { salt: get_u64(&mut b)?, nonce: get_array(&mut b)?, proof: get_array(&mut b)? }
            }
            kind::PROOF => Frame::Proof { proof: get_array(&mut b)? },
            k => return Err(ProtocolError::UnknownKind(k)),
        };
        if b.has_remaining() {
            return Err(ProtocolError::Malformed("trailing bytes"));
        }
        Ok(f)
    }
}

/// A `Batch` frame straight from the batch's bytes: `Frame::Batch { .. }.encode()` without
/// first copying the batch into a `Bytes` (the primary's tap, once per batch).
pub fn encode_batch(epoch: Epoch, released: Ts, flags: BatchFlags, batch: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(FRAME_HEADER_LEN + 18 + batch.len());
    b.put_bytes(0, FRAME_HEADER_LEN);
    put_batch_body(&mut b, epoch, released, flags, batch);
    seal(b)
}

/// `Frame::Batch`'s two flags (one byte on the wire: bit 0 `floor_trusted`, bit 1
/// `counted`; any other bit set is a malformed frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchFlags {
    pub floor_trusted: bool,
    pub counted: bool,
}

const FLOOR_TRUSTED: u8 = 1;
const COUNTED: u8 = 2;

fn put_batch_body(b: &mut BytesMut, epoch: Epoch, released: Ts, flags: BatchFlags, batch: &[u8]) {
    b.reserve(batch.len() + BATCH_BODY_PREFIX);
    b.put_u8(kind::BATCH);
    b.put_u64_le(epoch.0);
    b.put_u64_le(released.0);
    b.put_u8(if flags.floor_trusted { FLOOR_TRUSTED } else { 0 } | if flags.counted { COUNTED } else { 0 });
    b.put_slice(batch);
}

/// Fills in the header (body length and checksum) of a frame built after its zeroed header.
fn seal(mut b: BytesMut) -> Bytes {
    let len = b.len() - FRAME_HEADER_LEN;
    let crc = crc32c::crc32c(&b[FRAME_HEADER_LEN..]);
    b[..4].copy_from_slice(&(len as u32).to_le_bytes());
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b.freeze()
}

fn truncated(at_least: usize, of: usize) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("truncated frame: the stream ended after {at_least}+ of its {of} bytes"),
    )
}

/// Takes the first whole frame off the front of `buf`, the bytes a non-blocking reader
/// has gathered (no I/O); `Ok(None)` while no whole frame is there yet (room for the rest
/// of one is reserved). The checks are `read_frame`'s.
pub fn take_frame(buf: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
    take_frame_at_most(buf, FRAME_BYTES_MAX)
}

/// The most a backup's frame holds, as its primary reads them: a backup sends only
/// acknowledgements and a refusal, so a primary reserves no more than this for one (it
/// took up to `FRAME_BYTES_MAX` from a backup before 2026-12-02: 160 MiB counted against
/// its `maxmemory` for a header alone).
pub const BACKUP_FRAME_BYTES_MAX: usize = 64 << 10;

/// `take_frame`, refusing a frame whose body is longer than `max` from its header alone.
pub fn take_frame_at_most(buf: &mut BytesMut, max: usize) -> Result<Option<Frame>, ProtocolError> {
    if buf.len() < FRAME_HEADER_LEN {
        return Ok(None);
    }
    let h: [u8; FRAME_HEADER_LEN] = buf[..FRAME_HEADER_LEN].try_into().expect("length checked");
    let len = Frame::body_len(&h)?;
    if len > max {
        return Err(ProtocolError::TooLarge(len));
    }
    let whole = FRAME_HEADER_LEN + len;
    if buf.len() < whole {
        buf.reserve(whole - buf.len());
        return Ok(None);
    }
    let body = buf.split_to(whole).split_off(FRAME_HEADER_LEN).freeze();
    Frame::decode(&h, body).map(Some)
}

/// Reads one frame from a blocking reader. `Ok(None)` at a clean end of stream (between
/// frames); a stream that ends inside a frame is an `UnexpectedEof` error naming it.
pub fn read_frame(r: &mut impl std::io::Read) -> std::io::Result<Option<Frame>> {
    read_frame_at_most(r, FRAME_BYTES_MAX)
}

/// `read_frame`, refusing a frame whose body is longer than `max` before it allocates it
/// (a primary reading a peer's first frame: a header alone must not make it allocate
/// `FRAME_BYTES_MAX`).
pub fn read_frame_at_most(r: &mut impl std::io::Read, max: usize) -> std::io::Result<Option<Frame>> {
    read_frame_paced(r, max, FRAME_BODY_GRACE, FRAME_BODY_MIN_BYTES_PER_S)
}

/// Once a frame's header has come, its body must come within `FRAME_BODY_GRACE` and a
/// second per `FRAME_BODY_MIN_BYTES_PER_S` of its length, or the read fails (the link is
/// dropped and resumed). The length field is not under the frame's checksum, which is
/// checked only once the whole body is read: a damaged one named a body of up to 257 MiB
/// that the primary's heartbeats (26 bytes each 200 ms) would fill for hours, every read
/// answering within the link's silence bound, while the backup learned nothing and
/// acknowledged nothing (found by a review, 2026-12-03). A batch frame's length is also
/// checked against its batch's own header (under that header's checksum) as soon as it
/// has come, so a damaged one fails at once, and the rest of a batch whose length checked
/// is given the slower `BATCH_BODY_MIN_BYTES_PER_S`, so that a sound 257 MiB batch on a
/// slow link is not cut off (and resent, and cut off again). Every other frame a primary
/// sends is small (a checkpoint's file chunks are 1 MiB).
pub const FRAME_BODY_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
pub const FRAME_BODY_MIN_BYTES_PER_S: u64 = 1 << 20;
pub const BATCH_BODY_MIN_BYTES_PER_S: u64 = 64 << 10;

/// A batch frame's body before its batch: kind, epoch, release, flags.
const BATCH_BODY_PREFIX: usize = 1 + 8 + 8 + 1;
/// The most data a checkpoint's `File` frame carries (the primary sends 1 MiB at a time).
pub const FILE_CHUNK_MAX: usize = 1 << 20;
/// The longest name a `File` frame carries (a checkpoint's files are named by ditto, in a
/// few dozen bytes; Linux's `PATH_MAX`).
pub const FILE_NAME_MAX: usize = 4096;
/// The longest reason a `Refuse` carries; a longer one is cut when encoded.
pub const REFUSE_REASON_MAX: usize = 8 << 10;

/// The longest body a frame of `k` may have, where its kind bounds it below
/// `FRAME_BYTES_MAX` (`None`: a batch, checked against its own header, a hello, which a
/// primary reads under `HELLO_BYTES_MAX`, or a frame of fixed length). A damaged length
/// field on a rare frame fails as soon as the frame's first bytes have come, as a batch's
/// or a heartbeat's does, not after the body's pace (up to 260 s at 1 MiB/s).
fn body_len_max(k: u8) -> Option<usize> {
    use ditto_engine::{TABLES_MAX, TABLE_NAME_MAX};
    match k {
        kind::WELCOME => Some(1 + MAGIC.len() + 8 + 4 + 4 + TABLES_MAX * (4 + 4 + TABLE_NAME_MAX) + 1 + 16 + 16),
        kind::FILE => Some(1 + 4 + FILE_NAME_MAX + 8 + 1 + FILE_CHUNK_MAX),
        kind::CHECKPOINT_DONE => Some(1 + 8),
        kind::TABLE => Some(1 + 4 + 4 + TABLE_NAME_MAX),
        kind::REFUSE => Some(1 + 4 + REFUSE_REASON_MAX),
        _ => None,
    }
}
/// A heartbeat's body (kind, release, acknowledged) and an ack's (kind, three positions).
const HEARTBEAT_BODY_LEN: usize = 1 + 3 * 8;
const ACK_BODY_LEN: usize = 1 + 4 * 8;

/// A reader that refuses to read on past `until` (`read_frame_paced`); each read blocks
/// as the inner reader's own timeout allows.
struct Within<'a, R> {
    r: &'a mut R,
    until: std::time::Instant,
    len: usize,
    /// The pace `until` was set by, for the error.
    rate: u64,
}

impl<R: std::io::Read> std::io::Read for Within<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if std::time::Instant::now() >= self.until {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a frame's body of {} bytes did not come in time (at least {} B/s after a grace): its length field may be damaged",
                    self.len, self.rate
                ),
            ));
        }
        self.r.read(buf)
    }
}

/// `read_frame_at_most` with the body's pace given (`FRAME_BODY_GRACE`).
fn read_frame_paced(
    r: &mut impl std::io::Read,
    max: usize,
    grace: std::time::Duration,
    min_bytes_per_s: u64,
) -> std::io::Result<Option<Frame>> {
    let mut h = [0u8; FRAME_HEADER_LEN];
    // The end of the stream between frames is a close; anywhere else, a truncated frame.
    let mut got = 0;
    while got < h.len() {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(truncated(got, FRAME_HEADER_LEN)),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = Frame::body_len(&h).map_err(std::io::Error::other)?;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes where at most {max} are taken"),
        ));
    }
    let mut body = vec![0u8; len];
    let began = std::time::Instant::now();
    let pace = |rate: u64| began + grace + std::time::Duration::from_secs_f64(len as f64 / rate as f64);
    let until = pace(min_bytes_per_s);
    let rate = min_bytes_per_s;
    let eof = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => truncated(FRAME_HEADER_LEN, FRAME_HEADER_LEN + len),
        _ => e,
    };
    let mut within = Within { r, until, len, rate };
    // A batch's header first: the batch it announces must fill the frame exactly.
    let pre = len.min(BATCH_BODY_PREFIX + ditto_log::format::BATCH_HEADER_LEN);
    std::io::Read::read_exact(&mut within, &mut body[..pre]).map_err(eof)?;
    let damaged = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    // The frames of a fixed length (a heartbeat, the commonest on an idle link; an ack; a
    // hello's challenge and proof).
    let fixed = match body[0] {
        kind::HEARTBEAT => Some(HEARTBEAT_BODY_LEN),
        kind::ACK => Some(ACK_BODY_LEN),
        kind::CHALLENGE => Some(1 + 8 + crate::proof::NONCE_BYTES + crate::proof::PROOF_BYTES),
        kind::PROOF => Some(1 + crate::proof::PROOF_BYTES),
        _ => None,
    };
    if let Some(n) = fixed.filter(|&n| n != len) {
        return Err(damaged(format!(
            "a frame of kind {} of {len} bytes, not {n}: its length field is damaged",
            body[0]
        )));
    }
    // Where more is to come, a length its kind cannot have fails now (a body already
    // whole goes on to its checksum, which names damage anywhere in it).
    if len > pre {
        if let Some(n) = body_len_max(body[0]).filter(|&n| len > n) {
            return Err(damaged(format!(
                "a frame of kind {} of {len} bytes, over the {n} its kind may hold: its length field is damaged",
                body[0]
            )));
        }
        if !(kind::HELLO..=kind::PROOF).contains(&body[0]) {
            return Err(std::io::Error::other(ProtocolError::UnknownKind(body[0])));
        }
    }
    if body[0] == kind::BATCH && pre == BATCH_BODY_PREFIX + ditto_log::format::BATCH_HEADER_LEN {
        let h = ditto_log::format::decode_batch_header(&body[BATCH_BODY_PREFIX..])
            .map_err(|e| damaged(format!("a batch frame whose batch header does not check: {e}")))?;
        if BATCH_BODY_PREFIX + h.total_len() != len {
            return Err(damaged(format!(
                "a batch frame of {len} bytes holding a batch of {}: its length field is damaged",
                h.total_len()
            )));
        }
        within.rate = min_bytes_per_s.min(BATCH_BODY_MIN_BYTES_PER_S);
        within.until = pace(within.rate);
    }
    std::io::Read::read_exact(&mut within, &mut body[pre..]).map_err(eof)?;
    Frame::decode(&h, Bytes::from(body)).map(Some).map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest batch the log writes (its header and a stored payload of
    /// `MAX_STORED_LEN`) fits a frame; one byte more than the bound does not.
    #[test]
    fn the_largest_batch_the_log_writes_fits_a_frame() {
        let header = |len: usize| {
            let mut h = [0u8; FRAME_HEADER_LEN];
            h[..4].copy_from_slice(&u32::try_from(len).unwrap().to_le_bytes());
            h
        };
        let batch = ditto_log::format::BATCH_HEADER_LEN + ditto_log::format::MAX_STORED_LEN;
        // A batch frame's body: its kind, epoch, release and flags (18 bytes), then the batch.
        let body = 18 + batch;
        assert_eq!(Frame::body_len(&header(body)).unwrap(), body);
        assert!(matches!(Frame::body_len(&header(FRAME_BYTES_MAX + 1)), Err(ProtocolError::TooLarge(_))));
    }

    /// A primary takes from a backup frames of at most `BACKUP_FRAME_BYTES_MAX`: a header
    /// announcing more is refused before anything is reserved for it (it reserved up to
    /// 160 MiB); an acknowledgement passes.
    #[test]
    fn a_backups_frame_over_its_bound_is_refused_from_its_header() {
        let big = Frame::File { name: "x".into(), offset: 0, data: vec![1u8; 1 << 20].into(), last: true }.encode();
        let mut buf = BytesMut::from(&big[..FRAME_HEADER_LEN]);
        assert!(matches!(take_frame_at_most(&mut buf, BACKUP_FRAME_BYTES_MAX), Err(ProtocolError::TooLarge(_))));
        assert!(buf.capacity() < 1 << 16, "nothing reserved for it: {}", buf.capacity());
        let ack = Frame::Ack { received: Ts(3), durable: Ts(2), replayed: Ts(1), echo_us: 77 };
        let mut buf = BytesMut::from(&ack.encode()[..]);
        assert_eq!(take_frame_at_most(&mut buf, BACKUP_FRAME_BYTES_MAX).unwrap(), Some(ack));
    }

    /// A frame whose body comes at the pace asked is read; one whose length field names
    /// more than comes (a damaged length, then heartbeats trickling in) fails once its
    /// time is up, not when the body is finally full.
    #[test]
    fn a_frames_body_that_does_not_come_in_time_fails_the_read() {
        use std::time::{Duration, Instant};
        /// One byte a millisecond: `bytes`, then zeros for ever.
        struct Trickle(Vec<u8>, usize);
        impl std::io::Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                std::thread::sleep(Duration::from_millis(1));
                buf[0] = self.0.get(self.1).copied().unwrap_or(0);
                self.1 += 1;
                Ok(1)
            }
        }
        // (A frame of no fixed length: a heartbeat's or an ack's is checked at once.)
        let refuse = Frame::Refuse { reason: "no".into() };
        let sound = refuse.encode().to_vec();
        let rate = 10_000;
        let got = read_frame_paced(&mut Trickle(sound.clone(), 0), 1 << 20, Duration::from_secs(5), rate).unwrap();
        assert_eq!(got, Some(refuse), "a body at the pace asked");
        let mut damaged = sound;
        // (Within what a refusal may hold: a longer one fails at once.)
        damaged[..4].copy_from_slice(&8_000u32.to_le_bytes());
        let t = Instant::now();
        let e = read_frame_paced(&mut Trickle(damaged, 0), 1 << 20, Duration::from_millis(200), rate).unwrap_err();
        assert!(e.to_string().contains("did not come in time"), "{e}");
        // 8,000 bytes at 10,000 a second after the grace: 1.0 s, not the 8 s the trickle
        // would take.
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    /// A batch frame whose length disagrees with its batch's own header (under the
    /// batch header's checksum) fails as soon as that header has come, not once the body
    /// it names is full; a sound one is read.
    #[test]
    fn a_batch_frames_damaged_length_fails_at_its_batch_header() {
        let mut batch = Vec::new();
        ditto_log::format::BatchBuilder::new().finish_vouching_into(
            ditto_log::StreamId(0),
            Epoch(1),
            Ts(5),
            Ts(5),
            false,
            &mut batch,
        );
        let flags = BatchFlags { floor_trusted: false, counted: false };
        let frame = encode_batch(Epoch(1), Ts(5), flags, &batch).to_vec();
        assert!(matches!(read_frame(&mut &frame[..]).unwrap(), Some(Frame::Batch { .. })));
        let len = u32::from_le_bytes(frame[..4].try_into().unwrap());
        for wrong in [len ^ (1 << 20), len + 1] {
            let mut damaged = frame.clone();
            damaged[..4].copy_from_slice(&wrong.to_le_bytes());
            // Only the frame's own bytes: a read past them would fail otherwise.
            let e = read_frame(&mut &damaged[..]).unwrap_err();
            assert!(e.to_string().contains("its length field is damaged"), "{e}");
        }
        // A heartbeat's too (a fixed length), followed by more heartbeats.
        let hb = Frame::Heartbeat { released: Ts(1), acknowledged: Ts(1), sent_us: 5 }.encode().to_vec();
        let mut stream = hb.clone();
        stream[..4].copy_from_slice(&(u32::from_le_bytes(hb[..4].try_into().unwrap()) ^ (1 << 20)).to_le_bytes());
        stream.extend(hb.repeat(10));
        let e = read_frame(&mut &stream[..]).unwrap_err();
        assert!(e.to_string().contains("its length field is damaged"), "{e}");
    }

    /// A frame of a kind that bounds its length (a welcome, a checkpoint's file or its end,
    /// a table, a refusal) whose length field names more than its kind may hold fails as
    /// soon as its first bytes have come, though heartbeats keep coming after it; so does
    /// one of an unknown kind. Sound frames of the largest each kind may be are read, and a
    /// refusal's long reason is cut to fit.
    #[test]
    fn a_rare_frames_damaged_length_fails_at_once() {
        let hb = Frame::Heartbeat { released: Ts(1), acknowledged: Ts(1), sent_us: 5 }.encode().to_vec();
        let largest_table = Frame::Table { id: 3, name: "t".repeat(ditto_engine::TABLE_NAME_MAX) };
        let largest_file = Frame::File {
            name: "f".repeat(FILE_NAME_MAX),
            offset: 9,
            data: vec![1u8; FILE_CHUNK_MAX].into(),
            last: true,
        };
        let tables =
            (0..ditto_engine::TABLES_MAX as u32).map(|i| (i, "w".repeat(ditto_engine::TABLE_NAME_MAX))).collect();
        let start = Start::Checkpoint { ts: Ts(u64::MAX), bytes: u64::MAX };
        let largest_welcome = Frame::Welcome { epoch: Epoch(1), streams: 4, tables, start, database: 1, run: 2 };
        let frames = [
            largest_welcome,
            largest_file,
            Frame::CheckpointDone { ts: Ts(7) },
            largest_table,
            Frame::Refuse { reason: "é".repeat(REFUSE_REASON_MAX) },
        ];
        for f in frames {
            let sound = f.encode().to_vec();
            let got = read_frame(&mut &sound[..]).unwrap().unwrap();
            match (&f, &got) {
                (Frame::Refuse { reason }, Frame::Refuse { reason: cut }) => {
                    assert!(
                        cut.len() <= REFUSE_REASON_MAX
                            && cut.len() > REFUSE_REASON_MAX - 2
                            && reason.starts_with(cut.as_str())
                    )
                }
                _ => assert_eq!(got, f, "the largest of its kind is read"),
            }
            let len = u32::from_le_bytes(sound[..4].try_into().unwrap());
            for wrong in [len ^ (1 << 27), len + (17 << 20) + 1] {
                let mut stream = sound.clone();
                stream[..4].copy_from_slice(&wrong.to_le_bytes());
                stream.extend(hb.repeat(20));
                // Only these bytes: a reader that waited for the body it names fails
                // otherwise with a cut-short frame, not this error.
                let e = read_frame(&mut &stream[..]).unwrap_err();
                assert!(e.to_string().contains("its length field is damaged"), "{f:?} {wrong}: {e}");
            }
        }
        let mut unknown = Frame::Refuse { reason: "no".into() }.encode().to_vec();
        unknown[FRAME_HEADER_LEN] = 200;
        unknown[..4].copy_from_slice(&(1u32 << 20).to_le_bytes());
        unknown.extend(hb.repeat(20));
        let e = read_frame(&mut &unknown[..]).unwrap_err();
        assert!(e.to_string().contains("unknown frame kind 200"), "{e}");
    }

    /// A frame's `Debug` output, written into errors and logs when a frame was not
    /// expected, stays short whatever the frame holds (a 1 MiB file, a 100 KiB name).
    #[test]
    fn a_frames_debug_output_is_short() {
        let f = Frame::File { name: "part-0000.dat".into(), offset: 0, data: vec![7u8; 1 << 20].into(), last: false };
        let s = format!("{f:?}");
        assert!(s.len() < 1024 && s.contains("1048576 bytes"), "{s}");
        let r = Frame::Refuse { reason: "x".repeat(100_000) };
        assert!(format!("{r:?}").len() < 1024);
        let h = Frame::Hello {
            version: 4,
            epoch: Epoch(1),
            have_ts: Ts(2),
            node: "n".repeat(65_000),
            learner: false,
            proves: Some([0xab; crate::proof::NONCE_BYTES]),
            database: 0,
            run: 0,
        };
        let s = format!("{h:?}");
        assert!(s.len() < 1024 && s.contains("proves: true") && !s.contains("171"), "{s}");
        for f in
            [Frame::Challenge { salt: 7, nonce: [0xab; 32], proof: [0xcd; 32] }, Frame::Proof { proof: [0xcd; 32] }]
        {
            let s = format!("{f:?}");
            assert!(!s.contains("171") && !s.contains("205"), "{s}");
        }
    }

    /// A frame longer than the reader takes is refused from its header alone, before its
    /// body is read (or allocated): given the header and nothing more, the error is the
    /// length's, not a truncated body's.
    #[test]
    fn a_frame_longer_than_taken_is_refused_from_its_header() {
        let big =
            Frame::File { name: "f".into(), offset: 0, data: Bytes::from(vec![7u8; 100 << 10]), last: true }.encode();
        let e = read_frame_at_most(&mut &big[..FRAME_HEADER_LEN], 64 << 10).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("at most 65536"), "{e}");
        assert!(read_frame(&mut &big[..]).unwrap().is_some(), "taken whole where the limit allows");
        let hello = Frame::Hello {
            version: PROTOCOL_VERSION,
            epoch: Epoch(1),
            have_ts: Ts(2),
            node: "b".into(),
            learner: false,
            proves: Some(crate::proof::nonce()),
            database: 7,
            run: 8,
        };
        assert_eq!(read_frame_at_most(&mut &hello.encode()[..], 64 << 10).unwrap(), Some(hello.clone()));
    }

    /// A Hello of version 8 or older carried the backup's password, in the clear: decoded
    /// to be told the version, the password dropped unread (never kept, printed or
    /// compared); a Hello of 9 carries a nonce of 32 bytes or nothing, any other length
    /// refused.
    #[test]
    fn an_older_hellos_password_is_dropped_and_a_nonce_is_whole() {
        for (version, learner) in [(6, true), (8, false), (8, true)] {
            let h = Frame::Hello {
                version,
                epoch: Epoch(3),
                have_ts: Ts(9),
                node: "b".into(),
                learner,
                proves: None,
                database: 0,
                run: 0,
            };
            let mut body = h.encode()[FRAME_HEADER_LEN..].to_vec();
            if version < 7 && !learner {
                body.push(0);
            }
            body.extend_from_slice(&6u32.to_le_bytes());
            body.extend_from_slice(b"sesame");
            let framed = [&(body.len() as u32).to_le_bytes()[..], &crc32c::crc32c(&body).to_le_bytes(), &body].concat();
            let got = read_frame(&mut &framed[..]).unwrap().unwrap();
            assert_eq!(got, h, "version {version}: the password dropped");
            assert!(!format!("{got:?}").contains("sesame"));
        }
        let nine = Frame::Hello {
            version: PROTOCOL_VERSION,
            epoch: Epoch(3),
            have_ts: Ts(9),
            node: "b".into(),
            learner: false,
            proves: Some([5; crate::proof::NONCE_BYTES]),
            database: 1,
            run: 2,
        };
        let whole = nine.encode();
        for cut in [1, 31] {
            let body = &whole[FRAME_HEADER_LEN..whole.len() - cut];
            let framed = [&(body.len() as u32).to_le_bytes()[..], &crc32c::crc32c(body).to_le_bytes(), body].concat();
            let e = read_frame(&mut &framed[..]).unwrap_err();
            assert!(e.to_string().contains("nonce of another length"), "{cut}: {e}");
        }
    }

    /// Frames gathered a byte at a time, or all at once, come out whole and in order; a
    /// damaged one is an error, not a frame.
    #[test]
    fn take_frame_gives_whole_frames_in_order_and_refuses_damage() {
        let frames = vec![
            Frame::Ack { received: Ts(5), durable: Ts(4), replayed: Ts(3), echo_us: 0 },
            Frame::Refuse { reason: "no".into() },
            Frame::Ack { received: Ts(9), durable: Ts(9), replayed: Ts(7), echo_us: u64::MAX },
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(|f| f.encode().to_vec()).collect();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for b in &bytes {
            buf.extend_from_slice(&[*b]);
            while let Some(f) = take_frame(&mut buf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
        assert!(buf.is_empty());
        let mut all = BytesMut::from(&bytes[..]);
        let mut got = Vec::new();
        while let Some(f) = take_frame(&mut all).unwrap() {
            got.push(f);
        }
        assert_eq!(got, frames);
        let mut damaged = bytes.clone();
        damaged[FRAME_HEADER_LEN + 2] ^= 1;
        assert!(take_frame(&mut BytesMut::from(&damaged[..])).is_err());
    }

    fn roundtrip(f: Frame) {
        let b = f.encode();
        let h: [u8; 8] = b[..8].try_into().unwrap();
        assert_eq!(Frame::body_len(&h).unwrap(), b.len() - 8);
        assert_eq!(Frame::decode(&h, b.slice(8..)).unwrap(), f);
        // Every single-bit flip anywhere in the frame is caught.
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut c = b.to_vec();
                c[i] ^= 1 << bit;
                let h: [u8; 8] = c[..8].try_into().unwrap();
                let ok = Frame::body_len(&h).is_ok_and(|n| n == c.len() - 8)
                    && Frame::decode(&h, Bytes::from(c[8..].to_vec())).is_ok_and(|g| g == f);
                assert!(!ok, "flip of bit {bit} of byte {i} went unnoticed");
            }
        }
    }

    #[test]
    fn every_frame_roundtrips_and_every_bit_flip_is_caught() {
        // Before version 7 (no database id; the learner byte only where needed), and from 7.
        for (version, database, run) in
            [(1, 0, 0), (6, 0, 0), (PROTOCOL_VERSION, 0, 0), (PROTOCOL_VERSION, u64::MAX - 5, 3)]
        {
            let nonce = (version >= HELLO_WITH_PROOF).then(crate::proof::nonce);
            for (learner, proves) in [(false, None), (true, None), (false, nonce), (true, nonce)] {
                let (node, epoch, have_ts) = ("b1".into(), Epoch(3), Ts(99));
                roundtrip(Frame::Hello { version, epoch, have_ts, node, learner, proves, database, run });
            }
        }
        roundtrip(Frame::Challenge {
            salt: u64::MAX - 1,
            nonce: crate::proof::nonce(),
            proof: [7; crate::proof::PROOF_BYTES],
        });
        roundtrip(Frame::Proof { proof: [9; crate::proof::PROOF_BYTES] });
        // A Hello of 6 decodes as 6's, to be told the version: its layout has no id.
        let six = Frame::Hello {
            version: 6,
            epoch: Epoch(3),
            have_ts: Ts(9),
            node: "b".into(),
            learner: false,
            proves: None,
            database: 0,
            run: 0,
        };
        let bytes = six.encode();
        assert_eq!(bytes.len(), FRAME_HEADER_LEN + 1 + 8 + 4 + 8 + 8 + 4 + 1, "6's layout");
        assert_eq!(read_frame(&mut &bytes[..]).unwrap(), Some(six));
        roundtrip(Frame::Welcome {
            epoch: Epoch(4),
            streams: 2,
            tables: vec![(0, "redis.keys".into()), (1, "redis.fields".into())],
            start: Start::Checkpoint { ts: Ts(7), bytes: 1 << 40 },
            database: 0x0123_4567_89ab_cdef,
            run: 9,
        });
        roundtrip(Frame::Welcome {
            epoch: Epoch(4),
            streams: 2,
            tables: vec![],
            start: Start::Resume,
            database: 0,
            run: 0,
        });
        roundtrip(Frame::Welcome {
            epoch: Epoch(5),
            streams: 3,
            tables: vec![],
            start: Start::CutAt { point: Ts(99) },
            database: u64::MAX,
            run: 1,
        });
        roundtrip(Frame::File {
            name: "part-0000.dat".into(),
            offset: 10,
            data: Bytes::from_static(b"abc"),
            last: true,
        });
        roundtrip(Frame::CheckpointDone { ts: Ts(7) });
        roundtrip(Frame::Table { id: 2, name: "t".into() });
        for (floor_trusted, counted) in [(false, false), (true, false), (false, true), (true, true)] {
            let batch = Bytes::from_static(b"DBAT....");
            let f = Frame::Batch { epoch: Epoch(4), released: Ts(5), floor_trusted, counted, batch };
            roundtrip(f.clone());
            // The tap's direct encoding is the same frame.
            let flags = BatchFlags { floor_trusted, counted };
            assert_eq!(encode_batch(Epoch(4), Ts(5), flags, b"DBAT...."), f.encode());
        }
        roundtrip(Frame::Heartbeat { released: Ts(8), acknowledged: Ts(11), sent_us: 1_234_567 });
        roundtrip(Frame::Ack { received: Ts(3), durable: Ts(2), replayed: Ts(1), echo_us: 77 });
        roundtrip(Frame::Refuse { reason: "no".into() });
    }

    #[test]
    fn a_batch_flag_this_version_does_not_know_is_refused() {
        let mut b = BytesMut::new();
        b.put_bytes(0, FRAME_HEADER_LEN);
        b.put_u8(kind::BATCH);
        b.put_u64_le(4);
        b.put_u64_le(5);
        b.put_u8(COUNTED | 4);
        b.put_slice(b"DBAT....");
        let f = seal(b);
        let h: [u8; 8] = f[..8].try_into().unwrap();
        assert!(matches!(Frame::decode(&h, f.slice(8..)), Err(ProtocolError::Malformed("batch flag"))));
    }

    #[test]
    fn a_truncated_frame_is_an_error_not_a_frame() {
        let b = Frame::Ack { received: Ts(3), durable: Ts(2), replayed: Ts(1), echo_us: 77 }.encode();
        for cut in 0..b.len() {
            let mut r = &b[..cut];
            let got = read_frame(&mut r);
            assert!(matches!(got, Ok(None) | Err(_)), "cut at {cut} gave {got:?}");
        }
        let mut r = &b[..];
        assert!(read_frame(&mut r).unwrap().is_some());
    }
}
