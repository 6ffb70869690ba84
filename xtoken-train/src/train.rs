//! `xtoken train`: cross-tokenizer distillation end to end.
//!
//! One step: the background loader hands over the step's micro-batches; per micro-batch every
//! teacher runs without a graph and keeps only its top-K merged log-probabilities
//! ([`TeacherTargets`]); the student runs forward and backward (layer by layer with activation
//! checkpointing) under `L = sg(L_CE / L_KD) · L_KD + L_CE`, `L_KD = Σ_m α_m L_m`. Gradients are
//! summed over micro-batches (and averaged over workers), the student's are clipped to global
//! norm 1.0 and applied by AdamW under warmup + cosine; the learnable W of each P-KL teacher
//! takes its own AdamW step (lr 1e-2, unclipped).
//!
//! A run directory holds `run.toml` (the configuration it was started with), `metrics.csv`,
//! `loss.svg`, `checkpoints/step-NNNNNNNN/` and, at the end, `student/` (a Hugging Face model
//! directory). Checkpoints are written to a temporary directory and renamed into place, so a
//! run killed while saving resumes from the previous one.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, Optimizer};
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, DType, ElementConversion, Int, Tensor, TensorData};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use xtoken_core::audit::{self, AuditOptions, LossChoice};
use xtoken_core::cache::AlignCache;
use xtoken_core::common::CommonSet;
use xtoken_core::loss::gold::CommonTables;
use xtoken_core::loss::multi::{self, Weighting};
use xtoken_core::loss::pkl::LearnableProjection;
use xtoken_core::loss::{ce, hkl, scaling, Loss, LossParams, TeacherTargets, XTokenBackend};
use xtoken_core::projection::SparseProjection;
use xtoken_core::vocab::Vocabulary;
use xtoken_kernels::memory::DeviceMemory;
use xtoken_models::{CausalLm, HfConfig, LoadOptions, SaveDtype, Transformer};

use crate::align::{align_file, FileJob, Pipeline};
use crate::config::{DtypeChoice, LossMode, RunConfig, TeacherSpec};
use crate::data::{BatchShape, Loader, LoaderState, MicroBatch, Packer};
use crate::metrics::{MetricsLog, StepMetrics};

/// Options of `xtoken train`.
#[derive(Args, Clone)]
pub struct TrainArgs {
    /// The run configuration (TOML; every default is the paper's).
    #[arg(long)]
    pub config: PathBuf,
    /// Continue from the newest complete checkpoint in the run directory.
    #[arg(long)]
    pub resume: bool,
    /// `cpu`, `cuda` or `wgpu` (overrides `device` in the configuration).
    #[arg(long)]
    pub device: Option<String>,
    /// Stop (with a checkpoint) after this step instead of `training.steps`.
    #[arg(long)]
    pub stop_after: Option<u64>,
    #[command(flatten)]
    pub workers: WorkerArgs,
    /// Benchmark mode (`xtoken bench train`): no checkpoints, no final student.
    #[arg(skip)]
    pub bench: bool,
}

/// What a run reports back.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Hash of the student's parameters (data-parallel runs only; 0 otherwise).
    pub fingerprint: u64,
    /// Wall time of each step run, in order.
    pub step_seconds: Vec<f64>,
    /// Student tokens of each step (over all workers).
    pub step_tokens: Vec<u64>,
    /// Peak memory after the first step: device pools where the backend reports them, else
    /// the host heap's growth.
    pub peak_bytes: u64,
}

/// Data-parallel workers (feature `collective`).
#[derive(Args, Clone, Debug, Default)]
pub struct WorkerArgs {
    /// Devices of this machine to train on, one worker each (`0,1,2,3`); more than one needs
    /// the `collective` feature.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<usize>,
}

/// This worker among the data-parallel workers of the run.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Global rank; rank 0 writes metrics, checkpoints and the final student.
    pub rank: usize,
    pub count: usize,
    /// Its burn-collective peer when there are several workers.
    #[cfg(feature = "collective")]
    pub peer: Option<burn::collective::PeerId>,
}

/// What the workers average after each step: the student's gradients, each learnable W's,
/// and the step's metric values.
pub struct Exchange<'a, B: AutodiffBackend> {
    /// Gives the parameters' order, the same on every worker.
    #[cfg_attr(not(feature = "collective"), allow(dead_code))]
    pub student: &'a Transformer<B>,
    pub student_grads: GradientsParams,
    pub projections: Vec<Option<(&'a LearnableProjection<B>, GradientsParams)>>,
    pub values: Vec<f64>,
}

/// The averaged result of an [`Exchange`].
pub struct Averaged {
    pub student_grads: GradientsParams,
    pub projection_grads: Vec<Option<GradientsParams>>,
    pub values: Vec<f64>,
}

impl Worker {
    /// The only worker of a single-device run.
    pub fn alone() -> Self {
        Worker {
            rank: 0,
            count: 1,
            #[cfg(feature = "collective")]
            peer: None,
        }
    }

    /// Averages a step's gradients and values over the workers (one all-reduce of everything).
    pub fn average<B: AutodiffBackend>(
        &self,
        exchange: Exchange<'_, B>,
        device: &B::Device,
    ) -> Result<Averaged> {
        #[cfg(feature = "collective")]
        if let Some(peer) = self.peer {
            return crate::ddp::average(peer, exchange, device);
        }
        let _ = device;
        Ok(Averaged {
            student_grads: exchange.student_grads,
            projection_grads: exchange
                .projections
                .into_iter()
                .map(|p| p.map(|(_, g)| g))
                .collect(),
            values: exchange.values,
        })
    }
}

