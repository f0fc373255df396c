//! The command table and the data commands
//! =======================================
//! Every command the server knows has a [`Spec`]: its name, Redis's arity convention
//! (positive: exactly that many arguments counting the name; negative: at least that
//! many), whether it writes, and where its keys are (for `COMMAND`). Data commands
//! ([`Kind::Data`]) run inside an engine transaction ([`run_data`]); connection commands
//! ([`Kind::Conn`]) are handled by the session (`session.rs`).
//!
//! Error replies follow Redis's text, so that client libraries that match on it behave.

use bytes::Bytes;
use ditto_engine::{Result, Transaction};

use crate::keyspace::{Entry, HashParts, Keyspace, WrongType, WRONGTYPE};
use crate::resp::Reply;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Runs in an engine transaction.
    Data,
    /// Handled by the connection's session.
    Conn,
}

#[derive(Debug)]
pub struct Spec {
    /// Upper case.
    pub name: &'static str,
    pub arity: i32,
    pub kind: Kind,
    pub write: bool,
    /// May grow the data (Redis's `denyoom`): refused while over `maxmemory` (memory.rs).
    pub grows: bool,
    /// First key, last key (-1: the last argument), step; 0, 0, 0 for none.
    pub keys: (i32, i32, i32),
}

const fn data(name: &'static str, arity: i32, write: bool, keys: (i32, i32, i32)) -> Spec {
    Spec { name, arity, kind: Kind::Data, write, grows: false, keys }
}

/// A write that may grow the data.
const fn grow(name: &'static str, arity: i32, keys: (i32, i32, i32)) -> Spec {
    Spec { name, arity, kind: Kind::Data, write: true, grows: true, keys }
}

const fn conn(name: &'static str, arity: i32) -> Spec {
    Spec { name, arity, kind: Kind::Conn, write: false, grows: false, keys: (0, 0, 0) }
}

pub static SPECS: &[Spec] = &[
    data("GET", 2, false, (1, 1, 1)),
    grow("SET", -3, (1, 1, 1)),
    grow("GETSET", 3, (1, 1, 1)),
    grow("SETNX", 3, (1, 1, 1)),
    data("DEL", -2, true, (1, -1, 1)),
    data("EXISTS", -2, false, (1, -1, 1)),
    data("TYPE", 2, false, (1, 1, 1)),
    grow("INCR", 2, (1, 1, 1)),
    grow("INCRBY", 3, (1, 1, 1)),
    grow("DECR", 2, (1, 1, 1)),
    grow("DECRBY", 3, (1, 1, 1)),
    grow("APPEND", 3, (1, 1, 1)),
    data("STRLEN", 2, false, (1, 1, 1)),
    data("MGET", -2, false, (1, -1, 1)),
    grow("MSET", -3, (1, -1, 2)),
    grow("MSETNX", -3, (1, -1, 2)),
    grow("HSET", -4, (1, 1, 1)),
    grow("HMSET", -4, (1, 1, 1)),
    data("HGET", 3, false, (1, 1, 1)),
    data("HMGET", -3, false, (1, 1, 1)),
    data("HDEL", -3, true, (1, 1, 1)),
    data("HGETALL", 2, false, (1, 1, 1)),
    grow("HINCRBY", 4, (1, 1, 1)),
    data("HEXISTS", 3, false, (1, 1, 1)),
    data("HLEN", 2, false, (1, 1, 1)),
    data("UNLINK", -2, true, (1, -1, 1)),
    data("GETDEL", 2, true, (1, 1, 1)),
    data("GETRANGE", 4, false, (1, 1, 1)),
    grow("SETRANGE", 4, (1, 1, 1)),
    grow("HSETNX", 4, (1, 1, 1)),
    data("HKEYS", 2, false, (1, 1, 1)),
    data("HVALS", 2, false, (1, 1, 1)),
    data("HSTRLEN", 3, false, (1, 1, 1)),
    data("TTL", 2, false, (1, 1, 1)),
    data("PTTL", 2, false, (1, 1, 1)),
    data("RENAME", 3, true, (1, 2, 1)),
    data("RENAMENX", 3, true, (1, 2, 1)),
    data("FLUSHDB", -1, true, (0, 0, 0)),
    data("FLUSHALL", -1, true, (0, 0, 0)),
    conn("PING", -1),
    conn("ECHO", 2),
    conn("HELLO", -1),
    conn("AUTH", -2),
    conn("SELECT", 2),
    conn("QUIT", -1),
    conn("RESET", 1),
    conn("COMMAND", -1),
    conn("CLIENT", -2),
    conn("CONFIG", -2),
    conn("MULTI", 1),
    conn("EXEC", 1),
    conn("DISCARD", 1),
    conn("WATCH", -2),
    conn("UNWATCH", 1),
    conn("INFO", -1),
    conn("ROLE", 1),
    conn("SENTINEL", -2),
    conn("WAIT", 3),
    conn("DBSIZE", 1),
    conn("SCAN", -2),
    conn("KEYS", 2),
    conn("DITTO.LASTCOMMIT", 1),
    conn("DITTO.WAITTS", 2),
    conn("DITTO.POLICY", -1),
    conn("DITTO.FORGETBACKUP", 2),
];

