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
//! - A record id is the primary's. When the primary gives a key a new record, or a record a
//!   new key (its ids are reused once a checkpoint covers the old life's tombstone,
//!   table.rs), the old life must be over for every snapshot before the index changes:
//!   replay waits until the GC horizon covers everything before the write (so the old
//!   life's last version, a tombstone, is installed and seen by every snapshot), then
//!   unlinks the old record as the primary's cleanup did. The wait cannot deadlock: a
//!   replayer waits only for timestamps below the one it holds, and the smallest waiting
//!   timestamp's predecessors are all held by replayers that are not waiting.
//!
//! Not done here: deciding the read view (the replication crate does, as the minimum of the
//! primary's released watermark and the replayed prefix), nor cleaning up deleted records
//! the primary never reuses (they stay as tombstones until then; their memory is small).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::db::{check_value_len, Database};
use crate::error::{Error, Result};
use crate::ids::{RecordId, TableId, Ts};
use crate::record::{OwnedVersion, Record, Version, LOCK_BIT, TS_MASK, UNLINKED_BIT};
use crate::table::{Table, RECORDS_PER_TABLE_MAX};

/// What an installed write did to the record's newest state (for key counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayEffect {
    /// The record's newest version went from absent or a tombstone to a value: one more key.
    Created,
    /// The record's newest version went from a value to a tombstone: one key fewer.
    Deleted,
    /// Anything else: an update, a version older than the head, a duplicate.
    Unchanged,
}

/// How long replay waits for an old life to end for every snapshot before it reports the
/// log as inconsistent (a snapshot held this long blocks the reuse, see the module notes).
pub const REPLAY_REUSE_WAIT_MAX: Duration = Duration::from_secs(60);

impl Database {
    /// Installs one replayed write: `value` `None` is a delete; `key` is given when the
    /// write gives the record a value it did not have (the log's rule). Safe to call from
    /// several threads at once and while snapshots read. See the module notes.
    pub fn replay_install(
        &self,
        table: TableId,
        rid: RecordId,
        key: Option<&[u8]>,
        ts: Ts,
        value: Option<&[u8]>,
    ) -> Result<ReplayEffect> {
        let t = self.table(table)?;
        if rid.0 >= RECORDS_PER_TABLE_MAX {
            return Err(Error::Corrupt(format!("table {} record {} is beyond the record id limit", t.name, rid.0)));
        }
        if let Some(v) = value {
            check_value_len(v.len())?;
        }
        if ts.0 == 0 || ts.0 > TS_MASK {
            return Err(Error::Corrupt(format!("replayed write at timestamp {}", ts.0)));
        }
        t.reserve_rids(rid.0 + 1);
        let rec = t.record(rid);
        if let Some(key) = key {
            self.replay_bind_key(t, rid, rec, key, ts)?;
        } else if rec.key.get().is_none() {
            return Err(Error::Corrupt(format!(
                "replayed update of table {} record {} at ts {}, which has no key (its insert was never received)",
                t.name, rid.0, ts.0
            )));
        }
        let guard = crossbeam_epoch::pin();
        let mut spins = 0u32;
        while !rec.lock() {
            // Unlinked: only the reuse path in `replay_bind_key` makes it live again, and an
            // update without a key never targets an unlinked record on a consistent log.
            spins += 1;
            if spins > 1_000 {
                return Err(Error::Corrupt(format!(
                    "replayed write to table {} record {} at ts {} after its record left the index",
                    t.name, rid.0, ts.0
                )));
            }
            std::thread::yield_now();
        }
        let cur = rec.tid.load(Ordering::Relaxed) & TS_MASK;
        let had_value = rec.head_locked(&guard).is_some_and(|v| v.value().is_some());
        if ts.0 > cur {
            // The GC horizon is at most the read view, which is below `ts`.
            let horizon = self.clock.horizon();
            rec.install_and_unlock(ts, OwnedVersion::new(value), horizon, &guard);
            return Ok(match (had_value, value.is_some()) {
                (false, true) => ReplayEffect::Created,
                (true, false) => ReplayEffect::Deleted,
                _ => ReplayEffect::Unchanged,
            });
        }
        // Older than the head: slot it in at its place (or find it there already).
        // SAFETY: we hold the lock, so nobody else links or trims this chain; the versions
        // we walk are live (trims happen only under the lock).
        unsafe { insert_older(rec, ts, value) };
        rec.unlock_unchanged();
        Ok(ReplayEffect::Unchanged)
    }

