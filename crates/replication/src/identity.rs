//! Database ids and primary runs between nodes
//! ===========================================
//! A data directory names the database whose history it holds (`ditto_log::identity`,
//! re-exported here); a primary says its id in every `Welcome` and each run of a primary
//! its own run id; a backup says what it holds in its `Hello`. `check`, `refusal` and
//! `check_run` decide, on either side, that a backup takes nothing from a primary of
//! another database, or of another run of the epoch it follows (docs/replication.md,
//! "Protocol").

use std::path::Path;

use ditto_log::storage::Storage;
use ditto_log::Epoch;

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

/// A record of an epoch and the primary run that served it (0: not recorded), one line:
/// `epoch N`, or `epoch N run R` (R in 16 hex digits, not 0). A backup's `REPLICA_STATE`
/// (the epoch it follows) and a directory's `EPOCH_RUN` (`EPOCH_RUN_FILE`) are such
/// records. `None`: no file. A record that cannot be read, or does not parse, is an
/// error: read as none, a backup asked its primary for a copy and set aside what it held,
/// commits a restarted primary lost included (before 2026-12-05; found by a review).
pub fn read_epoch_run(path: &Path) -> std::io::Result<Option<(Epoch, u64)>> {
    let s = match std::fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(std::io::Error::new(e.kind(), format!("reading {}: {e}", path.display()))),
    };
    let parsed = s.trim().strip_prefix("epoch ").and_then(|rest| match rest.split_once(" run ") {
        None => Some((Epoch(rest.parse().ok()?), 0)),
        Some((e, r)) if r.len() == 16 => {
            Some((Epoch(e.parse().ok()?), u64::from_str_radix(r, 16).ok().filter(|&r| r != 0)?))
        }
        Some(_) => None,
    });
    match parsed {
        Some(f) => Ok(Some(f)),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            // (Its first 64 characters, not bytes: a cut inside a character panicked.)
            format!(
                "{} does not hold `epoch N` or `epoch N run R` (it holds {:?}): damaged",
                path.display(),
                s.chars().take(64).collect::<String>()
            ),
        )),
    }
}

/// Writes `read_epoch_run`'s record `file` in `dir`, durably (the log's
/// `write_atomically`: after a crash the old record or the new one).
pub fn write_epoch_run(dir: &Path, file: &str, e: Epoch, run: u64, storage: &dyn Storage) -> std::io::Result<()> {
    let line = match run {
        0 => format!("epoch {}\n", e.0),
        r => format!("epoch {} run {r:016x}\n", e.0),
    };
    ditto_log::catalog::write_atomically(dir, file, line.as_bytes(), storage)
}

/// The record of the last epoch a directory served as a primary, and its run; or, where a
/// backup's directory was promoted, the epoch it followed and that epoch's run (kept
/// from its `REPLICA_STATE`, which the promotion removes). A primary that opens the next
/// epoch from that one knows so which run served it, and a backup of that epoch number
/// in another run is another history (`check_run`): refused, not resumed or cut into
/// this one's (docs/replication.md, "Protocol"). Written by `Primary::start` before any
/// backup is welcomed.
pub const EPOCH_RUN_FILE: &str = "EPOCH_RUN";

/// The run that served epoch `epoch`, as `dir`'s `EPOCH_RUN` records it (0: not recorded,
/// another epoch recorded, or no record).
pub fn run_of(dir: &Path, epoch: Epoch) -> std::io::Result<u64> {
    Ok(read_epoch_run(&dir.join(EPOCH_RUN_FILE))?.filter(|&(e, _)| e == epoch).map_or(0, |(_, r)| r))
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

    /// A directory's `EPOCH_RUN` names the run of one epoch only; a promotion keeps the
    /// followed epoch's run there as its record of following goes; a damaged record is an
    /// error, not "none".
    #[test]
    fn the_run_of_an_epoch_is_kept_through_a_promotion_and_read_for_that_epoch_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert_eq!(run_of(dir, Epoch(4)).unwrap(), 0, "no record");
        write_epoch_run(dir, EPOCH_RUN_FILE, Epoch(4), 0xabc, &ditto_log::storage::RealStorage).unwrap();
        assert_eq!(run_of(dir, Epoch(4)).unwrap(), 0xabc);
        assert_eq!(run_of(dir, Epoch(5)).unwrap(), 0, "another epoch's record");
        // A backup's record of the epoch it followed, then its promotion's end.
        std::fs::write(dir.join("REPLICA_STATE"), "epoch 9 run 00000000000000ff\n").unwrap();
        crate::backup::end_promotion(dir).unwrap();
        assert!(!dir.join("REPLICA_STATE").exists(), "the followed epoch went");
        assert_eq!(run_of(dir, Epoch(9)).unwrap(), 0xff, "its run was kept");
        assert_eq!(run_of(dir, Epoch(4)).unwrap(), 0, "replaced");
        // A followed epoch without a run (an older build's) leaves the record as it was.
        std::fs::write(dir.join("REPLICA_STATE"), "epoch 10\n").unwrap();
        crate::backup::forget_followed(dir).unwrap();
        assert!(!dir.join("REPLICA_STATE").exists());
        assert_eq!(run_of(dir, Epoch(9)).unwrap(), 0xff);
        std::fs::write(dir.join(EPOCH_RUN_FILE), "epoch 9 run ff\n").unwrap();
        let e = run_of(dir, Epoch(9)).unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
    }

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
