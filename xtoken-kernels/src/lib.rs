//! Device operations of X-Token behind one burn backend extension, [`XTokenBackend`].
//!
//! The losses of `xtoken-core` never compose full-vocabulary burn ops. They call three fused
//! operations, each evaluated in row chunks so that the working memory stays a few
//! `row_chunk × V` buffers whatever the sequence length:
//!
//! - [`XTokenBackend::xt_teacher_entries`]: per chunk slot, the teacher's merged
//!   log-probabilities on its top-K tokens (and, on request, the confidence statistics of
//!   adaptive weighting);
//! - [`XTokenBackend::xt_distill`]: the student's merged distributions, one distillation loss
//!   ([`LossKind`]: KL, P-KL, and the hybrid GOLD / H-KL / ULD) and, in the same pass, its
//!   gradient with respect to the student logits and the projection weights;
//! - [`XTokenBackend::xt_cross_entropy`]: next-token cross-entropy and its gradient.
//!
//! The models' attention is one more ([`XTokenBackend::xt_attention`], [`attention`]): it never
//! builds the `T × T` scores, and its backward recomputes them. And the trainer's:
//! [`XTokenBackend::xt_adamw`], one parameter tensor's AdamW update with its gradient's
//! clipping, in one pass ([`adamw`]).
//!
//! **Chunks and slots.** The losses speak of chunks, the kernels of slots: chunk `k` of
//! sequence `b` is slot `b · K + k` of the batch ([`MergePlan`] is one side's slots); the words
//! are defined in `docs/src/architecture.md`.
//!
//! Every backend gets the portable host implementation ([`host`]) through the trait's default
//! methods: it copies one row chunk at a time with `into_data`, runs on all cores, and uploads
//! the gradient. ndarray's f32 logits already live in host memory, so its implementation reads
//! them in place. `Autodiff<B>` wraps any implementation with a backward step that scales the
//! stored gradient. burn's `CubeBackend` (wgpu, CUDA; feature `wgpu`/`cuda`), and
//! `Fusion` of it (feature `fusion`), run the operations in cubecl kernels on the device
//! (module `cube`, built with the `cuda` or `wgpu` feature).
//!
//! **Reads to the host.** On a GPU every read waits for the device's queue. W's ids are laid
//! out once ([`layout::ProjectionLayout`]), the top-K's ids are known to be in range, and under
//! [`deferred::defer`] the checks that name a non-finite row wait until a loss is found
//! non-finite: a training step's kernels read nothing back.

#[macro_use]
mod wide;

pub mod adamw;
pub mod attention;
pub mod blocks;
mod checks;
pub mod compilations;
#[cfg(feature = "cube")]
pub mod cube;
pub mod cuda_sources;
pub mod deferred;
pub mod device;
pub mod embedding;
pub mod error;
#[cfg(feature = "fusion")]
mod fusion;
pub mod host;
pub mod layout;
pub mod loss_kind;
pub mod memory;
pub mod nccl;
pub mod spec;
pub mod temporary;
pub mod traffic;

mod autodiff;

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};

pub use error::KernelError;
pub use loss_kind::{LossKind, UnknownLoss};
pub use spec::{CommonPairs, ConfidenceStats, DistillSpec, EntriesSpec, GradRequest, MergePlan};

/// The teacher's targets: per chunk slot, its kept token ids and their merged log-probabilities.
#[derive(Debug, Clone)]
pub struct TeacherEntries<B: Backend> {
    /// Token ids `[slots, k]` (int), best first; rows of skipped slots are 0.
    pub ids: IntTensor<B>,
    /// Merged, tempered `log p̂_T` `[slots, k]`; rows of skipped slots are −∞.
    pub logp: FloatTensor<B>,
    /// Entries per slot (`min(top_k, V_T)`).
    pub k: usize,
    /// The teacher's vocabulary size.
    pub vocab: usize,
    /// Confidence statistics, when the spec asked for them.
    pub confidence: Option<ConfidenceStats>,
    /// The ids are known to lie in `0..vocab` (the extraction made them): an evaluation whose
    /// ids may reach `vocab` skips its range check, which on a GPU reads them back.
    pub ids_in_vocab: bool,
}