/// The spec of a command name, any case.
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    lookup_index(name).map(|i| &SPECS[i])
}

/// The command's position in [`SPECS`] (per-command statistics are kept by it).
pub fn lookup_index(name: &[u8]) -> Option<usize> {
    SPECS.iter().position(|s| s.name.len() == name.len() && s.name.as_bytes().eq_ignore_ascii_case(name))
}

impl Spec {
    pub fn arity_ok(&self, argc: usize) -> bool {
        if self.arity >= 0 {
            argc == self.arity as usize
        } else {
            argc >= (-self.arity) as usize
        }
    }

    pub fn lower_name(&self) -> String {
        self.name.to_ascii_lowercase()
    }
}

/// An error line of these pieces, the client's bytes among them as they came (a CR or LF
/// is written as a space by the encoder, `resp::line`).
pub(crate) fn raw_error(pieces: &[&[u8]]) -> Reply {
    match String::from_utf8(pieces.concat()) {
        Ok(s) => Reply::Error(s),
        Err(e) => Reply::ErrorRaw(Bytes::from(e.into_bytes())),
    }
}

/// Redis's text: the name, then each argument quoted and followed by a space while the
/// arguments written stay under 128 bytes, each cut to what is left of them.
pub fn unknown_command(args: &[Bytes]) -> Reply {
    let mut rest: Vec<u8> = Vec::new();
    for a in &args[1..] {
        if rest.len() >= 128 {
            break;
        }
        let room = 128 - rest.len();
        rest.push(b'\'');
        rest.extend_from_slice(&a[..a.len().min(room)]);
        rest.extend_from_slice(b"' ");
    }
    let name = &args[0][..args[0].len().min(128)];
    // The client's bytes as they came, as Redis echoes them (a CR or LF is written as a
    // space by the encoder, `resp::line`).
    let mut line = b"ERR unknown command '".to_vec();
    line.extend_from_slice(name);
    line.extend_from_slice(b"', with args beginning with: ");
    line.extend_from_slice(&rest);
    Reply::ErrorRaw(Bytes::from(line))
}

/// CLIENT's subcommands and their arity as Redis counts it (the command and subcommand
/// included; negative: at least).
const CLIENT_SUBCOMMANDS: &[(&str, i32)] = &[("SETNAME", 3), ("GETNAME", 2), ("ID", 2), ("SETINFO", 4), ("INFO", 2)];
/// COMMAND's subcommands ditto answers, with Redis's arity (counting COMMAND itself).
const COMMAND_SUBCOMMANDS: &[(&str, i32)] = &[("COUNT", 2), ("LIST", -2), ("INFO", -2), ("DOCS", -2), ("HELP", 2)];
/// CONFIG's subcommands as Redis knows them, with its arity (counting CONFIG itself):
/// ditto answers GET, and refuses the others (its settings live in its config file).
const CONFIG_SUBCOMMANDS: &[(&str, i32)] = &[("GET", -3), ("SET", -4), ("RESETSTAT", 2), ("REWRITE", 2), ("HELP", 2)];

