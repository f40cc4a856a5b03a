//! The fabric's wire as Ethernet frames: UDP/IPv4 datagrams (and the ARP that finds a peer's
//! MAC address), checked before anything in them is believed, built without allocation.
//!
//! A QEMU NIC whose MAC is a virtio-net device carries each firmware packet as the payload of
//! one UDP/IPv4 datagram, exactly as an emulated NIC's UDP socket does, so the two meet on one
//! fabric. The layer is deliberately small: Ethernet II without VLAN tags, IPv4 without options
//! on what it builds (options are skipped on what it takes), no fragments (the link's MTU must
//! hold the longest packet, [`MAX_FRAME_LEN`]), UDP with its checksum computed on send and
//! checked on receipt when the sender set one, and ARP requests and replies for IPv4 over
//! Ethernet only.
//!
//! [`parse_frame`] never panics and never reads past the bytes it is given, whatever they are:
//! every length, version and checksum is checked first, and each refusal is its own
//! [`NetError`] naming the offending value. [`build_udp`] and [`build_arp`] write into a
//! caller's buffer and refuse one too short.

use core::fmt;

/// An Ethernet (MAC) address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct MacAddress(pub [u8; 6]);

impl MacAddress {
    /// The broadcast address, ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Self = Self([0xff; 6]);
}

/// An IPv4 address, in network order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Ipv4Address(pub [u8; 4]);

impl fmt::Display for Ipv4Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.0;
        write!(f, "{a}.{b}.{c}.{d}")
    }
}

/// A UDP endpoint: address and port.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Endpoint {
    /// The IPv4 address.
    pub address: Ipv4Address,
    /// The UDP port.
    pub port: u16,
}

/// Bytes of an Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Bytes of an IPv4 header without options (what [`build_udp`] writes).
pub const IPV4_HEADER_LEN: usize = 20;
/// Bytes of a UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Bytes of an ARP packet for IPv4 over Ethernet.
pub const ARP_LEN: usize = 28;
/// Bytes in front of a UDP payload in a frame [`build_udp`] writes.
pub const UDP_FRAME_OVERHEAD: usize = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN + UDP_HEADER_LEN;
/// The longest frame the fabric sends: the longest firmware packet in one datagram.
pub const MAX_FRAME_LEN: usize = UDP_FRAME_OVERHEAD + crate::packet::MAX_WIRE_LEN;

/// The UDP port of every QEMU NIC on a virtio-net segment.
pub const FABRIC_UDP_PORT: u16 = 47_000;

/// The IPv4 address of node `node` on a virtio-net segment of QEMU NICs: 10.77.hi.lo.
pub const fn node_address(node: u16) -> Ipv4Address {
    let [high, low] = node.to_be_bytes();
    Ipv4Address([10, 77, high, low])
}

/// The node whose address [`node_address`] gives `address`, if any.
pub const fn address_node(address: Ipv4Address) -> Option<u16> {
    match address.0 {
        [10, 77, high, low] => Some(u16::from_be_bytes([high, low])),
        _ => None,
    }
}

/// The MAC address the host gives node `node`'s virtio-net device: 52:54:00:00:hi:lo (QEMU's
/// locally administered prefix).
pub const fn node_mac(node: u16) -> MacAddress {
    let [high, low] = node.to_be_bytes();
    MacAddress([0x52, 0x54, 0, 0, high, low])
}

/// The EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// The EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// IPv4's protocol number of UDP.
const PROTOCOL_UDP: u8 = 17;
/// The TTL of datagrams built here.
const TTL: u8 = 64;

/// An ARP operation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct ArpOperation(pub u16);

impl ArpOperation {
    /// Who has the target address?
    pub const REQUEST: Self = Self(1);
    /// The sender has it.
    pub const REPLY: Self = Self(2);
}

/// An ARP packet for IPv4 over Ethernet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Arp {
    /// Request or reply (other values are refused by [`parse_frame`]).
    pub operation: ArpOperation,
    /// The sender's MAC address.
    pub sender_mac: MacAddress,
    /// The sender's IPv4 address.
    pub sender_ip: Ipv4Address,
    /// The target's MAC address (zero in a request).
    pub target_mac: MacAddress,
    /// The target's IPv4 address.
    pub target_ip: Ipv4Address,
}

