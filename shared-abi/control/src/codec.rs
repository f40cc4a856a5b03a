//! The bytes of a control message: a small, explicit binary layout, decoded without trusting it.
//!
//! Every value is written in a fixed order with fixed-width little-endian integers; an enum starts
//! with a one-byte tag; an `Option` with a one-byte presence flag (0 or 1); a string or list with
//! a `u32` count, then its UTF-8 bytes or its elements. Decoding checks every tag, flag, count
//! and length against the bytes that are really there before it allocates, and refuses trailing
//! bytes, so a frame either decodes to exactly one message or is refused with a reason.
//!
//! The layout is the protocol's: it carries no field names, so both sides must be built from the
//! same [`crate::PROTOCOL_VERSION`] (checked at open, with the ABI version).

use std::fmt;

use crate::message::{
    BarrierReport, ConnectionReport, ControlError, NicReport, NodeName, OpenedPort, PortReport,
    Reply, Request, StatusReport, UnitStatus, WireCounters,
};

/// Why bytes did not decode to a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// What was being read.
    pub what: &'static str,
    /// What was wrong with it.
    pub problem: DecodeProblem,
}

/// What was wrong with the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeProblem {
    /// The bytes ended inside a value.
    Truncated,
    /// An enum tag or presence flag has no meaning.
    UnknownTag(u8),
    /// A count promises more elements than there are bytes left.
    CountTooLarge(u32),
    /// A string is not UTF-8.
    NotUtf8,
    /// Bytes are left after the message.
    TrailingBytes(usize),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problem {
            DecodeProblem::Truncated => write!(f, "the message ends inside {}", self.what),
            DecodeProblem::UnknownTag(tag) => write!(f, "{} has unknown tag {tag}", self.what),
            DecodeProblem::CountTooLarge(count) => write!(
                f,
                "{} claims {count} elements, more than the message holds",
                self.what
            ),
            DecodeProblem::NotUtf8 => write!(f, "{} is not UTF-8", self.what),
            DecodeProblem::TrailingBytes(extra) => {
                write!(f, "{extra} bytes follow the end of {}", self.what)
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// A value with a layout in control messages.
pub trait Wire: Sized {
    /// Appends the value's bytes to `out`.
    fn put(&self, out: &mut Vec<u8>);
    /// Reads one value from the front of `input`.
    ///
    /// # Errors
    /// The bytes are not a value of this type.
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError>;
}

/// The bytes still to decode.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader of `bytes`; `what` names the message in errors.
    pub fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Self { bytes, what }
    }

    fn error(&self, problem: DecodeProblem) -> DecodeError {
        DecodeError {
            what: self.what,
            problem,
        }
    }

    fn bytes(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < len {
            return Err(self.error(DecodeProblem::Truncated));
        }
        let (front, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(front)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// A `u32` element count, checked against the bytes left (every element takes at least
    /// `min_element` bytes), so a forged count cannot make the decoder allocate.
    fn count(&mut self, min_element: usize) -> Result<usize, DecodeError> {
        let count = u32::take(self)?;
        let needed = (count as usize).checked_mul(min_element.max(1));
        match needed {
            Some(needed) if needed <= self.bytes.len() => Ok(count as usize),
            _ => Err(self.error(DecodeProblem::CountTooLarge(count))),
        }
    }

    /// A one-byte tag.
    fn tag(&mut self) -> Result<u8, DecodeError> {
        u8::take(self)
    }

    /// Refuses bytes after the message.
    fn finish(&self) -> Result<(), DecodeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.error(DecodeProblem::TrailingBytes(self.bytes.len())))
        }
    }
}

/// The bytes of `message`.
pub fn to_bytes<T: Wire>(message: &T) -> Vec<u8> {
    let mut out = Vec::new();
    message.put(&mut out);
    out
}

/// Decodes exactly one `T` from `bytes`; `what` names it in errors.
///
/// # Errors
/// The bytes are not exactly one `T`.
pub fn from_bytes<T: Wire>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    let mut reader = Reader::new(bytes, what);
    let value = T::take(&mut reader)?;
    reader.finish()?;
    Ok(value)
}

macro_rules! wire_integer {
    ($($ty:ty),*) => {$(
        impl Wire for $ty {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$ty>::from_le_bytes(input.array()?))
            }
        }
    )*};
}
wire_integer!(u8, u16, u32, u64);

impl Wire for usize {
    fn put(&self, out: &mut Vec<u8>) {
        (*self as u64).put(out);
    }
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let value = u64::take(input)?;
        usize::try_from(value).map_err(|_| input.error(DecodeProblem::CountTooLarge(u32::MAX)))
    }
}

