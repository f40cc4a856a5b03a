extern crate std;

use std::vec::Vec;

use proptest::prelude::*;

use super::*;

/// The correctly rounded sum of `values` (Shewchuk's exact partials, then CPython's
/// `math.fsum` rounding): a reference computed another way, for sums that neither overflow nor
/// meet an infinity or NaN.
fn exact_sum(values: &[f64]) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    for &value in values {
        let mut x = value;
        let mut kept = 0;
        for index in 0..partials.len() {
            let mut y = partials[index];
            if x.abs() < y.abs() {
                core::mem::swap(&mut x, &mut y);
            }
            let high = x + y;
            let low = y - (high - x);
            if low != 0.0 {
                partials[kept] = low;
                kept += 1;
            }
            x = high;
        }
        partials.truncate(kept);
        partials.push(x);
    }
    let Some(mut n) = partials.len().checked_sub(1) else {
        return 0.0;
    };
    let mut high = partials[n];
    let mut low = 0.0;
    while n > 0 {
        let x = high;
        n -= 1;
        let y = partials[n];
        high = x + y;
        low = y - (high - x);
        if low != 0.0 {
            break;
        }
    }
    if n > 0 && ((low < 0.0 && partials[n - 1] < 0.0) || (low > 0.0 && partials[n - 1] > 0.0)) {
        let y = low * 2.0;
        let x = high + y;
        if y == x - high {
            high = x;
        }
    }
    high
}

/// The sum of `values` added one after the other, from the empty sum.
fn sum_in_order(values: &[f64]) -> ReproducibleSum {
    let mut sum = ReproducibleSum::default();
    for &value in values {
        sum.merge(&ReproducibleSum::of_f64(value));
    }
    sum
}

/// The sum of `values` combined as a tree `splits` shapes: each split cuts a range in two at a
/// place drawn from it, and the halves are summed apart and merged (as the NIC's steps merge).
fn sum_as_tree(values: &[f64], splits: &mut impl Iterator<Item = usize>) -> ReproducibleSum {
    if values.len() == 1 {
        return ReproducibleSum::of_f64(values[0]);
    }
    let at = 1 + splits.next().unwrap_or(0) % (values.len() - 1);
    let mut left = sum_as_tree(&values[..at], splits);
    let right = sum_as_tree(&values[at..], splits);
    if splits.next().unwrap_or(0) % 2 == 0 {
        left.merge(&right);
        left
    } else {
        let mut right = right;
        right.merge(&left);
        right
    }
}

/// Doubles of every kind of magnitude: binade and sign drawn, significand drawn.
fn any_finite() -> impl Strategy<Value = f64> {
    (any::<bool>(), -1074i32..1024, any::<u64>()).prop_map(|(negative, exponent, bits)| {
        let value = f64::from_bits(bits & ((1 << 52) - 1) | 0x3ff << 52) * 2f64.powi(exponent);
        let value = if value.is_finite() { value } else { f64::MAX };
        if negative { -value } else { value }
    })
}

/// Doubles in 12 binades from 2^`low` on, where a sum keeps every bit (the bins kept reach at
/// least 64 bits under the largest's leading bit, and each value has 53).
fn binades_from(low: i32) -> impl Strategy<Value = f64> {
    (any::<bool>(), low..low + 12, any::<u64>()).prop_map(|(negative, exponent, bits)| {
        let value = f64::from_bits(bits & ((1 << 52) - 1) | 0x3ff << 52) * 2f64.powi(exponent);
        if negative { -value } else { value }
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 512 },
        failure_persistence: if cfg!(miri) { None } else { ProptestConfig::default().failure_persistence },
        ..ProptestConfig::default()
    })]

    /// Whatever the order and the grouping, the same values give the same bits.
    #[test]
    fn the_sum_does_not_depend_on_order_or_grouping(
        values in proptest::collection::vec(any_finite(), 1..40),
        splits in proptest::collection::vec(any::<usize>(), 0..200),
        rotation in any::<usize>(),
    ) {
        let reference = sum_in_order(&values).to_f64().to_bits();
        let mut shuffled = values.clone();
        shuffled.rotate_left(rotation % values.len());
        shuffled.reverse();
        let tree = sum_as_tree(&shuffled, &mut splits.into_iter()).to_f64().to_bits();
        prop_assert_eq!(tree, reference);
        let bytes = sum_in_order(&shuffled).to_bytes();
        let back = ReproducibleSum::from_bytes(&bytes).unwrap();
        prop_assert_eq!(back.to_f64().to_bits(), reference);
    }

    /// Values close enough in magnitude lose no bit: the sum is the exact sum rounded once.
    #[test]
    fn a_sum_that_keeps_every_bit_is_correctly_rounded(
        values in (-1000i32..1000).prop_flat_map(|low| {
            proptest::collection::vec(binades_from(low), 1..40)
        }),
    ) {
        prop_assert_eq!(sum_in_order(&values).to_f64(), exact_sum(&values));
    }

    /// Values far apart lose what lies under the bins kept: less than 2^-64 of the largest
    /// magnitude each, so the sum is within that many of the exact sum rounded.
    #[test]
    fn a_cut_sum_is_within_its_bound(
        values in proptest::collection::vec(binades_from(-40), 1..40),
    ) {
        let largest = values.iter().fold(0f64, |m, v| m.max(v.abs()));
        let bound = values.len() as f64 * largest * 2f64.powi(-64);
        let exact = exact_sum(&values);
        let error = (sum_in_order(&values).to_f64() - exact).abs();
        prop_assert!(error <= bound + exact.abs() * f64::EPSILON, "{error} over {bound}");
    }

    /// One value alone comes back as it was, in both formats.
    #[test]
    fn one_value_comes_back_as_it_was(bits in any::<u64>(), small in any::<u32>()) {
        let value = f64::from_bits(bits);
        if !value.is_nan() {
            prop_assert_eq!(ReproducibleSum::of_f64(value).to_f64().to_bits(), bits);
        }
        let value = f32::from_bits(small);
        if !value.is_nan() {
            prop_assert_eq!(ReproducibleSum::of_f32(value).to_f32().to_bits(), small);
        }
    }

    /// Single precision rounds the exact sum once, not through double precision.
    #[test]
    fn single_precision_sums_are_rounded_once(
        values in proptest::collection::vec(-(1i32 << 24)..(1 << 24), 1..16),
        exponent in -8i32..8,
    ) {
        // Integers times a power of two: their sum is exact in an i64, and in binary64 too.
        let scale = 2f64.powi(exponent);
        let mut sum = ReproducibleSum::default();
        for &value in &values {
            sum.merge(&ReproducibleSum::of_f32((f64::from(value) * scale) as f32));
        }
        let exact: i64 = values.iter().map(|&v| i64::from(v)).sum();
        prop_assert_eq!(sum.to_f32(), (exact as f64 * scale) as f32);
    }

    /// Any 32 bytes are an accumulator: merging and rounding them never panics.
    #[test]
    fn any_bytes_merge_and_round(a in any::<[u8; 32]>(), b in any::<[u8; 32]>()) {
        let mut sum = ReproducibleSum::from_bytes(&a).unwrap();
        sum.merge(&ReproducibleSum::from_bytes(&b).unwrap());
        let _ = (sum.to_f64(), sum.to_f32(), sum.to_bytes());
    }
}

