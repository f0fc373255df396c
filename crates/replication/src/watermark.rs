//! Watermarks of a prefix of batches
//! =================================
//! Every watermark in replication (received, durable, replayed on a backup) is the same
//! function of a prefix of the batches in shipping order: the minimum over streams of the
//! highest bound seen, raised to the highest trusted floor seen (crates/log/src/writer.rs:
//! a floor vouches that every stream's transactions at or below it came earlier in the
//! order). It is the watermark the primary's own recovery computes from its disk, so a
//! backup that holds a prefix holds exactly the commits at or below it.
//!
//! `Prefix` tracks it for batches applied in order; `Ordered` turns completions that come
//! out of order (parallel replayers) into an in-order prefix. No I/O, no clock.

use std::collections::BTreeMap;

use ditto_engine::Ts;

/// The watermark of a prefix of batches (see the module notes).
/// Invariant: `watermark()` never decreases.
#[derive(Clone, Debug)]
pub struct Prefix {
    bounds: Vec<Ts>,
    floor: Ts,
    base: Ts,
}

impl Prefix {
    /// `streams` primary streams; everything at or below `base` is held already (a
    /// checkpoint or a recovered cut).
    pub fn new(streams: usize, base: Ts) -> Prefix {
        Prefix { bounds: vec![base; streams.max(1)], floor: base, base }
    }

    /// Applies the next batch of the prefix.
    pub fn push(&mut self, stream: usize, bound: Ts, floor: Option<Ts>) {
        let b = &mut self.bounds[stream];
        *b = (*b).max(bound);
        if let Some(f) = floor {
            self.floor = self.floor.max(f);
        }
    }

    pub fn watermark(&self) -> Ts {
        let min = self.bounds.iter().copied().min().unwrap_or(self.base);
        min.max(self.floor).max(self.base)
    }

    /// The highest bound seen of `stream`: every transaction of it at or below is held.
    pub fn stream_bound(&self, stream: usize) -> Ts {
        self.bounds[stream]
    }
}

/// Batches numbered in shipping order, completed in any order; the prefix of completed
/// ones feeds a `Prefix`.
#[derive(Debug)]
pub struct Ordered {
    next: u64,
    done: BTreeMap<u64, (usize, Ts, Option<Ts>)>,
    pub prefix: Prefix,
}

impl Ordered {
    /// The first batch to come is number `first`.
    pub fn new(prefix: Prefix, first: u64) -> Ordered {
        Ordered { next: first, done: BTreeMap::new(), prefix }
    }

    /// Batch `seq` is complete. Returns the prefix's watermark.
    pub fn complete(&mut self, seq: u64, stream: usize, bound: Ts, floor: Option<Ts>) -> Ts {
        assert!(seq >= self.next, "batch {seq} completed twice");
        self.done.insert(seq, (stream, bound, floor));
        while let Some((s, b, f)) = self.done.remove(&self.next) {
            self.prefix.push(s, b, f);
            self.next += 1;
        }
        self.prefix.watermark()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rolis figure 3: stream 0 commits ts 1 and 3, stream 1 commits ts 2 and 4. However the
    /// batches arrive and complete, the watermark never covers a transaction whose
    /// predecessor (on any stream) is missing.
    #[test]
    fn rolis_figure_3_a_later_commit_is_never_covered_before_an_earlier_one() {
        // (stream, bound): each batch holds one transaction, bound = its ts.
        let batches = [(0usize, 1u64), (1, 2), (0, 3), (1, 4)];
        let orders: [[usize; 4]; 4] = [[0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0], [1, 3, 0, 2]];
        for order in orders {
            let mut o = Ordered::new(Prefix::new(2, Ts(0)), 0);
            let mut done = [false; 4];
            for &i in &order {
                let (s, b) = batches[i];
                let w = o.complete(i as u64, s, Ts(b), None);
                done[i] = true;
                // Every transaction at or below w is complete.
                for (j, &(_, ts)) in batches.iter().enumerate() {
                    if ts <= w.0 {
                        assert!(done[j], "order {order:?}: watermark {w:?} covers ts {ts}, not complete");
                    }
                }
            }
            // Stream 0's bound is 3 and no floor vouches for it beyond: ts 4 waits for a
            // later batch (or heartbeat) of stream 0.
            assert_eq!(o.prefix.watermark(), Ts(3));
        }
    }

    #[test]
    fn an_idle_stream_is_vouched_for_by_a_floor() {
        let mut p = Prefix::new(3, Ts(10));
        p.push(0, Ts(20), Some(Ts(15)));
        assert_eq!(p.watermark(), Ts(15), "streams 1 and 2 idle up to 15");
        p.push(0, Ts(30), None);
        assert_eq!(p.watermark(), Ts(15), "an untrusted batch vouches for no other stream");
        p.push(1, Ts(40), Some(Ts(25)));
        assert_eq!(p.watermark(), Ts(25));
    }
}
