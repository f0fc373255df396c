//! The benchmark harness
//! =====================
//! Runs a workload embedded, as Silo and Rolis do: `workers` threads, each owning one engine
//! `Worker`, each running transactions back to back until the deadline (no terminals, no
//! think time).
//!
//! ```text
//!  worker thread i:  loop until deadline {
//!      (type, input) = workload.next()              -- inputs drawn once
//!      start = now
//!      loop { execute(input) }  while Err(Conflict)  -- each conflict counts as an abort
//!      Committed(ticket) -> pending.push_back((ticket, start, type))
//!      retire: pop durable tickets from the front: latency = now - start
//!  }
//!  then wait for every pending ticket (its latency counts)
//! ```
//!
//! Commits count once durable. Throughput is durable commits over the configured duration
//! (the deadline), abort rate is conflicts / (commits + conflicts), and user aborts (TPC-C's
//! 1% NewOrder rollback) are counted apart. CPU time is the process's user+sys time
//! (`getrusage(RUSAGE_SELF)`, so it includes the log's threads) over the run phase; log bytes
//! come from the caller's `Probe`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_engine::{CommitTicket, Database, Error, Ts, Worker, WorkerId};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

/// How a benchmark's run phase is driven.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Worker threads (each takes `db.worker(WorkerId(i))`, so at most `db.workers()`).
    pub workers: usize,
    /// How long the run phase lasts (the measured interval).
    pub duration: Duration,
    /// Worker i seeds its random generator with `seed + i`.
    pub seed: u64,
    /// Show progress bars on the terminal (false in tests).
    pub progress: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig { workers: 1, duration: Duration::from_secs(10), seed: 1, progress: false }
    }
}

/// What the harness can observe outside the engine.
#[derive(Clone, Copy)]
pub struct Probe<'a> {
    /// Total bytes the log has written so far (0 when there is no log).
    pub log_bytes: &'a (dyn Fn() -> u64 + Sync),
    /// Where commits are released by something other than the local log (a primary under
    /// a replicated commit policy): the release watermark. A commit counts, and its
    /// latency ends, once it is at or below it (instead of once locally durable).
    pub released: Option<&'a (dyn Fn() -> Ts + Sync)>,
    /// Called once as the measured run starts (after the load), before any worker.
    pub on_run_start: Option<&'a (dyn Fn() + Sync)>,
    /// Called once as it ends: every worker's last commit counted (the run's duration
    /// ends here), before any check the benchmark makes after it.
    pub on_run_end: Option<&'a (dyn Fn() + Sync)>,
    /// Called on each worker's thread before its first transaction.
    pub on_worker_start: Option<&'a (dyn Fn() + Sync)>,
}

fn no_log_bytes() -> u64 {
    0
}

impl Probe<'static> {
    /// A probe for a database without a log.
    pub const NONE: Probe<'static> =
        Probe { log_bytes: &no_log_bytes, released: None, on_run_start: None, on_run_end: None, on_worker_start: None };
}

/// The result of running one transaction to its end (conflicts are reported as
/// `Err(Error::Conflict(_))` and retried by the harness with the same inputs).
#[derive(Debug)]
pub enum Outcome {
    /// Committed. `Some(ticket)` for a read-write commit (counted once durable); `None` for a
    /// read-only snapshot transaction (counted at once; latency = execution time).
    Committed(Option<CommitTicket>),
    /// The transaction rolled itself back as the workload asks (e.g. TPC-C's 1% of NewOrders
    /// with an unused item id). Not a conflict, not a commit.
    UserAbort,
}

/// A workload as seen by one worker thread. `next` draws a transaction's inputs; `execute`
/// runs it once (it may be called again with the same inputs after a conflict).
pub trait Workload {
    type Input;
    /// The next transaction: its type (index into the run's type names) and inputs.
    fn next(&mut self) -> (usize, Self::Input);
    /// Runs the transaction once, committing with `commit_async` (or on a `ReadTxn`).
    fn execute(&mut self, worker: &mut Worker, input: &Self::Input) -> Result<Outcome, Error>;
    /// Whether transactions of type `ty` only read: they are neither logged nor replayed,
    /// and the harness measures their CPU apart (`Report::worker_read_only_cpu_s`), so a
    /// replay's cost is weighed against the CPU of the transactions it replays.
    fn read_only(&self, _ty: usize) -> bool {
        false
    }
}

