//! Commit policies: when a commit may be released to its client
//! ============================================================
//! A commit is released once the *release watermark* covers its timestamp. Each node that
//! counts contributes a watermark (every commit at or below it is held there), itself the
//! minimum over the primary's streams (Rolis 3.4: a later commit on one stream is never
//! released before an earlier one on another); the policy picks which nodes count:
//!
//! | policy | released when | survives |
//! |---|---|---|
//! | `local` | durable on the primary (shipped in the background) | the primary's crash and restart; not the loss of its disk (1-safe) |
//! | `majority-durable` | durable on a majority of the nodes (primary included) | the loss of any minority of nodes |
//! | `majority-received` | in memory on a majority, durable on the primary... not waited for | the loss of any minority, unless every node holding it crashes before its fsync |
//! | `all-durable` | durable on every node | the loss of all but one node |
//! | `all-received` | in memory on every node | as majority-received, for all but one node |
//!
//! `received` counts a backup once the batch is in its memory (its own fsync follows in the
//! background, PostgreSQL's `synchronous_commit = remote_write`); the primary counts with
//! what it has framed and shipped, so no fsync is on the commit path at all. With no
//! backup connected, `majority` of a single node is the primary alone; `all` counts every
//! live link the quorum counts (a member's, not a learner's), at least as many as are
//! configured (a missing one
//! blocks releases, and says so; an extra one that joins counts too, and holds releases
//! back while its copy is sent).

use ditto_engine::Ts;

/// How many nodes must hold a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Local,
    Majority,
    All,
}

/// How a counted node holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// In memory (received; fsync in the background).
    Received,
    /// fsynced.
    Durable,
}

/// A commit policy (see the module notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitPolicy {
    pub scope: Scope,
    pub level: Level,
}

impl CommitPolicy {
    pub const LOCAL: CommitPolicy = CommitPolicy { scope: Scope::Local, level: Level::Durable };

    /// `local`, `majority`, `all`, each optionally `-durable` (the default) or `-received`.
    pub fn parse(s: &str) -> Result<CommitPolicy, String> {
        let s = s.trim().to_ascii_lowercase();
        let (scope, level) = match s.split_once('-') {
            Some((a, b)) => (a.to_string(), Some(b.to_string())),
            None => (s.clone(), None),
        };
        let scope = match scope.as_str() {
            "local" => Scope::Local,
            "majority" => Scope::Majority,
            "all" => Scope::All,
            _ => return Err(format!("unknown commit policy '{s}' (local, majority, all, with -durable or -received)")),
        };
        let level = match level.as_deref() {
            None | Some("durable") => Level::Durable,
            Some("received") if scope != Scope::Local => Level::Received,
            _ => return Err(format!("unknown commit policy '{s}' (local, majority, all, with -durable or -received)")),
        };
        Ok(CommitPolicy { scope, level })
    }

    /// How many of `nodes` (the primary and the backups counted) hold a commit before it
    /// is released: one under `local` (the primary), a majority, or all.
    pub fn quorum(&self, nodes: usize) -> usize {
        match self.scope {
            Scope::Local => 1,
            Scope::Majority => nodes / 2 + 1,
            Scope::All => nodes,
        }
    }

    pub fn name(&self) -> String {
        match (self.scope, self.level) {
            (Scope::Local, _) => "local".into(),
            (Scope::Majority, Level::Durable) => "majority-durable".into(),
            (Scope::Majority, Level::Received) => "majority-received".into(),
            (Scope::All, Level::Durable) => "all-durable".into(),
            (Scope::All, Level::Received) => "all-received".into(),
        }
    }

    /// The stronger of two policies (a transaction may ask for more than the default).
    pub fn max(self, o: CommitPolicy) -> CommitPolicy {
        let rank = |s: Scope| match s {
            Scope::Local => 0,
            Scope::Majority => 1,
            Scope::All => 2,
        };
        CommitPolicy {
            scope: if rank(o.scope) > rank(self.scope) { o.scope } else { self.scope },
            level: if o.level == Level::Durable || self.level == Level::Durable {
                Level::Durable
            } else {
                Level::Received
            },
        }
    }
}

