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
//!   `UNLINKED`. An unlinked record is out of the index, and keeps only its tombstone (the
//!   versions under it are freed at the unlink). Its id comes back through the epoch GC
//!   and is reused once a durable checkpoint covers the tombstone (table.rs, `reuse`).
//! - Versions are freed only through crossbeam-epoch, so a reader pinned before the unlink
//!   of a version may still walk it.

use std::alloc::Layout;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use bytes::Bytes;
use crossbeam_epoch::Guard;

use crate::clock::Horizons;
use crate::ids::Ts;

pub(crate) const LOCK_BIT: u64 = 1 << 63;
pub(crate) const UNLINKED_BIT: u64 = 1 << 62;
pub(crate) const TS_MASK: u64 = UNLINKED_BIT - 1;
/// The highest timestamp a recovered or replayed write may carry, and past which the clock
/// takes no commit: 2^40 below the mask (a million commits a second for 12 days). A log
/// whose checksums hold and whose timestamps reach the clock's end (damage, or a writer
/// other than ditto) is refused as such, with room left for the commits after it; before
/// 2026-12-06 a timestamp at the mask was taken, and every commit after it aborted the
/// process on the clock's overflow, at every restart (found by a review).
pub(crate) const TS_LIMIT: u64 = TS_MASK - (1 << 40);

/// Refuses a `what` ("recovered", "replayed") write's timestamp outside 1..=`TS_LIMIT`
/// (one past the mask would set a record's lock or unlinked bit).
pub(crate) fn check_write_ts(ts: crate::Ts, what: &str) -> crate::Result<()> {
    if ts.0 == 0 || ts.0 > TS_LIMIT {
        return Err(crate::Error::Corrupt(format!("{what} write at timestamp {}, not within 1 to {TS_LIMIT}", ts.0)));
    }
    Ok(())
}

/// One version of a record: a header followed, in the same allocation, by the value bytes.
/// Keeping the value inline makes a write one allocation, not two (version node + value
/// buffer), and a read one dependent cache miss fewer. A backup may instead share a
/// replayed value with the batch it came in (`SHARED`: a `Bytes` follows the header).
///
/// A version is built unpublished (`OwnedVersion`, owned by a transaction's write set),
/// gets its timestamp at install, and is immutable once a record's `head` points to it.
/// Readers hold a `VersionRef`, a raw pointer with the allocation's whole provenance: a
/// `&Version` would cover only the header, not the bytes after it.
#[repr(C)]
pub(crate) struct Version {
    /// The commit timestamp (written before the version is published, never after).
    pub ts: Ts,
    /// The next older version, possibly marked as a kept tail (`TAIL`): read it through
    /// `older_of`, which takes the mark off.
    pub older: AtomicPtr<Version>,
    /// Length of the value, or `TOMBSTONE`.
    len: u32,
    /// Bytes allocated for the value (at least `len`).
    cap: u32,
}

const TOMBSTONE: u32 = u32::MAX;

/// A mark on an `older` link (its low bit: versions are aligned to 8): the version it leads
/// to is a kept tail, the newest at or below a low horizon a trim saw, with nothing older
/// left. Both callers of `trim` read their horizons under the record's lock, so the
/// horizons later trims of the record are given are at or above it; `trim` does not rely
/// on it (where a stale low horizon lies below V, stopping at the mark keeps V, which the
/// walk would have freed: more kept, never less). Set by `trim` on W's link to V; it lets
/// the next trims know V without loading it. V is old and seldom in the cache: under a
/// snapshot held for long (a checkpoint's, on a backup for the whole paced write, 10 s and
/// more), that load was a miss at nearly every install, 16% of a backup's replay threads'
/// time in a TPC-C cluster run (docs/results.md, 2026-12-04).
const TAIL: usize = 1;
const _: () = assert!(std::mem::align_of::<Version>() > TAIL, "a version's address has a free low bit");

/// Whether the link `p` (as loaded from an `older`) carries the `TAIL` mark.
#[inline(always)]
pub(crate) fn is_marked(p: *mut Version) -> bool {
    p.addr() & TAIL != 0
}

/// `p` without the `TAIL` mark.
#[inline(always)]
pub(crate) fn unmarked(p: *mut Version) -> *mut Version {
    p.map_addr(|a| a & !TAIL)
}

/// The version older than `v` (without the mark).
///
/// SAFETY: `v` is a live version.
#[inline(always)]
pub(crate) unsafe fn older_of(v: *mut Version, order: Ordering) -> *mut Version {
    unmarked((*v).older.load(order))
}

impl Version {
    /// Whether this version is a delete (no value).
    pub(crate) fn is_tombstone(&self) -> bool {
        self.len == TOMBSTONE
    }
}
/// `cap` of a version whose value is not inline but a `Bytes` stored after the header: a
/// slice of a buffer shared with others (a backup's received batch: Query Fresh's
/// log-as-database, crates/engine/src/replay.rs). The `Bytes` keeps the buffer alive until
/// the version is freed.
const SHARED: u32 = u32::MAX;
const HEADER: usize = std::mem::size_of::<Version>();
const _: () =
    assert!(HEADER.is_multiple_of(std::mem::align_of::<Bytes>()), "a shared value's Bytes follows the header");

impl Version {
    fn layout(cap: u32) -> Layout {
        let body = if cap == SHARED { std::mem::size_of::<Bytes>() } else { cap as usize };
        Layout::from_size_align(HEADER + body, std::mem::align_of::<Version>()).expect("version layout")
    }

    /// The value of the version at `p` (`None`: a tombstone).
    ///
    /// SAFETY: `p` is a live version that nobody changes for `'a`.
    #[inline]
    unsafe fn value_of<'a>(p: *const Version) -> Option<&'a [u8]> {
        let len = (*p).len;
        if len == TOMBSTONE {
            return None;
        }
        if (*p).cap == SHARED {
            // A live `Bytes` follows the header for as long as the version lives.
            let b = &*((p as *const u8).add(HEADER) as *const Bytes);
            return Some(std::slice::from_raw_parts(b.as_ptr(), b.len()));
        }
        // The allocation holds `cap >= len` initialized bytes after the header.
        Some(std::slice::from_raw_parts((p as *const u8).add(HEADER), len as usize))
    }

    /// Frees a version.
    ///
    /// SAFETY: `p` came from `OwnedVersion::into_raw` and nothing can reach it any more.
    pub unsafe fn free(p: *mut Version) {
        let cap = (*p).cap;
        if cap == SHARED {
            std::ptr::drop_in_place((p as *mut u8).add(HEADER) as *mut Bytes);
        }
        std::alloc::dealloc(p as *mut u8, Self::layout(cap));
    }
}

