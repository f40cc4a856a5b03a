//! A message's bytes as the transfers hold them: owned by the process, or in a registered
//! region the NIC reads and writes itself — so a rendezvous puts from where the bytes already
//! are, and a landed message is copied once, into the caller's buffer.

use std::sync::Arc;

use super::pool::Lent;

/// The bytes of a message to send. Clones share them (one message to several receivers).
/// [`Transfers::stage`](super::Transfers::stage) makes one from a caller's bytes.
#[derive(Clone)]
pub struct Payload(Bytes);

#[derive(Clone)]
enum Bytes {
    Owned(Arc<[u8]>),
    /// The first `len` bytes of a registered region: a rendezvous puts them from there.
    Staged(Lent, usize),
}

impl Payload {
    /// The first `len` bytes of `region`.
    pub(super) fn staged(region: Lent, len: usize) -> Self {
        Self(Bytes::Staged(region, len))
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        match &self.0 {
            Bytes::Owned(bytes) => bytes.len(),
            Bytes::Staged(_, len) => *len,
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The registered region the bytes are staged in, if they are.
    pub(super) fn region(&self) -> Option<&Lent> {
        match &self.0 {
            Bytes::Owned(_) => None,
            Bytes::Staged(region, _) => Some(region),
        }
    }

    /// The bytes as owned bytes (copied out of a region they are staged in).
    pub(super) fn owned(&self) -> Arc<[u8]> {
        match &self.0 {
            Bytes::Owned(bytes) => bytes.clone(),
            Bytes::Staged(region, len) => region.bytes().to_vec(0, *len).into(),
        }
    }
}

impl From<Arc<[u8]>> for Payload {
    fn from(bytes: Arc<[u8]>) -> Self {
        Self(Bytes::Owned(bytes))
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Self(Bytes::Owned(bytes.into()))
    }
}

/// A message that arrived whole, until the caller takes it.
pub(super) enum Arrived {
    /// Assembled from eager segments.
    Assembled(Vec<u8>),
    /// Put into a landing region by rendezvous (its first `len` bytes).
    Landed(Lent, usize),
}

impl Arrived {
    /// Bytes.
    pub(super) fn len(&self) -> usize {
        match self {
            Self::Assembled(bytes) => bytes.len(),
            Self::Landed(_, len) => *len,
        }
    }

    /// The bytes, owned.
    pub(super) fn into_vec(self) -> Vec<u8> {
        match self {
            Self::Assembled(bytes) => bytes,
            Self::Landed(region, len) => region.bytes().to_vec(0, len),
        }
    }

    /// Copies the bytes into `out`, which is as long.
    pub(super) fn copy_to(&self, out: &mut [u8]) {
        match self {
            Self::Assembled(bytes) => out.copy_from_slice(bytes),
            Self::Landed(region, _) => region.bytes().read(0, out),
        }
    }
}