/// Per-type results.
#[derive(Serialize, Clone, Debug, Default)]
pub struct TypeReport {
    pub name: String,
    pub committed: u64,
    pub aborts: u64,
    pub user_aborts: u64,
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
}

/// The results of a run, printed as text (`print`) or written as JSON (serde).
#[derive(Serialize, Clone, Debug)]
pub struct Report {
    pub benchmark: String,
    pub workers: usize,
    pub duration_s: f64,
    /// Durable commits (read-only transactions included).
    pub committed: u64,
    /// OCC conflicts (each retried attempt counts once).
    pub aborts: u64,
    /// Rollbacks the workload asked for (TPC-C NewOrder's 1%).
    pub user_aborts: u64,
    pub throughput_tps: f64,
    /// aborts / (committed + aborts).
    pub abort_rate: f64,
    /// From a transaction's first attempt until its commit is durable.
    pub latency_us_p50: u64,
    pub latency_us_p99: u64,
    pub latency_us_max: u64,
    /// Bytes the log wrote during the run phase (0 without a log).
    pub log_bytes: u64,
    /// log_bytes / committed.
    pub log_bytes_per_txn: f64,
    /// Process CPU time (user + sys, all threads) over the run phase / committed.
    pub cpu_s_per_txn: f64,
    /// The worker threads' own CPU time over the run phase (the transactions, their
    /// retries, the harness's loop; not the log's or the shipping threads'), in all.
    #[serde(default)]
    pub worker_cpu_s: f64,
    /// Of `worker_cpu_s`, what the read-only transactions took (`Workload::read_only`).
    #[serde(default)]
    pub worker_read_only_cpu_s: f64,
    /// Of `committed`, the read-only ones (committed on a snapshot: neither logged nor
    /// replayed).
    #[serde(default)]
    pub read_only_committed: u64,
    pub per_type: Vec<TypeReport>,
    /// Workload parameters.
    pub extra: serde_json::Value,
}

impl Report {
    /// A readable, aligned text summary on stdout.
    pub fn print(&self) {
        print!("{}", self.to_text());
    }

    /// The text `print` writes.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let row = |s: &mut String, k: &str, v: String| {
            let _ = writeln!(s, "  {k:<20} {v}");
        };
        let _ = writeln!(s, "{} ({} workers, {:.2} s)", self.benchmark, self.workers, self.duration_s);
        row(&mut s, "committed", format!("{}", self.committed));
        row(&mut s, "throughput", format!("{:.0} txn/s ({:.0} per worker)", self.throughput_tps, self.per_worker()));
        row(&mut s, "aborts (conflicts)", format!("{} (abort rate {:.3}%)", self.aborts, self.abort_rate * 100.0));
        row(&mut s, "user aborts", format!("{}", self.user_aborts));
        row(
            &mut s,
            "latency",
            format!("p50 {} us, p99 {} us, max {} us", self.latency_us_p50, self.latency_us_p99, self.latency_us_max),
        );
        row(&mut s, "log", format!("{} bytes ({:.1} bytes/txn)", self.log_bytes, self.log_bytes_per_txn));
        row(&mut s, "cpu", format!("{:.2} us/txn", self.cpu_s_per_txn * 1e6));
        if !self.per_type.is_empty() {
            let w = self.per_type.iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
            let _ = writeln!(
                s,
                "  {:<w$}  {:>12} {:>10} {:>10} {:>9} {:>9}",
                "type", "committed", "aborts", "user_abrt", "p50_us", "p99_us"
            );
            for t in &self.per_type {
                let _ = writeln!(
                    s,
                    "  {:<w$}  {:>12} {:>10} {:>10} {:>9} {:>9}",
                    t.name, t.committed, t.aborts, t.user_aborts, t.latency_us_p50, t.latency_us_p99
                );
            }
        }
        if !self.extra.is_null() {
            let _ = writeln!(s, "  {:<20} {}", "parameters", self.extra);
        }
        s
    }

    fn per_worker(&self) -> f64 {
        self.throughput_tps / self.workers.max(1) as f64
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }
}

