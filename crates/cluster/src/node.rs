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
//! entries and the hard state are durable; committed entries are applied in order.

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Message};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};

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

/// What must be durable of a node's Raft state before it answers (the hard state: term,
/// vote, commit; the log; the voters).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RaftDurable {
    pub hard_state: HardState,
    pub conf_state: ConfState,
    pub entries: Vec<Entry>,
}

impl RaftDurable {
    /// A new member of a group whose first voters are `voters`.
    pub fn initial(voters: &[NodeId]) -> RaftDurable {
        RaftDurable { conf_state: ConfState::from((voters.to_vec(), vec![])), ..RaftDurable::default() }
    }

    /// Appends `ents`, replacing any entries at or after the first one's index (a new
    /// leader's log wins over an uncommitted tail).
    pub fn append(&mut self, ents: &[Entry]) {
        let Some(first) = ents.first() else { return };
        self.entries.retain(|e| e.index < first.index);
        self.entries.extend_from_slice(ents);
    }
}

/// Where a node persists its Raft state. Each call must be durable when it returns; an
/// error stops the node (it must not answer as if the write had happened).
pub trait ControlDisk {
    fn append(&mut self, entries: &[Entry]) -> std::io::Result<()>;
    fn set_hard_state(&mut self, hs: &HardState) -> std::io::Result<()>;
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
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("not the control plane's leader (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId> },
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    #[error("persisting the control plane's raft state: {0}")]
    Disk(#[from] std::io::Error),
}

/// One node of the Raft group (see the module notes).
pub struct ControlNode {
    raw: RawNode<MemStorage>,
    state: ControlState,
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
        let store = MemStorage::new();
        {
            let mut w = store.wl();
            w.set_conf_state(durable.conf_state.clone());
            w.append(&durable.entries)?;
            w.set_hardstate(durable.hard_state.clone());
        }
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
        Ok(ControlNode { raw, state: ControlState::default() })
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
            .filter(|(&id, p)| id != r.id && p.matched == last && p.recent_active)
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

    /// Runs raft-rs's Ready protocol once: persists through `disk`, applies what
    /// committed, and returns the messages to send.
    pub fn poll(&mut self, disk: &mut dyn ControlDisk) -> Result<Output, NodeError> {
        let mut out = Output::default();
        if !self.raw.has_ready() {
            return Ok(out);
        }
        let mut rd = self.raw.ready();
        out.messages.extend(rd.take_messages());
        if !rd.snapshot().is_empty() {
            // Snapshots are not produced (the control log is not compacted yet).
            unreachable!("control plane snapshots are not used");
        }
        self.apply(rd.take_committed_entries(), &mut out);
        if !rd.entries().is_empty() {
            disk.append(rd.entries())?;
            self.raw.mut_store().wl().append(rd.entries())?;
        }
        if let Some(hs) = rd.hs() {
            disk.set_hard_state(hs)?;
            self.raw.mut_store().wl().set_hardstate(hs.clone());
        }
        out.messages.extend(rd.take_persisted_messages());
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            let mut hs = self.raw.store().rl().hard_state().clone();
            hs.set_commit(commit);
            disk.set_hard_state(&hs)?;
            self.raw.mut_store().wl().set_hardstate(hs);
        }
        out.messages.extend(light.take_messages());
        self.apply(light.take_committed_entries(), &mut out);
        self.raw.advance_apply();
        Ok(out)
    }

    fn apply(&mut self, entries: Vec<Entry>, out: &mut Output) {
        for e in entries {
            if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
                // A new leader's empty entry; membership changes are not proposed yet.
                continue;
            }
            let command = match Command::decode(&e.data) {
                Ok(c) => c,
                // Every node decodes the same bytes the same way, so every node skips it.
                Err(err) => {
                    tracing::error!(index = e.index, "{err}");
                    continue;
                }
            };
            let outcome = self.state.apply(&command);
            out.applied.push(Applied { index: e.index, command, outcome });
        }
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
}
