//! Memory stays bounded while a snapshot is held (as a checkpoint holds one for seconds):
//! the versions written meanwhile that no snapshot can read are freed (clock.rs, "Two
//! horizons"). The only test in this binary, so that the process's resident size is its own.

use ditto_engine::{Database, Options, WorkerId};

fn resident_mib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    (statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096) >> 20
}

/// 400k updates of 1,000 keys (200-byte values) under a snapshot taken before them: with
/// one horizon (the held snapshot's), every one of those versions stayed, about 90 MiB
/// here, and each install walked its key's whole chain to find where to cut.
#[test]
fn a_held_snapshot_keeps_one_version_per_key_not_every_one_written_since() {
    const KEYS: u64 = 1_000;
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();
    let value = |i: u64, round: u64| {
        let mut v = [0u8; 200];
        v[..8].copy_from_slice(&(i ^ round).to_le_bytes());
        v
    };
    let (_, ticket) = w.run(|x| (0..KEYS).try_for_each(|i| x.insert(t, &i.to_be_bytes(), &value(i, 0)))).unwrap();
    ticket.wait().unwrap();
    let update = |w: &mut ditto_engine::Worker, from: u64, to: u64| {
        for round in from..to {
            let first = round * 10 % KEYS;
            let (_, ticket) = w
                .run(|x| (first..first + 10).try_for_each(|i| x.update(t, &(i % KEYS).to_be_bytes(), &value(i, round))))
                .unwrap();
            ticket.wait().unwrap();
        }
    };
    let held = db.read();
    update(&mut w, 1, 4_001);
    let before = resident_mib();
    update(&mut w, 4_001, 44_001);
    let after = resident_mib();
    assert!(
        after <= before + 24,
        "resident {before} MiB after the warm-up, {after} MiB after 400k more updates of 1k keys under a held snapshot"
    );
    for i in 0..KEYS {
        assert_eq!(held.get(t, &i.to_be_bytes()).unwrap().as_deref(), Some(&value(i, 0)[..]), "key {i}");
    }
    // The newest versions are there too: key i was last written in the last round r with
    // r % 100 == i / 10.
    let last = db.read();
    for i in 0..KEYS {
        let r = if i / 10 == 0 { 44_000 } else { 43_900 + i / 10 };
        assert_eq!(last.get(t, &i.to_be_bytes()).unwrap().as_deref(), Some(&value(i, r)[..]), "key {i}");
    }
}
