//! The heap in use and its peak, counted at every allocation: what a piece of work asks
//! of the allocator, whatever pages the allocator keeps resident from before (a peak of
//! RSS does not show what is built in pages freed earlier). A test binary that includes
//! this (`#[path]`) makes `Counting` its global allocator; the counts are the process's.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

pub struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        let p = unsafe { std::alloc::System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Relaxed) + l.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        unsafe { std::alloc::System.dealloc(p, l) }
    }
}

/// `f`'s result, and the heap's peak above what was in use while it ran (bytes).
pub fn heap_peak_growth<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Relaxed);
    PEAK.store(before, Relaxed);
    let out = f();
    (out, PEAK.load(Relaxed).saturating_sub(before))
}
