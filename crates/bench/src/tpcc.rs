//! TPC-C (revision 5.11), full mix, embedded as Silo and Rolis run it
//! ===================================================================
//! Each worker thread is bound to a home warehouse (`(i % warehouses) + 1`) and runs the
//! five transactions back to back with no terminals, no keying or think time:
//!
//! ```text
//!  NewOrder 45%   Payment 43%   OrderStatus 4%   Delivery 4%   StockLevel 4%
//!  (read-write)   (read-write)  (snapshot)       (read-write)  (snapshot)
//! ```
//!
//! Schema: vertical partitioning, as Silo does for some tables and here for all that are
//! updated. Every row a transaction writes is logged whole (redo after-images), so the
//! columns transactions update are kept apart from those that are read-only after the load:
//! `warehouse` holds W_YTD and W_TAX, `warehouse_info` the name and address; `district`
//! holds D_YTD, D_TAX and D_NEXT_O_ID, `district_info` the name and address; `customer`
//! holds the balance and the three counters Payment and Delivery update, `customer_info`
//! the rest but C_DATA, which lives in `customer_data` (written only by Payment for
//! BC-credit customers); `stock` holds the four counters NewOrder updates, `stock_data` the
//! S_DIST_xx and S_DATA it only reads. Secondary indexes are tables: `customer_name_idx`
//! (customers by last name) and `oorder_c_id_idx` (a customer's orders). Keys are
//! big-endian fixed-width integers (byte order = numeric order); values are short integers
//! (see `Enc`), fixed byte arrays and length-prefixed strings.
//! Money is in integer cents, rates (tax, discount) in units of 1/10000.
//!
//! See docs/benchmarks.md for the mix, the measurements and the deviations from the spec.

use std::io::Write as _;
use std::ops::Bound::{self, Excluded, Included};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ditto_engine::{Database, Direction, Error, TableId, Transaction, Worker, WorkerId};
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::harness::{self, Outcome, Probe, Report, RunConfig, Workload};

/// Districts per warehouse (fixed by the spec).
pub const DISTRICTS: u8 = 10;
/// The transaction types, in the order of `Report::per_type`.
pub const TYPES: [&str; 5] = ["NewOrder", "Payment", "OrderStatus", "Delivery", "StockLevel"];
const NEW_ORDER: usize = 0;
const PAYMENT: usize = 1;
const ORDER_STATUS: usize = 2;
const DELIVERY: usize = 3;
const STOCK_LEVEL: usize = 4;

/// NURand constants (2.1.6). C for C_LAST at load and run differ by 86, inside the allowed
/// [65, 119] and not 96 or 112 (2.1.6.1); C for C_ID and OL_I_ID is the same at load and run.
const C_LAST_LOAD: u32 = 157;
const C_LAST_RUN: u32 = (C_LAST_LOAD + 86) % 256;
const C_ID: u32 = 259;
const C_OL_I_ID: u32 = 7911;

/// Rows per loader transaction.
const LOAD_CHUNK: usize = 500;

/// Sizes of the database to load.
#[derive(Clone, Debug, Serialize)]
pub struct TpccConfig {
    pub warehouses: u32,
    /// 100,000 in the spec.
    pub items: u32,
    /// 3,000 in the spec. Each district also starts with this many orders, the last 30% of
    /// them (900 of 3,000) undelivered and in new_order.
    pub customers_per_district: u32,
}

impl TpccConfig {
    /// The spec's sizes.
    pub fn new(warehouses: u32) -> TpccConfig {
        TpccConfig { warehouses, items: 100_000, customers_per_district: 3_000 }
    }

    /// Reduced sizes for fast tests: 1,000 items, 100 customers and orders per district.
    pub fn small(warehouses: u32) -> TpccConfig {
        TpccConfig { warehouses, items: 1_000, customers_per_district: 100 }
    }

    fn new_orders_per_district(&self) -> u32 {
        new_orders_per_district(self.customers_per_district)
    }
}

/// The last 30% of the initial orders (900 of 3,000) are undelivered.
fn new_orders_per_district(customers: u32) -> u32 {
    customers * 3 / 10
}

impl Default for TpccConfig {
    fn default() -> Self {
        TpccConfig::new(1)
    }
}

/// The table ids of a loaded TPC-C database.
#[derive(Clone, Copy, Debug)]
pub struct Tables {
    pub warehouse: TableId,
    pub warehouse_info: TableId,
    pub district: TableId,
    pub district_info: TableId,
    pub customer: TableId,
    pub customer_info: TableId,
    pub customer_data: TableId,
    pub customer_name_idx: TableId,
    pub history: TableId,
    pub new_order: TableId,
    pub oorder: TableId,
    pub oorder_c_id_idx: TableId,
    pub order_line: TableId,
    pub item: TableId,
    pub stock: TableId,
    pub stock_data: TableId,
}

const TABLE_NAMES: [&str; 16] = [
    "warehouse",
    "warehouse_info",
    "district",
    "district_info",
    "customer",
    "customer_info",
    "customer_data",
    "customer_name_idx",
    "history",
    "new_order",
    "oorder",
    "oorder_c_id_idx",
    "order_line",
    "item",
    "stock",
    "stock_data",
];

impl Tables {
    fn from_ids(id: impl Fn(&str) -> Result<TableId, String>) -> Result<Tables, String> {
        Ok(Tables {
            warehouse: id("warehouse")?,
            warehouse_info: id("warehouse_info")?,
            district: id("district")?,
            district_info: id("district_info")?,
            customer: id("customer")?,
            customer_info: id("customer_info")?,
            customer_data: id("customer_data")?,
            customer_name_idx: id("customer_name_idx")?,
            history: id("history")?,
            new_order: id("new_order")?,
            oorder: id("oorder")?,
            oorder_c_id_idx: id("oorder_c_id_idx")?,
            order_line: id("order_line")?,
            item: id("item")?,
            stock: id("stock")?,
            stock_data: id("stock_data")?,
        })
    }
}

/// A loaded TPC-C database: its tables and sizes.
#[derive(Clone, Debug)]
pub struct Tpcc {
    pub tables: Tables,
    pub warehouses: u32,
    pub items: u32,
    pub customers_per_district: u32,
}

impl Tpcc {
    fn last_name_max(&self) -> u32 {
        self.customers_per_district.min(1000) - 1
    }
}

// ---- keys: big-endian, fixed width ------------------------------------------------------

fn wkey(w: u32) -> [u8; 4] {
    w.to_be_bytes()
}

fn dkey(w: u32, d: u8) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[..4].copy_from_slice(&w.to_be_bytes());
    k[4] = d;
    k
}

/// (w, d, x): customer (x = c_id), oorder and new_order (x = o_id).
fn wdx_key(w: u32, d: u8, x: u32) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[..4].copy_from_slice(&w.to_be_bytes());
    k[4] = d;
    k[5..].copy_from_slice(&x.to_be_bytes());
    k
}

fn ocidx_key(w: u32, d: u8, c: u32, o: u32) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[..9].copy_from_slice(&wdx_key(w, d, c));
    k[9..].copy_from_slice(&o.to_be_bytes());
    k
}

fn ol_key(w: u32, d: u8, o: u32, ol: u8) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..9].copy_from_slice(&wdx_key(w, d, o));
    k[9] = ol;
    k
}

fn ikey(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

fn skey(w: u32, i: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&w.to_be_bytes());
    k[4..].copy_from_slice(&i.to_be_bytes());
    k
}

const NAME_LEN: usize = 16;
const NAME_KEY_LEN: usize = 4 + 1 + NAME_LEN + NAME_LEN + 4;

/// customer_name_idx: (w, d, c_last zero-padded to 16, c_first zero-padded to 16, c_id).
fn name_key(w: u32, d: u8, last: &[u8], first: &[u8], c: u32) -> [u8; NAME_KEY_LEN] {
    let mut k = [0u8; NAME_KEY_LEN];
    k[..5].copy_from_slice(&dkey(w, d));
    k[5..5 + last.len()].copy_from_slice(last);
    k[21..21 + first.len()].copy_from_slice(first);
    k[37..].copy_from_slice(&c.to_be_bytes());
    k
}