    /// Publishes the read view on a backup: every transaction at or below `ts` is installed
    /// and released, so snapshots taken from now on read at `ts`. Never moves backwards.
    pub fn publish_read_view(&self, ts: Ts) {
        self.clock.advance_to(ts);
        self.clock.refresh_horizon();
    }

    /// Makes `key` -> `rid` hold in the index, ending an old life first where the primary
    /// ended one (see the module notes).
    fn replay_bind_key(&self, t: &Table, rid: RecordId, rec: &Record, key: &[u8], ts: Ts) -> Result<()> {
        // The record's own key: set on its first life, or a reused id with a new key.
        match rec.key.get() {
            None => {
                let _ = rec.key.get_or_init(|| Bytes::copy_from_slice(key));
            }
            Some(k) if k.as_ref() == key => {}
            Some(_) => {
                self.end_old_life(t, rid, ts)?;
                let guard = crossbeam_epoch::pin();
                // SAFETY: `end_old_life` unlinked the record, and every snapshot sees its
                // tombstone; a snapshot still holding the rid reads no version at or below
                // its view from the new life (which starts above the read view).
                unsafe { rec.reuse(Bytes::copy_from_slice(key), &guard) };
            }
        }
        let guard = crossbeam_epoch::pin();
        let deadline = Instant::now() + REPLAY_REUSE_WAIT_MAX;
        loop {
            let (other, inserted) = t.index.get_or_insert_with(key, || rid.0, &guard);
            if inserted || other == rid.0 {
                return Ok(());
            }
            // The key lived in another record, which the primary unlinked before it gave
            // the key this one.
            self.end_old_life(t, RecordId(other), ts)?;
            if Instant::now() > deadline {
                return Err(Error::Corrupt(format!(
                    "table {}: key held by record {other} would not leave the index",
                    t.name
                )));
            }
        }
    }

    /// Waits until every snapshot sees everything before `ts`, then unlinks record `rid`,
    /// whose newest version must then be a tombstone (or nothing): its life ended before
    /// `ts` on the primary.
    fn end_old_life(&self, t: &Table, rid: RecordId, ts: Ts) -> Result<()> {
        let deadline = Instant::now() + REPLAY_REUSE_WAIT_MAX;
        while self.clock.refresh_horizon().0 < ts.0 - 1 {
            if Instant::now() > deadline {
                return Err(Error::Corrupt(format!(
                    "table {}: record {} changes key at ts {}, but the read view stayed below it for {:?}",
                    t.name, rid.0, ts.0, REPLAY_REUSE_WAIT_MAX
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let rec = t.record(rid);
        let guard = crossbeam_epoch::pin();
        let (tid, head) = rec.read_latest(&guard);
        if tid & UNLINKED_BIT != 0 {
            return Ok(());
        }
        if head.is_some_and(|v| v.value().is_some()) {
            return Err(Error::Corrupt(format!(
                "table {}: record {} still holds a value when the primary gave its key or id a new life at ts {}",
                t.name, rid.0, ts.0
            )));
        }
        let expect = tid & !LOCK_BIT;
        if !crate::txn::unlink_if(t, rid, expect, &guard) {
            // Raced with another replayer ending the same life; it is unlinked either way.
            let now = rec.tid.load(Ordering::Acquire);
            if now & UNLINKED_BIT == 0 {
                return Err(Error::Corrupt(format!("table {}: record {} could not be unlinked", t.name, rid.0)));
            }
        }
        Ok(())
    }
}

/// Links a version at `ts` below the head, at its place by timestamp; nothing if a version
/// at `ts` is there already.
///
/// SAFETY: the caller holds the record's lock; `ts` is below the head's timestamp.
unsafe fn insert_older(rec: &Record, ts: Ts, value: Option<&[u8]>) {
    let mut above: *mut Version = rec.head.load(Ordering::Acquire);
    debug_assert!(!above.is_null() && (*above).ts >= ts);
    if (*above).ts == ts {
        return;
    }
    loop {
        let below = (*above).older.load(Ordering::Acquire);
        if below.is_null() || (*below).ts < ts {
            let mut v = OwnedVersion::new(value);
            v.set_ts(ts);
            let p = v.into_raw();
            (*p).older.store(below, Ordering::Relaxed);
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
