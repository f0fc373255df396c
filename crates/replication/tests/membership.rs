//! A cluster's membership change as the primary's commit quorum sees it (docs/cluster.md,
//! "Membership changes"), with real files and TCP: the quorum counts the new number of
//! backups at once, and reports the change settled only once that quorum holds everything
//! released before it; a backup added to a quorum that needs it releases what waited.

use std::sync::Arc;
use std::time::Duration;

use ditto_engine::{Ts, WorkerId};
use ditto_replication::{backup, BackupOptions, Primary, PrimaryOptions};

mod common;
use common::wait_until;

/// A primary in `dir` under `majority-durable`, counting `backups` backups in
/// configuration 0, with a table "t": (its log, the table, the primary, its address).
fn start_primary(
    dir: &std::path::Path,
    backups: usize,
) -> (ditto_log::Durable, ditto_engine::TableId, Arc<Primary>, String) {
    let opts = PrimaryOptions { backups_expected: backups, members_config: 0, ..Default::default() };
    common::start_primary(dir, Default::default(), "majority-durable", opts)
}

#[test]
fn a_new_membership_is_settled_once_its_quorum_holds_what_was_released() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, b2) = (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("b2"));
    // Three nodes: the primary and two backups, configuration 0.
    let (a, t, p, addr) = start_primary(&pa, 2);
    assert_eq!(p.members_settled(), Some(0), "the membership it starts with, holding nothing, is settled");
    let bk1 = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..50u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.wait().unwrap();
    }
    wait_until("a release with one backup of two", Duration::from_secs(20), || p.released() >= last);

    // Configuration 1: a third backup (four nodes: three must hold a commit). Only one
    // backup is connected, so nothing more is released and the change is not settled.
    p.set_backups_expected(3, 1);
    assert_eq!(p.backups_expected(), 3);
    assert_eq!(p.members_settled(), None, "two nodes of four hold what was released");
    let before = p.released();
    let pending = w.run(|x| x.put(t, b"later", b"v")).unwrap().1;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(p.released(), before, "a commit waits for the new quorum");
    assert_eq!(p.members_settled(), None);
    // The second backup joins: three of four hold everything; the change settles and the
    // commit is released.
    let bk2 = backup::start(BackupOptions::new(&addr, &b2, 1, "b2")).unwrap();
    let ts = pending.wait().unwrap();
    wait_until("the new membership to settle", Duration::from_secs(20), || p.members_settled() == Some(1));
    assert!(p.released() >= ts);

    // Configuration 2: back to two backups; settled at once (fewer must hold a commit).
    p.set_backups_expected(2, 2);
    assert_eq!(p.members_settled(), Some(2));
    bk1.stop("done", Duration::from_secs(10)).unwrap();
    bk2.stop("done", Duration::from_secs(10)).unwrap();
    drop(w);
    p.stop();
    a.close();
}

