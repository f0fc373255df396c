//! Server configuration: a TOML file, with command-line flags over it
//! ==================================================================
//! Every key is optional; see `docs/server.md` for the list with defaults. Unknown keys are
//! an error (a misspelt `requirepass` must not leave a server open).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ditto_log::{CheckpointPolicy, Durability};
use serde::Deserialize;

use crate::resp::Limits;
use crate::tls::TlsFiles;

/// The longest TLS handshake a setting may allow (an hour): a larger one would wait on a
/// silent peer for good, in effect, and overflow the time arithmetic of the waits built on
/// it.
const TLS_HANDSHAKE_TIMEOUT_S_MAX: u64 = 3600;
/// The longest `fsync_interval_ms`.
const FSYNC_INTERVAL_MS_MAX: u64 = 60_000;
/// The longest `waitts_timeout_ms` taken: a day.
const WAITTS_TIMEOUT_MS_MAX: u64 = 86_400_000;
/// The longest `checkpoint_interval_s` taken: a year.
const CHECKPOINT_INTERVAL_S_MAX: u64 = 366 * 86_400;

/// The longest `tcp_keepalive_s` taken (Linux's limit on a socket's keepalive idle time).
const TCP_KEEPALIVE_S_MAX: u64 = 32_767;

/// The largest `max_request_bytes` taken (see `validate`).
const MAX_REQUEST_BYTES_CAP: usize = 1 << 30;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address to listen on. Loopback unless set otherwise.
    pub bind: String,
    pub port: u16,
    /// The durable data directory (log, checkpoints). Required.
    pub data_dir: Option<PathBuf>,
    /// Engine workers = server threads = log streams.
    pub workers: usize,
    /// `every-batch` (group commit: each stream fsyncs what accumulated while its previous
    /// fsync ran, back to back), `interval` (group commit, fsync every
    /// `fsync_interval_ms`), or `nosync` (write every interval, never fsync: survives a
    /// process crash, not an OS crash). Both fsync modes acknowledge a write only once it
    /// is fsynced; every-batch is the default because it answers sooner and serves more
    /// (docs/server.md has the figures), and costs no fsyncs while idle.
    pub durability: String,
    pub fsync_interval_ms: u64,
    /// The time slice, in us, that the threads on a commit's path ask the kernel for (the
    /// log's flushers and disk threads, a backup's receiver, persister and replay acker;
    /// a primary's links and ack readers have `link_thread_slice_us`): on a core the workers keep busy, a woken one
    /// then runs within about this instead of the running worker's whole slice (1.4 ms on
    /// 2 CPUs, 3.75 on 16). Lower commit latency and backup lag, for less throughput when
    /// the workers saturate their cores (smaller batches). Linux 6.12 and later; older
    /// kernels ignore it (`INFO server` says). 0 (the default): the kernel's default; else
    /// 100 to 100,000 (docs/replication.md, "Short time slices for the commit path").
    pub commit_thread_slice_us: u64,
    /// The time slice, in us, that a primary's replication links and ack readers ask for,
    /// as `commit_thread_slice_us` for the commit path's threads. Each of their wake-ups is
    /// a send or an ack read of a few microseconds, so running them at once costs little,
    /// and a primary's releases and the lag it reports wait for them. 300 by default; 0:
    /// the kernel's default (docs/replication.md, "A short slice for the links").
    pub link_thread_slice_us: u64,
    /// LZ4 per log batch (off by default: CPU for a few bytes, docs/durability.md).
    pub compress_log: bool,
    /// Seconds between online checkpoints (0: not by time). Checkpoints also start sooner,
    /// on the two triggers below (`ditto_log::CheckpointPolicy`).
    pub checkpoint_interval_s: u64,
    /// Checkpoint once the log written since the last checkpoint reaches this percentage of
    /// that checkpoint's size (0: not by log growth; Redis's `auto-aof-rewrite-percentage`)...
    pub checkpoint_log_growth_percent: u64,
    /// ...and at least this many bytes (Redis's `auto-aof-rewrite-min-size`).
    pub checkpoint_log_min_bytes: u64,
    /// Checkpoint once this many deleted records' ids, and at least as many as are in use,
    /// wait for one to be reused (0: not by ids).
    pub checkpoint_reuse_min_ids: u64,
    /// The most a checkpoint written while the server serves (periodic, after a
    /// failover's seal, a backup's own, SAVE) writes a second, in MB (10^6 bytes); 0: as
    /// fast as the disk takes it. Unpaced, a checkpoint of hundreds of MB fills the disk's
    /// queue and every commit's fsync waits behind it (docs/cluster.md, "Paced
    /// checkpoints"); paced, it takes at least its size / this.
    pub checkpoint_write_mb_per_s: u64,
    /// The same for a backup's own checkpoints (written while it follows a primary), lower
    /// by default: they compete on the backup's disk with the fsyncs of its replica log,
    /// which every commit under a `durable` policy waits for, and nothing waits for them
    /// (docs/replication.md, "A held snapshot no longer slows replay"). 0: unpaced.
    pub backup_checkpoint_write_mb_per_s: u64,
    /// A cluster's backup replays only what its primary released; of what it holds until
    /// then, at most this many MB (10^6 bytes) stay in memory, the rest is read back from
    /// its replica log when released (docs/replication.md, "Replay held at the release").
    pub replay_held_memory_mb: u64,
    /// A primary's checkpoints keep the log its backups have not made durable, up to this
    /// many MB (10^6 bytes), so that one that returns resumes from the log and a failover
    /// can fetch from it (docs/cluster.md, "The log kept for backups"); 0: none kept.
    pub log_keep_for_backups_mb: u64,
    /// A log segment file is closed at this size and a new one begun; a checkpoint deletes
    /// only closed segments it covers (at least 4096).
    pub log_segment_bytes: u64,
    /// Clients must AUTH with this password (user `default`). A primary asks it of its
    /// backups too (their `masterauth`): a backup receives everything a client could read.
    pub requirepass: Option<String>,
    /// On a backup (`replica_of`): the password its primary asks of backups, the primary's
    /// `requirepass` (Redis's name). Never shown by CONFIG GET.
    pub masterauth: Option<String>,
    pub max_clients: usize,
    pub max_args: usize,
    pub max_request_bytes: usize,
    pub max_inline_bytes: usize,
    /// Replies buffered for one connection before the server stops reading its requests
    /// and writes them out; one reply larger than this is refused with an error. Also what
    /// it reads ahead of a connection's requests while that write waits for room in the
    /// socket (`server::write_reading_ahead`).
    pub max_output_bytes: usize,
    /// `host:port` of the Prometheus endpoint, or `off`.
    pub metrics: String,
    /// Also listen for TLS clients on this port (0: any free port). Needs `tls_cert_file`
    /// and `tls_key_file`.
    pub tls_port: Option<u16>,
    /// Serve TLS clients only: no plaintext listener on `port`.
    pub tls_only: bool,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates client certificates must chain to (with `tls_auth_clients`).
    pub tls_ca_cert_file: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by `tls_ca_cert_file`.
    pub tls_auth_clients: bool,
    /// Seconds a TLS client has to finish its handshake (and a node, on a link between nodes).
    pub tls_handshake_timeout_s: u64,
    /// TCP keepalive on clients' connections (Redis's `tcp-keepalive`, 300 by default): a
    /// connection idle this many seconds is probed, every third of it, and closed after
    /// three probes unanswered, so that a client whose host died or whose network dropped
    /// the flow frees its slot (`max_clients`) and buffers. 0: off.
    pub tcp_keepalive_s: u64,
    /// TLS on replication links (Redis's `tls-replication`): a backup dials its primary
    /// with TLS and a primary takes only TLS backups, each showing `tls_cert_file` and
    /// checking the other's against `tls_ca_cert_file`; a backup also checks that the
    /// certificate names the host it dialed (docs/replication.md, "TLS between nodes").
    pub tls_replication: bool,
    /// TLS on a cluster node's control port (Redis's `tls-cluster`), between nodes and
    /// from `ditto cluster`, with the same files (docs/cluster.md).
    pub tls_cluster: bool,
    /// Run as a backup (hot standby) of the primary whose replication port is at host:port:
    /// read-only, replaying its log (docs/replication.md).
    pub replica_of: Option<String>,
    /// On a primary: accept backups on this port (0: any free one) on `bind`.
    pub repl_port: Option<u16>,
    /// When a write is acknowledged: local, majority, all (each -durable or -received).
    pub commit_policy: String,
    /// Backups the commit policy counts (a missing one holds nothing).
    pub backups: usize,
    /// On a backup: `serial`, `parallel` or `dependency` replay (`dependency:N`: a barrier
    /// every N transactions, 0 for none; see crates/replication/src/dependency.rs), and
    /// `+shared` to share replayed values with their received batch instead of copying
    /// them (`+shared:N`: values of N bytes or more; Query Fresh's log-as-database).
    pub replay: String,
    /// How long DITTO.WAITTS waits: on a backup for the read view to reach its timestamp,
    /// on a primary for its release (docs/server.md, "Commit timestamps for clients").
    pub waitts_timeout_ms: u64,
    /// Over this much memory in use, commands that may grow the data are refused with
    /// `-OOM` (Redis's `noeviction`; `memory.rs`). A size in Redis's units (`"4gb"`, or
    /// bytes), `0` for none, or `"auto"` (the default): three quarters of the machine's
    /// memory or the cgroup's limit, whichever is lower.
    pub maxmemory: MaxMemory,
    /// What measures the memory in use: set by the binary, which installs the counting
    /// allocator (`ditto_engine::alloc::Counting`). A `maxmemory` without it is refused.
    #[serde(skip)]
    pub used_memory: Option<fn() -> u64>,
    /// Set by a cluster node's supervisor for the run it starts (docs/cluster.md), never by
    /// a config file.
    #[serde(skip)]
    pub cluster: Option<ClusterRun>,
    /// Writes refused while it is closed (a cluster node's supervisor holds it).
    #[serde(skip)]
    pub write_gate: Option<std::sync::Arc<crate::session::WriteGate>>,
    /// The name this server's backups give their primary (`Hello::node`; default
    /// `bind:port`): a cluster node's client address as the control state has it, which
    /// its primary counts by (`Primary::set_counted_nodes`). Kept through every change
    /// of role.
    #[serde(skip)]
    pub replica_name: Option<String>,
    /// Open a backup's data directory as a primary's (`--promote`): its checkpoint and
    /// its replica log up to its cut, in an epoch above the one it followed. Without it,
    /// such a directory is refused as a primary's (`ditto_log::LogError::WrongRole`).
    #[serde(skip)]
    pub promote: bool,
    /// Set by a cluster node for its server (never by the file): the cluster secret,
    /// which its backups give their primary and its primary asks of its backups, in place
    /// of `masterauth` and `requirepass` (docs/cluster.md, "The cluster secret").
    #[serde(skip)]
    pub link_secret: Option<String>,
    /// With `link_secret`: others its primary also takes of backups while the cluster's
    /// secret is rotated.
    #[serde(skip)]
    pub link_secret_also: Vec<String>,
}

