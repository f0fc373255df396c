//! The commit clock
//! ================
//! One global counter hands out commit timestamps (as in ERMIA and Query Fresh; Silo's
//! epoch-based TIDs would avoid the shared counter but give no total order cheaply, and the
//! log, the watermark and replay all need one). Next to it, each worker has a *commit slot*:
//!
//! ```text
//!   worker w commits:  slot[w] = clock      (a lower bound: its ts will be larger)
//!                      ts      = ++clock
//!                      validate, install, append to stream w
//!                      slot[w] = IDLE
//! ```
//!
//! Two facts follow, both read with the clock loaded *before* the slots (all SeqCst):
//! - `visible_ts() = min(clock, every busy slot)`: every transaction with a timestamp at or
//!   below it has finished installing, so a snapshot there never sees half a transaction.
//! - `stream_bound(w) = min(clock, slot[w])`: every transaction of worker w with a timestamp
//!   at or below it has been appended to stream w. The log persists this bound with each
//!   batch; the minimum over streams is the durable watermark (Rolis 3.3).
//!
//! Reader slots hold the snapshot timestamps of live read-only transactions; the GC horizon
//! is the minimum of those and `visible_ts()`, and only versions below the horizon that are
//! shadowed by a newer version at or below it are reclaimed.
//!
//! Two horizons
//! ------------
//! One long snapshot (a checkpoint's, held for seconds) holds that minimum back, and with
//! one horizon every version written meanwhile stays: a record updated on each commit grows
//! a chain of thousands of versions that nobody can read, and each install walks it all to
//! find where to cut (on a backup checkpointing under TPC-C that walk was 19% of replay's
//! samples and doubled its CPU per transaction). So the clock also keeps a *high* horizon:
//! the minimum of `visible_ts()` and every snapshot *above* the low one. Every live snapshot
//! is then either exactly at `low` or at or above `high`, so a trim keeps the versions above
//! `high`, the newest at or below `high`, and the newest at or below `low`, and frees the
//! versions between those two (`record::trim`): the chain under a held snapshot stays a few
//! versions long. (The general form keeps the newest version under each live snapshot, as
//! HyPer's and HANA's interval GCs do; two levels cover the case that costs: one old
//! snapshot, the rest recent.)
//!
//! A reader registers with a *pending* mark carrying the published `high` (its snapshot
//! will be at or above it, since `visible_ts` only grows); a refresh that sees a pending
//! slot caps both horizons at its value, as it cannot tell where the snapshot will land.
//! Each horizon is published with a `fetch_max` of its own; any mix of published values
//! is a valid pair (see `horizons`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

use crate::ids::Ts;

const IDLE: u64 = u64::MAX;
/// A reader slot's mark while its snapshot is being taken: the value under it is the high
/// horizon read before, a bound below the snapshot to come (timestamps fit in 62 bits).
const PENDING: u64 = 1 << 62;

#[repr(align(128))]
struct Slot(AtomicU64);

pub struct CommitClock {
    clock: AtomicU64,
    commit_slots: Box<[Slot]>,
    reader_slots: Box<[Slot]>,
    /// One more than the highest reader slot ever claimed: a refresh reads the slots below
    /// it only (claims take the lowest free slot, so a handful of readers use the first
    /// handful; it never comes down, so after a burst of N snapshots at once refreshes read
    /// N). Raised by a claim's attempt on a slot at or above it, before it marks the slot.
    /// Until 2026-12-06 every refresh read all 256 slots, 256 cache lines: a backup
    /// refreshes at each replayed batch, and it took 5% of its replay and its receiver.
    readers_used: AtomicUsize,
    horizon: AtomicU64,
    /// The high horizon (see the module notes; `horizons` never hands out one below
    /// `horizon`).
    horizon_high: AtomicU64,
    /// The largest `visible_ts` handed out: a committer may publish a slot value read just
    /// before another worker moved the clock, which would let a fresh computation dip below
    /// an earlier one. A bound once valid stays valid (installs are permanent), so we return
    /// the maximum and snapshots never go backwards.
    visible_max: AtomicU64,
    /// Record ids whose previous life ended at or below this may be given a new life
    /// (table.rs): the newest durable checkpoint's timestamp once a log is attached (0
    /// before the first), unbounded without one. Here, not in the database, because the
    /// log frames it into every batch (`reuse_bound`).
    reuse_bound: AtomicU64,
}

