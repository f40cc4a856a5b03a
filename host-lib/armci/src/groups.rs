//! Process groups (ARMCI_Group_create and the rest) and the `armci_msg_*` collectives over them.
//!
//! A group is a list of ranks; group 0 is every rank. Its collectives run on the NIC's
//! collectives of the group's members: the barrier is the NIC's barrier of the group, a
//! broadcast is the NIC's broadcast of a short descriptor (where the root staged its bytes,
//! which is also a barrier) after which every member gets the bytes by RDMA from the root's
//! staging area and a NIC barrier lets the root reuse it; a reduction exchanges where each
//! member staged its vector, the group's first member gets them all by RDMA and combines them in
//! member order, and the others get its result — so every member ends with the same bits, as
//! floating-point sums must. No member's process serves another's get: its NIC does.
//!
//! Each group's messages carry its tag, so groups' collectives never take each other's: the
//! tag mixes the parent's, the count of groups the parent made before, and the members, which
//! every member of the parent computes alike (ARMCI_Group_create is collective over the
//! parent). Its NIC barriers run under the same number ([`nicbar::Group::with_id`]).

use nicbar::{Group, RemotePointer};

use crate::core::{Allocation, Armci, PIECE, message, read_u32, read_u64};
use crate::error::ArmciError;

/// The group of every rank.
pub const WORLD_GROUP: usize = 0;
/// The tag of the world group's messages (0 is the library's own collectives').
const WORLD_TAG: u32 = 1;

/// One process group as this rank knows it.
#[derive(Clone, Debug)]
pub(crate) struct GroupState {
    /// The members' ranks, by group rank.
    pub(crate) members: Vec<usize>,
    /// This rank's place in the group, if it is a member.
    pub(crate) me: Option<usize>,
    /// The members as the NIC's barrier knows them.
    pub(crate) nic: Group,
    /// The tag of its messages.
    pub(crate) tag: u32,
    /// Its collectives so far (each one's messages carry its number).
    pub(crate) sequence: u32,
    /// Groups made from it so far.
    pub(crate) children: u32,
}

/// The element type of a reduction (`armci_msg_igop`, `lgop`, `fgop`, `dgop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elements {
    /// `int`.
    Int,
    /// `long` (and `long long`).
    Long,
    /// `float`.
    Float,
    /// `double`.
    Double,
}

impl Elements {
    /// Bytes of one element.
    pub fn element_len(self) -> usize {
        match self {
            Self::Int | Self::Float => 4,
            Self::Long | Self::Double => 8,
        }
    }
}

/// A reduction's operation, by ARMCI's name of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// `"+"`.
    Sum,
    /// `"*"`.
    Product,
    /// `"max"`.
    Max,
    /// `"min"`.
    Min,
    /// `"absmax"`: the largest magnitude (the result is that magnitude).
    AbsMax,
    /// `"absmin"`: the smallest magnitude.
    AbsMin,
    /// `"or"`: bitwise, integers only.
    Or,
}

impl ReduceOp {
    /// The operation ARMCI names `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "+" => Self::Sum,
            "*" => Self::Product,
            "max" => Self::Max,
            "min" => Self::Min,
            "absmax" => Self::AbsMax,
            "absmin" => Self::AbsMin,
            "or" => Self::Or,
            _ => return None,
        })
    }
}

