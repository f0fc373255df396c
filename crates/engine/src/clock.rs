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

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use crate::ids::Ts;

const IDLE: u64 = u64::MAX;

#[repr(align(128))]
struct Slot(AtomicU64);

pub struct CommitClock {
    clock: AtomicU64,
    commit_slots: Box<[Slot]>,
    reader_slots: Box<[Slot]>,
    horizon: AtomicU64,
    /// The largest `visible_ts` handed out: a committer may publish a slot value read just
    /// before another worker moved the clock, which would let a fresh computation dip below
    /// an earlier one. A bound once valid stays valid (installs are permanent), so we return
    /// the maximum and snapshots never go backwards.
    visible_max: AtomicU64,
}

/// Max concurrent read-only transactions (snapshots); more wait for a free slot.
pub const READERS_MAX: usize = 256;

impl CommitClock {
    pub(crate) fn new(workers: usize) -> CommitClock {
        let slot = || Slot(AtomicU64::new(IDLE));
        CommitClock {
            clock: AtomicU64::new(0),
            commit_slots: (0..workers).map(|_| slot()).collect(),
            reader_slots: (0..READERS_MAX).map(|_| slot()).collect(),
            horizon: AtomicU64::new(0),
            visible_max: AtomicU64::new(0),
        }
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
        let mut spins = 0u64;
        loop {
            for (i, s) in self.reader_slots.iter().enumerate() {
                let h = self.horizon.load(SeqCst);
                if s.0.compare_exchange(IDLE, h, SeqCst, SeqCst).is_ok() {
                    // The slot now holds a value <= any horizon the GC can publish from here
                    // on, so versions visible at any ts >= h stay until we move the slot.
                    let ts = self.visible_ts();
                    s.0.store(ts.0, SeqCst);
                    return (i, ts);
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

    /// Recomputes the GC horizon: versions a snapshot at or above it may need are kept.
    /// `visible_ts` is read before the reader slots: a reader that registered after our slot
    /// scan read the clock later than we did, so its snapshot is >= what we compute.
    pub(crate) fn refresh_horizon(&self) -> Ts {
        let mut h = self.visible_ts().0;
        for s in self.reader_slots.iter() {
            h = h.min(s.0.load(SeqCst));
        }
        let prev = self.horizon.fetch_max(h, SeqCst);
        Ts(prev.max(h))
    }

    pub(crate) fn horizon(&self) -> Ts {
        Ts(self.horizon.load(std::sync::atomic::Ordering::Acquire))
    }
}
