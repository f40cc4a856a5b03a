//! The MPI level of the collectives (CollGM §3.4): broadcast, scatter, gather and all-to-all
//! over contiguous bytes, each in the algorithms CollGM measured, and the choice among them by
//! communicator and message size when the caller forces none.
//!
//! Every rank of a communicator calls the same operation with matching sizes, as MPI requires,
//! so every choice made here from sizes alone is the same on every rank. A message of no bytes
//! is never sent: its sender and its receiver both know its length is zero.

use std::sync::Arc;

use super::map::{self, Choice, CollMap, Collective};
use super::{CollError, Op};
use crate::coll::transfer::SEGMENT_PAYLOAD;

/// Broadcast algorithms (`coll_nicbar_bcast_algorithm`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Bcast {
    /// The root sends to every rank.
    Linear,
    /// A binomial tree, the message whole.
    Binomial,
    /// A binary tree, the message in segments forwarded as they arrive.
    Binary,
    /// Each half of the message down one half of a binary tree, then exchanged in pairs.
    SplitBinary,
    /// A chain, the message in segments forwarded as they arrive.
    Pipeline,
    /// Up to [`nicbar_rs::NIC_BROADCAST_MAX`] bytes carried by the NIC's barrier engine: a
    /// gather-broadcast tree whose down-phase packets carry the bytes, no host on the path.
    /// Longer messages take [`Bcast::default_for`]'s algorithm.
    Nic,
}

impl Bcast {
    /// The algorithm numbered `id` (0: chosen by the process's selection map, else by size).
    pub(crate) fn from_id(id: i32, size: usize, bytes: usize) -> Option<Self> {
        Some(match id {
            0 => Self::chosen(map::current().map.as_ref(), size, bytes),
            1 => Self::Linear,
            2 => Self::Binomial,
            3 => Self::Binary,
            4 => Self::SplitBinary,
            5 => Self::Pipeline,
            6 => Self::Nic,
            _ => return None,
        })
    }

    /// The choice of `map` for `size` ranks and `bytes`, or [`Bcast::default_for`] where it has
    /// none (or names the NIC's broadcast for more bytes than it carries).
    pub(crate) fn chosen(map: Option<&CollMap>, size: usize, bytes: usize) -> Self {
        match map.and_then(|m| m.choose(Collective::Bcast, size, bytes)) {
            Some(Choice::Bcast(Self::Nic)) if bytes > nicbar_rs::NIC_BROADCAST_MAX => {
                Self::default_for(size, bytes)
            }
            Some(Choice::Bcast(algorithm)) => algorithm,
            _ => Self::default_for(size, bytes),
        }
    }

    /// The choice without a measured map. CollGM's Figure 9 (Myrinet) takes binomial for small
    /// messages, split-binary for middle ones and the pipeline for large ones; on the emulated
    /// NIC, where one thread runs every NIC of the host, each host hop costs more than the
    /// bytes, and binomial measured fastest at every size at 8 and 16 processes (forced with
    /// `coll_nicbar_bcast_algorithm` under `coll_bench`: at 16 processes and 1 MiB 122 ms
    /// binomial, 126 split-binary, 145 pipeline, 164 linear).
    pub(crate) fn default_for(size: usize, bytes: usize) -> Self {
        let _ = bytes;
        if size <= 2 {
            Self::Linear
        } else {
            Self::Binomial
        }
    }
}

/// Scatter and gather algorithms (`coll_nicbar_scatter_algorithm`, `..._gather_...`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Tree {
    /// The root talks to every rank.
    Flat,
    /// A binomial tree whose inner ranks carry their subtree's blocks.
    Binomial,
}

impl Tree {
    /// The algorithm numbered `id` of `collective` (scatter or gather) on `size` ranks (0:
    /// chosen by the process's selection map, else by size).
    pub(crate) fn from_id(
        id: i32,
        collective: Collective,
        size: usize,
        block: usize,
    ) -> Option<Self> {
        Some(match id {
            0 => Self::chosen(map::current().map.as_ref(), collective, size, block),
            1 => Self::Flat,
            2 => Self::Binomial,
            _ => return None,
        })
    }

