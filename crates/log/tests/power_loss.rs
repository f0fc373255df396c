//! Power loss, in-process: what a machine that loses power keeps is only what was made
//! durable (a file's bytes up to its last fsync, a directory entry once its directory was
//! synced), not what a process crash keeps (every write in the page cache, which is all
//! the SIGKILL tests in crates/ditto/tests/crash.rs can take away): `ditto_log::power_cut`
//! builds, at any moment, the directory a power cut would leave. A bank workload runs
//! under every-batch and interval durability with frequent checkpoints and small
//! segments; at random moments the image is recovered and must hold every commit
//! acknowledged before the cut, as a prefix of the commit order, with balances that match
//! the transfers recovered. A commit acknowledged before its fsync, a segment or
//! checkpoint renamed without its directory synced, or a checkpoint's segments removed
//! before its name is durable would fail it. In one image of two, a random part of what
//! was written after a file's last fsync is kept too (a torn tail). With batches shipped
//! as they are framed (a replicating primary's log, which writes several batches in one
//! write before one fsync), the kept part loses sectors at random as well: a write's
//! pages reach the disk in any order before its fsync.

use std::ops::Bound::Unbounded;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{Direction, WorkerId};
use ditto_log::power_cut::PowerCut;
use ditto_log::{open, CheckpointPolicy, Durability, LogOptions, OpenOptions};
use rand::{Rng, SeedableRng};

const ACCOUNTS: u64 = 32;
const START: i64 = 1_000_000;

fn event_key(w: u32, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&w.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// Transfers acknowledged so far: per worker, one past the newest acknowledged sequence
/// number (each worker's are acknowledged in order).
type Acked = Vec<AtomicU64>;

/// Recovers `img` and checks it holds every transfer of `acked` (taken before the cut),
/// as a prefix of each worker's, with balances matching the transfers it holds; the
/// transfers recovered.
fn check_image(img: &Path, acked: &[u64], accounts_made: bool) -> u64 {
    let d = open(img, OpenOptions { workers: 2, progress: false, ..Default::default() })
        .unwrap_or_else(|e| panic!("the power cut's image does not open: {e}"));
    let db = d.db();
    let Some(accounts) = db.table_id("accounts") else {
        assert!(!accounts_made, "the accounts were acknowledged but no table recovered");
        return 0;
    };
    let events = db.table_id("events").expect("both tables are made together");
    let r = db.read();
    let balances = r.scan(accounts, Unbounded, Unbounded, Direction::Forward, 0).unwrap();
    assert!(!accounts_made || balances.len() as u64 == ACCOUNTS, "{} accounts recovered", balances.len());
    let mut expected: Vec<i64> = vec![START; ACCOUNTS as usize];
    let mut next = [0u64; 2];
    let rows = r.scan(events, Unbounded, Unbounded, Direction::Forward, 0).unwrap();
    for (k, v) in &rows {
        let w = u32::from_be_bytes(k[..4].try_into().unwrap()) as usize;
        let seq = u64::from_be_bytes(k[4..12].try_into().unwrap());
        assert_eq!(seq, next[w], "worker {w}: event {seq} recovered, {} missing", next[w]);
        next[w] += 1;
        let f = |i: usize| u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().unwrap());
        expected[f(0) as usize] -= f(2) as i64;
        expected[f(1) as usize] += f(2) as i64;
    }
    for (w, &n) in acked.iter().enumerate() {
        assert!(next[w] >= n, "worker {w}: {n} transfers acknowledged before the cut, {} recovered", next[w]);
    }
    for (k, v) in &balances {
        let a = u64::from_be_bytes(k[..8].try_into().unwrap()) as usize;
        assert_eq!(i64::from_le_bytes(v[..].try_into().unwrap()), expected[a], "account {a}");
    }
    drop(r);
    d.close();
    rows.len() as u64
}

/// What the power cuts of `power_cuts` keep past each file's last fsync.
#[derive(Clone, Copy, PartialEq)]
enum Tails {
    /// Nothing in one image of two; a random part in the other.
    Prefixes,
    /// A random part, of whose 512-byte sectors each is lost (reads as zeros) with
    /// probability 1/2, the cut made as a file is about to be synced with at least 2 KiB
    /// written past its last fsync; the log ships its batches as they are framed (through
    /// a tap that drops them), so that its disk threads write several in one write, and
    /// each worker commits 32 transfers before it waits for the last.
    OutOfOrder,
}

/// Whether a segment of the image in `img` ends in damage with a whole batch of its own
/// after it: a write torn out of order, which the version-5 rule read as damage.
fn torn_out_of_order(img: &Path) -> bool {
    use ditto_log::format::{decode_batch_checksums, read_segment, SegmentEnd};
    let Ok(dir) = std::fs::read_dir(img.join("log")) else { return false };
    dir.filter_map(|e| e.ok()).filter(|e| e.path().extension().is_some_and(|x| x == "seg")).any(|e| {
        let bytes = bytes::Bytes::from(std::fs::read(e.path()).unwrap());
        let Ok(scan) = read_segment(&bytes) else { return false };
        let SegmentEnd::Torn { offset, .. } = scan.end else { return false };
        (offset as usize + 1..bytes.len()).any(|p| {
            bytes[p..].starts_with(b"DBAT")
                && decode_batch_checksums(&bytes.slice(p..))
                    .is_ok_and(|(b, _)| b.header.stream == scan.header.stream && b.header.epoch == scan.header.epoch)
        })
    })
}

