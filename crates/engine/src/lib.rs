//! ditto's engine
//! ==============
//! A multi-core, in-memory, multi-version store of ordered tables with serializable
//! read-write transactions and non-blocking read-only snapshots.
//!
//! ```text
//!  Worker (one per thread) --begin--> Transaction --commit--> CommitLog (ditto-log)
//!     |                                    |
//!     |          ReadTxn (any thread) ---- | ---- reads versions at a snapshot ts
//!     v                                    v
//!  Table = index (B+tree: key -> rid) + indirection array (rid -> Record -> versions)
//! ```
//!
//! Modules: `clock` (commit timestamps, visibility, GC horizon), `record` (TID word and
//! version chains), `index` (the concurrent B+tree), `table` (index and indirection array), `txn` (OCC and snapshots), `db`
//! (handles, workers, the commit-log hook), `alloc` (the counting global allocator: memory
//! in use).
//!
//! Non-goals here: durability (the log crate), replication, secondary indexes (applications
//! keep them as tables, as TPC-C does).

pub mod alloc;
mod clock;
mod db;
mod error;
mod ids;
mod index;
mod record;
mod replay;
mod table;
mod txn;

pub use bytes::Bytes;
pub use clock::{CommitClock, READERS_MAX};
pub use db::{
    check_recovered_row, CommitLog, CommitTicket, Database, LoggedWrite, Options, Worker, KEY_LEN_MAX,
    LOG_TXN_OVERHEAD_MAX, LOG_WRITE_OVERHEAD_MAX, RETRIES_MAX, TABLES_MAX, TABLE_NAME_MAX, TXN_BYTES_MAX,
    TXN_HELD_BYTES_MAX, VALUE_LEN_MAX, WORKERS_MAX,
};
pub use error::{catch_panic, Error, Result};
pub use ids::{RecordId, TableId, Ts, WorkerId};
/// The engine's ordered index, public for `ditto bench index` and for reuse.
pub use index::Index as BTreeIndex;
pub use replay::{CheckpointReading, KeyDelta, Prefetch, ReplayGate, ReplayPin, REPLAY_REUSE_WAIT_MAX};
pub use table::RECORDS_PER_TABLE_MAX;
pub use txn::{Direction, KeyVersion, ReadTxn, Transaction};

/// Starts loading the cache line holding `p` into L1, without waiting for it.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint and never faults, even for a bad address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
