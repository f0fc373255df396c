//! `ditto bench failover`: throughput over time around failovers (Rolis figure 14)
//! ===========================================================================
//! Three `ditto server --node-id` nodes on this machine (demo_failover.rs's `Nodes`);
//! `--clients` client threads write without pause (`SET b:<client>:<n> <n>`), each one
//! following the primary by itself: on an error or a `READONLY` it asks the nodes
//! `SENTINEL get-master-addr-by-name ditto` and goes there. The primary's node is killed
//! with SIGKILL `--kills` times, `--between-s` apart, and started again each time (it
//! rejoins as a backup). Printed, and with `--json` one JSON object at the end:
//! - writes per second in 50 ms buckets over the whole run (`--plot FILE.svg` draws them,
//!   with the kills marked);
//! - per failover: the unavailability (SIGKILL to the first write acknowledged by another
//!   node) and every client's (to the last client's first write acknowledged by another
//!   node: each client finds the new primary by itself, and the first to find it says
//!   only when the cluster took writes again), the time for the killed node to rejoin, and
//!   the throughput in the second before the kill and in the second after the first write
//!   on the new primary (their ratio);
//! - at the end every acknowledged write is read back on every node: a lost one fails the
//!   run;
//! - with `--preload N`, N keys (`p:<n>`, `--preload-value-bytes` each) are written first,
//!   pipelined, so that each failover happens with that much data on every node;
//! - with `--switchover`, the primary is not killed: the cluster is asked to hand its role
//!   over (`ditto cluster switchover`), and the unavailability runs from the request to the
//!   first write acknowledged by another node; the old primary rejoins by itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::demo_failover::{check_acks, wait_for, writer, Ack, Nodes};
use crate::demo_server::{Client, Reply};

type Error = Box<dyn std::error::Error + Send + Sync>;

const BUCKET_MS: u64 = 50;

#[derive(clap::Args)]
pub struct FailoverBenchArgs {
    /// Client threads writing at once.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Failovers (SIGKILLs of the primary's node).
    #[arg(long, default_value_t = 3)]
    kills: usize,
    /// Seconds of load before the first kill, between kills and after the last.
    #[arg(long, default_value_t = 2.0)]
    between_s: f64,
    /// The cluster's commit policy.
    #[arg(long, default_value = "majority-durable")]
    policy: String,
    /// Workers per server (the server's own default: the cores less one, at least one).
    #[arg(long, default_value_t = ditto_server::config::default_workers())]
    workers: usize,
    /// The failure timeout of the cluster's nodes (ms).
    #[arg(long, default_value_t = 250)]
    failure_timeout_ms: u64,
    /// Where the nodes keep their data and logs (default: a temporary directory).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Draw writes per second over time, the kills marked, to this SVG file.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Keys written (pipelined, 4 connections) before the clients start and the first kill:
    /// the data each node holds through the failovers.
    #[arg(long, default_value_t = 0)]
    preload: u64,
    /// The size of each preloaded value.
    #[arg(long, default_value_t = 200)]
    preload_value_bytes: usize,
    /// Planned switchovers instead of SIGKILLs (`--kills` of them).
    #[arg(long)]
    switchover: bool,
    /// A read-only client on a backup as well (DBSIZE without pause on one connection,
    /// moved to a backup before each failover): counts its reads and the connections a
    /// failover closed.
    #[arg(long)]
    backup_reader: bool,
    /// TLS between the nodes (`--tls-replication --tls-cluster`, certificates of a CA made
    /// for the run), to compare with the same run without.
    #[arg(long)]
    tls: bool,
    /// Print one JSON object at the end.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct FailoverFigures {
    killed: u64,
    new_primary: u64,
    at_s: f64,
    unavailable_ms: f64,
    /// To the last client's first write acknowledged by another node.
    unavailable_every_client_ms: f64,
    rejoin_ms: f64,
    writes_per_s_before: f64,
    writes_per_s_after: f64,
    after_over_before: f64,
    /// Where its time went, as the new primary's node said (`None`: it did not say
    /// within 3 s).
    phases: Option<crate::demo_failover::Phases>,
}

