//! The seam between the log writer and the disk: real files, or a fault-injecting stand-in
//! for tests of failed fsyncs and full disks (a simulator of disk faults, which is the one
//! place a stand-in is the point).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// The methods with a default do what the real file system does; a stand-in overrides
/// the ones it fails.
pub trait Storage: Send + Sync + 'static {
    /// Creates a new file (it must not exist) for appending.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>>;
    /// Creates a new log segment (it must not exist). With `direct`, the storage may write
    /// it with direct I/O, past the page cache, in whole blocks: then up to
    /// `DIRECT_ALIGN - 1` zero bytes follow the write position on disk, which a reader
    /// takes for the end of the log like zeroed-ahead space (docs/durability.md, "Direct
    /// I/O"). The default ignores `direct`.
    fn create_segment(&self, path: &Path, direct: bool) -> io::Result<Box<dyn LogFile>> {
        let _ = direct;
        self.create_new(path)
    }
    /// Makes the directory entries of `dir` durable (after creating or renaming files).
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        sync_dir(dir)
    }
    /// Renames `from` to `to` (replacing `to`); the caller syncs the directory.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    /// Deletes the file `path` (a log segment a checkpoint covers).
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    /// Cuts the existing file `path` to `len` bytes and makes that durable (recovery cutting
    /// a torn tail away).
    fn truncate_existing(&self, path: &Path, len: u64) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(len)?;
        f.sync_all()
    }
    /// Makes what was written to the existing file `path` durable (fdatasync through a
    /// descriptor of its own: whatever wrote it may be gone, a process killed, say).
    fn sync_existing(&self, path: &Path) -> io::Result<()> {
        OpenOptions::new().write(true).open(path)?.sync_data()
    }
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
    /// Starts writing to disk what was written since the last call, without waiting for
    /// it (`sync_file_range(SYNC_FILE_RANGE_WRITE)`; durable only after `sync`). A paced
    /// checkpoint calls it every few MiB, so its data reaches the disk as it is written
    /// instead of in one burst at its part's fsync, which the log's fsyncs would queue
    /// behind (checkpoint.rs, `Pace`). A hint: storages without it do nothing.
    fn write_back(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Plain files.
pub struct RealStorage;

impl Storage for RealStorage {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let f = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(RealFile { f, pos: 0, len: 0, written_back: 0 }))
    }

    fn create_segment(&self, path: &Path, direct: bool) -> io::Result<Box<dyn LogFile>> {
        if direct {
            use std::os::unix::fs::OpenOptionsExt;
            match OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_DIRECT).open(path) {
                Ok(f) => {
                    return Ok(Box::new(DirectFile {
                        file: RealFile { f, pos: 0, len: 0, written_back: 0 },
                        direct: true,
                        buf: Vec::new(),
                    }))
                }
                // No direct I/O on this file system (tmpfs). The open may have created the
                // file before refusing the flag; it did not exist before (that would have
                // been EEXIST), so creating or opening it now is the same.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    note_buffered(path, &e);
                    let f = OpenOptions::new().write(true).create(true).truncate(false).open(path)?;
                    return Ok(Box::new(RealFile { f, pos: 0, len: 0, written_back: 0 }));
                }
                Err(e) => return Err(e),
            }
        }
        self.create_new(path)
    }
}

struct RealFile {
    f: File,
    /// The write position and the file's length.
    pos: u64,
    len: u64,
    /// Where the last `write_back` ended.
    written_back: u64,
}

/// Writes zeros into `f` from `*len` up to `to` (64 KiB per call, from an aligned buffer,
/// so direct I/O takes them when both ends are aligned), moving `*len` on.
fn zero_fill(f: &File, len: &mut u64, to: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let zeros = bytes_of(&ZERO_BLOCKS);
    while *len < to {
        let n = (to - *len).min(zeros.len() as u64) as usize;
        f.write_all_at(&zeros[..n], *len)?;
        *len += n as u64;
    }
    Ok(())
}

