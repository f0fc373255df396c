//! Redis's keyspace on engine tables
//! =================================
//! Two tables hold every database (`SELECT 0..15`):
//!
//! ```text
//!  redis.keys    [db u8][key]                        -> [type u8][payload]
//!                    type 0 string: payload = the value's bytes
//!                    type 1 hash:   payload = field count, u64 little-endian
//!  redis.fields  [db u8][key length u32 BE][key][field] -> field value
//! ```
//!
//! A hash's fields sort together, after its length-prefixed key, so HGETALL is one range
//! scan. Every write to a hash rewrites its row in `redis.keys` (the field count), which is
//! what lets WATCH see any change of a hash through one record. An empty hash does not
//! exist: removing its last field removes its row, as in Redis.
//!
//! Every function here runs inside a caller's engine transaction and only reads and writes
//! through it, so a command made of several of them is one serializable transaction.

use std::ops::Bound;

use bytes::Bytes;
use ditto_engine::{Database, Result, TableId, Transaction, Ts};

pub const KEYS_TABLE: &str = "redis.keys";
pub const FIELDS_TABLE: &str = "redis.fields";

const T_STRING: u8 = 0;

/// What of a hash's fields a read copies out (`Keyspace::hash_within`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashParts {
    Fields,
    Values,
    Both,
}

/// The longest string value: a string's row is its type byte and the string, and a row
/// holds at most the engine's `VALUE_LEN_MAX` bytes. (Redis's is 512 MB.)
pub const STRING_LEN_MAX: usize = ditto_engine::VALUE_LEN_MAX - 1;
const T_HASH: u8 = 1;

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    String(Bytes),
    Hash { fields: u64 },
}

impl Entry {
    pub fn type_name(&self) -> &'static str {
        match self {
            Entry::String(_) => "string",
            Entry::Hash { .. } => "hash",
        }
    }
}

/// The number of keys in each database (`SELECT 0..DBS`), for DBSIZE and INFO keyspace in
/// O(1): counted once when the server opens, then moved by each commit by what its write
/// set did to `redis.keys` (`Transaction::write_set`: rows that got or lost a value).
/// Moved after the commit and before its reply, so a client sees its own writes counted;
/// another client's commit may show in the count a moment before its data is readable.
/// On a backup replay moves them (`ReplayKeyCounts`), and each move waits in `pending`
/// until the read view reaches its timestamp (`settle`): DBSIZE and INFO keyspace there
/// never count a write above the read view (before, every replayed write counted at once,
/// ahead of what reads saw, part of a transaction included). A move replay makes out of
/// order (a delete replayed before its insert, on another stream, waits parked and is
/// installed by the insert) counts at the timestamp of the write that installed it, so at
/// a view between the two the count may be off by it until the view passes the later one.
#[derive(Debug)]
pub struct KeyCounts {
    n: [std::sync::atomic::AtomicI64; DBS],
    /// Replay's moves the read view has not reached yet, by (timestamp, database).
    pending: std::sync::Mutex<std::collections::BTreeMap<(Ts, u8), i64>>,
    has_pending: std::sync::atomic::AtomicBool,
}

/// Moves waiting for the read view past which `KeyCounts::add_at` settles those the view
/// covers (none while it stands still: a settle then costs one look at the oldest).
const PENDING_SETTLE_AT: usize = 4096;

/// Databases a key row can name (`SELECT 0..15`; the row's first byte).
pub const DBS: usize = 16;

impl KeyCounts {
    /// Counts the keys of every database at a snapshot (the walk recovery would need
    /// anyway; about 80 ms per million keys on the project's VM).
    pub fn count(db: &Database, ks: &Keyspace) -> Result<KeyCounts> {
        Ok(Self::count_at(db, ks)?.0)
    }

    /// As `count`, with the timestamp of the snapshot counted.
    pub fn count_at(db: &Database, ks: &Keyspace) -> Result<(KeyCounts, Ts)> {
        let counts = KeyCounts::from_values([0; DBS]);
        let mut n = [0i64; DBS];
        let snap = db.read();
        let at = snap.ts();
        snap.for_each(ks.keys, Bound::Unbounded, Bound::Unbounded, |row, _| {
            if let Some(c) = n.get_mut(row[0] as usize) {
                *c += 1;
            }
            true
        })?;
        for (c, v) in counts.n.iter().zip(n) {
            c.store(v, std::sync::atomic::Ordering::Relaxed);
        }
        Ok((counts, at))
    }

