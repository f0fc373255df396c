//! Transactions
//! ============
//! Read-write transactions use optimistic concurrency control in the manner of Silo, with
//! one change: the commit timestamp comes from the global commit clock (see `clock`).
//!
//! ```text
//!  execute:  reads record (record, TID seen); writes buffer in the write set;
//!            scans record their range and a fingerprint of the records in it;
//!            point misses record the key; inserts put an absent record in the index.
//!  commit:   1. lock the write set in address order (no deadlock), check each TID unchanged
//!            2. ts = clock.begin_commit()         -- the serialization point
//!            3. validate: every read TID unchanged and not locked by another;
//!               every scanned range re-scanned gives the same fingerprint (phantoms);
//!               every missed key still missing
//!            4. append the write set to the worker's log stream
//!            5. install new versions at ts, trim old ones, unlock
//!            6. clock.end_commit()
//! ```
//!
//! Why this is serializable in timestamp order: a transaction's reads are validated after
//! its timestamp is taken and while its writes are locked. A writer that installed a newer
//! version of something we read has either an earlier timestamp (then our validation sees
//! its TID or its lock and we abort) or a later one (then it serializes after us). Inserts
//! into a scanned range go into the index before their writer locks them, so a re-scan after
//! our timestamp sees them, locked or committed, unless the inserter takes its timestamp
//! after ours.
//!
//! Read-only transactions (`ReadTxn`) read the newest version at or below a snapshot
//! timestamp taken from `visible_ts()`: they never block, never abort, and see a prefix of
//! the commit order.

use std::ops::Bound;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use crossbeam_epoch::Guard;

use crate::clock::CommitClock;
use crate::db::{
    check_value_len, CommitTicket, Database, LoggedWrite, TicketLog, Worker, KEY_LEN_MAX, LOG_TXN_OVERHEAD_MAX,
    LOG_WRITE_OVERHEAD_MAX, TXN_BYTES_MAX, TXN_HELD_BYTES_MAX,
};
use crate::error::{Error, Result};
use crate::ids::{RecordId, TableId, Ts};
use crate::index::GET_MANY_BATCH;
use crate::record::{OwnedVersion, Parts, Record, VersionRef, LOCK_BIT, TS_MASK, UNLINKED_BIT};
use crate::table::Table;

/// Scan direction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Reverse,
}

/// What [`Transaction::version`] read of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyVersion {
    /// The commit timestamp of the newest committed version; `Ts(0)` with no record.
    pub ts: Ts,
    /// Whether that version holds a value (false: deleted, or no record).
    pub present: bool,
    /// The commit clock just before the read: any later write of the key commits above it.
    missed_at: Ts,
}

struct WriteEntry {
    table: TableId,
    rid: RecordId,
    rec: *const Record,
    /// The new version, installed as is at commit (a tombstone for a delete).
    version: OwnedVersion,
    /// The TID the transaction saw; validated under the lock at commit.
    observed_tid: u64,
    /// This transaction put the record into the index (it was not there before).
    created: bool,
    /// The record had a value before this transaction (so the log need not carry the key).
    existed: bool,
}

struct ScanEntry {
    table: TableId,
    lo: Bound<Bytes>,
    hi: Bound<Bytes>,
    fingerprint: Fingerprint,
}

/// What each entry a transaction keeps costs in memory besides the bytes it names, charged
/// to what it holds (`TXN_HELD_BYTES_MAX`): a read kept for validation; a key found absent;
/// a write (its entry, its version's header and its slot in the write map: the map's
/// share is a bound, not a measure); a scan's range. Before 2026-12-06 only the named
/// bytes were charged, and a delete of an existing key, a read, a miss of an empty key or
/// an unbounded scan added nothing (a review's find).
const READ_HELD: usize = std::mem::size_of::<(*const Record, u64)>();
const MISS_HELD: usize = std::mem::size_of::<(TableId, Bytes)>();
const WRITE_HELD: usize = std::mem::size_of::<WriteEntry>() + 64;
const SCAN_HELD: usize = std::mem::size_of::<ScanEntry>();
// A write the commit counts (at least `LOG_WRITE_OVERHEAD_MAX` and a byte of key) is
// charged no more than `TXN_HELD_BYTES_MAX / TXN_BYTES_MAX` times that here, so a write set
// the commit takes is never refused while it grows.
const _: () = assert!(
    WRITE_HELD <= (TXN_HELD_BYTES_MAX / TXN_BYTES_MAX) * (crate::db::LOG_WRITE_OVERHEAD_MAX + 1),
    "a write is charged more than the commit's bound allows"
);

impl WriteEntry {
    /// The key the log carries for this write: only when the record had no value before
    /// this transaction (see `LoggedWrite::key`). Read from the record, which keeps it for
    /// its whole life, so a write entry holds no key of its own.
    fn logged_key(&self) -> Option<&[u8]> {
        if self.existed {
            return None;
        }
        // SAFETY: records outlive the transaction (see TxnScratch), which holds a pin
        // while it commits: a primary gives an id a new life only after a grace period.
        let rec = unsafe { &*self.rec };
        Some(unsafe { rec.key.get_unguarded() }.expect("an indexed record has its key"))
    }
}

/// Order-independent fingerprint of a set of record ids.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
struct Fingerprint {
    sum: u64,
    count: u64,
}

impl Fingerprint {
    fn add(&mut self, rid: RecordId) {
        // splitmix64: a sum of well-mixed values makes accidental equality of two different
        // sets negligible.
        let mut z = rid.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.sum = self.sum.wrapping_add(z ^ (z >> 31));
        self.count += 1;
    }
}

/// The last few keys this transaction found in the index, so that the common "get, then
/// update the same key" costs one index search, not two. Only short keys are kept (the
/// bytes inline, compared exactly). A hit is as good as a fresh search: the index maps a key
/// to the same record until that record is unlinked, and an unlinked hit is searched again
/// (`isolation.rs`: update_after_get_of_a_key_replaced_meanwhile_aborts).
#[derive(Default)]
struct RecentKeys {
    slots: [RecentKey; RECENT_KEYS],
    next: usize,
}

const RECENT_KEYS: usize = 16;
/// Keys up to this long are remembered: TPC-C's keys, and the server's `[db][key]` rows of
/// Redis keys up to 31 bytes (redis-benchmark's `key:` and 12 digits make 17 bytes: with 16
/// here, every SET searched the index twice, for the type check and for the write).
const RECENT_KEY_LEN_MAX: usize = 32;

/// A remembered key, compared as integers: the table and length, and the key bytes
/// zero-padded (the length tells "a" from "a\0").
#[derive(Default, Clone, Copy)]
struct RecentKey {
    /// `table << 8 | len`; 0: empty slot (an empty key is never cached).
    tag: u64,
    key: [u128; 2],
    rid: u64,
}

impl RecentKey {
    /// The tag and padded bytes of a key that can be remembered.
    #[inline]
    fn probe(table: TableId, key: &[u8]) -> Option<(u64, [u128; 2])> {
        if key.is_empty() || key.len() > RECENT_KEY_LEN_MAX {
            return None;
        }
        let mut b = [0u8; RECENT_KEY_LEN_MAX];
        b[..key.len()].copy_from_slice(key);
        let (lo, hi) = b.split_at(16);
        let half = |h: &[u8]| u128::from_ne_bytes(h.try_into().expect("16 bytes"));
        Some((((table.0 as u64) << 8) | key.len() as u64, [half(lo), half(hi)]))
    }
}

impl RecentKeys {
    fn clear(&mut self) {
        self.slots = [RecentKey::default(); RECENT_KEYS];
    }

    fn remember(&mut self, table: TableId, key: &[u8], rid: RecordId) {
        let Some((tag, key)) = RecentKey::probe(table, key) else { return };
        self.slots[self.next % RECENT_KEYS] = RecentKey { tag, key, rid: rid.0 };
        self.next = self.next.wrapping_add(1);
    }

    fn find(&self, table: TableId, key: &[u8]) -> Option<RecordId> {
        let (tag, key) = RecentKey::probe(table, key)?;
        // Newest first: a key found twice (a record replaced meanwhile) answers with the later.
        (1..=RECENT_KEYS)
            .map(|back| &self.slots[self.next.wrapping_sub(back) % RECENT_KEYS])
            .find(|s| s.tag == tag && s.key == key)
            .map(|s| RecordId(s.rid))
    }
}

/// Where each record of the write set sits in `writes`: an open-addressing table keyed by
/// the record's address. Reads ask it once per record read, so a linear search of the write
/// set made a transaction of n reads and m writes cost n*m (7% of TPC-C's instructions,
/// cachegrind). Slots carry the generation they were written in, so clearing is one
/// increment. Valid only until commit sorts `writes` (validation then binary-searches).
struct WriteMap {
    slots: Vec<WriteSlot>,
    generation: u32,
}

#[derive(Default, Clone, Copy)]
struct WriteSlot {
    rec: usize,
    index: u32,
    generation: u32,
}

const WRITE_MAP_MIN: usize = 64;
/// A table grown past this (a huge write set) is given back when its transaction ends.
const WRITE_MAP_KEEP: usize = 4096;

/// Empty, with no table until the first write (`insert`): a worker's first transaction,
/// and one after a transaction whose buffers were lost (`Transaction::new`), make a
/// default set, which need not allocate before it is used. (Until 2026-12-03 every
/// transaction moved its worker's set out and a default one in, and the table made here
/// cost an allocation of 1 KiB per transaction.)
impl Default for WriteMap {
    fn default() -> Self {
        WriteMap { slots: Vec::new(), generation: 1 }
    }
}

