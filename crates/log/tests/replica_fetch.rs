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

#[path = "common/missed_epoch.rs"]
mod missed_epoch;

/// A primary's directory (two workers, every batch fsynced) with a table `t`.
fn primary_with_table(dir: &std::path::Path) -> (ditto_log::Durable, ditto_engine::TableId) {
    let o = OpenOptions {
        workers: 2,
        log: LogOptions { durability: Durability::EveryBatch, ..LogOptions::default() },
        ..Default::default()
    };
    let d = open(dir, o).unwrap();
    let t = d.db().create_table("t").unwrap();
    (d, t)
}

/// The segment files of the primary's log in `dir`, sorted by name (stream, epoch, seq).
fn segment_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut segs: Vec<_> = std::fs::read_dir(dir.join("log"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs
}

/// `primary_with_table`, its two workers having put keys 0..200 and 1000..1200 (the key,
/// as the value), closed; and every batch its log holds.
fn primary_with_400_commits(dir: &std::path::Path) -> (ditto_log::Durable, Vec<Bytes>) {
    let (d, t) = primary_with_table(dir);
    for (worker, base) in [(0u32, 0u64), (1, 1000)] {
        let mut w = d.db().worker(WorkerId(worker)).unwrap();
        for i in base..base + 200 {
            w.run(|x| x.put(t, &i.to_be_bytes(), &i.to_le_bytes()).map(|_| ())).unwrap().1.wait().unwrap();
        }
    }
    let epoch = d.logger().epoch();
    d.close();
    let batches = ditto_log::replica::batches_after(dir, epoch, Ts::ZERO).unwrap().unwrap().collect().unwrap();
    (d, batches)
}

/// The batches of one stream that add something above `from`: transactions, or a bound
/// above every bound before (a closed log ends in an empty batch at the bound already
/// written, vouching for the write before it, `Logger::owes_vouch`).
fn adding(batches: Vec<Bytes>, from: Ts) -> Vec<Bytes> {
    let mut top = from;
    batches
        .into_iter()
        .filter(|b| {
            let h = decode_batch_checksums(b).unwrap().0.header;
            let adds = h.txn_count > 0 || h.bound_ts > top;
            top = top.max(h.bound_ts);
            adds
        })
        .collect()
}

#[test]
fn a_backup_lacking_a_streams_tail_fetches_it_from_a_peer_and_then_holds_what_the_peer_holds() {
    let primary = tempfile::tempdir().unwrap();
    let (_closed, batches) = primary_with_400_commits(primary.path());
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
    let from_primary = ditto_log::recovery::primary_stream_batches(primary.path(), 0, hb.streams[0], Ts::ZERO).unwrap();
    let fetched = replica_stream_batches(a.path(), 0, hb.streams[0]).unwrap();
    assert_eq!(from_primary, fetched, "the same batches from the primary's log and from A's");
    assert!(!fetched.is_empty() && fetched.iter().all(|x| stream(x).stream.0 == 0 && stream(x).bound_ts > cut_bound));
    // The same from a log of many small files (read one at a time) whose newest ends torn,
    // for every `after`: each stream's batches bounded above it, in order, as framed.
    let many = tempfile::tempdir().unwrap();
    std::fs::copy(primary.path().join("CATALOG"), many.path().join("CATALOG")).unwrap();
    {
        let mut log = ReplicaLog::create(many.path(), Arc::clone(&storage), 2, 1, 1024).unwrap();
        for x in &batches {
            log.append(x, false, stream(x).bound_ts);
            log.sync().unwrap();
        }
    }
    let files = |dir: &std::path::Path| std::fs::read_dir(ditto_log::replica::replica_dir(dir)).unwrap().count();
    assert!(files(many.path()) > 3, "many files: {}", files(many.path()));
    let sealed = fresh_copy(many.path());
    let newest = std::fs::read_dir(ditto_log::replica::replica_dir(many.path()))
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    {
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(newest).unwrap().write_all(&[7u8; 30]).unwrap();
    }
    for s in 0..2usize {
        for after in [Ts::ZERO, cut_bound, ha.streams[s], Ts(ha.streams[s].0 + 1)] {
            let want: Vec<Bytes> = batches
                .iter()
                .filter(|x| stream(x).stream.0 as usize == s && stream(x).bound_ts > after)
                .cloned()
                .collect();
            assert_eq!(replica_stream_batches(many.path(), s, after).unwrap(), want, "stream {s} above {after:?}");
            if s == 0 && after == hb.streams[0] {
                assert_eq!(want, fetched);
            }
        }
    }
    // Sealed just below what it holds (a change of role in place): a fetch from below
    // the point reads the sealed link, only the stream asked for, each batch cut at the
    // point: that stream's transactions above `after` and at or below the point, in order.
    let point = Ts(ha.cut.0 - 3);
    ditto_log::sealed::seal_tail(sealed.path(), point, &*storage).unwrap();
    let txns = |bs: &[Bytes], s: usize, after: Ts| -> Vec<Ts> {
        bs.iter()
            .filter(|b| stream(b).stream.0 as usize == s)
            .flat_map(|b| ditto_log::format::decode_batch(b).unwrap().0.records().into_iter().map(|r| r.ts))
            .filter(|t| *t > after && *t <= point)
            .collect()
    };
    for s in 0..2usize {
        for after in [Ts::ZERO, Ts(point.0 / 2)] {
            let got = replica_stream_batches(sealed.path(), s, after).unwrap();
            assert!(got.iter().all(|b| stream(b).stream.0 as usize == s), "only stream {s}");
            let want = txns(&batches, s, after);
            assert!(!want.is_empty(), "stream {s} has transactions above {after:?}");
            assert_eq!(txns(&got, s, Ts::ZERO), want, "stream {s} above {after:?}, cut at the point");
            // Handed on as read: a sink that asks for no more after `k` batches gets the
            // first `k`, and the read stops there, in the sealed link as after it.
            for k in [1, got.len() / 2, got.len()] {
                let mut taken = Vec::new();
                ditto_log::replica::replica_stream_batches_each(sealed.path(), s, after, &mut |b| {
                    taken.push(b);
                    taken.len() < k
                })
                .unwrap();
                assert_eq!(taken, got[..k.max(1).min(got.len())], "stream {s} above {after:?}, {k} taken");
            }
        }
    }
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
    // So is one whose checksums hold over a payload that does not parse (a peer's bug, or
    // a peer that holds the secret): before, only the checksums were checked, and the
    // directory then failed to open at the promotion that needed it.
    let (good, _) = decode_batch_checksums(&fetched[0]).unwrap();
    let mut h = good.header;
    assert!(!h.compressed, "the test's log is not compressed");
    let body = h.header_len();
    let mut garbled = fetched[0].to_vec();
    garbled[body..].fill(0xFF);
    h.payload_crc = h.payload_checksum(&garbled[body..]);
    garbled[..body].copy_from_slice(&h.encode());
    let garbled = Bytes::from(garbled);
    assert!(decode_batch_checksums(&garbled).is_ok(), "its checksums hold");
    let err = append_fetched(b.path(), 2, &[garbled], &storage).unwrap_err().to_string();
    assert!(err.contains("a fetched batch"), "{err}");
    assert_eq!(replica_holdings(b.path(), 2, None).unwrap().streams, ha.streams);
    // A newest file with no whole header (B's server died as it created it): the next fetch
    // takes its place (before, it stayed behind the new file, and the directory no longer
    // opened: "not a replica log file").
    let rdir = ditto_log::replica::replica_dir(b.path());
    let n = std::fs::read_dir(&rdir).unwrap().count() as u64;
    std::fs::write(rdir.join(format!("rlog-{:010}.seg", n + 1)), [0x44u8; 10]).unwrap();
    append_fetched(b.path(), 2, &fetched[..1], &storage).unwrap();
    ditto_log::replica::forget_holdings();
    assert_eq!(replica_holdings(b.path(), 2, None).unwrap().streams, ha.streams);

    // A promotion at a point above what a directory holds is refused, and changes nothing.
    let above = Ts(ha.cut.0 + 1000);
    assert!(ditto_log::replica::open_replica_at(b.path(), 2, &storage, above, &[]).is_err());
    assert_eq!(replica_holdings(b.path(), 2, None).unwrap().streams, ha.streams);

    // Both recover the same rows.
    let (ra, rb) = (open_replica(a.path(), 2, &storage).unwrap(), open_replica(b.path(), 2, &storage).unwrap());
    assert_eq!(ra.cut, rb.cut);
    let ta = ra.db.table_id("t").unwrap();
    assert_eq!(ra.db.count(ta).unwrap(), 400);
    assert_eq!(rb.db.count(rb.db.table_id("t").unwrap()).unwrap(), 400);
}

/// An old primary rejoining as a backup (`open_replica_upto` with the failover's point on a
/// directory holding its own log): the engine holds exactly the commits at or below the
/// point, the directory becomes a backup's without a checkpoint written (its log, cut at
/// the point, sealed as the chain's newest link: no log segments left), and opening it
/// again gives the same, the chain then checkpointed away; a crash between the seal's two
/// steps (the cut file written into `log/`) is read as sealed and finished by the next
/// open; with a point above what the log holds, the cut is the log's own; without a point
/// the directory is refused, changing nothing.
#[test]
fn an_old_primarys_own_log_is_cut_at_the_point_and_kept_as_a_backups_start() {
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let make = || {
        let dir = tempfile::tempdir().unwrap();
        let (d, t) = primary_with_table(dir.path());
        let mut ts_of = Vec::new();
        for i in 0..300u64 {
            let mut w = d.db().worker(WorkerId((i % 2) as u32)).unwrap();
            let (_, c) = w.run(|x| x.put(t, &i.to_be_bytes(), &i.to_le_bytes()).map(|_| ())).unwrap();
            ts_of.push(c.ts());
            c.wait().unwrap();
        }
        d.close();
        (dir, ts_of)
    };
    let count = |db: &Arc<ditto_engine::Database>| {
        let t = db.table_id("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        let mut tx = w.begin_snapshot();
        (0..300u64).filter(|i| tx.get(t, &i.to_be_bytes()).unwrap().is_some()).count()
    };
    let segments = |p: &std::path::Path| std::fs::read_dir(p.join("log")).map_or(0, |r| r.count());
    let checkpoints = |p: &std::path::Path| std::fs::read_dir(p.join("checkpoints")).map_or(0, |r| r.count());

    let (dir, ts_of) = make();
    assert!(segments(dir.path()) > 0);
    assert!(ditto_log::replica::open_replica_upto(dir.path(), 2, &storage, None).is_err(), "no point: refused");
    assert!(segments(dir.path()) > 0, "refused, nothing changed");
    let point = ts_of[149];
    let ckpts_before = checkpoints(dir.path());
    let o = ditto_log::replica::open_replica_upto(dir.path(), 2, &storage, Some(point)).unwrap();
    assert_eq!(o.cut, point);
    assert_eq!(o.sealed, Some(point), "opened on a sealed link");
    assert_eq!(count(&o.db), 150, "exactly the commits at or below the point");
    assert_eq!(segments(dir.path()), 0, "no live log is left");
    assert_eq!(checkpoints(dir.path()), ckpts_before, "no checkpoint was written");
    let chain = ditto_log::sealed::sealed(dir.path()).unwrap();
    assert_eq!(chain.len(), 1);
    assert!(chain[0].primary_log && chain[0].point == point, "{chain:?}");
    // What a failover's report reads: every stream held up to the point, nothing above.
    let h = replica_holdings(dir.path(), 2, Some(point)).unwrap();
    assert!(h.streams.iter().all(|t| *t == point) && h.txns_above == 0, "{h:?}");
    drop(o);
    let again = open_replica(dir.path(), 2, &storage).unwrap();
    assert_eq!((again.cut, count(&again.db)), (point, 150), "a backup's directory now");
    drop(again);
    assert!(ditto_log::sealed::sealed(dir.path()).unwrap().is_empty(), "the open checkpointed the chain away");

    // A crash between the seal's two steps: its cut file in `log/`, the rename not done.
    let (dir, ts_of) = make();
    let point = ts_of[99];
    std::fs::write(dir.path().join("log").join(ditto_log::sealed::CUT_FILE), ditto_log::sealed::encode_cut(point))
        .unwrap();
    let chain = ditto_log::sealed::sealed(dir.path()).unwrap();
    assert!(chain.len() == 1 && chain[0].primary_log && chain[0].dir.ends_with("log"), "{chain:?}");
    let o = ditto_log::replica::open_replica_upto(dir.path(), 2, &storage, Some(point)).unwrap();
    assert_eq!((o.cut, count(&o.db), segments(dir.path())), (point, 100, 0));
    drop(o);

    // A point above everything it holds: it keeps all of it.
    let (dir, ts_of) = make();
    let top = *ts_of.last().unwrap();
    let o = ditto_log::replica::open_replica_upto(dir.path(), 2, &storage, Some(Ts(top.0 + 1000))).unwrap();
    assert!(o.cut >= top && o.cut.0 <= top.0 + 1000, "{:?}", o.cut);
    assert_eq!(count(&o.db), 300);
}

/// A failover reads a fenced backup's holdings twice (its report, then its prepare's
/// check): the second read of a directory in which no file changed uses the first's
/// (`replica_holdings`), with the same holdings and the same count above a point, and any
/// change is seen: a damaged entry header, though the file's modification time is set
/// back, and batches appended since.
#[test]
fn a_second_holdings_read_uses_the_first_until_a_file_changes() {
    let (batches, storage, dir) = empty_backup_of_400_commits();
    let header = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    // Small files, so that the older ones are read header by header.
    let mut log = ReplicaLog::create(dir.path(), Arc::clone(&storage), 2, 1, 4096).unwrap();
    let (first, rest) = batches.split_at(batches.len() * 3 / 4);
    for x in first {
        log.append(x, false, header(x).bound_ts);
    }
    log.sync().unwrap();
    let mid = header(&first[first.len() / 2]).last_ts;
    let h1 = replica_holdings(dir.path(), 2, Some(mid)).unwrap();
    assert!(h1.txns_above > 0, "transactions lie above {mid:?}");
    assert_eq!(replica_holdings(dir.path(), 2, Some(mid)).unwrap(), h1, "read again, nothing changed");
    let none_above = replica_holdings(dir.path(), 2, Some(h1.newest)).unwrap();
    assert_eq!((none_above.streams.clone(), none_above.txns_above), (h1.streams.clone(), 0));

    // The first file's first entry header damaged, its modification time set back.
    let oldest = ditto_log::replica::replica_dir(dir.path()).join("rlog-0000000001.seg");
    let before = std::fs::read(&oldest).unwrap();
    let mtime = std::fs::metadata(&oldest).unwrap().modified().unwrap();
    let header_at = before.len().min(ditto_log::replica::REPLICA_HEADER_LEN + 2);
    // Past the clock tick of the read's look at the files (before Linux 6.13 file times
    // move once a tick, 1-10 ms; `forget_holdings` covers a write within it in a node).
    std::thread::sleep(std::time::Duration::from_millis(30));
    let mut damaged = before.clone();
    damaged[header_at] ^= 0x40;
    std::fs::write(&oldest, &damaged).unwrap();
    std::fs::File::options().write(true).open(&oldest).unwrap().set_modified(mtime).unwrap();
    let e = replica_holdings(dir.path(), 2, Some(mid)).expect_err("the damage is seen");
    assert!(e.to_string().contains("checksum"), "{e}");
    std::fs::write(&oldest, &before).unwrap();
    assert_eq!(replica_holdings(dir.path(), 2, Some(mid)).unwrap(), h1, "repaired");

    // Batches appended since are held.
    for x in rest {
        log.append(x, false, header(x).bound_ts);
    }
    log.sync().unwrap();
    let h2 = replica_holdings(dir.path(), 2, Some(mid)).unwrap();
    assert!(h2.cut > h1.cut && h2.txns_above > h1.txns_above, "{h1:?} {h2:?}");
    let fresh = fresh_copy(dir.path());
    assert_eq!(replica_holdings(fresh.path(), 2, Some(mid)).unwrap(), h2, "as a fresh read of a copy");
}

/// An old primary is asked for its report again until a failover's round is planned: a
/// second read of its log, unchanged, gives the first's holdings without reading it
/// again (`primary_log_holdings`), and a damaged segment, though its modification time is
/// set back, is read again.
#[test]
fn an_old_primarys_report_is_read_again_only_when_its_log_changed() {
    let primary = tempfile::tempdir().unwrap();
    let (d, t) = primary_with_table(primary.path());
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    for i in 0..300u64 {
        w.run(|x| x.put(t, &i.to_be_bytes(), &i.to_le_bytes()).map(|_| ())).unwrap().1.wait().unwrap();
    }
    drop(w);
    d.close();
    drop(d);
    let read = || ditto_log::recovery::primary_log_holdings(primary.path(), None);
    let h1 = read().unwrap();
    assert!(h1.0.newest > Ts::ZERO);
    assert_eq!(read().unwrap(), h1, "read again, nothing changed");
    let mut segments: Vec<_> = std::fs::read_dir(primary.path().join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::metadata(p).unwrap().len() > 0)
        .collect();
    segments.sort();
    let seg = segments.first().expect("a segment with batches").clone();
    let before = std::fs::read(&seg).unwrap();
    let mtime = std::fs::metadata(&seg).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(30)); // (as above)
    let mut damaged = before.clone();
    let at = before.len() / 2;
    damaged[at] ^= 0x40;
    std::fs::write(&seg, &damaged).unwrap();
    std::fs::File::options().write(true).open(&seg).unwrap().set_modified(mtime).unwrap();
    match read() {
        Ok(h) => assert_ne!(h, h1, "the damage is seen (as a torn tail)"),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    std::fs::write(&seg, &before).unwrap();
    assert_eq!(read().unwrap(), h1, "repaired");
}

/// A drained primary's follow in place checks that its log reaches the point on disk from
/// its batch headers (`primary_log_reach`), not by reading it whole: the same reach as the
/// whole read (`primary_log_holdings`), one stream idle and vouched for by the other's
/// floors; a torn tail after the last batch changes nothing; a last batch whose payload
/// fails its checksum is an error (the caller then reads the log whole).
#[test]
fn a_primary_logs_reach_is_read_from_its_batch_headers() {
    let primary = tempfile::tempdir().unwrap();
    let (d, t) = primary_with_table(primary.path());
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..200u64 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), &i.to_le_bytes()).map(|_| ())).unwrap().1.wait().unwrap();
    }
    drop(w);
    d.close();
    drop(d);
    let whole = || {
        let (h, _) = ditto_log::recovery::primary_log_holdings(primary.path(), None).unwrap();
        h.streams.iter().copied().min().unwrap()
    };
    let reach = ditto_log::recovery::primary_log_reach(primary.path()).unwrap();
    assert!(reach >= last, "reaches the last commit: {reach:?} < {last:?}");
    assert_eq!(reach, whole(), "as the whole read says");
    // Stream 0's newest segment, the one with the batches (worker 0 wrote them all).
    let segs = stream_0_segments(primary.path());
    let seg = segs.last().unwrap().clone();
    let bytes = std::fs::read(&seg).unwrap();
    // Where the batches end (the writer lays zeros ahead of the next one).
    let scan = ditto_log::format::read_segment_checking(&Bytes::from(bytes.clone()), |_| true).unwrap();
    assert!(!scan.batches.is_empty());
    let end = scan.valid_len() as usize;
    {
        // A batch header begun and not finished: a torn write after the last batch.
        let mut torn = bytes.clone();
        let (_, first) = &scan.batches[0];
        let header = &bytes[ditto_log::format::SEGMENT_HEADER_LEN..][..first.header.header_len()];
        torn.resize(torn.len().max(end + header.len()), 0);
        torn[end..end + 40].copy_from_slice(&header[..40]);
        std::fs::write(&seg, &torn).unwrap();
        assert_eq!(ditto_log::recovery::primary_log_reach(primary.path()).unwrap(), reach, "a torn tail after it");
    }
    {
        let mut damaged = bytes.clone();
        damaged[end - 3] ^= 0x10;
        std::fs::write(&seg, &damaged).unwrap();
        let e =
            ditto_log::recovery::primary_log_reach(primary.path()).expect_err("the last batch's payload is checked");
        assert!(e.to_string().contains("last batch"), "{e}");
    }
    std::fs::write(&seg, &bytes).unwrap();
    assert_eq!(ditto_log::recovery::primary_log_reach(primary.path()).unwrap(), reach);
}

