//! The three passes of a distillation loss on the host, shared by every objective: the merge
//! shifts (continuation rows), the predicting rows (the objective's loss and gradient, from
//! [`RowLoss`]), and the continuation rows' gradient.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorData, TensorMetadata};

use super::hybrid::Hybrid;
use super::kl::Kl;
use super::merge::{finite, merge_shifts, softmax_into, Continuations};
use super::pkl::Projected;
use super::rows::{float3, par_items, read_floats, read_ints, GradRows, LogitRows, TensorRows};
use crate::checks::{check_id_range, check_tau, check_teacher, finite_loss, id_range};
use crate::error::KernelError;
use crate::loss_kind::LossKind;
use crate::spec::{DistillSpec, GradRequest};
use crate::{LossOutput, ProjectionTensors, TeacherEntries};

/// Read-only inputs of every predicting row.
pub(super) struct RowCtx<'a> {
    pub(super) tau_inv: f32,
    /// τ² / valid chunks.
    pub(super) scale: f64,
    /// Teacher entries per slot.
    pub(super) k: usize,
    pub(super) teacher_ids: &'a [i64],
    pub(super) teacher_logp: &'a [f32],
}

impl RowCtx<'_> {
    /// The teacher's kept ids and merged log-probabilities of `slot`.
    pub(super) fn teacher(&self, slot: usize) -> (&[i64], &[f32]) {
        let range = slot * self.k..(slot + 1) * self.k;
        (&self.teacher_ids[range.clone()], &self.teacher_logp[range])
    }
}

/// Per-thread buffers of the predicting rows.
pub(super) struct Scratch {
    /// The row's tempered softmax.
    pub(super) p: Vec<f32>,
    /// `∂loss/∂lp̂` over the student vocabulary.
    pub(super) h: Vec<f32>,
    /// Hybrid: the student's uncommon `(probability, id)`.
    pub(super) uncommon: Vec<(f32, u32)>,
    /// Hybrid: the teacher's entries without a student partner.
    pub(super) teacher_rest: Vec<f32>,
    /// P-KL: this thread's share of W's gradient.
    pub(super) grad_weights: Vec<f64>,
}

/// One objective's math on a predicting row.
pub(super) trait RowLoss: Sync {
    /// Length of the per-thread W buffer (P-KL with W's gradient requested; else 0).
    fn weights_len(&self) -> usize {
        0
    }

    /// Turns the summed per-thread W buffers into W's gradient `[V_S·K_w]`.
    fn finish_weights(&self, sum: Vec<f64>) -> Vec<f64> {
        sum
    }

    /// Fills `s.h` (zeroed, with `s.p` the row's softmax) and returns the row's loss; `sigma`
    /// is the slot's merge shift, `lse` the row's log-sum-exp.
    fn row(
        &self,
        ctx: &RowCtx<'_>,
        s: &mut Scratch,
        slot: usize,
        sigma: f64,
        z: &[f32],
        lse: f32,
    ) -> f64;
}

/// What the host evaluation returns.
pub struct HostLoss {
    /// The loss.
    pub value: f64,
    /// `[B·T·V]`, when requested.
    pub grad_logits: Option<Vec<f32>>,
    /// `[V_S·K_w]`, when requested.
    pub grad_weights: Option<Vec<f32>>,
}

/// A distillation loss on any backend (see [`crate::XTokenBackend::xt_distill`]).
pub fn distill<B: Backend>(
    logits: FloatTensor<B>,
    teacher: TeacherEntries<B>,
    projection: Option<ProjectionTensors<B>>,
    spec: &DistillSpec,
    want: GradRequest,
) -> Result<LossOutput<B>, KernelError> {
    let weights_dtype = projection.as_ref().map(|p| p.weights.dtype());
    on_tensor_rows(logits, weights_dtype, |src| {
        distill_from(src, teacher, projection, spec, want)
    })
}

/// Evaluates `f` on logits `[B, T, V]` of any backend, read one row chunk at a time, and
/// uploads its result on their device (see [`loss_to_device`] for the dtypes).
pub(super) fn on_tensor_rows<B: Backend>(
    logits: FloatTensor<B>,
    weights_dtype: Option<DType>,
    f: impl FnOnce(&TensorRows<B>) -> Result<HostLoss, KernelError>,
) -> Result<LossOutput<B>, KernelError> {
    let tensor = float3::<B>(logits.clone());
    let host = f(&TensorRows::<B>::new(logits))?;
    let dtypes = OutputDtypes {
        logits: tensor.dtype(),
        weights: weights_dtype.unwrap_or(DType::F32),
    };
    Ok(loss_to_device(
        host,
        tensor.dims(),
        dtypes,
        &tensor.device(),
    ))
}