impl WriteMap {
    #[inline]
    fn home(&self, rec: usize) -> usize {
        // Fibonacci hashing of the address (records are at least 8-byte aligned).
        let bits = self.slots.len().trailing_zeros();
        ((rec as u64 >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    #[inline]
    fn get(&self, rec: *const Record) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let rec = rec as usize;
        let mask = self.slots.len() - 1;
        let mut i = self.home(rec);
        loop {
            let s = &self.slots[i];
            if s.generation != self.generation {
                return None;
            }
            if s.rec == rec {
                return Some(s.index as usize);
            }
            i = (i + 1) & mask;
        }
    }

    /// Records that `rec` is write `index` (a record not in the map yet). Writes are
    /// added in order, so `index` is also how many the map holds.
    fn insert(&mut self, rec: *const Record, index: usize) {
        if (index + 1) * 2 > self.slots.len() {
            self.grow();
        }
        self.place(rec as usize, u32::try_from(index).expect("write set fits u32"));
    }

    fn place(&mut self, rec: usize, index: u32) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(rec);
        while self.slots[i].generation == self.generation {
            debug_assert_ne!(self.slots[i].rec, rec, "a record is written once per write set");
            i = (i + 1) & mask;
        }
        self.slots[i] = WriteSlot { rec, index, generation: self.generation };
    }

    fn grow(&mut self) {
        let live: Vec<WriteSlot> = self.slots.iter().filter(|s| s.generation == self.generation).copied().collect();
        self.slots = vec![WriteSlot::default(); (self.slots.len() * 2).max(WRITE_MAP_MIN)];
        for s in live {
            self.place(s.rec, s.index);
        }
    }

    fn clear(&mut self) {
        if self.slots.len() > WRITE_MAP_KEEP {
            *self = WriteMap::default();
            return;
        }
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // Slots of 2^32 transactions ago could pass for current ones: wipe them.
            self.slots.fill(WriteSlot::default());
            self.generation = 1;
        }
    }
}

/// Buffers reused from one transaction to the next on a worker.
#[derive(Default)]
pub(crate) struct TxnScratch {
    reads: Vec<(*const Record, u64)>,
    writes: Vec<WriteEntry>,
    write_map: WriteMap,
    scans: Vec<ScanEntry>,
    misses: Vec<(TableId, Bytes)>,
    /// Bytes the transaction holds (`TXN_HELD_BYTES_MAX`): missed keys, written values,
    /// created records' keys, scans' bounds.
    held: usize,
    recent: RecentKeys,
    /// A snapshot transaction (`Worker::begin_snapshot`): reads at this timestamp, holds
    /// this reader slot, writes nothing and validates nothing.
    snapshot: Option<(usize, Ts)>,
}

/// What a read of a record saw: this transaction's own write (its index in `writes`), or
/// the newest committed version (`None`: the record has none).
#[derive(Clone, Copy)]
enum Seen<'g> {
    Own(usize),
    Committed(Option<VersionRef<'g>>),
}

impl TxnScratch {
    /// The write set's entry for `rec`, while the transaction runs (not after commit sorted
    /// the write set).
    #[inline]
    fn find_write(&self, rec: *const Record) -> Option<usize> {
        let i = self.write_map.get(rec);
        debug_assert_eq!(i, self.writes.iter().position(|w| std::ptr::eq(w.rec, rec)));
        i
    }

    /// Notes the outcome of an index lookup of `key`: the record is remembered for a later
    /// write of the same key, a miss is recorded for the phantom check.
    fn looked_up<'t>(&mut self, table: TableId, t: &'t Table, key: &[u8], rid: Option<u64>) -> Option<&'t Record> {
        let Some(rid) = rid else {
            self.missed(table, key);
            return None;
        };
        self.recent.remember(table, key, RecordId(rid));
        Some(t.record(RecordId(rid)))
    }

    /// Reads `rec`, found in the index for `key`, as a transaction does: our own write if
    /// we wrote it, else the newest committed version, whose TID is recorded for
    /// validation. Does not touch the version itself (a caller may prefetch it first).
    #[inline]
    fn see<'g>(&mut self, rec: &Record, guard: &'g Guard, table: TableId, key: &[u8]) -> Seen<'g> {
        if let Some(i) = self.find_write(rec) {
            return Seen::Own(i);
        }
        let (tid, head) = self.read_rec(rec, guard);
        self.read(rec, tid, table, key);
        Seen::Committed(head)
    }

    /// Records a read of `rec`, found in the index for `key`, at `tid`. A record read
    /// unlinked (the cleanup took its tombstone out of the index after the lookup found it)
    /// says the key is absent, as a miss does, and is checked as one too: a record the key
    /// gets next is a phantom. The read alone always validates (an unlinked record stays
    /// so while this transaction is pinned), so before 2026-12-02 an insert of the key
    /// committed below this transaction went unseen (found by a review). A record with no
    /// committed version (an insert still running put it in the index) says the key is
    /// absent too, and may stand where a delete's tombstone was unlinked: as a miss, a
    /// read-only transaction's ticket waits for that delete (before 2026-12-02 a GET read
    /// such a record as absent with a ticket of 0, answering nil before the DEL was
    /// durable; found by a review).
    #[inline]
    fn read(&mut self, rec: &Record, tid: u64, table: TableId, key: &[u8]) {
        self.reads.push((rec, tid));
        self.held += READ_HELD;
        if (tid & UNLINKED_BIT != 0 || tid & TS_MASK == 0) && self.snapshot.is_none() {
            self.missed(table, key);
        }
    }

    /// Records `key` found absent, for the phantom check at commit (and what it holds).
    fn missed(&mut self, table: TableId, key: &[u8]) {
        self.misses.push((table, Bytes::copy_from_slice(key)));
        self.held += MISS_HELD + key.len();
    }

    /// Refuses a transaction that holds more than `TXN_HELD_BYTES_MAX`; called where
    /// what it holds grows, before that can grow by more than one call's keys.
    fn check_held(&self) -> Result<()> {
        if self.held > TXN_HELD_BYTES_MAX {
            return Err(Error::TooLarge {
                what: "what the transaction holds (its writes, and the keys it looked up and found absent)",
                len: self.held,
                max: TXN_HELD_BYTES_MAX,
            });
        }
        Ok(())
    }

    /// The version a read sees: the newest committed (with its TID, for validation), or in
    /// a snapshot transaction the newest at the snapshot (with its timestamp as the TID).
    #[inline]
    fn read_rec<'g>(&self, rec: &Record, guard: &'g Guard) -> (u64, Option<VersionRef<'g>>) {
        match self.snapshot {
            None => rec.read_latest(guard),
            Some((_, at)) => {
                let v = rec.read_at(at, guard);
                (v.map_or(0, |v| v.ts().0), v)
            }
        }
    }

    /// The value a read saw (`None`: absent or deleted).
    #[inline]
    fn value<'a>(&'a self, seen: Seen<'a>) -> Option<&'a [u8]> {
        match seen {
            Seen::Own(i) => self.writes[i].version.value(),
            Seen::Committed(head) => head.and_then(|v| v.value()),
        }
    }
}

// SAFETY: the raw record pointers point into tables owned by the database, which the worker
// keeps alive through its Arc; they are only dereferenced by the worker's own thread.
unsafe impl Send for TxnScratch {}

/// A read-write transaction. Dropping it without commit aborts it.
pub struct Transaction<'w> {
    worker: &'w mut Worker,
    guard: Guard,
    /// The worker's buffers, lent for the transaction and given back when it drops (a
    /// pointer moved, where the buffers themselves, about 900 bytes, were moved in and
    /// out and a default set made in their place).
    s: std::mem::ManuallyDrop<Box<TxnScratch>>,
    done: bool,
}

/// A worker asks the epoch GC to collect once its commits have installed this many
/// versions (each install may hand a trimmed chain to the GC). crossbeam-epoch collects by
/// itself only at every 128th pin of a thread, and then at most 8 bags of 64 deferred
/// frees: 4 frees per pin. A transaction pins once, so a worker whose transactions each
/// replace more than 4 versions made garbage faster than it was collected. The server's
/// pipelined runs of 16 SETs did: its memory grew by 40 MiB/s under `redis-benchmark -P
/// 16` on 100k keys, without bound. One collection per 128 installs frees up to 512.
const GC_COLLECT_EVERY_INSTALLS: u32 = 128;

/// How a write treats the record's current state.
#[derive(Copy, Clone, PartialEq, Eq)]
enum WriteMode {
    Insert,
    Update,
    Put,
    Delete,
}

impl<'w> Transaction<'w> {
    pub(crate) fn new(worker: &'w mut Worker) -> Transaction<'w> {
        // (None only after a transaction that leaked instead of dropping, or whose abort
        // panicked before its drop gave the set back: a new set then.)
        let s = worker.scratch.take().unwrap_or_default();
        debug_assert!(s.reads.is_empty() && s.writes.is_empty() && s.snapshot.is_none());
        Transaction { worker, guard: crossbeam_epoch::pin(), s: std::mem::ManuallyDrop::new(s), done: false }
    }

    /// A transaction that reads at the newest snapshot (as a `ReadTxn`) and refuses writes
    /// with `Error::ReadOnly`; its commit validates nothing and its ticket is the snapshot's
    /// timestamp. What a backup runs read-only commands in: replay installs versions
    /// above the snapshot as it reads, and it never sees one of them.
    pub(crate) fn new_snapshot(worker: &'w mut Worker) -> Transaction<'w> {
        let mut t = Transaction::new(worker);
        t.s.snapshot = Some(t.worker.db.clock.register_reader());
        t
    }

    /// The snapshot a snapshot transaction reads at (`None` for a read-write one).
    pub fn snapshot_ts(&self) -> Option<Ts> {
        self.s.snapshot.map(|(_, ts)| ts)
    }

    fn table(&self, id: TableId) -> Result<&'w Table> {
        let t = self.worker.db.table(id)?;
        // SAFETY: tables are never dropped before the database, which the worker keeps alive
        // for at least 'w.
        Ok(unsafe { &*(t as *const Table) })
    }

    /// The write set's entry for `rec` once commit has sorted the write set by address.
    fn find_sorted_write(&self, rec: *const Record) -> Option<usize> {
        self.s.writes.binary_search_by_key(&(rec as usize), |w| w.rec as usize).ok()
    }

    /// Reads a key. `None` if absent or deleted.
    pub fn get(&mut self, table: TableId, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.find_value(table, key)?.map(Bytes::copy_from_slice))
    }

    /// Reads a key and hands its value to `f` in place (no copy, no reference count), for
    /// callers that decode the value at once. `None` if absent or deleted.
    pub fn get_with<R>(&mut self, table: TableId, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        Ok(self.find_value(table, key)?.map(f))
    }

