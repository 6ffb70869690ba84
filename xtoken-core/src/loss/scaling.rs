//! Dynamic KD/CE scaling (paper §2.8): `L = sg(L_CE / L_KD) · L_KD + L_CE`. The value is
//! `2 · L_CE`; the gradient is `(L_CE / L_KD) ∇L_KD + ∇L_CE`, so KD's step size follows CE's
//! scale however the two drift.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// Combines the cross-entropy and the (multi-teacher) KD loss, both `[1]`. When `L_KD` is 0
/// there is nothing to rescale and the KD term is dropped.
pub fn dynamic<B: Backend>(ce: Tensor<B, 1>, kd: Tensor<B, 1>) -> Tensor<B, 1> {
    let positive = kd.clone().greater_elem(0.0);
    let ratio = (ce.clone() / kd.clone().clamp_min(f32::MIN_POSITIVE))
        .mask_fill(positive.bool_not(), 0.0)
        .detach();
    ratio * kd + ce
}