/// The calling thread's CPU time (user + sys), in ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the struct we pass.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
}

/// A progress bar for a load phase of `len` rows (hidden when `show` is false). Loaders
/// call `inc` once per committed chunk.
pub fn load_progress(len: u64, what: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr_with_hz(5));
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:>12} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} rows ({per_sec})",
        )
        .expect("valid template"),
    );
    pb.set_message(what.to_string());
    pb
}

const LATENCY_MAX_US: u64 = 60_000_000;
/// Most commits a worker leaves waiting for durability before it waits on the oldest.
const PENDING_MAX: usize = 10_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("valid histogram bounds")
}

#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicU64);

struct WorkerStats {
    committed: Vec<u64>,
    aborts: Vec<u64>,
    user_aborts: Vec<u64>,
    latency: Vec<Histogram<u64>>,
    /// The thread's CPU over its loop, and of it the read-only transactions', in ns.
    cpu_ns: u64,
    read_only_cpu_ns: u64,
    read_only_commits: u64,
}

impl WorkerStats {
    fn new(types: usize) -> WorkerStats {
        WorkerStats {
            committed: vec![0; types],
            aborts: vec![0; types],
            user_aborts: vec![0; types],
            latency: (0..types).map(|_| histogram()).collect(),
            cpu_ns: 0,
            read_only_cpu_ns: 0,
            read_only_commits: 0,
        }
    }

    fn record(&mut self, ty: usize, start: Instant, now: Instant) {
        let us = now.saturating_duration_since(start).as_micros().min(u64::MAX as u128) as u64;
        self.latency[ty].saturating_record(us.max(1));
        self.committed[ty] += 1;
    }
}