    /// Reads several keys of one table and hands each value to `f(i, value)` in place, in
    /// the order of `keys` (`None`: absent or deleted). The same reads, recorded the same
    /// way, as `get_with` for each key in turn; but the index descents of up to
    /// `GET_MANY_BATCH` keys are interleaved, and so are the loads of their records and
    /// versions, so independent cache misses overlap (TPC-C's NewOrder reads 5-15 random
    /// items and stocks).
    pub fn get_many_with<K: AsRef<[u8]>>(
        &mut self,
        table: TableId,
        keys: &[K],
        mut f: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<()> {
        let t = self.table(table)?;
        let mut rids = [None; GET_MANY_BATCH];
        let mut recs: [Option<&Record>; GET_MANY_BATCH] = [None; GET_MANY_BATCH];
        let mut seen: [Option<Seen<'_>>; GET_MANY_BATCH] = [None; GET_MANY_BATCH];
        for (c, keys) in keys.chunks(GET_MANY_BATCH).enumerate() {
            let n = keys.len();
            t.index.get_many(keys, &mut rids[..n], &self.guard);
            // Pass 1: start loading every record.
            for (i, key) in keys.iter().enumerate() {
                recs[i] = self.s.looked_up(table, t, key.as_ref(), rids[i]);
                if let Some(rec) = recs[i] {
                    rec.prefetch();
                }
            }
            // Pass 2: read each record's TID and head, and start loading the versions.
            for i in 0..n {
                seen[i] = recs[i].map(|rec| self.s.see(rec, &self.guard, table, keys[i].as_ref()));
                if let Some(Seen::Committed(Some(v))) = seen[i] {
                    v.prefetch();
                }
            }
            self.s.check_held()?;
            // Pass 3: hand the values over.
            for (i, s) in seen[..n].iter().enumerate() {
                f(c * GET_MANY_BATCH + i, s.and_then(|s| self.s.value(s)));
            }
        }
        Ok(())
    }

    /// The record `key` maps to, remembered for a later write of the same key; a miss is
    /// recorded for the phantom check.
    fn locate(&mut self, table: TableId, key: &[u8]) -> Result<Option<&'w Record>> {
        let t = self.table(table)?;
        let rid = t.index.get(key, &self.guard);
        let rec = self.s.looked_up(table, t, key, rid);
        self.s.check_held()?;
        Ok(rec)
    }

    /// The value a read of `key` sees (our own write, or the newest committed version,
    /// recorded for validation).
    fn find_value(&mut self, table: TableId, key: &[u8]) -> Result<Option<&[u8]>> {
        let Some(rec) = self.locate(table, key)? else { return Ok(None) };
        let seen = self.s.see(rec, &self.guard, table, key);
        self.s.check_held()?;
        Ok(self.s.value(seen))
    }

    /// The key's newest committed version: its commit timestamp (a delete's tombstone
    /// counts; `Ts(0)` where the key has no record: never written, or deleted and its
    /// tombstone since cleaned up) and whether it holds a value. Validated at commit like
    /// any read, so a change after this call aborts the transaction. For a key this
    /// transaction has written, the version it overwrote. Redis's WATCH is built on this
    /// and `changed_since`.
    pub fn version(&mut self, table: TableId, key: &[u8]) -> Result<KeyVersion> {
        // Read before the search: whatever writes the key after a miss commits above it.
        let clock = self.worker.db.clock().visible_ts();
        let Some(rec) = self.locate(table, key)? else {
            return Ok(KeyVersion { ts: Ts(0), present: false, missed_at: clock });
        };
        if let Some(i) = self.s.find_write(rec) {
            let w = &self.s.writes[i];
            return Ok(KeyVersion { ts: Ts(w.observed_tid & TS_MASK), present: w.existed, missed_at: clock });
        }
        let (tid, head) = self.s.read_rec(rec, &self.guard);
        self.s.read(rec, tid, table, key);
        self.s.check_held()?;
        let present = head.is_some_and(|v| v.value().is_some());
        Ok(KeyVersion { ts: Ts(tid & TS_MASK), present, missed_at: clock })
    }

    /// Whether `key` was written after `then` was read of it (by `version`, in this or an
    /// earlier transaction): its newest version is another one, or the key was absent then
    /// and is absent now but a tombstone newer than that read left the index meanwhile
    /// (it was created and deleted again, and the cleanup took the record). An absent key
    /// whose own older tombstone was cleaned up meanwhile has not changed. Exact, but for
    /// a rare `true` where another key sharing one of 4,096 slots had a tombstone cleaned
    /// up meanwhile. The read is validated at commit like any.
    pub fn changed_since(&mut self, table: TableId, key: &[u8], then: KeyVersion) -> Result<bool> {
        let now = self.version(table, key)?;
        if (now.ts, now.present) == (then.ts, then.present) {
            // The same version; or no record then nor now, and none cleaned up since.
            return Ok(now.ts == Ts(0) && self.table(table)?.unlinked_after(key, then.missed_at));
        }
        if now.ts == Ts(0) && !then.present {
            // Absent then (a tombstone), gone now: its own tombstone was cleaned up, unless
            // a newer one for the key was.
            return Ok(self.table(table)?.unlinked_after(key, then.ts.max(then.missed_at)));
        }
        Ok(true)
    }

    /// Inserts a key that must not exist (Err(KeyExists) otherwise).
    pub fn insert(&mut self, table: TableId, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(table, key, Some(Parts::whole(value)), WriteMode::Insert).map(|_| ())
    }

    /// Replaces the value of a key that must exist (Err(KeyNotFound) otherwise).
    pub fn update(&mut self, table: TableId, key: &[u8], value: &[u8]) -> Result<()> {
        self.write(table, key, Some(Parts::whole(value)), WriteMode::Update).map(|_| ())
    }

    /// Inserts or replaces. Returns whether the key existed.
    pub fn put(&mut self, table: TableId, key: &[u8], value: &[u8]) -> Result<bool> {
        self.write(table, key, Some(Parts::whole(value)), WriteMode::Put)
    }

    /// `put` of the value `head` followed by `tail`, without the caller building it first
    /// (the server prefixes each value with its type).
    pub fn put_concat(&mut self, table: TableId, key: &[u8], head: &[u8], tail: &[u8]) -> Result<bool> {
        self.write(table, key, Some(Parts(head, tail)), WriteMode::Put)
    }

    /// Deletes a key. Returns whether it existed.
    pub fn delete(&mut self, table: TableId, key: &[u8]) -> Result<bool> {
        self.write(table, key, None, WriteMode::Delete)
    }

    fn write(&mut self, table: TableId, key: &[u8], value: Option<Parts<'_>>, mode: WriteMode) -> Result<bool> {
        let out = self.write_unchecked(table, key, value, mode);
        self.s.check_held()?;
        out
    }

    fn write_unchecked(
        &mut self,
        table: TableId,
        key: &[u8],
        value: Option<Parts<'_>>,
        mode: WriteMode,
    ) -> Result<bool> {
        if self.s.snapshot.is_some() {
            return Err(Error::ReadOnly);
        }
        if key.len() > KEY_LEN_MAX {
            return Err(Error::TooLarge { what: "key", len: key.len(), max: KEY_LEN_MAX });
        }
        if let Some(v) = value {
            check_value_len(v.len())?;
        }
        let t = self.table(table)?;
        // A remembered record that has left the index since is no answer: search again, as
        // a transaction that never remembered it would. Inserts and puts skip the plain
        // search: `get_or_insert_with` answers a present key without locking, so one descent
        // serves both outcomes.
        let may_create = matches!(mode, WriteMode::Insert | WriteMode::Put);
        let found = match self.s.recent.find(table, key) {
            Some(rid) if t.record(rid).tid.load(Ordering::Acquire) & UNLINKED_BIT == 0 => Some(rid),
            _ if may_create => None,
            _ => t.index.get(key, &self.guard).map(RecordId),
        };
        let (entry_rid, created) = match found {
            Some(rid) => (rid, false),
            None if !may_create => {
                self.s.missed(table, key);
                return if mode == WriteMode::Update { Err(Error::KeyNotFound) } else { Ok(false) };
            }
            None => {
                let db = &self.worker.db;
                let bound = db.reuse_bound();
                // A table that has handed out nearly all its record ids gives new records
                // only ids to reuse, taken before the index is entered (its `make` cannot
                // fail), and refuses with an error when there is none, rather than
                // panicking in `allocate_rid`. The margin covers every worker between this
                // check and its allocation (one each). (Taking the id inside `make` let
                // every loser of a race for the one free id allocate a fresh one, each
                // moving the limit on, until one panicked.)
                let near_limit = t.rid_limit() + crate::db::WORKERS_MAX as u64 >= crate::table::RECORDS_PER_TABLE_MAX;
                // (The generation read before the take: an id taken across a promotion's
                // `forget_reusable_rids` is then never put back, at worst one id lost.)
                let taken = match near_limit {
                    true => {
                        let generation = db.rid_generation();
                        t.take_free_rid(bound).map(|entry| (entry, generation))
                    }
                    false => None,
                };
                let guard = &self.guard;
                let (rid, created) = if near_limit && taken.is_none() {
                    // No id to give: only a key that is there can be written (a put of one
                    // was refused too).
                    match t.index.get(key, guard) {
                        Some(rid) => (rid, false),
                        None => {
                            return Err(Error::OutOfRecordIds {
                                table: t.name.clone(),
                                max: crate::table::RECORDS_PER_TABLE_MAX,
                            });
                        }
                    }
                } else {
                    // The record gets its key before the index publishes its rid, so whoever
                    // finds the rid finds the key.
                    t.index.get_or_insert_with(
                        key,
                        || match taken.map(|(entry, _)| entry).or_else(|| t.take_free_rid(bound)) {
                            Some((rid, _)) => {
                                // SAFETY: the id came back through the epoch GC after the
                                // unlink (`release_rids_after`), and the checkpoint bound holds;
                                // the free list hands it to this writer alone.
                                let claimed = unsafe { t.record(rid).reuse(key, guard) };
                                assert!(claimed, "a free record id {} that was not unlinked", rid.0);
                                rid.0
                            }
                            None => {
                                let rid = t.allocate_rid();
                                t.record(rid).key.init(|| Bytes::copy_from_slice(key));
                                rid.0
                            }
                        },
                        guard,
                    )
                };
                // The key was there after all: the id taken goes back, first in line.
                if let (Some((entry, generation)), false) = (taken, created) {
                    t.untake_free_rid(entry, || db.rid_generation() == generation);
                }
                (RecordId(rid), created)
            }
        };
        let rec: &Record = t.record(entry_rid);
        if let Some(i) = self.s.find_write(rec) {
            let w = &mut self.s.writes[i];
            let existed = w.version.value().is_some();
            match mode {
                WriteMode::Insert if existed => return Err(Error::KeyExists),
                WriteMode::Update if !existed => return Err(Error::KeyNotFound),
                WriteMode::Delete if !existed => return Ok(false),
                _ => {
                    let was = w.version.value().map_or(0, <[u8]>::len);
                    w.version.set(value);
                    self.s.held = self.s.held.saturating_sub(was) + value.map_or(0, |v| v.len());
                }
            }
            return Ok(existed);
        }
        let (tid, head) = rec.read_latest(&self.guard);
        let existed = head.is_some_and(|v| v.value().is_some());
        let refuse = match mode {
            WriteMode::Insert if existed => Some(Err(Error::KeyExists)),
            WriteMode::Update if !existed => Some(Err(Error::KeyNotFound)),
            WriteMode::Delete if !existed => Some(Ok(false)),
            _ => None,
        };
        if let Some(out) = refuse {
            // The outcome depended on the record's state: validate it like any read.
            self.s.read(rec, tid, table, key);
            return out;
        }
        if entry_rid.0 >= crate::table::RECORDS_PER_TABLE_MAX {
            // A backup's own record (a record id's late old life, replay.rs) still holds the
            // key after a promotion: its id is no primary's and cannot be logged. It leaves
            // the index once every snapshot sees its tombstone (`Database::attach_log`, or
            // the cleanup after); until then a write to the key is retried as a conflict.
            return Err(Error::Conflict("the key's record is a backup's own, leaving the index"));
        }
        let version = OwnedVersion::new_in_parts(value);
        self.s.held += WRITE_HELD + value.map_or(0, |v| v.len()) + if created { key.len() } else { 0 };
        let at = self.s.writes.len();
        self.s.write_map.insert(rec, at);
        self.s.writes.push(WriteEntry { table, rid: entry_rid, rec, version, observed_tid: tid, created, existed });
        Ok(existed)
    }

    /// Ordered range scan. `limit` counts present keys returned (0 = no limit).
    pub fn scan(
        &mut self,
        table: TableId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        dir: Direction,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        self.scan_within(table, lo, hi, dir, limit, usize::MAX).map(|(rows, _)| rows)
    }

    /// `scan` that also stops once the keys and values it returns pass `max_bytes`: the
    /// rows up to and including the one that passes it, and whether it walked the whole
    /// range (false: it stopped at `limit` or `max_bytes`, perhaps at the range's last
    /// key). Only the part walked is validated at commit, as with a limit. For a caller
    /// that would refuse a result that large, so that it is never copied whole.
    pub fn scan_within(
        &mut self,
        table: TableId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        dir: Direction,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(Vec<(Bytes, Bytes)>, bool)> {
        let mut bytes = 0usize;
        let mut out = Vec::new();
        let complete = self.walk(table, lo, hi, dir, |key, v| {
            bytes = bytes.saturating_add(key.len() + v.len());
            out.push((key.clone(), Bytes::copy_from_slice(v)));
            !((limit != 0 && out.len() >= limit) || bytes > max_bytes)
        })?;
        Ok((out, complete))
    }

    /// The present keys of the range in order (this transaction's own writes included),
    /// validated at commit as a scan's are; the values are not copied (a delete of every
    /// key of a range needs only the keys: FLUSHALL and a hash's DEL copied every value
    /// first before 2026-12-06, found by a review).
    pub fn scan_keys(&mut self, table: TableId, lo: Bound<&[u8]>, hi: Bound<&[u8]>) -> Result<Vec<Bytes>> {
        let mut out = Vec::new();
        self.walk(table, lo, hi, Direction::Forward, |key, _| {
            out.push(key.clone());
            true
        })?;
        Ok(out)
    }

    /// Calls `f(key, value)` for the present keys of the range in order, this
    /// transaction's own writes included, until it returns false. The part walked is
    /// validated at commit as a scan's is: a key added or removed there by another
    /// transaction aborts this one. Values are not copied.
    pub fn for_each(
        &mut self,
        table: TableId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        self.walk(table, lo, hi, Direction::Forward, |k, v| f(k, v)).map(|_| ())
    }

    /// The walk under `scan_within` and `for_each`: `f(key, value)` for each present key
    /// until it returns false; records the part walked for validation at commit. Returns
    /// whether the whole range was walked.
    fn walk(
        &mut self,
        table: TableId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        dir: Direction,
        mut f: impl FnMut(&Bytes, &[u8]) -> bool,
    ) -> Result<bool> {
        let t = self.table(table)?;
        let mut fp = Fingerprint::default();
        let mut stopped_at: Option<Bytes> = None;
        let mut visit = |this: &mut Self, rid: RecordId| -> bool {
            let rec: &Record = t.record(rid);
            let key = rec.key.get(&this.guard).expect("an indexed record has its key");
            // Scans are often followed by updates of what they found (TPC-C Delivery).
            this.s.recent.remember(table, key, rid);
            let value = match this.s.find_write(rec) {
                Some(i) => {
                    let w = &this.s.writes[i];
                    if w.observed_tid != 0 {
                        fp.add(rid);
                    }
                    w.version.value()
                }
                None => {
                    let (tid, head) = this.s.read_rec(rec, &this.guard);
                    if in_phantom_set(tid) {
                        fp.add(rid);
                        this.s.reads.push((rec, tid));
                        this.s.held += READ_HELD;
                        // Bounded as it grows: a walk of a huge range stops here, refused
                        // below, not after its whole read set was kept.
                        if this.s.held > TXN_HELD_BYTES_MAX {
                            return false;
                        }
                    }
                    head.and_then(|v| v.value())
                }
            };
            if let Some(v) = value {
                if !f(key, v) {
                    stopped_at = Some(key.clone());
                    return false;
                }
            }
            true
        };
        t.index.for_each(lo, hi, dir, |rid| visit(self, RecordId(rid)));
        self.s.check_held()?;
        let owned = |b: Bound<&[u8]>| match b {
            Bound::Included(k) => Bound::Included(Bytes::copy_from_slice(k)),
            Bound::Excluded(k) => Bound::Excluded(Bytes::copy_from_slice(k)),
            Bound::Unbounded => Bound::Unbounded,
        };
        // When the walk stopped early, only the part actually walked is protected.
        let complete = stopped_at.is_none();
        let (lo, hi) = match (stopped_at, dir) {
            (Some(k), Direction::Forward) => (owned(lo), Bound::Included(k)),
            (Some(k), Direction::Reverse) => (Bound::Included(k), owned(hi)),
            (None, _) => (owned(lo), owned(hi)),
        };
        let bound_len = |b: &Bound<Bytes>| match b {
            Bound::Included(k) | Bound::Excluded(k) => k.len(),
            Bound::Unbounded => 0,
        };
        self.s.held += SCAN_HELD + bound_len(&lo) + bound_len(&hi);
        self.s.scans.push(ScanEntry { table, lo, hi, fingerprint: fp });
        self.s.check_held()?;
        Ok(complete)
    }

    /// Commits and waits until the commit is durable. Returns the commit timestamp.
    pub fn commit(self) -> Result<Ts> {
        self.commit_async()?.wait()
    }

    /// This transaction's writes of `table` so far: each key, whether it had a value before
    /// the transaction, and whether it has one after. What a commit of it changes in the
    /// number of present keys (the server's DBSIZE counts come from it); "before" is what
    /// the commit validates, so it is exact once the commit succeeds.
    pub fn write_set(&self, table: TableId) -> impl Iterator<Item = (&[u8], bool, bool)> + '_ {
        self.s.writes.iter().filter(move |w| w.table == table).map(|w| {
            // SAFETY: records outlive the transaction (see TxnScratch).
            let rec = unsafe { &*w.rec };
            let key = rec.key.get(&self.guard).expect("a written record has its key");
            (&key[..], w.existed, w.version.value().is_some())
        })
    }

    /// Whether this transaction has written anything (its commit takes a timestamp of its
    /// own and is logged; one that has not commits as a read).
    pub fn has_writes(&self) -> bool {
        !self.s.writes.is_empty()
    }

    /// Commits (validates and installs) without waiting for durability: the returned ticket
    /// must be waited on before the outcome is reported to anyone.
    pub fn commit_async(mut self) -> Result<CommitTicket> {
        let out = self.try_commit();
        if out.is_err() {
            self.abort_cleanup();
        }
        self.done = true;
        out
    }

    /// This worker's log handle for a ticket (see `TicketLog`), made on first use.
    fn ticket_log(&mut self) -> Option<Arc<TicketLog>> {
        // One atomic load per commit: the handle is made again only when a log was attached
        // or detached since (`Database::log_gen`).
        let gen = self.worker.db.log_gen.load(std::sync::atomic::Ordering::Acquire);
        match &self.worker.ticket_log {
            Some((g, log)) if *g == gen => log.clone(),
            _ => {
                let log = self.worker.db.log.read().as_ref().map(|l| Arc::new(TicketLog(Arc::clone(l))));
                self.worker.ticket_log = Some((gen, log.clone()));
                log
            }
        }
    }

    /// The database's commit clock, borrowed for the transaction's lifetime rather than
    /// through `self` (so commit can use it while it changes the worker's fields), and
    /// without cloning its `Arc`, whose count every worker would share.
    fn clock(&self) -> &'w CommitClock {
        // SAFETY: the clock is owned by the database, which the worker keeps alive for at
        // least 'w, and is never replaced.
        unsafe { &*Arc::as_ptr(&self.worker.db.clock) }
    }