#[derive(serde::Serialize)]
struct Figures {
    bench: &'static str,
    clients: usize,
    policy: String,
    workers: usize,
    failure_timeout_ms: u64,
    tls_between_nodes: bool,
    bucket_ms: u64,
    preload_keys: u64,
    preload_value_bytes: usize,
    preload_seconds: f64,
    /// "sigkill" or "switchover".
    kind: &'static str,
    /// Over the failovers (nearest rank).
    unavailable_ms_p50: f64,
    unavailable_ms_p99: f64,
    unavailable_ms_max: f64,
    /// The same for every client's (`FailoverFigures::unavailable_every_client_ms`).
    unavailable_every_client_ms_p50: f64,
    unavailable_every_client_ms_max: f64,
    acknowledged_writes: usize,
    /// Nodes that lack an acknowledged write or a preloaded key (each said on stderr).
    nodes_lacking_writes: usize,
    /// With `--backup-reader`: its reads, the connections it lost to a failover, and its
    /// slowest read.
    backup_reads: Option<u64>,
    backup_connections_lost: Option<u64>,
    backup_read_ms_max: Option<f64>,
    failovers: Vec<FailoverFigures>,
    /// Writes per second in each bucket from the start of the load.
    writes_per_s: Vec<f64>,
}

/// Writes per second in `BUCKET_MS` buckets from `from` to `to`.
fn rates(acks: &[Ack], from: Instant, to: Instant) -> Vec<f64> {
    let n = (to.saturating_duration_since(from).as_millis() as u64 / BUCKET_MS) as usize;
    let mut b = vec![0usize; n];
    for (_, _, t, _) in acks {
        if *t >= from {
            let i = (t.duration_since(from).as_millis() as u64 / BUCKET_MS) as usize;
            if i < n {
                b[i] += 1;
            }
        }
    }
    b.into_iter().map(|c| c as f64 * 1000.0 / BUCKET_MS as f64).collect()
}

