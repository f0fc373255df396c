//! Failure detection and the failover's steps, without I/O
//! ========================================================
//! Every node keeps a [`Coordinator`]; only the one on the Raft leader acts. It is fed
//! what the node hears on the data plane (batches, heartbeats, acknowledgements) and the replies of
//! the failover's steps, and answers with [`Action`]s for the caller to carry out:
//!
//! ```text
//!  Serving, primary P not heard for `timeout`  -> Propose(BeginFailover e+1)
//!  Failover at E (committed)                   -> AskReport(E) to every member, again
//!                                                 every `resend` until a quorum reports
//!  a quorum of TailReports                     -> plan (failover.rs) -> Prepare(plan) to
//!                                                 the chosen node
//!  Prepared by it                              -> Propose(OpenEpoch E: primary, recovery
//!                                                 point, start)
//!  no Prepared within `prepare_timeout`        -> Propose(BeginFailover E+1): a new round,
//!                                                 fenced anew
//!  Unprepared by it (a fetch refused, a write  -> the same, once `resend` has passed since
//!  or check failed)                               the plan went out (doubled for each round
//!                                                 in a row that ended so, up to `prepare`)
//! ```
//!
//! A node that is asked for its report first makes the fence durable (it refuses batches
//! of epochs below E from then on, across restarts: see [`Fence`]) and only then reports,
//! so what it reports is everything it will ever have acknowledged of the old epoch.
//! Proposals can be lost with a leader that is replaced; the next leader starts from the
//! state it has applied, so every step is safe to repeat.

use std::collections::BTreeMap;

#[cfg(test)]
use crate::failover::HEARD_STAMP_SLACK_MS;
use crate::failover::{lease_margin_ms, plan_preferring, PlanError, RecoveryPlan, TailReport, NEVER_ACKED};
use crate::state::{Command, ControlState, NodeId, Phase};

/// Timings, in the caller's clock units (milliseconds in a server).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// A primary not heard from for this long is failed over.
    pub failure: u64,
    /// Ask again (reports, proposals) after this long without an answer.
    pub resend: u64,
    /// A chosen primary that has not prepared within this long is passed over.
    pub prepare: u64,
    /// A newly named primary that has not served yet (its server recovers its data
    /// first) is failed over only once its node is also silent in the control plane, or
    /// after this long (at least `failure`).
    pub start: u64,
}

/// What the coordinator asks its node to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Propose(Command),
    /// Ask `to` to fence itself at `epoch` (durably) and report its tails.
    AskReport {
        to: NodeId,
        epoch: u64,
    },
    /// Ask `to` to fetch what `plan.fetch` lists, then to answer `Prepared`.
    Prepare {
        to: NodeId,
        plan: RecoveryPlan,
    },
}

#[derive(Debug)]
struct Round {
    epoch: u64,
    reports: BTreeMap<NodeId, TailReport>,
    /// When each report arrived (this coordinator's clock): with its `acked_ms_ago`, when
    /// its node last acknowledged the old primary, at the latest (`lease_end`).
    reported_at: BTreeMap<NodeId, u64>,
    asked_at: Option<u64>,
    /// The plan, when it was first sent, and when last.
    plan: Option<(RecoveryPlan, u64, u64)>,
    prepared: Option<u64>,
    /// Why the chosen node said it cannot prepare the plan (`on_unprepared`).
    unprepared: Option<String>,
    /// When this coordinator began the round, and when the chosen node had prepared.
    started: u64,
    prepared_at: Option<u64>,
    /// Why the reports so far make no plan (`plan_preferring`'s error), while there is none.
    unplanned: Option<PlanError>,
    /// When every member was last asked again for its report (a round whose reports make
    /// no plan; the others are asked each `resend`).
    asked_all_at: Option<u64>,
}

/// See the module notes.
#[derive(Debug)]
pub struct Coordinator {
    me: NodeId,
    t: Timeouts,
    /// When this coordinator started, or last resumed from a stall (`tick`): a node never
    /// heard from counts as silent since.
    started: u64,
    /// The `now` of the last `tick`; how many stalls it has seen, and the last one's length.
    last_tick: Option<u64>,
    stalls: u64,
    last_stall: u64,
    /// Whether this node serves as the primary now (a node the state names primary but
    /// that restarted does not: it never resumes an epoch it served before, so it is
    /// failed over like any silent primary).
    serving: bool,
    /// The (epoch, primary) last seen serving, and since when: a primary is silent only
    /// for as long as it has been primary (a new one has not shipped anything yet).
    serving_since: Option<(u64, NodeId, u64)>,
    /// Whether this coordinator saw the serving epoch open (it knew the state before it):
    /// only then does it know how long ago that was, and give a start grace.
    saw_open: bool,
    /// The (epoch, phase) of the last tick.
    last_seen: Option<(u64, Option<Phase>)>,
    /// This node was named primary and its server is still starting (its data plane says).
    starting: bool,
    /// When each other node was last heard from (its data plane; this node itself while
    /// it serves).
    heard: BTreeMap<NodeId, u64>,
    /// When each node's control plane was last heard from (any Raft message).
    alive: BTreeMap<NodeId, u64>,
    /// When each primary last said it serves with quorum contact (`vouched`, its
    /// `Ctl::Heard`).
    vouched: BTreeMap<NodeId, u64>,
    /// The (epoch, primary) heard from but not vouching for itself, and since when.
    unvouched_since: Option<(u64, NodeId, u64)>,
    /// Nodes that failed as primary or as a round's choice since the open epoch did, each
    /// with that epoch, the latest last: a primary failed over for not vouching for itself,
    /// a chosen node that could not prepare or did not in time. A round chooses another
    /// node where one can be (`try_plan`): the same reports make the same plan, and a
    /// node whose fault lasts would be chosen round after round while another could
    /// serve (found by a review, 2026-12-03; before, only the unvouched primary was
    /// avoided, and for one round).
    avoid: Vec<(u64, NodeId)>,
    round: Option<Round>,
    /// The last proposal and when it was made (not repeated before `resend`).
    /// Each of a tick's proposals is kept (an `EndSwitchover` and a `BeginFailover` may go
    /// in one tick: with one kept, each was proposed again at every tick).
    proposed: Vec<(Command, u64)>,
    /// The switchover waiting to begin (its id), and since when this leader saw it.
    switchover_since: Option<(u64, u64)>,
    /// Failover rounds this coordinator saw end in a row without an epoch opening: a round
    /// whose chosen node cannot prepare ends sooner than the prepare timeout, but each such
    /// round in a row waits twice as long (a fault that outlasts the rounds does not churn
    /// through epochs).
    failed_rounds: u32,
}

impl Coordinator {
    pub fn new(me: NodeId, t: Timeouts, now: u64) -> Coordinator {
        Coordinator {
            me,
            t,
            started: now,
            last_tick: None,
            stalls: 0,
            last_stall: 0,
            serving: false,
            serving_since: None,
            saw_open: false,
            last_seen: None,
            starting: false,
            heard: BTreeMap::new(),
            alive: BTreeMap::new(),
            vouched: BTreeMap::new(),
            unvouched_since: None,
            avoid: Vec::new(),
            round: None,
            proposed: Vec::new(),
            switchover_since: None,
            failed_rounds: 0,
        }
    }

    /// Something arrived from `node` (a batch, a heartbeat, an acknowledgement of the data
    /// plane), here or, for the primary, at a backup that told the leader (`Ctl::Heard`).
    pub fn heard(&mut self, node: NodeId, now: u64) {
        let e = self.heard.entry(node).or_insert(now);
        *e = (*e).max(now);
    }

    /// The primary `node` said it serves with quorum contact (its `Ctl::Heard`, which it
    /// sends only then).
    pub fn vouched(&mut self, node: NodeId, now: u64) {
        let e = self.vouched.entry(node).or_insert(now);
        *e = (*e).max(now);
    }

    /// A control-plane message arrived from `node`: its supervisor is up (a primary still
    /// starting is given `Timeouts::start` while this goes on).
    pub fn alive(&mut self, node: NodeId, now: u64) {
        let e = self.alive.entry(node).or_insert(now);
        *e = (*e).max(now);
    }

    /// How many stalls of its own loop this coordinator has seen (`tick`), and how long
    /// the last one was.
    pub fn stalls(&self) -> (u64, u64) {
        (self.stalls, self.last_stall)
    }

    pub fn failure_timeout(&self) -> u64 {
        self.t.failure
    }

    pub fn resend_timeout(&self) -> u64 {
        self.t.resend
    }

    /// Whether `node`'s data plane was heard within `ms` (the leader hands its leadership
    /// only to a backup that hears the primary).
    pub fn heard_within(&self, node: NodeId, now: u64, ms: u64) -> bool {
        self.heard.get(&node).is_some_and(|&t| now.saturating_sub(t) <= ms)
    }

    /// Forgets what was heard from other nodes, so that contact counts only from here on
    /// (a node that starts serving an epoch counts only its own epoch's acknowledgements:
    /// one applying an old epoch's opening while it catches up never gets any).
    pub fn reset_contact(&mut self) {
        self.heard.clear();
    }

    /// A switchover's target when the operator names none: the lowest-id member other
    /// than the primary whose control plane was heard within the failure timeout (this
    /// node counts as heard).
    pub fn successor(&self, state: &ControlState, now: u64) -> Option<NodeId> {
        let primary = state.primary()?;
        state.members.keys().copied().find(|&n| {
            n != primary
                && (n == self.me || self.alive.get(&n).is_some_and(|&t| now.saturating_sub(t) < self.t.failure))
        })
    }

