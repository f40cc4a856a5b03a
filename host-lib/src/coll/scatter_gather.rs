//! MPI_Scatter and MPI_Gather, flat and binomial (CollGM §3.4), and their v forms (flat: only
//! the root knows every block's length).

use super::algorithm::Tree;
use super::error::CollError;
use super::op::Op;
use super::pieces::{PIECE, WHOLE_UP_TO, receive_each, receive_in_pieces, send_in_pieces};
use super::topology::{binomial, binomial_span, check_root, real};

/// MPI_Scatter of `block` bytes per rank from `root`: `send` (the root's, every rank's block
/// in rank order) to `receive` (none at the root for MPI_IN_PLACE).
///
/// # Errors
/// As [`Op::receive`] and [`Op::finish`]; [`CollError::Argument`] for buffers of other lengths.
pub fn scatter(
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
                    send_block(&mut op, &send[to * block..(to + 1) * block], to)?;
                }
                if let Some(receive) = receive {
                    receive.copy_from_slice(&send[rank * block..(rank + 1) * block]);
                }
            } else if let Some(receive) = receive {
                receive_block(&mut op, receive, root)?;
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
                    let mut held = Vec::with_capacity(size * block);
                    for v in 0..size {
                        let r = real(v, root, size);
                        held.extend_from_slice(&send[r * block..(r + 1) * block]);
                    }
                    held
                }
            };
            for child in children {
                let count = binomial_span(child, size);
                let start = (child - vrank) * block;
                let data = op.stage(&held[start..start + count * block]);
                op.send(real(child, root, size), 0, data);
            }
            if let Some(receive) = receive {
                receive.copy_from_slice(&held[..block]);
            }
        }
    }
    op.finish()
}

/// MPI_Gather of `block` bytes per rank to `root`: `send` (none at the root for MPI_IN_PLACE,
/// its block then already in place) into `receive` (the root's, every rank's block in rank
/// order).
///
/// # Errors
/// As [`scatter`].
pub fn gather(
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
                let mut blocks: Vec<Option<&mut [u8]>> =
                    receive.chunks_mut(block).map(Some).collect();
                let mut order: Vec<(usize, &mut [u8])> = (1..size)
                    .map(|v| real(v, root, size))
                    .filter_map(|from| Some((from, blocks[from].take()?)))
                    .collect();
                receive_each(&mut op, 0, &mut order)?;
            } else if let Some(send) = send {
                let data = op.stage(send);
                op.send(root, 0, data);
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
                (Some(parent), _) => op.send(real(parent, root, size), 0, held),
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
pub fn scatterv(
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
                send_block(&mut op, send[to], to)?;
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
            receive_block(&mut op, receive, root)?;
        }
    }
    op.finish()
}

/// A flat scatter's root sends `block` to `to`: whole, posted at once so that the NIC moves it
/// while the root stages the next rank's; a long one in pieces ([`super::pieces`]), so that
/// `to` copies one out while the next lands and the root's registered memory holds one piece,
/// not every rank's block.
fn send_block(op: &mut Op<'_>, block: &[u8], to: usize) -> Result<(), CollError> {
    if block.len() > WHOLE_UP_TO {
        return send_in_pieces(op, block, &[to], PIECE, 0);
    }
    let data = op.stage(block);
    op.send(to, 0, data);
    op.post();
    Ok(())
}

/// A flat scatter's rank receives its block from `root`, as [`send_block`] sends it.
fn receive_block(op: &mut Op<'_>, block: &mut [u8], root: usize) -> Result<(), CollError> {
    if block.len() > WHOLE_UP_TO {
        return receive_in_pieces(op, block, root, &[], PIECE, 0);
    }
    op.receive_into(root, 0, block)
}

/// MPI_Gatherv: each rank's `send` (none at the root for MPI_IN_PLACE) into the root's
/// `receive` blocks (one per rank, any lengths). Flat.
///
/// # Errors
/// As [`scatter`].
pub fn gatherv(
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
        let mut blocks: Vec<Option<&mut [u8]>> =
            receive.iter_mut().map(|block| Some(&mut **block)).collect();
        let mut order: Vec<(usize, &mut [u8])> = (1..size)
            .map(|v| real(v, root, size))
            .filter_map(|from| Some((from, blocks[from].take().filter(|b| !b.is_empty())?)))
            .collect();
        receive_each(&mut op, 0, &mut order)?;
    } else {
        let send =
            send.ok_or_else(|| CollError::Argument("only the root may send in place".into()))?;
        if !send.is_empty() {
            let data = op.stage(send);
            op.send(root, 0, data);
        }
    }
    op.finish()
}