/// The segment files of stream 0 in the primary's directory `data`, in order.
fn stream_0_segments(data: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut segs: Vec<_> = std::fs::read_dir(data.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("stream-0000-"))
        .collect();
    segs.sort();
    segs
}

/// `primary_log_reach` over a stream of several segments: the same reach as the whole
/// read; with the segment before a stream's newest missing, the newest's header vouches
/// for nothing (the whole read refuses such a log too), so the walk is an error and the
/// caller falls back to the whole read.
#[test]
fn a_primary_logs_reach_needs_the_segment_before_the_newest() {
    let primary = tempfile::tempdir().unwrap();
    let o = OpenOptions {
        workers: 2,
        log: LogOptions { durability: Durability::EveryBatch, segment_bytes_max: 4096, ..LogOptions::default() },
        ..Default::default()
    };
    let d = open(primary.path(), o).unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    for i in 0..300u64 {
        w.run(|x| x.put(t, &i.to_be_bytes(), &[7u8; 64]).map(|_| ())).unwrap().1.wait().unwrap();
    }
    drop(w);
    d.close();
    drop(d);
    let whole = || ditto_log::recovery::primary_log_holdings(primary.path(), None).map(|(h, _)| h.streams);
    let reach = ditto_log::recovery::primary_log_reach(primary.path()).unwrap();
    assert_eq!(Some(reach), whole().unwrap().into_iter().min(), "as the whole read says");
    let segs = stream_0_segments(primary.path());
    assert!(segs.len() >= 3, "several segments: {segs:?}");
    std::fs::remove_file(&segs[segs.len() - 2]).unwrap();
    let e = ditto_log::recovery::primary_log_reach(primary.path()).expect_err("the newest cannot vouch alone");
    assert!(e.to_string().contains("missing"), "{e}");
    assert!(whole().is_err(), "the whole read refuses it too");
}