/// A shipping tap that ships nothing.
struct NoShip;

impl ditto_log::ShipTap for NoShip {
    fn batch(&self, _: &ditto_log::format::BatchHeader, _: &[u8], _: bool) {}
    fn table_created(&self, _: ditto_engine::TableId, _: &str) {}
}

/// How many images torn out of order the out-of-order test checks at least.
const SCRAMBLED_MIN: usize = 6;

/// Runs the bank for `seconds` under `durability`, cutting the power at random moments;
/// how many images were checked, the most transfers one recovered, and how many images
/// held a segment torn out of order (`torn_out_of_order`).
fn power_cuts(durability: Durability, seed: u64, seconds: u64, tails: Tails) -> (usize, u64, usize) {
    let tmp = tempfile::tempdir().unwrap();
    let (root, attic) = (tmp.path().join("data"), tmp.path().join("attic"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&attic).unwrap();
    let storage = PowerCut::new(&root, &attic);
    let log = LogOptions {
        durability,
        segment_bytes_max: 64 << 10,
        storage: Arc::new(storage.clone()),
        ..LogOptions::default()
    };
    let d = open(&root, OpenOptions { workers: 2, log, progress: false, ..Default::default() }).unwrap();
    if tails == Tails::OutOfOrder {
        d.logger().set_ship_tap(Arc::new(NoShip)).unwrap();
        d.logger().ship_at_commit_pace();
    }
    d.spawn_checkpointer(CheckpointPolicy {
        every: Some(Duration::from_millis(40)),
        log_growth_percent: 0,
        log_min_bytes: 0,
        reuse_min_ids: 0,
    });
    let db = d.db().clone();
    let accounts = db.create_table("accounts").unwrap();
    let events = db.create_table("events").unwrap();
    db.worker(WorkerId(0))
        .unwrap()
        .run(|x| {
            for a in 0..ACCOUNTS {
                x.insert(accounts, &a.to_be_bytes(), &START.to_le_bytes())?;
            }
            Ok(())
        })
        .unwrap()
        .1
        .wait()
        .unwrap();
    let acked: Arc<Acked> = Arc::new((0..2).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2u32)
        .map(|wi| {
            let (db, acked, stop) = (Arc::clone(&db), Arc::clone(&acked), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut w = db.worker(WorkerId(wi)).unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 10 + wi as u64);
                let mut seq = 0u64;
                let per_wait = if tails == Tails::OutOfOrder { 32 } else { 1 };
                while !stop.load(Ordering::Acquire) {
                    let (from, to, amount) =
                        (rng.gen_range(0..ACCOUNTS), rng.gen_range(0..ACCOUNTS), rng.gen_range(1..100i64));
                    let ticket = w
                        .run(|x| {
                            let get = |x: &mut ditto_engine::Transaction<'_>, a: u64| -> ditto_engine::Result<i64> {
                                Ok(i64::from_le_bytes(
                                    x.get(accounts, &a.to_be_bytes())?.unwrap()[..].try_into().unwrap(),
                                ))
                            };
                            let f = get(x, from)?;
                            x.update(accounts, &from.to_be_bytes(), &(f - amount).to_le_bytes())?;
                            let t = get(x, to)?;
                            x.update(accounts, &to.to_be_bytes(), &(t + amount).to_le_bytes())?;
                            let mut ev = [0u8; 24];
                            ev[..8].copy_from_slice(&from.to_le_bytes());
                            ev[8..16].copy_from_slice(&to.to_le_bytes());
                            ev[16..].copy_from_slice(&amount.to_le_bytes());
                            x.insert(events, &event_key(wi, seq), &ev)
                        })
                        .unwrap()
                        .1;
                    seq += 1;
                    if seq.is_multiple_of(per_wait) {
                        // (Each worker's commits are durable in order: the last's wait
                        // acknowledges them all.)
                        ticket.wait().unwrap();
                        acked[wi as usize].store(seq, Ordering::Release);
                    }
                }
            })
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (end, mut images, mut most, mut scrambled) = (Instant::now() + Duration::from_secs(seconds), 0, 0, 0);
    // How often a cut keeps a segment torn out of order is chance (about two images in
    // five); out of order, the cuts go on past `seconds` (up to three times it) until
    // `SCRAMBLED_MIN` such images were checked, so the count asserted does not hang on luck.
    let more = |scrambled: usize| tails == Tails::OutOfOrder && scrambled < SCRAMBLED_MIN;
    while Instant::now() < end || (more(scrambled) && Instant::now() < end + Duration::from_secs(2 * seconds)) {
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..200)));
        // What was acknowledged before the cut: durable, by the log's promise.
        let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Acquire)).collect();
        let img = tmp.path().join(format!("image-{images}"));
        let torn = rng.gen_bool(0.5);
        match tails {
            Tails::Prefixes => {
                let mut tail =
                    |synced: usize, written: usize| if torn { rng.gen_range(synced..=written) } else { synced };
                storage.image(&root, &img, &mut tail).unwrap();
            }
            Tails::OutOfOrder => {
                let mut cut = rand::rngs::StdRng::seed_from_u64(rng.gen());
                let tail = move |synced: usize, bytes: &mut Vec<u8>| {
                    let keep = cut.gen_range(synced..=bytes.len());
                    bytes.truncate(keep);
                    for sector in bytes[synced..].chunks_mut(512) {
                        if cut.gen_bool(0.5) {
                            sector.fill(0);
                        }
                    }
                };
                // What was acknowledged before the cut is read before it is asked for.
                let made =
                    storage.image_at_next_sync(&root, &img, "stream-", 2048, Box::new(tail), Duration::from_secs(5));
                assert!(made.unwrap(), "no segment was synced with 2 KiB unsynced for 5 s");
                scrambled += usize::from(torn_out_of_order(&img));
            }
        }
        most = most.max(check_image(&img, &before, true));
        std::fs::remove_dir_all(&img).unwrap();
        images += 1;
    }
    stop.store(true, Ordering::Release);
    for w in workers {
        w.join().unwrap();
    }
    d.close();
    (images, most, scrambled)
}

