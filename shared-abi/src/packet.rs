//! The wire packet: a fixed header, then the payload.
//!
//! [`Packet::new_checked`] validates a received byte slice once (magic, version, kind, length);
//! after that every accessor is infallible. [`PacketHeader`] is the plain layout used to build one.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::ids::{Generation, NodeId, PortId};

/// First byte of every nicbar packet.
pub const PACKET_MAGIC: u8 = 0x4e;
/// Wire format version, second byte of every packet.
pub const WIRE_VERSION: u8 = 5;

/// What a packet is.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(transparent)]
pub struct PacketKind(pub u8);

impl PacketKind {
    /// A message (sequenced).
    pub const DATA: Self = Self(1);
    /// A cumulative acknowledgement: `ack` is the next sequence number expected (unsequenced).
    pub const ACK: Self = Self(2);
    /// A gap was seen: resend from `ack` (unsequenced, go-back-N).
    pub const NACK: Self = Self(3);
    /// The packet `seq` was not accepted, for `reason` (unsequenced; see [`RejectReason`]).
    pub const REJECT: Self = Self(4);
    /// One barrier step's message (sequenced, paper §3.3): `aux` names the step's round, and the
    /// payload ([`BarrierPayload`]) names the barrier it belongs to — and, when the sender's
    /// barrier failed, the member it failed waiting for, so that the failure reaches every member
    /// still waiting, naming the same member. A broadcast's packets (a
    /// [`crate::token::SendKind::BROADCAST`] barrier) may carry the root's bytes after it: up to
    /// [`BROADCAST_MAX`] of them.
    pub const BARRIER: Self = Self(5);
    /// The source port closed: generation `src_generation` is dead (sequenced).
    pub const PORT_CLOSED: Self = Self(6);
    /// A sequence slot whose message was withdrawn (its port closed, or it was given up);
    /// the receiver takes it and delivers nothing (sequenced).
    pub const CANCELLED: Self = Self(7);
    /// One segment of a put (sequenced): an [`crate::rdma::RdmaHeader`], then the data to write
    /// into the target's registered memory.
    pub const RDMA_WRITE: Self = Self(8);
    /// A get's request (sequenced): an [`crate::rdma::RdmaHeader`] naming what to read.
    pub const RDMA_READ: Self = Self(9);
    /// A get's data, from its target back to its initiator (sequenced): an
    /// [`crate::rdma::RdmaHeader`], then the data.
    pub const RDMA_READ_DATA: Self = Self(10);
    /// An atomic on a word of the target's registered memory (sequenced).
    pub const ATOMIC: Self = Self(11);
    /// The end of a put, the refusal of a put, get or atomic, or an atomic's result, from the
    /// target back to the initiator (sequenced).
    pub const RDMA_REPLY: Self = Self(12);

    /// One segment of a message longer than a packet (sequenced): a [`DataSegmentHeader`], then
    /// the segment's bytes. `priority` and `size` are the message's, as in [`Self::DATA`]; the
    /// segments of one message follow one another on the connection, from offset 0, with no
    /// other message of the same source port between them.
    pub const DATA_SEGMENT: Self = Self(13);

    /// A session handshake (not sequenced): a [`HelloPayload`], authenticated under the fabric
    /// key itself; every other packet between two NICs is authenticated under the key of their
    /// session, derived from the fabric key and the nonces both sides offered. `aux` holds
    /// [`HelloFlags`].
    pub const HELLO: Self = Self(14);

    /// Whether packets of this kind occupy a sequence number.
    pub const fn is_sequenced(self) -> bool {
        matches!(self.0, 1 | 5 | 6 | 7 | 13) || self.is_rdma()
    }

    /// Whether the value names a known kind.
    pub const fn is_known(self) -> bool {
        self.0 >= 1 && self.0 <= 7 || self.0 == 13 || self.0 == 14 || self.is_rdma()
    }

    /// Whether packets of this kind are one-sided operations or their answers (kinds 8 to 12;
    /// all sequenced: exactly-once comes from the connection's sequence numbers).
    pub const fn is_rdma(self) -> bool {
        self.0 >= 8 && self.0 <= 12
    }
}

/// Why a packet was not accepted, carried in `aux` of a [`PacketKind::REJECT`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(transparent)]
pub struct RejectReason(pub u8);

