//! Replay's CPU, read by whoever asks
//! ==================================
//! A backup's replay CPU (`ditto_replay_cpu_ms` in its metrics, and through them the
//! benchmarks' `replay_cost_ratio`) is its replay threads' own CPU time. Until 2026-12-06
//! each replay thread read its clock itself, once a batch: on Linux
//! `CLOCK_THREAD_CPUTIME_ID` is a system call, not a vDSO read (1.1 us on the 2-core VM,
//! against 28 ns for `CLOCK_MONOTONIC`), and a TPC-C batch of about 1.5 transactions
//! costs a replayer about 10 us, so a tenth of what replay was measured to cost was the
//! measuring. Now each thread registers its clock once (`pthread_getcpuclockid`), and
//! whoever wants the figure reads every registered thread's clock (`ThreadCpu::total_ns`,
//! a few system calls per metrics scrape); a thread adds its last reading as it ends.
//!
//! The total only grows: a thread's reading moves to the ended sum, under the lock that
//! readers take, when its registration is dropped (on the thread, before it exits, so its
//! clock is never read once it is gone, and a live registered thread's clock always reads).

use std::marker::PhantomData;
use std::sync::Arc;

use parking_lot::Mutex;

/// The CPU time of a set of threads since each registered (`count_this_thread`).
#[derive(Default)]
pub struct ThreadCpu {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Registered threads that have not ended: (registration, clock, its reading then).
    live: Vec<(u64, libc::clockid_t, u64)>,
    /// What the threads that ended used, from their registration to their end.
    ended_ns: u64,
    next: u64,
}

/// A thread's registration: dropped on that thread (it is not `Send`), it adds the
/// thread's last reading to the ended sum.
pub struct Counted {
    meter: Arc<ThreadCpu>,
    id: u64,
    start_ns: u64,
    _on_this_thread: PhantomData<*const ()>,
}

impl std::fmt::Debug for ThreadCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadCpu").field("total_ns", &self.total_ns()).finish()
    }
}

impl ThreadCpu {
    /// Counts the calling thread's CPU from now until the returned registration is
    /// dropped.
    pub fn count_this_thread(self: &Arc<Self>) -> Counted {
        let start_ns = ditto_log::thread_cpu_ns();
        let mut clock: libc::clockid_t = 0;
        // SAFETY: `pthread_self` names the calling thread, alive for the call; the call
        // writes only `clock`.
        let rc = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) };
        let mut g = self.inner.lock();
        let id = g.next;
        g.next += 1;
        if rc == 0 {
            g.live.push((id, clock, start_ns));
        } else {
            // (Not seen on Linux for a live thread.) Its CPU then counts when it ends.
            tracing::warn!("a replay thread's CPU clock cannot be read from other threads (error {rc}): its CPU counts when it ends");
        }
        Counted { meter: Arc::clone(self), id, start_ns, _on_this_thread: PhantomData }
    }

    /// Every registered thread's CPU since it registered, ended ones' included.
    pub fn total_ns(&self) -> u64 {
        let g = self.inner.lock();
        // (A clock that cannot be read counts 0: never a live registered thread's.)
        let now = |clock| ditto_log::clock_ns(clock).unwrap_or(0);
        g.ended_ns + g.live.iter().map(|&(_, clock, start)| now(clock).saturating_sub(start)).sum::<u64>()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        // Read under the lock: a reader in between would count this thread's clock past
        // what is added here, and the total would step back.
        let mut g = self.meter.inner.lock();
        let used = ditto_log::thread_cpu_ns().saturating_sub(self.start_ns);
        g.live.retain(|l| l.0 != self.id);
        g.ended_ns += used;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Burns about `ms` of this thread's CPU.
    fn spin(ms: u64) {
        let t0 = ditto_log::thread_cpu_ns();
        let mut x = 0u64;
        while ditto_log::thread_cpu_ns() - t0 < ms * 1_000_000 {
            for i in 0..1000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
    }

    #[test]
    fn a_threads_cpu_is_read_from_another_thread_while_it_runs_and_kept_when_it_ends() {
        let meter = Arc::new(ThreadCpu::default());
        assert_eq!(meter.total_ns(), 0);
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (spun_tx, spun_rx) = std::sync::mpsc::channel::<()>();
        let m = Arc::clone(&meter);
        let t = std::thread::spawn(move || {
            let _c = m.count_this_thread();
            spin(30);
            spun_tx.send(()).unwrap();
            go_rx.recv().unwrap(); // blocked: no CPU
            spin(20);
        });
        spun_rx.recv().unwrap();
        let mid = meter.total_ns();
        // Its 30 ms read from here, while it waits (a little more for its own set-up).
        assert!((30_000_000..200_000_000).contains(&mid), "{mid} ns");
        // Idle, it adds nothing (a few microseconds for waking up, at most).
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(meter.total_ns() - mid < 5_000_000);
        go_tx.send(()).unwrap();
        t.join().unwrap();
        let end = meter.total_ns();
        assert!(end >= mid + 20_000_000 && end < mid + 200_000_000, "{mid} then {end}");
        assert!(meter.inner.lock().live.is_empty());
        // This thread's CPU is not counted: it never registered.
        spin(20);
        assert_eq!(meter.total_ns(), end);
    }
}
