//! KuaFu's dependency replay (`ReplayMode::Dependency`)
//! =====================================================
//! KuaFu (ICDE 2013, III.B and IV.B-D) replays a row log in parallel through a write-set
//! dependency graph: a transaction waits only for the earlier transactions that wrote one
//! of its rows, so the parallelism comes from the workload, not from the number of the
//! primary's streams. In ditto:
//!
//! ```text
//!  receiver --batches (shipping order)--> dispatcher: Merge (each stream's transactions,
//!      released in commit-ts order up to the received watermark) -> graph: a node per
//!      transaction, an edge from the last unfinished writer of each of its rows
//!  executors (N threads): take the ready node with the smallest ts, install its writes,
//!      release its followers, complete it in the Tracker
//!  Tracker: every transaction at or below min(first unfinished ts - 1, the cut) is
//!      installed -> the replayed watermark -> the read view
//! ```
//!
//! Invariants:
//! - Batches reach the merge in the shipping order: a floor vouches only for what came
//!   earlier in it, and a transaction that comes later at or below the watermark (not a
//!   resend's overlap) is refused, stopping replay (`Merge::push`). The receiver and the
//!   persister keep that order; a held backup's hold keeps it too in this mode
//!   (`HoldQ::in_order` in backup.rs).
//! - Nodes enter the graph in commit-timestamp order (`Merge` releases a transaction only
//!   once the received watermark covers it, so no smaller one can still come), so every
//!   edge goes from a smaller to a larger timestamp: the graph is acyclic, and each
//!   record's writes are installed in timestamp order (no parking, no slotting into the
//!   chain, unlike `parallel`).
//! - The replayed watermark is per transaction, not per batch: at most the smallest
//!   unfinished timestamp minus one, and at most the cut (the received watermark up to
//!   which everything was put in the graph).
//! - No deadlock when an install waits for an old record life to end (the engine waits
//!   until the read view reaches its timestamp minus one at most, see ditto_engine's
//!   replay.rs):
//!   executors take the *smallest* ready timestamp, so the smallest unfinished transaction
//!   is always running or about to run, and it waits for nothing (everything below it is
//!   finished).
//! - Bounded: at most `MAX_IN_FLIGHT` transactions in the graph; the dispatcher waits for
//!   room, and the receiver's queue behind it is bounded by the replica log's flow control.
//!   And at most `WINDOW_MAX` transactions from the oldest unfinished one on, finished or
//!   not: each holds its batch, and behind one that waits (a key's new life) the finished
//!   ones after it were kept without bound under `dependency:0` (found by a review,
//!   2026-12-07); the dispatcher waits for the oldest to finish, as at a barrier.
//!
//! Barriers (KuaFu IV.D): KuaFu drains the graph every N transactions to take a consistent
//! snapshot. ditto does not need them for consistency (the read view is the replayed
//! watermark, always a prefix); `dependency` keeps them, every 1024 transactions as KuaFu
//! chose, so the mode is KuaFu's as published, and `dependency:0` runs without them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ditto_engine::Ts;
use ditto_engine::{RecordId, TableId};
use parking_lot::{Condvar, Mutex};

use crate::watermark::Prefix;

/// One write of a decoded batch; its key and value are (offset, length) in the batch's
/// payload (no reference count per write).
#[derive(Clone, Copy, Debug)]
pub struct WriteAt {
    pub table: TableId,
    pub rid: RecordId,
    pub key: Option<(u32, u32)>,
    /// `None`: a delete.
    pub value: Option<(u32, u32)>,
}

/// A batch's uncompressed payload and its writes, shared by its transactions.
#[derive(Debug)]
pub struct Decoded {
    pub payload: Bytes,
    pub writes: Vec<WriteAt>,
    /// Where the old lives of the record ids its writes give new keys ended at or below
    /// (`BatchHeader::reuse_ts`; `Ts::MAX`: not known), for the engine's wait for them
    /// (`Database::replay_install_with`).
    pub reuse_bound: Ts,
}

/// One transaction: its writes are `batch.writes[writes]`.
#[derive(Clone, Debug)]
pub struct Txn {
    pub ts: Ts,
    pub batch: Arc<Decoded>,
    pub writes: std::ops::Range<usize>,
}

impl Txn {
    fn at(&self) -> &[WriteAt] {
        &self.batch.writes[self.writes.clone()]
    }

    /// (table, record id, key, value) of each write, in logged order.
    pub fn writes(&self) -> impl Iterator<Item = (TableId, RecordId, Option<&[u8]>, Option<&[u8]>)> {
        (0..self.writes.len()).map(|i| self.write(i))
    }

    /// Write `i` (below `self.writes.len()`), as `writes` gives it.
    pub fn write(&self, i: usize) -> (TableId, RecordId, Option<&[u8]>, Option<&[u8]>) {
        let p = &self.batch.payload[..];
        let part = |r: Option<(u32, u32)>| r.map(|(o, n)| &p[o as usize..(o + n) as usize]);
        let w = &self.at()[i];
        (w.table, w.rid, part(w.key), part(w.value))
    }
}

/// Most transactions in the graph at once (KuaFu throttles its graph inserter the same way).
pub const MAX_IN_FLIGHT: usize = 4096;