impl RejectReason {
    /// The destination port is closed (or not the generation the packet was meant for).
    pub const PORT_CLOSED: Self = Self(1);
    /// The destination port has no receive buffer of the message's size and priority.
    pub const NO_BUFFER: Self = Self(2);
    /// The receiving NIC has no room to record the packet now (a barrier record or connection
    /// table is full).
    pub const BUSY: Self = Self(3);
    /// The receiving NIC holds no state for the packet's epoch (it recycled the connection after
    /// a long silence, or restarted): the sender resends its stream's start, or begins a new epoch.
    pub const UNKNOWN_EPOCH: Self = Self(4);
    /// The destination port is closed, and its last owner ran barriers of the packet's job: it is
    /// gone for good (not "not open yet"), and the sender's barrier fails at once.
    pub const PORT_GONE: Self = Self(5);
    /// A segment of a long message that continues no message the receiver is assembling (it
    /// lost the message's start with a new epoch): the sender fails the message.
    pub const INCOMPLETE: Self = Self(6);
}

/// The header at the start of a [`PacketKind::DATA_SEGMENT`] packet's payload. 8 bytes.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(C)]
pub struct DataSegmentHeader {
    /// The whole message's length in bytes.
    pub total: U32,
    /// Where this segment's bytes start in the message.
    pub offset: U32,
}
const _: () = assert!(core::mem::size_of::<DataSegmentHeader>() == 8);

/// Bytes of a message one [`PacketKind::DATA_SEGMENT`] packet carries (every segment but the
/// last carries exactly this many).
pub const DATA_SEGMENT: usize = crate::MTU_PAYLOAD - core::mem::size_of::<DataSegmentHeader>();
/// Data bytes one segment of a long message carries on a route that never leaves the board's
/// memory ([`crate::LOCAL_MTU_PAYLOAD`]): whole pages, as a put's there.
pub const LOCAL_DATA_SEGMENT: usize = 15 * crate::MTU_PAYLOAD;
const _: () = assert!(
    LOCAL_DATA_SEGMENT + core::mem::size_of::<DataSegmentHeader>() <= crate::LOCAL_MTU_PAYLOAD
);

/// Packet flags.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(transparent)]
pub struct PacketFlags(pub u8);

bitflags::bitflags! {
    impl PacketFlags: u8 {
        /// `ack`/`ack_epoch` carry a valid piggybacked acknowledgement.
        const ACK_VALID = 0x01;
        /// The first packet of a connection epoch: the receiver may start a new epoch with it.
        const SYN = 0x02;
        /// The sender waits on this packet's acknowledgement: send it at once, not delayed.
        const ACK_REQUEST = 0x04;
    }
}

/// The header that starts every packet. 40 bytes.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(C)]
pub struct PacketHeader {
    /// [`PACKET_MAGIC`].
    pub magic: u8,
    /// [`WIRE_VERSION`].
    pub version: u8,
    /// [`PacketKind`].
    pub kind: PacketKind,
    /// [`PacketFlags`].
    pub flags: PacketFlags,
    /// Sending NIC.
    pub src_node: NodeId,
    /// Receiving NIC.
    pub dst_node: NodeId,
    /// Sending port (data, barrier, port closed).
    pub src_port: PortId,
    /// Receiving port (data, barrier).
    pub dst_port: PortId,
    /// Data: message priority.
    pub priority: u8,
    /// Data: message size class. Barrier: [`BARRIER_CARRIES_REDUCTION`] if the bytes after its
    /// payload are a reduction's value (else a broadcast's bytes, or none).
    pub size: u8,
    /// Barrier: the step's round. Reject: the [`RejectReason`].
    pub aux: u8,
    /// Sequenced packets: which transmission of this sequence number this is (wrapping). A REJECT
    /// echoes the number of the transmission it refuses, so the sender can tell a stale refusal —
    /// a duplicate, or one overtaken by a later transmission the receiver accepted — from a
    /// current one.
    pub transmission: u8,
    /// Payload length in bytes.
    pub length: U16,
    /// Generation of the sending port (data, barrier, port closed).
    pub src_generation: Generation,
    /// Sender's epoch for this connection (sequenced packets); for a REJECT, the epoch of the
    /// refused packet (a NACK's epoch is `ack_epoch`, with `ack`).
    pub epoch: U32,
    /// Sequence number (sequenced packets), or the rejected packet's (reject).
    pub seq: U32,
    /// Cumulative acknowledgement: the next sequence number expected from the receiver of
    /// this packet, valid with [`PacketFlags::ACK_VALID`] or in ACK/NACK packets.
    pub ack: U32,
    /// The receiver's epoch that `ack` refers to.
    pub ack_epoch: U32,
    /// Barrier packets: the sender's attempt number for this (source port, destination port)
    /// pair (wrapping). A receiver that refused a barrier packet because its port was closed
    /// refuses every packet of that attempt or older from the pair; the sender withdraws them and
    /// sends them again under a newer attempt, in order — so a copy still in flight is never taken
    /// as well as its resent twin.
    pub attempt: u8,
    /// Reserved, zero.
    pub reserved1: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<PacketHeader>() == 40);

