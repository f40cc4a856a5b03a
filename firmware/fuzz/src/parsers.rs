//! The ABI's parsers of bytes from the other side: wire packets, firmware images, port regions.

use shared_abi::image::{self, ImageHeader};
use shared_abi::packet::{MAX_PACKET_LEN, PACKET_MAGIC, Packet, WIRE_VERSION};
use shared_abi::region::{RegionHeader, RegionLayout};
use shared_abi::ring::RingLayout;
use shared_abi::token::{ReceiveToken, SendToken};
use zerocopy::{FromBytes, IntoBytes};

/// Bytes from the wire: `Packet::new_checked` never panics, and a packet it accepts has a
/// consistent header and re-emits to exactly the same bytes.
pub fn packet(data: &[u8]) {
    let Ok(packet) = Packet::new_checked(data) else {
        return;
    };
    let header = *packet.header();
    let payload = packet.payload();
    assert_eq!(header.magic, PACKET_MAGIC);
    assert_eq!(header.version, WIRE_VERSION);
    assert!(header.kind.is_known());
    assert_eq!(usize::from(header.length.get()), payload.len());
    assert!(payload.len() <= shared_abi::MTU_PAYLOAD);
    let mut out = [0u8; MAX_PACKET_LEN];
    let len = header
        .emit(payload, &mut out)
        .expect("a checked packet fits in MAX_PACKET_LEN");
    assert_eq!(&out[..len], data, "re-emitting a checked packet changed it");
}

/// A firmware image file. The first byte chooses whether the rest is taken as it is or first
/// given correct CRCs (so the fuzzer reaches the checks behind them); `parse` never panics, and
/// an image it accepts is self-consistent.
pub fn image(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1
        && let Ok((mut header, payload)) = ImageHeader::read_from_prefix(&bytes)
    {
        header.payload_crc32 = image::crc32(payload).into();
        header.seal();
        bytes[..image::HEADER_LEN].copy_from_slice(header.as_bytes());
    }
    let header_only = image::parse_header(&bytes);
    let parsed = image::parse(&bytes);
    if let Err(error) = &parsed {
        // Every refusal can be shown to the user.
        let _ = error.to_string();
    }
    let Ok((header, payload)) = parsed else {
        return;
    };
    assert_eq!(header_only, Ok(header));
    assert_eq!(payload.len(), header.payload_len.get() as usize);
    assert_eq!(header.image_len(), bytes.len());
    assert_eq!(image::crc32(payload), header.payload_crc32.get());
    assert!(header.target.is_known());
    let end = header.load_end().expect("an accepted image's end fits");
    assert!(header.load_address.get() <= header.entry_point.get());
    assert!(header.entry_point.get() < end);
    assert!(image::parse_for_target(&bytes, header.target).is_ok());
}

/// A port region's header, as the NIC and the host library read it from shared memory: after the
/// 128 header bytes, one byte chooses the region's length (the header's own, or one from the next
/// eight bytes), and the remaining bytes are arena ranges to look up. A layout `from_header`
/// accepts lies inside the region, its parts do not overlap, and `arena_range` only gives ranges
/// inside the arena.
pub fn region(data: &[u8]) {
    let Ok((header, rest)) = RegionHeader::read_from_prefix(data) else {
        return;
    };
    let (mode, rest) = rest.split_first().unwrap_or((&0, &[]));
    let (region_len, mut rest) = if mode & 1 == 0 {
        (header.region_len.get(), rest)
    } else {
        let (len, rest) = rest.split_at(rest.len().min(8));
        let mut word = [0u8; 8];
        word[..len.len()].copy_from_slice(len);
        (u64::from_le_bytes(word), rest)
    };
    let Ok(region_len) = usize::try_from(region_len) else {
        return;
    };
    let Ok(layout) = RegionLayout::from_header(&header, region_len) else {
        return;
    };
    let header_len = core::mem::size_of::<RegionHeader>();
    let mut spans = [
        (0, header_len),
        span::<SendToken>(layout.send_ring),
        span::<ReceiveToken>(layout.receive_ring),
        span::<shared_abi::event::Event>(layout.event_ring),
        (layout.arena_offset, layout.arena_len),
    ];
    for (offset, len) in spans {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= region_len),
            "a part of the layout ends outside the region: {layout:?}"
        );
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 <= pair[1].0 || pair[0].1 == 0 || pair[1].1 == 0,
            "parts of the layout overlap: {layout:?}"
        );
    }
    while rest.len() >= 12 {
        let (buffer, tail) = rest.split_at(8);
        let (len, tail) = tail.split_at(4);
        rest = tail;
        let buffer = u64::from_le_bytes(buffer.try_into().unwrap_or_default());
        let len = u32::from_le_bytes(len.try_into().unwrap_or_default()) as usize;
        if let Some(at) = layout.arena_range(buffer, len) {
            assert!(at >= layout.arena_offset);
            assert!(at + len <= layout.arena_offset + layout.arena_len);
        }
    }
}

fn span<T>(ring: RingLayout) -> (usize, usize) {
    (ring.offset, RingLayout::bytes::<T>(ring.entries))
}