/// The key range of all customers of (w, d) with last name `last`.
fn name_range(w: u32, d: u8, last: &[u8]) -> ([u8; NAME_KEY_LEN], [u8; NAME_KEY_LEN]) {
    let lo = name_key(w, d, last, &[], 0);
    let mut hi = lo;
    hi[21..].fill(0xFF);
    (lo, hi)
}

/// history: (w, d, c, sequence, worker); loaded rows use worker 0xFFFF.
fn hkey(w: u32, d: u8, c: u32, seq: u64, worker: u16) -> [u8; 19] {
    let mut k = [0u8; 19];
    k[..9].copy_from_slice(&wdx_key(w, d, c));
    k[9..17].copy_from_slice(&seq.to_be_bytes());
    k[17..].copy_from_slice(&worker.to_be_bytes());
    k
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

// ---- values: short integers, fixed byte arrays, length-prefixed strings -----------------

/// Integers below `SHORT_MAX` (after zigzag for signed ones) take one byte; larger ones a
/// tag byte `SHORT_MAX - 1 + n` and their `n` low bytes, little-endian (n = 1..=8). So the
/// small counters, ids and cent amounts most columns hold take one to four bytes instead
/// of four or eight: every row a transaction writes is logged whole, and most of TPC-C's
/// log is rows. Unlike LEB128 varints, the length is known from the first byte, so reading
/// one is a masked load rather than a loop over its bytes (LEB128's loop cost TPC-C about
/// 3,150 instructions per transaction; see docs/results.md, eighth session).
const SHORT_MAX: u8 = 0xF8;

struct Enc<'a>(&'a mut Vec<u8>);

impl Enc<'_> {
    fn start(out: &mut Vec<u8>) -> Enc<'_> {
        out.clear();
        Enc(out)
    }
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    #[inline(always)]
    fn u64(&mut self, v: u64) {
        if v < u64::from(SHORT_MAX) {
            self.0.push(v as u8);
        } else {
            let n = (64 - v.leading_zeros() as usize).div_ceil(8);
            self.0.push(SHORT_MAX - 1 + n as u8);
            self.0.extend_from_slice(&v.to_le_bytes()[..n]);
        }
    }
    #[inline(always)]
    fn u32(&mut self, v: u32) {
        self.u64(v.into());
    }
    #[inline(always)]
    fn i64(&mut self, v: i64) {
        self.u64(((v << 1) ^ (v >> 63)) as u64);
    }
    #[inline(always)]
    fn i32(&mut self, v: i32) {
        self.i64(v.into());
    }
    fn fixed(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    fn str(&mut self, v: &[u8]) {
        let len = u8::try_from(v.len()).expect("strings are at most 255 bytes");
        self.0.push(len);
        self.0.extend_from_slice(v);
    }
}

/// Reads fields in order. Rows are written only by this module, so a short or malformed
/// row is a bug: it panics.
struct Dec<'a>(&'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        assert!(self.0.len() >= n, "TPC-C row too short");
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    fn fixed<const N: usize>(&mut self) -> [u8; N] {
        self.take(N).try_into().expect("N bytes")
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    #[inline(always)]
    fn u64(&mut self) -> u64 {
        let tag = self.u8();
        if tag < SHORT_MAX {
            return tag.into();
        }
        let n = usize::from(tag - (SHORT_MAX - 1));
        // With 8 bytes left, one unaligned load and a mask; near a row's end, a copy.
        if let Some(word) = self.0.first_chunk::<8>() {
            let v = u64::from_le_bytes(*word) & (u64::MAX >> (64 - 8 * n));
            self.0 = &self.0[n..];
            return v;
        }
        let mut le = [0u8; 8];
        le[..n].copy_from_slice(self.take(n));
        u64::from_le_bytes(le)
    }
    #[inline(always)]
    fn u32(&mut self) -> u32 {
        u32::try_from(self.u64()).expect("TPC-C row: u32 column out of range")
    }
    #[inline(always)]
    fn i64(&mut self) -> i64 {
        let v = self.u64();
        (v >> 1) as i64 ^ -((v & 1) as i64)
    }
    #[inline(always)]
    fn i32(&mut self) -> i32 {
        i32::try_from(self.i64()).expect("TPC-C row: i32 column out of range")
    }
    fn str(&mut self) -> &'a [u8] {
        let n = self.u8() as usize;
        self.take(n)
    }
}

/// A column type as rows store it (see `Enc` and `Dec`).
trait Field<'a>: Sized {
    fn put(&self, e: &mut Enc<'_>);
    fn get(d: &mut Dec<'a>) -> Self;
}

macro_rules! int_field {
    ($($t:ident),*) => {$(
        impl Field<'_> for $t {
            fn put(&self, e: &mut Enc<'_>) {
                e.$t(*self)
            }
            fn get(d: &mut Dec<'_>) -> Self {
                d.$t()
            }
        }
    )*};
}
int_field!(u8, u32, i32, u64, i64);

impl<const N: usize> Field<'_> for [u8; N] {
    fn put(&self, e: &mut Enc<'_>) {
        e.fixed(self)
    }
    fn get(d: &mut Dec<'_>) -> Self {
        d.fixed()
    }
}

/// A length-prefixed string, borrowed from the row it was decoded from.
impl<'a> Field<'a> for &'a [u8] {
    fn put(&self, e: &mut Enc<'_>) {
        e.str(self)
    }
    fn get(d: &mut Dec<'a>) -> Self {
        d.str()
    }
}

/// A row struct with `encode` (fields in declaration order) and `decode` (the same order).
macro_rules! row {
    ($(#[$m:meta])* struct $name:ident $(<$lt:lifetime>)? { $($(#[$fm:meta])* $f:ident: $t:ty,)* }) => {
        $(#[$m])*
        struct $name $(<$lt>)? { $($(#[$fm])* $f: $t,)* }

        impl<'a> $name $(<$lt>)? {
            fn encode(&self, out: &mut Vec<u8>) {
                let mut e = Enc::start(out);
                $(Field::put(&self.$f, &mut e);)*
            }
            // History rows are only written.
            #[allow(dead_code)]
            fn decode(b: &'a [u8]) -> Self {
                let mut d = Dec(b);
                $name { $($f: Field::get(&mut d),)* }
            }
        }
    };
}

row! {
    /// The warehouse columns a transaction writes or reads on every call: W_YTD (Payment)
    /// and W_TAX (NewOrder).
    struct Warehouse {
        ytd: i64,
        tax: i32,
    }
}

row! {
    /// The rest of the warehouse, read-only after the load (Payment reads W_NAME).
    struct WarehouseInfo<'a> {
        name: &'a [u8],
        street_1: &'a [u8],
        street_2: &'a [u8],
        city: &'a [u8],
        state: [u8; 2],
        zip: [u8; 9],
    }
}

row! {
    /// The district columns a transaction writes or reads on every call: D_YTD (Payment),
    /// D_NEXT_O_ID (NewOrder, StockLevel) and D_TAX (NewOrder).
    struct District {
        ytd: i64,
        tax: i32,
        next_o_id: u32,
    }
}

row! {
    /// The rest of the district, read-only after the load (Payment reads D_NAME).
    struct DistrictInfo<'a> {
        name: &'a [u8],
        street_1: &'a [u8],
        street_2: &'a [u8],
        city: &'a [u8],
        state: [u8; 2],
        zip: [u8; 9],
    }
}

row! {
    /// The customer columns Payment and Delivery update.
    struct Customer {
        balance: i64,
        ytd_payment: i64,
        payment_cnt: u32,
        delivery_cnt: u32,
    }
}

row! {
    /// The customer columns that are read-only after the load, but for C_DATA.
    struct CustomerInfo<'a> {
        credit_lim: i64,
        discount: i32,
        credit: [u8; 2],
        since: u64,
        first: &'a [u8],
        middle: [u8; 2],
        last: &'a [u8],
        street_1: &'a [u8],
        street_2: &'a [u8],
        city: &'a [u8],
        state: [u8; 2],
        zip: [u8; 9],
        phone: [u8; 16],
    }
}

row! {
    struct History<'a> {
        c_id: u32,
        c_d_id: u8,
        c_w_id: u32,
        d_id: u8,
        w_id: u32,
        date: u64,
        amount: i64,
        data: &'a [u8],
    }
}