impl Wire for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match input.tag()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(input.error(DecodeProblem::UnknownTag(other))),
        }
    }
}

impl Wire for String {
    fn put(&self, out: &mut Vec<u8>) {
        (self.len() as u32).put(out);
        out.extend_from_slice(self.as_bytes());
    }
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = input.count(1)?;
        let bytes = input.bytes(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| input.error(DecodeProblem::NotUtf8))
    }
}

impl<T: Wire> Wire for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(value) => {
                out.push(1);
                value.put(out);
            }
        }
    }
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match input.tag()? {
            0 => Ok(None),
            1 => T::take(input).map(Some),
            other => Err(input.error(DecodeProblem::UnknownTag(other))),
        }
    }
}

impl<T: Wire> Wire for Vec<T> {
    fn put(&self, out: &mut Vec<u8>) {
        (self.len() as u32).put(out);
        for element in self {
            element.put(out);
        }
    }
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let count = input.count(1)?;
        (0..count).map(|_| T::take(input)).collect()
    }
}

/// A struct's layout: its fields in the order named.
macro_rules! wire_struct {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl Wire for $ty {
            fn put(&self, out: &mut Vec<u8>) {
                $(self.$field.put(out);)*
            }
            fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(Self { $($field: Wire::take(input)?,)* })
            }
        }
    };
}

wire_struct!(OpenedPort {
    unit,
    port,
    node,
    generation,
    region_len
});
wire_struct!(NodeName {
    node,
    name,
    unique_id
});
wire_struct!(StatusReport {
    daemon_pid,
    fault_seed,
    units
});
wire_struct!(UnitStatus {
    unit,
    thread,
    idle,
    thread_cpu_ns,
    node,
    address,
    ports,
    connections,
    counters,
    wire
});
wire_struct!(PortReport {
    port,
    generation,
    owner_pid,
    held_sends,
    receive_buffers,
    barrier_running,
    barrier,
    closing,
    pending_events,
    faulted
});
wire_struct!(BarrierReport {
    step,
    steps,
    waiting_node,
    waiting_port,
    round,
    sending
});
wire_struct!(ConnectionReport {
    peer,
    sent,
    resent,
    received,
    acks_sent,
    acks_received,
    nacks_sent,
    nacks_received,
    rejects_sent,
    rejects_received,
    drops,
    give_ups
});
wire_struct!(NicReport {
    malformed_packets,
    no_connection,
    tokens_rejected,
    barriers_completed,
    barriers_failed,
    messages_delivered,
    unauthenticated
});
wire_struct!(WireCounters {
    transmitted,
    received,
    lost,
    duplicated,
    delayed,
    undeliverable,
    strangers,
    spoofed
});

impl Wire for Request {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Self::OpenPort {
                unit,
                port,
                abi_version,
            } => {
                out.push(1);
                unit.put(out);
                port.put(out);
                abi_version.put(out);
            }
            Self::ClosePort => out.push(2),
            Self::Status => out.push(3),
            Self::Nodes => out.push(4),
            Self::RegisterMemory { address, length } => {
                out.push(5);
                address.put(out);
                length.put(out);
            }
            Self::DeregisterMemory { address, length } => {
                out.push(6);
                address.put(out);
                length.put(out);
            }
            Self::AllowRemoteAccess => out.push(7),
            Self::RegionMapped { address } => {
                out.push(8);
                address.put(out);
            }
        }
    }
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match input.tag()? {
            1 => Ok(Self::OpenPort {
                unit: Wire::take(input)?,
                port: Wire::take(input)?,
                abi_version: Wire::take(input)?,
            }),
            2 => Ok(Self::ClosePort),
            3 => Ok(Self::Status),
            4 => Ok(Self::Nodes),
            5 => Ok(Self::RegisterMemory {
                address: Wire::take(input)?,
                length: Wire::take(input)?,
            }),
            6 => Ok(Self::DeregisterMemory {
                address: Wire::take(input)?,
                length: Wire::take(input)?,
            }),
            7 => Ok(Self::AllowRemoteAccess),
            8 => Ok(Self::RegionMapped {
                address: Wire::take(input)?,
            }),
            other => Err(input.error(DecodeProblem::UnknownTag(other))),
        }
    }
}

