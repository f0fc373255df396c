//! One node of the control plane's Raft group, without I/O
//! ========================================================
//! [`ControlNode`] wraps raft-rs's `RawNode` (the consensus itself: elections, log
//! replication, commitment; nothing of it is written here) and applies committed
//! [`Command`]s to the node's [`ControlState`]. It has no clock, no sockets and no files:
//! the caller ticks it, hands it the messages that arrive, persists what
//! [`ControlDisk`] is asked to persist, and sends the messages [`ControlNode::poll`]
//! returns. The simulation (tests/sim.rs) drives many nodes this way with one seed; a
//! server drives one with a timer, TCP and a file.
//!
//! raft-rs's Ready protocol, followed by `poll`: messages a leader sends may leave before
//! its own entries are on disk; everything else (`persisted_messages`) only after the
//! entries and the hard state are durable; a snapshot from the leader is installed (state,
//! storage, disk) before anything after it; committed entries are applied in order.
//!
//! Membership changes are Raft configuration changes (one voter added or removed per
//! entry, raft-rs's simple changes; it refuses a second while one is pending); the entry's
//! context carries the [`Command`] that changes [`ControlState::members`], so the voters
//! and the members change at the same index on every node.
//!
//! Compaction: the log is cut to a snapshot (the [`ControlState`] as JSON, with the voters
//! and the index and term it stands for) every `compact_every` applied entries and after
//! every membership change. A node that needs entries the leader no longer has gets the
//! snapshot instead; that is how a new member starts, since a founding member's log begins
//! with a snapshot at index 1 that holds the founding voters (a new member starts empty, is
//! not a voter, and so never campaigns before the leader has brought it in).

use raft::eraftpb::{ConfChange, ConfChangeType, ConfState, Entry, EntryType, HardState, Message, Snapshot};
use raft::{GetEntriesContext, RaftState, RawNode, SnapshotStatus, StateRole, Storage, StorageError};

use crate::state::{Command, ControlState, NodeId};

/// The most bytes of entries Raft puts in one message (the transport refuses frames much
/// larger than this).
pub const MSG_BYTES_MAX: u64 = 1 << 20;

/// Raft timing, in ticks (the caller decides how long a tick is).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// A follower that hears nothing from a leader for a random number of ticks in
    /// `[election, 2 * election)` campaigns (pre-vote first, so a node that was cut off
    /// does not disturb a healthy leader when it comes back).
    pub election: usize,
    pub heartbeat: usize,
    /// Fixes the election timeout at exactly this many ticks instead of a random one
    /// (the simulation's nodes draw theirs from the run's seed; raft-rs draws from the
    /// thread's generator, which a seed cannot reproduce).
    pub fixed_election: Option<usize>,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing { election: 10, heartbeat: 2, fixed_election: None }
    }
}

/// Entries applied between two compactions, unless a node is told otherwise.
pub const COMPACT_EVERY: u64 = 1000;

/// What must be durable of a node's Raft state before it answers (the hard state: term,
/// vote, commit; the snapshot the log starts from, with the voters it stands for; the log
/// after it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RaftDurable {
    pub hard_state: HardState,
    pub snapshot: Snapshot,
    /// The entries after the snapshot's index, in order.
    pub entries: Vec<Entry>,
}

impl RaftDurable {
    /// A founding member of a group whose first voters are `voters`: its log starts with
    /// a snapshot at index 1, term 1, holding those voters and an empty state (every
    /// founding member starts the same). With no voters: a node that joins a running
    /// group, which starts empty and learns everything from the leader's snapshot.
    pub fn initial(voters: &[NodeId]) -> RaftDurable {
        let mut d = RaftDurable::default();
        if !voters.is_empty() {
            let m = d.snapshot.mut_metadata();
            m.index = 1;
            m.term = 1;
            m.set_conf_state(ConfState::from((voters.to_vec(), vec![])));
            d.hard_state.term = 1;
            d.hard_state.commit = 1;
        }
        d
    }

    /// The voters the snapshot stands for.
    pub fn conf_state(&self) -> &ConfState {
        self.snapshot.get_metadata().get_conf_state()
    }

    /// Appends `ents`, replacing any entries at or after the first one's index (a new
    /// leader's log wins over an uncommitted tail).
    pub fn append(&mut self, ents: &[Entry]) {
        let Some(first) = ents.first() else { return };
        self.entries.retain(|e| e.index < first.index);
        self.entries.extend(ents.iter().filter(|e| e.index > self.snapshot.get_metadata().index).cloned());
    }

    /// The log now starts from `snap`: entries at or below its index go. `received`: a
    /// leader's snapshot, which replaces the whole log (what lay above it is sent again)
    /// and moves the commit index up to it; otherwise this node's own compaction, which
    /// keeps the entries above.
    pub fn set_snapshot(&mut self, snap: &Snapshot, received: bool) {
        let index = snap.get_metadata().index;
        if received {
            self.entries.clear();
            self.hard_state.commit = self.hard_state.commit.max(index);
            self.hard_state.term = self.hard_state.term.max(snap.get_metadata().term);
        } else {
            self.entries.retain(|e| e.index > index);
        }
        self.snapshot = snap.clone();
    }
}

/// Where a node persists its Raft state. Each call must be durable when it returns; an
/// error stops the node (it must not answer as if the write had happened).
pub trait ControlDisk {
    fn append(&mut self, entries: &[Entry]) -> std::io::Result<()>;
    fn set_hard_state(&mut self, hs: &HardState) -> std::io::Result<()>;
    /// See [`RaftDurable::set_snapshot`].
    fn set_snapshot(&mut self, snap: &Snapshot, received: bool) -> std::io::Result<()>;
}