    /// Counts given as they are (see `values`).
    pub fn from_values(n: [i64; DBS]) -> KeyCounts {
        KeyCounts {
            n: n.map(std::sync::atomic::AtomicI64::new),
            pending: Default::default(),
            has_pending: Default::default(),
        }
    }

    /// Every database's count now (with the moves the read view `view` covers).
    pub fn values(&self, view: Ts) -> [i64; DBS] {
        self.settle(view);
        std::array::from_fn(|i| self.n[i].load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Moves database `db`'s count by `d`.
    pub fn add(&self, db: u8, d: i64) {
        if let Some(c) = self.n.get(db as usize) {
            c.fetch_add(d, std::sync::atomic::Ordering::Release);
        }
    }

    /// A replayed write at `ts` moves database `db`'s count by `d` once the read view
    /// reaches `ts`; `view` is where it is now (waiting moves are settled to there when
    /// many wait).
    pub fn add_at(&self, db: u8, d: i64, ts: Ts, view: Ts) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        *p.entry((ts, db)).or_insert(0) += d;
        self.has_pending.store(true, std::sync::atomic::Ordering::Release);
        if p.len() >= PENDING_SETTLE_AT {
            self.settle_locked(&mut p, view);
        }
    }

    /// Applies the moves at or below the read view `view` (`Ts::MAX`: every move replay
    /// made, as at a change of role in place, where replay stopped at the point).
    pub fn settle(&self, view: Ts) {
        if self.has_pending.load(std::sync::atomic::Ordering::Acquire) {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            self.settle_locked(&mut p, view);
        }
    }

    fn settle_locked(&self, p: &mut std::collections::BTreeMap<(Ts, u8), i64>, view: Ts) {
        if p.first_key_value().is_none_or(|(&(ts, _), _)| ts > view) {
            return;
        }
        let above = p.split_off(&(Ts(view.0.saturating_add(1)), 0));
        for ((_, db), d) in std::mem::replace(p, above) {
            self.add(db, d);
        }
        self.has_pending.store(!p.is_empty(), std::sync::atomic::Ordering::Release);
    }

    /// What committing `txn` as it stands changes in each database's count.
    pub fn delta(ks: &Keyspace, txn: &Transaction<'_>) -> [i64; DBS] {
        let mut d = [0i64; DBS];
        for (row, before, after) in txn.write_set(ks.keys) {
            if before != after {
                if let Some(c) = d.get_mut(row[0] as usize) {
                    *c += if after { 1 } else { -1 };
                }
            }
        }
        d
    }

    /// Applies a committed transaction's `delta` (after its commit took its timestamp: a
    /// reader that sees the move and then reads the clock reads one at or above it, as
    /// DBSIZE's wait needs, hence Release here and Acquire in `get`).
    pub fn apply(&self, delta: &[i64; DBS]) {
        for (c, &v) in self.n.iter().zip(delta) {
            if v != 0 {
                c.fetch_add(v, std::sync::atomic::Ordering::Release);
            }
        }
    }

    /// The keys of database `db` now (with the moves the read view `view` covers).
    pub fn get(&self, db: u8, view: Ts) -> i64 {
        self.settle(view);
        self.n.get(db as usize).map_or(0, |c| c.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// On a backup, replay moves the key counts (no command does): each replayed insert or
/// delete of a `redis.keys` row above the snapshot the counts were taken at (what that
/// walk did not see) moves its database's count. Replay runs before the server has
/// counted, so what comes before `attach` waits here, and `attach` applies what lies above
/// its snapshot.
#[derive(Default)]
pub struct ReplayKeyCounts {
    early: std::sync::Mutex<Vec<(TableId, u8, Ts, i64)>>,
    attached: std::sync::OnceLock<Attached>,
}

/// The counts replay moves, the `redis.keys` table, the snapshot they were counted at,
/// and the database whose clock is the read view (a backup's clock is moved to its read
/// view: `Database::publish_read_view`).
type Attached = (std::sync::Arc<KeyCounts>, TableId, Ts, std::sync::Arc<ditto_engine::Database>);

impl ReplayKeyCounts {
    /// A replayed write gave `key` of `table` a value (`delta` +1) or took it away (-1).
    pub fn record(&self, table: TableId, key: &[u8], ts: Ts, delta: i64) {
        let Some(&db) = key.first() else { return };
        let apply = |(counts, keys, at, engine): &Attached| {
            if table == *keys && ts > *at {
                counts.add_at(db, delta, ts, engine.clock().now());
            }
        };
        if let Some(a) = self.attached.get() {
            return apply(a);
        }
        let mut early = self.early.lock().unwrap_or_else(|e| e.into_inner());
        // Attached between the check and the lock: it drained the list already.
        match self.attached.get() {
            Some(a) => apply(a),
            None => early.push((table, db, ts, delta)),
        }
    }

    /// The counts (taken at snapshot `at`) that replay moves from now on, each move once
    /// `engine`'s read view reaches it.
    pub fn attach(
        &self,
        counts: std::sync::Arc<KeyCounts>,
        keys: TableId,
        at: Ts,
        engine: std::sync::Arc<ditto_engine::Database>,
    ) {
        let mut early = self.early.lock().unwrap_or_else(|e| e.into_inner());
        for (table, db, ts, delta) in early.drain(..) {
            if table == keys && ts > at {
                counts.add_at(db, delta, ts, engine.clock().now());
            }
        }
        let _ = self.attached.set((counts, keys, at, engine));
    }
}

/// A key's value is of another type than the command works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrongType;

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

#[derive(Clone, Copy, Debug)]
pub struct Keyspace {
    pub keys: TableId,
    pub fields: TableId,
}

impl Keyspace {
    /// Opens the two tables, creating them in a new database.
    pub fn open(db: &Database) -> Result<Keyspace> {
        let table = |name: &str| match db.table_id(name) {
            Some(id) => Ok(id),
            None => db.create_table(name),
        };
        Ok(Keyspace { keys: table(KEYS_TABLE)?, fields: table(FIELDS_TABLE)? })
    }

    pub fn key_row(db: u8, key: &[u8]) -> Vec<u8> {
        let mut row = Vec::with_capacity(1 + key.len());
        row.push(db);
        row.extend_from_slice(key);
        row
    }

    /// The `redis.keys` rows of `keys`, in order, built in `buf` (one allocation for a
    /// pipeline's run, instead of one per key).
    fn key_rows<K: AsRef<[u8]>>(db: u8, keys: impl Iterator<Item = K> + Clone, buf: &mut Vec<u8>) -> Vec<&[u8]> {
        buf.clear();
        buf.reserve(keys.clone().map(|k| 1 + k.as_ref().len()).sum());
        for k in keys.clone() {
            buf.push(db);
            buf.extend_from_slice(k.as_ref());
        }
        let mut rest = &buf[..];
        keys.map(|k| {
            let (row, r) = rest.split_at(1 + k.as_ref().len());
            rest = r;
            row
        })
        .collect()
    }

    /// The prefix every field row of hash `key` starts with.
    fn field_prefix(db: u8, key: &[u8]) -> Vec<u8> {
        let mut row = Vec::with_capacity(5 + key.len() + 16);
        row.push(db);
        row.extend_from_slice(&(key.len() as u32).to_be_bytes());
        row.extend_from_slice(key);
        row
    }

    fn field_row(db: u8, key: &[u8], field: &[u8]) -> Vec<u8> {
        let mut row = Self::field_prefix(db, key);
        row.extend_from_slice(field);
        row
    }

    pub fn get(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8]) -> Result<Option<Entry>> {
        let Some(v) = txn.get(self.keys, &Self::key_row(db, key))? else { return Ok(None) };
        Ok(Some(decode_entry(v)))
    }

    /// The strings at `keys`, in order (`Ok(None)`: missing; `Err(WrongType)`: another
    /// type). One batched read (`get_many_with`), so the lookups' misses overlap: MGET, and
    /// a pipeline's run of GETs. Values are copied out only up to `budget` bytes: the
    /// answer stops after the value that takes the total past it (so it holds at least one
    /// entry), and the caller answers the rest later. Every key is read either way.
    pub fn get_strings(
        &self,
        txn: &mut Transaction<'_>,
        db: u8,
        keys: &[&Bytes],
        budget: usize,
    ) -> Result<Vec<Result<Option<Bytes>, WrongType>>> {
        let mut buf = Vec::new();
        let rows = Self::key_rows(db, keys.iter(), &mut buf);
        let mut out = Vec::with_capacity(keys.len());
        let mut bytes = 0usize;
        txn.get_many_with(self.keys, &rows, |i, v| {
            // Values arrive in key order; once one is skipped for the budget, so are the rest.
            if i != out.len() || (i > 0 && bytes > budget) {
                return;
            }
            bytes = bytes.saturating_add(v.map_or(0, <[u8]>::len));
            out.push(match v.map(|v| decode_entry(Bytes::copy_from_slice(v))) {
                None => Ok(None),
                Some(Entry::String(v)) => Ok(Some(v)),
                Some(_) => Err(WrongType),
            });
        })?;
        Ok(out)
    }

    /// The string at `key`; `Err(WrongType)` inside if it holds something else.
    pub fn get_string(
        &self,
        txn: &mut Transaction<'_>,
        db: u8,
        key: &[u8],
    ) -> Result<Result<Option<Bytes>, WrongType>> {
        Ok(match self.get(txn, db, key)? {
            None => Ok(None),
            Some(Entry::String(v)) => Ok(Some(v)),
            Some(_) => Err(WrongType),
        })
    }

    /// Sets `key` to a string whatever it held: a hash loses its fields, as SET over a
    /// hash does in Redis.
    pub fn set_string(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8], value: &[u8]) -> Result<()> {
        let held = self.get(txn, db, key)?;
        self.replace_with_string(txn, db, key, held.as_ref(), value)
    }

    /// `set_string` for each (key, value) in turn, in one transaction: a pipeline's run of
    /// SETs (`Session::handle_run`). The keys' types (a hash has fields to delete) are read
    /// `RUN_READ` at a time in one batched read (`get_many_with`), so their index descents
    /// and record and version loads overlap instead of missing the cache one after another
    /// (31% of the server's samples under SET -P 16 were those serial reads); each write
    /// then finds its key's record in the transaction's recently used keys. The same reads
    /// and writes as `set_string` one by one: a key written earlier in the run is read as
    /// the run left it if it falls in a later batch, as before it if in the same batch,
    /// where the only difference is a second, empty search for hash fields.
    pub fn set_strings(&self, txn: &mut Transaction<'_>, db: u8, pairs: &[(&[u8], &[u8])]) -> Result<()> {
        // The engine interleaves up to 16 reads, and remembers the last 16 keys looked up.
        const RUN_READ: usize = 16;
        let mut buf = Vec::new();
        for chunk in pairs.chunks(RUN_READ) {
            let rows = Self::key_rows(db, chunk.iter().map(|(k, _)| k), &mut buf);
            let mut hash = [false; RUN_READ];
            txn.get_many_with(self.keys, &rows, |i, v| hash[i] = v.is_some_and(is_hash_row))?;
            for ((row, (key, value)), hash) in rows.iter().zip(chunk).zip(hash) {
                if hash {
                    self.delete_fields(txn, db, key)?;
                }
                self.put_string(txn, row, value)?;
            }
        }
        Ok(())
    }

    /// `set_string` for a caller that has already read the key (`held`), so it is not read
    /// twice.
    pub fn replace_with_string(
        &self,
        txn: &mut Transaction<'_>,
        db: u8,
        key: &[u8],
        held: Option<&Entry>,
        value: &[u8],
    ) -> Result<()> {
        if let Some(Entry::Hash { .. }) = held {
            self.delete_fields(txn, db, key)?;
        }
        self.put_string(txn, &Self::key_row(db, key), value)
    }

    /// Writes a string value under the `redis.keys` row `row`.
    fn put_string(&self, txn: &mut Transaction<'_>, row: &[u8], value: &[u8]) -> Result<()> {
        // Refused in the string's own terms (`session::engine_error`): the engine's refusal
        // counted the row's type byte, "value is 16777217 bytes, over the limit of
        // 16777216" for a SET of 16 MiB (before 2026-12-05; a review).
        if value.len() > STRING_LEN_MAX {
            return Err(ditto_engine::Error::TooLarge { what: "string", len: value.len(), max: STRING_LEN_MAX });
        }
        txn.put_concat(self.keys, row, &[T_STRING], value)?;
        Ok(())
    }

    /// Removes a key of any type. Returns whether it existed.
    pub fn delete(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8]) -> Result<bool> {
        match self.get(txn, db, key)? {
            None => Ok(false),
            Some(entry) => {
                if let Entry::Hash { .. } = entry {
                    self.delete_fields(txn, db, key)?;
                }
                txn.delete(self.keys, &Self::key_row(db, key))
            }
        }
    }

    fn delete_fields(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8]) -> Result<()> {
        let lo = Self::field_prefix(db, key);
        let hi = prefix_end(&lo);
        let hi = hi.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        // The rows' names only: the values are not copied (`scan_keys`).
        for row in txn.scan_keys(self.fields, Bound::Included(&lo[..]), hi)? {
            txn.delete(self.fields, &row)?;
        }
        Ok(())
    }

