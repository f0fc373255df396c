//! `ditto cluster status`: a cluster's state as its nodes' servers show it. Asks one node
//! for `INFO cluster` (which names every member), then every member for `INFO cluster` and
//! `INFO replication`, and prints a table: role, epoch, primary, the backups' links, the
//! Raft leader and term, and the failovers the nodes saw (docs/cluster.md).
//!
//! `ditto cluster add|remove`: a membership change, sent to any member's control port
//! (`ditto_cluster::admin_request`); a node that does not lead names the leader, which is
//! asked instead; a change that cannot happen yet (another under way, a failover) is asked
//! again until it can, for at most `--wait-s`.

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
    /// Add a member: start it with `ditto server --node-id ID --join --members ...`
    /// (before or after this); it joins as a learner, copies the primary's data, and is
    /// then promoted to a voter.
    Add(AddArgs),
    /// Remove a member (not the primary: hand its role over first); its node stops.
    Remove(RemoveArgs),
    /// Hand the primary's role to another member without losing anything, under any
    /// commit policy: the primary stops taking writes, waits until the new one holds all
    /// it logged, and the failover that follows promotes that node in place.
    Switchover(SwitchoverArgs),
}

#[derive(clap::Args)]
pub struct SwitchoverArgs {
    /// The member to take over (default: a live backup the control plane's leader picks).
    #[arg(long)]
    to: Option<u64>,
    /// Any member's control address (HOST:CONTROL_PORT).
    #[arg(long)]
    via: String,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    auth: PasswordArg,
    /// Keep asking this long while it cannot happen yet, and wait as long for the new
    /// primary to take writes.
    #[arg(long, default_value_t = 30)]
    wait_s: u64,
}

#[derive(clap::Args)]
pub struct AddArgs {
    /// The new member: ID=HOST:CLIENT_PORT/REPL_PORT/CONTROL_PORT[/TLS_PORT].
    member: String,
    /// Any member's control address (HOST:CONTROL_PORT).
    #[arg(long)]
    via: String,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    auth: PasswordArg,
    /// Keep asking this long while the change cannot happen yet.
    #[arg(long, default_value_t = 30)]
    wait_s: u64,
    /// Leave the node a learner (it follows, and counts in no quorum); `ditto cluster add`
    /// again promotes it.
    #[arg(long)]
    learner: bool,
    /// Then wait this long for the new node to join the primary as a backup (its copy of
    /// the primary's data done, its link up), printing its progress, before it is
    /// promoted; 0: do not wait, and leave it a learner.
    #[arg(long, default_value_t = 600)]
    join_wait_s: u64,
    /// Promote it only once the primary holds its backup durable within this many ms of
    /// its own newest commit (a voter far behind would hold writes back while it catches
    /// up, whenever the quorum needs it).
    #[arg(long, default_value_t = 100)]
    max_lag_ms: u64,
}

#[derive(clap::Args)]
pub struct RemoveArgs {
    /// The member's id.
    id: u64,
    /// Any member's control address (HOST:CONTROL_PORT).
    #[arg(long)]
    via: String,
    #[command(flatten)]
    secret: SecretArg,
    #[command(flatten)]
    auth: PasswordArg,
    /// Keep asking this long while the change cannot happen yet.
    #[arg(long, default_value_t = 30)]
    wait_s: u64,
}

/// The password of the nodes' client ports (their `requirepass`), for the `INFO` this
/// command reads.
#[derive(clap::Args)]
pub struct PasswordArg {
    #[arg(long)]
    password: Option<String>,
}

/// The password every `INFO` of this command gives (`PasswordArg`), set once in `run`.
static PASSWORD: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

impl PasswordArg {
    fn set(&self) {
        let _ = PASSWORD.set(self.password.clone());
    }
}