/// A teacher with everything its loss needs.
struct TeacherRun<B: AutodiffBackend> {
    spec: TeacherSpec,
    mode: LossMode,
    model: Transformer<B::InnerBackend>,
    tables: Option<CommonTables>,
    projection: Option<LearnableProjection<B>>,
}

/// What a checkpoint records besides the tensors.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointState {
    /// Steps completed.
    step: u64,
    loader: LoaderState,
    tokens: u64,
    seconds: f64,
    teachers: Vec<String>,
}

/// Learning rate of step `step` (0-based) of `total`: linear warmup over the first
/// `warmup · total` steps, then a half cosine from `lr` to `min_lr`.
pub fn learning_rate(step: u64, total: u64, lr: f64, warmup: f64, min_lr: f64) -> f64 {
    let warmup_steps = (warmup * total as f64).ceil() as u64;
    if step < warmup_steps {
        return lr * (step + 1) as f64 / warmup_steps as f64;
    }
    let span = total.saturating_sub(warmup_steps).max(1) as f64;
    let progress = ((step - warmup_steps) as f64 / span).min(1.0);
    min_lr + (lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

fn dtype_of<B: burn::tensor::backend::Backend>(choice: DtypeChoice, device: &B::Device) -> DType {
    match choice {
        DtypeChoice::F32 => DType::F32,
        DtypeChoice::Bf16 => DType::BF16,
        DtypeChoice::F16 => DType::F16,
        DtypeChoice::Auto if B::supports_dtype(device, DType::BF16) => DType::BF16,
        DtypeChoice::Auto => DType::F32,
    }
}

fn save_dtype(choice: DtypeChoice) -> SaveDtype {
    match choice {
        DtypeChoice::Bf16 | DtypeChoice::Auto => SaveDtype::BF16,
        DtypeChoice::F16 => SaveDtype::F16,
        DtypeChoice::F32 => SaveDtype::F32,
    }
}

/// The ids of the student's rank-1 parameters (norm weights), exempt from weight decay.
fn norm_param_ids<B: AutodiffBackend>(model: &Transformer<B>) -> HashSet<ParamId> {
    struct Collect(HashSet<ParamId>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if D == 1 {
                self.0.insert(param.id);
            }
        }
    }
    let mut collect = Collect(HashSet::new());
    model.visit(&mut collect);
    collect.0
}

/// Moves the gradients of `ids` out of `grads` into a new set.
fn split_grads<B: AutodiffBackend>(
    model: &Transformer<B>,
    grads: &mut GradientsParams,
    ids: &HashSet<ParamId>,
) -> GradientsParams {
    struct Split<'a, B: AutodiffBackend> {
        from: &'a mut GradientsParams,
        into: GradientsParams,
        ids: &'a HashSet<ParamId>,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Split<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.ids.contains(&param.id) {
                if let Some(g) = self.from.remove::<B::InnerBackend, D>(param.id) {
                    self.into.register(param.id, g);
                }
            }
        }
    }
    let mut split = Split::<B> {
        from: grads,
        into: GradientsParams::new(),
        ids,
        _b: std::marker::PhantomData,
    };
    model.visit(&mut split);
    split.into
}

/// Scales the student's gradients to global L2 norm ≤ `max` (0: no clipping); returns the
/// norm before clipping.
fn clip_global_norm<B: AutodiffBackend>(
    model: &Transformer<B>,
    grads: &mut GradientsParams,
    max: f64,
) -> f64 {
    struct SquaredNorm<'a, B: AutodiffBackend> {
        grads: &'a GradientsParams,
        sum: Option<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                let s = g.cast(DType::F32).square().sum();
                self.sum = Some(match self.sum.take() {
                    Some(a) => a + s,
                    None => s,
                });
            }
        }
    }
    struct Scale<'a, B: AutodiffBackend> {
        grads: &'a mut GradientsParams,
        factor: f64,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                self.grads.register(param.id, g.mul_scalar(self.factor));
            }
        }
    }
    let mut norm = SquaredNorm::<B> { grads, sum: None };
    model.visit(&mut norm);
    let total = norm
        .sum
        .map(|s| s.into_scalar().elem::<f64>().sqrt())
        .unwrap_or(0.0);
    if max > 0.0 && total > max {
        let mut scale = Scale::<B> {
            grads,
            factor: max / (total + 1e-6),
            _b: std::marker::PhantomData,
        };
        model.visit(&mut scale);
    }
    total
}