#[test]
fn infinities_nans_and_zeros_follow_ieee_754() {
    let sum = |values: &[f64]| sum_in_order(values).to_f64();
    assert_eq!(sum(&[]).to_bits(), (-0.0f64).to_bits(), "the empty sum");
    assert_eq!(sum(&[f64::INFINITY, 1.0]), f64::INFINITY);
    assert_eq!(sum(&[-1.0, f64::NEG_INFINITY]), f64::NEG_INFINITY);
    assert!(sum(&[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
    assert!(sum(&[1.0, f64::NAN, 2.0]).is_nan());
    assert_eq!(sum(&[-0.0, -0.0]).to_bits(), (-0.0f64).to_bits());
    assert_eq!(sum(&[-0.0, 0.0]).to_bits(), 0.0f64.to_bits());
    assert_eq!(sum(&[1.5, -1.5]).to_bits(), 0.0f64.to_bits());
    assert_eq!(sum(&[f64::MAX, f64::MAX]), f64::INFINITY);
    assert_eq!(sum(&[-f64::MAX, -f64::MAX]), f64::NEG_INFINITY);
    assert_eq!(sum(&[f64::MAX, f64::MAX, -f64::MAX]), f64::MAX);
    let tiny = f64::from_bits(1);
    assert_eq!(sum(&[tiny, tiny, tiny]), f64::from_bits(3));
    assert_eq!(sum(&[f64::MIN_POSITIVE, -tiny]), f64::MIN_POSITIVE - tiny);
}

#[test]
fn ties_round_to_even() {
    let sum = |values: &[f64]| sum_in_order(values).to_f64();
    let half_ulp = 2f64.powi(-53);
    assert_eq!(sum(&[1.0, half_ulp]), 1.0);
    assert_eq!(sum(&[1.0 + 2.0 * half_ulp, half_ulp]), 1.0 + 4.0 * half_ulp);
    assert_eq!(sum(&[-1.0, -half_ulp]), -1.0);
    // Just above a tie rounds up (2^-70 is within the bins kept under 1.0).
    assert_eq!(sum(&[1.0, half_ulp, 2f64.powi(-70)]), 1.0 + 2.0 * half_ulp);
    let single = |values: &[f32]| {
        let mut sum = ReproducibleSum::default();
        for &value in values {
            sum.merge(&ReproducibleSum::of_f32(value));
        }
        sum.to_f32()
    };
    let half_ulp = 2f32.powi(-24);
    assert_eq!(single(&[1.0, half_ulp]), 1.0);
    assert_eq!(
        single(&[1.0 + 2.0 * half_ulp, half_ulp]),
        1.0 + 4.0 * half_ulp
    );
}

#[test]
fn values_far_below_the_largest_are_cut_alike_in_every_order() {
    // 2^-80 lies more than 64 bits below 1.0's leading bit: cut whichever comes first.
    let small = 2f64.powi(-80);
    let one = |values: &[f64]| sum_in_order(values).to_f64();
    assert_eq!(one(&[1.0, small]), 1.0);
    assert_eq!(one(&[small, 1.0]), 1.0);
    assert_eq!(one(&[small, small]), 2.0 * small);
    // 2^-60 is kept: 1 + 2^-60 rounds to 1, but 2^8 of them add up to 1 + 2^-52, in any
    // order (added one by one to 1.0 in binary64, they would leave 1.0).
    let kept = 2f64.powi(-60);
    let mut values = std::vec![kept; 256];
    values.push(1.0);
    assert_eq!(one(&values), 1.0 + 2f64.powi(-52));
    values.rotate_right(1);
    assert_eq!(one(&values), 1.0 + 2f64.powi(-52));
}