/// The dtypes of the inputs whose gradients a loss returns.
#[derive(Debug, Clone, Copy)]
pub struct OutputDtypes {
    /// The logits' (their gradient flows back into the output head in that dtype).
    pub logits: DType,
    /// W's values'.
    pub weights: DType,
}

/// Uploads a host result as the [`LossOutput`] tensors: the value in f32 whatever the logits'
/// dtype (a loss is a reduction, and its value meets other f32 values: a 16-bit value there
/// would be read as f32), each gradient in the dtype of its input.
pub fn loss_to_device<B: Backend>(
    host: HostLoss,
    shape: [usize; 3],
    dtypes: OutputDtypes,
    device: &B::Device,
) -> LossOutput<B> {
    let upload = |data: TensorData, dtype: DType| {
        let data = if dtype == DType::F32 {
            data
        } else {
            data.convert_dtype(dtype)
        };
        B::float_from_data(data, device)
    };
    let [_, _, v] = shape;
    LossOutput {
        value: upload(TensorData::new(vec![host.value as f32], [1]), DType::F32),
        grad_logits: host
            .grad_logits
            .map(|g| upload(TensorData::new(g, shape), dtypes.logits)),
        grad_weights: host.grad_weights.map(|g| {
            let kw = g.len() / v.max(1);
            upload(TensorData::new(g, [v, kw]), dtypes.weights)
        }),
    }
}

/// A distillation loss from rows of the student logits; the small inputs (teacher entries,
/// projection) are read from their tensors.
pub fn distill_from<S: LogitRows, B: Backend>(
    src: &S,
    teacher: TeacherEntries<B>,
    projection: Option<ProjectionTensors<B>>,
    spec: &DistillSpec,
    want: GradRequest,
) -> Result<HostLoss, KernelError> {
    let (n, v) = (src.rows(), src.vocab());
    check_tau(spec.tau)?;
    spec.merge.check("student", n, v)?;
    check_teacher(&teacher, spec.merge.slots())?;
    let (k, teacher_vocab) = (teacher.k, teacher.vocab);
    let teacher_ids = read_ints::<B>(teacher.ids, "teacher ids")?;
    let teacher_logp = read_floats::<B>(teacher.logp, "teacher log-probabilities")?;
    // KL reads the teacher's ids as student ids.
    let id_limit = if spec.loss == LossKind::Kl {
        v
    } else {
        teacher_vocab
    };
    check_id_range(id_range(&teacher_ids), 0, id_limit, "teacher ids", "token")?;
    let valid = spec.merge.valid();
    let tau = spec.tau as f64;
    let ctx = RowCtx {
        tau_inv: 1.0 / spec.tau,
        scale: if valid > 0 {
            tau * tau / valid as f64
        } else {
            0.0
        },
        k,
        teacher_ids: &teacher_ids,
        teacher_logp: &teacher_logp,
    };
    let mut grad = if want.logits {
        vec![0.0f32; n * v]
    } else {
        Vec::new()
    };
    let passes = Passes {
        src,
        spec,
        ctx: &ctx,
        want_logits: want.logits,
    };
    let (value, grad_weights) = match spec.loss {
        LossKind::Kl => passes.run(&Kl, &mut grad)?,
        LossKind::Pkl => {
            let w = projection.ok_or(KernelError::Invalid {
                what: "loss",
                why: "P-KL needs the projection W".into(),
            })?;
            let projected = Projected::read::<B>(w, v, teacher_vocab, spec.eps, want.weights)?;
            passes.run(&projected, &mut grad)?
        }
        LossKind::Gold | LossKind::Hkl | LossKind::Uld => {
            passes.run(&Hybrid::new(spec, v, teacher_vocab)?, &mut grad)?
        }
    };
    Ok(HostLoss {
        value: finite_loss(value, spec.loss.name())?,
        grad_logits: want.logits.then_some(grad),
        grad_weights: grad_weights.map(|g| g.into_iter().map(|x| x as f32).collect()),
    })
}

/// The passes of one evaluation over the student's rows.
struct Passes<'a, S: LogitRows> {
    src: &'a S,
    spec: &'a DistillSpec,
    ctx: &'a RowCtx<'a>,
    want_logits: bool,
}

