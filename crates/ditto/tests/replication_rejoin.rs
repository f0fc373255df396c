//! A standalone backup whose primary can no longer resume it as it stands (the primary
//! restarted, which opens a new epoch) joins it again by itself, in the same process and
//! on the same port, serving its last read view meanwhile; before, it stopped for good
//! until someone restarted it. After a SIGKILL it is cut at the primary's restart point
//! and resumed from the log, or, if it holds less than that point, sent a copy; after a
//! clean stop it holds the point exactly and is resumed from the log, never copied.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{port_below_the_ephemeral_range, Client, Node};

const FIRST: usize = 2000;
const AFTER: usize = 500;

/// Sends SIGTERM to `child` and waits (at most 30 s) for it to exit; its status.
fn stop_with_sigterm(child: &mut std::process::Child) -> std::process::ExitStatus {
    let status = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    exit
}

const POLICY: [&str; 4] = ["--commit-policy", "majority-durable", "--backups", "1"];

/// A primary (majority-durable, one backup) and its backup, the backup's log in a file.
struct Pair {
    pdir: std::path::PathBuf,
    blog: std::path::PathBuf,
    primary: Node,
    /// The primary's replication port, for its restart.
    repl_port: String,
    backup: Node,
}

impl Pair {
    fn start(dir: &std::path::Path) -> Pair {
        let (pdir, blog) = (dir.join("primary"), dir.join("backup.log"));
        let port = port_below_the_ephemeral_range().to_string();
        let primary = Node::start(&pdir, &[&["--repl-port", &port][..], &POLICY].concat());
        let repl = primary.repl.clone().unwrap();
        let repl_port = repl.rsplit(':').next().unwrap().to_string();
        let backup = Node::start_logged(&dir.join("backup"), &["--replica-of", &repl], Some(&blog));
        Pair { pdir, blog, primary, repl_port, backup }
    }
}

fn field(c: &mut Client, section: &str, name: &str) -> Option<String> {
    let info = c.cmd(&["INFO", section]).unwrap().join("\n");
    info.lines().find_map(|l| l.strip_prefix(&format!("{name}:")).map(|v| v.trim().to_string()))
}

/// Writes `keys` under majority-durable (each acknowledged once the backup holds it on
/// its disk) and returns the last commit's timestamp.
fn write_keys(port: u16, keys: std::ops::Range<usize>) -> String {
    let mut c = Client::connect(port).unwrap();
    c.set_read_timeout(Duration::from_secs(60));
    let names: Vec<String> = keys.clone().map(|i| format!("k{i}")).collect();
    for chunk in names.chunks(100) {
        let mut args = vec!["MSET"];
        for k in chunk {
            args.extend([k.as_str(), k.as_str()]);
        }
        assert_eq!(c.one(&args), "+OK");
    }
    c.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string()
}

