//! RESP: requests in, replies out
//! ==============================
//! Clients send every command as a RESP2 array of bulk strings (`*N\r\n$len\r\narg\r\n...`),
//! also after `HELLO 3`; telnet-style inline commands (one line, words split on spaces,
//! with Redis's quoting) are accepted too, as Redis does. Replies are encoded for the connection's protocol version:
//! RESP3 has its own null, map, set, boolean and double types, RESP2 folds them into
//! bulk strings, integers and flat arrays.
//!
//! Why the request parser is our own and not `redis-protocol`'s decoder (which the tests use
//! as an oracle): a request is a flat array of bulk strings, and the server must refuse
//! anything else before buffering it. The crate's decoder accepts any RESP2 value, recurses
//! once per nested array with no depth limit (a 1 MiB request of `*1\r\n` repeated is
//! 262,144 levels), learns a bulk string's length only once the whole string is buffered,
//! and starts over from the first byte on every read of a partial frame. [`RequestParser`]
//! keeps its place between reads, checks every length against [`Limits`] as soon as it is
//! announced, and never recurses.
//!
//! Invariants: the parser consumes from the buffer exactly the bytes of complete
//! arguments and headers; a request it returns holds at most `max_args` arguments and
//! `max_request_bytes` bytes of them; after an error the connection is closed, so the
//! parser's state after an error does not matter.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The least room made for a bulk argument whose bytes have not all arrived.
const BULK_ROOM_MIN: usize = 64 << 10;

/// Bounds on what one client may send.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Arguments of one command.
    pub max_args: usize,
    /// Bytes of one command's arguments together (and so of any one argument).
    pub max_request_bytes: usize,
    /// Bytes of an inline command line, or of a header line.
    pub max_inline_bytes: usize,
    /// A connection that has not authenticated (with a password set): at most
    /// `UNAUTHENTICATED_ARGS_MAX` arguments of at most `UNAUTHENTICATED_BULK_MAX` bytes, as
    /// Redis since CVE-2021-32675, so that a client without the password cannot make the
    /// server hold a request of up to `max_request_bytes` (or a million small arguments)
    /// before it answers NOAUTH.
    pub unauthenticated: bool,
}

/// Arguments of a request before the connection authenticated (Redis's 10).
pub const UNAUTHENTICATED_ARGS_MAX: usize = 10;
/// Bytes of one argument before the connection authenticated (Redis's 16 KiB).
pub const UNAUTHENTICATED_BULK_MAX: usize = 16 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_args: 1024 * 1024,
            max_request_bytes: 64 << 20,
            max_inline_bytes: 64 * 1024,
            unauthenticated: false,
        }
    }
}

impl Limits {
    /// These limits for a connection that has not authenticated.
    pub fn unauthenticated(&self) -> Limits {
        Limits { unauthenticated: true, ..*self }
    }
}

/// A malformed or oversized request. The message is Redis's where Redis has one; the
/// server replies `-ERR Protocol error: <message>` and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

fn perr(msg: impl Into<String>) -> ProtocolError {
    ProtocolError(msg.into())
}

/// Where the parser is inside a multibulk request.
#[derive(Debug, Default)]
enum State {
    /// Between requests.
    #[default]
    Idle,
    /// Inside `*N`: `left` arguments still to come; `pending` is the announced length of
    /// the next one once its `$len` line was read.
    Multibulk { left: usize, pending: Option<usize> },
}

/// Incremental request parser; one per connection.
#[derive(Debug, Default)]
pub struct RequestParser {
    state: State,
    args: Vec<Bytes>,
    /// Argument bytes of the request so far.
    bytes: usize,
}

