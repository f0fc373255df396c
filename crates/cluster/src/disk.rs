//! The control plane's Raft state and fence on disk
//! ================================================
//! One append-only file, `control.log` in the node's control directory, of records:
//!
//! ```text
//!   len u32 LE | !len u32 LE | crc32c u32 LE (of kind and body) | kind u8 | body (len bytes)
//!   kind 1: Raft entries (u32 count, then u32 length and protobuf each), which replace
//!           any entries at or after the first one's index; one append is one record, so
//!           that one fsync covers one record (a crash that tears an append, its pages
//!           written out of order, tears only the last record)
//!   kind 2: the hard state (protobuf: term, vote, commit)
//!   kind 3: the voters (protobuf ConfState): read from files of earlier versions only
//!   kind 4: the fence (u64 LE): batches of older epochs are refused (coordinator.rs)
//!   kind 5: a snapshot the log starts from (protobuf Snapshot: the state, its index,
//!           term and voters); entries at or below its index are dropped, and a
//!           snapshot received from the leader drops the whole log before it
//! ```
//!
//! Every write is followed by `fdatasync` before the call returns (a Raft node may answer
//! only once what it answers with is durable). Opening replays the records in order. A
//! last record that is incomplete, or whose checksum fails and which runs to the end of the
//! file, or whose header does not check with no whole record anywhere after it (zeros to
//! the end, or an append whose first page never came), is a write torn by a crash: it is
//! cut off. Anything else that does not check (a length and its complement that disagree,
//! or a bad checksum, with a whole record behind it) is corruption: opening fails, naming
//! the file and the offset. When
//! the file has grown to four times its size after the last rewrite (and at least 1 MiB),
//! it is rewritten with what it holds (a new file, fsynced, renamed over the old one, the
//! directory fsynced); so it is at every snapshot (the log's compaction, node.rs).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

use crate::node::{ControlDisk, RaftDurable};
use crate::state::NodeId;

const HEADER: usize = 13;
const KIND_ENTRIES: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const KIND_CONF_STATE: u8 = 3;
const KIND_FENCE: u8 = 4;
const KIND_SNAPSHOT: u8 = 5;
const FILE: &str = "control.log";
const REWRITE_MIN: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: corrupt record at offset {offset}: {why}")]
    Corrupt { path: PathBuf, offset: u64, why: String },
}

/// A node's Raft state and fence, kept in `dir` (see the module notes).
pub struct FileDisk {
    dir: PathBuf,
    file: File,
    durable: RaftDurable,
    fence: u64,
    /// Bytes in the file.
    len: u64,
    /// Bytes in the file when it was last written whole (or opened).
    rewritten: u64,
}

fn record(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, body);
    let mut r = Vec::with_capacity(HEADER + body.len());
    r.extend_from_slice(&(body.len() as u32).to_le_bytes());
    r.extend_from_slice(&(!(body.len() as u32)).to_le_bytes());
    r.extend_from_slice(&crc.to_le_bytes());
    r.push(kind);
    r.extend_from_slice(body);
    r
}

fn encode(m: &impl protobuf::Message) -> Vec<u8> {
    m.write_to_bytes().expect("raft's messages encode")
}

fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let mut b = (entries.len() as u32).to_le_bytes().to_vec();
    for e in entries {
        let one = encode(e);
        b.extend_from_slice(&(one.len() as u32).to_le_bytes());
        b.extend_from_slice(&one);
    }
    b
}

fn decode_entries(mut b: &[u8]) -> Result<Vec<Entry>, String> {
    let word = |b: &mut &[u8]| -> Result<usize, String> {
        let (w, rest) = b.split_at_checked(4).ok_or("entries record cut short")?;
        *b = rest;
        Ok(u32::from_le_bytes(w.try_into().unwrap()) as usize)
    };
    let n = word(&mut b)?;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let len = word(&mut b)?;
        let (one, rest) = b.split_at_checked(len).ok_or("entries record cut short")?;
        out.push(Entry::parse_from_bytes(one).map_err(|e| format!("undecodable entry: {e}"))?);
        b = rest;
    }
    if !b.is_empty() {
        return Err(format!("{} bytes after the entries", b.len()));
    }
    Ok(out)
}

