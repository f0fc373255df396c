//! The database handle, workers and the commit-log hook.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::clock::CommitClock;
use crate::error::{Error, Result};
use crate::ids::{RecordId, TableId, Ts, WorkerId};
use crate::record::{OwnedVersion, LOCK_BIT, TS_MASK, UNLINKED_BIT};
use crate::table::{Table, RECORDS_PER_TABLE_MAX};
use crate::txn::{ReadTxn, Transaction, TxnScratch};

/// Most workers a database can have.
pub const WORKERS_MAX: usize = 1024;
/// Most tables a database can hold.
pub const TABLES_MAX: usize = 256;
/// The longest table name, in bytes (the catalog stores its length in 16 bits).
pub const TABLE_NAME_MAX: usize = u16::MAX as usize;
/// Longest key, in bytes (the log format's limit).
pub const KEY_LEN_MAX: usize = 64 * 1024;
/// Longest value, in bytes.
pub const VALUE_LEN_MAX: usize = 16 * 1024 * 1024;
/// Largest write set of one transaction, counted as an upper bound of what the log
/// encodes: `LOG_TXN_OVERHEAD_MAX` per transaction, `LOG_WRITE_OVERHEAD_MAX` per write,
/// plus every write's key and value bytes; half the log's batch limit.
pub const TXN_BYTES_MAX: usize = 128 * 1024 * 1024;
/// Most a transaction may hold while it runs, beyond what it reads in place: its writes'
/// values and the keys of the records it created, the keys it looked up and found absent
/// (kept for the phantom check, once per lookup), and its scans' bounds. Twice
/// `TXN_BYTES_MAX`, so that no transaction the commit would take is refused by it (a write
/// set is counted here for no more than the commit counts it). Checked as it grows: before
/// 2026-12-06 nothing bounded it until the commit, and an HMGET of a million fields under
/// a 65,000-byte key kept 68 GB of missed rows (each repeats the key), an HSET of 500,000
/// new fields 32 GB of records, before the commit's check (found by a review).
/// Since a later review (2026-12-06) each entry is charged its own memory too, not only
/// the bytes it names (a FLUSHALL of 50M keys held about 8 GB of entries before its
/// commit's check): 5 times `TXN_BYTES_MAX`, so a write set the commit would take still
/// fits (`txn::WRITE_HELD` per write, which the log counts at least
/// `LOG_WRITE_OVERHEAD_MAX + 1`; checked at compile time).
pub const TXN_HELD_BYTES_MAX: usize = 5 * TXN_BYTES_MAX;
/// Most bytes the log spends on one transaction besides its writes (log format v2: a ts
/// delta varint of at most 10 bytes and a write count varint of at most 5). The log crate
/// checks at compile time that its encoding stays within this.
pub const LOG_TXN_OVERHEAD_MAX: usize = 15;
/// A bound on the bytes the log spends on one write besides its key and value bytes. Log
/// format v2 needs at most 15 (flags 1, table varint 2, rid delta varint 5, key length
/// varint 3, value length varint 4); the log crate checks at compile time that this holds.
pub const LOG_WRITE_OVERHEAD_MAX: usize = 23;

/// One write of a committed transaction, as handed to the commit log.
#[derive(Debug, Clone, Copy)]
pub struct LoggedWrite<'a> {
    pub table: TableId,
    pub rid: RecordId,
    /// The key, when the record had no value before this transaction (an insert, or a write
    /// over a tombstone; an insert then delete in one transaction logs a delete with its key).
    /// `None` for updates and deletes of records present before the transaction: replay addresses them
    /// by `rid`, and the record's key is already in the checkpoint or in an earlier write.
    pub key: Option<&'a [u8]>,
    /// `None`: delete.
    pub value: Option<&'a [u8]>,
}

/// Where committed write sets go. Implemented by the log crate; the engine only calls it.
///
/// Protocol, per worker: `append` is called for each committing transaction in timestamp
/// order, after validation succeeded and before the worker's commit slot is cleared (so
/// `CommitClock::stream_bound` never runs ahead of what was appended).
pub trait CommitLog: Send + Sync {
    /// Err once the log has failed: commits are refused before they take a timestamp.
    fn check_writable(&self) -> Result<()>;
    /// Called before a commit on `worker` takes its record locks: a log that holds writers
    /// back (a stream buffer over its limit while the disk stalls) waits here, where the
    /// commit holds nothing, rather than in `append`, under its record locks and its
    /// commit slot (where readers of its records spun and the visible timestamp froze for
    /// as long as the disk stalled; found by a review, 2026-12-06). Err as `check_writable`.
    fn reserve(&self, _worker: WorkerId) -> Result<()> {
        self.check_writable()
    }
    /// Buffers one transaction's write set on `worker`'s stream. Never does I/O itself; a
    /// log whose `reserve` waits for room does not wait here (the stream is the worker's
    /// alone, so nothing fills it between the two).
    fn append(&self, worker: WorkerId, ts: Ts, writes: &mut dyn ExactSizeIterator<Item = LoggedWrite<'_>>);
    /// Called on the committing thread at the end of each commit that `append`ed, once its
    /// writes are installed, its record locks let go and its timestamp visible: a log may
    /// do here the I/O it deferred (ship a batch), holding up no other transaction.
    fn committed(&self) {}
    /// Blocks until every transaction with a timestamp at or below `ts` is durable under
    /// the log's durability, or the log has failed.
    fn wait_durable(&self, ts: Ts) -> Result<()>;
    /// Whether `ts` is durable now (Err if the log has failed).
    fn is_durable(&self, ts: Ts) -> Result<bool>;
    /// Makes a new table durable before anyone can write to it.
    fn table_created(&self, id: TableId, name: &str) -> Result<()>;
    /// Whether this stands for a log detached (`Database::detach_log`).
    fn detached(&self) -> bool {
        false
    }
}

/// What an engine whose log was detached has instead (`Database::detach_log`): every
/// commit is refused before it takes a timestamp, so none is made without a log.
struct Detached;

impl CommitLog for Detached {
    fn check_writable(&self) -> Result<()> {
        Err(Error::LogFailed("the commit log was detached (the node changes its role)".into()))
    }
    fn append(&self, _worker: WorkerId, _ts: Ts, _writes: &mut dyn ExactSizeIterator<Item = LoggedWrite<'_>>) {
        unreachable!("check_writable refuses every commit")
    }
    // A read-only transaction's ticket waits on what it read: made durable by the log it
    // was committed under, or by the replica log a backup replayed it from.
    fn wait_durable(&self, _ts: Ts) -> Result<()> {
        Ok(())
    }
    fn is_durable(&self, _ts: Ts) -> Result<bool> {
        Ok(true)
    }
    fn table_created(&self, _id: TableId, _name: &str) -> Result<()> {
        Err(Error::LogFailed("the commit log was detached".into()))
    }
    fn detached(&self) -> bool {
        true
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Number of workers (threads running read-write transactions), and so of log streams.
    pub workers: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { workers: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) }
    }
}

