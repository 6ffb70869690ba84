//! `xtoken train --check`: everything a run reads before its first step, read and checked
//! without loading a weight or training: the configuration, every model's `config.json` and
//! safetensors headers, the tokenizers, the first document of every data shard, each W (or,
//! where absent, W built in memory for the coverage audit), and the plan that follows: steps,
//! tokens, each teacher's loss, and an estimate of the memory of one device.

use std::fmt;
use std::path::PathBuf;

use xtoken_core::loss::LossKind;
use xtoken_core::projection::SparseProjection;
use xtoken_core::vocab::Vocabulary;

use crate::config::{DeviceKind, ExchangeKind};
use crate::config::{DtypeChoice, OnPolicyConfig, RunConfig};
use crate::data::packer::PROMPTLESS_STREAMED;
use crate::data::pipeline::PIECE_BYTES;
use crate::data::{DocumentReader, Fields, Source};
use crate::error::{Context, Error, Failures, Result};
use crate::output::Inputs;
use crate::train::inputs::RunInputs;
use crate::train::memory::{self, MemoryEstimate};
use crate::train::options::RunOptions;

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
    /// `training.compute_dtype`.
    pub compute_dtype: DtypeChoice,
    /// Per teacher.
    pub teachers: Vec<TeacherPlan>,
    /// Per data source, then the held-out text's.
    pub sources: Vec<SourcePlan>,
    /// The alignment cache, when configured: its path and whether it exists.
    pub cache: Option<(PathBuf, bool)>,
    /// Estimated bytes of one device's memory, and of the inputs every process holds.
    pub memory: MemoryEstimate,
    /// With `[on_policy]`: its settings, the sequences of a step, and the bytes of the key/value
    /// cache the student writes `generation_batch` sequences with.
    pub on_policy: Option<(OnPolicyConfig, usize, u64)>,
    /// How the workers sum their gradients (`None`: one worker, nothing exchanged), with the
    /// NCCL library found, and the bytes per bucket.
    pub exchange: Option<(ExchangeKind, Option<String>, usize)>,
}

/// One data source of the plan.
#[derive(Debug, Clone)]
pub struct SourcePlan {
    /// Its name (the `data.path` entries it covers).
    pub name: String,
    /// Its shards.
    pub shards: usize,
    /// Their bytes on disk.
    pub bytes: u64,
    /// Its mixture weight (0 for held-out text).
    pub weight: f64,
    /// The shards whose first document is longer than one alignment takes whole, with its
    /// length in bytes: it is aligned in pieces (see [`crate::data::pipeline::PIECE_BYTES`]).
    pub long_documents: Vec<(PathBuf, usize)>,
    /// The longest of those: its bytes, and its tokens under the student's and every teacher's
    /// tokenizer together, estimated from those of its first 64 KiB (for the memory estimate: a
    /// document is held whole once aligned).
    pub longest: Option<(usize, u64)>,
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
    /// Its index among the run's teachers.
    pub index: usize,
    /// A served teacher: its server, model and top-K, as asked.
    pub served: Option<String>,
}

/// What `train --check` found: the plan, whenever the inputs it rests on could be read (also when
/// something else fails, so that a refusal for memory comes with the estimate), and every
/// failure.
#[derive(Debug)]
pub struct Checked {
    /// The run's plan.
    pub plan: Option<Preflight>,
    /// Each failure that stops the run before its first step (`Ok`: none).
    pub verdict: Result<()>,
}

/// Where a run is planned: `workers` data-parallel workers on the device family `kind`, whose
/// memory is `device_memory` when the device cannot be asked (a login node without the GPU).
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Data-parallel workers.
    pub workers: usize,
    /// The device family.
    pub kind: DeviceKind,
    /// One device's memory in bytes, when given.
    pub device_memory: Option<u64>,
}

