//! The control plane's replicated state
//! ====================================
//! What the Raft group agrees on: the members, the commit policy, the epochs (each with
//! its primary and, once it has ended, its recovery point), and whether the newest epoch
//! serves or is being failed over. Every node applies the same committed [`Command`]s in
//! the same order, so every node computes the same [`ControlState`]; `apply` is pure and
//! checks each command against the state it meets (a command proposed by a leader that
//! has since been replaced can commit late: it is then refused, and says why).
//!
//! Invariants (asserted by `check`):
//! - epochs open in increasing order, each no greater than `epoch` (the newest begun);
//! - every epoch but the last open one has a recovery point; the open one has none;
//! - each epoch's timestamps start at or above its predecessor's start and every recovery
//!   point so far (timestamps keep growing across epochs);
//! - in `Phase::Serving` the newest epoch begun is the open one.
//!
//! What survives of the history is a prefix of the timestamp order: a recovery point `p`
//! keeps, of every older epoch, the commits at or below `p` and discards the rest. A later
//! failover can set a point below an earlier one (a new primary that died before any
//! quorum held what it had recovered): the older epochs' points then drop to it too, and
//! what lies above goes, which only ever removes commits that were never released.
//!
//! A **switchover** (an operator hands the primary's role to a chosen node) is a failover
//! the primary begins itself: `Switchover` records the request; the primary stops taking
//! writes and waits until the target acknowledges, durably, everything its log holds; it
//! then proposes `HandOver` (a `BeginFailover` that holds only while the switchover is
//! under way), and the failover runs as any other, except that its plan
//! prefers the target (which lacks nothing below the point, so it is promoted in place).
//! Nothing is discarded, under any policy. A primary that cannot hand over in time
//! proposes `EndSwitchover` and takes writes again.

use std::collections::BTreeMap;

use ditto_engine::Ts;
use serde::{Deserialize, Serialize};

/// A node's id in the Raft group (raft-rs ids; 0 is not a valid id).
pub type NodeId = u64;

/// A member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: NodeId,
    /// Where clients reach its server (host:port).
    pub addr: String,
    /// Its replication port (backups connect to it while it is primary), on `addr`'s host.
    #[serde(default)]
    pub repl: u16,
    /// Its control plane's port, on `addr`'s host (0: unknown; peers use their flags).
    #[serde(default)]
    pub control: u16,
    /// Its server's TLS client port, on `addr`'s host (0: none named). Left out of the
    /// serialised command when 0, so a member without one reads as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tls: u16,
}

fn is_zero(p: &u16) -> bool {
    *p == 0
}

impl Member {
    /// The host of `addr`.
    pub fn host(&self) -> &str {
        self.addr.rsplit_once(':').map_or(self.addr.as_str(), |(h, _)| h)
    }
}

/// Whether the newest epoch serves writes or is being failed over to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// `epochs.last()` is the newest epoch begun; its primary accepts writes.
    Serving,
    /// Epoch `epoch` has begun (every older epoch is fenced) but has no primary yet: the
    /// coordinator is gathering the open epoch's tails and preparing a new primary.
    Failover,
}

/// An epoch that opened for writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub epoch: u64,
    pub primary: NodeId,
    /// Its commit timestamps are all above this.
    pub start: u64,
    /// Once a later epoch opened: the highest timestamp of this epoch that survives (the
    /// lowest recovery point set since). Every node discards this epoch's commits above it.
    pub recovered: Option<u64>,
    /// Once its primary has rejoined: how many of its commits above the recovery point
    /// that primary's own log held and discarded (under `local`, commits it released and
    /// never shipped; under `majority` and `all`, never released ones).
    #[serde(default)]
    pub discarded_by_primary: Option<u64>,
}

