//! One optimizer step. Per micro-batch every teacher runs without a graph and keeps its top-K
//! targets; the student runs forward and backward (layer by layer with activation
//! checkpointing) under `L = sg(γ) · L_KD + L_CE` with `L_KD = Σ_m α_m L_m`. The gradients
//! are summed over micro-batches and data-parallel workers; the student's are clipped to a
//! global norm and applied by AdamW, and each learnable W takes its own AdamW step, unclipped.
//!
//! **One step, one batch.** `L_CE` and each `L_m` are the means over the whole step's batch
//! (every micro-batch of every worker): a micro-batch's terms are weighted by its share of the
//! step's CE positions and of each teacher's compared chunks, so the gradient equals that of one
//! pass over the combined batch. The paper rescales once per step, so `γ` and adaptive α are
//! the step's too ([`ScalingScope::Step`]). They must be known before the first backward pass;
//! with several micro-batches or workers the step first runs every teacher and a forward pass of
//! the student without a graph (pass 1), sums the values over the workers (one small
//! exchange), and then runs the backward passes with `γ` and α fixed (pass 2), reusing the
//! teachers' targets. That costs one student forward pass per micro-batch and holds the step's
//! targets in memory; the alternative, one backward pass per loss term and micro-batch, would
//! cost a whole backward pass per term. A single micro-batch on a single worker needs no
//! first pass. [`ScalingScope::PreviousStep`] takes `γ` and α from the previous step's sums
//! instead (which pass 2 computes anyway): no first pass and no targets held, at the price of a
//! one-step lag. Its first step, having no previous one, runs pass 1 once (the teachers run
//! again in pass 2 rather than hold the step's targets): every step's backward passes then
//! apply a fixed `γ` and α, one graph that a GPU compiles once.
//! [`ScalingScope::MicroBatch`] measures them on each micro-batch.

use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};
use xtoken_core::loss::multi::{self, Weighting};
use xtoken_core::loss::pkl::LearnableProjection;
use xtoken_core::loss::{ce, evaluate, scaling, Loss, LossParams, TeacherTargets, XTokenBackend};
use xtoken_models::Transformer;

use crate::backend::TrainBackend;
use crate::cluster::parallel::{Exchange, Worker};
use crate::config::{RunConfig, ScalingScope};
use crate::data::{MicroBatch, StepBatch};
use crate::error::{Context, Error, Result};
use crate::observe::profile;
use crate::train::optim::{clip_scale, squared_norm, Trainable};
use crate::train::readout::Readout;
use crate::train::teachers::{tokens, Teacher};

/// How every micro-batch's loss is formed.
#[derive(Debug, Clone)]
pub struct LossSetup {
    /// τ, top-K, λ, row chunk.
    pub params: LossParams,
    /// Static or adaptive teacher weights.
    pub weighting: Weighting,
    /// `L = sg(γ) · L_KD + L_CE` instead of `L_CE + L_KD`.
    pub dynamic_scaling: bool,
    /// Where `γ` and adaptive α are measured.
    pub scope: ScalingScope,
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
            scope: config.scaling_scope()?,
            checkpointing: config.training.activation_checkpointing,
        })
    }

    /// Whether `γ` or α depend on the losses' values.
    fn measures(&self) -> bool {
        self.dynamic_scaling || matches!(self.weighting, Weighting::Adaptive(_))
    }
}

/// The loss values of a step: means over its whole batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossValues {
    /// The optimized loss (with dynamic scaling `γ · L_KD + L_CE`, `2 · L_CE` when `L_KD > 0`).
    pub loss: f64,
    /// The student's next-token cross-entropy.
    pub ce: f64,
    /// `Σ_m α_m L_m`.
    pub kd: f64,
    /// Per teacher: `L_m` and `α_m`.
    pub teachers: Vec<(f64, f64)>,
}

/// The fields of a teacher's step sums (`Sums::teachers`): `Σ c · L_m` and `Σ c` over compared
/// chunks, `Σ k · confidence` and `Σ k` over the teacher's positions, `Σ α_m` (micro-batch
/// scope: the α each micro-batch used), and the first two over the off-policy micro-batches
/// alone (dynamic scaling's `L_KD`). One flat array, so that adding and exchanging them is one
/// loop.
const LOSS: usize = 0;
const CHUNKS: usize = 1;
const CONFIDENCE: usize = 2;
const POSITIONS: usize = 3;
const ALPHA: usize = 4;
const OFF_LOSS: usize = 5;
const OFF_CHUNKS: usize = 6;
const TEACHER_SUMS: usize = 7;

/// What a micro-batch adds to the step's sums: its CE positions and, per teacher, its compared
/// chunks (the weights of its means), and with `values`, its loss values and confidence.
#[derive(Debug, Clone, PartialEq)]
struct Sums {
    /// `Σ n · L_CE` and `Σ n` over CE positions.
    ce: (f64, f64),
    /// Per teacher, the sums indexed by `LOSS`, `CHUNKS`, `CONFIDENCE`, `POSITIONS`, `ALPHA`,
    /// `OFF_LOSS`, `OFF_CHUNKS`.
    teachers: Vec<[f64; TEACHER_SUMS]>,
    /// Student tokens.
    tokens: f64,
    /// Micro-batches.
    micro: f64,
    /// On-policy rows, and the tokens the student wrote in them.
    written: (f64, f64),
}