/// The 400 commits' batches (`primary_with_400_commits`), and a directory with the
/// primary's catalog and no replica log yet, to write them into.
fn empty_backup_of_400_commits() -> (Vec<Bytes>, Arc<dyn Storage>, tempfile::TempDir) {
    let primary = tempfile::tempdir().unwrap();
    let (_closed, batches) = primary_with_400_commits(primary.path());
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(primary.path().join("CATALOG"), dir.path().join("CATALOG")).unwrap();
    (batches, Arc::new(RealStorage), dir)
}

/// A copy of `dir`'s catalog and replica log in a fresh directory: read there, nothing
/// cached applies.
fn fresh_copy(dir: &std::path::Path) -> tempfile::TempDir {
    let fresh = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("CATALOG"), fresh.path().join("CATALOG")).unwrap();
    let rdir = ditto_log::replica::replica_dir(fresh.path());
    std::fs::create_dir_all(&rdir).unwrap();
    for e in std::fs::read_dir(ditto_log::replica::replica_dir(dir)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), rdir.join(e.file_name())).unwrap();
    }
    fresh
}

/// The newest replica log file is read from where the last look at it stopped
/// (`warm_holdings`, a report): what was appended since is held, an entry cut short (being
/// written, or torn) is not, and a file cut and written again in place, or replaced, is
/// read afresh; every read gives what a read of a fresh copy gives.
#[test]
fn the_newest_file_is_read_from_where_the_last_look_stopped() {
    let (batches, storage, dir) = empty_backup_of_400_commits();
    let header = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    // One file: everything is in the newest.
    let mut log = ReplicaLog::create(dir.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
    let (first, rest) = batches.split_at(batches.len() / 3);
    for x in first {
        log.append(x, false, header(x).bound_ts);
    }
    log.sync().unwrap();
    let mid = header(&first[first.len() / 2]).last_ts;
    ditto_log::replica::warm_holdings(dir.path()).unwrap();
    let same_as_fresh = |what: &str| {
        let h = replica_holdings(dir.path(), 2, Some(mid)).unwrap();
        let fresh = fresh_copy(dir.path());
        assert_eq!(h, replica_holdings(fresh.path(), 2, Some(mid)).unwrap(), "{what}");
        h
    };
    let h1 = same_as_fresh("as warmed");
    // Appended since: held.
    let (second, third) = rest.split_at(rest.len() / 2);
    for x in second {
        log.append(x, false, header(x).bound_ts);
    }
    log.sync().unwrap();
    let h2 = same_as_fresh("appended since the warm");
    assert!(h2.cut > h1.cut && h2.txns_above > h1.txns_above, "{h1:?} {h2:?}");
    // An entry cut short at the end (being written, or torn): not held, then held once whole.
    let file = ditto_log::replica::replica_dir(dir.path()).join("rlog-0000000001.seg");
    let whole = std::fs::read(&file).unwrap();
    // A batch as a replica log file frames it.
    let entry_of = |b: &Bytes| {
        let scratch = tempfile::tempdir().unwrap();
        let mut one = ReplicaLog::create(scratch.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
        one.append(b, false, header(b).bound_ts);
        one.sync().unwrap();
        let f = std::fs::read(ditto_log::replica::replica_dir(scratch.path()).join("rlog-0000000001.seg")).unwrap();
        f[ditto_log::replica::REPLICA_HEADER_LEN..].to_vec()
    };
    let (entry, other) = (entry_of(&third[0]), entry_of(&third[1]));
    let mut cut_short = whole.clone();
    cut_short.extend_from_slice(&entry[..entry.len() / 2]);
    std::fs::write(&file, &cut_short).unwrap();
    assert_eq!(same_as_fresh("an entry cut short at the end"), h2);
    let mut completed = whole.clone();
    completed.extend_from_slice(&entry);
    std::fs::write(&file, &completed).unwrap();
    let h3 = same_as_fresh("the entry completed");
    assert!(h3.cut >= h2.cut && h3.streams != h2.streams, "{h2:?} {h3:?}");
    // Cut in place below what was read (at an entry's end, as a recovery cuts a torn tail)
    // and written again past it with other entries: read afresh, not taken from the earlier
    // look. (Cut inside an entry, with whole entries after it, it is damage: refused.)
    drop(log);
    let mut keep = ditto_log::replica::REPLICA_HEADER_LEN;
    while keep < whole.len() - whole.len() / 4 {
        let len = u32::from_le_bytes(whole[keep..keep + 4].try_into().unwrap()) as usize;
        keep += ditto_log::replica::ENTRY_HEADER_LEN + len;
    }
    let mut rewritten = whole[..keep].to_vec();
    while rewritten.len() < completed.len() + 64 {
        rewritten.extend_from_slice(&other);
    }
    std::fs::write(&file, &rewritten).unwrap();
    same_as_fresh("cut and written again in place");
    // Replaced by another file at the same path (a log sealed away and a new one begun).
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, &whole[..whole.len() / 2]).unwrap();
    same_as_fresh("replaced");
    // A file whose header was being written at a crash (no more than a header's bytes, and
    // not a whole one) holds nothing, as recovery reads it: not an error.
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, [0u8; ditto_log::replica::REPLICA_HEADER_LEN]).unwrap();
    replica_holdings(dir.path(), 2, Some(mid)).expect("a header cut short holds nothing");
}