/// A command the Raft group commits (serialised as JSON into the entry's data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// The first entry: the members, epoch 1 with its primary, the policy; `lease_ms`, the
    /// length of every primary's lease (`ControlState::lease_ms`; the bootstrapping node's
    /// failure timeout; 0 from a node of a version that did not say); `database`, the id of
    /// the database the cluster holds (`ControlState::database`; 0 from an older node).
    Bootstrap {
        members: Vec<Member>,
        primary: NodeId,
        policy: String,
        #[serde(default)]
        lease_ms: u64,
        #[serde(default)]
        database: u64,
    },
    /// Begin epoch `epoch` (the newest begun + 1): from here on every node refuses
    /// batches of older epochs, and the open epoch's tail is gathered.
    BeginFailover { epoch: u64, reason: String },
    /// Open epoch `epoch` with `primary`, which holds every stream up to `recovery_point`
    /// (the open epoch `recovered_epoch`'s and any older one's); everything of older epochs
    /// above it is discarded; new timestamps start above `start`. `lost` counts the
    /// discarded commits the new primary held (never released under majority or all).
    /// `phases_ms`: how long the coordinator took to gather a quorum's reports and plan,
    /// and then for the chosen node to prepare (for `INFO cluster` and the metrics).
    /// `writes_after_ms`: the new primary takes no writes until this long after it applies
    /// this, when the old primary's lease (its quorum contact) has run out: from the
    /// reports, as the coordinator reckoned it when it proposed this (docs/cluster.md, "The
    /// old primary's lease"; 0 from a coordinator of a version that did not reckon it).
    OpenEpoch {
        epoch: u64,
        primary: NodeId,
        recovered_epoch: u64,
        recovery_point: u64,
        start: u64,
        lost: u64,
        #[serde(default)]
        phases_ms: [u64; 2],
        #[serde(default)]
        writes_after_ms: u64,
    },
    /// The cluster's default commit policy (a `CommitPolicy` name).
    SetPolicy { policy: String },
    /// Add a member (carried by a Raft configuration change: the node becomes a voter in
    /// the same entry), or promote a learner to one (the same `member` it was added as).
    /// Only while the open epoch serves and its primary has settled the current
    /// membership (`ConfigApplied`), one change at a time.
    AddMember { member: Member },
    /// Add a learner (a Raft configuration change: a raft-rs learner in the same entry): it
    /// follows the control log and runs a backup of the primary, but it votes in no
    /// election, counts in no commit quorum and reports in no failover, so adding it moves
    /// no quorum. Once its backup has caught up, `AddMember` promotes it. Only when a
    /// change may be made (`may_change_members`), but it makes no new configuration
    /// (`config`): no quorum moved, so the primary has nothing to settle.
    AddLearner { member: Member },
    /// Remove a member or a learner (a Raft configuration change, as `AddMember`); never
    /// the primary.
    RemoveMember { id: NodeId },
    /// The primary of `epoch` counts the members of configuration `config` in its commit
    /// quorum, and everything it released is held by a quorum of them (so the next change
    /// may go ahead: see the module notes).
    ConfigApplied { epoch: u64, primary: NodeId, config: u64 },
    /// The primary of `epoch`, rejoining after a later epoch opened, discarded `commits`
    /// of its own log above the epoch's recovery point (`EpochRecord::discarded_by_primary`).
    CountDiscarded { epoch: u64, node: NodeId, commits: u64 },
    /// An operator's switchover (`ditto cluster switchover`): the primary `from` of the
    /// serving epoch `epoch` stops taking writes, waits until `to` holds everything it
    /// logged, and then begins the failover itself, which prefers `to` (see the module
    /// notes). Only while the epoch serves and its primary has settled the membership.
    Switchover { epoch: u64, from: NodeId, to: NodeId },
    /// The switchover of `epoch` is given up (its primary could not hand over in time, and
    /// takes writes again): `why`. `switchover` names which (its `SwitchoverRecord::id`):
    /// a duplicate proposed for one given up must not end a later one of the same epoch
    /// (found by a review, 2026-12-03). 0 (entries written before it was named) ends the
    /// epoch's, whichever it is.
    EndSwitchover {
        epoch: u64,
        #[serde(default)]
        switchover: u64,
        why: String,
    },
    /// The drained primary of switchover `switchover` (its `SwitchoverRecord::id`) begins
    /// the failover to epoch `epoch`, as `BeginFailover` does; refused unless that very
    /// switchover is still under way (one given up meanwhile has its primary taking writes
    /// again, and a later one has not drained yet: a late hand-over must not count).
    HandOver { epoch: u64, switchover: u64, reason: String },
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a command serialises")
    }

    pub fn decode(data: &[u8]) -> Result<Command, String> {
        serde_json::from_slice(data).map_err(|e| format!("undecodable control command: {e}"))
    }

    /// Whether it is carried by a Raft configuration change (it changes the voters or the
    /// learners).
    pub fn changes_membership(&self) -> bool {
        matches!(self, Command::AddMember { .. } | Command::AddLearner { .. } | Command::RemoveMember { .. })
    }
}

/// The replicated state (see the module notes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlState {
    /// The voters: they vote, count in the commit quorum and report in failovers.
    pub members: BTreeMap<NodeId, Member>,
    /// Nodes that follow as learners (`Command::AddLearner`): never in `members`.
    #[serde(default)]
    pub learners: BTreeMap<NodeId, Member>,
    pub policy: String,
    /// The newest epoch begun (0 before the bootstrap).
    pub epoch: u64,
    pub phase: Option<Phase>,
    /// Epochs that opened, oldest first; the last is the open one.
    pub epochs: Vec<EpochRecord>,
    /// The membership's configuration: 0 at the bootstrap, one more at every change.
    #[serde(default)]
    pub config: u64,
    /// The (epoch, configuration) whose primary last settled its membership.
    #[serde(default)]
    pub settled: Option<(u64, u64)>,
    /// Ids of members removed: never used again (a node added back joins under a new id,
    /// with a new directory; its old Raft log may have counted in a quorum).
    #[serde(default)]
    pub retired: std::collections::BTreeSet<NodeId>,
    /// A switchover asked for and not yet done: set by `Switchover`, kept through the
    /// failover its primary begins (whose plan prefers `to`), cleared when an epoch opens
    /// or by `EndSwitchover`.
    #[serde(default)]
    pub switchover: Option<SwitchoverRecord>,
    /// Switchovers recorded so far (each one's `id` is the count when it was).
    #[serde(default)]
    pub switchovers: u64,
    /// How long a primary's quorum contact lasts after the acknowledgements it stands on
    /// (its lease), the same on every node, for the failover's wait for it to hold
    /// (`Coordinator::lease_ms`): fixed at the bootstrap (0: a cluster bootstrapped by a
    /// version that did not say; each node then takes its own failure timeout).
    #[serde(default)]
    pub lease_ms: u64,
    /// The id of the database the cluster holds (ditto_log's `identity`), drawn at the
    /// bootstrap: every node writes it into its directory before its first server starts,
    /// so that every node's directory names one database whichever node's open comes first
    /// (0: a cluster bootstrapped by an older version; each directory then takes its first
    /// primary's). (Before 2026-12-05, evening, a node promoted before any backup had joined
    /// made an id of its own, and the old primary's rejoin was refused; found by a review.)
    #[serde(default)]
    pub database: u64,
}

