//! Live replay on a backup
//! =======================
//! A backup's database is the primary's, rebuilt from the shipped redo log while read-only
//! snapshots run on it (Query Fresh 3.2-3.4, Rolis 3.4). Replay threads, one per primary
//! stream or more, call [`Database::replay_install`] for every logged write; snapshots read at
//! the *read view*, which the replication layer publishes with [`Database::publish_read_view`]
//! once every transaction at or below it is installed (and released by the primary).
//!
//! ```text
//!  replayer(stream 0) --install(ts=7)--+              ReadTxn at view 5 sees ts <= 5 only
//!  replayer(stream 1) --install(ts=6)--+--> record: head v9 -> v7 -> v6 -> v4 ...
//!  replication: all of ts <= 7 installed, primary released 7  -->  publish_read_view(7)
//! ```
//!
//! Invariants:
//! - Versions are installed by commit timestamp, not by arrival: a version newer than the
//!   head becomes the head, an older one slots into the chain at its place (streams are
//!   replayed in parallel, so the writes of one record arrive out of order across streams).
//!   Installing the same (record, ts) twice changes nothing.
//! - Every version above the read view is invisible to every snapshot (snapshots take
//!   `visible_ts`, which on a backup is the read view: no worker commits there), and the GC
//!   horizon never passes the read view, so versions above it are never trimmed.
//! - Updates and deletes touch only the record (the indirection array), never the index; a
//!   write carrying a key (insert, or a value over a tombstone) puts key -> rid in the index
//!   first, so a snapshot that finds the key before the version is visible reads "absent".
//! - An update or delete (a write without a key) follows a value. Replayed in parallel, it
//!   can come before the write that gave the value, which is on another stream: then it is
//!   *parked* and installed by that write, in timestamp order. The read view cannot pass
//!   a parked write (its insert's batch is not complete), and `publish_read_view` refuses
//!   to if one is still parked at or below it: the insert never came, the log is
//!   inconsistent.
//! - A record id is the primary's. When the primary gives a key a new record, or a record a
//!   new key (its ids are reused once a checkpoint covers the old life's tombstone,
//!   table.rs), the old life must be over for every snapshot before the index changes:
//!   replay waits until the GC horizon covers everything before the write (so the old
//!   life's last version, a tombstone, is installed and seen by every snapshot), then
//!   unlinks the old record as the primary's cleanup did. Where the log says where a
//!   reused id's old life ended (a batch's reuse bound), the wait is for the horizon to
//!   cover that (a record whose head does not fit it waits as before). The wait cannot deadlock: a
//!   replayer waits only for timestamps below the one it holds, and the smallest waiting
//!   timestamp's predecessors are all held by replayers that are not waiting.
//!
//! - A key's late old life: replayers may bind a key's later life (a new record, which the
//!   primary gave it after cleaning the old one up) before a lagging stream brings the old
//!   life; nothing says to wait, since the key is absent. The old life's writes then go
//!   below the later life, on its record (`Redirects`): the key is the same, so a snapshot
//!   at an older view finds them there by timestamp, and they move no key count (the old
//!   life's +1 and -1 cancel). It is placed below the next version above it there (the
//!   later life's start, or a life between that came late too). Writes to the old record
//!   below that bound follow (parked ones too), until the read view passes it, or until
//!   the record gets another key (its own next life); a backup does not take a
//!   checkpoint's snapshot meanwhile (`replay_checkpoint_gate`), since the cut would hold
//!   the old life's rows under the later record's id. (A redirect made after the snapshot
//!   moves only writes above it, which the snapshot does not read.)
//!
//! - A record id's late old life: the same with the lives of a record id. The primary
//!   gave a record id another key once a checkpoint covered its old life; a lagging stream
//!   brings the old life after the new key's life was installed on the record, every
//!   version of which lies above the late write. Two keys cannot share a chain, so the
//!   late life goes to a record of the backup's own (`BACKUP_OWN_RIDS`, one chunk past
//!   every id a primary hands out: never logged, checkpointed or reused), bound to its key
//!   in the index (or below its key's later life, where another record holds that), and
//!   the record's writes below the new life's start follow it there until the read view
//!   passes that start (a `Redirect`, as above: a checkpoint waits meanwhile). Its +1 and
//!   -1 move no key count. An engine that starts to commit (a promotion in place) unlinks
//!   such records (`Database::attach_log`), and a write that still finds its key on one
//!   is retried as a conflict. Not handled: a second earlier life of the same id arriving
//!   while the first is redirected (a clear replay error; docs/replication.md lists the
//!   other open cases).
//!
//! - A replayed delete that becomes a record's head is queued for cleanup as a worker's
//!   delete is: `Database::reclaim` unlinks the record (out of the index, its id given
//!   back) once every snapshot sees the tombstone. A later write that gives the id a key,
//!   the same or another, starts a new life on it.
//!
//! Not done here: deciding the read view (the replication crate does, as the minimum of the
//! primary's released watermark and the replayed prefix).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_epoch::Guard;
use parking_lot::Mutex;

use crate::db::{check_value_len, Database};
use crate::error::{Error, Result};
use crate::ids::{RecordId, TableId, Ts};
use crate::record::{OwnedVersion, Record, Version, LOCK_BIT, TS_MASK, UNLINKED_BIT};
use crate::table::{Table, RECORDS_PER_TABLE_MAX};

/// What a replayed write did to the number of keys with a value: `delta` is +1 (an
/// insert), -1 (a delete) or 0, plus what writes it woke did (see `replay_install`). Where
/// `delta` is not 0, `Database::with_delta_key` lends the key it counts (the caller counts
/// keys per database). (It carried a clone of the key until 2026-12-05: a clone, often an
/// allocation, and a drop per insert and delete, 5-7% of a backup's replay threads' time
/// in a TPC-C cluster run, whose tables no caller counts.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyDelta {
    pub delta: i64,
    /// The record whose key the delta counts.
    record: Option<(TableId, RecordId)>,
}

impl KeyDelta {
    fn of(table: TableId, rid: RecordId, delta: i64) -> KeyDelta {
        KeyDelta { delta, record: (delta != 0).then_some((table, rid)) }
    }

    const NONE: KeyDelta = KeyDelta { delta: 0, record: None };
}

/// Keyless writes (updates and deletes) that came before the write that gave their record
/// its value: the insert is on another stream, whose replayer is behind (see the module
/// notes). They wait here, per record, and are installed by that write.
#[derive(Default)]
pub(crate) struct Parked {
    /// Raised before a replayer looks at a record to decide whether to park (and lowered
    /// if it does not), so a keyed write that installs and then finds it zero knows that
    /// no replayer can still park on the old state (see `replay_install`).
    count: AtomicUsize,
    writes: Mutex<HashMap<(TableId, RecordId), Vec<ParkedWrite>>>,
}

/// Records a key's late old life is sent to (see the module notes): (table, the old
/// record) -> where its writes below `before` go.
#[derive(Default)]
pub(crate) struct Redirects {
    count: AtomicUsize,
    map: Mutex<HashMap<(TableId, RecordId), Redirect>>,
    /// Held (read) by a checkpoint cut, taken (write) to add a redirect.
    gate: parking_lot::RwLock<()>,
    /// Records whose new life waits in `bind_key` for its key's previous record to end,
    /// with the new life's timestamp: the record has its new key and no version, and its
    /// key is not bound to it yet, so a late write of the record's earlier life that comes
    /// meanwhile would otherwise take it for the record's next life (`later_life_start`).
    binding: Mutex<HashMap<(TableId, RecordId), Ts>>,
}

/// Takes a record's entry out of `Redirects::binding` when its bind ends, however it ends.
struct Binding<'a>(&'a Mutex<HashMap<(TableId, RecordId), Ts>>, (TableId, RecordId));

impl Drop for Binding<'_> {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

/// See [`Database::replay_checkpoint_gate`].
pub struct ReplayGate<'a>(#[allow(dead_code)] parking_lot::RwLockReadGuard<'a, ()>);

struct Redirect {
    to: RecordId,
    key: Bytes,
    /// Where the writes sent on begin: the oldest write of the late life seen with its key
    /// (the one that made the redirect, lowered by an older one). A write to `from` below
    /// it is of an earlier life of `from`, which stays on `from`.
    since: Ts,
    /// Where the writes sent on end: the next version above the late life on `to` when
    /// the redirect was made (lowered if `from` gets another key first).
    before: Ts,
}

/// A parked write: its timestamp and value (`None`: a delete).
type ParkedWrite = (Ts, Option<Bytes>);