/// The newest complete checkpoint under `dir`, removing interrupted saves.
fn latest_checkpoint(dir: &Path) -> Result<Option<(PathBuf, CheckpointState)>> {
    if !dir.exists() {
        return Ok(None);
    }
    let mut best: Option<(PathBuf, CheckpointState)> = None;
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.contains(".tmp") {
            eprintln!("removing {} (a save that did not finish)", path.display());
            std::fs::remove_dir_all(&path).ok();
            continue;
        }
        if !name.starts_with("step-") {
            continue;
        }
        let state = std::fs::read_to_string(path.join("state.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<CheckpointState>(&t).ok());
        let Some(state) = state else {
            eprintln!("skipping {}: no readable state.json", path.display());
            continue;
        };
        if best.as_ref().is_none_or(|(_, b)| state.step > b.step) {
            best = Some((path, state));
        }
    }
    Ok(best)
}

/// Everything that is trained, with its optimizers.
struct Trainable<B: AutodiffBackend> {
    student: Transformer<B>,
    decay: burn::optim::adaptor::OptimizerAdaptor<burn::optim::AdamW, Transformer<B>, B>,
    no_decay: burn::optim::adaptor::OptimizerAdaptor<burn::optim::AdamW, Transformer<B>, B>,
    w_optims: Vec<
        Option<
            burn::optim::adaptor::OptimizerAdaptor<burn::optim::AdamW, LearnableProjection<B>, B>,
        >,
    >,
}

fn recorder() -> BinFileRecorder<FullPrecisionSettings> {
    BinFileRecorder::<FullPrecisionSettings>::new()
}

fn save_checkpoint<B: AutodiffBackend>(
    dir: &Path,
    state: &CheckpointState,
    trainable: &Trainable<B>,
    teachers: &[TeacherRun<B>],
    keep: usize,
) -> Result<PathBuf> {
    let final_dir = dir.join(format!("step-{:08}", state.step));
    let tmp = dir.join(format!("step-{:08}.tmp-{}", state.step, std::process::id()));
    std::fs::create_dir_all(&tmp).with_context(|| format!("{}", tmp.display()))?;
    let rec = recorder();
    let err = |what: &str| format!("{}: writing {what}", tmp.display());
    rec.record(trainable.student.clone().into_record(), tmp.join("student"))
        .with_context(|| err("the student"))?;
    rec.record(trainable.decay.to_record(), tmp.join("optim-decay"))
        .with_context(|| err("the optimizer"))?;
    rec.record(trainable.no_decay.to_record(), tmp.join("optim-no-decay"))
        .with_context(|| err("the optimizer"))?;
    for (t, optim) in teachers.iter().zip(&trainable.w_optims) {
        if let Some(w) = &t.projection {
            rec.record(
                w.clone().into_record(),
                tmp.join(format!("w-{}", t.spec.name)),
            )
            .with_context(|| err("W"))?;
        }
        if let Some(optim) = optim {
            rec.record(
                optim.to_record(),
                tmp.join(format!("w-optim-{}", t.spec.name)),
            )
            .with_context(|| err("W's optimizer"))?;
        }
    }
    std::fs::write(tmp.join("state.json"), serde_json::to_string_pretty(state)?)
        .with_context(|| err("state.json"))?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).ok();
    }
    std::fs::rename(&tmp, &final_dir)
        .with_context(|| format!("renaming {} into place", tmp.display()))?;
    // Keep the newest `keep`.
    let mut steps: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy().starts_with("step-") && !n.to_string_lossy().contains(".tmp")
            })
        })
        .collect();
    steps.sort();
    while steps.len() > keep {
        let old = steps.remove(0);
        std::fs::remove_dir_all(&old).ok();
    }
    Ok(final_dir)
}

fn load_checkpoint<B: AutodiffBackend>(
    dir: &Path,
    trainable: &mut Trainable<B>,
    teachers: &mut [TeacherRun<B>],
    device: &B::Device,
) -> Result<()> {
    let rec = recorder();
    let err = |what: &str| format!("{}: reading {what}", dir.display());
    let student = rec
        .load(dir.join("student"), device)
        .with_context(|| err("the student"))?;
    trainable.student = trainable.student.clone().load_record(student);
    let optim = rec
        .load(dir.join("optim-decay"), device)
        .with_context(|| err("the optimizer"))?;
    trainable.decay = trainable.decay.clone().load_record(optim);
    let optim = rec
        .load(dir.join("optim-no-decay"), device)
        .with_context(|| err("the optimizer"))?;
    trainable.no_decay = trainable.no_decay.clone().load_record(optim);
    for (t, optim) in teachers.iter_mut().zip(trainable.w_optims.iter_mut()) {
        if let Some(w) = t.projection.take() {
            let record = rec
                .load(dir.join(format!("w-{}", t.spec.name)), device)
                .with_context(|| err("W"))?;
            t.projection = Some(w.load_record(record));
        }
        if let Some(o) = optim.take() {
            let record = rec
                .load(dir.join(format!("w-optim-{}", t.spec.name)), device)
                .with_context(|| err("W's optimizer"))?;
            *optim = Some(o.load_record(record));
        }
    }
    Ok(())
}

/// The configuration as resolved for this run, for the comparison on `--resume`.
fn resolved_text(config: &RunConfig) -> Result<String> {
    let mut c = config.clone();
    c.device = String::new();
    Ok(toml::to_string(&c)?)
}

/// Builds (or reads) the alignment cache of the training data.
fn prepare_cache(config: &RunConfig, pipeline: &Pipeline, progress: bool) -> Result<AlignCache> {
    let path = config.cache_path();
    let teachers: Vec<&Vocabulary> = pipeline.teachers.iter().collect();
    if path.exists() {
        let cache = AlignCache::open_verified(&path, &pipeline.student, &teachers)
            .with_context(|| format!("{} (delete it to rebuild)", path.display()))?;
        let meta = cache.metadata();
        if meta.source != config.data.path || meta.params != config.align_params() {
            bail!(
                "{}: made from {} with other alignment settings or data than data.path = {}; delete it or set data.cache",
                path.display(),
                meta.source.display(),
                config.data.path.display()
            );
        }
        return Ok(cache);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("{}", parent.display()))?;
    }
    let threads = if config.data.workers == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        config.data.workers
    };
    eprintln!(
        "tokenizing and aligning {} with {threads} threads into {}",
        config.data.path.display(),
        path.display()
    );
    // Written under a name of this process's own, then renamed: several processes of a
    // multi-node run may build the same cache at once.
    let partial = path.with_extension(format!("{}.partial", std::process::id()));
    let stats = align_file(
        pipeline,
        &FileJob {
            input: &config.data.path,
            format: config.data_format()?,
            out: Some(&partial),
            json: false,
            text_field: &config.data.text_field,
            threads,
            params: config.align_params(),
            progress,
        },
    )?;
    std::fs::rename(&partial, &path)
        .with_context(|| format!("renaming {} into place", partial.display()))?;
    eprintln!(
        "  {} documents, {} student tokens in {:.1} s",
        stats.docs, stats.student_tokens, stats.seconds
    );
    Ok(AlignCache::open(&path)?)
}