/// Whether `bytes` holds a whole record at `at`: its length and complement agree, its body
/// is there, and its checksum holds.
fn whole_record_at(bytes: &[u8], at: usize) -> bool {
    let Some(h) = bytes.get(at..at + HEADER) else { return false };
    let word = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    let (len, check, crc) = (word(0), word(4), word(8));
    if len != !check {
        return false;
    }
    let Some(body) = bytes.get(at + HEADER..at + HEADER + len as usize) else { return false };
    crc32c::crc32c_append(crc32c::crc32c(&[h[12]]), body) == crc
}

impl FileDisk {
    /// Opens the node's control state in `dir`, or creates it for a founding member of a
    /// group whose first voters are `voters` (none: a node that joins a running group;
    /// `RaftDurable::initial`).
    pub fn open(dir: &Path, voters: &[NodeId]) -> Result<FileDisk, DiskError> {
        let io = |source| DiskError::Io { path: dir.join(FILE), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let path = dir.join(FILE);
        if !path.exists() {
            let durable = RaftDurable::initial(voters);
            let (file, len) = write_whole(dir, &durable, 0).map_err(io)?;
            return Ok(FileDisk { dir: dir.to_path_buf(), file, durable, fence: 0, len, rewritten: len });
        }
        let mut bytes = Vec::new();
        File::open(&path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(io)?;
        let mut durable = RaftDurable::default();
        let mut fence = 0;
        let mut off = 0usize;
        let corrupt =
            |offset: usize, why: String| DiskError::Corrupt { path: path.clone(), offset: offset as u64, why };
        while off < bytes.len() {
            if bytes.len() - off < HEADER {
                break; // a torn header
            }
            let word = |at: usize| u32::from_le_bytes(bytes[off + at..off + at + 4].try_into().unwrap());
            let (len, check, crc) = (word(0), word(4), word(8));
            if len != !check {
                // A torn append whose first page never came (zeros, or the page's older
                // bytes) and whose later pages did: no whole record follows, so nothing
                // acknowledged is lost by cutting it. (Before 2026-12-07 only zeros to the
                // end were cut: such a header made the file unopenable, the node stopped
                // until a person cut it by hand; found by a review.) A whole record after
                // it makes it damage, not a torn tail.
                if !(off + 1..bytes.len()).any(|at| whole_record_at(&bytes, at)) {
                    break;
                }
                return Err(corrupt(off, format!("length {len} does not match its check")));
            }
            let len = len as usize;
            let end = off + HEADER + len;
            if end > bytes.len() {
                break; // a torn body
            }
            let kind = bytes[off + 12];
            let body = &bytes[off + HEADER..end];
            if crc32c::crc32c_append(crc32c::crc32c(&[kind]), body) != crc {
                if end == bytes.len() {
                    break; // the last record, torn
                }
                return Err(corrupt(off, "checksum mismatch".into()));
            }
            let bad = |e: protobuf::ProtobufError| corrupt(off, format!("undecodable: {e}"));
            match kind {
                KIND_HARD_STATE => durable.hard_state = HardState::parse_from_bytes(body).map_err(bad)?,
                KIND_CONF_STATE => {
                    durable.snapshot.mut_metadata().set_conf_state(ConfState::parse_from_bytes(body).map_err(bad)?)
                }
                KIND_SNAPSHOT => {
                    let snap = Snapshot::parse_from_bytes(body).map_err(bad)?;
                    // A leader's snapshot is written with the whole log after it; this
                    // node's own compaction keeps the entries above it.
                    let received = durable.entries.last().is_none_or(|e| e.index < snap.get_metadata().index);
                    durable.set_snapshot(&snap, received);
                }
                KIND_FENCE if len == 8 => fence = fence.max(u64::from_le_bytes(body.try_into().unwrap())),
                KIND_ENTRIES => durable.append(&decode_entries(body).map_err(|why| corrupt(off, why))?),
                k => return Err(corrupt(off, format!("unknown record kind {k} ({len} bytes)"))),
            }
            off = end;
        }
        let file = OpenOptions::new().write(true).open(&path).map_err(io)?;
        if off < bytes.len() {
            tracing::warn!(path = %path.display(), offset = off, dropped = bytes.len() - off, "cutting a torn record off the control log");
            file.set_len(off as u64).and_then(|_| file.sync_data()).map_err(io)?;
        }
        let mut d = FileDisk { dir: dir.to_path_buf(), file, durable, fence, len: off as u64, rewritten: off as u64 };
        use std::io::Seek;
        d.file.seek(std::io::SeekFrom::End(0)).map_err(io)?;
        Ok(d)
    }

    /// What the disk holds, to start a `ControlNode` from.
    pub fn durable(&self) -> &RaftDurable {
        &self.durable
    }

    /// The epoch this node has promised to fence at (0: none).
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Promises, durably, to refuse batches of epochs below `epoch`.
    pub fn set_fence(&mut self, epoch: u64) -> std::io::Result<()> {
        if epoch <= self.fence {
            return Ok(());
        }
        self.write(&record(KIND_FENCE, &epoch.to_le_bytes()))?;
        self.fence = epoch;
        Ok(())
    }

    fn write(&mut self, rec: &[u8]) -> std::io::Result<()> {
        self.file.write_all(rec)?;
        self.file.sync_data()?;
        self.len += rec.len() as u64;
        Ok(())
    }

    /// Rewrites the file with what it holds now, once it has grown enough (module notes).
    fn maybe_rewrite(&mut self) -> std::io::Result<()> {
        if self.len > REWRITE_MIN.max(4 * self.rewritten) {
            (self.file, self.len) = write_whole(&self.dir, &self.durable, self.fence)?;
            self.rewritten = self.len;
        }
        Ok(())
    }
}

/// Writes `control.log` in `dir` whole: a new file, fsynced, renamed over the old one, the
/// directory fsynced. Returns it open for appending, and its length.
fn write_whole(dir: &Path, durable: &RaftDurable, fence: u64) -> std::io::Result<(File, u64)> {
    let tmp = dir.join("control.log.new");
    let mut out = record(KIND_SNAPSHOT, &encode(&durable.snapshot));
    if !durable.entries.is_empty() {
        out.extend(record(KIND_ENTRIES, &encode_entries(&durable.entries)));
    }
    out.extend(record(KIND_HARD_STATE, &encode(&durable.hard_state)));
    if fence > 0 {
        out.extend(record(KIND_FENCE, &fence.to_le_bytes()));
    }
    let mut f = File::create(&tmp)?;
    f.write_all(&out)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(FILE))?;
    File::open(dir)?.sync_all()?;
    Ok((OpenOptions::new().append(true).open(dir.join(FILE))?, out.len() as u64))
}

impl ControlDisk for FileDisk {
    fn append(&mut self, entries: &[Entry]) -> std::io::Result<()> {
        self.write(&record(KIND_ENTRIES, &encode_entries(entries)))?;
        self.durable.append(entries);
        self.maybe_rewrite()
    }