/// A UDP datagram taken from a frame; `payload` borrows the frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Datagram<'a> {
    /// The frame's source MAC address.
    pub source_mac: MacAddress,
    /// Where it came from.
    pub source: Endpoint,
    /// Where it was sent.
    pub destination: Endpoint,
    /// The UDP payload: a firmware packet, not yet authenticated.
    pub payload: &'a [u8],
}

/// What a frame held.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Frame<'a> {
    /// A UDP/IPv4 datagram.
    Udp(Datagram<'a>),
    /// An ARP request or reply.
    Arp(Arp),
}

/// Why a frame was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NetError {
    /// Fewer bytes than the header (or the length a header claims) needs.
    Truncated {
        /// What was being read.
        layer: &'static str,
        /// Bytes needed.
        needed: usize,
        /// Bytes there were.
        available: usize,
    },
    /// An EtherType other than IPv4 and ARP (a VLAN tag is one).
    EtherType(u16),
    /// An IP version other than 4.
    IpVersion(u8),
    /// An IPv4 header length below 20 bytes.
    IpHeaderLength(usize),
    /// The IPv4 header checksum does not add up.
    IpChecksum,
    /// A fragment: the fabric's datagrams are never fragmented.
    Fragment,
    /// An IP protocol other than UDP.
    Protocol(u8),
    /// A UDP length that disagrees with the IPv4 length.
    UdpLength {
        /// What the UDP header says.
        claimed: usize,
        /// What the IPv4 header leaves for it.
        available: usize,
    },
    /// The UDP checksum does not add up.
    UdpChecksum,
    /// An ARP packet for other than IPv4 over Ethernet, or neither request nor reply.
    ArpFormat,
    /// The buffer to build into is too short.
    BufferTooShort {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        available: usize,
    },
    /// A payload longer than one datagram may carry.
    PayloadTooLong(usize),
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated {
                layer,
                needed,
                available,
            } => write!(f, "{layer}: needs {needed} bytes, has {available}"),
            Self::EtherType(value) => write!(f, "EtherType {value:#06x} is neither IPv4 nor ARP"),
            Self::IpVersion(version) => write!(f, "IP version {version}, not 4"),
            Self::IpHeaderLength(len) => write!(f, "IPv4 header length {len} is below 20"),
            Self::IpChecksum => f.write_str("IPv4 header checksum does not add up"),
            Self::Fragment => f.write_str("an IPv4 fragment (the fabric never fragments)"),
            Self::Protocol(protocol) => write!(f, "IP protocol {protocol}, not UDP"),
            Self::UdpLength { claimed, available } => write!(
                f,
                "UDP length {claimed} disagrees with the {available} bytes IPv4 leaves"
            ),
            Self::UdpChecksum => f.write_str("UDP checksum does not add up"),
            Self::ArpFormat => f.write_str("ARP packet not for IPv4 over Ethernet"),
            Self::BufferTooShort { needed, available } => {
                write!(f, "buffer of {available} bytes, {needed} needed")
            }
            Self::PayloadTooLong(len) => write!(f, "payload of {len} bytes is too long"),
        }
    }
}

/// `N` bytes of `bytes` from `offset`, or [`NetError::Truncated`].
fn take<const N: usize>(
    bytes: &[u8],
    offset: usize,
    layer: &'static str,
) -> Result<[u8; N], NetError> {
    let end = offset.saturating_add(N);
    bytes
        .get(offset..end)
        .and_then(|slice| <[u8; N]>::try_from(slice).ok())
        .ok_or(NetError::Truncated {
            layer,
            needed: end,
            available: bytes.len(),
        })
}

fn u16_at(bytes: &[u8], offset: usize, layer: &'static str) -> Result<u16, NetError> {
    take::<2>(bytes, offset, layer).map(u16::from_be_bytes)
}

/// The one's-complement sum of `bytes` as big-endian 16-bit words (an odd last byte padded with
/// zero), added to `sum`, not yet folded.
fn sum_words(mut sum: u32, bytes: &[u8]) -> u32 {
    let mut words = bytes.chunks_exact(2);
    for word in &mut words {
        let [high, low] = [
            word.first().copied().unwrap_or(0),
            word.get(1).copied().unwrap_or(0),
        ];
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([high, low])));
    }
    if let Some(&last) = words.remainder().first() {
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([last, 0])));
    }
    sum
}

