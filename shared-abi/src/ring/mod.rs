//! Single-producer/single-consumer rings over memory shared with the other side.
//!
//! A ring is a [`RingIndexes`] block followed by `entries` slots, `entries` a power of two.
//! Indexes run free and wrap: slot = `index & (entries - 1)`, fill = `tail - head` in wrapping
//! arithmetic (the io_uring SQ/CQ and virtio split-ring shape). The producer writes a slot, then
//! publishes `tail` with release ordering; the consumer loads `tail` with acquire ordering
//! before it reads the slot, and stores `head` with release ordering only after it has copied
//! the slot out. Each side keeps its own index and checks the other's: a `tail` more than
//! `entries` ahead of `head` is [`RingError::Corrupt`], never an out-of-bounds read.
//!
//! That index protocol is written once, in [`cursor`] ([`ProducerCursor`], [`ConsumerCursor`]),
//! and knows nothing of what a slot holds. Two kinds of ring run over it: the port rings here
//! ([`Producer`], [`Consumer`]: one fixed-size entry per slot) and the QEMU NICs' packet rings
//! ([`crate::qemu::wire`]: a header and the packet's bytes per slot).
//!
//! All of it is safe code over the [`SharedMemory`] trait; the one implementation over a raw
//! mapping, with its `unsafe`, is [`raw::RawMemory`].

pub mod cursor;
pub mod raw;

pub use cursor::{ConsumerCursor, ProducerCursor, RingShape};

use core::marker::PhantomData;

use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// An access to shared memory fell outside it or was misaligned.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OutOfBounds {
    /// Offset of the access.
    pub offset: usize,
    /// Length of the access.
    pub len: usize,
}

/// Memory shared with the other side: a region the other party may write at any time.
///
/// Offsets are relative to the start of the region. Every access is bounds-checked by the
/// implementation; no method hands out a reference into the memory.
pub trait SharedMemory {
    /// Length of the region in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Loads the 32-bit word at `offset` (4-aligned) with acquire ordering.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the word is outside the region or misaligned.
    fn load_acquire(&self, offset: usize) -> Result<u32, OutOfBounds>;
    /// Stores the 32-bit word at `offset` (4-aligned) with release ordering.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the word is outside the region or misaligned.
    fn store_release(&self, offset: usize, value: u32) -> Result<(), OutOfBounds>;
    /// Copies `out.len()` bytes at `offset` into `out`.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the range is outside the region.
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds>;
    /// Copies `data` into the region at `offset`.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the range is outside the region.
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds>;
    /// A full (sequentially consistent) fence: orders this side's earlier stores before its later
    /// loads. Used by the doorbell protocol (publish, then check whether the other side sleeps).
    fn fence(&self) {
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
    }
}

/// Checks that `[offset, offset + len)` lies within `region_len`.
///
/// # Errors
/// [`OutOfBounds`] if it does not (or the arithmetic overflows).
pub fn check_range(region_len: usize, offset: usize, len: usize) -> Result<(), OutOfBounds> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(OutOfBounds { offset, len }),
    }
}

/// The shared index block at the start of every ring: each index on its own cache line, so the
/// two sides do not false-share. 128 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct RingIndexes {
    /// Producer's free-running index of the next slot it will fill.
    pub tail: U32,
    /// Reserved: pads `tail` to its own cache line.
    pub reserved0: [u8; 60],
    /// Consumer's free-running index of the next slot it will read.
    pub head: U32,
    /// Non-zero while the consumer sleeps and wants a doorbell after the next publication
    /// (io_uring's `NEED_WAKEUP`): a [`Wake`], which says for what. Written by the consumer
    /// only.
    pub consumer_sleeping: U32,
    /// Reserved: pads the consumer's words to their own cache line.
    pub reserved1: [u8; 56],
}
const _: () = assert!(core::mem::size_of::<RingIndexes>() == 128);

/// What a sleeping consumer wants a doorbell for: the value of
/// [`RingIndexes::consumer_sleeping`].
///
/// A producer that does not know a value rings for it as for [`Wake::ANY`], so a consumer may
/// only ever be woken more often than it asked, never less.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Wake(pub u32);