/// A value written as one but given in two parts, `.0` then `.1`: a caller that prefixes
/// its values (the server's type tag) need not build each value in a buffer of its own
/// before the version copies it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parts<'a>(pub &'a [u8], pub &'a [u8]);

impl<'a> Parts<'a> {
    /// A value given whole.
    pub fn whole(v: &'a [u8]) -> Parts<'a> {
        Parts(&[], v)
    }

    pub fn len(&self) -> usize {
        self.0.len() + self.1.len()
    }

    /// Copies the value to `dst`.
    ///
    /// # Safety
    /// `dst` is valid for `self.len()` bytes of writes and overlaps neither part.
    unsafe fn copy_to(&self, dst: *mut u8) {
        std::ptr::copy_nonoverlapping(self.0.as_ptr(), dst, self.0.len());
        std::ptr::copy_nonoverlapping(self.1.as_ptr(), dst.add(self.0.len()), self.1.len());
    }
}

/// An unpublished version, owned (freed on drop).
pub(crate) struct OwnedVersion(NonNull<Version>);

// SAFETY: it owns its allocation exclusively, like a Box.
unsafe impl Send for OwnedVersion {}

impl OwnedVersion {
    /// A version holding `value` (`None`: a tombstone), timestamp 0 until installed. The
    /// caller has checked the value against `VALUE_LEN_MAX`, far below `u32::MAX`.
    pub fn new(value: Option<&[u8]>) -> OwnedVersion {
        OwnedVersion::new_in_parts(value.map(Parts::whole))
    }

    /// `new` of a value given in two parts (see [`Parts`]).
    pub fn new_in_parts(value: Option<Parts<'_>>) -> OwnedVersion {
        let len = value.map_or(0, |v| v.len());
        let cap = u32::try_from(len).ok().filter(|&c| c != TOMBSTONE).expect("value length checked by the caller");
        let layout = Version::layout(cap);
        // SAFETY: the layout has a non-zero size (the header).
        let p = unsafe { std::alloc::alloc(layout) } as *mut Version;
        let Some(p) = NonNull::new(p) else { std::alloc::handle_alloc_error(layout) };
        // SAFETY: fresh allocation of the right layout; the header is written before any read.
        unsafe {
            p.as_ptr().write(Version {
                ts: Ts(0),
                older: AtomicPtr::new(std::ptr::null_mut()),
                len: if value.is_some() { cap } else { TOMBSTONE },
                cap,
            });
            if let Some(v) = value {
                v.copy_to((p.as_ptr() as *mut u8).add(HEADER));
            }
        }
        OwnedVersion(p)
    }

    /// A version whose value is `value` itself, shared, not copied (see `SHARED`).
    pub fn shared(value: Bytes) -> OwnedVersion {
        let len =
            u32::try_from(value.len()).ok().filter(|&c| c != TOMBSTONE).expect("value length checked by the caller");
        let layout = Version::layout(SHARED);
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) } as *mut Version;
        let Some(p) = NonNull::new(p) else { std::alloc::handle_alloc_error(layout) };
        // SAFETY: fresh allocation of the right layout: the header, then the `Bytes`
        // (aligned: checked above), both written before any read.
        unsafe {
            p.as_ptr().write(Version { ts: Ts(0), older: AtomicPtr::new(std::ptr::null_mut()), len, cap: SHARED });
            ((p.as_ptr() as *mut u8).add(HEADER) as *mut Bytes).write(value);
        }
        OwnedVersion(p)
    }

    /// Whether a value of `len` bytes fits in place (never in place of a shared one).
    fn fits(&self, len: usize) -> bool {
        // SAFETY: we own a live, initialized version.
        let cap = unsafe { (*self.0.as_ptr()).cap };
        cap != SHARED && len <= cap as usize
    }

    pub fn value(&self) -> Option<&[u8]> {
        // SAFETY: we own it; it cannot change while `self` is borrowed.
        unsafe { Version::value_of(self.0.as_ptr()) }
    }

    /// Replaces the value, in place when it fits.
    pub fn set(&mut self, value: Option<Parts<'_>>) {
        match value {
            Some(v) if self.fits(v.len()) => {
                // SAFETY: we own it exclusively and `v` fits the allocation.
                unsafe {
                    let p = self.0.as_ptr();
                    v.copy_to((p as *mut u8).add(HEADER));
                    (*p).len = v.len() as u32;
                }
            }
            // SAFETY: as above.
            None => unsafe { (*self.0.as_ptr()).len = TOMBSTONE },
            Some(_) => *self = OwnedVersion::new_in_parts(value),
        }
    }

    /// Stamps the commit timestamp (before publication).
    pub fn set_ts(&mut self, ts: Ts) {
        // SAFETY: we own it exclusively.
        unsafe { (*self.0.as_ptr()).ts = ts };
    }

    /// Gives up ownership (to a record's chain, freed through the epoch from then on).
    pub fn into_raw(self) -> *mut Version {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }
}

impl Drop for OwnedVersion {
    fn drop(&mut self) {
        // SAFETY: never published (or ownership was given up through `into_raw`).
        unsafe { Version::free(self.0.as_ptr()) }
    }
}

/// A published version, readable while the guard it was loaded under (`'g`) is pinned:
/// versions are freed only through the epoch GC, and never change once published.
#[derive(Clone, Copy)]
pub(crate) struct VersionRef<'g> {
    p: NonNull<Version>,
    _guard: PhantomData<&'g Guard>,
}

impl<'g> VersionRef<'g> {
    /// `p` must be null or a version loaded from a record (or chain) under a guard pinned
    /// for `'g`.
    #[inline]
    fn new(p: *mut Version) -> Option<VersionRef<'g>> {
        NonNull::new(p).map(|p| VersionRef { p, _guard: PhantomData })
    }

    /// Starts loading the version's header and first value bytes.
    #[inline(always)]
    pub fn prefetch(self) {
        crate::prefetch(self.p.as_ptr());
    }

    #[inline]
    pub fn ts(self) -> Ts {
        // SAFETY: see `new`: live and unchanging while 'g lasts.
        unsafe { (*self.p.as_ptr()).ts }
    }

    /// `None` is a tombstone.
    #[inline]
    pub fn value(self) -> Option<&'g [u8]> {
        // SAFETY: as in `ts`.
        unsafe { Version::value_of(self.p.as_ptr()) }
    }

    /// Whether this version's link to the next older one is marked (`TAIL`).
    #[cfg(test)]
    pub(crate) fn older_marked(self) -> bool {
        // SAFETY: as in `ts`.
        is_marked(unsafe { (*self.p.as_ptr()).older.load(Ordering::Acquire) })
    }

    #[inline]
    fn older(self) -> *mut Version {
        // SAFETY: as in `ts`.
        unsafe { older_of(self.p.as_ptr(), Ordering::Acquire) }
    }
}

