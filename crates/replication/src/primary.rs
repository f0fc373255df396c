//! The primary's side: shipping batches to backups, collecting acknowledgements
//! ==========================================================================
//! ```text
//!  flusher[w] --tap.batch (framed, before its write)--> every link's queue (bounded bytes)
//!  link sender thread:  [Welcome, checkpoint files | gap batches read back from disk] then queue -> TCP
//!  link reader thread:  Ack{received, durable, replayed} -> Holdings -> on_change (the server releases)
//! ```
//! Invariants: the tap never blocks a flusher (a link whose queue passes
//! `queue_bytes_max` is dropped, and the backup resumes from disk; one whose start is
//! still being sent stops queueing instead, and is sent what it missed from disk after its
//! start, `Queue::spilled`); a link's frames go out
//! in tap order, after everything of its start (checkpoint or gap), so floors stay true on
//! the backup (crates/log/src/replica.rs); a backup's watermarks only count while its link
//! is up, and only grow within a link.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ditto_engine::{TableId, Ts};
use ditto_log::format::BatchHeader;
use ditto_log::replica::Gap;
use ditto_log::{Durable, Epoch};
use parking_lot::{Condvar, Mutex};

use crate::policy::Holdings;
use crate::protocol::{read_frame_at_most, Frame, Start, PROTOCOL_VERSION};
use crate::tls::Until;
use crate::unhelloed::{HelloSlot, Unhelloed};
use crate::watermark::Prefix;

/// How the primary ships.
#[derive(Clone, Debug)]
pub struct PrimaryOptions {
    /// Backups the quorum counts (a missing one counts as holding nothing); more may connect.
    /// A cluster changes it as members come and go (`Primary::set_backups_expected`).
    pub backups_expected: usize,
    /// The cluster's membership configuration that `backups_expected` counts (reported
    /// back as settled, `Primary::members_settled`).
    pub members_config: u64,
    /// A backup further behind than this many bytes of queued frames is dropped (it resumes
    /// from the log on disk): the primary's memory stays bounded whatever a backup does.
    pub queue_bytes_max: usize,
    /// How long a write to a backup may wait while its start (a checkpoint copy, the log
    /// from disk) is sent: one that reads nothing for so long is given up. (Its queue
    /// spills meanwhile rather than kill the link, `Queue::spilled`, so nothing else
    /// would; once live, the queue's bound does.)
    pub start_stall_max: Duration,
    /// How often a link that has shipped lately sends the release watermark when nothing
    /// else is sent; a link idle for `LINK_DOZE_AFTER` dozes, sending it when it moves
    /// (`set_released`) and otherwise every `IDLE_HEARTBEAT`.
    pub heartbeat: Duration,
    /// A live link whose backup acknowledges nothing for this long is ended (the backup
    /// resumes from what it holds when it connects again). A backup acknowledges every
    /// burst it reads, the idle heartbeats included (`IDLE_HEARTBEAT`), so only a backup
    /// gone without closing its connection (a power loss, a cut network) or stuck stays
    /// silent; past this, until it is ended, only what it made durable counts in the quorum
    /// (`Link::counted_holdings`).
    pub ack_silence_max: Duration,
    /// A cluster's new primary: `(e, p, start)` when this epoch opened from epoch `e` cut
    /// at `p`, its log starting above `start` (docs/cluster.md; nothing lies between `p`
    /// and `start`). A backup of epoch `e` that holds exactly `p` then holds what this
    /// primary started from, and resumes from the log rather than copying a checkpoint.
    pub resume_from: Option<(Epoch, Ts, Ts)>,
    /// The highest release of any commit policy its server offers (kept by the server,
    /// which releases each policy's commits; `None`: the release watermark is all there
    /// is), shipped in heartbeats (`Frame::Heartbeat::acknowledged`).
    pub acknowledged: Option<Arc<AtomicU64>>,
    /// The server's own commit policy (`None`: nothing is released on backups'
    /// acknowledgements but what `backups_may_release` adds). With the quorum's slots, it
    /// says whether backups alone may release a commit: every batch is then shipped
    /// `counted` (`Frame::Batch`).
    pub policy: Option<crate::CommitPolicy>,
    /// A standalone server's primary: its data directory, where the quorum's record is
    /// kept (`crate::restart`), and the record to start from (the last run's, merged with
    /// this one's, while a restart waits). `None` (a cluster's, a test's): kept in memory.
    pub quorum_record: Option<(std::path::PathBuf, crate::restart::QuorumRecord)>,
    /// This primary restarted and waits for its backups (`crate::restart`): until
    /// `settle_restart`, a backup of an older epoch than `resume_from`'s that holds
    /// anything is refused rather than sent a copy (it may hold what an earlier restart
    /// lost).
    pub restart_wait: bool,
    /// The runtime that reads backups' acknowledgements (a server's, whose connections
    /// wait for the releases they bring: they are woken on the thread that read the ack);
    /// `None`: a thread per backup.
    pub acks_on: Option<tokio::runtime::Handle>,
    /// The password a backup must give in its `Hello` (a server's `requirepass`: its
    /// clients need it, and a backup receives everything they could read); `None`: any
    /// backup that reaches the port is served.
    pub password: Option<crate::protocol::Secret>,
    /// Other passwords a backup may give, while a cluster's secret is rotated (the backup
    /// shows one of them, or `password`).
    pub also_accepted: Vec<crate::protocol::Secret>,
    /// TLS on the replication port (`tls_replication`): every backup must open with a TLS
    /// handshake and show a certificate the CA signed. `None`: plaintext.
    pub tls: Option<Arc<crate::tls::LinkTls>>,
    /// A cluster primary's: every link sends a heartbeat at least this often, busy or idle
    /// (`LEASE_HEARTBEAT`), so that its backups' acks echo a recent send time and its lease
    /// (`BackupInfo::lease_ago`) stays fresh. `None`: idle links beat every
    /// `IDLE_HEARTBEAT`, and may doze until then.
    pub lease_beat: Option<Duration>,
}

impl Default for PrimaryOptions {
    fn default() -> Self {
        PrimaryOptions {
            backups_expected: 0,
            members_config: 0,
            queue_bytes_max: 256 << 20,
            start_stall_max: Duration::from_secs(60),
            heartbeat: Duration::from_millis(1),
            ack_silence_max: ACK_SILENCE_MAX,
            resume_from: None,
            acknowledged: None,
            policy: None,
            quorum_record: None,
            restart_wait: false,
            acks_on: None,
            password: None,
            also_accepted: Vec::new(),
            tls: None,
            lease_beat: None,
        }
    }
}

/// What the server sees of one backup.
#[derive(Clone, Debug)]
pub struct BackupInfo {
    pub node: String,
    pub addr: String,
    /// A learner (its acknowledgements count in no quorum).
    pub learner: bool,
    pub received: Ts,
    pub durable: Ts,
    pub replayed: Ts,
    pub queued_bytes: usize,
    pub connected_for: Duration,
    /// How long the oldest commit shipped and not yet received, durable, replayed there
    /// has waited (zero when it holds everything shipped): PostgreSQL's write, flush and
    /// replay lag, measured on the primary's own clock, so no clock sync is assumed.
    pub received_lag: Duration,
    pub durable_lag: Duration,
    pub replay_lag: Duration,
    /// How long ago its last acknowledgement arrived (a cluster's failure detector).
    pub heard_ago: Duration,
    /// How long ago this primary sent the newest heartbeat the backup's acks echo
    /// (`Ack::echo_us`; `Duration::MAX`: none yet): what a cluster primary's lease stands
    /// on. Never less than the time since its newest ack was sent, however long that ack
    /// took to arrive, for a backup that echoes what it was sent (an echo from later than
    /// now is taken as now: a backup that echoes made-up times can keep its lease fresh).
    pub lease_ago: Duration,
    /// Where its start is, in Redis's words where they fit: `wait_bgsave` (registered, a
    /// checkpoint being written for it), `send_bulk` (a checkpoint copy or a gap from disk
    /// being sent), `catch_up` (the log its queue could not hold meanwhile, from disk,
    /// `Queue::spilled`), `online` (live).
    pub state: &'static str,
    /// The checkpoint copy being sent or last sent on this link: bytes sent, of its files'
    /// total (both 0 when none).
    pub copy_sent_bytes: u64,
    pub copy_total_bytes: u64,
}

/// `Link::phase`'s values, named as `BackupInfo::state` gives them.
const PHASES: [&str; 4] = ["wait_bgsave", "send_bulk", "catch_up", "online"];
const PHASE_SENDING: u8 = 1;
const PHASE_CATCHING_UP: u8 = 2;
const PHASE_ONLINE: u8 = 3;

struct Link {
    node: String,
    addr: String,
    /// Its number among the live links of its kind (a learner's are numbered apart); the
    /// quorum's record keeps a bound on it (`crate::restart`). Not its place in
    /// `Primary::holdings`, which lists the live counted links.
    slot: usize,
    /// Killed (`kill`): it counts in no quorum from then on, and its slot is free, though
    /// its thread may not have taken it out of the list yet (a registration wait, a
    /// checkpoint being written, its ack reader's end).
    gone: AtomicBool,
    learner: bool,
    /// Its backup counts in the quorum: not a learner's, and of a member
    /// (`set_counted_nodes`). Set when it registers and when the members change, so that
    /// `holdings`, on the commit path, takes no other lock than the links'.
    counted: AtomicBool,
    queue: Mutex<Queue>,
    cv: Condvar,
    received: AtomicU64,
    durable: AtomicU64,
    replayed: AtomicU64,
    since: Instant,
    /// Its thread dozes (`Primary::serve_link`); set and cleared under `queue`'s lock.
    dozing: AtomicBool,
    /// Microseconds after `since` when a frame was last sent on its socket by another
    /// thread (`push_to`, at once): its thread does not doze while that goes on.
    sent_directly_us: AtomicU64,
    /// The connection (a clone): `kill` shuts it down, so that a thread writing to it or
    /// reading its acknowledgements ends at once, and `name_taken` looks whether the backup
    /// closed it.
    sock: Option<TcpStream>,
    /// Microseconds after `since` when the last acknowledgement arrived (`NEVER_ACKED`
    /// before the first).
    heard_us: AtomicU64,
    /// The newest heartbeat time (`Primary::now_us`) an ack of this link echoed (0: none).
    lease_us: AtomicU64,
    /// Where the log this link is sent starts (what the backup said it holds, or the
    /// checkpoint it is sent), set before the log is read (`NOTHING_ASKED` before): until
    /// its first ack, the log above it is kept for it (`log_needed_above`), so that a
    /// checkpoint while a long gap is sent deletes none of it.
    asked_from: AtomicU64,
    /// Where its start is (`PHASES`): set to `PHASE_ONLINE` under the queue's lock, so
    /// that a queue passing its bound before then spills (`Queue::spilled`) instead of
    /// killing the link (`Link::starting`).
    phase: std::sync::atomic::AtomicU8,
    /// Its checkpoint copy's bytes sent and total (`BackupInfo`).
    copy_sent: AtomicU64,
    copy_total: AtomicU64,
}

impl Link {
    /// What its backup acknowledged holding, as a quorum may count it: (received,
    /// durable); from a backup silent for longer than `silence_max` (no acknowledgement),
    /// only what it made durable: its memory may be gone (a power loss, without a FIN), and
    /// its link's thread, which ends such a link, may be blocked writing to it (a full
    /// socket: then only TCP's 30 s user timeout ends it) or still sending its start. Before
    /// 2026-12-06 its last `received` counted until the link ended (found by a review).
    fn counted_holdings(&self, silence_max: Duration) -> (Ts, Ts) {
        let (received, durable) = (self.received.load(Ordering::Acquire), self.durable.load(Ordering::Acquire));
        let heard = self.heard_us.load(Ordering::Acquire);
        let silent =
            heard != NEVER_ACKED && self.since.elapsed().saturating_sub(Duration::from_micros(heard)) > silence_max;
        (Ts(if silent { durable.min(received) } else { received }), Ts(durable))
    }
}

/// A gap sent from disk vouches for what it has sent every this many batches
/// (`send_gap`): an empty batch of 88 bytes per 64, against batches of a few KB.
const GAP_VOUCH_EVERY: u64 = 64;

/// When a gap sent from disk vouches for what it sent (`send_gap`); no I/O.
struct GapVouches {
    sent: u64,
    /// The highest timestamp vouched for (at first, what the backup holds).
    vouched: Ts,
    /// Everything at or below it is in the gap.
    reg_clock: Ts,
}

impl GapVouches {
    /// A batch was sent, and every batch still to come lies at or above `ahead` (the
    /// merge's next key, `Gap::for_each_ahead_of`): what to vouch for now, if anything.
    /// Every transaction below `ahead` has been sent (or was held already), and everything
    /// at or below `reg_clock` is in the gap: the floor is the lower of the two.
    fn after(&mut self, ahead: Option<Ts>) -> Option<Ts> {
        self.sent += 1;
        let next = ahead.filter(|_| self.sent.is_multiple_of(GAP_VOUCH_EVERY))?;
        let upto = Ts(next.0.saturating_sub(1)).min(self.reg_clock);
        (upto > self.vouched).then(|| {
            self.vouched = upto;
            upto
        })
    }

    /// The gap is sent: everything at or below the registration clock was in it.
    fn last(&self) -> Option<Ts> {
        (self.reg_clock > self.vouched).then_some(self.reg_clock)
    }
}

const NOTHING_ASKED: u64 = u64::MAX;

const NEVER_ACKED: u64 = u64::MAX;

struct Queue {
    frames: std::collections::VecDeque<Bytes>,
    /// Queued, and taken by the link's thread and not yet written (held to `queue_bytes_max`).
    bytes: usize,
    dead: Option<String>,
    /// The link's thread is writing frames it took from `frames`.
    writing: bool,
    /// The queue passed its bound while the link's start was sent: what was queued was
    /// dropped and nothing more is queued; the link's thread sends the log from disk above
    /// where its start ends (kept for it, `Link::asked_from`), queueing again from just
    /// before it reads it (`Primary::catch_up`). A backup that holds nothing until its
    /// copy is whole (a join) would otherwise be dropped and copied again from scratch,
    /// for ever, where the copy takes longer than the queue holds at the write rate.
    spilled: bool,
    /// The connection, once the link is live (its welcome and gap sent): a thread that
    /// ships a frame while nothing is queued or being written sends it here itself, without
    /// waking the link's thread (`push_to`).
    direct: Option<TcpStream>,
}

impl Link {
    /// Its start (a checkpoint copy, a gap read from disk, and what it missed meanwhile)
    /// is still being sent.
    fn starting(&self) -> bool {
        self.phase.load(Ordering::Acquire) != PHASE_ONLINE
    }