/// `into[i] = op(into[i], other[i])` over native-endian elements.
///
/// # Errors
/// [`ArmciError::Invalid`] for `or` on floating-point elements.
pub(crate) fn combine(
    elements: Elements,
    op: ReduceOp,
    into: &mut [u8],
    other: &[u8],
) -> Result<(), ArmciError> {
    macro_rules! each {
        ($t:ty, $n:literal, $f:expr) => {{
            for (a, b) in into.chunks_exact_mut($n).zip(other.chunks_exact($n)) {
                let (Ok(x), Ok(y)) = (<[u8; $n]>::try_from(&*a), <[u8; $n]>::try_from(b)) else {
                    continue;
                };
                let value: $t = $f(<$t>::from_ne_bytes(x), <$t>::from_ne_bytes(y));
                a.copy_from_slice(&value.to_ne_bytes());
            }
            Ok(())
        }};
    }
    macro_rules! integer {
        ($t:ty, $n:literal) => {
            match op {
                ReduceOp::Sum => each!($t, $n, |x: $t, y: $t| x.wrapping_add(y)),
                ReduceOp::Product => each!($t, $n, |x: $t, y: $t| x.wrapping_mul(y)),
                ReduceOp::Max => each!($t, $n, |x: $t, y: $t| x.max(y)),
                ReduceOp::Min => each!($t, $n, |x: $t, y: $t| x.min(y)),
                ReduceOp::AbsMax => {
                    each!($t, $n, |x: $t, y: $t| x
                        .wrapping_abs()
                        .max(y.wrapping_abs()))
                }
                ReduceOp::AbsMin => {
                    each!($t, $n, |x: $t, y: $t| x
                        .wrapping_abs()
                        .min(y.wrapping_abs()))
                }
                ReduceOp::Or => each!($t, $n, |x: $t, y: $t| x | y),
            }
        };
    }
    macro_rules! float {
        ($t:ty, $n:literal) => {
            match op {
                ReduceOp::Sum => each!($t, $n, |x: $t, y: $t| x + y),
                ReduceOp::Product => each!($t, $n, |x: $t, y: $t| x * y),
                ReduceOp::Max => each!($t, $n, |x: $t, y: $t| x.max(y)),
                ReduceOp::Min => each!($t, $n, |x: $t, y: $t| x.min(y)),
                ReduceOp::AbsMax => each!($t, $n, |x: $t, y: $t| x.abs().max(y.abs())),
                ReduceOp::AbsMin => each!($t, $n, |x: $t, y: $t| x.abs().min(y.abs())),
                ReduceOp::Or => Err(ArmciError::Invalid(
                    "\"or\" of floating-point elements".to_owned(),
                )),
            }
        };
    }
    match elements {
        Elements::Int => integer!(i32, 4),
        Elements::Long => integer!(i64, 8),
        Elements::Float => float!(f32, 4),
        Elements::Double => float!(f64, 8),
    }
}