#[derive(Default)]
pub(crate) struct Record {
    pub tid: AtomicU64,
    pub head: AtomicPtr<Version>,
    pub key: KeySlot,
}

/// A record's key: set when the record is first made, replaced only when its id is given
/// a new life with another key (`Record::reuse`). Readers load it under an epoch guard,
/// and a replaced key is freed through the epoch GC, so a reader that loaded the old one
/// (a backup's snapshot scan or another stream's replayer, which reach a record by its id
/// while a replayer gives it its next life) reads it whole until it unpins. (It was a
/// `OnceLock<Bytes>` written over in place: such a reader could read a torn or freed key.)
#[derive(Default)]
pub(crate) struct KeySlot(AtomicPtr<Bytes>);

impl KeySlot {
    /// The key, if it was set; valid while both the record and `guard` are.
    #[inline]
    pub fn get<'a>(&'a self, _guard: &'a Guard) -> Option<&'a Bytes> {
        // SAFETY: a pointer in the slot came from `Box::into_raw`; one replaced is freed
        // only once every guard pinned before the replacement is gone (`replace`).
        unsafe { self.0.load(Ordering::Acquire).as_ref() }
    }

    /// The key, without a guard.
    ///
    /// SAFETY: the record's key cannot be replaced while the result is used: the caller's
    /// transaction holds a pin and record ids are given new lives only after a grace
    /// period (a primary's), or the caller holds the record's lock, or has the table to
    /// itself.
    #[inline]
    pub unsafe fn get_unguarded(&self) -> Option<&Bytes> {
        self.0.load(Ordering::Acquire).as_ref()
    }