/// Max concurrent snapshots (read-only transactions, and a read-only transaction's
/// checks of its misses and scans); more wait for a free slot, and a claim that waits
/// about 10 s panics (`claim_reader_slot`). Each thread holds at most one at a time as
/// ditto uses them (a command's, a checkpoint's), so one per worker the engine takes
/// (`WORKERS_MAX`) and room for the other threads: before 2026-12-06 there were 256, and
/// an engine of more workers, each with a snapshot while a checkpoint held one, could
/// exhaust them and panic (a review). A refresh reads only the slots ever claimed
/// (`readers_used`), so the unused ones cost 128 bytes each and no time.
pub const READERS_MAX: usize = crate::db::WORKERS_MAX + 64;

impl CommitClock {
    pub(crate) fn new(workers: usize) -> CommitClock {
        let slot = || Slot(AtomicU64::new(IDLE));
        CommitClock {
            clock: AtomicU64::new(0),
            commit_slots: (0..workers).map(|_| slot()).collect(),
            reader_slots: (0..READERS_MAX).map(|_| slot()).collect(),
            readers_used: AtomicUsize::new(0),
            horizon: AtomicU64::new(0),
            horizon_high: AtomicU64::new(0),
            visible_max: AtomicU64::new(0),
            reuse_bound: AtomicU64::new(u64::MAX),
        }
    }

    /// Record ids whose previous life ended at or below this may be given a new life; the
    /// log frames it into each batch (crates/log/src/format.rs, `BatchHeader::reuse_ts`)
    /// after taking the batch's transactions, so it is at least what any of them read
    /// when it took an id: a replayer installs the batch's writes above it only once every
    /// transaction at or below it is installed, so no reused id's new life overtakes its
    /// old one (docs/replication.md, "A record id's lives the other way round"). `u64::MAX`
    /// without a log.
    pub fn reuse_bound(&self) -> Ts {
        Ts(self.reuse_bound.load(SeqCst))
    }

    /// A checkpoint at `ts` is durable (`Database::allow_rid_reuse_up_to`).
    pub(crate) fn raise_reuse_bound(&self, ts: Ts) {
        self.reuse_bound.fetch_max(ts.0, SeqCst);
    }

    /// A log is attached: ids are reused only under its checkpoints from now on.
    pub(crate) fn reset_reuse_bound(&self) {
        self.reuse_bound.store(0, SeqCst);
    }

    pub fn workers(&self) -> usize {
        self.commit_slots.len()
    }

    /// The last timestamp handed out.
    pub fn now(&self) -> Ts {
        Ts(self.clock.load(SeqCst))
    }

    /// Moves the clock forward to at least `ts` (recovery: new commits must be later than
    /// everything recovered).
    pub fn advance_to(&self, ts: Ts) {
        self.clock.fetch_max(ts.0, SeqCst);
        self.visible_max.fetch_max(ts.0, SeqCst);
    }

    pub(crate) fn begin_commit(&self, worker: usize) -> Ts {
        let slot = &self.commit_slots[worker].0;
        debug_assert_eq!(slot.load(SeqCst), IDLE, "worker {worker} is already committing");
        slot.store(self.clock.load(SeqCst), SeqCst);
        let ts = self.clock.fetch_add(1, SeqCst) + 1;
        assert!(ts < Ts::MAX.0, "commit clock overflow");
        // The value stored above may be stale: another worker may have taken a timestamp
        // (and committed, and been acknowledged) between the load and the store, and
        // `visible_ts` would then stay below that commit while this one runs (a snapshot
        // taken after its acknowledgement missed it; found by a review, 2026-12-05). Now
        // that this commit's timestamp is known, the slot says exactly what lies below it.
        // (Still a lower bound, as the first store was: never above `ts - 1`.)
        slot.store(ts - 1, SeqCst);
        Ts(ts)
    }

    pub(crate) fn end_commit(&self, worker: usize) {
        self.commit_slots[worker].0.store(IDLE, SeqCst);
    }