    /// The choice of `map` for `collective` on `size` ranks and `block` bytes per rank, or
    /// [`Tree::default_for`] where it has none.
    pub(crate) fn chosen(
        map: Option<&CollMap>,
        collective: Collective,
        size: usize,
        block: usize,
    ) -> Self {
        match map.and_then(|m| m.choose(collective, size, block)) {
            Some(Choice::Tree(algorithm)) => algorithm,
            _ => Self::default_for(block),
        }
    }

    /// The choice without a measured map. CollGM's Figure 11 takes binomial below 1 KiB per
    /// rank; on the emulated NIC flat measured faster at every size from 8 B on at 8 and 16
    /// processes (at 16 and 8 B: scatter 269 µs flat, 767 binomial; gather 1.29 ms, 2.43).
    pub(crate) fn default_for(block: usize) -> Self {
        let _ = block;
        Self::Flat
    }
}

/// All-to-all algorithms (`coll_nicbar_alltoall_algorithm`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Alltoall {
    /// Every rank sends to every other at once.
    Linear,
    /// Step k exchanges with ranks ± k.
    Pairwise,
    /// Bruck's log2(P) rounds of combined blocks.
    Bruck,
}

impl Alltoall {
    /// The algorithm numbered `id` (0: chosen by the process's selection map, else by size).
    pub(crate) fn from_id(id: i32, size: usize, block: usize) -> Option<Self> {
        Some(match id {
            0 => Self::chosen(map::current().map.as_ref(), size, block),
            1 => Self::Linear,
            2 => Self::Pairwise,
            3 => Self::Bruck,
            _ => return None,
        })
    }

    /// The choice of `map` for `size` ranks and `block` bytes per pair, or
    /// [`Alltoall::default_for`] where it has none.
    pub(crate) fn chosen(map: Option<&CollMap>, size: usize, block: usize) -> Self {
        match map.and_then(|m| m.choose(Collective::Alltoall, size, block)) {
            Some(Choice::Alltoall(algorithm)) => algorithm,
            _ => Self::default_for(size, block),
        }
    }

    /// The choice without a measured map. CollGM's Figure 7 takes Bruck for small blocks; on
    /// the emulated NIC at 8 processes all at once measured fastest up to 4 KiB (8 B: 1.44 ms
    /// linear, 1.81 Bruck, 4.13 pairwise) and pairwise from 64 KiB (21.2 ms, 23.7 linear), which
    /// also keeps only one block per peer in flight.
    pub(crate) fn default_for(size: usize, block: usize) -> Self {
        let _ = size;
        if block <= 32 * 1024 {
            Self::Linear
        } else {
            Self::Pairwise
        }
    }
}

/// The part numbers of an operation's phases (segments count up from each).
const PHASE: u32 = 1 << 24;

/// A shared copy of `bytes`, to send to one or more ranks.
fn shared(bytes: &[u8]) -> Arc<[u8]> {
    Arc::from(bytes)
}

/// The rank `vrank` places from `root` (ranks renumbered so that the root is 0).
fn real(vrank: usize, root: usize, size: usize) -> usize {
    (vrank + root) % size
}

/// The segments of `length` bytes of `segment` bytes each (at least one segment; a multiple of
/// a packet's payload, so that no segment ends in a short packet but the last).
fn pieces(length: usize, segment: usize) -> Vec<(usize, usize)> {
    let segment = segment.max(SEGMENT_PAYLOAD).div_ceil(SEGMENT_PAYLOAD) * SEGMENT_PAYLOAD;
    (0..length.div_ceil(segment).max(1))
        .map(|index| {
            let offset = index * segment;
            (offset, (length - offset).min(segment))
        })
        .collect()
}

/// The binomial tree's parent of `vrank` (none for 0) and its children, nearest first.
fn binomial(vrank: usize, size: usize) -> (Option<usize>, Vec<usize>) {
    let mut mask = 1;
    let mut parent = None;
    while mask < size {
        if vrank & mask != 0 {
            parent = Some(vrank - mask);
            break;
        }
        mask <<= 1;
    }
    let mut children = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if vrank + mask < size {
            children.push(vrank + mask);
        }
        mask >>= 1;
    }
    (parent, children)
}

