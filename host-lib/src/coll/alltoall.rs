//! MPI_Alltoall (linear, pairwise, Bruck's) and MPI_Alltoallv (linear or pairwise).

use super::algorithm::Alltoall;
use super::error::CollError;
use super::op::Op;

/// MPI_Alltoall of `block` bytes per pair: block `j` of `send` to rank `j`, which puts it at
/// block `i` (this rank) of its `receive`.
///
/// # Errors
/// As [`super::scatter`].
pub fn alltoall(
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
                    let data = op.stage(&send[to * block..(to + 1) * block]);
                    op.send(to, 0, data);
                }
            }
            for step in 1..size {
                let to = (rank + step) % size;
                let from = (rank + size - step) % size;
                if !linear {
                    let data = op.stage(&send[to * block..(to + 1) * block]);
                    op.send(to, 0, data);
                }
                op.receive_into(from, 0, &mut receive[from * block..(from + 1) * block])?;
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
                op.send((rank + distance) % size, round, packed);
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
/// As [`super::scatter`].
pub fn alltoallv(
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
                let data = op.stage(send[to]);
                op.send(to, 0, data);
            }
        }
    }
    for step in 1..size {
        let to = (rank + step) % size;
        let from = (rank + size - step) % size;
        if !linear && !send[to].is_empty() {
            let data = op.stage(send[to]);
            op.send(to, 0, data);
        }
        let length = receive[from].len();
        if length > 0 {
            op.receive_into(from, 0, receive[from])?;
        }
    }
    op.finish()
}