/// A newest replica log file whose size is damaged (a hole past its end, an inode's size)
/// is refused naming it by a running backup's look (`warm_holdings`) and by a report
/// (`replica_holdings`), before either reads it whole: before 2026-12-06 the look read
/// everything past where the last one stopped into memory. Taken back to size, both read
/// it as before.
#[test]
fn a_newest_file_whose_size_is_damaged_is_refused_before_it_is_read() {
    let (batches, storage, dir) = empty_backup_of_400_commits();
    let header = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    let mut log = ReplicaLog::create(dir.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
    for x in &batches {
        log.append(x, false, header(x).bound_ts);
    }
    log.sync().unwrap();
    drop(log);
    let before = replica_holdings(dir.path(), 2, None).unwrap();
    let file = ditto_log::replica::replica_dir(dir.path()).join("rlog-0000000001.seg");
    let len = std::fs::metadata(&file).unwrap().len();
    let grow = |to: u64| std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(to).unwrap();
    // (Sparse: the disk holds none of it.)
    let max = ditto_log::options::LOG_FILE_BYTES_MAX;
    grow(max + 1);
    let said = format!("a replica log file is {} bytes, more than the {max} it can be", max + 1);
    // And a failover's fetch from it (`replica_stream_batches`, entry by entry: before
    // 2026-12-06 it read the rest of such a file into memory to tell a torn tail).
    for e in [
        ditto_log::replica::warm_holdings(dir.path()).unwrap_err(),
        replica_holdings(dir.path(), 2, None).unwrap_err(),
        ditto_log::replica::replica_stream_batches(dir.path(), 0, Ts::ZERO).unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(e.contains(&said) && e.contains("rlog-0000000001.seg"), "{e}");
    }
    grow(len);
    ditto_log::replica::warm_holdings(dir.path()).unwrap();
    assert_eq!(replica_holdings(dir.path(), 2, None).unwrap(), before);
    let whole = ditto_log::replica::replica_stream_batches(dir.path(), 0, Ts::ZERO).unwrap();
    assert!(!whole.is_empty());
    // An entry header at the end whose checksum holds and whose length is 4 GiB: the fetch
    // allocates no more than the file holds after it (a torn tail, as recovery reads it),
    // and hands over what came before.
    let peak = || {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
    };
    let at_first = peak();
    let mut eh = [0u8; ditto_log::replica::ENTRY_HEADER_LEN];
    eh[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    let crc = crc32c::crc32c(&eh[..8]);
    eh[8..12].copy_from_slice(&crc.to_le_bytes());
    let mut f = std::fs::OpenOptions::new().append(true).open(&file).unwrap();
    std::io::Write::write_all(&mut f, &eh).unwrap();
    std::io::Write::write_all(&mut f, &[0u8; 100]).unwrap();
    drop(f);
    assert_eq!(ditto_log::replica::replica_stream_batches(dir.path(), 0, Ts::ZERO).unwrap(), whole);
    assert!(peak() < at_first + (1 << 30), "peak memory {} after {at_first}: the length was allocated", peak());
}

/// A primary's checkpoint keeps the log segments that hold anything above what its keeper
/// says (`Durable::keep_log_for`): a fetch from its log can then start below the
/// checkpoint, exactly where `primary_fetch_floor` says, and the directory still recovers
/// every row. Without a keeper, the covered segments go and the floor is near the
/// checkpoint (where each stream's open segment begins, or the checkpoint).
#[test]
fn a_checkpoint_keeps_the_log_a_backup_needs_and_a_fetch_starts_below_it() {
    for keep in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let o = OpenOptions {
            workers: 2,
            log: LogOptions {
                durability: Durability::EveryBatch,
                segment_bytes_max: 16 << 10,
                ..LogOptions::default()
            },
            ..Default::default()
        };
        let d = open(dir.path(), o).unwrap();
        let t = d.db().create_table("t").unwrap();
        let mut ts = Vec::new();
        for i in 0..400u64 {
            let mut w = d.db().worker(WorkerId((i % 2) as u32)).unwrap();
            ts.push(w.run(|x| x.put(t, &i.to_be_bytes(), &[7u8; 200]).map(|_| ())).unwrap().1.wait().unwrap());
        }
        let needed = ts[300];
        if keep {
            d.keep_log_for(Some(Box::new(move |_| needed)));
        }
        let ckpt = d.checkpoint().unwrap();
        assert!(ckpt.ts >= ts[399]);
        let floor = ditto_log::recovery::primary_fetch_floor(dir.path(), Ts::ZERO).unwrap();
        let fetch = |after: Ts| ditto_log::recovery::primary_stream_batches(dir.path(), 0, after, Ts::ZERO);
        if keep {
            assert!(floor <= needed, "the log kept reaches down to {floor:?}, above {needed:?}");
            assert!(floor > Ts::ZERO, "what lies below what was needed went");
            let got = fetch(floor).unwrap();
            let bound = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header.bound_ts;
            assert!(got.iter().map(bound).max().unwrap() >= ts[398], "up to the newest");
        } else {
            // Only each stream's newest segment (still open) is left, which may begin a
            // little below the checkpoint.
            assert!(floor > needed && floor <= ckpt.ts, "{floor:?}");
        }
        // Every stream is served from the floor; below it, the stream whose log begins
        // there is not (a stream is served from its own segments alone, so another one
        // may reach lower).
        let fetch_s = |s: usize, after: Ts| ditto_log::recovery::primary_stream_batches(dir.path(), s, after, Ts::ZERO);
        assert!((0..2).all(|s| fetch_s(s, floor).is_ok()), "every stream from {floor:?} (keep {keep})");
        assert!((0..2).any(|s| fetch_s(s, Ts(floor.0 - 1)).is_err()), "exactly from {floor:?} (keep {keep})");
        d.close();
        drop(d);
        let again = open(dir.path(), OpenOptions { workers: 2, ..Default::default() }).unwrap();
        assert_eq!(again.db().count(again.db().table_id("t").unwrap()).unwrap(), 400, "keep {keep}");
    }
}

/// Past `keep_for_backups_max_bytes`, a checkpoint deletes what a backup needed, and no
/// later checkpoint keeps log for a position below what it deleted (that backup is sent a
/// checkpoint anyway): the keeper is asked for positions at or above it only.
#[test]
fn past_the_bound_the_log_goes_and_is_not_kept_again_for_that_backup() {
    let dir = tempfile::tempdir().unwrap();
    let log = LogOptions {
        durability: Durability::EveryBatch,
        segment_bytes_max: 16 << 10,
        keep_for_backups_max_bytes: 40_000,
        ..LogOptions::default()
    };
    let d = open(dir.path(), OpenOptions { workers: 2, log, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    let put = |range: std::ops::Range<u64>| -> Vec<Ts> {
        range
            .map(|i| {
                let mut w = d.db().worker(WorkerId((i % 2) as u32)).unwrap();
                w.run(|x| x.put(t, &i.to_be_bytes(), &[7u8; 200]).map(|_| ())).unwrap().1.wait().unwrap()
            })
            .collect()
    };
    let ts = put(0..400);
    // A backup that holds only the first ten commits (as a primary's keeper says it: only
    // if at or above what the log already lost).
    let needed = ts[10];
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let a = Arc::clone(&asked);
    d.keep_log_for(Some(Box::new(move |gone_below| {
        a.lock().unwrap().push(gone_below);
        if needed >= gone_below {
            needed
        } else {
            Ts(u64::MAX)
        }
    })));
    let closed = || segment_files(dir.path()).len();
    d.checkpoint().unwrap();
    assert_eq!(closed(), 2, "past the bound: only each stream's open segment is left");
    put(400..500);
    d.checkpoint().unwrap();
    assert_eq!(closed(), 2, "nothing kept again for that backup");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked[0], Ts::ZERO);
    assert!(asked[1] > needed, "the second checkpoint asked above what the first deleted: {asked:?}");
}

/// A primary's log with a damaged segment before a stream's last is refused to a backup
/// that resumes (`batches_after`), not sent with a hole where the damage is.
#[test]
fn a_hole_in_a_primarys_log_is_not_shipped_as_if_whole() {
    let dir = tempfile::tempdir().unwrap();
    let o = OpenOptions {
        workers: 1,
        log: LogOptions { durability: Durability::EveryBatch, segment_bytes_max: 16 << 10, ..LogOptions::default() },
        ..Default::default()
    };
    let d = open(dir.path(), o).unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    for i in 0..300u64 {
        w.run(|x| x.put(t, &i.to_be_bytes(), &[7u8; 200]).map(|_| ())).unwrap().1.wait().unwrap();
    }
    drop(w);
    let epoch = d.logger().epoch();
    d.close();
    assert!(ditto_log::replica::batches_after(dir.path(), epoch, Ts::ZERO).unwrap().is_some());
    let segs = segment_files(dir.path());
    assert!(segs.len() >= 3, "{segs:?}");
    // A byte in the middle of the first segment (a batch's payload).
    let f = &segs[0];
    let mut b = std::fs::read(f).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(f, &b).unwrap();
    let got = ditto_log::replica::batches_after(dir.path(), epoch, Ts::ZERO);
    assert!(got.is_err(), "a hole shipped: {:?}", got.map(|b| b.map(|b| b.len())));
}

/// An old primary chosen as a failover's last resort starts from its own log cut at the
/// point (`open_own_log_at`): refused, with the directory left as it was, when the log
/// does not reach the point; at a point it reaches, cut exactly there.
#[test]
fn an_old_primarys_own_log_is_cut_for_a_last_resort_only_if_it_reaches_the_point() {
    let dir = tempfile::tempdir().unwrap();
    drop(primary_with_400_commits(dir.path()));
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let files = || -> Vec<(std::path::PathBuf, u64)> {
        let mut all = Vec::new();
        let mut todo = vec![dir.path().to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let m = e.metadata().unwrap();
                if m.is_dir() {
                    todo.push(e.path());
                } else if e.file_name() != "LOCK" {
                    all.push((e.path(), m.len()));
                }
            }
        }
        all.sort();
        all
    };
    let (h, _) = ditto_log::recovery::primary_log_holdings(dir.path(), None).unwrap();
    let reach = *h.streams.iter().min().unwrap();
    let before = files();
    let refused = ditto_log::replica::open_own_log_at(dir.path(), 2, &storage, Ts(reach.0 + 1000));
    let why = refused.err().expect("refused").to_string();
    assert!(why.contains("below the point"), "{why}");
    assert_eq!(files(), before, "the refusal changed nothing");
    let o = ditto_log::replica::open_own_log_at(dir.path(), 2, &storage, reach).unwrap();
    assert_eq!(o.cut, reach);
    let t = o.db.table_id("t").unwrap();
    assert!(o.db.count(t).unwrap() <= 400 && o.db.count(t).unwrap() > 0);
}

/// A backup's gap is checked whole when it is taken and read again a batch at a time
/// when it is sent (`Gap::for_each`): the same batches as reading every segment at once,
/// the streams merged in timestamp order; nothing appended since (shipped live instead);
/// a checkpoint that deletes its segments meanwhile takes nothing from it (the files are
/// held open); and a segment damaged since is an error after the batches before it, never
/// a gap with a hole.
#[test]
fn a_gap_is_read_again_a_batch_at_a_time_merged_and_a_segment_changed_since_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (d, mut write) = alternating_log(dir.path(), 16 << 10, 300);
    write(0, 600);
    at_rest(&d);
    let epoch = d.logger().epoch();
    let after = Ts(d.db().clock().now().0 / 2);
    let segs = segment_files(dir.path());
    assert!(segs.len() >= 6, "{} segments", segs.len());
    let expected = gap_read_whole(&segs, after);
    let streams: std::collections::BTreeSet<_> =
        expected.iter().map(|b| decode_batch_checksums(b).unwrap().0.header.stream).collect();
    assert_eq!(streams.len(), 2, "both streams have batches in the gap");
    let key = gap_key;
    let stream = |b: &Bytes| ditto_log::format::decode_batch_checksums(b).unwrap().0.header.stream;
    let switches = expected.windows(2).filter(|w| stream(&w[0]) != stream(&w[1])).count();
    assert!(switches > 100, "the streams' commits alternate: {switches} switches");
    let gap = ditto_log::replica::batches_after(dir.path(), epoch, after).unwrap().unwrap();
    assert_eq!(gap.len(), expected.len());
    // More commits after the gap was taken (in its segments' tails), then a checkpoint that
    // deletes every closed segment: neither changes what the gap sends.
    write(600, 800);
    let ckpt = d.checkpoint().unwrap();
    assert!(segs.iter().any(|p| !p.exists()), "the checkpoint deleted some of the gap's segments");
    let mut got = Vec::new();
    let mut aheads = Vec::new();
    gap.for_each_ahead_of(|b, ahead| {
        got.push(b);
        aheads.push(ahead);
        Ok(())
    })
    .unwrap();
    assert_eq!(got, expected, "the gap read again equals the log read whole when it was taken");
    // What each batch says lies ahead: every batch still to come at or above it, the next
    // one at it; nothing after the last.
    for (i, ahead) in aheads.iter().enumerate() {
        match ahead {
            Some(k) => {
                assert_eq!(key(&got[i + 1]), *k, "batch {i}");
                assert!(got[i + 1..].iter().all(|b| key(b) >= *k), "batch {i}");
            }
            None => assert_eq!(i + 1, got.len(), "batch {i}"),
        }
    }
    // A segment of a gap damaged since (a byte in the middle of the second stream's third
    // segment): an error naming it, after the batches before it (of both streams).
    write(800, 1400);
    let gap = ditto_log::replica::batches_after(dir.path(), epoch, ckpt.ts).unwrap().unwrap();
    let n = gap.len();
    let now = segment_files(dir.path());
    let victim =
        now.iter().filter(|p| p.file_name().unwrap().to_str().unwrap().contains("stream-0001")).nth(2).unwrap().clone();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&victim).unwrap();
        let len = f.metadata().unwrap().len();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, len / 2).unwrap();
        f.write_all_at(&[b[0] ^ 0xff], len / 2).unwrap();
    }
    let mut seen = 0;
    let err = gap
        .for_each(|_| {
            seen += 1;
            Ok(())
        })
        .unwrap_err();
    assert!(err.to_string().contains(&victim.display().to_string()), "{err}");
    assert!(seen > 0 && seen < n, "{seen} of {n} batches before the damaged segment");
    drop(write);
    drop(d);
}

/// A gap of more segments than it keeps open (256, each stream's first 128 here) opens
/// the rest again by name when it reaches them: the same batches as the segments read
/// whole, merged; and one such segment deleted meanwhile (a checkpoint) is an error
/// naming it, after the batches before it (what the open ones hold, of both streams),
/// never a stream sent with a hole.
#[test]
fn a_gap_of_more_segments_than_it_keeps_open_reopens_the_rest_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // About one batch a segment.
    let (d, mut write) = alternating_log(dir.path(), 1 << 10, 1000);
    write(0, 700);
    at_rest(&d);
    let epoch = d.logger().epoch();
    let segs = segment_files(dir.path());
    assert!(segs.len() > 300, "{} segments", segs.len());
    let expected = gap_read_whole(&segs, Ts::ZERO);
    let gap = ditto_log::replica::batches_after(dir.path(), epoch, Ts::ZERO).unwrap().unwrap();
    assert_eq!(gap.collect().unwrap(), expected);
    // Taken again, then a checkpoint deletes the closed segments: those it holds open are
    // read all the same; the first it must open again by name is gone.
    let gap = ditto_log::replica::batches_after(dir.path(), epoch, Ts::ZERO).unwrap().unwrap();
    let n = gap.len();
    d.checkpoint().unwrap();
    assert!(segment_files(dir.path()).len() < 10, "the checkpoint deleted the closed segments");
    let mut seen = 0;
    let err = gap
        .for_each(|_| {
            seen += 1;
            Ok(())
        })
        .unwrap_err();
    assert!(err.to_string().contains("could not be opened again"), "{err}");
    assert!(seen > 200 && seen < n, "{seen} of {n} batches before the deleted segment");
    drop(write);
    drop(d);
}

/// A log of two streams, every commit `EveryBatch`, segments of `segment_bytes` bytes,
/// and a writer of keys `from..to` alternating between the streams, values of
/// `value_len` bytes.
fn alternating_log(
    dir: &std::path::Path,
    segment_bytes: u64,
    value_len: usize,
) -> (ditto_log::Durable, impl FnMut(u64, u64)) {
    let log =
        LogOptions { durability: Durability::EveryBatch, segment_bytes_max: segment_bytes, ..LogOptions::default() };
    let d = open(dir, OpenOptions { workers: 2, log, ..Default::default() }).unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut ws = [d.db().worker(WorkerId(0)).unwrap(), d.db().worker(WorkerId(1)).unwrap()];
    let value = vec![9u8; value_len];
    let write = move |from: u64, to: u64| {
        for i in from..to {
            let w = &mut ws[(i % 2) as usize];
            w.run(|x| x.put(t, &i.to_be_bytes(), &value).map(|_| ())).unwrap().1.wait().unwrap();
        }
    };
    (d, write)
}