/// One run of a cluster node's server, as its control plane decided it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterRun {
    /// The epoch this run serves: a primary writes it as its log epoch.
    pub epoch: u64,
    /// A primary: new commit timestamps start above this.
    pub ts_above: u64,
    /// Recover at most up to this timestamp (a failover's recovery point): what this node
    /// holds above it is discarded. A primary started from a backup's directory turns it
    /// into a checkpoint at this point first.
    pub upto: Option<u64>,
    /// A primary: the epoch that `upto` cut. Its backups holding exactly `upto` resume
    /// from the log.
    pub resume_epoch: Option<u64>,
    /// A primary promoted from a backup's directory that followed an epoch older than
    /// `resume_epoch`: that epoch and each after it up to `resume_epoch`, exclusive, with
    /// the points failovers cut them at. Their batches above, which those failovers
    /// discarded, are not replayed.
    pub epoch_cuts: Vec<ditto_log::replica::EpochCut>,
    /// A backup: where the primary takes clients' writes.
    pub primary_addr: Option<ClientAddr>,
    /// A primary: the membership configuration its `backups` count stands for.
    pub members_config: u64,
    /// A backup: replay only what the primary released, so that a failover can promote
    /// it, or have it follow the next primary, in place (docs/cluster.md).
    pub hold_replay_at_release: bool,
    /// A backup that is a cluster's learner: its primary counts it in no quorum.
    pub learner: bool,
}