/// The payload of a [`PacketKind::BARRIER`] packet. 16 bytes.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(C)]
pub struct BarrierPayload {
    /// The barrier the packet belongs to.
    pub barrier: crate::ids::BarrierId,
    /// An abort: the node of the member the sender's barrier failed waiting for.
    pub failed_node: NodeId,
    /// An abort: that member's port.
    pub failed_port: PortId,
    /// [`crate::event::Status`] of the sender's failure; `SUCCESS` (0) for an ordinary packet.
    /// An abort completes the receiver's step as a failure: its barrier fails too, naming the
    /// same member for the same reason.
    pub failed_status: crate::event::Status,
}

/// The payload of a [`PacketKind::HELLO`] packet. 32 bytes.
///
/// A NIC offers a fresh random nonce per session it starts or answers, and binds each nonce at
/// most once: a session is the pair (our nonce, theirs), and it is established when the other
/// side shows it saw our offer (it echoes our nonce, or sends a packet under the pair's key).
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(C)]
pub struct HelloPayload {
    /// The sender's offered nonce (never zero in an offer; zero with [`HelloFlags::NO_SESSION`]
    /// or [`HelloFlags::BUSY`]).
    pub nonce: U64,
    /// The receiver's nonce this answers, or zero for an opening offer.
    pub echo: U64,
    /// The session whose reliability state (sequence numbers, epochs) the sender still holds
    /// toward the receiver: the sender's nonce of it and the receiver's, or zeros. When the
    /// receiver holds the same one, both keep their streams across the new session; otherwise
    /// both start their streams afresh.
    pub kept_ours: U64,
    /// See `kept_ours`.
    pub kept_theirs: U64,
}
const _: () = assert!(core::mem::size_of::<HelloPayload>() == 32);

/// Payload bytes of a [`PacketKind::HELLO`] packet.
pub const HELLO_PAYLOAD_LEN: usize = core::mem::size_of::<HelloPayload>();

/// The flags of a [`PacketKind::HELLO`] packet, in `aux`.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(transparent)]
pub struct HelloFlags(pub u8);

impl HelloFlags {
    /// The sender holds no session with the receiver: a packet it could not authenticate came
    /// from the receiver's address. A receiver with packets in flight to it offers a new one.
    pub const NO_SESSION: Self = Self(1);
    /// The sender has no room for a connection to the receiver now (`echo` names the offer it
    /// answers): the receiver keeps trying, paced.
    pub const BUSY: Self = Self(2);
    /// The sender established the session (`nonce`, `echo`): the receiver, if it still waits,
    /// establishes it too, and never answers a confirmation with another.
    pub const CONFIRM: Self = Self(4);
}

/// Payload bytes of a [`PacketKind::BARRIER`] packet ([`BarrierPayload`]), before a broadcast's
/// bytes.
pub const BARRIER_PAYLOAD_LEN: usize = core::mem::size_of::<BarrierPayload>();
const _: () = assert!(BARRIER_PAYLOAD_LEN == 16);

/// The most bytes a broadcast carries (defined by the completion event that holds them inline,
/// [`crate::event::BROADCAST_MAX`]). A barrier packet of a broadcast carries them after its
/// [`BarrierPayload`].
pub use crate::event::BROADCAST_MAX;

/// Size of the packet header in bytes.
pub const HEADER_LEN: usize = core::mem::size_of::<PacketHeader>();
/// Largest packet in bytes.
pub const MAX_PACKET_LEN: usize = HEADER_LEN + crate::MTU_PAYLOAD;
/// Bytes of the message authentication code an authenticated fabric appends to every packet.
pub const MAC_LEN: usize = 16;
/// Largest datagram on the wire: a packet and its authentication trailer.
pub const MAX_WIRE_LEN: usize = MAX_PACKET_LEN + MAC_LEN;

