//! ditto's hot standby
//! ===================
//! Log shipping from a primary to its backups, commit policies, parallel replay, and
//! consistent, fresh reads on backups (Query Fresh 3.1-3.4, Rolis 3.3-3.5, KuaFu,
//! ScyPer's one-to-many propagation). Between the log and the server:
//!
//! ```text
//!  primary: Logger --ShipTap--> Primary (primary.rs) --TCP frames (protocol.rs)--> backup
//!           server releases at release_watermark(policy, Holdings) (policy.rs) <--acks--+
//!  backup:  receive -> replica log (ditto_log::replica) -> ack -> replay (backup.rs)
//!           read view = min(released, replayed prefix) (watermark.rs) -> snapshots
//! ```
//!
//! Pure parts (no I/O, tested step by step): `protocol` (frames), `policy` (who must hold
//! a commit), `watermark` (the watermark of a prefix of batches, in order or completed out
//! of order), `proof` (a peer's proof that it holds the cluster secret, never sent). I/O parts: `primary`, `backup` (blocking TCP on threads of their own; the
//! server's tokio runtime is not involved).
//!
//! Not here: failover and the control plane (crates/cluster), which tells a server whom to
//! follow or whether to serve: a backup follows one primary and its epoch, and stops
//! (saying so) if that primary restarts into a new epoch or can no longer serve what the
//! backup lacks.

pub mod backup;
pub mod cpu;
pub mod dependency;
pub mod identity;
pub mod policy;
pub mod primary;
pub mod proof;
pub mod protocol;
pub mod restart;
pub mod tls;
pub mod unhelloed;
pub mod watermark;

pub use backup::{
    parse_replay, replay_recorded, Backup, BackupError, BackupOptions, BackupState, JoinAgain, JoinCancel, ReplayMode,
    ReplayRun,
};
pub use policy::{blocked_by, release_watermark, settle_watermark, CommitPolicy, Holdings, Level, Scope};
pub use primary::{BackupInfo, Primary, PrimaryOptions};
pub use restart::{restart_settled, QuorumRecord};

/// Whether the failpoint `name` is set in `DITTO_FAILPOINTS` (comma-separated, read once
/// per process), for the tests that make a step fail between real processes: a backup's
/// `replay-fails` (every batch's replay fails once done), and the server's
/// (crates/server/src/server.rs, `failpoint`).
pub fn failpoint(name: &str) -> bool {
    static SET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SET.get_or_init(|| std::env::var("DITTO_FAILPOINTS").unwrap_or_default()).split(',').any(|p| p == name)
}
