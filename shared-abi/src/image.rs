//! The flashable firmware image: a 64-byte header, then the payload.
//!
//! The payload is a flat memory image: its first byte goes to `load_address`, and execution starts
//! at `entry_point`, which lies inside the payload. The header carries the image format version,
//! the [`crate::ABI_VERSION`] the firmware was built against, the target it was built for, and two
//! CRC-32s (IEEE 802.3, the one zlib computes): one over the payload, one over the header's own
//! first 60 bytes.
//!
//! [`parse`] checks a whole image file once and never panics, whatever the bytes; each refusal is
//! its own [`ImageError`] variant, and its `Display` names the offending value. [`parse_header`]
//! checks only the header, for reading an image out of a larger flash slot where the header's
//! length says where the image ends. [`ImageHeader::new`] builds a header for a payload.
//!
//! ```text
//! offset size field
//!      0    8 magic            "NICBARFW"
//!      8    4 format_version   IMAGE_FORMAT_VERSION
//!     12    4 abi_version      ABI_VERSION
//!     16    4 target           ImageTarget
//!     20    4 payload_len      bytes after the header
//!     24    8 load_address     where payload byte 0 goes
//!     32    8 entry_point      first instruction executed
//!     40    4 payload_crc32    CRC-32 of the payload
//!     44   16 reserved         zero
//!     60    4 header_crc32     CRC-32 of bytes 0..60
//! ```
//! All integers are little-endian.

use core::fmt;

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::ABI_VERSION;

/// The first eight bytes of every image.
pub const IMAGE_MAGIC: [u8; 8] = *b"NICBARFW";

/// The image format version this crate reads and writes. Bumped when the header layout changes.
pub const IMAGE_FORMAT_VERSION: u32 = 1;

/// Size of the header in bytes.
pub const HEADER_LEN: usize = core::mem::size_of::<ImageHeader>();

/// How many leading header bytes `header_crc32` covers: all but the CRC itself.
const HEADER_CRC_COVERS: usize = HEADER_LEN - 4;

/// The target an image was built for: the Rust target triple's instruction set and ABI.
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
pub struct ImageTarget(pub U32);

impl ImageTarget {
    /// RISC-V RV32IMAC, bare metal: `riscv32imac-unknown-none-elf`.
    pub const RISCV32IMAC: Self = Self::new(1);
    /// Arm Cortex-M4F/M7F, bare metal, hard float: `thumbv7em-none-eabihf`.
    pub const THUMBV7EM: Self = Self::new(2);

    /// RISC-V RV64IMAC, bare metal: `riscv64imac-unknown-none-elf` (the 64-bit cores DPUs run
    /// offload code on).
    pub const RISCV64IMAC: Self = Self::new(3);

    /// Every target this version knows, with its Rust target triple.
    pub const KNOWN: [(Self, &'static str); 3] = [
        (Self::RISCV32IMAC, "riscv32imac-unknown-none-elf"),
        (Self::THUMBV7EM, "thumbv7em-none-eabihf"),
        (Self::RISCV64IMAC, "riscv64imac-unknown-none-elf"),
    ];

    /// The target with numeric value `value`.
    pub const fn new(value: u32) -> Self {
        Self(U32::new(value))
    }

    /// The numeric value.
    pub const fn get(self) -> u32 {
        self.0.get()
    }

    /// The Rust target triple of a known target, or `None` for an unknown value.
    pub fn triple(self) -> Option<&'static str> {
        Self::KNOWN
            .iter()
            .find(|(target, _)| *target == self)
            .map(|(_, triple)| *triple)
    }

    /// The target whose Rust target triple is `triple`, or `None` if no known target is.
    pub fn from_triple(triple: &str) -> Option<Self> {
        Self::KNOWN
            .iter()
            .find(|(_, known)| *known == triple)
            .map(|(target, _)| *target)
    }

    /// Whether the value names a known target.
    pub fn is_known(self) -> bool {
        self.triple().is_some()
    }
}