impl Sums {
    fn zero(teachers: usize) -> Self {
        Sums {
            ce: (0.0, 0.0),
            teachers: vec![[0.0; TEACHER_SUMS]; teachers],
            tokens: 0.0,
            micro: 0.0,
            written: (0.0, 0.0),
        }
    }

    /// The weights of a micro-batch's means, before any value is known.
    fn counts(micro: &MicroBatch) -> Self {
        let plan = &micro.teachers[0].plan;
        let positions = plan.student.next_token.iter().filter(|&&t| t >= 0).count();
        let mut sums = Sums::zero(micro.teachers.len());
        sums.ce.1 = positions as f64;
        for (t, batch) in sums.teachers.iter_mut().zip(&micro.teachers) {
            t[CHUNKS] = batch.plan.valid_chunks() as f64;
            if !micro.on_policy {
                t[OFF_CHUNKS] = t[CHUNKS];
            }
        }
        sums.tokens = micro.tokens as f64;
        sums.micro = 1.0;
        if micro.on_policy {
            sums.written = (micro.rows as f64, micro.generated as f64);
        }
        sums
    }

    /// Adds a micro-batch's values to its counts.
    fn with_values(mut self, values: &MicroValues) -> Self {
        self.ce.0 = self.ce.1 * values.ce;
        for (t, v) in self.teachers.iter_mut().zip(&values.teachers) {
            t[LOSS] = t[CHUNKS] * v.loss;
            t[OFF_LOSS] = t[OFF_CHUNKS] * v.loss;
            if let Some((score, positions)) = v.confidence {
                t[CONFIDENCE] = score * positions;
                t[POSITIONS] = positions;
            }
            t[ALPHA] = v.alpha;
        }
        self
    }

    fn add(&mut self, other: &Sums) {
        self.ce.0 += other.ce.0;
        self.ce.1 += other.ce.1;
        for (a, b) in self.teachers.iter_mut().zip(&other.teachers) {
            a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        }
        self.tokens += other.tokens;
        self.micro += other.micro;
        self.written.0 += other.written.0;
        self.written.1 += other.written.1;
    }

    fn pack(&self) -> Vec<f64> {
        let mut v = vec![
            self.ce.0,
            self.ce.1,
            self.tokens,
            self.micro,
            self.written.0,
            self.written.1,
        ];
        self.teachers.iter().for_each(|t| v.extend(t));
        v
    }

    fn unpack(v: &[f64], teachers: usize) -> Self {
        Sums {
            ce: (v[0], v[1]),
            teachers: (0..teachers)
                .map(|m| std::array::from_fn(|i| v[6 + TEACHER_SUMS * m + i]))
                .collect(),
            tokens: v[2],
            micro: v[3],
            written: (v[4], v[5]),
        }
    }

    /// `sum / count`, 0 for no count.
    fn mean(sum: f64, count: f64) -> f64 {
        if count > 0.0 {
            sum / count
        } else {
            0.0
        }
    }

    fn ce(&self) -> f64 {
        Self::mean(self.ce.0, self.ce.1)
    }

    fn teacher_losses(&self) -> Vec<f64> {
        self.teachers
            .iter()
            .map(|t| Self::mean(t[LOSS], t[CHUNKS]))
            .collect()
    }

    /// The step's α: static, or the softmax of each teacher's mean confidence over the step.
    fn alphas(&self, statics: &[f64], weighting: Weighting) -> Vec<f64> {
        match weighting {
            Weighting::Static => statics.to_vec(),
            Weighting::Adaptive(_) => multi::softmax(
                &self
                    .teachers
                    .iter()
                    .map(|t| Self::mean(t[CONFIDENCE], t[POSITIONS]))
                    .collect::<Vec<_>>(),
            ),
        }
    }

    /// `Σ_m α_m L_m` with these sums' mean losses.
    fn kd(&self, alphas: &[f64]) -> f64 {
        self.teacher_losses()
            .iter()
            .zip(alphas)
            .map(|(l, a)| l * a)
            .sum()
    }

    /// Dynamic scaling's `γ = L_CE / L_KD`, both over the off-policy micro-batches (on-policy
    /// rows have no cross-entropy to scale KD against); 1 when the sums have no cross-entropy
    /// position, so that KD keeps its own scale.
    fn gamma(&self, alphas: &[f64]) -> f64 {
        if self.ce.1 == 0.0 {
            return 1.0;
        }
        let off: f64 = self
            .teachers
            .iter()
            .zip(alphas)
            .map(|(t, a)| Self::mean(t[OFF_LOSS], t[OFF_CHUNKS]) * a)
            .sum();
        scaling::ratio_of(self.ce(), off)
    }

    /// The α and `γ` these sums give (`γ` only with dynamic scaling).
    fn scaling(&self, statics: &[f64], setup: &LossSetup) -> Scaling {
        let alphas = self.alphas(statics, setup.weighting);
        Scaling {
            gamma: setup.dynamic_scaling.then(|| self.gamma(&alphas)),
            alphas,
        }
    }

