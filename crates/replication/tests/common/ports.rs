//! A listener below Linux's ephemeral port range, for tests that bind an address again
//! once its holder stopped. Shared with crates/ditto/tests/common (included there by
//! path: the two test crates have no module in common otherwise).

/// A listener on 127.0.0.1 at a port from 20000 to 31999, below Linux's ephemeral range
/// (32768 and up), for a primary whose address a test binds again once it stopped: a port
/// the kernel chose (`127.0.0.1:0`) may meanwhile become another test's connection's local
/// end, and the bind fail (seen in CI with real processes, 2026-12-06: "Address already in
/// use").
pub fn listener_below_the_ephemeral_range() -> std::net::TcpListener {
    // (Each call of a process starts elsewhere, so tests running at once do not try the
    // same ports in the same order.)
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut x = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        ^ ((std::process::id() as u64) << 32)
        ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for _ in 0..10_000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let port = 20_000 + ((x >> 33) % 12_000) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l;
        }
    }
    panic!("no free port from 20000 to 31999");
}