    /// Whether this node serves as the primary (see the field's note).
    pub fn set_serving(&mut self, serving: bool) {
        self.serving = serving;
    }

    /// Whether this node, named primary, is still starting its server (a restarted
    /// primary, which never serves its epoch again, is not).
    pub fn set_starting(&mut self, starting: bool) {
        self.starting = starting;
    }

    /// When this node's quorum contact lapses unless it hears more: the quorum-th most
    /// recent time it heard a member (itself now), plus the failure timeout (`None`: it
    /// has no quorum of members heard at all). `has_quorum_contact` is `now` before it.
    pub fn contact_deadline(&self, state: &ControlState, now: u64) -> Option<u64> {
        let mut times: Vec<u64> = state
            .members
            .keys()
            .filter_map(|&n| if n == self.me { Some(now) } else { self.heard.get(&n).copied() })
            .collect();
        times.sort_unstable_by(|a, b| b.cmp(a));
        times.get(state.quorum().checked_sub(1)?).map(|&t| t.saturating_add(self.lease_ms(state)))
    }

    /// How long a primary's quorum contact lasts after the acknowledgements it stands on:
    /// the cluster's, fixed at its bootstrap (`ControlState::lease_ms`), the same on every
    /// node, so that the failover's wait for it (`lease_end`) holds whatever failure
    /// timeout each node was started with; this node's failure timeout for a cluster
    /// bootstrapped before the state said.
    pub fn lease_ms(&self, state: &ControlState) -> u64 {
        match state.lease_ms {
            0 => self.t.failure,
            ms => ms,
        }
    }

    /// Whether a primary may accept writes: it has heard (acknowledgements of its epoch)
    /// from a quorum of the members, itself included, within the failure timeout. A
    /// primary cut off from the majority stops taking writes by itself, before the
    /// majority's coordinator times it out (it could not release them anyway under
    /// `majority` or `all`: the fenced majority refuses its batches; under `local` this
    /// is what stops it).
    pub fn has_quorum_contact(&self, state: &ControlState, now: u64) -> bool {
        // (A quorum heard within the lease is the quorum-th newest heard within it.)
        self.contact_deadline(state, now).is_some_and(|d| now < d)
    }

    fn propose(&mut self, cmd: Command, now: u64, out: &mut Vec<Action>) {
        let resend = self.t.resend;
        self.proposed.retain(|(_, at)| now.saturating_sub(*at) < resend);
        let same = |prev: &Command| match (prev, &cmd) {
            (Command::BeginFailover { epoch: a, .. }, Command::BeginFailover { epoch: b, .. }) => a == b,
            // (Its `writes_after_ms` shrinks as time passes: the same opening.)
            (Command::OpenEpoch { epoch: a, .. }, Command::OpenEpoch { epoch: b, .. }) => a == b,
            _ => *prev == cmd,
        };
        if self.proposed.iter().any(|(prev, _)| same(prev)) {
            return;
        }
        self.proposed.push((cmd.clone(), now));
        out.push(Action::Propose(cmd));
    }

    /// Advances the failover by time (call every few milliseconds).
    ///
    /// Ticks more than half the failure timeout apart mean this node's own loop stalled
    /// (its control thread held: an fsync of its Raft log behind a checkpoint on the same
    /// disk took 300 ms on a 16-core machine). It heard nobody meanwhile, so the silence it
    /// measured across the stall says nothing about the others: silence counts afresh from
    /// the end of the stall. Without this, a leader resuming from a 307 ms stall failed
    /// over a new primary that was serving, right after a switchover.
    pub fn tick(&mut self, now: u64, state: &ControlState, leader: bool) -> Vec<Action> {
        let gap = self.last_tick.map_or(0, |last| now.saturating_sub(last));
        if gap > self.t.failure / 2 {
            self.started = self.started.max(now);
            self.stalls += 1;
            self.last_stall = gap;
        }
        self.last_tick = Some(now);
        let mut out = Vec::new();
        // Every node keeps when the serving epoch opened (as it saw it), leader or not: a
        // follower that becomes leader knows it too.
        if let (Some(Phase::Serving), Some(p)) = (state.phase, state.primary()) {
            if !matches!(self.serving_since, Some((e, q, _)) if e == state.epoch && q == p) {
                self.serving_since = Some((state.epoch, p, now));
                // Seen opening: the last tick knew an older epoch, or this one failing
                // over (not a state found at a start or a catch-up).
                // (Epoch 0 is the state before anything was applied, as at a restart before
                // the node's log replays: not seen.)
                self.saw_open = matches!(self.last_seen, Some((e, ph)) if e > 0 && (e < state.epoch
                    || (e == state.epoch && ph == Some(Phase::Failover))));
            }
        }
        self.last_seen = Some((state.epoch, state.phase));
        // (Every node, leader or not: one that leads a later failover starts its count
        // from the last epoch that opened.)
        if state.phase == Some(Phase::Serving) {
            self.failed_rounds = 0;
            self.avoid.retain(|&(e, _)| e >= state.epoch);
        }
        if !leader || state.phase != Some(Phase::Serving) {
            // (Counted afresh by a leader, for the primary it sees serving.)
            self.unvouched_since = None;
        }
        if !leader {
            self.round = None;
            self.proposed.clear();
            return out;
        }
        match state.phase {
            None => {}
            Some(Phase::Serving) => {
                self.round = None;
                let p = state.primary().expect("serving has a primary");
                let since = match self.serving_since {
                    Some((e, q, t)) if e == state.epoch && q == p => t,
                    _ => now,
                };
                // Silent since it was last heard from, or since it was named primary, or
                // since this node started, whichever is latest. This node itself hears
                // itself while it serves with quorum contact (the leader is the primary:
                // after an election, before it hands the leadership on); named primary but
                // not serving (it restarted, or it is still getting ready) it counts as
                // never heard, like any other. (Before 2026-12-03 it heard itself while it
                // served at all: a leader-primary that lost every backup's link, or whose
                // server hung, while its control plane worked, took no writes and was never
                // failed over, since it hands the leadership on only with contact and only
                // the leader fails a primary over; found by a review.)
                if p == self.me && self.serving && self.has_quorum_contact(state, now) {
                    self.heard(p, now);
                }
                let heard = self.heard.get(&p).copied();
                let silent = now.saturating_sub(heard.unwrap_or(0).max(self.started).max(since));
                // Not yet heard serving since it was named, its node up, within `start`:
                // it is still recovering its data. This node itself, starting or serving
                // without quorum contact yet (its backups still coming to it), has `start`
                // from when it was named, at the bootstrap too (no opening was seen then:
                // the first leader names itself; a review found it failed itself over there
                // when its backups took longer than a failure timeout to connect).
                let starting = heard.is_none_or(|h| h < since)
                    && now.saturating_sub(since) < self.t.start
                    && match p == self.me {
                        // (Its own state says it starts or serves: no opening need be seen,
                        // a restarted primary never serves its epoch again.)
                        true => self.starting || self.serving,
                        false => {
                            self.saw_open && self.alive.get(&p).is_some_and(|&a| now.saturating_sub(a) < self.t.failure)
                        }
                    };
                // A switchover its primary neither began nor gave up (its node went quiet
                // mid-drain, say) is given up after `start`, so that writes and membership
                // changes are not held off for good.
                match &state.switchover {
                    Some(sw) if sw.epoch == state.epoch => {
                        // (By its id: a later switchover of the same epoch is counted
                        // afresh, though no tick saw the state between the two.)
                        let since = match self.switchover_since {
                            Some((id, t)) if id == sw.id => t,
                            _ => now,
                        };
                        self.switchover_since = Some((sw.id, since));
                        if now.saturating_sub(since) >= self.t.start {
                            let why = format!(
                                "node {} did not hand over to node {} within {} ms",
                                sw.from, sw.to, self.t.start
                            );
                            let end = Command::EndSwitchover { epoch: sw.epoch, switchover: sw.id, why };
                            self.propose(end, now, &mut out);
                        }
                    }
                    _ => self.switchover_since = None,
                }
                // Heard (its backups' links are up), but not saying it has quorum contact:
                // a primary cut off from the majority, or whose control thread hangs, takes
                // no writes (its contact lapsed), while this node's backup still hears it.
                // Failed over once that lasts another failure timeout. (Before, it was
                // never failed over while the leader's own backup heard it: with five
                // nodes, a partition leaving the primary with the leader alone kept writes
                // down for as long as it lasted; found by a review.)
                // A primary that has not vouched since it was named is still gathering its
                // quorum (a backup the quorum needs may still be joining): it has the start
                // grace, as one never heard from has.
                let vouched = self.vouched.get(&p).copied().filter(|&v| v >= since);
                let unvouched = p != self.me
                    && silent < self.t.failure
                    && !starting
                    && match vouched {
                        Some(v) => now.saturating_sub(v) >= self.t.failure,
                        None => now.saturating_sub(since) >= self.t.start,
                    };
                let unvouched_for = match (unvouched, self.unvouched_since) {
                    (false, _) => {
                        self.unvouched_since = None;
                        0
                    }
                    // (Counted from the end of this node's own stall, as silence is.)
                    (true, Some((e, q, t))) if e == state.epoch && q == p => now.saturating_sub(t.max(self.started)),
                    (true, _) => {
                        self.unvouched_since = Some((state.epoch, p, now));
                        0
                    }
                };
                if unvouched_for >= self.t.failure {
                    let reason = format!(
                        "primary {p} is heard but has not said it has quorum contact for {} ms (it takes no writes)",
                        unvouched_for + self.t.failure
                    );
                    self.avoid_next(state.epoch, p);
                    self.propose(Command::BeginFailover { epoch: state.epoch + 1, reason }, now, &mut out);
                } else if silent >= self.t.failure && !starting {
                    let reason = if p == self.me {
                        format!("primary {p} (this node) has not served for {silent} ms")
                    } else {
                        format!("primary {p} not heard from for {silent} ms")
                    };
                    self.propose(Command::BeginFailover { epoch: state.epoch + 1, reason }, now, &mut out);
                }
            }
            Some(Phase::Failover) => {
                let epoch = state.epoch;
                if self.round.as_ref().map(|r| r.epoch) != Some(epoch) {
                    if self.round.is_some() {
                        self.failed_rounds = self.failed_rounds.saturating_add(1);
                    }
                    self.round = Some(Round {
                        epoch,
                        reports: BTreeMap::new(),
                        reported_at: BTreeMap::new(),
                        asked_at: None,
                        plan: None,
                        prepared: None,
                        unprepared: None,
                        started: now,
                        prepared_at: None,
                        unplanned: None,
                        asked_all_at: None,
                    });
                }
                if let Some(open) = state.open_epoch() {
                    // A switchover's round waits for its target's report, but not forever.
                    self.try_plan(now, state, open.epoch, &mut out);
                }
                let retry_after = self.retry_after();
                let lease_ms = self.lease_ms(state);
                let r = self.round.as_mut().expect("set above");
                match &mut r.plan {
                    None => {
                        // Reports that make no plan (no node may become primary, or none can
                        // fetch what it lacks) are asked for again, from every member, each
                        // prepare timeout (a report may read a log): what they say
                        // (eligibility, what a log still serves) may change, and no other
                        // report can come once all have. (Before, such a round replanned
                        // the same reports until the leader changed; found by a review.)
                        // So are reports of different stream counts, no count's a quorum:
                        // a node restarted with the cluster's `--workers`, or one stopped,
                        // is then heard (before 2026-12-03, never: found by a review).
                        let again = matches!(
                            r.unplanned,
                            Some(PlanError::NoEligibleNode | PlanError::NoSource | PlanError::StreamCounts(_))
                        ) && now.saturating_sub(r.asked_all_at.unwrap_or(r.started)) >= self.t.prepare;
                        if again || r.asked_at.is_none_or(|t| now.saturating_sub(t) >= self.t.resend) {
                            r.asked_at = Some(now);
                            if again {
                                r.asked_all_at = Some(now);
                            }
                            for &to in state.members.keys().filter(|n| again || !r.reports.contains_key(n)) {
                                out.push(Action::AskReport { to, epoch });
                            }
                        }
                    }
                    Some((p, sent, last)) => {
                        let (p, sent, resend) = (p.clone(), *sent, now.saturating_sub(*last) >= self.t.resend);
                        if resend {
                            *last = now;
                        }
                        if let Some(discarded) = r.prepared {
                            let prepared_at = r.prepared_at.unwrap_or(now);
                            let old_primary = state.open_epoch().map(|e| e.primary);
                            let lease_end = lease_end(&r.reports, &r.reported_at, old_primary, lease_ms);
                            let open = Command::OpenEpoch {
                                epoch,
                                primary: p.primary,
                                recovered_epoch: p.recovered_epoch,
                                recovery_point: p.recovery_point,
                                start: p.start,
                                lost: discarded,
                                phases_ms: [sent.saturating_sub(r.started), prepared_at.saturating_sub(sent)],
                                // (Counted by the new primary from when it applies this,
                                // later than now: never shorter than the lease.)
                                writes_after_ms: lease_end.saturating_sub(now),
                            };
                            self.propose(open, now, &mut out);
                        } else if let Some(why) =
                            r.unprepared.as_ref().filter(|_| now.saturating_sub(sent) >= retry_after)
                        {
                            let reason = format!("node {} could not prepare: {why}", p.primary);
                            self.avoid_next(p.recovered_epoch, p.primary);
                            self.propose(Command::BeginFailover { epoch: epoch + 1, reason }, now, &mut out);
                        } else if now.saturating_sub(sent) >= self.t.prepare {
                            let reason = format!("node {} did not prepare within {} ms", p.primary, self.t.prepare);
                            self.avoid_next(p.recovered_epoch, p.primary);
                            self.propose(Command::BeginFailover { epoch: epoch + 1, reason }, now, &mut out);
                        } else if resend {
                            // The request may have been lost; Prepare is idempotent.
                            out.push(Action::Prepare { to: p.primary, plan: p });
                        }
                    }
                }
            }
        }
        out
    }