/// The refusal Redis gives a container command's subcommand before running (or queueing)
/// it: unknown, or the wrong number of arguments; CLIENT's, COMMAND's and CONFIG's. And
/// ditto's own refusal of a CONFIG subcommand other than GET, at the same point: queued in
/// MULTI, each aborts the EXEC, as Redis's refusals do. (Before 2026-12-05 only CONFIG
/// GET's arity was checked there: `CONFIG FOO` or `CONFIG SET a` was queued, and the EXEC
/// ran the rest; found by a review.)
/// (COMMAND's since 2026-12-03: `COMMAND COUNT x` answered, and an unknown subcommand
/// queued in MULTI did not abort the EXEC; found by a review.)
///
/// Also `DITTO.POLICY` with more than one argument (its arity says "at least none"): it
/// read the first and answered OK, setting the policy (found by a review, 2026-12-03).
pub fn subcommand_refusal(spec: &Spec, args: &[Bytes]) -> Option<Reply> {
    if spec.name == "DITTO.POLICY" && args.len() > 2 {
        return Some(wrong_arity(spec));
    }
    let sub = args.get(1)?.to_ascii_uppercase();
    let table = match spec.name {
        "CLIENT" => Some(CLIENT_SUBCOMMANDS),
        "COMMAND" => Some(COMMAND_SUBCOMMANDS),
        "CONFIG" => Some(CONFIG_SUBCOMMANDS),
        _ => None,
    };
    let arity = match table {
        Some(t) => match t.iter().find(|(n, _)| n.as_bytes() == sub.as_slice()) {
            Some(&(_, arity)) => arity,
            None => {
                // The client's bytes as they came, as Redis echoes them (not made UTF-8).
                let shown = &args[1][..args[1].len().min(128)];
                return Some(raw_error(&[
                    b"ERR unknown subcommand '",
                    shown,
                    b"'. Try ",
                    spec.name.as_bytes(),
                    b" HELP.",
                ]));
            }
        },
        None => return None,
    };
    let ok = if arity >= 0 { args.len() == arity as usize } else { args.len() >= (-arity) as usize };
    if !ok {
        return Some(Reply::err(format!(
            "ERR wrong number of arguments for '{}|{}' command",
            spec.lower_name(),
            String::from_utf8_lossy(&sub).to_ascii_lowercase()
        )));
    }
    None
}

/// What ditto refuses of a command Redis runs (SET's key expiry, CONFIG's subcommands but
/// GET), checked after authentication and a backup's READONLY, as Redis would reach them
/// (before 2026-12-06 they came before both: `SET k v EX 10` unauthenticated was answered
/// the expiry's refusal, not NOAUTH; found by a review's differential run), and before a
/// command is queued: in MULTI such a command aborts the EXEC. (Before 2026-12-05 SET's
/// expiry was refused only as the EXEC ran it, and the transaction's other commands
/// committed without it: `MULTI; SET k v EX 60; INCR c; EXEC` answered an error and 1,
/// where Redis applies both; found by a review.)
pub fn ditto_refusal(spec: &Spec, args: &[Bytes]) -> Option<Reply> {
    if spec.name == "SET" && args.iter().skip(3).any(|o| is_expiry_option(o)) {
        return Some(Reply::err(SET_EXPIRY_REFUSED));
    }
    let sub = args.get(1)?.to_ascii_uppercase();
    (spec.name == "CONFIG" && sub != b"GET").then(|| config_unsupported(&sub))
}

/// ditto's answer to a CONFIG subcommand Redis knows and ditto does not run.
pub fn config_unsupported(sub: &[u8]) -> Reply {
    Reply::err(format!(
        "ERR CONFIG {} is not supported by ditto (CONFIG GET is; settings live in the config file)",
        String::from_utf8_lossy(sub).to_ascii_uppercase()
    ))
}

pub fn wrong_arity(spec: &Spec) -> Reply {
    Reply::err(format!("ERR wrong number of arguments for '{}' command", spec.lower_name()))
}

