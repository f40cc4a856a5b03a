//! Writes hand-made seed inputs into `corpus/` (well-formed images, region headers and packets
//! that random bytes would take the fuzzer long to reach, such as ones with valid CRCs):
//! `cargo run --no-default-features --example seeds`. The fuzzer grows the corpora from these.

use std::path::Path;

use shared_abi::ids::{Generation, NodeId, PortId};
use shared_abi::image::{ImageHeader, ImageTarget};
use shared_abi::packet::{
    BROADCAST_MAX, BarrierPayload, DATA_SEGMENT, DataSegmentHeader, MAX_PACKET_LEN, PacketHeader,
    PacketKind,
};
use shared_abi::region::RegionLayout;
use zerocopy::IntoBytes;

fn main() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir).expect("a corpus directory");
        std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("a seed file");
    };

    let payload: Vec<u8> = (0..64u8).collect();
    let header = ImageHeader::new(ImageTarget::RISCV32IMAC, 0x8000_0000, 0x8000_0010, &payload)
        .expect("a valid header");
    for mode in [0u8, 1] {
        let mut image = vec![mode];
        image.extend_from_slice(header.as_bytes());
        image.extend_from_slice(&payload);
        write("image", &format!("riscv-mode{mode}"), &image);
    }

    for (name, layout) in [
        ("tiny", RegionLayout::standard(2, 2, 2, 4096)),
        ("standard", RegionLayout::standard(64, 64, 128, 64 * 1024)),
    ] {
        let mut region = layout
            .header(NodeId::new(1), PortId(2), 0, Generation::new(3))
            .as_bytes()
            .to_vec();
        region.push(0);
        for (buffer, len) in [(0u64, 64u32), (4000, 200), (u64::MAX, 1)] {
            region.extend_from_slice(&buffer.to_le_bytes());
            region.extend_from_slice(&len.to_le_bytes());
        }
        write("region", name, &region);
    }

    let mut out = vec![0u8; MAX_PACKET_LEN];
    let mut packets: Vec<Vec<u8>> = Vec::new();
    // A long message's first and second segments (a segment header, then its bytes).
    let segment = |offset: u32| {
        let mut payload = DataSegmentHeader {
            total: 8000.into(),
            offset: offset.into(),
        }
        .as_bytes()
        .to_vec();
        payload.extend_from_slice(&[0xcd; 64]);
        payload
    };
    let (first, second) = (segment(0), segment(DATA_SEGMENT as u32));
    // A broadcast's barrier packet: its barrier's identity, then the root's bytes.
    let mut broadcast = BarrierPayload {
        barrier: shared_abi::ids::BarrierId::new(1, 2, 3),
        ..BarrierPayload::default()
    }
    .as_bytes()
    .to_vec();
    broadcast.extend_from_slice(&[0xb5; BROADCAST_MAX]);
    for (kind, name, payload) in (1..=7u8)
        .map(|kind| {
            let payload = if kind == 1 { &[0xab; 64][..] } else { &[][..] };
            (kind, format!("kind{kind}"), payload)
        })
        .chain([
            (
                PacketKind::DATA_SEGMENT.0,
                "kind13-first".into(),
                &first[..],
            ),
            (
                PacketKind::DATA_SEGMENT.0,
                "kind13-second".into(),
                &second[..],
            ),
            (
                PacketKind::BARRIER.0,
                "kind5-broadcast".into(),
                &broadcast[..],
            ),
        ])
    {
        let mut header = PacketHeader::new(PacketKind(kind), NodeId::new(0), NodeId::new(1));
        header.dst_port = PortId(u8::from(kind == 5));
        header.size = if kind == PacketKind::DATA_SEGMENT.0 {
            13
        } else {
            7
        };
        header.epoch = 1.into();
        let len = header.emit(payload, &mut out).expect("fits");
        write("packet", &name, &out[..len]);
        packets.push(out[..len].to_vec());
    }
    // nic_packets: every packet kind in turn, each framed as [len u16][wait u8][bytes].
    let mut framed = Vec::new();
    for packet in &packets {
        framed.extend_from_slice(&(packet.len() as u16).to_le_bytes());
        framed.push(1);
        framed.extend_from_slice(packet);
    }
    write("nic_packets", "every-kind", &framed);
    println!("wrote seeds under {}", corpus.display());
}
