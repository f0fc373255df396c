//! The fourth part of `ditto demo`: automatic failover. Three `ditto server --node-id`
//! nodes (each a supervisor running the Raft control plane and its server), commit policy
//! `majority-durable`; a client writes without pause and follows whichever node takes
//! writes; the primary's node is killed with SIGKILL, the others elect a new primary, the
//! client goes on there, and the killed node comes back as a backup. Repeated; then every
//! acknowledged write is checked on every node.
//!
//! ```text
//!  client --SET demo:w:<n>--> primary (node A) --log--> backups B, C
//!  SIGKILL A: B and C fence, report, recover to the epoch's point, open epoch e+1
//!  client --SET--> new primary (B or C); A restarts and rejoins as a backup
//! ```

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::demo_server::{Client, Reply};

type Error = Box<dyn std::error::Error + Send + Sync>;

pub struct FailoverDemo {
    failovers: usize,
    /// Reads on a backup's connection across the failovers: (reads, connections lost, the
    /// slowest read's ms).
    backup_reads: (u64, u64, f64),
    unavailable_ms: Vec<f64>,
    /// Where each failover's time went, as its new primary's node said.
    phases: Vec<Option<Phases>>,
    rejoin_ms: Vec<f64>,
    acked: usize,
    /// Acknowledged writes per 100 ms around the first kill (from 1 s before).
    timeline: Vec<usize>,
    /// The planned switchover after the kills: (from, to, writes refused ms, the old
    /// primary back as a backup ms).
    switchover: Option<(u64, u64, f64, f64)>,
    /// A fourth node added online: (ms from the request to its backup joined as a
    /// learner, ms from the promotion to its link counted by the primary).
    added: Option<(f64, f64)>,
    /// A request without the cluster secret, refused: why.
    secret_refusal: Option<String>,
    /// A request in plaintext to the nodes' TLS control ports, refused: why.
    tls_refusal: Option<String>,
}

/// A three-node cluster of `ditto server --node-id` processes on loopback (the demo's and
/// `ditto bench failover`'s), stopped when dropped.
pub(crate) struct Nodes {
    pub dir: std::path::PathBuf,
    pub members: String,
    pub ports: BTreeMap<u64, u16>,
    pub procs: BTreeMap<u64, Child>,
    pub workers: usize,
    pub policy: String,
    pub failure_timeout_ms: u64,
    /// The cluster secret every node is given (`--cluster-secret-file`), and its file:
    /// the nodes' control and replication ports take no one without it.
    pub secret: ditto_cluster::Secret,
    pub secret_file: std::path::PathBuf,
    /// TLS between the nodes (`--tls-replication --tls-cluster`) with certificates of a CA
    /// made for the run, and what an operator shows their control ports; `None`: plaintext.
    pub tls: Option<NodesTls>,
}

/// The demo's TLS between nodes: the files every node is given, and the operator's side.
pub(crate) struct NodesTls {
    pub pki: ditto_replication::tls::pki::Pki,
    pub link: std::sync::Arc<ditto_replication::tls::LinkTls>,
}

impl NodesTls {
    /// A CA made in `dir/pki`, and a certificate for 127.0.0.1 that every node shows.
    fn new(dir: &Path) -> Result<NodesTls, Error> {
        let at = dir.join("pki");
        std::fs::create_dir_all(&at)?;
        let pki = ditto_replication::tls::pki::make(&at);
        let link = ditto_replication::tls::LinkTls::from_paths(
            &pki.server_cert,
            &pki.server_key,
            &pki.ca,
            Duration::from_secs(5),
        )?;
        Ok(NodesTls { pki, link })
    }

    fn args(&self) -> Vec<String> {
        let f = |p: &std::path::PathBuf| p.display().to_string();
        let (p, mut v) = (&self.pki, vec!["--tls-replication".to_string(), "--tls-cluster".to_string()]);
        for (flag, file) in
            [("--tls-cert-file", &p.server_cert), ("--tls-key-file", &p.server_key), ("--tls-ca-cert-file", &p.ca)]
        {
            v.extend([flag.to_string(), f(file)]);
        }
        v
    }
}

/// A new cluster secret in `dir/cluster.secret`, readable by its owner alone: 32 random
/// bytes, hex (from the thread's generator, seeded from the operating system).
fn new_secret(dir: &Path) -> Result<(ditto_cluster::Secret, std::path::PathBuf), Error> {
    use rand::Rng;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let bytes: [u8; 32] = rand::thread_rng().gen();
    let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join("cluster.secret");
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    writeln!(f, "{text}")?;
    Ok((ditto_cluster::load_secret(&path)?, path))
}

