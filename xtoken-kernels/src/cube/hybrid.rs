//! GOLD, H-KL and ULD on the device: `row_lse` has summed each row's uncommon mass in its
//! pass; `top_k` selects the student's largest uncommon probabilities (the common ids masked),
//! `hybrid_slots` computes the common KL and the sorted L1 per compared slot, then the
//! predicting rows' dense gradient and `hybrid_grad_sparse`.

use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::distill::{Evaluation, GradMode};
use super::kernels::{self, BLOCK};
use super::launch::{note, top_k, Cube, Streams, TopK};
use crate::error::KernelError;
use crate::LossOutput;

/// The common set's tables on the device and the student's selected uncommon entries.
struct Common<R: CubeRuntime> {
    student_partner: CubeTensor<R>,
    /// Per teacher id, where its student partners start in `teacher_students` (`V_T + 1`).
    teacher_first: CubeTensor<R>,
    teacher_students: CubeTensor<R>,
    /// Student ids without a partner.
    uncommon: usize,
    /// Uncommon entries selected per slot: `min(k, uncommon)`.
    selected: usize,
    selected_ids: CubeTensor<R>,
    selected_logp: CubeTensor<R>,
    lambda_kl: f32,
    lambda_uld: f32,
}

/// GOLD, H-KL or ULD, by the common set of the spec's loss.
pub(super) fn evaluate<B: Cube<R>, R: CubeRuntime>(
    e: Evaluation<'_, R>,
) -> Result<LossOutput<B>, KernelError> {
    let common = select_uncommon(&e)?;
    let (launcher, plan) = (&e.launcher, &e.plan);
    let slots = e.spec.merge.slots();
    let rest = launcher.zeros(slots * e.k, DType::F32);
    let corrections = launcher.zeros(slots * common.selected, DType::F32);
    let uncommon_mass = e.mass.as_ref().ok_or(KernelError::Invalid {
        what: "loss",
        why: "the hybrid losses need the rows' uncommon mass".into(),
    })?;
    let (count, dim) = launcher.per_item(plan.valid);
    let (valid, k, selected) = (plan.valid, e.k, common.selected);
    // Per slot: the kept entries and their partners (a gathered logit each), the packing of
    // the unpartnered ones, the selected entries.
    note(
        "hybrid_slots",
        Streams::logits(valid * k * e.z.dtype.size())
            + Streams::other(valid * (k * 28 + selected * 8 + 12)),
        Streams::other(valid * (k * 4 + selected * 4 + 8)),
    );
    unsafe {
        kernels::hybrid_slots::launch_unchecked::<R>(
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
            common.teacher_first.clone().into_array_arg(),
            common.teacher_students.clone().into_array_arg(),
            uncommon_mass.clone().into_array_arg(),
            common.selected_logp.clone().into_array_arg(),
            rest.clone().into_array_arg(),
            corrections.clone().into_array_arg(),
            e.loss.clone().into_array_arg(),
            e.dsigma.clone().into_array_arg(),
            plan.valid,
            e.k,
            common.selected,
            common.uncommon,
            e.v,
            e.tau_inv,
            common.lambda_kl,
            common.lambda_uld,
            BLOCK,
            e.dtype,
        );
    }
    if let Some(grad) = &e.grad {
        e.predicting_grad(GradMode::Hybrid {
            student_partner: &common.student_partner,
            lambda_uld: common.lambda_uld,
        });
        sparse_grad(&e, &common, &corrections, grad);
    }
    e.finish::<B>(None)
}

/// Uploads the rest of the common set's tables and selects, per compared slot, the student's
/// largest uncommon probabilities, best first, from the split the row pass made.
fn select_uncommon<R: CubeRuntime>(e: &Evaluation<'_, R>) -> Result<Common<R>, KernelError> {
    let (lambda_kl, lambda_uld) = e.spec.hybrid_lambdas();
    let (launcher, plan) = (&e.launcher, &e.plan);
    let missing = |what: &str| KernelError::Invalid {
        what: "loss",
        why: format!("the hybrid losses need {what} from the row pass"),
    };
    let tables = e.hybrid.as_ref().ok_or_else(|| missing("the common set"))?;
    let selected = tables.selected(e.k);
    let slots = e.spec.merge.slots();
    let common = Common {
        student_partner: tables.partner.clone(),
        teacher_first: launcher.ints(&tables.pairs.teacher_first),
        teacher_students: launcher.ints(&tables.pairs.teacher_students),
        uncommon: tables.uncommon,
        selected,
        selected_ids: launcher.zeros(slots * selected, DType::I32),
        selected_logp: launcher.zeros(slots * selected, DType::F32),
        lambda_kl,
        lambda_uld,
    };
    if selected == 0 {
        return Ok(common);
    }
    let splits = e
        .splits
        .as_ref()
        .ok_or_else(|| missing("the rows' split"))?;
    let to = TopK {
        lse: &e.lse,
        sigma: &e.sigma,
        splits,
        excluded: Some(&common.student_partner),
        ids: &common.selected_ids,
        values: &common.selected_logp,
    };
    top_k(launcher, &e.z, plan, to, (e.v, selected, e.tau_inv));
    Ok(common)
}

/// The sparse terms: the common KL at each partner, and the sorted L1's corrections at the
/// selected uncommon ids.
fn sparse_grad<R: CubeRuntime>(
    e: &Evaluation<'_, R>,
    common: &Common<R>,
    corrections: &CubeTensor<R>,
    grad: &CubeTensor<R>,
) {
    let (launcher, plan) = (&e.launcher, &e.plan);
    let (count, dim) = launcher.elementwise(plan.valid * (e.k + common.selected));
    let entries = plan.valid * (e.k + common.selected);
    note(
        "hybrid_grad_sparse",
        Streams::gradient(entries * e.z.dtype.size()) + Streams::other(entries * 16),
        Streams::gradient(entries * e.z.dtype.size()),
    );
    unsafe {
        kernels::hybrid_grad_sparse::launch_unchecked::<R>(
            &launcher.client,
            count,
            dim,
            launcher.address,
            grad.clone().into_array_arg(),
            plan.valid_slot.clone().into_array_arg(),
            plan.valid_row.clone().into_array_arg(),
            e.teacher_ids.clone().into_array_arg(),
            e.teacher_logp.clone().into_array_arg(),
            common.teacher_first.clone().into_array_arg(),
            common.teacher_students.clone().into_array_arg(),
            common.selected_ids.clone().into_array_arg(),
            corrections.clone().into_array_arg(),
            plan.valid,
            e.k,
            common.selected,
            e.v,
            e.c,
            common.lambda_kl,
            common.lambda_uld,
            e.dtype,
        );
    }
}
