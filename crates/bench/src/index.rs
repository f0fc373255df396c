//! Micro-benchmark that chose the engine's concurrent ordered index (key bytes -> record id).
//!
//! Candidates (all keyed by `bytes::Bytes`, valued by `u64`):
//! - `skipmap`: `crossbeam_skiplist::SkipMap` (what the engine used first).
//! - `scc-tree`: `scc::TreeIndex` (scc 2.x). It has only ascending iterators (`iter`, `range`), no
//!   `DoubleEndedIterator`, so a reverse scan with a limit is *emulated* (see [`SccTree`]).
//! - `rwlock-btree`: `parking_lot::RwLock<std::collections::BTreeMap>` (baseline).
//! - `olc-btree`: `ditto_engine::BTreeIndex`, the engine's own B+tree with optimistic lock
//!   coupling (what the engine uses now).
//!
//! Ops, each measured per candidate and thread count:
//! - `insert`: bulk insert of `keys` distinct random 8-byte keys, split over the threads
//!   (the `Bytes` are built before the clock starts; time = until every thread is done).
//! - `get`: point lookup of a random existing key.
//! - `scan`: forward scan of 10 keys from a random start (keys >= start, ascending).
//! - `scan_rev`: reverse scan of 10 keys from a random start (keys <= start, descending).
//! - `mixed`: 90% `get` of an existing key / 10% insert of a new key (the new key's `Bytes` is
//!   allocated inside the timed loop, as the engine would).
//! - `remove`: bulk removal of the original `keys`, split over the threads.
//!
//! Keys are `splitmix64(SEED ^ i)` in big-endian: a bijection, so key `i` is known to exist for
//! `i < keys` and keys `>= keys` are known to be new, without reading a key array in the timed
//! loop. Every timed case runs for `seconds_per_case`; the ops of all threads are summed.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_skiplist::SkipMap;
use parking_lot::RwLock;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// One measured case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IndexResult {
    pub index: String,
    pub op: String,
    pub threads: usize,
    pub keys: u64,
    pub mops_per_s: f64,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct IndexBenchConfig {
    /// Keys bulk-inserted before the read cases.
    pub keys: u64,
    /// Thread counts to measure (each gets a freshly built index).
    pub threads: Vec<usize>,
    /// Duration of each timed case (`get`, `scan`, `scan_rev`, `mixed`).
    pub seconds_per_case: f64,
    pub shape: KeyShape,
}

/// What the keys look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyShape {
    /// 8 random bytes: every key differs in its first bytes.
    #[default]
    Random8,
    /// The server's layout of redis-benchmark's keys: a database byte, `key:`, and 12
    /// decimal digits (17 bytes); consecutive numbers share all but the last byte.
    Redis,
}

impl std::str::FromStr for KeyShape {
    type Err = String;
    fn from_str(s: &str) -> Result<KeyShape, String> {
        match s {
            "random8" => Ok(KeyShape::Random8),
            "redis" => Ok(KeyShape::Redis),
            o => Err(format!("key shape {o:?}: expected random8 or redis")),
        }
    }
}

impl Default for IndexBenchConfig {
    fn default() -> Self {
        IndexBenchConfig { keys: 1_000_000, threads: vec![1, 2], seconds_per_case: 1.0, shape: KeyShape::Random8 }
    }
}

/// Keys per scan.
pub const SCAN_LEN: usize = 10;
const SEED: u64 = 0x5eed_d177_0000_0001;

#[inline]
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 8 key bytes of key number `i` (distinct for distinct `i`).
#[inline]
fn key_bytes(i: u64) -> [u8; 8] {
    splitmix64(SEED ^ i).to_be_bytes()
}

/// Key number `i` in `shape`, on the stack.
struct Key {
    buf: [u8; 17],
    len: usize,
}