row! {
    struct Order {
        c_id: u32,
        entry_d: u64,
        /// 0: null (not delivered).
        carrier_id: u8,
        ol_cnt: u8,
        all_local: u8,
    }
}

row! {
    struct OrderLine {
        i_id: u32,
        supply_w_id: u32,
        /// 0: null (not delivered).
        delivery_d: u64,
        quantity: u8,
        amount: i64,
        dist_info: [u8; 24],
    }
}

row! {
    struct Item<'a> {
        im_id: u32,
        price: i64,
        name: &'a [u8],
        data: &'a [u8],
    }
}

row! {
    /// The stock columns NewOrder updates.
    #[derive(Clone, Copy, Default)]
    struct Stock {
        quantity: i32,
        ytd: u32,
        order_cnt: u32,
        remote_cnt: u32,
    }
}

/// The stock columns that are read-only after load: S_DIST_01..10 and S_DATA.
struct StockData<'a> {
    dist: &'a [u8],
    data: &'a [u8],
}

impl<'a> StockData<'a> {
    fn encode(dist: &[[u8; 24]; 10], data: &[u8], out: &mut Vec<u8>) {
        let mut e = Enc::start(out);
        for d in dist {
            e.fixed(d);
        }
        e.str(data);
    }
    fn decode(b: &'a [u8]) -> Self {
        let mut d = Dec(b);
        StockData { dist: d.take(240), data: d.str() }
    }
    fn dist_info(&self, d: u8) -> [u8; 24] {
        let at = (d as usize - 1) * 24;
        self.dist[at..at + 24].try_into().expect("24 bytes")
    }
}

// ---- random data (4.3.2) ------------------------------------------------------------------

const ALNUM: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const SYLLABLES: [&[u8]; 10] =
    [b"BAR", b"OUGHT", b"ABLE", b"PRI", b"PRES", b"ESE", b"ANTI", b"CALLY", b"ATION", b"EING"];

fn astring(rng: &mut SmallRng, lo: usize, hi: usize, out: &mut Vec<u8>) {
    out.clear();
    let n = rng.gen_range(lo..=hi);
    out.extend((0..n).map(|_| ALNUM[rng.gen_range(0..ALNUM.len())]));
}

fn afixed<const N: usize>(rng: &mut SmallRng) -> [u8; N] {
    std::array::from_fn(|_| ALNUM[rng.gen_range(0..ALNUM.len())])
}

fn nfixed<const N: usize>(rng: &mut SmallRng) -> [u8; N] {
    std::array::from_fn(|_| b'0' + rng.gen_range(0..10u8))
}

fn zip(rng: &mut SmallRng) -> [u8; 9] {
    let mut z = *b"000011111";
    z[..4].copy_from_slice(&nfixed::<4>(rng));
    z
}

/// I_DATA / S_DATA: a-string [26..50], 10% with "ORIGINAL" at a random position.
fn data_string(rng: &mut SmallRng, out: &mut Vec<u8>) {
    astring(rng, 26, 50, out);
    if rng.gen_range(0..10) == 0 {
        let at = rng.gen_range(0..=out.len() - 8);
        out[at..at + 8].copy_from_slice(b"ORIGINAL");
    }
}

/// C_LAST for a number in 0..=999: three syllables. Returns the name and its length.
fn last_name(num: u32) -> ([u8; NAME_LEN], usize) {
    let mut out = [0u8; NAME_LEN];
    let mut len = 0;
    for digit in [num / 100, (num / 10) % 10, num % 10] {
        let s = SYLLABLES[digit as usize];
        out[len..len + s.len()].copy_from_slice(s);
        len += s.len();
    }
    (out, len)
}

fn nurand(rng: &mut SmallRng, a: u32, x: u32, y: u32, c: u32) -> u32 {
    (((rng.gen_range(0..=a) | rng.gen_range(x..=y)) + c) % (y - x + 1)) + x
}

fn contains_original(s: &[u8]) -> bool {
    s.windows(8).any(|w| w == b"ORIGINAL")
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(1)
}

// ---- load ---------------------------------------------------------------------------------

/// Buffers rows and inserts them LOAD_CHUNK at a time, one durable commit per chunk.
struct Loader<'p> {
    worker: Worker,
    keys: Vec<u8>,
    vals: Vec<u8>,
    rows: Vec<(TableId, usize, usize)>,
    pb: &'p ProgressBar,
}