/// Client text echoed in an error line: an error reply is one line, so line breaks become
/// spaces, as Redis does.
pub(crate) fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

pub const SYNTAX: &str = "ERR syntax error";
pub const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";

/// Parses a Redis integer argument or value: optional '-', digits, no leading '+', no
/// spaces, no leading zeros (as Redis's `string2ll`).
pub fn parse_int(b: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(b).ok()?;
    let n: i64 = s.parse().ok()?;
    let canonical = itoa::Buffer::new().format(n) == s;
    canonical.then_some(n)
}

fn int_reply(n: i64) -> Bytes {
    Bytes::copy_from_slice(itoa::Buffer::new().format(n).as_bytes())
}

fn wrongtype() -> Reply {
    Reply::err(WRONGTYPE)
}

/// GET's reply to what a key holds: its string, nil, or WRONGTYPE. Also a pipeline's run of
/// GETs (`Session::handle_run`).
pub(crate) fn get_reply(held: std::result::Result<Option<Bytes>, WrongType>) -> Reply {
    match held {
        Ok(Some(v)) => Reply::Bulk(v),
        Ok(None) => Reply::Nil,
        Err(WrongType) => wrongtype(),
    }
}

/// Runs a data command in `txn`, on database `db`. Arity was checked by the caller.
/// Redis-level failures (WRONGTYPE, syntax) are `Ok(Reply::Error)` and write nothing;
/// `Err` is an engine error (a conflict is retried by the caller). `max_reply` is the
/// largest reply the server writes (`max_output_bytes`): the commands whose reply can name
/// one value many times (MGET, HMGET) or a whole hash (HGETALL, HKEYS, HVALS) stop copying
/// past it and answer an error, so a short request cannot make the server copy without
/// bound.
pub fn run_data(
    spec: &Spec,
    args: &[Bytes],
    ks: &Keyspace,
    db: u8,
    max_reply: usize,
    txn: &mut Transaction<'_>,
) -> Result<Reply> {
    let a = &args[1..];
    Ok(match spec.name {
        "GET" => get_reply(ks.get_string(txn, db, &a[0])?),
        "SET" => return set(a, ks, db, max_reply, txn),
        "GETSET" => match ks.get_string(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(Some(old)) if bulk_over(&old, max_reply) => too_large(max_reply),
            Ok(old) => {
                ks.replace_with_string(txn, db, &a[0], None, &a[1])?;
                old.map_or(Reply::Nil, Reply::Bulk)
            }
        },
        "SETNX" => match ks.get(txn, db, &a[0])? {
            Some(_) => Reply::Int(0),
            None => {
                ks.replace_with_string(txn, db, &a[0], None, &a[1])?;
                Reply::Int(1)
            }
        },
        // UNLINK frees memory in the background in Redis; here a delete is the same work.
        "DEL" | "UNLINK" => {
            let mut n = 0;
            for k in a {
                n += ks.delete(txn, db, k)? as i64;
            }
            Reply::Int(n)
        }
        "EXISTS" => {
            let mut n = 0;
            for k in a {
                n += ks.get(txn, db, k)?.is_some() as i64;
            }
            Reply::Int(n)
        }
        "TYPE" => Reply::Simple(ks.get(txn, db, &a[0])?.map_or("none", |e| e.type_name())),
        "INCR" => return incr_by(ks, db, txn, &a[0], Some(1)),
        "DECR" => return incr_by(ks, db, txn, &a[0], Some(-1)),
        "INCRBY" => return incr_by(ks, db, txn, &a[0], parse_int(&a[1])),
        "DECRBY" => {
            // Redis refuses i64::MIN before it looks at the key: its negation overflows.
            return match parse_int(&a[1]) {
                Some(i64::MIN) => Ok(Reply::err("ERR decrement would overflow")),
                by => incr_by(ks, db, txn, &a[0], by.map(|n| -n)),
            };
        }
        "APPEND" => match ks.get_string(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(old) => {
                let mut v = old.map(|b| b.to_vec()).unwrap_or_default();
                v.extend_from_slice(&a[1]);
                ks.replace_with_string(txn, db, &a[0], None, &v)?;
                Reply::Int(v.len() as i64)
            }
        },
        "STRLEN" => match ks.get_string(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(v) => Reply::Int(v.map_or(0, |v| v.len() as i64)),
        },
        "MGET" => {
            // Redis answers nil for a key of another type here, not WRONGTYPE. Values are
            // copied only up to `max_reply` bytes (`get_strings` stops after the one that
            // passes it); a reply that would pass it is an error, as at encoding.
            let values = ks.get_strings(txn, db, &a.iter().collect::<Vec<_>>(), max_reply)?;
            if values.len() < a.len() || values_len(&values) > max_reply {
                return Ok(too_large(max_reply));
            }
            Reply::Array(values.into_iter().map(|v| v.ok().flatten().map_or(Reply::Nil, Reply::Bulk)).collect())
        }
        "MSET" | "MSETNX" => {
            if !a.len().is_multiple_of(2) {
                return Ok(wrong_arity(spec));
            }
            if spec.name == "MSETNX" {
                for pair in a.chunks(2) {
                    if ks.get(txn, db, &pair[0])?.is_some() {
                        return Ok(Reply::Int(0));
                    }
                }
            }
            for pair in a.chunks(2) {
                if spec.name == "MSETNX" {
                    // Every key was just read and found absent.
                    ks.replace_with_string(txn, db, &pair[0], None, &pair[1])?;
                } else {
                    ks.set_string(txn, db, &pair[0], &pair[1])?;
                }
            }
            if spec.name == "MSET" {
                Reply::Ok
            } else {
                Reply::Int(1)
            }
        }
        "HSET" | "HMSET" => {
            if !(a.len() - 1).is_multiple_of(2) {
                return Ok(wrong_arity(spec));
            }
            let len = match ks.hash_len(txn, db, &a[0])? {
                Err(WrongType) => return Ok(wrongtype()),
                Ok(len) => len.unwrap_or(0),
            };
            let pairs: Vec<(&[u8], &[u8])> = a[1..].chunks(2).map(|p| (&p[0][..], &p[1][..])).collect();
            let added = ks.hset(txn, db, &a[0], len, &pairs)?;
            if spec.name == "HSET" {
                Reply::Int(added as i64)
            } else {
                Reply::Ok
            }
        }
        "HGET" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(None) => Reply::Nil,
            Ok(Some(_)) => ks.hget(txn, db, &a[0], &a[1])?.map_or(Reply::Nil, Reply::Bulk),
        },
        "HMGET" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(None) => Reply::Array(vec![Reply::Nil; a.len() - 1]),
            Ok(Some(_)) => {
                let mut out = Vec::with_capacity(a.len() - 1);
                let mut bytes = 0usize;
                for f in &a[1..] {
                    let v = ks.hget(txn, db, &a[0], f)?;
                    bytes = bytes.saturating_add(v.as_ref().map_or(0, Bytes::len));
                    if bytes > max_reply {
                        return Ok(too_large(max_reply));
                    }
                    out.push(v.map_or(Reply::Nil, Reply::Bulk));
                }
                Reply::Array(out)
            }
        },
        "HDEL" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(None) => Reply::Int(0),
            Ok(Some(len)) => Reply::Int(ks.hdel(txn, db, &a[0], len, &a[1..])? as i64),
        },
        "HGETALL" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(None) => Reply::Map(Vec::new()),
            Ok(Some(_)) => match ks.hash_within(txn, db, &a[0], HashParts::Both, max_reply)? {
                None => too_large(max_reply),
                Some(all) => Reply::Map(all.into_iter().map(|(f, v)| (Reply::Bulk(f), Reply::Bulk(v))).collect()),
            },
        },
        "HINCRBY" => {
            let Some(by) = parse_int(&a[2]) else { return Ok(Reply::err(NOT_INTEGER)) };
            let len = match ks.hash_len(txn, db, &a[0])? {
                Err(WrongType) => return Ok(wrongtype()),
                Ok(len) => len.unwrap_or(0),
            };
            let old = match ks.hget(txn, db, &a[0], &a[1])? {
                None => 0,
                Some(v) => match parse_int(&v) {
                    Some(n) => n,
                    None => return Ok(Reply::err("ERR hash value is not an integer")),
                },
            };
            let Some(new) = old.checked_add(by) else { return Ok(Reply::err(OVERFLOW)) };
            ks.hset(txn, db, &a[0], len, &[(&a[1], &int_reply(new))])?;
            Reply::Int(new)
        }
        "HEXISTS" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(None) => Reply::Int(0),
            Ok(Some(_)) => Reply::Int(ks.hget(txn, db, &a[0], &a[1])?.is_some() as i64),
        },
        "HLEN" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(len) => Reply::Int(len.unwrap_or(0) as i64),
        },
        "GETDEL" => match ks.get_string(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(None) => Reply::Nil,
            Ok(Some(v)) if bulk_over(&v, max_reply) => too_large(max_reply),
            Ok(Some(v)) => {
                ks.delete(txn, db, &a[0])?;
                Reply::Bulk(v)
            }
        },
        "GETRANGE" => {
            let (Some(start), Some(end)) = (parse_int(&a[1]), parse_int(&a[2])) else {
                return Ok(Reply::err(NOT_INTEGER));
            };
            match ks.get_string(txn, db, &a[0])? {
                Err(WrongType) => wrongtype(),
                Ok(v) => {
                    let v = v.unwrap_or_default();
                    Reply::Bulk(string_range(v.len(), start, end).map_or_else(Bytes::new, |r| v.slice(r)))
                }
            }
        }
        "SETRANGE" => return set_range(a, ks, db, txn),
        "HSETNX" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(len) => {
                let len = len.unwrap_or(0);
                if len > 0 && ks.hget(txn, db, &a[0], &a[1])?.is_some() {
                    Reply::Int(0)
                } else {
                    ks.hset(txn, db, &a[0], len, &[(&a[1], &a[2])])?;
                    Reply::Int(1)
                }
            }
        },
        "HKEYS" | "HVALS" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(None) => Reply::Array(Vec::new()),
            // Bounded by what the reply holds, the only part copied out of the engine.
            Ok(Some(_)) => {
                let keys = spec.name == "HKEYS";
                let parts = if keys { HashParts::Fields } else { HashParts::Values };
                match ks.hash_within(txn, db, &a[0], parts, max_reply)? {
                    None => too_large(max_reply),
                    Some(all) => {
                        Reply::Array(all.into_iter().map(|(f, v)| Reply::Bulk(if keys { f } else { v })).collect())
                    }
                }
            }
        },
        "HSTRLEN" => match ks.hash_len(txn, db, &a[0])? {
            Err(WrongType) => wrongtype(),
            Ok(None) => Reply::Int(0),
            Ok(Some(_)) => Reply::Int(ks.hget(txn, db, &a[0], &a[1])?.map_or(0, |v| v.len() as i64)),
        },
        // No key expires in ditto: -1 for a key that exists (no expiry), -2 for none.
        "TTL" | "PTTL" => Reply::Int(if ks.get(txn, db, &a[0])?.is_some() { -1 } else { -2 }),
        "RENAME" | "RENAMENX" => return rename(spec.name == "RENAMENX", a, ks, db, txn),
        "FLUSHDB" | "FLUSHALL" => {
            match a {
                [] => {}
                [mode] if mode.eq_ignore_ascii_case(b"SYNC") || mode.eq_ignore_ascii_case(b"ASYNC") => {}
                _ => return Ok(Reply::err(SYNTAX)),
            }
            ks.flush(txn, (spec.name == "FLUSHDB").then_some(db))?;
            Reply::Ok
        }
        other => unreachable!("{other} is not a data command"),
    })
}