impl<B: Backend> TeacherEntries<B> {
    /// The same entries with their two tensors moved to another backend: the inner or outer
    /// backend of a wrapping extension (autodiff, fusion).
    pub fn map_tensors<C: Backend>(
        self,
        ids: impl FnOnce(IntTensor<B>) -> IntTensor<C>,
        logp: impl FnOnce(FloatTensor<B>) -> FloatTensor<C>,
    ) -> TeacherEntries<C> {
        TeacherEntries {
            ids: ids(self.ids),
            logp: logp(self.logp),
            k: self.k,
            vocab: self.vocab,
            confidence: self.confidence,
            ids_in_vocab: self.ids_in_vocab,
        }
    }
}

/// The sparse projection W `[V_S, K_w]` on the device: teacher ids (`-1`: empty slot) and
/// non-negative weights whose rows sum to 1 (or 0 for an empty row).
#[derive(Debug, Clone)]
pub struct ProjectionTensors<B: Backend> {
    /// Teacher ids `[V_S, K_w]` (int).
    pub indices: IntTensor<B>,
    /// Weights `[V_S, K_w]`.
    pub weights: FloatTensor<B>,
    /// The indices' layout when it was made once (see [`layout`]); without it, an evaluation
    /// reads the indices back and lays them out itself.
    pub layout: Option<std::sync::Arc<layout::ProjectionLayout>>,
}

/// A fused evaluation's result.
#[derive(Debug, Clone)]
pub struct LossOutput<B: Backend> {
    /// The loss `[1]`.
    pub value: FloatTensor<B>,
    /// `∂loss/∂logits` `[B, T_S, V_S]`, when requested.
    pub grad_logits: Option<FloatTensor<B>>,
    /// `∂loss/∂weights` `[V_S, K_w]`, when requested.
    pub grad_weights: Option<FloatTensor<B>>,
}