/// Runs a workload: `make(i)` builds worker i's workload state (on worker i's thread).
///
/// `types` names the transaction types (`Workload::next` returns indices into it);
/// `extra` is stored in the report as the workload's parameters.
pub fn run_workload<W, F>(
    db: &Arc<Database>,
    benchmark: &str,
    types: &[&str],
    cfg: &RunConfig,
    probe: &Probe<'_>,
    extra: serde_json::Value,
    make: F,
) -> Result<Report, Error>
where
    W: Workload,
    F: Fn(usize) -> W + Sync,
{
    assert!(cfg.workers >= 1, "at least one worker");
    assert!(
        cfg.workers <= db.workers(),
        "{} workers asked for, the database has {} worker slots",
        cfg.workers,
        db.workers()
    );
    let ntypes = types.len();
    let stop = AtomicBool::new(false);
    let finished = AtomicBool::new(false);
    let progress: Vec<Padded> = (0..cfg.workers).map(|_| Padded::default()).collect();
    if let Some(f) = probe.on_run_start {
        f();
    }
    let log_before = (probe.log_bytes)();
    let cpu_before = cpu_seconds();
    let start = Instant::now();
    let deadline = start + cfg.duration;

    let (results, ended): (Vec<Result<WorkerStats, Error>>, Instant) = std::thread::scope(|s| {
        let monitor = cfg.progress.then(|| {
            let (progress, finished) = (&progress, &finished);
            s.spawn(move || monitor(cfg, benchmark, start, progress, finished))
        });
        let handles: Vec<_> = (0..cfg.workers)
            .map(|i| {
                let (make, stop, progress) = (&make, &stop, &progress[i].0);
                std::thread::Builder::new()
                    .name(format!("{benchmark}-{i}"))
                    .spawn_scoped(s, move || {
                        let mut worker = db.worker(WorkerId(i as u32)).unwrap_or_else(|| panic!("worker {i} is taken"));
                        let mut wl = make(i);
                        if let Some(f) = probe.on_worker_start {
                            f();
                        }
                        let out = worker_loop(&mut worker, &mut wl, ntypes, deadline, stop, progress, probe.released);
                        if out.is_err() {
                            stop.store(true, Ordering::Relaxed);
                        }
                        out
                    })
                    .expect("spawn a worker thread")
            })
            .collect();
        let results = handles.into_iter().map(|h| h.join().expect("worker thread panicked")).collect();
        let ended = Instant::now();
        if let Some(f) = probe.on_run_end {
            f();
        }
        finished.store(true, Ordering::Relaxed);
        if let Some(m) = monitor {
            m.join().expect("monitor thread panicked");
        }
        (results, ended)
    });
    let cpu = cpu_seconds() - cpu_before;
    let log_bytes = (probe.log_bytes)().saturating_sub(log_before);

    let mut total = WorkerStats::new(ntypes);
    for r in results {
        let st = r?;
        for ty in 0..ntypes {
            total.committed[ty] += st.committed[ty];
            total.aborts[ty] += st.aborts[ty];
            total.user_aborts[ty] += st.user_aborts[ty];
            total.latency[ty].add(&st.latency[ty]).expect("histograms with the same bounds");
        }
        total.cpu_ns += st.cpu_ns;
        total.read_only_cpu_ns += st.read_only_cpu_ns;
        total.read_only_commits += st.read_only_commits;
    }
    let mut all = histogram();
    for h in &total.latency {
        all.add(h).expect("histograms with the same bounds");
    }
    let committed: u64 = total.committed.iter().sum();
    let aborts: u64 = total.aborts.iter().sum();
    let user_aborts: u64 = total.user_aborts.iter().sum();
    // From the start until every worker's last commit counted (its drain after the
    // deadline included: the commits it waited for are counted, so is their time).
    let duration_s = ended.duration_since(start).as_secs_f64();
    let per = |x: f64| if committed == 0 { 0.0 } else { x / committed as f64 };
    let pct = |h: &Histogram<u64>, q: f64| if h.is_empty() { 0 } else { h.value_at_quantile(q) };
    Ok(Report {
        benchmark: benchmark.to_string(),
        workers: cfg.workers,
        duration_s,
        committed,
        aborts,
        user_aborts,
        throughput_tps: if duration_s > 0.0 { committed as f64 / duration_s } else { 0.0 },
        abort_rate: if committed + aborts == 0 { 0.0 } else { aborts as f64 / (committed + aborts) as f64 },
        latency_us_p50: pct(&all, 0.5),
        latency_us_p99: pct(&all, 0.99),
        latency_us_max: if all.is_empty() { 0 } else { all.max() },
        log_bytes,
        log_bytes_per_txn: per(log_bytes as f64),
        cpu_s_per_txn: per(cpu),
        worker_cpu_s: total.cpu_ns as f64 / 1e9,
        worker_read_only_cpu_s: total.read_only_cpu_ns as f64 / 1e9,
        read_only_committed: total.read_only_commits,
        per_type: types
            .iter()
            .enumerate()
            .map(|(ty, name)| TypeReport {
                name: name.to_string(),
                committed: total.committed[ty],
                aborts: total.aborts[ty],
                user_aborts: total.user_aborts[ty],
                latency_us_p50: pct(&total.latency[ty], 0.5),
                latency_us_p99: pct(&total.latency[ty], 0.99),
            })
            .collect(),
        extra,
    })
}