/// ditto's refusal of SET's expiry options.
const SET_EXPIRY_REFUSED: &str = "ERR key expiry (EX, PX, EXAT, PXAT) is not supported by ditto";

/// Whether `opt` is one of SET's expiry options (any case; no allocation: every SET with
/// options is asked before it runs).
fn is_expiry_option(opt: &[u8]) -> bool {
    [&b"EX"[..], b"PX", b"EXAT", b"PXAT"].iter().any(|o| opt.eq_ignore_ascii_case(o))
}

/// SET key value [NX|XX] [GET] [KEEPTTL]. Expiry options are refused: ditto has no key
/// expiry (yet), and silently ignoring one would keep data a client meant to expire.
fn set(a: &[Bytes], ks: &Keyspace, db: u8, max_reply: usize, txn: &mut Transaction<'_>) -> Result<Reply> {
    let (mut nx, mut xx, mut get) = (false, false, false);
    for opt in &a[2..] {
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GET" => get = true,
            b"KEEPTTL" => {}
            b"EX" | b"PX" | b"EXAT" | b"PXAT" => return Ok(Reply::err(SET_EXPIRY_REFUSED)),
            _ => return Ok(Reply::err(SYNTAX)),
        }
    }
    if nx && xx {
        return Ok(Reply::err(SYNTAX));
    }
    let entry = ks.get(txn, db, &a[0])?;
    let old = match (&entry, get) {
        (Some(Entry::String(v)), true) if bulk_over(v, max_reply) => return Ok(too_large(max_reply)),
        (Some(Entry::String(v)), true) => Some(v.clone()),
        (Some(_), true) => return Ok(wrongtype()),
        _ => None,
    };
    let exists = entry.is_some();
    if (nx && exists) || (xx && !exists) {
        return Ok(if get { old.map_or(Reply::Nil, Reply::Bulk) } else { Reply::Nil });
    }
    ks.replace_with_string(txn, db, &a[0], entry.as_ref(), &a[1])?;
    Ok(if get { old.map_or(Reply::Nil, Reply::Bulk) } else { Reply::Ok })
}