/// What a membership change shows the control port: the cluster secret, and TLS.
#[derive(clap::Args)]
pub struct SecretArg {
    /// The file of the cluster's secret, where its nodes were given one
    /// (--cluster-secret-file on each node).
    #[arg(long, value_name = "FILE")]
    cluster_secret_file: Option<std::path::PathBuf>,
    /// While the cluster's secret is rotated: a file of another secret the nodes may show
    /// (up to 3; the node that answers must prove it holds one this tool takes). Give
    /// the new secret as --cluster-secret-file and the old here, throughout a rotation.
    #[arg(long, value_name = "FILE", requires = "cluster_secret_file")]
    cluster_secret_also_file: Vec<std::path::PathBuf>,
    /// Where the nodes have tls_cluster: a PEM certificate their CA signed (shown to them).
    #[arg(long, value_name = "FILE", requires_all = ["tls_key_file", "tls_ca_cert_file"])]
    tls_cert_file: Option<std::path::PathBuf>,
    /// The certificate's private key.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    tls_key_file: Option<std::path::PathBuf>,
    /// The CA the nodes' certificates must chain to.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    tls_ca_cert_file: Option<std::path::PathBuf>,
}

/// How `ditto cluster` reaches a control port.
struct Dial {
    secret: Option<ditto_cluster::ClusterSecret>,
    tls: Option<std::sync::Arc<ditto_replication::tls::LinkTls>>,
}

impl SecretArg {
    fn load(&self) -> Result<Dial, Error> {
        let secret = self
            .cluster_secret_file
            .as_deref()
            .map(|shown| ditto_cluster::ClusterSecret::load(shown, &self.cluster_secret_also_file))
            .transpose()?;
        let tls = match (&self.tls_cert_file, &self.tls_key_file, &self.tls_ca_cert_file) {
            (Some(cert), Some(key), Some(ca)) => {
                Some(ditto_replication::tls::LinkTls::from_paths(cert, key, ca, std::time::Duration::from_secs(5))?)
            }
            _ => None,
        };
        Ok(Dial { secret, tls })
    }
}

/// What the control state was right after a request applied.
struct Applied {
    config: u64,
    members: Vec<ditto_cluster::Member>,
    epoch: u64,
    primary: Option<u64>,
}

