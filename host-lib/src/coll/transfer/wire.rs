//! The bytes on the wire: every eager segment's header (the message's key, the segment's offset
//! and the message's total length) and the rendezvous control messages, written and parsed here
//! alone. Parsing never trusts the sender: anything that is not exactly one well-formed header
//! or control message is `None`.

use shared_abi::MTU_PAYLOAD;

/// The receive buffers' tag: arrivals carrying another are not the collectives'.
pub const RECEIVE_TAG: u32 = u32::from_le_bytes(*b"NBCL");
/// The first bytes of every segment.
const MAGIC: u32 = u32::from_le_bytes(*b"NBC1");
/// A part no operation's message uses: a message of no bytes under it only asks whether the
/// receiver's port is still open (sending it to a closed one fails), and the receiver drops it.
pub const PROBE_PART: u32 = u32::MAX;

/// The part of a failed operation's notice to its other members: 8 bytes, the rank its sender
/// found missing (little-endian; `u64::MAX`: none), so that a member waiting on the sender fails
/// naming that rank, not the sender ([`Transfers::failed`](super::Transfers::failed)).
pub const FAILED_PART: u32 = u32::MAX - 1;

/// Bytes of the header before each segment's payload.
pub const HEADER_LEN: usize = 32;
/// Payload bytes per segment.
pub const SEGMENT_PAYLOAD: usize = BUFFER_LEN - HEADER_LEN;
/// Payload bytes of a segment that fills whole packets where the NIC cuts a message into
/// packets of [`MTU_PAYLOAD`] (over the wire between daemons): one packet's worth less the header.
pub const PACKET_PAYLOAD: usize = MTU_PAYLOAD - HEADER_LEN;
/// The size class of every send and receive buffer: 64 KiB, so that a message that goes eagerly
/// (below the rendezvous's 64 KiB; from 40 bytes below it, two) is one segment, one NIC
/// message. It takes one send token and one receive buffer whatever its length, and the NIC
/// moves it between the ports of one daemon in one or two packets of its own (over the wire,
/// in packets of [`MTU_PAYLOAD`]). In one-packet segments a 32 KiB message took nine of each,
/// and a root sending it to seven ranks waited for its first segments' ends before it could
/// post the rest (docs/mpi.md, "The NIC level").
pub const SIZE_CLASS: u8 = 16;
/// Bytes of every send and receive buffer: what a message of [`SIZE_CLASS`] holds (GM's
/// `gm_max_length_for_size`).
pub const BUFFER_LEN: usize = shared_abi::max_length_for_size(SIZE_CLASS) as usize;
const _: () = assert!(
    SEGMENT_PAYLOAD + 64 >= super::RENDEZVOUS_THRESHOLD,
    "an eager message is one segment, but for its last 40 bytes"
);
/// The first bytes of every rendezvous control message.
const RENDEZVOUS_MAGIC: u32 = u32::from_le_bytes(*b"NBR1");
/// Bytes of a rendezvous control message.
pub(super) const CONTROL_LEN: usize = 40;

/// What names one message among a sender's: the communicator, the operation on it, and the
/// part of the operation (a phase, a segment of a pipeline).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Key {
    /// The communicator's context id.
    pub context: u32,
    /// The operation's sequence number on the communicator.
    pub sequence: u32,
    /// The part of the operation.
    pub part: u32,
}

/// A segment's header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Header {
    pub(super) key: Key,
    pub(super) offset: u64,
    pub(super) total: u64,
}

impl Header {
    pub(super) fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.key.context.to_le_bytes());
        out[8..12].copy_from_slice(&self.key.sequence.to_le_bytes());
        out[12..16].copy_from_slice(&self.key.part.to_le_bytes());
        out[16..24].copy_from_slice(&self.offset.to_le_bytes());
        out[24..32].copy_from_slice(&self.total.to_le_bytes());
    }

    /// The header of `bytes`, if they start with one.
    pub(super) fn parse(bytes: &[u8]) -> Option<Self> {
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        let long = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        if word(0)? != MAGIC {
            return None;
        }
        Some(Self {
            key: Key {
                context: word(4)?,
                sequence: word(8)?,
                part: word(12)?,
            },
            offset: long(16)?,
            total: long(24)?,
        })
    }
}

/// What a rendezvous control message says.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ControlKind {
    /// Ready to send: `value` is the message's length.
    Ready,
    /// Clear to send: `value` is the remote pointer of the landing region.
    Clear,
    /// The receiver cannot take the message by rendezvous: send it eagerly.
    Refuse,
    /// Every byte is in the landing region.
    Done,
    /// Clear to send before the ready-to-send: the receiver waits for the message, of `id`
    /// bytes, and `value` is the remote pointer of the landing region it registered for it.
    Offer,
}