/// Loads W for a teacher, building and storing it when absent.
fn projection_for(
    config: &RunConfig,
    spec: &TeacherSpec,
    student: &Vocabulary,
    teacher: &Vocabulary,
) -> Result<SparseProjection> {
    if spec.projection.exists() {
        return SparseProjection::load_verified(&spec.projection, student, teacher)
            .with_context(|| format!("teacher {}: W", spec.name));
    }
    let (w, _) = SparseProjection::build(student, teacher, config.projection_params())?;
    if let Some(parent) = spec.projection.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let partial = spec
        .projection
        .with_extension(format!("{}.partial", std::process::id()));
    w.save(&partial)?;
    std::fs::rename(&partial, &spec.projection)
        .with_context(|| format!("renaming {} into place", partial.display()))?;
    eprintln!(
        "teacher {}: built W ({} × {}, top-{}) into {}",
        spec.name,
        w.student_vocab_size(),
        w.teacher_vocab_size(),
        w.top_k(),
        spec.projection.display()
    );
    Ok(w)
}

fn ids_tensor<B: burn::tensor::backend::Backend>(
    ids: &[i64],
    rows: usize,
    len: usize,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    Tensor::from_data(TensorData::new(ids.to_vec(), [rows, len]), device)
}

fn padding_tensor<B: burn::tensor::backend::Backend>(
    padding: &Option<Vec<bool>>,
    rows: usize,
    len: usize,
    device: &B::Device,
) -> Option<Tensor<B, 2, Bool>> {
    padding
        .as_ref()
        .map(|p| Tensor::from_data(TensorData::new(p.clone(), [rows, len]), device))
}

/// The loss values of one micro-batch.
struct MicroValues {
    loss: f64,
    ce: f64,
    kd: f64,
    teachers: Vec<(f64, f64)>,
}

/// How every micro-batch's loss is formed.
struct LossSetup {
    params: LossParams,
    weighting: Weighting,
    dynamic_scaling: bool,
    checkpointing: bool,
}

/// Forward and backward of one micro-batch, its loss scaled by `scale`; returns the student's
/// gradients, each P-KL teacher's W gradients and the values.
#[allow(clippy::type_complexity)]
fn micro_step<B>(
    student: &Transformer<B>,
    teachers: &[TeacherRun<B>],
    micro: &MicroBatch,
    setup: &LossSetup,
    scale: f64,
    device: &B::Device,
) -> Result<(GradientsParams, Vec<Option<GradientsParams>>, MicroValues)>
where
    B: AutodiffBackend + XTokenBackend,
    B::InnerBackend: XTokenBackend,
{
    let LossSetup {
        params,
        weighting,
        dynamic_scaling,
        checkpointing,
    } = setup;
    let (weighting, dynamic_scaling, checkpointing) =
        (*weighting, *dynamic_scaling, *checkpointing);
    let rows = micro.rows;
    let mut targets = Vec::with_capacity(teachers.len());
    for (t, batch) in teachers.iter().zip(&micro.teachers) {
        let ids = ids_tensor::<B::InnerBackend>(&batch.ids, rows, batch.len, device);
        let padding = padding_tensor::<B::InnerBackend>(&batch.padding, rows, batch.len, device);
        let logits = t
            .model
            .forward(ids, padding)
            .with_context(|| format!("teacher {}: forward", t.spec.name))?;
        let logits = Tensor::<B, 3>::from_inner(logits);
        let built = if matches!(weighting, Weighting::Adaptive(_)) {
            TeacherTargets::with_confidence(logits, &batch.plan, params)
        } else {
            TeacherTargets::new(logits, &batch.plan, params)
        };
        targets.push(built.with_context(|| format!("teacher {}", t.spec.name))?);
    }
    let ids = ids_tensor::<B>(&micro.student_ids, rows, micro.student_len, device);
    let padding = padding_tensor::<B>(&micro.student_padding, rows, micro.student_len, device);
    let next_token = &micro.teachers[0].plan.student.next_token;
    let mut recorded = None;
    let backward = student.forward_backward(ids, padding, checkpointing, |model, hidden| {
        let logits = model.logits_from_hidden(hidden);
        let ce = ce::loss(logits.clone(), next_token, params).context("student cross-entropy")?;
        let terms: Vec<multi::Teacher<'_, B>> = teachers
            .iter()
            .zip(&targets)
            .map(|(t, targets)| multi::Teacher {
                targets,
                loss: match (t.mode, &t.tables, &t.projection) {
                    (LossMode::Kl, _, _) => Loss::Kl,
                    (LossMode::Uld, _, _) => Loss::Uld,
                    (LossMode::Gold, Some(tables), _) => Loss::Gold(tables),
                    (LossMode::Hkl, Some(tables), _) => Loss::Hkl(tables),
                    (LossMode::Pkl, _, Some(w)) => Loss::Pkl(w),
                    _ => unreachable!("the teacher's tables are built with its mode"),
                },
                alpha: t.spec.alpha,
            })
            .collect();
        let kd = multi::loss(logits, &terms, weighting, params)?;
        let total = if dynamic_scaling {
            scaling::dynamic(ce.clone(), kd.total.clone())
        } else {
            ce.clone() + kd.total.clone()
        };
        recorded = Some((
            total.clone().inner(),
            ce.inner(),
            kd.total.inner(),
            kd.per_teacher
                .into_iter()
                .map(|l| l.inner())
                .collect::<Vec<_>>(),
            kd.alphas,
        ));
        Ok::<_, anyhow::Error>(total.mul_scalar(scale))
    })?;
    let (total, ce, kd, per_teacher, alphas) = recorded.expect("the loss closure ran");
    let scalar = |t: Tensor<B::InnerBackend, 1>| t.into_scalar().elem::<f64>();
    let values = MicroValues {
        loss: scalar(total),
        ce: scalar(ce),
        kd: scalar(kd),
        teachers: per_teacher.into_iter().map(scalar).zip(alphas).collect(),
    };
    let mut rest = backward.rest;
    let w_grads = teachers
        .iter()
        .map(|t| {
            t.projection
                .as_ref()
                .filter(|_| t.mode == LossMode::Pkl)
                .map(|w| GradientsParams::from_module(&mut rest, w))
        })
        .collect();
    Ok((backward.model, w_grads, values))
}