    /// Sets the key of a record that has none (`key` is called only then); a key set by
    /// another thread first stays. Needs no guard: nothing it read is handed out.
    pub fn init(&self, key: impl FnOnce() -> Bytes) {
        if !self.0.load(Ordering::Acquire).is_null() {
            return;
        }
        let fresh = Box::into_raw(Box::new(key()));
        if self.0.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // SAFETY: `fresh` was never shared.
            drop(unsafe { Box::from_raw(fresh) });
        }
    }

    /// `init`, then the key the slot holds (this one, or another thread's set first).
    pub fn get_or_init<'a>(&'a self, key: impl FnOnce() -> Bytes, guard: &'a Guard) -> &'a Bytes {
        self.init(key);
        self.get(guard).expect("a key was just set")
    }

    /// Puts `key` in place of the slot's key, which goes to the epoch GC.
    ///
    /// SAFETY: one writer at a time (the caller holds the record's lock).
    pub(crate) unsafe fn replace(&self, key: &[u8], guard: &Guard) {
        let old = self.0.swap(Box::into_raw(Box::new(Bytes::copy_from_slice(key))), Ordering::AcqRel);
        if !old.is_null() {
            let old = old as usize;
            // SAFETY: readers that may hold `old` are pinned; it is freed after them.
            guard.defer_unchecked(move || drop(Box::from_raw(old as *mut Bytes)));
        }
    }
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        let p = *self.0.get_mut();
        if !p.is_null() {
            // SAFETY: the slot's own box; nobody else can reach it any more.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl Record {
    /// Starts loading the TID word and the head pointer (which may sit on two lines).
    #[inline(always)]
    pub fn prefetch(&self) {
        crate::prefetch(&self.tid);
        crate::prefetch(&self.head);
    }

    /// Starts loading the newest version (for a snapshot read, which starts there).
    #[inline(always)]
    pub fn prefetch_head(&self) {
        crate::prefetch(self.head.load(Ordering::Relaxed));
    }

    /// Starts loading the version below the newest that installing a version above it
    /// will have `trim` load (`below_head_for_trim`). Under a snapshot held below the view
    /// (a backup's checkpoint holds one for seconds) that version, written one install
    /// earlier and cold since, was most of `trim`'s time in a backup's replay, and a
    /// replayer issues this a few writes ahead (docs/results.md, 2026-12-05). Reads the
    /// newest version's header, so call it once that is in cache (`prefetch_head` some
    /// writes earlier). A hint: it changes nothing.
    #[inline]
    pub fn prefetch_below_head(&self, h: Horizons, guard: &Guard) {
        if let Some(v) = self.below_head_for_trim(h, guard) {
            crate::prefetch(v.as_ptr().cast_const());
        }
    }

    /// The version below the newest (H) that `trim` loads when a version is installed
    /// above H under horizons `h`: H's older one where H is above `h.high` (the walk down
    /// to W goes on past it), or where H is W, above `h.low`, and its link is not marked
    /// (the walk down to V starts there). None where `trim` stops at H: H at or below
    /// `h.low` (it cuts below H without reading what it cuts), or H's link marked.
    pub(crate) fn below_head_for_trim(&self, h: Horizons, _guard: &Guard) -> Option<NonNull<Version>> {
        let head = self.head.load(Ordering::Acquire);
        if head.is_null() {
            return None;
        }
        // SAFETY: `head` was the record's head while `_guard` is pinned: the epoch GC frees
        // nothing it could reach before the guard goes.
        let (ts, link) = unsafe { ((*head).ts, (*head).older.load(Ordering::Relaxed)) };
        let loaded = ts > h.high || (ts > h.low && !is_marked(link));
        if loaded {
            NonNull::new(unmarked(link))
        } else {
            None
        }
    }

    /// Reads the newest version consistently against concurrent committers (Silo's stable
    /// read): TID, head, TID again; retried while a committer holds the lock or the TID
    /// moved. Lends the version, which is immutable once published and lives while `guard`
    /// is pinned.
    pub fn read_latest<'g>(&self, _guard: &'g Guard) -> (u64, Option<VersionRef<'g>>) {
        let mut spins = 0u32;
        loop {
            let t1 = self.tid.load(Ordering::Acquire);
            if t1 & LOCK_BIT != 0 {
                spins += 1;
                backoff(spins);
                continue;
            }
            let head = self.head.load(Ordering::Acquire);
            let t2 = self.tid.load(Ordering::Acquire);
            if t1 == t2 {
                return (t1, VersionRef::new(head));
            }
        }
    }

    /// The newest version, for the holder of the record's lock (nothing can change it).
    pub fn head_locked<'g>(&self, _guard: &'g Guard) -> Option<VersionRef<'g>> {
        debug_assert!(self.tid.load(Ordering::Relaxed) & LOCK_BIT != 0, "head_locked without the lock");
        VersionRef::new(self.head.load(Ordering::Acquire))
    }

    /// The newest version with `ts <= at`: what a snapshot at `at` sees. `None` if the
    /// record had no visible version then (the visible one may be a tombstone).
    pub fn read_at<'g>(&self, at: Ts, _guard: &'g Guard) -> Option<VersionRef<'g>> {
        let mut cur = VersionRef::new(self.head.load(Ordering::Acquire));
        while let Some(v) = cur {
            if v.ts() <= at {
                return Some(v);
            }
            cur = VersionRef::new(v.older());
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

    /// Installs `version` at `ts` as the new head (caller holds the lock) and trims versions
    /// no live snapshot can reach (`trim`). Releases the lock with the new TID.
    pub fn install_and_unlock(&self, ts: Ts, version: OwnedVersion, horizon: Horizons, guard: &Guard) {
        let cur = self.tid.load(Ordering::Relaxed);
        assert!(cur & LOCK_BIT != 0, "install without the record lock");
        assert!(ts.0 > cur & TS_MASK, "version timestamps must grow: {} after {}", ts.0, cur & TS_MASK);
        let mut version = version;
        version.set_ts(ts);
        let new = version.into_raw();
        // SAFETY: not published yet: ours alone.
        unsafe { (*new).older.store(self.head.load(Ordering::Relaxed), Ordering::Relaxed) };
        self.head.store(new, Ordering::Release);
        // SAFETY: we hold the lock, so nobody else trims this chain; `new` is live.
        unsafe { trim(new, horizon, guard, Walk::Amortized) };
        self.tid.store(ts.0, Ordering::Release);
    }

    /// Makes an unlinked record a new, absent record for `key`: its id is being reused
    /// (table.rs). The old versions go to the epoch GC; the TID word says locked while the
    /// key changes, so a late unlink of the record's former life (`unlink_if`) waits, then
    /// finds a TID it does not expect and leaves it (it reads the key only under the lock).
    ///
    /// SAFETY: the record is unlinked (out of the index) or absent after recovery. On a
    /// primary no transaction that could have reached it before then is still running (its
    /// id came back through the epoch GC); on a backup, snapshot scans and other streams'
    /// replayers may hold it. Readers by record id (those, and checkpoints) may still read
    /// its TID, versions and key, which stay valid until they unpin (the versions and the
    /// replaced key go to the epoch GC); a snapshot finds no version of the new life at or
    /// below its view (it starts above every read view), and the former life ended at or
    /// below every snapshot's horizon.
    ///
    /// Returns false, changing nothing, if the record is not unlinked and unlocked when
    /// it is claimed (a compare-and-swap of its TID word): replayers of two streams may
    /// both find one unlinked record to give a new life, and only one may (before, both
    /// did: the second freed the first's new version, or both dropped the old key). A
    /// record given the key it had keeps it; one given another key has it replaced
    /// through the epoch GC (`KeySlot`): a reader by record id still holding the old key
    /// (a backup's replayer of another stream, or its snapshot scan, which reach records
    /// whose ids come back without a grace period there) reads it whole.
    pub unsafe fn reuse(&self, key: &[u8], guard: &Guard) -> bool {
        let cur = self.tid.load(Ordering::Acquire);
        if cur & UNLINKED_BIT == 0
            || cur & LOCK_BIT != 0
            || self.tid.compare_exchange(cur, LOCK_BIT, Ordering::AcqRel, Ordering::Acquire).is_err()
        {
            return false;
        }
        free_chain(self.head.swap(std::ptr::null_mut(), Ordering::AcqRel), guard);
        if self.key.get(guard).is_none_or(|k| k.as_ref() != key) {
            self.key.replace(key, guard);
        }
        self.tid.store(0, Ordering::Release);
        true
    }

    /// Hands every version older than the newest one at or below `horizon` to the epoch GC.
    ///
    /// SAFETY: the caller holds the record's lock, and no snapshot below `horizon` exists
    /// or will be taken.
    pub unsafe fn trim_locked(&self, horizon: Ts, guard: &Guard) {
        debug_assert!(self.tid.load(Ordering::Relaxed) & LOCK_BIT != 0, "trim without the lock");
        trim(self.head.load(Ordering::Relaxed), Horizons::at(horizon), guard, Walk::Whole)
    }

    /// Overwrites the record's only version in place if the value fits its allocation.
    /// Returns false (changing nothing) if there is no version, more than one, or no room.
    ///
    /// SAFETY: as for `free_versions_now`: nothing else can reach the record's versions.
    pub unsafe fn overwrite_only_version(&self, ts: Ts, value: Option<&[u8]>) -> bool {
        let p = self.head.load(Ordering::Relaxed);
        if p.is_null() || !(*p).older.load(Ordering::Relaxed).is_null() {
            return false;
        }
        let mut v = OwnedVersion(NonNull::new_unchecked(p));
        let fits = value.is_none_or(|v2| v.fits(v2.len()));
        if fits {
            v.set(value.map(Parts::whole));
            v.set_ts(ts);
        }
        std::mem::forget(v); // still the record's
        fits
    }

    /// Frees the whole chain at once.
    ///
    /// SAFETY: nothing else can reach the record's versions (the table is being dropped, or
    /// recovery holds the record's lock before any reader exists).
    pub unsafe fn free_versions_now(&self) {
        let mut cur = self.head.swap(std::ptr::null_mut(), Ordering::Relaxed);
        while !cur.is_null() {
            let next = older_of(cur, Ordering::Relaxed);
            Version::free(cur);
            cur = next;
        }
    }
}

