//! Running a control node: a timer, TCP between the members, the file on disk
//! ==========================================================================
//! [`ControlService`] drives one [`ControlNode`] on threads of its own (the server's
//! tokio runtime is not involved, as with replication's links):
//!
//! ```text
//!  acceptor --conn--> reader (one per inbound connection) --+
//!                                                           v
//!  node thread: tick every `tick`, step what arrives, propose, poll (FileDisk, fsync)
//!           |  publishes Status                             |
//!           v                                               v
//!  sender (one per peer: connects, reconnects, drops what it cannot send: Raft retries)
//! ```
//!
//! The node thread also runs the node's [`Coordinator`] (it acts on the Raft leader) and
//! talks to the node's [`DataPlane`] (log shipping and replay, which the server provides):
//! what the data plane heard feeds the failure detector; a request for a tail report makes
//! the fence durable (`FileDisk::set_fence`) before the data plane reports; a plan is
//! handed to the chosen node's data plane to prepare; every committed command is handed
//! to the data plane to act on.
//!
//! Frames on the wire: `len u32 LE | crc32c u32 LE (of the rest) | from u64 LE | kind u8 |
//! body`, kind 1 a Raft message (protobuf), kind 2 a coordinator's request or its answer
//! ([`Ctl`], JSON), kind 3 the batches a fetch asked for, kind 4 an operator's request
//! ([`AdminRequest`], JSON; `ditto cluster add|remove`), answered on the same connection
//! with an [`AdminReply`] once the change has been applied (or refused), kind 5 the hello
//! that opens every connection both ways: each side's proof that it holds the cluster
//! secret (never the secret itself), and the answer (taken, or why not; docs/cluster.md,
//! "The cluster secret").
//!
//! The peers are the members the control state names, from the bootstrap on (before it,
//! those the node was started with), each reached at the address the node was started
//! with, or for a member added since, at the address it was added with. A frame that does not check drops its connection, with a log line;
//! the peer reconnects. A disk error stops the node (it must not answer as if the write
//! had happened); `Status::failed` says why.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::Message;

use crate::coordinator::{Action, Coordinator, Timeouts};
use crate::disk::{DiskError, FileDisk};
use crate::failover::{RecoveryPlan, TailReport};
use crate::node::{raft_logger, ControlNode, NodeError, Timing};
use crate::state::{Command, ControlState, Member, NodeId, Phase};
use ditto_replication::proof::{self, Side};
pub use ditto_replication::protocol::Secret;
use ditto_replication::tls::{cert_name, host_of, opens_with_tls, LinkTls, Until};
use ditto_replication::unhelloed::{HelloSlot, Unhelloed};

const KIND_RAFT: u8 = 1;
const KIND_CTL: u8 = 2;
/// Batches answering a `Ctl::Fetch`, in pieces of at most `FETCH_PIECE` bytes: epoch u64 |
/// stream u32 | req u64 | position u64 | piece u32 | flags u8 | count u32 | (len u32 |
/// batch)*. `req` is the fetch's (`Ctl::Fetch`): the fetcher takes only the answers to the
/// prepare it is on, not a late one to an earlier plan of the same epoch (which may have
/// asked the same node for the same stream from another point, and whose pieces would
/// start this one's stream over, or fill it from the wrong place).
/// Flags: bit 0, the answer's last piece; bit 1, the piece's one entry is a part of a batch
/// larger than a piece, continued by the first entry of the next piece (`fetch_pieces`,
/// `FetchAssembly`). A batch of the largest transaction is far larger than a frame.
const KIND_FETCHED: u8 = 3;
/// A fetch answer larger than this goes in several frames (pieces), in order.
const FETCH_PIECE: usize = 2 << 20;
/// The bytes of a kind 3 body before its batches.
const FETCHED_HEADER: usize = 37;
/// The largest batch a fetch puts back together from parts: the largest the replication
/// protocol ships (a batch of the largest transaction, and change).
const FETCHED_BATCH_MAX: usize = ditto_replication::protocol::FRAME_BYTES_MAX;
const KIND_ADMIN: u8 = 4;
/// The frames that open every connection, both ways (docs/cluster.md, "The cluster
/// secret"); nothing else is read before they end. The side that connects opens
/// (`opening`: whether it holds a secret, and its nonce). Without a secret on either side
/// the side that accepts answers at once: empty when the connection is taken, else why it
/// is refused (a line of text), after which the connection closes. With one on both, it
/// answers with its challenge (its nonce and its proof, `ditto_replication::proof`); the
/// side that connects checks the proof and answers with its own, or with why it refuses;
/// the side that accepts checks that, and answers as above. The secret itself never
/// crosses the link, and the side that connects sends its proof only to a node that
/// proved it holds the secret (a review found, 2026-12-06, that the secret was sent first,
/// in the clear, to whoever listened on a member's port).
const KIND_HELLO: u8 = 5;
/// The first byte of a hello of the exchange (an opening, a challenge, a proof): never the
/// first byte of a refusal's text (no UTF-8 holds 0xff), nor of an older ditto's hello (a
/// secret's text).
const HELLO_MARK: u8 = 0xff;
/// The exchange's version, in the opening and in every proof (`HELLO_PURPOSE`).
const HELLO_VERSION: u8 = 1;
/// What a control hello's proofs are for (`proof::Transcript::purpose`): a proof made for
/// another use of the secret is not taken here.
const HELLO_PURPOSE: &str = "ditto control hello 1";
/// The largest hello body (a refusal, a line; the exchange's are under 70 bytes): all
/// that is read of a peer that has not proved it holds the secret.
const HELLO_MAX: usize = 4096;
/// How long the side that connects waits for the answer to its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the side that accepts waits for a whole hello: a peer that trickles its bytes
/// is cut off then, as one that says nothing.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// Connections that have not said their hello yet, at most, and of those, from one
/// address (`ditto_replication::unhelloed`): past either bound the oldest is closed, so a
/// flood of silent connections costs a bounded number of threads for `HELLO_WAIT`, and
/// cannot keep out a member, which says its hello within milliseconds. Taken connections
/// are not counted: they are the members' and operators'. (Until 2026-12-06 the newest
/// was refused past 64 in all: 64 silent connections, renewed every 5 s from anywhere,
/// kept every member's reconnection out; found by a review.)
const AWAITING_HELLO_MAX: usize = 64;
/// (Members on one host, as in tests and `ditto demo`, share an address: each has at most
/// a sender's and a probe's connection at its hello at once.)
const AWAITING_HELLO_PER_ADDRESS_MAX: usize = 16;
/// A cluster secret's bounds, in bytes (`load_secret`).
pub const SECRET_BYTES_MIN: usize = 16;
pub const SECRET_BYTES_MAX: usize = 1024;
/// How long an operator's request waits for its change to be applied.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// An operator's request to the control plane (frame kind 4).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AdminRequest {
    /// Add a member (it starts with `--join` and catches up from the leader's snapshot), or
    /// promote the learner it names.
    Add(Member),
    /// Add a learner (`Command::AddLearner`): `ditto cluster add` adds a node as one first,
    /// and promotes it (`Add`) once its backup has joined.
    AddLearner(Member),
    /// Remove a member (not the primary).
    Remove(NodeId),
    /// Hand the primary's role to `to` (or to a live backup of the leader's choice): the
    /// answer comes once the switchover is recorded; the epoch changes after.
    Switchover { to: Option<NodeId> },
}

/// The answer to an [`AdminRequest`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AdminReply {
    /// Applied: the membership is now this, in this epoch, whose primary is this (the
    /// state right after the request applied: a switchover's client learns from it which
    /// epoch and primary it changes, even if the switchover is over before it looks).
    Done {
        config: u64,
        members: Vec<Member>,
        #[serde(default)]
        epoch: u64,
        #[serde(default)]
        primary: Option<NodeId>,
    },
    /// This node does not lead: ask the leader (its control address, if known).
    NotLeader { leader: Option<NodeId>, addr: Option<String> },
    /// Not now (a change under way, one the primary has not settled, a failover): the
    /// same request may succeed in a moment.
    Busy(String),
    /// Refused for good, and why.
    Refused(String),
}

/// Sends `req` to the control plane at `to` (host:port), showing it `secret` (the
/// cluster's, if it has one) over `tls` (where the cluster has `tls_cluster`), and waits
/// for the answer (`ditto cluster add|remove|switchover`). A node that refuses the secret
/// or the TLS is an error of kind `PermissionDenied` that says why (`is_refused`).
pub fn admin_request(
    to: &str,
    req: &AdminRequest,
    secret: Option<&ClusterSecret>,
    tls: Option<&LinkTls>,
) -> std::io::Result<AdminReply> {
    let addr = std::net::ToSocketAddrs::to_socket_addrs(to)?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{to} resolves to nothing")))?;
    let mut s = connect(addr, host_of(to), 0, None, secret, tls, Duration::from_secs(2))?;
    s.write_all(&frame(0, KIND_ADMIN, &serde_json::to_vec(req).expect("requests serialise")))?;
    // The whole answer within one deadline, however its bytes trickle in (a timeout per
    // read let a node sending a byte every 14 s hold the tool past its `--wait-s`; found
    // by a review, 2026-12-06).
    let deadline = Instant::now() + ADMIN_TIMEOUT + Duration::from_secs(5);
    match read_frame(&mut Until::new(&s, deadline))? {
        Some((_, KIND_ADMIN, body)) => serde_json::from_slice(&body)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("undecodable answer: {e}"))),
        Some((_, k, _)) => Err(std::io::Error::other(format!("an answer of frame kind {k}"))),
        None => Err(std::io::Error::other("the node closed the connection without answering")),
    }
}

/// What one node holds, for a tail report (`TailReport` less what the service fills in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    /// Per stream: every batch up to this timestamp is held, on disk.
    pub streams: Vec<u64>,
    /// The highest timestamp held at all.
    pub newest: u64,
    /// Whether this node may become primary.
    pub eligible: bool,
    /// A fetch from this node is answered only above this (`TailReport::serves_above`).
    pub serves_above: u64,
    /// Not eligible, but may be chosen if it lacks nothing (`TailReport::last_resort`).
    pub last_resort: bool,
    /// The epoch of the primary's own log it holds; 0 if none (`TailReport::own_epoch`).
    pub own_epoch: u64,
    /// How long ago it last acknowledged a primary as a backup, in ms
    /// (`TailReport::acked_ms_ago`: `NEVER_ACKED` if it never did, 0 if not known).
    pub acked_ms_ago: u64,
    /// It is the open epoch's primary and took writes in it (`TailReport::took_writes`).
    pub took_writes: bool,
}

/// What a node's data plane (its log shipping and replay) does for the control plane. It
/// is called on the control node's thread, so each call returns quickly (`prepare` starts
/// work that `prepared` later reports on).
pub trait DataPlane: Send + 'static {
    /// The nodes heard from since the last call (batches, heartbeats, acknowledgements),
    /// each with when, at the latest: the failure detector's input, and a primary's lease
    /// (its quorum contact). A primary's backups must be stamped no later than the
    /// primary sent what their acks answer (their acks echo its heartbeats' times): its
    /// lease is then never longer than the failover's wait for it allows
    /// (`coordinator::lease_end`). A backup may stamp its primary up to
    /// `HEARD_STAMP_SLACK_MS` late or more (failure detection only).
    fn heard(&mut self) -> Vec<(NodeId, Instant)>;
    /// Whether this node serves as the primary now.
    fn serving(&self) -> bool;
    /// Whether this node, named primary of the open epoch, is still starting to serve it
    /// (recovering its data): the coordinator then waits up to `Timeouts::start`. A node
    /// that will not serve (it restarted) says false.
    fn starting(&self) -> bool {
        false
    }
    /// The node's durable fence is `epoch` (called at start and whenever it rises, after
    /// it is on disk). Before it returns: refuse batches of older epochs from now on, and
    /// acknowledge none of those already queued; if this node serves as primary of an
    /// older epoch, stop it creating or releasing commits. (Without the last, an old
    /// primary that is asked for its report could release a commit after reporting,
    /// through a backup not yet fenced, and the plan would miss it.)
    fn fenced(&mut self, epoch: u64);
    /// What the node holds, taken after `fenced`: everything it ever acknowledged, at any
    /// level (`received` included), made durable before this returns; `Err` if it cannot
    /// (a full disk).
    fn report(&mut self) -> Result<Holding, String>;
    /// Whether a `report` that said "not yet" (its log still being read off the control
    /// thread) can now be given at once: the service then gives it to the coordinator
    /// that asked, unasked again, rather than at the coordinator's next request, a
    /// `resend` later (50 ms on a server: failovers' report phases took 51 or 101 ms where
    /// the read took 25). By default never (such a plane answers at once, or at a resend).
    fn report_ready(&mut self) -> bool {
        false
    }
    /// Start preparing to be primary under `plan`: fetch what `plan.fetch` lists. A new
    /// plan replaces one in progress.
    fn prepare(&mut self, plan: &RecoveryPlan);
    /// Once preparing for `plan` has ended: `Ok(n)`: every stream is held up to its
    /// recovery point, and `n` commits above it will be discarded; `Err`: it cannot be
    /// done. `None` while it is under way.
    fn prepared(&mut self, plan: &RecoveryPlan) -> Option<Result<u64, String>>;
    /// A committed command took effect. `live` is false for commands re-applied from this
    /// node's own disk at a restart (up to the commit index it had persisted); true for the
    /// rest, including commands that committed while it was down and that it learns now.
    fn applied(&mut self, cmd: &Command, state: &ControlState, live: bool);
    /// A failover's chosen node asks for this node's batches of `stream` above `after`
    /// (this node is fenced: it acknowledges nothing more). `Err` if it cannot give them.
    /// Also the position this node holds the stream up to (its batches may stop below it:
    /// an idle stream is held by floors and checkpoints, not batches).
    fn serve_fetch(&mut self, stream: usize, after: u64) -> Result<(Vec<Vec<u8>>, u64), String> {
        let _ = (stream, after);
        Err("this data plane does not serve fetches".into())
    }
    /// `serve_fetch` in two parts: what is checked on the control thread (this call), and
    /// the read of the batches, returned to be run on the service's fetch thread (a fetch
    /// of hundreds of MB read on the control thread would stop its Raft ticks, its
    /// heartbeats and the failover it serves meanwhile). By default all is done here.
    fn fetch_job(&mut self, stream: usize, after: u64) -> Result<FetchJob, String> {
        let (batches, position) = self.serve_fetch(stream, after)?;
        Ok(FetchJob::ready(batches, position))
    }
    /// Batches fetched from a peer for `plan` (being prepared), for one stream, with the
    /// position the peer holds it up to.
    /// An answer larger than a frame comes in pieces, in order, each handed over as it
    /// arrives; `last` marks the final one (only then is the stream held up to
    /// `position`). A piece lost on the way ends the stream's fetch for this plan: the
    /// round's prepare times out and the next round fetches again.
    fn fetched(&mut self, plan: &RecoveryPlan, stream: usize, batches: Vec<Vec<u8>>, position: u64, last: bool) {
        let _ = (plan, stream, batches, position, last);
    }
    /// The failover `plan` was prepared for is over without it (an epoch opened, on
    /// another node, or a later failover began): nothing more of its fetches comes, and
    /// what it was doing ends (a late piece written into the directory of a server started
    /// since would mix an old epoch's batches into it).
    fn abandoned(&mut self, plan: &RecoveryPlan) {
        let _ = plan;
    }
    /// While this node serves as primary: the membership configuration its commit quorum
    /// has settled (it counts that many backups, and a quorum of them holds everything it
    /// released). The node then records it (`Command::ConfigApplied`), which lets the next
    /// membership change go ahead.
    fn settled(&self) -> Option<u64> {
        None
    }
    /// Commands this node's data plane wants committed (asked every step; proposed through
    /// the leader; a data plane asks again until its state shows the command applied).
    fn proposals(&mut self) -> Vec<Command> {
        Vec::new()
    }
    /// The state this node starts from: its own last snapshot's, before the committed
    /// entries above it are `applied` (with `live` false). Where the snapshot covers every
    /// entry (a compaction at the last command), no command is applied at all until the
    /// next one commits, and this is all the data plane learns. (Before 2026-12-03 it was
    /// not told: a node restarted in a quiet cluster after a compaction ran no server until
    /// an unrelated command committed; found by a review.)
    fn started(&mut self, state: &ControlState) {
        let _ = state;
    }
    /// The state was replaced by the leader's snapshot (this node was far behind, or has
    /// just joined): no command is applied for what it skipped.
    fn restored(&mut self, state: &ControlState) {
        let _ = state;
    }
    /// This node's state is up to date as of a moment after it started
    /// (`ControlNode::caught_up`: it applied what the group had committed then). Called
    /// once, after the commands that took it there were `applied`. Before it, the state
    /// may name an epoch that a failover closed while this node was down.
    fn caught_up(&mut self) {}
}