/// How many vranks the binomial subtree of `vrank` spans (from `vrank` on).
fn binomial_span(vrank: usize, size: usize) -> usize {
    let low = if vrank == 0 {
        size
    } else {
        vrank & vrank.wrapping_neg()
    };
    low.min(size - vrank)
}

/// MPI_Bcast of `buffer` from `root`.
///
/// # Errors
/// As [`Op::receive`] and [`Op::finish`].
pub(crate) fn bcast(
    mut op: Op<'_>,
    buffer: &mut [u8],
    root: usize,
    algorithm: Bcast,
    segment: usize,
) -> Result<(), CollError> {
    let size = op.size();
    if root >= size {
        return Err(CollError::Argument(format!(
            "root {root} is not a rank of a communicator of {size}"
        )));
    }
    if size == 1 || buffer.is_empty() {
        return op.finish();
    }
    let vrank = (op.rank() + size - root) % size;
    match algorithm {
        Bcast::Linear => {
            if vrank == 0 {
                let data = shared(buffer);
                for v in 1..size {
                    op.send(real(v, root, size), 0, data.clone());
                }
            } else {
                let data = op.receive(root, 0, buffer.len())?;
                buffer.copy_from_slice(&data);
            }
        }
        Bcast::Binomial => {
            let (parent, children) = binomial(vrank, size);
            let children: Vec<usize> = children.iter().map(|&c| real(c, root, size)).collect();
            match parent {
                Some(parent) => {
                    let from = real(parent, root, size);
                    let forwarded = op.forward(from, 0, &children);
                    let data = op.receive_forwarded(from, 0, buffer.len(), &children, forwarded)?;
                    buffer.copy_from_slice(&data);
                }
                None => {
                    let data = shared(buffer);
                    for child in children {
                        op.send(child, 0, data.clone());
                    }
                }
            }
        }
        Bcast::Binary => {
            let parent = (vrank > 0).then(|| (vrank - 1) / 2);
            let children: Vec<usize> = [2 * vrank + 1, 2 * vrank + 2]
                .into_iter()
                .filter(|&c| c < size)
                .collect();
            tree_segments(&mut op, buffer, root, parent, &children, 0, segment)?;
        }
        Bcast::Pipeline => {
            let parent = vrank.checked_sub(1);
            let children: Vec<usize> = (vrank + 1 < size)
                .then_some(vrank + 1)
                .into_iter()
                .collect();
            tree_segments(&mut op, buffer, root, parent, &children, 0, segment)?;
        }
        Bcast::SplitBinary if size < 3 => {
            return bcast(op, buffer, root, Bcast::Linear, segment);
        }
        Bcast::SplitBinary => split_binary(&mut op, buffer, root, vrank, segment)?,
        Bcast::Nic if buffer.len() > nicbar_rs::NIC_BROADCAST_MAX => {
            let fallback = Bcast::default_for(size, buffer.len());
            return bcast(op, buffer, root, fallback, segment);
        }
        Bcast::Nic => return op.nic_broadcast(root, buffer),
    }
    op.finish()
}

/// The segments of `buffer` down a tree: each from `parent` (a vrank; none at the root), each
/// forwarded to `children` as soon as it is here. Parts from `first_part` on.
fn tree_segments(
    op: &mut Op<'_>,
    buffer: &mut [u8],
    root: usize,
    parent: Option<usize>,
    children: &[usize],
    first_part: u32,
    segment: usize,
) -> Result<(), CollError> {
    let size = op.size();
    let children: Vec<usize> = children.iter().map(|&c| real(c, root, size)).collect();
    let pieces = pieces(buffer.len(), segment);
    // Every piece is forwarded as its segments arrive, whichever piece this rank waits for.
    let forwarded: Vec<bool> = match parent {
        Some(parent) => (0..pieces.len())
            .map(|index| {
                op.forward(
                    real(parent, root, size),
                    first_part + index as u32,
                    &children,
                )
            })
            .collect(),
        None => Vec::new(),
    };
    for (index, (offset, length)) in pieces.into_iter().enumerate() {
        let part = first_part + index as u32;
        let piece = &mut buffer[offset..offset + length];
        match parent {
            Some(parent) => {
                let from = real(parent, root, size);
                let forwarded = forwarded.get(index).copied().unwrap_or(false);
                let data = op.receive_forwarded(from, part, length, &children, forwarded)?;
                piece.copy_from_slice(&data);
            }
            None => {
                let data = shared(piece);
                for &child in &children {
                    op.send(child, part, data.clone());
                }
            }
        }
    }
    Ok(())
}

