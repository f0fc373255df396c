//! `INFO replication`, `ditto status` and the metrics' view of replication: positions,
//! lag in timestamps and milliseconds, and Query Fresh's freshness score, with Redis's
//! field names where they fit (role, connected_slaves, slaveN, master_host, master_link_status).

use std::sync::atomic::Ordering;

use crate::session::{Replication, Shared};

/// Query Fresh's freshness score (section 4.5): the backup's read view over the primary's,
/// in percent, now. Timestamps count commits from the start, so it reads close to 100 on a
/// long-running primary even when the backup lags; the lags in milliseconds say more.
pub fn freshness_pct(backup_view: u64, primary_view: u64) -> f64 {
    if primary_view == 0 {
        return 100.0;
    }
    (backup_view.min(primary_view) as f64 / primary_view as f64) * 100.0
}

/// `host:port` split at its last colon (port "0" when there is none).
pub fn host_port(addr: &str) -> (&str, &str) {
    addr.rsplit_once(':').unwrap_or((addr, "0"))
}

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
            // (The history this node's directory holds: a backup of another is refused.)
            put("ditto_database_id", primary.database().to_string());
            put("ditto_durable_ts", h.primary_durable.0.to_string());
            put("ditto_shipped_ts", h.primary_shipped.0.to_string());
            put("ditto_released_ts", primary.released().0.to_string());
            put("ditto_backups_expected", primary.backups_expected().to_string());
            // Backups alone may release a commit (a policy in use, the server's or a
            // connection's, with the quorum's backups): a backup then keeps what it holds
            // above a restarted primary's point rather than cut it (docs/replication.md).
            put("ditto_backups_release", u8::from(primary.backups_release()).to_string());
            // Writes refused, and why (a restarted primary waiting for its backups, one
            // losing its cluster's quorum, a switchover's drain).
            if let Some(why) = sh.write_gate.refusal() {
                put("ditto_writes_refused", why);
            }
            put("ditto_members_settled", primary.members_settled().map_or("none".into(), |c| c.to_string()));
            if let Some(why) = ditto_replication::blocked_by(*policy, &h) {
                put("ditto_release_blocked", why);
            }
            put("connected_slaves", backups.len().to_string());
            let now = sh.db.clock().now().0;
            let visible = sh.db.clock().visible_ts().0;
            for (i, b) in backups.iter().enumerate() {
                put(
                    &format!("slave{i}"),
                    format!(
                        "node={},addr={},state={},received_ts={},durable_ts={},replayed_ts={},lag_ts={},received_lag_ms={:.3},durable_lag_ms={:.3},replay_lag_ms={:.3},freshness_pct={:.3},queued_bytes={},heard_ms_ago={},lease_ms_ago={}{}{}",
                        b.node,
                        b.addr,
                        b.state,
                        b.received.0,
                        b.durable.0,
                        b.replayed.0,
                        now.saturating_sub(b.replayed.0),
                        b.received_lag.as_secs_f64() * 1e3,
                        b.durable_lag.as_secs_f64() * 1e3,
                        b.replay_lag.as_secs_f64() * 1e3,
                        freshness_pct(b.replayed.0.min(primary.released().0), visible),
                        b.queued_bytes,
                        // (-1: never yet; `Duration::MAX`'s milliseconds, 22 digits, fitted
                        // no client's integer; found by a review, 2026-12-06.)
                        ms_or_never(b.heard_ago),
                        // (How long ago this primary sent the heartbeat its newest ack
                        // echoed: what a cluster primary's lease counts, docs/cluster.md.)
                        ms_or_never(b.lease_ago),
                        // (The learner flag last, as before the copy's fields came.)
                        match b.copy_total_bytes {
                            0 => String::new(),
                            total => format!(",copy_sent_bytes={},copy_total_bytes={total}", b.copy_sent_bytes),
                        },
                        if b.learner { ",learner=1" } else { "" },
                    ),
                );
            }
            put("ditto_batches_shipped", primary.batches_shipped.load(Ordering::Relaxed).to_string());
            put("ditto_frames_sent_directly", primary.frames_sent_directly.load(Ordering::Relaxed).to_string());
            put("ditto_heartbeats_not_shipped", primary.heartbeats_not_shipped.load(Ordering::Relaxed).to_string());
            put("ditto_backups_dropped", primary.backups_dropped.load(Ordering::Relaxed).to_string());
            put("ditto_catch_up_rounds", primary.catch_up_rounds.load(Ordering::Relaxed).to_string());
        }
        Replication::Backup { state, primary } => {
            let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Acquire);
            let (received, visible) = (ld(&state.received), ld(&state.visible));
            put("role", "slave".into());
            let (host, port) = host_port(primary);
            put("master_host", host.into());
            put("master_port", port.into());
            let up = state.link_up();
            put("master_link_status", if up { "up" } else { "down" }.into());
            // A cluster's learner: its primary counts it in no quorum (docs/cluster.md).
            put("ditto_learner", u8::from(state.learner.load(Ordering::Acquire)).to_string());
            if let Some(id) = ditto_replication::identity::DatabaseId::from_wire(ld(&state.database)) {
                put("ditto_database_id", id.to_string());
            }
            put("ditto_received_ts", received.to_string());
            put("ditto_durable_ts", ld(&state.durable).to_string());
            put("ditto_replayed_ts", ld(&state.replayed).to_string());
            put("ditto_released_ts", ld(&state.released).to_string());
            // The primary said it acknowledged up to here, and what this backup received
            // while backups alone could release (its own acknowledgement may have): it
            // keeps both if its restarted primary lacks them (docs/replication.md).
            put("ditto_acknowledged_ts", ld(&state.acknowledged).to_string());
            put("ditto_counted_ts", ld(&state.counted).to_string());
            put("ditto_visible_ts", visible.to_string());
            put("ditto_lag_ts", received.saturating_sub(visible).to_string());
            // Reads held until the primary releases where this run started or was cut
            // (docs/cluster.md): from where, how many waited, the longest wait, and how
            // many were answered LOADING after it.
            put("ditto_reads_held_from_ts", ld(&state.reads_from).to_string());
            put("ditto_reads_waited", ld(&state.reads_waited).to_string());
            put("ditto_reads_waited_ms_max", format!("{:.1}", ld(&state.reads_waited_us_max) as f64 / 1e3));
            put("ditto_reads_refused_loading", ld(&state.reads_refused).to_string());
            put("ditto_batches_received", ld(&state.batches_received).to_string());
            put("ditto_batches_skipped", ld(&state.batches_skipped).to_string());
            // Batches whose records did not parse, refused unacknowledged (a primary's
            // bug: docs/replication.md, "Protocol"), and why the last was while it stands.
            put("ditto_batches_refused", ld(&state.batches_refused).to_string());
            if let Some(why) = state.batch_refused.lock().clone() {
                put("ditto_batch_refused", why.replace(['\r', '\n'], " "));
            }
            put("ditto_replay_queued_bytes", ld(&state.replay_queued_bytes).to_string());
            // Replay held at the release (a cluster's backup): held in memory, held in the
            // replica log alone past `held_in_memory_max`, and read back from it so far.
            put("ditto_replay_held_bytes", ld(&state.held_bytes).to_string());
            put("ditto_replay_held_spilled_batches", ld(&state.held_spilled).to_string());
            put("ditto_replay_held_read_back_batches", ld(&state.held_read_back).to_string());
            // Replay's queues past their bound while a replayer waits for the read view (a
            // standalone backup whose primary's release stalls): in the replica log alone.
            put("ditto_replay_queued_spilled_batches", ld(&state.replay_spilled).to_string());
            put("ditto_replay_queued_read_back_batches", ld(&state.replay_read_back).to_string());
            put("ditto_txns_replayed", ld(&state.txns_replayed).to_string());
            put("ditto_bytes_received", ld(&state.bytes_received).to_string());
            put("ditto_reconnects", ld(&state.reconnects).to_string());
            put("ditto_acks_sent", ld(&state.acks_sent).to_string());
            put("ditto_replay_mode", state.replay_mode.lock().clone());
            put("ditto_replay_cpu_ms", (state.replay_cpu_ns() / 1_000_000).to_string());
            put("ditto_checkpoint_ts", ld(&state.checkpoint_ts).to_string());
            put("ditto_checkpoints", ld(&state.checkpoints).to_string());
            // (-1: nothing heard yet, as the primary says of a backup never heard.)
            put("ditto_heard_ms_ago", state.heard_ago().map_or("-1".into(), |d| d.as_millis().to_string()));
            if let Some(why) = state.failure.lock().clone() {
                put("ditto_failure", why.replace(['\r', '\n'], " "));
            }
            if let Some(why) = state.refused.lock().clone() {
                put("ditto_master_link_refused", why.replace(['\r', '\n'], " "));
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

/// Replication's Prometheus series (metrics.rs): positions, lags and freshness per backup
/// on a primary; positions, link state and reconnects on a backup.
pub fn prometheus(sh: &Shared, out: &mut String) {
    use std::fmt::Write;
    // A family named `..._total` is a counter (a running count, which only grows while the
    // process runs; until 2026-12-06 four were typed gauges, so `rate()` over them was
    // refused by linters and a reset was not taken for one), every other a gauge.
    let mut family = |name: &str, help: &str, series: Vec<(String, String)>| {
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in series {
            let _ = writeln!(out, "{name}{labels} {v}");
        }
    };
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    match &sh.replication {
        Replication::Standalone => {}
        Replication::Primary { primary, .. } => {
            let backups = primary.backups();
            let visible = sh.db.clock().visible_ts().0;
            let released = primary.released().0;
            family("ditto_replication_backups", "Backups connected.", vec![(String::new(), backups.len().to_string())]);
            family(
                "ditto_replication_released_ts",
                "Commits at or below are released.",
                vec![(String::new(), released.to_string())],
            );
            let mut pos = Vec::new();
            let mut lag = Vec::new();
            let mut fresh = Vec::new();
            // One series per backup name: a link of a name that was killed and not yet
            // taken off the list, beside the new link of that name, made each series twice
            // (invalid exposition; found by a review, 2026-12-06). The newest link, listed
            // last, is shown.
            let mut seen = std::collections::HashSet::new();
            let backups: Vec<_> = backups.iter().rev().filter(|b| seen.insert(b.node.clone())).collect();
            for b in backups.into_iter().rev() {
                let n = esc(&b.node);
                for (what, ts, l) in [
                    ("received", b.received, b.received_lag),
                    ("durable", b.durable, b.durable_lag),
                    ("replayed", b.replayed, b.replay_lag),
                ] {
                    pos.push((format!("{{backup=\"{n}\",position=\"{what}\"}}"), ts.0.to_string()));
                    lag.push((format!("{{backup=\"{n}\",position=\"{what}\"}}"), format!("{:.6}", l.as_secs_f64())));
                }
                let f = freshness_pct(b.replayed.0.min(released), visible) / 100.0;
                fresh.push((format!("{{backup=\"{n}\"}}"), format!("{f:.6}")));
            }
            family("ditto_replication_backup_ts", "What each backup acknowledged.", pos);
            family(
                "ditto_replication_lag_seconds",
                "How long the oldest commit shipped and not yet at a backup's position has waited.",
                lag,
            );
            family(
                "ditto_replication_freshness_ratio",
                "A backup's read view over the primary's (Query Fresh).",
                fresh,
            );
        }
        Replication::Backup { state, .. } => {
            let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Acquire).to_string();
            family(
                "ditto_replication_ts",
                "This backup's positions in the primary's timestamps.",
                vec![
                    ("{position=\"received\"}".into(), ld(&state.received)),
                    ("{position=\"durable\"}".into(), ld(&state.durable)),
                    ("{position=\"replayed\"}".into(), ld(&state.replayed)),
                    ("{position=\"released\"}".into(), ld(&state.released)),
                    ("{position=\"visible\"}".into(), ld(&state.visible)),
                ],
            );
            let up = state.link_up();
            family(
                "ditto_replication_link_up",
                "1 while the link to the primary is up.",
                vec![(String::new(), (up as u8).to_string())],
            );
            family(
                "ditto_replication_replay_queued_bytes",
                "Bytes of received batches held in memory for replay (bounded; past the bound receipt waits).",
                vec![(String::new(), ld(&state.replay_queued_bytes))],
            );
            family(
                "ditto_replication_replay_held_bytes",
                "Bytes of batches held at the primary's release kept in memory (bounded; past the bound they are read back from the replica log when released).",
                vec![(String::new(), ld(&state.held_bytes))],
            );
            family(
                "ditto_replication_replay_held_spilled_batches",
                "Batches held at the primary's release that lie in the replica log alone.",
                vec![(String::new(), ld(&state.held_spilled))],
            );
            family(
                "ditto_replication_replay_held_read_back_batches_total",
                "Batches held at the primary's release read back from the replica log since the start.",
                vec![(String::new(), ld(&state.held_read_back))],
            );
            family(
                "ditto_replication_replay_queued_spilled_batches",
                "Batches handed to replay past its bound while a replayer waits for the read view, lying in the replica log alone.",
                vec![(String::new(), ld(&state.replay_spilled))],
            );
            family(
                "ditto_replication_replay_queued_read_back_batches_total",
                "Batches handed to replay past its bound read back from the replica log since the start.",
                vec![(String::new(), ld(&state.replay_read_back))],
            );
            family(
                "ditto_replication_reconnects_total",
                "Times this backup resumed after a dropped link.",
                vec![(String::new(), ld(&state.reconnects))],
            );
        }
    }
    // A cluster node: its supervisor's view (INFO cluster), as numbers.
    let cluster: std::collections::BTreeMap<String, String> = sh.write_gate.cluster_info().into_iter().collect();
    if cluster.is_empty() {
        return;
    }
    let num = |k: &str| cluster.get(k).filter(|v| v.parse::<u64>().is_ok()).cloned();
    for (name, key, help) in [
        ("ditto_cluster_epoch", "cluster_epoch", "The newest epoch begun."),
        ("ditto_cluster_raft_term", "cluster_raft_term", "The control plane's Raft term."),
        ("ditto_cluster_failovers_total", "cluster_failovers", "Epochs opened after the first (failovers)."),
        ("ditto_cluster_config", "cluster_config", "The membership configuration (one more at every change)."),
    ] {
        if let Some(v) = num(key) {
            family(name, help, vec![(String::new(), v)]);
        }
    }
    let primary = cluster.get("cluster_primary") == cluster.get("cluster_node_id");
    family(
        "ditto_cluster_is_primary",
        "1 on the node the control plane names primary.",
        vec![(String::new(), u8::from(primary).to_string())],
    );
    family(
        "ditto_cluster_writes_refused",
        "1 while this node's server refuses writes (a primary without quorum contact, or draining for a switchover).",
        vec![(String::new(), u8::from(sh.write_gate.refusal().is_some()).to_string())],
    );
    family(
        "ditto_cluster_switchover_pending",
        "1 while a switchover is asked for and its failover has not begun (its primary drains).",
        vec![(String::new(), u8::from(cluster.get("cluster_switchover").is_some_and(|v| v != "none")).to_string())],
    );
    let voters = cluster.get("cluster_voters").map_or(0, |v| v.split(',').filter(|x| !x.is_empty()).count());
    family(
        "ditto_cluster_voters",
        "Voters of the control plane's Raft group.",
        vec![(String::new(), voters.to_string())],
    );
    let (mut took, mut lost, mut discarded, mut phases) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (k, v) in cluster.iter().filter(|(k, _)| k.starts_with("cluster_failover_")) {
        let epoch = esc(k.trim_start_matches("cluster_failover_"));
        let field = |f: &str| v.split(',').find_map(|p| p.strip_prefix(f)?.strip_prefix('=')?.parse::<u64>().ok());
        if let Some(ms) = field("opened_after_ms") {
            took.push((format!("{{epoch=\"{epoch}\"}}"), format!("{:.3}", ms as f64 / 1e3)));
        }
        if let Some(n) = field("lost") {
            lost.push((format!("{{epoch=\"{epoch}\"}}"), n.to_string()));
        }
        if let Some(n) = field("old_primary_discarded") {
            discarded.push((format!("{{epoch=\"{epoch}\"}}"), n.to_string()));
        }
        let keys = [
            ("reports", "reports_ms"),
            ("prepare", "prepare_ms"),
            ("role_change", "role_change_ms"),
            ("lease_wait", "lease_wait_ms"),
        ];
        for (phase, key) in keys {
            if let Some(ms) = field(key) {
                phases.push((format!("{{epoch=\"{epoch}\",phase=\"{phase}\"}}"), format!("{:.3}", ms as f64 / 1e3)));
            }
        }
    }
    family(
        "ditto_cluster_failover_open_seconds",
        "Per recent failover seen live: from its start to the new epoch opening.",
        took,
    );
    family("ditto_cluster_failover_lost_commits", "Per recent failover: commits above its recovery point.", lost);
    family(
        "ditto_cluster_failover_phase_seconds",
        "Per recent failover: gathering a quorum's reports and planning, then the chosen node preparing; this node's server taking its new role (promoted or following, in place or by a restart); and how long the new primary was to wait for the older primaries' leases (lease_wait).",
        phases,
    );
    family(
        "ditto_cluster_failover_old_primary_discarded",
        "Per recent failover: the old primary's own commits above the recovery point, counted at its rejoin.",
        discarded,
    );
}

/// A duration in whole milliseconds, or -1 for `Duration::MAX` (never yet).
fn ms_or_never(d: std::time::Duration) -> String {
    match d {
        std::time::Duration::MAX => "-1".into(),
        d => d.as_millis().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_is_the_backup_view_over_the_primary_view() {
        assert_eq!(freshness_pct(80, 100), 80.0, "Query Fresh's example: 80 of 100 is 80%");
        assert_eq!(freshness_pct(100, 100), 100.0);
        assert_eq!(freshness_pct(120, 100), 100.0, "a view learned later never counts above 100");
        assert_eq!(freshness_pct(0, 0), 100.0, "nothing committed: nothing to lag");
    }

    /// Never yet is -1, not `Duration::MAX`'s 22 digits, which fit no client's integer.
    #[test]
    fn a_duration_never_yet_is_minus_one() {
        assert_eq!(ms_or_never(std::time::Duration::MAX), "-1");
        assert_eq!(ms_or_never(std::time::Duration::from_micros(2500)), "2");
    }
}