/// Frees what no live snapshot can reach, given that each is at `h.low` or at or above
/// `h.high` (clock.rs, "Two horizons"): the chain keeps every version above `h.high`, the
/// newest at or below it (W), and the newest at or below `h.low` (V); the versions between
/// W and V are unlinked as one piece (W's link now goes to V), and everything below V is
/// cut. With one horizon (`low == high`) W is V and only the cut happens.
///
/// So a snapshot held for long keeps one version per record (V) under the recent ones,
/// not every version written since it began, and the walk here stays short. W's link to
/// V is then marked (`TAIL`): while W stays the newest at or below `h.high` and above
/// `h.low`, the next trims end at W without loading V (a cache miss, nearly every
/// install under a long snapshot before 2026-12-04); a walk that meets the mark lower
/// down stops there too (V is at or below every later low horizon, with nothing older).
///
/// Readers walking the chain meanwhile are safe: an unlinked piece keeps its own links
/// (its last one still leads to V) until the epoch GC frees it, and no live snapshot stops
/// inside it.
///
/// With `Walk::Amortized` (an install's), a trim that has met `WALK_ABOVE` versions above
/// `h.high` goes on down only for one install in `WALK_ON_EVERY` (chosen by a hash of the
/// newest version's timestamp), and otherwise stops there, freeing nothing; one that goes
/// on decides again after `WALK_ON_EVERY` times as many, and so on (see `Walk`).
///
/// SAFETY: the caller holds the record lock and `head` is the record's live head.
pub(crate) unsafe fn trim(head: *mut Version, h: Horizons, guard: &Guard, walk: Walk) {
    debug_assert!(h.low <= h.high);
    let mut w = head;
    let (mut above, mut decide_at, mut tier) = (0usize, WALK_ABOVE, 0u32);
    while !w.is_null() && (*w).ts > h.high {
        above += 1;
        if above == decide_at && walk == Walk::Amortized {
            if !walks_on((*head).ts, tier) {
                #[cfg(test)]
                tests::skipped();
                return;
            }
            tier += 1;
            decide_at = decide_at.saturating_mul(WALK_ON_EVERY as usize);
        }
        w = older_of(w, Ordering::Acquire);
        #[cfg(test)]
        tests::loaded(w);
    }
    if w.is_null() {
        return;
    }
    if (*w).ts <= h.low {
        // W is V: everything below it goes (a kept tail too, now under W).
        let rest = (*w).older.swap(std::ptr::null_mut(), Ordering::AcqRel);
        free_chain(unmarked(rest), guard);
        return;
    }
    let link = (*w).older.load(Ordering::Acquire);
    if is_marked(link) {
        return; // W's link leads to the kept tail already: nothing between, nothing below.
    }
    let first = link;
    let mut v = first;
    // Down to the newest at or below `h.low`, or a link marked as leading to a kept tail
    // (at or below it, with nothing older).
    let mut tail_known = false;
    #[cfg(test)]
    tests::loaded(v);
    while !v.is_null() && (*v).ts > h.low {
        let next = (*v).older.load(Ordering::Acquire);
        v = unmarked(next);
        if is_marked(next) {
            tail_known = true;
            break;
        }
        #[cfg(test)]
        tests::loaded(v);
    }
    if v.is_null() {
        if !first.is_null() {
            (*w).older.store(std::ptr::null_mut(), Ordering::Release);
            free_piece(first, v, guard);
        }
        return;
    }
    if !tail_known {
        let rest = (*v).older.swap(std::ptr::null_mut(), Ordering::AcqRel);
        free_chain(unmarked(rest), guard);
    }
    // Release: a reader that follows the new link sees V whole (it always was).
    (*w).older.store(v.map_addr(|a| a | TAIL), Ordering::Release);
    if first != v {
        free_piece(first, v, guard);
    }
}

/// How far a trim walks (`trim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Walk {
    /// Down to what it frees, however many versions lie above the high horizon: the unlink
    /// of a deleted record (its last trim).
    Whole,
    /// An install's: where many versions lie above the high horizon, the walk down to the
    /// newest at or below it loads each of them, most of them cold, to free the few the
    /// horizon passed since the record's last trim. A record written faster than the
    /// horizon moves (a hot row under a replayer that runs ahead of the read view, the
    /// other streams' replayers behind it) paid that walk at every install: in a
    /// replay-only TPC-C run with two streams, ten versions per trim against two with one
    /// replayer, hundreds on the hot rows, and a third more replay CPU per transaction
    /// (docs/results.md, 2026-12-05). So such a trim goes on past `WALK_ABOVE` versions
    /// for one install in `WALK_ON_EVERY`, past `WALK_ABOVE * WALK_ON_EVERY` for one in
    /// `WALK_ON_EVERY` of those, and so on: with L versions above the horizon an install
    /// loads about `WALK_ABOVE` + 1 per tier of them (log L), and a skipped trim keeps
    /// what it would have freed for a later one, one to a few times L installs of the
    /// record later: a few times L versions more below the horizon while it lags
    /// (`a_horizon_that_lags_for_good_keeps_a_bounded_chain_at_every_tier`; a trim never
    /// frees what a snapshot reads: keeping longer is safe).
    Amortized,
}

/// Versions above the high horizon an amortized trim meets before it first decides
/// whether to go on.
const WALK_ABOVE: usize = 4;
/// One amortized trim in this many goes on at each decision; the next decision comes
/// after this many times as many versions.
const WALK_ON_EVERY: u64 = 8;

/// Whether the amortized trim of an install at `ts` goes on at its decision `tier` (one
/// in `WALK_ON_EVERY`): bits of a multiplicative hash of the timestamp, another group of
/// bits for each tier, so that a record written at any regular stride of timestamps is
/// still trimmed as often (a plain `ts % 8` would never trim a record whose writes all
/// land on one residue), and the tiers' choices are not the same one.
#[inline]
fn walks_on(ts: Ts, tier: u32) -> bool {
    const BITS: u32 = WALK_ON_EVERY.trailing_zeros();
    const _: () = assert!(WALK_ON_EVERY.is_power_of_two() && BITS > 0);
    // Past the hash's bits (a walk of 4 * 8^20 versions): go on.
    let Some(shift) = 64u32.checked_sub(BITS * (tier + 1)) else { return true };
    (ts.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) & (WALK_ON_EVERY - 1) == 0
}

/// Hands the versions from `first` down to (not including) `end` to the epoch GC: a piece
/// of a chain unlinked by `trim`, whose last link leads to `end`, which stays (and may be
/// freed on its own later: the deferred walk only compares it, never reads it).
///
/// SAFETY: as for `free_chain`, for the piece.
unsafe fn free_piece(first: *mut Version, end: *mut Version, guard: &Guard) {
    let (p, end) = (first as usize, end as usize);
    guard.defer_unchecked(move || {
        let mut cur = p as *mut Version;
        while !cur.is_null() && cur as usize != end {
            let next = older_of(cur, Ordering::Acquire);
            Version::free(cur);
            cur = next;
        }
    });
}