/// Whether a reply of the one value `v` would pass `max_reply`: a command that writes and
/// answers the old value (GETSET, GETDEL, SET ... GET) refuses before it writes. (Found by
/// a review: the reply was replaced by this error after the commit, and GETDEL's value
/// was gone with no one told it.)
fn bulk_over(v: &[u8], max_reply: usize) -> bool {
    // `$`, up to 20 digits and two CRLFs around the value.
    v.len().saturating_add(32) > max_reply
}

const TOO_LARGE: &str = "ERR reply would be over max_output_bytes";

/// Whether `r` is the error of a command whose reply would pass the limit it was given.
pub fn is_too_large(r: &Reply) -> bool {
    matches!(r, Reply::Error(e) if e.starts_with(TOO_LARGE))
}

/// The error for a reply whose values alone pass `max_output_bytes`.
fn too_large(max_reply: usize) -> Reply {
    Reply::err(format!("{TOO_LARGE} ({max_reply})"))
}

/// The bytes of the values in an MGET's answer.
fn values_len(values: &[std::result::Result<Option<Bytes>, WrongType>]) -> usize {
    values.iter().map(|v| v.as_ref().ok().and_then(Option::as_ref).map_or(0, Bytes::len)).fold(0, usize::saturating_add)
}

/// The byte range GETRANGE answers for a string of `len` bytes: Redis's rules (negative
/// indexes count from the end, both ends inclusive and clamped), `None` for empty. Two
/// negative indexes out of order are empty before any clamping (`GETRANGE k -5 -7` is
/// empty even where clamping both to 0 would give the first byte).
fn string_range(len: usize, start: i64, end: i64) -> Option<std::ops::Range<usize>> {
    if start < 0 && end < 0 && start > end {
        return None;
    }
    let len = len as i64;
    let at = |i: i64| if i < 0 { (len + i).max(0) } else { i };
    let (start, end) = (at(start), at(end).min(len - 1));
    (len > 0 && start <= end).then(|| start as usize..end as usize + 1)
}