/// The tokenizers, model configurations and alignment cache of a run.
struct Inputs {
    student_config: HfConfig,
    specs: Vec<TeacherSpec>,
    teacher_configs: Vec<HfConfig>,
    pipeline: Pipeline,
    cache: std::sync::Arc<AlignCache>,
}

impl Inputs {
    /// Loads the tokenizers (sized like the models' embedding tables) and opens the alignment
    /// cache, building it first when absent.
    fn load(config: &RunConfig, progress: bool) -> Result<Self> {
        let student_config = HfConfig::read(&config.student.model)?;
        let specs = config.teacher_specs()?;
        let teacher_configs = specs
            .iter()
            .map(|s| HfConfig::read(&s.model).map_err(anyhow::Error::from))
            .collect::<Result<Vec<_>>>()?;
        let student_vocab = Vocabulary::load_padded(
            config.student_tokenizer(),
            Some(student_config.architecture.vocab_size),
        )?;
        let teacher_vocabs = specs
            .iter()
            .zip(&teacher_configs)
            .map(|(s, c)| {
                Vocabulary::load_padded(&s.tokenizer, Some(c.architecture.vocab_size))
                    .map_err(anyhow::Error::from)
            })
            .collect::<Result<Vec<_>>>()?;
        let aligners = teacher_vocabs
            .iter()
            .map(|t| xtoken_core::align::Aligner::new(&student_vocab, t, config.align_params()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let pipeline = Pipeline {
            student: student_vocab,
            teachers: teacher_vocabs,
            aligners,
        };
        let cache = std::sync::Arc::new(prepare_cache(config, &pipeline, progress)?);
        Ok(Inputs {
            student_config,
            specs,
            teacher_configs,
            pipeline,
            cache,
        })
    }
}

/// Builds what the workers of a run share on disk (the alignment cache and every W) once,
/// before they start.
#[cfg_attr(not(feature = "collective"), allow(dead_code))]
pub fn prepare(config: &RunConfig) -> Result<()> {
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let inputs = Inputs::load(config, progress)?;
    for (m, spec) in inputs.specs.iter().enumerate() {
        if matches!(spec.loss, LossMode::Pkl | LossMode::Hkl | LossMode::Auto) {
            projection_for(
                config,
                spec,
                &inputs.pipeline.student,
                &inputs.pipeline.teachers[m],
            )?;
        }
    }
    Ok(())
}

/// A hash of every parameter's bytes: data-parallel workers must end with equal ones.
fn fingerprint<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M) -> u64 {
    use std::hash::Hasher;
    struct Hash(std::collections::hash_map::DefaultHasher);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Hash {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.write(&param.val().into_data().bytes);
        }
    }
    let mut hash = Hash(std::collections::hash_map::DefaultHasher::new());
    module.visit(&mut hash);
    hash.0.finish()
}