/// The backend extension the X-Token losses run on. The default methods are the portable host
/// implementation; a backend with its own kernels overrides them.
pub trait XTokenBackend: Backend {
    /// Extracts the teacher's entries from its logits `[B, T_T, V_T]` (no gradient); rows of
    /// the merge plan are `b · T_T + position`.
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &EntriesSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        host::teacher_entries::<Self>(logits, spec)
    }

    /// What a stored or served teacher keeps of each row of its logits `[B, T_T, V_T]`
    /// ([`host::PositionTargets`]): its top-K, the observed next token's log-probability and
    /// rank (`next[row]`, `-1`: none) and, with `confidence`, the confidence terms. A backend
    /// with kernels selects where the logits lie and sends back `O(rows · K)` values.
    fn xt_position_targets(
        logits: FloatTensor<Self>,
        next: &[i32],
        top_k: usize,
        tau: f32,
        confidence: bool,
    ) -> Result<host::PositionTargets, KernelError> {
        host::position_targets::<Self>(logits, next, top_k, tau, host::ROW_CHUNK, confidence)
    }

    /// Evaluates a distillation loss on the student logits `[B, T_S, V_S]` against the
    /// teacher's entries and, as requested, its gradients. `projection` is required by P-KL.
    fn xt_distill(
        logits: FloatTensor<Self>,
        teacher: TeacherEntries<Self>,
        projection: Option<ProjectionTensors<Self>>,
        spec: &DistillSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        host::distill::<Self>(logits, teacher, projection, spec, want)
    }

    /// The mean next-token cross-entropy of logits `[B, T, V]`; `targets[row]` is the token
    /// row `b · T + position` predicts, `-1` to skip it. With `want_grad`, also its gradient.
    fn xt_cross_entropy(
        logits: FloatTensor<Self>,
        targets: &[i32],
        row_chunk: usize,
        want_grad: bool,
    ) -> Result<LossOutput<Self>, KernelError> {
        host::cross_entropy::<Self>(logits, targets, row_chunk, want_grad)
    }

    /// Attention of queries `[B, H, T_q, D]` over keys and values `[B, H_kv, T_k, D]` as
    /// `spec` masks it, without building the `[B, H, T_q, T_k]` scores; the output and the
    /// row log-sum-exps its backward reads ([`attention`]).
    fn xt_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        spec: &attention::AttentionSpec,
    ) -> Result<attention::Attended<Self>, KernelError> {
        attention::forward::<Self>(q, k, v, spec)
    }

    /// Whether [`XTokenBackend::xt_attention`] runs where this backend's tensors live (a host
    /// backend, or a kernel of its own), so that a model may use it in its training pass.
    /// `false` by default: the portable version reads the inputs to the host, a stall per layer
    /// on a device.
    fn xt_attention_native() -> bool {
        false
    }

    /// Whether this backend's own attention forward is fused (it keeps no `T × T` scores and
    /// beats [`XTokenBackend::xt_attention`] where no gradient is wanted), so that inference
    /// takes it even where `xt_attention` is native. burn-flex's is; ndarray's is not.
    fn burn_attention_fused() -> bool {
        false
    }

    /// The gradients of [`XTokenBackend::xt_attention`]'s inputs given its output's, each
    /// score recomputed from the saved log-sum-exps.
    fn xt_attention_backward(
        saved: attention::AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: &attention::AttentionSpec,
    ) -> Result<attention::AttentionGrads<Self>, KernelError> {
        attention::backward::<Self>(saved, grad_output, spec)
    }

    /// Whether the decoder layer's element-wise blocks ([`blocks`]: RMSNorm, the rotary
    /// embedding, SwiGLU) run here as one pass each, forward and backward; `false`: the
    /// default methods compose burn's ops, as the models did before.
    fn xt_blocks_native() -> bool {
        false
    }

    /// RMSNorm over the last dimension of `x` with weights `gamma` ([`blocks::rms_norm`]).
    fn xt_rms_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
    ) -> FloatTensor<Self> {
        blocks::rms_norm_composed::<Self>(x, gamma, epsilon)
    }

    /// The gradients of [`XTokenBackend::xt_rms_norm`] with respect to `x` and `gamma`, given
    /// the output's.
    fn xt_rms_norm_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        epsilon: f64,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        blocks::rms_norm_backward_composed::<Self>(x, gamma, epsilon, grad)
    }

    /// The rotary embedding of `x` `[batch, len, heads, head_dim]` by `cos`/`sin`
    /// `[1 or batch, len, half]` ([`blocks::rotary`]).
    fn xt_rotary(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        blocks::rotary_composed::<Self>(x, cos, sin)
    }

    /// The gradient of [`XTokenBackend::xt_rotary`] with respect to `x`, given the output's.
    fn xt_rotary_backward(
        grad: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        blocks::rotary_backward_composed::<Self>(grad, cos, sin)
    }

    /// `silu(gate) · up` ([`blocks::swiglu`]).
    fn xt_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        blocks::swiglu_composed::<Self>(gate, up)
    }

    /// The gradients of [`XTokenBackend::xt_swiglu`] with respect to `gate` and `up`, given
    /// the output's.
    fn xt_swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        blocks::swiglu_backward_composed::<Self>(gate, up, grad)
    }

    /// `table` `[rows, cols]` plus an embedding lookup's gradient: `values` `[n, cols]` added
    /// at rows `indices` `[n]`, repeated indices summed first ([`embedding`]). Host backends
    /// add into `table`'s buffer; the default composes burn's lookup backward and the sum.
    fn xt_add_rows(
        table: FloatTensor<Self>,
        indices: IntTensor<Self>,
        values: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        embedding::add_rows_composed::<Self>(table, indices, values)
    }

    /// One AdamW update of `param` by `grad` (scaled by `step.grad_scale` first) with its
    /// `moments` (`None` at the first update), in one pass where the backend has a kernel.
    fn xt_adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<adamw::Moments<Self>>,
        step: &adamw::AdamWStep,
    ) -> adamw::AdamWUpdate<Self> {
        adamw::composed::<Self>(param, grad, moments, step)
    }
}

/// The blocks' methods of `XTokenBackend`, and `xt_add_rows`, on a `blocks::HostF32` backend
/// (ndarray, burn-flex): its host passes, the composition where a tensor is not f32.
macro_rules! host_blocks {
    () => {
        fn xt_blocks_native() -> bool {
            true
        }

        fn xt_add_rows(
            table: FloatTensor<Self>,
            indices: IntTensor<Self>,
            values: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            embedding::add_rows_on_host::<Self>(table, indices, values)
        }

        fn xt_rms_norm(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            epsilon: f64,
        ) -> FloatTensor<Self> {
            blocks::on_host::rms_norm::<Self>(x, gamma, epsilon)
        }

        fn xt_rms_norm_backward(
            x: FloatTensor<Self>,
            gamma: FloatTensor<Self>,
            epsilon: f64,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            blocks::on_host::rms_norm_backward::<Self>(x, gamma, epsilon, grad)
        }

        fn xt_rotary(
            x: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            blocks::on_host::rotary::<Self>(x, cos, sin, false)
        }

        fn xt_rotary_backward(
            grad: FloatTensor<Self>,
            cos: FloatTensor<Self>,
            sin: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            blocks::on_host::rotary::<Self>(grad, cos, sin, true)
        }

        fn xt_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
            blocks::on_host::swiglu::<Self>(gate, up)
        }

        fn xt_swiglu_backward(
            gate: FloatTensor<Self>,
            up: FloatTensor<Self>,
            grad: FloatTensor<Self>,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            blocks::on_host::swiglu_backward::<Self>(gate, up, grad)
        }
    };
}

