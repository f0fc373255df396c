//! A data directory's database id
//! ===============================
//! Every primary's data directory holds a random 64-bit id, made by its first open
//! (`load_or_create`, from `crate::open`: copies of the directory carry it) and kept for
//! good; a backup takes its primary's id from the primary's `Welcome` and writes it,
//! durably, before anything the primary sends (ditto_replication's `identity`, which
//! checks ids and runs between nodes). A backup's directory thus names the database whose
//! history it holds, and a promoted backup, an old primary that rejoins, a cluster's nodes
//! all carry one id: the history they share. A backup told by its `Welcome` of another id
//! is not resumed, nor sent a copy: it keeps what it holds and says why. Without it, a backup pointed at an
//! unrelated primary, or at its own primary's address once that directory was made anew,
//! took the other history's log from where its own ended whenever the two epochs' numbers
//! and clocks allowed it (both count from the start), or discarded all it held for a copy
//! of an empty database (PostgreSQL's standby refuses a primary of another "database
//! system identifier" for the same reason; a Redis replica's replication id is the same
//! idea, though Redis then copies over the replica's data).
//!
//! What it does not tell apart: two copies of one directory, each served as a primary
//! (both carry the copied id; the primary's run tells them apart in the epoch both open,
//! docs/replication.md, "Protocol"), and a directory written by a build older than the id
//! (a backup's has none, and takes the first primary's it follows; a primary's makes one at
//! its first open by this build).

use std::path::Path;

use crate::storage::Storage;

/// The file, in a data directory, that holds its database id.
pub const DATABASE_ID_FILE: &str = "DATABASE_ID";

/// A database's id: never 0, which the protocol uses for "none said".
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct DatabaseId(u64);

impl DatabaseId {
    /// A fresh random id.
    pub fn new_random() -> DatabaseId {
        loop {
            let x: u64 = rand::random();
            if x != 0 {
                return DatabaseId(x);
            }
        }
    }

    /// The id a frame carries, `None` for 0 ("none said").
    pub fn from_wire(x: u64) -> Option<DatabaseId> {
        (x != 0).then_some(DatabaseId(x))
    }

    pub fn to_wire(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for DatabaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

const PREFIX: &str = "ditto database ";

/// The file's one line: the prefix, the id in 16 lower-case hex digits, and the CRC-32C of
/// what comes before it (a damaged digit would otherwise read as another id).
fn line(id: DatabaseId) -> String {
    let head = format!("{PREFIX}{id}");
    format!("{head} crc32c {:08x}\n", crc32c::crc32c(head.as_bytes()))
}

/// The id `dir` holds, `None` where it holds none (a directory no primary served, or
/// written by an older build). A file that does not hold one is an error naming it.
pub fn read(dir: &Path) -> std::io::Result<Option<DatabaseId>> {
    let path = dir.join(DATABASE_ID_FILE);
    // (At most a line and a byte more, which the check below refuses: a damaged size is
    // not read whole.)
    let bytes = match crate::options::read_small(&path, line(DatabaseId(1)).len() as u64) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(None),
        Err(e) => return Err(std::io::Error::new(e.kind(), format!("reading {}: {e}", path.display()))),
    };
    let parsed = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| s.strip_prefix(PREFIX))
        .and_then(|s| s.get(..16))
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .and_then(DatabaseId::from_wire)
        .filter(|&id| line(id).as_bytes() == bytes);
    parsed.map(Some).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} does not hold `{PREFIX}`, 16 hex digits and their checksum (it holds {:?}): damaged. It names the database whose history this directory holds, the same in every directory of one history: restore it from a copy, or from the primary's or a backup's directory (removed, a primary makes a new id, which its backups then refuse)",
                path.display(),
                String::from_utf8_lossy(&bytes).chars().take(64).collect::<String>()
            ),
        )
    })
}

/// Writes `id` into `dir`, durably (after a crash the file is the old one or the new).
pub fn write(dir: &Path, id: DatabaseId, storage: &dyn Storage) -> std::io::Result<()> {
    crate::catalog::write_atomically(dir, DATABASE_ID_FILE, line(id).as_bytes(), storage)
        .map_err(|e| std::io::Error::new(e.kind(), format!("writing {}: {e}", dir.join(DATABASE_ID_FILE).display())))
}

/// The id of a primary's directory: the one it holds, else a new one, written by the open
/// (`crate::open`), before any backup is served.
pub fn load_or_create(dir: &Path, storage: &dyn Storage) -> std::io::Result<DatabaseId> {
    match read(dir)? {
        Some(id) => Ok(id),
        None => {
            let id = DatabaseId::new_random();
            write(dir, id, storage)?;
            Ok(id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::RealStorage;

    #[test]
    fn an_id_is_made_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        let id = load_or_create(dir.path(), &RealStorage).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(id));
        assert_eq!(load_or_create(dir.path(), &RealStorage).unwrap(), id, "made again");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_create(other.path(), &RealStorage).unwrap(), id, "two directories, one id");
        let text = std::fs::read_to_string(dir.path().join(DATABASE_ID_FILE)).unwrap();
        let head = format!("ditto database {id}");
        assert_eq!(text, format!("{head} crc32c {:08x}\n", crc32c::crc32c(head.as_bytes())));
        assert!(!dir.path().join(format!("{DATABASE_ID_FILE}.tmp")).exists());
    }

    #[test]
    fn a_damaged_id_file_is_an_error_naming_it_and_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let id = load_or_create(dir.path(), &RealStorage).unwrap();
        let good = std::fs::read(dir.path().join(DATABASE_ID_FILE)).unwrap();
        let mut bad: Vec<Vec<u8>> = (0..good.len()).map(|n| good[..n].to_vec()).collect();
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0x01;
            bad.push(b);
        }
        bad.push(line(DatabaseId(0)).into_bytes());
        let upper =
            String::from_utf8(good.clone()).unwrap().replacen(&id.to_string(), &id.to_string().to_uppercase(), 1);
        if upper.as_bytes() != good {
            bad.push(upper.into_bytes());
        }
        bad.push([good.clone(), b"x".to_vec()].concat());
        for b in bad {
            std::fs::write(dir.path().join(DATABASE_ID_FILE), &b).unwrap();
            let e = read(dir.path()).expect_err(&format!("{:?} read as an id", String::from_utf8_lossy(&b)));
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
            assert!(e.to_string().contains(DATABASE_ID_FILE), "{e}");
            let e = load_or_create(dir.path(), &RealStorage).expect_err("a damaged id replaced");
            assert!(e.to_string().contains("damaged"), "{e}");
            assert_eq!(std::fs::read(dir.path().join(DATABASE_ID_FILE)).unwrap(), b, "the damaged file was changed");
        }
    }
}