/// Most transactions kept from the oldest unfinished one on (`dispatch`'s window).
pub const WINDOW_MAX: usize = 4 * MAX_IN_FLIGHT;

/// KuaFu's barrier interval, in transactions (its evaluation: no cost beyond about 1024).
pub const KUAFU_BARRIER_EVERY: u32 = 1024;

/// Each stream's transactions, released in commit-timestamp order once the received
/// watermark covers them (every transaction at or below it has arrived, on every stream).
#[derive(Debug)]
pub struct Merge {
    pending: Vec<VecDeque<Txn>>,
    prefix: Prefix,
    /// Per stream: the newest transaction pushed (a resend's overlap lies at or below it).
    seen: Vec<Ts>,
}

impl Merge {
    pub fn new(streams: usize, base: Ts) -> Merge {
        Merge {
            pending: (0..streams.max(1)).map(|_| VecDeque::new()).collect(),
            prefix: Prefix::new(streams, base),
            seen: vec![base; streams.max(1)],
        }
    }

    /// The next batch in shipping order: its stream, bound, trusted floor and transactions
    /// (in timestamp order, as a stream's batch holds them).
    /// Transactions of the stream at or below the newest one pushed are the overlap of a
    /// resumed connection: not taken twice. A newer one at or below the watermark was
    /// vouched for (a bound or a floor) before it came: the batches are not in the shipping
    /// order, and taking it would skip it or replay it out of order, so the merge refuses
    /// it (before 2026-11-29 it was dropped as an overlap, without a word).
    pub fn push(
        &mut self,
        stream: usize,
        bound: Ts,
        floor: Option<Ts>,
        txns: impl IntoIterator<Item = Txn>,
    ) -> Result<(), String> {
        let w = self.prefix.watermark();
        let q = &mut self.pending[stream];
        for t in txns {
            if t.ts <= self.seen[stream] {
                continue;
            }
            if t.ts <= w {
                return Err(format!(
                    "stream {stream}'s transaction at ts {} came after the watermark had passed it (at {}): \
                     batches out of the shipping order",
                    t.ts.0, w.0
                ));
            }
            self.seen[stream] = t.ts;
            q.push_back(t);
        }
        self.prefix.push(stream, bound, floor);
        Ok(())
    }

    /// Every transaction at or below this has been pushed.
    pub fn watermark(&self) -> Ts {
        self.prefix.watermark()
    }

    /// The transaction with the smallest timestamp, if the watermark covers it.
    pub fn pop(&mut self) -> Option<Txn> {
        let w = self.prefix.watermark();
        let (i, _) = self
            .pending
            .iter()
            .enumerate()
            .filter_map(|(i, q)| q.front().map(|t| (i, t.ts)))
            .filter(|&(_, ts)| ts <= w)
            .min_by_key(|&(_, ts)| ts)?;
        self.pending[i].pop_front()
    }
}

/// Which transactions are finished, in the order they entered the graph (= timestamp
/// order); gives the replayed watermark.
#[derive(Debug)]
pub struct Tracker {
    /// The index of `open`'s first entry.
    first: u64,
    /// (ts, finished) of every transaction from the first unfinished one on.
    open: VecDeque<(Ts, bool)>,
    /// Everything at or below the cut that exists has been registered.
    cut: Ts,
}

impl Tracker {
    pub fn new(base: Ts) -> Tracker {
        Tracker { first: 0, open: VecDeque::new(), cut: base }
    }

    /// A transaction enters the graph; its index.
    pub fn register(&mut self, ts: Ts) -> u64 {
        debug_assert!(self.open.back().is_none_or(|b| b.0 < ts) && ts > self.cut);
        self.open.push_back((ts, false));
        self.first + self.open.len() as u64 - 1
    }

    /// Transaction `idx` is installed.
    pub fn finish(&mut self, idx: u64) {
        let slot = &mut self.open[(idx - self.first) as usize].1;
        assert!(!*slot, "transaction {idx} finished twice");
        *slot = true;
        while self.open.front().is_some_and(|e| e.1) {
            self.open.pop_front();
            self.first += 1;
        }
    }

    /// Every transaction at or below `w` has been registered.
    pub fn set_cut(&mut self, w: Ts) {
        self.cut = self.cut.max(w);
    }

    /// Every transaction at or below this is installed.
    pub fn replayed(&self) -> Ts {
        match self.open.front() {
            Some(&(ts, _)) => self.cut.min(Ts(ts.0 - 1)),
            None => self.cut,
        }
    }

    pub fn in_graph(&self) -> usize {
        self.open.len()
    }
}

/// Where the executors' work goes (the backup's engine).
pub(crate) trait Sink: Send + Sync + 'static {
    /// Installs `txn`, calling `on_wait` while a write waits for the read view (see
    /// `Database::replay_install_with`).
    fn install(&self, txn: &Txn, on_wait: &mut dyn FnMut(Ts) -> bool) -> Result<(), String>;
    /// Every transaction at or below `ts` is installed.
    fn replayed(&self, ts: Ts);
    fn failed(&self, why: String);
    /// `txns` more transactions installed (reported in bulk, not per transaction: a
    /// counter shared by every executor would be a contended line).
    fn add_done(&self, txns: u64);
    /// Counts the calling replay thread's CPU until the registration is dropped
    /// (`crate::cpu`); `None` where nothing is counted.
    fn count_cpu(&self) -> Option<crate::cpu::Counted> {
        None
    }
}

