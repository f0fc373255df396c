//! `ditto server`: the Redis-protocol server (crates/server), configured by a TOML file
//! with command-line flags over it.

use std::path::PathBuf;

use ditto_server::config::ClientAddr;
use ditto_server::Config;

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// TCP port for clients (0: any free port; the bound one is printed).
    #[arg(long)]
    port: Option<u16>,
    /// Durable data directory (log and checkpoints); created if missing.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    bind: Option<String>,
    /// TOML config file (see docs/server.md); flags given here override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Engine workers (server threads, log streams) [default: cores - 1, at least 1].
    #[arg(long)]
    workers: Option<usize>,
    /// Durability: every-batch, interval or nosync [default: every-batch].
    #[arg(long)]
    durability: Option<String>,
    /// With interval or nosync: a stream writes at most once per this many ms [default: 10].
    #[arg(long)]
    fsync_interval_ms: Option<u64>,
    /// The time slice in us that the threads on a commit's path ask for (Linux 6.12+), so
    /// that a busy core runs them soon once woken (lower commit latency and backup lag, less
    /// throughput on saturated cores); 0: the kernel's default [default: 0].
    #[arg(long)]
    commit_thread_slice_us: Option<u64>,
    /// The time slice in us that a primary's replication links and ack readers ask for
    /// (Linux 6.12+), as --commit-thread-slice-us; 0: the kernel's default [default: 300].
    #[arg(long)]
    link_thread_slice_us: Option<u64>,
    /// Prometheus endpoint host:port, or "off" [default: 127.0.0.1:9379].
    #[arg(long)]
    metrics: Option<String>,
    /// Also serve TLS clients on this port (0: any free port); needs --tls-cert-file and
    /// --tls-key-file.
    #[arg(long)]
    tls_port: Option<u16>,
    /// PEM certificate chain for TLS.
    #[arg(long)]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long)]
    tls_key_file: Option<PathBuf>,
    /// PEM CA certificates that client certificates must chain to (mutual TLS).
    #[arg(long)]
    tls_ca_cert_file: Option<PathBuf>,
    /// Require client certificates signed by --tls-ca-cert-file.
    #[arg(long)]
    tls_auth_clients: bool,
    /// Serve TLS only (no plaintext port).
    #[arg(long)]
    tls_only: bool,
    /// TLS on replication links (a backup dials its primary with TLS; a primary takes only
    /// TLS backups): both show --tls-cert-file and check the other's against
    /// --tls-ca-cert-file.
    #[arg(long)]
    tls_replication: bool,
    /// TLS on a cluster node's control port, between nodes and from `ditto cluster`, with
    /// the same files.
    #[arg(long)]
    tls_cluster: bool,
    /// Refuse writes that may grow the data with -OOM while the memory in use is over this:
    /// a size such as 4gb or 512mb, 0 for no limit, or auto (3/4 of the machine's or the
    /// cgroup's memory) [default: auto].
    #[arg(long)]
    maxmemory: Option<String>,
    /// Run as a backup (hot standby) of the primary whose replication port is HOST:PORT:
    /// joins it (a checkpoint, or the log above what this node holds), replays its log,
    /// serves reads at a consistent, fresh read view and refuses writes.
    #[arg(long, value_name = "HOST:PORT")]
    replica_of: Option<String>,
    /// Serve a backup's data directory as a standalone primary: everything it holds (its
    /// checkpoint and its replica log), in an epoch above the one it followed. For a
    /// backup whose primary is gone, or that kept commits its restarted primary lost.
    /// Nothing fences the old primary: stop it first.
    #[arg(long)]
    promote: bool,
    /// On a primary: accept backups on this port (0: any free one; the bound one is printed).
    #[arg(long)]
    repl_port: Option<u16>,
    /// When a write is acknowledged: local, majority, all (each -durable or -received)
    /// [default: local].
    #[arg(long)]
    commit_policy: Option<String>,
    /// Backups the commit policy counts (a missing one holds nothing) [default: 0].
    #[arg(long)]
    backups: Option<usize>,
    /// On a backup: serial, parallel or dependency (KuaFu; dependency:N for a barrier every N
    /// transactions, 0 for none), each with an optional `+shared` (values point into the
    /// received batch: log-as-database) [default: parallel].
    #[arg(long)]
    replay: Option<String>,
    /// Run as node N of a cluster that fails over by itself (docs/cluster.md): this process
    /// runs the node's control plane and starts the server as primary or backup as the
    /// cluster decides. Needs --members; --data-dir holds the node's control and data.
    #[arg(long, value_name = "N", requires = "members")]
    node_id: Option<u64>,
    /// The cluster's members: ID=HOST:CLIENT_PORT/REPL_PORT/CONTROL_PORT[/TLS_PORT], comma separated
    /// (every node is given the same list).
    #[arg(long, value_name = "LIST")]
    members: Option<String>,
    /// A cluster node that joins a running cluster: it starts with no say in the control
    /// plane and waits to be added (`ditto cluster add`), then copies the primary's data.
    /// --members names the cluster's members and this node. Only read on its first start.
    #[arg(long, requires = "node_id")]
    join: bool,
    /// A cluster node: a file holding the cluster's secret (16 to 1024 bytes of text, the
    /// file readable by its owner alone; `openssl rand -base64 32`). Its control port then
    /// takes connections only from nodes and `ditto cluster` commands that show it, and
    /// its servers' replication ports only backups that show it (docs/cluster.md, "The
    /// cluster secret"). Every node is given the same.
    #[arg(long, value_name = "FILE", requires = "node_id")]
    cluster_secret_file: Option<PathBuf>,
    /// A cluster node: a file of another secret it takes (but does not show) while the
    /// cluster's secret is rotated; at most 3 (docs/cluster.md, "Rotating the secret").
    #[arg(long, value_name = "FILE", requires = "cluster_secret_file")]
    cluster_secret_also_file: Vec<PathBuf>,
    /// A cluster node whose members name hosts other than loopback, run without a
    /// cluster secret: any process that reaches its control or replication port may
    /// change the membership, hand the primary's role away or take a copy of the data
    /// as a backup. (Its client port takes the config file's requirepass either way.)
    #[arg(long, requires = "node_id", conflicts_with = "cluster_secret_file")]
    cluster_insecure: bool,

    /// A cluster node: the primary is failed over once not heard from for this long
    /// [default: 250].
    #[arg(long)]
    failure_timeout_ms: Option<u64>,
    /// A cluster node: how a backup becomes the primary at a failover. `in-place` keeps
    /// its server and engine (it replays up to the recovery point and serves); `restart`
    /// starts a new server that recovers the engine from the directory (slower with data;
    /// for comparison). In-place falls back to a restart where it cannot be done.
    #[arg(long, value_parser = ["in-place", "restart"], default_value = "in-place")]
    promotion: String,
    /// A cluster node: how long its server is given to stop, or to answer its fence at a
    /// failover, before it is killed (a server that hangs, its disk stalled, say). Below a
    /// backup's own 10 s bound on making what it received durable, a kill may cut that
    /// short [default: 15000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1000..=60_000))]
    server_stop_timeout_ms: Option<u64>,
    /// Set by a cluster node for its server: the epoch it serves.
    #[arg(long, hide = true)]
    run_epoch: Option<u64>,
    /// Set by a cluster node for its primary: commit timestamps start above this.
    #[arg(long, hide = true)]
    ts_above: Option<u64>,
    /// Set by a cluster node: recover at most up to this timestamp.
    #[arg(long, hide = true)]
    recover_upto: Option<u64>,
    /// Set by a cluster node for its primary: the epoch that --recover-upto cut.
    #[arg(long, hide = true)]
    resume_epoch: Option<u64>,
    /// Set by a cluster node for its primary promoted from a backup's directory that
    /// followed an older epoch than --resume-epoch: EPOCH:TS for that epoch and each after
    /// it before --resume-epoch, the points failovers cut them at (their batches above are
    /// not replayed).
    #[arg(long, hide = true, value_parser = parse_epoch_cut, value_delimiter = ',')]
    epoch_cuts: Vec<ditto_log::replica::EpochCut>,
    /// Set by a cluster node for a backup: where the primary takes clients' writes.
    #[arg(long, hide = true)]
    primary_addr: Option<String>,
    /// With `--primary-addr`: where the primary takes TLS clients' writes, where its
    /// member names a TLS port.
    #[arg(long, hide = true)]
    primary_tls_addr: Option<String>,
    /// Set by a cluster node: the name its backups give their primary (its client
    /// address in the control state), by which a primary counts them.
    #[arg(long, hide = true)]
    replica_name: Option<String>,
    /// Set by a cluster node for its primary: the membership configuration that --backups
    /// counts.
    #[arg(long, hide = true)]
    members_config: Option<u64>,
    /// Exit at once when standard input closes (a cluster node's server dies with it).
    #[arg(long, hide = true)]
    exit_with_stdin: bool,
    /// Set by a cluster node for a backup that may change its role in place: replay only
    /// what the primary released.
    #[arg(long, hide = true)]
    hold_replay: bool,
    /// Set by a cluster node for the backup of a learner: its primary counts it in no
    /// quorum.
    #[arg(long, hide = true)]
    learner: bool,
    /// Pre-fault this many MiB of heap before serving (the benchmarks' cluster runs give
    /// their backups what the primary pre-faulted; see memory.rs).
    #[arg(long, hide = true)]
    prefault_mib: Option<u64>,
    /// Started by a cluster node that turned transparent huge pages off for itself (and so
    /// for this process, which inherited that): turn them on again (memory.rs, `thp_back`).
    #[arg(long, hide = true)]
    thp_back: bool,
}