/// An in-memory database. Durable databases are opened through `ditto_log::open`, which
/// recovers one of these and attaches a log to it.
pub struct Database {
    pub(crate) clock: Arc<CommitClock>,
    pub(crate) tables: Box<[OnceLock<Table>]>,
    names: Mutex<HashMap<String, TableId>>,
    /// The commit log, if one is attached (`attach_log`); `log_gen` counts attachments and
    /// detachments, so that a worker's cached handle (`Worker::ticket_log`) follows a log
    /// replaced while the engine lives on (a switchover's old primary that follows in
    /// place, and is later promoted in place again).
    pub(crate) log: parking_lot::RwLock<Option<Arc<dyn CommitLog>>>,
    pub(crate) log_gen: std::sync::atomic::AtomicU64,
    workers_taken: Box<[AtomicBool]>,
    /// Per worker, its deleted records to unlink from the index once no snapshot can see
    /// them (`Database::unlink_deleted`). Shared, not the worker's own, so that `reclaim`
    /// on any thread reaches every worker's deletes.
    pub(crate) deleted: Box<[Mutex<DeletedList>]>,
    /// Record ids given back since the database was created (`release_rids_after`): for
    /// reuse, or, on a backup, unlinked and let go.
    rids_released: AtomicU64,
    /// Versions come from replay (a backup's engine, set by its first replayed write until
    /// `forget_reusable_rids`): record ids are the primary's, none is handed out here, so
    /// the ids the cleanup unlinks are not kept for reuse (they were kept for good, a
    /// list growing by one entry per replayed delete).
    replaying: AtomicBool,
    /// Moved by `forget_reusable_rids`: ids whose giving back was deferred before it are
    /// dropped (a backup's, promoted meanwhile, would otherwise reach the new primary's
    /// free list with a record a replayer had given a new life: the next insert's reuse
    /// failed on a live record).
    rid_generation: AtomicU64,
    /// `Database::replay_wait_max` in ms (0: the default).
    pub(crate) replay_wait_max_ms: AtomicU64,
    /// The snapshot a backup's own checkpoint reads at while it is written
    /// (`Database::checkpoint_reading`; 0: none).
    pub(crate) checkpoint_reading_at: AtomicU64,
    /// Replayed writes waiting for every snapshot to pass a key's or id's old life
    /// (`Database::horizon_waiters`).
    pub(crate) horizon_waiters: std::sync::atomic::AtomicUsize,
    /// This database, for work deferred to the epoch GC (giving back record ids).
    me: Weak<Database>,
    /// On a backup: replayed updates waiting for their record's insert (replay.rs).
    pub(crate) parked: crate::replay::Parked,
    pub(crate) redirects: crate::replay::Redirects,
    /// Recovery of a log in which a record id may have two lives (`recovery_log_begins`):
    /// per record the log gave a key, the timestamp of the newest keyed write seen, so that
    /// the record ends with the key of its newest life in whatever order the writes are
    /// replayed. Sharded by record id; `None` outside such a recovery.
    recovery_keys: parking_lot::RwLock<Option<Box<[KeyTimes]>>>,
    recovery_tracking: AtomicBool,
}

/// A shard of `Database::recovery_keys`: per table and run of `RECOVERY_KEY_RUN` record
/// ids, the newest keyed write's timestamp of each id of the run in the shard (0: none
/// seen). Dense within a run, as the table's records are, and allocated a run at a time,
/// as its chunks are (an id far above the others costs one run): a map keyed by (table,
/// record id) cost 2-4x an untracked install, a hash and a cache miss per write and
/// rehashes as it grew (example `recovery_key_tracking`).
type KeyTimes = Mutex<HashMap<(u32, u64), Box<[u64; RECOVERY_KEY_RUN / RECOVERY_KEY_SHARDS]>>>;

/// Record ids per run of `KeyTimes`.
const RECOVERY_KEY_RUN: usize = 1 << 16;

/// Shards of `Database::recovery_keys`.
const RECOVERY_KEY_SHARDS: usize = 64;

/// A deleted record waiting to be unlinked: its table, rid and tombstone's timestamp.
pub(crate) type Deleted = (TableId, RecordId, Ts);