impl<S: LogitRows> Passes<'_, S> {
    /// Runs the three passes for `objective`; returns the loss and W's gradient (P-KL, when
    /// requested).
    fn run<O: RowLoss>(
        &self,
        objective: &O,
        grad: &mut [f32],
    ) -> Result<(f64, Option<Vec<f64>>), KernelError> {
        let (v, ctx) = (self.src.vocab(), self.ctx);
        let merge = &self.spec.merge;
        let row_chunk = self.spec.row_chunk.max(1);
        let cont = Continuations::new(merge);
        let sigma = merge_shifts(self.src, merge, &cont, ctx.tau_inv, row_chunk, "student")?;
        let mut grad_rows = GradRows::new(grad, v);
        let (total, dsigma, scratches) =
            self.predicting(objective, &sigma, &mut grad_rows, row_chunk)?;
        let len = objective.weights_len();
        let grad_weights = (len > 0).then(|| {
            let mut parts = scratches.into_iter().map(|s| s.grad_weights);
            let first = parts.next().unwrap_or_else(|| vec![0.0; len]);
            let sum = parts.fold(first, |mut sum, part| {
                sum.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
                sum
            });
            objective.finish_weights(sum)
        });
        if self.want_logits && !cont.rows.is_empty() {
            self.continuation_grad(&cont, &dsigma, &mut grad_rows, row_chunk)?;
        }
        Ok((total * ctx.scale, grad_weights))
    }

    /// The predicting rows: the objective's loss, `Σh` per slot, and their gradient rows
    /// `s/τ · (h − p · Σh)`.
    fn predicting<O: RowLoss>(
        &self,
        objective: &O,
        sigma: &[f64],
        grad_rows: &mut GradRows<'_>,
        row_chunk: usize,
    ) -> Result<(f64, Vec<f64>, Vec<Scratch>), KernelError> {
        let (v, ctx) = (self.src.vocab(), self.ctx);
        let valid: Vec<(usize, u32)> = self.spec.merge.predicting().collect();
        let mut total = 0.0f64;
        let mut dsigma = vec![0.0f64; self.spec.merge.slots()];
        let mut scratches = Vec::new();
        let make = || Scratch {
            p: vec![0.0; v],
            h: vec![0.0; v],
            uncommon: Vec::new(),
            teacher_rest: Vec::new(),
            grad_weights: vec![0.0; objective.weights_len()],
        };
        for chunk in valid.chunks(row_chunk) {
            let rows: Vec<u32> = chunk.iter().map(|&(_, r)| r).collect();
            let block = self.src.read(&rows, "student")?;
            let mut items = grad_rows.lend(&rows);
            let results = par_items(&mut items, &mut scratches, make, |s, item| {
                let (slot, row) = chunk[item.index];
                let z = block.row(item.index, row, v);
                let lse = softmax_into(z, ctx.tau_inv, &mut s.p);
                finite(lse, "student", row)?;
                s.h.fill(0.0);
                let loss = objective.row(ctx, s, slot, sigma[slot], z, lse);
                let dsigma: f64 = s.h.iter().map(|&h| h as f64).sum();
                if let Some(out) = item.grad.as_deref_mut() {
                    let c = (ctx.scale * ctx.tau_inv as f64) as f32;
                    let d = dsigma as f32;
                    for ((g, &h), &p) in out.iter_mut().zip(&s.h).zip(&s.p) {
                        *g += c * (h - p * d);
                    }
                }
                Ok::<_, KernelError>((loss, dsigma))
            });
            grad_rows.give_back(items);
            for (i, result) in results.into_iter().enumerate() {
                let (loss, ds) = result?;
                total += loss;
                dsigma[chunk[i].0] += ds;
            }
        }
        Ok((total, dsigma, scratches))
    }

    /// The continuation rows' gradient: reading token `x` for slot `c`,
    /// `∂/∂z = s/τ · Σh_c · (e_x − p)`.
    fn continuation_grad(
        &self,
        cont: &Continuations,
        dsigma: &[f64],
        grad_rows: &mut GradRows<'_>,
        row_chunk: usize,
    ) -> Result<(), KernelError> {
        let (v, ctx) = (self.src.vocab(), self.ctx);
        let c = (ctx.scale * ctx.tau_inv as f64) as f32;
        let mut buffers = Vec::new();
        for (chunk_index, rows) in cont.rows.chunks(row_chunk).enumerate() {
            let base = chunk_index * row_chunk;
            let block = self.src.read(rows, "student")?;
            let mut items = grad_rows.lend(rows);
            par_items(
                &mut items,
                &mut buffers,
                || vec![0.0f32; v],
                |p, item| {
                    let z = block.row(item.index, item.row, v);
                    softmax_into(z, ctx.tau_inv, p);
                    let row_terms = &cont.terms[base + item.index];
                    let total: f64 = row_terms
                        .iter()
                        .map(|&(_, slot)| dsigma[slot as usize])
                        .sum();
                    let Some(out) = item.grad.as_deref_mut() else {
                        return;
                    };
                    let total = c * total as f32;
                    for (g, &pj) in out.iter_mut().zip(p.iter()) {
                        *g -= total * pj;
                    }
                    for &(token, slot) in row_terms {
                        out[token as usize] += c * dsigma[slot as usize] as f32;
                    }
                },
            );
            grad_rows.give_back(items);
        }
        Ok(())
    }
}