#[test]
fn a_backup_whose_primary_was_killed_and_restarted_joins_again_in_the_same_process() {
    let tmp = tempfile::tempdir().unwrap();
    let Pair { pdir, blog, mut primary, repl_port, backup } = Pair::start(tmp.path());
    let mut b = Client::connect(backup.port).unwrap();
    let pid = field(&mut b, "server", "process_id").expect("process_id");
    let ts = write_keys(primary.port, 0..FIRST);
    b.set_read_timeout(Duration::from_secs(30));
    assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
    assert_eq!(b.one(&["DBSIZE"]), format!(":{FIRST}"));

    // Reads on the backup throughout: every answer holds at least what the backup held
    // (its last read view while it copies, then the copy); a connection the swap closes
    // is opened again.
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, reconnects) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let reader = {
        let (stop, reads, reconnects, port) =
            (Arc::clone(&stop), Arc::clone(&reads), Arc::clone(&reconnects), backup.port);
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut c = Client::connect(port).unwrap();
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match c.cmd(&["DBSIZE"]).and_then(|n| Ok((n, c.cmd(&["GET", "k7"])?))) {
                    Ok((n, v)) => {
                        let n: usize = n[0].trim_start_matches(':').parse().unwrap_or_else(|_| panic!("DBSIZE: {n:?}"));
                        assert!(n >= FIRST, "the backup's read view went back: {n} keys");
                        assert_eq!(v, ["k7"], "GET k7");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        reconnects.fetch_add(1, Ordering::Relaxed);
                        c = connect_within(port, Duration::from_secs(10));
                    }
                }
            }
        })
    };

    // The primary dies and comes back on the same replication port: a new epoch, so it
    // cannot resume the backup from its log.
    primary.kill();
    let down = reads.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    assert!(reads.load(Ordering::Relaxed) > down, "the backup served no reads while its primary was down");
    let primary = Node::start(&pdir, &[&["--repl-port", &repl_port][..], &POLICY].concat());
    // Acknowledged only once the backup holds them durably: it must have joined again.
    let ts = write_keys(primary.port, FIRST..FIRST + AFTER);
    let mut b = connect_within(backup.port, Duration::from_secs(10));
    b.set_read_timeout(Duration::from_secs(30));
    assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
    assert_eq!(b.one(&["DBSIZE"]), format!(":{}", FIRST + AFTER), "every acknowledged key, once");
    for i in [0, FIRST - 1, FIRST, FIRST + AFTER - 1] {
        assert_eq!(b.one(&["GET", &format!("k{i}")]), format!("k{i}"));
    }
    assert_eq!(field(&mut b, "replication", "master_link_status").as_deref(), Some("up"));
    assert_eq!(field(&mut b, "server", "process_id"), Some(pid), "joined again in the same process");
    let served = reads.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(200));
    assert!(reads.load(Ordering::Relaxed) > served, "reads stopped after the rejoin");
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("the reader's checks");
    let log = std::fs::read_to_string(&blog).unwrap();
    assert!(log.contains("joining it again, reads served at the last read view"), "{log}");
    // SIGTERM still stops it cleanly after the swap (the signal is watched once for the
    // process, not per role).
    let mut backup = backup;
    let exit = stop_with_sigterm(&mut backup.child);
    assert!(exit.success(), "a clean stop: {exit:?}");
    eprintln!(
        "reads on the backup: {}, connections opened again: {}",
        reads.load(Ordering::Relaxed),
        reconnects.load(Ordering::Relaxed)
    );
}

#[test]
fn a_backup_whose_primary_restarted_cleanly_is_resumed_from_the_log_without_a_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let Pair { pdir, blog, mut primary, repl_port, backup } = Pair::start(tmp.path());
    let ts = write_keys(primary.port, 0..FIRST);
    let mut b = Client::connect(backup.port).unwrap();
    b.set_read_timeout(Duration::from_secs(30));
    assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
    // A clean stop (SIGTERM) once idle: the backup holds everything the primary's log
    // does, up to the point its restart begins the next epoch at.
    let exit = stop_with_sigterm(&mut primary.child);
    assert!(exit.success(), "a clean stop: {exit:?}");
    let primary = Node::start(&pdir, &[&["--repl-port", &repl_port][..], &POLICY].concat());
    let ts = write_keys(primary.port, FIRST..FIRST + AFTER);
    let mut b = connect_within(backup.port, Duration::from_secs(10));
    b.set_read_timeout(Duration::from_secs(30));
    assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
    assert_eq!(b.one(&["DBSIZE"]), format!(":{}", FIRST + AFTER));
    let log = std::fs::read_to_string(&blog).unwrap();
    assert!(log.contains("must be cut at ts"), "{log}");
    assert!(log.contains("backup: resuming from ts"), "resumed from the log: {log}");
    assert_eq!(log.matches("backup: checkpoint at ts").count(), 1, "only the first join copies a checkpoint: {log}");
}

#[test]
fn a_backup_still_joining_its_primary_stops_at_once_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    // A replication address nothing listens on: the backup tries to join for a minute.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["server", "--port", "0", "--metrics", "off", "--data-dir", tmp.path().to_str().unwrap()])
        .args(["--replica-of", &dead])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "it should still be trying to join");
    let t = Instant::now();
    // Before it serves, a stop ends it at once, by SIGTERM's default action.
    let exit = stop_with_sigterm(&mut child);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&exit), Some(15), "{exit:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
}

