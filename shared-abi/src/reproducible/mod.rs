//! The reproducible floating-point sum ([`crate::reduce::ReduceOp::SUM_REPRODUCIBLE`]): a sum
//! whose bits depend on the members' values alone, never on the order they are combined in, the
//! grouping, the algorithm or the group's size.
//!
//! Each member's value travels as a [`ReproducibleSum`] of [`ACCUMULATOR_LEN`] bytes, the
//! payload one reduction in the NIC carries. Every finite double is an integer multiple of
//! 2^-1074 below 2^1024: a fixed-point number of 2,098 bits, cut here into bins of 32 bits. An
//! accumulator keeps the three bins from the one that holds the leading bit of the largest
//! magnitude it has seen down, each an `i64` sum of the 32-bit parts the values have there: an
//! exact integer sum, so it does not matter in which order or grouping they are added. When two
//! accumulators meet, the one whose top bin is lower loses the bins that fall below the other's
//! three, as a value added directly to the higher one would have lost them. What is summed is
//! therefore each value cut where the largest magnitude's bins end (at least 64 bits below its
//! leading bit), exactly, and rounded once at the end, to nearest, ties to even. A value's own
//! 53 bits always fit its three bins: one value alone comes back as it was.
//!
//! In the manner of Demmel and Nguyen's binned summation (*Parallel Reproducible Summation*,
//! IEEE Transactions on Computers, 2015), with integer bins in place of floating-point ones, so
//! the NIC combines them with integer additions only. The bins are exact for up to 2^31 values.

/// Bytes of one accumulator on the wire: a header word and three bins, little-endian.
pub const ACCUMULATOR_LEN: usize = 32;

/// Bits per bin.
const BIN_BITS: u32 = 32;
/// Bins kept.
const BINS: usize = 3;
/// The absolute bit position of a double's quantum 2^-1074: position 0.
const LOWEST_EXPONENT: i32 = -1074;

/// Header bits: the top bin's index plus one (0: no finite value other than zero yet) in the low
/// byte, then what the values were besides finite ones.
const TOP_MASK: u64 = 0xff;
/// A `+inf` was summed.
const POSITIVE_INFINITY: u64 = 1 << 8;
/// A `-inf` was summed.
const NEGATIVE_INFINITY: u64 = 1 << 9;
/// A NaN was summed.
const NOT_A_NUMBER: u64 = 1 << 10;
/// A value other than `-0.0` was summed (a sum of `-0.0`s alone is `-0.0`, as in IEEE 754).
const NOT_NEGATIVE_ZERO: u64 = 1 << 11;

/// One value, or the sum of several, on its way to a reproducible sum. The default is the
/// empty sum, `-0.0`: merging it changes nothing.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ReproducibleSum {
    header: u64,
    /// The top bin's sum first.
    bins: [i64; BINS],
}

/// A floating-point format's shape, for rounding the exact sum once.
#[derive(Clone, Copy)]
struct Format {
    /// Significand bits, the leading one included.
    precision: u32,
    /// The exponent of the smallest subnormal's bit.
    min_quantum: i32,
    /// The exponent bias.
    bias: i32,
    /// The all-ones exponent field (infinities, NaNs).
    max_biased: i32,
}

const BINARY64: Format = Format {
    precision: 53,
    min_quantum: -1074,
    bias: 1023,
    max_biased: 2047,
};

const BINARY32: Format = Format {
    precision: 24,
    min_quantum: -149,
    bias: 127,
    max_biased: 255,
};

impl ReproducibleSum {
    /// The accumulator of `value` alone.
    pub fn of_f64(value: f64) -> Self {
        let bits = value.to_bits();
        let negative = bits >> 63 == 1;
        let biased = ((bits >> 52) & 0x7ff) as i32;
        let fraction = bits & ((1 << 52) - 1);
        let mut sum = Self::default();
        if biased == 0x7ff {
            sum.header = NOT_NEGATIVE_ZERO
                | match (fraction != 0, negative) {
                    (true, _) => NOT_A_NUMBER,
                    (false, false) => POSITIVE_INFINITY,
                    (false, true) => NEGATIVE_INFINITY,
                };
            return sum;
        }
        if !(negative && biased == 0 && fraction == 0) {
            sum.header = NOT_NEGATIVE_ZERO;
        }
        let (significand, exponent) = match biased {
            0 => (fraction, LOWEST_EXPONENT),
            _ => (fraction | 1 << 52, biased - 1075),
        };
        if significand == 0 {
            return sum;
        }
        // The significand's bit 0 sits at this absolute position (0 for 2^-1074).
        let position = (exponent - LOWEST_EXPONENT) as u32;
        let leading = position + 63 - significand.leading_zeros();
        let top = leading / BIN_BITS;
        sum.header |= u64::from(top + 1);
        for (k, bin) in sum.bins.iter_mut().enumerate() {
            let Some(index) = top.checked_sub(k as u32) else {
                break;
            };
            let part = bits_at(significand, position, index * BIN_BITS);
            *bin = if negative { -part } else { part };
        }
        sum
    }

    /// The accumulator of `value` alone (converted to binary64 exactly).
    pub fn of_f32(value: f32) -> Self {
        Self::of_f64(f64::from(value))
    }

    /// Adds `other` in: exact, commutative and associative.
    pub fn merge(&mut self, other: &Self) {
        let flags = (self.header | other.header) & !TOP_MASK;
        let (mine, theirs) = (self.top(), other.top());
        let (mut high, low) = if theirs > mine {
            (*other, *self)
        } else {
            (*self, *other)
        };
        if let (Some(high_top), Some(low_top)) = (high.top(), low.top()) {
            let shift = (high_top - low_top) as usize;
            for k in shift..BINS {
                high.bins[k] = high.bins[k].wrapping_add(low.bins[k - shift]);
            }
        }
        high.header = (high.header & TOP_MASK) | flags;
        *self = high;
    }