struct Node {
    idx: u64,
    txn: Txn,
    /// Unfinished predecessors, plus one while the dispatcher is still linking the node.
    pending: AtomicU32,
    links: Mutex<Links>,
}

#[derive(Default)]
struct Links {
    finished: bool,
    followers: Vec<Arc<Node>>,
}

/// A ready node, ordered so that the heap's top is the smallest timestamp.
struct Ready(Arc<Node>);

impl PartialEq for Ready {
    fn eq(&self, o: &Ready) -> bool {
        self.0.txn.ts == o.0.txn.ts
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, o: &Ready) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ready {
    fn cmp(&self, o: &Ready) -> std::cmp::Ordering {
        Reverse(self.0.txn.ts).cmp(&Reverse(o.0.txn.ts))
    }
}

/// What the dispatcher and the executors share.
pub(crate) struct Shared {
    ready: Mutex<BinaryHeap<Ready>>,
    ready_cv: Condvar,
    tracker: Mutex<Tracker>,
    in_flight: AtomicUsize,
    room: Mutex<()>,
    room_cv: Condvar,
    /// The dispatcher waits until the graph holds at most this many (`usize::MAX`: it does
    /// not wait); the executor that brings it there wakes it.
    wake_at: AtomicUsize,
    /// Replay threads parked with nothing to do (they count what they installed first).
    idle: AtomicUsize,
    threads: usize,
    stop: AtomicBool,
}

impl Shared {
    /// Every replay thread is parked with nothing to do: what it installed is counted.
    pub fn quiet(&self) -> bool {
        self.idle.load(Ordering::SeqCst) == self.threads && self.ready.lock().is_empty()
    }

    fn push_ready(&self, n: Arc<Node>) {
        self.ready.lock().push(Ready(n));
        self.ready_cv.notify_one();
    }
}

/// One batch for the dispatcher: its stream, bound, trusted floor and the transactions to
/// replay (those above what the backup held already).
pub(crate) struct Work {
    pub stream: usize,
    pub bound: Ts,
    pub floor: Option<Ts>,
    pub txns: Vec<Txn>,
}

/// Starts the dispatcher (fed by `rx`, each message turned into a batch's work by
/// `decode` on the dispatcher's thread) and `executors` executor threads.
pub(crate) fn start<M: Send + 'static>(
    sink: Arc<dyn Sink>,
    rx: std::sync::mpsc::Receiver<M>,
    decode: impl FnMut(M) -> Result<Work, String> + Send + 'static,
    streams: usize,
    base: Ts,
    executors: usize,
    barrier_every: u32,
) -> Arc<Shared> {
    let executors = executors.max(1);
    let shared = Arc::new(Shared {
        ready: Mutex::new(BinaryHeap::new()),
        ready_cv: Condvar::new(),
        tracker: Mutex::new(Tracker::new(base)),
        in_flight: AtomicUsize::new(0),
        room: Mutex::new(()),
        room_cv: Condvar::new(),
        wake_at: AtomicUsize::new(usize::MAX),
        idle: AtomicUsize::new(0),
        threads: executors + 1,
        stop: AtomicBool::new(false),
    });
    for i in 0..executors {
        let (sh, sk) = (Arc::clone(&shared), Arc::clone(&sink));
        std::thread::Builder::new()
            .name(format!("ditto-replay-x{i}"))
            .spawn(move || failing_on_panic(&sh, &*sk, || format!("replay executor {i}"), || execute(&sh, &*sk)))
            .expect("starting a replay executor");
    }
    let (sh, sk) = (Arc::clone(&shared), sink);
    std::thread::Builder::new()
        .name("ditto-replay-dispatch".into())
        .spawn(move || {
            failing_on_panic(
                &sh,
                &*sk,
                || "the replay dispatcher".into(),
                || dispatch(&sh, &*sk, rx, decode, streams, base, barrier_every),
            )
        })
        .expect("starting the replay dispatcher");
    shared
}

/// Runs `body`, a replay thread's (`what`); a panic in it fails replay as an install's
/// error does (`Shared::fail`: every thread stops, the sink says why). Before 2026-12-03
/// it ended the thread without a word: the graph stopped moving, the dispatcher waited
/// for room for good, and a backup not held at the release stopped persisting, linked and
/// silent (found by a review).
fn failing_on_panic(sh: &Shared, sink: &dyn Sink, what: impl FnOnce() -> String, body: impl FnOnce()) {
    if let Err(msg) = ditto_engine::catch_panic(body) {
        sh.fail(sink, format!("{} panicked ({msg})", what()));
    }
}

impl Shared {
    /// Ends the executors (each before its next transaction, an idle one within 50 ms) and
    /// the dispatcher's waits for room: replay is over for good.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.ready_cv.notify_all();
        self.room_cv.notify_all();
    }

    /// Replay failed (an install, a decode, a merge): every thread stops, and the sink
    /// says why. (The dispatcher's failures left the executors running, each holding the
    /// sink, until the run was let go.)
    fn fail(&self, sink: &dyn Sink, why: String) {
        self.stop();
        sink.failed(why);
    }
}

