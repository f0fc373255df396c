//! `ditto server`: the Redis-protocol server (crates/server), configured by a TOML file
//! with command-line flags over it.

use std::path::PathBuf;

use ditto_server::Config;

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// TCP port for clients (0: any free port; the bound one is printed).
    #[arg(long)]
    port: Option<u16>,
    /// Durable data directory (log and checkpoints); created if missing.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    bind: Option<String>,
    /// TOML config file (see docs/server.md); flags given here override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Engine workers (server threads, log streams) [default: cores].
    #[arg(long)]
    workers: Option<usize>,
    /// Durability: every-batch, interval or nosync [default: every-batch].
    #[arg(long)]
    durability: Option<String>,
    /// Prometheus endpoint host:port, or "off" [default: 127.0.0.1:9379].
    #[arg(long)]
    metrics: Option<String>,
}

pub fn run(a: ServerArgs) -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(p) = a.port {
        cfg.port = p;
    }
    if let Some(d) = a.data_dir {
        cfg.data_dir = Some(d);
    }
    if let Some(b) = a.bind {
        cfg.bind = b;
    }
    if let Some(w) = a.workers {
        cfg.workers = w;
    }
    if let Some(d) = a.durability {
        cfg.durability = d;
    }
    if let Some(m) = a.metrics {
        cfg.metrics = m;
    }
    let durability = cfg.durability()?.name();
    ditto_server::run(cfg, |addr| {
        // Tests and scripts wait for this line.
        println!("ditto server listening on {addr} ({durability})");
    })?;
    Ok(())
}
