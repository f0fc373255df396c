//! A power cut, simulated over real files (a simulator of disk faults, for tests): what a
//! machine that loses power keeps is only what was made durable, a file's bytes up to its
//! last fsync and a directory entry once its directory was synced, not what a process
//! crash keeps (every write in the page cache, which is all a SIGKILL can take away).
//! `PowerCut` is a storage over real files that records what each fsync and directory
//! sync made durable, and builds, at any moment, the directory a power cut would leave
//! (`PowerCut::image`). Files written outside the storage (the lock) and directories
//! (made with `create_dir_all`) are taken as they are once their parent's entry is
//! durable: only the syncs of their parents are modelled. Directory syncs made with
//! `storage::sync_dir` directly, not through the storage, are not seen (a backup's
//! promotion records and trash moves do so; the paths of the tests that use this go
//! through the storage).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::storage::{LogFile, RealStorage, Storage};

/// A durable directory entry.
#[derive(Clone, Copy, Debug)]
enum Entry {
    /// A file the storage made, by its id.
    File(u64),
    /// A directory, or a file made outside the storage: taken as it is.
    AsIs,
}

struct FileState {
    /// Where its bytes are now (a removed file is moved aside, its bytes kept for images
    /// in which its removal is not durable yet).
    real: PathBuf,
    /// Its length at its last fsync.
    synced: u64,
}

/// What a power cut leaves of a file from all it was written and its length at its last
/// fsync (`PowerCut::image_at_next_sync`).
pub type Tail = Box<dyn FnMut(usize, &mut Vec<u8>) + Send>;

/// A power cut to make at the next fsync of a file written well past its last one
/// (`PowerCut::image_at_next_sync`).
struct Armed {
    root: PathBuf,
    img: PathBuf,
    name_prefix: String,
    min_unsynced: u64,
    tail: Tail,
}

#[derive(Default)]
struct Disk {
    /// A power cut to make at the next fsync that finds enough unsynced, and what came of
    /// the last one made.
    armed: Option<Armed>,
    fired: Option<io::Result<()>>,
    /// How long each file's fsync takes at least (`PowerCut::slow_syncs`).
    sync_delay: std::time::Duration,
    /// Current names of the files the storage made.
    names: HashMap<PathBuf, u64>,
    files: HashMap<u64, FileState>,
    /// Per directory, its entries as of its last sync (a directory never synced holds
    /// nothing durable, the root aside).
    durable: HashMap<PathBuf, HashMap<OsString, Entry>>,
    next: u64,
    /// Removed files go here.
    attic: PathBuf,
}

