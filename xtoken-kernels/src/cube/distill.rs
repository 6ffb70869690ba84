//! The launch context every distillation loss shares on the device: the checks, the merge plan
//! as arrays, the row log-sum-exps and merge shifts, the loss and `Σh` buffers, the gradient
//! (its idle rows zeroed), the predicting rows' gradient kernel, and the end of the evaluation:
//! the continuation rows' gradient, the loss's sum and the read-back checks.

use std::sync::Arc;

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::kernels;
use super::launch::{
    as_f32, as_i32, finish, float_dtype, int_range, logits_shape, merge_shifts, note, row_lse,
    scaled_sum, Cube, Launcher, PlanArrays, RowLse, RowPass, Split, Streams,
};
use super::pkl::Projection;
use crate::checks::{check_id_range, check_tau, check_teacher};
use crate::error::KernelError;
use crate::loss_kind::LossKind;
use crate::spec::{CommonPairs, DistillSpec};
use crate::{LossOutput, ProjectionTensors, TeacherEntries};

/// The state one distillation evaluation's launches share.
pub(super) struct Evaluation<'s, R: CubeRuntime> {
    pub(super) launcher: Launcher<R>,
    pub(super) spec: &'s DistillSpec,
    /// The student logits `[B, T, V_S]`, contiguous.
    pub(super) z: CubeTensor<R>,
    /// `V_S`.
    pub(super) v: usize,
    /// Teacher entries per slot.
    pub(super) k: usize,
    /// `V_T`.
    pub(super) teacher_vocab: usize,
    pub(super) teacher_ids: CubeTensor<R>,
    pub(super) teacher_logp: CubeTensor<R>,
    pub(super) plan: PlanArrays<R>,
    pub(super) lse: CubeTensor<R>,
    bad: CubeTensor<R>,
    pub(super) sigma: CubeTensor<R>,
    /// Per compared slot, its loss term.
    pub(super) loss: CubeTensor<R>,
    /// Per slot, `Σh`: the loss's derivative with respect to the slot's merge shift.
    pub(super) dsigma: CubeTensor<R>,
    /// `∂loss/∂z` `[B, T, V_S]`, when requested.
    pub(super) grad: Option<CubeTensor<R>>,
    pub(super) tau_inv: f32,
    /// The mean's scale `τ² / valid`.
    pub(super) scale: f32,
    /// The gradient's scale `scale / τ`.
    pub(super) c: f32,
    pub(super) dtype: StorageType,
    /// Slots per P-KL launch (its scattered buffer is `[chunk, V_T]`).
    pub(super) chunk: usize,
    /// Per row, the mass `row_lse` weighed: P-KL's `ρ`, the hybrid losses' uncommon mass.
    pub(super) mass: Option<CubeTensor<R>>,
    /// P-KL's W with its layout and buffers.
    pub(super) projection: Option<Projection<R>>,
    /// The hybrid losses' common set, checked and uploaded once for the evaluation.
    pub(super) hybrid: Option<HybridTables<R>>,
    /// The hybrid losses' split of each row for their uncommon top-K (see `row_lse`).
    pub(super) splits: Option<CubeTensor<R>>,
}

/// The teacher's ids lie in the vocabulary they index (the student's for KL, which reads them
/// as student ids): read back only when the extraction did not make them so.
fn check_teacher_ids<B: Cube<R>, R: CubeRuntime>(
    teacher: &TeacherEntries<B>,
    spec: &DistillSpec,
    v: usize,
    slots: usize,
) -> Result<(), KernelError> {
    let id_limit = if spec.loss == LossKind::Kl {
        v
    } else {
        teacher.vocab
    };
    let known = teacher.ids_in_vocab && teacher.vocab <= id_limit;
    if slots * teacher.k > 0 && !known {
        let range = int_range::<B, R>(&teacher.ids, "teacher ids")?;
        check_id_range(range, 0, id_limit, "teacher ids", "token")?;
    }
    Ok(())
}

/// The widths a loss's buffers are sized by.
#[derive(Clone, Copy)]
pub(super) struct Widths {
    /// `V_S`.
    pub(super) v: usize,
    /// `V_T`.
    pub(super) vt: usize,
    /// Slots per P-KL launch.
    pub(super) chunk: usize,
    /// Teacher entries per slot.
    pub(super) k: usize,
}

/// The hybrid losses' common set: its tables, the student partner table on the device (`[V_S]`,
/// `-1`: uncommon) and how many student ids are uncommon.
pub(super) struct HybridTables<R: CubeRuntime> {
    pub(super) pairs: Arc<CommonPairs>,
    pub(super) partner: CubeTensor<R>,
    pub(super) uncommon: usize,
}

impl<R: CubeRuntime> HybridTables<R> {
    /// Uncommon entries selected per slot: `min(k, uncommon)`.
    pub(super) fn selected(&self, k: usize) -> usize {
        k.min(self.uncommon)
    }
}