/// A list of `Database::deleted`, with the oldest tombstone in it: while a long snapshot
/// (a checkpoint's) holds the GC horizon back, every check (each 128 commits, and each
/// `reclaim`) finds nothing due at once, instead of reading the whole list, which grows by
/// every delete meanwhile (found by a review, 2026-12-03: quadratic in the deletes of a
/// checkpoint's span). Replay adds to the lists by record id, not in timestamp order, so
/// the oldest is kept, not read off the front.
#[derive(Default)]
pub(crate) struct DeletedList {
    list: Vec<Deleted>,
    /// The oldest tombstone in `list` (`None` when empty).
    oldest: Option<Ts>,
}

impl DeletedList {
    pub(crate) fn push(&mut self, d: Deleted) {
        self.oldest = Some(self.oldest.map_or(d.2, |o| o.min(d.2)));
        self.list.push(d);
    }

    /// Takes out the entries at or below `horizon` (none, without reading the list, when
    /// the oldest is above it).
    fn take_due(&mut self, horizon: Ts) -> Vec<Deleted> {
        if self.oldest.is_none_or(|o| o > horizon) {
            return Vec::new();
        }
        let (due, keep): (Vec<Deleted>, Vec<Deleted>) = self.list.drain(..).partition(|&(_, _, ts)| ts <= horizon);
        self.oldest = keep.iter().map(|d| d.2).min();
        self.list = keep;
        due
    }
}

impl Database {
    pub fn new(opts: Options) -> Arc<Database> {
        assert!(opts.workers >= 1 && opts.workers <= WORKERS_MAX, "workers must be in 1..=1024");
        Arc::new_cyclic(|me| Database {
            clock: Arc::new(CommitClock::new(opts.workers)),
            tables: (0..TABLES_MAX).map(|_| OnceLock::new()).collect(),
            names: Mutex::new(HashMap::new()),
            log: parking_lot::RwLock::new(None),
            log_gen: std::sync::atomic::AtomicU64::new(0),
            workers_taken: (0..opts.workers).map(|_| AtomicBool::new(false)).collect(),
            deleted: (0..opts.workers).map(|_| Mutex::new(DeletedList::default())).collect(),
            parked: Default::default(),
            redirects: Default::default(),
            recovery_keys: parking_lot::RwLock::new(None),
            recovery_tracking: AtomicBool::new(false),
            rids_released: AtomicU64::new(0),
            replaying: AtomicBool::new(false),
            rid_generation: AtomicU64::new(0),
            replay_wait_max_ms: AtomicU64::new(0),
            checkpoint_reading_at: AtomicU64::new(0),
            horizon_waiters: Default::default(),
            me: me.clone(),
        })
    }

    /// Record ids whose former life ended at or below `ts` may be reused: the log calls this
    /// once a checkpoint at `ts` is durable (table.rs says why).
    pub fn allow_rid_reuse_up_to(&self, ts: Ts) {
        self.clock.raise_reuse_bound(ts);
    }

    pub(crate) fn reuse_bound(&self) -> Ts {
        self.clock.reuse_bound()
    }

    /// Moved by each `forget_reusable_rids` (an id taken from a free list goes back only
    /// within the generation it was taken in).
    pub(crate) fn rid_generation(&self) -> u64 {
        self.rid_generation.load(Ordering::Acquire)
    }

    /// The engine's versions come from replay (`replaying`).
    #[inline]
    pub(crate) fn mark_replaying(&self) {
        if !self.replaying.load(Ordering::Relaxed) {
            self.replaying.store(true, Ordering::Release);
        }
    }

    /// Gives unlinked records' ids back for reuse once no transaction pinned now can hold
    /// them: (table, rid, the timestamp of the tombstone that ended the record's life).
    pub(crate) fn release_rids_after(&self, guard: &crossbeam_epoch::Guard, unlinked: Vec<Deleted>) {
        if unlinked.is_empty() {
            return;
        }
        let me = self.me.clone();
        let generation = self.rid_generation.load(Ordering::Acquire);
        let replaying = self.replaying.load(Ordering::Acquire);
        guard.defer(move || {
            let Some(db) = me.upgrade() else { return };
            // (Counted on a backup too: its checkpointer's trigger on ids given back.)
            db.rids_released.fetch_add(unlinked.len() as u64, Ordering::Relaxed);
            if replaying {
                return;
            }
            // One lock per table: the ids come grouped by table, or nearly.
            let current = || db.rid_generation.load(Ordering::Acquire) == generation;
            for run in unlinked.chunk_by(|a, b| a.0 == b.0) {
                if let Ok(t) = db.table(run[0].0) {
                    t.release_rids(run.iter().map(|&(_, rid, deleted)| (rid, deleted)), current);
                }
            }
        });
    }

    /// Frees now what would otherwise wait for the workers' periodic collections: every
    /// deleted record that all snapshots see as deleted leaves the index and its older
    /// versions go to the epoch GC, which is then asked to collect (a few times, as each
    /// try can advance the epoch by one). For whoever needs memory back at once, such as
    /// the server before it refuses a write over `maxmemory`; any thread may call it.
    /// Garbage that other threads deferred and still hold in their own bags is collected
    /// when they next flush (after at most `GC_COLLECT_EVERY_INSTALLS` installs).
    pub fn reclaim(&self) {
        let horizon = self.clock.refresh_horizon();
        for w in 0..self.deleted.len() {
            self.unlink_deleted(w, horizon);
        }
        for _ in 0..3 {
            crossbeam_epoch::pin().flush();
        }
    }