/// An in-memory [`ControlDisk`] (tests and the simulation: it survives a simulated
/// crash because the simulation keeps it).
impl ControlDisk for RaftDurable {
    fn append(&mut self, entries: &[Entry]) -> std::io::Result<()> {
        RaftDurable::append(self, entries);
        Ok(())
    }
    fn set_hard_state(&mut self, hs: &HardState) -> std::io::Result<()> {
        self.hard_state = hs.clone();
        Ok(())
    }
    fn set_snapshot(&mut self, snap: &Snapshot, received: bool) -> std::io::Result<()> {
        RaftDurable::set_snapshot(self, snap, received);
        Ok(())
    }
}

/// raft-rs's view of a node's log ([`Storage`]): the same shape as [`RaftDurable`], kept
/// in memory by the node and changed only after the disk has what it is changed to.
/// (raft-rs's own `MemStorage` snapshots carry no data and compact without moving its
/// first index, so a log that a new member joins from needs this one.)
struct ControlStorage {
    d: RaftDurable,
    /// The voters now (the snapshot's, then every configuration change applied since).
    conf: ConfState,
}

impl ControlStorage {
    fn first_index(&self) -> u64 {
        self.d.snapshot.get_metadata().index + 1
    }

    fn last_index(&self) -> u64 {
        self.d.entries.last().map_or(self.d.snapshot.get_metadata().index, |e| e.index)
    }
}

impl Storage for ControlStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.d.hard_state.clone(), self.conf.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max: impl Into<Option<u64>>,
        _: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let off = self.first_index();
        let mut v = self.d.entries[(low - off) as usize..(high - off) as usize].to_vec();
        raft::util::limit_size(&mut v, max.into());
        Ok(v)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let m = self.d.snapshot.get_metadata();
        if idx == m.index {
            return Ok(m.term);
        }
        if idx < self.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.d.entries[(idx - self.first_index()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(ControlStorage::first_index(self))
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(ControlStorage::last_index(self))
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.d.snapshot.get_metadata().index < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.d.snapshot.clone())
    }
}

/// A command that committed, and what applying it did.
#[derive(Clone, Debug)]
pub struct Applied {
    pub index: u64,
    pub command: Command,
    /// `Err`: refused by the state (stale); the state did not change.
    pub outcome: Result<(), String>,
}

/// What one `poll` produced.
#[derive(Debug, Default)]
pub struct Output {
    /// To send, each to `msg.to`.
    pub messages: Vec<Message>,
    pub applied: Vec<Applied>,
    /// The state was replaced by a leader's snapshot (before `applied`).
    pub restored: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("not the control plane's leader (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    #[error("persisting the control plane's raft state: {0}")]
    Disk(#[from] std::io::Error),
    #[error("a control plane snapshot: {0}")]
    Snapshot(String),
    /// Refused for good (the change makes no sense in this state).
    #[error("{0}")]
    Refused(String),
    /// Not now (another change is under way, the primary has not settled the last one, a
    /// failover runs): the same request may succeed later.
    #[error("{0}")]
    Busy(String),
}

/// One node of the Raft group (see the module notes).
pub struct ControlNode {
    raw: RawNode<ControlStorage>,
    state: ControlState,
    compact_every: u64,
    /// A snapshot is due (a membership change applied, or `compact_every` entries).
    snapshot_due: bool,
    /// Per peer that a snapshot was sent to: ticks since (a snapshot lost on the way is
    /// reported, so that raft-rs sends again).
    snapshot_ticks: std::collections::BTreeMap<NodeId, usize>,
    /// Whether this node has applied what the group had committed when it asked after it
    /// started (`caught_up`); the ReadIndex asked for it and ticks since; the index the
    /// leader answered.
    caught_up: bool,
    read_asked: Option<(u64, usize)>,
    read_index: Option<u64>,
    /// Makes this run's ReadIndex contexts its own: raft-rs ignores a request whose
    /// context is already pending (another node's, or this node's before a restart).
    read_nonce: u64,
}

/// Ticks a ReadIndex asked for `caught_up` is waited for before it is asked again (the
/// leader may have changed, or dropped it: raft-rs 0.7's leader drops one until it has
/// committed an entry of its term, as after every election).
const READ_INDEX_RETRY_TICKS: usize = 5;

/// The context of node `id`'s `n`th ReadIndex for `caught_up` in the run started at
/// `nonce`.
fn read_context(id: NodeId, nonce: u64, n: u64) -> Vec<u8> {
    [read_context_prefix(id, nonce).as_slice(), &n.to_be_bytes()].concat()
}

/// A number of this run's own: the standard library's per-process random hash keys
/// (drawn from the operating system), mixed with the clock (before, the clock alone, or 0
/// where it could not be read, which a restart would then repeat).
pub(crate) fn run_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(clock);
    h.write_u32(std::process::id());
    h.finish()
}

/// What every context of node `id`'s run started at `nonce` begins with.
fn read_context_prefix(id: NodeId, nonce: u64) -> Vec<u8> {
    [b"caught-up:".as_slice(), &id.to_be_bytes(), &nonce.to_be_bytes()].concat()
}

fn decode_state(snap: &Snapshot) -> Result<ControlState, NodeError> {
    if snap.data.is_empty() {
        return Ok(ControlState::default());
    }
    serde_json::from_slice(&snap.data).map_err(|e| NodeError::Snapshot(format!("undecodable state: {e}")))
}

impl ControlNode {
    /// Starts (or restarts) node `id` from what its disk holds: a restarted node
    /// re-applies its committed log from the start, so it rebuilds the same state.
    pub fn start(
        id: NodeId,
        timing: Timing,
        durable: &RaftDurable,
        logger: &slog::Logger,
    ) -> Result<ControlNode, NodeError> {
        let store = ControlStorage { d: durable.clone(), conf: durable.conf_state().clone() };
        let state = decode_state(&durable.snapshot)?;
        let mut cfg = raft::Config {
            id,
            election_tick: timing.election,
            heartbeat_tick: timing.heartbeat,
            check_quorum: true,
            pre_vote: true,
            max_size_per_msg: MSG_BYTES_MAX,
            ..raft::Config::default()
        };
        if let Some(t) = timing.fixed_election {
            cfg.election_tick = t;
            cfg.min_election_tick = t;
            cfg.max_election_tick = t + 1;
        }
        cfg.validate()?;
        let raw = RawNode::new(&cfg, store, logger)?;
        Ok(ControlNode {
            raw,
            state,
            compact_every: COMPACT_EVERY,
            snapshot_due: false,
            snapshot_ticks: Default::default(),
            caught_up: false,
            read_asked: None,
            read_index: None,
            read_nonce: run_nonce(),
        })
    }