/// SETRANGE key offset value: overwrites from `offset`, padding with zero bytes; the new
/// length. An empty value changes nothing (and creates no key).
fn set_range(a: &[Bytes], ks: &Keyspace, db: u8, txn: &mut Transaction<'_>) -> Result<Reply> {
    let offset = match parse_int(&a[1]) {
        Some(n) if n >= 0 => n as usize,
        Some(_) => return Ok(Reply::err("ERR offset is out of range")),
        None => return Ok(Reply::err(NOT_INTEGER)),
    };
    let old = match ks.get_string(txn, db, &a[0])? {
        Err(WrongType) => return Ok(wrongtype()),
        Ok(old) => old.unwrap_or_default(),
    };
    if a[2].is_empty() {
        return Ok(Reply::Int(old.len() as i64));
    }
    // Checked before allocating: the row is the type byte and the string.
    let end = offset.saturating_add(a[2].len());
    // Refused as the other string writes are (`put_string`): alone, with their words; in
    // MULTI, the whole EXEC (before 2026-12-06 its EXEC committed the rest; a review).
    if end > crate::keyspace::STRING_LEN_MAX {
        return Err(ditto_engine::Error::TooLarge { what: "string", len: end, max: crate::keyspace::STRING_LEN_MAX });
    }
    let mut v = old.to_vec();
    if v.len() < end {
        v.resize(end, 0);
    }
    v[offset..end].copy_from_slice(&a[2]);
    ks.replace_with_string(txn, db, &a[0], None, &v)?;
    Ok(Reply::Int(v.len() as i64))
}

