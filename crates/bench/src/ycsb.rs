//! YCSB++ as in Rolis (section 6.1)
//! ================================
//! One table `ycsb` of `keys` rows: 8-byte big-endian keys 0..keys, `value_len`-byte values.
//! Each transaction touches `ops_per_txn` distinct keys:
//!
//! ```text
//!  read-only  (read_only_fraction, 50%): ops_per_txn gets on a snapshot (ReadTxn)
//!  read-write (the rest, 50%):           ops_per_txn read-modify-writes: get, then update
//!                                        with a modified value; one OCC transaction
//! ```
//!
//! Keys are uniform, or zipfian: YCSB's ZipfianGenerator (Gray et al., "Quickly generating
//! billion-record synthetic databases", SIGMOD 1994) over the `keys` ranks, scrambled as
//! YCSB's ScrambledZipfianGenerator does (the rank is hashed with FNV-1a 64 modulo `keys`,
//! so the hot keys are spread over the key space instead of being the smallest ones).

use std::ops::Bound;
use std::sync::Arc;

use ditto_engine::{Database, Error, TableId, Worker, WorkerId};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;

use crate::harness::{self, Outcome, Probe, Report, RunConfig, Workload};

/// The transaction types, in the order of `Report::per_type`.
pub const TYPES: [&str; 2] = ["ReadOnly", "ReadWrite"];
const READ_ONLY: usize = 0;
const READ_WRITE: usize = 1;
/// The table's name.
pub const TABLE: &str = "ycsb";
/// Rows per loader transaction.
const LOAD_CHUNK: u64 = 1000;

#[derive(Clone, Debug, Serialize)]
pub struct YcsbConfig {
    /// Rows (keys 0..keys).
    pub keys: u64,
    /// Bytes per value.
    pub value_len: usize,
    /// `None`: uniform keys; `Some(theta)`: scrambled zipfian with that skew, 0 < theta < 1
    /// (YCSB's default is 0.99).
    pub zipf_theta: Option<f64>,
    /// Fraction of transactions that are read-only.
    pub read_only_fraction: f64,
    /// Distinct keys per transaction.
    pub ops_per_txn: usize,
}

impl Default for YcsbConfig {
    fn default() -> Self {
        YcsbConfig { keys: 1_000_000, value_len: 100, zipf_theta: None, read_only_fraction: 0.5, ops_per_txn: 4 }
    }
}

/// A loaded YCSB table and the workload parameters to run on it.
#[derive(Clone, Debug)]
pub struct Ycsb {
    pub table: TableId,
    pub config: YcsbConfig,
}

fn key(k: u64) -> [u8; 8] {
    k.to_be_bytes()
}

/// Fills `out` with random alphanumeric bytes.
fn fill_value(rng: &mut SmallRng, out: &mut [u8]) {
    const ALNUM: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    rng.fill_bytes(out);
    for b in out.iter_mut() {
        *b = ALNUM[(*b as usize) % ALNUM.len()];
    }
}

