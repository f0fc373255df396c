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
    /// Cuts the existing file `path` to `len` bytes and makes that durable (recovery cutting
    /// a torn tail away).
    fn truncate_existing(&self, path: &Path, len: u64) -> io::Result<()>;
}

pub trait LogFile: Send {
    /// Writes at the write position (the start of the file at first) and moves it on.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Makes the file at least `len` bytes long by writing zeros past its end (real zeros,
    /// not a hole, so later writes over them allocate nothing), without moving the write
    /// position. A log segment is zeroed ahead of its small batches so that their fsyncs
    /// have no file size or block allocation to commit (docs/durability.md).
    fn extend_zeroed(&mut self, len: u64) -> io::Result<()>;
    /// Cuts the file to `len` bytes (the zeros past the last batch of a segment that is
    /// closed); the caller syncs.
    fn truncate(&mut self, len: u64) -> io::Result<()>;
    /// fsync (fdatasync). After an error the file must not be used again: the kernel may
    /// have dropped the dirty pages and a later successful fsync proves nothing
    /// (PostgreSQL's fsync lesson), so the writer stops instead of retrying.
    fn sync(&mut self) -> io::Result<()>;
}

/// Plain files.
pub struct RealStorage;

impl Storage for RealStorage {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let f = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(RealFile { f, pos: 0, len: 0 }))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        sync_dir(dir)
    }

    fn truncate_existing(&self, path: &Path, len: u64) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(len)?;
        f.sync_all()
    }
}

struct RealFile {
    f: File,
    /// The write position (the file's cursor) and the file's length.
    pos: u64,
    len: u64,
}

/// Zeros written per call when extending a file.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

impl LogFile for RealFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.f.write_all(buf)?;
        self.pos += buf.len() as u64;
        self.len = self.len.max(self.pos);
        Ok(())
    }

    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        while self.len < len {
            let n = (len - self.len).min(ZEROS.len() as u64) as usize;
            self.f.write_all_at(&ZEROS[..n], self.len)?;
            self.len += n as u64;
        }
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.f.set_len(len)?;
        self.len = len;
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.f.sync_data()
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
