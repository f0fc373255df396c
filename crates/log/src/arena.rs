//! Where recovery keeps the keys it installs (from log payloads, which live in scratch
//! buffers reused batch after batch, and from checkpoint parts, which would otherwise stay
//! in memory whole for their keys' sake): packed into shared chunks, so that a kept key
//! costs a copy and a reference count, not an allocation of its own. A chunk is freed once
//! no record's key refers to it.

use bytes::{Bytes, BytesMut};

#[derive(Default)]
pub(crate) struct KeyArena {
    chunk: BytesMut,
}

impl KeyArena {
    const CHUNK: usize = 1 << 20;

    pub(crate) fn copy(&mut self, part: &[u8]) -> Bytes {
        if self.chunk.capacity() - self.chunk.len() < part.len() {
            self.chunk = BytesMut::with_capacity(Self::CHUNK.max(part.len()));
        }
        self.chunk.extend_from_slice(part);
        self.chunk.split().freeze()
    }
}