pub fn run(a: ServerArgs) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(id) = a.node_id {
        return run_node(id, a);
    }
    if a.thp_back {
        crate::memory::thp_back();
    }
    let gate = std::sync::Arc::new(ditto_server::session::WriteGate::default());
    if a.exit_with_stdin {
        // A cluster node's server: its supervisor opens and closes the write gate with
        // lines on standard input ("writes on", "writes until MS", "writes off WHY"; a new primary starts
        // closed until the supervisor has heard a quorum of the cluster) and says what the
        // cluster looks like ("cluster [[name, value], ...]", for INFO cluster) and how
        // many backups a primary's quorum counts ("backups N CONFIG", as members come and
        // go); "stop" is its fence (as SIGTERM, but one that a server still starting
        // honours once it serves, so a backup drains what it acknowledged).
        if a.run_epoch.is_some() {
            gate.set(Some(
                "this node is the cluster's new primary and has not heard a quorum of the cluster yet".into(),
            ));
        }
        let g = std::sync::Arc::clone(&gate);
        std::thread::spawn(move || {
            let mut input = std::io::stdin().lock();
            let mut buf = String::new();
            loop {
                buf.clear();
                // A last line without its newline is one the node was writing when it
                // died (its writes are non-blocking, and may be partial): not acted on.
                match std::io::BufRead::read_line(&mut input, &mut buf) {
                    Ok(n) if n > 0 && buf.ends_with('\n') => {}
                    _ => break,
                }
                let line = buf.trim_end_matches(['\n', '\r']).to_string();
                match line.trim().split_once(' ').unwrap_or((line.trim(), "")) {
                    ("stop", "") => g.request_stop(),
                    // A backup's fence that keeps it serving reads, and its promotion in
                    // place (docs/cluster.md, "In-place promotion and following").
                    ("fence", "") => g.request_role(ditto_server::session::RoleRequest::Fence),
                    // A learner promoted: its backup is counted from now on.
                    ("count", "") => g.request_role(ditto_server::session::RoleRequest::CountInQuorum),
                    ("promote", rest) => match parse_promote(rest) {
                        Some(r) => {
                            g.set(Some(
                                "this node is the cluster's new primary and has not heard a quorum of the cluster yet"
                                    .into(),
                            ));
                            g.request_role(r);
                        }
                        None => tracing::warn!("unreadable line from the cluster node: {line:?}"),
                    },
                    // `follow REPL_ADDR CLIENT_ADDR POINT [TLS_CLIENT_ADDR]`
                    ("follow", rest) => match rest.split_whitespace().collect::<Vec<_>>()[..] {
                        [primary, primary_addr, upto, ref tls @ ..]
                            if upto.parse::<u64>().is_ok() && tls.len() <= 1 =>
                        {
                            g.request_role(ditto_server::session::RoleRequest::Follow {
                                primary: primary.to_string(),
                                primary_addr: ClientAddr::new(primary_addr, tls.first().map(|t| t.to_string())),
                                upto: upto.parse().expect("checked"),
                            })
                        }
                        _ => tracing::warn!("unreadable line from the cluster node: {line:?}"),
                    },
                    // A switchover: `drain TARGET_CLIENT_ADDR WITHIN_MS [TARGET_TLS_ADDR]`, and
                    // `drain off` when it is given up (RoleRequest::Drain).
                    ("drain", "off") => g.end_drains(),
                    ("drain", rest) => match rest.split_whitespace().collect::<Vec<_>>()[..] {
                        [target, ms, ref tls @ ..] if ms.parse::<u64>().is_ok() && tls.len() <= 1 => {
                            g.request_role(ditto_server::session::RoleRequest::Drain {
                                target: ClientAddr::new(target, tls.first().map(|t| t.to_string())),
                                within: std::time::Duration::from_millis(ms.parse().expect("checked")),
                            })
                        }
                        _ => tracing::warn!("unreadable line from the cluster node: {line:?}"),
                    },
                    ("writes", "on") => g.set(None),
                    // `writes until MS`: taken until the shared monotonic clock reaches MS (a
                    // primary's lease), refused after by the server itself.
                    ("writes", rest) if rest.starts_with("until ") => match rest[6..].trim().parse::<u64>() {
                        Ok(ms) => g.open_until(ms),
                        Err(_) => tracing::warn!("unreadable line from the cluster node: {line:?}"),
                    },
                    ("writes", why) if why.starts_with("off") => g.set(Some(why[3..].trim().to_string())),
                    // `backups N CONFIG [CLIENT_ADDR,...]`: the others' addresses, whose
                    // backups alone count.
                    ("backups", rest) => {
                        let w: Vec<&str> = rest.split_whitespace().collect();
                        // (None named with none counted: the set is empty, not unknown.)
                        let nodes = match (w.first(), w.get(2)) {
                            (_, Some(a)) => Some(a.split(',').map(str::to_string).collect::<Vec<_>>()),
                            (Some(&"0"), None) => Some(Vec::new()),
                            _ => None,
                        };
                        match (w.first().map(|n| n.parse::<u64>()), w.get(1).map(|c| c.parse::<u64>())) {
                            (Some(Ok(n)), Some(Ok(config))) if w.len() <= 3 => g.set_backups(n as usize, config, nodes),
                            _ => tracing::warn!("unreadable line from the cluster node: {line:?}"),
                        }
                    }
                    ("cluster", json) => match serde_json::from_str::<Vec<(String, String)>>(json) {
                        Ok(fields) => g.set_cluster_info(fields),
                        Err(e) => tracing::warn!("cluster info from the node: {e}"),
                    },
                    _ => tracing::warn!("unknown line from the cluster node: {line:?}"),
                }
            }
            // The node that started this server is gone: so is the server (a crash).
            std::process::exit(137);
        });
    }
    let mut cfg = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(p) = a.port {
        cfg.port = p;
    }
    if let Some(d) = a.data_dir {
        cfg.data_dir = Some(d);
    }
    if let Some(b) = a.bind {
        cfg.bind = b;
    }
    if let Some(w) = a.workers {
        cfg.workers = w;
    }
    if let Some(d) = a.durability {
        cfg.durability = d;
    }
    if let Some(ms) = a.fsync_interval_ms {
        cfg.fsync_interval_ms = ms;
    }
    if let Some(us) = a.commit_thread_slice_us {
        cfg.commit_thread_slice_us = us;
    }
    if let Some(us) = a.link_thread_slice_us {
        cfg.link_thread_slice_us = us;
    }
    if let Some(m) = a.metrics {
        cfg.metrics = m;
    }
    if a.tls_port.is_some() {
        cfg.tls_port = a.tls_port;
    }
    if let Some(f) = a.tls_cert_file {
        cfg.tls_cert_file = Some(f);
    }
    if let Some(f) = a.tls_key_file {
        cfg.tls_key_file = Some(f);
    }
    if let Some(f) = a.tls_ca_cert_file {
        cfg.tls_ca_cert_file = Some(f);
    }
    if let Some(m) = a.maxmemory {
        cfg.maxmemory = ditto_server::config::MaxMemory::Text(m);
    }
    if a.replica_of.is_some() {
        cfg.replica_of = a.replica_of;
    }
    cfg.promote = a.promote;
    if a.repl_port.is_some() {
        cfg.repl_port = a.repl_port;
    }
    if let Some(p) = a.commit_policy {
        cfg.commit_policy = p;
    }
    if let Some(n) = a.backups {
        cfg.backups = n;
    }
    if let Some(r) = a.replay {
        cfg.replay = r;
    }
    if let Some(epoch) = a.run_epoch {
        cfg.cluster = Some(ditto_server::config::ClusterRun {
            epoch,
            ts_above: a.ts_above.unwrap_or(0),
            upto: a.recover_upto,
            resume_epoch: a.resume_epoch,
            epoch_cuts: a.epoch_cuts,
            primary_addr: None,
            members_config: a.members_config.unwrap_or(0),
            hold_replay_at_release: false,
            learner: false,
        });
    } else if a.recover_upto.is_some() || a.primary_addr.is_some() {
        // A cluster's backup: its cut, and where its primary takes writes.
        cfg.cluster = Some(ditto_server::config::ClusterRun {
            upto: a.recover_upto,
            primary_addr: a.primary_addr.map(|p| ClientAddr::new(p, a.primary_tls_addr)),
            hold_replay_at_release: a.hold_replay,
            learner: a.learner,
            ..Default::default()
        });
    }
    // A cluster node's server: the cluster secret, from the node that started it (in its
    // environment, which only its user can read, as the node holds it: not re-read from
    // a file that may have changed since).
    // Without one, a cluster with `requirepass` asks it on its links (its servers share
    // one config file), as a standalone primary asks its backups for theirs.
    if a.exit_with_stdin {
        // One per line: the one shown first, then those also taken (a rotation).
        let mut given = std::env::var(crate::node::LINK_SECRET_ENV)
            .ok()
            .into_iter()
            .flat_map(|v| v.lines().map(str::to_string).collect::<Vec<_>>());
        cfg.link_secret = given.next().or_else(|| cfg.requirepass.clone());
        cfg.link_secret_also = given.collect();
    }
    cfg.used_memory = Some(ditto_server::memory::allocated_bytes);
    cfg.write_gate = Some(gate);
    cfg.replica_name = a.replica_name;
    cfg.tls_auth_clients |= a.tls_auth_clients;
    cfg.tls_only |= a.tls_only;
    cfg.tls_replication |= a.tls_replication;
    cfg.tls_cluster |= a.tls_cluster;
    if let Some(mib) = a.prefault_mib {
        let p = crate::memory::prefault(mib, cfg.workers.max(1));
        eprintln!("pre-faulted {} MiB of heap in {:.1} s", p.mib, p.took.as_secs_f64());
    }
    let durability = cfg.durability()?.name();
    ditto_server::run(cfg, |l| {
        // Tests and scripts wait for these lines; the plaintext one comes first. Printed
        // again at each change of role (a backup joining its primary again, say), when
        // whoever started the server may have stopped reading: a closed standard output
        // must not end the server (`println!` panics on it): `say!` ignores errors.
        if let Some(a) = l.plain {
            ditto_server::say!("ditto server listening on {a} ({durability})");
        }
        if let Some(a) = l.tls {
            ditto_server::say!("ditto server listening for TLS on {a} ({durability})");
        }
        if let Some(a) = l.repl {
            ditto_server::say!("ditto server accepting backups on {a}");
        }
    })?;
    Ok(())
}

