//! A short time slice for the threads on a commit's path (docs/replication.md, "Short
//! time slices for the commit path").
//!
//! The log's flushers and disk threads, a primary's replication links and ack readers, and
//! a backup's receiver, persister and replay acker each sleep most of the time and hold up
//! commits (their release, a backup's lag) while they wait to run once woken. On a core
//! that the workers keep busy, Linux's fair scheduler let such a thread wait up to the
//! running worker's whole slice (0.75 ms times 1 + log2 of the CPUs: 1.4 ms on 2 CPUs,
//! 3.75 ms on 16) before it ran. Since Linux 6.12 a thread may ask for a shorter slice
//! (`sched_setattr`, `sched_runtime` under a fair policy, 0.1 to 100 ms, no privilege
//! needed), and a woken thread with a shorter slice than the running one preempts it
//! (the scheduler's `PREEMPT_SHORT`). Its share of the CPU is unchanged (its weight, its
//! nice value, is), only how soon it runs. Older kernels take the request and ignore it,
//! which `commit_thread` finds by reading it back.
//!
//! The setting is the process's (a server's `commit_thread_slice_us`, a benchmark's
//! flag), set before its log starts; threads ask for it as they start. Unset (a library
//! user, a test), nothing is asked.
//!
//! A primary's replication links and ack readers are a class of their own, with their own
//! setting (a server's `link_thread_slice_us`, 300 us unless set): each wake-up is a send
//! or an ack read of a few microseconds, so running them at once costs the workers little,
//! and a primary's view of its backups (its releases, the lag it reports) waits for them.
//! The log's flushers and disk threads are the ones whose promptness shrinks batches.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The shortest slice Linux takes (it clamps a shorter request to this).
pub const SLICE_MIN: Duration = Duration::from_micros(100);
/// The longest slice Linux takes.
pub const SLICE_MAX: Duration = Duration::from_millis(100);

/// A class of threads that ask for the same slice: the setting and what became of the
/// requests.
struct Class {
    /// The slice asked for, in ns; 0: none (the kernel's default).
    slice_ns: AtomicU64,
    /// Threads given the slice, threads whose kernel ignored it, threads refused it.
    given: AtomicU64,
    ignored: AtomicU64,
    refused: AtomicU64,
    /// What such a thread is, for the log.
    what: &'static str,
}

impl Class {
    const fn new(what: &'static str) -> Class {
        Class {
            slice_ns: AtomicU64::new(0),
            given: AtomicU64::new(0),
            ignored: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            what,
        }
    }

    fn set(&self, slice: Option<Duration>) {
        let ns = slice.map_or(0, |s| s.clamp(SLICE_MIN, SLICE_MAX).as_nanos() as u64);
        self.slice_ns.store(ns, Ordering::Relaxed);
    }

    fn slice(&self) -> Option<Duration> {
        match self.slice_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    fn counts(&self) -> SliceCounts {
        SliceCounts {
            given: self.given.load(Ordering::Relaxed),
            ignored: self.ignored.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    /// The calling thread asks for the class's slice, if one is set. A kernel that
    /// ignores or refuses it is said once per class, in the log; the thread runs on
    /// either way.
    fn join(&self) {
        let Some(slice) = self.slice() else { return };
        let outcome = request_slice(slice);
        let counter = match &outcome {
            Ok(true) => &self.given,
            Ok(false) => &self.ignored,
            Err(_) => &self.refused,
        };
        let first = self.ignored.load(Ordering::Relaxed) + self.refused.load(Ordering::Relaxed) == 0;
        counter.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(true) => {}
            Ok(false) if first => tracing::info!(
                "{} runs with the default time slice: this kernel ignores a thread's own \
                 (Linux 6.12 and later take it), or the thread runs under a real-time policy",
                self.what
            ),
            Err(e) if first => tracing::warn!("asking for a {slice:?} time slice for {}: {e}", self.what),
            _ => {}
        }
    }
}

/// The log's flushers and disk threads, a backup's receiver, persister and replay acker.
static COMMIT: Class = Class::new("a commit thread");
/// A primary's replication links and ack readers.
static LINK: Class = Class::new("a replication link's thread");

/// Sets the slice the commit path's threads ask for from now on (`None`: the kernel's
/// default). Threads already started keep theirs. A slice outside `SLICE_MIN..=SLICE_MAX`
/// is clamped, as the kernel would.
pub fn set_commit_thread_slice(slice: Option<Duration>) {
    COMMIT.set(slice);
}

/// The slice the commit path's threads ask for (`None`: the kernel's default).
pub fn commit_thread_slice() -> Option<Duration> {
    COMMIT.slice()
}

/// Sets the slice a primary's replication links and ack readers ask for from now on
/// (`None`: the kernel's default), as `set_commit_thread_slice` does for the commit path's.
pub fn set_link_thread_slice(slice: Option<Duration>) {
    LINK.set(slice);
}

/// The slice a primary's replication links and ack readers ask for.
pub fn link_thread_slice() -> Option<Duration> {
    LINK.slice()
}

/// How the requests went, for `INFO` and the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceCounts {
    /// Threads that run with the slice.
    pub given: u64,
    /// Threads whose kernel took the request and ignored it (before Linux 6.12).
    pub ignored: u64,
    /// Threads whose request failed (a seccomp filter, say).
    pub refused: u64,
}

/// The commit path's threads' requests.
pub fn slice_counts() -> SliceCounts {
    COMMIT.counts()
}

/// The replication links' and ack readers' requests.
pub fn link_slice_counts() -> SliceCounts {
    LINK.counts()
}

/// Called by a thread on a commit's path as it starts: asks for the process's slice, if
/// one is set. A kernel that ignores or refuses it is said once per process, in the log;
/// the thread runs on either way.
pub fn commit_thread() {
    COMMIT.join();
}

/// Called by a primary's replication link or ack reader as it starts: asks for the
/// process's link slice, if one is set, as `commit_thread` does.
pub fn link_thread() {
    LINK.join();
}

/// Linux's `struct sched_attr` (include/uapi/linux/sched/types.h), its first version.
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// The calling thread's scheduling attributes (`sched_getattr`).
fn get_attr() -> std::io::Result<SchedAttr> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: sched_getattr on the calling thread (pid 0) with a valid `sched_attr` of the
    // size given.
    if unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut SchedAttr, size, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr)
}

