//! The index protocol of a single-producer/single-consumer ring, written once.
//!
//! Both kinds of ring in this crate run it: the port rings ([`super::Producer`],
//! [`super::Consumer`]: one fixed-size entry per slot) and the QEMU NICs' packet rings
//! ([`crate::qemu::wire`]: a header and the packet's bytes per slot). A cursor knows where the
//! ring's [`RingIndexes`] block is, how many slots follow it and how far apart they are
//! ([`RingShape`]); it says which slot to fill or read and moves the indexes, and its caller
//! copies the slot's bytes in between. Which bytes a slot holds is the caller's business; when
//! they may be touched, and in which order the indexes move around them, is this module's.
//!
//! The protocol (the io_uring SQ/CQ and virtio split-ring shape):
//!
//! - Indexes run free and wrap: slot = `index & (entries - 1)`, fill = `tail - head` in wrapping
//!   arithmetic, `entries` a power of two.
//! - The producer fills the slot at its `tail` ([`ProducerCursor::reserve`]), then stores the
//!   new `tail` with release ordering ([`ProducerCursor::publish`]).
//! - The consumer loads `tail` with acquire ordering before it reads a slot
//!   ([`ConsumerCursor::peek`]), and stores the new `head` with release ordering only after it
//!   has copied the slot out ([`ConsumerCursor::release`]).
//! - Each side keeps its own index in private memory and never reads it back from the shared
//!   block, and checks the other side's before trusting it: a `tail` more than a ring ahead of
//!   `head` (or, seen from the producer, a `head` ahead of `tail`) is [`RingError::Corrupt`],
//!   never an out-of-bounds slot.
//! - Doorbells: a consumer about to sleep raises `consumer_sleeping`, fences, and looks at the
//!   ring once more ([`ConsumerCursor::set_sleeping`]); a producer publishes, fences, and rings
//!   only if the flag is up ([`ProducerCursor::consumer_wants_doorbell`]). The two full fences
//!   make the wake-up impossible to lose. The flag is a [`Wake`]: an event ring's consumer may
//!   ask not to be rung for sends' ends alone ([`Wake::UNLESS_SENT`]).

use core::mem::{offset_of, size_of};

use super::{OutOfBounds, RingError, RingIndexes, SharedMemory, Wake};

/// Offsets of the index words within [`RingIndexes`].
pub(crate) const TAIL_OFFSET: usize = offset_of!(RingIndexes, tail);
pub(crate) const HEAD_OFFSET: usize = offset_of!(RingIndexes, head);
pub(crate) const SLEEPING_OFFSET: usize = offset_of!(RingIndexes, consumer_sleeping);

/// Where a ring lives in a region and how its slots are laid out: a [`RingIndexes`] block at
/// `offset`, then `entries` slots `stride` bytes apart.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RingShape {
    /// Offset of the ring's [`RingIndexes`] within the region (64-aligned).
    pub offset: usize,
    /// Number of slots, a power of two.
    pub entries: u32,
    /// Bytes between the starts of two slots.
    pub stride: usize,
}

impl RingShape {
    /// Bytes the ring occupies: its index block and its slots.
    pub const fn bytes(entries: u32, stride: usize) -> usize {
        size_of::<RingIndexes>() + entries as usize * stride
    }

    /// Offset within the region of the slot that free-running `index` falls on.
    ///
    /// Inside the ring for every `index` once [`RingShape::validate`] has passed: the slot
    /// number is masked to `entries - 1`, so an index the other side forged cannot point
    /// outside it.
    pub const fn slot_offset(&self, index: u32) -> usize {
        let slot = (index & self.entries.wrapping_sub(1)) as usize;
        self.offset + size_of::<RingIndexes>() + slot * self.stride
    }

    /// Checks the shape against a region of `region_len` bytes.
    ///
    /// # Errors
    /// [`RingError::BadLayout`] if `entries` is zero or not a power of two, the offset is not
    /// 64-aligned, or the ring does not fit (or its size overflows).
    pub fn validate(&self, region_len: usize) -> Result<(), RingError> {
        let fits = (self.entries as usize)
            .checked_mul(self.stride)
            .and_then(|slots| slots.checked_add(size_of::<RingIndexes>()))
            .and_then(|bytes| self.offset.checked_add(bytes))
            .is_some_and(|end| end <= region_len);
        if !self.entries.is_power_of_two() || self.offset % 64 != 0 || !fits {
            return Err(RingError::BadLayout);
        }
        Ok(())
    }
}

/// The producer's end of a ring's indexes. Holds its own `tail`; never reads it back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ProducerCursor {
    shape: RingShape,
    tail: u32,
}

impl ProducerCursor {
    /// A producer's cursor for the ring of `shape`, starting at index `tail` (0 for a fresh
    /// ring).
    pub const fn new(shape: RingShape, tail: u32) -> Self {
        Self { shape, tail }
    }

    /// The ring's shape.
    pub const fn shape(&self) -> RingShape {
        self.shape
    }

    /// The index of the next slot this producer will fill.
    pub const fn tail(&self) -> u32 {
        self.tail
    }

    /// Free slots, as far as the consumer's published head says.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the consumer's head is ahead of our tail or more than a ring
    /// behind it.
    pub fn free<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<u32, RingError> {
        // Acquire: pairs with the consumer's release in `ConsumerCursor::release`, so its copy
        // out of a slot has finished before we see the slot free and overwrite it.
        let head = memory.load_acquire(self.shape.offset + HEAD_OFFSET)?;
        let used = self.tail.wrapping_sub(head);
        if used > self.shape.entries {
            return Err(RingError::Corrupt {
                head,
                tail: self.tail,
            });
        }
        Ok(self.shape.entries - used)
    }

