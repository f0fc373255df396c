//! A primary that restarted under a policy that lets backups release commits
//! ========================================================================
//! A commit a quorum of backups acknowledged may be missing from the primary's own disk
//! (under `received` its memory counted; under `durable`, a quorum of backups alone). So
//! a standalone primary that opens a new epoch over its log takes writes only once enough
//! backups have said they hold nothing above its restart point (`restart_settled`), and
//! none says it holds more. How many depends on the policies in use and on how many
//! backups the quorum counted before the restart, which the primary keeps on its disk
//! (`QuorumRecord`, the file `quorum` in its data directory), written before either can
//! grow: before a connection's first commit under a policy (`Primary::backups_may_release`)
//! and before a backup's link counts in a larger quorum.
//!
//! Invariants: the record on disk covers every commit released since the directory's last
//! settled restart (policies and slots only grow until the next settles); a restart waits
//! for `need()` distinct backups; a backup of an older epoch than the one restarted from
//! counts as holding more (it may hold what an unsettled earlier restart lost).
//!
//! A backup gone for good (its disk lost, its machine retired) would keep a waiting
//! primary read-only for ever. A person says so on the primary (`DITTO.FORGETBACKUP name`,
//! `Primary::declare_lost`): the name is recorded as lost (on disk first), what it alone
//! held is given up, and the wait goes on for the others. Losing it does not lower what is
//! needed of the rest: a commit held by `t` backups, some of them lost, is still on the
//! others that held it, so the restart waits for enough of the remaining ones to meet every
//! such set (`need`).

use std::path::Path;

use ditto_engine::Ts;
use ditto_log::Epoch;

use crate::CommitPolicy;

/// The file in a primary's data directory.
pub const QUORUM_FILE: &str = "quorum";

/// See the module notes: what the quorum could count since the last settled restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuorumRecord {
    /// The backups the server's quorum counts at least (`--backups`).
    pub expected: usize,
    /// The most backup slots it counted at once.
    pub slots: usize,
    /// Every commit policy in use, in the order first used; no repeats.
    pub policies: Vec<CommitPolicy>,
    /// Every backup (by name) whose acknowledgements counted; sorted, no repeats.
    pub backups: Vec<String>,
    /// Those of `backups` a person declared gone for good while a restart waited
    /// (`DITTO.FORGETBACKUP`): what they alone held is given up; sorted, no repeats.
    pub lost: Vec<String>,
    /// The restarts since the last settled one, each the epoch it cut and its point (the
    /// primary recovered every commit of that epoch up to it): a restart that waits takes
    /// no writes until it settles, so the epochs they opened hold no commits, and a backup
    /// of one of the cut epochs that holds nothing above its point holds nothing this
    /// primary lacks (`clear_after_restarts`). Sorted by epoch, one each.
    pub restarts: Vec<(Epoch, Ts)>,
}

/// How many backups alone release a commit under `p` with `slots` counted (the quorum
/// less the primary under `received`, the whole quorum under `durable`), if backups alone
/// can: `None` where the primary's own fsync is always needed.
fn backups_alone(p: CommitPolicy, slots: usize) -> Option<usize> {
    if p.scope == crate::Scope::Local {
        return None;
    }
    let quorum = p.quorum(slots + 1);
    let t = match p.level {
        crate::Level::Received => quorum - 1,
        crate::Level::Durable => quorum,
    };
    (t >= 1 && t <= slots).then_some(t)
}

impl QuorumRecord {
    pub fn new(expected: usize, policy: CommitPolicy) -> QuorumRecord {
        QuorumRecord { expected, slots: expected, policies: vec![policy], ..Default::default() }
    }

    /// The fewest backups that alone could have released a commit: over every policy in
    /// use and every slot count the quorum had (from `expected`, at least one, to `slots`).
    fn fewest_releasing(&self) -> Option<usize> {
        let low = self.expected.max(1);
        (low..=self.slots.max(low)).flat_map(|s| self.policies.iter().filter_map(move |p| backups_alone(*p, s))).min()
    }

