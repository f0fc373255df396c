//! Pre-faulting the heap before a measured run (`ditto bench --prefault`).
//!
//! A TPC-C run grows the heap all the time (every NewOrder inserts a dozen rows), and the
//! first write to each new page of it is a page fault that zeroes the page. On a virtual
//! machine that fault also goes to the host, which has to back the page first: on the
//! project's 2-core VM, first touches run at 0.6-3 GB/s, and `clear_page_erms` under
//! mimalloc's `mi_page_free_list_extend` was 20% of a TPC-C worker's samples, with the log
//! on or off (docs/results.md, sixteenth session). Silo, whose figures the TPC-C targets
//! quote, pre-faults its memory pools before it measures; this does the same for ditto:
//!
//! 1. mimalloc is told never to purge (return freed memory to the OS), so what is touched
//!    here stays resident and touched;
//! 2. `threads` threads each allocate their share in 1 MiB blocks, write one byte to every
//!    4 KiB page of each, and free them all. mimalloc puts the freed blocks' memory back in
//!    its arenas, and the run's pages are carved out of it, already faulted in. (Where
//!    the kernel backs mimalloc's arenas with transparent huge pages, as on the project's
//!    VM, mimalloc's own write to a block's header already faults in the 2 MiB around it:
//!    a test without the loop saw 106 MiB of `AnonHugePages` for 128 MiB allocated. The
//!    loop is what covers every page where pages are 4 KiB.)
//!
//! The process keeps that memory until it exits (the purge stays off), which is what a
//! benchmark process wants and why this is not done for the server.
//!
//! And turning transparent huge pages off for a cluster node's supervisor process
//! (`thp_off_for_the_node`).

use std::time::{Duration, Instant};

/// mimalloc's `mi_option_purge_delay` (milliseconds; -1 = never purge). The Rust bindings
/// do not name it, so its index in mimalloc 3's `mi_option_t` is written here, for the
/// `libmimalloc-sys` version pinned in the workspace; a test checks that this index is the
/// option `MIMALLOC_PURGE_DELAY` sets.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

const BLOCK: usize = 1 << 20;
const PAGE: usize = 4096;

/// How much to pre-fault: `auto` (an estimate from the run's workers and seconds), `off`,
/// or a number of MiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Prefault {
    Auto,
    Off,
    Mib(u64),
}

impl std::str::FromStr for Prefault {
    type Err = String;
    fn from_str(s: &str) -> Result<Prefault, String> {
        match s {
            "auto" => Ok(Prefault::Auto),
            "off" | "0" => Ok(Prefault::Off),
            n => n
                .parse::<u64>()
                .map(Prefault::Mib)
                .map_err(|_| format!("--prefault takes auto, off or a number of MiB, not {n:?}")),
        }
    }
}

/// `auto`'s estimate of what a run grows the heap by, per worker and second of run: TPC-C
/// grew it by 1.8 KB per transaction (RSS sampled during a 1-worker run at 50k tps, 90 MB/s),
/// so this covers about 140k transactions per worker-second.
pub const AUTO_MIB_PER_WORKER_SECOND: u64 = 256;

impl Prefault {
    /// The MiB to pre-fault for a run of `workers` for `seconds`: `auto` is capped at a
    /// quarter of the memory the kernel says is available.
    pub fn mib(self, workers: usize, seconds: f64) -> u64 {
        match self {
            Prefault::Off => 0,
            Prefault::Mib(n) => n,
            Prefault::Auto => {
                let want = (AUTO_MIB_PER_WORKER_SECOND as f64 * workers as f64 * seconds).ceil() as u64;
                match available_mib() {
                    Some(avail) => want.min(avail / 4),
                    None => want,
                }
            }
        }
    }
}

impl Prefault {
    /// Refuses an amount over half the memory the kernel says is available now: the load
    /// and the run need the rest, and touching more ends in the OOM killer, not an error.
    pub fn check(self) -> Result<(), String> {
        match (self, available_mib()) {
            (Prefault::Mib(n), Some(avail)) if n > avail / 2 => Err(format!(
                "--prefault {n} MiB is more than half the memory available ({avail} MiB); \
                 the load and the run need the rest (auto stays under a quarter)"
            )),
            _ => Ok(()),
        }
    }
}