/// Folds a sum of words into the 16-bit one's complement checksum (RFC 1071).
fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The sum over UDP's pseudo-header.
fn pseudo_header_sum(source: Ipv4Address, destination: Ipv4Address, udp_len: usize) -> u32 {
    let mut sum = sum_words(0, &source.0);
    sum = sum_words(sum, &destination.0);
    sum = sum.wrapping_add(u32::from(PROTOCOL_UDP));
    sum.wrapping_add(udp_len as u32)
}

/// Checks `frame` and says what it holds.
///
/// # Errors
/// [`NetError`] with the first check that failed; nothing in a refused frame is used.
pub fn parse_frame(frame: &[u8]) -> Result<Frame<'_>, NetError> {
    let source_mac = MacAddress(take::<6>(frame, 6, "Ethernet header")?);
    let ether_type = u16_at(frame, 12, "Ethernet header")?;
    let body = frame.get(ETHERNET_HEADER_LEN..).unwrap_or(&[]);
    match ether_type {
        ETHERTYPE_IPV4 => parse_ipv4(source_mac, body).map(Frame::Udp),
        ETHERTYPE_ARP => parse_arp(body).map(Frame::Arp),
        other => Err(NetError::EtherType(other)),
    }
}

fn parse_ipv4(source_mac: MacAddress, packet: &[u8]) -> Result<Datagram<'_>, NetError> {
    let [version_ihl] = take::<1>(packet, 0, "IPv4 header")?;
    let version = version_ihl >> 4;
    if version != 4 {
        return Err(NetError::IpVersion(version));
    }
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    if header_len < IPV4_HEADER_LEN {
        return Err(NetError::IpHeaderLength(header_len));
    }
    let header = packet.get(..header_len).ok_or(NetError::Truncated {
        layer: "IPv4 header",
        needed: header_len,
        available: packet.len(),
    })?;
    if fold(sum_words(0, header)) != 0 {
        return Err(NetError::IpChecksum);
    }
    let total_len = usize::from(u16_at(header, 2, "IPv4 header")?);
    // Ethernet pads short frames: the IPv4 length says where the datagram ends.
    let datagram = packet
        .get(..total_len)
        .filter(|_| total_len >= header_len)
        .ok_or(NetError::Truncated {
            layer: "IPv4 datagram",
            needed: total_len.max(header_len),
            available: packet.len(),
        })?;
    let flags_fragment = u16_at(header, 6, "IPv4 header")?;
    // More fragments, or a fragment offset: either makes it a fragment.
    if flags_fragment & 0x3fff != 0 {
        return Err(NetError::Fragment);
    }
    let [protocol] = take::<1>(header, 9, "IPv4 header")?;
    if protocol != PROTOCOL_UDP {
        return Err(NetError::Protocol(protocol));
    }
    let source_ip = Ipv4Address(take::<4>(header, 12, "IPv4 header")?);
    let destination_ip = Ipv4Address(take::<4>(header, 16, "IPv4 header")?);

    let udp = datagram.get(header_len..).unwrap_or(&[]);
    let source_port = u16_at(udp, 0, "UDP header")?;
    let destination_port = u16_at(udp, 2, "UDP header")?;
    let udp_len = usize::from(u16_at(udp, 4, "UDP header")?);
    let checksum = u16_at(udp, 6, "UDP header")?;
    if udp_len != udp.len() {
        return Err(NetError::UdpLength {
            claimed: udp_len,
            available: udp.len(),
        });
    }
    // Zero: the sender computed none (allowed over IPv4).
    if checksum != 0 {
        let sum = pseudo_header_sum(source_ip, destination_ip, udp_len);
        if fold(sum_words(sum, udp)) != 0 {
            return Err(NetError::UdpChecksum);
        }
    }
    Ok(Datagram {
        source_mac,
        source: Endpoint {
            address: source_ip,
            port: source_port,
        },
        destination: Endpoint {
            address: destination_ip,
            port: destination_port,
        },
        payload: udp.get(UDP_HEADER_LEN..).unwrap_or(&[]),
    })
}