    /// The step's values, with the α it used (`alphas`) or, per micro-batch, their mean.
    fn values(&self, alphas: Option<&[f64]>, dynamic: bool) -> LossValues {
        let alphas: Vec<f64> = match alphas {
            Some(a) => a.to_vec(),
            None => self
                .teachers
                .iter()
                .map(|t| Self::mean(t[ALPHA], self.micro))
                .collect(),
        };
        let (ce, kd) = (self.ce(), self.kd(&alphas));
        LossValues {
            loss: if dynamic {
                self.gamma(&alphas) * kd + ce
            } else {
                ce + kd
            },
            ce,
            kd,
            teachers: self.teacher_losses().into_iter().zip(alphas).collect(),
        }
    }
}

/// One micro-batch's loss values (means over the micro-batch): read (`f64`), or still on the
/// device ([`Pending`]).
#[derive(Debug, Clone)]
struct MicroValues<V = f64> {
    ce: V,
    teachers: Vec<TeacherValues<V>>,
}

#[derive(Debug, Clone)]
struct TeacherValues<V = f64> {
    loss: V,
    alpha: f64,
    /// The chosen confidence measure's mean and its positions (adaptive α).
    confidence: Option<(f64, f64)>,
}

/// Values waiting in a [`Readout`]: each its index there (`None`: not measured, 0).
type Pending = MicroValues<Option<usize>>;

impl Pending {
    /// No values: a micro-batch's counts alone.
    fn unmeasured(teachers: usize) -> Self {
        MicroValues {
            ce: None,
            teachers: vec![
                TeacherValues {
                    loss: None,
                    alpha: 0.0,
                    confidence: None,
                };
                teachers
            ],
        }
    }

    /// The values, once `read`.
    fn resolve(&self, read: &[f64]) -> MicroValues {
        let value = |slot: Option<usize>| slot.map_or(0.0, |i| read[i]);
        MicroValues {
            ce: value(self.ce),
            teachers: self
                .teachers
                .iter()
                .map(|t| TeacherValues {
                    loss: value(t.loss),
                    alpha: t.alpha,
                    confidence: t.confidence,
                })
                .collect(),
        }
    }
}

/// The sums of micro-batches whose values are pending: their counts with the values read.
fn sums_of(pending: &[(Sums, Pending)], read: &[f64], teachers: usize) -> Sums {
    let mut sums = Sums::zero(teachers);
    for (counts, values) in pending {
        sums.add(&counts.clone().with_values(&values.resolve(read)));
    }
    sums
}

/// What pass 2 weights a micro-batch's terms by and balances them with.
struct Balance<'a> {
    /// Its share of the step's CE positions.
    ce_share: f64,
    /// Per teacher, its share of the step's compared chunks.
    chunk_shares: Vec<f64>,
    /// The step's α and `γ`, when fixed before the backward passes.
    fixed: Option<&'a Scaling>,
    /// Whether the student wrote its rows: measured on itself (micro-batch scope), its `γ` is
    /// 1, having no cross-entropy.
    on_policy: bool,
}

/// A step's α and `γ` (`None` without dynamic scaling), measured on its whole batch.
/// Serialized as the values' bits, so that a resumed run applies exactly what it saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "ScalingBits", into = "ScalingBits")]
pub struct Scaling {
    /// Each teacher's α.
    pub alphas: Vec<f64>,
    /// `γ = L_CE / L_KD`, floored as [`scaling`] says.
    pub gamma: Option<f64>,
}

#[derive(Clone, Serialize, Deserialize)]
struct ScalingBits {
    alphas: Vec<u64>,
    gamma: Option<u64>,
}

impl From<ScalingBits> for Scaling {
    fn from(bits: ScalingBits) -> Self {
        Scaling {
            alphas: bits.alphas.into_iter().map(f64::from_bits).collect(),
            gamma: bits.gamma.map(f64::from_bits),
        }
    }
}

impl From<Scaling> for ScalingBits {
    fn from(scaling: Scaling) -> Self {
        ScalingBits {
            alphas: scaling.alphas.into_iter().map(f64::to_bits).collect(),
            gamma: scaling.gamma.map(f64::to_bits),
        }
    }
}

impl Balance<'_> {
    fn new<'a>(counts: &Sums, step: &Sums, fixed: Option<&'a Scaling>) -> Balance<'a> {
        Balance {
            on_policy: counts.written.0 > 0.0,
            ce_share: Sums::mean(counts.ce.1, step.ce.1),
            chunk_shares: counts
                .teachers
                .iter()
                .zip(&step.teachers)
                .map(|(c, s)| Sums::mean(c[CHUNKS], s[CHUNKS]))
                .collect(),
            fixed,
        }
    }
}

/// The gradients and values of one micro-batch.
struct MicroOutcome {
    student: GradientsParams,
    projections: Vec<Option<GradientsParams>>,
    values: Pending,
}

