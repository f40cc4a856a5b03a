//! The shapes the algorithms share: ranks renumbered from the root, binomial trees, a message cut
//! into pipeline pieces, and the part numbers of an operation's phases.

use super::error::CollError;
use super::transfer::PACKET_PAYLOAD;

/// The part numbers of an operation's phases (segments count up from each).
pub(super) const PHASE: u32 = 1 << 24;

/// The rank `vrank` places from `root` (ranks renumbered so that the root is 0).
pub(super) fn real(vrank: usize, root: usize, size: usize) -> usize {
    (vrank + root) % size
}

/// The segments of `length` bytes of `segment` bytes each (at least one segment; a multiple of
/// a packet's payload, so that no segment ends in a short packet but the last).
pub(super) fn pieces(length: usize, segment: usize) -> Vec<(usize, usize)> {
    let segment = segment.max(PACKET_PAYLOAD).div_ceil(PACKET_PAYLOAD) * PACKET_PAYLOAD;
    (0..length.div_ceil(segment).max(1))
        .map(|index| {
            let offset = index * segment;
            (offset, (length - offset).min(segment))
        })
        .collect()
}

/// The binomial tree's parent of `vrank` (none for 0) and its children, nearest first.
pub(super) fn binomial(vrank: usize, size: usize) -> (Option<usize>, Vec<usize>) {
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
pub(super) fn binomial_span(vrank: usize, size: usize) -> usize {
    let low = if vrank == 0 {
        size
    } else {
        vrank & vrank.wrapping_neg()
    };
    low.min(size - vrank)
}

pub(super) fn check_root(root: usize, size: usize) -> Result<(), CollError> {
    if root >= size {
        return Err(CollError::Argument(format!(
            "root {root} is not a rank of a communicator of {size}"
        )));
    }
    Ok(())
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
                    .all(|p| p.1 % PACKET_PAYLOAD == 0 || p.0 + p.1 == length)
            );
        }
    }
}