    /// Backups of `backups` (not lost) a restart must hear hold nothing above its point.
    /// A commit backups alone released is on at least `t` of the `n` recorded (the fewest
    /// that alone could release), so on at least `t - f` of the `n - f` not lost (`f`
    /// lost), or, where `t <= f`, perhaps on lost ones alone (given up) or on one that is
    /// not: every such set meets any `(n - f) - max(t - f, 1) + 1` of the remaining. With
    /// fewer than `t` backups ever counted, or none able to release alone, none.
    pub fn need(&self) -> usize {
        let (n, f) = (self.backups.len(), self.lost.len());
        match self.fewest_releasing() {
            Some(t) if n >= t => (n - f + 1).saturating_sub(t.saturating_sub(f).max(1)),
            _ => 0,
        }
    }

    /// The recorded backups not lost: those a restart waits to hear from.
    pub fn remaining(&self) -> impl Iterator<Item = &str> {
        self.backups.iter().filter(|b| !self.lost.contains(b)).map(|b| b.as_str())
    }

    /// Backups alone may release a commit with the slots counted now (so a backup must
    /// keep what it received above a restarted primary's point: `Frame::Batch::counted`).
    pub fn backups_release(&self) -> bool {
        self.policies.iter().any(|p| backups_alone(*p, self.slots).is_some())
    }

    /// Both records' counts, policies and backups.
    pub fn merged(&self, o: &QuorumRecord) -> QuorumRecord {
        let mut r = self.clone();
        r.expected = r.expected.min(o.expected);
        r.slots = r.slots.max(o.slots);
        for p in &o.policies {
            r.add_policy(*p);
        }
        for b in &o.backups {
            r.add_backup(b);
        }
        for b in &o.lost {
            let _ = r.add_lost(b);
        }
        for (e, p) in &o.restarts {
            r.add_restart(*e, *p);
        }
        r
    }

    /// Records a restart that cut epoch `e` at `point` (see `restarts`); the lower point
    /// if one was recorded for `e` (it cannot differ: an epoch is cut once).
    pub fn add_restart(&mut self, e: Epoch, point: Ts) {
        match self.restarts.binary_search_by(|(x, _)| x.cmp(&e)) {
            Ok(i) => self.restarts[i].1 = self.restarts[i].1.min(point),
            Err(i) => self.restarts.insert(i, (e, point)),
        }
    }

    /// Adds `p`; whether it was new.
    pub fn add_policy(&mut self, p: CommitPolicy) -> bool {
        let new = !self.policies.contains(&p);
        if new {
            self.policies.push(p);
        }
        new
    }

    /// Adds the backup `name`; whether it was new.
    pub fn add_backup(&mut self, name: &str) -> bool {
        insert_sorted(&mut self.backups, name)
    }

    /// Records the recorded backup `name` as lost (see the module notes); whether it was
    /// new. An error, changing nothing, if the quorum never counted it.
    pub fn add_lost(&mut self, name: &str) -> Result<bool, String> {
        if self.backups.binary_search_by(|b| b.as_str().cmp(name)).is_err() {
            return Err(format!("{name} is not a backup this primary's quorum counted ({})", self.backups.join(", ")));
        }
        Ok(insert_sorted(&mut self.lost, name))
    }

    fn encode(&self) -> String {
        let names: Vec<String> = self.policies.iter().map(|p| p.name()).collect();
        // Version 2 while nothing is lost, so that the build before `lost` lines still
        // reads the record (a rollback); 4 only with `restart` lines.
        let version = match (self.lost.is_empty(), self.restarts.is_empty()) {
            (_, false) => 4,
            (false, true) => 3,
            (true, true) => 2,
        };
        let mut out = format!(
            "ditto quorum {version}\nexpected {}\nslots {}\npolicies {}\n",
            self.expected,
            self.slots,
            names.join(",")
        );
        for b in &self.backups {
            out.push_str(&format!("backup {b}\n"));
        }
        for b in &self.lost {
            out.push_str(&format!("lost {b}\n"));
        }
        for (e, p) in &self.restarts {
            out.push_str(&format!("restart {} {}\n", e.0, p.0));
        }
        out.push_str("end\n");
        out
    }