/// A switchover under way (`Command::Switchover`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchoverRecord {
    /// The serving epoch it was asked in.
    pub epoch: u64,
    pub from: NodeId,
    pub to: NodeId,
    /// Which switchover this is (`ControlState::switchovers` when it was recorded).
    #[serde(default)]
    pub id: u64,
}

/// The longest client address a member may have (`host:port`).
pub const MEMBER_ADDR_MAX: usize = 300;

/// A member's client address as an operator gives it: `host:port`, a port a number, at
/// most `MEMBER_ADDR_MAX` bytes (a longer one, carried in the Raft log, made a message no
/// peer takes, and the log stopped: found by a review).
pub fn check_member_addr(addr: &str) -> Result<(), String> {
    if addr.len() > MEMBER_ADDR_MAX {
        return Err(format!("a client address of {} bytes (at most {MEMBER_ADDR_MAX})", addr.len()));
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("the client address {addr:?} is not host:port")),
    }
}

impl ControlState {
    /// Applies one committed command; `Err` says why it was refused (the state is then
    /// unchanged).
    pub fn apply(&mut self, cmd: &Command) -> Result<(), String> {
        match cmd {
            Command::Bootstrap { members, primary, policy, lease_ms, database } => {
                if self.epoch != 0 {
                    return Err("already bootstrapped".into());
                }
                if !members.iter().any(|m| m.id == *primary) {
                    return Err(format!("primary {primary} is not a member"));
                }
                // (Merged silently before: one member fewer than the nodes started, and so
                // a smaller quorum than the operator counted on; found by a review.)
                let ids: std::collections::BTreeSet<NodeId> = members.iter().map(|m| m.id).collect();
                if ids.len() != members.len() || ids.contains(&0) {
                    return Err("a bootstrap's members must have distinct ids, none of them 0".into());
                }
                self.members = members.iter().map(|m| (m.id, m.clone())).collect();
                self.policy = policy.clone();
                self.lease_ms = *lease_ms;
                self.database = *database;
                self.epoch = 1;
                self.phase = Some(Phase::Serving);
                self.epochs.push(EpochRecord {
                    epoch: 1,
                    primary: *primary,
                    start: 0,
                    recovered: None,
                    discarded_by_primary: None,
                });
            }
            Command::HandOver { epoch, switchover, .. } => {
                if self.phase != Some(Phase::Serving)
                    || self.switchover.as_ref().map(|s| (s.epoch + 1, s.id)) != Some((*epoch, *switchover))
                {
                    return Err(format!(
                        "a hand-over to epoch {epoch} for switchover {switchover}, but no such switchover is under way ({:?})",
                        self.switchover
                    ));
                }
                self.epoch = *epoch;
                self.phase = Some(Phase::Failover);
            }
            Command::BeginFailover { epoch, .. } => {
                if *epoch != self.epoch + 1 || self.epochs.is_empty() {
                    return Err(format!("failover to epoch {epoch}, but the newest epoch begun is {}", self.epoch));
                }
                self.epoch = *epoch;
                self.phase = Some(Phase::Failover);
            }
            Command::OpenEpoch { epoch, primary, recovered_epoch, recovery_point, start, .. } => {
                let open = self.epochs.last().map(|e| e.epoch);
                if *epoch != self.epoch || self.phase != Some(Phase::Failover) {
                    return Err(format!("epoch {epoch} cannot open: newest begun {} ({:?})", self.epoch, self.phase));
                }
                if open != Some(*recovered_epoch) {
                    return Err(format!(
                        "epoch {epoch} recovers epoch {recovered_epoch}, but {open:?} is the open one"
                    ));
                }
                if !self.members.contains_key(primary) {
                    return Err(format!("primary {primary} is not a member"));
                }
                let floor = self.epochs.iter().map(|e| e.start).max().unwrap_or(0);
                if start < recovery_point || *start < floor {
                    return Err(format!(
                        "epoch {epoch} would start at {start}, below its recovery point {recovery_point} or an earlier start {floor}"
                    ));
                }
                for e in &mut self.epochs {
                    e.recovered = Some(e.recovered.map_or(*recovery_point, |r| r.min(*recovery_point)));
                }
                self.epochs.push(EpochRecord {
                    epoch: *epoch,
                    primary: *primary,
                    start: *start,
                    recovered: None,
                    discarded_by_primary: None,
                });
                self.phase = Some(Phase::Serving);
                self.switchover = None;
            }
            Command::SetPolicy { policy } => {
                ditto_replication::CommitPolicy::parse(policy)?;
                self.policy = policy.clone();
            }
            Command::AddMember { member } => {
                self.may_change_members()?;
                match self.learners.get(&member.id) {
                    // A learner promoted: as it was added.
                    Some(l) if l != member => {
                        return Err(format!("node {} is a learner added as {l:?}, not {member:?}", member.id))
                    }
                    Some(_) => {
                        self.learners.remove(&member.id);
                    }
                    None => self.may_add(member)?,
                }
                self.members.insert(member.id, member.clone());
                self.config += 1;
            }
            Command::AddLearner { member } => {
                self.may_change_members()?;
                if self.learners.get(&member.id) == Some(member) {
                    return Err(format!("node {} is already a learner", member.id));
                }
                self.may_add(member)?;
                // No new configuration: no quorum moved, so nothing for the primary to
                // settle (a settle can wait long: for a dead backup to return, under `all`).
                self.learners.insert(member.id, member.clone());
            }
            Command::RemoveMember { id } if self.learners.contains_key(id) => {
                self.may_change_members()?;
                self.learners.remove(id);
                self.retired.insert(*id);
            }
            Command::RemoveMember { id } => {
                self.may_change_members()?;
                if self.retired.contains(id) {
                    return Err(format!("node {id} was removed already"));
                }
                if !self.members.contains_key(id) {
                    return Err(format!("node {id} is not a member"));
                }
                if self.primary() == Some(*id) {
                    return Err(format!(
                        "node {id} is the primary: hand its role to another node first (`ditto cluster switchover`), then remove it"
                    ));
                }
                if self.members.len() == 1 {
                    return Err("the last member cannot be removed".into());
                }
                self.members.remove(id);
                self.retired.insert(*id);
                self.config += 1;
            }
            Command::ConfigApplied { epoch, primary, config } => {
                if self.phase != Some(Phase::Serving)
                    || self.epochs.last().map(|e| (e.epoch, e.primary)) != Some((*epoch, *primary))
                    || *config != self.config
                {
                    return Err(format!(
                        "configuration {config} settled by node {primary} in epoch {epoch}, but the cluster is at configuration {} in epoch {} ({:?})",
                        self.config, self.epoch, self.phase
                    ));
                }
                self.settled = Some((*epoch, *config));
            }
            Command::CountDiscarded { epoch, node, commits } => {
                let Some(e) = self.epochs.iter_mut().find(|e| e.epoch == *epoch) else {
                    return Err(format!("no epoch {epoch} opened"));
                };
                if e.primary != *node || e.recovered.is_none() || e.discarded_by_primary.is_some() {
                    return Err(format!(
                        "node {node} counts what it discarded of epoch {epoch} (primary {}, recovered {:?}, counted {:?})",
                        e.primary, e.recovered, e.discarded_by_primary
                    ));
                }
                e.discarded_by_primary = Some(*commits);
            }
            Command::Switchover { epoch, from, to } => {
                if self.phase != Some(Phase::Serving) || *epoch != self.epoch {
                    return Err(format!(
                        "a switchover in epoch {epoch}, but the cluster is at epoch {} ({:?})",
                        self.epoch, self.phase
                    ));
                }
                if let Some(s) = &self.switchover {
                    return Err(format!("a switchover from node {} to node {} is already under way", s.from, s.to));
                }
                if self.primary() != Some(*from) {
                    return Err(format!("node {from} is not the primary (node {:?} is)", self.primary()));
                }
                if to == from || !self.members.contains_key(to) {
                    return Err(format!("node {to} is not a member other than the primary"));
                }
                self.may_change_members()?;
                self.switchovers += 1;
                self.switchover = Some(SwitchoverRecord { epoch: *epoch, from: *from, to: *to, id: self.switchovers });
            }
            Command::EndSwitchover { epoch, switchover, .. } => {
                let named = |s: &SwitchoverRecord| s.epoch == *epoch && (*switchover == 0 || s.id == *switchover);
                if self.phase != Some(Phase::Serving) || !self.switchover.as_ref().is_some_and(named) {
                    return Err(format!("no switchover of epoch {epoch} (number {switchover}) is waiting to begin"));
                }
                self.switchover = None;
            }
        }
        self.check();
        Ok(())
    }

