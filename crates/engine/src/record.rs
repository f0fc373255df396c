//! Records and versions
//! ====================
//! A record is one slot of a table's indirection array. It holds the key (set once), a TID
//! word, and the head of its version chain, newest first:
//!
//! ```text
//!  indirection[rid] = Record { tid: LOCK|UNLINKED|ts, key, head } --> v(ts=9) --> v(ts=5) --> v(ts=2)
//! ```
//!
//! Invariants:
//! - `tid & TS_MASK` is the commit timestamp of the head version (0: no version, "absent").
//! - Versions along a chain have strictly decreasing timestamps.
//! - Only the holder of the record's lock bit changes `head`, trims the chain, or sets
//!   `UNLINKED`. An unlinked record is out of the index forever; record ids are not reused.
//! - Versions are freed only through crossbeam-epoch, so a reader pinned before the unlink
//!   of a version may still walk it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use bytes::Bytes;
use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

use crate::ids::Ts;

pub(crate) const LOCK_BIT: u64 = 1 << 63;
pub(crate) const UNLINKED_BIT: u64 = 1 << 62;
pub(crate) const TS_MASK: u64 = UNLINKED_BIT - 1;

pub(crate) struct Version {
    pub ts: Ts,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
    pub older: Atomic<Version>,
}

#[derive(Default)]
pub(crate) struct Record {
    pub tid: AtomicU64,
    pub head: Atomic<Version>,
    pub key: OnceLock<Bytes>,
}

/// What a consistent read of the newest version saw.
pub(crate) struct Observed {
    /// The TID word (without the lock bit) at the time of the read.
    pub tid: u64,
    /// `None`: absent or deleted.
    pub value: Option<Bytes>,
}

impl Record {
    /// Reads the newest version consistently against concurrent committers (Silo's stable read):
    /// TID, head, TID again; retried while a committer holds the lock or the TID moved.
    pub fn read_latest(&self, guard: &Guard) -> Observed {
        let (tid, head) = self.read_latest_ref(guard);
        Observed { tid, value: head.and_then(|v| v.value.clone()) }
    }

    /// As `read_latest`, but lends the newest version instead of cloning its value: the
    /// version is immutable once published and lives while `guard` is pinned.
    pub fn read_latest_ref<'g>(&self, guard: &'g Guard) -> (u64, Option<&'g Version>) {
        let mut spins = 0u32;
        loop {
            let t1 = self.tid.load(Ordering::Acquire);
            if t1 & LOCK_BIT != 0 {
                spins += 1;
                backoff(spins);
                continue;
            }
            let head = self.head.load(Ordering::Acquire, guard);
            let t2 = self.tid.load(Ordering::Acquire);
            if t1 == t2 {
                // SAFETY: versions are only freed through the epoch GC and `guard` is pinned.
                return (t1, unsafe { head.as_ref() });
            }
        }
    }

    /// The newest version with `ts <= at`: what a snapshot at `at` sees. `None` if the
    /// record had no visible version then (or the visible one is a tombstone).
    pub fn read_at<'g>(&self, at: Ts, guard: &'g Guard) -> Option<&'g Version> {
        let mut cur = self.head.load(Ordering::Acquire, guard);
        // SAFETY: as above.
        while let Some(v) = unsafe { cur.as_ref() } {
            if v.ts <= at {
                return Some(v);
            }
            cur = v.older.load(Ordering::Acquire, guard);
        }
        None
    }

    /// Tries to take the lock bit. Fails (returns false) on an unlinked record.
    pub fn lock(&self) -> bool {
        let mut spins = 0u32;
        loop {
            let cur = self.tid.load(Ordering::Relaxed);
            if cur & UNLINKED_BIT != 0 {
                return false;
            }
            if cur & LOCK_BIT == 0
                && self.tid.compare_exchange_weak(cur, cur | LOCK_BIT, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return true;
            }
            spins += 1;
            backoff(spins);
        }
    }

    pub fn unlock_unchanged(&self) {
        let prev = self.tid.fetch_and(!LOCK_BIT, Ordering::Release);
        debug_assert!(prev & LOCK_BIT != 0, "unlock of a record that was not locked");
    }

    /// Installs `value` at `ts` as the new head (caller holds the lock) and trims versions no
    /// snapshot at or above `horizon` can reach. Releases the lock with the new TID.
    pub fn install_and_unlock(&self, ts: Ts, value: Option<Bytes>, horizon: Ts, guard: &Guard) {
        let cur = self.tid.load(Ordering::Relaxed);
        assert!(cur & LOCK_BIT != 0, "install without the record lock");
        assert!(ts.0 > cur & TS_MASK, "version timestamps must grow: {} after {}", ts.0, cur & TS_MASK);
        let old = self.head.load(Ordering::Relaxed, guard);
        let new = Owned::new(Version { ts, value, older: Atomic::null() });
        new.older.store(old, Ordering::Relaxed);
        let new = new.into_shared(guard);
        self.head.store(new, Ordering::Release);
        // SAFETY: we hold the lock, so nobody else trims this chain; `new` is live.
        unsafe { trim(new, horizon, guard) };
        self.tid.store(ts.0, Ordering::Release);
    }
}

/// Cuts the chain below the newest version with `ts <= horizon`: no snapshot at or above the
/// horizon can need anything older. The cut versions go to the epoch GC.
///
/// SAFETY: the caller holds the record lock and `head` is the record's live head.
pub(crate) unsafe fn trim<'g>(head: Shared<'g, Version>, horizon: Ts, guard: &'g Guard) {
    let mut cur = head;
    while let Some(v) = cur.as_ref() {
        if v.ts <= horizon {
            let rest = v.older.swap(Shared::null(), Ordering::AcqRel, guard);
            free_chain(rest, guard);
            return;
        }
        cur = v.older.load(Ordering::Acquire, guard);
    }
}

/// Hands a detached chain to the epoch GC.
///
/// SAFETY: `chain` is unreachable from any record for readers pinned from now on.
pub(crate) unsafe fn free_chain<'g>(mut chain: Shared<'g, Version>, guard: &'g Guard) {
    while !chain.is_null() {
        let next = chain.deref().older.load(Ordering::Acquire, guard);
        guard.defer_destroy(chain);
        chain = next;
    }
}

fn backoff(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}