impl std::ops::Deref for Key {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[inline]
fn key_of(shape: KeyShape, i: u64) -> Key {
    let mut buf = [0u8; 17];
    match shape {
        KeyShape::Random8 => {
            buf[..8].copy_from_slice(&key_bytes(i));
            Key { buf, len: 8 }
        }
        KeyShape::Redis => {
            buf[1..5].copy_from_slice(b"key:");
            let mut n = i % 1_000_000_000_000;
            for b in buf[5..].iter_mut().rev() {
                *b = b'0' + (n % 10) as u8;
                n /= 10;
            }
            Key { buf, len: 17 }
        }
    }
}

/// What the benchmark needs from an ordered index.
pub trait OrderedIndex: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether `scan_rev` is native (false: emulated).
    fn native_reverse(&self) -> bool;
    /// Inserts; returns false if the key was already there (the old value is kept or replaced,
    /// depending on the index; the benchmark never inserts duplicates).
    fn insert(&self, key: Bytes, val: u64) -> bool;
    fn get(&self, key: &[u8]) -> Option<u64>;
    fn remove(&self, key: &[u8]) -> bool;
    /// Visits up to `limit` entries with key >= `start`, ascending; returns how many.
    fn scan<F: FnMut(u64)>(&self, start: &[u8], limit: usize, f: F) -> usize;
    /// Visits up to `limit` entries with key <= `start`, descending; returns how many.
    fn scan_rev<F: FnMut(u64)>(&self, start: &[u8], limit: usize, f: F) -> usize;
}

/// `crossbeam_skiplist::SkipMap`: `range(..=start).rev()` is native (`DoubleEndedIterator`).
#[derive(Default)]
pub struct SkipMapIndex(SkipMap<Bytes, u64>);

impl OrderedIndex for SkipMapIndex {
    fn name(&self) -> &'static str {
        "skipmap"
    }
    fn native_reverse(&self) -> bool {
        true
    }
    #[inline]
    fn insert(&self, key: Bytes, val: u64) -> bool {
        // Keeps the old value if the key exists. The closure runs only when a node is built; it
        // may still lose a race to an equal key, hence the value check too.
        let mut built = false;
        let e = self.0.get_or_insert_with(key, || {
            built = true;
            val
        });
        built && *e.value() == val
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        self.0.get(key).map(|e| *e.value())
    }
    #[inline]
    fn remove(&self, key: &[u8]) -> bool {
        self.0.remove(key).is_some()
    }
    #[inline]
    fn scan<F: FnMut(u64)>(&self, start: &[u8], limit: usize, mut f: F) -> usize {
        let mut n = 0;
        for e in self.0.range::<[u8], _>((Bound::Included(start), Bound::Unbounded)).take(limit) {
            f(*e.value());
            n += 1;
        }
        n
    }
    #[inline]
    fn scan_rev<F: FnMut(u64)>(&self, start: &[u8], limit: usize, mut f: F) -> usize {
        let mut n = 0;
        for e in self.0.range::<[u8], _>((Bound::Unbounded, Bound::Included(start))).rev().take(limit) {
            f(*e.value());
            n += 1;
        }
        n
    }
}

/// `scc::TreeIndex` (scc 2.x).
///
/// scc 2's `TreeIndex` offers `iter` and `range` in ascending order only (no
/// `DoubleEndedIterator`, no `prev`). `scan_rev` is emulated with backward windows: take the
/// first 8 key bytes of `start` as a big-endian number `p`, scan the contiguous key range
/// `[be(p - delta), start]` forward keeping the last `limit` entries, and if it held fewer than
/// `limit` entries grow `delta` (x16) and rescan. Because each window is a contiguous key range
/// ending at `start`, the result is exact for any key distribution; only the *cost* depends on
/// the distribution. `delta` starts from a hint learnt from earlier scans, which suits uniformly
/// spread keys (this benchmark) and is optimistic for clustered keys (TPC-C composite keys,
/// where the density behind one customer's orders differs from the table average).
///
/// Measured (docs/index-choice.md): in scc 2.4.0 `range` from an arbitrary start costs O(n)
/// before its first item (about 12 ms at 1M keys), because its start position lands far left of
/// the bound and the leaf list is walked forward; both `scan` and the emulated `scan_rev` pay it.
#[derive(Default)]
pub struct SccTree {
    tree: scc::TreeIndex<Bytes, u64>,
    /// Last window width that held about `limit` keys.
    rev_hint: AtomicU64,
}