/// What the row pass weighs and splits, by loss: W's row sums for P-KL; for the hybrid losses 1
/// on the student ids without a partner, and the split of their uncommon top-K (the partners
/// excluded); nothing more for KL.
struct RowTables<R: CubeRuntime> {
    weights: Option<CubeTensor<R>>,
    hybrid: Option<HybridTables<R>>,
    /// Teacher entries per slot.
    k: usize,
}

impl<R: CubeRuntime> RowTables<R> {
    fn new(
        launcher: &Launcher<R>,
        spec: &DistillSpec,
        projection: Option<&Projection<R>>,
        w: Widths,
    ) -> Result<Self, KernelError> {
        let none = Self {
            weights: None,
            hybrid: None,
            k: w.k,
        };
        Ok(match spec.loss {
            LossKind::Kl => none,
            LossKind::Pkl => Self {
                weights: projection.map(|p| p.row_mass.clone()),
                ..none
            },
            LossKind::Gold | LossKind::Hkl | LossKind::Uld => {
                let pairs = spec.hybrid_pairs(w.v, w.vt)?;
                let uncommon: Vec<f32> = pairs
                    .student_partner
                    .iter()
                    .map(|&p| if p < 0 { 1.0 } else { 0.0 })
                    .collect();
                let hybrid = HybridTables {
                    partner: launcher.ints(&pairs.student_partner),
                    uncommon: uncommon.iter().filter(|&&u| u > 0.0).count(),
                    pairs,
                };
                Self {
                    weights: Some(launcher.floats(&uncommon)),
                    hybrid: Some(hybrid),
                    ..none
                }
            }
        })
    }

    fn pass(&self) -> RowPass<'_, R> {
        let split = match &self.hybrid {
            Some(h) if h.selected(self.k) > 0 => Some(Split {
                keep: h.selected(self.k),
                excluded: Some(&h.partner),
            }),
            _ => None,
        };
        RowPass {
            weights: self.weights.as_ref(),
            split,
        }
    }
}

impl<'s, R: CubeRuntime> Evaluation<'s, R> {
    /// Checks the inputs and runs the launches every loss starts with.
    pub(super) fn new<B: Cube<R>>(
        logits: CubeTensor<R>,
        teacher: TeacherEntries<B>,
        projection: Option<ProjectionTensors<B>>,
        spec: &'s DistillSpec,
        want_logits: bool,
    ) -> Result<Self, KernelError> {
        check_tau(spec.tau)?;
        let z = into_contiguous(logits);
        let [b, t, v] = logits_shape(&z, "student logits")?;
        let n = b * t;
        spec.merge.check("student", n, v)?;
        let slots = spec.merge.slots();
        check_teacher(&teacher, slots)?;
        check_teacher_ids::<B, R>(&teacher, spec, v, slots)?;
        let k = teacher.k;
        let valid = spec.merge.valid();
        let chunk = spec.row_chunk.max(1).min(valid.max(1));
        let launcher = Launcher::of(&z, (slots * k).max(chunk * teacher.vocab));
        let tau_inv = 1.0 / spec.tau;
        let scale = if valid > 0 {
            spec.tau * spec.tau / valid as f32
        } else {
            0.0
        };
        let plan = PlanArrays::new(&spec.merge, &launcher);
        let teacher_ids = as_i32::<B, R>(teacher.ids);
        let teacher_logp = as_f32::<B, R>(teacher.logp);
        let dtype = float_dtype(&z);
        let shape = Widths {
            v,
            vt: teacher.vocab,
            chunk,
            k,
        };
        let projection = match spec.loss {
            LossKind::Pkl => Some(Projection::new::<B>(&launcher, shape, projection)?),
            _ => None,
        };
        let tables = RowTables::new(&launcher, spec, projection.as_ref(), shape)?;
        let RowLse {
            lse,
            bad,
            mass,
            splits,
        } = row_lse(&launcher, &z, (n, v, tau_inv), tables.pass());
        let sigma = merge_shifts(&launcher, &z, &lse, &plan, (slots, v, tau_inv));
        let loss = launcher.zeros(plan.valid, DType::F32);
        let dsigma = launcher.zeros(slots, DType::F32);
        let grad = want_logits.then(|| launcher.empty(Shape::new([b, t, v]), z.dtype));
        let evaluation = Self {
            launcher,
            spec,
            v,
            k,
            teacher_vocab: teacher.vocab,
            teacher_ids,
            teacher_logp,
            plan,
            lse,
            bad,
            sigma,
            loss,
            dsigma,
            grad,
            tau_inv,
            scale,
            c: scale * tau_inv,
            dtype,
            chunk,
            mass,
            projection,
            hybrid: tables.hybrid,
            splits,
            z,
        };
        evaluation.zero_idle_rows();
        Ok(evaluation)
    }

