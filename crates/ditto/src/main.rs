//! The `ditto` binary. Every role of a node is a subcommand of this one binary.
//!
//! - `ditto demo`: the most complete thing ditto shows today (see demo.rs).
//! - `ditto bench tpcc|ycsb|index|recovery`: the embedded benchmarks (see bench.rs).
//! - `ditto server`: the Redis-protocol server (see server.rs and crates/server).
//! - `ditto status`: a node's replication state (see status.rs).
//! - `ditto crash-child`: a workload for the crash tests; not for people.

mod bench;
mod cluster;
mod cluster_cli;
mod crash;
mod demo;
mod demo_failover;
mod demo_server;
mod demo_standby;
mod failoverbench;
mod logmode;
mod memory;
mod node;
mod redisbench;
mod replaybench;
mod server;
mod status;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: every write allocates a value and a version and
/// frees old ones from other threads' epochs, which glibc served with arena locks and
/// `malloc_consolidate` (about 10% of a TPC-C worker in perf); see docs/results.md.
/// Wrapped to count the bytes in use, which the server's `maxmemory` is checked against
/// (crates/engine/src/alloc.rs: a thread-local add per allocation).
#[global_allocator]
static ALLOC: ditto_engine::alloc::Counting<mimalloc::MiMalloc> =
    ditto_engine::alloc::Counting::new(mimalloc::MiMalloc);

#[derive(Parser)]
#[command(name = "ditto", version, about = "A replicated, multi-core, in-memory transactional database")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load TPC-C into a durable data directory, run the full mix, crash it with SIGKILL,
    /// recover, verify; then the same for the Redis-protocol server under real TCP
    /// clients; and print a report.
    Demo(demo::DemoArgs),
    /// Embedded benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// Serve the Redis protocol on a durable database.
    Server(Box<server::ServerArgs>),
    /// A node's replication state: role, positions, per-backup lag and freshness.
    Status(status::StatusArgs),
    /// A cluster of `ditto server --node-id` nodes (docs/cluster.md).
    #[command(subcommand)]
    Cluster(cluster_cli::ClusterCmd),
    /// Workload used by the crash tests (prints acknowledged commits on stdout).
    #[command(hide = true)]
    CrashChild(crash::CrashArgs),
    /// Internal: the crashing half of `ditto demo`.
    #[command(hide = true)]
    DemoChild(demo::DemoChildArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let out = match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(b) => bench::run(b),
        Cmd::Server(a) => server::run(*a),
        Cmd::Status(a) => status::run(a).map_err(|e| e as Box<dyn std::error::Error>),
        Cmd::Cluster(c) => cluster_cli::run(c).map_err(|e| e as Box<dyn std::error::Error>),
        Cmd::CrashChild(a) => crash::run(a),
        Cmd::DemoChild(a) => demo::child(a),
    };
    if let Err(e) = out {
        eprintln!("ditto: error: {e}");
        std::process::exit(if e.is::<node::Removed>() { node::EXIT_REMOVED } else { 1 });
    }
}
