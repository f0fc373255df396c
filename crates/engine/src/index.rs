//! Ordered index: a B+tree with optimistic lock coupling
//! =====================================================
//! Maps key bytes to a record id (`u64`). It is the engine's only ordered structure; the
//! records themselves live in the indirection array (`table`).
//!
//! ```text
//!                    [ inner: k0 | k1 ]             version word per node:
//!                   /        |        \               even = unlocked, odd = write-locked,
//!      [leaf <k0]   [leaf k0..k1]   [leaf >=k1]      +2 on every change
//! ```
//!
//! Concurrency follows Leis et al., "The ART of Practical Synchronization" (DaMoN 2016),
//! and their `btreeolc`: readers take no locks and write no shared memory. A reader notes a
//! node's version, reads the node, and checks the version again; if it moved, the reader
//! restarts from the root. Writers lock only the nodes they change (the leaf, and its parent
//! for a split; for taking an emptied leaf out, the ancestors that leave with it and the one
//! that drops them). Full nodes are split on the way down, so a split never has to climb.
//! Every field a reader may see while a writer changes it is an atomic read and written
//! with `Relaxed` ordering, and versions use the seqlock pattern of `crossbeam`'s
//! `AtomicCell` (lock, `fence(Release)`, write, unlock with `Release`; read, `fence(Acquire)`,
//! re-check), so optimistic reads are data-race free in Rust's memory model. A reader never
//! trusts what it read before the version check: counts are clamped to the node capacity,
//! child pointers are checked for null.
//!
//! Keys: each slot stores the first 24 key bytes as three big-endian `u64` words (so most
//! comparisons are integer compares on data inside the node), the key length, and, for
//! keys longer than 24 bytes, a pointer to the rest (the "tail"). Order is plain
//! lexicographic byte order: compare the words, then the tails, then the lengths (see
//! [`SearchKey`]).
//!
//! Memory: a leaf whose last entry is deleted leaves the tree, and with it the inner nodes
//! above it that had no other child: the nearest ancestor with another child drops the
//! subtree and a neighbour takes over its empty key range. The nodes are marked obsolete,
//! so a reader that still reaches one restarts, and they are freed through
//! crossbeam-epoch. Tails are freed the same way when their key is removed. Every
//! operation runs under a pinned `Guard`. So keys that come and go in ascending order
//! leave nothing behind; only the root, and a chain of one-child nodes under it, stay
//! when the tree empties.
//!
//! Invariants (the tests in this file check their consequences, not the structure itself):
//! - keys in a node are strictly increasing; an inner node with `n` separators has `n + 1`
//!   children, and child `i` holds exactly the keys in `[sep[i-1], sep[i])`;
//! - a node's key range shrinks only when it splits (which changes its version); a leaf's
//!   range grows only over the range of an empty neighbour subtree that left the tree. So the fence key a
//!   walk carries to the next leaf never skips an entry that was present for the whole walk
//!   (what the phantom check's re-scan relies on).
//!
//! Not done: merging under-full nodes that are not empty (their slots are reused by later
//! inserts in the same key range), shrinking the tree's height, prefix compression.

use std::cmp::Ordering as Cmp;
use std::ops::Bound;
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crossbeam_epoch::Guard;

use crate::txn::Direction;

/// Slots per leaf.
const LEAF_CAP: usize = 32;
/// Separators per inner node (children: one more).
const INNER_CAP: usize = 32;
/// Key bytes stored inline in a slot, as `WORDS` big-endian words.
const INLINE: usize = 24;
/// Inner nodes of one child each that a removal takes out with the leaf below them
/// (`remove_subtree`); a tree of 32-way nodes is far shallower than this.
const CHAIN_MAX: usize = 16;
/// Lookups `get_many` interleaves at a time.
pub const GET_MANY_BATCH: usize = 16;
const WORDS: usize = INLINE / 8;
const _: () = assert!(WORDS == 3, "Keys::cmp compares three words");

// ---- version lock ---------------------------------------------------------------------

/// A node's version word: odd while write-locked, +2 for every completed change, and
/// `OBSOLETE` set for good once the node has left the tree.
struct VersionLock(AtomicU64);

const OBSOLETE: u64 = 1 << 63;

impl VersionLock {
    /// Waits out a writer and returns the (even) version; `None` if the node has left the
    /// tree (the caller restarts from the root).
    #[inline]
    fn read(&self) -> Option<u64> {
        let mut spins = 0u32;
        loop {
            let v = self.0.load(Ordering::Acquire);
            if v & OBSOLETE != 0 {
                return None;
            }
            if v & 1 == 0 {
                return Some(v);
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// True if nothing changed since `read` returned `v`.
    #[inline]
    fn check(&self, v: u64) -> bool {
        fence(Ordering::Acquire);
        self.0.load(Ordering::Relaxed) == v
    }

    /// Takes the write lock if the version is still `v`.
    #[inline]
    fn upgrade(&self, v: u64) -> bool {
        if self.0.compare_exchange(v, v + 1, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            fence(Ordering::Release);
            true
        } else {
            false
        }
    }

    /// Releases the lock after a change.
    #[inline]
    fn unlock(&self) {
        let prev = self.0.fetch_add(1, Ordering::Release);
        debug_assert!(prev & 1 == 1, "unlock of an unlocked node");
    }

    /// Releases the lock of a node that has just left the tree.
    #[inline]
    fn unlock_obsolete(&self) {
        let prev = self.0.load(Ordering::Relaxed);
        debug_assert!(prev & 1 == 1, "unlock of an unlocked node");
        self.0.store((prev + 1) | OBSOLETE, Ordering::Release);
    }

    /// Releases the lock after no change: readers that saw the old version stay valid.
    #[inline]
    fn unlock_unchanged(&self, v: u64) {
        debug_assert_eq!(self.0.load(Ordering::Relaxed), v + 1);
        self.0.store(v, Ordering::Release);
    }
}

/// Releases a lock taken at version `v`, unchanged, if dropped (a panic in between).
struct UnlockOnUnwind<'a>(&'a VersionLock, u64);

impl Drop for UnlockOnUnwind<'_> {
    fn drop(&mut self) {
        self.0.unlock_unchanged(self.1);
    }
}

// ---- keys -----------------------------------------------------------------------------

/// The bytes beyond the first `INLINE` of a long key, owned by exactly one slot.
type Tail = Box<[u8]>;

/// A key prepared for comparisons against slots.
struct SearchKey<'a> {
    words: [u64; WORDS],
    len: u32,
    tail: &'a [u8],
}

impl<'a> SearchKey<'a> {
    fn new(key: &'a [u8]) -> SearchKey<'a> {
        let mut b = [0u8; INLINE];
        let n = key.len().min(INLINE);
        b[..n].copy_from_slice(&key[..n]);
        SearchKey {
            words: std::array::from_fn(|w| u64::from_be_bytes(b[w * 8..w * 8 + 8].try_into().expect("8 bytes"))),
            len: u32::try_from(key.len()).expect("key length fits u32 (KEY_LEN_MAX)"),
            tail: key.get(INLINE..).unwrap_or(&[]),
        }
    }
}

/// Key slots of one node, structure-of-arrays so a search touches few cache lines: the
/// first words of all slots are together, then the second words, and so on. `repr(C)`: the
/// words come first, which `BATCH_SEARCH_LINES` relies on.
#[repr(C)]
struct Keys<const N: usize> {
    words: [[AtomicU64; N]; WORDS],
    len: [AtomicU32; N],
    /// Null for keys of at most `INLINE` bytes.
    tail: [AtomicPtr<Tail>; N],
}

impl<const N: usize> Keys<N> {
    fn new() -> Self {
        Keys {
            words: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            len: std::array::from_fn(|_| AtomicU32::new(0)),
            tail: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
        }
    }

