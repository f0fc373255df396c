//! `ditto server --node-id N --members ...`: one node of a cluster that fails over by itself
//! ======================================================================================
//! A cluster node is two processes: this supervisor, which runs the node's control plane
//! (crates/cluster: Raft, the failure detector, the failover's coordinator), and a child
//! `ditto server` that is the node's data plane, started as the primary or as a backup of
//! the epoch the control plane opened (docs/cluster.md, "The data plane").
//!
//! ```text
//!  supervisor: ControlService <-> NodePlane (this file) --spawns, stops, probes--> child ditto server
//!               (Raft over the control port)                  (clients, replication ports)
//! ```
//!
//! A backup's server is fenced in place: told `fence`, it stops following its primary,
//! makes what it received durable and writes nothing more to the directory, and goes on
//! serving reads at its last read view through the failover. Chosen as the new primary,
//! it is promoted in place (`promote`: it replays what it holds up to the recovery point,
//! keeps its engine and indexes, seals its replica log at the point and serves as the
//! primary, its first checkpoint written in the background); otherwise it follows the new primary in place (`follow`: cut the same way,
//! it joins with the engine it kept and resumes from the new primary's log). Its replay
//! was held at the primary's release, so its engine holds nothing above the point
//! (docs/cluster.md, "In-place promotion and following"). Every other change of role is a
//! new child: the old one is stopped (`stop` on its standard input: a backup first makes
//! everything it received durable, `Backup::stop`), and the new one recovers from the
//! node's directory, cut at the failover's recovery point. So is a change that cannot be
//! done in place (the node fetches into its directory, the backup replayed above the point
//! under `local`, or `--promotion restart`).
//!
//! Invariants:
//! - A child runs only in an epoch at or above the node's fence, and as primary only of an
//!   epoch that a command applied while this supervisor ran named it for (a restarted
//!   primary never resumes its epoch: the coordinator fails it over).
//! - A node reports only what its directory holds as a backup's (a replica log, read after
//!   its child stopped or was fenced in place, and the files were fsynced); a directory
//!   holding a primary's own log is not reported (the node is then not counted, and not
//!   chosen).
//! - Nothing writes the directory while a child fenced in place runs: a fetch into it
//!   stops the child first.
//! - A node that holds a primary's own log and is to follow another primary starts from
//!   nothing (a checkpoint copy): its log may hold commits above the recovery point.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Proc, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ditto_cluster::service::Waker;
use ditto_cluster::{
    Command, ControlService, ControlState, DataPlane, Holding, Member, NodeId, Phase, RecoveryPlan, ServiceConfig,
    Timeouts, Timing,
};

/// Where one member is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberAddrs {
    pub host: String,
    pub client: u16,
    pub repl: u16,
    pub control: u16,
    /// Its server's TLS client port, where `--members` names one (0: none named).
    pub tls: u16,
}

/// Whether `host` (of `--members`) is this machine's loopback: `localhost` or a loopback
/// address. A name that resolves to one is not known to be, and counts as not.
/// The environment variable through which a node gives its server the cluster secret
/// (its replication links': `Config::link_secret`). Not a flag: a process's arguments are
/// visible to every user of the machine, its environment to its own user only.
pub const LINK_SECRET_ENV: &str = "DITTO_LINK_SECRET";

pub fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl MemberAddrs {
    pub fn client_addr(&self) -> String {
        format!("{}:{}", self.host, self.client)
    }
    /// Where TLS clients reach its server, if `--members` names its TLS port.
    pub fn tls_addr(&self) -> Option<String> {
        (self.tls != 0).then(|| format!("{}:{}", self.host, self.tls))
    }
    /// ` HOST:TLS_PORT`, the optional last word of the `follow` and `drain` lines to its
    /// server; empty where no TLS port is named.
    fn tls_word(&self) -> String {
        self.tls_addr().map(|t| format!(" {t}")).unwrap_or_default()
    }
    /// The member the control state records.
    pub fn member(&self, id: NodeId) -> Member {
        Member { id, addr: self.client_addr(), repl: self.repl, control: self.control, tls: self.tls }
    }
    fn repl_addr(&self) -> String {
        format!("{}:{}", self.host, self.repl)
    }
}

/// Where member `id` is reached: as the node's flags say (they may route through
/// something of the node's own, a proxy or a tunnel), else as the control state names it
/// (members added since the node started are known only there).
fn addrs_of(state: &ControlState, flags: &BTreeMap<NodeId, MemberAddrs>, id: NodeId) -> Option<MemberAddrs> {
    if let Some(a) = flags.get(&id) {
        // A TLS port the flags do not name may be in the control state (a member added
        // again with one): every node then tells TLS clients the same address.
        let tls = match a.tls {
            0 => state.node(id).map_or(0, |m| m.tls),
            t => t,
        };
        return Some(MemberAddrs { tls, ..a.clone() });
    }
    let m = state.node(id).filter(|m| m.repl != 0 && m.control != 0)?;
    let (host, client) = m.addr.rsplit_once(':')?;
    Some(MemberAddrs {
        host: host.to_string(),
        client: client.parse().ok()?,
        repl: m.repl,
        control: m.control,
        tls: m.tls,
    })
}

/// The member or learner whose backup names itself `name` in its primary's `INFO
/// replication`. A backup names itself by the control state's address for it
/// (`--replica-name`), which this node's own flags (`flags`) may spell otherwise (a host
/// name for an address, a proxy of its own): either matches. (Before 2026-12-02 only the
/// flags did, and a primary whose flags spelled its backups otherwise heard none of them,
/// kept its writes refused, and was never failed over: its node still heard it.)
fn node_named(state: &ControlState, flags: &BTreeMap<NodeId, MemberAddrs>, name: &str) -> Option<NodeId> {
    let known = state.members.keys().chain(state.learners.keys()).chain(flags.keys());
    known.copied().find(|&id| {
        state.node(id).is_some_and(|m| m.addr == name)
            || addrs_of(state, flags, id).is_some_and(|m| m.client_addr() == name)
    })
}

/// Parses `ID=HOST:CLIENT/REPL/CONTROL[/TLS][,...]` (the ports of clients, replication,
/// the control plane and, optionally, TLS clients).
pub fn parse_members(s: &str) -> Result<BTreeMap<NodeId, MemberAddrs>, String> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("member {part:?}: expected ID=HOST:CLIENT_PORT/REPL_PORT/CONTROL_PORT[/TLS_PORT]");
        let (id, rest) = part.split_once('=').ok_or_else(bad)?;
        let id: NodeId = id.trim().parse().map_err(|_| bad())?;
        let (host, ports) = rest.rsplit_once(':').ok_or_else(bad)?;
        let ports: Vec<u16> = ports.split('/').map(|p| p.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
        let (client, repl, control, tls) = match ports[..] {
            [c, r, ctl] => (c, r, ctl, 0),
            [c, r, ctl, t] if t != 0 => (c, r, ctl, t),
            _ => return Err(bad()),
        };
        // Port 0 would bind a port no peer or client knows, and two ports the same would
        // make every server start fail (a primary giving up its epoch again and again).
        let mine: Vec<u16> = [client, repl, control, tls].into_iter().filter(|&p| p != 0).collect();
        if client == 0 || repl == 0 || control == 0 {
            return Err(format!("member {part:?}: port 0 is no port a peer or client can reach"));
        }
        if (1..mine.len()).any(|i| mine[..i].contains(&mine[i])) {
            return Err(format!("member {part:?}: its ports must differ"));
        }
        let m = MemberAddrs { host: host.to_string(), client, repl, control, tls };
        if let Some((other, _)) = out.iter().find(|(_, o): &(&NodeId, &MemberAddrs)| {
            o.host == m.host && [o.client, o.repl, o.control, o.tls].iter().any(|p| *p != 0 && mine.contains(p))
        }) {
            return Err(format!("member {part:?}: a port of member {other} on the same host"));
        }
        if id == 0 || out.insert(id, m).is_some() {
            return Err(format!("member {part:?}: ids are distinct and above 0"));
        }
    }
    if out.is_empty() {
        return Err("--members names no member".into());
    }
    Ok(out)
}

/// What the node's child server runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Role {
    Primary {
        epoch: u64,
        ts_above: u64,
        upto: Option<u64>,
        resume_epoch: Option<u64>,
    },
    /// (Its cut at the start, `--recover-upto`, is read from its directory then.)
    Backup {
        epoch: u64,
        of: NodeId,
        /// The node is a learner (`--learner`: its primary counts it in no quorum); its
        /// promotion is a change of role (a new server, which resumes from its directory).
        learner: bool,
    },
}

impl Role {
    fn epoch(&self) -> u64 {
        match self {
            Role::Primary { epoch, .. } | Role::Backup { epoch, .. } => *epoch,
        }
    }
}

struct Running {
    role: Role,
    proc: Child,
    /// The server's standard input is in `Gate` (the server exits when it closes).
    /// The child printed that it listens.
    ready: Arc<AtomicBool>,
    /// A backup child printed that it joined its primary (it may acknowledge from then on;
    /// its receiver starts a moment before the line, a window of microseconds).
    joined: Arc<AtomicBool>,
    /// The thread reading its standard output (done at its exit).
    reader: Option<std::thread::JoinHandle<()>>,
    /// Asks it `INFO replication` on a thread of its own.
    prober: Prober,
    /// When it was told `fence` (until it says it is fenced, or the fence failed).
    fence_asked: Option<Instant>,
    /// It did not answer `fence` within the stop timeout: stopping it kills it at once.
    unresponsive: bool,
    /// A backup fenced in place (it printed so): it follows no primary and writes nothing
    /// to its directory, and serves reads at its last read view.
    fenced: Arc<AtomicBool>,
    /// It printed that its fence failed.
    fence_failed: Arc<AtomicBool>,
    /// Asked to change its role in place (promoted, or to follow the next epoch's
    /// primary); until it listens again, an exit means that failed (the node then starts
    /// the role's server from its directory).
    changing: bool,
    /// When a promoted learner's server was last told `count` (the probe tells it again,
    /// at most once per `COUNT_AGAIN`, while its `INFO` still says it is a learner).
    count_told: Option<Instant>,
    /// When it was started (`Node::backup_backoff` counts only quick exits).
    started: Instant,
    /// When it was given its present role (started, or asked to change it in place).
    role_since: Instant,
}

/// The server's newest answer to `INFO replication`, asked by a thread of its own every
/// `PROBE_EVERY` (`probe_wait` while it fails): the control thread reads the answer and
/// never waits on the server. (It used to ask itself, and waited up to 100 ms a probe on a
/// server stopped or swamped: with probes backing off, still 100 ms a second, enough to
/// apply an operator's request 10.6 s late on a node that led Raft; docs/cluster.md.)
struct Prober {
    latest: Arc<parking_lot::Mutex<Option<ProbeAnswer>>>,
    /// Probe every `PROBE_FAST` (a new primary waiting to hear its backups: each ms the
    /// probe is late, its first write is).
    fast: Arc<AtomicBool>,
    /// Bumped when the server is asked to change its role in place: an answer to a
    /// question asked before is not read as the new role's.
    generation: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: std::thread::Thread,
}

struct ProbeAnswer {
    /// When the answer (or the failure) came, and when it was asked (what the server
    /// measured, it measured after this).
    at: Instant,
    asked: Instant,
    generation: u64,
    info: Result<String, String>,
}

impl Prober {
    /// Starts asking the server at `addr` once `ready` (it listens). An answer in which the
    /// backups the server hears are not those of the answer before wakes the control
    /// thread (`wake`, once the service runs), which reads it at once rather than at its
    /// next input or tick.
    fn start(
        me: NodeId,
        addr: String,
        password: Option<String>,
        ready: Arc<AtomicBool>,
        wake: Arc<std::sync::OnceLock<Waker>>,
    ) -> Result<Prober, String> {
        let latest: Arc<parking_lot::Mutex<Option<ProbeAnswer>>> = Default::default();
        let generation = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let fast = Arc::new(AtomicBool::new(false));
        let (l, g, s, f) = (Arc::clone(&latest), Arc::clone(&generation), Arc::clone(&stop), Arc::clone(&fast));
        let thread = std::thread::Builder::new()
            .name("ditto-probe".into())
            .spawn(move || {
                let (mut conn, mut failures, mut asked_in) = (None, 0u32, 0u64);
                let mut heard_before = Vec::new();
                while !s.load(Ordering::Acquire) {
                    if !ready.load(Ordering::Acquire) {
                        std::thread::park_timeout(PROBE_EVERY);
                        continue;
                    }
                    let generation = g.load(Ordering::Acquire);
                    if generation != asked_in {
                        conn = None; // the server changed its role: a fresh session
                        asked_in = generation;
                    }
                    let asked = Instant::now();
                    let info = info_replication(&mut conn, &addr, password.as_deref()).map_err(|e| {
                        // One failed probe says nothing about the server (it may be busy);
                        // a refused password does, and is said (once per run of failures).
                        match e.to_string() {
                            why if why.starts_with(AUTH_REFUSED) && failures == 0 => tracing::warn!("node {me}: {why}"),
                            why => tracing::debug!("node {me}: probing the server: {why}"),
                        }
                        conn = None;
                        e.to_string()
                    });
                    failures = if info.is_ok() { 0 } else { failures.saturating_add(1) };
                    let heard = info.as_deref().map(backups_heard).unwrap_or_default();
                    *l.lock() = Some(ProbeAnswer { at: Instant::now(), asked, generation, info });
                    if heard != heard_before {
                        heard_before = heard;
                        if let Some(w) = wake.get() {
                            w.wake();
                        }
                    }
                    std::thread::park_timeout(next_probe_in(failures, f.load(Ordering::Acquire)));
                }
            })
            .map_err(|e| format!("starting the thread that probes the server: {e}"))?;
        Ok(Prober { latest, fast, generation, stop, thread: thread.thread().clone() })
    }

    /// The newest answer of the server's present role, how old it is, and when it was
    /// asked.
    fn answer(&self) -> Option<(Duration, Instant, Result<String, String>)> {
        let generation = self.generation.load(Ordering::Acquire);
        let l = self.latest.lock();
        l.as_ref().filter(|a| a.generation == generation).map(|a| (a.at.elapsed(), a.asked, a.info.clone()))
    }

    /// Answers from now on are the role's the server was just asked to change to.
    fn new_role(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        *self.latest.lock() = None;
    }
}

impl Drop for Prober {
    /// The thread ends by itself (within a probe's 100 ms timeout); nobody waits for it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// How long after a probe the next runs: `PROBE_FAST` while `fast` and the server
/// answers (one that fails backs off as ever, `probe_wait`, however long `fast` stays set:
/// the control thread clears it only on an answer).
fn next_probe_in(failures: u32, fast: bool) -> Duration {
    match fast && failures == 0 {
        true => PROBE_FAST,
        false => probe_wait(failures),
    }
}

/// The backups an `INFO replication` answer says its server heard from lately
/// (`slaveN:node=...`, whose newest ack echoed a heartbeat sent at most `HEARD_WITHIN_MS`
/// before: `lease_ms_ago`), in its order.
fn backups_heard(info: &str) -> Vec<String> {
    info.lines()
        .filter_map(|l| {
            let fields = l.strip_prefix("slave")?.split_once(':')?.1;
            let ago: u64 = slave_field(fields, "lease_ms_ago")?.parse().ok()?;
            (ago <= HEARD_WITHIN_MS).then(|| slave_field(fields, "node").map(str::to_string))?
        })
        .collect()
}

/// The value of `key` in the `key=value,...` fields of an `INFO replication` `slaveN:` line.
fn slave_field<'a>(fields: &'a str, key: &str) -> Option<&'a str> {
    fields.split(',').find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
}

/// A server told to stop that has not exited yet (`NodePlane::stop_child`).
struct Stopping {
    child: Running,
    /// Its standard input, taken from the gate (nothing else is sent to it; what waits in
    /// it is flushed at each look); dropped once it exited.
    stdin: Option<Pipe>,
    since: Instant,
    /// It is killed if it has not exited by then.
    kill_at: Instant,
    killed: bool,
    why: String,
}

/// How a fence in place goes (`NodePlane::fence_in_place`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fencing {
    Done,
    /// Asked, not answered yet (within the stop timeout).
    Pending,
    /// Not possible, failed, or not answered in time: the server is to be stopped.
    Failed,
}

/// The running server's standard input, shared with the supervisor's loop, which opens
/// and closes a primary's write gate through it (a primary takes writes only while it
/// has contact with a quorum, docs/cluster.md).
#[derive(Default)]
struct Gate {
    stdin: Option<Pipe>,
    primary: bool,
    open: bool,
    /// While open: the deadline it was last told (`writes until`, `monotonic_ms`).
    until_ms: u64,
    /// When this server's role began (its start, or its change in place): it is opened only
    /// on a status published after (one read before could be of an earlier role's epoch).
    since: Option<Instant>,
    /// The `INFO cluster` fields the server was last sent.
    info: Vec<(String, String)>,
    /// The membership configuration a primary server was last given its backups for.
    config: u64,
}

type SharedGate = Arc<parking_lot::Mutex<Gate>>;

/// What a node knows of the leases it gave and took (docs/cluster.md, "The old primary's
/// lease"), for its failover reports: when a server of its last acked a primary as a
/// backup, and the epoch it took writes in as primary.
struct Leases {
    /// When a server of this node last acked a primary, at the latest (`None`: never).
    acked: parking_lot::Mutex<Option<Instant>>,
    /// The open epoch this node's server was opened for writes in, as primary (0: none).
    took_writes_in: AtomicU64,
}

impl Default for Leases {
    fn default() -> Leases {
        // A server of this node's previous run may have acked until about now (it exits
        // as soon as its standard input closes, when that run ended).
        Leases { acked: parking_lot::Mutex::new(Some(Instant::now())), took_writes_in: AtomicU64::new(0) }
    }
}

impl Leases {
    /// A server of this node may have acked a primary as late as `at`.
    fn acked_until(&self, at: Instant) {
        let mut a = self.acked.lock();
        if a.is_none_or(|t| t < at) {
            *a = Some(at);
        }
    }
}

/// Whether `c` is a backup server not (yet) fenced: it may ack its primary at any moment.
fn unfenced_backup(c: &Running) -> bool {
    matches!(c.role, Role::Backup { .. }) && !c.fenced.load(Ordering::Acquire)
}

/// What a server prints once fenced in place, after which it acks nothing: with how long
/// ago it last acked (`ditto server fenced, its last ack N us ago`), or that it never did
/// (`..., it never acked`); a drained primary prints the bare words. Returns the line's
/// ack age, `Some(None)` if it says none, `None` if the line is not a fence's.
fn fenced_line(line: &str) -> Option<Option<Duration>> {
    if line == "ditto server fenced" || line == "ditto server fenced, it never acked" {
        return Some(None);
    }
    let us = line.strip_prefix("ditto server fenced, its last ack ")?.strip_suffix(" us ago")?;
    // (An unreadable age is taken as just now: the longest wait.)
    Some(Some(Duration::from_micros(us.parse().unwrap_or(0))))
}