/// A replayed value: copied into the version, or shared with the buffer it came in (Query
/// Fresh's log-as-database: the version points into the received batch, which it keeps
/// alive until the version is freed).
#[derive(Clone, Copy, Debug)]
enum Val<'a> {
    Copy(&'a [u8]),
    Share(&'a Bytes),
}

impl<'a> Val<'a> {
    fn bytes(self) -> &'a [u8] {
        match self {
            Val::Copy(b) => b,
            Val::Share(b) => b,
        }
    }

    fn version(value: Option<Val<'_>>) -> OwnedVersion {
        match value {
            Some(Val::Share(b)) => OwnedVersion::shared(b.clone()),
            v => OwnedVersion::new(v.map(|v| v.bytes())),
        }
    }

    fn owned(self) -> Bytes {
        match self {
            Val::Copy(b) => Bytes::copy_from_slice(b),
            Val::Share(b) => b.clone(),
        }
    }
}

/// See [`Database::replay_pin`].
pub struct ReplayPin(#[allow(dead_code)] Guard);

/// What [`Database::replay_prefetch`] starts loading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    Record,
    Head,
    /// The version below the newest, where the install's trim will load it
    /// (`Record::prefetch_below_head`), issued once the newest version is in cache.
    BelowHead,
}

/// How long replay waits for an old life to end for every snapshot before it reports the
/// log as inconsistent (a snapshot held this long blocks the reuse, see the module notes).
pub const REPLAY_REUSE_WAIT_MAX: Duration = Duration::from_secs(60);

impl Database {
    /// Installs one replayed write: `value` `None` is a delete; `key` is given when the
    /// write gives the record a value it did not have (the log's rule). Safe to call from
    /// several threads at once and while snapshots read. Returns how the number of keys
    /// with a value moved (+1 an insert, -1 a delete, 0 otherwise; a write that wakes
    /// parked ones adds theirs). See the module notes.
    pub fn replay_install(
        &self,
        table: TableId,
        rid: RecordId,
        key: Option<&[u8]>,
        ts: Ts,
        value: Option<&[u8]>,
    ) -> Result<KeyDelta> {
        self.replay_install_with(table, rid, key, ts, value, None, Ts::MAX, &mut |_| true)
    }

    /// `replay_install` with the value shared, not copied: the version points into `value`'s
    /// buffer (a received batch) and keeps it alive (Query Fresh's log-as-database).
    pub fn replay_install_shared(
        &self,
        table: TableId,
        rid: RecordId,
        key: Option<&[u8]>,
        ts: Ts,
        value: Option<&Bytes>,
    ) -> Result<KeyDelta> {
        self.replay_install_with(table, rid, key, ts, None, value, Ts::MAX, &mut |_| true)
    }

    /// `replay_install` (with the value shared when `shared` is given, as
    /// `replay_install_shared`), calling `on_wait(need)` while the write waits for every
    /// snapshot to reach `need`: a key's or record id's new life waits for the old one to
    /// be over for every snapshot (see the module notes), and that may be a wait for the
    /// caller's own progress. The caller installs in log order, so when called, every
    /// write of its stream below this one's timestamp is installed: it should make that
    /// visible (publish the read view it allows), or the wait may never end. If `on_wait`
    /// returns false the write stops waiting and fails with `Error::ReplayPutOff`: its
    /// value is not installed, and the caller may install it again later (as it may any
    /// write: an install of a (record, ts) already there changes nothing).
    ///
    /// `reuse_bound`: where a record id this write gives a new key had its old life end at
    /// or below, as the log says (`BatchHeader::reuse_ts`; `Ts::MAX` where it says
    /// nothing): the wait for that old life is then for every snapshot to reach the bound
    /// rather than everything before `ts`.
    #[allow(clippy::too_many_arguments)]
    pub fn replay_install_with(
        &self,
        table: TableId,
        rid: RecordId,
        key: Option<&[u8]>,
        ts: Ts,
        value: Option<&[u8]>,
        shared: Option<&Bytes>,
        reuse_bound: Ts,
        on_wait: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<KeyDelta> {
        let value = match shared {
            Some(b) => Some(Val::Share(b)),
            None => value.map(Val::Copy),
        };
        self.replay_install_val(table, rid, key, ts, value, reuse_bound, on_wait)
    }

    /// How long a replayed write giving a record or key a new life waits for a snapshot
    /// that holds the read horizon below it before it fails (`REPLAY_REUSE_WAIT_MAX` unless
    /// set; tests shorten it).
    pub fn replay_wait_max(&self) -> Duration {
        match self.replay_wait_max_ms.load(Ordering::Relaxed) {
            0 => REPLAY_REUSE_WAIT_MAX,
            ms => Duration::from_millis(ms),
        }
    }

    /// Sets `replay_wait_max` (at least 1 ms).
    pub fn set_replay_wait_max(&self, d: Duration) {
        self.replay_wait_max_ms.store((d.as_millis() as u64).max(1), Ordering::Relaxed);
    }

    /// A backup's own checkpoint reads this database at the snapshot `at` until the
    /// returned guard is dropped. A replayed write that gives a key or a record id a new
    /// life waits for every snapshot to pass the old life (`await_horizon`), and the
    /// checkpoint's snapshot, held for the whole paced write (30 s a GB at a backup's
    /// default pace), held it: reads stayed at the view below the write until the
    /// checkpoint ended, and past `replay_wait_max` the backup's replay failed for good
    /// (found by a review, 2026-12-07). Now such a wait does not count the checkpoint's
    /// time toward the limit (it ends by itself), and the checkpoint goes unpaced while a
    /// write waits for its snapshot (`horizon_waiters`, its pace's hurry).
    pub fn checkpoint_reading(&self, at: Ts) -> CheckpointReading<'_> {
        self.checkpoint_reading_at.store(at.0.max(1), Ordering::Release);
        CheckpointReading(self)
    }

    /// Replayed writes waiting now for every snapshot to pass an old life: a checkpoint
    /// being written goes unpaced while there are any (`checkpoint_reading`).
    pub fn horizon_waiters(&self) -> &std::sync::atomic::AtomicUsize {
        &self.horizon_waiters
    }

    /// Pins the engine's memory for a replayer's batch. Every install pins for itself;
    /// under a pin already held, that skips the pin's memory fence (measured: 7% of a
    /// serial TPC-C replay, docs/replication.md). Drop it between batches, so freed
    /// versions and index nodes are reclaimed.
    pub fn replay_pin(&self) -> ReplayPin {
        ReplayPin(crossbeam_epoch::pin())
    }

    /// Reserves the record ids of `table` below `limit` ahead of a batch's installs. Each
    /// install reserves its own id too; parallel replayers that do it per insert take turns
    /// writing the table's one counter (measured: 7% of parallel TPC-C replay), once per
    /// batch they rarely do. Ids at or beyond the limit, or an unknown table, are left to
    /// the installs, which refuse them.
    pub fn replay_reserve_rids(&self, table: TableId, limit: u64) {
        if let Ok(t) = self.table(table) {
            if limit <= RECORDS_PER_TABLE_MAX {
                t.reserve_rids(limit);
            }
        }
    }

    /// Lends `f` the key a replayed write's `d` counts (the key of the record its delta
    /// applied to); `None` where its delta is 0. Called right after the install, by the
    /// thread that made it, before its batch completes: the record keeps that key while the
    /// read view is below the install (a record's life ends for its id's reuse only once
    /// every snapshot sees its delete).
    pub fn with_delta_key<R>(&self, d: &KeyDelta, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let (table, rid) = d.record?;
        let rec = self.table(table).ok()?.record_if_allocated(rid)?;
        let guard = crossbeam_epoch::pin();
        rec.key.get(&guard).map(|k| f(k))
    }