impl Wake {
    /// Awake: no doorbell.
    pub const NONE: Self = Self(0);
    /// Every publication.
    pub const ANY: Self = Self(1);
    /// On an event ring, every event but a send's successful end (a `SENT` event of status
    /// `SUCCESS`): for a process that waits for something else (a message, a barrier's end)
    /// and takes the send's end with it when that comes. A producer rings anyway when the ring
    /// fills, so those ends cannot crowd out what the process waits for. Any other ring's
    /// producer rings for it as for [`Wake::ANY`].
    pub const UNLESS_SENT: Self = Self(2);

    /// Whether a publication of entries that are all routine (`only_routine`: on an event ring,
    /// successful sends' ends) calls for the doorbell.
    pub fn rings_for(self, only_routine: bool) -> bool {
        match self {
            Self::NONE => false,
            Self::UNLESS_SENT => !only_routine,
            _ => true,
        }
    }
}

impl Default for RingIndexes {
    fn default() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }
}

/// Where a ring lives in a region and how it is shaped.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RingLayout {
    /// Offset of the ring's [`RingIndexes`] within the region (64-aligned).
    pub offset: usize,
    /// Number of slots, a power of two.
    pub entries: u32,
}

impl RingLayout {
    /// Bytes the ring occupies for entries of type `T`.
    pub const fn bytes<T>(entries: u32) -> usize {
        RingShape::bytes(entries, core::mem::size_of::<T>())
    }

    /// The ring's shape for entries of type `T`: one entry per slot.
    pub const fn shape<T>(&self) -> RingShape {
        RingShape {
            offset: self.offset,
            entries: self.entries,
            stride: core::mem::size_of::<T>(),
        }
    }

    /// Checks the layout against a region of `region_len` bytes for entries of type `T`.
    ///
    /// # Errors
    /// [`RingError::BadLayout`] if `entries` is zero or not a power of two, the offset is not
    /// 64-aligned, or the ring does not fit.
    pub fn validate<T>(&self, region_len: usize) -> Result<(), RingError> {
        self.shape::<T>().validate(region_len)
    }
}

/// A ring operation failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RingError {
    /// The producer's index ran more than a ring's worth ahead of the consumer's: the other side
    /// broke the protocol. Nothing was read.
    Corrupt {
        /// The consumer's own head.
        head: u32,
        /// The tail the producer published.
        tail: u32,
    },
    /// The ring has no free slot (producer side).
    Full,
    /// The ring's layout does not fit the region or is not a power of two.
    BadLayout,
    /// A memory access fell outside the region.
    OutOfBounds(OutOfBounds),
}

impl From<OutOfBounds> for RingError {
    fn from(error: OutOfBounds) -> Self {
        Self::OutOfBounds(error)
    }
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Corrupt { head, tail } => {
                write!(
                    f,
                    "ring corrupt: producer index {tail} is impossible for consumer index {head}"
                )
            }
            Self::Full => write!(f, "ring full"),
            Self::BadLayout => write!(f, "ring layout does not fit its region"),
            Self::OutOfBounds(OutOfBounds { offset, len }) => {
                write!(
                    f,
                    "access of {len} bytes at offset {offset} is outside the region"
                )
            }
        }
    }
}

/// The producer side of a ring of `T` entries: a [`ProducerCursor`] whose slots are one `T`.
#[derive(Debug)]
pub struct Producer<T> {
    cursor: ProducerCursor,
    _entry: PhantomData<fn(T)>,
}

impl<T: IntoBytes + Immutable> Producer<T> {
    /// A producer for the ring at `layout`, starting at index `tail` (0 for a fresh ring).
    pub const fn new(layout: RingLayout, tail: u32) -> Self {
        Self {
            cursor: ProducerCursor::new(layout.shape::<T>(), tail),
            _entry: PhantomData,
        }
    }

    /// The ring's layout.
    pub const fn layout(&self) -> RingLayout {
        let shape = self.cursor.shape();
        RingLayout {
            offset: shape.offset,
            entries: shape.entries,
        }
    }

    /// Free slots, as far as the consumer's published head says.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the consumer's head is ahead of our tail or more than a ring
    /// behind it.
    pub fn free<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<u32, RingError> {
        self.cursor.free(memory)
    }