/// The split binary tree: half A down the subtree of vrank 1, half B down that of vrank 2
/// (segmented binary trees both), then each rank of one subtree swaps halves with its partner
/// in the other; ranks without a partner get their missing half from the root.
fn split_binary(
    op: &mut Op<'_>,
    buffer: &mut [u8],
    root: usize,
    vrank: usize,
    segment: usize,
) -> Result<(), CollError> {
    let size = op.size();
    let half = buffer.len().div_ceil(2);
    let side = |mut v: usize| {
        while v > 2 {
            v = (v - 1) / 2;
        }
        v
    };
    let left: Vec<usize> = (1..size).filter(|&v| side(v) == 1).collect();
    let right: Vec<usize> = (1..size).filter(|&v| side(v) == 2).collect();
    let length = buffer.len();
    let range = |s: usize| if s == 1 { 0..half } else { half..length };
    let children = |v: usize| -> Vec<usize> {
        [2 * v + 1, 2 * v + 2]
            .into_iter()
            .filter(|&c| c < size)
            .collect()
    };
    let exchange = PHASE;
    let direct = 2 * PHASE;
    if vrank == 0 {
        for s in [1, 2] {
            let r = range(s);
            if !r.is_empty() {
                tree_segments(op, &mut buffer[r], root, None, &[s], 0, segment)?;
            }
        }
        // Ranks of the larger side without a partner get the other half from here.
        let pairs = left.len().min(right.len());
        for &v in left.iter().skip(pairs) {
            let r = range(2);
            if !r.is_empty() {
                op.send(real(v, root, size), direct, shared(&buffer[r]));
            }
        }
        for &v in right.iter().skip(pairs) {
            let r = range(1);
            if !r.is_empty() {
                op.send(real(v, root, size), direct, shared(&buffer[r]));
            }
        }
        return Ok(());
    }
    let mine = side(vrank);
    let parent = (vrank - 1) / 2;
    let own = range(mine);
    if !own.is_empty() {
        let kids = children(vrank);
        tree_segments(
            op,
            &mut buffer[own.clone()],
            root,
            Some(parent),
            &kids,
            0,
            segment,
        )?;
    }
    let (ours, theirs) = if mine == 1 {
        (&left, &right)
    } else {
        (&right, &left)
    };
    let index = ours.iter().position(|&v| v == vrank).unwrap_or(0);
    let other = range(3 - mine);
    let (source, part) = match theirs.get(index) {
        Some(&partner) => {
            if !own.is_empty() {
                op.send(
                    real(partner, root, size),
                    exchange,
                    shared(&buffer[own.clone()]),
                );
            }
            (partner, exchange)
        }
        None => (0, direct),
    };
    if !other.is_empty() {
        let data = op.receive(real(source, root, size), part, other.len())?;
        buffer[other].copy_from_slice(&data);
    }
    Ok(())
}