impl Nodes {
    /// Three nodes on free ports, started, in `dir`; with TLS between them if `tls`. The
    /// ports lie below Linux's ephemeral range (32768 and up): a node killed and started
    /// again binds its ports anew, and a port of that range may meanwhile be the local end
    /// of some outgoing connection ("Address already in use").
    pub(crate) fn start_three(
        dir: &Path,
        workers: usize,
        policy: &str,
        failure_timeout_ms: u64,
        tls: bool,
    ) -> Result<Nodes, Error> {
        let p = ports_below_ephemeral(9)?;
        let members = (0..3)
            .map(|i| format!("{}=127.0.0.1:{}/{}/{}", i + 1, p[3 * i], p[3 * i + 1], p[3 * i + 2]))
            .collect::<Vec<_>>();
        let (secret, secret_file) = new_secret(dir)?;
        let mut nodes = Nodes {
            secret,
            secret_file,
            tls: if tls { Some(NodesTls::new(dir)?) } else { None },
            dir: dir.to_path_buf(),
            members: members.join(","),
            ports: (0..3).map(|i| (i as u64 + 1, p[3 * i])).collect(),
            procs: BTreeMap::new(),
            workers,
            policy: policy.to_string(),
            failure_timeout_ms,
        };
        for id in 1..=3 {
            nodes.start(id)?;
        }
        Ok(nodes)
    }

    pub(crate) fn start(&mut self, id: u64) -> Result<(), Error> {
        self.spawn(id, &[])
    }

    /// A new node `id` on free ports, started to join (`--join`: it waits, with no voters,
    /// to be added); returns its member spec.
    pub(crate) fn start_joining(&mut self, id: u64) -> Result<ditto_cluster::Member, Error> {
        let ls: Vec<TcpListener> = (0..3).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
        let p: Vec<u16> = ls.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<Result<_, _>>()?;
        drop(ls);
        self.members = format!("{},{id}=127.0.0.1:{}/{}/{}", self.members, p[0], p[1], p[2]);
        self.ports.insert(id, p[0]);
        self.spawn(id, &["--join"])?;
        Ok(ditto_cluster::Member { id, addr: format!("127.0.0.1:{}", p[0]), repl: p[1], control: p[2], tls: 0 })
    }

