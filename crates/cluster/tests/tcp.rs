//! Three control nodes over real TCP on loopback, each on real files: they elect a leader,
//! commit, lose the leader, elect another and commit again, and the stopped node comes
//! back from its file and catches up. Every wait is bounded.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use ditto_cluster::{Command, ControlService, Member, NodeId, ServiceConfig, Status, Timing};

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Cluster {
    dirs: tempfile::TempDir,
    peers: BTreeMap<NodeId, std::net::SocketAddr>,
    listeners: BTreeMap<NodeId, TcpListener>,
    nodes: BTreeMap<NodeId, ControlService>,
}

impl Cluster {
    fn new(n: u64) -> Cluster {
        let listeners: BTreeMap<NodeId, TcpListener> =
            (1..=n).map(|id| (id, TcpListener::bind("127.0.0.1:0").unwrap())).collect();
        let peers = listeners.iter().map(|(&id, l)| (id, l.local_addr().unwrap())).collect();
        Cluster { dirs: tempfile::tempdir().unwrap(), peers, listeners, nodes: BTreeMap::new() }
    }

    fn config(&self, id: NodeId, dir: &Path) -> ServiceConfig {
        ServiceConfig {
            id,
            peers: self.peers.clone(),
            dir: dir.join(format!("node{id}")),
            tick: Duration::from_millis(10),
            timing: Timing { election: 10, heartbeat: 2, fixed_election: None },
        }
    }

    fn start(&mut self, id: NodeId) {
        let l = match self.listeners.remove(&id) {
            Some(l) => l,
            // A restart binds the same port again (nothing else took it on loopback).
            None => TcpListener::bind(self.peers[&id]).unwrap(),
        };
        let cfg = self.config(id, self.dirs.path());
        self.nodes.insert(id, ControlService::start(cfg, l).unwrap());
    }

    fn statuses(&self) -> Vec<Status> {
        self.nodes.values().map(|n| n.status()).collect()
    }

    /// The leader every running node agrees on.
    fn leader(&self) -> Option<NodeId> {
        let s = self.statuses();
        let l = s[0].leader?;
        (self.nodes.contains_key(&l) && s.iter().all(|x| x.leader == Some(l))).then_some(l)
    }
}

#[test]
fn three_nodes_elect_commit_fail_over_and_a_restarted_node_catches_up() {
    let mut c = Cluster::new(3);
    for id in 1..=3 {
        c.start(id);
    }
    wait_for("a leader all three agree on", Duration::from_secs(10), || c.leader().is_some());
    let first = c.leader().unwrap();
    let members: Vec<Member> = (1..=3).map(|id| Member { id, addr: format!("127.0.0.1:{}", 7000 + id) }).collect();
    c.nodes[&first].propose(Command::Bootstrap { members, primary: first, policy: "majority".into() }).unwrap();
    wait_for("every node to apply the bootstrap", Duration::from_secs(10), || {
        c.statuses().iter().all(|s| s.state.epoch == 1 && s.state.primary() == Some(first))
    });
    // A follower refuses proposals and names the leader.
    let follower = (1..=3).find(|&id| id != first).unwrap();
    let err = c.nodes[&follower].propose(Command::SetPolicy { policy: "all".into() }).unwrap_err();
    assert!(err.contains("not the control plane's leader"), "{err}");

    // The leader stops (its disk stays); the other two elect another and commit.
    c.nodes.remove(&first).unwrap().stop();
    wait_for("a new leader among the two left", Duration::from_secs(10), || c.leader().is_some_and(|l| l != first));
    let second = c.leader().unwrap();
    c.nodes[&second]
        .propose(Command::BeginFailover { epoch: 2, reason: "the test stopped the leader".into() })
        .unwrap();
    wait_for("both to apply epoch 2", Duration::from_secs(10), || c.statuses().iter().all(|s| s.state.epoch == 2));
    let term = c.nodes[&second].status().term;

    // The stopped node restarts from its file and catches up without disturbing the
    // leader (pre-vote: it cannot win an election the others would not hold).
    c.start(first);
    wait_for("the restarted node to catch up", Duration::from_secs(10), || {
        let s = c.nodes[&first].status();
        s.state.epoch == 2 && s.leader == Some(second)
    });
    assert_eq!(c.nodes[&second].status().term, term, "the restarted node did not force a new term");
    let states: Vec<_> = c.statuses().into_iter().map(|s| s.state).collect();
    assert!(states.windows(2).all(|w| w[0] == w[1]), "every node holds the same state: {states:?}");
    assert!(c.statuses().iter().all(|s| s.failed.is_none()));
}

#[test]
fn garbage_on_the_control_port_drops_that_connection_and_nothing_else() {
    let mut c = Cluster::new(3);
    for id in 1..=3 {
        c.start(id);
    }
    wait_for("a leader", Duration::from_secs(10), || c.leader().is_some());
    let target = c.peers[&c.leader().unwrap()];
    // An HTTP request (a length out of bounds), 0xff bytes, and a frame whose checksum is
    // wrong.
    let bad_crc = [&[9u8, 0, 0, 0, 1, 2, 3, 4][..], &[1, 0, 0, 0, 0, 0, 0, 0, 1][..]].concat();
    for junk in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0xffu8; 64][..], &bad_crc[..]] {
        let mut s = std::net::TcpStream::connect(target).unwrap();
        use std::io::{Read, Write};
        s.write_all(junk).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        // The node closes the connection (EOF or reset) without answering; a read that
        // times out would mean it kept the connection open.
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("junk {junk:?}: {other:?}"),
        }
    }
    let leader = c.leader().unwrap();
    let members: Vec<Member> = (1..=3).map(|id| Member { id, addr: String::new() }).collect();
    c.nodes[&leader].propose(Command::Bootstrap { members, primary: leader, policy: "local".into() }).unwrap();
    wait_for("the group still commits", Duration::from_secs(10), || c.statuses().iter().all(|s| s.state.epoch == 1));
}
