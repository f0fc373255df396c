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

/// Batches numbered in shipping order, completed in any order across streams but in
/// shipping order within each stream (one replayer per stream, or one for all); the
/// prefix of completed ones feeds a `Prefix`.
///
/// Besides that prefix it keeps, per stream, how far the stream's own batches are
/// installed, which may run ahead of the prefix (a later batch of one stream done while
/// an earlier batch of another is not), and what a batch in progress reports with
/// `progress`. The watermark is the highest of three claims, each sound on its own:
/// - the prefix's watermark (floors count only here: a floor vouches for what came
///   *earlier in the order*);
/// - the minimum over streams of what each has installed of its own transactions;
/// - a floor of the batch in progress at the head of the order (every earlier batch
///   done), capped at what that batch has installed;
/// - a floor further on, once every batch up to it is known (`started`): every
///   transaction at or below it is in a batch up to it, so, capped at what each stream
///   with a batch not done there has installed of its own, it is all installed. A
///   replayer waiting in a batch needs it (`progress` computes it): an idle stream's
///   bound stays where it was, and the floor that vouches for it may come after the
///   waiting batch, even in its own stream (a gap's closing vouch), so the head's floor
///   alone left the wait for ever.
#[derive(Debug)]
pub struct Ordered {
    next: u64,
    done: BTreeMap<u64, (usize, Ts, Option<Ts>)>,
    pub prefix: Prefix,
    /// Per stream: every transaction of it at or below this is installed.
    installed: Vec<Ts>,
    /// The last batch completed per stream (the per-stream order is asserted).
    last_seq: Vec<Option<u64>>,
    /// The third and fourth claims above.
    vouched: Ts,
    /// Batches handed to replay and not complete: their stream and floor.
    started: BTreeMap<u64, (usize, Option<Ts>)>,
}

impl Ordered {
    /// The first batch to come is number `first`.
    pub fn new(prefix: Prefix, first: u64) -> Ordered {
        let streams = prefix.bounds.len();
        let base = prefix.base;
        Ordered {
            next: first,
            done: BTreeMap::new(),
            prefix,
            installed: vec![base; streams],
            last_seq: vec![None; streams],
            vouched: base,
            started: BTreeMap::new(),
        }
    }

    /// Batch `seq` of `stream` with `floor` is handed to replay (it completes later).
    pub fn started(&mut self, seq: u64, stream: usize, floor: Option<Ts>) {
        if seq >= self.next && !self.done.contains_key(&seq) {
            self.started.insert(seq, (stream, floor));
        }
    }

    /// The fourth claim (see the type's notes): the best floor of the batches known from
    /// the head on, each capped at what every stream with a batch not done up to it has
    /// installed; at least the watermark. Walks those batches (a waiting replayer asks, not
    /// every completion), until no floor further on could give more.
    fn reach(&self) -> Ts {
        let mut open = vec![false; self.installed.len()];
        let (mut cap, mut best) = (Ts(u64::MAX), self.watermark());
        for seq in self.next.. {
            let (stream, floor, done) = match (self.started.get(&seq), self.done.get(&seq)) {
                (_, Some(&(s, _, f))) => (s, f, true),
                (Some(&(s, f)), None) => (s, f, false),
                (None, None) => break,
            };
            if !done && !open[stream] {
                open[stream] = true;
                cap = cap.min(self.installed[stream]);
                // The cap only comes down: no floor further on can give more.
                if cap <= best {
                    break;
                }
            }
            if let Some(f) = floor {
                best = best.max(f.min(cap));
            }
        }
        best
    }

    /// Batch `seq` is complete. Returns the watermark.
    pub fn complete(&mut self, seq: u64, stream: usize, bound: Ts, floor: Option<Ts>) -> Ts {
        assert!(seq >= self.next, "batch {seq} completed twice");
        assert!(
            self.last_seq[stream].is_none_or(|l| seq > l),
            "batch {seq} of stream {stream} completed out of its stream's order"
        );
        self.last_seq[stream] = Some(seq);
        self.installed[stream] = self.installed[stream].max(bound);
        self.started.remove(&seq);
        self.done.insert(seq, (stream, bound, floor));
        while let Some((s, b, f)) = self.done.remove(&self.next) {
            self.prefix.push(s, b, f);
            self.next += 1;
        }
        self.watermark()
    }

    /// Batch `seq` of `stream` (with `floor`) is in progress and every transaction of it
    /// at or below `upto` is installed; so is every earlier batch of its stream. Returns
    /// the watermark. A replayer that must wait for the read view in the middle of a
    /// batch reports this first, or it would wait for itself.
    pub fn progress(&mut self, seq: u64, stream: usize, upto: Ts, floor: Option<Ts>) -> Ts {
        assert!(
            self.last_seq[stream].is_none_or(|l| seq > l),
            "progress in batch {seq} of stream {stream}, completed already"
        );
        self.installed[stream] = self.installed[stream].max(upto);
        if seq == self.next {
            if let Some(f) = floor {
                self.vouched = self.vouched.max(f.min(upto));
            }
        }
        self.vouched = self.vouched.max(self.reach());
        self.watermark()
    }