    fn spawn(&mut self, id: u64, extra: &[&str]) -> Result<(), Error> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("node{id}.log")))?;
        let child = Command::new(std::env::current_exe()?)
            .args(["server", "--node-id", &id.to_string(), "--members", &self.members])
            .args(["--data-dir", &self.dir.join(format!("n{id}")).display().to_string()])
            .args(["--workers", &self.workers.to_string(), "--commit-policy", &self.policy])
            .args(["--failure-timeout-ms", &self.failure_timeout_ms.to_string(), "--metrics", "off"])
            .args(["--cluster-secret-file", &self.secret_file.display().to_string()])
            .args(self.tls.as_ref().map(NodesTls::args).unwrap_or_default())
            .args(extra)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()?;
        self.procs.insert(id, child);
        Ok(())
    }

    /// What an operator shows the control ports: the nodes' TLS, if they have it.
    pub(crate) fn operator_tls(&self) -> Option<&ditto_replication::tls::LinkTls> {
        self.tls.as_ref().map(|t| &*t.link)
    }

    /// SIGKILL of node `id`'s supervisor (its server dies with it: a crash of the machine).
    pub(crate) fn kill(&mut self, id: u64) -> Result<(), Error> {
        let mut c = self.procs.remove(&id).ok_or("not running")?;
        let killed = c.kill();
        c.wait()?;
        Ok(killed?)
    }

    /// The control address of node `id` (from --members).
    pub(crate) fn control_addr(&self, id: u64) -> Option<std::net::SocketAddr> {
        let spec = self.members.split(',').find(|m| m.starts_with(&format!("{id}=")))?;
        let (host, ports) = spec.split_once('=')?.1.rsplit_once(':')?;
        format!("{host}:{}", ports.rsplit('/').next()?).parse().ok()
    }

    /// Asks the cluster (through node `via`'s control port, following the leader) to hand
    /// the primary's role to another node (`ditto cluster switchover`).
    pub(crate) fn switchover(&self, via: u64) -> Result<(), Error> {
        self.admin(via, ditto_cluster::AdminRequest::Switchover { to: None })
    }

    /// An operator's request (as `ditto cluster` sends it), through node `via`'s control
    /// port, following the leader and asking again while it is busy (bounded).
    pub(crate) fn admin(&self, via: u64, req: ditto_cluster::AdminRequest) -> Result<(), Error> {
        let mut at = self.control_addr(via).ok_or("no control address")?;
        for _ in 0..200 {
            match ditto_cluster::admin_request(
                &at.to_string(),
                &req,
                Some(&ditto_cluster::ClusterSecret::one(self.secret.clone())),
                self.operator_tls(),
            )? {
                ditto_cluster::AdminReply::Done { .. } => return Ok(()),
                ditto_cluster::AdminReply::NotLeader { addr: Some(a), .. } => at = a.parse()?,
                ditto_cluster::AdminReply::Refused(why) => return Err(format!("{req:?} refused: {why}").into()),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        Err(format!("{req:?} was not applied after 200 tries").into())
    }

    /// The primary's `INFO replication` line for node `id`'s backup, if it is connected.
    fn link_of(&self, primary: u64, id: u64) -> Option<String> {
        let info = self.role(primary)?;
        let addr = format!("node=127.0.0.1:{},", self.ports[&id]);
        info.lines().find(|l| l.starts_with("slave") && l.contains(&addr)).map(str::to_string)
    }

    /// Node `id`'s server's process id (`INFO server`).
    fn server_pid(&self, id: u64) -> Option<String> {
        info_field(&self.info(id, "server")?, "process_id").map(str::to_string)
    }

    /// The node that takes a write now.
    pub(crate) fn primary(&self) -> Option<u64> {
        self.procs.keys().copied().find(|id| {
            let Ok(mut c) = Client::connect_to("127.0.0.1", self.ports[id]) else { return false };
            matches!(c.call(&["SET", "demo:probe", "1"]), Ok(Reply::Simple(s)) if s == "OK")
        })
    }

    /// Whether node `id` runs as a backup with its link to the primary up.
    pub(crate) fn rejoined(&self, id: u64) -> bool {
        self.role(id).is_some_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
    }

    fn role(&self, id: u64) -> Option<String> {
        self.info(id, "replication")
    }

    fn info(&self, id: u64, section: &str) -> Option<String> {
        let mut c = Client::connect_to("127.0.0.1", self.ports[&id]).ok()?;
        match c.call(&["INFO", section]).ok()? {
            Reply::Bulk(Some(b)) => String::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// Where the newest failover's time went, as node `new` (its new primary) saw it:
    /// `killed_unix_ms` is when the old primary was killed (or the switchover asked),
    /// `unavailable_ms` from then to the first write the new primary acknowledged. Waits
    /// up to 3 s for the node to have recorded its server's change of role; `None` if it
    /// never does (the breakdown is then not printed, the failover's figure stands).
    pub(crate) fn phases(&self, new: u64, killed_unix_ms: f64, unavailable_ms: f64) -> Option<Phases> {
        let asked = Instant::now();
        wait_for("the failover's phases", Duration::from_secs(3), || {
            let info = self.info(new, "cluster")?;
            let mut p = Phases::parse(&info, killed_unix_ms, unavailable_ms)?;
            // The other running nodes: each a backup that followed the new primary. Best
            // effort: one that did not say it (restarted rather than followed in place, or
            // applied the failover from its disk) leaves the figure out, not the phases.
            let following = |id: u64| -> Option<f64> {
                let info = self.info(id, "cluster")?;
                let line = failover_line(&info, p.epoch)?;
                let num = |k: &str| failover_field(line, k)?.parse::<u64>().ok();
                let done = num("began_unix_ms")? + num("opened_after_ms")? + num("role_change_ms")?;
                Some(done as f64 - killed_unix_ms)
            };
            let others: Vec<Option<f64>> =
                self.procs.keys().filter(|&&id| id != new).map(|&id| following(id)).collect();
            match others.iter().all(Option::is_some) {
                true => p.backups_following_ms = others.into_iter().flatten().reduce(f64::max),
                // (Looked for again, for a second: a backup may still be joining.)
                false if asked.elapsed() < Duration::from_secs(1) => return None,
                false => {}
            }
            Some(p)
        })
        .ok()
    }
}

/// Where a failover's time went, from the new primary's node's `INFO cluster` (its line
/// `cluster_failover_<epoch>`, crates/ditto/src/node.rs), measured from the kill (or the
/// switchover's request) to the first write the new primary acknowledged. The phases
/// follow one another, but for the lease wait, which runs beside the change of role.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct Phases {
    pub epoch: u64,
    /// From the kill to the failover's start applied on the new primary's node: the
    /// failure detector's timeout, then a Raft commit (wall clocks of one machine).
    pub detect_ms: f64,
    /// The coordinator's rounds within the next phase: the survivors' tail reports,
    /// then the prepare (fences, fetches, the recovery point checked).
    pub reports_ms: u64,
    pub prepare_ms: u64,
    /// From the start to the new epoch's opening, applied on the new primary's node.
    pub open_ms: u64,
    /// How the new primary's server took the role (`promoted-in-place`, ...), and how long
    /// it took, as the server said.
    pub role_change: String,
    pub role_change_ms: u64,
    /// How long the opening told it to wait for older primaries' leases.
    pub lease_wait_ms: u64,
    /// From the kill until the last other running node's server followed the new primary
    /// (its own start, opening and change of role, as it said them): a commit under a
    /// policy counting backups is released only once they hold it.
    pub backups_following_ms: Option<f64>,
    /// What none of the above counts: the client finding the new primary, the gaps
    /// between the phases.
    pub rest_ms: f64,
}

impl Phases {
    fn parse(info: &str, killed_unix_ms: f64, unavailable_ms: f64) -> Option<Phases> {
        let epoch: u64 = info_field(info, "cluster_epoch")?.parse().ok()?;
        let line = failover_line(info, epoch)?;
        let num = |k: &str| failover_field(line, k)?.parse::<u64>().ok();
        let began_ms = num("began_unix_ms")?;
        let (open_ms, role_change_ms) = (num("opened_after_ms")?, num("role_change_ms")?);
        let lease_wait_ms = num("lease_wait_ms")?;
        let detect_ms = began_ms as f64 - killed_unix_ms;
        Some(Phases {
            epoch,
            detect_ms,
            reports_ms: num("reports_ms")?,
            prepare_ms: num("prepare_ms")?,
            open_ms,
            role_change: failover_field(line, "role_change")?.to_string(),
            role_change_ms,
            lease_wait_ms,
            backups_following_ms: None,
            rest_ms: unavailable_ms - detect_ms - (open_ms + role_change_ms.max(lease_wait_ms)) as f64,
        })
    }

    /// One line: the phases in order, each in ms.
    pub(crate) fn line(&self) -> String {
        let following = match self.backups_following_ms {
            Some(f) => format!(", the backup following it {f:.0} ms after the kill"),
            None => String::new(),
        };
        format!(
            "detected {:.0} ms after it, opened {} ms later (reports {}, prepare {}), {} in {} ms, lease wait {} ms{following}, the rest {:.0} ms",
            self.detect_ms,
            self.open_ms,
            self.reports_ms,
            self.prepare_ms,
            self.role_change.replace('-', " "),
            self.role_change_ms,
            self.lease_wait_ms,
            self.rest_ms
        )
    }
}

/// The value of `key` in an `INFO` text.
fn info_field<'a>(info: &'a str, key: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')).map(str::trim)
}

/// An `INFO cluster` text's line for the failover to `epoch` (`cluster_failover_<epoch>`).
fn failover_line(info: &str, epoch: u64) -> Option<&str> {
    info_field(info, &format!("cluster_failover_{epoch}"))
}

/// The value of field `key` (`key=value`, comma-separated) in such a line.
fn failover_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(',').find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
}

