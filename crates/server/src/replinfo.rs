//! `INFO replication`, `ditto status` and the metrics' view of replication: positions,
//! lag in timestamps and milliseconds, and Query Fresh's freshness score, with Redis's
//! field names where they fit (role, connected_slaves, slaveN, master_host, master_link_status).

use std::sync::atomic::Ordering;

use crate::session::{Replication, Shared};

/// (name, value) pairs of this node's replication state.
pub fn fields(sh: &Shared) -> Vec<(String, String)> {
    let mut f: Vec<(String, String)> = Vec::new();
    let mut put = |k: &str, v: String| f.push((k.to_string(), v));
    match &sh.replication {
        Replication::Standalone => {
            put("role", "master".into());
            put("connected_slaves", "0".into());
        }
        Replication::Primary { primary, policy, repl_addr } => {
            let backups = primary.backups();
            let h = primary.holdings();
            put("role", "master".into());
            put("ditto_repl_addr", repl_addr.clone());
            put("ditto_commit_policy", policy.name());
            put("ditto_epoch", primary.epoch().0.to_string());
            put("ditto_durable_ts", h.primary_durable.0.to_string());
            put("ditto_shipped_ts", h.primary_shipped.0.to_string());
            put("ditto_released_ts", primary.released().0.to_string());
            if let Some(why) = ditto_replication::blocked_by(*policy, &h) {
                put("ditto_release_blocked", why);
            }
            put("connected_slaves", backups.len().to_string());
            let now = sh.db.clock().now().0;
            for (i, b) in backups.iter().enumerate() {
                put(
                    &format!("slave{i}"),
                    format!(
                        "node={},addr={},state=online,received_ts={},durable_ts={},replayed_ts={},lag_ts={},queued_bytes={}",
                        b.node,
                        b.addr,
                        b.received.0,
                        b.durable.0,
                        b.replayed.0,
                        now.saturating_sub(b.replayed.0),
                        b.queued_bytes
                    ),
                );
            }
            put("ditto_batches_shipped", primary.batches_shipped.load(Ordering::Relaxed).to_string());
            put("ditto_backups_dropped", primary.backups_dropped.load(Ordering::Relaxed).to_string());
        }
        Replication::Backup { state, primary } => {
            let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Acquire);
            let (received, visible) = (ld(&state.received), ld(&state.visible));
            put("role", "slave".into());
            let (host, port) = primary.rsplit_once(':').unwrap_or((primary.as_str(), "0"));
            put("master_host", host.into());
            put("master_port", port.into());
            let up = state.connected.load(Ordering::Acquire) && state.failure.lock().is_none();
            put("master_link_status", if up { "up" } else { "down" }.into());
            put("ditto_received_ts", received.to_string());
            put("ditto_durable_ts", ld(&state.durable).to_string());
            put("ditto_replayed_ts", ld(&state.replayed).to_string());
            put("ditto_released_ts", ld(&state.released).to_string());
            put("ditto_visible_ts", visible.to_string());
            put("ditto_lag_ts", received.saturating_sub(visible).to_string());
            put("ditto_batches_received", ld(&state.batches_received).to_string());
            put("ditto_batches_skipped", ld(&state.batches_skipped).to_string());
            put("ditto_txns_replayed", ld(&state.txns_replayed).to_string());
            put("ditto_bytes_received", ld(&state.bytes_received).to_string());
            put("ditto_reconnects", ld(&state.reconnects).to_string());
            put("ditto_replay_cpu_ms", (ld(&state.replay_cpu_ns) / 1_000_000).to_string());
            if let Some(why) = state.failure.lock().clone() {
                put("ditto_failure", why.replace(['\r', '\n'], " "));
            }
        }
    }
    f
}

/// The `# Replication` section of INFO.
pub fn section(sh: &Shared) -> String {
    let mut s = String::from("# Replication\r\n");
    for (k, v) in fields(sh) {
        s.push_str(&k);
        s.push(':');
        s.push_str(&v);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s
}
