//! The launches whose kernels the CUDA check compiles: every operation of [`XTokenBackend`] in
//! each variant a training step, `xtoken eval` and on-policy sampling take, at small sizes (a
//! kernel's source depends on its dtype, its cube size and its compile-time flags, not on the
//! sizes of its buffers).
//!
//! - the teacher's top-K (K at most one cube of units and above it; with the next-token
//!   confidence statistics of adaptive weighting), and every row's as `xtoken teach` stores it
//!   (with the observed token's log-probability and rank);
//! - every loss's forward and backward on a merge plan with continuations and skipped slots:
//!   KL, P-KL (W's gradient asked and not), GOLD, H-KL (many-to-one common set), ULD; P-KL
//!   once more with the device checks deferred, as a training step runs it;
//! - the cross-entropy, with and without its gradient;
//! - attention forward and backward at head dims 64, 96 and 128 (grouped heads, causal with a
//!   sliding window and padded keys), as the models' training pass, evaluation and sampling
//!   call it;
//! - AdamW's fused update, the first (no moments) and a later one.

use std::sync::Arc;

use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::adamw::{AdamWStep, Moments};
use crate::attention::{AttentionSaved, AttentionSpec};
use crate::deferred::defer;
use crate::{
    CommonPairs, DistillSpec, EntriesSpec, GradRequest, KernelError, LossKind, MergePlan,
    ProjectionTensors, TeacherEntries, XTokenBackend,
};

/// The head dims of the shipped models (Llama-3.2-1B and Qwen3: 64 and 128; Phi-4-mini: 96).
pub const HEAD_DIMS: [usize; 3] = [64, 96, 128];

/// W's slots per student token: the default of `ProjectionParams::top_k` (a kernel is compiled
/// per slot count).
pub const W_SLOTS: usize = 4;

const BATCH: usize = 2;
const LEN: usize = 24;
const STUDENT_VOCAB: usize = 1000;
const TEACHER_VOCAB: usize = 1200;

