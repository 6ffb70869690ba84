//! The launch context every distillation loss shares on the device: the checks, the merge plan
//! as arrays, the row log-sum-exps and merge shifts, the loss and `Σh` buffers, the gradient
//! (its idle rows zeroed), the predicting rows' gradient kernel, and the end of the evaluation:
//! the continuation rows' gradient, the loss's sum and the read-back checks.

use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

use super::kernels;
use super::launch::{
    as_f32, as_i32, finish, float_dtype, int_range, logits_shape, merge_shifts, row_lse,
    scaled_sum, Cube, Launcher, PlanArrays, RowLse,
};
use crate::checks::{check_id_range, check_tau, check_teacher};
use crate::error::KernelError;
use crate::loss_kind::LossKind;
use crate::spec::DistillSpec;
use crate::{LossOutput, TeacherEntries};

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
}

impl<'s, R: CubeRuntime> Evaluation<'s, R> {
    /// Checks the inputs and runs the launches every loss starts with.
    pub(super) fn new<B: Cube<R>>(
        logits: CubeTensor<R>,
        teacher: TeacherEntries<B>,
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
        let k = teacher.k;
        // KL reads the teacher's ids as student ids.
        let id_limit = if spec.loss == LossKind::Kl {
            v
        } else {
            teacher.vocab
        };
        // Ids the extraction made lie below the teacher's vocabulary: no read needed.
        let known = teacher.ids_in_vocab && teacher.vocab <= id_limit;
        if slots * k > 0 && !known {
            let range = int_range::<B, R>(&teacher.ids, "teacher ids")?;
            check_id_range(range, 0, id_limit, "teacher ids", "token")?;
        }
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
        let RowLse { lse, bad } = row_lse(&launcher, &z, n, v, tau_inv);
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

    /// Writes the gradient of the predicting rows of compared slots `first..first + count`
    /// (nothing when no gradient was requested).
    pub(super) fn predicting_grad(&self, (first, count): (usize, usize), mode: GradMode<'_, R>) {
        let Some(grad) = &self.grad else { return };
        if count == 0 {
            return;
        }
        let launcher = &self.launcher;
        // Placeholders bind the arrays a mode does not read.
        let no_floats = launcher.zeros(1, DType::F32);
        let no_ids = launcher.ints(&[]);
        let (indices, weights, scattered, mass, kw, vt, lambda) = match &mode {
            GradMode::Kl => (&no_ids, &no_floats, &no_floats, &no_floats, 1, 1, 0.0),
            GradMode::Projected {
                indices,
                weights,
                scattered,
                mass,
                kw,
            } => (
                *indices,
                *weights,
                *scattered,
                *mass,
                *kw,
                self.teacher_vocab,
                0.0,
            ),
            GradMode::Hybrid {
                student_partner,
                lambda_uld,
            } => (
                *student_partner,
                &no_floats,
                &no_floats,
                &no_floats,
                1,
                1,
                *lambda_uld,
            ),
        };
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
                indices.clone().into_array_arg(),
                weights.clone().into_array_arg(),
                scattered.clone().into_array_arg(),
                mass.clone().into_array_arg(),
                grad.clone().into_array_arg(),
                first,
                count,
                kw,
                self.v,
                vt,
                self.tau_inv,
                self.c,
                lambda,
                matches!(mode, GradMode::Projected { .. }),
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
    /// P-KL's gather through W (`[V_S, kw]`) of the chunk's scattered `[chunk, V_T]` `g`, with
    /// each slot's re-normalization mass `ρ`.
    Projected {
        indices: &'a CubeTensor<R>,
        weights: &'a CubeTensor<R>,
        scattered: &'a CubeTensor<R>,
        mass: &'a CubeTensor<R>,
        kw: usize,
    },
    /// `λ_ULD · a` on the ids without a partner in the common set.
    Hybrid {
        student_partner: &'a CubeTensor<R>,
        lambda_uld: f32,
    },
}