/// A tag for a group made from the group tagged `parent`, its `child`-th, of `members`.
fn child_tag(parent: u32, child: u32, members: &[usize]) -> u32 {
    // FNV-1a over the three, then kept clear of 0 and the world's tag.
    let mut hash: u32 = 0x811c_9dc5;
    let mut mix = |word: u32| {
        for byte in word.to_le_bytes() {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    };
    mix(parent);
    mix(child);
    for &member in members {
        mix(member as u32);
    }
    if hash <= WORLD_TAG { hash + 2 } else { hash }
}

impl Armci {
    /// The world group's state: made once the peers are known.
    pub(crate) fn world_group_state(&self) -> GroupState {
        GroupState {
            members: (0..self.size()).collect(),
            me: Some(self.rank),
            nic: self.group.clone(),
            tag: WORLD_TAG,
            sequence: 0,
            children: 0,
        }
    }

    fn group_state(&self, id: usize) -> Result<&GroupState, ArmciError> {
        self.groups
            .get(id)
            .and_then(Option::as_ref)
            .ok_or_else(|| ArmciError::Invalid(format!("group {id} does not exist")))
    }

    /// The group `id` with this rank a member: (its members, this rank's place, its NIC group).
    fn membership(&self, id: usize) -> Result<(Vec<usize>, usize, Group), ArmciError> {
        let state = self.group_state(id)?;
        let me = state.me.ok_or_else(|| {
            ArmciError::Invalid(format!("rank {} is not a member of group {id}", self.rank))
        })?;
        Ok((state.members.clone(), me, state.nic.clone()))
    }

    /// ARMCI_Group_create: the group of the default group's members at `ranks` (group rank `i`
    /// is `ranks[i]` of the default group). Collective over the default group: every member
    /// calls it, members of the new group or not, in the same order. Returns its id.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for a rank outside the default group, a rank given twice, or no
    /// ranks.
    pub fn group_create(&mut self, ranks: &[usize]) -> Result<usize, ArmciError> {
        let parent_id = self.default_group;
        let parent = self.group_state(parent_id)?;
        let members = ranks
            .iter()
            .map(|&r| {
                parent.members.get(r).copied().ok_or_else(|| {
                    ArmciError::Invalid(format!(
                        "rank {r} is not in the default group of {} ranks",
                        parent.members.len()
                    ))
                })
            })
            .collect::<Result<Vec<usize>, _>>()?;
        let tag = child_tag(parent.tag, parent.children, &members);
        let nic = self
            .group
            .subgroup(&members)
            .map_err(|e| ArmciError::Invalid(format!("the group's ranks: {e}")))?
            .with_id(tag);
        let me = members.iter().position(|&m| m == self.rank);
        if let Some(Some(parent)) = self.groups.get_mut(parent_id) {
            parent.children = parent.children.wrapping_add(1);
        }
        let state = GroupState {
            members,
            me,
            nic,
            tag,
            sequence: 0,
            children: 0,
        };
        let id = match self.groups.iter().position(Option::is_none) {
            Some(free) => {
                self.groups[free] = Some(state);
                free
            }
            None => {
                self.groups.push(Some(state));
                self.groups.len() - 1
            }
        };
        Ok(id)
    }

    /// ARMCI_Group_free: forgets group `id` here (the default group becomes the world's if it
    /// was this one). The world group stays.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for no such group.
    pub fn group_free(&mut self, id: usize) -> Result<(), ArmciError> {
        self.group_state(id)?;
        if id != WORLD_GROUP {
            self.groups[id] = None;
            if self.default_group == id {
                self.default_group = WORLD_GROUP;
            }
        }
        Ok(())
    }

    /// The default group (ARMCI_Group_get_default): ARMCI_Malloc's and ARMCI_Group_create's.
    pub fn default_group(&self) -> usize {
        self.default_group
    }

    /// ARMCI_Group_set_default.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for no such group, or one this rank is not in.
    pub fn set_default_group(&mut self, id: usize) -> Result<(), ArmciError> {
        self.membership(id)?;
        self.default_group = id;
        Ok(())
    }

    /// This rank's place in group `id` (None if not a member), and the group's size.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for no such group.
    pub fn group_rank_and_size(&self, id: usize) -> Result<(Option<usize>, usize), ArmciError> {
        let state = self.group_state(id)?;
        Ok((state.me, state.members.len()))
    }

    /// ARMCI_Absolute_id: the rank of group `id`'s member `group_rank`.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for no such group or member.
    pub fn absolute_rank(&self, id: usize, group_rank: usize) -> Result<usize, ArmciError> {
        let state = self.group_state(id)?;
        state
            .members
            .get(group_rank)
            .copied()
            .ok_or_else(|| ArmciError::Invalid(format!("group {id} has no member {group_rank}")))
    }

    /// Sends `entry` to every other member of group `id` and returns every member's, by group
    /// rank. Collective over the group.
    fn exchange_in(&mut self, id: usize, entry: &[u8]) -> Result<Vec<Vec<u8>>, ArmciError> {
        let (members, me, _) = self.membership(id)?;
        let Some(Some(state)) = self.groups.get_mut(id) else {
            return Err(ArmciError::Invalid(format!("group {id} does not exist")));
        };
        state.sequence = state.sequence.wrapping_add(1);
        let (tag, sequence) = (state.tag, state.sequence);
        let size = members.len();
        for step in 1..size {
            let to = members[(me + step) % size];
            self.send_message_in(tag, to, message::GROUP_EXCHANGE, sequence, 0, entry)?;
        }
        let mut entries = Vec::with_capacity(size);
        for (place, &from) in members.iter().enumerate() {
            if place == me {
                entries.push(entry.to_vec());
            } else {
                entries.push(self.take_message_in(
                    tag,
                    message::GROUP_EXCHANGE,
                    sequence,
                    0,
                    from,
                    "a group exchange",
                )?);
            }
        }
        Ok(entries)
    }

    /// ARMCI_Malloc_group: as [`Armci::malloc`] over group `id`'s members; returns each
    /// member's base address by group rank. Collective over the group.
    ///
    /// # Errors
    /// As [`Armci::malloc`]; [`ArmciError::Invalid`] if this rank is not a member.
    pub fn malloc_group(&mut self, id: usize, bytes: usize) -> Result<Vec<u64>, ArmciError> {
        if id == WORLD_GROUP {
            return self.malloc(bytes);
        }
        let (members, _, _) = self.membership(id)?;
        let len = bytes.div_ceil(8) * 8;
        let local = if len == 0 {
            None
        } else {
            Some(self.port.register_memory(len)?)
        };
        let (base, key) = local
            .as_ref()
            .map_or((0, 0), |r| (r.bytes().as_ptr() as u64, r.key()));
        let mut entry = Vec::with_capacity(20);
        entry.extend_from_slice(&base.to_le_bytes());
        entry.extend_from_slice(&(len as u64).to_le_bytes());
        entry.extend_from_slice(&key.to_le_bytes());
        let entries = match self.exchange_in(id, &entry) {
            Ok(entries) => entries,
            Err(error) => {
                if let Some(region) = &local {
                    let _ = self.port.deregister_memory(region);
                }
                return Err(error);
            }
        };
        let size = self.size();
        let mut allocation = Allocation {
            local,
            bases: vec![0; size],
            lens: vec![0; size],
            keys: vec![0; size],
        };
        let mut by_group_rank = Vec::with_capacity(members.len());
        for (entry, &member) in entries.iter().zip(&members) {
            match (read_u64(entry, 0), read_u64(entry, 8), read_u32(entry, 16)) {
                (Some(base), Some(len), Some(key)) => {
                    allocation.bases[member] = base;
                    allocation.lens[member] = len;
                    allocation.keys[member] = key;
                    by_group_rank.push(base);
                }
                _ => return Err(ArmciError::Protocol("a short malloc entry".to_owned())),
            }
        }
        self.allocations.push(allocation);
        Ok(by_group_rank)
    }

    /// ARMCI_Free_group: frees the allocation whose base here is `base`, made over group `id`;
    /// every put from every member to it lands first. Collective over the group.
    ///
    /// # Errors
    /// As [`Armci::free`].
    pub fn free_group(&mut self, id: usize, base: u64) -> Result<(), ArmciError> {
        if id == WORLD_GROUP {
            return self.free(base);
        }
        let (_, _, nic) = self.membership(id)?;
        let index = self
            .allocations
            .iter()
            .position(|a| a.bases[self.rank] == base)
            .ok_or_else(|| {
                ArmciError::Invalid(format!(
                    "{base:#x} is not an ARMCI_Malloc_group base of this rank"
                ))
            })?;
        self.all_fence()?;
        self.port.barrier(&nic)?;
        let allocation = self.allocations.remove(index);
        if let Some(region) = &allocation.local {
            self.port.deregister_memory(region)?;
        }
        Ok(())
    }

    /// `armci_msg_barrier` / `armci_msg_group_barrier`: the NIC's barrier of group `id` (no
    /// fence: ARMCI_Barrier is the one that also completes the puts).
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] if this rank is not a member; the barrier failing.
    pub fn group_barrier(&mut self, id: usize) -> Result<(), ArmciError> {
        let (_, _, nic) = self.membership(id)?;
        self.port.barrier(&nic)?;
        Ok(())
    }

    /// `armci_msg_brdcst`: `data` of the member at group rank `root` into every member's
    /// `data` (every member passes the same length). Collective over group `id`.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for a root outside the group or lengths that differ; the NIC's
    /// collectives or gets failing.
    pub fn broadcast(&mut self, id: usize, root: usize, data: &mut [u8]) -> Result<(), ArmciError> {
        let (members, me, nic) = self.membership(id)?;
        if root >= members.len() {
            return Err(ArmciError::Invalid(format!(
                "root {root} of a group of {}",
                members.len()
            )));
        }
        if members.len() == 1 {
            return Ok(());
        }
        let key = self.staging.region.key();
        for (index, chunk) in data.chunks_mut(PIECE).enumerate() {
            let len = chunk.len();
            let lease = if me == root {
                let start = self.lease(len)?;
                self.staging.region.bytes().write(start, chunk);
                Some(start)
            } else {
                None
            };
            let result = self.broadcast_chunk(&nic, members[root], root, key, lease, chunk, index);
            if let Some(start) = lease {
                self.staging.give_back(start);
            }
            result?;
        }
        Ok(())
    }

    /// One chunk of [`Armci::broadcast`]: the root's descriptor by the NIC's broadcast, the
    /// bytes by RDMA get, a NIC barrier before the root reuses its staging bytes.
    #[allow(
        clippy::too_many_arguments,
        reason = "the chunk's place in its broadcast"
    )]
    fn broadcast_chunk(
        &mut self,
        nic: &Group,
        root_rank: usize,
        root: usize,
        key: u32,
        lease: Option<usize>,
        chunk: &mut [u8],
        index: usize,
    ) -> Result<(), ArmciError> {
        let mut descriptor = [0u8; 12];
        if let Some(start) = lease {
            descriptor[0..4].copy_from_slice(&key.to_le_bytes());
            descriptor[4..8].copy_from_slice(&(start as u32).to_le_bytes());
            descriptor[8..12].copy_from_slice(&(chunk.len() as u32).to_le_bytes());
        }
        self.port.nic_broadcast(nic, root, &mut descriptor)?;
        if lease.is_none() {
            let (Some(key), Some(start), Some(len)) = (
                read_u32(&descriptor, 0),
                read_u32(&descriptor, 4),
                read_u32(&descriptor, 8),
            ) else {
                return Err(ArmciError::Protocol(
                    "a short broadcast descriptor".to_owned(),
                ));
            };
            if len as usize != chunk.len() {
                return Err(ArmciError::Invalid(format!(
                    "chunk {index} of a broadcast: the root sends {len} bytes, this rank takes {}",
                    chunk.len()
                )));
            }
            let remote = RemotePointer { key, offset: start }.to_u64();
            self.get_remote(remote, chunk, root_rank)?;
        }
        // The root's staging bytes are read by every member past this barrier.
        self.port.barrier(nic)?;
        Ok(())
    }

    /// `armci_msg_igop` and the rest: `data[i] = op` over every member's `data[i]` (every member
    /// passes the same length), in every member alike. Collective over group `id`.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for a length that is not whole elements or `or` of floats; the
    /// exchange, the gets or the NIC's barriers failing.
    pub fn reduce_all(
        &mut self,
        id: usize,
        elements: Elements,
        op: ReduceOp,
        data: &mut [u8],
    ) -> Result<(), ArmciError> {
        if data.len() % elements.element_len() != 0 {
            return Err(ArmciError::Invalid(format!(
                "{} bytes are not whole elements of {elements:?}",
                data.len()
            )));
        }
        combine(elements, op, &mut [], &[])?;
        let (members, me, nic) = self.membership(id)?;
        if members.len() == 1 {
            return Ok(());
        }
        let key = self.staging.region.key();
        // PIECE is a multiple of every element's length, so no element straddles two chunks.
        for chunk in data.chunks_mut(PIECE) {
            let start = self.lease(chunk.len())?;
            self.staging.region.bytes().write(start, chunk);
            let result = self.reduce_chunk(id, &members, me, &nic, key, start, elements, op, chunk);
            self.staging.give_back(start);
            result?;
        }
        Ok(())
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the chunk's place in its reduction"
    )]
    fn reduce_chunk(
        &mut self,
        id: usize,
        members: &[usize],
        me: usize,
        nic: &Group,
        key: u32,
        start: usize,
        elements: Elements,
        op: ReduceOp,
        chunk: &mut [u8],
    ) -> Result<(), ArmciError> {
        let mut entry = [0u8; 8];
        entry[0..4].copy_from_slice(&key.to_le_bytes());
        entry[4..8].copy_from_slice(&(start as u32).to_le_bytes());
        let entries = self.exchange_in(id, &entry)?;
        let place = |entry: &[u8]| -> Result<u64, ArmciError> {
            match (read_u32(entry, 0), read_u32(entry, 4)) {
                (Some(key), Some(offset)) => Ok(RemotePointer { key, offset }.to_u64()),
                _ => Err(ArmciError::Protocol("a short reduction entry".to_owned())),
            }
        };
        if me == 0 {
            let mut theirs = vec![0u8; chunk.len()];
            for (entry, &member) in entries.iter().zip(members).skip(1) {
                self.get_remote(place(entry)?, &mut theirs, member)?;
                combine(elements, op, chunk, &theirs)?;
            }
            self.staging.region.bytes().write(start, chunk);
        }
        // The first member's result is staged past this barrier.
        self.port.barrier(nic)?;
        if me != 0 {
            self.get_remote(place(&entries[0])?, chunk, members[0])?;
        }
        // Every member has read the first member's bytes past this one.
        self.port.barrier(nic)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doubles(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn each_operation_combines_elementwise() {
        let mut a = doubles(&[1.5, -4.0, 2.0]);
        combine(
            Elements::Double,
            ReduceOp::Sum,
            &mut a,
            &doubles(&[1.0, 1.0, -3.0]),
        )
        .unwrap();
        assert_eq!(a, doubles(&[2.5, -3.0, -1.0]));
        combine(
            Elements::Double,
            ReduceOp::AbsMax,
            &mut a,
            &doubles(&[-7.0, 0.0, 0.5]),
        )
        .unwrap();
        assert_eq!(a, doubles(&[7.0, 3.0, 1.0]));
        let ints = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
        let mut i = ints(&[3, -9, 6]);
        combine(Elements::Int, ReduceOp::Min, &mut i, &ints(&[4, -10, 6])).unwrap();
        assert_eq!(i, ints(&[3, -10, 6]));
        combine(Elements::Int, ReduceOp::Or, &mut i, &ints(&[4, 0, 1])).unwrap();
        assert_eq!(i, ints(&[7, -10, 7]));
        combine(Elements::Int, ReduceOp::Product, &mut i, &ints(&[2, 2, 2])).unwrap();
        assert_eq!(i, ints(&[14, -20, 14]));
        assert!(combine(Elements::Float, ReduceOp::Or, &mut [], &[]).is_err());
        assert_eq!(ReduceOp::from_name("absmin"), Some(ReduceOp::AbsMin));
        assert_eq!(ReduceOp::from_name("sum"), None);
    }

    #[test]
    fn child_tags_differ_by_parent_order_and_members_and_avoid_the_reserved_ones() {
        let a = child_tag(WORLD_TAG, 0, &[0, 1]);
        assert_ne!(a, child_tag(WORLD_TAG, 1, &[0, 1]));
        assert_ne!(a, child_tag(WORLD_TAG, 0, &[1, 0]));
        assert_ne!(a, child_tag(a, 0, &[0, 1]));
        assert!(a > WORLD_TAG);
    }
}