/// What each node holds, as watermarks: the primary's own, and one per backup that is
/// configured (`None`: not connected now).
#[derive(Clone, Debug, Default)]
pub struct Holdings {
    /// Durable on the primary's disk.
    pub primary_durable: Ts,
    /// Framed and shipped by the primary (in its memory).
    pub primary_shipped: Ts,
    /// Per backup: (received, durable).
    pub backups: Vec<Option<(Ts, Ts)>>,
}

/// The release watermark under `policy`: the largest ts that the policy's quorum holds.
/// Pure, so tests can drive it step by step.
pub fn release_watermark(policy: CommitPolicy, h: &Holdings) -> Ts {
    let mine = match policy.level {
        Level::Durable => h.primary_durable,
        // The primary's memory holds everything it shipped; never more than the backups
        // received, which is what the quorum decides on.
        Level::Received => h.primary_shipped.max(h.primary_durable),
    };
    // With no backup counted, the primary is the whole quorum, and a `received` policy
    // is held to `local`: a reply never promises less than this node's disk (the memory
    // of one node survives no crash of it).
    if policy.scope == Scope::Local || h.backups.is_empty() {
        return h.primary_durable;
    }
    let mut held: Vec<Ts> = vec![mine];
    held.extend(h.backups.iter().map(|b| match (b, policy.level) {
        (None, _) => Ts::ZERO,
        (Some((r, _)), Level::Received) => *r,
        (Some((_, d)), Level::Durable) => *d,
    }));
    let need = policy.quorum(held.len());
    // The need-th largest: at least `need` nodes hold everything up to it.
    held.sort_unstable_by(|a, b| b.cmp(a));
    held[need - 1]
}

/// Up to where a membership change counts as settled under `policy`: where a majority of
/// the counted nodes holds everything, at the policy's level (under `local`, its own
/// release). A majority is what the next change needs (two majorities of configurations
/// one change apart overlap), and all that may be had under `all` with a member down,
/// whose removal waits for the settle.
pub fn settle_watermark(policy: CommitPolicy, h: &Holdings) -> Ts {
    match policy.scope {
        Scope::Local => release_watermark(policy, h),
        _ => release_watermark(CommitPolicy { scope: Scope::Majority, level: policy.level }, h),
    }
}