#[test]
fn every_acknowledged_commit_survives_a_power_cut_under_every_batch() {
    let (images, most, _) = power_cuts(Durability::EveryBatch, 1, 4, Tails::Prefixes);
    eprintln!("{images} power cuts, up to {most} transfers recovered");
    assert!(images >= 10 && most > 100, "{images} images, {most} transfers: the test checked little");
}

#[test]
fn every_acknowledged_commit_survives_a_power_cut_under_an_interval() {
    let (images, most, _) = power_cuts(Durability::Interval(Duration::from_millis(5)), 2, 4, Tails::Prefixes);
    eprintln!("{images} power cuts, up to {most} transfers recovered");
    assert!(images >= 10 && most > 100, "{images} images, {most} transfers: the test checked little");
}

/// A replicating primary's log writes the batches framed over an interval in one write
/// before one fsync; a power cut then may keep some of the write's sectors and not
/// others. Every image opens (the batches after a lost sector claim no more synced than
/// before it, so the loss reads as a torn write: before log format 6 such an image was
/// refused as damaged, and the node needed a person) and holds every acknowledged commit.
#[test]
fn every_acknowledged_commit_survives_a_power_cut_that_keeps_a_writes_sectors_out_of_order() {
    let (images, most, scrambled) = power_cuts(Durability::Interval(Duration::from_millis(5)), 3, 4, Tails::OutOfOrder);
    eprintln!("{images} power cuts, {scrambled} with a segment torn out of order, up to {most} transfers recovered");
    assert!(images >= 10 && most > 100, "{images} images, {most} transfers: the test checked little");
    assert!(scrambled >= SCRAMBLED_MIN, "{scrambled} of {images} images held a segment torn out of order");
}

/// Copies the directory `from` into `to` with plain file operations (outside any storage).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            copy_dir(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// `checkpoint::raise_epoch_floor` (a promoted backup's, before its first segments) keeps
/// the raised floor through a power cut even where the checkpoint's own name in
/// `checkpoints/` was not durable yet (an attempt that died after its manifest's rename):
/// it syncs `checkpoints/` too. Without that the cut took the checkpoint, and the floor with
/// it, and the directory opened in an epoch below the floor.
#[test]
fn a_raised_epoch_floor_survives_a_power_cut_with_its_checkpoint() {
    use ditto_log::storage::Storage;
    let tmp = tempfile::tempdir().unwrap();
    let made = tmp.path().join("made");
    {
        let d = open(&made, OpenOptions { workers: 1, progress: false, ..Default::default() }).unwrap();
        let t = d.db().create_table("t").unwrap();
        d.db().worker(WorkerId(0)).unwrap().run(|x| x.insert(t, b"k", b"v")).unwrap().1.wait().unwrap();
        d.checkpoint().unwrap();
        d.close();
    }
    // The same directory under the power cut's storage: every entry durable but the
    // checkpoints' (as if `checkpoints/` was never synced after the checkpoint's rename).
    let (root, attic, img) = (tmp.path().join("root"), tmp.path().join("attic"), tmp.path().join("img"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&attic).unwrap();
    let storage = PowerCut::new(&root, &attic);
    let data = root.join("data");
    copy_dir(&made, &data);
    for d in [root.clone(), data.clone(), data.join("log")] {
        storage.sync_dir(&d).unwrap();
    }
    let floor = ditto_log::Epoch(1000);
    ditto_log::checkpoint::raise_epoch_floor(&data, floor, &storage).unwrap();
    storage.image(&root, &img, &mut |synced, _| synced).unwrap();
    let d = open(&img.join("data"), OpenOptions { workers: 1, progress: false, ..Default::default() }).unwrap();
    let epoch = d.logger().epoch();
    d.close();
    assert!(epoch >= floor, "opened in epoch {} after the cut, below the raised floor {}", epoch.0, floor.0);
}