    /// Zeroes the gradient rows that no slot reads as its predicting row.
    fn zero_idle_rows(&self) {
        let (Some(grad), true) = (&self.grad, self.plan.idle_count > 0) else {
            return;
        };
        let launcher = &self.launcher;
        let (count, dim) = launcher.elementwise(self.plan.idle_count * self.v);
        let bytes = self.plan.idle_count * self.v * self.z.dtype.size();
        note("zero_rows", Streams::default(), Streams::gradient(bytes));
        unsafe {
            kernels::zero_rows::launch_unchecked::<R>(
                &launcher.client,
                count,
                dim,
                launcher.address,
                grad.clone().into_array_arg(),
                self.plan.idle_rows.clone().into_array_arg(),
                self.plan.idle_count,
                self.v,
                self.dtype,
            );
        }
    }

    /// Writes the gradient of every compared slot's predicting row (nothing when no gradient
    /// was requested); P-KL writes its own (`pkl_grad`).
    pub(super) fn predicting_grad(&self, mode: GradMode<'_, R>) {
        let Some(grad) = &self.grad else { return };
        let count = self.plan.valid;
        if count == 0 {
            return;
        }
        let launcher = &self.launcher;
        let (partner, lambda, table) = match &mode {
            // A placeholder binds the table KL does not read.
            GradMode::Kl => (launcher.ints(&[]), 0.0, 0),
            GradMode::Hybrid {
                student_partner,
                lambda_uld,
            } => ((*student_partner).clone(), *lambda_uld, self.v * 4),
        };
        let rows_bytes = count * self.v * self.z.dtype.size();
        note(
            "predicting_grad",
            Streams::logits(rows_bytes) + Streams::other(table + count * 16),
            Streams::gradient(rows_bytes),
        );
        let (cubes, dim) = launcher.elementwise(count * self.v);
        unsafe {
            kernels::predicting_grad::launch_unchecked::<R>(
                &launcher.client,
                cubes,
                dim,
                launcher.address,
                self.z.clone().into_array_arg(),
                self.lse.clone().into_array_arg(),
                self.sigma.clone().into_array_arg(),
                self.dsigma.clone().into_array_arg(),
                self.plan.valid_slot.clone().into_array_arg(),
                self.plan.valid_row.clone().into_array_arg(),
                partner.into_array_arg(),
                grad.clone().into_array_arg(),
                count,
                self.v,
                self.tau_inv,
                self.c,
                lambda,
                matches!(mode, GradMode::Hybrid { .. }),
                self.dtype,
            );
        }
    }

    /// Ends the evaluation: the continuation rows' gradient, the loss, and the checks of the
    /// rows read and of the loss's value.
    pub(super) fn finish<B: Cube<R>>(
        self,
        grad_weights: Option<CubeTensor<R>>,
    ) -> Result<LossOutput<B>, KernelError> {
        self.continuation_grad();
        let value = scaled_sum(&self.launcher, &self.loss, self.plan.valid, self.scale);
        let output = LossOutput {
            value,
            grad_logits: self.grad,
            grad_weights,
        };
        let rows = self.spec.merge.rows_read();
        finish::<B, R>(
            &self.launcher,
            output,
            (self.bad, rows),
            self.spec.loss.name(),
        )
    }

    /// The merge's backward: each continuation row reading token `x` for slot `c` gets
    /// `c · Σh_c · (e_x − p)`.
    fn continuation_grad(&self) {
        let (Some(grad), true) = (&self.grad, self.plan.continuation_count > 0) else {
            return;
        };
        let (launcher, plan) = (&self.launcher, &self.plan);
        let (count, dim) = launcher.elementwise(plan.continuation_count * self.v);
        let bytes = plan.continuation_count * self.v * self.z.dtype.size();
        note(
            "continuation_grad",
            Streams::logits(bytes) + Streams::gradient(bytes),
            Streams::gradient(bytes),
        );
        unsafe {
            kernels::continuation_grad::launch_unchecked::<R>(
                &launcher.client,
                count,
                dim,
                launcher.address,
                self.z.clone().into_array_arg(),
                self.lse.clone().into_array_arg(),
                self.dsigma.clone().into_array_arg(),
                plan.continuation_rows.clone().into_array_arg(),
                plan.row_start.clone().into_array_arg(),
                plan.row_token.clone().into_array_arg(),
                plan.row_slot.clone().into_array_arg(),
                grad.clone().into_array_arg(),
                plan.continuation_count,
                self.v,
                self.tau_inv,
                self.c,
                self.dtype,
            );
        }
    }
}

/// Which dense term `h` the predicting rows' gradient kernel adds, and what it reads for it.
pub(super) enum GradMode<'a, R: CubeRuntime> {
    /// None (KL adds its sparse term afterwards).
    Kl,
    /// `λ_ULD · a` on the ids without a partner in the common set.
    Hybrid {
        student_partner: &'a CubeTensor<R>,
        lambda_uld: f32,
    },
}