    /// Unlinks worker `w`'s deleted records whose tombstone is at or below `horizon`.
    /// The due entries are taken out under the list's lock and unlinked after it is let go:
    /// an unlink waits for the record's lock, and a committer holds its records' locks
    /// while it adds to this list, so holding both would deadlock (it did, under
    /// `reclaim` on another thread: crates/engine/tests/rid_reuse.rs).
    pub(crate) fn unlink_deleted(&self, w: usize, horizon: Ts) {
        let due = self.deleted[w].lock().take_due(horizon);
        if due.is_empty() {
            return;
        }
        let guard = crossbeam_epoch::pin();
        let mut unlinked = Vec::new();
        for (table, rid, ts) in due {
            if let Ok(t) = self.table(table) {
                if crate::txn::unlink_if(t, rid, ts.0, &guard) {
                    unlinked.push((table, rid, ts));
                }
            }
        }
        self.release_rids_after(&guard, unlinked);
    }

    pub fn workers(&self) -> usize {
        self.workers_taken.len()
    }

    pub fn clock(&self) -> &Arc<CommitClock> {
        &self.clock
    }

    /// Attaches the commit log. Must happen before any worker commits. From then on record
    /// ids are reused only up to `allow_rid_reuse_up_to` (the log's durable checkpoints).
    pub fn attach_log(&self, log: Arc<dyn CommitLog>) {
        let mut slot = self.log.write();
        assert!(slot.as_ref().is_none_or(|l| l.detached()), "a commit log is already attached");
        *slot = Some(log);
        self.log_gen.fetch_add(1, Ordering::AcqRel);
        self.clock.reset_reuse_bound();
        drop(slot);
        self.unlink_backup_own_records();
    }

    /// A backup's own records (a record id's late old life, replay.rs) leave the index as
    /// its engine starts to commit (a promotion in place): their ids are no primary's, so a
    /// write must not find its key on one. Each life there ended before the replayed
    /// history the promotion serves from; one whose tombstone a snapshot still running may
    /// not see yet leaves with the deletes' usual cleanup, and a write to its key is
    /// retried as a conflict meanwhile (`Transaction::write`).
    fn unlink_backup_own_records(&self) {
        let horizon = self.clock.refresh_horizon();
        let guard = crossbeam_epoch::pin();
        for t in self.tables.iter().filter_map(|t| t.get()) {
            for rid in t.backup_own_rids() {
                let Some(rec) = t.record_if_allocated(RecordId(rid)) else { continue };
                let tid = rec.tid.load(Ordering::Acquire) & !crate::record::LOCK_BIT;
                if tid & crate::record::UNLINKED_BIT == 0 && tid & crate::record::TS_MASK <= horizon.0 {
                    crate::txn::unlink_if(t, RecordId(rid), tid, &guard);
                }
            }
        }
    }

    /// Detaches the commit log (closed by its owner: the engine lives on without one, as a
    /// backup's, until another is attached). Commits are not to be made meanwhile: a
    /// backup's engine takes replayed versions only.
    pub fn detach_log(&self) {
        *self.log.write() = Some(Arc::new(Detached));
        self.log_gen.fetch_add(1, Ordering::AcqRel);
    }

    pub fn has_log(&self) -> bool {
        self.log.read().as_ref().is_some_and(|l| !l.detached())
    }

    /// Creates a table (durably, if a log is attached). Creating an existing name is an error.
    pub fn create_table(&self, name: &str) -> Result<TableId> {
        // (Longer, the catalog could not store it, and the directory would not open.)
        if name.len() > TABLE_NAME_MAX {
            return Err(Error::TooLarge { what: "a table name", len: name.len(), max: TABLE_NAME_MAX });
        }
        let mut names = self.names.lock();
        if names.contains_key(name) {
            return Err(Error::TableExists(name.to_string()));
        }
        let id = TableId(names.len() as u32);
        if names.len() >= TABLES_MAX {
            return Err(Error::TooManyTables(TABLES_MAX));
        }
        if let Some(log) = self.log.read().as_ref() {
            log.table_created(id, name)?;
        }
        self.install_table(id, name, &mut names);
        Ok(id)
    }

    /// Returns the table's id, creating it if needed.
    pub fn open_table(&self, name: &str) -> Result<TableId> {
        match self.table_id(name) {
            Some(id) => Ok(id),
            None => self.create_table(name),
        }
    }

    /// Recreates a table recorded in a catalog (recovery; no log call).
    pub fn restore_table(&self, id: TableId, name: &str) {
        let mut names = self.names.lock();
        assert_eq!(id.0 as usize, names.len(), "catalog tables must be restored in id order");
        self.install_table(id, name, &mut names);
    }

    fn install_table(&self, id: TableId, name: &str, names: &mut HashMap<String, TableId>) {
        names.insert(name.to_string(), id);
        let fresh = Table::new(name.to_string());
        assert!(self.tables[id.0 as usize].set(fresh).is_ok(), "table slot {id:?} reused");
    }

    pub fn table_id(&self, name: &str) -> Option<TableId> {
        self.names.lock().get(name).copied()
    }

    /// All tables, in id order.
    pub fn tables(&self) -> Vec<(TableId, String)> {
        let mut v: Vec<_> = self.names.lock().iter().map(|(n, id)| (*id, n.clone())).collect();
        v.sort();
        v
    }

    pub(crate) fn table(&self, id: TableId) -> Result<&Table> {
        self.tables.get(id.0 as usize).and_then(|t| t.get()).ok_or(Error::NoSuchTable(id))
    }

    /// Takes worker `id` (each worker is used by one thread at a time; its id is its log
    /// stream). Returns None if it is taken.
    pub fn worker(self: &Arc<Self>, id: WorkerId) -> Option<Worker> {
        let flag = self.workers_taken.get(id.0 as usize)?;
        if flag.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(Worker {
            db: Arc::clone(self),
            id,
            scratch: Some(Box::default()),
            commits: 0,
            installs_since_collect: 0,
            ticket_log: None,
        })
    }