/// RENAME / RENAMENX key newkey: moves the value (a hash with its fields) to `newkey`,
/// replacing what it held (RENAMENX: only if it holds nothing).
fn rename(nx: bool, a: &[Bytes], ks: &Keyspace, db: u8, txn: &mut Transaction<'_>) -> Result<Reply> {
    let (from, to) = (&a[0], &a[1]);
    let Some(entry) = ks.get(txn, db, from)? else { return Ok(Reply::err("ERR no such key")) };
    if from == to {
        return Ok(if nx { Reply::Int(0) } else { Reply::Ok });
    }
    if nx && ks.get(txn, db, to)?.is_some() {
        return Ok(Reply::Int(0));
    }
    ks.delete(txn, db, to)?;
    match entry {
        Entry::String(v) => ks.replace_with_string(txn, db, to, None, &v)?,
        Entry::Hash { .. } => {
            let fields = ks.hgetall(txn, db, from)?;
            let pairs: Vec<(&[u8], &[u8])> = fields.iter().map(|(f, v)| (&f[..], &v[..])).collect();
            ks.hset(txn, db, to, 0, &pairs)?;
        }
    }
    ks.delete(txn, db, from)?;
    Ok(if nx { Reply::Int(1) } else { Reply::Ok })
}

fn incr_by(ks: &Keyspace, db: u8, txn: &mut Transaction<'_>, key: &[u8], by: Option<i64>) -> Result<Reply> {
    let Some(by) = by else { return Ok(Reply::err(NOT_INTEGER)) };
    let old = match ks.get_string(txn, db, key)? {
        Err(WrongType) => return Ok(wrongtype()),
        Ok(None) => 0,
        Ok(Some(v)) => match parse_int(&v) {
            Some(n) => n,
            None => return Ok(Reply::err(NOT_INTEGER)),
        },
    };
    let Some(new) = old.checked_add(by) else { return Ok(Reply::err(OVERFLOW)) };
    ks.replace_with_string(txn, db, key, None, &int_reply(new))?;
    Ok(Reply::Int(new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_parse_as_redis_does() {
        assert_eq!(parse_int(b"42"), Some(42));
        assert_eq!(parse_int(b"-7"), Some(-7));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        for bad in [&b""[..], b"+1", b" 1", b"01", b"1.0", b"9223372036854775808", b"-0", b"abc"] {
            assert_eq!(parse_int(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn lookup_ignores_case_and_arity_follows_redis() {
        let s = lookup(b"hGeTaLl").unwrap();
        assert_eq!(s.name, "HGETALL");
        assert!(s.arity_ok(2) && !s.arity_ok(3));
        let m = lookup(b"mget").unwrap();
        assert!(m.arity_ok(2) && m.arity_ok(9) && !m.arity_ok(1));
        assert!(lookup(b"OBJECT").is_none());
    }
}
