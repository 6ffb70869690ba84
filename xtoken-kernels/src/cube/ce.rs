//! Next-token cross-entropy on the device: `row_lse`, `cross_entropy_terms`,
//! `cross_entropy_grad` and the mean.

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::kernels;
use super::launch::{
    finish, float_dtype, logits_shape, note, row_lse, scaled_sum, Cube, Launcher, RowLse, RowPass,
    Streams,
};
use crate::checks::checked_targets;
use crate::error::KernelError;
use crate::LossOutput;

/// Mean next-token cross-entropy.
pub(super) fn evaluate<B: Cube<R>, R: CubeRuntime>(
    logits: CubeTensor<R>,
    targets: &[i32],
    want_grad: bool,
) -> Result<LossOutput<B>, KernelError> {
    let z = into_contiguous(logits);
    let [b, t, v] = logits_shape(&z, "student logits")?;
    let n = b * t;
    let compared = checked_targets(targets, n, v, "cross-entropy targets")?;
    let launcher = Launcher::of(&z, n * v);
    let counted = compared.len();
    let inv = if counted > 0 {
        1.0 / counted as f32
    } else {
        0.0
    };
    let target_array = launcher.ints(targets);
    let RowLse { lse, bad, .. } = row_lse(&launcher, &z, (n, v, 1.0), RowPass::plain());
    let terms = launcher.zeros(n, DType::F32);
    let (count, dim) = launcher.elementwise(n);
    note(
        "cross_entropy_terms",
        Streams::logits(n * z.dtype.size()) + Streams::other(n * 8),
        Streams::other(n * 4),
    );
    unsafe {
        kernels::cross_entropy_terms::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            z.clone().into_array_arg(),
            lse.clone().into_array_arg(),
            target_array.clone().into_array_arg(),
            terms.clone().into_array_arg(),
            n,
            v,
            float_dtype(&z),
        );
    }
    let grad_logits = want_grad.then(|| {
        let grad = launcher.empty(Shape::new([b, t, v]), z.dtype);
        let (count, dim) = launcher.elementwise(n * v);
        let bytes = n * v * z.dtype.size();
        note(
            "cross_entropy_grad",
            Streams::logits(bytes) + Streams::other(n * 8),
            Streams::gradient(bytes),
        );
        unsafe {
            kernels::cross_entropy_grad::launch_unchecked::<R>(
                &launcher.client,
                count,
                dim,
                launcher.address,
                z.clone().into_array_arg(),
                lse.clone().into_array_arg(),
                target_array.clone().into_array_arg(),
                grad.clone().into_array_arg(),
                n,
                v,
                inv,
                float_dtype(&z),
            );
        }
        grad
    });
    let value = scaled_sum(&launcher, &terms, n, inv);
    let output = LossOutput {
        value,
        grad_logits,
        grad_weights: None,
    };
    let rows = compared.iter().map(|&(row, _)| row);
    finish::<B, R>(&launcher, output, (bad, rows), "cross-entropy")
}