    /// Every transaction at or below this is installed (see the type's notes).
    pub fn watermark(&self) -> Ts {
        let own = self.installed.iter().copied().min().unwrap_or(self.prefix.base);
        self.prefix.watermark().max(own).max(self.vouched)
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
        // Any interleaving of the streams, each stream's batches in its own order (one
        // replayer per stream).
        let orders: [[usize; 4]; 5] = [[0, 1, 2, 3], [1, 3, 0, 2], [1, 0, 3, 2], [0, 2, 1, 3], [1, 0, 2, 3]];
        for order in orders {
            let mut o = Ordered::new(Prefix::new(2, Ts(0)), 0);
            let mut done = [false; 4];
            for &i in &order {
                let (s, b) = batches[i];
                let w = o.complete(i as u64, s, Ts(b), None);
                assert_eq!(w, o.watermark());
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
    #[should_panic(expected = "out of its stream's order")]
    fn a_stream_completed_out_of_its_order_is_a_bug() {
        let mut o = Ordered::new(Prefix::new(2, Ts(0)), 1);
        o.complete(3, 0, Ts(5), None);
        o.complete(1, 0, Ts(2), None);
    }

    /// A replayer in the middle of a batch reports what it installed: it counts for its
    /// stream at once, its batch's floor only once every earlier batch is done, and never
    /// beyond what it installed.
    #[test]
    fn progress_in_a_batch_counts_for_its_stream_and_its_floor_only_at_the_head() {
        // Batch 1: stream 1, ts up to 4. Batch 2: stream 0, ts 3..9, floor 8.
        let mut o = Ordered::new(Prefix::new(2, Ts(0)), 1);
        assert_eq!(o.progress(2, 0, Ts(6), Some(Ts(8))), Ts(0), "stream 1 has nothing installed");
        assert_eq!(o.complete(1, 1, Ts(4), None), Ts(4), "both streams hold everything up to 4");
        assert_eq!(o.watermark(), Ts(4));
        // Now batch 2 is at the head: its floor vouches for stream 1 up to 8, capped at
        // what batch 2 installed (6).
        assert_eq!(o.progress(2, 0, Ts(6), Some(Ts(8))), Ts(6));
        assert_eq!(o.progress(2, 0, Ts(8), Some(Ts(8))), Ts(8));
        assert_eq!(o.complete(2, 0, Ts(9), Some(Ts(8))), Ts(8), "stream 1 is vouched for up to 8 only");
        // Without a floor, progress lifts only its own stream.
        let mut o = Ordered::new(Prefix::new(2, Ts(0)), 1);
        o.complete(1, 1, Ts(10), None);
        assert_eq!(o.progress(2, 0, Ts(7), None), Ts(7));
        assert_eq!(o.progress(2, 0, Ts(12), None), Ts(10), "stream 1 holds up to 10 only");
    }

    /// A replayer waiting in a batch (stream 0, batch 1, everything of it below 20
    /// installed) needs stream 1, idle since its bound 5, to be vouched for; the floor
    /// that does it comes later, in stream 0's own next batch (a gap's closing vouch).
    /// Known, it counts, capped at what every stream with a batch not done before it has
    /// installed; unknown batches in between stop the walk.
    #[test]
    fn a_floor_behind_a_waiting_batch_counts_once_every_batch_before_it_is_known() {
        let mut o = Ordered::new(Prefix::new(3, Ts(0)), 1);
        o.started(1, 0, None);
        o.complete(2, 1, Ts(5), None);
        o.started(4, 0, Some(Ts(30)));
        assert_eq!(o.progress(1, 0, Ts(19), None), Ts(0), "batch 3 is not known: the floor may not count");
        o.started(3, 2, None);
        assert_eq!(o.progress(1, 0, Ts(19), None), Ts(0), "capped at what stream 2 installed: nothing");
        assert_eq!(o.complete(3, 2, Ts(25), None), Ts(5), "stream 1 holds up to 5; no waiting replayer asked yet");
        assert_eq!(o.progress(1, 0, Ts(19), None), Ts(19), "the floor 30, capped at stream 0's 19");
        assert_eq!(o.progress(1, 0, Ts(29), None), Ts(29));
        assert_eq!(o.complete(1, 0, Ts(29), None), Ts(29));
        assert_eq!(o.complete(4, 0, Ts(30), Some(Ts(30))), Ts(30));
        // A floor never counts past a stream that has a batch not done before it.
        let mut o = Ordered::new(Prefix::new(2, Ts(0)), 1);
        o.started(1, 1, None);
        o.started(2, 0, Some(Ts(50)));
        assert_eq!(o.progress(2, 0, Ts(40), Some(Ts(50))), Ts(0), "stream 1's batch 1 installed nothing");
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