impl Wire for Reply {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Self::Opened(opened) => {
                out.push(1);
                opened.put(out);
            }
            Self::Closed => out.push(2),
            Self::Status(report) => {
                out.push(3);
                report.put(out);
            }
            Self::Error(error) => {
                out.push(4);
                error.put(out);
            }
            Self::Nodes(nodes) => {
                out.push(5);
                nodes.put(out);
            }
            Self::Registered { key } => {
                out.push(6);
                key.put(out);
            }
            Self::MemoryDone => out.push(7),
        }
    }
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match input.tag()? {
            1 => Ok(Self::Opened(Wire::take(input)?)),
            2 => Ok(Self::Closed),
            3 => Ok(Self::Status(Wire::take(input)?)),
            4 => Ok(Self::Error(Wire::take(input)?)),
            5 => Ok(Self::Nodes(Wire::take(input)?)),
            6 => Ok(Self::Registered {
                key: Wire::take(input)?,
            }),
            7 => Ok(Self::MemoryDone),
            other => Err(input.error(DecodeProblem::UnknownTag(other))),
        }
    }
}

impl Wire for ControlError {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Self::NoSuchUnit { unit, units } => {
                out.push(1);
                unit.put(out);
                units.put(out);
            }
            Self::NoSuchPort { port, ports } => {
                out.push(2);
                port.put(out);
                ports.put(out);
            }
            Self::PortBusy {
                unit,
                port,
                owner_pid,
            } => {
                out.push(3);
                unit.put(out);
                port.put(out);
                owner_pid.put(out);
            }
            Self::AlreadyOwnsPort { unit, port } => {
                out.push(4);
                unit.put(out);
                port.put(out);
            }
            Self::NoPortOwned => out.push(5),
            Self::AbiMismatch { daemon, client } => {
                out.push(6);
                daemon.put(out);
                client.put(out);
            }
            Self::OpenFailed { unit, port, reason } => {
                out.push(7);
                unit.put(out);
                port.put(out);
                reason.put(out);
            }
            Self::BadRequest(reason) => {
                out.push(8);
                reason.put(out);
            }
            Self::Internal(reason) => {
                out.push(9);
                reason.put(out);
            }
            Self::PermissionDenied {
                client_uid,
                daemon_uid,
            } => {
                out.push(10);
                client_uid.put(out);
                daemon_uid.put(out);
            }
            Self::MemoryRefused(reason) => {
                out.push(11);
                reason.put(out);
            }
        }
    }
    fn take(input: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(match input.tag()? {
            1 => Self::NoSuchUnit {
                unit: Wire::take(input)?,
                units: Wire::take(input)?,
            },
            2 => Self::NoSuchPort {
                port: Wire::take(input)?,
                ports: Wire::take(input)?,
            },
            3 => Self::PortBusy {
                unit: Wire::take(input)?,
                port: Wire::take(input)?,
                owner_pid: Wire::take(input)?,
            },
            4 => Self::AlreadyOwnsPort {
                unit: Wire::take(input)?,
                port: Wire::take(input)?,
            },
            5 => Self::NoPortOwned,
            6 => Self::AbiMismatch {
                daemon: Wire::take(input)?,
                client: Wire::take(input)?,
            },
            7 => Self::OpenFailed {
                unit: Wire::take(input)?,
                port: Wire::take(input)?,
                reason: Wire::take(input)?,
            },
            8 => Self::BadRequest(Wire::take(input)?),
            9 => Self::Internal(Wire::take(input)?),
            10 => Self::PermissionDenied {
                client_uid: Wire::take(input)?,
                daemon_uid: Wire::take(input)?,
            },
            11 => Self::MemoryRefused(Wire::take(input)?),
            other => return Err(input.error(DecodeProblem::UnknownTag(other))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> StatusReport {
        StatusReport {
            daemon_pid: 4242,
            fault_seed: Some(7),
            units: vec![UnitStatus {
                unit: 1,
                thread: 2,
                idle: "adaptive (polling)".to_owned(),
                thread_cpu_ns: 123_456_789,
                node: 10,
                address: Some("127.0.0.2:7000".to_owned()),
                ports: vec![PortReport {
                    port: 3,
                    generation: 9,
                    owner_pid: None,
                    held_sends: 2,
                    receive_buffers: 5,
                    barrier_running: true,
                    barrier: Some(BarrierReport {
                        step: 1,
                        steps: 4,
                        waiting_node: 2,
                        waiting_port: 3,
                        round: 1,
                        sending: true,
                    }),
                    closing: true,
                    pending_events: 0,
                    faulted: Some(4),
                }],
                connections: vec![ConnectionReport {
                    peer: 11,
                    sent: 1,
                    resent: 2,
                    received: 3,
                    acks_sent: 4,
                    acks_received: 5,
                    nacks_sent: 6,
                    nacks_received: 7,
                    rejects_sent: 8,
                    rejects_received: 9,
                    drops: 10,
                    give_ups: 11,
                }],
                counters: NicReport {
                    messages_delivered: 99,
                    ..NicReport::default()
                },
                wire: WireCounters {
                    strangers: 3,
                    ..WireCounters::default()
                },
            }],
        }
    }

    fn every_message() -> Vec<Reply> {
        vec![
            Reply::Opened(OpenedPort {
                unit: 1,
                port: 2,
                node: 3,
                generation: 4,
                region_len: 5,
            }),
            Reply::Closed,
            Reply::Status(report()),
            Reply::Nodes(Vec::new()),
            Reply::Registered { key: 0xdead_be01 },
            Reply::MemoryDone,
            Reply::Error(ControlError::MemoryRefused("the table is full".to_owned())),
            Reply::Nodes(vec![
                NodeName {
                    node: 1,
                    name: "alpha".to_owned(),
                    unique_id: 0x0000_0211_2233_4455,
                },
                NodeName {
                    node: 65535,
                    name: "[::1]:7400".to_owned(),
                    unique_id: 0xffff_ffff_ffff,
                },
            ]),
            Reply::Error(ControlError::NoSuchUnit { unit: 1, units: 2 }),
            Reply::Error(ControlError::NoSuchPort { port: 1, ports: 2 }),
            Reply::Error(ControlError::PortBusy {
                unit: 1,
                port: 2,
                owner_pid: 3,
            }),
            Reply::Error(ControlError::AlreadyOwnsPort { unit: 1, port: 2 }),
            Reply::Error(ControlError::NoPortOwned),
            Reply::Error(ControlError::AbiMismatch {
                daemon: 1,
                client: 2,
            }),
            Reply::Error(ControlError::OpenFailed {
                unit: 1,
                port: 2,
                reason: "no memory".to_owned(),
            }),
            Reply::Error(ControlError::BadRequest("é".to_owned())),
            Reply::Error(ControlError::Internal(String::new())),
            Reply::Error(ControlError::PermissionDenied {
                client_uid: 1000,
                daemon_uid: 1001,
            }),
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for reply in every_message() {
            assert_eq!(from_bytes::<Reply>(&to_bytes(&reply), "a reply"), Ok(reply));
        }
        for request in [
            Request::OpenPort {
                unit: 200,
                port: 7,
                abi_version: 0xdead_beef,
            },
            Request::ClosePort,
            Request::Status,
            Request::Nodes,
            Request::RegisterMemory {
                address: 0x7fff_0000_1000,
                length: 1 << 26,
            },
            Request::DeregisterMemory {
                address: 1,
                length: 2,
            },
            Request::AllowRemoteAccess,
            Request::RegionMapped {
                address: 0x7f12_3456_7000,
            },
        ] {
            assert_eq!(
                from_bytes::<Request>(&to_bytes(&request), "a request"),
                Ok(request)
            );
        }
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        for reply in every_message() {
            let bytes = to_bytes(&reply);
            for cut in 0..bytes.len() {
                assert!(
                    from_bytes::<Reply>(&bytes[..cut], "a reply").is_err(),
                    "{reply:?} cut at {cut} decoded"
                );
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(
                from_bytes::<Reply>(&longer, "a reply").unwrap_err().problem,
                DecodeProblem::TrailingBytes(1)
            );
        }
    }

    #[test]
    fn forged_counts_tags_and_strings_are_refused_without_allocating() {
        // A status report claiming 2^32 - 1 units in a 12-byte message.
        let mut forged = vec![3];
        forged.extend_from_slice(&1u32.to_le_bytes());
        forged.push(0);
        forged.extend_from_slice(&u32::MAX.to_le_bytes());
        let error = from_bytes::<Reply>(&forged, "a reply").unwrap_err();
        assert_eq!(error.problem, DecodeProblem::CountTooLarge(u32::MAX));
        assert_eq!(
            error.to_string(),
            "a reply claims 4294967295 elements, more than the message holds"
        );
        assert_eq!(
            from_bytes::<Request>(&[9], "a request")
                .unwrap_err()
                .problem,
            DecodeProblem::UnknownTag(9)
        );
        let mut bad_utf8 = vec![4, 8];
        bad_utf8.extend_from_slice(&2u32.to_le_bytes());
        bad_utf8.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(
            from_bytes::<Reply>(&bad_utf8, "a reply")
                .unwrap_err()
                .problem,
            DecodeProblem::NotUtf8
        );
        let mut bad_flag = to_bytes(&Reply::Status(report()));
        bad_flag[5] = 2; // the fault seed's presence flag
        assert_eq!(
            from_bytes::<Reply>(&bad_flag, "a reply")
                .unwrap_err()
                .problem,
            DecodeProblem::UnknownTag(2)
        );
    }
}
