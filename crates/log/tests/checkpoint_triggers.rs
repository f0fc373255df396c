//! The background checkpointer starts a checkpoint sooner than its interval when the log
//! written since the last one, or the record ids deleted since, pass their thresholds
//! (`CheckpointPolicy`); with those triggers off, it waits for the interval.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{TableId, Worker, WorkerId};
use ditto_log::storage::{LogFile, RealStorage, Storage};
use ditto_log::{open, CheckpointPolicy, Durability, LogOptions, OpenOptions, CHECKPOINT_RETRY_AFTER};

fn opts() -> OpenOptions {
    OpenOptions {
        workers: 1,
        log: LogOptions { durability: Durability::EveryBatch, ..LogOptions::default() },
        progress: false,
        ..Default::default()
    }
}

/// Waits (bounded) until `done`; false if it never was.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    done()
}

#[test]
fn a_growing_log_starts_a_checkpoint_before_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(dir.path(), opts()).unwrap();
    let t = d.db().create_table("t").unwrap();
    let policy = CheckpointPolicy {
        every: Some(Duration::from_secs(3600)),
        log_growth_percent: 100,
        log_min_bytes: 1 << 20,
        reuse_min_ids: 0,
    };
    let _ckpt = d.spawn_checkpointer(policy);
    let stats = &d.logger().stats;
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let value = vec![5u8; 4096];
    // Under the minimum: no checkpoint.
    for i in 0..64u32 {
        w.run(|x| x.put(t, &i.to_be_bytes(), &value).map(|_| ())).unwrap().1.wait().unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(stats.checkpoints.load(Ordering::Relaxed), 0, "checkpoint with 256 KiB of log");
    // Past it: one, by log growth, though the interval is an hour away.
    for i in 0..256u32 {
        w.run(|x| x.put(t, &i.to_be_bytes(), &value).map(|_| ())).unwrap().1.wait().unwrap();
    }
    assert!(
        eventually(|| stats.checkpoints_by_log_growth.load(Ordering::Relaxed) >= 1),
        "no checkpoint after 1.3 MiB of log"
    );
    assert_eq!(stats.checkpoints_by_time.load(Ordering::Relaxed), 0);
    // The next is due only once the log grows by the checkpoint's size (1 MiB of values
    // here), not at the next step.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(stats.checkpoints.load(Ordering::Relaxed), 1);
    drop(w);
    drop(d);
    let d = open(dir.path(), opts()).unwrap();
    assert_eq!(d.db().count(t).unwrap(), 256);
}

#[test]
fn deleted_record_ids_start_a_checkpoint_that_lets_them_be_reused() {
    let dir = tempfile::tempdir().unwrap();
    let d = open(dir.path(), opts()).unwrap();
    let t = d.db().create_table("t").unwrap();
    let policy = CheckpointPolicy { every: None, log_growth_percent: 0, log_min_bytes: 0, reuse_min_ids: 1000 };
    let _ckpt = d.spawn_checkpointer(policy);
    let stats = &d.logger().stats;
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let keys = |from: u32| (from..from + 2000).map(|i| i.to_be_bytes());
    w.run(|x| keys(0).try_for_each(|k| x.insert(t, &k, b"v"))).unwrap().1.wait().unwrap();
    w.run(|x| keys(0).try_for_each(|k| x.delete(t, &k).map(|_| ()))).unwrap().1.wait().unwrap();
    assert!(
        eventually(|| {
            d.db().reclaim();
            stats.checkpoints_by_id_reuse.load(Ordering::Relaxed) >= 1
        }),
        "no checkpoint with 2,000 ids waiting ({} given back)",
        d.db().record_ids_released()
    );
    // Every id back (the checkpoint may have begun with half of them), then new keys take
    // them all.
    assert!(eventually(|| {
        d.db().reclaim();
        d.db().record_ids_released() >= 2000
    }));
    let allocated = d.db().record_ids_allocated(t).unwrap();
    w.run(|x| keys(10_000).try_for_each(|k| x.insert(t, &k, b"w"))).unwrap().1.wait().unwrap();
    assert_eq!(d.db().record_ids_allocated(t).unwrap(), allocated, "new keys took fresh ids");
    assert_eq!(
        stats.checkpoints_by_log_growth.load(Ordering::Relaxed) + stats.checkpoints_by_time.load(Ordering::Relaxed),
        0
    );
}