/// The `maxmemory` setting: a size in Redis's units (a string such as `"512mb"`, or an
/// integer of bytes), or `"auto"`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum MaxMemory {
    Bytes(u64),
    Text(String),
}

impl MaxMemory {
    /// The limit in bytes (0: none).
    pub fn bytes(&self) -> Result<u64, ConfigError> {
        match self {
            MaxMemory::Bytes(n) => Ok(*n),
            MaxMemory::Text(t) if t.eq_ignore_ascii_case("auto") => {
                Ok(crate::memory::physical_memory().map_or(0, |m| m / 4 * 3))
            }
            MaxMemory::Text(t) => crate::memory::parse_size(t).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "maxmemory {t:?}: expected \"auto\", 0 (no limit) or a size such as 4gb, 512mb or a number of bytes"
                ))
            }),
        }
    }
}

/// The default number of workers (runtime threads, log streams): one fewer than the cores,
/// at least one, at most 64. The spare core runs what a commit needs besides the request
/// (each stream's flusher and disk thread, a primary's links and ack readers, a backup's
/// receiver, persister and replayers) and the kernel's network work. Measured on two cores
/// (docs/server.md, "Workers on a small machine"): one worker served SET without pipelining
/// with a backup at `interval` 30% faster than two, at a fifth less CPU per SET (the two
/// runtime threads spent 15% of their time switching), and GET and pipelined requests as
/// fast or faster; on many cores it is one thread among many.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1)).clamp(1, 64)
}