/// Creates the table and loads `cfg.keys` rows in parallel (one loader per database worker,
/// each a contiguous key range), committing durably every 1,000 rows.
pub fn load(db: &Arc<Database>, cfg: &YcsbConfig, progress: bool) -> Result<Ycsb, Error> {
    assert!(cfg.keys >= cfg.ops_per_txn as u64, "fewer keys than operations per transaction");
    let table = db.create_table(TABLE)?;
    let loaders = db.workers().min(cfg.keys.div_ceil(LOAD_CHUNK).max(1) as usize);
    let pb = harness::load_progress(cfg.keys, "ycsb load", progress);
    let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..loaders)
            .map(|i| {
                let pb = &pb;
                s.spawn(move || -> Result<(), Error> {
                    let mut worker = db.worker(WorkerId(i as u32)).unwrap_or_else(|| panic!("worker {i} is taken"));
                    let (lo, hi) = (cfg.keys * i as u64 / loaders as u64, cfg.keys * (i as u64 + 1) / loaders as u64);
                    let mut rng = SmallRng::seed_from_u64(0x1C5B + i as u64);
                    let mut values = vec![0u8; cfg.value_len * LOAD_CHUNK as usize];
                    let mut start = lo;
                    while start < hi {
                        let end = (start + LOAD_CHUNK).min(hi);
                        fill_value(&mut rng, &mut values);
                        loop {
                            let mut txn = worker.begin();
                            let mut out = Ok(());
                            for (j, k) in (start..end).enumerate() {
                                let v = &values[j * cfg.value_len..(j + 1) * cfg.value_len];
                                out = txn.insert(table, &key(k), v);
                                if out.is_err() {
                                    break;
                                }
                            }
                            match out.and_then(|()| txn.commit()) {
                                Ok(_) => break,
                                Err(e) if e.is_retryable() => continue,
                                Err(e) => return Err(e),
                            }
                        }
                        pb.inc(end - start);
                        start = end;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("loader thread panicked")).collect()
    });
    pb.finish_and_clear();
    results.into_iter().collect::<Result<Vec<()>, Error>>()?;
    Ok(Ycsb { table, config: cfg.clone() })
}

/// Looks up the table of an already loaded database; `cfg.keys` is replaced by what the
/// data holds (largest key + 1).
pub fn open(db: &Arc<Database>, cfg: &YcsbConfig) -> Result<Ycsb, String> {
    let table = db.table_id(TABLE).ok_or("no table \"ycsb\": YCSB is not loaded")?;
    let last = db
        .read()
        .scan(table, Bound::Unbounded, Bound::Unbounded, ditto_engine::Direction::Reverse, 1)
        .map_err(|e| e.to_string())?;
    let (k, _) = last.first().ok_or("the ycsb table is empty")?;
    let k: [u8; 8] = k.as_ref().try_into().map_err(|_| "a ycsb key is not 8 bytes")?;
    Ok(Ycsb { table, config: YcsbConfig { keys: u64::from_be_bytes(k) + 1, ..cfg.clone() } })
}

/// Checks that the table holds exactly the keys 0..keys. Returns the row count.
pub fn check(db: &Database, y: &Ycsb) -> Result<u64, String> {
    let (mut rows, mut bad) = (0u64, None);
    db.read()
        .for_each(y.table, Bound::Unbounded, Bound::Unbounded, |k, v| {
            let ok = k.len() == 8
                && u64::from_be_bytes(k.try_into().expect("8 bytes")) < y.config.keys
                && v.len() == y.config.value_len;
            if !ok {
                bad = Some(k.to_vec());
                return false;
            }
            rows += 1;
            true
        })
        .map_err(|e| e.to_string())?;
    if let Some(k) = bad {
        return Err(format!("unexpected ycsb row with key {k:?}"));
    }
    if rows != y.config.keys {
        return Err(format!("ycsb has {rows} rows, expected {}", y.config.keys));
    }
    Ok(rows)
}

/// YCSB's ZipfianGenerator (Gray et al.): ranks 0..n, rank 0 the most popular, with
/// P(rank i) proportional to 1 / (i + 1)^theta.
#[derive(Clone, Copy, Debug)]
pub struct Zipfian {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// O(n) to compute zeta(n, theta) once.
    pub fn new(n: u64, theta: f64) -> Zipfian {
        assert!(n >= 1, "zipfian over no items");
        assert!(theta > 0.0 && theta < 1.0, "zipfian theta must be in (0, 1), got {theta}");
        let zeta = |n: u64| (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2.min(n));
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipfian { n, theta, alpha: 1.0 / (1.0 - theta), zetan, eta }
    }

    /// A rank in 0..n.
    pub fn next_rank(&self, rng: &mut impl Rng) -> u64 {
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n - 1);
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }

    /// A key in 0..n: the rank scrambled as YCSB's ScrambledZipfianGenerator does.
    pub fn next_scrambled(&self, rng: &mut impl Rng) -> u64 {
        fnv1a64(self.next_rank(rng)) % self.n
    }
}

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 bytes of `v`, low byte first, made
/// non-negative as a Java long.
fn fnv1a64(mut v: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for _ in 0..8 {
        h ^= v & 0xFF;
        h = h.wrapping_mul(0x0100_0000_01B3);
        v >>= 8;
    }
    (h as i64).unsigned_abs()
}

