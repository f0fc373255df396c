//! Memory in use, counted by the allocator
//! =======================================
//! [`Counting`] wraps a process's global allocator (the `ditto` binary installs it around
//! mimalloc) and keeps, per thread, the bytes allocated minus the bytes freed
//! (`Layout::size`, what was asked for), adding them to one global counter whenever a
//! thread's share has moved by `FLUSH_AT`, and when the thread exits. So an allocation
//! costs a thread-local add and compare, with no shared cache line written, and
//! [`allocated_bytes`] is exact to within `FLUSH_AT` per running thread.
//!
//! It counts everything the process allocated through Rust: the data (index, records,
//! versions not yet collected), log buffers, connection buffers. Not the allocator's own
//! rounding and free pages, so the resident size is somewhat higher (Redis's `used_memory`
//! is the same kind of figure). The server checks `maxmemory` against it
//! (crates/server/src/memory.rs); the engine's and log's memory tests count with it.
//!
//! Why not a crate: the counting allocators published (`cap`, `stats_alloc`) update a shared
//! atomic on every allocation, which every core allocating for every write would contend on.
//! The cost measured: about 2% of TPC-C's throughput, nothing visible in redis-benchmark
//! (docs/server.md, "maxmemory").
//!
//! Invariants: `ALLOCATED` plus every live thread's unflushed share is exactly the bytes
//! allocated and not freed through [`Counting`] (less what exited threads did after their
//! exit flush); a registered share is always under `FLUSH_AT` in size.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

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