impl Default for Config {
    fn default() -> Self {
        let limits = Limits::default();
        Config {
            bind: "127.0.0.1".into(),
            port: 6379,
            data_dir: None,
            workers: default_workers(),
            durability: "every-batch".into(),
            fsync_interval_ms: 10,
            commit_thread_slice_us: 0,
            link_thread_slice_us: 300,
            compress_log: false,
            checkpoint_interval_s: 300,
            checkpoint_log_growth_percent: 100,
            checkpoint_log_min_bytes: 64 << 20,
            checkpoint_reuse_min_ids: 100_000,
            checkpoint_write_mb_per_s: 128,
            backup_checkpoint_write_mb_per_s: 32,
            replay_held_memory_mb: 256,
            log_keep_for_backups_mb: 1024,
            log_segment_bytes: 64 << 20,
            requirepass: None,
            masterauth: None,
            max_clients: 10_000,
            max_args: limits.max_args,
            max_request_bytes: limits.max_request_bytes,
            max_inline_bytes: limits.max_inline_bytes,
            max_output_bytes: 64 << 20,
            metrics: "127.0.0.1:9379".into(),
            tls_port: None,
            tls_only: false,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_cert_file: None,
            tls_auth_clients: false,
            tls_handshake_timeout_s: 10,
            tcp_keepalive_s: 300,
            tls_replication: false,
            tls_cluster: false,
            replica_of: None,
            repl_port: None,
            commit_policy: "local".into(),
            backups: 0,
            replay: "parallel".into(),
            waitts_timeout_ms: 5000,
            maxmemory: MaxMemory::Text("auto".into()),
            used_memory: None,
            cluster: None,
            write_gate: None,
            replica_name: None,
            promote: false,
            link_secret: None,
            link_secret_also: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {source}")]
    Parse { path: PathBuf, source: Box<toml::de::Error> },
    #[error("config: {0}")]
    Invalid(String),
}

/// Whether a backup's name may hold `c`: the quorum's record keeps one name a line, and
/// INFO lists backups with commas.
pub(crate) fn replica_name_char(c: char) -> bool {
    !c.is_control() && c != ','
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.into(), source: Box::new(source) })
    }

    /// The slice the commit path's threads ask for (`None`: the kernel's default).
    /// (`validate` refuses a value out of the kernel's range.)
    pub fn commit_thread_slice(&self) -> Option<Duration> {
        ditto_log::sched::slice_from_us(self.commit_thread_slice_us).ok().flatten()
    }

    /// The slice a primary's links and ack readers ask for (`None`: the kernel's default).
    pub fn link_thread_slice(&self) -> Option<Duration> {
        ditto_log::sched::slice_from_us(self.link_thread_slice_us).ok().flatten()
    }

    pub fn durability(&self) -> Result<Durability, ConfigError> {
        let d = Duration::from_millis(self.fsync_interval_ms);
        match self.durability.as_str() {
            "interval" => Ok(Durability::Interval(d)),
            "every-batch" => Ok(Durability::EveryBatch),
            "nosync" => Ok(Durability::NoSync(d)),
            other => Err(ConfigError::Invalid(format!(
                "durability {other:?}: expected \"interval\", \"every-batch\" or \"nosync\""
            ))),
        }
    }

    /// When to checkpoint (see the fields' notes).
    pub fn checkpoint_policy(&self) -> CheckpointPolicy {
        CheckpointPolicy {
            every: (self.checkpoint_interval_s > 0).then(|| Duration::from_secs(self.checkpoint_interval_s)),
            log_growth_percent: self.checkpoint_log_growth_percent,
            log_min_bytes: self.checkpoint_log_min_bytes,
            reuse_min_ids: self.checkpoint_reuse_min_ids,
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_args: self.max_args,
            max_request_bytes: self.max_request_bytes,
            max_inline_bytes: self.max_inline_bytes,
            unauthenticated: false,
        }
    }

    /// The commit policy.
    pub fn policy(&self) -> Result<ditto_replication::CommitPolicy, ConfigError> {
        ditto_replication::CommitPolicy::parse(&self.commit_policy).map_err(ConfigError::Invalid)
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.durability()?;
        self.policy()?;
        self.tls()?;
        self.node_tls()?;
        ditto_replication::parse_replay(&self.replay).map_err(ConfigError::Invalid)?;
        if self.promote && (self.replica_of.is_some() || self.cluster.is_some()) {
            return Err(ConfigError::Invalid(
                "--promote opens a backup's directory as a standalone primary's: not with --replica-of, nor on a cluster node (whose failovers promote)".into(),
            ));
        }
        if let Some(n) = &self.replica_name {
            if n.trim().is_empty() || !n.chars().all(replica_name_char) {
                return Err(ConfigError::Invalid(format!(
                    "--replica-name {n:?}: a backup's name must not be empty, nor hold a comma or a control character"
                )));
            }
        }
        if self.replica_of.is_some() && self.repl_port.is_some() {
            return Err(ConfigError::Invalid(
                "a backup (replica_of) does not accept backups itself (repl_port)".into(),
            ));
        }
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if self.data_dir.is_none() {
            return bad("data_dir is required (--data-dir or data_dir in the config file)");
        }
        if self.workers == 0 || self.workers > 64 {
            return bad("workers must be 1..=64");
        }
        if self.max_args == 0 || self.max_request_bytes < 1024 || self.max_inline_bytes < 64 {
            return bad("max_args must be >= 1, max_request_bytes >= 1024, max_inline_bytes >= 64");
        }
        // (Past 4 GiB one argument's length no longer fits the index's u32 key length, and a
        // GET of such a key panicked before the engine's own limit refused it; Redis caps
        // its proto-max-bulk-len at 512 MB. Found by a review.)
        if self.max_request_bytes > MAX_REQUEST_BYTES_CAP {
            return bad("max_request_bytes must be <= 1073741824 (1 GiB)");
        }
        if self.tcp_keepalive_s > TCP_KEEPALIVE_S_MAX {
            return bad(&format!("tcp_keepalive_s must be 0 (off) to {TCP_KEEPALIVE_S_MAX}"));
        }
        if self.max_output_bytes < 1024 {
            return bad("max_output_bytes must be >= 1024");
        }
        // Found by a review (2026-12-05), each accepted before: an inline request's
        // argument is bounded by `max_inline_bytes` alone, so past `max_request_bytes` it
        // passed the cap above; no client could connect with `max_clients = 0`; a backup's
        // every read raced a zero `waitts_timeout_ms` (its read view moves only while a
        // read waits) and failed now and then; a checkpoint interval past what a clock
        // instant holds panicked the backup's checkpointer.
        if self.max_inline_bytes > self.max_request_bytes {
            return bad("max_inline_bytes must be <= max_request_bytes");
        }
        if self.max_clients == 0 {
            return bad("max_clients must be >= 1");
        }
        if !(1..=WAITTS_TIMEOUT_MS_MAX).contains(&self.waitts_timeout_ms) {
            return bad(&format!("waitts_timeout_ms must be between 1 and {WAITTS_TIMEOUT_MS_MAX} (a day)"));
        }
        if self.checkpoint_interval_s > CHECKPOINT_INTERVAL_S_MAX {
            return bad(&format!(
                "checkpoint_interval_s must be at most {CHECKPOINT_INTERVAL_S_MAX} (a year; 0: by log growth only)"
            ));
        }
        // (A pace past a million MB/s is no pace; past u64::MAX bytes it would overflow.)
        if self.checkpoint_write_mb_per_s > 1_000_000 || self.backup_checkpoint_write_mb_per_s > 1_000_000 {
            return bad(
                "checkpoint_write_mb_per_s and backup_checkpoint_write_mb_per_s must be <= 1000000 (0: unpaced)",
            );
        }
        if !(4096..=ditto_log::options::SEGMENT_BYTES_LIMIT).contains(&self.log_segment_bytes) {
            return bad(&format!(
                "log_segment_bytes must be between 4096 and {} (1 GiB)",
                ditto_log::options::SEGMENT_BYTES_LIMIT
            ));
        }
        if !(1..=1_000_000).contains(&self.replay_held_memory_mb) {
            return bad("replay_held_memory_mb must be between 1 and 1000000");
        }
        if self.fsync_interval_ms == 0 && self.durability != "every-batch" {
            return bad("fsync_interval_ms must be >= 1");
        }
        // A commit under `interval`, a backup's `durable` acknowledgement and its replay
        // (what reads on it see) each wait up to one interval.
        if self.fsync_interval_ms > FSYNC_INTERVAL_MS_MAX {
            return bad(&format!("fsync_interval_ms must be at most {FSYNC_INTERVAL_MS_MAX} (a minute)"));
        }
        if let Err(e) = ditto_log::sched::slice_from_us(self.commit_thread_slice_us) {
            return bad(&format!("commit_thread_slice_us {e}"));
        }
        if let Err(e) = ditto_log::sched::slice_from_us(self.link_thread_slice_us) {
            return bad(&format!("link_thread_slice_us {e}"));
        }
        if self.requirepass.as_deref() == Some("") {
            return bad("requirepass is empty: remove it for no password");
        }
        if self.masterauth.as_deref() == Some("") {
            return bad("masterauth is empty: remove it for no password");
        }
        if self.maxmemory.bytes()? != 0 && self.used_memory.is_none() {
            return bad("maxmemory needs the memory in use measured (the ditto binary's counting allocator); \
                        set maxmemory = 0 for no limit");
        }
        self.tls()?;
        Ok(())
    }

    /// What CONFIG GET shows, in Redis's parameter names where there is one (`durability`
    /// and `fsync-interval-ms` are ditto's). Never the password.
    pub fn view(&self) -> Vec<(String, String)> {
        let appendfsync = match self.durability.as_str() {
            // Both fsync before the reply, which is what Redis calls "always".
            "every-batch" | "interval" => "always",
            _ => "no",
        };
        let mut v = vec![
            ("bind", self.bind.clone()),
            ("port", if self.tls_only { "0".into() } else { self.port.to_string() }),
            ("databases", crate::session::DATABASES.to_string()),
            ("maxclients", self.max_clients.to_string()),
            ("tcp-keepalive", self.tcp_keepalive_s.to_string()),
            ("appendonly", "yes".into()),
            ("appendfsync", appendfsync.into()),
            ("save", String::new()),
            ("durability", self.durability.clone()),
            ("fsync-interval-ms", self.fsync_interval_ms.to_string()),
            ("commit-thread-slice-us", self.commit_thread_slice_us.to_string()),
            ("link-thread-slice-us", self.link_thread_slice_us.to_string()),
            ("proto-max-bulk-len", self.max_request_bytes.to_string()),
            ("client-output-buffer-limit", format!("normal {} {} 0", self.max_output_bytes, self.max_output_bytes)),
            ("maxmemory", self.maxmemory.bytes().unwrap_or(0).to_string()),
            ("maxmemory-policy", "noeviction".into()),
        ];
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
        v.push(("tls-replication", yes_no(self.tls_replication)));
        v.push(("tls-cluster", yes_no(self.tls_cluster)));
        if let Some(p) = self.tls_port {
            v.push(("tls-port", p.to_string()));
            v.push(("tls-auth-clients", if self.tls_auth_clients { "yes" } else { "no" }.into()));
        }
        v.into_iter().map(|(k, val)| (k.to_string(), val)).collect()
    }

    /// The TLS files when `tls_port` is set; `None` for a plaintext-only server.
    pub fn tls(&self) -> Result<Option<TlsFiles>, ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        let Some(_) = self.tls_port else {
            let files = self.tls_cert_file.is_some() || self.tls_key_file.is_some() || self.tls_ca_cert_file.is_some();
            let stray = self.tls_only || self.tls_auth_clients || (files && !self.tls_replication && !self.tls_cluster);
            // TLS settings without a TLS port would leave a server that looks secured
            // serving plaintext only.
            return if stray {
                bad("tls_* settings need tls_port (or, for the files alone, tls_replication or tls_cluster)")
            } else {
                Ok(None)
            };
        };
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else {
            return bad("tls_port needs tls_cert_file and tls_key_file");
        };
        if self.tls_auth_clients && self.tls_ca_cert_file.is_none() {
            return bad("tls_auth_clients needs tls_ca_cert_file");
        }
        if !(1..=TLS_HANDSHAKE_TIMEOUT_S_MAX).contains(&self.tls_handshake_timeout_s) {
            return bad(&format!("tls_handshake_timeout_s must be 1 to {TLS_HANDSHAKE_TIMEOUT_S_MAX}"));
        }
        Ok(Some(TlsFiles {
            cert_file: cert.clone(),
            key_file: key.clone(),
            ca_cert_file: self.tls_ca_cert_file.clone(),
            auth_clients: self.tls_auth_clients,
        }))
    }

    /// The files of TLS between nodes when `tls_replication` or `tls_cluster` is set: the
    /// certificate, its key and the CA are all needed, since each side checks the other.
    pub fn node_tls(&self) -> Result<Option<TlsFiles>, ConfigError> {
        if !self.tls_replication && !self.tls_cluster {
            return Ok(None);
        }
        let (Some(cert), Some(key), Some(ca)) = (&self.tls_cert_file, &self.tls_key_file, &self.tls_ca_cert_file)
        else {
            return Err(ConfigError::Invalid(
                "tls_replication and tls_cluster need tls_cert_file, tls_key_file and tls_ca_cert_file: each node shows its certificate and checks the other's against the CA".into(),
            ));
        };
        if !(1..=TLS_HANDSHAKE_TIMEOUT_S_MAX).contains(&self.tls_handshake_timeout_s) {
            return Err(ConfigError::Invalid(format!(
                "tls_handshake_timeout_s must be 1 to {TLS_HANDSHAKE_TIMEOUT_S_MAX}"
            )));
        }
        Ok(Some(TlsFiles {
            cert_file: cert.clone(),
            key_file: key.clone(),
            ca_cert_file: Some(ca.clone()),
            auth_clients: true,
        }))
    }
}

