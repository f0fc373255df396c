//! Epoch recovery: where the old epoch ends (Rolis 4.1, figure 8)
//! ===============================================================
//! When a primary fails, the coordinator begins epoch E (every node then refuses batches
//! of older epochs) and asks the nodes what they hold of the open epoch e: per stream,
//! the highest timestamp up to which the node holds every batch ([`TailReport`]). From a
//! quorum of reports it computes
//!
//! ```text
//!   tail[s]        = max over the reports of what the node holds of stream s
//!   recovery point = min over streams of tail[s]
//! ```
//!
//! Why nothing released is lost: a commit at ts T was released only once a quorum (under
//! `majority`; every node under `all`) held every stream up to T. That quorum meets the
//! reporting quorum in at least one node, which reported only after it was fenced, so it
//! reported everything it ever acknowledged: tail[s] >= T for every s, and the recovery
//! point >= T. Why nothing above it may be kept: a commit above the recovery point may
//! depend on one that no reporting node holds (the example of Rolis figure 8: 26 and 41 on
//! P3 may depend on a 22 that P4 lost); it was never released, since its release needed
//! the same streams.
//!
//! The new primary is the reporting node that lacks the least below the recovery point
//! (most up to date; ties to the lowest id). It fetches what it lacks from the nodes that
//! hold most ([`Fetch`]), and only once it holds every stream up to the recovery point does
//! the coordinator open epoch E with it; every node then discards the old epoch's commits
//! above the recovery point. New timestamps start above everything any report held, so
//! they keep growing across epochs even on nodes that have not yet discarded.
//!
//! Pure: no I/O, no clock; the simulation (tests/sim.rs) and the unit tests drive it.

use std::collections::BTreeMap;

use crate::state::NodeId;

/// What one node holds, reported after it was fenced. Positions are timestamps over the
/// whole history the node holds (older epochs' surviving commits, then the open epoch's),
/// so a node that lacks something of an older epoch reports a position below the open
/// epoch's start, and is not mistaken for one that holds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TailReport {
    pub node: NodeId,
    /// The epoch being failed over to; the node had begun it (was fenced) when it reported.
    pub fenced_at: u64,
    /// The epoch these positions are of (the open epoch the node knows).
    pub epoch: u64,
    /// Per stream: every batch up to this timestamp is held (fsynced before the report).
    pub streams: Vec<u64>,
    /// The highest timestamp the node holds at all (what new timestamps must exceed).
    pub newest: u64,
    /// Whether the node may become primary (a node being removed, or one whose disk
    /// failed, may not).
    pub eligible: bool,
    /// A fetch from this node is answered only from above this timestamp: below it, a
    /// checkpoint took its log's batches away (`ditto_log::replica::fetch_floor`). Usually
    /// at or below every stream's position (a checkpoint holds what every stream held);
    /// it may lie above positions capped at an earlier failover's point (its checkpoint
    /// held commits that failover cut), which the plan's choice of a node that can fetch
    /// all it lacks does not rely on. 0 from a node of a version that did not say: it is
    /// then asked as before.
    #[serde(default)]
    pub serves_above: u64,
    /// Not eligible, but may be chosen as a last resort, when no eligible reporter can
    /// fetch all it lacks and this one lacks nothing below the point: an old primary whose
    /// own log holds everything up to it and can be cut there (its server then starts from
    /// that log, cut at the point, as a backup's replica log would be).
    #[serde(default)]
    pub last_resort: bool,
    /// The epoch of the primary's own log this node holds (0: none, or a node of a
    /// version that did not say). A last resort whose own log is of the epoch recovered
    /// may also be chosen when it lacks something, if it can fetch it: what it lacks is
    /// what it shipped but had not made durable when it stopped, and the fetched batches
    /// are added to its own log (`ditto_log::recovery::append_own_fetched`).
    #[serde(default)]
    pub own_epoch: u64,
    /// How long before this report (ms, on the node's own clock) the node last
    /// acknowledged a primary, of any epoch, as a backup ([`NEVER_ACKED`]: never, as far as
    /// it knows; 0 from a node of a version that did not say: as if just now, which waits
    /// longest). A primary's lease (its quorum contact) stands on such acknowledgements:
    /// the new primary takes no writes before every older primary's lease has run out
    /// (`OpenEpoch::writes_after_ms`, docs/cluster.md "The old primary's lease").
    #[serde(default)]
    pub acked_ms_ago: u64,
    /// This node is the primary of `epoch` and took writes in it: it did so only once the
    /// leases of the primaries before it had run out, and it was fenced before it reported
    /// (it takes none from then on), so no older primary's writes can come after this
    /// report. A node of a version that did not say: false, which waits longest.
    #[serde(default)]
    pub took_writes: bool,
}