/// A coordinator's request or the answer to one (frame kind 2).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum Ctl {
    AskReport {
        epoch: u64,
    },
    Report(TailReport),
    Prepare(RecoveryPlan),
    /// The plan of `epoch` with this recovery point is ready on the sender.
    Prepared {
        epoch: u64,
        point: u64,
        discarded: u64,
    },
    /// To a peer the plan of `epoch` fetches from: its batches of `stream` above `after`
    /// (answered by frames of kind 3 that carry `req`, which names the fetcher's prepare).
    Fetch {
        epoch: u64,
        stream: usize,
        after: u64,
        #[serde(default)]
        req: u64,
    },
    /// To every member, from `primary`, the primary of `epoch`, while it serves with quorum
    /// contact (acknowledgements of its epoch from a quorum within the failure timeout),
    /// every `HEARD_EVERY_MS`: the failure detector then does not count it silent because
    /// the leader's own backup does not hear it (its server restarting, say), nor does a
    /// node that has just become leader, since every node keeps it. A primary without
    /// quorum contact sends nothing, and is failed over as before.
    Heard {
        epoch: u64,
        primary: NodeId,
    },
    /// To the node whose fetch `req` of `stream` for the plan of `epoch` this node cannot
    /// answer (its log no longer holds what it reported, a read failed), after any pieces
    /// it sent: the fetcher's prepare fails at once instead of at its timeout.
    FetchRefused {
        epoch: u64,
        stream: usize,
        req: u64,
        why: String,
    },
    /// To its coordinator: the plan of `epoch` with this recovery point cannot be prepared
    /// here (a fetch refused, fetched batches that could not be written, the check of what
    /// it holds failed). The round ends without waiting for the prepare timeout.
    Unprepared {
        epoch: u64,
        point: u64,
        why: String,
    },
}

/// How often a primary with quorum contact tells every member so (ms).
const HEARD_EVERY_MS: u64 = 25;
const FRAME_HEADER: usize = 17;
/// A frame larger than this is refused (the control plane's messages are small, and Raft
/// sends at most `node::MSG_BYTES_MAX` of entries in one message).
const FRAME_MAX: usize = 4 << 20;
/// Inputs queued for the node thread before readers wait (backpressure on the peers).
const INBOX: usize = 16 << 10;
/// Frames queued to one peer before new ones are dropped (a dead peer costs no memory).
const PEER_QUEUE: usize = 4096;

/// How a control node runs.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    pub id: NodeId,
    /// Every member's control address, this node's included.
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// Where its Raft state lives (`control.log`).
    pub dir: PathBuf,
    /// One Raft tick.
    pub tick: Duration,
    pub timing: Timing,
    /// The failure detector's and the failover's timeouts, in milliseconds.
    pub timeouts: Timeouts,
    /// This node joins a running group (`ditto cluster add`): it starts with no voters
    /// and learns the group from the leader's snapshot. Only read when `dir` is new.
    pub join: bool,
    /// Compact the control log every this many applied entries (default
    /// `node::COMPACT_EVERY`).
    pub compact_every: Option<u64>,
    /// The cluster secret (`load_secret`): a connection to the control port is taken only
    /// once it shows it, and this node shows it to its peers. `None`: none is asked or
    /// shown (a node with one refuses a node without, and the other way round).
    pub secret: Option<ClusterSecret>,
    /// TLS on the control port (`tls_cluster`): connections both ways, and operators',
    /// are TLS with certificates of the cluster's CA. `None`: plaintext.
    pub tls: Option<Arc<LinkTls>>,
    /// The host names peers' certificates are checked against (their `--members` hosts);
    /// a peer not named here is checked against its address's IP.
    pub hosts: BTreeMap<NodeId, String>,
}

/// What the node knows, published after every step.
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub id: NodeId,
    pub leader: Option<NodeId>,
    /// The voters Raft counts (the members, once a change has been applied).
    pub voters: Vec<NodeId>,
    /// The learners Raft sends its log to.
    pub learners: Vec<NodeId>,
    pub term: u64,
    pub state: ControlState,
    /// Why the node stopped (a disk error), if it did.
    pub failed: Option<String>,
    /// The epoch this node is fenced at.
    pub fence: u64,
    /// While this node serves as primary: whether it has heard acknowledgements of its
    /// epoch from a quorum within the failure timeout (`Coordinator::has_quorum_contact`).
    /// A primary must take no writes without it (cut off from the majority, it could not
    /// release them under `majority` or `all`, and under `local` this is what stops it).
    pub quorum_contact: bool,
    /// When the control thread last published this (every step, at least every tick): a
    /// reader that finds it old knows `quorum_contact` may no longer hold (the thread
    /// stalled: a hung disk, say) and treats it as lost (`contact_now`).
    pub published: Option<Instant>,
    /// While it has quorum contact: when the contact lapses unless more is heard (the
    /// quorum-th most recent acknowledgement's time plus the failure timeout,
    /// `Coordinator::contact_deadline`). A lease: a control thread that stalls cannot
    /// stretch it (before, a contact published just before a stall held for up to a
    /// failure timeout more, about two in all after the last acknowledgement).
    pub contact_until: Option<Instant>,
    /// Named primary by an opening this node applied: it takes no writes before this, when
    /// the old primary's lease has run out (`Command::OpenEpoch::writes_after_ms`, counted
    /// from when the opening was applied here).
    pub writes_not_before: Option<Instant>,
    /// While this node leads a failover round that has no plan yet: the epoch and why
    /// (`Coordinator::unplanned`: too few reports, or none that may become primary can
    /// fetch what it lacks).
    pub failover_waiting: Option<(u64, String)>,
    /// Connections to the control port refused at their hello (the cluster secret), and
    /// the last one's peer and reason.
    pub refused: u64,
    pub refused_last: Option<String>,
    /// Bumped when what a primary's write gate is told may have moved: commands applied
    /// (an opening names the primary and when it may take writes), or quorum contact won
    /// or lost (`ControlService::wait_status`).
    pub changes: u64,
}

impl Status {
    /// Whether this node, serving as primary, has quorum contact now: as last published,
    /// and only while that is less than `failure` old. A control thread that stalls stops
    /// publishing; the contact it last said it had is then as stale as the stall is long,
    /// and a primary that goes on taking writes on it (under `local`, acknowledging them)
    /// may have been failed over meanwhile. (Before 2026-12-02 the last published contact
    /// held however old it was; found by a review.)
    pub fn contact_now(&self, failure: Duration) -> bool {
        self.quorum_contact
            && self.published.is_some_and(|t| t.elapsed() < failure)
            && self.contact_until.is_some_and(|u| Instant::now() < u)
    }

    /// Whether this node, serving as primary, may take writes now: it has quorum contact
    /// (`contact_now`), and the old primary's lease has run out (`writes_not_before`).
    pub fn takes_writes(&self, failure: Duration) -> bool {
        self.contact_now(failure) && self.writes_not_before.is_none_or(|t| Instant::now() >= t)
    }

    /// Until when this node may take writes unless it hears more (`contact_until`), while
    /// it may now (`takes_writes`): what its server's write gate is told, so that the gate
    /// closes on time by itself however late the node is to close it.
    pub fn writes_until(&self, failure: Duration) -> Option<Instant> {
        match self.takes_writes(failure) {
            true => self.contact_until,
            false => None,
        }
    }
}

/// The read of a fetch's answer (`DataPlane::fetch_job`): where the node holds the stream
/// up to (each piece says it), and the read, which hands the batches to its sink in
/// order as it reads them (the sink returns false when the answer can go no further, and
/// the read may stop). The answer is sent in pieces as they fill: it is never held whole.
pub struct FetchJob {
    pub position: u64,
    #[allow(clippy::type_complexity)]
    pub read: Box<dyn FnOnce(&mut dyn FnMut(Vec<u8>) -> bool) -> Result<(), String> + Send>,
}

impl FetchJob {
    /// A job whose answer is already read.
    pub fn ready(batches: Vec<Vec<u8>>, position: u64) -> FetchJob {
        FetchJob {
            position,
            read: Box::new(move |sink| {
                for b in batches {
                    if !sink(b) {
                        break;
                    }
                }
                Ok(())
            }),
        }
    }
}

/// A frame to a peer's sender thread (`send_to`), and whom to tell once it is written (or
/// dropped): a fetch's pieces are queued one at a time, each once the one before is gone,
/// so that at most one (2 MiB) waits ahead of a heartbeat.
type Outgoing = (Vec<u8>, Option<SyncSender<()>>);

/// A fetch to answer, on the fetch thread: the job, where to send its pieces, and what
/// they answer.
struct FetchToServe {
    /// What to read, or why it cannot be served: the refusal is sent from the fetch
    /// thread too, which waits for room in the peer's queue (from the control thread it
    /// was dropped on a full queue, and the fetcher's round then waited out its prepare
    /// timeout).
    job: Result<FetchJob, String>,
    to: SyncSender<Outgoing>,
    from: NodeId,
    me: NodeId,
    epoch: u64,
    stream: usize,
    req: u64,
}

/// Answers fetches one at a time, in the order asked (a resend's pieces never interleave
/// with the first answer's), off the control thread: each is read, cut into pieces and
/// queued to the peer's sender one piece at a time, the next once the one before has been
/// written (up to 5 s a piece), so that Raft's and the coordinator's frames to that peer
/// wait behind one piece at most. A fetch asked again
/// by the same node for the same stream (the next round of a failover whose prepare timed
/// out) replaces one still waiting: slow reads do not pile up. Stops with the service.
fn serve_fetches(rx: Receiver<FetchToServe>, shared: Arc<Shared>) {
    let mut waiting: std::collections::VecDeque<FetchToServe> = Default::default();
    loop {
        if waiting.is_empty() {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(f) => waiting.push_back(f),
                Err(RecvTimeoutError::Timeout) if !shared.stop.load(Ordering::SeqCst) => continue,
                Err(_) => return,
            }
        }
        for f in rx.try_iter() {
            waiting.retain(|w| (w.from, w.stream) != (f.from, f.stream));
            waiting.push_back(f);
        }
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Some(f) = waiting.pop_front() else { continue };
        let refuse = |why: String| {
            let refused = Ctl::FetchRefused { epoch: f.epoch, stream: f.stream, req: f.req, why };
            let body = serde_json::to_vec(&refused).expect("control requests serialise");
            queue_frame(&f.to, frame(f.me, KIND_CTL, &body));
        };
        let FetchJob { position, read } = match f.job {
            Ok(job) => job,
            Err(why) => {
                refuse(why);
                continue;
            }
        };
        let mut out =
            Answer { to: &f.to, me: f.me, epoch: f.epoch, stream: f.stream, req: f.req, position, next: 0, held: None };
        let mut pieces = Piecer::default();
        let mut going = true;
        let read = read(&mut |b| {
            going = going && pieces.push(b, &mut |p| out.send(p));
            going
        });
        match read {
            // Pieces sent before the error go with no last one; the refusal after them (on
            // the same connection, so after them) ends the fetcher's prepare at once.
            Err(why) => {
                tracing::warn!(node = f.me, "cannot serve a fetch of stream {}: {why}", f.stream);
                refuse(why);
            }
            Ok(()) if going => {
                if let Some(p) = pieces.finish() {
                    going = out.send(p);
                }
                if going {
                    out.finish();
                }
            }
            Ok(()) => {}
        }
    }
}

/// A fetch answer's pieces as they are sent: numbered, each held back until the next one
/// comes, so that the last is known to be the last when it goes.
struct Answer<'a> {
    to: &'a SyncSender<Outgoing>,
    me: NodeId,
    epoch: u64,
    stream: usize,
    req: u64,
    position: u64,
    next: u32,
    held: Option<(Vec<Vec<u8>>, bool)>,
}

impl Answer<'_> {
    /// Piece `p` (its entries, and whether its one entry is continued): the one before
    /// it goes; false if it could not be queued (the answer is dropped).
    fn send(&mut self, p: (Vec<Vec<u8>>, bool)) -> bool {
        match self.held.replace(p) {
            Some(before) => self.queue(before, false),
            None => true,
        }
    }

    /// The piece held goes as the last (an empty one if the answer has no batches).
    fn finish(mut self) -> bool {
        let last = self.held.take().unwrap_or_default();
        self.queue(last, true)
    }

    fn queue(&mut self, (entries, more): (Vec<Vec<u8>>, bool), last: bool) -> bool {
        let refs: Vec<&[u8]> = entries.iter().map(Vec::as_slice).collect();
        let body = encode_fetched(self.epoch, self.stream, self.req, self.position, self.next, last, more, &refs);
        self.next += 1;
        let queued = queue_frame(self.to, frame(self.me, KIND_FETCHED, &body));
        if !queued {
            tracing::warn!(node = self.me, "a fetch's answer for stream {} could not be queued: dropped", self.stream);
        }
        queued
    }
}

/// A fetch answer cut into pieces of at most `FETCH_PIECE` bytes as its batches come:
/// whole batches together, and each batch larger than a piece alone, in parts (each a
/// piece whose flag says whether the next continues it).
#[derive(Default)]
struct Piecer {
    whole: Vec<Vec<u8>>,
    bytes: usize,
}

impl Piecer {
    /// Takes the next batch, handing each piece it completes to `emit` in order (a part of
    /// a large batch is copied out only once the one before it has gone); false as soon as
    /// `emit` is.
    fn push(&mut self, b: Vec<u8>, emit: &mut dyn FnMut((Vec<Vec<u8>>, bool)) -> bool) -> bool {
        let large = b.len() + 4 > FETCH_PIECE;
        if !self.whole.is_empty() && (large || self.bytes + b.len() + 4 > FETCH_PIECE) {
            self.bytes = 0;
            if !emit((std::mem::take(&mut self.whole), false)) {
                return false;
            }
        }
        if !large {
            self.bytes += b.len() + 4;
            self.whole.push(b);
            return true;
        }
        let mut at = 0;
        while at < b.len() {
            let end = (at + FETCH_PIECE).min(b.len());
            if !emit((vec![b[at..end].to_vec()], end < b.len())) {
                return false;
            }
            at = end;
        }
        true
    }

    /// The piece of the whole batches left, if any.
    fn finish(self) -> Option<(Vec<Vec<u8>>, bool)> {
        (!self.whole.is_empty()).then_some((self.whole, false))
    }
}

/// Queues a frame to a peer's sender and waits until it has been written (or dropped),
/// up to 5 s in all; false if it could not be queued or written in that time.
fn queue_frame(tx: &SyncSender<Outgoing>, f: Vec<u8>) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    let (done_tx, done) = mpsc::sync_channel(1);
    let mut out = (f, Some(done_tx));
    loop {
        match tx.try_send(out) {
            Ok(()) => break,
            Err(mpsc::TrySendError::Full(back)) if Instant::now() < end => {
                out = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => return false,
        }
    }
    done.recv_timeout(end.saturating_duration_since(Instant::now())).is_ok()
}

enum Input {
    Raft(Box<Message>),
    Ctl(NodeId, Ctl),
    /// A piece of a fetch's answer, from node `from`.
    Fetched {
        from: NodeId,
        epoch: u64,
        stream: usize,
        /// The fetch's `req` (`KIND_FETCHED`).
        req: u64,
        position: u64,
        piece: u32,
        last: bool,
        /// The piece's one entry is a part of a batch, continued in the next piece.
        more: bool,
        batches: Vec<Vec<u8>>,
    },
    Propose(Command, Sender<Result<(), String>>),
    Admin(AdminRequest, Sender<AdminReply>),
    /// Look at the data plane now (`Waker`): it has news (a backup its server now hears).
    Wake,
}

/// Wakes a node's control thread to look at its data plane at once (`DataPlane::heard`
/// and the rest of a loop), rather than at its next input or tick (up to `tick` later):
/// for news that a failover waits on, such as a new primary's server hearing a backup.
#[derive(Clone)]
pub struct Waker(SyncSender<Input>);

impl Waker {
    /// Never blocks: with the control thread's inbox full, it has plenty to wake it.
    pub fn wake(&self) {
        let _ = self.0.try_send(Input::Wake);
    }
}

struct Shared {
    status: Mutex<Status>,
    /// Told when `Status::changes` moves (`ControlService::wait_status`).
    status_changed: std::sync::Condvar,
    stop: AtomicBool,
    id: NodeId,
    secret: Option<ClusterSecret>,
    tls: Option<Arc<LinkTls>>,
    /// Connections refused at their hello: how many, the last (peer: reason), and when a
    /// refusal was last logged with the count since (at most one line a second).
    refusals: Mutex<Refusals>,
    /// Connections accepted whose hello has not been read yet.
    unhelloed: Arc<Unhelloed>,
    /// A peer refused this node's connection because it was removed: the service stops,
    /// saying why (a node removed while it was down, or that missed its removal, never
    /// learns it otherwise: no member talks to a non-member).
    removed: Mutex<Option<String>>,
    /// Peers whose connection to this node ended after it carried frames: this node says
    /// its hello to each once more, on a connection of its own that it then closes
    /// (`send_to`), to learn whether it was removed. A learner removed that missed the
    /// entry removing it sends nothing of its own on which to learn it; the leader dropping
    /// its connection is the only sign. (A probe carries no frame, so its end asks for no
    /// probe back.)
    probe: Mutex<std::collections::BTreeSet<NodeId>>,
    /// The peers that refused this node's hello as removed (`note_removed`).
    removed_by: Mutex<std::collections::BTreeSet<NodeId>>,
}

/// Whether the peers in `said` that told this node it was removed are a majority of the
/// `others` its state knows (any one, where it knows none).
fn removal_confirmed(said: &std::collections::BTreeSet<NodeId>, others: &std::collections::BTreeSet<NodeId>) -> bool {
    match others.len() {
        0 => !said.is_empty(),
        n => said.intersection(others).count() > n / 2,
    }
}

/// What a member answers a removed node's hello (its node stops when it reads it).
pub const REMOVED: &str = "this node was removed from the cluster, and its id is never used again";

#[derive(Default)]
struct Refusals {
    count: u64,
    last: Option<String>,
    logged_at: Option<Instant>,
    since_logged: u64,
}