    /// Orders slot `i` against `k`. May see a torn slot under a concurrent writer; the
    /// caller's version check then discards the result.
    #[inline]
    fn cmp(&self, i: usize, k: &SearchKey<'_>, _g: &Guard) -> Cmp {
        let w = &self.words;
        let x = w[0][i].load(Ordering::Relaxed);
        if x != k.words[0] {
            return x.cmp(&k.words[0]);
        }
        let x = w[1][i].load(Ordering::Relaxed);
        if x != k.words[1] {
            return x.cmp(&k.words[1]);
        }
        // The first 16 bytes are equal. If either key ends within them, the shorter is a
        // prefix of the longer (its zero padding matched), so length decides, and short keys
        // never touch the third word's cache lines.
        let len = self.len[i].load(Ordering::Relaxed);
        let shorter = len.min(k.len) as usize;
        if shorter > 16 {
            let x = w[2][i].load(Ordering::Relaxed);
            if x != k.words[2] {
                return x.cmp(&k.words[2]);
            }
        }
        if shorter <= INLINE {
            return len.cmp(&k.len);
        }
        let p = self.tail[i].load(Ordering::Acquire);
        // SAFETY: a non-null tail pointer is freed only through the epoch after its key left
        // the index, and we hold a guard pinned before we read the pointer.
        let tail: &[u8] = if p.is_null() { &[] } else { unsafe { &*p } };
        tail.cmp(k.tail).then(len.cmp(&k.len))
    }

    /// First slot in `0..n` whose key is `>= k` (`> k` if `after`).
    #[inline]
    fn search(&self, n: usize, k: &SearchKey<'_>, after: bool, g: &Guard) -> usize {
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let c = self.cmp(mid, k, g);
            if c == Cmp::Less || (after && c == Cmp::Equal) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Copies slot `i`'s key into `out` (valid only if the caller's version check passes).
    fn copy_key(&self, i: usize, out: &mut Vec<u8>, _g: &Guard) {
        out.clear();
        for w in &self.words {
            out.extend_from_slice(&w[i].load(Ordering::Relaxed).to_be_bytes());
        }
        let len = self.len[i].load(Ordering::Relaxed) as usize;
        if len <= INLINE {
            out.truncate(len);
        } else {
            let p = self.tail[i].load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: as in `cmp`.
                out.extend_from_slice(unsafe { &*p });
            }
        }
    }

    /// Writes `key` into slot `i` (caller holds the node's lock), taking ownership of `tail`.
    fn set(&self, i: usize, k: &SearchKey<'_>, tail: *mut Tail) {
        for (w, x) in self.words.iter().zip(k.words) {
            w[i].store(x, Ordering::Relaxed);
        }
        self.len[i].store(k.len, Ordering::Relaxed);
        self.tail[i].store(tail, Ordering::Release);
    }

    /// Copies slot `from` of `src` to slot `to` of `self` (the tail pointer moves with it;
    /// the caller makes sure exactly one slot owns it afterwards).
    fn move_slot<const M: usize>(&self, to: usize, src: &Keys<M>, from: usize) {
        for (w, s) in self.words.iter().zip(&src.words) {
            w[to].store(s[from].load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.len[to].store(src.len[from].load(Ordering::Relaxed), Ordering::Relaxed);
        self.tail[to].store(src.tail[from].load(Ordering::Relaxed), Ordering::Release);
    }

    /// A fresh owned copy of slot `i`'s tail (for a separator), or null.
    fn clone_tail(&self, i: usize) -> *mut Tail {
        let p = self.tail[i].load(Ordering::Relaxed);
        if p.is_null() {
            return p;
        }
        // SAFETY: the caller holds the node's lock; the tail is live.
        Box::into_raw(Box::new(unsafe { (*p).clone() }))
    }
}

fn new_tail(key: &[u8]) -> *mut Tail {
    match key.get(INLINE..) {
        Some(t) if !t.is_empty() => Box::into_raw(Box::new(Tail::from(t))),
        _ => std::ptr::null_mut(),
    }
}

// ---- nodes ----------------------------------------------------------------------------

#[repr(C)]
struct Header {
    version: VersionLock,
    /// Set at creation, never changed.
    leaf: bool,
    count: AtomicU32,
}

impl Header {
    fn new(leaf: bool) -> Header {
        Header { version: VersionLock(AtomicU64::new(0)), leaf, count: AtomicU32::new(0) }
    }

    /// The slot count, clamped so that a torn read cannot index out of bounds.
    #[inline]
    fn count(&self, cap: usize) -> usize {
        (self.count.load(Ordering::Relaxed) as usize).min(cap)
    }
}

#[repr(C, align(64))]
struct Leaf {
    h: Header,
    keys: Keys<LEAF_CAP>,
    vals: [AtomicU64; LEAF_CAP],
}

#[repr(C, align(64))]
struct Inner {
    h: Header,
    keys: Keys<INNER_CAP>,
    children: [AtomicPtr<Header>; INNER_CAP + 1],
}

impl Leaf {
    fn boxed() -> *mut Header {
        let l = Box::new(Leaf {
            h: Header::new(true),
            keys: Keys::new(),
            vals: std::array::from_fn(|_| AtomicU64::new(0)),
        });
        Box::into_raw(l) as *mut Header
    }
}

impl Inner {
    fn boxed() -> *mut Inner {
        Box::into_raw(Box::new(Inner {
            h: Header::new(false),
            keys: Keys::new(),
            children: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())),
        }))
    }
}

/// Cache lines prefetched when a search reaches a node: all of them (measured faster than
/// only the header and key words, docs/index-choice.md).
const SEARCH_LINES: usize = std::mem::size_of::<Leaf>() / 64;
/// Lines prefetched per node by the interleaved lookups of `get_many`: the header and the
/// first two words of every key, which decide most searches. With up to 16 lookups in flight
/// the core's line fill buffers are the limit, and fewer lines per node measured faster
/// (docs/index-choice.md); a single lookup has them to itself.
const BATCH_SEARCH_LINES: usize =
    (std::mem::offset_of!(Leaf, keys) + 2 * std::mem::size_of::<[AtomicU64; LEAF_CAP]>()).div_ceil(64);
const _: () = assert!(LEAF_CAP == INNER_CAP, "SEARCH_LINES assumes one slot count");
const _: () = assert!(std::mem::offset_of!(Leaf, keys) == std::mem::offset_of!(Inner, keys), "one layout");

/// Starts loading the first `lines` lines of node `p`, all at once, instead of one
/// dependent cache miss after another down the binary search (Masstree does the same).
#[inline(always)]
fn prefetch_node(p: *const Header, lines: usize) {
    for line in 0..lines {
        crate::prefetch((p as *const u8).wrapping_add(line * 64));
    }
}

impl Leaf {
    /// The value for `k` in this leaf, read at version `v`; `None` if the version moved
    /// (the caller restarts).
    #[inline]
    fn find(&self, k: &SearchKey<'_>, v: u64, g: &Guard) -> Option<Option<u64>> {
        let cnt = self.h.count(LEAF_CAP);
        let i = self.keys.search(cnt, k, false, g);
        let found = i < cnt && self.keys.cmp(i, k, g) == Cmp::Equal;
        let val = found.then(|| self.vals[i].load(Ordering::Relaxed));
        self.h.version.check(v).then_some(val)
    }
}

impl Inner {
    /// One step of lock coupling: child `i` and its version, provided this node (read at
    /// version `v`) did not change while the child pointer and version were read.
    #[inline]
    fn child(&self, i: usize, v: u64) -> Option<(*mut Header, u64)> {
        let c = self.children[i].load(Ordering::Acquire);
        prefetch_node(c, SEARCH_LINES);
        if c.is_null() || !self.h.version.check(v) {
            return None;
        }
        // SAFETY: as for every node pointer (see `Index::root`).
        let cv = unsafe { &*c }.version.read()?;
        self.h.version.check(v).then_some((c, cv))
    }
}