#[inline]
fn prefix_u64(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

impl OrderedIndex for SccTree {
    fn name(&self) -> &'static str {
        "scc-tree"
    }
    fn native_reverse(&self) -> bool {
        false
    }
    #[inline]
    fn insert(&self, key: Bytes, val: u64) -> bool {
        self.tree.insert(key, val).is_ok()
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        let guard = scc::ebr::Guard::new();
        self.tree.peek(key, &guard).copied()
    }
    #[inline]
    fn remove(&self, key: &[u8]) -> bool {
        self.tree.remove(key)
    }
    #[inline]
    fn scan<F: FnMut(u64)>(&self, start: &[u8], limit: usize, mut f: F) -> usize {
        let guard = scc::ebr::Guard::new();
        let mut n = 0;
        for (_, v) in self.tree.range::<[u8], _>((Bound::Included(start), Bound::Unbounded), &guard).take(limit) {
            f(*v);
            n += 1;
        }
        n
    }
    fn scan_rev<F: FnMut(u64)>(&self, start: &[u8], limit: usize, mut f: F) -> usize {
        if limit == 0 {
            return 0;
        }
        let guard = scc::ebr::Guard::new();
        let p = prefix_u64(start);
        let mut delta = self.rev_hint.load(Ordering::Relaxed).max(1);
        // Ring of the last `limit` entries seen in the window (ascending order, wrapping).
        let mut ring: Vec<u64> = Vec::with_capacity(limit);
        loop {
            ring.clear();
            let lo = p.checked_sub(delta).map(u64::to_be_bytes);
            let lower = match &lo {
                Some(b) => Bound::Included(&b[..]),
                None => Bound::Unbounded,
            };
            let mut seen = 0usize;
            for (_, v) in self.tree.range::<[u8], _>((lower, Bound::Included(start)), &guard) {
                if ring.len() < limit {
                    ring.push(*v);
                } else {
                    ring[seen % limit] = *v;
                }
                seen += 1;
            }
            if seen >= limit || lo.is_none() {
                // Learn: too wide a window costs a long forward scan, too narrow a rescan.
                if seen > 4 * limit {
                    self.rev_hint.store((delta / 2).max(1), Ordering::Relaxed);
                } else if seen >= limit {
                    self.rev_hint.store(delta, Ordering::Relaxed);
                }
                let n = ring.len();
                // Newest (largest) entry is at index (seen - 1) % limit once the ring wrapped.
                for j in 0..n {
                    let idx = if seen <= limit { n - 1 - j } else { (seen - 1 - j) % limit };
                    f(ring[idx]);
                }
                return n;
            }
            delta = delta.saturating_mul(16);
        }
    }
}

/// `ditto_engine::BTreeIndex`: the engine's own B+tree with optimistic lock coupling (keys
/// inline in the nodes, readers write no shared memory, walks in both directions).
#[derive(Default)]
pub struct OlcBTree(ditto_engine::BTreeIndex);

impl OrderedIndex for OlcBTree {
    fn name(&self) -> &'static str {
        "olc-btree"
    }
    fn native_reverse(&self) -> bool {
        true
    }
    #[inline]
    fn insert(&self, key: Bytes, val: u64) -> bool {
        // The engine's callers hold a pinned guard across a transaction; so does this.
        let g = crossbeam_epoch::pin();
        self.0.get_or_insert_with(&key, || val, &g).1
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        let g = crossbeam_epoch::pin();
        self.0.get(key, &g)
    }
    #[inline]
    fn remove(&self, key: &[u8]) -> bool {
        let g = crossbeam_epoch::pin();
        match self.0.get(key, &g) {
            Some(v) => self.0.remove_if(key, v, &g),
            None => false,
        }
    }
    #[inline]
    fn scan<F: FnMut(u64)>(&self, start: &[u8], limit: usize, mut f: F) -> usize {
        let mut n = 0;
        if limit > 0 {
            self.0.for_each(Bound::Included(start), Bound::Unbounded, ditto_engine::Direction::Forward, |v| {
                f(v);
                n += 1;
                n < limit
            });
        }
        n
    }
    #[inline]
    fn scan_rev<F: FnMut(u64)>(&self, start: &[u8], limit: usize, mut f: F) -> usize {
        let mut n = 0;
        if limit > 0 {
            self.0.for_each(Bound::Unbounded, Bound::Included(start), ditto_engine::Direction::Reverse, |v| {
                f(v);
                n += 1;
                n < limit
            });
        }
        n
    }
}

/// `parking_lot::RwLock<BTreeMap>`: the baseline.
#[derive(Default)]
pub struct RwBTree(RwLock<BTreeMap<Bytes, u64>>);