    /// Every transaction with a timestamp at or below this has fully installed.
    pub fn visible_ts(&self) -> Ts {
        let mut ts = self.clock.load(SeqCst);
        for s in self.commit_slots.iter() {
            ts = ts.min(s.0.load(SeqCst));
        }
        Ts(self.visible_max.fetch_max(ts, SeqCst).max(ts))
    }

    /// Every transaction of `worker` with a timestamp at or below this has been handed to
    /// the commit log (see the module notes).
    pub fn stream_bound(&self, worker: usize) -> Ts {
        let c = self.clock.load(SeqCst);
        Ts(c.min(self.commit_slots[worker].0.load(SeqCst)))
    }

    /// Registers a snapshot. Returns (slot index, snapshot ts). The order of steps is what
    /// keeps the GC from trimming under a new reader; see `refresh_horizon`.
    pub(crate) fn register_reader(&self) -> (usize, Ts) {
        let (i, h) = self.claim_reader_slot();
        let ts = self.visible_ts();
        debug_assert!(ts.0 >= h, "a snapshot below the high horizon read before it");
        self.reader_slots[i].0.store(ts.0, SeqCst);
        (i, ts)
    }

    /// Takes a free reader slot and marks it pending at the high horizon `h` (returned):
    /// from here on it caps both horizons the GC can publish at h, so versions visible at
    /// any ts >= h stay until the slot moves; the snapshot the caller then takes is >= h
    /// (h came from an earlier `visible_ts`, which only grows).
    fn claim_reader_slot(&self) -> (usize, u64) {
        let mut spins = 0u64;
        loop {
            for (i, s) in self.reader_slots.iter().enumerate() {
                if s.0.load(SeqCst) != IDLE {
                    continue;
                }
                // Counted in what refreshes read before it can be marked: a refresh that
                // read the count without it read `visible_ts` before too, and the snapshot
                // this claim takes after marking the slot is at or above that, so above
                // both horizons that refresh computes (see `refresh_horizon`).
                if self.readers_used.load(SeqCst) <= i {
                    self.readers_used.fetch_max(i + 1, SeqCst);
                }
                let h = self.horizon_high.load(SeqCst);
                if s.0.compare_exchange(IDLE, PENDING | h, SeqCst, SeqCst).is_ok() {
                    return (i, h);
                }
            }
            spins += 1;
            assert!(spins < 10_000_000, "no free reader slot for a long time");
            std::thread::yield_now();
        }
    }

    pub(crate) fn release_reader(&self, slot: usize) {
        self.reader_slots[slot].0.store(IDLE, SeqCst);
    }

    /// Recomputes both GC horizons (see the module notes) and returns the low one: versions
    /// a snapshot at or above it may need are kept. `visible_ts` is read before the reader
    /// slots: a reader that registered after our slot scan read the clock later than we did,
    /// so its snapshot is >= what we compute.
    pub(crate) fn refresh_horizon(&self) -> Ts {
        let v = self.visible_ts().0;
        let used = self.readers_used.load(SeqCst).min(READERS_MAX);
        // On the stack for a few readers (the common case), not 2 KiB cleared each time.
        let (mut few, mut many) = ([IDLE; 16], Vec::new());
        let slots: &mut [u64] = match used <= few.len() {
            true => &mut few[..used],
            false => {
                many.resize(used, IDLE);
                &mut many
            }
        };
        for (x, s) in slots.iter_mut().zip(self.reader_slots.iter()) {
            *x = s.0.load(SeqCst);
        }
        let (low, high) = horizons_of(v, slots);
        let prev = self.horizon.fetch_max(low, SeqCst);
        self.horizon_high.fetch_max(high, SeqCst);
        Ts(prev.max(low))
    }

    /// Both horizons, for a trim (`record::trim`): every live snapshot is at `low` or at or
    /// above `high`. The two may come from different refreshes (each is a `fetch_max` of
    /// its own), and any mix is valid: each refresh's pair was valid when computed and
    /// stays so (later snapshots are at or above its `high`), and with the larger `low`
    /// and the larger `high` of two valid pairs, a snapshot between them would have to sit
    /// at the `low` of the pair that gave the `high`, which is at or below the larger
    /// `low`. `high` is never below `low`.
    pub(crate) fn horizons(&self) -> Horizons {
        let high = self.horizon_high.load(SeqCst);
        let low = self.horizon.load(SeqCst);
        Horizons { low: Ts(low), high: Ts(high.max(low)) }
    }
}

