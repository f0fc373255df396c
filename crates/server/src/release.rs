//! Releasing replies once their commits are durable
//! ===============================================
//! A connection that has answered a pipeline waits until the log's watermark covers the
//! newest commit among its replies (`wait`); the log's disk threads report each new
//! watermark, or the log's failure, through `advance` (with backups, whatever moves the
//! release: a backup's ack read on a runtime thread, a batch shipped by one).
//!
//! ```text
//!  connection: wait(ts) --watermark >= ts--> Ok at once (no lock)
//!                       --otherwise-------> (ts, sender) into a min-heap, await the receiver
//!  flusher:    advance(w) -> pop every entry with ts <= w, send Ok: each waiter woken once
//!              advance(_, failed) -> every entry, and every later wait not yet covered: Err
//! ```
//!
//! Why not a broadcast (a `tokio::sync::watch` of the watermark, as before): every move of
//! the watermark woke every waiting connection, and with 50 clients writing without
//! pipelining most of them went back to sleep because their commit was not yet covered (a
//! few thousand moves per second times ~40 waiters). The heap wakes exactly the
//! connections whose commits the move covers.
//!
//! Invariants: the watermark only grows; an entry is in the heap only while its ts is above
//! the watermark and the log has not failed (both checked under the lock that `advance`
//! takes); every entry leaves the heap exactly once, with Ok if covered, else with the
//! failure.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ditto_engine::Ts;
use parking_lot::Mutex;
use tokio::sync::oneshot;

type Outcome = Result<(), Arc<str>>;

/// See the module notes.
pub struct Release {
    /// The watermark, readable without the lock (the fast path of `wait`).
    watermark: AtomicU64,
    state: Mutex<State>,
    /// Raised to every commit `wait` releases (`counting_into`): the highest commit
    /// acknowledged to a client, shared by the releases of every policy.
    acknowledged: Option<Arc<AtomicU64>>,
    /// Told of each waiter that has to queue, once something watches (`new_waiters`).
    new_waiter: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
}

struct State {
    failed: Option<Arc<str>>,
    waiting: BinaryHeap<Waiter>,
    /// The queue's length at which waiters that gave up are dropped next (`wait`).
    prune_at: usize,
}

impl State {
    /// Drops the waiters whose receiver went away (a timeout, a closed connection).
    fn drop_given_up(&mut self) {
        self.waiting.retain(|w| !w.tx.is_closed());
    }
}

/// The queue is pruned of waiters that gave up once it reaches this many, then at twice
/// what it kept.
const PRUNE_AT_MIN: usize = 1024;

struct Waiter {
    ts: Ts,
    tx: oneshot::Sender<Outcome>,
}

// Ordered by ts, reversed: BinaryHeap is a max-heap and we pop the smallest ts first.
impl Ord for Waiter {
    fn cmp(&self, o: &Self) -> CmpOrdering {
        o.ts.cmp(&self.ts)
    }
}
impl PartialOrd for Waiter {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Waiter {
    fn eq(&self, o: &Self) -> bool {
        self.ts == o.ts
    }
}
impl Eq for Waiter {}

impl Default for Release {
    fn default() -> Self {
        Release {
            watermark: AtomicU64::new(0),
            state: Mutex::new(State { failed: None, waiting: BinaryHeap::new(), prune_at: PRUNE_AT_MIN }),
            acknowledged: None,
            new_waiter: std::sync::OnceLock::new(),
        }
    }
}

impl Release {
    /// A release that raises `acknowledged` to every commit it releases.
    pub fn counting_into(acknowledged: Arc<AtomicU64>) -> Release {
        Release { acknowledged: Some(acknowledged), ..Release::default() }
    }

    /// `ts` is released to its client.
    fn acknowledge(&self, ts: Ts) {
        if let Some(a) = &self.acknowledged {
            a.fetch_max(ts.0, Ordering::AcqRel);
        }
    }