    /// Writes `entry` into the next slot and publishes it.
    ///
    /// # Errors
    /// [`RingError::Full`] if there is no free slot; [`RingError::Corrupt`] if the consumer's
    /// head is impossible. Nothing is published on error.
    pub fn push<M: SharedMemory + ?Sized>(
        &mut self,
        memory: &M,
        entry: &T,
    ) -> Result<(), RingError> {
        let slot = self.cursor.reserve(memory)?;
        memory.write(slot, entry.as_bytes())?;
        self.cursor.publish(memory)?;
        Ok(())
    }

    /// Whether the consumer asked for a doorbell. Call after [`Producer::push`]; the full fence
    /// orders our tail store before this load, so either the consumer sees the new entry before
    /// it sleeps or we see its sleeping flag (no lost wake-up).
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn consumer_wants_doorbell<M: SharedMemory + ?Sized>(
        &self,
        memory: &M,
    ) -> Result<bool, OutOfBounds> {
        self.cursor.consumer_wants_doorbell(memory)
    }

    /// What the consumer asked a doorbell for ([`Wake::NONE`] while it is awake). Call after
    /// [`Producer::push`], as [`Producer::consumer_wants_doorbell`].
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn consumer_wake<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<Wake, OutOfBounds> {
        self.cursor.consumer_wake(memory)
    }
}

/// The consumer side of a ring of `T` entries: a [`ConsumerCursor`] whose slots are one `T`.
#[derive(Debug)]
pub struct Consumer<T> {
    cursor: ConsumerCursor,
    _entry: PhantomData<fn() -> T>,
}

impl<T: FromBytes + IntoBytes> Consumer<T> {
    /// A consumer for the ring at `layout`, starting at index `head` (0 for a fresh ring).
    pub const fn new(layout: RingLayout, head: u32) -> Self {
        Self {
            cursor: ConsumerCursor::new(layout.shape::<T>(), head),
            _entry: PhantomData,
        }
    }

    /// The ring's layout.
    pub const fn layout(&self) -> RingLayout {
        let shape = self.cursor.shape();
        RingLayout {
            offset: shape.offset,
            entries: shape.entries,
        }
    }

    /// Entries published and not yet consumed.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's tail is more than a ring ahead of our head.
    pub fn available<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<u32, RingError> {
        self.cursor.available(memory)
    }

    /// Reads the next entry, if any, without consuming it (the slot stays the producer's to
    /// see as used until [`Consumer::pop`] or [`Consumer::skip`]).
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's tail is impossible.
    pub fn peek<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<Option<T>, RingError> {
        let Some(slot) = self.cursor.peek(memory)? else {
            return Ok(None);
        };
        let mut entry = T::new_zeroed();
        memory.read(slot, entry.as_mut_bytes())?;
        Ok(Some(entry))
    }

    /// Frees the slot of the entry last returned by [`Consumer::peek`].
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn skip<M: SharedMemory + ?Sized>(&mut self, memory: &M) -> Result<(), OutOfBounds> {
        self.cursor.release(memory)
    }

    /// Takes the next entry, if any, and frees its slot.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's tail is impossible; nothing is consumed then.
    pub fn pop<M: SharedMemory + ?Sized>(&mut self, memory: &M) -> Result<Option<T>, RingError> {
        let entry = self.peek(memory)?;
        if entry.is_some() {
            self.cursor.release(memory)?;
        }
        Ok(entry)
    }

    /// Skips everything published so far (after [`RingError::Corrupt`], to resynchronise with a
    /// producer that misbehaved). Returns the new head.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn resynchronise<M: SharedMemory + ?Sized>(
        &mut self,
        memory: &M,
    ) -> Result<u32, OutOfBounds> {
        self.cursor.resynchronise(memory)
    }

    /// Says whether this consumer is about to sleep and wants a doorbell on the next push.
    /// After setting it, check [`Consumer::available`] once more before sleeping: the fence
    /// pairs with the producer's in [`Producer::consumer_wants_doorbell`].
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn set_sleeping<M: SharedMemory + ?Sized>(
        &self,
        memory: &M,
        sleeping: bool,
    ) -> Result<(), OutOfBounds> {
        self.cursor.set_sleeping(memory, sleeping)
    }

    /// [`Consumer::set_sleeping`], saying what for: [`Wake::NONE`] when awake.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn set_wake<M: SharedMemory + ?Sized>(
        &self,
        memory: &M,
        wake: Wake,
    ) -> Result<(), OutOfBounds> {
        self.cursor.set_wake(memory, wake)
    }
}

#[cfg(test)]
mod tests;