impl OrderedIndex for RwBTree {
    fn name(&self) -> &'static str {
        "rwlock-btree"
    }
    fn native_reverse(&self) -> bool {
        true
    }
    #[inline]
    fn insert(&self, key: Bytes, val: u64) -> bool {
        let mut m = self.0.write();
        match m.entry(key) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(val);
                true
            }
            std::collections::btree_map::Entry::Occupied(_) => false,
        }
    }
    #[inline]
    fn get(&self, key: &[u8]) -> Option<u64> {
        self.0.read().get(key).copied()
    }
    #[inline]
    fn remove(&self, key: &[u8]) -> bool {
        self.0.write().remove(key).is_some()
    }
    #[inline]
    fn scan<F: FnMut(u64)>(&self, start: &[u8], limit: usize, mut f: F) -> usize {
        let m = self.0.read();
        let mut n = 0;
        for (_, v) in m.range::<[u8], _>((Bound::Included(start), Bound::Unbounded)).take(limit) {
            f(*v);
            n += 1;
        }
        n
    }
    #[inline]
    fn scan_rev<F: FnMut(u64)>(&self, start: &[u8], limit: usize, mut f: F) -> usize {
        let m = self.0.read();
        let mut n = 0;
        for (_, v) in m.range::<[u8], _>((Bound::Unbounded, Bound::Included(start))).rev().take(limit) {
            f(*v);
            n += 1;
        }
        n
    }
}

/// Runs `body(thread_id, stop, ops)` on `threads` threads for `secs`; returns Mops/s summed over
/// threads (each thread's ops over its own elapsed time).
fn timed<I, B>(index: &I, threads: usize, secs: f64, body: B) -> f64
where
    I: OrderedIndex,
    B: Fn(&I, usize, &AtomicBool) -> u64 + Sync,
{
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let total: f64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, barrier, body) = (&stop, &barrier, &body);
                s.spawn(move || {
                    barrier.wait();
                    let t0 = Instant::now();
                    let ops = body(index, t, stop);
                    ops as f64 / t0.elapsed().as_secs_f64()
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().expect("bench worker panicked")).sum()
    });
    total / 1e6
}

/// Runs `work(t)` once on each of `threads` threads; returns the wall time from the common start
/// until the last one finishes.
fn once_each<W: Fn(usize) + Sync>(threads: usize, work: W) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    work(t);
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        for h in handles {
            h.join().expect("bench worker panicked");
        }
        t0.elapsed()
    })
}

/// The timed (duration-bounded) ops, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimedOp {
    Get,
    Scan,
    ScanRev,
    Mixed,
}

impl TimedOp {
    const ALL: [TimedOp; 4] = [TimedOp::Get, TimedOp::Scan, TimedOp::ScanRev, TimedOp::Mixed];

    fn name(self, native_reverse: bool) -> &'static str {
        match self {
            TimedOp::Get => "get",
            TimedOp::Scan => "scan",
            TimedOp::ScanRev if native_reverse => "scan_rev",
            TimedOp::ScanRev => "scan_rev*",
            TimedOp::Mixed => "mixed",
        }
    }
}

fn result(index: &impl OrderedIndex, op: &str, threads: usize, keys: u64, mops_per_s: f64) -> IndexResult {
    IndexResult { index: index.name().to_string(), op: op.to_string(), threads, keys, mops_per_s }
}

/// Bulk-inserts keys `0..n` split over `threads` (thread t owns keys with i % threads == t);
/// the `Bytes` are built before the clock starts. Returns the index and Mops/s.
fn build<I: OrderedIndex + Default>(n: u64, threads: usize, shape: KeyShape) -> (I, f64) {
    let index = I::default();
    let owned: Vec<std::sync::Mutex<Vec<(Bytes, u64)>>> = (0..threads)
        .map(|t| {
            let v = (t as u64..n).step_by(threads).map(|i| (Bytes::copy_from_slice(&key_of(shape, i)), i)).collect();
            std::sync::Mutex::new(v)
        })
        .collect();
    let elapsed = once_each(threads, |t| {
        let chunk = std::mem::take(&mut *owned[t].lock().unwrap());
        for (k, v) in chunk {
            let fresh = index.insert(k, v);
            debug_assert!(fresh);
        }
    });
    (index, n as f64 / elapsed.as_secs_f64() / 1e6)
}