/// Reads and checks what the run `config` describes on `target`, as `train` would with
/// `options` before its first step, and returns its plan. Every check that can run does: the
/// error lists each failure, not only the first.
pub fn check(
    config: &RunConfig,
    workers: usize,
    kind: DeviceKind,
    options: &RunOptions,
) -> Result<Preflight> {
    let target = Target {
        workers,
        kind,
        device_memory: None,
    };
    let checked = check_on(config, target, options);
    checked.verdict?;
    checked
        .plan
        .ok_or_else(|| Error::Run("no plan: the inputs could not be read".into()))
}

/// [`check`], returning the plan with the failures.
pub fn check_on(config: &RunConfig, target: Target, options: &RunOptions) -> Checked {
    let mut failures = Failures::default();
    let plan = plan(config, target, options, &mut failures);
    Checked {
        plan,
        verdict: failures.or_value(()),
    }
}

fn plan(
    config: &RunConfig,
    target: Target,
    options: &RunOptions,
    failures: &mut Failures,
) -> Option<Preflight> {
    let Target {
        workers,
        kind,
        device_memory,
    } = target;
    if failures.note(config.validate()).is_none() {
        inputs_without_values(config, options, failures);
        return None;
    }
    check_settings(config, target, options, failures);
    let exchange = exchange_plan(config, target, failures);
    let accum = failures.note(config.grad_accum(workers));
    let inputs = failures.note(RunInputs::read(config))?;
    let mut served = check_inputs(config, &inputs, options, failures);
    let sources = source_plans(config, &inputs, failures);
    let teachers: Vec<_> = (0..inputs.settings.len())
        .filter_map(|m| failures.note(teacher_plan(config, &inputs, m)))
        .map(|t| TeacherPlan {
            served: served.get_mut(t.index).and_then(Option::take),
            ..t
        })
        .collect();
    let documents = longest_document(&sources);
    let with_documents = |m: MemoryEstimate| MemoryEstimate { documents, ..m };
    let memory = failures.note(memory::estimate(config, &inputs, accum.unwrap_or(1)));
    let memory = memory.map(with_documents);
    let free = match kind {
        DeviceKind::Cuda => xtoken_kernels::device::cuda_free_memory(0),
        _ => None,
    };
    // `train` compares the estimate of one worker's share of the step, as `Run::open` does.
    let one = config.grad_accum(1);
    let fits = one.and_then(|accum| memory::estimate(config, &inputs, accum).map(with_documents));
    let limit = free.or(device_memory);
    failures.note(fits.and_then(|m| memory::check_fits(&m, limit, "the estimate is above")));
    let (accum, memory) = (accum?, memory?);
    let t = &config.training;
    let student = &inputs.student_config.architecture;
    let on_policy = config.on_policy_active().cloned().map(|o| {
        // Keys and values of every layer for the longest sequence, in f32 at most.
        let positions = (o.prompt_tokens + o.max_new_tokens).min(t.context_length) as u64;
        let per_position =
            2 * student.num_hidden_layers * student.num_key_value_heads * student.head_dim * 4;
        let cache = o.generation_batch as u64 * positions * per_position as u64;
        (o, t.batch_size, cache)
    });
    Some(Preflight {
        on_policy,
        exchange,
        workers,
        steps: t.steps,
        accum,
        tokens_per_step: (t.batch_size * t.context_length) as u64,
        student: (
            config.student.model.clone(),
            student.num_parameters(),
            config.student_dtype().ok()?,
        ),
        compute_dtype: config.compute_dtype().ok()?,
        memory,
        teachers,
        sources,
        cache: config.cache_path().map(|p| {
            let exists = p.exists();
            (p, exists)
        }),
    })
}