    /// Starts loading what installing a write to `rid` will touch first, without waiting:
    /// `Prefetch::Record` the record's TID word and head pointer, `Prefetch::Head` (issued
    /// later, once the record is in cache) the newest version, which an update reads, and
    /// `Prefetch::BelowHead` (later still, once that version is in cache) the one below it
    /// where the install's trim will load it (`Record::prefetch_below_head`).
    /// A replayer issues these some writes ahead of the one it installs, so the cache
    /// misses of several writes overlap instead of following one another (measured: the
    /// two misses were most of a serial TPC-C replay's time, docs/replication.md). A hint:
    /// it changes nothing, allocates nothing and never fails; an unknown table or a record
    /// whose chunk is not allocated is skipped.
    #[inline]
    pub fn replay_prefetch(&self, table: TableId, rid: RecordId, what: Prefetch) {
        let Ok(t) = self.table(table) else { return };
        let Some(rec) = t.record_if_allocated(rid) else { return };
        match what {
            Prefetch::Record => {
                // The key too: an insert reads it first (it may sit on the next line).
                rec.prefetch();
                crate::prefetch(&rec.key);
            }
            Prefetch::Head => rec.prefetch_head(),
            Prefetch::BelowHead => {
                let guard = crossbeam_epoch::pin();
                rec.prefetch_below_head(self.clock.horizons(), &guard)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn replay_install_val(
        &self,
        table: TableId,
        rid: RecordId,
        key: Option<&[u8]>,
        ts: Ts,
        value: Option<Val<'_>>,
        reuse_bound: Ts,
        on_wait: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<KeyDelta> {
        let t = self.table(table)?;
        if rid.0 >= RECORDS_PER_TABLE_MAX {
            return Err(Error::Corrupt(format!("table {} record {} is beyond the record id limit", t.name, rid.0)));
        }
        self.mark_replaying();
        if let Some(v) = value {
            check_value_len(v.bytes().len())?;
        }
        crate::record::check_write_ts(ts, "replayed")?;
        t.reserve_rids(rid.0 + 1);
        // A late old life's write goes where its key's later life is (see the module notes).
        if let Some(to) = self.redirect_of(table, rid, key, ts) {
            return self.install_redirected(t, table, to, key.is_some(), ts, value);
        }
        let rec = t.record(rid);
        let Some(key) = key else {
            return self.install_keyless(t, table, rid, rec, ts, value, true);
        };
        // Bound, then installed; if the record left the index in between (the backup's own
        // cleanup unlinked its old life's tombstone), bind it again: that starts its life anew.
        let mut tries = 0;
        let mut delta = loop {
            if let Some((to, before)) = self.replay_bind_key(t, table, rid, rec, key, ts, reuse_bound, on_wait)? {
                self.add_redirect(t, table, rid, to, key, ts, before)?;
                return self.install_redirected(t, table, to, true, ts, value);
            }
            if let Some(d) = self.install_if(table, rid, rec, ts, value, false) {
                break d;
            }
            tries += 1;
            if tries > 1_000 {
                return Err(Error::Corrupt(format!(
                    "replayed write to table {} record {} at ts {} after its record left the index",
                    t.name, rid.0, ts.0
                )));
            }
            std::thread::yield_now();
        };
        delta += self.wake_parked(table, rid, rec);
        Ok(KeyDelta::of(table, rid, delta))
    }

    /// An update or delete: installed if the value it follows is there (or the record's
    /// lock says so); if not, the write that gave it is on a stream whose replayer is
    /// behind: parked, under the parked lock, after raising the count. With `redirectable`,
    /// a redirect added meanwhile (checked under the parked lock, which `add_redirect`'s
    /// drain takes after adding it) sends it on.
    #[allow(clippy::too_many_arguments)]
    fn install_keyless(
        &self,
        t: &Table,
        table: TableId,
        rid: RecordId,
        rec: &Record,
        ts: Ts,
        value: Option<Val<'_>>,
        redirectable: bool,
    ) -> Result<KeyDelta> {
        if let Some(delta) = self.install_if(table, rid, rec, ts, value, true) {
            return Ok(KeyDelta::of(table, rid, delta));
        }
        let mut parked = self.parked.writes.lock();
        self.parked.count.fetch_add(1, Ordering::SeqCst);
        if let Some(delta) = self.install_if(table, rid, rec, ts, value, true) {
            self.parked.count.fetch_sub(1, Ordering::SeqCst);
            return Ok(KeyDelta::of(table, rid, delta));
        }
        if redirectable {
            if let Some(to) = self.redirect_of(table, rid, None, ts) {
                self.parked.count.fetch_sub(1, Ordering::SeqCst);
                drop(parked);
                return self.install_redirected(t, table, to, false, ts, value);
            }
        }
        parked.entry((table, rid)).or_default().push((ts, value.map(|v| v.owned())));
        Ok(KeyDelta::NONE)
    }

    /// Installs the writes parked on `rid` that its newly installed value lets in, in
    /// timestamp order; returns how they moved the key count.
    fn wake_parked(&self, table: TableId, rid: RecordId, rec: &Record) -> i64 {
        // Installed (the record's lock released): a replayer that raised the count after
        // this load takes the record's lock after us and finds our value. One that raised
        // it before holds or held the parked lock, so we see what it parked.
        if self.parked.count.load(Ordering::SeqCst) == 0 {
            return 0;
        }
        let mut delta = 0;
        let mut parked = self.parked.writes.lock();
        if let Some(mut waiting) = parked.remove(&(table, rid)) {
            waiting.sort_by_key(|w| w.0);
            let mut still = Vec::new();
            for (wts, wv) in waiting {
                match self.install_if(table, rid, rec, wts, wv.as_ref().map(Val::Share), true) {
                    Some(d) => {
                        delta += d;
                        self.parked.count.fetch_sub(1, Ordering::SeqCst);
                    }
                    None => still.push((wts, wv)),
                }
            }
            if !still.is_empty() {
                parked.insert((table, rid), still);
            }
        }
        delta
    }

    /// A write of a key's late old life, installed on record `to`, which holds the key's
    /// later life: below that life, by timestamp, so it changes no key count. The writes
    /// of the old record parked before the redirect existed follow it there.
    fn install_redirected(
        &self,
        t: &Table,
        table: TableId,
        to: RecordId,
        keyed: bool,
        ts: Ts,
        value: Option<Val<'_>>,
    ) -> Result<KeyDelta> {
        let rec = t.record(to);
        if !keyed {
            self.install_keyless(t, table, to, rec, ts, value, false)?;
            return Ok(KeyDelta::NONE);
        }
        if self.install_if(table, to, rec, ts, value, false).is_none() {
            return Err(Error::Corrupt(format!(
                "table {}: record {} left the index with a later life of a key whose earlier life (ts {}) was not replayed",
                t.name, to.0, ts.0
            )));
        }
        self.drain_redirected(table, to);
        self.wake_parked(table, to, rec);
        Ok(KeyDelta::NONE)
    }

    /// Moves the writes parked on records redirected to `to`, from the redirect's start to
    /// below its bound, over to `to` (where `wake_parked` installs what it can); others
    /// stay (an earlier or a later life of the record).
    fn drain_redirected(&self, table: TableId, to: RecordId) {
        let from: Vec<(RecordId, Ts, Ts)> = {
            let m = self.redirects.map.lock();
            m.iter().filter(|(k, r)| k.0 == table && r.to == to).map(|(k, r)| (k.1, r.since, r.before)).collect()
        };
        let mut parked = self.parked.writes.lock();
        for (f, since, before) in from {
            let Some(w) = parked.remove(&(table, f)) else { continue };
            let (moved, stay): (Vec<_>, Vec<_>) = w.into_iter().partition(|p| since <= p.0 && p.0 < before);
            if !stay.is_empty() {
                parked.insert((table, f), stay);
            }
            if !moved.is_empty() {
                parked.entry((table, to)).or_default().extend(moved);
            }
        }
    }

    /// Writes to `from` below `before` (keyless, or giving it `key` again) go to `to`
    /// from now on (see the module notes).
    ///
    /// Refused where `from` is redirected already for another key (a second earlier life of
    /// a record id, come while the first is replayed elsewhere: not handled), checked
    /// under the map's lock so that two replayers cannot both pass.
    #[allow(clippy::too_many_arguments)]
    fn add_redirect(
        &self,
        t: &Table,
        table: TableId,
        from: RecordId,
        to: RecordId,
        key: &[u8],
        ts: Ts,
        before: Ts,
    ) -> Result<()> {
        // Not while a checkpoint cut is being written (`replay_checkpoint_gate`).
        let _gate = self.redirects.gate.write();
        let mut m = self.redirects.map.lock();
        self.prune_redirects(&mut m);
        if m.get(&(table, from)).is_some_and(|r| r.key.as_ref() != key) {
            return Err(second_late_life(t, from, ts));
        }
        m.insert((table, from), Redirect { to, key: Bytes::copy_from_slice(key), since: ts, before });
        self.redirects.count.store(m.len(), Ordering::SeqCst);
        Ok(())
    }

    /// Where a write to `rid` at `ts` goes instead, if it belongs to a late old life.
    fn redirect_of(&self, table: TableId, rid: RecordId, key: Option<&[u8]>, ts: Ts) -> Option<RecordId> {
        if self.redirects.count.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let mut m = self.redirects.map.lock();
        self.prune_redirects(&mut m);
        let r = m.get_mut(&(table, rid))?;
        match key {
            // Another key on the record: its next life (the primary reused its id), which
            // is the record's own, and the redirect ends there; or, below the late life,
            // an earlier life of the record, which stays on it.
            Some(k) if k != r.key.as_ref() => {
                if ts > r.since {
                    r.before = r.before.min(ts);
                }
                None
            }
            Some(_) if ts < r.before => {
                r.since = r.since.min(ts);
                Some(r.to)
            }
            Some(_) => None,
            None => (r.since <= ts && ts < r.before).then_some(r.to),
        }
    }

    /// Drops the redirects no write can use any more: once the read view reaches
    /// `before - 1`, every write below `before` is installed.
    fn prune_redirects(&self, m: &mut HashMap<(TableId, RecordId), Redirect>) {
        let view = self.clock.visible_ts();
        m.retain(|_, r| r.before.0 > view.0 + 1);
        self.redirects.count.store(m.len(), Ordering::SeqCst);
    }

    /// For a backup's checkpoint: `None` while a key's late old life is being replayed onto
    /// a later record (a cut would hold that old life's rows under the later record's id,
    /// where the primary had them under the old one); else a gate that keeps new redirects
    /// out until it is dropped, so that the snapshot taken under it has none either (it
    /// may be dropped once the snapshot is taken: `ditto_log::replica::checkpoint_replica`).
    pub fn replay_checkpoint_gate(&self) -> Option<ReplayGate<'_>> {
        let gate = self.redirects.gate.read();
        (!self.replay_redirecting()).then_some(ReplayGate(gate))
    }

    /// New lives waiting in `bind_key` for their key's previous record to end (a test
    /// waits for one to have registered).
    pub fn replay_binds_waiting(&self) -> usize {
        self.redirects.binding.lock().len()
    }

    /// Records of the backup's own taken so far (a record id's late old life: see the
    /// module notes), over all tables.
    pub fn replay_own_records(&self) -> u64 {
        self.tables.iter().filter_map(|t| t.get()).map(|t| t.backup_own_rids().count() as u64).sum()
    }

    /// Whether a key's late old life is being replayed onto a later record (see
    /// `replay_checkpoint_gate`).
    pub fn replay_redirecting(&self) -> bool {
        if self.redirects.count.load(Ordering::SeqCst) == 0 {
            return false;
        }
        let mut m = self.redirects.map.lock();
        self.prune_redirects(&mut m);
        !m.is_empty()
    }

    /// Takes the record's lock and installs; `None` (nothing done) if the record is
    /// unlinked (between lives) or, with `after_value`, if the version the write follows
    /// (the newest below `ts`) holds no value yet: a keyless write waits for its insert.
    fn install_if(
        &self,
        table: TableId,
        rid: RecordId,
        rec: &Record,
        ts: Ts,
        value: Option<Val<'_>>,
        after_value: bool,
    ) -> Option<i64> {
        let guard = crossbeam_epoch::pin();
        if !rec.lock() {
            return None;
        }
        // The read at ts - 1 is unregistered: right only because replayed writes lie above
        // the read view, and so above every horizon (a trim keeps every version above the
        // high one and the newest at or below it).
        debug_assert!(ts > self.clock.horizons().high, "a replayed write at or below the GC's high horizon");
        if after_value && rec.read_at(Ts(ts.0 - 1), &guard).is_none_or(|v| v.value().is_none()) {
            rec.unlock_unchanged();
            return None;
        }
        Some(self.install_holding_lock(table, rid, rec, ts, value, &guard))
    }

    /// Installs at `ts` (head, or slotted into the chain) and releases the lock. A
    /// tombstone that becomes the head is queued for cleanup, as a worker's delete is
    /// (`Database::reclaim` unlinks it once every snapshot sees it).
    fn install_holding_lock(
        &self,
        table: TableId,
        rid: RecordId,
        rec: &Record,
        ts: Ts,
        value: Option<Val<'_>>,
        guard: &Guard,
    ) -> i64 {
        let cur = rec.tid.load(Ordering::Relaxed) & TS_MASK;
        let had_value = rec.head_locked(guard).is_some_and(|v| v.value().is_some());
        if ts.0 > cur {
            // The GC horizon is at most the read view, which is below `ts`.
            let horizon = self.clock.horizons();
            if value.is_none() {
                // Under the record's lock, as a committer adds its deletes.
                self.deleted[rid.0 as usize % self.deleted.len()].lock().push((table, rid, ts));
            }
            rec.install_and_unlock(ts, Val::version(value), horizon, guard);
            return match (had_value, value.is_some()) {
                (false, true) => 1,
                (true, false) => -1,
                _ => 0,
            };
        }
        // Older than the head: slot it in at its place (or find it there already).
        // SAFETY: we hold the lock, so nobody else links or trims this chain; the versions
        // we walk are live (trims happen only under the lock).
        unsafe { insert_older(rec, ts, value) };
        rec.unlock_unchanged();
        0
    }

    /// Publishes the read view on a backup: every transaction at or below `ts` is installed
    /// and released, so snapshots taken from now on read at `ts`. Never moves backwards.
    ///
    /// Fails, publishing nothing, if a keyless write at or below `ts` is still parked: the
    /// write that should have given its record a value never came (an inconsistent log).
    pub fn publish_read_view(&self, ts: Ts) -> Result<()> {
        if self.parked.count.load(Ordering::SeqCst) > 0 {
            let parked = self.parked.writes.lock();
            for ((table, rid), w) in parked.iter() {
                if let Some((wts, _)) = w.iter().find(|w| w.0 <= ts) {
                    let (name, state) = match self.table(*table) {
                        Ok(t) => (t.name.clone(), t.record_if_allocated(*rid).map(describe_record).unwrap_or_default()),
                        Err(_) => (String::new(), String::new()),
                    };
                    return Err(Error::Corrupt(format!(
                        "replayed update of table {name} record {} at ts {}, which had no value to update (its insert was never received); the record: {state}",
                        rid.0, wts.0
                    )));
                }
            }
        }
        self.clock.advance_to(ts);
        self.clock.refresh_horizon();
        Ok(())
    }

    /// Makes `key` -> `rid` hold in the index, ending an old life first where the primary
    /// ended one (see the module notes).
    #[allow(clippy::too_many_arguments)]
    fn replay_bind_key(
        &self,
        t: &Table,
        table: TableId,
        rid: RecordId,
        rec: &Record,
        key: &[u8],
        ts: Ts,
        reuse_bound: Ts,
        on_wait: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<Option<(RecordId, Ts)>> {
        let mut tries = 0;
        loop {
            tries += 1;
            if tries > 1_000 {
                return Err(Error::Corrupt(format!(
                    "table {}: record {} at ts {}: its life kept changing under this write",
                    t.name, rid.0, ts.0
                )));
            }
            // Read once: what this turn decides on (another replayer may give the record
            // its next life meanwhile).
            let seen = rec.tid.load(Ordering::Acquire);
            // The record's own key: set on its first life, or a reused id with a new key.
            // (Compared under a pin of its own, let go before the arms below, which may
            // wait.)
            let (had_key, same) = {
                let guard = crossbeam_epoch::pin();
                match rec.key.get(&guard) {
                    None => (false, rec.key.get_or_init(|| Bytes::copy_from_slice(key), &guard).as_ref() == key),
                    Some(k) => (true, k.as_ref() == key),
                }
            };
            match (had_key, same) {
                // Keyless, and another replayer's key won: this write is of another life.
                (false, false) => continue,
                // Keyless, and it took this write's key.
                (false, true) => {}
                // The same key on a live record: the life goes on.
                (true, true) if seen & UNLINKED_BIT == 0 => {}
                (true, same) => {
                    // Another key, on a live record whose every version lies above this
                    // write: the record's life came first, and this write is of an earlier
                    // life of the id, on a stream that was behind (see the module notes).
                    if !same && seen & UNLINKED_BIT == 0 {
                        if let Some(start) = self.later_life_start(t, table, rid, rec, ts)? {
                            return self.late_life_of_id(t, table, rid, key, ts, start, on_wait).map(Some);
                        }
                    }
                    if seen & UNLINKED_BIT != 0 {
                        unlinked_and_let_go(t, rid)?;
                    } else if let Err(e) = self.end_old_life(t, rid, ts, None, reuse_bound, on_wait) {
                        // Given its next life by another replayer meanwhile (its TID moved:
                        // a value found where this life's end was expected): looked at again.
                        if matches!(e, Error::Corrupt(_)) && rec.tid.load(Ordering::Acquire) != seen {
                            std::thread::yield_now();
                            continue;
                        }
                        return Err(e);
                    }
                    let guard = crossbeam_epoch::pin();
                    // SAFETY: `end_old_life` unlinked the record, and every snapshot sees its
                    // tombstone; a snapshot still holding the rid reads no version at or
                    // below its view from the new life (which starts above the read view).
                    // Claimed, or another replayer gave it its new life first: looked at
                    // again.
                    if !unsafe { rec.reuse(key, &guard) } {
                        std::thread::yield_now();
                        continue;
                    }
                }
            }
            return self.bind_key(t, table, rid, key, ts, on_wait);
        }
    }

    /// Where the life that holds record `rid` now starts, if it started above `ts` and
    /// nothing on the record has a value at `ts` (a write at `ts` with another key is then
    /// of an earlier life of the id): the record's next version above `ts`. `None` if
    /// nothing lies above `ts` (the write starts the record's next life), if the record
    /// has a value at `ts` (two lives at once: `end_old_life` refuses it), or if it has no
    /// version and its key is not bound to it (that life went to a later record of its
    /// key). Versions of the key's own earlier lives, put below it from other records, may
    /// lie below `ts`. A record with no version whose new life waits to be bound
    /// (`Redirects::binding`) starts at that life's timestamp. Waits for a record bound by
    /// a replayer that has not installed yet.
    fn later_life_start(&self, t: &Table, table: TableId, rid: RecordId, rec: &Record, ts: Ts) -> Result<Option<Ts>> {
        let deadline = Instant::now() + REPLAY_REUSE_WAIT_MAX;
        loop {
            let guard = crossbeam_epoch::pin();
            match next_above(rec, ts, &guard) {
                Some(Some(next)) => {
                    let free_at_ts = rec.read_at(ts, &guard).is_none_or(|v| v.value().is_none());
                    return Ok(free_at_ts.then_some(next));
                }
                Some(None) => return Ok(None),
                None => {}
            }
            // No version: a new life waiting to be bound here (`Redirects::binding`)...
            if let Some(&start) = self.redirects.binding.lock().get(&(table, rid)) {
                return Ok((start > ts).then_some(start));
            }
            // ... or bound and not installed yet (looked at again), or gone to a later
            // record of its key.
            if rec.key.get(&guard).is_none_or(|k| t.index.get(k, &guard) != Some(rid.0)) {
                return Ok(None);
            }
            if Instant::now() > deadline {
                return Err(Error::Corrupt(format!(
                    "table {}: record {} has a key but never got a value",
                    t.name, rid.0
                )));
            }
            std::thread::yield_now();
        }
    }

    /// A record id's late old life: the primary reused `rid` (once a checkpoint covered
    /// this life's end) for the life that holds it here now, from `start`, and this
    /// write of the earlier life, with `key`, comes after it. Two keys cannot share a
    /// chain, so the earlier life goes to a record of the backup's own
    /// (`BACKUP_OWN_RIDS`), bound to its key in the index, or below its key's later life
    /// where another record holds that already (as for a key's late old life). Returns
    /// where the writes to `rid` below `start` (and below that later life) go.
    #[allow(clippy::too_many_arguments)]
    fn late_life_of_id(
        &self,
        t: &Table,
        table: TableId,
        rid: RecordId,
        key: &[u8],
        ts: Ts,
        start: Ts,
        on_wait: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<(RecordId, Ts)> {
        // (A redirect of `rid` for another key already: `add_redirect` refuses it; here
        // first, before a record is taken for nothing.)
        if self.redirects.count.load(Ordering::SeqCst) > 0 && self.redirects.map.lock().contains_key(&(table, rid)) {
            return Err(second_late_life(t, rid, ts));
        }
        // The key living again on another record already: below that life, with no record
        // of the backup's own taken (`bind_key` finds the same, racing a binder).
        {
            let guard = crossbeam_epoch::pin();
            if let Some(later) = t.index.get(key, &guard).map(RecordId) {
                let lrec = t.record(later);
                if lrec.tid.load(Ordering::Acquire) & UNLINKED_BIT == 0 {
                    // (Still the key's record once its version is read: not unlinked and
                    // given to another key meanwhile.)
                    if let (Some(Some(next)), true) =
                        (next_above(lrec, ts, &guard), t.index.get(key, &guard) == Some(later.0))
                    {
                        return Ok((later, next.min(start)));
                    }
                }
            }
        }
        let own = t.backup_own_rid().ok_or_else(|| {
            Error::Corrupt(format!(
                "table {}: no record of the backup's own left for a record id's late old life",
                t.name
            ))
        })?;
        t.record(own).key.init(|| Bytes::copy_from_slice(key));
        Ok(match self.bind_key(t, table, own, key, ts, on_wait)? {
            None => (own, start),
            Some((later, next)) => (later, next.min(start)),
        })
    }

    /// Binds `key` to `rid` in the index (whose record has the key), ending a life of the
    /// key on another record first where the primary ended it; or, where the key's later
    /// life holds it already, that record and the next version there above `ts`.
    fn bind_key(
        &self,
        t: &Table,
        table: TableId,
        rid: RecordId,
        key: &[u8],
        ts: Ts,
        on_wait: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<Option<(RecordId, Ts)>> {
        let guard = crossbeam_epoch::pin();
        // Set at the first look again, not on entry: a clock read per insert was 1.7% of a
        // backup's replay threads' time in a TPC-C cluster run (docs/results.md,
        // 2026-12-05), and nearly every insert binds its key at the first try.
        let mut deadline: Option<Instant> = None;
        let mut binding: Option<Binding<'_>> = None;
        loop {
            let (other, inserted) = t.index.get_or_insert_with(key, || rid.0, &guard);
            if inserted || other == rid.0 {
                return Ok(None);
            }
            let orec = t.record(RecordId(other));
            if orec.tid.load(Ordering::Acquire) & UNLINKED_BIT == 0 {
                match next_above(orec, ts, &guard) {
                    // The key's later life, bound before this earlier one came (its
                    // stream's replayer was behind): this life goes below that one, up to
                    // the next version there (a later life's start, or a life between
                    // that came late too and went below it already). Unless the record
                    // left the key meanwhile (the backup's cleanup unlinked it and a
                    // replayer gave it to another key: its version is that key's): then
                    // looked at again.
                    Some(Some(next)) if t.index.get(key, &guard) == Some(other) => {
                        return Ok(Some((RecordId(other), next)))
                    }
                    Some(Some(_)) => continue,
                    Some(None) => {}
                    // Bound by a replayer that has not installed yet: look again.
                    None => {
                        let now = Instant::now();
                        if now > *deadline.get_or_insert(now + REPLAY_REUSE_WAIT_MAX) {
                            return Err(Error::Corrupt(format!(
                                "table {}: key held by record {other}, which never got a value",
                                t.name
                            )));
                        }
                        std::thread::yield_now();
                        continue;
                    }
                }
            }
            // The key lived in another record, which the primary unlinked before it gave
            // the key this one.
            // Told to a late write of this record's earlier life, while the wait lasts and
            // until the key is bound here.
            if binding.is_none() {
                self.redirects.binding.lock().insert((table, rid), ts);
                binding = Some(Binding(&self.redirects.binding, (table, rid)));
            }
            // (The time `end_old_life` waited does not count here: it has its own rule.)
            let waited = Instant::now();
            self.end_old_life(t, RecordId(other), ts, Some(key), Ts::MAX, on_wait)?;
            let until =
                *deadline.insert(deadline.map_or(Instant::now() + REPLAY_REUSE_WAIT_MAX, |d| d + waited.elapsed()));
            if Instant::now() > until {
                return Err(Error::Corrupt(format!(
                    "table {}: key held by record {other} would not leave the index",
                    t.name
                )));
            }
        }
    }

    /// Waits until every snapshot sees the end of record `rid`'s old life (everything
    /// before `ts`, or `ended_by` below), then unlinks the record, whose newest version
    /// must then be a tombstone (or nothing): its life ended before `ts` on the primary.
    ///
    /// With `key` (the caller binds that key, which the index gave to `rid`): a record that
    /// left the key meanwhile (unlinked, and given to another key by a replayer of a later
    /// write) is not this life's any more: `Ok`, and the caller looks at the index again.
    ///
    /// `ended_by`: where the caller knows the old life ended at or below (a batch's reuse
    /// bound, `BatchHeader::reuse_ts`; `Ts::MAX` if nothing is known). The wait is then for
    /// every snapshot to reach that, not everything before `ts`: replayers of other
    /// streams go on meanwhile (measured: parallel TPC-C replay behind a checkpointing
    /// primary spent most of its time here, docs/replication.md). A record the bound does
    /// not fit (its head a value, or a tombstone above what every snapshot sees) is waited
    /// for as without it.
    fn end_old_life(
        &self,
        t: &Table,
        rid: RecordId,
        ts: Ts,
        key: Option<&[u8]>,
        ended_by: Ts,
        on_wait: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<()> {
        let all_before = Ts(ts.0 - 1);
        let mut need = all_before.min(ended_by);
        loop {
            // Unlinked already (the backup's own cleanup): every snapshot saw its tombstone.
            if t.record(rid).tid.load(Ordering::Acquire) & UNLINKED_BIT != 0 {
                return unlinked_and_let_go(t, rid);
            }
            self.await_horizon(t, rid, ts, need, on_wait)?;
            if need < all_before {
                // A tombstone at or below the bound (a record with no version yet is a
                // binder's below `ts` that has not installed: not the old life's end).
                let guard = crossbeam_epoch::pin();
                let (tid, head) = t.record(rid).read_latest(&guard);
                let fits =
                    tid & UNLINKED_BIT != 0 || (head.is_some_and(|v| v.value().is_none()) && tid & TS_MASK <= need.0);
                drop(guard);
                if !fits {
                    need = all_before;
                    continue;
                }
            }
            return self.unlink_old_life(t, rid, ts, key);
        }
    }

    /// `end_old_life`'s wait: until every snapshot sees everything at or below `need`
    /// (below `ts`, the write that waits).
    fn await_horizon(
        &self,
        t: &Table,
        rid: RecordId,
        ts: Ts,
        need: Ts,
        on_wait: &mut dyn FnMut(Ts) -> bool,
    ) -> Result<()> {
        // Only time with the read view published past the need counts toward the limit
        // (a snapshot holding the horizon below it that long). A view held below it is
        // the caller's to move (`on_wait`): on a standalone backup it waits for the
        // primary's release, which stalls for as long as a backup that `all` counts is
        // away; replay then failed for good after the limit, and the backup served stale
        // reads until it was restarted.
        // Nor time in which the backup's own checkpoint reads below the need: it ends by
        // itself, unpaced while this waits (`checkpoint_reading`).
        let limit = self.replay_wait_max();
        let mut deadline = Instant::now() + limit;
        let mut waiting = None;
        while self.clock.refresh_horizon() < need {
            if !on_wait(need) {
                return Err(Error::ReplayPutOff(ts.0));
            }
            if self.clock.refresh_horizon() >= need {
                break;
            }
            // The checkpoint is hurried only while it holds this wait (a wait for a client's
            // snapshot, or with no checkpoint under way, leaves its pace as it is).
            let checkpoint = self.checkpoint_reading_at.load(Ordering::Acquire);
            let checkpoint_holds = checkpoint != 0 && checkpoint < need.0;
            if !checkpoint_holds {
                waiting = None;
            } else if waiting.is_none() {
                waiting = Some(HorizonWaiter::new(&self.horizon_waiters));
            }
            if self.clock.now() < need || checkpoint_holds {
                deadline = Instant::now() + limit;
            } else if Instant::now() > deadline {
                return Err(Error::Corrupt(format!(
                    "table {}: record {} changes key at ts {}, but a snapshot held the read horizon below {} for {:?}",
                    t.name, rid.0, ts.0, need.0, limit
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// `end_old_life` once every snapshot sees the old life's end.
    fn unlink_old_life(&self, t: &Table, rid: RecordId, ts: Ts, key: Option<&[u8]>) -> Result<()> {
        let rec = t.record(rid);
        let guard = crossbeam_epoch::pin();
        let (tid, head) = rec.read_latest(&guard);
        if tid & UNLINKED_BIT != 0 {
            return Ok(());
        }
        let left_the_key = || key.is_some_and(|k| t.index.get(k, &guard) != Some(rid.0));
        if head.is_some_and(|v| v.value().is_some()) {
            if left_the_key() {
                return Ok(());
            }
            return Err(Error::Corrupt(format!(
                "table {}: record {} still holds a value when the primary gave its key or id a new life at ts {}",
                t.name, rid.0, ts.0
            )));
        }
        let expect = tid & !LOCK_BIT;
        if !crate::txn::unlink_keyed_if(t, rid, expect, key, &guard) {
            // Raced with another replayer ending the same life; it is unlinked either way
            // (or it left the key meanwhile).
            let now = rec.tid.load(Ordering::Acquire);
            if now & UNLINKED_BIT == 0 {
                if left_the_key() {
                    return Ok(());
                }
                return Err(Error::Corrupt(format!("table {}: record {} could not be unlinked", t.name, rid.0)));
            }
            return unlinked_and_let_go(t, rid);
        }
        Ok(())
    }
}

/// Waits until whoever unlinked record `rid` (the backup's own cleanup, `txn::unlink_if`,
/// or another replayer) has let its lock go: it marks the record unlinked while it still
/// holds the lock, then takes the key out of the index. A reuse of the record under it
/// (which writes the TID word and the key) would be undone when it let go: the record
/// marked unlinked again under its new life, its key out of the index, every later
/// update parked as if its insert never came (found by a review hunting a failure of the
/// churn test in the dependency mode, once in CI).
fn unlinked_and_let_go(t: &Table, rid: RecordId) -> Result<()> {
    let tid = &t.record(rid).tid;
    let deadline = Instant::now() + REPLAY_REUSE_WAIT_MAX;
    let mut spins = 0u32;
    while tid.load(Ordering::Acquire) & LOCK_BIT != 0 {
        if Instant::now() > deadline {
            return Err(Error::Corrupt(format!(
                "table {}: record {} stayed locked while unlinked for {REPLAY_REUSE_WAIT_MAX:?}",
                t.name, rid.0
            )));
        }
        spins += 1;
        crate::record::backoff(spins);
    }
    Ok(())
}

/// The replay error for a second earlier life of record `rid` (another key, at `ts`) while
/// one is redirected (`add_redirect`): not handled.
fn second_late_life(t: &Table, rid: RecordId, ts: Ts) -> Error {
    Error::Corrupt(format!(
        "table {}: record {} at ts {}: a second earlier life of the record id came while another was replayed elsewhere (not handled)",
        t.name, rid.0, ts.0
    ))
}

/// What a replay error says of a record: its key, whether it is unlinked, and its newest
/// versions (timestamp, and `-` for a tombstone), so that a failure seen once can be read.
fn describe_record(rec: &Record) -> String {
    let guard = crossbeam_epoch::pin();
    let tid = rec.tid.load(Ordering::Acquire);
    let key =
        rec.key.get(&guard).map_or("none".to_string(), |k| String::from_utf8_lossy(&k[..k.len().min(64)]).into_owned());
    let mut versions = Vec::new();
    let mut p: *mut Version = rec.head.load(Ordering::Acquire);
    // SAFETY: as in `next_above`: versions reached under the pin stay valid.
    unsafe {
        while !p.is_null() && versions.len() < 8 {
            let v = &*p;
            versions.push(format!("{}{}", v.ts.0, if v.is_tombstone() { "-" } else { "" }));
            p = crate::record::older_of(p, Ordering::Acquire);
        }
    }
    drop(guard);
    format!(
        "key {key:?}, tid ts {}{}{}, versions newest first [{}]",
        tid & TS_MASK,
        if tid & UNLINKED_BIT != 0 { ", unlinked" } else { "" },
        if tid & LOCK_BIT != 0 { ", locked" } else { "" },
        versions.join(" ")
    )
}

/// The oldest version of `rec` above `ts`, if any (`Some(None)`: none); `None` if `rec`
/// has no version at all.
fn next_above(rec: &Record, ts: Ts, _guard: &Guard) -> Option<Option<Ts>> {
    let mut p: *mut Version = rec.head.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    let mut above = None;
    // SAFETY: versions are freed through the epoch, so those reached under `_guard` stay
    // valid; a trim meanwhile unlinks or cuts only versions at or below the read view, which
    // is below `ts` (a walk inside an unlinked piece goes on down to the version it leads to).
    unsafe {
        while !p.is_null() && (*p).ts > ts {
            above = Some((*p).ts);
            p = crate::record::older_of(p, Ordering::Acquire);
        }
    }
    Some(above)
}

/// Links a version at `ts` below the head, at its place by timestamp; nothing if a version
/// at `ts` is there already.
///
/// SAFETY: the caller holds the record's lock; `ts` is below the head's timestamp.
unsafe fn insert_older(rec: &Record, ts: Ts, value: Option<Val<'_>>) {
    let mut above: *mut Version = rec.head.load(Ordering::Acquire);
    debug_assert!(!above.is_null() && (*above).ts >= ts);
    if (*above).ts == ts {
        return;
    }
    loop {
        // (A link marked as leading to a kept tail, `record::TAIL`, keeps its mark: the new
        // version takes it over.)
        let link = (*above).older.load(Ordering::Acquire);
        let below = crate::record::unmarked(link);
        if below.is_null() || (*below).ts < ts {
            let mut v = Val::version(value);
            v.set_ts(ts);
            let p = v.into_raw();
            (*p).older.store(link, Ordering::Relaxed);
            // Release: a reader that follows the new link sees the version whole.
            (*above).older.store(p, Ordering::Release);
            return;
        }
        if (*below).ts == ts {
            return;
        }
        above = below;
    }
}

/// `Database::checkpoint_reading`'s guard: the checkpoint's snapshot is no longer read
/// once it is dropped.
pub struct CheckpointReading<'a>(&'a Database);

impl Drop for CheckpointReading<'_> {
    fn drop(&mut self) {
        self.0.checkpoint_reading_at.store(0, Ordering::Release);
    }
}

/// One replayed write counted in `Database::horizon_waiters` while it waits.
struct HorizonWaiter<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> HorizonWaiter<'a> {
    fn new(n: &'a std::sync::atomic::AtomicUsize) -> HorizonWaiter<'a> {
        n.fetch_add(1, Ordering::AcqRel);
        HorizonWaiter(n)
    }
}

impl Drop for HorizonWaiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Database, Options};

    /// A version slotted below W, whose link to the kept tail V is marked
    /// (`record::TAIL`), takes the mark over: W now leads to it, it to V; reads at every
    /// point see their version, and the next trim frees it (no snapshot between W and V).
    /// (Replay never slots a write at or below the high horizon, whose W this is: it
    /// installs above the read view. `insert_older` keeps the mark all the same, and this
    /// holds it to that.)
    #[test]
    fn a_version_slotted_above_a_kept_tail_takes_its_mark_over() {
        use crate::clock::Horizons;
        use crate::record::{OwnedVersion, Record};
        let rec = Record::default();
        let guard = crossbeam_epoch::pin();
        let put = |ts: u64, h: Horizons| {
            assert!(rec.lock());
            rec.install_and_unlock(Ts(ts), OwnedVersion::new(Some(&ts.to_le_bytes())), h, &guard);
        };
        let at = |t: u64| rec.read_at(Ts(t), &guard).map(|v| v.ts().0);
        put(2, Horizons::at(Ts(1)));
        put(6, Horizons { low: Ts(2), high: Ts(2) });
        put(8, Horizons { low: Ts(2), high: Ts(6) });
        // W is 6, V is 2, the link between marked.
        let marked = |t: u64| rec.read_at(Ts(t), &guard).unwrap().older_marked();
        assert!(marked(6));
        assert!(rec.lock());
        // SAFETY: the record's lock is held; ts 4 is below the head's.
        unsafe { insert_older(&rec, Ts(4), Some(Val::Copy(b"four"))) };
        rec.unlock_unchanged();
        assert!(!marked(6) && marked(4), "the slotted version took the mark over");
        assert_eq!((at(2), at(3), at(4), at(5), at(6), at(8)), (Some(2), Some(2), Some(4), Some(4), Some(6), Some(8)));
        put(9, Horizons { low: Ts(2), high: Ts(6) });
        assert!(marked(6));
        assert_eq!((at(2), at(4), at(6)), (Some(2), Some(2), Some(6)), "4 went, 2 stays for the snapshot at 2");
        // SAFETY: nothing else can reach this record.
        unsafe { rec.free_versions_now() };
    }

    /// A backup's database with key `k` written at ts 1 on record 0 and deleted at ts 2,
    /// the read view at 2 (the record's tombstone seen by every snapshot).
    fn a_deleted_key() -> (std::sync::Arc<Database>, TableId, RecordId) {
        let db = Database::new(Options { workers: 2 });
        let t = db.create_table("t").unwrap();
        let rid = RecordId(0);
        db.replay_install(t, rid, Some(b"k"), Ts(1), Some(b"v1")).unwrap();
        db.replay_install(t, rid, None, Ts(2), None).unwrap();
        db.publish_read_view(Ts(2)).unwrap();
        (db, t, rid)
    }

    /// A record the backup's own cleanup is unlinking (marked unlinked, its lock still held,
    /// its key not yet out of the index) when a replayed write gives its key a new life on
    /// it: the write waits until the cleanup lets go, so the new life is neither marked
    /// unlinked nor taken out of the index by the cleanup's last steps.
    #[test]
    fn a_new_life_on_a_record_being_unlinked_waits_for_the_unlinker() {
        let (db, t, rid) = a_deleted_key();
        // The cleanup's first steps (`txn::unlink_if`): locked, then marked unlinked.
        let table = db.table(t).unwrap();
        let rec = table.record(rid);
        assert!(rec.lock());
        let cur = rec.tid.load(Ordering::Relaxed) & !LOCK_BIT;
        rec.tid.store(cur | UNLINKED_BIT | LOCK_BIT, Ordering::Release);
        std::thread::scope(|s| {
            let db = &db;
            let writer = s.spawn(move || db.replay_install(t, rid, Some(b"k"), Ts(3), Some(b"v3")));
            std::thread::sleep(Duration::from_millis(100));
            // Its last steps: the key out of the index, the lock let go.
            let guard = crossbeam_epoch::pin();
            table.index.remove_if(b"k", rid.0, &guard);
            rec.tid.store(cur | UNLINKED_BIT, Ordering::Release);
            writer.join().unwrap().unwrap();
        });
        db.publish_read_view(Ts(3)).unwrap();
        assert_eq!(rec.tid.load(Ordering::Acquire) & (UNLINKED_BIT | LOCK_BIT), 0, "the new life is live");
        assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), Some(&b"v3"[..]));
        db.replay_install(t, rid, None, Ts(4), Some(b"v4")).unwrap();
        db.publish_read_view(Ts(4)).unwrap();
        assert_eq!(db.read().get(t, b"k").unwrap().as_deref(), Some(&b"v4"[..]), "a later update finds its record");
    }

    /// A key's new life on another record waits for the read view to pass its old life's
    /// end for as long as the view is held below it (by the caller: on a standalone backup,
    /// the primary's release, which stalls while a backup that `all` counts is away), and
    /// fails after `replay_wait_max` only when a snapshot holds the horizon below a view
    /// already past it. (It failed after the limit whatever held it: the backup's replay
    /// stopped for good.)
    #[test]
    fn a_new_life_waits_out_a_held_view_and_fails_only_for_a_held_snapshot() {
        // The view at 1, below the delete at 2: held by the caller for 5 times the limit.
        let db2 = Database::new(Options { workers: 2 });
        let t2 = db2.create_table("t").unwrap();
        db2.set_replay_wait_max(Duration::from_millis(100));
        db2.replay_install(t2, RecordId(0), Some(b"k"), Ts(1), Some(b"v1")).unwrap();
        db2.replay_install(t2, RecordId(0), None, Ts(2), None).unwrap();
        db2.publish_read_view(Ts(1)).unwrap();
        let started = Instant::now();
        let mut waits = 0;
        let r = db2.replay_install_with(t2, RecordId(1), Some(b"k"), Ts(3), Some(b"v3"), None, Ts::MAX, &mut |_| {
            waits += 1;
            if started.elapsed() > Duration::from_millis(500) {
                db2.publish_read_view(Ts(2)).unwrap();
            }
            true
        });
        assert!(r.is_ok(), "a wait held by the view failed: {r:?}");
        assert!(started.elapsed() >= Duration::from_millis(500) && waits > 0);
        db2.publish_read_view(Ts(3)).unwrap();
        assert_eq!(db2.read().get(t2, b"k").unwrap().as_deref(), Some(&b"v3"[..]));
        // The view past the delete, a snapshot at 1 held: the limit applies.
        let db3 = Database::new(Options { workers: 2 });
        let t3 = db3.create_table("t").unwrap();
        db3.set_replay_wait_max(Duration::from_millis(100));
        db3.replay_install(t3, RecordId(0), Some(b"k"), Ts(1), Some(b"v1")).unwrap();
        db3.publish_read_view(Ts(1)).unwrap();
        let held = db3.read();
        db3.replay_install(t3, RecordId(0), None, Ts(2), None).unwrap();
        db3.publish_read_view(Ts(2)).unwrap();
        let r = db3.replay_install_with(t3, RecordId(1), Some(b"k"), Ts(3), Some(b"v3"), None, Ts::MAX, &mut |_| true);
        assert!(matches!(&r, Err(Error::Corrupt(e)) if e.contains("a snapshot held")), "{r:?}");
        drop(held);
    }

    /// A record id's new life under the log's reuse bound waits for every snapshot to
    /// reach the bound, not everything before the new life: a stream behind between the
    /// two does not hold it (measured: parallel TPC-C replay behind a checkpointing primary
    /// ran at a fifth of its speed, waiting here). A record the bound does not fit (its old
    /// life's end above it, or a value still on it) waits for everything before the write,
    /// as without a bound.
    #[test]
    fn a_reused_ids_new_life_waits_only_for_its_bound() {
        let db = Database::new(Options { workers: 2 });
        let t = db.create_table("t").unwrap();
        // Old lives: 0, 1 and 3 deleted (at 2, 5 and 2), 2 still live.
        for (rid, key, end) in [(0, &b"a"[..], Some(2)), (1, b"b", Some(5)), (2, b"c", None), (3, b"d", Some(2))] {
            db.replay_install(t, RecordId(rid), Some(key), Ts(1), Some(b"old")).unwrap();
            if let Some(end) = end {
                db.replay_install(t, RecordId(rid), None, Ts(end), None).unwrap();
            }
        }
        db.publish_read_view(Ts(2)).unwrap();
        let mut asked = Vec::new();
        let new_life = |rid: u64, bound: Ts, asked: &mut Vec<Ts>| {
            db.replay_install_with(
                t,
                RecordId(rid),
                Some(format!("new {rid}").as_bytes()),
                Ts(10),
                Some(b"n"),
                None,
                bound,
                &mut |need| {
                    asked.push(need);
                    if need < Ts(9) {
                        db.publish_read_view(need).unwrap();
                    }
                    need < Ts(9)
                },
            )
        };
        // Without a bound: everything before 10 (put off here, the view held at 2).
        let r = new_life(3, Ts::MAX, &mut asked);
        assert!(matches!(r, Err(Error::ReplayPutOff(10))), "{r:?}");
        assert_eq!(asked, [Ts(9)]);
        // The bound 2, where its end is: no wait.
        asked.clear();
        new_life(0, Ts(2), &mut asked).unwrap();
        assert!(asked.is_empty(), "{asked:?}");
        // The bound 4 below its end at 5: the bound first, then everything before 10.
        let r = new_life(1, Ts(4), &mut asked);
        assert!(matches!(r, Err(Error::ReplayPutOff(10))), "{r:?}");
        assert_eq!(asked, [Ts(4), Ts(9)]);
        // A value still on it: everything before 10.
        asked.clear();
        let r = new_life(2, Ts(4), &mut asked);
        assert!(matches!(r, Err(Error::ReplayPutOff(10))), "{r:?}");
        assert_eq!(asked, [Ts(9)]);
        db.publish_read_view(Ts(10)).unwrap();
        let r = db.read();
        assert_eq!(r.get(t, b"new 0").unwrap().as_deref(), Some(&b"n"[..]));
        assert_eq!(r.get(t, b"new 2").unwrap(), None);
        assert_eq!(r.get(t, b"a").unwrap(), None, "the old life's key is gone");
        assert_eq!(r.get(t, b"c").unwrap().as_deref(), Some(&b"old"[..]), "a put-off new life changed nothing");
    }

    /// A reader by record id (a backup's snapshot scan, another stream's replayer) that
    /// loaded a record's key under its pin reads that key whole while a replayer gives the
    /// unlinked record a new life with another key: the old key is freed through the epoch
    /// GC. (The key was a `OnceLock` written over in place: the reader's reference read the
    /// new key, or a torn or freed one.)
    #[test]
    fn a_key_held_under_a_pin_outlives_its_records_new_life_with_another_key() {
        let (db, t, rid) = a_deleted_key();
        let table = db.table(t).unwrap();
        let rec = table.record(rid);
        let reader = crossbeam_epoch::pin();
        let held = rec.key.get(&reader).expect("the record's key");
        assert_eq!(&held[..], b"k");
        {
            let guard = crossbeam_epoch::pin();
            assert!(crate::txn::unlink_if(table, rid, 2, &guard), "the cleanup unlinks it");
        }
        db.replay_install(t, rid, Some(b"another key"), Ts(3), Some(b"v3")).unwrap();
        // Other threads' pins come and go meanwhile; the reader's stays.
        for _ in 0..1000 {
            crossbeam_epoch::pin().flush();
        }
        assert_eq!(&rec.key.get(&crossbeam_epoch::pin()).unwrap()[..], b"another key", "the new life's key");
        assert_eq!(&held[..], b"k", "the key the reader loaded");
        drop(reader);
        db.publish_read_view(Ts(3)).unwrap();
        assert_eq!(db.read().get(t, b"another key").unwrap().as_deref(), Some(&b"v3"[..]));
    }

    /// A record unlinked by the cleanup, given its key's next lives by two replayers at
    /// once (two streams' writes to it): one claims it, the other finds it taken and goes
    /// on as a write of the live record. Before, both reused it: the second freed the
    /// first's new version (a later delete then parked for good) or both dropped the
    /// record's old key. Many rounds, the two writers let go together.
    #[test]
    fn two_replayers_giving_an_unlinked_record_new_lives_at_once_keep_both_versions() {
        for round in 0..300 {
            let (db, t, rid) = a_deleted_key();
            let table = db.table(t).unwrap();
            let guard = crossbeam_epoch::pin();
            assert!(crate::txn::unlink_if(table, rid, 2, &guard), "round {round}: the cleanup unlinks it");
            drop(guard);
            let go = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                let (db, go) = (&db, &go);
                let a = s.spawn(move || {
                    go.wait();
                    db.replay_install(t, rid, Some(b"k"), Ts(3), Some(b"v3"))
                });
                let b = s.spawn(move || {
                    go.wait();
                    db.replay_install(t, rid, Some(b"k"), Ts(5), Some(b"v5"))
                });
                a.join().unwrap().unwrap();
                b.join().unwrap().unwrap();
            });
            db.replay_install(t, rid, None, Ts(4), None).unwrap();
            for (view, want) in [(3, Some("v3")), (4, None), (5, Some("v5"))] {
                db.publish_read_view(Ts(view)).unwrap();
                let got = db.read().get(t, b"k").unwrap();
                assert_eq!(got.as_deref(), want.map(str::as_bytes), "round {round}, view {view}");
            }
        }
    }

    /// A key's new life on record r2 waits for the read view to end its old life on r1;
    /// meanwhile a later write gives r1 (unlinked by then) to another key. The waiting
    /// write finds r1 no longer its key's and binds the key to r2 (before, it found r1
    /// holding a value and replay failed: "still holds a value").
    #[test]
    fn a_key_whose_old_record_went_to_another_key_while_it_waited_binds_its_new_one() {
        let db = Database::new(Options { workers: 2 });
        let t = db.create_table("t").unwrap();
        let (r1, r2) = (RecordId(1), RecordId(2));
        db.replay_install(t, r1, Some(b"k"), Ts(1), Some(b"old-k")).unwrap();
        db.replay_install(t, r1, None, Ts(2), None).unwrap();
        db.publish_read_view(Ts(2)).unwrap();
        std::thread::scope(|s| {
            let db = &db;
            let waiting = s.spawn(move || db.replay_install(t, r2, Some(b"k"), Ts(10), Some(b"new-k")));
            std::thread::sleep(Duration::from_millis(100));
            // r1's id given to k2 at ts 4 (the primary reused it): its old life ends at 3.
            db.publish_read_view(Ts(3)).unwrap();
            db.replay_install(t, r1, Some(b"k2"), Ts(4), Some(b"k2")).unwrap();
            db.publish_read_view(Ts(9)).unwrap();
            waiting.join().unwrap().unwrap();
        });
        db.publish_read_view(Ts(10)).unwrap();
        let r = db.read();
        assert_eq!(r.get(t, b"k").unwrap().as_deref(), Some(&b"new-k"[..]));
        assert_eq!(r.get(t, b"k2").unwrap().as_deref(), Some(&b"k2"[..]));
    }
}
