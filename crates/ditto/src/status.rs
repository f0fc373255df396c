//! `ditto status`: a node's replication state, read from its `INFO replication` over the
//! Redis protocol and printed for people (or as JSON): its role, its positions in the
//! primary's timestamps, and per backup the lags in milliseconds and the freshness score
//! (crates/server/src/replinfo.rs computes them).

use std::collections::BTreeMap;

use crate::demo_server::{Client, Reply};

#[derive(clap::Args)]
pub struct StatusArgs {
    /// The node's client address.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The node's client port.
    #[arg(long, default_value_t = 6379)]
    port: u16,
    /// The node's password (requirepass).
    #[arg(long)]
    password: Option<String>,
    /// Print one JSON object instead.
    #[arg(long)]
    json: bool,
}

/// `INFO replication`'s fields, and each `slaveN` line split into its own fields.
/// A `slaveN` link's checkpoint copy, as ": checkpoint copy X of Y MB (Z%)"; empty when
/// none is being sent.
pub(crate) fn copy_progress(link: &BTreeMap<String, String>) -> String {
    let g = |k: &str| link.get(k).and_then(|v| v.parse::<f64>().ok());
    match (g("copy_sent_bytes"), g("copy_total_bytes")) {
        (Some(sent), Some(total)) => format!(
            ": checkpoint copy {:.1} of {:.1} MB ({:.0}%)",
            sent / 1e6,
            total / 1e6,
            100.0 * sent / total.max(1.0)
        ),
        _ => String::new(),
    }
}

pub(crate) fn parse_info(text: &str) -> (BTreeMap<String, String>, Vec<BTreeMap<String, String>>) {
    let mut fields = BTreeMap::new();
    let mut backups = Vec::new();
    for line in text.lines() {
        let Some((k, v)) = line.trim_end().split_once(':') else { continue };
        if k.starts_with("slave") && k[5..].chars().all(|c| c.is_ascii_digit()) && !k[5..].is_empty() {
            backups.push(v.split(',').filter_map(|kv| kv.split_once('=')).map(|(a, b)| (a.into(), b.into())).collect());
        } else {
            fields.insert(k.to_string(), v.to_string());
        }
    }
    (fields, backups)
}

pub fn run(a: StatusArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut c = Client::connect_to(&a.host, a.port).map_err(|e| format!("connecting to {}:{}: {e}", a.host, a.port))?;
    c.auth(a.password.as_deref())?;
    let text = match c.call(&["INFO", "replication"])? {
        Reply::Bulk(Some(b)) => String::from_utf8(b)?,
        other => return Err(format!("INFO replication: {other:?}").into()),
    };
    let (f, backups) = parse_info(&text);
    if a.json {
        println!("{}", serde_json::json!({ "node": format!("{}:{}", a.host, a.port), "info": f, "backups": backups }));
        return Ok(());
    }
    let get = |k: &str| f.get(k).map(String::as_str).unwrap_or("-");
    let node = format!("{}:{}", a.host, a.port);
    match get("role") {
        "slave" => {
            println!(
                "{node}: backup of {}:{} (link {})",
                get("master_host"),
                get("master_port"),
                get("master_link_status")
            );
            println!(
                "  positions (primary's ts): received {}, durable {}, replayed {}, released {}, visible {} (reads see {}; {} behind what it received)",
                get("ditto_received_ts"),
                get("ditto_durable_ts"),
                get("ditto_replayed_ts"),
                get("ditto_released_ts"),
                get("ditto_visible_ts"),
                get("ditto_visible_ts"),
                get("ditto_lag_ts"),
            );
            println!(
                "  batches received {}, skipped as held {}, transactions replayed {} ({} replay), replay CPU {} ms, held for replay {} bytes, reconnects {}",
                get("ditto_batches_received"),
                get("ditto_batches_skipped"),
                get("ditto_txns_replayed"),
                get("ditto_replay_mode"),
                get("ditto_replay_cpu_ms"),
                get("ditto_replay_queued_bytes"),
                get("ditto_reconnects"),
            );
            println!(
                "  own checkpoints {} (newest at ts {}; the replica log below it is deleted)",
                get("ditto_checkpoints"),
                get("ditto_checkpoint_ts")
            );
            if let Some(why) = f.get("ditto_failure") {
                println!("  STOPPED: {why}");
            }
            if let Some(why) = f.get("ditto_master_link_refused") {
                println!("  REFUSED by the primary (still trying): {why}");
            }
            if let Some(why) = f.get("ditto_batch_refused") {
                println!(
                    "  REFUSING what the primary sends ({} batch(es) refused, trying again): {why}",
                    get("ditto_batches_refused")
                );
            }
        }
        _ if f.contains_key("ditto_repl_addr") => {
            println!(
                "{node}: primary, epoch {}, commit policy {}, backups connect to {}",
                get("ditto_epoch"),
                get("ditto_commit_policy"),
                get("ditto_repl_addr")
            );
            println!(
                "  durable ts {}, shipped {}, released {}",
                get("ditto_durable_ts"),
                get("ditto_shipped_ts"),
                get("ditto_released_ts")
            );
            if let Some(why) = f.get("ditto_release_blocked") {
                println!("  RELEASES BLOCKED: {why}");
            }
            println!("  {} backup(s) connected", get("connected_slaves"));
            if !backups.is_empty() {
                println!(
                    "  {:<22} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>12}",
                    "backup",
                    "received",
                    "durable",
                    "replayed",
                    "recv ms",
                    "fsync ms",
                    "replay ms",
                    "fresh %",
                    "queued B"
                );
            }
            for b in &backups {
                let g = |k: &str| b.get(k).map(String::as_str).unwrap_or("-");
                println!(
                    "  {:<22} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>12}",
                    g("node"),
                    g("received_ts"),
                    g("durable_ts"),
                    g("replayed_ts"),
                    g("received_lag_ms"),
                    g("durable_lag_ms"),
                    g("replay_lag_ms"),
                    g("freshness_pct"),
                    g("queued_bytes")
                );
                // A backup still being sent its start (a copy, the log from disk).
                if !matches!(b.get("state").map(String::as_str), None | Some("online")) {
                    println!("    joining, {}{}", g("state"), copy_progress(b));
                }
            }
            println!(
                "  lags: how long the oldest commit shipped and not yet at that position has waited (primary's clock)"
            );
        }
        _ => println!("{node}: standalone (no replication configured)"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_lines_and_backup_lines_are_split() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n\
                    slave0:node=a:1,received_ts=5,replay_lag_ms=0.250\r\nditto_epoch:3\r\n";
        let (f, b) = parse_info(text);
        assert_eq!(f.get("role").map(String::as_str), Some("master"));
        assert_eq!(f.get("ditto_epoch").map(String::as_str), Some("3"));
        assert!(!f.contains_key("slave0"));
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].get("node").map(String::as_str), Some("a:1"));
        assert_eq!(b[0].get("replay_lag_ms").map(String::as_str), Some("0.250"));
    }
}
