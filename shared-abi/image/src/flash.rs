//! The flash device that holds a NIC's firmware image.
//!
//! # Layout
//!
//! A device holds one image slot, at offset 0: the image file's bytes exactly as they are, header
//! first. Bytes after the image are left as they were; the header's payload length says where
//! the image ends, which is how [`FlashDevice::read_image`] finds it. A freshly created emulated
//! device is filled with [`ERASED_BYTE`], as erased NOR flash reads.
//!
//! Writing is not atomic: an interrupted write leaves a partial image, which the header and payload
//! CRCs refuse when it is next read. (Two slots for fail-safe updates are future work.)
//!
//! # Devices
//!
//! A device is a regular file (an emulated flash chip, which the emulated NIC boots from) or a
//! block device, including an MTD partition's `/dev/mtdblockN`, which erases for us. Character
//! devices are refused: a raw MTD device (`/dev/mtdN`) needs its erase blocks erased before they
//! are written, which this module does not do yet.
//!
//! [`FlashDevice::write_image`] takes an [`ImageFile`], which exists only for an image that passed
//! every check, so a device is never touched by an image that would be refused.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};

use shared_abi::image::{self as layout, HEADER_LEN, ImageError, ImageTarget};

use crate::image::{ImageFile, ImageFileError, MAX_IMAGE_FILE_LEN};

/// What an erased flash byte reads as; a created emulated device starts out all of them.
pub const ERASED_BYTE: u8 = 0xff;

/// Bytes written (and read back) per system call, and the granularity of progress reports.
pub const CHUNK_LEN: usize = 4096;

/// What kind of device a [`FlashDevice`] is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeviceKind {
    /// A regular file: an emulated flash chip.
    File,
    /// A block device.
    BlockDevice,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::File => "emulated flash file",
            Self::BlockDevice => "block device",
        })
    }
}

/// Which step a [`Progress`] report is about.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Phase {
    /// Writing the image.
    Write,
    /// Reading it back and comparing.
    Verify,
}

/// How far [`FlashDevice::write_image`] has got.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Progress {
    /// The step.
    pub phase: Phase,
    /// Bytes done in this step.
    pub done: u64,
    /// Bytes this step handles in all.
    pub total: u64,
}

/// What [`FlashDevice::write_image`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FlashReport {
    /// Bytes written at offset 0, and read back identical.
    pub bytes_written: u64,
    /// The CRC-32 of the bytes read back: the whole image, header and payload.
    pub image_crc32: u32,
    /// The payload CRC-32 the header carries.
    pub payload_crc32: u32,
    /// The target of the image now on the device.
    pub target: ImageTarget,
}

/// An open flash device.
#[derive(Debug)]
pub struct FlashDevice {
    file: File,
    path: PathBuf,
    len: u64,
    kind: DeviceKind,
}