    /// Whether this node's state is known to be up to date as of some moment after it
    /// started: it has applied everything the group had committed then (a Raft ReadIndex,
    /// asked once a leader is known). Until then the state it kept on its disk may be
    /// stale: an epoch it names as open may have been failed over while it was down.
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    /// Compacts the log every `n` applied entries (at least 1).
    pub fn set_compact_every(&mut self, n: u64) {
        self.compact_every = n.max(1);
    }

    /// The index the log starts after (its snapshot's).
    pub fn snapshot_index(&self) -> u64 {
        self.raw.store().d.snapshot.get_metadata().index
    }

    /// The learners Raft sends its log to now.
    pub fn learners(&self) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self.raw.raft.prs().conf().learners().iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// The voters Raft counts now.
    pub fn voters(&self) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self.raw.raft.prs().conf().voters().ids().iter().collect();
        v.sort_unstable();
        v
    }

    pub fn id(&self) -> NodeId {
        self.raw.raft.id
    }

    pub fn state(&self) -> &ControlState {
        &self.state
    }

    /// The Raft leader this node knows of.
    pub fn leader(&self) -> Option<NodeId> {
        Some(self.raw.raft.leader_id).filter(|&l| l != 0)
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Whether this node leads and its state is current: an entry of its own term has
    /// committed (so everything earlier leaders committed is known) and everything
    /// committed is applied. A new leader's coordinator waits for this, so that it never
    /// acts on a state older than what the group has decided.
    pub fn leads_current(&self) -> bool {
        let r = &self.raw.raft;
        self.is_leader() && r.commit_to_current_term() && r.raft_log.applied == r.raft_log.committed
    }

    /// Leads in its current term but has not applied every entry committed yet (a message
    /// just stepped moved the commit index; the next `poll` applies them).
    pub fn leads_unapplied(&self) -> bool {
        let r = &self.raw.raft;
        self.is_leader() && r.commit_to_current_term() && r.raft_log.applied < r.raft_log.committed
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// While this node leads: the peers that hold the whole log and were heard from
    /// lately, to hand the leadership to (lowest id first).
    pub fn up_to_date_peers(&self) -> Vec<NodeId> {
        let r = &self.raw.raft;
        if !self.is_leader() {
            return Vec::new();
        }
        let last = r.raft_log.last_index();
        let mut v: Vec<NodeId> = r
            .prs()
            .iter()
            // (Learners have progress too, but cannot lead.)
            .filter(|(&id, p)| {
                id != r.id && p.matched == last && p.recent_active && r.prs().conf().voters().contains(id)
            })
            .map(|(&id, _)| id)
            .collect();
        v.sort_unstable();
        v
    }

    /// Asks Raft to hand the leadership to `to` (raft-rs's leader transfer: `to` is brought
    /// up to date and told to campaign at once; proposals wait meanwhile).
    pub fn transfer_leader(&mut self, to: NodeId) {
        self.raw.transfer_leader(to);
    }

    /// One tick of the Raft clock.
    pub fn tick(&mut self) {
        self.raw.tick();
        if !self.caught_up && self.raw.raft.leader_id != raft::INVALID_ID {
            match &mut self.read_asked {
                Some((_, ticks)) if *ticks < READ_INDEX_RETRY_TICKS => *ticks += 1,
                asked => {
                    let n = asked.map_or(1, |(n, _)| n + 1);
                    *asked = Some((n, 0));
                    self.raw.read_index(read_context(self.id(), self.read_nonce, n));
                }
            }
        }
        // A snapshot the transport dropped leaves its peer waiting for it for good:
        // reported as failed after two election timeouts, raft-rs probes and sends again.
        let waiting: Vec<NodeId> = match self.is_leader() {
            true => self
                .raw
                .raft
                .prs()
                .iter()
                .filter(|(_, p)| p.state == raft::ProgressState::Snapshot)
                .map(|(&id, _)| id)
                .collect(),
            false => Vec::new(),
        };
        self.snapshot_ticks.retain(|id, _| waiting.contains(id));
        let limit = 2 * self.raw.raft.election_timeout();
        for id in waiting {
            let t = self.snapshot_ticks.entry(id).or_insert(0);
            *t += 1;
            if *t > limit {
                self.snapshot_ticks.remove(&id);
                self.raw.report_snapshot(id, SnapshotStatus::Failure);
            }
        }
    }

    /// A message from another node.
    pub fn step(&mut self, m: Message) -> Result<(), NodeError> {
        Ok(self.raw.step(m)?)
    }

    /// Proposes a command (only the leader may; it commits, or is lost with a leader that
    /// is replaced, in which case the new leader decides again from the state it sees).
    pub fn propose(&mut self, cmd: &Command) -> Result<(), NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        Ok(self.raw.propose(vec![], cmd.encode())?)
    }

    /// Proposes a command through whichever node leads (a follower forwards it to the
    /// leader it knows; with none known, or on the way, it is lost: the caller asks again).
    pub fn propose_via_leader(&mut self, cmd: &Command) -> Result<(), NodeError> {
        if self.leader().is_none() {
            return Err(NodeError::NotLeader { leader: None });
        }
        Ok(self.raw.propose(vec![], cmd.encode())?)
    }

    /// Proposes an operator's command that is not a membership change (`Switchover`):
    /// only the leader may, and only when the state would take it now. Returns the index
    /// it is proposed at, as `propose_membership`.
    pub fn propose_checked(&mut self, cmd: &Command) -> Result<u64, NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        self.state.clone().apply(cmd).map_err(NodeError::Refused)?;
        let index = self.raw.raft.raft_log.last_index() + 1;
        self.raw.propose(vec![], cmd.encode())?;
        Ok(index)
    }

