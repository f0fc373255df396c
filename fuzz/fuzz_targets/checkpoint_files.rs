//! Feeds arbitrary bytes to a checkpoint's readers: `Manifest::decode` and
//! `checkpoint::check_part` (a part's checks, as its load makes them, installing nothing),
//! and checks that they never panic and that what they accept is what they were given: a
//! decoded MANIFEST encodes to the same bytes, a checked part holds the rows its trailer
//! and its manifest's entry say.
//!
//! Random bytes almost never carry a valid checksum, which would confine the fuzzer to it.
//! So the first input byte selects a mode:
//!   bit 0: the MANIFEST's checksum made to agree with the bytes before it
//!   bit 1: the part given a valid header (magic, version, part 0, the manifest's ts) and
//!          trailer (end magic, a row count of the next input byte) around the rest
//!   bit 2: the part's manifest entry made to agree with the part (length, checksum)
#![no_main]

use std::path::Path;

use ditto_engine::{TableId, Ts};
use ditto_log::checkpoint::{check_part, Manifest, PartInfo, CHECKPOINT_FORMAT_VERSION};
use libfuzzer_sys::fuzz_target;

const TS: Ts = Ts(1 << 20);

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let mut manifest = data.to_vec();
    if mode & 1 != 0 && manifest.len() >= 4 {
        let body = manifest.len() - 4;
        let crc = crc32c::crc32c(&manifest[..body]);
        manifest[body..].copy_from_slice(&crc.to_le_bytes());
    }
    if let Ok(m) = Manifest::decode(&manifest, Path::new("MANIFEST")) {
        assert_eq!(m.encode(), manifest, "a decoded manifest encodes to the same bytes");
    }

    let mut part = data.to_vec();
    let mut rows = 0;
    if mode & 2 != 0 {
        rows = data.first().copied().unwrap_or(0) as u64;
        let mut b = Vec::with_capacity(data.len() + 56);
        b.extend_from_slice(b"DITTOCKP");
        b.extend_from_slice(&CHECKPOINT_FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&TS.0.to_le_bytes());
        b.extend_from_slice(&[0u8; 8]);
        b.extend_from_slice(data.get(1..).unwrap_or_default());
        b.extend_from_slice(b"DITTOEND");
        b.extend_from_slice(&rows.to_le_bytes());
        b.extend_from_slice(&[0u8; 8]);
        part = b;
    }
    let info = match mode & 4 != 0 {
        true => PartInfo { rows, bytes: part.len() as u64, crc: crc32c::crc32c(&part) },
        false => PartInfo { rows, bytes: data.len() as u64, crc: 0 },
    };
    if let Ok(n) = check_part(Path::new("part-0000.dat"), &part, 0, TS, &info, |t| t == TableId(0) || t == TableId(3)) {
        assert_eq!(n, info.rows, "a checked part holds the rows its manifest names");
        assert_eq!(part.len() as u64, info.bytes);
        assert_eq!(crc32c::crc32c(&part), info.crc);
    }
});