impl FlashDevice {
    /// Opens the existing device at `path` for reading and writing, without changing it.
    ///
    /// # Errors
    /// [`FlashError::Open`] if it does not exist or cannot be opened,
    /// [`FlashError::Unsupported`] if it is neither a regular file nor a block device.
    pub fn open(path: &Path) -> Result<Self, FlashError> {
        let open_error = |source| FlashError::Open {
            path: path.to_path_buf(),
            source,
        };
        // Checked before opening: opening a FIFO for writing would wait for a reader.
        let kind = device_kind(path, &std::fs::metadata(path).map_err(open_error)?)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(open_error)?;
        // The path may have been replaced between the two looks; trust what was opened.
        if device_kind(path, &file.metadata().map_err(open_error)?)? != kind {
            return Err(FlashError::Unsupported {
                path: path.to_path_buf(),
                what: "a device that changed while it was being opened",
            });
        }
        let len = (&file).seek(SeekFrom::End(0)).map_err(open_error)?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            len,
            kind,
        })
    }

    /// Creates an emulated flash device: a new regular file of `len` bytes, all [`ERASED_BYTE`].
    ///
    /// # Errors
    /// [`FlashError::Create`] if the file exists already or cannot be created or filled.
    pub fn create(path: &Path, len: u64) -> Result<Self, FlashError> {
        let create_error = |source| FlashError::Create {
            path: path.to_path_buf(),
            len,
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(create_error)?;
        let erased = [ERASED_BYTE; CHUNK_LEN];
        let mut offset = 0;
        while offset < len {
            let count = (len - offset).min(CHUNK_LEN as u64) as usize;
            file.write_all_at(&erased[..count], offset)
                .map_err(create_error)?;
            offset += count as u64;
        }
        file.sync_all().map_err(create_error)?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            len,
            kind: DeviceKind::File,
        })
    }

    /// The device's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The device's size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the device has no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What kind of device it is.
    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    /// Writes `image` to the slot at offset 0, then fsyncs, drops the cached copy where the
    /// kernel allows, reads the image back and compares it byte for byte. `progress` hears
    /// after every [`CHUNK_LEN`] bytes of each step.
    ///
    /// Nothing is written if the image does not fit.
    ///
    /// # Errors
    /// [`FlashError::TooSmall`] before writing anything; [`FlashError::Write`],
    /// [`FlashError::Sync`], [`FlashError::Read`] or [`FlashError::VerifyMismatch`] after the
    /// write began, in which case the slot holds a partial or damaged image.
    pub fn write_image(
        &mut self,
        image: &ImageFile,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<FlashReport, FlashError> {
        let bytes = image.bytes();
        let total = bytes.len() as u64;
        if total > self.len {
            return Err(FlashError::TooSmall {
                path: self.path.clone(),
                device_len: self.len,
                image_len: total,
            });
        }

        let mut offset = 0u64;
        for chunk in bytes.chunks(CHUNK_LEN) {
            self.file
                .write_all_at(chunk, offset)
                .map_err(|source| FlashError::Write {
                    path: self.path.clone(),
                    offset,
                    source,
                })?;
            offset += chunk.len() as u64;
            progress(Progress {
                phase: Phase::Write,
                done: offset,
                total,
            });
        }
        self.file.sync_all().map_err(|source| FlashError::Sync {
            path: self.path.clone(),
            source,
        })?;
        // Without this the read-back would come from the page cache, proving only that the
        // kernel remembers what we wrote. Advice only: where the kernel ignores it, the
        // comparison is still against what a reader of the device sees.
        let _ = nix::fcntl::posix_fadvise(
            &self.file,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );

        let mut read_back = vec![0u8; CHUNK_LEN];
        let mut crc = layout::Crc32::new();
        let mut offset = 0u64;
        for chunk in bytes.chunks(CHUNK_LEN) {
            let read_back = &mut read_back[..chunk.len()];
            self.read_exact_at(read_back, offset)?;
            if let Some(position) = chunk.iter().zip(read_back.iter()).position(|(a, b)| a != b) {
                return Err(FlashError::VerifyMismatch {
                    path: self.path.clone(),
                    offset: offset + position as u64,
                    wrote: chunk[position],
                    read: read_back[position],
                });
            }
            crc = crc.update(read_back);
            offset += chunk.len() as u64;
            progress(Progress {
                phase: Phase::Verify,
                done: offset,
                total,
            });
        }

        Ok(FlashReport {
            bytes_written: total,
            image_crc32: crc.finish(),
            payload_crc32: image.header().payload_crc32.get(),
            target: image.header().target,
        })
    }

    /// Reads the image in the slot and verifies it completely.
    ///
    /// # Errors
    /// [`FlashError::Read`] if the device cannot be read, [`FlashError::Slot`] if the slot does
    /// not hold a valid image (an erased device is refused for its magic).
    pub fn read_image(&self) -> Result<ImageFile, FlashError> {
        let slot_error = |error| FlashError::Slot {
            path: self.path.clone(),
            error,
        };
        let mut header = [0u8; HEADER_LEN];
        let available = self.len.min(HEADER_LEN as u64) as usize;
        self.read_exact_at(&mut header[..available], 0)?;
        let parsed = layout::parse_header(&header[..available]).map_err(slot_error)?;
        let image_len = parsed.image_len() as u64;
        if image_len > self.len || image_len > MAX_IMAGE_FILE_LEN {
            return Err(slot_error(ImageError::Truncated {
                claimed: parsed.payload_len.get(),
                actual: self.len.saturating_sub(HEADER_LEN as u64) as usize,
            }));
        }
        let mut bytes = vec![0u8; image_len as usize];
        self.read_exact_at(&mut bytes, 0)?;
        ImageFile::from_bytes(&self.path, bytes).map_err(|error| match error {
            ImageFileError::Invalid { error, .. } => slot_error(error),
            other => FlashError::Image(other),
        })
    }

    fn read_exact_at(&self, buffer: &mut [u8], offset: u64) -> Result<(), FlashError> {
        self.file
            .read_exact_at(buffer, offset)
            .map_err(|source| FlashError::Read {
                path: self.path.clone(),
                offset,
                source,
            })
    }
}

