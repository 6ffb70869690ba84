//! One optimizer step. Per micro-batch every teacher runs without a graph and keeps its top-K
//! targets; the student runs forward and backward (layer by layer with activation
//! checkpointing) under `L = sg(L_CE / L_KD) · L_KD + L_CE` with `L_KD = Σ_m α_m L_m`. The
//! gradients are summed over micro-batches (the loss is scaled by 1 / micro-batches) and
//! averaged over data-parallel workers; the student's are clipped to a global norm and applied
//! by AdamW, and each learnable W takes its own AdamW step, unclipped.

use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use xtoken_core::loss::multi::{self, Weighting};
use xtoken_core::loss::pkl::LearnableProjection;
use xtoken_core::loss::{ce, scaling, LossParams, XTokenBackend};
use xtoken_models::Transformer;

use crate::backend::TrainBackend;
use crate::config::RunConfig;
use crate::data::{MicroBatch, StepBatch};
use crate::error::{Context, Error, Result};
use crate::optim::{clip_global_norm, Trainable};
use crate::parallel::{Exchange, Worker};
use crate::teachers::{ids_tensor, padding_tensor, Teacher};

/// How every micro-batch's loss is formed.
#[derive(Debug, Clone)]
pub struct LossSetup {
    /// τ, top-K, λ, row chunk.
    pub params: LossParams,
    /// Static or adaptive teacher weights.
    pub weighting: Weighting,
    /// `L = sg(L_CE / L_KD) · L_KD + L_CE` instead of `L_CE + L_KD`.
    pub dynamic_scaling: bool,
    /// Recompute each decoder layer in the backward pass.
    pub checkpointing: bool,
}

impl LossSetup {
    /// The setup a run configuration describes.
    pub fn of(config: &RunConfig) -> Result<Self> {
        Ok(Self {
            params: config.loss_params(),
            weighting: config.weighting()?,
            dynamic_scaling: config.loss.dynamic_scaling,
            checkpointing: config.training.activation_checkpointing,
        })
    }
}

/// The loss values of a micro-batch, or their mean over a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossValues {
    /// The optimized loss (with dynamic scaling: `2 · L_CE` in value).
    pub loss: f64,
    /// The student's next-token cross-entropy.
    pub ce: f64,
    /// `Σ_m α_m L_m`.
    pub kd: f64,
    /// Per teacher: `L_m` and `α_m`.
    pub teachers: Vec<(f64, f64)>,
}

/// The gradients and values of one micro-batch.
pub struct MicroOutcome {
    /// The student's gradients.
    pub student: GradientsParams,
    /// Per teacher, its learnable W's gradients.
    pub projections: Vec<Option<GradientsParams>>,
    /// The loss values.
    pub values: LossValues,
}