/// Every teacher's targets for a micro-batch.
fn targets<B: TrainBackend>(
    teachers: &[Teacher<B>],
    micro: &MicroBatch,
    setup: &LossSetup,
    device: &B::Device,
) -> Result<Vec<TeacherTargets<B>>> {
    teachers
        .iter()
        .zip(&micro.teachers)
        .map(|(t, batch)| t.targets(batch, micro.rows, &setup.params, setup.weighting, device))
        .collect()
}

/// The multi-teacher terms of a micro-batch.
fn terms<'a, B: TrainBackend>(
    teachers: &'a [Teacher<B>],
    targets: &'a [TeacherTargets<B>],
) -> Result<Vec<multi::Teacher<'a, B>>> {
    teachers
        .iter()
        .zip(targets)
        .map(|(t, targets)| {
            Ok(multi::Teacher {
                targets,
                loss: t.loss()?,
                alpha: t.settings.alpha,
            })
        })
        .collect()
}

/// Each teacher's chosen confidence and its positions, under adaptive weighting.
fn confidence<B: TrainBackend>(
    targets: &[TeacherTargets<B>],
    weighting: Weighting,
) -> Vec<Option<(f64, f64)>> {
    targets
        .iter()
        .map(|t| match (weighting, t.confidence()) {
            (Weighting::Adaptive(kind), Some(c)) => Some((kind.of(&c), c.positions as f64)),
            _ => None,
        })
        .collect()
}

/// The student's side of a micro-batch. Its rows are padded on the right and attention is
/// causal: no real position sees a padded one, and cross-entropy and the chunk plan read real
/// rows only. So the student runs without a padding mask, which would build a
/// `[rows, 1, len, len]` mask on the host and leave the causal kernel.
fn student_tokens<C: burn::tensor::backend::Backend>(
    micro: &MicroBatch,
    device: &C::Device,
) -> Result<xtoken_models::Tokens<C>> {
    tokens::<C>(
        &micro.student_ids,
        &None,
        [micro.rows, micro.student_len],
        device,
    )
}

/// Pass 1 of a micro-batch: its loss values from a forward pass of the student without a
/// graph (only when dynamic scaling needs them; left in `readout`) and the teachers'
/// confidence.
fn measure<B: TrainBackend>(
    student: &Transformer<B>,
    teachers: &[Teacher<B>],
    targets: &[TeacherTargets<B>],
    micro: &MicroBatch,
    setup: &LossSetup,
    (readout, device): (&mut Readout<B::InnerBackend>, &B::Device),
) -> Result<Pending> {
    let confidence = confidence(targets, setup.weighting);
    let (ce, losses) = if setup.dynamic_scaling {
        let inner = student.valid();
        let tokens = student_tokens::<B::InnerBackend>(micro, device).context("student: pass 1")?;
        let logits = Tensor::<B, 3>::from_inner(
            inner
                .forward_of(&tokens)
                .context("student: forward of pass 1")?,
        );
        let next_token = &micro.teachers[0].plan.student.next_token;
        let ce =
            ce::loss(logits.clone(), next_token, &setup.params).context("student cross-entropy")?;
        // W frozen here: pass 1 wants values only, no gradient of any input.
        let frozen: Vec<_> = teachers
            .iter()
            .map(|t| t.projection.clone().map(|w| w.no_grad()))
            .collect();
        let losses = teachers
            .iter()
            .zip(&frozen)
            .zip(targets)
            .map(|((t, w), targets)| {
                let loss = Loss::new(t.kind, t.tables.as_ref(), w.as_ref())?;
                let value = evaluate(logits.clone(), targets, loss, &setup.params)?;
                Ok(Some(readout.push(value.inner())))
            })
            .collect::<Result<Vec<_>>>()?;
        (Some(readout.push(ce.inner())), losses)
    } else {
        (None, vec![None; teachers.len()])
    };
    Ok(MicroValues {
        ce,
        teachers: losses
            .into_iter()
            .zip(confidence)
            .map(|(loss, confidence)| TeacherValues {
                loss,
                alpha: 0.0,
                confidence,
            })
            .collect(),
    })
}

/// Held-out values of `batches`: the student's cross-entropy (mean over every CE position) and
/// each teacher's `L_m` (mean over every compared chunk), without a graph and without touching
/// any parameter.
pub fn held_out<B: TrainBackend>(
    student: &Transformer<B>,
    teachers: &[Teacher<B>],
    batches: &[MicroBatch],
    setup: &LossSetup,
    device: &B::Device,
) -> Result<(f64, Vec<f64>)> {
    let setup = LossSetup {
        dynamic_scaling: true,
        ..setup.clone()
    };
    let mut readout = Readout::default();
    let mut pending = Vec::with_capacity(batches.len());
    for micro in batches {
        let targets = targets(teachers, micro, &setup, device)?;
        let values = measure(
            student,
            teachers,
            &targets,
            micro,
            &setup,
            (&mut readout, device),
        )?;
        pending.push((Sums::counts(micro), values));
    }
    let total = sums_of(&pending, &readout.read()?, teachers.len());
    let teachers = total
        .teachers
        .iter()
        .map(|t| Sums::mean(t[LOSS], t[CHUNKS]))
        .collect();
    Ok((Sums::mean(total.ce.0, total.ce.1), teachers))
}