/// The checks of the configuration and the command line against the target, before any input
/// is read: the options, the outputs, the device and its dtypes.
fn check_settings(
    config: &RunConfig,
    target: Target,
    options: &RunOptions,
    failures: &mut Failures,
) {
    failures.note(check_options(config, options));
    if let (Some(_), true) = (target.device_memory, target.kind.on_host()) {
        failures.note::<()>(Err(Error::Config(format!(
            "--gpu-memory: device = \"{}\" trains in this machine's memory, which the estimate \
             is compared with; --gpu-memory plans a GPU run (device = \"cuda\" or \"wgpu\")",
            config.device
        ))));
    }
    failures.note(check_outputs(config, options, true));
    failures.note(crate::backend::check_device(config, target.kind));
}

/// The exchange the workers will sum through (`parallel.exchange` on the target), and for NCCL
/// the library this process loads (its absence is a failure, naming where it looked).
fn exchange_plan(
    config: &RunConfig,
    target: Target,
    failures: &mut Failures,
) -> Option<(ExchangeKind, Option<String>, usize)> {
    let choice = config.exchange_choice().ok()?;
    let kind = failures.note(choice.resolve(target.kind, target.workers))??;
    let library = match kind {
        ExchangeKind::Ring => None,
        ExchangeKind::Nccl => {
            let found = xtoken_kernels::nccl::found()
                .map_err(|e| Error::Config(format!("parallel.exchange = NCCL: {e}")));
            let (path, version) = failures.note(found)?;
            Some(format!("{version} at {}", path.display()))
        }
    };
    Some((kind, library, config.bucket_bytes()))
}

/// The very checks `train` makes of its inputs before it loads a weight: the benchmarks'
/// prompts, the resumption, on-policy prompts, every model's weight headers and every store.
fn check_inputs(
    config: &RunConfig,
    inputs: &RunInputs,
    options: &RunOptions,
    failures: &mut Failures,
) -> Vec<Option<String>> {
    let mut served = vec![None; inputs.settings.len()];
    failures.note(crate::train::benchmarks::prompts(config));
    failures.note(resume_point(config, options, &inputs.sources));
    failures.note(prompts_present(config, &inputs.sources));
    failures.note(open_weights(&config.student.model).context("student"));
    for (m, s) in inputs.settings.iter().enumerate() {
        match &s.targets {
            // A served teacher: its server, model, top-K and tokenizer, asked.
            None if s.server.is_some() => {
                let connected = crate::train::teachers::connect_served(config, inputs, m);
                if let Some((_, said)) = failures.note(connected) {
                    served[m] = Some(said);
                }
            }
            // Stored targets: the manifest, every shard's checksum and the run's settings.
            Some(dir) => {
                let lenient = options.allow_data_change;
                let store = crate::train::teachers::open_store(config, inputs, m, dir, lenient);
                failures.note(store);
            }
            None => {
                failures
                    .note(open_weights(&s.model).with_context(|| format!("teacher {}", s.name)));
            }
        }
    }
    served
}

/// Each data source's plan, then the held-out text's: the first document of every shard read.
fn source_plans(
    config: &RunConfig,
    inputs: &RunInputs,
    failures: &mut Failures,
) -> Vec<SourcePlan> {
    let fields = crate::data::prompts::fields(config);
    let pipeline = &inputs.pipeline;
    let sides: Vec<&Vocabulary> = std::iter::once(&pipeline.student)
        .chain(&pipeline.teachers)
        .collect();
    let student = &sides[..];
    let mut sources: Vec<_> = inputs
        .sources
        .iter()
        .filter_map(|source| failures.note(read_first_documents(&fields, student)(source)))
        .collect();
    if let Some(path) = config.eval.as_ref().and_then(|e| e.path.as_ref()) {
        let data = crate::config::DataConfig {
            path: path.clone(),
            weights: None,
            ..config.data.clone()
        };
        let held_out = crate::data::sources::sources(&data).context("eval.path");
        let fields = Fields::from(&data.text_field);
        for source in failures.note(held_out).unwrap_or_default() {
            if let Some(plan) = failures.note(read_first_documents(&fields, student)(&source)) {
                sources.push(SourcePlan {
                    name: format!("held-out {}", plan.name),
                    weight: 0.0,
                    ..plan
                });
            }
        }
    }
    sources
}

