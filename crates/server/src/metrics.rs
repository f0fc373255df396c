//! Prometheus metrics endpoint
//! ===========================
//! `GET /metrics` on its own listener (loopback by default) answers the text exposition
//! format: command, transaction, conflict and error counters, a command latency histogram
//! (request parsed to reply written, durability wait included), and the log's bytes, fsync
//! count and fsync time. Replication lag and freshness per backup will join here as
//! further series. Any other path is a 404; requests are bounded to 8 KiB.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::session::Shared;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] =
    [0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// A cumulative histogram of durations, lock-free to record.
#[derive(Default)]
pub struct Histogram {
    /// Non-cumulative counts per bucket; the last slot is +Inf.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS.iter().position(|&b| s <= b).unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    fn write(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Ordering::Relaxed);
            let le = BUCKETS.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_sum {}", self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9);
        let _ = writeln!(out, "{name}_count {cum}");
    }
}

#[derive(Default)]
pub struct Metrics {
    pub latency: Histogram,
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
    if let Some(l) = &sh.log {
        counter("ditto_log_bytes_total", "Bytes written to the redo log.", r(&l.stats.bytes_written));
        counter("ditto_log_fsyncs_total", "Log fsyncs.", r(&l.stats.fsyncs));
        counter("ditto_log_transactions_total", "Transactions written to the log.", r(&l.stats.txns));
        let _ = writeln!(
            out,
            "# HELP ditto_log_fsync_seconds_total Time spent in log fsyncs.\n# TYPE ditto_log_fsync_seconds_total counter\n\
             ditto_log_fsync_seconds_total {}\n# HELP ditto_log_fsync_seconds_max The slowest log fsync.\n\
             # TYPE ditto_log_fsync_seconds_max gauge\nditto_log_fsync_seconds_max {}\n\
             # HELP ditto_durable_ts Every commit at or below this timestamp is durable.\n# TYPE ditto_durable_ts gauge\n\
             ditto_durable_ts {}\n# HELP ditto_log_failed 1 once the log failed and writes stopped.\n\
             # TYPE ditto_log_failed gauge\nditto_log_failed {}",
            r(&l.stats.fsync_ns_total) as f64 / 1e9,
            r(&l.stats.fsync_ns_max) as f64 / 1e9,
            l.watermark().0,
            l.failure().is_some() as u8,
        );
    }
    let _ = writeln!(
        out,
        "# HELP ditto_connected_clients Open client connections.\n# TYPE ditto_connected_clients gauge\nditto_connected_clients {}",
        st.connected_clients.load(Ordering::Relaxed)
    );
    m.latency.write(
        "ditto_command_latency_seconds",
        "From a request parsed to its reply written, durability wait included.",
        &mut out,
    );
    out
}

pub async fn serve(listener: TcpListener, sh: Arc<Shared>, m: Arc<Metrics>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let (sh, m) = (Arc::clone(&sh), Arc::clone(&m));
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), answer(stream, &sh, &m)).await;
        });
    }
}

async fn answer(mut s: TcpStream, sh: &Shared, m: &Metrics) -> std::io::Result<()> {
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 || req.len() + n > 8192 {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
    }
    let ok = req.starts_with(b"GET /metrics ") || req.starts_with(b"GET /metrics?");
    let (status, body) = if ok { ("200 OK", render(sh, m)) } else { ("404 Not Found", "not found\n".to_string()) };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}