/// Runs `xtoken train` on backend `B`.
pub fn run<B>(
    config: RunConfig,
    args: &TrainArgs,
    device: B::Device,
    worker: Worker,
) -> Result<RunSummary>
where
    B: AutodiffBackend + XTokenBackend + DeviceMemory,
    B::InnerBackend: XTokenBackend,
{
    let lead = worker.rank == 0;
    let worker = &worker;
    let out = config.output_dir.clone();
    std::fs::create_dir_all(&out).with_context(|| format!("{}", out.display()))?;
    let run_toml = out.join("run.toml");
    let text = resolved_text(&config)?;
    if args.resume {
        let saved = std::fs::read_to_string(&run_toml).with_context(|| {
            format!(
                "{}: --resume needs the run directory of an earlier run",
                run_toml.display()
            )
        })?;
        if saved != text {
            bail!(
                "{}: the configuration differs from the one this run was started with ({}); resume with the same settings",
                args.config.display(),
                run_toml.display()
            );
        }
    } else if latest_checkpoint(&out.join("checkpoints"))?.is_some() {
        bail!(
            "{} already holds checkpoints: pass --resume to continue that run, or choose another output_dir",
            out.display()
        );
    } else if lead {
        std::fs::write(&run_toml, &text).with_context(|| format!("{}", run_toml.display()))?;
    }

    let progress_visible = lead && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let Inputs {
        student_config,
        specs,
        teacher_configs,
        pipeline,
        cache,
    } = Inputs::load(&config, progress_visible)?;

    // Teachers: model, loss mode and the tables it needs.
    let setup = LossSetup {
        params: config.loss_params(),
        weighting: config.weighting()?,
        dynamic_scaling: config.loss.dynamic_scaling,
        checkpointing: config.training.activation_checkpointing,
    };
    let student_width = student_config.architecture.vocab_size;
    let mut teachers: Vec<TeacherRun<B>> = Vec::with_capacity(specs.len());
    for (m, spec) in specs.iter().enumerate() {
        let teacher_vocab = &pipeline.teachers[m];
        let teacher_width = teacher_configs[m].architecture.vocab_size;
        let needs_w = matches!(spec.loss, LossMode::Pkl | LossMode::Hkl | LossMode::Auto);
        let w = if needs_w {
            Some(projection_for(
                &config,
                spec,
                &pipeline.student,
                teacher_vocab,
            )?)
        } else {
            None
        };
        let mode = match (spec.loss, &w) {
            (LossMode::Auto, Some(w)) => {
                let report = audit::audit(
                    &pipeline.student,
                    teacher_vocab,
                    w,
                    &AuditOptions::default(),
                );
                if lead {
                    eprintln!(
                        "teacher {}: auto → {:?}: {}",
                        spec.name, report.recommendation, report.reason
                    );
                }
                match report.recommendation {
                    LossChoice::Pkl => LossMode::Pkl,
                    LossChoice::Hkl => LossMode::Hkl,
                }
            }
            (mode, _) => mode,
        };
        if mode == LossMode::Kl && pipeline.student.sha256() != teacher_vocab.sha256() {
            bail!(
                "teachers[{m}].loss = \"kl\": KL needs the student's tokenizer, but {} differs from {}; use pkl, hkl, gold or uld",
                teacher_vocab.path().display(),
                pipeline.student.path().display()
            );
        }
        let strict = || CommonSet::strict(&pipeline.student, teacher_vocab);
        let tables = match mode {
            LossMode::Gold => Some(CommonTables::new(&strict(), student_width, teacher_width)?),
            LossMode::Hkl => Some(hkl::tables(
                &strict(),
                w.as_ref().expect("W is built for H-KL"),
                student_width,
                teacher_width,
            )?),
            _ => None,
        };
        let projection = match (mode, &w) {
            (LossMode::Pkl, Some(w)) => {
                let module = LearnableProjection::<B>::new(w, student_width, &device)?;
                Some(if config.projection.learnable {
                    module
                } else {
                    module.no_grad()
                })
            }
            _ => None,
        };
        let dtype = dtype_of::<B::InnerBackend>(spec.dtype, &device);
        let model =
            Transformer::<B::InnerBackend>::load_with(&spec.model, LoadOptions { dtype }, &device)
                .with_context(|| format!("teacher {}", spec.name))?;
        if lead {
            eprintln!(
                "teacher {}: {} ({} parameters, {dtype:?}), {}, α = {}",
                spec.name,
                spec.model.display(),
                model.architecture.num_parameters(),
                mode.name(),
                spec.alpha
            );
        }
        teachers.push(TeacherRun {
            spec: spec.clone(),
            mode,
            model,
            tables,
            projection,
        });
    }

    // The student and its optimizers.
    let student_dtype = dtype_of::<B>(config.student_dtype()?, &device);
    let student = Transformer::<B>::load_with(
        &config.student.model,
        LoadOptions {
            dtype: student_dtype,
        },
        &device,
    )
    .context("student")?;
    if lead {
        eprintln!(
            "student: {} ({} parameters, {student_dtype:?})",
            config.student.model.display(),
            student.architecture.num_parameters()
        );
    }
    let t = &config.training;
    let adam = |decay: f64| {
        AdamWConfig::new()
            .with_beta_1(t.beta1 as f32)
            .with_beta_2(t.beta2 as f32)
            .with_epsilon(t.epsilon as f32)
            .with_weight_decay(decay as f32)
    };
    let mut trainable = Trainable {
        decay: adam(t.weight_decay).init(),
        no_decay: adam(0.0).init(),
        w_optims: teachers
            .iter()
            .map(|tr| {
                (tr.projection.is_some() && config.projection.learnable).then(|| {
                    AdamWConfig::new()
                        .with_epsilon(1e-8)
                        .with_weight_decay(0.0)
                        .init()
                })
            })
            .collect(),
        student,
    };

    // Where to start.
    let checkpoints = out.join("checkpoints");
    let mut state = CheckpointState {
        step: 0,
        loader: LoaderState::default(),
        tokens: 0,
        seconds: 0.0,
        teachers: specs.iter().map(|s| s.name.clone()).collect(),
    };
    if args.resume {
        match latest_checkpoint(&checkpoints)? {
            Some((dir, saved)) => {
                load_checkpoint(&dir, &mut trainable, &mut teachers, &device)?;
                if lead {
                    eprintln!("resuming from {} (step {})", dir.display(), saved.step);
                }
                state = saved;
            }
            None => {
                if lead {
                    eprintln!(
                        "no checkpoint in {}: starting from step 0",
                        checkpoints.display()
                    );
                }
            }
        }
    }
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let mut metrics = if lead {
        Some(MetricsLog::open(
            &out.join("metrics.csv"),
            &names,
            state.step,
        )?)
    } else {
        None
    };

    let accum = config.grad_accum(worker.count)?;
    let packer = Packer::new(cache.clone(), config.seed, t.context_length, state.loader)?;
    let mut loader = Loader::start(
        packer,
        BatchShape {
            global: t.batch_size,
            micro: t.micro_batch,
            workers: worker.count,
            rank: worker.rank,
        },
        config.merge_variant()?,
        config.data.prefetch,
    );
    let norm_ids = norm_param_ids(&trainable.student);
    let last = args.stop_after.unwrap_or(t.steps).min(t.steps);
    let bar = if progress_visible {
        ProgressBar::new(t.steps)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps · {msg} · ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position(state.step);
    if lead {
        eprintln!(
            "training steps {}..{last} of {}: {} sequences × {} tokens per step ({} per micro-batch, {accum} micro-batches × {} workers)",
            state.step,
            t.steps,
            t.batch_size,
            t.context_length,
            t.micro_batch,
            worker.count
        );
    }
    let started = Instant::now();
    let seconds_before = state.seconds;
    let mut summary = RunSummary::default();
    let mut heap_base = 0usize;
    while state.step < last {
        let step_start = Instant::now();
        let batch = loader.next()?;
        let mut student_acc = GradientsAccumulator::<Transformer<B>>::new();
        let mut w_acc: Vec<Option<GradientsParams>> = teachers.iter().map(|_| None).collect();
        let mut sums = MicroValues {
            loss: 0.0,
            ce: 0.0,
            kd: 0.0,
            teachers: vec![(0.0, 0.0); teachers.len()],
        };
        let mut tokens = 0usize;
        let micro_count = batch.micro.len();
        for micro in &batch.micro {
            let (grads, w_grads, values) = micro_step(
                &trainable.student,
                &teachers,
                micro,
                &setup,
                1.0 / micro_count as f64,
                &device,
            )
            .with_context(|| format!("step {}", state.step + 1))?;
            if !(values.loss.is_finite()) {
                bail!(
                    "step {}: the loss is {} (CE {}, KD {}); stopping before the weights are touched",
                    state.step + 1,
                    values.loss,
                    values.ce,
                    values.kd
                );
            }
            student_acc.accumulate(&trainable.student, grads);
            for ((acc, g), tr) in w_acc.iter_mut().zip(w_grads).zip(&teachers) {
                if let (Some(g), Some(w)) = (g, &tr.projection) {
                    let mut sum = GradientsAccumulator::<LearnableProjection<B>>::new();
                    if let Some(previous) = acc.take() {
                        sum.accumulate(w, previous);
                    }
                    sum.accumulate(w, g);
                    *acc = Some(sum.grads());
                }
            }
            sums.loss += values.loss;
            sums.ce += values.ce;
            sums.kd += values.kd;
            for (s, v) in sums.teachers.iter_mut().zip(&values.teachers) {
                s.0 += v.0;
                s.1 += v.1;
            }
            tokens += micro.tokens;
        }
        // Gradients and metrics, averaged over micro-batches (by the loss scale) and workers.
        let n = micro_count as f64;
        let mut values = vec![sums.loss / n, sums.ce / n, sums.kd / n, tokens as f64];
        for (l, a) in &sums.teachers {
            values.extend([l / n, a / n]);
        }
        let averaged = worker.average(
            Exchange {
                student: &trainable.student,
                student_grads: student_acc.grads(),
                projections: teachers
                    .iter()
                    .zip(w_acc)
                    .map(|(tr, acc)| tr.projection.as_ref().zip(acc))
                    .collect(),
                values,
            },
            &device,
        )?;
        let values = averaged.values;
        let mut grads = averaged.student_grads;
        let grad_norm = clip_global_norm(&trainable.student, &mut grads, t.grad_clip);
        let lr = learning_rate(state.step, t.steps, t.lr, t.warmup, t.min_lr);
        let no_decay_grads = split_grads(&trainable.student, &mut grads, &norm_ids);
        let student = trainable.decay.step(lr, trainable.student.clone(), grads);
        trainable.student = trainable.no_decay.step(lr, student, no_decay_grads);
        for ((tr, optim), grads) in teachers
            .iter_mut()
            .zip(&mut trainable.w_optims)
            .zip(averaged.projection_grads)
        {
            if let (Some(optim), Some(grads), Some(w)) =
                (optim.as_mut(), grads, tr.projection.take())
            {
                tr.projection = Some(optim.step(config.projection.lr, w, grads));
            }
        }
        let step_tokens = (values[3] * worker.count as f64).round() as u64;
        state.step += 1;
        state.loader = batch.state_after;
        state.tokens += step_tokens;
        state.seconds = seconds_before + started.elapsed().as_secs_f64();
        let step_seconds = step_start.elapsed().as_secs_f64();
        summary.step_seconds.push(step_seconds);
        summary.step_tokens.push(step_tokens);
        if summary.step_seconds.len() == 1 {
            heap_base = crate::alloc::current();
            crate::alloc::reset_peak();
        }
        let row = StepMetrics {
            step: state.step,
            lr,
            loss: values[0],
            ce: values[1],
            kd: values[2],
            teachers: (0..teachers.len())
                .map(|m| (values[4 + 2 * m], values[5 + 2 * m]))
                .collect(),
            grad_norm,
            tokens: state.tokens,
            tokens_per_s: step_tokens as f64 / step_seconds.max(1e-9),
            seconds: state.seconds,
        };
        bar.set_position(state.step);
        bar.set_message(format!(
            "loss {:.4} (CE {:.4}, KD {:.4}) · {:.0} tok/s",
            row.loss, row.ce, row.kd, row.tokens_per_s
        ));
        if lead && !progress_visible && (state.step % t.log_every == 0 || state.step == last) {
            let per_teacher: Vec<String> = names
                .iter()
                .zip(&row.teachers)
                .map(|(name, (l, a))| format!("{name} {l:.4} (α {a:.3})"))
                .collect();
            eprintln!(
                "step {}/{} · lr {:.3e} · loss {:.4} · CE {:.4} · KD {:.4} [{}] · |g| {:.3} · {:.0} tok/s",
                state.step,
                t.steps,
                lr,
                row.loss,
                row.ce,
                row.kd,
                per_teacher.join(", "),
                grad_norm,
                row.tokens_per_s
            );
        }
        if let Some(metrics) = metrics.as_mut() {
            metrics.push(row)?;
        }
        let checkpoint_due = state.step % config.checkpoint.every == 0 || state.step == last;
        if lead && checkpoint_due && !args.bench {
            let dir = save_checkpoint(
                &checkpoints,
                &state,
                &trainable,
                &teachers,
                config.checkpoint.keep,
            )?;
            if let Some(metrics) = &metrics {
                metrics.write_svg(
                    &out.join("loss.svg"),
                    &format!("xtoken train · {}", out.display()),
                )?;
            }
            bar.suspend(|| eprintln!("checkpoint {}", dir.display()));
        }
    }
    bar.finish_and_clear();
    drop(loader);
    summary.peak_bytes = match B::reserved_bytes(&device) {
        Some(bytes) => bytes,
        None => crate::alloc::peak().saturating_sub(heap_base) as u64,
    };
    if lead && state.step == t.steps && !args.bench {
        let final_dir = out.join("student");
        let tmp = out.join("student.tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).ok();
        }
        trainable
            .student
            .valid()
            .save(&tmp, save_dtype(config.save_dtype()?))
            .context("saving the student")?;
        // The tokenizer travels with the model.
        let tokenizer = xtoken_core::vocab::resolve_tokenizer_json(&config.student_tokenizer())?;
        std::fs::copy(&tokenizer, tmp.join("tokenizer.json"))
            .with_context(|| format!("copying {}", tokenizer.display()))?;
        for extra in [
            "tokenizer_config.json",
            "generation_config.json",
            "special_tokens_map.json",
        ] {
            let source = config.student.model.join(extra);
            if source.exists() {
                std::fs::copy(&source, tmp.join(extra))?;
            }
        }
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir)?;
        }
        std::fs::rename(&tmp, &final_dir)?;
        eprintln!(
            "done: {} steps, {} tokens in {:.1} s; student saved to {}",
            state.step,
            state.tokens,
            state.seconds,
            final_dir.display()
        );
    }
    if worker.count > 1 {
        summary.fingerprint = fingerprint(&trainable.student);
    }
    Ok(summary)
}