/// ndarray's f32 logits are already host memory: the kernels read them in place, without the
/// row copies of the portable path.
impl<E, I, Q> XTokenBackend for burn::backend::NdArray<E, I, Q>
where
    burn::backend::NdArray<E, I, Q>: Backend<FloatTensorPrimitive = NdArrayTensor>,
    NdArrayTensor:
        From<burn::backend::ndarray::SharedArray<E>> + From<burn::backend::ndarray::SharedArray<I>>,
{
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &EntriesSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        entries_in_place::<Self>(logits, ndarray_rows, spec)
    }

    fn xt_position_targets(
        logits: FloatTensor<Self>,
        next: &[i32],
        top_k: usize,
        tau: f32,
        confidence: bool,
    ) -> Result<host::PositionTargets, KernelError> {
        let request = (next, top_k, tau, confidence);
        position_targets_in_place::<Self>(logits, ndarray_rows, request)
    }

    fn xt_distill(
        logits: FloatTensor<Self>,
        teacher: TeacherEntries<Self>,
        projection: Option<ProjectionTensors<Self>>,
        spec: &DistillSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        let Some(src) = ndarray_rows(&logits) else {
            return host::distill::<Self>(logits, teacher, projection, spec, want);
        };
        let found = host::distill_from::<_, Self>(&src, teacher, projection, spec, want)?;
        Ok(in_place_output(found, &src))
    }

    fn xt_cross_entropy(
        logits: FloatTensor<Self>,
        targets: &[i32],
        row_chunk: usize,
        want_grad: bool,
    ) -> Result<LossOutput<Self>, KernelError> {
        let Some(src) = ndarray_rows(&logits) else {
            return host::cross_entropy::<Self>(logits, targets, row_chunk, want_grad);
        };
        let found = host::cross_entropy_from(&src, targets, row_chunk, want_grad)?;
        Ok(in_place_output(found, &src))
    }

    fn xt_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        spec: &attention::AttentionSpec,
    ) -> Result<attention::Attended<Self>, KernelError> {
        attention::forward::<Self>(q, k, v, spec)
    }

    fn xt_attention_native() -> bool {
        true
    }

    fn xt_attention_backward(
        saved: attention::AttentionSaved<Self>,
        grad_output: FloatTensor<Self>,
        spec: &attention::AttentionSpec,
    ) -> Result<attention::AttentionGrads<Self>, KernelError> {
        attention::backward::<Self>(saved, grad_output, spec)
    }

    fn xt_adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<adamw::Moments<Self>>,
        step: &adamw::AdamWStep,
    ) -> adamw::AdamWUpdate<Self> {
        ndarray_adamw::<Self>(param, grad, moments, step)
    }

    host_blocks!();
}