    fn decode(text: &str) -> Result<QuorumRecord, String> {
        // Whole or refused: a record cut short must not read as a smaller one.
        let body = text.strip_suffix("end\n").ok_or("no end line")?;
        let mut lines = body.lines();
        // Version 3 added `lost` lines, 4 `restart` lines; a version 2 record has neither.
        let version = match lines.next() {
            Some("ditto quorum 2") => 2,
            Some("ditto quorum 3") => 3,
            Some("ditto quorum 4") => 4,
            _ => return Err("not a quorum record of version 2, 3 or 4".into()),
        };
        let mut num = |key: &str| -> Result<usize, String> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(key))
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("no {key}line"))
        };
        let (expected, slots) = (num("expected ")?, num("slots ")?);
        let list = lines.next().and_then(|l| l.strip_prefix("policies ")).ok_or("no policies line")?;
        let mut r = QuorumRecord { expected, slots, ..Default::default() };
        for name in list.split(',').filter(|n| !n.is_empty()) {
            r.add_policy(CommitPolicy::parse(name)?);
        }
        for l in lines {
            if let Some(b) = l.strip_prefix("backup ") {
                r.add_backup(b);
            } else if let (Some(b), 3..) = (l.strip_prefix("lost "), version) {
                r.add_lost(b)?;
            } else if let (Some(rest), 4) = (l.strip_prefix("restart "), version) {
                let bad = || format!("a bad restart line {l:?}");
                let (e, p) = rest.split_once(' ').ok_or_else(bad)?;
                r.add_restart(Epoch(e.parse().map_err(|_| bad())?), Ts(p.parse().map_err(|_| bad())?));
            } else {
                return Err(format!("an unknown line {l:?}"));
            }
        }
        Ok(r)
    }

    /// The record in `dir`; `None` if there is none (a new directory, or one from before
    /// records were kept). A damaged one is an error, naming the file.
    pub fn read(dir: &Path) -> std::io::Result<Option<QuorumRecord>> {
        let path = dir.join(QUORUM_FILE);
        match std::fs::read_to_string(&path) {
            Ok(t) => QuorumRecord::decode(&t).map(Some).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: {e} (a person who knows no backup holds commits this primary lacks may remove it)",
                        path.display()
                    ),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces the record in `dir`, durably (a temporary file fsynced, renamed, the
    /// directory fsynced) before it returns.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let real = ditto_log::storage::RealStorage;
        ditto_log::catalog::write_atomically(dir, QUORUM_FILE, self.encode().as_bytes(), &real)
    }
}

/// Inserts `name` into the sorted `names` unless it is there; whether it was new.
fn insert_sorted(names: &mut Vec<String>, name: &str) -> bool {
    match names.binary_search_by(|b| b.as_str().cmp(name)) {
        Ok(_) => false,
        Err(at) => {
            names.insert(at, name.to_string());
            true
        }
    }
}

/// Whether a backup that said it follows epoch `e` holding up to `have` holds nothing a
/// primary of epoch `now`, restarted from epoch `old` at `point`, lacks: it follows this
/// epoch; or `old` up to the point; or an older epoch cut by one of the restarts since the
/// last settled one (`QuorumRecord::restarts`) up to that restart's point (those
/// restarts took no writes, so the epochs between hold no commits); or an older epoch,
/// holding nothing. Anything else may hold what a restart lost.
pub fn clear_after_restarts(now: Epoch, old: Epoch, point: Ts, restarts: &[(Epoch, Ts)], e: Epoch, have: Ts) -> bool {
    e == now
        || (e == old && have <= point)
        || (e < old && (have == Ts::ZERO || restarts.iter().any(|(re, rp)| *re == e && have <= *rp)))
}