fn parse_arp(packet: &[u8]) -> Result<Arp, NetError> {
    let fixed = take::<8>(packet, 0, "ARP packet")?;
    // Hardware Ethernet (1), protocol IPv4, 6-byte and 4-byte addresses.
    if fixed[..6] != [0, 1, 0x08, 0x00, 6, 4] {
        return Err(NetError::ArpFormat);
    }
    let operation = ArpOperation(u16::from_be_bytes([fixed[6], fixed[7]]));
    if operation != ArpOperation::REQUEST && operation != ArpOperation::REPLY {
        return Err(NetError::ArpFormat);
    }
    Ok(Arp {
        operation,
        sender_mac: MacAddress(take::<6>(packet, 8, "ARP packet")?),
        sender_ip: Ipv4Address(take::<4>(packet, 14, "ARP packet")?),
        target_mac: MacAddress(take::<6>(packet, 18, "ARP packet")?),
        target_ip: Ipv4Address(take::<4>(packet, 24, "ARP packet")?),
    })
}

/// Writes `bytes` into `out` at `offset` (the caller checked the length).
fn put(out: &mut [u8], offset: usize, bytes: &[u8]) {
    if let Some(slot) = out.get_mut(offset..offset.saturating_add(bytes.len())) {
        slot.copy_from_slice(bytes);
    }
}

fn ensure_len(out: &[u8], needed: usize) -> Result<(), NetError> {
    if out.len() < needed {
        return Err(NetError::BufferTooShort {
            needed,
            available: out.len(),
        });
    }
    Ok(())
}

fn ethernet_header(out: &mut [u8], destination: MacAddress, source: MacAddress, ether_type: u16) {
    put(out, 0, &destination.0);
    put(out, 6, &source.0);
    put(out, 12, &ether_type.to_be_bytes());
}

