//! `xtoken train --check`: everything a run reads before its first step, read and checked
//! without loading a weight or training: the configuration, every model's `config.json` and
//! safetensors headers, the tokenizers, the first document of every data shard, each W (or,
//! where absent, W built in memory for the coverage audit), and the plan that follows: steps,
//! tokens, each teacher's loss, and an estimate of the memory of one device.

use std::fmt;
use std::path::PathBuf;

use xtoken_core::loss::LossKind;
use xtoken_core::projection::SparseProjection;
use xtoken_models::{Architecture, HfConfig};

use crate::config::{DtypeChoice, RunConfig};
use crate::data::{DocumentReader, Source};
use crate::error::{Context, Result};
use crate::inputs::RunInputs;
use crate::step::ScalingScope;

/// A checked run and its plan.
#[derive(Debug, Clone)]
pub struct Preflight {
    /// Data-parallel workers the plan is for.
    pub workers: usize,
    /// Optimizer steps.
    pub steps: u64,
    /// Micro-batches per step and worker.
    pub accum: usize,
    /// Student tokens per step (over all workers).
    pub tokens_per_step: u64,
    /// The student: directory, parameters, dtype.
    pub student: (PathBuf, usize, DtypeChoice),
    /// Per teacher.
    pub teachers: Vec<TeacherPlan>,
    /// Per data source (then the held-out text's): its name, shard count, bytes on disk, weight
    /// (0 for held-out text).
    pub sources: Vec<(String, usize, u64, f64)>,
    /// The alignment cache, when configured: its path and whether it exists.
    pub cache: Option<(PathBuf, bool)>,
    /// Estimated bytes of one device's memory.
    pub memory: MemoryEstimate,
}

/// One teacher of the plan.
#[derive(Debug, Clone)]
pub struct TeacherPlan {
    /// Its name.
    pub name: String,
    /// Parameters.
    pub parameters: usize,
    /// Its loss, with the coverage audit's reason when `auto` chose it.
    pub loss: (LossKind, Option<String>),
    /// W's file and whether it exists (`None` when the loss needs no W).
    pub projection: Option<(PathBuf, bool)>,
}

/// One device's memory, by part, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryEstimate {
    /// The student's weights, gradients and AdamW's two moments.
    pub student: u64,
    /// Every teacher's weights.
    pub teachers: u64,
    /// One micro-batch's activations: the layer boundaries kept by activation checkpointing
    /// (every layer's activations without it), one layer's, and the logits with their gradient.
    pub activations: u64,
    /// The teachers' top-K targets: a whole step's of this worker with `scaling_scope = "step"`
    /// (kept over its micro-batches), else one micro-batch's.
    pub targets: u64,
}

impl MemoryEstimate {
    /// The sum of the parts.
    pub fn total(&self) -> u64 {
        self.student + self.teachers + self.activations + self.targets
    }
}

/// Reads and checks what the run `config` describes for `workers` data-parallel workers, and
/// returns its plan.
pub fn check(config: &RunConfig, workers: usize) -> Result<Preflight> {
    let accum = config.grad_accum(workers)?;
    let inputs = RunInputs::read(config)?;
    open_weights(&config.student.model).context("student")?;
    for s in &inputs.settings {
        open_weights(&s.model).with_context(|| format!("teacher {}", s.name))?;
    }
    let mut sources = inputs
        .sources
        .iter()
        .map(read_first_documents(&config.data.text_field))
        .collect::<Result<Vec<_>>>()?;
    if let Some(path) = config.eval.as_ref().and_then(|e| e.path.as_ref()) {
        let data = crate::config::DataConfig {
            path: path.clone(),
            weights: None,
            ..config.data.clone()
        };
        for source in crate::data::sources::sources(&data).context("eval.path")? {
            let (name, shards, bytes, _) = read_first_documents(&data.text_field)(&source)?;
            sources.push((format!("held-out {name}"), shards, bytes, 0.0));
        }
    }
    let teachers = (0..inputs.settings.len())
        .map(|m| teacher_plan(config, &inputs, m))
        .collect::<Result<Vec<_>>>()?;
    let t = &config.training;
    let student = &inputs.student_config.architecture;
    Ok(Preflight {
        workers,
        steps: t.steps,
        accum,
        tokens_per_step: (t.batch_size * t.context_length) as u64,
        student: (
            config.student.model.clone(),
            student.num_parameters(),
            config.student_dtype()?,
        ),
        memory: estimate(config, &inputs, accum)?,
        teachers,
        sources,
        cache: config.cache_path().map(|p| {
            let exists = p.exists();
            (p, exists)
        }),
    })
}

/// Opens a model directory's safetensors headers (no tensor is read).
fn open_weights(dir: &std::path::Path) -> Result<()> {
    xtoken_models::checkpoint::Checkpoint::open(dir)?;
    Ok(())
}

/// Checks that every shard of a source opens and yields the text of its first document.
fn read_first_documents(field: &str) -> impl Fn(&Source) -> Result<(String, usize, u64, f64)> + '_ {
    move |source| {
        let mut bytes = 0;
        for shard in &source.shards {
            let mut reader = DocumentReader::open(&shard.path, shard.format, field)?;
            if let Some(doc) = reader.next_doc()? {
                reader.extractor().text(&doc)?;
            }
            bytes += std::fs::metadata(&shard.path).map_or(0, |m| m.len());
        }
        Ok((
            source.name.clone(),
            source.shards.len(),
            bytes,
            source.weight,
        ))
    }
}