/// Why `policy` cannot release anything more while `h` holds (a counted backup is not
/// connected), for `INFO replication` and the logs; `None` if nothing is missing.
pub fn blocked_by(policy: CommitPolicy, h: &Holdings) -> Option<String> {
    let missing: Vec<usize> = h.backups.iter().enumerate().filter(|(_, b)| b.is_none()).map(|(i, _)| i).collect();
    let nodes = 1 + h.backups.len();
    let connected = nodes - missing.len();
    match policy.scope {
        Scope::Local => None,
        Scope::All => {
            missing.first().map(|i| format!("backup slot {i} is not connected ({} counts every backup)", policy.name()))
        }
        Scope::Majority if connected < policy.quorum(nodes) => {
            Some(format!("{connected} of {nodes} nodes connected; {} needs {}", policy.name(), policy.quorum(nodes)))
        }
        Scope::Majority => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(p: u64, backups: &[Option<(u64, u64)>]) -> Holdings {
        Holdings {
            primary_durable: Ts(p),
            primary_shipped: Ts(p + 100),
            backups: backups.iter().map(|b| b.map(|(r, d)| (Ts(r), Ts(d)))).collect(),
        }
    }

    #[test]
    fn names_parse_back() {
        for s in ["local", "majority-durable", "majority-received", "all-durable", "all-received"] {
            assert_eq!(CommitPolicy::parse(s).unwrap().name(), s);
        }
        assert_eq!(CommitPolicy::parse("majority").unwrap().name(), "majority-durable");
        assert!(CommitPolicy::parse("local-received").is_err());
        assert!(CommitPolicy::parse("most").is_err());
    }

    #[test]
    fn quorums_pick_the_right_node() {
        let p = |s| CommitPolicy::parse(s).unwrap();
        // Primary durable at 10; backups (received, durable): (30, 20), (5, 4).
        let x = h(10, &[Some((30, 20)), Some((5, 4))]);
        assert_eq!(release_watermark(p("local"), &x), Ts(10));
        assert_eq!(release_watermark(p("majority-durable"), &x), Ts(10), "2 of 3: primary and the first backup");
        assert_eq!(release_watermark(p("majority-received"), &x), Ts(30));
        assert_eq!(release_watermark(p("all-durable"), &x), Ts(4));
        assert_eq!(release_watermark(p("all-received"), &x), Ts(5));
        // A missing backup blocks `all`; `majority` of 3 goes on with 2.
        let y = h(10, &[Some((30, 20)), None]);
        assert_eq!(release_watermark(p("all-durable"), &y), Ts(0));
        assert_eq!(release_watermark(p("majority-durable"), &y), Ts(10));
        // One backup: majority of 2 is both.
        let z = h(10, &[Some((8, 7))]);
        assert_eq!(release_watermark(p("majority-durable"), &z), Ts(7));
        assert_eq!(release_watermark(p("majority-received"), &z), Ts(8));
        // No backup configured: everything is the primary's.
        assert_eq!(release_watermark(p("all-durable"), &h(10, &[])), Ts(10));
        // ... a `received` policy too, held to this node's disk, not its memory (it framed
        // up to 110 here): the primary alone is no quorum of memories.
        for name in ["all-received", "majority-received"] {
            assert_eq!(release_watermark(p(name), &h(10, &[])), Ts(10), "{name}");
        }
    }

    #[test]
    fn a_missing_backup_is_named_where_it_blocks() {
        let p = |s| CommitPolicy::parse(s).unwrap();
        let two_one_down = h(10, &[Some((30, 20)), None]);
        let all = blocked_by(p("all-durable"), &two_one_down).unwrap();
        assert!(all.contains("backup slot 1 is not connected"), "{all}");
        assert_eq!(blocked_by(p("majority-durable"), &two_one_down), None, "2 of 3 is a majority");
        let one_down = h(10, &[None]);
        let maj = blocked_by(p("majority-received"), &one_down).unwrap();
        assert!(maj.contains("1 of 2 nodes connected; majority-received needs 2"), "{maj}");
        assert_eq!(blocked_by(p("local"), &one_down), None);
        assert_eq!(blocked_by(p("all-durable"), &h(10, &[Some((1, 1))])), None);
    }

    #[test]
    fn the_stronger_policy_wins() {
        let p = |s| CommitPolicy::parse(s).unwrap();
        assert_eq!(p("majority-received").max(p("all-received")), p("all-received"));
        assert_eq!(p("majority-received").max(p("local")), p("majority-durable"));
    }

    /// What the primary shipped never decides a release, as long as no backup received
    /// more than was shipped (a backup receives only shipped batches, but for a start from
    /// a checkpoint). (The shipping tap recomputes after each batch all the same:
    /// `primary::Tap::batch` says why.) Every policy's release is the same with the
    /// primary's shipped watermark at the highest receipt as with it anywhere above, over
    /// 20,000 random holdings of 0-4 backups, some missing.
    #[test]
    fn shipping_alone_never_moves_a_release() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let policies: Vec<CommitPolicy> =
            ["local", "majority-durable", "majority-received", "all-durable", "all-received"]
                .into_iter()
                .map(|s| CommitPolicy::parse(s).unwrap())
                .collect();
        for _ in 0..20_000 {
            let backups: Vec<Option<(Ts, Ts)>> = (0..next(5))
                .map(|_| {
                    (next(4) != 0).then(|| {
                        let r = next(50);
                        (Ts(r), Ts(r - next(r + 1)))
                    })
                })
                .collect();
            let top = backups.iter().flatten().map(|b| b.0).max().unwrap_or(Ts::ZERO);
            let low = Holdings { primary_durable: Ts(next(60)), primary_shipped: top, backups };
            for policy in &policies {
                let base = release_watermark(*policy, &low);
                for more in [1, 7, 100] {
                    let higher = Holdings { primary_shipped: Ts(top.0 + more), ..low.clone() };
                    assert_eq!(
                        release_watermark(*policy, &higher),
                        base,
                        "{} with {low:?}, shipped +{more}",
                        policy.name()
                    );
                    assert_eq!(settle_watermark(*policy, &higher), settle_watermark(*policy, &low));
                }
            }
        }
    }
}