/// `EPOCH:TS` (`--epoch-cuts`).
fn parse_epoch_cut(s: &str) -> Result<ditto_log::replica::EpochCut, String> {
    let bad = || format!("{s:?}: expected EPOCH:TS");
    let (e, t) = s.split_once(':').ok_or_else(bad)?;
    let (epoch, point) = (e.parse().map_err(|_| bad())?, t.parse().map_err(|_| bad())?);
    Ok(ditto_log::replica::EpochCut { epoch: ditto_log::Epoch(epoch), point: ditto_engine::Ts(point) })
}

/// `promote EPOCH TS_ABOVE UPTO RESUME_EPOCH MEMBERS_CONFIG REPL_PORT BACKUPS` from a
/// cluster node (node.rs).
fn parse_promote(rest: &str) -> Option<ditto_server::session::RoleRequest> {
    let v: Vec<u64> = rest.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    let [epoch, ts_above, upto, resume_epoch, members_config, repl_port, backups] = v[..] else { return None };
    Some(ditto_server::session::RoleRequest::Promote {
        run: ditto_server::config::ClusterRun {
            epoch,
            ts_above,
            upto: Some(upto),
            resume_epoch: Some(resume_epoch),
            // (A backup promoted in place followed the recovered epoch itself.)
            epoch_cuts: Vec::new(),
            primary_addr: None,
            members_config,
            hold_replay_at_release: false,
            learner: false,
        },
        repl_port: u16::try_from(repl_port).ok()?,
        backups: backups as usize,
    })
}