/// Forward and backward of one micro-batch (pass 2), its terms weighted by `balance`.
fn micro_step<B: TrainBackend>(
    student: &Transformer<B>,
    teachers: &[Teacher<B>],
    micro: &MicroBatch,
    targets: &[TeacherTargets<B>],
    setup: &LossSetup,
    balance: &Balance<'_>,
    (readout, device): (&mut Readout<B::InnerBackend>, &B::Device),
) -> Result<MicroOutcome> {
    let terms = terms(teachers, targets)?;
    let alphas = match balance.fixed {
        Some(fixed) => fixed.alphas.clone(),
        None => multi::alphas(&terms, setup.weighting)?,
    };
    let tokens = student_tokens::<B>(micro, device).context("student")?;
    let next_token = &micro.teachers[0].plan.student.next_token;
    let names: Vec<&str> = teachers.iter().map(|t| &t.settings.name[..]).collect();
    let mut recorded = None;
    let backward = student.forward_backward(&tokens, setup.checkpointing, |model, hidden| {
        profile::boundary::<B>(device, || "student: forward".into());
        let logits = model.logits_from_hidden(hidden);
        profile::boundary::<B>(device, || "student: head (logits)".into());
        let objective = Objective {
            next_token,
            terms: &terms,
            names: &names,
            alphas: &alphas,
            setup,
            balance,
        };
        let (total, parts) = objective.evaluate(logits, device)?;
        recorded = Some(parts);
        Ok::<_, Error>(total)
    })?;
    profile::boundary::<B>(device, || "student: backward (recomputation)".into());
    let (ce, losses) = recorded.ok_or_else(|| Error::Run("the loss was not evaluated".into()))?;
    let confidence = confidence(targets, setup.weighting);
    let values = MicroValues {
        ce: Some(readout.push(ce)),
        teachers: losses
            .into_iter()
            .zip(alphas)
            .zip(confidence)
            .map(|((l, alpha), confidence)| TeacherValues {
                loss: Some(readout.push(l)),
                alpha,
                confidence,
            })
            .collect(),
    };
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

/// A micro-batch's CE and per-teacher losses, off the graph.
type Parts<B> = (
    Tensor<<B as AutodiffBackend>::InnerBackend, 1>,
    Vec<Tensor<<B as AutodiffBackend>::InnerBackend, 1>>,
);

/// The loss pass 2 differentiates: `ce_share · L_CE + γ Σ_m α_m chunk_share_m L_m`, with `γ`
/// the step's (fixed) or this micro-batch's own `sg(L_CE / Σ_m α_m L_m)` (floored, see
/// [`scaling`]), or 1 without dynamic scaling.
struct Objective<'a, B: AutodiffBackend + XTokenBackend> {
    next_token: &'a [i32],
    terms: &'a [multi::Teacher<'a, B>],
    /// The teachers' names, for the profile.
    names: &'a [&'a str],
    alphas: &'a [f64],
    setup: &'a LossSetup,
    balance: &'a Balance<'a>,
}

impl<B: TrainBackend> Objective<'_, B> {
    /// The loss on `logits`, with its parts detached from the graph so that no node outlives
    /// the backward pass.
    fn evaluate(
        &self,
        logits: Tensor<B, 3>,
        device: &B::Device,
    ) -> Result<(Tensor<B, 1>, Parts<B>)> {
        let params = &self.setup.params;
        let ce =
            ce::loss(logits.clone(), self.next_token, params).context("student cross-entropy")?;
        profile::boundary::<B>(device, || "loss: CE".into());
        // Each teacher's loss on its own, so that the profile times each.
        let mut per_teacher = Vec::with_capacity(self.terms.len());
        for (term, name) in self.terms.iter().zip(self.names) {
            per_teacher.push(evaluate(logits.clone(), term.targets, term.loss, params)?);
            profile::boundary::<B>(device, || format!("loss: teacher {name}"));
        }
        multi::check_alphas(self.alphas, per_teacher.len())?;
        let mut weighted = ce.clone() * self.balance.ce_share;
        let mut kd_shared = ce.zeros_like();
        for ((l, a), share) in per_teacher
            .iter()
            .zip(self.alphas)
            .zip(&self.balance.chunk_shares)
        {
            kd_shared = kd_shared + l.clone() * (a * share);
        }
        // The KD total only where γ is measured: an operation whose result is never used
        // still runs on a GPU under burn's fusion, fused with whatever follows it, which the
        // steps with a fixed γ would then compile anew.
        let total = || -> Result<Tensor<B, 1>> {
            let kd = multi::combine(per_teacher.clone(), self.alphas.to_vec(), device)?;
            Ok(kd.total)
        };
        if self.setup.dynamic_scaling {
            let gamma = match self.balance.fixed.and_then(|f| f.gamma) {
                Some(gamma) => uploaded(gamma, device),
                None if self.balance.on_policy => uploaded(1.0, device),
                None => scaling::ratio(ce.clone(), total()?),
            };
            weighted = weighted + kd_shared * gamma;
        } else {
            weighted = weighted + kd_shared;
        }
        let parts = (
            ce.inner(),
            per_teacher.into_iter().map(|l| l.inner()).collect(),
        );
        Ok((weighted, parts))
    }
}

