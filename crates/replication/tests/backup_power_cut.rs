//! A backup's power cut (`ditto_log::power_cut`): under `majority-durable` with one backup,
//! a commit is released to its client only once the backup has made it durable, so every
//! commit released before a power cut on the backup must be in what the cut leaves of the
//! backup's directory: its replica log's bytes up to their last fsync, its checkpoints
//! (written every 50 ms here, each deleting the replica log files it covers, in 16 KiB
//! files). A primary and a backup in this process, over real TCP on loopback; the
//! backup's directory on real files whose fsyncs are recorded. An acknowledgement of
//! durability sent before the replica log's fsync, or a checkpoint's deletion of replica
//! files before its own files were durable, would fail it.
//! A missing directory sync would fail it too: the join's and the followed epoch's go
//! through the backup's storage since this test (they called `storage::sync_dir`
//! directly, which the model cannot see). A second run (small commits, 64 per wait, the
//! backup's fsyncs 25 ms at least) makes each cut as the backup is about to sync a burst of at least
//! 1 KiB of its replica log, losing one 512-byte sector of what it wrote since its last
//! sync and each other with probability 1/8 (a write's pages reach the disk in any order
//! before its fsync): every image opens (replica log format 2) and holds every release.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ditto_engine::{Ts, WorkerId};
use ditto_log::power_cut::PowerCut;
use ditto_log::storage::{RealStorage, Storage};
use ditto_log::OpenOptions;
use ditto_replication::{backup, BackupOptions, PrimaryOptions};
use rand::{Rng, SeedableRng};

mod common;

#[test]
fn every_commit_released_under_majority_durable_survives_a_power_cut_on_the_backup() {
    power_cuts_on_the_backup(false);
}

#[test]
fn every_commit_released_survives_a_power_cut_that_keeps_a_bursts_sectors_out_of_order() {
    power_cuts_on_the_backup(true);
}

