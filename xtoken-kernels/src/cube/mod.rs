//! [`XTokenBackend`] for burn's `CubeBackend` (wgpu, CUDA, any cubecl runtime): the teacher's
//! top-K extraction and the student side of every loss run in cubecl kernels (`kernels`),
//! on the logits where they lie, in their own float type.
//!
//! One distillation evaluation is a fixed sequence of launches, all deterministic:
//!
//! 1. `row_lse`: each logit row's log-sum-exp, reading the row once (online max and sum), and
//!    in the same pass the row's mass the loss weighs (P-KL's `ρ`, the hybrid losses'
//!    uncommon mass);
//! 2. `merge_shift`: the chunk merge, `σ_c` per slot from its continuation terms;
//! 3. the loss's own launches: `kl` (KL), `pkl` (P-KL) or `hybrid` (GOLD, H-KL, ULD), each
//!    ending with the predicting rows' gradient (`predicting_grad`; P-KL's `pkl_grad` writes
//!    it with W's gradient in one pass);
//! 4. `continuation_grad` and `zero_rows`: the merge's backward and the rows no slot reads;
//! 5. `scaled_sum`: the loss.
//!
//! Every launch declares the bytes it reads and writes ([`crate::traffic`]), which `xtoken
//! bench kernels` sets against the floor. Steps 1, 2, 4 and 5 are the shared launch context
//! (`distill`); `launch` holds the launcher
//! and the helpers every launch uses, `teacher` the teacher's top-K, `ce` the cross-entropy,
//! `adamw` the optimizer's fused update and `attention` the models' attention with its
//! backward (four launches of their own, none of them `T × T`). The host does what is O(slots), O(|W|) or O(V):
//! it checks the plan, lays it out as arrays, transposes W's indices (a counting sort, done
//! once when W comes with its [`crate::layout::ProjectionLayout`]) and uploads the common
//! set's tables. It reads back per-row flags and the loss value to report non-finite rows by
//! name, at once or, under [`crate::deferred::defer`], only when the caller asks ([`reads`]
//! counts these reads).

mod adamw;
mod attention;
mod ce;
mod distill;
mod hybrid;
mod kernels;
mod kl;
mod launch;
mod pkl;
mod teacher;

use burn::tensor::ops::FloatTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::error::KernelError;
use crate::host::PositionTargets;
use crate::loss_kind::LossKind;
use crate::spec::{DistillSpec, EntriesSpec, GradRequest};
use crate::{LossOutput, ProjectionTensors, TeacherEntries, XTokenBackend};
use distill::Evaluation;

pub use attention::shared_bytes as attention_shared_bytes;
pub use kernels::BLOCK;
pub use launch::reads;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> XTokenBackend
    for CubeBackend<R, F, I, BT>
{
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &EntriesSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        teacher::teacher_entries::<Self, R>(logits, spec)
    }

    fn xt_position_targets(
        logits: FloatTensor<Self>,
        next: &[i32],
        top_k: usize,
        tau: f32,
        confidence: bool,
    ) -> Result<PositionTargets, KernelError> {
        teacher::position_targets::<Self, R>(logits, next, top_k, tau, confidence)
    }

    fn xt_distill(
        logits: FloatTensor<Self>,
        teacher: TeacherEntries<Self>,
        projection: Option<ProjectionTensors<Self>>,
        spec: &DistillSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        let evaluation = Evaluation::new::<Self>(logits, teacher, projection, spec, want.logits)?;
        match spec.loss {
            LossKind::Kl => kl::evaluate::<Self, R>(evaluation),
            LossKind::Pkl => pkl::evaluate::<Self, R>(evaluation, want.weights),
            LossKind::Gold | LossKind::Hkl | LossKind::Uld => {
                hybrid::evaluate::<Self, R>(evaluation)
            }
        }
    }

    fn xt_cross_entropy(
        logits: FloatTensor<Self>,
        targets: &[i32],
        _row_chunk: usize,
        want_grad: bool,
    ) -> Result<LossOutput<Self>, KernelError> {
        ce::evaluate::<Self, R>(logits, targets, want_grad)
    }

    fn xt_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        spec: &crate::attention::AttentionSpec,
    ) -> Result<crate::attention::Attended<Self>, KernelError> {
        attention::forward::<Self, R>(q, k, v, spec)
    }

    fn xt_attention_native() -> bool {
        true
    }

    /// burn's cube attention forward is a flash kernel (cubek-attention).
    fn burn_attention_fused() -> bool {
        true
    }

    fn xt_attention_backward(
        saved: crate::attention::AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: &crate::attention::AttentionSpec,
    ) -> Result<crate::attention::AttentionGrads<Self>, KernelError> {
        attention::backward::<Self, R>(saved, grad_output, spec)
    }

    fn xt_adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<crate::adamw::Moments<Self>>,
        step: &crate::adamw::AdamWStep,
    ) -> crate::adamw::AdamWUpdate<Self> {
        adamw::update::<Self, R>(param, grad, moments, step)
    }
}
