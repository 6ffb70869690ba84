//! A training run in named stages, top to bottom:
//!
//! 1. [`Run::open`]: the run directory (or the checkpoint to restore), the inputs, the
//!    teachers, the student with its optimizer groups, and the data loader;
//! 2. [`Run::step`]: one optimizer step ([`crate::train::step::step`]) and its metrics;
//! 3. [`Run::log`] and [`Run::checkpoint`]: the metrics file, the progress, the checkpoints;
//! 4. [`Run::export`]: the student as a Hugging Face directory.
//!
//! [`train`] runs them; a benchmark (or a loop of your own) calls them itself.
//!
//! A run directory holds `run.toml` (the configuration it was started with), `metrics.csv`,
//! `loss.svg`, `checkpoints/step-NNNNNNNN/` and, at the end, `student/`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::AutodiffModule;
use xtoken_core::loss::multi::Weighting;
use xtoken_core::loss::TopK;
use xtoken_core::temporary::NewEntries;
use xtoken_models::{LoadOptions, Transformer};

use crate::backend::TrainBackend;
use crate::cluster::parallel::{fingerprint, Worker};
use crate::config::RunConfig;
use crate::data::loader::Finish;
use crate::data::MicroBatch;
use crate::data::{
    AlignedStream, BatchShape, DocumentStream, Feed, Loader, LoaderState, OnPolicyDraw, Packer,
    StepPlan,
};
use crate::error::{Context, Error, Result};
use crate::observe::evals::{EvalLog, EvalRow};
use crate::observe::metrics::{MetricsLog, OnPolicyMetrics, StepMetrics};
use crate::observe::progress::Progress;
use crate::targets::served::{self, ServedTeacher};
use crate::targets::HostTargets;
use crate::train::benchmarks::TrainingBenchmarks;
use crate::train::checkpoint::{self, CheckpointState};
use crate::train::export::{export_trained, write_student};
use crate::train::heldout::HeldOut;
use crate::train::inputs::RunInputs;
use crate::train::lock::RunLock;
use crate::train::memory::MemoryEstimate;
use crate::train::on_policy::OnPolicy;
use crate::train::optim::Trainable;
use crate::train::options::RunOptions;
use crate::train::preflight;
use crate::train::resume::{resolved_text, Extension};
use crate::train::schedule::{anchored_rate, DecayAnchor};
use crate::train::step::{held_out as held_out_values, step, LossSetup, StepRates};
use crate::train::teachers::{dtype_of, Teacher};

/// What a finished run reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSummary {
    /// Steps completed.
    pub steps: u64,
    /// Student tokens trained on (over all workers).
    pub tokens: u64,
    /// Training time, in seconds (resumed runs included).
    pub seconds: f64,
    /// A hash of the student's parameters (data-parallel runs: equal on every worker).
    pub fingerprint: u64,
}

/// A run between its stages.
pub struct Run<B: TrainBackend> {
    config: RunConfig,
    device: B::Device,
    worker: Worker,
    teachers: Vec<Teacher<B>>,
    trainable: Trainable<B>,
    setup: LossSetup,
    state: CheckpointState,
    loader: Loader,
    /// The student's writing of the on-policy sequences (runs with `[on_policy]`).
    on_policy: Option<OnPolicy>,
    metrics: Option<MetricsLog>,
    progress: Progress,
    /// When this process started training, and the seconds of the steps before it.
    clock: (Instant, f64),
    /// The step this process stops after.
    last: u64,
    /// The held-out rows and their log (lead worker, with `eval.path`).
    held_out: Option<(HeldOut, EvalLog)>,
    /// The benchmarks (lead worker, with `eval.tasks`).
    benchmarks: Option<TrainingBenchmarks>,
    /// The configuration run.toml takes with the next checkpoint (a resumed run that changed
    /// some of it), so that it never runs ahead of the checkpoint that goes with it.
    pending_run_toml: Option<String>,
    /// The run directory's lock (lead worker), released when the run is dropped.
    lock: Option<RunLock>,
    /// One device's memory as `--check` estimates it (one worker's share of the step).
    memory: MemoryEstimate,
    /// `XTOKEN_MEMORY_CAP`, read once: the device pools are compared with it after each step.
    memory_cap: Option<u64>,
}