struct YcsbWorker {
    table: TableId,
    keys: u64,
    ops: usize,
    read_only_fraction: f64,
    zipf: Option<Zipfian>,
    rng: SmallRng,
    /// The current transaction's keys (kept for retries).
    cur: Vec<[u8; 8]>,
    /// The values read, back to back, and where each ends.
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl YcsbWorker {
    fn draw_key(&mut self) -> u64 {
        match &self.zipf {
            Some(z) => z.next_scrambled(&mut self.rng),
            None => self.rng.gen_range(0..self.keys),
        }
    }
}

impl Workload for YcsbWorker {
    /// Whether the transaction is read-write; its keys are in `cur`.
    type Input = bool;

    fn read_only(&self, ty: usize) -> bool {
        ty == READ_ONLY
    }

    fn next(&mut self) -> (usize, bool) {
        let read_only = self.rng.gen::<f64>() < self.read_only_fraction;
        self.cur.clear();
        while self.cur.len() < self.ops {
            let k = key(self.draw_key());
            if !self.cur.contains(&k) {
                self.cur.push(k);
            }
        }
        if read_only {
            (READ_ONLY, false)
        } else {
            (READ_WRITE, true)
        }
    }

    fn execute(&mut self, worker: &mut Worker, &read_write: &bool) -> Result<Outcome, Error> {
        // All of a transaction's keys are read in one batch (`get_many_with`: their index
        // descents overlap). Each value is copied out, as a client would receive it, into
        // `buf`, the read-modify-writes' new values stamped in place.
        self.buf.clear();
        self.ends.clear();
        let (buf, ends, rng) = (&mut self.buf, &mut self.ends, &mut self.rng);
        let mut absent = false;
        let mut take = |_: usize, v: Option<&[u8]>| match v {
            Some(v) => {
                let start = buf.len();
                buf.extend_from_slice(v);
                if read_write {
                    let n = v.len().min(8);
                    buf[start..start + n].copy_from_slice(&rng.next_u64().to_le_bytes()[..n]);
                }
                ends.push(buf.len());
            }
            None => absent = true,
        };
        if !read_write {
            worker.db().read().get_many_with(self.table, &self.cur, &mut take)?;
            std::hint::black_box(&self.buf);
            return if absent { Err(Error::KeyNotFound) } else { Ok(Outcome::Committed(None)) };
        }
        let mut txn = worker.begin();
        txn.get_many_with(self.table, &self.cur, &mut take)?;
        if absent {
            return Err(Error::KeyNotFound);
        }
        let mut start = 0;
        for (kb, &end) in self.cur.iter().zip(&self.ends) {
            txn.update(self.table, kb, &self.buf[start..end])?;
            start = end;
        }
        Ok(Outcome::Committed(Some(txn.commit_async()?)))
    }
}

/// Runs the mix for `cfg.duration` with `cfg.workers` workers (worker i seeds with
/// `cfg.seed + i`).
pub fn run(db: &Arc<Database>, y: &Ycsb, cfg: &RunConfig, probe: &Probe<'_>) -> Result<Report, Error> {
    let c = &y.config;
    assert!(c.ops_per_txn >= 1 && c.keys >= c.ops_per_txn as u64, "need at least ops_per_txn keys");
    let zipf = c.zipf_theta.map(|theta| Zipfian::new(c.keys, theta));
    let extra = serde_json::json!({
        "keys": c.keys,
        "value_len": c.value_len,
        "distribution": if c.zipf_theta.is_some() { "zipfian (scrambled)" } else { "uniform" },
        "zipf_theta": c.zipf_theta,
        "read_only_fraction": c.read_only_fraction,
        "ops_per_txn": c.ops_per_txn,
    });
    harness::run_workload(db, "ycsb", &TYPES, cfg, probe, extra, |i| YcsbWorker {
        table: y.table,
        keys: c.keys,
        ops: c.ops_per_txn,
        read_only_fraction: c.read_only_fraction,
        zipf,
        rng: SmallRng::seed_from_u64(cfg.seed.wrapping_add(i as u64)),
        cur: Vec::with_capacity(c.ops_per_txn),
        buf: Vec::with_capacity(c.value_len * c.ops_per_txn),
        ends: Vec::with_capacity(c.ops_per_txn),
    })
}