/// The rows' hash map hasher: one multiply per word (FxHash's), where std's SipHash costs
/// several times more and the keys are ids, not attacker-chosen strings.
#[derive(Default, Clone, Copy)]
struct RowHash;

impl std::hash::BuildHasher for RowHash {
    type Hasher = RowHasher;
    fn build_hasher(&self) -> RowHasher {
        RowHasher(0)
    }
}

struct RowHasher(u64);

impl std::hash::Hasher for RowHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// Rows are (table, record id): updates name their record by id, inserts too.
fn row(w: &WriteAt) -> (u32, u64) {
    (w.table.0, w.rid.0)
}

/// A write that binds a key (insert, or a value over a tombstone) also writes the key's
/// row, (table with the top bit set, a hash of the key): one key's lives may be on two
/// records (the primary unlinked the first and gave the key another), and the later life
/// must not be bound before the earlier one (crates/engine/src/replay.rs). Hash collisions
/// only order more than needed.
fn key_row(w: &WriteAt, payload: &[u8]) -> Option<(u32, u64)> {
    use std::hash::{Hash, Hasher};
    let (o, n) = w.key?;
    let mut h = std::hash::DefaultHasher::new();
    payload[o as usize..(o + n) as usize].hash(&mut h);
    Some((w.table.0 | KEY_ROW, h.finish()))
}

/// Set on a key's row; table ids are far below it.
const KEY_ROW: u32 = 1 << 31;
const _: () = assert!((ditto_engine::TABLES_MAX as u64) < KEY_ROW as u64);

fn dispatch<M>(
    sh: &Shared,
    sink: &dyn Sink,
    rx: std::sync::mpsc::Receiver<M>,
    mut decode: impl FnMut(M) -> Result<Work, String>,
    streams: usize,
    base: Ts,
    barrier_every: u32,
) {
    let mut merge = Merge::new(streams, base);
    // The last writer of each row, by graph index; `window` holds the nodes from the
    // oldest that may be unfinished on (indexes below its front are finished).
    let mut last: HashMap<(u32, u64), u64, RowHash> = HashMap::default();
    let mut window: VecDeque<Arc<Node>> = VecDeque::new();
    let mut window_first = 0u64;
    let mut prune_at = 4 * MAX_IN_FLIGHT;
    let mut since_barrier = 0u32;
    let _cpu = sink.count_cpu();
    loop {
        let work = match rx.try_recv() {
            Ok(w) => w,
            Err(std::sync::mpsc::TryRecvError::Empty) => {
                sh.idle.fetch_add(1, Ordering::SeqCst);
                let w = rx.recv();
                sh.idle.fetch_sub(1, Ordering::SeqCst);
                match w {
                    Ok(w) => w,
                    Err(_) => break,
                }
            }
            Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
        };
        let work = match decode(work) {
            Ok(w) => w,
            Err(why) => {
                sh.fail(sink, why);
                break;
            }
        };
        if let Err(why) = merge.push(work.stream, work.bound, work.floor, work.txns) {
            sh.fail(sink, why);
            break;
        }
        while let Some(txn) = merge.pop() {
            let barrier = barrier_every > 0 && since_barrier >= barrier_every;
            let window_full = window.len() >= WINDOW_MAX;
            if barrier || window_full || sh.in_flight.load(Ordering::SeqCst) > MAX_IN_FLIGHT - 1 {
                // About to wait for executors: one of them may be waiting for the read
                // view to reach the ts below its own (a key's new life), which the cut
                // bounds. Everything below this transaction is registered (the merge
                // releases in ts order), so the cut may say so now, not after the loop.
                let replayed = {
                    let mut t = sh.tracker.lock();
                    t.set_cut(Ts(txn.ts.0 - 1));
                    t.replayed()
                };
                sink.replayed(replayed);
            }
            if barrier {
                wait_for_room(sh, 0, 0);
                since_barrier = 0;
            }
            if window_full {
                // Until the oldest finishes (as safe as a barrier, which waits for all).
                while window.front().is_some_and(|n| !n.links.lock().finished) && !sh.stop.load(Ordering::Acquire) {
                    let mut g = sh.room.lock();
                    sh.room_cv.wait_for(&mut g, Duration::from_millis(1));
                }
                while window.front().is_some_and(|n| n.links.lock().finished) {
                    window.pop_front();
                    window_first += 1;
                }
            }
            // Full: wait until a quarter has drained, not for one slot (one wake-up per
            // transaction would cost a futex round trip each).
            wait_for_room(sh, MAX_IN_FLIGHT - 1, MAX_IN_FLIGHT * 3 / 4);
            if sh.stop.load(Ordering::Acquire) {
                return;
            }
            sh.in_flight.fetch_add(1, Ordering::SeqCst);
            // (Saturating: with no barrier, `dependency:0`, it is never reset, and past four
            // billion transactions a build with overflow checks panicked; a review, 2026-12-05.)
            since_barrier = since_barrier.saturating_add(1);
            let idx = sh.tracker.lock().register(txn.ts);
            let node = Arc::new(Node { idx, txn, pending: AtomicU32::new(1), links: Mutex::default() });
            let payload = &node.txn.batch.payload[..];
            let rows = node.txn.at().iter().flat_map(|w| std::iter::once(row(w)).chain(key_row(w, payload)));
            for r in rows {
                let Some(prev) = last.insert(r, idx) else { continue };
                if prev == idx || prev < window_first {
                    continue;
                }
                let prev = &window[(prev - window_first) as usize];
                let mut l = prev.links.lock();
                if !l.finished {
                    node.pending.fetch_add(1, Ordering::AcqRel);
                    l.followers.push(Arc::clone(&node));
                }
            }
            window.push_back(Arc::clone(&node));
            while window.front().is_some_and(|n| n.links.lock().finished) {
                window.pop_front();
                window_first += 1;
            }
            if node.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                sh.push_ready(node);
            }
        }
        let replayed = {
            let mut t = sh.tracker.lock();
            t.set_cut(merge.watermark());
            t.replayed()
        };
        sink.replayed(replayed);
        // Forget finished writers now and then (amortised: the unfinished ones can be many,
        // a graph's worth of transactions times their rows).
        if last.len() > prune_at {
            last.retain(|_, &mut i| i >= window_first);
            prune_at = (2 * last.len()).max(4 * MAX_IN_FLIGHT);
        }
    }
}