/// ndarray's AdamW in one pass on the host ([`adamw::update_in_place`]) when every tensor is
/// f32, each array updated in place where it is its own (copied first where it is shared or
/// not in standard layout); other dtypes take the composed ops.
fn ndarray_adamw<B>(
    param: NdArrayTensor,
    grad: NdArrayTensor,
    moments: Option<adamw::Moments<B>>,
    step: &adamw::AdamWStep,
) -> adamw::AdamWUpdate<B>
where
    B: Backend<FloatTensorPrimitive = NdArrayTensor>,
{
    use burn::backend::ndarray::SharedArray;
    use burn::tensor::{DType, TensorMetadata};
    let f32s = [&param, &grad]
        .into_iter()
        .chain(moments.iter().flat_map(|m| [&m.first, &m.second]))
        .all(|t| t.dtype() == DType::F32);
    if !f32s {
        return adamw::composed::<B>(param, grad, moments, step);
    }
    let array = |t: NdArrayTensor| -> SharedArray<f32> {
        let NdArrayTensor::F32(storage) = t else {
            unreachable!("checked to be f32 above")
        };
        standard_f32(storage.into_owned())
    };
    let (mut param, grad) = (array(param), array(grad));
    let fresh = moments.is_none();
    let (mut first, mut second) = match moments {
        Some(m) => (array(m.first), array(m.second)),
        None => (
            SharedArray::zeros(param.raw_dim()),
            SharedArray::zeros(param.raw_dim()),
        ),
    };
    let standard = "in standard layout, made so above";
    adamw::update_in_place(
        param.as_slice_mut().expect(standard),
        grad.as_slice().expect(standard),
        first.as_slice_mut().expect(standard),
        second.as_slice_mut().expect(standard),
        fresh,
        step,
    );
    let tensor = NdArrayTensor::from;
    adamw::AdamWUpdate {
        param: tensor(param),
        moments: adamw::Moments {
            first: tensor(first),
            second: tensor(second),
        },
    }
}

/// The teacher's entries of logits that `rows` finds in host memory, read in place; others
/// take the portable path.
fn entries_in_place<B: Backend>(
    logits: FloatTensor<B>,
    rows: fn(&FloatTensor<B>) -> Option<host::SliceRows<'_>>,
    spec: &EntriesSpec,
) -> Result<TeacherEntries<B>, KernelError> {
    let Some(src) = rows(&logits) else {
        return host::teacher_entries::<B>(logits, spec);
    };
    let found = host::teacher_entries_from(&src, spec)?;
    let vocab = src.shape()[2];
    Ok(host::entries_to_device::<B>(
        &found,
        vocab,
        &Default::default(),
    ))
}

/// [`XTokenBackend::xt_position_targets`] of logits that `rows` finds in host memory, read in
/// place; others take the portable path. `request`: the next tokens, top-K, τ and whether the
/// confidence terms are wanted.
fn position_targets_in_place<B: Backend>(
    logits: FloatTensor<B>,
    rows: fn(&FloatTensor<B>) -> Option<host::SliceRows<'_>>,
    (next, top_k, tau, confidence): (&[i32], usize, f32, bool),
) -> Result<host::PositionTargets, KernelError> {
    let chunk = host::ROW_CHUNK;
    let Some(src) = rows(&logits) else {
        return host::position_targets::<B>(logits, next, top_k, tau, chunk, confidence);
    };
    host::position_targets_from(&src, next, top_k, tau, chunk, confidence)
}

/// Uploads a result computed from f32 logits read in place.
fn in_place_output<B: Backend>(found: host::HostLoss, src: &host::SliceRows<'_>) -> LossOutput<B> {
    let f32 = burn::tensor::DType::F32;
    let dtypes = host::OutputDtypes {
        logits: f32,
        weights: f32,
    };
    host::loss_to_device::<B>(found, src.shape(), dtypes, &Default::default())
}

use burn::backend::ndarray::NdArrayTensor;

/// Whether the kernels read these ndarray logits in place (contiguous f32); other layouts and
/// dtypes take the portable row copies.
pub fn ndarray_reads_in_place(logits: &NdArrayTensor) -> bool {
    ndarray_rows(logits).is_some()
}

/// The f32 data of a contiguous `[B, T, V]` ndarray tensor, borrowed.
fn ndarray_rows(t: &NdArrayTensor) -> Option<host::SliceRows<'_>> {
    match t {
        NdArrayTensor::F32(storage) => {
            let shape = storage.shape().to_vec();
            host::SliceRows::new(storage.view().to_slice()?, &shape)
        }
        _ => None,
    }
}

/// burn-flex's contiguous f32 logits are read in place, as ndarray's; its f16 and bf16 logits
/// (and other layouts) take the portable host implementation, which reads them a row chunk at a
/// time and accumulates in f32.
impl XTokenBackend for burn_flex::Flex {
    fn xt_teacher_entries(
        logits: FloatTensor<Self>,
        spec: &EntriesSpec,
    ) -> Result<TeacherEntries<Self>, KernelError> {
        entries_in_place::<Self>(logits, flex_rows, spec)
    }

