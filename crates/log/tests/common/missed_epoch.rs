//! A backup's directory that missed a failover, made by hand from batches of two epochs
//! whose timestamps overlap (docs/cluster.md, "A node that missed an epoch"). Shared by
//! the log's tests and the replication's (included there with `#[path]`).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use ditto_engine::{RecordId, TableId, Ts};
use ditto_log::format::{decode_batch_checksums, BatchBuilder};
use ditto_log::replica::{append_fetched, ReplicaLog};
use ditto_log::storage::Storage;
use ditto_log::{Epoch, StreamId};

/// A batch of `stream` in `epoch`, bound at `bound`, that writes each `(ts, rid, value)`
/// as record `rid` of table `t` (key `r{rid}`).
pub fn batch(t: TableId, stream: u32, epoch: u64, txns: &[(u64, u64, &str)], bound: u64) -> Bytes {
    let mut b = BatchBuilder::new();
    for (ts, rid, v) in txns {
        let key = format!("r{rid}");
        b.push_txn(Ts(*ts), [(t, RecordId(*rid), Some(key.as_bytes()), Some(v.as_bytes()))].into_iter());
    }
    let mut out = Vec::new();
    b.finish_into(StreamId(stream), Epoch(epoch), Ts(bound), false, &mut out);
    Bytes::from(out)
}

/// A backup's directory (two streams, `catalog`'s tables) that followed epoch 1 and missed
/// its failover, which cut epoch 1 at 5: its replica log holds epoch 1's records 1..=10
/// written at ts 1..=10, then what it fetched of epoch 2 up to that epoch's point 9:
/// record 8 again at ts 7, record 20 at ts 9.
pub fn missed_epoch_dir(catalog: &Path, t: TableId, storage: &Arc<dyn Storage>) -> tempfile::TempDir {
    let epoch1: Vec<(u64, u64, &str)> = (1..=10).map(|i| (i, i, "epoch 1")).collect();
    let received = [batch(t, 0, 1, &epoch1, 10), batch(t, 1, 1, &[], 10)];
    let fetched = [batch(t, 0, 2, &[(7, 8, "epoch 2"), (9, 20, "epoch 2")], 9), batch(t, 1, 2, &[], 9)];
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(catalog.join("CATALOG"), dir.path().join("CATALOG")).unwrap();
    let mut log = ReplicaLog::create(dir.path(), Arc::clone(storage), 2, 1, u64::MAX).unwrap();
    for b in &received {
        log.append(b, true, decode_batch_checksums(b).unwrap().0.header.bound_ts);
    }
    log.sync().unwrap();
    drop(log);
    append_fetched(dir.path(), 2, &fetched, storage).unwrap();
    dir
}

/// Records 1..=20 of table `t` as `db` reads them: (record, value).
pub fn rows(db: &ditto_engine::Database, t: TableId) -> Vec<(u64, String)> {
    let r = db.read();
    (1..=20)
        .filter_map(|i| {
            let v = r.get(t, format!("r{i}").as_bytes()).unwrap()?;
            Some((i, String::from_utf8(v.to_vec()).unwrap()))
        })
        .collect()
}

/// What that directory holds as recovered at epoch 2's point with epoch 1 cut at 5:
/// epoch 1 up to its point, then epoch 2's two records.
pub fn recovered() -> Vec<(u64, String)> {
    let mut want: Vec<(u64, String)> = (1..=5).map(|i| (i, "epoch 1".to_string())).collect();
    want.extend([(8, "epoch 2".to_string()), (20, "epoch 2".to_string())]);
    want
}