/// A server's standard input, written without blocking: what the pipe cannot take now
/// waits here, in order, and goes at the next `flush` (the supervisor's loop flushes every
/// 5 ms). A server that does not read (stopped, hung) fills the pipe's 64 KiB; a blocking
/// write would then hold whoever wrote, the control thread included (docs/cluster.md, "The
/// control thread does not wait on its server"). One that has left `PIPE_PENDING_MAX`
/// bytes unread is taken as gone: `send` says false, as for a closed pipe.
struct Pipe {
    w: std::process::ChildStdin,
    pending: Vec<u8>,
}

/// See `Pipe`.
const PIPE_PENDING_MAX: usize = 1 << 20;

impl Pipe {
    fn new(w: std::process::ChildStdin) -> std::io::Result<Pipe> {
        use std::os::fd::AsRawFd;
        let fd = w.as_raw_fd();
        // SAFETY: fcntl(2) on a descriptor this process owns (the pipe's write end, held
        // by `w` for as long as the call runs); no memory is passed.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
        };
        if !ok {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Pipe { w, pending: Vec::new() })
    }

    /// Queues one line and sends what the pipe takes now; false if the pipe is closed or
    /// broken, or the server has left too much unread.
    fn send(&mut self, line: &str) -> bool {
        // False means not queued: nothing more for a server taken as gone, nor a line that
        // would take it past the bound.
        if !self.flush() || self.pending.len() + line.len() + 1 > PIPE_PENDING_MAX {
            return false;
        }
        self.pending.extend_from_slice(line.as_bytes());
        if !line.ends_with('\n') {
            self.pending.push(b'\n');
        }
        self.flush()
    }

    /// Sends what the pipe takes now of what waits; false as `send`.
    fn flush(&mut self) -> bool {
        while !self.pending.is_empty() {
            match self.w.write(&self.pending) {
                Ok(0) => return false,
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        self.pending.len() <= PIPE_PENDING_MAX
    }
}

/// Sends one line to the running server's standard input (`Pipe::send`); false if there is
/// none or it is gone.
fn tell_server(gate: &SharedGate, line: &str) -> bool {
    gate.lock().stdin.as_mut().is_some_and(|p| p.send(line))
}

/// One failover as this node saw it (wall-clock milliseconds).
#[derive(Clone, Debug, Default)]
struct FailoverSeen {
    epoch: u64,
    reason: String,
    began_ms: u64,
    opened_ms: Option<u64>,
    primary: Option<NodeId>,
    recovery_point: Option<u64>,
    lost: u64,
    /// The coordinator's report and prepare phases (ms).
    phases_ms: [u64; 2],
    /// How long the new primary was to wait, once it applied the opening, for the older
    /// primaries' leases to run out (`OpenEpoch::writes_after_ms`).
    lease_wait_ms: u64,
    /// How this node's server took its new role, as it printed it, and how long that took
    /// (ms): `promoted-in-place`, `promoted-by-restart` or `followed-in-place`.
    role_change: Option<(&'static str, u64)>,
}

/// A server line saying how it took a new role at a failover (`promotion (in place): ...;
/// X s in all`, `promotion: ...`, `follow (in place): ...`): the kind, and the time.
fn role_change_of(line: &str) -> Option<(&'static str, u64)> {
    let kind = [
        ("promotion (in place):", "promoted-in-place"),
        ("promotion:", "promoted-by-restart"),
        ("follow (in place):", "followed-in-place"),
    ]
    .into_iter()
    .find_map(|(p, k)| line.starts_with(p).then_some(k))?;
    let secs: f64 = line.rsplit_once("; ")?.1.strip_suffix(" s in all")?.parse().ok()?;
    Some((kind, (secs * 1e3).round() as u64))
}

type History = Arc<parking_lot::Mutex<Vec<FailoverSeen>>>;

/// The failovers a node remembers (INFO shows the last five): each round and each
/// restart's replay of the log pushed one more, for the node's life.
const HISTORY_KEEP: usize = 64;

/// `f` remembered, the oldest forgotten past `HISTORY_KEEP`.
fn remember(h: &mut Vec<FailoverSeen>, f: FailoverSeen) {
    h.push(f);
    if h.len() > HISTORY_KEEP {
        h.drain(..h.len() - HISTORY_KEEP);
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// How a node runs (from `ditto server`'s flags).
pub struct NodeConfig {
    pub id: NodeId,
    pub members: BTreeMap<NodeId, MemberAddrs>,
    /// The node's directory: `control/` (the Raft state), `data/` (the child's).
    pub dir: PathBuf,
    /// Flags every child gets (durability, replay mode, ...).
    pub child_args: Vec<String>,
    /// The servers' workers (every node of a cluster runs the same number: they are the
    /// primary's log streams).
    pub workers: usize,
    pub policy: String,
    pub timeouts: Timeouts,
    pub tick: Duration,
    /// The node joins a running cluster (`ditto cluster add`): it waits, with no voters,
    /// for the leader to bring it in.
    pub join: bool,
    /// A backup is fenced, promoted or made to follow the new primary in place
    /// (`--promotion in-place`), not stopped and started again.
    pub promote_in_place: bool,
    /// How long a server is given to stop, or to answer its fence, before it is killed
    /// (`STOP_TIMEOUT` by default).
    pub stop_timeout: Duration,
    /// The cluster secret its control port asks of peers and operators, and shows them
    /// (`ditto_cluster::load_secret`; its servers read the same file for their links).
    pub secret: Option<ditto_cluster::ClusterSecret>,
    /// TLS on its control port (`tls_cluster`; its servers read their own TLS settings
    /// for their links).
    pub control_tls: Option<Arc<ditto_replication::tls::LinkTls>>,
    /// Its servers' `requirepass` (from the config file they share): its probe AUTHs.
    pub password: Option<String>,
    /// That config file (`--config`), read again before each server starts: the server
    /// reads it then too, and its password may have changed.
    pub config_file: Option<PathBuf>,
}

/// The data plane of one node: its child server (see the module notes).
struct NodePlane {
    me: NodeId,
    /// The cluster secret, given to each server it starts (`LINK_SECRET_ENV`).
    secret: Option<ditto_cluster::ClusterSecret>,
    /// The servers' `requirepass`, which the probe gives, and the file it comes from.
    password: Option<String>,
    config_file: Option<PathBuf>,
    members: BTreeMap<NodeId, MemberAddrs>,
    data: PathBuf,
    child_args: Vec<String>,
    /// The servers' workers: the primary's log streams.
    workers: usize,
    child: Option<Running>,
    gate: SharedGate,
    history: History,
    state: ControlState,
    fence: u64,
    /// The epoch this supervisor may serve as primary (named by a command applied live).
    may_serve: Option<u64>,
    /// Its control state is known up to date (`DataPlane::caught_up`): until then it
    /// starts no server, since the state it kept may name an epoch a failover closed
    /// while it was down (docs/cluster.md, "A node that missed an epoch").
    caught_up: bool,
    prepared: Option<Result<u64, String>>,
    /// The last server, of this epoch, did not stop cleanly (killed, or its drain failed):
    /// this node's holdings are not reported until a later epoch opens (applied, or seen
    /// in a snapshot of the state), or until a later backup server of this epoch caught
    /// up again (`unclean_caught_up`).
    unclean: Option<u64>,
    /// While `unclean`: the release the primary told the next backup server of that epoch
    /// once its link was up (`probe`). Everything the primary released on the dead
    /// server's acknowledgements is at or below it (the primary takes a backup's new link
    /// only once the old one of its name is gone); once that server holds it durably, the
    /// node holds again all the dead one acknowledged, and reports again.
    unclean_caught_up: Option<u64>,
    /// The streams the plan being prepared still fetches.
    fetching: std::collections::BTreeSet<usize>,
    /// A backup child that exited is started again no sooner than this.
    restart_after: Instant,
    /// Backup servers of one role that exited in a row without joining their primary,
    /// within `BACKOFF_QUICK_EXIT` of their start (one refused for good: its directory
    /// holds another database, say), and when the next of
    /// that role may start: 500 ms after the first, twice as long after each, up to 30 s.
    /// Each start loads the directory's whole database, so a refusal retried every 500 ms
    /// kept a core and the disk busy (found by a review, 2026-12-05). Another role starts
    /// at once.
    backup_backoff: Option<(Role, u32, Instant)>,
    /// A server told to stop that has not exited yet: no other starts meanwhile, and the
    /// directory is not reported.
    stopping: Option<Stopping>,
    heard: Vec<(NodeId, Instant)>,
    serving: bool,
    /// The membership configuration the primary server last said it has settled.
    settled: Option<u64>,
    /// See `NodeConfig::promote_in_place`.
    in_place: bool,
    /// See `NodeConfig::stop_timeout`.
    stop_timeout: Duration,
    /// The thread that reads the replica log ahead, told of the backup's link.
    warm: Warmer,
    /// Wakes the control thread (set once the service runs): a prober's news.
    waker: Arc<std::sync::OnceLock<Waker>>,
    /// What this node, an old primary that rejoins, discarded of its epoch above the
    /// recovery point: proposed (every `PROPOSE_EVERY`) until the state records it.
    count_discarded: Option<(Command, Instant)>,
    /// An old primary that prepared as a failover's last resort: its log's epoch, the
    /// point, and the commits its log holds above it (recorded when its server starts).
    prepared_own_log: Option<(u64, u64, u64)>,
    /// The check of the directory against a plan's point (that point, and where its
    /// answer comes), read on a thread of its own (`start_check`) until it answers.
    prepare_check: Option<(u64, std::sync::mpsc::Receiver<Result<Checked, String>>)>,
    /// The epoch this node was named primary of and gave up (its promotion in place failed
    /// once the epoch's log had begun), and when it last proposed failing it over.
    /// Why, as the failover's reason says it.
    gives_up: Option<(u64, Option<Instant>, &'static str)>,
    /// The epoch this node served as a switchover's drained primary and whose server is
    /// asked to follow the next primary in place: once it has, it discarded nothing of it.
    count_after_follow: Option<u64>,
    /// The thread reading this node's log for a report (`report`), until it is done.
    report_warm: Option<(Instant, std::sync::mpsc::Receiver<()>)>,
    /// Set by that read's thread once it has read the log (`report_ready`).
    report_read_done: Arc<AtomicBool>,
    /// A switchover this node, the primary, hands its role over in (see `Switching`).
    switching: Option<Switching>,
    /// What its server said of the last drain it was asked for (`ditto server drained at
    /// ts T` or `... drain failed: WHY`), set by the thread reading its output.
    drained: Arc<parking_lot::Mutex<Option<Result<u64, String>>>>,
    /// The epoch whose primary, this node's server, is drained for a switchover and not
    /// told `drain off` since: it takes no write, so it may be fenced as it stands
    /// (`fence_in_place`).
    drained_in: Option<u64>,
    /// A client asked this node's server for a failover (`SENTINEL FAILOVER ditto`): a
    /// switchover is proposed (once; a client whose request is lost asks again).
    switch_asked: Arc<AtomicBool>,
    /// The leases it gave and took, for its reports (`Leases`).
    leases: Arc<Leases>,
}

/// A switchover this node's primary server is draining for (`Command::Switchover`): once
/// drained it proposes the failover (`BeginFailover`, every `PROPOSE_EVERY` until the
/// state has it); if the drain fails, it takes writes again and proposes `EndSwitchover`.
struct Switching {
    epoch: u64,
    /// The switchover's id (`SwitchoverRecord::id`): a hand-over names it.
    id: u64,
    to: NodeId,
    proposed: Option<Instant>,
}

/// How long a primary's server may take to drain for a switchover (its writes are refused
/// meanwhile).
const DRAIN_WITHIN: Duration = Duration::from_secs(5);

/// A peer heard from within this long counts as heard now.
const HEARD_WITHIN_MS: u64 = 50;

/// How often a running backup's replica log is read ahead (`warm_holdings`), so that a
/// failover's report reads only what was appended since.
const WARM_EVERY: Duration = Duration::from_millis(500);

/// What the thread that reads a backup's replica log ahead (`warm_holdings`) is told as the
/// probe sees its server's link to the primary change.
#[derive(Clone, Copy, PartialEq, Debug, Default)]
enum WarmLink {
    /// A backup whose link is up: read every `WARM_EVERY`.
    Up,
    /// A backup whose link was up went down (most often: its primary died): read once, at
    /// once, then no more. Its log does not grow until it follows a primary again, so the
    /// failover's report, a failure detector's timeout later, finds it all read; it used
    /// to scan the appends of up to `WARM_EVERY` itself, 2-3 ms on an idle core and
    /// 37-70 ms on the loaded 2-core VM, in about one failover in four.
    Down,
    /// No backup runs (none, or the server is a primary): no reads.
    #[default]
    Off,
}

/// The node's end of the thread that reads its replica log ahead: it passes on changes only.
#[derive(Default)]
struct Warmer {
    said: WarmLink,
    /// None where no thread runs (the unit tests' planes).
    tx: Option<std::sync::mpsc::Sender<WarmLink>>,
}

impl Warmer {
    /// Starts the thread for the data directory `data`; it ends with its `Warmer`.
    fn start(data: PathBuf, me: NodeId) -> Result<Warmer, String> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("ditto-warm".into())
            .spawn(move || {
                warm_loop(&rx, WARM_EVERY, || {
                    if let Err(e) = ditto_log::replica::warm_holdings(&data) {
                        tracing::debug!("node {me}: reading its replica log ahead: {e}");
                    }
                })
            })
            .map_err(|e| format!("starting the thread that reads its log ahead: {e}"))?;
        Ok(Warmer { said: WarmLink::Off, tx: Some(tx) })
    }

    /// Tells the thread of `link`, if it changed. A link down that was not up (a backup
    /// still joining, or one whose link went down before) is no news: it counts as `Off`,
    /// nothing having been received since the last read.
    fn say(&mut self, link: WarmLink) {
        let link = if link == WarmLink::Down && self.said != WarmLink::Up { WarmLink::Off } else { link };
        if link != self.said {
            self.said = link;
            if let Some(tx) = &self.tx {
                let _ = tx.send(link);
            }
        }
    }
}

/// The warming thread's loop: `read` every `every` while the link is up, once at each
/// `Down`; it returns when its `Warmer` is gone.
fn warm_loop(rx: &std::sync::mpsc::Receiver<WarmLink>, every: Duration, mut read: impl FnMut()) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut up = false;
    loop {
        let got = if up { rx.recv_timeout(every) } else { rx.recv().map_err(|_| RecvTimeoutError::Disconnected) };
        match got {
            Ok(WarmLink::Up) => up = true,
            Ok(WarmLink::Down) => {
                up = false;
                read();
            }
            Ok(WarmLink::Off) => up = false,
            Err(RecvTimeoutError::Timeout) => read(),
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// How often a promoted learner's server that still says it is a learner is told `count`
/// again.
const COUNT_AGAIN: Duration = Duration::from_secs(1);
/// How often a command the data plane wants is proposed again, until it is applied.
const PROPOSE_EVERY: Duration = Duration::from_millis(200);
/// How long the control thread waits for a report's read of the log (`report`) before it
/// answers nothing and lets the coordinator ask again.
const REPORT_READ_WAIT: Duration = Duration::from_millis(20);
/// A report's read begun longer ago than this is not waited for: another is begun (what
/// it warmed may have changed since, and the read here would then be done on the control
/// thread).
const REPORT_READ_FRESH: Duration = Duration::from_secs(2);
/// A primary whose start from its directory failed before it served proposes the failover
/// to the next epoch this much later, plus `PROPOSE_EVERY` (`gives_up`).
const GIVE_UP_AFTER_FAILED_START: Duration = Duration::from_millis(800);
/// How often the child is asked what it heard.
const PROBE_EVERY: Duration = Duration::from_millis(5);
/// How often a new primary is asked while its write gate is closed, within
/// `PROBE_FAST_FOR` of its role's start, and while it answers (`next_probe_in`).
const PROBE_FAST: Duration = Duration::from_millis(1);
const PROBE_FAST_FOR: Duration = Duration::from_secs(2);
/// The longest the loop that tells a primary's write gate waits between looks (it is also
/// woken by the control thread's news: `ControlService::wait_status`).
const GATE_LOOK_EVERY: Duration = Duration::from_millis(5);
/// The most a probe waits after failed ones (`probe_wait`).
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How long after the last probe the next one runs, after `failures` failed in a row:
/// `PROBE_EVERY`, doubled per failure, at most `PROBE_BACKOFF_MAX` (a server that does not
/// answer, stopped or swamped, is not asked 200 times a second).
fn probe_wait(failures: u32) -> Duration {
    PROBE_EVERY.saturating_mul(1u32 << failures.min(16)).min(PROBE_BACKOFF_MAX)
}
/// How long a child is given by default to stop, or to answer its fence, before it is
/// killed (more than a backup's own bound on draining what it received, 10 s);
/// `--server-stop-timeout-ms` sets it (`NodeConfig::stop_timeout`).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A node removed from its cluster stops with this error, and `ditto` exits with
/// [`EXIT_REMOVED`]: its id is never used again, so a service manager that restarts it
/// would only see it stop again (docs/cluster.md, "Membership changes").
#[derive(Debug)]
pub struct Removed(pub String);

impl std::fmt::Display for Removed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Removed {}

/// A backup server that exits within this of its start, without joining its primary,
/// counts toward `Node::backup_backoff` (a refusal comes within seconds; a join that gave
/// up waits 60 s for its primary first).
const BACKOFF_QUICK_EXIT: Duration = Duration::from_secs(20);

/// How long after the `n`th backup server of one role in a row exited without joining its
/// primary the next starts (`Node::backup_backoff`): 500 ms, then twice as long each time,
/// up to 30 s.
fn backup_backoff_after(n: u32) -> Duration {
    Duration::from_millis(500).saturating_mul(1 << n.saturating_sub(1).min(6)).min(Duration::from_secs(30))
}

/// The exit status of a removed node (`EX_CONFIG` of sysexits.h): a service manager is
/// told not to restart on it (systemd: `RestartPreventExitStatus=78`).
pub const EXIT_REMOVED: i32 = 78;
/// How long the control thread waits for a server it told to stop, or to fence itself,
/// before it goes on (and looks again at its next turn): a server normally does either in
/// a few milliseconds, and one that does not (stopped, its disk hung) must not hold Raft
/// and the coordinator (docs/cluster.md, "The control thread does not wait on its server").
const SERVER_WAIT: Duration = Duration::from_millis(20);

/// What `check_holdings` found: the commits the directory holds above the point (they
/// will be discarded), and, for an old primary's own log, that log's epoch
/// (`NodePlane::prepared_own_log`, recorded when its server starts).
struct Checked {
    above: u64,
    own_log_epoch: Option<u64>,
}

/// Whether the directory `data` holds every stream up to the point `p` (a failover's
/// prepare, once what it fetched is in); read off the control thread (`start_check`).
fn check_holdings(data: &std::path::Path, workers: usize, p: u64) -> Result<Checked, String> {
    let (streams, checked) = if holds_primary_log(data) {
        // An old primary chosen as a last resort (`TailReport::last_resort`): its own log,
        // which its server cuts at the point when it starts.
        let (h, epoch) =
            ditto_log::recovery::primary_log_holdings(data, Some(ditto_engine::Ts(p))).map_err(|e| e.to_string())?;
        (h.streams, Checked { above: h.txns_above, own_log_epoch: Some(epoch.0) })
    } else {
        let h = ditto_log::replica::replica_holdings(data, workers, Some(ditto_engine::Ts(p)))
            .map_err(|e| e.to_string())?;
        (h.streams, Checked { above: h.txns_above, own_log_epoch: None })
    };
    if streams.iter().any(|s| s.0 < p) {
        return Err(format!("holds only {streams:?} of the streams, below the point {p}"));
    }
    Ok(checked)
}

/// One line of what the node does, with the wall-clock time in seconds (to the
/// millisecond) so that nodes' lines can be put in one order.
fn say(me: NodeId, what: impl std::fmt::Display) {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    ditto_server::say!("{}.{:03} node {me}: {what}", t.as_secs(), t.subsec_millis());
}

impl NodePlane {
    fn new(
        cfg: &NodeConfig,
        gate: SharedGate,
        history: History,
        warm: Warmer,
        waker: Arc<std::sync::OnceLock<Waker>>,
        leases: Arc<Leases>,
    ) -> NodePlane {
        NodePlane {
            me: cfg.id,
            secret: cfg.secret.clone(),
            password: cfg.password.clone(),
            config_file: cfg.config_file.clone(),
            gate,
            history,
            members: cfg.members.clone(),
            data: cfg.dir.join("data"),
            child_args: cfg.child_args.clone(),
            workers: cfg.workers,
            child: None,
            state: ControlState::default(),
            fence: 0,
            may_serve: None,
            caught_up: false,
            prepared: None,
            fetching: Default::default(),
            unclean: None,
            unclean_caught_up: None,
            restart_after: Instant::now(),
            backup_backoff: None,
            stopping: None,
            heard: Vec::new(),
            serving: false,
            settled: None,
            in_place: cfg.promote_in_place,
            stop_timeout: cfg.stop_timeout,
            warm,
            waker,
            count_discarded: None,
            prepared_own_log: None,
            prepare_check: None,
            report_warm: None,
            report_read_done: Arc::new(AtomicBool::new(false)),
            count_after_follow: None,
            gives_up: None,
            switching: None,
            drained: Default::default(),
            drained_in: None,
            switch_asked: Default::default(),
            leases,
        }
    }

    /// A backup server of this node that is stopping unfenced may have acked its primary
    /// up to now (it drains, acking, until it exits).
    fn note_acks(&self) {
        if self.stopping.as_ref().is_some_and(|s| unfenced_backup(&s.child)) {
            self.leases.acked_until(Instant::now());
        }
    }

    /// `TailReport::acked_ms_ago`: 0 while a backup server of this node runs unfenced (it
    /// may ack at any moment); else from when its servers last acked, as far as it knows
    /// (a fenced server said when; one that stopped or died, when it was seen gone).
    /// (Not "now" noted while a backup runs: a fence at a failover's start comes a failure
    /// timeout after the primary's death, and that would make every failover wait that
    /// long again; measured so at first: 564 ms against 314 ms.)
    fn acked_ms_ago(&self) -> u64 {
        self.note_acks();
        if self.child.as_ref().is_some_and(unfenced_backup) {
            return 0;
        }
        match *self.leases.acked.lock() {
            Some(t) => t.elapsed().as_millis() as u64,
            None => ditto_cluster::failover::NEVER_ACKED,
        }
    }

    /// `TailReport::took_writes`: this node's server was opened for writes as the open
    /// epoch's primary.
    fn took_writes(&self) -> bool {
        let open = self.state.open_epoch().map(|e| e.epoch);
        open.is_some_and(|e| e > 0 && self.leases.took_writes_in.load(Ordering::Acquire) == e)
    }

    /// Tells the server to stop and waits for it at most `SERVER_WAIT`: `poll_stop` sees
    /// its exit later (and kills it after the stop timeout).
    fn stop_child(&mut self, why: &str) {
        // (One server stops at a time: none starts while another stops.)
        self.poll_stop(self.stop_timeout + Duration::from_secs(1));
        // The next server starts undrained.
        self.drained_in = None;
        self.serving = false;
        let Some(c) = self.child.take() else { return };
        // "stop" on its standard input: a backup makes what it received durable, a
        // primary flushes its log; a server still starting does so once it serves (a
        // signal could land before its handler and kill it mid-drain). Its standard input
        // goes with it (a closed one makes the server exit at once); the gate is empty
        // until the next server starts.
        let mut stdin = std::mem::take(&mut *self.gate.lock()).stdin;
        let told = stdin.as_mut().is_some_and(|p| p.send("stop"));
        // One that did not answer its fence will not answer this either, nor one that
        // cannot be told: killed at once.
        let now = Instant::now();
        let kill_at = if c.unresponsive || (stdin.is_some() && !told) { now } else { now + self.stop_timeout };
        self.stopping = Some(Stopping { child: c, stdin, since: now, kill_at, killed: false, why: why.to_string() });
        self.poll_stop(SERVER_WAIT);
    }

    /// Whether no server is stopping any longer; waits up to `wait` for one that is (and
    /// kills it once it has had the stop timeout, and then waits for it as before: a process
    /// in uninterruptible I/O dies only once that I/O ends).
    fn poll_stop(&mut self, wait: Duration) -> bool {
        let Some(st) = &mut self.stopping else { return true };
        if let Some(p) = &mut st.stdin {
            p.flush();
        }
        let t = Instant::now();
        let clean = loop {
            match st.child.proc.try_wait() {
                Ok(Some(status)) => break status.success() && !st.killed,
                Ok(None) => {
                    if !st.killed && Instant::now() >= st.kill_at {
                        let waited = st.since.elapsed().as_secs_f64();
                        tracing::error!("node {}: the server did not stop within {waited:.1} s; killing it", self.me);
                        let _ = st.child.proc.kill();
                        st.killed = true;
                    }
                    if t.elapsed() >= wait {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    if let Some(p) = &mut st.stdin {
                        p.flush(); // ("stop" may still wait for room in the pipe)
                    }
                }
                Err(e) => {
                    // (Not taken for stopped while it may run on: killed and waited for,
                    // so that the next server never starts beside it; found by a review.)
                    tracing::error!("node {}: waiting for the server: {e}; killing it", self.me);
                    let _ = st.child.proc.kill();
                    let _ = st.child.proc.wait();
                    break false;
                }
            }
        };
        // (A backup that stopped may have acked up to its exit.)
        self.note_acks();
        let mut st = self.stopping.take().expect("checked");
        drop(st.stdin.take());
        // Every line it printed is read once its output ends (it has exited).
        if let Some(r) = st.child.reader.take() {
            let _ = r.join();
        }
        // (A server of an epoch that a failover has since closed lost, if anything, only
        // what that epoch's recovery point already decided on without this node.)
        if !clean && self.may_have_lost_acknowledged(&st.child) {
            self.unclean = Some(st.child.role.epoch());
            self.unclean_caught_up = None;
        }
        say(
            self.me,
            format!("stopped {:?} in {:.1} ms ({})", st.child.role, st.since.elapsed().as_secs_f64() * 1e3, st.why),
        );
        true
    }

    /// Whether `child`, a server that ended uncleanly (killed, or exited with an error),
    /// may have acknowledged what is not on its disk: a counted backup that had joined
    /// (one still joining had acknowledged nothing; a learner's acknowledgements never
    /// counted; a primary's log holds all it acknowledged), not fenced (a fence that
    /// completed made everything it received durable, and it acknowledges nothing after),
    /// of the open epoch or later (a server of an epoch a failover has since closed lost,
    /// if anything, only what that epoch's recovery point already decided on without
    /// this node). Such a node does not report until the next epoch opens (`report`).
    /// (Until 2026-12-03 a server that died on its own, seen by `reconcile`, was never
    /// marked, and one killed after its fence completed was; found by a review.)
    fn may_have_lost_acknowledged(&self, child: &Running) -> bool {
        let open = self.state.open_epoch().map_or(0, |e| e.epoch);
        matches!(child.role, Role::Backup { learner: false, .. })
            && child.joined.load(Ordering::Acquire)
            && !child.fenced.load(Ordering::Acquire)
            && child.role.epoch() >= open
    }

    /// The role the control state gives this node now, if any.
    fn desired(&self) -> Option<Role> {
        if !self.caught_up || self.state.phase != Some(Phase::Serving) || self.state.node(self.me).is_none() {
            return None;
        }
        let open = self.state.epochs.last()?;
        if open.epoch < self.fence {
            return None;
        }
        let before = self.state.epochs.len().checked_sub(2).map(|i| &self.state.epochs[i]);
        if open.primary == self.me {
            // Only an epoch this supervisor was named for while it ran.
            (self.may_serve == Some(open.epoch)).then(|| Role::Primary {
                epoch: open.epoch,
                ts_above: open.start,
                upto: before.and_then(|b| b.recovered),
                resume_epoch: before.map(|b| b.epoch),
            })
        } else {
            Some(Role::Backup {
                epoch: open.epoch,
                of: open.primary,
                learner: self.state.learners.contains_key(&self.me),
            })
        }
    }

    /// Brings the child in line with the control state.
    fn reconcile(&mut self) {
        if !self.poll_stop(Duration::ZERO) {
            return; // the next server starts once the last one exited
        }
        if let Some(c) = &mut self.child {
            if c.changing && c.ready.load(Ordering::Acquire) {
                c.changing = false; // it serves in its new role
                if let (Some(epoch), Role::Backup { .. }) = (self.count_after_follow.take(), &c.role) {
                    say(self.me, format!("discards 0 commits of its epoch {epoch} above the recovery point (its server followed in place, its clock at the point)"));
                    let cmd = Command::CountDiscarded { epoch, node: self.me, commits: 0 };
                    self.count_discarded = Some((cmd, Instant::now() - PROPOSE_EVERY));
                }
                // An answer asked between the change's request and the server reading it
                // was the old role's: not read as the new one's.
                c.prober.new_role();
            }
            if let Ok(Some(status)) = c.proc.try_wait() {
                if unfenced_backup(c) {
                    // (It may have acked up to its exit.)
                    self.leases.acked_until(Instant::now());
                }
                // Every line it printed is read once its output ends (it has exited): a
                // server that served and died at once is seen to have served.
                if let Some(r) = c.reader.take() {
                    let _ = r.join();
                }
                let was = c.role.clone();
                let ready = c.ready.load(Ordering::Acquire);
                // (A backup that ran for a while before it exited, a join that gave up at
                // its deadline say, is no refusal repeated: not put off further.)
                let quick_exit = !c.joined.load(Ordering::Acquire) && c.started.elapsed() < BACKOFF_QUICK_EXIT;
                let changing = c.changing && !ready;
                let lost = !status.success() && self.may_have_lost_acknowledged(self.child.as_ref().expect("a child"));
                if lost {
                    self.unclean = Some(was.epoch());
                    self.unclean_caught_up = None;
                }
                self.child = None;
                self.drained_in = None;
                *self.gate.lock() = Gate::default();
                self.serving = false;
                say(self.me, format!("{was:?} exited ({status})"));
                let began = match &was {
                    Role::Primary { epoch, .. } => {
                        ditto_log::recovery::primary_log_epoch(&self.data).is_ok_and(|e| e.0 >= *epoch)
                    }
                    Role::Backup { .. } => false,
                };
                let primary = matches!(was, Role::Primary { .. });
                if primary && (began || !changing) && !ready {
                    // Named primary, it failed before it served: a promotion in place once
                    // the epoch's log had begun (that epoch is not started again here: its
                    // log holds it, and whether the server took a write before it failed is
                    // not known), or a primary started from its directory. This node
                    // proposes the failover to the next epoch itself (`gives_up_proposals`),
                    // at once, rather than leave the coordinator to wait out a new
                    // primary's start (20 s).
                    let how = if changing { "promotion in place" } else { "start" };
                    say(
                        self.me,
                        format!(
                            "its {how} as the primary of epoch {} failed before it served: it gives the epoch up",
                            was.epoch()
                        ),
                    );
                    self.may_serve = None;
                    // A start from the directory that failed (which may fail on every node
                    // alike: a port taken, say) proposes it after a second, not at once, so
                    // that such failures do not churn through epochs.
                    let first = (!changing).then(|| Instant::now() + GIVE_UP_AFTER_FAILED_START);
                    self.gives_up = Some((was.epoch(), first, "its server failed before it served"));
                    self.restart_after = Instant::now() + Duration::from_millis(500);
                } else if changing {
                    // The change in place failed before the server served: the node starts
                    // the role's server from its directory instead (it checks the point).
                    say(self.me, "its change of role in place failed: it starts the server from its directory");
                    self.restart_after = Instant::now();
                } else {
                    if primary {
                        // Never resumed: it gives the epoch up (the coordinator would fail it
                        // over too, once it missed it).
                        self.may_serve = None;
                        self.gives_up = Some((was.epoch(), None, "its server exited"));
                    }
                    self.restart_after = Instant::now() + Duration::from_millis(500);
                    if !primary {
                        self.backup_backoff = match self.backup_backoff.take() {
                            _ if !quick_exit => None,
                            Some((r, n, _)) if r == was => {
                                Some((r, n + 1, Instant::now() + backup_backoff_after(n + 1)))
                            }
                            _ => Some((was, 1, Instant::now() + backup_backoff_after(1))),
                        };
                        if let Some((_, n, _)) = self.backup_backoff.as_ref().filter(|b| b.1 > 1) {
                            say(
                                self.me,
                                format!(
                                    "its backup server exited before it joined its primary, {n} times in a row: started again in {} ms",
                                    backup_backoff_after(*n).as_millis()
                                ),
                            );
                        }
                    }
                }
            }
        }
        // Named the primary of the open epoch by a state this run did not see applied live
        // (its supervisor restarted after the epoch opened, or its server served and
        // exited): it cannot serve that epoch (`desired`), so it gives it up at once, as a
        // failed start does. Before 2026-12-02 it waited: where the coordinator never heard
        // it serve (a supervisor restarted while its new primary's server started), it
        // waited out a new primary's start (20 s) with no primary.
        if self.caught_up && self.gives_up.is_none() && self.state.phase == Some(Phase::Serving) {
            if let Some(open) = self.state.epochs.last().filter(|e| {
                e.primary == self.me
                    && e.epoch == self.state.epoch
                    && e.epoch >= self.fence
                    && self.may_serve != Some(e.epoch)
                    && self.child.as_ref().is_none_or(|c| !matches!(c.role, Role::Primary { .. }))
            }) {
                say(
                    self.me,
                    format!(
                        "is named the primary of epoch {}, which it cannot serve (it was not named while it ran): it gives the epoch up",
                        open.epoch
                    ),
                );
                self.gives_up = Some((open.epoch, None, "its supervisor restarted after it was named"));
            }
        }
        // A fence asked for (`fenced`) that failed, or was not answered in time, stops the
        // server even before this node's state has the failover.
        if self.child.as_ref().is_some_and(|c| c.fence_asked.is_some()) && self.fence_in_place(false) == Fencing::Failed
        {
            return self.stop_child("its fence in place failed");
        }
        let want = self.desired();
        if self.child.as_ref().map(|c| &c.role) == want.as_ref() {
            return;
        }
        // A learner promoted: its backup, joined and following the same primary, is told
        // to count from now on (it connects again, as a counted backup), keeping its
        // engine, its directory and its clients' connections. Not yet joined, it is
        // waited for.
        if let (Some(c), Some(w @ Role::Backup { epoch, of, learner: false })) = (&mut self.child, &want) {
            let same_link =
                matches!(c.role, Role::Backup { epoch: e, of: o, learner: true } if e == *epoch && o == *of);
            if same_link && c.fence_asked.is_none() && !c.fenced.load(Ordering::Acquire) {
                // (Still following in place, or joining: told once it has.)
                if c.changing || !(c.ready.load(Ordering::Acquire) && c.joined.load(Ordering::Acquire)) {
                    return;
                }
                if tell_server(&self.gate, "count") {
                    c.role = w.clone();
                    c.count_told = Some(Instant::now());
                    say(self.me, "promoted: its backup counts in the primary's quorum from now on (in place)");
                    return;
                }
            }
        }
        // A backup fenced in place serves reads through the failover (it is looked at
        // again next turn while its fence is under way).
        match self.fence_in_place(want.is_none()) {
            Fencing::Pending => return,
            Fencing::Done if want.is_none() => return,
            _ => {}
        }
        let fenced = self.child.as_ref().is_some_and(|c| c.fenced.load(Ordering::Acquire));
        if let (true, Some(Role::Primary { epoch, ts_above, upto: Some(p), resume_epoch: Some(e) })) = (fenced, &want) {
            // (A backup only: an old primary chosen as a last resort starts a new server
            // from its log, cut at the point.)
            let backup = |c: &Running| matches!(c.role, Role::Backup { .. }) && c.role.epoch() == *e;
            if self.child.as_ref().is_some_and(backup) {
                return self.promote_in_place(*epoch, *ts_above, *p, *e);
            }
        }
        if let (true, Some(Role::Backup { epoch, of, learner })) = (fenced, &want) {
            // The epoch its server followed, cut at the failover's point.
            let n = self.state.epochs.len();
            let cut = n.checked_sub(2).map(|i| &self.state.epochs[i]).and_then(|b| Some((b.epoch, b.recovered?)));
            // (Only as it runs: a learner promoted meanwhile, or a member turned learner,
            // is a new server, since its server keeps its flag when it follows in place.)
            let same_kind = |c: &Running| match c.role {
                Role::Backup { learner: l, .. } => l == *learner,
                Role::Primary { .. } => !*learner,
            };
            if let Some((_, p)) =
                cut.filter(|(e, _)| self.child.as_ref().is_some_and(|c| c.role.epoch() == *e && same_kind(c)))
            {
                return self.follow_in_place(*epoch, *of, p, *learner);
            }
        }
        if self.child.is_some() {
            self.stop_child("its role changed");
            if self.stopping.is_some() {
                return; // the next server starts once this one exited
            }
        }
        let Some(role) = want else { return };
        if Instant::now() < self.restart_after {
            return;
        }
        if self.backup_backoff.as_ref().is_some_and(|(r, _, until)| *r == role && Instant::now() < *until) {
            return;
        }
        if let Err(e) = self.start_child(role.clone()) {
            tracing::error!("node {}: starting {role:?}: {e}", self.me);
            self.restart_after = Instant::now() + Duration::from_millis(500);
        }
    }

    fn start_child(&mut self, role: Role) -> Result<(), String> {
        // A follow in place that did not happen: a backup started from the directory
        // counts what it discards from its log (below).
        self.count_after_follow = None;
        // Its server writes the directory: reads cached for reports no longer hold.
        ditto_log::replica::forget_holdings();
        self.report_warm = None;
        // A new server: its link is news only once seen up (a server replaced within one
        // `reconcile` was never seen gone by the probe).
        self.warm.say(WarmLink::Off);
        let me = self.addrs(self.me).ok_or("this node's own addresses are unknown")?;
        let of_addrs = match &role {
            Role::Backup { of, .. } => Some(self.addrs(*of).ok_or(format!("node {of}'s addresses are unknown"))?),
            Role::Primary { .. } => None,
        };
        std::fs::create_dir_all(&self.data).map_err(|e| format!("creating {}: {e}", self.data.display()))?;
        self.take_cluster_database()?;
        self.finish_promotion()?;
        let mut args: Vec<String> = vec!["server".into(), "--data-dir".into(), self.data.display().to_string()];
        args.extend(["--bind".into(), me.host.clone(), "--port".into(), me.client.to_string()]);
        args.extend(["--workers".into(), self.workers.to_string()]);
        args.extend(self.child_args.iter().cloned());
        args.extend(["--exit-with-stdin".into(), "--commit-policy".into(), self.state.policy.clone()]);
        args.extend(["--backups".into(), (self.state.members.len().saturating_sub(1)).to_string()]);
        args.extend(["--members-config".into(), self.state.config.to_string()]);
        // The name its backups give their primary: its client address as the control state
        // has it, which is what a primary is told to count (`backups N CONFIG ADDRS`).
        if let Some(m) = self.state.node(self.me) {
            args.extend(["--replica-name".into(), m.addr.clone()]);
        }
        match &role {
            Role::Primary { epoch, ts_above, upto, resume_epoch } => {
                let own = ditto_log::recovery::primary_log_epoch(&self.data).map_or(0, |e| e.0);
                if own > 0 && own < *epoch {
                    // An old primary chosen as a last resort: its server cuts its own log at
                    // the point; what it holds above is recorded, as at a rejoin (counted
                    // when it prepared, or read now).
                    match self.prepared_own_log.take() {
                        Some((e, point, commits))
                            if e == own && self.state.recovery_point(e).map(|t| t.0) == Some(point) =>
                        {
                            self.record_discarded(e, point, commits)
                        }
                        _ => self.count_what_it_discards(),
                    }
                }
                args.extend(["--repl-port".into(), me.repl.to_string(), "--run-epoch".into(), epoch.to_string()]);
                args.extend(["--ts-above".into(), ts_above.to_string()]);
                if let Some(p) = upto {
                    args.extend(["--recover-upto".into(), p.to_string()]);
                }
                if let Some(e) = resume_epoch {
                    args.extend(["--resume-epoch".into(), e.to_string()]);
                }
                // A backup's directory that followed an older epoch than the recovered one
                // (this node missed that epoch's failover): its batches of that epoch and
                // the next ones above their points, which failovers discarded, are not
                // replayed.
                let followed = (own == 0).then(|| followed_epoch(&self.data)).flatten();
                if let (Some(f), Some(r)) = (followed, resume_epoch) {
                    let list: Vec<String> =
                        (f..*r).filter_map(|e| self.state.recovery_point(e).map(|p| format!("{e}:{}", p.0))).collect();
                    if !list.is_empty() {
                        say(
                            self.me,
                            format!(
                                "its directory followed epoch {f}: its promotion cuts the batches of each epoch before {r} at that epoch's point ({})",
                                list.join(", ")
                            ),
                        );
                        args.extend(["--epoch-cuts".into(), list.join(",")]);
                    }
                }
            }
            Role::Backup { .. } => {
                let of = of_addrs.expect("a backup's primary");
                // Its cut: what it holds of the epoch it followed, if a failover cut that.
                let mut upto = followed_epoch(&self.data).and_then(|e| self.state.recovery_point(e)).map(|t| t.0);
                if holds_primary_log(&self.data) {
                    // This node was a primary: its log may hold commits above the recovery
                    // point. They are counted first; its server then cuts the log at the
                    // point and follows the new primary from there (a log whose durable cut
                    // lies below the point is sent the rest), without copying its data
                    // (`ditto_log::replica::open_replica_upto`).
                    let epoch = ditto_log::recovery::primary_log_epoch(&self.data).map_err(|e| e.to_string())?;
                    let point = self
                        .state
                        .recovery_point(epoch.0)
                        .ok_or_else(|| format!("its log is of epoch {}, which no failover has cut yet", epoch.0))?;
                    self.count_what_it_discards();
                    if ditto_log::replica::can_cut_at(&self.data, point).map_err(|e| e.to_string())? {
                        upto = Some(point.0);
                        say(
                            self.me,
                            format!(
                                "rejoins as a backup: its own log of epoch {} is cut at the recovery point {}",
                                epoch.0, point.0
                            ),
                        );
                    } else {
                        // Its checkpoint holds commits above the point: it starts over from
                        // the new primary's checkpoint. The old directory is kept aside
                        // until it has joined (it may hold the only other copy of a
                        // released commit while the new primary's backups catch up), and
                        // the node does not report meanwhile.
                        let old = self.old_primary_dir();
                        if old.exists() {
                            std::fs::remove_dir_all(&old).map_err(|e| format!("clearing {}: {e}", old.display()))?;
                        }
                        std::fs::rename(&self.data, &old)
                            .map_err(|e| format!("moving {} aside: {e}", self.data.display()))?;
                        std::fs::create_dir_all(&self.data)
                            .map_err(|e| format!("creating {}: {e}", self.data.display()))?;
                        upto = None;
                        say(
                            self.me,
                            format!(
                                "rejoins as a backup: its checkpoint lies above the recovery point {}, so its log is set aside and it copies the primary's checkpoint",
                                point.0
                            ),
                        );
                    }
                }
                args.extend(["--replica-of".into(), of.repl_addr()]);
                args.extend(["--primary-addr".into(), of.client_addr()]);
                if let Some(t) = of.tls_addr() {
                    args.extend(["--primary-tls-addr".into(), t]);
                }
                if self.in_place {
                    // Its role may change in place only if its replay is held at the
                    // primary's release (docs/cluster.md, "In-place promotion and following").
                    args.push("--hold-replay".into());
                }
                if matches!(role, Role::Backup { learner: true, .. }) {
                    args.push("--learner".into());
                }
                if let Some(p) = upto {
                    args.extend(["--recover-upto".into(), p.to_string()]);
                }
            }
        }
        if crate::memory::node_turned_thp_off() {
            // (Turned on again by the server itself: a `pre_exec` hook would make every
            // spawn fork the node instead of `posix_spawn`.)
            args.push("--thp-back".into());
        }
        let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
        let mut proc = Proc::new(exe);
        match &self.secret {
            // One per line, the one shown first (a secret holds no line break).
            Some(secret) => proc.env(
                LINK_SECRET_ENV,
                std::iter::once(&secret.shown).chain(&secret.also).map(|s| s.0.as_str()).collect::<Vec<_>>().join("\n"),
            ),
            // (Not one this node's own environment happened to hold.)
            None => proc.env_remove(LINK_SECRET_ENV),
        };
        let mut proc = proc
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the server: {e}"))?;
        *self.gate.lock() = Gate {
            stdin: match proc.stdin.take().map(Pipe::new).transpose() {
                Ok(p) => p,
                Err(e) => {
                    let _ = proc.kill();
                    let _ = proc.wait();
                    return Err(format!("making the server's standard input non-blocking: {e}"));
                }
            },
            primary: matches!(role, Role::Primary { .. }),
            open: false, // a new primary's server starts with its writes refused
            until_ms: 0,
            since: Some(Instant::now()),
            info: Vec::new(),
            // (None yet: a primary is sent the members it counts before it takes writes.)
            config: u64::MAX,
        };
        let ready = Arc::new(AtomicBool::new(false));
        let joined = Arc::new(AtomicBool::new(false));
        let (fenced, fence_failed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let out = proc.stdout.take().expect("piped");
        let (r, j, me_id) = (Arc::clone(&ready), Arc::clone(&joined), self.me);
        let (f, ff) = (Arc::clone(&fenced), Arc::clone(&fence_failed));
        let leases = Arc::clone(&self.leases);
        let history = Arc::clone(&self.history);
        let drained = Arc::clone(&self.drained);
        let switch_asked = Arc::clone(&self.switch_asked);
        let reader = std::thread::spawn(move || {
            each_line(out, |line| {
                if let Some(rest) = line.strip_prefix("ditto server drained at ts ") {
                    if let Some(Ok(ts)) = rest.split_whitespace().next().map(str::parse::<u64>) {
                        *drained.lock() = Some(Ok(ts));
                    }
                }
                if let Some(why) = line.strip_prefix("ditto server drain failed: ") {
                    *drained.lock() = Some(Err(why.to_string()));
                }
                if line == "ditto server asks for a switchover" {
                    switch_asked.store(true, Ordering::Release);
                }
                if let Some(change) = role_change_of(line) {
                    // The failover that gave it the role: the last one this node saw.
                    if let Some(last) = history.lock().last_mut() {
                        last.role_change = Some(change);
                    }
                }
                if line.starts_with("ditto server joined its primary") {
                    j.store(true, Ordering::Release);
                }
                if let Some(ago) = fenced_line(line) {
                    // (Its last ack before the flag: a report waits for the flag, then
                    // reads when this node last acked.)
                    if let Some(ago) = ago {
                        // (An age past the clock's start, from a garbled line: now.)
                        leases.acked_until(Instant::now().checked_sub(ago).unwrap_or_else(Instant::now));
                    }
                    f.store(true, Ordering::Release);
                }
                if line.starts_with("ditto server fence failed") {
                    ff.store(true, Ordering::Release);
                }
                if line.starts_with("ditto server listening on") {
                    r.store(true, Ordering::Release);
                }
                say(me_id, format!("server: {line}"));
            })
        });
        // The password the server about to start reads from the same file.
        if let Some(path) = &self.config_file {
            match ditto_server::config::Config::load(path) {
                Ok(c) => self.password = c.requirepass,
                Err(e) => {
                    say(self.me, format!("reading {} again: {e}; its probe keeps the password it had", path.display()))
                }
            }
        }
        let prober = match Prober::start(
            self.me,
            me.client_addr(),
            self.password.clone(),
            Arc::clone(&ready),
            Arc::clone(&self.waker),
        ) {
            Ok(p) => p,
            Err(e) => {
                *self.gate.lock() = Gate::default();
                let _ = proc.kill();
                let _ = proc.wait();
                return Err(e);
            }
        };
        say(self.me, format!("started {role:?} (pid {})", proc.id()));
        self.child = Some(Running {
            role,
            proc,
            ready,
            joined,
            reader: Some(reader),
            prober,
            fence_asked: None,
            unresponsive: false,
            fenced,
            fence_failed,
            changing: false,
            count_told: None,
            started: Instant::now(),
            role_since: Instant::now(),
        });
        Ok(())
    }

    /// Has the fenced backup child become the primary of `epoch` in place: it replays up
    /// to the point `upto` of epoch `resume_epoch` and keeps its engine (docs/cluster.md,
    /// "In-place promotion and following"). Its write gate starts closed, as a new primary's does.
    fn promote_in_place(&mut self, epoch: u64, ts_above: u64, upto: u64, resume_epoch: u64) {
        let Some(me) = self.addrs(self.me) else { return self.stop_child("this node's own addresses are unknown") };
        let backups = self.state.members.len().saturating_sub(1);
        let line =
            format!("promote {epoch} {ts_above} {upto} {resume_epoch} {} {} {backups}", self.state.config, me.repl);
        let role = Role::Primary { epoch, ts_above, upto: Some(upto), resume_epoch: Some(resume_epoch) };
        self.change_in_place(&line, role);
        say(self.me, format!("promotes its backup in place: primary of epoch {epoch} from the point {upto}"));
    }

    /// Has the fenced backup child follow `of`, the primary of `epoch`, in place: it
    /// replays what it holds up to the point `upto`, keeps its engine and joins `of` with
    /// it (docs/cluster.md, "In-place promotion and following").
    fn follow_in_place(&mut self, epoch: u64, of: NodeId, upto: u64, learner: bool) {
        let Some(o) = self.addrs(of) else { return self.stop_child(&format!("node {of}'s addresses are unknown")) };
        if let Some(Role::Primary { epoch: served, .. }) = self.child.as_ref().map(|c| &c.role) {
            // A switchover's old primary (drained): its server follows in place only if its
            // clock stands at the point (`primary_follows_in_place`), so its log holds
            // nothing above it, and it discards nothing: counted once the follow is done.
            // (Read from its whole log here, that took the control thread 358 ms with
            // 1.9M keys on the VM.) If the follow fails, the restart counts from the log.
            self.count_after_follow = Some(*served);
        }
        let line = format!("follow {} {} {upto}{}", o.repl_addr(), o.client_addr(), o.tls_word());
        self.change_in_place(&line, Role::Backup { epoch, of, learner });
        say(self.me, format!("has its backup follow node {of} (epoch {epoch}) in place from the point {upto}"));
    }

    /// Asks the child, a backup fenced in place, for `line` (`promote ...` or `follow
    /// ...`), after which it runs as `role`; stops it if it cannot be asked.
    fn change_in_place(&mut self, line: &str, role: Role) {
        let Some(c) = &mut self.child else { return };
        // Before the line: the server says again that it listens (and a backup that it
        // joined) once it has.
        for f in [&c.ready, &c.joined, &c.fenced, &c.fence_failed] {
            f.store(false, Ordering::Release);
        }
        c.prober.new_role();
        c.role_since = Instant::now();
        c.fence_asked = None;
        c.changing = true;
        let primary = matches!(role, Role::Primary { .. });
        c.role = role;
        let mut g = self.gate.lock();
        let sent = g.stdin.as_mut().is_some_and(|p| p.send(line));
        // (A primary is sent the members it counts before it takes writes.)
        *g = Gate {
            stdin: g.stdin.take(),
            primary,
            open: false,
            until_ms: 0,
            since: Some(Instant::now()),
            info: Vec::new(),
            config: u64::MAX,
        };
        drop(g);
        if !sent {
            self.stop_child("it could not be asked to change its role in place");
        }
    }

    /// Fences a running backup child in place (it keeps serving reads, `Backup::fence`):
    /// tells it `fence` if `ask` and it was not told yet, and says how that goes. The
    /// control thread does not wait for the answer: `report` waits a little for it.
    fn fence_in_place(&mut self, ask: bool) -> Fencing {
        let Some(c) = &mut self.child else { return Fencing::Failed };
        if let Role::Primary { epoch, .. } = c.role {
            // A switchover's old primary, drained: fenced in place too (its server stops
            // shipping and closes its log, so it neither commits nor releases anything
            // more, and its log says all it holds), it serves reads, and follows the new
            // primary in place (`follow_in_place`; its server's `primary_follows_in_place`).
            if !(self.in_place && self.drained_in == Some(epoch) && c.ready.load(Ordering::Acquire)) {
                return Fencing::Failed;
            }
            self.serving = false;
        } else if !self.in_place
            || !matches!(c.role, Role::Backup { .. })
            || !c.ready.load(Ordering::Acquire)
            || !c.joined.load(Ordering::Acquire)
        {
            return Fencing::Failed;
        }
        if c.fenced.load(Ordering::Acquire) {
            if let Some(t) = c.fence_asked.take() {
                let ms = t.elapsed().as_secs_f64() * 1e3;
                say(self.me, format!("fenced its server in place in {ms:.1} ms (it serves reads)"));
            }
            return Fencing::Done;
        }
        match c.fence_asked {
            Some(t) => {
                if c.fence_failed.load(Ordering::Acquire) || !matches!(c.proc.try_wait(), Ok(None)) {
                    return Fencing::Failed;
                }
                if t.elapsed() >= self.stop_timeout {
                    if !c.unresponsive {
                        tracing::error!(
                            "node {}: the server did not answer its fence within {:?}",
                            self.me,
                            self.stop_timeout
                        );
                    }
                    c.unresponsive = true;
                    return Fencing::Failed;
                }
            }
            None if !ask => return Fencing::Failed,
            None => {
                let mut g = self.gate.lock();
                if !g.stdin.as_mut().is_some_and(|p| p.send("fence")) {
                    return Fencing::Failed;
                }
                c.fence_asked = Some(Instant::now());
            }
        }
        Fencing::Pending
    }

    /// Waits up to `wait` for a fence in place under way to be answered.
    fn wait_fence(&mut self, wait: Duration) {
        let t = Instant::now();
        while self.fence_in_place(false) == Fencing::Pending && t.elapsed() < wait {
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// An old primary about to rejoin counts its own commits above its epoch's recovery
    /// point (they are discarded with its log), and has the count recorded in the control
    /// state (`Command::CountDiscarded`), where `INFO cluster` shows it with the failover.
    fn count_what_it_discards(&mut self) {
        // The epoch from the file names; the log is read once, below.
        let epoch = match ditto_log::recovery::primary_log_epoch(&self.data) {
            Ok(e) => e.0,
            Err(e) => return tracing::warn!("node {}: reading its old log: {e}", self.me),
        };
        let Some(point) = self.state.recovery_point(epoch) else { return };
        match ditto_log::recovery::primary_log_holdings(&self.data, Some(point)) {
            Ok((h, _)) => self.record_discarded(epoch, point.0, h.txns_above),
            Err(e) => tracing::warn!("node {}: counting what its old log holds above {}: {e}", self.me, point.0),
        }
    }

    /// Has the state record what this node's own log of `epoch` held above the recovery
    /// point `point` (proposed until it does).
    fn record_discarded(&mut self, epoch: u64, point: u64, commits: u64) {
        say(
            self.me,
            format!("discards {commits} commits of its epoch {epoch} above the recovery point {point} (its own log)"),
        );
        let cmd = Command::CountDiscarded { epoch, node: self.me, commits };
        self.count_discarded = Some((cmd, Instant::now() - PROPOSE_EVERY));
    }

    /// A promotion of this node's directory that a crash cut short once its checkpoint at
    /// the point was written is finished first (`backup::finish_cut_short_promotion`):
    /// otherwise the directory would read as holding, above the point its followed epoch
    /// was cut at, what that failover discarded, and the node would report itself not
    /// eligible although it holds exactly the recovered history. Called only while no
    /// server writes the directory (before a report's read, before a server starts).
    /// Writes the cluster's database id (`ControlState::database`) into this node's
    /// directory where it names none yet, before its server starts: whichever node's
    /// server first opens its directory (a backup's join, or a primary's open) finds the
    /// cluster's id, and every node's names one database. A directory naming another is
    /// left as it is: its server says so when its primary refuses it.
    fn take_cluster_database(&self) -> Result<(), String> {
        let Some(id) = ditto_log::identity::DatabaseId::from_wire(self.state.database) else { return Ok(()) };
        match ditto_log::identity::read(&self.data) {
            Ok(None) => ditto_log::identity::write(&self.data, id, &ditto_log::storage::RealStorage)
                .map_err(|e| format!("writing the cluster's database id: {e}")),
            Ok(Some(_)) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    fn finish_promotion(&self) -> Result<(), String> {
        match ditto_replication::backup::finish_cut_short_promotion(&self.data) {
            Ok(Some(p)) => {
                say(
                    self.me,
                    format!(
                        "a promotion of its directory, cut short after its checkpoint at the point {}, is finished: it holds the recovered history up to there",
                        p.0
                    ),
                );
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(format!("finishing a promotion cut short: {e}")),
        }
    }

    /// Whether what this node's directory holds may be reported (or served to a fetch):
    /// no server writes it, and the last one stopped cleanly.
    fn reportable(&self) -> Result<(), String> {
        if !self.child_quiet() {
            return Err("the server still runs (not fenced)".into());
        }
        if self.unclean.is_some() {
            return Err("its last server did not stop cleanly: what it acknowledged may not be on disk".into());
        }
        Ok(())
    }

    /// What this node holds, read now (`report` reads it on a thread first), once
    /// `reportable`; its leases as the most cautious values (acked just now, took no
    /// writes), which `report` fills in.
    fn holding_now(&self) -> Result<Holding, String> {
        self.finish_promotion()?;
        // An old primary (its own log, or the log it set aside while it rejoins) reports
        // what its log holds, capped at its epoch's cut, and may not be chosen: a backup
        // is, and fetches what it lacks from this log.
        if let Some(dir) = self.primary_log_dir() {
            let (h, epoch) = ditto_log::recovery::primary_log_holdings(&dir, None).map_err(|e| e.to_string())?;
            let cap = self.state.recovery_point(epoch.0).map_or(u64::MAX, |t| t.0);
            let streams: Vec<u64> = h.streams.iter().map(|t| t.0.min(cap)).collect();
            // Chosen only if no backup can fetch what it lacks and this log lacks nothing:
            // its server then starts from it, cut at the point (which lies at or above
            // what it holds on every stream, where it can be cut: checked). Not while
            // the log is set aside (its directory is being refilled).
            let least = ditto_engine::Ts(streams.iter().copied().min().unwrap_or(0));
            let last_resort = dir == self.data
                && ditto_log::replica::can_cut_at(&dir, least).map_err(|e| format!("reading its log: {e}"))?;
            let serves_above = ditto_log::recovery::primary_fetch_floor(&dir, self.own_log_start(&dir))
                .map_err(|e| format!("reading where its log starts: {e}"))?
                .0;
            return Ok(Holding {
                newest: h.newest.0.min(cap),
                streams,
                eligible: false,
                serves_above,
                last_resort,
                own_epoch: epoch.0,
                acked_ms_ago: 0,
                took_writes: false,
            });
        }
        let h = ditto_log::replica::replica_holdings(&self.data, self.workers, None).map_err(|e| e.to_string())?;
        // A copy moved in and not loaded (its backup follows epoch 0 until it is): of an
        // epoch it does not know, so nothing it holds is vouched for, and it may not be
        // chosen (its next start copies again).
        if followed_epoch(&self.data) == Some(0) {
            return Ok(Holding {
                streams: vec![0; h.streams.len()],
                newest: 0,
                eligible: false,
                serves_above: u64::MAX,
                last_resort: false,
                own_epoch: 0,
                acked_ms_ago: 0,
                took_writes: false,
            });
        }
        // What this node holds of an epoch that a failover since cut is held only up to the
        // cut: the rest is discarded when its server starts (`--recover-upto`), or when it
        // is promoted (`--epoch-cuts`).
        let cut = followed_epoch(&self.data).and_then(|e| self.state.recovery_point(e));
        let cap = cut.map_or(u64::MAX, |t| t.0);
        // A checkpoint above that cut (its server opened its whole log before this node
        // learned of the failover: a restart) holds commits the failover discarded, and
        // cannot be cut back to it: such a node may not be chosen; as a backup it copies the
        // primary's data (docs/cluster.md, "A node that missed an epoch").
        let eligible = match cut {
            Some(p) => ditto_log::replica::can_cut_at(&self.data, p).map_err(|e| format!("reading its log: {e}"))?,
            None => true,
        };
        Ok(Holding {
            streams: h.streams.iter().map(|t| t.0.min(cap)).collect(),
            newest: h.newest.0.min(cap),
            eligible,
            serves_above: fetch_floor(&self.data)?,
            last_resort: false,
            own_epoch: 0,
            acked_ms_ago: 0,
            took_writes: false,
        })
    }

    /// Where the epoch of the primary's own log in `dir` began (its commits lie above it,
    /// everything of older epochs at or below it), as the control state has it;
    /// `Ts(u64::MAX)` if it does not.
    fn own_log_start(&self, dir: &Path) -> ditto_engine::Ts {
        let epoch = ditto_log::recovery::primary_log_epoch(dir).map_or(0, |e| e.0);
        let start = self.state.epochs.iter().find(|r| r.epoch == epoch).map(|r| r.start);
        ditto_engine::Ts(start.unwrap_or(u64::MAX))
    }

    fn addrs(&self, id: NodeId) -> Option<MemberAddrs> {
        addrs_of(&self.state, &self.members, id)
    }

    /// The directory of this node's own primary log, if it holds one: its data (an old
    /// primary not yet rejoined), or the old log it set aside while it rejoins, until the
    /// copy of the new primary's checkpoint is loaded. From then on its backup follows the
    /// new epoch (the epoch is saved before it receives a batch) and may acknowledge the
    /// new primary's commits, which only its data directory holds (the copy holds all the
    /// old epoch released, up to the recovery point) (before 2026-12-03 it reported from
    /// the old log until a probe saw its link up and deleted it, so a failover in between
    /// counted none of what it had acknowledged; found by a review). Nor once its data
    /// holds a primary log of its own: promoted after the copy loaded (a promotion removes
    /// the followed epoch's record), before a probe saw its link up and dropped the old
    /// log, it reported from the old log as primary of the next epoch, and counted none of
    /// what it had released (found by a review, 2026-12-03).
    fn primary_log_dir(&self) -> Option<PathBuf> {
        let old = self.old_primary_dir();
        if old.exists() && followed_epoch(&self.data).is_none_or(|e| e == 0) && !holds_primary_log(&self.data) {
            return Some(old);
        }
        holds_primary_log(&self.data).then(|| self.data.clone())
    }

    /// Where an old primary's directory waits while the node rejoins (`drop_old_primary`).
    fn old_primary_dir(&self) -> PathBuf {
        old_primary_of(&self.data)
    }

    /// Starts the check of this node's directory against the plan's point on a thread of
    /// its own (`check_holdings`; `prepared` takes its answer): counting what lies above
    /// the point reads the whole log, uncached (an old primary's 466 MB took 111-384 ms),
    /// and the control thread would stop ticking Raft meanwhile.
    fn start_check(&mut self, plan: &RecoveryPlan) {
        let (data, workers, point) = (self.data.clone(), self.workers, plan.recovery_point);
        match reads_its_log_off_thread("ditto-prepare", move || check_holdings(&data, workers, point)) {
            Ok(rx) => self.prepare_check = Some((point, rx)),
            Err(e) => self.prepared = Some(Err(e)),
        }
    }

    /// No child writes this node's directory: none runs, or it is a backup fenced in place.
    fn child_quiet(&self) -> bool {
        self.stopping.is_none() && self.child.as_ref().is_none_or(|c| c.fenced.load(Ordering::Acquire))
    }

    /// The failover away from the epoch this node, named its primary, gave up (see
    /// `gives_up`), proposed every `PROPOSE_EVERY` until an epoch after it begins.
    fn gives_up_proposals(&mut self) -> Vec<Command> {
        let Some((epoch, at, why)) = self.gives_up else { return Vec::new() };
        if self.state.epoch != epoch || self.state.open_epoch().is_none_or(|e| e.epoch != epoch) {
            self.gives_up = None; // begun (or not this epoch's to give up any longer)
            return Vec::new();
        }
        if at.is_some_and(|t| t.elapsed() < PROPOSE_EVERY) {
            return Vec::new();
        }
        self.gives_up = Some((epoch, Some(Instant::now()), why));
        let reason = format!("primary {} gives epoch {epoch} up: {why}", self.me);
        vec![Command::BeginFailover { epoch: epoch + 1, reason }]
    }

    fn count_discarded_proposals(&mut self) -> Vec<Command> {
        if let Some((Command::CountDiscarded { epoch, .. }, _)) = &self.count_discarded {
            let done = self.state.epochs.iter().any(|e| e.epoch == *epoch && e.discarded_by_primary.is_some());
            if done {
                self.count_discarded = None;
            }
        }
        match &mut self.count_discarded {
            Some((cmd, at)) if at.elapsed() >= PROPOSE_EVERY => {
                *at = Instant::now();
                vec![cmd.clone()]
            }
            _ => Vec::new(),
        }
    }

    /// Asks this node's primary server to drain for a switchover to `to` in `epoch`; if it
    /// cannot be asked (it does not serve that epoch), the switchover is given up.
    fn drain_for(&mut self, epoch: u64, id: u64, to: NodeId) {
        *self.drained.lock() = None;
        self.drained_in = None;
        self.switching = Some(Switching { epoch, id, to, proposed: None });
        let serves = self.serving
            && self.child.as_ref().is_some_and(|c| matches!(c.role, Role::Primary { epoch: e, .. } if e == epoch));
        let target = self.addrs(to);
        let asked = match (serves, target) {
            (true, Some(t)) => tell_server(
                &self.gate,
                &format!("drain {} {}{}", t.client_addr(), DRAIN_WITHIN.as_millis(), t.tls_word()),
            ),
            _ => false,
        };
        if asked {
            say(self.me, format!("drains its server for the switchover to node {to}: writes refused from now on"));
        } else {
            *self.drained.lock() = Some(Err(format!("node {} does not serve epoch {epoch} as its primary", self.me)));
        }
    }

    /// The switchover a client asked for (`SENTINEL FAILOVER ditto`), if the cluster
    /// serves: to the lowest-id backup the primary heard within `HEARD_WITHIN_MS` when
    /// asked on the primary's node, to this node when asked on a backup whose link to the
    /// primary is up, else to the lowest-id member other than the primary (whose drain
    /// fails, and is given up, if it is not connected).
    fn asked_switchover(&self) -> Option<Command> {
        let (from, epoch) = (self.state.primary()?, self.state.epoch);
        let mut heard: Vec<NodeId> = self
            .heard
            .iter()
            .filter(|(_, at)| at.elapsed() <= Duration::from_millis(HEARD_WITHIN_MS))
            .map(|&(n, _)| n)
            .collect();
        heard.sort_unstable();
        let to = if from == self.me {
            heard.into_iter().find(|&n| n != self.me)
        } else if heard.contains(&from) {
            Some(self.me)
        } else {
            None
        }
        .or_else(|| self.state.members.keys().copied().find(|&n| n != from))?;
        say(self.me, format!("a client asked for a failover: proposes a switchover from node {from} to node {to}"));
        Some(Command::Switchover { epoch, from, to })
    }

    /// What a switchover this node hands over in wants proposed (see `Switching`).
    fn switchover_proposals(&mut self) -> Vec<Command> {
        let Some(sw) = &mut self.switching else { return Vec::new() };
        let pending = self.state.switchover.as_ref().is_some_and(|s| (s.epoch, s.id) == (sw.epoch, sw.id));
        if self.state.epoch > sw.epoch || !pending {
            // Begun (the epoch moved on), or given up: a server still draining takes writes
            // again (one that was fenced has stopped).
            if self.state.epoch == sw.epoch {
                tell_server(&self.gate, "drain off");
                self.drained_in = None;
            }
            self.switching = None;
            return Vec::new();
        }
        if sw.proposed.is_some_and(|t| t.elapsed() < PROPOSE_EVERY) {
            return Vec::new();
        }
        let drained = self.drained.lock().clone();
        let cmd = match drained {
            None => return Vec::new(),
            Some(Ok(ts)) => {
                self.drained_in = Some(sw.epoch);
                Command::HandOver {
                    epoch: sw.epoch + 1,
                    switchover: sw.id,
                    reason: format!(
                        "switchover from node {} to node {}: writes stopped, node {} holds everything to ts {ts}",
                        self.me, sw.to, sw.to
                    ),
                }
            }
            Some(Err(why)) => {
                tell_server(&self.gate, "drain off");
                self.drained_in = None;
                Command::EndSwitchover { epoch: sw.epoch, switchover: sw.id, why }
            }
        };
        if sw.proposed.is_none() {
            say(self.me, format!("proposes {cmd:?}"));
        }
        sw.proposed = Some(Instant::now());
        vec![cmd]
    }

    /// What the server's newest answer to its prober says it heard (nothing, if that
    /// answer is older than `HEARD_WITHIN_MS` or a failure: one failed probe says nothing
    /// about the server, which may be busy, so what was last seen of its role stands until
    /// the process exits, `reconcile`).
    fn probe(&mut self) {
        self.heard.clear();
        let Some(c) = &mut self.child else {
            self.warm.say(WarmLink::Off);
            self.serving = false;
            return;
        };
        if !c.ready.load(Ordering::Acquire) {
            return;
        }
        let Some((age, asked, Ok(info))) = c.prober.answer() else { return };
        let age = age.as_millis() as u64;
        if age > HEARD_WITHIN_MS {
            return;
        }
        let field = |k: &str| info.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix(':')).map(str::trim);
        match &c.role {
            Role::Primary { epoch, .. } => {
                self.warm.say(WarmLink::Off);
                // Serving from its data: an old log set aside at a rejoin it was promoted
                // after (before a probe saw its link up) holds nothing it needs.
                if old_primary_of(&self.data).exists() && holds_primary_log(&self.data) {
                    drop_old_primary(self.me, &self.data, "serves as primary from its data");
                }
                // (A drained old primary fenced as it stands serves no more.)
                self.serving = !c.fenced.load(Ordering::Acquire)
                    && c.fence_asked.is_none()
                    && self.state.open_epoch().map(|e| e.epoch) == Some(*epoch)
                    && field("ditto_epoch") == Some(epoch.to_string().as_str());
                // A new primary hears its backups sooner, probed every ms until its write
                // gate opens (within `PROBE_FAST_FOR` of its role's start).
                let fast = !self.gate.lock().open && c.role_since.elapsed() < PROBE_FAST_FOR;
                c.prober.fast.store(fast, Ordering::Release);
                self.settled = field("ditto_members_settled").and_then(|c| c.parse().ok());
                for l in info.lines().filter(|l| l.starts_with("slave")) {
                    // slaveN:node=HOST:PORT,addr=...,lease_ms_ago=N: how long ago the server
                    // sent the heartbeat the backup's newest ack echoed (not when that ack
                    // arrived, which a network may delay: the lease stands on it). The
                    // server measured it after the probe was asked, in whole ms rounded
                    // down: the heartbeat went out no earlier than the ask less N + 1 ms,
                    // and the backup counts as heard then (never later than the truth, so
                    // the lease it gives is never longer; docs/cluster.md).
                    let fields = l.split_once(':').map_or("", |(_, f)| f);
                    let kv = |k: &str| slave_field(fields, k);
                    let (Some(node), Some(ago)) = (kv("node"), kv("lease_ms_ago").and_then(|v| v.parse::<u64>().ok()))
                    else {
                        continue;
                    };
                    let at = asked.checked_sub(Duration::from_millis(ago.saturating_add(1)));
                    if let (Some(id), Some(at)) = (node_named(&self.state, &self.members, node), at) {
                        self.heard.push((id, at));
                    }
                }
            }
            Role::Backup { of, learner, .. } => {
                self.serving = false;
                c.prober.fast.store(false, Ordering::Release);
                // A promoted learner's server that still says it is a learner did not take
                // its `count` (it was changing its role, say): told again, until it has.
                if !*learner
                    && field("ditto_learner") == Some("1")
                    && c.count_told.is_none_or(|t| t.elapsed() >= COUNT_AGAIN)
                    && tell_server(&self.gate, "count")
                {
                    c.count_told = Some(Instant::now());
                    say(self.me, "its server still counts as a learner: told to count in the quorum again");
                }
                let up = field("master_link_status") == Some("up");
                self.warm.say(if up { WarmLink::Up } else { WarmLink::Down });
                if up {
                    // Joined: it holds the new primary's checkpoint, so an old primary's
                    // log set aside at its rejoin can go.
                    drop_old_primary(self.me, &self.data, "joined the new primary");
                }
                // A backup server of the epoch whose last server stopped uncleanly (this
                // one started after it died): caught up, the node reports again. Before
                // 2026-12-07 it did not until the next epoch, so a backup server killed
                // once (the OOM killer, a panic) made the node refuse every report of the
                // epoch, and a later failover with a bare majority waited for the dead
                // primary's node (found by a review).
                if self.unclean == Some(c.role.epoch()) && !*learner && up {
                    let num = |k: &str| field(k).and_then(|v| v.parse::<u64>().ok());
                    let (target, cleared) = unclean_catch_up(
                        self.unclean_caught_up,
                        num("ditto_released_ts"),
                        num("ditto_acknowledged_ts"),
                        num("ditto_durable_ts"),
                    );
                    self.unclean_caught_up = target;
                    if let Some(target) = cleared {
                        say(
                            self.me,
                            format!("its backup server, started after the last one stopped uncleanly, holds durably what the primary had released then under any policy (ts {target}): it reports again"),
                        );
                        self.unclean = None;
                        self.unclean_caught_up = None;
                    }
                }
                let ago = field("ditto_heard_ms_ago").and_then(|v| v.parse::<u64>().ok()).unwrap_or(u64::MAX);
                // (Failure detection alone: stamped now, up to `HEARD_WITHIN_MS` late.)
                if up && ago.saturating_add(age) <= HEARD_WITHIN_MS {
                    self.heard.push((*of, Instant::now()));
                }
            }
        }
    }
}

impl Drop for NodePlane {
    fn drop(&mut self) {
        self.stop_child("the node stops");
        self.poll_stop(self.stop_timeout + Duration::from_secs(1));
    }
}

impl DataPlane for NodePlane {
    fn heard(&mut self) -> Vec<(NodeId, Instant)> {
        self.note_acks();
        self.reconcile();
        self.probe();
        self.heard.clone()
    }

    fn serving(&self) -> bool {
        self.serving
    }

    fn settled(&self) -> Option<u64> {
        self.settled.filter(|_| self.serving)
    }

    fn proposals(&mut self) -> Vec<Command> {
        let mut out = self.switchover_proposals();
        out.extend(self.gives_up_proposals());
        if self.switch_asked.swap(false, Ordering::AcqRel) {
            out.extend(self.asked_switchover());
        }
        out.extend(self.count_discarded_proposals());
        out
    }

    fn started(&mut self, state: &ControlState) {
        // Not `restored`'s closing of an unclean stop: its own snapshot is older than the
        // stop, or from it.
        self.state = state.clone();
    }

    fn restored(&mut self, state: &ControlState) {
        say(self.me, format!("took the control state from the leader's snapshot (epoch {})", state.epoch));
        self.state = state.clone();
        // An epoch opened after the unclean stop's, learnt from a snapshot rather than
        // applied: what the stop may have left off the disk was of a cut epoch here too
        // (before, the node went on refusing reports, and a failover needing its report
        // never had a quorum).
        if self.unclean.is_some_and(|e| state.open_epoch().is_some_and(|o| o.epoch > e)) {
            say(self.me, "the epoch of its unclean stop is closed: it reports again".to_string());
            self.unclean = None;
        }
        // A switchover from this node, learnt from the snapshot rather than applied: it
        // drains (or, not serving, gives the switchover up at once) as an applied one's
        // node does. Before, nothing drained and the switchover was given up after 20 s.
        if let Some(w) = state.switchover.as_ref().filter(|w| w.from == self.me && w.epoch == state.epoch) {
            if self.switching.as_ref().is_none_or(|s| (s.epoch, s.id) != (w.epoch, w.id)) {
                say(self.me, format!("a switchover from it to node {} was asked in epoch {}", w.to, w.epoch));
                self.drain_for(w.epoch, w.id, w.to);
            }
        }
    }

    fn caught_up(&mut self) {
        say(self.me, format!("its control state is up to date (epoch {})", self.state.epoch));
        self.caught_up = true;
    }

    fn starting(&self) -> bool {
        !self.serving
            && self.state.open_epoch().is_some_and(|e| self.may_serve == Some(e.epoch))
            && self.child.as_ref().is_some_and(|c| matches!(c.role, Role::Primary { .. }))
    }

    fn fenced(&mut self, epoch: u64) {
        self.fence = self.fence.max(epoch);
        if self.child.as_ref().is_some_and(|c| c.role.epoch() < epoch) && self.fence_in_place(true) == Fencing::Failed {
            self.stop_child(&format!("fenced at epoch {epoch}"));
        }
    }

    /// Once per read of the log for a report that said "not yet": true when that read has
    /// ended (the service then asks `report` again at once). One shot: a report that
    /// fails again for another reason waits for the coordinator's next request, not a
    /// loop of its own.
    fn report_ready(&mut self) -> bool {
        self.report_warm.is_some() && self.report_read_done.swap(false, Ordering::AcqRel)
    }

    fn report(&mut self) -> Result<Holding, String> {
        self.note_acks();
        // A server stopping or fencing itself is waited for a little (it normally takes a
        // few ms): until then, no report, and the coordinator asks again.
        self.poll_stop(SERVER_WAIT);
        self.wait_fence(SERVER_WAIT);
        self.reportable()?;
        // The log is read on a thread of its own (the control thread would stop ticking
        // meanwhile: reading an old primary's 466 MB log held it 111-384 ms, and a leader's
        // stall holds the whole failover); what it read is cached (`replica_holdings`,
        // `primary_log_holdings`), so the read below, here, finds it unless a file changed
        // since. Until it is done, no report: the coordinator asks again.
        // A read begun long ago (an earlier round's) warmed what may have changed since,
        // unless it is still under way: it is waited for, however old (behind a disk that
        // hangs, a new one every round only piled up threads blocked in I/O).
        let warm = match self.report_warm.take() {
            Some(w) if w.0.elapsed() < REPORT_READ_FRESH => w,
            Some(w) if matches!(w.1.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)) => w,
            _ => {
                let (primary_dir, data, workers) = (self.primary_log_dir(), self.data.clone(), self.workers);
                // (A flag of its own per read: an older read ending late says nothing of this one.)
                let done = Arc::new(AtomicBool::new(false));
                self.report_read_done = Arc::clone(&done);
                let rx = reads_its_log_off_thread("ditto-report", move || {
                    let _ = match primary_dir {
                        Some(dir) => ditto_log::recovery::primary_log_holdings(&dir, None).map(|_| ()),
                        None => ditto_log::replica::replica_holdings(&data, workers, None).map(|_| ()),
                    };
                    done.store(true, Ordering::Release);
                })?;
                (Instant::now(), rx)
            }
        };
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = warm.1.recv_timeout(REPORT_READ_WAIT) {
            self.report_warm = Some(warm);
            return Err("its log is being read for the report (asked again shortly)".into());
        }
        // (Its leases here, once: `holding_now` serves fetches too.)
        let h = self.holding_now()?;
        Ok(Holding { acked_ms_ago: self.acked_ms_ago(), took_writes: self.took_writes(), ..h })
    }

    fn prepare(&mut self, plan: &RecoveryPlan) {
        // What the plan fetches arrives through `fetched`; then the check.
        self.fetching = plan.fetch.iter().map(|f| f.stream).collect();
        if !self.fetching.is_empty() && self.child.is_some() {
            // Fetched batches go into the directory: a backup fenced in place stops first
            // (the node then starts its primary from the directory).
            self.stop_child("it fetches into its directory");
        }
        self.prepared = None;
        // A check still reading for an earlier plan with the same point and nothing
        // fetched since answers this one too (a failover asks again until it is planned:
        // each check of an old primary's own log reads all of it); any other answers no one.
        let same = self.prepare_check.as_ref().is_some_and(|(p, _)| *p == plan.recovery_point);
        if !(same && self.fetching.is_empty()) {
            self.prepare_check = None;
            if self.fetching.is_empty() {
                self.start_check(plan);
            }
        }
    }

    fn prepared(&mut self, _plan: &RecoveryPlan) -> Option<Result<u64, String>> {
        if let Some(r) = self.prepared.take() {
            return Some(r);
        }
        let (point, rx) = self.prepare_check.as_ref()?;
        let point = *point;
        let answer = match rx.try_recv() {
            Ok(a) => a,
            Err(std::sync::mpsc::TryRecvError::Empty) => return None,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                Err("the thread that read its log ended without an answer".into())
            }
        };
        self.prepare_check = None;
        Some(answer.map(|c| {
            if let Some(epoch) = c.own_log_epoch {
                self.prepared_own_log = Some((epoch, point, c.above));
            }
            c.above
        }))
    }

    fn fetch_job(&mut self, stream: usize, after: u64) -> Result<ditto_cluster::service::FetchJob, String> {
        self.poll_stop(SERVER_WAIT);
        self.reportable()?;
        // Where this node holds the stream up to, as its report said.
        let position = self.holding_now()?.streams.get(stream).copied().unwrap_or(0);
        // The batches are read on the service's fetch thread. The directory is fenced (its
        // server writes nothing more to it); this node may still write it itself in a
        // later round (a fetch of its own), and the read then fails or is of a round that
        // is over, whose answer the fetcher drops.
        let (me, primary_dir, data) = (self.me, self.primary_log_dir(), self.data.clone());
        let own_start = primary_dir.as_deref().map_or(ditto_engine::Ts(u64::MAX), |dir| self.own_log_start(dir));
        Ok(ditto_cluster::service::FetchJob {
            position,
            read: Box::new(move |sink| {
                // Each batch handed on as it is read: the answer goes in pieces as they fill,
                // never whole in memory. (Without a copy where a batch is the sole owner of
                // its buffer, as a replica log's is: it copies out only what is asked.)
                let (mut n, mut bytes, mut cut) = (0usize, 0usize, false);
                let mut each = |b: bytes::Bytes| {
                    (n, bytes) = (n + 1, bytes + b.len());
                    cut = !sink(Vec::from(b));
                    !cut
                };
                let after = ditto_engine::Ts(after);
                let reach = match primary_dir {
                    Some(dir) => {
                        ditto_log::recovery::primary_stream_batches_each(&dir, stream, after, own_start, &mut each)
                            .map(|()| None)
                    }
                    None => ditto_log::replica::replica_stream_batches_each(&data, stream, after, &mut each).map(Some),
                }
                .map_err(|e| e.to_string())?;
                // An answer that ends below what this node reported would let the fetcher
                // fill the rest as held (its last piece's bound is the position): refused,
                // so the round fails rather than lose what lies between.
                if let Some(reach) = reach.filter(|r| !cut && r.0 < position) {
                    // The next report reads the log afresh (not from where its last look
                    // stopped, which is how the damage got past it): it then says what
                    // this node holds, and the next plan fetches from another, or sets a
                    // lower point, instead of asking this node again each round.
                    ditto_log::replica::forget_holdings();
                    return Err(format!(
                        "its replica log reaches ts {} of stream {stream}, below the ts {position} it reported (damaged since?)",
                        reach.0
                    ));
                }
                let what = if cut { "cut short a fetch (its answer could not be sent)" } else { "serves a fetch" };
                say(
                    me,
                    format!(
                        "{what}: {n} batches ({bytes} bytes) of stream {stream} above ts {}, held to {position}",
                        after.0
                    ),
                );
                Ok(())
            }),
        })
    }

    fn abandoned(&mut self, plan: &RecoveryPlan) {
        if !self.fetching.is_empty() {
            say(self.me, format!("the failover of epoch {} is over: its fetches here end", plan.epoch));
        }
        self.fetching.clear();
        self.prepared = None;
        // (A check of the directory still reading is kept: the next round's plan with the
        // same point and nothing to fetch takes it over, `prepare`; nothing wrote the
        // directory since. Dropped, each round read an old primary's whole log again.)
    }

    fn fetched(&mut self, plan: &RecoveryPlan, stream: usize, batches: Vec<Vec<u8>>, position: u64, last: bool) {
        if !self.fetching.contains(&stream) {
            return; // a resend, or a stream this plan does not fetch
        }
        // Written into the directory only while the plan's failover is under way and no
        // server of this node runs (the service ends a prepare whose failover is over,
        // `abandoned`; this is the last check before the write).
        let current = self.state.epoch == plan.epoch && self.state.phase == Some(Phase::Failover);
        if !current {
            say(
                self.me,
                format!(
                    "a fetched piece of stream {stream} for epoch {} is not taken: its failover is over",
                    plan.epoch
                ),
            );
            self.abandoned(plan);
            return;
        }
        if self.child.is_some() {
            self.fetching.clear();
            self.prepared = Some(Err("a server of this node runs: nothing fetched is written".into()));
            return;
        }
        let storage: Arc<dyn ditto_log::storage::Storage> = Arc::new(ditto_log::storage::RealStorage);
        let mut batches: Vec<bytes::Bytes> = batches.into_iter().map(bytes::Bytes::from).collect();
        // The peer holds the stream up to `position`, by floors or a checkpoint where its
        // batches stop (an idle stream): with the last piece, an empty batch carries that
        // bound here, up to the point.
        let bound = position.min(plan.recovery_point);
        let reached = batches
            .iter()
            .filter_map(|b| ditto_log::format::decode_batch_header(b).ok())
            .map(|h| h.bound_ts.0)
            .max()
            .unwrap_or(0);
        if last && bound > reached {
            let mut out = Vec::new();
            ditto_log::format::BatchBuilder::new().finish_into(
                ditto_log::StreamId(stream as u32),
                ditto_log::Epoch(plan.recovered_epoch),
                ditto_engine::Ts(bound),
                false,
                &mut out,
            );
            batches.push(bytes::Bytes::from(out));
        }
        say(
            self.me,
            format!(
                "fetched {} batches of stream {stream}{}",
                batches.len(),
                if last { "" } else { " (more to come)" }
            ),
        );
        if !batches.is_empty() {
            // The server stopped for the fetch (`prepare`) is gone before anything is
            // written to its directory: waited for here, on the control thread, if it
            // is not (a fenced backup stops in milliseconds; one that does not is killed
            // after the stop timeout).
            if !self.poll_stop(self.stop_timeout + Duration::from_secs(1)) {
                self.fetching.clear();
                self.prepared = Some(Err("its server has not stopped: nothing fetched is written".into()));
                return;
            }
            ditto_log::replica::forget_holdings();
            let added = if holds_primary_log(&self.data) {
                // A last resort that lacks what it shipped but had not made durable: the
                // batches go back into its own log, which its server then starts from.
                ditto_log::recovery::append_own_fetched(&self.data, stream, &batches, &*storage).map(|d| {
                    say(
                        self.me,
                        format!(
                            "its own log takes back {} batches of stream {stream} ({} held already, {} of older epochs dropped)",
                            d.written, d.held, d.older
                        ),
                    )
                })
            } else {
                ditto_log::replica::append_fetched(&self.data, self.workers as u32, &batches, &storage)
            };
            if let Err(e) = added {
                self.fetching.clear();
                self.prepared = Some(Err(format!("adding fetched batches: {e}")));
                return;
            }
        }
        if !last {
            return;
        }
        self.fetching.remove(&stream);
        if self.fetching.is_empty() {
            self.start_check(plan);
        }
    }

    fn applied(&mut self, cmd: &Command, state: &ControlState, live: bool) {
        self.state = state.clone();
        match cmd {
            Command::Bootstrap { primary, .. } | Command::OpenEpoch { primary, .. } => {
                if live && *primary == self.me {
                    self.may_serve = Some(state.epoch);
                }
                if live {
                    say(self.me, format!("epoch {} opened: primary {primary} ({cmd:?})", state.epoch));
                }
                if let Command::OpenEpoch { epoch, recovery_point, lost, phases_ms, writes_after_ms, .. } = cmd {
                    // What an unclean stop may have left off the disk was of a cut epoch.
                    self.unclean = None;
                    let mut h = self.history.lock();
                    if h.last().is_none_or(|f| f.epoch != *epoch) {
                        remember(&mut h, FailoverSeen { epoch: *epoch, ..Default::default() });
                    }
                    let f = h.last_mut().expect("pushed");
                    f.opened_ms = live.then(unix_ms);
                    f.primary = Some(*primary);
                    f.recovery_point = Some(*recovery_point);
                    f.lost = *lost;
                    f.phases_ms = *phases_ms;
                    f.lease_wait_ms = *writes_after_ms;
                }
            }
            Command::AddMember { member } if live => {
                say(self.me, format!("node {} joined the cluster (configuration {})", member.id, state.config))
            }
            Command::RemoveMember { id } if live => {
                say(self.me, format!("node {id} left the cluster (configuration {})", state.config))
            }
            Command::Switchover { epoch, from, to } if live => {
                say(self.me, format!("a switchover from node {from} to node {to} was asked in epoch {epoch}"));
                if *from == self.me {
                    let id = state.switchover.as_ref().map_or(0, |w| w.id);
                    self.drain_for(*epoch, id, *to);
                }
            }
            Command::EndSwitchover { epoch, why, .. } if live => {
                say(self.me, format!("the switchover of epoch {epoch} was given up: {why}"))
            }
            Command::BeginFailover { epoch, reason } | Command::HandOver { epoch, reason, .. } => {
                if live {
                    say(self.me, format!("failover to epoch {epoch} began: {reason}"));
                }
                let began_ms = if live { unix_ms() } else { 0 };
                remember(
                    &mut self.history.lock(),
                    FailoverSeen { epoch: *epoch, reason: reason.clone(), began_ms, ..Default::default() },
                );
            }
            _ => {}
        }
    }
}

/// Where a fetch from `data` can start (`TailReport::serves_above`).
fn fetch_floor(data: &Path) -> Result<u64, String> {
    ditto_log::replica::fetch_floor(data).map(|t| t.0).map_err(|e| format!("reading where its log starts: {e}"))
}

/// The epoch a backup's directory followed (its `REPLICA_STATE`, read as its server reads
/// it: `epoch N` or, since 2026-12-05, `epoch N run R`; a parse of its own here read the
/// second as none, and CI and a review caught it). A record that cannot be read is none
/// here, said in the log; the server refuses to start on it.
fn followed_epoch(data: &Path) -> Option<u64> {
    match ditto_replication::backup::read_followed_epoch(data) {
        Ok(e) => e.map(|e| e.0),
        Err(e) => {
            tracing::warn!("{e}");
            None
        }
    }
}

/// A step of an unclean mark's catch-up (`NodePlane::unclean_caught_up`), from a probe of
/// the later backup server with its link up: (the target kept, `Some(target)` once the mark
/// goes). The target is the highest release of any policy the primary told it of
/// (`ditto_acknowledged_ts`, which heartbeats carry; a connection may have chosen a
/// weaker policy than the default, whose release `ditto_released_ts` alone is: a review
/// found a first version taking that alone), taken once the acknowledged release was
/// heard; the mark goes once the server holds the target durably.
fn unclean_catch_up(
    target: Option<u64>,
    released: Option<u64>,
    acknowledged: Option<u64>,
    durable: Option<u64>,
) -> (Option<u64>, Option<u64>) {
    match (target, acknowledged) {
        (None, Some(a)) if a > 0 => (Some(a.max(released.unwrap_or(0))), None),
        (Some(t), _) if durable.is_some_and(|d| d >= t) => (Some(t), Some(t)),
        (t, _) => (t, None),
    }
}

/// Where an old primary's directory beside `data` waits while the node rejoins.
fn old_primary_of(data: &Path) -> PathBuf {
    data.with_file_name("old-primary")
}

/// Removes the old primary's log set aside beside `data` at a rejoin (`old-primary/`),
/// if it is there: `why` it holds nothing the node needs any more.
fn drop_old_primary(me: NodeId, data: &Path, why: &str) {
    let old = old_primary_of(data);
    if old.exists() {
        match std::fs::remove_dir_all(&old) {
            Ok(()) => say(me, format!("{why}: its old log is dropped")),
            Err(e) => tracing::warn!("node {me}: removing {}: {e}", old.display()),
        }
    }
}

/// Hands each line of `out` (a server's output) to `f`, without its line end, until the
/// output ends or fails. Read as bytes and taken lossily: a line that is not UTF-8 (a key
/// in a message, say) ended the reading before 2026-12-03, and with it the pipe: the node
/// saw none of its server's later lines (`listening`, `fenced`, `joined`), and the
/// server's next write to it failed (found by a review).
fn each_line(out: impl std::io::Read, mut f: impl FnMut(&str)) {
    let mut out = BufReader::new(out);
    let mut raw = Vec::new();
    loop {
        raw.clear();
        match std::io::BufRead::read_until(&mut out, b'\n', &mut raw) {
            Ok(0) | Err(_) => return,
            Ok(_) => f(String::from_utf8_lossy(&raw).trim_end_matches(['\n', '\r'])),
        }
    }
}

/// Whether `data` holds a primary's own log segments.
fn holds_primary_log(data: &Path) -> bool {
    // A log with a cut file in it is sealed (a crash between `seal_own_log`'s steps): a
    // link of the chain, not a live log; the server's open finishes the seal.
    let log = data.join("log");
    !log.join(ditto_log::sealed::CUT_FILE).exists() && std::fs::read_dir(&log).is_ok_and(|mut d| d.next().is_some())
}

/// How a probe refused for its password begins.
const AUTH_REFUSED: &str =
    "its server refused the node's AUTH (the config file's requirepass as the node read it when it started this server)";

/// `INFO replication` from the server at `addr`, over a kept connection (a new one says
/// `AUTH password` first, where the servers have one).
fn info_replication(
    conn: &mut Option<BufReader<TcpStream>>,
    addr: &str,
    password: Option<&str>,
) -> std::io::Result<String> {
    if conn.is_none() {
        let a: SocketAddr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{addr} resolves to nothing")))?;
        let s = TcpStream::connect_timeout(&a, Duration::from_millis(100))?;
        s.set_read_timeout(Some(Duration::from_millis(100)))?;
        s.set_nodelay(true)?;
        let mut r = BufReader::new(s);
        if let Some(p) = password {
            let cmd = format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{p}\r\n", p.len());
            r.get_mut().write_all(cmd.as_bytes())?;
            let mut answer = String::new();
            r.read_line(&mut answer)?;
            if answer.trim_end() != "+OK" {
                return Err(std::io::Error::other(format!("{AUTH_REFUSED}: {}", answer.trim_end())));
            }
        }
        *conn = Some(r);
    }
    let r = conn.as_mut().expect("connected");
    r.get_mut().write_all(b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n")?;
    let mut head = String::new();
    r.read_line(&mut head)?;
    let len: usize = head
        .trim_end()
        .strip_prefix('$')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("unexpected reply {head:?}")))?;
    let mut body = vec![0u8; len + 2];
    r.read_exact(&mut body)?;
    body.truncate(len);
    String::from_utf8(body).map_err(std::io::Error::other)
}

/// The members and where they are reached: the control state's once bootstrapped, else
/// the flags'.
fn members_of(cfg: &NodeConfig, s: &ControlState) -> BTreeMap<NodeId, MemberAddrs> {
    if s.members.is_empty() {
        return cfg.members.clone();
    }
    s.members.keys().filter_map(|&id| Some((id, addrs_of(s, &cfg.members, id)?))).collect()
}

/// `INFO cluster`'s fields on this node's server: the control plane's view, and the
/// failovers it saw (the last five), with how long each took from its start to the new
/// epoch opening.
fn cluster_info(cfg: &NodeConfig, st: &ditto_cluster::Status, history: &[FailoverSeen]) -> Vec<(String, String)> {
    let s = &st.state;
    let mut f = vec![
        ("cluster_node_id".to_string(), cfg.id.to_string()),
        (
            "cluster_members".into(),
            members_of(cfg, s).iter().map(|(id, m)| format!("{id}@{}", m.client_addr())).collect::<Vec<_>>().join(","),
        ),
        ("cluster_raft_leader".into(), st.leader.map_or("none".into(), |l| l.to_string())),
        ("cluster_raft_term".into(), st.term.to_string()),
        ("cluster_epoch".into(), s.epoch.to_string()),
        (
            "cluster_phase".into(),
            match s.phase {
                Some(Phase::Serving) => "serving",
                Some(Phase::Failover) => "failover",
                None => "forming",
            }
            .into(),
        ),
        ("cluster_primary".into(), s.primary().map_or("none".into(), |p| p.to_string())),
        (
            "cluster_primary_addr".into(),
            s.primary().and_then(|p| addrs_of(s, &cfg.members, p)).map_or("none".into(), |m| m.client_addr()),
        ),
        // Where TLS clients write, where the primary's member names its TLS port.
        (
            "cluster_primary_tls_addr".into(),
            s.primary().and_then(|p| addrs_of(s, &cfg.members, p)?.tls_addr()).unwrap_or_else(|| "none".into()),
        ),
        ("cluster_policy".into(), s.policy.clone()),
        ("cluster_fence".into(), st.fence.to_string()),
        ("cluster_config".into(), s.config.to_string()),
        (
            "cluster_config_settled".into(),
            match s.may_change_members() {
                Ok(()) => "yes".to_string(),
                Err(_) => "no".to_string(),
            },
        ),
        ("cluster_voters".into(), st.voters.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")),
        ("cluster_learners".into(), st.learners.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")),
        ("cluster_failovers".into(), s.epochs.len().saturating_sub(1).to_string()),
        // Connections to its control port refused at their hello (the cluster secret).
        ("cluster_control_refused".into(), st.refused.to_string()),
        ("cluster_control_refused_last".into(), st.refused_last.as_deref().unwrap_or("none").replace(',', ";")),
        ("cluster_switchover".into(), s.switchover.as_ref().map_or("none".into(), |w| format!("{}->{}", w.from, w.to))),
        // On the node that leads a failover round with no plan yet: why it waits.
        (
            "cluster_waiting_failover".into(),
            st.failover_waiting
                .as_ref()
                .map_or("none".into(), |(e, why)| format!("epoch {e}: {why}").replace(',', ";")),
        ),
    ];
    for h in history.iter().rev().take(5) {
        f.push((
            format!("cluster_failover_{}", h.epoch),
            format!(
                "reason={},primary={},recovery_point={},lost={},old_primary_discarded={},reports_ms={},prepare_ms={},opened_after_ms={},role_change={},role_change_ms={},lease_wait_ms={},began_unix_ms={}",
                h.reason.replace(',', ";"),
                h.primary.map_or("-".into(), |p| p.to_string()),
                h.recovery_point.map_or("-".into(), |p| p.to_string()),
                h.lost,
                // The epoch this failover ended, and what its primary discarded at its rejoin.
                s.epochs
                    .iter()
                    .position(|e| e.epoch == h.epoch)
                    .and_then(|i| i.checked_sub(1))
                    .and_then(|i| s.epochs[i].discarded_by_primary)
                    .map_or("-".into(), |n| n.to_string()),
                h.phases_ms[0],
                h.phases_ms[1],
                match (h.began_ms, h.opened_ms) {
                    (b, Some(o)) if b > 0 => o.saturating_sub(b).to_string(),
                    _ => "-".into(),
                },
                h.role_change.map_or("-", |c| c.0),
                h.role_change.map_or("-".into(), |c| c.1.to_string()),
                h.lease_wait_ms,
                // (When this node applied the failover's start, on its wall clock: `ditto
                // demo` and `ditto bench failover` weigh it against the kill's time.)
                if h.began_ms > 0 { h.began_ms.to_string() } else { "-".into() },
            ),
        ));
    }
    f
}

/// Runs the node until SIGINT or SIGTERM.
pub fn run(cfg: NodeConfig) -> Result<(), Box<dyn std::error::Error>> {
    let me = cfg.members.get(&cfg.id).ok_or_else(|| format!("--node-id {} is not among --members", cfg.id))?.clone();
    let peers: BTreeMap<NodeId, SocketAddr> = cfg
        .members
        .iter()
        .map(|(&id, m)| {
            let a = format!("{}:{}", m.host, m.control);
            a.to_socket_addrs()
                .ok()
                .and_then(|mut i| i.next())
                .map(|s| (id, s))
                .ok_or_else(|| format!("member {id}'s control address {a} does not resolve"))
        })
        .collect::<Result<_, _>>()?;
    let listener = TcpListener::bind((me.host.as_str(), me.control))
        .map_err(|e| format!("binding the control port {}:{}: {e}", me.host, me.control))?;
    let gate = SharedGate::default();
    let history = History::default();
    let warm = Warmer::start(cfg.dir.join("data"), cfg.id)?;
    let leases = Arc::new(Leases::default());
    let waker: Arc<std::sync::OnceLock<Waker>> = Default::default();
    let plane =
        NodePlane::new(&cfg, Arc::clone(&gate), Arc::clone(&history), warm, Arc::clone(&waker), Arc::clone(&leases));
    let svc = ControlService::start(
        ServiceConfig {
            id: cfg.id,
            peers,
            dir: cfg.dir.join("control"),
            tick: cfg.tick,
            timing: Timing::default(),
            timeouts: cfg.timeouts,
            join: cfg.join,
            compact_every: None,
            secret: cfg.secret.clone(),
            tls: cfg.control_tls.clone(),
            hosts: cfg.members.iter().map(|(&id, m)| (id, m.host.clone())).collect(),
        },
        listener,
        Box::new(plane),
    )?;
    let _ = waker.set(svc.waker());
    say(cfg.id, format!("control plane on {}:{}", me.host, me.control));
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let s = Arc::clone(&stop);
        // A thread per signal would need a handler crate; the runtime's signal support is
        // here already.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            rt.block_on(async {
                let kind = tokio::signal::unix::SignalKind::from_raw(sig);
                if let Ok(mut s) = tokio::signal::unix::signal(kind) {
                    s.recv().await;
                }
            });
            s.store(true, Ordering::SeqCst);
        });
    }
    let mut last_bootstrap = Instant::now() - Duration::from_secs(1);
    let mut member = false;
    let mut said_waiting = false;
    let mut said_lease = false;
    let mut removed = None;
    // (What the status said it had changed, last: `wait_status` returns at once on news,
    // a new primary's quorum contact say, and looks every 5 ms anyway.)
    let (mut seen, mut wait) = (0, GATE_LOOK_EVERY);
    while !stop.load(Ordering::SeqCst) {
        svc.wait_status(seen, wait);
        let st = svc.status();
        seen = st.changes;
        // (A new primary's writes may begin at `writes_not_before`, the old primary's lease
        // run out: looked at then, not up to 5 ms later.)
        let now = Instant::now();
        wait = match st.writes_not_before {
            Some(t) if t > now => (t - now).min(GATE_LOOK_EVERY),
            _ => GATE_LOOK_EVERY,
        };
        if let Some(f) = &st.failed {
            // Refused by the members as removed (it was removed while it was down).
            if f.contains(ditto_cluster::service::REMOVED) {
                return Err(Box::new(Removed(format!("the control plane stopped: {f}"))));
            }
            return Err(format!("the control plane stopped: {f}").into());
        }
        // A node that was a member and was removed stops (its server first); one that is
        // not a member yet waits to be added.
        let now_member = st.state.node(cfg.id).is_some();
        if member && !now_member {
            say(cfg.id, format!("was removed from the cluster (configuration {}): stopping", st.state.config));
            removed = Some(format!(
                "node {} was removed from the cluster (configuration {}), and ids are never used again",
                cfg.id, st.state.config
            ));
            break;
        }
        // Removed before this start (it applied its removal, and was started again): its
        // id is never used again, so it would wait for ever to be added.
        if !member && st.state.retired.contains(&cfg.id) {
            return Err(Box::new(Removed(format!(
                "node {} was removed from the cluster (configuration {}), and ids are never used again: to bring this machine back, add it under a new id with an empty directory (ditto cluster add)",
                cfg.id, st.state.config
            ))));
        }
        member = now_member;
        if st.state.lease_ms > 0 && st.state.lease_ms != cfg.timeouts.failure && !said_lease {
            said_lease = true;
            say(
                cfg.id,
                format!(
                    "the cluster's primaries hold their leases {} ms (its bootstrap's failure timeout), not this node's --failure-timeout-ms {}, which counts for its failure detection alone",
                    st.state.lease_ms, cfg.timeouts.failure
                ),
            );
        }
        if !member && st.state.epoch > 0 && !said_waiting {
            said_waiting = true;
            say(cfg.id, "is not a member of the cluster: it waits to be added (ditto cluster add)");
        }
        // What INFO cluster shows, sent to the server when it changed.
        let info = cluster_info(&cfg, &st, &history.lock());
        // A primary takes writes only while a quorum acknowledges its epoch: cut off from
        // the majority (which then fails it over), it refuses them.
        {
            let mut g = gate.lock();
            // What waits for a server that was slow to read goes first.
            if let Some(p) = &mut g.stdin {
                p.flush();
            }
            if g.stdin.is_some() && g.info != info {
                let line = format!("cluster {}", serde_json::to_string(&info).expect("strings serialise"));
                if g.stdin.as_mut().is_some_and(|p| p.send(&line)) {
                    g.info = info;
                }
            }
            // A primary's commit quorum counts the members as they come and go.
            let config = st.state.config;
            if g.primary && g.config != config && st.state.epoch > 0 {
                // With the others' client addresses: the primary counts their backups only
                // (a node removed, or a learner, completes no quorum).
                let others: Vec<&str> =
                    st.state.members.values().filter(|m| m.id != cfg.id).map(|m| m.addr.as_str()).collect();
                let line = match others.is_empty() {
                    true => format!("backups 0 {config}"),
                    false => format!("backups {} {config} {}", others.len(), others.join(",")),
                };
                if g.stdin.as_mut().is_some_and(|p| p.send(&line)) {
                    g.config = config;
                    say(
                        cfg.id,
                        format!("the primary counts {} backups (configuration {config})", st.state.members.len() - 1),
                    );
                }
            }
            // (Contact as published, and only while the control thread keeps publishing;
            // a new primary's only once the old primary's lease has run out.) The gate is
            // told the lease's end, and closes by itself then, however late this loop is
            // to close it (stopped, or stalled): told again as the lease moves.
            let failure = Duration::from_millis(cfg.timeouts.failure);
            // (A status read before this server's role began says nothing of it.)
            let fresh = st.published.is_some_and(|p| g.since.is_some_and(|s| p > s));
            let until = st.writes_until(failure).filter(|_| fresh).map(ditto_server::session::monotonic_ms_of);
            let line = match until {
                // (Within 5 ms of what it was told, later: not told again, it holds less.)
                Some(ms) if g.primary && (!g.open || ms < g.until_ms || ms >= g.until_ms + 5) => {
                    Some(format!("writes until {ms}"))
                }
                None if g.primary && g.open => Some(match st.contact_now(failure) {
                    true => "writes off this node is the cluster's new primary and waits for the old primary's lease to run out".to_string(),
                    false => format!(
                        "writes off this node is the primary of epoch {} but has not heard a quorum of its cluster for {} ms: it takes no writes (the others may have failed it over)",
                        st.state.epoch, cfg.timeouts.failure
                    ),
                }),
                _ => None,
            };
            if let Some(line) = line {
                if g.stdin.as_mut().is_some_and(|p| p.send(&line)) {
                    let was = g.open;
                    (g.open, g.until_ms) = (until.is_some(), until.unwrap_or(0));
                    if g.open {
                        let open = st.state.open_epoch().map_or(0, |e| e.epoch);
                        leases.took_writes_in.fetch_max(open, Ordering::AcqRel);
                    }
                    if was != g.open {
                        say(cfg.id, format!("writes {}", if g.open { "taken" } else { "refused: no quorum contact" }));
                    }
                }
            }
        }
        // The first leader names itself the first primary.
        if st.state.epoch == 0 && st.leader == Some(cfg.id) && last_bootstrap.elapsed() > Duration::from_millis(200) {
            last_bootstrap = Instant::now();
            let members = cfg.members.iter().map(|(&id, m)| m.member(id)).collect::<Vec<_>>();
            let _ = svc.propose(Command::Bootstrap {
                members,
                primary: cfg.id,
                policy: cfg.policy.clone(),
                // Every primary's lease, the same on every node (`ControlState::lease_ms`).
                lease_ms: cfg.timeouts.failure,
                // The cluster's database id, which every node's directory takes
                // (`ControlState::database`).
                database: ditto_log::identity::DatabaseId::new_random().to_wire(),
            });
        }
    }
    say(cfg.id, "stopping");
    svc.stop();
    match removed {
        Some(why) => Err(Box::new(Removed(why))),
        None => Ok(()),
    }
}

/// Runs `read` (a read of this node's log) on a thread of its own named `name`, off the
/// control thread; its answer comes on the receiver.
fn reads_its_log_off_thread<T: Send + 'static>(
    name: &str,
    read: impl FnOnce() -> T + Send + 'static,
) -> Result<std::sync::mpsc::Receiver<T>, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || drop(tx.send(read())))
        .map_err(|e| format!("starting the thread that reads its log: {e}"))?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::{
        fenced_line, parse_members, probe_wait, role_change_of, unclean_catch_up, Pipe, PIPE_PENDING_MAX,
        PROBE_BACKOFF_MAX, PROBE_EVERY,
    };
    use std::time::Duration;

    /// A fenced server's line gives its last ack's age, that it never acked, or nothing
    /// (a drained primary's bare line); any other line is not a fence's.
    #[test]
    fn a_fenced_line_says_when_the_server_last_acked() {
        assert_eq!(
            fenced_line("ditto server fenced, its last ack 1500 us ago"),
            Some(Some(Duration::from_micros(1500)))
        );
        assert_eq!(fenced_line("ditto server fenced, it never acked"), Some(None));
        assert_eq!(fenced_line("ditto server fenced"), Some(None));
        assert_eq!(fenced_line("ditto server fenced, its last ack x us ago"), Some(Some(Duration::ZERO)));
        assert_eq!(fenced_line("ditto server fence failed: no"), None);
        assert_eq!(fenced_line("ditto server fenced twice"), None);
    }

    /// A supervisor's data plane over `dir` with no server, for the steps a test drives.
    fn plane_in(dir: &std::path::Path) -> super::NodePlane {
        let cfg = super::NodeConfig {
            id: 2,
            members: Default::default(),
            dir: dir.to_path_buf(),
            child_args: Vec::new(),
            workers: 1,
            policy: "majority".into(),
            timeouts: super::Timeouts { failure: 150, resend: 20, prepare: 300, start: 150 },
            tick: std::time::Duration::from_millis(10),
            join: false,
            promote_in_place: false,
            stop_timeout: std::time::Duration::from_secs(1),
            secret: None,
            control_tls: None,
            password: None,
            config_file: None,
        };
        super::NodePlane::new(
            &cfg,
            Default::default(),
            Default::default(),
            Default::default(),
            Default::default(),
            Default::default(),
        )
    }

    fn opened(epochs: &[u64]) -> super::ControlState {
        let mut st = super::ControlState {
            phase: Some(super::Phase::Serving),
            epoch: *epochs.last().unwrap(),
            ..Default::default()
        };
        st.epochs = epochs
            .iter()
            .map(|&epoch| ditto_cluster::state::EpochRecord {
                epoch,
                primary: 1,
                start: 0,
                recovered: None,
                discarded_by_primary: None,
            })
            .collect();
        st
    }

    /// A server's output line that is not UTF-8 is read lossily, and the lines after it
    /// are read (before, the reading ended there, and the node saw no more of its server).
    #[test]
    fn a_servers_line_that_is_not_utf8_does_not_end_the_reading() {
        use super::each_line;
        let out: &[u8] =
            b"ditto server starting\nkey \xff\xfe in a message\r\nditto server listening on 127.0.0.1:1\nlast";
        let mut lines = Vec::new();
        each_line(out, |l| lines.push(l.to_string()));
        assert_eq!(
            lines,
            [
                "ditto server starting",
                "key \u{fffd}\u{fffd} in a message",
                "ditto server listening on 127.0.0.1:1",
                "last"
            ]
        );
    }

    /// An old primary rejoining by a copy reports from the log it set aside until the copy
    /// is loaded (its backup then follows the new epoch, and may acknowledge the new
    /// primary's commits), and from its data directory from then on, though the old log is
    /// still there (it goes once a probe sees the backup's link up); promoted, from its own
    /// primary log.
    /// A node writes the cluster's database id into its directory before its server
    /// starts, where the directory names none; one naming another is left as it is.
    #[test]
    fn a_node_takes_the_clusters_database_id_where_its_directory_names_none() {
        use ditto_log::identity::{read, write, DatabaseId};
        let dir = tempfile::tempdir().unwrap();
        let mut plane = plane_in(dir.path());
        std::fs::create_dir_all(&plane.data).unwrap();
        plane.take_cluster_database().unwrap();
        assert_eq!(read(&plane.data).unwrap(), None, "a cluster of an older version said none");
        let id = DatabaseId::new_random();
        plane.state.database = id.to_wire();
        plane.take_cluster_database().unwrap();
        assert_eq!(read(&plane.data).unwrap(), Some(id));
        let other = DatabaseId::new_random();
        write(&plane.data, other, &ditto_log::storage::RealStorage).unwrap();
        plane.take_cluster_database().unwrap();
        assert_eq!(read(&plane.data).unwrap(), Some(other), "another's id was replaced");
    }

    #[test]
    fn a_rejoining_old_primary_reports_from_its_copy_once_it_is_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let plane = plane_in(dir.path());
        let old = plane.old_primary_dir();
        std::fs::create_dir_all(old.join("log")).unwrap();
        std::fs::create_dir_all(&plane.data).unwrap();
        assert_eq!(plane.primary_log_dir(), Some(old.clone()), "the copy has not begun");
        std::fs::write(plane.data.join("REPLICA_STATE"), "epoch 0\n").unwrap();
        assert_eq!(plane.primary_log_dir(), Some(old.clone()), "the copy is not loaded");
        std::fs::write(plane.data.join("REPLICA_STATE"), "epoch 5\n").unwrap();
        assert_eq!(plane.primary_log_dir(), None, "loaded: its backup follows epoch 5");
        // As a backup of this build records it, with the primary's run.
        std::fs::write(plane.data.join("REPLICA_STATE"), "epoch 5 run 00000000000000ff\n").unwrap();
        assert_eq!(super::followed_epoch(&plane.data), Some(5));
        assert_eq!(plane.primary_log_dir(), None, "loaded: its backup follows epoch 5 (with a run)");
        assert!(old.exists());
        // Promoted before a probe dropped the old log: the followed epoch's record goes, and
        // its data holds a primary log of its own, which it reports from (before, from the
        // old log: found by a review).
        std::fs::remove_file(plane.data.join("REPLICA_STATE")).unwrap();
        std::fs::create_dir_all(plane.data.join("log")).unwrap();
        std::fs::write(plane.data.join("log").join("stream-0000-e0000000006-s0000000000.seg"), b"").unwrap();
        assert_eq!(plane.primary_log_dir(), Some(plane.data.clone()), "promoted: its own log");
    }

    /// An unclean mark's catch-up: no target before the primary's acknowledged release is
    /// heard; the target is the highest of the two releases; the mark stays while the
    /// server holds less durably and goes at the target.
    #[test]
    fn an_unclean_mark_goes_only_once_the_later_server_holds_every_release_durably() {
        assert_eq!(unclean_catch_up(None, Some(60), None, Some(60)), (None, None), "acknowledged not heard yet");
        assert_eq!(unclean_catch_up(None, Some(60), Some(0), Some(60)), (None, None));
        let (target, cleared) = unclean_catch_up(None, Some(60), Some(100), Some(60));
        assert_eq!((target, cleared), (Some(100), None), "a weaker policy's release above the default's");
        assert_eq!(unclean_catch_up(target, Some(120), Some(130), Some(99)), (Some(100), None), "held below it");
        assert_eq!(unclean_catch_up(target, Some(120), Some(130), None), (Some(100), None));
        assert_eq!(unclean_catch_up(target, Some(120), Some(130), Some(100)), (Some(100), Some(100)));
        assert_eq!(unclean_catch_up(None, Some(80), Some(70), Some(0)), (Some(80), None), "the default's, if higher");
    }

    /// A node whose last server stopped uncleanly reports again once a later epoch has
    /// opened, whether it applied the opening or learnt it from the leader's snapshot
    /// (before, only an applied `OpenEpoch` did: a node that fell behind and took a
    /// snapshot refused every report, and a failover needing its report never had a
    /// quorum).
    #[test]
    fn an_unclean_stop_is_forgotten_once_a_later_epoch_opened_even_from_a_snapshot() {
        use ditto_cluster::DataPlane;
        let dir = tempfile::tempdir().unwrap();
        let mut plane = plane_in(dir.path());
        plane.unclean = Some(3);
        plane.restored(&opened(&[1, 2, 3]));
        assert!(plane.reportable().is_err(), "reported with epoch 3 still open");
        plane.restored(&opened(&[1, 2, 3, 4]));
        assert!(plane.reportable().is_ok(), "epoch 4 opened: {:?}", plane.reportable());
    }

    /// A switchover from this node learnt from the leader's snapshot (this node fell
    /// behind while it was asked) is acted on as an applied one is: not serving, the node
    /// gives it up at once instead of leaving it to time out; asked again by a later
    /// snapshot with the same record, it does not start over.
    #[test]
    fn a_switchover_learnt_from_a_snapshot_is_acted_on() {
        use ditto_cluster::{Command, DataPlane};
        let dir = tempfile::tempdir().unwrap();
        let mut plane = plane_in(dir.path());
        let mut st = opened(&[1, 2, 3]);
        st.switchover = Some(ditto_cluster::state::SwitchoverRecord { epoch: 3, from: 2, to: 1, id: 7 });
        plane.restored(&st);
        let (epoch, id) = plane.switching.as_ref().map(|s| (s.epoch, s.id)).expect("switching");
        assert_eq!((epoch, id), (3, 7));
        let p = plane.proposals();
        assert!(
            p.iter().any(
                |c| matches!(c, Command::EndSwitchover { epoch: 3, switchover: 7, why } if why.contains("does not serve epoch 3"))
            ),
            "{p:?}"
        );
        // The same record again (a later snapshot): no new drain (a new one would start
        // its proposals over).
        plane.restored(&st);
        assert!(plane.switching.as_ref().is_some_and(|s| s.proposed.is_some()), "drained again");
        // A switchover from another node is not this one's to drain.
        let mut other = plane_in(dir.path());
        st.switchover = Some(ditto_cluster::state::SwitchoverRecord { epoch: 3, from: 1, to: 2, id: 8 });
        other.restored(&st);
        assert!(other.switching.is_none());
    }

    /// Members whose ports cannot work are refused with a clear error: port 0, two ports
    /// of a member the same, a port of another member on the same host.
    #[test]
    fn members_with_ports_that_cannot_work_are_refused() {
        assert!(parse_members("1=h:7001/7002/7003,2=h:7011/7012/7013").is_ok());
        assert!(parse_members("1=h:7001/7002/7003,2=other:7001/7002/7003").is_ok(), "another host");
        for (bad, says) in [
            ("1=h:0/7002/7003", "port 0"),
            ("1=h:7001/0/7003", "port 0"),
            ("1=h:7001/7002/0", "port 0"),
            ("1=h:7001/7001/7003", "must differ"),
            ("1=h:7001/7002/7003/7002", "must differ"),
            ("1=h:7001/7002/7003,2=h:7011/7002/7013", "member 1 on the same host"),
            ("1=h:7001/7002/7003/7004,2=h:7004/7012/7013", "member 1 on the same host"),
        ] {
            let e = parse_members(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// A node remembers its last `HISTORY_KEEP` failovers, not every one of its life.
    #[test]
    fn the_failover_history_is_bounded() {
        use ditto_cluster::{Command, DataPlane};
        let dir = tempfile::tempdir().unwrap();
        let mut plane = plane_in(dir.path());
        for epoch in 2..1000u64 {
            let st = opened(&[1]);
            plane.applied(&Command::BeginFailover { epoch, reason: "a test".into() }, &st, false);
        }
        let h = plane.history.lock();
        assert_eq!(h.len(), super::HISTORY_KEEP);
        assert_eq!(h.last().unwrap().epoch, 999, "the newest kept");
    }

    /// A fetched piece for a plan whose failover is over (the state shows a later epoch)
    /// is not written into the directory, and the plan's fetches end.
    #[test]
    fn a_fetched_piece_for_a_failover_that_is_over_is_not_written() {
        use ditto_cluster::DataPlane;
        let dir = tempfile::tempdir().unwrap();
        let mut plane = plane_in(dir.path());
        let plan = super::RecoveryPlan {
            epoch: 3,
            recovered_epoch: 2,
            recovery_point: 100,
            primary: 2,
            fetch: vec![ditto_cluster::failover::Fetch { stream: 0, from: 1, after: 50, upto: 100 }],
            start: 200,
            reporters_ahead: 0,
        };
        plane.state = opened(&[1, 2]);
        plane.state.phase = Some(super::Phase::Failover);
        plane.state.epoch = 3;
        plane.prepare(&plan);
        assert!(plane.fetching.contains(&0));
        // Epoch 4 has begun: the piece comes late.
        plane.state.epoch = 4;
        plane.fetched(&plan, 0, vec![vec![1, 2, 3]], 100, true);
        assert!(plane.fetching.is_empty(), "the plan's fetches go on");
        assert!(!ditto_log::replica::replica_dir(&plane.data).exists(), "written into the directory");
        // A check of the directory still reading outlives its round: the next plan with
        // the same point takes it over (each round read an old primary's whole log again).
        let (_tx, rx) = std::sync::mpsc::channel();
        plane.prepare_check = Some((100, rx));
        plane.abandoned(&plan);
        assert!(plane.prepare_check.is_some(), "the check under way was dropped");
    }

    /// A backup names itself by the control state's address for it; a primary whose own
    /// flags spell that address otherwise (here `localhost` for the state's `127.0.0.1`)
    /// still knows which node it is (before, it heard no backup so named, kept its writes
    /// refused for want of a quorum, and was never failed over). Its flags' spelling is
    /// known too, and a name of no member is no one's.
    #[test]
    fn a_backup_is_known_by_the_state_address_or_the_flags_spelling() {
        let mut st = super::ControlState::default();
        let m = |id: u64, port: u16| super::Member {
            id,
            addr: format!("127.0.0.1:{port}"),
            repl: port + 100,
            control: port + 200,
            tls: 0,
        };
        st.apply(&super::Command::Bootstrap {
            members: vec![m(1, 7001), m(2, 7002), m(3, 7003)],
            primary: 2,
            policy: "majority-durable".into(),
            lease_ms: 0,
            database: 0,
        })
        .unwrap();
        let flags =
            parse_members("1=localhost:7001/7101/7201,2=127.0.0.1:7002/7102/7202,3=localhost:7003/7103/7203").unwrap();
        assert_eq!(super::node_named(&st, &flags, "127.0.0.1:7001"), Some(1), "the state's address");
        assert_eq!(super::node_named(&st, &flags, "127.0.0.1:7003"), Some(3));
        assert_eq!(super::node_named(&st, &flags, "localhost:7003"), Some(3), "the flags' spelling");
        assert_eq!(super::node_named(&st, &flags, "127.0.0.1:7009"), None);
    }

    /// A member names three ports, or four with its TLS port; the TLS port reaches the
    /// control state's member and the address TLS clients are told; anything else is
    /// refused, naming the form.
    #[test]
    fn members_name_their_tls_port_optionally() {
        let m = parse_members("1=10.0.0.1:7001/7101/7201,2=h2:7002/7102/7202/7302").unwrap();
        assert_eq!(m[&1].tls_addr(), None);
        assert_eq!(m[&2].tls_addr().as_deref(), Some("h2:7302"));
        assert_eq!(m[&2].client_addr(), "h2:7002", "a member is named by its plaintext address");
        let member = m[&2].member(2);
        assert_eq!((member.addr.as_str(), member.repl, member.control, member.tls), ("h2:7002", 7102, 7202, 7302));
        assert_eq!(m[&1].member(1).tls, 0);
        for bad in ["1=h:1/2", "1=h:1/2/3/4/5", "1=h:1/2/3/0", "1=h:1/2/3/x", "1=h:1/2/3/"] {
            let e = parse_members(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("[/TLS_PORT]"), "{bad}: {e}");
        }
        assert!(parse_members("0=h:1/2/3/4").unwrap_err().contains("above 0"));
        // A member the flags name without a TLS port takes the control state's.
        let mut st = super::ControlState::default();
        let boot = |tls| super::Command::Bootstrap {
            members: vec![super::Member { id: 1, addr: "h:1".into(), repl: 2, control: 3, tls }],
            primary: 1,
            policy: "majority-durable".into(),
            lease_ms: 0,
            database: 0,
        };
        st.apply(&boot(9)).unwrap();
        let flags = parse_members("1=h:1/2/3").unwrap();
        assert_eq!(super::addrs_of(&st, &flags, 1).unwrap().tls_addr().as_deref(), Some("h:9"));
        let named = parse_members("1=h:1/2/3/8").unwrap();
        assert_eq!(super::addrs_of(&st, &named, 1).unwrap().tls_addr().as_deref(), Some("h:8"), "the flags first");
        let mut plain = super::ControlState::default();
        plain.apply(&boot(0)).unwrap();
        assert_eq!(super::addrs_of(&plain, &flags, 1).unwrap().tls_addr(), None);
    }

    /// A server that does not read its standard input (here a process stopped with
    /// SIGSTOP) never blocks the writer: lines wait, in order, until it reads again; one
    /// that leaves too much unread is taken as gone; a closed pipe says so.
    #[test]
    fn a_server_that_does_not_read_its_input_never_blocks_the_writer() {
        let mut child = std::process::Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("cat");
        // (Killed if the test fails midway: a stopped child would hold the test's output.)
        struct Reap(u32);
        impl Drop for Reap {
            fn drop(&mut self) {
                // SAFETY: kill(2) on the child this test started (before it is reaped).
                unsafe {
                    libc::kill(self.0 as i32, libc::SIGKILL);
                }
            }
        }
        let reap = Reap(child.id());
        let out = child.stdout.take().unwrap();
        let mut p = Pipe::new(child.stdin.take().unwrap()).unwrap();
        // SAFETY: kill(2) on the child this test started; no memory passed.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
        // Far more than the pipe holds (64 KiB), each send returning at once.
        let line = "x".repeat(1000);
        let t = std::time::Instant::now();
        for i in 0..400 {
            assert!(p.send(&format!("{i:04} {line}")), "line {i} queued");
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "sends did not block: {:?}", t.elapsed());
        assert!(!p.pending.is_empty(), "the pipe is full: the rest waits");
        // Read again: what waited goes, in order.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGCONT) }, 0);
        let reader = std::thread::spawn(move || {
            let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out));
            (0..400).map(|_| lines.next().unwrap().unwrap()[..4].to_string()).collect::<Vec<_>>()
        });
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !p.pending.is_empty() && std::time::Instant::now() < end {
            assert!(p.flush());
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(p.pending.is_empty(), "everything delivered once it reads again");
        let got = reader.join().unwrap();
        assert_eq!(got, (0..400).map(|i| format!("{i:04}")).collect::<Vec<_>>());
        // Stopped again: lines are queued up to `PIPE_PENDING_MAX` left unread, and no
        // further (false: not queued).
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) }, 0);
        let big = "y".repeat(64 << 10);
        let mut n = 0;
        while p.send(&big) {
            n += 1;
            assert!(n < 100, "bounded");
        }
        let mut small = 0;
        while p.send("z") {
            small += 1;
            assert!(small < 100_000, "bounded");
        }
        let held = p.pending.len();
        assert!(held <= PIPE_PENDING_MAX && held + 2 > PIPE_PENDING_MAX, "queued up to the bound: {held}");
        assert!(!p.send("z") && p.pending.len() == held, "nothing more queued once full");
        // A closed pipe: the process is gone.
        drop(reap);
        child.wait().unwrap();
        p.pending.clear();
        assert!(!p.send("after"), "a closed pipe");
    }

    /// The warming thread hears of changes only; a link that was up going down makes it
    /// read at once (a primary's death: the report then finds the log read); while the
    /// link is up it reads every period; it ends with its `Warmer`.
    #[test]
    fn the_warming_thread_reads_at_once_when_a_link_that_was_up_goes_down() {
        use super::{warm_loop, WarmLink::*, Warmer};
        use std::sync::mpsc::channel;
        let (tx, rx) = channel();
        let mut w = Warmer { said: Off, tx: Some(tx) };
        for link in [Down, Up, Up, Down, Down, Off, Down, Up, Off] {
            w.say(link);
        }
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![Up, Down, Off, Up, Off]);

        let wait = Duration::from_secs(10);
        // A period of an hour: a read comes only from `Down`.
        let (tx, rx) = channel();
        let (reads, read) = channel();
        let (ended, end) = channel();
        std::thread::spawn(move || {
            warm_loop(&rx, Duration::from_secs(3600), || reads.send(()).unwrap());
            ended.send(()).unwrap();
        });
        tx.send(Up).unwrap();
        tx.send(Down).unwrap();
        read.recv_timeout(wait).expect("a link gone down is read at once");
        drop(tx);
        end.recv_timeout(wait).expect("the thread ends with its Warmer");
        assert!(read.try_recv().is_err(), "one read for one Down");

        // A period of 5 ms: reads while the link is up.
        let (tx, rx) = channel();
        let (reads, read) = channel();
        std::thread::spawn(move || {
            warm_loop(&rx, Duration::from_millis(5), || {
                let _ = reads.send(());
            })
        });
        tx.send(Up).unwrap();
        for _ in 0..3 {
            read.recv_timeout(wait).expect("an up link is read every period");
        }
        drop(tx);
    }

    /// What wakes the control thread: the backups the server's answer says it heard from
    /// lately (an ack echoing a heartbeat at most `HEARD_WITHIN_MS` old), in order.
    #[test]
    fn the_backups_a_probe_hears_are_those_heard_lately() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:4\r\n\
                    slave0:node=127.0.0.1:7001,addr=127.0.0.1:40001,heard_ms_ago=1,lease_ms_ago=3\r\n\
                    slave1:node=127.0.0.1:7002,addr=127.0.0.1:40002,heard_ms_ago=0,lease_ms_ago=51\r\n\
                    slave2:node=127.0.0.1:7003,addr=127.0.0.1:40003,lease_ms_ago=50,learner=1\r\n\
                    slave3:node=127.0.0.1:7004,addr=127.0.0.1:40004\r\n";
        assert_eq!(super::backups_heard(info), vec!["127.0.0.1:7001", "127.0.0.1:7003"]);
        assert!(super::backups_heard("role:slave\r\nmaster_link_status:up\r\n").is_empty());
    }

    /// A new primary is probed every ms while `fast`, and only while it answers.
    #[test]
    fn a_new_primary_is_probed_fast_only_while_it_answers() {
        use super::{next_probe_in, PROBE_FAST};
        assert_eq!(next_probe_in(0, true), PROBE_FAST);
        assert_eq!(next_probe_in(0, false), PROBE_EVERY);
        assert_eq!(next_probe_in(3, true), probe_wait(3), "a server that fails backs off");
        assert_eq!(next_probe_in(8, true), PROBE_BACKOFF_MAX);
    }

    #[test]
    fn probes_of_a_server_that_does_not_answer_back_off_to_a_second() {
        assert_eq!(probe_wait(0), PROBE_EVERY);
        assert_eq!(probe_wait(1), PROBE_EVERY * 2);
        assert_eq!(probe_wait(3), PROBE_EVERY * 8);
        assert_eq!(probe_wait(8), PROBE_BACKOFF_MAX);
        assert_eq!(probe_wait(u32::MAX), PROBE_BACKOFF_MAX);
    }

    #[test]
    fn a_server_line_about_its_new_role_is_read_and_others_are_not() {
        let l = "promotion (in place): replayed to the point 46876 in 0.000 s, a checkpoint of 466.6 MB written in 0.64 s; 0.87 s in all";
        assert_eq!(role_change_of(l), Some(("promoted-in-place", 870)));
        let l = "promotion: checkpoint at ts 41446 loaded in 0.28 s, 5430 transactions; 2.29 s in all";
        assert_eq!(role_change_of(l), Some(("promoted-by-restart", 2290)));
        let l = "follow (in place): replayed to the point 1 in 0.000 s, its replica log sealed at the point in 0.7 ms; 0.001 s in all";
        assert_eq!(role_change_of(l), Some(("followed-in-place", 1)));
        assert_eq!(role_change_of("ditto server listening on 127.0.0.1:7001"), None);
        assert_eq!(role_change_of("promotion (in place): no total"), None);
    }
}
