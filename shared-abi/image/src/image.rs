//! Firmware image files: read one, verify it completely, keep its bytes.
//!
//! A thin layer over [`shared_abi::image`] that adds the file: an [`ImageFile`] exists only for
//! bytes that passed [`shared_abi::image::parse`] (and, if asked, the device's target check), and
//! every error names the file.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use shared_abi::image::{self as layout, HEADER_LEN, ImageError, ImageHeader, ImageTarget};

/// The largest image file read, in bytes. The format allows 4 GiB, but no NIC has memory for more
/// than a few MiB, and a device node or a wrong path must not make us read forever.
pub const MAX_IMAGE_FILE_LEN: u64 = 64 << 20;

/// A firmware image file whose bytes passed every check.
#[derive(Clone, Debug)]
pub struct ImageFile {
    path: PathBuf,
    bytes: Vec<u8>,
    header: ImageHeader,
}

impl ImageFile {
    /// Reads and verifies the image at `path`: header, format and ABI versions, a known target,
    /// exact length, both CRCs.
    ///
    /// # Errors
    /// [`ImageFileError::Read`] if the file cannot be read, [`ImageFileError::TooLarge`] above
    /// [`MAX_IMAGE_FILE_LEN`], [`ImageFileError::Invalid`] with the check that failed.
    pub fn read(path: &Path) -> Result<Self, ImageFileError> {
        let bytes = read_bounded(path)?;
        Self::from_bytes(path, bytes)
    }

    /// As [`ImageFile::read`], and refuses an image for another target than `device`.
    ///
    /// # Errors
    /// As [`ImageFile::read`]; a wrong target is [`ImageFileError::Invalid`] with
    /// [`ImageError::WrongTarget`].
    pub fn read_for_target(path: &Path, device: ImageTarget) -> Result<Self, ImageFileError> {
        let image = Self::read(path)?;
        if image.header.target != device {
            return Err(ImageFileError::Invalid {
                path: path.to_path_buf(),
                error: ImageError::WrongTarget {
                    image: image.header.target,
                    device,
                },
            });
        }
        Ok(image)
    }

    /// Verifies `bytes` as an image that came from `path`.
    ///
    /// # Errors
    /// [`ImageFileError::Invalid`] with the check that failed.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, ImageFileError> {
        match layout::parse(&bytes) {
            Ok((header, _)) => Ok(Self {
                path: path.to_path_buf(),
                bytes,
                header,
            }),
            Err(error) => Err(ImageFileError::Invalid {
                path: path.to_path_buf(),
                error,
            }),
        }
    }

    /// Where the image was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The verified header.
    pub fn header(&self) -> &ImageHeader {
        &self.header
    }

    /// The whole image, header and payload, as it goes onto a device.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        self.bytes.get(HEADER_LEN..).unwrap_or(&[])
    }

    /// The CRC-32 of the whole image, header and payload: what a read-back must reproduce.
    pub fn image_crc32(&self) -> u32 {
        layout::crc32(&self.bytes)
    }
}

/// `header` as aligned `field value` lines, the first naming the image file at `path`: what
/// `nicctl image info` and `cargo xtask image` print. No newline after the last line.
pub fn header_summary(path: &Path, header: &ImageHeader) -> String {
    format!(
        "image     {} ({} bytes)\n\
         format    version {}\n\
         abi       version {}\n\
         target    {}\n\
         load      {:#010x}\n\
         entry     {:#010x}\n\
         payload   {} bytes, CRC-32 {:#010x}\n\
         header    {HEADER_LEN} bytes, CRC-32 {:#010x}",
        path.display(),
        header.image_len(),
        header.format_version.get(),
        header.abi_version.get(),
        header.target,
        header.load_address.get(),
        header.entry_point.get(),
        header.payload_len.get(),
        header.payload_crc32.get(),
        header.header_crc32.get(),
    )
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, ImageFileError> {
    let read_error = |source| ImageFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_IMAGE_FILE_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_IMAGE_FILE_LEN {
        return Err(ImageFileError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_IMAGE_FILE_LEN,
        });
    }
    Ok(bytes)
}

/// Why an image file is not usable.
#[derive(Debug)]
pub enum ImageFileError {
    /// The file could not be opened or read.
    Read {
        /// The image file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is longer than [`MAX_IMAGE_FILE_LEN`].
    TooLarge {
        /// The image file.
        path: PathBuf,
        /// The limit in bytes.
        limit: u64,
    },
    /// The bytes are not a valid image (for this device).
    Invalid {
        /// The image file.
        path: PathBuf,
        /// The check that failed.
        error: ImageError,
    },
}

impl ImageFileError {
    /// The image check that failed, if the file was read but refused.
    pub fn image_error(&self) -> Option<&ImageError> {
        match self {
            Self::Invalid { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl fmt::Display for ImageFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => {
                write!(f, "cannot read image {}: {source}", path.display())
            }
            Self::TooLarge { path, limit } => write!(
                f,
                "{}: image file is longer than {limit} bytes, larger than any NIC's memory",
                path.display()
            ),
            Self::Invalid { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for ImageFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } => Some(source),
            Self::TooLarge { .. } => None,
            Self::Invalid { error, .. } => Some(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_summary_is_one_aligned_line_per_field() {
        let header = ImageHeader::new(ImageTarget::RISCV32IMAC, 0x8000_0000, 0x8000_0008, &[7; 16])
            .expect("a valid header");
        let summary = header_summary(Path::new("nic.img"), &header);
        let lines: Vec<&str> = summary.lines().collect();
        assert_eq!(
            lines,
            [
                format!("image     nic.img ({} bytes)", HEADER_LEN + 16).as_str(),
                format!("format    version {}", header.format_version.get()).as_str(),
                format!("abi       version {}", shared_abi::ABI_VERSION).as_str(),
                "target    riscv32imac-unknown-none-elf",
                "load      0x80000000",
                "entry     0x80000008",
                format!(
                    "payload   16 bytes, CRC-32 {:#010x}",
                    layout::crc32(&[7; 16])
                )
                .as_str(),
                format!(
                    "header    {HEADER_LEN} bytes, CRC-32 {:#010x}",
                    header.header_crc32.get()
                )
                .as_str(),
            ]
        );
        assert!(!summary.ends_with('\n'));
    }
}
