//! The algorithms' names: which algorithm of each collective runs, the collectives a selection
//! map chooses for, and the choice without a map (CollGM's measurements, retaken on the emulated
//! NIC). The lowest layer of the choice: [`super::map`] names these, [`super::select`] stands on
//! both.

/// Broadcast algorithms (`coll_nicbar_bcast_algorithm`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bcast {
    /// The root sends to every rank.
    Linear,
    /// A binomial tree: the message whole up to 512 KiB, and above in pieces of 256 KiB that
    /// each rank passes on as they land.
    Binomial,
    /// A binary tree, the message in segments forwarded as they arrive.
    Binary,
    /// Each half of the message down one half of a binary tree, then exchanged in pairs.
    SplitBinary,
    /// A chain, the message in segments forwarded as they arrive.
    Pipeline,
    /// Up to [`crate::NIC_BROADCAST_MAX`] bytes carried by the NIC's barrier engine: a
    /// gather-broadcast tree whose down-phase packets carry the bytes, no host on the path.
    /// Longer messages take [`Bcast::default_for`]'s algorithm.
    Nic,
}

impl Bcast {
    /// The choice without a measured map. CollGM's Figure 9 (Myrinet) takes binomial for small
    /// messages, split-binary for middle ones and the pipeline for large ones; on the emulated
    /// NIC, where one thread runs every NIC of the host, each host hop costs more than the
    /// bytes, and binomial measured fastest at every size at 8 and 16 processes (forced with
    /// `coll_nicbar_bcast_algorithm` under `coll_bench`: at 16 processes and 1 MiB 122 ms
    /// binomial, 126 split-binary, 145 pipeline, 164 linear).
    pub fn default_for(size: usize, bytes: usize) -> Self {
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
pub enum Tree {
    /// The root talks to every rank.
    Flat,
    /// A binomial tree whose inner ranks carry their subtree's blocks.
    Binomial,
}

impl Tree {
    /// The choice without a measured map. CollGM's Figure 11 takes binomial below 1 KiB per
    /// rank; on the emulated NIC flat measured faster at every size from 8 B on at 8 and 16
    /// processes (at 16 and 8 B: scatter 269 µs flat, 767 binomial; gather 1.29 ms, 2.43).
    pub fn default_for(block: usize) -> Self {
        let _ = block;
        Self::Flat
    }
}

/// All-to-all algorithms (`coll_nicbar_alltoall_algorithm`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Alltoall {
    /// Every rank sends to every other at once.
    Linear,
    /// Step k exchanges with ranks ± k.
    Pairwise,
    /// Bruck's log2(P) rounds of combined blocks.
    Bruck,
}

impl Alltoall {
    /// The choice without a measured map. CollGM's Figure 7 takes Bruck for small blocks; on
    /// the emulated NIC at 8 processes all at once measured fastest up to 4 KiB (8 B: 1.44 ms
    /// linear, 1.81 Bruck, 4.13 pairwise) and pairwise from 64 KiB (21.2 ms, 23.7 linear), which
    /// also keeps only one block per peer in flight.
    pub fn default_for(size: usize, block: usize) -> Self {
        let _ = size;
        if block <= 32 * 1024 {
            Self::Linear
        } else {
            Self::Pairwise
        }
    }
}

/// Allreduce algorithms over messages (`coll_nicbar_allreduce_algorithm`), for what the NIC
/// does not combine itself.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Allreduce {
    /// log2(P) exchanges of the whole vector; keeps the ranks' order, so it is the one an
    /// operation that does not commute takes.
    RecursiveDoubling,
    /// Rabenseifner's reduce-scatter by recursive halving and allgather by recursive doubling:
    /// 2 log2(P) messages, each rank sending about twice the vector.
    Rabenseifner,
    /// A ring: 2 (P - 1) messages of a P-th of the vector each.
    Ring,
}

impl Allreduce {
    /// The choice without a measured map: the fewest messages for short vectors, where each
    /// message's cost dominates, and the fewest bytes per rank for long ones (the crossing
    /// MPICH takes, 2 KiB there; on the emulated NIC, where a message costs far more than its
    /// bytes, 64 KiB: at 64 KiB Rabenseifner's took 0.76× recursive doubling's time at 8
    /// processes and 0.86× at 4, docs/mpi.md).
    pub fn default_for(size: usize, bytes: usize) -> Self {
        let _ = size;
        if bytes < 64 * 1024 {
            Self::RecursiveDoubling
        } else {
            Self::Rabenseifner
        }
    }
}

/// The collectives a selection map chooses for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// MPI_Bcast.
    Bcast,
    /// MPI_Scatter.
    Scatter,
    /// MPI_Gather.
    Gather,
    /// MPI_Alltoall.
    Alltoall,
    /// MPI_Allreduce over messages.
    Allreduce,
}

/// An algorithm of some collective, as a selection map names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// A broadcast's.
    Bcast(Bcast),
    /// A scatter's or a gather's.
    Tree(Tree),
    /// An all-to-all's.
    Alltoall(Alltoall),
    /// An allreduce's.
    Allreduce(Allreduce),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_measurements() {
        assert_eq!(Bcast::default_for(2, 1 << 20), Bcast::Linear);
        assert_eq!(Bcast::default_for(8, 8), Bcast::Binomial);
        assert_eq!(Bcast::default_for(16, 1 << 20), Bcast::Binomial);
        assert_eq!(Tree::default_for(8), Tree::Flat);
        assert_eq!(Alltoall::default_for(16, 8), Alltoall::Linear);
        assert_eq!(Alltoall::default_for(16, 1 << 16), Alltoall::Pairwise);
        assert_eq!(Allreduce::default_for(8, 64), Allreduce::RecursiveDoubling);
        assert_eq!(
            Allreduce::default_for(8, 65535),
            Allreduce::RecursiveDoubling
        );
        assert_eq!(Allreduce::default_for(8, 65536), Allreduce::Rabenseifner);
        assert_eq!(Allreduce::default_for(8, 1 << 20), Allreduce::Rabenseifner);
    }
}