/// Writes one frame carrying `payload` in a UDP/IPv4 datagram from `source` (at MAC `source_mac`)
/// to `destination` (at MAC `destination_mac`), checksums included, into the front of `out`.
/// `identification` is the IPv4 identification field (a counter). Returns the frame's length.
///
/// # Errors
/// [`NetError::PayloadTooLong`] if the datagram would not fit IPv4's 16-bit length,
/// [`NetError::BufferTooShort`] if `out` cannot hold the frame.
pub fn build_udp(
    out: &mut [u8],
    source_mac: MacAddress,
    destination_mac: MacAddress,
    source: Endpoint,
    destination: Endpoint,
    identification: u16,
    payload: &[u8],
) -> Result<usize, NetError> {
    let udp_len = UDP_HEADER_LEN + payload.len();
    let total_len = IPV4_HEADER_LEN + udp_len;
    let Ok(total_len_field) = u16::try_from(total_len) else {
        return Err(NetError::PayloadTooLong(payload.len()));
    };
    let frame_len = ETHERNET_HEADER_LEN + total_len;
    ensure_len(out, frame_len)?;
    ethernet_header(out, destination_mac, source_mac, ETHERTYPE_IPV4);

    let mut ip = [0u8; IPV4_HEADER_LEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total_len_field.to_be_bytes());
    ip[4..6].copy_from_slice(&identification.to_be_bytes());
    // Don't fragment.
    ip[6] = 0x40;
    ip[8] = TTL;
    ip[9] = PROTOCOL_UDP;
    ip[12..16].copy_from_slice(&source.address.0);
    ip[16..20].copy_from_slice(&destination.address.0);
    let ip_checksum = fold(sum_words(0, &ip));
    ip[10..12].copy_from_slice(&ip_checksum.to_be_bytes());
    put(out, ETHERNET_HEADER_LEN, &ip);

    let udp_at = ETHERNET_HEADER_LEN + IPV4_HEADER_LEN;
    let mut udp = [0u8; UDP_HEADER_LEN];
    udp[0..2].copy_from_slice(&source.port.to_be_bytes());
    udp[2..4].copy_from_slice(&destination.port.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    let mut sum = pseudo_header_sum(source.address, destination.address, udp_len);
    sum = sum_words(sum, &udp);
    sum = sum_words(sum, payload);
    let udp_checksum = match fold(sum) {
        // A computed zero is sent as all ones (zero means "none").
        0 => 0xffff,
        checksum => checksum,
    };
    udp[6..8].copy_from_slice(&udp_checksum.to_be_bytes());
    put(out, udp_at, &udp);
    put(out, udp_at + UDP_HEADER_LEN, payload);
    Ok(frame_len)
}

/// Writes one frame carrying `arp` (to `destination_mac`: the broadcast address for a request)
/// into the front of `out`. Returns the frame's length.
///
/// # Errors
/// [`NetError::BufferTooShort`] if `out` cannot hold the frame.
pub fn build_arp(
    out: &mut [u8],
    destination_mac: MacAddress,
    arp: &Arp,
) -> Result<usize, NetError> {
    let frame_len = ETHERNET_HEADER_LEN + ARP_LEN;
    ensure_len(out, frame_len)?;
    ethernet_header(out, destination_mac, arp.sender_mac, ETHERTYPE_ARP);
    let mut packet = [0u8; ARP_LEN];
    packet[..6].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4]);
    packet[6..8].copy_from_slice(&arp.operation.0.to_be_bytes());
    packet[8..14].copy_from_slice(&arp.sender_mac.0);
    packet[14..18].copy_from_slice(&arp.sender_ip.0);
    packet[18..24].copy_from_slice(&arp.target_mac.0);
    packet[24..28].copy_from_slice(&arp.target_ip.0);
    put(out, ETHERNET_HEADER_LEN, &packet);
    Ok(frame_len)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;
    use proptest::prelude::*;

    const A_MAC: MacAddress = MacAddress([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
    const B_MAC: MacAddress = MacAddress([0x52, 0x54, 0, 0xab, 0xcd, 0xef]);
    const A: Endpoint = Endpoint {
        address: Ipv4Address([10, 0, 2, 15]),
        port: 47000,
    };
    const B: Endpoint = Endpoint {
        address: Ipv4Address([10, 0, 2, 2]),
        port: 47001,
    };

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0; MAX_FRAME_LEN + 64];
        let len = build_udp(&mut out, A_MAC, B_MAC, A, B, 7, payload).unwrap();
        out.truncate(len);
        out
    }

    #[test]
    fn node_addresses_round_trip() {
        for node in [0, 1, 255, 256, u16::MAX] {
            assert_eq!(address_node(node_address(node)), Some(node));
        }
        assert_eq!(address_node(Ipv4Address([10, 0, 2, 15])), None);
        assert_eq!(node_mac(0x0102).0, [0x52, 0x54, 0, 0, 1, 2]);
    }

    #[test]
    fn the_ipv4_checksum_is_rfc_1071s() {
        // A header whose checksum is published (0xb861), with the checksum field zero.
        let header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(fold(sum_words(0, &header)), 0xb861);
    }

    #[test]
    fn a_built_datagram_parses_back_to_what_was_sent() {
        for len in [0, 1, 2, 3, 100, crate::packet::MAX_WIRE_LEN] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let bytes = frame(&payload);
            assert_eq!(bytes.len(), UDP_FRAME_OVERHEAD + len);
            let Ok(Frame::Udp(datagram)) = parse_frame(&bytes) else {
                panic!(
                    "a built frame of {len} bytes did not parse: {:?}",
                    parse_frame(&bytes)
                );
            };
            assert_eq!(datagram.source_mac, A_MAC);
            assert_eq!(datagram.source, A);
            assert_eq!(datagram.destination, B);
            assert_eq!(datagram.payload, &payload[..]);
            assert_eq!(&bytes[..6], &B_MAC.0);
        }
    }

    #[test]
    fn ethernet_padding_after_the_datagram_is_ignored() {
        let mut bytes = frame(b"hi");
        bytes.resize(60, 0);
        let Ok(Frame::Udp(datagram)) = parse_frame(&bytes) else {
            panic!("a padded frame did not parse");
        };
        assert_eq!(datagram.payload, b"hi");
    }

    #[test]
    fn every_corruption_is_refused_by_name() {
        let good = frame(b"a firmware packet");
        let corrupt = |offset: usize, value: u8| {
            let mut bytes = good.clone();
            bytes[offset] = value;
            parse_frame(&bytes).map(|_| ())
        };
        assert_eq!(corrupt(12, 0x86), Err(NetError::EtherType(0x8600)));
        assert_eq!(corrupt(14, 0x65), Err(NetError::IpVersion(6)));
        assert_eq!(corrupt(14, 0x44), Err(NetError::IpHeaderLength(16)));
        // A flipped address bit breaks the header checksum.
        assert_eq!(corrupt(26, 11), Err(NetError::IpChecksum));
        // A flipped payload bit breaks the UDP checksum.
        assert_eq!(corrupt(50, b'b'), Err(NetError::UdpChecksum));
        assert!(matches!(
            parse_frame(&good[..good.len() - 1]),
            Err(NetError::Truncated { .. })
        ));
        assert!(matches!(
            parse_frame(&good[..20]),
            Err(NetError::Truncated { .. })
        ));
    }

    #[test]
    fn fragments_other_protocols_and_length_lies_are_refused() {
        let good = frame(b"payload");
        // Rewrites an IPv4 header field and fixes its checksum, so only the field is wrong.
        let with_ip = |offset: usize, bytes: &[u8]| {
            let mut frame = good.clone();
            frame[offset..offset + bytes.len()].copy_from_slice(bytes);
            frame[24..26].copy_from_slice(&[0, 0]);
            let checksum = fold(sum_words(0, &frame[14..34]));
            frame[24..26].copy_from_slice(&checksum.to_be_bytes());
            parse_frame(&frame).map(|_| ())
        };
        assert_eq!(with_ip(20, &[0x20, 0x00]), Err(NetError::Fragment));
        assert_eq!(with_ip(20, &[0x00, 0x08]), Err(NetError::Fragment));
        assert_eq!(with_ip(23, &[6]), Err(NetError::Protocol(6)));
        let mut lying = good.clone();
        lying[38..40].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(
            parse_frame(&lying),
            Err(NetError::UdpLength {
                claimed: 100,
                available: UDP_HEADER_LEN + 7
            })
        );
        // No checksum (zero) is taken as sent.
        let mut unchecked = good.clone();
        unchecked[40..42].copy_from_slice(&[0, 0]);
        unchecked[45] ^= 1;
        assert!(matches!(parse_frame(&unchecked), Ok(Frame::Udp(_))));
    }

    #[test]
    fn arp_round_trips_and_foreign_arp_is_refused() {
        let request = Arp {
            operation: ArpOperation::REQUEST,
            sender_mac: A_MAC,
            sender_ip: A.address,
            target_mac: MacAddress::default(),
            target_ip: B.address,
        };
        let mut out = [0u8; 64];
        let len = build_arp(&mut out, MacAddress::BROADCAST, &request).unwrap();
        assert_eq!(len, ETHERNET_HEADER_LEN + ARP_LEN);
        assert_eq!(parse_frame(&out[..len]), Ok(Frame::Arp(request)));
        let mut other = out;
        other[21] = 3;
        assert_eq!(parse_frame(&other[..len]), Err(NetError::ArpFormat));
        assert_eq!(
            build_arp(&mut [0u8; 41], MacAddress::BROADCAST, &request),
            Err(NetError::BufferTooShort {
                needed: 42,
                available: 41
            })
        );
    }

    #[test]
    fn building_refuses_a_short_buffer_and_an_oversized_payload() {
        let mut out = [0u8; 50];
        assert_eq!(
            build_udp(&mut out, A_MAC, B_MAC, A, B, 0, &[0; 9]),
            Err(NetError::BufferTooShort {
                needed: 51,
                available: 50
            })
        );
        let huge = vec![0u8; 70_000];
        assert_eq!(
            build_udp(&mut out, A_MAC, B_MAC, A, B, 0, &huge),
            Err(NetError::PayloadTooLong(70_000))
        );
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_frame(&bytes);
        }

        #[test]
        fn parsing_a_mutated_frame_never_panics_and_a_flipped_bit_never_passes_unnoticed(
            payload in prop::collection::vec(any::<u8>(), 0..300),
            position in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let mut bytes = frame(&payload);
            let at = position.index(bytes.len());
            bytes[at] ^= 1 << bit;
            // A flip in the destination MAC is not the layer's to see; in the source MAC it is
            // reported as such; anywhere in the IPv4 or UDP part it is refused or changes
            // nothing that could be mistaken for the original (ports and addresses are covered
            // by the checksums).
            match parse_frame(&bytes) {
                Ok(Frame::Udp(datagram)) => prop_assert!(
                    (at < 12 && (at < 6 || datagram.source_mac != A_MAC))
                        // A checksum of one set bit flipped to zero reads as "none computed".
                        || (matches!(at, 40 | 41) && bytes[40..42] == [0, 0]),
                    "a flip at {at} went unnoticed"
                ),
                Ok(Frame::Arp(_)) => prop_assert!(false, "a UDP frame parsed as ARP"),
                Err(_) => prop_assert!(at >= 12),
            }
        }
    }
}
