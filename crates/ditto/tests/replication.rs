//! Hot standby with real processes on loopback: a primary and a backup (`ditto server
//! --replica-of`), a bank workload on the primary whose total never changes and a counter
//! whose acknowledged values only grow, read on the backup throughout (every read must be
//! a prefix of the primary's released history), the backup SIGKILLed and restarted under
//! load (it resumes from its own durable position), and at the end every acknowledged
//! commit present on the backup (DITTO.WAITTS with the primary's commit timestamp).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{port_below_the_ephemeral_range, Client, Node};

const ACCOUNTS: usize = 8;
const START: i64 = 1000;

#[test]
fn backup_reads_are_prefixes_and_every_acknowledged_commit_reaches_it_across_a_backup_restart() {
    prefixes_and_restart("parallel");
}

/// The same with KuaFu's dependency replay on the backup (crates/replication/src/dependency.rs).
#[test]
fn the_same_with_dependency_replay() {
    prefixes_and_restart("dependency");
}

/// The same with every replayed value shared with its received batch, not copied (Query
/// Fresh's log-as-database, `+shared`).
#[test]
fn the_same_with_shared_values() {
    prefixes_and_restart("parallel+shared");
}

fn prefixes_and_restart(replay: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (pdir, bdir) = (tmp.path().join("primary"), tmp.path().join("backup"));
    let primary = Node::start(&pdir, &["--repl-port", "0", "--commit-policy", "majority-durable", "--backups", "1"]);
    let repl = primary.repl.clone().unwrap();
    // The backup checkpoints itself every second (and deletes the replica log it covers),
    // so its restart below loads its own checkpoint and the log above it.
    let bcfg = tmp.path().join("backup.toml");
    std::fs::write(&bcfg, "checkpoint_interval_s = 1\n").unwrap();
    let bcfg = bcfg.to_str().unwrap().to_string();
    let mut backup = Node::start(&bdir, &["--replica-of", &repl, "--config", &bcfg, "--replay", replay]);
    let info = Client::connect(backup.port).unwrap().cmd(&["INFO", "replication"]).unwrap().join("\n");
    assert!(info.contains(&format!("ditto_replay_mode:{replay}")), "{info}");
    let mut c = Client::connect(primary.port).unwrap();
    let mut mset = vec!["MSET".to_string()];
    for i in 0..ACCOUNTS {
        mset.push(format!("acct{i}"));
        mset.push(START.to_string());
    }
    let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
    assert_eq!(c.one(&mset), "+OK");

    let stop = Arc::new(AtomicBool::new(false));
    let acked_counter = Arc::new(AtomicU64::new(0));
    let last_commit = Arc::new(AtomicU64::new(0));
    let transfers = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..2u64 {
        let (stop, transfers, port) = (Arc::clone(&stop), Arc::clone(&transfers), primary.port);
        writers.push(std::thread::spawn(move || {
            let mut c = Client::connect(port).unwrap();
            let mut x = w * 7 + 3;
            while !stop.load(Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let (a, b) = ((x >> 33) as usize % ACCOUNTS, (x >> 40) as usize % ACCOUNTS);
                let amount = ((x >> 50) % 50).to_string();
                let (fa, fb) = (format!("acct{a}"), format!("acct{b}"));
                assert_eq!(c.one(&["MULTI"]), "+OK");
                assert_eq!(c.one(&["DECRBY", &fa, &amount]), "+QUEUED");
                assert_eq!(c.one(&["INCRBY", &fb, &amount]), "+QUEUED");
                let r = c.cmd(&["EXEC"]).unwrap();
                assert_eq!(r.len(), 2, "EXEC: {r:?}");
                transfers.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    {
        let (stop, acked, last, port) =
            (Arc::clone(&stop), Arc::clone(&acked_counter), Arc::clone(&last_commit), primary.port);
        writers.push(std::thread::spawn(move || {
            let mut c = Client::connect(port).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let v: u64 = c.one(&["INCR", "counter"]).trim_start_matches(':').parse().unwrap();
                acked.store(v, Ordering::Release);
                let ts: u64 = c.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').parse().unwrap();
                last.store(ts, Ordering::Release);
            }
        }));
    }
    // Fresh keys inserted on one connection and updated at once on another (connections
    // go to workers in turn, so the insert and the update are on different log streams):
    // on a backup the update's stream may be replayed before the insert's.
    let appended = Arc::new(AtomicU64::new(0));
    {
        let (stop, appended, port) = (Arc::clone(&stop), Arc::clone(&appended), primary.port);
        writers.push(std::thread::spawn(move || {
            let (mut a, mut b) = (Client::connect(port).unwrap(), Client::connect(port).unwrap());
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("log:{n}");
                assert_eq!(a.one(&["SET", &key, "0"]), "+OK");
                assert_eq!(b.one(&["INCR", &key]), ":1");
                n += 1;
                appended.store(n, Ordering::Release);
            }
        }));
    }
    // Reads on the backup, throughout: the bank's total never changes and the counter
    // never goes back (nor passes what the primary acknowledged... it may lag).
    // Each reader's checks fail the test (its panic is joined), and each says how many
    // reads it checked: a reader whose connection ends (the backup killed) stops there.
    let reads = Arc::new(AtomicU64::new(0));
    let check_reads = |port: u16, stop: Arc<AtomicBool>, reads: Arc<AtomicU64>, acked: Arc<AtomicU64>| {
        std::thread::spawn(move || {
            let mut seen_counter = 0u64;
            let mut checked = 0u64;
            let deadline = Instant::now() + Duration::from_secs(120);
            let Ok(mut c) = Client::connect(port) else { return checked };
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let mut args = vec!["MGET".to_string()];
                args.extend((0..ACCOUNTS).map(|i| format!("acct{i}")));
                args.push("counter".into());
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let Ok(vals) = c.cmd(&args) else { return checked };
                let (accts, counter) = vals.split_at(ACCOUNTS);
                if accts.iter().all(|v| v == "(nil)") {
                    continue;
                }
                let sum: i64 = accts.iter().map(|v| v.parse::<i64>().unwrap()).sum();
                assert_eq!(sum, START * ACCOUNTS as i64, "a backup read saw a partial transfer: {accts:?}");
                let ctr: u64 = if counter[0] == "(nil)" { 0 } else { counter[0].parse().unwrap() };
                assert!(ctr >= seen_counter, "the backup's counter went back: {ctr} after {seen_counter}");
                // Never an unreleased value: at most one ahead of what the writer saw acked
                // (its reply may still be on the way).
                assert!(ctr <= acked.load(Ordering::Acquire) + 1, "the backup shows an unreleased counter {ctr}");
                seen_counter = ctr;
                checked += 1;
                reads.fetch_add(1, Ordering::Relaxed);
            }
            checked
        })
    };
    let r1 = check_reads(backup.port, Arc::clone(&stop), Arc::clone(&reads), Arc::clone(&acked_counter));
    std::thread::sleep(Duration::from_millis(1500));
    // Its own checkpoint taken first (a loaded machine may take longer than the sleep: a
    // CI run once killed it while it wrote its first one, and only the join's was whole).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut probe = Client::connect(backup.port).unwrap();
    loop {
        let info = probe.cmd(&["INFO", "replication"]).unwrap().join("\n");
        let taken = info.lines().find_map(|l| l.strip_prefix("ditto_checkpoints:")?.trim().parse::<u64>().ok());
        if taken.is_some_and(|n| n >= 1) {
            break;
        }
        assert!(Instant::now() < deadline, "the backup took no checkpoint of its own within 60 s: {info}");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(probe);
    // SIGKILL the backup under load; writes wait (majority of two needs it), then resume.
    backup.kill();
    let first = r1.join().expect("the first reader's checks");
    assert!(first > 0, "the backup served no checked read before it was killed");
    let before = transfers.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    // (Whole ones: the kill may have come while it wrote its next, which has no manifest.)
    let ckpts: Vec<u64> = std::fs::read_dir(bdir.join("checkpoints"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            e.path().join("MANIFEST").exists().then_some(())?;
            e.file_name().to_str()?.strip_prefix("ckpt-")?.parse().ok()
        })
        .collect();
    assert_eq!(ckpts.len(), 1, "one checkpoint left: {ckpts:?}");
    assert!(ckpts[0] > 100, "the checkpoint is the backup's own, taken under load (ts {})", ckpts[0]);
    backup = Node::start(&bdir, &["--replica-of", &repl, "--config", &bcfg, "--replay", replay]);
    let r2 = check_reads(backup.port, Arc::clone(&stop), Arc::clone(&reads), Arc::clone(&acked_counter));
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let second = r2.join().expect("the second reader's checks");
    assert!(second > 0, "the restarted backup served no checked read");
    assert!(transfers.load(Ordering::Relaxed) > before, "writes went on after the backup came back");
    assert!(reads.load(Ordering::Relaxed) > 10, "the backup served reads throughout");

    // Read-your-writes: the backup waits for the primary's last commit, then holds it.
    let mut b = Client::connect(backup.port).unwrap();
    let ts = last_commit.load(Ordering::Acquire).to_string();
    assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
    // Every writer has finished: one more commit is later than all of theirs.
    let mut p = Client::connect(primary.port).unwrap();
    assert_eq!(p.one(&["SET", "fence", "1"]), "+OK");
    let fence = p.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
    assert_eq!(b.one(&["DITTO.WAITTS", &fence]), "+OK");
    let want = acked_counter.load(Ordering::Acquire);
    assert_eq!(b.one(&["GET", "counter"]), want.to_string(), "every acknowledged INCR is on the backup");
    let mut args = vec!["MGET".to_string()];
    args.extend((0..ACCOUNTS).map(|i| format!("acct{i}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let got = b.cmd(&args).unwrap();
    assert_eq!(got, p.cmd(&args).unwrap(), "the backup's accounts are the primary's");
    let n = appended.load(Ordering::Acquire);
    assert!(n > 10, "only {n} keys inserted and updated");
    for i in 0..n {
        assert_eq!(b.one(&["GET", &format!("log:{i}")]), "1", "log:{i} of {n} on the backup");
    }
    // Replay keeps DBSIZE (the backup counted at its start, then replay moved it).
    assert_eq!(b.one(&["DBSIZE"]), p.one(&["DBSIZE"]), "DBSIZE on the backup and the primary");
    // Writes are refused, naming the primary.
    let refused = b.one(&["SET", "x", "y"]);
    assert!(refused.starts_with("-READONLY") && refused.contains(&repl), "{refused}");
    // A timestamp the primary never reaches: a clear timeout, bounded.
    let t0 = Instant::now();
    let far = b.one(&["DITTO.WAITTS", "999999999999"]);
    assert!(far.contains("timed out"), "{far}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    // Pipelined with it, only that wait fails: the read before it and the SELECT after it
    // are answered as they ran (before, every reply of the batch said "timed out" while
    // the SELECT had moved the connection to db 5).
    b.send(&[&["GET", "log:0"], &["DITTO.WAITTS", "999999999999"], &["SELECT", "5"], &["ECHO", "hi"]]).unwrap();
    assert_eq!(b.reply().unwrap(), ["1"]);
    assert!(b.reply().unwrap()[0].contains("timed out"));
    assert_eq!(b.reply().unwrap(), ["+OK"]);
    assert_eq!(b.reply().unwrap(), ["hi"]);
    assert_eq!(b.one(&["DBSIZE"]), ":0", "on db 5, as its SELECT's +OK said");
    assert_eq!(b.one(&["SELECT", "0"]), "+OK");
    let info = b.cmd(&["INFO", "replication"]).unwrap().join("\n");
    assert!(info.contains("role:slave") && info.contains("master_link_status:up"), "{info}");
    // The checks above held with batches sent to the backup by the threads that shipped
    // them (the primary's link thread only takes what its socket did not).
    let pinfo = p.cmd(&["INFO", "replication"]).unwrap().join("\n");
    let direct: u64 = pinfo
        .lines()
        .find_map(|l| l.strip_prefix("ditto_frames_sent_directly:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ditto_frames_sent_directly: {pinfo}"));
    assert!(direct > 0, "no frame was sent by the thread that shipped it: {pinfo}");
}

/// Keys deleted and written again at once, from two connections (two log streams), under
/// load: the primary's clean-up (every 100 ms) now and then unlinks a deleted key's record
/// between its DEL and the SET right behind it, which gives the key a new record in the
/// same shipped batch, or on the other stream. The backup replays through every such new
/// life (it used to wait for its own batch, 60 s, and stop) and ends with the primary's
/// keys, values and DBSIZE.
#[test]
fn keys_deleted_and_written_again_at_once_keep_the_backup_replaying() {
    churn("parallel");
}

#[test]
fn the_same_with_dependency_replay_of_churned_keys() {
    churn("dependency");
}

#[test]
fn the_same_with_serial_replay_of_churned_keys() {
    churn("serial");
}

fn churn(replay: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (pdir, bdir) = (tmp.path().join("primary"), tmp.path().join("backup"));
    let primary = Node::start(&pdir, &["--repl-port", "0", "--commit-policy", "majority-received", "--backups", "1"]);
    let repl = primary.repl.clone().unwrap();
    let _backup = Node::start(&bdir, &["--replica-of", &repl, "--replay", replay]);
    const KEYS: usize = 32;
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (stop, cycles, port) = (Arc::clone(&stop), Arc::clone(&cycles), primary.port);
            std::thread::spawn(move || {
                let mut c = Client::connect(port).unwrap();
                let mut i = w as usize;
                let deadline = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let key = format!("churn:{}", i % KEYS);
                    let (v1, v2) = (format!("{w}-{i}-a"), format!("{w}-{i}-b"));
                    c.send(&[&["SET", &key, &v1], &["DEL", &key], &["SET", &key, &v2]]).unwrap();
                    for _ in 0..3 {
                        let r = c.reply().unwrap();
                        assert!(r[0] == "+OK" || r[0].starts_with(':'), "{key}: {r:?}");
                    }
                    i += 2;
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let n = cycles.load(Ordering::Relaxed);
    // At 100 ms between clean-ups and a few thousand cycles a second, dozens of new lives.
    assert!(n > 1000, "only {n} delete-and-write cycles");
    let mut p = Client::connect(primary.port).unwrap();
    assert_eq!(p.one(&["SET", "fence", "1"]), "+OK");
    let fence = p.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
    let mut b = Client::connect(_backup.port).unwrap();
    // Replay may be far behind on a loaded machine (CI runs these tests side by side), so
    // each bounded wait that times out must at least have seen the read view move.
    let view_in = |err: &str| -> u64 {
        let rest = err.split("read view (at ").nth(1).unwrap_or_else(|| panic!("{err}"));
        rest.split(')').next().unwrap().parse().unwrap()
    };
    let mut last_view = None;
    for attempt in 0.. {
        let w = b.one(&["DITTO.WAITTS", &fence]);
        if w == "+OK" {
            break;
        }
        let view = view_in(&w);
        eprintln!("{replay}: the backup is behind ({w}); waiting again");
        if last_view.is_some_and(|l| view <= l) {
            let info = b.cmd(&["INFO", "replication"]).unwrap().join("\n");
            panic!("the backup's replay stopped: {w}\n{info}");
        }
        assert!(attempt < 12, "the backup still behind after {attempt} waits: {w}");
        last_view = Some(view);
    }
    let keys: Vec<String> = (0..KEYS).map(|i| format!("churn:{i}")).collect();
    let mut args = vec!["MGET"];
    args.extend(keys.iter().map(String::as_str));
    assert_eq!(b.cmd(&args).unwrap(), p.cmd(&args).unwrap(), "the backup's values are the primary's");
    assert_eq!(b.one(&["DBSIZE"]), p.one(&["DBSIZE"]), "DBSIZE on the backup and the primary");
    let info = b.cmd(&["INFO", "replication"]).unwrap().join("\n");
    assert!(info.contains("master_link_status:up"), "{info}");
}

/// A cluster's backup (`--primary-addr`: with or without its replay held at the release)
/// restarted from a log that holds commits its primary has not released: it answers data reads with LOADING until
/// the primary releases that far, then serves them (docs/cluster.md, "A backup's server
/// that starts from its directory"). Under `all-durable` with two backups expected and
/// only one running, nothing is released.
#[test]
fn a_held_backup_restarted_above_the_release_reads_nothing_until_the_primary_releases_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (pdir, b1, b2) = (tmp.path().join("primary"), tmp.path().join("b1"), tmp.path().join("b2"));
    let primary = Node::start(&pdir, &["--repl-port", "0", "--commit-policy", "all-durable", "--backups", "2"]);
    let repl = primary.repl.clone().unwrap();
    let paddr = format!("127.0.0.1:{}", primary.port);
    let backup_args = ["--replica-of", repl.as_str(), "--primary-addr", paddr.as_str()];
    let mut backup = Node::start(&b1, &backup_args);
    // Sent without waiting: never acknowledged while the second backup is missing.
    let mut c = Client::connect(primary.port).unwrap();
    c.send(&[&["SET", "k", "v"]]).unwrap();
    let field = |port: u16, k: &str| -> Option<u64> {
        let info = Client::connect(port).ok()?.cmd(&["INFO", "replication"]).ok()?.concat();
        info.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(':')?.trim().parse().ok())
    };
    let end = Instant::now() + Duration::from_secs(20);
    while field(backup.port, "ditto_durable_ts").unwrap_or(0) <= field(backup.port, "ditto_released_ts").unwrap_or(0) {
        assert!(Instant::now() < end, "the backup never held the unreleased write");
        std::thread::sleep(Duration::from_millis(10));
    }
    backup.kill();
    let backup = Node::start(&b1, &backup_args);
    let mut r = Client::connect(backup.port).unwrap();
    let got = r.one(&["GET", "k"]);
    assert!(got.starts_with("-LOADING"), "{got}");
    assert!(r.one(&["DBSIZE"]).starts_with("-LOADING"));
    // A pipelined run of GETs too (answered together otherwise, `Session::handle_run`,
    // which read past the gate before).
    r.send(&[&["GET", "k"], &["GET", "k"], &["GET", "k"]]).unwrap();
    for _ in 0..3 {
        let got = r.reply().unwrap().remove(0);
        assert!(got.starts_with("-LOADING"), "{got}");
    }
    assert_eq!(r.one(&["PING"]), "+PONG");
    // Only the first read waited (500 ms) for the release; with nothing released since,
    // the others were answered at once.
    let info = r.cmd(&["INFO", "replication"]).unwrap().concat();
    let count = |k: &str| info.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(':')?.trim().parse::<u64>().ok());
    assert_eq!((count("ditto_reads_waited"), count("ditto_reads_refused_loading")), (Some(1), Some(5)), "{info}");
    // The second backup lets the primary release: the write is acknowledged, and read.
    let _second = Node::start(&b2, &backup_args);
    assert_eq!(c.reply().unwrap()[0], "+OK");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let got = r.one(&["GET", "k"]);
        if got == "v" {
            break;
        }
        assert!(got.starts_with("-LOADING") && Instant::now() < end, "{got}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Two backup processes given one name (`--replica-name`): the primary's quorum record
/// knows backups by name, so the second is refused while the first is linked, and its
/// server exits saying why and what to do; the first keeps its link and its writes.
#[test]
fn a_second_backup_sharing_a_name_is_refused_and_exits_saying_why() {
    let tmp = tempfile::tempdir().unwrap();
    let primary = Node::start(
        &tmp.path().join("primary"),
        &["--repl-port", "0", "--commit-policy", "majority-received", "--backups", "2"],
    );
    let repl = primary.repl.clone().unwrap();
    let args = ["--replica-of", repl.as_str(), "--replica-name", "twin"];
    let first = Node::start(&tmp.path().join("b1"), &args);
    let mut c = Client::connect(primary.port).unwrap();
    assert_eq!(c.one(&["SET", "k", "1"]), "+OK");
    let (status, said) = Node::run_to_exit(&tmp.path().join("b2"), &args, &tmp.path().join("b2.log"));
    assert!(!status.success(), "{said}");
    assert!(said.contains("this backup's name is taken") && said.contains("--replica-name"), "{said}");
    // The first is still the primary's one backup, and takes writes on.
    let info = c.cmd(&["INFO", "replication"]).unwrap().concat();
    assert!(info.contains("connected_slaves:1"), "{info}");
    assert_eq!(c.one(&["SET", "k", "2"]), "+OK");
    let ts = c.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
    let mut r = Client::connect(first.port).unwrap();
    r.set_read_timeout(Duration::from_secs(10));
    assert!(!r.one(&["DITTO.WAITTS", &ts]).starts_with('-'));
    assert_eq!(r.one(&["GET", "k"]), "2");
}

/// Read-your-writes in one pipeline: `DITTO.WAITTS ts` then `GET k` sent together to a
/// backup answer the value written at `ts`, every time (before, the GET read at once, at
/// the view the backup had, and its reply waited with the WAITTS's: `+OK`, then the old
/// value). In a transaction DITTO.WAITTS is refused (a transaction reads at its start).
#[test]
fn a_read_pipelined_after_waitts_on_a_backup_reads_at_least_that_fresh() {
    let tmp = tempfile::tempdir().unwrap();
    let primary = Node::start(&tmp.path().join("primary"), &["--repl-port", "0", "--commit-policy", "local"]);
    let repl = primary.repl.clone().unwrap();
    let backup = Node::start(&tmp.path().join("b1"), &["--replica-of", repl.as_str()]);
    let mut c = Client::connect(primary.port).unwrap();
    let mut r = Client::connect(backup.port).unwrap();
    r.set_read_timeout(Duration::from_secs(10));
    for i in 0..300 {
        assert_eq!(c.one(&["SET", "k", &i.to_string()]), "+OK");
        let ts = c.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
        r.send(&[&["DITTO.WAITTS", &ts], &["GET", "k"]]).unwrap();
        assert_eq!(r.reply().unwrap(), ["+OK"], "write {i}");
        assert_eq!(r.reply().unwrap(), [i.to_string()], "the GET after DITTO.WAITTS {ts} (write {i})");
    }
    assert_eq!(r.one(&["MULTI"]), "+OK");
    let refused = r.one(&["DITTO.WAITTS", "1"]);
    assert!(refused.contains("inside MULTI is not allowed"), "{refused}");
    let exec = r.one(&["EXEC"]);
    assert!(exec.starts_with("-EXECABORT"), "{exec}");
}

/// Under a `received` commit policy a reply waits for the backup's memory and no fsync on
/// the primary, so not for the primary's fsync interval either: with `--durability
/// interval` and an interval of 4 s, writes in a row are each acknowledged well within it
/// (their batches are shipped as commits come; the primary's disk keeps the interval).
/// Before 2026-11-29 each batch waited for the interval to be framed, and so did each
/// reply after the first. The backup holds every write.
#[test]
fn a_received_policy_waits_for_no_fsync_interval_on_the_primary() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--repl-port", "0", "--commit-policy", "majority-received", "--backups", "1"];
    let interval = ["--durability", "interval", "--fsync-interval-ms", "4000"];
    let primary = Node::start(&tmp.path().join("primary"), &[&args[..], &interval[..]].concat());
    let repl = primary.repl.clone().unwrap();
    let backup = Node::start(&tmp.path().join("b1"), &["--replica-of", repl.as_str()]);
    let mut c = Client::connect(primary.port).unwrap();
    assert_eq!(c.one(&["SET", "first", "0"]), "+OK");
    c.set_read_timeout(Duration::from_millis(1500));
    for i in 0..5 {
        let t = std::time::Instant::now();
        let r = c.cmd(&["SET", &format!("k{i}"), "v"]);
        assert!(matches!(&r, Ok(v) if v[0] == "+OK"), "write {i}: {r:?} after {:?}", t.elapsed());
    }
    let ts = c.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
    let mut r = Client::connect(backup.port).unwrap();
    r.set_read_timeout(Duration::from_secs(10));
    assert!(!r.one(&["DITTO.WAITTS", &ts]).starts_with('-'));
    for i in 0..5 {
        assert_eq!(r.one(&["GET", &format!("k{i}")]), "v", "k{i} on the backup");
    }
}

/// A primary with `requirepass` asks it of its backups too (their `masterauth`): a backup
/// process without it, or with another, exits saying why and received nothing; one with it
/// joins, and its own clients AUTH as the primary's do.
#[test]
fn a_primary_with_requirepass_serves_only_backups_that_give_it_as_masterauth() {
    let tmp = tempfile::tempdir().unwrap();
    let conf = |name: &str, text: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let primary_conf = conf("primary.toml", "requirepass = \"s3cret-pw\"\n");
    let primary = Node::start(&tmp.path().join("primary"), &["--repl-port", "0", "--config", &primary_conf]);
    let repl = primary.repl.clone().unwrap();
    let mut c = Client::connect(primary.port).unwrap();
    assert_eq!(c.one(&["AUTH", "s3cret-pw"]), "+OK");
    assert_eq!(c.one(&["SET", "k", "1"]), "+OK");
    for (name, text, says) in [
        ("none", "requirepass = \"s3cret-pw\"\n", "requires a password of its backups"),
        ("wrong", "requirepass = \"s3cret-pw\"\nmasterauth = \"s3cret-px\"\n", "is not this primary's requirepass"),
    ] {
        let backup_conf = conf(&format!("{name}.toml"), text);
        let args = ["--replica-of", repl.as_str(), "--config", backup_conf.as_str()];
        let (status, said) = Node::run_to_exit(&tmp.path().join(name), &args, &tmp.path().join(format!("{name}.log")));
        assert!(!status.success(), "{name}: {said}");
        assert!(said.contains(says), "{name}: {said}");
        // No file but its lock (its server made its empty directories).
        let mut files = Vec::new();
        let mut dirs = vec![tmp.path().join(name)];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                match e.path().is_dir() {
                    true => dirs.push(e.path()),
                    false => files.push(e.file_name()),
                }
            }
        }
        assert_eq!(files, ["LOCK"], "{name} received nothing");
    }
    let info = c.cmd(&["INFO", "replication"]).unwrap().concat();
    assert!(info.contains("connected_slaves:0"), "{info}");
    let backup_conf = conf("right.toml", "requirepass = \"s3cret-pw\"\nmasterauth = \"s3cret-pw\"\n");
    let backup = Node::start(&tmp.path().join("right"), &["--replica-of", repl.as_str(), "--config", &backup_conf]);
    assert_eq!(c.one(&["SET", "k", "2"]), "+OK");
    let ts = c.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
    let mut r = Client::connect(backup.port).unwrap();
    r.set_read_timeout(Duration::from_secs(10));
    assert!(r.one(&["GET", "k"]).starts_with("-NOAUTH"), "the backup's clients need the password too");
    assert_eq!(r.one(&["AUTH", "s3cret-pw"]), "+OK");
    assert!(!r.one(&["DITTO.WAITTS", &ts]).starts_with('-'));
    assert_eq!(r.one(&["GET", "k"]), "2");
}

/// A relay on loopback to `upstream` that keeps every byte it passes from the upstream to
/// whoever connected: what a listener on the path between two nodes would read.
fn tapped_relay(upstream: String) -> (String, Arc<parking_lot::Mutex<Vec<u8>>>) {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    std::thread::spawn(move || {
        for down in l.incoming() {
            let Ok(down) = down else { return };
            let Ok(up) = std::net::TcpStream::connect(&upstream) else { continue };
            let (mut up_r, mut down_w) = (up.try_clone().unwrap(), down.try_clone().unwrap());
            let kept = Arc::clone(&kept);
            std::thread::spawn(move || {
                let mut b = [0u8; 64 << 10];
                while let Ok(n @ 1..) = up_r.read(&mut b) {
                    kept.lock().extend_from_slice(&b[..n]);
                    if down_w.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
                let _ = down_w.shutdown(std::net::Shutdown::Both);
            });
            let (mut down_r, mut up_w) = (down, up);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut down_r, &mut up_w);
                let _ = up_w.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (addr, seen)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn replication_over_tls_hides_the_data_and_refuses_backups_without_tls_or_the_cas_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("pki")).unwrap();
    std::fs::create_dir_all(tmp.path().join("stranger")).unwrap();
    let pki = ditto_server::tls::pki::make(&tmp.path().join("pki"));
    let stranger = ditto_server::tls::pki::make(&tmp.path().join("stranger"));
    let conf = |name: &str, on: bool, cert: &std::path::Path, key: &std::path::Path, ca: &std::path::Path| {
        let p = tmp.path().join(format!("{name}.toml"));
        // (Files without a use are refused: plaintext names none.)
        let text = match on {
            true => format!(
                "tls_replication = true\ntls_cert_file = {:?}\ntls_key_file = {:?}\ntls_ca_cert_file = {:?}\n",
                cert.display().to_string(),
                key.display().to_string(),
                ca.display().to_string()
            ),
            false => "tls_replication = false\n".to_string(),
        };
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let ours = |name: &str, on: bool| conf(name, on, &pki.server_cert, &pki.server_key, &pki.ca);
    // Plaintext first: the value crosses the wire as it is, so the check that TLS hides it
    // can fail.
    for tls in [false, true] {
        let name = if tls { "tls" } else { "plain" };
        let c = ours(name, tls);
        let primary = Node::start(&tmp.path().join(format!("{name}-primary")), &["--repl-port", "0", "--config", &c]);
        let (relay, seen) = tapped_relay(primary.repl.clone().unwrap());
        let value = format!("the-value-crossing-the-link-{name}");
        let mut p = Client::connect(primary.port).unwrap();
        assert_eq!(p.one(&["SET", "before", &value]), "+OK");
        let backup = Node::start(&tmp.path().join(format!("{name}-backup")), &["--replica-of", &relay, "--config", &c]);
        assert_eq!(p.one(&["SET", "after", &value]), "+OK");
        let ts = p.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
        let mut r = Client::connect(backup.port).unwrap();
        r.set_read_timeout(Duration::from_secs(15));
        assert!(!r.one(&["DITTO.WAITTS", &ts]).starts_with('-'), "{name}: the backup caught up");
        assert_eq!(r.one(&["GET", "before"]), value, "{name}: from the checkpoint copy");
        assert_eq!(r.one(&["GET", "after"]), value, "{name}: from the live log");
        let wire = seen.lock().clone();
        assert!(wire.len() > 200, "{name}: the relay carried the link ({} bytes)", wire.len());
        assert_eq!(contains(&wire, value.as_bytes()), !tls, "{name}: the value on the wire");
    }

    // A TLS primary, and backups it or they refuse.
    let c = ours("primary", true);
    let log = tmp.path().join("primary.log");
    let primary = Node::start_logged(&tmp.path().join("primary"), &["--repl-port", "0", "--config", &c], Some(&log));
    let repl = primary.repl.clone().unwrap();
    let mut p = Client::connect(primary.port).unwrap();
    assert_eq!(p.one(&["SET", "k", "1"]), "+OK");
    let refused = |name: &str, conf: &str, says: &[&str]| {
        let (status, said) = Node::run_to_exit(
            &tmp.path().join(name),
            &["--replica-of", &repl, "--config", conf],
            &tmp.path().join(format!("{name}.log")),
        );
        assert!(!status.success(), "{name}: {said}");
        for s in says {
            assert!(said.contains(s), "{name} should say {s:?}: {said}");
        }
    };
    // In plaintext: refused in plaintext, saying why.
    refused("plaintext", &ours("plaintext", false), &["takes only TLS backups", "set tls_replication on the backup"]);
    // Trusting another CA: it refuses the primary's certificate.
    let c = conf("trusts-another", true, &stranger.server_cert, &stranger.server_key, &stranger.ca);
    refused("trusts-another", &c, &["handshake failed", "invalid peer certificate"]);
    // Trusting the primary's CA but showing a certificate another CA signed: the primary
    // refuses it (the backup, whose side of the handshake may end first, retries), and it
    // never receives anything.
    let c = conf("shows-another", true, &stranger.server_cert, &stranger.server_key, &pki.ca);
    let shows = Spawned::new(&tmp.path().join("shows-another"), &["--replica-of", &repl, "--config", &c]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let said = std::fs::read_to_string(&log).unwrap();
        if said.contains("handshake failed") && said.contains("invalid peer certificate") {
            break;
        }
        assert!(Instant::now() < deadline, "the primary should say it refused the certificate: {said}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(files_under(&tmp.path().join("shows-another")), ["LOCK"], "it received nothing");
    let info = p.cmd(&["INFO", "replication"]).unwrap().concat();
    assert!(info.contains("connected_slaves:0"), "{info}");
    drop(shows);

    // A TLS backup of a plaintext primary: the primary says why it closed the link.
    let plain_log = tmp.path().join("plain-primary.log");
    let c = ours("plain-primary", false);
    let plain =
        Node::start_logged(&tmp.path().join("plain-primary"), &["--repl-port", "0", "--config", &c], Some(&plain_log));
    let tls_backup = Spawned::new(
        &tmp.path().join("tls-of-plain"),
        &["--replica-of", plain.repl.as_deref().unwrap(), "--config", &ours("tls-b", true)],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let said = std::fs::read_to_string(&plain_log).unwrap();
        if said.contains("a backup opened with TLS") && said.contains("set tls_replication on both nodes or on neither")
        {
            break;
        }
        assert!(Instant::now() < deadline, "the plaintext primary should say why: {said}");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(tls_backup);
    assert_eq!(files_under(&tmp.path().join("tls-of-plain")), ["LOCK"], "it received nothing");
}

/// A `ditto server` that may never serve (a backup that cannot join), killed when dropped.
struct Spawned(std::process::Child);

impl Spawned {
    fn new(dir: &std::path::Path, extra: &[&str]) -> Spawned {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_ditto"))
            .args(["server", "--port", "0", "--metrics", "off", "--workers", "2", "--data-dir", dir.to_str().unwrap()])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn ditto server");
        Spawned(child)
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The names of the files under `dir`, at any depth.
fn files_under(dir: &std::path::Path) -> Vec<std::ffi::OsString> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.path().is_dir() {
                true => dirs.push(e.path()),
                false => files.push(e.file_name()),
            }
        }
    }
    files
}

/// A field of `INFO server`.
fn server_field(c: &mut Client, name: &str) -> u64 {
    let info = c.cmd(&["INFO", "server"]).unwrap().join("\n");
    let prefix = format!("{name}:");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&prefix).map(|v| v.parse().unwrap()))
        .unwrap_or_else(|| panic!("no {name} in {info}"))
}

/// Each thread named with one of `names` in process `pid`, and its time slice in ns
/// (`se.slice` in /proc, where the kernel shows it: None if it does not).
fn thread_slices(pid: u32, names: &[&str]) -> Vec<(String, Option<u64>)> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default().trim().to_string();
        if !names.iter().any(|n| comm.starts_with(n)) {
            continue;
        }
        let slice = std::fs::read_to_string(t.join("sched")).ok().and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("se.slice").map(|v| v.trim_start_matches([' ', ':']).trim().parse().unwrap())
            })
        });
        out.push((comm, slice));
    }
    out
}

/// The commit path's threads ask for the slice the server is given (`commit_thread_slice_us`,
/// docs/replication.md "Short time slices for the commit path"), on a primary and on its
/// backup, and a primary's link thread for its own (`link_thread_slice_us`, 300 us unless
/// set: "A short slice for the links"); `INFO server` says how many got each; 0 asks for
/// nothing; a value out of the kernel's range is refused with a clear error.
#[test]
fn the_commit_paths_threads_run_with_the_slice_they_are_given() {
    let tmp = tempfile::tempdir().unwrap();
    let takes = ditto_log::sched::kernel_takes_slices();
    let primary_threads = ["ditto-log-", "ditto-disk-"];
    let backup_threads = ["ditto-repl-recv", "ditto-repl-pers", "ditto-repl-acks"];
    // (The primary's acks are read on its runtime: its one link thread is the link class.)
    let link_threads = ["ditto-repl-link"];
    // The flags given (None: not given) and the slices expected, commit path's and links'.
    let cases = [(Some(250u64), Some(400u64), 250, 400), (Some(0), Some(0), 0, 0), (None, None, 0, 300)];
    for (i, (commit_flag, link_flag, commit, link)) in cases.into_iter().enumerate() {
        let mut flags = Vec::new();
        if let Some(us) = commit_flag {
            flags.extend(["--commit-thread-slice-us".to_string(), us.to_string()]);
        }
        if let Some(us) = link_flag {
            flags.extend(["--link-thread-slice-us".to_string(), us.to_string()]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (pdir, bdir) = (tmp.path().join(format!("p{i}")), tmp.path().join(format!("b{i}")));
        let mut pargs = vec!["--repl-port", "0", "--commit-policy", "majority-received", "--backups", "1"];
        pargs.extend(&flags);
        let primary = Node::start(&pdir, &pargs);
        let mut bargs = vec!["--replica-of", primary.repl.as_ref().unwrap()];
        bargs.extend(&flags);
        let backup = Node::start(&bdir, &bargs);
        let mut c = Client::connect(primary.port).unwrap();
        // Released only once the backup holds it: its link and threads are up.
        assert_eq!(c.one(&["SET", "k", "v"]), "+OK");
        let mut b = Client::connect(backup.port).unwrap();
        let on_primary = [("commit", commit, &primary_threads[..]), ("link", link, &link_threads[..])];
        let on_backup = [("commit", commit, &backup_threads[..]), ("link", link, &[][..])];
        for (client, node, classes) in [(&mut c, &primary, on_primary), (&mut b, &backup, on_backup)] {
            let pid = node.child.id();
            // The process's main thread (in neither class): the kernel's default.
            let default = thread_slices(pid, &["ditto"]).into_iter().find(|(t, _)| t == "ditto").and_then(|(_, ns)| ns);
            for (class, slice, names) in classes {
                assert_eq!(server_field(client, &format!("{class}_thread_slice_us")), slice, "case {i}");
                // A thread asks for its slice as it starts: one just spawned (the backup's
                // replay acker, say) may not have yet. Looked at again, for up to 5 s.
                let deadline = Instant::now() + Duration::from_secs(5);
                let threads = loop {
                    let threads = thread_slices(pid, names);
                    let all_there = names.iter().all(|n| threads.iter().any(|(t, _)| t.starts_with(n)));
                    let asked =
                        slice == 0 || !takes || threads.iter().all(|(_, ns)| ns.is_none_or(|ns| ns == slice * 1000));
                    if (all_there && asked) || Instant::now() > deadline {
                        break threads;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                };
                let (given, ignored, refused) = (
                    server_field(client, &format!("{class}_thread_slice_given")),
                    server_field(client, &format!("{class}_thread_slice_ignored")),
                    server_field(client, &format!("{class}_thread_slice_refused")),
                );
                // Every kind of thread is there (2 workers: 2 flushers and 2 disk threads).
                for n in names {
                    assert!(threads.iter().any(|(t, _)| t.starts_with(n)), "no {n} thread in {threads:?}");
                }
                if slice == 0 {
                    assert_eq!((given, ignored, refused), (0, 0, 0), "case {i}, {class}");
                    for (t, ns) in &threads {
                        assert_eq!(*ns, default, "{t} asked for a slice with none set (case {i})");
                    }
                    continue;
                }
                assert_eq!(refused, 0);
                assert!(given + ignored >= threads.len() as u64, "{given} + {ignored} of {threads:?}");
                if takes {
                    assert_eq!(ignored, 0);
                    for (t, ns) in &threads {
                        if let Some(ns) = ns {
                            assert_eq!(*ns, slice * 1000, "{t}'s slice (case {i})");
                        }
                    }
                    assert_ne!(default, Some(slice * 1000), "the main thread keeps the default");
                }
            }
        }
    }
    for bad in ["50", "100001"] {
        for class in ["commit", "link"] {
            let (status, said) = Node::run_to_exit(
                &tmp.path().join(format!("bad{class}{bad}")),
                &[&format!("--{class}-thread-slice-us"), bad],
                &tmp.path().join(format!("bad{class}{bad}.log")),
            );
            assert!(!status.success());
            assert!(said.contains(&format!("{class}_thread_slice_us must be 0")), "{said}");
        }
    }
}

/// A field of `INFO replication`, as text.
fn replication_field(c: &mut Client, name: &str) -> Option<String> {
    let info = c.cmd(&["INFO", "replication"]).unwrap().join("\n");
    let prefix = format!("{name}:");
    info.lines().find_map(|l| l.trim().strip_prefix(&prefix).map(str::to_string))
}

/// A backup's directory names the database it holds (crates/replication/src/identity.rs):
/// pointed at a primary of another database, its server exits saying so, its directory
/// untouched; running, it stops following a primary made anew at its primary's address,
/// and goes on serving what it held. Both primaries here are epoch 1 from timestamp 0,
/// the second's clock past the backup's: before, the backup was resumed from the second
/// primary's log above what it held, and served the two histories mixed.
#[test]
fn a_backup_takes_nothing_from_a_primary_of_another_database() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = ["--commit-policy", "local"];
    // The replication port is taken again by the next primary once the first is killed:
    // one below Linux's ephemeral range (32768 and up), which an outgoing connection's
    // local end cannot take meanwhile.
    let a_repl_port = port_below_the_ephemeral_range().to_string();
    let mut a = Node::start(&tmp.path().join("a"), &[&["--repl-port", a_repl_port.as_str()][..], &policy].concat());
    let a_repl = a.repl.clone().unwrap();
    let mut ca = Client::connect(a.port).unwrap();
    let a_id = replication_field(&mut ca, "ditto_database_id").expect("the primary's id");
    let b_args = ["--replica-of", a_repl.as_str()];
    let b = Node::start(&tmp.path().join("b"), &b_args);
    for k in 0..20 {
        assert_eq!(ca.one(&["SET", &format!("k{k}"), "a"]), "+OK");
    }
    let ts = ca.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
    let mut cb = Client::connect(b.port).unwrap();
    cb.set_read_timeout(Duration::from_secs(10));
    assert!(!cb.one(&["DITTO.WAITTS", &ts]).starts_with('-'));
    assert_eq!(replication_field(&mut cb, "ditto_database_id").as_deref(), Some(a_id.as_str()));
    // Primary a is replaced, at its replication address, by one on an empty directory.
    a.kill();
    let c = Node::start(&tmp.path().join("c"), &[&["--repl-port", a_repl_port.as_str()][..], &policy].concat());
    let mut cc = Client::connect(c.port).unwrap();
    let c_id = replication_field(&mut cc, "ditto_database_id").expect("the new primary's id");
    assert_ne!(c_id, a_id);
    for k in 0..200 {
        assert_eq!(cc.one(&["SET", &format!("k{k}"), "c"]), "+OK");
    }
    // The running backup stops following, saying why, and serves what it held.
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let failure = loop {
        if let Some(f) = replication_field(&mut cb, "ditto_failure") {
            break f;
        }
        assert!(std::time::Instant::now() < end, "the backup did not stop following the new primary");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(failure.contains("the primary serves another database"), "{failure}");
    assert!(failure.contains(&a_id) && failure.contains(&c_id), "{failure}");
    assert_eq!(cb.one(&["GET", "k0"]), "a");
    assert_eq!(cb.one(&["GET", "k100"]), "(nil)", "the new primary's key was taken");
    assert_eq!(cb.one(&["DBSIZE"]), ":20");
    drop(b);
    // Started again against it, the backup's server exits saying so.
    let c_repl = c.repl.clone().unwrap();
    let (status, said) =
        Node::run_to_exit(&tmp.path().join("b"), &["--replica-of", c_repl.as_str()], &tmp.path().join("b.log"));
    assert!(!status.success(), "{said}");
    assert!(said.contains("the primary serves another database") && said.contains(&c_id), "{said}");
    drop(c);
    // Its directory is as it was: with its own primary back, it resumes, holding a's keys.
    let a = Node::start(&tmp.path().join("a"), &[&["--repl-port", "0"][..], &policy].concat());
    let a_repl = a.repl.clone().unwrap();
    let b = Node::start(&tmp.path().join("b"), &["--replica-of", a_repl.as_str()]);
    let mut ca = Client::connect(a.port).unwrap();
    assert_eq!(replication_field(&mut ca, "ditto_database_id").as_deref(), Some(a_id.as_str()), "a's id kept");
    assert_eq!(ca.one(&["SET", "after", "a"]), "+OK");
    let ts = ca.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
    let mut cb = Client::connect(b.port).unwrap();
    cb.set_read_timeout(Duration::from_secs(10));
    assert!(!cb.one(&["DITTO.WAITTS", &ts]).starts_with('-'));
    assert_eq!(cb.one(&["DBSIZE"]), ":21");
    assert_eq!(cb.one(&["GET", "k19"]), "a");
}

/// The Prometheus exposition of a primary and of its backup, family by family: each
/// family's HELP and TYPE said once, before its samples; a running count (named `_total`)
/// typed a counter and every counter so named (until 2026-12-06 four running counts of
/// replication and the cluster were typed gauges, found by a review).
#[test]
fn a_pairs_metrics_say_each_family_once_and_type_running_counts_as_counters() {
    use std::io::{Read, Write};
    let tmp = tempfile::tempdir().unwrap();
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (pm, bm) = (free(), free());
    let primary = Node::start(&tmp.path().join("p"), &["--repl-port", "0", "--metrics", &pm]);
    let repl = primary.repl.clone().unwrap();
    let backup = Node::start(&tmp.path().join("b"), &["--replica-of", &repl, "--metrics", &bm]);
    let mut c = Client::connect(primary.port).unwrap();
    assert_eq!(c.one(&["SET", "k", "v"]), "+OK");
    let mut b = Client::connect(backup.port).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !b.cmd(&["INFO", "replication"]).unwrap().join("\n").contains("master_link_status:up") {
        assert!(Instant::now() < deadline, "the backup did not link within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let scrape = |addr: &str| {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        text
    };
    for (who, addr, must) in
        [("primary", &pm, "ditto_replication_backups"), ("backup", &bm, "ditto_replication_reconnects_total")]
    {
        let text = scrape(addr);
        let mut said = std::collections::HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(said.insert(name.to_string(), kind.to_string()).is_none(), "{who}: {name} typed twice");
                assert!(text.contains(&format!("# HELP {name} ")), "{who}: {name} without HELP");
                if kind != "histogram" {
                    assert_eq!(kind == "counter", name.ends_with("_total"), "{who}: {name} is a {kind}");
                }
            } else if !line.starts_with('#') && !line.is_empty() && line.starts_with("ditto_") {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| said.get(*f).is_some_and(|k| k == "histogram")))
                    .unwrap_or(name);
                assert!(said.contains_key(family), "{who}: a sample of {name} before its TYPE");
            }
        }
        assert!(said.contains_key(must), "{who}: no {must}");
    }
}