    /// The hash's field count; `Ok(None)` if absent.
    pub fn hash_len(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8]) -> Result<Result<Option<u64>, WrongType>> {
        Ok(match self.get(txn, db, key)? {
            None => Ok(None),
            Some(Entry::Hash { fields }) => Ok(Some(fields)),
            Some(_) => Err(WrongType),
        })
    }

    pub fn hget(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8], field: &[u8]) -> Result<Option<Bytes>> {
        txn.get(self.fields, &Self::field_row(db, key, field))
    }

    /// Every (field, value) of the hash, in field order.
    pub fn hgetall(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8]) -> Result<Vec<(Bytes, Bytes)>> {
        Ok(self.hash_within(txn, db, key, HashParts::Both, usize::MAX)?.expect("no byte limit"))
    }

    /// The hash's (field, value) pairs in field order, for a reply: only the `parts` asked
    /// copied (the other left empty), and `None` once those pass `max_bytes`, having copied
    /// no more than that. Only what the reply holds counts: before 2026-12-06 the rows'
    /// names counted (each repeats the key: a hash of 1,100 fields under a key of 65,000
    /// bytes passed 64 MiB for a reply of 15 KB) and HKEYS counted the values it does not
    /// send (and copied them); found by a review against Redis.
    pub fn hash_within(
        &self,
        txn: &mut Transaction<'_>,
        db: u8,
        key: &[u8],
        parts: HashParts,
        max_bytes: usize,
    ) -> Result<Option<Vec<(Bytes, Bytes)>>> {
        let lo = Self::field_prefix(db, key);
        let hi = prefix_end(&lo);
        let hi = hi.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let skip = lo.len();
        let (fields, values) = (parts != HashParts::Values, parts != HashParts::Fields);
        let (mut out, mut bytes, mut whole) = (Vec::new(), 0usize, true);
        txn.for_each(self.fields, Bound::Included(&lo[..]), hi, |row, v| {
            let f = &row[skip.min(row.len())..];
            // Each element sent counts its framing as `Reply::wire_bytes` does: before
            // 2026-12-07 only its bytes, so HVALS of a hash of empty values counted nothing
            // and copied every field (64 bytes or more each) whatever the bound (found by a
            // review).
            let sent = |want: bool, b: &[u8]| if want { b.len() + crate::resp::ELEMENT_FRAMING_BYTES } else { 0 };
            bytes = bytes.saturating_add(sent(fields, f) + sent(values, v));
            if bytes > max_bytes {
                whole = false;
                return false;
            }
            let copy = |want: bool, b: &[u8]| if want { Bytes::copy_from_slice(b) } else { Bytes::new() };
            out.push((copy(fields, f), copy(values, v)));
            true
        })?;
        Ok(whole.then_some(out))
    }

    /// Sets fields of a hash (creating it); the caller has checked the key's type.
    /// Returns how many fields are new.
    pub fn hset(
        &self,
        txn: &mut Transaction<'_>,
        db: u8,
        key: &[u8],
        len: u64,
        pairs: &[(&[u8], &[u8])],
    ) -> Result<u64> {
        let mut added = 0;
        for (field, value) in pairs {
            if !txn.put(self.fields, &Self::field_row(db, key, field), value)? {
                added += 1;
            }
        }
        self.write_hash_row(txn, db, key, len + added)?;
        Ok(added)
    }

    /// Removes fields; the caller has checked the key holds a hash of `len` fields.
    /// Returns how many existed.
    pub fn hdel(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8], len: u64, fields: &[Bytes]) -> Result<u64> {
        let mut removed = 0;
        for field in fields {
            let row = Self::field_row(db, key, field);
            // A field too long for its row to be stored (the key and field together past
            // the engine's key limit) is not there: it deletes nothing, as in Redis. Before
            // 2026-12-02 the engine refused its delete, and with it the whole HDEL (found
            // by a review).
            if row.len() > ditto_engine::KEY_LEN_MAX {
                continue;
            }
            if txn.delete(self.fields, &row)? {
                removed += 1;
            }
        }
        if removed == 0 {
            // Nothing changed: no write, so a WATCH of the key sees no change (as in Redis).
            return Ok(0);
        }
        let left = len.checked_sub(removed).ok_or_else(|| {
            ditto_engine::Error::Corrupt(format!("hash field count {len} is below the {removed} fields removed"))
        })?;
        if left == 0 {
            txn.delete(self.keys, &Self::key_row(db, key))?;
        } else {
            self.write_hash_row(txn, db, key, left)?;
        }
        Ok(removed)
    }

    /// Removes every key of database `db` (of every database with `None`), hash fields
    /// included, in this transaction: FLUSHDB and FLUSHALL. A keyspace whose deletes pass
    /// the engine's transaction size (`TXN_BYTES_MAX`) is refused whole, changing nothing.
    pub fn flush(&self, txn: &mut Transaction<'_>, db: Option<u8>) -> Result<()> {
        let (lo, hi) = match db {
            Some(d) => (vec![d], prefix_end(&[d])),
            None => (Vec::new(), None),
        };
        let hi = hi.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        // Both tables' rows start with the database byte. The rows' names are gathered
        // only as far as the commit would take their deletes (each at least
        // `LOG_WRITE_OVERHEAD_MAX` and its name in the log): past that the flush is refused
        // before a name more is copied (before 2026-12-06 every name of the keyspace was
        // copied first, gigabytes for tens of millions of keys, only to be refused).
        let mut rows = Vec::new();
        let mut bytes = 0usize;
        for table in [self.keys, self.fields] {
            txn.for_each(table, Bound::Included(&lo[..]), hi, |key, _| {
                bytes += ditto_engine::LOG_WRITE_OVERHEAD_MAX + key.len();
                rows.push((table, Bytes::copy_from_slice(key)));
                bytes <= ditto_engine::TXN_BYTES_MAX
            })?;
            if bytes > ditto_engine::TXN_BYTES_MAX {
                return Err(ditto_engine::Error::TooLarge {
                    what: "a flush's deletes (the keyspace's rows, in one transaction)",
                    len: bytes,
                    max: ditto_engine::TXN_BYTES_MAX,
                });
            }
        }
        for (table, row) in rows {
            txn.delete(table, &row)?;
        }
        Ok(())
    }

    fn write_hash_row(&self, txn: &mut Transaction<'_>, db: u8, key: &[u8], fields: u64) -> Result<()> {
        let mut row = [0u8; 9];
        row[0] = T_HASH;
        row[1..].copy_from_slice(&fields.to_le_bytes());
        txn.put(self.keys, &Self::key_row(db, key), &row)?;
        Ok(())
    }
}

