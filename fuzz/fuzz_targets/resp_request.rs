//! Feeds arbitrary bytes to the server's request parser (`RequestParser`), cut into reads
//! at places the input chooses, and checks that it never panics, that every request it
//! returns obeys the limits, and that parsing the same bytes in one piece gives the same
//! requests (the parser's state between reads loses nothing).
#![no_main]

use bytes::{Bytes, BytesMut};
use ditto_server::resp::{Limits, RequestParser};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits { max_args: 16, max_request_bytes: 4096, max_inline_bytes: 256 };

fn parse(pieces: &[&[u8]]) -> (Vec<Vec<Bytes>>, bool) {
    let mut p = RequestParser::default();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match p.next(&mut buf, &LIMITS) {
                Ok(Some(req)) => {
                    assert!(req.len() <= LIMITS.max_args);
                    assert!(req.iter().map(Bytes::len).sum::<usize>() <= LIMITS.max_request_bytes);
                    out.push(req);
                }
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else { return };
    let at = (cut as usize).min(data.len());
    let (whole, whole_err) = parse(&[data]);
    let (split, split_err) = parse(&[&data[..at], &data[at..]]);
    assert_eq!(whole_err, split_err);
    assert_eq!(whole, split);
});