/// Removes keys `0..n` split over `threads`; returns Mops/s.
fn remove_all<I: OrderedIndex>(index: &I, n: u64, threads: usize, shape: KeyShape) -> f64 {
    let elapsed = once_each(threads, |t| {
        for i in (t as u64..n).step_by(threads) {
            let removed = index.remove(&key_of(shape, i));
            debug_assert!(removed);
        }
    });
    n as f64 / elapsed.as_secs_f64() / 1e6
}

/// Runs one timed op for `secs` on `threads` threads; returns Mops/s.
fn run_timed<I: OrderedIndex>(index: &I, op: TimedOp, n: u64, threads: usize, secs: f64, shape: KeyShape) -> f64 {
    let salt = 0x100 * (op as u64 + 1);
    timed(index, threads, secs, |idx, t, stop| {
        let mut rng = SmallRng::seed_from_u64(SEED ^ salt ^ ((t as u64 + 1) << 32));
        let mut ops = 0u64;
        match op {
            TimedOp::Get => {
                let mut found = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let i = rng.gen_range(0..n);
                    found += idx.get(&key_of(shape, i)).is_some() as u64;
                    ops += 1;
                }
                assert_eq!(found, ops, "{}: get missed existing keys", idx.name());
            }
            TimedOp::Scan | TimedOp::ScanRev => {
                let mut sum = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let start = match shape {
                        KeyShape::Random8 => key_of(shape, rng.gen()),
                        KeyShape::Redis => key_of(shape, rng.gen_range(0..n)),
                    };
                    if op == TimedOp::Scan {
                        idx.scan(&start, SCAN_LEN, |v| sum = sum.wrapping_add(v));
                    } else {
                        idx.scan_rev(&start, SCAN_LEN, |v| sum = sum.wrapping_add(v));
                    }
                    ops += 1;
                }
                std::hint::black_box(sum);
            }
            TimedOp::Mixed => {
                // New keys: i = n + t + threads * j, disjoint across threads and from `0..n`.
                let mut next_new = n + t as u64;
                while !stop.load(Ordering::Relaxed) {
                    if rng.gen_ratio(1, 10) {
                        idx.insert(Bytes::copy_from_slice(&key_of(shape, next_new)), next_new);
                        next_new += threads as u64;
                    } else {
                        let i = rng.gen_range(0..n);
                        std::hint::black_box(idx.get(&key_of(shape, i)));
                    }
                    ops += 1;
                }
            }
        }
        ops
    })
}

/// Runs every candidate on every op and thread count. For each thread count the four indexes
/// are built one after the other, then each timed op runs on each index in turn (op-major), so
/// a burst of outside load on the machine is spread over the candidates rather than landing on
/// one of them.
pub fn run(cfg: &IndexBenchConfig) -> Vec<IndexResult> {
    let (n, secs, shape) = (cfg.keys, cfg.seconds_per_case, cfg.shape);
    let mut out = Vec::new();
    for &threads in &cfg.threads {
        let threads = threads.max(1);
        let (a, mops) = build::<SkipMapIndex>(n, threads, shape);
        out.push(result(&a, "insert", threads, n, mops));
        let (b, mops) = build::<SccTree>(n, threads, shape);
        out.push(result(&b, "insert", threads, n, mops));
        let (c, mops) = build::<RwBTree>(n, threads, shape);
        out.push(result(&c, "insert", threads, n, mops));
        let (d, mops) = build::<OlcBTree>(n, threads, shape);
        out.push(result(&d, "insert", threads, n, mops));
        for op in TimedOp::ALL {
            let mops = run_timed(&a, op, n, threads, secs, shape);
            out.push(result(&a, op.name(a.native_reverse()), threads, n, mops));
            let mops = run_timed(&b, op, n, threads, secs, shape);
            out.push(result(&b, op.name(b.native_reverse()), threads, n, mops));
            let mops = run_timed(&c, op, n, threads, secs, shape);
            out.push(result(&c, op.name(c.native_reverse()), threads, n, mops));
            let mops = run_timed(&d, op, n, threads, secs, shape);
            out.push(result(&d, op.name(d.native_reverse()), threads, n, mops));
        }
        let mops = remove_all(&a, n, threads, shape);
        out.push(result(&a, "remove", threads, n, mops));
        let mops = remove_all(&b, n, threads, shape);
        out.push(result(&b, "remove", threads, n, mops));
        let mops = remove_all(&c, n, threads, shape);
        out.push(result(&c, "remove", threads, n, mops));
        let mops = remove_all(&d, n, threads, shape);
        out.push(result(&d, "remove", threads, n, mops));
    }
    out
}