#[test]
fn the_policy_decides_by_the_first_trigger_due() {
    use ditto_log::{Due, Trigger};
    let p = CheckpointPolicy::default();
    let quiet =
        Due { elapsed: Duration::from_secs(1), log_bytes: 0, last_checkpoint_bytes: 0, ids_released: 0, ids_used: 0 };
    assert_eq!(p.due(quiet), None);
    assert_eq!(p.due(Due { elapsed: Duration::from_secs(300), ..quiet }), Some(Trigger::Time));
    // Log: the larger of the minimum and the percentage of the last checkpoint.
    assert_eq!(p.due(Due { log_bytes: (64 << 20) - 1, ..quiet }), None);
    assert_eq!(p.due(Due { log_bytes: 64 << 20, ..quiet }), Some(Trigger::LogGrowth));
    let big = Due { last_checkpoint_bytes: 1 << 30, ..quiet };
    assert_eq!(p.due(Due { log_bytes: (1 << 30) - 1, ..big }), None);
    assert_eq!(p.due(Due { log_bytes: 1 << 30, ..big }), Some(Trigger::LogGrowth));
    // Ids: the larger of the minimum and the ids in use.
    let min = p.reuse_min_ids;
    assert_eq!(p.due(Due { ids_released: min - 1, ..quiet }), None);
    assert_eq!(p.due(Due { ids_released: min, ..quiet }), Some(Trigger::IdReuse));
    assert_eq!(p.due(Due { ids_released: 2 * min, ids_used: 2 * min + 1, ..quiet }), None);
    assert_eq!(p.due(Due { ids_released: 2 * min, ids_used: 2 * min, ..quiet }), Some(Trigger::IdReuse));
    // Zero turns a trigger off.
    let off = CheckpointPolicy { every: None, log_growth_percent: 0, log_min_bytes: 0, reuse_min_ids: 0 };
    assert!(!off.any());
    let all = Due {
        elapsed: Duration::MAX,
        log_bytes: u64::MAX,
        last_checkpoint_bytes: 0,
        ids_released: u64::MAX,
        ids_used: 0,
    };
    assert_eq!(off.due(all), None);
    assert!(p.any());
}

/// Storage whose checkpoint files cannot be created while `full` is set (a full disk for
/// checkpoints, or with `panics` a storage layer's bug: the creation panics); the log's
/// own segments still work.
struct CheckpointsFail {
    full: Arc<AtomicBool>,
    panics: bool,
}

impl Storage for CheckpointsFail {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        if self.full.load(Ordering::SeqCst) && path.components().any(|c| c.as_os_str() == "checkpoints") {
            if self.panics {
                panic!("a storage layer's bug");
            }
            return Err(io::Error::from_raw_os_error(28)); // ENOSPC
        }
        RealStorage.create_new(path)
    }
    fn create_segment(&self, path: &Path, direct: bool) -> io::Result<Box<dyn LogFile>> {
        RealStorage.create_segment(path, direct)
    }
}

/// A database on `CheckpointsFail` (full) with its background checkpointer, 64 values of
/// 4 KiB written, and the checkpoint they made due failed once, leaving no directory
/// behind. `then(d, t)` runs there; then a commit goes in, the disk is freed, a checkpoint
/// must follow, `failures` failed ones counted in all, and the database opens again with
/// all 65 keys.
fn a_checkpoint_fails_then_succeeds(panics: bool, failures: u64, then: impl FnOnce(&ditto_log::Durable, TableId)) {
    let dir = tempfile::tempdir().unwrap();
    let full = Arc::new(AtomicBool::new(true));
    let mut o = opts();
    o.log.storage = Arc::new(CheckpointsFail { full: Arc::clone(&full), panics });
    let d = open(dir.path(), o).unwrap();
    let t = d.db().create_table("t").unwrap();
    let policy = CheckpointPolicy { every: None, log_growth_percent: 100, log_min_bytes: 64 << 10, reuse_min_ids: 0 };
    let _ckpt = d.spawn_checkpointer(policy);
    let stats = &d.logger().stats;
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let value = vec![1u8; 4096];
    for i in 0..64u32 {
        w.run(|x| x.put(t, &i.to_be_bytes(), &value).map(|_| ())).unwrap().1.wait().unwrap();
    }
    assert!(eventually(|| stats.checkpoint_failures.load(Ordering::Relaxed) >= 1), "the due checkpoint never ran");
    then(&d, t);
    let left: Vec<_> = std::fs::read_dir(dir.path().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.join("MANIFEST").exists())
        .collect();
    assert!(left.is_empty(), "a failed attempt left {left:?}");
    // Commits go on while checkpoints fail.
    w.run(|x| x.put(t, b"during", b"1").map(|_| ())).unwrap().1.wait().unwrap();
    full.store(false, Ordering::SeqCst);
    assert!(
        eventually(|| stats.checkpoints_by_log_growth.load(Ordering::Relaxed) >= 1),
        "no checkpoint once the disk had room"
    );
    assert_eq!(stats.checkpoint_failures.load(Ordering::Relaxed), failures);
    drop(w);
    drop(d);
    let d = open(dir.path(), opts()).unwrap();
    assert_eq!(d.db().count(t).unwrap(), 65);
}