fn worker_loop<W: Workload>(
    worker: &mut Worker,
    wl: &mut W,
    ntypes: usize,
    deadline: Instant,
    stop: &AtomicBool,
    progress: &AtomicU64,
    released: Option<&(dyn Fn() -> Ts + Sync)>,
) -> Result<WorkerStats, Error> {
    // Whether a commit counts yet, and waiting until it does.
    let is_done = |t: &CommitTicket| match released {
        Some(r) => Ok(t.ts() <= r()),
        None => t.is_durable(),
    };
    let wait = |t: CommitTicket| -> Result<(), Error> {
        match released {
            Some(r) => {
                while t.ts() > r() {
                    t.is_durable()?; // the log's failure surfaces here
                    std::thread::sleep(Duration::from_micros(50));
                }
                Ok(())
            }
            None => t.wait().map(|_| ()),
        }
    };
    let mut st = WorkerStats::new(ntypes);
    let cpu0 = thread_cpu_ns();
    let mut pending: VecDeque<(CommitTicket, Instant, usize)> = VecDeque::with_capacity(1024);
    let mut done = 0u64;
    'run: while !stop.load(Ordering::Relaxed) {
        let (ty, input) = wl.next();
        let start = Instant::now();
        if start >= deadline {
            break;
        }
        // (Only read-only types are timed apart: the clock is a system call, about 0.5 us,
        // which every transaction would otherwise pay.)
        let ro_cpu0 = wl.read_only(ty).then(thread_cpu_ns);
        loop {
            match wl.execute(worker, &input) {
                Ok(Outcome::Committed(Some(ticket))) => {
                    pending.push_back((ticket, start, ty));
                    break;
                }
                Ok(Outcome::Committed(None)) => {
                    st.read_only_commits += 1;
                    st.record(ty, start, Instant::now());
                    break;
                }
                Ok(Outcome::UserAbort) => {
                    st.user_aborts[ty] += 1;
                    break;
                }
                Err(e) if e.is_retryable() => {
                    st.aborts[ty] += 1;
                    // Past the deadline a transaction that keeps conflicting is given up.
                    if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                        break 'run;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(c0) = ro_cpu0 {
            st.read_only_cpu_ns += thread_cpu_ns().saturating_sub(c0);
        }
        // Retire the commits that became durable, oldest first.
        if !pending.is_empty() {
            let mut now = None;
            while let Some((ticket, _, _)) = pending.front() {
                if !is_done(ticket)? {
                    break;
                }
                let (_, t0, ty) = pending.pop_front().expect("front exists");
                st.record(ty, t0, *now.get_or_insert_with(Instant::now));
            }
            if pending.len() > PENDING_MAX {
                let (ticket, t0, ty) = pending.pop_front().expect("pending is not empty");
                wait(ticket)?;
                st.record(ty, t0, Instant::now());
            }
        }
        let c: u64 = st.committed.iter().sum();
        if c != done {
            done = c;
            progress.store(c, Ordering::Relaxed);
        }
    }
    while let Some((ticket, t0, ty)) = pending.pop_front() {
        wait(ticket)?;
        st.record(ty, t0, Instant::now());
    }
    st.cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
    progress.store(st.committed.iter().sum(), Ordering::Relaxed);
    Ok(st)
}

fn monitor(cfg: &RunConfig, benchmark: &str, start: Instant, progress: &[Padded], finished: &AtomicBool) {
    let total_ms = cfg.duration.as_millis().max(1) as u64;
    let pb = ProgressBar::with_draw_target(Some(total_ms), ProgressDrawTarget::stderr_with_hz(5));
    pb.set_style(
        ProgressStyle::with_template("{prefix:>12} [{elapsed_precise}] {wide_bar} {msg}").expect("valid template"),
    );
    pb.set_prefix(benchmark.to_string());
    let (mut last_n, mut last_t) = (0u64, start);
    while !finished.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        let now = Instant::now();
        let n: u64 = progress.iter().map(|p| p.0.load(Ordering::Relaxed)).sum();
        let dt = now.duration_since(last_t).as_secs_f64();
        let tps = if dt > 0.0 { (n - last_n.min(n)) as f64 / dt } else { 0.0 };
        let overall = n as f64 / now.duration_since(start).as_secs_f64().max(1e-9);
        pb.set_position((now.duration_since(start).as_millis() as u64).min(total_ms));
        pb.set_message(format!("{n} committed, {tps:.0} tps now, {overall:.0} tps overall"));
        (last_n, last_t) = (n, now);
    }
    pb.finish_and_clear();
}
