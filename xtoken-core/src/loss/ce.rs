//! Next-token cross-entropy of the student, fused like the distillation losses: row chunks,
//! gradient `(softmax − onehot)/n` computed in the same pass, no full-vocabulary copies.

use burn::tensor::{Tensor, TensorPrimitive};

use super::{kernel_error, LossParams, XTokenBackend};
use crate::error::{Error, Result};

/// The mean cross-entropy `[1]` of logits `[B, T, V]` against `next_token` `[B·T]` (the token
/// each position predicts, `-1` to skip; [`crate::plan::SideIndices::next_token`] is this array).
pub fn loss<B: XTokenBackend>(
    logits: Tensor<B, 3>,
    next_token: &[i32],
    params: &LossParams,
) -> Result<Tensor<B, 1>> {
    params.validate()?;
    let [batch, len, _] = logits.dims();
    if next_token.len() != batch * len {
        return Err(Error::Shape {
            what: "next tokens",
            expected: format!("{} entries (B·T)", batch * len),
            found: next_token.len().to_string(),
        });
    }
    let logits = logits.into_primitive().tensor();
    let out = B::xt_cross_entropy(logits, next_token, params.row_chunk, false)
        .map_err(|e| kernel_error(e, len, len))?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out.value)))
}