#[test]
fn a_backups_directory_is_refused_as_a_primarys_unless_promoted_and_then_serves_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let (pdir, bdir) = (tmp.path().join("primary"), tmp.path().join("backup"));
    let primary = Node::start(&pdir, &[&["--repl-port", "0"][..], &POLICY].concat());
    let mut backup = Node::start(&bdir, &["--replica-of", primary.repl.as_ref().unwrap()]);
    // Acknowledged once durable on the backup: in its replica log (above its checkpoint).
    let ts = write_keys(primary.port, 0..FIRST);
    let mut b = Client::connect(backup.port).unwrap();
    b.set_read_timeout(Duration::from_secs(30));
    assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
    let mut p = Client::connect(primary.port).unwrap();
    let epoch: u64 = field(&mut p, "replication", "ditto_epoch").and_then(|e| e.parse().ok()).expect("the epoch");
    drop((p, primary));
    let exit = stop_with_sigterm(&mut backup.child);
    assert!(exit.success(), "{exit:?}");
    // Started without --replica-of: refused, saying how, and nothing changed.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["server", "--port", "0", "--metrics", "off", "--data-dir", bdir.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("backup's data directory") && err.contains("--promote"), "{err}");
    // A promotion that crashes once the followed epoch is gone with the replica log, before
    // the primary's log began (failpoint `promotion-crash-before-log`): the next start, a
    // primary's directory now, still writes an epoch above the followed one (before
    // 2026-12-03 it wrote epoch 1, and a backup of the old primary could have been resumed
    // from its log as if it were the same history).
    let crashed = std::process::Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["server", "--port", "0", "--metrics", "off", "--promote", "--data-dir", bdir.to_str().unwrap()])
        .env("DITTO_FAILPOINTS", "promotion-crash-before-log")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&crashed.stderr).contains("failpoint promotion-crash-before-log"));
    // Promoted: every acknowledged key, and it takes writes.
    let promoted = Node::start(&bdir, &["--repl-port", "0"]);
    let mut c = Client::connect(promoted.port).unwrap();
    assert_eq!(c.one(&["DBSIZE"]), format!(":{FIRST}"));
    assert_eq!(c.one(&["GET", &format!("k{}", FIRST - 1)]), format!("k{}", FIRST - 1));
    assert_eq!(c.one(&["SET", "after", "promotion"]), "+OK");
    assert_eq!(field(&mut c, "replication", "role").as_deref(), Some("master"));
    let now: u64 = field(&mut c, "replication", "ditto_epoch").and_then(|e| e.parse().ok()).expect("the epoch");
    assert!(now > epoch, "the promoted primary writes epoch {now}, above the {epoch} it followed");
    // Started again, as a primary's directory now (with or without the flag).
    drop(c);
    let mut promoted = promoted;
    let exit = stop_with_sigterm(&mut promoted.child);
    assert!(exit.success(), "{exit:?}");
    let again = Node::start(&bdir, &[]);
    let mut c = Client::connect(again.port).unwrap();
    assert_eq!(c.one(&["DBSIZE"]), format!(":{}", FIRST + 1));
}