impl LogFile for RealFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.f.write_all_at(buf, self.pos)?;
        self.pos += buf.len() as u64;
        self.len = self.len.max(self.pos);
        Ok(())
    }

    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        zero_fill(&self.f, &mut self.len, len)
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.f.set_len(len)?;
        self.len = len;
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.f.sync_data()
    }

    fn write_back(&mut self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (from, to) = (self.written_back.min(self.len), self.len);
        if to > from {
            // SAFETY: sync_file_range on a file descriptor this file owns; no memory passed.
            let r = unsafe {
                libc::sync_file_range(
                    self.f.as_raw_fd(),
                    from as libc::off64_t,
                    (to - from) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            self.written_back = to;
        }
        Ok(())
    }
}

/// The block size direct I/O writes in: offsets, lengths and buffers are multiples of it.
/// 4 KiB covers devices with 512-byte and 4 KiB logical blocks.
pub const DIRECT_ALIGN: usize = 4096;

#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Block([u8; DIRECT_ALIGN]);

const ZERO_BLOCK: Block = Block([0; DIRECT_ALIGN]);
/// Direct I/O staging kept between writes; more, grown by a large batch, is let go after it
/// (as the writer's `BUFFER_KEEP_MAX`).
const STAGING_KEEP_MAX: usize = 1 << 20;
/// Aligned zeros for extending a file (16 blocks per write).
static ZERO_BLOCKS: [Block; 16] = [ZERO_BLOCK; 16];

fn bytes_of(blocks: &[Block]) -> &[u8] {
    // SAFETY: `Block` is plain bytes with no padding (size = align = DIRECT_ALIGN), so a
    // slice of blocks is a contiguous run of initialised bytes.
    unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), blocks.len() * DIRECT_ALIGN) }
}