/// MPI_Scatter of `block` bytes per rank from `root`: `send` (the root's, every rank's block
/// in rank order) to `receive` (none at the root for MPI_IN_PLACE).
///
/// # Errors
/// As [`Op::receive`] and [`Op::finish`]; [`CollError::Argument`] for buffers of other lengths.
pub(crate) fn scatter(
    mut op: Op<'_>,
    send: Option<&[u8]>,
    mut receive: Option<&mut [u8]>,
    block: usize,
    root: usize,
    algorithm: Tree,
) -> Result<(), CollError> {
    let (size, rank) = (op.size(), op.rank());
    check_root(root, size)?;
    if receive.as_ref().is_some_and(|r| r.len() != block) {
        return Err(CollError::Argument(
            "the receive buffer is not one block".into(),
        ));
    }
    let send = if rank == root {
        let send = send.ok_or_else(|| CollError::Argument("the root has no send buffer".into()))?;
        if send.len() != block * size {
            return Err(CollError::Argument(
                "the send buffer is not one block per rank".into(),
            ));
        }
        Some(send)
    } else if receive.is_none() {
        return Err(CollError::Argument(
            "only the root may receive in place".into(),
        ));
    } else {
        None
    };
    if block == 0 || size == 1 {
        if let (Some(send), Some(receive)) = (send, receive.as_deref_mut()) {
            receive.copy_from_slice(&send[rank * block..(rank + 1) * block]);
        }
        return op.finish();
    }
    match algorithm {
        Tree::Flat => {
            if let Some(send) = send {
                for v in 1..size {
                    let to = real(v, root, size);
                    op.send(to, 0, shared(&send[to * block..(to + 1) * block]));
                }
                if let Some(receive) = receive {
                    receive.copy_from_slice(&send[rank * block..(rank + 1) * block]);
                }
            } else if let Some(receive) = receive {
                let data = op.receive(root, 0, block)?;
                receive.copy_from_slice(&data);
            }
        }
        Tree::Binomial => {
            let vrank = (rank + size - root) % size;
            let span = binomial_span(vrank, size);
            let (parent, children) = binomial(vrank, size);
            // The blocks of vranks [vrank, vrank + span), in vrank order.
            let held: Vec<u8> = match parent {
                Some(parent) => op.receive(real(parent, root, size), 0, span * block)?,
                // The root: its send buffer (checked above), in vrank order.
                None => {
                    let send = send.unwrap_or_default();
                    (0..size)
                        .flat_map(|v| {
                            let r = real(v, root, size);
                            send[r * block..(r + 1) * block].iter().copied()
                        })
                        .collect()
                }
            };
            for child in children {
                let count = binomial_span(child, size);
                let start = (child - vrank) * block;
                op.send(
                    real(child, root, size),
                    0,
                    shared(&held[start..start + count * block]),
                );
            }
            if let Some(receive) = receive {
                receive.copy_from_slice(&held[..block]);
            }
        }
    }
    op.finish()
}

fn check_root(root: usize, size: usize) -> Result<(), CollError> {
    if root >= size {
        return Err(CollError::Argument(format!(
            "root {root} is not a rank of a communicator of {size}"
        )));
    }
    Ok(())
}