impl fmt::Display for ImageTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.triple() {
            Some(triple) => f.write_str(triple),
            None => write!(f, "unknown target {:#x}", self.get()),
        }
    }
}

/// The header at the start of every image. 64 bytes.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned,
)]
#[repr(C)]
pub struct ImageHeader {
    /// [`IMAGE_MAGIC`].
    pub magic: [u8; 8],
    /// [`IMAGE_FORMAT_VERSION`].
    pub format_version: U32,
    /// The [`crate::ABI_VERSION`] the firmware was built against.
    pub abi_version: U32,
    /// The target the payload's code is for.
    pub target: ImageTarget,
    /// Payload length in bytes: exactly the bytes after the header.
    pub payload_len: U32,
    /// The address payload byte 0 is loaded to.
    pub load_address: U64,
    /// The address execution starts at, inside `load_address..load_address + payload_len`.
    pub entry_point: U64,
    /// CRC-32 (IEEE) of the payload.
    pub payload_crc32: U32,
    /// Reserved, zero.
    pub reserved: [u8; 16],
    /// CRC-32 (IEEE) of the header's first 60 bytes, everything before this field.
    pub header_crc32: U32,
}
const _: () = assert!(core::mem::size_of::<ImageHeader>() == 64);
const _: () = assert!(core::mem::offset_of!(ImageHeader, header_crc32) == HEADER_CRC_COVERS);

impl ImageHeader {
    /// A sealed header for `payload`: magic, format and ABI versions filled in, the payload's
    /// length and CRC computed, and the header CRC over all of it.
    ///
    /// # Errors
    /// [`ImageError::PayloadTooLarge`] if the payload does not fit the 32-bit length field,
    /// [`ImageError::UnknownTarget`] for a target this version does not know, and
    /// [`ImageError::EntryOutsidePayload`] if `entry_point` is not inside the loaded payload.
    pub fn new(
        target: ImageTarget,
        load_address: u64,
        entry_point: u64,
        payload: &[u8],
    ) -> Result<Self, ImageError> {
        let Ok(payload_len) = u32::try_from(payload.len()) else {
            return Err(ImageError::PayloadTooLarge { len: payload.len() });
        };
        let mut header = Self {
            magic: IMAGE_MAGIC,
            format_version: U32::new(IMAGE_FORMAT_VERSION),
            abi_version: U32::new(ABI_VERSION),
            target,
            payload_len: U32::new(payload_len),
            load_address: U64::new(load_address),
            entry_point: U64::new(entry_point),
            payload_crc32: U32::new(crc32(payload)),
            reserved: [0; 16],
            header_crc32: U32::new(0),
        };
        header.seal();
        header.check_fields()?;
        Ok(header)
    }

    /// The header's bytes, as they start an image file.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0; HEADER_LEN];
        bytes.copy_from_slice(self.as_bytes());
        bytes
    }

    /// Recomputes `header_crc32` after fields were changed.
    pub fn seal(&mut self) {
        self.header_crc32 = U32::new(self.computed_header_crc32());
    }

    /// The CRC-32 of the header's first 60 bytes, as `header_crc32` should hold it.
    pub fn computed_header_crc32(&self) -> u32 {
        let bytes = self.as_bytes();
        crc32(bytes.get(..HEADER_CRC_COVERS).unwrap_or(bytes))
    }

    /// The length of the whole image, header and payload, in bytes.
    pub fn image_len(&self) -> usize {
        HEADER_LEN.saturating_add(self.payload_len.get() as usize)
    }

    /// The end of the loaded payload: `load_address + payload_len`, or `None` on overflow.
    pub fn load_end(&self) -> Option<u64> {
        self.load_address
            .get()
            .checked_add(u64::from(self.payload_len.get()))
    }

    /// Checks the fields that do not depend on the payload's bytes: ABI version, a known target,
    /// and an entry point inside the loaded payload.
    fn check_fields(&self) -> Result<(), ImageError> {
        if self.abi_version.get() != ABI_VERSION {
            return Err(ImageError::AbiMismatch {
                image: self.abi_version.get(),
                expected: ABI_VERSION,
            });
        }
        if !self.target.is_known() {
            return Err(ImageError::UnknownTarget(self.target.get()));
        }
        let load = self.load_address.get();
        let entry = self.entry_point.get();
        let inside = match self.load_end() {
            Some(end) => load <= entry && entry < end,
            None => false,
        };
        if !inside {
            return Err(ImageError::EntryOutsidePayload {
                entry,
                load_address: load,
                payload_len: self.payload_len.get(),
            });
        }
        Ok(())
    }
}