/// Views a node by kind. A node is freed only through the epoch after it left the tree, so
/// the reference is valid while the caller's guard is pinned.
enum NodeRef<'a> {
    Leaf(&'a Leaf),
    Inner(&'a Inner),
}

#[inline]
fn node<'a>(p: *mut Header) -> NodeRef<'a> {
    // SAFETY: `p` is a non-null node pointer of this index (checked by callers); `leaf` is
    // immutable and tells the allocation's real type (both are repr(C) with the header first).
    unsafe {
        if (*p).leaf {
            NodeRef::Leaf(&*(p as *const Leaf))
        } else {
            NodeRef::Inner(&*(p as *const Inner))
        }
    }
}

// ---- the index ------------------------------------------------------------------------

/// A concurrent ordered map from key bytes to `u64`. See the module documentation.
pub struct Index {
    root: AtomicPtr<Header>,
}

// SAFETY: all shared state is atomics; nodes and tails are owned by the index.
unsafe impl Send for Index {}
unsafe impl Sync for Index {}

/// Every operation's guard must be pinned on the global collector, the one `for_each` pins
/// and frees are deferred on: a guard of another collector would protect nothing.
#[inline]
fn check_guard(g: &Guard) {
    assert!(
        g.collector().is_some_and(|c| c == crossbeam_epoch::default_collector()),
        "index operations need a guard from crossbeam_epoch::pin()"
    );
}

/// Outcome of one optimistic attempt.
enum Attempt<T> {
    Done(T),
    Restart,
}

use Attempt::{Done, Restart};

impl Default for Index {
    fn default() -> Self {
        Index { root: AtomicPtr::new(Leaf::boxed()) }
    }
}

impl Index {
    pub fn new() -> Index {
        Index::default()
    }

    /// The root and its version, if it is still the root once its version is read.
    #[inline]
    fn root(&self) -> Option<(*mut Header, u64)> {
        let p = self.root.load(Ordering::Acquire);
        // SAFETY: nodes are freed only through the epoch after they left the tree, and every
        // caller holds a guard pinned before it read the pointer (so for all node pointers).
        let v = unsafe { &*p }.version.read()?;
        (self.root.load(Ordering::Acquire) == p).then_some((p, v))
    }

    /// The value for `key`, if present.
    pub fn get(&self, key: &[u8], g: &Guard) -> Option<u64> {
        check_guard(g);
        let k = SearchKey::new(key);
        loop {
            if let Done(v) = self.try_get(&k, g) {
                return v;
            }
        }
    }

    fn try_get(&self, k: &SearchKey<'_>, g: &Guard) -> Attempt<Option<u64>> {
        let Some((mut p, mut v)) = self.root() else { return Restart };
        loop {
            match node(p) {
                NodeRef::Inner(n) => {
                    let cnt = n.h.count(INNER_CAP);
                    let i = n.keys.search(cnt, k, true, g);
                    let Some((c, cv)) = n.child(i, v) else { return Restart };
                    p = c;
                    v = cv;
                }
                NodeRef::Leaf(l) => return l.find(k, v, g).map_or(Restart, Done),
            }
        }
    }

    /// Looks up several keys at once: `out[i]` is the value for `keys[i]`. The same answers as
    /// calling `get` for each key, but the descents are interleaved: each round takes every
    /// key one level down and prefetches the node it goes to next, so the cache misses of up
    /// to `GET_MANY_BATCH` independent lookups overlap instead of following one another.
    pub fn get_many<K: AsRef<[u8]>>(&self, keys: &[K], out: &mut [Option<u64>], g: &Guard) {
        check_guard(g);
        assert_eq!(keys.len(), out.len(), "one output slot per key");
        for (keys, out) in keys.chunks(GET_MANY_BATCH).zip(out.chunks_mut(GET_MANY_BATCH)) {
            self.get_batch(keys, out, g);
        }
    }

    fn get_batch<K: AsRef<[u8]>>(&self, keys: &[K], out: &mut [Option<u64>], g: &Guard) {
        let n = keys.len();
        debug_assert!(n <= GET_MANY_BATCH);
        let sk: [SearchKey<'_>; GET_MANY_BATCH] =
            std::array::from_fn(|i| SearchKey::new(keys.get(i).map_or(&[][..], |k| k.as_ref())));
        // Where each lookup stands: about to enter node `c` under `parent` read at version
        // `pv` (the root has no parent), or done. A lookup whose versions move falls back to
        // a plain `get` (rare: a concurrent split or removal on its path).
        #[derive(Clone, Copy)]
        enum Step {
            Enter { c: *mut Header, parent: *mut Header, pv: u64 },
            Done,
        }
        let Some((root, _)) = self.root() else {
            for (o, k) in out.iter_mut().zip(keys) {
                *o = self.get(k.as_ref(), g);
            }
            return;
        };
        let mut steps = [Step::Enter { c: root, parent: std::ptr::null_mut(), pv: 0 }; GET_MANY_BATCH];
        let mut active = n;
        while active > 0 {
            for i in 0..n {
                let Step::Enter { c, parent, pv } = steps[i] else { continue };
                // SAFETY: as for every node pointer (see `Index::root`).
                let entered = unsafe { &*c }.version.read().filter(|_| {
                    // The root's parent is the root pointer itself.
                    if parent.is_null() {
                        self.root.load(Ordering::Acquire) == c
                    } else {
                        // SAFETY: as above; the parent is a node this batch entered.
                        unsafe { &*parent }.version.check(pv)
                    }
                });
                let next = match entered {
                    None => None,
                    Some(v) => match node(c) {
                        NodeRef::Inner(nd) => {
                            let j = nd.keys.search(nd.h.count(INNER_CAP), &sk[i], true, g);
                            let child = nd.children[j].load(Ordering::Acquire);
                            prefetch_node(child, BATCH_SEARCH_LINES);
                            // The node unchanged since `v` before the child is kept, as in
                            // `Inner::child`: a pointer read past a split's new count may
                            // be stale (a node since freed), and it is entered later.
                            (!child.is_null() && nd.h.version.check(v)).then_some(Step::Enter {
                                c: child,
                                parent: c,
                                pv: v,
                            })
                        }
                        NodeRef::Leaf(l) => l.find(&sk[i], v, g).map(|val| {
                            out[i] = val;
                            Step::Done
                        }),
                    },
                };
                steps[i] = next.unwrap_or_else(|| {
                    out[i] = self.get(keys[i].as_ref(), g);
                    Step::Done
                });
                if matches!(steps[i], Step::Done) {
                    active -= 1;
                }
            }
        }
    }

    /// Returns the value for `key`, inserting `make()` first if absent; the bool says whether
    /// this call inserted. `make` runs under the leaf's lock, at most once.
    pub fn get_or_insert_with(&self, key: &[u8], make: impl FnOnce() -> u64, g: &Guard) -> (u64, bool) {
        check_guard(g);
        let k = SearchKey::new(key);
        let mut make = Some(make);
        loop {
            if let Done(out) = self.try_insert(&k, key, &mut make, g) {
                return out;
            }
        }
    }

    fn try_insert<F: FnOnce() -> u64>(
        &self,
        k: &SearchKey<'_>,
        key: &[u8],
        make: &mut Option<F>,
        g: &Guard,
    ) -> Attempt<(u64, bool)> {
        let Some((mut p, mut v)) = self.root() else { return Restart };
        let mut parent: Option<(&Inner, u64)> = None;
        loop {
            match node(p) {
                NodeRef::Inner(n) => {
                    if n.h.count.load(Ordering::Relaxed) as usize >= INNER_CAP {
                        self.split(p, v, parent, k, g);
                        return Restart;
                    }
                    if let Some((pn, pv)) = parent {
                        if !pn.h.version.check(pv) {
                            return Restart;
                        }
                    }
                    let cnt = n.h.count(INNER_CAP);
                    let i = n.keys.search(cnt, k, true, g);
                    let Some((c, cv)) = n.child(i, v) else { return Restart };
                    parent = Some((n, v));
                    p = c;
                    v = cv;
                }
                NodeRef::Leaf(l) => {
                    // Present already? Answer without locking.
                    let cnt = l.h.count(LEAF_CAP);
                    let i = l.keys.search(cnt, k, false, g);
                    if i < cnt && l.keys.cmp(i, k, g) == Cmp::Equal {
                        let val = l.vals[i].load(Ordering::Relaxed);
                        return if l.h.version.check(v) { Done((val, false)) } else { Restart };
                    }
                    if cnt >= LEAF_CAP {
                        self.split(p, v, parent, k, g);
                        return Restart;
                    }
                    if !l.h.version.upgrade(v) {
                        return Restart;
                    }
                    if let Some((pn, pv)) = parent {
                        if !pn.h.version.check(pv) {
                            l.h.version.unlock_unchanged(v);
                            return Restart;
                        }
                    }
                    // Locked, and unchanged since the search above: `i` is the slot. `make`
                    // runs before any slot moves; if it panics, the leaf is unlocked as it was.
                    let unwind = UnlockOnUnwind(&l.h.version, v);
                    let val = (make.take().expect("make runs once"))();
                    std::mem::forget(unwind);
                    let cnt = l.h.count.load(Ordering::Relaxed) as usize;
                    debug_assert!(cnt < LEAF_CAP);
                    for j in (i..cnt).rev() {
                        l.keys.move_slot(j + 1, &l.keys, j);
                        l.vals[j + 1].store(l.vals[j].load(Ordering::Relaxed), Ordering::Relaxed);
                    }
                    l.keys.set(i, k, new_tail(key));
                    l.vals[i].store(val, Ordering::Relaxed);
                    l.h.count.store(cnt as u32 + 1, Ordering::Relaxed);
                    l.h.version.unlock();
                    return Done((val, true));
                }
            }
        }
    }

    /// Splits the full node `p` (version `v`) under `parent`, or grows a new root. Gives up
    /// silently if any version moved: the caller restarts either way.
    /// `k` is the key being inserted: when it goes past the node's last key (ascending
    /// inserts, such as new order ids) the split leaves the left node full instead of half
    /// full.
    fn split(&self, p: *mut Header, v: u64, parent: Option<(&Inner, u64)>, k: &SearchKey<'_>, g: &Guard) {
        let h = unsafe { &*p };
        if let Some((pn, pv)) = parent {
            if !pn.h.version.upgrade(pv) {
                return;
            }
            if !h.version.upgrade(v) {
                pn.h.version.unlock_unchanged(pv);
                return;
            }
        } else {
            if !h.version.upgrade(v) {
                return;
            }
            if self.root.load(Ordering::Acquire) != p {
                h.version.unlock_unchanged(v);
                return;
            }
        }
        // Both locked: build the right sibling and the separator that goes up.
        let (right, sep_key, sep_tail): (*mut Header, SepKey, *mut Tail) = match node(p) {
            NodeRef::Leaf(l) => {
                let n = l.h.count.load(Ordering::Relaxed) as usize;
                let appending = l.keys.cmp(n - 1, k, g) == Cmp::Less;
                let mid = if appending { n - 1 } else { n / 2 };
                let rp = Leaf::boxed();
                let NodeRef::Leaf(r) = node(rp) else { unreachable!() };
                for j in mid..n {
                    r.keys.move_slot(j - mid, &l.keys, j);
                    r.vals[j - mid].store(l.vals[j].load(Ordering::Relaxed), Ordering::Relaxed);
                    l.keys.tail[j].store(std::ptr::null_mut(), Ordering::Release);
                }
                r.h.count.store((n - mid) as u32, Ordering::Relaxed);
                let sep = SepKey::of(&r.keys, 0);
                let tail = r.keys.clone_tail(0);
                l.h.count.store(mid as u32, Ordering::Relaxed);
                (rp, sep, tail)
            }
            NodeRef::Inner(n) => {
                let cnt = n.h.count.load(Ordering::Relaxed) as usize;
                let appending = n.keys.cmp(cnt - 1, k, g) == Cmp::Less;
                let mid = if appending { cnt - 1 } else { cnt / 2 };
                let rp = Inner::boxed();
                // SAFETY: fresh allocation.
                let r = unsafe { &*rp };
                for j in mid + 1..cnt {
                    r.keys.move_slot(j - mid - 1, &n.keys, j);
                    n.keys.tail[j].store(std::ptr::null_mut(), Ordering::Release);
                }
                for j in mid + 1..=cnt {
                    r.children[j - mid - 1].store(n.children[j].load(Ordering::Relaxed), Ordering::Release);
                }
                r.h.count.store((cnt - mid - 1) as u32, Ordering::Relaxed);
                // The middle separator moves up with its tail.
                let sep = SepKey::of(&n.keys, mid);
                let tail = n.keys.tail[mid].swap(std::ptr::null_mut(), Ordering::AcqRel);
                n.h.count.store(mid as u32, Ordering::Relaxed);
                (rp as *mut Header, sep, tail)
            }
        };
        let sk = SearchKey { words: sep_key.words, len: sep_key.len, tail: &[] };
        match parent {
            Some((pn, _)) => {
                let cnt = pn.h.count.load(Ordering::Relaxed) as usize;
                assert!(cnt < INNER_CAP, "split parent is full (nodes are split on the way down)");
                let at = (0..=cnt)
                    .find(|&j| pn.children[j].load(Ordering::Relaxed) == p)
                    .expect("split node is a child of its locked parent");
                for j in (at..cnt).rev() {
                    pn.keys.move_slot(j + 1, &pn.keys, j);
                }
                for j in (at + 1..=cnt).rev() {
                    pn.children[j + 1].store(pn.children[j].load(Ordering::Relaxed), Ordering::Release);
                }
                pn.keys.set(at, &sk, sep_tail);
                pn.children[at + 1].store(right, Ordering::Release);
                pn.h.count.store(cnt as u32 + 1, Ordering::Relaxed);
                h.version.unlock();
                pn.h.version.unlock();
            }
            None => {
                let rootp = Inner::boxed();
                // SAFETY: fresh allocation, published by the store below.
                let r = unsafe { &*rootp };
                r.keys.set(0, &sk, sep_tail);
                r.children[0].store(p, Ordering::Relaxed);
                r.children[1].store(right, Ordering::Relaxed);
                r.h.count.store(1, Ordering::Relaxed);
                self.root.store(rootp as *mut Header, Ordering::Release);
                h.version.unlock();
            }
        }
    }

    /// Removes `key` if it maps to `val`. Returns whether it did.
    pub fn remove_if(&self, key: &[u8], val: u64, g: &Guard) -> bool {
        check_guard(g);
        let k = SearchKey::new(key);
        loop {
            if let Done(out) = self.try_remove(&k, val, g) {
                return out;
            }
        }
    }

    fn try_remove(&self, k: &SearchKey<'_>, val: u64, g: &Guard) -> Attempt<bool> {
        let Some((mut p, mut v)) = self.root() else { return Restart };
        let mut parent: Option<(&Inner, u64)> = None;
        // The deepest inner node on the path with more than one child, and the inner nodes
        // below it, each with one child only: if the leaf loses its last entry, the whole
        // chain under the anchor leaves the tree with it (see `remove_subtree`).
        let mut anchor: Option<(&Inner, u64)> = None;
        let mut chain = [(std::ptr::null_mut::<Header>(), 0u64); CHAIN_MAX];
        let mut chain_len = 0usize;
        loop {
            match node(p) {
                NodeRef::Inner(n) => {
                    let cnt = n.h.count(INNER_CAP);
                    if cnt >= 1 {
                        anchor = Some((n, v));
                        chain_len = 0;
                    } else if chain_len < CHAIN_MAX {
                        chain[chain_len] = (p, v);
                        chain_len += 1;
                    } else {
                        // A chain longer than any real tree is tall: the nodes stay.
                        anchor = None;
                    }
                    let i = n.keys.search(cnt, k, true, g);
                    let Some((c, cv)) = n.child(i, v) else { return Restart };
                    parent = Some((n, v));
                    p = c;
                    v = cv;
                }
                NodeRef::Leaf(l) => {
                    let cnt = l.h.count(LEAF_CAP);
                    let i = l.keys.search(cnt, k, false, g);
                    let hit = i < cnt && l.keys.cmp(i, k, g) == Cmp::Equal && l.vals[i].load(Ordering::Relaxed) == val;
                    if !hit {
                        return if l.h.version.check(v) { Done(false) } else { Restart };
                    }
                    if cnt == 1 {
                        if let Some(anchor) = anchor {
                            return self.remove_subtree(anchor, &chain[..chain_len], (p, v), i, g);
                        }
                    }
                    if !l.h.version.upgrade(v) {
                        return Restart;
                    }
                    if let Some((pn, pv)) = parent {
                        if !pn.h.version.check(pv) {
                            l.h.version.unlock_unchanged(v);
                            return Restart;
                        }
                    }
                    let tail = l.keys.tail[i].load(Ordering::Relaxed);
                    for j in i + 1..cnt {
                        l.keys.move_slot(j - 1, &l.keys, j);
                        l.vals[j - 1].store(l.vals[j].load(Ordering::Relaxed), Ordering::Relaxed);
                    }
                    l.keys.tail[cnt - 1].store(std::ptr::null_mut(), Ordering::Release);
                    l.h.count.store(cnt as u32 - 1, Ordering::Relaxed);
                    l.h.version.unlock();
                    if !tail.is_null() {
                        let tail = tail as usize;
                        // SAFETY: the tail left the index above; readers that may still hold
                        // the pointer are pinned, so it is freed only after they unpin.
                        unsafe { g.defer_unchecked(move || drop(Box::from_raw(tail as *mut Tail))) };
                    }
                    return Done(true);
                }
            }
        }
    }

    /// Removes the last entry (slot `i`) of `leaf` by taking the subtree that holds it out
    /// of `anchor`: the leaf, and the `chain` of inner nodes between them, each left with
    /// one child. So walks do not cross empty leaves (a queue that deletes at its front,
    /// such as TPC-C's new orders, would otherwise leave a growing run of them), and keys
    /// that come and go in ascending order (ids, timestamps) leave no inner nodes behind:
    /// without the chain, each 1,000 or so such keys kept an emptied inner node and its
    /// last leaf for good. The anchor keeps at least one child; the neighbour that takes over
    /// the subtree's key range grows by it.
    ///
    /// Locks are taken top-down, each only at the version the descent read (so what the
    /// descent saw still holds once all are held), and a failed one releases the others
    /// unchanged: no waiting, hence no deadlock with splits and inserts, which lock top-down
    /// too.
    fn remove_subtree(
        &self,
        anchor: (&Inner, u64),
        chain: &[(*mut Header, u64)],
        leaf: (*mut Header, u64),
        i: usize,
        g: &Guard,
    ) -> Attempt<bool> {
        let (pn, pv) = anchor;
        if !pn.h.version.upgrade(pv) {
            return Restart;
        }
        let below = || chain.iter().copied().chain(std::iter::once(leaf));
        for (locked, (p, v)) in below().enumerate() {
            // SAFETY: as for every node pointer (see `Index::root`).
            if !unsafe { &*p }.version.upgrade(v) {
                for (q, qv) in below().take(locked) {
                    // SAFETY: as above.
                    unsafe { &*q }.version.unlock_unchanged(qv);
                }
                pn.h.version.unlock_unchanged(pv);
                return Restart;
            }
        }
        let top = chain.first().map_or(leaf.0, |c| c.0);
        let cnt = pn.h.count.load(Ordering::Relaxed) as usize;
        let at = (0..=cnt)
            .find(|&j| pn.children[j].load(Ordering::Relaxed) == top)
            .expect("the subtree is a child of its locked anchor");
        // Child `at` spans [sep[at-1], sep[at]). Drop it with the separator on its left
        // (the left neighbour grows up to sep[at]) or, for the first child, with sep[0]
        // (the right neighbour grows down to the anchor's low bound).
        let sep = at.saturating_sub(1);
        let sep_tail = pn.keys.tail[sep].load(Ordering::Relaxed);
        for j in sep + 1..cnt {
            pn.keys.move_slot(j - 1, &pn.keys, j);
        }
        pn.keys.tail[cnt - 1].store(std::ptr::null_mut(), Ordering::Release);
        for j in at + 1..=cnt {
            pn.children[j - 1].store(pn.children[j].load(Ordering::Relaxed), Ordering::Release);
        }
        pn.children[cnt].store(std::ptr::null_mut(), Ordering::Release);
        pn.h.count.store(cnt as u32 - 1, Ordering::Relaxed);
        let NodeRef::Leaf(l) = node(leaf.0) else { unreachable!("remove_subtree without a leaf") };
        let key_tail = l.keys.tail[i].swap(std::ptr::null_mut(), Ordering::AcqRel);
        l.h.count.store(0, Ordering::Relaxed);
        let mut gone = [0usize; CHAIN_MAX + 1];
        for (j, (p, _)) in below().enumerate() {
            // SAFETY: as above.
            unsafe { &*p }.version.unlock_obsolete();
            gone[j] = p as usize;
        }
        pn.h.version.unlock();
        let (n, sep_tail, key_tail) = (chain.len() + 1, sep_tail as usize, key_tail as usize);
        // SAFETY: the nodes and both tails left the tree above; readers that may still hold
        // them are pinned, so they are freed only after those readers unpin. Each node is
        // freed alone: its one child is the next in `gone`.
        unsafe {
            g.defer_unchecked(move || {
                for &p in &gone[..n] {
                    free_node(p as *mut Header);
                }
                for t in [sep_tail, key_tail] {
                    if t != 0 {
                        drop(Box::from_raw(t as *mut Tail));
                    }
                }
            })
        };
        Done(true)
    }

    /// Calls `f(value)` for each entry with a key in `(lo, hi)` in key order (`Reverse`:
    /// descending), until `f` returns false. Each leaf is read as one consistent snapshot;
    /// entries inserted concurrently behind the walk's position are not seen. The walk pins
    /// the epoch per leaf, not for its whole length, and `f` runs unpinned by it.
    pub fn for_each(&self, lo: Bound<&[u8]>, hi: Bound<&[u8]>, dir: Direction, mut f: impl FnMut(u64) -> bool) {
        // Where the next leaf starts (forward: its low bound; reverse: its high bound).
        let mut at: Bound<Vec<u8>> = match dir {
            Direction::Forward => lo.map(<[u8]>::to_vec),
            Direction::Reverse => hi.map(<[u8]>::to_vec),
        };
        let (lo_k, hi_k) = (lo.map(SearchKey::new), hi.map(SearchKey::new));
        let mut vals = [0u64; LEAF_CAP];
        let mut fence = Vec::new();
        loop {
            let at_k = at.as_ref().map(|b| SearchKey::new(b));
            let g = crossbeam_epoch::pin();
            let Done((n, more)) = self.leaf_chunk(&at_k, &lo_k, &hi_k, dir, &mut vals, &mut fence, &g) else {
                continue;
            };
            drop(g);
            for &val in &vals[..n] {
                if !f(val) {
                    return;
                }
            }
            if !more {
                return;
            }
            at = match dir {
                Direction::Forward => Bound::Included(std::mem::take(&mut fence)),
                Direction::Reverse => Bound::Excluded(std::mem::take(&mut fence)),
            };
        }
    }

    /// One leaf of a walk: fills `vals` with the in-range values of the leaf that holds the
    /// walk's position `at`, in walk order. Returns how many, and whether the walk goes on to
    /// the neighbouring leaf, whose fence key is then in `fence`.
    #[allow(clippy::too_many_arguments)]
    fn leaf_chunk(
        &self,
        at: &Bound<SearchKey<'_>>,
        lo: &Bound<SearchKey<'_>>,
        hi: &Bound<SearchKey<'_>>,
        dir: Direction,
        vals: &mut [u64; LEAF_CAP],
        fence: &mut Vec<u8>,
        g: &Guard,
    ) -> Attempt<(usize, bool)> {
        let Some((mut p, mut v)) = self.root() else { return Restart };
        // The leaf's neighbour exists iff some ancestor had a separator on that side.
        let mut has_fence = false;
        loop {
            match node(p) {
                NodeRef::Inner(n) => {
                    let cnt = n.h.count(INNER_CAP);
                    let i = match (dir, at) {
                        (Direction::Forward, Bound::Unbounded) => 0,
                        (Direction::Reverse, Bound::Unbounded) => cnt,
                        (_, Bound::Included(k)) => n.keys.search(cnt, k, true, g),
                        (Direction::Forward, Bound::Excluded(k)) => n.keys.search(cnt, k, true, g),
                        (Direction::Reverse, Bound::Excluded(k)) => n.keys.search(cnt, k, false, g),
                    };
                    match dir {
                        Direction::Forward if i < cnt => {
                            n.keys.copy_key(i, fence, g);
                            has_fence = true;
                        }
                        Direction::Reverse if i > 0 => {
                            n.keys.copy_key(i - 1, fence, g);
                            has_fence = true;
                        }
                        _ => {}
                    }
                    let Some((c, cv)) = n.child(i, v) else { return Restart };
                    p = c;
                    v = cv;
                }
                NodeRef::Leaf(l) => {
                    let cnt = l.h.count(LEAF_CAP);
                    let mut n = 0;
                    let mut hit_bound = false;
                    match dir {
                        Direction::Forward => {
                            let start = match at {
                                Bound::Unbounded => 0,
                                Bound::Included(k) => l.keys.search(cnt, k, false, g),
                                Bound::Excluded(k) => l.keys.search(cnt, k, true, g),
                            };
                            for i in start..cnt {
                                let past = match hi {
                                    Bound::Unbounded => false,
                                    Bound::Included(k) => l.keys.cmp(i, k, g) == Cmp::Greater,
                                    Bound::Excluded(k) => l.keys.cmp(i, k, g) != Cmp::Less,
                                };
                                if past {
                                    hit_bound = true;
                                    break;
                                }
                                vals[n] = l.vals[i].load(Ordering::Relaxed);
                                n += 1;
                            }
                        }
                        Direction::Reverse => {
                            let end = match at {
                                Bound::Unbounded => cnt,
                                Bound::Included(k) => l.keys.search(cnt, k, true, g),
                                Bound::Excluded(k) => l.keys.search(cnt, k, false, g),
                            };
                            for i in (0..end).rev() {
                                let past = match lo {
                                    Bound::Unbounded => false,
                                    Bound::Included(k) => l.keys.cmp(i, k, g) == Cmp::Less,
                                    Bound::Excluded(k) => l.keys.cmp(i, k, g) != Cmp::Greater,
                                };
                                if past {
                                    hit_bound = true;
                                    break;
                                }
                                vals[n] = l.vals[i].load(Ordering::Relaxed);
                                n += 1;
                            }
                        }
                    }
                    if !l.h.version.check(v) {
                        return Restart;
                    }
                    // Past the range's far end already? The fence itself may be beyond it.
                    let more = has_fence
                        && !hit_bound
                        && match (dir, hi, lo) {
                            (Direction::Forward, Bound::Included(k), _) => {
                                SearchKey::new(fence).cmp_key(k) != Cmp::Greater
                            }
                            (Direction::Forward, Bound::Excluded(k), _) => {
                                SearchKey::new(fence).cmp_key(k) == Cmp::Less
                            }
                            (Direction::Reverse, _, Bound::Included(k) | Bound::Excluded(k)) => {
                                SearchKey::new(fence).cmp_key(k) == Cmp::Greater
                            }
                            _ => true,
                        };
                    return Done((n, more));
                }
            }
        }
    }

    /// Nodes in the tree (for tests, with no operation running).
    #[cfg(test)]
    fn node_count(&self) -> usize {
        fn count(p: *mut Header) -> usize {
            match node(p) {
                NodeRef::Leaf(_) => 1,
                NodeRef::Inner(n) => {
                    let cnt = n.h.count(INNER_CAP);
                    1 + n.children[..=cnt].iter().map(|c| count(c.load(Ordering::Relaxed))).sum::<usize>()
                }
            }
        }
        count(self.root.load(Ordering::Relaxed))
    }

    /// Number of entries (walks every leaf; for tests and diagnostics).
    #[cfg(test)]
    fn len(&self) -> usize {
        let mut n = 0;
        self.for_each(Bound::Unbounded, Bound::Unbounded, Direction::Forward, |_| {
            n += 1;
            true
        });
        n
    }
}

/// A separator's inline part, captured while its node is locked.
struct SepKey {
    words: [u64; WORDS],
    len: u32,
}

impl SepKey {
    fn of<const N: usize>(keys: &Keys<N>, i: usize) -> SepKey {
        SepKey {
            words: std::array::from_fn(|w| keys.words[w][i].load(Ordering::Relaxed)),
            len: keys.len[i].load(Ordering::Relaxed),
        }
    }
}

impl SearchKey<'_> {
    /// Orders two prepared keys as byte strings.
    fn cmp_key(&self, o: &SearchKey<'_>) -> Cmp {
        self.words
            .cmp(&o.words)
            .then_with(|| {
                if self.len as usize <= INLINE && o.len as usize <= INLINE {
                    Cmp::Equal
                } else {
                    self.tail.cmp(o.tail)
                }
            })
            .then(self.len.cmp(&o.len))
    }
}

/// Frees node `p` and the tails it owns, not its children.
///
/// # Safety
/// `p` is a node no one else can reach any more (left the tree, and every reader that could
/// hold it has unpinned; or the index is being dropped), freed once.
unsafe fn free_node(p: *mut Header) {
    // Both kinds keep their keys at one offset, with one slot count (asserted above).
    let keys = &*((p as *const u8).add(std::mem::offset_of!(Leaf, keys)) as *const Keys<LEAF_CAP>);
    for t in &keys.tail {
        let t = t.load(Ordering::Relaxed);
        if !t.is_null() {
            drop(Box::from_raw(t));
        }
    }
    if (*p).leaf {
        drop(Box::from_raw(p as *mut Leaf));
    } else {
        drop(Box::from_raw(p as *mut Inner));
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        fn free(p: *mut Header) {
            // SAFETY: exclusive access in drop; every node and tail is owned by exactly one
            // place in the tree (moved-from slots were nulled).
            unsafe {
                if !(*p).leaf {
                    let n = &*(p as *const Inner);
                    let cnt = n.h.count.load(Ordering::Relaxed) as usize;
                    for c in &n.children[..=cnt] {
                        free(c.load(Ordering::Relaxed));
                    }
                }
                free_node(p);
            }
        }
        free(*self.root.get_mut());
    }
}

#[cfg(test)]
mod tests {
    //! The index against `BTreeMap` (one thread, random operations and bounds) and under
    //! threads (ordering and presence invariants while splits happen).

    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicBool;

    /// Keys from a small alphabet with lengths 0..40, so that long shared prefixes, keys
    /// that are prefixes of others, zero bytes, word boundaries and tails (> INLINE bytes)
    /// are all common.
    fn random_key(rng: &mut SmallRng) -> Vec<u8> {
        let len = match rng.gen_range(0..5) {
            0 => rng.gen_range(0..=8),
            1 => rng.gen_range(14..=18),
            2 => rng.gen_range(INLINE - 2..=INLINE + 2),
            _ => rng.gen_range(0..=40),
        };
        let prefix = [0, 17, 25][rng.gen_range(0..3)]; // shared 17- or 25-byte prefix for some keys
        (0..len).map(|i| if i < prefix { 7 } else { [0u8, 1, 2, 255][rng.gen_range(0..4)] }).collect()
    }

    fn bound(rng: &mut SmallRng) -> Bound<Vec<u8>> {
        match rng.gen_range(0..3) {
            0 => Bound::Unbounded,
            1 => Bound::Included(random_key(rng)),
            _ => Bound::Excluded(random_key(rng)),
        }
    }

    fn check_scans(ix: &Index, model: &BTreeMap<Vec<u8>, u64>, rng: &mut SmallRng) {
        let (lo, hi) = (bound(rng), bound(rng));
        let bad_range = match (&lo, &hi) {
            (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => {
                a > b || (a == b && (matches!(lo, Bound::Excluded(_)) || matches!(hi, Bound::Excluded(_))))
            }
            _ => false,
        };
        let limit = rng.gen_range(0..80);
        let take = |dir| {
            let mut out = Vec::new();
            ix.for_each(lo.as_ref().map(|k| &k[..]), hi.as_ref().map(|k| &k[..]), dir, |v| {
                out.push(v);
                limit == 0 || out.len() < limit
            });
            out
        };
        let (fwd, rev) = (take(Direction::Forward), take(Direction::Reverse));
        if bad_range {
            // BTreeMap::range panics on these; the index must simply find nothing.
            assert!(fwd.is_empty() && rev.is_empty(), "empty range {lo:?}..{hi:?} returned entries");
            return;
        }
        let all: Vec<u64> = model.range((lo.clone(), hi.clone())).map(|(_, v)| *v).collect();
        let n = if limit == 0 { all.len() } else { limit.min(all.len()) };
        assert_eq!(fwd, all[..n].to_vec(), "forward {lo:?}..{hi:?} limit {limit}");
        let back: Vec<u64> = all.iter().rev().take(n).copied().collect();
        assert_eq!(rev, back, "reverse {lo:?}..{hi:?} limit {limit}");
    }

    #[test]
    fn matches_btreemap_under_random_operations() {
        for seed in 0..8u64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let ix = Index::new();
            let mut model = BTreeMap::new();
            let g = crossbeam_epoch::pin();
            for step in 0..6000u64 {
                let key = random_key(&mut rng);
                match rng.gen_range(0..10) {
                    0..=5 => {
                        let (v, inserted) = ix.get_or_insert_with(&key, || step, &g);
                        let expect = *model.entry(key.clone()).or_insert(step);
                        assert_eq!((v, inserted), (expect, expect == step), "insert {key:?}");
                    }
                    6 | 7 => {
                        let val = model.get(&key).copied().unwrap_or(u64::MAX);
                        // Half the time ask with the wrong value: nothing may change.
                        let ask = if rng.gen() { val } else { val ^ 1 };
                        let removed = ix.remove_if(&key, ask, &g);
                        assert_eq!(removed, model.contains_key(&key) && ask == val, "remove {key:?}");
                        if removed {
                            model.remove(&key);
                        }
                    }
                    8 => assert_eq!(ix.get(&key, &g), model.get(&key).copied(), "get {key:?}"),
                    _ => {
                        // A batch (more than one round of `get_many`'s interleaving), half
                        // of it keys that are present, with repeats.
                        let present: Vec<&Vec<u8>> = model.keys().collect();
                        let keys: Vec<Vec<u8>> = (0..rng.gen_range(0..40))
                            .map(|_| match present.len() {
                                n if n > 0 && rng.gen() => present[rng.gen_range(0..n)].clone(),
                                _ => random_key(&mut rng),
                            })
                            .collect();
                        let mut out = vec![Some(u64::MAX); keys.len()];
                        ix.get_many(&keys, &mut out, &g);
                        for (k, o) in keys.iter().zip(&out) {
                            assert_eq!(*o, model.get(k).copied(), "get_many {k:?}");
                        }
                    }
                }
                if step % 50 == 0 {
                    check_scans(&ix, &model, &mut rng);
                }
            }
            assert_eq!(ix.len(), model.len());
            for (k, v) in &model {
                assert_eq!(ix.get(k, &g), Some(*v));
            }
        }
    }

    #[test]
    fn sequential_and_reverse_order_inserts_build_a_deep_tree() {
        let ix = Index::new();
        let g = crossbeam_epoch::pin();
        let n = 50_000u64;
        for i in 0..n {
            // Alternate ends so both the leftmost and rightmost paths split.
            let x = if i % 2 == 0 { i } else { 10 * n - i };
            ix.get_or_insert_with(&x.to_be_bytes(), || x, &g);
        }
        let mut seen = Vec::new();
        ix.for_each(Bound::Unbounded, Bound::Unbounded, Direction::Forward, |v| {
            seen.push(v);
            true
        });
        assert_eq!(seen.len() as u64, n);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "forward walk out of order");
        let mut back = Vec::new();
        ix.for_each(Bound::Unbounded, Bound::Unbounded, Direction::Reverse, |v| {
            back.push(v);
            true
        });
        back.reverse();
        assert_eq!(seen, back);
    }

    /// Writers insert (and some remove) interleaved keys while readers walk the index. At
    /// every moment: walks are strictly ordered, and keys never removed, once inserted, are
    /// found by `get` and by a walk over their neighbourhood.
    #[test]
    fn concurrent_inserts_removes_and_walks_keep_order_and_presence() {
        let ix = Index::new();
        let writers = 3u64;
        let per = 60_000u64;
        let done = AtomicBool::new(false);
        let progress: Vec<AtomicU64> = (0..writers).map(|_| AtomicU64::new(0)).collect();
        // Writers that ended, a failed one too (so that the wait below ends and the scope
        // reports its panic instead of waiting for good).
        let ended = AtomicU64::new(0);
        struct Ends<'a>(&'a AtomicU64);
        impl Drop for Ends<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Release);
            }
        }
        // Key of (writer w, i): value x = i * writers + w, as 8 bytes, or 24 bytes (with a
        // tail) for odd i; the value is x, so key order is value order.
        let key = |x: u64| -> Vec<u8> {
            let mut k = x.to_be_bytes().to_vec();
            if (x / writers) % 2 == 1 {
                k.extend_from_slice(&[0xAB; 16]);
            }
            k
        };
        // Keys with x % 5 == 4 are removed again right after insert; the others stay.
        let stays = |x: u64| x % 5 != 4;
        std::thread::scope(|s| {
            for w in 0..writers {
                let (ix, progress, ended) = (&ix, &progress, &ended);
                s.spawn(move || {
                    let _ends = Ends(ended);
                    for i in 0..per {
                        let x = i * writers + w;
                        let g = crossbeam_epoch::pin();
                        let (v, inserted) = ix.get_or_insert_with(&key(x), || x, &g);
                        assert!(inserted && v == x);
                        if !stays(x) {
                            assert!(ix.remove_if(&key(x), x, &g));
                        }
                        progress[w as usize].store(i + 1, Ordering::Release);
                    }
                });
            }
            for r in 0..2u64 {
                let (ix, progress, done) = (&ix, &progress, &done);
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(r);
                    let mut rounds = 0u64;
                    while !done.load(Ordering::Acquire) || rounds < 10 {
                        rounds += 1;
                        let g = crossbeam_epoch::pin();
                        // Every key inserted (and staying) before this point must be found.
                        let w = rng.gen_range(0..writers);
                        let upto = progress[w as usize].load(Ordering::Acquire);
                        if upto > 0 {
                            let i = rng.gen_range(0..upto);
                            let x = i * writers + w;
                            if stays(x) {
                                assert_eq!(ix.get(&key(x), &g), Some(x), "lost key {x}");
                                // The same through interleaved lookups, among neighbours
                                // that may be in flight.
                                let near: Vec<u64> = (x.saturating_sub(8)..x + 8).collect();
                                let keys: Vec<Vec<u8>> = near.iter().map(|&y| key(y)).collect();
                                let mut out = vec![None; keys.len()];
                                ix.get_many(&keys, &mut out, &g);
                                for (&y, o) in near.iter().zip(&out) {
                                    assert!(y == x || o.is_none() || *o == Some(y), "get_many {y}: {o:?}");
                                }
                                assert_eq!(out[near.iter().position(|&y| y == x).expect("x is near")], Some(x));
                                let mut found = false;
                                let lo = key(x.saturating_sub(40));
                                ix.for_each(Bound::Included(&lo), Bound::Unbounded, Direction::Forward, |v| {
                                    found |= v == x;
                                    v < x
                                });
                                assert!(found, "forward walk missed key {x}");
                                let mut found = false;
                                let hi = key(x + 40);
                                ix.for_each(Bound::Unbounded, Bound::Included(&hi), Direction::Reverse, |v| {
                                    found |= v == x;
                                    v > x
                                });
                                assert!(found, "reverse walk missed key {x}");
                            }
                        }
                        let dir = if rounds.is_multiple_of(2) { Direction::Forward } else { Direction::Reverse };
                        let mut prev: Option<u64> = None;
                        let mut count = 0;
                        ix.for_each(Bound::Unbounded, Bound::Unbounded, dir, |v| {
                            if let Some(p) = prev {
                                let ordered = if dir == Direction::Forward { p < v } else { p > v };
                                assert!(ordered, "walk out of order: {p} then {v}");
                            }
                            prev = Some(v);
                            count += 1;
                            count < 2000
                        });
                    }
                });
            }
            // Let the writers finish, then stop the readers.
            while ended.load(Ordering::Acquire) < writers {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            done.store(true, Ordering::Release);
        });
        let g = crossbeam_epoch::pin();
        let expect = (0..writers * per).filter(|&x| stays(x)).count();
        assert_eq!(ix.len(), expect);
        for x in 0..writers * per {
            assert_eq!(ix.get(&key(x), &g), stays(x).then_some(x));
        }
    }

    /// A queue, as TPC-C's new-order table is used: one thread appends ascending keys, one
    /// deletes from the front (so leaves empty out and leave the tree), and readers walk from
    /// the front. Every key between the deleter's and the appender's progress must be found,
    /// the first key a walk finds is never one that was deleted before the walk began, and
    /// walks stay ordered.
    #[test]
    fn queue_with_deletes_at_the_front_keeps_walks_correct() {
        let ix = Index::new();
        let n = 100_000u64;
        // `deleting`: keys below it may be gone (published before each removal);
        // `deleted`: keys below it are gone (published after).
        let (appended, deleting, deleted) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        let key = |x: u64| {
            let mut k = vec![1u8, 2, 3];
            k.extend_from_slice(&x.to_be_bytes());
            k
        };
        // Set by the appender or the deleter failing, so that the others stop and the
        // scope reports the panic instead of waiting for good.
        let gave_up = AtomicBool::new(false);
        struct FailsAll<'a>(&'a AtomicBool);
        impl Drop for FailsAll<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(true, Ordering::Release);
                }
            }
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                let _fails = FailsAll(&gave_up);
                for x in 0..n {
                    let g = crossbeam_epoch::pin();
                    assert!(ix.get_or_insert_with(&key(x), || x, &g).1);
                    appended.store(x + 1, Ordering::Release);
                }
            });
            s.spawn(|| {
                let _fails = FailsAll(&gave_up);
                let mut x = 0;
                while x < n && !gave_up.load(Ordering::Acquire) {
                    if x < appended.load(Ordering::Acquire) {
                        let g = crossbeam_epoch::pin();
                        deleting.store(x + 1, Ordering::Release);
                        assert!(ix.remove_if(&key(x), x, &g), "delete of {x} failed");
                        x += 1;
                        deleted.store(x, Ordering::Release);
                    } else {
                        std::hint::spin_loop();
                    }
                }
            });
            for r in 0..2u64 {
                let (ix, appended, deleting, deleted, gave_up) = (&ix, &appended, &deleting, &deleted, &gave_up);
                s.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(100 + r);
                    while deleted.load(Ordering::Acquire) < n && !gave_up.load(Ordering::Acquire) {
                        let lo = deleted.load(Ordering::Acquire);
                        let hi = appended.load(Ordering::Acquire);
                        let g = crossbeam_epoch::pin();
                        if lo < hi {
                            let x = rng.gen_range(lo..hi);
                            // x may be deleted meanwhile; if its removal had not begun when
                            // the get returned, the get must have found it.
                            let got = ix.get(&key(x), &g);
                            if deleting.load(Ordering::Acquire) <= x {
                                assert_eq!(got, Some(x), "key {x} missing");
                            }
                        }
                        // One walker goes forward from the front, where subtrees leave the
                        // tree, the other backward from the back, where they are split.
                        let dir = if r == 0 { Direction::Forward } else { Direction::Reverse };
                        let mut first = None;
                        let mut prev = None;
                        let mut count = 0;
                        ix.for_each(Bound::Unbounded, Bound::Unbounded, dir, |v| {
                            first.get_or_insert(v);
                            if let Some(p) = prev {
                                let ordered = if r == 0 { p < v } else { p > v };
                                assert!(ordered, "{dir:?} walk out of order: {p} then {v}");
                            }
                            prev = Some(v);
                            count += 1;
                            count < 64
                        });
                        if let (Some(f), Direction::Forward) = (first, dir) {
                            assert!(f >= lo, "walk found {f}, deleted before the walk began (front {lo})");
                        }
                        if let Some(last) = prev {
                            assert!(last >= lo, "walk found {last}, deleted before the walk began (front {lo})");
                        }
                    }
                });
            }
        });
        assert_eq!(ix.len(), 0);
        let g = crossbeam_epoch::pin();
        // The emptied tree still works.
        assert!(ix.get_or_insert_with(&key(7), || 7, &g).1);
        assert_eq!(ix.get(&key(7), &g), Some(7));
    }

    /// Keys that come and go in ascending order (a queue, ids, timestamps) keep the tree
    /// the size of what is live: emptied subtrees leave it, inner nodes included. Before,
    /// each 1,000 or so keys that passed through left an inner node and a leaf behind.
    #[test]
    fn ascending_churn_leaves_no_nodes_behind() {
        let ix = Index::new();
        let g = crossbeam_epoch::pin();
        let key = |x: u64| x.to_be_bytes();
        let (live, total) = (2_000u64, 400_000u64);
        let mut most = 0;
        for x in 0..total {
            assert!(ix.get_or_insert_with(&key(x), || x, &g).1);
            if x >= live {
                assert!(ix.remove_if(&key(x - live), x - live, &g));
            }
            if x % 10_000 == 0 {
                most = most.max(ix.node_count());
            }
        }
        // 2,000 keys fill at least 63 leaves of 32 and at most 2,000 (one each); inner
        // nodes over them, and the chain of one-child nodes a root can be left with.
        let bound = 2 * live as usize / LEAF_CAP + 64;
        assert!(most <= bound, "{most} nodes for {live} live keys (bound {bound})");
        for x in total - live..total {
            assert_eq!(ix.get(&key(x), &g), Some(x));
        }
        // Emptied, then used again.
        for x in total - live..total {
            assert!(ix.remove_if(&key(x), x, &g));
        }
        assert_eq!(ix.len(), 0);
        assert!(ix.node_count() <= 16, "{} nodes left in an empty tree", ix.node_count());
        assert!(ix.get_or_insert_with(&key(1), || 1, &g).1);
        assert_eq!(ix.get(&key(1), &g), Some(1));
    }

    /// Threads racing to insert the same keys (long ones, with distinct tails): exactly one
    /// insert wins per key, and every thread gets the winner's value back.
    #[test]
    fn racing_inserts_of_the_same_keys_insert_each_once() {
        let ix = Index::new();
        let n = 20_000u64;
        let key = |x: u64| {
            let mut k = vec![9u8; 16];
            k.extend_from_slice(&(x * 7919 % n).to_be_bytes());
            k
        };
        let wins: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3u64)
                .map(|t| {
                    let ix = &ix;
                    s.spawn(move || {
                        let mut got = Vec::new();
                        for x in 0..n {
                            let g = crossbeam_epoch::pin();
                            let (v, inserted) = ix.get_or_insert_with(&key(x), || x * 10 + t, &g);
                            got.push((v, inserted as u64));
                        }
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let g = crossbeam_epoch::pin();
        for x in 0..n {
            let winners = wins.iter().filter(|w| w[x as usize].1 == 1).count();
            assert_eq!(winners, 1, "key {x} inserted {winners} times");
            let v = ix.get(&key(x), &g).unwrap();
            assert!(wins.iter().all(|w| w[x as usize].0 == v), "a thread saw another value for key {x}");
            assert_eq!(v / 10, x, "key {x} holds a value made for another key");
        }
        assert_eq!(ix.len(), n as usize);
    }

    #[test]
    #[should_panic(expected = "guard from crossbeam_epoch::pin()")]
    fn a_guard_of_another_collector_is_refused() {
        let ix = Index::new();
        let collector = crossbeam_epoch::Collector::new();
        let handle = collector.register();
        let g = handle.pin();
        ix.get(b"k", &g);
    }

    /// A panic in `make` (the engine's rid allocation can panic when a table is out of
    /// record ids) leaves the index as it was: the leaf unlocked, nothing inserted, no slot
    /// shifted, and later operations and the drop work.
    #[test]
    fn a_panic_in_make_leaves_the_index_unchanged_and_unlocked() {
        let ix = Index::new();
        let g = crossbeam_epoch::pin();
        let long = |x: u8| [x; 24];
        for x in [1u8, 3] {
            ix.get_or_insert_with(&long(x), || u64::from(x), &g);
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ix.get_or_insert_with(&long(2), || panic!("out of record ids"), &g)
        }));
        assert!(r.is_err());
        assert_eq!(ix.get(&long(2), &g), None);
        assert_eq!(ix.get(&long(1), &g), Some(1));
        assert_eq!(ix.get(&long(3), &g), Some(3));
        assert_eq!(ix.get_or_insert_with(&long(2), || 2, &g), (2, true));
        assert_eq!(ix.len(), 3);
    }
}
