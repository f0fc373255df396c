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

use std::io::Write;
use std::path::Path;

use ditto_engine::Ts;
use ditto_log::Epoch;

use crate::policy::backups_to_hear_at_restart;
use crate::CommitPolicy;

/// The file in a primary's data directory.
pub const QUORUM_FILE: &str = "quorum";

/// See the module notes: the most backup slots the quorum counted and every policy in
/// use since the last settled restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuorumRecord {
    pub slots: usize,
    /// In the order first used; no repeats.
    pub policies: Vec<CommitPolicy>,
}

impl QuorumRecord {
    pub fn new(slots: usize, policy: CommitPolicy) -> QuorumRecord {
        QuorumRecord { slots, policies: vec![policy] }
    }

    /// Backups a restart must hear hold nothing above its point: the most any policy in
    /// use needs with the slots counted.
    pub fn need(&self) -> usize {
        self.policies.iter().map(|p| backups_to_hear_at_restart(*p, self.slots)).max().unwrap_or(0)
    }

    /// Backups alone may release a commit (so a backup must keep what it received above
    /// a restarted primary's point: `Frame::Batch::counted`).
    pub fn backups_release(&self) -> bool {
        self.need() > 0
    }

    /// Both records' slots and policies.
    pub fn merged(&self, o: &QuorumRecord) -> QuorumRecord {
        let mut r = self.clone();
        r.slots = r.slots.max(o.slots);
        for p in &o.policies {
            r.add_policy(*p);
        }
        r
    }

    /// Adds `p`; whether it was new.
    pub fn add_policy(&mut self, p: CommitPolicy) -> bool {
        let new = !self.policies.contains(&p);
        if new {
            self.policies.push(p);
        }
        new
    }

    fn encode(&self) -> String {
        let names: Vec<String> = self.policies.iter().map(|p| p.name()).collect();
        format!("ditto quorum 1\nslots {}\npolicies {}\n", self.slots, names.join(","))
    }

    fn decode(text: &str) -> Result<QuorumRecord, String> {
        let mut lines = text.lines();
        if lines.next() != Some("ditto quorum 1") {
            return Err("not a quorum record of version 1".into());
        }
        let slots =
            lines.next().and_then(|l| l.strip_prefix("slots ")).and_then(|n| n.parse().ok()).ok_or("no slots line")?;
        let list = lines.next().and_then(|l| l.strip_prefix("policies ")).ok_or("no policies line")?;
        let mut r = QuorumRecord { slots, policies: Vec::new() };
        for name in list.split(',').filter(|n| !n.is_empty()) {
            r.add_policy(CommitPolicy::parse(name)?);
        }
        if lines.next().is_some() {
            return Err("trailing lines".into());
        }
        Ok(r)
    }

    /// The record in `dir`; `None` if there is none (a new directory, or one from before
    /// records were kept). A damaged one is an error, naming the file.
    pub fn read(dir: &Path) -> std::io::Result<Option<QuorumRecord>> {
        let path = dir.join(QUORUM_FILE);
        match std::fs::read_to_string(&path) {
            Ok(t) => QuorumRecord::decode(&t)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Replaces the record in `dir`, durably (a temporary file fsynced, renamed, the
    /// directory fsynced) before it returns.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let tmp = dir.join(format!("{QUORUM_FILE}.tmp"));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(self.encode().as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, dir.join(QUORUM_FILE))?;
        ditto_log::storage::sync_dir(dir)
    }
}

/// Whether a primary that restarted from epoch `old` at `point` (`Durable::opened_from`)
/// may take writes, needing `need` backups (`QuorumRecord::need`) of its `backups`, given
/// what it heard since (`Primary::heard_since_restart`: `clear` distinct backups hold
/// nothing above the point, `holding_more` do, or may): `Ok` once `need` are clear and
/// none holds more; else why not yet. A backup holding more keeps it (it may have been
/// acknowledged, and it is not on this primary): the reason names it and what a person
/// can do. Pure, for tests.
pub fn restart_settled(
    need: usize,
    backups: usize,
    old: Epoch,
    point: Ts,
    clear: usize,
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
    if clear >= need {
        return Ok(());
    }
    Err(format!(
        "this primary restarted at ts {} of epoch {} and takes no writes until {} more of its {backups} backup(s) say they hold nothing above it (a commit acknowledged before the restart may be on backups alone)",
        point.0,
        old.0,
        need - clear,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> CommitPolicy {
        CommitPolicy::parse(s).unwrap()
    }

    #[test]
    fn a_record_round_trips_and_a_damaged_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(QuorumRecord::read(dir.path()).unwrap(), None);
        let mut r = QuorumRecord::new(2, p("majority-durable"));
        assert!(r.add_policy(p("majority-received")));
        assert!(!r.add_policy(p("majority-received")));
        r.write(dir.path()).unwrap();
        assert_eq!(QuorumRecord::read(dir.path()).unwrap(), Some(r.clone()));
        let good = std::fs::read(dir.path().join(QUORUM_FILE)).unwrap();
        for cut in 0..good.len() {
            std::fs::write(dir.path().join(QUORUM_FILE), &good[..cut]).unwrap();
            match QuorumRecord::read(dir.path()) {
                Err(e) => assert!(e.to_string().contains(QUORUM_FILE), "{e}"),
                Ok(got) => assert!(got.is_some_and(|g| g != r) || cut >= good.len() - 1, "cut at {cut}"),
            }
        }
        std::fs::write(dir.path().join(QUORUM_FILE), "ditto quorum 1\nslots 1\npolicies sometimes\n").unwrap();
        assert!(QuorumRecord::read(dir.path()).is_err());
    }

    #[test]
    fn what_a_restart_waits_for_is_the_most_any_policy_in_use_needs() {
        // majority-durable with one backup: the primary's fsync was always needed.
        assert_eq!(QuorumRecord::new(1, p("majority-durable")).need(), 0);
        assert!(!QuorumRecord::new(1, p("majority-durable")).backups_release());
        // ... but a second backup in the quorum, or a connection's majority-received:
        assert_eq!(QuorumRecord::new(2, p("majority-durable")).need(), 1);
        let mut r = QuorumRecord::new(1, p("local"));
        assert_eq!(r.need(), 0);
        r.add_policy(p("majority-received"));
        assert_eq!(r.need(), 1);
        assert_eq!(QuorumRecord::new(2, p("majority-received")).need(), 2);
        let m = QuorumRecord::new(1, p("majority-durable")).merged(&QuorumRecord::new(2, p("local")));
        assert_eq!((m.slots, m.need()), (2, 1));
    }

    #[test]
    fn a_restarted_primary_takes_writes_once_enough_backups_are_clear_and_none_holds_more() {
        let (old, point) = (Epoch(3), Ts(100));
        let why = restart_settled(2, 2, old, point, 1, &[]).unwrap_err();
        assert!(why.contains("until 1 more of its 2 backup(s)"), "{why}");
        assert_eq!(restart_settled(2, 2, old, point, 2, &[]), Ok(()));
        assert_eq!(restart_settled(0, 1, old, point, 0, &[]), Ok(()));
        let more = [("b2".to_string(), old, Ts(130))];
        let why = restart_settled(1, 2, old, point, 2, &more).unwrap_err();
        assert!(why.contains("backup b2 holds commits up to ts 130 of epoch 3") && why.contains("--promote"), "{why}");
        let older = [("b3".to_string(), Epoch(2), Ts(90))];
        let why = restart_settled(1, 2, old, point, 2, &older).unwrap_err();
        assert!(why.contains("backup b3 follows epoch 2, older"), "{why}");
    }
}
