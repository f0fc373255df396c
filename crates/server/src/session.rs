//! One client connection's state and command handling, with no I/O
//! ===============================================================
//! [`Session::handle`] takes one parsed request and returns an [`Outcome`]: the reply, the
//! commit timestamp that must be durable before the reply may leave (a write's commit, or
//! the newest commit a read saw), and whether to close the connection. The connection task
//! (`server.rs`) does the waiting and the writing, so everything here can be tested
//! step by step with an engine worker and no sockets.
//!
//! ```text
//!            +---------- AUTH/HELLO AUTH ok ----------+
//!  [no auth] |                                        v
//!  (only AUTH, HELLO, QUIT)                      [normal] --MULTI--> [queueing]
//!                                                   ^                 |  commands -> QUEUED
//!                                                   +--EXEC/DISCARD---+  (a bad one flags
//!                                                                         EXECABORT)
//! ```
//!
//! A data command outside MULTI is one engine transaction; MULTI/EXEC is one transaction
//! for every queued data command. WATCH remembers each watched key's newest version (commit
//! timestamp, and whether it holds a value); EXEC asks inside its transaction whether any
//! changed since (`Transaction::changed_since`, which also sees a key created and deleted
//! again after its record left the index) and answers nil without writing if one did. The
//! read is validated at commit, so a change racing with EXEC aborts and retries it, and the
//! retry sees the change.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use ditto_engine::{CommitTicket, Database, Error, KeyVersion, Transaction, Ts, Worker, RETRIES_MAX};
use parking_lot::Mutex;
use subtle::ConstantTimeEq;

use crate::commands::{self, lookup, parse_int, run_data, unknown_command, wrong_arity, Kind, Spec, SPECS};
pub use crate::config::ClientAddr;
use crate::keyspace::{prefix_end, type_name_of, KeyCounts, Keyspace};
use crate::memory::{self, MemoryLimit, OOM};
use crate::resp::{Proto, Reply};

/// Databases a client can SELECT.
pub const DATABASES: usize = crate::keyspace::DBS;

/// The most a MULTI may queue: as much as one transaction may write (the engine's
/// `TXN_BYTES_MAX`), so a queue of writes any larger could not commit anyway. Without a
/// bound a client could queue without end (each request is bounded, their number was not).
pub const MULTI_QUEUE_BYTES_MAX: usize = ditto_engine::TXN_BYTES_MAX;
/// What a queued argument costs besides its bytes (its `Bytes` handle in its request's
/// list; a request's arguments share one allocation).
const QUEUED_ARG_OVERHEAD: usize = 32;
/// What a queued request costs besides its arguments: its slot in the queue, its list's
/// and its arguments' allocations and their headers. (Before 2026-12-03 each argument was
/// an allocation of its own and a request was counted as its arguments alone: a queue of
/// one-word requests took about three times the bound; found by a review.)
const QUEUED_REQUEST_OVERHEAD: usize = 96;
/// What a watched key costs besides its bytes: its map entry (its key's handle, database
/// and version), the map's spare room, and the key's allocation.
const WATCHED_KEY_OVERHEAD: usize = 128;

/// What the server shares with every session.
/// This node's part in replication.
#[derive(Clone, Default)]
pub enum Replication {
    #[default]
    Standalone,
    Primary {
        primary: Arc<ditto_replication::Primary>,
        policy: ditto_replication::CommitPolicy,
        repl_addr: String,
    },
    Backup {
        state: Arc<ditto_replication::BackupState>,
        primary: String,
    },
}

/// The connection commands that read the keyspace (`read_keys`).
fn walks_keys(spec: &Spec) -> bool {
    matches!(spec.name, "DBSIZE" | "SCAN" | "KEYS")
}

/// Whether this node is a backup whose reads are held (`BackupState::reads_held`).
fn reads_held(sh: &Shared) -> bool {
    matches!(&sh.replication, Replication::Backup { state, .. } if state.reads_held().is_some())
}

/// Whether a command reads the data (what a backup whose reads are held refuses: data
/// commands that do not write, and the connection commands that walk the keyspace).
fn reads_data(spec: &Spec) -> bool {
    match spec.kind {
        Kind::Data => !spec.write,
        Kind::Conn => walks_keys(spec),
    }
}

/// Starts a transaction for a command: on a read-only node (a backup) a snapshot
/// transaction at the read view, which replay never disturbs; else a read-write one.
pub(crate) fn begin<'w>(sh: &Shared, worker: &'w mut Worker) -> Transaction<'w> {
    if sh.read_only {
        worker.begin_snapshot()
    } else {
        worker.begin()
    }
}

pub struct Shared {
    pub db: Arc<Database>,
    pub ks: Keyspace,
    /// Keys per database, moved by every commit (`commit_counted`).
    pub key_counts: Arc<KeyCounts>,
    /// The snapshot `key_counts` were counted at.
    pub key_counts_at: ditto_engine::Ts,
    /// Where durability is read from; `None` for an in-memory database (tests).
    pub log: Option<Arc<ditto_log::Logger>>,
    pub password: Option<String>,
    /// Shared with the role before, for a server that changes its role in place.
    pub stats: Arc<Stats>,
    pub cursors: Mutex<Cursors>,
    pub started: Instant,
    pub tcp_port: u16,
    /// A read-only node (a hot standby): writes are refused with READONLY. Always
    /// false on a primary, which is all there is for now.
    pub read_only: bool,
    /// What this node is in replication (INFO replication, READONLY's address).
    pub replication: Replication,
    /// Where clients write, when this node knows: its own addresses on a primary; on a
    /// cluster's backup, the primary's (its supervisor tells it). Named in READONLY
    /// refusals and answered to SENTINEL (unchanged Redis clients find the primary with
    /// it): to a TLS client, the TLS address where it is known.
    pub primary_addr: Option<ClientAddr>,
    /// Writes refused for now, and why (a cluster's primary without contact with a quorum
    /// of its cluster, docs/cluster.md).
    pub write_gate: Arc<WriteGate>,
    /// What CONFIG GET shows: (name, value) in Redis's names where there is one. The
    /// server fills it from its configuration; the password is never shown.
    pub config_view: Vec<(String, String)>,
    /// The configuration's `max_output_bytes`: the replies a connection buffers before it
    /// stops reading requests, and the largest single reply (one that would be larger is an
    /// error; KEYS, MGET, HMGET and the hash reads stop copying once they pass it).
    pub max_output_bytes: usize,
    /// `maxmemory` and the gauge it is checked against (memory.rs).
    pub memory: MemoryLimit,
    /// The newest commit (or value read) whose reply this server has sent (moved as each
    /// connection writes its replies, server.rs): a snapshot for SCAN or KEYS is taken at
    /// or above it (`fresh_snapshot`).
    pub acked: AtomicU64,
    next_client_id: AtomicU64,
}

impl Shared {
    pub fn new(
        db: Arc<Database>,
        log: Option<Arc<ditto_log::Logger>>,
        password: Option<String>,
        tcp_port: u16,
    ) -> Result<Shared, Error> {
        Shared::with_counts(db, log, password, tcp_port, None)
    }

    /// A server that changes its role in place serves on from `prev`'s connections: its
    /// counters, uptime and client ids go on, and (the engine being the same) so do its
    /// SCAN cursors.
    pub fn carry_over(&mut self, prev: &Shared) {
        self.stats = Arc::clone(&prev.stats);
        self.started = prev.started;
        self.next_client_id.store(prev.next_client_id.load(Ordering::Relaxed), Ordering::Relaxed);
        if Arc::ptr_eq(&self.db, &prev.db) {
            *self.cursors.get_mut() = std::mem::take(&mut *prev.cursors.lock());
        }
    }

    /// `new`, with the per-database key counts known already (`counted`: the counts and
    /// the snapshot they hold at), as a server that changes its role in place knows them
    /// from its previous run; `None` counts them (a walk of every key).
    pub fn with_counts(
        db: Arc<Database>,
        log: Option<Arc<ditto_log::Logger>>,
        password: Option<String>,
        tcp_port: u16,
        counted: Option<([i64; crate::keyspace::DBS], ditto_engine::Ts)>,
    ) -> Result<Shared, Error> {
        let ks = Keyspace::open(&db)?;
        let (key_counts, key_counts_at) = match counted {
            Some((n, at)) => (KeyCounts::from_values(n), at),
            None => KeyCounts::count_at(&db, &ks)?,
        };
        Ok(Shared {
            key_counts: Arc::new(key_counts),
            key_counts_at,
            stats: Arc::new(Stats::new(db.workers())),
            db,
            ks,
            log,
            password,
            cursors: Mutex::new(Cursors::default()),
            started: Instant::now(),
            tcp_port,
            read_only: false,
            replication: Replication::Standalone,
            config_view: Vec::new(),
            max_output_bytes: usize::MAX,
            memory: MemoryLimit::none(),
            acked: AtomicU64::new(0),
            primary_addr: None,
            write_gate: Arc::default(),
            next_client_id: AtomicU64::new(1),
        })
    }
}

/// Counters for INFO and the metrics endpoint.
#[derive(Debug)]
pub struct Stats {
    pub commands: AtomicU64,
    pub txn_commits: AtomicU64,
    pub txn_conflicts: AtomicU64,
    pub errors: AtomicU64,
    pub connections_received: AtomicU64,
    pub connected_clients: AtomicUsize,
    pub rejected_connections: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub tls_handshake_failures: AtomicU64,
    /// Per engine worker (server thread), then per command indexed like [`SPECS`] (INFO
    /// commandstats): each thread counts in its own shard, so the counters of a hot command
    /// do not bounce between cores (shared ones cost 15% of pipelined GET throughput).
    per_command: Box<[Box<[CommandStats]>]>,
}

impl Stats {
    pub fn new(shards: usize) -> Stats {
        Stats {
            commands: AtomicU64::new(0),
            txn_commits: AtomicU64::new(0),
            txn_conflicts: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            connections_received: AtomicU64::new(0),
            connected_clients: AtomicUsize::new(0),
            rejected_connections: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            tls_handshake_failures: AtomicU64::new(0),
            per_command: (0..shards.max(1)).map(|_| SPECS.iter().map(|_| CommandStats::default()).collect()).collect(),
        }
    }

    /// Shard `shard`'s counters for command `cmd`.
    pub fn command(&self, shard: usize, cmd: usize) -> &CommandStats {
        &self.per_command[shard % self.per_command.len()][cmd]
    }

    /// Command `cmd`'s counters summed over the shards: (calls, nanoseconds, rejected, failed).
    pub fn command_totals(&self, cmd: usize) -> [u64; 4] {
        let mut t = [0; 4];
        for shard in self.per_command.iter() {
            let c = &shard[cmd];
            for (x, a) in t.iter_mut().zip([&c.calls, &c.nanos, &c.rejected, &c.failed]) {
                *x += a.load(Ordering::Relaxed);
            }
        }
        t
    }
}

/// One command's counters, as Redis's INFO commandstats has them. A command refused
/// before it runs (wrong arity, NOAUTH, READONLY, or inside a MULTI already failed) is
/// `rejected`; one that ran and answered an error is `failed`. A command queued inside MULTI
/// counts as a call when queued; its execution time is EXEC's.
#[derive(Default, Debug)]
pub struct CommandStats {
    pub calls: AtomicU64,
    /// Time spent handling the command and encoding its reply (not the wait for
    /// durability), in nanoseconds. The connection adds it (`server.rs`): it is the gap
    /// between the clock readings it takes anyway before each request of a pipeline, so
    /// timing costs no extra clock reads per command.
    pub nanos: AtomicU64,
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
}

/// SCAN cursors: a cursor number names the last key a SCAN returned, so the next call
/// resumes after it however the keyspace changed meanwhile. Shared by every connection (a
/// client may continue a scan on another connection) and bounded: the oldest are forgotten,
/// and an unknown cursor is an error rather than a silent restart.
#[derive(Default)]
pub struct Cursors {
    next: u64,
    by_id: HashMap<u64, (u8, Bytes)>,
    order: VecDeque<u64>,
    /// The keys' bytes held.
    bytes: usize,
}

const CURSORS_MAX: usize = 65_536;
/// The most bytes of keys the cursors hold (each key counted 64 bytes more): a client
/// scanning one large key over and over would otherwise hold up to 4 GiB.
const CURSORS_BYTES_MAX: usize = 16 << 20;

impl Cursors {
    fn issue(&mut self, db: u8, after: Bytes) -> u64 {
        self.next += 1;
        let id = self.next;
        self.bytes += after.len() + 64;
        self.by_id.insert(id, (db, after));
        self.order.push_back(id);
        while self.order.len() > CURSORS_MAX || self.bytes > CURSORS_BYTES_MAX {
            let Some(old) = self.order.pop_front() else { break };
            if let Some((_, k)) = self.by_id.remove(&old) {
                self.bytes -= k.len() + 64;
            }
        }
        id
    }

    fn get(&self, id: u64) -> Option<&(u8, Bytes)> {
        self.by_id.get(&id)
    }
}

/// The requests a pipeline may answer as a run, together (`Session::handle_run`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunKind {
    Get,
    Set,
}

/// What the connection does with one request.
#[derive(Debug)]
pub struct Outcome {
    pub reply: Reply,
    /// The reply may leave only once every commit up to this timestamp is durable.
    pub wait: Ts,
    pub close: bool,
    /// The command's index in [`SPECS`], for per-command metrics (`None`: unknown command).
    pub cmd: Option<usize>,
    /// Redis's WAIT: the reply is the number of backups holding this commit, counted by the
    /// connection once it has waited for it (`reply` is then not sent).
    pub replicas: Option<WaitReplicas>,
    /// The commit policy `wait` is released under, where it is not the connection's (a
    /// transaction's own: DITTO.POLICY inside MULTI).
    pub policy: Option<ditto_replication::CommitPolicy>,
}

/// WAIT numreplicas timeout, on a primary: wait until `n` backups have received every
/// commit of the connection (up to `ts`), or `timeout` passes (zero: no limit, as Redis).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitReplicas {
    pub n: usize,
    pub ts: Ts,
    pub timeout: std::time::Duration,
}

impl Outcome {
    fn now(reply: Reply) -> Outcome {
        Outcome::after(reply, Ts(0))
    }

    fn after(reply: Reply, wait: Ts) -> Outcome {
        Outcome { reply, wait, close: false, cmd: None, replicas: None, policy: None }
    }
}

pub struct Session {
    pub id: u64,
    pub proto: Proto,
    name: Option<Bytes>,
    authed: bool,
    db: u8,
    /// Queued requests while inside MULTI.
    multi: Option<Vec<Vec<Bytes>>>,
    /// The bytes queued since MULTI, counted as `QUEUED_REQUEST_OVERHEAD` per request and
    /// `QUEUED_ARG_OVERHEAD` per argument plus its bytes; past `MULTI_QUEUE_BYTES_MAX` the
    /// queue is dropped and EXEC aborts.
    multi_bytes: usize,
    /// A request queued inside MULTI was refused: EXEC answers EXECABORT.
    multi_failed: bool,
    /// On a backup's read path, the gate generation its server saw before an EXEC
    /// (`set_exec_gate`): the EXEC compares it once it has read, before it runs what acts
    /// outside the connection (`acts_outside`), and says it did (`exec_gate_checked`).
    exec_gate: Option<u64>,
    exec_gate_checked: bool,
    /// (db, key) -> the key's newest version when first WATCHed.
    watched: std::collections::HashMap<(u8, Bytes), KeyVersion>,
    /// The bytes of the watched keys (plus `WATCHED_KEY_OVERHEAD` each), bounded as a MULTI
    /// queue is.
    watched_bytes: usize,
    /// The commit timestamp of this connection's last write (DITTO.LASTCOMMIT).
    last_commit: Ts,
    /// This connection's commit policy (DITTO.POLICY); `None`: the server's.
    policy: Option<ditto_replication::CommitPolicy>,
    /// The policy could not be recorded with the primary the connection moved to
    /// (`role_changed`): it is tried again before each write, which is refused until it is.
    policy_unrecorded: bool,
    /// The client is connected over TLS: it is told the primary's TLS address.
    pub tls: bool,
}

impl Session {
    /// The commit policy this connection's writes are released under (`None`: the
    /// server's default).
    pub fn policy(&self) -> Option<ditto_replication::CommitPolicy> {
        self.policy
    }

    /// DITTO.POLICY [policy|default]: shows or sets this connection's commit policy. On a
    /// primary any policy (a weaker one than the server's answers sooner and is safer
    /// only as far as it says; backups show the write once the server's policy releases
    /// it); elsewhere only `local`.
    fn set_policy(&mut self, a: &[Bytes], sh: &Shared) -> Reply {
        let default = match &sh.replication {
            Replication::Primary { policy, .. } => Some(*policy),
            _ => None,
        };
        let Some(arg) = a.first() else {
            let p = self.policy.or(default).unwrap_or(ditto_replication::CommitPolicy::LOCAL);
            return Reply::Bulk(Bytes::from(p.name()));
        };
        let text = String::from_utf8_lossy(arg);
        if text.eq_ignore_ascii_case("default") {
            self.policy = None;
            self.policy_unrecorded = false;
            return Reply::Ok;
        }
        match ditto_replication::CommitPolicy::parse(&text) {
            Err(e) => Reply::err(format!("ERR {e}")),
            Ok(p) if default.is_none() && p != ditto_replication::CommitPolicy::LOCAL => Reply::err(format!(
                "ERR commit policy {} needs backups: this node is not a primary (ditto server --repl-port)",
                p.name()
            )),
            Ok(p) => {
                // Before any commit under it (backups must know their acknowledgement may
                // release what they receive from now on).
                if let (Replication::Primary { primary, .. }, false) =
                    (&sh.replication, p == ditto_replication::CommitPolicy::LOCAL)
                {
                    if let Err(e) = primary.backups_may_release(p) {
                        return Reply::err(format!("ERR commit policy {}: recording it failed: {e}", p.name()));
                    }
                }
                self.policy = Some(p);
                self.policy_unrecorded = false;
                Reply::Ok
            }
        }
    }

    /// The connection moved to another role (`Hub::follow`, a change in place): a
    /// commit policy it chose is made known to the new primary before its next write, as
    /// `DITTO.POLICY` did to the old one (the quorum's record, batches shipped `counted`,
    /// and shipping at commit pace under `received`). Without it the policy still decided
    /// each reply's release, but a `received` one waited for the interval's pace and the
    /// backups learnt of their say only from the primary's heartbeats. On a backup
    /// nothing is written: the next primary it moves to is told.
    pub fn role_changed(&mut self, sh: &Shared) {
        if let Err(e) = self.record_policy(sh) {
            tracing::error!("{e}: this connection's writes are refused until it is recorded");
        }
    }

    /// Records the connection's commit policy with its primary (`role_changed`); on a
    /// failure the policy is marked unrecorded, and every write is refused, trying again
    /// first, until it is recorded (or the connection sets another policy): a commit under
    /// it needs the record before it is made.
    fn record_policy(&mut self, sh: &Shared) -> Result<(), String> {
        self.policy_unrecorded = false;
        let Some(p) = self.policy.filter(|p| *p != ditto_replication::CommitPolicy::LOCAL) else { return Ok(()) };
        if let Replication::Primary { primary, .. } = &sh.replication {
            if let Err(e) = primary.backups_may_release(p) {
                self.policy_unrecorded = true;
                return Err(format!("recording commit policy {} with this primary failed: {e}", p.name()));
            }
        }
        Ok(())
    }

    pub fn new(sh: &Shared) -> Session {
        Session::with_id(sh.next_client_id.fetch_add(1, Ordering::Relaxed), sh)
    }

    /// A fresh session (not authenticated if a password is set, database 0, RESP2).
    fn with_id(id: u64, sh: &Shared) -> Session {
        Session {
            id,
            proto: Proto::Resp2,
            name: None,
            authed: sh.password.is_none(),
            db: 0,
            multi: None,
            multi_failed: false,
            exec_gate: None,
            exec_gate_checked: false,
            multi_bytes: 0,
            watched: std::collections::HashMap::new(),
            watched_bytes: 0,
            last_commit: Ts(0),
            policy: None,
            policy_unrecorded: false,
            tls: false,
        }
    }