fn device_kind(path: &Path, metadata: &std::fs::Metadata) -> Result<DeviceKind, FlashError> {
    let file_type = metadata.file_type();
    let what = if file_type.is_file() {
        return Ok(DeviceKind::File);
    } else if file_type.is_block_device() {
        return Ok(DeviceKind::BlockDevice);
    } else if file_type.is_char_device() {
        "a character device; a raw MTD device (/dev/mtdN) needs an erase before each write, \
         which is not supported yet: use its block device /dev/mtdblockN"
    } else if file_type.is_dir() {
        "a directory"
    } else {
        "neither a regular file nor a block device"
    };
    Err(FlashError::Unsupported {
        path: path.to_path_buf(),
        what,
    })
}

/// Why flashing (or reading a device) failed.
#[derive(Debug)]
pub enum FlashError {
    /// The device could not be opened (or does not exist).
    Open {
        /// The device.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// An emulated device could not be created.
    Create {
        /// The device.
        path: PathBuf,
        /// The size it was to have.
        len: u64,
        /// What the system said.
        source: std::io::Error,
    },
    /// The path is not a kind of device this module writes.
    Unsupported {
        /// The device.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// The image is larger than the device; nothing was written.
    TooSmall {
        /// The device.
        path: PathBuf,
        /// The device's size.
        device_len: u64,
        /// The image's size.
        image_len: u64,
    },
    /// Writing failed part-way.
    Write {
        /// The device.
        path: PathBuf,
        /// Where the failed write began.
        offset: u64,
        /// What the system said.
        source: std::io::Error,
    },
    /// Flushing the written image to the device failed.
    Sync {
        /// The device.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Reading the device failed.
    Read {
        /// The device.
        path: PathBuf,
        /// Where the failed read began.
        offset: u64,
        /// What the system said.
        source: std::io::Error,
    },
    /// The bytes read back differ from those written.
    VerifyMismatch {
        /// The device.
        path: PathBuf,
        /// The first offset that differs.
        offset: u64,
        /// The byte written there.
        wrote: u8,
        /// The byte read back.
        read: u8,
    },
    /// The slot does not hold a valid image.
    Slot {
        /// The device.
        path: PathBuf,
        /// What is wrong with the image in it.
        error: ImageError,
    },
    /// An image error that is not about the image's bytes.
    Image(ImageFileError),
}

impl fmt::Display for FlashError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open { path, source } => {
                write!(f, "cannot open flash device {}: {source}", path.display())
            }
            Self::Create { path, len, source } => write!(
                f,
                "cannot create a {len}-byte emulated flash device at {}: {source}",
                path.display()
            ),
            Self::Unsupported { path, what } => {
                write!(f, "cannot flash {}: it is {what}", path.display())
            }
            Self::TooSmall {
                path,
                device_len,
                image_len,
            } => write!(
                f,
                "flash device {} is {device_len} bytes, the image needs {image_len}; nothing was \
                 written",
                path.display()
            ),
            Self::Write {
                path,
                offset,
                source,
            } => write!(
                f,
                "writing flash device {} failed at offset {offset}: {source}; the slot now \
                 holds a partial image",
                path.display()
            ),
            Self::Sync { path, source } => write!(
                f,
                "flushing flash device {} failed: {source}; the image may not be on the device",
                path.display()
            ),
            Self::Read {
                path,
                offset,
                source,
            } => write!(
                f,
                "reading flash device {} failed at offset {offset}: {source}",
                path.display()
            ),
            Self::VerifyMismatch {
                path,
                offset,
                wrote,
                read,
            } => write!(
                f,
                "flash device {} does not hold what was written: offset {offset} reads \
                 {read:#04x}, {wrote:#04x} was written",
                path.display()
            ),
            Self::Slot { path, error } => {
                write!(
                    f,
                    "flash device {} holds no valid image: {error}",
                    path.display()
                )
            }
            Self::Image(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for FlashError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Open { source, .. }
            | Self::Create { source, .. }
            | Self::Write { source, .. }
            | Self::Sync { source, .. }
            | Self::Read { source, .. } => Some(source),
            Self::Slot { error, .. } => Some(error),
            Self::Image(error) => Some(error),
            Self::Unsupported { .. } | Self::TooSmall { .. } | Self::VerifyMismatch { .. } => None,
        }
    }
}
