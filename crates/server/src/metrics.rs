//! Prometheus metrics endpoint
//! ===========================
//! `GET /metrics` on its own listener (loopback by default) answers the text exposition
//! format: command, transaction, conflict and error counters, a command latency histogram
//! (request parsed to reply written, durability wait included), the same histogram and
//! call, rejection and failure counters per command, and the log's bytes, fsync count and
//! fsync time, and replication's positions, lags and freshness per backup
//! (replinfo.rs). Any other path is a 404; requests are bounded to 8 KiB.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::commands::SPECS;
use crate::session::Shared;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] =
    [0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// The bucket of `d`: the first whose bound it does not exceed, else +Inf.
fn bucket(d: Duration) -> usize {
    let s = d.as_secs_f64();
    BUCKETS.iter().position(|&b| s <= b).unwrap_or(BUCKETS.len())
}

/// A cumulative histogram of durations, lock-free to record.
#[derive(Default)]
pub struct Histogram {
    /// Non-cumulative counts per bucket; the last slot is +Inf.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records `d`, whose bucket (`bucket(d)`) the caller found once for all the
    /// histograms it records in.
    fn record_in(&self, bucket: usize, d: Duration) {
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }
}

/// The series of the sum of `shards` (one histogram kept per thread); `labels` is empty or
/// `key="value",` pairs ending in a comma. The family's HELP and TYPE lines are the
/// caller's. Writes nothing when every shard is empty and `skip_empty`.
fn write_series<'a>(
    shards: impl Iterator<Item = &'a Histogram>,
    name: &str,
    labels: &str,
    skip_empty: bool,
    out: &mut String,
) {
    let mut counts = [0u64; BUCKETS.len() + 1];
    let mut sum_ns = 0u64;
    for h in shards {
        for (c, a) in counts.iter_mut().zip(&h.counts) {
            *c += a.load(Ordering::Relaxed);
        }
        sum_ns += h.sum_ns.load(Ordering::Relaxed);
    }
    if skip_empty && counts.iter().all(|&c| c == 0) {
        return;
    }
    let mut cum = 0;
    for (i, c) in counts.iter().enumerate() {
        cum += c;
        let le = BUCKETS.get(i).map_or("+Inf".to_string(), |b| b.to_string());
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{le}\"}} {cum}");
    }
    let braces = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.trim_end_matches(',')) };
    let _ = writeln!(out, "{name}_sum{braces} {}", sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count{braces} {cum}");
}

/// Command latencies, one shard per server thread (see `Stats::per_command` for why).
pub struct Metrics {
    /// Per shard: every command.
    latency: Box<[Histogram]>,
    /// Per shard, then per command indexed like `commands::SPECS`.
    per_command: Box<[Box<[Histogram]>]>,
}

impl Metrics {
    pub fn new(shards: usize) -> Metrics {
        let shards = shards.max(1);
        Metrics {
            latency: (0..shards).map(|_| Histogram::default()).collect(),
            per_command: (0..shards).map(|_| SPECS.iter().map(|_| Histogram::default()).collect()).collect(),
        }
    }

    /// Records one command's latency (request parsed to reply written) in `shard`.
    pub fn record(&self, shard: usize, cmd: Option<usize>, d: Duration) {
        let (shard, b) = (shard % self.latency.len(), bucket(d));
        self.latency[shard].record_in(b, d);
        if let Some(h) = cmd.and_then(|i| self.per_command[shard].get(i)) {
            h.record_in(b, d);
        }
    }
}