    fn try_commit(&mut self) -> Result<CommitTicket> {
        if let Some((_, at)) = self.s.snapshot {
            // Everything read was at one snapshot: nothing to validate. Its reply waits for
            // the snapshot to be durable, as a read-only transaction's waits for what it
            // read: on a primary the newest snapshot may lie above the durable point
            // (before 2026-12-05 the ticket waited for nothing; only backups, whose log is
            // detached, took snapshots then; found by a review).
            return Ok(CommitTicket { ts: at, log: self.ticket_log() });
        }
        if self.s.writes.is_empty() {
            // Read-only: validate, and let the ticket wait for what we read to be durable.
            // Its misses and scans are checked at one point, as a read-write transaction's
            // are at its timestamp: a reader slot held across the checks keeps every delete
            // committed from then on linked in the index (deletes are unlinked only below
            // every snapshot, `Database::unlink_deleted`), so a key inserted and deleted
            // while the reads were checked still shows as a phantom at the miss check.
            // Without it, a transaction that missed k, read y after the insert of k wrote
            // it and z before the delete of k wrote it, committed: the delete, and its
            // cleanup, landed between the check of z and the check of k (found by a review,
            // 2026-12-06). Reads alone need no such point: each is unchanged from its read
            // to its check, and every read comes before every check.
            let hold = (!self.s.misses.is_empty() || !self.s.scans.is_empty()).then(|| self.clock().register_reader());
            let valid = self.validate();
            if let Some((slot, _)) = hold {
                self.clock().release_reader(slot);
            }
            valid?;
            let mut read_ts = self.s.reads.iter().map(|(_, tid)| tid & TS_MASK).max().unwrap_or(0);
            // A key found absent may be absent because a delete's tombstone left the index,
            // and that delete may not be durable yet: its reply waits for it too (the
            // newest tombstone unlinked in the key's slot). A range scanned may have lost
            // tombstones the same way: it waits for the table's newest one unlinked.
            // (Before 2026-12-02 neither counted: a GET could answer nil for a key whose
            // DEL a crash then undid. Found by a review.)
            for (table, key) in &self.s.misses {
                read_ts = read_ts.max(self.worker.db.table(*table)?.unlinked_ts(key).0 & TS_MASK);
            }
            for scan in &self.s.scans {
                read_ts = read_ts.max(self.worker.db.table(scan.table)?.newest_unlinked().0 & TS_MASK);
            }
            return Ok(CommitTicket { ts: Ts(read_ts), log: self.ticket_log() });
        }
        let log = self.ticket_log();
        // An upper bound of the logged size (the key is counted even where it is not logged).
        let bytes: usize = LOG_TXN_OVERHEAD_MAX
            + self
                .s
                .writes
                .iter()
                .map(|w| {
                    LOG_WRITE_OVERHEAD_MAX
                        + w.logged_key().map_or(0, <[u8]>::len)
                        + w.version.value().map_or(0, <[u8]>::len)
                })
                .sum::<usize>();
        if bytes > TXN_BYTES_MAX {
            return Err(Error::TooLarge { what: "transaction write set", len: bytes, max: TXN_BYTES_MAX });
        }
        if let Some(log) = &log {
            // (Waits for room in the worker's log stream, if it must, before any lock.)
            log.0.reserve(self.worker.id)?;
        }
        // From the first record lock until the timestamp is visible, a panic stops the
        // process (`AbortOnUnwind`).
        let critical = AbortOnUnwind;
        // 1. Lock in address order.
        self.s.writes.sort_unstable_by_key(|w| w.rec as usize);
        let mut locked = 0;
        let mut failure = None;
        for w in &self.s.writes {
            // SAFETY: records outlive the transaction (see TxnScratch).
            let rec = unsafe { &*w.rec };
            if !rec.lock() {
                failure = Some(Error::Conflict("record unlinked"));
                break;
            }
            locked += 1;
            if rec.tid.load(Ordering::Relaxed) & !LOCK_BIT != w.observed_tid {
                failure = Some(Error::Conflict("written record changed"));
                break;
            }
        }
        if let Some(e) = failure {
            self.unlock(locked);
            return Err(e);
        }
        // 2. The serialization point.
        let worker = self.worker.id.0 as usize;
        let clock = self.clock();
        let ts = clock.begin_commit(worker);
        // 3. Validate. (A clock at its limit, `TS_LIMIT`, a log's timestamps near the
        // clock's end, takes no write: refused as a failed validation is, with the 2^40
        // timestamps left below the end as room, where its overflow aborted the process.)
        let at_limit = || {
            Error::Corrupt(format!(
                "the commit clock is at {}, its limit: the log's timestamps reach the clock's end (damage, or a log not written by ditto)",
                ts.0
            ))
        };
        let valid = if ts.0 > crate::record::TS_LIMIT { Err(at_limit()) } else { self.validate() };
        if let Err(e) = valid {
            clock.end_commit(worker);
            self.unlock(locked);
            return Err(e);
        }
        // 4. Log, while the versions are still ours to describe.
        if let Some(log) = &log {
            let mut it = self.s.writes.iter().map(|w| LoggedWrite {
                table: w.table,
                rid: w.rid,
                key: w.logged_key(),
                value: w.version.value(),
            });
            log.0.append(self.worker.id, ts, &mut it);
        }
        // 5. Install and unlock.
        let horizon = clock.horizons();
        self.worker.installs_since_collect += self.s.writes.len() as u32;
        // Deletes go on this worker's list for unlinking, its lock taken at the first one
        // (whoever holds it waits for no record lock: `Database::unlink_deleted`).
        let db = &self.worker.db;
        let mut deleted = None;
        for w in self.s.writes.drain(..) {
            if w.version.value().is_none() {
                deleted.get_or_insert_with(|| db.deleted[worker].lock()).push((w.table, w.rid, ts));
            }
            // SAFETY: as above.
            let rec = unsafe { &*w.rec };
            rec.install_and_unlock(ts, w.version, horizon, &self.guard);
        }
        drop(deleted);
        // 6. Visible to snapshots and to the stream bound.
        clock.end_commit(worker);
        drop(critical);
        // 7. The log's deferred work, if any (`CommitLog::committed`).
        if let Some(log) = &log {
            log.0.committed();
        }
        if self.worker.installs_since_collect >= GC_COLLECT_EVERY_INSTALLS {
            self.worker.installs_since_collect = 0;
            // Hands this thread's freed versions to the global queue and collects there.
            self.guard.flush();
        }
        self.worker.commits += 1;
        if self.worker.commits.is_multiple_of(128) {
            let h = clock.refresh_horizon();
            self.worker.db.unlink_deleted(self.worker.id.0 as usize, h);
        }
        Ok(CommitTicket { ts, log })
    }