/// MPI_Gather of `block` bytes per rank to `root`: `send` (none at the root for MPI_IN_PLACE,
/// its block then already in place) into `receive` (the root's, every rank's block in rank
/// order).
///
/// # Errors
/// As [`scatter`].
pub(crate) fn gather(
    mut op: Op<'_>,
    send: Option<&[u8]>,
    receive: Option<&mut [u8]>,
    block: usize,
    root: usize,
    algorithm: Tree,
) -> Result<(), CollError> {
    let (size, rank) = (op.size(), op.rank());
    check_root(root, size)?;
    if send.is_some_and(|s| s.len() != block) {
        return Err(CollError::Argument(
            "the send buffer is not one block".into(),
        ));
    }
    let receive = if rank == root {
        let receive =
            receive.ok_or_else(|| CollError::Argument("the root has no receive buffer".into()))?;
        if receive.len() != block * size {
            return Err(CollError::Argument(
                "the receive buffer is not one block per rank".into(),
            ));
        }
        Some(receive)
    } else if send.is_none() {
        return Err(CollError::Argument(
            "only the root may send in place".into(),
        ));
    } else {
        None
    };
    if block == 0 || size == 1 {
        if let (Some(send), Some(receive)) = (send, receive) {
            receive[rank * block..(rank + 1) * block].copy_from_slice(send);
        }
        return op.finish();
    }
    match algorithm {
        Tree::Flat => {
            if let Some(receive) = receive {
                if let Some(send) = send {
                    receive[rank * block..(rank + 1) * block].copy_from_slice(send);
                }
                for v in 1..size {
                    let from = real(v, root, size);
                    let data = op.receive(from, 0, block)?;
                    receive[from * block..(from + 1) * block].copy_from_slice(&data);
                }
            } else if let Some(send) = send {
                op.send(root, 0, shared(send));
            }
        }
        Tree::Binomial => {
            let vrank = (rank + size - root) % size;
            let span = binomial_span(vrank, size);
            let (parent, children) = binomial(vrank, size);
            let mut held = vec![0u8; span * block];
            match (send, &receive) {
                (Some(send), _) => held[..block].copy_from_slice(send),
                (None, Some(receive)) => {
                    held[..block].copy_from_slice(&receive[rank * block..(rank + 1) * block]);
                }
                (None, None) => {}
            }
            for child in children {
                let count = binomial_span(child, size);
                let data = op.receive(real(child, root, size), 0, count * block)?;
                let start = (child - vrank) * block;
                held[start..start + count * block].copy_from_slice(&data);
            }
            match (parent, receive) {
                (Some(parent), _) => op.send(real(parent, root, size), 0, held.into()),
                (None, Some(receive)) => {
                    for v in 0..size {
                        let r = real(v, root, size);
                        receive[r * block..(r + 1) * block]
                            .copy_from_slice(&held[v * block..(v + 1) * block]);
                    }
                }
                (None, None) => {}
            }
        }
    }
    op.finish()
}

/// MPI_Scatterv: the root's `send` blocks (one per rank, any lengths) to each rank's `receive`
/// (none at the root for MPI_IN_PLACE). Flat: only the root knows every block's length.
///
/// # Errors
/// As [`scatter`].
pub(crate) fn scatterv(
    mut op: Op<'_>,
    send: Option<&[&[u8]]>,
    receive: Option<&mut [u8]>,
    root: usize,
) -> Result<(), CollError> {
    let (size, rank) = (op.size(), op.rank());
    check_root(root, size)?;
    if rank == root {
        let send = send.ok_or_else(|| CollError::Argument("the root has no send blocks".into()))?;
        if send.len() != size {
            return Err(CollError::Argument(
                "the root needs one send block per rank".into(),
            ));
        }
        for v in 1..size {
            let to = real(v, root, size);
            if !send[to].is_empty() {
                op.send(to, 0, shared(send[to]));
            }
        }
        if let Some(receive) = receive {
            if receive.len() != send[rank].len() {
                return Err(CollError::Length {
                    rank,
                    expected: receive.len(),
                    got: send[rank].len(),
                });
            }
            receive.copy_from_slice(send[rank]);
        }
    } else {
        let receive = receive
            .ok_or_else(|| CollError::Argument("only the root may receive in place".into()))?;
        if !receive.is_empty() {
            let data = op.receive(root, 0, receive.len())?;
            receive.copy_from_slice(&data);
        }
    }
    op.finish()
}

/// MPI_Gatherv: each rank's `send` (none at the root for MPI_IN_PLACE) into the root's
/// `receive` blocks (one per rank, any lengths). Flat.
///
/// # Errors
/// As [`scatter`].
pub(crate) fn gatherv(
    mut op: Op<'_>,
    send: Option<&[u8]>,
    receive: Option<&mut [&mut [u8]]>,
    root: usize,
) -> Result<(), CollError> {
    let (size, rank) = (op.size(), op.rank());
    check_root(root, size)?;
    if rank == root {
        let receive =
            receive.ok_or_else(|| CollError::Argument("the root has no receive blocks".into()))?;
        if receive.len() != size {
            return Err(CollError::Argument(
                "the root needs one receive block per rank".into(),
            ));
        }
        if let Some(send) = send {
            if receive[rank].len() != send.len() {
                return Err(CollError::Length {
                    rank,
                    expected: receive[rank].len(),
                    got: send.len(),
                });
            }
            receive[rank].copy_from_slice(send);
        }
        for v in 1..size {
            let from = real(v, root, size);
            let length = receive[from].len();
            if length > 0 {
                let data = op.receive(from, 0, length)?;
                receive[from].copy_from_slice(&data);
            }
        }
    } else {
        let send =
            send.ok_or_else(|| CollError::Argument("only the root may send in place".into()))?;
        if !send.is_empty() {
            op.send(root, 0, shared(send));
        }
    }
    op.finish()
}