/// The exposition text.
pub fn render(sh: &Shared, m: &Metrics) -> String {
    let mut out = String::new();
    let st = &sh.stats;
    let mut counter = |name: &str, help: &str, v: u64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
    };
    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
    counter("ditto_commands_total", "Commands handled.", r(&st.commands));
    counter("ditto_transactions_total", "Engine transactions committed by commands.", r(&st.txn_commits));
    counter(
        "ditto_transaction_conflicts_total",
        "Transaction attempts aborted by a conflict and retried.",
        r(&st.txn_conflicts),
    );
    counter("ditto_error_replies_total", "Error replies sent.", r(&st.errors));
    counter("ditto_protocol_errors_total", "Connections closed for a malformed request.", r(&st.protocol_errors));
    counter("ditto_connections_total", "Connections accepted.", r(&st.connections_received));
    counter("ditto_rejected_connections_total", "Connections refused at max_clients.", r(&st.rejected_connections));
    counter(
        "ditto_tls_handshake_failures_total",
        "TLS connections closed before their handshake completed.",
        r(&st.tls_handshake_failures),
    );
    counter(
        "ditto_oom_rejections_total",
        "Commands refused with OOM while the memory in use was over maxmemory.",
        r(&sh.memory.rejections),
    );
    if let Some(l) = &sh.log {
        counter("ditto_log_bytes_total", "Bytes written to the redo log.", r(&l.stats.bytes_written));
        counter("ditto_log_fsyncs_total", "Log fsyncs.", r(&l.stats.fsyncs));
        counter(
            "ditto_log_heartbeats_total",
            "Log batches without transactions, written only to move the durable watermark.",
            r(&l.stats.heartbeats),
        );
        counter(
            "ditto_log_vouches_total",
            "Empty log batches written by a quiet or closing stream to vouch for its last synced write.",
            r(&l.stats.vouches),
        );
        counter("ditto_log_transactions_total", "Transactions written to the log.", r(&l.stats.txns));
        counter("ditto_checkpoints_total", "Online checkpoints completed.", r(&l.stats.checkpoints));
        counter(
            "ditto_checkpoint_failures_total",
            "Online checkpoints that failed (the previous one and the log still hold everything).",
            r(&l.stats.checkpoint_failures),
        );
        counter(
            "ditto_log_segment_delete_failures_total",
            "Covered log segments a checkpoint failed to delete (the next checkpoint tries again).",
            r(&l.stats.segment_delete_failures),
        );
        let _ = writeln!(
            out,
            "# HELP ditto_checkpoints_triggered_total Background checkpoints completed, by the trigger that \
             started them.\n# TYPE ditto_checkpoints_triggered_total counter"
        );
        for (trigger, n) in [
            ("time", &l.stats.checkpoints_by_time),
            ("log_growth", &l.stats.checkpoints_by_log_growth),
            ("id_reuse", &l.stats.checkpoints_by_id_reuse),
        ] {
            let _ = writeln!(out, "ditto_checkpoints_triggered_total{{trigger=\"{trigger}\"}} {}", r(n));
        }
        let _ = writeln!(
            out,
            "# HELP ditto_log_fsync_seconds_total Time spent in log fsyncs.\n# TYPE ditto_log_fsync_seconds_total counter\n\
             ditto_log_fsync_seconds_total {}\n# HELP ditto_checkpoint_cpu_seconds_total CPU time online checkpoints took to write, over their threads.\n\
             # TYPE ditto_checkpoint_cpu_seconds_total counter\nditto_checkpoint_cpu_seconds_total {}\n\
             # HELP ditto_log_fsync_seconds_max The slowest log fsync.\n\
             # TYPE ditto_log_fsync_seconds_max gauge\nditto_log_fsync_seconds_max {}\n\
             # HELP ditto_durable_ts Every commit at or below this timestamp is durable.\n# TYPE ditto_durable_ts gauge\n\
             ditto_durable_ts {}\n# HELP ditto_log_failed 1 once the log failed and writes stopped.\n\
             # TYPE ditto_log_failed gauge\nditto_log_failed {}",
            r(&l.stats.fsync_ns_total) as f64 / 1e9,
            r(&l.stats.checkpoint_cpu_ns) as f64 / 1e9,
            r(&l.stats.fsync_ns_max) as f64 / 1e9,
            l.watermark().0,
            l.failure().is_some() as u8,
        );
    }
    crate::replinfo::prometheus(sh, &mut out);
    let _ = writeln!(
        out,
        "# HELP ditto_connected_clients Open client connections.\n# TYPE ditto_connected_clients gauge\nditto_connected_clients {}",
        st.connected_clients.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP ditto_used_memory_bytes Bytes allocated and not freed (the maxmemory gauge).\n\
         # TYPE ditto_used_memory_bytes gauge\nditto_used_memory_bytes {}\n\
         # HELP ditto_maxmemory_bytes The maxmemory limit (0: none).\n# TYPE ditto_maxmemory_bytes gauge\n\
         ditto_maxmemory_bytes {}",
        (sh.memory.used)(),
        sh.memory.max
    );
    use ditto_log::sched::{commit_thread_slice, link_slice_counts, link_thread_slice, slice_counts};
    for (class, threads, what, slice, counts) in [
        ("commit", "Commit-path threads", "the commit path's threads", commit_thread_slice(), slice_counts()),
        (
            "link",
            "Link and ack-reader threads",
            "a primary's replication links and ack readers",
            link_thread_slice(),
            link_slice_counts(),
        ),
    ] {
        let m = format!("ditto_{class}_thread_slice");
        let _ = writeln!(
            out,
            "# HELP {m}_seconds The time slice {what} ask for (0: the kernel's default).\n\
             # TYPE {m}_seconds gauge\n{m}_seconds {}\n\
             # HELP {m}_threads {threads} by what became of their request: given, ignored (a kernel before 6.12), refused.\n\
             # TYPE {m}_threads gauge\n\
             {m}_threads{{outcome=\"given\"}} {}\n\
             {m}_threads{{outcome=\"ignored\"}} {}\n\
             {m}_threads{{outcome=\"refused\"}} {}",
            slice.map_or(0.0, |s| s.as_secs_f64()),
            counts.given,
            counts.ignored,
            counts.refused,
        );
    }
    let name = "ditto_command_latency_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} From a request parsed to its reply written, durability wait included.\n# TYPE {name} histogram"
    );
    write_series(m.latency.iter(), name, "", false, &mut out);
    let name = "ditto_command_latency_by_command_seconds";
    let _ = writeln!(out, "# HELP {name} The same, per command (those seen so far).\n# TYPE {name} histogram");
    for (i, spec) in SPECS.iter().enumerate() {
        let label = format!("cmd=\"{}\",", spec.name.to_ascii_lowercase());
        write_series(m.per_command.iter().map(|shard| &shard[i]), name, &label, true, &mut out);
    }
    let per_cmd = [
        ("ditto_command_calls_total", "Calls per command (refused ones not included)."),
        ("ditto_command_rejected_total", "Commands refused before running (arity, NOAUTH, READONLY)."),
        ("ditto_command_failed_total", "Commands that ran and answered an error."),
    ];
    for (k, (name, help)) in per_cmd.iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (i, spec) in SPECS.iter().enumerate() {
            let [calls, _, rejected, failed] = st.command_totals(i);
            if calls + rejected > 0 {
                let v = [calls, rejected, failed][k];
                let _ = writeln!(out, "{name}{{cmd=\"{}\"}} {v}", spec.name.to_ascii_lowercase());
            }
        }
    }
    out
}

