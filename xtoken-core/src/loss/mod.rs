//! The distillation losses (paper §2.3–2.8), generic over burn backends.
//!
//! One training step, per teacher:
//!
//! 1. [`TeacherTargets::new`] reads the teacher's logits `[B, T_T, V_T]` once (no gradient) and
//!    keeps, per aligned chunk, the merged log-probabilities of its top-K tokens (K = 8192 by
//!    default). The teacher logits can be dropped right after.
//! 2. A loss of [`kl`], [`uld`], [`gold`], [`pkl`] or [`hkl`] reads the student's logits
//!    `[B, T_S, V_S]` and returns a scalar `[1]`: the mean over compared chunks of the per-chunk
//!    loss, times τ². Under `Autodiff` its gradient flows to the logits (and to the learnable W
//!    of P-KL).
//! 3. [`multi`] sums several teachers with static or adaptive α; [`scaling::dynamic`] combines
//!    the result with the next-token cross-entropy of [`ce`].
//!
//! **Chunk merge.** Logits at row `j` predict token `j + 1`. A chunk at positions `a..b` compares
//! `log p̂(v) = log p[a−1](v) + Σ_{i=a+1}^{b−1} log p[i−1](x_i)` (or the last-token variant that
//! the [`BatchPlan`] was built with); temperature divides the logits of both sides before the
//! softmax. Gap and padding positions, and chunks starting at position 0, never contribute.
//!
//! **Top-K.** The teacher is represented by its top-K entries per chunk, not renormalized: every
//! loss treats the teacher's other entries as zero. KL and P-KL sum over the kept entries (so a
//! student equal to the teacher costs exactly 0 for any K); ULD sorts the kept entries against
//! the student's full (uncommon) distribution, zero-padded. [`TopK::All`] keeps everything.
//!
//! **Memory.** Nothing here composes full-vocabulary burn ops. Both sides are evaluated by the
//! fused operations of `xtoken-kernels` in chunks of [`LossParams::row_chunk`] rows, with the
//! gradient computed in the same pass: besides the logits and the gradient that the backward
//! step must return anyway, the working memory is a few `row_chunk × V` buffers whatever the
//! sequence length.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::tensor::{Distribution, Tensor};
//! use xtoken_core::align::{Alignment, Chunk, ChunkKind, Positions};
//! use xtoken_core::loss::{kl, LossParams, TeacherTargets};
//! use xtoken_core::plan::{BatchPlan, ChunkPlan, MergeVariant, PlanItem};
//!
//! type B = Autodiff<NdArray>;
//! let device = Default::default();
//! // One sequence of 4 tokens, aligned 1-to-1 with a same-tokenizer teacher.
//! let ids = [1u32, 5, 2, 7];
//! let chunks = (0..4)
//!     .map(|i| Chunk {
//!         student: Positions { start: i, len: 1 },
//!         teacher: Positions { start: i, len: 1 },
//!         kind: ChunkKind::Match,
//!     })
//!     .collect();
//! let alignment = Alignment {
//!     chunks,
//!     student_len: 4,
//!     teacher_len: 4,
//!     score: 12.0,
//!     band_bytes: 16,
//!     band_edge_reached: false,
//! };
//! let plan = ChunkPlan::new(&alignment);
//! let item = PlanItem { plan: &plan, student_ids: &ids, teacher_ids: &ids };
//! let batch = BatchPlan::new(&[item], 4, 4, MergeVariant::FirstToken)?;
//!
//! let params = LossParams::default();
//! let teacher = Tensor::<B, 3>::random([1, 4, 10], Distribution::Normal(0.0, 1.0), &device);
//! let targets = TeacherTargets::new(teacher, &batch, &params)?;
//! let student = Tensor::<B, 3>::random([1, 4, 10], Distribution::Normal(0.0, 1.0), &device)
//!     .require_grad();
//! let loss = kl::loss(student.clone(), &targets, &params)?; // [1]
//! let grads = loss.backward();
//! assert_eq!(student.grad(&grads).unwrap().dims(), [1, 4, 10]);
//! # Ok::<(), xtoken_core::Error>(())
//! ```

pub mod ce;
pub mod gold;
pub mod hkl;
pub mod kl;
pub mod multi;
pub mod pkl;
pub mod scaling;
pub mod uld;

use std::sync::Arc;

use burn::tensor::{Tensor, TensorPrimitive};
use xtoken_kernels::host::{entries_to_device, HostEntries};
pub use xtoken_kernels::{ConfidenceStats, LossKind, XTokenBackend};
use xtoken_kernels::{
    DistillSpec, EntriesSpec, GradRequest, KernelError, MergePlan, TeacherEntries,
};