/// Where clients reach a server: its plaintext address (host:port) and, where known, its
/// TLS one. A client is told the address of its own kind (`for_client`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientAddr {
    pub plain: String,
    pub tls: Option<String>,
}

/// The plaintext address: what names the node (a backup's node is its client address).
impl std::fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.plain)
    }
}

impl ClientAddr {
    pub fn new(plain: impl Into<String>, tls: Option<String>) -> ClientAddr {
        ClientAddr { plain: plain.into(), tls }
    }

    /// The address to tell a client connected over TLS (`tls`) or plaintext: a TLS client
    /// is told the TLS address where it is known, else the plaintext one (which a client
    /// that speaks only TLS must then map itself).
    pub fn for_client(&self, tls: bool) -> &str {
        match (&self.tls, tls) {
            (Some(t), true) => t,
            _ => &self.plain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What CONFIG GET can show: the settings clients probe, and never the password.
    #[test]
    fn the_config_view_never_shows_the_password() {
        let c: Config =
            toml::from_str("port = 7000\ndata_dir = \"/tmp/x\"\nrequirepass = \"sesame-9\"\nmasterauth = \"open-10\"")
                .unwrap();
        let view = c.view();
        assert!(view.iter().any(|(k, v)| k == "port" && v == "7000"), "{view:?}");
        assert!(view.iter().all(|(k, v)| k != "requirepass" && !v.contains("sesame-9")), "{view:?}");
        assert!(view.iter().all(|(k, v)| k != "masterauth" && !v.contains("open-10")), "{view:?}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(toml::from_str::<Config>("requirepas = \"x\"").is_err());
        let c: Config = toml::from_str("port = 7000\ndata_dir = \"/tmp/x\"\ndurability = \"sometimes\"").unwrap();
        assert!(c.validate().is_err());
        let mut c: Config = toml::from_str("port = 7000\ndata_dir = \"/tmp/x\"\nrequirepass = \"pw\"").unwrap();
        assert!(c.validate().is_err(), "maxmemory (auto) with nothing to measure memory by");
        c.used_memory = Some(crate::memory::allocated_bytes);
        c.validate().unwrap();
        assert_eq!((c.port, c.requirepass.as_deref(), c.bind.as_str()), (7000, Some("pw"), "127.0.0.1"));
        assert!(Config::default().validate().is_err(), "no data_dir");
        // An empty password is refused, not taken for none.
        for key in ["requirepass", "masterauth"] {
            let mut c: Config = toml::from_str(&format!("port = 7000\ndata_dir = \"/tmp/x\"\n{key} = \"\"")).unwrap();
            c.used_memory = Some(crate::memory::allocated_bytes);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("{key} is empty")), "{e}");
        }
        // One argument longer than the index's u32 key length is refused at the start.
        let mut c: Config =
            toml::from_str("port = 7000\ndata_dir = \"/tmp/x\"\nmax_request_bytes = 4294967296").unwrap();
        c.used_memory = Some(crate::memory::allocated_bytes);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("max_request_bytes must be <="), "{e}");
        c.max_request_bytes = 1 << 30;
        c.validate().unwrap();
        // Values that broke the server at run time are refused at the start (a review,
        // 2026-12-05); the edges taken.
        for (setting, refused) in [
            ("max_inline_bytes = 2147483648", "max_inline_bytes must be <= max_request_bytes"),
            ("max_clients = 0", "max_clients must be >= 1"),
            ("waitts_timeout_ms = 0", "waitts_timeout_ms must be between 1"),
            ("waitts_timeout_ms = 86400001", "waitts_timeout_ms must be between 1"),
            ("checkpoint_interval_s = 9223372036854775807", "checkpoint_interval_s must be at most"),
        ] {
            let mut c: Config = toml::from_str(&format!("port = 7000\ndata_dir = \"/tmp/x\"\n{setting}")).unwrap();
            c.used_memory = Some(crate::memory::allocated_bytes);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(refused), "{setting}: {e}");
        }
        for setting in ["max_clients = 1", "waitts_timeout_ms = 1", "checkpoint_interval_s = 31622400"] {
            let mut c: Config = toml::from_str(&format!("port = 7000\ndata_dir = \"/tmp/x\"\n{setting}")).unwrap();
            c.used_memory = Some(crate::memory::allocated_bytes);
            c.validate().unwrap_or_else(|e| panic!("{setting}: {e}"));
        }
    }

    #[test]
    fn maxmemory_takes_redis_sizes_auto_or_none() {
        let parse = |v: &str| toml::from_str::<Config>(&format!("maxmemory = {v}")).unwrap().maxmemory.bytes();
        assert_eq!(parse("\"512mb\"").unwrap(), 512 << 20);
        assert_eq!(parse("1000000").unwrap(), 1_000_000);
        assert_eq!(parse("0").unwrap(), 0);
        let auto = parse("\"auto\"").unwrap();
        let physical = crate::memory::physical_memory().unwrap();
        assert!(auto > 0 && auto <= physical / 4 * 3, "{auto} of {physical}");
        let e = parse("\"lots\"").unwrap_err().to_string();
        assert!(e.contains("maxmemory \"lots\""), "{e}");
        assert!(toml::from_str::<Config>("maxmemory = -1").is_err());
        // With no limit there is nothing to measure, so no gauge is needed.
        let c: Config = toml::from_str("data_dir = \"/tmp/x\"\nmaxmemory = 0").unwrap();
        c.validate().unwrap();
        let view = Config { used_memory: Some(crate::memory::allocated_bytes), ..c }.view();
        assert!(view.iter().any(|(k, v)| k == "maxmemory" && v == "0"), "{view:?}");
    }

    #[test]
    fn checkpoint_triggers_come_from_the_config() {
        let d = Config::default().checkpoint_policy();
        assert_eq!(d, CheckpointPolicy::default());
        let c: Config = toml::from_str(
            "checkpoint_interval_s = 0\ncheckpoint_log_growth_percent = 50\ncheckpoint_log_min_bytes = 1024\n\
             checkpoint_reuse_min_ids = 0",
        )
        .unwrap();
        let p = c.checkpoint_policy();
        assert_eq!(p, CheckpointPolicy { every: None, log_growth_percent: 50, log_min_bytes: 1024, reuse_min_ids: 0 });
        assert!(p.any());
        // A backup's own checkpoints have a pace of their own, lower by default.
        assert_eq!(
            (Config::default().checkpoint_write_mb_per_s, Config::default().backup_checkpoint_write_mb_per_s),
            (128, 32)
        );
        let c: Config = toml::from_str("backup_checkpoint_write_mb_per_s = 8").unwrap();
        assert_eq!((c.checkpoint_write_mb_per_s, c.backup_checkpoint_write_mb_per_s), (128, 8));
        let c: Config = toml::from_str("checkpoint_write_mb_per_s = 18446744073710").unwrap();
        assert!(c.validate().is_err(), "a pace that overflows in bytes per second");
        // What a held backup keeps in memory: 256 MB by default, at least 1.
        assert_eq!(Config::default().replay_held_memory_mb, 256);
        for (mb, ok) in [(0, false), (8, true), (1_000_001, false)] {
            let mut c: Config =
                toml::from_str(&format!("port = 7000\ndata_dir = \"/tmp/x\"\nreplay_held_memory_mb = {mb}")).unwrap();
            c.used_memory = Some(crate::memory::allocated_bytes);
            match c.validate() {
                Ok(()) => assert!(ok, "{mb} MB taken"),
                Err(e) => assert!(!ok && e.to_string().contains("replay_held_memory_mb"), "{mb} MB: {e}"),
            }
        }
    }

    #[test]
    fn tls_settings_must_be_complete() {
        let base = "data_dir = \"/tmp/x\"\n";
        let check = |extra: &str| {
            let c = toml::from_str::<Config>(&format!("{base}{extra}")).unwrap();
            Config { used_memory: Some(crate::memory::allocated_bytes), ..c }.validate()
        };
        assert!(check("tls_only = true").is_err(), "tls_only without a TLS port");
        assert!(check("tls_cert_file = \"a\"").is_err(), "a certificate without a TLS port");
        assert!(check("tls_port = 0").is_err(), "no certificate");
        assert!(check("tls_port = 0\ntls_cert_file = \"a\"").is_err(), "no key");
        check("tls_port = 0\ntls_cert_file = \"a\"\ntls_key_file = \"b\"").unwrap();
        // A handshake limit of 0, or past an hour (the largest would overflow the waits built on it).
        for t in [0, 3601, i64::MAX as u64] {
            let e = check(&format!(
                "tls_port = 0\ntls_cert_file = \"a\"\ntls_key_file = \"b\"\ntls_handshake_timeout_s = {t}"
            ));
            assert!(e.is_err_and(|e| e.to_string().contains("1 to 3600")), "{t}");
        }
        assert!(check("tls_port = 0\ntls_cert_file = \"a\"\ntls_key_file = \"b\"\ntls_auth_clients = true").is_err());
        // TCP keepalive: 0 (off) to Linux's limit on its idle time.
        check("tcp_keepalive_s = 0").unwrap();
        check("tcp_keepalive_s = 32767").unwrap();
        for t in [32_768, u64::MAX / 2] {
            let e = check(&format!("tcp_keepalive_s = {t}"));
            assert!(e.is_err_and(|e| e.to_string().contains("0 (off) to 32767")), "{t}");
        }
        // An fsync interval past a minute (commits, a backup's durable acks and its replay
        // wait up to one; the largest overflowed the backup's pacing).
        check("durability = \"interval\"\nfsync_interval_ms = 60000").unwrap();
        for ms in [60_001, u64::MAX / 2] {
            let e = check(&format!("durability = \"interval\"\nfsync_interval_ms = {ms}"));
            assert!(e.is_err_and(|e| e.to_string().contains("at most 60000")), "{ms}");
        }
        // Between nodes: the three files, and no TLS port needed.
        let files = "tls_cert_file = \"a\"\ntls_key_file = \"b\"\ntls_ca_cert_file = \"c\"\n";
        for on in ["tls_replication = true\n", "tls_cluster = true\n"] {
            check(&format!("{on}{files}")).unwrap();
            let e = check(&format!("{on}tls_cert_file = \"a\"\ntls_key_file = \"b\"\n")).unwrap_err().to_string();
            assert!(e.contains("tls_ca_cert_file"), "{e}");
            assert!(check(&format!("{on}tls_ca_cert_file = \"c\"\n")).is_err(), "no certificate");
            // (The client port's own settings still need their port.)
            assert!(check(&format!("{on}{files}tls_only = true\n")).is_err());
        }
        let e = check(files).unwrap_err().to_string();
        assert!(e.contains("need tls_port"), "files with no use: {e}");
    }
}