impl<'p> Loader<'p> {
    fn new(worker: Worker, pb: &'p ProgressBar) -> Loader<'p> {
        Loader { worker, keys: Vec::new(), vals: Vec::new(), rows: Vec::with_capacity(LOAD_CHUNK), pb }
    }

    fn add(&mut self, table: TableId, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.keys.extend_from_slice(key);
        self.vals.extend_from_slice(value);
        self.rows.push((table, key.len(), value.len()));
        if self.rows.len() >= LOAD_CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Error> {
        if self.rows.is_empty() {
            return Ok(());
        }
        loop {
            let mut txn = self.worker.begin();
            let mut out = Ok(());
            let (mut k, mut v) = (0, 0);
            for &(table, klen, vlen) in &self.rows {
                out = txn.insert(table, &self.keys[k..k + klen], &self.vals[v..v + vlen]);
                if out.is_err() {
                    break;
                }
                (k, v) = (k + klen, v + vlen);
            }
            match out.and_then(|()| txn.commit()) {
                Ok(_) => break,
                Err(e) if e.is_retryable() => continue,
                Err(e) => return Err(e),
            }
        }
        self.pb.inc(self.rows.len() as u64);
        self.rows.clear();
        self.keys.clear();
        self.vals.clear();
        Ok(())
    }
}

/// Creates the tables and loads the initial database (4.3.3.1) in parallel: one loader
/// thread per warehouse, up to the database's worker count (loader i uses worker i); the
/// items are loaded by loader 0. Every chunk of rows commits durably.
pub fn load(db: &Arc<Database>, cfg: &TpccConfig, progress: bool) -> Result<Tpcc, Error> {
    assert!(cfg.warehouses >= 1, "at least one warehouse");
    assert!(cfg.items >= 1, "at least one item");
    assert!(cfg.customers_per_district >= 10, "at least 10 customers per district");
    let mut ids = Vec::with_capacity(TABLE_NAMES.len());
    for name in TABLE_NAMES {
        ids.push(db.create_table(name)?);
    }
    let tables = Tables::from_ids(|n| {
        let i = TABLE_NAMES.iter().position(|x| *x == n).expect("a TPC-C table name");
        Ok(ids[i])
    })
    .expect("all tables were created");
    let t = Tpcc {
        tables,
        warehouses: cfg.warehouses,
        items: cfg.items,
        customers_per_district: cfg.customers_per_district,
    };

    let c = cfg.customers_per_district as u64;
    let per_district = 5 * c + 2 * c + cfg.new_orders_per_district() as u64 + 10 * c;
    let rows = cfg.items as u64 + cfg.warehouses as u64 * (2 + 2 * cfg.items as u64 + 10 * (2 + per_district));
    let pb = harness::load_progress(rows, "tpcc load", progress);
    let loaders = (cfg.warehouses as usize).min(db.workers()).max(1);
    let next_w = AtomicU64::new(1);
    let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..loaders)
            .map(|i| {
                let (t, pb, next_w) = (&t, &pb, &next_w);
                s.spawn(move || -> Result<(), Error> {
                    let worker = db.worker(WorkerId(i as u32)).unwrap_or_else(|| panic!("worker {i} is taken"));
                    let mut l = Loader::new(worker, pb);
                    if i == 0 {
                        load_items(&mut l, t)?;
                    }
                    loop {
                        let w = next_w.fetch_add(1, Ordering::Relaxed) as u32;
                        if w > t.warehouses {
                            break;
                        }
                        load_warehouse(&mut l, t, w)?;
                    }
                    l.flush()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("loader thread panicked")).collect()
    });
    pb.finish_and_clear();
    results.into_iter().collect::<Result<Vec<()>, Error>>()?;
    Ok(t)
}

fn load_items(l: &mut Loader<'_>, t: &Tpcc) -> Result<(), Error> {
    let mut rng = SmallRng::seed_from_u64(0x17E4);
    let (mut name, mut data, mut buf) = (Vec::new(), Vec::new(), Vec::new());
    for i in 1..=t.items {
        astring(&mut rng, 14, 24, &mut name);
        data_string(&mut rng, &mut data);
        Item { im_id: rng.gen_range(1..=10_000), price: rng.gen_range(100..=10_000), name: &name, data: &data }
            .encode(&mut buf);
        l.add(t.tables.item, &ikey(i), &buf)?;
    }
    Ok(())
}

fn load_warehouse(l: &mut Loader<'_>, t: &Tpcc, w: u32) -> Result<(), Error> {
    let tb = t.tables;
    let mut rng = SmallRng::seed_from_u64(0x5EED_0000 + w as u64);
    let (mut s1, mut s2, mut s3, mut s4, mut buf) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let now = now_us();
    let customers = t.customers_per_district;
    let orders = customers;
    let first_new_order = orders - new_orders_per_district(customers) + 1;

    astring(&mut rng, 6, 10, &mut s1);
    astring(&mut rng, 10, 20, &mut s2);
    astring(&mut rng, 10, 20, &mut s3);
    astring(&mut rng, 10, 20, &mut s4);
    Warehouse { ytd: 30_000_000, tax: rng.gen_range(0..=2000) }.encode(&mut buf);
    l.add(tb.warehouse, &wkey(w), &buf)?;
    WarehouseInfo { name: &s1, street_1: &s2, street_2: &s3, city: &s4, state: afixed(&mut rng), zip: zip(&mut rng) }
        .encode(&mut buf);
    l.add(tb.warehouse_info, &wkey(w), &buf)?;

    for i in 1..=t.items {
        let dist: [[u8; 24]; 10] = std::array::from_fn(|_| afixed(&mut rng));
        data_string(&mut rng, &mut s1);
        StockData::encode(&dist, &s1, &mut buf);
        l.add(tb.stock_data, &skey(w, i), &buf)?;
        Stock { quantity: rng.gen_range(10..=100), ytd: 0, order_cnt: 0, remote_cnt: 0 }.encode(&mut buf);
        l.add(tb.stock, &skey(w, i), &buf)?;
    }

    let mut perm: Vec<u32> = (1..=customers).collect();
    for d in 1..=DISTRICTS {
        astring(&mut rng, 6, 10, &mut s1);
        astring(&mut rng, 10, 20, &mut s2);
        astring(&mut rng, 10, 20, &mut s3);
        astring(&mut rng, 10, 20, &mut s4);
        District { ytd: 3_000_000, tax: rng.gen_range(0..=2000), next_o_id: orders + 1 }.encode(&mut buf);
        l.add(tb.district, &dkey(w, d), &buf)?;
        DistrictInfo {
            name: &s1,
            street_1: &s2,
            street_2: &s3,
            city: &s4,
            state: afixed(&mut rng),
            zip: zip(&mut rng),
        }
        .encode(&mut buf);
        l.add(tb.district_info, &dkey(w, d), &buf)?;

        for c in 1..=customers {
            let num = if c <= 1000 { c - 1 } else { nurand(&mut rng, 255, 0, 999, C_LAST_LOAD) };
            let (last, last_len) = last_name(num % (t.last_name_max() + 1));
            let last = &last[..last_len];
            let mut first = Vec::new();
            astring(&mut rng, 8, 16, &mut first);
            astring(&mut rng, 10, 20, &mut s1);
            astring(&mut rng, 10, 20, &mut s2);
            astring(&mut rng, 10, 20, &mut s3);
            Customer { balance: -1000, ytd_payment: 1000, payment_cnt: 1, delivery_cnt: 0 }.encode(&mut buf);
            l.add(tb.customer, &wdx_key(w, d, c), &buf)?;
            CustomerInfo {
                credit_lim: 5_000_000,
                discount: rng.gen_range(0..=5000),
                credit: if rng.gen_range(0..10) == 0 { *b"BC" } else { *b"GC" },
                since: now,
                first: &first,
                middle: *b"OE",
                last,
                street_1: &s1,
                street_2: &s2,
                city: &s3,
                state: afixed(&mut rng),
                zip: zip(&mut rng),
                phone: nfixed(&mut rng),
            }
            .encode(&mut buf);
            l.add(tb.customer_info, &wdx_key(w, d, c), &buf)?;
            astring(&mut rng, 300, 500, &mut s4);
            l.add(tb.customer_data, &wdx_key(w, d, c), &s4)?;
            l.add(tb.customer_name_idx, &name_key(w, d, last, &first, c), &c.to_le_bytes())?;
            astring(&mut rng, 12, 24, &mut s4);
            History { c_id: c, c_d_id: d, c_w_id: w, d_id: d, w_id: w, date: now, amount: 1000, data: &s4 }
                .encode(&mut buf);
            l.add(tb.history, &hkey(w, d, c, 0, u16::MAX), &buf)?;
        }

        // Orders: customers in a random permutation (4.3.3.1).
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.gen_range(0..=i));
        }
        for o in 1..=orders {
            let c = perm[o as usize - 1];
            let delivered = o < first_new_order;
            let ol_cnt = rng.gen_range(5..=15u8);
            Order {
                c_id: c,
                entry_d: now,
                carrier_id: if delivered { rng.gen_range(1..=10) } else { 0 },
                ol_cnt,
                all_local: 1,
            }
            .encode(&mut buf);
            l.add(tb.oorder, &wdx_key(w, d, o), &buf)?;
            l.add(tb.oorder_c_id_idx, &ocidx_key(w, d, c, o), &[])?;
            for ol in 1..=ol_cnt {
                OrderLine {
                    i_id: rng.gen_range(1..=t.items),
                    supply_w_id: w,
                    delivery_d: if delivered { now } else { 0 },
                    quantity: 5,
                    amount: if delivered { 0 } else { rng.gen_range(1..=999_999) },
                    dist_info: afixed(&mut rng),
                }
                .encode(&mut buf);
                l.add(tb.order_line, &ol_key(w, d, o, ol), &buf)?;
            }
            if !delivered {
                l.add(tb.new_order, &wdx_key(w, d, o), &[])?;
            }
        }
    }
    Ok(())
}

/// Looks up the tables of an already loaded database (after recovery, say) and reads the
/// sizes from the data.
pub fn open(db: &Arc<Database>) -> Result<Tpcc, String> {
    let tables = Tables::from_ids(|n| db.table_id(n).ok_or_else(|| format!("no table {n:?}: TPC-C is not loaded")))?;
    let r = db.read();
    let err = |e: Error| e.to_string();
    let warehouses = r
        .scan(tables.warehouse, Bound::Unbounded, Bound::Unbounded, Direction::Reverse, 1)
        .map_err(err)?
        .first()
        .map(|(k, _)| be_u32(k, 0))
        .ok_or("the warehouse table is empty")?;
    let items = r
        .scan(tables.item, Bound::Unbounded, Bound::Unbounded, Direction::Reverse, 1)
        .map_err(err)?
        .first()
        .map(|(k, _)| be_u32(k, 0))
        .ok_or("the item table is empty")?;
    let (lo, hi) = (wdx_key(1, 1, 0), wdx_key(1, 1, u32::MAX));
    let customers_per_district = r
        .scan(tables.customer, Included(&lo), Included(&hi), Direction::Reverse, 1)
        .map_err(err)?
        .first()
        .map(|(k, _)| be_u32(k, 5))
        .ok_or("district (1, 1) has no customers")?;
    Ok(Tpcc { tables, warehouses, items, customers_per_district })
}