/// Sends a membership change to the leader (found through `via`), asking again while it is
/// busy, until `wait`.
fn change(
    via: &str,
    dial: &Dial,
    req: ditto_cluster::AdminRequest,
    wait: std::time::Duration,
) -> Result<Applied, Error> {
    use ditto_cluster::AdminReply;
    let deadline = std::time::Instant::now() + wait;
    let mut at = via.to_string();
    let mut last_busy = String::new();
    let mut redirects = 0u32;
    loop {
        let reply = match ditto_cluster::admin_request(&at, &req, dial.secret.as_ref(), dial.tls.as_deref()) {
            // Refused for the secret or the TLS: asking again would not change that.
            Err(e) if ditto_cluster::is_refused(&e) => return Err(e.to_string().into()),
            r => r.map_err(|e| format!("asking {at}: {e}")),
        };
        let retry = match reply {
            Ok(AdminReply::Done { config, members, epoch, primary }) => {
                if !matches!(req, ditto_cluster::AdminRequest::Switchover { .. }) {
                    println!("done: configuration {config}, members:");
                    for m in &members {
                        let tls = if m.tls != 0 { format!(" tls {}", m.tls) } else { String::new() };
                        println!("  {} client {} replication {} control {}{tls}", m.id, m.addr, m.repl, m.control);
                    }
                }
                return Ok(Applied { config, members, epoch, primary });
            }
            Ok(AdminReply::Refused(why)) => return Err(format!("refused: {why}").into()),
            Ok(AdminReply::NotLeader { addr: Some(a), leader }) if std::time::Instant::now() < deadline => {
                println!("{at} does not lead the control plane; asking node {} at {a}", leader.unwrap_or(0));
                at = a;
                // (Two nodes naming each other while a leadership moves: not in a tight loop.)
                redirects += 1;
                if redirects > 1 {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                continue;
            }
            Ok(AdminReply::NotLeader { addr: Some(a), .. }) => {
                format!("{a} was named the leader, and did not answer as one")
            }
            Ok(AdminReply::NotLeader { .. }) => "no leader is known right now".to_string(),
            Ok(AdminReply::Busy(why)) => why,
            // The node asked may be down: the one named first is asked again.
            Err(e) => {
                at = via.to_string();
                e
            }
        };
        if std::time::Instant::now() >= deadline {
            return Err(format!("gave up after {wait:?}: {retry}").into());
        }
        if retry != last_busy {
            println!("not yet: {retry}");
            last_busy = retry;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// How long `info` waits for a member's answer.
const INFO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `ditto cluster switchover`: records the switchover through the leader, then watches the
/// members' `INFO cluster` until a new epoch serves, and says which node took over, how
/// long writes were refused (from the request to the new primary's first accepted state,
/// as this client saw it) and what the failover discarded.
fn switchover(a: SwitchoverArgs) -> Result<(), Error> {
    let wait = std::time::Duration::from_secs(a.wait_s);
    let secret = a.secret.load()?;
    let applied = change(&a.via, &secret, ditto_cluster::AdminRequest::Switchover { to: a.to }, wait)?;
    let t = std::time::Instant::now();
    let seen = |f: &BTreeMap<String, String>, k: &str| f.get(k).cloned().unwrap_or_default();
    // The epoch and primary the switchover was recorded in, as the leader answered: a
    // member's INFO read now may already show the next epoch (a member that does not
    // answer is waited for 2 s, and a switchover may be over in 30 ms).
    let (mut epoch0, mut from) = (applied.epoch, applied.primary.map(|p| p.to_string()).unwrap_or_default());
    let members = applied.members;
    if epoch0 == 0 {
        // A leader of an earlier version, whose answer carries no epoch: read now.
        if let Some(f) = members.iter().find_map(|m| info(&m.addr).ok()) {
            epoch0 = seen(&f, "cluster_epoch").parse().unwrap_or(0);
            from = seen(&f, "cluster_primary");
        }
    }
    println!("switchover recorded in epoch {epoch0}: node {from} stops taking writes and hands over");
    // Each member is asked by a thread of its own, over and over: one that does not answer
    // (its server stopped) is waited for `INFO_TIMEOUT` there and holds nobody else's
    // answer. An answer comes with when it was asked (since `t`).
    let (tx, rx) = std::sync::mpsc::channel();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for m in &members {
        let (tx, done, addr) = (tx.clone(), std::sync::Arc::clone(&done), m.addr.clone());
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let asked = t.elapsed();
                // Answers, and a refusal for want of a password (which ends the watch).
                let answer = info(&addr).map_err(|e| e.to_string());
                let send = answer.is_ok() || answer.as_ref().is_err_and(|e| e.contains(NEEDS_PASSWORD));
                if send && tx.send((asked, answer)).is_err() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
    }
    drop(tx);
    let _stop = StopOnDrop(done);
    loop {
        let answers: Vec<_> = match rx.recv_timeout(std::time::Duration::from_millis(50)) {
            Ok(first) => std::iter::once(first).chain(rx.try_iter()).collect(),
            Err(_) => Vec::new(),
        };
        for (asked, f) in answers {
            let f = f?;
            let epoch: u64 = seen(&f, "cluster_epoch").parse().unwrap_or(0);
            if epoch > epoch0 && seen(&f, "cluster_phase") == "serving" {
                let primary = seen(&f, "cluster_primary");
                println!(
                    "epoch {epoch} serves: node {primary} ({}) is the primary, {:.0} ms after the request was recorded",
                    seen(&f, "cluster_primary_addr"),
                    t.elapsed().as_secs_f64() * 1e3
                );
                if let Some(line) = f.get(&format!("cluster_failover_{epoch}")) {
                    println!("  {line}");
                }
                if a.to.is_some_and(|to| to.to_string() != primary) {
                    return Err(format!(
                        "node {primary} took over, not node {} (it lacked what another held, or did not report in time)",
                        a.to.unwrap_or(0)
                    )
                    .into());
                }
                return Ok(());
            }
            let given_up =
                epoch == epoch0 && seen(&f, "cluster_phase") == "serving" && seen(&f, "cluster_switchover") == "none";
            // (Only from answers asked for 500 ms after the request: a member's INFO
            // learns of the switchover a few ms after it is recorded.)
            if given_up && asked > std::time::Duration::from_millis(500) {
                return Err(format!(
                    "the switchover was given up (node {from} took writes again); see `ditto cluster status` and its log"
                )
                .into());
            }
        }
        if t.elapsed() >= wait {
            return Err(format!("no new epoch served within {wait:?}; see `ditto cluster status`").into());
        }
    }
}

/// Sets its flag when dropped (the threads asking members stop).
struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// A member's client address (the others are found through it).
    #[arg(long, default_value = "127.0.0.1:6379")]
    node: String,
    #[command(flatten)]
    auth: PasswordArg,
    /// Print one JSON object instead.
    #[arg(long)]
    json: bool,
}

/// A member's `INFO cluster` and `INFO replication`, or an error if it does not answer
/// within `INFO_TIMEOUT` (a server that hangs, stopped or swamped, must not stall a watch
/// over every member: a switchover's outcome is read from the others).
fn info(addr: &str) -> Result<BTreeMap<String, String>, Error> {
    Ok(info_sections(addr, &["cluster", "replication"])?.0)
}

/// `INFO` of each of `sections` at `addr`: the fields, and a primary's links (`slaveN`).
#[allow(clippy::type_complexity)]
fn info_sections(
    addr: &str,
    sections: &[&str],
) -> Result<(BTreeMap<String, String>, Vec<BTreeMap<String, String>>), Error> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("{addr}: expected HOST:PORT"))?;
    let mut c = Client::connect_to(host, port.parse()?)?;
    c.set_read_timeout(INFO_TIMEOUT)?;
    c.auth(PASSWORD.get().and_then(|p| p.as_deref()))?;
    let (mut all, mut links) = (BTreeMap::new(), Vec::new());
    for section in sections {
        match c.call(&["INFO", section])? {
            Reply::Bulk(Some(b)) => {
                let (f, l) = parse_info(&String::from_utf8(b)?);
                all.extend(f);
                links.extend(l);
            }
            Reply::Error(e) if e.starts_with("NOAUTH") => return Err(format!("{addr}: {NEEDS_PASSWORD}").into()),
            other => return Err(format!("INFO {section}: {other:?}").into()),
        }
    }
    Ok((all, links))
}

/// What an `INFO` refused for want of a password says: asking again would not change it.
const NEEDS_PASSWORD: &str = "the node asks for a password (its requirepass): give --password";

/// Waits until node `id`'s server (at `addr`) is a backup with its link up, saying what it
/// does meanwhile: while it does not answer (copying the primary's data), what the
/// primary, found through the `others` members' servers, says of its link (its start's
/// state, and the copy's bytes sent of its total).
fn wait_joined(id: u64, addr: &str, others: &[String], wait: std::time::Duration) -> Result<(), Error> {
    let t = std::time::Instant::now();
    let mut last_said = String::new();
    loop {
        let now = match info(addr) {
            Ok(f) => {
                let g = |k: &str| f.get(k).cloned().unwrap_or_default();
                if g("role") == "slave" && g("master_link_status") == "up" {
                    println!(
                        "node {id} joined the primary at {}:{} as a backup after {:.1} s",
                        g("master_host"),
                        g("master_port"),
                        t.elapsed().as_secs_f64()
                    );
                    return Ok(());
                }
                format!("its server runs as {} (link {})", g("role"), g("master_link_status"))
            }
            Err(e) if e.to_string().contains(NEEDS_PASSWORD) => return Err(e),
            Err(_) => match others.iter().find_map(|o| link_on_primary(o, addr)) {
                Some((_, link, _)) => {
                    let state = link.get("state").map_or("", String::as_str);
                    let copy = crate::status::copy_progress(&link);
                    format!("its server is not answering yet; the primary's link to it: {state}{copy}")
                }
                None => "its server is not answering yet (starting, or copying the primary's data)".to_string(),
            },
        };
        if now != last_said {
            println!("node {id}: {now}");
            last_said = now;
        }
        if t.elapsed() >= wait {
            return Err(format!(
                "node {id} has not joined within {wait:?} (it is a learner, not promoted; see `ditto cluster status` and its log)"
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Node `id`'s link as its primary sees it (`slaveN` of `INFO replication`, by the name
/// `node_addr` its backup gives), the primary found through the member whose server is at
/// `ask` (the node itself, or another while it does not answer): the primary's client
/// address, the link and the primary's own fields; `None` while that server does not
/// name a primary or the primary does not list the link.
#[allow(clippy::type_complexity)]
fn link_on_primary(ask: &str, node_addr: &str) -> Option<(String, BTreeMap<String, String>, BTreeMap<String, String>)> {
    let primary = info(ask).ok()?.get("cluster_primary_addr").cloned().filter(|a| a.contains(':'))?;
    let (fields, links) = info_sections(&primary, &["replication"]).ok()?;
    let link = links.into_iter().find(|l| l.get("node").map(String::as_str) == Some(node_addr))?;
    Some((primary, link, fields))
}

/// Waits until the primary holds node `id`'s backup durable within `max_lag_ms` of its
/// own newest commit, and at least up to where the primary itself was durable when the
/// wait began (the lag is measured from the batches the primary ships live: a backlog sent
/// from its disk has no samples, and reads as no lag): promoted before, a voter far behind
/// would hold writes back while it caught up whenever the quorum needed it.
fn wait_caught_up(id: u64, node_addr: &str, max_lag_ms: u64, wait: std::time::Duration) -> Result<(), Error> {
    let t = std::time::Instant::now();
    let mut last = String::from("its link is not listed by the primary yet");
    // (primary, its durable position when first asked)
    let mut target: Option<(String, u64)> = None;
    let ts = |m: &BTreeMap<String, String>, k: &str| m.get(k).and_then(|v| v.parse::<u64>().ok());
    loop {
        if let Some((primary, link, fields)) = link_on_primary(node_addr, node_addr) {
            // (A new primary meanwhile: its own position is the mark.)
            if target.as_ref().is_none_or(|(p, _)| *p != primary) {
                target = ts(&fields, "ditto_durable_ts").map(|d| (primary.clone(), d));
            }
            let mark = target.as_ref().map_or(u64::MAX, |(_, d)| *d);
            let held = ts(&link, "durable_ts").unwrap_or(0);
            match link.get("durable_lag_ms").and_then(|v| v.parse::<f64>().ok()) {
                Some(_) if held < mark => {
                    last = format!("durable to ts {held}, the primary at {primary} was at {mark}")
                }
                Some(lag) if lag <= max_lag_ms as f64 => {
                    println!("node {id} caught up: the primary at {primary} holds it durable {lag:.1} ms behind");
                    return Ok(());
                }
                Some(lag) => last = format!("{lag:.1} ms behind the primary at {primary}"),
                None => last = format!("the primary at {primary} does not say its lag"),
            }
        }
        if t.elapsed() >= wait {
            return Err(format!(
                "node {id} has not caught up within {wait:?} ({last}; it is a learner, not promoted: `ditto cluster add` again promotes it)"
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits until the primary counts node `id`'s backup in its quorum: its link no longer
/// marked a learner's (the promotion reached the node's server), and the primary settled on
/// configuration `config` or a later one (its node told it the members whose backups it
/// counts).
fn wait_counted(id: u64, node_addr: &str, config: u64, wait: std::time::Duration) -> Result<(), Error> {
    let t = std::time::Instant::now();
    let settled = |f: &BTreeMap<String, String>| {
        f.get("ditto_members_settled").and_then(|c| c.parse::<u64>().ok()).is_some_and(|c| c >= config)
    };
    loop {
        if let Some((primary, _, _)) =
            link_on_primary(node_addr, node_addr).filter(|(_, l, f)| !l.contains_key("learner") && settled(f))
        {
            let ms = t.elapsed().as_secs_f64() * 1e3;
            println!("node {id} counted: the primary at {primary} counts its backup in the quorum ({ms:.0} ms after)");
            return Ok(());
        }
        if t.elapsed() >= wait {
            return Err(format!(
                "node {id} is a voter in the control plane, but the primary has not counted its backup within {wait:?} (see `ditto cluster status` and its log)"
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub fn run(cmd: ClusterCmd) -> Result<(), Error> {
    match &cmd {
        ClusterCmd::Status(StatusArgs { auth, .. })
        | ClusterCmd::Add(AddArgs { auth, .. })
        | ClusterCmd::Remove(RemoveArgs { auth, .. })
        | ClusterCmd::Switchover(SwitchoverArgs { auth, .. }) => auth.set(),
    }
    let a = match cmd {
        ClusterCmd::Status(a) => a,
        ClusterCmd::Add(a) => {
            let parsed = crate::node::parse_members(&a.member)?;
            let (Some((&id, m)), 1) = (parsed.iter().next(), parsed.len()) else {
                return Err("name one member: ID=HOST:CLIENT_PORT/REPL_PORT/CONTROL_PORT[/TLS_PORT]".into());
            };
            let member = m.member(id);
            let wait = std::time::Duration::from_secs(a.wait_s);
            let secret = a.secret.load()?;
            // A learner first: it copies the primary's data while counting in no quorum
            // (docs/cluster.md, "Learners"); then, once it has joined, a voter.
            let others = match change(&a.via, &secret, ditto_cluster::AdminRequest::AddLearner(member.clone()), wait) {
                Ok(applied) => {
                    println!("node {id} added as a learner: it copies the primary's data and counts in no quorum");
                    applied.members.iter().filter(|o| o.id != id).map(|o| o.addr.clone()).collect()
                }
                // An earlier `add` that stopped before the promotion: it goes on from there.
                Err(e) if e.to_string().contains("is already a learner") => {
                    println!("node {id} is a learner already");
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            if a.join_wait_s == 0 || a.learner {
                if a.join_wait_s > 0 {
                    wait_joined(id, &m.client_addr(), &others, std::time::Duration::from_secs(a.join_wait_s))?;
                }
                // (Promoted only once joined: a voter without the data stalls writes.)
                println!("node {id} stays a learner: `ditto cluster add` again promotes it once it has joined");
                return Ok(());
            }
            let join_wait = std::time::Duration::from_secs(a.join_wait_s);
            let t = std::time::Instant::now();
            wait_joined(id, &m.client_addr(), &others, join_wait)?;
            wait_caught_up(id, &m.client_addr(), a.max_lag_ms, join_wait.saturating_sub(t.elapsed()))?;
            let applied = change(&a.via, &secret, ditto_cluster::AdminRequest::Add(member), wait)?;
            println!("node {id} promoted: a voter ({} members)", applied.members.len());
            wait_counted(id, &m.client_addr(), applied.config, wait)?;
            return Ok(());
        }
        ClusterCmd::Remove(a) => {
            let secret = a.secret.load()?;
            let wait = std::time::Duration::from_secs(a.wait_s);
            match change(&a.via, &secret, ditto_cluster::AdminRequest::Remove(a.id), wait) {
                // Asked again after an answer was lost (a leader's crash, a timeout that said
                // it may still be applied): it was.
                Err(e) if e.to_string().contains("was removed already") => {
                    println!("node {} was removed already", a.id)
                }
                r => {
                    r?;
                }
            }
            return Ok(());
        }
        ClusterCmd::Switchover(a) => return switchover(a),
    };
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
    // The membership, as the first node that answered sees it.
    if let Some(f) = nodes.iter().find_map(|(_, _, r)| r.as_ref().ok()) {
        let g = |k: &str| f.get(k).cloned().unwrap_or_else(|| "-".into());
        println!(
            "membership: configuration {} ({}), Raft voters {}, learners {}",
            g("cluster_config"),
            match g("cluster_config_settled").as_str() {
                "yes" => "settled: a change may be made",
                _ => "not settled yet: the next change waits",
            },
            g("cluster_voters"),
            match g("cluster_learners").as_str() {
                "" => "none".to_string(),
                l => l.to_string(),
            }
        );
        if let Some(tls) = f.get("cluster_primary_tls_addr").filter(|a| *a != "none") {
            println!("the primary takes TLS clients at {tls}");
        }
        if let Some((from, to)) = f.get("cluster_switchover").and_then(|v| v.split_once("->")) {
            println!("switchover under way: node {from} drains and hands its role to node {to}");
        }
    }
    // Connections a node's control port refused at their hello (a secret that differs, a
    // stray process): how many, and the last.
    for (id, _, r) in &nodes {
        let Some(f) = r.as_ref().ok() else { continue };
        if let Some(n) = f.get("cluster_control_refused").filter(|n| *n != "0") {
            let last = f.get("cluster_control_refused_last").map_or("-", String::as_str);
            println!("node {id}'s control port refused {n} connections; the last: {last}");
        }
    }
    // A failover round with no plan yet, as the node leading it says.
    for (id, _, r) in &nodes {
        if let Some(why) = r.as_ref().ok().and_then(|f| f.get("cluster_waiting_failover")).filter(|w| *w != "none") {
            println!("failover waiting (node {id} leads it): {why}");
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