    fn set_hard_state(&mut self, hs: &HardState) -> std::io::Result<()> {
        self.write(&record(KIND_HARD_STATE, &encode(hs)))?;
        self.durable.hard_state = hs.clone();
        self.maybe_rewrite()
    }

    /// Rewrites the file whole (a snapshot is where the log is cut, so nothing older is
    /// kept).
    fn set_snapshot(&mut self, snap: &Snapshot, received: bool) -> std::io::Result<()> {
        let mut d = self.durable.clone();
        d.set_snapshot(snap, received);
        (self.file, self.len) = write_whole(&self.dir, &d, self.fence)?;
        self.rewritten = self.len;
        self.durable = d;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry { index, term, data: data.to_vec().into(), ..Default::default() }
    }

    fn hs(term: u64, vote: u64, commit: u64) -> HardState {
        HardState { term, vote, commit, ..Default::default() }
    }

    fn filled(dir: &Path) -> RaftDurable {
        let mut d = FileDisk::open(dir, &[1, 2, 3]).unwrap();
        // The log starts after the founding snapshot at index 1.
        d.append(&[entry(2, 1, b"a"), entry(3, 1, b"b"), entry(4, 1, b"c")]).unwrap();
        d.set_hard_state(&hs(1, 2, 3)).unwrap();
        // A new leader's log replaces the uncommitted tail.
        d.append(&[entry(4, 2, b"C"), entry(5, 2, b"D")]).unwrap();
        d.set_hard_state(&hs(2, 3, 4)).unwrap();
        d.set_fence(5).unwrap();
        d.set_fence(3).unwrap();
        d.durable().clone()
    }

    #[test]
    fn what_was_written_is_what_opens() {
        let t = tempfile::tempdir().unwrap();
        let want = filled(t.path());
        let d = FileDisk::open(t.path(), &[9]).unwrap();
        assert_eq!(d.durable(), &want);
        assert_eq!(
            d.durable().entries.iter().map(|e| (e.index, e.term)).collect::<Vec<_>>(),
            [(2, 1), (3, 1), (4, 2), (5, 2)]
        );
        assert_eq!(d.durable().conf_state().voters, [1, 2, 3], "the voters of its creation, not of this call");
        assert_eq!(d.fence(), 5);
    }