    /// `node` failed as the primary of, or as a choice to recover, the open epoch `epoch`:
    /// the next rounds choose another where one can be (`avoid`).
    fn avoid_next(&mut self, epoch: u64, node: NodeId) {
        self.avoid.retain(|&(_, n)| n != node);
        self.avoid.push((epoch, node));
    }

    /// How long after its plan went out a round whose chosen node cannot prepare ends:
    /// `resend`, doubled for each round before it in a row that ended without an epoch
    /// opening, and never longer than the prepare timeout.
    fn retry_after(&self) -> u64 {
        self.t.resend.saturating_mul(1u64 << self.failed_rounds.min(20)).min(self.t.prepare)
    }

    /// Why the failover round this coordinator leads has no plan yet, once some reports
    /// came in (a quorum has not reported; or none that may become primary can fetch
    /// what it lacks, `PlanError::NoSource`): for the logs and the simulation.
    pub fn unplanned(&self) -> Option<(u64, &PlanError)> {
        self.round.as_ref().filter(|r| r.plan.is_none()).and_then(|r| r.unplanned.as_ref().map(|e| (r.epoch, e)))
    }

    /// A node's tail report for the round at `report.fenced_at`.
    pub fn on_report(&mut self, report: TailReport, now: u64, state: &ControlState, leader: bool) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(r) = self.round.as_mut() else { return out };
        let open = state.open_epoch().map(|e| e.epoch);
        if !leader || state.phase != Some(Phase::Failover) || r.epoch != state.epoch || report.fenced_at != r.epoch {
            return out;
        }
        let Some(open_epoch) = open else { return out };
        // Only members' reports count (a learner's never does: it counts in no quorum).
        if report.epoch != open_epoch || !state.members.contains_key(&report.node) {
            return out;
        }
        if r.plan.is_some() {
            // Too late for the plan, but not for the wait for the old primaries' leases,
            // reckoned when the opening is proposed (`lease_end`): the old primary's own
            // report, saying it took writes, ends it (each report bounds its node alone, so
            // a later one takes nothing away).
            r.reported_at.insert(report.node, now);
            r.reports.insert(report.node, report);
            return out;
        }
        r.reported_at.insert(report.node, now);
        r.reports.insert(report.node, report);
        self.try_plan(now, state, open_epoch, &mut out);
        out
    }

    /// Plans the round once a quorum has reported; in a switchover, once its target has
    /// reported too, or `Timeouts::prepare` after the round began without it.
    fn try_plan(&mut self, now: u64, state: &ControlState, open_epoch: u64, out: &mut Vec<Action>) {
        // The nodes that failed since the open epoch did, the latest last.
        let failed: Vec<NodeId> = self.avoid.iter().filter(|&&(e, _)| e == open_epoch).map(|&(_, n)| n).collect();
        let lease_ms = self.lease_ms(state);
        let Some(r) = self.round.as_mut().filter(|r| r.plan.is_none()) else { return };
        // A switchover's target is preferred in the round its hand-over began, not in the
        // rounds after it (each would wait for a dead target's report first; found by a
        // review: `state.switchover` stays until an epoch opens).
        let prefer = state.switchover.as_ref().filter(|s| s.epoch + 1 == r.epoch).map(|s| s.to);
        if prefer.is_some_and(|to| !r.reports.contains_key(&to)) && now.saturating_sub(r.started) < self.t.prepare {
            return;
        }
        // And for its old primary's, for at most the lease's length: drained and fenced, it
        // says it took writes, and the new primary then need not wait for its lease
        // (`lease_end`), which a plan from the backups' reports alone would (before, a
        // switchover whose old primary reported after the others refused writes for a
        // lease longer: 292 ms in a demo against about 100).
        let from = state.switchover.as_ref().filter(|s| s.epoch + 1 == r.epoch).map(|s| s.from);
        if from.is_some_and(|f| !r.reports.contains_key(&f))
            && now.saturating_sub(r.started) < lease_ms.min(self.t.prepare)
        {
            return;
        }
        // (The open epoch is the state's last record: always there.)
        let Some(recovered) = state.recovering(open_epoch) else { return };
        // A node that failed (a primary failed over for want of quorum contact, heard by the
        // leader alone, say; a choice that could not prepare) is not chosen again where
        // another node can be: it would hold the most, be chosen, and fail again, round
        // after round. Every failed node is left out (as a last resort too) if a plan can
        // be made without them; else all but the one that failed longest ago, and so on
        // (so that nodes that fail in turn are each tried again, the longest-rested
        // first); else none.
        let without = |left_out: &[NodeId]| {
            let mut others = r.reports.clone();
            for n in left_out {
                if let Some(x) = others.get_mut(n) {
                    x.eligible = false;
                    x.last_resort = false;
                }
            }
            plan_preferring(&others, state.members.len(), r.epoch, recovered, prefer)
        };
        let mut planned = without(&failed);
        for i in 1..=failed.len() {
            if planned.is_ok() {
                break;
            }
            planned = without(&failed[i..]);
        }
        match planned {
            Ok(p) => {
                r.unplanned = None;
                r.plan = Some((p.clone(), now, now));
                out.push(Action::Prepare { to: p.primary, plan: p });
            }
            Err(e) => r.unplanned = Some(e),
        }
    }

    /// The chosen node holds every stream up to `point` (the recovery point of the plan it
    /// answers: an answer to another round's plan does not count); `discarded` counts the
    /// old epoch's commits above it that the node held.
    #[allow(clippy::too_many_arguments)]
    pub fn on_prepared(
        &mut self,
        node: NodeId,
        epoch: u64,
        point: u64,
        discarded: u64,
        now: u64,
        state: &ControlState,
        leader: bool,
    ) -> Vec<Action> {
        let Some(r) = self.round_answered(node, epoch, point, state, leader) else { return Vec::new() };
        r.prepared = Some(discarded);
        r.prepared_at.get_or_insert(now);
        self.tick(now, state, leader)
    }

    /// The round this leader leads, if an answer of `node` about the plan of `epoch` with
    /// recovery point `point` is about its plan (not another round's, nor another node's).
    fn round_answered(
        &mut self,
        node: NodeId,
        epoch: u64,
        point: u64,
        state: &ControlState,
        leader: bool,
    ) -> Option<&mut Round> {
        let r = self.round.as_mut()?;
        let matches =
            r.plan.as_ref().is_some_and(|(p, _, _)| p.primary == node && p.epoch == epoch && p.recovery_point == point);
        (leader && matches && r.epoch == state.epoch && state.phase == Some(Phase::Failover)).then_some(r)
    }

    /// The chosen node cannot prepare the plan with recovery point `point` (a node it
    /// fetches from refused, what it fetched could not be written, its check failed): the
    /// round ends without waiting for the prepare timeout (`retry_after`), and the next one
    /// gathers fresh reports. An answer to another round's plan, or after `Prepared`,
    /// changes nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn on_unprepared(
        &mut self,
        node: NodeId,
        epoch: u64,
        point: u64,
        why: String,
        now: u64,
        state: &ControlState,
        leader: bool,
    ) -> Vec<Action> {
        let Some(r) = self.round_answered(node, epoch, point, state, leader).filter(|r| r.prepared.is_none()) else {
            return Vec::new();
        };
        r.unprepared = Some(why);
        self.tick(now, state, leader)
    }
}