/// Runs `xtoken train`: reads the configuration and starts the workers on the chosen device.
pub fn start(args: TrainArgs) -> Result<()> {
    let config = RunConfig::load(&args.config)?;
    run_config(config, &args).map(drop)
}

/// Runs a loaded configuration: one worker on the chosen device, or data-parallel workers.
pub fn run_config(config: RunConfig, args: &TrainArgs) -> Result<RunSummary> {
    let device = args.device.clone().unwrap_or_else(|| config.device.clone());
    if args.workers.devices.len() > 1 {
        return crate::ddp::start(config, args.clone(), &device);
    }
    let alone = Worker::alone();
    match device.as_str() {
        "cpu" => run::<burn::backend::Autodiff<burn::backend::NdArray>>(
            config,
            args,
            Default::default(),
            alone,
        ),
        #[cfg(feature = "cuda")]
        "cuda" => {
            let index = args.workers.devices.first().copied().unwrap_or(0);
            run::<burn::backend::Autodiff<burn::backend::Cuda>>(
                config,
                args,
                burn::backend::cuda::CudaDevice::new(index),
                alone,
            )
        }
        #[cfg(feature = "wgpu")]
        "wgpu" => run::<burn::backend::Autodiff<burn::backend::Wgpu>>(
            config,
            args,
            Default::default(),
            alone,
        ),
        #[cfg(not(feature = "cuda"))]
        "cuda" => bail!(
            "device = \"cuda\": this xtoken was built without it; rebuild with `--features cuda`"
        ),
        #[cfg(not(feature = "wgpu"))]
        "wgpu" => bail!(
            "device = \"wgpu\": this xtoken was built without it; rebuild with `--features wgpu`"
        ),
        other => bail!("device = {other:?}: expected \"cpu\", \"cuda\" or \"wgpu\""),
    }
}

#[cfg(test)]
mod tests {
    use super::learning_rate;

    #[test]
    fn warmup_then_cosine_to_zero() {
        let lr = |s| learning_rate(s, 100, 1.0, 0.05, 0.0);
        assert!((lr(0) - 0.2).abs() < 1e-12);
        assert!((lr(4) - 1.0).abs() < 1e-12);
        assert!((lr(5) - 1.0).abs() < 1e-12);
        assert!(lr(52) < 0.55 && lr(52) > 0.45);
        assert!(lr(99) < 1e-3 && lr(99) > 0.0);
        assert!((learning_rate(200, 100, 1.0, 0.05, 0.1) - 0.1).abs() < 1e-12);
        assert_eq!(learning_rate(0, 10, 2.0, 0.0, 0.0), 2.0);
    }
}