impl RequestParser {
    /// Takes the next complete request out of `buf`. `Ok(None)`: more bytes are needed.
    /// An empty request (`*0`, `*-1`, a blank inline line) comes back as an empty vector;
    /// Redis ignores those, and so does the server.
    pub fn next(&mut self, buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        loop {
            match self.state {
                State::Idle => {
                    let Some(&first) = buf.first() else { return Ok(None) };
                    if first != b'*' {
                        return inline(buf, limits);
                    }
                    let Some(n) =
                        read_int_line(buf, 1, limits, "invalid multibulk length", "too big mbulk count string")?
                    else {
                        return Ok(None);
                    };
                    if n <= 0 {
                        return Ok(Some(Vec::new()));
                    }
                    if limits.unauthenticated && n as u64 > UNAUTHENTICATED_ARGS_MAX as u64 {
                        return Err(perr("unauthenticated multibulk length"));
                    }
                    if n as u64 > limits.max_args as u64 {
                        return Err(perr("invalid multibulk length"));
                    }
                    let n = n as usize;
                    self.args = Vec::with_capacity(n.min(1024));
                    self.bytes = 0;
                    self.state = State::Multibulk { left: n, pending: None };
                }
                State::Multibulk { left, pending: None } => {
                    let Some(&first) = buf.first() else { return Ok(None) };
                    if first != b'$' {
                        return Err(perr(format!("expected '$', got '{}'", char::from(first).escape_default())));
                    }
                    let Some(len) = read_int_line(buf, 1, limits, "invalid bulk length", "too big bulk count string")?
                    else {
                        return Ok(None);
                    };
                    if limits.unauthenticated && len > UNAUTHENTICATED_BULK_MAX as i64 {
                        return Err(perr("unauthenticated bulk length"));
                    }
                    if len < 0 || len as u64 > (limits.max_request_bytes - self.bytes) as u64 {
                        return Err(perr("invalid bulk length"));
                    }
                    self.state = State::Multibulk { left, pending: Some(len as usize) };
                }
                State::Multibulk { left, pending: Some(len) } => {
                    if buf.len() < len + 2 {
                        // Room for the argument as its bytes arrive: at most as much again as
                        // has arrived (64 KiB at least), so a large argument's buffer grows
                        // a few times rather than read by read, and a length announced with
                        // nothing after it costs no more than 64 KiB. (Before 2026-12-02 the
                        // whole announced length was reserved at once: 20 bytes from a
                        // client that had not authenticated made the server count 64 MiB
                        // against `maxmemory`. Redis's CVE-2021-32675 is the same.)
                        let room = (len + 2 - buf.len()).min(buf.len().max(BULK_ROOM_MIN));
                        buf.reserve(room);
                        return Ok(None);
                    }
                    if &buf[len..len + 2] != b"\r\n" {
                        return Err(perr("bulk string not terminated by CRLF"));
                    }
                    let arg = buf.split_to(len).freeze();
                    buf.advance(2);
                    self.bytes += len;
                    self.args.push(arg);
                    if left == 1 {
                        self.state = State::Idle;
                        return Ok(Some(std::mem::take(&mut self.args)));
                    }
                    self.state = State::Multibulk { left: left - 1, pending: None };
                }
            }
        }
    }

    /// True between requests (nothing partial is held).
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Idle)
    }
}