    /// Validation of reads, scans and misses. At commit the write set is sorted by record
    /// address (the lock order), so "locked by us" is a binary search in it; a read-only
    /// transaction has no writes and so locks nothing.
    fn validate(&self) -> Result<()> {
        let is_own = |rec: *const Record| self.find_sorted_write(rec).is_some();
        for &(rec, seen) in &self.s.reads {
            // SAFETY: as above.
            let cur = unsafe { &*rec }.tid.load(Ordering::Acquire);
            if cur & !LOCK_BIT != seen || (cur & LOCK_BIT != 0 && !is_own(rec)) {
                return Err(Error::Conflict("read validation"));
            }
        }
        for scan in &self.s.scans {
            let t = self.worker.db.table(scan.table)?;
            let mut fp = Fingerprint::default();
            t.index.for_each(as_ref(&scan.lo), as_ref(&scan.hi), Direction::Forward, |rid| {
                let rid = RecordId(rid);
                let rec: &Record = t.record(rid);
                let created_by_us = self.find_sorted_write(rec).is_some_and(|i| self.s.writes[i].observed_tid == 0);
                let cur = rec.tid.load(Ordering::Acquire);
                if !created_by_us && in_phantom_set(cur) {
                    fp.add(rid);
                }
                true
            });
            if fp != scan.fingerprint {
                return Err(Error::Conflict("phantom in scanned range"));
            }
        }
        #[cfg(test)]
        tests::between_the_checks();
        for (table, key) in &self.s.misses {
            let t = self.worker.db.table(*table)?;
            if let Some(rid) = t.index.get(key, &self.guard) {
                let rec: &Record = t.record(RecordId(rid));
                let created_by_us = self.find_sorted_write(rec).is_some_and(|i| self.s.writes[i].observed_tid == 0);
                if !created_by_us && in_phantom_set(rec.tid.load(Ordering::Acquire)) {
                    return Err(Error::Conflict("phantom at a missed key"));
                }
            }
        }
        Ok(())
    }

    fn unlock(&self, locked: usize) {
        for w in &self.s.writes[..locked] {
            // SAFETY: as above.
            unsafe { &*w.rec }.unlock_unchanged();
        }
    }

    /// Unlinks from the index the absent records this transaction created.
    fn abort_cleanup(&mut self) {
        let db = &self.worker.db;
        let mut unlinked = Vec::new();
        for w in self.s.writes.iter().filter(|w| w.created) {
            let t = db.table(w.table).expect("table of a write exists");
            if unlink_if(t, w.rid, 0, &self.guard) {
                unlinked.push((w.table, w.rid, Ts(0)));
            }
        }
        db.release_rids_after(&self.guard, unlinked);
    }
}

/// Held by a commit from its first record lock until its timestamp is visible, when it
/// holds what every other transaction may wait for: record locks, and a busy commit slot,
/// which bounds every snapshot and the log's stream bound. A panic there (a bug: an
/// assertion of the install, a commit log's append) cannot be unwound safely: the
/// transaction's clean-up would spin on a record lock this thread holds, and a slot left
/// busy would freeze every snapshot and the durable watermark for good. So the process
/// stops instead, saying why; its supervisor, or a cluster's failover, takes over (before
/// 2026-12-05 it hung; found by a review).
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "ditto: a panic inside a commit's critical section (record locks held, its timestamp not yet \
                 visible): aborting the process rather than leave the database stalled"
            );
            std::process::abort();
        }
    }
}

/// Whether a record with this TID word counts in a scan's fingerprint (and as a phantom at a
/// missed key): committed (a timestamp) or being committed (locked), but not unlinked. An
/// unlinked record is absent for good and on its way out of the index, so counting it would
/// make a scan that met it before its unlink differ from the re-scan after: an abort for
/// nothing. (Masking to the timestamp instead would miss a locked, not yet committed insert.)
fn in_phantom_set(tid: u64) -> bool {
    tid != 0 && tid & UNLINKED_BIT == 0
}

/// Takes record `rid` of `t` out of the index if its TID is still exactly `expect_tid`
/// (absent: 0, or the tombstone's timestamp) and marks it unlinked so no transaction can
/// write it again; whether it did (the caller then gives the id back for reuse,
/// `Database::release_rids_after`).
/// The versions under a tombstone go to the epoch GC: the caller unlinks only a tombstone
/// every snapshot sees, so nothing can read below it. (They used to stay: a deleted value
/// was freed only if the delete's own install could trim it, which a stale horizon often
/// prevented, and nothing writes an unlinked record again.)
pub(crate) fn unlink_if(t: &Table, rid: RecordId, expect_tid: u64, guard: &Guard) -> bool {
    unlink_keyed_if(t, rid, expect_tid, None, guard)
}

