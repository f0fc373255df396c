//! Connections a port accepted whose hello has not been read yet, bounded in number so
//! that silent ones cannot lock the port's real peers out: the replication port's
//! (`Primary`) and a cluster node's control port (`ditto_cluster::service`).
//!
//! Past the bound the **oldest** is closed, not the newest: a real peer says its hello
//! within milliseconds, so silent connections keep it out only by coming faster than
//! that; and one address's connections past its own bound close its own oldest, so that
//! one host's flood crowds out only itself (refusing the newest, as the control port did
//! until 2026-12-06, let 64 silent connections from anywhere keep every member's
//! reconnection out, again and again, for as long as they were renewed; found by a review).

use std::collections::VecDeque;
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// The connections whose hello has not been read yet, oldest first, each with a handle
/// to close it by.
pub struct Unhelloed {
    /// Most connections waiting, in all.
    max: usize,
    /// Most of them from one address.
    per_address_max: usize,
    next: AtomicU64,
    /// Each with its peer's address (`None`: unknown), as `source` groups it.
    waiting: Mutex<VecDeque<(u64, Option<IpAddr>, TcpStream)>>,
}

/// The source a connection is counted under: its IPv4 address, or its IPv6 address's /64
/// (a host is given a /64 to choose from: counted by address, one host could fill the
/// bound in all by itself; found by a review, 2026-12-06). An IPv4 address mapped into
/// IPv6 counts as itself.
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
        v4 => v4,
    }
}

impl Unhelloed {
    pub fn new(max: usize, per_address_max: usize) -> Unhelloed {
        assert!(per_address_max >= 1 && per_address_max <= max, "bounds {per_address_max} of {max}");
        Unhelloed { max, per_address_max, next: AtomicU64::new(0), waiting: Mutex::new(VecDeque::new()) }
    }

    /// A place for `s`, and the connection to close to make room, if one must go: the
    /// oldest of its own address's once that address has `per_address_max` waiting, else
    /// the oldest of all once `max` wait.
    pub fn take(this: &Arc<Unhelloed>, s: &TcpStream) -> (HelloSlot, Option<TcpStream>) {
        let id = this.next.fetch_add(1, Ordering::Relaxed);
        let ip = s.peer_addr().ok().map(|a| source(a.ip()));
        let mut w = this.waiting.lock();
        let own = w.iter().filter(|(_, a, _)| ip.is_some() && *a == ip).count();
        let evicted = if own >= this.per_address_max {
            w.iter().position(|(_, a, _)| *a == ip).and_then(|i| w.remove(i)).map(|(_, _, s)| s)
        } else if w.len() >= this.max {
            w.pop_front().map(|(_, _, s)| s)
        } else {
            None
        };
        // (A handle that cannot be had leaves it uncounted: it is still bounded in time.)
        if let Ok(h) = s.try_clone() {
            w.push_back((id, ip, h));
        }
        (HelloSlot(Arc::clone(this), id), evicted)
    }

    /// How many wait now (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting.lock().len()
    }
}

/// A connection's place among the `Unhelloed`, given back when dropped (its hello read,
/// or its thread's end).
pub struct HelloSlot(Arc<Unhelloed>, u64);

impl Drop for HelloSlot {
    fn drop(&mut self) {
        self.0.waiting.lock().retain(|(id, _, _)| *id != self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Connections from `from` (a loopback address) to `to`, and the accepted ends.
    fn conns(l: &TcpListener, from: &str, n: usize) -> Vec<(TcpStream, TcpStream)> {
        let to = l.local_addr().unwrap();
        (0..n)
            .map(|_| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
                s.bind(&format!("{from}:0").parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
                s.connect(&to.into()).unwrap();
                (s.into(), l.accept().unwrap().0)
            })
            .collect()
    }

    /// An IPv6 host counts as its /64; an IPv4 address, mapped or not, as itself.
    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_64() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(source(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")), ip("2001:db8:1:2::"));
        assert_eq!(source(ip("2001:db8:1:2::1")), source(ip("2001:db8:1:2:ffff::9")));
        assert_ne!(source(ip("2001:db8:1:2::1")), source(ip("2001:db8:1:3::1")));
        assert_eq!(source(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(source(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
    }

    /// One address past its own bound closes its own oldest; past the bound in all, the
    /// oldest of all goes; a slot dropped makes room again.
    #[test]
    fn the_oldest_goes_first_and_an_address_crowds_out_only_its_own() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let u = Arc::new(Unhelloed::new(6, 3));
        let port = |s: &TcpStream| s.peer_addr().unwrap().port();
        let a = conns(&l, "127.0.0.2", 3);
        let mut slots: Vec<HelloSlot> = Vec::new();
        for (_, acc) in &a {
            let (slot, evicted) = Unhelloed::take(&u, acc);
            assert!(evicted.is_none());
            slots.push(slot);
        }
        // A fourth of the same address: its own oldest goes.
        let a4 = conns(&l, "127.0.0.2", 1);
        let (slot, evicted) = Unhelloed::take(&u, &a4[0].1);
        assert_eq!(evicted.map(|s| port(&s)), Some(port(&a[0].1)));
        slots.push(slot);
        // Three of another address fill the bound in all (6); a seventh, of a third
        // address, closes the oldest of all: the first address's second.
        let b = conns(&l, "127.0.0.3", 3);
        for (_, acc) in &b {
            let (slot, evicted) = Unhelloed::take(&u, acc);
            assert!(evicted.is_none());
            slots.push(slot);
        }
        assert_eq!(u.len(), 6);
        let c = conns(&l, "127.0.0.4", 1);
        let (slot, evicted) = Unhelloed::take(&u, &c[0].1);
        assert_eq!(evicted.map(|s| port(&s)), Some(port(&a[1].1)));
        slots.push(slot);
        // Hellos read: places given back, nothing more closed.
        slots.clear();
        assert_eq!(u.len(), 0);
        let (_slot, evicted) = Unhelloed::take(&u, &c[0].1);
        assert!(evicted.is_none());
    }
}