/// A membership change is settled by every policy in use, not the server's alone: under a
/// server policy of `local`, a commit released under a connection's own
/// `majority-durable` on one backup of two (two nodes of three) is not yet held by a
/// majority of five once two members are added, so that change does not settle until a
/// third node holds it. Before 2026-12-07 it settled at once (the settle judged `local`,
/// the primary's own disk), and a second member added after it could make a majority
/// without the commit (found by a review).
#[test]
fn a_membership_change_settles_by_every_policy_in_use() {
    use ditto_replication::CommitPolicy;
    use std::sync::atomic::{AtomicU64, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, b2) = (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("b2"));
    let a = ditto_log::open(&pa, ditto_log::OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    // As a server does: every policy's release kept, the server's (`local`) returned.
    let acked = Arc::new(AtomicU64::new(0));
    let (local, strong) = (CommitPolicy::parse("local").unwrap(), CommitPolicy::parse("majority-durable").unwrap());
    let opts = PrimaryOptions {
        backups_expected: 2,
        members_config: 0,
        policy: Some(local),
        acknowledged: Some(Arc::clone(&acked)),
        ..Default::default()
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let a2 = Arc::clone(&acked);
    let on_change = Box::new(move |h: &ditto_replication::Holdings| {
        a2.fetch_max(ditto_replication::release_watermark(strong, h).0, Ordering::AcqRel);
        ditto_replication::release_watermark(local, h)
    });
    let p = Primary::start(&a, listener, opts, on_change).unwrap();
    let p2 = Arc::clone(&p);
    a.logger().set_progress_listener(Box::new(move |_, _| p2.recompute())).unwrap();
    // A connection chose `majority-durable` (a server records it before its first commit).
    p.backups_may_release(strong).unwrap();
    let bk1 = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let ts = w.run(|x| x.put(t, b"k", b"v")).unwrap().1.wait().unwrap();
    wait_until("the commit released under majority-durable", Duration::from_secs(20), || {
        acked.load(Ordering::Acquire) >= ts.0
    });
    // Five nodes: a majority is three, and two hold the commit.
    p.set_backups_expected(4, 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(p.members_settled(), None, "two nodes of five hold a commit released under majority-durable");
    // A third node holds it: settled.
    let bk2 = backup::start(BackupOptions::new(&addr, &b2, 1, "b2")).unwrap();
    wait_until("the new membership to settle", Duration::from_secs(20), || p.members_settled() == Some(1));
    for b in [bk1, bk2] {
        b.stop("done", Duration::from_secs(10)).unwrap();
    }
    drop(w);
    p.stop();
    a.close();
}

/// A learner (a cluster node being added, `Frame::Hello::learner`) counts in no commit
/// quorum: with the one counted backup expected absent, a learner that receives and
/// acknowledges everything durably releases nothing (the primary's `backups()` shows it a
/// learner); promoted in place (`Backup::count_in_quorum`), it connects again as a counted
/// backup, and the commit is released.
#[test]
fn a_learners_acknowledgements_release_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, l) = (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("learner"));
    // Two nodes counted: the primary and one backup (a majority is both).
    let (a, t, p, addr) = start_primary(&pa, 1);
    let learner = backup::start(BackupOptions { learner: true, ..BackupOptions::new(&addr, &l, 1, "l") }).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let pending = w.run(|x| x.put(t, b"k", b"v")).unwrap().1;
    let ts = pending.ts();
    wait_until("the learner to hold the commit durably", Duration::from_secs(20), || {
        p.backups().iter().any(|b| b.learner && b.durable >= ts)
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(p.released() < ts, "released {:?} with only a learner holding {ts:?}", p.released());
    assert_eq!(p.backups().iter().filter(|b| b.learner).count(), 1);
    // Promoted in place (`count_in_quorum`): it connects again as a counted backup, and
    // the commit is released.
    assert!(learner.is_learner());
    learner.count_in_quorum();
    assert!(!learner.is_learner());
    assert_eq!(pending.wait().unwrap(), ts);
    wait_until("the release watermark past the commit", Duration::from_secs(10), || p.released() >= ts);
    wait_until("one counted link and no learner's", Duration::from_secs(10), || {
        let b = p.backups();
        b.len() == 1 && !b[0].learner
    });
    // A counted backup more (a third node, not expected) changes nothing of that.
    let bk1 = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
    let later = w.run(|x| x.put(t, b"k2", b"v")).unwrap().1.wait().unwrap();
    assert!(later > ts);
    bk1.stop("done", Duration::from_secs(10)).unwrap();
    learner.stop("done", Duration::from_secs(10)).unwrap();
    drop(w);
    p.stop();
    a.close();
}

/// A cluster's primary counts the backups of its members only (`set_counted_nodes`): a
/// node removed that has not stopped yet, still connected and acknowledging, releases
/// nothing; a member's backup does.
#[test]
fn a_backup_of_a_node_that_is_no_member_releases_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, gone) = (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("gone"));
    let (a, t, p, addr) = start_primary(&pa, 1);
    // The one member besides the primary is "b1"; "gone" was removed and still follows.
    p.set_counted_nodes(Some(["b1".to_string()].into_iter().collect()));
    let removed = backup::start(BackupOptions::new(&addr, &gone, 1, "gone")).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let pending = w.run(|x| x.put(t, b"k", b"v")).unwrap().1;
    let ts = pending.ts();
    wait_until("the removed node to hold the commit durably", Duration::from_secs(20), || {
        p.backups().iter().any(|b| b.node == "gone" && b.durable >= ts)
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(p.released() < ts, "released {:?} with only a removed node holding {ts:?}", p.released());
    // The member's backup joins: released.
    let bk1 = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
    assert_eq!(pending.wait().unwrap(), ts);
    wait_until("the release watermark past the commit", Duration::from_secs(10), || p.released() >= ts);
    bk1.stop("done", Duration::from_secs(10)).unwrap();
    removed.stop("done", Duration::from_secs(10)).unwrap();
    drop(w);
    p.stop();
    a.close();
}

/// A removed node's backup still connected at a low slot pads no place into the quorum: a
/// primary with two members b1 and b2 (three nodes, a majority is two) releases a commit
/// that b2 alone holds, b1 being gone, though the removed node linked first (slot 0) and
/// b2 last (slot 2). Before 2026-12-02 the quorum was laid out by slot, [removed: empty,
/// b1, b2]: four places, three needed, so `majority` waited for every member as `all`
/// does (and a killed link not yet out of the list beside its backup's new one counted
/// that backup twice).
#[test]
fn a_removed_nodes_link_pads_no_place_into_the_quorum() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1, b2, gone) =
        (tmp.path().join("a"), tmp.path().join("b1"), tmp.path().join("b2"), tmp.path().join("gone"));
    let (a, t, p, addr) = start_primary(&pa, 2);
    p.set_counted_nodes(Some(["b1".to_string(), "b2".to_string()].into_iter().collect()));
    let linked = |n: usize| wait_until("the backups linked", Duration::from_secs(20), || p.backups().len() == n);
    let removed = backup::start(BackupOptions::new(&addr, &gone, 1, "gone")).unwrap();
    linked(1);
    let bk1 = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
    linked(2);
    let bk2 = backup::start(BackupOptions::new(&addr, &b2, 1, "b2")).unwrap();
    linked(3);
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let first = w.run(|x| x.put(t, b"k", b"v")).unwrap().1.wait().unwrap();
    wait_until("a release with every member", Duration::from_secs(20), || p.released() >= first);
    bk1.stop("gone", Duration::from_secs(10)).unwrap();
    linked(2);
    let ts = w.run(|x| x.put(t, b"k2", b"v")).unwrap().1.wait().unwrap();
    wait_until("a release with the primary and b2, a majority of three", Duration::from_secs(20), || {
        p.released() >= ts
    });
    bk2.stop("done", Duration::from_secs(10)).unwrap();
    removed.stop("done", Duration::from_secs(10)).unwrap();
    drop(w);
    p.stop();
    a.close();
}

/// A primary that starts holding commits (a new primary after a failover: what the old one
/// released may be on it alone) settles its membership only once a majority of it holds
/// them too, so the next change cannot leave a majority that lacks them (found by a
/// review: with {P, B1, B2}, a commit on {P, B2}, B4 added, P dead before the change
/// settled, B2 promoted settled at once, P removed, then B2 lost: {B1, B4} was a majority
/// of the new configuration and held nothing of it). Judged by a majority at the policy's
/// level whatever the policy: under `all`, a member down would otherwise keep it from
/// ever settling, and its removal waits for that.
#[test]
fn a_primary_that_starts_holding_commits_settles_once_a_majority_holds_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, b1) = (tmp.path().join("a"), tmp.path().join("b1"));
    let mut last = Ts::ZERO;
    {
        let a = ditto_log::open(&pa, ditto_log::OpenOptions { workers: 1, ..Default::default() }).unwrap();
        let t = a.db().create_table("t").unwrap();
        let mut w = a.db().worker(WorkerId(0)).unwrap();
        for i in 0..50u32 {
            last = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.wait().unwrap();
        }
        drop(w);
        a.close();
    }
    // Reopened under `all-durable`, two backups counted, configuration 7: it holds 50
    // commits no backup has.
    let a = ditto_log::open(&pa, ditto_log::OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let policy = ditto_replication::CommitPolicy::parse("all-durable").unwrap();
    let opts = PrimaryOptions { backups_expected: 2, members_config: 7, policy: Some(policy), ..Default::default() };
    let (p, addr) = common::ship(&a, "all-durable", opts);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(p.members_settled(), None, "one node of three holds what it started with");
    // One backup joins and holds it all: two of three, a majority, though `all` still
    // releases nothing new (the second backup is down).
    let bk = backup::start(BackupOptions::new(&addr, &b1, 1, "b1")).unwrap();
    wait_until("the backup to hold what the primary started with", Duration::from_secs(20), || {
        bk.state.durable.load(std::sync::atomic::Ordering::SeqCst) >= last.0
    });
    wait_until("the membership to settle", Duration::from_secs(20), || p.members_settled() == Some(7));
    bk.stop("done", Duration::from_secs(10)).unwrap();
    p.stop();
    a.close();
}