    /// A read-only transaction at the newest consistent snapshot. Never blocks writers,
    /// never aborts.
    pub fn read(&self) -> ReadTxn<'_> {
        ReadTxn::new(self)
    }

    /// Waits until `ts` is durable (immediately true without a log).
    pub fn wait_durable(&self, ts: Ts) -> Result<()> {
        let log = self.log.read().clone();
        match log {
            Some(log) => log.wait_durable(ts),
            None => Ok(()),
        }
    }

    // ---- recovery: only before any worker runs ------------------------------------------

    /// Installs a recovered version of (table, rid) if it is newer than what the record has
    /// (`value` `None`: a delete). `key` is called only if the record has no key yet, so the
    /// many replayed writes that lose to a newer version cost no allocation at all. Safe to
    /// call from several threads at once (replay of several streams in parallel).
    pub fn recovery_install<K>(
        &self,
        table: TableId,
        rid: RecordId,
        key: Option<K>,
        ts: Ts,
        value: Option<&[u8]>,
    ) -> Result<()>
    where
        K: FnOnce() -> Bytes,
    {
        let t = self.table(table)?;
        check_recovered_row(&t.name, rid, ts, value.map(<[u8]>::len))?;
        t.reserve_rids(rid.0 + 1);
        let rec = t.record(rid);
        match key {
            Some(key) if self.recovery_tracking.load(Ordering::Acquire) => self.recovery_key(table, rid, rec, key, ts),
            Some(key) => rec.key.init(key),
            None => {}
        }
        // During recovery a record's version only ever gets newer, so a write that is not
        // newer than what the record holds now never will be: skip it without taking the
        // lock (replay meets many such writes, as it goes newest first).
        if ts.0 <= rec.tid.load(Ordering::Acquire) & TS_MASK {
            return Ok(());
        }
        assert!(rec.lock(), "recovered record {table:?}/{rid:?} is unlinked");
        let cur = rec.tid.load(Ordering::Relaxed) & TS_MASK;
        if ts.0 <= cur {
            rec.unlock_unchanged();
            return Ok(());
        }
        // SAFETY: recovery runs before any reader or committer exists, and every installer
        // takes the record lock (held here) before touching its versions: nothing else can
        // load or free them, so the one recovered version is overwritten in place when the
        // value fits, else replaced at once, not retired.
        unsafe {
            if !rec.overwrite_only_version(ts, value) {
                rec.free_versions_now();
                let mut version = OwnedVersion::new(value);
                version.set_ts(ts);
                rec.head.store(version.into_raw(), Ordering::Release);
            }
        }
        rec.tid.store(ts.0, Ordering::Release);
        debug_assert!(rec.tid.load(Ordering::Relaxed) & LOCK_BIT == 0);
        Ok(())
    }

    /// The writes installed from here on come from a log in which a record id may have two
    /// lives: a backup's replica log (or a sealed one) above the backup's own checkpoint,
    /// which its own schedule may have taken before the tombstone whose cover by the
    /// primary's checkpoint let the primary reuse the id (table.rs). A record then takes the
    /// key of its newest keyed write, not the first it was given (the checkpoint's, or the
    /// first replayed: recovery goes newest first, on several threads). Until
    /// `recovery_finish`. (Before 2026-12-03 the first key stayed: a backup restarted or
    /// promoted from its directory could read the new key's value under the old key, and
    /// miss the new key; found by a review.) A primary's own log needs none of this: its
    /// ids are reused only once its own checkpoint covers the old life.
    pub fn recovery_log_begins(&self) {
        let mut keys = self.recovery_keys.write();
        if keys.is_none() {
            *keys = Some((0..RECOVERY_KEY_SHARDS).map(|_| Mutex::new(HashMap::new())).collect());
        }
        self.recovery_tracking.store(true, Ordering::Release);
    }

    /// `recovery_install`'s key under `recovery_log_begins`: set or replaced if `ts` is the
    /// newest keyed write of the record seen so far.
    fn recovery_key<K: FnOnce() -> Bytes>(
        &self,
        table: TableId,
        rid: RecordId,
        rec: &crate::record::Record,
        key: K,
        ts: Ts,
    ) {
        let shards = self.recovery_keys.read();
        let Some(shards) = shards.as_ref() else { return rec.key.init(key) };
        let mut shard = shards[(rid.0 % RECOVERY_KEY_SHARDS as u64) as usize].lock();
        let run = shard
            .entry((table.0, rid.0 / RECOVERY_KEY_RUN as u64))
            .or_insert_with(|| Box::new([0; RECOVERY_KEY_RUN / RECOVERY_KEY_SHARDS]));
        let newest = &mut run[(rid.0 % RECOVERY_KEY_RUN as u64) as usize / RECOVERY_KEY_SHARDS];
        if ts.0 <= *newest {
            return;
        }
        *newest = ts.0;
        let key = key();
        let guard = crossbeam_epoch::pin();
        match rec.key.get(&guard) {
            // (The common case, a record's first key: taken as it is, not copied again.)
            None => rec.key.init(move || key),
            Some(k) if *k == key => {}
            // SAFETY: one writer of this record's key at a time (its shard's lock is held),
            // and the old key goes through the epoch GC (nothing reads keys during recovery
            // anyway).
            Some(_) => unsafe { rec.key.replace(&key, &guard) },
        }
    }

    /// After recovery installs: builds every table's index from its live records, on
    /// `threads` threads, and moves the clock past `max_ts`. The index takes concurrent
    /// inserts, so the threads share out record-id ranges of all tables
    /// (`REBUILD_RIDS_PER_TASK` each) from one counter. Returns the keys indexed.
    pub fn recovery_finish(&self, max_ts: Ts, threads: usize) -> Result<u64> {
        const REBUILD_RIDS_PER_TASK: u64 = 1 << 14;
        self.recovery_tracking.store(false, Ordering::Release);
        *self.recovery_keys.write() = None;
        self.clock.advance_to(max_ts);
        let mut tasks = Vec::new();
        for slot in self.tables.iter() {
            let Some(t) = slot.get() else { continue };
            let limit = t.rid_limit();
            tasks.extend(
                (0..limit)
                    .step_by(REBUILD_RIDS_PER_TASK as usize)
                    .map(|lo| (t, lo..(lo + REBUILD_RIDS_PER_TASK).min(limit))),
            );
        }
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let rebuild = || -> Result<u64> {
            let guard = crossbeam_epoch::pin();
            let mut n = 0;
            let mut absent = Vec::new();
            while let Some((t, rids)) = tasks.get(next.fetch_add(1, Ordering::Relaxed)) {
                if failed.load(Ordering::Relaxed) {
                    break;
                }
                absent.clear();
                for rid in rids.clone() {
                    let Some(rec) = t.record_if_allocated(RecordId(rid)) else { continue };
                    let (_, head) = rec.read_latest(&guard);
                    if head.is_none_or(|v| v.value().is_none()) {
                        // Deleted, or never written: out of the index, so unlinked, and its
                        // id free for a new key (the log's checkpoint after recovery covers
                        // whatever life it had; nothing runs yet, so no grace is needed).
                        rec.tid.fetch_or(UNLINKED_BIT, Ordering::AcqRel);
                        absent.push(rid);
                        continue;
                    }
                    // A present record got its key from the checkpoint or from the logged
                    // insert; without one the log or checkpoint lost an insert.
                    let Some(key) = rec.key.get(&guard) else {
                        failed.store(true, Ordering::Relaxed);
                        return Err(Error::Corrupt(format!(
                            "table {} record {rid} has a value but no key was recovered for it",
                            t.name
                        )));
                    };
                    let (other, inserted) = t.index.get_or_insert_with(key, || rid, &guard);
                    if !inserted {
                        failed.store(true, Ordering::Relaxed);
                        let (a, b) = (other.min(rid), other.max(rid));
                        return Err(Error::Corrupt(format!(
                            "table {} records {a} and {b} are both present with the same key",
                            t.name
                        )));
                    }
                    n += 1;
                }
                t.release_rids(absent.iter().map(|&rid| (RecordId(rid), Ts(0))), || true);
            }
            Ok(n)
        };
        let threads = threads.clamp(1, tasks.len().max(1));
        let indexed = std::thread::scope(|s| {
            let hs: Vec<_> = (1..threads).map(|_| s.spawn(rebuild)).collect();
            let mine = rebuild();
            hs.into_iter()
                .map(|h| h.join().expect("index rebuild panicked"))
                .try_fold(mine?, |sum, n| Ok::<_, Error>(sum + n?))
        })?;
        self.clock.refresh_horizon();
        Ok(indexed)
    }

    /// Forgets every record id waiting for reuse, in every table: for a backup's engine
    /// that becomes a primary's (promotion in place). Its list was made when its directory
    /// was opened (`recovery_finish` gives back the ids of records absent then) and by
    /// replayed deletes, but replay then installs the primary's records at the primary's
    /// ids, some of them among those given back (an insert that was in flight when the
    /// checkpoint the backup loaded was written): reusing them would give a second key to
    /// a record that holds one (found by `ditto bench failover`: a key read another key's
    /// value on a new primary promoted in place a second after it had joined). The ids are
    /// left unused (the space is `RECORDS_PER_TABLE_MAX` per table) until the next recovery
    /// counts them again; ids the new primary frees itself are reused as usual.
    pub fn forget_reusable_rids(&self) {
        // Before the lists are cleared, each under its lock: a deferred giving back checks
        // the generation under the same lock, so it either lands before the clear or
        // drops its ids.
        self.rid_generation.fetch_add(1, Ordering::AcqRel);
        self.replaying.store(false, Ordering::Release);
        for slot in self.tables.iter() {
            if let Some(t) = slot.get() {
                t.forget_free_rids();
            }
        }
    }

    /// Record ids in use in the table, of `RECORDS_PER_TABLE_MAX`: those handed out, less
    /// those given back and not yet reused (table.rs). At the limit, with none to reuse, the
    /// table takes no new keys (`Error::OutOfRecordIds`).
    pub fn record_ids_used(&self, table: TableId) -> Result<u64> {
        Ok(self.table(table)?.rids_used())
    }

    /// Record ids given back for reuse, in every table, since this database was created:
    /// deleted records' ids, which wait for the next checkpoint to be reused (on a
    /// backup, which reuses none, those unlinked). The log's checkpointer counts them to
    /// checkpoint sooner under key churn (`ditto_log::CheckpointPolicy`).
    pub fn record_ids_released(&self) -> u64 {
        self.rids_released.load(Ordering::Relaxed)
    }

    /// Record ids in use in every table (`record_ids_used` summed).
    pub fn record_ids_used_total(&self) -> u64 {
        self.tables.iter().filter_map(OnceLock::get).map(Table::rids_used).sum()
    }

    /// Record ids the table has ever handed out (its indirection array's extent): reused
    /// ids count once.
    pub fn record_ids_allocated(&self, table: TableId) -> Result<u64> {
        Ok(self.table(table)?.rid_limit())
    }

    /// Number of live (present) keys in a table, by scanning the index at a snapshot.
    pub fn count(&self, table: TableId) -> Result<u64> {
        let r = self.read();
        let mut n = 0u64;
        r.for_each(table, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, |_, _| {
            n += 1;
            true
        })?;
        Ok(n)
    }
}