impl ControlKind {
    pub(super) fn code(self) -> u32 {
        match self {
            Self::Ready => 1,
            Self::Clear => 2,
            Self::Refuse => 3,
            Self::Done => 4,
            Self::Offer => 5,
        }
    }

    pub(super) fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => Self::Ready,
            2 => Self::Clear,
            3 => Self::Refuse,
            4 => Self::Done,
            5 => Self::Offer,
            _ => return None,
        })
    }
}

/// A rendezvous control message: a message's key, the sender's id for it, and a value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Control {
    pub(super) kind: ControlKind,
    pub(super) key: Key,
    /// The sender's id of the message ([`SendId`]): a clear-to-send and a "done" name it. An
    /// offer, which comes before the receiver knows it, holds the message's length instead.
    pub(super) id: u64,
    pub(super) value: u64,
}

impl Control {
    pub(super) fn to_bytes(self) -> [u8; CONTROL_LEN] {
        let mut out = [0u8; CONTROL_LEN];
        out[0..4].copy_from_slice(&RENDEZVOUS_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.key.context.to_le_bytes());
        out[8..12].copy_from_slice(&self.key.sequence.to_le_bytes());
        out[12..16].copy_from_slice(&self.key.part.to_le_bytes());
        out[16..20].copy_from_slice(&self.kind.code().to_le_bytes());
        out[24..32].copy_from_slice(&self.id.to_le_bytes());
        out[32..40].copy_from_slice(&self.value.to_le_bytes());
        out
    }

    /// The control message `bytes` are, if they are exactly one.
    pub(super) fn parse(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != CONTROL_LEN {
            return None;
        }
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let long = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        if word(0) != RENDEZVOUS_MAGIC || word(20) != 0 {
            return None;
        }
        Some(Self {
            kind: ControlKind::from_code(word(16))?,
            key: Key {
                context: word(4),
                sequence: word(8),
                part: word(12),
            },
            id: long(24),
            value: long(32),
        })
    }
}

/// The segments of a message of `total` bytes: (offset, length) each. A message of no bytes is
/// one empty segment, so that its arrival is still seen.
pub fn segments(total: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = segment_count(total);
    (0..count).map(move |index| {
        let offset = index * SEGMENT_PAYLOAD;
        (offset, (total - offset).min(SEGMENT_PAYLOAD))
    })
}

/// How many segments [`segments`] cuts `total` bytes into.
pub(super) fn segment_count(total: usize) -> usize {
    total.div_ceil(SEGMENT_PAYLOAD).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_message_once() {
        for total in [
            0,
            1,
            SEGMENT_PAYLOAD - 1,
            SEGMENT_PAYLOAD,
            SEGMENT_PAYLOAD + 1,
            5 * SEGMENT_PAYLOAD + 7,
        ] {
            let parts: Vec<_> = segments(total).collect();
            assert_eq!(parts.len(), segment_count(total));
            let mut next = 0;
            for (offset, length) in parts {
                assert_eq!(offset, next, "total {total}");
                assert!(length <= SEGMENT_PAYLOAD);
                next += length;
            }
            assert_eq!(next, total);
        }
    }

    #[test]
    fn a_control_message_round_trips_and_garbage_is_none() {
        let control = Control {
            kind: ControlKind::Clear,
            key: Key {
                context: 7,
                sequence: 9,
                part: 3,
            },
            id: 1 << 40,
            value: u64::MAX - 5,
        };
        let bytes = control.to_bytes();
        assert_eq!(Control::parse(&bytes), Some(control));
        // Nor is a control message a segment, or a segment a control message.
        assert_eq!(Header::parse(&bytes), None);
        let mut segment = [0u8; CONTROL_LEN];
        Header {
            key: control.key,
            offset: 0,
            total: 8,
        }
        .write(&mut segment);
        assert_eq!(Control::parse(&segment), None);
        // Short, long, an unknown kind, the reserved word set, another magic.
        assert_eq!(Control::parse(&bytes[..CONTROL_LEN - 1]), None);
        assert_eq!(Control::parse(&[&bytes[..], &[0]].concat()), None);
        for (at, value) in [(16, 9u8), (20, 1), (0, b'X')] {
            let mut bad = bytes;
            bad[at] = value;
            assert_eq!(Control::parse(&bad), None, "byte {at} = {value}");
        }
    }

    #[test]
    fn a_header_round_trips_and_garbage_is_no_header() {
        let header = Header {
            key: Key {
                context: 7,
                sequence: 9,
                part: 3,
            },
            offset: 4064,
            total: 1 << 33,
        };
        let mut bytes = [0u8; HEADER_LEN];
        header.write(&mut bytes);
        assert_eq!(Header::parse(&bytes), Some(header));
        assert_eq!(Header::parse(&bytes[..HEADER_LEN - 1]), None);
        bytes[0] ^= 1;
        assert_eq!(Header::parse(&bytes), None);
    }
}