/// Forward and backward of one micro-batch, its loss scaled by `scale`.
pub fn micro_step<B: TrainBackend>(
    student: &Transformer<B>,
    teachers: &[Teacher<B>],
    micro: &MicroBatch,
    setup: &LossSetup,
    scale: f64,
    device: &B::Device,
) -> Result<MicroOutcome> {
    let targets = teachers
        .iter()
        .zip(&micro.teachers)
        .map(|(t, batch)| t.targets(batch, micro.rows, &setup.params, setup.weighting, device))
        .collect::<Result<Vec<_>>>()?;
    let terms = teachers
        .iter()
        .zip(&targets)
        .map(|(t, targets)| {
            Ok(multi::Teacher {
                targets,
                loss: t.loss()?,
                alpha: t.settings.alpha,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let ids = ids_tensor::<B>(&micro.student_ids, micro.rows, micro.student_len, device);
    let padding = padding_tensor::<B>(
        &micro.student_padding,
        micro.rows,
        micro.student_len,
        device,
    );
    let next_token = &micro.teachers[0].plan.student.next_token;
    let mut recorded = None;
    let backward =
        student.forward_backward(ids, padding, setup.checkpointing, |model, hidden| {
            let logits = model.logits_from_hidden(hidden);
            let (total, parts) = objective(logits, next_token, &terms, setup)?;
            recorded = Some(parts);
            Ok::<_, Error>(total.mul_scalar(scale))
        })?;
    let values = recorded
        .ok_or_else(|| Error::Run("the loss was not evaluated".into()))?
        .values();
    let mut rest = backward.rest;
    let projections = teachers
        .iter()
        .map(|t| {
            t.projection
                .as_ref()
                .map(|w| GradientsParams::from_module(&mut rest, w))
        })
        .collect();
    Ok(MicroOutcome {
        student: backward.model,
        projections,
        values,
    })
}

/// `L` of a micro-batch's student logits: cross-entropy and the teachers' weighted losses,
/// combined by dynamic scaling (or summed); with its parts, detached from the graph so that no
/// node outlives the backward pass.
fn objective<B: AutodiffBackend + XTokenBackend>(
    logits: Tensor<B, 3>,
    next_token: &[i32],
    terms: &[multi::Teacher<'_, B>],
    setup: &LossSetup,
) -> Result<(Tensor<B, 1>, LossParts<B>)> {
    let ce =
        ce::loss(logits.clone(), next_token, &setup.params).context("student cross-entropy")?;
    let kd = multi::loss(logits, terms, setup.weighting, &setup.params)?;
    let total = if setup.dynamic_scaling {
        scaling::dynamic(ce.clone(), kd.total.clone())
    } else {
        ce.clone() + kd.total.clone()
    };
    let parts = LossParts {
        total: total.clone().inner(),
        ce: ce.inner(),
        kd: kd.total.inner(),
        per_teacher: kd.per_teacher.into_iter().map(|l| l.inner()).collect(),
        alphas: kd.alphas,
    };
    Ok((total, parts))
}

/// A micro-batch's loss and its parts, off the graph.
struct LossParts<B: AutodiffBackend> {
    total: Tensor<B::InnerBackend, 1>,
    ce: Tensor<B::InnerBackend, 1>,
    kd: Tensor<B::InnerBackend, 1>,
    per_teacher: Vec<Tensor<B::InnerBackend, 1>>,
    alphas: Vec<f64>,
}

impl<B: AutodiffBackend> LossParts<B> {
    /// The values, read back.
    fn values(self) -> LossValues {
        let scalar = |t: Tensor<B::InnerBackend, 1>| t.into_scalar().elem::<f64>();
        LossValues {
            loss: scalar(self.total),
            ce: scalar(self.ce),
            kd: scalar(self.kd),
            teachers: self
                .per_teacher
                .into_iter()
                .map(scalar)
                .zip(self.alphas)
                .collect(),
        }
    }
}

/// What a step reports.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// The loss values, averaged over micro-batches and workers.
    pub values: LossValues,
    /// The student's gradient norm before clipping.
    pub grad_norm: f64,
    /// Student tokens of the step over all workers.
    pub tokens: u64,
}

/// The rates and clipping of one step.
#[derive(Debug, Clone, Copy)]
pub struct StepRates {
    /// The student's learning rate.
    pub lr: f64,
    /// The student's global gradient-norm bound (0: none).
    pub grad_clip: f64,
    /// W's learning rate.
    pub projection_lr: f64,
}

/// One optimizer step over this worker's micro-batches of `batch`: accumulate, average over
/// the workers, clip, and apply. A non-finite loss stops before the weights are touched.
pub fn step<B: TrainBackend>(
    trainable: &mut Trainable<B>,
    teachers: &mut [Teacher<B>],
    batch: &StepBatch,
    setup: &LossSetup,
    rates: StepRates,
    worker: &Worker,
    device: &B::Device,
) -> Result<StepOutcome> {
    let summed = accumulate(&trainable.student, teachers, batch, setup, device)?;
    let averaged = worker.average(
        Exchange {
            student: &trainable.student,
            student_grads: summed.student,
            projections: teachers
                .iter()
                .zip(summed.projections)
                .map(|(t, grads)| t.projection.as_ref().zip(grads))
                .collect(),
            values: summed.values,
        },
        device,
    )?;
    let mut grads = averaged.student_grads;
    let grad_norm = clip_global_norm(&trainable.student, &mut grads, rates.grad_clip);
    trainable.step_student(rates.lr, grads);
    for ((teacher, optim), grads) in teachers
        .iter_mut()
        .zip(&mut trainable.projections)
        .zip(averaged.projection_grads)
    {
        if let (Some(optim), Some(grads)) = (optim.as_mut(), grads) {
            if let Some(w) = teacher.projection.take() {
                teacher.projection = Some(optim.step(rates.projection_lr, w, grads));
            }
        }
    }
    let (values, tokens) = unpack(&averaged.values, teachers.len());
    Ok(StepOutcome {
        values,
        grad_norm,
        tokens: (tokens * worker.count as f64).round() as u64,
    })
}

/// The sums of a step's micro-batches: gradients, and the values as the workers exchange them.
struct Summed {
    student: GradientsParams,
    projections: Vec<Option<GradientsParams>>,
    values: Vec<f64>,
}

/// Forward and backward of every micro-batch, the gradients summed (each loss scaled by
/// 1 / micro-batches) and the values averaged.
fn accumulate<B: TrainBackend>(
    student: &Transformer<B>,
    teachers: &[Teacher<B>],
    batch: &StepBatch,
    setup: &LossSetup,
    device: &B::Device,
) -> Result<Summed> {
    let mut student_acc = GradientsAccumulator::<Transformer<B>>::new();
    let mut w_acc: Vec<Option<GradientsParams>> = teachers.iter().map(|_| None).collect();
    let mut sums = LossValues {
        teachers: vec![(0.0, 0.0); teachers.len()],
        ..LossValues::default()
    };
    let mut tokens = 0usize;
    let count = batch.micro.len();
    for micro in &batch.micro {
        let outcome = micro_step(student, teachers, micro, setup, 1.0 / count as f64, device)?;
        let v = &outcome.values;
        if !(v.loss.is_finite()) {
            return Err(Error::Run(format!(
                "the loss is {} (CE {}, KD {}); stopping before the weights are touched",
                v.loss, v.ce, v.kd
            )));
        }
        student_acc.accumulate(student, outcome.student);
        for ((acc, g), t) in w_acc.iter_mut().zip(outcome.projections).zip(teachers) {
            if let (Some(g), Some(w)) = (g, &t.projection) {
                *acc = Some(add_grads(w, acc.take(), g));
            }
        }
        sums.loss += v.loss;
        sums.ce += v.ce;
        sums.kd += v.kd;
        for (s, v) in sums.teachers.iter_mut().zip(&v.teachers) {
            s.0 += v.0;
            s.1 += v.1;
        }
        tokens += micro.tokens;
    }
    Ok(Summed {
        student: student_acc.grads(),
        projections: w_acc,
        values: pack(&sums, count as f64, tokens as f64),
    })
}

/// `previous + grads` for W's parameters.
fn add_grads<B: AutodiffBackend>(
    w: &LearnableProjection<B>,
    previous: Option<GradientsParams>,
    grads: GradientsParams,
) -> GradientsParams {
    let mut sum = GradientsAccumulator::<LearnableProjection<B>>::new();
    if let Some(previous) = previous {
        sum.accumulate(w, previous);
    }
    sum.accumulate(w, grads);
    sum.grads()
}

/// The values the workers average: `loss, ce, kd` and each teacher's `(L_m, α_m)`, as means
/// over `n` micro-batches, and this worker's tokens.
fn pack(sums: &LossValues, n: f64, tokens: f64) -> Vec<f64> {
    let mut values = vec![sums.loss / n, sums.ce / n, sums.kd / n, tokens];
    for (l, a) in &sums.teachers {
        values.extend([l / n, a / n]);
    }
    values
}

/// The inverse of [`pack`]: the values and the (averaged) tokens per worker.
fn unpack(values: &[f64], teachers: usize) -> (LossValues, f64) {
    let loss_values = LossValues {
        loss: values[0],
        ce: values[1],
        kd: values[2],
        teachers: (0..teachers)
            .map(|m| (values[4 + 2 * m], values[5 + 2 * m]))
            .collect(),
    };
    (loss_values, values[3])
}
