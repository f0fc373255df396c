//! A failover's fetch between two backups' replica logs (docs/cluster.md): the node that
//! lacks the tail of a stream gets the batches from a peer's replica log
//! (`replica_stream_batches`), adds them to its own (`append_fetched`), and then holds and
//! recovers exactly what the peer does. Real files, real batches from a primary's log.

use std::sync::Arc;

use bytes::Bytes;
use ditto_engine::{Ts, WorkerId};
use ditto_log::format::decode_batch_checksums;
use ditto_log::replica::{append_fetched, open_replica, replica_holdings, replica_stream_batches, ReplicaLog};
use ditto_log::storage::{RealStorage, Storage};
use ditto_log::{open, Durability, LogOptions, OpenOptions};

#[test]
fn a_backup_lacking_a_streams_tail_fetches_it_from_a_peer_and_then_holds_what_the_peer_holds() {
    let primary = tempfile::tempdir().unwrap();
    let o = OpenOptions {
        workers: 2,
        log: LogOptions { durability: Durability::EveryBatch, ..LogOptions::default() },
        ..Default::default()
    };
    let d = open(primary.path(), o).unwrap();
    let t = d.db().create_table("t").unwrap();
    for (worker, base) in [(0u32, 0u64), (1, 1000)] {
        let mut w = d.db().worker(WorkerId(worker)).unwrap();
        for i in base..base + 200 {
            w.run(|x| x.put(t, &i.to_be_bytes(), &i.to_le_bytes()).map(|_| ())).unwrap().1.wait().unwrap();
        }
    }
    let epoch = d.logger().epoch();
    d.close();
    let batches = ditto_log::replica::batches_after(primary.path(), epoch, Ts::ZERO).unwrap().unwrap();
    let stream = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    let s0: Vec<&Bytes> = batches.iter().filter(|b| stream(b).stream.0 == 0).collect();
    assert!(s0.len() > 10, "stream 0 has batches to cut: {}", s0.len());
    let cut_bound = stream(s0[s0.len() / 2]).bound_ts;

    // Peer A holds everything; B lacks stream 0 above `cut_bound`.
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for (dir, keep) in [(&a, None), (&b, Some(cut_bound))] {
        std::fs::copy(primary.path().join("CATALOG"), dir.path().join("CATALOG")).unwrap();
        let mut log = ReplicaLog::create(dir.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
        for x in &batches {
            let h = stream(x);
            if keep.is_some_and(|k| h.stream.0 == 0 && h.bound_ts > k) {
                continue;
            }
            log.append(x, false, h.bound_ts);
        }
        log.sync().unwrap();
    }
    let (ha, hb) = (replica_holdings(a.path(), 2, None).unwrap(), replica_holdings(b.path(), 2, None).unwrap());
    assert_eq!(hb.streams[0], cut_bound);
    assert!(ha.streams[0] > hb.streams[0] && ha.streams[1] == hb.streams[1], "{ha:?} {hb:?}");

    // An old primary's own log reports as a replica log holding all of it would, and
    // serves the same batches.
    let (hp, _) = ditto_log::recovery::primary_log_holdings(primary.path(), None).unwrap();
    assert_eq!(hp.streams, ha.streams, "the primary's log holds what A received");
    // It counts the transactions above a point as A's replica log does (what an old
    // primary discards at its rejoin): some above the cut, none above the newest.
    let above = |p| {
        let (h, _) = ditto_log::recovery::primary_log_holdings(primary.path(), Some(p)).unwrap();
        (h.txns_above, replica_holdings(a.path(), 2, Some(p)).unwrap().txns_above)
    };
    let (mine, theirs) = above(cut_bound);
    assert_eq!(mine, theirs, "the same count from the primary's log and from A's");
    assert!(mine > 0, "transactions lie above the cut");
    assert_eq!(above(hp.newest), (0, 0));
    let from_primary = ditto_log::recovery::primary_stream_batches(primary.path(), 0, hb.streams[0]).unwrap();
    let fetched = replica_stream_batches(a.path(), 0, hb.streams[0]).unwrap();
    assert_eq!(from_primary, fetched, "the same batches from the primary's log and from A's");
    assert!(!fetched.is_empty() && fetched.iter().all(|x| stream(x).stream.0 == 0 && stream(x).bound_ts > cut_bound));
    // B's last file ends torn (its server died mid-write): the fetch cuts it before it adds
    // a file, or the directory would no longer open.
    {
        use std::io::Write;
        let f = ditto_log::replica::replica_dir(b.path()).join("rlog-0000000001.seg");
        std::fs::OpenOptions::new().append(true).open(f).unwrap().write_all(&[9u8; 20]).unwrap();
    }
    append_fetched(b.path(), 2, &fetched, &storage).unwrap();
    let hb2 = replica_holdings(b.path(), 2, None).unwrap();
    assert_eq!(hb2.streams, ha.streams, "after the fetch B holds every stream as far as A");
    // A batch from elsewhere that does not check is refused, and changes nothing.
    let mut bad = fetched[0].to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(append_fetched(b.path(), 2, &[Bytes::from(bad)], &storage).is_err());
    assert_eq!(replica_holdings(b.path(), 2, None).unwrap().streams, ha.streams);

    // A promotion at a point above what a directory holds is refused, and changes nothing.
    let above = Ts(ha.cut.0 + 1000);
    assert!(ditto_log::replica::open_replica_at(b.path(), 2, &storage, above).is_err());
    assert_eq!(replica_holdings(b.path(), 2, None).unwrap().streams, ha.streams);

    // Both recover the same rows.
    let (ra, rb) = (open_replica(a.path(), 2, &storage).unwrap(), open_replica(b.path(), 2, &storage).unwrap());
    assert_eq!(ra.cut, rb.cut);
    let ta = ra.db.table_id("t").unwrap();
    assert_eq!(ra.db.count(ta).unwrap(), 400);
    assert_eq!(rb.db.count(rb.db.table_id("t").unwrap()).unwrap(), 400);
}