/// Until the log is at rest (`Logger::at_rest`, bounded): each stream's vouch for its
/// last write, framed once it has been quiet a while, is in its segment, and nothing more
/// will be written, so the segments read now are those a gap taken next holds.
fn at_rest(d: &ditto_log::Durable) {
    let since = std::time::Instant::now();
    while !d.logger().at_rest() {
        assert!(since.elapsed() < std::time::Duration::from_secs(10), "the log never came to rest");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A batch's place in a gap's merge: its first transaction, a heartbeat's bound.
fn gap_key(b: &Bytes) -> Ts {
    let h = decode_batch_checksums(b).unwrap().0.header;
    if h.txn_count > 0 {
        h.first_ts
    } else {
        h.bound_ts
    }
}

/// What a gap above `after` must send: every segment read at once, its batches with a
/// bound above `after`, the streams' batches, stream after stream, sorted stably by
/// `gap_key` (merged in timestamp order, each stream in its own).
fn gap_read_whole(segs: &[std::path::PathBuf], after: Ts) -> Vec<Bytes> {
    let mut out = Vec::new();
    for p in segs {
        let raw = Bytes::from(std::fs::read(p).unwrap());
        for (off, b) in ditto_log::format::read_segment(&raw).unwrap().batches {
            if b.header.bound_ts > after {
                out.push(raw.slice(off as usize..off as usize + b.header.total_len()));
            }
        }
    }
    out.sort_by_key(gap_key);
    out
}

/// A node that missed the failover away from epoch 1 and was chosen in the next one
/// (docs/cluster.md, "A node that missed an epoch"): its replica log holds epoch 1's
/// batches above that epoch's point (commits the failover discarded), then what it fetched
/// of epoch 2, whose timestamps overlap them. Promoted with epoch 1's cut (`EpochCut`), it
/// replays none of the discarded commits, and none of them shadows a newer write of epoch
/// 2; without the cut it would. A directory whose checkpoint lies above epoch 1's point
/// cannot be cut back there: its promotion is refused, and changes nothing.
#[test]
fn a_promotion_cuts_an_older_epochs_batches_at_that_epochs_point() {
    use ditto_log::replica::{open_replica_at, open_replica_upto, EpochCut};
    use ditto_log::Epoch;
    use missed_epoch::{batch, missed_epoch_dir, recovered};
    let catalog = tempfile::tempdir().unwrap();
    let (d, t) = primary_with_table(catalog.path());
    d.close();
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let make = || missed_epoch_dir(catalog.path(), t, &storage);
    let batch = |stream, epoch, txns: &[(u64, u64, &str)], bound| batch(t, stream, epoch, txns, bound);
    let cut = EpochCut { epoch: Epoch(1), point: Ts(5) };
    let rows = |db: &ditto_engine::Database| missed_epoch::rows(db, t);
    let want = recovered();

    let dir = make();
    let o = open_replica_at(dir.path(), 2, &storage, Ts(9), &[cut]).unwrap();
    assert_eq!(o.cut, Ts(9));
    assert_eq!(rows(&o.db), want, "epoch 1 up to its point, then epoch 2");
    assert_eq!(o.report.log_txns_dropped_above_cut, 5, "records 6..=10 of epoch 1");

    // Without the cut: records 6, 7 and 9 come back, and 8 is epoch 1's (ts 8 > 7).
    let dir = make();
    let o = open_replica_at(dir.path(), 2, &storage, Ts(9), &[]).unwrap();
    let got = rows(&o.db);
    assert!(got.contains(&(8, "epoch 1".to_string())) && got.contains(&(6, "epoch 1".to_string())), "{got:?}");

    // Two epochs missed: epoch 2's batches above its point 9 (record 30 at ts 11, fetched
    // in a round that did not open) lie before epoch 3's (record 31 at ts 12); promoted at
    // epoch 3's point 12 with both older cuts, neither epoch's discarded commits come back.
    let dir = make();
    let later = [
        batch(0, 2, &[(11, 30, "epoch 2, discarded")], 11),
        batch(0, 3, &[(12, 31, "epoch 3")], 12),
        batch(1, 3, &[], 12),
    ];
    append_fetched(dir.path(), 2, &later, &storage).unwrap();
    let cuts = [cut, EpochCut { epoch: Epoch(2), point: Ts(9) }];
    let o = open_replica_at(dir.path(), 2, &storage, Ts(12), &cuts).unwrap();
    let rows_to = |db: &ditto_engine::Database, n: u64| -> Vec<u64> {
        let r = db.read();
        (1..=n).filter(|i| r.get(t, format!("r{i}").as_bytes()).unwrap().is_some()).collect()
    };
    assert_eq!(rows_to(&o.db, 40), vec![1, 2, 3, 4, 5, 8, 20, 31]);

    // Its whole log folded into a checkpoint (its server started before its node learned
    // of the failover): refused at the promotion, the directory as it was.
    let dir = make();
    drop(open_replica_upto(dir.path(), 2, &storage, None).unwrap());
    let before = replica_holdings(dir.path(), 2, None).unwrap();
    let e = open_replica_at(dir.path(), 2, &storage, Ts(9), &[cut]).err().expect("refused");
    assert!(e.to_string().contains("the point epoch 1 was cut at"), "{e}");
    let after = replica_holdings(dir.path(), 2, None).unwrap();
    assert_eq!((before.streams, before.newest), (after.streams, after.newest));
    assert!(!ditto_log::replica::can_cut_at(dir.path(), Ts(5)).unwrap(), "what its node reports (ineligible)");
}

/// Copies a data directory (its lock file left out).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.metadata().unwrap().is_dir() {
            copy_dir(&src, &dst);
        } else if e.file_name() != "LOCK" {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// A last resort whose own log the previous build wrote (log format 4: its segments name
/// their stream count, so that check passes) is refused a fetch of what it shipped (those
/// batches of format 4 too, as its peers' replica logs kept them), and nothing changes:
/// the new segment would be of this build's format, whose batches must be of its version
/// (found by a review, 2026-12-03: the next open refused the segment).
#[test]
fn a_fetch_of_an_older_builds_batches_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (closed, batches) = primary_with_400_commits(dir.path());
    drop(closed);
    let as_v4 = |b: &ditto_log::format::Batch| {
        let mut h = b.header;
        h.version = 4;
        h.reuse_ts = Ts(0);
        h.payload_crc = h.payload_checksum(b.stored());
        let mut out = h.encode();
        out.extend_from_slice(b.stored());
        out
    };
    // Every segment rewritten as the previous build wrote it: version 4 in its header and
    // its batches (72-byte headers, no reuse bound).
    for p in segment_files(dir.path()) {
        let scan = ditto_log::format::read_segment(&Bytes::from(std::fs::read(&p).unwrap())).unwrap();
        let mut out = scan.header.encode().to_vec();
        out[8..12].copy_from_slice(&4u32.to_le_bytes());
        let crc = crc32c::crc32c(&out[..44]);
        out[44..48].copy_from_slice(&crc.to_le_bytes());
        for (_, b) in &scan.batches {
            out.extend_from_slice(&as_v4(b));
        }
        std::fs::write(&p, out).unwrap();
    }
    let seg1 = segment_files(dir.path()).into_iter().rfind(|p| p.to_string_lossy().contains("stream-0001")).unwrap();
    let scan = ditto_log::format::read_segment(&Bytes::from(std::fs::read(&seg1).unwrap())).unwrap();
    assert_eq!(scan.header.streams, 2, "a version-4 header names its stream count");
    let (at, lost) = scan.batches.iter().rev().find(|(_, b)| b.header.txn_count > 0).unwrap();
    assert_eq!(lost.header.header_len(), 72);
    std::fs::OpenOptions::new().write(true).open(&seg1).unwrap().set_len(*at).unwrap();
    let fetched: Vec<Bytes> = batches
        .iter()
        .map(|b| decode_batch_checksums(b).unwrap().0)
        .filter(|b| b.header.stream.0 == 1 && b.header.first_ts >= lost.header.first_ts)
        .map(|b| Bytes::from(as_v4(&b)))
        .collect();
    assert!(!fetched.is_empty());
    let before: Vec<_> =
        segment_files(dir.path()).into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();
    let err = ditto_log::recovery::append_own_fetched(dir.path(), 1, &fetched, &RealStorage).unwrap_err();
    assert!(err.to_string().contains("is of log format 4, written by an older ditto"), "{err}");
    let after: Vec<_> =
        segment_files(dir.path()).into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();
    assert!(before == after, "the refusal changed the log");
    // The log opens as it was (the previous build's format is read).
    drop(ditto_log::open(dir.path(), ditto_log::OpenOptions { workers: 2, ..Default::default() }).unwrap());
}

/// A last resort whose own log an older build wrote (log format 3: its segment headers
/// name no stream count, and a segment's batches are all of its version) is refused a
/// fetch with the way out, and nothing changes: a segment of this build's format added to
/// it left a directory no open, report or fetch took (found by a review, 2026-12-03).
#[test]
fn a_fetch_into_an_older_builds_log_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (closed, batches) = primary_with_400_commits(dir.path());
    drop(closed);
    // Every segment rewritten as version 3 wrote it: the header's version, its stream
    // count and `prev_ts` zero; every batch's version, with its checksums.
    for p in segment_files(dir.path()) {
        let file = Bytes::from(std::fs::read(&p).unwrap());
        let scan = ditto_log::format::read_segment(&file).unwrap();
        let mut out = scan.header.encode().to_vec();
        out[8..12].copy_from_slice(&3u32.to_le_bytes());
        out[32..44].fill(0);
        let crc = crc32c::crc32c(&out[..44]);
        out[44..48].copy_from_slice(&crc.to_le_bytes());
        for (o, b) in &scan.batches {
            let mut h = b.header;
            let at = *o as usize + h.header_len();
            let payload = &file[at..at + h.stored_len as usize];
            h.version = 3;
            h.payload_crc = h.payload_checksum(payload);
            out.extend_from_slice(&h.encode());
            out.extend_from_slice(payload);
        }
        std::fs::write(&p, out).unwrap();
    }
    // Stream 1 lost its last batch with transactions (a crash before it was durable):
    // what the fetch brings back, as this build frames it.
    let seg1 = segment_files(dir.path()).into_iter().rfind(|p| p.to_string_lossy().contains("stream-0001")).unwrap();
    let scan = ditto_log::format::read_segment(&Bytes::from(std::fs::read(&seg1).unwrap())).unwrap();
    let (at, lost) = scan.batches.iter().rev().find(|(_, b)| b.header.txn_count > 0).unwrap();
    std::fs::OpenOptions::new().write(true).open(&seg1).unwrap().set_len(*at).unwrap();
    let fetched: Vec<Bytes> = batches
        .iter()
        .filter(|b| decode_batch_checksums(b).unwrap().0.header.first_ts >= lost.header.first_ts)
        .cloned()
        .collect();
    let fetched: Vec<Bytes> =
        fetched.into_iter().filter(|b| decode_batch_checksums(b).unwrap().0.header.stream.0 == 1).collect();
    assert!(!fetched.is_empty());
    let held = ditto_log::recovery::primary_log_holdings(dir.path(), None).unwrap().0;
    let before: Vec<_> =
        segment_files(dir.path()).into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();
    let err = ditto_log::recovery::append_own_fetched(dir.path(), 1, &fetched, &RealStorage).unwrap_err();
    assert!(err.to_string().contains("written by an older ditto (log format before 4)"), "{err}");
    let after: Vec<_> =
        segment_files(dir.path()).into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect();
    assert!(before == after, "the refusal changed the log");
    assert_eq!(ditto_log::recovery::primary_log_holdings(dir.path(), None).unwrap().0.streams, held.streams);
}