/// With bad values in `config`: each input that is missing or refuses the run, as far as it
/// can be read without those values (the models, tokenizers and data; stored targets when the
/// loss values they are compared with are good), so that one `--check` names every failure.
fn inputs_without_values(config: &RunConfig, options: &RunOptions, failures: &mut Failures) {
    let Some(inputs) = failures.note(RunInputs::read(config)) else {
        return;
    };
    let loss = &config.loss;
    if !(loss.temperature.is_finite() && loss.temperature > 0.0) {
        return;
    }
    for (m, s) in inputs.settings.iter().enumerate() {
        if let Some(dir) = &s.targets {
            let lenient = options.allow_data_change;
            failures.note(crate::train::teachers::open_store(
                config, &inputs, m, dir, lenient,
            ));
        }
    }
}

/// Where a resumed run continues, found by the checks `train --resume` makes before it loads a
/// weight (and `--check` makes the same way): the configuration it started with, the newest
/// intact checkpoint, and the data as it is now.
#[derive(Debug, Default)]
pub struct ResumePoint {
    /// When the configuration changed since the run started: the one it started with, and
    /// whether `training.steps` was extended.
    pub changed: Option<(RunConfig, bool)>,
    /// The newest intact checkpoint and its state (`None`: the run starts from step 0).
    pub checkpoint: Option<(PathBuf, crate::train::checkpoint::CheckpointState)>,
    /// The data's shards now, as the checkpoint records them.
    pub data: Vec<crate::data::fingerprint::ShardPrint>,
}

/// Checks a run's resumption (with `options.resume`) against its run directory and `sources`:
/// the configuration may change only where a resumed run allows, an intact checkpoint must be
/// there when any is, `--stop-after` and raised `training.steps` must lie past its step, and the
/// data's shards must be those it recorded (or `--allow-data-change`). Every check runs; the
/// error lists each failure.
pub fn resume_point(
    config: &RunConfig,
    options: &RunOptions,
    sources: &[Source],
) -> Result<ResumePoint> {
    let mut failures = Failures::default();
    let data = failures.note(crate::data::fingerprint::of_sources(sources));
    if !options.resume {
        return failures.or_value(ResumePoint {
            data: data.unwrap_or_default(),
            ..Default::default()
        });
    }
    let changed = failures
        .note(changed_configuration(config, options))
        .flatten();
    let checkpoints = config.output_dir.join("checkpoints");
    let checkpoint = failures
        .note(crate::train::checkpoint::latest(&checkpoints))
        .flatten();
    if let Some((_, state)) = &checkpoint {
        let extended = changed.as_ref().is_some_and(|(_, extended)| *extended);
        if extended && config.training.steps <= state.step {
            failures.note::<()>(Err(Error::Config(format!(
                "training.steps = {}: the run resumes after step {}; give more steps",
                config.training.steps, state.step
            ))));
        }
        if let Some(stop) = options.stop_after.filter(|&stop| stop <= state.step) {
            failures.note::<()>(Err(Error::Config(format!(
                "--stop-after {stop}: the run resumed at step {}, with nothing left to train \
                 before it; give a later step",
                state.step
            ))));
        }
        if let Some(now) = &data {
            failures.note(data_unchanged(state, now, options));
        }
    }
    failures.or_value(ResumePoint {
        changed,
        checkpoint,
        data: data.unwrap_or_default(),
    })
}