/// A worker: the context of one thread running read-write transactions. Its id names its
/// commit slot and its log stream.
pub struct Worker {
    pub(crate) db: Arc<Database>,
    pub(crate) id: WorkerId,
    /// The transaction buffers (`Transaction::s`), here between transactions.
    pub(crate) scratch: Option<Box<TxnScratch>>,
    pub(crate) commits: u64,
    /// Versions installed since this worker last asked the epoch GC to collect (see
    /// `GC_COLLECT_EVERY_INSTALLS` in txn.rs).
    pub(crate) installs_since_collect: u32,
    /// This worker's handle on the log for its tickets (made at its first commit with a
    /// log attached; see [`TicketLog`]).
    /// This worker's handle on the commit log, and the `Database::log_gen` it was made at.
    pub(crate) ticket_log: Option<(u64, Option<Arc<TicketLog>>)>,
}

/// The log as a commit ticket holds it: one allocation per worker, so the reference count
/// that every commit's ticket increments (and its drop decrements) is touched by that
/// worker's thread alone. With one shared `Arc` for all workers, that count's cache line
/// moved between cores on every commit: its `lock inc` was 62% of `commit_async`'s own
/// time in a pipelined-GET profile of the server.
pub(crate) struct TicketLog(pub(crate) Arc<dyn CommitLog>);

