//! The heap a primary takes to find a returning backup's gap (`replica::batches_after`):
//! a batch at a time, not a segment. Until 2026-12-04 each segment was read whole to be
//! checked (64 MiB by default, per returning backup). Alone in its test binary: the
//! counting allocator sees the whole process.

use ditto_engine::{Ts, WorkerId};
use ditto_log::{LogOptions, OpenOptions};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOC: counting_alloc::Counting = counting_alloc::Counting;

/// The counter is the process's: the two tests never run at once (`--include-ignored`).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A one-stream log in `dir` of `n` commits of a key and `value_len` bytes each, waiting
/// for every `wait_every`th to be durable (each wait ends a batch), then one more.
fn log_of(dir: &std::path::Path, log: LogOptions, n: u64, value_len: usize, wait_every: u64) -> ditto_log::Durable {
    let d = ditto_log::open(dir, OpenOptions { workers: 1, log, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    let val = vec![7u8; value_len];
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    for i in 0..n {
        let (_, ticket) = w.run(|x| x.put(t, &i.to_be_bytes(), &val).map(|_| ())).unwrap();
        if i % wait_every == wait_every - 1 {
            ticket.wait().unwrap();
        }
    }
    w.run(|x| x.put(t, b"last", b"x").map(|_| ())).unwrap().1.wait().unwrap();
    d
}

#[test]
fn taking_a_gap_holds_a_batch_at_a_time_not_a_segment() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const SEGMENT: u64 = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let log = LogOptions { segment_bytes_max: SEGMENT, ..Default::default() };
    // About 26 MB: three full segments and a fourth being written.
    let d = log_of(dir.path(), log, 1600, 16 << 10, 20);
    let epoch = d.logger().epoch();
    let segments = std::fs::read_dir(dir.path().join("log")).map(|r| r.count()).unwrap_or(0);
    let (gap, peak) =
        counting_alloc::heap_peak_growth(|| ditto_log::replica::batches_after(dir.path(), epoch, Ts::ZERO));
    let gap = gap.unwrap().expect("a gap");
    assert!(gap.len() >= 80, "{} batches", gap.len());
    // Each batch holds up to 20 values of 16 KiB; the reads go through a window of 256
    // KiB, and the scan of a tail of zeros reads 256 KiB at a time.
    assert!(peak < 2 << 20, "taking the gap of {segments} files took {peak} bytes of heap at its peak");
    // Everything is there when sent, a batch at a time.
    let mut keys = 0;
    gap.for_each(|b| {
        keys += ditto_log::format::decode_batch(&b).unwrap().0.header.txn_count as usize;
        Ok(())
    })
    .unwrap();
    assert!(keys >= 1601, "{keys} transactions");
    d.close();
}

/// A measurement, not a test (ignored; `cargo test --release -p ditto-log --test
/// gap_memory -- --ignored --nocapture`): the time to take and to send the gap of a log
/// of small batches (about 1 KB, as TPC-C's) in segments of 64 MiB, and the heap's peak
/// while it is taken. Prints `GAP_TIME {json}`.
#[test]
#[ignore = "a measurement: run alone with --ignored --nocapture"]
fn time_to_take_and_send_a_gap_of_small_batches() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // (In memory where there is /dev/shm: an fsync every three commits on a disk would
    // take minutes to write the log.)
    let dir = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).unwrap();
    let log = LogOptions { durability: ditto_log::Durability::EveryBatch, ..Default::default() };
    let d = log_of(dir.path(), log, 400_000, 300, 3);
    let epoch = d.logger().epoch();
    let mut best = (f64::MAX, f64::MAX, 0usize, 0usize);
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let (gap, peak) =
            counting_alloc::heap_peak_growth(|| ditto_log::replica::batches_after(dir.path(), epoch, Ts::ZERO));
        let took = t0.elapsed().as_secs_f64();
        let gap = gap.unwrap().expect("a gap");
        let n = gap.len();
        let t1 = std::time::Instant::now();
        gap.for_each(|_| Ok(())).unwrap();
        let sent = t1.elapsed().as_secs_f64();
        best = (best.0.min(took), best.1.min(sent), n, peak.max(best.3));
    }
    let bytes: u64 =
        std::fs::read_dir(dir.path().join("log")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
    println!(
        "GAP_TIME {{\"log_mb\": {:.1}, \"batches\": {}, \"take_s\": {:.3}, \"send_s\": {:.3}, \"take_heap_peak_mb\": {:.2}}}",
        bytes as f64 / 1e6,
        best.2,
        best.0,
        best.1,
        best.3 as f64 / 1e6
    );
    d.close();
}