/// Whether a primary that restarted from epoch `old` at `point` (`Durable::opened_from`)
/// may take writes, by `record` (the last run's, `QuorumRecord::need`), given what it
/// heard since (`Primary::heard_since_restart`: the backups whose last `Hello` said they
/// hold nothing above the point, and those that hold more, or may): `Ok` once `need` of
/// the recorded backups are clear and none holds more; else why not yet. A backup
/// holding more keeps it (it may have been acknowledged, and it is not on this primary):
/// the reason names it and what a person can do. Pure, for tests.
pub fn restart_settled(
    record: &QuorumRecord,
    old: Epoch,
    point: Ts,
    clear: &std::collections::BTreeSet<String>,
    holding_more: &[(String, Epoch, Ts)],
) -> Result<(), String> {
    if let Some((node, e, have)) = holding_more.first() {
        let what = if *e < old {
            format!("follows epoch {}, older than the one this primary restarted from, holding up to ts {}: it may hold commits an earlier restart lost", e.0, have.0)
        } else {
            format!("holds commits up to ts {} of epoch {}, which may have been acknowledged", have.0, e.0)
        };
        return Err(format!(
            "this primary restarted at ts {} of epoch {}, and backup {node} {what}, and are not here: it keeps them and does not follow, and this primary takes no writes, which would fork the history. To keep them, stop this primary and serve the backup's directory as the primary (`ditto server --promote`), then make this one its backup on an empty directory; to discard them, empty the backup's directory and start it again",
            point.0, old.0
        ));
    }
    let need = record.need();
    let heard = record.remaining().filter(|b| clear.contains(*b)).count();
    if heard >= need {
        return Ok(());
    }
    let waiting: Vec<&str> = record.remaining().filter(|b| !clear.contains(*b)).collect();
    Err(format!(
        "this primary restarted at ts {} of epoch {} and takes no writes until {} more of the backups its quorum counted ({}) say they hold nothing above it (a commit acknowledged before the restart may be on backups alone; if one is gone for good, `DITTO.FORGETBACKUP name` on this primary gives up what it alone held and waits for the others)",
        point.0,
        old.0,
        need - heard,
        waiting.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> CommitPolicy {
        CommitPolicy::parse(s).unwrap()
    }

    fn rec(expected: usize, slots: usize, policies: &[&str], backups: &[&str]) -> QuorumRecord {
        let mut r = QuorumRecord { expected, slots, ..Default::default() };
        for x in policies {
            r.add_policy(p(x));
        }
        for b in backups {
            r.add_backup(b);
        }
        r
    }

    #[test]
    fn a_record_round_trips_and_one_cut_short_or_damaged_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(QuorumRecord::read(dir.path()).unwrap(), None);
        let r = rec(1, 12, &["majority-durable", "majority-received"], &["b2", "b1"]);
        assert_eq!(r.backups, ["b1", "b2"]);
        r.write(dir.path()).unwrap();
        assert_eq!(QuorumRecord::read(dir.path()).unwrap(), Some(r.clone()));
        let good = std::fs::read(dir.path().join(QUORUM_FILE)).unwrap();
        assert!(good.starts_with(b"ditto quorum 2\n"), "nothing lost: the version the build before reads");
        for cut in 0..good.len() {
            std::fs::write(dir.path().join(QUORUM_FILE), &good[..cut]).unwrap();
            let e = QuorumRecord::read(dir.path()).expect_err(&format!("cut at {cut} was read"));
            assert!(e.to_string().contains(QUORUM_FILE), "{e}");
        }
        std::fs::write(dir.path().join(QUORUM_FILE), "ditto quorum 2\nexpected 1\nslots 1\npolicies sometimes\nend\n")
            .unwrap();
        assert!(QuorumRecord::read(dir.path()).is_err());
        // A backup declared lost is kept, and only one the quorum counted can be.
        let mut lost = r.clone();
        assert_eq!(lost.add_lost("b2"), Ok(true));
        assert_eq!(lost.add_lost("b2"), Ok(false));
        let e = lost.add_lost("b9").unwrap_err();
        assert!(e.contains("b9 is not a backup this primary's quorum counted (b1, b2)"), "{e}");
        assert_eq!(lost.lost, ["b2"]);
        lost.write(dir.path()).unwrap();
        assert_eq!(QuorumRecord::read(dir.path()).unwrap(), Some(lost.clone()));
        let text = std::fs::read_to_string(dir.path().join(QUORUM_FILE)).unwrap();
        assert!(text.starts_with("ditto quorum 3\n") && text.contains("\nlost b2\n"), "{text}");
        assert_eq!(r.merged(&lost).lost, ["b2"], "a merge keeps what was declared lost");
        std::fs::write(
            dir.path().join(QUORUM_FILE),
            "ditto quorum 3\nexpected 1\nslots 1\npolicies local\nlost b1\nend\n",
        )
        .unwrap();
        let e = QuorumRecord::read(dir.path()).unwrap_err();
        assert!(e.to_string().contains("b1 is not a backup"), "a lost backup the record never counted: {e}");
        // A record written before `lost` lines (version 2) still reads.
        let v2 = "ditto quorum 2\nexpected 1\nslots 2\npolicies majority-received\nbackup b1\nend\n";
        std::fs::write(dir.path().join(QUORUM_FILE), v2).unwrap();
        assert_eq!(QuorumRecord::read(dir.path()).unwrap(), Some(rec(1, 2, &["majority-received"], &["b1"])));
        // The chain of unsettled restarts (version 4): kept, merged, one point an epoch.
        let mut chain = lost.clone();
        chain.add_restart(Epoch(3), Ts(70));
        chain.add_restart(Epoch(2), Ts(50));
        chain.add_restart(Epoch(3), Ts(90));
        assert_eq!(chain.restarts, [(Epoch(2), Ts(50)), (Epoch(3), Ts(70))]);
        chain.write(dir.path()).unwrap();
        assert_eq!(QuorumRecord::read(dir.path()).unwrap(), Some(chain.clone()));
        let text = std::fs::read_to_string(dir.path().join(QUORUM_FILE)).unwrap();
        assert!(text.starts_with("ditto quorum 4\n") && text.contains("\nrestart 2 50\nrestart 3 70\nend\n"), "{text}");
        assert_eq!(r.merged(&chain).restarts, chain.restarts, "a merge keeps the chain");
        for bad in ["restart 2", "restart x 5", "restart 2 y"] {
            let t = format!("ditto quorum 4\nexpected 1\nslots 1\npolicies local\n{bad}\nend\n");
            std::fs::write(dir.path().join(QUORUM_FILE), t).unwrap();
            assert!(QuorumRecord::read(dir.path()).is_err(), "{bad}");
        }
        // Each kind of line only in the version that has it.
        for (v, line) in [(3, "restart 2 50"), (2, "lost b1")] {
            let t = format!("ditto quorum {v}\nexpected 1\nslots 1\npolicies local\nbackup b1\n{line}\nend\n");
            std::fs::write(dir.path().join(QUORUM_FILE), t).unwrap();
            assert!(QuorumRecord::read(dir.path()).is_err(), "version {v} with {line}");
        }
    }

    /// What a backup that follows epoch `e` holding up to `have` holds, for a primary of
    /// epoch 5 restarted from epoch 4 at ts 400, after restarts that cut epoch 3 at 300
    /// and epoch 2 at 200 without settling (they took no writes): clear where it holds
    /// nothing above where its epoch was cut; anything else may hold what a restart lost.
    #[test]
    fn a_backup_of_an_epoch_an_unsettled_restart_cut_is_clear_up_to_that_restarts_point() {
        let chain = [(Epoch(2), Ts(200)), (Epoch(3), Ts(300)), (Epoch(4), Ts(400))];
        let clear = |e: u64, have: u64| clear_after_restarts(Epoch(5), Epoch(4), Ts(400), &chain, Epoch(e), Ts(have));
        assert!(clear(5, 999), "this epoch");
        assert!(clear(4, 400) && !clear(4, 401), "the epoch restarted from");
        assert!(clear(3, 300) && clear(3, 1) && !clear(3, 301), "an epoch the chain cut");
        assert!(clear(2, 200) && !clear(2, 201));
        assert!(clear(1, 0) && !clear(1, 1), "older than the chain: only an empty backup");
        // Without the chain (the build before), an older epoch is clear only empty.
        let bare = |e: u64, have: u64| clear_after_restarts(Epoch(5), Epoch(4), Ts(400), &[], Epoch(e), Ts(have));
        assert!(!bare(3, 300) && bare(3, 0) && bare(4, 400));
    }

    /// With some recorded backups declared lost, every commit backups alone could release
    /// and that any backup not lost holds still meets the backups a restart waits for, and
    /// the wait asks no more than that: by brute force over which backups held the commit.
    #[test]
    fn a_restart_that_lost_backups_still_meets_every_commit_the_others_hold_and_asks_no_more() {
        let names = ["b0", "b1", "b2", "b3", "b4"];
        for policy in ["majority-durable", "majority-received", "all-durable", "all-received"] {
            for expected in 1..=3usize {
                for slots in expected..=4 {
                    for n in 1..=slots.min(5) {
                        // Lost: a bit set over the n recorded backups.
                        for lost_bits in 0u32..(1 << n) {
                            let mut r = rec(expected, slots, &[policy], &names[..n]);
                            for (i, name) in names[..n].iter().enumerate() {
                                if lost_bits & (1 << i) != 0 {
                                    r.add_lost(name).unwrap();
                                }
                            }
                            let remaining: Vec<usize> = (0..n).filter(|i| lost_bits & (1 << i) == 0).collect();
                            let need = r.need();
                            assert!(need <= remaining.len(), "{policy} {n} {lost_bits:b}: need {need}");
                            // The holders of some commit: any set of at least t backups, at
                            // a slot count the quorum had, not all lost.
                            let mut worst_needed = 0;
                            for sl in expected..=slots {
                                let Some(t) = backups_alone(p(policy), sl) else { continue };
                                for holders in 0u32..(1 << n) {
                                    if (holders.count_ones() as usize) < t || holders & !lost_bits == 0 {
                                        continue;
                                    }
                                    let held_by_remaining =
                                        remaining.iter().filter(|i| holders & (1 << **i) != 0).count();
                                    // The unheard remaining (all but `need`) cannot hold all of it.
                                    assert!(
                                        remaining.len() - need < held_by_remaining,
                                        "{policy} e{expected} s{slots} n{n} lost {lost_bits:b} holders {holders:b}: need {need}"
                                    );
                                    worst_needed = worst_needed.max(remaining.len() + 1 - held_by_remaining);
                                }
                            }
                            assert_eq!(need, worst_needed, "{policy} e{expected} s{slots} n{n} lost {lost_bits:b}");
                        }
                    }
                }
            }
        }
        // By name: one backup, lost: nothing to wait for; two of three with t = 2: the
        // two remaining, not one.
        let mut one = rec(1, 1, &["majority-received"], &["b1"]);
        one.add_lost("b1").unwrap();
        assert_eq!(one.need(), 0);
        let mut three = rec(3, 3, &["majority-durable"], &["a", "b", "c"]);
        assert_eq!(three.need(), 1);
        three.add_lost("c").unwrap();
        assert_eq!(three.need(), 1, "a commit on all three (t = 3) is on a and b still");
        // docs/replication.md's example: three backups, two release (t = 2), c lost: a
        // commit may be on a and c, or on b and c, so both a and b (removing c's name
        // would ask for one).
        let mut two_release = rec(3, 3, &["majority-received"], &["a", "b", "c"]);
        assert_eq!(two_release.need(), 2);
        two_release.add_lost("c").unwrap();
        assert_eq!(two_release.need(), 2);
        assert_eq!(rec(3, 3, &["majority-received"], &["a", "b"]).need(), 1, "what removing the name would ask");
        let mut all = rec(2, 2, &["majority-received"], &["a", "b"]);
        assert_eq!(all.need(), 2);
        all.add_lost("b").unwrap();
        assert_eq!(all.need(), 1);
    }

    /// Every commit backups alone could release meets the backups a restart waits for:
    /// by brute force over which recorded backups held it and the quorum's size then.
    #[test]
    fn a_restart_waits_for_enough_recorded_backups_to_meet_every_quorum_without_the_primarys_disk() {
        let names = ["b0", "b1", "b2", "b3", "b4"];
        for policy in ["local", "majority-durable", "majority-received", "all-durable", "all-received"] {
            for expected in 0..=3usize {
                for slots in expected..=4 {
                    for n in 0..=slots.clamp(1, 5) {
                        let r = rec(expected, slots, &[policy], &names[..n]);
                        let need = r.need();
                        assert!(need <= n);
                        // Any release by backups alone, at any slot count the quorum had:
                        // held by at least t of the n recorded backups.
                        for s in expected.max(1)..=slots.max(expected.max(1)) {
                            let Some(t) = backups_alone(p(policy), s) else { continue };
                            if t > n {
                                continue;
                            }
                            // Hearing `need` clear backups leaves n - need, too few to hold it.
                            assert!(
                                n - need < t,
                                "{policy} expected {expected} slots {slots} n {n}: {need} heard, {t} hold"
                            );
                        }
                    }
                }
            }
        }
        // The formula's cases, by name.
        assert_eq!(rec(1, 1, &["majority-durable"], &["b"]).need(), 0, "the primary's fsync was needed");
        assert_eq!(rec(1, 2, &["majority-durable"], &["a", "b"]).need(), 1);
        assert_eq!(rec(1, 1, &["local", "majority-received"], &["b"]).need(), 1);
        assert_eq!(rec(2, 2, &["majority-received"], &["a", "b"]).need(), 2);
        assert_eq!(rec(1, 1, &["majority-received"], &[]).need(), 0, "no backup ever counted");
        assert!(!rec(1, 1, &["majority-durable"], &[]).backups_release());
        assert!(rec(1, 2, &["majority-durable"], &[]).backups_release());
        assert!(!rec(1, 1, &["all-durable"], &[]).backups_release());
    }

    #[test]
    fn a_restarted_primary_takes_writes_once_enough_recorded_backups_are_clear_and_none_holds_more() {
        let (old, point) = (Epoch(3), Ts(100));
        let r = rec(2, 2, &["majority-received"], &["b1", "b2"]);
        let clear = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<std::collections::BTreeSet<_>>();
        let why = restart_settled(&r, old, point, &clear(&["b1", "fresh"]), &[]).unwrap_err();
        assert!(
            why.contains("until 1 more of the backups its quorum counted (b2)"),
            "a fresh backup counts for nothing: {why}"
        );
        assert_eq!(restart_settled(&r, old, point, &clear(&["b1", "b2"]), &[]), Ok(()));
        let more = [("b2".to_string(), old, Ts(130))];
        let why = restart_settled(&r, old, point, &clear(&["b1"]), &more).unwrap_err();
        assert!(why.contains("backup b2 holds commits up to ts 130 of epoch 3") && why.contains("--promote"), "{why}");
        let older = [("b3".to_string(), Epoch(2), Ts(90))];
        let why = restart_settled(&r, old, point, &clear(&["b1", "b2"]), &older).unwrap_err();
        assert!(why.contains("backup b3 follows epoch 2, older"), "{why}");
        // b2 declared lost: b1 alone is waited for, and a lost backup heard clear counts
        // for nothing.
        let mut lost = r.clone();
        lost.add_lost("b2").unwrap();
        let why = restart_settled(&lost, old, point, &clear(&["b2"]), &[]).unwrap_err();
        assert!(
            why.contains("until 1 more of the backups its quorum counted (b1)") && why.contains("DITTO.FORGETBACKUP"),
            "{why}"
        );
        assert_eq!(restart_settled(&lost, old, point, &clear(&["b1"]), &[]), Ok(()));
        // A lost backup that comes back holding more still stops the writes.
        let back = [("b2".to_string(), old, Ts(130))];
        assert!(restart_settled(&lost, old, point, &clear(&["b1"]), &back).is_err());
    }
}
