//! Dynamic KD/CE scaling (paper §2.8): `L = sg(γ) · L_KD + L_CE` with `γ = L_CE / L_KD`, so
//! that KD's gradient `γ ∇L_KD` follows CE's scale however the two drift.
//!
//! The paper's ratio assumes `L_KD > 0`. The losses here can take any finite value: a merged
//! multi-token chunk is not normalized (its mass is the continuation probability), and the
//! teacher's top-K is not re-normalized, so a chunk's KL can be negative (the book's page on the
//! losses states the definitions). The ratio is therefore taken on the magnitude, with a floor:
//!
//! `γ = L_CE / max(|L_KD|, KD_FLOOR)`
//!
//! - `|L_KD| ≥ KD_FLOOR`: the paper's ratio in magnitude; the KD term's value is `±L_CE`.
//! - `|L_KD| < KD_FLOOR` (KD at or near 0, of either sign): `γ = L_CE / KD_FLOOR`, so `γ` stays
//!   bounded and continuous instead of exploding at 0 or vanishing below it.
//!
//! `γ ≥ 0` always: KD's gradient keeps its direction whatever the sign of its value.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// The smallest `|L_KD|` the ratio divides by (the paper gives none: its KD is positive).
pub const KD_FLOOR: f64 = 1e-3;

/// `γ = L_CE / max(|L_KD|, KD_FLOOR)` of two loss values.
pub fn ratio_of(ce: f64, kd: f64) -> f64 {
    ce / kd.abs().max(KD_FLOOR)
}

/// `γ` of two `[1]` losses, detached from the graph (the stop-gradient).
pub fn ratio<B: Backend>(ce: Tensor<B, 1>, kd: Tensor<B, 1>) -> Tensor<B, 1> {
    (ce / kd.abs().clamp_min(KD_FLOOR)).detach()
}

/// Combines the cross-entropy and the (multi-teacher) KD loss of one batch, both `[1]`:
/// `sg(γ) · L_KD + L_CE`.
pub fn dynamic<B: Backend>(ce: Tensor<B, 1>, kd: Tensor<B, 1>) -> Tensor<B, 1> {
    ratio(ce.clone(), kd.clone()) * kd + ce
}

/// The value `dynamic` gives for two loss values (what a step reports as its loss).
pub fn dynamic_value(ce: f64, kd: f64) -> f64 {
    ratio_of(ce, kd) * kd + ce
}