/// A failover's last resort that lacks part of what it shipped (it crashed before that
/// part was durable; a backup received it) takes it back into its own log
/// (`recovery::append_own_fetched`), as the stream's next segment: it then holds, serves
/// and recovers what the primary's whole log does. A torn tail is cut first; a damaged
/// batch or one of another stream is refused and changes nothing; adding the same
/// batches again adds nothing.
#[test]
fn a_last_resort_takes_back_into_its_own_log_what_it_shipped_but_lost() {
    let whole = tempfile::tempdir().unwrap();
    let (closed, batches) = primary_with_400_commits(whole.path());
    drop(closed);
    let header = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    // A backup that received every batch.
    let backup = tempfile::tempdir().unwrap();
    std::fs::copy(whole.path().join("CATALOG"), backup.path().join("CATALOG")).unwrap();
    let mut log = ReplicaLog::create(backup.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
    for x in &batches {
        log.append(x, false, header(x).bound_ts);
    }
    log.sync().unwrap();
    drop(log);

    // The old primary: the same directory, as a crash leaves it when stream 1's tail was
    // not yet durable: its segment cut in the middle of a batch two thirds in, and stream
    // 0's cut at its first batch whose floor (every stream durable up to it) lies above
    // what stream 1 then holds (worker 1 wrote after worker 0: none does).
    let old = tempfile::tempdir().unwrap();
    copy_dir(whole.path(), old.path());
    let segs = segment_files(old.path());
    let scan = |p: &std::path::Path| ditto_log::format::read_segment(&Bytes::from(std::fs::read(p).unwrap())).unwrap();
    let (seg0, seg1) = (&segs[0], &segs[1]);
    let b1 = scan(seg1).batches;
    let (at, _) = &b1[b1.len() * 2 / 3];
    let kept1 = b1.iter().filter(|(o, _)| o < at).map(|(_, b)| b.header.bound_ts).max().unwrap();
    std::fs::OpenOptions::new().write(true).open(seg1).unwrap().set_len(at + 7).unwrap();
    let cut0 = scan(seg0).batches.iter().find(|(_, b)| b.header.floor_ts > kept1).map(|(o, _)| *o);
    if let Some(o) = cut0 {
        std::fs::OpenOptions::new().write(true).open(seg0).unwrap().set_len(o).unwrap();
    }
    let held = |dir: &std::path::Path| ditto_log::recovery::primary_log_holdings(dir, None).unwrap().0;
    let (hw, ho) = (held(whole.path()), held(old.path()));
    assert!(ho.streams[1] < hw.streams[1], "{ho:?} {hw:?}");
    // (Less a closed log's empty last batch, at the bound already written, which vouches
    // for the write before it: it adds nothing, and an append counts it as held.)
    let fetched = adding(replica_stream_batches(backup.path(), 1, ho.streams[1]).unwrap(), ho.streams[1]);
    assert!(!fetched.is_empty());

    let files = || {
        let mut v: Vec<(std::path::PathBuf, u64)> =
            segment_files(old.path()).into_iter().map(|p| (p.clone(), std::fs::metadata(&p).unwrap().len())).collect();
        v.sort();
        v
    };
    let before = files();
    // A damaged batch, and a batch of the other stream, are refused; nothing changes.
    let mut bad = fetched[0].to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let err = ditto_log::recovery::append_own_fetched(old.path(), 1, &[Bytes::from(bad)], &*storage).unwrap_err();
    assert!(err.to_string().contains("a fetched batch"), "{err}");
    let other = batches.iter().find(|b| header(b).stream.0 == 0).unwrap().clone();
    let err = ditto_log::recovery::append_own_fetched(old.path(), 1, &[other], &*storage).unwrap_err();
    assert!(err.to_string().contains("of stream 0, not 1"), "{err}");
    assert_eq!(files(), before, "the refusals changed nothing");

    // While a server holds the directory's lock, nothing is written.
    {
        let _held = ditto_log::replica::lock_replica_dir(old.path()).unwrap();
        let err = ditto_log::recovery::append_own_fetched(old.path(), 1, &fetched, &*storage).unwrap_err();
        assert!(matches!(err, ditto_log::LogError::InUse(_)), "{err}");
    }
    assert_eq!(files(), before);
    // A segment the writer began and never named (its header at most) does not stand in the
    // way: it goes. (Stream 0's: a begun segment follows one the writer cut to its last batch
    // and synced, and stream 0's ends whole here; after stream 1's torn tail it would be
    // damage, refused, `a_torn_tail_before_a_begun_segment_is_damage` in durability.rs.)
    let last1 = before.iter().map(|(p, _)| p).rfind(|p| p.to_string_lossy().contains("stream-0001")).unwrap();
    let name = last1.file_name().unwrap().to_string_lossy().to_string();
    let seq: u64 = name[name.len() - 14..name.len() - 4].parse().unwrap();
    let last0 = before.iter().map(|(p, _)| p).rfind(|p| p.to_string_lossy().contains("stream-0000")).unwrap();
    let name0 = last0.file_name().unwrap().to_string_lossy().to_string();
    let seq0: u64 = name0[name0.len() - 14..name0.len() - 4].parse().unwrap();
    let begun = last0.with_file_name(format!("{}{:010}.seg.new", &name0[..name0.len() - 14], seq0 + 1));
    std::fs::write(&begun, &std::fs::read(last0).unwrap()[..ditto_log::format::SEGMENT_HEADER_LEN]).unwrap();
    // A copy, to cut short below.
    let again_dir = tempfile::tempdir().unwrap();
    copy_dir(old.path(), again_dir.path());

    let done = ditto_log::recovery::append_own_fetched(old.path(), 1, &fetched, &*storage).unwrap();
    assert_eq!((done.written, done.held, done.older), (fetched.len(), 0, 0));
    assert_eq!(files().len(), before.len() + 1, "one segment added");
    assert!(!begun.exists(), "the unfinished segment went");
    let added = files().into_iter().map(|(p, _)| p).find(|p| !before.iter().any(|(q, _)| q == p)).unwrap();
    assert_eq!(
        added.file_name().unwrap().to_string_lossy(),
        format!("{}{:010}.seg", &name[..name.len() - 14], seq + 1)
    );
    assert_eq!(scan(&added).header.prev_ts, kept1, "the highest timestamp of the segments before it");
    let ho = held(old.path());
    assert_eq!(ho.streams, hw.streams, "it holds every stream as far as the whole log");
    assert_eq!(ho.newest, hw.newest);
    // Again: nothing more is written.
    let again = ditto_log::recovery::append_own_fetched(old.path(), 1, &fetched, &*storage).unwrap();
    assert_eq!((again.written, again.held), (0, fetched.len()));
    // It serves what the whole log serves, and counts the same transactions above a point.
    let from = |dir: &std::path::Path| ditto_log::recovery::primary_stream_batches(dir, 1, Ts::ZERO, Ts::ZERO).unwrap();
    assert_eq!(adding(from(old.path()), Ts::ZERO), adding(from(whole.path()), Ts::ZERO));
    let mid = Ts((hw.streams[1].0 + kept1.0) / 2);
    let above = |dir: &std::path::Path| ditto_log::recovery::primary_log_holdings(dir, Some(mid)).unwrap().0.txns_above;
    assert_eq!(above(old.path()), above(whole.path()));

    // Cut short among the batches (a crash after the rename): the new segment ends torn;
    // the log still reads, holding part, and a second try adds the rest.
    ditto_log::recovery::append_own_fetched(again_dir.path(), 1, &fetched, &*storage).unwrap();
    let torn = again_dir.path().join("log").join(added.file_name().unwrap());
    let len = std::fs::metadata(&torn).unwrap().len();
    let header_len = ditto_log::format::SEGMENT_HEADER_LEN as u64;
    std::fs::OpenOptions::new().write(true).open(&torn).unwrap().set_len(header_len + (len - header_len) / 2).unwrap();
    let part = held(again_dir.path());
    assert!(part.streams[1] >= kept1 && part.streams[1] < hw.streams[1], "{part:?}");
    let rest = ditto_log::recovery::append_own_fetched(again_dir.path(), 1, &fetched, &*storage).unwrap();
    assert!(rest.written > 0 && rest.held > 0 && rest.written + rest.held == fetched.len(), "{rest:?}");
    assert_eq!(held(again_dir.path()).streams, hw.streams);

    // Cut at the point as a last resort: the rows of the whole log cut there.
    let point = *hw.streams.iter().min().unwrap();
    let o = ditto_log::replica::open_own_log_at(old.path(), 2, &storage, point).unwrap();
    let w = ditto_log::replica::open_own_log_at(whole.path(), 2, &storage, point).unwrap();
    assert_eq!((o.cut, w.cut), (point, point));
    let (to, tw) = (o.db.table_id("t").unwrap(), w.db.table_id("t").unwrap());
    assert_eq!(o.db.count(to).unwrap(), w.db.count(tw).unwrap());
    assert_eq!(o.db.count(to).unwrap(), 400, "stream 1's lost tail is back");
}

/// Damage in the newest replica log file after a report. In its middle (valid entries
/// after it), the read of a stream, a report and an open each refuse it, naming the file
/// and the offset: it is not a torn tail, which a crash leaves only at the end (before
/// 2026-12-02 each read it as torn and dropped every acknowledged entry after it). In its
/// last entry (a torn tail), the read ends quietly there, and what it returns as the
/// stream's reach falls below the reported position, which the answering node checks
/// (crates/ditto/src/node.rs, `fetch_job`) rather than send an answer that ends early as if
/// it were whole. Undamaged, the read reaches exactly the reported position.
#[test]
fn a_read_that_ends_in_damage_reaches_less_than_the_holdings_said() {
    let (batches, storage, dir) = empty_backup_of_400_commits();
    // (Two writes, each synced: the second's entries claim the first's bytes synced.)
    let first_synced = {
        let mut log = ReplicaLog::create(dir.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
        let half = batches.len() / 2;
        for (i, x) in batches.iter().enumerate() {
            log.append(x, false, decode_batch_checksums(x).unwrap().0.header.bound_ts);
            if i + 1 == half {
                log.sync().unwrap();
            }
        }
        let files: Vec<_> = std::fs::read_dir(ditto_log::replica::replica_dir(dir.path())).unwrap().collect();
        let len = std::fs::metadata(files[0].as_ref().unwrap().path()).unwrap().len() as usize;
        log.sync().unwrap();
        len
    };
    let reported = replica_holdings(dir.path(), 2, None).unwrap();
    let read_all = |d: &std::path::Path, s: usize| {
        let mut n = 0;
        let reach = ditto_log::replica::replica_stream_batches_each(d, s, Ts::ZERO, &mut |_| {
            n += 1;
            true
        })
        .unwrap();
        (reach, n)
    };
    for s in 0..2 {
        assert_eq!(read_all(dir.path(), s).0, reported.streams[s], "stream {s} undamaged");
    }
    // A sink that asks for no more: no reach is claimed.
    let stopped = ditto_log::replica::replica_stream_batches_each(dir.path(), 0, Ts::ZERO, &mut |_| false).unwrap();
    assert_eq!(stopped, Ts::ZERO);

    let files: Vec<_> =
        std::fs::read_dir(ditto_log::replica::replica_dir(dir.path())).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let undamaged = std::fs::read(&files[0]).unwrap();
    // In the middle of what was synced: refused, by a fetch's read, a report and an open
    // alike.
    let mut raw = undamaged.clone();
    assert!(first_synced > 3 * 4096, "the first write is {first_synced} bytes");
    let mid = first_synced / 2;
    raw[mid] ^= 0x5a;
    std::fs::write(&files[0], &raw).unwrap();
    let middle = fresh_copy(dir.path());
    let rdir = ditto_log::replica::replica_dir(middle.path());
    let said = |e: String| assert!(e.contains("rlog") && e.contains("valid entries after it"), "{e}");
    for s in 0..2 {
        let r = ditto_log::replica::replica_stream_batches_each(middle.path(), s, Ts::ZERO, &mut |_| true);
        said(r.unwrap_err().to_string());
    }
    ditto_log::replica::forget_holdings();
    said(replica_holdings(middle.path(), 2, None).unwrap_err().to_string());
    let before_open: Vec<_> = std::fs::read_dir(&rdir).unwrap().map(|e| e.unwrap().path()).collect();
    said(ditto_log::replica::open_replica(middle.path(), 1, &storage).err().expect("refused").to_string());
    let after_open: Vec<_> = std::fs::read_dir(&rdir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(before_open, after_open, "the refused open removed nothing");
    assert_eq!(std::fs::read(&after_open[0]).unwrap(), raw, "nor cut it");
    // In the last entry holding transactions (the entries after it are empty batches that
    // add no bound: a closed log's last ones), with nothing after it that claims it
    // synced: a torn tail.
    let mut raw = undamaged;
    let mut at = ditto_log::replica::REPLICA_HEADER_LEN;
    let mut last_data = 0;
    for x in &batches {
        if decode_batch_checksums(x).unwrap().0.header.txn_count > 0 {
            last_data = at;
        }
        at += ditto_log::replica::ENTRY_HEADER_LEN + x.len();
    }
    assert_eq!(at, raw.len());
    let at = last_data + ditto_log::replica::ENTRY_HEADER_LEN + ditto_log::format::BATCH_HEADER_LEN + 1;
    raw[at] ^= 0x5a;
    std::fs::write(&files[0], &raw).unwrap();
    let damaged = fresh_copy(dir.path());
    let mut before = 0;
    let mut short = 0;
    for s in 0..2 {
        let (reach, n) = read_all(damaged.path(), s);
        before += n;
        // (The stream whose batch the last entry held reaches less.)
        assert!(reach <= reported.streams[s], "stream {s}: reach {reach:?} against {:?}", reported.streams[s]);
        short += usize::from(reach < reported.streams[s]);
    }
    assert_eq!(short, 1, "the torn entry's stream reaches less than its report said");
    assert!(before > 0, "the batches before the damage are read, and the read ends quietly");
    // A report read afresh (the answering node forgets what it read last when it refuses
    // such an answer) says what the damaged log holds: the next plan does not count on it.
    ditto_log::replica::forget_holdings();
    let afresh = replica_holdings(damaged.path(), 2, None).unwrap();
    for s in 0..2 {
        assert_eq!(afresh.streams[s], read_all(damaged.path(), s).0, "stream {s}");
    }
}

/// A backup writes a burst of entries in one write before one fsync, and a power cut may
/// keep a later page of it and not an earlier one: damage in the middle of such a write,
/// whole entries after it, is a torn write (every entry of the write claims only what lay
/// before it synced), read as the file's end by a fetch's read, a report and an open,
/// which keeps the entries before it; before replica log format 2 it was damage, and the
/// backup copied its primary's data again. A file of format 1 (no claims) is told as
/// before.
#[test]
fn a_burst_torn_out_of_order_is_a_torn_tail() {
    let (batches, storage, dir) = empty_backup_of_400_commits();
    {
        let mut log = ReplicaLog::create(dir.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
        for x in &batches {
            log.append(x, false, decode_batch_checksums(x).unwrap().0.header.bound_ts);
        }
        log.sync().unwrap();
    }
    let rdir = ditto_log::replica::replica_dir(dir.path());
    let files: Vec<_> = std::fs::read_dir(&rdir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let undamaged = std::fs::read(&files[0]).unwrap();
    let whole = replica_holdings(dir.path(), 2, None).unwrap();
    for (n, at) in [(0, undamaged.len() / 3), (1, undamaged.len() / 2), (2, 2 * undamaged.len() / 3)] {
        // A 512-byte sector of the write lost (zeros), later ones kept.
        let mut raw = undamaged.clone();
        raw[at..at + 512].fill(0);
        std::fs::write(&files[0], &raw).unwrap();
        let torn = fresh_copy(dir.path());
        ditto_log::replica::forget_holdings();
        let held = replica_holdings(torn.path(), 2, None).unwrap_or_else(|e| panic!("sector {n}: {e}"));
        assert!(held.streams.iter().zip(&whole.streams).all(|(h, w)| h <= w), "sector {n}");
        assert!(held.streams != whole.streams, "sector {n}: the entries from the lost sector on are not held");
        for s in 0..2 {
            let reach = ditto_log::replica::replica_stream_batches_each(torn.path(), s, Ts::ZERO, &mut |_| true);
            assert_eq!(reach.unwrap(), held.streams[s], "sector {n}, stream {s}");
        }
        let opened = ditto_log::replica::open_replica(torn.path(), 1, &storage).unwrap_or_else(|e| panic!("{e}"));
        let t = opened.db.table_id("t").unwrap();
        let kept = opened.db.count(t).unwrap();
        assert!(kept < 400, "sector {n}: {kept} rows kept");
        // The same bytes in a file of format 1: damage, as before.
        let mut v1 = raw.clone();
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = crc32c::crc32c(&v1[..28]);
        v1[28..32].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&files[0], &v1).unwrap();
        let old = fresh_copy(dir.path());
        ditto_log::replica::forget_holdings();
        let e = replica_holdings(old.path(), 2, None).unwrap_err().to_string();
        assert!(e.contains("valid entries after it"), "{e}");
    }
}

/// As above, the torn burst the third write of a file whose first two were synced: its
/// entries claim the first two synced, so each reader (a report, a stream's read an entry
/// at a time, an open) must compare the claims with the failure's offset in the file, not
/// in what it read; and damage to the second write, which the third's claims prove
/// synced, is refused by each.
#[test]
fn a_torn_third_write_is_cut_and_damage_to_the_synced_second_is_refused() {
    let (batches, storage, dir) = empty_backup_of_400_commits();
    let (a, b) = (batches.len() / 3, 2 * batches.len() / 3);
    let mut ends = Vec::new();
    {
        let mut log = ReplicaLog::create(dir.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
        for (i, x) in batches.iter().enumerate() {
            log.append(x, false, decode_batch_checksums(x).unwrap().0.header.bound_ts);
            if i + 1 == a || i + 1 == b || i + 1 == batches.len() {
                log.sync().unwrap();
                let f = std::fs::read_dir(ditto_log::replica::replica_dir(dir.path())).unwrap().next().unwrap();
                ends.push(std::fs::metadata(f.unwrap().path()).unwrap().len() as usize);
            }
        }
    }
    let rdir = ditto_log::replica::replica_dir(dir.path());
    let files: Vec<_> = std::fs::read_dir(&rdir).unwrap().map(|e| e.unwrap().path()).collect();
    let undamaged = std::fs::read(&files[0]).unwrap();
    assert!(ends[0] > 1024 && ends[1] - ends[0] > 1024 && ends[2] - ends[1] > 2048, "{ends:?}");
    let whole = replica_holdings(dir.path(), 2, None).unwrap();
    let read = |d: &std::path::Path| -> Result<Vec<Ts>, String> {
        ditto_log::replica::forget_holdings();
        let held = replica_holdings(d, 2, None).map_err(|e| e.to_string())?;
        for s in 0..2 {
            let reach = ditto_log::replica::replica_stream_batches_each(d, s, Ts::ZERO, &mut |_| true)
                .map_err(|e| e.to_string())?;
            assert_eq!(reach, held.streams[s], "stream {s}");
        }
        ditto_log::replica::open_replica(d, 1, &storage).map_err(|e| e.to_string())?;
        Ok(held.streams)
    };
    // A sector of the third write lost: torn.
    let mut raw = undamaged.clone();
    let at = (ends[1] + ends[2]) / 2;
    raw[at..at + 512].fill(0);
    std::fs::write(&files[0], &raw).unwrap();
    let held = read(fresh_copy(dir.path()).path()).unwrap_or_else(|e| panic!("a torn third write: {e}"));
    assert!(held != whole.streams && held.iter().zip(&whole.streams).all(|(h, w)| h <= w), "{held:?}");
    // A byte of the second write damaged: the third's claims prove it synced.
    let mut raw = undamaged;
    raw[(ends[0] + ends[1]) / 2] ^= 0x5a;
    std::fs::write(&files[0], &raw).unwrap();
    let fresh = fresh_copy(dir.path());
    let e = read(fresh.path()).expect_err("damage to a synced write is refused");
    assert!(e.contains("valid entries after it"), "{e}");
    // Each reader, not only the first: the stream's read and the open refuse it too.
    for s in 0..2 {
        let r = ditto_log::replica::replica_stream_batches_each(fresh.path(), s, Ts::ZERO, &mut |_| true);
        assert!(r.unwrap_err().to_string().contains("valid entries after it"));
    }
    let e = ditto_log::replica::open_replica(fresh.path(), 1, &storage).err().expect("refused").to_string();
    assert!(e.contains("valid entries after it"), "{e}");
}

/// Real files, but replica log files cannot be removed.
struct ReplicaFilesStay;

impl Storage for ReplicaFilesStay {
    fn create_new(&self, path: &std::path::Path) -> std::io::Result<Box<dyn ditto_log::storage::LogFile>> {
        RealStorage.create_new(path)
    }
    fn create_segment(
        &self,
        path: &std::path::Path,
        direct: bool,
    ) -> std::io::Result<Box<dyn ditto_log::storage::LogFile>> {
        RealStorage.create_segment(path, direct)
    }
    fn remove(&self, path: &std::path::Path) -> std::io::Result<()> {
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("rlog-")) {
            return Err(std::io::Error::other("simulated: a crash before the removal"));
        }
        RealStorage.remove(path)
    }
}

/// An open that cuts a replica log below what it holds (a standalone backup's rejoin at
/// its restarted primary's point) and stops after its checkpoint at the point, before the
/// files above it are gone (as a crash there does): the next open, with no limit, still
/// cuts at the point, and the one after it too. Before, the point was held in memory
/// only: the next open replayed what the cut had dropped.
#[test]
fn a_cut_that_stops_before_its_files_are_removed_still_applies_at_the_next_open() {
    let primary = tempfile::tempdir().unwrap();
    let (_closed, batches) = primary_with_400_commits(primary.path());
    let stream = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(primary.path().join("CATALOG"), dir.path().join("CATALOG")).unwrap();
    let real: Arc<dyn Storage> = Arc::new(RealStorage);
    {
        let mut log = ReplicaLog::create(dir.path(), Arc::clone(&real), 2, 1, u64::MAX).unwrap();
        for b in &batches {
            log.append(b, false, stream(b).bound_ts);
        }
        log.sync().unwrap();
    }
    let whole = replica_holdings(dir.path(), 2, None).unwrap().cut;
    let point = Ts(whole.0 / 2);
    assert!(point > Ts::ZERO && point < whole);
    let stays: Arc<dyn Storage> = Arc::new(ReplicaFilesStay);
    let r = ditto_log::replica::open_replica_upto(dir.path(), 2, &stays, Some(point));
    assert!(r.is_err(), "the removal failed: the open stops there");
    drop(r);
    ditto_log::replica::forget_holdings();
    let o = ditto_log::replica::open_replica_upto(dir.path(), 2, &real, None).unwrap();
    assert_eq!(o.cut, point, "the cut still applies");
    drop(o);
    assert!(!dir.path().join(ditto_log::replica::CUT_MARK_FILE).exists(), "the mark goes once the cut is done");
    let o = ditto_log::replica::open_replica_upto(dir.path(), 2, &real, None).unwrap();
    assert_eq!(o.cut, point, "and nothing above it came back");
}

/// A backup's directory that never received anything (its node was started as a backup and
/// the primary died before it joined), promoted at a point of 0: the empty engine opens the
/// directory as a primary's, and it takes writes. Before, the open refused it ("the
/// directory holds no checkpoint") and the failover had to move on to another epoch.
#[test]
fn an_empty_backup_directory_is_promoted_at_point_zero() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ditto_log::replica::replica_dir(dir.path())).unwrap();
    let storage: Arc<dyn Storage> = Arc::new(RealStorage);
    let opened = ditto_log::replica::open_replica_at(dir.path(), 2, &storage, Ts::ZERO, &[]).unwrap();
    assert_eq!(opened.cut, Ts::ZERO);
    let ditto_log::replica::ReplicaOpen { db, lock, .. } = opened;
    drop(lock);
    let d = open(
        dir.path(),
        OpenOptions {
            workers: 2,
            recovered: Some(ditto_log::Recovered(db)),
            epoch: Some(ditto_log::Epoch(2)),
            ..Default::default()
        },
    )
    .unwrap();
    let t = d.db().create_table("t").unwrap();
    let mut w = d.db().worker(WorkerId(0)).unwrap();
    w.run(|x| x.put(t, b"k", b"v").map(|_| ())).unwrap().1.wait().unwrap();
}

/// Real files, but the first fsync of the batches of a replica log file made after
/// `armed` is set fails (its header's passes): an EIO, the page cache holds its bytes,
/// the disk may not.
struct FailsOneSync {
    armed: std::sync::atomic::AtomicBool,
}

struct FailingSync {
    inner: Box<dyn ditto_log::storage::LogFile>,
    /// Syncs until the one that fails (0: none fails).
    fail_at: u32,
}

impl ditto_log::storage::LogFile for FailingSync {
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(buf)
    }
    fn extend_zeroed(&mut self, len: u64) -> std::io::Result<()> {
        self.inner.extend_zeroed(len)
    }
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.inner.truncate(len)
    }
    fn sync(&mut self) -> std::io::Result<()> {
        if self.fail_at > 0 {
            self.fail_at -= 1;
            if self.fail_at == 0 {
                return Err(std::io::Error::other("simulated: EIO on fsync"));
            }
        }
        self.inner.sync()
    }
}