/// The test, with its cuts made at random moments keeping a random part of each file's
/// unsynced tail, or (`out_of_order`) as a burst is about to be synced, losing sectors of
/// it; each writer then commits 16 before it waits for the last, so bursts are larger.
fn power_cuts_on_the_backup(out_of_order: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let d = ditto_log::open(&tmp.path().join("p"), OpenOptions { workers: 2, progress: false, ..Default::default() })
        .unwrap();
    let t = d.db().create_table("t").unwrap();
    let (p, addr) = common::ship(&d, "majority-durable", PrimaryOptions { backups_expected: 1, ..Default::default() });

    let (bdir, attic) = (tmp.path().join("b"), tmp.path().join("attic"));
    std::fs::create_dir_all(&bdir).unwrap();
    std::fs::create_dir_all(&attic).unwrap();
    let cut = PowerCut::new(&bdir, &attic);
    if out_of_order {
        // (A slower disk: the primary's batches, one per stream per 10 ms interval, that
        // arrive during an fsync go in the next burst, several to it.)
        cut.slow_syncs(Duration::from_millis(25));
    }
    let storage: Arc<dyn Storage> = Arc::new(cut.clone());
    let opts = BackupOptions {
        storage: Some(storage),
        checkpoint_every: Duration::from_millis(50),
        replica_file_bytes: 16 << 10,
        ..BackupOptions::new(&addr, &bdir, 1, "b")
    };
    let b = backup::start(opts).unwrap();

    // Two writers; each commit's key and timestamp recorded once it has one.
    let commits: Arc<Mutex<HashMap<Vec<u8>, Ts>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u32)
        .map(|wi| {
            let (db, commits, stop) = (d.db().clone(), Arc::clone(&commits), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut w = db.worker(WorkerId(wi)).unwrap();
                let mut n = 0u64;
                // (Out of order: small entries, several to a burst.)
                let (per_wait, value_repeat) = if out_of_order { (64, 1) } else { (1, 16) };
                while !stop.load(Ordering::Acquire) {
                    let key = format!("w{wi}-{n:08}").into_bytes();
                    let ticket = w.run(|x| x.put(t, &key, &n.to_le_bytes().repeat(value_repeat))).unwrap().1;
                    commits.lock().unwrap().insert(key, ticket.ts());
                    n += 1;
                    if n.is_multiple_of(per_wait) {
                        ticket.wait().unwrap();
                    }
                }
            })
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (end, mut images, mut most, mut scrambled) = (Instant::now() + Duration::from_secs(4), 0, 0usize, 0);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
        // Released before the cut: durable on the backup, by the policy's promise.
        let rel = p.released();
        let img = tmp.path().join(format!("image-{images}"));
        let torn = rng.gen_bool(0.5);
        if out_of_order {
            let mut sectors = rand::rngs::StdRng::seed_from_u64(rng.gen());
            // (One sector of what was written since the last sync lost, and each other
            // with probability 1/8: entries span sectors, and one after a loss is kept
            // whole only if all of its are.)
            let tail = move |synced: usize, bytes: &mut Vec<u8>| {
                let n = bytes[synced..].len().div_ceil(512);
                let lost = sectors.gen_range(0..n.max(1));
                for (i, sector) in bytes[synced..].chunks_mut(512).enumerate() {
                    if i == lost || sectors.gen_bool(0.125) {
                        sector.fill(0);
                    }
                }
            };
            let made = cut.image_at_next_sync(&bdir, &img, "rlog-", 1024, Box::new(tail), Duration::from_secs(5));
            assert!(made.unwrap(), "no replica log file was synced with 1 KiB unsynced for 5 s");
            scrambled += usize::from(torn_out_of_order(&img));
        } else {
            let mut tail = |synced: usize, written: usize| if torn { rng.gen_range(synced..=written) } else { synced };
            cut.image(&bdir, &img, &mut tail).unwrap();
        }
        let real: Arc<dyn Storage> = Arc::new(RealStorage);
        let opened = ditto_log::replica::open_replica(&img, 1, &real)
            .unwrap_or_else(|e| panic!("the backup's power-cut image does not open: {e}"));
        assert!(
            opened.cut >= rel,
            "the image holds up to ts {:?}, below the release {rel:?} before the cut",
            opened.cut
        );
        let tb = opened.db.table_id("t").expect("the table");
        let r = opened.db.read();
        let due: Vec<(Vec<u8>, Ts)> =
            commits.lock().unwrap().iter().filter(|(_, &ts)| ts <= rel).map(|(k, &ts)| (k.clone(), ts)).collect();
        for (k, ts) in &due {
            assert!(
                r.get(tb, k).unwrap().is_some(),
                "{} (ts {ts:?}) released before the cut is not in the image",
                String::from_utf8_lossy(k)
            );
        }
        most = most.max(due.len());
        drop(r);
        drop(opened);
        std::fs::remove_dir_all(&img).unwrap();
        images += 1;
    }
    stop.store(true, Ordering::Release);
    for w in writers {
        w.join().unwrap();
    }
    eprintln!(
        "{images} power cuts on the backup ({scrambled} with a replica log file torn out of order), up to {most} released commits checked in one"
    );
    assert!(images >= 10 && most > 100, "{images} images, {most} commits: the test checked little");
    assert!(
        !out_of_order || scrambled * 3 >= images,
        "{scrambled} of {images} images held a replica log file torn out of order"
    );
    b.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    d.close();
}

/// Whether a replica log file of the image in `img` holds an entry that does not check
/// with a whole entry after it: a burst torn out of order, which replica log format 1
/// read as damage.
fn torn_out_of_order(img: &std::path::Path) -> bool {
    use ditto_log::replica::{ENTRY_HEADER_LEN, REPLICA_HEADER_LEN};
    let entry_at = |raw: &[u8], p: usize| -> Option<usize> {
        let h = raw.get(p..p + ENTRY_HEADER_LEN)?;
        if u32::from_le_bytes(h[8..12].try_into().unwrap()) != crc32c::crc32c(&h[..8]) {
            return None;
        }
        let len = u32::from_le_bytes(h[..4].try_into().unwrap()) as usize;
        let body = bytes::Bytes::copy_from_slice(raw.get(p + ENTRY_HEADER_LEN..p + ENTRY_HEADER_LEN + len)?);
        ditto_log::format::decode_batch_checksums(&body).ok().map(|_| ENTRY_HEADER_LEN + len)
    };
    let Ok(dir) = std::fs::read_dir(ditto_log::replica::replica_dir(img)) else { return false };
    dir.filter_map(|e| e.ok()).any(|e| {
        let raw = std::fs::read(e.path()).unwrap();
        let mut p = REPLICA_HEADER_LEN;
        while p < raw.len() {
            match entry_at(&raw, p) {
                Some(used) => p += used,
                None => return (p + 1..raw.len()).any(|q| entry_at(&raw, q).is_some()),
            }
        }
        false
    })
}