/// Why bytes are not a usable image.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ImageError {
    /// Fewer bytes than a header.
    TruncatedHeader {
        /// How many bytes there were.
        len: usize,
    },
    /// The first eight bytes are not [`IMAGE_MAGIC`]: not an image at all.
    BadMagic([u8; 8]),
    /// A header layout this version does not read.
    UnsupportedFormat {
        /// The image's format version.
        version: u32,
    },
    /// The header's CRC does not match its bytes: the header is corrupt.
    BadHeaderCrc {
        /// The CRC the header carries.
        stored: u32,
        /// The CRC of the header's bytes.
        computed: u32,
    },
    /// The firmware was built against another ABI than this host's.
    AbiMismatch {
        /// The image's ABI version.
        image: u32,
        /// The ABI version this side speaks.
        expected: u32,
    },
    /// The target field names no target this version knows.
    UnknownTarget(u32),
    /// The image is for another target than the device's.
    WrongTarget {
        /// The image's target.
        image: ImageTarget,
        /// The device's target.
        device: ImageTarget,
    },
    /// The entry point is not inside the loaded payload (or the payload wraps the address space).
    EntryOutsidePayload {
        /// The header's entry point.
        entry: u64,
        /// The header's load address.
        load_address: u64,
        /// The header's payload length.
        payload_len: u32,
    },
    /// Fewer payload bytes follow the header than it says.
    Truncated {
        /// The header's payload length.
        claimed: u32,
        /// Bytes after the header.
        actual: usize,
    },
    /// More bytes follow the header than its payload length says.
    TrailingBytes {
        /// The header's payload length.
        claimed: u32,
        /// Bytes after the header.
        actual: usize,
    },
    /// The payload's CRC does not match the header's: the payload is corrupt.
    BadPayloadCrc {
        /// The CRC the header carries.
        stored: u32,
        /// The CRC of the payload's bytes.
        computed: u32,
    },
    /// A payload too long for the 32-bit length field (building only).
    PayloadTooLarge {
        /// The payload's length.
        len: usize,
    },
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TruncatedHeader { len } => write!(
                f,
                "image truncated: {len} bytes is shorter than the {HEADER_LEN}-byte header"
            ),
            Self::BadMagic(magic) => {
                f.write_str("not a nicbar image: magic is \"")?;
                for &byte in magic {
                    write!(f, "{}", core::ascii::escape_default(byte))?;
                }
                f.write_str("\", expected \"NICBARFW\"")
            }
            Self::UnsupportedFormat { version } => write!(
                f,
                "unsupported image format version {version}, this tool reads version \
                 {IMAGE_FORMAT_VERSION}"
            ),
            Self::BadHeaderCrc { stored, computed } => write!(
                f,
                "image header corrupt: header CRC-32 is {stored:#010x}, header bytes give \
                 {computed:#010x}"
            ),
            Self::AbiMismatch { image, expected } => write!(
                f,
                "image is built for ABI version {image}, this side speaks ABI version {expected}"
            ),
            Self::UnknownTarget(target) => write!(f, "image is for unknown target {target:#x}"),
            Self::WrongTarget { image, device } => {
                write!(f, "image is for {image}, this device is {device}")
            }
            Self::EntryOutsidePayload {
                entry,
                load_address,
                payload_len,
            } => write!(
                f,
                "image entry point {entry:#x} is outside its payload ({payload_len} bytes loaded \
                 at {load_address:#x})"
            ),
            Self::Truncated { claimed, actual } => write!(
                f,
                "image truncated: header says {claimed} payload bytes, file has {actual}"
            ),
            Self::TrailingBytes { claimed, actual } => write!(
                f,
                "trailing bytes after image: header says {claimed} payload bytes, file has \
                 {actual}"
            ),
            Self::BadPayloadCrc { stored, computed } => write!(
                f,
                "image payload corrupt: header says CRC-32 {stored:#010x}, payload gives \
                 {computed:#010x}"
            ),
            Self::PayloadTooLarge { len } => {
                write!(
                    f,
                    "payload of {len} bytes does not fit an image (limit 4 GiB - 1)"
                )
            }
        }
    }
}