impl Storage for FailsOneSync {
    fn create_new(&self, path: &std::path::Path) -> std::io::Result<Box<dyn ditto_log::storage::LogFile>> {
        let inner = RealStorage.create_new(path)?;
        let armed = self.armed.swap(false, std::sync::atomic::Ordering::SeqCst);
        Ok(Box::new(FailingSync { inner, fail_at: if armed { 2 } else { 0 } }))
    }
}

/// A fetched piece whose fsync fails is not left in the directory: a later holdings
/// report, whose own fsync through another descriptor would succeed on what the page
/// cache holds, would count it as held (and a power cut could then lose what a failover
/// counted on). The file goes; the next fetch adds it whole.
#[test]
fn a_fetched_piece_whose_fsync_failed_is_not_counted_as_held() {
    let primary = tempfile::tempdir().unwrap();
    let (_closed, batches) = primary_with_400_commits(primary.path());
    let stream = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    let s0: Vec<&Bytes> = batches.iter().filter(|b| stream(b).stream.0 == 0).collect();
    let cut_bound = stream(s0[s0.len() / 2]).bound_ts;
    let b = tempfile::tempdir().unwrap();
    std::fs::copy(primary.path().join("CATALOG"), b.path().join("CATALOG")).unwrap();
    let failing = Arc::new(FailsOneSync { armed: false.into() });
    let storage: Arc<dyn Storage> = failing.clone();
    {
        let mut log = ReplicaLog::create(b.path(), Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
        for x in batches.iter().filter(|x| !(stream(x).stream.0 == 0 && stream(x).bound_ts > cut_bound)) {
            log.append(x, false, stream(x).bound_ts);
        }
        log.sync().unwrap();
    }
    let before = replica_holdings(b.path(), 2, None).unwrap();
    assert_eq!(before.streams[0], cut_bound);
    let fetched: Vec<Bytes> =
        batches.iter().filter(|x| stream(x).stream.0 == 0 && stream(x).bound_ts > cut_bound).cloned().collect();
    let files = || std::fs::read_dir(ditto_log::replica::replica_dir(b.path())).unwrap().count();
    let n = files();
    failing.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = append_fetched(b.path(), 2, &fetched, &storage).unwrap_err().to_string();
    assert!(err.contains("EIO"), "{err}");
    assert_eq!(files(), n, "the file whose fsync failed is still there");
    ditto_log::replica::forget_holdings();
    assert_eq!(replica_holdings(b.path(), 2, None).unwrap().streams, before.streams, "counted as held");
    // Fetched again, it is held.
    append_fetched(b.path(), 2, &fetched, &storage).unwrap();
    let after = replica_holdings(b.path(), 2, None).unwrap();
    assert!(after.streams[0] > cut_bound, "{after:?}");
}

/// A fetch's new file comes after the newest one made durable: a backup killed after a
/// write and before its fsync leaves bytes only the page cache holds, and a power cut
/// after the fetch's own fsync could tear them. The newest file then no longer being the
/// last, every open refused the directory ("cut short (not the newest file)"). A power
/// cut right after the fetch (`ditto_log::power_cut`) leaves a directory that opens, with
/// every batch.
#[test]
fn a_fetch_makes_the_newest_file_durable_before_it_adds_one() {
    use ditto_log::power_cut::PowerCut;
    let primary = tempfile::tempdir().unwrap();
    let (_closed, batches) = primary_with_400_commits(primary.path());
    let stream = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    let (s0, s1): (Vec<&Bytes>, Vec<&Bytes>) = batches.iter().partition(|b| stream(b).stream.0 == 0);
    let tmp = tempfile::tempdir().unwrap();
    let (dir, attic, twin) = (tmp.path().join("b"), tmp.path().join("attic"), tmp.path().join("twin"));
    for d in [&dir, &attic, &twin] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::copy(primary.path().join("CATALOG"), dir.join("CATALOG")).unwrap();
    let cut = PowerCut::new(&dir, &attic);
    let storage: Arc<dyn Storage> = Arc::new(cut.clone());
    storage.sync_dir(&dir).unwrap();
    // Stream 1 whole and durable; then stream 0's first half written by a process that
    // was killed before its fsync: the same entries as a twin log's, appended as bytes.
    let half = s0.len() / 2;
    let real: Arc<dyn Storage> = Arc::new(RealStorage);
    let mut twin_log = ReplicaLog::create(&twin, Arc::clone(&real), 2, 1, u64::MAX).unwrap();
    let mut log = ReplicaLog::create(&dir, Arc::clone(&storage), 2, 1, u64::MAX).unwrap();
    for x in &s1 {
        log.append(x, false, stream(x).bound_ts);
        twin_log.append(x, false, stream(x).bound_ts);
    }
    log.sync().unwrap();
    twin_log.sync().unwrap();
    drop(log);
    let file = ditto_log::replica::replica_dir(&dir).join("rlog-0000000001.seg");
    let synced = std::fs::metadata(&file).unwrap().len() as usize;
    for x in &s0[..half] {
        twin_log.append(x, false, stream(x).bound_ts);
    }
    twin_log.sync().unwrap();
    let twin_bytes = std::fs::read(ditto_log::replica::replica_dir(&twin).join("rlog-0000000001.seg")).unwrap();
    {
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&file).unwrap().write_all(&twin_bytes[synced..]).unwrap();
    }
    // The fetch adds stream 0's second half in a file of its own.
    let rest: Vec<Bytes> = s0[half..].iter().map(|b| (*b).clone()).collect();
    append_fetched(&dir, 2, &rest, &storage).unwrap();
    // The power cut: what was not fsynced is torn halfway.
    let img = tmp.path().join("image");
    cut.image(&dir, &img, &mut |synced, written| synced + (written - synced) / 2).unwrap();
    let opened = ditto_log::replica::open_replica(&img, 2, &real)
        .unwrap_or_else(|e| panic!("the directory a power cut left after a fetch does not open: {e}"));
    let t = opened.db.table_id("t").unwrap();
    assert_eq!(opened.db.count(t).unwrap(), 400, "every batch is there");
}

