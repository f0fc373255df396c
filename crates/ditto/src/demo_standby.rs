//! The third part of `ditto demo`: a hot standby. A primary `ditto server` (commit policy
//! `majority-durable`: a reply means fsynced on both machines) and a backup (`--replica-of`),
//! each its own process; the same clients as the server part write to the primary while a
//! reader checks the backup throughout, and the primary's `INFO replication` is sampled for
//! the backup's lag.
//!
//! ```text
//!  clients --INCR, MULTI/EXEC transfers--> primary --log batches--> backup <--MGET-- reader
//!                                           INFO replication <-- sampler (replay lag, freshness)
//!  then: WAITTS the primary's last commit on the backup; every acknowledged INCR there
//!  then: the primary stopped (SIGTERM) and started again on the same replication port;
//!        the backup joins it again by itself, in the same process (docs/replication.md,
//!        "A backup its primary can no longer resume"); a write on the restarted primary,
//!        acknowledged once durable on both, then held by the backup
//! ```

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::demo_server::{client_loop, start_ditto_server, Client, ClientLog, Reply, ACCOUNTS, BALANCE};

type Error = Box<dyn std::error::Error + Send + Sync>;

pub struct StandbyDemo {
    clients: usize,
    ops: u64,
    seconds: f64,
    p50_us: u32,
    p99_us: u32,
    backup_reads: u64,
    lag_ms: (f64, f64, f64),
    freshness: f64,
    lag_samples: usize,
    caught_up_ms: f64,
    counters_checked: usize,
    dbsize: i64,
    /// From the restarted primary serving until the backup held a write made on it.
    rejoin_ms: f64,
}

/// What the reader on the backup saw: reads, all consistent, at least one of them the
/// accounts whole (reads before their creation reached the backup find none; a reader
/// that never saw them checked nothing, and fails).
fn backup_reader(port: u16, stop: &AtomicBool) -> Result<u64, Error> {
    let mut c = Client::connect_to("127.0.0.1", port)?;
    let mut keys: Vec<String> = (0..ACCOUNTS).map(|k| format!("demo:acct:{k}")).collect();
    keys.insert(0, "MGET".into());
    let args: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (mut reads, mut whole) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        let Reply::Array(Some(vals)) = c.call(&args)? else { return Err("MGET on the backup: not an array".into()) };
        let mut sum = 0i64;
        let mut present = 0;
        for v in vals {
            if let Reply::Bulk(Some(b)) = v {
                sum += String::from_utf8(b)?.parse::<i64>()?;
                present += 1;
            }
        }
        // Before the accounts' creation reaches the backup, none is there; after, all are.
        if present != 0 && (present != ACCOUNTS as usize || sum != BALANCE * ACCOUNTS as i64) {
            return Err(format!("the backup showed a partial state: {present} accounts summing to {sum}").into());
        }
        whole += u64::from(present != 0);
        reads += 1;
    }
    if whole == 0 {
        return Err(format!("none of the backup's {reads} reads found the accounts: nothing was checked").into());
    }
    Ok(reads)
}

/// The slave0 line's fields of the primary's INFO replication.
fn slave0(c: &mut Client) -> Result<std::collections::BTreeMap<String, String>, Error> {
    let Reply::Bulk(Some(b)) = c.call(&["INFO", "replication"])? else { return Err("INFO: not a bulk reply".into()) };
    let (_, backups) = crate::status::parse_info(&String::from_utf8(b)?);
    backups.into_iter().next().ok_or_else(|| "no backup connected".into())
}