// ---- transactions -------------------------------------------------------------------------

#[derive(Clone, Copy, Default)]
struct OrderItem {
    i_id: u32,
    supply_w: u32,
    quantity: u8,
}

#[derive(Clone, Copy)]
enum CustomerBy {
    Id(u32),
    /// Last name (zero-padded) and its length.
    Last([u8; NAME_LEN], u8),
}

enum Input {
    NewOrder { d: u8, c: u32, n: u8, items: [OrderItem; 15], all_local: bool },
    Payment { d: u8, c_w: u32, c_d: u8, by: CustomerBy, amount: i64 },
    OrderStatus { d: u8, by: CustomerBy },
    Delivery { carrier: u8 },
    StockLevel { d: u8, threshold: i32 },
}

/// One worker's state: its generator, home warehouse and reusable buffers.
struct TpccWorker<'a> {
    t: &'a Tpcc,
    rng: SmallRng,
    home: u32,
    id: u16,
    history_seq: u64,
    buf: Vec<u8>,
    buf2: Vec<u8>,
    ids: Vec<u32>,
    /// StockLevel's stock keys, for one batched read.
    stock_keys: Vec<[u8; 8]>,
    /// Per district of the home warehouse, an order id that was once the oldest undelivered
    /// one: order ids only grow and Delivery takes the oldest, so none below it is
    /// undelivered, and Delivery's scan can start there instead of at 0 (as Silo's TPC-C
    /// does with `last_no_o_ids`), rather than walk the deleted front of the queue.
    oldest_new_order: [u32; DISTRICTS as usize],
}

/// A row the schema guarantees is absent: a bug or a corrupted database, not retryable.
fn missing(_what: &'static str) -> Error {
    Error::KeyNotFound
}

/// NewOrder inserts rows keyed by the D_NEXT_O_ID it read. If they exist, another worker
/// committed the same order id after our read, so our read is stale and validation would
/// fail: abort as a conflict, as Silo does for an insert of an existing key.
fn stale_insert(e: Error) -> Error {
    match e {
        Error::KeyExists => Error::Conflict("insert of an existing key"),
        e => e,
    }
}