/// Why bytes are not a packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PacketError {
    /// Fewer bytes than a header.
    Truncated {
        /// How many bytes there were.
        len: usize,
    },
    /// The first byte is not [`PACKET_MAGIC`].
    BadMagic(u8),
    /// The wire version is not [`WIRE_VERSION`].
    BadVersion(u8),
    /// The kind is not one this version knows.
    UnknownKind(u8),
    /// A packet of a kind with a bounded payload (a barrier packet) carries another length.
    BadPayload {
        /// The packet's kind.
        kind: u8,
        /// Bytes after the header.
        actual: usize,
    },
    /// The header's length field disagrees with the bytes that follow it.
    BadLength {
        /// The header's length field.
        claimed: u16,
        /// Bytes after the header.
        actual: usize,
    },
}

impl core::fmt::Display for PacketError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Truncated { len } => write!(f, "packet of {len} bytes is shorter than a header"),
            Self::BadMagic(m) => write!(f, "bad packet magic {m:#04x}"),
            Self::BadVersion(v) => write!(f, "unsupported wire version {v}"),
            Self::UnknownKind(k) => write!(f, "unknown packet kind {k}"),
            Self::BadLength { claimed, actual } => {
                write!(f, "header claims {claimed} payload bytes, {actual} follow")
            }
            Self::BadPayload { kind, actual } => {
                write!(
                    f,
                    "a packet of kind {kind} cannot carry {actual} payload bytes"
                )
            }
        }
    }
}

/// A checked view of a packet in a byte buffer.
#[derive(Clone, Copy, Debug)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks `buffer` once: a whole header, the magic, the version, a known kind, a length
    /// field that matches the payload that follows (not above [`crate::MTU_PAYLOAD`]), and a
    /// barrier packet's payload of [`BARRIER_PAYLOAD_LEN`] bytes and at most [`BROADCAST_MAX`]
    /// broadcast bytes after them.
    ///
    /// # Errors
    /// [`PacketError`] says which check failed. Never panics, whatever the bytes.
    pub fn new_checked(buffer: T) -> Result<Self, PacketError> {
        Self::check(buffer, false)
    }

    /// [`Packet::new_checked`] of a packet that came over a route that never left the board's
    /// memory, where a segment of a put ([`PacketKind::RDMA_WRITE`]), of a get's data
    /// ([`PacketKind::RDMA_READ_DATA`]) or of a long message ([`PacketKind::DATA_SEGMENT`]) may
    /// carry up to [`crate::LOCAL_MTU_PAYLOAD`] bytes; every other kind as on the wire.
    ///
    /// # Errors
    /// As [`Packet::new_checked`].
    pub fn new_checked_local(buffer: T) -> Result<Self, PacketError> {
        Self::check(buffer, true)
    }

    fn check(buffer: T, local: bool) -> Result<Self, PacketError> {
        let bytes = buffer.as_ref();
        let Ok((header, payload)) = PacketHeader::ref_from_prefix(bytes) else {
            return Err(PacketError::Truncated { len: bytes.len() });
        };
        if header.magic != PACKET_MAGIC {
            return Err(PacketError::BadMagic(header.magic));
        }
        if header.version != WIRE_VERSION {
            return Err(PacketError::BadVersion(header.version));
        }
        if !header.kind.is_known() {
            return Err(PacketError::UnknownKind(header.kind.0));
        }
        let claimed = header.length.get();
        let long = matches!(
            header.kind,
            PacketKind::RDMA_WRITE | PacketKind::RDMA_READ_DATA | PacketKind::DATA_SEGMENT
        );
        let most = if local && long {
            crate::LOCAL_MTU_PAYLOAD
        } else {
            crate::MTU_PAYLOAD
        };
        if claimed as usize != payload.len() || payload.len() > most {
            return Err(PacketError::BadLength {
                claimed,
                actual: payload.len(),
            });
        }
        if header.kind == PacketKind::BARRIER
            && !(BARRIER_PAYLOAD_LEN..=BARRIER_PAYLOAD_LEN + BROADCAST_MAX).contains(&payload.len())
        {
            return Err(PacketError::BadPayload {
                kind: header.kind.0,
                actual: payload.len(),
            });
        }
        if header.kind == PacketKind::HELLO && payload.len() != HELLO_PAYLOAD_LEN {
            return Err(PacketError::BadPayload {
                kind: header.kind.0,
                actual: payload.len(),
            });
        }
        Ok(Self { buffer })
    }

    /// The header.
    pub fn header(&self) -> &PacketHeader {
        // The prefix was checked in `new_checked`; `ref_from_prefix` cannot fail for these bytes
        // now, so the fallback is never taken (and costs nothing to keep panic-free).
        match PacketHeader::ref_from_prefix(self.buffer.as_ref()) {
            Ok((header, _)) => header,
            Err(_) => &EMPTY_HEADER,
        }
    }

    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(HEADER_LEN..).unwrap_or(&[])
    }

    /// The whole packet's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