/// A replica log whose fsync fails holds, for a later holdings report (which fsyncs the
/// files again through descriptors of its own, and which a failover's plan trusts), only
/// what earlier syncs made durable: the failed batches are cut off the file, not left in
/// the page cache for that fsync to find and count (found by a review, 2026-12-05).
#[test]
fn batches_whose_fsync_failed_are_not_counted_as_held() {
    let primary = tempfile::tempdir().unwrap();
    let (_closed, batches) = primary_with_400_commits(primary.path());
    let stream = |b: &Bytes| decode_batch_checksums(b).unwrap().0.header;
    // The file's first sync (its header) passes, the next (the batches) fails.
    let storage: Arc<dyn Storage> = Arc::new(FailsOneSync { armed: true.into() });
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(primary.path().join("CATALOG"), dir.path().join("CATALOG")).unwrap();
    let mut log = ReplicaLog::create(dir.path(), storage, 2, 1, u64::MAX).unwrap();
    for x in &batches {
        log.append(x, false, stream(x).bound_ts);
    }
    assert!(log.sync().is_err(), "the simulated fsync failure");
    drop(log);
    let after = replica_holdings(dir.path(), 2, None).unwrap();
    assert!(after.streams.iter().all(|&s| s == Ts::ZERO), "batches whose fsync failed were counted as held: {after:?}");
    assert_eq!(after.newest, Ts::ZERO, "{after:?}");
}