impl Disk {
    /// `dir`'s entries now are its durable ones.
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        let mut entries = HashMap::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let entry = match self.names.get(&e.path()) {
                Some(&id) => Entry::File(id),
                None => Entry::AsIs,
            };
            entries.insert(e.file_name(), entry);
        }
        self.durable.insert(dir.to_path_buf(), entries);
        Ok(())
    }

    /// Moves every name under `from` (itself, or inside it) to `to`, durable maps too.
    fn rename(&mut self, from: &Path, to: &Path) {
        let moved = |p: &Path| {
            p.strip_prefix(from)
                .ok()
                .map(|rest| if rest.as_os_str().is_empty() { to.to_path_buf() } else { to.join(rest) })
        };
        let names: Vec<(PathBuf, u64)> = self.names.drain().collect();
        for (p, id) in names {
            let p = moved(&p).unwrap_or(p);
            self.files.get_mut(&id).expect("a named file").real = p.clone();
            self.names.insert(p, id);
        }
        // A file renamed over another: the other is gone from the current names above.
        let durable: Vec<(PathBuf, HashMap<OsString, Entry>)> = self.durable.drain().collect();
        for (d, e) in durable {
            self.durable.insert(moved(&d).unwrap_or(d), e);
        }
    }

    fn image_dir(&self, dir: &Path, img: &Path, tail: &mut dyn FnMut(usize, &mut Vec<u8>)) -> io::Result<()> {
        std::fs::create_dir_all(img)?;
        let Some(entries) = self.durable.get(dir) else { return Ok(()) };
        for (name, e) in entries {
            if name == "LOCK" {
                continue;
            }
            let (real, to) = (dir.join(name), img.join(name));
            match *e {
                Entry::File(id) => {
                    let f = &self.files[&id];
                    // (Gone for good: a checkpoint's directory removed whole, outside the
                    // storage; taken as removed.)
                    let Ok(mut bytes) = std::fs::read(&f.real) else { continue };
                    let synced = (f.synced as usize).min(bytes.len());
                    let durable = bytes[..synced].to_vec();
                    tail(synced, &mut bytes);
                    assert!(bytes.starts_with(&durable), "a power cut's tail changed synced bytes");
                    std::fs::write(&to, &bytes)?;
                }
                Entry::AsIs if real.is_dir() => self.image_dir(&real, &to, tail)?,
                Entry::AsIs => {
                    if let Ok(bytes) = std::fs::read(&real) {
                        std::fs::write(&to, bytes)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Real files, with what each fsync and directory sync made durable recorded (`Disk`).
#[derive(Clone)]
pub struct PowerCut {
    disk: Arc<Mutex<Disk>>,
}

impl PowerCut {
    /// Over the directory `root` (made by the caller, empty: its own entry is durable);
    /// removed files' bytes go to `attic`, another directory.
    pub fn new(root: &Path, attic: &Path) -> PowerCut {
        let mut disk = Disk { attic: attic.to_path_buf(), ..Disk::default() };
        // The root's own entry is durable (the test made it); nothing in it yet.
        disk.durable.insert(root.to_path_buf(), HashMap::new());
        PowerCut { disk: Arc::new(Mutex::new(disk)) }
    }

    /// Builds in `img` the directory a power cut now would leave of `root` (what it was
    /// made over, or a directory in it): each file's bytes up to its last fsync, plus
    /// `tail(synced, written)` bytes in all (at least `synced`, at most `written`: a torn
    /// tail); every entry as of its directory's last sync. Every storage operation waits
    /// meanwhile.
    pub fn image(&self, root: &Path, img: &Path, tail: &mut dyn FnMut(usize, usize) -> usize) -> io::Result<()> {
        self.disk.lock().unwrap().image_dir(root, img, &mut |synced, bytes| {
            let keep = tail(synced, bytes.len()).clamp(synced, bytes.len());
            bytes.truncate(keep);
        })
    }

    /// An image made at the moment the power would cut most: as a file whose name starts
    /// with `name_prefix`, with at least `min_unsynced` bytes written past its last fsync,
    /// is about to be synced (a random moment mostly finds every write synced), waited for
    /// up to `wait`; whether it was made (one not made by then is no longer asked for).
    /// `tail(synced, bytes)` makes what the power cut left of each file from all it was
    /// written (`bytes`) and its length at its last fsync: it may cut the bytes past
    /// `synced` short and change them (pages of a write reach a disk in any order before
    /// its fsync: some written, some not), never those before (asserted).
    pub fn image_at_next_sync(
        &self,
        root: &Path,
        img: &Path,
        name_prefix: &str,
        min_unsynced: u64,
        tail: Tail,
        wait: std::time::Duration,
    ) -> io::Result<bool> {
        {
            let mut d = self.disk.lock().unwrap();
            d.fired = None;
            let (root, img, name_prefix) = (root.to_path_buf(), img.to_path_buf(), name_prefix.to_string());
            d.armed = Some(Armed { root, img, name_prefix, min_unsynced, tail });
        }
        let since = std::time::Instant::now();
        loop {
            {
                let mut d = self.disk.lock().unwrap();
                if let Some(made) = d.fired.take() {
                    return made.map(|()| true);
                }
                if since.elapsed() > wait {
                    d.armed = None;
                    return Ok(false);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Each file's fsync takes at least `delay` from now on (a slower disk: what is written
    /// meanwhile goes in the next, larger write).
    pub fn slow_syncs(&self, delay: std::time::Duration) {
        self.disk.lock().unwrap().sync_delay = delay;
    }

    /// A file made under the lock, so that no directory sync lists it untracked.
    fn make(&self, path: &Path, make: impl FnOnce() -> io::Result<Box<dyn LogFile>>) -> io::Result<Box<dyn LogFile>> {
        let mut d = self.disk.lock().unwrap();
        let inner = make()?;
        d.next += 1;
        let id = d.next;
        d.files.insert(id, FileState { real: path.to_path_buf(), synced: 0 });
        d.names.insert(path.to_path_buf(), id);
        Ok(Box::new(Tracked { inner, id, len: 0, pos: 0, disk: Arc::clone(&self.disk) }))
    }
}

impl Storage for PowerCut {
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn LogFile>> {
        self.make(path, || RealStorage.create_new(path))
    }
    fn create_segment(&self, path: &Path, direct: bool) -> io::Result<Box<dyn LogFile>> {
        self.make(path, || RealStorage.create_segment(path, direct))
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut d = self.disk.lock().unwrap();
        RealStorage.sync_dir(dir)?;
        d.sync_dir(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut d = self.disk.lock().unwrap();
        // A file renamed over another: the other's bytes go to the attic first, for
        // images in which the rename is not durable.
        if let Some(&old) = d.names.get(to).filter(|_| to.is_file()) {
            let aside = d.attic.join(format!("{old}"));
            std::fs::copy(to, &aside)?;
            d.files.get_mut(&old).expect("a named file").real = aside;
            d.names.remove(to);
        }
        RealStorage.rename(from, to)?;
        d.rename(from, to);
        Ok(())
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut d = self.disk.lock().unwrap();
        match d.names.remove(path) {
            Some(id) => {
                let aside = d.attic.join(format!("{id}"));
                std::fs::rename(path, &aside)?;
                d.files.get_mut(&id).expect("a named file").real = aside;
                Ok(())
            }
            None => RealStorage.remove(path),
        }
    }
    fn truncate_existing(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut d = self.disk.lock().unwrap();
        RealStorage.truncate_existing(path, len)?;
        if let Some(&id) = d.names.get(path) {
            d.files.get_mut(&id).expect("a named file").synced = len;
        }
        Ok(())
    }
    fn sync_existing(&self, path: &Path) -> io::Result<()> {
        let mut d = self.disk.lock().unwrap();
        RealStorage.sync_existing(path)?;
        let len = std::fs::metadata(path)?.len();
        if let Some(&id) = d.names.get(path) {
            d.files.get_mut(&id).expect("a named file").synced = len;
        }
        Ok(())
    }
}

struct Tracked {
    inner: Box<dyn LogFile>,
    id: u64,
    /// The file's length as written (zeros ahead included), and the write position: the
    /// end of what was written as data (an fsync makes that much durable, not the zeros
    /// written ahead past it, which later writes fill before their own fsync).
    len: u64,
    pos: u64,
    disk: Arc<Mutex<Disk>>,
}

impl LogFile for Tracked {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.inner.write_all(buf)?;
        self.pos += buf.len() as u64;
        self.len = self.len.max(self.pos);
        Ok(())
    }
    fn extend_zeroed(&mut self, len: u64) -> io::Result<()> {
        self.inner.extend_zeroed(len)?;
        self.len = self.len.max(len);
        Ok(())
    }
    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.inner.truncate(len)?;
        self.len = len;
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        // (Zeros past the data read as the log's end: cutting the image there is the same.)
        let len = self.pos.min(self.len);
        let delay = {
            let mut d = self.disk.lock().unwrap();
            let f = &d.files[&self.id];
            let named = |a: &Armed| f.real.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&a.name_prefix));
            if d.armed.as_ref().is_some_and(|a| len.saturating_sub(f.synced) >= a.min_unsynced && named(a)) {
                let mut a = d.armed.take().expect("armed");
                let made = d.image_dir(&a.root, &a.img, &mut *a.tail);
                d.fired = Some(made);
            }
            d.sync_delay
        };
        std::thread::sleep(delay);
        self.inner.sync()?;
        self.disk.lock().unwrap().files.get_mut(&self.id).expect("a tracked file").synced = len;
        Ok(())
    }
    fn write_back(&mut self) -> io::Result<()> {
        self.inner.write_back()
    }
}