    #[test]
    fn a_torn_last_record_is_cut_and_corruption_before_the_end_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let want = filled(t.path());
        let path = t.path().join(FILE);
        let good = std::fs::read(&path).unwrap();
        // A torn append: a few bytes of a record that never finished.
        for extra in [1usize, 5, HEADER, HEADER + 3, 0] {
            let mut b = good.clone();
            match extra {
                0 => b.extend([0u8; 4096]), // the file was extended, nothing written
                n => b.extend(&record(KIND_ENTRIES, &encode_entries(&[entry(6, 2, b"torn")]))[..n]),
            }
            std::fs::write(&path, &b).unwrap();
            let d = FileDisk::open(t.path(), &[]).unwrap();
            assert_eq!(d.durable(), &want, "{extra} torn bytes");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), good.len() as u64, "cut off");
        }
        // Every byte flipped: the last record torn (opens with what is before it), or an
        // error that names the offset; never a different state opened silently.
        let last = {
            let mut off = 0;
            let mut last = 0;
            while off < good.len() {
                last = off;
                off += HEADER + u32::from_le_bytes(good[off..off + 4].try_into().unwrap()) as usize;
            }
            last
        };
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x40;
            std::fs::write(&path, &b).unwrap();
            match FileDisk::open(t.path(), &[]) {
                Err(DiskError::Corrupt { offset, .. }) => assert!(offset as usize <= i, "byte {i}: offset {offset}"),
                Err(e) => panic!("byte {i}: {e}"),
                Ok(d) => {
                    assert!(i >= last, "byte {i} flipped before the last record at {last} opened");
                    assert_ne!(d.fence(), 5, "byte {i}: the torn last record (the fence) is gone");
                }
            }
        }
    }

    /// An append's pages may reach the disk out of order before its fsync: a hole in the
    /// middle of the last append, or at its start (its header: before 2026-12-07 the file
    /// would not open), is a torn tail, not corruption; the same header damaged with a
    /// whole record after it is.
    #[test]
    fn an_append_torn_in_its_middle_is_cut_as_a_whole() {
        let t = tempfile::tempdir().unwrap();
        let want = filled(t.path());
        let path = t.path().join(FILE);
        let before = std::fs::metadata(&path).unwrap().len() as usize;
        let mut d = FileDisk::open(t.path(), &[]).unwrap();
        let big = vec![7u8; 6000];
        d.append(&[entry(6, 2, &big), entry(7, 2, &big), entry(8, 2, &big)]).unwrap();
        drop(d);
        let torn = std::fs::read(&path).unwrap();
        for hole in [before + 6000, before, before + 2] {
            let mut b = torn.clone();
            b[hole..hole + 4096].fill(0);
            std::fs::write(&path, &b).unwrap();
            let d = FileDisk::open(t.path(), &[]).unwrap();
            assert_eq!(d.durable(), &want, "hole at {hole}: the torn append is gone, the rest is as written");
            assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, before);
        }
        // The header damaged, a whole record after it: refused.
        let mut b = torn.clone();
        b[before..before + 4096].fill(0);
        b.extend(record(KIND_FENCE, &9u64.to_le_bytes()));
        std::fs::write(&path, &b).unwrap();
        match FileDisk::open(t.path(), &[]) {
            Err(DiskError::Corrupt { offset, .. }) => assert_eq!(offset as usize, before),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a damaged header with a whole record after it opened"),
        }
    }

    #[test]
    fn a_grown_file_is_rewritten_to_what_it_holds() {
        let t = tempfile::tempdir().unwrap();
        let mut d = FileDisk::open(t.path(), &[1]).unwrap();
        // Hard states only: the file grows, what it holds does not.
        for i in 0..20_000u64 {
            d.set_hard_state(&hs(i, 1, 0)).unwrap();
            if i % 1000 == 0 {
                d.append(&[entry(i / 1000 + 2, i, b"x")]).unwrap();
            }
        }
        let len = std::fs::metadata(t.path().join(FILE)).unwrap().len();
        assert!(len < REWRITE_MIN + 4096, "{len} bytes");
        let want = d.durable().clone();
        drop(d);
        assert_eq!(FileDisk::open(t.path(), &[]).unwrap().durable(), &want);
    }
}