impl TpccWorker<'_> {
    fn other_warehouse(&mut self) -> u32 {
        let o = self.rng.gen_range(1..self.t.warehouses);
        if o >= self.home {
            o + 1
        } else {
            o
        }
    }

    fn customer_by(&mut self) -> CustomerBy {
        if self.rng.gen_range(1..=100) <= 60 {
            let (name, len) = last_name(nurand(&mut self.rng, 255, 0, self.t.last_name_max(), C_LAST_RUN));
            CustomerBy::Last(name, len as u8)
        } else {
            CustomerBy::Id(nurand(&mut self.rng, 1023, 1, self.t.customers_per_district, C_ID))
        }
    }

    fn new_order(
        &mut self,
        worker: &mut Worker,
        d: u8,
        c: u32,
        lines: &[OrderItem],
        all_local: bool,
    ) -> Result<Outcome, Error> {
        let (tb, w) = (self.t.tables, self.home);
        let mut txn = worker.begin();
        // Reads decode in place (`get_with`): no copy and no reference count per row.
        let w_tax =
            txn.get_with(tb.warehouse, &wkey(w), |b| Warehouse::decode(b).tax)?.ok_or_else(|| missing("warehouse"))?;
        let dk = dkey(w, d);
        let buf = &mut self.buf;
        let (o_id, d_tax) = txn
            .get_with(tb.district, &dk, |b| {
                let mut dist = District::decode(b);
                let out = (dist.next_o_id, dist.tax);
                dist.next_o_id += 1;
                dist.encode(buf);
                out
            })?
            .ok_or_else(|| missing("district"))?;
        txn.update(tb.district, &dk, &self.buf)?;
        let c_discount = txn
            .get_with(tb.customer_info, &wdx_key(w, d, c), |b| {
                let cust = CustomerInfo::decode(b);
                std::hint::black_box((cust.last, cust.credit));
                cust.discount
            })?
            .ok_or_else(|| missing("customer"))?;

        let entry_d = now_us();
        Order { c_id: c, entry_d, carrier_id: 0, ol_cnt: lines.len() as u8, all_local: all_local as u8 }
            .encode(&mut self.buf);
        let ok = wdx_key(w, d, o_id);
        txn.insert(tb.oorder, &ok, &self.buf).map_err(stale_insert)?;
        txn.insert(tb.new_order, &ok, &[]).map_err(stale_insert)?;
        txn.insert(tb.oorder_c_id_idx, &ocidx_key(w, d, c, o_id), &[]).map_err(stale_insert)?;

        // The items, stocks and stock data of all lines are read in three batches, so their
        // index descents overlap (`get_many_with`); the reads are the spec's, in another
        // order, which a serializable transaction cannot tell apart.
        let n = lines.len();
        let mut item = [(0i64, false); 15];
        let mut absent = false;
        let ikeys: [[u8; 4]; 15] = std::array::from_fn(|k| ikey(lines.get(k).map_or(0, |l| l.i_id)));
        txn.get_many_with(tb.item, &ikeys[..n], |k, v| match v {
            Some(b) => {
                let it = Item::decode(b);
                std::hint::black_box(it.name);
                item[k] = (it.price, contains_original(it.data));
            }
            None => absent = true,
        })?;
        if absent {
            // The 1% rollback (2.4.2.3): an unused item id. Dropping the transaction aborts it.
            return Ok(Outcome::UserAbort);
        }
        let skeys: [[u8; 8]; 15] = std::array::from_fn(|k| lines.get(k).map_or([0; 8], |l| skey(l.supply_w, l.i_id)));
        let mut stock_data = [([0u8; 24], false); 15];
        txn.get_many_with(tb.stock_data, &skeys[..n], |k, v| match v {
            Some(b) => {
                let sd = StockData::decode(b);
                stock_data[k] = (sd.dist_info(d), contains_original(sd.data));
            }
            None => absent = true,
        })?;
        if absent {
            return Err(missing("stock_data"));
        }
        // Stocks last: their updates below then find them among the remembered keys.
        let mut stock = [Stock::default(); 15];
        txn.get_many_with(tb.stock, &skeys[..n], |k, v| match v {
            Some(b) => stock[k] = Stock::decode(b),
            None => absent = true,
        })?;
        if absent {
            return Err(missing("stock"));
        }
        let mut total = 0i64;
        for (k, line) in lines.iter().enumerate() {
            // An item ordered twice updates the stock its earlier line left.
            let mut s = match skeys[..k].iter().rposition(|x| *x == skeys[k]) {
                Some(j) => stock[j],
                None => stock[k],
            };
            let q = line.quantity as i32;
            s.quantity = if s.quantity >= q + 10 { s.quantity - q } else { s.quantity - q + 91 };
            s.ytd += line.quantity as u32;
            s.order_cnt += 1;
            if line.supply_w != w {
                s.remote_cnt += 1;
            }
            stock[k] = s;
            s.encode(&mut self.buf);
            txn.update(tb.stock, &skeys[k], &self.buf)?;
            let ((i_price, i_original), (dist_info, s_original)) = (item[k], stock_data[k]);
            let brand_generic = i_original && s_original;
            std::hint::black_box(brand_generic);
            let amount = line.quantity as i64 * i_price;
            total += amount;
            OrderLine {
                i_id: line.i_id,
                supply_w_id: line.supply_w,
                delivery_d: 0,
                quantity: line.quantity,
                amount,
                dist_info,
            }
            .encode(&mut self.buf);
            txn.insert(tb.order_line, &ol_key(w, d, o_id, k as u8 + 1), &self.buf).map_err(stale_insert)?;
        }
        // Total amount (2.4.2.2), computed as the terminal would display it.
        let total =
            total as i128 * (10_000 - c_discount as i128) * (10_000 + w_tax as i128 + d_tax as i128) / 100_000_000;
        std::hint::black_box(total);
        Ok(Outcome::Committed(Some(txn.commit_async()?)))
    }

    /// Finds a customer by last name in a read-write transaction: the one at position
    /// ceil(n / 2) of those with the name, sorted by first name (2.5.2.2).
    fn customer_by_last(txn: &mut Transaction<'_>, tb: &Tables, w: u32, d: u8, last: &[u8]) -> Result<u32, Error> {
        let (lo, hi) = name_range(w, d, last);
        let rows = txn.scan(tb.customer_name_idx, Included(&lo), Included(&hi), Direction::Forward, 0)?;
        if rows.is_empty() {
            return Err(missing("customer by last name"));
        }
        let (_, v) = &rows[(rows.len() - 1) / 2];
        Ok(u32::from_le_bytes(v[..4].try_into().expect("4 bytes")))
    }

    fn payment(
        &mut self,
        worker: &mut Worker,
        d: u8,
        c_w: u32,
        c_d: u8,
        by: CustomerBy,
        amount: i64,
    ) -> Result<Outcome, Error> {
        let (tb, w) = (self.t.tables, self.home);
        let mut txn = worker.begin();
        let wk = wkey(w);
        let wrow = txn.get(tb.warehouse, &wk)?.ok_or_else(|| missing("warehouse"))?;
        let mut wh = Warehouse::decode(&wrow);
        wh.ytd += amount;
        wh.encode(&mut self.buf);
        txn.update(tb.warehouse, &wk, &self.buf)?;
        let dk = dkey(w, d);
        let drow = txn.get(tb.district, &dk)?.ok_or_else(|| missing("district"))?;
        let mut dist = District::decode(&drow);
        dist.ytd += amount;
        dist.encode(&mut self.buf);
        txn.update(tb.district, &dk, &self.buf)?;

        let c_id = match by {
            CustomerBy::Id(c) => c,
            CustomerBy::Last(name, len) => Self::customer_by_last(&mut txn, &tb, c_w, c_d, &name[..len as usize])?,
        };
        let ck = wdx_key(c_w, c_d, c_id);
        let crow = txn.get(tb.customer, &ck)?.ok_or_else(|| missing("customer"))?;
        let mut cust = Customer::decode(&crow);
        cust.balance -= amount;
        cust.ytd_payment += amount;
        cust.payment_cnt += 1;
        cust.encode(&mut self.buf);
        txn.update(tb.customer, &ck, &self.buf)?;
        let credit = txn
            .get_with(tb.customer_info, &ck, |b| {
                let info = CustomerInfo::decode(b);
                std::hint::black_box((info.first, info.middle, info.last, info.street_1, info.phone, info.since));
                info.credit
            })?
            .ok_or_else(|| missing("customer_info"))?;
        if &credit == b"BC" {
            let old = txn.get(tb.customer_data, &ck)?.ok_or_else(|| missing("customer_data"))?;
            self.buf2.clear();
            let _ = write!(self.buf2, "{c_id} {c_d} {c_w} {d} {w} {}.{:02} | ", amount / 100, amount % 100);
            let room = 500usize.saturating_sub(self.buf2.len());
            self.buf2.extend_from_slice(&old[..old.len().min(room)]);
            txn.update(tb.customer_data, &ck, &self.buf2)?;
        }

        // H_DATA: W_NAME, four spaces, D_NAME.
        self.buf2.clear();
        let h_data = &mut self.buf2;
        txn.get_with(tb.warehouse_info, &wk, |b| h_data.extend_from_slice(WarehouseInfo::decode(b).name))?
            .ok_or_else(|| missing("warehouse_info"))?;
        h_data.extend_from_slice(b"    ");
        txn.get_with(tb.district_info, &dk, |b| h_data.extend_from_slice(DistrictInfo::decode(b).name))?
            .ok_or_else(|| missing("district_info"))?;
        History { c_id, c_d_id: c_d, c_w_id: c_w, d_id: d, w_id: w, date: now_us(), amount, data: &self.buf2 }
            .encode(&mut self.buf);
        loop {
            self.history_seq += 1;
            match txn.insert(tb.history, &hkey(w, d, c_id, self.history_seq, self.id), &self.buf) {
                Err(Error::KeyExists) => continue,
                other => break other?,
            }
        }
        Ok(Outcome::Committed(Some(txn.commit_async()?)))
    }

    fn order_status(&mut self, worker: &mut Worker, d: u8, by: CustomerBy) -> Result<Outcome, Error> {
        let (tb, w) = (self.t.tables, self.home);
        let r = worker.db().read();
        let c_id = match by {
            CustomerBy::Id(c) => c,
            CustomerBy::Last(name, len) => {
                let (lo, hi) = name_range(w, d, &name[..len as usize]);
                self.ids.clear();
                r.for_each(tb.customer_name_idx, Included(&lo), Included(&hi), |_, v| {
                    self.ids.push(u32::from_le_bytes(v[..4].try_into().expect("4 bytes")));
                    true
                })?;
                if self.ids.is_empty() {
                    return Err(missing("customer by last name"));
                }
                self.ids[(self.ids.len() - 1) / 2]
            }
        };
        let ck = wdx_key(w, d, c_id);
        let balance =
            r.get_with(tb.customer, &ck, |b| Customer::decode(b).balance)?.ok_or_else(|| missing("customer"))?;
        r.get_with(tb.customer_info, &ck, |b| {
            let info = CustomerInfo::decode(b);
            std::hint::black_box((balance, info.first, info.middle, info.last));
        })?
        .ok_or_else(|| missing("customer_info"))?;
        let (lo, hi) = (ocidx_key(w, d, c_id, 0), ocidx_key(w, d, c_id, u32::MAX));
        let latest = r.scan(tb.oorder_c_id_idx, Included(&lo), Included(&hi), Direction::Reverse, 1)?;
        let Some((k, _)) = latest.first() else {
            return Ok(Outcome::Committed(None));
        };
        let o_id = be_u32(k, 9);
        let orow = r.get(tb.oorder, &wdx_key(w, d, o_id))?.ok_or_else(|| missing("oorder"))?;
        let o = Order::decode(&orow);
        std::hint::black_box((o.entry_d, o.carrier_id));
        let (lo, hi) = (ol_key(w, d, o_id, 0), ol_key(w, d, o_id, u8::MAX));
        let mut sum = 0i64;
        r.for_each(tb.order_line, Included(&lo), Included(&hi), |_, v| {
            let ol = OrderLine::decode(v);
            std::hint::black_box((ol.i_id, ol.supply_w_id, ol.quantity, ol.delivery_d));
            sum += ol.amount;
            true
        })?;
        std::hint::black_box(sum);
        Ok(Outcome::Committed(None))
    }

    fn delivery(&mut self, worker: &mut Worker, carrier: u8) -> Result<Outcome, Error> {
        let (tb, w) = (self.t.tables, self.home);
        let mut txn = worker.begin();
        let now = now_us();
        for d in 1..=DISTRICTS {
            let from = self.oldest_new_order[d as usize - 1];
            let (lo, hi) = (wdx_key(w, d, from), wdx_key(w, d, u32::MAX));
            let oldest = txn.scan(tb.new_order, Included(&lo), Included(&hi), Direction::Forward, 1)?;
            let Some((nk, _)) = oldest.first() else {
                continue; // No undelivered order in this district: skipped (2.7.4.2).
            };
            let o_id = be_u32(nk, 5);
            // Still a lower bound if this transaction aborts: the order stays, or is gone.
            self.oldest_new_order[d as usize - 1] = o_id;
            txn.delete(tb.new_order, nk)?;
            let ok = wdx_key(w, d, o_id);
            let orow = txn.get(tb.oorder, &ok)?.ok_or_else(|| missing("oorder"))?;
            let mut o = Order::decode(&orow);
            o.carrier_id = carrier;
            o.encode(&mut self.buf);
            txn.update(tb.oorder, &ok, &self.buf)?;
            let (lo, hi) = (ol_key(w, d, o_id, 0), ol_key(w, d, o_id, u8::MAX));
            let lines = txn.scan(tb.order_line, Included(&lo), Included(&hi), Direction::Forward, 0)?;
            let mut sum = 0i64;
            for (k, v) in &lines {
                let mut ol = OrderLine::decode(v);
                sum += ol.amount;
                ol.delivery_d = now;
                ol.encode(&mut self.buf);
                txn.update(tb.order_line, k, &self.buf)?;
            }
            let ck = wdx_key(w, d, o.c_id);
            let crow = txn.get(tb.customer, &ck)?.ok_or_else(|| missing("customer"))?;
            let mut cust = Customer::decode(&crow);
            cust.balance += sum;
            cust.delivery_cnt += 1;
            cust.encode(&mut self.buf);
            txn.update(tb.customer, &ck, &self.buf)?;
        }
        Ok(Outcome::Committed(Some(txn.commit_async()?)))
    }

    fn stock_level(&mut self, worker: &mut Worker, d: u8, threshold: i32) -> Result<Outcome, Error> {
        let (tb, w) = (self.t.tables, self.home);
        let r = worker.db().read();
        let next = r
            .get_with(tb.district, &dkey(w, d), |b| District::decode(b).next_o_id)?
            .ok_or_else(|| missing("district"))?;
        let (lo, hi) = (ol_key(w, d, next.saturating_sub(20), 0), ol_key(w, d, next, 0));
        self.ids.clear();
        r.for_each(tb.order_line, Included(&lo), Excluded(&hi), |_, v| {
            self.ids.push(Dec(v).u32()); // OL_I_ID, an order line's first column
            true
        })?;
        self.ids.sort_unstable();
        self.ids.dedup();
        self.stock_keys.clear();
        self.stock_keys.extend(self.ids.iter().map(|&i| skey(w, i)));
        let (mut low, mut absent) = (0u32, false);
        r.get_many_with(tb.stock, &self.stock_keys, |_, v| match v {
            Some(b) => low += u32::from(Stock::decode(b).quantity < threshold),
            None => absent = true,
        })?;
        if absent {
            return Err(missing("stock"));
        }
        std::hint::black_box(low);
        Ok(Outcome::Committed(None))
    }
}