/// How many times `Worker::run` retries a conflicting transaction.
pub const RETRIES_MAX: u32 = 1000;

impl Worker {
    pub fn id(&self) -> WorkerId {
        self.id
    }

    pub fn db(&self) -> &Arc<Database> {
        &self.db
    }

    /// Starts a read-write transaction.
    pub fn begin(&mut self) -> Transaction<'_> {
        Transaction::new(self)
    }

    /// Starts a read-only transaction at the newest snapshot (see
    /// `Transaction::new_snapshot`): a backup's commands run in these.
    pub fn begin_snapshot(&mut self) -> Transaction<'_> {
        Transaction::new_snapshot(self)
    }

    /// Runs `body` in a transaction and commits it, retrying on conflicts (up to
    /// RETRIES_MAX times). Returns the body's result and a ticket for durability.
    pub fn run<T>(&mut self, mut body: impl FnMut(&mut Transaction<'_>) -> Result<T>) -> Result<(T, CommitTicket)> {
        let mut tries = 0;
        loop {
            let mut txn = self.begin();
            let out = body(&mut txn).and_then(|v| txn.commit_async().map(|t| (v, t)));
            match out {
                Err(e) if e.is_retryable() && tries < RETRIES_MAX => tries += 1,
                other => return other,
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.db.workers_taken[self.id.0 as usize].store(false, Ordering::Release);
    }
}

/// What a successful commit returns: its timestamp, and the way to wait until it is durable.
/// A commit must not be reported to anyone as done before `wait` returns Ok.
#[must_use = "a commit is not durable until CommitTicket::wait returns"]
pub struct CommitTicket {
    pub(crate) ts: Ts,
    pub(crate) log: Option<Arc<TicketLog>>,
}

impl CommitTicket {
    /// The commit timestamp (for a read-only transaction: the newest timestamp it read).
    pub fn ts(&self) -> Ts {
        self.ts
    }

    /// Blocks until the commit is durable under the log's durability.
    pub fn wait(self) -> Result<Ts> {
        if let Some(log) = &self.log {
            log.0.wait_durable(self.ts)?;
        }
        Ok(self.ts)
    }

    pub fn is_durable(&self) -> Result<bool> {
        match &self.log {
            Some(log) => log.0.is_durable(self.ts),
            None => Ok(true),
        }
    }
}

impl std::fmt::Debug for CommitTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CommitTicket({})", self.ts)
    }
}

/// What `Database::recovery_install` refuses in a row of table `table` (named in the
/// error) before it looks at the table's records: a record id past the limit, a value
/// longer than any, a timestamp outside the engine's range. Public for a check of a
/// checkpoint that installs nothing (`ditto_log::checkpoint::check`).
pub fn check_recovered_row(
    table: &dyn std::fmt::Display,
    rid: RecordId,
    ts: Ts,
    value_len: Option<usize>,
) -> Result<()> {
    if rid.0 >= RECORDS_PER_TABLE_MAX {
        return Err(Error::Corrupt(format!("table {table} record {} is beyond the record id limit", rid.0)));
    }
    if let Some(len) = value_len {
        check_value_len(len)?;
    }
    // As replay checks (a timestamp past the mask would set the record's lock or
    // unlinked bit, and move the clock past its end; found by a review, 2026-12-05).
    crate::record::check_write_ts(ts, "recovered")
}

