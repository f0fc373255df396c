//! Tables: ordered index + indirection array
//! ========================================
//! ```text
//!   index (B+tree, key -> rid)           indirection array (rid -> Record)
//!   "a" -> 0  "b" -> 7  "c" -> 3    ===>  chunk[rid >> 16][rid & 0xffff]
//! ```
//! The index is touched only by inserts (and by the cleanup of unlinked records); updates and
//! deletes change the record, never the index. Replay and recovery address records by rid
//! directly (Query Fresh's indirection arrays), so they never need the index for updates.
//!
//! The indirection array is a two-level array of fixed-size chunks allocated on first use
//! and never freed or moved while the table lives, which is what lets transactions hold
//! plain `&Record` for the life of the database borrow.
//!
//! Record ids are reused: an unlinked record's id goes back (`release_rids`) through the
//! epoch GC, so no transaction that found the record before its unlink is still running,
//! and a new key takes it (`take_free_rid`, `Record::reuse`) once a durable checkpoint
//! covers the tombstone that ended its former life. The log names records by id, so the
//! checkpoint matters: recovery replays only what is above its checkpoint, and so never
//! meets two lives (two keys) of one id in a primary's own log. A backup's checkpoints
//! follow their own schedule, so its replica log above its checkpoint may hold both lives:
//! its recovery gives each record the key of its newest keyed write
//! (`Database::recovery_log_begins`). Without a log, ids are reused at once.
//!
//! Index choice: our own B+tree with optimistic lock coupling (`index`), picked by `ditto
//! bench index` over crossbeam-skiplist, scc's TreeIndex and a locked `BTreeMap`
//! (docs/index-choice.md): readers write no shared memory, keys sit inline in the nodes,
//! and it walks in both directions.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::ids::{RecordId, Ts};
use crate::index::Index;
use crate::record::Record;

const CHUNK_BITS: u32 = 16;
const CHUNK_LEN: usize = 1 << CHUNK_BITS;
const CHUNKS_MAX: usize = 1 << 15;
/// Largest number of records a table can ever allocate.
pub const RECORDS_PER_TABLE_MAX: u64 = (CHUNK_LEN * CHUNKS_MAX) as u64;
/// Record ids a backup gives records of its own, one chunk past every id a primary hands
/// out (so never in a log, a checkpoint or a primary's free list): where replay puts a
/// record id's late old life (replay.rs, "A record id's late old life").
pub(crate) const BACKUP_OWN_RIDS: std::ops::Range<u64> =
    RECORDS_PER_TABLE_MAX..RECORDS_PER_TABLE_MAX + CHUNK_LEN as u64;

pub(crate) struct Table {
    pub name: String,
    pub index: Index,
    chunks: Box<[AtomicPtr<Record>]>,
    next_rid: AtomicU64,
    /// The next of `BACKUP_OWN_RIDS` to give (`backup_own_rid`); never given back.
    backup_next: AtomicU64,
    /// Ids of unlinked records, back from the epoch GC (no transaction can hold them any
    /// more), each with the timestamp of the tombstone that ended the record's life; in
    /// roughly that order. One is reused once a durable checkpoint covers its tombstone
    /// (`take_free_rid`).
    free: Mutex<VecDeque<(u64, Ts)>>,
    /// `free.len()`, read without the lock so that inserts skip it when there is nothing.
    free_len: AtomicUsize,
    /// For the keys hashing to each slot, the newest tombstone unlinked from the index:
    /// what lets `Transaction::changed_since` tell a key that was deleted before a read
    /// from one created and deleted after it, once either record is gone.
    unlinked: Box<[AtomicU64]>,
    /// The newest tombstone unlinked from the index for any key: a read-only scan that
    /// may have missed one waits for it to be durable.
    newest_unlinked: AtomicU64,
}

/// Slots of `Table::unlinked` (32 KiB a table): a key shares its slot with one in 4,096.
const UNLINKED_SLOTS: usize = 4096;