/// The nearest-rank `q` quantile of `sorted` (0 when empty).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Writes `keys` keys `p:<n>` of `value_bytes` each to the node on `port`, pipelined over 4
/// connections; returns the seconds it took.
fn preload(port: u16, keys: u64, value_bytes: usize) -> Result<f64, Error> {
    const CONNS: u64 = 4;
    const PIPELINE: u64 = 500;
    let t = Instant::now();
    let value = "v".repeat(value_bytes);
    std::thread::scope(|s| {
        let loaders: Vec<_> = (0..CONNS)
            .map(|c| {
                let value = value.as_str();
                s.spawn(move || -> Result<(), Error> {
                    let mut client = Client::connect_to("127.0.0.1", port)?;
                    let mut next = c;
                    while next < keys {
                        let names: Vec<String> = (0..PIPELINE)
                            .map(|j| next + j * CONNS)
                            .take_while(|&k| k < keys)
                            .map(|k| format!("p:{k}"))
                            .collect();
                        next += names.len() as u64 * CONNS;
                        let cmds: Vec<[&str; 3]> = names.iter().map(|k| ["SET", k.as_str(), value]).collect();
                        let refs: Vec<&[&str]> = cmds.iter().map(|c| &c[..]).collect();
                        for r in client.pipeline(&refs)? {
                            if let Reply::Error(e) = r {
                                return Err(format!("preloading: {e}").into());
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        loaders.into_iter().try_for_each(|l| l.join().map_err(|_| Error::from("a preloader panicked"))?)
    })?;
    Ok(t.elapsed().as_secs_f64())
}

/// Every preloaded key, read back from the node on `port` (MGETs of 500), with the value
/// the preload wrote; `Err` says how many are missing or wrong, and the first.
fn check_preload(port: u16, keys: u64, value_bytes: usize) -> Result<(), Error> {
    let want = Reply::Bulk(Some("v".repeat(value_bytes).into_bytes()));
    let mut c = Client::connect_to("127.0.0.1", port)?;
    let (mut bad, mut first) = (0u64, None);
    for lo in (0..keys).step_by(500) {
        let names: Vec<String> = (lo..(lo + 500).min(keys)).map(|k| format!("p:{k}")).collect();
        let mut args = vec!["MGET"];
        args.extend(names.iter().map(String::as_str));
        let Reply::Array(Some(vals)) = c.call(&args)? else {
            return Err("MGET of preloaded keys: not an array".into());
        };
        for (k, v) in names.iter().zip(vals) {
            if v != want {
                bad += 1;
                first.get_or_insert_with(|| format!("{k} is {v:?}"));
            }
        }
    }
    match first {
        None => Ok(()),
        Some(first) => Err(format!("{bad} of {keys} preloaded keys missing or wrong; the first: {first}").into()),
    }
}

/// One failover as the run saw it (times in ms).
#[derive(Clone, Copy)]
struct Kill {
    killed: u64,
    new: u64,
    at: Instant,
    unavailable: f64,
    every_client: f64,
    rejoin: f64,
    first_after: Instant,
}

/// Where the acks after `at` begin in `acks` (in time order).
fn since(acks: &[Ack], at: Instant) -> usize {
    acks.partition_point(|a| a.2 <= at)
}

/// When the last of `clients` clients had its first write after `at` acknowledged by a
/// node other than the one on `port`; `None` while one has not.
fn every_client_back(acks: &[Ack], clients: usize, at: Instant, port: u16) -> Option<Instant> {
    let mut first: Vec<Option<Instant>> = vec![None; clients];
    for &(c, _, t, p) in acks {
        if t > at && p != port {
            if let Some(f) = first.get_mut(c) {
                f.get_or_insert(t);
            }
        }
    }
    first.into_iter().collect::<Option<Vec<Instant>>>()?.into_iter().max()
}

fn rate_between(acks: &[Ack], from: Instant, to: Instant) -> f64 {
    let c = acks.iter().filter(|(_, _, t, _)| *t >= from && *t < to).count();
    c as f64 / to.saturating_duration_since(from).as_secs_f64().max(1e-9)
}

pub fn run(a: FailoverBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    run_inner(a).map_err(|e| e as Box<dyn std::error::Error>)
}

fn run_inner(a: FailoverBenchArgs) -> Result<(), Error> {
    ditto_replication::CommitPolicy::parse(&a.policy)?;
    if a.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    // (Declared before the nodes, so dropped after them: the processes stop first.)
    let scratch = crate::logmode::ScratchDir::new(a.dir.clone(), "bench-failover")?;
    let dir = scratch.path.clone();
    let mut nodes = Nodes::start_three(&dir, a.workers, &a.policy, a.failure_timeout_ms, a.tls)?;
    let first = wait_for("a first primary", Duration::from_secs(30), || nodes.primary())?;
    eprintln!(
        "three nodes (policy {}, failure timeout {} ms); node {first} is the primary; {} clients; logs in {}",
        a.policy,
        a.failure_timeout_ms,
        a.clients,
        dir.display()
    );
    let mut preload_seconds = 0.0;
    if a.preload > 0 {
        preload_seconds = preload(nodes.ports[&first], a.preload, a.preload_value_bytes)?;
        eprintln!("preloaded {} keys of {} B in {preload_seconds:.1} s", a.preload, a.preload_value_bytes);
    }
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let ports: Vec<u16> = nodes.ports.values().copied().collect();
    let clients: Vec<_> = (0..a.clients)
        .map(|id| {
            let (acks, stop, ports) = (Arc::clone(&acks), Arc::clone(&stop), ports.clone());
            std::thread::spawn(move || writer(id, "b:", ports, acks, stop))
        })
        .collect();
    let mut reader = crate::demo_failover::BackupReader::new();
    let start = Instant::now();
    let between = Duration::from_secs_f64(a.between_s);
    let mut kills: Vec<Kill> = Vec::new();
    let mut phases = Vec::new();
    for k in 0..a.kills {
        if a.backup_reader {
            // On a backup of the primary that is to fail (moved there before the pause).
            let primary = wait_for("a primary", Duration::from_secs(20), || nodes.primary())?;
            let b = nodes.ports.iter().find(|(id, _)| **id != primary).map(|(_, p)| *p).ok_or("no backup")?;
            reader.aim(b, &stop);
        }
        std::thread::sleep(between);
        let primary = wait_for("a primary", Duration::from_secs(20), || nodes.primary())?;
        let port = nodes.ports[&primary];
        let (at, at_unix_ms) = (Instant::now(), crate::demo_failover::unix_ms());
        if a.switchover {
            nodes.switchover(primary)?;
        } else {
            nodes.kill(primary)?;
        }
        // (From the kill on: the acks are in time order, each taken under the lock, and
        // the writers wait for it while it is held.)
        let first_after = wait_for("a write on another node", Duration::from_secs(20), || {
            let acks = acks.lock().expect("acks");
            acks[since(&acks, at)..].iter().find(|(_, _, t, p)| *t > at && *p != port).map(|a| a.2)
        })?;
        let unavailable = first_after.duration_since(at).as_secs_f64() * 1e3;
        let every_client = wait_for("a write of every client on another node", Duration::from_secs(20), || {
            let acks = acks.lock().expect("acks");
            every_client_back(&acks[since(&acks, at)..], a.clients, at, port)
        })?;
        let every_client = every_client.duration_since(at).as_secs_f64() * 1e3;
        let new = wait_for("the new primary", Duration::from_secs(20), || nodes.primary())?;
        phases.push(nodes.phases(new, at_unix_ms, unavailable));
        let t = Instant::now();
        if !a.switchover {
            nodes.start(primary)?;
        }
        wait_for("the killed node to rejoin", Duration::from_secs(60), || nodes.rejoined(primary).then_some(()))?;
        let rejoin = t.elapsed().as_secs_f64() * 1e3;
        eprintln!(
            "failover {}: {} node {primary} at {:.2} s; node {new} took writes {unavailable:.0} ms later, from every client {every_client:.0} ms later; node {primary} rejoined in {rejoin:.0} ms",
            k + 1,
            if a.switchover { "switchover from" } else { "SIGKILL of" },
            at.duration_since(start).as_secs_f64()
        );
        kills.push(Kill { killed: primary, new, at, unavailable, every_client, rejoin, first_after });
    }
    std::thread::sleep(between);
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().map_err(|_| "a client panicked")?;
    }
    let (reads, conns_lost, slowest) = reader.finish()?;
    let (backup_reads, backup_connections_lost, backup_read_ms_max) = match a.backup_reader {
        true => (Some(reads), Some(conns_lost), Some(slowest)),
        false => (None, None, None),
    };
    let end = Instant::now();
    let acked = acks.lock().expect("acks").clone();
    // Every acknowledged write, on every node.
    let mut lost = 0;
    for (id, &port) in &nodes.ports {
        wait_for("every node to serve", Duration::from_secs(30), || {
            Client::connect_to("127.0.0.1", port).ok().map(|_| ())
        })?;
        if let Err(e) = check_acks(port, "b:", &acked) {
            eprintln!("node {id}: {e}");
            lost += 1;
        }
        if let Err(e) = check_preload(port, a.preload, a.preload_value_bytes) {
            eprintln!("node {id}: {e}");
            lost += 1;
        }
    }
    let second = Duration::from_secs(1);
    let failovers: Vec<FailoverFigures> = kills
        .iter()
        .zip(phases)
        .map(|(&Kill { killed, new: new_primary, at, unavailable, every_client, rejoin, first_after }, phases)| {
            let before = rate_between(&acked, at.checked_sub(second).unwrap_or(start).max(start), at);
            let after = rate_between(&acked, first_after, (first_after + second).min(end));
            FailoverFigures {
                killed,
                new_primary,
                at_s: at.duration_since(start).as_secs_f64(),
                unavailable_ms: unavailable,
                unavailable_every_client_ms: every_client,
                rejoin_ms: rejoin,
                writes_per_s_before: before,
                writes_per_s_after: after,
                after_over_before: if before > 0.0 { after / before } else { 0.0 },
                phases,
            }
        })
        .collect();
    let mut unavailable: Vec<f64> = failovers.iter().map(|f| f.unavailable_ms).collect();
    unavailable.sort_by(f64::total_cmp);
    let mut every_client: Vec<f64> = failovers.iter().map(|f| f.unavailable_every_client_ms).collect();
    every_client.sort_by(f64::total_cmp);
    let fig = Figures {
        bench: "failover",
        clients: a.clients,
        policy: a.policy.clone(),
        workers: a.workers,
        failure_timeout_ms: a.failure_timeout_ms,
        tls_between_nodes: a.tls,
        bucket_ms: BUCKET_MS,
        preload_keys: a.preload,
        preload_value_bytes: a.preload_value_bytes,
        preload_seconds,
        kind: if a.switchover { "switchover" } else { "sigkill" },
        unavailable_ms_p50: quantile(&unavailable, 0.5),
        unavailable_ms_p99: quantile(&unavailable, 0.99),
        unavailable_ms_max: unavailable.last().copied().unwrap_or(0.0),
        unavailable_every_client_ms_p50: quantile(&every_client, 0.5),
        unavailable_every_client_ms_max: every_client.last().copied().unwrap_or(0.0),
        acknowledged_writes: acked.len(),
        nodes_lacking_writes: lost,
        backup_reads,
        backup_connections_lost,
        backup_read_ms_max,
        failovers,
        writes_per_s: rates(&acked, start, end),
    };
    print(&fig);
    if let Some(path) = &a.plot {
        plot(&fig, path)?;
        println!("plot: {}", path.display());
    }
    if a.json {
        println!("{}", serde_json::to_string(&fig)?);
    }
    if lost > 0 {
        return Err(format!("{lost} node(s) lack acknowledged writes").into());
    }
    Ok(())
}

fn print(f: &Figures) {
    println!(
        "{} under load: 3 nodes{}, {} clients, policy {}, failure timeout {} ms, {} keys preloaded",
        if f.kind == "switchover" { "switchover" } else { "failover (SIGKILL)" },
        if f.tls_between_nodes { " (TLS between them)" } else { "" },
        f.clients,
        f.policy,
        f.failure_timeout_ms,
        f.preload_keys
    );
    println!(
        "{:>3} {:>7} {:>7} {:>8} {:>14} {:>13} {:>10} {:>14} {:>13} {:>7}",
        "#",
        "old",
        "new",
        "at s",
        "unavailable ms",
        "every client",
        "rejoin ms",
        "writes/s before",
        "writes/s after",
        "ratio"
    );
    for (i, x) in f.failovers.iter().enumerate() {
        println!(
            "{:>3} {:>7} {:>7} {:>8.2} {:>14.0} {:>13.0} {:>10.0} {:>14.0} {:>13.0} {:>7.2}",
            i + 1,
            x.killed,
            x.new_primary,
            x.at_s,
            x.unavailable_ms,
            x.unavailable_every_client_ms,
            x.rejoin_ms,
            x.writes_per_s_before,
            x.writes_per_s_after,
            x.after_over_before
        );
    }
    println!("where each failover's time went (ms; as the new primary's node saw it):");
    println!(
        "{:>3} {:>7} {:>7} {:>8} {:>8} {:>20} {:>6} {:>6} {:>10} {:>6}",
        "#", "start", "open", "reports", "prepare", "role change", "role", "lease", "following", "rest"
    );
    for (i, x) in f.failovers.iter().enumerate() {
        match &x.phases {
            Some(p) => println!(
                "{:>3} {:>7.0} {:>7} {:>8} {:>8} {:>20} {:>6} {:>6} {:>10} {:>6.0}",
                i + 1,
                p.detect_ms,
                p.open_ms,
                p.reports_ms,
                p.prepare_ms,
                p.role_change,
                p.role_change_ms,
                p.lease_wait_ms,
                p.backups_following_ms.map_or("-".into(), |f| format!("{f:.0}")),
                p.rest_ms
            ),
            None => println!("{:>3} (not said)", i + 1),
        }
    }
    println!(
        "unavailable: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} failovers (to the first write on the new primary); to every client's: p50 {:.0} ms, max {:.0} ms",
        f.unavailable_ms_p50,
        f.unavailable_ms_p99,
        f.unavailable_ms_max,
        f.failovers.len(),
        f.unavailable_every_client_ms_p50,
        f.unavailable_every_client_ms_max
    );
    println!(
        "{} acknowledged writes, {} on every node ({})",
        f.acknowledged_writes,
        if f.nodes_lacking_writes == 0 { "all" } else { "NOT all" },
        if f.nodes_lacking_writes == 0 { "none lost" } else { "LOST" }
    );
    if let (Some(r), Some(l), Some(m)) = (f.backup_reads, f.backup_connections_lost, f.backup_read_ms_max) {
        println!("a backup's client: {r} reads, {l} connections lost to a failover, slowest read {m:.1} ms");
    }
}

/// Writes per second over time, a vertical line at each kill.
fn plot(f: &Figures, path: &std::path::Path) -> Result<(), Error> {
    use plotters::prelude::*;
    let secs = |i: usize| i as f64 * BUCKET_MS as f64 / 1000.0;
    let x_max = secs(f.writes_per_s.len()).max(0.1);
    let y_max = f.writes_per_s.iter().copied().fold(0.0, f64::max).max(1.0) * 1.15;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let caption = format!(
        "ditto: writes/s around SIGKILLs of the primary (3 nodes, {} clients, {}, {} ms buckets)",
        f.clients, f.policy, BUCKET_MS
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .y_desc("acknowledged writes per second")
        .draw()
        .map_err(|e| e.to_string())?;
    let series = f.writes_per_s.iter().enumerate().map(|(i, &r)| (secs(i), r));
    chart.draw_series(LineSeries::new(series, &BLUE)).map_err(|e| e.to_string())?.label("writes/s");
    for x in &f.failovers {
        chart
            .draw_series(LineSeries::new([(x.at_s, 0.0), (x.at_s, y_max)], RED.stroke_width(1)))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failover's every-client figure waits for each client's first write on another
    /// node: a client still writing to the killed node's port, or not heard from since the
    /// kill, holds it; writes before the kill do not count.
    #[test]
    fn every_client_is_back_at_the_last_clients_first_write_elsewhere() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let (old, new) = (7001, 7002);
        let mut acks: Vec<Ack> = vec![(0, 1, at(5), old), (1, 1, at(6), old), (1, 2, at(8), new)];
        // The kill at 10 ms: client 1's write on the new port before it does not count.
        assert_eq!(every_client_back(&acks, 2, at(10), old), None);
        acks.push((0, 2, at(40), new));
        assert_eq!(every_client_back(&acks, 2, at(10), old), None, "client 1 not back yet");
        acks.push((1, 3, at(55), old)); // (a write the old port took: not back)
        assert_eq!(every_client_back(&acks, 2, at(10), old), None);
        acks.push((1, 4, at(90), new));
        acks.push((0, 3, at(95), new));
        assert_eq!(every_client_back(&acks, 2, at(10), old), Some(at(90)));
        // A third client never heard from holds it.
        assert_eq!(every_client_back(&acks, 3, at(10), old), None);
    }
}
