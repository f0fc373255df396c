//! A large batch does not leave its buffers behind: the flusher lets go of a batch builder,
//! a framed batch or direct I/O staging grown past 1 MiB once the batch is written. Before,
//! each kept its largest size for good: four buffers of up to twice a 16 MiB value's size,
//! per stream. Memory is counted by the engine's counting allocator (to within 256 KiB per
//! thread).

use ditto_engine::alloc::{allocated_bytes, Counting};
use ditto_engine::WorkerId;
use ditto_log::{open, Durability, LogOptions, OpenOptions};

#[global_allocator]
static A: Counting<std::alloc::System> = Counting::new(std::alloc::System);

const MIB: i64 = 1 << 20;

#[test]
fn a_large_batch_leaves_no_large_buffers_behind() {
    let dir = tempfile::tempdir().unwrap();
    let o = OpenOptions {
        workers: 1,
        log: LogOptions { durability: Durability::EveryBatch, ..LogOptions::default() },
        progress: false,
        ..Default::default()
    };
    let d = open(dir.path(), o).unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let value = vec![3u8; 15 << 20];
    w.run(|x| x.put(t, b"warm", b"up").map(|_| ())).unwrap().1.wait().unwrap();
    let before = allocated_bytes() as i64;
    for i in 0..4u8 {
        w.run(|x| x.put(t, &[i], &value).map(|_| ())).unwrap().1.wait().unwrap();
    }
    // The flusher lets go right after the write that made the batch durable; give it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let kept = loop {
        let kept = (allocated_bytes() as i64 - before) / MIB - 4 * 15;
        if kept <= 4 || std::time::Instant::now() > deadline {
            break kept;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(kept <= 4, "{kept} MiB allocated besides the 60 MiB of values after four 15 MiB writes");
    drop(w);
    d.close();
}
