//! Benchmarks scored during training (`[eval] tasks`): the prompts are made once when the run
//! opens, and the student is scored on them every `eval.every` steps and after the last step,
//! by the lead worker. Each result is a row of `benchmarks.csv` (a resumed run keeps the rows
//! up to its step) and a TensorBoard scalar `benchmark/<task>/<metric>`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;
use xtoken_kernels::XTokenBackend;
use xtoken_models::Transformer;

use crate::config::RunConfig;
use crate::error::{Context, Error, Result};
use crate::harness::model::{read_tokenizer, Scorable, SpecialTokens};
use crate::harness::report::TaskReport;
use crate::harness::task::{Item, PromptSettings, Task};
use crate::harness::{prepare, score, tasks};

/// The benchmarks of a run, ready to score its student.
pub struct TrainingBenchmarks {
    tasks: Vec<Box<dyn Task>>,
    items: Vec<Vec<Item>>,
    tokenizer: Tokenizer,
    special: SpecialTokens,
    batch: usize,
    log: BenchmarkLog,
    /// `<output_dir>/samples` with `eval.tasks_log_samples`.
    samples: Option<PathBuf>,
}

/// Each task of a run's benchmarks with its prompts.
pub type Prompted = (Vec<Box<dyn Task>>, Vec<Vec<Item>>);

/// The tasks of `[eval] tasks` and their prompts, made from the tasks' files (`train --check`
/// makes them too, so that a missing or invalid file stops the check); `None` without tasks.
pub fn prompts(config: &RunConfig) -> Result<Option<Prompted>> {
    let Some(eval) = config.eval.as_ref().filter(|e| !e.tasks.is_empty()) else {
        return Ok(None);
    };
    let data = eval.tasks_data.as_deref().ok_or_else(|| {
        Error::Config("eval.tasks_data: the benchmarks' files are needed with eval.tasks".into())
    })?;
    let tasks = eval
        .tasks
        .iter()
        .map(|name| tasks::named(name))
        .collect::<Result<Vec<_>>>()?;
    let settings = PromptSettings {
        shots: eval.tasks_shots,
        seed: 1234,
        limit: eval.tasks_limit,
    };
    let items = prepare(&tasks, data, &settings)
        .with_context(|| format!("eval.tasks (eval.tasks_data = {})", data.display()))?;
    Ok(Some((tasks, items)))
}

impl TrainingBenchmarks {
    /// Reads the tasks' files and makes their prompts; `None` without `eval.tasks`.
    pub fn open(config: &RunConfig, start_step: u64) -> Result<Option<Self>> {
        let Some((tasks, items)) = prompts(config)? else {
            return Ok(None);
        };
        let Some(eval) = config.eval.as_ref() else {
            return Ok(None);
        };
        let tokenizer = read_tokenizer(&config.student_tokenizer())?;
        let special = SpecialTokens::read(&config.student.model, &tokenizer)?;
        let documents: usize = items.iter().map(Vec::len).sum();
        tracing::info!(
            "benchmarks: {} ({documents} documents, {}-shot), every {} steps",
            eval.tasks.join(", "),
            eval.tasks_shots,
            eval.every
        );
        Ok(Some(TrainingBenchmarks {
            tasks,
            items,
            tokenizer,
            special,
            batch: config.training.micro_batch.max(1),
            log: BenchmarkLog::open(&config.output_dir.join("benchmarks.csv"), start_step)?,
            samples: eval
                .tasks_log_samples
                .then(|| config.output_dir.join("samples")),
        }))
    }

    /// Scores `student` after `step` steps and records the results.
    pub fn score<B: XTokenBackend>(
        &mut self,
        step: u64,
        student: &Transformer<B>,
    ) -> Result<Vec<TaskReport>> {
        let scorable = Scorable {
            model: student,
            tokenizer: &self.tokenizer,
            special: self.special.clone(),
            batch: self.batch,
            max_gen_toks: 256,
            use_cache: true,
        };
        let reports = self
            .tasks
            .iter()
            .zip(&self.items)
            .map(|(task, items)| {
                let samples = self
                    .samples
                    .as_ref()
                    .map(|s| s.join(format!("step-{step:08}")));
                score(&scorable, task.as_ref(), items, samples.as_deref())
            })
            .collect::<Result<Vec<_>>>()?;
        self.log.push(step, &reports)?;
        Ok(reports)
    }
}

/// `benchmarks.csv`: `step,task,metric,value,stderr,n`.
struct BenchmarkLog {
    path: PathBuf,
    lines: Vec<(u64, String)>,
}

const HEADER: &str = "step,task,metric,value,stderr,n";

impl BenchmarkLog {
    fn open(path: &Path, start_step: u64) -> Result<Self> {
        let mut lines = Vec::new();
        if start_step > 0 && path.exists() {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
            for (i, line) in text.lines().enumerate().skip(1) {
                let step: u64 = line
                    .split(',')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| {
                        Error::Run(format!("{}:{}: not a benchmark row", path.display(), i + 1))
                    })?;
                if step <= start_step {
                    lines.push((step, line.to_string()));
                }
            }
        }
        let log = BenchmarkLog {
            path: path.to_path_buf(),
            lines,
        };
        log.write()?;
        Ok(log)
    }

    fn push(&mut self, step: u64, reports: &[TaskReport]) -> Result<()> {
        for report in reports {
            for m in &report.metrics {
                // Metric names hold a comma (`exact_match,strict-match`): quoted.
                let line = format!(
                    "{step},{},\"{}\",{},{},{}",
                    report.task, m.name, m.value, m.stderr, m.n
                );
                self.lines.push((step, line));
            }
        }
        self.write()
    }

    fn write(&self) -> Result<()> {
        let mut text = String::from(HEADER);
        text.push('\n');
        for (_, line) in &self.lines {
            let _ = writeln!(text, "{line}");
        }
        std::fs::write(&self.path, text)
            .with_context(|| format!("{}: cannot write", self.path.display()))
    }
}
