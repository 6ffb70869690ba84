//! Numeric comparisons for the workspace's tests.
//!
//! `fold(0.0, f32::max)` skips NaN (`f32::max` returns the other operand), so a maximum
//! difference computed that way calls NaN logits or gradients "equal". Every function here
//! panics instead, naming what was compared and the first index that is not finite.
//! Values are compared in f64, so f32 and f64 sides mix. [`mod@reference`] holds the losses of
//! one chunk in plain f64. [`process::alone`] runs a test in a process of its own;
//! [`files::snapshot`] records a directory to see what a command changed in it.
//! `backend::Counted` (feature `backend`) is a burn backend as it is, with its reads to the host
//! counted and the tensors it makes recordable.

#[cfg(feature = "backend")]
pub mod backend;
pub mod files;
pub mod process;
pub mod reference;

/// Unit roundoff of bfloat16 (8 significant bits): rounding to nearest moves a value by at
/// most this fraction of itself.
pub const BF16_UNIT_ROUNDOFF: f64 = 1.0 / 512.0;

/// Unit roundoff of IEEE half precision (11 significant bits).
pub const F16_UNIT_ROUNDOFF: f64 = 1.0 / 2048.0;

/// How far rounding every weight of the parity fixtures' models (2 layers of 7 matrices, the
/// embedding and the head: 16 rounded tensors) to a format of unit roundoff `u` may move their
/// logits: to first order each rounded tensor moves a logit by at most `u · max|z|`, and the
/// bound lets all 16 add up with the same sign. Errors of random sign stay well inside it
/// (about 7 · u · max|z| measured for bf16 and f16).
pub fn rounding_bound(u: f64, max_logit: f64) -> f64 {
    16.0 * u * max_logit
}

/// How far computing in a format of unit roundoff `u` (weights in f32, every matmul's two
/// operands and its result rounded, as mixed precision does) may move the parity fixtures'
/// logits: at most 19 matmuls lie between the embedding and a logit (2 layers of 7
/// projections and attention's 2 products, then the head), each with 3 roundings that move
/// its result by at most `u` of it to first order; as in [`rounding_bound`], all may add up
/// with the same sign.
pub fn compute_rounding_bound(u: f64, max_logit: f64) -> f64 {
    57.0 * u * max_logit
}

/// The bfloat16 bits of a finite f32, rounded to nearest with ties to even: the upper 16 bits
/// after adding half an ulp of bf16 (plus one when the kept part is odd). Plain integer
/// arithmetic, independent of any half-precision library.
pub fn bf16_bits(x: f32) -> u16 {
    assert!(x.is_finite(), "{x} is not finite");
    let bits = x.to_bits();
    let odd = (bits >> 16) & 1;
    ((bits + 0x7FFF + odd) >> 16) as u16
}

/// Panics unless every value is finite, naming `what` and the first offending index.
pub fn assert_finite<T: Copy + Into<f64>>(what: &str, values: &[T]) {
    if let Some((i, v)) = values
        .iter()
        .map(|&v| v.into())
        .enumerate()
        .find(|(_, v): &(usize, f64)| !v.is_finite())
    {
        panic!("{what}[{i}] = {v}: not finite");
    }
}

/// The largest `|value|` (0 for none); panics on a value that is not finite.
pub fn max_abs<T: Copy + Into<f64>>(what: &str, values: &[T]) -> f64 {
    assert_finite(what, values);
    values.iter().map(|&v| v.into().abs()).fold(0.0, f64::max)
}

/// The root mean square (0 for none); panics on a value that is not finite.
pub fn rms<T: Copy + Into<f64>>(what: &str, values: &[T]) -> f64 {
    assert_finite(what, values);
    if values.is_empty() {
        return 0.0;
    }
    let sum: f64 = values.iter().map(|&v| v.into().powi(2)).sum();
    (sum / values.len() as f64).sqrt()
}

/// The largest `|a_i − b_i|`; panics when the lengths differ or either side holds a value that
/// is not finite.
pub fn max_abs_diff<A, B>(what: &str, a: &[A], b: &[B]) -> f64
where
    A: Copy + Into<f64>,
    B: Copy + Into<f64>,
{
    assert_comparable(what, a, b);
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x.into() - y.into()).abs())
        .fold(0.0, f64::max)
}

/// Two sides of one length, every value finite.
fn assert_comparable<A, B>(what: &str, a: &[A], b: &[B])
where
    A: Copy + Into<f64>,
    B: Copy + Into<f64>,
{
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    assert_finite(&format!("{what} (left)"), a);
    assert_finite(&format!("{what} (right)"), b);
}

/// Asserts `|got_i − want_i| ≤ abs + rel · |want_i|` for every `i`, naming the first element
/// outside it; panics on different lengths or on any value that is not finite.
pub fn assert_close<A, B>(what: &str, got: &[A], want: &[B], abs: f64, rel: f64)
where
    A: Copy + Into<f64>,
    B: Copy + Into<f64>,
{
    assert_comparable(what, got, want);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w): (f64, f64) = (g.into(), w.into());
        let bound = abs + rel * w.abs();
        assert!(
            (g - w).abs() <= bound,
            "{what}[{i}]: {g} vs {w} (|Δ| = {:e} > {bound:e})",
            (g - w).abs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "not finite")]
    fn nan_is_not_a_small_difference() {
        max_abs_diff("logits", &[1.0f32, f32::NAN], &[1.0f32, 2.0]);
    }

    #[test]
    #[should_panic(expected = "not finite")]
    fn infinity_on_the_expected_side_fails_too() {
        max_abs_diff("logits", &[1.0f32], &[f64::INFINITY]);
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn lengths_must_agree() {
        max_abs_diff("logits", &[1.0f32], &[1.0f32, 2.0]);
    }

    #[test]
    fn the_largest_difference_wins() {
        assert_eq!(
            max_abs_diff("x", &[1.0f32, 5.0, -2.0], &[1.5f64, 5.0, 1.0]),
            3.0
        );
        assert_eq!(max_abs("x", &[-4.0f32, 2.0]), 4.0);
        assert_eq!(rms("x", &[3.0f32, -3.0]), 3.0);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even 1.
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3F80);
        // 1 + 3 · 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3F82);
        // Just above the halfway point rounds up; truncation would not.
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(bf16_bits(-2.0), 0xC000);
    }

    #[test]
    #[should_panic(expected = "x[1]")]
    fn close_names_the_element() {
        assert_close("x", &[1.0f32, 2.5], &[1.0f32, 2.0], 0.1, 0.1);
    }

    #[test]
    #[should_panic(expected = "not finite")]
    fn close_fails_on_nan() {
        assert_close("x", &[f32::NAN], &[1.0f32], 1e9, 1e9);
    }
}
