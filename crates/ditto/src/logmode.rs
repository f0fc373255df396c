//! `--log` flag values shared by the subcommands.

use std::time::Duration;

use ditto_log::{Durability, LogOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogMode {
    /// No log at all: in-memory only (the baseline).
    Off,
    /// Write every interval, never fsync (survives a process crash only).
    Nosync,
    /// Group commit, fsync every interval (the default).
    Interval,
    /// Group commit, fsync every batch as soon as the previous fsync returns.
    EveryBatch,
}

impl LogMode {
    pub fn durability(self, interval_ms: u64) -> Option<Durability> {
        let d = Duration::from_millis(interval_ms);
        match self {
            LogMode::Off => None,
            LogMode::Nosync => Some(Durability::NoSync(d)),
            LogMode::Interval => Some(Durability::Interval(d)),
            LogMode::EveryBatch => Some(Durability::EveryBatch),
        }
    }

    pub fn name(self, interval_ms: u64) -> String {
        match self.durability(interval_ms) {
            None => "off".into(),
            Some(d) => d.name(),
        }
    }
}

pub fn log_options(durability: Durability, compress: bool) -> LogOptions {
    LogOptions { durability, compress, ..LogOptions::default() }
}

/// Creates `p` if it does not exist; refuses it if it holds anything.
pub fn create_empty_dir(p: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(p)?;
    if std::fs::read_dir(p)?.next().is_some() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} is not empty: give a new or empty directory", p.display()),
        ));
    }
    Ok(())
}

/// A fresh scratch directory for a run, removed when dropped unless the caller named it (a
/// named one must be new or empty: runs load their own data).
pub struct ScratchDir {
    pub path: std::path::PathBuf,
    keep: bool,
}

impl ScratchDir {
    pub fn new(given: Option<std::path::PathBuf>, tag: &str) -> std::io::Result<ScratchDir> {
        match given {
            Some(p) => {
                // A run loads its own data: an old database here would be recovered under it.
                create_empty_dir(&p)?;
                Ok(ScratchDir { path: p, keep: true })
            }
            None => {
                let p = std::env::temp_dir().join(format!("ditto-{tag}-{}", std::process::id()));
                if p.exists() {
                    std::fs::remove_dir_all(&p)?;
                }
                std::fs::create_dir_all(&p)?;
                Ok(ScratchDir { path: p, keep: false })
            }
        }
    }
}

/// Execution CPU per logged transaction: `run_cpu_s` (the process's over the run) less
/// `checkpoint_ns` (the checkpoints' CPU counted over the same run, `checkpoint_cpu_ns`,
/// to a task's worth), over `logged`. Where the checkpoints' part is not below the run's
/// CPU (a window that does not match), it is said and not taken out.
pub fn exec_without_checkpoints(run_cpu_s: f64, checkpoint_ns: u64, logged: u64) -> f64 {
    let ckpt_s = checkpoint_ns as f64 / 1e9;
    let exec = if ckpt_s < run_cpu_s {
        run_cpu_s - ckpt_s
    } else {
        eprintln!(
            "  note: the checkpoints' CPU ({ckpt_s:.3} s) is not below the run's ({run_cpu_s:.3} s): not taken out of execution"
        );
        run_cpu_s
    };
    exec / logged.max(1) as f64
}

/// Closes a log and then waits for its background checkpointer (which ends once the log is
/// closed, after a checkpoint under way), when dropped or at `close_now`: a run's scratch
/// directory then goes with nothing writing into it, on an early error too.
pub struct CloseOnDrop<'a>(pub &'a ditto_log::Durable, pub Option<std::thread::JoinHandle<()>>);

impl CloseOnDrop<'_> {
    pub fn close_now(&mut self) {
        self.0.close();
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.close_now();
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
