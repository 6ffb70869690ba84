//! The paper's benchmarks scored the way lm-evaluation-harness scores them, from local copies of
//! the datasets, on any backend: 3-shot MMLU, GSM8k, MATH, WinoGrande and HellaSwag.
//!
//! - [`docs`]: the datasets' parquet / JSON Lines files, by split and subset;
//! - [`task`]: the [`Task`] trait (prompt, request, score) and the few-shot prompts,
//!   with examples drawn as the harness draws them ([`pyrandom`]: Python's `random`);
//! - [`tasks`]: the five tasks, one file each;
//! - [`model`]: log-likelihoods of continuations and greedy generation (KV cache), tokenized and
//!   batched as the harness does;
//! - [`report`]: accuracy and its standard error per task, the average, as Markdown and JSON;
//! - [`samples`]: the record of every scored document, in the harness's `--log_samples` layout.
//!   [`pyjson`] writes its lines as Python's `json.dumps` does.
//!
//! It stands on the ground (its task names are `config::TaskName`) and on `data`'s readers; the
//! training stage scores its student with it (`train::benchmarks`) and loads a checkpoint for it
//! (`train::export::load_for_eval`).

pub mod docs;
pub mod model;
pub mod pyjson;
pub mod pyrandom;
pub mod report;
pub mod samples;
pub mod task;
pub mod tasks;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use xtoken_kernels::XTokenBackend;

use crate::error::{Error, Result};
use model::Scorable;
use report::{Report, TaskReport};
use task::{prompts, PromptSettings, Request, Response, Task};

/// The directory of `task`'s files under `data`: `data/<name>` (MATH also `hendrycks_math`).
pub fn task_dir(data: &Path, task: &dyn Task) -> Result<PathBuf> {
    if !data.is_dir() {
        let what = match data.exists() {
            true => "a file, not the datasets' directory",
            false => "no such directory",
        };
        return Err(Error::Data(format!(
            "{}: {what} (the datasets' directory holds one subdirectory per task; see the book's \
             Evaluation page on fetching the datasets)",
            data.display()
        )));
    }
    let names: &[&str] = match task.name() {
        "math" => &["math", "hendrycks_math", "competition_math"],
        name => &[name][..],
    };
    let names: Vec<&str> = names.to_vec();
    names
        .iter()
        .map(|n| data.join(n))
        .find(|d| d.is_dir())
        .ok_or_else(|| {
            Error::Data(format!(
                "{}: no `{}` directory for {} (see the book's Evaluation page on fetching the \
                 datasets)",
                data.display(),
                names[0],
                task.name()
            ))
        })
}

/// Scores `model` on each task under `data` and reports the results; with `samples`, each
/// document's record is written there too ([`samples`]).
pub fn evaluate<B: XTokenBackend>(
    model: &Scorable<'_, B>,
    tasks: &[Box<dyn Task>],
    data: &Path,
    settings: &PromptSettings,
    samples: Option<&Path>,
) -> Result<Report> {
    let prepared = prepare(tasks, data, settings)?;
    let reports = tasks
        .iter()
        .zip(&prepared)
        .map(|(task, items)| score(model, task.as_ref(), items, samples))
        .collect::<Result<Vec<_>>>()?;
    Ok(Report::new(reports, settings))
}

/// Each task's requests, in task order, made once (a run scoring its student every N steps
/// reuses them).
pub fn prepare(
    tasks: &[Box<dyn Task>],
    data: &Path,
    settings: &PromptSettings,
) -> Result<Vec<Vec<task::Item>>> {
    tasks
        .iter()
        .map(|task| {
            let items = prompts(task.as_ref(), &task_dir(data, task.as_ref())?, settings)?;
            if items.is_empty() {
                return Err(Error::Data(format!(
                    "{}: no documents to score",
                    task.name()
                )));
            }
            Ok(items)
        })
        .collect()
}

/// Scores `model` on one task's prepared requests; with `samples`, writes each document's
/// record there ([`samples`]).
pub fn score<B: XTokenBackend>(
    model: &Scorable<'_, B>,
    task: &dyn Task,
    items: &[task::Item],
    samples: Option<&Path>,
) -> Result<TaskReport> {
    let started = Instant::now();
    let requests: Vec<&Request> = items.iter().map(|i| &i.request).collect();
    let responses = answer(model, task.name(), &requests)?;
    let mut scores = Vec::with_capacity(items.len());
    for (item, response) in items.iter().zip(&responses) {
        scores.push(task.score(&item.doc, response)?);
    }
    if let Some(dir) = samples {
        let files = samples::records(task, items, &responses, &scores, model.max_gen_toks)?;
        samples::write(dir, &files)?;
    }
    let scores: Vec<(String, Vec<f64>)> = items
        .iter()
        .map(|item| item.subset.clone())
        .zip(scores)
        .collect();
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        "{}: {} documents in {seconds:.1} s ({:.2} documents/s)",
        task.name(),
        items.len(),
        items.len() as f64 / seconds.max(1e-9)
    );
    Ok(TaskReport::aggregate(task, &scores, seconds))
}

/// Every request's response: the log-likelihood requests in one batched pass, then the
/// generations, with one progress bar over both.
pub fn answer<B: XTokenBackend>(
    model: &Scorable<'_, B>,
    name: &str,
    requests: &[&Request],
) -> Result<Vec<Response>> {
    let mut pairs = Vec::new();
    let mut generations = Vec::new();
    for request in requests {
        match request {
            Request::Choice { pairs: p } => pairs.extend(p.iter().cloned()),
            Request::Generate { context, until } => {
                generations.push((context.clone(), until.clone()))
            }
        }
    }
    let progress = Progress::new(name, (pairs.len() + generations.len()) as u64);
    let lls = model.loglikelihoods(&pairs, |n| progress.advance(n))?;
    let texts = model.generate(&generations, |n| progress.advance(n))?;
    progress.finish();
    let (mut lls, mut texts) = (lls.into_iter(), texts.into_iter());
    Ok(requests
        .iter()
        .map(|request| match request {
            Request::Choice { pairs } => Response::Choice(lls.by_ref().take(pairs.len()).collect()),
            Request::Generate { .. } => Response::Text(texts.next().unwrap_or_default()),
        })
        .collect())
}

/// A progress bar with ETA on a terminal; otherwise a log line every 30 s.
struct Progress {
    bar: ProgressBar,
    name: String,
    total: u64,
    last_log: std::cell::Cell<Instant>,
}

impl Progress {
    fn new(name: &str, total: u64) -> Self {
        let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            ProgressBar::new(total).with_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} requests, ETA {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            )
        } else {
            ProgressBar::hidden()
        };
        bar.set_prefix(name.to_string());
        Progress {
            bar,
            name: name.to_string(),
            total,
            last_log: std::cell::Cell::new(Instant::now()),
        }
    }

    fn advance(&self, n: usize) {
        self.bar.inc(n as u64);
        if self.bar.is_hidden() && self.last_log.get().elapsed() >= Duration::from_secs(30) {
            self.last_log.set(Instant::now());
            let eta = self.bar.eta().as_secs();
            tracing::info!(
                "{}: {}/{} requests, ETA {eta} s",
                self.name,
                self.bar.position(),
                self.total
            );
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
