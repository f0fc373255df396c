//! The table catalog: `CATALOG` in the data directory, rewritten whole (write a temporary
//! file, fsync, rename, fsync the directory) whenever a table is created.
//!
//! Format (little endian): magic "DITTOCAT", version u32 = 1, count u32, then per table
//! id u32, name_len u16, name bytes; then crc32c u32 of everything before it.

use std::path::Path;

use ditto_engine::TableId;

use crate::storage::Storage;
use crate::LogError;

const MAGIC: &[u8; 8] = b"DITTOCAT";
const VERSION: u32 = 1;
pub const CATALOG_FILE: &str = "CATALOG";
/// The longest a catalog can be: its header and checksum, and `TABLES_MAX` tables of the
/// longest names (`load` reads no more than this and a byte).
const CATALOG_BYTES_MAX: u64 = 20 + ditto_engine::TABLES_MAX as u64 * (4 + 2 + u16::MAX as u64);

#[derive(Default, Clone, Debug)]
pub struct Catalog {
    pub tables: Vec<(TableId, String)>,
}

impl Catalog {
    pub fn add(&mut self, id: TableId, name: &str) {
        assert_eq!(id.0 as usize, self.tables.len(), "tables are created in id order");
        self.tables.push((id, name.to_string()));
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.tables.len() as u32).to_le_bytes());
        for (id, name) in &self.tables {
            b.extend_from_slice(&id.0.to_le_bytes());
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8], file: &Path) -> Result<Catalog, LogError> {
        let bad = |what: &str| LogError::Corrupt { file: file.to_path_buf(), offset: 0, what: what.to_string() };
        if b.len() < 20 || &b[..8] != MAGIC {
            return Err(bad("not a ditto catalog"));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
            return Err(bad("catalog checksum mismatch"));
        }
        let version = u32::from_le_bytes(body[8..12].try_into().unwrap());
        if version != VERSION {
            return Err(bad(&format!("unsupported catalog version {version}")));
        }
        let count = u32::from_le_bytes(body[12..16].try_into().unwrap()) as usize;
        // (More, or a name twice, and restoring the tables would panic.)
        if count > ditto_engine::TABLES_MAX {
            return Err(bad(&format!("{count} tables, over the limit of {}", ditto_engine::TABLES_MAX)));
        }
        let mut p = 16;
        let mut cat = Catalog::default();
        for i in 0..count {
            if p + 6 > body.len() {
                return Err(bad("catalog truncated"));
            }
            let id = u32::from_le_bytes(body[p..p + 4].try_into().unwrap());
            let len = u16::from_le_bytes(body[p + 4..p + 6].try_into().unwrap()) as usize;
            p += 6;
            if id as usize != i || p + len > body.len() {
                return Err(bad("catalog entry out of order or truncated"));
            }
            let name = std::str::from_utf8(&body[p..p + len]).map_err(|_| bad("table name is not UTF-8"))?;
            if cat.tables.iter().any(|(_, n)| n == name) {
                return Err(bad(&format!("table name '{name}' twice")));
            }
            cat.tables.push((TableId(id), name.to_string()));
            p += len;
        }
        if p != body.len() {
            return Err(bad("trailing bytes in catalog"));
        }
        Ok(cat)
    }

    pub fn load(dir: &Path) -> Result<Catalog, LogError> {
        let path = dir.join(CATALOG_FILE);
        // (At most as long as a catalog can be, and a byte more, which fails its checksum.)
        match crate::options::read_small(&path, CATALOG_BYTES_MAX) {
            Ok(Some(b)) => Catalog::decode(&b, &path),
            Ok(None) => Ok(Catalog::default()),
            Err(e) => Err(LogError::io(&path, e)),
        }
    }

    pub fn save(&self, dir: &Path, storage: &dyn Storage) -> std::io::Result<()> {
        write_atomically(dir, CATALOG_FILE, &self.encode(), storage)
    }
}

/// Writes `dir/name` so that after a crash it is either the old file or the new one. Every
/// step goes through `storage`; a failure before the rename leaves the old file as it was
/// (and a `.tmp` the next attempt replaces).
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8], storage: &dyn Storage) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    {
        let mut f = storage.create_new(&tmp)?;
        f.write_all(bytes)?;
        f.sync()?;
    }
    storage.rename(&tmp, &dir.join(name))?;
    storage.sync_dir(dir)
}
