//! Used memory and `maxmemory`
//! ===========================
//! An in-memory database must not let its clients grow it until the kernel kills it. Like
//! Redis with `maxmemory-policy noeviction`, the server refuses the commands that may grow
//! the data (SET, HSET, INCR, APPEND, ...) with `-OOM` while the memory in use is over
//! `maxmemory`; reads, deletes and FLUSHDB still run, so a client can make room.
//!
//! The memory in use is counted by the allocator: [`Counting`] wraps the process's global
//! allocator (the binary installs it) and keeps, per thread, the bytes allocated minus the
//! bytes freed (`Layout::size`, what was asked for), adding them to one global counter
//! whenever a thread's share has moved by `FLUSH_AT`. So an allocation costs a thread-local
//! add and compare, with no shared cache line written, and [`allocated_bytes`] is exact to
//! within `FLUSH_AT` per thread. A thread's share is added when the thread exits.
//!
//! What it counts is everything the process allocated through Rust: the data (index, records,
//! versions not yet collected), connection buffers, queued MULTIs. It does not count the
//! allocator's own rounding and free pages, so the resident size (`used_memory_rss` in INFO)
//! is somewhat higher. Redis's `used_memory` is the same kind of figure.
//!
//! Why not a crate: the counting allocators published (`cap`, `stats_alloc`) update a shared
//! atomic on every allocation, which two cores allocating for every write would contend on.
//!
//! Invariants: `ALLOCATED` plus every live thread's unflushed share is exactly the bytes
//! allocated and not freed through [`Counting`]; a share is never larger than `FLUSH_AT`.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// A thread adds its share to the global counter once it has moved this far.
const FLUSH_AT: i64 = 256 << 10;

static ALLOCATED: AtomicI64 = AtomicI64::new(0);

/// A thread's share starts here, far outside what a share can be, so that its first
/// allocation takes the flush path, which registers the exit flush and starts the share at 0.
const UNREGISTERED: i64 = i64::MIN / 2;

thread_local! {
    /// This thread's unflushed share (`UNREGISTERED` plus it until its first flush). No
    /// destructor, so reaching it is a plain thread-local load with no state to check (a
    /// destructor's registration state cost TPC-C about 2%).
    static SHARE: Cell<i64> = const { Cell::new(UNREGISTERED) };
    /// Adds the share to the global counter when the thread exits.
    static AT_EXIT: ExitFlush = const { ExitFlush };
}

struct ExitFlush;

impl Drop for ExitFlush {
    fn drop(&mut self) {
        // SHARE has no destructor, so it is still there while the thread's others run;
        // whatever the thread allocates or frees after this stays uncounted (it exits).
        let _ = SHARE.try_with(|s| ALLOCATED.fetch_add(s.replace(0), Ordering::Relaxed));
    }
}

#[inline(always)]
fn note(bytes: i64) {
    SHARE.with(|s| {
        let v = s.get() + bytes;
        if v.abs() >= FLUSH_AT {
            flush(s, v);
        } else {
            s.set(v);
        }
    });
}

#[cold]
fn flush(s: &Cell<i64>, mut v: i64) {
    if v < UNREGISTERED / 2 {
        // The thread's first allocation: from now on its share is added at exit. The share
        // is a plain one before the registration, in case registering allocates.
        s.set(0);
        let _ = AT_EXIT.try_with(|_| {});
        v += s.get() - UNREGISTERED;
        if v.abs() < FLUSH_AT {
            s.set(v);
            return;
        }
    }
    ALLOCATED.fetch_add(v, Ordering::Relaxed);
    s.set(0);
}

/// The global allocator `A`, counting what it hands out (see the module notes):
/// `#[global_allocator] static A: Counting<mimalloc::MiMalloc> = Counting::new(mimalloc::MiMalloc);`
pub struct Counting<A>(A);

impl<A> Counting<A> {
    pub const fn new(inner: A) -> Self {
        Counting(inner)
    }
}

// SAFETY: every call is passed to `A` unchanged; only the counting is added.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { self.0.dealloc(ptr, layout) };
        note(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

/// The bytes allocated and not yet freed through [`Counting`] (0 where it is not the global
/// allocator), to within `FLUSH_AT` per running thread.
pub fn allocated_bytes() -> u64 {
    ALLOCATED.load(Ordering::Relaxed).max(0) as u64
}

/// The server's memory limit: `max` bytes (0: none) against the gauge `used`.
pub struct MemoryLimit {
    pub max: u64,
    pub used: fn() -> u64,
    /// Commands refused for it (INFO's `oom_rejections`, the metrics).
    pub rejections: AtomicU64,
}

/// The error Redis answers a command that may grow the data while over `maxmemory`.
pub const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

impl MemoryLimit {
    pub fn none() -> MemoryLimit {
        MemoryLimit { max: 0, used: allocated_bytes, rejections: AtomicU64::new(0) }
    }

    /// Whether commands that may grow the data are refused now.
    pub fn over(&self) -> bool {
        self.max != 0 && (self.used)() > self.max
    }
}

/// Redis's memory units: `1k` is 1,000 bytes and `1kb` 1,024 (m, mb, g, gb likewise), any
/// case; a bare number is bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let mul: u64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// Bytes as Redis's INFO writes them (`used_memory_human`): `1.50M`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.2}{}", UNITS[u])
    }
}

/// The memory this process may use: the machine's (`MemTotal`), or its cgroup's limit
/// (v2 `memory.max`) where that is lower. `None` if neither can be read.
pub fn physical_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| {
        let path = c.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
        let max = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.max", path.trim_end_matches('/'))).ok()?;
        max.trim().parse::<u64>().ok()
    });
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// The resident size of this process (`/proc/self/statm`), bytes.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_redis_units() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("12345"), Some(12345));
        assert_eq!(parse_size("1k"), Some(1000));
        assert_eq!(parse_size("1KB"), Some(1024));
        assert_eq!(parse_size("64mb"), Some(64 << 20));
        assert_eq!(parse_size("2g"), Some(2_000_000_000));
        assert_eq!(parse_size("3Gb"), Some(3 << 30));
        for bad in ["", "mb", "1.5gb", "-1", "1tb", "1 gb x", "99999999999999999999gb"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn human_sizes_read_as_redis_writes_them() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(1536), "1.50K");
        assert_eq!(human(64 << 20), "64.00M");
        assert_eq!(human(3 << 30), "3.00G");
    }

    #[test]
    fn the_limit_refuses_only_over_a_set_maximum() {
        static USED: AtomicU64 = AtomicU64::new(0);
        let used = || USED.load(Ordering::Relaxed);
        let mut l = MemoryLimit { max: 0, used, rejections: AtomicU64::new(0) };
        USED.store(u64::MAX, Ordering::Relaxed);
        assert!(!l.over(), "0 is no limit");
        l.max = 1000;
        USED.store(1000, Ordering::Relaxed);
        assert!(!l.over(), "at the limit is not over it");
        USED.store(1001, Ordering::Relaxed);
        assert!(l.over());
    }

    #[test]
    fn physical_memory_is_read_here() {
        let m = physical_memory().expect("Linux has /proc/meminfo");
        assert!(m > 64 << 20, "{m}");
        assert!(resident_bytes().is_some_and(|r| r > 0));
    }
}
