//! Used memory and `maxmemory`
//! ===========================
//! An in-memory database must not let its clients grow it until the kernel kills it. Like
//! Redis with `maxmemory-policy noeviction`, the server refuses the commands that may grow
//! the data (SET, HSET, INCR, APPEND, ...) with `-OOM` while the memory in use is over
//! `maxmemory`; reads, deletes and FLUSHDB still run, so a client can make room.
//!
//! The memory in use is what the binary's counting allocator reports
//! (`ditto_engine::alloc::Counting`, re-exported here): the bytes allocated and not freed,
//! exact to within 256 KiB per thread.

use std::sync::atomic::AtomicU64;

pub use ditto_engine::alloc::{allocated_bytes, Counting};

/// The server's memory limit: `max` bytes (0: none) against the gauge `used`.
pub struct MemoryLimit {
    pub max: u64,
    pub used: fn() -> u64,
    /// Commands refused for it (INFO's `oom_rejections`, the metrics).
    pub rejections: AtomicU64,
}

/// The error Redis answers a command that may grow the data while over `maxmemory`.
pub const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

impl MemoryLimit {
    pub fn none() -> MemoryLimit {
        MemoryLimit { max: 0, used: allocated_bytes, rejections: AtomicU64::new(0) }
    }

    /// Whether commands that may grow the data are refused now.
    pub fn over(&self) -> bool {
        self.max != 0 && (self.used)() > self.max
    }
}

/// Redis's memory units: `1k` is 1,000 bytes and `1kb` 1,024 (m, mb, g, gb likewise), any
/// case; a bare number is bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let mul: u64 = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// Bytes as Redis's INFO writes them (`used_memory_human`): `1.50M`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.2}{}", UNITS[u])
    }
}

/// The memory this process may use: the machine's (`MemTotal`), or its cgroup's limit
/// (v2 `memory.max`) where that is lower. `None` if neither can be read.
pub fn physical_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| {
        let path = c.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
        let max = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.max", path.trim_end_matches('/'))).ok()?;
        max.trim().parse::<u64>().ok()
    });
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// The resident size of this process (`/proc/self/statm`), bytes.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn sizes_parse_in_redis_units() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("12345"), Some(12345));
        assert_eq!(parse_size("1k"), Some(1000));
        assert_eq!(parse_size("1KB"), Some(1024));
        assert_eq!(parse_size("64mb"), Some(64 << 20));
        assert_eq!(parse_size("2g"), Some(2_000_000_000));
        assert_eq!(parse_size("3Gb"), Some(3 << 30));
        for bad in ["", "mb", "1.5gb", "-1", "1tb", "1 gb x", "99999999999999999999gb"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn human_sizes_read_as_redis_writes_them() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(1536), "1.50K");
        assert_eq!(human(64 << 20), "64.00M");
        assert_eq!(human(3 << 30), "3.00G");
    }

    #[test]
    fn the_limit_refuses_only_over_a_set_maximum() {
        static USED: AtomicU64 = AtomicU64::new(0);
        let used = || USED.load(Ordering::Relaxed);
        let mut l = MemoryLimit { max: 0, used, rejections: AtomicU64::new(0) };
        USED.store(u64::MAX, Ordering::Relaxed);
        assert!(!l.over(), "0 is no limit");
        l.max = 1000;
        USED.store(1000, Ordering::Relaxed);
        assert!(!l.over(), "at the limit is not over it");
        USED.store(1001, Ordering::Relaxed);
        assert!(l.over());
    }

    #[test]
    fn physical_memory_is_read_here() {
        let m = physical_memory().expect("Linux has /proc/meminfo");
        assert!(m > 64 << 20, "{m}");
        assert!(resident_bytes().is_some_and(|r| r > 0));
    }
}