static EMPTY_HEADER: PacketHeader = PacketHeader {
    magic: 0,
    version: 0,
    kind: PacketKind(0),
    flags: PacketFlags(0),
    src_node: NodeId::new(0),
    dst_node: NodeId::new(0),
    src_port: PortId(0),
    dst_port: PortId(0),
    priority: 0,
    size: 0,
    aux: 0,
    transmission: 0,
    length: U16::new(0),
    src_generation: Generation::new(0),
    epoch: U32::new(0),
    seq: U32::new(0),
    ack: U32::new(0),
    ack_epoch: U32::new(0),
    attempt: 0,
    reserved1: [0; 3],
};

impl PacketHeader {
    /// A header of `kind` from `src_node` to `dst_node` with magic and version filled in and
    /// everything else zero.
    pub fn new(kind: PacketKind, src_node: NodeId, dst_node: NodeId) -> Self {
        Self {
            magic: PACKET_MAGIC,
            version: WIRE_VERSION,
            kind,
            src_node,
            dst_node,
            ..Self::default()
        }
    }

    /// Writes this header followed by `payload` into `out`, setting the length field.
    /// Returns the packet's length, or `None` if `out` is too small or the payload exceeds
    /// [`crate::MTU_PAYLOAD`].
    pub fn emit(&self, payload: &[u8], out: &mut [u8]) -> Option<usize> {
        if payload.len() > crate::MTU_PAYLOAD {
            return None;
        }
        let total = HEADER_LEN.checked_add(payload.len())?;
        let out = out.get_mut(..total)?;
        let mut header = *self;
        header.length = U16::new(payload.len() as u16);
        out.get_mut(..HEADER_LEN)?
            .copy_from_slice(header.as_bytes());
        out.get_mut(HEADER_LEN..)?.copy_from_slice(payload);
        Some(total)
    }
}