/// Hands a detached chain to the epoch GC, as one deferred walk: the versions are old and
/// most likely out of the cache, so the chain is walked once, when it is freed, rather than
/// also now to defer each version on its own (that walk was a cache miss per trimmed chain,
/// about half of `commit_async`'s own samples under TPC-C).
///
/// SAFETY: `chain` is unreachable from any record for readers pinned from now on, and the
/// chain is no one else's: only a trim detaches versions, and it reaches them only from a
/// record's live head.
pub(crate) unsafe fn free_chain(chain: *mut Version, guard: &Guard) {
    if chain.is_null() {
        return;
    }
    let p = chain as usize;
    guard.defer_unchecked(move || {
        let mut cur = p as *mut Version;
        while !cur.is_null() {
            let next = older_of(cur, Ordering::Acquire);
            Version::free(cur);
            cur = next;
        }
    });
}

pub(crate) fn backoff(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_keeps_its_value_inline_and_tells_empty_from_tombstone() {
        let whole = |v: &'static [u8]| Some(Parts::whole(v));
        let mut v = OwnedVersion::new(Some(b"hello"));
        assert_eq!(v.value(), Some(&b"hello"[..]));
        v.set(whole(b"hi")); // shorter: in place
        assert_eq!(v.value(), Some(&b"hi"[..]));
        v.set(whole(b"a longer value than before")); // longer: a new allocation
        assert_eq!(v.value(), Some(&b"a longer value than before"[..]));
        v.set(None);
        assert_eq!(v.value(), None);
        v.set(whole(b""));
        assert_eq!(v.value(), Some(&b""[..]));
        // A value given in two parts is stored as one, in place or not.
        v.set(Some(Parts(b"\x00", b"xyz")));
        assert_eq!(v.value(), Some(&b"\x00xyz"[..]));
        v.set(Some(Parts(b"head:", b"a tail longer than the allocation")));
        assert_eq!(v.value(), Some(&b"head:a tail longer than the allocation"[..]));
        assert_eq!(OwnedVersion::new_in_parts(Some(Parts(b"ab", b""))).value(), Some(&b"ab"[..]));
        assert_eq!(OwnedVersion::new(Some(b"")).value(), Some(&b""[..]));
        assert_eq!(OwnedVersion::new(None).value(), None);
    }

    #[test]
    fn install_trims_what_no_snapshot_can_reach_and_snapshots_read_their_version() {
        let rec = Record::default();
        let guard = crossbeam_epoch::pin();
        for (ts, val) in [(1u64, &b"one"[..]), (2, b"two"), (3, b"three")] {
            assert!(rec.lock());
            // Horizon 1: versions below the one at ts 1 may go, ts 1 itself must stay.
            rec.install_and_unlock(Ts(ts), OwnedVersion::new(Some(val)), Horizons::at(Ts(1)), &guard);
        }
        assert_eq!(rec.read_at(Ts(1), &guard).and_then(VersionRef::value), Some(&b"one"[..]));
        assert_eq!(rec.read_at(Ts(2), &guard).and_then(VersionRef::value), Some(&b"two"[..]));
        assert_eq!(rec.read_latest(&guard).1.and_then(VersionRef::value), Some(&b"three"[..]));
        assert!(rec.lock());
        rec.install_and_unlock(Ts(4), OwnedVersion::new(None), Horizons::at(Ts(3)), &guard);
        // ts 3 is the newest at or below the horizon: it stays, everything older is cut.
        assert_eq!(rec.read_at(Ts(3), &guard).and_then(VersionRef::value), Some(&b"three"[..]));
        assert!(rec.read_at(Ts(2), &guard).is_none(), "trimmed below the horizon");
        assert!(rec.read_latest(&guard).1.is_some_and(|v| v.value().is_none()), "tombstone on top");
        // SAFETY: nothing else can reach this record.
        unsafe { rec.free_versions_now() };
        assert!(rec.head.load(Ordering::Relaxed).is_null());
    }

    fn chain_len(rec: &Record) -> usize {
        let mut n = 0;
        let mut p = rec.head.load(Ordering::Acquire);
        while !p.is_null() {
            n += 1;
            // SAFETY: the test's versions are freed only through its guard's epoch.
            p = unsafe { older_of(p, Ordering::Acquire) };
        }
        n
    }

    #[test]
    fn under_a_held_snapshot_the_versions_between_the_horizons_go() {
        let rec = Record::default();
        let guard = crossbeam_epoch::pin();
        let val = |ts: u64| ts.to_le_bytes();
        // A snapshot held at ts 5; every other reader at or above the version before the new
        // one (high = ts - 1).
        for ts in 1..=1000u64 {
            assert!(rec.lock());
            let h = Horizons { low: Ts(5.min(ts - 1)), high: Ts(ts - 1) };
            rec.install_and_unlock(Ts(ts), OwnedVersion::new(Some(&val(ts))), h, &guard);
            assert!(chain_len(&rec) <= 3, "{} versions at ts {ts}", chain_len(&rec));
        }
        let at = |t: u64| rec.read_at(Ts(t), &guard).and_then(VersionRef::value).map(|v| v.to_vec());
        assert_eq!(at(5), Some(val(5).to_vec()), "the held snapshot reads its version");
        assert_eq!(at(999), Some(val(999).to_vec()));
        assert_eq!(at(1000), Some(val(1000).to_vec()));
        assert_eq!(at(4), None, "below the low horizon: cut");
        // One horizon (as before): every version above it stays.
        let one = Record::default();
        for ts in 1..=100u64 {
            assert!(one.lock());
            one.install_and_unlock(Ts(ts), OwnedVersion::new(Some(&val(ts))), Horizons::at(Ts(5.min(ts - 1))), &guard);
        }
        assert_eq!(chain_len(&one), 96);
        // The horizon moves past everything: one version is left.
        assert!(rec.lock());
        rec.install_and_unlock(Ts(1001), OwnedVersion::new(None), Horizons::at(Ts(1000)), &guard);
        assert_eq!(chain_len(&rec), 2);
        // SAFETY: nothing else can reach these records.
        unsafe {
            rec.free_versions_now();
            one.free_versions_now();
        }
    }

    /// Under a snapshot held for long, W's link to V is marked (`TAIL`) once trimmed, and
    /// stays so while W does; the mark moves down with a new W, and goes when the low
    /// horizon reaches W. (A version slotted between: replay.rs,
    /// `a_version_slotted_above_a_kept_tail_takes_its_mark_over`.)
    #[test]
    fn the_kept_tail_is_marked_and_the_mark_follows_the_chain() {
        let rec = Record::default();
        let guard = crossbeam_epoch::pin();
        let put = |ts: u64, low: u64, high: u64| {
            assert!(rec.lock());
            let h = Horizons { low: Ts(low), high: Ts(high) };
            rec.install_and_unlock(Ts(ts), OwnedVersion::new(Some(&ts.to_le_bytes())), h, &guard);
        };
        let at = |t: u64| rec.read_at(Ts(t), &guard).map(VersionRef::ts);
        for ts in 1..=3 {
            put(ts, 0, ts - 1);
        }
        // A snapshot at 3, the view at 5: W is 5, V is 3.
        put(4, 3, 3);
        put(5, 3, 4);
        put(6, 3, 5);
        let w = rec.read_at(Ts(5), &guard).unwrap();
        assert_eq!((at(3), at(5), at(6)), (Some(Ts(3)), Some(Ts(5)), Some(Ts(6))));
        assert!(w.older_marked(), "W's link to the kept tail is marked");
        assert_eq!(chain_len(&rec), 3);
        // The view stays: W's mark ends the next trims, the chain as it was plus the new.
        put(7, 3, 5);
        assert!(w.older_marked());
        assert_eq!(chain_len(&rec), 4);
        // The view moves on to 7: the new W (7) takes the mark, 5 and 6 go.
        put(8, 3, 7);
        let w7 = rec.read_at(Ts(7), &guard).unwrap();
        assert!(w7.older_marked());
        assert_eq!((chain_len(&rec), at(3), at(6)), (3, Some(Ts(3)), Some(Ts(3))));
        // The snapshot ends, the low horizon reaches W: the kept tail goes, and the mark.
        put(9, 7, 7);
        assert!(!w7.older_marked());
        assert_eq!((chain_len(&rec), at(6)), (3, None));
        // SAFETY: nothing else can reach this record.
        unsafe { rec.free_versions_now() };
    }

    /// Against a model: installs under horizons computed from snapshots that come and go
    /// (each new one at the view, as `Clock::register_reader` takes them), each trim given
    /// the horizons of its step or of up to three steps before (a replayer's are as old
    /// as its batch). Every live snapshot reads the newest version at or below it, and the
    /// chain holds at most the versions above the oldest high horizon in use, and two.
    #[test]
    fn trims_under_snapshots_that_come_and_go_keep_what_each_reads() {
        use rand::{Rng, SeedableRng};
        let mut prefetched = [0u32; 2];
        let mut skipped = 0u32;
        for seed in 0..40u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let rec = Record::default();
            let guard = crossbeam_epoch::pin();
            let mut model: Vec<u64> = Vec::new();
            let mut snaps: Vec<u64> = Vec::new();
            let mut past: Vec<Horizons> = Vec::new();
            let mut view = 0u64;
            for _ in 0..2000 {
                if rng.gen_bool(0.05) {
                    snaps.push(view);
                }
                if !snaps.is_empty() && rng.gen_bool(0.04) {
                    snaps.swap_remove(rng.gen_range(0..snaps.len()));
                }
                let low = snaps.iter().copied().chain([view]).min().unwrap();
                let high = snaps.iter().copied().filter(|&s| s > low).chain([view]).min().unwrap();
                past.push(Horizons { low: Ts(low), high: Ts(high) });
                let back = rng.gen_range(0..4usize).min(past.len() - 1);
                let h = past[past.len() - 1 - back];
                // The view trails the installs by up to three.
                let ts = model.last().map_or(1, |t| t + rng.gen_range(1..3));
                // What a replayer prefetches is what the trim loads below the old head.
                let below = rec.below_head_for_trim(h, &guard).map(|p| p.as_ptr());
                let old_head = rec.head.load(Ordering::Relaxed);
                let len_before = chain_len(&rec);
                let skips_before = SKIPS.with(|c| c.get());
                LOADED.with(|l| *l.borrow_mut() = Some(Vec::new()));
                assert!(rec.lock());
                rec.install_and_unlock(Ts(ts), OwnedVersion::new(Some(&ts.to_le_bytes())), h, &guard);
                let loaded = LOADED.with(|l| l.borrow_mut().take()).unwrap_or_default();
                let first_below = loaded.into_iter().find(|&p| p != old_head);
                assert_eq!(below, first_below, "seed {seed}: the version below the head at ts {ts} under {h:?}");
                prefetched[usize::from(below.is_some())] += 1;
                model.push(ts);
                if model.len() > 3 {
                    view = model[model.len() - 1 - rng.gen_range(0..3usize)].max(view);
                }
                for &s in snaps.iter().chain([&view]) {
                    let want = model.iter().rev().find(|&&t| t <= s).copied();
                    let got = rec.read_at(Ts(s), &guard).map(|v| v.ts().0);
                    assert_eq!(got, want, "seed {seed}: a snapshot at {s} after ts {ts} under {h:?}");
                }
                // Above the high horizon it was given, W and V; or, where the trim stopped
                // early (`Walk::Amortized`), what was there and the new version.
                let above = model.iter().filter(|&&t| t > h.high.0).count();
                if SKIPS.with(|c| c.get()) > skips_before {
                    skipped += 1;
                    assert!(above >= WALK_ABOVE, "seed {seed}: stopped early with {above} versions above {h:?}");
                    assert_eq!(
                        chain_len(&rec),
                        len_before + 1,
                        "seed {seed}: a trim that stopped early freed something"
                    );
                } else {
                    let bound = above + 2;
                    assert!(chain_len(&rec) <= bound, "seed {seed}: {} versions, at most {bound}", chain_len(&rec));
                }
            }
            // SAFETY: nothing else can reach this record.
            unsafe { rec.free_versions_now() };
        }
        // Both kinds of install came up: some where the trim loads a version below the old
        // head (two horizons), some where it loads none.
        assert!(prefetched.iter().all(|&n| n > 100), "installs with nothing / something to prefetch: {prefetched:?}");
        // And trims that stopped early, under a view that trails the installs.
        assert!(skipped > 100, "trims that stopped early: {skipped}");
    }

    /// A record written while its horizon stays behind (a replayer ahead of the read view):
    /// an install's trim loads a few versions, not every one above the horizon, and once
    /// the horizon moves on, a later install's trim frees what it passed.
    #[test]
    fn installs_under_a_horizon_left_behind_load_a_few_versions_and_trim_later() {
        let rec = Record::default();
        let guard = crossbeam_epoch::pin();
        let put = |ts: u64, h: u64| {
            LOADED.with(|l| *l.borrow_mut() = Some(Vec::new()));
            assert!(rec.lock());
            rec.install_and_unlock(Ts(ts), OwnedVersion::new(Some(&ts.to_le_bytes())), Horizons::at(Ts(h)), &guard);
            LOADED.with(|l| l.borrow_mut().take()).unwrap_or_default().len()
        };
        // Where a trim of an install at `ts` with `above` versions above the horizon stops
        // (the versions it met there), or None where it walks them all.
        let stops_at = |ts: u64, above: usize| {
            let (mut at, mut tier) = (WALK_ABOVE, 0);
            while at <= above {
                if !walks_on(Ts(ts), tier) {
                    return Some(at);
                }
                (at, tier) = (at * WALK_ON_EVERY as usize, tier + 1);
            }
            None
        };
        // 600 installs above a horizon at 1: nothing can go (each is above it but ts 1).
        let (mut whole, mut past_first) = (0, 0);
        for ts in 1..=600u64 {
            let loaded = put(ts, 1);
            let above = ts as usize - 1;
            match stops_at(ts, above) {
                // It met `at` versions, having loaded all but the first.
                Some(at) => {
                    assert_eq!(loaded, at - 1, "ts {ts}: stopped at {at} versions above");
                    past_first += usize::from(at > WALK_ABOVE);
                }
                None => {
                    assert_eq!(loaded, above, "ts {ts}: a walk that goes on loads down to the horizon");
                    whole += usize::from(above >= WALK_ABOVE);
                }
            }
        }
        assert_eq!(chain_len(&rec), 600);
        // Walks went on past the first decision and stopped at a later one, and a few went
        // all the way: the whole walk every install made before.
        assert!(past_first > 10 && (2..=40).contains(&whole), "{past_first} past the first decision, {whole} whole");
        // The horizon moves to 590: the first install whose trim goes all the way frees 1-589.
        let first = (601..).find(|&ts| stops_at(ts, (ts - 590) as usize).is_none()).unwrap();
        assert!(first < 601 + 512, "a trim goes all the way within 512 installs");
        for ts in 601..first {
            put(ts, 590);
            assert_eq!(chain_len(&rec), ts as usize, "ts {ts}: nothing freed yet");
        }
        put(first, 590);
        let above = (first - 590) as usize;
        assert_eq!(chain_len(&rec), above + 1, "the versions above 590 and the one at 590");
        // SAFETY: nothing else can reach this record.
        unsafe { rec.free_versions_now() };
    }

    /// A horizon that lags a record's installs by `lag` versions for good (a replayer that
    /// stays that far ahead of the read view): the versions a skipped trim keeps below the
    /// horizon stay within a few times `lag`, on average and at worst, past every tier of
    /// decisions (4, 32 and 256 versions above the horizon). Found by a review: a trim
    /// that never went on past the third tier left every other test passing while the
    /// chain grew without bound.
    #[test]
    fn a_horizon_that_lags_for_good_keeps_a_bounded_chain_at_every_tier() {
        let guard = crossbeam_epoch::pin();
        for lag in [4usize, 31, 32, 40, 255, 300] {
            let rec = Record::default();
            let n = 30 * lag as u64 + 4_000;
            let (mut most, mut sum) = (0usize, 0usize);
            for ts in 1..=n {
                assert!(rec.lock());
                let h = Ts(ts.saturating_sub(lag as u64).max(1));
                rec.install_and_unlock(Ts(ts), OwnedVersion::new(Some(&ts.to_le_bytes())), Horizons::at(h), &guard);
                // The versions above the horizon and the one at it are kept by any trim;
                // what lies below them is what skipped trims left.
                let kept = chain_len(&rec) - (ts - h.0 + 1) as usize;
                most = most.max(kept);
                sum += kept;
            }
            let mean = sum as f64 / n as f64;
            assert!(
                most <= 24 * lag && mean <= 4.0 * lag as f64,
                "lag {lag}: at most {most} versions kept below the horizon (mean {mean:.1})"
            );
            // SAFETY: nothing else can reach this record.
            unsafe { rec.free_versions_now() };
        }
    }

    /// `walks_on` picks about one timestamp in `WALK_ON_EVERY` at each tier whatever the
    /// stride between a record's writes (a `ts % 8` would pick all or none at a stride of
    /// 8), and the tiers pick independently (about one in 64 passes two).
    #[test]
    fn the_amortized_walk_goes_on_for_about_one_install_in_eight_at_any_stride() {
        for stride in [1u64, 2, 3, 4, 8, 16, 64, 1000, 1 << 20] {
            let n = 64_000u64;
            let ts = |i: u64| Ts(12_345 + i * stride);
            for tier in 0..3 {
                let on = (0..n).filter(|&i| walks_on(ts(i), tier)).count() as u64;
                let want = n / WALK_ON_EVERY;
                assert!(on > want / 2 && on < want * 3 / 2, "stride {stride}, tier {tier}: {on} of {n}, about {want}");
            }
            let both = (0..n).filter(|&i| walks_on(ts(i), 0) && walks_on(ts(i), 1)).count() as u64;
            let want = n / WALK_ON_EVERY / WALK_ON_EVERY;
            assert!(both > want / 2 && both < want * 3 / 2, "stride {stride}: {both} pass two tiers, about {want}");
        }
        assert!(walks_on(Ts(7), 21), "past the hash's bits, a walk goes on");
    }

    thread_local! {
        /// The versions `trim` loaded on this thread, in order, while a test records them
        /// (`Some`; other tests' trims record nothing).
        static LOADED: std::cell::RefCell<Option<Vec<*mut Version>>> = const { std::cell::RefCell::new(None) };
    }

    thread_local! {
        /// How many trims stopped early on this thread (`Walk::Amortized`).
        static SKIPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// A trim stopped early.
    pub(super) fn skipped() {
        SKIPS.with(|c| c.set(c.get() + 1));
    }

    /// `trim` loaded `p` (its timestamp, to compare with a horizon).
    pub(super) fn loaded(p: *mut Version) {
        if !p.is_null() {
            LOADED.with(|l| l.borrow_mut().as_mut().map(|v| v.push(p)));
        }
    }
}
