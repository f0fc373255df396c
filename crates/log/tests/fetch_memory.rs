//! A measurement, not a test (ignored; run it alone, it resets the process's peak RSS):
//! the peak memory of a failover's fetch of a small tail of one stream from a backup's
//! replica log of about 200 MB in files of 64 MiB (`replica_stream_batches`).
//!
//! `cargo test --release -p ditto-log --test fetch_memory -- --ignored --nocapture`
//!
//! It prints one line, `FETCH_MEMORY {json}`. 2026-11-29, 2-core VM: the peak grew 158.8 MB
//! above the RSS before the fetch when the log was read whole, 79.6 MB read a file at a
//! time (docs/cluster.md, "Where a fetch can start").
//!
//! And the heap's peak (a counting allocator: a peak of RSS does not show what is built in
//! pages the allocator kept from before) of a large answer, the whole of one stream,
//! collected whole and handed on as read: `FETCH_MEMORY_HEAP {json}`. 2026-11-29,
//! afternoon, 2-core VM: 179.5 MB whole, 82.0 MB handed on, for a 98.4 MB answer from a
//! 196.8 MB log (81.7 MB for the small tail: one 64 MiB file read whole is the floor).
//! 2026-12-01, the log read an entry at a time (`read_files_each`): 101.9 MB whole (the
//! answer alone), 1.4 MB handed on, 2.0 MB for the small tail; the RSS peak's growth for
//! the small tail 0.4 MB.
use bytes::Bytes;
use ditto_engine::{Ts, WorkerId};
use ditto_log::format::decode_batch_checksums;
use ditto_log::replica::{replica_stream_batches, ReplicaLog};
use ditto_log::storage::{RealStorage, Storage};
use ditto_log::OpenOptions;
use std::sync::Arc;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOC: counting_alloc::Counting = counting_alloc::Counting;

/// The heap's peak above what was in use, while `f` runs (MB).
fn heap_peak_growth_mb<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let (out, bytes) = counting_alloc::heap_peak_growth(f);
    (out, bytes as f64 / 1e6)
}

fn hwm_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find(|l| l.starts_with("VmHWM")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}
fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find(|l| l.starts_with("VmRSS")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A replica log of about 200 MB (2 streams, 16 KiB values) in files of 64 MiB, and the
/// bounds of stream 0's batches.
fn large_replica_log() -> (tempfile::TempDir, usize, Vec<Ts>) {
    let primary = tempfile::tempdir().unwrap();
    let d = ditto_log::open(primary.path(), OpenOptions { workers: 2, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    let val = vec![7u8; 16 << 10];
    for worker in 0..2u32 {
        let mut w = d.db().worker(WorkerId(worker)).unwrap();
        for i in 0..6000u64 {
            let k = (worker as u64) << 32 | i;
            let (_, ticket) = w.run(|x| x.put(t, &k.to_be_bytes(), &val).map(|_| ())).unwrap();
            if i % 20 == 19 {
                ticket.wait().unwrap();
            }
        }
        w.run(|x| x.put(t, b"last", b"x").map(|_| ())).unwrap().1.wait().unwrap();
    }
    let epoch = d.logger().epoch();
    d.close();
    drop(d);
    let batches: Vec<Bytes> =
        ditto_log::replica::batches_after(primary.path(), epoch, Ts::ZERO).unwrap().unwrap().collect().unwrap();
    let total: usize = batches.iter().map(|b| b.len()).sum();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(primary.path().join("CATALOG"), dir.path().join("CATALOG")).unwrap();
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    {
        let mut log = ReplicaLog::create(dir.path(), Arc::clone(&storage), 2, 1, 64 << 20).unwrap();
        for (i, x) in batches.iter().enumerate() {
            log.append(x, false, decode_batch_checksums(x).unwrap().0.header.bound_ts);
            if i % 50 == 49 {
                log.sync().unwrap();
            }
        }
        log.sync().unwrap();
    }
    let s0: Vec<Ts> = batches
        .iter()
        .map(|b| decode_batch_checksums(b).unwrap().0.header)
        .filter(|h| h.stream.0 == 0)
        .map(|h| h.bound_ts)
        .collect();
    (dir, total, s0)
}

#[test]
#[ignore = "a measurement: run alone with --ignored --nocapture"]
fn peak_memory_of_a_small_fetch_from_a_large_replica_log() {
    let (dir, total, s0) = large_replica_log();
    let after = s0[s0.len() - 5];
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let (rss0, hwm0) = (rss_kb(), hwm_kb());
    let got = replica_stream_batches(dir.path(), 0, after).unwrap();
    let hwm1 = hwm_kb();
    let got_bytes: usize = got.iter().map(|b| b.len()).sum();
    assert!(!got.is_empty(), "the tail asked for");
    let files = std::fs::read_dir(ditto_log::replica::replica_dir(dir.path())).unwrap().count();
    println!(
        "FETCH_MEMORY {{\"log_mb\": {:.1}, \"files\": {files}, \"answer_batches\": {}, \"answer_mb\": {:.3}, \"rss_before_mb\": {:.1}, \"peak_before_mb\": {:.1}, \"peak_after_mb\": {:.1}, \"peak_growth_mb\": {:.1}}}",
        total as f64 / 1e6,
        got.len(),
        got_bytes as f64 / 1e6,
        rss0 as f64 / 1e3,
        hwm0 as f64 / 1e3,
        hwm1 as f64 / 1e3,
        hwm1.saturating_sub(rss0) as f64 / 1e3
    );
}

/// The same log's whole stream 0 (about half the log) fetched two ways in one run: handed
/// on batch by batch as read (`replica_stream_batches_each`, as a failover's fetch now
/// sends it, a piece at a time; the sink keeps nothing), and collected whole
/// (`replica_stream_batches`, as the fetch held it before 2026-11-29, afternoon); the
/// heap's peak above what was in use before each (a counting allocator), and the small
/// tail's for comparison. One line, `FETCH_MEMORY_HEAP {json}`.
#[test]
#[ignore = "a measurement: run alone with --ignored --nocapture"]
fn heap_peak_of_fetches_streamed_and_whole() {
    let (dir, total, s0) = large_replica_log();
    let (whole_bytes, whole_mb) = heap_peak_growth_mb(|| {
        replica_stream_batches(dir.path(), 0, Ts::ZERO).unwrap().iter().map(|b| b.len()).sum::<usize>()
    });
    let (streamed_bytes, streamed_mb) = heap_peak_growth_mb(|| {
        let mut bytes = 0;
        ditto_log::replica::replica_stream_batches_each(dir.path(), 0, Ts::ZERO, &mut |b| {
            bytes += b.len();
            true
        })
        .unwrap();
        bytes
    });
    assert_eq!(streamed_bytes, whole_bytes, "the same answer");
    let after = s0[s0.len() - 5];
    let (tail, tail_mb) = heap_peak_growth_mb(|| replica_stream_batches(dir.path(), 0, after).unwrap().len());
    assert!(tail > 0);
    println!(
        "FETCH_MEMORY_HEAP {{\"log_mb\": {:.1}, \"answer_mb\": {:.1}, \"heap_peak_growth_whole_mb\": {whole_mb:.1}, \"heap_peak_growth_streamed_mb\": {streamed_mb:.1}, \"heap_peak_growth_small_tail_mb\": {tail_mb:.1}}}",
        total as f64 / 1e6,
        whole_bytes as f64 / 1e6
    );
}