/// Reads `<prefix byte><integer>\r\n` at the front of `buf`, consuming it. `Ok(None)` if
/// the line is not complete yet. `what` and `too_big` are Redis's words for a line that is
/// not such an integer and for one longer than an inline request may be (before
/// 2026-12-05 ditto said "too big count string" for both kinds of line; a review).
fn read_int_line(
    buf: &mut BytesMut,
    skip: usize,
    limits: &Limits,
    what: &str,
    too_big: &str,
) -> Result<Option<i64>, ProtocolError> {
    let Some(end) = find_crlf(buf) else {
        if buf.len() > limits.max_inline_bytes {
            return Err(perr(too_big));
        }
        return Ok(None);
    };
    // The same verdict however the line arrived: in one read or byte by byte.
    if end > limits.max_inline_bytes {
        return Err(perr(too_big));
    }
    let digits = &buf[skip..end];
    // Written as Redis's `string2ll` takes it: no `+`, no leading zero, no `-0` (before,
    // `*+1`, `$03` and `$+3` were taken; found by a review).
    let unsigned = digits.strip_prefix(b"-").unwrap_or(digits);
    let canonical = match unsigned {
        [b'0'] => digits.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    let n =
        canonical.then(|| std::str::from_utf8(digits).ok()?.parse::<i64>().ok()).flatten().ok_or_else(|| perr(what))?;
    buf.advance(end + 2);
    Ok(Some(n))
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = buf[from..].iter().position(|&b| b == b'\r') {
        let at = from + i;
        match buf.get(at + 1) {
            Some(b'\n') => return Some(at),
            Some(_) => from = at + 1,
            None => return None,
        }
    }
    None
}

/// An inline command: one line (ended by `\n`, an optional `\r` before it), split into
/// arguments as Redis splits it (`split_inline`).
fn inline(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    // A NUL byte in the line: Redis reads the line as a C string, so its end is never found
    // and the connection hangs until the line passes 64 KiB. It was run cut at the NUL here
    // (`SET k ab\0cd` stored "ab"; found by a review's differential run, 2026-12-06): now it
    // is refused at once, and nothing of it runs.
    let end = buf.iter().position(|&b| b == b'\n' || b == 0);
    if end.is_some_and(|i| buf[i] == 0) {
        return Err(perr("NUL byte in inline request"));
    }
    let Some(nl) = end else {
        if buf.len() > limits.max_inline_bytes {
            return Err(perr("too big inline request"));
        }
        return Ok(None);
    };
    if nl > limits.max_inline_bytes {
        return Err(perr("too big inline request"));
    }
    let line = buf.split_to(nl + 1);
    let body = &line[..line.len() - 1];
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    let args = split_inline(body).ok_or_else(|| perr("unbalanced quotes in request"))?;
    if args.len() > limits.max_args {
        return Err(perr("too many arguments in inline request"));
    }
    Ok(Some(args))
}

/// Splits an inline command line into arguments as Redis does (`sdssplitargs`): words
/// separated by white space; `"double quotes"` with the escapes `\n \r \t \b \a \xHH`
/// (any other escaped byte stands for itself); `'single quotes'` where only `\'` is an
/// escape. A closing quote must end the word; a line holding an unclosed quote, or a quote
/// closed mid-word, is refused (`None`). The line ends at a NUL byte, as Redis reads it as
/// a C string (`inline` refuses such a line before it comes here). White space between words is C's `isspace` (vertical tab and form feed
/// too), but a word outside quotes ends only at a space, tab, CR or LF, as in Redis: `\v`
/// and `\f` inside it are its bytes (split there before 2026-12-05; found by a review's
/// differential run against Redis).
fn split_inline(line: &[u8]) -> Option<Vec<Bytes>> {
    let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    let ends_word = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && space(line[i]) {
            i += 1;
        }
        if i == line.len() {
            return Some(args);
        }
        let mut word = Vec::new();
        // The quote the word is inside, if any.
        let mut quote: Option<u8> = None;
        loop {
            let Some(q) = quote else {
                match line.get(i).copied() {
                    None => break,
                    Some(c) if ends_word(c) => break,
                    Some(c @ (b'"' | b'\'')) => quote = Some(c),
                    Some(c) => word.push(c),
                }
                i += 1;
                continue;
            };
            // Inside quotes the line must close them: its end is an error.
            let b = *line.get(i)?;
            let next = line.get(i + 1).copied();
            let hex_byte = line.get(i + 2).and_then(|&h| hex(h)).zip(line.get(i + 3).and_then(|&h| hex(h)));
            match (q, b, next, hex_byte) {
                (b'"', b'\\', Some(b'x'), Some((hi, lo))) => {
                    word.push(hi * 16 + lo);
                    i += 3;
                }
                (b'"', b'\\', Some(c), _) => {
                    word.push(match c {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                    i += 1;
                }
                (b'\'', b'\\', Some(b'\''), _) => {
                    word.push(b'\'');
                    i += 1;
                }
                // The closing quote, which must end the word.
                (_, c, next, _) if c == q => {
                    if next.is_some_and(|n| !space(n)) {
                        return None;
                    }
                    i += 1;
                    break;
                }
                (_, c, _, _) => word.push(c),
            }
            i += 1;
        }
        args.push(Bytes::from(word));
    }
}

/// Protocol version of a connection (`HELLO 2|3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Resp2,
    Resp3,
}

/// A reply, independent of the protocol version it will be encoded in.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+OK`.
    Ok,
    Simple(&'static str),
    SimpleOwned(String),
    /// An error line, with its code (`ERR`, `WRONGTYPE` ...) as the first word.
    Error(String),
    /// An error line that names a client's bytes as they came, UTF-8 or not (an unknown
    /// command's name and arguments, as Redis echoes them; before 2026-12-06 they were
    /// shown as U+FFFD).
    ErrorRaw(Bytes),
    Int(i64),
    Bulk(Bytes),
    /// A missing value: `$-1` in RESP2, `_` in RESP3.
    Nil,
    /// A missing array (EXEC after a WATCH fired): `*-1` in RESP2, `_` in RESP3.
    NilArray,
    Array(Vec<Reply>),
    /// A map in RESP3, a flat array of key, value, key, value ... in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// A set in RESP3, an array in RESP2.
    Set(Vec<Reply>),
    /// `#t`/`#f` in RESP3, `:1`/`:0` in RESP2.
    Bool(bool),
    /// Text for a person (INFO, CLIENT INFO): a verbatim string of format `txt` in RESP3
    /// (`=N\r\ntxt:...`), a bulk string in RESP2, as Redis 7 answers them (before
    /// 2026-12-05 a bulk string in both; a review).
    Text(Bytes),
    /// A reply written in the protocol given, whatever the connection's: one of an EXEC's
    /// replies made after a queued HELLO changed the protocol (Redis writes each in the
    /// protocol in force when it ran; before 2026-12-06 ditto wrote them all in the one in
    /// force at the EXEC's end).
    In(Proto, Box<Reply>),
}

/// What a reply's size bound counts for each element's framing besides its strings
/// (`Reply::wire_bytes`, and the hash replies' `Keyspace::hash_within`).
pub const ELEMENT_FRAMING_BYTES: usize = 16;

impl Reply {
    /// About the bytes the reply takes on the wire: its strings' lengths, and
    /// `ELEMENT_FRAMING_BYTES` for each element's framing (at least what RESP writes for it).
    pub fn wire_bytes(&self) -> usize {
        ELEMENT_FRAMING_BYTES
            + match self {
                Reply::Ok | Reply::Nil | Reply::NilArray | Reply::Bool(_) => 0,
                // (`:-9223372036854775808\r\n` is 23 bytes: counted as 16, an EXEC of many
                // INCRs passed the bound checked before its commit, and its reply was replaced
                // by an error after it.)
                Reply::Int(_) => 8,
                Reply::Simple(s) => s.len(),
                Reply::SimpleOwned(s) | Reply::Error(s) => s.len(),
                Reply::ErrorRaw(b) => b.len(),
                Reply::Bulk(b) => b.len(),
                Reply::Text(b) => b.len() + 4,
                Reply::Array(v) | Reply::Set(v) => v.iter().map(Reply::wire_bytes).sum(),
                Reply::Map(v) => v.iter().map(|(k, x)| k.wire_bytes() + x.wire_bytes()).sum(),
                Reply::In(_, r) => r.wire_bytes() - ELEMENT_FRAMING_BYTES,
            }
    }

    /// An error line (a CR or LF in it is written as a space: `line`).
    pub fn err(msg: impl Into<String>) -> Reply {
        Reply::Error(msg.into())
    }

    pub fn bulk(b: impl Into<Bytes>) -> Reply {
        Reply::Bulk(b.into())
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_) | Reply::ErrorRaw(_))
    }

    /// Appends the reply to `out` in protocol `proto`.
    pub fn encode(&self, proto: Proto, out: &mut BytesMut) {
        match self {
            Reply::Ok => out.put_slice(b"+OK\r\n"),
            Reply::Simple(s) => line(out, b'+', s.as_bytes()),
            Reply::SimpleOwned(s) => line(out, b'+', s.as_bytes()),
            Reply::Error(s) => line(out, b'-', s.as_bytes()),
            Reply::ErrorRaw(b) => line(out, b'-', b),
            Reply::Int(n) => int_line(out, b':', *n),
            Reply::Bulk(b) => {
                int_line(out, b'$', b.len() as i64);
                out.put_slice(b);
                out.put_slice(b"\r\n");
            }
            Reply::Text(b) => {
                match proto {
                    Proto::Resp3 => {
                        int_line(out, b'=', b.len() as i64 + 4);
                        out.put_slice(b"txt:");
                    }
                    Proto::Resp2 => int_line(out, b'$', b.len() as i64),
                }
                out.put_slice(b);
                out.put_slice(b"\r\n");
            }
            Reply::Nil => out.put_slice(if proto == Proto::Resp3 { b"_\r\n" } else { b"$-1\r\n" }),
            Reply::NilArray => out.put_slice(if proto == Proto::Resp3 { b"_\r\n" } else { b"*-1\r\n" }),
            Reply::Array(items) => {
                int_line(out, b'*', items.len() as i64);
                items.iter().for_each(|r| r.encode(proto, out));
            }
            Reply::Set(items) => {
                int_line(out, if proto == Proto::Resp3 { b'~' } else { b'*' }, items.len() as i64);
                items.iter().for_each(|r| r.encode(proto, out));
            }
            Reply::Map(pairs) => {
                match proto {
                    Proto::Resp3 => int_line(out, b'%', pairs.len() as i64),
                    Proto::Resp2 => int_line(out, b'*', 2 * pairs.len() as i64),
                }
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
            Reply::Bool(b) => match proto {
                Proto::Resp3 => out.put_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
                Proto::Resp2 => int_line(out, b':', *b as i64),
            },
            Reply::In(p, r) => r.encode(*p, out),
        }
    }
}