    /// Proposes a membership change (`AddMember` or `RemoveMember`) as a Raft
    /// configuration change; only the leader may, one change at a time, and only when
    /// the state would take it now. Returns the index it is proposed at (it has committed
    /// once an `Applied` with that index and command comes out of `poll`).
    pub fn propose_membership(&mut self, cmd: &Command) -> Result<u64, NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader { leader: self.leader() });
        }
        let (ty, id) = match cmd {
            // (raft-rs promotes a learner that `AddNode` names.)
            Command::AddMember { member } => (ConfChangeType::AddNode, member.id),
            Command::AddLearner { member } => (ConfChangeType::AddLearnerNode, member.id),
            Command::RemoveMember { id } => (ConfChangeType::RemoveNode, *id),
            _ => return Err(NodeError::Refused(format!("{cmd:?} is not a membership change"))),
        };
        if self.raw.raft.has_pending_conf() {
            return Err(NodeError::Busy("a membership change is still being applied; ask again".into()));
        }
        self.state.may_change_members().map_err(NodeError::Busy)?;
        self.state.clone().apply(cmd).map_err(NodeError::Refused)?;
        if id == self.id() && ty == ConfChangeType::RemoveNode {
            // The leader does not remove itself: it hands the leadership to a peer that
            // holds the whole log, which is asked next.
            if let Some(&to) = self.up_to_date_peers().first() {
                self.transfer_leader(to);
            }
            return Err(NodeError::Busy(format!(
                "node {id} leads the control plane and hands the leadership over first; ask again"
            )));
        }
        let mut cc = ConfChange::default();
        cc.set_change_type(ty);
        cc.node_id = id;
        cc.context = cmd.encode().into();
        let before = self.raw.raft.raft_log.last_index();
        match self.raw.propose_conf_change(vec![], cc) {
            Ok(()) => {}
            // A leader handing its leadership over drops proposals: not now, not never.
            Err(raft::Error::ProposalDropped) => {
                return Err(NodeError::Busy("the leader is handing its leadership over; ask again".into()))
            }
            Err(e) => return Err(e.into()),
        }
        let index = self.raw.raft.raft_log.last_index();
        if index == before {
            return Err(NodeError::Busy(
                "the leader did not take the proposal (it is handing its leadership over?); ask again".into(),
            ));
        }
        Ok(index)
    }

    /// Runs raft-rs's Ready protocol once: persists through `disk`, applies what
    /// committed, and returns the messages to send.
    pub fn poll(&mut self, disk: &mut dyn ControlDisk) -> Result<Output, NodeError> {
        let mut out = Output::default();
        if !self.raw.has_ready() {
            return Ok(out);
        }
        let mut rd = self.raw.ready();
        out.messages.extend(rd.take_messages());
        if self.read_asked.is_some() && !self.caught_up {
            // An answer to any of this run's requests will do: each index was committed
            // after this node started. (Only the newest's was taken before: where an
            // answer took longer than the retry, 5 ticks, every answer met a newer
            // request and the node never caught up; seen in the simulation with 30 ms
            // Raft delays, when the servers' start came to wait for it.)
            let mine = read_context_prefix(self.id(), self.read_nonce);
            if let Some(i) =
                rd.read_states().iter().filter(|rs| rs.request_ctx.starts_with(&mine)).map(|rs| rs.index).max()
            {
                self.read_index = Some(self.read_index.map_or(i, |r| r.min(i)));
            }
        }
        if !rd.snapshot().is_empty() {
            // The leader's snapshot: this node's state and log start over from it.
            let snap = rd.snapshot().clone();
            let state = decode_state(&snap)?;
            disk.set_snapshot(&snap, true)?;
            let store = self.raw.mut_store();
            store.d.set_snapshot(&snap, true);
            store.conf = snap.get_metadata().get_conf_state().clone();
            self.state = state;
            out.restored = true;
        }
        // Committed entries are applied once this Ready is done with (`advance`): a
        // configuration change that removes this node while it leads must not meet
        // raft-rs's bookkeeping of what the leader itself persisted (it panics on a leader
        // without its own progress).
        let committed = rd.take_committed_entries();
        if !rd.entries().is_empty() {
            disk.append(rd.entries())?;
            self.raw.mut_store().d.append(rd.entries());
        }
        if let Some(hs) = rd.hs() {
            disk.set_hard_state(hs)?;
            self.raw.mut_store().d.hard_state = hs.clone();
        }
        out.messages.extend(rd.take_persisted_messages());
        let mut light = self.raw.advance(rd);
        self.apply(committed, &mut out)?;
        if let Some(commit) = light.commit_index() {
            let mut hs = self.raw.store().d.hard_state.clone();
            hs.set_commit(commit);
            disk.set_hard_state(&hs)?;
            self.raw.mut_store().d.hard_state = hs;
        }
        out.messages.extend(light.take_messages());
        self.apply(light.take_committed_entries(), &mut out)?;
        self.raw.advance_apply();
        // A leader that a change removed (proposed by an earlier leader) steps down, once
        // its Ready is done; the others elect a leader among themselves (raft-rs leaves
        // this case to the application).
        if self.is_leader() && !self.voters().contains(&self.id()) {
            let term = self.raw.raft.term;
            self.raw.raft.become_follower(term + 1, raft::INVALID_ID);
        }
        let applied = self.raw.raft.raft_log.applied;
        if self.read_index.is_some_and(|i| applied >= i) {
            self.caught_up = true;
            self.read_index = None;
            self.read_asked = None;
        }
        if self.snapshot_due || applied >= self.snapshot_index() + self.compact_every {
            self.compact(applied, disk)?;
        }
        Ok(out)
    }

    /// Cuts the log to a snapshot of the state at `applied` (everything is persisted and
    /// applied up to it: called at the end of `poll`).
    fn compact(&mut self, applied: u64, disk: &mut dyn ControlDisk) -> Result<(), NodeError> {
        self.snapshot_due = false;
        if applied <= self.snapshot_index() {
            return Ok(());
        }
        let mut snap = Snapshot {
            data: serde_json::to_vec(&self.state).expect("the state serialises").into(),
            ..Default::default()
        };
        let m = snap.mut_metadata();
        m.index = applied;
        m.term = self.raw.raft.raft_log.term(applied)?;
        m.set_conf_state(self.raw.raft.prs().conf().to_conf_state());
        disk.set_snapshot(&snap, false)?;
        self.raw.mut_store().d.set_snapshot(&snap, false);
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>, out: &mut Output) -> Result<(), NodeError> {
        for e in entries {
            let conf_change = match e.get_entry_type() {
                EntryType::EntryConfChange => {
                    let cc = <ConfChange as protobuf::Message>::parse_from_bytes(&e.data)
                        .map_err(|err| NodeError::Snapshot(format!("undecodable configuration change: {err}")))?;
                    Some(cc)
                }
                // raft-rs's joint changes are never proposed here.
                EntryType::EntryConfChangeV2 => continue,
                EntryType::EntryNormal if e.data.is_empty() => continue, // a new leader's empty entry
                EntryType::EntryNormal => None,
            };
            let data = conf_change.as_ref().map_or(&e.data, |cc| &cc.context);
            let command = match Command::decode(data) {
                Ok(c) => c,
                // Every node decodes the same bytes the same way, so every node skips it.
                Err(err) => {
                    tracing::error!(index = e.index, "{err}");
                    continue;
                }
            };
            let outcome = match (&conf_change, command.changes_membership()) {
                (None, true) => Err("a membership change outside a configuration change".to_string()),
                (Some(_), false) => Err("a configuration change that changes no membership".to_string()),
                _ => self.state.apply(&command),
            };
            // The voters change with the members, or neither does (every node decides the
            // same, from the same entries in the same order).
            if let (Ok(()), Some(cc)) = (&outcome, &conf_change) {
                let cs = self.raw.apply_conf_change(cc)?;
                self.raw.mut_store().conf = cs;
                self.snapshot_due = true;
            }
            out.applied.push(Applied { index: e.index, command, outcome });
        }
        Ok(())
    }
}