impl Workload for TpccWorker<'_> {
    type Input = Input;

    /// OrderStatus and StockLevel (TPC-C 2.6, 2.8) read only.
    fn read_only(&self, ty: usize) -> bool {
        ty == ORDER_STATUS || ty == STOCK_LEVEL
    }

    fn next(&mut self) -> (usize, Input) {
        let x = self.rng.gen_range(1..=100);
        let d = self.rng.gen_range(1..=DISTRICTS);
        if x <= 45 {
            let c = nurand(&mut self.rng, 1023, 1, self.t.customers_per_district, C_ID);
            let n = self.rng.gen_range(5..=15u8);
            let rollback = self.rng.gen_range(1..=100) == 1;
            let mut items = [OrderItem::default(); 15];
            let mut all_local = true;
            for (k, it) in items[..n as usize].iter_mut().enumerate() {
                it.i_id = if rollback && k + 1 == n as usize {
                    self.t.items + 1 // unused: the transaction rolls back
                } else {
                    nurand(&mut self.rng, 8191, 1, self.t.items, C_OL_I_ID)
                };
                it.supply_w = if self.t.warehouses > 1 && self.rng.gen_range(1..=100) == 1 {
                    all_local = false;
                    self.other_warehouse()
                } else {
                    self.home
                };
                it.quantity = self.rng.gen_range(1..=10);
            }
            (NEW_ORDER, Input::NewOrder { d, c, n, items, all_local })
        } else if x <= 88 {
            let (c_w, c_d) = if self.t.warehouses > 1 && self.rng.gen_range(1..=100) > 85 {
                (self.other_warehouse(), self.rng.gen_range(1..=DISTRICTS))
            } else {
                (self.home, d)
            };
            let by = self.customer_by();
            (PAYMENT, Input::Payment { d, c_w, c_d, by, amount: self.rng.gen_range(100..=500_000) })
        } else if x <= 92 {
            let by = self.customer_by();
            (ORDER_STATUS, Input::OrderStatus { d, by })
        } else if x <= 96 {
            (DELIVERY, Input::Delivery { carrier: self.rng.gen_range(1..=10) })
        } else {
            (STOCK_LEVEL, Input::StockLevel { d, threshold: self.rng.gen_range(10..=20) })
        }
    }

    fn execute(&mut self, worker: &mut Worker, input: &Input) -> Result<Outcome, Error> {
        match *input {
            Input::NewOrder { d, c, n, ref items, all_local } => {
                self.new_order(worker, d, c, &items[..n as usize], all_local)
            }
            Input::Payment { d, c_w, c_d, by, amount } => self.payment(worker, d, c_w, c_d, by, amount),
            Input::OrderStatus { d, by } => self.order_status(worker, d, by),
            Input::Delivery { carrier } => self.delivery(worker, carrier),
            Input::StockLevel { d, threshold } => self.stock_level(worker, d, threshold),
        }
    }
}

/// Runs the full mix for `cfg.duration` with `cfg.workers` workers; worker i's home
/// warehouse is `(i % warehouses) + 1`.
pub fn run(db: &Arc<Database>, t: &Tpcc, cfg: &RunConfig, probe: &Probe<'_>) -> Result<Report, Error> {
    let extra = serde_json::json!({
        "warehouses": t.warehouses,
        "districts_per_warehouse": DISTRICTS,
        "items": t.items,
        "customers_per_district": t.customers_per_district,
    });
    let seq_base = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    harness::run_workload(db, "tpcc", &TYPES, cfg, probe, extra, |i| TpccWorker {
        t,
        rng: SmallRng::seed_from_u64(cfg.seed.wrapping_add(i as u64)),
        home: (i as u32 % t.warehouses) + 1,
        id: i as u16,
        history_seq: seq_base,
        buf: Vec::with_capacity(512),
        buf2: Vec::with_capacity(512),
        ids: Vec::with_capacity(512),
        stock_keys: Vec::with_capacity(512),
        oldest_new_order: [0; DISTRICTS as usize],
    })
}

// ---- consistency (3.3.2) --------------------------------------------------------------------

/// What `check_consistency` looked at.
#[derive(Clone, Debug, Serialize)]
pub struct ConsistencyReport {
    pub warehouses: u32,
    pub districts: u32,
    pub orders: u64,
    pub new_orders: u64,
    pub order_lines: u64,
}