/// `unlink_if`, and only if the record's key (read under its lock) is `expect_key` where
/// one is given: a replayer ending a key's old life on a record must not end another
/// key's life that a reuse gave it meanwhile.
pub(crate) fn unlink_keyed_if(
    t: &Table,
    rid: RecordId,
    expect_tid: u64,
    expect_key: Option<&[u8]>,
    guard: &Guard,
) -> bool {
    let rec = t.record(rid);
    if !rec.lock() {
        return false;
    }
    let cur = rec.tid.load(Ordering::Relaxed) & !LOCK_BIT;
    let is_tombstone_or_absent = {
        // Not `read_latest`: that would wait for our own lock.
        rec.head_locked(guard).is_none_or(|v| v.value().is_none())
    };
    // The key is read under the lock: a reuse changes it only while the lock bit is set,
    // and this may be a late unlink of the record's former life (then the TID differs).
    let key = rec.key.get(guard);
    let same_key = expect_key.is_none_or(|e| key.is_some_and(|k| k.as_ref() == e));
    let (true, true, true, Some(key)) = (cur == expect_tid, is_tombstone_or_absent, same_key, key) else {
        rec.unlock_unchanged();
        return false;
    };
    // Unlinked (still locked) before it leaves the index, so that whoever still holds its rid
    // (a transaction's remembered keys) sees it gone by the time a new record takes the key.
    rec.tid.store(cur | UNLINKED_BIT | LOCK_BIT, Ordering::Release);
    if cur != 0 {
        t.note_unlinked(key, Ts(cur));
    }
    // SAFETY: we hold the lock, and every snapshot sees the tombstone (ts `cur`).
    unsafe { rec.trim_locked(Ts(cur), guard) };
    t.index.remove_if(key, rid.0, guard);
    rec.tid.store(cur | UNLINKED_BIT, Ordering::Release);
    true
}

fn as_ref(b: &Bound<Bytes>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_ref()),
        Bound::Excluded(k) => Bound::Excluded(k.as_ref()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.abort_cleanup();
        }
        // SAFETY: `drop` runs once, and nothing reads `self.s` after this.
        let mut s = unsafe { std::mem::ManuallyDrop::take(&mut self.s) };
        if let Some((slot, _)) = s.snapshot.take() {
            self.worker.db.clock.release_reader(slot);
        }
        // A buffer a large transaction grew (a scan of a 10M-field hash read 16 bytes a
        // record) is let go, as the write map's is: kept, each worker held its largest
        // transaction's for the process's life (found by a review).
        clear_keeping(&mut s.reads, WRITE_MAP_KEEP);
        clear_keeping(&mut s.writes, WRITE_MAP_KEEP);
        s.write_map.clear();
        clear_keeping(&mut s.scans, WRITE_MAP_KEEP);
        clear_keeping(&mut s.misses, WRITE_MAP_KEEP);
        s.held = 0;
        s.recent.clear();
        self.worker.scratch = Some(s);
    }
}

/// Empties `v`, and lets its buffer go if it has room for more than `keep` entries.
fn clear_keeping<T>(v: &mut Vec<T>, keep: usize) {
    if v.capacity() > keep {
        *v = Vec::new();
    } else {
        v.clear();
    }
}

/// A read-only transaction at a snapshot: never blocks, never aborts.
pub struct ReadTxn<'db> {
    db: &'db Database,
    slot: usize,
    ts: Ts,
}