    /// Every commit up to `w` is durable; `failed`, when set, is the log's failure (the
    /// first one reported is kept). Called from the log's threads and, with backups, from
    /// runtime threads (acks, batches shipped before parking); never blocks
    /// beyond the short lock, and moves of the watermark may arrive out of order.
    pub fn advance(&self, w: Ts, failed: Option<&Arc<str>>) {
        let mut st = self.state.lock();
        let w = Ts(self.watermark.fetch_max(w.0, Ordering::AcqRel).max(w.0));
        if let (Some(f), None) = (failed, &st.failed) {
            st.failed = Some(Arc::clone(f));
        }
        while st.waiting.peek().is_some_and(|top| top.ts <= w) {
            let done = st.waiting.pop().expect("peeked");
            // A receiver that went away (its connection closed) needs no answer.
            let _ = done.tx.send(Ok(()));
        }
        if let Some(f) = st.failed.clone() {
            for done in st.waiting.drain() {
                let _ = done.tx.send(Err(Arc::clone(&f)));
            }
        }
    }

    /// Fails every waiter still queued, and every later wait not yet covered, with
    /// `why`; the watermark stays where it is (nothing more is released as durable).
    pub fn fail(&self, why: &Arc<str>) {
        self.advance(Ts::ZERO, Some(why));
    }

    /// Every commit up to this is durable.
    pub fn watermark(&self) -> Ts {
        Ts(self.watermark.load(Ordering::Acquire))
    }

    /// Returns once every commit up to `ts` is durable, or with the log's failure if it
    /// failed first. `Ts(0)` (nothing to wait for) returns at once.
    pub async fn wait(&self, ts: Ts) -> Outcome {
        if self.watermark() >= ts {
            self.acknowledge(ts);
            return Ok(());
        }
        let rx = {
            let mut st = self.state.lock();
            // Re-read under the lock: `advance` moves the watermark and drains under it, so
            // an entry pushed now is either covered by a later `advance` or failed by one.
            if self.watermark() >= ts {
                self.acknowledge(ts);
                return Ok(());
            }
            if let Some(f) = &st.failed {
                return Err(Arc::clone(f));
            }
            // Waiters that gave up (a timeout, a closed connection) stay until the release
            // covers them: while it stalls (under `all` with a backup down) every client
            // that gave up and came back left one, for as long as the stall lasted. They
            // go once the queue doubles (found by a review).
            if st.waiting.len() >= st.prune_at {
                st.drop_given_up();
                st.prune_at = (st.waiting.len() * 2).max(PRUNE_AT_MIN);
            }
            let (tx, rx) = oneshot::channel();
            st.waiting.push(Waiter { ts, tx });
            if let Some(n) = self.new_waiter.get() {
                n.notify_one();
            }
            rx
        };
        let r = rx.await.unwrap_or_else(|_| Err("the server is shutting down".into()));
        if r.is_ok() {
            self.acknowledge(ts);
        }
        r
    }

    /// Connections waiting now (tests read it).
    pub fn waiting(&self) -> usize {
        self.state.lock().waiting.len()
    }

    /// Connections waiting now that still want an answer: those that gave up (a
    /// `DITTO.WAITTS` that timed out, a connection closed) are dropped first.
    pub fn waiting_still(&self) -> usize {
        let mut st = self.state.lock();
        st.drop_given_up();
        st.waiting.len()
    }

