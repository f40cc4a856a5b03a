//! A long message in pieces, each a message of its own (by rendezvous when that long): a rank
//! that receives one can pass a piece on, or copy it out, while the next lands, where a whole
//! message stopped it until its last byte came; and the sender's registered memory holds a
//! piece or two, not the message.

use super::error::CollError;
use super::op::Op;
use super::topology::pieces;

/// Bytes of one piece.
pub(super) const PIECE: usize = 256 << 10;
/// The longest message sent whole: two pieces overlapped too little to pay for their second
/// handshake (a 512 KiB binomial broadcast at 8 processes on two cores, `coll_bench`: 625 µs in
/// pieces, 508 whole; three rounds).
pub(super) const WHOLE_UP_TO: usize = 2 * PIECE;
/// Pieces whose landing a receiver offers ahead of the one it waits for, so that its sender's
/// puts start without a round trip.
const OFFERED_AHEAD: usize = 2;

/// Sends `bytes` to each rank of `to` in pieces of `piece` bytes (part `first_part + k` for
/// piece `k`): each staged and posted once the one before is delivered.
///
/// # Errors
/// As [`Op::wait_sends`].
pub(super) fn send_in_pieces(
    op: &mut Op<'_>,
    bytes: &[u8],
    to: &[usize],
    piece: usize,
    first_part: u32,
) -> Result<(), CollError> {
    for (index, (offset, length)) in pieces(bytes.len(), piece).into_iter().enumerate() {
        pass_on(
            op,
            &bytes[offset..offset + length],
            to,
            first_part + index as u32,
        )?;
    }
    Ok(())
}

/// Receives `buffer` from `from` in pieces of `piece` bytes (parts as [`send_in_pieces`]
/// sends them), offering the landings of the next pieces ahead, and passes each on to every
/// rank of `to` (if any) as soon as it is here and the one before is delivered.
///
/// # Errors
/// As [`Op::receive`] and [`Op::wait_sends`].
pub(super) fn receive_in_pieces(
    op: &mut Op<'_>,
    buffer: &mut [u8],
    from: usize,
    to: &[usize],
    piece: usize,
    first_part: u32,
) -> Result<(), CollError> {
    let pieces = pieces(buffer.len(), piece);
    let part = |index: usize| first_part + index as u32;
    let mut offered = 0;
    for (index, &(offset, length)) in pieces.iter().enumerate() {
        while offered < pieces.len().min(index + OFFERED_AHEAD + 1) {
            op.offer(from, part(offered), pieces[offered].1);
            offered += 1;
        }
        let piece = &mut buffer[offset..offset + length];
        op.receive_into(from, part(index), piece)?;
        if !to.is_empty() {
            pass_on(op, piece, to, part(index))?;
        }
    }
    Ok(())
}

/// Receives one message from each rank of `blocks` in turn (as `part`), each into its block,
/// offering the landings of the next senders ahead of the one it waits for, so that their puts
/// start while it takes the one before (a root that offered each landing only as it came to
/// wait for it took the senders' puts one after another: `MPI_Gather` and `MPI_Gatherv` of
/// 64 KiB blocks at 8 processes on two cores, `coll_bench`, took 0.86× the time with them
/// offered ahead, and as long at 1 MiB; three rounds).
///
/// # Errors
/// As [`Op::receive_into`].
pub(super) fn receive_each(
    op: &mut Op<'_>,
    part: u32,
    blocks: &mut [(usize, &mut [u8])],
) -> Result<(), CollError> {
    let mut offered = 0;
    for index in 0..blocks.len() {
        while offered < blocks.len().min(index + OFFERED_AHEAD + 1) {
            let (from, ref block) = blocks[offered];
            op.offer(from, part, block.len());
            offered += 1;
        }
        let (from, block) = &mut blocks[index];
        op.receive_into(*from, part, block)?;
    }
    Ok(())
}

/// Stages `piece` and sends it to every rank of `to` as `part`, once the operation's sends
/// before it are delivered: with more on their way (one or two pieces per child), the NIC
/// interleaved them, and each came later (a binomial broadcast at 8 processes on two cores,
/// `coll_bench`, 16 MiB: 15 and 17 ms against 14; docs/benchmarks.md).
fn pass_on(op: &mut Op<'_>, piece: &[u8], to: &[usize], part: u32) -> Result<(), CollError> {
    op.wait_sends(0)?;
    let data = op.stage(piece);
    for &rank in to {
        op.send(rank, part, data.clone());
    }
    op.post();
    Ok(())
}