/// MPI_Alltoall of `block` bytes per pair: block `j` of `send` to rank `j`, which puts it at
/// block `i` (this rank) of its `receive`.
///
/// # Errors
/// As [`scatter`].
pub(crate) fn alltoall(
    mut op: Op<'_>,
    send: &[u8],
    receive: &mut [u8],
    block: usize,
    algorithm: Alltoall,
) -> Result<(), CollError> {
    let (size, rank) = (op.size(), op.rank());
    if send.len() != block * size || receive.len() != block * size {
        return Err(CollError::Argument(
            "the buffers are not one block per rank".into(),
        ));
    }
    receive[rank * block..(rank + 1) * block]
        .copy_from_slice(&send[rank * block..(rank + 1) * block]);
    if block == 0 || size == 1 {
        return op.finish();
    }
    match algorithm {
        Alltoall::Linear | Alltoall::Pairwise => {
            let linear = algorithm == Alltoall::Linear;
            if linear {
                for step in 1..size {
                    let to = (rank + step) % size;
                    op.send(to, 0, shared(&send[to * block..(to + 1) * block]));
                }
            }
            for step in 1..size {
                let to = (rank + step) % size;
                let from = (rank + size - step) % size;
                if !linear {
                    op.send(to, 0, shared(&send[to * block..(to + 1) * block]));
                }
                let data = op.receive(from, 0, block)?;
                receive[from * block..(from + 1) * block].copy_from_slice(&data);
            }
        }
        Alltoall::Bruck => {
            // Rotate so that slot i holds the block for rank + i; after the rounds slot i holds
            // the block rank - i sent to this rank.
            let mut slots: Vec<u8> = (0..size)
                .flat_map(|i| {
                    let to = (rank + i) % size;
                    send[to * block..(to + 1) * block].iter().copied()
                })
                .collect();
            let mut distance = 1;
            let mut round = 0u32;
            while distance < size {
                let chosen: Vec<usize> = (0..size).filter(|i| i & distance != 0).collect();
                let packed: Vec<u8> = chosen
                    .iter()
                    .flat_map(|&i| slots[i * block..(i + 1) * block].iter().copied())
                    .collect();
                op.send((rank + distance) % size, round, packed.into());
                let data =
                    op.receive((rank + size - distance) % size, round, chosen.len() * block)?;
                for (n, &i) in chosen.iter().enumerate() {
                    slots[i * block..(i + 1) * block]
                        .copy_from_slice(&data[n * block..(n + 1) * block]);
                }
                distance <<= 1;
                round += 1;
            }
            for i in 1..size {
                let from = (rank + size - i) % size;
                receive[from * block..(from + 1) * block]
                    .copy_from_slice(&slots[i * block..(i + 1) * block]);
            }
        }
    }
    op.finish()
}