    /// Notified whenever a waiter queues from now on (a permit is kept if nobody is
    /// waiting on it then): whoever moves this release by polling (a backup's read view)
    /// need only poll while someone waits.
    pub fn new_waiters(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(self.new_waiter.get_or_init(Default::default))
    }
}

/// What the log's progress listener does with a new local watermark `w` or the log's
/// failure (`Logger::set_progress_listener`), for `releases` (the server's policy's and
/// each other policy's).
///
/// - Standalone (`recompute` is `None`): every release is the local log's; each moves to
///   `w`, and a failure fails whatever waits above it.
/// - A primary (`recompute` is `Primary::recompute`): each release moves by its own
///   policy, from the backups' acknowledgements and the local log. On a failure each is
///   moved so first, and then every waiter it does not cover fails: the local watermark
///   never releases by itself a commit whose policy counts backups (before, a failed log
///   moved every release to `w`, and a `majority` or `all` reply that no backup held went
///   out as +OK).
pub fn on_log_progress(recompute: Option<&dyn Fn()>, releases: &[Arc<Release>], w: Ts, failed: Option<&Arc<str>>) {
    // What a failed reply says (the log's error alone would not say that writes stopped).
    let failed: Option<Arc<str>> = failed.map(|f| format!("log failure, writes stopped: {f}").into());
    let failed = failed.as_ref();
    match (recompute, failed) {
        (Some(recompute), None) => recompute(),
        (Some(recompute), Some(why)) => give_up(Some(recompute), releases, why),
        (None, _) => {
            for r in releases {
                r.advance(w, failed);
            }
        }
    }
}

/// A primary that releases nothing more (its log failed; it was fenced for a switchover;
/// it follows another primary now): each release is moved by its own policy first
/// (`recompute`), and every reply it does not cover then fails with `why`, as does every
/// later wait.
pub fn give_up(recompute: Option<&dyn Fn()>, releases: &[Arc<Release>], why: &Arc<str>) {
    if let Some(recompute) = recompute {
        recompute();
    }
    for r in releases {
        r.fail(why);
    }
}

/// Polls a future once: `Some` if it finished (the tests' way to look at a wait).
#[cfg(test)]
pub(crate) fn poll_once<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
    let waker = std::task::Waker::noop();
    match f.poll(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;

    #[test]
    fn the_highest_commit_released_to_a_client_is_counted_for_every_policy_sharing_it() {
        let acked = Arc::new(AtomicU64::new(0));
        let (a, b) = (Release::counting_into(Arc::clone(&acked)), Release::counting_into(Arc::clone(&acked)));
        a.advance(Ts(4), None);
        assert_eq!(poll_once(pin!(a.wait(Ts(3)))), Some(Ok(())), "covered already");
        assert_eq!(acked.load(Ordering::Acquire), 3, "what a client was told, not the watermark");
        let mut w = pin!(b.wait(Ts(7)));
        assert_eq!(poll_once(w.as_mut()), None);
        assert_eq!(acked.load(Ordering::Acquire), 3, "not acknowledged while it waits");
        b.advance(Ts(9), None);
        assert_eq!(poll_once(w.as_mut()), Some(Ok(())));
        assert_eq!(acked.load(Ordering::Acquire), 7, "the other policy's release counts too");
        let mut failed = pin!(a.wait(Ts(20)));
        assert_eq!(poll_once(failed.as_mut()), None);
        a.advance(Ts(4), Some(&Arc::from("disk")));
        assert!(poll_once(failed.as_mut()).is_some_and(|r| r.is_err()));
        assert_eq!(acked.load(Ordering::Acquire), 7, "a failed commit is acknowledged to nobody");
    }

    /// A primary's log fails at a local watermark above what its policies' quorums hold:
    /// the replies that only the local disk held fail (outcome unknown); none goes out as
    /// OK. Standalone, the local watermark is the release: what it covers goes out.
    #[test]
    fn a_failed_log_releases_on_a_primary_only_what_each_policy_holds() {
        let why: Arc<str> = "fsync failed: EIO".into();
        // A primary: `majority` is held up to 4 by its quorum (what recompute moves it to),
        // `local` up to 10; the log fails with its own watermark at 10.
        let (majority, local) = (Arc::new(Release::default()), Arc::new(Release::default()));
        let mut held = pin!(majority.wait(Ts(4)));
        let mut only_here = pin!(majority.wait(Ts(8)));
        let mut local_wait = pin!(local.wait(Ts(8)));
        for w in [held.as_mut(), only_here.as_mut(), local_wait.as_mut()] {
            assert_eq!(poll_once(w), None);
        }
        let recompute = || {
            majority.advance(Ts(4), None);
            local.advance(Ts(10), None);
        };
        on_log_progress(Some(&recompute), &[Arc::clone(&majority), Arc::clone(&local)], Ts(10), Some(&why));
        assert_eq!(poll_once(held.as_mut()), Some(Ok(())), "held by the quorum");
        assert_eq!(poll_once(local_wait.as_mut()), Some(Ok(())), "local: durable here");
        // (The reply says that the log failed and writes stopped, and why.)
        let said: Arc<str> = "log failure, writes stopped: fsync failed: EIO".into();
        assert_eq!(poll_once(only_here.as_mut()), Some(Err(Arc::clone(&said))), "no backup held it");
        assert_eq!(majority.watermark(), Ts(4), "the local watermark moved no policy's release");
        assert!(poll_once(pin!(majority.wait(Ts(6)))).is_some_and(|r| r.is_err()), "later waits fail too");

        // Standalone: the local log is the release.
        let r = Arc::new(Release::default());
        let (mut durable, mut not) = (pin!(r.wait(Ts(8))), pin!(r.wait(Ts(12))));
        assert_eq!(poll_once(durable.as_mut()), None);
        assert_eq!(poll_once(not.as_mut()), None);
        on_log_progress(None, &[Arc::clone(&r)], Ts(10), Some(&why));
        assert_eq!(poll_once(durable.as_mut()), Some(Ok(())));
        assert_eq!(poll_once(not.as_mut()), Some(Err(said)));
    }

    #[test]
    fn waiters_are_released_in_timestamp_order_as_the_watermark_covers_them() {
        let r = Release::default();
        assert_eq!(poll_once(pin!(r.wait(Ts(0)))), Some(Ok(())), "nothing to wait for");
        let mut w5 = pin!(r.wait(Ts(5)));
        let mut w3 = pin!(r.wait(Ts(3)));
        let mut w9 = pin!(r.wait(Ts(9)));
        let mut w3b = pin!(r.wait(Ts(3)));
        for w in [w5.as_mut(), w3.as_mut(), w9.as_mut(), w3b.as_mut()] {
            assert_eq!(poll_once(w), None);
        }
        assert_eq!(r.waiting(), 4);
        r.advance(Ts(2), None);
        assert_eq!(r.waiting(), 4, "nothing covered");
        r.advance(Ts(4), None);
        assert_eq!(r.waiting(), 2, "both waiters at 3 released, 5 and 9 not");
        assert_eq!(poll_once(w3.as_mut()), Some(Ok(())));
        assert_eq!(poll_once(w3b.as_mut()), Some(Ok(())));
        assert_eq!(poll_once(w5.as_mut()), None);
        // A move reported late (another flusher's, smaller) does not take the watermark back.
        r.advance(Ts(1), None);
        assert_eq!(r.watermark(), Ts(4));
        r.advance(Ts(5), None);
        assert_eq!(poll_once(w5.as_mut()), Some(Ok(())));
        assert_eq!(poll_once(w9.as_mut()), None);
        assert_eq!(r.waiting(), 1);
        // Covered already: no entry.
        assert_eq!(poll_once(pin!(r.wait(Ts(5)))), Some(Ok(())));
        assert_eq!(r.waiting(), 1);
    }

    #[test]
    fn a_failure_fails_every_waiter_not_covered_and_every_later_one() {
        let r = Release::default();
        r.advance(Ts(10), None);
        let mut a = pin!(r.wait(Ts(11)));
        let mut b = pin!(r.wait(Ts(20)));
        assert_eq!(poll_once(a.as_mut()), None);
        assert_eq!(poll_once(b.as_mut()), None);
        let eio: Arc<str> = "fsync failed: EIO".into();
        // The failing flusher's last move covers `a`: it is released, `b` fails.
        r.advance(Ts(12), Some(&eio));
        assert_eq!(poll_once(a.as_mut()), Some(Ok(())));
        assert_eq!(poll_once(b.as_mut()), Some(Err(Arc::clone(&eio))));
        assert_eq!(r.waiting(), 0);
        // Later: covered commits are still durable; the rest fail at once, with the first reason.
        assert_eq!(poll_once(pin!(r.wait(Ts(12)))), Some(Ok(())));
        r.advance(Ts(12), Some(&"second failure".into()));
        assert_eq!(poll_once(pin!(r.wait(Ts(13)))), Some(Err(eio)));
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn a_waiter_that_goes_away_leaves_no_trouble() {
        let r = Release::default();
        {
            let mut gone = pin!(r.wait(Ts(7)));
            assert_eq!(poll_once(gone.as_mut()), None);
        }
        assert_eq!(r.waiting(), 1, "dropped, still in the heap until covered");
        r.advance(Ts(7), None);
        assert_eq!(r.waiting(), 0);
    }

    /// Many tasks waiting on many threads while flushers advance from other threads: every
    /// waiter finishes, none before its ts is covered.
    #[test]
    fn concurrent_waiters_and_advances() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let r = Arc::new(Release::default());
        let tasks: Vec<_> = (1..=400u64)
            .map(|i| {
                let r = Arc::clone(&r);
                rt.spawn(async move {
                    let ts = Ts(i * 7 % 1000 + 1);
                    r.wait(ts).await.unwrap();
                    assert!(r.watermark() >= ts);
                })
            })
            .collect();
        let flushers: Vec<_> = (0..2)
            .map(|f| {
                let r = Arc::clone(&r);
                std::thread::spawn(move || {
                    for w in (f..=1000).step_by(2) {
                        r.advance(Ts(w), None);
                        if w % 50 == 0 {
                            std::thread::sleep(std::time::Duration::from_micros(200));
                        }
                    }
                })
            })
            .collect();
        for f in flushers {
            f.join().unwrap();
        }
        rt.block_on(async {
            for t in tasks {
                tokio::time::timeout(std::time::Duration::from_secs(30), t).await.unwrap().unwrap();
            }
        });
        assert_eq!(r.waiting(), 0);
    }

    /// A waiter that gave up (its future dropped: a timeout, a closed connection) is not
    /// counted by `waiting_still`, and is dropped from the queue by it.
    #[test]
    fn a_waiter_that_gave_up_is_not_counted_as_still_waiting() {
        let r = Release::default();
        let mut kept = pin!(r.wait(Ts(7)));
        assert_eq!(poll_once(kept.as_mut()), None);
        {
            let mut gone = Box::pin(r.wait(Ts(9)));
            assert_eq!(poll_once(gone.as_mut()), None);
        }
        assert_eq!((r.waiting(), r.waiting_still(), r.waiting()), (2, 1, 1));
        r.advance(Ts(7), None);
        assert_eq!(poll_once(kept.as_mut()), Some(Ok(())));
        assert_eq!(r.waiting_still(), 0);
    }

    /// Waiters that gave up while the release stalls are dropped as more queue: the queue
    /// stays within twice what still waits (at least `PRUNE_AT_MIN`).
    #[test]
    fn waiters_that_gave_up_while_the_release_stalls_do_not_pile_up() {
        let r = Release::default();
        let mut kept = pin!(r.wait(Ts(3)));
        assert_eq!(poll_once(kept.as_mut()), None);
        for i in 0..10_000u64 {
            let mut gone = Box::pin(r.wait(Ts(5 + i)));
            assert_eq!(poll_once(gone.as_mut()), None);
        }
        assert!(r.waiting() <= PRUNE_AT_MIN, "{} waiters queued", r.waiting());
        r.advance(Ts(3), None);
        assert_eq!(poll_once(kept.as_mut()), Some(Ok(())), "the one still waiting is answered");
    }

    /// A waiter that queues tells whoever watches (`new_waiters`), and one answered on the
    /// fast path does not; the permit is kept when the watcher is not waiting yet.
    #[test]
    fn a_queued_waiter_is_told_to_the_watcher() {
        let r = Release::default();
        let told = r.new_waiters();
        r.advance(Ts(5), None);
        assert_eq!(poll_once(pin!(r.wait(Ts(5)))), Some(Ok(())));
        assert_eq!(poll_once(pin!(told.notified())), None, "an answered wait queues nothing");
        let mut w = pin!(r.wait(Ts(9)));
        assert_eq!(poll_once(w.as_mut()), None);
        assert_eq!(r.waiting(), 1);
        assert_eq!(poll_once(pin!(told.notified())), Some(()), "the queued waiter was told");
        r.advance(Ts(9), None);
        assert_eq!(poll_once(w.as_mut()), Some(Ok(())));
    }
}