pub fn run(dir: &Path, workers: usize, clients: usize, seconds: f64) -> Result<StandbyDemo, Error> {
    println!("\n== hot standby: a primary and a backup process, {clients} clients writing, a reader on the backup");
    let w = workers.to_string();
    let primary = start_ditto_server(
        None,
        &dir.join("primary"),
        &["--workers", &w, "--repl-port", "0", "--commit-policy", "majority-durable", "--backups", "1"],
        Stdio::null(),
    )?;
    let repl = primary.repl.clone().ok_or("the primary printed no replication address")?;
    let backup =
        start_ditto_server(None, &dir.join("backup"), &["--workers", &w, "--replica-of", &repl], Stdio::null())?;
    let mut info = Client::connect_to("127.0.0.1", primary.port)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while slave0(&mut info).is_err() {
        if Instant::now() > deadline {
            return Err("the backup did not connect within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut setup = Client::connect_to("127.0.0.1", primary.port)?;
    // One MSET, one transaction: the backup shows no account or all of them.
    let mut mset = vec!["MSET".to_string()];
    for k in 0..ACCOUNTS {
        mset.extend([format!("demo:acct:{k}"), BALANCE.to_string()]);
    }
    let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
    if setup.call(&mset)? != Reply::Simple("OK".into()) {
        return Err("MSET of the accounts failed".into());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let port = primary.port;
    let writers: Vec<_> = (0..clients)
        .map(|i| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || client_loop(port, i, &stop))
        })
        .collect();
    let reader = {
        let (stop, port) = (Arc::clone(&stop), backup.port);
        std::thread::spawn(move || backup_reader(port, &stop))
    };
    let mut lags: Vec<f64> = Vec::new();
    let mut fresh: Vec<f64> = Vec::new();
    while started.elapsed().as_secs_f64() < seconds {
        std::thread::sleep(Duration::from_millis(20));
        let s = slave0(&mut info)?;
        let num = |k: &str| s.get(k).and_then(|v| v.parse::<f64>().ok());
        if let (Some(l), Some(f)) = (num("replay_lag_ms"), num("freshness_pct")) {
            lags.push(l);
            fresh.push(f);
        }
    }
    let ran = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let logs: Vec<ClientLog> = writers.into_iter().map(|h| h.join().expect("client thread")).collect();
    let backup_reads = reader.join().expect("reader thread")?;
    // Read-your-writes on the backup: wait for the primary's newest commit, then check.
    let t = Instant::now();
    if setup.call(&["SET", "demo:fence", "1"])? != Reply::Simple("OK".into()) {
        return Err("SET demo:fence failed".into());
    }
    let ts = setup.int(&["DITTO.LASTCOMMIT"])?.to_string();
    let mut b = Client::connect_to("127.0.0.1", backup.port)?;
    if b.call(&["DITTO.WAITTS", &ts])? != Reply::Simple("OK".into()) {
        return Err(format!("the backup did not reach the primary's commit ts {ts}").into());
    }
    let caught_up_ms = t.elapsed().as_secs_f64() * 1e3;
    for (i, log) in logs.iter().enumerate() {
        let v = b.int(&["GET", &format!("demo:counter:{i}")])?;
        if v != log.counter_acked {
            return Err(format!(
                "demo:counter:{i} is {v} on the backup, {} was acknowledged by the primary",
                log.counter_acked
            )
            .into());
        }
    }
    let dbsize = b.int(&["DBSIZE"])?;
    let pdbsize = setup.int(&["DBSIZE"])?;
    if dbsize != pdbsize {
        return Err(format!("DBSIZE is {dbsize} on the backup, {pdbsize} on the primary").into());
    }
    let rejoin_ms = restart_primary(dir, &w, primary, &repl, backup.port, dbsize)?;
    let mut lat: Vec<u32> = logs.iter().flat_map(|l| l.latencies_us.iter().copied()).collect();
    lat.sort_unstable();
    let pct = |v: &[u32], p: f64| v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1))).copied();
    if lags.is_empty() || fresh.is_empty() {
        return Err("the sampler read no replay lag or freshness from the backup's INFO replication".into());
    }
    let mut sorted = lags.clone();
    sorted.sort_by(f64::total_cmp);
    let q = |p: f64| sorted.get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1))).copied();
    Ok(StandbyDemo {
        clients,
        ops: logs.iter().map(|l| l.ops).sum(),
        seconds: ran,
        p50_us: pct(&lat, 0.5).unwrap_or(0),
        p99_us: pct(&lat, 0.99).unwrap_or(0),
        backup_reads,
        lag_ms: (q(0.5).unwrap_or(0.0), q(0.99).unwrap_or(0.0), sorted.last().copied().unwrap_or(0.0)),
        freshness: fresh.iter().sum::<f64>() / fresh.len() as f64,
        lag_samples: lags.len(),
        caught_up_ms,
        counters_checked: logs.len(),
        dbsize,
        rejoin_ms,
    })
}