fn bytes_of_mut(blocks: &mut [Block]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`; any byte pattern is a valid `Block`.
    unsafe { std::slice::from_raw_parts_mut(blocks.as_mut_ptr().cast::<u8>(), blocks.len() * DIRECT_ALIGN) }
}

fn note_buffered(path: &Path, e: &io::Error) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::info!("no direct I/O for {} ({e}): log segments go through the page cache", path.display())
    });
}

/// A log segment written with `O_DIRECT`: each write goes from an aligned buffer straight
/// to the device, in whole blocks. The last partial block is kept in memory and written
/// again, completed, by the next write (its old bytes rewritten unchanged, as PostgreSQL
/// rewrites a WAL page), and the rest of that block is zeros. So the file on disk is the
/// bytes written, then fewer than `DIRECT_ALIGN` zeros. Against the page cache this saves
/// the pages' allocation, the copy into them and their writeback at each fsync (in a
/// write+fdatasync loop of 225 KB batches, a TPC-C interval batch's size, the process's
/// CPU per batch fell to about a third: docs/durability.md, `scripts/fsync-direct.py`),
/// and the log no longer fills the page cache. Should a write be
/// refused for its alignment (`EINVAL`: a device with larger blocks), the file turns
/// direct I/O off and goes on through the page cache.
struct DirectFile {
    /// The file, its write position (bytes written) and its length (a multiple of
    /// `DIRECT_ALIGN` while `direct`, but after `truncate`); once direct I/O is off, the
    /// plain file does everything.
    file: RealFile,
    direct: bool,
    /// Staging for a write: the last partial block's bytes first (`pos % DIRECT_ALIGN` of
    /// them), then the new bytes, then zeros to the block's end.
    buf: Vec<Block>,
}

impl DirectFile {
    /// Turns direct I/O off for this file (the kernel refused an aligned write, or a write
    /// must go where blocks cannot).
    fn stop_direct(&mut self, why: &str) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        tracing::warn!("direct I/O off for a log segment ({why}): it goes through the page cache");
        let fd = self.file.f.as_raw_fd();
        // SAFETY: fcntl on a descriptor this file owns; no pointers are passed.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0 {
            return Err(io::Error::last_os_error());
        }
        self.direct = false;
        Ok(())
    }
}

impl LogFile for DirectFile {
    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        if !self.direct {
            return self.file.write_all(data);
        }
        let head = (self.file.pos % DIRECT_ALIGN as u64) as usize;
        let end = head + data.len();
        let blocks = end.div_ceil(DIRECT_ALIGN);
        if self.buf.len() < blocks {
            self.buf.resize(blocks.next_power_of_two(), ZERO_BLOCK);
        }
        let bytes = &mut bytes_of_mut(&mut self.buf)[..blocks * DIRECT_ALIGN];
        bytes[head..end].copy_from_slice(data);
        bytes[end..].fill(0);
        let at = self.file.pos - head as u64;
        match self.file.f.write_all_at(bytes, at) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.stop_direct(&format!("a {}-byte write at {at} was refused: {e}", blocks * DIRECT_ALIGN))?;
                return self.file.write_all(data);
            }
            Err(e) => return Err(e),
        }
        self.file.pos += data.len() as u64;
        self.file.len = self.file.len.max(at + bytes.len() as u64);
        // The new last partial block moves to the front for the next write.
        let keep = end / DIRECT_ALIGN * DIRECT_ALIGN;
        bytes.copy_within(keep..end, 0);
        // Staging grown by a large write is let go (all but that block) once it is done.
        if self.buf.len() * DIRECT_ALIGN > STAGING_KEEP_MAX {
            self.buf.truncate(1);
            self.buf.shrink_to_fit();
        }
        Ok(())
    }

    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        if self.direct && !self.file.len.is_multiple_of(DIRECT_ALIGN as u64) {
            // Only after `truncate`, which the writer does last; never mind the blocks then.
            self.stop_direct("extending a file cut to an unaligned length")?;
        }
        let len = if self.direct { len.next_multiple_of(DIRECT_ALIGN as u64) } else { len };
        self.file.extend_zeroed(len)
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.file.truncate(len)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync()
    }
}

/// Real files whose writes and fsyncs hang while `stalled` is set (each for at most 30 s):
/// a disk that stops answering for a while, for the tests that show what a stall may and
/// may not hold up (shipping, receipt) and what it must (durability, release).
pub struct StallingStorage {
    pub stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

struct StallingFile {
    inner: Box<dyn LogFile>,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StallingFile {
    fn wait_for_the_disk(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.stalled.load(std::sync::atomic::Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

impl Storage for StallingStorage {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        let inner = RealStorage.create_new(path)?;
        Ok(Box::new(StallingFile { inner, stalled: std::sync::Arc::clone(&self.stalled) }))
    }
}

impl LogFile for StallingFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.wait_for_the_disk();
        self.inner.write_all(buf)
    }
    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        self.wait_for_the_disk();
        self.inner.extend_zeroed(len)
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.wait_for_the_disk();
        self.inner.sync()
    }
    fn write_back(&mut self) -> io::Result<()> {
        self.inner.write_back()
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

/// Another storage whose writes and fsyncs fail once `cancel` is set: a long write that
/// must stop short (a backup's checkpoint that a failover's fence need not wait for). A
/// checkpoint that fails so leaves nothing behind, as after a full disk
/// (`checkpoint::write`). The error is not `ErrorKind::Interrupted`: `std::io::Write`'s
/// adapters retry that kind, so a checkpoint's `BufWriter` flushing into a cancelled file
/// would retry forever, and the fence would wait for it forever (seen once checkpoints
/// were paced, so that a failover always found one under way).
pub struct Cancellable {
    pub inner: std::sync::Arc<dyn Storage>,
    pub cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

struct CancellableFile {
    inner: Box<dyn LogFile>,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn check_cancel(cancel: &std::sync::atomic::AtomicBool) -> io::Result<()> {
    if cancel.load(std::sync::atomic::Ordering::Acquire) {
        return Err(io::Error::other("cancelled: the node is being fenced"));
    }
    Ok(())
}

impl Cancellable {
    fn wrap(&self, inner: Box<dyn LogFile>) -> Box<dyn LogFile> {
        Box::new(CancellableFile { inner, cancel: std::sync::Arc::clone(&self.cancel) })
    }
}

impl Storage for Cancellable {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        check_cancel(&self.cancel)?;
        Ok(self.wrap(self.inner.create_new(path)?))
    }
    fn create_segment(&self, path: &Path, direct: bool) -> io::Result<Box<dyn LogFile>> {
        check_cancel(&self.cancel)?;
        Ok(self.wrap(self.inner.create_segment(path, direct)?))
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn truncate_existing(&self, path: &Path, len: u64) -> io::Result<()> {
        self.inner.truncate_existing(path, len)
    }
    fn sync_existing(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_existing(path)
    }
}

impl LogFile for CancellableFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        check_cancel(&self.cancel)?;
        self.inner.write_all(buf)
    }
    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        check_cancel(&self.cancel)?;
        self.inner.extend_zeroed(len)
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)
    }
    fn sync(&mut self) -> io::Result<()> {
        check_cancel(&self.cancel)?;
        self.inner.sync()
    }
    fn write_back(&mut self) -> io::Result<()> {
        check_cancel(&self.cancel)?;
        self.inner.write_back()
    }
}
