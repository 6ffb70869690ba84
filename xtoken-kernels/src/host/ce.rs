//! Next-token cross-entropy on the host: the mean over rows with a target, and its gradient
//! `(p − e_y)/count` in the same pass.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::distill::{on_tensor_rows, HostLoss};
use super::merge::{finite, softmax_into};
use super::rows::{par_items, GradRows, LogitRows};
use crate::checks::{checked_targets, finite_loss};
use crate::error::KernelError;
use crate::LossOutput;

/// Cross-entropy on any backend (see [`crate::XTokenBackend::xt_cross_entropy`]).
pub fn cross_entropy<B: Backend>(
    logits: FloatTensor<B>,
    targets: &[i32],
    row_chunk: usize,
    want_grad: bool,
) -> Result<LossOutput<B>, KernelError> {
    on_tensor_rows(logits, None, |src| {
        cross_entropy_from(src, targets, row_chunk, want_grad)
    })
}

/// Cross-entropy from rows of the logits; `targets[row]` is the token `row` predicts (`-1`:
/// none).
pub fn cross_entropy_from<S: LogitRows>(
    src: &S,
    targets: &[i32],
    row_chunk: usize,
    want_grad: bool,
) -> Result<HostLoss, KernelError> {
    let (n, v) = (src.rows(), src.vocab());
    let mut grad = if want_grad {
        vec![0.0f32; n * v]
    } else {
        Vec::new()
    };
    let rows = checked_targets(targets, n, v, "cross-entropy targets")?;
    let value = if rows.is_empty() {
        0.0
    } else {
        mean_over(src, &rows, row_chunk.max(1), &mut grad)?
    };
    Ok(HostLoss {
        value: finite_loss(value, "cross-entropy")?,
        grad_logits: want_grad.then_some(grad),
        grad_weights: None,
    })
}

/// The mean loss over `(row, target)` pairs, adding each row's gradient into `grad` (when it
/// is not empty).
fn mean_over<S: LogitRows>(
    src: &S,
    rows: &[(u32, u32)],
    row_chunk: usize,
    grad: &mut [f32],
) -> Result<f64, KernelError> {
    let v = src.vocab();
    let inv = 1.0 / rows.len() as f64;
    let mut grad_rows = GradRows::new(grad, v);
    let mut total = 0.0f64;
    let mut buffers = Vec::new();
    for chunk in rows.chunks(row_chunk) {
        let ids: Vec<u32> = chunk.iter().map(|&(r, _)| r).collect();
        let block = src.read(&ids, "student")?;
        let mut items = grad_rows.lend(&ids);
        let losses = par_items(
            &mut items,
            &mut buffers,
            || vec![0.0f32; v],
            |p, item| {
                let z = block.row(item.index, item.row, v);
                let lse = softmax_into(z, 1.0, p);
                let y = chunk[item.index].1 as usize;
                if let Some(out) = item.grad.as_deref_mut() {
                    let inv = inv as f32;
                    for (g, &pj) in out.iter_mut().zip(p.iter()) {
                        *g += pj * inv;
                    }
                    out[y] -= inv;
                }
                (lse, (lse - z[y]) as f64)
            },
        );
        grad_rows.give_back(items);
        for (i, (lse, loss)) in losses.into_iter().enumerate() {
            finite(lse, "student", chunk[i].0)?;
            total += loss;
        }
    }
    Ok(total * inv)
}