/// The backup's process id (`INFO server`).
fn process_id(port: u16) -> Result<String, Error> {
    let mut c = Client::connect_to("127.0.0.1", port)?;
    let Reply::Bulk(Some(b)) = c.call(&["INFO", "server"])? else { return Err("INFO: not a bulk reply".into()) };
    let info = String::from_utf8(b)?;
    let pid = info.lines().find_map(|l| l.strip_prefix("process_id:")).ok_or("no process_id in INFO server")?;
    Ok(pid.trim().to_string())
}

/// Stops the primary (SIGTERM), starts it again on its directory and replication port
/// `repl`, and waits until the backup on `backup_port` holds a write made on it (under
/// `majority-durable` it is acknowledged only once the backup has it durably: the backup
/// must have joined again by itself). Checks the backup is the same process and holds
/// the `keys` keys and the new one. Returns the milliseconds from the restarted primary
/// serving until the backup held the write.
fn restart_primary(
    dir: &Path,
    workers: &str,
    mut primary: crate::demo_server::ServerProcess,
    repl: &str,
    backup_port: u16,
    keys: i64,
) -> Result<f64, Error> {
    let pid = process_id(backup_port)?;
    let repl_port = repl.rsplit(':').next().ok_or("no replication port")?;
    // SAFETY: kill(2) on a child this process spawned and has not reaped.
    unsafe {
        libc::kill(primary.child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while primary.child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            return Err("the primary did not stop within 30 s of SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(primary);
    let args =
        ["--workers", workers, "--repl-port", repl_port, "--commit-policy", "majority-durable", "--backups", "1"];
    let primary = start_ditto_server(None, &dir.join("primary"), &args, Stdio::null())?;
    let t = Instant::now();
    let mut c = Client::connect_to("127.0.0.1", primary.port)?;
    if c.call(&["SET", "demo:after-restart", "1"])? != Reply::Simple("OK".into()) {
        return Err("SET on the restarted primary failed".into());
    }
    let ts = c.int(&["DITTO.LASTCOMMIT"])?.to_string();
    // The backup's connections close when it swaps its old engine for the new one (the
    // write above may be acknowledged a moment before): one that is closed is opened again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut b = loop {
        let attempt =
            Client::connect_to("127.0.0.1", backup_port).and_then(|mut b| Ok((b.call(&["DITTO.WAITTS", &ts])?, b)));
        match attempt {
            Ok((Reply::Simple(ok), b)) if ok == "OK" => break b,
            Ok((other, _)) => {
                return Err(format!("the backup did not reach the restarted primary's commit ts {ts}: {other:?}").into())
            }
            Err(e) if Instant::now() > deadline => {
                return Err(format!("the backup after the primary's restart: {e}").into())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if process_id(backup_port)? != pid {
        return Err("the backup is another process after the primary's restart".into());
    }
    let (bkeys, pkeys) = (b.int(&["DBSIZE"])?, c.int(&["DBSIZE"])?);
    if bkeys != keys + 1 || pkeys != keys + 1 {
        return Err(format!(
            "after the restart DBSIZE is {bkeys} on the backup, {pkeys} on the primary, not {}",
            keys + 1
        )
        .into());
    }
    Ok(ms)
}

impl StandbyDemo {
    pub fn print(&self) {
        println!("Hot standby (primary and backup processes; majority-durable: a reply means fsynced on both)");
        println!(
            "  {} clients         {:>10.0} acknowledged commands/s over {:.1} s on the primary",
            self.clients,
            self.ops as f64 / self.seconds.max(1e-9),
            self.seconds
        );
        println!("  latency to reply    p50 {} us, p99 {} us", self.p50_us, self.p99_us);
        println!(
            "  backup reads        {} MGETs of every account during the load, each a consistent state  OK",
            self.backup_reads
        );
        println!(
            "  backup lag          replay p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} samples); freshness {:.3}%",
            self.lag_ms.0, self.lag_ms.1, self.lag_ms.2, self.lag_samples, self.freshness
        );
        println!(
            "checks:   the backup held the primary's last commit {:.1} ms after it was acknowledged (DITTO.WAITTS)",
            self.caught_up_ms
        );
        println!(
            "          every acknowledged INCR on the backup ({} counters), DBSIZE {} on both  OK",
            self.counters_checked, self.dbsize
        );
        println!(
            "  primary restart     the primary stopped (SIGTERM) and started again: the backup joined it again by itself, same process, and held a write made on it {:.0} ms after it served; DBSIZE {} on both  OK",
            self.rejoin_ms,
            self.dbsize + 1
        );
    }
}
