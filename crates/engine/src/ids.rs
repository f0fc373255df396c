//! Identifiers and times
//! =====================
//! Newtypes so that a record id can never be passed where a timestamp is expected.
//! All of them are plain integers on the wire (little endian, see docs/log-format.md).

use std::fmt;

/// A commit timestamp. Commit timestamps totally order all transactions of a database:
/// a transaction with a smaller timestamp serializes before one with a larger timestamp.
/// `Ts(0)` is "before everything" (the initial, empty state).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ts(pub u64);

impl Ts {
    pub const ZERO: Ts = Ts(0);
    pub const MAX: Ts = Ts(u64::MAX >> 2);
}

impl fmt::Display for Ts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ts{}", self.0)
    }
}

/// A table, numbered in creation order from 0.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableId(pub u32);

/// A record's slot in its table's indirection array. A deleted record's id is reused for a
/// new key, but only once no transaction that could have seen the old record runs and a
/// durable checkpoint covers its delete (table.rs): within a transaction, and within the
/// log a recovery replays, (table, record id) names one key.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId(pub u64);

/// A worker, and so also the log stream it writes (one stream per worker).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerId(pub u32);