    /// The primary that accepts writes now, if any (none while a failover runs).
    pub fn primary(&self) -> Option<NodeId> {
        match self.phase {
            Some(Phase::Serving) => self.epochs.last().map(|e| e.primary),
            _ => None,
        }
    }

    /// The epoch whose batches nodes hold as the live tail (the last that opened).
    pub fn open_epoch(&self) -> Option<&EpochRecord> {
        self.epochs.last()
    }

    /// Whether a node accepts a batch of `epoch` from `from` (the fence: once a newer
    /// epoch has begun, nothing of an older one is accepted).
    pub fn accepts(&self, epoch: u64, from: NodeId) -> bool {
        self.phase == Some(Phase::Serving) && epoch == self.epoch && self.primary() == Some(from)
    }

    /// The highest timestamp of `epoch` that survives, once a later epoch has opened.
    pub fn recovery_point(&self, epoch: u64) -> Option<Ts> {
        self.epochs.iter().find(|e| e.epoch == epoch).and_then(|e| e.recovered).map(Ts)
    }

    /// Epoch `epoch`, as a failover that recovers it sees it: its start, and the point
    /// the epoch before it was cut at (nothing survives between the two).
    pub fn recovering(&self, epoch: u64) -> Option<crate::failover::Recovered> {
        let at = self.epochs.iter().position(|e| e.epoch == epoch)?;
        let start = self.epochs[at].start;
        let floor = at.checked_sub(1).and_then(|k| self.epochs[k].recovered).unwrap_or(0).min(start);
        Some(crate::failover::Recovered { epoch, start, floor })
    }