impl Shared {
    /// Whether `peer`'s refusal `why` says this node was removed. The service stops on it
    /// (`Shared::removed`) once a majority of the other nodes its state knows have said so
    /// (`removal_confirmed`); the first to say so has this node ask the others at once
    /// (`probe`). One address alone no longer stops it: on a plaintext control link the
    /// side that accepts proves nothing, so a stranger's listener on a member's port (while
    /// that member is down) answered every member's hello as removed, and each stopped for
    /// good (exit 78, which its service manager does not restart; found by a review,
    /// 2026-12-06).
    fn note_removed(&self, peer: NodeId, why: &str) -> bool {
        if !why.contains(REMOVED) {
            return false;
        }
        let others: std::collections::BTreeSet<NodeId> = {
            let st = &self.status.lock().unwrap().state;
            st.members.keys().chain(st.learners.keys()).copied().filter(|&n| n != self.id).collect()
        };
        let mut by = self.removed_by.lock().unwrap();
        let first = by.is_empty();
        by.insert(peer);
        if removal_confirmed(&by, &others) {
            *self.removed.lock().unwrap() = Some(why.to_string());
        } else {
            tracing::warn!(
                "control: node {peer} says this node was removed; {} of the {} other nodes have said so, a majority is needed: asking them",
                by.len(),
                others.len()
            );
            if first {
                self.probe.lock().unwrap().extend(others.iter().filter(|&&n| n != peer));
            }
        }
        true
    }

    /// A connection from `peer` refused, and why: counted, and logged at most once a
    /// second (a node with the wrong secret reconnects every second, a scanner faster).
    fn refused(&self, peer: SocketAddr, why: &str) {
        let mut r = self.refusals.lock().unwrap();
        r.count += 1;
        r.since_logged += 1;
        r.last = Some(format!("{peer}: {why}"));
        if r.logged_at.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        let more = match r.since_logged - 1 {
            0 => String::new(),
            n => format!(" ({n} more refused since the last such line)"),
        };
        tracing::warn!(%peer, "refused a control connection: {why}{more}");
        r.logged_at = Some(Instant::now());
        r.since_logged = 0;
    }
}

/// One running control node (see the module notes).
pub struct ControlService {
    shared: Arc<Shared>,
    inbox: SyncSender<Input>,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error(transparent)]
    Node(#[from] NodeError),
    #[error("control listener: {0}")]
    Listener(std::io::Error),
}

fn frame(from: NodeId, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut rest = Vec::with_capacity(9 + body.len());
    rest.extend_from_slice(&from.to_le_bytes());
    rest.push(kind);
    rest.extend_from_slice(body);
    let mut f = Vec::with_capacity(8 + rest.len());
    f.extend_from_slice(&(rest.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32c::crc32c(&rest).to_le_bytes());
    f.extend_from_slice(&rest);
    f
}

/// Reads one frame: `Ok(None)` at a clean end of stream.
fn read_frame(r: &mut impl Read) -> std::io::Result<Option<(NodeId, u8, Vec<u8>)>> {
    read_frame_within(r, FRAME_MAX, |len| format!("frame length {len} out of bounds"))
}

/// Reads one frame of at most `max` bytes after its length: a peer that has not shown
/// the secret is read no further than its hello.
fn read_frame_at_most(r: &mut impl Read, max: usize) -> std::io::Result<Option<(NodeId, u8, Vec<u8>)>> {
    read_frame_within(r, max + FRAME_HEADER - 8, |len| {
        format!("a first frame of {len} bytes: a hello is at most {max}")
    })
}

/// Reads one frame whose length (after the length and checksum) is at most `most`,
/// refused on its header alone otherwise, saying `too_long(len)`.
fn read_frame_within(
    r: &mut impl Read,
    most: usize,
    too_long: impl Fn(usize) -> String,
) -> std::io::Result<Option<(NodeId, u8, Vec<u8>)>> {
    let mut head = [0u8; 8];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(head[..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().unwrap());
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    if len > most {
        return Err(bad(too_long(len)));
    }
    if len < FRAME_HEADER - 8 {
        return Err(bad(format!("frame length {len} out of bounds")));
    }
    let mut rest = vec![0u8; len];
    r.read_exact(&mut rest)?;
    if crc32c::crc32c(&rest) != crc {
        return Err(bad("frame checksum mismatch".into()));
    }
    let from = u64::from_le_bytes(rest[..8].try_into().unwrap());
    Ok(Some((from, rest[8], rest[9..].to_vec())))
}

/// A cluster's secret as a node holds it (`load_secret`): the one it shows its peers, and
/// the others it also takes while the secret is rotated (docs/cluster.md, "Rotating the
/// secret").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSecret {
    pub shown: Secret,
    pub also: Vec<Secret>,
}

impl ClusterSecret {
    /// One secret, shown, and no other taken.
    pub fn one(shown: Secret) -> ClusterSecret {
        ClusterSecret { shown, also: Vec::new() }
    }

    /// Every secret this node takes: the one it shows, then the others.
    fn all(&self) -> impl Iterator<Item = &Secret> {
        std::iter::once(&self.shown).chain(&self.also)
    }
}

/// Why a node refuses a connection whose opening said whether it holds a secret
/// (`given`), when the node has `mine`; `None` when the exchange goes on (to the proofs
/// where both hold one). Pure, for tests.
fn hello_refusal(mine: Option<&ClusterSecret>, given: bool) -> Option<&'static str> {
    match (mine, given) {
        (None, false) | (Some(_), true) => None,
        (None, true) => Some(
            "the peer holds a cluster secret and this node has none: give every node and `ditto cluster` the same --cluster-secret-file, or none",
        ),
        (Some(_), false) => Some("this cluster asks for its secret and none was given (--cluster-secret-file)"),
    }
}

/// The refusal of a proof that no secret of the node's takes.
const WRONG_SECRET: &str = "a wrong cluster secret (--cluster-secret-file)";
/// What the side that connects says to a node that answered as another than it dialled,
/// and what that node looks for to say so in turn.
const WRONG_NODE: &[u8] = b"this side dialled another node here (an address reused, or a relay)";

/// A hello's exchange bodies (`KIND_HELLO`), laid out and read. Pure, for tests.
mod hello {
    use super::{HELLO_MARK, HELLO_PURPOSE, HELLO_VERSION};
    use crate::state::NodeId;
    use ditto_replication::proof::{Nonce, Proof, Transcript, NONCE_BYTES, PROOF_BYTES};

    /// The side that connects, first: `MARK VERSION holds-a-secret(0|1) nonce`.
    pub fn opening(holds_secret: bool, nonce: &Nonce) -> Vec<u8> {
        [&[HELLO_MARK, HELLO_VERSION, holds_secret as u8][..], nonce].concat()
    }

    /// An opening's fields, or why it is refused.
    pub fn read_opening(body: &[u8]) -> Result<(bool, Nonce), String> {
        match body {
            [HELLO_MARK, HELLO_VERSION, holds @ (0 | 1), nonce @ ..] if nonce.len() == NONCE_BYTES => {
                Ok((*holds == 1, nonce.try_into().unwrap()))
            }
            [HELLO_MARK, v, ..] if *v != HELLO_VERSION => {
                Err(format!("a hello of version {v}; this node speaks {HELLO_VERSION} (every node and `ditto cluster` must run the same version)"))
            }
            [HELLO_MARK, ..] => Err(format!("a malformed hello of {} bytes", body.len())),
            // An older ditto's hello was its secret, sent in the clear, or nothing.
            _ => Err("a hello of an older ditto (every node and `ditto cluster` must run the same version)".into()),
        }
    }

    /// The side that accepts, where both hold a secret: `MARK nonce proof`.
    pub fn challenge(nonce: &Nonce, proof: &Proof) -> Vec<u8> {
        [&[HELLO_MARK][..], nonce, proof].concat()
    }

    /// A challenge's nonce and proof; `None` if the body is not one.
    pub fn read_challenge(body: &[u8]) -> Option<(Nonce, &[u8])> {
        match body {
            [HELLO_MARK, rest @ ..] if rest.len() == NONCE_BYTES + PROOF_BYTES => {
                Some((rest[..NONCE_BYTES].try_into().unwrap(), &rest[NONCE_BYTES..]))
            }
            _ => None,
        }
    }

    /// The side that connects, once it took the challenge: `MARK proof`.
    pub fn response(proof: &Proof) -> Vec<u8> {
        [&[HELLO_MARK][..], proof].concat()
    }

    /// A response's proof; `None` if the body is not one.
    pub fn read_response(body: &[u8]) -> Option<&[u8]> {
        match body {
            [HELLO_MARK, proof @ ..] if proof.len() == PROOF_BYTES => Some(proof),
            _ => None,
        }
    }

    /// The names of a connection's sides, as its proofs cover them.
    pub fn names(connects: NodeId, accepts: NodeId) -> ([u8; 8], [u8; 8]) {
        (connects.to_le_bytes(), accepts.to_le_bytes())
    }

    /// What both sides' proofs cover.
    pub fn transcript<'a>(names: &'a ([u8; 8], [u8; 8]), connects: &'a Nonce, accepts: &'a Nonce) -> Transcript<'a> {
        Transcript {
            purpose: HELLO_PURPOSE,
            // (A cluster's secret is at least 16 bytes: the stretch's salt is the purpose.)
            salt: b"",
            connects: &names.0,
            accepts: &names.1,
            connects_nonce: connects,
            accepts_nonce: accepts,
        }
    }
}

/// Whether `e` is a read that waited out its time (a socket's read timeout says
/// `WouldBlock` on Linux).
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)
}

/// A control port's refusal of a connection at its hello, and why (`is_refused`).
/// `trusted`: said by a node that proved it holds the cluster secret, or where this side
/// holds none (nothing can be proved then; `Shared::note_removed` asks a majority). A
/// refusal in answer to the opening, where this side holds a secret, is not: anyone on
/// the port can say it (before 2026-12-06 a stranger's "removed" counted there, and in a
/// membership of two it alone stopped the node for good; found by a review).
#[derive(Debug, thiserror::Error)]
#[error("{why}")]
struct HelloRefused {
    why: String,
    trusted: bool,
}

impl HelloRefused {
    fn new(why: String) -> HelloRefused {
        HelloRefused { why, trusted: true }
    }
}

/// Whether `e` (from `admin_request`) is a node's refusal of the connection at its hello
/// (the cluster secret): asking again would not change it.
pub fn is_refused(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<HelloRefused>())
}

/// Whether `e` is a refusal a node that proved itself said (`HelloRefused::trusted`).
fn is_trusted_refusal(e: &std::io::Error) -> bool {
    e.get_ref().and_then(|i| i.downcast_ref::<HelloRefused>()).is_some_and(|r| r.trusted)
}

/// Connects to the control port at `addr` as node `from` (0: an operator) and says the
/// hello, over TLS where `tls` is given (the node's certificate checked against `name`):
/// the connection, once the node took it. With a secret, the node must prove it holds
/// one `secret` takes before this side proves its own (`KIND_HELLO`), and where `to` names
/// the node expected there, that node. A refusal, of either side's hello or of the TLS
/// handshake, is an error of kind `PermissionDenied` that says why (`is_refused`).
fn connect(
    addr: SocketAddr,
    name: &str,
    from: NodeId,
    to: Option<NodeId>,
    secret: Option<&ClusterSecret>,
    tls: Option<&LinkTls>,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    let mut s = match tls {
        // A certificate refused either way, a plaintext port, a name no certificate can
        // carry: asking again would not change it (a handshake that times out may).
        Some(t) => t.connect_named(s, &addr.to_string(), name).map_err(|e| {
            if ditto_replication::tls::is_handshake_failure(&e) || e.kind() == std::io::ErrorKind::InvalidInput {
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, HelloRefused::new(e.to_string()))
            } else {
                e
            }
        })?,
        None => s,
    };
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(HELLO_TIMEOUT))?;
    // One deadline for the whole exchange (two round trips with a secret).
    let until = Instant::now() + 2 * HELLO_TIMEOUT;
    let refused = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, HelloRefused::new(why));
    let ours = proof::nonce();
    s.write_all(&frame(from, KIND_HELLO, &hello::opening(secret.is_some(), &ours)))?;
    // A refusal of the opening, where this side holds a secret, comes before the node
    // proved anything: said, but not trusted.
    let mut answer = read_hello_answer(&mut s, addr, tls.is_some(), until).map_err(|e| {
        match e.get_ref().and_then(|i| i.downcast_ref::<HelloRefused>()).filter(|_| secret.is_some()) {
            Some(r) => std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                HelloRefused { why: r.why.clone(), trusted: false },
            ),
            None => e,
        }
    })?;
    if let Some(secret) = secret {
        // The node's challenge: its proof checked before this side proves anything.
        let Some((node, (theirs, their_proof))) =
            answer.as_ref().and_then(|(node, body)| Some((*node, hello::read_challenge(body)?)))
        else {
            return Err(refused(format!(
                "the control port at {addr} took this connection without proving it holds the cluster secret: it has none, or is not a node of this cluster"
            )));
        };
        let names = hello::names(from, node);
        let t = hello::transcript(&names, &ours, &theirs);
        // (This side proves with the secret the node proved it holds: either side may show
        // either secret of a rotation.)
        let held = match (to, proof::matching(secret.all(), Side::Accepts, &t, their_proof)) {
            (Some(to), _) if to != node => Err((
                format!(
                    "the control port at {addr} answered as node {node}, not as node {to}: another node, or a process passing this connection on to one"
                ),
                WRONG_NODE,
            )),
            (_, None) => Err((
                format!(
                    "the control port at {addr} did not prove it holds this cluster's secret: a wrong cluster secret on one side (--cluster-secret-file), or a process that is not a node of this cluster"
                ),
                &b"this side's secret does not take the proof given"[..],
            )),
            (_, Some(held)) => Ok(held),
        };
        let held = match held {
            Ok(h) => h,
            Err((why, said)) => {
                // Said to the node too, which counts it (its side of a configuration that
                // differs is then in its log and `INFO cluster` as well).
                let _ = s.write_all(&frame(from, KIND_HELLO, said));
                return Err(refused(why));
            }
        };
        s.write_all(&frame(from, KIND_HELLO, &hello::response(&proof::prove(held, Side::Connects, &t))))?;
        answer = read_hello_answer(&mut s, addr, tls.is_some(), until)?;
    }
    s.set_read_timeout(None)?;
    match answer {
        None => Ok(s),
        // A challenge where this side holds no secret (a node with one refuses it
        // outright), or a second one.
        Some(_) => Err(refused(format!("the control port at {addr} answered its hello out of turn"))),
    }
}

/// The answer to a hello this side sent: `None` when the node took the connection (an
/// empty hello), else the node and its body for the exchange (a challenge); a refusal is
/// an error of kind `PermissionDenied` that says why (`is_refused`).
fn read_hello_answer(
    s: &mut TcpStream,
    addr: SocketAddr,
    tls: bool,
    until: Instant,
) -> std::io::Result<Option<(NodeId, Vec<u8>)>> {
    match read_frame_at_most(&mut Until::new(&*s, until), HELLO_MAX) {
        Ok(Some((_, KIND_HELLO, body))) if body.is_empty() => Ok(None),
        Ok(Some((node, KIND_HELLO, body))) if body[0] == HELLO_MARK => Ok(Some((node, body))),
        Ok(Some((_, KIND_HELLO, why))) => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            HelloRefused::new(format!(
                "the control port at {addr} refused this connection: {}",
                String::from_utf8_lossy(&why)
            )),
        )),
        Ok(Some((_, k, _))) => Err(std::io::Error::other(format!("an answer of frame kind {k} to a hello"))),
        // (A TLS port closes a plaintext hello with a plaintext refusal, which is read above.)
        Ok(None) if tls => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            HelloRefused::new(format!(
                "the control port at {addr} closed the connection at its hello: it may have refused this side's certificate (its log says), or be plaintext (tls_cluster on every node, or on none)"
            )),
        )),
        Ok(None) => {
            Err(std::io::Error::other(format!("the control port at {addr} closed the connection at its hello")))
        }
        Err(e) if timed_out(&e) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the control port at {addr} did not answer this connection's hello within {:?}", 2 * HELLO_TIMEOUT),
        )),
        Err(e) => Err(e),
    }
}

/// At most this many secrets a node takes besides the one it shows, while the secret is
/// rotated (`--cluster-secret-also-file`, docs/cluster.md, "Rotating the secret").
pub const SECRETS_ALSO_MAX: usize = 3;

/// Reads a cluster secret from `path` (`--cluster-secret-file`): its text with every
/// whitespace character taken out (as MongoDB reads a keyFile, so that base64 wrapped over
/// lines by `openssl rand -base64` is one secret), of `SECRET_BYTES_MIN` to
/// `SECRET_BYTES_MAX` bytes, from a file its owner alone may read (as MongoDB's keyFile
/// and ssh's keys), owned by this process's user or by root (as ssh asks of its keys: the
/// owner of a file may change it).
pub fn load_secret(path: &std::path::Path) -> Result<Secret, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    load_secret_as(path, unsafe { libc::geteuid() })
}

fn load_secret_as(path: &std::path::Path, user: u32) -> Result<Secret, String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let at = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("the cluster secret file {at}: {e}"))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!("the cluster secret file {at} may be read by others (mode {mode:03o}): `chmod 600 {at}`"));
    }
    if meta.uid() != user && meta.uid() != 0 {
        return Err(format!(
            "the cluster secret file {at} is owned by user {}, not by this process's user ({user}) nor root: whoever owns it may change it (`chown {user} {at}`)",
            meta.uid()
        ));
    }
    let text = std::fs::read(path).map_err(|e| format!("the cluster secret file {at}: {e}"))?;
    let text = String::from_utf8(text).map_err(|_| format!("the cluster secret file {at} is not UTF-8 text"))?;
    let secret: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    if !(SECRET_BYTES_MIN..=SECRET_BYTES_MAX).contains(&secret.len()) {
        return Err(format!(
            "the cluster secret in {at} is {} bytes (whitespace aside): it must be {SECRET_BYTES_MIN} to {SECRET_BYTES_MAX} (`openssl rand -base64 32 > {at}`)",
            secret.len()
        ));
    }
    Ok(Secret(secret))
}