/// A due checkpoint that fails is not retried at every step while its trigger stays due,
/// but after `CHECKPOINT_RETRY_AFTER`; once the disk has room it succeeds, and commits went
/// on throughout.
#[test]
fn a_failed_checkpoint_is_retried_after_a_pause_not_at_once() {
    let failures = |d: &ditto_log::Durable| d.logger().stats.checkpoint_failures.load(Ordering::Relaxed);
    a_checkpoint_fails_then_succeeds(false, 1, |d, _| {
        // The trigger is still due; without the pause the checkpointer would try every 50 ms.
        std::thread::sleep(CHECKPOINT_RETRY_AFTER / 2);
        assert_eq!(failures(d), 1, "retried within the pause");
    });
}

/// A checkpoint whose writer panics fails as an error does, saying so: counted, and
/// retried after the pause, so the background checkpointer checkpoints once the fault is
/// gone; commits go on throughout. Before, the panic ended the checkpointer's thread
/// without a word, and the primary never checkpointed again.
#[test]
fn a_checkpoint_whose_writer_panics_fails_and_is_retried() {
    // (Counted twice: the background attempt, and the one asked for here.)
    a_checkpoint_fails_then_succeeds(true, 2, |d, _| {
        let r = d.checkpoint();
        assert!(
            matches!(&r, Err(e) if e.to_string() == "the checkpoint writer panicked (a storage layer's bug)"),
            "{r:?}"
        );
    });
}

/// After a restart, log growth counts against the checkpoint the database opened on (the
/// one recovery wrote), not against nothing: it used to take the minimum alone, so a large
/// database checkpointed again after `log_min_bytes` of log, whatever its size.
#[test]
fn after_a_restart_log_growth_counts_against_the_checkpoint_opened_on() {
    let dir = tempfile::tempdir().unwrap();
    // Incompressible values: the sizes compared hold whether or not the log is compressed
    // (`LogOptions::compress`).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    // Writes keys `keys`, 4 KiB each, one commit per key.
    let mut write = move |w: &mut Worker, t: TableId, keys: std::ops::Range<u32>| {
        for i in keys {
            let v: Vec<u8> = (0..4096)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            w.run(|x| x.put(t, &i.to_be_bytes(), &v).map(|_| ())).unwrap().1.wait().unwrap();
        }
    };
    let t = {
        let d = open(dir.path(), opts()).unwrap();
        let t = d.db().create_table("t").unwrap();
        let mut w = d.db().worker(WorkerId(0)).unwrap();
        write(&mut w, t, 0..512);
        t
    };
    let d = open(dir.path(), opts()).unwrap();
    let opened_on = d.recovery().open_checkpoint_bytes();
    assert!(opened_on >= 2 << 20, "recovery closes with a checkpoint of the 2 MiB written: {opened_on} bytes");
    let policy = CheckpointPolicy { every: None, log_growth_percent: 100, log_min_bytes: 256 << 10, reuse_min_ids: 0 };
    let _ckpt = d.spawn_checkpointer(policy);
    let stats = &d.logger().stats;
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    // 1 MiB of log: four times the minimum, half the checkpoint.
    write(&mut w, t, 0..256);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(stats.checkpoints.load(Ordering::Relaxed), 0, "checkpoint after half the opened-on checkpoint's size");
    // Past the checkpoint's size: one, by log growth.
    write(&mut w, t, 256..768);
    assert!(
        eventually(|| stats.checkpoints_by_log_growth.load(Ordering::Relaxed) >= 1),
        "no checkpoint after 3 MiB of log on a 2 MiB checkpoint"
    );
}