/// The slice a setting in us names: 0 is none (the kernel's default), else it must lie in
/// the kernel's range (`SLICE_MIN..=SLICE_MAX`). For the server's config and the benchmarks'
/// flag alike.
pub fn slice_from_us(us: u64) -> Result<Option<Duration>, String> {
    let slice = Duration::from_micros(us);
    match us {
        0 => Ok(None),
        _ if (SLICE_MIN..=SLICE_MAX).contains(&slice) => Ok(Some(slice)),
        _ => Err(format!(
            "must be 0 (the kernel's default) or between {} and {}",
            SLICE_MIN.as_micros(),
            SLICE_MAX.as_micros()
        )),
    }
}

/// Asks for `slice` for the calling thread, under its fair policy (`SCHED_OTHER`, or
/// `SCHED_BATCH` or `SCHED_IDLE` if someone set one) and at its nice value. True if the
/// kernel reads it back (so applies it), false if it took the request and ignored it. A
/// thread under a real-time policy is left as it is (false).
pub fn request_slice(slice: Duration) -> std::io::Result<bool> {
    let ns = slice.clamp(SLICE_MIN, SLICE_MAX).as_nanos() as u64;
    let now = get_attr()?;
    let fair = [libc::SCHED_OTHER, libc::SCHED_BATCH, libc::SCHED_IDLE].map(|p| p as u32);
    if !fair.contains(&now.policy) {
        return Ok(false);
    }
    let size = std::mem::size_of::<SchedAttr>() as u32;
    let want = SchedAttr { size, policy: now.policy, nice: now.nice, runtime: ns, ..Default::default() };
    // SAFETY: sched_setattr on the calling thread (pid 0) with a valid `sched_attr`.
    if unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &want as *const SchedAttr, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(get_attr()?.runtime == ns)
}

/// Whether this kernel takes a thread's own slice (Linux 6.12 or later), from its release.
pub fn kernel_takes_slices() -> bool {
    let Ok(r) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else { return false };
    let mut parts = r.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a thread of its own: the slice sticks to the thread.
    fn on_a_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().unwrap()
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_where_the_kernel_takes_it() {
        let (took, readback) = on_a_thread(|| {
            let took = request_slice(Duration::from_micros(300)).expect("sched_setattr");
            (took, get_attr().unwrap().runtime)
        });
        assert_eq!(took, kernel_takes_slices(), "the kernel's release says whether it takes a slice");
        if took {
            assert_eq!(readback, 300_000);
        }
        // Out of the kernel's range: clamped, as the kernel would.
        let (short, long) = on_a_thread(|| {
            let short = (request_slice(Duration::from_micros(5)).unwrap(), get_attr().unwrap().runtime);
            let long = (request_slice(Duration::from_secs(5)).unwrap(), get_attr().unwrap().runtime);
            (short, long)
        });
        if kernel_takes_slices() {
            assert_eq!(short, (true, 100_000));
            assert_eq!(long, (true, 100_000_000));
        }
    }

    #[test]
    fn a_setting_in_us_is_none_or_in_the_kernels_range() {
        assert_eq!(slice_from_us(0), Ok(None));
        assert_eq!(slice_from_us(100), Ok(Some(SLICE_MIN)));
        assert_eq!(slice_from_us(100_000), Ok(Some(SLICE_MAX)));
        for bad in [1, 99, 100_001, u64::MAX] {
            assert!(slice_from_us(bad).unwrap_err().contains("between 100 and 100000"), "{bad}");
        }
    }

    /// A thread someone put under `SCHED_BATCH` stays there, with the slice.
    #[test]
    fn a_batch_threads_policy_is_kept() {
        let (policy, took, runtime) = on_a_thread(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: sched_setscheduler on the calling thread.
            assert_eq!(unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) }, 0);
            let took = request_slice(Duration::from_micros(400)).unwrap();
            let back = get_attr().unwrap();
            (back.policy, took, back.runtime)
        });
        assert_eq!(policy, libc::SCHED_BATCH as u32);
        assert_eq!(took, kernel_takes_slices());
        if took {
            assert_eq!(runtime, 400_000);
        }
    }

    #[test]
    fn the_nice_value_is_kept() {
        let (before, after) = on_a_thread(|| {
            // SAFETY: setpriority/getpriority on the calling thread.
            unsafe {
                assert_eq!(libc::setpriority(libc::PRIO_PROCESS, 0, 5), 0);
                let before = libc::getpriority(libc::PRIO_PROCESS, 0);
                request_slice(Duration::from_micros(200)).unwrap();
                (before, libc::getpriority(libc::PRIO_PROCESS, 0))
            }
        });
        assert_eq!((before, after), (5, 5));
    }
}