impl ClusterSecret {
    /// The secret a node shows, from `shown`, and those it also takes, from `also` (each
    /// read by `load_secret`; at most `SECRETS_ALSO_MAX`).
    pub fn load(shown: &std::path::Path, also: &[std::path::PathBuf]) -> Result<ClusterSecret, String> {
        if also.len() > SECRETS_ALSO_MAX {
            return Err(format!(
                "{} files of secrets also taken: at most {SECRETS_ALSO_MAX} (--cluster-secret-also-file)",
                also.len()
            ));
        }
        let also = also.iter().map(|p| load_secret(p)).collect::<Result<_, _>>()?;
        Ok(ClusterSecret { shown: load_secret(shown)?, also })
    }
}

impl ControlService {
    /// Starts node `cfg.id` from its directory, listening on `listener` (bound by the
    /// caller, so that it can choose the port).
    pub fn start(
        cfg: ServiceConfig,
        listener: TcpListener,
        data: Box<dyn DataPlane>,
    ) -> Result<ControlService, ServiceError> {
        let voters: Vec<NodeId> = if cfg.join { Vec::new() } else { cfg.peers.keys().copied().collect() };
        let disk = FileDisk::open(&cfg.dir, &voters)?;
        let mut node = ControlNode::start(cfg.id, cfg.timing, disk.durable(), &raft_logger())?;
        if let Some(n) = cfg.compact_every {
            node.set_compact_every(n);
        }
        let shared = Arc::new(Shared {
            status: Mutex::new(Status { id: cfg.id, ..Status::default() }),
            status_changed: Default::default(),
            stop: AtomicBool::new(false),
            id: cfg.id,
            secret: cfg.secret.clone(),
            tls: cfg.tls.clone(),
            refusals: Mutex::default(),
            unhelloed: Arc::new(Unhelloed::new(AWAITING_HELLO_MAX, AWAITING_HELLO_PER_ADDRESS_MAX)),
            removed: Default::default(),
            probe: Default::default(),
            removed_by: Default::default(),
        });
        let (inbox, rx) = mpsc::sync_channel(INBOX);
        let mut threads = Vec::new();
        listener.set_nonblocking(true).map_err(ServiceError::Listener)?;
        {
            let (shared, inbox) = (Arc::clone(&shared), inbox.clone());
            threads.push(spawn(format!("ditto-ctl-accept-{}", cfg.id), move || accept(listener, shared, inbox)));
        }
        {
            let shared = Arc::clone(&shared);
            let id = cfg.id;
            let coord = Coordinator::new(id, cfg.timeouts, 0);
            let (fetches, fetch_rx) = mpsc::channel();
            let sh = Arc::clone(&shared);
            threads.push(spawn(format!("ditto-ctl-fetch-{id}"), move || serve_fetches(fetch_rx, sh)));
            let mut run = Run {
                node,
                disk,
                data,
                senders: BTreeMap::new(),
                sender_threads: Vec::new(),
                config_peers: cfg.peers.clone(),
                hosts: cfg.hosts.clone(),
                shared,
                tick: cfg.tick,
                coord,
                preparing: None,
                answered: None,
                fetch_req: crate::node::run_nonce(),
                fetch_in: BTreeMap::new(),
                fetches,
                no_source_logged: 0,
                report_owed: None,
                told_caught_up: false,
                admin: Vec::new(),
                resync_at: None,
            };
            run.sync_peers();
            let sh = Arc::clone(&run.shared);
            threads.push(spawn(format!("ditto-ctl-node-{id}"), move || {
                // A panic here (raft-rs, the coordinator, the data plane) is the control
                // plane's failure, said in the status as any other: its supervisor stops
                // on it (before 2026-12-02 the status stayed as last published, and the
                // node neither served nor exited).
                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.run(rx))) {
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    tracing::error!("control node {id} stops: its thread panicked: {what}");
                    sh.status.lock().unwrap_or_else(|e| e.into_inner()).failed =
                        Some(format!("the control thread panicked: {what}"));
                }
            }));
        }
        Ok(ControlService { shared, inbox, threads })
    }

    /// A `Waker` of this node's control thread.
    pub fn waker(&self) -> Waker {
        Waker(self.inbox.clone())
    }

    /// Waits until `Status::changes` is past `seen`, up to `timeout`.
    pub fn wait_status(&self, seen: u64, timeout: Duration) {
        let s = self.shared.status.lock().unwrap();
        let _ = self.shared.status_changed.wait_timeout_while(s, timeout, |s| s.changes <= seen);
    }

    pub fn status(&self) -> Status {
        let mut st = self.shared.status.lock().unwrap().clone();
        let r = self.shared.refusals.lock().unwrap();
        (st.refused, st.refused_last) = (r.count, r.last.clone());
        st
    }

    /// Proposes a command through this node, which must be the leader; answers once the
    /// proposal is in the leader's log (not yet committed: watch `status`).
    pub fn propose(&self, cmd: Command) -> Result<(), String> {
        let (tx, rx) = mpsc::channel();
        self.inbox.send(Input::Propose(cmd, tx)).map_err(|_| "the control node has stopped".to_string())?;
        rx.recv_timeout(Duration::from_secs(5)).map_err(|_| "the control node did not answer".to_string())?
    }

    /// Stops every thread and closes every socket (the disk keeps what was written).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ControlService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new().name(name).spawn(f).expect("spawning a control thread")
}

fn accept(listener: TcpListener, shared: Arc<Shared>, inbox: SyncSender<Input>) {
    // Each reader blocks on its socket; stopping shuts the sockets down to wake them.
    let mut readers: Vec<(TcpStream, JoinHandle<()>)> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let Ok(handle) = stream.try_clone() else { continue };
                let (slot, evicted) = Unhelloed::take(&shared.unhelloed, &stream);
                if let Some(old) = evicted {
                    // (Its address read first: once shut, it may have none.)
                    let from = old.peer_addr().unwrap_or(peer);
                    let _ = old.shutdown(std::net::Shutdown::Both);
                    shared.refused(from, &format!("closed unanswered: the oldest of the connections that have not said their hello (at most {AWAITING_HELLO_MAX}, {AWAITING_HELLO_PER_ADDRESS_MAX} from one address)"));
                }
                let (sh, inbox) = (Arc::clone(&shared), inbox.clone());
                let reader = std::thread::Builder::new()
                    .name("ditto-ctl-read".into())
                    .spawn(move || read_from(stream, peer, sh, inbox, slot));
                match reader {
                    Ok(r) => readers.push((handle, r)),
                    // (The connection closes: its peer tries again.)
                    Err(e) => tracing::warn!(%peer, "control listener: no thread for a connection: {e}"),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                tracing::warn!("control listener: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        readers.retain(|(_, r)| !r.is_finished());
    }
    for (s, r) in readers {
        let _ = s.shutdown(std::net::Shutdown::Both);
        let _ = r.join();
    }
}

/// What a frame asks of the node thread.
fn decode(from: NodeId, kind: u8, body: &[u8]) -> Result<Input, String> {
    match kind {
        // (A Raft message's own `from` is not checked against the frame's: raft-rs sets it
        // to the transferee in a leadership transfer a follower passes on.)
        KIND_RAFT => Message::parse_from_bytes(body)
            .map(|m| Input::Raft(Box::new(m)))
            .map_err(|e| format!("undecodable Raft message: {e}")),
        KIND_CTL => {
            serde_json::from_slice(body).map(|c| Input::Ctl(from, c)).map_err(|e| format!("undecodable request: {e}"))
        }
        KIND_FETCHED => decode_fetched(from, body).ok_or_else(|| "undecodable fetched batches".to_string()),
        k => Err(format!("unknown frame kind {k}")),
    }
}

#[allow(clippy::too_many_arguments)]
fn encode_fetched(
    epoch: u64,
    stream: usize,
    req: u64,
    position: u64,
    piece: u32,
    last: bool,
    more: bool,
    batches: &[&[u8]],
) -> Vec<u8> {
    debug_assert!(!more || (batches.len() == 1 && !last), "a part is a piece's one entry, never the last");
    let mut b = Vec::with_capacity(FETCHED_HEADER + batches.iter().map(|x| x.len() + 4).sum::<usize>());
    b.extend_from_slice(&epoch.to_le_bytes());
    b.extend_from_slice(&(stream as u32).to_le_bytes());
    b.extend_from_slice(&req.to_le_bytes());
    b.extend_from_slice(&position.to_le_bytes());
    b.extend_from_slice(&piece.to_le_bytes());
    b.push(last as u8 | (more as u8) << 1);
    b.extend_from_slice(&(batches.len() as u32).to_le_bytes());
    for x in batches {
        b.extend_from_slice(&(x.len() as u32).to_le_bytes());
        b.extend_from_slice(x);
    }
    b
}

fn decode_fetched(from: NodeId, mut body: &[u8]) -> Option<Input> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (h, t) = (b.get(..n)?, b.get(n..)?);
        *b = t;
        Some(h)
    }
    let epoch = u64::from_le_bytes(take(&mut body, 8)?.try_into().ok()?);
    let stream = u32::from_le_bytes(take(&mut body, 4)?.try_into().ok()?) as usize;
    let req = u64::from_le_bytes(take(&mut body, 8)?.try_into().ok()?);
    let position = u64::from_le_bytes(take(&mut body, 8)?.try_into().ok()?);
    let piece = u32::from_le_bytes(take(&mut body, 4)?.try_into().ok()?);
    let (last, more) = match take(&mut body, 1)?[0] {
        0 => (false, false),
        1 => (true, false),
        2 => (false, true),
        _ => return None,
    };
    let n = u32::from_le_bytes(take(&mut body, 4)?.try_into().ok()?) as usize;
    if more && n != 1 {
        return None;
    }
    let mut batches = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let len = u32::from_le_bytes(take(&mut body, 4)?.try_into().ok()?) as usize;
        batches.push(take(&mut body, len)?.to_vec());
    }
    body.is_empty().then_some(Input::Fetched { from, epoch, stream, req, position, piece, last, more, batches })
}

/// Whether `plan` fetches `stream` from `from`.
fn asks(plan: &RecoveryPlan, from: NodeId, stream: usize) -> bool {
    plan.fetch.iter().any(|f| f.stream == stream && f.from == from)
}

/// A piece of a fetch answer (`fetch_pieces`).
#[cfg(test)]
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    /// These batches, whole.
    Whole(std::ops::Range<usize>),
    /// These bytes of one batch larger than a piece; `more`: the next piece continues it.
    Part { batch: usize, bytes: std::ops::Range<usize>, more: bool },
}

/// The batches of a fetch answer split into pieces of at most `FETCH_PIECE` bytes: whole
/// batches together, and each batch larger than a piece alone, in parts (one piece, empty,
/// for no batches). The whole answer at once, as ranges of `batches`: the tests' statement
/// of what `Piecer` and `Answer` give one batch at a time.
#[cfg(test)]
fn fetch_pieces(batches: &[Vec<u8>]) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, b) in batches.iter().enumerate() {
        if b.len() + 4 > FETCH_PIECE {
            if i > start {
                pieces.push(Piece::Whole(start..i));
            }
            let mut at = 0;
            while at < b.len() {
                let end = (at + FETCH_PIECE).min(b.len());
                pieces.push(Piece::Part { batch: i, bytes: at..end, more: end < b.len() });
                at = end;
            }
            (start, bytes) = (i + 1, 0);
            continue;
        }
        if i > start && bytes + b.len() + 4 > FETCH_PIECE {
            pieces.push(Piece::Whole(start..i));
            (start, bytes) = (i, 0);
        }
        bytes += b.len() + 4;
    }
    if start < batches.len() || pieces.is_empty() {
        pieces.push(Piece::Whole(start..batches.len()));
    }
    pieces
}

/// One stream's fetch answer, its pieces put back together in order. Pure, for tests.
#[derive(Debug, Default)]
struct FetchAssembly {
    /// The next piece due (`u32::MAX`: one was missed, and the fetch ended).
    next: u32,
    /// The parts so far of a batch larger than a piece.
    partial: Vec<u8>,
}

impl FetchAssembly {
    /// Takes piece `piece` (`more`: its one entry is a part, continued by the next): the
    /// whole batches it brings, none while a batch's parts come, or why this stream's fetch
    /// ends (a piece out of order, a batch too large, a last part missing). After an
    /// end, every later piece brings nothing.
    fn take(&mut self, piece: u32, more: bool, mut batches: Vec<Vec<u8>>) -> Result<Option<Vec<Vec<u8>>>, String> {
        if self.next == u32::MAX {
            return Ok(None);
        }
        let due = self.next;
        let end = |s: &mut FetchAssembly, why: String| {
            s.next = u32::MAX;
            s.partial = Vec::new();
            Err(why)
        };
        if piece != due {
            return end(self, format!("piece {piece} came where {due} was due"));
        }
        self.next += 1;
        let joins = more || !self.partial.is_empty();
        if more && batches.len() != 1 {
            return end(self, "a part not alone in its piece".to_string());
        }
        if joins && batches.is_empty() {
            return end(self, "a batch's last part is missing".to_string());
        }
        if joins && self.partial.len() + batches[0].len() > FETCHED_BATCH_MAX {
            return end(self, format!("a batch over {FETCHED_BATCH_MAX} bytes"));
        }
        if more {
            self.partial.extend_from_slice(&batches[0]);
            return Ok(None);
        }
        if joins {
            let mut whole = std::mem::take(&mut self.partial);
            whole.extend_from_slice(&batches[0]);
            batches[0] = whole;
        }
        Ok(Some(batches))
    }
}

/// A connection's hello, answered: whether it was taken (a refusal is answered with why,
/// counted and logged).
fn take_hello(stream: &mut TcpStream, peer: SocketAddr, shared: &Shared, until: Instant) -> Option<NodeId> {
    // A peer that does not say its whole hello in time is dropped; one that was taken
    // may be idle for long.
    let _ = stream.set_write_timeout(Some(HELLO_TIMEOUT));
    let why = match hello_exchange(stream, shared, until) {
        // (An id removed from the cluster, as this node applied it.)
        Ok(from) if shared.status.lock().unwrap().state.retired.contains(&from) => format!("{REMOVED} (node {from})"),
        Ok(from) => {
            let _ = stream.set_read_timeout(None);
            let _ = stream.set_write_timeout(None);
            return stream.write_all(&frame(shared.id, KIND_HELLO, &[])).is_ok().then_some(from);
        }
        Err(HelloEnd::Refuse(why)) => why,
        Err(HelloEnd::Gone(why)) => {
            if let Some(why) = why {
                shared.refused(peer, &why);
            }
            return None;
        }
    };
    shared.refused(peer, &why);
    let _ = stream.write_all(&frame(shared.id, KIND_HELLO, why.as_bytes()));
    None
}

/// How a hello's exchange ended short of taking the connection (`hello_exchange`).
enum HelloEnd {
    /// Refused, and why: answered with it, counted.
    Refuse(String),
    /// The peer left, or refused this node's proof (why, then, counted): nothing to answer.
    Gone(Option<String>),
}

/// Reads a connection's hello and, where both sides hold a secret, proves this node holds
/// it and checks the peer's proof (`KIND_HELLO`): the node the hello named, once the
/// connection may be taken.
fn hello_exchange(stream: &mut TcpStream, shared: &Shared, until: Instant) -> Result<NodeId, HelloEnd> {
    let read = |stream: &mut TcpStream| match read_frame_at_most(&mut Until::new(&*stream, until), HELLO_MAX) {
        Ok(Some((from, KIND_HELLO, body))) => Ok((from, body)),
        Ok(Some((_, kind, _))) => {
            Err(HelloEnd::Refuse(format!("a frame of kind {kind} before its hello (a node of an older ditto?)")))
        }
        Ok(None) => Err(HelloEnd::Gone(None)),
        Err(_) if shared.stop.load(Ordering::SeqCst) => Err(HelloEnd::Gone(None)),
        Err(e) if timed_out(&e) => Err(HelloEnd::Refuse(format!("no whole hello within {HELLO_WAIT:?}"))),
        Err(e) => Err(HelloEnd::Refuse(format!("its hello: {e}"))),
    };
    let (from, body) = read(stream)?;
    let (holds, theirs) = hello::read_opening(&body).map_err(HelloEnd::Refuse)?;
    if let Some(why) = hello_refusal(shared.secret.as_ref(), holds) {
        return Err(HelloEnd::Refuse(why.into()));
    }
    let Some(secret) = shared.secret.as_ref() else { return Ok(from) };
    let ours = proof::nonce();
    let names = hello::names(from, shared.id);
    let t = hello::transcript(&names, &theirs, &ours);
    let challenge = hello::challenge(&ours, &proof::prove(&secret.shown, Side::Accepts, &t));
    if stream.write_all(&frame(shared.id, KIND_HELLO, &challenge)).is_err() {
        return Err(HelloEnd::Gone(None));
    }
    let (again, body) = read(stream)?;
    match hello::read_response(&body) {
        _ if again != from => Err(HelloEnd::Refuse(format!("a hello from node {again} after one from node {from}"))),
        Some(p) if proof::verify(secret.all(), Side::Connects, &t, p) => Ok(from),
        Some(_) => Err(HelloEnd::Refuse(WRONG_SECRET.into())),
        None if body.first().is_none_or(|&b| b == HELLO_MARK) => {
            Err(HelloEnd::Refuse(format!("a malformed hello of {} bytes", body.len())))
        }
        None if body == WRONG_NODE => Err(HelloEnd::Gone(Some(format!(
            "it expected another node at this address, saying {:?}",
            String::from_utf8_lossy(&body)
        )))),
        None => Err(HelloEnd::Gone(Some(format!(
            "a wrong cluster secret on one side (--cluster-secret-file): it refused this node's proof of the secret, saying {:?}",
            String::from_utf8_lossy(&body)
        )))),
    }
}