/// `ditto server --node-id N`: the node's supervisor (node.rs). The flags that shape the
/// server pass through to every server it starts.
fn run_node(id: u64, a: ServerArgs) -> Result<(), Box<dyn std::error::Error>> {
    let members = crate::node::parse_members(a.members.as_deref().unwrap_or_default())?;
    let dir = a.data_dir.clone().ok_or("a cluster node needs --data-dir")?;
    if a.replica_of.is_some() || a.repl_port.is_some() || a.port.is_some() {
        return Err("a cluster node takes its ports from --members (not --port, --repl-port or --replica-of)".into());
    }
    // Its supervisor probes each server it starts over the plaintext client port, without
    // a password, and gives it its ports and role itself.
    let file = a.config.as_deref().map(Config::load).transpose()?;
    if a.tls_only || file.as_ref().is_some_and(|c| c.tls_only) {
        return Err("a cluster node's server needs its plaintext client port (its supervisor probes it there): tls_only is not supported with --node-id".into());
    }
    // Every server the node starts serves TLS on the same port, so that clients find it
    // again after a change of role by a restart: a fixed port, not 0.
    if a.tls_port.or(file.as_ref().and_then(|c| c.tls_port)) == Some(0) {
        return Err("a cluster node's TLS port must be fixed (its servers are started again at changes of role, and clients must find them): tls_port 0 is not supported with --node-id".into());
    }
    // The TLS settings and files are checked here, once, with a clear error: a server that
    // could not load them would fail at every start the node makes.
    let mut tls = file.clone().unwrap_or_default();
    tls.tls_port = a.tls_port.or(tls.tls_port);
    // The TLS port its member names (`/TLS_PORT` in --members) is the one its servers
    // serve on, and the one other nodes name to TLS clients (SENTINEL, READONLY).
    let named_tls = members.get(&id).map(|m| m.tls).filter(|&t| t != 0);
    match (named_tls, tls.tls_port) {
        (Some(n), Some(p)) if n != p => {
            return Err(format!("--members names TLS port {n} for node {id}, but its TLS port is set to {p}").into())
        }
        (Some(n), None) => tls.tls_port = Some(n),
        (None, Some(p)) => tracing::warn!(
            "this node serves TLS on port {p}, but its member in --members names no TLS port (ID=HOST:CLIENT/REPL/CONTROL/TLS): nodes tell TLS clients the plaintext address of the primary"
        ),
        _ => {}
    }
    tls.tls_cert_file = a.tls_cert_file.clone().or(tls.tls_cert_file);
    tls.tls_key_file = a.tls_key_file.clone().or(tls.tls_key_file);
    tls.tls_ca_cert_file = a.tls_ca_cert_file.clone().or(tls.tls_ca_cert_file);
    tls.tls_auth_clients |= a.tls_auth_clients;
    if let (Some(p), Some(me)) = (tls.tls_port, members.get(&id)) {
        if [me.client, me.repl, me.control].contains(&p) {
            return Err(format!("the TLS port {p} is one of this node's own ports in --members").into());
        }
    }
    tls.tls_replication |= a.tls_replication;
    tls.tls_cluster |= a.tls_cluster;
    if let Some(files) = tls.tls()? {
        ditto_server::tls::server_config(&files)?;
    }
    // Both links or neither: a failover's fetch carries log batches over the control
    // port, and the replication links carry the rest.
    if tls.tls_replication != tls.tls_cluster {
        return Err(format!(
            "a cluster node needs tls_replication and tls_cluster both, or neither (it has {}): a failover's fetch carries the log over the control port, and the replication links the rest",
            if tls.tls_replication { "tls_replication alone" } else { "tls_cluster alone" }
        )
        .into());
    }
    let handshake = std::time::Duration::from_secs(tls.tls_handshake_timeout_s);
    let node_tls = tls.node_tls()?.map(|f| ditto_replication::tls::LinkTls::new(&f, handshake)).transpose()?;
    // (Its servers check the same files for their replication links.)
    let control_tls = node_tls.filter(|_| tls.tls_cluster);
    if let Some(c) = &file {
        if c.replica_of.is_some() || c.repl_port.is_some() {
            return Err("a cluster node takes its ports and role from --members and its control plane: the config file may not set replica_of or repl_port".into());
        }
    }
    let mut child_args = Vec::new();
    let mut pass = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            child_args.extend([format!("--{k}"), v]);
        }
    };
    let config_path = a.config.clone();
    pass("config", a.config.map(|p| p.display().to_string()));
    pass("durability", a.durability);
    pass("fsync-interval-ms", a.fsync_interval_ms.map(|v| v.to_string()));
    pass("commit-thread-slice-us", a.commit_thread_slice_us.map(|v| v.to_string()));
    pass("link-thread-slice-us", a.link_thread_slice_us.map(|v| v.to_string()));
    pass("metrics", Some(a.metrics.unwrap_or_else(|| "off".into())));
    pass("maxmemory", a.maxmemory);
    pass("replay", a.replay);
    pass("tls-port", tls.tls_port.map(|p| p.to_string()));
    pass("tls-cert-file", a.tls_cert_file.map(|p| p.display().to_string()));
    pass("tls-key-file", a.tls_key_file.map(|p| p.display().to_string()));
    pass("tls-ca-cert-file", a.tls_ca_cert_file.map(|p| p.display().to_string()));
    if a.tls_auth_clients {
        child_args.push("--tls-auth-clients".into());
    }
    if a.tls_replication {
        child_args.push("--tls-replication".into());
    }
    if a.tls_cluster {
        child_args.push("--tls-cluster".into());
    }
    // Read and checked here, once, with a clear error; each server the node starts is
    // given it for its replication links (`node::LINK_SECRET_ENV`).
    let secret = a
        .cluster_secret_file
        .as_deref()
        .map(|f| ditto_cluster::ClusterSecret::load(f, &a.cluster_secret_also_file))
        .transpose()?;
    if secret.is_none() && !a.cluster_insecure {
        if let Some(m) = members.values().find(|m| !crate::node::is_loopback(&m.host)) {
            return Err(format!(
                "--members names host {} and no --cluster-secret-file is given: any process that reaches a node's control port could change the membership or hand the primary's role away, and one that reaches its replication port could take a copy of the data as a backup. Give every node and `ditto cluster` the same --cluster-secret-file, or run without one with --cluster-insecure",
                m.host
            )
            .into());
        }
    }
    let policy = a.commit_policy.unwrap_or_else(|| "majority-durable".into());
    ditto_replication::CommitPolicy::parse(&policy)?;
    let failure = a.failure_timeout_ms.unwrap_or(250);
    // The flag, else the config file's (which its servers are also given, but the flag
    // the node passes them wins: before 2026-12-05 a file's `workers` was overridden by
    // the default), else the server's default.
    let workers = a.workers.or(file.as_ref().map(|c| c.workers)).unwrap_or_else(ditto_server::config::default_workers);
    // (The servers it starts turn them on again: `--thp-back`.)
    crate::memory::thp_off_for_the_node();
    crate::node::run(crate::node::NodeConfig {
        id,
        members,
        dir,
        child_args,
        workers,
        policy,
        timeouts: ditto_cluster::Timeouts { failure, resend: 50, prepare: 5000, start: 20_000 },
        tick: std::time::Duration::from_millis(10),
        join: a.join,
        promote_in_place: a.promotion == "in-place",
        stop_timeout: a.server_stop_timeout_ms.map_or(crate::node::STOP_TIMEOUT, std::time::Duration::from_millis),
        secret,
        control_tls,
        // Its servers read the same file: their clients must AUTH, and so does its probe.
        password: file.as_ref().and_then(|c| c.requirepass.clone()),
        config_file: config_path,
    })
}
