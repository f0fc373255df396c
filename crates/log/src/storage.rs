//! The seam between the log writer and the disk: real files, or a fault-injecting stand-in
//! for tests of failed fsyncs and full disks (a simulator of disk faults, which is the one
//! place a stand-in is the point).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

pub trait Storage: Send + Sync + 'static {
    /// Creates a new file (it must not exist) for appending.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// Makes the directory entries of `dir` durable (after creating or renaming files).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

pub trait LogFile: Send {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// fsync (fdatasync). After an error the file must not be used again: the kernel may
    /// have dropped the dirty pages and a later successful fsync proves nothing
    /// (PostgreSQL's fsync lesson), so the writer stops instead of retrying.
    fn sync(&mut self) -> io::Result<()>;
}

/// Plain files.
pub struct RealStorage;

impl Storage for RealStorage {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let f = OpenOptions::new().append(true).create_new(true).open(path)?;
        Ok(Box::new(RealFile(f)))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        sync_dir(dir)
    }
}

struct RealFile(File);

impl LogFile for RealFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
}

/// `io::Write` over a `LogFile`, for buffered writers (checkpoint parts): every write goes
/// through the storage, so a simulated full disk or failed fsync reaches checkpoints too.
pub(crate) struct LogFileWriter(pub Box<dyn LogFile>);

impl Write for LogFileWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