/// Teacher `m`'s loss (the audit's choice for `auto`) and W; an absent W is built in memory for
/// the audit only.
fn teacher_plan(config: &RunConfig, inputs: &RunInputs, m: usize) -> Result<TeacherPlan> {
    let settings = &inputs.settings[m];
    let (student, teacher) = (&inputs.pipeline.student, &inputs.pipeline.teachers[m]);
    let needs_w = settings.loss.is_none_or(|kind| kind.needs_projection());
    let path = &settings.projection;
    let w = match (needs_w, path.exists()) {
        (false, _) => None,
        (true, true) => Some(
            SparseProjection::load_verified(path, student, teacher)
                .with_context(|| format!("teacher {}: W", settings.name))?,
        ),
        (true, false) if settings.loss.is_none() => {
            Some(SparseProjection::build(student, teacher, config.projection_params())?.0)
        }
        (true, false) => None,
    };
    let loss = match (settings.loss, &w) {
        (Some(kind), _) => (kind, None),
        (None, Some(w)) => {
            let report = xtoken_core::audit::audit(student, teacher, w, &Default::default());
            (report.recommendation, Some(report.reason))
        }
        (None, None) => unreachable!("auto always has W"),
    };
    Ok(TeacherPlan {
        name: settings.name.clone(),
        parameters: inputs.teacher_configs[m].architecture.num_parameters(),
        loss,
        projection: needs_w.then(|| (path.clone(), path.exists())),
    })
}

/// Bytes per parameter of a dtype choice on the configured device (`auto`: bf16 on a GPU).
fn dtype_bytes(choice: DtypeChoice, gpu: bool) -> u64 {
    match choice {
        DtypeChoice::F32 => 4,
        DtypeChoice::Auto if !gpu => 4,
        _ => 2,
    }
}

/// One device's memory: see [`MemoryEstimate`]'s parts.
fn estimate(config: &RunConfig, inputs: &RunInputs, accum: usize) -> Result<MemoryEstimate> {
    let gpu = config.device != "cpu";
    let t = &config.training;
    let s: &Architecture = &inputs.student_config.architecture;
    let student_bytes = dtype_bytes(config.student_dtype()?, gpu);
    let teachers = inputs
        .settings
        .iter()
        .zip(&inputs.teacher_configs)
        .map(|(settings, c): (_, &HfConfig)| {
            c.architecture.num_parameters() as u64 * dtype_bytes(settings.dtype, gpu)
        })
        .sum();
    let tokens = (t.micro_batch * t.context_length) as u64;
    let boundary = tokens * s.hidden_size as u64 * 4;
    let layers = s.num_hidden_layers as u64;
    let one_layer = 3
        * t.micro_batch as u64
        * s.num_attention_heads as u64
        * (t.context_length as u64).pow(2)
        * 4
        + 8 * boundary
        + tokens * s.intermediate_size as u64 * 4 * 3;
    let kept = match t.activation_checkpointing {
        true => layers * boundary + one_layer,
        false => layers * one_layer,
    };
    let logits = 2 * tokens * s.vocab_size as u64 * 4;
    // Every chunk keeps top-K (value, index) pairs per teacher; at most one chunk per student
    // token. With the step's γ and α, a worker keeps its whole step's targets.
    let top_k = match config.loss.top_k {
        0 => s.vocab_size,
        k => k.min(s.vocab_size),
    } as u64;
    let step_scope = config.scaling_scope()? == ScalingScope::Step;
    let kept_micro = if step_scope { accum as u64 } else { 1 };
    Ok(MemoryEstimate {
        student: s.num_parameters() as u64 * student_bytes * 4,
        teachers,
        activations: kept + logits,
        targets: inputs.settings.len() as u64 * 8 * top_k * tokens * kept_micro,
    })
}

fn gb(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000_000 => format!("{:.2} GB", b as f64 / 1e9),
        b => format!("{:.2} MB", b as f64 / 1e6),
    }
}

impl fmt::Display for Preflight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (dir, params, dtype) = &self.student;
        writeln!(f, "configuration checked; nothing was trained\n")?;
        writeln!(
            f,
            "steps {} · {} worker(s) · {} micro-batches per step and worker · {} student tokens per \
             step · {:.3} B tokens in all",
            self.steps,
            self.workers,
            self.accum,
            self.tokens_per_step,
            (self.steps * self.tokens_per_step) as f64 / 1e9
        )?;
        writeln!(
            f,
            "student {} ({params} parameters, {dtype:?})",
            dir.display()
        )?;
        for t in &self.teachers {
            let (kind, reason) = &t.loss;
            let chosen = match reason {
                Some(reason) => format!("auto → {} ({reason})", kind.name()),
                None => kind.name().to_string(),
            };
            let w = match &t.projection {
                Some((path, true)) => format!(" · W {} (checked)", path.display()),
                Some((path, false)) => format!(" · W {} (built at the start)", path.display()),
                None => String::new(),
            };
            writeln!(
                f,
                "teacher {} ({} parameters): {chosen}{w}",
                t.name, t.parameters
            )?;
        }
        let total: f64 = self.sources.iter().map(|s| s.3).sum();
        for (name, shards, bytes, weight) in &self.sources {
            let share = match *weight {
                0.0 => String::new(),
                w => format!(", {:.0} % of the documents", 100.0 * w / total),
            };
            writeln!(
                f,
                "data {name}: {shards} shard(s), {} on disk{share} (first document of every \
                 shard read)",
                gb(*bytes),
            )?;
        }
        if let Some((path, exists)) = &self.cache {
            let what = if *exists {
                "exists"
            } else {
                "built at the start"
            };
            writeln!(f, "alignment cache {} ({what})", path.display())?;
        }
        let m = &self.memory;
        write!(
            f,
            "memory of one device, estimated: {} (student with gradients and AdamW {}, teachers \
             {}, activations of a micro-batch {}, teacher targets {})",
            gb(m.total()),
            gb(m.student),
            gb(m.teachers),
            gb(m.activations),
            gb(m.targets)
        )
    }
}
