//! Sequence numbers: a wrapping `u32` newtype, compared in serial-number arithmetic.

/// A packet sequence number on one connection epoch. Ordering wraps: `a < b` when `b` is less
/// than half the number space ahead of `a` (RFC 1982), so comparisons stay right across `u32::MAX`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Seq(pub u32);

impl Seq {
    /// The sequence number after this one.
    pub const fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }

    /// `self + n`.
    pub const fn add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n))
    }

    /// How far `self` is ahead of `earlier` (wrapping).
    pub const fn distance_from(self, earlier: Self) -> u32 {
        self.0.wrapping_sub(earlier.0)
    }

    /// Whether `self` comes strictly before `other`.
    pub const fn precedes(self, other: Self) -> bool {
        let d = other.0.wrapping_sub(self.0);
        d != 0 && d < (1 << 31)
    }
}

impl PartialOrd for Seq {
    fn partial_cmp(&self, other: &Self) -> Option<core::cmp::Ordering> {
        Some(if self == other {
            core::cmp::Ordering::Equal
        } else if self.precedes(*other) {
            core::cmp::Ordering::Less
        } else {
            core::cmp::Ordering::Greater
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ordering_wraps() {
        assert!(Seq(u32::MAX) < Seq(0));
        assert!(Seq(u32::MAX - 5) < Seq(3));
        assert!(Seq(3) > Seq(u32::MAX - 5));
        assert_eq!(Seq(3).distance_from(Seq(u32::MAX)), 4);
        assert_eq!(Seq(u32::MAX).next(), Seq(0));
    }

    proptest! {
        #[test]
        fn a_small_step_ahead_is_always_greater(base in any::<u32>(), step in 1u32..(1 << 30)) {
            let a = Seq(base);
            let b = a.add(step);
            prop_assert!(a < b);
            prop_assert!(b > a);
            prop_assert_eq!(b.distance_from(a), step);
        }
    }
}