/// The `Table::unlinked` slot of a key (FNV-1a).
fn unlinked_slot(key: &[u8]) -> usize {
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    (h ^ (h >> 32)) as usize % UNLINKED_SLOTS
}

impl Table {
    pub fn new(name: String) -> Table {
        // One chunk more than a primary's ids fill, for `BACKUP_OWN_RIDS`.
        let chunks = (0..=CHUNKS_MAX).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect();
        Table {
            name,
            index: Index::new(),
            chunks,
            next_rid: AtomicU64::new(0),
            backup_next: AtomicU64::new(BACKUP_OWN_RIDS.start),
            free: Mutex::new(VecDeque::new()),
            free_len: AtomicUsize::new(0),
            unlinked: (0..UNLINKED_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            newest_unlinked: AtomicU64::new(0),
        }
    }

    /// Notes that `key`'s record, ended by a tombstone at `ts`, is leaving the index.
    /// Called before it leaves, so whoever misses the key in the index sees the note.
    pub(crate) fn note_unlinked(&self, key: &[u8], ts: Ts) {
        self.unlinked[unlinked_slot(key)].fetch_max(ts.0, Ordering::SeqCst);
        if self.newest_unlinked.load(Ordering::Relaxed) < ts.0 {
            self.newest_unlinked.fetch_max(ts.0, Ordering::SeqCst);
        }
    }

    /// The newest tombstone unlinked from the index for any key of the table.
    pub(crate) fn newest_unlinked(&self) -> Ts {
        Ts(self.newest_unlinked.load(Ordering::SeqCst))
    }

    /// The newest tombstone unlinked from the index for a key of `key`'s slot (`Ts(0)`:
    /// none): a read-only transaction that missed `key` waits for it to be durable.
    pub(crate) fn unlinked_ts(&self, key: &[u8]) -> Ts {
        Ts(self.unlinked[unlinked_slot(key)].load(Ordering::SeqCst))
    }

    /// Whether a tombstone newer than `since` may have been unlinked for `key`: true if one
    /// was (exact), or if one was for another key of the same slot.
    pub(crate) fn unlinked_after(&self, key: &[u8], since: Ts) -> bool {
        self.unlinked_ts(key) > since
    }

    /// Gives back the ids of records unlinked, each with the timestamp of the tombstone
    /// that ended its life (`Ts(0)`: a record that never had a version, or one recovery
    /// found absent, whose life is in the checkpoint recovery writes). Called only once no
    /// transaction can hold them. Nothing is given back unless `current()`, asked under the
    /// list's lock (`Database::forget_reusable_rids`).
    pub fn release_rids(&self, ids: impl IntoIterator<Item = (RecordId, Ts)>, current: impl FnOnce() -> bool) {
        let mut ids = ids.into_iter().peekable();
        if ids.peek().is_none() {
            return;
        }
        let mut free = self.free.lock();
        if !current() {
            return;
        }
        // A backup's own records are never reused: their ids are no primary's.
        free.extend(ids.filter(|(rid, _)| rid.0 < RECORDS_PER_TABLE_MAX).map(|(rid, deleted)| (rid.0, deleted)));
        self.free_len.store(free.len(), Ordering::Release);
    }

    /// A record id to reuse, if the oldest given back ended its life at or below `bound`
    /// (the newest durable checkpoint: recovery replays only what is above it, so it never
    /// meets the record's former life and its key).
    /// With it, the timestamp its life ended at (for `untake_free_rid`).
    pub fn take_free_rid(&self, bound: Ts) -> Option<(RecordId, Ts)> {
        if self.free_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut free = self.free.lock();
        let &(rid, deleted) = free.front()?;
        if deleted > bound {
            return None;
        }
        free.pop_front();
        self.free_len.store(free.len(), Ordering::Release);
        Some((RecordId(rid), deleted))
    }

    /// Puts back an id `take_free_rid` gave that was not used (its record untouched), first
    /// in line again. Unless the list was forgotten since (`forget_free_rids`, under the
    /// same rule as `release_rids`'s `current`).
    pub fn untake_free_rid(&self, (rid, deleted): (RecordId, Ts), current: impl FnOnce() -> bool) {
        let mut free = self.free.lock();
        if !current() {
            return;
        }
        free.push_front((rid.0, deleted));
        self.free_len.store(free.len(), Ordering::Release);
    }

    /// Forgets every id waiting for reuse (`Database::forget_reusable_rids`).
    pub fn forget_free_rids(&self) {
        let mut free = self.free.lock();
        free.clear();
        self.free_len.store(0, Ordering::Release);
    }

    /// Ids in use: handed out, less those given back and not yet reused (reports).
    pub fn rids_used(&self) -> u64 {
        self.rid_limit().saturating_sub(self.free_len.load(Ordering::Relaxed) as u64)
    }

    /// Number of record ids handed out so far (an upper bound on live records).
    pub fn rid_limit(&self) -> u64 {
        self.next_rid.load(Ordering::Acquire)
    }

    pub fn allocate_rid(&self) -> RecordId {
        let rid = self.next_rid.fetch_add(1, Ordering::AcqRel);
        assert!(rid < RECORDS_PER_TABLE_MAX, "table {} is out of record ids", self.name);
        RecordId(rid)
    }

    /// A record of the backup's own (`BACKUP_OWN_RIDS`), fresh; `None` once all are given.
    pub(crate) fn backup_own_rid(&self) -> Option<RecordId> {
        let rid = self.backup_next.fetch_add(1, Ordering::AcqRel);
        BACKUP_OWN_RIDS.contains(&rid).then_some(RecordId(rid))
    }

    /// The backup's own records given so far.
    pub(crate) fn backup_own_rids(&self) -> std::ops::Range<u64> {
        BACKUP_OWN_RIDS.start..self.backup_next.load(Ordering::Acquire).min(BACKUP_OWN_RIDS.end)
    }

    /// Makes sure rids below `limit` are never handed out again (recovery).
    pub fn reserve_rids(&self, limit: u64) {
        // Replay calls this for every write: read first, so the shared counter's cache line
        // is only written (and bounced between replay threads) when it actually grows.
        if self.next_rid.load(Ordering::Acquire) < limit {
            self.next_rid.fetch_max(limit, Ordering::AcqRel);
        }
    }

    /// The record at `rid`, allocating its chunk if needed.
    pub fn record(&self, rid: RecordId) -> &Record {
        let (c, i) = ((rid.0 >> CHUNK_BITS) as usize, (rid.0 as usize) & (CHUNK_LEN - 1));
        let slot = &self.chunks[c];
        let mut p = slot.load(Ordering::Acquire);
        if p.is_null() {
            let fresh: Box<[Record]> = (0..CHUNK_LEN).map(|_| Record::default()).collect();
            let fresh = Box::into_raw(fresh) as *mut Record;
            match slot.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => p = fresh,
                Err(existing) => {
                    // SAFETY: `fresh` came from Box::into_raw above and was never shared.
                    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(fresh, CHUNK_LEN)) });
                    p = existing;
                }
            }
        }
        // SAFETY: chunks are CHUNK_LEN records, never freed before the table is dropped.
        unsafe { &*p.add(i) }
    }

    /// The record at `rid` if its chunk exists.
    pub fn record_if_allocated(&self, rid: RecordId) -> Option<&Record> {
        let c = (rid.0 >> CHUNK_BITS) as usize;
        if c >= self.chunks.len() || self.chunks[c].load(Ordering::Acquire).is_null() {
            return None;
        }
        Some(self.record(rid))
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        for slot in self.chunks.iter() {
            let p = slot.load(Ordering::Acquire);
            if p.is_null() {
                continue;
            }
            // SAFETY: we have exclusive access; the chunk came from Box::into_raw.
            let chunk = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, CHUNK_LEN)) };
            for rec in chunk.iter() {
                // SAFETY: nobody else can reach these versions any more.
                unsafe { rec.free_versions_now() };
            }
        }
    }
}