use crate::common::CommonTables;
use crate::error::{Error, Result};
use crate::plan::{BatchPlan, SideIndices};

/// How many teacher entries each chunk keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopK {
    /// The K most probable (more than the vocabulary keeps all).
    K(usize),
    /// The whole vocabulary.
    All,
}

impl TopK {
    fn get(self) -> usize {
        match self {
            TopK::K(k) => k,
            TopK::All => usize::MAX,
        }
    }
}

/// The loss hyper-parameters; the defaults are the paper's.
#[derive(Debug, Clone, PartialEq)]
pub struct LossParams {
    /// Temperature τ on both sides; the loss is multiplied by τ² (paper: 1).
    pub tau: f64,
    /// Teacher entries kept per chunk (paper: 8192).
    pub top_k: TopK,
    /// Weight of the common-KL term of GOLD and H-KL (paper: 1).
    pub lambda_kl: f64,
    /// Weight of the sorted-L1 term of GOLD, H-KL and ULD (paper: 1).
    pub lambda_uld: f64,
    /// P-KL evaluates `log(p̃_S + eps)`: a kept teacher token that no row of W reaches (or a
    /// chunk whose student mass lies wholly on W's empty rows) costs the constant
    /// `q (log q − log eps)` and sends no gradient, instead of an infinite loss (paper: no value
    /// given; 1e-10, so `−log eps ≈ 23`).
    pub eps: f64,
    /// Rows evaluated at once; bounds the working memory.
    pub row_chunk: usize,
}

impl Default for LossParams {
    fn default() -> Self {
        Self {
            tau: 1.0,
            top_k: TopK::K(8192),
            lambda_kl: 1.0,
            lambda_uld: 1.0,
            eps: 1e-10,
            row_chunk: 64,
        }
    }
}

impl LossParams {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: String, why| Err(Error::BadParameter { name, value, why });
        if !(self.tau.is_finite() && self.tau > 0.0) {
            return bad(
                "tau",
                self.tau.to_string(),
                "must be a positive finite number",
            );
        }
        if self.top_k == TopK::K(0) {
            return bad("top_k", "0".into(), "must keep at least one entry");
        }
        for (name, value) in [
            ("lambda_kl", self.lambda_kl),
            ("lambda_uld", self.lambda_uld),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return bad(
                    name,
                    value.to_string(),
                    "must be a non-negative finite number",
                );
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad(
                "eps",
                self.eps.to_string(),
                "must be a positive finite number",
            );
        }
        if self.row_chunk == 0 {
            return bad("row_chunk", "0".into(), "must be at least 1");
        }
        Ok(())
    }
}

/// One side of a batch plan as the fused operations read it.
fn merge_plan(side: &SideIndices, mask: &[f32], rows: usize) -> MergePlan {
    MergePlan {
        rows,
        predict_row: side
            .predict_row
            .iter()
            .zip(mask)
            .map(|(&r, &m)| (m > 0.0).then_some(r as u32))
            .collect(),
        continuation: side
            .continuation_row
            .iter()
            .zip(&side.continuation_token)
            .zip(&side.continuation_chunk)
            .map(|((&r, &t), &c)| (r as u32, t as u32, c as u32))
            .collect(),
    }
}

/// Turns a kernel error into one that names the sequence and position at fault.
fn kernel_error(error: KernelError, student_len: usize, teacher_len: usize) -> Error {
    match error {
        KernelError::NonFinite { side, row } => {
            let len = if side == "teacher" {
                teacher_len
            } else {
                student_len
            }
            .max(1);
            Error::NonFiniteLogits {
                side,
                sequence: row / len,
                position: row % len,
            }
        }
        other => Error::Kernel(other),
    }
}

fn check_dims(what: &'static str, found: [usize; 3], batch: usize, len: usize) -> Result<()> {
    if found[0] != batch || found[1] != len {
        return Err(Error::Shape {
            what,
            expected: format!("[{batch}, {len}, vocabulary]"),
            found: format!("{found:?}"),
        });
    }
    Ok(())
}

/// One teacher's side of a batch: its top-K merged log-probabilities per chunk, and the student
/// side of the same plan, ready for any loss.
#[derive(Debug, Clone)]
pub struct TeacherTargets<B: XTokenBackend> {
    entries: TeacherEntries<B>,
    student: MergePlan,
    batch: usize,
    student_len: usize,
    teacher_len: usize,
    tau: f64,
}

