//! Engine errors. Each variant says whether retrying the transaction can help.

use std::sync::Arc;

use crate::ids::TableId;

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Validation failed or a record was unlinked under us: run the transaction again.
    #[error("transaction conflict: {0}; retry")]
    Conflict(&'static str),
    /// `insert` of a key that is present.
    #[error("key already exists")]
    KeyExists,
    /// `update` of a key that is absent.
    #[error("key not found")]
    KeyNotFound,
    #[error("no such table {0:?}")]
    NoSuchTable(TableId),
    #[error("table {0:?} already exists")]
    TableExists(String),
    #[error("too many tables (limit {0})")]
    TooManyTables(usize),
    /// The table has handed out (nearly) all its record ids and has none to reuse yet (ids
    /// of deleted records come back once a durable checkpoint covers their deletes). Updates
    /// and deletes still run. Not retryable.
    #[error("table {table} is out of record ids ({max}; the ids of deleted records come back after a checkpoint)")]
    OutOfRecordIds { table: String, max: u64 },
    /// A write in a snapshot (read-only) transaction, as on a backup. Not retryable.
    #[error("a read-only transaction cannot write")]
    ReadOnly,
    #[error("{what} is {len} bytes, over the limit of {max}")]
    TooLarge { what: &'static str, len: usize, max: usize },
    /// Recovered state is inconsistent (a present record without a key, ...): the log or
    /// checkpoint it came from is damaged. Recovery stops; nothing is started on it.
    #[error("recovered state is inconsistent: {0}")]
    Corrupt(String),
    /// The log could not make commits durable (failed fsync, full disk, ...). The database
    /// refuses writes from then on; restart recovers from what is durable. A commit that
    /// gets this error while waiting has an unknown outcome: it was never acknowledged, but
    /// its bytes may have reached the disk. Not retryable.
    #[error("log failure, writes stopped (outcome of commits in flight unknown): {0}")]
    LogFailed(Arc<str>),
    /// The transaction committed, but its caller will not acknowledge it: a cluster
    /// primary's lease ran out while it committed (its server checked the write gate
    /// before, and the thread was held up past the deadline), so a new primary may have
    /// begun taking writes meanwhile (docs/cluster.md, "The old primary's lease"). Its
    /// outcome is unknown to the client (a failover may discard it). Not retryable.
    #[error("this write committed after the node's lease as primary ran out, and is not acknowledged (its outcome is unknown): {0}")]
    NotAcknowledged(Arc<str>),
    /// A replayed write stopped waiting for the read view because its caller said so
    /// (`Database::replay_install_with`'s `on_wait` returned false); its value is not
    /// installed, and installing it again later is safe.
    #[error("replayed write at ts {0} put off while it waits for the read view")]
    ReplayPutOff(u64),
}

impl Error {
    /// True where running the same transaction again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Conflict(_))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs `body`, catching a panic in it: `Err` with what the panic said (its message where
/// it is a string, as `panic!` makes it). For the threads that turn a panic into a
/// failure they report (the log's, a backup's, replay's).
pub fn catch_panic<T>(body: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into())
    })
}