/// Prints an aligned table: one row per (op, threads, index), with the ratio to the best index
/// for that (op, threads) and the mean time of one op on one thread (`threads / throughput`).
/// `scan_rev*` (emulated reverse scan) competes with `scan_rev`.
pub fn print(results: &[IndexResult]) {
    let base_op = |op: &str| op.trim_end_matches('*').to_string();
    let mut groups: Vec<(String, usize)> = Vec::new();
    for r in results {
        let g = (base_op(&r.op), r.threads);
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups.sort_by_key(|(op, t)| (op_rank(op), *t));
    let w_index = results.iter().map(|r| r.index.len()).max().unwrap_or(5).max(5);
    let w_op = results.iter().map(|r| r.op.len()).max().unwrap_or(2).max(2);
    println!(
        "{:<w_op$}  {:>7}  {:>9}  {:<w_index$}  {:>10}  {:>12}  {:>8}",
        "op", "threads", "keys", "index", "Mops/s", "ns/op/thread", "vs best"
    );
    for (op, threads) in groups {
        let rows: Vec<&IndexResult> = results.iter().filter(|r| base_op(&r.op) == op && r.threads == threads).collect();
        let best = rows.iter().map(|r| r.mops_per_s).fold(0.0f64, f64::max);
        for r in rows {
            let ratio = if best > 0.0 { r.mops_per_s / best } else { 0.0 };
            let ns = if r.mops_per_s > 0.0 { r.threads as f64 * 1e3 / r.mops_per_s } else { f64::INFINITY };
            println!(
                "{:<w_op$}  {:>7}  {:>9}  {:<w_index$}  {:>10}  {:>12.0}  {:>7.3}x",
                r.op,
                r.threads,
                r.keys,
                r.index,
                fmt_mops(r.mops_per_s),
                ns,
                ratio
            );
        }
    }
    if results.iter().any(|r| r.op.ends_with('*')) {
        println!("* emulated: the index has no native reverse iteration");
    }
}

/// Three significant digits, however small.
fn fmt_mops(m: f64) -> String {
    if m >= 1.0 || m == 0.0 {
        format!("{m:.3}")
    } else {
        let decimals = (2 - m.log10().floor() as i32).clamp(3, 9) as usize;
        format!("{m:.decimals$}")
    }
}

fn op_rank(op: &str) -> usize {
    ["insert", "get", "scan", "scan_rev", "mixed", "remove"].iter().position(|o| *o == op).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect_fwd<I: OrderedIndex>(idx: &I, start: &[u8], limit: usize) -> Vec<u64> {
        let mut v = Vec::new();
        let n = idx.scan(start, limit, |val| v.push(val));
        assert_eq!(n, v.len());
        v
    }

    fn collect_rev<I: OrderedIndex>(idx: &I, start: &[u8], limit: usize) -> Vec<u64> {
        let mut v = Vec::new();
        let n = idx.scan_rev(start, limit, |val| v.push(val));
        assert_eq!(n, v.len());
        v
    }

    /// Checks an adapter against a plain `BTreeMap` on the same keys: point gets, forward and
    /// reverse scans (including starts before the first / after the last key, exact-key starts,
    /// short and long keys), and removal.
    fn check_adapter<I: OrderedIndex + Default>() {
        let idx = I::default();
        let mut model = BTreeMap::new();
        let mut rng = SmallRng::seed_from_u64(7);
        // 8-byte random keys plus variable-length (4..24 bytes) clustered composite-like keys.
        for i in 0..3000u64 {
            let k = Bytes::copy_from_slice(&key_bytes(i));
            assert!(idx.insert(k.clone(), i));
            model.insert(k, i);
        }
        for i in 0..1000u64 {
            let len = rng.gen_range(4..=24);
            let mut k = vec![0u8; len];
            k[0] = 0x42;
            k[1] = (i % 3) as u8;
            for b in &mut k[2..] {
                *b = rng.gen_range(0..4);
            }
            let k = Bytes::from(k);
            let fresh = !model.contains_key(&k);
            assert_eq!(idx.insert(k.clone(), 10_000 + i), fresh);
            model.entry(k).or_insert(10_000 + i);
        }
        assert!(!idx.insert(Bytes::copy_from_slice(&key_bytes(0)), 99), "duplicate insert");
        for (k, v) in &model {
            assert_eq!(idx.get(k), Some(*v));
        }
        assert_eq!(idx.get(b"no such key"), None);

        let mut starts: Vec<Vec<u8>> = vec![vec![], vec![0], vec![0xff; 9], vec![0x42], vec![0x42, 1, 2]];
        starts.extend(model.keys().step_by(37).map(|k| k.to_vec()));
        starts.extend((0..300).map(|_| rng.gen::<u64>().to_be_bytes().to_vec()));
        starts.extend((0..100).map(|_| {
            let len = rng.gen_range(1..=12);
            let mut k = vec![0x42u8; len];
            for b in &mut k[1..] {
                *b = rng.gen_range(0..4);
            }
            k
        }));
        for start in &starts {
            for limit in [0, 1, SCAN_LEN, 50] {
                let want: Vec<_> = model
                    .range::<[u8], _>((Bound::Included(&start[..]), Bound::Unbounded))
                    .take(limit)
                    .map(|(_, v)| *v)
                    .collect();
                assert_eq!(collect_fwd(&idx, start, limit), want, "{} scan from {start:?}", idx.name());
                let want: Vec<_> = model
                    .range::<[u8], _>((Bound::Unbounded, Bound::Included(&start[..])))
                    .rev()
                    .take(limit)
                    .map(|(_, v)| *v)
                    .collect();
                assert_eq!(collect_rev(&idx, start, limit), want, "{} scan_rev from {start:?}", idx.name());
            }
        }

        for i in (0..3000u64).step_by(2) {
            let k = key_bytes(i);
            assert!(idx.remove(&k));
            assert!(!idx.remove(&k));
            model.remove(&k[..]);
            assert_eq!(idx.get(&k), None);
        }
        for start in &starts {
            let want: Vec<_> = model
                .range::<[u8], _>((Bound::Unbounded, Bound::Included(&start[..])))
                .rev()
                .take(SCAN_LEN)
                .map(|(_, v)| *v)
                .collect();
            assert_eq!(collect_rev(&idx, start, SCAN_LEN), want, "{} scan_rev after removes", idx.name());
        }
    }

    #[test]
    fn adapters_match_btreemap() {
        check_adapter::<SkipMapIndex>();
        check_adapter::<SccTree>();
        check_adapter::<RwBTree>();
        check_adapter::<OlcBTree>();
    }

    #[test]
    fn tiny_run_has_throughput_for_every_op() {
        let cfg =
            IndexBenchConfig { keys: 10_000, threads: vec![1, 2], seconds_per_case: 0.05, shape: KeyShape::Random8 };
        let results = run(&cfg);
        let redis = run(&IndexBenchConfig { shape: KeyShape::Redis, ..cfg.clone() });
        assert_eq!(redis.len(), results.len());
        assert!(redis.iter().all(|r| r.mops_per_s > 0.0 && r.mops_per_s.is_finite()), "{redis:?}");
        assert_eq!(&*key_of(KeyShape::Redis, 42), b"\0key:000000000042");
        let json = serde_json::to_string(&results).unwrap();
        assert!(json.contains("\"mops_per_s\""));
        for index in ["skipmap", "scc-tree", "rwlock-btree", "olc-btree"] {
            for threads in [1, 2] {
                for op in ["insert", "get", "scan", "scan_rev", "mixed", "remove"] {
                    let r = results
                        .iter()
                        .find(|r| r.index == index && r.threads == threads && r.op.trim_end_matches('*') == op)
                        .unwrap_or_else(|| panic!("no result for {index} {op} {threads}"));
                    assert!(r.mops_per_s > 0.0 && r.mops_per_s.is_finite(), "{r:?}");
                    assert_eq!(r.keys, 10_000);
                }
            }
        }
        print(&results);
    }

    /// The full run recorded in docs/index-choice.md:
    /// `cargo test -p ditto-bench --release --lib index -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn full_index_bench() {
        let cfg = IndexBenchConfig::default();
        let results = run(&cfg);
        print(&results);
        println!("{}", serde_json::to_string(&results).unwrap());
    }
}