    fn xt_position_targets(
        logits: FloatTensor<Self>,
        next: &[i32],
        top_k: usize,
        tau: f32,
        confidence: bool,
    ) -> Result<host::PositionTargets, KernelError> {
        let request = (next, top_k, tau, confidence);
        position_targets_in_place::<Self>(logits, flex_rows, request)
    }

    fn xt_distill(
        logits: FloatTensor<Self>,
        teacher: TeacherEntries<Self>,
        projection: Option<ProjectionTensors<Self>>,
        spec: &DistillSpec,
        want: GradRequest,
    ) -> Result<LossOutput<Self>, KernelError> {
        let Some(src) = flex_rows(&logits) else {
            return host::distill::<Self>(logits, teacher, projection, spec, want);
        };
        let found = host::distill_from::<_, Self>(&src, teacher, projection, spec, want)?;
        Ok(in_place_output(found, &src))
    }

    fn xt_cross_entropy(
        logits: FloatTensor<Self>,
        targets: &[i32],
        row_chunk: usize,
        want_grad: bool,
    ) -> Result<LossOutput<Self>, KernelError> {
        let Some(src) = flex_rows(&logits) else {
            return host::cross_entropy::<Self>(logits, targets, row_chunk, want_grad);
        };
        let found = host::cross_entropy_from(&src, targets, row_chunk, want_grad)?;
        Ok(in_place_output(found, &src))
    }

    fn xt_attention_native() -> bool {
        true
    }

    fn burn_attention_fused() -> bool {
        true
    }

    fn xt_adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<adamw::Moments<Self>>,
        step: &adamw::AdamWStep,
    ) -> adamw::AdamWUpdate<Self> {
        flex_adamw(param, grad, moments, step)
    }

    host_blocks!();
}

/// burn-flex's AdamW in one pass on the host ([`adamw::update_in_place`]) when every tensor is
/// f32, each buffer updated in place where the tensor is its only owner (copied first where it
/// is shared or a view); other dtypes take the composed ops.
fn flex_adamw(
    param: burn_flex::FlexTensor,
    grad: burn_flex::FlexTensor,
    moments: Option<adamw::Moments<burn_flex::Flex>>,
    step: &adamw::AdamWStep,
) -> adamw::AdamWUpdate<burn_flex::Flex> {
    use burn::tensor::DType;
    use burn_flex::FlexTensor;
    let f32s = [&param, &grad]
        .into_iter()
        .chain(moments.iter().flat_map(|m| [&m.first, &m.second]))
        .all(|t| t.dtype() == DType::F32);
    if !f32s {
        return adamw::composed::<burn_flex::Flex>(param, grad, moments, step);
    }
    let (mut param, grad) = (whole_f32(param), whole_f32(grad));
    let fresh = moments.is_none();
    let (mut first, mut second) = match moments {
        Some(m) => (whole_f32(m.first), whole_f32(m.second)),
        // The first update writes the moments without reading them. A typed zero buffer:
        // burn-flex's `zeros` fills a byte vector and then copies it into an aligned one, two
        // more passes over each moment.
        None => {
            let shape = param.layout().shape().clone();
            (
                FlexTensor::filled_typed(shape.clone(), DType::F32, 0f32),
                FlexTensor::filled_typed(shape, DType::F32, 0f32),
            )
        }
    };
    adamw::update_in_place(
        param.storage_mut::<f32>(),
        grad.storage::<f32>(),
        first.storage_mut::<f32>(),
        second.storage_mut::<f32>(),
        fresh,
        step,
    );
    adamw::AdamWUpdate {
        param,
        moments: adamw::Moments { first, second },
    }
}

/// Whether the kernels read these burn-flex logits in place (contiguous f32); other layouts and
/// dtypes take the portable row copies.
pub fn flex_reads_in_place(logits: &burn_flex::FlexTensor) -> bool {
    flex_rows(logits).is_some()
}

/// The f32 data of a contiguous `[B, T, V]` burn-flex tensor, borrowed.
fn flex_rows(t: &burn_flex::FlexTensor) -> Option<host::SliceRows<'_>> {
    let shape = t.layout().shape().to_vec();
    host::SliceRows::new(t.as_slice::<f32>()?, &shape)
}