/// `TailReport::acked_ms_ago` of a node that never acknowledged the old primary.
pub const NEVER_ACKED: u64 = u64::MAX;

/// The margin the failover's wait for an old primary's lease adds for rounding
/// (`coordinator::lease_end`): a primary's data plane stamps each backup heard no later
/// than it sent the heartbeat the backup's newest ack echoes (`DataPlane::heard`), which is
/// before the backup sent that ack; the times that carry it are whole milliseconds rounded
/// toward a longer wait, all but the report's arrival, which may round 1 ms the other way.
/// (50 ms until 2026-12-05, afternoon, when a primary stamped a backup heard at its probe,
/// up to 50 ms after the ack.)
pub const HEARD_STAMP_SLACK_MS: u64 = 5;

/// How far, in parts per million, any node's monotonic clock may run from true time (NTP
/// slews a clock by at most 500 ppm; a quartz oscillator left alone drifts by tens):
/// allowed for in `lease_margin_ms`.
pub const CLOCK_RATE_ERROR_PPM: u64 = 500;

/// What a failover adds to a lease of `lease_ms` before the new primary takes writes:
/// `HEARD_STAMP_SLACK_MS` for rounding, and for the clocks' rates (a lease is counted on the
/// old primary's clock, its wait on the reporters', the leader's and the new primary's)
/// `CLOCK_RATE_ERROR_PPM` of the lease, twice: 1 ms for a lease of up to a second. (Before
/// 2026-12-05, evening, the 5 ms alone, which allowed for 1% at the default 250 ms, and
/// 0.025% at 10 s; test `the_wait_outlasts_the_old_primarys_lease_on_clocks_of_different_rates`.)
pub fn lease_margin_ms(lease_ms: u64) -> u64 {
    HEARD_STAMP_SLACK_MS + lease_ms.saturating_mul(2 * CLOCK_RATE_ERROR_PPM).div_ceil(1_000_000)
}

/// A stream's missing range and where to fetch it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fetch {
    pub stream: usize,
    pub from: NodeId,
    /// Fetch the stream's batches above this ...
    pub after: u64,
    /// ... up to and including this (the recovery point; a batch that straddles it is cut).
    pub upto: u64,
}

/// The outcome of a quorum of reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecoveryPlan {
    /// The epoch being opened.
    pub epoch: u64,
    /// The epoch whose tail is cut.
    pub recovered_epoch: u64,
    pub recovery_point: u64,
    pub primary: NodeId,
    pub fetch: Vec<Fetch>,
    /// New timestamps start above this.
    pub start: u64,
    /// How many reporters held something above the recovery point (logged with the plan;
    /// the commits discarded are counted by the chosen node, in `Prepared`).
    pub reporters_ahead: usize,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{got} of {members} members reported; a quorum is {quorum}")]
    NoQuorum { got: usize, members: usize, quorum: usize },
    #[error("no reporting node may become primary")]
    NoEligibleNode,
    /// Every eligible reporter lacks something that no reporter still holds as batches
    /// (each holder's checkpoint lies above where the fetch would start): the round waits
    /// for more reports.
    #[error("no eligible reporting node can fetch what it lacks: the holders' checkpoints lie above it")]
    NoSource,
    /// Reporters hold different numbers of log streams: nodes run different `--workers`.
    /// A plan over them would take a stream only one reports as held up to its own
    /// position, and so lower the recovery point below acknowledged commits: none is made.
    #[error("the reports name {0:?} log streams: every node of a cluster must run the same --workers")]
    StreamCounts(Vec<usize>),
}