/// The highest epoch a node has promised to fence at, kept on its disk: once it reported
/// for epoch E it refuses batches of epochs below E, even after a restart that finds its
/// control log behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fence(pub u64);

impl Fence {
    /// Whether a batch of `epoch` from `from` may be accepted.
    pub fn accepts(self, state: &ControlState, epoch: u64, from: NodeId) -> bool {
        epoch >= self.0 && state.accepts(epoch, from)
    }
}

/// When every older primary's lease (its quorum contact, `Coordinator::contact_deadline`
/// on its node) has run out at the latest, on this coordinator's clock, from a round's
/// reports and when each arrived; `old_primary` is the open epoch's primary and
/// `lease_ms` the lease's length (`Coordinator::lease_ms`).
///
/// A primary takes writes only while a quorum of the members, itself counted, has
/// acknowledged it within the lease (each backup stamped heard no later than the primary
/// sent what its ack echoes, `DataPlane::heard`). The reporters are a quorum too: for a
/// primary not among them, the two quorums share another node, which acknowledged it no
/// later than that node's newest acknowledgement of any primary, which its report gives;
/// so that lease ends by the newest such acknowledgement of any reporter, plus the lease
/// and a margin for rounding and the clocks' rates (`lease_margin_ms`). A report's
/// instant is its arrival less its age: later than the truth by the report's delay, never
/// earlier. Every reporter was fenced before it reported: it acknowledges nothing more,
/// and, if it is a primary, takes no more writes. Where the open epoch's primary reported
/// and says it took writes, it did so only once every lease before it had run out (this
/// same wait, at its own opening), so nothing older can write after its report: the
/// leases end at its report's arrival.
pub fn lease_end(
    reports: &BTreeMap<NodeId, TailReport>,
    reported_at: &BTreeMap<NodeId, u64>,
    old_primary: Option<NodeId>,
    lease_ms: u64,
) -> u64 {
    let at = |n: &NodeId| reported_at.get(n).copied().unwrap_or(0);
    if let Some(p) = old_primary.filter(|p| reports.get(p).is_some_and(|r| r.took_writes)) {
        return at(&p);
    }
    reports
        .iter()
        .filter(|(_, r)| r.acked_ms_ago != NEVER_ACKED)
        .map(|(n, r)| at(n).saturating_sub(r.acked_ms_ago).saturating_add(lease_ms + lease_margin_ms(lease_ms)))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Member;

    const T: Timeouts = Timeouts { failure: 100, resend: 20, prepare: 200, start: 100 };

    fn boot(n: u64) -> ControlState {
        let mut s = ControlState::default();
        let members = (1..=n).map(|id| Member { id, addr: String::new(), repl: 0, control: 0, tls: 0 }).collect();
        s.apply(&Command::Bootstrap { members, primary: 1, policy: "majority".into(), lease_ms: 0, database: 0 })
            .unwrap();
        s
    }

    fn report(node: NodeId, fenced_at: u64, streams: &[u64]) -> TailReport {
        TailReport {
            node,
            fenced_at,
            epoch: 1,
            streams: streams.to_vec(),
            newest: 99,
            eligible: true,
            serves_above: 0,
            last_resort: false,
            own_epoch: 0,
            acked_ms_ago: crate::failover::NEVER_ACKED,
            took_writes: false,
        }
    }

    #[test]
    fn a_silent_primary_is_failed_over_step_by_step() {
        let mut s = boot(3);
        let mut c = Coordinator::new(2, T, 0);
        c.heard(1, 0);
        assert!(c.tick(50, &s, true).is_empty(), "heard 50 ms ago");
        assert!(c.tick(90, &s, false).is_empty(), "followers do nothing");
        assert!(c.tick(130, &s, false).is_empty(), "followers do nothing");
        let a = c.tick(150, &s, true);
        let Action::Propose(begin) = &a[0] else { panic!("{a:?}") };
        assert!(matches!(begin, Command::BeginFailover { epoch: 2, .. }));
        assert!(c.tick(155, &s, true).is_empty(), "not proposed again before resend");
        s.apply(begin).unwrap();
        let a = c.tick(160, &s, true);
        assert_eq!(a, (1..=3).map(|to| Action::AskReport { to, epoch: 2 }).collect::<Vec<_>>());
        assert!(c.on_report(report(2, 2, &[10, 20]), 161, &s, true).is_empty(), "one report is no quorum");
        assert!(c.on_report(report(3, 1, &[30, 30]), 161, &s, true).is_empty(), "a report fenced at another epoch");
        let a = c.tick(181, &s, true);
        assert_eq!(a, vec![Action::AskReport { to: 1, epoch: 2 }, Action::AskReport { to: 3, epoch: 2 }]);
        let a = c.on_report(report(3, 2, &[15, 25]), 182, &s, true);
        let [Action::Prepare { to: 3, plan }] = &a[..] else { panic!("{a:?}") };
        assert_eq!(plan.recovery_point, 15);
        assert!(c.on_prepared(2, 2, 15, 0, 183, &s, true).is_empty(), "only the chosen node prepares");
        assert!(c.on_prepared(3, 2, 16, 0, 183, &s, true).is_empty(), "an answer to another plan does not count");
        let a = c.on_prepared(3, 2, 15, 4, 184, &s, true);
        let [Action::Propose(open)] = &a[..] else { panic!("{a:?}") };
        assert_eq!(
            *open,
            Command::OpenEpoch {
                epoch: 2,
                primary: 3,
                recovered_epoch: 1,
                recovery_point: 15,
                start: 99,
                lost: 4,
                // Reports from 160 (the round's start) to 182 (the plan), prepared at 184.
                phases_ms: [22, 2],
                // No reporter acknowledged the old primary: nothing to wait for.
                writes_after_ms: 0,
            }
        );
        s.apply(open).unwrap();
        assert_eq!(s.primary(), Some(3));
        c.heard(3, 185);
        assert!(c.tick(190, &s, true).is_empty(), "the new primary is heard from");
    }

    /// Node 2, leading, fails node 1 over (silent since 0); nodes 2 and 3 report, having
    /// last acknowledged it at 131 and 142; node 3 is chosen and prepares at 184: the
    /// coordinator and the opening's `writes_after_ms`.
    fn opening_after_acks_at_131_and_142(s: &mut ControlState) -> (Coordinator, u64) {
        let mut c = Coordinator::new(2, T, 0);
        c.heard(1, 0);
        for t in [50, 90, 130] {
            c.tick(t, s, true);
        }
        let a = c.tick(150, s, true);
        let Action::Propose(begin) = &a[0] else { panic!("{a:?}") };
        s.apply(begin).unwrap();
        c.tick(160, s, true);
        c.on_report(TailReport { acked_ms_ago: 30, ..report(2, 2, &[10, 20]) }, 161, s, true);
        c.on_report(TailReport { acked_ms_ago: 40, ..report(3, 2, &[15, 25]) }, 182, s, true);
        let a = c.on_prepared(3, 2, 15, 0, 184, s, true);
        let [Action::Propose(Command::OpenEpoch { writes_after_ms, .. })] = &a[..] else { panic!("{a:?}") };
        (c, *writes_after_ms)
    }

    /// The new epoch's opening says how long its primary waits before it takes writes: until
    /// the old primary's lease has run out, as the reports say, counted from the proposal.
    #[test]
    fn the_opening_waits_out_the_old_primarys_lease() {
        let mut s = boot(3);
        let (mut c, writes_after_ms) = opening_after_acks_at_131_and_142(&mut s);
        // 142 + the lease (the failure timeout, 100) + the rounding margin, less 184.
        assert_eq!(writes_after_ms, 142 + 100 + lease_margin_ms(100) - 184);
        // Its wait shrinks with time, but it is the same opening: not proposed again
        // before the resend.
        assert!(c.tick(190, &s, true).is_empty());
        let a = c.tick(205, &s, true);
        let [Action::Propose(Command::OpenEpoch { writes_after_ms, .. })] = &a[..] else { panic!("{a:?}") };
        assert_eq!(*writes_after_ms, 142 + 100 + lease_margin_ms(100) - 205);

        // The old primary among the reporters, having taken writes, was fenced before it
        // reported, and the leases before its own had run out when it took them: the
        // leases end at its report's arrival, whatever the others acknowledged.
        let mut reports = BTreeMap::new();
        let mut at = BTreeMap::new();
        for (n, ago, t) in [(1, NEVER_ACKED, 170), (2, 5, 175)] {
            reports.insert(n, TailReport { acked_ms_ago: ago, ..report(n, 2, &[1]) });
            at.insert(n, t);
        }
        let others = 170 + 100 + lease_margin_ms(100);
        assert_eq!(lease_end(&reports, &at, Some(1), 100), others, "it did not say it took writes");
        reports.get_mut(&1).unwrap().took_writes = true;
        assert_eq!(lease_end(&reports, &at, Some(1), 100), 170);
        assert_eq!(lease_end(&reports, &at, Some(3), 100), others, "node 1 is not the open epoch's primary");
        // (Node 1, a backup before it was primary, acknowledged a primary too: the newest
        // acknowledgement counts.)
        reports.get_mut(&1).unwrap().acked_ms_ago = 0;
        assert_eq!(lease_end(&reports, &at, Some(3), 100), others);
        reports.get_mut(&2).unwrap().acked_ms_ago = NEVER_ACKED;
        assert_eq!(lease_end(&reports, &at, Some(3), 100), 170 + 100 + lease_margin_ms(100));
        reports.get_mut(&1).unwrap().acked_ms_ago = 30;
        assert_eq!(lease_end(&reports, &at, Some(3), 100), 140 + 100 + lease_margin_ms(100));
        reports.get_mut(&1).unwrap().acked_ms_ago = NEVER_ACKED;
        assert_eq!(lease_end(&reports, &at, Some(3), 100), 0, "no reporter ever acknowledged a primary");
    }

    /// A primary's lease is the cluster's, fixed at its bootstrap, whatever failure timeout
    /// each node runs with: the old primary's contact and the leader's wait for it agree
    /// (a node started with a shorter failure timeout would otherwise wait too little).
    #[test]
    fn the_lease_is_the_clusters_whatever_each_nodes_failure_timeout() {
        let mut s = ControlState::default();
        let members = (1..=3).map(|id| Member { id, addr: String::new(), repl: 0, control: 0, tls: 0 }).collect();
        s.apply(&Command::Bootstrap { members, primary: 1, policy: "majority".into(), lease_ms: 400, database: 0 })
            .unwrap();
        let mut p = Coordinator::new(1, T, 0);
        p.heard(2, 1000);
        assert_eq!(p.contact_deadline(&s, 1000), Some(1400), "not 1000 + T.failure (100)");
        assert!(p.has_quorum_contact(&s, 1399) && !p.has_quorum_contact(&s, 1400));
        // A leader whose own failure timeout is 100 waits the cluster's 400.
        let (_, writes_after_ms) = opening_after_acks_at_131_and_142(&mut s);
        assert_eq!(writes_after_ms, 142 + 400 + lease_margin_ms(400) - 184);
        // A cluster bootstrapped before the state said: each node's own.
        s.lease_ms = 0;
        assert_eq!(p.contact_deadline(&s, 1000), Some(1100));
    }

    /// Whatever the old primary heard and whoever reports (a quorum without it), the
    /// lease the reports bound is never shorter than the one the old primary's own
    /// coordinator keeps (`contact_deadline`): the two quorums meet in a reporter.
    #[test]
    fn the_reports_bound_the_old_primarys_contact_deadline() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut cases = 0;
        for _ in 0..20_000 {
            let n = [3u64, 4, 5][rng.gen_range(0..3)];
            let s = boot(n);
            let q = s.quorum();
            let p = 1;
            let mut old = Coordinator::new(p, T, 0);
            // When each other member last acknowledged it (none: never), and when the old
            // primary stamped that heard (up to the slack later).
            let mut acked = BTreeMap::new();
            for m in 2..=n {
                if rng.gen_bool(0.8) {
                    let t = rng.gen_range(0..1000u64);
                    acked.insert(m, t);
                    old.heard(m, t + rng.gen_range(0..=HEARD_STAMP_SLACK_MS));
                }
            }
            let now = rng.gen_range(0..1200u64);
            let Some(deadline) = old.contact_deadline(&s, now) else { continue };
            // A quorum of reporters, the old primary not among them; each reports after
            // its last acknowledgement, arriving after it sent.
            let mut others: Vec<u64> = (2..=n).collect();
            while others.len() > q {
                others.remove(rng.gen_range(0..others.len()));
            }
            if others.len() < q {
                continue;
            }
            let (mut reports, mut at) = (BTreeMap::new(), BTreeMap::new());
            for &m in &others {
                let sent = acked.get(&m).copied().unwrap_or(0).max(now) + rng.gen_range(0..50);
                let ago = acked.get(&m).map_or(NEVER_ACKED, |&t| sent - t);
                reports.insert(m, TailReport { acked_ms_ago: ago, ..report(m, 2, &[1]) });
                at.insert(m, sent + rng.gen_range(0..50));
            }
            let end = lease_end(&reports, &at, Some(p), T.failure);
            assert!(end >= deadline, "n {n}, acked {acked:?}, reporters {others:?}, now {now}: {end} < {deadline}");
            cases += 1;
        }
        assert!(cases > 5_000, "{cases}");
    }

    /// The same bound with every node's clock at its own rate, each within
    /// `CLOCK_RATE_ERROR_PPM` of true time, and each offset from the others: the old primary
    /// counts its lease on its clock, the reporters their acks' ages on theirs, the leader
    /// the reports' arrivals and the wait on its own, and the new primary counts the wait
    /// from its apply on its own. Whatever they are, the new primary begins no earlier, in
    /// true time, than the old primary's lease ends. (Leases up to a minute: with only the
    /// 5 ms for rounding, or with half the allowance for the rates, this fails.)
    #[test]
    fn the_wait_outlasts_the_old_primarys_lease_on_clocks_of_different_rates() {
        use crate::failover::CLOCK_RATE_ERROR_PPM;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
        let s = boot(3);
        let mut cases = 0;
        for _ in 0..200_000 {
            let lease = [250u64, 1_000, 10_000, 60_000][rng.gen_range(0..4)];
            // Clock k reads off_k + r * (1 + rate_k) at true time r (ms).
            let e = CLOCK_RATE_ERROR_PPM as f64 * 1e-6;
            let mut clock = || {
                // (At either bound half the time: the worst cases combine bounds.)
                let rate = match rng.gen_range(0..4) {
                    0 => -e,
                    1 => e,
                    _ => rng.gen_range(-e..=e),
                };
                let off = rng.gen_range(0.0..1e6);
                move |r: f64| off + r * (1.0 + rate)
            };
            let (old_clock, leader, new_primary) = (clock(), clock(), clock());
            let reporter = [clock(), clock()];
            let ms = |c: f64| c.floor() as u64;
            // Delays: none at all half the time (they only lengthen the wait).
            let tight = rng.gen_bool(0.5);
            let delay = |rng: &mut rand::rngs::SmallRng, most: f64| if tight { 0.0 } else { rng.gen_range(0.0..most) };
            // Node 1, the old primary, sends heartbeats; backups 2 and 3 ack them. It stamps
            // each heard when it sent what the ack echoes (`DataPlane::heard`).
            let mut old = Coordinator::new(1, Timeouts { failure: lease, ..T }, 0);
            let (mut acked, mut reports, mut at) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
            for m in [2u64, 3] {
                if rng.gen_bool(0.9) {
                    let sent = rng.gen_range(0.0..2.0 * lease as f64);
                    old.heard(m, ms(old_clock(sent)));
                    acked.insert(m, sent + delay(&mut rng, 20.0));
                }
            }
            // Its lease, in true time: the last instant its clock is below the deadline.
            let now_old = ms(old_clock(2.0 * lease as f64 + 50.0));
            let Some(deadline) = old.contact_deadline(&s, now_old) else { continue };
            let lease_ends = |r: f64| old_clock(r) >= deadline as f64;
            // Both report (fenced after their last ack), each its ack's age on its clock.
            let mut last_arrival: f64 = 0.0;
            for (i, m) in [2u64, 3].into_iter().enumerate() {
                let sent = 2.0 * lease as f64 + delay(&mut rng, 100.0);
                let ago = acked
                    .get(&m)
                    .map_or(NEVER_ACKED, |&a| ms(reporter[i](sent)) - ms(reporter[i](a)).min(ms(reporter[i](sent))));
                let arrives = sent + delay(&mut rng, 30.0);
                last_arrival = last_arrival.max(arrives);
                reports.insert(m, TailReport { acked_ms_ago: ago, ..report(m, 2, &[1]) });
                at.insert(m, ms(leader(arrives)));
            }
            // The leader proposes the opening with what is left of the wait; the new
            // primary counts it from its apply.
            let proposed = last_arrival + delay(&mut rng, 10.0);
            let end = lease_end(&reports, &at, Some(1), lease);
            let wait = end.saturating_sub(ms(leader(proposed)));
            let applied = proposed + delay(&mut rng, 10.0);
            let from = new_primary(applied);
            // The first true instant its clock has counted the wait.
            let (mut lo, mut hi) = (applied, applied + 2.0 * wait as f64 + 1.0);
            for _ in 0..60 {
                let mid = (lo + hi) / 2.0;
                if new_primary(mid) - from >= wait as f64 {
                    hi = mid
                } else {
                    lo = mid
                }
            }
            let begins = hi;
            assert!(
                lease_ends(begins),
                "lease {lease}: the new primary begins at {begins:.3} (true ms) while the old primary's lease, to its clock's {deadline}, still stands"
            );
            cases += 1;
        }
        assert!(cases > 150_000, "{cases}");
    }

    /// At the bootstrap the first leader names itself primary: serving, its backups not
    /// heard yet (still connecting), it has the start grace from when it began serving,
    /// and fails itself over only past it.
    #[test]
    fn a_leader_primary_at_the_bootstrap_has_the_start_grace() {
        let s = boot(3);
        let long = Timeouts { start: 10 * T.failure, ..T };
        let mut c = Coordinator::new(1, long, 0);
        c.set_serving(true);
        let mut t = 0;
        let proposed = loop {
            let a = c.tick(t, &s, true);
            if a.iter().any(|a| matches!(a, Action::Propose(_))) {
                break t;
            }
            assert!(t < 30 * T.failure, "never failed over");
            t += 10;
        };
        assert!(proposed >= long.start, "failed itself over within the start grace, at {proposed}");
        // Its backups heard within the grace: it goes on, and hears itself.
        let mut c = Coordinator::new(1, long, 0);
        c.set_serving(true);
        for t in (0..=30 * T.failure).step_by(10) {
            if t >= 5 * T.failure {
                c.heard(2, t);
            }
            assert!(c.tick(t, &s, true).is_empty(), "at {t}");
        }
    }

    /// The leader is the serving primary (an election it won, before it hands the
    /// leadership on): it hears itself while it has quorum contact, and fails itself over
    /// once it has lost it for a failure timeout (every backup's link down, or its server
    /// hung, while the control plane works).
    #[test]
    fn a_leader_serving_as_primary_without_quorum_contact_fails_itself_over() {
        let s = boot(3);
        let mut c = Coordinator::new(1, T, 0);
        c.set_serving(true);
        // Its backups heard every 10 ms: nothing to do.
        for t in (0..=300).step_by(10) {
            c.heard(2, t);
            c.heard(3, t);
            assert!(c.tick(t, &s, true).is_empty(), "a primary with contact, at {t}");
        }
        // From 300 none is heard: contact ends at 400 (the failure timeout), and a failure
        // timeout after the last moment it heard itself, it fails itself over.
        let mut t = 310;
        let proposed = loop {
            let a = c.tick(t, &s, true);
            if let Some(Action::Propose(cmd)) = a.into_iter().find(|a| matches!(a, Action::Propose(_))) {
                break cmd;
            }
            assert!(t < 2000, "never failed over");
            t += 10;
        };
        assert!(matches!(proposed, Command::BeginFailover { epoch: 2, .. }), "{proposed:?}");
        assert!(t >= 300 + 2 * T.failure - 10, "not before contact and then a failure timeout lapsed: {t}");
    }

    /// A primary heard from (the leader's own backup hears its link) that does not say it
    /// has quorum contact (cut off from the rest of a five-node cluster with the leader,
    /// or its control thread hung: either way it takes no writes) is failed over once that
    /// has lasted a failure timeout beyond the contact's own; one that says so every 50 ms
    /// is not.
    #[test]
    fn a_primary_heard_but_without_quorum_contact_is_failed_over() {
        let s = boot(5);
        let mut c = Coordinator::new(2, T, 0);
        let mut proposed = None;
        let mut t = 0;
        while proposed.is_none() && t < 10 * T.failure {
            c.heard(1, t);
            proposed = c.tick(t, &s, true).into_iter().find(|a| matches!(a, Action::Propose(_)));
            t += 10;
        }
        let Some(Action::Propose(Command::BeginFailover { epoch: 2, reason })) = proposed else {
            panic!("a primary heard but never vouching for itself was not failed over: {proposed:?}")
        };
        assert!(reason.contains("has not said it has quorum contact"), "{reason}");
        assert!(t > T.failure, "not before a failure timeout of it: {t}");
        let mut c = Coordinator::new(2, T, 0);
        for t in (0..10 * T.failure).step_by(10) {
            c.heard(1, t);
            if t % 25 == 0 {
                c.vouched(1, t);
            }
            assert!(c.tick(t, &s, true).is_empty(), "a primary vouching for itself, at {t}");
        }
        // One that has not vouched since it was named is still gathering its quorum (a
        // backup it needs may be joining): it has the start grace, and is failed over
        // only past it.
        let long = Timeouts { start: 10 * T.failure, ..T };
        let mut c = Coordinator::new(2, long, 0);
        let mut t = 0;
        let mut proposed = None;
        while proposed.is_none() && t < 30 * T.failure {
            c.heard(1, t);
            proposed = c.tick(t, &s, true).into_iter().find(|a| matches!(a, Action::Propose(_)));
            t += 10;
        }
        assert!(proposed.is_some(), "failed over past the start grace");
        assert!(t > long.start, "not within the start grace: {t}");
        // A leader that lost its leadership meanwhile counts afresh when it leads again.
        let mut c = Coordinator::new(2, T, 0);
        c.vouched(1, 0);
        for t in (0..=150).step_by(10) {
            c.heard(1, t);
            assert!(c.tick(t, &s, true).is_empty(), "at {t}");
        }
        for t in (160..=500).step_by(10) {
            c.heard(1, t);
            assert!(c.tick(t, &s, false).is_empty(), "a follower, at {t}");
        }
        c.heard(1, 510);
        assert!(c.tick(510, &s, true).is_empty(), "leading again: the count starts afresh");
    }

    /// A round whose reports make no plan (here no reporter may become primary) asks
    /// every member again each prepare timeout, and plans once a report changes.
    #[test]
    fn a_round_whose_reports_make_no_plan_asks_every_member_again() {
        let mut s = boot(3);
        s.apply(&Command::BeginFailover { epoch: 2, reason: "test".into() }).unwrap();
        let mut c = Coordinator::new(2, T, 0);
        let a = c.tick(10, &s, true);
        assert_eq!(a, (1..=3).map(|to| Action::AskReport { to, epoch: 2 }).collect::<Vec<_>>());
        for node in 1..=2 {
            let r = TailReport { eligible: false, ..report(node, 2, &[10, 10]) };
            assert!(c.on_report(r, 11, &s, true).is_empty(), "no node may become primary");
        }
        assert!(matches!(c.unplanned(), Some((2, PlanError::NoEligibleNode))));
        // The member that has not reported is asked each resend, as before.
        let a = c.tick(11 + T.resend, &s, true);
        assert_eq!(a, vec![Action::AskReport { to: 3, epoch: 2 }]);
        let r = TailReport { eligible: false, ..report(3, 2, &[10, 10]) };
        assert!(c.on_report(r, 12 + T.resend, &s, true).is_empty());
        assert!(c.tick(12 + 2 * T.resend, &s, true).is_empty(), "all reported: not asked again at the resend");
        let a = c.tick(10 + T.prepare, &s, true);
        assert_eq!(a, (1..=3).map(|to| Action::AskReport { to, epoch: 2 }).collect::<Vec<_>>(), "asked again");
        let a = c.on_report(report(3, 2, &[10, 10]), 11 + T.prepare, &s, true);
        assert!(matches!(&a[..], [Action::Prepare { to: 3, .. }]), "{a:?}");
    }

    /// So does a round whose reports name different stream counts, neither a quorum's: the
    /// node whose count differs (restarted with the cluster's `--workers`) is heard again,
    /// and the round plans. Before, nobody that had reported was asked again, and the
    /// round waited until the leader changed (found by a review).
    #[test]
    fn a_round_of_different_stream_counts_asks_every_member_again() {
        let mut s = boot(3);
        s.apply(&Command::BeginFailover { epoch: 2, reason: "test".into() }).unwrap();
        let mut c = Coordinator::new(2, T, 0);
        c.tick(10, &s, true);
        assert!(c.on_report(report(1, 2, &[10, 10, 10, 10]), 11, &s, true).is_empty());
        assert!(c.on_report(report(2, 2, &[10, 10]), 11, &s, true).is_empty());
        assert!(matches!(c.unplanned(), Some((2, PlanError::StreamCounts(_)))));
        let a = c.tick(10 + T.prepare, &s, true);
        assert_eq!(a, (1..=3).map(|to| Action::AskReport { to, epoch: 2 }).collect::<Vec<_>>(), "asked again");
        let a = c.on_report(report(1, 2, &[10, 10]), 11 + T.prepare, &s, true);
        assert!(matches!(&a[..], [Action::Prepare { .. }]), "{a:?}");
    }

    /// A leader whose own loop stalled does not fail a primary over for the silence it
    /// measured across the stall; silence counts again from its end.
    #[test]
    fn a_stall_of_the_coordinators_own_loop_is_not_the_primarys_silence() {
        let s = boot(3);
        let mut c = Coordinator::new(2, T, 0);
        c.heard(1, 0);
        c.vouched(1, 0);
        for t in (10..=40).step_by(10) {
            assert!(c.tick(t, &s, true).is_empty());
        }
        // Held 300 ms (3 failure timeouts): nothing heard meanwhile, nothing proposed.
        assert!(c.tick(340, &s, true).is_empty(), "silence measured across its own stall");
        assert_eq!(c.stalls(), (1, 300));
        // Ticking again, it hears nothing for a failure timeout: then the primary is silent.
        let mut t = 340;
        let mut proposed = None;
        while proposed.is_none() && t < 1000 {
            t += 10;
            proposed = c.tick(t, &s, true).into_iter().find(|a| matches!(a, Action::Propose(_)));
        }
        assert_eq!(t, 340 + T.failure, "silent for a failure timeout after the stall");
        assert!(matches!(proposed, Some(Action::Propose(Command::BeginFailover { epoch: 2, .. }))));
        assert_eq!(c.stalls().0, 1, "ticks 10 ms apart are no stall");
        // Heard during that time instead, it is not failed over.
        let mut c = Coordinator::new(2, T, 0);
        c.heard(1, 0);
        assert!(c.tick(10, &s, true).is_empty());
        assert!(c.tick(400, &s, true).is_empty());
        for t in (410..=700).step_by(10) {
            c.heard(1, t);
            c.vouched(1, t);
            assert!(c.tick(t, &s, true).is_empty(), "heard at {t}");
        }
    }

    #[test]
    fn a_switchovers_round_waits_for_its_target_then_prefers_it_and_a_stalled_one_is_given_up() {
        let mut s = boot(3);
        s.apply(&Command::ConfigApplied { epoch: 1, primary: 1, config: 0 }).unwrap();
        let mut c = Coordinator::new(2, T, 0);
        c.heard(1, 0);
        c.vouched(1, 0);
        c.alive(3, 0);
        assert_eq!(c.successor(&s, 50), Some(2), "the lowest id other than the primary, heard (itself)");
        s.apply(&Command::Switchover { epoch: 1, from: 1, to: 3 }).unwrap();
        // Not begun within `start` (the primary went quiet mid-drain): given up.
        c.heard(1, 60);
        c.vouched(1, 60);
        assert!(c.tick(60, &s, true).is_empty());
        c.heard(1, 150);
        c.vouched(1, 150);
        let a = c.tick(160, &s, true);
        let [Action::Propose(Command::EndSwitchover { epoch: 1, .. })] = &a[..] else { panic!("{a:?}") };
        // The drained primary begins the failover; the round waits for node 3's report, and
        // for the old primary's (for at most the lease: it ends the wait for its lease).
        s.apply(&Command::BeginFailover { epoch: 2, reason: "switchover".into() }).unwrap();
        let _ = c.tick(200, &s, true);
        let acked = |n| TailReport { acked_ms_ago: 1, ..report(n, 2, &[40, 40]) };
        assert!(c.on_report(acked(2), 201, &s, true).is_empty(), "a quorum, without the target");
        assert!(c.on_report(acked(3), 202, &s, true).is_empty(), "without the old primary");
        let old = TailReport { eligible: false, took_writes: true, ..report(1, 2, &[40, 40]) };
        let a = c.on_report(old.clone(), 203, &s, true);
        let [Action::Prepare { to: 3, plan }] = &a[..] else { panic!("{a:?}") };
        assert!(plan.fetch.is_empty());
        let a = c.on_prepared(3, 2, 40, 0, 205, &s, true);
        let [Action::Propose(Command::OpenEpoch { writes_after_ms: 0, .. })] = &a[..] else { panic!("{a:?}") };
        // Without the old primary's report within the lease, planned from the others', and
        // the opening waits for the lease their acks gave it ...
        let mut c3 = Coordinator::new(2, T, 0);
        let _ = c3.tick(300, &s, true);
        c3.on_report(acked(2), 301, &s, true);
        assert!(c3.on_report(acked(3), 302, &s, true).is_empty());
        assert!(c3.tick(300 + T.failure - 1, &s, true).iter().all(|a| !matches!(a, Action::Prepare { .. })));
        let a = c3.tick(300 + T.failure, &s, true);
        assert!(a.iter().any(|a| matches!(a, Action::Prepare { to: 3, .. })), "{a:?}");
        let a = c3.on_prepared(3, 2, 40, 0, 402, &s, true);
        let [Action::Propose(Command::OpenEpoch { writes_after_ms, .. })] = &a[..] else { panic!("{a:?}") };
        assert_eq!(*writes_after_ms, 301 + T.failure + lease_margin_ms(T.failure) - 402);
        // ... unless its report comes before the opening is proposed.
        let mut c4 = Coordinator::new(2, T, 0);
        let _ = c4.tick(300, &s, true);
        c4.on_report(acked(2), 301, &s, true);
        c4.on_report(acked(3), 302, &s, true);
        let a = c4.tick(300 + T.failure, &s, true);
        assert!(a.iter().any(|a| matches!(a, Action::Prepare { to: 3, .. })), "{a:?}");
        assert!(c4.on_report(TailReport { fenced_at: 2, ..old }, 401, &s, true).is_empty(), "the plan stands");
        let a = c4.on_prepared(3, 2, 40, 0, 402, &s, true);
        let [Action::Propose(Command::OpenEpoch { writes_after_ms: 0, .. })] = &a[..] else { panic!("{a:?}") };
        // A target that never reports holds the round up only for `prepare`.
        let mut s2 = boot(3);
        s2.apply(&Command::ConfigApplied { epoch: 1, primary: 1, config: 0 }).unwrap();
        s2.apply(&Command::Switchover { epoch: 1, from: 1, to: 3 }).unwrap();
        s2.apply(&Command::BeginFailover { epoch: 2, reason: "switchover".into() }).unwrap();
        let mut c2 = Coordinator::new(2, T, 0);
        let _ = c2.tick(10, &s2, true);
        let mut r1 = report(1, 2, &[40, 40]);
        r1.eligible = false;
        assert!(c2.on_report(r1, 11, &s2, true).is_empty());
        assert!(c2.on_report(report(2, 2, &[40, 40]), 12, &s2, true).is_empty());
        assert!(!c2.tick(100, &s2, true).iter().any(|a| matches!(a, Action::Prepare { .. })), "still waiting");
        let a = c2.tick(10 + T.prepare, &s2, true);
        assert!(a.iter().any(|a| matches!(a, Action::Prepare { to: 2, .. })), "{a:?}");
        // The round after (node 2 did not prepare either): the target is not waited for
        // again; a quorum's reports plan at once.
        s2.apply(&Command::BeginFailover { epoch: 3, reason: "node 2 did not prepare".into() }).unwrap();
        let at = 20 + 2 * T.prepare;
        let _ = c2.tick(at, &s2, true);
        let mut r1 = report(1, 3, &[40, 40]);
        r1.eligible = false;
        assert!(c2.on_report(r1, at + 1, &s2, true).is_empty());
        let a = c2.on_report(report(2, 3, &[40, 40]), at + 2, &s2, true);
        assert!(a.iter().any(|a| matches!(a, Action::Prepare { to: 2, .. })), "waited for the target again: {a:?}");
    }

    /// An old primary chosen as the last resort after the one eligible node failed, and
    /// failing in turn, is passed over as well: the eligible node is tried again, not the
    /// last resort round after round (`avoid` left out only eligibility, which a last
    /// resort does not need).
    #[test]
    fn a_last_resort_that_failed_is_passed_over_too() {
        let mut s = boot(3);
        let mut c = Coordinator::new(2, T, 0);
        let old = TailReport { last_resort: true, eligible: false, ..report(1, 0, &[9]) };
        let mut at = 0;
        let mut round = |s: &mut ControlState, epoch: u64, expect: NodeId| {
            s.apply(&Command::BeginFailover { epoch, reason: String::new() }).unwrap();
            at += 1000;
            c.tick(at, s, true);
            c.on_report(TailReport { fenced_at: epoch, ..old.clone() }, at, s, true);
            let a = c.on_report(report(2, epoch, &[5]), at, s, true);
            let plan = match &a[..] {
                [Action::Prepare { to, plan }] if *to == expect => plan.clone(),
                _ => panic!("round {epoch}: expected a plan to node {expect}: {a:?}"),
            };
            c.on_unprepared(expect, epoch, plan.recovery_point, "a lasting fault".into(), at + 1, s, true);
            let ended = c.tick(at + T.prepare, s, true);
            assert!(ended.iter().any(|a| matches!(a, Action::Propose(Command::BeginFailover { .. }))), "{ended:?}");
        };
        round(&mut s, 2, 2);
        round(&mut s, 3, 1);
        round(&mut s, 4, 2);
        round(&mut s, 5, 1);
    }

    /// Three nodes that fail in turn are each tried again, the one that failed longest
    /// ago first (leaving out only the latest would choose, of the other two, the one
    /// lacking least every time: node 3, never node 2).
    #[test]
    fn nodes_that_fail_in_turn_are_tried_again_longest_rested_first() {
        let mut s = boot(4);
        let mut c = Coordinator::new(2, T, 0);
        let mut at = 0;
        for (epoch, expect) in [(2, 3), (3, 4), (4, 2), (5, 3), (6, 4), (7, 2)] {
            s.apply(&Command::BeginFailover { epoch, reason: String::new() }).unwrap();
            at += 1000;
            c.tick(at, &s, true);
            c.on_report(report(2, epoch, &[5]), at, &s, true);
            c.on_report(report(3, epoch, &[9]), at, &s, true);
            let a = c.on_report(report(4, epoch, &[9]), at, &s, true);
            let plan = match &a[..] {
                [Action::Prepare { to, plan }] if *to == expect => plan.clone(),
                _ => panic!("round {epoch}: expected a plan to node {expect}: {a:?}"),
            };
            c.on_unprepared(expect, epoch, plan.recovery_point, "a lasting fault".into(), at + 1, &s, true);
            let ended = c.tick(at + T.prepare, &s, true);
            assert!(ended.iter().any(|a| matches!(a, Action::Propose(Command::BeginFailover { .. }))), "{ended:?}");
        }
    }

    /// A tick that proposes both a switchover's end and a failover proposes neither again
    /// before `resend` (each was proposed again at every tick when one proposal was kept).
    #[test]
    fn two_proposals_of_one_tick_are_each_held_back_until_resend() {
        let mut s = boot(3);
        s.apply(&Command::ConfigApplied { epoch: 1, primary: 1, config: 0 }).unwrap();
        s.apply(&Command::Switchover { epoch: 1, from: 1, to: 3 }).unwrap();
        let mut c = Coordinator::new(2, T, 0);
        let proposals = |a: Vec<Action>| a.into_iter().filter(|a| matches!(a, Action::Propose(_))).count();
        let mut t = 0;
        let both = loop {
            let n = proposals(c.tick(t, &s, true));
            if n > 0 {
                break n;
            }
            assert!(t < 10 * T.failure, "nothing proposed");
            t += 10;
        };
        assert_eq!(both, 2, "the switchover's end and the failover, in one tick");
        for dt in (1..T.resend).step_by(5) {
            assert_eq!(proposals(c.tick(t + dt, &s, true)), 0, "proposed again {dt} ms later");
        }
        assert_eq!(proposals(c.tick(t + T.resend, &s, true)), 2, "both again at `resend`");
    }

    #[test]
    fn a_leader_named_primary_that_does_not_serve_fails_itself_over() {
        let s = boot(3);
        let mut c = Coordinator::new(1, T, 0);
        c.set_serving(true);
        assert!(c.tick(500, &s, true).is_empty(), "it hears itself");
        c.set_serving(false);
        assert!(c.tick(505, &s, true).is_empty(), "not serving yet counts as silence, from when it was named");
        // Ticked every 10 ms, as a node does (ticks further apart are a stall of its own).
        for t in (515..505 + T.failure).step_by(10) {
            assert!(c.tick(t, &s, true).is_empty(), "at {t}");
        }
        let a = c.tick(505 + T.failure, &s, true);
        assert!(matches!(&a[..], [Action::Propose(Command::BeginFailover { epoch: 2, .. })]), "{a:?}");
    }

    #[test]
    fn a_chosen_node_that_does_not_prepare_is_passed_over_in_a_new_epoch() {
        let mut s = boot(3);
        let mut c = Coordinator::new(2, T, 0);
        s.apply(&Command::BeginFailover { epoch: 2, reason: String::new() }).unwrap();
        c.tick(0, &s, true);
        c.on_report(report(2, 2, &[5]), 1, &s, true);
        let a = c.on_report(report(3, 2, &[9]), 2, &s, true);
        assert!(matches!(a[..], [Action::Prepare { to: 3, .. }]));
        let a = c.tick(202, &s, true);
        assert!(matches!(&a[..], [Action::Propose(Command::BeginFailover { epoch: 3, .. })]), "{a:?}");
    }

    /// A chosen node that says it cannot prepare ends its round after `resend`, not the
    /// prepare timeout, and says why; each such round in a row waits twice as long; an
    /// answer to another plan, or one after `Prepared`, changes nothing. The next round
    /// chooses another node that can recover the epoch (here one that fetches what it
    /// lacks) instead of the same one again, and two that fail are tried in turn.
    #[test]
    fn a_chosen_node_that_cannot_prepare_ends_the_round_early_and_rounds_in_a_row_back_off() {
        let mut s = boot(3);
        let mut c = Coordinator::new(2, T, 0);
        // Round `epoch` planned at `at`: the plan, to `to`.
        fn plan_round(c: &mut Coordinator, s: &ControlState, epoch: u64, at: u64, to: NodeId) -> RecoveryPlan {
            c.tick(at, s, true);
            c.on_report(report(2, epoch, &[5]), at, s, true);
            let a = c.on_report(report(3, epoch, &[9]), at, s, true);
            match &a[..] {
                [Action::Prepare { to: t, plan }] if *t == to => plan.clone(),
                _ => panic!("round {epoch}, expected a plan to node {to}: {a:?}"),
            }
        }
        let ends = |a: &[Action], epoch: u64| {
            a.iter().find_map(|a| match a {
                Action::Propose(Command::BeginFailover { epoch: e, reason }) if *e == epoch => Some(reason.clone()),
                _ => None,
            })
        };
        s.apply(&Command::BeginFailover { epoch: 2, reason: String::new() }).unwrap();
        let p = plan_round(&mut c, &s, 2, 100, 3);
        let point = p.recovery_point;
        assert!(c.on_unprepared(3, 2, point + 1, "x".into(), 101, &s, true).is_empty(), "another plan's answer");
        assert!(c.on_unprepared(2, 2, point, "x".into(), 101, &s, true).is_empty(), "not the chosen node");
        let a = c.on_unprepared(3, 2, point, "its fetch of stream 0 was refused".into(), 105, &s, true);
        assert!(ends(&a, 3).is_none(), "not before `resend`: {a:?}");
        let a = c.tick(120, &s, true);
        let why = ends(&a, 3).expect("ended at `resend`, long before the prepare timeout");
        assert!(why.contains("node 3 could not prepare: its fetch of stream 0 was refused"), "{why}");
        // The next round in a row waits twice as long, the one after four times.
        s.apply(&Command::BeginFailover { epoch: 3, reason: why }).unwrap();
        let p = plan_round(&mut c, &s, 3, 200, 2);
        assert_eq!(p.fetch.len(), 1, "node 2 fetches what it lacks: {p:?}");
        c.on_unprepared(2, 3, p.recovery_point, "again".into(), 201, &s, true);
        assert!(ends(&c.tick(239, &s, true), 4).is_none());
        assert!(ends(&c.tick(240, &s, true), 4).is_some());
        s.apply(&Command::BeginFailover { epoch: 4, reason: String::new() }).unwrap();
        let p = plan_round(&mut c, &s, 4, 300, 3);
        c.on_unprepared(3, 4, p.recovery_point, "again".into(), 301, &s, true);
        assert!(ends(&c.tick(379, &s, true), 5).is_none());
        assert!(ends(&c.tick(380, &s, true), 5).is_some());
        // Capped at the prepare timeout; after an epoch opens, the first failure is quick again.
        assert_eq!(c.retry_after(), 80);
        c.failed_rounds = 10;
        assert_eq!(c.retry_after(), T.prepare);
        // Prepared first: a later "cannot" is an old answer and changes nothing.
        s.apply(&Command::BeginFailover { epoch: 5, reason: String::new() }).unwrap();
        let p = plan_round(&mut c, &s, 5, 400, 2);
        let a = c.on_prepared(2, 5, p.recovery_point, 0, 401, &s, true);
        assert!(a.iter().any(|a| matches!(a, Action::Propose(Command::OpenEpoch { epoch: 5, .. }))), "{a:?}");
        assert!(c.on_unprepared(2, 5, p.recovery_point, "late".into(), 402, &s, true).is_empty());
        let open = a.iter().find_map(|a| match a {
            Action::Propose(cmd @ Command::OpenEpoch { .. }) => Some(cmd.clone()),
            _ => None,
        });
        s.apply(&open.unwrap()).unwrap();
        c.tick(500, &s, true);
        assert_eq!(c.retry_after(), T.resend, "an epoch opened: the count starts over");
    }

    #[test]
    fn a_primary_cut_off_from_the_majority_loses_its_contact() {
        let s = boot(5);
        let mut c = Coordinator::new(1, T, 0);
        for n in 2..=5 {
            c.heard(n, 10);
        }
        assert!(c.has_quorum_contact(&s, 100));
        c.heard(2, 150);
        assert!(!c.has_quorum_contact(&s, 150), "itself and node 2 are two of five");
        c.heard(3, 160);
        assert!(c.has_quorum_contact(&s, 160));
        // The lease: the quorum-th most recent (itself at 160, 3 at 160, 2 at 150) plus
        // the failure timeout, and contact holds exactly before it.
        let until = c.contact_deadline(&s, 160).unwrap();
        assert_eq!(until, 150 + T.failure);
        assert!(c.has_quorum_contact(&s, until - 1) && !c.has_quorum_contact(&s, until));
        assert_eq!(Coordinator::new(1, T, 0).contact_deadline(&s, 10), None, "heard from no one");
    }

    #[test]
    fn the_fence_outlives_a_control_log_that_is_behind() {
        let s = boot(3);
        assert!(Fence(0).accepts(&s, 1, 1));
        assert!(!Fence(2).accepts(&s, 1, 1), "reported for epoch 2: epoch 1 is refused");
    }
}