/// Waits (at most 30 s) until the primary on `port` holds ts `ts` durably.
fn wait_durable(port: u16, ts: u64) {
    let mut c = Client::connect(port).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while field(&mut c, "replication", "ditto_durable_ts").and_then(|v| v.parse::<u64>().ok()) < Some(ts) {
        assert!(Instant::now() < deadline, "the primary did not make ts {ts} durable");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Under `majority-received` a commit is acknowledged once the backup holds it, before
/// the primary's own fsync: a primary that crashed may come back without commits only its
/// backup holds. So a restarted primary under such a policy takes no writes (a clear
/// READONLY error) until its backup has said it holds nothing above the
/// restart point; then it does (docs/replication.md, "A primary restarted under a policy
/// that counts backups").
/// `SET after 1` on a restarted primary, again while it answers that its restart waits,
/// until it is taken (at most 30 s after `since`).
fn set_once_the_restart_settles(c: &mut Client, since: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.one(&["SET", "after", "1"]);
        if r == "+OK" {
            return;
        }
        assert!(r.starts_with("-READONLY this primary restarted"), "{r}");
        assert!(Instant::now() < deadline, "still refused 30 s after {since}: {r}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A primary under `policy` (one backup) whose backup b1 held `FIRST` keys (and what
/// `more` wrote, given the primary's port: its last commit's ts), durable on both, and was
/// then stopped cleanly.
struct B1Stopped {
    tmp: tempfile::TempDir,
    primary: Node,
    pdir: std::path::PathBuf,
    bdir: std::path::PathBuf,
    /// The primary's replication address, and b1's flags.
    repl: String,
    b1: Vec<String>,
    /// The primary's flags for a restart on the same replication port.
    restart: Vec<String>,
    /// The keys written.
    keys: usize,
}

fn b1_stopped(policy: &str, more: impl FnOnce(u16) -> Option<u64>) -> B1Stopped {
    let tmp = tempfile::tempdir().unwrap();
    let policy = ["--commit-policy", policy, "--backups", "1"];
    let pdir = tmp.path().join("primary");
    let port = port_below_the_ephemeral_range().to_string();
    let primary = Node::start(&pdir, &[&["--repl-port", &port][..], &policy].concat());
    let repl = primary.repl.clone().unwrap();
    let repl_port = repl.rsplit(':').next().unwrap().to_string();
    let bdir = tmp.path().join("backup");
    let b1: Vec<String> = ["--replica-of", &repl, "--replica-name", "b1"].map(String::from).to_vec();
    let mut backup = Node::start_logged(
        &bdir,
        &b1.iter().map(String::as_str).collect::<Vec<_>>(),
        Some(&tmp.path().join("backup.log")),
    );
    let mut ts: u64 = write_keys(primary.port, 0..FIRST).parse().unwrap();
    let mut keys = FIRST;
    if let Some(t) = more(primary.port) {
        (ts, keys) = (t, keys + 1);
    }
    // Durable on the primary too, so that its restart point covers what the backup holds.
    wait_durable(primary.port, ts);
    assert!(stop_with_sigterm(&mut backup.child).success());
    let restart = [&["--repl-port", repl_port.as_str()][..], &policy].concat().into_iter().map(String::from).collect();
    B1Stopped { tmp, primary, pdir, bdir, repl, b1, restart, keys }
}

impl B1Stopped {
    fn restart_args(&self) -> Vec<&str> {
        self.restart.iter().map(String::as_str).collect()
    }

    /// b1 starts again (its output in `log`); once the waiting primary takes a write
    /// through `c`, b1 holds it, every key before and it: b1's node and a client of it.
    fn b1_comes_back(&self, c: &mut Client, log: &str) -> (Node, Client) {
        let args: Vec<&str> = self.b1.iter().map(String::as_str).collect();
        let backup = Node::start_logged(&self.bdir, &args, Some(&self.tmp.path().join(log)));
        c.set_read_timeout(Duration::from_secs(30));
        set_once_the_restart_settles(c, "the backup came back");
        let ts = c.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
        let mut b = Client::connect(backup.port).unwrap();
        b.set_read_timeout(Duration::from_secs(30));
        assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
        assert_eq!(b.one(&["DBSIZE"]), format!(":{}", self.keys + 1));
        (backup, b)
    }
}

#[test]
fn a_primary_restarted_under_a_received_policy_takes_writes_once_its_backup_holds_nothing_more() {
    restarted_primary_waits_for_its_backup("majority-received", None);
}

/// The same with a `local` server whose connection chose `majority-received`: the
/// primary's record of the policies in use (the file `quorum`) makes its restart wait
/// too (found by review: the wait went by the server's policy alone).
#[test]
fn a_connections_policy_makes_a_restarted_local_primary_wait_too() {
    restarted_primary_waits_for_its_backup("local", Some("majority-received"));
}

fn restarted_primary_waits_for_its_backup(server_policy: &str, connection_policy: Option<&str>) {
    let mut away = b1_stopped(server_policy, |port| {
        let p = connection_policy?;
        let mut m = Client::connect(port).unwrap();
        m.set_read_timeout(Duration::from_secs(30));
        assert_eq!(m.one(&["DITTO.POLICY", p]), "+OK");
        assert_eq!(m.one(&["SET", "under-its-own-policy", "1"]), "+OK");
        Some(m.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').parse().unwrap())
    });
    away.primary.kill();
    let plog = away.tmp.path().join("primary-2.log");
    let primary = Node::start_logged(&away.pdir, &away.restart_args(), Some(&plog));
    let mut c = Client::connect(primary.port).unwrap();
    let refused = c.one(&["SET", "after", "1"]);
    assert!(
        refused.starts_with("-READONLY this primary restarted")
            && refused.contains("until 1 more of the backups its quorum counted (b1)"),
        "{refused}"
    );
    assert!(field(&mut c, "replication", "ditto_writes_refused").is_some_and(|w| w.contains("takes no writes")));
    let log = std::fs::read_to_string(&plog).unwrap();
    assert!(log.contains("takes no writes until 1 more"), "{log}");
    // A backup that never counted (a fresh one, started to get writes going) joins, but
    // says nothing of what b1 holds: writes stay refused (found by review).
    let fresh = Node::start(&away.tmp.path().join("fresh"), &["--replica-of", &away.repl, "--replica-name", "fresh"]);
    let mut f = Client::connect(fresh.port).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while field(&mut f, "replication", "master_link_status").as_deref() != Some("up") {
        assert!(Instant::now() < deadline, "the fresh backup did not join");
        std::thread::sleep(Duration::from_millis(20));
    }
    let refused = c.one(&["SET", "after", "1"]);
    assert!(refused.contains("until 1 more of the backups its quorum counted (b1)"), "{refused}");
    drop(fresh);
    let (_backup, mut b) = away.b1_comes_back(&mut c, "backup-2.log");
    assert!(field(&mut c, "replication", "ditto_writes_refused").is_none());
    let log = std::fs::read_to_string(&plog).unwrap();
    assert!(log.contains("taking writes: backups b1"), "{log}");
    assert_eq!(b.one(&["GET", "after"]), "1");
}

/// Two restarts in a row while the one backup is away (under `majority-received`): the
/// second restart's primary is of the epoch after the first's, and the backup follows
/// the epoch before that. The record keeps the chain of restarts that did not settle (the
/// file `quorum`: `restart E P` lines), so the backup, holding nothing above where the
/// first restart cut its epoch, is clear: it is sent a copy, the primary takes writes,
/// and the backup holds every write. Before 2026-11-29 it was refused for good (it might
/// have held what the first restart lost) and only a person ended the wait.
#[test]
fn a_primary_restarted_twice_while_its_backup_was_away_takes_writes_once_it_comes_back() {
    let mut away = b1_stopped("majority-received", |_| None);
    for restart in 1..=2 {
        away.primary.kill();
        let log = away.tmp.path().join(format!("primary-{restart}.log"));
        away.primary = Node::start_logged(&away.pdir, &away.restart_args(), Some(&log));
        let mut c = Client::connect(away.primary.port).unwrap();
        let refused = c.one(&["SET", "after", "1"]);
        assert!(refused.starts_with("-READONLY this primary restarted"), "restart {restart}: {refused}");
        let record = std::fs::read_to_string(away.pdir.join("quorum")).unwrap();
        let chain = record.lines().filter(|l| l.starts_with("restart ")).count();
        assert_eq!(chain, restart, "restart {restart}: the record keeps the chain: {record}");
    }
    let mut c = Client::connect(away.primary.port).unwrap();
    let (_backup, mut b) = away.b1_comes_back(&mut c, "backup-2.log");
    let record = std::fs::read_to_string(away.pdir.join("quorum")).unwrap();
    assert!(!record.contains("restart "), "a settled restart ends the chain: {record}");
    assert_eq!(b.one(&["GET", "after"]), "1");
}

/// A primary whose last run was `local` (nothing its backup held could have been
/// acknowledged by it) restarts under `majority-received`, and its start fails after the
/// open began the new epoch (its replication port taken): the restart joins the record's
/// chain all the same, by the last record merged with this run's policy (before
/// 2026-12-03 by the last record alone, which needed no wait: the next start recovered
/// from the empty new epoch and refused its backup of the epoch before as holding more).
#[test]
fn a_restart_that_changes_the_policy_and_fails_after_its_open_still_joins_the_chain() {
    let mut away = b1_stopped("local", |_| None);
    away.primary.kill();
    let repl_port = away.restart[1].clone();
    let taken = std::net::TcpListener::bind(format!("127.0.0.1:{repl_port}")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["server", "--port", "0", "--metrics", "off", "--data-dir", away.pdir.to_str().unwrap()])
        .args(["--repl-port", &repl_port, "--commit-policy", "majority-received", "--backups", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with its replication port taken: {err}");
    drop(taken);
    let record = std::fs::read_to_string(away.pdir.join("quorum")).unwrap();
    assert_eq!(
        record.lines().filter(|l| l.starts_with("restart ")).count(),
        1,
        "the failed start's epoch is in the chain: {record}\n{err}"
    );
}

/// A primary whose restart crashed between its recovery's checkpoint (which names the new
/// epoch) and the new epoch's first segments, as a crash would leave it (no segment left):
/// started again, it still waits for the backup its quorum counted, and takes writes once
/// the backup comes back holding nothing it lacks. Before 2026-11-29 it said it had begun
/// no new epoch, wrote its own record and took writes at once, waiting for no backup.
#[test]
fn a_primary_whose_restart_crashed_in_its_recovery_still_waits_for_its_backup() {
    let mut away = b1_stopped("majority-received", |_| None);
    away.primary.kill();
    // The restart's recovery writes its checkpoint and begins the new epoch; killed, and
    // its new epoch's segments removed, the directory is as a crash right after that
    // checkpoint leaves it.
    away.primary = Node::start_logged(&away.pdir, &away.restart_args(), Some(&away.tmp.path().join("primary-1.log")));
    away.primary.kill();
    for e in std::fs::read_dir(away.pdir.join("log")).unwrap() {
        let path = e.unwrap().path();
        if path.is_file() {
            std::fs::remove_file(&path).unwrap();
        }
    }
    let primary = Node::start_logged(&away.pdir, &away.restart_args(), Some(&away.tmp.path().join("primary-2.log")));
    let mut c = Client::connect(primary.port).unwrap();
    let refused = c.one(&["SET", "after", "1"]);
    assert!(refused.starts_with("-READONLY this primary restarted"), "{refused}");
    away.b1_comes_back(&mut c, "backup-2.log");
}

/// Two backups counted under `majority-received` (either one alone could release a
/// commit), both gone when the primary is SIGKILLed and restarted: it waits for both. A
/// person declares b2 lost (`DITTO.FORGETBACKUP`): refused while the record cannot be
/// written, refused for a name the quorum never counted, and then written to the record
/// on disk, and the wait goes on for b1 (which alone may hold a commit). b1 comes back
/// holding nothing more: writes are taken, b1 holds them, and the command is refused once
/// nothing waits. (That b1 is still waited for does not tell the right count from
/// removing b2's name here; the unit test in restart.rs does, by brute force.)
#[test]
fn a_backup_declared_lost_is_given_up_and_the_restarted_primary_waits_for_the_others_alone() {
    fn args(v: &[String; 4]) -> Vec<&str> {
        v.iter().map(|s| s.as_str()).collect()
    }
    let tmp = tempfile::tempdir().unwrap();
    let policy = ["--commit-policy", "majority-received", "--backups", "2"];
    let pdir = tmp.path().join("primary");
    let port = port_below_the_ephemeral_range().to_string();
    let mut primary = Node::start(&pdir, &[&["--repl-port", &port][..], &policy].concat());
    let repl = primary.repl.clone().unwrap();
    let repl_port = repl.rsplit(':').next().unwrap().to_string();
    let named =
        |n: &'static str| ["--replica-of".to_string(), repl.clone(), "--replica-name".to_string(), n.to_string()];
    let (b1_args, b2_args) = (named("b1"), named("b2"));
    let b1_dir = tmp.path().join("b1");
    let mut b1 = Node::start(&b1_dir, &args(&b1_args));
    let mut b2 = Node::start(&tmp.path().join("b2"), &args(&b2_args));
    wait_durable(primary.port, write_keys(primary.port, 0..FIRST).parse().unwrap());
    assert!(stop_with_sigterm(&mut b1.child).success());
    assert!(stop_with_sigterm(&mut b2.child).success());
    primary.kill();
    let plog = tmp.path().join("primary-2.log");
    let primary = Node::start_logged(&pdir, &[&["--repl-port", &repl_port][..], &policy].concat(), Some(&plog));
    let mut c = Client::connect(primary.port).unwrap();
    c.set_read_timeout(Duration::from_secs(30));
    let refused = c.one(&["SET", "after", "1"]);
    assert!(refused.contains("until 2 more of the backups its quorum counted (b1, b2)"), "{refused}");
    // The record cannot be written: refused, and nothing changes.
    let blocker = pdir.join("quorum.tmp");
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("x"), b"x").unwrap();
    let e = c.one(&["DITTO.FORGETBACKUP", "b2"]);
    assert!(e.starts_with("-ERR this primary could not record that backup b2 is lost"), "{e}");
    let refused = c.one(&["SET", "after", "1"]);
    assert!(refused.contains("until 2 more of the backups its quorum counted (b1, b2)"), "{refused}");
    std::fs::remove_dir_all(&blocker).unwrap();
    let e = c.one(&["DITTO.FORGETBACKUP", "nosuch"]);
    assert!(e.starts_with("-ERR nosuch is not a backup this primary's quorum counted (b1, b2)"), "{e}");
    let ok = c.one(&["DITTO.FORGETBACKUP", "b2"]);
    assert!(ok.starts_with("+OK backup b2 recorded as lost") && ok.ends_with("waits for 1 of b1"), "{ok}");
    // On disk before the reply (a restart now would wait for b1 alone).
    let record = std::fs::read_to_string(pdir.join("quorum")).unwrap();
    // (Version 4: it also keeps the restart, which has not settled.)
    assert!(record.starts_with("ditto quorum 4\n") && record.contains("\nlost b2\n"), "{record}");
    // Either backup alone could have released a commit: b1 may hold one, so it is still
    // waited for.
    std::thread::sleep(Duration::from_millis(100));
    let refused = c.one(&["SET", "after", "1"]);
    assert!(refused.contains("until 1 more of the backups its quorum counted (b1)"), "{refused}");
    // b1 comes back holding nothing above the restart point: the wait settles on it alone.
    let b1 = Node::start(&b1_dir, &args(&b1_args));
    set_once_the_restart_settles(&mut c, "b1 came back with b2 lost");
    let log = std::fs::read_to_string(&plog).unwrap();
    assert!(log.contains("taking writes: backups b1 hold nothing above"), "{log}");
    let e = c.one(&["DITTO.FORGETBACKUP", "b1"]);
    assert!(e.starts_with("-ERR this primary is not waiting for its backups after a restart"), "{e}");
    let ts = c.one(&["DITTO.LASTCOMMIT"]).trim_start_matches(':').to_string();
    let mut b = Client::connect(b1.port).unwrap();
    b.set_read_timeout(Duration::from_secs(30));
    assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
    assert_eq!(b.one(&["GET", "after"]), "1");
    assert_eq!(b.one(&["DBSIZE"]), format!(":{}", FIRST + 1));
}

/// A backup that joined its restarted primary again but cannot serve (the failpoint
/// `serve-fails-after-rejoin`, as a port taken meanwhile would) makes what it received
/// durable, says why and exits with a failure; started again, it holds everything.
#[test]
fn a_backup_that_cannot_serve_after_joining_again_stops_cleanly_and_comes_back_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let pdir = tmp.path().join("primary");
    let port = port_below_the_ephemeral_range().to_string();
    let mut primary = Node::start(&pdir, &[&["--repl-port", &port][..], &POLICY].concat());
    let repl = primary.repl.clone().unwrap();
    let repl_port = repl.rsplit(':').next().unwrap().to_string();
    let (bdir, blog) = (tmp.path().join("backup"), tmp.path().join("backup.log"));
    let env = [("DITTO_FAILPOINTS", "serve-fails-after-rejoin")];
    let mut backup = Node::start_with_env(&bdir, &["--replica-of", &repl], Some(&blog), &env);
    write_keys(primary.port, 0..FIRST);
    primary.kill();
    let primary = Node::start(&pdir, &[&["--repl-port", &repl_port][..], &POLICY].concat());
    let deadline = Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(s) = backup.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the backup did not exit after its failed rejoin");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!exit.success(), "{exit:?}");
    let log = std::fs::read_to_string(&blog).unwrap();
    assert!(log.contains("serve-fails-after-rejoin"), "{log}");
    assert!(!log.contains("stopping the backup:"), "what it received was made durable: {log}");
    let backup = Node::start_logged(&bdir, &["--replica-of", &repl], Some(&tmp.path().join("backup-2.log")));
    let ts = write_keys(primary.port, FIRST..FIRST + AFTER);
    let mut b = connect_within(backup.port, Duration::from_secs(10));
    b.set_read_timeout(Duration::from_secs(30));
    assert_eq!(b.one(&["DITTO.WAITTS", &ts]), "+OK");
    assert_eq!(b.one(&["DBSIZE"]), format!(":{}", FIRST + AFTER));
}

/// Stopped cleanly, a primary has on its disk everything it shipped: it restarts without
/// waiting for its backups (its record forgets them). Killed, and started without
/// replication, it refuses to start, saying why; with `--repl-port` it waits for them.
#[test]
fn a_cleanly_stopped_primary_waits_for_no_backup_and_a_killed_one_is_not_started_without_replication() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = ["--commit-policy", "majority-received", "--backups", "1"];
    let pdir = tmp.path().join("primary");
    let port = port_below_the_ephemeral_range().to_string();
    let mut primary = Node::start(&pdir, &[&["--repl-port", &port][..], &policy].concat());
    let repl = primary.repl.clone().unwrap();
    let repl_port = repl.rsplit(':').next().unwrap().to_string();
    let named = ["--replica-of", &repl, "--replica-name", "b1"];
    let mut backup = Node::start(&tmp.path().join("backup"), &named);
    write_keys(primary.port, 0..100);
    let record = || std::fs::read_to_string(pdir.join("quorum")).unwrap();
    assert!(record().contains("backup b1"), "{}", record());
    assert!(stop_with_sigterm(&mut backup.child).success());
    assert!(stop_with_sigterm(&mut primary.child).success());
    assert!(!record().contains("backup b1"), "a clean stop forgets the backups: {}", record());
    let mut primary = Node::start(&pdir, &[&["--repl-port", &repl_port][..], &policy].concat());
    let mut c = Client::connect(primary.port).unwrap();
    assert_eq!(field(&mut c, "replication", "ditto_writes_refused"), None, "waited after a clean stop");
    // Counted again, then killed: started without replication, it is refused.
    let backup = Node::start(&tmp.path().join("backup"), &named);
    let ts = write_keys(primary.port, 100..200).parse().unwrap();
    assert!(record().contains("backup b1"), "{}", record());
    // Durable on the primary too: under `majority-received` the writes are acknowledged
    // once b1 holds them, and a primary killed before its own log write would come back
    // without them, b1 rightly refused as holding more (what this test is not about).
    wait_durable(primary.port, ts);
    drop(backup);
    primary.kill();
    let errs = tmp.path().join("unreplicated.log");
    let (status, err) = Node::run_to_exit(&pdir, &policy, &errs);
    assert!(!status.success(), "started: {err}");
    assert!(err.contains("did not stop cleanly") && err.contains("b1") && err.contains("--repl-port"), "{err}");
    let primary = Node::start(&pdir, &[&["--repl-port", &repl_port][..], &policy].concat());
    let mut c = Client::connect(primary.port).unwrap();
    let refused = c.one(&["SET", "k", "v"]);
    assert!(refused.contains("until 1 more of the backups its quorum counted (b1)"), "{refused}");
    // The refused start had begun an epoch from the point: the restart that waits knows
    // the backup's older epoch all the same, and takes writes once b1 says what it holds.
    // (Before 2026-12-02 the refused start's restart was not recorded, and b1 was refused
    // for good as holding more.)
    let _backup = Node::start(&tmp.path().join("backup"), &named);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.one(&["SET", "k", "v"]);
        if r == "+OK" {
            break;
        }
        assert!(Instant::now() < deadline, "writes still refused with b1 back: {r}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client of the server on `port`, trying again for up to `limit`: a backup that joins
/// its restarted primary again in the same process swaps its role once it holds what the
/// primary sends (the writes the test waited for may be acknowledged just before), and its
/// client port refuses connections during the swap (docs/replication.md: the old engine's
/// connections close at the swap).
fn connect_within(port: u16, limit: Duration) -> Client {
    let t = Instant::now() + limit;
    loop {
        match Client::connect(port) {
            Ok(c) => return c,
            Err(e) if Instant::now() > t => panic!("the backup's port stayed closed: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