/// A release computed from what the nodes held under the old membership is never applied,
/// nor checked against the settle, after a membership change took its bar: the change
/// waits for it, then counts the new members. Here the old membership is the primary
/// alone (everything it holds is released) and the new one adds a backup that is not
/// there: the change must not be reported settled. (Before 2026-12-03 a `changed` that
/// had read the nodes before the change and checked the settle after it reported it
/// settled: a removal could then go ahead while the new quorum lacked acknowledged
/// commits.)
#[test]
fn a_release_read_under_the_old_membership_does_not_settle_the_new_one() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    let tmp = tempfile::tempdir().unwrap();
    let a = ditto_log::open(tmp.path(), ditto_log::OpenOptions { workers: 1, ..Default::default() }).unwrap();
    let t = a.db().create_table("t").unwrap();
    let policy = ditto_replication::CommitPolicy::parse("majority-durable").unwrap();
    let opts = PrimaryOptions { backups_expected: 0, members_config: 0, policy: Some(policy), ..Default::default() };
    // The release hook blocks once, when told to, inside a `changed` (after it read what
    // the nodes hold).
    let block = Arc::new(AtomicBool::new(false));
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (go, go_rx) = mpsc::channel::<()>();
    let go_rx = parking_lot::Mutex::new(go_rx);
    let hook_block = Arc::clone(&block);
    let on_change = Box::new(move |h: &ditto_replication::Holdings| {
        if hook_block.swap(false, Ordering::SeqCst) {
            entered_tx.send(()).unwrap();
            go_rx.lock().recv_timeout(Duration::from_secs(30)).unwrap();
        }
        ditto_replication::release_watermark(policy, h)
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let p = Primary::start(&a, listener, opts, on_change).unwrap();
    let mut w = a.db().worker(WorkerId(0)).unwrap();
    let mut last = Ts::ZERO;
    for i in 0..20u32 {
        last = w.run(|x| x.put(t, &i.to_be_bytes(), b"v")).unwrap().1.wait().unwrap();
    }
    p.recompute();
    assert!(p.released() >= last, "the primary alone releases what it holds");
    assert_eq!(p.members_settled(), Some(0));

    // A `changed` reads the nodes (the primary alone) and stops in the hook.
    block.store(true, Ordering::SeqCst);
    let stale = {
        let p = Arc::clone(&p);
        std::thread::spawn(move || p.recompute())
    };
    entered.recv_timeout(Duration::from_secs(30)).expect("the hook was entered");
    // Meanwhile the membership becomes the primary and backup b2 (absent): it waits.
    let change = {
        let p = Arc::clone(&p);
        std::thread::spawn(move || {
            p.set_counted_nodes(Some(["b2".to_string()].into_iter().collect()));
            p.set_backups_expected(1, 1);
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(!change.is_finished(), "the change waits for the release under way");
    go.send(()).unwrap();
    stale.join().unwrap();
    change.join().unwrap();
    assert_eq!(p.backups_expected(), 1);
    assert_eq!(p.members_settled(), None, "one node of two holds what was released: not settled");
    drop(w);
    p.stop();
    a.close();
}
