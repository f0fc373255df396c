//! Tiny runs of every benchmark and of the demo through the real binary, so none of them
//! rots; the JSON they print is parsed and its figures checked for sense.

use std::process::Command;
use std::time::{Duration, Instant};

fn ditto(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ditto")).args(args).output().expect("run ditto");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "ditto {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    (stdout, stderr)
}

fn last_json(stdout: &str) -> serde_json::Value {
    let line = stdout.lines().rev().find(|l| l.starts_with('{') || l.starts_with('[')).expect("a JSON line");
    serde_json::from_str(line).expect("valid JSON")
}

#[test]
fn bench_tpcc_small_with_and_without_log() {
    let (out, _) =
        ditto(&["bench", "tpcc", "--small", "--workers", "2", "--seconds", "1", "--log", "off,nosync", "--json"]);
    let j = last_json(&out);
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert!(r["report"]["committed"].as_u64().unwrap() > 0);
        assert!(r["report"]["throughput_tps"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(runs[0]["report"]["log_bytes"].as_u64().unwrap(), 0, "log off writes nothing");
    assert!(runs[1]["report"]["log_bytes_per_txn"].as_f64().unwrap() > 50.0, "a logged TPC-C txn writes bytes");
    assert!(out.contains("each mode in a fresh process"), "{out}");
    // `--prefault auto`: 256 MiB per worker-second, unless capped by the memory available.
    for r in runs {
        let mib = r["report"]["extra"]["prefault_mib"].as_u64().unwrap();
        assert!(mib > 0 && mib <= 512, "auto pre-faults up to 2 workers x 1 s x 256 MiB, not {mib}");
    }
    assert_eq!(out.matches("tpcc (2 workers").count(), 2, "both children's reports pass through: {out}");
    // The same in one process, as before.
    let (out, _) = ditto(&[
        "bench",
        "tpcc",
        "--small",
        "--seconds",
        "0.5",
        "--log",
        "nosync,off",
        "--one-process",
        "--prefault",
        "64",
        "--json",
    ]);
    let runs = last_json(&out)["runs"].as_array().unwrap().clone();
    assert!(runs.iter().all(|r| r["report"]["extra"]["prefault_mib"] == 64), "{runs:?}");
    assert_eq!((runs[0]["log"].as_str(), runs[1]["log"].as_str()), (Some("no-fsync-10ms"), Some("off")));
    assert!(!out.contains("fresh process"), "{out}");
}

#[test]
fn bench_ycsb_small() {
    let (out, _) =
        ditto(&["bench", "ycsb", "--keys", "10000", "--workers", "2", "--seconds", "1", "--log", "off", "--json"]);
    let j = last_json(&out);
    assert!(j["runs"][0]["report"]["committed"].as_u64().unwrap() > 0);
    let (out, _) = ditto(&[
        "bench",
        "ycsb",
        "--keys",
        "10000",
        "--zipf",
        "0.99",
        "--seconds",
        "1",
        "--log",
        "interval",
        "--prefault",
        "off",
        "--json",
    ]);
    let r = &last_json(&out)["runs"][0]["report"];
    assert!(r["committed"].as_u64().unwrap() > 0);
    assert_eq!(r["extra"]["prefault_mib"], 0);
    // A size it cannot read is refused before anything runs.
    let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["bench", "ycsb", "--keys", "1000", "--prefault", "2g"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("auto, off or a number of MiB"), "{err}");
    // So is more than half the memory available (no machine running this has 1 PiB).
    for bench in ["ycsb", "tpcc"] {
        let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
            .args(["bench", bench, "--prefault", "1073741824"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bench}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("more than half the memory available"), "{bench}: {err}");
        assert!(!err.contains("== "), "{bench}: refused before any run started: {err}");
    }
    // A backups' config they would refuse is refused here, saying why, before any run.
    let dir = tempfile::tempdir().unwrap();
    for (text, says) in [
        ("nonsense_key = 1\n", "unknown field `nonsense_key`"),
        ("requirepass = \"x\"\n", "requirepass and tls_only are not for a benchmark's backups"),
    ] {
        let f = dir.path().join("backup.toml");
        std::fs::write(&f, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
            .args(["bench", "ycsb", "--keys", "1000", "--backups", "1", "--backup-config", f.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--backup-config") && err.contains(says), "{text}: {err}");
        assert!(!err.contains("== "), "refused before any run started: {err}");
    }
    // Workers shipping their batches with nothing to ship to: refused, not ignored.
    let out = Command::new(env!("CARGO_BIN_EXE_ditto")).args(["bench", "ycsb", "--workers-ship"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--workers-ship needs --backups"), "{err}");
    assert!(!err.contains("== "), "refused before any run started: {err}");
}

#[test]
fn bench_index_small() {
    let (out, _) = ditto(&["bench", "index", "--keys", "10000", "--seconds", "0.05", "--threads", "1", "--json"]);
    let j = last_json(&out);
    assert!(j.as_array().unwrap().iter().all(|r| r["mops_per_s"].as_f64().unwrap() > 0.0));
}

#[test]
fn bench_lz4_small() {
    let (out, _) = ditto(&["bench", "lz4", "--small", "--seconds", "0.5", "--rounds", "1", "--json"]);
    let j = last_json(&out);
    assert!(j["batches"].as_u64().unwrap() > 0, "{out}");
    let ratio = j["ratio"].as_f64().unwrap();
    assert!(ratio > 0.0 && ratio < 1.0, "TPC-C payloads compress: {out}");
    assert!(j["compress_mb_per_s"].as_f64().unwrap() > 0.0, "{out}");
}

#[test]
fn bench_recovery_small() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("saved");
    let saved_arg = saved.to_str().unwrap();
    // By default a child process runs TPC-C and this one recovers, as after a crash.
    let (out, _) =
        ditto(&["bench", "recovery", "--small", "--workers", "2", "--seconds", "1", "--save", saved_arg, "--json"]);
    let j = last_json(&out);
    assert_eq!(j["recovered_in"], "a new process", "{out}");
    let replayed = j["log_txns_replayed"].as_u64().unwrap();
    assert!(replayed > 0);
    assert!(j["log_mb_per_s"].as_f64().unwrap() > 0.0);
    // A backup's check of a copy of the checkpoint the open wrote, timed.
    assert!(
        j["checkpoint_check_mb"].as_f64().unwrap() > 0.0 && j["checkpoint_check_s"].as_f64().unwrap() > 0.0,
        "{out}"
    );
    assert!(saved.join("log").is_dir(), "--save copies the directory as the run left it");
    // Recovering the saved copy replays the same transactions; the copy itself is untouched,
    // so it can be recovered again.
    for _ in 0..2 {
        let (out, _) = ditto(&["bench", "recovery", "--from", saved_arg, "--json"]);
        assert!(out.contains(&format!("recovery of a copy of {saved_arg}")), "{out}");
        assert_eq!(last_json(&out)["log_txns_replayed"].as_u64().unwrap(), replayed, "{out}");
    }
    // The old way, in the process that ran TPC-C.
    let (out, _) =
        ditto(&["bench", "recovery", "--small", "--workers", "1", "--seconds", "0.5", "--same-process", "--json"]);
    assert_eq!(last_json(&out)["recovered_in"], "the process that ran", "{out}");
    // A save target that is not empty is refused before anything runs.
    let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["bench", "recovery", "--small", "--seconds", "0.2", "--save", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"), "{out:?}");
    // A directory to recover that is not there is named in the error.
    let missing = dir.path().join("missing");
    let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["bench", "recovery", "--from", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("copying {}", missing.display())), "{err}");
}

#[test]
fn demo_small_crashes_recovers_and_verifies() {
    let (out, _) = ditto(&["demo", "--small", "--seconds", "2", "--server-seconds", "2"]);
    assert!(out.contains("every acknowledged commit recovered"), "{out}");
    assert!(out.contains("TPC-C consistency conditions 1-4"), "{out}");
    // The server part: a real server process, SIGKILLed under client load and restarted.
    assert!(out.contains("every acknowledged INCR present (8 counters"), "{out}");
    assert!(out.contains("accounts still sum to 10000  OK"), "{out}");
    assert!(out.contains("18 keys after the restart"), "10 accounts and 8 counters: {out}");
    // The hot-standby part: a primary and a backup process, reads on the backup checked.
    assert!(out.contains("each a consistent state  OK"), "{out}");
    assert!(out.contains("every acknowledged INCR on the backup (8 counters), DBSIZE 19 on both  OK"), "{out}");
    assert!(
        out.contains("the backup joined it again by itself, same process,") && out.contains("DBSIZE 20 on both  OK"),
        "{out}"
    );
    // The cluster part: failovers, a switchover, a fourth node added (a learner, then a
    // voter in place), every acknowledged write on every node.
    assert!(out.contains("a fourth node added online: a learner (counted in no quorum)"), "{out}");
    assert!(out.contains("on every node after every failover and at the end (the added node too)  OK"), "{out}");
}

#[test]
fn demo_refuses_log_off_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ditto")).args(["demo", "--log", "off"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a log"));
}

/// A mode whose child process fails stops the run with an error naming that mode: with a
/// given `--dir`, the first logged mode leaves its database there and the second, which
/// needs a new or empty directory, refuses.
#[test]
fn bench_stops_with_the_error_of_a_failing_mode() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["bench", "tpcc", "--small", "--seconds", "0.3", "--log", "nosync,interval", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("is not empty"), "the child's reason: {stderr}");
    assert!(stderr.contains("tpcc with log interval failed"), "the parent names the mode: {stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("tpcc (1 workers"), "the first mode's report passed through");
}

/// A cluster run: the same mode standalone, then as a primary with a backup process under
/// `majority-durable`, serial and parallel replay; the figures the hot-standby issue asks
/// for are in the JSON and hold what they say.
#[test]
fn bench_ycsb_cluster_run_with_a_backup() {
    let (out, _) = ditto(&[
        "bench",
        "ycsb",
        "--keys",
        "10000",
        "--workers",
        "2",
        "--seconds",
        "1",
        "--log",
        "every-batch",
        "--prefault",
        "off",
        "--backups",
        "1",
        "--backup-replay",
        "serial,parallel,dependency",
        "--pin",
        "--json",
    ]);
    let j = last_json(&out);
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 5, "standalone, serial, parallel and dependency cluster runs, standalone again: {out}");
    assert_eq!(runs[4]["log"], "fsync-every-batch (after)", "{out}");
    let tps = |r: &serde_json::Value| r["report"]["throughput_tps"].as_f64().unwrap();
    let (before, after) = (tps(&runs[0]), tps(&runs[4]));
    assert!(before > 0.0 && after > 0.0, "{out}");
    for (run, replay) in runs[1..4].iter().zip(["serial", "parallel", "dependency"]) {
        let x = &run["report"]["extra"];
        assert_eq!(x["backup_replay"], replay, "{x}");
        assert_eq!(x["commit_policy"], "majority-durable", "{x}");
        assert!(run["report"]["committed"].as_u64().unwrap() > 0, "{x}");
        let ratio = x["throughput_ratio_vs_standalone"].as_f64().unwrap();
        assert!(ratio > 0.0 && ratio < 10.0, "{x}");
        // Against the mean of the standalone runs on either side, each kept too.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
        assert!(close(ratio, tps(run) / ((before + after) / 2.0)), "{x}");
        assert!(close(x["throughput_ratio_vs_standalone_before"].as_f64().unwrap(), tps(run) / before), "{x}");
        assert!(close(x["throughput_ratio_vs_standalone_after"].as_f64().unwrap(), tps(run) / after), "{x}");
        assert!(x["replay_cost_ratio"].as_f64().unwrap() > 0.0, "the backup replayed: {x}");
        // Each ratio is what its parts say (one backup: it is the worst).
        let f = |k: &str| x[k].as_f64().unwrap_or_else(|| panic!("no {k}: {x}"));
        let threads = (f("replay_cpu_s_per_txn") + f("receiver_cpu_s_per_txn")) / f("exec_worker_cpu_s_per_logged_txn");
        assert!((f("replay_cost_ratio") - threads).abs() <= 1e-9 * threads, "{x}");
        let process = f("backup_process_cpu_s_per_txn") / f("primary_process_cpu_s_per_logged_txn");
        assert!((f("replay_cost_ratio_process") - process).abs() <= 1e-9 * process, "{x}");
        assert!(
            f("receiver_cpu_s_per_txn") > 0.0 && f("backup_process_cpu_s_per_txn") > f("replay_cpu_s_per_txn"),
            "{x}"
        );
        let (p50, p99) = (x["backup_lag_ms_p50"].as_f64().unwrap(), x["backup_lag_ms_p99"].as_f64().unwrap());
        assert!(0.0 <= p50 && p50 <= p99, "{x}");
        assert!(x["lag_samples"].as_u64().unwrap() > 0, "{x}");
        let f = x["freshness_score"].as_f64().unwrap();
        assert!(f > 0.0 && f <= 100.0, "{x}");
        assert!(x["commit_latency_us_p99"].as_u64().unwrap() >= x["commit_latency_us_p50"].as_u64().unwrap());
    }
}

/// A replay-only run of TPC-C (inserts, updates and deletes): the recorded log replayed in
/// every mode installs every transaction and ends with exactly the primary's keys and
/// values (the run fails otherwise), and the figures are there.
#[test]
fn bench_tpcc_replay_only_in_every_mode() {
    let modes = ["serial", "parallel", "dependency", "dependency:0", "parallel+shared", "dependency:0+shared:64"];
    let (out, _) = ditto(&[
        "bench",
        "tpcc",
        "--small",
        "--workers",
        "2",
        "--seconds",
        "1",
        "--log",
        "every-batch",
        "--prefault",
        "off",
        "--replay-only",
        &modes.join(","),
        "--json",
    ]);
    let j = last_json(&out);
    let r = j["runs"].as_array().unwrap()[0]["report"]["extra"]["replay_only"].as_array().unwrap().clone();
    let got: Vec<&str> = r.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(got, modes, "{out}");
    let txns = r[0]["txns"].as_u64().unwrap();
    assert!(txns > 0, "{out}");
    for m in &r {
        assert_eq!(m["txns"].as_u64(), Some(txns), "every mode replays every recorded transaction: {out}");
        // (A replayed database that differs from the primary's fails the run: its
        // `matches_primary` is then never printed, so it is not asserted here.)
        assert!(m["replay_cost_ratio"].as_f64().unwrap() > 0.0 && m["txns_per_s"].as_f64().unwrap() > 0.0, "{m}");
        let f = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("no {k}: {m}"));
        let ratio = f("replay_cpu_s_per_txn") / f("exec_worker_cpu_s_per_logged_txn");
        assert!((f("replay_cost_ratio") - ratio).abs() <= 1e-9 * ratio, "the ratio is its parts': {m}");
        assert!(
            f("exec_worker_cpu_s_per_logged_txn") < f("exec_cpu_s_per_logged_txn"),
            "workers within the process: {m}"
        );
        assert!(m["load_txns_replayed"].as_u64().unwrap() > 0, "{m}");
    }
}

#[test]
fn bench_redis_small_against_ditto_only() {
    let (out, _) =
        ditto(&["bench", "redis", "--requests", "2000", "--clients", "10", "--no-redis", "--rounds", "2", "--json"]);
    let j = last_json(&out);
    let rows = j["rows"].as_array().unwrap();
    // SET and GET, pipelined and not, for each of the two default durabilities and the
    // default primary with a backup at each of the two default pair durabilities, twice.
    assert_eq!(rows.len(), 32, "{out}");
    assert!(rows.iter().all(|r| r["rps"].as_f64().unwrap() > 0.0), "{out}");
    // The server's CPU per request is read from /proc: present and not negative (2,000
    // requests can take less than one clock tick of CPU).
    assert!(rows.iter().all(|r| r["cpu_us_per_req"].as_f64().unwrap() >= 0.0), "{out}");
    // A primary with a backup: its backup's CPU is read too; the others have none.
    for r in rows {
        let with_backup = r["server"].as_str().unwrap().starts_with("ditto+backup/");
        assert_eq!(r["backup_cpu_us_per_req"].as_f64().is_some(), with_backup, "{r}");
    }
    let summary = j["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 16, "{out}");
    for s in summary {
        assert_eq!(s["rounds"], 2, "{s}");
        let (lo, mid, hi) =
            (s["rps_min"].as_f64().unwrap(), s["rps_median"].as_f64().unwrap(), s["rps_max"].as_f64().unwrap());
        assert!(lo > 0.0 && lo <= mid && mid <= hi, "{s}");
        assert!(s["vs_redis"].is_null() && s["vs_redis_always"].is_null(), "no Redis, no ratio: {s}");
    }
}

/// `--other-ditto` runs that executable too, interleaved, standalone and as a primary with
/// a backup, both of its processes that build (here a script that notes its arguments and
/// runs this binary).
#[test]
fn bench_redis_runs_another_build_standalone_and_with_its_own_backup() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (script, calls) = (dir.path().join("other-ditto"), dir.path().join("calls"));
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$@\" >> {}\nexec {} \"$@\"\n", calls.display(), env!("CARGO_BIN_EXE_ditto")),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (out, _) = ditto(&[
        "bench",
        "redis",
        "--requests",
        "1000",
        "--clients",
        "5",
        "--no-redis",
        "--rounds",
        "1",
        "--pipeline",
        "1",
        "--durability",
        "every-batch",
        "--other-ditto",
        script.to_str().unwrap(),
        "--json",
    ]);
    let j = last_json(&out);
    let servers: Vec<&str> = j["summary"].as_array().unwrap().iter().map(|s| s["server"].as_str().unwrap()).collect();
    for want in [
        "ditto/every-batch",
        "other/every-batch",
        "ditto+backup/majority-received",
        "other+backup/majority-received",
        "ditto+backup/majority-received@interval",
        "other+backup/majority-received@interval",
    ] {
        assert!(servers.contains(&want), "{want} in {servers:?}");
    }
    for r in j["rows"].as_array().unwrap() {
        let with_backup = r["server"].as_str().unwrap().contains("+backup/");
        assert_eq!(r["backup_cpu_us_per_req"].as_f64().is_some(), with_backup, "{r}");
    }
    // The other build ran five servers: standalone, and a primary and its backup at each
    // pair durability (every-batch, interval: both nodes of a pair given it).
    let calls = std::fs::read_to_string(&calls).unwrap();
    let servers: Vec<&str> = calls.lines().filter(|l| l.starts_with("server ")).collect();
    assert_eq!(servers.len(), 5, "{calls}");
    assert_eq!(servers.iter().filter(|l| l.contains("--repl-port")).count(), 2, "{calls}");
    assert_eq!(servers.iter().filter(|l| l.contains("--replica-of")).count(), 2, "{calls}");
    let paced = |role: &str| servers.iter().filter(|l| l.contains(role) && l.contains("--durability interval")).count();
    assert_eq!((paced("--repl-port"), paced("--replica-of")), (1, 1), "{calls}");
}

/// Without the Redis programs on `PATH`, the run stops at once and names what to install,
/// before it starts any server.
#[test]
fn bench_redis_names_a_missing_redis_tool_at_once() {
    let empty = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
        .args(["bench", "redis", "--requests", "100", "--no-redis", "--rounds", "1"])
        .env("PATH", empty.path())
        .output()
        .expect("run ditto");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("needs redis-benchmark") && err.contains("redis-tools"), "{err}");
    // Named before any server was started, not after a wait timed out.
    assert!(!err.contains("within 60 s") && t0.elapsed() < Duration::from_secs(30), "{err}");
}

/// A cluster node's supervisor probes its server over the plaintext client port and
/// gives it its role: a TLS-only server (by flag or in the config file) or a role set in
/// the config file are refused at the start with the reason, before anything is created;
/// so are TLS settings its servers could not start with.
#[test]
fn a_cluster_node_refuses_tls_only_or_a_role_in_its_config_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ditto.toml");
    std::fs::write(&conf, "tls_only = true\n").unwrap();
    let data = dir.path().join("n1");
    // The node with `extra` flags is refused, saying `why`, and creates nothing.
    let refused_as = |members: &str, extra: &[&str], why: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_ditto"))
            .args(["server", "--node-id", "1", "--members", members, "--data-dir", data.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{extra:?}: {err}");
        assert!(!data.exists(), "{extra:?}: nothing created");
    };
    let refused = |extra: &[&str], why: &str| refused_as("1=127.0.0.1:1/2/3", extra, why);
    for extra in [vec!["--tls-only"], vec!["--config", conf.to_str().unwrap()]] {
        refused(&extra, "tls_only is not supported with --node-id");
    }
    // Likewise a role of the file's (a password is taken since 2026-11-29: its
    // supervisor's probe gives it).
    std::fs::write(&conf, "replica_of = \"127.0.0.1:9\"\n").unwrap();
    refused(&["--config", conf.to_str().unwrap()], "may not set replica_of or repl_port");
    // TLS is served beside the plaintext port, on a fixed port, with files that load: a
    // port of 0, a missing key, a port the node uses already and a file that is no
    // certificate are refused at the start.
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    let b = bad.to_str().unwrap();
    for (flags, why) in [
        (vec!["--tls-port", "0", "--tls-cert-file", b, "--tls-key-file", b], "tls_port 0 is not supported"),
        (vec!["--tls-port", "7001", "--tls-cert-file", b], "tls_port needs tls_cert_file and tls_key_file"),
        (vec!["--tls-port", "2", "--tls-cert-file", b, "--tls-key-file", b], "one of this node's own ports"),
        (vec!["--tls-port", "7001", "--tls-cert-file", b, "--tls-key-file", b], "bad.pem"),
    ] {
        refused(&flags, why);
    }
    // A TLS port the node's member names (`/TLS_PORT`) is its TLS port: another set by a
    // flag is refused, and it needs its files and a port of its own like any.
    let with_tls = "1=127.0.0.1:1/2/3/7301";
    refused_as(
        with_tls,
        &["--tls-port", "7001", "--tls-cert-file", b, "--tls-key-file", b],
        "names TLS port 7301 for node 1, but its TLS port is set to 7001",
    );
    refused_as(with_tls, &[], "tls_port needs tls_cert_file and tls_key_file");
    refused_as(with_tls, &["--tls-cert-file", b, "--tls-key-file", b], "bad.pem");
    // (A member's TLS port the same as another of its ports is refused with the members.)
    refused_as("1=127.0.0.1:1/2/3/3", &["--tls-cert-file", b, "--tls-key-file", b], "its ports must differ");
    refused_as(
        "1=127.0.0.1:1/2/3",
        &["--tls-port", "3", "--tls-cert-file", b, "--tls-key-file", b],
        "one of this node's own ports",
    );
    // TLS between nodes: both links or neither, the CA too, and files that load (no TLS
    // port needed).
    let files = ["--tls-cert-file", b, "--tls-key-file", b, "--tls-ca-cert-file", b];
    for (one, alone) in [("--tls-replication", "tls_replication alone"), ("--tls-cluster", "tls_cluster alone")] {
        refused(&[&[one][..], &files[..]].concat(), alone);
    }
    refused(&["--tls-replication", "--tls-cluster", "--tls-cert-file", b, "--tls-key-file", b], "tls_ca_cert_file");
    refused(&[&["--tls-replication", "--tls-cluster"][..], &files[..]].concat(), "bad.pem");
}
