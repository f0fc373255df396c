//! A panic inside a commit's critical section (its record locks held, its timestamp not yet
//! visible) stops the process, saying why, instead of stalling the database: the
//! transaction's clean-up spun on a record lock its own thread held, and a commit slot left
//! busy would have frozen every snapshot. Run in a child process (this test binary again),
//! since the point is that the process aborts.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{CommitLog, Database, LoggedWrite, Options, Result, TableId, Ts, WorkerId};

/// A commit log whose append panics: a bug in the log.
struct PanicsOnAppend;

impl CommitLog for PanicsOnAppend {
    fn check_writable(&self) -> Result<()> {
        Ok(())
    }
    fn append(&self, _: WorkerId, _: Ts, _: &mut dyn ExactSizeIterator<Item = LoggedWrite<'_>>) {
        panic!("a commit log's bug");
    }
    fn wait_durable(&self, _: Ts) -> Result<()> {
        Ok(())
    }
    fn is_durable(&self, _: Ts) -> Result<bool> {
        Ok(true)
    }
    fn table_created(&self, _: TableId, _: &str) -> Result<()> {
        Ok(())
    }
}

const CHILD: &str = "DITTO_COMMIT_PANIC_CHILD";
const NAME: &str = "a_panic_inside_a_commits_critical_section_stops_the_process";

#[test]
fn a_panic_inside_a_commits_critical_section_stops_the_process() {
    if std::env::var_os(CHILD).is_some() {
        let db = Database::new(Options { workers: 1 });
        db.attach_log(Arc::new(PanicsOnAppend));
        let t = db.create_table("t").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        // An insert: its clean-up would unlink the record it created.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run(|x| x.put(t, b"k", b"v"))));
        println!("the process went on after the panic");
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child hung after the panic (the database stalled)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.signal(), Some(libc_sigabrt()), "{status:?}\nstdout: {out}\nstderr: {err}");
    assert!(err.contains("a commit log's bug") && err.contains("aborting the process"), "stderr: {err}");
    assert!(!out.contains("went on"), "stdout: {out}");
}

/// SIGABRT's number on Linux.
fn libc_sigabrt() -> i32 {
    6
}