    /// Why the membership may not change now, if it may not: a change waits for the open
    /// epoch to serve and for its primary to have settled the current configuration. One
    /// change at a time, each settled before the next, keeps every quorum that released a
    /// commit overlapping every quorum a later failover gathers (docs/cluster.md,
    /// "Membership changes").
    pub fn may_change_members(&self) -> Result<(), String> {
        if self.phase != Some(Phase::Serving) {
            return Err(format!("epoch {} is failing over; change the membership once it serves", self.epoch));
        }
        if let Some(s) = &self.switchover {
            return Err(format!("a switchover from node {} to node {} is under way", s.from, s.to));
        }
        let open = self.epochs.last().map_or(0, |e| e.epoch);
        if self.settled != Some((open, self.config)) {
            return Err(format!(
                "the primary has not settled configuration {} yet (it counts the new membership once a quorum of it holds everything it released); ask again",
                self.config
            ));
        }
        Ok(())
    }

    /// Whether `why`, a change's refusal, is one that passes (`may_change_members`'s: a
    /// failover, a switchover, a configuration not settled yet): it is asked again.
    pub fn refusal_passes(&self, why: &str) -> bool {
        self.may_change_members().err().as_deref() == Some(why)
    }

    /// Whether `member`, new, may join (as a member or a learner): a fresh id, never used
    /// before, and an address nobody serves clients at.
    fn may_add(&self, member: &Member) -> Result<(), String> {
        if member.id == 0 || self.members.contains_key(&member.id) || self.learners.contains_key(&member.id) {
            return Err(format!("node {} is already a member or a learner (or 0, which is not an id)", member.id));
        }
        if self.retired.contains(&member.id) {
            return Err(format!(
                "node {} was removed, and ids are never used again: add the node under a new id, with a new directory",
                member.id
            ));
        }
        if let Some(m) = self.members.values().chain(self.learners.values()).find(|m| m.addr == member.addr) {
            return Err(format!("node {} already serves clients at {}", m.id, m.addr));
        }
        Ok(())
    }

    /// A member or a learner: how node `id` is reached.
    pub fn node(&self, id: NodeId) -> Option<&Member> {
        self.members.get(&id).or_else(|| self.learners.get(&id))
    }

    /// The quorum of the membership.
    pub fn quorum(&self) -> usize {
        self.members.len() / 2 + 1
    }