/// If more than `most` transactions are in the graph, waits until at most `until` are
/// (or replay stopped).
fn wait_for_room(sh: &Shared, most: usize, until: usize) {
    if sh.in_flight.load(Ordering::SeqCst) <= most {
        return;
    }
    let mut g = sh.room.lock();
    sh.wake_at.store(until, Ordering::SeqCst);
    while sh.in_flight.load(Ordering::SeqCst) > until && !sh.stop.load(Ordering::Acquire) {
        sh.room_cv.wait_for(&mut g, Duration::from_millis(10));
    }
    sh.wake_at.store(usize::MAX, Ordering::SeqCst);
}

/// How many finished transactions an executor lets pass before it publishes the
/// replayed watermark anyway (it always does when it runs out of work).
const PUBLISH_EVERY: u32 = 32;

fn execute(sh: &Shared, sink: &dyn Sink) {
    let _cpu = sink.count_cpu();
    // Installed since the last report (of transactions and the replayed watermark).
    let mut unreported = 0u32;
    let report = |n: &mut u32, replayed: Ts| {
        // The count first, so whoever sees these complete sees them counted.
        sink.add_done(u64::from(*n));
        sink.replayed(replayed);
        *n = 0;
    };
    loop {
        let node = {
            let mut q = sh.ready.lock();
            loop {
                // Stopped: nothing more is installed, even with work ready (a run let
                // go, or another thread's failure: what lies above it must not be).
                if sh.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(Ready(n)) = q.pop() {
                    break n;
                }
                // Going idle: report first.
                drop(q);
                let replayed = sh.tracker.lock().replayed();
                report(&mut unreported, replayed);
                q = sh.ready.lock();
                if q.is_empty() {
                    sh.idle.fetch_add(1, Ordering::SeqCst);
                    sh.ready_cv.wait_for(&mut q, Duration::from_millis(50));
                    sh.idle.fetch_sub(1, Ordering::SeqCst);
                }
            }
        };
        // A write waiting for the read view waits for the transactions below it, which
        // other executors finish (the ready queue hands out the oldest first): publish
        // what they did, as an idle executor would.
        let mut on_wait = |_: Ts| {
            let replayed = sh.tracker.lock().replayed();
            sink.replayed(replayed);
            // (Stopped for good: the wait gives way, see `Engine::halted`.)
            !sh.stop.load(Ordering::Acquire)
        };
        if let Err(why) = sink.install(&node.txn, &mut on_wait) {
            // A write that gave way because replay is over (the run let go, or another
            // executor failed and said so) is no failure of its own. (Until 2026-12-04
            // a let-go backup's waiting write was reported as failed replay: an ERROR
            // line and a failure set.)
            if !sh.stop.load(Ordering::Acquire) {
                sh.fail(sink, why);
            }
            return;
        }
        let followers = {
            let mut l = node.links.lock();
            l.finished = true;
            std::mem::take(&mut l.followers)
        };
        for f in followers {
            if f.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                sh.push_ready(f);
            }
        }
        let replayed = {
            let mut t = sh.tracker.lock();
            t.finish(node.idx);
            t.replayed()
        };
        unreported += 1;
        if unreported >= PUBLISH_EVERY {
            report(&mut unreported, replayed);
        }
        let left = sh.in_flight.fetch_sub(1, Ordering::SeqCst) - 1;
        if left == sh.wake_at.load(Ordering::SeqCst) {
            let _g = sh.room.lock();
            sh.room_cv.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(ts: u64, rids: &[u64]) -> Txn {
        let writes: Vec<WriteAt> = rids
            .iter()
            .map(|&r| WriteAt { table: TableId(1), rid: RecordId(r), key: None, value: Some((0, 0)) })
            .collect();
        let n = writes.len();
        Txn {
            ts: Ts(ts),
            batch: Arc::new(Decoded { payload: Bytes::new(), writes, reuse_bound: Ts::MAX }),
            writes: 0..n,
        }
    }

    /// Rolis figure 3 through the merge: stream 0 commits 1 and 3, stream 1 commits 2 and
    /// 4; whatever order the batches arrive in, transactions leave in ts order and only
    /// once every smaller one has arrived.
    #[test]
    fn merge_releases_in_ts_order_only_what_the_watermark_covers() {
        let mut m = Merge::new(2, Ts(0));
        m.push(0, Ts(3), None, [txn(1, &[1]), txn(3, &[1])]).unwrap();
        assert!(m.pop().is_none(), "stream 1 has said nothing: ts 1 could still be preceded");
        m.push(1, Ts(4), None, [txn(2, &[2]), txn(4, &[2])]).unwrap();
        let order: Vec<u64> = std::iter::from_fn(|| m.pop()).map(|t| t.ts.0).collect();
        assert_eq!(order, [1, 2, 3], "ts 4 waits: stream 0 is only known complete to 3");
        m.push(0, Ts(9), Some(Ts(8)), []).unwrap();
        assert_eq!(m.pop().map(|t| t.ts.0), Some(4));
        assert_eq!(m.watermark(), Ts(8));
        // A resumed connection sends again what was held: not taken twice.
        m.push(1, Ts(10), None, [txn(4, &[2]), txn(10, &[2])]).unwrap();
        assert_eq!(m.pop().map(|t| t.ts.0), None, "10 waits for stream 0; 4 was taken already");
        m.push(0, Ts(12), None, [txn(11, &[1])]).unwrap();
        let order: Vec<u64> = std::iter::from_fn(|| m.pop()).map(|t| t.ts.0).collect();
        assert_eq!(order, [10], "11 waits: stream 1 is known complete only to 10");
    }

    /// A batch that comes after a floor vouched for it (out of the shipping order, as a
    /// held backup's hand-over once made it) is refused, naming the transaction, not
    /// dropped as an overlap; a resend of what was pushed still is one.
    #[test]
    fn a_transaction_the_watermark_passed_before_it_came_is_refused() {
        let mut m = Merge::new(2, Ts(0));
        // Stream 0's batch carries a floor of 5: stream 1's transactions up to 5 came before.
        m.push(0, Ts(6), Some(Ts(5)), [txn(6, &[1])]).unwrap();
        let e = m.push(1, Ts(5), None, [txn(4, &[2]), txn(5, &[2])]).unwrap_err();
        assert!(e.contains("stream 1's transaction at ts 4") && e.contains("out of the shipping order"), "{e}");
        let mut m = Merge::new(2, Ts(0));
        m.push(1, Ts(5), None, [txn(4, &[2]), txn(5, &[2])]).unwrap();
        m.push(0, Ts(6), Some(Ts(5)), [txn(6, &[1])]).unwrap();
        m.push(1, Ts(7), None, [txn(5, &[2]), txn(7, &[2])]).unwrap();
        let order: Vec<u64> = std::iter::from_fn(|| m.pop()).map(|t| t.ts.0).collect();
        assert_eq!(order, [4, 5, 6], "5 once; 7 waits for stream 0");
    }

    #[test]
    fn the_replayed_watermark_never_passes_an_unfinished_transaction() {
        let mut t = Tracker::new(Ts(10));
        let a = t.register(Ts(11));
        let b = t.register(Ts(12));
        let c = t.register(Ts(15));
        t.set_cut(Ts(20));
        assert_eq!(t.replayed(), Ts(10));
        t.finish(c);
        assert_eq!(t.replayed(), Ts(10), "11 and 12 are not installed");
        t.finish(a);
        assert_eq!(t.replayed(), Ts(11));
        t.finish(b);
        assert_eq!(t.replayed(), Ts(20), "everything registered is done: the cut");
        assert_eq!(t.in_graph(), 0);
    }

    /// A transaction that waits for the replayed watermark to reach the ts below it (as a
    /// key's new life waits for the read view), registered just before the dispatcher
    /// meets a barrier: the barrier waits for it, so the cut must already cover what is
    /// registered below it (it used to be raised only after the dispatcher's loop).
    #[test]
    fn a_transaction_waiting_for_the_watermark_does_not_deadlock_a_barrier() {
        struct Waits {
            replayed: Mutex<Ts>,
            installed: Mutex<Vec<u64>>,
            failed: Mutex<Option<String>>,
        }
        impl Sink for Waits {
            fn install(&self, t: &Txn, on_wait: &mut dyn FnMut(Ts) -> bool) -> Result<(), String> {
                if t.ts == Ts(2) {
                    let deadline = std::time::Instant::now() + Duration::from_secs(5);
                    while *self.replayed.lock() < Ts(1) {
                        if std::time::Instant::now() > deadline {
                            return Err("ts 2 waited 5 s for the watermark to reach 1".into());
                        }
                        on_wait(Ts(1));
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                self.installed.lock().push(t.ts.0);
                Ok(())
            }
            fn replayed(&self, ts: Ts) {
                let mut r = self.replayed.lock();
                *r = (*r).max(ts);
            }
            fn failed(&self, why: String) {
                *self.failed.lock() = Some(why);
            }
            fn add_done(&self, _: u64) {}
        }
        let sink =
            Arc::new(Waits { replayed: Mutex::new(Ts(0)), installed: Mutex::default(), failed: Mutex::default() });
        let (tx, rx) = std::sync::mpsc::channel();
        // One stream, two executors, a barrier every 2 transactions.
        let _shared = start(Arc::clone(&sink) as Arc<dyn Sink>, rx, |w: Result<Work, String>| w, 1, Ts(0), 2, 2);
        let txns = vec![txn(1, &[1]), txn(2, &[2]), txn(3, &[3])];
        tx.send(Ok(Work { stream: 0, bound: Ts(3), floor: None, txns })).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while *sink.replayed.lock() < Ts(3) {
            assert!(sink.failed.lock().is_none(), "{:?}", sink.failed.lock());
            assert!(std::time::Instant::now() < deadline, "replay stopped at {:?}", sink.replayed.lock());
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut done = sink.installed.lock().clone();
        done.sort();
        assert_eq!(done, [1, 2, 3]);
    }

    /// Without barriers (`dependency:0`), behind a transaction whose install waits, the
    /// dispatcher takes at most `WINDOW_MAX` transactions from it on, finished or not
    /// (each holds its batch): before 2026-12-07 it took every transaction that came, and
    /// kept each finished one, batch and all, behind the one that waited (found by a
    /// review). Once that one finishes, the rest is replayed.
    #[test]
    fn behind_a_waiting_transaction_the_dispatcher_holds_a_bounded_window() {
        struct Blocks {
            go: AtomicBool,
            installed: AtomicUsize,
            replayed: Mutex<Ts>,
            failed: Mutex<Option<String>>,
        }
        impl Sink for Blocks {
            fn install(&self, t: &Txn, _: &mut dyn FnMut(Ts) -> bool) -> Result<(), String> {
                while t.ts == Ts(1) && !self.go.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                self.installed.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            fn replayed(&self, ts: Ts) {
                let mut r = self.replayed.lock();
                *r = (*r).max(ts);
            }
            fn failed(&self, why: String) {
                *self.failed.lock() = Some(why);
            }
            fn add_done(&self, _: u64) {}
        }
        let sink = Arc::new(Blocks {
            go: AtomicBool::new(false),
            installed: AtomicUsize::new(0),
            replayed: Mutex::new(Ts(0)),
            failed: Mutex::default(),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let _shared = start(Arc::clone(&sink) as Arc<dyn Sink>, rx, |w: Result<Work, String>| w, 1, Ts(0), 2, 0);
        let n = (WINDOW_MAX + 2000) as u64;
        for ts in 1..=n {
            tx.send(Ok(Work { stream: 0, bound: Ts(ts), floor: None, txns: vec![txn(ts, &[ts])] })).unwrap();
        }
        // Everything the dispatcher takes behind ts 1 is installed at once: wait until that
        // stops moving.
        let mut seen = usize::MAX;
        while sink.installed.load(Ordering::Acquire) != seen {
            seen = sink.installed.load(Ordering::Acquire);
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(seen < WINDOW_MAX, "{seen} transactions installed behind a waiting one");
        assert!(seen >= WINDOW_MAX - MAX_IN_FLIGHT, "only {seen} installed: the window took too few");
        sink.go.store(true, Ordering::Release);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while *sink.replayed.lock() < Ts(n) {
            assert!(sink.failed.lock().is_none(), "{:?}", sink.failed.lock());
            assert!(std::time::Instant::now() < deadline, "replay stopped at {:?}", sink.replayed.lock());
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(sink.installed.load(Ordering::Acquire), n as usize);
    }

    /// The executors against a recording sink: every row's writes are installed in ts
    /// order, a follower never runs before the writers it depends on finished, and the
    /// published watermark never covers a transaction not yet installed.
    #[test]
    fn executors_respect_row_order_and_the_watermark_respects_installs() {
        struct Rec {
            log: Mutex<Vec<(u64, Vec<u64>)>>,
            installed: Mutex<std::collections::HashSet<u64>>,
            replayed: Mutex<Vec<(Ts, Vec<u64>)>>,
            failed: Mutex<Option<String>>,
        }
        impl Sink for Rec {
            fn install(&self, t: &Txn, _: &mut dyn FnMut(Ts) -> bool) -> Result<(), String> {
                self.log.lock().push((t.ts.0, t.writes().map(|w| w.1 .0).collect()));
                std::thread::yield_now();
                self.installed.lock().insert(t.ts.0);
                Ok(())
            }
            fn replayed(&self, ts: Ts) {
                let done: Vec<u64> = self.installed.lock().iter().copied().collect();
                self.replayed.lock().push((ts, done));
            }
            fn failed(&self, why: String) {
                *self.failed.lock() = Some(why);
            }
            fn add_done(&self, _: u64) {}
        }
        let sink = Arc::new(Rec {
            log: Mutex::default(),
            installed: Mutex::default(),
            replayed: Mutex::default(),
            failed: Mutex::default(),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = start(Arc::clone(&sink) as Arc<dyn Sink>, rx, |w: Result<Work, String>| w, 3, Ts(0), 4, 7);
        // 3 streams, ts interleaved round robin; rows drawn from a small hot set.
        let mut ts = 0u64;
        let mut per_stream: Vec<Vec<Txn>> = vec![Vec::new(); 3];
        let mut x = 12345u64;
        for _ in 0..3000 {
            ts += 1;
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let rows = [(x >> 33) % 20, (x >> 45) % 200];
            per_stream[(ts % 3) as usize].push(txn(ts, &rows));
        }
        // Ship in batches of 10 per stream, streams taking turns, bounds as written.
        let mut cursors = [0usize; 3];
        while cursors.iter().zip(&per_stream).any(|(c, s)| *c < s.len()) {
            for s in 0..3 {
                let end = (cursors[s] + 10).min(per_stream[s].len());
                if cursors[s] == end {
                    continue;
                }
                let txns: Vec<Txn> = per_stream[s][cursors[s]..end].to_vec();
                let bound = txns.last().unwrap().ts;
                cursors[s] = end;
                tx.send(Ok(Work { stream: s, bound, floor: None, txns })).unwrap();
            }
        }
        // A heartbeat vouching for everything.
        tx.send(Ok(Work { stream: 0, bound: Ts(ts), floor: Some(Ts(ts)), txns: vec![] })).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        // Publications may land out of order (the engine keeps the maximum).
        while !sink.replayed.lock().iter().any(|r| r.0 >= Ts(ts)) {
            assert!(std::time::Instant::now() < deadline, "replay did not finish");
            assert!(sink.failed.lock().is_none());
            std::thread::sleep(Duration::from_millis(5));
        }
        while !shared.quiet() {
            assert!(std::time::Instant::now() < deadline, "replay threads never went quiet");
            std::thread::sleep(Duration::from_millis(1));
        }
        let log = sink.log.lock();
        assert_eq!(log.len(), 3000, "every transaction installed once");
        let mut last_ts: HashMap<u64, u64> = HashMap::new();
        for (t, rows) in log.iter() {
            let rows: std::collections::BTreeSet<u64> = rows.iter().copied().collect();
            for r in &rows {
                let prev = last_ts.insert(*r, *t).unwrap_or(0);
                assert!(prev < *t, "row {r}: ts {t} installed after ts {prev}");
            }
        }
        for (w, done) in sink.replayed.lock().iter() {
            let done: std::collections::HashSet<u64> = done.iter().copied().collect();
            for t in 1..=w.0 {
                assert!(done.contains(&t), "watermark {} published before ts {t} was installed", w.0);
            }
        }
    }

    /// A failing install stops replay: the failure is reported, and the replayed watermark
    /// never covers the transaction that failed. A batch that does not decode stops the
    /// dispatcher the same way.
    #[test]
    fn a_failed_install_or_an_undecodable_batch_stops_replay_and_says_why() {
        struct Failing {
            at: u64,
            replayed: Mutex<Ts>,
            failed: Mutex<Option<String>>,
        }
        impl Sink for Failing {
            fn install(&self, t: &Txn, _: &mut dyn FnMut(Ts) -> bool) -> Result<(), String> {
                if t.ts.0 == self.at {
                    return Err(format!("no room for ts {}", t.ts.0));
                }
                Ok(())
            }
            fn replayed(&self, ts: Ts) {
                let mut r = self.replayed.lock();
                *r = (*r).max(ts);
            }
            fn failed(&self, why: String) {
                self.failed.lock().get_or_insert(why);
            }
            fn add_done(&self, _: u64) {}
        }
        let wait_failed = |sink: &Failing| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while sink.failed.lock().is_none() {
                assert!(std::time::Instant::now() < deadline, "the failure was never reported");
                std::thread::sleep(Duration::from_millis(2));
            }
            sink.failed.lock().clone().unwrap()
        };
        // An install fails at ts 50 (one stream, one row: every transaction follows it).
        let sink = Arc::new(Failing { at: 50, replayed: Mutex::new(Ts(0)), failed: Mutex::default() });
        let (tx, rx) = std::sync::mpsc::channel();
        start(Arc::clone(&sink) as Arc<dyn Sink>, rx, |w: Result<Work, String>| w, 1, Ts(0), 2, 0);
        let txns: Vec<Txn> = (1..=100).map(|ts| txn(ts, &[7])).collect();
        tx.send(Ok(Work { stream: 0, bound: Ts(100), floor: None, txns })).unwrap();
        assert_eq!(wait_failed(&sink), "no room for ts 50");
        std::thread::sleep(Duration::from_millis(50));
        assert!(*sink.replayed.lock() < Ts(50), "the watermark covered the failed transaction");
        // Every thread ends (each held the sink) once the dispatcher's input closes.
        drop(tx);
        let threads_end = |sink: &Arc<Failing>| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while Arc::strong_count(sink) > 1 {
                assert!(std::time::Instant::now() < deadline, "{} replay threads run on", Arc::strong_count(sink) - 1);
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        threads_end(&sink);

        // A batch that does not decode.
        let sink = Arc::new(Failing { at: 0, replayed: Mutex::new(Ts(0)), failed: Mutex::default() });
        let (tx, rx) = std::sync::mpsc::channel();
        start(Arc::clone(&sink) as Arc<dyn Sink>, rx, |w: Result<Work, String>| w, 1, Ts(0), 1, 0);
        tx.send(Err("payload checksum mismatch".to_string())).unwrap();
        assert_eq!(wait_failed(&sink), "payload checksum mismatch");
        // The executors end too, with the input still open.
        threads_end(&sink);
        drop(tx);
    }
}