/// A host value as a `[1]` f32 tensor: an upload, with no kernel to compile or fuse.
fn uploaded<B: Backend>(value: f64, device: &B::Device) -> Tensor<B, 1> {
    Tensor::from_data(TensorData::new(vec![value as f32], [1]), device)
}

/// What a step reports.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// The loss values: means over the step's whole batch.
    pub values: LossValues,
    /// The student's gradient norm before clipping.
    pub grad_norm: f64,
    /// Student tokens of the step over all workers.
    pub tokens: u64,
    /// The α and `γ` of this step's batch, which `ScalingScope::PreviousStep` uses in the next
    /// (`None` when neither depends on the losses).
    pub scaling: Option<Scaling>,
    /// On-policy sequences of the step over all workers, and the tokens the student wrote in
    /// them.
    pub written: (u64, u64),
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

/// One optimizer step over this worker's micro-batches of `batch`: accumulate, sum over the
/// workers, clip, and apply. A non-finite loss stops before the weights are touched.
/// `previous` is the previous step's [`StepOutcome::scaling`].
#[allow(clippy::too_many_arguments)]
pub fn step<B: TrainBackend>(
    trainable: &mut Trainable<B>,
    teachers: &mut [Teacher<B>],
    batch: &StepBatch,
    setup: &LossSetup,
    rates: StepRates,
    previous: Option<&Scaling>,
    worker: &Worker,
    device: &B::Device,
) -> Result<StepOutcome> {
    // The kernels' checks on the device wait for the step's read (see `xtoken_kernels::deferred`).
    let deferred = xtoken_kernels::deferred::defer();
    let Summed {
        student,
        projections,
        mut readout,
        pending,
        alphas,
    } = accumulate(
        &trainable.student,
        teachers,
        batch,
        setup,
        previous,
        worker,
        device,
    )?;
    // Several workers sum their values with the gradients: they are read before the exchange.
    let local = match worker.count {
        1 => None,
        _ => Some(sums_of(
            &pending,
            &std::mem::take(&mut readout).read()?,
            teachers.len(),
        )),
    };
    let reduced = worker.sum(
        Exchange {
            student: &trainable.student,
            student_grads: student,
            projections: teachers
                .iter()
                .zip(projections)
                .map(|(t, grads)| t.projection.as_ref().zip(grads))
                .collect(),
            values: local.as_ref().map_or_else(Vec::new, Sums::pack),
        },
        device,
    )?;
    profile::boundary::<B>(device, || "gradient exchange".into());
    let grads = reduced.student_grads;
    let norm = squared_norm(&trainable.student, &grads).map(|n| readout.push(n));
    // The step's one read: its values (alone) and the gradient norm.
    let read = readout.read()?;
    let sums = match local {
        Some(_) => Sums::unpack(&reduced.values, teachers.len()),
        None => sums_of(&pending, &read, teachers.len()),
    };
    let values = sums.values(alphas.as_deref(), setup.dynamic_scaling);
    let scaling = setup
        .measures()
        .then(|| sums.scaling(&static_alphas(teachers), setup));
    let grad_norm = norm.map_or(0.0, |i| read[i].sqrt());
    if !(values.loss.is_finite() && grad_norm.is_finite()) {
        // A logit row that is not finite makes the loss so: name it if a kernel saw one.
        deferred
            .explain()
            .map_err(xtoken_core::Error::from)
            .context("the step's losses")?;
        return Err(Error::Run(format!(
            "the loss is {} (CE {}, KD {}), the gradient norm {grad_norm}; stopping before the \
             weights are touched",
            values.loss, values.ce, values.kd
        )));
    }
    deferred.clear();
    let scale = clip_scale(grad_norm, rates.grad_clip);
    trainable.step_student(rates.lr, scale, grads);
    profile::boundary::<B>(device, || "student: clipping + AdamW".into());
    for ((teacher, optim), grads) in teachers
        .iter_mut()
        .zip(&mut trainable.projections)
        .zip(reduced.projection_grads)
    {
        if let (Some(optim), Some(grads)) = (optim.as_mut(), grads) {
            if let Some(w) = teacher.projection.take() {
                teacher.projection = Some(optim.step(rates.projection_lr, w, grads));
            }
        }
    }
    if teachers.iter().any(|t| t.projection.is_some()) {
        profile::boundary::<B>(device, || "W: AdamW".into());
    }
    Ok(StepOutcome {
        values,
        grad_norm,
        tokens: sums.tokens.round() as u64,
        scaling,
        written: (sums.written.0.round() as u64, sums.written.1.round() as u64),
    })
}

/// A worker's share of a step: gradients, and what the workers add up: each micro-batch's
/// counts with its values, still on the device.
struct Summed<B: TrainBackend> {
    student: GradientsParams,
    projections: Vec<Option<GradientsParams>>,
    readout: Readout<B::InnerBackend>,
    pending: Vec<(Sums, Pending)>,
    /// The step's α when fixed before the backward passes (else each micro-batch's own).
    alphas: Option<Vec<f64>>,
}