/// Now, in milliseconds since the Unix epoch (the nodes' `began_unix_ms` is on this clock).
pub(crate) fn unix_ms() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for (_, mut c) in std::mem::take(&mut self.procs) {
            // SAFETY: kill(2) on a child this process spawned and has not reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T, Error> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > end {
            return Err(format!("timed out after {limit:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One acknowledged write: client, sequence number, when, and the port that took it.
pub(crate) type Ack = (usize, u64, Instant, u16);
pub(crate) type Acks = Arc<Mutex<Vec<Ack>>>;

/// The key a writer's `n`th write sets (to `n`).
pub(crate) fn key(prefix: &str, client: usize, n: u64) -> String {
    format!("{prefix}{client}:{n}")
}

/// Where the primary is, as any node says (`SENTINEL get-master-addr-by-name ditto`).
fn discover(ports: &[u16]) -> Option<u16> {
    for &p in ports {
        let Ok(mut c) = Client::connect_to("127.0.0.1", p) else { continue };
        if let Ok(Reply::Array(Some(a))) = c.call(&["SENTINEL", "get-master-addr-by-name", "ditto"]) {
            if let Some(Reply::Bulk(Some(port))) = a.get(1) {
                if let Some(port) = std::str::from_utf8(port).ok().and_then(|s| s.parse().ok()) {
                    return Some(port);
                }
            }
        }
    }
    None
}

/// A client that writes without pause (`SET <prefix><client>:<n> <n>`, one at a time) and
/// follows the primary by itself: on an error or a `READONLY` it asks the nodes where the
/// primary is (`SENTINEL`) and goes there. Records every acknowledged write.
pub(crate) fn writer(client: usize, prefix: &'static str, ports: Vec<u16>, acks: Acks, stop: Arc<AtomicBool>) {
    let mut n = 0u64;
    let mut conn: Option<(Client, u16)> = None;
    let mut next = client;
    while !stop.load(Ordering::SeqCst) {
        if conn.is_none() {
            // Ask where the primary is; with no answer, try the nodes in turn.
            let port = discover(&ports).unwrap_or_else(|| {
                next += 1;
                ports[next % ports.len()]
            });
            match Client::connect_to("127.0.0.1", port) {
                Ok(c) => conn = Some((c, port)),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
            }
        }
        let (c, port) = conn.as_mut().expect("connected");
        n += 1;
        match c.call(&["SET", &key(prefix, client, n), &n.to_string()]) {
            Ok(Reply::Simple(s)) if s == "OK" => acks.lock().expect("acks").push((client, n, Instant::now(), *port)),
            _ => {
                conn = None; // READONLY from a backup, or a node going down
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// A read-only client of a backup on a thread of its own: one connection to the node it
/// is aimed at (the demo and `ditto bench failover` aim it at a backup before each
/// failover), reading DBSIZE without pause. Counts its reads, the connections it lost (an
/// error, or a close, on a node it did not leave: a backup keeps its clients' connections
/// through a failover, docs/cluster.md) and its slowest read.
pub(crate) struct BackupReader {
    target: Arc<Mutex<u16>>,
    /// Reads, connections lost, the slowest read's microseconds.
    counts: Arc<[AtomicU64; 3]>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BackupReader {
    /// Not reading until first aimed (`aim`); stops with `stop`.
    pub(crate) fn new() -> BackupReader {
        BackupReader { target: Arc::new(Mutex::new(0)), counts: Arc::default(), thread: None }
    }

    /// Reads on the node at `port` from now on (a move, not a lost connection).
    pub(crate) fn aim(&mut self, port: u16, stop: &Arc<AtomicBool>) {
        *self.target.lock().expect("target") = port;
        if self.thread.is_none() {
            let (target, counts, stop) = (Arc::clone(&self.target), Arc::clone(&self.counts), Arc::clone(stop));
            self.thread = Some(std::thread::spawn(move || read_backup(&target, &counts, &stop)));
        }
    }

    /// Once `stop` is set: (reads, connections lost, the slowest read in ms).
    pub(crate) fn finish(self) -> Result<(u64, u64, f64), Error> {
        if let Some(t) = self.thread {
            t.join().map_err(|_| "the backup's reader panicked")?;
        }
        let [r, l, m] = &*self.counts;
        Ok((r.load(Ordering::Relaxed), l.load(Ordering::Relaxed), m.load(Ordering::Relaxed) as f64 / 1e3))
    }
}

fn read_backup(target: &Mutex<u16>, counts: &[AtomicU64; 3], stop: &AtomicBool) {
    let [reads, lost, longest] = counts;
    let mut conn: Option<(Client, u16)> = None;
    while !stop.load(Ordering::SeqCst) {
        let want = *target.lock().expect("target");
        if conn.as_ref().is_none_or(|c| c.1 != want) {
            match Client::connect_to("127.0.0.1", want) {
                Ok(c) => conn = Some((c, want)),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
            }
        }
        let (c, _) = conn.as_mut().expect("connected");
        let t = Instant::now();
        match c.call(&["DBSIZE"]) {
            Ok(Reply::Int(_)) => {
                reads.fetch_add(1, Ordering::Relaxed);
                longest.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
            _ => {
                lost.fetch_add(1, Ordering::Relaxed);
                conn = None;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every acknowledged write of `prefix` holds its value on the node at `port`, waiting
/// (bounded) for a backup to catch up.
pub(crate) fn check_acks(port: u16, prefix: &str, acked: &[Ack]) -> Result<(), Error> {
    let pairs: Vec<(String, String)> = acked.iter().map(|(c, n, _, _)| (key(prefix, *c, *n), n.to_string())).collect();
    check_keys(port, &pairs)
}

/// Every (key, value) acknowledged is on the node at `port`, waiting (bounded, 20 s) for
/// a backup to catch up; `Err` names the first that is not ("LOST: ...").
fn check_keys(port: u16, acked: &[(String, String)]) -> Result<(), Error> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = (|| -> Result<Option<String>, Error> {
            let mut c = Client::connect_to("127.0.0.1", port)?;
            for chunk in acked.chunks(200) {
                let mut args = vec!["MGET"];
                args.extend(chunk.iter().map(|(k, _)| k.as_str()));
                let Reply::Array(Some(vals)) = c.call(&args)? else { return Ok(Some("MGET: not an array".into())) };
                for ((k, want), v) in chunk.iter().zip(vals) {
                    if v != Reply::Bulk(Some(want.clone().into_bytes())) {
                        return Ok(Some(format!("{k} is {v:?}, acknowledged as {want}")));
                    }
                }
            }
            Ok(None)
        })();
        match r {
            Ok(None) => return Ok(()),
            Ok(Some(why)) if Instant::now() > end => return Err(format!("LOST: {why}").into()),
            Err(e) if Instant::now() > end => return Err(e),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

pub fn run(dir: &Path, workers: usize, cycles: usize) -> Result<FailoverDemo, Error> {
    println!(
        "\n== automatic failover: three nodes, SIGKILL of the primary under load, {cycles} times, then a switchover, then a fourth node added online"
    );
    let mut nodes = Nodes::start_three(dir, workers, "majority-durable", 250, true)?;
    let first = wait_for("a first primary", Duration::from_secs(30), || nodes.primary())?;
    println!("node {first} is the first primary (nodes' logs: {})", dir.display());
    // The client: one write at a time, to whichever node takes it.
    let acks: Acks = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acks, stop) = (Arc::clone(&acks), Arc::clone(&stop));
        let ports: Vec<u16> = nodes.ports.values().copied().collect();
        std::thread::spawn(move || writer(0, "demo:w:", ports, acks, stop))
    };
    // A read-only client on a backup, moved to one before each kill.
    let mut reader = BackupReader::new();
    let mut unavailable_ms = Vec::new();
    let mut rejoin_ms = Vec::new();
    let mut phases = Vec::new();
    let mut first_kill = None;
    for cycle in 0..cycles {
        let primary = wait_for("a primary", Duration::from_secs(20), || nodes.primary())?;
        let backup = nodes.ports.iter().find(|(id, _)| **id != primary).map(|(_, p)| *p).ok_or("no backup")?;
        reader.aim(backup, &stop);
        std::thread::sleep(Duration::from_millis(1000));
        let (killed_at, killed_unix_ms) = (Instant::now(), unix_ms());
        first_kill.get_or_insert(killed_at);
        let killed_port = nodes.ports[&primary];
        nodes.kill(primary)?;
        let first_after = wait_for("a write on the new primary", Duration::from_secs(20), || {
            acks.lock().expect("acks").iter().find(|(_, _, t, p)| *t > killed_at && *p != killed_port).map(|a| a.2)
        })?;
        let ms = first_after.duration_since(killed_at).as_secs_f64() * 1e3;
        unavailable_ms.push(ms);
        let new = wait_for("the new primary", Duration::from_secs(20), || nodes.primary())?;
        let snapshot = acks.lock().expect("acks").clone();
        check_acks(nodes.ports[&new], "demo:w:", &snapshot)?;
        println!(
            "failover {}: SIGKILL of node {primary}; node {new} took writes {ms:.0} ms later; all {} acknowledged writes on it",
            cycle + 1,
            snapshot.len()
        );
        let p = nodes.phases(new, killed_unix_ms, ms);
        match &p {
            Some(p) => println!("            {}", p.line()),
            None => println!("            (node {new} did not say where the time went)"),
        }
        phases.push(p);
        let t = Instant::now();
        nodes.start(primary)?;
        wait_for("the killed node to rejoin", Duration::from_secs(30), || nodes.rejoined(primary).then_some(()))?;
        check_acks(killed_port, "demo:w:", &snapshot)?;
        rejoin_ms.push(t.elapsed().as_secs_f64() * 1e3);
        println!("            node {primary} restarted and rejoined as a backup in {:.0} ms", rejoin_ms[cycle]);
    }
    // Then a planned switchover (`ditto cluster switchover`), under the same writer.
    let from = wait_for("a primary", Duration::from_secs(20), || nodes.primary())?;
    if let Some(&p) = nodes.ports.iter().find(|(id, _)| **id != from).map(|(_, p)| p) {
        reader.aim(p, &stop);
    }
    std::thread::sleep(Duration::from_millis(1000));
    let (asked_at, from_port) = (Instant::now(), nodes.ports[&from]);
    nodes.switchover(from)?;
    let first_after = wait_for("a write on the new primary", Duration::from_secs(20), || {
        acks.lock().expect("acks").iter().find(|(_, _, t, p)| *t > asked_at && *p != from_port).map(|a| a.2)
    })?;
    let refused_ms = first_after.duration_since(asked_at).as_secs_f64() * 1e3;
    let to = wait_for("the new primary", Duration::from_secs(20), || nodes.primary())?;
    let opened = Instant::now();
    wait_for("the old primary to rejoin", Duration::from_secs(30), || nodes.rejoined(from).then_some(()))?;
    let back_ms = opened.elapsed().as_secs_f64() * 1e3;
    println!(
        "switchover: node {from} handed its role to node {to}; writes refused for {refused_ms:.0} ms; node {from} back as a backup {back_ms:.0} ms later"
    );
    // A fourth node joins online, under the same writer: a learner while it copies the
    // primary's data (counted in no quorum), then promoted to a voter in place.
    let t = Instant::now();
    let member = nodes.start_joining(4)?;
    nodes.admin(to, ditto_cluster::AdminRequest::AddLearner(member.clone()))?;
    wait_for("node 4 to join as a learner", Duration::from_secs(60), || nodes.rejoined(4).then_some(()))?;
    let learner_ms = t.elapsed().as_secs_f64() * 1e3;
    let link = wait_for("node 4's link on the primary", Duration::from_secs(20), || nodes.link_of(to, 4))?;
    if !link.contains("learner=1") {
        return Err(format!("node 4 joined as a learner, but the primary counts it: {link}").into());
    }
    check_acks(nodes.ports[&4], "demo:w:", &acks.lock().expect("acks").clone())?;
    let pid = nodes.server_pid(4).ok_or("node 4's process id")?;
    let t = Instant::now();
    nodes.admin(to, ditto_cluster::AdminRequest::Add(member))?;
    wait_for("node 4's link counted", Duration::from_secs(20), || {
        nodes.link_of(to, 4).filter(|l| !l.contains("learner=1"))
    })?;
    let promoted_ms = t.elapsed().as_secs_f64() * 1e3;
    if nodes.server_pid(4).as_deref() != Some(pid.as_str()) {
        return Err("node 4's server was restarted by its promotion, not promoted in place".into());
    }
    println!(
        "added:      node 4 joined as a learner in {learner_ms:.0} ms (it copied the data, counted in no quorum), then was promoted to a voter in place in {promoted_ms:.0} ms"
    );
    // The nodes share a cluster secret and speak TLS to each other: a request without the
    // secret (over TLS, with a certificate of the CA), and one with it in plaintext (as
    // anyone who reaches a control port could send), are refused, and the membership stays
    // as it is.
    let at = nodes.control_addr(to).ok_or("no control address")?.to_string();
    let remove = ditto_cluster::AdminRequest::Remove(4);
    let refused = |what: &str, r: std::io::Result<ditto_cluster::AdminReply>| match r {
        Err(e) if ditto_cluster::is_refused(&e) => Ok(e.to_string()),
        other => Err(format!("a request {what} was not refused: {other:?}")),
    };
    let secret_refusal =
        refused("without the cluster secret", ditto_cluster::admin_request(&at, &remove, None, nodes.operator_tls()))?;
    let tls_refusal = refused(
        "in plaintext",
        ditto_cluster::admin_request(
            &at,
            &remove,
            Some(&ditto_cluster::ClusterSecret::one(nodes.secret.clone())),
            None,
        ),
    )?;
    if nodes.link_of(to, 4).is_none() {
        return Err("node 4 lost its link after the refused requests".into());
    }
    println!("secret:     a request to remove node 4 without the cluster secret: {secret_refusal}");
    println!("tls:        the same request with the secret, in plaintext: {tls_refusal}");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    writer.join().map_err(|_| "the writer panicked")?;
    let backup_reads = reader.finish()?;
    if backup_reads.0 == 0 {
        return Err("the backup's client read nothing across the failovers: nothing was checked".into());
    }
    if backup_reads.1 > 0 {
        return Err(format!(
            "a backup's client lost its connection {} times in {} reads across the failovers",
            backup_reads.1, backup_reads.0
        )
        .into());
    }
    let acked = acks.lock().expect("acks").clone();
    for &port in nodes.ports.values() {
        check_acks(port, "demo:w:", &acked)?;
    }
    let timeline = match first_kill {
        Some(k) => {
            let from = k - Duration::from_millis(1000);
            let mut b = vec![0usize; 30];
            for (_, _, t, _) in &acked {
                if *t >= from {
                    let i = (t.duration_since(from).as_millis() / 100) as usize;
                    if i < b.len() {
                        b[i] += 1;
                    }
                }
            }
            b
        }
        None => Vec::new(),
    };
    Ok(FailoverDemo {
        failovers: cycles,
        backup_reads,
        unavailable_ms,
        phases,
        rejoin_ms,
        acked: acked.len(),
        timeline,
        switchover: Some((from, to, refused_ms, back_ms)),
        added: Some((learner_ms, promoted_ms)),
        secret_refusal: Some(secret_refusal),
        tls_refusal: Some(tls_refusal),
    })
}

impl FailoverDemo {
    pub fn print(&self) {
        println!("Automatic failover (3 nodes sharing a cluster secret, TLS between them, Raft control plane, majority-durable; SIGKILL of the primary's node)");
        let mut u = self.unavailable_ms.clone();
        u.sort_by(f64::total_cmp);
        if u.is_empty() {
            return;
        }
        println!(
            "  unavailability      {} failovers: median {:.0} ms, max {:.0} ms (SIGKILL to the first write acknowledged by the new primary)",
            self.failovers,
            u[u.len() / 2],
            u[u.len() - 1]
        );
        // The slowest failover's phases: what made it the slowest.
        let slowest =
            (0..self.unavailable_ms.len()).max_by(|&a, &b| self.unavailable_ms[a].total_cmp(&self.unavailable_ms[b]));
        if let Some(Some(p)) = slowest.and_then(|i| self.phases.get(i)) {
            println!("  slowest failover    {}", p.line());
        }
        let r = &self.rejoin_ms;
        println!(
            "  rejoin              the killed node back as a backup and caught up: max {:.0} ms",
            r.iter().copied().fold(0.0, f64::max)
        );
        let line: Vec<String> = self.timeline.iter().map(|n| n.to_string()).collect();
        println!("  writes per 100 ms   from 1 s before the first kill: {}", line.join(" "));
        if let Some((from, to, refused, back)) = self.switchover {
            println!(
                "  switchover          node {from} to node {to} (planned: drained, nothing discarded): writes refused {refused:.0} ms, node {from} a backup again {back:.0} ms later"
            );
        }
        if let Some((learner, promoted)) = self.added {
            println!(
                "  membership          a fourth node added online: a learner (counted in no quorum) until it held the data, {learner:.0} ms; a voter in place {promoted:.0} ms after its promotion"
            );
        }
        if let Some(why) = &self.tls_refusal {
            println!("  TLS between nodes   replication and control links encrypted, each node showing a certificate of the run's CA and checking the other's; a request in plaintext: {why}");
        }
        if let Some(why) = &self.secret_refusal {
            println!("  cluster secret      the nodes' control and replication ports take no one without it; an operator's request without it: {why}");
        }
        println!(
            "  reads on a backup   {} DBSIZE reads by a client of a backup (moved to a backup before each change), {} connections lost to a failover or the switchover, slowest read {:.1} ms",
            self.backup_reads.0, self.backup_reads.1, self.backup_reads.2
        );
        println!(
            "checks:   all {} acknowledged writes on every node after every failover and at the end (the added node too)  OK",
            self.acked
        );
        println!("checks:   the backup's client kept its connection through every change of role  OK");
    }
}

/// `n` ports on 127.0.0.1 free now, in 20000..32000 (below the ephemeral range: see
/// `Nodes::start_three`), tried at random.
fn ports_below_ephemeral(n: usize) -> Result<Vec<u16>, Error> {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let mut held: Vec<TcpListener> = Vec::new();
    for _ in 0..10_000 {
        if held.len() == n {
            break;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", rng.gen_range(20_000..32_000u16))) {
            held.push(l);
        }
    }
    if held.len() < n {
        return Err(format!("only {} of {n} free ports found in 20000..32000", held.len()).into());
    }
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}