    /// The offset of the slot to fill next, if the ring has room. Write the slot there, then
    /// [`ProducerCursor::publish`] it; until then the consumer cannot see it.
    ///
    /// # Errors
    /// [`RingError::Full`] if there is no free slot; [`RingError::Corrupt`] if the consumer's
    /// head is impossible.
    pub fn reserve<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<usize, RingError> {
        if self.free(memory)? == 0 {
            return Err(RingError::Full);
        }
        Ok(self.shape.slot_offset(self.tail))
    }

    /// Publishes the slot last [`ProducerCursor::reserve`]d: the consumer may read it from now.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory; the slot is not published then.
    pub fn publish<M: SharedMemory + ?Sized>(&mut self, memory: &M) -> Result<(), OutOfBounds> {
        let tail = self.tail.wrapping_add(1);
        // Release: the slot's bytes written before this store must be visible before the
        // consumer can observe the new tail, or it would copy a half-written slot.
        memory.store_release(self.shape.offset + TAIL_OFFSET, tail)?;
        self.tail = tail;
        Ok(())
    }

    /// Whether the consumer asked for a doorbell. Call after [`ProducerCursor::publish`].
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn consumer_wants_doorbell<M: SharedMemory + ?Sized>(
        &self,
        memory: &M,
    ) -> Result<bool, OutOfBounds> {
        Ok(self.consumer_wake(memory)? != Wake::NONE)
    }

    /// What the consumer asked a doorbell for ([`Wake::NONE`]: nothing, it is awake). Call
    /// after [`ProducerCursor::publish`].
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn consumer_wake<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<Wake, OutOfBounds> {
        // Full fence: orders our tail store before the flag load below. Release and acquire
        // alone would let the load pass the store: we would read the flag down while the
        // consumer, having raised it, reads the old tail, and both would wait for ever. With
        // the fence here and the consumer's in `set_sleeping`, either it sees the new slot
        // before it sleeps or we see its flag.
        memory.fence();
        Ok(Wake(
            memory.load_acquire(self.shape.offset + SLEEPING_OFFSET)?,
        ))
    }
}

/// The consumer's end of a ring's indexes. Holds its own `head`; never reads it back.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConsumerCursor {
    shape: RingShape,
    head: u32,
}

impl ConsumerCursor {
    /// A consumer's cursor for the ring of `shape`, starting at index `head` (0 for a fresh
    /// ring).
    pub const fn new(shape: RingShape, head: u32) -> Self {
        Self { shape, head }
    }

    /// The ring's shape.
    pub const fn shape(&self) -> RingShape {
        self.shape
    }

    /// The index of the next slot this consumer will read.
    pub const fn head(&self) -> u32 {
        self.head
    }

    /// Slots published and not yet released.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's tail is more than a ring ahead of our head.
    pub fn available<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<u32, RingError> {
        // Acquire: pairs with the producer's release in `ProducerCursor::publish`, so every
        // slot below this tail is completely written before we read it.
        let tail = memory.load_acquire(self.shape.offset + TAIL_OFFSET)?;
        let filled = tail.wrapping_sub(self.head);
        if filled > self.shape.entries {
            return Err(RingError::Corrupt {
                head: self.head,
                tail,
            });
        }
        Ok(filled)
    }

    /// The offset of the next published slot, if any. Copy the slot out from there, then
    /// [`ConsumerCursor::release`] it; until then the producer will not overwrite it.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's tail is impossible; nothing may be read then
    /// (see [`ConsumerCursor::resynchronise`]).
    pub fn peek<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<Option<usize>, RingError> {
        if self.available(memory)? == 0 {
            return Ok(None);
        }
        Ok(Some(self.shape.slot_offset(self.head)))
    }

    /// Hands the slot last [`ConsumerCursor::peek`]ed back to the producer. Call only after its
    /// bytes have been copied out.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory; the slot stays ours then.
    pub fn release<M: SharedMemory + ?Sized>(&mut self, memory: &M) -> Result<(), OutOfBounds> {
        let head = self.head.wrapping_add(1);
        // Release: our copy out of the slot completes before the producer can observe the new
        // head, see the slot free and overwrite it under us.
        memory.store_release(self.shape.offset + HEAD_OFFSET, head)?;
        self.head = head;
        Ok(())
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
        let tail = memory.load_acquire(self.shape.offset + TAIL_OFFSET)?;
        // Release, as in `release`: nothing of the skipped slots is read after this store.
        memory.store_release(self.shape.offset + HEAD_OFFSET, tail)?;
        self.head = tail;
        Ok(tail)
    }

    /// Says whether this consumer is about to sleep and wants a doorbell on the next
    /// publication. After raising it, check [`ConsumerCursor::available`] once more before
    /// sleeping.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn set_sleeping<M: SharedMemory + ?Sized>(
        &self,
        memory: &M,
        sleeping: bool,
    ) -> Result<(), OutOfBounds> {
        self.set_wake(memory, if sleeping { Wake::ANY } else { Wake::NONE })
    }

    /// [`ConsumerCursor::set_sleeping`], saying what for: [`Wake::NONE`] when awake.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn set_wake<M: SharedMemory + ?Sized>(
        &self,
        memory: &M,
        wake: Wake,
    ) -> Result<(), OutOfBounds> {
        memory.store_release(self.shape.offset + SLEEPING_OFFSET, wake.0)?;
        // Full fence: orders the flag store before the tail load of the caller's last look at
        // the ring; it pairs with the producer's in `consumer_wants_doorbell` (see there), so a
        // slot published while we fall asleep is either seen by that look or rung for.
        memory.fence();
        Ok(())
    }
}