/// Every micro-batch of the step on this worker: pass 1 when the step's `γ` or α must be
/// measured first, then forward and backward of each, the gradients summed.
fn accumulate<B: TrainBackend>(
    student: &Transformer<B>,
    teachers: &[Teacher<B>],
    batch: &StepBatch,
    setup: &LossSetup,
    previous: Option<&Scaling>,
    worker: &Worker,
    device: &B::Device,
) -> Result<Summed<B>> {
    let counts: Vec<Sums> = batch.micro.iter().map(Sums::counts).collect();
    let carried =
        previous.filter(|_| setup.scope == ScalingScope::PreviousStep && setup.measures());
    // The previous-step scope's first step measures its own batch first, as the step scope
    // does: its backward passes then apply a fixed γ and α like every later step's, one graph
    // that a GPU compiles once.
    let pass_one = setup.measures()
        && match setup.scope {
            ScalingScope::Step => batch.micro.len() > 1 || worker.count > 1,
            ScalingScope::PreviousStep => carried.is_none(),
            ScalingScope::MicroBatch => false,
        };
    // The step scope holds the step's targets for pass 2; the previous-step scope's first step
    // runs the teachers again instead, so that it needs no more memory than the later steps.
    let keep = setup.scope == ScalingScope::Step || batch.micro.len() == 1;
    let mut kept: Vec<Option<Vec<TeacherTargets<B>>>> = batch.micro.iter().map(|_| None).collect();
    let mut measured = Readout::default();
    let mut pass_one_values = Vec::new();
    for ((micro, c), slot) in batch.micro.iter().zip(&counts).zip(&mut kept) {
        if pass_one {
            let targets = targets(teachers, micro, setup, device)?;
            let values = measure(
                student,
                teachers,
                &targets,
                micro,
                setup,
                (&mut measured, device),
            )?;
            profile::boundary::<B>(device, || "student: pass 1 (forward, losses)".into());
            pass_one_values.push((c.clone(), values));
            *slot = keep.then_some(targets);
        } else {
            pass_one_values.push((c.clone(), Pending::unmeasured(teachers.len())));
        }
    }
    // Pass 1's values in one read (none without pass 1).
    let mut step = sums_of(&pass_one_values, &measured.read()?, teachers.len());
    if worker.count > 1 {
        step = Sums::unpack(
            &worker.sum_values::<B>(step.pack(), device)?,
            teachers.len(),
        );
        profile::boundary::<B>(device, || "exchange: pass 1 values".into());
    }
    let fixed = match carried {
        Some(previous) => Some(previous.clone()),
        None => pass_one.then(|| step.scaling(&static_alphas(teachers), setup)),
    };

    let mut student_acc = GradientsAccumulator::<Transformer<B>>::new();
    let mut w_acc: Vec<Option<GradientsParams>> = teachers.iter().map(|_| None).collect();
    let mut readout = Readout::default();
    let mut pending = Vec::with_capacity(batch.micro.len());
    for ((micro, c), slot) in batch.micro.iter().zip(&counts).zip(kept) {
        let targets = match slot {
            Some(targets) => targets,
            None => targets(teachers, micro, setup, device)?,
        };
        let balance = Balance::new(c, &step, fixed.as_ref());
        let outcome = micro_step(
            student,
            teachers,
            micro,
            &targets,
            setup,
            &balance,
            (&mut readout, device),
        )?;
        student_acc.accumulate(student, outcome.student);
        for ((acc, g), t) in w_acc.iter_mut().zip(outcome.projections).zip(teachers) {
            if let (Some(g), Some(w)) = (g, &t.projection) {
                *acc = Some(add_grads(w, acc.take(), g));
            }
        }
        profile::boundary::<B>(device, || "gradient accumulation".into());
        pending.push((c.clone(), outcome.values));
    }
    Ok(Summed {
        student: student_acc.grads(),
        projections: w_acc,
        readout,
        pending,
        alphas: fixed.map(|f| f.alphas),
    })
}