/// What `prefault` did.
#[derive(Debug, Clone, Copy)]
pub struct Prefaulted {
    pub mib: u64,
    pub took: Duration,
}

/// Turns mimalloc's purging off for the rest of the process and pre-faults `mib` MiB of
/// heap on `threads` threads (see the module notes).
pub fn prefault(mib: u64, threads: usize) -> Prefaulted {
    let t0 = Instant::now();
    if mib == 0 {
        return Prefaulted { mib, took: t0.elapsed() };
    }
    // SAFETY: sets one of mimalloc's options, which it reads when it decides to purge.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    let threads = threads.max(1) as u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let share = mib / threads + u64::from(t < mib % threads);
            s.spawn(move || {
                let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(share as usize);
                for _ in 0..share {
                    // Uninitialised capacity, so that the loop below is the first touch.
                    let mut b: Vec<u8> = Vec::with_capacity(BLOCK);
                    let p = b.as_mut_ptr();
                    for off in (0..BLOCK).step_by(PAGE) {
                        // SAFETY: `off < BLOCK`, within the allocation; the byte is never read.
                        unsafe { p.add(off).write_volatile(1) };
                    }
                    blocks.push(b);
                }
            });
        }
    });
    Prefaulted { mib, took: t0.elapsed() }
}

/// Whether this process turned transparent huge pages off (`thp_off_for_the_node`).
static THP_TURNED_OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `prctl(option, arg, 0, 0, 0)`.
fn prctl(option: libc::c_int, arg: u64) -> libc::c_int {
    // SAFETY: prctl with integer arguments only (the THP options change no memory of this
    // process).
    unsafe { libc::prctl(option, arg as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) }
}

/// `prctl(PR_SET_THP_DISABLE, off)`.
fn set_thp_disable(off: bool) -> Result<(), String> {
    match prctl(libc::PR_SET_THP_DISABLE, u64::from(off)) {
        0 => Ok(()),
        _ => Err(format!("prctl(PR_SET_THP_DISABLE, {}): {}", u8::from(off), std::io::Error::last_os_error())),
    }
}

/// Turns transparent huge pages off for a cluster node's own process (its supervisor:
/// `prctl(PR_SET_THP_DISABLE)`), where they were on; the servers it starts turn them on
/// again (`--thp-back`, `thp_back`: the kernel's flag is inherited across fork and exec).
/// A failure is a warning: the node runs on.
///
/// mimalloc asks for huge pages on its arenas (`madvise(MADV_HUGEPAGE)`), so even where the
/// kernel's setting is `madvise` a thread's first touch of a fresh 2 MiB of heap zeroes all
/// of it in one page fault. On the project's 2-core VM, whose host backs a guest's fresh
/// memory as it is first touched, such a fault stalled a failover's report (read on a
/// thread of the node) by 30-90 ms in about one failover in six (`perf`: every sample of
/// the report's thread in `clear_page_erms` under `do_huge_pmd_anonymous_page`). The node's
/// heap is small and gains nothing from huge pages. A server's does: a backup replaying
/// TPC-C without them cost 0.30-0.33 of execution against 0.23-0.27, its lag p99 25-31 ms
/// against 5-21 (docs/cluster.md, "Reports read ahead").
pub fn thp_off_for_the_node() {
    match prctl(libc::PR_GET_THP_DISABLE, 0) {
        // (Off already, set so by whoever started the node: its servers keep that.)
        1.. => {}
        0 => match set_thp_disable(true) {
            Ok(()) => THP_TURNED_OFF.store(true, std::sync::atomic::Ordering::Release),
            Err(e) => tracing::warn!("turning transparent huge pages off for the node: {e}"),
        },
        _ => tracing::warn!(
            "transparent huge pages stay as they are for the node: prctl(PR_GET_THP_DISABLE): {}",
            std::io::Error::last_os_error()
        ),
    }
}