/// The configuration a resumed run started with and whether its steps were extended, when
/// `config` differs from the run directory's `run.toml` (an error names each refused change).
fn changed_configuration(
    config: &RunConfig,
    options: &RunOptions,
) -> Result<Option<(RunConfig, bool)>> {
    let run_toml = config.output_dir.join("run.toml");
    let saved = std::fs::read_to_string(&run_toml).with_context(|| {
        format!(
            "{}: --resume needs the run directory of an earlier run",
            run_toml.display()
        )
    })?;
    if saved == crate::train::resume::resolved_text(config)? && options.extend.is_none() {
        return Ok(None);
    }
    let started = RunConfig::load_saved(&run_toml)?;
    let extended = crate::train::resume::check(&started, config, options.extend)
        .with_context(|| format!("--resume ({})", run_toml.display()))?;
    Ok(Some((started, extended)))
}

/// The data's shards `now` against those the checkpoint recorded (see
/// [`crate::data::fingerprint`]): a change is an error naming each shard, unless
/// `--allow-data-change`, when it is logged. A checkpoint written before shards were recorded
/// accepts any.
fn data_unchanged(
    state: &crate::train::checkpoint::CheckpointState,
    now: &[crate::data::fingerprint::ShardPrint],
    options: &RunOptions,
) -> Result<()> {
    let changes = crate::data::fingerprint::changes(&state.data, now);
    if state.data.is_empty() || changes.is_empty() {
        return Ok(());
    }
    if !options.allow_data_change {
        return Err(Error::Data(format!(
            "the training data changed since the checkpoint of step {}: {}; restore it, or \
             pass --allow-data-change to train on the data as it is now",
            state.step,
            changes.join("; ")
        )));
    }
    for change in &changes {
        tracing::warn!("--allow-data-change: {change}");
    }
    Ok(())
}