impl<B: TrainBackend> Run<B> {
    /// Opens (or, with `options.resume`, restores) the run `config` describes, on `device`, as
    /// `worker` of its data-parallel workers.
    pub fn open(
        config: RunConfig,
        options: &RunOptions,
        device: B::Device,
        worker: Worker,
    ) -> Result<Self> {
        let lead = worker.leads();
        crate::train::preflight::check_options(&config, options)?;
        if lead {
            crate::train::preflight::check_outputs(&config, options, false)?;
        }
        // A run that fails to open leaves its directory as it was (`run.toml`, a W built, logs
        // go), but for `data/`: an alignment cache built there serves the next attempt.
        let created = lead.then(|| NewEntries::of(&config.output_dir).sparing("data"));
        let lock = match lead {
            true => match lock_directory(&config.output_dir) {
                Ok(lock) => Some(lock),
                // Another process's directory: nothing new in it is this run's.
                Err(e) => {
                    created.into_iter().for_each(NewEntries::keep);
                    return Err(e);
                }
            },
            false => None,
        };
        let mut run = Self::open_locked(config, options, device, worker)?;
        run.lock = lock;
        created.into_iter().for_each(NewEntries::keep);
        Ok(run)
    }

    fn open_locked(
        config: RunConfig,
        options: &RunOptions,
        device: B::Device,
        worker: Worker,
    ) -> Result<Self> {
        let lead = worker.leads();
        open_directory(&config, options, lead)?;
        let progress = Progress::new(lead, &config);
        let inputs = RunInputs::load(&config, progress.visible)?;
        let point = preflight::resume_point(&config, options, &inputs.sources)?;
        preflight::prompts_present(&config, &inputs.sources)?;
        let memory = crate::train::memory::estimate(&config, &inputs, config.grad_accum(1)?)?;
        let memory_cap = crate::train::memory::cap()?;
        if !options.skip_memory_check {
            let seen = "see `xtoken train --check`";
            crate::train::memory::check_fits(&memory, B::free_bytes(&device), seen)?;
        }
        let mut teachers = (0..inputs.settings.len())
            .map(|m| {
                Teacher::<B>::load(
                    &config,
                    &inputs,
                    m,
                    &device,
                    (lead, options.allow_data_change),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let mut trainable = load_student(&config, &teachers, &device, lead)?;
        let mut state = restore(
            &config,
            (options.resume, &point),
            &mut trainable,
            &mut teachers,
            &device,
            lead,
        )?;
        state.data = point.data;
        let pending_run_toml = match point.changed {
            Some((started, extended)) => {
                let text = extend(&config, &started, &mut state, extended, options.extend)?;
                // The configuration file given is run.toml itself: it is never rewritten.
                (!same_file(options, &config)).then_some(text)
            }
            None => None,
        };
        let names: Vec<String> = teachers.iter().map(|t| t.settings.name.clone()).collect();
        let metrics = lead
            .then(|| {
                let path = config.output_dir.join("metrics.csv");
                let on_policy = config.on_policy_active().is_some();
                MetricsLog::open(&path, &names, on_policy, state.step)
            })
            .transpose()?;
        let held_out = match lead {
            true => held_out(&config, &inputs, &names, state.step)?,
            false => None,
        };
        let benchmarks = match lead {
            true => TrainingBenchmarks::open(&config, state.step)?,
            false => None,
        };
        let accum = config.grad_accum(worker.count)?;
        let lenient = options.allow_data_change;
        let multiple = match config.training.length_multiple {
            0 => B::length_multiple(),
            m => m,
        };
        let stores = teachers
            .iter()
            .map(|t| {
                let stored = t.store.clone().map(HostTargets::Stored);
                let served = t.served.clone().map(HostTargets::Served);
                stored.or(served).map(|h| (h, t.vocab))
            })
            .collect();
        let loader = start_loader(
            &config,
            &inputs,
            stores,
            (&worker, multiple),
            (state.loader.clone(), state.step),
            lenient,
        )?;
        let on_policy = OnPolicy::of(&config, inputs.pipeline.clone(), multiple)?;
        let t = &config.training;
        let last = options.stop_after.unwrap_or(t.steps).min(t.steps);
        progress.start(&config, state.step, last, (accum, worker.count));
        Ok(Self {
            setup: LossSetup::of(&config)?,
            on_policy,
            device,
            worker,
            teachers,
            trainable,
            metrics,
            loader,
            progress,
            clock: (Instant::now(), state.seconds),
            state,
            last,
            pending_run_toml,
            held_out,
            benchmarks,
            config,
            lock: None,
            memory,
            memory_cap,
        })
    }

    /// Whether the lead worker evaluates after the current step: every `eval.every` steps and
    /// after the last one.
    pub fn eval_due(&self) -> bool {
        let step = self.state.step;
        let lead = self.held_out.is_some() || self.benchmarks.is_some();
        match &self.config.eval {
            Some(eval) if lead => step.is_multiple_of(eval.every) || step == self.last,
            _ => false,
        }
    }

    /// Evaluates the student (lead worker, with `[eval]`): the held-out rows, whose values are
    /// logged and recorded in `eval.csv` and the TensorBoard file (and returned), then the
    /// benchmarks, recorded in `benchmarks.csv` and the TensorBoard file.
    pub fn evaluate(&mut self) -> Result<Option<EvalRow>> {
        let row = self.evaluate_held_out()?;
        self.score_benchmarks()?;
        Ok(row)
    }

    fn score_benchmarks(&mut self) -> Result<()> {
        let Some(benchmarks) = self.benchmarks.as_mut() else {
            return Ok(());
        };
        let step = self.state.step;
        let student = self.trainable.student.valid();
        let reports = self
            .progress
            .bar
            .suspend(|| benchmarks.score(step, &student))
            .with_context(|| format!("scoring the benchmarks after step {step}"))?;
        if let Some(metrics) = self.metrics.as_mut() {
            metrics.push_benchmarks(step, &reports)?;
        }
        let scores: Vec<String> = reports
            .iter()
            .filter_map(|r| {
                let m = r.headline_metric()?;
                Some(format!(
                    "{} {} {:.2} ± {:.2}",
                    r.task,
                    m.name,
                    100.0 * m.value,
                    100.0 * m.stderr
                ))
            })
            .collect();
        let line = format!("benchmarks after step {step}: {}", scores.join(" · "));
        self.progress.bar.suspend(|| tracing::info!("{line}"));
        Ok(())
    }

    fn evaluate_held_out(&mut self) -> Result<Option<EvalRow>> {
        let Some((rows, log)) = self.held_out.as_mut() else {
            return Ok(None);
        };
        let (ce, teachers) = held_out_values(
            &self.trainable.student,
            &self.teachers,
            &rows.batches,
            &self.setup,
            &self.device,
        )
        .with_context(|| format!("evaluating after step {}", self.state.step))?;
        let row = EvalRow {
            step: self.state.step,
            ce,
            teachers,
        };
        log.push(row.clone())?;
        if let Some(metrics) = self.metrics.as_mut() {
            metrics.push_eval(&row)?;
        }
        let per_teacher: Vec<String> = self
            .teachers
            .iter()
            .zip(&row.teachers)
            .map(|(t, l)| format!("{} {l:.4}", t.settings.name))
            .collect();
        let line = format!(
            "held-out after step {}: CE {:.4} · [{}] ({} tokens)",
            row.step,
            row.ce,
            per_teacher.join(", "),
            rows.tokens
        );
        self.progress.bar.suspend(|| tracing::info!("{line}"));
        Ok(Some(row))
    }

    /// The learning rate of the step after `step`.
    fn rate_after(&self, step: u64) -> f64 {
        let t = &self.config.training;
        anchored_rate(
            step,
            t.steps,
            (t.lr, t.warmup, t.min_lr),
            self.state.decay_from,
        )
    }

    /// Whether the run has reached the step it stops after.
    pub fn done(&self) -> bool {
        self.state.step >= self.last
    }

    /// One device's memory as `xtoken train --check` estimates it for this run.
    pub fn memory_estimate(&self) -> MemoryEstimate {
        self.memory
    }

    /// Where the run stands.
    pub fn state(&self) -> &CheckpointState {
        &self.state
    }

    /// The student as trained so far.
    pub fn student(&self) -> &Transformer<B> {
        &self.trainable.student
    }

    /// The next optimizer step; returns its metrics.
    pub fn step(&mut self) -> Result<StepMetrics> {
        let started = Instant::now();
        crate::observe::profile::start_step();
        let n = self.state.step + 1;
        let mut batch = self.loader.next_step()?;
        crate::observe::profile::boundary::<B>(&self.device, || "data wait".into());
        let generation = match self.on_policy.as_mut() {
            Some(writer) => {
                let student = self.trainable.student.valid();
                let generation = catch_out_of_memory(n, || writer.write(&student, &mut batch))
                    .with_context(|| format!("step {n}"))?;
                crate::observe::profile::boundary::<B>(&self.device, || {
                    "on-policy: the student writes".into()
                });
                Some(generation)
            }
            None => None,
        };
        let lr = self.rate_after(self.state.step);
        let t = &self.config.training;
        let rates = StepRates {
            lr,
            grad_clip: t.grad_clip,
            projection_lr: self.config.projection.lr,
        };
        let outcome = catch_out_of_memory(n, || {
            step(
                &mut self.trainable,
                &mut self.teachers,
                &batch,
                &self.setup,
                rates,
                self.state.scaling.as_ref(),
                &self.worker,
                &self.device,
            )
        })
        .with_context(|| format!("step {n}"))?;
        crate::observe::profile::end_step();
        if let Some(cap) = self.memory_cap {
            crate::train::memory::check_pools(cap, B::reserved_bytes(&self.device), n)?;
        }
        self.state.step = n;
        self.state.loader = batch.state_after;
        self.state.tokens += outcome.tokens;
        self.state.scaling = outcome.scaling;
        self.state.seconds = self.clock.1 + self.clock.0.elapsed().as_secs_f64();
        let seconds = started.elapsed().as_secs_f64();
        let on_policy = generation.map(|g| {
            let (rows, tokens) = outcome.written;
            OnPolicyMetrics {
                share: batch.on_policy_rows as f64 / batch.rows.max(1) as f64,
                generated: tokens as f64 / rows.max(1) as f64,
                tokens_per_s: g.tokens as f64 / g.seconds.max(1e-9),
                seconds: g.seconds,
            }
        });
        let v = outcome.values;
        Ok(StepMetrics {
            step: n,
            lr,
            loss: v.loss,
            ce: v.ce,
            kd: v.kd,
            teachers: v.teachers,
            grad_norm: outcome.grad_norm,
            tokens: self.state.tokens,
            tokens_per_s: outcome.tokens as f64 / seconds.max(1e-9),
            seconds: self.state.seconds,
            memory_bytes: B::reserved_bytes(&self.device)
                .or_else(crate::machine::peak_resident)
                .unwrap_or(0),
            on_policy,
        })
    }

    /// Records a step's metrics: the progress bar or a log line, and `metrics.csv`.
    pub fn log(&mut self, row: StepMetrics) -> Result<()> {
        let every = self.config.training.log_every;
        let due = row.step.is_multiple_of(every) || row.step == self.last;
        let names: Vec<&str> = self
            .teachers
            .iter()
            .map(|t| t.settings.name.as_str())
            .collect();
        let served: String = self
            .teachers
            .iter()
            .filter_map(|t| {
                let (tokens, bytes, seconds, _) = t.served.as_ref()?.stats.read();
                Some(format!(
                    " · {} served {:.0} tok/s ({:.0} B/token)",
                    t.settings.name,
                    tokens as f64 / seconds.max(1e-9),
                    bytes as f64 / tokens.max(1) as f64
                ))
            })
            .collect();
        let steps = self.config.training.steps;
        self.progress.show(&row, &names, steps, due, &served);
        if let Some(metrics) = self.metrics.as_mut() {
            metrics.push(row)?;
        }
        Ok(())
    }

    /// Whether this worker writes a checkpoint after the current step: every
    /// `checkpoint.every` steps and at the last one, on the lead worker.
    pub fn checkpoint_due(&self) -> bool {
        let step = self.state.step;
        self.worker.leads()
            && (step.is_multiple_of(self.config.checkpoint.every) || step == self.last)
    }

    /// Writes a checkpoint of the current step (keeping the newest `checkpoint.keep`) and
    /// redraws `loss.svg`.
    pub fn checkpoint(&mut self) -> Result<PathBuf> {
        let out = &self.config.output_dir;
        let (config, student) = (&self.config, &self.trainable.student);
        let hf = |dir: &Path| match config.checkpoint.hf {
            true => write_student(config, &student.valid(), &dir.join("hf")),
            false => Ok(()),
        };
        let dir = checkpoint::save(
            &out.join("checkpoints"),
            &self.state,
            &self.trainable,
            &self.teachers,
            self.config.checkpoint.keep,
            hf,
        )?;
        if let Some(text) = self.pending_run_toml.take() {
            write_atomically(&out.join("run.toml"), &text)?;
        }
        if let Some(metrics) = &self.metrics {
            let title = format!("xtoken train · {}", out.display());
            let eval = self
                .held_out
                .as_ref()
                .map_or(&[][..], |(_, log)| log.rows());
            metrics.write_svg(&out.join("loss.svg"), &title, eval)?;
        }
        self.progress
            .bar
            .suspend(|| tracing::info!("checkpoint {}", dir.display()));
        Ok(dir)
    }

    /// Ends the run; when it reached `training.steps`, the lead worker saves the student into
    /// `output_dir/student` as a Hugging Face directory with its tokenizer.
    pub fn export(self) -> Result<RunSummary> {
        self.progress.bar.finish_and_clear();
        let state = &self.state;
        let complete = state.step == self.config.training.steps;
        if self.worker.leads() && complete {
            let out = self.config.output_dir.join("student");
            let dir = export_trained(&self.config, &self.trainable.student, &out)?;
            tracing::info!(
                "done: {} steps, {} tokens in {:.1} s; student saved to {}",
                state.step,
                state.tokens,
                state.seconds,
                dir.display()
            );
        }
        Ok(RunSummary {
            steps: state.step,
            tokens: state.tokens,
            seconds: state.seconds,
            fingerprint: match self.worker.count {
                1 => 0,
                _ => fingerprint(&self.trainable.student),
            },
        })
    }
}

/// Runs the whole training `config` describes on `device`: open or restore, step, log and
/// checkpoint until the last step, export.
pub fn train<B: TrainBackend>(
    config: RunConfig,
    options: &RunOptions,
    device: B::Device,
    worker: Worker,
) -> Result<RunSummary> {
    let mut run = Run::<B>::open(config, options, device, worker)?;
    while !run.done() {
        let row = run.step()?;
        run.log(row)?;
        if run.eval_due() {
            run.evaluate()?;
        }
        if run.checkpoint_due() {
            run.checkpoint()?;
        }
    }
    run.export()
}

/// Runs one step's work; a device allocation failure, which burn's GPU backends raise as a
/// panic, becomes [`Error::Memory`] naming the step and the settings to lower (any other panic
/// goes on unwinding).
fn catch_out_of_memory<T>(step: u64, work: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(payload) => {
            let message = xtoken_kernels::device::panic_text(&*payload).unwrap_or_default();
            if !crate::train::memory::is_out_of_memory(message) {
                std::panic::resume_unwind(payload);
            }
            let first = message.lines().next().unwrap_or_default();
            Err(Error::Memory(format!(
                "out of device memory at step {step} ({first}); lower training.micro_batch or \
                 training.context_length (see `xtoken train --check`)"
            )))
        }
    }
}

/// Records a fresh run's configuration in its directory, refusing one that holds checkpoints;
/// a resumed run's directory is checked by [`preflight::resume_point`].
fn open_directory(config: &RunConfig, options: &RunOptions, lead: bool) -> Result<()> {
    if options.resume {
        return Ok(());
    }
    // A directory holding checkpoints was refused by `preflight::check_outputs`.
    let out = &config.output_dir;
    if lead {
        write_atomically(&out.join("run.toml"), &resolved_text(config)?)?;
    }
    Ok(())
}

/// Creates the run directory (a resumed run's must hold its `run.toml`) and takes its lock.
fn lock_directory(out: &Path) -> Result<RunLock> {
    std::fs::create_dir_all(out).with_context(|| format!("{}", out.display()))?;
    RunLock::acquire(out)
}

/// Whether the configuration file is the run directory's `run.toml` itself (never rewritten).
fn same_file(options: &RunOptions, config: &RunConfig) -> bool {
    let run_toml = config.output_dir.join("run.toml");
    options
        .config_file
        .as_ref()
        .is_some_and(|file| crate::paths::same(file, &run_toml))
}

/// A resumed run's changed configuration: with extended steps, where the schedule goes on
/// (`decay` anchors a new decay at the rate reached under the run's old steps). Returns the
/// run.toml to write with the next checkpoint.
fn extend(
    config: &RunConfig,
    started: &RunConfig,
    state: &mut CheckpointState,
    extended: bool,
    how: Option<Extension>,
) -> Result<String> {
    if extended {
        // `training.steps` past the checkpoint's step: checked by `preflight::resume_point`.
        let t = &config.training;
        if how == Some(Extension::Decay) {
            let s = &started.training;
            let rate = |k| anchored_rate(k, s.steps, (s.lr, s.warmup, s.min_lr), state.decay_from);
            // A finished run reached min_lr, 0 by default: the new decay starts from the last
            // rate that trained, so that the new steps do not train at 0.
            let lr = match rate(state.step) {
                r if r > 0.0 => r,
                _ => {
                    let last = (0..state.step).rev().map(rate).find(|&r| r > 0.0);
                    let lr = last.unwrap_or(s.lr);
                    tracing::info!(
                        "the run had decayed to a rate of 0; the new steps decay from {lr:.3e}, \
                         the last rate it trained with"
                    );
                    lr
                }
            };
            state.decay_from = Some(DecayAnchor {
                step: state.step,
                lr,
            });
        }
        tracing::info!(
            "training.steps extended to {} ({}), from step {}",
            t.steps,
            match how {
                Some(Extension::Decay) => "the rate decays from where it stands",
                _ => "the schedule stretched over the new total",
            },
            state.step
        );
    }
    resolved_text(config)
}

/// The held-out rows and `eval.csv`, with `[eval]`.
fn held_out(
    config: &RunConfig,
    inputs: &RunInputs,
    teachers: &[String],
    step: u64,
) -> Result<Option<(HeldOut, EvalLog)>> {
    let Some(rows) = HeldOut::build(config, inputs)? else {
        return Ok(None);
    };
    tracing::info!(
        "held-out: {} rows, {} student tokens, every {} steps",
        rows.batches.iter().map(|b| b.rows).sum::<usize>(),
        rows.tokens,
        config.eval.as_ref().map_or(0, |e| e.every)
    );
    let log = EvalLog::open(&config.output_dir.join("eval.csv"), teachers, step)?;
    Ok(Some((rows, log)))
}

/// Writes `text` to `path` through a temporary file renamed into place.
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let partial = xtoken_core::temporary::Temporary::beside(path, "partial");
    std::fs::write(partial.path(), text)
        .and_then(|()| partial.persist(path))
        .with_context(|| format!("{}", path.display()))
}

/// The student in its configured dtype, with fresh optimizers for it and each learnable W.
fn load_student<B: TrainBackend>(
    config: &RunConfig,
    teachers: &[Teacher<B>],
    device: &B::Device,
    lead: bool,
) -> Result<Trainable<B>> {
    let dtype = dtype_of::<B>(config.student_dtype()?, device);
    let compute = dtype_of::<B>(config.compute_dtype()?, device);
    let student = Transformer::<B>::load_with(&config.student.model, LoadOptions { dtype }, device)
        .context("student")?
        .with_compute_dtype(compute);
    if lead {
        tracing::info!(
            "student: {} ({} parameters, {dtype:?}, computing in {compute:?})",
            config.student.model.display(),
            student.architecture.num_parameters()
        );
    }
    let learnable: Vec<bool> = teachers
        .iter()
        .map(|t| t.projection.is_some() && config.projection.learnable)
        .collect();
    Ok(Trainable::new(student, &config.training, &learnable))
}

/// Where the run starts: step 0, or with `resume` the newest complete checkpoint, loaded into
/// the student, the optimizers and each W.
fn restore<B: TrainBackend>(
    config: &RunConfig,
    (resume, point): (bool, &preflight::ResumePoint),
    trainable: &mut Trainable<B>,
    teachers: &mut [Teacher<B>],
    device: &B::Device,
    lead: bool,
) -> Result<CheckpointState> {
    let fresh = CheckpointState {
        step: 0,
        loader: LoaderState::default(),
        tokens: 0,
        seconds: 0.0,
        teachers: teachers.iter().map(|t| t.settings.name.clone()).collect(),
        decay_from: None,
        data: Vec::new(),
        scaling: None,
    };
    let Some((dir, saved)) = point.checkpoint.clone() else {
        if lead && resume {
            tracing::info!(
                "no checkpoint in {}: starting from step 0",
                config.output_dir.join("checkpoints").display()
            );
        }
        return Ok(fresh);
    };
    checkpoint::restore(&dir, trainable, teachers, device)?;
    if lead {
        tracing::info!("resuming from {} (step {})", dir.display(), saved.step);
    }
    Ok(saved)
}

/// The background loader, positioned at `state`, taking this worker's rows of each batch (the
/// batch shape already checked by `RunConfig::grad_accum`); its documents come from the cache,
/// or else from a stream standing where `state` says.
fn start_loader(
    config: &RunConfig,
    inputs: &RunInputs,
    stores: Vec<Option<(HostTargets, usize)>>,
    (worker, length_multiple): (&Worker, usize),
    (state, step): (LoaderState, u64),
    lenient: bool,
) -> Result<Loader> {
    let t = &config.training;
    let feed = match &inputs.cache {
        Some(cache) => Feed::Cache(cache.clone()),
        None => {
            let d = &config.data;
            let open = match lenient {
                true => DocumentStream::open_after_change,
                false => DocumentStream::open,
            };
            let stream = open(
                inputs.sources.clone(),
                config.seed,
                crate::data::prompts::fields(config),
                state.stream.as_ref(),
            )?;
            let threads = config.data_threads();
            Feed::Stream(AlignedStream::start(
                inputs.pipeline.clone(),
                stream,
                threads,
                d.prefetch,
            )?)
        }
    };
    let teachers = inputs.settings.len();
    let plan = StepPlan {
        done: step,
        on_policy: OnPolicyDraw::of(config),
    };
    let packer = Packer::new(feed, teachers, config.seed, t.context_length, state)?
        .one_document_per_row(config.document_rows()?);
    let shape = BatchShape {
        global: t.batch_size,
        micro: t.micro_batch,
        workers: worker.count,
        rank: worker.rank,
        length_multiple,
    };
    Loader::start(
        packer,
        shape,
        config.merge_variant()?,
        config.data.prefetch,
        plan,
        stored_entries(config, stores)?,
    )
}

/// The loader of a run of `config` from its start on a single worker, with each stored or
/// served teacher's entries (`stores[m]`, with its vocabulary size) merged into the
/// micro-batches: what `xtoken bench train --stored` times on its own.
pub fn open_loader(
    config: &RunConfig,
    inputs: &RunInputs,
    stores: Vec<Option<(HostTargets, usize)>>,
) -> Result<Loader> {
    let worker = Worker::alone();
    let state = (LoaderState::default(), 0);
    start_loader(config, inputs, stores, (&worker, 1), state, false)
}

/// The loader's work for the teachers it merges: each micro-batch's entries from their store,
/// or from their server (every row of the step asked at once).
fn stored_entries(
    config: &RunConfig,
    stores: Vec<Option<(HostTargets, usize)>>,
) -> Result<Option<Finish>> {
    if stores.iter().all(Option::is_none) {
        return Ok(None);
    }
    let k = config.loss_params().top_k;
    let confidence = matches!(config.weighting()?, Weighting::Adaptive(_));
    Ok(Some(Box::new(move |micro: &mut [MicroBatch]| {
        for (m, store) in stores.iter().enumerate() {
            let Some((store, vocab)) = store else {
                continue;
            };
            let k = match k {
                TopK::K(k) => k.min(*vocab),
                TopK::All => *vocab,
            };
            match store {
                HostTargets::Stored(store) => {
                    for batch in micro.iter_mut().map(|b| &mut b.teachers[m]) {
                        let entries = store.entries(
                            &mut batch.plan,
                            &batch.spans,
                            &batch.ids,
                            k,
                            confidence,
                        )?;
                        batch.stored = Some(entries);
                    }
                }
                HostTargets::Served(served) => served_entries(served, micro, m, k, confidence)?,
            }
        }
        Ok(())
    })))
}

/// Teacher `m`'s entries of every micro-batch of a step, from its server: each row's real
/// tokens asked at once, the answers merged per micro-batch.
fn served_entries(
    served: &ServedTeacher,
    micro: &mut [MicroBatch],
    m: usize,
    k: usize,
    confidence: bool,
) -> Result<()> {
    let mut prompts = Vec::new();
    let mut lens = Vec::with_capacity(micro.len());
    for batch in micro.iter().map(|b| &b.teachers[m]) {
        let rows = batch.ids.len() / batch.len.max(1);
        let real: Vec<usize> = (0..rows)
            .map(|b| match &batch.padding {
                Some(pad) => pad[b * batch.len..(b + 1) * batch.len]
                    .iter()
                    .filter(|&&p| !p)
                    .count(),
                None => batch.len,
            })
            .collect();
        for (b, &n) in real.iter().enumerate() {
            let row = &batch.ids[b * batch.len..b * batch.len + n];
            prompts.push(row.iter().map(|&t| t as u32).collect::<Vec<u32>>());
        }
        lens.push(real);
    }
    let mut answers = served.answers(&prompts)?.into_iter();
    for (batch, lens) in micro.iter_mut().map(|b| &mut b.teachers[m]).zip(lens) {
        let mine: Vec<_> = answers.by_ref().take(lens.len()).collect();
        let next = confidence.then(|| batch.plan.teacher.next_token.clone());
        let entries = served::entries(&mut batch.plan, &mine, &lens, k, next.as_deref());
        batch.stored = Some(entries);
    }
    Ok(())
}
