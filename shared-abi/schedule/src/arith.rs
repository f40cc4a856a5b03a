//! The modular arithmetic of the schedules, one copy for the compilers and the cost model.

/// `⌊log2 members⌋`, for `members >= 1`.
pub fn floor_log2(members: usize) -> usize {
    members.checked_ilog2().unwrap_or(0) as usize
}

/// `⌈log_{n+1} members⌉`: the smallest `R` with `(n+1)^R >= members`, for `n >= 1`.
pub fn dissemination_rounds(members: usize, n: usize) -> usize {
    let mut rounds = 0;
    let mut span = 1usize;
    while span < members {
        span = span.saturating_mul(n.saturating_add(1));
        rounds += 1;
    }
    rounds
}

/// How many of the offsets `j·stride mod members`, `j = 1..=n`, are distinct and non-zero; they
/// are exactly those of `j = 1..=count`.
///
/// `j·stride ≡ j'·stride (mod members)` exactly when `members / gcd(stride, members)` divides
/// `j - j'`; so with `period = members / gcd(stride, members)`, `j = 1..period` give every
/// distinct non-zero offset once, `j = period` gives zero (the rank itself), and larger `j`
/// repeat.
pub fn distinct_offsets(members: usize, n: usize, stride: usize) -> usize {
    let period = members / gcd(stride, members).max(1);
    n.min(period.saturating_sub(1))
}

/// The greatest common divisor of `a` and `b` (`gcd(a, 0) = a`).
pub fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `(a + b) mod modulus` for `a, b < modulus`, without overflow.
pub fn add_mod(a: usize, b: usize, modulus: usize) -> usize {
    let room = modulus - b;
    if a >= room { a - room } else { a + b }
}

/// `(a - b) mod modulus` for `a, b < modulus`.
pub fn sub_mod(a: usize, b: usize, modulus: usize) -> usize {
    if a >= b { a - b } else { a + (modulus - b) }
}

/// `(a · b) mod modulus`, without overflow.
pub fn mul_mod(a: usize, b: usize, modulus: usize) -> usize {
    // The product fits 64 bits for every group a NIC serves; u128 division is several times
    // slower, and the cost model runs this once per dissemination step of 65,536 ranks.
    match (a as u64).checked_mul(b as u64) {
        Some(product) => (product % modulus as u64) as usize,
        None => ((a as u128 * b as u128) % modulus as u128) as usize,
    }
}
