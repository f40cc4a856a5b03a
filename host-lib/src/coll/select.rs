//! The choice of an algorithm when the caller forces none: the selection map's entry for the
//! collective, communicator size and message size ([`super::map`]), else the measured default
//! (`default_for` of [`Bcast`], [`Tree`], [`Alltoall`]). Every rank of a communicator sees the
//! same sizes (MPI requires matching counts) and, with the same map, makes the same choice.

use super::algorithm::{Allreduce, Alltoall, Bcast, Choice, Collective, Tree};
use super::map::{self, CollMap};

/// The broadcast of `bytes` on `size` ranks: `map`'s choice, or [`Bcast::default_for`] where
/// it has none (or names the NIC's broadcast for more bytes than it carries).
pub fn bcast(map: Option<&CollMap>, size: usize, bytes: usize) -> Bcast {
    match map.and_then(|m| m.choose(Collective::Bcast, size, bytes)) {
        Some(Choice::Bcast(Bcast::Nic)) if bytes > crate::NIC_BROADCAST_MAX => {
            Bcast::default_for(size, bytes)
        }
        Some(Choice::Bcast(algorithm)) => algorithm,
        _ => Bcast::default_for(size, bytes),
    }
}

/// The algorithm of `collective` (scatter or gather) on `size` ranks and `block` bytes per
/// rank: `map`'s choice, or [`Tree::default_for`] where it has none.
pub fn tree(map: Option<&CollMap>, collective: Collective, size: usize, block: usize) -> Tree {
    match map.and_then(|m| m.choose(collective, size, block)) {
        Some(Choice::Tree(algorithm)) => algorithm,
        _ => Tree::default_for(block),
    }
}

/// The all-to-all on `size` ranks and `block` bytes per pair: `map`'s choice, or
/// [`Alltoall::default_for`] where it has none.
pub fn alltoall(map: Option<&CollMap>, size: usize, block: usize) -> Alltoall {
    match map.and_then(|m| m.choose(Collective::Alltoall, size, block)) {
        Some(Choice::Alltoall(algorithm)) => algorithm,
        _ => Alltoall::default_for(size, block),
    }
}

/// The allreduce over messages of `bytes` on `size` ranks: `map`'s choice, or
/// [`Allreduce::default_for`] where it has none.
pub fn allreduce(map: Option<&CollMap>, size: usize, bytes: usize) -> Allreduce {
    match map.and_then(|m| m.choose(Collective::Allreduce, size, bytes)) {
        Some(Choice::Allreduce(algorithm)) => algorithm,
        _ => Allreduce::default_for(size, bytes),
    }
}

/// [`bcast`] with the process's map ([`map::current`]).
pub fn process_bcast(size: usize, bytes: usize) -> Bcast {
    bcast(map::current().map.as_ref(), size, bytes)
}

/// [`tree`] with the process's map ([`map::current`]).
pub fn process_tree(collective: Collective, size: usize, block: usize) -> Tree {
    tree(map::current().map.as_ref(), collective, size, block)
}

/// [`allreduce`] with the process's map ([`map::current`]).
pub fn process_allreduce(size: usize, bytes: usize) -> Allreduce {
    allreduce(map::current().map.as_ref(), size, bytes)
}

/// [`alltoall`] with the process's map ([`map::current`]).
pub fn process_alltoall(size: usize, block: usize) -> Alltoall {
    alltoall(map::current().map.as_ref(), size, block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_chooses_where_it_has_an_entry_and_the_defaults_elsewhere() {
        let map = CollMap::parse(
            "nicbar-coll-map 1\n\
             bcast 4-8 0-1023 pipeline\n\
             gather 2-16 0-max binomial\n\
             alltoall 8 0-max bruck\n\
             allreduce 4-16 65536-max ring\n",
        )
        .unwrap();
        let map = Some(&map);
        // Entries.
        assert_eq!(bcast(map, 4, 8), Bcast::Pipeline);
        assert_eq!(bcast(map, 8, 1023), Bcast::Pipeline);
        assert_eq!(tree(map, Collective::Gather, 16, 1 << 20), Tree::Binomial);
        assert_eq!(alltoall(map, 8, 1 << 20), Alltoall::Bruck);
        assert_eq!(allreduce(map, 8, 1 << 20), Allreduce::Ring);
        assert_eq!(allreduce(map, 8, 65535), Allreduce::default_for(8, 65535));
        // Outside them: the defaults.
        assert_eq!(bcast(map, 4, 1024), Bcast::default_for(4, 1024));
        assert_eq!(bcast(map, 2, 8), Bcast::default_for(2, 8));
        assert_eq!(bcast(map, 16, 8), Bcast::default_for(16, 8));
        assert_eq!(tree(map, Collective::Scatter, 4, 8), Tree::default_for(8));
        assert_eq!(alltoall(map, 4, 8), Alltoall::default_for(4, 8));
        // No map: the defaults everywhere.
        assert_eq!(bcast(None, 4, 8), Bcast::default_for(4, 8));
        assert_eq!(alltoall(None, 8, 8), Alltoall::default_for(8, 8));
    }

    #[test]
    fn a_nic_broadcast_in_the_map_is_taken_only_for_what_the_nic_carries() {
        let map = CollMap::parse("nicbar-coll-map 1\nbcast 2-8 0-max nic\n").unwrap();
        let map = Some(&map);
        assert_eq!(bcast(map, 4, crate::NIC_BROADCAST_MAX), Bcast::Nic);
        assert_eq!(
            bcast(map, 4, crate::NIC_BROADCAST_MAX + 1),
            Bcast::default_for(4, crate::NIC_BROADCAST_MAX + 1)
        );
    }
}
