//! KL on the device: `kl_slots`, the fused log-softmax + top-K KL (one cube per compared slot),
//! then the predicting rows' dense gradient and the sparse teacher term `kl_grad_sparse`.

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::distill::{Evaluation, GradMode};
use super::kernels::{self, BLOCK};
use super::launch::{note, Cube, Streams};
use crate::error::KernelError;
use crate::LossOutput;

/// Same-tokenizer KL.
pub(super) fn evaluate<B: Cube<R>, R: CubeRuntime>(
    e: Evaluation<'_, R>,
) -> Result<LossOutput<B>, KernelError> {
    let (launcher, plan) = (&e.launcher, &e.plan);
    let (count, dim) = launcher.per_item(plan.valid);
    let entries = plan.valid * e.k;
    note(
        "kl_slots",
        Streams::logits(entries * e.z.dtype.size()) + Streams::other(entries * 8),
        Streams::other(plan.valid * 8),
    );
    unsafe {
        kernels::kl_slots::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            e.z.clone().into_array_arg(),
            e.lse.clone().into_array_arg(),
            e.sigma.clone().into_array_arg(),
            plan.valid_slot.clone().into_array_arg(),
            plan.valid_row.clone().into_array_arg(),
            e.teacher_ids.clone().into_array_arg(),
            e.teacher_logp.clone().into_array_arg(),
            e.loss.clone().into_array_arg(),
            e.dsigma.clone().into_array_arg(),
            plan.valid,
            e.k,
            e.v,
            e.tau_inv,
            BLOCK,
            e.dtype,
        );
    }
    if let Some(grad) = &e.grad {
        e.predicting_grad(GradMode::Kl);
        sparse_grad(&e, grad);
    }
    e.finish::<B>(None)
}

/// Adds `−c · q` at each kept teacher id of each compared slot's predicting row.
fn sparse_grad<R: CubeRuntime>(e: &Evaluation<'_, R>, grad: &CubeTensor<R>) {
    let (launcher, plan) = (&e.launcher, &e.plan);
    let (count, dim) = launcher.elementwise(plan.valid * e.k);
    let entries = plan.valid * e.k;
    note(
        "kl_grad_sparse",
        Streams::gradient(entries * e.z.dtype.size()) + Streams::other(entries * 8),
        Streams::gradient(entries * e.z.dtype.size()),
    );
    unsafe {
        kernels::kl_grad_sparse::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            grad.clone().into_array_arg(),
            plan.valid_slot.clone().into_array_arg(),
            plan.valid_row.clone().into_array_arg(),
            e.teacher_ids.clone().into_array_arg(),
            e.teacher_logp.clone().into_array_arg(),
            plan.valid,
            e.k,
            e.v,
            e.c,
            e.dtype,
        );
    }
}