/// Checks consistency conditions 1-4, and a stock condition of ditto's, on one snapshot:
/// 1. W_YTD = sum(D_YTD) per warehouse;
/// 2. D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID) per district (the latter when new_order
///    has rows for the district);
/// 3. max(NO_O_ID) - min(NO_O_ID) + 1 = the number of new_order rows per district;
/// 4. sum(O_OL_CNT) = the number of order_line rows per district;
///
/// and one of ditto's (the spec leaves stock unchecked): per warehouse, the stock's
/// sum(S_YTD), sum(S_ORDER_CNT) and sum(S_REMOTE_CNT) equal the quantity, count and count for
/// other warehouses of the order lines it supplied since the load. A lost stock update (two
/// lines of one order for the same item, say) breaks it.
pub fn check_consistency(db: &Database, t: &Tpcc) -> Result<ConsistencyReport, String> {
    let tb = t.tables;
    let r = db.read();
    let e = |e: Error| e.to_string();
    let mut rep = ConsistencyReport { warehouses: 0, districts: 0, orders: 0, new_orders: 0, order_lines: 0 };
    // Per supplying warehouse: quantity, lines and lines for other warehouses' orders.
    let mut supplied = vec![(0u64, 0u64, 0u64); t.warehouses as usize + 1];
    for w in 1..=t.warehouses {
        let wrow = r.get(tb.warehouse, &wkey(w)).map_err(e)?.ok_or(format!("warehouse {w} is missing"))?;
        let w_ytd = Warehouse::decode(&wrow).ytd;
        let mut d_ytd_sum = 0i64;
        for d in 1..=DISTRICTS {
            let drow = r.get(tb.district, &dkey(w, d)).map_err(e)?.ok_or(format!("district ({w}, {d}) is missing"))?;
            let dist = District::decode(&drow);
            d_ytd_sum += dist.ytd;
            let (lo, hi) = (wdx_key(w, d, 0), wdx_key(w, d, u32::MAX));

            let (mut max_o, mut ol_cnt_sum, mut orders) = (0u32, 0u64, 0u64);
            r.for_each(tb.oorder, Included(&lo), Included(&hi), |k, v| {
                max_o = max_o.max(be_u32(k, 5));
                ol_cnt_sum += Order::decode(v).ol_cnt as u64;
                orders += 1;
                true
            })
            .map_err(e)?;
            let (mut no_min, mut no_max, mut no_count) = (u32::MAX, 0u32, 0u64);
            r.for_each(tb.new_order, Included(&lo), Included(&hi), |k, _| {
                let o = be_u32(k, 5);
                no_min = no_min.min(o);
                no_max = no_max.max(o);
                no_count += 1;
                true
            })
            .map_err(e)?;
            let (ol_lo, ol_hi) = (ol_key(w, d, 0, 0), ol_key(w, d, u32::MAX, u8::MAX));
            let mut ol_count = 0u64;
            r.for_each(tb.order_line, Included(&ol_lo), Included(&ol_hi), |k, v| {
                ol_count += 1;
                // Lines of orders placed after the load (which left every stock at zero).
                if be_u32(k, 5) > t.customers_per_district {
                    let line = OrderLine::decode(v);
                    if let Some(s) = supplied.get_mut(line.supply_w_id as usize) {
                        s.0 += u64::from(line.quantity);
                        s.1 += 1;
                        s.2 += u64::from(line.supply_w_id != w);
                    }
                }
                true
            })
            .map_err(e)?;

            let next = dist.next_o_id;
            if next - 1 != max_o || (no_count > 0 && no_max != next - 1) {
                return Err(format!(
                    "consistency condition 2 failed at warehouse {w} district {d}: D_NEXT_O_ID - 1 = {}, \
                     max(O_ID) = {max_o}, max(NO_O_ID) = {}",
                    next - 1,
                    if no_count > 0 { no_max.to_string() } else { "none".into() }
                ));
            }
            if no_count > 0 && (no_max - no_min + 1) as u64 != no_count {
                return Err(format!(
                    "consistency condition 3 failed at warehouse {w} district {d}: max(NO_O_ID) - min(NO_O_ID) + 1 \
                     = {} but there are {no_count} new_order rows",
                    no_max - no_min + 1
                ));
            }
            if ol_cnt_sum != ol_count {
                return Err(format!(
                    "consistency condition 4 failed at warehouse {w} district {d}: sum(O_OL_CNT) = {ol_cnt_sum} \
                     but there are {ol_count} order_line rows"
                ));
            }
            rep.districts += 1;
            rep.orders += orders;
            rep.new_orders += no_count;
            rep.order_lines += ol_count;
        }
        if w_ytd != d_ytd_sum {
            return Err(format!(
                "consistency condition 1 failed at warehouse {w} (district 1..={DISTRICTS}): W_YTD = {w_ytd} \
                 but sum(D_YTD) = {d_ytd_sum}"
            ));
        }
        rep.warehouses += 1;
    }
    for (w, &(quantity, lines, remote)) in supplied.iter().enumerate().skip(1) {
        let (lo, hi) = (skey(w as u32, 0), skey(w as u32, u32::MAX));
        let (mut ytd, mut order_cnt, mut remote_cnt) = (0u64, 0u64, 0u64);
        r.for_each(tb.stock, Included(&lo), Included(&hi), |_, v| {
            let s = Stock::decode(v);
            (ytd, order_cnt, remote_cnt) =
                (ytd + u64::from(s.ytd), order_cnt + u64::from(s.order_cnt), remote_cnt + u64::from(s.remote_cnt));
            true
        })
        .map_err(e)?;
        if (ytd, order_cnt, remote_cnt) != (quantity, lines, remote) {
            return Err(format!(
                "stock condition failed at warehouse {w}: sum(S_YTD, S_ORDER_CNT, S_REMOTE_CNT) = \
                 ({ytd}, {order_cnt}, {remote_cnt}) but the order lines it supplied since the load have \
                 sum(OL_QUANTITY) = {quantity}, count {lines}, {remote} for other warehouses"
            ));
        }
    }
    Ok(rep)
}

/// Adds `delta_cents` to one district's D_YTD in an ordinary transaction (fault injection:
/// it breaks consistency condition 1 for that warehouse). Uses worker 0.
pub fn adjust_district_ytd(db: &Arc<Database>, t: &Tpcc, w: u32, d: u8, delta_cents: i64) -> Result<(), Error> {
    let mut worker = db.worker(WorkerId(0)).expect("worker 0 is free");
    let mut buf = Vec::new();
    let ((), ticket) = worker.run(|txn| {
        let dk = dkey(w, d);
        let drow = txn.get(t.tables.district, &dk)?.ok_or(Error::KeyNotFound)?;
        let mut dist = District::decode(&drow);
        dist.ytd += delta_cents;
        dist.encode(&mut buf);
        txn.update(t.tables.district, &dk, &buf)
    })?;
    ticket.wait()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_fields_round_trip_at_their_extremes() {
        let ints = [0i64, 1, -1, 63, -64, 64, -65, i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN];
        let mut buf = Vec::new();
        let mut e = Enc::start(&mut buf);
        for &v in &ints {
            e.i64(v);
            e.u64(v as u64);
        }
        e.u32(u32::MAX);
        e.i32(i32::MIN);
        e.str(b"");
        e.str(&[7u8; 255]);
        e.fixed(b"xy");
        let mut d = Dec(&buf);
        for &v in &ints {
            assert_eq!(d.i64(), v);
            assert_eq!(d.u64(), v as u64);
        }
        assert_eq!(d.u32(), u32::MAX);
        assert_eq!(d.i32(), i32::MIN);
        assert_eq!(d.str(), b"");
        assert_eq!(d.str(), &[7u8; 255][..]);
        assert_eq!(d.fixed::<2>(), *b"xy");
        assert!(d.0.is_empty(), "every byte read back");
        // An integer at a row's end has fewer than 8 bytes after its tag: the copying path.
        for &v in &ints {
            Enc::start(&mut buf).i64(v);
            let mut d = Dec(&buf);
            assert_eq!(d.i64(), v);
            assert!(d.0.is_empty());
        }
    }

    #[test]
    fn small_integers_take_few_bytes() {
        let mut buf = Vec::new();
        Stock { quantity: 91, ytd: 10, order_cnt: 1, remote_cnt: 0 }.encode(&mut buf);
        assert_eq!(buf.len(), 4, "quantity 91 zigzags to 182, below SHORT_MAX: one byte, as each counter");
        let s = Stock::decode(&buf);
        assert_eq!((s.quantity, s.ytd, s.order_cnt, s.remote_cnt), (91, 10, 1, 0));
        Stock { quantity: -5, ytd: 300, order_cnt: 248, remote_cnt: 247 }.encode(&mut buf);
        assert_eq!(buf.len(), 1 + 3 + 2 + 1, "300 and 248 take a tag byte and their low bytes");
        let s = Stock::decode(&buf);
        assert_eq!((s.quantity, s.ytd, s.order_cnt, s.remote_cnt), (-5, 300, 248, 247));
    }

    #[test]
    #[should_panic(expected = "TPC-C row too short")]
    fn a_truncated_integer_is_a_bug() {
        Dec(&[SHORT_MAX + 1, 1]).u64();
    }
}