impl core::error::Error for ImageError {}

/// Checks the header at the start of `bytes`, which may continue past the image (a flash slot):
/// magic, format version, header CRC, ABI version, a known target, an entry point inside the
/// payload. Says nothing about the payload; [`ImageHeader::image_len`] says where the image ends.
///
/// # Errors
/// The first check that fails, as an [`ImageError`]. Never panics, whatever the bytes.
pub fn parse_header(bytes: &[u8]) -> Result<ImageHeader, ImageError> {
    let Ok((header, _)) = ImageHeader::read_from_prefix(bytes) else {
        return Err(ImageError::TruncatedHeader { len: bytes.len() });
    };
    if header.magic != IMAGE_MAGIC {
        return Err(ImageError::BadMagic(header.magic));
    }
    // The version says which layout the CRC covers, so it is read before the CRC is trusted.
    if header.format_version.get() != IMAGE_FORMAT_VERSION {
        return Err(ImageError::UnsupportedFormat {
            version: header.format_version.get(),
        });
    }
    let computed = header.computed_header_crc32();
    if header.header_crc32.get() != computed {
        return Err(ImageError::BadHeaderCrc {
            stored: header.header_crc32.get(),
            computed,
        });
    }
    header.check_fields()?;
    Ok(header)
}

/// Checks a whole image, exactly `bytes` long: the header as [`parse_header`] does, then that the
/// payload is exactly as long as the header says and matches its CRC. Returns the header and the
/// payload.
///
/// # Errors
/// The first check that fails, as an [`ImageError`]. Never panics, whatever the bytes.
pub fn parse(bytes: &[u8]) -> Result<(ImageHeader, &[u8]), ImageError> {
    let header = parse_header(bytes)?;
    let payload = bytes.get(HEADER_LEN..).unwrap_or(&[]);
    let claimed = header.payload_len.get();
    if payload.len() < claimed as usize {
        return Err(ImageError::Truncated {
            claimed,
            actual: payload.len(),
        });
    }
    if payload.len() > claimed as usize {
        return Err(ImageError::TrailingBytes {
            claimed,
            actual: payload.len(),
        });
    }
    let computed = crc32(payload);
    if header.payload_crc32.get() != computed {
        return Err(ImageError::BadPayloadCrc {
            stored: header.payload_crc32.get(),
            computed,
        });
    }
    Ok((header, payload))
}

/// [`parse`], then refuses an image for another target than `device`'s.
///
/// # Errors
/// As [`parse`], and [`ImageError::WrongTarget`].
pub fn parse_for_target(
    bytes: &[u8],
    device: ImageTarget,
) -> Result<(ImageHeader, &[u8]), ImageError> {
    let (header, payload) = parse(bytes)?;
    if header.target != device {
        return Err(ImageError::WrongTarget {
            image: header.target,
            device,
        });
    }
    Ok((header, payload))
}

/// The CRC-32 lookup table for the reflected IEEE polynomial `0xEDB88320`.
const CRC32_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut index = 0;
    while index < 256 {
        let mut crc = index as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[index] = crc;
        index += 1;
    }
    table
};

/// A running CRC-32 (IEEE 802.3, as zlib's `crc32`), for data that arrives in pieces.
#[derive(Clone, Copy, Debug)]
pub struct Crc32 {
    state: u32,
}

impl Default for Crc32 {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32 {
    /// A CRC over no bytes yet.
    pub const fn new() -> Self {
        Self { state: !0 }
    }

