//! MPI_Bcast over messages (CollGM §3.4): linear, binomial, segmented binary and pipeline trees,
//! the split binary tree, and the NIC's own broadcast for a few bytes.

use std::ops::Range;

use super::algorithm::Bcast;
use super::error::CollError;
use super::op::Op;
use super::pieces::{PIECE, WHOLE_UP_TO, receive_in_pieces, send_in_pieces};
use super::topology::{PHASE, binomial, pieces, real};
use super::transfer::RENDEZVOUS_THRESHOLD;

/// The binomial tree's pieces of an eager message of more than [`FORWARDED_FROM`] bytes: each is
/// forwarded as it arrives, so an inner rank passes one on while the next comes, where the
/// message whole (one segment, one NIC message) stopped at each rank until its last byte. At 8
/// processes on two cores (`coll_bench`, three rounds): 48 KiB took 77 µs in 8 KiB pieces and
/// 140 whole, 32 KiB 61 and 86; 24 KiB about as long either way (53 and 51). Pieces of 16 KiB
/// took 92 µs at 48 KiB.
const FORWARDED_PIECE: usize = 8 << 10;
/// The longest eager binomial broadcast sent whole.
const FORWARDED_FROM: usize = 3 * FORWARDED_PIECE;

/// MPI_Bcast of `buffer` from `root`.
///
/// # Errors
/// As [`Op::receive`] and [`Op::finish`].
pub fn bcast(
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
                let data = op.stage(buffer);
                for v in 1..size {
                    op.send(real(v, root, size), 0, data.clone());
                }
            } else {
                op.receive_into(root, 0, buffer)?;
            }
        }
        // By the library's threshold, not the process's (`NICBAR_COLL_RENDEZVOUS`, which the
        // ranks need not share): every rank must take the same tree.
        Bcast::Binomial if (FORWARDED_FROM + 1..RENDEZVOUS_THRESHOLD).contains(&buffer.len()) => {
            let (parent, children) = binomial(vrank, size);
            tree_segments(&mut op, buffer, root, parent, &children, 0, FORWARDED_PIECE)?;
        }
        Bcast::Binomial => {
            let (parent, children) = binomial(vrank, size);
            let children: Vec<usize> = children.iter().map(|&c| real(c, root, size)).collect();
            let parent = parent.map(|parent| real(parent, root, size));
            if buffer.len() > WHOLE_UP_TO {
                tree_in_pieces(&mut op, buffer, parent, &children, PIECE, 0)?;
            } else {
                binomial_whole(&mut op, buffer, parent, &children)?;
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
        Bcast::Nic if buffer.len() > crate::NIC_BROADCAST_MAX => {
            let fallback = Bcast::default_for(size, buffer.len());
            return bcast(op, buffer, root, fallback, segment);
        }
        Bcast::Nic => return op.nic_broadcast(root, buffer),
    }
    op.finish()
}

/// The binomial tree with the message whole, part 0: an inner rank forwards each eager segment
/// as it arrives ([`Op::forward`]), and a message that came by rendezvous once it is here.
fn binomial_whole(
    op: &mut Op<'_>,
    buffer: &mut [u8],
    parent: Option<usize>,
    children: &[usize],
) -> Result<(), CollError> {
    match parent {
        Some(from) => {
            let forwarded = op.forward(from, 0, children);
            op.receive_forwarded(from, 0, buffer, children, forwarded)
        }
        None => {
            let data = op.stage(buffer);
            for &child in children {
                op.send(child, 0, data.clone());
            }
            Ok(())
        }
    }
}

/// A tree with the message in pieces of `piece` bytes ([`super::pieces`]): the root sends each
/// piece once the one before is delivered; an inner rank passes each on to `children` as soon
/// as it has it and the one before is delivered. `parent` and `children` are ranks.
fn tree_in_pieces(
    op: &mut Op<'_>,
    buffer: &mut [u8],
    parent: Option<usize>,
    children: &[usize],
    piece: usize,
    first_part: u32,
) -> Result<(), CollError> {
    match parent {
        Some(from) => receive_in_pieces(op, buffer, from, children, piece, first_part),
        None => send_in_pieces(op, buffer, children, piece, first_part),
    }
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
    if op.by_rendezvous(pieces[0].1) {
        // Segments put whole cannot be forwarded as they arrive; all on their way at once,
        // the NIC interleaved them and each came later (1.5–3.4× the binomial tree's time).
        let parent = parent.map(|parent| real(parent, root, size));
        return tree_in_pieces(op, buffer, parent, &children, segment, first_part);
    }
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
                op.receive_forwarded(from, part, piece, &children, forwarded)?;
            }
            None => {
                let data = op.stage(piece);
                for &child in &children {
                    op.send(child, part, data.clone());
                }
            }
        }
    }
    Ok(())
}

/// The split binary tree's root with segments put whole: piece `k` of each half to the top of
/// its subtree, one piece of each at a time, as [`tree_in_pieces`] sends (a half after the
/// other would leave the second subtree idle meanwhile). `tops` are ranks.
fn halves_in_pieces(
    op: &mut Op<'_>,
    buffer: &[u8],
    tops: &[(Range<usize>, usize)],
    segment: usize,
) -> Result<(), CollError> {
    let tops: Vec<_> = tops
        .iter()
        .filter(|(range, _)| !range.is_empty())
        .map(|(range, top)| (range.start, pieces(range.len(), segment), *top))
        .collect();
    let count = tops.iter().map(|(_, pieces, _)| pieces.len()).max();
    for index in 0..count.unwrap_or(0) {
        op.wait_sends(0)?;
        for (start, pieces, top) in &tops {
            if let Some(&(offset, length)) = pieces.get(index) {
                let data = op.stage(&buffer[start + offset..][..length]);
                op.send(*top, index as u32, data);
            }
        }
        op.post();
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
        if op.by_rendezvous(pieces(half, segment)[0].1) {
            let tops = [
                (range(1), real(1, root, size)),
                (range(2), real(2, root, size)),
            ];
            halves_in_pieces(op, buffer, &tops, segment)?;
        } else {
            for s in [1, 2] {
                let r = range(s);
                if !r.is_empty() {
                    tree_segments(op, &mut buffer[r], root, None, &[s], 0, segment)?;
                }
            }
        }
        // Ranks of the larger side without a partner get the other half from here.
        let pairs = left.len().min(right.len());
        for &v in left.iter().skip(pairs) {
            let r = range(2);
            if !r.is_empty() {
                let data = op.stage(&buffer[r]);
                op.send(real(v, root, size), direct, data);
            }
        }
        for &v in right.iter().skip(pairs) {
            let r = range(1);
            if !r.is_empty() {
                let data = op.stage(&buffer[r]);
                op.send(real(v, root, size), direct, data);
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
                let data = op.stage(&buffer[own.clone()]);
                op.send(real(partner, root, size), exchange, data);
            }
            (partner, exchange)
        }
        None => (0, direct),
    };
    if !other.is_empty() {
        op.receive_into(real(source, root, size), part, &mut buffer[other])?;
    }
    Ok(())
}
