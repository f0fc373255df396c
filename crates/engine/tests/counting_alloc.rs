//! The counting allocator (crates/engine/src/alloc.rs) as the global allocator of this test
//! binary: what a thread allocates shows in `allocated_bytes` once past the flush step,
//! what it frees comes off again, and a thread's unflushed share is added when it exits.
//! One test, so no other test's allocations run beside it.

use std::sync::mpsc;

use ditto_engine::alloc::{allocated_bytes, Counting};

#[global_allocator]
static ALLOC: Counting<std::alloc::System> = Counting::new(std::alloc::System);

/// The flush step in alloc.rs; each running thread may hold up to this much unflushed.
const STEP: i64 = 256 << 10;

fn now() -> i64 {
    allocated_bytes() as i64
}

#[test]
fn allocations_frees_and_exiting_threads_are_counted() {
    // This thread and the harness's main thread may each hold a share.
    let slack = 2 * STEP;
    let base = now();

    // 64 MiB in 1 MiB blocks on this thread, then freed.
    let blocks: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 1 << 20]).collect();
    let grown = now() - base;
    assert!((grown - (64 << 20)).abs() <= slack, "64 MiB allocated, counted {grown}");
    drop(blocks);
    let left = now() - base;
    assert!(left.abs() <= slack, "freed, still counted {left}");

    // Growing a vector by realloc counts its new size, not every size it passed through.
    let mut v: Vec<u8> = Vec::new();
    for i in 0..(16 << 20) {
        v.push(i as u8);
    }
    let grown = now() - base;
    assert!((grown - v.capacity() as i64).abs() <= slack, "a {} byte vector, counted {grown}", v.capacity());
    drop(v);

    // Threads that each keep less than a step alive and exit: their shares are added at exit.
    let (tx, rx) = mpsc::channel();
    let before = now();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let tx = tx.clone();
            std::thread::spawn(move || tx.send(vec![7u8; 100_000]).unwrap())
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(tx);
    let kept: Vec<Vec<u8>> = rx.iter().collect();
    assert_eq!(kept.len(), 16);
    let grown = now() - before;
    assert!((grown - 1_600_000).abs() <= slack, "16 exited threads' 1.6 MB, counted {grown}");
    // Freed here, on another thread than allocated them.
    drop(kept);
    let left = now() - before;
    assert!(left.abs() <= slack, "freed, still counted {left}");
}