/// The type name of a `redis.keys` row's value, without decoding it.
pub fn type_name_of(row_value: &[u8]) -> &'static str {
    match row_value.first() {
        Some(&T_HASH) => "hash",
        _ => "string",
    }
}

/// Whether a `redis.keys` row's value is a hash's (as `decode_entry` reads it).
fn is_hash_row(v: &[u8]) -> bool {
    v.first() == Some(&T_HASH) && v.len() == 9
}

pub fn decode_entry(v: Bytes) -> Entry {
    match v.first() {
        Some(&T_HASH) if is_hash_row(&v) => {
            Entry::Hash { fields: u64::from_le_bytes(v[1..9].try_into().expect("8 bytes")) }
        }
        // T_STRING; anything else would be a bug in this module, and reads as a string.
        _ => Entry::String(v.slice(1.min(v.len())..)),
    }
}

/// The first key after every key starting with `prefix` (None: no such key, the range is
/// unbounded above).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use ditto_engine::Options;
    use std::sync::Arc;

    /// On a backup, a replayed insert or delete of a key moves the count only once the
    /// read view (the backup's clock) reaches its timestamp: a transaction's moves show
    /// together, with its data, never ahead of it. Moves made before the counts were
    /// attached wait the same way; a change of role takes every move replay made.
    #[test]
    fn replayed_moves_count_once_the_read_view_reaches_them() {
        let db = Database::new(Options { workers: 1 });
        let ks = Keyspace::open(&db).unwrap();
        let counts = Arc::new(KeyCounts::from_values([0; DBS]));
        let replay = ReplayKeyCounts::default();
        let view = |ts: u64| db.clock().advance_to(Ts(ts));
        view(10);
        // Before the counts are attached (counted at snapshot 10): one below it, one above.
        replay.record(ks.keys, b"\x00a", Ts(9), 1);
        replay.record(ks.keys, b"\x00b", Ts(12), 1);
        replay.attach(Arc::clone(&counts), ks.keys, Ts(10), Arc::clone(&db));
        assert_eq!(counts.get(0, db.clock().now()), 0, "the move at 9 is in the snapshot's count; 12 waits");
        // A transaction at 14 that adds two keys and removes one, in db 0 and db 3.
        replay.record(ks.keys, b"\x00c", Ts(14), 1);
        replay.record(ks.fields, b"\x00c\x00f", Ts(14), 1); // not a key row: never counted
        replay.record(ks.keys, b"\x03d", Ts(14), 1);
        replay.record(ks.keys, b"\x00b", Ts(14), -1);
        view(13);
        assert_eq!((counts.get(0, db.clock().now()), counts.get(3, db.clock().now())), (1, 0), "b at 12 only");
        view(14);
        assert_eq!((counts.get(0, db.clock().now()), counts.get(3, db.clock().now())), (1, 1), "14 whole");
        // A change of role in place takes every move replay made.
        replay.record(ks.keys, b"\x00e", Ts(20), 1);
        assert_eq!(counts.values(db.clock().now())[0], 1);
        assert_eq!(counts.values(Ts::MAX)[0], 2);
        // Many moves waiting are settled as they come, to where the view is.
        for i in 0..(2 * PENDING_SETTLE_AT as u64) {
            view(100 + i);
            replay.record(ks.keys, &[1, (i % 250) as u8, (i / 250) as u8], Ts(101 + i), 1);
        }
        assert!(counts.pending.lock().unwrap().len() < PENDING_SETTLE_AT, "the moves waiting are bounded");
        assert_eq!(counts.get(1, Ts::MAX), 2 * PENDING_SETTLE_AT as i64);
        // With the view standing still they wait (each a look at the oldest, not a walk of
        // them all), and count once it moves.
        let at = db.clock().now().0;
        for i in 0..(4 * PENDING_SETTLE_AT as u64) {
            replay.record(ks.keys, &[2, (i % 250) as u8, (i / 250) as u8], Ts(at + 1 + i / 2), 1);
        }
        assert_eq!(counts.pending.lock().unwrap().len(), 2 * PENDING_SETTLE_AT, "two moves per timestamp");
        assert_eq!(counts.get(2, db.clock().now()), 0);
        view(at + 4 * PENDING_SETTLE_AT as u64);
        assert_eq!(counts.get(2, db.clock().now()), 4 * PENDING_SETTLE_AT as i64);
        assert!(counts.pending.lock().unwrap().is_empty());
    }
}
