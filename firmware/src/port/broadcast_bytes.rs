//! The bytes of a port's latest broadcasts (a broadcast is a barrier whose root supplies up to
//! [`BROADCAST_MAX`] bytes; see [`crate::barrier`]). They live in the port's slot, not in the
//! open port, because the port's packets that carry them outlive its barrier and its close.

use shared_abi::event::BROADCAST_MAX;
use shared_abi::ids::{BarrierId, Generation};

/// Broadcasts whose bytes a port slot keeps at once. A port's packets of a broadcast may be sent
/// again long after it completed (a lost one), while it runs broadcasts of other groups; and with a
/// schedule other than the tree rooted at the root, a member's peers may run ahead and send it
/// packets of broadcasts it has not started. The bytes of a broadcast stay while they are needed
/// ([`crate::Nic::broadcast_in_use`]): its barrier runs, a packet of it waits in a connection's
/// queue or sent list or to be sent again, or a packet of it waits in a record. A place is never
/// taken from bytes the port's own packets or running barrier need; bytes that arrive early give
/// way to those of the running barrier and to a root's, and bytes that find no place are dropped
/// (the packet is taken all the same: refusing it would hold up its connection). With the tree
/// rooted at the root no member receives the bytes before it runs the broadcast, so the only bytes
/// a place is held for are those of its packets not yet acknowledged: they go when the broadcast
/// ends or the ack of its last packet comes, whichever is later (`Nic::release_held`), so a place
/// is most often free when the next broadcast comes.
pub(crate) const BROADCASTS_KEPT: usize = 8;

/// One broadcast's bytes, as one port (incarnation `generation`) holds them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Broadcast {
    generation: Generation,
    barrier: BarrierId,
    /// When it was kept (a per-slot count): the oldest gives way first.
    stamp: u32,
    len: u8,
    bytes: [u8; BROADCAST_MAX],
}

impl Broadcast {
    /// The bytes.
    pub(crate) fn data(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

/// The bytes of a port's latest broadcasts, kept in its slot so that they outlive the barrier
/// and the port's close as its packets do.
#[derive(Debug, Default)]
pub(crate) struct BroadcastBytes {
    kept: [Option<Broadcast>; BROADCASTS_KEPT],
    next_stamp: u32,
}

impl BroadcastBytes {
    /// The bytes of `barrier` held by incarnation `generation`.
    pub(crate) fn get(&self, generation: Generation, barrier: BarrierId) -> Option<&Broadcast> {
        self.kept
            .iter()
            .flatten()
            .find(|b| b.generation == generation && b.barrier == barrier)
    }

    /// Forgets the bytes of `barrier` held by incarnation `generation`, if kept.
    pub(crate) fn forget(&mut self, generation: Generation, barrier: BarrierId) {
        for kept in &mut self.kept {
            if kept.is_some_and(|b| b.generation == generation && b.barrier == barrier) {
                *kept = None;
            }
        }
    }

    /// Where the bytes of broadcast `barrier` for incarnation `generation` may be kept: the
    /// place that holds them already, else a free one, else the oldest whose bytes nothing
    /// needs, else (`urgent`: the running barrier's bytes, or a root's) the oldest whose bytes
    /// only a record's early packets need. `in_use(generation, barrier, records)` says whether
    /// kept bytes are still needed (counting packets that wait in a record if `records`).
    pub(crate) fn place(
        &self,
        generation: Generation,
        barrier: BarrierId,
        urgent: bool,
        in_use: impl Fn(Generation, BarrierId, bool) -> bool,
    ) -> Option<usize> {
        if let Some(place) = self.kept.iter().position(|kept| {
            kept.is_some_and(|b| b.generation == generation && b.barrier == barrier)
        }) {
            return Some(place);
        }
        if let Some(place) = self.kept.iter().position(Option::is_none) {
            return Some(place);
        }
        let mut unused: Option<(u32, usize)> = None;
        let mut early: Option<(u32, usize)> = None;
        for (place, kept) in self.kept.iter().enumerate() {
            let Some(b) = kept else { continue };
            let age = self.next_stamp.wrapping_sub(b.stamp);
            let older = |than: Option<(u32, usize)>| than.is_none_or(|(a, _)| age > a);
            if !in_use(b.generation, b.barrier, true) {
                if older(unused) {
                    unused = Some((age, place));
                }
            } else if urgent && !in_use(b.generation, b.barrier, false) && older(early) {
                early = Some((age, place));
            }
        }
        unused.or(early).map(|(_, place)| place)
    }

    /// Puts the bytes of broadcast `barrier` (at most [`BROADCAST_MAX`] of `data`) for
    /// incarnation `generation` in `place`.
    pub(crate) fn keep(
        &mut self,
        place: usize,
        generation: Generation,
        barrier: BarrierId,
        data: &[u8],
    ) {
        let len = data.len().min(BROADCAST_MAX);
        let mut entry = Broadcast {
            generation,
            barrier,
            stamp: self.next_stamp,
            len: len as u8,
            bytes: [0; BROADCAST_MAX],
        };
        self.next_stamp = self.next_stamp.wrapping_add(1);
        if let (Some(to), Some(from)) = (entry.bytes.get_mut(..len), data.get(..len)) {
            to.copy_from_slice(from);
        }
        if let Some(kept) = self.kept.get_mut(place) {
            *kept = Some(entry);
        }
    }
}
