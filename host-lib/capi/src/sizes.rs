//! GM's size classes, as GM computes them: a buffer of size class `s` is `2^s` bytes and holds
//! messages of up to `2^s - 8` bytes; the smallest class is 3 (an 8-byte buffer, zero-length
//! messages). The NIC takes buffers of classes 3 to 31 and carries a message longer than its MTU
//! (4096 bytes) in several packets.

use shared_abi::MAX_SIZE_CLASS;

/// The smallest size class.
pub(crate) const MIN_SIZE_CLASS: u32 = 3;
/// The largest size class `gm_max_length_for_size` answers for (its lengths fit 64 bits).
const LARGEST_CLASS: u32 = 63;

/// GM's `gm_max_length_for_size`: `2^size - 8`; 0 below class 3 and above class 63.
pub(crate) fn max_length_for_size(size: u32) -> u64 {
    if (MIN_SIZE_CLASS..=LARGEST_CLASS).contains(&size) {
        (1u64 << size) - 8
    } else {
        0
    }
}

/// GM's `gm_min_size_for_length`: the smallest size class whose buffers hold `length` bytes (3
/// for an empty message).
pub(crate) fn min_size_for_length(length: u64) -> u32 {
    (MIN_SIZE_CLASS..=LARGEST_CLASS)
        .find(|size| max_length_for_size(*size) >= length)
        .unwrap_or(LARGEST_CLASS + 1)
}

/// [`min_size_for_length`] of a C length.
pub(crate) fn min_size_for_gm_length(length: crate::types::gm_size_t) -> u32 {
    #[allow(
        clippy::useless_conversion,
        reason = "gm_size_t is an unsigned long, 32 bits on some hosts"
    )]
    min_size_for_length(u64::from(length))
}

/// The size class `size` names, if the NIC takes buffers of it (3 to 31).
pub(crate) fn nic_size_class(size: u32) -> Option<u8> {
    u8::try_from(size)
        .ok()
        .filter(|size| (MIN_SIZE_CLASS as u8..=MAX_SIZE_CLASS).contains(size))
}

/// Why a message of `length` bytes cannot go as size class `size`, if it cannot.
pub(crate) fn refuse_length(size: u32, length: u64) -> Option<String> {
    let most = max_length_for_size(size);
    if length > most {
        return Some(format!(
            "a {length} byte message does not fit size class {size} ({most} bytes at most)"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_lengths_are_gms() {
        assert_eq!(max_length_for_size(3), 0);
        assert_eq!(max_length_for_size(4), 8);
        assert_eq!(max_length_for_size(10), 1016);
        assert_eq!(max_length_for_size(13), 8184);
        assert_eq!(max_length_for_size(14), 16_376);
        assert_eq!(max_length_for_size(0), 0);
        assert_eq!(max_length_for_size(2), 0);
        assert_eq!(max_length_for_size(99), 0);
        assert_eq!(min_size_for_length(0), 3);
        assert_eq!(min_size_for_length(1), 4);
        assert_eq!(min_size_for_length(8), 4);
        assert_eq!(min_size_for_length(9), 5);
        assert_eq!(min_size_for_length(1016), 10);
        assert_eq!(min_size_for_length(1017), 11);
        assert_eq!(min_size_for_length(4097), 13);
        assert_eq!(min_size_for_length(8184), 13);
        assert_eq!(min_size_for_length(8185), 14);
        for length in [0, 1, 7, 8, 100, 4096, 100_000] {
            let size = min_size_for_length(length);
            assert!(max_length_for_size(size) >= length);
            assert!(size == MIN_SIZE_CLASS || max_length_for_size(size - 1) < length);
        }
    }

    #[test]
    fn the_nic_takes_classes_3_to_31_and_messages_of_any_length_they_hold() {
        assert_eq!(nic_size_class(3), Some(3));
        assert_eq!(nic_size_class(31), Some(31));
        assert_eq!(nic_size_class(2), None);
        assert_eq!(nic_size_class(32), None);
        assert_eq!(refuse_length(3, 0), None);
        assert!(refuse_length(3, 1).unwrap().contains("does not fit"));
        // Longer than a packet: the NIC cuts it into segments.
        assert_eq!(refuse_length(13, 8184), None);
        assert_eq!(refuse_length(21, 1 << 20), None);
        assert!(refuse_length(13, 8185).unwrap().contains("does not fit"));
    }
}
