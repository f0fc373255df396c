//! ditto's Redis-protocol server.
//!
//! - `resp.rs`: request parsing (RESP2 arrays and inline commands, with limits) and reply
//!   encoding (RESP2 and RESP3).
//! - `keyspace.rs`: Redis strings and hashes laid out on two engine tables.
//! - `commands.rs`: the command table and the data commands, each run in a transaction.
//! - `session.rs`: one connection's state (auth, database, MULTI/WATCH) with no I/O.
//! - `server.rs`: tokio and connections.
//! - `release.rs`: replies wait there until their commit is durable.
//! - `metrics.rs`: the Prometheus endpoint.
//! - `tls.rs`: rustls configurations from PEM files, for client connections (and later
//!   replication links).
//! - `config.rs`: the TOML configuration.
//! - `memory.rs`: the memory in use (the engine's counting allocator) and `maxmemory`.

/// `println!` that ignores a failed write: a server's lines (its roles' changes, its
/// supervisor's answers) go to a standard output whoever started it may have stopped
/// reading, and `println!` panics on a closed one, which ended the server.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

pub mod commands;
pub mod config;
pub mod keyspace;
pub mod memory;
pub mod metrics;
pub mod release;
pub mod replinfo;
pub mod resp;
pub mod server;
pub mod session;
pub mod tls;

pub use config::Config;
pub use server::{run, Listening, ServerError};