/// A slog drain that forwards raft-rs's records to `tracing` (target `raft`).
pub struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, r: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match r.level() {
            slog::Level::Critical | slog::Level::Error => tracing::error!(target: "raft", "{}", r.msg()),
            slog::Level::Warning => tracing::warn!(target: "raft", "{}", r.msg()),
            slog::Level::Info => tracing::info!(target: "raft", "{}", r.msg()),
            _ => tracing::trace!(target: "raft", "{}", r.msg()),
        }
        Ok(())
    }
}

/// A logger for raft-rs that writes through `tracing`.
pub fn raft_logger() -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!())
}

/// A logger that drops everything (the simulation's thousands of runs).
pub fn quiet_logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A disk whose writes all fail (a full disk, a failed fsync).
    struct Failing;

    impl ControlDisk for Failing {
        fn append(&mut self, _: &[Entry]) -> std::io::Result<()> {
            Err(std::io::Error::other("no space left on device"))
        }
        fn set_hard_state(&mut self, _: &HardState) -> std::io::Result<()> {
            Err(std::io::Error::other("no space left on device"))
        }
        fn set_snapshot(&mut self, _: &Snapshot, _: bool) -> std::io::Result<()> {
            Err(std::io::Error::other("no space left on device"))
        }
    }

    /// A node that cannot persist stops with the disk's error and hands out nothing to send
    /// or apply; the same node with a working disk becomes leader and commits.
    #[test]
    fn a_write_that_fails_stops_the_node_and_nothing_leaves() {
        let timing = Timing { election: 3, heartbeat: 1, fixed_election: Some(3) };
        let run = |disk: &mut dyn ControlDisk| -> Result<(ControlNode, Vec<Output>), NodeError> {
            let mut n = ControlNode::start(1, timing, &RaftDurable::initial(&[1]), &quiet_logger())?;
            let mut outs = Vec::new();
            for _ in 0..10 {
                n.tick();
                outs.push(n.poll(disk)?);
            }
            Ok((n, outs))
        };
        match run(&mut Failing) {
            Err(NodeError::Disk(e)) => assert!(e.to_string().contains("no space"), "{e}"),
            Err(e) => panic!("another error: {e}"),
            Ok(_) => panic!("a node whose disk fails went on"),
        }
        let mut disk = RaftDurable::initial(&[1]);
        let (n, _) = run(&mut disk).unwrap();
        assert!(n.is_leader());
        assert!(disk.hard_state.term >= 1 && !disk.entries.is_empty(), "what it answered with is on its disk");
    }

    /// A few nodes in memory, every message delivered at once (membership, snapshots and
    /// restarts step by step; the simulation covers faults).
    struct Group {
        nodes: std::collections::BTreeMap<NodeId, (ControlNode, RaftDurable)>,
    }

    impl Group {
        fn start(id: NodeId, d: RaftDurable) -> (ControlNode, RaftDurable) {
            let timing = Timing { election: 5, heartbeat: 1, fixed_election: Some(5 + id as usize) };
            let mut n = ControlNode::start(id, timing, &d, &quiet_logger()).unwrap();
            n.set_compact_every(20);
            (n, d)
        }

        /// Three voters, a leader, and epoch 1 open everywhere (primary 1).
        fn bootstrapped() -> Group {
            let mut g = Group { nodes: Default::default() };
            for id in 1..=3 {
                g.nodes.insert(id, Group::start(id, RaftDurable::initial(&[1, 2, 3])));
            }
            g.run("a leader", |g| g.nodes.values().any(|(n, _)| n.leads_current()));
            let members = (1..=3).map(member).collect();
            g.leader()
                .propose(&Command::Bootstrap {
                    members,
                    primary: 1,
                    policy: "majority".into(),
                    lease_ms: 0,
                    database: 0,
                })
                .unwrap();
            g.run("bootstrapped", |g| g.nodes.values().all(|(n, _)| n.state().epoch == 1));
            g
        }

        /// Ticks and delivers until `done` holds (bounded).
        fn run(&mut self, what: &str, done: impl Fn(&Group) -> bool) {
            for _ in 0..2000 {
                if done(self) {
                    return;
                }
                self.round();
            }
            panic!("{what}: not reached");
        }

        /// One tick of every node, and every message that follows delivered.
        fn round(&mut self) {
            let mut msgs = Vec::new();
            for (n, d) in self.nodes.values_mut() {
                n.tick();
                msgs.extend(n.poll(d).unwrap().messages);
            }
            while !msgs.is_empty() {
                for m in std::mem::take(&mut msgs) {
                    if let Some((n, _)) = self.nodes.get_mut(&m.to) {
                        let _ = n.step(m);
                    }
                }
                for (n, d) in self.nodes.values_mut() {
                    msgs.extend(n.poll(d).unwrap().messages);
                }
            }
        }

        fn leader(&mut self) -> &mut ControlNode {
            self.nodes.values_mut().map(|(n, _)| n).find(|n| n.leads_current()).expect("a leader")
        }

        fn settle(&mut self) {
            let s = self.leader().state().clone();
            let e = s.epochs.last().unwrap();
            let cmd = Command::ConfigApplied { epoch: e.epoch, primary: e.primary, config: s.config };
            self.leader().propose(&cmd).unwrap();
            let want = Some((e.epoch, s.config));
            // (A node that was removed hears no more.)
            self.run("settled", |g| {
                g.nodes.values().filter(|(n, _)| n.voters().contains(&n.id())).all(|(n, _)| n.state().settled == want)
            });
        }
    }

    fn member(id: NodeId) -> crate::state::Member {
        crate::state::Member { id, addr: format!("n{id}:1"), repl: 2, control: 3, tls: 0 }
    }

    /// A fourth node joins from the leader's snapshot (its log was compacted at the
    /// change), becomes a voter, then a member is removed; each change waits for the last
    /// to be settled; a restarted node rebuilds the same state from its snapshot and log.
    #[test]
    fn members_are_added_from_a_snapshot_and_removed_one_change_at_a_time() {
        let mut g = Group::bootstrapped();
        let add4 = Command::AddMember { member: member(4) };
        match g.leader().propose_membership(&add4) {
            Err(NodeError::Busy(why)) => assert!(why.contains("not settled"), "{why}"),
            other => panic!("a change before the primary settled: {other:?}"),
        }
        g.settle();
        // A leader handing its leadership over drops proposals: "not now", not "never".
        let to = {
            let l = g.leader();
            let to = if l.id() == 2 { 3 } else { 2 };
            l.transfer_leader(to);
            assert!(
                matches!(l.propose_membership(&Command::AddMember { member: member(4) }), Err(NodeError::Busy(_))),
                "refused as busy during a leader transfer"
            );
            to
        };
        g.run("the transfer done", |g| g.nodes[&to].0.leads_current());
        // The new node starts empty; it is not a voter, so it waits for the leader.
        g.nodes.insert(4, Group::start(4, RaftDurable::initial(&[])));
        let at = g.leader().propose_membership(&add4).unwrap();
        assert!(
            matches!(g.leader().propose_membership(&Command::RemoveMember { id: 2 }), Err(NodeError::Busy(_))),
            "one change at a time"
        );
        g.run("node 4 joined", |g| {
            g.nodes.values().all(|(n, _)| n.state().members.len() == 4 && n.voters() == [1, 2, 3, 4])
        });
        let (n4, d4) = &g.nodes[&4];
        assert!(n4.snapshot_index() >= at, "node 4 started from a snapshot at or after the change");
        assert!(d4.snapshot.get_metadata().index >= at, "and has it on its disk");
        assert_eq!(n4.state(), g.nodes[&1].0.state());
        assert!(matches!(
            g.leader().propose_membership(&Command::RemoveMember { id: 2 }),
            Err(NodeError::Busy(why)) if why.contains("not settled")
        ));
        g.settle();
        let leader = g.leader().id();
        let victim = if leader == 2 { 3 } else { 2 };
        g.leader().propose_membership(&Command::RemoveMember { id: victim }).unwrap();
        g.run("removed", |g| {
            g.nodes.iter().filter(|(&id, _)| id != victim).all(|(_, (n, _))| {
                n.state().members.len() == 3 && !n.voters().contains(&victim) && n.state().config == 2
            })
        });
        // Many commands later the log is compacted; a restarted node rebuilds the same state.
        for _ in 0..50 {
            g.leader().propose(&Command::SetPolicy { policy: "majority-received".into() }).unwrap();
            g.run("a command", |_| true);
        }
        g.run("applied everywhere", |g| {
            let l = &g.nodes.values().find(|(n, _)| n.leads_current()).unwrap().0;
            g.nodes.iter().filter(|(&id, _)| id != victim).all(|(_, (n, _))| n.state() == l.state())
        });
        let (_, d) = g.nodes.remove(&4).unwrap();
        assert!(d.entries.len() < 40, "compacted: {} entries kept", d.entries.len());
        let want = g.nodes[&1].0.state().clone();
        g.nodes.insert(4, Group::start(4, d));
        g.run("restarted node 4 caught up", |g| g.nodes[&4].0.state() == &want);
        assert_eq!(g.nodes[&4].0.voters(), g.nodes[&1].0.voters());
        // The primary is never removed.
        g.settle();
        assert!(matches!(
            g.leader().propose_membership(&Command::RemoveMember { id: 1 }),
            Err(NodeError::Refused(why)) if why.contains("primary")
        ));
    }

    /// A restarted node is caught up (`caught_up`) only once it has applied what the group
    /// committed while it was down: the state it kept is stale until then. Alone (no
    /// quorum to answer its ReadIndex) it never is.
    #[test]
    fn a_restarted_node_whose_answers_come_after_its_retries_is_still_caught_up() {
        let mut g = Group::bootstrapped();
        let (_, d3) = g.nodes.remove(&3).unwrap();
        g.nodes.insert(3, Group::start(3, d3));
        // Every message to or from node 3 takes 4 ticks: a ReadIndex's answer (its request,
        // the leader's heartbeat round, the answer) comes after node 3 has asked again
        // (every `READ_INDEX_RETRY_TICKS`, 5). Taking only the newest request's answer, it
        // never caught up.
        let mut late: Vec<(usize, Message)> = Vec::new();
        for tick in 0..400 {
            if g.nodes[&3].0.caught_up() {
                assert_eq!(g.nodes[&3].0.state().epoch, 1);
                return;
            }
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut late).into_iter().partition(|(at, _)| *at <= tick);
            late = later;
            let mut now: Vec<Message> = due.into_iter().map(|(_, m)| m).collect();
            let mut fresh = Vec::new();
            for (n, d) in g.nodes.values_mut() {
                n.tick();
                fresh.extend(n.poll(d).unwrap().messages);
            }
            loop {
                for m in std::mem::take(&mut fresh) {
                    match m.to == 3 || m.from == 3 {
                        true => late.push((tick + 4, m)),
                        false => now.push(m),
                    }
                }
                if now.is_empty() {
                    break;
                }
                for m in std::mem::take(&mut now) {
                    if let Some((n, _)) = g.nodes.get_mut(&m.to) {
                        let _ = n.step(m);
                    }
                }
                for (n, d) in g.nodes.values_mut() {
                    fresh.extend(n.poll(d).unwrap().messages);
                }
            }
        }
        panic!("node 3 never caught up with its answers 8 ticks late");
    }

    #[test]
    fn a_restarted_node_is_caught_up_only_once_it_applied_what_committed_while_it_was_down() {
        let mut g = Group::bootstrapped();
        g.run("caught up", |g| g.nodes.values().all(|(n, _)| n.caught_up()));
        // Node 3 goes down; epoch 2 begins without it.
        let (_, d3) = g.nodes.remove(&3).unwrap();
        g.run("a leader of two", |g| g.nodes.values().any(|(n, _)| n.leads_current()));
        let reason = "primary 1 not heard from".to_string();
        g.leader().propose(&Command::BeginFailover { epoch: 2, reason }).unwrap();
        g.run("epoch 2 began", |g| g.nodes.values().all(|(n, _)| n.state().epoch == 2));
        let want = g.nodes[&1].0.state().clone();
        // Restarted, it starts from what it kept (its log is applied again as it polls),
        // not caught up.
        let (mut n3, mut d3) = Group::start(3, d3);
        n3.poll(&mut d3).unwrap();
        assert!(n3.state().epoch < 2 && !n3.caught_up());
        g.nodes.insert(3, (n3, d3));
        g.run("node 3 caught up", |g| g.nodes[&3].0.caught_up());
        assert_eq!(g.nodes[&3].0.state(), &want, "caught up means the state that committed while it was down");
        // Alone, a restarted node never is.
        let (_, d1) = g.nodes.remove(&1).unwrap();
        let mut alone = Group { nodes: Default::default() };
        alone.nodes.insert(1, Group::start(1, d1));
        for _ in 0..500 {
            alone.round();
        }
        assert!(!alone.nodes[&1].0.caught_up(), "no quorum answered it");
    }

    /// A node added as a learner takes the leader's snapshot and follows the log, but is
    /// not a voter: in a group of two voters, with the other voter stopped, nothing
    /// commits although the learner runs (as a third voter it would make a majority). It
    /// never leads, and no leader hands it the leadership. Promoted (`AddMember` of the same
    /// member) it becomes a voter; a restarted node holds the learners and voters it had; a
    /// learner is removed as a member is, and its id retired.
    #[test]
    fn a_learner_follows_without_voting_and_is_promoted() {
        let mut g = Group { nodes: Default::default() };
        for id in 1..=2 {
            g.nodes.insert(id, Group::start(id, RaftDurable::initial(&[1, 2])));
        }
        g.run("a leader", |g| g.nodes.values().any(|(n, _)| n.leads_current()));
        let members = (1..=2).map(member).collect();
        g.leader()
            .propose(&Command::Bootstrap { members, primary: 1, policy: "majority".into(), lease_ms: 0, database: 0 })
            .unwrap();
        g.run("bootstrapped", |g| g.nodes.values().all(|(n, _)| n.state().epoch == 1));
        g.settle();
        g.nodes.insert(3, Group::start(3, RaftDurable::initial(&[])));
        g.leader().propose_membership(&Command::AddLearner { member: member(3) }).unwrap();
        g.run("node 3 a learner everywhere", |g| {
            g.nodes
                .values()
                .all(|(n, _)| n.learners() == [3] && n.voters() == [1, 2] && n.state().learners.contains_key(&3))
        });
        assert!(!g.nodes[&3].0.state().members.contains_key(&3), "a learner is not a member");
        assert!(g.leader().up_to_date_peers().iter().all(|&p| p != 3), "never handed the leadership");
        // Adding it again is refused; so is promoting it as another member.
        g.settle();
        assert!(matches!(
            g.leader().propose_membership(&Command::AddLearner { member: member(3) }),
            Err(NodeError::Refused(why)) if why.contains("already a learner")
        ));
        let other = crate::state::Member { addr: "elsewhere:1".into(), ..member(3) };
        assert!(matches!(
            g.leader().propose_membership(&Command::AddMember { member: other }),
            Err(NodeError::Refused(why)) if why.contains("a learner added as")
        ));
        // The other voter stopped: the leader and the learner commit nothing.
        let leader = g.leader().id();
        let stopped = if leader == 1 { 2 } else { 1 };
        let parked = g.nodes.remove(&stopped).unwrap();
        let _ = g.nodes.get_mut(&leader).unwrap().0.propose(&Command::SetPolicy { policy: "all".into() });
        for _ in 0..50 {
            g.round();
        }
        for (_, (n, _)) in g.nodes.iter() {
            assert_eq!(n.state().policy, "majority", "node {}: committed with one voter and a learner", n.id());
            assert!(!(n.id() == 3 && n.leads_current()), "a learner never leads");
        }
        g.nodes.insert(stopped, parked);
        g.run("the policy committed once the voter is back", |g| {
            g.nodes.values().all(|(n, _)| n.state().policy == "all")
        });
        // Promoted: a voter and a member, a learner no more.
        g.settle();
        g.leader().propose_membership(&Command::AddMember { member: member(3) }).unwrap();
        g.run("node 3 a voter everywhere", |g| {
            g.nodes
                .values()
                .all(|(n, _)| n.voters() == [1, 2, 3] && n.learners().is_empty() && n.state().members.contains_key(&3))
        });
        assert!(g.nodes[&3].0.state().learners.is_empty());
        assert_eq!(g.nodes[&3].0.state().config, 1, "the learner's add made no configuration; its promotion did");
        // A restarted node has the same voters and learners (none now).
        let (_, d) = g.nodes.remove(&3).unwrap();
        g.nodes.insert(3, Group::start(3, d));
        g.run("restarted node 3", |g| g.nodes[&3].0.voters() == [1, 2, 3]);
        // A fourth node as a learner, restarted while one, then removed.
        g.settle();
        g.nodes.insert(4, Group::start(4, RaftDurable::initial(&[])));
        g.leader().propose_membership(&Command::AddLearner { member: member(4) }).unwrap();
        g.run("node 4 a learner", |g| g.nodes.values().all(|(n, _)| n.learners() == [4]));
        let (_, d) = g.nodes.remove(&4).unwrap();
        g.nodes.insert(4, Group::start(4, d));
        g.run("restarted node 4 still a learner", |g| {
            g.nodes[&4].0.learners() == [4] && g.nodes[&4].0.voters() == [1, 2, 3]
        });
        g.settle();
        g.leader().propose_membership(&Command::RemoveMember { id: 4 }).unwrap();
        g.run("node 4 removed", |g| {
            g.nodes.iter().filter(|(&id, _)| id != 4).all(|(_, (n, _))| {
                n.learners().is_empty() && n.state().retired.contains(&4) && n.state().learners.is_empty()
            })
        });
    }
}