/// The connection a hello is read from: `stream` itself on a plaintext port, the TLS
/// tunnel's end on a TLS one (`tls_cluster`). A connection that opens otherwise than the
/// port speaks is refused, counted and said (a plaintext one in plaintext, with a hello
/// frame saying why).
fn tls_for(stream: TcpStream, peer: SocketAddr, shared: &Shared, until: Instant) -> Option<TcpStream> {
    let within = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let opens = match opens_with_tls(&stream, within) {
        Ok(o) => o,
        Err(_) => return None,
    };
    // The service stopping shut the socket: it read as nothing, not as plaintext.
    if shared.stop.load(Ordering::SeqCst) {
        return None;
    }
    let _ = stream.set_read_timeout(None);
    match (&shared.tls, opens) {
        (None, false) => Some(stream),
        (None, true) => {
            shared.refused(peer, "it opened with TLS, and this control port is plaintext: set tls_cluster on every node (and give `ditto cluster` the TLS files), or on none");
            None
        }
        (Some(_), false) => {
            let why = "this control port takes only TLS (tls_cluster): set it on every node, and give `ditto cluster` --tls-cert-file, --tls-key-file and --tls-ca-cert-file";
            shared.refused(peer, why);
            // Its hello read first: a socket closed with bytes unread resets the
            // connection, and the peer may lose the answer.
            let _ = read_frame_at_most(&mut Until::new(&stream, until), HELLO_MAX);
            let _ = stream.set_write_timeout(Some(HELLO_TIMEOUT));
            let _ = (&stream).write_all(&frame(shared.id, KIND_HELLO, why.as_bytes()));
            None
        }
        (Some(t), true) => {
            match t.accept_within(stream, until.saturating_duration_since(Instant::now()).min(t.handshake())) {
                Ok(s) => Some(s),
                Err(e) => {
                    shared.refused(peer, &e.to_string());
                    None
                }
            }
        }
    }
}

fn read_from(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, inbox: SyncSender<Input>, slot: HelloSlot) {
    let _ = stream.set_nonblocking(false);
    // Its reads wait with no timeout once the hello is taken: a peer gone without a FIN
    // (power, network) is found by the kernel's probes, and this thread ends.
    let _ = ditto_replication::tls::keep_alive(&stream);
    // One deadline for the peek, the TLS handshake if any (given the node's
    // `tls_handshake_timeout_s`, as its servers' ports give theirs), and the hello.
    let until = Instant::now() + HELLO_WAIT + shared.tls.as_ref().map_or(Duration::ZERO, |t| t.handshake());
    let taken =
        tls_for(stream, peer, &shared, until).and_then(|mut s| Some((take_hello(&mut s, peer, &shared, until)?, s)));
    drop(slot);
    // The node the hello named (0: an operator): every frame after it on this connection
    // is that node's, so that one peer cannot speak for another.
    let Some((hello_from, stream)) = taken else { return };
    let frames = read_frames(hello_from, stream, peer, &shared, &inbox);
    if frames > 0 && hello_from != 0 && !shared.stop.load(Ordering::SeqCst) {
        shared.probe.lock().unwrap().insert(hello_from);
    }
}

/// Reads the frames of node `hello_from` on `stream` until it ends; how many it read.
fn read_frames(
    hello_from: NodeId,
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    inbox: &SyncSender<Input>,
) -> u64 {
    let mut frames = 0;
    let mut buf = std::io::BufReader::new(stream);
    while !shared.stop.load(Ordering::SeqCst) {
        let got = read_frame(&mut buf);
        if matches!(got, Ok(Some(_))) {
            frames += 1;
        }
        let why = match got {
            Ok(Some((from, kind, _))) if from != hello_from || (from == 0 && kind != KIND_ADMIN) => {
                format!(
                    "a frame of kind {kind} from node {from} on a connection whose hello came from node {hello_from}"
                )
            }
            Ok(Some((_, KIND_ADMIN, body))) => match serde_json::from_slice::<AdminRequest>(&body) {
                Ok(req) => {
                    tracing::info!(%peer, "control: an operator asks {req:?}");
                    let (tx, rx) = mpsc::channel();
                    if inbox.send(Input::Admin(req, tx)).is_err() {
                        return frames;
                    }
                    let reply = rx.recv_timeout(ADMIN_TIMEOUT + Duration::from_secs(2)).unwrap_or_else(|_| {
                        AdminReply::Busy("the control node did not answer in time; see `ditto cluster status`".into())
                    });
                    let f = frame(0, KIND_ADMIN, &serde_json::to_vec(&reply).expect("replies serialise"));
                    if buf.get_mut().write_all(&f).is_err() {
                        return frames;
                    }
                    continue;
                }
                Err(e) => format!("undecodable operator request: {e}"),
            },
            // A node removed since its hello (one that missed the entry removing it goes
            // on sending on the connections it has): the connection closes, and the hello
            // of its next one is refused as removed, which stops its node.
            Ok(Some(_)) if shared.status.lock().unwrap().state.retired.contains(&hello_from) => {
                format!("node {hello_from} was removed from the cluster since its hello")
            }
            Ok(Some((from, kind, body))) => match decode(from, kind, &body) {
                Ok(input) => {
                    if inbox.send(input).is_err() {
                        return frames;
                    }
                    continue;
                }
                Err(why) => why,
            },
            Ok(None) => return frames,
            Err(_) if shared.stop.load(Ordering::SeqCst) => return frames,
            Err(e) => e.to_string(),
        };
        tracing::warn!(%peer, "dropping a control connection: {why}");
        return frames;
    }
    frames
}

fn send_to(peer: NodeId, addr: SocketAddr, name: String, rx: Receiver<Outgoing>, shared: Arc<Shared>) {
    let mut conn: Option<TcpStream> = None;
    let mut retry_at = Instant::now();
    // The peer's last refusal, and when it was logged (again only when it changes, or
    // after a minute).
    let mut refused: Option<(String, Instant)> = None;
    while !shared.stop.load(Ordering::SeqCst) {
        // The peer's connection here ended (`Shared::probe`): a hello on a connection of
        // this node's own, closed at once, tells whether the peer removed this node. (Not
        // on `conn`: closing a connection that carried frames asks the peer for a probe.)
        if shared.probe.lock().unwrap().remove(&peer) {
            let secret = shared.secret.as_ref();
            if let Err(e) =
                connect(addr, &name, shared.id, Some(peer), secret, shared.tls.as_deref(), Duration::from_millis(200))
            {
                if is_trusted_refusal(&e) && shared.note_removed(peer, &e.to_string()) {
                    tracing::warn!("control: {e}");
                }
            }
        }
        let (f, written) = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(f) => f,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if conn.is_none() && Instant::now() >= retry_at {
            let secret = shared.secret.as_ref();
            match connect(addr, &name, shared.id, Some(peer), secret, shared.tls.as_deref(), Duration::from_millis(200))
            {
                Ok(s) => {
                    let _ = s.set_read_timeout(None);
                    let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
                    conn = Some(s);
                    refused = None;
                }
                // Refused for its secret or its TLS: said, and tried again each second (the
                // peer's or this node's file may be mended, and the node restarted).
                Err(e) if is_refused(&e) => {
                    let why = e.to_string();
                    if is_trusted_refusal(&e) {
                        shared.note_removed(peer, &why);
                    }
                    if refused.as_ref().is_none_or(|(w, t)| *w != why || t.elapsed() >= Duration::from_secs(60)) {
                        tracing::warn!("control: {why}");
                        refused = Some((why, Instant::now()));
                    }
                    retry_at = Instant::now() + Duration::from_secs(1);
                }
                Err(_) => retry_at = Instant::now() + Duration::from_millis(50),
            }
        }
        // Without a connection the frame is dropped: Raft sends again (and a fetch's
        // round asks again).
        if let Some(s) = conn.as_mut() {
            if s.write_all(&f).is_err() {
                conn = None;
            }
        }
        if let Some(w) = written {
            let _ = w.try_send(());
        }
    }
}

struct Run {
    node: ControlNode,
    disk: FileDisk,
    data: Box<dyn DataPlane>,
    senders: BTreeMap<NodeId, SyncSender<Outgoing>>,
    sender_threads: Vec<JoinHandle<()>>,
    /// The control addresses the node was started with (the peers before the bootstrap,
    /// and of members whose control port the state does not know).
    config_peers: BTreeMap<NodeId, SocketAddr>,
    /// `ServiceConfig::hosts`.
    hosts: BTreeMap<NodeId, String>,
    /// Operators' membership changes proposed here: the index, the change, the answer,
    /// and until when to wait.
    admin: Vec<(u64, Command, Sender<AdminReply>, Instant)>,
    shared: Arc<Shared>,
    tick: Duration,
    coord: Coordinator,
    /// A plan this node prepares for, and the coordinator to answer.
    preparing: Option<(RecoveryPlan, NodeId)>,
    /// The last plan this node answered (`Prepared`, or `Unprepared` with why) while no
    /// other prepare has started since: sent again, it is answered the same again (the
    /// answer may have been lost, or gone to a coordinator that no longer leads), not
    /// prepared over.
    answered: Option<(RecoveryPlan, Ctl)>,
    /// Names this node's prepare under way in its fetches and their answers
    /// (`KIND_FETCHED`): one more for each prepare, from a number of this run's own (a
    /// restarted node's first cannot match an answer queued for its last run).
    fetch_req: u64,
    /// Per stream the plan fetches: the answer's pieces put back together.
    fetch_in: BTreeMap<usize, FetchAssembly>,
    /// Fetches asked of this node, to the fetch thread (`serve_fetches`).
    fetches: Sender<FetchToServe>,
    /// The failover round whose want of a source was last logged.
    no_source_logged: u64,
    /// A report asked for (by this node, for this epoch) that the data plane could not
    /// give yet: given as soon as it can (`DataPlane::report_ready`).
    report_owed: Option<(NodeId, u64)>,
    /// The data plane was told this node's state is up to date (`DataPlane::caught_up`).
    told_caught_up: bool,
    /// A member's control address did not resolve at the last `sync_peers`: it is tried
    /// again at this time.
    resync_at: Option<Instant>,
}

impl Run {
    /// Keeps one sender per peer: the members of the state once bootstrapped (a member
    /// added gets one, a member removed loses its own), before it the configured peers.
    fn sync_peers(&mut self) {
        let me = self.node.id();
        let st = self.node.state();
        // Members whose control address did not resolve (a passing DNS failure): their
        // sender, if they have one, is kept, and they are tried again in a second. (Before
        // 2026-12-06 such a member was dropped from the wanted list without a word, its
        // sender with it, and heard nothing from this node until the next membership
        // change; and a bracketed IPv6 literal never resolved. Found by a review.)
        let mut unresolved: Vec<(NodeId, String)> = Vec::new();
        let want: BTreeMap<NodeId, SocketAddr> = if st.epoch == 0 {
            self.config_peers.clone()
        } else {
            // The node's own configuration first (it may route through a proxy or a
            // tunnel of its own); members added since are reached where they were added.
            st.members
                .values()
                .chain(st.learners.values())
                .filter_map(|m| {
                    if let Some(a) = self.config_peers.get(&m.id) {
                        return Some((m.id, *a));
                    }
                    if m.control == 0 {
                        return None;
                    }
                    let host = m.host().trim_start_matches('[').trim_end_matches(']');
                    match std::net::ToSocketAddrs::to_socket_addrs(&(host, m.control)).map(|mut a| a.next()) {
                        Ok(Some(a)) => Some((m.id, a)),
                        Ok(None) => {
                            unresolved.push((m.id, format!("{}:{}: no address", m.host(), m.control)));
                            None
                        }
                        Err(e) => {
                            unresolved.push((m.id, format!("{}:{}: {e}", m.host(), m.control)));
                            None
                        }
                    }
                })
                .collect()
        };
        for (id, why) in &unresolved {
            tracing::warn!(
                "control node {me}: member {id}'s control address does not resolve ({why}); tried again in 1 s"
            );
        }
        self.resync_at = (!unresolved.is_empty()).then(|| Instant::now() + Duration::from_secs(1));
        self.senders.retain(|id, _| want.contains_key(id) || unresolved.iter().any(|(u, _)| u == id));
        for (&peer, &addr) in want.iter().filter(|(&p, _)| p != me) {
            if self.senders.contains_key(&peer) {
                continue;
            }
            let (tx, rx) = mpsc::sync_channel(PEER_QUEUE);
            self.senders.insert(peer, tx);
            let shared = Arc::clone(&self.shared);
            // The name its certificate must carry: its host in --members, else as added.
            let name = (self.hosts.get(&peer).map(String::as_str))
                .or_else(|| st.node(peer).map(|m| m.host()))
                .map_or_else(|| addr.ip().to_string(), |h| cert_name(h).to_string());
            self.sender_threads
                .push(spawn(format!("ditto-ctl-send-{me}-{peer}"), move || send_to(peer, addr, name, rx, shared)));
        }
        self.sender_threads.retain(|t| !t.is_finished());
    }

    /// The control address of `id`, as this node knows it.
    fn control_addr(&self, id: NodeId) -> Option<String> {
        if let Some(a) = self.config_peers.get(&id) {
            // By its host as configured (what its certificate names), not the address
            // it resolved to.
            return Some(self.hosts.get(&id).map_or_else(|| a.to_string(), |h| format!("{h}:{}", a.port())));
        }
        let m = self.node.state().node(id).filter(|m| m.control != 0)?;
        Some(format!("{}:{}", m.host(), m.control))
    }

    /// An operator's membership change: proposed here if this node leads; answered once
    /// it is applied (`answer_admin`).
    fn on_admin(&mut self, req: AdminRequest, reply: Sender<AdminReply>, now: u64) {
        if !self.node.leads_current() {
            let leader = self.node.leader().filter(|&l| l != self.node.id());
            let _ = reply.send(AdminReply::NotLeader { leader, addr: leader.and_then(|l| self.control_addr(l)) });
            return;
        }
        if let AdminRequest::Add(m) | AdminRequest::AddLearner(m) = &req {
            // Checked before it is proposed: once in the Raft log, an entry too large for a
            // frame would stop the log (every follower drops the message that carries it).
            if let Err(why) = crate::state::check_member_addr(&m.addr) {
                let _ = reply.send(AdminReply::Refused(why));
                return;
            }
        }
        let cmd = match req {
            AdminRequest::Add(member) => Command::AddMember { member },
            AdminRequest::AddLearner(member) => Command::AddLearner { member },
            AdminRequest::Remove(id) => Command::RemoveMember { id },
            AdminRequest::Switchover { to } => {
                let st = self.node.state();
                let Some(from) = st.primary() else {
                    let why = format!("epoch {} is failing over; ask again once it serves", st.epoch);
                    let _ = reply.send(AdminReply::Busy(why));
                    return;
                };
                let Some(to) = to.or_else(|| self.coord.successor(st, now)) else {
                    let why = "no member other than the primary is heard from: name one (--to)".to_string();
                    let _ = reply.send(AdminReply::Refused(why));
                    return;
                };
                Command::Switchover { epoch: st.epoch, from, to }
            }
        };
        let proposed = match &cmd {
            Command::Switchover { .. } => self.node.propose_checked(&cmd),
            _ => self.node.propose_membership(&cmd),
        };
        match proposed {
            Ok(index) => {
                tracing::info!(node = self.node.id(), index, "control: proposing {cmd:?}");
                self.admin.push((index, cmd, reply, Instant::now() + ADMIN_TIMEOUT));
            }
            Err(NodeError::Busy(why)) => {
                let _ = reply.send(AdminReply::Busy(why));
            }
            // Refused for what passes (a switchover asked before the primary settled its
            // membership: after a failover, until a majority holds what it started with).
            Err(NodeError::Refused(why)) if self.node.state().refusal_passes(&why) => {
                let _ = reply.send(AdminReply::Busy(why));
            }
            Err(e) => {
                let _ = reply.send(AdminReply::Refused(e.to_string()));
            }
        }
    }

    /// Answers the operators whose change was applied (or refused, or lost) at `index`,
    /// and those who waited too long.
    fn answer_admin(&mut self, applied: Option<(u64, &Command, &Result<(), String>)>) {
        let now = Instant::now();
        let state = self.node.state();
        self.admin.retain(|(index, cmd, reply, deadline)| {
            let answer = match applied {
                Some((i, c, outcome)) if i == *index => Some(match (c == cmd, outcome) {
                    (true, Ok(())) => AdminReply::Done {
                        config: state.config,
                        members: state.members.values().cloned().collect(),
                        epoch: state.epoch,
                        primary: state.primary(),
                    },
                    // Refused for what passes (a failover or a switchover ordered before it,
                    // a change not settled yet): asked again, not given up.
                    (true, Err(why))
                        if (cmd.changes_membership() || matches!(cmd, Command::Switchover { .. }))
                            && state.refusal_passes(why) =>
                    {
                        AdminReply::Busy(why.clone())
                    }
                    (true, Err(why)) => AdminReply::Refused(why.clone()),
                    (false, _) => AdminReply::Busy("the proposal was lost to a change of leader; ask again".into()),
                }),
                _ if now >= *deadline => Some(AdminReply::Busy(format!(
                    "not applied within {ADMIN_TIMEOUT:?} (it may still be): see `ditto cluster status`"
                ))),
                _ => None,
            };
            match answer {
                Some(a) => {
                    let _ = reply.send(a);
                    false
                }
                None => true,
            }
        });
    }