    /// Feeds `bytes`.
    pub const fn update(mut self, bytes: &[u8]) -> Self {
        let mut index = 0;
        while index < bytes.len() {
            let low_byte = (self.state ^ bytes[index] as u32) & 0xff;
            self.state = (self.state >> 8) ^ CRC32_TABLE[low_byte as usize];
            index += 1;
        }
        self
    }

    /// The CRC of every byte fed so far.
    pub const fn finish(self) -> u32 {
        !self.state
    }
}

/// The CRC-32 (IEEE 802.3, as zlib's `crc32`) of `bytes`.
pub const fn crc32(bytes: &[u8]) -> u32 {
    Crc32::new().update(bytes).finish()
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;
    use std::string::ToString;
    use std::vec::Vec;

    use super::*;
    use proptest::prelude::*;

    fn image(header: &ImageHeader, payload: &[u8]) -> Vec<u8> {
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(payload);
        bytes
    }

    /// A valid image: a known target, any load address that leaves room, an entry inside.
    fn valid_image() -> impl Strategy<Value = (ImageHeader, Vec<u8>)> {
        (
            prop::sample::select(ImageTarget::KNOWN.map(|(target, _)| target).to_vec()),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 1..300),
            any::<prop::sample::Index>(),
        )
            .prop_map(|(target, load, payload, entry_index)| {
                let load = load.min(u64::MAX - payload.len() as u64);
                let entry = load + entry_index.index(payload.len()) as u64;
                let header = ImageHeader::new(target, load, entry, &payload).unwrap();
                (header, payload)
            })
    }