impl<B: XTokenBackend> TeacherTargets<B> {
    /// Reads the teacher logits `[B, T_T, V_T]` of a batch laid out by `plan`.
    pub fn new(
        teacher_logits: Tensor<B, 3>,
        plan: &BatchPlan,
        params: &LossParams,
    ) -> Result<Self> {
        Self::build(teacher_logits, plan, params, false)
    }

    /// As [`TeacherTargets::new`], also measuring the teacher's confidence (mean `−CE`, `−H` and
    /// max-probability over its positions) for adaptive multi-teacher weighting.
    pub fn with_confidence(
        teacher_logits: Tensor<B, 3>,
        plan: &BatchPlan,
        params: &LossParams,
    ) -> Result<Self> {
        Self::build(teacher_logits, plan, params, true)
    }

    fn build(
        teacher_logits: Tensor<B, 3>,
        plan: &BatchPlan,
        params: &LossParams,
        confidence: bool,
    ) -> Result<Self> {
        params.validate()?;
        let [batch, len, vocab] = teacher_logits.dims();
        check_dims(
            "teacher logits",
            [batch, len, vocab],
            plan.batch,
            plan.teacher_len,
        )?;
        let rows = batch * len;
        let spec = EntriesSpec {
            merge: merge_plan(&plan.teacher, &plan.chunk_mask, rows),
            top_k: params.top_k.get(),
            tau: params.tau as f32,
            row_chunk: params.row_chunk,
            next_token: confidence.then(|| Arc::from(&plan.teacher.next_token[..])),
        };
        let logits = teacher_logits.into_primitive().tensor();
        let entries = B::xt_teacher_entries(logits, &spec)
            .map_err(|e| kernel_error(e, plan.student_len, plan.teacher_len))?;
        Ok(Self::laid_out(entries, plan, params.tau))
    }

    /// Entries for `plan`'s slots, with the student side of the same plan.
    fn laid_out(entries: TeacherEntries<B>, plan: &BatchPlan, tau: f64) -> Self {
        Self {
            entries,
            student: merge_plan(
                &plan.student,
                &plan.chunk_mask,
                plan.batch * plan.student_len,
            ),
            batch: plan.batch,
            student_len: plan.student_len,
            teacher_len: plan.teacher_len,
            tau,
        }
    }

    /// Targets from entries computed elsewhere (a stored teacher pass): `entries` holds, per
    /// chunk slot of `plan`, the top-K ids and merged log-probabilities that
    /// [`TeacherTargets::new`] would keep, for a teacher of `vocab` tokens at `params.tau`.
    pub fn from_host(
        entries: &HostEntries,
        vocab: usize,
        plan: &BatchPlan,
        params: &LossParams,
        device: &B::Device,
    ) -> Result<Self> {
        params.validate()?;
        let expected = plan.batch * plan.chunks * entries.k;
        if entries.ids.len() != expected || entries.logp.len() != expected {
            return Err(Error::Shape {
                what: "stored teacher entries",
                expected: format!(
                    "{expected} entries ({} slots × {})",
                    plan.batch * plan.chunks,
                    entries.k
                ),
                found: format!("{} ids, {} values", entries.ids.len(), entries.logp.len()),
            });
        }
        let entries = entries_to_device::<B>(entries, vocab, device);
        Ok(Self::laid_out(entries, plan, params.tau))
    }

    /// Entries kept per chunk.
    pub fn k(&self) -> usize {
        self.entries.k
    }

    /// The teacher's vocabulary size (the width of its logits).
    pub fn teacher_vocab(&self) -> usize {
        self.entries.vocab
    }

    /// Chunks the losses average over.
    pub fn valid_chunks(&self) -> usize {
        self.student.valid()
    }

    /// The confidence statistics, when built [`with_confidence`](Self::with_confidence).
    pub fn confidence(&self) -> Option<ConfidenceStats> {
        self.entries.confidence
    }

    /// Per chunk slot `[B·K, k]`: the kept teacher ids (best first) and their merged
    /// log-probabilities (−∞ on skipped slots).
    pub fn entries(&self) -> (Tensor<B, 2, burn::tensor::Int>, Tensor<B, 2>) {
        (
            Tensor::from_primitive(self.entries.ids.clone()),
            Tensor::from_primitive(TensorPrimitive::Float(self.entries.logp.clone())),
        )
    }
}