/// The most scrapes answered at once; a connection past them is closed at once. Each holds
/// a file descriptor for up to `SCRAPE_TIME_MAX`, in the process that serves Redis clients:
/// unbounded, 1,500 idle connections to this port under a limit of 200 descriptors made
/// every accept fail, Redis clients' too (a SET waited 5 s; found by a review, 2026-12-06).
pub const SCRAPES_MAX: usize = 16;
/// A scrape is read, answered and closed within this, or dropped.
const SCRAPE_TIME_MAX: Duration = Duration::from_secs(5);
/// The longest request head read.
const SCRAPE_HEAD_MAX: usize = 8192;

/// Answers scrapes on `listener` from the server state `current` gives (the role that
/// serves now, for a server that changes its role in place; 503 while it gives none), at
/// most `SCRAPES_MAX` at once.
pub async fn serve(listener: TcpListener, current: impl Fn() -> Option<Arc<Shared>>, m: Arc<Metrics>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(SCRAPES_MAX));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // (Dropped: closed at once, no task and no descriptor kept for it.)
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else { continue };
        let sh = current();
        let m = Arc::clone(&m);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(SCRAPE_TIME_MAX, answer(stream, sh.as_deref(), &m)).await;
            drop(permit);
        });
    }
}

async fn answer(mut s: TcpStream, sh: Option<&Shared>, m: &Metrics) -> std::io::Result<()> {
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let ended = |r: &[u8]| r.windows(4).any(|w| w == b"\r\n\r\n") || r.windows(2).any(|w| w == b"\n\n");
    let too_long = loop {
        if ended(&req) {
            break false;
        }
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if req.len() + n > SCRAPE_HEAD_MAX {
            break true;
        }
        req.extend_from_slice(&buf[..n]);
    };
    let get = req.starts_with(b"GET ");
    let head_only = req.starts_with(b"HEAD ");
    let path = req.split(|&b| b == b' ').nth(1).unwrap_or_default();
    let metrics = path == b"/metrics" || path.starts_with(b"/metrics?");
    let (status, body, exposition) = match (too_long, get || head_only, metrics, sh) {
        (true, ..) => ("431 Request Header Fields Too Large", "request head over 8 KiB\n".to_string(), false),
        (_, false, ..) => ("405 Method Not Allowed", "GET /metrics only\n".to_string(), false),
        (_, _, false, _) => ("404 Not Found", "not found\n".to_string(), false),
        (_, _, _, None) => ("503 Service Unavailable", "the server is changing its role\n".to_string(), false),
        (_, _, _, Some(sh)) => ("200 OK", render(sh, m), true),
    };
    let kind = if exposition { "text/plain; version=0.0.4" } else { "text/plain" };
    let allow = if status.starts_with("405") { "Allow: GET, HEAD\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n{allow}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    if !head_only {
        s.write_all(body.as_bytes()).await?;
    }
    s.shutdown().await?;
    if too_long {
        // The rest of what it sent read and let go (within the scrape's time), so that the
        // close does not reset the connection under the answer before the client reads it.
        let mut left: usize = 64 << 10;
        while left > 0 {
            match s.read(&mut buf).await? {
                0 => break,
                n => left = left.saturating_sub(n),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::lookup_index;
    use ditto_engine::{Database, Options};

    /// The exposition text over a real socket: per-command series for the commands seen,
    /// histograms cumulative and ending in +Inf = count; other paths are 404.
    #[test]
    fn the_endpoint_serves_per_command_series() {
        let db = Database::new(Options { workers: 1 });
        let sh = Arc::new(Shared::new(db, None, None, 0).unwrap());
        let m = Arc::new(Metrics::new(2));
        let get = lookup_index(b"GET").unwrap();
        // Two shards (server threads): the endpoint shows their sums.
        m.record(0, Some(get), Duration::from_micros(30));
        m.record(1, Some(get), Duration::from_millis(3));
        m.record(1, None, Duration::from_micros(30));
        sh.stats.command(0, get).calls.fetch_add(2, Ordering::Relaxed);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let fetch = |path: &'static str| {
            let (sh, m) = (Arc::clone(&sh), Arc::clone(&m));
            rt.block_on(async move {
                let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = l.local_addr().unwrap();
                tokio::spawn(serve(l, move || Some(Arc::clone(&sh)), m));
                let mut c = TcpStream::connect(addr).await.unwrap();
                c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
                let mut body = String::new();
                tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut body)).await.unwrap().unwrap();
                body
            })
        };
        let text = fetch("/metrics");
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        let series = |prefix: &str| -> Vec<u64> {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
                .collect()
        };
        let all = series("ditto_command_latency_seconds_bucket{le=");
        let by_get = series("ditto_command_latency_by_command_seconds_bucket{cmd=\"get\",le=");
        assert_eq!((all.len(), by_get.len()), (BUCKETS.len() + 1, BUCKETS.len() + 1));
        assert!(all.windows(2).all(|w| w[0] <= w[1]) && by_get.windows(2).all(|w| w[0] <= w[1]), "cumulative");
        assert_eq!((all.last(), by_get.last()), (Some(&3), Some(&2)));
        assert_eq!(series("ditto_command_latency_by_command_seconds_count{cmd=\"get\"}"), vec![2]);
        assert_eq!(series("ditto_command_calls_total{cmd=\"get\"}"), vec![2]);
        assert!(!text.contains("cmd=\"set\""), "only commands seen");
        // No slice set in this process (a server sets it from its config): 0, and no thread.
        for class in ["commit", "link"] {
            assert!(text.contains(&format!("\nditto_{class}_thread_slice_seconds 0\n")), "{text}");
            for outcome in ["given", "ignored", "refused"] {
                let threads = series(&format!("ditto_{class}_thread_slice_threads{{outcome=\"{outcome}\"}}"));
                assert_eq!(threads, vec![0]);
            }
        }
        assert!(fetch("/other").starts_with("HTTP/1.1 404"));
    }

    /// At most `SCRAPES_MAX` scrapes are held at once: past them a connection is closed at
    /// once (before, each was held up to 5 s, and enough of them used up the process's file
    /// descriptors, Redis clients' accepts failing with them); the held ones answered or
    /// gone, a scrape is answered again. Methods other than GET and HEAD get 405, HEAD no
    /// body, a head over 8 KiB 431, and no serving role 503.
    #[test]
    fn scrapes_are_bounded_and_odd_requests_answered() {
        let db = Database::new(Options { workers: 1 });
        let sh = Arc::new(Shared::new(db, None, None, 0).unwrap());
        let m = Arc::new(Metrics::new(1));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let ask = |addr: std::net::SocketAddr, req: Vec<u8>| async move {
                let mut c = TcpStream::connect(addr).await.unwrap();
                c.write_all(&req).await.unwrap();
                let mut out = Vec::new();
                // (A connection closed with the request unread may be reset: closed all the same.)
                match tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await.unwrap() {
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => assert!(out.is_empty(), "{e}"),
                    r => drop(r.unwrap()),
                }
                String::from_utf8_lossy(&out).into_owned()
            };
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let serving = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let s2 = Arc::clone(&serving);
            let sh2 = Arc::clone(&sh);
            tokio::spawn(serve(l, move || s2.load(Ordering::Relaxed).then(|| Arc::clone(&sh2)), m));
            // Idle connections hold every scrape's place.
            let mut idle = Vec::new();
            for _ in 0..SCRAPES_MAX {
                let mut c = TcpStream::connect(addr).await.unwrap();
                c.write_all(b"GET /metr").await.unwrap();
                idle.push(c);
            }
            // (Let the server take them all.)
            tokio::time::sleep(Duration::from_millis(200)).await;
            let t0 = std::time::Instant::now();
            let past = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n".to_vec()).await;
            assert_eq!(past, "", "a scrape past the bound is closed unanswered");
            assert!(t0.elapsed() < Duration::from_secs(4), "closed at once, not held: {:?}", t0.elapsed());
            drop(idle);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let got = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n".to_vec()).await;
                if got.starts_with("HTTP/1.1 200 OK") {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "never answered again: {got:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let post = ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n".to_vec()).await;
            assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD"), "{post}");
            let head = ask(addr, b"HEAD /metrics HTTP/1.0\n\n".to_vec()).await;
            assert!(head.starts_with("HTTP/1.1 200 OK") && head.ends_with("\r\n\r\n"), "{head}");
            let long = ask(addr, [&b"GET /metrics HTTP/1.1\r\nX: "[..], &[b'a'; 9000]].concat()).await;
            assert!(long.starts_with("HTTP/1.1 431"), "{long}");
            serving.store(false, Ordering::Relaxed);
            let none = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n".to_vec()).await;
            assert!(none.starts_with("HTTP/1.1 503"), "{none}");
        });
    }
}