/// ndarray's f32 arrays, read in place where in standard layout.
impl<E, I, Q> blocks::HostF32 for burn::backend::NdArray<E, I, Q>
where
    burn::backend::NdArray<E, I, Q>: Backend<FloatTensorPrimitive = NdArrayTensor>,
    NdArrayTensor:
        From<burn::backend::ndarray::SharedArray<E>> + From<burn::backend::ndarray::SharedArray<I>>,
{
    fn values(t: &NdArrayTensor) -> Option<std::borrow::Cow<'_, [f32]>> {
        let NdArrayTensor::F32(storage) = t else {
            return None;
        };
        let view = storage.view();
        Some(match view.to_slice() {
            Some(slice) => std::borrow::Cow::Borrowed(slice),
            None => std::borrow::Cow::Owned(view.iter().copied().collect()),
        })
    }

    fn from_values(values: Vec<f32>, shape: burn::tensor::Shape) -> NdArrayTensor {
        let array =
            burn::backend::ndarray::SharedArray::<f32>::from_shape_vec(shape.to_vec(), values)
                .expect("as many values as the shape holds");
        NdArrayTensor::from(array)
    }

    fn update_values(
        t: NdArrayTensor,
        update: impl FnOnce(&mut [f32]),
    ) -> Result<NdArrayTensor, NdArrayTensor> {
        let NdArrayTensor::F32(storage) = t else {
            return Err(t);
        };
        let mut array = standard_f32(storage.into_owned());
        update(
            array
                .as_slice_mut()
                .expect("in standard layout, made so above"),
        );
        Ok(NdArrayTensor::from(array))
    }
}

/// `array` in standard layout and its own, copied only where it is shared or strided; a 2-D
/// transposed view (autodiff's gradient of a transposed operand) by the host's blocked
/// transpose, not ndarray's element-by-element copy.
fn standard_f32(
    array: burn::backend::ndarray::SharedArray<f32>,
) -> burn::backend::ndarray::SharedArray<f32> {
    let shape = array.shape().to_vec();
    if array.is_standard_layout() {
        return array;
    }
    if shape.len() == 2 {
        if let Some(stored) = array.t().to_slice() {
            let values = host::transpose(stored, shape[1], shape[0]);
            return burn::backend::ndarray::SharedArray::<f32>::from_shape_vec(shape, values)
                .expect("as many values as the shape holds");
        }
    }
    array.as_standard_layout().into_owned().into_shared()
}

/// An f32 burn-flex tensor as a buffer of exactly its elements in order, copied only where it
/// is a view (a 2-D transposed view, autodiff's gradient of a transposed operand, by the host's
/// blocked transpose, not burn-flex's strided copy). The original is dropped first, so that a
/// tensor that owned its buffer still owns it (and `storage_mut` does not copy).
fn whole_f32(t: burn_flex::FlexTensor) -> burn_flex::FlexTensor {
    let layout = t.layout();
    let shape = layout.shape().to_vec();
    let transposed = shape.len() == 2
        && layout.strides() == [1, shape[0] as isize]
        && layout.start_offset() == 0
        && t.storage::<f32>().len() == shape[0] * shape[1];
    let whole = match transposed {
        true => {
            let values = host::transpose(t.storage::<f32>(), shape[1], shape[0]);
            <burn_flex::Flex as blocks::HostF32>::from_values(values, shape.into())
        }
        false => t.to_contiguous(),
    };
    drop(t);
    whole
}

/// burn-flex's f32 tensors, read in place where contiguous.
impl blocks::HostF32 for burn_flex::Flex {
    fn values(t: &burn_flex::FlexTensor) -> Option<std::borrow::Cow<'_, [f32]>> {
        if t.dtype() != burn::tensor::DType::F32 {
            return None;
        }
        Some(match t.as_slice::<f32>() {
            Some(slice) => std::borrow::Cow::Borrowed(slice),
            None => std::borrow::Cow::Owned(t.to_contiguous().storage::<f32>().to_vec()),
        })
    }

    fn from_values(values: Vec<f32>, shape: burn::tensor::Shape) -> burn_flex::FlexTensor {
        burn_flex::FlexTensor::from_data(burn::tensor::TensorData::new(values, shape))
    }

    fn update_values(
        t: burn_flex::FlexTensor,
        update: impl FnOnce(&mut [f32]),
    ) -> Result<burn_flex::FlexTensor, burn_flex::FlexTensor> {
        if t.dtype() != burn::tensor::DType::F32 {
            return Err(t);
        }
        let mut whole = whole_f32(t);
        update(whole.storage_mut::<f32>());
        Ok(whole)
    }
}