/// A teacher's loss bound to the tables it reads: the strict or relaxed common set (GOLD,
/// H-KL) or the learnable W (P-KL).
#[derive(Debug)]
pub struct Loss<'a, B: XTokenBackend> {
    kind: LossKind,
    common: Option<&'a CommonTables>,
    projection: Option<&'a pkl::LearnableProjection<B>>,
}

// Manual impls: derived ones would require `B: Copy`.
impl<B: XTokenBackend> Clone for Loss<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: XTokenBackend> Copy for Loss<'_, B> {}

impl<'a, B: XTokenBackend> Loss<'a, B> {
    /// Same-tokenizer KL on the teacher's top-K ([`kl`]).
    pub fn kl() -> Self {
        Self::bare(LossKind::Kl)
    }

    /// Sorted L1 on the whole vocabularies ([`uld`]).
    pub fn uld() -> Self {
        Self::bare(LossKind::Uld)
    }

    /// GOLD: common KL on the strict set + ULD on the remainders ([`gold`]).
    pub fn gold(strict: &'a CommonTables) -> Self {
        Self {
            common: Some(strict),
            ..Self::bare(LossKind::Gold)
        }
    }

    /// H-KL: GOLD on the set relaxed by W's top-1 ([`hkl`]).
    pub fn hkl(relaxed: &'a CommonTables) -> Self {
        Self {
            common: Some(relaxed),
            ..Self::bare(LossKind::Hkl)
        }
    }

    /// P-KL: KL against the projected, re-normalized student `Wᵀp̂_S` ([`pkl`]).
    pub fn pkl(w: &'a pkl::LearnableProjection<B>) -> Self {
        Self {
            projection: Some(w),
            ..Self::bare(LossKind::Pkl)
        }
    }

    /// `kind` with whichever of the tables it reads; an error names the one missing.
    pub fn new(
        kind: LossKind,
        common: Option<&'a CommonTables>,
        projection: Option<&'a pkl::LearnableProjection<B>>,
    ) -> Result<Self> {
        let missing = |what: &'static str| Error::BadParameter {
            name: "loss",
            value: kind.name().to_string(),
            why: what,
        };
        Ok(match kind {
            LossKind::Kl => Self::kl(),
            LossKind::Uld => Self::uld(),
            LossKind::Gold => Self::gold(common.ok_or(missing("needs the strict common set"))?),
            LossKind::Hkl => Self::hkl(common.ok_or(missing("needs the relaxed common set"))?),
            LossKind::Pkl => Self::pkl(projection.ok_or(missing("needs the projection W"))?),
        })
    }

    fn bare(kind: LossKind) -> Self {
        Self {
            kind,
            common: None,
            projection: None,
        }
    }

    /// Which loss this is.
    pub fn kind(&self) -> LossKind {
        self.kind
    }

    /// The paper's name of the loss.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }
}

/// Evaluates `loss` on the student logits `[B, T_S, V_S]` against one teacher's targets: the
/// mean over compared chunks of the per-chunk loss, times τ², as a `[1]` tensor.
pub fn evaluate<B: XTokenBackend>(
    student_logits: Tensor<B, 3>,
    targets: &TeacherTargets<B>,
    loss: Loss<'_, B>,
    params: &LossParams,
) -> Result<Tensor<B, 1>> {
    params.validate()?;
    if params.tau != targets.tau {
        return Err(Error::BadParameter {
            name: "tau",
            value: params.tau.to_string(),
            why: "the teacher targets were built with another temperature",
        });
    }
    let [batch, len, vocab] = student_logits.dims();
    check_dims(
        "student logits",
        [batch, len, vocab],
        targets.batch,
        targets.student_len,
    )?;
    let teacher_vocab = targets.entries.vocab;
    let common = match loss.common {
        Some(tables) => Some(tables.pairs_for(vocab, teacher_vocab)?),
        None => None,
    };
    let projection = match loss.projection {
        Some(w) => Some(w.tensors(vocab, teacher_vocab)?),
        None => None,
    };
    let spec = DistillSpec {
        loss: loss.kind,
        merge: targets.student.clone(),
        tau: params.tau as f32,
        row_chunk: params.row_chunk,
        common,
        lambda_kl: params.lambda_kl as f32,
        lambda_uld: params.lambda_uld as f32,
        eps: params.eps as f32,
    };
    let logits = student_logits.into_primitive().tensor();
    let out = B::xt_distill(
        logits,
        targets.entries.clone(),
        projection,
        &spec,
        GradRequest::default(),
    )
    .map_err(|e| kernel_error(e, targets.student_len, targets.teacher_len))?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out.value)))
}
