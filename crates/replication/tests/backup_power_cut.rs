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
//! directly, which the model cannot see).

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
    let tmp = tempfile::tempdir().unwrap();
    let d = ditto_log::open(&tmp.path().join("p"), OpenOptions { workers: 2, progress: false, ..Default::default() })
        .unwrap();
    let t = d.db().create_table("t").unwrap();
    let (p, addr) = common::ship(&d, "majority-durable", PrimaryOptions { backups_expected: 1, ..Default::default() });

    let (bdir, attic) = (tmp.path().join("b"), tmp.path().join("attic"));
    std::fs::create_dir_all(&bdir).unwrap();
    std::fs::create_dir_all(&attic).unwrap();
    let cut = PowerCut::new(&bdir, &attic);
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
                while !stop.load(Ordering::Acquire) {
                    let key = format!("w{wi}-{n:08}").into_bytes();
                    let ticket = w.run(|x| x.put(t, &key, &n.to_le_bytes().repeat(16))).unwrap().1;
                    commits.lock().unwrap().insert(key, ticket.ts());
                    ticket.wait().unwrap();
                    n += 1;
                }
            })
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (end, mut images, mut most) = (Instant::now() + Duration::from_secs(4), 0, 0usize);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
        // Released before the cut: durable on the backup, by the policy's promise.
        let rel = p.released();
        let img = tmp.path().join(format!("image-{images}"));
        let torn = rng.gen_bool(0.5);
        let mut tail = |synced: usize, written: usize| if torn { rng.gen_range(synced..=written) } else { synced };
        cut.image(&bdir, &img, &mut tail).unwrap();
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
    eprintln!("{images} power cuts on the backup, up to {most} released commits checked in one");
    assert!(images >= 10 && most > 100, "{images} images, {most} commits: the test checked little");
    b.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    d.close();
}