    /// The sum, rounded once to binary64 (to nearest, ties to even; `±inf` past the largest
    /// double). NaN if a NaN or both infinities were summed; an exact zero is `+0.0`, or `-0.0`
    /// where only `-0.0`s were summed.
    pub fn to_f64(&self) -> f64 {
        f64::from_bits(self.round(BINARY64))
    }

    /// The sum, rounded once to binary32 (not through binary64: no double rounding).
    pub fn to_f32(&self) -> f32 {
        f32::from_bits(self.round(BINARY32) as u32)
    }

    /// The accumulator's wire bytes.
    pub fn to_bytes(&self) -> [u8; ACCUMULATOR_LEN] {
        let mut bytes = [0; ACCUMULATOR_LEN];
        let words = [
            self.header,
            self.bins[0] as u64,
            self.bins[1] as u64,
            self.bins[2] as u64,
        ];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// The accumulator in `bytes`; `None` unless they are [`ACCUMULATOR_LEN`] long. Any bytes
    /// of that length are an accumulator (a header of unknown bits sums as its known ones).
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ACCUMULATOR_LEN {
            return None;
        }
        let mut words = [0u64; 4];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut raw = [0; 8];
            raw.copy_from_slice(chunk);
            *word = u64::from_le_bytes(raw);
        }
        Some(Self {
            header: words[0],
            bins: [words[1] as i64, words[2] as i64, words[3] as i64],
        })
    }

    /// The top bin's index, if a finite nonzero value was summed.
    fn top(&self) -> Option<u32> {
        ((self.header & TOP_MASK) as u32).checked_sub(1)
    }

    /// The sum's bits in `format`, rounded once.
    fn round(&self, format: Format) -> u64 {
        let sign_bit = 1u64 << (format.precision + (bit_width(format.max_biased) - 1));
        let infinity = (format.max_biased as u64) << (format.precision - 1);
        let quiet_nan = infinity | 1 << (format.precision - 2);
        let infinities = self.header & (POSITIVE_INFINITY | NEGATIVE_INFINITY);
        if self.header & NOT_A_NUMBER != 0 || infinities == POSITIVE_INFINITY | NEGATIVE_INFINITY {
            return quiet_nan;
        }
        if infinities == POSITIVE_INFINITY {
            return infinity;
        }
        if infinities == NEGATIVE_INFINITY {
            return sign_bit | infinity;
        }
        let Some(top) = self.top() else {
            return if self.header & NOT_NEGATIVE_ZERO == 0 {
                sign_bit
            } else {
                0
            };
        };
        // The exact sum: an integer of units 2^scale. |bins[0]| < 2^63, so it fits 127 bits
        // with the two below it (wrapping only past 2^31 values, as the bins do).
        let total = (i128::from(self.bins[0]) << 64)
            .wrapping_add(i128::from(self.bins[1]) << 32)
            .wrapping_add(i128::from(self.bins[2]));
        let scale = (top as i32 - 2) * BIN_BITS as i32 + LOWEST_EXPONENT;
        let sign = if total < 0 { sign_bit } else { 0 };
        let magnitude = total.unsigned_abs();
        if magnitude == 0 {
            return 0;
        }
        sign | round_magnitude(magnitude, scale, format)
    }
}

/// Bits needed for `value` (positive).
const fn bit_width(value: i32) -> u32 {
    32 - value.leading_zeros()
}

/// The 32 bits of the fixed-point number `significand × 2^position` (positions absolute) that
/// start at position `from`, as a non-negative `i64`.
fn bits_at(significand: u64, position: u32, from: u32) -> i64 {
    let window = if from >= position {
        significand.checked_shr(from - position).unwrap_or(0)
    } else {
        significand.checked_shl(position - from).unwrap_or(0)
    };
    (window & 0xffff_ffff) as i64
}

/// `magnitude × 2^scale` (`magnitude` not 0) rounded to `format`, to nearest, ties to even; the
/// bits without the sign.
fn round_magnitude(magnitude: u128, scale: i32, format: Format) -> u64 {
    let leading = scale + (127 - magnitude.leading_zeros()) as i32;
    // The result's quantum: `precision` bits below the leading one, or the subnormals' own.
    let quantum = (leading - (format.precision as i32 - 1)).max(format.min_quantum);
    let shift = quantum - scale;
    let mut significand = if shift <= 0 {
        // Exact: the sum has no bits below the quantum (`-shift` < 128, as the sum is < 2^127).
        (magnitude << (-shift) as u32) as u64
    } else {
        let kept = magnitude.checked_shr(shift as u32).unwrap_or(0);
        let dropped = magnitude - kept.checked_shl(shift as u32).unwrap_or(0);
        let half = 1u128.checked_shl(shift as u32 - 1).unwrap_or(u128::MAX);
        let up = dropped > half || (dropped == half && kept & 1 == 1);
        kept as u64 + u64::from(up)
    };
    let mut quantum = quantum;
    if significand >> format.precision != 0 {
        // Rounding carried into a new leading bit.
        significand >>= 1;
        quantum += 1;
    }
    let normal = significand >> (format.precision - 1) != 0;
    if !normal {
        // A subnormal (its quantum is the smallest): the exponent field is 0.
        return significand;
    }
    let biased = quantum + format.precision as i32 - 1 + format.bias;
    if biased >= format.max_biased {
        return (format.max_biased as u64) << (format.precision - 1);
    }
    ((biased as u64) << (format.precision - 1))
        | (significand & ((1 << (format.precision - 1)) - 1))
}

#[cfg(test)]
mod tests;
