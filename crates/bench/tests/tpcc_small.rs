//! TPC-C on a small database: the full mix runs, every type commits, and the consistency
//! conditions hold afterwards; a corrupted D_YTD is caught by condition 1.

use std::time::Duration;

use ditto_bench::harness::{Probe, RunConfig};
use ditto_bench::tpcc::{self, TpccConfig};
use ditto_engine::{Database, Options};

#[test]
fn small_run_keeps_consistency() {
    let db = Database::new(Options { workers: 2 });
    let t = tpcc::load(&db, &TpccConfig::small(2), false).expect("load");
    let before = tpcc::check_consistency(&db, &t).expect("consistent after load");
    assert_eq!(before.warehouses, 2);
    assert_eq!(before.districts, 20);
    assert_eq!(before.orders, 2 * 10 * 100);
    assert_eq!(before.new_orders, 2 * 10 * 30);

    let cfg = RunConfig { workers: 2, duration: Duration::from_secs(2), seed: 7, progress: false };
    let rep = tpcc::run(&db, &t, &cfg, &Probe::NONE).expect("run");
    println!("{}", rep.to_text());
    assert_eq!(rep.per_type.len(), 5);
    for ty in &rep.per_type {
        assert!(ty.committed > 0, "no {} committed: {rep:?}", ty.name);
    }
    assert_eq!(rep.committed, rep.per_type.iter().map(|t| t.committed).sum::<u64>());
    assert!(rep.throughput_tps > 0.0);
    assert!(rep.abort_rate >= 0.0 && rep.abort_rate < 1.0);
    assert!(rep.latency_us_p50 <= rep.latency_us_p99 && rep.latency_us_p99 <= rep.latency_us_max);
    let new_orders = &rep.per_type[0];
    if new_orders.committed > 2000 {
        assert!(new_orders.user_aborts > 0, "1% of NewOrders roll back: {rep:?}");
    }
    assert_eq!(rep.user_aborts, new_orders.user_aborts);

    let after = tpcc::check_consistency(&db, &t).expect("consistent after the run");
    assert!(after.orders > before.orders);

    // The sizes read back from the data match the loaded configuration.
    let reopened = tpcc::open(&db).expect("open");
    assert_eq!((reopened.warehouses, reopened.items, reopened.customers_per_district), (2, 1000, 100));
    let json = serde_json::to_value(&rep).expect("json");
    assert_eq!(json["benchmark"], "tpcc");
    assert_eq!(json["extra"]["warehouses"], 2);
}

#[test]
fn more_workers_than_warehouses() {
    // Two workers share one warehouse: conflicts happen and are retried.
    let db = Database::new(Options { workers: 2 });
    let t = tpcc::load(&db, &TpccConfig::small(1), false).expect("load");
    let cfg = RunConfig { workers: 2, duration: Duration::from_millis(1500), seed: 3, progress: false };
    let rep = tpcc::run(&db, &t, &cfg, &Probe::NONE).expect("run");
    println!("{}", rep.to_text());
    assert!(rep.committed > 0);
    tpcc::check_consistency(&db, &t).expect("consistent after the run");
}

#[test]
fn corrupted_district_ytd_fails_condition_1() {
    let db = Database::new(Options { workers: 1 });
    let t = tpcc::load(&db, &TpccConfig::small(1), false).expect("load");
    tpcc::check_consistency(&db, &t).expect("consistent after load");
    tpcc::adjust_district_ytd(&db, &t, 1, 3, 12_345).expect("adjust");
    let err = tpcc::check_consistency(&db, &t).expect_err("condition 1 must fail");
    assert!(err.contains("condition 1"), "{err}");
    assert!(err.contains("warehouse 1"), "{err}");
}