    /// Handles one request (a non-empty argument list).
    pub fn handle(&mut self, args: Vec<Bytes>, sh: &Shared, worker: &mut Worker) -> Outcome {
        debug_assert!(!args.is_empty());
        sh.stats.commands.fetch_add(1, Ordering::Relaxed);
        let Some(i) = commands::lookup_index(&args[0]) else {
            self.flag_multi();
            sh.stats.errors.fetch_add(1, Ordering::Relaxed);
            return Outcome::now(unknown_command(&args));
        };
        let stats = sh.stats.command(worker.id().0 as usize, i);
        let mut out = match self.dispatch(&SPECS[i], args, sh, worker) {
            Ok(out) => {
                stats.calls.fetch_add(1, Ordering::Relaxed);
                if out.reply.is_error() {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                }
                out
            }
            Err(refused) => {
                self.flag_multi();
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                Outcome::now(match (SPECS[i].name, refused) {
                    // As Redis: an EXEC refused before it runs (arity, auth, maxmemory)
                    // discards the transaction instead of leaving it open.
                    ("EXEC", Reply::Error(msg)) => {
                        self.multi = None;
                        self.multi_failed = false;
                        self.unwatch();
                        let why = msg.strip_prefix("ERR ").unwrap_or(&msg);
                        Reply::err(format!("EXECABORT Transaction discarded because of: {why}"))
                    }
                    (_, refused) => refused,
                })
            }
        };
        if out.reply.is_error() {
            sh.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        out.cmd = Some(i);
        out
    }

    /// Whether `args` is a request that `handle_run` may answer together with its
    /// neighbours of the same kind in a pipeline: a plain `GET key` or `SET key value`, in a
    /// session that is authenticated and not queueing a MULTI (so the request would run as a
    /// data command of its own), a SET only where writes are allowed.
    /// Whether `args` is a WAIT or a DITTO.WAITTS that may block (not queued in a
    /// transaction): the replies before it go out first, as Redis sends them before it
    /// blocks the client. (A DITTO.WAITTS, alone in its batch so, has a bound of its own
    /// on a primary, `waitts_timeout_ms`, which the writes' replies before it have not.)
    pub fn may_block(&self, args: &[Bytes]) -> bool {
        self.multi.is_none() && (args[0].eq_ignore_ascii_case(b"WAIT") || args[0].eq_ignore_ascii_case(b"DITTO.WAITTS"))
    }

    /// Whether `args` is a `DITTO.WAITTS` (not in a transaction, where it is refused): the
    /// requests after it are handled only once its wait is over, so that they read at
    /// least that fresh. (Before, a pipelined read after it read at once, at the view it
    /// had, and its reply waited with the WAITTS's: `+OK`, then the old value; found by a
    /// review.)
    pub fn ends_batch(&self, args: &[Bytes]) -> bool {
        self.multi.is_none() && args[0].eq_ignore_ascii_case(b"DITTO.WAITTS")
    }

    /// Whether the connection may run commands: it authenticated, or no password is set.
    pub fn authed(&self) -> bool {
        self.authed
    }

    /// The request limits for this connection's next request: `limits`, or Redis's smaller
    /// ones while it has not authenticated (`Limits::unauthenticated`).
    pub fn limits(&self, limits: &crate::resp::Limits) -> crate::resp::Limits {
        match self.authed {
            true => *limits,
            false => limits.unauthenticated(),
        }
    }

    pub fn run_kind(&self, args: &[Bytes], sh: &Shared) -> Option<RunKind> {
        if !self.authed || self.multi.is_some() {
            return None;
        }
        match args.len() {
            // A backup whose reads are held refuses each GET alone (`dispatch`).
            2 if args[0].eq_ignore_ascii_case(b"GET") && !reads_held(sh) => Some(RunKind::Get),
            // Over maxmemory each SET goes alone, to be refused by `dispatch`.
            3 if args[0].eq_ignore_ascii_case(b"SET")
                && !sh.read_only
                && !self.policy_unrecorded
                && !sh.memory.over()
                && sh.write_gate.refusal().is_none() =>
            {
                Some(RunKind::Set)
            }
            _ => None,
        }
    }

    /// Whether `args` reads the data of a backup whose reads are held now
    /// (`BackupState::reads_held`): its connection waits a while for the release first.
    pub fn read_held(&self, args: &[Bytes], sh: &Shared) -> bool {
        // (Inside MULTI a queued read is refused at once; EXEC waits.)
        reads_held(sh)
            && self.authed
            && commands::lookup_index(&args[0])
                .is_some_and(|i| (self.multi.is_none() || SPECS[i].name == "EXEC") && self.reads_data(&SPECS[i]))
    }

    /// On a cluster backup, for a request that reads the data: the backup's gate
    /// generation now (`BackupState::gate_gen`). Its server compares it again once the
    /// request is handled; if reads became held meanwhile, the request may have read at a
    /// view published since, and is handled again.
    /// Its server, before an EXEC: the backup's gate generation it saw (`read_gate`), or
    /// none.
    pub fn set_exec_gate(&mut self, gen: Option<u64>) {
        self.exec_gate = gen;
        self.exec_gate_checked = false;
    }

    /// Whether the last EXEC compared the backup's gate after its reads, found it as its
    /// server saw it, and then ran a command acting outside the connection: its reads
    /// stand whatever the gate did since, and it must not be answered "run it again" (what
    /// it ran cannot be undone). Told once.
    pub fn exec_gate_checked(&mut self) -> bool {
        std::mem::take(&mut self.exec_gate_checked)
    }

    pub fn read_gate(&self, args: &[Bytes], sh: &Shared) -> Option<u64> {
        // Inside MULTI a command is queued, not run (and must not be queued twice): only
        // EXEC reads, and it is not run again (its server answers LOADING instead).
        let queued = self.multi.is_some() && !args[0].eq_ignore_ascii_case(b"EXEC");
        match &sh.replication {
            Replication::Backup { state, .. } if !queued && self.reads_data_of(args) => {
                Some(state.gate_gen.load(Ordering::Acquire))
            }
            _ => None,
        }
    }

    fn reads_data_of(&self, args: &[Bytes]) -> bool {
        commands::lookup_index(&args[0]).is_some_and(|i| self.reads_data(&SPECS[i]))
    }

    /// `reads_data`, and EXEC where what it runs reads the data: a queued read (queued
    /// before reads were held, or before this connection moved to a held role), or a
    /// watched key (whose check reads a version).
    fn reads_data(&self, spec: &Spec) -> bool {
        reads_data(spec)
            || (spec.name == "EXEC"
                && (!self.watched.is_empty()
                    || self.multi.as_ref().is_some_and(|q| {
                        q.iter().any(|r| commands::lookup_index(&r[0]).is_some_and(|i| reads_data(&SPECS[i])))
                    })))
    }

    /// Answers a pipeline's run of requests of one `run_kind` in one transaction, with the
    /// replies, statistics and durability waits that `handle` gives each alone. GETs read
    /// with their index searches interleaved (`get_many_with`); SETs share one commit and
    /// one log record. Serializable as they are: the client sent them all before any reply,
    /// so they may all take effect at one point (the transaction's) within the span each
    /// was outstanding, in their order. A run the transaction cannot take (an engine error
    /// other than a conflict, such as a value over the size limit) is run request by request.
    /// GETs whose values together pass `budget` bytes are answered only up to the one that
    /// passes it (at least one): the answer may hold fewer outcomes than `reqs`, and the
    /// caller runs the rest later, so a run cannot buffer much more output than one request.
    pub fn handle_run(
        &mut self,
        kind: RunKind,
        reqs: &[Vec<Bytes>],
        budget: usize,
        sh: &Shared,
        worker: &mut Worker,
    ) -> Vec<Outcome> {
        let name: &[u8] = match kind {
            RunKind::Get => b"GET",
            RunKind::Set => b"SET",
        };
        // (Not `run_kind` again: what it reads of the server, the memory bound and the
        // write gate, may have moved since the run was collected, as for a single SET
        // dispatched just before; a debug build asserted it and could panic.)
        debug_assert!(reqs
            .iter()
            .all(|r| r.len() == 2 + usize::from(kind == RunKind::Set) && r[0].eq_ignore_ascii_case(name)));
        let i = commands::lookup_index(name).expect("a command");
        let keys: Vec<&Bytes> = match kind {
            RunKind::Get => reqs.iter().map(|r| &r[1]).collect(),
            RunKind::Set => Vec::new(),
        };
        let db = self.db;
        let ran = run_txn(sh, worker, |txn| match kind {
            RunKind::Get => {
                let values = sh.ks.get_strings(txn, db, &keys, budget)?;
                Ok(values.into_iter().map(commands::get_reply).collect::<Vec<_>>())
            }
            RunKind::Set => {
                let pairs: Vec<(&[u8], &[u8])> = reqs.iter().map(|r| (&r[1][..], &r[2][..])).collect();
                sh.ks.set_strings(txn, db, &pairs)?;
                Ok(vec![Reply::Ok; reqs.len()])
            }
        });
        let (replies, ticket) = match ran {
            Ok(done) => done,
            // Committed, and refused its acknowledgement (the write gate lapsed: a cluster
            // primary's lease ran out while it ran): every SET of the run is answered so,
            // as a single SET is. Run again one by one, they were answered READONLY (not
            // written, though they were) or, had the gate opened again, written twice
            // (found by a review, 2026-12-06).
            Err(e @ Error::NotAcknowledged(_)) => {
                let stats = sh.stats.command(worker.id().0 as usize, i);
                sh.stats.commands.fetch_add(reqs.len() as u64, Ordering::Relaxed);
                stats.calls.fetch_add(reqs.len() as u64, Ordering::Relaxed);
                stats.failed.fetch_add(reqs.len() as u64, Ordering::Relaxed);
                sh.stats.errors.fetch_add(reqs.len() as u64, Ordering::Relaxed);
                let reply = engine_error(&e);
                return reqs
                    .iter()
                    .map(|_| Outcome {
                        reply: reply.clone(),
                        wait: Ts::ZERO,
                        close: false,
                        cmd: Some(i),
                        replicas: None,
                        policy: None,
                    })
                    .collect();
            }
            Err(_) => {
                // One by one, held to the budget as the run is (at least one answered): GETs
                // of a large value under constant conflicts otherwise buffered every reply.
                let mut out: Vec<Outcome> = Vec::new();
                let mut bytes = 0usize;
                for r in reqs {
                    if !out.is_empty() && bytes >= budget {
                        break;
                    }
                    let o = self.handle(r.clone(), sh, worker);
                    bytes += o.reply.wire_bytes();
                    out.push(o);
                }
                return out;
            }
        };
        let wait = ticket.ts();
        if kind == RunKind::Set {
            self.last_commit = wait;
        }
        let stats = sh.stats.command(worker.id().0 as usize, i);
        sh.stats.commands.fetch_add(replies.len() as u64, Ordering::Relaxed);
        stats.calls.fetch_add(replies.len() as u64, Ordering::Relaxed);
        replies
            .into_iter()
            .map(|reply| {
                if reply.is_error() {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    sh.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
                Outcome { reply, wait, close: false, cmd: Some(i), replicas: None, policy: None }
            })
            .collect()
    }

    /// Runs a known command; `Err` is a refusal before it ran (see [`CommandStats`]).
    fn dispatch(&mut self, spec: &Spec, args: Vec<Bytes>, sh: &Shared, worker: &mut Worker) -> Result<Outcome, Reply> {
        if !spec.arity_ok(args.len()) {
            return Err(wrong_arity(spec));
        }
        if let Some(refused) = commands::subcommand_refusal(spec, &args) {
            return Err(refused);
        }
        if !self.authed && !matches!(spec.name, "AUTH" | "HELLO" | "QUIT" | "RESET") {
            return Err(Reply::err("NOAUTH Authentication required."));
        }
        if spec.write && sh.read_only {
            return Err(Reply::err(read_only_refusal(sh, self.tls)));
        }
        if spec.write {
            if let Some(why) = sh.write_gate.refusal_for(self.tls) {
                return Err(Reply::err(format!("READONLY {why}")));
            }
            if self.policy_unrecorded {
                if let Err(e) = self.record_policy(sh) {
                    return Err(Reply::err(format!(
                        "ERR {e}; this connection's writes are refused until it is (DITTO.POLICY sets it again)"
                    )));
                }
            }
        }
        if let Some(refused) = commands::ditto_refusal(spec, &args) {
            return Err(refused);
        }
        if let (true, Replication::Backup { state, .. }) = (self.reads_data(spec), &sh.replication) {
            if let Some((from, released)) = state.reads_held() {
                state.reads_refused.fetch_add(1, Ordering::Relaxed);
                // (Redis answers LOADING while a replica loads its data; clients retry.)
                return Err(Reply::err(match from {
                    u64::MAX => "LOADING this backup is changing its role; retry shortly".to_string(),
                    _ => format!(
                        "LOADING this backup's data is at ts {from} (where it started or was cut to follow a new primary), which its primary has released only up to ts {released}; retry shortly"
                    ),
                }));
            }
        }
        if sh.memory.max != 0 && self.may_grow(spec) && sh.memory.over() && {
            // Deleted values may still wait for a collection: get them back before refusing.
            sh.db.reclaim();
            sh.memory.over()
        } {
            sh.memory.rejections.fetch_add(1, Ordering::Relaxed);
            return Err(Reply::err(OOM));
        }
        if let Some(queue) = self.multi.as_mut() {
            // A transaction reads at its start: a wait queued in it would answer after reads
            // that did not wait (found by a review).
            if spec.name == "DITTO.WAITTS" {
                return Err(Reply::err(
                    "ERR DITTO.WAITTS inside MULTI is not allowed: send it before MULTI (a transaction reads at its start)",
                ));
            }
            if !matches!(spec.name, "EXEC" | "DISCARD" | "MULTI" | "WATCH" | "QUIT" | "RESET") {
                self.multi_bytes +=
                    QUEUED_REQUEST_OVERHEAD + args.iter().map(|a| a.len() + QUEUED_ARG_OVERHEAD).sum::<usize>();
                if self.multi_bytes > MULTI_QUEUE_BYTES_MAX {
                    // EXEC will abort (the caller flags it); what was queued is let go now.
                    *queue = Vec::new();
                    return Err(Reply::err(format!(
                        "ERR MULTI queue over {MULTI_QUEUE_BYTES_MAX} bytes, more than one transaction can \
                         write; EXEC will abort"
                    )));
                }
                // Copies: the parser's arguments are views of the connection's input
                // buffer, whose whole allocation (up to a large request's size) a queued
                // view would keep alive, counted as its few bytes. One allocation for
                // all of a request's arguments.
                let mut all = bytes::BytesMut::with_capacity(args.iter().map(|a| a.len()).sum());
                for a in &args {
                    all.extend_from_slice(a);
                }
                let all = all.freeze();
                let mut at = 0;
                queue.push(
                    args.iter()
                        .map(|a| {
                            at += a.len();
                            all.slice(at - a.len()..at)
                        })
                        .collect(),
                );
                return Ok(Outcome::now(Reply::Simple("QUEUED")));
            }
        }
        Ok(match spec.name {
            "MULTI" => Outcome::now(if self.multi.is_some() {
                Reply::err("ERR MULTI calls can not be nested")
            } else {
                self.multi = Some(Vec::new());
                self.multi_bytes = 0;
                Reply::Ok
            }),
            "EXEC" => self.exec(sh, worker),
            "DISCARD" => Outcome::now(if self.multi.take().is_some() {
                self.multi_failed = false;
                self.unwatch();
                Reply::Ok
            } else {
                Reply::err("ERR DISCARD without MULTI")
            }),
            "WATCH" => self.watch(&args[1..], sh, worker),
            _ if spec.kind == Kind::Data => self.run_single(spec, &args, sh, worker),
            _ => self.conn_command(spec, &args, sh),
        })
    }

    /// Whether `spec` is refused while over `maxmemory`, as Redis decides: a command that may
    /// grow the data; inside MULTI, anything that would be queued (a queue grows too); EXEC
    /// of a queue holding such a command.
    fn may_grow(&self, spec: &Spec) -> bool {
        match &self.multi {
            _ if spec.grows => true,
            Some(queue) if spec.name == "EXEC" => queue.iter().any(|args| lookup(&args[0]).is_some_and(|s| s.grows)),
            Some(_) => !matches!(spec.name, "DISCARD" | "QUIT" | "RESET"),
            None => false,
        }
    }

    /// A refused request inside MULTI makes EXEC fail, as in Redis.
    fn flag_multi(&mut self) {
        if self.multi.is_some() {
            self.multi_failed = true;
        }
    }

    fn run_single(&mut self, spec: &Spec, args: &[Bytes], sh: &Shared, worker: &mut Worker) -> Outcome {
        let db = self.db;
        match run_txn(sh, worker, |txn| run_data(spec, args, &sh.ks, db, sh.max_output_bytes, txn)) {
            Ok((reply, ticket)) => {
                if spec.write && !reply.is_error() {
                    self.last_commit = ticket.ts();
                }
                Outcome::after(reply, ticket.ts())
            }
            Err(e) => Outcome::now(engine_error(&e)),
        }
    }

    fn unwatch(&mut self) {
        self.watched.clear();
        self.watched_bytes = 0;
    }

    fn watch(&mut self, keys: &[Bytes], sh: &Shared, worker: &mut Worker) -> Outcome {
        if self.multi.is_some() {
            return Outcome::now(Reply::err("ERR WATCH inside MULTI is not allowed"));
        }
        let mut tries = 0;
        loop {
            let mut txn = begin(sh, worker);
            let mut seen = Vec::with_capacity(keys.len());
            let res = keys
                .iter()
                .try_for_each(|k| {
                    let v = txn.version(sh.ks.keys, &Keyspace::key_row(self.db, k))?;
                    // (A copy, not a view of the input buffer: see the MULTI queue.)
                    seen.push((self.db, Bytes::copy_from_slice(k), v));
                    Ok(())
                })
                .and_then(|()| txn.commit_async());
            match res {
                Ok(ticket) => {
                    // A key watched again keeps its first watch, as in Redis.
                    for (db, key, ts) in seen {
                        if let std::collections::hash_map::Entry::Vacant(e) = self.watched.entry((db, key)) {
                            self.watched_bytes += e.key().1.len() + WATCHED_KEY_OVERHEAD;
                            e.insert(ts);
                        }
                    }
                    if self.watched_bytes > MULTI_QUEUE_BYTES_MAX {
                        self.unwatch();
                        return Outcome::now(Reply::err(format!(
                            "ERR watched keys over {MULTI_QUEUE_BYTES_MAX} bytes; every key unwatched"
                        )));
                    }
                    return Outcome::after(Reply::Ok, ticket.ts());
                }
                Err(e) if e.is_retryable() && tries < RETRIES_MAX => tries += 1,
                Err(e) => return Outcome::now(engine_error(&e)),
            }
        }
    }

    /// EXEC. A DITTO.POLICY queued in the transaction is the transaction's own policy: its
    /// reply is released under it, and the connection keeps its policy.
    fn exec(&mut self, sh: &Shared, worker: &mut Worker) -> Outcome {
        // A policy not recorded with this primary is tried again first (the queued writes
        // are refused if it still is: `exec_queued`).
        if self.policy_unrecorded {
            let _ = self.record_policy(sh);
        }
        let (conn_policy, unrecorded) = (self.policy, self.policy_unrecorded);
        let mut o = self.exec_queued(sh, worker);
        if self.policy != conn_policy {
            let server = match &sh.replication {
                Replication::Primary { policy, .. } => Some(*policy),
                _ => None,
            };
            o.policy = self.policy.or(server);
            // The connection's policy comes back, and whether it is recorded with it (a
            // queued DITTO.POLICY recorded another).
            self.policy = conn_policy;
            self.policy_unrecorded = unrecorded;
        }
        o
    }

    fn exec_queued(&mut self, sh: &Shared, worker: &mut Worker) -> Outcome {
        let Some(queue) = self.multi.take() else { return Outcome::now(Reply::err("ERR EXEC without MULTI")) };
        let watched = std::mem::take(&mut self.watched);
        self.watched_bytes = 0;
        if std::mem::take(&mut self.multi_failed) {
            return Outcome::now(Reply::err("EXECABORT Transaction discarded because of previous errors."));
        }
        // The server became a backup after the writes were queued (it follows another
        // primary in place): refused as a whole, naming the primary, as a write is (and
        // first, as a write's refusal is: a backup's write gate may still give a reason of
        // its time as primary).
        let writes = queue.iter().any(|a| lookup(&a[0]).is_some_and(|spec| spec.write));
        if sh.read_only && writes {
            let why = read_only_refusal(sh, self.tls);
            return Outcome::now(Reply::err(format!("EXECABORT Transaction discarded because of: {why}")));
        }
        // The write gate closed after the writes were queued (a primary that lost contact
        // with its cluster): the transaction is refused as a whole.
        if let Some(why) = sh.write_gate.refusal_for(self.tls).filter(|_| writes) {
            return Outcome::now(Reply::err(format!("EXECABORT Transaction discarded because of: READONLY {why}")));
        }
        if self.policy_unrecorded && writes {
            let p = self.policy.map_or(String::new(), |p| p.name());
            return Outcome::now(Reply::err(format!(
                "EXECABORT Transaction discarded because of: commit policy {p} could not be recorded with this primary"
            )));
        }
        // What the queue's connection commands may change here (CLIENT SETNAME, HELLO,
        // AUTH): put back before another attempt, and where the EXEC answers without
        // committing (a watched key changed, a reply over the limit, an abort), as Redis
        // runs none of the queue then. (Before 2026-12-05 an attempt's changes stayed: an
        // EXEC retried after a conflict and answered nil had set the name and moved the
        // connection to RESP3; found by a review.) SELECT's database comes back the same
        // way, DITTO.POLICY's policy in `exec`. What cannot be undone (a command acting
        // outside the connection: `acts_outside`) runs only once the transaction has
        // committed, its reply put in its place then.
        let before = self.conn_state();
        let deferred: Vec<usize> = (0..queue.len())
            .filter(|&i| lookup(&queue[i][0]).is_some_and(|spec| acts_outside(spec, &queue[i])))
            .collect();
        let hello_queued = queue.iter().any(|a| a[0].eq_ignore_ascii_case(b"HELLO"));
        let mut tries = 0;
        loop {
            self.restore(before.clone());
            // The protocol each reply is written in: the connection's after its command ran
            // (a queued HELLO's own reply is in the protocol it chose), as Redis writes them;
            // kept only where a HELLO is queued (nothing else changes it).
            let mut protos = Vec::with_capacity(if hello_queued { queue.len() } else { 0 });
            let mut txn = begin(sh, worker);
            let mut wait = Ts(0);
            let mut wrote = false;
            // The whole reply is held to `max_output_bytes`, as each command's is: a short
            // queue of reads of one large value would otherwise make the server copy and
            // encode without bound (a pipeline of the same is answered in parts).
            // (Less the array's own header.)
            let (mut left, mut over) = (sh.max_output_bytes.saturating_sub(16), None);
            let attempt = (|| -> Result<Option<Vec<Reply>>, Error> {
                for ((db, key), then) in &watched {
                    if txn.changed_since(sh.ks.keys, &Keyspace::key_row(*db, key), *then)? {
                        return Ok(None);
                    }
                }
                let mut replies = Vec::with_capacity(queue.len());
                for args in &queue {
                    let spec = lookup(&args[0]).expect("queued requests were looked up");
                    if acts_outside(spec, args) {
                        // Its reply, once committed (a short status or error line).
                        replies.push(Reply::Nil);
                    } else if spec.kind == Kind::Data {
                        // A command over a limit (a key or a value too large) aborts the
                        // whole transaction, below: it may have written part of its effect
                        // before the engine refused the rest (`MSET a 1 <key too large> 2`
                        // wrote `a`; an `HSET` a field but not its hash), and Redis refuses
                        // such an argument when it is queued, so nothing runs.
                        let r = run_data(spec, args, &sh.ks, self.db, left, &mut txn)?;
                        // A write that answers a value (GETDEL, GETSET, SET ... GET)
                        // refused because that value's reply would pass what is left:
                        // the whole transaction is, as its reply would pass the limit
                        // (answered alone, the rest of it would commit without it).
                        if spec.write && commands::is_too_large(&r) {
                            over = Some(sh.max_output_bytes.saturating_add(1));
                            return Ok(None);
                        }
                        wrote |= spec.write && !r.is_error();
                        replies.push(r);
                    } else if walks_keys(spec) {
                        // Inside the transaction: they see its earlier writes, and a key
                        // another client adds or removes in the range they walked
                        // meanwhile makes the commit fail and the EXEC run again.
                        let out = self.read_keys(spec, &args[1..], sh, &mut Reader::Txn(&mut txn));
                        replies.push(out.reply);
                    } else {
                        let out = self.conn_command(spec, args, sh);
                        wait = wait.max(out.wait);
                        replies.push(match out.replicas {
                            // WAIT in a transaction does not block: how many backups hold
                            // this connection's writes so far, as Redis answers.
                            Some(w) => Reply::Int(replicas_holding(sh, w.ts) as i64),
                            None => out.reply,
                        });
                    }
                    if hello_queued {
                        protos.push(self.proto);
                    }
                    let bytes = replies.last().map_or(0, Reply::wire_bytes);
                    if bytes > left {
                        over = Some(sh.max_output_bytes - left + bytes);
                        return Ok(None);
                    }
                    left -= bytes;
                }
                Ok(Some(replies))
            })();
            if let Some(bytes) = over {
                // Nothing committed: the transaction is dropped, and the connection is as
                // it was.
                drop(txn);
                self.restore(before);
                return Outcome::now(Reply::err(format!(
                    "ERR EXEC's reply would be over max_output_bytes ({}): at least {bytes} bytes; nothing of the transaction was written",
                    sh.max_output_bytes
                )));
            }
            let res = attempt.and_then(|r| Ok((r, commit_counted(sh, txn)?)));
            match res {
                // A watched key changed: nil, once the change it saw is durable (as a read
                // waits for what it saw), so that no client learns of it before.
                Ok((None, ticket)) => {
                    self.restore(before);
                    return Outcome::after(Reply::NilArray, ticket.ts());
                }
                Ok((Some(mut replies), ticket)) => {
                    // On a backup whose gate moved since its server looked (a change of
                    // role), the reads may be of a view published since, and the EXEC is
                    // answered "run it again": before what acts outside runs, not after
                    // (before 2026-12-06 a queued SENTINEL FAILOVER had asked for its
                    // switchover by then; found by a review).
                    let gate = self.exec_gate.take();
                    if let (Some(g), Replication::Backup { state, .. }, false) =
                        (gate, &sh.replication, deferred.is_empty())
                    {
                        if state.gate_gen.load(Ordering::Acquire) != g {
                            self.restore(before);
                            return Outcome::now(Reply::err(EXEC_ROLE_CHANGED));
                        }
                        self.exec_gate_checked = true;
                    }
                    sh.stats.txn_commits.fetch_add(1, Ordering::Relaxed);
                    for &i in &deferred {
                        let spec = lookup(&queue[i][0]).expect("queued requests were looked up");
                        replies[i] = self.conn_command(spec, &queue[i], sh).reply;
                    }
                    if wrote {
                        self.last_commit = ticket.ts();
                    }
                    // (The array itself, and the replies made in the protocol in force at
                    // the end, are written in it.)
                    for (r, p) in replies.iter_mut().zip(protos) {
                        if p != self.proto {
                            *r = Reply::In(p, Box::new(std::mem::replace(r, Reply::Nil)));
                        }
                    }
                    return Outcome::after(Reply::Array(replies), wait.max(ticket.ts()));
                }
                Err(e) if e.is_retryable() && tries < RETRIES_MAX => {
                    sh.stats.txn_conflicts.fetch_add(1, Ordering::Relaxed);
                    tries += 1;
                }
                Err(e @ Error::TooLarge { .. }) => {
                    self.restore(before);
                    let why = too_large_text(&e);
                    return Outcome::now(Reply::err(format!("EXECABORT Transaction discarded because of: {why}")));
                }
                Err(e) => {
                    self.restore(before);
                    return Outcome::now(engine_error(&e));
                }
            }
        }
    }

    /// What a queued connection command may change on this connection (`exec_queued`).
    /// What the connection's own commands set (the database, the name, the protocol, the
    /// authentication), to be put back (`restore_conn_state`).
    pub fn conn_state(&self) -> ConnState {
        ConnState { db: self.db, name: self.name.clone(), proto: self.proto, authed: self.authed }
    }

    /// Puts back what `conn_state` saved.
    pub fn restore(&mut self, s: ConnState) {
        (self.db, self.name, self.proto, self.authed) = (s.db, s.name, s.proto, s.authed);
    }

    /// Connection commands (no engine transaction of their own). Also run inside EXEC.
    fn conn_command(&mut self, spec: &Spec, args: &[Bytes], sh: &Shared) -> Outcome {
        let a = &args[1..];
        let reply = match spec.name {
            "PING" => match a.len() {
                0 => Reply::Simple("PONG"),
                1 => Reply::Bulk(a[0].clone()),
                _ => wrong_arity(spec),
            },
            "ECHO" => Reply::Bulk(a[0].clone()),
            "QUIT" => return Outcome { close: true, ..Outcome::now(Reply::Ok) },
            "RESET" => {
                // The connection's last write is kept, as Redis keeps a client's
                // replication offset: a WAIT after it still waits for that write, and
                // KEYS and SCAN still see it (a review, 2026-12-05, night: WAIT answered
                // at once, counting backups holding timestamp 0).
                let last_commit = self.last_commit;
                *self = Session { tls: self.tls, last_commit, ..Session::with_id(self.id, sh) };
                Reply::Simple("RESET")
            }
            "AUTH" => self.auth(a, sh),
            "HELLO" => self.hello(a, sh),
            "SELECT" => match parse_int(&a[0]) {
                Some(n) if (0..DATABASES as i64).contains(&n) => {
                    self.db = n as u8;
                    Reply::Ok
                }
                // Redis reads the index as a C int first (`getIntFromObjectOrReply`).
                Some(n) if i32::try_from(n).is_err() => {
                    Reply::err("ERR value is out of range, value must between -2147483648 and 2147483647")
                }
                Some(_) => Reply::err("ERR DB index is out of range"),
                None => Reply::err(commands::NOT_INTEGER),
            },
            "CLIENT" => self.client(a),
            "CONFIG" => config(a, sh),
            "COMMAND" => command_info(a),
            "UNWATCH" => {
                self.unwatch();
                Reply::Ok
            }
            "INFO" => Reply::Text(info(a, sh).into()),
            "ROLE" => role(sh),
            "SENTINEL" => sentinel(a, sh, self.tls),
            // Redis's WAIT: how many backups have received this connection's writes (the
            // connection waits, bounded by the timeout; see `WaitReplicas`).
            // Refused on a backup before its arguments are read, then the count's error,
            // then the timeout's, with Redis's texts.
            "WAIT" if sh.read_only => Reply::err(
                "ERR WAIT cannot be used with replica instances. Please also note that since Redis 4.0 if a replica is configured to be writable (which is not the default) writes to replicas are just local and are not propagated.",
            ),
            "WAIT" => match (parse_int(&a[0]), parse_int(&a[1])) {
                (None, _) => Reply::err(commands::NOT_INTEGER),
                (Some(_), None) => Reply::err("ERR timeout is not an integer or out of range"),
                (Some(_), Some(t)) if t < 0 => Reply::err("ERR timeout is negative"),
                // (A count below 0 is answered at once, as Redis does.)
                (Some(n), Some(t)) => {
                    let w = WaitReplicas {
                        n: n.max(0) as usize,
                        ts: self.last_commit,
                        timeout: std::time::Duration::from_millis(t as u64),
                    };
                    return Outcome { replicas: Some(w), ..Outcome::now(Reply::Int(0)) };
                }
            },
            // The count kept by every commit, in O(1). It may include commits not yet
            // durable: the reply waits until every commit so far is, as a read waits for
            // what it saw. (On a backup the clock is the read view, and the count is of
            // what it covers: `KeyCounts::settle`.) The clock is read again after the count:
            // a commit takes its timestamp before it moves the count, so every move counted
            // lies at or below that reading (with the clock read only before, a commit
            // timestamped between the two was counted and not waited for; found by a review).
            "DBSIZE" => {
                let n = sh.key_counts.get(self.db, sh.db.clock().now());
                return Outcome::after(Reply::Int(n), sh.db.clock().now());
            }
            "SCAN" | "KEYS" => {
                return match fresh_snapshot(sh, self.last_commit) {
                    Ok(snap) => self.read_keys(spec, a, sh, &mut Reader::Snapshot(snap)),
                    Err(refused) => Outcome::now(refused),
                }
            }
            "DITTO.LASTCOMMIT" => Reply::Int(self.last_commit.0 as i64),
            "DITTO.WAITTS" => return wait_ts(a, sh),
            "DITTO.POLICY" => self.set_policy(a, sh),
            "DITTO.FORGETBACKUP" => forget_backup(a, sh),
            other => unreachable!("{other} is not a connection command"),
        };
        Outcome::now(reply)
    }

    /// DBSIZE (inside EXEC), SCAN and KEYS, which walk the keyspace, at `at`.
    fn read_keys(&self, spec: &Spec, a: &[Bytes], sh: &Shared, at: &mut Reader) -> Outcome {
        match spec.name {
            "DBSIZE" => dbsize(self.db, sh, at),
            "SCAN" => scan(self.db, a, sh, at),
            "KEYS" => keys(self.db, &a[0], sh, at),
            other => unreachable!("{other} does not walk the keyspace"),
        }
    }

    fn auth(&mut self, a: &[Bytes], sh: &Shared) -> Reply {
        let (user, pass) = match a.len() {
            1 => (&b"default"[..], &a[0]),
            2 => (&a[0][..], &a[1]),
            _ => return Reply::err(commands::SYNTAX),
        };
        let Some(expected) = &sh.password else {
            // As Redis with no password: the default user takes any password, but the
            // one-argument form is answered with an error, to catch a misconfiguration.
            return match (a.len(), user) {
                (1, _) => Reply::err(
                    "ERR AUTH <password> called without any password configured for the default user. \
                     Are you sure your configuration is correct?",
                ),
                (_, b"default") => {
                    self.authed = true;
                    Reply::Ok
                }
                _ => Reply::err("WRONGPASS invalid username-password pair or user is disabled."),
            };
        };
        if user == b"default" && password_matches(expected, pass) {
            self.authed = true;
            Reply::Ok
        } else {
            Reply::err("WRONGPASS invalid username-password pair or user is disabled.")
        }
    }

    fn hello(&mut self, a: &[Bytes], sh: &Shared) -> Reply {
        let mut proto = self.proto;
        let mut rest = a;
        if let Some(v) = a.first() {
            match parse_int(v) {
                Some(2) => proto = Proto::Resp2,
                Some(3) => proto = Proto::Resp3,
                Some(_) => return Reply::err("NOPROTO unsupported protocol version"),
                None => return Reply::err("ERR Protocol version is not an integer or out of range"),
            }
            rest = &a[1..];
        }
        let mut name = None;
        // Every option is checked before the credentials are tried, as Redis does (before,
        // `HELLO 3 AUTH default pw BOGUS` authenticated the client, then answered the
        // syntax error; found by a review).
        let mut creds = None;
        while let Some(opt) = rest.first() {
            match opt.to_ascii_uppercase().as_slice() {
                b"AUTH" if rest.len() >= 3 => {
                    creds = Some(&rest[1..3]);
                    rest = &rest[3..];
                }
                b"SETNAME" if rest.len() >= 2 => {
                    name = Some(&rest[1]);
                    rest = &rest[2..];
                }
                _ => return crate::commands::raw_error(&[b"ERR Syntax error in HELLO option '", opt, b"'"]),
            }
        }
        if let Some(c) = creds {
            let r = self.auth(c, sh);
            if r.is_error() {
                return r;
            }
        }
        if !self.authed {
            return Reply::err(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> \
                 AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol \
                 version at the same time",
            );
        }
        // The name is checked once the client is authenticated, before the protocol
        // changes, and an empty one clears it, as Redis 7.0.15 does (compared over a raw
        // socket: `HELLO 3 AUTH default pw SETNAME "a b"` authenticates, refuses the name
        // and keeps RESP2; before 2026-12-05 ditto refused it unauthenticated, and kept
        // `SETNAME ""` as an empty name; found by a review).
        if let Some(n) = name {
            if let Some(refusal) = client_name_refusal(n) {
                return refusal;
            }
        }
        self.proto = proto;
        if let Some(n) = name {
            self.name = (!n.is_empty()).then(|| Bytes::copy_from_slice(n));
        }
        let s = |t: &'static str| Reply::bulk(t);
        Reply::Map(vec![
            (s("server"), s("redis")),
            (s("version"), s(REDIS_COMPAT_VERSION)),
            (s("proto"), Reply::Int(if proto == Proto::Resp3 { 3 } else { 2 })),
            (s("id"), Reply::Int(self.id as i64)),
            (s("mode"), s("standalone")),
            (s("role"), s(if matches!(sh.replication, Replication::Backup { .. }) { "replica" } else { "master" })),
            (s("modules"), Reply::Array(Vec::new())),
        ])
    }

    /// CLIENT's subcommands, whose names and arity `dispatch` has checked
    /// (`commands::subcommand_refusal`).
    fn client(&mut self, a: &[Bytes]) -> Reply {
        match a[0].to_ascii_uppercase().as_slice() {
            b"SETNAME" => {
                if let Some(refusal) = client_name_refusal(&a[1]) {
                    return refusal;
                }
                // (A copy, not a view of the input buffer: see the MULTI queue.)
                self.name = if a[1].is_empty() { None } else { Some(Bytes::copy_from_slice(&a[1])) };
                Reply::Ok
            }
            b"GETNAME" => self.name.clone().map_or(Reply::Nil, Reply::Bulk),
            b"ID" => Reply::Int(self.id as i64),
            // Client libraries announce themselves; nothing here uses it.
            b"SETINFO" => Reply::Ok,
            b"INFO" => Reply::Text(self.client_line().into()),
            other => unreachable!("CLIENT {other:?} passed subcommand_refusal"),
        }
    }

    fn client_line(&self) -> String {
        format!(
            "id={} name={} db={} multi={} resp={}\n",
            self.id,
            self.name.as_ref().map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default(),
            self.db,
            self.multi.as_ref().map_or(-1, |q| q.len() as i64),
            if self.proto == Proto::Resp3 { 3 } else { 2 }
        )
    }
}

/// The Redis version ditto reports to clients that look (HELLO, INFO): the command set and
/// replies follow Redis 7.
pub const REDIS_COMPAT_VERSION: &str = "7.0.0";

/// Constant-time in the password's bytes (the length is not secret: it is compared first).
fn password_matches(expected: &str, given: &[u8]) -> bool {
    expected.len() == given.len() && bool::from(expected.as_bytes().ct_eq(given))
}

/// Runs `body` in a transaction of `worker` and commits it without waiting for durability,
/// again after a conflict (up to `RETRIES_MAX` retries), counting commits and conflicts:
/// what `body` made and the commit's ticket, or the error that ended it.
fn run_txn<T>(
    sh: &Shared,
    worker: &mut Worker,
    mut body: impl FnMut(&mut Transaction<'_>) -> ditto_engine::Result<T>,
) -> ditto_engine::Result<(T, CommitTicket)> {
    let mut tries = 0;
    loop {
        let mut txn = begin(sh, worker);
        match body(&mut txn).and_then(|made| Ok((made, commit_counted(sh, txn)?))) {
            Ok(done) => {
                sh.stats.txn_commits.fetch_add(1, Ordering::Relaxed);
                return Ok(done);
            }
            Err(e) if e.is_retryable() && tries < RETRIES_MAX => {
                sh.stats.txn_conflicts.fetch_add(1, Ordering::Relaxed);
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Commits a transaction of data commands and moves the key counts by what it did.
///
/// A write is refused its acknowledgement (`Error::NotAcknowledged`) where the write gate
/// closed by the time it committed (`WriteGate::lapsed`): the gate was open when its
/// command was checked, and the thread was held up (descheduled, stopped) until after a
/// cluster primary's lease ran out, when a new primary may have begun taking writes.
fn commit_counted(sh: &Shared, txn: Transaction<'_>) -> ditto_engine::Result<CommitTicket> {
    let delta = KeyCounts::delta(&sh.ks, &txn);
    let wrote = txn.has_writes();
    let ticket = txn.commit_async()?;
    sh.key_counts.apply(&delta);
    if wrote && sh.write_gate.lapsed() {
        return Err(Error::NotAcknowledged(LEASE_RAN_OUT.into()));
    }
    Ok(ticket)
}

pub fn engine_error(e: &Error) -> Reply {
    match e {
        Error::Conflict(_) => Reply::err(format!("ERR {e} (gave up after {RETRIES_MAX} retries)")),
        Error::TooLarge { .. } => Reply::err(format!("ERR {}", too_large_text(e))),
        other => Reply::err(format!("ERR {other}")),
    }
}

/// A write refused for a size (`Error::TooLarge`), in the client's terms: a string's or a
/// key's length as the client sent it, not the engine's row, which holds a database or
/// type byte more (before 2026-12-06 a SET of a 65,536-byte key said "key is 65537 bytes,
/// over the limit of 65536", and an HSET's long field named neither; a review).
fn too_large_text(e: &Error) -> String {
    match e {
        // Redis's words for its own limit (`proto-max-bulk-len`), with ditto's.
        Error::TooLarge { what: "string", max, .. } => {
            format!("string exceeds maximum allowed size ({max} bytes in ditto)")
        }
        // A key's row is its database byte and the key; a hash field's, the database
        // byte, the key's length (4 bytes), the key and the field.
        Error::TooLarge { what: "key", max, .. } => {
            format!("key too long: a key may take {} bytes, a hash's key and field {} together", max - 1, max - 5)
        }
        e => e.to_string(),
    }
}

/// The commands ditto has of Redis's `@connection` ACL category.
const CONNECTION_COMMANDS: &[&str] =
    &["PING", "ECHO", "HELLO", "AUTH", "SELECT", "QUIT", "RESET", "COMMAND", "CLIENT", "WAIT"];

fn command_info(a: &[Bytes]) -> Reply {
    let entry = |s: &Spec| {
        let mut flags = vec![Reply::Simple(if s.write { "write" } else { "readonly" })];
        if s.kind == Kind::Conn {
            flags = vec![Reply::Simple("fast")];
        }
        Reply::Array(vec![
            Reply::bulk(s.lower_name()),
            Reply::Int(s.arity as i64),
            Reply::Set(flags),
            Reply::Int(s.keys.0 as i64),
            Reply::Int(s.keys.1 as i64),
            Reply::Int(s.keys.2 as i64),
            Reply::Set(Vec::new()),
            Reply::Set(Vec::new()),
            Reply::Set(Vec::new()),
            Reply::Set(Vec::new()),
        ])
    };
    let Some(sub) = a.first() else { return Reply::Array(SPECS.iter().map(entry).collect()) };
    let upper = |b: &Bytes| b.to_ascii_uppercase();
    // (Names and arity were checked by `commands::subcommand_refusal`.)
    match upper(sub).as_slice() {
        b"COUNT" => Reply::Int(SPECS.len() as i64),
        b"LIST" => match &a[1..] {
            [] => Reply::Array(SPECS.iter().map(|s| Reply::bulk(s.lower_name())).collect()),
            // As Redis: by a glob on the name (in any case), by ACL category (ditto's
            // commands fall into `read`, `write` and `connection` only), by module (none).
            [f, by, arg] if upper(f) == b"FILTERBY" => {
                let (by, arg) = (upper(by), arg.to_ascii_lowercase());
                let keep = |s: &&Spec| match (by.as_slice(), arg.as_slice()) {
                    (b"PATTERN", pattern) => glob_match(pattern, s.lower_name().as_bytes()),
                    (b"ACLCAT", b"read") => {
                        !s.write && (s.kind != Kind::Conn || matches!(s.name, "DBSIZE" | "SCAN" | "KEYS"))
                    }
                    (b"ACLCAT", b"write") => s.write,
                    (b"ACLCAT", b"connection") => CONNECTION_COMMANDS.contains(&s.name),
                    // Another category, or a module: none.
                    _ => false,
                };
                match by.as_slice() {
                    b"PATTERN" | b"ACLCAT" | b"MODULE" => {
                        Reply::Array(SPECS.iter().filter(keep).map(|s| Reply::bulk(s.lower_name())).collect())
                    }
                    _ => Reply::err(commands::SYNTAX),
                }
            }
            _ => Reply::err(commands::SYNTAX),
        },
        // With no names, every command (Redis 7).
        b"INFO" if a.len() == 1 => Reply::Array(SPECS.iter().map(entry).collect()),
        b"INFO" => Reply::Array(a[1..].iter().map(|n| lookup(n).map_or(Reply::Nil, entry)).collect()),
        // Documentation is not served; clients that probe for it (redis-cli) do without.
        b"DOCS" => Reply::Map(Vec::new()),
        b"HELP" => Reply::Array(
            [
                "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "(no subcommand)",
                "    Return details about all commands.",
                "COUNT",
                "    Return the total number of commands in this server.",
                "LIST [FILTERBY (MODULE <module-name>|ACLCAT <category>|PATTERN <pattern>)]",
                "    Return a list of all commands in this server.",
                "INFO [<command-name> ...]",
                "    Return details about the given commands, or all of them.",
                "DOCS [<command-name> ...]",
                "    Answered with no documentation in ditto.",
                "HELP",
                "    Print this help.",
            ]
            .into_iter()
            .map(Reply::Simple)
            .collect(),
        ),
        other => unreachable!("COMMAND {other:?} passed subcommand_refusal"),
    }
}

/// DBSIZE inside EXEC: a walk of the database in the EXEC's transaction, exact and
/// serialized with it (outside, `conn_command` answers from `KeyCounts` in O(1)).
fn dbsize(db: u8, sh: &Shared, at: &mut Reader) -> Outcome {
    let mut n = 0i64;
    let (lo, hi) = db_range(db);
    let res = at.for_each(
        sh.ks.keys,
        std::ops::Bound::Included(&lo[..]),
        hi.as_deref().map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
        &mut |_, _| {
            n += 1;
            true
        },
    );
    match res {
        Ok(()) => Outcome::after(Reply::Int(n), at.wait()),
        Err(e) => Outcome::now(engine_error(&e)),
    }
}

/// The longest SCAN or KEYS waits for its snapshot to reach what it must hold
/// (`fresh_snapshot`): a commit's install takes microseconds once it is in the log.
const SNAPSHOT_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// A snapshot for SCAN and KEYS that holds every commit whose reply this server has sent
/// (`Shared::acked`) and this connection's own last commit (`mine`, whose reply may still
/// wait in the pipeline). The newest consistent snapshot (`visible_ts`) can lie below
/// such a commit for a moment: an older commit, in the log already, may still be
/// installing, and the snapshot must not pass it. Taken at once, KEYS could then miss a
/// key that a client had been told was written (found by a review, 2026-12-05). So it
/// waits for that install, spinning, then yielding; past `SNAPSHOT_WAIT_MAX`, an error.
fn fresh_snapshot(sh: &Shared, mine: Ts) -> Result<ditto_engine::ReadTxn<'_>, Reply> {
    let want = Ts(sh.acked.load(Ordering::Acquire)).max(mine);
    let clock = sh.db.clock();
    let mut spins = 0u32;
    let mut since = None;
    while clock.visible_ts() < want {
        spins += 1;
        if spins < 128 {
            std::hint::spin_loop();
            continue;
        }
        let t0 = *since.get_or_insert_with(Instant::now);
        if t0.elapsed() > SNAPSHOT_WAIT_MAX {
            return Err(Reply::err(format!(
                "ERR this read's snapshot did not reach ts {} (a commit below it has not finished installing for {} ms)",
                want.0,
                SNAPSHOT_WAIT_MAX.as_millis()
            )));
        }
        std::thread::yield_now();
    }
    Ok(sh.db.read())
}

/// Where DBSIZE, KEYS and SCAN read: a snapshot of their own, or inside EXEC the EXEC's
/// transaction, so that they see its earlier writes and are serialized with it.
pub(crate) enum Reader<'a, 't> {
    Snapshot(ditto_engine::ReadTxn<'a>),
    Txn(&'a mut Transaction<'t>),
}

impl Reader<'_, '_> {
    fn for_each(
        &mut self,
        table: ditto_engine::TableId,
        lo: std::ops::Bound<&[u8]>,
        hi: std::ops::Bound<&[u8]>,
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), Error> {
        match self {
            Reader::Snapshot(snap) => snap.for_each(table, lo, hi, f),
            Reader::Txn(txn) => txn.for_each(table, lo, hi, f),
        }
    }

    /// What a reply read here waits for: the snapshot's commits to be durable; inside
    /// EXEC the EXEC's own commit, which it waits for anyway.
    fn wait(&self) -> Ts {
        match self {
            Reader::Snapshot(snap) => snap.ts(),
            Reader::Txn(_) => Ts(0),
        }
    }
}

/// Why a client name is refused, as Redis says it (CLIENT SETNAME and HELLO's SETNAME).
fn client_name_refusal(name: &[u8]) -> Option<Reply> {
    name.iter()
        .any(|&b| b <= b' ' || b > b'~')
        .then(|| Reply::err("ERR Client names cannot contain spaces, newlines or special characters."))
}

fn db_range(db: u8) -> (Vec<u8>, Option<Vec<u8>>) {
    (vec![db], prefix_end(&[db]))
}

/// KEYS pattern: every key of the database that matches, at one snapshot (Redis walks the
/// whole keyspace for it too; SCAN is the way that does not). A reply that would pass
/// `max_output_bytes` is refused as soon as it does, so a large keyspace is never copied
/// whole into a reply the server would not send.
fn keys(db: u8, pattern: &[u8], sh: &Shared, at: &mut Reader) -> Outcome {
    let (lo, hi) = db_range(db);
    let mut keys = Vec::new();
    // What the keys take encoded: `$<len>\r\n<key>\r\n`, at most 24 bytes besides the key.
    let mut bytes = 0usize;
    let res = at.for_each(
        sh.ks.keys,
        std::ops::Bound::Included(&lo[..]),
        hi.as_deref().map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
        &mut |row, _| {
            if glob_match(pattern, &row[1..]) {
                bytes += row.len() - 1 + 24;
                keys.push(Reply::Bulk(Bytes::copy_from_slice(&row[1..])));
            }
            bytes <= sh.max_output_bytes
        },
    );
    match res {
        Ok(()) if bytes > sh.max_output_bytes => Outcome::now(Reply::err(format!(
            "ERR the keys matching would pass max_output_bytes ({}); use SCAN",
            sh.max_output_bytes
        ))),
        Ok(()) => Outcome::after(Reply::Array(keys), at.wait()),
        Err(e) => Outcome::now(engine_error(&e)),
    }
}

/// SCAN cursor [MATCH pattern] [COUNT n] [TYPE type], at a fresh snapshot per call. Keys
/// present for a whole scan are returned once; keys added or removed meanwhile may or may
/// not be (Redis's guarantee).
fn scan(db: u8, a: &[Bytes], sh: &Shared, at: &mut Reader) -> Outcome {
    let Some(cursor) = std::str::from_utf8(&a[0]).ok().and_then(|s| s.parse::<u64>().ok()) else {
        return Outcome::now(Reply::err("ERR invalid cursor"));
    };
    let (mut pattern, mut count, mut kind) = (None, 10usize, None);
    let mut opts = a[1..].chunks(2);
    for opt in opts.by_ref() {
        if opt.len() != 2 {
            return Outcome::now(Reply::err(commands::SYNTAX));
        }
        match opt[0].to_ascii_uppercase().as_slice() {
            b"MATCH" => pattern = Some(opt[1].clone()),
            b"COUNT" => match parse_int(&opt[1]) {
                Some(n) if n >= 1 => count = (n as usize).min(1 << 20),
                Some(_) => return Outcome::now(Reply::err(commands::SYNTAX)),
                None => return Outcome::now(Reply::err(commands::NOT_INTEGER)),
            },
            b"TYPE" => kind = Some(opt[1].to_ascii_lowercase()),
            _ => return Outcome::now(Reply::err(commands::SYNTAX)),
        }
    }
    let (lo_row, hi) = db_range(db);
    let lo = if cursor == 0 {
        std::ops::Bound::Included(lo_row)
    } else {
        match sh.cursors.lock().get(cursor) {
            Some((cdb, after)) if *cdb == db => std::ops::Bound::Excluded(Keyspace::key_row(db, after)),
            _ => return Outcome::now(Reply::err("ERR invalid cursor")),
        }
    };
    let mut keys = Vec::new();
    let mut examined = 0;
    let mut last: Option<Bytes> = None;
    // The reply stops early (with a cursor) once its keys take half of
    // `max_output_bytes`, as encoded: a large COUNT over large keys is answered in parts.
    let mut bytes = 0usize;
    let res = at.for_each(
        sh.ks.keys,
        lo.as_ref().map(|v| &v[..]),
        hi.as_deref().map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
        &mut |row, value| {
            let key = &row[1..];
            examined += 1;
            let type_ok = kind.as_ref().is_none_or(|k| type_name_of(value).as_bytes() == &k[..]);
            if type_ok && pattern.as_ref().is_none_or(|p| glob_match(p, key)) {
                keys.push(Reply::Bulk(Bytes::copy_from_slice(key)));
                bytes += key.len() + 24;
            }
            if examined >= count || bytes >= sh.max_output_bytes / 2 {
                last = Some(Bytes::copy_from_slice(key));
                return false;
            }
            true
        },
    );
    if let Err(e) = res {
        return Outcome::now(engine_error(&e));
    }
    let next = match last {
        Some(k) => sh.cursors.lock().issue(db, k),
        None => 0,
    };
    Outcome::after(Reply::Array(vec![Reply::bulk(next.to_string()), Reply::Array(keys)]), at.wait())
}

/// CONFIG GET pattern...: the parameters in `Shared::config_view` whose names match a glob,
/// as a map. Nothing can be changed at run time: the config file is the one place.
fn config(a: &[Bytes], sh: &Shared) -> Reply {
    // (Refused before it runs, `commands::ditto_refusal`; kept for any other caller.)
    if !a[0].eq_ignore_ascii_case(b"GET") {
        return crate::commands::config_unsupported(&a[0]);
    }
    let pairs = sh
        .config_view
        .iter()
        .filter(|(name, _)| a[1..].iter().any(|p| glob_match(&p.to_ascii_lowercase(), name.as_bytes())))
        .map(|(n, v)| (Reply::bulk(n.clone()), Reply::bulk(v.clone())))
        .collect();
    Reply::Map(pairs)
}

/// ROLE, as Redis answers it: `master`, its offset (the released timestamp) and its backups
/// (host, port, received timestamp); or `slave`, the primary's host and port, the link's
/// state and the read view.
fn role(sh: &Shared) -> Reply {
    use crate::replinfo::host_port;
    match &sh.replication {
        Replication::Standalone => Reply::Array(vec![Reply::bulk("master"), Reply::Int(0), Reply::Array(Vec::new())]),
        Replication::Primary { primary, .. } => {
            let backups = primary
                .backups()
                .into_iter()
                .map(|b| {
                    let (h, p) = host_port(&b.addr);
                    Reply::Array(vec![
                        Reply::bulk(h.to_string()),
                        Reply::bulk(p.to_string()),
                        Reply::bulk(b.received.0.to_string()),
                    ])
                })
                .collect();
            Reply::Array(vec![Reply::bulk("master"), Reply::Int(primary.released().0 as i64), Reply::Array(backups)])
        }
        Replication::Backup { state, primary } => {
            let (h, p) = host_port(primary);
            Reply::Array(vec![
                Reply::bulk("slave"),
                Reply::bulk(h.to_string()),
                Reply::Int(p.parse().unwrap_or(0)),
                Reply::bulk(if state.link_up() { "connected" } else { "connect" }),
                Reply::Int(state.visible.load(std::sync::atomic::Ordering::Acquire) as i64),
            ])
        }
    }
}

/// Why a cluster primary's write gate refuses writes once its deadline passed
/// (`WriteGate::open_until`).
pub const LEASE_RAN_OUT: &str = "this node's lease as the cluster's primary ran out: it has not heard a quorum of its cluster within the failure timeout, and takes no writes (the others may have failed it over)";

/// This machine's `CLOCK_MONOTONIC` in milliseconds: the clock a cluster node's supervisor
/// and its server share (Rust's `Instant` reads it on Linux), so that a deadline one
/// reckons the other can check (`WriteGate::open_until`).
pub fn monotonic_ms() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

/// `when` on `monotonic_ms`'s clock, rounded down (never later than `when`).
pub fn monotonic_ms_of(when: std::time::Instant) -> u64 {
    // (The clock read first: `now` is then no earlier, and the sum no later than `when`.)
    let now_ms = monotonic_ms();
    let now = std::time::Instant::now();
    match when.checked_duration_since(now) {
        Some(ahead) => now_ms + ahead.as_millis() as u64,
        None => now_ms.saturating_sub(now.duration_since(when).as_millis() as u64 + 1),
    }
}

/// Writes refused for now, with the reason; open by default. Checked before every write
/// command (one atomic load while open, and a read of the clock where the gate has a
/// deadline). A cluster node's supervisor holds it, and also tells the server what the
/// cluster looks like (`INFO cluster`).
#[derive(Default, Debug)]
pub struct WriteGate {
    closed: std::sync::atomic::AtomicBool,
    /// Open only until this `monotonic_ms` (0: no deadline): a cluster primary's lease, its
    /// quorum contact, as its supervisor last reckoned it (`open_until`). The gate closes
    /// by itself when it passes, however late the supervisor is to close it (a supervisor
    /// stopped by SIGSTOP, or stalled, left it open for as long as that lasted).
    until_ms: std::sync::atomic::AtomicU64,
    /// Why writes are refused: the supervisor's reason (no quorum contact, a new primary
    /// not yet heard), and a switchover's drain. Either closes the gate.
    why: Mutex<(Option<String>, Option<String>)>,
    /// The node a switchover's drain hands the primary role to (its clients' address):
    /// SENTINEL names it from the drain on, so that clients that ask this node go there
    /// and take writes as soon as it is promoted, rather than back here. With it, the
    /// drain's refusal as a client over TLS is told it (naming the target's TLS address).
    handing_to: Mutex<Option<(ClientAddr, String)>>,
    /// One more at each drain (`drain_to`): a drain that ends by itself (`end_drain`)
    /// clears only its own, not one begun since.
    drain_gen: std::sync::atomic::AtomicU64,
    cluster: Mutex<Vec<(String, String)>>,
    /// Asked to stop (the supervisor's fence): honoured once the server serves, so that a
    /// backup that has acknowledged anything drains it first (`Backup::stop`).
    stop: tokio::sync::Notify,
    stop_asked: Arc<std::sync::atomic::AtomicBool>,
    /// The backups a primary's commit quorum is to count, with the membership
    /// configuration (the cluster's members changed), and what applies it.
    backups: Mutex<Backups>,
    /// Role changes asked for and not yet taken up (`RoleRequest`).
    roles: Mutex<std::collections::VecDeque<RoleRequest>>,
    /// Switchovers asked of the supervisor (`ask_switchover`), counted.
    switchovers_asked: std::sync::atomic::AtomicU64,
    role_asked: tokio::sync::Notify,
}

/// What a cluster node's supervisor asks its running server to do about its role
/// (docs/cluster.md, "In-place promotion and following").
#[derive(Clone, Debug, PartialEq)]
pub enum RoleRequest {
    /// A backup's fence that keeps it serving reads: it stops following its primary and
    /// makes what it received durable (`Backup::fence`), then prints `ditto server fenced`
    /// (or `ditto server fence failed: WHY`).
    Fence,
    /// A fenced backup becomes the primary of `run` in place (`Backup::cut_at`): its
    /// engine is kept; clients' connections are closed and the server serves again as
    /// the primary, taking backups on `repl_port` and counting `backups` of them.
    Promote { run: crate::config::ClusterRun, repl_port: u16, backups: usize },
    /// A fenced backup follows the next epoch's primary (its replication address
    /// `primary`, its clients' `primary_addr`) in place, cut at the failover's point
    /// `upto`: its engine is kept, its clients' connections are closed.
    Follow { primary: String, primary_addr: ClientAddr, upto: u64 },
    /// A primary hands its role over (a switchover): it refuses writes from now on and
    /// waits, at most `within`, until nothing is being committed, its log holds every
    /// commit durably, and the backup whose node is `target` (its client address) has
    /// acknowledged all of it durably; then prints `ditto server drained at ts T`, or
    /// `ditto server drain failed: WHY` and takes writes again.
    Drain { target: ClientAddr, within: std::time::Duration },
    /// A learner's backup is counted from now on (`Backup::count_in_quorum`): prints
    /// `ditto server counts in the quorum`.
    CountInQuorum,
}

/// The count of backups last set (with its configuration), and the hook that applies it.
#[derive(Default, Debug)]
struct Backups(Option<(usize, u64, Option<Vec<String>>)>, Option<BackupsHook>);

/// Applies a new count of backups to a primary (`Primary::set_backups_expected`), and the
/// members' client addresses whose backups it counts (`Primary::set_counted_nodes`).
#[allow(clippy::type_complexity)]
pub struct BackupsHook(pub Box<dyn Fn(usize, u64, Option<&[String]>) + Send + Sync>);

impl std::fmt::Debug for BackupsHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackupsHook")
    }
}

impl WriteGate {
    /// The cluster's membership is now configuration `config`, with `n` backups: a
    /// primary's commit quorum counts them (at once if the server serves, else once it
    /// does).
    /// `nodes`: the members' client addresses (the others'), whose backups alone count.
    pub fn set_backups(&self, n: usize, config: u64, nodes: Option<Vec<String>>) {
        let mut b = self.backups.lock();
        if let Some(hook) = &b.1 {
            (hook.0)(n, config, nodes.as_deref());
        }
        b.0 = Some((n, config, nodes));
    }

    /// Installed by a primary: applies the count now (if one was set) and at every change.
    pub fn on_backups(&self, hook: BackupsHook) {
        let mut b = self.backups.lock();
        if let Some((n, c, nodes)) = &b.0 {
            (hook.0)(*n, *c, nodes.as_deref());
        }
        b.1 = Some(hook);
    }

    /// Asks the server to stop as on SIGTERM; a request made before it serves waits for it,
    /// except a backup's that has not joined its primary yet (`stop_flag`).
    pub fn request_stop(&self) {
        self.stop_asked.store(true, std::sync::atomic::Ordering::Release);
        self.stop.notify_one();
    }

    /// Set once a stop was requested: a backup still joining its primary (it acknowledged
    /// nothing yet) gives up at once (`ditto_replication::BackupOptions::stop`), rather than
    /// after retrying for a minute a primary that may never come up.
    pub fn stop_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.stop_asked)
    }

    /// Completes once a stop was requested.
    pub async fn stop_requested(&self) {
        self.stop.notified().await
    }

    /// Asks the server for a role change (`RoleRequest`); one asked before it serves waits
    /// for it.
    pub fn request_role(&self, r: RoleRequest) {
        self.roles.lock().push_back(r);
        self.role_asked.notify_one();
    }

    /// The next role change asked for (waits for one).
    pub async fn role_requested(&self) -> RoleRequest {
        loop {
            let asked = self.role_asked.notified();
            if let Some(r) = self.roles.lock().pop_front() {
                return r;
            }
            asked.await;
        }
    }

    /// What `INFO cluster` shows (empty: not a cluster node).
    pub fn set_cluster_info(&self, fields: Vec<(String, String)>) {
        *self.cluster.lock() = fields;
    }

    pub fn cluster_info(&self) -> Vec<(String, String)> {
        self.cluster.lock().clone()
    }

    /// Refuse writes with `why` (`Some`), or take them again (`None`, with no deadline)
    /// unless a drain refuses them.
    pub fn set(&self, why: Option<String>) {
        let mut w = self.why.lock();
        w.0 = why;
        let closed = w.0.is_some() || w.1.is_some();
        // Closed before the deadline goes (a gate that closed itself at its deadline is never
        // seen open in between), and the deadline gone before it opens.
        if closed {
            self.closed.store(true, std::sync::atomic::Ordering::Release);
        }
        self.until_ms.store(0, std::sync::atomic::Ordering::Release);
        self.closed.store(closed, std::sync::atomic::Ordering::Release);
    }

    /// Whether a cluster primary's writes are over: its deadline (`open_until`) has passed,
    /// or its supervisor closed the gate (a drain alone does not count). A write that
    /// committed once this holds is not acknowledged (`commit_counted`). Two atomic loads
    /// and, with a deadline, a read of the clock.
    pub fn lapsed(&self) -> bool {
        self.past_deadline() || (self.closed.load(std::sync::atomic::Ordering::Acquire) && self.why.lock().0.is_some())
    }

    /// Whether the gate has a deadline (`open_until`) and it has passed.
    fn past_deadline(&self) -> bool {
        let until = self.until_ms.load(std::sync::atomic::Ordering::Acquire);
        until != 0 && monotonic_ms() >= until
    }

    /// Take writes (unless a drain refuses them) until `monotonic_ms()` reaches `until_ms`,
    /// then refuse them by itself (`LEASE_RAN_OUT`) until told again.
    pub fn open_until(&self, until_ms: u64) {
        let mut w = self.why.lock();
        self.until_ms.store(until_ms.max(1), std::sync::atomic::Ordering::Release);
        w.0 = None;
        self.closed.store(w.1.is_some(), std::sync::atomic::Ordering::Release);
    }

    /// Ends any switchover's drain (it was given up, or a new role starts), whatever the
    /// supervisor's own reason says.
    pub fn end_drains(&self) {
        let mut w = self.why.lock();
        self.clear_drain(&mut w);
    }

    /// The drain's part of the gate cleared, under the reasons' lock.
    fn clear_drain(&self, w: &mut (Option<String>, Option<String>)) {
        *self.handing_to.lock() = None;
        w.1 = None;
        self.closed.store(w.0.is_some(), std::sync::atomic::Ordering::Release);
    }

    /// A switchover's drain to `target` (its clients' address) refuses writes with
    /// `why(the target's address)`, of the client's kind (`ClientAddr::for_client`);
    /// SENTINEL names `target` as the primary until the drain ends (`end_drains`, which a
    /// new role does, or `end_drain`). Returns the drain's number, for `end_drain`.
    pub fn drain_to(&self, target: &ClientAddr, why: impl Fn(&str) -> String) -> u64 {
        let mut w = self.why.lock();
        let gen = self.drain_gen.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        *self.handing_to.lock() = Some((target.clone(), why(target.for_client(true))));
        w.1 = Some(why(target.for_client(false)));
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        gen
    }

    /// Ends the drain numbered `gen` (it failed or timed out), unless another began since:
    /// a drain left over from a switchover given up (its thread still waiting) would
    /// otherwise open the writes of a later one, which then said it was drained with its
    /// gate open.
    pub fn end_drain(&self, gen: u64) {
        let mut w = self.why.lock();
        if self.drain_gen.load(std::sync::atomic::Ordering::Acquire) == gen {
            self.clear_drain(&mut w);
        }
    }

    /// The node a switchover's drain hands the primary role to (`drain_to`).
    pub fn handing_to(&self) -> Option<ClientAddr> {
        self.handing_to.lock().as_ref().map(|(t, _)| t.clone())
    }

    /// Whether a switchover's drain refuses writes now (`drain_to`).
    pub fn draining(&self) -> bool {
        self.why.lock().1.is_some()
    }

    pub fn refusal(&self) -> Option<String> {
        if !self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return self.past_deadline().then(|| LEASE_RAN_OUT.to_string());
        }
        let w = self.why.lock();
        w.1.clone().or_else(|| w.0.clone())
    }

    /// `refusal` as a client over TLS (`tls`) or plaintext is told it: a switchover's
    /// drain names the node it hands the role to by the address of the client's kind.
    pub fn refusal_for(&self, tls: bool) -> Option<String> {
        let why = self.refusal()?;
        if tls && self.draining() {
            if let Some((_, over_tls)) = self.handing_to.lock().as_ref() {
                return Some(over_tls.clone());
            }
        }
        Some(why)
    }

    /// `SENTINEL FAILOVER ditto`: asks this node's supervisor (a line on standard output,
    /// `ditto server asks for a switchover`) to propose a switchover; refused, with Redis
    /// Sentinel's error codes, on a server that is not a cluster node or while a failover
    /// or a switchover is under way.
    pub fn ask_switchover(&self) -> Result<(), String> {
        let info = self.cluster_info();
        let field = |k: &str| info.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        if info.is_empty() {
            return Err(
                "ERR this server is not a cluster node (ditto server --node-id): there is nothing to fail over to"
                    .into(),
            );
        }
        if field("cluster_phase") != Some("serving") || field("cluster_switchover").is_some_and(|v| v != "none") {
            return Err("INPROG Failover already in progress".into());
        }
        crate::say!("ditto server asks for a switchover");
        self.switchovers_asked.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// How many switchovers this server has asked its supervisor for.
    pub fn switchovers_asked(&self) -> u64 {
        self.switchovers_asked.load(Ordering::Relaxed)
    }
}

/// The one service name SENTINEL answers for.
pub const SENTINEL_NAME: &str = "ditto";

/// Enough of Redis Sentinel's commands for unchanged clients to find the primary (redis-py's
/// `Sentinel(...).master_for("ditto")`, `SENTINEL get-master-addr-by-name ditto`): every
/// node answers for the service `ditto` with the primary it knows (docs/cluster.md).
fn sentinel(a: &[Bytes], sh: &Shared, tls: bool) -> Reply {
    let sub = a[0].to_ascii_uppercase();
    let named = |i: usize| a.get(i).is_some_and(|n| n.as_ref() == SENTINEL_NAME.as_bytes());
    // A drained primary names the node it hands its role to (`WriteGate::drain_to`).
    let handing_to = sh.write_gate.handing_to();
    let addr = handing_to.as_ref().or(sh.primary_addr.as_ref()).map(|a| crate::replinfo::host_port(a.for_client(tls)));
    let state = |(h, p): (&str, &str)| {
        let kv = [
            ("name", SENTINEL_NAME.to_string()),
            ("ip", h.to_string()),
            ("port", p.to_string()),
            ("runid", String::new()),
            ("flags", "master".to_string()),
            ("num-slaves", "0".to_string()),
            ("num-other-sentinels", "0".to_string()),
            ("quorum", "1".to_string()),
        ];
        // Sentinel's own reply: a map in RESP3, a flat array in RESP2.
        Reply::Map(kv.into_iter().map(|(k, v)| (Reply::bulk(k), Reply::bulk(v))).collect())
    };
    match sub.as_slice() {
        b"GET-MASTER-ADDR-BY-NAME" if a.len() == 2 => match (named(1), addr) {
            (true, Some((h, p))) => Reply::Array(vec![Reply::bulk(h.to_string()), Reply::bulk(p.to_string())]),
            _ => Reply::NilArray,
        },
        b"MASTERS" if a.len() == 1 => Reply::Array(addr.map(state).into_iter().collect()),
        b"MASTER" if a.len() == 2 => match (named(1), addr) {
            (true, Some(hp)) => state(hp),
            _ => Reply::err("ERR No such master with that name"),
        },
        b"SLAVES" | b"REPLICAS" | b"SENTINELS" if a.len() == 2 => Reply::Array(Vec::new()),
        // A switchover through the cluster's control plane (docs/cluster.md): +OK once it
        // is asked for, as Sentinel answers once its failover starts.
        b"FAILOVER" if a.len() == 2 => match named(1) {
            true => match sh.write_gate.ask_switchover() {
                Ok(()) => Reply::Ok,
                Err(e) => Reply::err(e),
            },
            false => Reply::err("ERR No such master with that name"),
        },
        _ => Reply::err(format!(
            "ERR unknown or malformed SENTINEL subcommand '{}' (this node answers get-master-addr-by-name, masters, master, replicas, sentinels, failover)",
            commands::one_line(&String::from_utf8_lossy(&a[0][..a[0].len().min(64)]))
        )),
    }
}

/// How many backups hold every commit up to `ts` (received; none on a standalone node).
/// A write's refusal on a backup (Redis's READONLY), naming the primary (its TLS address
/// to a client over TLS, where it has one).
fn read_only_refusal(sh: &Shared, tls: bool) -> String {
    match (&sh.replication, &sh.primary_addr) {
        (Replication::Backup { primary, .. }, Some(addr)) => format!(
            "READONLY You can't write against a read only replica. The primary is at {} (replication address {primary})",
            addr.for_client(tls)
        ),
        (Replication::Backup { primary, .. }, None) => {
            format!("READONLY You can't write against a read only replica. The primary's replication address is {primary}")
        }
        _ => "READONLY You can't write against a read only replica.".to_string(),
    }
}

fn replicas_holding(sh: &Shared, ts: Ts) -> usize {
    match &sh.replication {
        // (A cluster's learner is no replica a failover counts on.)
        Replication::Primary { primary, .. } => primary.replicas_received(ts),
        _ => 0,
    }
}

/// The connection's state a queued command may change (SELECT, CLIENT SETNAME, HELLO,
/// AUTH), put back where an EXEC does not commit (`Session::exec_queued`).
#[derive(Clone)]
pub struct ConnState {
    db: u8,
    name: Option<Bytes>,
    proto: Proto,
    authed: bool,
}

/// An EXEC on a backup whose role changed while it ran (its server's answer, or its own
/// before it runs what acts outside the connection).
pub const EXEC_ROLE_CHANGED: &str = "LOADING this backup changed its role while the transaction ran; run it again";

/// A queued command whose effect lies outside the connection and cannot be undone:
/// `SENTINEL FAILOVER` (asks the cluster for a switchover) and `DITTO.FORGETBACKUP`
/// (records a backup as lost). Inside EXEC it runs only once the transaction has committed,
/// so an EXEC that answers nil or an error, or is retried after a conflict, runs it not at
/// all, or once (before 2026-12-05 each attempt ran it; found by a review).
fn acts_outside(spec: &Spec, args: &[Bytes]) -> bool {
    match spec.name {
        "DITTO.FORGETBACKUP" => true,
        "SENTINEL" => args.get(1).is_some_and(|s| s.eq_ignore_ascii_case(b"FAILOVER")),
        _ => false,
    }
}

/// `DITTO.FORGETBACKUP name`: a person says a backup the quorum counted is gone for good,
/// so that a primary whose restart waits for it (docs/replication.md, "A primary restarted
/// under a policy that counts backups") gives up what it alone held and waits for the
/// others (`Primary::declare_lost`). An error, changing nothing, anywhere else.
fn forget_backup(a: &[Bytes], sh: &Shared) -> Reply {
    let Replication::Primary { primary, .. } = &sh.replication else {
        return Reply::err("ERR DITTO.FORGETBACKUP is for a primary whose restart waits for its backups");
    };
    let name = String::from_utf8_lossy(&a[0]);
    match primary.declare_lost(&name) {
        Err(e) => Reply::err(format!("ERR {e}")),
        Ok(r) => {
            let rest: Vec<&str> = r.remaining().collect();
            let wait = match r.need() {
                0 => "waits for no other backup".to_string(),
                n => format!("waits for {n} of {}", rest.join(", ")),
            };
            Reply::SimpleOwned(format!(
                "OK backup {name} recorded as lost: commits it alone held are given up; the restart {wait}"
            ))
        }
    }
}

/// DITTO.WAITTS ts: answers once every commit up to `ts` is durable (so that data read
/// afterwards is at least that fresh). A timestamp this node has not reached is an error.
fn wait_ts(a: &[Bytes], sh: &Shared) -> Outcome {
    let Some(ts) = parse_int(&a[0]).filter(|&t| t >= 0) else { return Outcome::now(Reply::err(commands::NOT_INTEGER)) };
    let now = sh.db.clock().visible_ts();
    // A backup waits (bounded, `waitts_timeout_ms`) for its read view to get there.
    if ts as u64 > now.0 && !sh.read_only {
        return Outcome::now(Reply::err(format!("ERR timestamp {ts} is ahead of this node (at {})", now.0)));
    }
    Outcome::after(Reply::Ok, Ts(ts as u64))
}

/// Redis's glob: `*`, `?`, `[abc]`, `[^a-z]`, and `\` to escape.
pub fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    // Redis's `stringmatchlen` matches the empty string with the empty pattern alone, and
    // KEYS and SCAN take `*` by itself for every key without matching: so `*` and the
    // empty pattern match the empty key, `**` does not (it did here until 2026-12-05; a
    // review, then checked against Redis 7.0.15).
    if s.is_empty() {
        return pat.is_empty() || pat == b"*";
    }
    let (mut p, mut i) = (0, 0);
    // Backtracking point for the last `*`: (pattern index after it, string index).
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let step = match pat.get(p) {
            Some(b'*') => {
                star = Some((p + 1, i));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => class_match(pat, p, s[i]),
            Some(b'\\') if p + 1 < pat.len() => (pat[p + 1] == s[i]).then_some(p + 2),
            Some(&c) => (c == s[i]).then_some(p + 1),
            None => None,
        };
        match (step, star) {
            (Some(np), _) => {
                p = np;
                i += 1;
            }
            (None, Some((sp, si))) => {
                p = sp;
                i = si + 1;
                star = Some((sp, si + 1));
            }
            (None, None) => return false,
        }
    }
    pat[p.min(pat.len())..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class starting at `pat[p] == '['`; the index after the class.
fn class_match(pat: &[u8], p: usize, c: u8) -> Option<usize> {
    let mut j = p + 1;
    let negate = pat.get(j) == Some(&b'^');
    if negate {
        j += 1;
    }
    let mut hit = false;
    while j < pat.len() && pat[j] != b']' {
        if pat[j] == b'\\' && j + 1 < pat.len() {
            hit |= pat[j + 1] == c;
            j += 2;
        } else if j + 2 < pat.len() && pat[j + 1] == b'-' {
            // (Redis's `stringmatchlen`: a range's end may be `]`, which then ends no class:
            // `[a-]` is the range `]`..`a`, unterminated. Until 2026-12-02 it was `a` or `-`.)
            let (a, b) = (pat[j].min(pat[j + 2]), pat[j].max(pat[j + 2]));
            hit |= (a..=b).contains(&c);
            j += 3;
        } else {
            hit |= pat[j] == c;
            j += 1;
        }
    }
    // An unterminated class matches up to the pattern's end, as in Redis.
    let end = (j + 1).min(pat.len());
    (hit != negate).then_some(end)
}

fn info(a: &[Bytes], sh: &Shared) -> String {
    let wanted: Vec<String> = a.iter().map(|s| String::from_utf8_lossy(s).to_ascii_lowercase()).collect();
    let all = wanted.is_empty() || wanted.iter().any(|w| w == "all" || w == "everything" || w == "default");
    let want = |s: &str| all || wanted.iter().any(|w| w == s);
    let st = &sh.stats;
    let mut out = String::new();
    use std::fmt::Write;
    if want("server") {
        // (The threads of this process that asked for it, this node's and earlier roles'.)
        let slices = ditto_log::sched::slice_counts();
        let links = ditto_log::sched::link_slice_counts();
        let _ = write!(
            out,
            "# Server\r\nredis_version:{REDIS_COMPAT_VERSION}\r\nditto_version:{}\r\nredis_mode:standalone\r\n\
             process_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nworkers:{}\r\n\
             commit_thread_slice_us:{}\r\ncommit_thread_slice_given:{}\r\ncommit_thread_slice_ignored:{}\r\n\
             commit_thread_slice_refused:{}\r\nlink_thread_slice_us:{}\r\nlink_thread_slice_given:{}\r\n\
             link_thread_slice_ignored:{}\r\nlink_thread_slice_refused:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            sh.tcp_port,
            sh.started.elapsed().as_secs(),
            sh.db.workers(),
            ditto_log::sched::commit_thread_slice().map_or(0, |s| s.as_micros()),
            slices.given,
            slices.ignored,
            slices.refused,
            ditto_log::sched::link_thread_slice().map_or(0, |s| s.as_micros()),
            links.given,
            links.ignored,
            links.refused,
        );
    }
    if want("clients") {
        let _ = write!(out, "# Clients\r\nconnected_clients:{}\r\n\r\n", st.connected_clients.load(Ordering::Relaxed));
    }
    if want("memory") {
        let used = (sh.memory.used)();
        let rss = memory::resident_bytes().unwrap_or(0);
        let _ = write!(
            out,
            "# Memory\r\nused_memory:{used}\r\nused_memory_human:{}\r\nused_memory_rss:{rss}\r\n\
             used_memory_rss_human:{}\r\nmaxmemory:{}\r\nmaxmemory_human:{}\r\n\
             maxmemory_policy:noeviction\r\noom_rejections:{}\r\nrecord_ids_used:{}\r\nrecord_ids_allocated:{}\r\nrecord_ids_max:{}\r\n\r\n",
            memory::human(used),
            memory::human(rss),
            sh.memory.max,
            memory::human(sh.memory.max),
            sh.memory.rejections.load(Ordering::Relaxed),
            // Of the two tables, the one nearer its limit (table.rs: ids are reused after a
            // checkpoint).
            [sh.ks.keys, sh.ks.fields].iter().map(|&t| sh.db.record_ids_used(t).unwrap_or(0)).max().unwrap_or(0),
            [sh.ks.keys, sh.ks.fields].iter().map(|&t| sh.db.record_ids_allocated(t).unwrap_or(0)).max().unwrap_or(0),
            ditto_engine::RECORDS_PER_TABLE_MAX,
        );
    }
    if want("persistence") {
        let (durability, watermark, failure) = match &sh.log {
            Some(l) => (l.durability().name(), l.watermark().0, l.failure().map(|f| f.to_string())),
            None => ("none (in memory)".into(), 0, None),
        };
        let _ = write!(
            out,
            "# Persistence\r\ndurability:{durability}\r\ndurable_ts:{watermark}\r\nlog_failed:{}\r\n",
            failure.is_some() as u8
        );
        if let Some(l) = &sh.log {
            let s = &l.stats;
            let _ = write!(
                out,
                "log_bytes_written:{}\r\nlog_fsyncs:{}\r\nlog_fsync_us_total:{}\r\nlog_fsync_us_max:{}\r\n",
                s.bytes_written.load(Ordering::Relaxed),
                s.fsyncs.load(Ordering::Relaxed),
                s.fsync_ns_total.load(Ordering::Relaxed) / 1000,
                s.fsync_ns_max.load(Ordering::Relaxed) / 1000,
            );
        }
        out.push_str("\r\n");
    }
    if want("stats") {
        let _ = write!(
            out,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\
             rejected_connections:{}\r\ntotal_error_replies:{}\r\nprotocol_errors:{}\r\n\
             tls_handshake_failures:{}\r\ntxn_commits:{}\r\ntxn_conflicts:{}\r\n\r\n",
            st.connections_received.load(Ordering::Relaxed),
            st.commands.load(Ordering::Relaxed),
            st.rejected_connections.load(Ordering::Relaxed),
            st.errors.load(Ordering::Relaxed),
            st.protocol_errors.load(Ordering::Relaxed),
            st.tls_handshake_failures.load(Ordering::Relaxed),
            st.txn_commits.load(Ordering::Relaxed),
            st.txn_conflicts.load(Ordering::Relaxed),
        );
    }
    if want("replication") {
        out.push_str(&crate::replinfo::section(sh));
    }
    if want("cluster") {
        // Redis's section name and its first field; the rest is the supervisor's view
        // (docs/cluster.md): epoch, primary, Raft leader and term, the failovers.
        let fields = sh.write_gate.cluster_info();
        let _ = write!(out, "# Cluster\r\ncluster_enabled:{}\r\n", u8::from(!fields.is_empty()));
        for (k, v) in fields {
            let _ = write!(out, "{k}:{}\r\n", v.replace(['\r', '\n'], " "));
        }
        out.push_str("\r\n");
    }
    // Not part of the default sections, as in Redis: INFO commandstats (or all, everything).
    if wanted.iter().any(|w| matches!(w.as_str(), "commandstats" | "all" | "everything")) {
        out.push_str("# Commandstats\r\n");
        for (i, spec) in SPECS.iter().enumerate() {
            let [calls, nanos, rejected, failed] = st.command_totals(i);
            let usec = nanos / 1000;
            if calls + rejected == 0 {
                continue;
            }
            let _ = write!(
                out,
                "cmdstat_{}:calls={calls},usec={usec},usec_per_call={:.2},rejected_calls={rejected},failed_calls={failed}\r\n",
                spec.name.to_ascii_lowercase(),
                if calls == 0 { 0.0 } else { nanos as f64 / 1000.0 / calls as f64 },
            );
        }
        out.push_str("\r\n");
    }
    // A backup whose reads are held counts no keys (what DBSIZE is refused for).
    if want("keyspace") && !reads_held(sh) {
        out.push_str("# Keyspace\r\n");
        // (Counted as of the newest commit: on a primary the counts move at the commit, so
        // they may include one not yet released. DBSIZE waits for those; INFO answers at
        // once, as an operator's INFO must while a release stalls.)
        // (Every database's count at one point, not each at its own: a transaction
        // across databases replayed between two reads showed in one and not the other.)
        let counts = sh.key_counts.values(sh.db.clock().now());
        for (db, &n) in counts.iter().enumerate().take(DATABASES) {
            if n > 0 {
                let _ = write!(out, "db{db}:keys={n},expires=0,avg_ttl=0\r\n");
            }
        }
        out.push_str("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ditto_engine::{Options, WorkerId};

    fn setup() -> (Shared, Worker) {
        let db = Database::new(Options { workers: 1 });
        let sh = Shared::new(Arc::clone(&db), None, Some("sesame".into()), 0).unwrap();
        let w = db.worker(WorkerId(0)).unwrap();
        (sh, w)
    }

    fn cmd(s: &mut Session, sh: &Shared, w: &mut Worker, line: &str) -> Reply {
        let args = line.split(' ').map(|a| Bytes::copy_from_slice(a.as_bytes())).collect();
        s.handle(args, sh, w).reply
    }

    /// A HELLO queued in MULTI: each of the EXEC's replies is written in the protocol in
    /// force when it ran, HELLO's own in the one it chose, as Redis 7.0.15 writes them
    /// (its bytes for these queues, HELLO's map aside, which names the server:
    /// `*3 $-1 %7 ... _` from RESP2, and `*3 _ *14 ... $-1` from RESP3). Before
    /// 2026-12-06 all were written in the protocol in force at the end.
    #[test]
    fn an_exec_writes_each_reply_in_the_protocol_in_force_when_it_ran() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        assert_eq!(cmd(&mut s, &sh, &mut w, "AUTH sesame"), Reply::Ok);
        cmd(&mut s, &sh, &mut w, "HSET h f v");
        let exec = |s: &mut Session, w: &mut Worker, queue: &[&str]| {
            assert_eq!(cmd(s, &sh, w, "MULTI"), Reply::Ok);
            for q in queue {
                cmd(s, &sh, w, q);
            }
            let mut out = bytes::BytesMut::new();
            cmd(s, &sh, w, "EXEC").encode(s.proto, &mut out);
            String::from_utf8(out.to_vec()).unwrap()
        };
        let from2 = exec(&mut s, &mut w, &["GET nokey", "HELLO 3", "GET nokey", "HGETALL h"]);
        assert_eq!(s.proto, Proto::Resp3);
        assert!(from2.starts_with("*4\r\n$-1\r\n%7\r\n"), "{from2:?}");
        assert!(from2.ends_with("*0\r\n_\r\n%1\r\n$1\r\nf\r\n$1\r\nv\r\n"), "{from2:?}");
        let from3 = exec(&mut s, &mut w, &["GET nokey", "HELLO 2", "GET nokey", "HGETALL h"]);
        assert_eq!(s.proto, Proto::Resp2);
        assert!(from3.starts_with("*4\r\n_\r\n*14\r\n"), "{from3:?}");
        assert!(from3.ends_with("*0\r\n$-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"), "{from3:?}");
        // No HELLO: nothing wrapped, the connection's protocol throughout.
        let Reply::Array(v) = ({
            cmd(&mut s, &sh, &mut w, "MULTI");
            cmd(&mut s, &sh, &mut w, "GET nokey");
            cmd(&mut s, &sh, &mut w, "EXEC")
        }) else {
            panic!()
        };
        assert_eq!(v, vec![Reply::Nil]);
    }

    /// Without backups only `local` can be chosen; a policy name is checked.
    #[test]
    fn a_node_that_is_not_a_primary_offers_only_the_local_policy() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        assert_eq!(cmd(&mut s, &sh, &mut w, "AUTH sesame"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "DITTO.POLICY"), Reply::Bulk(Bytes::from("local")));
        let e = cmd(&mut s, &sh, &mut w, "DITTO.POLICY majority-received");
        assert!(matches!(&e, Reply::Error(m) if m.contains("needs backups")), "{e:?}");
        assert_eq!(s.policy(), None, "a refused policy changes nothing");
        assert!(matches!(cmd(&mut s, &sh, &mut w, "DITTO.POLICY sometimes"), Reply::Error(_)));
        assert_eq!(cmd(&mut s, &sh, &mut w, "DITTO.POLICY local"), Reply::Ok);
        assert_eq!(s.policy(), Some(ditto_replication::CommitPolicy::LOCAL));
    }

    /// `DITTO.FORGETBACKUP` on a node that is not a primary is refused, saying what it is
    /// for; a wrong arity too.
    #[test]
    fn forgetting_a_backup_is_refused_where_no_restart_waits() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        assert_eq!(cmd(&mut s, &sh, &mut w, "AUTH sesame"), Reply::Ok);
        let e = cmd(&mut s, &sh, &mut w, "DITTO.FORGETBACKUP b1");
        assert!(matches!(&e, Reply::Error(m) if m.contains("for a primary whose restart waits")), "{e:?}");
        assert!(matches!(cmd(&mut s, &sh, &mut w, "DITTO.FORGETBACKUP"), Reply::Error(_)));
    }

    #[test]
    fn auth_gates_commands_and_wrong_passwords_are_refused() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        assert!(matches!(cmd(&mut s, &sh, &mut w, "GET k"), Reply::Error(e) if e.starts_with("NOAUTH")));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "AUTH nope"), Reply::Error(e) if e.starts_with("WRONGPASS")));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "AUTH sesamf"), Reply::Error(_)));
        // What ditto refuses of a command Redis runs (SET's expiry, CONFIG SET) is refused
        // after authentication, as Redis would reach it (before 2026-12-06 it came first).
        for refused_later in ["SET k v EX 10", "CONFIG SET a b"] {
            let e = cmd(&mut s, &sh, &mut w, refused_later);
            assert!(matches!(&e, Reply::Error(m) if m.starts_with("NOAUTH")), "{refused_later}: {e:?}");
        }
        // Redis's own checks of a subcommand come first, as in Redis.
        let e = cmd(&mut s, &sh, &mut w, "CONFIG NOSUCH");
        assert!(matches!(&e, Reply::Error(m) if m.starts_with("ERR unknown subcommand")), "{e:?}");
        assert_eq!(cmd(&mut s, &sh, &mut w, "AUTH default sesame"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k"), Reply::Nil);
        let e = cmd(&mut s, &sh, &mut w, "SET k v EX 10");
        assert!(matches!(&e, Reply::Error(m) if m.contains("not supported by ditto")), "{e:?}");
    }

    /// A pipeline's run of GETs or SETs answered together gives each request the reply,
    /// statistics and durability wait it gets alone; only plain GETs and SETs of an
    /// authenticated session outside MULTI qualify (SETs only where writes are allowed); a
    /// run of SETs the transaction cannot take runs request by request.
    #[test]
    fn a_run_of_gets_or_sets_answers_as_each_alone() {
        let (mut sh, mut w) = setup();
        let mut s = Session::new(&sh);
        let req =
            |line: &str| -> Vec<Bytes> { line.split(' ').map(|a| Bytes::copy_from_slice(a.as_bytes())).collect() };
        assert_eq!(s.run_kind(&req("GET a"), &sh), None, "not authenticated yet");
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        let sets: Vec<Vec<Bytes>> = ["SET a 1", "set h x", "SET a 11", "Set b 2"].iter().map(|l| req(l)).collect();
        assert!(sets.iter().all(|r| s.run_kind(r, &sh) == Some(RunKind::Set)));
        let calls = |sh: &Shared, c: &[u8]| {
            sh.stats.command(0, commands::lookup_index(c).unwrap()).calls.load(Ordering::Relaxed)
        };
        let (set_calls0, commits0) = (calls(&sh, b"SET"), sh.stats.txn_commits.load(Ordering::Relaxed));
        let set = s.handle_run(RunKind::Set, &sets, usize::MAX, &sh, &mut w);
        assert!(set.iter().all(|o| o.reply == Reply::Ok && o.cmd == Some(commands::lookup_index(b"SET").unwrap())));
        assert!(set.iter().all(|o| o.wait == set[0].wait && o.wait > Ts(0)));
        assert_eq!(s.last_commit, set[0].wait, "DITTO.LASTCOMMIT is the run's commit");
        assert_eq!(calls(&sh, b"SET") - set_calls0, 4);
        assert_eq!(sh.stats.txn_commits.load(Ordering::Relaxed) - commits0, 1, "one transaction");
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET a"), Reply::Bulk(Bytes::from("11")), "in order: the later SET wins");
        // A SET over a hash replaces it, as SET alone does.
        cmd(&mut s, &sh, &mut w, "HSET hh f v");
        let over = s.handle_run(RunKind::Set, &[req("SET hh s"), req("SET c 3")], usize::MAX, &sh, &mut w);
        assert!(over.iter().all(|o| o.reply == Reply::Ok));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "HGET hh f"), Reply::Error(e) if e.starts_with("WRONGTYPE")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET hh"), Reply::Bulk(Bytes::from("s")));
        // The same hash twice in a run: replaced once, the later value wins.
        cmd(&mut s, &sh, &mut w, "HSET h2 f v g w");
        let twice = s.handle_run(RunKind::Set, &[req("SET h2 s"), req("SET h2 t")], usize::MAX, &sh, &mut w);
        assert!(twice.iter().all(|o| o.reply == Reply::Ok));
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET h2"), Reply::Bulk(Bytes::from("t")));
        // No field left behind: a new hash at the key holds only its own field.
        cmd(&mut s, &sh, &mut w, "DEL h2");
        cmd(&mut s, &sh, &mut w, "HSET h2 z 1");
        match cmd(&mut s, &sh, &mut w, "HGETALL h2") {
            Reply::Map(m) => assert_eq!(m.len(), 1, "{m:?}"),
            Reply::Array(a) => assert_eq!(a.len(), 2, "{a:?}"),
            other => panic!("{other:?}"),
        }
        // A run longer than one batched read of types (16 keys): a hash in the second batch,
        // a key written in the first batch and again in the second.
        cmd(&mut s, &sh, &mut w, "HSET h3 f v g w");
        let mut long: Vec<Vec<Bytes>> = (0..20).map(|i| req(&format!("SET k{i} {i}"))).collect();
        long.extend([req("SET h3 s"), req("SET k0 again")]);
        let out = s.handle_run(RunKind::Set, &long, usize::MAX, &sh, &mut w);
        assert!(out.len() == 22 && out.iter().all(|o| o.reply == Reply::Ok && o.wait == out[0].wait));
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k0"), Reply::Bulk(Bytes::from("again")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k19"), Reply::Bulk(Bytes::from("19")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET h3"), Reply::Bulk(Bytes::from("s")));
        cmd(&mut s, &sh, &mut w, "DEL h3");
        cmd(&mut s, &sh, &mut w, "HSET h3 z 1");
        assert_eq!(cmd(&mut s, &sh, &mut w, "HLEN h3"), Reply::Int(1));
        assert_eq!(cmd(&mut s, &sh, &mut w, "HGET h3 f"), Reply::Nil, "the old fields went with the SET");
        // A value over the engine's limit: the run falls back to one request at a time, so
        // the others still take effect and only the oversize one fails.
        let big =
            vec![Bytes::from("SET"), Bytes::from("big"), Bytes::from(vec![b'x'; ditto_engine::VALUE_LEN_MAX + 1])];
        let mixed = s.handle_run(RunKind::Set, &[req("SET d 4"), big, req("SET e 5")], usize::MAX, &sh, &mut w);
        assert_eq!(mixed[0].reply, Reply::Ok);
        assert!(mixed[1].reply.is_error(), "{:?}", mixed[1].reply);
        assert_eq!(mixed[2].reply, Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET e"), Reply::Bulk(Bytes::from("5")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXISTS big"), Reply::Int(0));

        cmd(&mut s, &sh, &mut w, "HSET hg f v");
        cmd(&mut s, &sh, &mut w, "SELECT 3");
        cmd(&mut s, &sh, &mut w, "SET a three");
        cmd(&mut s, &sh, &mut w, "SELECT 0");
        let run: Vec<Vec<Bytes>> = ["GET a", "get hg", "GET missing", "Get a"].iter().map(|l| req(l)).collect();
        assert!(run.iter().all(|r| s.run_kind(r, &sh) == Some(RunKind::Get)));
        for other in ["GET", "GET a b", "MGET a", "SET a", "SET a 1 NX", "SETNX a 1"] {
            assert_eq!(s.run_kind(&req(other), &sh), None, "{other}");
        }
        let (calls0, errors0, commands0) =
            (calls(&sh, b"GET"), sh.stats.errors.load(Ordering::Relaxed), sh.stats.commands.load(Ordering::Relaxed));
        let together = s.handle_run(RunKind::Get, &run, usize::MAX, &sh, &mut w);
        assert_eq!(calls(&sh, b"GET") - calls0, 4);
        assert_eq!(sh.stats.errors.load(Ordering::Relaxed) - errors0, 1, "the WRONGTYPE");
        assert_eq!(sh.stats.commands.load(Ordering::Relaxed) - commands0, 4);
        let alone: Vec<Outcome> = run.iter().map(|r| s.handle(r.clone(), &sh, &mut w)).collect();
        assert_eq!(together.len(), 4);
        // A read waits for the newest commit it saw: together, the newest any of them saw.
        let newest = alone.iter().map(|a| a.wait).max().unwrap();
        assert!(newest > Ts(0));
        for (t, a) in together.iter().zip(&alone) {
            assert_eq!(t.reply, a.reply);
            assert_eq!((t.cmd, t.close), (a.cmd, a.close));
            assert_eq!(t.wait, newest);
        }
        assert_eq!(together[0].reply, Reply::Bulk(Bytes::from("11")));
        assert!(matches!(&together[1].reply, Reply::Error(e) if e.starts_with("WRONGTYPE")));
        assert_eq!(together[2].reply, Reply::Nil);
        // A byte budget: the answer stops after the value that passes it (at least one).
        cmd(&mut s, &sh, &mut w, "SET ten 0123456789");
        let tens: Vec<Vec<Bytes>> = (0..3).map(|_| req("GET ten")).collect();
        let (calls0, commands0) = (calls(&sh, b"GET"), sh.stats.commands.load(Ordering::Relaxed));
        assert_eq!(s.handle_run(RunKind::Get, &tens, 15, &sh, &mut w).len(), 2);
        assert_eq!(s.handle_run(RunKind::Get, &tens, 5, &sh, &mut w).len(), 1);
        assert_eq!(s.handle_run(RunKind::Get, &tens, 0, &sh, &mut w).len(), 1);
        assert_eq!(s.handle_run(RunKind::Get, &tens, 30, &sh, &mut w).len(), 3);
        assert_eq!(calls(&sh, b"GET") - calls0, 7, "only the answered GETs count");
        assert_eq!(sh.stats.commands.load(Ordering::Relaxed) - commands0, 7);
        // Another database: the same keys answer from it.
        cmd(&mut s, &sh, &mut w, "SELECT 3");
        assert_eq!(
            s.handle_run(RunKind::Get, &run[..1], usize::MAX, &sh, &mut w)[0].reply,
            Reply::Bulk(Bytes::from("three"))
        );
        // Inside MULTI requests are queued, so none forms a run.
        cmd(&mut s, &sh, &mut w, "MULTI");
        assert_eq!(s.run_kind(&req("GET a"), &sh), None);
        assert_eq!(s.run_kind(&req("SET a 1"), &sh), None);
        cmd(&mut s, &sh, &mut w, "DISCARD");
        // A read-only node runs GETs together, never SETs.
        sh.read_only = true;
        assert_eq!(s.run_kind(&req("GET a"), &sh), Some(RunKind::Get));
        assert_eq!(s.run_kind(&req("SET a 1"), &sh), None);
    }

    #[test]
    fn config_get_matches_globs_and_nothing_can_be_set() {
        let (mut sh, mut w) = setup();
        sh.config_view = vec![("port".into(), "7000".into()), ("appendonly".into(), "yes".into())];
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        let pairs = |r: Reply| match r {
            Reply::Map(m) => m.len(),
            other => panic!("{other:?}"),
        };
        assert_eq!(pairs(cmd(&mut s, &sh, &mut w, "CONFIG GET *")), 2);
        assert_eq!(pairs(cmd(&mut s, &sh, &mut w, "CONFIG get APPEND*")), 1);
        assert_eq!(pairs(cmd(&mut s, &sh, &mut w, "CONFIG GET requirepass")), 0, "the password is never shown");
        assert!(
            matches!(cmd(&mut s, &sh, &mut w, "CONFIG SET port 1"), Reply::Error(e) if e.contains("not supported"))
        );
        assert!(matches!(cmd(&mut s, &sh, &mut w, "CONFIG GET"), Reply::Error(_)));
    }

    #[test]
    fn commandstats_count_calls_rejections_and_failures() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "GET k"); // NOAUTH: refused before running
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        cmd(&mut s, &sh, &mut w, "SET k v");
        cmd(&mut s, &sh, &mut w, "GET k");
        cmd(&mut s, &sh, &mut w, "GET k extra"); // wrong arity: refused
        cmd(&mut s, &sh, &mut w, "INCR k"); // ran, answered an error
        cmd(&mut s, &sh, &mut w, "NOSUCHCOMMAND x");
        let text = match cmd(&mut s, &sh, &mut w, "INFO commandstats") {
            Reply::Text(b) => String::from_utf8(b.to_vec()).unwrap(),
            other => panic!("{other:?}"),
        };
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
                .unwrap_or_else(|| panic!("{name}: {text}"))
        };
        assert!(line("get").contains("calls=1,") && line("get").contains("rejected_calls=2,failed_calls=0"), "{text}");
        assert!(line("set").contains("calls=1,") && line("set").ends_with("rejected_calls=0,failed_calls=0"));
        assert!(line("incr").contains("calls=1,") && line("incr").ends_with("failed_calls=1"), "{text}");
        assert!(!text.contains("nosuchcommand") && !text.contains("cmdstat_hset"), "only commands seen: {text}");
        // Not in the default sections, as in Redis.
        match cmd(&mut s, &sh, &mut w, "INFO") {
            Reply::Text(b) => assert!(!String::from_utf8_lossy(&b).contains("Commandstats")),
            other => panic!("{other:?}"),
        }
        assert_eq!(sh.stats.errors.load(Ordering::Relaxed), 4, "NOAUTH, arity, INCR, unknown");
    }

    #[test]
    fn multi_exec_runs_queued_commands_and_watch_fires_on_change() {
        let (sh, mut w) = setup();
        let mut a = Session::new(&sh);
        let mut b = Session::new(&sh);
        for s in [&mut a, &mut b] {
            assert_eq!(cmd(s, &sh, &mut w, "AUTH sesame"), Reply::Ok);
        }
        assert_eq!(cmd(&mut a, &sh, &mut w, "WATCH k"), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, "SET k 1"), Reply::Simple("QUEUED"));
        assert_eq!(cmd(&mut a, &sh, &mut w, "INCR k"), Reply::Simple("QUEUED"));
        assert_eq!(cmd(&mut a, &sh, &mut w, "EXEC"), Reply::Array(vec![Reply::Ok, Reply::Int(2)]));
        // b changes the key between a's WATCH and EXEC: nil, nothing written.
        assert_eq!(cmd(&mut a, &sh, &mut w, "WATCH k"), Reply::Ok);
        assert_eq!(cmd(&mut b, &sh, &mut w, "SET k 10"), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, "SET k 99"), Reply::Simple("QUEUED"));
        assert_eq!(cmd(&mut a, &sh, &mut w, "EXEC"), Reply::NilArray);
        assert_eq!(cmd(&mut a, &sh, &mut w, "GET k"), Reply::bulk("10"));
        // A bad command while queueing aborts the whole EXEC.
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, "SET k 5"), Reply::Simple("QUEUED"));
        assert!(cmd(&mut a, &sh, &mut w, "GET").is_error());
        assert!(matches!(cmd(&mut a, &sh, &mut w, "EXEC"), Reply::Error(e) if e.starts_with("EXECABORT")));
        assert_eq!(cmd(&mut a, &sh, &mut w, "GET k"), Reply::bulk("10"));
    }

    /// Found by the differential test against Redis (crates/ditto/tests/redis_differential.rs):
    /// COMMAND's subcommands answer as Redis 7's do (compared by hand with redis-server
    /// 7.0.15): INFO with no names lists every command, COUNT takes no argument, LIST
    /// filters by a name pattern, an ACL category or a module, with anything else a syntax
    /// error, and an unknown subcommand or a wrong arity is refused before it runs, so that
    /// queued in MULTI it aborts the EXEC.
    #[test]
    fn command_subcommands_answer_as_redis() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        let names = |r: Reply| -> Vec<String> {
            let Reply::Array(v) = r else { panic!("{r:?}") };
            v.into_iter()
                .map(|x| match x {
                    Reply::Bulk(b) => String::from_utf8(b.to_vec()).unwrap(),
                    Reply::Array(e) => match &e[0] {
                        Reply::Bulk(b) => String::from_utf8(b.to_vec()).unwrap(),
                        o => panic!("{o:?}"),
                    },
                    o => panic!("{o:?}"),
                })
                .collect()
        };
        let all = names(cmd(&mut s, &sh, &mut w, "COMMAND LIST"));
        assert_eq!(all.len(), SPECS.len());
        assert_eq!(names(cmd(&mut s, &sh, &mut w, "COMMAND INFO")), all, "INFO with no names: every command");
        let Reply::Array(info) = cmd(&mut s, &sh, &mut w, "COMMAND INFO get nope") else { panic!() };
        assert!(matches!(&info[..], [Reply::Array(_), Reply::Nil]), "{info:?}");
        let err = |r: Reply| match r {
            Reply::Error(e) => e.to_string(),
            o => panic!("not an error: {o:?}"),
        };
        assert_eq!(
            err(cmd(&mut s, &sh, &mut w, "COMMAND COUNT x")),
            "ERR wrong number of arguments for 'command|count' command"
        );
        assert_eq!(err(cmd(&mut s, &sh, &mut w, "COMMAND NOPE")), "ERR unknown subcommand 'NOPE'. Try COMMAND HELP.");
        // ditto's own commands take no argument they would not read (they read the first
        // and answered, DITTO.POLICY setting the policy).
        let policy = cmd(&mut s, &sh, &mut w, "DITTO.POLICY");
        assert_eq!(
            err(cmd(&mut s, &sh, &mut w, "DITTO.POLICY all-durable oops")),
            "ERR wrong number of arguments for 'ditto.policy' command"
        );
        assert_eq!(cmd(&mut s, &sh, &mut w, "DITTO.POLICY"), policy, "the refused DITTO.POLICY changed the policy");
        assert_eq!(
            err(cmd(&mut s, &sh, &mut w, "DITTO.WAITTS 5 junk")),
            "ERR wrong number of arguments for 'ditto.waitts' command"
        );
        let mut h = names(cmd(&mut s, &sh, &mut w, "COMMAND LIST FILTERBY PATTERN H*"));
        h.sort();
        let mut want: Vec<String> = all.iter().filter(|n| n.starts_with('h')).cloned().collect();
        want.sort();
        assert!(!want.is_empty());
        assert_eq!(h, want);
        assert!(names(cmd(&mut s, &sh, &mut w, "COMMAND LIST FILTERBY MODULE foo")).is_empty());
        let writes = names(cmd(&mut s, &sh, &mut w, "COMMAND LIST FILTERBY ACLCAT write"));
        assert!(writes.contains(&"set".to_string()) && !writes.contains(&"get".to_string()), "{writes:?}");
        let reads = names(cmd(&mut s, &sh, &mut w, "COMMAND LIST FILTERBY ACLCAT read"));
        assert!(reads.contains(&"get".to_string()) && reads.contains(&"dbsize".to_string()), "{reads:?}");
        assert!(!reads.contains(&"config".to_string()) && !reads.contains(&"set".to_string()), "{reads:?}");
        let conn = names(cmd(&mut s, &sh, &mut w, "COMMAND LIST FILTERBY ACLCAT connection"));
        assert!(conn.contains(&"ping".to_string()) && !conn.contains(&"dbsize".to_string()), "{conn:?}");
        assert!(matches!(cmd(&mut s, &sh, &mut w, "COMMAND HELP"), Reply::Array(h) if h.len() > 4));
        assert_eq!(err(cmd(&mut s, &sh, &mut w, "COMMAND LIST FILTERBY NOPE x")), "ERR syntax error");
        assert_eq!(err(cmd(&mut s, &sh, &mut w, "COMMAND LIST x")), "ERR syntax error");
        // Queued: an unknown subcommand aborts the EXEC.
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert!(matches!(cmd(&mut s, &sh, &mut w, "COMMAND NOPE"), Reply::Error(_)));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Error(e) if e.starts_with("EXECABORT")));
        // CONFIG's too, and those ditto does not run (Redis 7.0.15 answers the first two
        // the same; before 2026-12-05 each was queued and the EXEC ran the rest).
        assert_eq!(err(cmd(&mut s, &sh, &mut w, "CONFIG FOO")), "ERR unknown subcommand 'FOO'. Try CONFIG HELP.");
        assert_eq!(
            err(cmd(&mut s, &sh, &mut w, "CONFIG SET a")),
            "ERR wrong number of arguments for 'config|set' command"
        );
        assert_eq!(
            err(cmd(&mut s, &sh, &mut w, "CONFIG RESETSTAT x")),
            "ERR wrong number of arguments for 'config|resetstat' command"
        );
        assert!(err(cmd(&mut s, &sh, &mut w, "CONFIG RESETSTAT")).contains("not supported by ditto"));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "CONFIG GET maxmemory"), Reply::Map(_)));
        for refused in ["CONFIG FOO", "CONFIG SET a", "CONFIG SET maxmemory 1"] {
            assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
            assert!(matches!(cmd(&mut s, &sh, &mut w, refused), Reply::Error(_)), "{refused}");
            assert_eq!(cmd(&mut s, &sh, &mut w, "SET config_k 1"), Reply::Simple("QUEUED"));
            assert!(
                matches!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Error(e) if e.starts_with("EXECABORT")),
                "{refused}"
            );
            assert_eq!(cmd(&mut s, &sh, &mut w, "GET config_k"), Reply::Nil, "{refused}: the EXEC ran the rest");
        }
    }

    /// what WATCH counts as a change, what KEYS and DBSIZE see inside EXEC, and an EXEC
    /// refused before it runs.
    #[test]
    fn watch_exec_and_keys_inside_exec_behave_as_in_redis() {
        let (sh, mut w) = setup();
        let mut a = Session::new(&sh);
        let mut b = Session::new(&sh);
        for s in [&mut a, &mut b] {
            assert_eq!(cmd(s, &sh, &mut w, "AUTH sesame"), Reply::Ok);
        }
        let exec_ok = |a: &mut Session, w: &mut Worker| match cmd(a, &sh, w, "EXEC") {
            Reply::Array(_) => true,
            Reply::NilArray => false,
            other => panic!("EXEC answered {other:?}"),
        };
        // An HDEL that removes nothing writes nothing: no change for WATCH.
        assert_eq!(cmd(&mut a, &sh, &mut w, "HSET h f 1"), Reply::Int(1));
        assert_eq!(cmd(&mut a, &sh, &mut w, "WATCH h"), Reply::Ok);
        assert_eq!(cmd(&mut b, &sh, &mut w, "HDEL h nosuchfield"), Reply::Int(0));
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert!(exec_ok(&mut a, &mut w), "an HDEL of no field is no change");
        // A field too long to be stored is absent: HDEL deletes the others (before, the
        // engine refused the whole HDEL, the key and field past its key limit).
        assert_eq!(cmd(&mut a, &sh, &mut w, "HSET h2 a 1"), Reply::Int(1));
        let long = format!("HDEL h2 a {}", "x".repeat(ditto_engine::KEY_LEN_MAX));
        assert_eq!(cmd(&mut a, &sh, &mut w, &long), Reply::Int(1));
        assert_eq!(cmd(&mut a, &sh, &mut w, "EXISTS h2"), Reply::Int(0));
        assert_eq!(cmd(&mut a, &sh, &mut w, "WATCH h"), Reply::Ok);
        assert_eq!(cmd(&mut b, &sh, &mut w, "SET h x NX"), Reply::Nil);
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert!(exec_ok(&mut a, &mut w), "a SET NX that did not set is no change");
        // A deleted key whose tombstone is cleaned up between WATCH and EXEC is unchanged...
        assert_eq!(cmd(&mut a, &sh, &mut w, "SET gone 1"), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, "DEL gone"), Reply::Int(1));
        assert_eq!(cmd(&mut a, &sh, &mut w, "WATCH gone"), Reply::Ok);
        sh.db.reclaim();
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert!(exec_ok(&mut a, &mut w), "a cleaned-up tombstone is no change");
        // ...but a key created (and deleted again) meanwhile is a change.
        assert_eq!(cmd(&mut a, &sh, &mut w, "WATCH gone"), Reply::Ok);
        assert_eq!(cmd(&mut b, &sh, &mut w, "SET gone 2"), Reply::Ok);
        assert_eq!(cmd(&mut b, &sh, &mut w, "DEL gone"), Reply::Int(1));
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert!(!exec_ok(&mut a, &mut w), "created and deleted meanwhile is a change");
        // Still a change once that record too has left the index; for a key never written
        // before the WATCH as well.
        for key in ["gone", "never"] {
            sh.db.reclaim();
            assert_eq!(cmd(&mut a, &sh, &mut w, &format!("WATCH {key}")), Reply::Ok);
            assert_eq!(cmd(&mut b, &sh, &mut w, &format!("SET {key} 3")), Reply::Ok);
            assert_eq!(cmd(&mut b, &sh, &mut w, &format!("DEL {key}")), Reply::Int(1));
            sh.db.reclaim();
            assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
            assert!(!exec_ok(&mut a, &mut w), "{key}: created and deleted, then cleaned up, is a change");
        }
        // KEYS and DBSIZE inside EXEC see the EXEC's own earlier writes.
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        for c in ["SET new 1", "KEYS n*", "DBSIZE", "DEL new", "DBSIZE"] {
            assert_eq!(cmd(&mut a, &sh, &mut w, c), Reply::Simple("QUEUED"));
        }
        assert_eq!(
            cmd(&mut a, &sh, &mut w, "EXEC"),
            Reply::Array(vec![
                Reply::Ok,
                Reply::Array(vec![Reply::bulk("new")]),
                Reply::Int(2),
                Reply::Int(1),
                Reply::Int(1)
            ])
        );
        // EXEC refused before it runs (here its arity) discards the transaction.
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, "SET k 1"), Reply::Simple("QUEUED"));
        assert_eq!(
            cmd(&mut a, &sh, &mut w, "EXEC now"),
            Reply::err("EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command")
        );
        assert_eq!(cmd(&mut a, &sh, &mut w, "GET k"), Reply::Nil, "not queued any more: runs at once");
        // A subcommand's arity is checked before queueing, as the command's is.
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(
            cmd(&mut a, &sh, &mut w, "CLIENT SETNAME a b"),
            Reply::err("ERR wrong number of arguments for 'client|setname' command")
        );
        assert_eq!(
            cmd(&mut a, &sh, &mut w, "CLIENT NOSUCH"),
            Reply::err("ERR unknown subcommand 'NOSUCH'. Try CLIENT HELP.")
        );
        // Bytes that are not UTF-8 are echoed as they came, as Redis does (they came back
        // as U+FFFD before 2026-12-06); so in a HELLO's unknown option.
        let raw = |args: &[&[u8]], a: &mut Session, w: &mut Worker| {
            let mut out = bytes::BytesMut::new();
            a.handle(args.iter().map(|x| Bytes::copy_from_slice(x)).collect(), &sh, w)
                .reply
                .encode(Proto::Resp2, &mut out);
            out.to_vec()
        };
        let mut b = Session::new(&sh);
        assert_eq!(cmd(&mut b, &sh, &mut w, "AUTH sesame"), Reply::Ok);
        assert_eq!(
            raw(&[&b"CLIENT"[..], b"\xff\xfe"], &mut b, &mut w),
            b"-ERR unknown subcommand '\xff\xfe'. Try CLIENT HELP.\r\n"
        );
        assert_eq!(
            raw(&[&b"HELLO"[..], b"2", b"\xff"], &mut b, &mut w),
            b"-ERR Syntax error in HELLO option '\xff'\r\n"
        );
        assert!(matches!(cmd(&mut a, &sh, &mut w, "EXEC"), Reply::Error(e) if e.starts_with("EXECABORT")));
    }

    /// A commit log whose appends on worker 1 wait while `held` (a commit in the log and not
    /// yet installed, its timestamp below later ones); the others pass at once.
    #[derive(Default)]
    struct HoldsWorker1 {
        held: parking_lot::Mutex<bool>,
        cv: parking_lot::Condvar,
        waiting: std::sync::atomic::AtomicBool,
    }

    impl HoldsWorker1 {
        fn set(&self, held: bool) {
            *self.held.lock() = held;
            self.cv.notify_all();
        }
    }

    impl ditto_engine::CommitLog for HoldsWorker1 {
        fn check_writable(&self) -> ditto_engine::Result<()> {
            Ok(())
        }
        fn append(&self, worker: WorkerId, _: Ts, _: &mut dyn ExactSizeIterator<Item = ditto_engine::LoggedWrite<'_>>) {
            if worker == WorkerId(1) {
                let mut h = self.held.lock();
                self.waiting.store(*h, Ordering::SeqCst);
                while *h {
                    self.cv.wait(&mut h);
                }
                self.waiting.store(false, Ordering::SeqCst);
            }
        }
        fn wait_durable(&self, _: Ts) -> ditto_engine::Result<()> {
            Ok(())
        }
        fn is_durable(&self, _: Ts) -> ditto_engine::Result<bool> {
            Ok(true)
        }
        fn table_created(&self, _: ditto_engine::TableId, _: &str) -> ditto_engine::Result<()> {
            Ok(())
        }
    }

    /// KEYS (and SCAN) after a write hold it, though an older commit, in the log already,
    /// still installs (the newest consistent snapshot lies below the write meanwhile): the
    /// read waits for that install, and past a second refuses, saying why. Before
    /// 2026-12-05 it took the snapshot at once and missed the key (found by a review).
    #[test]
    fn keys_after_a_write_holds_it_while_an_older_commit_installs() {
        let db = Database::new(Options { workers: 2 });
        let sh = Shared::new(Arc::clone(&db), None, None, 0).unwrap();
        let log = Arc::new(HoldsWorker1::default());
        db.attach_log(log.clone());
        let other = db.create_table("other").unwrap();
        let mut w = db.worker(WorkerId(0)).unwrap();
        let mut s = Session::new(&sh);
        for (round, hold_ms) in [(0, 200u64), (1, 1_500)] {
            log.set(true);
            let db2 = Arc::clone(&db);
            let older = std::thread::spawn(move || {
                let mut w1 = db2.worker(WorkerId(1)).unwrap();
                w1.run(|x| x.put(other, format!("o{round}").as_bytes(), b"v")).map(|_| ()).unwrap();
            });
            let t0 = Instant::now();
            while !log.waiting.load(Ordering::SeqCst) {
                assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the older commit never reached the log");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let key = format!("k{round}");
            assert_eq!(cmd(&mut s, &sh, &mut w, &format!("SET {key} v")), Reply::Ok);
            assert!(sh.db.clock().visible_ts() < s.last_commit, "the snapshot lies below the write meanwhile");
            let release = std::thread::spawn({
                let log = Arc::clone(&log);
                move || {
                    std::thread::sleep(std::time::Duration::from_millis(hold_ms));
                    log.set(false);
                }
            });
            let asked = Instant::now();
            let r = cmd(&mut s, &sh, &mut w, "KEYS k*");
            let took = asked.elapsed();
            if round == 0 {
                let Reply::Array(keys) = r else { panic!("{r:?}") };
                assert!(keys.contains(&Reply::bulk(key.clone())), "KEYS missed {key}: {keys:?}");
                assert!(took >= std::time::Duration::from_millis(100), "it did not wait: {took:?}");
            } else {
                assert!(matches!(&r, Reply::Error(e) if e.contains("did not reach ts")), "{r:?}");
                assert!(took >= SNAPSHOT_WAIT_MAX, "{took:?}");
            }
            release.join().unwrap();
            older.join().unwrap();
        }
        // With nothing in flight, at once.
        let Reply::Array(keys) = cmd(&mut s, &sh, &mut w, "KEYS k*") else { panic!() };
        assert_eq!(keys.len(), 2, "{keys:?}");
    }

    /// HELLO's SETNAME takes the names CLIENT SETNAME takes, and refuses the others as it
    /// does (a name with a space broke CLIENT INFO's `name=` field for parsers), in Redis
    /// 7.0.15's order (compared over a raw socket): a syntax error refuses the whole HELLO
    /// before its credentials are tried; a bad name is refused after them (the client is
    /// then authenticated) and before the protocol changes; an empty name clears it.
    #[test]
    fn hello_setname_refuses_what_client_setname_refuses() {
        let (sh, mut w) = setup();
        let run = |s: &mut Session, w: &mut Worker, args: &[&str]| {
            s.handle(args.iter().map(|a| Bytes::copy_from_slice(a.as_bytes())).collect(), &sh, w).reply
        };
        let proto = |r: Reply| match r {
            Reply::Map(m) => m.into_iter().find(|(k, _)| *k == Reply::bulk("proto")).map(|(_, v)| v),
            o => panic!("{o:?}"),
        };
        let mut s = Session::new(&sh);
        assert!(
            matches!(run(&mut s, &mut w, &["HELLO", "3", "AUTH", "default", "sesame", "BOGUS"]), Reply::Error(e) if e.contains("Syntax error"))
        );
        assert!(matches!(run(&mut s, &mut w, &["CLIENT", "GETNAME"]), Reply::Error(e) if e.starts_with("NOAUTH")));
        assert!(run(&mut s, &mut w, &["HELLO", "3", "AUTH", "default", "sesame", "SETNAME", "a b"]).is_error());
        assert_eq!(run(&mut s, &mut w, &["CLIENT", "GETNAME"]), Reply::Nil, "authenticated, no name set");
        assert_eq!(proto(run(&mut s, &mut w, &["HELLO"])), Some(Reply::Int(2)), "the refused HELLO kept RESP2");
        assert!(matches!(run(&mut s, &mut w, &["HELLO", "3", "SETNAME", "ok"]), Reply::Map(_)));
        assert_eq!(run(&mut s, &mut w, &["CLIENT", "GETNAME"]), Reply::bulk("ok"));
        assert!(run(&mut s, &mut w, &["HELLO", "2", "SETNAME", "a\nb"]).is_error());
        assert_eq!(proto(run(&mut s, &mut w, &["HELLO"])), Some(Reply::Int(3)), "a refused name kept RESP3");
        assert_eq!(run(&mut s, &mut w, &["CLIENT", "GETNAME"]), Reply::bulk("ok"), "a refused name kept the old one");
        assert!(matches!(run(&mut s, &mut w, &["HELLO", "3", "SETNAME", ""]), Reply::Map(_)));
        assert_eq!(run(&mut s, &mut w, &["CLIENT", "GETNAME"]), Reply::Nil, "an empty name clears it");
    }

    /// A command over a limit inside EXEC aborts the whole transaction: nothing it or the
    /// commands before it wrote is committed (before, the writes it made before the
    /// engine refused the rest were committed with the others: `a` below, and an orphan
    /// hash field).
    #[test]
    fn a_command_over_a_limit_inside_exec_discards_the_whole_transaction() {
        let (sh, mut w) = setup();
        let mut a = Session::new(&sh);
        assert_eq!(cmd(&mut a, &sh, &mut w, "AUTH sesame"), Reply::Ok);
        let big_key = "k".repeat(ditto_engine::KEY_LEN_MAX);
        for (queued, big) in [
            ("SET before 1", format!("MSET a 1 {big_key}x 2")),
            ("SET before 1", format!("HSET h f1 v1 {big_key}x v2")),
        ] {
            assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
            assert_eq!(cmd(&mut a, &sh, &mut w, queued), Reply::Simple("QUEUED"));
            assert_eq!(cmd(&mut a, &sh, &mut w, &big), Reply::Simple("QUEUED"));
            match cmd(&mut a, &sh, &mut w, "EXEC") {
                Reply::Error(e) => assert_eq!(
                    e,
                    "EXECABORT Transaction discarded because of: key too long: a key may take 65535 bytes, a hash's key and field 65531 together"
                ),
                other => panic!("{big:.20}: {other:?}"),
            }
            for read in ["GET before", "GET a", "HGET h f1", "EXISTS h"] {
                let r = cmd(&mut a, &sh, &mut w, read);
                assert!(matches!(r, Reply::Nil | Reply::Int(0)), "{read} after the aborted EXEC: {r:?}");
            }
            assert_eq!(cmd(&mut a, &sh, &mut w, "DBSIZE"), Reply::Int(0));
        }
        // Outside MULTI the same command writes nothing either.
        assert!(cmd(&mut a, &sh, &mut w, &format!("MSET a 1 {big_key}x 2")).is_error());
        assert_eq!(cmd(&mut a, &sh, &mut w, "GET a"), Reply::Nil);
        // The limits in the client's terms: a key of 65,535 bytes, a hash's key and field
        // of 65,531 together, are taken; a byte more is refused, saying so.
        let words = Reply::err("ERR key too long: a key may take 65535 bytes, a hash's key and field 65531 together");
        let key = |n: usize| "k".repeat(n);
        assert_eq!(cmd(&mut a, &sh, &mut w, &format!("SET {} v", key(65_535))), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, &format!("SET {} v", key(65_536))), words);
        assert_eq!(cmd(&mut a, &sh, &mut w, &format!("HSET h {} v", key(65_530))), Reply::Int(1));
        assert_eq!(cmd(&mut a, &sh, &mut w, &format!("HSET h {} v", key(65_531))), words);
        // SETRANGE past the string limit aborts the EXEC as the other string writes do.
        assert_eq!(cmd(&mut a, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut a, &sh, &mut w, "SET before 1"), Reply::Simple("QUEUED"));
        assert_eq!(cmd(&mut a, &sh, &mut w, "SETRANGE r 16777215 x"), Reply::Simple("QUEUED"));
        assert_eq!(
            cmd(&mut a, &sh, &mut w, "EXEC"),
            Reply::err(
                "EXECABORT Transaction discarded because of: string exceeds maximum allowed size (16777215 bytes in ditto)"
            )
        );
        assert_eq!(cmd(&mut a, &sh, &mut w, "EXISTS before r"), Reply::Int(0));
    }

    /// DBSIZE's kept counts (`KeyCounts`) equal a walk of each database after every command
    /// of a seeded random mix of everything that makes or removes keys, and a count made
    /// afresh (as at a restart) agrees.
    #[test]
    fn key_counts_follow_every_command() {
        use rand::{Rng, SeedableRng};
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        let walk = |db: u8| {
            let (lo, hi) = db_range(db);
            let mut n = 0i64;
            let hi = hi.as_deref().map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            sh.db
                .read()
                .for_each(sh.ks.keys, std::ops::Bound::Included(&lo[..]), hi, |_, _| {
                    n += 1;
                    true
                })
                .unwrap();
            n
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let ops = [
            "SET {k} v",
            "SET {k} v NX",
            "GETDEL {k}",
            "DEL {k} {j}",
            "HSET {k} f v g w",
            "HDEL {k} f",
            "HDEL {k} g",
            "MSET {k} 1 {j} 2",
            "MSETNX {k} 1 {j} 2",
            "RENAME {k} {j}",
            "RENAMENX {k} {j}",
            "INCR {k}",
            "APPEND {k} x",
            "SETRANGE {k} 3 y",
            "HINCRBY {k} f 1",
            "SELECT 0",
            "SELECT 1",
            "FLUSHDB",
            "MULTI",
            "EXEC",
            "DISCARD",
        ];
        for step in 0..3000 {
            let op = ops[rng.gen_range(0..ops.len())];
            if op == "FLUSHDB" && rng.gen_ratio(9, 10) {
                continue;
            }
            let k = format!("k{}", rng.gen_range(0..8));
            let j = format!("k{}", rng.gen_range(0..8));
            cmd(&mut s, &sh, &mut w, &op.replace("{k}", &k).replace("{j}", &j));
            for db in [0, 1] {
                assert_eq!(sh.key_counts.get(db, Ts::MAX), walk(db), "db {db} after step {step}: {op}");
            }
        }
        let fresh = KeyCounts::count(&sh.db, &sh.ks).unwrap();
        for db in 0..DATABASES as u8 {
            assert_eq!(fresh.get(db, Ts::MAX), sh.key_counts.get(db, Ts::MAX));
        }
        assert!((0..2).map(walk).sum::<i64>() > 0, "the mix left keys to count");
    }

    /// Two clients on two workers make and remove the same few keys at once, so commits
    /// conflict and are retried: a transaction that failed must move no count, and the
    /// counts still equal a walk of the database at the end.
    #[test]
    fn key_counts_survive_conflicts_and_retries() {
        use rand::{Rng, SeedableRng};
        let db = Database::new(Options { workers: 2 });
        let sh = Shared::new(Arc::clone(&db), None, None, 0).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        std::thread::scope(|scope| {
            for wid in 0..2u32 {
                let (sh, db) = (&sh, &db);
                scope.spawn(move || {
                    let mut w = db.worker(WorkerId(wid)).unwrap();
                    let mut s = Session::new(sh);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(wid as u64);
                    let ops =
                        ["SET {k} v", "DEL {k} {j}", "HSET {k} f v", "HDEL {k} f", "MSET {k} 1 {j} 2", "GETDEL {k}"];
                    // Until both have met conflicts, bounded in time and count.
                    for _ in 0..200_000 {
                        if std::time::Instant::now() > deadline || sh.stats.txn_conflicts.load(Ordering::Relaxed) >= 50
                        {
                            break;
                        }
                        let op = ops[rng.gen_range(0..ops.len())];
                        let (k, j) = (format!("k{}", rng.gen_range(0..4)), format!("k{}", rng.gen_range(0..4)));
                        cmd(&mut s, sh, &mut w, &op.replace("{k}", &k).replace("{j}", &j));
                    }
                });
            }
        });
        let fresh = KeyCounts::count(&sh.db, &sh.ks).unwrap();
        assert_eq!(sh.key_counts.get(0, Ts::MAX), fresh.get(0, Ts::MAX), "the kept count against a walk");
        assert!(
            sh.stats.txn_conflicts.load(Ordering::Relaxed) > 0,
            "no commit conflicted: the retry path went untested"
        );
    }

    #[test]
    fn types_are_enforced_and_hashes_vanish_when_emptied() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "HSET h a 1 b 2"), Reply::Int(2));
        assert_eq!(cmd(&mut s, &sh, &mut w, "HSET h a 3"), Reply::Int(0));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "GET h"), Reply::Error(e) if e.starts_with("WRONGTYPE")));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "INCR h"), Reply::Error(e) if e.starts_with("WRONGTYPE")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "HLEN h"), Reply::Int(2));
        assert_eq!(
            cmd(&mut s, &sh, &mut w, "HGETALL h"),
            Reply::Map(vec![(Reply::bulk("a"), Reply::bulk("3")), (Reply::bulk("b"), Reply::bulk("2"))])
        );
        assert_eq!(cmd(&mut s, &sh, &mut w, "HDEL h a b c"), Reply::Int(2));
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXISTS h"), Reply::Int(0));
        // SET over a hash replaces it, fields and all.
        cmd(&mut s, &sh, &mut w, "HSET h x 1");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET h v"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "HSET h2 x 1"), Reply::Int(1));
        assert_eq!(cmd(&mut s, &sh, &mut w, "DBSIZE"), Reply::Int(2));
        assert_eq!(cmd(&mut s, &sh, &mut w, "SELECT 3"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "DBSIZE"), Reply::Int(0));
    }

    /// A string one byte longer than ditto holds is refused in the string's own terms by
    /// every command that writes one (SET and its kin, APPEND, MSET, SETRANGE; in MULTI,
    /// EXEC's abort), naming the longest string ditto holds, and writes nothing; one at the
    /// limit is taken. Before, the engine's refusal counted the row's type byte: "value is
    /// 16777217 bytes, over the limit of 16777216" for a SET of 16 MiB.
    #[test]
    fn a_string_over_the_limit_is_refused_in_its_own_terms_and_writes_nothing() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        let mut c =
            |args: Vec<&[u8]>| s.handle(args.into_iter().map(Bytes::copy_from_slice).collect(), &sh, &mut w).reply;
        assert_eq!(c(vec![b"AUTH", b"sesame"]), Reply::Ok);
        let max = crate::keyspace::STRING_LEN_MAX;
        assert_eq!(max, ditto_engine::VALUE_LEN_MAX - 1);
        let want = Reply::err(format!("ERR string exceeds maximum allowed size ({max} bytes in ditto)"));
        let over = vec![b'x'; max + 1];
        assert_eq!(c(vec![b"SET", b"old", b"v"]), Reply::Ok);
        for args in [
            vec![&b"SET"[..], b"k", &over],
            vec![b"SET", b"old", &over, b"GET"],
            vec![b"SETNX", b"k", &over],
            vec![b"GETSET", b"old", &over],
            vec![b"MSET", b"a", b"1", b"k", &over],
            vec![b"APPEND", b"old", &over[1..]],
            vec![b"APPEND", b"k", &over],
        ] {
            let name = String::from_utf8_lossy(args[0]).into_owned();
            assert_eq!(c(args), want, "{name}");
        }
        assert_eq!(c(vec![b"SETRANGE", b"k", max.to_string().as_bytes(), b"x"]), want);
        assert_eq!(c(vec![b"EXISTS", b"k", b"a"]), Reply::Int(0), "nothing written");
        assert_eq!(c(vec![b"GET", b"old"]), Reply::bulk("v".to_owned()));
        assert_eq!(c(vec![b"MULTI"]), Reply::Ok);
        assert_eq!(c(vec![b"SET", b"a", b"1"]), Reply::Simple("QUEUED"));
        assert_eq!(c(vec![b"SET", b"k", &over]), Reply::Simple("QUEUED"));
        assert_eq!(
            c(vec![b"EXEC"]),
            Reply::err(format!(
                "EXECABORT Transaction discarded because of: string exceeds maximum allowed size ({max} bytes in ditto)"
            ))
        );
        assert_eq!(c(vec![b"EXISTS", b"k", b"a"]), Reply::Int(0), "nothing of the transaction written");
        // At the limit: taken, and one more byte appended is refused.
        assert_eq!(c(vec![b"SET", b"k", &over[1..]]), Reply::Ok);
        assert_eq!(c(vec![b"STRLEN", b"k"]), Reply::Int(max as i64));
        assert_eq!(c(vec![b"APPEND", b"k", b"y"]), want);
        // A hash's field value is a row of its own, without the type byte: its limit is
        // the engine's, and so is the refusal's wording.
        let e = c(vec![b"HSET", b"h", b"f", &vec![b'x'; ditto_engine::VALUE_LEN_MAX + 1]]);
        assert!(matches!(&e, Reply::Error(m) if m.contains("over the limit")), "{e:?}");
    }

    /// SELECT reads its index as Redis does, a C int first: one outside it gets Redis's
    /// words for that, one inside it and out of the databases' range the other refusal.
    #[test]
    fn select_refuses_an_index_past_an_int_as_redis_does() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        let mut c = |line: &str| cmd(&mut s, &sh, &mut w, line);
        c("AUTH sesame");
        let int = Reply::err("ERR value is out of range, value must between -2147483648 and 2147483647");
        let db = Reply::err("ERR DB index is out of range");
        assert_eq!(c("SELECT 2147483648"), int);
        assert_eq!(c("SELECT -2147483649"), int);
        assert_eq!(c("SELECT 2147483647"), db);
        assert_eq!(c("SELECT -2147483648"), db);
        assert_eq!(c("SELECT 16"), db);
        assert_eq!(c("SELECT 99999999999999999999"), Reply::err(commands::NOT_INTEGER));
        assert_eq!(c("SELECT 15"), Reply::Ok);
    }

    /// The commands beyond the issue's list that clients commonly send, with Redis's
    /// replies: UNLINK, GETDEL, GETRANGE, SETRANGE, HSETNX, HKEYS, HVALS, HSTRLEN, TTL,
    /// PTTL, RENAME, RENAMENX, KEYS, FLUSHDB, FLUSHALL.
    #[test]
    fn common_extra_commands_answer_as_redis_does() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        let mut c = |line: &str| cmd(&mut s, &sh, &mut w, line);
        let bulk = |v: &str| Reply::bulk(v.to_owned());
        let err = |r: Reply, prefix: &str| matches!(&r, Reply::Error(e) if e.starts_with(prefix));
        c("AUTH sesame");
        // Strings.
        c("SET s Hello,World");
        for (range, want) in [
            ("0 4", "Hello"),
            ("-5 -1", "World"),
            ("-100 2", "Hel"),
            ("6 100", "World"),
            ("5 3", ""),
            ("20 30", ""),
            ("-1 -5", ""),
        ] {
            assert_eq!(c(&format!("GETRANGE s {range}")), bulk(want), "GETRANGE s {range}");
        }
        assert_eq!(c("GETRANGE missing 0 -1"), bulk(""));
        assert!(err(c("GETRANGE s a 1"), "ERR value is not an integer"));
        assert_eq!(c("SETRANGE s 6 Redis"), Reply::Int(11));
        assert_eq!(c("GET s"), bulk("Hello,Redis"));
        assert_eq!(c("SETRANGE pad 3 x"), Reply::Int(4));
        assert_eq!(c("GET pad"), Reply::Bulk(Bytes::from_static(b"\0\0\0x")));
        assert_eq!(c("SETRANGE s 0 "), Reply::Int(11), "an empty value changes nothing");
        assert_eq!(c("SETRANGE none 5 "), Reply::Int(0));
        assert_eq!(c("EXISTS none"), Reply::Int(0), "and creates no key");
        assert!(err(c("SETRANGE s -1 x"), "ERR offset is out of range"));
        assert!(err(c("SETRANGE s 16777215 x"), "ERR string exceeds maximum allowed size"));
        assert_eq!(c("GET s"), bulk("Hello,Redis"), "a refused SETRANGE wrote nothing");
        assert_eq!(c("GETDEL s"), bulk("Hello,Redis"));
        assert_eq!(c("GETDEL s"), Reply::Nil);
        assert_eq!(c("EXISTS s"), Reply::Int(0));
        // Hashes.
        assert_eq!(c("HSETNX h f 1"), Reply::Int(1));
        assert_eq!(c("HSETNX h f 2"), Reply::Int(0));
        assert_eq!(c("HSETNX h g 22"), Reply::Int(1));
        assert_eq!(c("HLEN h"), Reply::Int(2));
        assert_eq!(c("HKEYS h"), Reply::Array(vec![bulk("f"), bulk("g")]));
        assert_eq!(c("HVALS h"), Reply::Array(vec![bulk("1"), bulk("22")]));
        assert_eq!(c("HSTRLEN h g"), Reply::Int(2));
        assert_eq!(c("HSTRLEN h nope"), Reply::Int(0));
        assert_eq!(c("HKEYS nope"), Reply::Array(Vec::new()));
        c("SET str v");
        for wrong in ["HSETNX str f 1", "HKEYS str", "HVALS str", "HSTRLEN str f", "GETDEL h", "GETRANGE h 0 1"] {
            assert!(err(c(wrong), "WRONGTYPE"), "{wrong}");
        }
        // No expiry in ditto.
        assert_eq!(c("TTL str"), Reply::Int(-1));
        assert_eq!(c("PTTL h"), Reply::Int(-1));
        assert_eq!(c("TTL nope"), Reply::Int(-2));
        // RENAME moves a hash with its fields and replaces what the target held.
        assert_eq!(c("RENAME h str"), Reply::Ok);
        assert_eq!(c("EXISTS h"), Reply::Int(0));
        assert_eq!(c("HGET h f"), Reply::Nil, "no field left behind");
        assert_eq!(c("HGETALL str"), Reply::Map(vec![(bulk("f"), bulk("1")), (bulk("g"), bulk("22"))]));
        c("SET a 1");
        assert_eq!(c("RENAMENX a str"), Reply::Int(0));
        assert_eq!(c("GET a"), bulk("1"), "RENAMENX onto a key changes nothing");
        assert_eq!(c("HLEN str"), Reply::Int(2));
        assert_eq!(c("RENAMENX a b"), Reply::Int(1));
        assert_eq!(c("GET b"), bulk("1"));
        assert_eq!(c("RENAME b b"), Reply::Ok);
        assert!(err(c("RENAME nope x"), "ERR no such key"));
        // RENAME of a string over a hash removes the hash's fields.
        assert_eq!(c("RENAME b str"), Reply::Ok);
        assert_eq!(c("GET str"), bulk("1"));
        c("HSET str2 f x");
        assert_eq!(c("RENAME str2 str3"), Reply::Ok);
        assert_eq!(c("HGET str3 f"), bulk("x"));
        // UNLINK is DEL.
        c("SET u 1");
        assert_eq!(c("UNLINK u nope str3"), Reply::Int(2));
        // KEYS, FLUSHDB, FLUSHALL.
        c("SET key:1 a");
        c("SET key:2 b");
        c("HSET key:h f v");
        let Reply::Array(mut keys) = c("KEYS key:*") else { panic!("KEYS answers an array") };
        keys.sort_by_key(|k| format!("{k:?}"));
        assert_eq!(keys, vec![bulk("key:1"), bulk("key:2"), bulk("key:h")]);
        assert_eq!(c("KEYS nothing*"), Reply::Array(Vec::new()));
        let limited = Shared { max_output_bytes: 60, ..Shared::new(Arc::clone(&sh.db), None, None, 0).unwrap() };
        let mut s2 = Session::new(&limited);
        assert_eq!(cmd(&mut s2, &limited, &mut w, "KEYS key:[12]"), Reply::Array(vec![bulk("key:1"), bulk("key:2")]));
        assert!(
            matches!(cmd(&mut s2, &limited, &mut w, "KEYS key:*"), Reply::Error(e) if e.contains("max_output_bytes")),
            "three keys pass 60 bytes (29 each, counted as encoded)"
        );
        // One value named many times: MGET and HMGET stop copying at the limit.
        cmd(&mut s2, &limited, &mut w, &format!("SET big {}", "x".repeat(25)));
        cmd(&mut s2, &limited, &mut w, &format!("HSET hbig f {}", "y".repeat(25)));
        assert!(matches!(cmd(&mut s2, &limited, &mut w, "MGET big big"), Reply::Array(v) if v.len() == 2));
        assert!(matches!(cmd(&mut s2, &limited, &mut w, "HMGET hbig f f"), Reply::Array(v) if v.len() == 2));
        for over in ["MGET big big big", "HMGET hbig f f f"] {
            assert!(
                matches!(cmd(&mut s2, &limited, &mut w, over), Reply::Error(e) if e.contains("max_output_bytes")),
                "{over}: 75 bytes of values pass 60"
            );
        }
        // A whole hash too: within the limit it is answered, past it refused. Counted by
        // what the reply holds (not the fields' stored rows), each element sent 16 bytes
        // more than its bytes (as `Reply::wire_bytes`): one field of 1 byte and its value
        // of 25 are 58, within 60; two are 116, within 120; a third passes it, but for
        // HKEYS, which sends three names of 1 byte (51).
        assert!(matches!(cmd(&mut s2, &limited, &mut w, "HGETALL hbig"), Reply::Map(m) if m.len() == 1));
        let limited = Shared { max_output_bytes: 120, ..Shared::new(Arc::clone(&sh.db), None, None, 0).unwrap() };
        let mut s2 = Session::new(&limited);
        cmd(&mut s2, &limited, &mut w, &format!("HSET hbig g {}", "z".repeat(25)));
        assert!(matches!(cmd(&mut s2, &limited, &mut w, "HGETALL hbig"), Reply::Map(m) if m.len() == 2));
        cmd(&mut s2, &limited, &mut w, &format!("HSET hbig h {}", "z".repeat(25)));
        for over in ["HGETALL hbig", "HVALS hbig"] {
            assert!(
                matches!(cmd(&mut s2, &limited, &mut w, over), Reply::Error(e) if e.contains("max_output_bytes")),
                "{over}: three values of 25 bytes pass 120 with their framing"
            );
        }
        assert!(matches!(cmd(&mut s2, &limited, &mut w, "HKEYS hbig"), Reply::Array(v) if v.len() == 3));
        assert_eq!(cmd(&mut s2, &limited, &mut w, "HLEN hbig"), Reply::Int(3));
        // Empty values count their framing: before 2026-12-07 HVALS of any number of them
        // counted nothing, and copied them all.
        for i in 0..8 {
            cmd(&mut s2, &limited, &mut w, &format!("HSET hempty f{i} ")); // (an empty last argument)
        }
        assert!(
            matches!(cmd(&mut s2, &limited, &mut w, "HVALS hempty"), Reply::Error(e) if e.contains("max_output_bytes")),
            "eight empty values (128 bytes framed) pass 120"
        );
        assert_eq!(cmd(&mut s2, &limited, &mut w, "DEL hempty"), Reply::Int(1));
        // In EXEC, a command over the limit answers its error and the rest runs; the whole
        // reply is held to the limit too (each element counted 16 bytes more than its
        // strings), or the transaction is not run at all.
        let limited = Shared { max_output_bytes: 200, ..Shared::new(Arc::clone(&sh.db), None, None, 0).unwrap() };
        // Refused whole: the connection commands queued before the reply passed the limit
        // are undone too (their name and protocol), as Redis runs none of the queue.
        let mut s3 = Session::new(&limited);
        cmd(&mut s3, &limited, &mut w, "CLIENT SETNAME before");
        limited.write_gate.set_cluster_info(vec![
            ("cluster_phase".into(), "serving".into()),
            ("cluster_switchover".into(), "none".into()),
        ]);
        cmd(&mut s3, &limited, &mut w, "MULTI");
        cmd(&mut s3, &limited, &mut w, "SENTINEL failover ditto");
        cmd(&mut s3, &limited, &mut w, "CLIENT SETNAME x");
        cmd(&mut s3, &limited, &mut w, "HELLO 3");
        cmd(&mut s3, &limited, &mut w, "SELECT 2");
        for _ in 0..4 {
            cmd(&mut s3, &limited, &mut w, "GET big");
        }
        cmd(&mut s3, &limited, &mut w, &format!("MGET{}", " big".repeat(9)));
        assert!(matches!(cmd(&mut s3, &limited, &mut w, "EXEC"), Reply::Error(e) if e.contains("max_output_bytes")));
        assert_eq!(cmd(&mut s3, &limited, &mut w, "CLIENT GETNAME"), bulk("before"), "the queued SETNAME stayed");
        assert_eq!(s3.proto, Proto::Resp2, "the queued HELLO 3 stayed");
        assert_eq!(limited.write_gate.switchovers_asked(), 0, "the refused EXEC asked for a switchover");
        assert_eq!(cmd(&mut s3, &limited, &mut w, "GET big"), bulk(&"x".repeat(25)), "the queued SELECT stayed");
        let mut s2 = Session::new(&limited);
        cmd(&mut s2, &limited, &mut w, "MULTI");
        cmd(&mut s2, &limited, &mut w, &format!("MGET{}", " big".repeat(9)));
        cmd(&mut s2, &limited, &mut w, "GET big");
        match cmd(&mut s2, &limited, &mut w, "EXEC") {
            Reply::Array(r) => {
                assert!(matches!(&r[0], Reply::Error(e) if e.contains("max_output_bytes")), "{r:?}");
                assert_eq!(r[1], Reply::Bulk(Bytes::from("x".repeat(25))), "the rest of EXEC runs");
            }
            other => panic!("{other:?}"),
        }
        cmd(&mut s2, &limited, &mut w, "MULTI");
        cmd(&mut s2, &limited, &mut w, "SET marker 1");
        for _ in 0..6 {
            cmd(&mut s2, &limited, &mut w, "GET big");
        }
        assert!(
            matches!(cmd(&mut s2, &limited, &mut w, "EXEC"), Reply::Error(e) if e.contains("max_output_bytes") && e.contains("nothing of the transaction was written")),
            "six GETs of 25 bytes (41 each as counted) pass 200"
        );
        assert_eq!(cmd(&mut s2, &limited, &mut w, "GET marker"), Reply::Nil, "the refused EXEC wrote nothing");
        // A command that writes and answers the old value refuses before it writes when
        // that value's reply would pass the limit (before, the reply became the error
        // after the commit: GETDEL's value was gone).
        cmd(&mut s2, &limited, &mut w, &format!("SET huge {}", "h".repeat(190)));
        for over in ["GETDEL huge", "GETSET huge small", "SET huge small GET"] {
            assert!(
                matches!(cmd(&mut s2, &limited, &mut w, over), Reply::Error(e) if e.contains("max_output_bytes")),
                "{over}: a 190-byte value passes 200 with its framing"
            );
            assert_eq!(cmd(&mut s2, &limited, &mut w, "STRLEN huge"), Reply::Int(190), "{over} wrote nothing");
        }
        // In a transaction too: the whole of it is refused, nothing written.
        cmd(&mut s2, &limited, &mut w, "MULTI");
        cmd(&mut s2, &limited, &mut w, "GETDEL huge");
        cmd(&mut s2, &limited, &mut w, "SET taken 1");
        assert!(
            matches!(cmd(&mut s2, &limited, &mut w, "EXEC"), Reply::Error(e) if e.contains("nothing of the transaction was written")),
            "a GETDEL whose value passes the limit, in EXEC"
        );
        assert_eq!(cmd(&mut s2, &limited, &mut w, "GET taken"), Reply::Nil, "the rest of it was not written");
        assert_eq!(cmd(&mut s2, &limited, &mut w, "STRLEN huge"), Reply::Int(190));
        assert_eq!(cmd(&mut s2, &limited, &mut w, "DEL huge"), Reply::Int(1));
        // An EXEC's integers are counted as they may encode (up to 23 bytes), and its
        // array's header too: ten INCRBYs of a 19-digit counter answer 225 bytes, over 200,
        // and are not run (counted as 16 bytes each, they ran, and the reply was replaced
        // by an error after the commit).
        cmd(&mut s2, &limited, &mut w, "SET n 1000000000000000000");
        cmd(&mut s2, &limited, &mut w, "MULTI");
        for _ in 0..10 {
            cmd(&mut s2, &limited, &mut w, "INCRBY n 1");
        }
        assert!(
            matches!(cmd(&mut s2, &limited, &mut w, "EXEC"), Reply::Error(e) if e.contains("nothing of the transaction was written")),
            "ten INCRBYs answering 225 bytes pass 200"
        );
        assert_eq!(cmd(&mut s2, &limited, &mut w, "GET n"), Reply::Bulk(Bytes::from("1000000000000000000")));
        assert_eq!(cmd(&mut s2, &limited, &mut w, "DEL n"), Reply::Int(1));
        assert_eq!(cmd(&mut s2, &limited, &mut w, "DEL big hbig"), Reply::Int(2));
        let mut c = |line: &str| cmd(&mut s, &sh, &mut w, line);
        assert!(err(c("FLUSHDB NOW"), "ERR syntax error"));
        assert_eq!(c("DBSIZE"), Reply::Int(5), "pad, str and the three key:*");
        c("SELECT 2");
        c("SET other 1");
        c("HSET otherh f 1");
        c("SELECT 0");
        assert_eq!(c("FLUSHDB ASYNC"), Reply::Ok);
        assert_eq!(c("DBSIZE"), Reply::Int(0));
        assert_eq!(c("HGET key:h f"), Reply::Nil);
        c("SELECT 2");
        assert_eq!(c("DBSIZE"), Reply::Int(2), "FLUSHDB leaves other databases");
        assert_eq!(c("HGET otherh f"), bulk("1"));
        assert_eq!(c("FLUSHALL"), Reply::Ok);
        assert_eq!(c("DBSIZE"), Reply::Int(0));
        // No field row is left anywhere.
        let snap = sh.db.read();
        let mut fields = 0;
        snap.for_each(sh.ks.fields, std::ops::Bound::Unbounded, std::ops::Bound::Unbounded, |_, _| {
            fields += 1;
            true
        })
        .unwrap();
        assert_eq!(fields, 0);
    }

    /// SET's expiry options are refused before the command runs: queued in MULTI, the EXEC
    /// aborts and nothing of the transaction commits (it ran the rest without the SET);
    /// alone, the same error; NX, XX, GET and KEEPTTL still queue and run.
    #[test]
    fn a_set_with_expiry_queued_in_multi_aborts_the_exec() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        let r = cmd(&mut s, &sh, &mut w, "SET k v ex 60");
        assert!(matches!(&r, Reply::Error(e) if e.contains("key expiry")), "{r:?}");
        assert_eq!(cmd(&mut s, &sh, &mut w, "INCR c"), Reply::Simple("QUEUED"));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Error(e) if e.starts_with("EXECABORT")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXISTS k c"), Reply::Int(0), "nothing of the transaction ran");
        assert!(matches!(cmd(&mut s, &sh, &mut w, "SET k v PXAT 1"), Reply::Error(e) if e.contains("key expiry")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET k v NX GET KEEPTTL"), Reply::Simple("QUEUED"));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Array(_)));
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXISTS k"), Reply::Int(1));
    }

    /// RESET keeps the connection's last write (`DITTO.LASTCOMMIT`, what WAIT waits for),
    /// as Redis keeps a client's replication offset; the rest of the session starts anew.
    #[test]
    fn reset_keeps_the_connections_last_write() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET k v"), Reply::Ok);
        let last = s.last_commit;
        assert!(last > Ts(0));
        assert_eq!(cmd(&mut s, &sh, &mut w, "RESET"), Reply::Simple("RESET"));
        assert_eq!(s.last_commit, last, "RESET forgot the last write");
        assert!(!s.authed || sh.password.is_none(), "RESET deauthenticates");
    }

    /// A MULTI queue past `MULTI_QUEUE_BYTES_MAX` is refused at the request that passes it,
    /// its memory let go, and EXEC aborts; the connection goes on.
    #[test]
    fn a_multi_queue_is_bounded() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        let set =
            |key: &str, len: usize| vec![Bytes::from("SET"), Bytes::from(key.to_owned()), Bytes::from(vec![b'v'; len])];
        let half = MULTI_QUEUE_BYTES_MAX / 2;
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(s.handle(set("a", half - 200), &sh, &mut w).reply, Reply::Simple("QUEUED"));
        assert_eq!(s.handle(set("b", half - 200), &sh, &mut w).reply, Reply::Simple("QUEUED"), "just under");
        let over = s.handle(set("c", 200), &sh, &mut w).reply;
        assert!(matches!(&over, Reply::Error(e) if e.contains("MULTI queue over")), "{over:?}");
        assert!(s.multi.as_ref().is_some_and(Vec::is_empty), "the queue is let go at once");
        assert!(matches!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Error(e) if e.starts_with("EXECABORT")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXISTS a b c"), Reply::Int(0));
        // A new MULTI starts from nothing.
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(s.handle(set("a", half), &sh, &mut w).reply, Reply::Simple("QUEUED"));
        assert_eq!(cmd(&mut s, &sh, &mut w, "DISCARD"), Reply::Ok);
    }

    /// Over `maxmemory`, as Redis with `noeviction`: commands that may grow the data are
    /// refused with OOM and change nothing (alone, in a pipelined run, queued in MULTI, and
    /// EXEC of a queue holding one); reads, deletes and DISCARD still run. Under the limit
    /// again, everything runs.
    #[test]
    fn writes_that_may_grow_are_refused_over_maxmemory() {
        static USED: AtomicU64 = AtomicU64::new(0);
        let (mut sh, mut w) = setup();
        sh.memory = MemoryLimit { max: 1000, used: || USED.load(Ordering::Relaxed), rejections: AtomicU64::new(0) };
        let mut s = Session::new(&sh);
        let oom = |r: &Reply| matches!(r, Reply::Error(e) if e == OOM);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET a 1"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "HSET h f v"), Reply::Int(1));
        // Queued while under the limit, executed once over it.
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "INCR a"), Reply::Simple("QUEUED"));
        USED.store(1001, Ordering::Relaxed);
        let r = cmd(&mut s, &sh, &mut w, "EXEC");
        assert!(matches!(&r, Reply::Error(e) if e.starts_with("EXECABORT") && e.contains(OOM)), "{r:?}");
        assert!(s.multi.is_none(), "the transaction is discarded");
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET a"), Reply::Bulk(Bytes::from("1")), "the INCR did not run");
        for grows in [
            "SET b 1",
            "SETNX b 1",
            "GETSET a 2",
            "INCR a",
            "INCRBY a 2",
            "DECR a",
            "DECRBY a 2",
            "APPEND a x",
            "MSET b 1 c 2",
            "MSETNX b 1",
            "HSET h g v",
            "HMSET h g v",
            "HINCRBY h n 1",
            "SETRANGE a 5 x",
            "HSETNX h g v",
        ] {
            let r = cmd(&mut s, &sh, &mut w, grows);
            assert!(oom(&r), "{grows}: {r:?}");
        }
        let args = |k: &str| vec![Bytes::from("SET"), Bytes::from(k.to_owned()), Bytes::from("v")];
        assert_eq!(s.run_kind(&args("x"), &sh), None, "a pipelined SET goes alone, to be refused");
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET a"), Reply::Bulk(Bytes::from("1")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXISTS b c"), Reply::Int(0), "nothing refused was written");
        assert_eq!(cmd(&mut s, &sh, &mut w, "HLEN h"), Reply::Int(1));
        // Inside MULTI, queueing itself is refused (the queue grows), and EXEC then aborts.
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert!(oom(&cmd(&mut s, &sh, &mut w, "GET a")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "DISCARD"), Reply::Ok);
        // A client can make room.
        assert_eq!(cmd(&mut s, &sh, &mut w, "HDEL h f"), Reply::Int(1));
        assert_eq!(cmd(&mut s, &sh, &mut w, "RENAME a z"), Reply::Ok, "a rename moves, it does not grow");
        assert_eq!(cmd(&mut s, &sh, &mut w, "DEL z"), Reply::Int(1));
        assert_eq!(cmd(&mut s, &sh, &mut w, "FLUSHDB"), Reply::Ok);
        assert_eq!(sh.memory.rejections.load(Ordering::Relaxed), 17);
        let info = info(&[Bytes::from("memory")], &sh);
        for line in
            ["used_memory:1001\r\n", "maxmemory:1000\r\n", "maxmemory_policy:noeviction\r\n", "oom_rejections:17\r\n"]
        {
            assert!(info.contains(line), "{line:?} in {info}");
        }
        // `a`, `h` and `z` (RENAME's target) took three ids in the keys table; deleted, theirs
        // come back only once unlinked, which nothing here has asked for yet.
        assert!(info.contains("record_ids_allocated:3\r\n"), "{info}");
        assert!(info.contains("record_ids_used:3\r\n"), "{info}");
        assert!(info.contains(&format!("record_ids_max:{}\r\n", ditto_engine::RECORDS_PER_TABLE_MAX)), "{info}");
        USED.store(1000, Ordering::Relaxed);
        assert_eq!(s.run_kind(&args("x"), &sh), Some(RunKind::Set));
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET b 1"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "INCR b"), Reply::Simple("QUEUED"));
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Array(vec![Reply::Int(2)]));
    }

    /// WATCH of a key already watched keeps the first watch and costs nothing more; watched
    /// keys past `MULTI_QUEUE_BYTES_MAX` are refused and all unwatched.
    #[test]
    fn watched_keys_are_kept_once_and_bounded() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        for _ in 0..1000 {
            assert_eq!(cmd(&mut s, &sh, &mut w, "WATCH k j"), Reply::Ok);
        }
        assert_eq!(s.watched.len(), 2);
        assert_eq!(cmd(&mut s, &sh, &mut w, "UNWATCH"), Reply::Ok);
        assert!(s.watched.is_empty() && s.watched_bytes == 0);
        let key_len = 60 << 10;
        let n = MULTI_QUEUE_BYTES_MAX / (key_len + WATCHED_KEY_OVERHEAD) / 2 + 1;
        let watch = |tag: u8| {
            let mut args = vec![Bytes::from("WATCH")];
            args.extend((0..n).map(|i| {
                let mut k = vec![tag; key_len];
                k[..8].copy_from_slice(&(i as u64).to_be_bytes());
                Bytes::from(k)
            }));
            args
        };
        assert_eq!(s.handle(watch(b'a'), &sh, &mut w).reply, Reply::Ok, "just over half");
        let over = s.handle(watch(b'b'), &sh, &mut w).reply;
        assert!(matches!(&over, Reply::Error(e) if e.contains("watched keys over")), "{over:?}");
        assert!(s.watched.is_empty() && s.watched_bytes == 0, "every key unwatched");
        assert_eq!(cmd(&mut s, &sh, &mut w, "WATCH k"), Reply::Ok, "and watching works again");
    }

    #[test]
    fn scan_visits_every_key_once_across_cursors() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        for i in 0..57 {
            cmd(&mut s, &sh, &mut w, &format!("SET key:{i} v"));
        }
        cmd(&mut s, &sh, &mut w, "SET other v");
        let mut seen = Vec::new();
        let mut cursor = "0".to_string();
        for _ in 0..100 {
            let Reply::Array(parts) = cmd(&mut s, &sh, &mut w, &format!("SCAN {cursor} MATCH key:* COUNT 7")) else {
                panic!()
            };
            let (Reply::Bulk(c), Reply::Array(keys)) = (&parts[0], &parts[1]) else { panic!() };
            seen.extend(keys.iter().cloned());
            cursor = String::from_utf8(c.to_vec()).unwrap();
            if cursor == "0" {
                break;
            }
        }
        assert_eq!(cursor, "0", "the scan did not finish");
        assert_eq!(seen.len(), 57);
        assert!(cmd(&mut s, &sh, &mut w, "SCAN 999999").is_error());
    }

    /// A SCAN's reply stops early, with a cursor, once its keys take half of
    /// `max_output_bytes`: a large COUNT over large keys is answered in parts, and every
    /// key is still visited once. The cursors hold at most `CURSORS_BYTES_MAX` of keys.
    /// HGETALL, HKEYS and HVALS are held to `max_output_bytes` by what their reply holds:
    /// a long key's fields (each row repeats the key) and, for HKEYS, values it does not
    /// send, count for nothing. Before, a hash of 100 short fields under a key of 2,000
    /// bytes was refused at 64 KiB, and HKEYS of a hash of large values too.
    #[test]
    fn hash_replies_count_only_what_they_send() {
        let (sh, mut w) = setup();
        let limited = Shared { max_output_bytes: 64 << 10, ..Shared::new(Arc::clone(&sh.db), None, None, 0).unwrap() };
        let mut s = Session::new(&limited);
        let mut c = |line: &str| cmd(&mut s, &limited, &mut w, line);
        let long = "k".repeat(2000);
        for i in 0..100 {
            c(&format!("HSET {long} f{i:02} v"));
        }
        let Reply::Map(all) = c(&format!("HGETALL {long}")) else { panic!("HGETALL of 100 short fields refused") };
        assert_eq!(all.len(), 100);
        let Reply::Array(keys) = c(&format!("HKEYS {long}")) else { panic!("HKEYS refused") };
        assert_eq!(keys.len(), 100);
        // Values of 1 KiB: 100 KiB of them pass 64 KiB, the fields do not.
        let value = "x".repeat(1024);
        for i in 0..100 {
            c(&format!("HSET big f{i:02} {value}"));
        }
        let Reply::Array(keys) = c("HKEYS big") else { panic!("HKEYS of a hash of large values refused") };
        assert_eq!(keys[0], Reply::bulk("f00"));
        assert_eq!(keys.len(), 100);
        for refused in ["HVALS big", "HGETALL big"] {
            assert!(matches!(c(refused), Reply::Error(e) if e.contains("max_output_bytes")), "{refused}");
        }
    }

    #[test]
    fn scan_replies_are_bounded_in_bytes_and_so_are_the_cursors() {
        let (sh, mut w) = setup();
        let limited = Shared { max_output_bytes: 2000, ..Shared::new(Arc::clone(&sh.db), None, None, 0).unwrap() };
        let mut s = Session::new(&limited);
        for i in 0..20 {
            cmd(&mut s, &limited, &mut w, &format!("SET {i:02}{} v", "k".repeat(298)));
        }
        let (mut seen, mut cursor, mut calls) = (Vec::new(), "0".to_string(), 0);
        for _ in 0..100 {
            let Reply::Array(parts) = cmd(&mut s, &limited, &mut w, &format!("SCAN {cursor} COUNT 1000")) else {
                panic!()
            };
            let (Reply::Bulk(c), Reply::Array(keys)) = (&parts[0], &parts[1]) else { panic!() };
            assert!(keys.len() <= 4, "{} keys of 300 bytes in one reply, against 2000 bytes", keys.len());
            seen.extend(keys.iter().cloned());
            calls += 1;
            cursor = String::from_utf8(c.to_vec()).unwrap();
            if cursor == "0" {
                break;
            }
        }
        assert_eq!(cursor, "0", "the scan did not finish");
        assert!(calls >= 5, "{calls} calls");
        seen.sort_by_key(|k| format!("{k:?}"));
        seen.dedup();
        assert_eq!(seen.len(), 20, "every key once");
        let mut c = Cursors::default();
        for _ in 0..1000 {
            c.issue(0, Bytes::from(vec![b'k'; 64 << 10]));
        }
        assert!(c.bytes <= CURSORS_BYTES_MAX && c.by_id.len() == c.order.len(), "{} bytes", c.bytes);
        assert!(c.by_id.len() < 300, "{} cursors of 64 KiB keys kept", c.by_id.len());
    }

    #[test]
    fn a_read_only_node_refuses_writes_and_serves_reads() {
        let (mut sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET k v"), Reply::Ok);
        sh.read_only = true;
        assert!(matches!(cmd(&mut s, &sh, &mut w, "SET k w"), Reply::Error(e) if e.starts_with("READONLY")));
        assert!(matches!(cmd(&mut s, &sh, &mut w, "HSET h f v"), Reply::Error(e) if e.starts_with("READONLY")));
        // A write ditto would refuse anyway (SET's expiry) is READONLY here, as in Redis.
        assert!(matches!(cmd(&mut s, &sh, &mut w, "SET k v EX 1"), Reply::Error(e) if e.starts_with("READONLY")));
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k"), Reply::bulk("v"));
        // Inside MULTI a write is refused at once and the EXEC aborts.
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert!(cmd(&mut s, &sh, &mut w, "DEL k").is_error());
        assert!(matches!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Error(e) if e.starts_with("EXECABORT")));
    }

    /// A cluster's backup that started from more than its primary had released: data
    /// reads answer LOADING until the release reaches its start; other commands go on.
    #[test]
    fn a_backups_data_is_not_read_until_its_start_is_released() {
        let (mut sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET k v"), Reply::Ok);
        let state = Arc::new(ditto_replication::BackupState::default());
        state.reads_from.store(10, Ordering::Release);
        state.released.store(9, Ordering::Release);
        sh.read_only = true;
        sh.replication = Replication::Backup { state: Arc::clone(&state), primary: "p:1".into() };
        for read in ["GET k", "DBSIZE", "EXISTS k", "SCAN 0", "KEYS *"] {
            assert!(matches!(cmd(&mut s, &sh, &mut w, read), Reply::Error(e) if e.starts_with("LOADING")), "{read}");
        }
        assert!(!cmd(&mut s, &sh, &mut w, "PING").is_error());
        state.released.store(10, Ordering::Release);
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k"), Reply::bulk("v"));
        // A read queued while reads were open, or a watched key, makes EXEC a read: held
        // again (a cut to follow a new primary), it is refused, and so is a pipelined run
        // of GETs (not formed: each GET goes alone).
        let args = |line: &str| line.split(' ').map(|a| Bytes::copy_from_slice(a.as_bytes())).collect::<Vec<_>>();
        assert!(!s.read_held(&args("GET k"), &sh) && s.run_kind(&args("GET k"), &sh) == Some(RunKind::Get));
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k"), Reply::Simple("QUEUED"));
        // Queued, a read is not run again should reads become held meanwhile (it would be
        // queued twice); EXEC is the one that reads.
        assert_eq!(s.read_gate(&args("GET k"), &sh), None);
        assert_eq!(s.read_gate(&args("EXEC"), &sh), Some(0));
        state.reads_from.store(u64::MAX, Ordering::Release);
        assert!(s.read_held(&args("EXEC"), &sh), "EXEC waits for the release");
        let r = cmd(&mut s, &sh, &mut w, "EXEC");
        assert!(matches!(&r, Reply::Error(e) if e.contains("LOADING")), "{r:?}");
        state.reads_from.store(0, Ordering::Release);
        assert_eq!(cmd(&mut s, &sh, &mut w, "WATCH k"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        state.reads_from.store(u64::MAX, Ordering::Release);
        let r = cmd(&mut s, &sh, &mut w, "EXEC");
        assert!(matches!(&r, Reply::Error(e) if e.contains("LOADING")), "{r:?}");
        assert_eq!(s.run_kind(&args("GET k"), &sh), None);
        assert!(s.read_held(&args("GET k"), &sh) && !s.read_held(&args("PING"), &sh));
        // INFO keyspace counts no keys meanwhile (DBSIZE is refused).
        assert!(
            matches!(cmd(&mut s, &sh, &mut w, "INFO keyspace"), Reply::Text(b) if !b.windows(5).any(|x| x == b"keys="))
        );
        state.reads_from.store(0, Ordering::Release);
        assert!(
            matches!(cmd(&mut s, &sh, &mut w, "INFO keyspace"), Reply::Text(b) if b.windows(5).any(|x| x == b"keys="))
        );
        state.reads_from.store(u64::MAX, Ordering::Release);
        // Its gate's generation, which its server compares before and after a read.
        assert_eq!(s.read_gate(&args("GET k"), &sh), Some(0));
        assert_eq!(s.read_gate(&args("PING"), &sh), None);
    }

    /// An EXEC on a backup whose gate moved after its server looked (a change of role) is
    /// answered "run it again" before a queued command acting outside the connection runs
    /// (SENTINEL FAILOVER: its switchover is not asked for), and the connection is as it
    /// was; with the gate as its server saw it, that command runs and the EXEC says it
    /// compared the gate (its server then keeps the reply, whatever the gate did since).
    #[test]
    fn an_exec_whose_backup_changed_role_runs_nothing_that_acts_outside() {
        let (mut sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET k v"), Reply::Ok);
        let state = Arc::new(ditto_replication::BackupState::default());
        sh.read_only = true;
        sh.replication = Replication::Backup { state: Arc::clone(&state), primary: "p:1".into() };
        sh.write_gate.set_cluster_info(vec![
            ("cluster_phase".into(), "serving".into()),
            ("cluster_switchover".into(), "none".into()),
        ]);
        let queue = |s: &mut Session, w: &mut Worker| {
            assert_eq!(cmd(s, &sh, w, "MULTI"), Reply::Ok);
            for line in ["GET k", "CLIENT SETNAME x", "SENTINEL failover ditto", "GET k"] {
                assert_eq!(cmd(s, &sh, w, line), Reply::Simple("QUEUED"), "{line}");
            }
        };
        queue(&mut s, &mut w);
        let seen = state.gate_gen.load(Ordering::Acquire);
        state.gate_gen.fetch_add(1, Ordering::AcqRel);
        s.set_exec_gate(Some(seen));
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::err(EXEC_ROLE_CHANGED));
        assert_eq!(sh.write_gate.switchovers_asked(), 0, "the switchover was asked for");
        assert!(!s.exec_gate_checked());
        assert_eq!(cmd(&mut s, &sh, &mut w, "CLIENT GETNAME"), Reply::Nil, "the queued SETNAME stayed");
        queue(&mut s, &mut w);
        s.set_exec_gate(Some(state.gate_gen.load(Ordering::Acquire)));
        assert_eq!(
            cmd(&mut s, &sh, &mut w, "EXEC"),
            Reply::Array(vec![Reply::bulk("v"), Reply::Ok, Reply::Ok, Reply::bulk("v")])
        );
        assert_eq!(sh.write_gate.switchovers_asked(), 1);
        assert!(s.exec_gate_checked() && !s.exec_gate_checked(), "told once");
    }

    /// A cluster's primary without quorum contact: its write gate refuses writes with the
    /// reason (runs of SETs too), reads go on, and opening it takes writes again.
    #[test]
    fn a_closed_write_gate_refuses_writes_with_its_reason() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET k v"), Reply::Ok);
        sh.write_gate.set(Some("no quorum contact".into()));
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET k w"), Reply::err("READONLY no quorum contact"));
        assert_eq!(s.run_kind(&[Bytes::from("SET"), Bytes::from("k"), Bytes::from("w")], &sh), None);
        assert!(cmd(&mut s, &sh, &mut w, "INCR n").is_error());
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k"), Reply::bulk("v"));
        sh.write_gate.set(None);
        assert_eq!(cmd(&mut s, &sh, &mut w, "SET k w"), Reply::Ok);
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k"), Reply::bulk("w"));
        // Writes queued while open, the gate closed before EXEC: nothing is written.
        assert_eq!(cmd(&mut s, &sh, &mut w, "MULTI"), Reply::Ok);
        cmd(&mut s, &sh, &mut w, "SET k queued");
        sh.write_gate.set(Some("no quorum contact".into()));
        assert!(
            matches!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Error(e) if e.starts_with("EXECABORT") && e.contains("no quorum contact"))
        );
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET k"), Reply::bulk("w"));
    }

    /// A drain that ends by itself ends only itself: one left over from a switchover given
    /// up cannot open the writes of a later drain.
    #[test]
    fn a_drain_that_ends_by_itself_leaves_a_later_one_in_force() {
        let gate = WriteGate::default();
        let first = gate.drain_to(&ClientAddr::new("10.0.0.8:7002", None), |a| format!("to {a}"));
        let second = gate.drain_to(&ClientAddr::new("10.0.0.9:7002", None), |a| format!("to {a}"));
        gate.end_drain(first);
        assert!(gate.draining() && gate.refusal().is_some(), "the later drain was ended by the first");
        assert_eq!(gate.handing_to().map(|t| t.plain), Some("10.0.0.9:7002".to_string()));
        gate.end_drain(second);
        assert!(!gate.draining() && gate.refusal().is_none() && gate.handing_to().is_none());
        // The supervisor's own reason stays through a drain's end.
        gate.set(Some("no quorum".into()));
        let third = gate.drain_to(&ClientAddr::new("10.0.0.9:7002", None), |a| format!("to {a}"));
        gate.end_drain(third);
        assert!(gate.refusal().is_some(), "the supervisor's reason went with the drain");
    }

    /// A gate opened until a deadline closes by itself when it passes, with no word from
    /// the supervisor; a later deadline or "writes on" opens it again, and a drain or the
    /// supervisor's reason refuses whatever the deadline.
    #[test]
    fn a_gate_open_until_a_deadline_closes_by_itself() {
        let at = monotonic_ms_of(std::time::Instant::now());
        assert!(at <= monotonic_ms() && monotonic_ms() <= at + 50, "the two clocks agree");
        let later = monotonic_ms_of(std::time::Instant::now() + std::time::Duration::from_secs(60));
        assert!((59_950..=60_050).contains(&(later - monotonic_ms())), "{later}");
        let gate = WriteGate::default();
        gate.set(Some("not yet".into()));
        gate.open_until(monotonic_ms() + 200);
        assert_eq!(gate.refusal(), None);
        std::thread::sleep(std::time::Duration::from_millis(250));
        assert_eq!(gate.refusal().as_deref(), Some(LEASE_RAN_OUT), "closed by itself");
        gate.open_until(monotonic_ms() + 60_000);
        assert_eq!(gate.refusal(), None);
        let drain = gate.drain_to(&ClientAddr::new("10.0.0.9:7002", None), |a| format!("to {a}"));
        assert_eq!(gate.refusal().as_deref(), Some("to 10.0.0.9:7002"));
        gate.end_drain(drain);
        assert_eq!(gate.refusal(), None, "open again until its deadline");
        gate.open_until(monotonic_ms());
        assert_eq!(gate.refusal().as_deref(), Some(LEASE_RAN_OUT));
        gate.set(None);
        assert_eq!(gate.refusal(), None, "writes on: no deadline");
        gate.open_until(monotonic_ms());
        gate.set(Some("no quorum".into()));
        assert_eq!(gate.refusal().as_deref(), Some("no quorum"));
        // Lapsed: past the deadline, or closed by the supervisor; not by a drain alone.
        assert!(gate.lapsed());
        gate.open_until(monotonic_ms() + 60_000);
        assert!(!gate.lapsed());
        let drain = gate.drain_to(&ClientAddr::new("10.0.0.9:7002", None), |a| format!("to {a}"));
        assert!(!gate.lapsed(), "a drain is no lapse");
        gate.end_drain(drain);
        gate.open_until(monotonic_ms());
        assert!(gate.lapsed());
        gate.set(None);
        assert!(!gate.lapsed());
    }

    /// A write whose command passed the gate but that committed once the lease had run out
    /// (its thread held up between the two) is committed but not acknowledged; a read, or a
    /// write within the lease, is answered as ever.
    #[test]
    fn a_write_that_commits_after_the_lease_ran_out_is_not_acknowledged() {
        let (sh, mut w) = setup();
        let key = Keyspace::key_row(0, b"k");
        let write = |w: &mut Worker, v: &[u8]| {
            let mut txn = begin(&sh, w);
            txn.put(sh.ks.keys, &key, v).unwrap();
            commit_counted(&sh, txn)
        };
        sh.write_gate.open_until(monotonic_ms() + 60_000);
        assert!(write(&mut w, b"1").is_ok());
        // The gate checked open, then the deadline passed before the commit.
        sh.write_gate.open_until(monotonic_ms());
        let e = write(&mut w, b"2").unwrap_err();
        assert!(matches!(e, Error::NotAcknowledged(_)) && !e.is_retryable(), "{e:?}");
        let mut txn = begin(&sh, &mut w);
        assert_eq!(txn.get(sh.ks.keys, &key).unwrap().as_deref(), Some(&b"2"[..]), "committed all the same");
        assert!(commit_counted(&sh, txn).is_ok(), "a read is answered");
        sh.write_gate.set(None);
        assert!(write(&mut w, b"3").is_ok(), "no deadline");
    }

    /// An HMGET of many absent fields under a long key is refused with a clear error once
    /// what its transaction holds passes the engine's bound (each absent field's row, which
    /// repeats the key, is kept for the phantom check): before, 7 MB of request could make
    /// the server hold tens of GB. The session goes on, and the hash is as it was.
    #[test]
    fn an_hmget_of_many_absent_fields_under_a_long_key_is_refused_not_held_whole() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        let key = Bytes::from(vec![b'k'; 65_000]);
        let args = |v: &[&[u8]]| v.iter().map(|a| Bytes::copy_from_slice(a)).collect::<Vec<_>>();
        let set = s.handle(args(&[b"HSET", &key, b"f", b"v"]), &sh, &mut w).reply;
        assert_eq!(set, Reply::Int(1));
        let mut hmget = args(&[b"HMGET", &key]);
        // (Enough to pass the bound: each absent field keeps a row of 65,000 bytes and more.)
        let fields = ditto_engine::TXN_HELD_BYTES_MAX / 65_000 + 100;
        hmget.extend(std::iter::repeat_n(Bytes::from_static(b"absent"), fields));
        let r = s.handle(hmget, &sh, &mut w).reply;
        let limit = format!("over the limit of {}", ditto_engine::TXN_HELD_BYTES_MAX);
        assert!(
            matches!(&r, Reply::Error(e) if e.starts_with("ERR what the transaction holds") && e.contains(&limit)),
            "{r:?}"
        );
        // A few absent fields are answered as ever.
        let few = s.handle(args(&[b"HMGET", &key, b"f", b"absent"]), &sh, &mut w).reply;
        assert_eq!(few, Reply::Array(vec![Reply::Bulk(Bytes::from("v")), Reply::Nil]));
    }

    /// A run of SETs that committed once the lease had run out is answered as each SET
    /// alone is (committed, not acknowledged), and is not run again: run again one by one,
    /// each was answered READONLY though written, or written twice had the gate opened.
    #[test]
    fn a_run_of_sets_that_commits_after_the_lease_ran_out_is_not_acknowledged_nor_run_again() {
        let (sh, mut w) = setup();
        let mut s = Session::new(&sh);
        let req =
            |line: &str| -> Vec<Bytes> { line.split(' ').map(|a| Bytes::copy_from_slice(a.as_bytes())).collect() };
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        let sets: Vec<Vec<Bytes>> = ["SET a 1", "SET b 2", "SET a 3"].iter().map(|l| req(l)).collect();
        sh.write_gate.open_until(monotonic_ms() + 60_000);
        assert!(sets.iter().all(|r| s.run_kind(r, &sh) == Some(RunKind::Set)), "collected while the gate was open");
        // Then the deadline passed before the run's commit.
        sh.write_gate.open_until(monotonic_ms());
        let out = s.handle_run(RunKind::Set, &sets, usize::MAX, &sh, &mut w);
        assert_eq!(out.len(), 3);
        for o in &out {
            assert!(
                matches!(&o.reply, Reply::Error(e) if e.starts_with("ERR this write committed after") && e.contains(LEASE_RAN_OUT)),
                "{:?}",
                o.reply
            );
            assert_eq!(o.wait, Ts::ZERO, "answered at once");
        }
        sh.write_gate.set(None);
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET a"), Reply::Bulk(Bytes::from("3")), "committed all the same");
        assert_eq!(cmd(&mut s, &sh, &mut w, "GET b"), Reply::Bulk(Bytes::from("2")));
    }

    /// SENTINEL answers for the service `ditto` with the primary the node knows, and for
    /// nothing else; INFO cluster says whether the node is a cluster's.
    #[test]
    fn sentinel_names_the_primary_and_info_cluster_the_supervisors_view() {
        let (mut sh, mut w) = setup();
        let mut s = Session::new(&sh);
        cmd(&mut s, &sh, &mut w, "AUTH sesame");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SENTINEL get-master-addr-by-name ditto"), Reply::NilArray);
        sh.primary_addr = Some(ClientAddr::new("10.0.0.7:7001", Some("10.0.0.7:7301".into())));
        // A client over TLS is told the TLS address (the same session, as if so connected).
        let mut t = Session::new(&sh);
        t.tls = true;
        cmd(&mut t, &sh, &mut w, "AUTH sesame");
        let addr =
            |s: &mut Session, sh: &Shared, w: &mut Worker| cmd(s, sh, w, "SENTINEL get-master-addr-by-name ditto");
        let at = |h: &str, p: &str| Reply::Array(vec![Reply::bulk(h.to_string()), Reply::bulk(p.to_string())]);
        assert_eq!(addr(&mut s, &sh, &mut w), at("10.0.0.7", "7001"));
        assert_eq!(addr(&mut t, &sh, &mut w), at("10.0.0.7", "7301"));
        cmd(&mut t, &sh, &mut w, "RESET");
        cmd(&mut t, &sh, &mut w, "AUTH sesame");
        assert_eq!(addr(&mut t, &sh, &mut w), at("10.0.0.7", "7301"), "RESET keeps what the connection is");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SENTINEL get-master-addr-by-name other"), Reply::NilArray);
        // A switchover's drain names the node it hands the role to, until the drain ends.
        sh.write_gate
            .drain_to(&ClientAddr::new("10.0.0.8:7002", Some("10.0.0.8:7302".into())), |_| "handing over".into());
        assert_eq!(addr(&mut s, &sh, &mut w), at("10.0.0.8", "7002"));
        assert_eq!(addr(&mut t, &sh, &mut w), at("10.0.0.8", "7302"));
        assert!(cmd(&mut s, &sh, &mut w, "SET k v").is_error(), "writes refused while drained");
        // The drain's refusal names the target by the address of the client's kind.
        let target = ClientAddr::new("10.0.0.8:7002", Some("10.0.0.8:7302".into()));
        sh.write_gate.drain_to(&target, |a| format!("handing the role to {a}"));
        let refused = |s: &mut Session, w: &mut Worker| match cmd(s, &sh, w, "SET k v") {
            Reply::Error(e) => e.to_string(),
            r => panic!("not refused: {r:?}"),
        };
        assert!(refused(&mut s, &mut w).ends_with("handing the role to 10.0.0.8:7002"));
        assert!(refused(&mut t, &mut w).ends_with("handing the role to 10.0.0.8:7302"));
        sh.write_gate.end_drains();
        assert_eq!(addr(&mut s, &sh, &mut w), at("10.0.0.7", "7001"));
        // A primary whose TLS address is not known: a TLS client is told the plaintext one.
        sh.primary_addr = Some(ClientAddr::new("10.0.0.7:7001", None));
        assert_eq!(addr(&mut t, &sh, &mut w), at("10.0.0.7", "7001"));
        let Reply::Array(masters) = cmd(&mut s, &sh, &mut w, "SENTINEL masters") else { panic!("an array") };
        let Reply::Map(m) = &masters[0] else { panic!("a map per master") };
        assert!(m.contains(&(Reply::bulk("flags"), Reply::bulk("master"))));
        assert!(m.contains(&(Reply::bulk("port"), Reply::bulk("7001"))));
        assert!(cmd(&mut s, &sh, &mut w, "SENTINEL master other").is_error());
        assert_eq!(cmd(&mut s, &sh, &mut w, "SENTINEL replicas ditto"), Reply::Array(Vec::new()));
        assert!(cmd(&mut s, &sh, &mut w, "SENTINEL failover ditto").is_error(), "not a cluster node");
        assert!(cmd(&mut s, &sh, &mut w, "SENTINEL failover other").is_error());
        let Reply::Text(b) = cmd(&mut s, &sh, &mut w, "INFO cluster") else { panic!("text") };
        assert!(std::str::from_utf8(&b).unwrap().contains("cluster_enabled:0"));
        sh.write_gate.set_cluster_info(vec![("cluster_epoch".into(), "3".into())]);
        let Reply::Text(b) = cmd(&mut s, &sh, &mut w, "INFO cluster") else { panic!("text") };
        let text = std::str::from_utf8(&b).unwrap();
        assert!(text.contains("cluster_enabled:1\r\ncluster_epoch:3\r\n"), "{text}");
        // A cluster node: asked while a switchover is under way, it says so; else +OK.
        sh.write_gate.set_cluster_info(vec![
            ("cluster_phase".into(), "serving".into()),
            ("cluster_switchover".into(), "1->2".into()),
        ]);
        let r = cmd(&mut s, &sh, &mut w, "SENTINEL failover ditto");
        assert!(matches!(&r, Reply::Error(e) if e.starts_with("INPROG")), "{r:?}");
        sh.write_gate.set_cluster_info(vec![
            ("cluster_phase".into(), "serving".into()),
            ("cluster_switchover".into(), "none".into()),
        ]);
        assert_eq!(cmd(&mut s, &sh, &mut w, "SENTINEL failover ditto"), Reply::Ok);
        assert_eq!(sh.write_gate.switchovers_asked(), 1);
        // Queued, it is asked only once the EXEC commits, its reply in its place; an EXEC
        // that answers nil (a watched key changed) asks nothing.
        let mut other = Session::new(&sh);
        cmd(&mut other, &sh, &mut w, "AUTH sesame");
        cmd(&mut s, &sh, &mut w, "WATCH fk");
        cmd(&mut s, &sh, &mut w, "MULTI");
        assert_eq!(cmd(&mut s, &sh, &mut w, "SENTINEL failover ditto"), Reply::Simple("QUEUED"));
        cmd(&mut s, &sh, &mut w, "SET fj 1");
        cmd(&mut other, &sh, &mut w, "SET fk 2");
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::NilArray);
        assert_eq!(sh.write_gate.switchovers_asked(), 1, "an EXEC that answered nil asked for a switchover");
        cmd(&mut s, &sh, &mut w, "MULTI");
        cmd(&mut s, &sh, &mut w, "SET fj 1");
        cmd(&mut s, &sh, &mut w, "SENTINEL failover ditto");
        assert_eq!(cmd(&mut s, &sh, &mut w, "EXEC"), Reply::Array(vec![Reply::Ok, Reply::Ok]));
        assert_eq!(sh.write_gate.switchovers_asked(), 2);
    }

    #[test]
    fn glob_follows_redis() {
        for (p, s, m) in [
            ("*", "", true),
            ("a*c", "abbbc", true),
            ("a*c", "abbb", false),
            ("h?llo", "hello", true),
            ("h[ae]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("k\\*", "k*", true),
            ("k\\*", "kx", false),
            ("*:*:x", "a:b:c:x", true),
            ("[a-]", "_", true),
            ("[a-]", "-", false),
            ("[a-]", "a", true),
            ("[a-c]", "-", false),
            // The empty key: Redis 7.0.15's KEYS answers it for `*` and the empty pattern
            // only.
            ("", "", true),
            ("**", "", false),
            ("*?", "", false),
            ("a*", "a", true),
            ("a**", "a", true),
            ("", "a", false),
        ] {
            assert_eq!(glob_match(p.as_bytes(), s.as_bytes()), m, "{p} vs {s}");
        }
    }
}