/// The open epoch being recovered, as the state has it: its commits lie above `start`;
/// every older epoch's surviving commits lie at or below `floor` (the recovery point the
/// epoch before it was cut at; 0 for the first). Nothing survives in (floor, start].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recovered {
    pub epoch: u64,
    pub start: u64,
    pub floor: u64,
}

/// Computes the recovery plan from the reports of one failover round (see the module
/// notes). `reports` count if fenced at `epoch` and taken with `recovered.epoch` as the
/// open epoch (a node whose control log is behind may not yet have discarded what an
/// earlier failover cut); others are ignored. `members` is the membership's size; new
/// timestamps start at or above the open epoch's start.
pub fn plan(
    reports: &BTreeMap<NodeId, TailReport>,
    members: usize,
    epoch: u64,
    recovered: Recovered,
) -> Result<RecoveryPlan, PlanError> {
    plan_preferring(reports, members, epoch, recovered, None)
}

/// `plan`, choosing `prefer` (a switchover's target) among the eligible reporters that
/// lack least below the point, where it is one of them.
pub fn plan_preferring(
    reports: &BTreeMap<NodeId, TailReport>,
    members: usize,
    epoch: u64,
    recovered: Recovered,
    prefer: Option<NodeId>,
) -> Result<RecoveryPlan, PlanError> {
    let Recovered { epoch: recovered_epoch, start, floor } = recovered;
    let mut valid: Vec<&TailReport> =
        reports.values().filter(|r| r.fenced_at == epoch && r.epoch == recovered_epoch).collect();
    let quorum = members / 2 + 1;
    if valid.len() < quorum {
        return Err(PlanError::NoQuorum { got: valid.len(), members, quorum });
    }
    // New timestamps start above everything any report held, those left out below too
    // (so that they keep growing on a node that has not discarded yet).
    let newest = valid.iter().map(|r| r.newest).max().unwrap_or(start);
    let counts: std::collections::BTreeSet<usize> = valid.iter().map(|r| r.streams.len()).filter(|&n| n > 0).collect();
    if counts.len() > 1 {
        // The reporters of one stream count (with those that hold nothing), if they are a
        // quorum by themselves, are planned from alone: any quorum that released a commit
        // meets them in a node that followed the primary, whose count is the primary's, so
        // theirs is, and the others (an old primary's own log from before a change of
        // `--workers`, say) hold nothing of the epoch that is not held here too. (Two
        // counts' reporters can both be a quorum only through reporters that hold
        // nothing, and then no quorum released anything in the epoch; no plan is made
        // then, as none is where no count's are.) Before 2026-12-03 any other count
        // stopped the plan, and the round waited for good on a report nobody asked for
        // again (found by a review).
        let same = |c: usize| valid.iter().filter(|r| r.streams.len() == c || r.streams.is_empty()).count();
        let quorate: Vec<usize> = counts.iter().copied().filter(|&c| same(c) >= quorum).collect();
        let [c] = quorate[..] else {
            return Err(PlanError::StreamCounts(counts.into_iter().collect()));
        };
        valid.retain(|r| r.streams.len() == c || r.streams.is_empty());
    }
    let streams = valid.iter().map(|r| r.streams.len()).max().unwrap_or(0);
    let pos = |r: &TailReport, s: usize| r.streams.get(s).copied().unwrap_or(0);
    // Per stream, the most any reporter holds, and the first (lowest id) that holds it.
    let tails: Vec<(u64, NodeId)> = (0..streams)
        .map(|s| {
            let mut best = (pos(valid[0], s), valid[0].node);
            for r in &valid {
                if pos(r, s) > best.0 {
                    best = (pos(r, s), r.node);
                }
            }
            best
        })
        .collect();
    let recovery_point = tails.iter().map(|t| t.0).min().unwrap_or(0);
    // Where a fetch for a node holding a stream up to `pos` starts: from a position in
    // (floor, start), where nothing survives, at the start (at most the point), so that a
    // holder whose log starts there (an old primary's own log, a checkpoint at the start)
    // can answer it. The fetcher's log then holds the stream on from the start.
    let from = |pos: u64| match pos >= floor && pos < start {
        true => start.min(recovery_point).max(pos),
        false => pos,
    };
    // Where a node that holds stream `s` only up to `after` fetches the rest: the first
    // reporter that holds the most of it, if it can still answer from `after`, else the
    // first that holds the stream to the point and can.
    let source = |s: usize, after: u64| -> Option<NodeId> {
        let serves = |r: &TailReport| pos(r, s) >= recovery_point && r.serves_above <= after;
        let best = valid.iter().find(|r| r.node == tails[s].1).filter(|r| serves(r));
        best.or_else(|| valid.iter().find(|r| serves(r))).map(|r| r.node)
    };
    let lacks = |r: &TailReport| -> u64 { (0..streams).map(|s| recovery_point - pos(r, s).min(recovery_point)).sum() };
    let can_fetch =
        |r: &TailReport| (0..streams).all(|s| pos(r, s) >= recovery_point || source(s, from(pos(r, s))).is_some());
    // Among the eligible reporters that can fetch all they lack, the one that lacks least.
    // The reporter holding the most on its least-held stream can always fetch (what it
    // lacks starts at or above that, where every holder's checkpoint lies below), so only
    // eligibility can leave none: an old primary that alone holds the tail as batches.
    // Then such an old primary itself (`TailReport::last_resort`): one that lacks nothing,
    // else one whose own log is of the recovered epoch and that can fetch what it lacks
    // (`TailReport::own_epoch`), the one that lacks least.
    let eligible: Vec<&&TailReport> = valid.iter().filter(|r| r.eligible).collect();
    let chosen = eligible.iter().filter(|r| can_fetch(r)).min_by_key(|r| (lacks(r), Some(r.node) != prefer, r.node));
    let last_resort = || {
        valid
            .iter()
            .filter(|r| r.last_resort && (lacks(r) == 0 || (r.own_epoch == recovered_epoch && can_fetch(r))))
            .min_by_key(|r| (lacks(r), r.node))
            .copied()
    };
    let primary = match chosen.map(|r| **r).or_else(last_resort) {
        Some(r) => r,
        None if eligible.is_empty() => return Err(PlanError::NoEligibleNode),
        None => return Err(PlanError::NoSource),
    };
    let fetch = (0..streams)
        .filter(|&s| pos(primary, s) < recovery_point)
        .map(|s| {
            let after = from(pos(primary, s));
            Fetch { stream: s, from: source(s, after).expect("checked by can_fetch"), after, upto: recovery_point }
        })
        .collect();
    Ok(RecoveryPlan {
        epoch,
        recovered_epoch,
        recovery_point,
        primary: primary.node,
        fetch,
        start: newest.max(recovery_point).max(start),
        reporters_ahead: valid.iter().filter(|r| (0..streams).any(|s| pos(r, s) > recovery_point)).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: NodeId, streams: &[u64]) -> TailReport {
        TailReport {
            node,
            fenced_at: 2,
            epoch: 1,
            streams: streams.to_vec(),
            newest: streams.iter().copied().max().unwrap_or(0),
            eligible: true,
            serves_above: 0,
            last_resort: false,
            own_epoch: 0,
            acked_ms_ago: NEVER_ACKED,
            took_writes: false,
        }
    }

    /// Epoch `epoch` recovered, started at `start`, the epoch before it cut there too (no
    /// gap between the two).
    fn at(epoch: u64, start: u64) -> Recovered {
        Recovered { epoch, start, floor: start }
    }

    fn reports(rs: Vec<TailReport>) -> BTreeMap<NodeId, TailReport> {
        rs.into_iter().map(|r| (r.node, r)).collect()
    }

    /// Rolis figure 8: five streams whose tails are 34, 27, 41, 21 and 23 once every
    /// reporter is counted; the epoch's watermark is 21.
    #[test]
    fn rolis_figure_8() {
        let rs = reports(vec![report(2, &[34, 27, 41, 21, 23]), report(3, &[30, 20, 26, 21, 23])]);
        let p = plan(&rs, 3, 2, at(1, 0)).unwrap();
        assert_eq!(p.recovery_point, 21);
        assert_eq!(p.primary, 2, "node 2 lacks nothing below 21");
        assert!(p.fetch.is_empty());
        assert_eq!(p.start, 41, "new timestamps start above everything held");
        assert_eq!(p.reporters_ahead, 2);
    }

    #[test]
    fn the_most_up_to_date_node_fetches_what_it_lacks_from_whoever_holds_most() {
        // Node 2 is behind on stream 0, node 3 on stream 1; the point is min(50, 60) = 50.
        let rs = reports(vec![report(2, &[40, 60]), report(3, &[50, 45]), report(4, &[10, 10])]);
        let p = plan(&rs, 5, 2, at(1, 0)).unwrap();
        assert_eq!(p.recovery_point, 50);
        // Node 2 lacks 10 below the point, node 3 lacks 5: node 3 is chosen.
        assert_eq!(p.primary, 3);
        assert_eq!(p.fetch, vec![Fetch { stream: 1, from: 2, after: 45, upto: 50 }]);
    }

    #[test]
    fn a_switchover_prefers_its_target_among_those_that_lack_least_and_only_among_them() {
        // The drained old primary (ineligible) and two backups that hold all of it.
        let mut old = report(1, &[60, 60]);
        old.eligible = false;
        let rs = reports(vec![old, report(2, &[60, 60]), report(3, &[60, 61])]);
        assert_eq!(plan(&rs, 3, 2, at(1, 0)).unwrap().primary, 2, "without a preference, the lowest id");
        let p = plan_preferring(&rs, 3, 2, at(1, 0), Some(3)).unwrap();
        assert_eq!((p.primary, p.recovery_point), (3, 60));
        assert!(p.fetch.is_empty());
        // A target that lacks something is not preferred over one that lacks nothing: the
        // preference never costs a fetch.
        let rs = reports(vec![report(2, &[60, 60]), report(3, &[60, 50])]);
        assert_eq!(plan_preferring(&rs, 3, 2, at(1, 0), Some(3)).unwrap().primary, 2);
        // Nor is an old primary ever chosen, named or not.
        let mut old = report(1, &[60, 60]);
        old.eligible = false;
        let rs = reports(vec![old, report(2, &[60, 60])]);
        assert_eq!(plan_preferring(&rs, 3, 2, at(1, 0), Some(1)).unwrap().primary, 2);
    }

    /// Reports of different stream counts (nodes running different `--workers`) make no
    /// plan where no count's reporters are a quorum by themselves: an old primary's own
    /// log of 4 streams, capped at the last point, beside a backup holding the
    /// acknowledged commits of a 2-stream epoch, made the point the old primary's (a loss
    /// of everything acknowledged since). Where they are, the plan is theirs alone (with
    /// the reporters that hold nothing), as if the others had not reported.
    #[test]
    fn reports_of_different_stream_counts_make_no_plan() {
        let mut old = report(1, &[100, 100, 100, 100]);
        old.eligible = false;
        old.last_resort = true;
        let rs = reports(vec![old.clone(), report(3, &[500, 480])]);
        assert_eq!(plan(&rs, 3, 2, at(1, 0)), Err(PlanError::StreamCounts(vec![2, 4])));
        // A third member's report of the primary's two streams: those two are a quorum.
        let rs = reports(vec![old.clone(), report(2, &[490, 500]), report(3, &[500, 480])]);
        let p = plan(&rs, 3, 2, at(1, 0)).unwrap();
        assert_eq!((p.primary, p.recovery_point), (2, 500), "{p:?}");
        let mut high = old.clone();
        high.newest = 900;
        let p = plan(&reports(vec![high, report(2, &[490, 500]), report(3, &[500, 480])]), 3, 2, at(1, 0)).unwrap();
        assert_eq!((p.recovery_point, p.start), (500, 900), "above what the one left out held too");
        assert!(p.fetch.iter().all(|f| f.from != 1), "nothing from the other count: {p:?}");
        // With one that holds nothing, of five members: the two and it are a quorum.
        let rs = reports(vec![old.clone(), report(2, &[490, 500]), report(3, &[500, 480]), report(5, &[])]);
        assert_eq!(plan(&rs, 5, 2, at(1, 0)).unwrap().recovery_point, 500);
        // Of three, one of the count and one that holds nothing are a quorum, but so are
        // the other count's and it: no plan.
        let rs = reports(vec![old.clone(), report(2, &[]), report(3, &[500, 480])]);
        assert_eq!(plan(&rs, 3, 2, at(1, 0)), Err(PlanError::StreamCounts(vec![2, 4])));
        // Five members, two of each count and one that holds nothing: a quorum is three,
        // which either count's reporters make with it: no plan.
        let mut old2 = old.clone();
        old2.node = 4;
        let rs = reports(vec![old, old2, report(2, &[490, 500]), report(3, &[500, 480]), report(5, &[])]);
        assert_eq!(plan(&rs, 5, 2, at(1, 0)), Err(PlanError::StreamCounts(vec![2, 4])));
    }

    #[test]
    fn without_a_quorum_or_an_eligible_node_there_is_no_plan() {
        let rs = reports(vec![report(2, &[40, 60]), report(3, &[50, 45])]);
        assert_eq!(plan(&rs, 5, 2, at(1, 0)), Err(PlanError::NoQuorum { got: 2, members: 5, quorum: 3 }));
        // Reports of another round do not count.
        let mut stale = report(4, &[70, 70]);
        stale.fenced_at = 1;
        let mut rs2 = rs.clone();
        rs2.insert(4, stale);
        assert!(matches!(plan(&rs2, 5, 2, at(1, 0)), Err(PlanError::NoQuorum { got: 2, .. })));
        let mut rs3 = rs;
        for r in rs3.values_mut() {
            r.eligible = false;
        }
        assert_eq!(plan(&rs3, 3, 2, at(1, 0)), Err(PlanError::NoEligibleNode));
    }

    #[test]
    fn a_node_behind_on_an_older_epoch_reports_below_the_start_and_fetches() {
        // The open epoch started at 100; node 1 lacks stream 1 from 80 on (of the epoch
        // before), node 2 holds it. A report clamped at the start would hide that.
        let rs = reports(vec![report(1, &[150, 80]), report(2, &[140, 160])]);
        let p = plan(&rs, 3, 2, at(1, 100)).unwrap();
        assert_eq!(p.recovery_point, 150);
        assert_eq!(p.primary, 2, "node 2 lacks 10, node 1 lacks 70");
        assert_eq!(p.fetch, vec![Fetch { stream: 0, from: 1, after: 140, upto: 150 }]);
        // Nobody got past the start on stream 2: the point falls below it, and the whole
        // open epoch is cut (the state lowers every older epoch's point to it too).
        let rs = reports(vec![report(1, &[150, 130, 90]), report(2, &[140, 160, 95])]);
        let p = plan(&rs, 3, 2, at(1, 100)).unwrap();
        assert_eq!(p.recovery_point, 95);
        assert!(p.start >= 160);
    }

    /// Simulation seed 4696: the eligible node holds both streams exactly to the epoch
    /// before's point (595); the recovered epoch started at 604, and the only holder of
    /// stream 1 to the new point is its old primary, whose log starts at that start. Nothing
    /// survives in (595, 604], so the fetch starts at 604, where that log answers it. A
    /// node behind the floor still fetches from where it is (its lack is real).
    #[test]
    fn a_fetch_from_between_the_older_point_and_the_start_starts_at_the_start() {
        let r = |node, streams: &[u64], serves_above, eligible| TailReport {
            serves_above,
            eligible,
            fenced_at: 3,
            epoch: 2,
            ..report(node, streams)
        };
        let old = TailReport { last_resort: true, ..r(2, &[659, 660], 604, false) };
        let rs = reports(vec![r(3, &[662, 330], 330, true), old, r(1, &[595, 595], 541, true)]);
        let gap = Recovered { epoch: 2, start: 604, floor: 595 };
        let p = plan(&rs, 3, 3, gap).unwrap();
        assert_eq!((p.primary, p.recovery_point), (1, 660));
        assert_eq!(
            p.fetch,
            vec![
                Fetch { stream: 0, from: 3, after: 604, upto: 660 },
                Fetch { stream: 1, from: 2, after: 604, upto: 660 }
            ]
        );
        // Without the gap (the epoch before was cut at the start), no plan.
        assert_eq!(plan(&rs, 3, 3, Recovered { floor: 604, ..gap }), Err(PlanError::NoSource));
        // A node behind the floor lacks what the epoch before kept: not lifted.
        let rs =
            reports(vec![r(3, &[662, 330], 330, true), r(2, &[659, 660], 604, false), r(1, &[595, 590], 541, true)]);
        assert_eq!(plan(&rs, 3, 3, gap), Err(PlanError::NoSource));
        // Nor past the point: a start above it lifts only to the point.
        let rs = reports(vec![r(1, &[595, 600], 0, true), r(2, &[610, 600], 0, true)]);
        let p = plan(&rs, 3, 3, Recovered { epoch: 2, start: 604, floor: 595 }).unwrap();
        assert_eq!(p.recovery_point, 600);
        assert!(p.fetch.iter().all(|f| f.after <= f.upto), "{p:?}");
    }

    /// Exhaustively over small histories: every commit a quorum held on every stream is at
    /// or below the recovery point, whichever quorum reports, and the chosen primary can
    /// fetch everything below it from reporters.
    #[test]
    fn no_commit_a_quorum_held_is_above_the_point() {
        let vals = [0u64, 3, 5, 8];
        let mut cases = 0;
        for a in vals {
            for b in vals {
                for c in vals {
                    for d in vals {
                        for e in vals {
                            for f in vals {
                                // Three nodes, two streams: node i holds (streams[i]).
                                let held = [[a, b], [c, d], [e, f]];
                                // The highest ts a quorum of two holds on every stream.
                                let mut released = 0;
                                for (i, j) in [(0, 1), (0, 2), (1, 2)] {
                                    let w = (0..2).map(|s| held[i][s].min(held[j][s])).min().unwrap();
                                    released = released.max(w);
                                }
                                // Each node's checkpoint at 0 or at the least it holds on a
                                // stream (the most it can be): a fetch never starts below it.
                                for ckpts in 0..8u32 {
                                    let serves =
                                        |n: usize| if ckpts & (1 << n) != 0 { held[n][0].min(held[n][1]) } else { 0 };
                                    for (i, j) in [(0, 1), (0, 2), (1, 2)] {
                                        let r = |n: usize| TailReport {
                                            serves_above: serves(n),
                                            ..report(n as u64 + 1, &held[n])
                                        };
                                        let rs = reports(vec![r(i), r(j)]);
                                        let p = plan(&rs, 3, 2, at(1, 0)).unwrap();
                                        assert!(p.recovery_point >= released, "{held:?} {i}{j}: {p:?}");
                                        for fe in &p.fetch {
                                            let from = fe.from as usize - 1;
                                            assert!(held[from][fe.stream] >= fe.upto);
                                            assert!(serves(from) <= fe.after, "{held:?} {ckpts} {i}{j}: {p:?}");
                                        }
                                        cases += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 4096 * 3 * 8);
    }

    /// A holder whose checkpoint lies above where a node's fetch would start cannot answer
    /// it (its log no longer holds those batches): that node is not chosen, though it lacks
    /// least, if another can fetch all it lacks.
    #[test]
    fn a_node_whose_fetch_no_holder_can_answer_is_not_chosen() {
        let r = |node, streams: &[u64], serves_above| TailReport { serves_above, ..report(node, streams) };
        // Node 2 lacks 20 (stream 2, above 80), node 3 lacks 24 (streams 0 and 1, above 88).
        // Only node 3 holds stream 2 to the point, and its checkpoint is at 88.
        let rs = reports(vec![r(2, &[100, 100, 80], 80), r(3, &[88, 88, 100], 88)]);
        let p = plan(&rs, 3, 2, at(1, 0)).unwrap();
        assert_eq!(p.recovery_point, 100);
        assert_eq!(p.primary, 3, "node 2 could not fetch stream 2 above 80");
        assert_eq!(
            p.fetch,
            vec![
                Fetch { stream: 0, from: 2, after: 88, upto: 100 },
                Fetch { stream: 1, from: 2, after: 88, upto: 100 }
            ]
        );
        // Checkpoints below the fetch: the node that lacks least, as before.
        let rs = reports(vec![r(2, &[100, 100, 80], 0), r(3, &[88, 88, 100], 0)]);
        assert_eq!(plan(&rs, 3, 2, at(1, 0)).unwrap().primary, 2);
    }

    #[test]
    fn a_fetch_goes_to_a_holder_that_can_answer_it() {
        let r = |node, streams: &[u64], serves_above, eligible| TailReport {
            serves_above,
            eligible,
            ..report(node, streams)
        };
        // Nodes 3 and 4 are old primaries (never chosen) holding everything; node 3, the
        // first to hold the most, checkpointed at 90, above node 2's 50 on stream 1.
        let rs = reports(vec![r(2, &[100, 50], 50, true), r(3, &[100, 100], 90, false), r(4, &[100, 100], 40, false)]);
        let p = plan(&rs, 5, 2, at(1, 0)).unwrap();
        assert_eq!((p.primary, p.recovery_point), (2, 100));
        assert_eq!(p.fetch, vec![Fetch { stream: 1, from: 4, after: 50, upto: 100 }]);
        // Without node 4 nobody can answer it: no plan yet (more reports may bring one).
        let rs = reports(vec![r(2, &[100, 50], 50, true), r(3, &[100, 100], 90, false)]);
        assert_eq!(plan(&rs, 3, 2, at(1, 0)), Err(PlanError::NoSource));
        // Unless the old primary, which lacks nothing, may be chosen as a last resort.
        let old = TailReport { last_resort: true, ..r(3, &[100, 100], 90, false) };
        let rs = reports(vec![r(2, &[100, 50], 50, true), old.clone()]);
        let p = plan(&rs, 3, 2, at(1, 0)).unwrap();
        assert_eq!((p.primary, p.recovery_point, p.fetch.len()), (3, 100, 0));
        // Never while an eligible node can fetch what it lacks (node 4 answers it) ...
        let rs = reports(vec![r(2, &[100, 50], 50, true), old.clone(), r(4, &[100, 100], 40, false)]);
        assert_eq!(plan(&rs, 5, 2, at(1, 0)).unwrap().primary, 2);
        // ... nor if it lacks something itself, unless its own log is of the recovered
        // epoch (the batches it lacks are ones it shipped): it then fetches them.
        let behind = TailReport { last_resort: true, ..r(3, &[100, 99], 90, false) };
        let rs = reports(vec![r(2, &[100, 50], 50, true), behind.clone(), r(4, &[99, 100], 95, false)]);
        assert_eq!(plan(&rs, 5, 2, at(1, 0)), Err(PlanError::NoSource));
        let older = TailReport { own_epoch: 0, ..behind.clone() };
        let rs = reports(vec![r(2, &[100, 50], 50, true), older, r(4, &[99, 100], 95, false)]);
        assert_eq!(plan(&rs, 5, 2, at(1, 0)), Err(PlanError::NoSource), "a log of an older epoch takes no batches");
        let own = TailReport { own_epoch: 1, ..behind.clone() };
        let rs = reports(vec![r(2, &[100, 50], 50, true), own.clone(), r(4, &[99, 100], 95, false)]);
        let p = plan(&rs, 5, 2, at(1, 0)).unwrap();
        assert_eq!((p.primary, p.recovery_point), (3, 100));
        assert_eq!(p.fetch, vec![Fetch { stream: 1, from: 4, after: 99, upto: 100 }]);
        // One that lacks nothing is still preferred to one that must fetch.
        let whole = TailReport { node: 5, own_epoch: 1, ..old.clone() };
        let rs = reports(vec![r(2, &[100, 50], 50, true), own.clone(), r(4, &[99, 100], 95, false), whole]);
        assert_eq!(plan(&rs, 5, 2, at(1, 0)).unwrap().primary, 5);
        // And it must be able to fetch: without node 4, nobody holds stream 1 to 100 as
        // batches above 99.
        let rs = reports(vec![r(2, &[100, 50], 50, true), own, r(6, &[100, 100], 100, false)]);
        assert_eq!(plan(&rs, 5, 2, at(1, 0)), Err(PlanError::NoSource));
    }
}