/// MPI_Alltoallv: `send[j]` to rank `j`, which puts it into its `receive[i]` (this rank).
/// Linear or pairwise (Bruck needs every rank to know every block's length).
///
/// # Errors
/// As [`scatter`].
pub(crate) fn alltoallv(
    mut op: Op<'_>,
    send: &[&[u8]],
    receive: &mut [&mut [u8]],
    algorithm: Alltoall,
) -> Result<(), CollError> {
    let (size, rank) = (op.size(), op.rank());
    if send.len() != size || receive.len() != size {
        return Err(CollError::Argument("one block per rank each way".into()));
    }
    if receive[rank].len() != send[rank].len() {
        return Err(CollError::Length {
            rank,
            expected: receive[rank].len(),
            got: send[rank].len(),
        });
    }
    receive[rank].copy_from_slice(send[rank]);
    let linear = algorithm != Alltoall::Pairwise;
    if linear {
        for step in 1..size {
            let to = (rank + step) % size;
            if !send[to].is_empty() {
                op.send(to, 0, shared(send[to]));
            }
        }
    }
    for step in 1..size {
        let to = (rank + step) % size;
        let from = (rank + size - step) % size;
        if !linear && !send[to].is_empty() {
            op.send(to, 0, shared(send[to]));
        }
        let length = receive[from].len();
        if length > 0 {
            let data = op.receive(from, 0, length)?;
            receive[from].copy_from_slice(&data);
        }
    }
    op.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binomial_tree_reaches_every_rank_once() {
        for size in 1..40 {
            let mut reached = vec![0; size];
            reached[0] = 1;
            for v in 0..size {
                let (parent, children) = binomial(v, size);
                assert_eq!(parent.is_none(), v == 0);
                for c in children {
                    assert_eq!(binomial(c, size).0, Some(v));
                    reached[c] += 1;
                }
                // The subtree spans consecutive vranks.
                let span = binomial_span(v, size);
                assert!(v + span <= size);
            }
            assert!(reached.iter().all(|&n| n == 1), "size {size}");
            assert_eq!(binomial_span(0, size), size);
        }
    }

    #[test]
    fn pieces_cover_the_buffer() {
        for (length, segment) in [(0, 1), (1, 1), (100_000, 16_384), (65_536, 65_536)] {
            let all = pieces(length, segment);
            assert_eq!(all.iter().map(|p| p.1).sum::<usize>(), length);
            assert!(
                all.iter()
                    .all(|p| p.1 % SEGMENT_PAYLOAD == 0 || p.0 + p.1 == length)
            );
        }
    }

    #[test]
    fn defaults_follow_the_measurements() {
        assert_eq!(Bcast::default_for(2, 1 << 20), Bcast::Linear);
        assert_eq!(Bcast::default_for(8, 8), Bcast::Binomial);
        assert_eq!(Bcast::default_for(16, 1 << 20), Bcast::Binomial);
        assert_eq!(Tree::default_for(8), Tree::Flat);
        assert_eq!(Alltoall::default_for(16, 8), Alltoall::Linear);
        assert_eq!(Alltoall::default_for(16, 1 << 16), Alltoall::Pairwise);
        assert_eq!(Bcast::from_id(9, 4, 4), None);
        assert_eq!(
            Tree::from_id(2, Collective::Scatter, 4, 8),
            Some(Tree::Binomial)
        );
    }

    #[test]
    fn the_map_chooses_where_it_has_an_entry_and_the_defaults_elsewhere() {
        let map = CollMap::parse(
            "nicbar-coll-map 1\n\
             bcast 4-8 0-1023 pipeline\n\
             gather 2-16 0-max binomial\n\
             alltoall 8 0-max bruck\n",
        )
        .unwrap();
        let map = Some(&map);
        // Entries.
        assert_eq!(Bcast::chosen(map, 4, 8), Bcast::Pipeline);
        assert_eq!(Bcast::chosen(map, 8, 1023), Bcast::Pipeline);
        assert_eq!(
            Tree::chosen(map, Collective::Gather, 16, 1 << 20),
            Tree::Binomial
        );
        assert_eq!(Alltoall::chosen(map, 8, 1 << 20), Alltoall::Bruck);
        // Outside them: the defaults.
        assert_eq!(Bcast::chosen(map, 4, 1024), Bcast::default_for(4, 1024));
        assert_eq!(Bcast::chosen(map, 2, 8), Bcast::default_for(2, 8));
        assert_eq!(Bcast::chosen(map, 16, 8), Bcast::default_for(16, 8));
        assert_eq!(
            Tree::chosen(map, Collective::Scatter, 4, 8),
            Tree::default_for(8)
        );
        assert_eq!(Alltoall::chosen(map, 4, 8), Alltoall::default_for(4, 8));
        // No map: the defaults everywhere.
        assert_eq!(Bcast::chosen(None, 4, 8), Bcast::default_for(4, 8));
        assert_eq!(Alltoall::chosen(None, 8, 8), Alltoall::default_for(8, 8));
    }
}