/// A barrier packet's header `size` when the bytes after its [`BarrierPayload`] are the value a
/// reduction's step sends (at most [`crate::reduce::REDUCE_MAX`] bytes).
pub const BARRIER_CARRIES_REDUCTION: u8 = 1;

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use proptest::prelude::*;

    fn header_strategy() -> impl Strategy<Value = PacketHeader> {
        (any::<[u8; HEADER_LEN]>(), 1u8..=13).prop_map(|(bytes, kind)| {
            let mut header = PacketHeader::read_from_bytes(&bytes[..]).unwrap();
            header.magic = PACKET_MAGIC;
            header.version = WIRE_VERSION;
            header.kind = PacketKind(kind);
            header
        })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(packet) = Packet::new_checked(&bytes[..]) {
                prop_assert_eq!(packet.header().length.get() as usize, packet.payload().len());
                prop_assert!(packet.header().kind.is_known());
            }
        }

        #[test]
        fn every_valid_packet_round_trips(
            header in header_strategy(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            // A barrier packet carries its barrier's identity and at most a broadcast's bytes.
            let mut payload = payload;
            if header.kind == PacketKind::BARRIER {
                let extra = payload.len() % (BROADCAST_MAX + 1);
                payload.resize(BARRIER_PAYLOAD_LEN + extra, 0);
            }
            let mut out = [0u8; MAX_PACKET_LEN];
            let len = header.emit(&payload, &mut out).unwrap();
            let packet = Packet::new_checked(&out[..len]).unwrap();
            let mut expected = header;
            expected.length = U16::new(payload.len() as u16);
            prop_assert_eq!(packet.header(), &expected);
            prop_assert_eq!(packet.payload(), &payload[..]);
            // Any truncation of a valid packet is refused.
            for cut in [0, 1, HEADER_LEN - 1, len.saturating_sub(1)] {
                if cut < len {
                    prop_assert!(Packet::new_checked(&out[..cut]).is_err());
                }
            }
        }
    }

    #[test]
    fn a_barrier_packet_carries_its_identity_and_at_most_a_broadcasts_bytes() {
        let header = PacketHeader::new(PacketKind::BARRIER, NodeId::new(1), NodeId::new(2));
        let mut out = [0u8; MAX_PACKET_LEN];
        for extra in 0..=BROADCAST_MAX {
            let len = header
                .emit(
                    &[7; BARRIER_PAYLOAD_LEN + BROADCAST_MAX][..BARRIER_PAYLOAD_LEN + extra],
                    &mut out,
                )
                .unwrap();
            assert!(Packet::new_checked(&out[..len]).is_ok(), "{extra} bytes");
        }
        for actual in [
            0,
            1,
            BARRIER_PAYLOAD_LEN - 1,
            BARRIER_PAYLOAD_LEN + BROADCAST_MAX + 1,
            200,
        ] {
            let len = header.emit(&[7; 200][..actual], &mut out).unwrap();
            assert_eq!(
                Packet::new_checked(&out[..len]).unwrap_err(),
                PacketError::BadPayload {
                    kind: PacketKind::BARRIER.0,
                    actual
                }
            );
        }
    }

    #[test]
    fn refusals_say_why() {
        let mut out = [0u8; MAX_PACKET_LEN];
        let header = PacketHeader::new(PacketKind::DATA, NodeId::new(1), NodeId::new(2));
        let len = header.emit(b"hello", &mut out).unwrap();
        out[0] = 0;
        assert_eq!(
            Packet::new_checked(&out[..len]).unwrap_err(),
            PacketError::BadMagic(0)
        );
        out[0] = PACKET_MAGIC;
        out[1] = 9;
        assert_eq!(
            Packet::new_checked(&out[..len]).unwrap_err(),
            PacketError::BadVersion(9)
        );
        out[1] = WIRE_VERSION;
        out[2] = 0xee;
        assert_eq!(
            Packet::new_checked(&out[..len]).unwrap_err(),
            PacketError::UnknownKind(0xee)
        );
        out[2] = PacketKind::DATA.0;
        assert_eq!(
            Packet::new_checked(&out[..len + 1]).unwrap_err(),
            PacketError::BadLength {
                claimed: 5,
                actual: 6
            }
        );
        assert!(
            header
                .emit(&[0; crate::MTU_PAYLOAD + 1], &mut out)
                .is_none()
        );
    }

    /// A packet of `kind` with `payload` bytes after its header, the length field saying so.
    fn long_packet(kind: PacketKind, payload: usize) -> std::vec::Vec<u8> {
        let mut header = PacketHeader::new(kind, NodeId::new(1), NodeId::new(2));
        header.length = U16::new(payload as u16);
        let mut bytes = header.as_bytes().to_vec();
        bytes.resize(HEADER_LEN + payload, 0xab);
        bytes
    }

    #[test]
    fn only_segments_on_a_route_within_the_board_carry_more_than_the_wire_does() {
        let local = crate::LOCAL_MTU_PAYLOAD;
        for payload in [crate::MTU_PAYLOAD + 1, local] {
            let refused = PacketError::BadLength {
                claimed: payload as u16,
                actual: payload,
            };
            for kind in [
                PacketKind::RDMA_WRITE,
                PacketKind::RDMA_READ_DATA,
                PacketKind::DATA_SEGMENT,
            ] {
                assert!(Packet::new_checked_local(&long_packet(kind, payload)[..]).is_ok());
                assert_eq!(
                    Packet::new_checked(&long_packet(kind, payload)[..]).unwrap_err(),
                    refused,
                    "kind {} from the wire",
                    kind.0
                );
            }
            for kind in [PacketKind::DATA, PacketKind::RDMA_READ, PacketKind::BARRIER] {
                assert_eq!(
                    Packet::new_checked_local(&long_packet(kind, payload)[..]).unwrap_err(),
                    refused,
                    "kind {}",
                    kind.0
                );
            }
        }
        let put = PacketKind::RDMA_WRITE;
        assert!(
            Packet::new_checked_local(&long_packet(put, local + 1)[..]).is_err(),
            "past the local limit"
        );
        assert!(Packet::new_checked_local(&long_packet(put, 0)[..]).is_ok());
    }
}