impl<'db> ReadTxn<'db> {
    pub(crate) fn new(db: &'db Database) -> ReadTxn<'db> {
        let (slot, ts) = db.clock.register_reader();
        ReadTxn { db, slot, ts }
    }

    /// The snapshot timestamp: the transaction sees exactly the commits at or below it.
    pub fn ts(&self) -> Ts {
        self.ts
    }

    pub fn get(&self, table: TableId, key: &[u8]) -> Result<Option<Bytes>> {
        let guard = crossbeam_epoch::pin();
        Ok(self.value_at(table, key, &guard)?.map(Bytes::copy_from_slice))
    }

    /// Reads a key at the snapshot and hands its value to `f` in place.
    pub fn get_with<R>(&self, table: TableId, key: &[u8], f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        let guard = crossbeam_epoch::pin();
        Ok(self.value_at(table, key, &guard)?.map(f))
    }

    /// Reads several keys at the snapshot and hands each value to `f(i, value)` in place, in
    /// the order of `keys` (`None`: absent or deleted): `get_with` for each key, with the
    /// index descents and record loads of up to `GET_MANY_BATCH` keys interleaved (see
    /// `Transaction::get_many_with`).
    pub fn get_many_with<K: AsRef<[u8]>>(
        &self,
        table: TableId,
        keys: &[K],
        mut f: impl FnMut(usize, Option<&[u8]>),
    ) -> Result<()> {
        let t = self.db.table(table)?;
        let mut guard = crossbeam_epoch::pin();
        let mut rids = [None; GET_MANY_BATCH];
        for (c, keys) in keys.chunks(GET_MANY_BATCH).enumerate() {
            // Nothing is held from one batch to the next: renew the pin, so a long list
            // does not hold back reclamation for its whole length.
            guard.repin();
            let mut recs: [Option<&Record>; GET_MANY_BATCH] = [None; GET_MANY_BATCH];
            let n = keys.len();
            t.index.get_many(keys, &mut rids[..n], &guard);
            for (rec, rid) in recs.iter_mut().zip(&rids[..n]) {
                *rec = rid.map(|rid| t.record(RecordId(rid)));
                if let Some(r) = rec {
                    r.prefetch();
                }
            }
            for rec in recs[..n].iter().flatten() {
                rec.prefetch_head();
            }
            for (i, rec) in recs[..n].iter().enumerate() {
                f(c * GET_MANY_BATCH + i, rec.and_then(|r| r.read_at(self.ts, &guard)).and_then(|v| v.value()));
            }
        }
        Ok(())
    }

    fn value_at<'g>(&self, table: TableId, key: &[u8], guard: &'g Guard) -> Result<Option<&'g [u8]>> {
        let t = self.db.table(table)?;
        let Some(rid) = t.index.get(key, guard) else { return Ok(None) };
        Ok(t.record(RecordId(rid)).read_at(self.ts, guard).and_then(|v| v.value()))
    }

    /// Calls `f(key, value)` for present keys in the range in order until it returns false.
    pub fn for_each(
        &self,
        table: TableId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let t = self.db.table(table)?;
        // One pin for the walk, renewed now and then so a long walk does not hold back
        // reclamation for its whole length.
        let mut guard = crossbeam_epoch::pin();
        let mut visited = 0u32;
        t.index.for_each(lo, hi, Direction::Forward, |rid| {
            visited = visited.wrapping_add(1);
            if visited.is_multiple_of(1024) {
                guard.repin();
            }
            let rec = t.record(RecordId(rid));
            // (The key read only for a value at the snapshot: a record without one may be
            // given a new life meanwhile, `Record::reuse`.)
            match rec.read_at(self.ts, &guard).and_then(|v| v.value()).and_then(|v| Some((v, rec.key.get(&guard)?))) {
                Some((v, key)) => f(key, v),
                None => true,
            }
        });
        Ok(())
    }

    /// Ordered range scan at the snapshot. `limit` 0 = no limit.
    pub fn scan(
        &self,
        table: TableId,
        lo: Bound<&[u8]>,
        hi: Bound<&[u8]>,
        dir: Direction,
        limit: usize,
    ) -> Result<Vec<(Bytes, Bytes)>> {
        let t = self.db.table(table)?;
        let mut out = Vec::new();
        let guard = crossbeam_epoch::pin();
        t.index.for_each(lo, hi, dir, |rid| {
            let rec = t.record(RecordId(rid));
            if let Some((v, key)) =
                rec.read_at(self.ts, &guard).and_then(|v| v.value()).and_then(|v| Some((v, rec.key.get(&guard)?)))
            {
                out.push((key.clone(), Bytes::copy_from_slice(v)));
            }
            limit == 0 || out.len() < limit
        });
        Ok(out)
    }

    /// Walks records by record id (not through the index) and calls `f(rid, key, version
    /// ts, value)` for each record present at the snapshot, until `f` breaks. Checkpoints
    /// use this to split a table into rid ranges written in parallel.
    pub fn for_each_record(
        &self,
        table: TableId,
        rids: std::ops::Range<u64>,
        mut f: impl FnMut(RecordId, &[u8], Ts, &[u8]) -> std::ops::ControlFlow<()>,
    ) -> Result<()> {
        let t = self.db.table(table)?;
        let end = rids.end.min(t.rid_limit());
        let mut guard = crossbeam_epoch::pin();
        for rid in rids.start..end {
            if rid.is_multiple_of(1024) {
                guard.repin();
            }
            let Some(rec) = t.record_if_allocated(RecordId(rid)) else { continue };
            if let Some(v) = rec.read_at(self.ts, &guard) {
                if let Some((val, key)) = v.value().and_then(|val| Some((val, rec.key.get(&guard)?))) {
                    if f(RecordId(rid), key, v.ts(), val).is_break() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Upper bound (exclusive) of the record ids allocated in a table.
    pub fn rid_limit(&self, table: TableId) -> Result<u64> {
        Ok(self.db.table(table)?.rid_limit())
    }
}

impl Drop for ReadTxn<'_> {
    fn drop(&mut self) {
        self.db.clock.release_reader(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Database, Options, WorkerId, WORKERS_MAX};

    thread_local! {
        /// Run once by this thread's next validation, between its reads' and scans'
        /// checks and its misses' (`Transaction::validate`).
        static BETWEEN: std::cell::RefCell<Option<Box<dyn FnOnce()>>> = std::cell::RefCell::new(None);
    }

    pub(super) fn between_the_checks() {
        if let Some(f) = BETWEEN.with(|b| b.borrow_mut().take()) {
            f();
        }
    }

    /// A read-only transaction's misses are checked at the same point as its reads: it
    /// missed k, read y after an insert of k wrote it and z before a delete of k wrote it;
    /// the delete commits, and the cleanup runs, between the check of its reads and that of
    /// its misses. No serial order has all three (k absent, y new, z old): it aborts. Before
    /// 2026-12-06 the cleanup unlinked k's tombstone there, and the transaction committed.
    #[test]
    fn a_read_only_transaction_missing_a_key_inserted_and_deleted_while_it_checks_aborts() {
        let db = Arc::new(Database::new(Options { workers: 3 }));
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        w.run(|x| x.put(t, b"y", b"old").and_then(|_| x.put(t, b"z", b"old"))).unwrap().1.wait().unwrap();
        let mut r = db.worker(WorkerId(1)).unwrap();
        let mut tx = r.begin();
        assert_eq!(tx.get(t, b"k").unwrap(), None);
        // W1: k inserted with y.
        w.run(|x| x.put(t, b"k", b"v").and_then(|_| x.put(t, b"y", b"new"))).unwrap().1.wait().unwrap();
        assert_eq!(tx.get(t, b"y").unwrap().as_deref(), Some(&b"new"[..]));
        assert_eq!(tx.get(t, b"z").unwrap().as_deref(), Some(&b"old"[..]));
        // W2, between the checks: k deleted with z, then the cleanup.
        let db2 = Arc::clone(&db);
        BETWEEN.with(|b| {
            *b.borrow_mut() = Some(Box::new(move || {
                let mut w2 = db2.worker(WorkerId(2)).unwrap();
                w2.run(|x| x.delete(t, b"k").and_then(|_| x.put(t, b"z", b"new"))).unwrap().1.wait().unwrap();
                db2.reclaim();
            }))
        });
        let committed = tx.commit();
        assert!(BETWEEN.with(|b| b.borrow().is_none()), "the delete ran between the checks");
        assert!(matches!(committed, Err(Error::Conflict(_))), "k absent, y new and z old: {committed:?}");
        // Nothing holds the delete's cleanup back any more: k's record leaves the index.
        db.reclaim();
        let guard = crossbeam_epoch::pin();
        assert!(db.table(t).unwrap().index.get(b"k", &guard).is_none(), "the cleanup ran once the check was done");
    }

    /// A point read that finds a tombstone's record as the cleanup unlinks it sees the key
    /// absent, and is checked as a miss: an insert of the key committed below the reader
    /// makes it abort. Here the reader reads k absent (its lookup found the record, whose
    /// lock the test holds as the cleanup does), then a counter that an insert of k
    /// committed with: no serial order has both. Before, the reader committed.
    #[test]
    fn a_read_of_a_record_being_unlinked_is_checked_as_a_miss() {
        let db = Database::new(Options { workers: 3 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        w.run(|x| x.put(t, b"k", b"v").and_then(|_| x.put(t, b"c", b"0"))).unwrap().1.wait().unwrap();
        w.run(|x| x.delete(t, b"k").and_then(|_| x.put(t, b"c", b"1"))).unwrap().1.wait().unwrap();
        let table = db.table(t).unwrap();
        let guard = crossbeam_epoch::pin();
        let rid = table.index.get(b"k", &guard).expect("the tombstone's record is indexed");
        let rec = table.record(RecordId(rid));
        // The cleanup's lock, taken first.
        assert!(rec.lock());
        let cur = rec.tid.load(Ordering::Relaxed) & !LOCK_BIT;
        let ((looked_tx, looked_rx), (go_tx, go_rx)) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let outcome = std::thread::scope(|sc| {
            let db = &db;
            let reader = sc.spawn(move || {
                let mut r = db.worker(WorkerId(1)).unwrap();
                let mut tx = r.begin();
                // Waits for the lock; then sees the record unlinked: absent.
                let k = tx.get(t, b"k").unwrap();
                looked_tx.send(k.is_none()).unwrap();
                go_rx.recv().unwrap();
                let c = tx.get(t, b"c").unwrap();
                (c, tx.commit())
            });
            // (The reader's lookup found the record before the unlink below; its read
            // waits on the lock.)
            std::thread::sleep(std::time::Duration::from_millis(300));
            // The cleanup's steps (`unlink_keyed_if`): unlinked under the lock, out of the
            // index, let go.
            rec.tid.store(cur | UNLINKED_BIT | LOCK_BIT, Ordering::Release);
            table.note_unlinked(b"k", Ts(cur));
            assert!(table.index.remove_if(b"k", rid, &guard));
            rec.tid.store(cur | UNLINKED_BIT, Ordering::Release);
            assert!(looked_rx.recv().unwrap(), "the reader saw k absent");
            // k inserted again, the counter moved with it.
            let mut i = db.worker(WorkerId(2)).unwrap();
            i.run(|x| x.insert(t, b"k", b"again").and_then(|_| x.put(t, b"c", b"2"))).unwrap().1.wait().unwrap();
            go_tx.send(()).unwrap();
            reader.join().unwrap()
        });
        let (c, committed) = outcome;
        assert_eq!(c.as_deref(), Some(&b"2"[..]), "the reader read the insert's counter");
        assert!(
            matches!(committed, Err(Error::Conflict(_))),
            "k absent and the counter the insert of k wrote: {committed:?}"
        );
    }

    /// `k` written, deleted, and its tombstone taken out of the index by the cleanup: the
    /// delete's timestamp.
    fn deleted_and_cleaned_up(db: &Database, w: &mut Worker, t: TableId) -> Ts {
        w.run(|x| x.put(t, b"k", b"v")).unwrap().1.wait().unwrap();
        let (_, del) = w.run(|x| x.delete(t, b"k")).unwrap();
        let deleted_at = del.ts();
        del.wait().unwrap();
        db.reclaim();
        assert!(db.table(t).unwrap().index.get(b"k", &crossbeam_epoch::pin()).is_none(), "the tombstone left");
        deleted_at
    }

    /// A read-only transaction that finds a key absent because its delete's tombstone left
    /// the index waits for that delete to be durable (its ticket is at least the
    /// tombstone's timestamp), and one that scans a range which lost a tombstone waits for
    /// what was visible. Before, both tickets said 0: a GET answered nil for a key whose DEL
    /// a crash could still undo.
    #[test]
    fn a_read_only_miss_waits_for_the_delete_it_did_not_see() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        let deleted_at = deleted_and_cleaned_up(&db, &mut w, t);
        let (got, ticket) = w.run(|x| x.get(t, b"k")).unwrap();
        assert!(got.is_none());
        assert!(ticket.ts() >= deleted_at, "a miss's ticket at {:?}, the delete at {deleted_at:?}", ticket.ts());
        let (n, ticket) = w
            .run(|x| x.scan(t, Bound::Unbounded, Bound::Unbounded, Direction::Forward, 0).map(|rows| rows.len()))
            .unwrap();
        assert_eq!(n, 0);
        assert!(ticket.ts() >= deleted_at, "a scan's ticket at {:?}, the delete at {deleted_at:?}", ticket.ts());
    }

    /// The same where the key's index entry is a record an insert still running put there
    /// after the tombstone left: its GET, refused DEL and WATCH read no committed version
    /// and wait for the delete all the same. Before, their tickets said 0.
    #[test]
    fn a_read_only_read_of_an_inflight_insert_waits_for_the_delete_before_it() {
        let db = Database::new(Options { workers: 3 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        let deleted_at = deleted_and_cleaned_up(&db, &mut w, t);
        let mut w1 = db.worker(WorkerId(1)).unwrap();
        let mut ins = w1.begin();
        ins.put(t, b"k", b"new").unwrap();
        assert!(db.table(t).unwrap().index.get(b"k", &crossbeam_epoch::pin()).is_some(), "the insert's record");
        let mut w2 = db.worker(WorkerId(2)).unwrap();
        let (got, ticket) = w2.run(|x| x.get(t, b"k")).unwrap();
        assert!(got.is_none());
        assert!(ticket.ts() >= deleted_at, "a GET's ticket at {:?}, the delete at {deleted_at:?}", ticket.ts());
        let (deleted, ticket) = w2.run(|x| x.delete(t, b"k")).unwrap();
        assert!(!deleted);
        assert!(ticket.ts() >= deleted_at, "a DEL's ticket at {:?}, the delete at {deleted_at:?}", ticket.ts());
        let (v, ticket) = w2.run(|x| x.version(t, b"k")).unwrap();
        assert!(!v.present);
        assert!(ticket.ts() >= deleted_at, "a WATCH's ticket at {:?}, the delete at {deleted_at:?}", ticket.ts());
        let mut got = Vec::new();
        let (_, ticket) = w2.run(|x| x.get_many_with(t, &[b"k"], |_, v| got.push(v.is_some()))).unwrap();
        assert_eq!(got, [false]);
        assert!(ticket.ts() >= deleted_at, "an MGET's ticket at {:?}, the delete at {deleted_at:?}", ticket.ts());
        // The insert commits after the readers: they were before it in the serial order.
        ins.commit().unwrap();
        assert_eq!(w2.run(|x| x.get(t, b"k")).unwrap().0.as_deref(), Some(&b"new"[..]));
    }

    /// A table whose record ids are (nearly) all handed out refuses new keys with an error,
    /// where `allocate_rid` used to panic; existing keys still update, put (a SET was
    /// refused too) and delete.
    #[test]
    fn a_table_out_of_record_ids_refuses_new_keys_and_serves_the_rest() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        w.run(|x| x.insert(t, b"old", b"1")).unwrap().1.wait().unwrap();
        let max = crate::table::RECORDS_PER_TABLE_MAX;
        db.table(t).unwrap().reserve_rids(max - WORKERS_MAX as u64 - 1);
        w.run(|x| x.insert(t, b"last", b"1")).unwrap().1.wait().unwrap();
        for refused in [w.run(|x| x.insert(t, b"new", b"1")).map(|_| ()), w.run(|x| x.put(t, b"new", b"1")).map(|_| ())]
        {
            match refused {
                Err(Error::OutOfRecordIds { table, max: m }) => assert_eq!((table.as_str(), m), ("t", max)),
                other => panic!("{other:?}"),
            }
        }
        w.run(|x| x.update(t, b"old", b"2")).unwrap().1.wait().unwrap();
        w.run(|x| x.put(t, b"last", b"2")).unwrap().1.wait().unwrap();
        w.run(|x| x.delete(t, b"last")).unwrap().1.wait().unwrap();
        assert_eq!(db.count(t).unwrap(), 1);
        assert_eq!(w.run(|x| x.get(t, b"old")).unwrap().0.as_deref(), Some(&b"2"[..]));
    }

    /// Near the limit, new keys take only ids given back, and workers racing for the few
    /// there are never move the limit: each loser of a race took a fresh id (the check
    /// before the index saw a free one, the take inside it found it gone), and after a few
    /// such losses the next one panicked in `allocate_rid`. A key found present gives its
    /// taken id back, first in line.
    #[test]
    fn workers_racing_for_the_last_free_ids_never_pass_the_limit() {
        use std::sync::atomic::AtomicBool;
        use std::time::Duration;
        const THREADS: usize = 4;
        let db = Database::new(Options { workers: THREADS });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        // Ids 0..3 hold keys, then every id but 3 is taken: the table is near its limit.
        for i in 0..3 {
            w.run(|x| x.insert(t, format!("seed{i}").as_bytes(), b"v")).unwrap().1.wait().unwrap();
        }
        let max = crate::table::RECORDS_PER_TABLE_MAX;
        db.table(t).unwrap().reserve_rids(max - 3);
        // A put of a key already there near the limit, with no id to reuse: written, not
        // refused, and no id used.
        let used = db.record_ids_used(t).unwrap();
        w.run(|x| x.put(t, b"seed0", b"w")).unwrap().1.wait().unwrap();
        assert_eq!(db.record_ids_used(t).unwrap(), used);
        for i in 0..3 {
            assert!(w.run(|x| x.delete(t, format!("seed{i}").as_bytes())).unwrap().0);
        }
        let give_back = |db: &Database| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while db.record_ids_used(t).unwrap() > max - 6 {
                assert!(std::time::Instant::now() < deadline, "the deleted keys' ids never came back");
                db.reclaim();
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        give_back(&db);
        // A key present again, found by a put that took the one id: it is back first.
        w.run(|x| x.insert(t, b"there", b"v")).unwrap().1.wait().unwrap();
        w.run(|x| x.put(t, b"there", b"w")).unwrap().1.wait().unwrap();
        assert_eq!(db.record_ids_used(t).unwrap(), max - 5, "a put of a present key kept the id it took");
        assert!(w.run(|x| x.delete(t, b"there")).unwrap().0);
        give_back(&db);
        drop(w);
        // Workers race for the three ids: insert a key, read it, delete it.
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let (db, stop) = (Arc::clone(&db), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let mut w = db.worker(WorkerId(i as u32)).unwrap();
                    let (mut made, mut refused) = (0u64, 0u64);
                    for n in 0..3000u64 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let key = format!("w{i}-{n}");
                        match w.run(|x| x.insert(t, key.as_bytes(), key.as_bytes())) {
                            Ok((_, ticket)) => {
                                ticket.wait().unwrap();
                            }
                            Err(Error::OutOfRecordIds { .. }) => {
                                refused += 1;
                                db.reclaim();
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        }
                        made += 1;
                        assert_eq!(w.run(|x| x.get(t, key.as_bytes())).unwrap().0.as_deref(), Some(key.as_bytes()));
                        assert!(w.run(|x| x.delete(t, key.as_bytes())).unwrap().0);
                        db.reclaim();
                    }
                    (made, refused)
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !threads.iter().all(|h| h.is_finished()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        let (mut made, mut refused) = (0, 0);
        for h in threads {
            let (m, r) = h.join().expect("a worker panicked");
            (made, refused) = (made + m, refused + r);
        }
        eprintln!("near the limit: {made} keys made, {refused} refused");
        assert!(made > 0, "no key was ever made");
        assert_eq!(db.record_ids_allocated(t).unwrap(), max - 3, "a fresh id was handed out near the limit");
    }

    /// What a transaction holds while it runs is bounded (`TXN_HELD_BYTES_MAX`), checked as
    /// it grows: lookups of an absent key (each kept for the phantom check), and writes that
    /// create records, are refused once past it and nothing is written; a value written again
    /// counts once, so a transaction the commit takes is not refused by it.
    #[test]
    fn what_a_transaction_holds_is_bounded_as_it_grows() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        let key = vec![b'k'; KEY_LEN_MAX];
        // Each lookup keeps the key and its entry (`MISS_HELD`).
        let per = KEY_LEN_MAX + MISS_HELD;
        let fits = TXN_HELD_BYTES_MAX / per;
        // The same absent key looked up again and again, by `get`, `get_many_with` and
        // `version`: refused on the lookup that passes the bound.
        for how in 0..3 {
            let mut txn = w.begin();
            let mut n = 0;
            let e = loop {
                let r = match how {
                    0 => txn.get(t, &key).map(|v| assert!(v.is_none())),
                    1 => txn.get_many_with(t, &[&key[..]], |_, v| assert!(v.is_none())),
                    _ => txn.version(t, &key).map(|v| assert!(!v.present)),
                };
                match r {
                    Ok(()) => n += 1,
                    Err(e) => break e,
                }
                assert!(n <= fits, "never refused ({how})");
            };
            assert_eq!(n, fits, "({how})");
            assert!(
                matches!(e, Error::TooLarge { len, max: TXN_HELD_BYTES_MAX, .. } if len == (fits + 1) * per),
                "{e:?}"
            );
        }
        // Records created: refused at the insert that passes the bound, nothing written.
        let value = vec![7u8; 1 << 20];
        let e = w
            .run(|x| -> Result<()> {
                for i in 0u32.. {
                    x.insert(t, &i.to_le_bytes(), &value)?;
                }
                unreachable!()
            })
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, Error::TooLarge { max: TXN_HELD_BYTES_MAX, .. }), "{e:?}");
        assert_eq!(w.run(|x| x.get(t, &0u32.to_le_bytes())).unwrap().0, None, "nothing written");
        // The same key written 1,000 times with a 1 MiB value holds one value, not 1,000,
        // and commits.
        w.run(|x| {
            for _ in 0..1000 {
                x.put(t, b"same", &value)?;
            }
            Ok(())
        })
        .unwrap()
        .1
        .wait()
        .unwrap();
        assert_eq!(w.run(|x| x.get(t, b"same")).unwrap().0.map(|v| v.len()), Some(value.len()));
        // Each entry is charged its own memory, not only the bytes it names: a read kept
        // for validation, a delete of an existing key (no bytes of its own), a scan and the
        // records it walked (before 2026-12-06 all of these were charged nothing, and a
        // FLUSHALL of 50M keys held about 8 GB before its commit's check).
        w.run(|x| {
            for k in [b"a", b"b", b"c"] {
                x.put(t, k, b"")?;
            }
            Ok(())
        })
        .unwrap()
        .1
        .wait()
        .unwrap();
        let mut txn = w.begin();
        let h0 = txn.s.held;
        assert!(txn.get(t, b"a").unwrap().is_some());
        assert_eq!(txn.s.held - h0, READ_HELD, "a read");
        let h1 = txn.s.held;
        assert!(txn.delete(t, b"b").unwrap());
        assert_eq!(txn.s.held - h1, WRITE_HELD, "a delete");
        let h2 = txn.s.held;
        let rows = txn.scan(t, Bound::Included(&b"a"[..]), Bound::Included(&b"c"[..]), Direction::Forward, 0).unwrap();
        assert_eq!(rows.len(), 3 - 1, "b deleted here");
        // (Its bounds' 2 bytes; the records walked that this transaction did not write: a and c.)
        assert_eq!(txn.s.held - h2, SCAN_HELD + 2 + 2 * READ_HELD, "a scan");
    }

    /// `put_concat` stores its two parts as one value, replacing in place or not, and a
    /// value whose parts together pass the limit is refused with nothing written.
    #[test]
    fn put_concat_stores_head_then_tail() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        w.run(|x| x.put_concat(t, b"k", b"\x00", b"abc")).unwrap().1.wait().unwrap();
        assert_eq!(w.run(|x| x.get(t, b"k")).unwrap().0.as_deref(), Some(&b"\x00abc"[..]));
        // Twice in one transaction: the second replaces the first in the write set.
        w.run(|x| {
            x.put_concat(t, b"k", b"", b"a much longer value than the first")?;
            x.put_concat(t, b"k", b"h:", b"")
        })
        .unwrap()
        .1
        .wait()
        .unwrap();
        assert_eq!(w.run(|x| x.get(t, b"k")).unwrap().0.as_deref(), Some(&b"h:"[..]));
        let half = vec![7u8; crate::VALUE_LEN_MAX / 2 + 1];
        match w.run(|x| x.put_concat(t, b"k", &half, &half)) {
            Err(Error::TooLarge { what: "value", len, .. }) => assert_eq!(len, 2 * half.len()),
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert_eq!(w.run(|x| x.get(t, b"k")).unwrap().0.as_deref(), Some(&b"h:"[..]));
    }

    /// The map answers exactly like a linear search of the write set, through growth, many
    /// clears, and the wrap of the generation counter.
    #[test]
    fn write_map_agrees_with_a_linear_search() {
        let records: Vec<Record> = (0..6000).map(|_| Record::default()).collect();
        let mut map = WriteMap::default();
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        for round in 0..200 {
            if round == 100 {
                map.generation = u32::MAX - 1; // wraps within the next few clears
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let n = [0, 1, 5, 31, 32, 33, 200, 2500][(rng % 8) as usize];
            let start = (rng >> 8) as usize % (records.len() - 2 * n);
            // Every other record of a window, so absent neighbours are asked about too.
            let written: Vec<*const Record> = (0..n).map(|i| &records[start + 2 * i] as *const Record).collect();
            for (i, &r) in written.iter().enumerate() {
                map.insert(r, i);
            }
            for r in &records {
                let p = r as *const Record;
                assert_eq!(map.get(p), written.iter().position(|&w| std::ptr::eq(w, p)), "round {round}");
            }
            map.clear();
            assert!(records.iter().all(|r| map.get(r).is_none()), "round {round}: cleared");
        }
        assert!(map.slots.len() <= WRITE_MAP_KEEP, "a huge table is given back");
    }

    /// A transaction that read and wrote many records leaves its worker's buffers no larger
    /// than `WRITE_MAP_KEEP` entries; before, they kept their largest size for good.
    #[test]
    fn a_large_transactions_buffers_are_let_go() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        let n = 3 * WRITE_MAP_KEEP as u32;
        w.run(|x| (0..n).try_for_each(|i| x.put(t, &i.to_be_bytes(), b"v").map(drop))).unwrap().1.wait().unwrap();
        let read = w
            .run(|x| {
                let mut found = 0;
                for i in 0..n + WRITE_MAP_KEEP as u32 {
                    found += usize::from(x.get(t, &i.to_be_bytes())?.is_some());
                }
                x.put(t, b"last", b"v")?;
                Ok(found)
            })
            .unwrap()
            .0;
        assert_eq!(read, n as usize);
        let s = w.scratch.as_ref().expect("given back");
        let caps = [s.reads.capacity(), s.writes.capacity(), s.scans.capacity(), s.misses.capacity()];
        assert!(caps.iter().all(|&c| c <= WRITE_MAP_KEEP), "capacities {caps:?}");
    }
}