/// What a trim may free: every live snapshot is exactly at `low` or at or above `high`
/// (`low <= high`; equal, a single horizon).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Horizons {
    pub low: Ts,
    pub high: Ts,
}

impl Horizons {
    /// One horizon: no snapshot below `h`.
    pub fn at(h: Ts) -> Horizons {
        Horizons { low: h, high: h }
    }
}

/// (low, high) from the visible timestamp `v` and the busy reader slots' values: `low` is
/// the least of all, `high` the least of `v`, every pending mark, and every snapshot above
/// `low`.
fn horizons_of(v: u64, slots: &[u64]) -> (u64, u64) {
    let snaps = || slots.iter().copied().filter(|&x| x & PENDING == 0);
    let pending_min = slots.iter().filter(|&&x| x != IDLE && x & PENDING != 0).map(|&x| x & !PENDING).min();
    let cap = v.min(pending_min.unwrap_or(u64::MAX));
    let low = snaps().fold(cap, u64::min);
    let high = snaps().filter(|&x| x > low).fold(cap, u64::min);
    (low, high.max(low))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` commits by worker 0, one after the other.
    fn commit_n(c: &CommitClock, n: usize) {
        for _ in 0..n {
            c.begin_commit(0);
            c.end_commit(0);
        }
    }

    #[test]
    fn each_live_snapshot_is_at_low_or_at_or_above_high() {
        let idle = [IDLE; 4];
        assert_eq!(horizons_of(100, &idle), (100, 100), "no reader: one horizon at the visible ts");
        assert_eq!(horizons_of(100, &[IDLE, 40, IDLE, IDLE]), (40, 100), "one old snapshot");
        assert_eq!(horizons_of(100, &[40, 70, 90, 40]), (40, 70), "the least snapshot above the low one");
        assert_eq!(horizons_of(100, &[40, 40, IDLE, IDLE]), (40, 100), "two at the same old ts");
        assert_eq!(horizons_of(100, &[100, IDLE, IDLE, IDLE]), (100, 100));
        // A pending mark caps both: the snapshot to come lies somewhere at or above it.
        assert_eq!(horizons_of(100, &[40, PENDING | 60, IDLE, IDLE]), (40, 60));
        assert_eq!(horizons_of(100, &[40, PENDING | 30, 70, IDLE]), (30, 30), "pending below every snapshot");
        assert_eq!(horizons_of(100, &[PENDING | 40, 40, IDLE, IDLE]), (40, 40), "pending at the low one");
    }

    #[test]
    fn a_reader_registers_at_or_above_the_published_high_horizon() {
        let c = CommitClock::new(1);
        for _ in 0..10 {
            let ts = c.begin_commit(0);
            c.end_commit(0);
            assert!(ts.0 > 0);
        }
        let (old, at) = c.register_reader();
        for _ in 0..10 {
            c.begin_commit(0);
            c.end_commit(0);
        }
        c.refresh_horizon();
        assert_eq!(c.horizons(), Horizons { low: at, high: Ts(20) });
        let (young, at2) = c.register_reader();
        assert_eq!(at2, Ts(20));
        for _ in 0..5 {
            c.begin_commit(0);
            c.end_commit(0);
        }
        assert_eq!(c.refresh_horizon(), at);
        assert_eq!(c.horizons(), Horizons { low: at, high: Ts(20) }, "held at the younger snapshot");
        c.release_reader(old);
        c.refresh_horizon();
        assert_eq!(c.horizons(), Horizons { low: Ts(20), high: Ts(25) });
        c.release_reader(young);
        c.refresh_horizon();
        assert_eq!(c.horizons(), Horizons::at(Ts(25)));
    }

    /// A snapshot for each worker of the largest engine, and one more (a checkpoint's), are
    /// held at once: each gets a slot of its own, at once (before 2026-12-06 the 257th
    /// waited for a free slot, then panicked), and a refresh counts the oldest.
    #[test]
    fn a_snapshot_per_worker_of_the_largest_engine_and_a_checkpoints_fit() {
        let c = CommitClock::new(1);
        commit_n(&c, 3);
        let held: Vec<(usize, Ts)> = (0..crate::db::WORKERS_MAX + 1).map(|_| c.register_reader()).collect();
        let slots: std::collections::BTreeSet<usize> = held.iter().map(|h| h.0).collect();
        assert_eq!(slots.len(), held.len(), "each snapshot has a slot of its own");
        commit_n(&c, 3);
        assert_eq!(c.refresh_horizon(), held[0].1, "the oldest snapshot holds the horizon");
        for (slot, _) in held {
            c.release_reader(slot);
        }
        assert!(c.refresh_horizon() > Ts(3));
    }

    /// A refresh reads only the slots ever claimed (`readers_used`), and each of those: the
    /// oldest snapshot in the highest slot claimed holds the horizon, and so does one in a
    /// slot claimed after others were released (the lowest free one, reused).
    #[test]
    fn a_refresh_sees_every_slot_ever_claimed_and_no_more() {
        let c = CommitClock::new(1);
        let commit = |n: usize| commit_n(&c, n);
        assert_eq!(c.readers_used.load(SeqCst), 0);
        commit(10);
        let old = c.register_reader();
        let mut young = Vec::new();
        for _ in 0..5 {
            commit(10);
            young.push(c.register_reader());
        }
        assert_eq!(c.readers_used.load(SeqCst), 6);
        // The oldest now in the highest slot: the young ones in the slots below are let go,
        // and one taken again below it.
        c.release_reader(old.0);
        for &(i, _) in &young[..4] {
            c.release_reader(i);
        }
        commit(10);
        let (hi, hi_ts) = young[4];
        assert_eq!((hi, hi_ts), (5, Ts(60)));
        let again = c.register_reader();
        assert_eq!(again, (0, Ts(70)));
        c.refresh_horizon();
        assert_eq!(c.horizons(), Horizons { low: Ts(60), high: Ts(70) });
        assert_eq!(c.readers_used.load(SeqCst), 6, "no claim above the sixth slot");
        c.release_reader(hi);
        c.release_reader(again.0);
        c.refresh_horizon();
        assert_eq!(c.horizons(), Horizons::at(Ts(70)));
    }

    /// More readers than a refresh keeps on its stack: the oldest snapshot, in the
    /// twentieth slot, still holds the horizon.
    #[test]
    fn a_refresh_past_a_few_readers_sees_the_oldest_in_a_high_slot() {
        let c = CommitClock::new(1);
        let commit = |n: usize| commit_n(&c, n);
        commit(10);
        let first: Vec<(usize, Ts)> = (0..20).map(|_| c.register_reader()).collect();
        assert_eq!(first[19], (19, Ts(10)));
        commit(10);
        for &(i, _) in &first[..19] {
            c.release_reader(i);
        }
        let again = c.register_reader();
        assert_eq!(again, (0, Ts(20)));
        c.refresh_horizon();
        assert_eq!(c.horizons(), Horizons { low: Ts(10), high: Ts(20) });
        c.release_reader(19);
        c.release_reader(again.0);
        c.refresh_horizon();
        assert_eq!(c.horizons(), Horizons::at(Ts(20)));
    }

    /// A refresh between a reader's look at the clock and its slot's update (the window
    /// the pending mark is for): the refresh must not publish a high horizon above the
    /// snapshot the reader is about to take. With the slot marked at h without the pending
    /// bit, it counted as a snapshot at h, and the high horizon went past the reader's.
    #[test]
    fn a_refresh_during_a_readers_registration_never_passes_its_snapshot() {
        let c = CommitClock::new(1);
        let commit = |n: usize| commit_n(&c, n);
        commit(20);
        c.refresh_horizon();
        assert_eq!(c.horizons(), Horizons::at(Ts(20)));
        // A reader registers, step by step, with a refresh in the middle.
        let (i, h) = c.claim_reader_slot();
        assert_eq!(h, 20);
        commit(5);
        let ts = c.visible_ts();
        commit(5);
        c.refresh_horizon();
        c.reader_slots[i].0.store(ts.0, SeqCst);
        let hz = c.horizons();
        assert!(ts == hz.low || ts >= hz.high, "snapshot {ts:?} between the horizons {hz:?}");
        assert_eq!(hz, Horizons::at(Ts(20)));
        c.release_reader(i);
    }
}
