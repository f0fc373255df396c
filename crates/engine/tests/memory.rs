//! Memory stays bounded under an update-only load, however many versions each transaction
//! replaces. The only test in this binary, so that the process's resident size is its own.

use ditto_engine::{Database, Options, WorkerId};

fn resident_mib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    (statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096) >> 20
}

/// Transactions of 32 updates each over 10k keys: every install hands the replaced version
/// to the epoch GC, 32 per pin of the worker's thread. crossbeam-epoch alone collects at
/// most 4 frees per pin (8 bags of 64 at every 128th pin), so before the worker asked for
/// collections itself (`GC_COLLECT_EVERY_INSTALLS`) the garbage grew without bound: about
/// 1.1M versions here, well over 100 MiB. Bounded, what grows is the chains' few versions
/// newer than the GC horizon and the allocator's slack.
#[test]
fn garbage_is_collected_as_fast_as_large_transactions_make_it() {
    const KEYS: u64 = 10_000;
    const WRITES: u64 = 32;
    let db = Database::new(Options { workers: 1 });
    let t = db.create_table("t").unwrap();
    let mut w = db.worker(WorkerId(0)).unwrap();
    let value = |i: u64, round: u64| {
        let mut v = [0u8; 100];
        v[..8].copy_from_slice(&(i ^ round).to_le_bytes());
        v
    };
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let (_, ticket) =
            w.run(|x| chunk.iter().try_for_each(|i| x.insert(t, &i.to_be_bytes(), &value(*i, 0)))).unwrap();
        ticket.wait().unwrap();
    }
    let mut round = 0u64;
    let mut update = |w: &mut ditto_engine::Worker, txns: u64| {
        for _ in 0..txns {
            round += 1;
            let first = round * WRITES % KEYS;
            let (_, ticket) = w
                .run(|x| {
                    (first..first + WRITES).try_for_each(|i| x.update(t, &(i % KEYS).to_be_bytes(), &value(i, round)))
                })
                .unwrap();
            ticket.wait().unwrap();
        }
    };
    update(&mut w, 5_000);
    let before = resident_mib();
    update(&mut w, 40_000);
    let after = resident_mib();
    assert!(
        after <= before + 32,
        "resident {before} MiB after the warm-up, {after} MiB after 1.28M more updates of 10k keys"
    );
    assert_eq!(db.count(t).unwrap(), KEYS);
}