/// A simple string or error line. A CR or LF in `body` (client bytes some error names,
/// such as an option or subcommand it refuses) is written as a space, as Redis does: the
/// line must end where the client reads its end, or what follows would read as replies.
fn line(out: &mut BytesMut, prefix: u8, body: &[u8]) {
    out.put_u8(prefix);
    if body.iter().any(|&c| c == b'\r' || c == b'\n') {
        out.extend(body.iter().map(|&c| if c == b'\r' || c == b'\n' { b' ' } else { c }));
    } else {
        out.put_slice(body);
    }
    out.put_slice(b"\r\n");
}

fn int_line(out: &mut BytesMut, prefix: u8, n: i64) {
    out.put_u8(prefix);
    out.put_slice(itoa::Buffer::new().format(n).as_bytes());
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use redis_protocol::resp2::decode::decode_bytes_mut;
    use redis_protocol::resp2::types::BytesFrame;

    /// An error or simple string naming a client's bytes with a CR or LF in them stays one
    /// line (they are written as spaces): a client's `HELLO 3 "x\r\n+OK"` was answered
    /// with an error line and a forged `+OK` after it (and, in a debug build, a panic).
    #[test]
    fn a_line_break_in_an_error_or_simple_string_is_written_as_a_space() {
        for (r, want) in [
            (Reply::err("ERR Syntax error in HELLO option 'x\r\n+OK'"), "ERR Syntax error in HELLO option 'x  +OK'"),
            (Reply::SimpleOwned("a\nb\rc".into()), "a b c"),
            (Reply::ErrorRaw(Bytes::from_static(b"ERR unknown command 'x\r\n+OK'")), "ERR unknown command 'x  +OK'"),
        ] {
            let mut out = BytesMut::new();
            r.encode(Proto::Resp2, &mut out);
            let mut copy = out.clone();
            let (frame, used, _) = decode_bytes_mut(&mut copy).unwrap().expect("one whole frame");
            assert_eq!(used, out.len(), "one reply, nothing after it: {out:?}");
            match frame {
                BytesFrame::Error(e) => assert_eq!(&e[..], want),
                BytesFrame::SimpleString(s) => assert_eq!(&s[..], want.as_bytes()),
                other => panic!("{other:?}"),
            }
        }
    }

    /// A bulk length announced with nothing after it makes room for 64 KiB, not for the
    /// length (a client that had not authenticated made the server reserve, and count
    /// against `maxmemory`, 64 MiB with 20 bytes); the argument's bytes, as they arrive,
    /// still make one request whole.
    #[test]
    fn an_announced_length_reserves_only_as_its_bytes_arrive() {
        let limits = Limits::default();
        let mut p = RequestParser::default();
        let mut buf = BytesMut::from(&b"*1\r\n$67108000\r\n"[..]);
        assert_eq!(p.next(&mut buf, &limits), Ok(None));
        assert!(buf.capacity() <= 2 * BULK_ROOM_MIN, "reserved {} bytes", buf.capacity());
        let arg = vec![b'x'; 3 << 20];
        let mut p = RequestParser::default();
        let mut buf = BytesMut::new();
        let whole = encode_request(std::slice::from_ref(&arg));
        let mut got = None;
        for piece in whole.chunks(100_000) {
            buf.extend_from_slice(piece);
            if let Some(r) = p.next(&mut buf, &limits).unwrap() {
                got = Some(r);
            }
        }
        assert_eq!(got.unwrap(), vec![Bytes::from(arg)]);
    }

    fn encode_request(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    fn parse_all(bytes: &[u8], chunk: usize) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let limits = Limits::default();
        let mut p = RequestParser::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            buf.extend_from_slice(piece);
            while let Some(req) = p.next(&mut buf, &limits)? {
                out.push(req);
            }
        }
        assert!(p.is_idle() && buf.is_empty(), "bytes left over after complete requests");
        Ok(out)
    }

    proptest! {
        /// Any pipeline of well-formed requests, cut into reads of any size, parses to the
        /// same arguments as redis-protocol's decoder finds in the whole buffer.
        #[test]
        fn pipelines_parse_like_the_reference_decoder(
            reqs in prop::collection::vec(prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6), 1..8),
            chunk in 1usize..64,
        ) {
            let bytes: Vec<u8> = reqs.iter().flat_map(|r| encode_request(r)).collect();
            let ours = parse_all(&bytes, chunk).unwrap();
            let mut whole = BytesMut::from(&bytes[..]);
            let mut theirs = Vec::new();
            while let Some((frame, _, _)) = decode_bytes_mut(&mut whole).unwrap() {
                let BytesFrame::Array(items) = frame else { panic!("not an array") };
                theirs.push(items.into_iter().map(|f| match f {
                    BytesFrame::BulkString(b) => b,
                    other => panic!("not a bulk string: {other:?}"),
                }).collect::<Vec<_>>());
            }
            prop_assert_eq!(ours, theirs);
        }

        /// Random bytes never panic the parser, and what it returns obeys the limits.
        #[test]
        fn random_bytes_give_requests_or_an_error_never_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let limits = Limits { max_args: 4, max_request_bytes: 64, max_inline_bytes: 32, unauthenticated: false };
            let mut p = RequestParser::default();
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(req)) = p.next(&mut buf, &limits) {
                prop_assert!(req.len() <= 4);
                prop_assert!(req.iter().map(Bytes::len).sum::<usize>() <= 64);
            }
        }
    }

    fn parse_pieces(pieces: &[&[u8]], limits: &Limits) -> (Vec<Vec<Bytes>>, bool) {
        let mut p = RequestParser::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in pieces {
            buf.extend_from_slice(piece);
            loop {
                match p.next(&mut buf, limits) {
                    Ok(Some(req)) => out.push(req),
                    Ok(None) => break,
                    Err(_) => return (out, true),
                }
            }
        }
        (out, false)
    }

    proptest! {
        /// How bytes are cut into reads never changes what is parsed or refused (the same
        /// property the fuzz target checks, on inputs that look like requests).
        #[test]
        fn cutting_reads_anywhere_changes_nothing(
            reqs in prop::collection::vec(prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..5), 1..5),
            noise in prop::collection::vec(any::<u8>(), 0..20),
            at in 0usize..400,
        ) {
            let limits = Limits { max_args: 3, max_request_bytes: 60, max_inline_bytes: 70, unauthenticated: false };
            let mut bytes: Vec<u8> = reqs.iter().flat_map(|r| encode_request(r)).collect();
            bytes.extend_from_slice(&noise);
            let at = at.min(bytes.len());
            prop_assert_eq!(parse_pieces(&[&bytes], &limits), parse_pieces(&[&bytes[..at], &bytes[at..]], &limits));
        }
    }

    /// The benchmark behind writing our own parser (docs/server.md, "Limits and bad
    /// input"): MB/s of requests parsed by ours and by redis-protocol's `decode_bytes_mut`,
    /// on whole buffers and on the same bytes arriving in socket-sized reads, where a
    /// decoder that restarts at the frame's first byte on every read pays again for what it
    /// has already seen. Best of 5 per case.
    /// `cargo test -p ditto-server --release --lib parser_throughput -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn parser_throughput_vs_redis_protocol() {
        use std::time::Instant;
        let set = |i: usize| vec![b"SET".to_vec(), format!("key:{i:012}").into_bytes(), b"xyz".to_vec()];
        let pipeline: Vec<u8> = (0..20_000).flat_map(|i| encode_request(&set(i))).collect();
        let mut mset = vec![b"MSET".to_vec()];
        for i in 0..5_000 {
            mset.push(format!("key:{i:012}").into_bytes());
            mset.push(b"value".to_vec());
        }
        let mset = encode_request(&mset);
        let big = encode_request(&[b"SET".to_vec(), b"k".to_vec(), vec![b'v'; 4 << 20]]);
        let limits = Limits {
            max_args: 1 << 20,
            max_request_bytes: 64 << 20,
            max_inline_bytes: 1 << 16,
            unauthenticated: false,
        };
        let ours = |bytes: &[u8], chunk: usize| -> usize {
            let mut p = RequestParser::default();
            let mut buf = BytesMut::new();
            let mut n = 0;
            for piece in bytes.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(req) = p.next(&mut buf, &limits).unwrap() {
                    n += req.len();
                }
            }
            n
        };
        let theirs = |bytes: &[u8], chunk: usize| -> usize {
            let mut buf = BytesMut::new();
            let mut n = 0;
            for piece in bytes.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some((frame, _, _)) = decode_bytes_mut(&mut buf).unwrap() {
                    let BytesFrame::Array(items) = frame else { panic!("not an array") };
                    n += items.len();
                }
            }
            n
        };
        let mb_s = |f: &dyn Fn(&[u8], usize) -> usize, bytes: &[u8], chunk: usize, args: usize| -> f64 {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                assert_eq!(f(bytes, chunk), args);
                best = best.min(t.elapsed().as_secs_f64());
            }
            bytes.len() as f64 / best / 1e6
        };
        println!("{:<44} {:>12} {:>16} {:>7}", "input", "ours MB/s", "redis-protocol", "ratio");
        let cases: [(&str, &[u8], usize, usize); 6] = [
            ("20,000 SETs, one buffer", &pipeline, pipeline.len(), 60_000),
            ("20,000 SETs, 1,460-byte reads", &pipeline, 1460, 60_000),
            ("MSET of 5,000 pairs, one buffer", &mset, mset.len(), 10_001),
            ("MSET of 5,000 pairs, 1,460-byte reads", &mset, 1460, 10_001),
            ("SET of a 4 MiB value, one buffer", &big, big.len(), 3),
            ("SET of a 4 MiB value, 16 KiB reads", &big, 16 << 10, 3),
        ];
        for (name, bytes, chunk, args) in cases {
            let (a, b) = (mb_s(&ours, bytes, chunk, args), mb_s(&theirs, bytes, chunk, args));
            println!("{name:<44} {a:>12.0} {b:>16.0} {:>6.1}x", a / b);
        }
    }

    /// Before it authenticates, a connection sends at most 10 arguments of at most 16 KiB
    /// each (Redis's limits and messages); the same requests pass once it has.
    #[test]
    fn an_unauthenticated_connections_requests_are_small() {
        let pre = Limits::default().unauthenticated();
        let bulk = |n: usize| format!("*2\r\n$4\r\nAUTH\r\n${n}\r\n{}\r\n", "p".repeat(n));
        let many = |n: usize| format!("*{n}\r\n{}", "$1\r\nx\r\n".repeat(n));
        for (req, refused) in [
            (bulk(UNAUTHENTICATED_BULK_MAX), None),
            (bulk(UNAUTHENTICATED_BULK_MAX + 1), Some("unauthenticated bulk length")),
            (many(UNAUTHENTICATED_ARGS_MAX), None),
            (many(UNAUTHENTICATED_ARGS_MAX + 1), Some("unauthenticated multibulk length")),
        ] {
            let got = RequestParser::default().next(&mut BytesMut::from(req.as_bytes()), &pre);
            match refused {
                Some(why) => assert_eq!(got.unwrap_err().0, why),
                None => assert!(matches!(got, Ok(Some(_))), "{got:?}"),
            }
            let authed = RequestParser::default().next(&mut BytesMut::from(req.as_bytes()), &Limits::default());
            assert!(matches!(authed, Ok(Some(_))), "{authed:?}");
        }
    }

    #[test]
    fn oversized_requests_are_refused_when_announced_not_when_buffered() {
        let limits = Limits { max_args: 3, max_request_bytes: 10, max_inline_bytes: 16, unauthenticated: false };
        let mut p = RequestParser::default();
        let mut buf = BytesMut::from(&b"*4\r\n"[..]);
        assert_eq!(p.next(&mut buf, &limits).unwrap_err().0, "invalid multibulk length");
        let mut p = RequestParser::default();
        let mut buf = BytesMut::from(&b"*2\r\n$6\r\nabcdef\r\n$5\r\n"[..]);
        assert_eq!(p.next(&mut buf, &limits).unwrap_err().0, "invalid bulk length");
        let mut p = RequestParser::default();
        let mut buf = BytesMut::from(&b"*1\r\n$-3\r\n"[..]);
        assert!(p.next(&mut buf, &limits).is_err());
        let mut p = RequestParser::default();
        let mut buf = BytesMut::from(&b"*100000000000000000000\r\n"[..]);
        assert!(p.next(&mut buf, &limits).is_err());
        // A header line that never ends.
        let mut p = RequestParser::default();
        let mut buf = BytesMut::from(&b"*11111111111111111111111111111"[..]);
        assert_eq!(p.next(&mut buf, &limits).unwrap_err().0, "too big mbulk count string");
        // Redis's other words for a bulk's length line that never ends.
        let mut p = RequestParser::default();
        let mut buf = BytesMut::from(&b"*1\r\n$11111111111111111111111111111"[..]);
        assert_eq!(p.next(&mut buf, &limits).unwrap_err().0, "too big bulk count string");
    }

    #[test]
    fn nested_arrays_and_bad_terminators_are_protocol_errors() {
        let limits = Limits::default();
        for bad in [
            &b"*1\r\n*1\r\n$1\r\na\r\n"[..],
            b"*1\r\n:5\r\n",
            b"*1\r\n$1\r\nab\r\n",
            b"*x\r\n",
            b"*1\r\n$z\r\n",
            // Lengths Redis refuses: a `+`, a leading zero, `-0`.
            b"*+1\r\n$1\r\na\r\n",
            b"*1\r\n$03\r\nabc\r\n",
            b"*1\r\n$+3\r\nabc\r\n",
            b"*01\r\n$1\r\na\r\n",
            b"*-0\r\n",
        ] {
            let mut p = RequestParser::default();
            let mut buf = BytesMut::from(bad);
            assert!(p.next(&mut buf, &limits).is_err(), "{:?} was accepted", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn inline_commands_split_on_spaces() {
        let got = parse_all(b"SET  k\tv\r\nPING\n\r\n", 3).unwrap();
        assert_eq!(
            got,
            vec![vec![Bytes::from("SET"), Bytes::from("k"), Bytes::from("v")], vec![Bytes::from("PING")], vec![]]
        );
    }

    /// Quotes and escapes as Redis's `sdssplitargs` reads them (the cases were checked
    /// against redis-server 7.0 over a raw socket).
    #[test]
    fn inline_commands_take_quotes_as_redis_does() {
        let split = |l: &[u8]| split_inline(l).map(|v| v.iter().map(|a| a.to_vec()).collect::<Vec<_>>());
        let words = |w: &[&[u8]]| Some(w.iter().map(|a| a.to_vec()).collect::<Vec<_>>());
        assert_eq!(split(br#"SET "a b" "c\x41\n""#), words(&[b"SET", b"a b", b"cA\n"]));
        assert_eq!(split(br"SET 'x y' 'it\'s'"), words(&[b"SET", b"x y", b"it's"]));
        assert_eq!(split(br#"ECHO "\t\a\b\\\q""#), words(&[b"ECHO", b"\t\x07\x08\\q"]));
        assert_eq!(split(br#"SET k "\xZZ""#), words(&[b"SET", b"k", b"xZZ"]));
        assert_eq!(split(br#"a"b c"d"#), None, "a quote closed mid-word");
        assert_eq!(split(br#"a"b c" d"#), words(&[b"ab c", b"d"]), "a quote opened mid-word");
        assert_eq!(split(br#"GET "a b"#), None, "an unclosed quote");
        assert_eq!(split(b"GET 'a"), None);
        assert_eq!(split(br#"SET "" ''"#), words(&[b"SET", b"", b""]));
        assert_eq!(split(b"PING\0 ignored"), words(&[b"PING"]), "the line ends at a NUL");
        assert_eq!(split(b" \x0b\x0c "), words(&[]));
        // Vertical tab and form feed separate words only where white space is skipped
        // (before a word, after a closing quote): inside a word they are its bytes. Checked
        // against redis-server 7.0.15: `SET a\vb v` sets key "a\vb", `GET\v a` is an
        // unknown command "GET\v", `ECHO 'x'\vy` has two arguments.
        assert_eq!(split(b"SET a\x0bb v"), words(&[b"SET", b"a\x0bb", b"v"]));
        assert_eq!(split(b"GET\x0b a\x0cb"), words(&[b"GET\x0b", b"a\x0cb"]));
        assert_eq!(split(b"\x0b\x0cGET k"), words(&[b"GET", b"k"]));
        assert_eq!(split(b"ECHO 'x'\x0by"), words(&[b"ECHO", b"x", b"y"]));
        // Through the parser: an unbalanced line is a protocol error.
        let mut buf = BytesMut::from(&b"GET \"a b\r\n"[..]);
        let e = RequestParser::default().next(&mut buf, &Limits::default()).unwrap_err();
        assert_eq!(e.to_string(), "Protocol error: unbalanced quotes in request");
        // A NUL byte in an inline line is refused, the line's end come or not: it never
        // runs cut at the NUL (`SET k ab\0cd` stored "ab" before 2026-12-06).
        for line in [&b"SET nulk ab\0cd\r\nGET nulk\r\n"[..], b"SET nulk ab\0cd"] {
            let mut buf = BytesMut::from(line);
            let e = RequestParser::default().next(&mut buf, &Limits::default()).unwrap_err();
            assert_eq!(e.to_string(), "Protocol error: NUL byte in inline request");
        }
        // In a bulk string (RESP's own framing) a NUL is a byte like any.
        let mut buf = BytesMut::from(&b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\na\0b\r\n"[..]);
        let got = RequestParser::default().next(&mut buf, &Limits::default()).unwrap().unwrap();
        assert_eq!(got[2], Bytes::from_static(b"a\0b"));
    }

    #[test]
    fn replies_encode_per_protocol() {
        let r = Reply::Map(vec![(Reply::bulk("a"), Reply::Int(1))]);
        let (mut two, mut three) = (BytesMut::new(), BytesMut::new());
        r.encode(Proto::Resp2, &mut two);
        r.encode(Proto::Resp3, &mut three);
        assert_eq!(&two[..], b"*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(&three[..], b"%1\r\n$1\r\na\r\n:1\r\n");
        for (r, two, three) in [
            (Reply::Nil, &b"$-1\r\n"[..], &b"_\r\n"[..]),
            (Reply::NilArray, b"*-1\r\n", b"_\r\n"),
            (Reply::Bool(true), b":1\r\n", b"#t\r\n"),
            (Reply::Set(vec![Reply::Ok]), b"*1\r\n+OK\r\n", b"~1\r\n+OK\r\n"),
            // INFO's text, as Redis 7.0.15 writes it (read off a raw socket).
            (
                Reply::Text(Bytes::from_static(b"# Server\r\n")),
                b"$10\r\n# Server\r\n\r\n",
                b"=14\r\ntxt:# Server\r\n\r\n",
            ),
        ] {
            let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
            r.encode(Proto::Resp2, &mut a);
            r.encode(Proto::Resp3, &mut b);
            assert_eq!((&a[..], &b[..]), (two, three));
        }
    }
}