pub(crate) fn check_value_len(len: usize) -> Result<()> {
    if len > VALUE_LEN_MAX {
        return Err(Error::TooLarge { what: "value", len, max: VALUE_LEN_MAX });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delete list pushed out of timestamp order (replay's are, by record id) gives back
    /// exactly its entries at or below the horizon, and keeps the oldest of the rest.
    #[test]
    fn a_delete_list_takes_out_what_is_due_in_any_order() {
        let d = |ts: u64| (TableId(0), RecordId(ts), Ts(ts));
        let mut l = DeletedList::default();
        assert!(l.take_due(Ts(100)).is_empty());
        for ts in [30, 10, 50, 20, 40] {
            l.push(d(ts));
        }
        assert!(l.take_due(Ts(9)).is_empty(), "nothing at or below 9");
        let mut due: Vec<u64> = l.take_due(Ts(30)).into_iter().map(|e| e.2 .0).collect();
        due.sort_unstable();
        assert_eq!(due, [10, 20, 30]);
        assert_eq!(l.oldest, Some(Ts(40)));
        l.push(d(35));
        assert_eq!(l.take_due(Ts(35)).len(), 1);
        assert_eq!(l.take_due(Ts(100)).len(), 2);
        assert_eq!((l.oldest, l.list.len()), (None, 0));
    }

    /// A recovered write at timestamp 0 or past the timestamp mask is refused as damage,
    /// as replay refuses it, and changes nothing (it set the record's lock or unlinked
    /// bit before 2026-12-05; found by a review).
    #[test]
    fn a_recovered_write_outside_the_timestamps_is_refused() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let key = || Bytes::from_static(b"k");
        let limit = crate::record::TS_LIMIT;
        for ts in [0, limit + 1, TS_MASK, TS_MASK + 1, LOCK_BIT, u64::MAX] {
            let e = db.recovery_install(t, RecordId(0), Some(key), Ts(ts), Some(&b"v"[..])).unwrap_err();
            assert!(matches!(&e, Error::Corrupt(w) if w.contains("timestamp")), "ts {ts}: {e}");
        }
        db.recovery_install(t, RecordId(0), Some(key), Ts(limit), Some(&b"v"[..])).unwrap();
        assert_eq!(db.table(t).unwrap().record(RecordId(0)).tid.load(Ordering::Acquire), limit);
    }

    /// A clock at its limit takes no commit: refused with a clear error, where it aborted
    /// the process (the clock's overflow), and a read still answers.
    #[test]
    fn a_clock_at_its_limit_refuses_commits_and_does_not_abort() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        w.run(|x| x.put(t, b"k", b"v")).unwrap().1.wait().unwrap();
        db.clock().advance_to(Ts(crate::record::TS_LIMIT));
        for _ in 0..3 {
            let e = w.run(|x| x.put(t, b"k", b"w")).map(|_| ()).unwrap_err();
            assert!(matches!(&e, Error::Corrupt(m) if m.contains("the commit clock")), "{e}");
        }
        assert_eq!(w.run(|x| x.get(t, b"k")).unwrap().0.as_deref(), Some(&b"v"[..]));
    }

    /// A log that counts the transactions appended to it.
    #[derive(Default)]
    struct Counting(AtomicU64);

    impl CommitLog for Counting {
        fn check_writable(&self) -> Result<()> {
            Ok(())
        }
        fn append(&self, _w: WorkerId, _ts: Ts, _writes: &mut dyn ExactSizeIterator<Item = LoggedWrite<'_>>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wait_durable(&self, _ts: Ts) -> Result<()> {
            Ok(())
        }
        fn is_durable(&self, _ts: Ts) -> Result<bool> {
            Ok(true)
        }
        fn table_created(&self, _id: TableId, _name: &str) -> Result<()> {
            Ok(())
        }
    }

    /// A log that records the newest timestamp a ticket waited for.
    #[derive(Default)]
    struct Waited(AtomicU64);

    impl CommitLog for Waited {
        fn check_writable(&self) -> Result<()> {
            Ok(())
        }
        fn append(&self, _w: WorkerId, _ts: Ts, _writes: &mut dyn ExactSizeIterator<Item = LoggedWrite<'_>>) {}
        fn wait_durable(&self, ts: Ts) -> Result<()> {
            self.0.fetch_max(ts.0, Ordering::SeqCst);
            Ok(())
        }
        fn is_durable(&self, _ts: Ts) -> Result<bool> {
            Ok(false)
        }
        fn table_created(&self, _id: TableId, _name: &str) -> Result<()> {
            Ok(())
        }
    }

    /// A snapshot transaction's ticket waits for its snapshot to be durable, as a
    /// read-only transaction's waits for what it read (it waited for nothing before
    /// 2026-12-05).
    #[test]
    fn a_snapshot_transactions_ticket_waits_for_its_snapshot() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let log = Arc::new(Waited::default());
        db.attach_log(log.clone());
        let mut w = db.worker(WorkerId(0)).unwrap();
        let (_, written) = w.run(|x| x.put(t, b"a", b"1")).unwrap();
        log.0.store(0, Ordering::SeqCst);
        let mut snap = w.begin_snapshot();
        assert_eq!(snap.get(t, b"a").unwrap().as_deref(), Some(&b"1"[..]));
        let ticket = snap.commit_async().unwrap();
        let at = ticket.ts();
        assert!(at >= written.ts());
        ticket.wait().unwrap();
        assert_eq!(log.0.load(Ordering::SeqCst), at.0, "the ticket did not wait for its snapshot");
    }

    /// A log detached and another attached while the engine and its worker live on (a
    /// switchover's old primary that follows in place and is later promoted in place): the
    /// worker's next commit goes to the new log, none to the old one; attaching a second log
    /// over one still attached is refused.
    #[test]
    fn a_worker_commits_to_the_log_attached_after_a_detach() {
        let db = Database::new(Options { workers: 1 });
        let t = db.create_table("t").unwrap();
        let (first, second) = (Arc::new(Counting::default()), Arc::new(Counting::default()));
        db.attach_log(first.clone());
        let mut w = db.worker(WorkerId(0)).unwrap();
        w.run(|x| x.put(t, b"a", b"1")).unwrap().1.wait().unwrap();
        assert_eq!(first.0.load(Ordering::SeqCst), 1);
        db.detach_log();
        assert!(!db.has_log());
        assert!(w.run(|x| x.put(t, b"c", b"3")).is_err(), "no commit without a log");
        db.attach_log(second.clone());
        w.run(|x| x.put(t, b"b", b"2")).unwrap().1.wait().unwrap();
        assert_eq!((first.0.load(Ordering::SeqCst), second.0.load(Ordering::SeqCst)), (1, 1));
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| db.attach_log(first.clone())));
        assert!(again.is_err(), "a second log over an attached one");
    }
}