    fn kill(&self, why: String) {
        self.gone.store(true, Ordering::Release);
        let mut q = self.queue.lock();
        if q.dead.is_none() {
            q.dead = Some(why);
        }
        q.frames.clear();
        q.bytes = 0;
        q.direct = None;
        self.cv.notify_all();
        drop(q);
        // A thread blocked writing to a backup that reads nothing (or is gone, its
        // connection half-open) would otherwise hold the link until TCP gives up.
        if let Some(s) = &self.sock {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Told what every node holds whenever it moves; returns the release watermark (which
/// backups are then told).
pub type OnChange = Box<dyn Fn(&Holdings) -> Ts + Send + Sync>;

/// The shipping side of a primary (see the module notes).
pub struct Primary {
    durable: Durable,
    /// The backups' listener's address and its accept thread, which `stop` wakes and waits
    /// for, so that the port is free once it returns (a switchover's old primary that
    /// follows in place may be promoted in place later, in the same process).
    accept: Mutex<Option<(std::net::SocketAddr, std::thread::JoinHandle<()>)>>,
    epoch: Epoch,
    opts: PrimaryOptions,
    links: Mutex<Vec<Arc<Link>>>,
    shipped: Mutex<Prefix>,
    /// (batch bound, when shipped), oldest first, for the lags (`lag_since`); trimmed to
    /// what some backup has not replayed, and at most `LAG_SAMPLES_MAX` long.
    samples: Mutex<std::collections::VecDeque<(Ts, Instant)>>,
    released: AtomicU64,
    /// The backups the quorum counts now (`PrimaryOptions::backups_expected` at first).
    backups_expected: std::sync::atomic::AtomicUsize,
    /// The nodes whose links count (`set_counted_nodes`; `None`: all but learners').
    counted_nodes: Mutex<Option<std::collections::BTreeSet<String>>>,
    /// The membership being settled: (configuration, the release watermark when the count
    /// changed, whether the new count's quorum has covered it since).
    settle: Mutex<(u64, Ts, bool)>,
    /// Held through each `changed` (what the nodes hold, read, released and checked against
    /// the settle), and by a membership change while it counts the new members: a `changed`
    /// that read the nodes under the old membership never releases or settles after the
    /// new one took its bar (found by a review, 2026-12-03: such a late `changed` reported a
    /// removal settled that its new quorum did not hold).
    changing: Mutex<()>,
    on_change: OnChange,
    /// Woken whenever a backup's acknowledgements are read (`acks_read`): Redis's WAIT waits
    /// on it (`holdings_moved`) instead of polling the links.
    moved: tokio::sync::Notify,
    stopping: AtomicBool,
    /// Backups alone may release a commit now (`QuorumRecord::backups_release` of this
    /// run's record): batches are shipped `counted`.
    counted: AtomicBool,
    /// The record on disk (where `quorum_record` names a directory) and this run's own.
    quorum: Mutex<Quorum>,
    /// Each backup's last `Hello`, by its name: the epoch it followed and what it held
    /// (`heard_since_restart`); kept only while a restart waits (lock order: `quorum`,
    /// then this).
    heard: Mutex<std::collections::BTreeMap<String, (Epoch, Ts)>>,
    pub batches_shipped: AtomicU64,
    /// Frames sent to a backup by the thread that shipped them, not its link's thread.
    pub frames_sent_directly: AtomicU64,
    /// When a refusal a backup tries again after (`NAME_TAKEN`, `AUTH_REFUSED`) was last
    /// logged.
    retried_refusal_said: Mutex<Option<Instant>>,
    /// Connections whose hello has not been read yet (each holds a thread for up to
    /// `HELLO_WAIT_MAX`, and a TLS handshake's time): at most `UNHELLOED_MAX`.
    unhelloed: Arc<Unhelloed>,
    /// When a connection closed for that bound was last said to be.
    unhelloed_said: Mutex<Option<Instant>>,
    /// Links dozing (`serve_link`): a release that moves wakes them.
    dozing_links: AtomicUsize,
    /// Heartbeat batches of this log that moved nothing a backup holds, not sent.
    pub heartbeats_not_shipped: AtomicU64,
    pub backups_dropped: AtomicU64,
    /// Rounds of `Primary::catch_up`: a link's queue passed its bound while its start (or
    /// the round before) was sent, and what it missed was sent from disk after it,
    /// instead of the link being dropped.
    pub catch_up_rounds: AtomicU64,
    /// Backups that joined with a checkpoint copy (the others resumed from the log).
    pub checkpoints_sent: AtomicU64,
    /// Counted backups whose link closed: how far each had made the log durable
    /// (`log_needed_above`). Forgotten once its node no longer counts.
    gone: Mutex<std::collections::BTreeMap<String, u64>>,
    /// What heartbeats' `sent_us` count from (`now_us`).
    clock_base: Instant,
    /// The id of the database this primary serves (`crate::identity`), said in every
    /// `Welcome`.
    database: crate::identity::DatabaseId,
    /// This run of the primary: random, never 0, said in every `Welcome`. A primary serves
    /// an epoch in one run only (`crate::identity::check_run`).
    run: u64,
    /// The run that served the epoch this one opened from (`PrimaryOptions::resume_from`),
    /// as the directory recorded it (`crate::identity::run_of`; 0: not recorded).
    resumed_run: u64,
}

impl Primary {
    /// Installs the shipping tap on `durable`'s log and listens for backups on `listener`.
    /// `on_change` is called (on any thread, not blocking) whenever what the nodes hold moves.
    pub fn start(
        durable: &Durable,
        listener: TcpListener,
        opts: PrimaryOptions,
        on_change: OnChange,
    ) -> std::io::Result<Arc<Primary>> {
        let logger = durable.logger();
        let local = listener.local_addr()?;
        // The run that served the epoch this one opened from, where the directory recorded
        // it; then this run, of this epoch, recorded before any backup is welcomed
        // (`crate::identity::EPOCH_RUN_FILE`).
        let dir = durable.dir();
        let resumed_run = match opts.resume_from {
            Some((e, _, _)) => crate::identity::run_of(dir, e)?,
            None => 0,
        };
        let run = crate::identity::DatabaseId::new_random().to_wire();
        let storage = ditto_log::storage::RealStorage;
        crate::identity::write_epoch_run(dir, crate::identity::EPOCH_RUN_FILE, logger.epoch(), run, &storage).map_err(
            |e| std::io::Error::new(e.kind(), format!("recording this primary's run in {}: {e}", dir.display())),
        )?;
        let p = Arc::new(Primary {
            clock_base: Instant::now(),
            // (Made by the log's open: every backup it welcomes takes this id.)
            database: durable.database(),
            run,
            resumed_run,
            durable: durable.clone(),
            accept: Mutex::new(None),
            epoch: logger.epoch(),
            backups_expected: std::sync::atomic::AtomicUsize::new(opts.backups_expected),
            counted_nodes: Mutex::new(None),
            // Not settled on what it holds from before until its quorum holds that too (a
            // new primary after a failover: the others may lack what the old one released).
            settle: Mutex::new((opts.members_config, durable.db().clock().visible_ts(), false)),
            changing: Mutex::new(()),
            counted: AtomicBool::new(false),
            quorum: Mutex::new(Quorum::start(&opts)),
            heard: Mutex::new(Default::default()),
            opts,
            links: Mutex::new(Vec::new()),
            shipped: Mutex::new(Prefix::new(logger.streams(), logger.watermark())),
            samples: Mutex::new(Default::default()),
            released: AtomicU64::new(0),
            on_change,
            moved: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            batches_shipped: AtomicU64::new(0),
            frames_sent_directly: AtomicU64::new(0),
            retried_refusal_said: Mutex::new(None),
            unhelloed: Arc::new(Unhelloed::new(UNHELLOED_MAX, UNHELLOED_PER_ADDRESS_MAX)),
            unhelloed_said: Mutex::new(None),
            dozing_links: AtomicUsize::new(0),
            heartbeats_not_shipped: AtomicU64::new(0),
            backups_dropped: AtomicU64::new(0),
            catch_up_rounds: AtomicU64::new(0),
            checkpoints_sent: AtomicU64::new(0),
            gone: Mutex::new(Default::default()),
        });
        {
            // The record on disk first: it must cover every commit this run may release.
            let q = p.quorum.lock();
            if let Some(d) = &q.dir {
                q.record.write(d)?;
            }
            p.counted.store(q.mine.backups_release(), Ordering::Release);
        }
        logger.set_ship_tap(Arc::new(Tap(Arc::downgrade(&p)))).map_err(std::io::Error::other)?;
        if let Some(policy) = p.opts.policy {
            p.ship_pace_for(policy);
        }
        remove_stale_ship_dirs(durable.dir());
        // The log its backups have not made durable outlives checkpoints (bounded): one
        // that returns resumes from the log, and a failover can fetch from it.
        let weak = Arc::downgrade(&p);
        durable.keep_log_for(Some(Box::new(move |gone_below| {
            weak.upgrade().map_or(Ts(u64::MAX), |p| p.log_needed_above(gone_below))
        })));
        let me = Arc::clone(&p);
        let accept = std::thread::Builder::new().name("ditto-repl-accept".into()).spawn(move || {
            for conn in listener.incoming() {
                if me.stopping.load(Ordering::Acquire) {
                    return;
                }
                match conn {
                    Ok(s) => {
                        // Anyone who reaches the port may open connections and say nothing:
                        // past `UNHELLOED_MAX` of those, the oldest is closed (before
                        // 2026-12-03 each took a thread for up to 20 s, without bound, until
                        // threads or descriptors ran out and real backups were dropped too;
                        // found by a review). The oldest, not the newest: a real backup says
                        // its hello within milliseconds, so silent connections cannot keep
                        // it out unless they come faster than that.
                        let (slot, evicted) = Unhelloed::take(&me.unhelloed, &s);
                        if let Some(old) = evicted {
                            let _ = old.shutdown(std::net::Shutdown::Both);
                            let mut said = me.unhelloed_said.lock();
                            if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                                *said = Some(Instant::now());
                                let addr = old.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                                tracing::warn!(
                                    "replication connection from {addr} closed: the oldest of those that have not said their hello (at most {UNHELLOED_MAX}, {UNHELLOED_PER_ADDRESS_MAX} from one address)"
                                );
                            }
                        }
                        let me = Arc::clone(&me);
                        let spawned = std::thread::Builder::new().name("ditto-repl-link".into()).spawn(move || {
                            ditto_log::sched::link_thread();
                            let addr = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                            // A backup gone without a FIN is found by the kernel's probes
                            // where no write of this side's is waiting to fail, and by the
                            // user timeout where one is (data unacknowledged for 30 s: the
                            // idle heartbeats keep some in flight); a live link also ends
                            // after `ack_silence_max` without an acknowledgement. Either
                            // failing is said: the link goes on without it (the user
                            // timeout is what lets go of a write to a backup that stopped
                            // reading while traffic stays under the queue's bound).
                            if let Err(e) = crate::tls::keep_alive(&s) {
                                tracing::warn!("replication connection from {addr}: setting TCP keepalive: {e}");
                            }
                            if let Err(e) = crate::tls::give_up_unacknowledged(&s) {
                                tracing::warn!("replication connection from {addr}: setting TCP's user timeout: {e}");
                            }
                            let opens = crate::tls::opens_with_tls(&s, Duration::from_secs(10));
                            let served = match (&me.opts.tls, opens) {
                                (_, Err(e)) => Err(e),
                                (None, Ok(false)) => me.serve(s, &addr, slot),
                                (Some(t), Ok(true)) => t.accept(s).and_then(|s| me.serve(s, &addr, slot)),
                                (Some(_), Ok(false)) => {
                                    // Its hello read first: a socket closed with bytes
                                    // unread resets the connection, and the backup may
                                    // lose the answer.
                                    let _ = read_frame_at_most(&mut Until::new(&s, Instant::now() + HELLO_WAIT_MAX), HELLO_BYTES_MAX);
                                    Err(refuse(&s, format!("{TLS_ONLY}: set tls_replication on the backup, with a certificate of this primary's CA")))
                                }
                                // (It cannot be answered: it waits for a TLS answer.)
                                (None, Ok(true)) => Err(std::io::Error::other(format!(
                                    "{TLS_ONLY_THERE}: this primary's replication port is plaintext; set tls_replication on both nodes or on neither"
                                ))),
                            };
                            if let Err(e) = served {
                                // A backup refused for its name or its password tries again
                                // and again (so may anyone who reaches the port): said at
                                // most once a second.
                                let why = e.to_string();
                                let retried = why.starts_with(NAME_TAKEN)
                                    || why.starts_with(AUTH_REFUSED)
                                    || why.starts_with(TLS_ONLY)
                                    || why.starts_with(TLS_ONLY_THERE)
                                    || why.starts_with("TLS from");
                                if !retried
                                    || me
                                        .retried_refusal_said
                                        .lock()
                                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
                                {
                                    if retried {
                                        *me.retried_refusal_said.lock() = Some(Instant::now());
                                    }
                                    tracing::warn!("replication link to {addr} closed: {e}");
                                }
                            }
                        });
                        if let Err(e) = spawned {
                            // (The connection closes with it, unserved: the backup asks again.)
                            tracing::error!("a replication connection was not served: starting its thread: {e}");
                        }
                    }
                    Err(e) => {
                        tracing::warn!("replication accept failed: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        })?;
        *p.accept.lock() = Some((local, accept));
        // (What it holds may be settled already: the primary alone, or nothing held.)
        p.changed();
        Ok(p)
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The id of the database this primary serves (`crate::identity`).
    pub fn database(&self) -> crate::identity::DatabaseId {
        self.database
    }

    /// This run of the primary (`crate::identity::check_run`).
    pub fn run(&self) -> u64 {
        self.run
    }

    /// What every node holds now.
    pub fn holdings(&self) -> Holdings {
        let logger = self.durable.logger();
        let links = self.links.lock();
        let expected = self.backups_expected.load(Ordering::Acquire);
        // A learner counts in no quorum (docs/cluster.md, "Learners"); nor does a node that
        // is not a member (`set_counted_nodes`), nor a link killed, whose backup's new link
        // (under the same name) may be in the list beside it. Each live counted link is one
        // backup, and the quorum is at least the expected count: a link that is not there
        // holds nothing. (Placed by their slots before 2026-12-02: a killed link not yet out
        // of the list and its backup's new one counted twice, and a removed member's link at
        // a low slot padded the quorum with an empty place.)
        let mut backups: Vec<_> = links
            .iter()
            .filter(|l| l.counted.load(Ordering::Acquire) && !l.gone.load(Ordering::Acquire))
            .map(|l| Some(l.counted_holdings(self.opts.ack_silence_max)))
            .collect();
        if backups.len() < expected {
            backups.resize(expected, None);
        }
        Holdings { primary_durable: logger.watermark(), primary_shipped: self.shipped.lock().watermark(), backups }
    }

    /// The release watermark (of the default policy), which backups learn.
    fn set_released(&self, ts: Ts) {
        // Sequentially consistent, against a link about to doze (`serve_link`).
        let before = self.released.fetch_max(ts.0, Ordering::SeqCst);
        if ts.0 > before && self.dozing_links.load(Ordering::SeqCst) > 0 {
            // A dozing link is sent the release here, as a frame shipped before its thread
            // parks is (`push_to`, at once: on the socket if it takes it, else queued and
            // the link's thread woken), so that backups read it as soon as they would from
            // a link awake. (Its thread sends it again when it next looks: harmless.)
            let links = self.links.lock();
            let dozing: Vec<Arc<Link>> = links.iter().filter(|l| l.dozing.load(Ordering::SeqCst)).cloned().collect();
            if !dozing.is_empty() {
                let f = self.heartbeat(Ts(self.released.load(Ordering::SeqCst))).encode();
                self.push_to(&dozing, &f, true);
            }
        }
    }

    pub fn released(&self) -> Ts {
        Ts(self.released.load(Ordering::Acquire))
    }

    /// Now on the clock heartbeats say they were sent by (`Frame::Heartbeat::sent_us`):
    /// microseconds since this primary started, never 0.
    fn now_us(&self) -> u64 {
        self.clock_base.elapsed().as_micros() as u64 + 1
    }

    /// A heartbeat of the release `released` made now: with the highest release of any
    /// policy, at or above it, and its time.
    fn heartbeat(&self, released: Ts) -> Frame {
        Frame::Heartbeat { released, acknowledged: self.acknowledged().max(released), sent_us: self.now_us() }
    }

    /// From now on, commits may be released to their clients on backups'
    /// acknowledgements (a connection chose a policy other than `local`): every batch is
    /// shipped `counted`, so a backup knows its own acknowledgement of it may be what
    /// released it, before the primary says so (`Frame::Heartbeat::acknowledged`, a
    /// moment later). Call it before such a commit is made: a batch framed after the
    /// commit's append is shipped after this (the stream buffer's lock orders them).
    pub fn backups_may_release(&self, policy: crate::CommitPolicy) -> std::io::Result<()> {
        self.change_quorum(|r| {
            r.add_policy(policy);
        })?;
        self.ship_pace_for(policy);
        Ok(())
    }

    /// A policy that releases on backups' memory, with no fsync here, is in use: the log
    /// frames and ships batches as commits come even with an interval, whose pace its disk
    /// thread then keeps (`Logger::ship_at_commit_pace`); under any other policy a release
    /// waits for this disk, so batches an interval apart are shipped (fewer, larger).
    fn ship_pace_for(&self, policy: crate::CommitPolicy) {
        if policy.level == crate::Level::Received && policy.scope != crate::Scope::Local {
            self.durable.logger().ship_at_commit_pace();
        }
    }

    /// The quorum may count `slots` backups from now on, `node` among them (recorded
    /// first: see `crate::restart`).
    fn grow_quorum(&self, node: Option<&str>, slots: usize) -> std::io::Result<()> {
        self.change_quorum(|r| {
            r.slots = r.slots.max(slots);
            if let Some(n) = node {
                r.add_backup(n);
            }
        })
    }

    /// Changes the quorum's record (written first, where it is kept) and whether batches
    /// are marked `counted`, under its lock: two changes at once leave the later mark.
    fn change_quorum(&self, f: impl Fn(&mut crate::restart::QuorumRecord)) -> std::io::Result<()> {
        let mut q = self.quorum.lock();
        let now = q.change(f)?;
        self.counted.store(now, Ordering::Release);
        Ok(())
    }

    /// After its log closed cleanly: if everything this primary shipped is durable here
    /// (and no restart's wait is still open), no backup can hold a commit it lacks, so the
    /// record forgets its backups and the next restart waits for none. Whether it did.
    pub fn forget_backups_after_clean_stop(&self) -> std::io::Result<bool> {
        let h = self.holdings();
        let clean = h.primary_durable >= h.primary_shipped && self.durable.logger().failure().is_none();
        let mut q = self.quorum.lock();
        if !clean || q.waits.is_some() || q.dir.is_none() {
            return Ok(false);
        }
        let mut r = q.mine.clone();
        r.backups.clear();
        q.replace(r)?;
        Ok(true)
    }

    /// A restart's wait is over (`crate::restart::restart_settled` said so): the record
    /// on disk is this run's alone from now on, and backups of older epochs are served
    /// again (sent a copy).
    pub fn settle_restart(&self) -> std::io::Result<()> {
        let mut q = self.quorum.lock();
        let mine = q.mine.clone();
        q.replace(mine)?;
        q.waits = None;
        self.heard.lock().clear();
        Ok(())
    }

    /// What a restart waits by (`crate::restart::restart_settled`), while it waits.
    pub fn restart_record(&self) -> Option<crate::restart::QuorumRecord> {
        self.quorum.lock().waits.clone()
    }

    /// A person says the recorded backup `name` is gone for good (`DITTO.FORGETBACKUP`):
    /// recorded as lost, on disk first, and the restart's wait goes on for the others
    /// (`crate::restart`, module notes). The record the wait goes by now; an error, with
    /// nothing changed, if no restart waits, the quorum never counted `name`, or the
    /// record cannot be written.
    pub fn declare_lost(&self, name: &str) -> Result<crate::restart::QuorumRecord, String> {
        let mut q = self.quorum.lock();
        let Some(mut waits) = q.waits.clone() else {
            return Err("this primary is not waiting for its backups after a restart".into());
        };
        if !waits.add_lost(name)? {
            return Ok(waits);
        }
        let mut record = q.record.clone();
        record.add_lost(name)?;
        q.replace(record).map_err(|e| format!("this primary could not record that backup {name} is lost: {e}"))?;
        q.waits = Some(waits.clone());
        Ok(waits)
    }

    /// For a primary restarted from epoch `old` at `point`: the backups (by name) whose
    /// last `Hello` since it started said they hold nothing above the point (in `old` at
    /// or below it, in this epoch, or nothing at all), and each that holds more, or may (it
    /// keeps that, and stays away). What `restart_settled` decides on.
    pub fn heard_since_restart(
        &self,
        old: Epoch,
        point: Ts,
    ) -> (std::collections::BTreeSet<String>, Vec<(String, Epoch, Ts)>) {
        // A backup of an older epoch that holds anything may hold what an earlier restart
        // lost (one that never settled), unless it holds nothing above where that
        // restart cut its epoch.
        let restarts = self.restart_chain().unwrap_or_default();
        let clear =
            |(e, have): (Epoch, Ts)| crate::restart::clear_after_restarts(self.epoch, old, point, &restarts, e, have);
        let heard = self.heard.lock();
        let now = heard.iter().filter(|(_, h)| clear(**h)).map(|(n, _)| n.clone()).collect();
        let more = heard.iter().filter(|(_, h)| !clear(**h)).map(|(n, (e, t))| (n.clone(), *e, *t)).collect();
        (now, more)
    }

    /// The restarts since the last settled one (`QuorumRecord::restarts`) while a restart
    /// waits; `None` once it settled, or if this start waits for none. (One read: a
    /// restart that settles between reading the wait and its chain would leave an empty
    /// chain, and a clear backup refused.)
    fn restart_chain(&self) -> Option<Vec<(Epoch, Ts)>> {
        self.quorum.lock().waits.as_ref().map(|w| w.restarts.clone())
    }

    /// Backups alone may release a commit now (the policies in use and the quorum's
    /// slots): batches are shipped `counted`.
    pub fn backups_release(&self) -> bool {
        self.counted.load(Ordering::Acquire)
    }

    fn flags(&self, floor_trusted: bool) -> crate::protocol::BatchFlags {
        crate::protocol::BatchFlags { floor_trusted, counted: self.counted.load(Ordering::Acquire) }
    }

    /// The highest release of any commit policy (`PrimaryOptions::acknowledged`).
    fn acknowledged(&self) -> Ts {
        self.opts.acknowledged.as_ref().map_or(Ts::ZERO, |a| Ts(a.load(Ordering::Acquire)))
    }

    pub fn backups(&self) -> Vec<BackupInfo> {
        let links: Vec<Arc<Link>> = self.links.lock().clone();
        let samples = self.samples.lock();
        let now = Instant::now();
        let lag = |held: Ts| lag_since(&samples, held, now);
        links
            .iter()
            .map(|l| {
                let (received, durable, replayed) = (
                    Ts(l.received.load(Ordering::Acquire)),
                    Ts(l.durable.load(Ordering::Acquire)),
                    Ts(l.replayed.load(Ordering::Acquire)),
                );
                BackupInfo {
                    node: l.node.clone(),
                    addr: l.addr.clone(),
                    learner: l.learner,
                    received,
                    durable,
                    replayed,
                    queued_bytes: l.queue.lock().bytes,
                    connected_for: l.since.elapsed(),
                    received_lag: lag(received),
                    durable_lag: lag(durable),
                    replay_lag: lag(replayed),
                    heard_ago: match l.heard_us.load(Ordering::Acquire) {
                        NEVER_ACKED => Duration::MAX,
                        us => l.since.elapsed().saturating_sub(Duration::from_micros(us)),
                    },
                    lease_ago: match l.lease_us.load(Ordering::Acquire) {
                        0 => Duration::MAX,
                        us => self.clock_base.elapsed().saturating_sub(Duration::from_micros(us)),
                    },
                    state: PHASES[l.phase.load(Ordering::Acquire) as usize],
                    copy_sent_bytes: l.copy_sent.load(Ordering::Acquire),
                    copy_total_bytes: l.copy_total.load(Ordering::Acquire),
                }
            })
            .collect()
    }

    /// Keeps a lag sample for a batch with bound `bound` shipped now to `links`, and lets
    /// go of those every one of them has replayed.
    fn sample(&self, links: &[Arc<Link>], bound: Ts) {
        let now = Instant::now();
        let oldest_needed = links.iter().map(|l| Ts(l.replayed.load(Ordering::Acquire))).min();
        let mut s = self.samples.lock();
        if let Some(held) = oldest_needed {
            // Keep the first sample above what every backup replayed.
            let done = s.partition_point(|(ts, _)| *ts <= held);
            s.drain(..done);
        }
        if s.back().is_some_and(|(ts, _)| *ts >= bound) {
            return;
        }
        // Samples closer than this add nothing a lag in milliseconds can show.
        if s.back().is_some_and(|(_, at)| now.duration_since(*at) < LAG_SAMPLE_EVERY) {
            let last = s.len() - 1;
            s[last].0 = bound;
            return;
        }
        push_sample(&mut s, bound, now);
    }

    fn changed(&self) {
        let _one = self.changing.lock();
        let h = self.holdings();
        let released = (self.on_change)(&h);
        self.set_released(released);
        let mut s = self.settle.lock();
        if !s.2 && self.settle_covers(&h, released) >= s.1 {
            s.2 = true;
            tracing::info!(config = s.0, "the commit quorum counts the new membership");
        }
    }

    /// Acknowledgements were read from a backup: what the nodes hold moved, and what a
    /// backup received (Redis's WAIT, `holdings_moved`) too. (Only here: `changed` runs for
    /// every shipped batch as well, which moves no backup's count.)
    fn acks_read(&self) {
        self.changed();
        self.moved.notify_waiters();
    }

    /// How many backups have received every commit up to `ts` (Redis's WAIT): a link the
    /// quorum does not count (a learner's, or one of a node that is no member) is not
    /// counted, nor is a link that ended (its backup's next link, if it came back, counts
    /// once).
    pub fn replicas_received(&self, ts: Ts) -> usize {
        self.links
            .lock()
            .iter()
            .filter(|l| {
                l.counted.load(Ordering::Acquire)
                    && !l.gone.load(Ordering::Acquire)
                    && l.counted_holdings(self.opts.ack_silence_max).0 >= ts
            })
            .count()
    }

    /// Resolves the next time a backup's acknowledgements are read (what a backup received
    /// may have moved). `enable` it before reading `replicas_received`, so that a move
    /// between the two is not missed.
    pub fn holdings_moved(&self) -> tokio::sync::futures::Notified<'_> {
        self.moved.notified()
    }

    /// What a membership settles by: the least `crate::settle_watermark` of every policy in
    /// use that counts backups, the server's and those its connections or transactions
    /// chose (the quorum's record); `released` where none does. (Before 2026-12-07 the
    /// server's policy alone: under a default of `local`, a commit a client's
    /// `majority-durable` released on one backup of three was not waited for, and two
    /// members added one after the other could then form a majority that lacked it; found
    /// by a review.) Read only while a change is unsettled.
    fn settle_covers(&self, h: &Holdings, released: Ts) -> Ts {
        let q = self.quorum.lock();
        q.mine
            .policies
            .iter()
            .chain(self.opts.policy.iter())
            .filter(|p| p.scope != crate::Scope::Local)
            .map(|&p| crate::settle_watermark(p, h))
            .min()
            .unwrap_or(released)
    }

    /// A cluster's membership changed to configuration `config`, with `n` backups: the
    /// quorum counts `n` from now on. It is settled (`members_settled`) once the new count's
    /// quorum holds everything released so far: only then may the next change go ahead
    /// (docs/cluster.md, "Membership changes").
    /// Counts only the links of backups whose node (`Hello::node`, their client address) is
    /// in `nodes` (`None`: every link but a learner's). A cluster's primary is given its
    /// members: a node removed that has not stopped yet, or one that never learned it was
    /// removed, may still be connected and acknowledging, and must not complete a quorum
    /// that a failover among the members would not meet.
    pub fn set_counted_nodes(&self, nodes: Option<std::collections::BTreeSet<String>>) {
        {
            let _one = self.changing.lock();
            // (Under the links' lock, as a link registering reads the set.)
            let links = self.links.lock();
            let mut n = self.counted_nodes.lock();
            *n = nodes;
            for l in links.iter() {
                l.counted.store(Self::counts(&n, &l.node, l.learner), Ordering::Release);
            }
        }
        self.changed();
    }

    /// The lowest position a counted backup has made durable, connected or last seen, at
    /// or above `gone_below` (the log below that went past the bound already: those
    /// backups are forgotten) (`Durable::keep_log_for`): the log above it is kept through
    /// checkpoints. A counted backup not heard from since this primary started is not
    /// waited for (it is sent a checkpoint, or is being sent one), but for the log above
    /// where it asked while that is sent (`Link::asked_from`).
    pub fn log_needed_above(&self, gone_below: Ts) -> Ts {
        let links = self.links.lock();
        let counted = self.counted_nodes.lock();
        let mut gone = self.gone.lock();
        gone.retain(|node, d| Self::counts(&counted, node, false) && *d >= gone_below.0);
        // Each counted link: what it made durable, or (not heard from yet) where the log it
        // is being sent starts (`NOTHING_ASKED`, the maximum, when none); and any link
        // whose start is still being sent (a learner's too): where that starts, for what
        // its queue cannot hold meanwhile (`Queue::spilled`).
        let (mut low, mut heard) = (u64::MAX, std::collections::BTreeSet::new());
        let mut keep = |d: u64| {
            if d >= gone_below.0 {
                low = low.min(d);
            }
        };
        for l in links.iter() {
            let counts = l.counted.load(Ordering::Acquire);
            let was_heard = l.heard_us.load(Ordering::Acquire) != NEVER_ACKED;
            if counts && was_heard {
                heard.insert(l.node.as_str());
                keep(l.durable.load(Ordering::Acquire));
            }
            if (counts && !was_heard) || l.starting() {
                keep(l.asked_from.load(Ordering::Acquire));
            }
        }
        // And those away, unless a link of theirs has been heard from since.
        for (_, &d) in gone.iter().filter(|(node, _)| !heard.contains(node.as_str())) {
            low = low.min(d);
        }
        Ts(low)
    }

    /// Whether a backup of `node` counts in the quorum while the members are `nodes`.
    fn counts(nodes: &Option<std::collections::BTreeSet<String>>, node: &str, learner: bool) -> bool {
        !learner && nodes.as_ref().is_none_or(|n| n.contains(node))
    }

    pub fn set_backups_expected(&self, n: usize, config: u64) {
        {
            let _one = self.changing.lock();
            let mut s = self.settle.lock();
            if s.0 == config && self.backups_expected.load(Ordering::Acquire) == n {
                return;
            }
            self.backups_expected.store(n, Ordering::Release);
            // Everything released under any policy (`acknowledged`: a connection's own may
            // release more than the server's). (What it started with, if not settled yet,
            // stays to be covered too.)
            let released = self.released().max(self.acknowledged());
            let bar = if s.2 { released } else { s.1.max(released) };
            *s = (config, bar, false);
        }
        if let Err(e) = self.grow_quorum(None, n) {
            tracing::error!("recording the quorum's {n} backups: {e}");
        }
        tracing::info!(config, backups = n, "the commit quorum counts a new membership");
        self.changed();
    }

    /// The configuration whose count the quorum has settled, if the latest has settled.
    pub fn members_settled(&self) -> Option<u64> {
        let s = self.settle.lock();
        s.2.then_some(s.0)
    }

    /// The backups the quorum counts.
    pub fn backups_expected(&self) -> usize {
        self.backups_expected.load(Ordering::Acquire)
    }

    /// Recomputes the release watermark (the server calls it when the local log moves).
    pub fn recompute(&self) {
        self.changed();
    }

    fn push_all(&self, frame: &Bytes) {
        self.push_to(&self.links.lock(), frame, false);
    }

    /// Sends `frame` to each of `links`, or queues it for the link's thread (the caller
    /// holds the links' lock). With `at_once` (a batch flushed by a runtime thread about to
    /// park, `ShipTap::batch`), a live link with nothing queued or being written is sent the
    /// frame here, as far as its socket takes it without waiting; the rest is queued (a
    /// frame sent here and the link thread's writes never interleave: both happen only
    /// under the queue's lock, or with `writing` set).
    fn push_to(&self, links: &[Arc<Link>], frame: &Bytes, at_once: bool) {
        for l in links {
            let mut q = l.queue.lock();
            if q.dead.is_some() || q.spilled {
                continue;
            }
            let mut frame = frame.clone();
            if let (true, true, false, Some(s)) = (at_once, q.frames.is_empty(), q.writing, &q.direct) {
                match send_without_waiting(s, &frame) {
                    Ok(n) if n == frame.len() => {
                        self.frames_sent_directly.fetch_add(1, Ordering::Relaxed);
                        l.sent_directly_us.store(l.since.elapsed().as_micros() as u64, Ordering::Relaxed);
                        continue;
                    }
                    Ok(n) => frame = frame.slice(n..),
                    // The link's thread meets the same error, and ends the link.
                    Err(_) => {}
                }
            }
            if q.bytes + frame.len() > self.opts.queue_bytes_max {
                if l.starting() {
                    // Its start is still being sent: what it misses now is read from disk
                    // after it (`catch_up`).
                    q.frames.clear();
                    q.bytes = 0;
                    q.spilled = true;
                    continue;
                }
                drop(q);
                self.backups_dropped.fetch_add(1, Ordering::Relaxed);
                l.kill(format!(
                    "backup {} fell more than {} MiB behind; dropped, it resumes from the log on disk",
                    l.node,
                    self.opts.queue_bytes_max >> 20
                ));
                continue;
            }
            q.bytes += frame.len();
            q.frames.push_back(frame);
            l.cv.notify_one();
        }
    }

    /// One backup's connection, start to end: `addr` is where it came from (with TLS,
    /// `stream` is the tunnel's loopback end).
    fn serve(self: &Arc<Self>, stream: TcpStream, addr: &str, slot: HelloSlot) -> std::io::Result<()> {
        stream.set_nodelay(true)?;
        let addr = addr.to_string();
        // The hello within `HELLO_WAIT_MAX` in all, however its bytes trickle in (a timeout
        // per read let a peer that sent a byte every 9 s hold this thread for days).
        // (Its proof, where a password is asked, within the same time.)
        let until = Instant::now() + HELLO_WAIT_MAX;
        let hello = read_frame_at_most(&mut Until::new(&stream, until), HELLO_BYTES_MAX)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let reader = BufReader::new(stream.try_clone()?);
        let (epoch, have_ts, node, learner, proves, database, run) = match hello {
            Some(Frame::Hello { version, epoch, have_ts, node, learner, proves, database, run })
                if version == PROTOCOL_VERSION =>
            {
                (epoch, have_ts, node, learner, proves, database, run)
            }
            Some(Frame::Hello { version, .. }) => {
                let reason = format!(
                    "replication protocol version {version} is not supported (this primary speaks {PROTOCOL_VERSION})"
                );
                return Err(refuse(&stream, reason));
            }
            other => return Err(std::io::Error::other(format!("expected Hello, got {other:?}"))),
        };
        // A name goes into `INFO replication` (one line per backup, its fields separated
        // by commas) and the restart's record: short, and without control characters (a
        // line break split the INFO reply's lines) or commas (one split its `slaveN` line's
        // fields; a server's own `replica_name` refuses them, but another peer's hello was
        // not held to it until 2026-12-06).
        if node.is_empty() || node.len() > BACKUP_NAME_MAX || node.chars().any(|c| c.is_control() || c == ',') {
            let shown: String = node.chars().take(64).flat_map(char::escape_default).collect();
            let reason = format!(
                "a backup's name must be 1 to {BACKUP_NAME_MAX} bytes without control characters or commas, not {} bytes: {shown}",
                node.len()
            );
            return Err(refuse(&stream, reason));
        }
        if let Some(password) = &self.opts.password {
            // The password proved both ways, never sent (`crate::proof`): this primary
            // first, then the backup, which proves only to a primary that did.
            let Some(theirs) = proves else {
                let reason = "this primary requires a password of its backups: give the backup masterauth (its requirepass), or in a cluster the same --cluster-secret-file";
                // (Logged by the caller, at most once a second.)
                return Err(refuse(&stream, format!("{AUTH_REFUSED} for backup {node}: {reason}")));
            };
            let ours = crate::proof::nonce();
            let salt = self.database.to_wire();
            let salted = salt.to_le_bytes();
            let t = crate::protocol::link_transcript(&node, &salted, &theirs, &ours);
            let proof = crate::proof::prove(password, crate::proof::Side::Accepts, &t);
            (&stream).write_all(&Frame::Challenge { salt, nonce: ours, proof }.encode())?;
            match read_frame_at_most(&mut Until::new(&stream, until), HELLO_BYTES_MAX) {
                // (Each password taken, all of them every time.)
                Ok(Some(Frame::Proof { proof }))
                    if crate::proof::verify(
                        std::iter::once(password).chain(&self.opts.also_accepted),
                        crate::proof::Side::Connects,
                        &t,
                        &proof,
                    ) => {}
                Ok(Some(Frame::Proof { .. })) => {
                    let reason = "the backup's masterauth is not this primary's requirepass (in a cluster: their cluster secrets differ)";
                    return Err(refuse(&stream, format!("{AUTH_REFUSED} for backup {node}: {reason}")));
                }
                Ok(Some(other)) => {
                    return Err(std::io::Error::other(format!("backup {node} answered its challenge with {other:?}")))
                }
                // A backup whose password does not take this primary's proof closes.
                Ok(None) => {
                    return Err(std::io::Error::other(format!(
                        "{AUTH_REFUSED} for backup {node}: it closed the link at its challenge (it did not take this primary's proof, where this primary's requirepass is not its masterauth, or in a cluster their cluster secrets differ; or it stopped)"
                    )))
                }
                Err(e) => return Err(e),
            }
        } else if proves.is_some() {
            // A backup with a password takes no primary that cannot prove it holds it: said
            // at once, before anything is made for it (a checkpoint to copy).
            let reason = "the backup has a masterauth (in a cluster: a cluster secret) and this primary asks no password of its backups (requirepass): give both the same, or neither";
            return Err(refuse(&stream, format!("{AUTH_REFUSED} for backup {node}: {reason}")));
        }
        drop(slot);
        stream.set_read_timeout(None)?;
        // A backup of another database (`crate::identity`): refused before anything is
        // recorded (its name in the quorum's record) or made for it (a checkpoint to copy).
        // It checks the welcome's id too. (Before 2026-12-05, evening, only the backup did:
        // each try was recorded, and a restart then waited for it; found by a review.)
        if let Some(theirs) = crate::identity::DatabaseId::from_wire(database).filter(|&t| t != self.database) {
            let holder = format!("backup {node}'s directory");
            return Err(refuse(&stream, crate::identity::refusal(&holder, theirs, "this primary", self.database)));
        }
        // Nor one that followed this epoch's number as another run of a primary served it:
        // another history of that number (`crate::identity::check_run`).
        if epoch == self.epoch {
            let holder = format!("backup {node}'s directory");
            if let Err(reason) = crate::identity::check_run(epoch.0, run, self.run, &holder, "this primary") {
                return Err(refuse(&stream, reason));
            }
        }
        // Nor one of the epoch this one opened from, as another run served it: resumed or
        // told to cut, it would take this history above its own (a copy of a directory
        // that served that epoch number beside its original, then restarted).
        if self.opts.resume_from.is_some_and(|(e, _, _)| e == epoch) {
            let holder = format!("backup {node}'s directory");
            let this = format!("this primary (which opened epoch {} from it)", self.epoch.0);
            if let Err(reason) = crate::identity::check_run(epoch.0, run, self.resumed_run, &holder, &this) {
                return Err(refuse(&stream, reason));
            }
        }
        // A backup of a later epoch than this primary's: this primary is stale (deposed,
        // or restored from an older copy), and the copy it would send (no log of that
        // epoch to resume from) would discard commits a later primary released with the
        // backup in its quorum. Refused: the backup keeps them. (Found by a review.)
        if epoch > self.epoch {
            let reason = format!(
                "this backup follows epoch {}, later than this primary's epoch {}: this primary is stale (deposed, or restored from an older copy) and sends it nothing; the backup keeps what it holds (point it at the current primary)",
                epoch.0, self.epoch.0
            );
            return Err(refuse(&stream, reason));
        }
        // A backup of this very epoch that holds more than this primary ever stamped: its
        // history is not this primary's (epochs are numbered per data directory: a copy of
        // an older directory started as a primary opens the same next epoch its original
        // did). Resumed, it would skip this primary's commits up to what it holds and
        // acknowledge them. Refused: it keeps what it holds. (Found by a review,
        // 2026-12-03.)
        let stamped = self.durable.db().clock().now();
        if epoch == self.epoch && have_ts > stamped {
            let reason = format!(
                "this backup holds up to ts {} of epoch {}, past everything this primary stamped in it (ts {}): its history is another primary's of the same epoch number (a copy of an older data directory started as a primary?); it keeps what it holds (point it at the primary it followed, or empty it to copy this one)",
                have_ts.0, epoch.0, stamped.0
            );
            return Err(refuse(&stream, reason));
        }
        if let Some(reason) = self.name_taken(&node, &addr, have_ts) {
            return Err(refuse(&stream, reason));
        }
        {
            // Only while a restart waits, which alone reads them: the list would
            // otherwise grow by a name at every backup (or client holding the password)
            // that says a new one, for the primary's life.
            let q = self.quorum.lock();
            if q.waits.is_some() {
                self.heard.lock().insert(node.clone(), (epoch, have_ts));
            }
        }
        // Waiting after a restart: a backup of an older epoch than the one restarted from
        // may hold what an earlier restart lost; a copy would discard it. Refused, it
        // keeps it (and the wait names it). One that holds nothing above where a restart
        // of the chain cut its epoch holds nothing this primary lacks: sent a copy.
        if let (Some(restarts), Some((old, point, _))) = (self.restart_chain(), self.opts.resume_from) {
            if epoch < old && !crate::restart::clear_after_restarts(self.epoch, old, point, &restarts, epoch, have_ts) {
                let reason = format!(
                    "this primary restarted from epoch {} and this backup follows epoch {}, holding up to ts {}: it may hold commits an earlier restart lost, so it is sent no copy while the primary waits for its backups",
                    old.0, epoch.0, have_ts.0
                );
                return Err(refuse(&stream, reason));
            }
        }
        let logger = Arc::clone(self.durable.logger());
        // A backup that counts is recorded before it does (`crate::restart`), off the
        // links' lock (the commit path takes it): its name, and a bound on its slot.
        let record = |slots: usize| {
            self.grow_quorum(Some(&node), slots)
                .map_err(|e| refuse(&stream, format!("the primary could not record its quorum: {e}")))
        };
        if Self::counts(&self.counted_nodes.lock(), &node, learner) {
            // (The count read first: a guard in the call's argument lived through the
            // record's fsync, stalling every commit meanwhile; found by a review.)
            let counted = self.links.lock().iter().filter(|l| !l.learner).count();
            record(counted + 1)?;
        }
        // Register first: from here on every framed batch is queued for this backup.
        let link = loop {
            let links = self.links.lock();
            let taken =
                |s: usize| links.iter().any(|l| l.learner == learner && l.slot == s && !l.gone.load(Ordering::Acquire));
            let slot = (0..).find(|&s| !taken(s)).expect("a free slot");
            // Read again under the links' lock, which `set_counted_nodes` holds as it
            // changes the set and every link's flag. (Recorded above; a node that counts
            // only now, or a slot beyond that bound, taken meanwhile, here.)
            let counts = Self::counts(&self.counted_nodes.lock(), &node, learner);
            // (Not waited for under the links' lock, which the commit path takes: the
            // quorum's lock is held through the record's fsync.)
            let Some(q) = self.quorum.try_lock() else {
                drop(links);
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            let recorded = q.mine.slots > slot && q.mine.backups.contains(&node);
            drop(q);
            if counts && !recorded {
                // Off the lock, and then looked at again.
                drop(links);
                record(slot + 1)?;
                continue;
            }
            // Two Hellos of one name at once both passed `name_taken`: the later is refused.
            if let Some(l) = live_link_named(&links, &node) {
                let reason = format!("{NAME_TAKEN}: backup {node} linked from {} meanwhile", l.addr);
                drop(links);
                return Err(refuse(&stream, reason));
            }
            // Stopped (fenced) meanwhile: `stop` killed the links it saw under this lock,
            // and this one, registered after, would resume and be sent heartbeats for good,
            // its backup never learning that the primary is gone. (Found by a review.)
            if self.stopping.load(Ordering::Acquire) {
                drop(links);
                return Err(refuse(&stream, "the primary is shutting down".to_string()));
            }
            let mut links = links;
            let link = Arc::new(Link {
                node: node.clone(),
                addr: addr.clone(),
                slot,
                gone: AtomicBool::new(false),
                learner,
                counted: AtomicBool::new(counts),
                queue: Mutex::new(Queue {
                    frames: Default::default(),
                    bytes: 0,
                    dead: None,
                    writing: false,
                    spilled: false,
                    direct: None,
                }),
                cv: Condvar::new(),
                received: AtomicU64::new(0),
                durable: AtomicU64::new(0),
                replayed: AtomicU64::new(0),
                since: Instant::now(),
                dozing: AtomicBool::new(false),
                sent_directly_us: AtomicU64::new(0),
                sock: stream.try_clone().ok(),
                heard_us: AtomicU64::new(NEVER_ACKED),
                lease_us: AtomicU64::new(0),
                asked_from: AtomicU64::new(NOTHING_ASKED),
                phase: Default::default(),
                copy_sent: AtomicU64::new(0),
                copy_total: AtomicU64::new(0),
            });
            links.push(Arc::clone(&link));
            break link;
        };
        // A panic in it (a bug: in the listener `changed` calls, say) ends the link as an
        // error does, so the backup connects again at once. (Before 2026-12-04 it ended
        // the thread with the link still listed for good, never shipped to again; its
        // backup, hearing nothing, linked again after its silence timeout. Found by a
        // review.)
        let served = ditto_engine::catch_panic(|| self.serve_link(&stream, reader, &link, epoch, have_ts, &logger))
            .unwrap_or_else(|m| Err(std::io::Error::other(format!("the link's thread panicked: {m}"))));
        let out = served.map_err(|e| {
            let stalled = matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
            match link.starting() && stalled {
                true => std::io::Error::other(format!(
                    "backup {node} read nothing of its start (a checkpoint copy, or the log from disk) for {:?}: given up",
                    self.opts.start_stall_max
                )),
                false => e,
            }
        });
        link.kill("link closed".into());
        // Recorded as gone before it leaves the links: a checkpoint's `log_needed_above`
        // between the two would have seen neither, and deleted the log this backup would
        // resume from (it then needed a whole copy; found by a review, 2026-12-06). While
        // it is in both, its link's point counts and the record's is passed over.
        if link.counted.load(Ordering::Acquire) && link.heard_us.load(Ordering::Acquire) != NEVER_ACKED {
            self.gone.lock().insert(link.node.clone(), link.durable.load(Ordering::Acquire));
        }
        self.links.lock().retain(|l| !Arc::ptr_eq(l, &link));
        self.changed();
        let _ = stream.shutdown(std::net::Shutdown::Both);
        out
    }

    /// Why a backup named `node` (connecting from `addr`) is refused because a live link
    /// has its name; `None` if none has. Two backups sharing a name count as one in the
    /// quorum's record (`crate::restart`): a primary restarted would take either's word for
    /// what the other acknowledged. So a name linked and heard from within
    /// `NAME_HELD_SILENCE` (or never yet: a copy under way) is refused. A link silent for
    /// longer is taken for this backup's own connection, dead without the primary having
    /// seen it (a half-open connection): it is closed, and the backup, refused this once,
    /// connects again. A link closing already (a backup that drops its link and connects at
    /// once: a learner promoted, a process restarted) is waited for, up to `NAME_FREED_WAIT`.
    fn name_taken(&self, node: &str, addr: &str, have_ts: Ts) -> Option<String> {
        let end = Instant::now() + NAME_FREED_WAIT;
        let old = loop {
            let live = live_link_named(&self.links.lock(), node).cloned();
            match live {
                Some(l) if Instant::now() < end => drop(l),
                other => break other?,
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        // The backup closed that connection (it gave up waiting for its welcome, say, while
        // the primary wrote a checkpoint): nothing reads it before the welcome, so the link
        // does not know yet. Closed here, and this Hello is let through.
        if old.sock.as_ref().is_some_and(peer_closed) {
            old.kill(format!("backup {node} connected again (from {addr}) and had closed this connection"));
            return None;
        }
        let heard = old.heard_us.load(Ordering::Acquire);
        let silent = match heard {
            NEVER_ACKED => None,
            us => Some(old.since.elapsed().saturating_sub(Duration::from_micros(us))),
        };
        // A link silent for longer than a live backup ever is (its own silence bound is
        // `backup::SILENCE_MAX`) is taken for this backup's own, half-open: closed, if this
        // Hello holds at least what that link acknowledged as durable (a copy starting
        // afresh, `have_ts` 0, is more likely another backup of that name).
        let same_backup = have_ts.0 >= old.durable.load(Ordering::Acquire);
        match silent {
            Some(silent) if silent >= NAME_HELD_SILENCE && same_backup => {
                let ms = silent.as_millis();
                old.kill(format!(
                    "backup {node} connected again (from {addr}); its link from {}, silent for {ms} ms, is closed",
                    old.addr
                ));
                tracing::warn!(
                    "backup {node} connected again from {addr}: its older link from {}, silent for {ms} ms, is closed",
                    old.addr
                );
                Some(format!(
                    "{NAME_TAKEN}: its older link from {}, silent for {ms} ms, is being closed; connect again",
                    old.addr
                ))
            }
            _ => {
                let heard = silent.map_or("not yet acknowledged anything".to_string(), |d| {
                    format!("was heard from {} ms ago", d.as_millis())
                });
                Some(format!(
                    "{NAME_TAKEN}: backup {node} is linked from {} and {heard}. If that is this backup's own older connection, the primary closes it once it has been silent for {} s; if it is another backup, give each its own --replica-name (two backups sharing a name would count as one in this primary's quorum)",
                    old.addr,
                    NAME_HELD_SILENCE.as_secs()
                ))
            }
        }
    }

    fn serve_link(
        self: &Arc<Self>,
        stream: &TcpStream,
        reader: BufReader<TcpStream>,
        link: &Arc<Link>,
        epoch: Epoch,
        have_ts: Ts,
        logger: &ditto_log::Logger,
    ) -> std::io::Result<()> {
        let db = self.durable.db();
        // A backup that reads nothing of its start for so long is given up.
        stream.set_write_timeout(Some(self.opts.start_stall_max))?;
        let reg_clock = db.clock().now();
        // Everything framed before the registration must be durable (so a gap read from
        // disk holds it) and installed (so a checkpoint holds it). A heartbeat a second
        // meanwhile, and while the gap is read below (`saying_alive`): a backup waits 5 s
        // for a word, then gives up and asks again.
        let mut beats = stream.try_clone()?;
        saying_alive(&mut beats, None, || {
            wait_logged(logger, link, reg_clock, || db.clock().visible_ts() >= reg_clock, "the registration")
        })?;
        // What the log is read from: above what the backup holds, or (a backup of the
        // epoch this one was recovered from, holding exactly its cut) above this epoch's
        // start, since nothing lies between the two.
        // A backup of this very epoch that holds less than the recovered point: it was
        // welcomed into this epoch as one of the recovered epoch behind the point, and its
        // link dropped while the sealed part of its start was sent, before every stream had
        // it. This epoch's log alone begins above the point and vouches for nothing below
        // it: a gap read from it skipped the rest of the sealed part, and its vouch then
        // covered the hole (found by a review, 2026-12-03). It is served as it was at first.
        let below_point = epoch == self.epoch && self.opts.resume_from.is_some_and(|(_, p, _)| have_ts < p);
        let from = match self.opts.resume_from {
            _ if epoch == self.epoch && !below_point => Some(have_ts),
            Some((e, p, start)) if (e, p) == (epoch, have_ts) => Some(start.max(have_ts)),
            _ => None,
        };
        let dir = self.durable.dir();
        // A backup of the epoch this one opened from that holds more than its cut (what the
        // old primary had not made durable when it died): it is told to cut there and ask
        // again (`Start::CutAt`), and is then resumed from the log, not sent a copy.
        // Told to cut even where this epoch's log no longer reaches down to the point (or
        // cannot be read), so that the backup decides from what it knows was acknowledged
        // whether it may: sent a copy at once instead, it discarded what it held above the
        // point, acknowledged or not, and its next hello (holding nothing) counted as clear
        // for a waiting restart (found by a review, 2026-12-03). Cut, it asks again from
        // the point, and is sent a copy then if the log cannot serve it.
        if let Some((_, point, _)) = self.opts.resume_from.filter(|&(e, p, _)| e == epoch && have_ts > p) {
            tracing::info!(
                "backup {} at {}: holds up to ts {} of epoch {}, above this epoch's start at ts {}: told to cut there",
                link.node,
                link.addr,
                have_ts.0,
                epoch.0,
                point.0
            );
            let tables = logger.catalog_tables().into_iter().map(|(id, n)| (id.0, n)).collect();
            let welcome = Frame::Welcome {
                epoch: self.epoch,
                streams: logger.streams() as u32,
                tables,
                start: Start::CutAt { point },
                database: self.database.to_wire(),
                run: self.run,
            };
            return (&*stream).write_all(&welcome.encode());
        }
        if have_ts > Ts::ZERO {
            link.asked_from.store(from.unwrap_or(have_ts).0, Ordering::Release);
        }
        // Read from disk before the welcome (the whole of a large kept log may be read):
        // a heartbeat a second meanwhile, as while a checkpoint is written for a join, so
        // that the backup, which waits 5 s for a word, does not give up and ask again for
        // the same read (found by a review, 2026-12-03).
        let gap = saying_alive(&mut beats, None, || {
            Ok(if let Some(from) = from.filter(|_| have_ts > Ts::ZERO) {
                // A log that cannot be read whole (a damaged segment: a hole) is not sent: the
                // backup is sent a checkpoint instead.
                ditto_log::replica::batches_after(dir, self.epoch, from).unwrap_or_else(|e| {
                    tracing::warn!("the log above ts {} cannot be read whole ({e}): a checkpoint is sent", from.0);
                    None
                })
            } else {
                match self.opts.resume_from {
                    // A backup of the recovered epoch that held less than its point (the old
                    // primary's last batches had not all reached it): what this node's replica
                    // log, sealed at the point, holds above what it has, cut at the point, then
                    // this epoch's log (docs/cluster.md).
                    Some((e, p, start)) if (e == epoch || below_point) && have_ts < p && have_ts > Ts::ZERO => {
                        // A damaged sealed log is only a shortcut lost: the backup is sent a
                        // checkpoint instead (never a gap that skips what the damage hides).
                        let sealed = ditto_log::replica::sealed_gap_above(dir, have_ts, p).unwrap_or_else(|e| {
                        tracing::warn!(
                            "backup {} at {addr}: its gap cannot come from the sealed log ({e}); it is sent a checkpoint",
                            link.node,
                            addr = link.addr
                        );
                        None
                    });
                        let own =
                            ditto_log::replica::batches_after(dir, self.epoch, start.max(p)).unwrap_or_else(|e| {
                                tracing::warn!("this epoch's log cannot be read whole ({e}): a checkpoint is sent");
                                None
                            });
                        sealed.zip(own).map(|(a, b)| b.after_sealed(a))
                    }
                    _ => None,
                }
            })
        })?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, stream.try_clone()?);
        // Acks are read on the server's runtime, or on a thread of their own, from here on:
        // while the start is sent too. The backup acks as it receives and persists it, and
        // unread, its acks filled this side's receive buffer and its own send buffer (a few
        // thousand acks on a network's smaller buffers, seconds of a gap), its receiver
        // then blocked writing one, and the start stalled until this side gave up on it
        // (found by a review, 2026-12-06; loopback's buffers hid it). What they say of a
        // starting backup is what it holds. Ended and waited for however this returns, a
        // panic's unwinding too: `serve` reads the link's figures after it, which the
        // reader must be done moving. (A review found the panic's path reading them with
        // the reader still running.)
        let acks = AcksEnd { sock: stream, acks: Some(self.read_acks(link, reader)?) };
        let tables = |logger: &ditto_log::Logger| {
            logger.catalog_tables().into_iter().map(|(id, n)| (id.0, n)).collect::<Vec<_>>()
        };
        // Everything at or below it is in the start sent (the log above it is read from disk
        // for what the queue drops meanwhile, `catch_up`).
        let start_ends = match gap {
            Some(gap) => {
                tracing::info!(
                    "backup {} at {addr}: resuming above ts {} ({} batches from disk)",
                    link.node,
                    have_ts.0,
                    gap.len(),
                    addr = link.addr
                );
                let welcome = Frame::Welcome {
                    epoch: self.epoch,
                    streams: logger.streams() as u32,
                    tables: tables(logger),
                    start: Start::Resume,
                    database: self.database.to_wire(),
                    run: self.run,
                };
                link.phase.store(PHASE_SENDING, Ordering::Release);
                w.write_all(&welcome.encode())?;
                self.send_gap(&mut w, gap, have_ts, reg_clock)?;
                reg_clock
            }
            None => {
                // Hard links keep the files while a later checkpoint replaces this one; they
                // go on every way out (a failed send, a log unread, a refused write: before,
                // each left its directory, pinning the checkpoint's files until a restart).
                let keep = ShipDir(self.durable.dir().join(format!(
                    "ship-{}-{}{}-{}",
                    std::process::id(),
                    if link.learner { "l" } else { "" },
                    link.slot,
                    // (Its own: a killed link of the same slot may still be leaving its own.)
                    SHIP_DIRS.fetch_add(1, Ordering::Relaxed)
                )));
                let _ = std::fs::remove_dir_all(&keep.0);
                // A recent checkpoint and the log above it (after a failover, the one the
                // new primary writes in the background), or one written for this backup.
                // A heartbeat a second meanwhile, as while a gap is read or a checkpoint
                // written for a join: the recent checkpoint waits for one being written
                // (its turn), and the log above it may be gigabytes, while the backup gives
                // a silent primary up after 5 s and asks again (found by a review,
                // 2026-12-06: each try's thread then read it all again).
                let keep_dir = &keep.0;
                let (recent, above) = saying_alive(&mut beats, None, || {
                    let recent = self.durable.link_recent_checkpoint(keep_dir).map_err(std::io::Error::other)?;
                    // Kept for it: the log above the checkpoint it is sent (none for one
                    // written now, above which it is sent the log live).
                    let asked = recent.as_ref().map_or(NOTHING_ASKED, |(info, _)| info.ts.0);
                    link.asked_from.store(asked, Ordering::Release);
                    // (A log that cannot be read whole, a damaged segment, is not sent: a
                    // checkpoint is written for it instead, as for a resumed backup. Before,
                    // the join failed, and every try again failed the same way.)
                    let above = match &recent {
                        Some((info, _)) => ditto_log::replica::batches_after(self.durable.dir(), self.epoch, info.ts)
                            .unwrap_or_else(|e| {
                                tracing::warn!(
                                    "the log above the recent checkpoint at ts {} cannot be read whole ({e}): a checkpoint is written for backup {}",
                                    info.ts.0,
                                    link.node
                                );
                                None
                            }),
                        None => None,
                    };
                    Ok((recent, above))
                })?;
                let (info, files, above) = match (recent, above) {
                    (Some((info, files)), Some(above)) => (info, files, above),
                    _ => {
                        let _ = std::fs::remove_dir_all(&keep.0);
                        // The log above the registration (so above the checkpoint) is kept
                        // while the copy is sent, for what the queue cannot hold meanwhile.
                        link.asked_from.store(reg_clock.0, Ordering::Release);
                        let info = self.checkpoint_for_a_join(&mut w)?;
                        let files =
                            ditto_log::checkpoint::link_files(&info.dir, &keep.0).map_err(std::io::Error::other)?;
                        (info, files, Gap::default())
                    }
                };
                tracing::info!(
                    "backup {} at {}: sending a checkpoint at ts {} ({} rows, {:.1} MB), then {} batches from disk",
                    link.node,
                    link.addr,
                    info.ts.0,
                    info.rows,
                    info.bytes as f64 / 1e6,
                    above.len()
                );
                let mut files = files;
                // The manifest last: a backup treats the checkpoint as whole only with it.
                files.sort_by_key(|n| (n == "MANIFEST", n.clone()));
                let total = files.iter().filter_map(|n| std::fs::metadata(keep.0.join(n)).ok()).map(|m| m.len()).sum();
                let welcome = Frame::Welcome {
                    epoch: self.epoch,
                    streams: logger.streams() as u32,
                    tables: tables(logger),
                    start: Start::Checkpoint { ts: info.ts, bytes: total },
                    database: self.database.to_wire(),
                    run: self.run,
                };
                self.checkpoints_sent.fetch_add(1, Ordering::Relaxed);
                link.copy_total.store(total, Ordering::Release);
                link.phase.store(PHASE_SENDING, Ordering::Release);
                w.write_all(&welcome.encode())?;
                let sent = send_files(&mut w, &keep.0, &files, &link.copy_sent);
                drop(keep);
                sent?;
                w.write_all(&Frame::CheckpointDone { ts: info.ts }.encode())?;
                // The log above a reused checkpoint, as a resumed backup's gap is sent (for
                // one written now, at or above the registration, there is none).
                self.send_gap(&mut w, above, info.ts, reg_clock)?;
                info.ts.max(reg_clock)
            }
        };
        w.flush()?;
        // Silence is counted from here for a backup that has not acknowledged yet.
        let acks_from = link.since.elapsed();
        self.changed();
        // What the queue dropped meanwhile, then live: a frame shipped while nothing waits
        // here is sent by the thread shipping it.
        if let Err(e) = self.catch_up(stream, &mut w, link, start_ends, logger) {
            drop(acks);
            return Err(e);
        }
        // Send the queue until the link dies.
        let (mut last_released, mut last_acknowledged) = (Ts::ZERO, Ts::ZERO);
        let mut last_sent = Instant::now();
        // A heartbeat at least this often while idle; with a lease, whatever else is sent.
        let beat_every = self.opts.lease_beat.map_or(IDLE_HEARTBEAT, |d| d.min(IDLE_HEARTBEAT));
        let mut last_beat = Instant::now();
        // Since when nothing was queued and nothing moved (a link dozes after `LINK_DOZE_AFTER`).
        let mut still_since = Instant::now();
        // What the last turn took from the queue: counted against its bound until written
        // and flushed, so that a backup reading slowly holds at most `queue_bytes_max` here,
        // queued and being written together (before, the queue filled again to the bound
        // while a full turn was written: twice the bound).
        let mut taken = 0;
        // (A failed write ends the loop, not the function: the acks' reader is joined
        // below before the link's figures are read as it ends.)
        let result = 'live: loop {
            let frames: Vec<Bytes> = {
                let mut q = link.queue.lock();
                q.writing = false;
                // (A link killed meanwhile counts nothing.)
                q.bytes = q.bytes.saturating_sub(std::mem::take(&mut taken));
                if q.frames.is_empty() && q.dead.is_none() {
                    let due = beat_every.saturating_sub(last_sent.elapsed());
                    // Frames sent on the socket by other threads (`push_to`, at once) keep
                    // it awake too: dozing under steady traffic would have each move of
                    // the release sent on its own (`set_released`).
                    let sent_directly = link
                        .since
                        .elapsed()
                        .saturating_sub(Duration::from_micros(link.sent_directly_us.load(Ordering::Relaxed)));
                    if still_since.elapsed() < LINK_DOZE_AFTER || sent_directly < LINK_DOZE_AFTER || due.is_zero() {
                        link.cv.wait_for(&mut q, self.opts.heartbeat);
                    } else {
                        // Dozing: until frames are queued (`push_to` wakes it), the release
                        // moves (`set_released` does), or the idle heartbeat is due; not a
                        // poll every `heartbeat` (a thousand wake-ups a second, idle). The
                        // count goes up before the release is looked at again, and the
                        // release is stored before the count is read, both sequentially
                        // consistent: a move this misses wakes it, under this lock.
                        self.dozing_links.fetch_add(1, Ordering::SeqCst);
                        link.dozing.store(true, Ordering::SeqCst);
                        let released = Ts(self.released.load(Ordering::SeqCst));
                        if released == last_released && self.acknowledged().max(released) == last_acknowledged {
                            link.cv.wait_for(&mut q, due);
                        }
                        link.dozing.store(false, Ordering::SeqCst);
                        self.dozing_links.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                if let Some(why) = &q.dead {
                    break Err(std::io::Error::other(why.clone()));
                }
                // Until the next turn, what this thread writes goes out alone.
                q.writing = true;
                taken = q.bytes;
                q.frames.drain(..).collect()
            };
            let heard_us = link.heard_us.load(Ordering::Acquire);
            if let Some(why) = too_silent(heard_us, acks_from, link.since.elapsed(), self.opts.ack_silence_max) {
                break Err(std::io::Error::other(why));
            }
            for f in &frames {
                if let Err(e) = w.write_all(f) {
                    break 'live Err(e);
                }
            }
            let released = self.released();
            let acknowledged = self.acknowledged().max(released);
            // A heartbeat when the release moved, and at least every IDLE_HEARTBEAT, so a
            // backup can tell an idle primary from a gone one (backup::SILENCE_MAX).
            if !frames.is_empty() || released > last_released || acknowledged > last_acknowledged {
                still_since = Instant::now();
            }
            if released > last_released
                || acknowledged > last_acknowledged
                || (frames.is_empty() && last_sent.elapsed() >= beat_every)
                || self.opts.lease_beat.is_some_and(|d| last_beat.elapsed() >= d)
            {
                let beat = Frame::Heartbeat { released, acknowledged, sent_us: self.now_us() };
                if let Err(e) = w.write_all(&beat.encode()) {
                    break Err(e);
                }
                (last_released, last_acknowledged) = (released, acknowledged);
                last_beat = Instant::now();
            } else if frames.is_empty() {
                continue;
            }
            last_sent = Instant::now();
            if let Err(e) = w.flush() {
                break Err(e);
            }
        };
        drop(acks);
        result
    }

    /// Sends `link` what its queue dropped while its start was sent (`Queue::spilled`):
    /// the log above `from` (everything at or below it was in the start), read from disk
    /// after the queue takes frames again, as a resumed backup's gap is; again while the
    /// queue spills during that. Then takes the link live, under the queue's lock. The log
    /// above `from` was kept for it (`asked_from`, `log_needed_above`) up to the bound on
    /// the log kept for backups: past it, the link ends saying so, and the backup starts
    /// again from what it holds.
    fn catch_up(
        &self,
        stream: &TcpStream,
        w: &mut impl Write,
        link: &Link,
        mut from: Ts,
        logger: &ditto_log::Logger,
    ) -> std::io::Result<()> {
        let clock = self.durable.db().clock();
        loop {
            {
                let mut q = link.queue.lock();
                if let Some(why) = &q.dead {
                    return Err(std::io::Error::other(why.clone()));
                }
                if !q.spilled {
                    stream.set_write_timeout(None)?;
                    q.direct = Some(stream.try_clone()?);
                    link.phase.store(PHASE_ONLINE, Ordering::Release);
                    return Ok(());
                }
                // Queued again from here: everything framed before is read from disk below.
                q.spilled = false;
            }
            self.catch_up_rounds.fetch_add(1, Ordering::Relaxed);
            link.phase.store(PHASE_CATCHING_UP, Ordering::Release);
            let reg = clock.now();
            let read = || {
                wait_logged(logger, link, reg, || true, "the catch-up's start")?;
                match ditto_log::replica::batches_after(self.durable.dir(), self.epoch, from) {
                    Ok(Some(gap)) => Ok(gap),
                    Ok(None) => Err(std::io::Error::other(format!(
                        "the log above ts {} that backup {} missed while its start was sent is gone (past the log kept for backups, log_keep_for_backups_mb): it starts again from what it holds",
                        from.0, link.node
                    ))),
                    Err(e) => Err(std::io::Error::other(format!(
                        "the log above ts {} that backup {} missed while its start was sent cannot be read whole ({e}): it starts again from what it holds",
                        from.0, link.node
                    ))),
                }
            };
            // (Read on a thread of its own, the backup told meanwhile that the link lives:
            // a long log is checked whole before it is sent.)
            w.flush()?;
            // (A live backup: its acks meanwhile count for the lease.)
            let now_us = || self.now_us();
            let gap = saying_alive(w, self.opts.lease_beat.map(|d| (d, &now_us as &dyn Fn() -> u64)), read)?;
            // Tables created meanwhile: their frames were dropped with the rest, and the
            // catalog, not the log, holds them (each is in it before a batch writes it, so
            // read after the gap it holds every table the gap writes; a backup takes one
            // it has again). Read before the gap, a table created between the two had its
            // frame queued behind the gap that wrote it, and the backup's replay failed.
            for (id, name) in logger.catalog_tables() {
                w.write_all(&Frame::Table { id: id.0, name }.encode())?;
            }
            tracing::info!(
                "backup {} at {}: the log written while its start was sent passed its queue ({} MiB); sending it from disk above ts {} ({} batches)",
                link.node,
                link.addr,
                self.opts.queue_bytes_max >> 20,
                from.0,
                gap.len()
            );
            self.send_gap(w, gap, from, reg)?;
            w.flush()?;
            // Everything at or below `reg` was durable before the gap was read, so in it.
            from = reg;
            link.asked_from.store(from.0, Ordering::Release);
        }
    }

    /// Reads `link`'s acknowledgements (from `reader`, the connection after its `Hello`)
    /// until the backup goes, then ends the link. On `PrimaryOptions::acks_on`'s runtime,
    /// an ack that releases commits wakes their connections on the thread that read it,
    /// with no hand-off; otherwise on a thread of their own.
    fn read_acks(self: &Arc<Self>, link: &Arc<Link>, reader: BufReader<TcpStream>) -> std::io::Result<AckReader> {
        let (me, l2) = (Arc::clone(self), Arc::clone(link));
        if let Some(rt) = &self.opts.acks_on {
            let (buffered, sock) = (reader.buffer().to_vec(), reader.into_inner());
            let (done, ended) = std::sync::mpsc::channel::<()>();
            // Made before the task: one dropped unpolled (its runtime shut down) still ends
            // the link, which would otherwise go on with no one reading its acks.
            let mut ending = KillOnDrop(Some(Arc::clone(&l2)));
            rt.spawn(async move {
                // Dropped with the task, however it ends (the link's thread waits for it).
                let _done = done;
                let why = read_acks_async(sock, buffered, |f| me.take_ack(&l2, f), || me.acks_read()).await;
                ending.0.take().expect("set above").kill(why);
            });
            return Ok(AckReader::Task(ended));
        }
        let thread = std::thread::Builder::new().name("ditto-repl-acks".into()).spawn(move || {
            ditto_log::sched::link_thread();
            let mut reader = reader;
            // A panic (a bug: in the listener `acks_read` calls, say) ends the link as a
            // broken connection does. (Before 2026-12-04 it ended this thread alone: the
            // link shipped on with its acks unread, and a commit policy counting it stalled
            // for good. The runtime's task is ended by its `KillOnDrop`.)
            let why = ditto_engine::catch_panic(|| loop {
                match read_frame_at_most(&mut reader, crate::protocol::BACKUP_FRAME_BYTES_MAX) {
                    Ok(Some(f)) => {
                        if let Some(why) = me.take_ack(&l2, f) {
                            break why;
                        }
                        // Once per read's worth of acks.
                        if reader.buffer().is_empty() {
                            me.acks_read();
                        }
                    }
                    Ok(None) => break "the backup closed the connection".into(),
                    Err(e) => break format!("reading acks: {e}"),
                }
            })
            .unwrap_or_else(|m| format!("the thread reading acks panicked: {m}"));
            // A link thread blocked writing to a backup that reads no more is let go.
            let _ = reader.get_ref().shutdown(std::net::Shutdown::Both);
            l2.kill(why);
        })?;
        Ok(AckReader::Thread(thread))
    }

    /// A frame from `link`'s backup: an ack is recorded (the caller then calls `changed`,
    /// once for all it read at once); any other ends the link, for the reason returned.
    fn take_ack(&self, link: &Link, f: Frame) -> Option<String> {
        match f {
            Frame::Ack { received, durable, replayed, echo_us } => {
                // No more than this primary's clock: a commit waiting for its release has a
                // timestamp at or below it, so the cap takes nothing from one, while an ack
                // naming more (a backup's bug; a tail of an older epoch that a failover
                // cut) would otherwise count now for commits not yet made, releasing them
                // on receipt by no one.
                let clock = self.durable.db().clock().now().0;
                link.received.fetch_max(received.0.min(clock), Ordering::AcqRel);
                link.durable.fetch_max(durable.0.min(clock), Ordering::AcqRel);
                link.replayed.fetch_max(replayed.0.min(clock), Ordering::AcqRel);
                link.heard_us.store(link.since.elapsed().as_micros() as u64, Ordering::Release);
                // (Heard as of when it sent what the backup had seen: never later than now.)
                link.lease_us.fetch_max(echo_us.min(self.now_us()), Ordering::AcqRel);
                None
            }
            Frame::Refuse { reason } => Some(format!("the backup refused: {reason}")),
            f => Some(format!("unexpected frame from the backup: {f:?}")),
        }
    }

    /// Sends batches read back from this primary's log to a backup that holds everything
    /// up to `have_ts` (a resumed backup's gap, or the log above a checkpoint it was sent).
    /// The gap is read from disk a batch at a time as it is sent, its streams merged in
    /// timestamp order (`Gap::for_each_ahead_of`).
    ///
    /// The gap's floors are not trusted (not in framing order), so an idle stream would
    /// hold the backup's watermark until it writes again; while writers wait on that
    /// watermark, it never would. Everything at or below the registration clock was durable
    /// before the gap was read, so it is all in the gap: an empty batch vouches for it at
    /// the end (and is persisted like any, so the backup's own recovery sees it too). On the
    /// way, every `GAP_VOUCH_EVERY` batches, an empty batch vouches for what the merge has
    /// sent (everything below the next batch's key, up to the registration clock): a
    /// replayer waiting for a reused id's old life (`BatchHeader::reuse_ts`) needs an idle
    /// stream vouched for, and without these waited, the rest of the gap held in its
    /// memory, until the end; a link dropped in the middle resumes from there too.
    fn send_gap(&self, w: &mut impl Write, gap: Gap, have_ts: Ts, reg_clock: Ts) -> std::io::Result<()> {
        let mut vouches = GapVouches { sent: 0, vouched: have_ts, reg_clock };
        let vouch = |w: &mut dyn Write, upto: Ts| -> std::io::Result<()> {
            let mut frame = Vec::new();
            ditto_log::format::BatchBuilder::new().finish_vouching_into(
                ditto_log::StreamId(0),
                self.epoch,
                upto,
                upto,
                false,
                &mut frame,
            );
            w.write_all(&crate::protocol::encode_batch(self.epoch, self.released(), self.flags(true), &frame))
        };
        // A cluster primary's heartbeat, with its time, between the batches every beat: a
        // backup's acks of a long gap then count for the lease (a released watermark that
        // moves nothing it would not learn live).
        let mut beat_at = Instant::now();
        gap.for_each_ahead_of(|b, ahead| {
            let flags = self.flags(false);
            w.write_all(&crate::protocol::encode_batch(self.epoch, self.released(), flags, &b))?;
            if self.opts.lease_beat.is_some_and(|d| beat_at.elapsed() >= d) {
                beat_at = Instant::now();
                w.write_all(&self.heartbeat(self.released()).encode())?;
            }
            match vouches.after(ahead) {
                Some(upto) => vouch(w, upto),
                None => Ok(()),
            }
        })?;
        match vouches.last() {
            Some(upto) => vouch(w, upto),
            None => Ok(()),
        }
    }

    /// Stops accepting backups (links close with the process).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        for l in self.links.lock().iter() {
            l.kill("the primary is shutting down".into());
        }
        // The accept thread sees `stopping` at its next connection: one is made, and the
        // thread, which drops the listener as it returns, waited for (bounded: a thread
        // that does not end in a second is left, its port with it).
        let Some((mut addr, accept)) = self.accept.lock().take() else { return };
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200));
        let end = std::time::Instant::now() + Duration::from_secs(1);
        while !accept.is_finished() && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        if accept.is_finished() {
            let _ = accept.join();
        }
    }
}

/// Waits (up to 10 s and two of the log's intervals, or until `link` is killed) until
/// `logger` is durable up to `upto` and `also` holds: what was framed before a link's queue
/// took frames (its registration, a catch-up's start) is then on disk, for a gap read from
/// it. `what` names the point. (10 s alone before 2026-12-06: under an `interval` of more
/// than that, up to 60 s, a join timed out at most tries; found by a review.)
fn wait_logged(
    logger: &ditto_log::Logger,
    link: &Link,
    upto: Ts,
    also: impl Fn() -> bool,
    what: &str,
) -> std::io::Result<()> {
    let interval = logger.durability().interval().unwrap_or(Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(10) + 2 * interval;
    while logger.watermark() < upto || !also() {
        if Instant::now() > deadline || link.gone.load(Ordering::Acquire) {
            return Err(std::io::Error::other(format!("the log did not become durable up to {what}")));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// Sends checkpoint files `files` of `dir`, counting the bytes sent in `sent`.
fn send_files(w: &mut impl Write, dir: &Path, files: &[String], sent: &AtomicU64) -> std::io::Result<()> {
    use std::io::Read;
    const CHUNK: usize = crate::protocol::FILE_CHUNK_MAX;
    // A chunk at a time: a part (64 MiB by default, larger if configured) is never held
    // whole, once per joining backup.
    let mut buf = vec![0u8; CHUNK];
    for name in files {
        if name.len() > crate::protocol::FILE_NAME_MAX {
            return Err(std::io::Error::other(format!(
                "a checkpoint file's name of {} bytes is too long to send",
                name.len()
            )));
        }
        let path: PathBuf = dir.join(name);
        let mut file = std::fs::File::open(&path)?;
        let len = file.metadata()?.len();
        let mut off = 0u64;
        loop {
            let n = (len - off).min(CHUNK as u64) as usize;
            file.read_exact(&mut buf[..n])?;
            let last = off + n as u64 == len;
            let f = Frame::File { name: name.clone(), offset: off, data: Bytes::copy_from_slice(&buf[..n]), last };
            w.write_all(&f.encode())?;
            sent.fetch_add(n as u64, Ordering::Relaxed);
            off += n as u64;
            if last {
                break;
            }
        }
    }
    Ok(())
}

impl Primary {
    /// Writes a checkpoint to send a joining backup, telling it every second meanwhile
    /// that the welcome is coming (a heartbeat before the welcome, which it skips): it waits
    /// only `backup::SILENCE_MAX` (5 s) for a word, and a checkpoint of gigabytes takes
    /// longer (before, it reconnected every 5 s, and a starting backup gave up after 60).
    fn checkpoint_for_a_join(&self, w: &mut impl Write) -> std::io::Result<ditto_log::CheckpointInfo> {
        let info = saying_alive(w, None, || self.durable.checkpoint().map_err(std::io::Error::other))?;
        // (The checkpoint stays for the next join to reuse if this backup left.)
        Ok(info)
    }
}

/// Runs `f` on a thread of its own, telling the backup on `w` every second meanwhile that
/// the link is alive (it gives a silent primary up after `backup::SILENCE_MAX`, 5 s): a
/// heartbeat that moves nothing (before its welcome, it skips it). With `lease` (a cluster
/// primary's beat and clock), every beat, carrying its time: a live backup's acks meanwhile
/// (a catch-up's) then echo a recent one, and count for the lease.
fn saying_alive<T: Send>(
    w: &mut impl Write,
    lease: Option<(Duration, &dyn Fn() -> u64)>,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    let every = lease.map_or(Duration::from_secs(1), |(d, _)| d);
    std::thread::scope(|s| {
        // Its end is told at once, not found at the next look: a look every 10 ms made
        // every call take 10 ms at least, a backup's join among them (after a failover,
        // the new primary's first commit waited for it; before 2026-12-06).
        let (ended, end) = std::sync::mpsc::channel::<()>();
        let working = s.spawn(move || {
            let out = f();
            let _ = ended.send(());
            out
        });
        let mut said = Instant::now();
        let mut told = Ok(());
        loop {
            // (Disconnected: `f` panicked, and its sender went with it.)
            if !matches!(
                end.recv_timeout(every.min(Duration::from_millis(10))),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            ) {
                break;
            }
            if told.is_ok() && said.elapsed() >= every {
                let sent_us = lease.map_or(0, |(_, now_us)| now_us());
                let beat = Frame::Heartbeat { released: Ts::ZERO, acknowledged: Ts::ZERO, sent_us };
                told = w.write_all(&beat.encode()).and_then(|()| w.flush());
                said = Instant::now();
            }
        }
        // (Its panic goes on here, its own payload: the link's catch says what it said.)
        let out = working.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        told.map(|()| out)
    })
}

/// A directory of hard links to a checkpoint's files kept for one backup's copy, removed
/// when dropped.
struct ShipDir(PathBuf);

impl Drop for ShipDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Numbers each link's directory of checkpoint files being sent (`ship-PID-SLOT-N`).
static SHIP_DIRS: AtomicU64 = AtomicU64::new(0);

/// Removes what a process that ended mid-send left in `dir`: the `ship-PID-SLOT`
/// directories of checkpoint files linked for a joining backup (each link removes its own
/// when it is done, but not if its process was killed meanwhile, and the next process has
/// another pid, so they stayed for good, each pinning a whole checkpoint's files). Those
/// of this process are its own links' (a role changed in place): left alone.
fn remove_stale_ship_dirs(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let me = std::process::id().to_string();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("ship-")) else { continue };
        if rest.split('-').next().is_some_and(|pid| pid != me) && e.path().is_dir() {
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => tracing::info!("removed {}, left by a process that ended mid-send", e.path().display()),
                Err(err) => tracing::warn!("could not remove {}: {err}", e.path().display()),
            }
        }
    }
}

/// The link of backup `node` not closed yet, if any (`Primary::name_taken`).
fn live_link_named<'a>(links: &'a [Arc<Link>], node: &str) -> Option<&'a Arc<Link>> {
    links.iter().find(|l| l.node == node && l.queue.lock().dead.is_none())
}

/// What a `Refuse` begins with when a live link has the backup's name
/// (`Primary::name_taken`); a backup tries again for a while (`backup::NAME_TAKEN_WAIT`).
pub const NAME_TAKEN: &str = "this backup's name is taken";
/// How a refusal for a missing or wrong password begins.
pub const AUTH_REFUSED: &str = "authentication failed";
/// The largest `Hello` a primary reads (a name and a password): a peer that has not said
/// who it is makes the primary allocate no more than this.
const HELLO_BYTES_MAX: usize = 64 << 10;

/// The longest name a backup may give in its hello (an address, or a data directory's path).
pub const BACKUP_NAME_MAX: usize = 4096;

/// The longest a connection to the replication port may take to say its hello, in all.
const HELLO_WAIT_MAX: Duration = Duration::from_secs(10);

/// Most connections to the replication port whose hello has not been read yet.
pub const UNHELLOED_MAX: usize = 64;
/// Most of those from one address.
pub const UNHELLOED_PER_ADDRESS_MAX: usize = 8;

/// A link heard from within this long is a live backup's: an idle link is heard at every
/// heartbeat (`IDLE_HEARTBEAT`), a busy backup whose replay or disk stalls may be silent
/// for longer, and a backup gives up on a silent primary after `backup::SILENCE_MAX` (5 s),
/// so its own half-open link is older than this when it connects again.
const NAME_HELD_SILENCE: Duration = Duration::from_secs(4);
/// How long a backup's Hello waits for a link of its name that is closing already.
const NAME_FREED_WAIT: Duration = Duration::from_millis(50);

/// A link with nothing queued and no move of the release for this long dozes until the
/// next idle heartbeat, or until woken (`Primary::serve_link`).
const LINK_DOZE_AFTER: Duration = Duration::from_millis(50);

/// An idle link sends a heartbeat at least this often.
pub const IDLE_HEARTBEAT: Duration = Duration::from_millis(200);

/// How often a cluster primary's links beat (`PrimaryOptions::lease_beat`): its supervisor
/// counts a backup heard if its acks echo a heartbeat sent within 50 ms of its probe
/// (`HEARD_STAMP_SLACK_MS` in the cluster crate), so a beat well inside that.
pub const LEASE_HEARTBEAT: Duration = Duration::from_millis(10);

/// `PrimaryOptions::ack_silence_max` by default: fifty idle heartbeats, twice the silence
/// after which a backup gives its primary up (`backup::SILENCE_MAX`). PostgreSQL's
/// `wal_sender_timeout` does the same at 60 s by default. (Before 2026-12-05 a link lasted
/// until TCP gave up, up to about 15 minutes for a backup gone without a FIN while
/// heartbeats kept data unacknowledged: its last `received` counted in the quorum all
/// that time, though its memory was gone; found by a review.)
pub const ACK_SILENCE_MAX: Duration = Duration::from_secs(10);

/// Why a live link ends for its backup's silence, if it does: nothing heard for more than
/// `max`, counted from the last acknowledgement (`heard_us`, microseconds after the link
/// began, or `NEVER_ACKED`) or, before the first, from when its acks began to be read
/// (`acks_from`); `now` on the same clock.
fn too_silent(heard_us: u64, acks_from: Duration, now: Duration, max: Duration) -> Option<String> {
    let heard = match heard_us {
        NEVER_ACKED => acks_from,
        us => Duration::from_micros(us).max(acks_from),
    };
    let silent = now.saturating_sub(heard);
    (silent > max).then(|| {
        format!(
            "no acknowledgement from the backup for {:.1} s (the limit is {:.1} s): gone without closing its \
             connection, or stuck; it resumes from what it holds when it connects again",
            silent.as_secs_f64(),
            max.as_secs_f64()
        )
    })
}

/// Lag samples at most this close together.
const LAG_SAMPLE_EVERY: Duration = Duration::from_micros(100);
/// At most this many lag samples (10 s of a backup that replays nothing, at one per 100 us;
/// past it, the oldest go, and the lag reads lower than it is).
const LAG_SAMPLES_MAX: usize = 100_000;

/// Appends a lag sample; at `LAG_SAMPLES_MAX`, the oldest goes and its time is kept on
/// the next, so a backup below both reads its lag from the older time: higher than the
/// truth by at most the gap between them, never lower. (Dropped outright until
/// 2026-12-07: a backup stuck for longer than the samples' span, about 10 s under steady
/// load, read that span as its lag for good; found by a review.)
fn push_sample(s: &mut std::collections::VecDeque<(Ts, Instant)>, bound: Ts, now: Instant) {
    if s.len() >= LAG_SAMPLES_MAX {
        if let Some((_, oldest)) = s.pop_front() {
            if let Some(next) = s.front_mut() {
                next.1 = oldest;
            }
        }
    }
    s.push_back((bound, now));
}

/// How long the oldest sample above `held` has waited at `now`: zero if none is above it.
fn lag_since(samples: &std::collections::VecDeque<(Ts, Instant)>, held: Ts, now: Instant) -> Duration {
    let i = samples.partition_point(|(ts, _)| *ts <= held);
    samples.get(i).map_or(Duration::ZERO, |(_, at)| now.saturating_duration_since(*at))
}

/// What reads a link's acks (`Primary::read_acks`).
enum AckReader {
    Thread(std::thread::JoinHandle<()>),
    /// Disconnected once the task has ended (or was dropped with its runtime).
    Task(std::sync::mpsc::Receiver<()>),
}

/// A link's ack reader, which its drop ends (shutting the connection down) and waits for.
struct AcksEnd<'a> {
    sock: &'a TcpStream,
    acks: Option<AckReader>,
}

impl Drop for AcksEnd<'_> {
    fn drop(&mut self) {
        if let Some(a) = self.acks.take() {
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
            a.join();
        }
    }
}

impl AckReader {
    /// Waits until the reader has ended (it ends once the connection is shut down).
    fn join(self) {
        match self {
            AckReader::Thread(t) => {
                let _ = t.join();
            }
            // Bounded: a runtime too busy to run the task's end holds no link thread.
            AckReader::Task(ended) => {
                let _ = ended.recv_timeout(Duration::from_secs(10));
            }
        }
    }
}

/// Ends the link if the task reading its acks is dropped before it ends it (its runtime
/// shut down).
struct KillOnDrop(Option<Arc<Link>>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(l) = self.0.take() {
            l.kill("the runtime reading its acks stopped".into());
        }
    }
}

/// Reads frames from `sock` (after `buffered`, the bytes already read from it) on a tokio
/// runtime, handing each to `take` until it returns why to stop, or the connection ends:
/// the reason. The socket stays in blocking mode for the link's thread, which writes to
/// it: reads here never wait (`MSG_DONTWAIT`), and the runtime says when to read.
async fn read_acks_async(
    sock: TcpStream,
    buffered: Vec<u8>,
    mut take: impl FnMut(Frame) -> Option<String>,
    mut after_read: impl FnMut(),
) -> String {
    // SAFETY: the `TcpStream` owns its descriptor, open and the same until the `AsyncFd`
    // (which owns the stream) is dropped.
    let fd = match unsafe { tokio::io::unix::AsyncFd::register_with_interest(sock, tokio::io::Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => return format!("reading acks: {e}"),
    };
    let mut buf = bytes::BytesMut::from(&buffered[..]);
    let mut chunk = [0u8; 4096];
    let why = loop {
        // Every whole frame read so far, then `after_read` once for them all.
        let mut took = false;
        let ended = loop {
            match crate::protocol::take_frame_at_most(&mut buf, crate::protocol::BACKUP_FRAME_BYTES_MAX) {
                Ok(Some(f)) => match take(f) {
                    Some(why) => break Some(why),
                    None => took = true,
                },
                Ok(None) => break None,
                Err(e) => break Some(format!("reading acks: {e}")),
            }
        };
        if took {
            after_read();
        }
        if let Some(why) = ended {
            break why;
        }
        let mut ready = match fd.readable().await {
            Ok(r) => r,
            Err(e) => break format!("reading acks: {e}"),
        };
        match ready.try_io(|s| recv_without_waiting(s.get_ref(), &mut chunk)) {
            Ok(Ok(0)) if buf.is_empty() => break "the backup closed the connection".into(),
            Ok(Ok(0)) => break format!("reading acks: the connection closed inside a frame ({} bytes)", buf.len()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(Err(e)) => break format!("reading acks: {e}"),
            // Not readable after all: the runtime waits for the next readiness.
            Err(_would_block) => {}
        }
    };
    // A link thread blocked writing to a backup that reads no more is let go.
    let _ = fd.get_ref().shutdown(std::net::Shutdown::Both);
    why
}

/// Reads what `stream`'s socket holds into `buf` without waiting: `WouldBlock` when it
/// holds nothing.
fn recv_without_waiting(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call, and the
    // descriptor is open while `stream` is borrowed.
    let n = unsafe { libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n >= 0 {
        Ok(n as usize)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sends as much of `buf` as `stream`'s socket takes at once, without waiting (and without
/// SIGPIPE on a closed connection): how much it took (0 when its buffer is full).
fn send_without_waiting(stream: &TcpStream, buf: &[u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `buf` is valid for `buf.len()` bytes for the call, and the descriptor is
    // open while `stream` is borrowed.
    let n = unsafe {
        libc::send(stream.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
    };
    if n >= 0 {
        return Ok(n as usize);
    }
    match std::io::Error::last_os_error() {
        e if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
        e if e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
        e => Err(e),
    }
}

/// Whether the peer closed `stream` (an orderly close or a reset), looked at without
/// waiting or taking anything: data it sent and nobody read yet says no.
fn peer_closed(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    // SAFETY: `b` is valid for 1 byte for the call, and the descriptor is open while
    // `stream` is borrowed.
    let n = unsafe { libc::recv(stream.as_raw_fd(), b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            std::io::Error::last_os_error().kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ),
    }
}

/// Tells a backup why it is refused (best effort: it may have gone) and returns the
/// error that ends its connection.
/// How a TLS primary refuses a backup that opened in plaintext, and how a plaintext one
/// says it closed a backup that opened with TLS.
pub const TLS_ONLY: &str = "this primary takes only TLS backups (tls_replication)";
const TLS_ONLY_THERE: &str = "a backup opened with TLS";

fn refuse(stream: &TcpStream, reason: String) -> std::io::Error {
    let _ = (&*stream).write_all(&Frame::Refuse { reason: reason.clone() }.encode());
    std::io::Error::other(reason)
}

/// The quorum's record (`crate::restart`): what the file holds, and this run's own.
struct Quorum {
    dir: Option<std::path::PathBuf>,
    /// On disk (where `dir` is): this run's, merged with the last run's while a restart
    /// waits.
    record: crate::restart::QuorumRecord,
    /// This run's: the server's policy and those connections chose, the most slots.
    mine: crate::restart::QuorumRecord,
    /// What a restart waits by while it waits (the last run's record merged with this
    /// run's at the start, with the backups a person declared lost since); `None` once
    /// settled, or if this start waits for none (`PrimaryOptions::restart_wait`).
    waits: Option<crate::restart::QuorumRecord>,
}

impl Quorum {
    fn start(opts: &PrimaryOptions) -> Quorum {
        let mine = crate::restart::QuorumRecord {
            expected: opts.backups_expected,
            slots: opts.backups_expected,
            policies: opts.policy.into_iter().collect(),
            ..Default::default()
        };
        let (dir, mut record) = match &opts.quorum_record {
            Some((d, r)) => (Some(d.clone()), r.merged(&mine)),
            None => (None, mine.clone()),
        };
        // A restart that waits takes no writes until it settles: the epoch it cut, and
        // where, join the chain of such restarts (`QuorumRecord::restarts`), written with
        // the record before anything is served.
        if let (true, Some((old, point, _))) = (opts.restart_wait, opts.resume_from) {
            record.add_restart(old, point);
        }
        let waits = opts.restart_wait.then(|| record.clone());
        Quorum { dir, record, mine, waits }
    }

    /// Applies `f` to this run's record and to the one on disk, writing the latter first
    /// if it changed; whether backups alone may release a commit now.
    fn change(&mut self, f: impl Fn(&mut crate::restart::QuorumRecord)) -> std::io::Result<bool> {
        let mut record = self.record.clone();
        f(&mut record);
        if record != self.record {
            self.replace(record)?;
        }
        f(&mut self.mine);
        Ok(self.mine.backups_release())
    }

    /// The record on disk becomes `r`, written first where it is kept.
    fn replace(&mut self, r: crate::restart::QuorumRecord) -> std::io::Result<()> {
        if let Some(d) = &self.dir {
            r.write(d)?;
        }
        self.record = r;
        Ok(())
    }
}

struct Tap(std::sync::Weak<Primary>);

impl ditto_log::ShipTap for Tap {
    fn batch(&self, header: &BatchHeader, frame: &[u8], at_once: bool) {
        let Some(p) = self.0.upgrade() else { return };
        {
            let mut s = p.shipped.lock();
            let stream = header.stream.0 as usize;
            // A heartbeat that moves nothing shipped so far (its bound not above its
            // stream's, its floor not above the watermark: it was framed for this disk's
            // watermark) is not sent: every backup would skip it, having received all
            // that was shipped before it (`Receiver::serve_link`, the same test).
            if header.txn_count == 0 && header.bound_ts <= s.stream_bound(stream) && header.floor_ts <= s.watermark() {
                p.heartbeats_not_shipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            s.push(stream, header.bound_ts, Some(header.floor_ts));
        }
        {
            // One look at the links per batch: sample, frame once, queue for each.
            let links = p.links.lock();
            if !links.is_empty() {
                p.sample(&links, header.bound_ts);
                let f = crate::protocol::encode_batch(p.epoch, p.released(), p.flags(true), frame);
                p.push_to(&links, &f, at_once);
                p.batches_shipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        // (What was shipped never decides a release: test
        // `shipping_alone_never_moves_a_release`, policy.rs. Taken out on 2026-12-04 with a
        // read-write lock for the links, it cost TPC-C cluster runs on two cores a third of
        // their throughput: each flush turn ended sooner, batches were smaller and their
        // costs on the primary's one core, fsyncs, sends and the backup's acks, more. Put
        // back the same day: docs/results.md, "2026-12-04, afternoon".)
        p.changed();
    }

    fn table_created(&self, id: TableId, name: &str) {
        let Some(p) = self.0.upgrade() else { return };
        p.push_all(&Frame::Table { id: id.0, name: name.to_string() }.encode());
    }
}

#[cfg(test)]
mod tests {
    /// A backup stuck below every sample reads its lag from the first sample ever taken,
    /// however many were dropped since: before 2026-12-07 the lag stopped growing at the
    /// samples' span (`LAG_SAMPLES_MAX` of them: 10 s at one every 100 us).
    #[test]
    fn a_stuck_backups_lag_keeps_growing_past_the_samples_kept() {
        use super::{lag_since, push_sample, LAG_SAMPLES_MAX};
        use ditto_engine::Ts;
        use std::time::{Duration, Instant};
        let base = Instant::now();
        let mut s = std::collections::VecDeque::new();
        let n = LAG_SAMPLES_MAX as u64 + 50_000;
        for i in 0..n {
            push_sample(&mut s, Ts(i + 1), base + Duration::from_micros(100 * i));
        }
        assert_eq!(s.len(), LAG_SAMPLES_MAX);
        let now = base + Duration::from_micros(100 * n);
        assert_eq!(lag_since(&s, Ts(0), now), now - base, "stuck below the first commit shipped");
        // A backup past the dropped ones reads from the sample after its position.
        let held = Ts(n - 10);
        assert_eq!(lag_since(&s, held, now), Duration::from_micros(100 * 10));
    }

    /// A gap vouches every `GAP_VOUCH_EVERY` batches for what lies below the merge's next
    /// key, never past the registration clock, never twice for the same, and once at the
    /// end for the clock unless it vouched for that already; never past what the backup
    /// held if nothing came.
    #[test]
    fn a_gap_vouches_for_what_it_sent_on_the_way_and_at_the_end() {
        use super::{GapVouches, GAP_VOUCH_EVERY};
        let n = GAP_VOUCH_EVERY;
        let mut v = GapVouches { sent: 0, vouched: Ts(10), reg_clock: Ts(500) };
        let got: Vec<_> = (1..=4 * n).filter_map(|i| v.after(Some(Ts(20 + i))).map(|u| (i, u))).collect();
        assert_eq!(
            got,
            vec![(n, Ts(19 + n)), (2 * n, Ts(19 + 2 * n)), (3 * n, Ts(19 + 3 * n)), (4 * n, Ts(19 + 4 * n))]
        );
        // Past the clock: capped there, once.
        let mut v = GapVouches { sent: 0, vouched: Ts(10), reg_clock: Ts(50) };
        let got: Vec<_> = (1..=3 * n).filter_map(|i| v.after(Some(Ts(1000 + i)))).collect();
        assert_eq!(got, vec![Ts(50)]);
        assert_eq!(v.last(), None, "the clock is vouched for already");
        // The last batch (nothing ahead) vouches for nothing on the way; the end does.
        let mut v = GapVouches { sent: n - 1, vouched: Ts(10), reg_clock: Ts(50) };
        assert_eq!(v.after(None), None);
        assert_eq!(v.last(), Some(Ts(50)));
        // A key that does not move past what was vouched for vouches for nothing more.
        let mut v = GapVouches { sent: n - 1, vouched: Ts(40), reg_clock: Ts(50) };
        assert_eq!(v.after(Some(Ts(41))), None);
        assert_eq!(GapVouches { sent: 0, vouched: Ts(50), reg_clock: Ts(50) }.last(), None);
    }

    /// A hello read gives up at its deadline however its bytes trickle in: a peer that
    /// sends a byte every 100 ms is given up after 500 ms, not after a timeout per read.
    #[test]
    fn a_hello_that_trickles_in_is_given_up_at_its_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            let hello = Frame::Hello {
                version: PROTOCOL_VERSION,
                epoch: ditto_log::Epoch(1),
                have_ts: Ts(0),
                node: "b".into(),
                learner: false,
                proves: None,
                database: 0,
                run: 0,
            }
            .encode();
            for b in hello.iter() {
                if std::io::Write::write_all(&mut c, &[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (s, _) = listener.accept().unwrap();
        let t = Instant::now();
        let r = read_frame_at_most(&mut Until::new(&s, Instant::now() + Duration::from_millis(500)), HELLO_BYTES_MAX);
        let took = t.elapsed();
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::TimedOut || e.kind() == std::io::ErrorKind::WouldBlock),
            "{r:?}"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        drop(s);
        peer.join().unwrap();
    }

    use super::*;

    /// `saying_alive` returns what its work returned, beats meanwhile only while the work
    /// runs past a beat's interval (none for work that ends at once), and passes the
    /// work's error and panic on.
    #[test]
    fn saying_alive_beats_only_while_the_work_runs_and_passes_its_end_on() {
        let beats = |w: &[u8]| {
            let mut r = std::io::Cursor::new(w);
            let mut n = 0;
            while let Ok(Some(f)) = crate::protocol::read_frame(&mut r) {
                assert!(matches!(f, Frame::Heartbeat { .. }), "{f:?}");
                n += 1;
            }
            n
        };
        let now_us = || 7u64;
        let mut w = Vec::new();
        // (A beat every 500 ms: the work's thread may be slow to start on a loaded machine.)
        assert_eq!(saying_alive(&mut w, Some((Duration::from_millis(500), &now_us)), || Ok(41 + 1)).unwrap(), 42);
        assert_eq!(beats(&w), 0, "work that ends at once is not beaten for");
        let mut w = Vec::new();
        saying_alive(&mut w, Some((Duration::from_millis(5), &now_us)), || {
            std::thread::sleep(Duration::from_millis(60));
            Ok(())
        })
        .unwrap();
        assert!(beats(&w) >= 2, "{} beats over 60 ms at one per 5 ms", beats(&w));
        let e = saying_alive(&mut Vec::new(), None, || Err::<(), _>(std::io::Error::other("the work's own error")));
        assert_eq!(e.unwrap_err().to_string(), "the work's own error");
        let panicked = std::panic::catch_unwind(|| {
            saying_alive(&mut Vec::new(), None, || -> std::io::Result<()> { panic!("in the work") })
        });
        assert!(panicked.is_err(), "the work's panic goes on");
    }

    /// A link's silence counts from its last acknowledgement, or from when its acks began
    /// to be read if none came (or the last came before that: a start's), and ends the link
    /// only past the limit.
    #[test]
    fn a_backup_is_too_silent_only_past_the_limit_from_its_last_word() {
        let (s, max) = (Duration::from_secs, Duration::from_secs(10));
        // Never acknowledged: from when the acks began to be read.
        assert_eq!(too_silent(NEVER_ACKED, s(5), s(15), max), None);
        assert!(too_silent(NEVER_ACKED, s(5), s(16), max).is_some());
        // Acknowledged: from the last acknowledgement.
        let at = |secs: u64| secs * 1_000_000;
        assert_eq!(too_silent(at(20), s(5), s(30), max), None);
        let why = too_silent(at(20), s(5), s(31), max).expect("11 s silent");
        assert!(why.contains("for 11.0 s") && why.contains("limit is 10.0 s"), "{why}");
        // An acknowledgement from before the acks were read does not count: from then.
        assert_eq!(too_silent(at(1), s(5), s(15), max), None);
        assert!(too_silent(at(1), s(5), s(15) + Duration::from_millis(1), max).is_some());
        // A clock that reads before the last word (a race with the reader): not silent.
        assert_eq!(too_silent(at(20), s(5), s(19), max), None);
    }

    /// `peer_closed` says no for a live connection, unread data or not, and yes once the
    /// peer has closed it (with nothing left unread).
    #[test]
    fn a_connection_the_peer_closed_is_told_apart_from_a_live_one() {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut mine, _) = l.accept().unwrap();
        assert!(!peer_closed(&mine), "a live, quiet connection");
        peer.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!peer_closed(&mine), "a live connection with data unread");
        let mut b = [0u8; 1];
        mine.read_exact(&mut b).unwrap();
        drop(peer);
        let end = Instant::now() + Duration::from_secs(5);
        while !peer_closed(&mine) {
            assert!(Instant::now() < end, "the peer's close was never seen");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Acks read on a runtime from a blocking socket: frames written a few bytes at a time
    /// come out whole and in order, the socket stays blocking for the link's writes, and
    /// the end is told apart: a close between frames, a close inside one, a damaged frame,
    /// and a frame the reader refuses.
    #[test]
    fn acks_read_on_a_runtime_come_whole_and_in_order_and_every_end_says_why() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let ack = |n: u64| Frame::Ack { received: Ts(n), durable: Ts(n), replayed: Ts(n), echo_us: 0 };
        // Runs the reader over what `write` sends, and returns the frames it was handed
        // and why it ended.
        let run = |write: &dyn Fn(&mut TcpStream), stop_at: Option<u64>| -> (Vec<Frame>, String) {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (sock, _) = l.accept().unwrap();
            let got = Arc::new(Mutex::new(Vec::new()));
            let g2 = Arc::clone(&got);
            let check = sock.try_clone().unwrap();
            // Two bytes were read before the reader started (a `BufReader`'s leftovers).
            let first = ack(1).encode();
            let reads = Arc::new(AtomicU64::new(0));
            let r2 = Arc::clone(&reads);
            let reader = rt.spawn(read_acks_async(
                sock,
                first[..2].to_vec(),
                move |f| {
                    let stop = matches!((&f, stop_at), (Frame::Ack { received, .. }, Some(s)) if received.0 == s);
                    g2.lock().push(f);
                    stop.then(|| "told to stop".to_string())
                },
                move || {
                    r2.fetch_add(1, Ordering::SeqCst);
                },
            ));
            peer.write_all(&first[2..]).unwrap();
            write(&mut peer);
            let why = rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), reader).await });
            let why = why.expect("the reader ended within 10 s").unwrap();
            // It shut the connection down as it ended (a link thread writing to it is let go).
            peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            assert_eq!(std::io::Read::read(&mut peer, &mut [0u8; 1]).unwrap(), 0, "the peer sees the end");
            // The socket is still blocking (the link's thread writes to it).
            use std::os::fd::AsRawFd;
            // SAFETY: F_GETFL on a descriptor `check` keeps open.
            let flags = unsafe { libc::fcntl(check.as_raw_fd(), libc::F_GETFL) };
            assert!(flags >= 0 && flags & libc::O_NONBLOCK == 0, "flags {flags:#x}");
            let frames = got.lock().clone();
            // Told after the frames of a read were taken: at least once (ack 1), at most
            // once per ack.
            let reads = reads.load(Ordering::SeqCst);
            assert!(reads >= 1 && reads <= frames.len() as u64, "{reads} for {} frames", frames.len());
            (frames, why)
        };
        let in_pieces = |peer: &mut TcpStream, frames: &[Frame]| {
            let bytes: Vec<u8> = frames.iter().flat_map(|f| f.encode().to_vec()).collect();
            // The reader shuts the connection down once it stops: the rest is not sent.
            for piece in bytes.chunks(3) {
                if peer.write_all(piece).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        };
        let (got, why) = run(
            &|p| {
                in_pieces(p, &[ack(2), ack(3)]);
                p.shutdown(std::net::Shutdown::Write).unwrap();
            },
            None,
        );
        assert_eq!(got, vec![ack(1), ack(2), ack(3)]);
        assert_eq!(why, "the backup closed the connection");
        let (got, why) = run(
            &|p| {
                p.write_all(&ack(2).encode()[..5]).unwrap();
                p.shutdown(std::net::Shutdown::Write).unwrap();
            },
            None,
        );
        assert_eq!(got, vec![ack(1)]);
        assert!(why.contains("closed inside a frame"), "{why}");
        let (got, why) = run(
            &|p| {
                let mut bad = ack(2).encode().to_vec();
                bad[12] ^= 1;
                p.write_all(&bad).unwrap();
            },
            None,
        );
        assert_eq!(got, vec![ack(1)]);
        assert!(why.starts_with("reading acks:"), "{why}");
        let (got, why) = run(&|p| in_pieces(p, &[ack(2), ack(3)]), Some(2));
        assert_eq!(got, vec![ack(1), ack(2)]);
        assert_eq!(why, "told to stop");
    }

    #[test]
    fn lag_is_the_wait_of_the_oldest_sample_not_yet_held() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let s: std::collections::VecDeque<(Ts, Instant)> =
            [(Ts(10), t0), (Ts(20), t0 + ms(5)), (Ts(30), t0 + ms(9))].into_iter().collect();
        let now = t0 + ms(12);
        assert_eq!(lag_since(&s, Ts(5), now), ms(12), "nothing held: the oldest shipped");
        assert_eq!(lag_since(&s, Ts(10), now), ms(7));
        assert_eq!(lag_since(&s, Ts(25), now), ms(3), "held past 20: the sample at 30 waits");
        assert_eq!(lag_since(&s, Ts(30), now), Duration::ZERO, "holds everything shipped");
        assert_eq!(lag_since(&Default::default(), Ts(0), now), Duration::ZERO);
    }
}