    /// A frame to a peer's queue; dropped if the queue is full (the pieces of a fetch's
    /// answer, which must all arrive, are queued by `serve_fetches`, which waits for room).
    fn send(&self, to: NodeId, kind: u8, body: &[u8]) {
        if let Some(tx) = self.senders.get(&to) {
            let _ = tx.try_send((frame(self.node.id(), kind, body), None));
        }
    }

    /// A prepare whose failover is over (an epoch opened, on another node since this one
    /// was chosen, or a later failover began) ends here and in the data plane: a peer's
    /// fetch thread is not stopped when the epoch moves on, and a late piece of its answer
    /// matched the prepare left behind, and was written into the directory of the server
    /// started since (found by a review; test
    /// `a_late_fetch_answer_after_the_failover_ended_elsewhere_is_not_taken`).
    fn abandon_if_over(&mut self) {
        let Some((plan, _)) = &self.preparing else { return };
        let st = self.node.state();
        if st.epoch == plan.epoch && st.phase == Some(crate::state::Phase::Failover) {
            return;
        }
        let (plan, _) = self.preparing.take().expect("checked");
        tracing::info!(node = self.node.id(), "the failover of epoch {} is over: its prepare here ends", plan.epoch);
        self.fetch_in.clear();
        self.data.abandoned(&plan);
    }

    /// The plan being prepared cannot be: what its fetches put together goes, and its
    /// coordinator is told why (`Ctl::Unprepared`), so the round ends without waiting
    /// for the prepare timeout.
    fn unprepared(&mut self, why: String, now: u64) -> Result<(), String> {
        let Some((plan, to)) = self.preparing.take() else { return Ok(()) };
        tracing::warn!(node = self.node.id(), "cannot prepare epoch {}: {why}", plan.epoch);
        self.fetch_in.clear();
        let no = Ctl::Unprepared { epoch: plan.epoch, point: plan.recovery_point, why };
        self.answered = Some((plan, no.clone()));
        self.ctl(to, no, now)
    }

    /// A request or answer to `to`; to this node itself it is handled in place.
    fn ctl(&mut self, to: NodeId, c: Ctl, now: u64) -> Result<(), String> {
        if to == self.node.id() {
            return self.on_ctl(to, c, now);
        }
        self.send(to, KIND_CTL, &serde_json::to_vec(&c).expect("control requests serialise"));
        Ok(())
    }

    fn act(&mut self, actions: Vec<Action>, now: u64) -> Result<(), String> {
        for a in actions {
            match a {
                Action::Propose(cmd) => {
                    tracing::info!(node = self.node.id(), "control: proposing {cmd:?}");
                    if let Err(e) = self.node.propose(&cmd) {
                        tracing::debug!("control: {e}");
                    }
                }
                Action::AskReport { to, epoch } => self.ctl(to, Ctl::AskReport { epoch }, now)?,
                Action::Prepare { to, plan } => {
                    tracing::info!(node = self.node.id(), "control: plan {plan:?}");
                    self.ctl(to, Ctl::Prepare(plan), now)?
                }
            }
        }
        Ok(())
    }

    /// A report owed (`report_owed`) given once the data plane has it, as the answer to
    /// the ask that found it not ready (the same checks again: a round over by now, the
    /// node's state past the epoch, and it is dropped). `Err`: the disk failed.
    fn give_owed_report(&mut self, now: u64) -> Result<(), String> {
        let Some((from, epoch)) = self.report_owed else { return Ok(()) };
        let st = self.node.state();
        let current = epoch > st.epoch || (epoch == st.epoch && st.phase == Some(crate::state::Phase::Failover));
        if !current {
            self.report_owed = None;
            return Ok(());
        }
        if !self.data.report_ready() {
            return Ok(());
        }
        self.report_owed = None;
        self.on_ctl(from, Ctl::AskReport { epoch }, now)
    }

    /// A coordinator's request or answer from `from`. `Err`: the disk failed.
    fn on_ctl(&mut self, from: NodeId, c: Ctl, now: u64) -> Result<(), String> {
        let leader = self.node.leads_current();
        match c {
            Ctl::AskReport { epoch } => {
                // A report is asked for the failover the leader's state has begun: one
                // epoch past this node's applied state at most (it may not have applied
                // that `BeginFailover` yet; a failover begins only the epoch after the
                // newest). A request for a farther epoch would fence this node, durably,
                // above every epoch the cluster reaches for a long time (it would refuse
                // every primary's batches): it is refused, and the coordinator's resend
                // finds this node caught up.
                let applied = self.node.state().epoch;
                if epoch > applied.saturating_add(1) {
                    tracing::warn!(
                        node = self.node.id(),
                        "node {from} asked a report for epoch {epoch}, past the next one ({}): ignored",
                        applied.saturating_add(1)
                    );
                    return Ok(());
                }
                if epoch > self.disk.fence() {
                    self.disk.set_fence(epoch).map_err(|e| format!("writing the fence: {e}"))?;
                    self.data.fenced(epoch);
                }
                let Some(open) = self.node.state().open_epoch().map(|e| e.epoch) else { return Ok(()) };
                match self.data.report() {
                    Ok(h) => {
                        let r = TailReport {
                            node: self.node.id(),
                            fenced_at: epoch,
                            epoch: open,
                            streams: h.streams,
                            newest: h.newest,
                            eligible: h.eligible,
                            serves_above: h.serves_above,
                            last_resort: h.last_resort,
                            own_epoch: h.own_epoch,
                            acked_ms_ago: h.acked_ms_ago,
                            took_writes: h.took_writes,
                        };
                        self.report_owed = None;
                        self.ctl(from, Ctl::Report(r), now)?;
                    }
                    Err(why) => {
                        tracing::warn!(node = self.node.id(), "no tail report for epoch {epoch}: {why}");
                        self.report_owed = Some((from, epoch));
                    }
                }
            }
            // (A report names its node: one from another node's connection is a node of
            // another configuration, refused, not counted as that node's.)
            Ctl::Report(r) if r.node != from => {
                tracing::warn!(node = self.node.id(), "a tail report of node {} from node {from}: ignored", r.node);
            }
            Ctl::Report(r) => {
                let a = self.coord.on_report(r, now, self.node.state(), leader);
                self.act(a, now)?;
            }
            Ctl::Prepare(plan) => {
                // Only for the failover this node is fenced at and its state is in (a plan
                // from a coordinator acting on an older state is ignored); the same plan
                // again (a resend) changes nothing.
                let state = self.node.state();
                let current = plan.epoch == self.disk.fence()
                    && state.epoch == plan.epoch
                    && state.phase == Some(crate::state::Phase::Failover);
                if !current {
                    return Ok(());
                }
                match (&mut self.preparing, &self.answered) {
                    // Sent again: the answer goes to whoever asks now (a new leader's
                    // coordinator may plan the same).
                    (Some((p, to)), _) if *p == plan => *to = from,
                    (None, Some((p, answer))) if *p == plan => {
                        let answer = answer.clone();
                        self.ctl(from, answer, now)?;
                    }
                    _ => {
                        self.answered = None;
                        self.fetch_in.clear();
                        self.fetch_req = self.fetch_req.wrapping_add(1);
                        self.data.prepare(&plan);
                        for f in &plan.fetch {
                            let req =
                                Ctl::Fetch { epoch: plan.epoch, stream: f.stream, after: f.after, req: self.fetch_req };
                            self.ctl(f.from, req, now)?;
                        }
                        self.preparing = Some((plan, from));
                    }
                }
            }
            Ctl::Fetch { epoch, stream, after, req } => {
                // Only once fenced at that failover: then nothing more is acknowledged here.
                if epoch <= self.disk.fence() && from != self.node.id() {
                    let Some(to) = self.senders.get(&from).cloned() else { return Ok(()) };
                    let job = self.data.fetch_job(stream, after);
                    if let Err(why) = &job {
                        tracing::warn!(node = self.node.id(), "cannot serve a fetch of stream {stream}: {why}");
                    }
                    let f = FetchToServe { job, to, from, me: self.node.id(), epoch, stream, req };
                    if self.fetches.send(f).is_err() {
                        tracing::warn!(node = self.node.id(), "the fetch thread has stopped");
                    }
                }
            }
            Ctl::Heard { epoch, primary } => {
                let st = self.node.state();
                if st.epoch == epoch && st.primary() == Some(primary) && from == primary {
                    self.coord.heard(primary, now);
                    self.coord.vouched(primary, now);
                }
            }
            Ctl::Prepared { epoch, point, discarded } => {
                let a = self.coord.on_prepared(from, epoch, point, discarded, now, self.node.state(), leader);
                self.act(a, now)?;
            }
            Ctl::FetchRefused { epoch, stream, req, why } => {
                // Only a refusal of a fetch the prepare under way asked of that node.
                let asked = |p: &RecoveryPlan| p.epoch == epoch && req == self.fetch_req && asks(p, from, stream);
                if self.preparing.as_ref().is_some_and(|(p, _)| asked(p)) {
                    let why = format!("node {from} cannot serve its fetch of stream {stream}: {why}");
                    self.unprepared(why, now)?;
                }
            }
            Ctl::Unprepared { epoch, point, why } => {
                tracing::warn!(node = self.node.id(), "node {from} cannot prepare epoch {epoch}: {why}");
                let a = self.coord.on_unprepared(from, epoch, point, why, now, self.node.state(), leader);
                self.act(a, now)?;
            }
        }
        Ok(())
    }