    fn check(&self) {
        let mut prev: Option<&EpochRecord> = None;
        for (i, e) in self.epochs.iter().enumerate() {
            assert!(e.epoch <= self.epoch, "epoch {} opened above the newest begun {}", e.epoch, self.epoch);
            let last = i + 1 == self.epochs.len();
            assert_eq!(e.recovered.is_none(), last, "only the open epoch lacks a recovery point: {:?}", self.epochs);
            if let Some(p) = prev {
                assert!(e.epoch > p.epoch, "epochs out of order: {:?}", self.epochs);
                assert!(e.start >= p.start, "epoch {} starts below its predecessor", e.epoch);
            }
            prev = Some(e);
        }
        if let Some(s) = &self.switchover {
            assert!(s.epoch <= self.epoch, "a switchover asked in epoch {} above the newest begun", s.epoch);
        }
        assert!(
            self.learners.keys().all(|id| !self.members.contains_key(id)),
            "a node both a member and a learner: {:?} {:?}",
            self.members.keys(),
            self.learners.keys()
        );
        if self.phase == Some(Phase::Serving) {
            assert_eq!(
                self.epochs.last().map(|e| e.epoch),
                Some(self.epoch),
                "serving an epoch that is not the newest"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operator's member address is host:port and short; anything else is refused
    /// before it is proposed (a long one stopped the Raft log).
    #[test]
    fn a_member_address_is_host_and_port_and_short() {
        assert!(check_member_addr("127.0.0.1:7001").is_ok());
        assert!(check_member_addr("db-3.example:6379").is_ok());
        for bad in ["h", ":1", "h:", "h:x", "h:70000"] {
            assert!(check_member_addr(bad).unwrap_err().contains("host:port"), "{bad}");
        }
        let long = format!("{}:1", "h".repeat(4_000_000));
        assert!(check_member_addr(&long).unwrap_err().contains("at most"));
    }

    fn boot() -> ControlState {
        let mut s = ControlState::default();
        let members = (1..=3)
            .map(|id| Member { id, addr: format!("127.0.0.1:{}", 7000 + id), repl: 0, control: 0, tls: 0 })
            .collect();
        s.apply(&Command::Bootstrap { members, primary: 1, policy: "majority".into(), lease_ms: 0, database: 0 })
            .unwrap();
        s
    }

    /// A bootstrap naming one id twice, or id 0, is refused and changes nothing (the two
    /// were merged into one member: a smaller quorum than the nodes started).
    #[test]
    fn a_bootstrap_with_a_repeated_id_or_id_0_is_refused() {
        let m = |id| Member { id, addr: format!("127.0.0.1:{}", 7000 + id), repl: 0, control: 0, tls: 0 };
        for members in [vec![m(1), m(2), m(2)], vec![m(1), m(0), m(2)]] {
            let mut s = ControlState::default();
            let e = s
                .apply(&Command::Bootstrap { members, primary: 1, policy: "majority".into(), lease_ms: 0, database: 0 })
                .unwrap_err();
            assert!(e.contains("distinct ids"), "{e}");
            assert_eq!(s, ControlState::default());
        }
    }

    #[test]
    fn a_failover_fences_the_old_epoch_then_opens_the_new_one() {
        let mut s = boot();
        assert!(s.accepts(1, 1));
        assert!(!s.accepts(1, 2), "only the primary's batches");
        s.apply(&Command::BeginFailover { epoch: 2, reason: "test".into() }).unwrap();
        assert!(!s.accepts(1, 1), "fenced");
        assert_eq!(s.primary(), None);
        let open = Command::OpenEpoch {
            epoch: 2,
            primary: 2,
            recovered_epoch: 1,
            recovery_point: 40,
            start: 55,
            lost: 3,
            phases_ms: [0, 0],
            writes_after_ms: 0,
        };
        s.apply(&open).unwrap();
        assert_eq!(s.primary(), Some(2));
        assert!(s.accepts(2, 2) && !s.accepts(1, 1) && !s.accepts(2, 1));
        assert_eq!(s.recovery_point(1), Some(Ts(40)));
        assert_eq!(s.recovery_point(2), None);
        // Applied twice (a late duplicate), it is refused and changes nothing.
        let before = s.clone();
        assert!(s.apply(&open).is_err());
        assert_eq!(s, before);
    }

    #[test]
    fn stale_commands_are_refused_and_change_nothing() {
        let mut s = boot();
        let before = s.clone();
        for bad in [
            Command::BeginFailover { epoch: 3, reason: "skips an epoch".into() },
            Command::OpenEpoch {
                epoch: 1,
                primary: 2,
                recovered_epoch: 1,
                recovery_point: 1,
                start: 1,
                lost: 0,
                phases_ms: [0, 0],
                writes_after_ms: 0,
            },
            Command::SetPolicy { policy: "most".into() },
            Command::Bootstrap { members: vec![], primary: 1, policy: "local".into(), lease_ms: 0, database: 0 },
        ] {
            assert!(s.apply(&bad).is_err(), "{bad:?}");
            assert_eq!(s, before);
        }
        s.apply(&Command::BeginFailover { epoch: 2, reason: "t".into() }).unwrap();
        let before = s.clone();
        // (primary, recovered epoch, recovery point, start): an unknown primary, the wrong
        // epoch recovered, a point above the start.
        let open = |primary, recovered_epoch, recovery_point, start| Command::OpenEpoch {
            epoch: 2,
            primary,
            recovered_epoch,
            recovery_point,
            start,
            lost: 0,
            phases_ms: [0, 0],
            writes_after_ms: 0,
        };
        for bad in [open(9, 1, 5, 5), open(2, 0, 5, 5), open(2, 1, 9, 5)] {
            assert!(s.apply(&bad).is_err(), "{bad:?}");
            assert_eq!(s, before);
        }
    }

    #[test]
    fn a_lower_recovery_point_later_cuts_the_older_epochs_too() {
        let mut s = boot();
        s.apply(&Command::BeginFailover { epoch: 2, reason: "t".into() }).unwrap();
        s.apply(&Command::OpenEpoch {
            epoch: 2,
            primary: 2,
            recovered_epoch: 1,
            recovery_point: 40,
            start: 50,
            lost: 0,
            phases_ms: [0, 0],
            writes_after_ms: 0,
        })
        .unwrap();
        s.apply(&Command::BeginFailover { epoch: 3, reason: "t".into() }).unwrap();
        let bad = Command::OpenEpoch {
            epoch: 3,
            primary: 3,
            recovered_epoch: 2,
            recovery_point: 35,
            start: 45,
            lost: 0,
            phases_ms: [0, 0],
            writes_after_ms: 0,
        };
        assert!(s.apply(&bad).is_err(), "starts below epoch 2's start");
        s.apply(&Command::OpenEpoch {
            epoch: 3,
            primary: 3,
            recovered_epoch: 2,
            recovery_point: 35,
            start: 60,
            lost: 0,
            phases_ms: [0, 0],
            writes_after_ms: 0,
        })
        .unwrap();
        assert_eq!(s.recovery_point(1), Some(Ts(35)));
        assert_eq!(s.recovery_point(2), Some(Ts(35)), "nothing of epoch 2 survives");
    }

    /// A learner is added as any change is (settled first), is no member (no quorum, no
    /// failover's choice, no switchover's target), is promoted only as it was added, and
    /// is removed and its id retired as a member's is.
    #[test]
    fn a_learner_is_no_member_until_promoted() {
        let mut s = boot();
        s.apply(&Command::ConfigApplied { epoch: 1, primary: 1, config: 0 }).unwrap();
        let m4 = Member { id: 4, addr: "127.0.0.1:7004".into(), repl: 1, control: 2, tls: 0 };
        s.apply(&Command::AddLearner { member: m4.clone() }).unwrap();
        assert_eq!((s.members.len(), s.learners.len(), s.config, s.quorum()), (3, 1, 0, 2), "no new configuration");
        assert_eq!(s.node(4), Some(&m4));
        let settle = |s: &mut ControlState| {
            let c = Command::ConfigApplied { epoch: 1, primary: 1, config: s.config };
            s.apply(&c).unwrap();
        };
        assert!(s.may_change_members().is_ok(), "still settled: the next change may go ahead");
        for bad in [
            Command::AddLearner { member: m4.clone() },                      // already one
            Command::AddLearner { member: Member { id: 2, ..m4.clone() } },  // a member's id
            Command::AddLearner { member: Member { id: 5, ..m4.clone() } },  // the learner's address
            Command::AddMember { member: Member { id: 5, ..m4.clone() } },   // the same
            Command::AddMember { member: Member { repl: 9, ..m4.clone() } }, // not as it was added
            Command::Switchover { epoch: 1, from: 1, to: 4 },                // not a member
        ] {
            let before = s.clone();
            assert!(s.apply(&bad).is_err(), "{bad:?}");
            assert_eq!(s, before);
        }
        let open = Command::OpenEpoch {
            epoch: 2,
            primary: 4,
            recovered_epoch: 1,
            recovery_point: 10,
            start: 10,
            lost: 0,
            phases_ms: [0, 0],
            writes_after_ms: 0,
        };
        let mut f = s.clone();
        f.apply(&Command::BeginFailover { epoch: 2, reason: "test".into() }).unwrap();
        assert!(f.apply(&open).unwrap_err().contains("not a member"), "a learner is never the new primary");
        s.apply(&Command::AddMember { member: m4.clone() }).unwrap();
        assert_eq!((s.members.len(), s.learners.len(), s.config, s.quorum()), (4, 0, 1, 3));
        assert!(s.apply(&Command::AddLearner { member: m4.clone() }).unwrap_err().contains("not settled"));
        settle(&mut s);
        // A second learner, removed: its id is retired.
        let m5 = Member { id: 5, addr: "127.0.0.1:7005".into(), repl: 1, control: 2, tls: 0 };
        s.apply(&Command::AddLearner { member: m5.clone() }).unwrap();
        s.apply(&Command::RemoveMember { id: 5 }).unwrap();
        assert!(s.learners.is_empty() && s.retired.contains(&5) && s.members.len() == 4 && s.config == 1);
        assert!(s.apply(&Command::AddLearner { member: m5 }).unwrap_err().contains("never used again"));
    }

    /// Membership changes wait for the primary to settle the last one, never remove the
    /// primary, and never use a removed id again.
    #[test]
    fn membership_changes_are_one_at_a_time_settled_and_never_reuse_an_id() {
        let mut s = boot();
        let m4 = Member { id: 4, addr: "127.0.0.1:7004".into(), repl: 1, control: 2, tls: 0 };
        let before = s.clone();
        assert!(s.apply(&Command::AddMember { member: m4.clone() }).unwrap_err().contains("not settled"));
        assert_eq!(s, before);
        let settle = |s: &mut ControlState| {
            let c = Command::ConfigApplied { epoch: 1, primary: 1, config: s.config };
            s.apply(&c).unwrap();
        };
        assert!(s.apply(&Command::ConfigApplied { epoch: 1, primary: 2, config: 0 }).is_err(), "not the primary");
        settle(&mut s);
        s.apply(&Command::AddMember { member: m4.clone() }).unwrap();
        assert_eq!((s.members.len(), s.config, s.quorum()), (4, 1, 3));
        assert!(s.apply(&Command::RemoveMember { id: 2 }).unwrap_err().contains("not settled"));
        assert!(s.apply(&Command::ConfigApplied { epoch: 1, primary: 1, config: 0 }).is_err(), "an old configuration");
        settle(&mut s);
        for bad in [
            Command::AddMember { member: m4.clone() },
            Command::AddMember { member: Member { id: 5, ..m4.clone() } }, // the same address
            Command::RemoveMember { id: 1 },                               // the primary
            Command::RemoveMember { id: 9 },
        ] {
            let before = s.clone();
            assert!(s.apply(&bad).is_err(), "{bad:?}");
            assert_eq!(s, before);
        }
        s.apply(&Command::RemoveMember { id: 2 }).unwrap();
        settle(&mut s);
        let back =
            Command::AddMember { member: Member { id: 2, addr: "127.0.0.1:7002".into(), repl: 1, control: 2, tls: 0 } };
        assert!(s.apply(&back).unwrap_err().contains("never used again"));
        // Removed again (an answer lost, asked again): said to be done already.
        let before = s.clone();
        assert!(s.apply(&Command::RemoveMember { id: 2 }).unwrap_err().contains("was removed already"));
        assert_eq!(s, before);
        assert!(!s.refusal_passes("node 2 was removed already"), "a refusal for good is not asked again");
        // A failover in progress holds changes back: a refusal that passes.
        s.apply(&Command::BeginFailover { epoch: 2, reason: "t".into() }).unwrap();
        let why = s.apply(&Command::RemoveMember { id: 3 }).unwrap_err();
        assert!(why.contains("failing over") && s.refusal_passes(&why), "{why}");
    }

    /// A member's TLS port is left out of the entry when none is named, so entries read
    /// and written as before it existed; one that names it keeps it.
    #[test]
    fn a_members_tls_port_is_written_only_when_named() {
        let old = r#"{"id":2,"addr":"127.0.0.1:7002","repl":1,"control":2}"#;
        let m: Member = serde_json::from_str(old).unwrap();
        assert_eq!(m.tls, 0);
        assert_eq!(serde_json::to_string(&m).unwrap(), old);
        let named = Member { tls: 7302, ..m };
        let text = serde_json::to_string(&named).unwrap();
        assert!(text.contains(r#""tls":7302"#), "{text}");
        assert_eq!(serde_json::from_str::<Member>(&text).unwrap(), named);
    }

    /// An old primary's count of what it discarded is recorded once, for its own epoch,
    /// once that epoch was cut.
    #[test]
    fn an_old_primary_counts_what_it_discarded_once() {
        let mut s = boot();
        let count = |node, commits| Command::CountDiscarded { epoch: 1, node, commits };
        assert!(s.apply(&count(1, 3)).is_err(), "epoch 1 is not cut yet");
        s.apply(&Command::BeginFailover { epoch: 2, reason: "t".into() }).unwrap();
        s.apply(&Command::OpenEpoch {
            epoch: 2,
            primary: 2,
            recovered_epoch: 1,
            recovery_point: 9,
            start: 9,
            lost: 0,
            phases_ms: [0, 0],
            writes_after_ms: 0,
        })
        .unwrap();
        assert!(s.apply(&count(2, 3)).is_err(), "only epoch 1's primary");
        s.apply(&count(1, 3)).unwrap();
        assert_eq!(s.epochs[0].discarded_by_primary, Some(3));
        let before = s.clone();
        assert!(s.apply(&count(1, 5)).is_err(), "once");
        assert_eq!(s, before);
    }

    #[test]
    fn commands_round_trip_and_garbage_is_an_error() {
        let c = Command::OpenEpoch {
            epoch: 7,
            primary: 3,
            recovered_epoch: 5,
            recovery_point: 99,
            start: 120,
            lost: 2,
            phases_ms: [4, 9],
            writes_after_ms: 37,
        };
        assert_eq!(Command::decode(&c.encode()).unwrap(), c);
        assert!(Command::decode(b"{\"Nope\":1}").is_err());
        // A command written before a field was added decodes with its default.
        let old = br#"{"OpenEpoch":{"epoch":2,"primary":1,"recovered_epoch":1,"recovery_point":5,"start":5,"lost":0}}"#;
        assert!(matches!(
            Command::decode(old).unwrap(),
            Command::OpenEpoch { phases_ms: [0, 0], writes_after_ms: 0, .. }
        ));
        let old = br#"{"Bootstrap":{"members":[],"primary":1,"policy":"majority"}}"#;
        assert!(matches!(Command::decode(old).unwrap(), Command::Bootstrap { lease_ms: 0, database: 0, .. }));
        let boot = Command::Bootstrap {
            members: vec![],
            primary: 1,
            policy: "majority".into(),
            lease_ms: 250,
            database: 0x0123_4567_89ab_cdef,
        };
        assert_eq!(Command::decode(&boot.encode()).unwrap(), boot);
        assert!(Command::decode(&[0xff, 0x00]).is_err());
    }

    #[test]
    fn a_switchover_is_recorded_once_for_the_serving_primary_and_ends_with_the_next_epoch() {
        let mut s = boot();
        let sw = Command::Switchover { epoch: 1, from: 1, to: 3 };
        assert!(s.clone().apply(&sw).unwrap_err().contains("not settled"), "the membership first");
        s.apply(&Command::ConfigApplied { epoch: 1, primary: 1, config: 0 }).unwrap();
        let before = s.clone();
        for (bad, why) in [
            (Command::Switchover { epoch: 1, from: 2, to: 3 }, "is not the primary"),
            (Command::Switchover { epoch: 1, from: 1, to: 1 }, "not a member other than the primary"),
            (Command::Switchover { epoch: 1, from: 1, to: 9 }, "not a member other than the primary"),
            (Command::Switchover { epoch: 2, from: 1, to: 3 }, "the cluster is at epoch 1"),
            (Command::EndSwitchover { epoch: 1, switchover: 0, why: "t".into() }, "no switchover"),
        ] {
            let e = s.apply(&bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
            assert_eq!(s, before, "a refused command changes nothing");
        }
        s.apply(&sw).unwrap();
        assert!(s.clone().apply(&sw).unwrap_err().contains("already under way"));
        assert!(s.may_change_members().unwrap_err().contains("switchover"), "no membership change meanwhile");
        let mut ended = s.clone();
        ended.apply(&Command::EndSwitchover { epoch: 1, switchover: 1, why: "t".into() }).unwrap();
        assert_eq!(ended.switchover, None);
        // A hand-over after the switchover was given up is refused (its primary takes
        // writes again); one while it is under way begins the failover.
        let hand = Command::HandOver { epoch: 2, switchover: 1, reason: "switchover".into() };
        assert!(ended.clone().apply(&hand).unwrap_err().contains("no such switchover"));
        assert!(s.clone().apply(&Command::HandOver { epoch: 3, switchover: 1, reason: "t".into() }).is_err());
        // A late hand-over of a switchover given up does not count for the next one.
        let mut again = ended.clone();
        again.apply(&sw).unwrap();
        assert_eq!(again.switchover.as_ref().map(|w| w.id), Some(2));
        assert!(again.clone().apply(&hand).is_err(), "switchover 1's hand-over, under switchover 2");
        // Nor does a late end of it (a duplicate proposal): switchover 2 goes on.
        let late_end = Command::EndSwitchover { epoch: 1, switchover: 1, why: "t".into() };
        assert!(again.clone().apply(&late_end).unwrap_err().contains("no switchover of epoch 1 (number 1)"));
        let old_entry = br#"{"EndSwitchover":{"epoch":1,"why":"t"}}"#;
        assert!(matches!(Command::decode(old_entry).unwrap(), Command::EndSwitchover { switchover: 0, .. }));
        // The failover keeps it (its plan prefers the target); the opening clears it.
        s.apply(&hand).unwrap();
        assert_eq!(s.phase, Some(Phase::Failover));
        assert_eq!(s.switchover.as_ref().map(|w| w.to), Some(3));
        assert!(
            s.clone().apply(&Command::EndSwitchover { epoch: 1, switchover: 0, why: "t".into() }).is_err(),
            "begun"
        );
        s.apply(&Command::OpenEpoch {
            epoch: 2,
            primary: 3,
            recovered_epoch: 1,
            recovery_point: 10,
            start: 10,
            lost: 0,
            phases_ms: [0, 0],
            writes_after_ms: 0,
        })
        .unwrap();
        assert_eq!((s.switchover.clone(), s.primary()), (None, Some(3)));
    }
}