/// The command-line choices a run refuses before it reads anything: `--stop-after` outside
/// 1..=`training.steps`, `--extend-steps` without `--resume`, `--allow-data-change` without
/// `--resume` or a teacher's stored targets (whose data it lets change).
pub fn check_options(config: &RunConfig, options: &RunOptions) -> Result<()> {
    let steps = config.training.steps;
    let stored = config.teachers.iter().any(|t| t.targets.is_some());
    match options.stop_after {
        Some(0) => Err(Error::Config(
            "--stop-after 0: a run stops after a step it trained, from 1 to training.steps".into(),
        )),
        Some(stop) if stop > steps => Err(Error::Config(format!(
            "--stop-after {stop}: past the run's last step (training.steps = {steps}); give a \
             step from 1 to {steps}, or raise training.steps"
        ))),
        _ if !options.resume && options.extend.is_some() => {
            Err(Error::Config("--extend-steps: only with --resume".into()))
        }
        _ if !options.resume && options.allow_data_change && !stored => Err(Error::Config(
            "--allow-data-change: only with --resume or stored teacher targets (a new run reads \
             the data as it is)"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// What a run writes may not replace what it reads or what the user keeps: `output_dir` must
/// be a directory (or not exist yet); a resumed run's must hold its `run.toml`; a new run's
/// `run.toml` may not be the configuration file given; `<output_dir>/student`, where the trained
/// student goes, may not be, hold or lie in a model directory, tokenizer or data the run reads,
/// nor hold files an export does not write. `checking` (`--check`) also reports a lock held by another
/// live process, which `train` meets when it takes the lock.
pub fn check_outputs(config: &RunConfig, options: &RunOptions, checking: bool) -> Result<()> {
    let out = &config.output_dir;
    crate::train::export::run_inputs(config)
        .refuse(out)
        .context("output_dir")?;
    let run_toml = out.join("run.toml");
    if options.resume && !run_toml.is_file() {
        return Err(Error::Run(format!(
            "--resume: {} is not there, so {} holds no earlier run to resume; start without \
             --resume",
            run_toml.display(),
            out.display()
        )));
    }
    if let (false, Some(file)) = (options.resume, &options.config_file) {
        if crate::paths::same(file, &run_toml) {
            return Err(Error::Config(format!(
                "{}: the --config file is where the run records the configuration it starts \
                 with, and would be overwritten; keep your configuration outside output_dir or \
                 under another name",
                file.display()
            )));
        }
    }
    if !options.resume && crate::train::checkpoint::any(&out.join("checkpoints"))? {
        return Err(Error::Run(format!(
            "{} already holds checkpoints: pass --resume to continue that run, or choose another \
             output_dir",
            out.display()
        )));
    }
    let student = out.join("student");
    crate::train::export::check_target(config, &student).context("output_dir")?;
    // Last, so that the checks above name what they find more closely.
    Inputs::new()
        .check(out, &run_directory())
        .context("output_dir")?;
    if checking {
        if let Some(why) = crate::train::lock::RunLock::held_elsewhere(out) {
            return Err(Error::Run(why));
        }
    }
    Ok(())
}

/// What `output_dir` must be: new, empty, a run directory (see [`is_run_directory`]), or one
/// holding only what a run that failed to open keeps for the next attempt (its alignment cache
/// under `data/`), the W a data-parallel run writes before its workers open it, and a run's lock
/// (whose holder the lock itself names); never inside a run directory.
fn run_directory() -> crate::output::Own<'static> {
    crate::output::Own::Tree {
        what: "a training run",
        recognized: is_run_directory,
        leftover: |entry| {
            let name = entry.file_name().unwrap_or_default();
            let caches = || {
                std::fs::read_dir(entry).is_ok_and(|list| {
                    list.flatten()
                        .all(|e| xtoken_core::cache::is_cache(&e.path()))
                })
            };
            // W written before the workers of a data-parallel run open it.
            let projections = || {
                std::fs::read_dir(entry).is_ok_and(|list| {
                    list.flatten().all(|e| {
                        crate::output::safetensors_holds(&e.path(), &["indices", "weights"])
                    })
                })
            };
            match name.to_str() {
                Some("data") => entry.is_dir() && caches(),
                Some("projections") => entry.is_dir() && projections(),
                Some(crate::train::lock::LOCK_FILE) => true,
                _ => false,
            }
        },
    }
}

/// The entries `xtoken train` writes at the top of its run directory.
pub const RUN_ENTRIES: &[&str] = &[
    "run.toml",
    "metrics.csv",
    "eval.csv",
    "benchmarks.csv",
    "loss.svg",
    "xtoken.lock",
    "checkpoints",
    "student",
    "projections",
    "tensorboard",
    "samples",
    "data",
];

/// Removes what an earlier run wrote in the run directory `dir` (the entries of
/// [`RUN_ENTRIES`]) and nothing else: a file of the user's there stays, and a new run into `dir`
/// is then refused, naming it. Nothing is removed from a directory that is no run's (a new run
/// there meets the output rule of [`check_outputs`]).
pub fn remove_run(dir: &std::path::Path) -> Result<()> {
    if !is_run_directory(dir) {
        return Ok(());
    }
    for name in RUN_ENTRIES {
        let path = dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let removed = match meta.is_dir() {
            true => std::fs::remove_dir_all(&path),
            false => std::fs::remove_file(&path),
        };
        removed.with_context(|| format!("{}: removing it", path.display()))?;
    }
    Ok(())
}

/// Whether `dir` is a run directory `xtoken train` wrote: its `run.toml` is a run configuration
/// and it holds the run's `metrics.csv`.
pub fn is_run_directory(dir: &std::path::Path) -> bool {
    let config = std::fs::read_to_string(dir.join("run.toml"))
        .ok()
        .and_then(|text| toml::from_str::<RunConfig>(&text).ok());
    config.is_some() && dir.join("metrics.csv").is_file()
}

/// Opens a model directory's safetensors headers (no tensor is read).
fn open_weights(dir: &std::path::Path) -> Result<()> {
    xtoken_models::checkpoint::Checkpoint::open(dir)?;
    Ok(())
}

/// Checks that every shard of a source opens (with the prompt's column, where one is read) and
/// yields the text of its first document.
fn read_first_documents<'a>(
    fields: &'a Fields,
    sides: &'a [&'a Vocabulary],
) -> impl Fn(&Source) -> Result<SourcePlan> + 'a {
    move |source| {
        let mut bytes = 0;
        let mut documents = 0;
        let mut long_documents = Vec::new();
        let mut longest: Option<(usize, u64)> = None;
        for shard in &source.shards {
            let mut reader = DocumentReader::open(&shard.path, shard.format, fields.clone())?;
            if let Some(doc) = reader.next_doc()? {
                let text = reader.extractor().text(&doc)?;
                if text.len() > PIECE_BYTES {
                    long_documents.push((shard.path.clone(), text.len()));
                    if longest.is_none_or(|(bytes, _)| text.len() > bytes) {
                        longest = Some((text.len(), estimated_tokens(sides, &text)?));
                    }
                }
                documents += 1;
            }
            bytes += std::fs::metadata(&shard.path).map_or(0, |m| m.len());
        }
        if documents == 0 {
            return Err(Error::Data(format!(
                "data {}: no document in its {} shard(s) ({}): there is nothing to train on",
                source.name,
                source.shards.len(),
                source
                    .shards
                    .iter()
                    .map(|s| s.path.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(SourcePlan {
            name: source.name.clone(),
            shards: source.shards.len(),
            bytes,
            weight: source.weight,
            long_documents,
            longest,
        })
    }
}

/// The tokens of `text` under every tokenizer of `sides` together (the student's and each
/// teacher's), estimated from those of its first 64 KiB (which tell the tokens per byte well
/// enough, and take little memory to tokenize).
fn estimated_tokens(sides: &[&Vocabulary], text: &str) -> Result<u64> {
    let mut end = (64 << 10).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut tokens = 0.0;
    for vocab in sides {
        tokens += vocab.encode(&text[..end])?.len() as f64;
    }
    Ok((tokens / end.max(1) as f64 * text.len() as f64).ceil() as u64)
}

/// The host bytes of the longest of the shards' first documents that is aligned in pieces
/// (0 when none is).
fn longest_document(sources: &[SourcePlan]) -> u64 {
    let longest = sources
        .iter()
        .filter_map(|s| s.longest)
        .max_by_key(|(bytes, _)| *bytes);
    longest.map_or(0, |(bytes, tokens)| {
        memory::document_bytes(bytes as u64, tokens)
    })
}

/// With `on_policy.prompt_field`, checks that every source has a record with a prompt among its
/// first [`PROMPTLESS_STREAMED`] (`train` before it writes anything, and `--check`).
pub fn prompts_present(config: &RunConfig, sources: &[Source]) -> Result<()> {
    let fields = crate::data::prompts::fields(config);
    let Some(field) = &fields.prompt else {
        return Ok(());
    };
    let mut failures = Failures::default();
    for source in sources {
        failures.note(first_prompt(source, &fields, field));
    }
    failures.or_value(())
}

/// Finds a record with a non-empty prompt (`on_policy.prompt_field = field`) among the first
/// [`PROMPTLESS_STREAMED`] of `source`, as the run needs one within as many.
fn first_prompt(source: &Source, fields: &Fields, field: &str) -> Result<()> {
    let mut read = 0;
    for shard in &source.shards {
        let mut reader = DocumentReader::open(&shard.path, shard.format, fields.clone())?;
        while let Some(doc) = reader.next_doc()? {
            let (_, prompt) = reader.extractor().extract(&doc)?;
            if prompt.is_some_and(|p| !p.is_empty()) {
                return Ok(());
            }
            read += 1;
            if read >= PROMPTLESS_STREAMED {
                break;
            }
        }
        if read >= PROMPTLESS_STREAMED {
            break;
        }
    }
    Err(Error::Data(format!(
        "on_policy.prompt_field = {field:?}: none of the first {read} records of data {} has a \
         prompt there (the field is missing, null or an empty string in each)",
        source.name
    )))
}

/// Teacher `m`'s loss (the audit's choice for `auto`) and W; an absent W is taken from the
/// projection cache or built (and cached) for the audit, not written into the run.
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
        (true, false) if settings.loss.is_none() => Some(
            xtoken_core::projection_cache::ProjectionCache::from_env()
                .get_or_build(student, teacher, config.projection_params())?
                .0,
        ),
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
    crate::train::teachers::check_kl(m, loss.0, student, teacher)?;
    Ok(TeacherPlan {
        name: settings.name.clone(),
        parameters: inputs.teacher_configs[m].architecture.num_parameters(),
        loss,
        projection: needs_w.then(|| (path.clone(), path.exists())),
        index: m,
        served: None,
    })
}

/// The longest document's part of an estimate, where it counts.
fn document(m: &MemoryEstimate) -> String {
    match m.documents {
        0 => String::new(),
        bytes => format!(", the longest document aligned {}", gb(bytes)),
    }
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
        match &self.exchange {
            None => writeln!(f, "gradient exchange: none (one worker)")?,
            Some((kind, library, bucket)) => writeln!(
                f,
                "gradient exchange: {}{} in buckets of {}",
                kind.name(),
                library
                    .as_ref()
                    .map_or(String::new(), |l| format!(" (libnccl {l})")),
                gb(*bucket as u64)
            )?,
        }
        writeln!(
            f,
            "student {} ({params} parameters, {dtype:?}, computing in {:?})",
            dir.display(),
            self.compute_dtype
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
            if let Some(served) = &t.served {
                writeln!(f, "  {served}")?;
            }
        }
        let total: f64 = self.sources.iter().map(|s| s.weight).sum();
        for s in &self.sources {
            let share = match s.weight {
                0.0 => String::new(),
                w => format!(", {:.0} % of the documents", 100.0 * w / total),
            };
            writeln!(
                f,
                "data {}: {} shard(s), {} on disk{share} (first document of every shard read)",
                s.name,
                s.shards,
                gb(s.bytes),
            )?;
            for (shard, bytes) in &s.long_documents {
                writeln!(
                    f,
                    "  {}: its first document is {} long, more than one alignment takes whole: \
                     aligned in pieces of at most {} MiB cut at whitespace",
                    shard.display(),
                    gb(*bytes as u64),
                    PIECE_BYTES >> 20
                )?;
            }
        }
        if let Some((on, batch, cache)) = &self.on_policy {
            let prompts = match &on.prompt_field {
                Some(field) => format!("each record's `{field}`"),
                None => format!("each document's first {} student tokens", on.prompt_tokens),
            };
            writeln!(
                f,
                "on-policy: λ = {}: about {:.0} of {batch} sequences per step written by the \
                 student (prompts: {prompts}; up to {} new tokens at temperature {}, top-p {}; \
                 key/value cache of {} sequences {}); trained on what it wrote only, with no \
                 cross-entropy there, γ measured on the off-policy part",
                on.fraction,
                on.fraction * *batch as f64,
                on.max_new_tokens,
                on.temperature,
                on.top_p,
                on.generation_batch,
                gb(*cache)
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
        writeln!(
            f,
            "memory of one device, estimated: {} (student with gradients and AdamW {}, teachers \
             {}, activations of a micro-batch {}, teacher targets {}{})",
            gb(m.total()),
            gb(m.student),
            gb(m.teachers),
            gb(m.activations),
            gb(m.targets),
            match m.on_host {
                true => format!(", tokenizers and aligners {}{}", gb(m.inputs), document(m)),
                false => String::new(),
            }
        )?;
        let devices = match m.on_host {
            true => format!(" and {} device(s) in host memory", self.workers),
            false => String::new(),
        };
        write!(
            f,
            "host memory of one process, estimated: {} (tokenizers and aligners {}{}{devices})",
            gb(m.host_per_process(self.workers)),
            gb(m.inputs),
            document(m)
        )
    }
}