/// Each teacher's configured α.
fn static_alphas<B: TrainBackend>(teachers: &[Teacher<B>]) -> Vec<f64> {
    teachers.iter().map(|t| t.settings.alpha).collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use xtoken_core::loss::multi::ConfidenceMeasure;

    /// A micro-batch's counts: CE positions and, per teacher, compared chunks.
    /// An off-policy micro-batch's counts: CE positions and, per teacher, compared chunks.
    fn counts(positions: f64, chunks: &[f64]) -> Sums {
        let mut sums = Sums::zero(chunks.len());
        sums.ce.1 = positions;
        for (t, &c) in sums.teachers.iter_mut().zip(chunks) {
            t[CHUNKS] = c;
            t[OFF_CHUNKS] = c;
        }
        sums.tokens = positions + 1.0;
        sums.micro = 1.0;
        sums
    }

    /// An on-policy micro-batch's counts: `rows` written rows of `written` tokens, compared
    /// chunks per teacher, no CE position.
    fn written_counts(rows: f64, written: f64, chunks: &[f64]) -> Sums {
        let mut sums = Sums::zero(chunks.len());
        for (t, &c) in sums.teachers.iter_mut().zip(chunks) {
            t[CHUNKS] = c;
        }
        sums.tokens = written + 8.0;
        sums.micro = 1.0;
        sums.written = (rows, written);
        sums
    }

    fn values(ce: f64, teachers: &[(f64, f64, f64)]) -> MicroValues {
        MicroValues {
            ce,
            teachers: teachers
                .iter()
                .map(|&(loss, confidence, positions)| TeacherValues {
                    loss,
                    alpha: 0.0,
                    confidence: Some((confidence, positions)),
                })
                .collect(),
        }
    }

    /// Two micro-batches of unequal sizes: the step's CE and `L_m` are the means over their
    /// positions and chunks (not the mean of the two means), the shares weight each
    /// micro-batch's means into exactly those, adaptive α is the softmax of the step's mean
    /// confidence, and the sums survive the workers' exchange format.
    #[test]
    fn the_step_weighs_micro_batches_by_their_share() {
        let (a, b) = (counts(3.0, &[2.0, 5.0]), counts(1.0, &[6.0, 1.0]));
        let va = values(2.0, &[(0.5, -1.0, 10.0), (0.25, -2.0, 10.0)]);
        let vb = values(4.0, &[(1.5, -3.0, 30.0), (0.75, -1.0, 30.0)]);
        let mut step = Sums::zero(2);
        step.add(&a.clone().with_values(&va));
        step.add(&b.clone().with_values(&vb));
        assert_eq!(step.ce(), (3.0 * 2.0 + 4.0) / 4.0);
        let losses = step.teacher_losses();
        assert_eq!(losses[0], (2.0 * 0.5 + 6.0 * 1.5) / 8.0);
        assert_eq!(losses[1], (5.0 * 0.25 + 0.75) / 6.0);

        for (m, mean) in losses.iter().enumerate() {
            let (sa, sb) = (Balance::new(&a, &step, None), Balance::new(&b, &step, None));
            let weighted =
                sa.chunk_shares[m] * va.teachers[m].loss + sb.chunk_shares[m] * vb.teachers[m].loss;
            assert!((weighted - mean).abs() < 1e-12);
            assert!((sa.ce_share * va.ce + sb.ce_share * vb.ce - step.ce()).abs() < 1e-12);
        }

        let adaptive = Weighting::Adaptive(ConfidenceMeasure::NegCrossEntropy);
        let alphas = step.alphas(&[0.3, 0.7], adaptive);
        let (c0, c1): (f64, f64) = ((-10.0 - 90.0) / 40.0, (-20.0 - 30.0) / 40.0);
        let want0 = c0.exp() / (c0.exp() + c1.exp());
        assert!((alphas[0] - want0).abs() < 1e-12 && (alphas[1] - (1.0 - want0)).abs() < 1e-12);
        assert_eq!(step.alphas(&[0.3, 0.7], Weighting::Static), vec![0.3, 0.7]);

        let reported = step.values(Some(&alphas), true);
        let kd = alphas[0] * losses[0] + alphas[1] * losses[1];
        assert_eq!(reported.kd, kd);
        assert_eq!(reported.loss, scaling::dynamic_value(step.ce(), kd));
        assert_eq!(Sums::unpack(&step.pack(), 2), step);
    }

    /// With on-policy micro-batches, `L_KD` averages every compared chunk, but dynamic
    /// scaling's `γ` is the off-policy part's `L_CE / L_KD`; a step of on-policy rows alone has
    /// `γ = 1`. The written rows and tokens survive the exchange format.
    #[test]
    fn gamma_is_measured_on_the_off_policy_part() {
        let setup = LossSetup {
            params: LossParams::default(),
            weighting: Weighting::Static,
            dynamic_scaling: true,
            scope: ScalingScope::Step,
            checkpointing: false,
        };
        let (off, on) = (counts(4.0, &[2.0]), written_counts(2.0, 10.0, &[6.0]));
        let plain = |loss| MicroValues {
            ce: 3.0,
            teachers: vec![TeacherValues {
                loss,
                alpha: 0.0,
                confidence: None,
            }],
        };
        let mut step = Sums::zero(1);
        step.add(&off.clone().with_values(&plain(0.5)));
        step.add(&on.clone().with_values(&MicroValues {
            ce: 0.0,
            ..plain(2.0)
        }));
        assert_eq!(step.ce(), 3.0, "CE over the off-policy positions only");
        assert_eq!(step.teacher_losses(), vec![(2.0 * 0.5 + 6.0 * 2.0) / 8.0]);
        let scaling = step.scaling(&[1.0], &setup);
        assert_eq!(scaling.gamma, Some(scaling::ratio_of(3.0, 0.5)));
        let values = step.values(Some(&[1.0]), true);
        assert_eq!(values.loss, scaling::ratio_of(3.0, 0.5) * values.kd + 3.0);
        assert_eq!(step.written, (2.0, 10.0));
        assert_eq!(Sums::unpack(&step.pack(), 1), step);

        let mut alone = Sums::zero(1);
        alone.add(&on.with_values(&MicroValues {
            ce: 0.0,
            ..plain(2.0)
        }));
        assert_eq!(alone.scaling(&[1.0], &setup).gamma, Some(1.0));
        assert!(Balance::new(&alone, &alone, None).on_policy);
        assert!(!Balance::new(&off, &step, None).on_policy);
    }
}