/// Whether `thp_off_for_the_node` turned them off (its servers are then told `--thp-back`).
pub fn node_turned_thp_off() -> bool {
    THP_TURNED_OFF.load(std::sync::atomic::Ordering::Acquire)
}

/// A server started by a node that turned transparent huge pages off (`--thp-back`) turns
/// them on again for itself. A failure is a warning: the server runs on without them.
pub fn thp_back() {
    if let Err(e) = set_thp_disable(false) {
        tracing::warn!("turning transparent huge pages on again for the server its node started: {e}");
    }
}

/// `MemAvailable` from /proc/meminfo, in MiB.
fn available_mib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!("auto".parse::<Prefault>(), Ok(Prefault::Auto));
        assert_eq!("off".parse::<Prefault>(), Ok(Prefault::Off));
        assert_eq!("0".parse::<Prefault>(), Ok(Prefault::Off));
        assert_eq!("512".parse::<Prefault>(), Ok(Prefault::Mib(512)));
        let e = "2g".parse::<Prefault>().unwrap_err();
        assert!(e.contains("auto, off or a number of MiB"), "{e}");
        assert_eq!(Prefault::Mib(7).mib(4, 100.0), 7);
        assert_eq!(Prefault::Off.mib(4, 100.0), 0);
        let auto = Prefault::Auto.mib(1, 1.0);
        assert!(auto <= AUTO_MIB_PER_WORKER_SECOND, "{auto}");
        assert!(auto > 0, "a machine running tests has some memory available");
    }

    /// Runs the test `name` (of this module) again, alone, in a child process of this test
    /// binary with `CHILD_ENV` and `env` set, and fails if it fails there. For what needs
    /// a process of its own: mimalloc reads its options when a process starts, and the
    /// process's resident size moves with whatever the other tests do.
    fn in_child(name: &str, env: &[(&str, &str)]) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &format!("memory::tests::{name}"), "--nocapture", "--test-threads", "1"])
            .env(CHILD_ENV, "1")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed:\n{text}{}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("1 passed"), "the child did not run the test:\n{text}");
    }

    const CHILD_ENV: &str = "DITTO_TEST_MEMORY_CHILD";

    fn is_child() -> bool {
        std::env::var_os(CHILD_ENV).is_some()
    }

    /// The index written in `MI_OPTION_PURGE_DELAY` is the option `MIMALLOC_PURGE_DELAY`
    /// sets: the child, started with that variable set, reads the option by index.
    #[test]
    fn purge_delay_index_is_mimallocs() {
        if !is_child() {
            return in_child("purge_delay_index_is_mimallocs", &[("MIMALLOC_PURGE_DELAY", "4321")]);
        }
        // SAFETY: reads one of mimalloc's options.
        let read = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(read, 4321, "MIMALLOC_PURGE_DELAY=4321 did not set option {MI_OPTION_PURGE_DELAY}");
    }

    /// The pre-faulted memory is resident after it is freed, and mimalloc's purge is off,
    /// so it stays so (a purge comes later, when mimalloc next collects: the resident size
    /// right after cannot show it, the option can). In a child process: beside other
    /// tests, the resident size also moves with their frees (CI once saw 98 MiB gained for
    /// 128), and purging stays on for them. Alone, the gain for 128 MiB still varied from
    /// 104 to 136 MiB over 40 runs, so the bound is half. (With transparent huge pages it
    /// holds even without the touching loop: see the module notes.)
    #[test]
    fn prefaulted_memory_stays_resident() {
        if !is_child() {
            return in_child("prefaulted_memory_stays_resident", &[]);
        }
        let rss = || {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
            (statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * PAGE as u64) >> 20
        };
        let before = rss();
        assert_eq!(prefault(128, 2).mib, 128);
        // SAFETY: reads one of mimalloc's options.
        let purge = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(purge, -1, "mimalloc would hand the pre-faulted memory back after its purge delay");
        let after = rss();
        assert!(after >= before + 64, "resident {before} MiB before, {after} MiB after pre-faulting 128 MiB");
        assert_eq!(prefault(0, 2).mib, 0);
    }
}