    #[test]
    fn crc32_matches_zlib() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(
            crc32(b"The quick brown fox jumps over the lazy dog"),
            0x414f_a339
        );
        assert_eq!(
            Crc32::new().update(b"12345").update(b"6789").finish(),
            0xcbf4_3926
        );
    }

    #[test]
    fn targets_name_their_triples() {
        for (target, triple) in ImageTarget::KNOWN {
            assert_eq!(ImageTarget::from_triple(triple), Some(target));
            assert_eq!(target.to_string(), triple);
        }
        assert_eq!(ImageTarget::from_triple("x86_64-unknown-linux-gnu"), None);
        assert_eq!(ImageTarget::new(9).to_string(), "unknown target 0x9");
    }

    #[test]
    fn refusals_say_why() {
        let payload = [0x13u8; 100];
        let header = ImageHeader::new(ImageTarget::THUMBV7EM, 0x1000, 0x1004, &payload).unwrap();
        let good = image(&header, &payload);
        assert!(parse(&good).is_ok());

        assert_eq!(
            parse_for_target(&good, ImageTarget::RISCV32IMAC)
                .unwrap_err()
                .to_string(),
            "image is for thumbv7em-none-eabihf, this device is riscv32imac-unknown-none-elf"
        );
        assert_eq!(
            parse(&good[..HEADER_LEN + 40]).unwrap_err().to_string(),
            "image truncated: header says 100 payload bytes, file has 40"
        );
        assert_eq!(
            parse(&good[..10]).unwrap_err(),
            ImageError::TruncatedHeader { len: 10 }
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            parse(&long).unwrap_err(),
            ImageError::TrailingBytes {
                claimed: 100,
                actual: 101
            }
        );
        assert_eq!(parse_header(&long).unwrap(), header);

        let mut bad = good.clone();
        bad[0] = b'X';
        assert_eq!(
            parse(&bad).unwrap_err().to_string(),
            "not a nicbar image: magic is \"XICBARFW\", expected \"NICBARFW\""
        );

        let mut other = header;
        other.format_version = U32::new(7);
        other.seal();
        assert_eq!(
            parse(&image(&other, &payload)).unwrap_err(),
            ImageError::UnsupportedFormat { version: 7 }
        );

        let mut other = header;
        other.abi_version = U32::new(ABI_VERSION + 1);
        other.seal();
        assert_eq!(
            parse(&image(&other, &payload)).unwrap_err(),
            ImageError::AbiMismatch {
                image: ABI_VERSION + 1,
                expected: ABI_VERSION
            }
        );

        let mut other = header;
        other.target = ImageTarget::new(0x55);
        other.seal();
        assert_eq!(
            parse(&image(&other, &payload)).unwrap_err().to_string(),
            "image is for unknown target 0x55"
        );

        let mut other = header;
        other.entry_point = U64::new(0x1064);
        other.seal();
        assert_eq!(
            parse(&image(&other, &payload)).unwrap_err().to_string(),
            "image entry point 0x1064 is outside its payload (100 bytes loaded at 0x1000)"
        );

        let mut bad = good.clone();
        bad[20] ^= 1;
        assert!(matches!(
            parse(&bad).unwrap_err(),
            ImageError::BadHeaderCrc { .. }
        ));

        let mut bad = good.clone();
        bad[HEADER_LEN + 99] ^= 0x80;
        let error = parse(&bad).unwrap_err();
        assert_eq!(
            error,
            ImageError::BadPayloadCrc {
                stored: crc32(&payload),
                computed: crc32(&bad[HEADER_LEN..])
            }
        );
        assert!(format!("{error}").starts_with("image payload corrupt: header says CRC-32 0x"));

        assert_eq!(
            ImageHeader::new(ImageTarget::RISCV32IMAC, u64::MAX, u64::MAX, &payload).unwrap_err(),
            ImageError::EntryOutsidePayload {
                entry: u64::MAX,
                load_address: u64::MAX,
                payload_len: 100
            }
        );
        assert!(ImageHeader::new(ImageTarget::RISCV32IMAC, 0, 0, &[]).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok((header, payload)) = parse(&bytes) {
                prop_assert_eq!(header.payload_len.get() as usize, payload.len());
                prop_assert_eq!(header.image_len(), bytes.len());
            }
            let _ = parse_header(&bytes);
        }

        #[test]
        fn arbitrary_bytes_behind_a_valid_magic_never_panic(
            mut bytes in proptest::collection::vec(any::<u8>(), HEADER_LEN..400),
        ) {
            bytes[..8].copy_from_slice(&IMAGE_MAGIC);
            bytes[8..12].copy_from_slice(&IMAGE_FORMAT_VERSION.to_le_bytes());
            let _ = parse(&bytes);
            // With a correct header CRC the checks past it are reached too.
            let crc = crc32(&bytes[..HEADER_CRC_COVERS]);
            bytes[HEADER_CRC_COVERS..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
            let _ = parse(&bytes);
        }

        #[test]
        fn every_valid_image_round_trips((header, payload) in valid_image()) {
            let bytes = image(&header, &payload);
            let (parsed, parsed_payload) = parse(&bytes).unwrap();
            prop_assert_eq!(parsed, header);
            prop_assert_eq!(parsed_payload, &payload[..]);
            prop_assert_eq!(parsed.abi_version.get(), ABI_VERSION);
            prop_assert!(parse_for_target(&bytes, header.target).is_ok());
            // A slot holding the image followed by other bytes still yields the header.
            let mut slot = bytes.clone();
            slot.extend_from_slice(&[0xff; 17]);
            prop_assert_eq!(parse_header(&slot).unwrap(), header);
        }

        #[test]
        fn every_single_byte_corruption_is_refused(
            (header, payload) in valid_image(),
            flip in 1u8..=255,
        ) {
            let mut bytes = image(&header, &payload);
            for position in 0..bytes.len() {
                bytes[position] ^= flip;
                prop_assert!(parse(&bytes).is_err(), "byte {} ^ {:#x} accepted", position, flip);
                bytes[position] ^= flip;
            }
        }

        #[test]
        fn every_truncation_is_refused((header, payload) in valid_image(), cut in any::<prop::sample::Index>()) {
            let bytes = image(&header, &payload);
            let cut = cut.index(bytes.len());
            prop_assert!(parse(&bytes[..cut]).is_err());
        }
    }
}
