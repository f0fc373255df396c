//! Database ids and primary runs between nodes
//! ===========================================
//! A data directory names the database whose history it holds (`ditto_log::identity`,
//! re-exported here); a primary says its id in every `Welcome` and each run of a primary
//! its own run id; a backup says what it holds in its `Hello`. `check`, `refusal` and
//! `check_run` decide, on either side, that a backup takes nothing from a primary of
//! another database, or of another run of the epoch it follows (docs/replication.md,
//! "Protocol").

use std::path::Path;

pub use ditto_log::identity::{read, write, DatabaseId, DATABASE_ID_FILE};

/// What a backup whose directory `dir` holds `mine` does with a `Welcome` of `theirs`
/// from the primary at `primary`: `Ok(true)`, write `theirs` before taking anything
/// (it holds none, or the primary said none: a peer of a test); `Ok(false)`, nothing to
/// write; `Err`, the refusal's reason: the two histories are not one, so neither a resume
/// nor a copy (which would discard what it holds) is taken.
pub fn check(mine: Option<DatabaseId>, theirs: Option<DatabaseId>, dir: &Path, primary: &str) -> Result<bool, String> {
    match (mine, theirs) {
        (_, None) => Ok(false),
        (None, Some(_)) => Ok(true),
        (Some(m), Some(t)) if m == t => Ok(false),
        (Some(m), Some(t)) => Err(refusal(
            &format!("this backup's directory {}", dir.display()),
            m,
            &format!("the primary at {primary}"),
            t,
        )),
    }
}

/// Why a backup whose directory (`holder`) holds database `held` takes nothing from a
/// primary (`primary`) that serves `served`, and what a person may do.
pub fn refusal(holder: &str, held: DatabaseId, primary: &str, served: DatabaseId) -> String {
    format!(
        "{OTHER_DATABASE}: {holder} holds database {held} and {primary} serves database {served}: it was never that primary's backup, or the primary's directory was made anew; it takes nothing from it (no resume, no copy) and keeps what it holds. Point it at the primary whose data it holds, or empty its directory to copy this primary's; only if the two do hold one history (a directory whose {DATABASE_ID_FILE} file was lost and made anew, or two made by this build over data an older build wrote) copy the primary's {DATABASE_ID_FILE} file into the backup's directory"
    )
}

/// Whether a backup that follows epoch `epoch` as served by the primary run `mine`
/// (`Primary::run`, said in its `Welcome`; 0: not recorded) may take from a primary that
/// serves that same epoch number in run `theirs`. A primary serves an epoch in one run only
/// (a restarted primary opens a new epoch, and so does each failover and promotion), so two
/// runs of one epoch number are two histories: a copy of a data directory served as a
/// primary beside its original opens the same next epoch its original does. Refused, the
/// backup takes nothing and keeps what it holds. (Before, only the primary's clock told
/// the two apart, where the backup held more than the copy had stamped.)
pub fn check_run(epoch: u64, mine: u64, theirs: u64, holder: &str, primary: &str) -> Result<(), String> {
    match mine == 0 || theirs == 0 || mine == theirs {
        true => Ok(()),
        false => Err(format!(
            "{OTHER_DATABASE}'s history: {holder} holds epoch {epoch} as served by the primary run {mine:016x}, and {primary} serves epoch {epoch} in run {theirs:016x}: two primaries served the same epoch number (a copy of a data directory served as a primary beside its original?), so their histories differ; it takes nothing from it (no resume, no copy) and keeps what it holds. Point it at the primary it followed, or empty its directory to copy this primary's"
        )),
    }
}

/// What a backup does with a primary's `Welcome` of epoch `epoch`, database `database` and
/// run `run` (0: none said), holding `mine` and following `followed`, the epoch it follows
/// and the run that served it (0 where not known, or not to be checked: a fresh copy's):
/// `check`, then, for the epoch it follows, `check_run`. `Ok(Some(id))`: write `id` before
/// taking anything; `Ok(None)`: nothing to write; `Err`: the refusal's reason.
pub fn check_welcome(
    mine: Option<DatabaseId>,
    followed: Option<(u64, u64)>,
    epoch: u64,
    database: u64,
    run: u64,
    dir: &Path,
    primary: &str,
) -> Result<Option<DatabaseId>, String> {
    let theirs = DatabaseId::from_wire(database);
    let adopt = check(mine, theirs, dir, primary)?;
    if let Some((_, followed_run)) = followed.filter(|&(e, _)| e == epoch) {
        let holder = format!("this backup's directory {}", dir.display());
        check_run(epoch, followed_run, run, &holder, &format!("the primary at {primary}"))?;
    }
    Ok(theirs.filter(|_| adopt))
}

/// How a refusal for another database's primary begins (`check`).
pub const OTHER_DATABASE: &str = "the primary serves another database";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_takes_from_another_run_of_its_epoch_only_where_a_run_is_unknown() {
        assert_eq!(check_run(3, 7, 7, "d", "p"), Ok(()));
        assert_eq!(check_run(3, 0, 7, "d", "p"), Ok(()), "not recorded: an older build's record");
        assert_eq!(check_run(3, 7, 0, "d", "p"), Ok(()), "not said");
        let e = check_run(3, 7, 8, "this backup's directory /d", "the primary at p:1").unwrap_err();
        assert!(e.starts_with(OTHER_DATABASE), "{e}");
        assert!(e.contains("0000000000000007") && e.contains("0000000000000008") && e.contains("epoch 3"), "{e}");
    }

    #[test]
    fn a_welcome_is_checked_for_its_database_then_for_the_followed_epochs_run() {
        let (a, b) = (DatabaseId::new_random(), DatabaseId::new_random());
        let dir = Path::new("/d");
        assert_eq!(check_welcome(None, None, 2, a.to_wire(), 9, dir, "p"), Ok(Some(a)));
        assert_eq!(check_welcome(Some(a), Some((2, 9)), 2, a.to_wire(), 9, dir, "p"), Ok(None));
        assert_eq!(check_welcome(Some(a), Some((1, 9)), 2, a.to_wire(), 8, dir, "p"), Ok(None), "another epoch");
        assert_eq!(check_welcome(Some(a), Some((2, 0)), 2, a.to_wire(), 8, dir, "p"), Ok(None), "no run known");
        let e = check_welcome(Some(a), Some((2, 9)), 2, a.to_wire(), 8, dir, "p").unwrap_err();
        assert!(e.contains("two primaries served the same epoch number"), "{e}");
        let e = check_welcome(Some(a), Some((2, 9)), 2, b.to_wire(), 9, dir, "p").unwrap_err();
        assert!(e.contains(&b.to_string()), "{e}");
    }

    #[test]
    fn a_backup_takes_an_id_only_where_it_holds_none_or_the_same() {
        let (a, b) = (DatabaseId::new_random(), DatabaseId::new_random());
        let dir = Path::new("/d");
        assert_eq!(check(None, Some(a), dir, "p"), Ok(true));
        assert_eq!(check(Some(a), Some(a), dir, "p"), Ok(false));
        assert_eq!(check(Some(a), None, dir, "p"), Ok(false));
        assert_eq!(check(None, None, dir, "p"), Ok(false));
        let e = check(Some(a), Some(b), dir, "p:1").unwrap_err();
        assert!(e.starts_with(OTHER_DATABASE), "{e}");
        assert!(e.contains(&a.to_string()) && e.contains(&b.to_string()) && e.contains("p:1"), "{e}");
    }
}
