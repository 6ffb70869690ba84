//! `xtoken eval`: the paper's benchmarks on a model directory or a training checkpoint, printed
//! as a Markdown table (or JSON) of accuracy and standard error per task and their average.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use xtoken_train::backend::{on_backend, OnBackend, TrainBackend};
use xtoken_train::config::DeviceKind;
use xtoken_train::harness::model::Scorable;
use xtoken_train::harness::task::PromptSettings;
use xtoken_train::harness::{evaluate, tasks};
use xtoken_train::train::export::load_for_eval;

use super::models::DtypeArg;

/// Options of `xtoken eval`.
#[derive(Args, Clone)]
pub struct EvalArgs {
    /// A Hugging Face model directory (with tokenizer.json), or a training checkpoint
    /// (`<output_dir>/checkpoints/step-N`).
    #[arg(long)]
    model: PathBuf,
    /// The run configuration of a checkpoint (default: the run's run.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Tasks, comma-separated: mmlu, gsm8k, math, winogrande, hellaswag.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mmlu,gsm8k,math,winogrande,hellaswag"
    )]
    tasks: Vec<String>,
    /// The datasets: a directory with one subdirectory per task (see the README).
    #[arg(long)]
    data: PathBuf,
    /// Solved examples per prompt (the paper: 3).
    #[arg(long, default_value_t = 3)]
    shots: usize,
    /// The few-shot draws' seed (lm-evaluation-harness's default: 1234).
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Documents per task (per subject for MMLU and MATH) at most.
    #[arg(long)]
    limit: Option<usize>,
    /// Where to run: cpu (burn-flex), flex, ndarray, cuda or wgpu (cargo features `cuda`, `wgpu`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Parameter dtype (bf16 and f16 need a backend that has them: CUDA).
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    dtype: DtypeArg,
    /// Tokens generated per GSM8k / MATH answer at most.
    #[arg(long, default_value_t = 256)]
    max_gen_toks: usize,
    /// Decode without the key/value cache (recompute every position each step; slow).
    #[arg(long)]
    no_kv_cache: bool,
    /// Print JSON instead of the Markdown table.
    #[arg(long)]
    json: bool,
    /// Also write results.md and results.json into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write each document's record into --out, as lm-evaluation-harness's
    /// `--log_samples` does: `samples_<task>.jsonl` per task (per subject for MMLU and MATH).
    #[arg(long, requires = "out")]
    log_samples: bool,
}

pub fn run(args: EvalArgs) -> Result<()> {
    let kind: DeviceKind = args.device.parse()?;
    let tasks = args
        .tasks
        .iter()
        .map(|name| tasks::named(name.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let report = on_backend(
        kind,
        &[],
        Work {
            args: args.clone(),
            tasks,
        },
    )?;
    let markdown = report.markdown();
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("results.md"), &markdown)
            .with_context(|| format!("writing {}", dir.join("results.md").display()))?;
        std::fs::write(dir.join("results.json"), &json)
            .with_context(|| format!("writing {}", dir.join("results.json").display()))?;
    }
    println!("{}", if args.json { json } else { markdown });
    Ok(())
}

struct Work {
    args: EvalArgs,
    tasks: Vec<Box<dyn xtoken_train::harness::task::Task>>,
}

impl OnBackend for Work {
    type Output = xtoken_train::harness::report::Report;

    fn run<B: TrainBackend>(self, devices: Vec<B::Device>) -> xtoken_train::Result<Self::Output> {
        let args = self.args;
        let device = devices.into_iter().next().unwrap_or_default();
        let loaded = load_for_eval::<B::InnerBackend>(
            &args.model,
            args.config.as_deref(),
            args.dtype.dtype(),
            &device,
        )?;
        tracing::info!("evaluating {}", loaded.source);
        let scorable = Scorable {
            model: &loaded.model,
            tokenizer: &loaded.tokenizer,
            special: loaded.special.clone(),
            batch: args.batch,
            max_gen_toks: args.max_gen_toks,
            use_cache: !args.no_kv_cache,
        };
        let settings = PromptSettings {
            shots: args.shots,
            seed: args.seed,
            limit: args.limit,
        };
        let samples = args.out.as_deref().filter(|_| args.log_samples);
        evaluate(&scorable, &self.tasks, &args.data, &settings, samples)
    }
}