    fn run(mut self, rx: Receiver<Input>) {
        let id = self.node.id();
        let started = Instant::now();
        let replayed_upto = self.disk.durable().hard_state.commit;
        self.data.fenced(self.disk.fence());
        self.data.started(self.node.state());
        let mut next_tick = Instant::now() + self.tick;
        // Since when (ms) this leader has had entries committed and not applied at a tick.
        let mut unapplied_since: Option<u64> = None;
        let mut failed: Option<String> = None;
        let mut was_serving = false;
        // When the leader may next try to hand its leadership away (milliseconds).
        let mut next_transfer = 0u64;
        // When a primary may next record its settled membership.
        let mut next_settle = 0u64;
        // When this node, serving as primary with quorum contact, may next tell the others.
        let mut next_heard_report = 0u64;
        // The state is published when it changed (at first, and when a command applied).
        let mut state_changed = true;
        // When a Raft message for another node was last said.
        let mut wrong_to_said: Option<Instant> = None;
        while !self.shared.stop.load(Ordering::SeqCst) && failed.is_none() {
            if let Some(why) = self.shared.removed.lock().unwrap().take() {
                failed = Some(why);
                break;
            }
            if self.resync_at.is_some_and(|t| Instant::now() >= t) {
                self.sync_peers();
            }
            let input = rx.recv_timeout(next_tick.saturating_duration_since(Instant::now()));
            let now = started.elapsed().as_millis() as u64;
            let handled = Instant::now();
            let what = match &input {
                Ok(Input::Raft(_)) => "a Raft message",
                Ok(Input::Ctl(..)) => "a control request",
                Ok(Input::Fetched { .. }) => "fetched batches",
                Ok(Input::Propose(..)) => "a proposal",
                Ok(Input::Admin(..)) => "an operator's request",
                Ok(Input::Wake) => "news of the data plane",
                Err(_) => "",
            };
            let r = match input {
                // A message for another node (a wrong port in another's `--members`) is
                // said and dropped, not stepped as this node's (found by a review,
                // 2026-12-06).
                Ok(Input::Raft(m)) if m.to != id => {
                    // (Said at most once a second: such messages come every tick.)
                    if wrong_to_said.is_none_or(|t: Instant| t.elapsed() >= Duration::from_secs(1)) {
                        wrong_to_said = Some(Instant::now());
                        tracing::warn!(
                            "control node {id}: a Raft message from node {} for node {} dropped: a peer's --members may name this node's address for another",
                            m.from,
                            m.to
                        );
                    }
                    Ok(())
                }
                Ok(Input::Raft(m)) => {
                    self.coord.alive(m.from, now);
                    if let Err(e) = self.node.step(*m) {
                        tracing::debug!("control node {id}: {e}");
                    }
                    Ok(())
                }
                Ok(Input::Ctl(from, c)) => self.on_ctl(from, c, now),
                Ok(Input::Fetched { from, epoch, stream, req, position, piece, last, more, batches }) => {
                    // Only the answer to a fetch the prepare under way asked (a late answer
                    // to another plan of the same epoch, from another node or from another
                    // point, would start the stream's pieces over, or fill it from the
                    // wrong place), while its failover is under way.
                    self.abandon_if_over();
                    let asked = |p: &RecoveryPlan| p.epoch == epoch && req == self.fetch_req && asks(p, from, stream);
                    match self.preparing.as_ref().filter(|(p, _)| asked(p)) {
                        // Pieces come in order on one connection; a gap (a piece dropped
                        // by a full queue or a broken connection) ends this round's prepare.
                        Some((plan, _)) => match self.fetch_in.entry(stream).or_default().take(piece, more, batches) {
                            Ok(Some(batches)) => {
                                self.data.fetched(plan, stream, batches, position, last);
                                Ok(())
                            }
                            Ok(None) => Ok(()),
                            Err(why) => {
                                self.unprepared(format!("its fetch of stream {stream} from node {from}: {why}"), now)
                            }
                        },
                        None => Ok(()),
                    }
                }
                Ok(Input::Propose(cmd, reply)) => {
                    let _ = reply.send(self.node.propose(&cmd).map_err(|e| e.to_string()));
                    Ok(())
                }
                Ok(Input::Admin(req, reply)) => {
                    self.on_admin(req, reply, now);
                    Ok(())
                }
                Ok(Input::Wake) | Err(RecvTimeoutError::Timeout) => Ok(()),
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
            if let Err(e) = self.give_owed_report(now) {
                failed = Some(e);
                break;
            }
            // Contact counts afresh from when this node starts serving: only its own
            // epoch's acknowledgements count.
            let serving = self.data.serving();
            if serving && !was_serving {
                self.coord.reset_contact();
            }
            was_serving = serving;
            self.coord.set_serving(serving);
            self.coord.set_starting(self.data.starting());
            slow_step(id, what, handled);
            let t = Instant::now();
            let heard = self.data.heard();
            slow_step(id, "the data plane (starting, stopping and probing its server)", t);
            for (n, at) in heard {
                // (On the clock `now` counts on, rounded down: never later than `at`.)
                self.coord.heard(n, at.saturating_duration_since(started).as_millis() as u64);
            }
            // A primary with quorum contact tells every member so (see `Ctl::Heard`).
            let st = self.node.state();
            if serving && st.primary() == Some(id) && now >= next_heard_report && self.coord.has_quorum_contact(st, now)
            {
                next_heard_report = now + HEARD_EVERY_MS;
                let body =
                    serde_json::to_vec(&Ctl::Heard { epoch: st.epoch, primary: id }).expect("requests serialise");
                let peers: Vec<NodeId> = self.senders.keys().copied().collect();
                for to in peers {
                    self.send(to, KIND_CTL, &body);
                }
            }
            let t = Instant::now();
            let proposals = self.data.proposals();
            slow_step(id, "the data plane's proposals", t);
            for cmd in proposals {
                tracing::info!(node = id, "control: the data plane proposes {cmd:?}");
                if let Err(e) = self.node.propose_via_leader(&cmd) {
                    tracing::debug!("control: {e}");
                }
            }
            // A serving primary that has settled the current membership records it, so
            // that the next change may go ahead.
            if let (Some(c), Some(open)) = (self.data.settled(), self.node.state().open_epoch()) {
                let st = self.node.state();
                let cmd = Command::ConfigApplied { epoch: open.epoch, primary: id, config: c };
                if st.phase == Some(Phase::Serving)
                    && open.primary == id
                    && c == st.config
                    && st.settled != Some((open.epoch, c))
                    && now >= next_settle
                {
                    next_settle = now + self.coord.resend_timeout();
                    if let Err(e) = self.node.propose_via_leader(&cmd) {
                        tracing::debug!("control: {e}");
                    }
                }
            }
            self.abandon_if_over();
            if let Some((plan, to)) = self.preparing.take() {
                let outcome = self.data.prepared(&plan);
                if outcome.is_some() {
                    // Ended: what its fetches put together, or half did, goes.
                    self.fetch_in.clear();
                }
                match outcome {
                    None => self.preparing = Some((plan, to)),
                    Some(Ok(discarded)) => {
                        let done = Ctl::Prepared { epoch: plan.epoch, point: plan.recovery_point, discarded };
                        self.answered = Some((plan, done.clone()));
                        if let Err(e) = self.ctl(to, done, now) {
                            failed = Some(e);
                            break;
                        }
                    }
                    Some(Err(why)) => {
                        self.preparing = Some((plan, to));
                        if let Err(e) = self.unprepared(why, now) {
                            failed = Some(e);
                            break;
                        }
                    }
                }
            }
            if Instant::now() >= next_tick {
                self.node.tick();
                next_tick += self.tick;
                if next_tick < Instant::now() {
                    next_tick = Instant::now() + self.tick;
                }
                // A leader whose commit index a message just moved is not ticked as a
                // follower (which drops the round it leads: its reports, plan and prepare
                // timer) but waits for the `poll` below to apply the entries: the next
                // tick sees them (found by a review, 2026-12-03). Not for longer than a
                // quarter of a failure timeout, should applying ever lag that far (ticks
                // half a timeout apart count as a stall of this node's own loop).
                let behind = self.node.leads_unapplied();
                if !behind {
                    unapplied_since = None;
                }
                let unapplied = behind
                    && now.saturating_sub(*unapplied_since.get_or_insert(now)) < self.coord.failure_timeout() / 4;
                let (stalls, _) = self.coord.stalls();
                let a = if unapplied {
                    Vec::new()
                } else {
                    self.coord.tick(now, self.node.state(), self.node.leads_current())
                };
                let (n, ms) = self.coord.stalls();
                if n > stalls {
                    tracing::warn!(
                        node = id,
                        "control: this node's loop stalled ({ms} ms since its last tick): it counts others' silence afresh"
                    );
                }
                if let Err(e) = self.act(a, now) {
                    failed = Some(e);
                    break;
                }
                if let Some((epoch, e @ crate::failover::PlanError::NoSource)) = self.coord.unplanned() {
                    if self.no_source_logged != epoch {
                        self.no_source_logged = epoch;
                        tracing::warn!(node = id, "failover to epoch {epoch} waits for more reports: {e}");
                    }
                }
            }
            // The Raft state is made durable here, on this thread, and the commands that
            // committed are applied (the data plane's `applied`).
            let t = Instant::now();
            let poll = self.node.poll(&mut self.disk);
            slow_step(id, "persisting the Raft state", t);
            let t = Instant::now();
            match poll {
                Ok(out) => {
                    if out.restored {
                        tracing::info!(node = id, "control: the state was restored from the leader's snapshot");
                        self.data.restored(self.node.state());
                        self.shared.status.lock().unwrap().state.retired = self.node.state().retired.clone();
                        self.sync_peers();
                        state_changed = true;
                    }
                    for m in out.messages {
                        let to = m.to;
                        self.send(to, KIND_RAFT, &m.write_to_bytes().expect("raft messages encode"));
                    }
                    let mut members_changed = false;
                    for a in out.applied {
                        state_changed = true;
                        members_changed |=
                            matches!(a.command, Command::Bootstrap { .. }) || a.command.changes_membership();
                        self.answer_admin(Some((a.index, &a.command, &a.outcome)));
                        match &a.outcome {
                            Ok(()) => {
                                tracing::info!(node = id, index = a.index, "control: applied {:?}", a.command);
                                let live = a.index > replayed_upto;
                                if let Command::OpenEpoch { primary, writes_after_ms, .. } = &a.command {
                                    if *primary == id {
                                        let at = Instant::now() + Duration::from_millis(*writes_after_ms);
                                        self.shared.status.lock().unwrap().writes_not_before = Some(at);
                                        if *writes_after_ms > 0 {
                                            tracing::info!(
                                                node = id,
                                                "control: named primary; it takes writes in {writes_after_ms} ms, once the old primary's lease has run out"
                                            );
                                        }
                                    }
                                }
                                self.data.applied(&a.command, self.node.state(), live);
                            }
                            Err(why) => {
                                tracing::info!(node = id, index = a.index, "control: refused {:?}: {why}", a.command)
                            }
                        }
                    }
                    if members_changed {
                        // The removed ids published first: a removed node's probe, asked
                        // for by the sender `sync_peers` drops, must find them refused.
                        self.shared.status.lock().unwrap().state.retired = self.node.state().retired.clone();
                        self.sync_peers();
                    }
                    self.answer_admin(None);
                    if !self.told_caught_up && self.node.caught_up() {
                        self.told_caught_up = true;
                        tracing::info!(node = id, "control: its state is up to date (read index applied)");
                        self.data.caught_up();
                    }
                }
                Err(e) => failed = Some(e.to_string()),
            }
            slow_step(id, "applying committed commands", t);
            let mut s = self.shared.status.lock().unwrap();
            s.leader = self.node.leader();
            s.voters = self.node.voters();
            s.learners = self.node.learners();
            s.term = self.node.term();
            let contact_was = s.quorum_contact;
            let changed = std::mem::take(&mut state_changed);
            if changed {
                s.state = self.node.state().clone();
            }
            s.fence = self.disk.fence();
            s.quorum_contact = serving && self.coord.has_quorum_contact(self.node.state(), now);
            let changed = changed || s.quorum_contact != contact_was;
            // (On the clock `now` counts on: the time since this loop started.)
            s.contact_until = match s.quorum_contact {
                true => self.coord.contact_deadline(self.node.state(), now).map(|d| started + Duration::from_millis(d)),
                false => None,
            };
            s.published = Some(Instant::now());
            s.failover_waiting = self.coord.unplanned().map(|(e, why)| (e, why.to_string()));
            if changed {
                s.changes += 1;
                self.shared.status_changed.notify_all();
            }
            // The leader steps aside for a backup while it is also the serving primary: a
            // crash of the primary's machine then needs no election before its failover
            // can begin (docs/cluster.md, "Leader and primary apart").
            if s.quorum_contact && now >= next_transfer && self.node.leads_current() {
                // Only to a backup whose data plane it hears: the new leader must hear
                // this primary, or it would fail it over.
                let failure = self.coord.failure_timeout();
                let heard = |n: NodeId| self.coord.heard_within(n, now, failure / 2);
                if let Some(to) = self.node.up_to_date_peers().into_iter().find(|&n| heard(n)) {
                    tracing::info!(node = id, "control: the primary hands the Raft leadership to node {to}");
                    self.node.transfer_leader(to);
                    next_transfer = now + 1000;
                }
            }
        }
        if let Some(why) = failed {
            tracing::error!("control node {id} stops: {why}");
            self.shared.status.lock().unwrap().failed = Some(why);
        }
        self.senders.clear();
        for t in self.sender_threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A step of the control loop that held it for more than `SLOW_STEP`, logged with what it
/// was: the loop is one thread (Raft, the coordinator and the data plane), and a step
/// that waits (on the disk, on the node's server) holds all of it (docs/cluster.md).
fn slow_step(node: NodeId, what: &str, since: Instant) {
    let took = since.elapsed();
    if took > SLOW_STEP && !what.is_empty() {
        tracing::warn!(node, "control: {what} held the control loop {:.0} ms", took.as_secs_f64() * 1e3);
    }
}

/// See `slow_step`.
const SLOW_STEP: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    /// `serve_fetches` on a thread of its own, as a node runs it.
    /// A removal is taken from a majority of the other nodes this node knows, never from
    /// one of three (a stranger on one member's port); from any one where it knows none.
    #[test]
    fn a_removal_is_taken_from_a_majority_of_the_others() {
        let set = |v: &[NodeId]| v.iter().copied().collect::<std::collections::BTreeSet<NodeId>>();
        assert!(!removal_confirmed(&set(&[2]), &set(&[1, 2])), "one of two others");
        assert!(removal_confirmed(&set(&[1, 2]), &set(&[1, 2])));
        assert!(!removal_confirmed(&set(&[2, 3]), &set(&[1, 2, 4, 5])), "two of four");
        assert!(removal_confirmed(&set(&[2, 4, 5]), &set(&[1, 2, 4, 5])));
        assert!(!removal_confirmed(&set(&[7, 8, 9]), &set(&[1, 2])), "nodes it does not know count for nothing");
        assert!(removal_confirmed(&set(&[7]), &set(&[])), "any one where it knows none");
        assert!(!removal_confirmed(&set(&[]), &set(&[])));
    }

    struct FetchThread {
        shared: Arc<Shared>,
        jobs: mpsc::Sender<FetchToServe>,
        thread: JoinHandle<()>,
    }

    impl FetchThread {
        fn start() -> FetchThread {
            let shared = Arc::new(Shared {
                status: Mutex::new(Status::default()),
                status_changed: Default::default(),
                stop: AtomicBool::new(false),
                id: 1,
                secret: None,
                tls: None,
                refusals: Mutex::default(),
                unhelloed: Arc::new(Unhelloed::new(AWAITING_HELLO_MAX, AWAITING_HELLO_PER_ADDRESS_MAX)),
                removed: Default::default(),
                probe: Default::default(),
                removed_by: Default::default(),
            });
            let (jobs, rx) = mpsc::channel();
            let sh = Arc::clone(&shared);
            FetchThread { shared, jobs, thread: std::thread::spawn(move || serve_fetches(rx, sh)) }
        }

        fn stop(self) {
            self.shared.stop.store(true, Ordering::SeqCst);
            drop(self.jobs);
            self.thread.join().unwrap();
        }
    }

    /// A fetch's pieces go to the peer's sender one at a time: the next is queued only once
    /// the one before has been written, so at most one piece waits ahead of Raft's frames.
    #[test]
    fn a_fetch_answer_is_queued_a_piece_at_a_time() {
        let fetches = FetchThread::start();
        let jobs = &fetches.jobs;
        let (to, peer) = mpsc::sync_channel::<Outgoing>(PEER_QUEUE);
        let batches: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 300 << 10]).collect();
        let n = fetch_pieces(&batches).len();
        assert!(n >= 6, "{n} pieces");
        let job = FetchJob::ready(batches, 99);
        jobs.send(FetchToServe { job: Ok(job), to, from: 2, me: 1, epoch: 7, stream: 1, req: 5 }).unwrap();
        for i in 0..n {
            let (f, written) = peer.recv_timeout(Duration::from_secs(5)).expect("a piece");
            assert!(f.len() > FETCH_PIECE / 2, "piece {i}: {} bytes", f.len());
            // Nothing more is queued until this one is said written.
            std::thread::sleep(Duration::from_millis(30));
            assert!(peer.try_recv().is_err(), "piece {} queued before piece {i} was written", i + 1);
            written.expect("a fetch's piece asks to be told when written").send(()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(30));
        assert!(peer.try_recv().is_err(), "{n} pieces, no more");
        fetches.stop();
    }

    /// The pieces `serve_fetches` sends for a job that hands over `batches` one at a time
    /// (`Piecer`, `Answer`) are the whole answer's pieces (`fetch_pieces`), numbered, the
    /// last one marked, for answers of no batches, of small ones, of ones at a piece's
    /// bound and of ones larger than a piece, in random mixes.
    #[test]
    fn pieces_sent_as_the_batches_are_read_are_the_whole_answers_pieces() {
        use rand::{Rng, SeedableRng};
        let fetches = FetchThread::start();
        let jobs = &fetches.jobs;
        let mut rng = rand::rngs::StdRng::seed_from_u64(26);
        for case in 0..24 {
            let n = if case == 0 { 0 } else { rng.gen_range(1..12) };
            let batches: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    let len = match rng.gen_range(0..4) {
                        0 => rng.gen_range(1..(200 << 10)),
                        1 => FETCH_PIECE - 4 + rng.gen_range(0..3) - 1,
                        2 => rng.gen_range(FETCH_PIECE..FETCH_PIECE * 3),
                        _ => rng.gen_range((900 << 10)..(1100 << 10)),
                    };
                    vec![(i as u8).wrapping_mul(31).wrapping_add(case); len]
                })
                .collect();
            let want: Vec<(Vec<Vec<u8>>, bool)> = fetch_pieces(&batches)
                .into_iter()
                .map(|p| match p {
                    Piece::Whole(r) => (batches[r].to_vec(), false),
                    Piece::Part { batch, bytes, more } => (vec![batches[batch][bytes].to_vec()], more),
                })
                .collect();
            let (to, peer) = mpsc::sync_channel::<Outgoing>(PEER_QUEUE);
            jobs.send(FetchToServe {
                job: Ok(FetchJob::ready(batches, 99)),
                to,
                from: 2,
                me: 1,
                epoch: 7,
                stream: 1,
                req: 5,
            })
            .unwrap();
            for (i, (entries, more)) in want.iter().enumerate() {
                let (f, written) = peer.recv_timeout(Duration::from_secs(5)).expect("a piece");
                written.unwrap().send(()).unwrap();
                let (_, kind, body) = read_frame(&mut &f[..]).unwrap().unwrap();
                assert_eq!(kind, KIND_FETCHED);
                match decode_fetched(1, &body) {
                    Some(Input::Fetched {
                        epoch: 7,
                        stream: 1,
                        req: 5,
                        position: 99,
                        piece,
                        last,
                        more: m,
                        batches: b,
                        ..
                    }) => {
                        assert_eq!((piece, last, m), (i as u32, i + 1 == want.len(), *more), "case {case} piece {i}");
                        assert!(b == *entries, "case {case} piece {i}: other entries");
                    }
                    _ => panic!("case {case} piece {i} did not decode"),
                }
            }
            assert!(peer.recv_timeout(Duration::from_millis(50)).is_err(), "case {case}: no more pieces");
        }
        fetches.stop();
    }

    /// A fetch whose pieces cannot be sent (the peer's queue is gone) stops its read: the
    /// sink says so, and the read hands over no more than the pieces under way.
    #[test]
    fn a_fetch_whose_answer_cannot_be_sent_stops_reading() {
        let fetches = FetchThread::start();
        let (to, peer) = mpsc::sync_channel::<Outgoing>(PEER_QUEUE);
        drop(peer);
        let (done_tx, done) = mpsc::channel();
        let job = FetchJob {
            position: 99,
            read: Box::new(move |sink| {
                let mut handed = 0;
                while handed < 1000 && sink(vec![7; 300 << 10]) {
                    handed += 1;
                }
                done_tx.send(handed).unwrap();
                Ok(())
            }),
        };
        fetches.jobs.send(FetchToServe { job: Ok(job), to, from: 2, me: 1, epoch: 7, stream: 1, req: 5 }).unwrap();
        let handed = done.recv_timeout(Duration::from_secs(10)).expect("the read ended");
        // Two pieces of 6 batches: the first held back, the second's completion sends it.
        assert!(handed < 20, "the read went on for {handed} batches after its answer could not go");
        fetches.stop();
    }

    /// A read that fails after some pieces went sends no last piece (the fetcher does not
    /// take a partial answer for a whole one) and then says it refuses, and why.
    #[test]
    fn a_read_that_fails_midway_sends_no_last_piece() {
        let fetches = FetchThread::start();
        let (to, peer) = mpsc::sync_channel::<Outgoing>(PEER_QUEUE);
        let job = FetchJob {
            position: 99,
            read: Box::new(|sink| {
                for _ in 0..20 {
                    sink(vec![7; 300 << 10]);
                }
                Err("a segment damaged since the report".into())
            }),
        };
        fetches.jobs.send(FetchToServe { job: Ok(job), to, from: 2, me: 1, epoch: 7, stream: 1, req: 5 }).unwrap();
        let (mut pieces, mut refused) = (0, None);
        while let Ok((f, written)) = peer.recv_timeout(Duration::from_millis(500)) {
            written.unwrap().send(()).unwrap();
            let (_, kind, body) = read_frame(&mut &f[..]).unwrap().unwrap();
            assert!(refused.is_none(), "a frame after the refusal");
            if kind == KIND_CTL {
                refused = Some(serde_json::from_slice::<Ctl>(&body).unwrap());
                continue;
            }
            match decode_fetched(1, &body) {
                Some(Input::Fetched { piece, last, .. }) => {
                    assert_eq!(piece, pieces);
                    assert!(!last, "piece {piece} of a failed read is marked the last");
                }
                _ => panic!("piece {pieces} did not decode"),
            }
            pieces += 1;
        }
        assert!(pieces >= 2, "the pieces filled before the failure went: {pieces}");
        // Then the refusal, saying why, so that the fetcher's prepare ends at once.
        match refused {
            Some(Ctl::FetchRefused { epoch: 7, stream: 1, req: 5, why }) => {
                assert!(why.contains("a segment damaged since the report"), "{why}")
            }
            other => panic!("no refusal after the pieces: {other:?}"),
        }
        fetches.stop();
    }

    /// Quorum contact holds only while the control thread keeps publishing it: a status
    /// older than the failure timeout says no contact, whatever it said then.
    #[test]
    fn quorum_contact_lapses_when_the_status_is_not_published() {
        let failure = Duration::from_millis(250);
        let until = Some(Instant::now() + Duration::from_secs(60));
        let mut st = Status {
            quorum_contact: true,
            published: Some(Instant::now()),
            contact_until: until,
            ..Default::default()
        };
        assert!(st.contact_now(failure));
        st.published = Some(Instant::now() - Duration::from_millis(400));
        assert!(!st.contact_now(failure), "published 400 ms ago");
        st.published = None;
        assert!(!st.contact_now(failure), "never published");
        st = Status {
            quorum_contact: false,
            published: Some(Instant::now()),
            contact_until: until,
            ..Default::default()
        };
        assert!(!st.contact_now(failure));
        // Published a moment ago, but the last acknowledgement that made the quorum is a
        // failure timeout old by now: the lease is over, however fresh the publication.
        st = Status {
            quorum_contact: true,
            published: Some(Instant::now()),
            contact_until: Some(Instant::now() - Duration::from_millis(1)),
            ..Default::default()
        };
        assert!(!st.contact_now(failure), "past its lease");
        assert_eq!(st.writes_until(failure), None);
        // A new primary with contact takes writes only once the old primary's lease ran
        // out; then its gate is told the end of its own.
        st = Status {
            quorum_contact: true,
            published: Some(Instant::now()),
            contact_until: until,
            writes_not_before: Some(Instant::now() + Duration::from_secs(60)),
            ..Default::default()
        };
        assert!(st.contact_now(failure) && !st.takes_writes(failure));
        assert_eq!(st.writes_until(failure), None);
        st.writes_not_before = Some(Instant::now() - Duration::from_millis(1));
        assert!(st.takes_writes(failure));
        assert_eq!(st.writes_until(failure), until);
    }

    /// A fetch that cannot be served is refused from the fetch thread, which waits for room
    /// in the peer's queue: a full queue delays the refusal, and does not drop it (sent
    /// from the control thread, it was dropped, and the fetcher's round waited out its
    /// prepare timeout).
    #[test]
    fn a_refusal_waits_for_room_in_a_full_queue() {
        let fetches = FetchThread::start();
        let (to, peer) = mpsc::sync_channel::<Outgoing>(PEER_QUEUE);
        for _ in 0..PEER_QUEUE {
            to.try_send((b"raft".to_vec(), None)).unwrap();
        }
        assert!(to.try_send((b"raft".to_vec(), None)).is_err(), "the queue is full");
        let job = Err("the log no longer holds stream 1 above 40".to_string());
        fetches.jobs.send(FetchToServe { job, to, from: 2, me: 1, epoch: 7, stream: 1, req: 5 }).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..PEER_QUEUE {
            let (f, _) = peer.recv_timeout(Duration::from_secs(1)).expect("the frames queued before");
            assert_eq!(f, b"raft");
        }
        let (f, written) = peer.recv_timeout(Duration::from_secs(5)).expect("the refusal, once there is room");
        written.expect("a refusal waits until it is written").send(()).unwrap();
        let (_, kind, body) = read_frame(&mut &f[..]).unwrap().unwrap();
        assert_eq!(kind, KIND_CTL);
        match serde_json::from_slice::<Ctl>(&body).unwrap() {
            Ctl::FetchRefused { epoch: 7, stream: 1, req: 5, why } => assert!(why.contains("no longer holds"), "{why}"),
            other => panic!("not the refusal: {other:?}"),
        }
        fetches.stop();
    }

    /// Every piece of `batches`' answer encoded, decoded and put back together: the
    /// batches, and the largest frame body sent.
    fn round_trip(batches: &[Vec<u8>]) -> (Vec<Vec<u8>>, usize) {
        let pieces = fetch_pieces(batches);
        let (mut asm, mut got, mut largest) = (FetchAssembly::default(), Vec::new(), 0);
        for (i, p) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            let (entries, more): (Vec<&[u8]>, bool) = match p.clone() {
                Piece::Whole(r) => (batches[r].iter().map(|b| b.as_slice()).collect(), false),
                Piece::Part { batch, bytes, more } => (vec![&batches[batch][bytes]], more),
            };
            let body = encode_fetched(7, 1, 5, 99, i as u32, last, more, &entries);
            largest = largest.max(body.len());
            let mut bad = body.clone();
            bad[32] = 3; // the last piece and a part: never both
            assert!(decode_fetched(3, &bad).is_none());
            bad[32] = 4;
            assert!(decode_fetched(3, &bad).is_none(), "an unknown flag");
            assert!(decode_fetched(3, &body[..body.len() - 1]).is_none(), "cut short");
            match decode_fetched(3, &body) {
                Some(Input::Fetched {
                    from: 3,
                    epoch: 7,
                    stream: 1,
                    req: 5,
                    position: 99,
                    piece,
                    last: l,
                    more: m,
                    batches: b,
                }) => {
                    assert_eq!((piece, l, m), (i as u32, last, more));
                    got.extend(asm.take(piece, m, b).unwrap().unwrap_or_default());
                }
                _ => panic!("piece {i} did not decode"),
            }
        }
        (got, largest)
    }

    #[test]
    fn a_fetch_answer_goes_in_pieces_that_decode_back() {
        let batches: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 300 << 10]).collect();
        let pieces = fetch_pieces(&batches);
        assert!(pieces.len() >= 6, "{pieces:?}");
        let ranges: Vec<std::ops::Range<usize>> = pieces
            .iter()
            .map(|p| match p {
                Piece::Whole(r) => r.clone(),
                Piece::Part { .. } => panic!("no batch here is larger than a piece: {p:?}"),
            })
            .collect();
        assert_eq!((ranges.first().unwrap().start, ranges.last().unwrap().end), (0, 40));
        assert!(ranges.windows(2).all(|w| w[0].end == w[1].start), "contiguous: {ranges:?}");
        let (got, largest) = round_trip(&batches);
        assert_eq!(got, batches);
        assert!(largest <= FETCH_PIECE + FETCHED_HEADER + 4, "{largest}");
        assert_eq!(fetch_pieces(&[]), vec![Piece::Whole(0..0)], "no batches: one empty piece");
        assert_eq!(round_trip(&[]).0, Vec::<Vec<u8>>::new());
    }

    /// A batch larger than a piece (before: refused, so a failover that had to fetch it
    /// never completed) goes alone, in parts, and is put back together whole, in its
    /// place among the others; every frame stays within a piece.
    #[test]
    fn a_batch_larger_than_a_frame_goes_in_parts_and_is_put_back_together() {
        let numbered = |i: usize, len: usize| {
            let mut b: Vec<u8> = (0..len).map(|j| (j % 253) as u8 ^ i as u8).collect();
            b[..4].copy_from_slice(&(i as u32).to_le_bytes());
            b
        };
        let sizes = [100 << 10, (9 << 20) + 3, 5, 2 * FETCH_PIECE, FETCH_PIECE - 4, FETCH_PIECE - 3, 300 << 10];
        let batches: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| numbered(i, n)).collect();
        let pieces = fetch_pieces(&batches);
        let parts = pieces.iter().filter(|p| matches!(p, Piece::Part { .. })).count();
        assert_eq!(parts, 5 + 2 + 1, "9 MiB + 3 in five parts, 4 MiB in two, FETCH_PIECE - 3 in one: {pieces:?}");
        let (got, largest) = round_trip(&batches);
        assert_eq!(got.len(), batches.len());
        assert!(got == batches, "every batch whole and in order");
        assert!(largest <= FETCH_PIECE + FETCHED_HEADER + 4 && largest + FRAME_HEADER <= FRAME_MAX, "{largest}");
        // A large batch as the answer's last: its last part is the last piece; alone.
        let (got, _) = round_trip(&batches[..2]);
        assert!(got == batches[..2]);
        let (got, _) = round_trip(&batches[1..2]);
        assert!(got == batches[1..2]);
        let (got, _) = round_trip(&batches[3..]);
        assert!(got == batches[3..], "a large batch first");
    }

    /// Pieces out of order, a part not alone, a last part missing, a batch put back
    /// together beyond the largest: the stream's fetch ends, and later pieces bring nothing.
    #[test]
    fn a_fetch_assembly_ends_on_a_gap_or_a_malformed_batch() {
        let mut a = FetchAssembly::default();
        assert_eq!(a.take(0, false, vec![vec![1]]), Ok(Some(vec![vec![1]])));
        assert!(a.take(2, false, vec![vec![2]]).unwrap_err().contains("piece 2 came where 1 was due"));
        assert_eq!(a.take(1, false, vec![vec![2]]), Ok(None), "ended");
        let mut a = FetchAssembly::default();
        assert_eq!(a.take(0, true, vec![vec![1; 10]]), Ok(None));
        assert!(a.take(1, false, vec![]).unwrap_err().contains("last part is missing"));
        let mut a = FetchAssembly::default();
        assert!(a.take(0, true, vec![vec![1], vec![2]]).unwrap_err().contains("not alone"));
        let mut a = FetchAssembly { next: 0, partial: vec![0; FETCHED_BATCH_MAX - 2] };
        assert!(a.take(0, true, vec![vec![1; 3]]).unwrap_err().contains("a batch over"));
        assert!(a.partial.is_empty(), "what was put together is let go");
        let mut a = FetchAssembly { next: 0, partial: vec![0; FETCHED_BATCH_MAX - 2] };
        assert!(a.take(0, false, vec![vec![1; 3]]).unwrap_err().contains("a batch over"), "the last part too");
        assert!(a.partial.is_empty());
        let mut a = FetchAssembly::default();
        assert_eq!(a.take(0, true, vec![vec![1, 2]]), Ok(None));
        assert_eq!(a.take(1, true, vec![vec![3]]), Ok(None));
        assert_eq!(a.take(2, false, vec![vec![4], vec![5]]), Ok(Some(vec![vec![1, 2, 3, 4], vec![5]])));
    }

    #[test]
    fn frames_round_trip_and_damage_is_an_error() {
        let f = frame(7, KIND_RAFT, b"hello");
        assert_eq!(read_frame(&mut &f[..]).unwrap(), Some((7, KIND_RAFT, b"hello".to_vec())));
        assert_eq!(read_frame(&mut &[][..]).unwrap(), None);
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 1;
            assert!(read_frame(&mut &g[..]).is_err(), "byte {i}");
        }
        let mut huge = f.clone();
        huge[..4].copy_from_slice(&(FRAME_MAX as u32 + 1).to_le_bytes());
        assert!(read_frame(&mut &huge[..]).is_err());
    }

    #[test]
    fn a_hello_goes_on_only_where_both_sides_hold_a_secret_or_neither_does() {
        let s = ClusterSecret { shown: Secret("0123456789abcdef-x".into()), also: Vec::new() };
        assert_eq!(hello_refusal(None, false), None);
        assert_eq!(hello_refusal(Some(&s), true), None, "on to the proofs");
        assert!(hello_refusal(None, true).unwrap().contains("this node has none"));
        assert!(hello_refusal(Some(&s), false).unwrap().contains("none was given"));
    }

    /// The exchange's bodies, laid out and read back; anything else refused or not taken
    /// for one.
    #[test]
    fn a_hellos_bodies_are_read_back_as_laid_out_and_nothing_else_is() {
        let n = proof::nonce();
        for holds in [false, true] {
            let o = hello::opening(holds, &n);
            assert_eq!(o.len(), 35);
            assert_eq!(hello::read_opening(&o), Ok((holds, n)));
            // Cut short or grown by a byte, another version, an older ditto's (its secret,
            // or nothing).
            assert!(hello::read_opening(&o[..34]).unwrap_err().contains("malformed"));
            assert!(hello::read_opening(&[&o[..], &[0]].concat()).unwrap_err().contains("malformed"));
            let mut v2 = o.clone();
            v2[1] = 2;
            assert!(hello::read_opening(&v2).unwrap_err().contains("version 2"));
            let mut holds2 = o.clone();
            holds2[2] = 2;
            assert!(hello::read_opening(&holds2).unwrap_err().contains("malformed"));
        }
        for older in [&b""[..], b"0123456789abcdef-x"] {
            assert!(hello::read_opening(older).unwrap_err().contains("an older ditto"), "{older:?}");
        }
        let p = [9u8; proof::PROOF_BYTES];
        let c = hello::challenge(&n, &p);
        assert_eq!(hello::read_challenge(&c), Some((n, &p[..])));
        assert_eq!(hello::read_challenge(&c[..c.len() - 1]), None);
        assert_eq!(hello::read_challenge(&hello::response(&p)), None, "a response is no challenge");
        let r = hello::response(&p);
        assert_eq!(hello::read_response(&r), Some(&p[..]));
        assert_eq!(hello::read_response(&c), None, "a challenge is no response");
        assert_eq!(hello::read_response(WRONG_SECRET.as_bytes()), None, "a refusal is no response");
        assert_eq!(hello::read_response(b""), None);
    }

    /// Both sides' proofs, as `connect` and `hello_exchange` make and check them: the
    /// connection is taken where the side that connects takes the secret the other shows
    /// (it then proves with it), through a rotation's steps; neither side's proof is taken
    /// as the other's, nor for other nodes.
    #[test]
    fn each_side_takes_the_others_proof_only_for_a_secret_it_takes() {
        let with = |shown: &str, also: &[&str]| ClusterSecret {
            shown: Secret(shown.into()),
            also: also.iter().map(|s| Secret(s.to_string())).collect(),
        };
        let (old, new) = ("the-old-secret-00", "the-new-secret-00");
        // (connecting side, accepting side, taken both ways)
        for (c, a, taken) in [
            (with(old, &[]), with(old, &[]), true),
            (with(old, &[new]), with(old, &[]), true),
            (with(new, &[old]), with(old, &[new]), true),
            (with(new, &[]), with(new, &[old]), true),
            (with(new, &[]), with(old, &[]), false),
            (with(old, &[]), with(new, &[]), false),
            // The side that connects shows the new but also takes the old, which the other
            // shows: it proves with the old (`proof::matching`), which the other takes.
            (with(new, &[old]), with(old, &[]), true),
        ] {
            let (nc, na) = (proof::nonce(), proof::nonce());
            let names = hello::names(2, 3);
            let t = hello::transcript(&names, &nc, &na);
            let by_acceptor = proof::prove(&a.shown, Side::Accepts, &t);
            // As `connect`: proved with the secret the other side proved it holds, if any.
            let held = proof::matching(c.all(), Side::Accepts, &t, &by_acceptor);
            let both = held.is_some_and(|h| {
                let by_connector = proof::prove(h, Side::Connects, &t);
                proof::verify(a.all(), Side::Connects, &t, &by_connector)
            });
            assert_eq!(both, taken, "{:?} -> {:?}", c.shown.0, a.shown.0);
            // Never the other side's proof, nor for another pair of nodes.
            assert!(!proof::verify(a.all(), Side::Connects, &t, &by_acceptor));
            let other = hello::names(3, 2);
            assert!(!proof::verify(c.all(), Side::Accepts, &hello::transcript(&other, &nc, &na), &by_acceptor));
        }
    }

    #[test]
    fn a_first_frame_is_read_only_up_to_a_hellos_size() {
        let f = frame(3, KIND_HELLO, &[7; HELLO_MAX]);
        assert_eq!(read_frame_at_most(&mut &f[..], HELLO_MAX).unwrap(), Some((3, KIND_HELLO, vec![7; HELLO_MAX])));
        let f = frame(3, KIND_HELLO, &[7; HELLO_MAX + 1]);
        let e = read_frame_at_most(&mut &f[..], HELLO_MAX).unwrap_err();
        assert!(e.to_string().contains("a hello is at most"), "{e}");
        // Refused on its header alone: nothing after it is read.
        let e = read_frame_at_most(&mut &f[..8], HELLO_MAX).unwrap_err();
        assert!(e.to_string().contains("a hello is at most"), "{e}");
        assert_eq!(read_frame_at_most(&mut &[][..], HELLO_MAX).unwrap(), None);
    }

    #[test]
    fn a_secret_file_is_its_text_less_whitespace_within_bounds_readable_by_its_owner_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &[u8], mode: u32| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let good = file("good", b"  a-secret-of-20-bytes\n", 0o600);
        assert_eq!(load_secret(&good).unwrap(), Secret("a-secret-of-20-bytes".into()));
        assert_eq!(load_secret(&file("ro", b"a-secret-of-20-bytes", 0o400)).unwrap().0, "a-secret-of-20-bytes");
        // Base64 wrapped over lines (as `openssl rand -base64` writes more than 48 bytes),
        // CRLF endings too: one secret, the whitespace taken out.
        let wrapped = load_secret(&file("wrapped", b"abcdefghij\r\nklmnopqrst\r\nuv==\r\n", 0o600)).unwrap();
        assert_eq!(wrapped.0, "abcdefghijklmnopqrstuv==");
        let big = "A".repeat(64) + "\n";
        assert_eq!(load_secret(&file("big", big.repeat(16).as_bytes(), 0o600)).unwrap().0.len(), 1024);
        // A rotation's secrets come from files of their own.
        let old = file("old", b"the-old-secret-00\n", 0o600);
        let r = ClusterSecret::load(&good, std::slice::from_ref(&old)).unwrap();
        assert_eq!(
            (r.shown.0.as_str(), r.also.clone()),
            ("a-secret-of-20-bytes", vec![Secret("the-old-secret-00".into())])
        );
        let four = vec![old.clone(); SECRETS_ALSO_MAX + 1];
        assert!(ClusterSecret::load(&good, &four).unwrap_err().contains("at most 3"));
        let bad_also = file("bad-also", b"short\n", 0o600);
        assert!(ClusterSecret::load(&good, &[bad_also]).unwrap_err().contains("is 5 bytes"));
        for mode in [0o640, 0o604, 0o644, 0o660] {
            let e = load_secret(&file("open", b"a-secret-of-20-bytes", mode)).unwrap_err();
            assert!(e.contains("may be read by others") && e.contains("chmod 600"), "{mode:o}: {e}");
        }
        let short = load_secret(&file("short", b"fifteen-bytes!!\n", 0o600)).unwrap_err();
        assert!(short.contains("is 15 bytes") && short.contains("16 to 1024"), "{short}");
        assert!(load_secret(&file("empty", b" \n\n", 0o600)).unwrap_err().contains("is 0 bytes"));
        assert!(load_secret(&file("long", &[b'a'; SECRET_BYTES_MAX + 1], 0o600)).unwrap_err().contains("1025 bytes"));
        assert_eq!(load_secret(&file("max", &[b'a'; SECRET_BYTES_MAX], 0o600)).unwrap().0.len(), SECRET_BYTES_MAX);
        assert!(load_secret(&file("binary", &[0xff; 20], 0o600)).unwrap_err().contains("not UTF-8"));
        assert!(load_secret(&dir.path().join("missing")).unwrap_err().contains("the cluster secret file"));
        // Its owner: this process's user or root, not another user.
        let owner = |p: &std::path::Path| std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(p).unwrap());
        let mine = owner(&good);
        match load_secret_as(&good, mine + 1) {
            Ok(_) => assert_eq!(mine, 0, "a file of another user than root's is refused"),
            Err(e) => assert!(e.contains(&format!("is owned by user {mine}, not by this process's user")), "{e}"),
        }
        if mine == 0 {
            // (Root can give a file away: the case the check is for.)
            let given = file("given", b"a-secret-of-20-bytes", 0o600);
            std::os::unix::fs::chown(&given, Some(4242), None).unwrap();
            let e = load_secret_as(&given, 0).unwrap_err();
            assert!(e.contains("is owned by user 4242, not by this process's user (0) nor root"), "{e}");
        }
        assert_eq!(load_secret_as(&good, mine).unwrap().0, "a-secret-of-20-bytes");
    }
}
