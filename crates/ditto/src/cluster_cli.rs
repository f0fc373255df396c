//! `ditto cluster status`: a cluster's state as its nodes' servers show it. Asks one node
//! for `INFO cluster` (which names every member), then every member for `INFO cluster` and
//! `INFO replication`, and prints a table: role, epoch, primary, the backups' links, the
//! Raft leader and term, and the failovers the nodes saw (docs/cluster.md).

use std::collections::BTreeMap;

use crate::demo_server::{Client, Reply};
use crate::status::parse_info;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A member's INFO fields, or why it could not be asked.
type Answer = Result<BTreeMap<String, String>, String>;

#[derive(clap::Subcommand)]
pub enum ClusterCmd {
    /// Every member's role, epoch, primary, link and the failovers seen.
    Status(StatusArgs),
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// A member's client address (the others are found through it).
    #[arg(long, default_value = "127.0.0.1:6379")]
    node: String,
    /// Print one JSON object instead.
    #[arg(long)]
    json: bool,
}

fn info(addr: &str) -> Result<BTreeMap<String, String>, Error> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("{addr}: expected HOST:PORT"))?;
    let mut c = Client::connect_to(host, port.parse()?)?;
    let mut all = BTreeMap::new();
    for section in ["cluster", "replication"] {
        match c.call(&["INFO", section])? {
            Reply::Bulk(Some(b)) => all.extend(parse_info(&String::from_utf8(b)?).0),
            other => return Err(format!("INFO {section}: {other:?}").into()),
        }
    }
    Ok(all)
}

pub fn run(cmd: ClusterCmd) -> Result<(), Error> {
    let ClusterCmd::Status(a) = cmd;
    let first = info(&a.node).map_err(|e| format!("asking {}: {e}", a.node))?;
    if first.get("cluster_enabled").map(String::as_str) != Some("1") {
        return Err(format!("{} is not a cluster node (INFO cluster: cluster_enabled is not 1)", a.node).into());
    }
    let members: Vec<(String, String)> = first
        .get("cluster_members")
        .map(|m| {
            m.split(',').filter_map(|x| x.split_once('@')).map(|(i, ad)| (i.to_string(), ad.to_string())).collect()
        })
        .unwrap_or_default();
    let nodes: Vec<(String, String, Answer)> =
        members.into_iter().map(|(id, addr)| (id, addr.clone(), info(&addr).map_err(|e| e.to_string()))).collect();
    if a.json {
        let j: Vec<serde_json::Value> = nodes
            .iter()
            .map(|(id, addr, r)| match r {
                Ok(f) => serde_json::json!({ "id": id, "addr": addr, "up": true, "info": f }),
                Err(e) => serde_json::json!({ "id": id, "addr": addr, "up": false, "error": e }),
            })
            .collect();
        println!("{}", serde_json::json!({ "nodes": j }));
        return Ok(());
    }
    println!(
        "{:<5} {:<22} {:<8} {:>6} {:>8} {:<6} {:>12} {:>10}",
        "node", "address", "role", "epoch", "primary", "link", "raft leader", "failovers"
    );
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (id, addr, r) in &nodes {
        match r {
            Err(e) => println!("{id:<5} {addr:<22} down ({e})"),
            Ok(f) => {
                let g = |k: &str| f.get(k).cloned().unwrap_or_else(|| "-".into());
                let role = match g("role").as_str() {
                    "master" => "primary",
                    "slave" => "backup",
                    _ => "?",
                };
                let link = if role == "backup" { g("master_link_status") } else { "-".into() };
                println!(
                    "{id:<5} {addr:<22} {role:<8} {:>6} {:>8} {link:<6} {:>12} {:>10}",
                    g("cluster_epoch"),
                    g("cluster_primary"),
                    format!("{} (term {})", g("cluster_raft_leader"), g("cluster_raft_term")),
                    g("cluster_failovers"),
                );
                for (k, v) in f.iter().filter(|(k, _)| k.starts_with("cluster_failover_")) {
                    seen.entry(k.trim_start_matches("cluster_failover_").to_string()).or_insert_with(|| v.clone());
                }
            }
        }
    }
    if !seen.is_empty() {
        println!("failovers (epoch: what a node saw):");
        let mut epochs: Vec<(u64, String)> = seen.into_iter().filter_map(|(e, v)| Some((e.parse().ok()?, v))).collect();
        epochs.sort();
        for (e, v) in epochs {
            println!("  epoch {e}: {v}");
        }
    }
    Ok(())
}