/// A deterministic value in `[-1, 1)`.
fn unit(i: usize, salt: usize) -> f32 {
    let mut x = (i as u64 ^ (salt as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 31;
    (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// Runs every launch of the module's list on `B` with float tensors in `dtype`; `label` is
/// called with a description before each group of launches (after the device is synchronized).
pub fn run_on<B: XTokenBackend>(
    device: &B::Device,
    dtype: DType,
    label: &mut dyn FnMut(&str),
) -> Result<(), KernelError> {
    let mut step = |what: &str| -> Result<(), KernelError> {
        B::sync(device).map_err(|e| KernelError::Invalid {
            what: "device",
            why: format!("{e:?}"),
        })?;
        label(&format!("{}: {what}", dtype_name(dtype)));
        Ok(())
    };
    let case = Case::new();
    step("teacher top-K, K = 64")?;
    case.entries::<B>(TEACHER_VOCAB, 64, false, dtype, device)?;
    step("teacher top-K, K = 512, with next-token confidence")?;
    case.entries::<B>(TEACHER_VOCAB, 512, true, dtype, device)?;
    step("a stored teacher's targets (every row's top-K, observed token, confidence), K = 64")?;
    case.positions::<B>(64, dtype, device)?;
    let want = |weights| GradRequest {
        logits: true,
        weights,
    };
    for (loss, weights, what) in [
        (LossKind::Kl, false, "KL forward + backward"),
        (
            LossKind::Pkl,
            true,
            "P-KL forward + backward (logits and W)",
        ),
        (LossKind::Pkl, false, "P-KL forward + backward (logits)"),
        (LossKind::Gold, false, "GOLD forward + backward"),
        (LossKind::Hkl, false, "H-KL forward + backward"),
        (LossKind::Uld, false, "ULD forward + backward"),
    ] {
        step(what)?;
        case.distill::<B>(loss, want(weights), dtype, device)?;
    }
    step("P-KL forward + backward, checks deferred (a training step)")?;
    {
        let _deferred = defer();
        case.distill::<B>(LossKind::Pkl, want(true), dtype, device)?;
    }
    for grad in [true, false] {
        step(if grad {
            "cross-entropy with its gradient"
        } else {
            "cross-entropy"
        })?;
        let logits = case.floats::<B>(&case.student, STUDENT_VOCAB, dtype, device);
        B::xt_cross_entropy(logits, &case.targets, 7, grad)?;
    }
    for head_dim in HEAD_DIMS {
        step(&format!(
            "attention forward + backward, head dim {head_dim}"
        ))?;
        attention::<B>(head_dim, dtype, device)?;
    }
    for later in [false, true] {
        step(if later {
            "AdamW, a later update"
        } else {
            "AdamW, the first update"
        })?;
        adamw::<B>(later, dtype, device);
    }
    step("done")?;
    Ok(())
}

/// The name of a float dtype as the manifest writes it.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "other",
    }
}

/// Logits, W, a merge plan and targets, as the kernels' tests make them.
struct Case {
    student: Vec<f32>,
    teacher: Vec<f32>,
    narrow_teacher: Vec<f32>,
    merge: MergePlan,
    targets: Vec<i32>,
}

impl Case {
    fn new() -> Self {
        let n = BATCH * LEN;
        let values = |width: usize, salt| (0..n * width).map(|i| 4.0 * unit(i, salt)).collect();
        // Chunks of 1–3 positions (the first predicts, the others continue); the last chunk of
        // the last sequence is padding (a skipped slot).
        let mut predict_row = Vec::new();
        let mut continuation = Vec::new();
        for b in 0..BATCH {
            let mut p = 0;
            while p < LEN {
                let size = 1 + (b + p) % 3;
                let slot = predict_row.len() as u32;
                let padded = b + 1 == BATCH && p + size >= LEN;
                predict_row.push((!padded).then_some((b * LEN + p) as u32));
                for q in p + 1..(p + size).min(LEN) {
                    let token = ((b * LEN + q) * 37 % STUDENT_VOCAB) as u32;
                    continuation.push(((b * LEN + q) as u32, token, slot));
                }
                p += size;
            }
        }
        let targets = (0..n)
            .map(|r| match r % 9 {
                4 => -1,
                _ => (r * 131 % STUDENT_VOCAB) as i32,
            })
            .collect();
        Self {
            student: values(STUDENT_VOCAB, 1),
            teacher: values(TEACHER_VOCAB, 2),
            narrow_teacher: values(STUDENT_VOCAB, 3),
            merge: MergePlan {
                rows: n,
                predict_row,
                continuation,
            },
            targets,
        }
    }

    fn floats<B: XTokenBackend>(
        &self,
        data: &[f32],
        width: usize,
        dtype: DType,
        device: &B::Device,
    ) -> burn::tensor::ops::FloatTensor<B> {
        let data = TensorData::new(data.to_vec(), [BATCH, LEN, width]);
        Tensor::<B, 3>::from_data(data, device)
            .cast(dtype)
            .into_primitive()
            .tensor()
    }

    fn entries<B: XTokenBackend>(
        &self,
        vocab: usize,
        top_k: usize,
        confidence: bool,
        dtype: DType,
        device: &B::Device,
    ) -> Result<TeacherEntries<B>, KernelError> {
        let data = if vocab == TEACHER_VOCAB {
            &self.teacher
        } else {
            &self.narrow_teacher
        };
        let next: Vec<i32> = (0..self.merge.rows)
            .map(|r| (r * 53 % vocab) as i32)
            .collect();
        let spec = EntriesSpec {
            merge: self.merge.clone(),
            top_k,
            tau: 0.7,
            row_chunk: 16,
            next_token: confidence.then(|| Arc::from(next)),
        };
        B::xt_teacher_entries(self.floats::<B>(data, vocab, dtype, device), &spec)
    }

    /// `xtoken teach`'s and `xtoken serve`'s selection: every row's top-K at τ ≠ 1 (so the
    /// confidence terms take their own untempered pass), the last row without a next token.
    fn positions<B: XTokenBackend>(
        &self,
        top_k: usize,
        dtype: DType,
        device: &B::Device,
    ) -> Result<(), KernelError> {
        let next: Vec<i32> = (0..self.merge.rows)
            .map(|r| match r + 1 == self.merge.rows {
                true => -1,
                false => (r * 53 % TEACHER_VOCAB) as i32,
            })
            .collect();
        let logits = self.floats::<B>(&self.teacher, TEACHER_VOCAB, dtype, device);
        B::xt_position_targets(logits, &next, top_k, 0.7, true).map(|_| ())
    }

    fn distill<B: XTokenBackend>(
        &self,
        loss: LossKind,
        want: GradRequest,
        dtype: DType,
        device: &B::Device,
    ) -> Result<(), KernelError> {
        let kl = loss == LossKind::Kl;
        let vocab = if kl { STUDENT_VOCAB } else { TEACHER_VOCAB };
        let teacher = self.entries::<B>(vocab, 64, false, dtype, device)?;
        let projection = (loss == LossKind::Pkl).then(|| projection::<B>(dtype, device));
        let common = match loss {
            LossKind::Gold => Some(common_pairs(false)?),
            LossKind::Hkl => Some(common_pairs(true)?),
            _ => None,
        };
        let spec = DistillSpec {
            loss,
            merge: self.merge.clone(),
            tau: 0.7,
            row_chunk: 16,
            common: common.map(Arc::new),
            lambda_kl: 0.8,
            lambda_uld: 1.0,
            eps: 1e-10,
        };
        let logits = self.floats::<B>(&self.student, STUDENT_VOCAB, dtype, device);
        B::xt_distill(logits, teacher, projection, &spec, want)?;
        Ok(())
    }
}

/// W with 1..=[`W_SLOTS`] teacher ids per student token (some rows empty).
fn projection<B: XTokenBackend>(dtype: DType, device: &B::Device) -> ProjectionTensors<B> {
    let (vs, kw) = (STUDENT_VOCAB, W_SLOTS);
    let mut indices = vec![-1i32; vs * kw];
    let mut weights = vec![0.0f32; vs * kw];
    for s in (0..vs).filter(|s| s % 50 != 7) {
        let used = 1 + s % kw;
        for j in 0..used {
            indices[s * kw + j] = ((s * 104_729 + j * 7_919) % TEACHER_VOCAB) as i32;
            weights[s * kw + j] = 1.0 / used as f32;
        }
    }
    ProjectionTensors {
        indices: Tensor::<B, 2, Int>::from_data(TensorData::new(indices, [vs, kw]), device)
            .into_primitive(),
        weights: Tensor::<B, 2>::from_data(TensorData::new(weights, [vs, kw]), device)
            .cast(dtype)
            .into_primitive()
            .tensor(),
        layout: None,
    }
}

/// A 1-to-1 common set over about 70 % of the student vocabulary; `relaxed` adds many-to-one
/// pairs (H-KL's set).
fn common_pairs(relaxed: bool) -> Result<CommonPairs, KernelError> {
    let mut pairs: Vec<(u32, u32)> = (0..STUDENT_VOCAB as u32)
        .filter(|s| s % 10 < 7)
        .map(|s| (s, (s * 7 + 3) % TEACHER_VOCAB as u32))
        .collect();
    if relaxed {
        pairs.extend(
            (0..STUDENT_VOCAB as u32)
                .filter(|s| s % 10 == 8)
                .map(|s| (s, (s * 7 + 3 - 7) % TEACHER_VOCAB as u32)),
        );
    }
    CommonPairs::new(&pairs, STUDENT_VOCAB, TEACHER_VOCAB)
}

/// Grouped-query attention (4 query heads over 2 key heads), causal with a window of 16 and
/// the last keys of the second sequence padded, forward and backward.
fn attention<B: XTokenBackend>(
    head_dim: usize,
    dtype: DType,
    device: &B::Device,
) -> Result<(), KernelError> {
    let (heads, kv_heads, len) = (4, 2, 40);
    let tensor = |h: usize, salt| {
        let data: Vec<f32> = (0..BATCH * h * len * head_dim)
            .map(|i| unit(i, salt))
            .collect();
        Tensor::<B, 4>::from_data(TensorData::new(data, [BATCH, h, len, head_dim]), device)
            .cast(dtype)
            .into_primitive()
            .tensor()
    };
    let (q, k, v) = (tensor(heads, 4), tensor(kv_heads, 5), tensor(kv_heads, 6));
    let padding: Vec<bool> = (0..BATCH * len).map(|i| i >= 2 * len - 3).collect();
    let spec = AttentionSpec {
        window: Some(16),
        key_padding: Some(Arc::from(padding)),
        ..AttentionSpec::causal(head_dim)
    };
    let attended = B::xt_attention(q.clone(), k.clone(), v.clone(), &spec)?;
    let saved = AttentionSaved {
        q,
        k,
        v,
        output: attended.output,
        lse: attended.lse,
    };
    B::xt_attention_backward(saved, tensor(heads, 7), &spec)?;
    Ok(())
}

/// One AdamW update of a `[300, 7]` parameter, with its gradient's clipping.
fn adamw<B: XTokenBackend>(later: bool, dtype: DType, device: &B::Device) {
    let tensor = |salt| {
        let data: Vec<f32> = (0..2100).map(|i| 0.02 * unit(i, salt)).collect();
        Tensor::<B, 2>::from_data(TensorData::new(data, [300, 7]), device)
            .cast(dtype)
            .into_primitive()
            .tensor()
    };
    let moments = later.then(|| Moments {
        first: tensor(8),
        second: B::float_abs(tensor(9)),
    });
    let step = AdamWStep {
        lr: 3e-4,
        beta_1: 0.9,
        beta_2: 0.95,
        epsilon: 1e-8,
        weight_decay: 0.1,
        time: if later { 2 } else { 1 },
        grad_scale: 0.5,
    };
    B::xt_adamw(tensor(10), tensor(11), moments, &step);
}
