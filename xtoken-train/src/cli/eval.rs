//! `xtoken eval`: the paper's benchmarks on a model directory or a training checkpoint, printed
//! as a Markdown table (or JSON) of accuracy and standard error per task and their average.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use xtoken_train::backend::{on_backend, OnBackend, TrainBackend};
use xtoken_train::config::DeviceKind;
use xtoken_train::harness::model::Scorable;
use xtoken_train::harness::report::Report;
use xtoken_train::harness::task::PromptSettings;
use xtoken_train::harness::{evaluate, tasks};
use xtoken_train::output::{json_has, write_dir, Inputs, Names, Own};
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
    /// The datasets: a directory with one subdirectory per task (see the book's Evaluation page).
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

/// What `--out` holds: the results and the samples' records.
fn own() -> Own<'static> {
    Own::Dir {
        what: "an evaluation",
        names: Names::of(["results.md", "results.json"]).pattern("samples_", ".jsonl"),
        signature: "results.json",
        signed: |path| json_has(path, &["tasks", "average"]),
    }
}

pub fn run(args: EvalArgs) -> Result<()> {
    let kind: DeviceKind = args.device.parse()?;
    let tasks = tasks::distinct(&args.tasks)?;
    let evaluate = |samples: Option<PathBuf>| {
        let args = args.clone();
        on_backend(
            kind,
            &[],
            Work {
                args,
                tasks,
                samples,
            },
        )
    };
    let Some(out) = args.out.clone() else {
        return print(&args, &evaluate(None)?);
    };
    let mut inputs = Inputs::new()
        .with("the --model", &args.model)
        .with("the --data directory", &args.data);
    if let Some(config) = &args.config {
        inputs.add("the --config file", config);
    }
    inputs.check(&out, &own())?;
    let report = write_dir(&out, |tmp| {
        let report = evaluate(args.log_samples.then(|| tmp.to_path_buf()))?;
        let (markdown, json) = (report.markdown(), serde_json::to_string_pretty(&report)?);
        std::fs::write(tmp.join("results.md"), markdown)?;
        std::fs::write(tmp.join("results.json"), json)?;
        Ok(report)
    })?;
    print(&args, &report)
}

fn print(args: &EvalArgs, report: &Report) -> Result<()> {
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(report)?),
        false => println!("{}", report.markdown()),
    }
    Ok(())
}

struct Work {
    args: EvalArgs,
    tasks: Vec<Box<dyn xtoken_train::harness::task::Task>>,
    /// Where the samples' records go (a temporary directory moved to `--out` at the end).
    samples: Option<PathBuf>,
}

impl OnBackend for Work {
    type Output = Report;

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
        evaluate(
            &scorable,
            &self.tasks,
            &args.data,
            &settings,
            self.samples.as_deref(),
        )
    }
}
