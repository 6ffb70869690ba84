//! `xtoken bench on-policy`: on-policy against off-policy distillation in the world of `xtoken
//! demo`, on the CPU. The same student (the demo's warm-up), the same teacher, the same data
//! order and steps; only λ (`[on_policy] fraction`) differs. The on-policy sequences are the
//! training documents' questions (`prompt_field`), which the student answers by sampling. Every
//! `--every` steps the student answers held-out questions about the same people (sampled, each
//! question with its own seed, the same at every evaluation and for every λ) and the teacher
//! grades the answers: its log-likelihood of the written text, per byte
//! ([`xtoken_train::train::on_policy::grade`]). Results: a Markdown table, an SVG of the
//! curves, JSON.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use xtoken_core::align::AlignParams;
use xtoken_models::{Decoding, Sampling, Transformer};
use xtoken_train::backend::{on_backend, OnBackend, TrainBackend};
use xtoken_train::cluster::parallel::Worker;
use xtoken_train::config::DeviceKind;
use xtoken_train::data::rng::mix;
use xtoken_train::data::{Pipeline, Prompt};
use xtoken_train::observe::metrics::line_chart;
use xtoken_train::output::{claim_work_dir, Inputs, Own};
use xtoken_train::train::on_policy::{grade, Grade};
use xtoken_train::{Run, RunConfig, RunOptions};

use crate::cli::demo::corpus::{Rng, World};
use crate::cli::demo::runs;
use crate::cli::demo::{Regime, ALPHA, LR_DISTILL};

/// Options of `xtoken bench on-policy`.
#[derive(Args)]
pub struct OnPolicyBenchArgs {
    /// The directory `xtoken demo` wrote for one seed (its corpus, tokenizers, teachers and the
    /// student's warm-up).
    #[arg(long, default_value = "xtoken-demo")]
    demo: PathBuf,
    /// The seed that demo directory was made with (it makes the world of the held-out
    /// questions).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The teacher: `digit-splitting` or `numeral-keeping`.
    #[arg(long, value_enum, default_value = "numeral-keeping")]
    regime: Regime,
    /// The teacher's loss (`auto`: the coverage audit's pick).
    #[arg(long, default_value = "auto")]
    loss: String,
    /// The values of λ compared.
    #[arg(long, value_delimiter = ',', default_value = "0,0.5")]
    fractions: Vec<f64>,
    /// Optimizer steps of each student.
    #[arg(long, default_value_t = 120)]
    steps: u64,
    /// Steps between two gradings (and before the first step).
    #[arg(long, default_value_t = 10)]
    every: u64,
    /// Held-out questions the student answers at each grading.
    #[arg(long, default_value_t = 128)]
    prompts: usize,
    /// Tokens the student writes after a question at most (training and grading).
    #[arg(long, default_value_t = 6)]
    max_new_tokens: usize,
    /// Seeds of the batches (data order and on-policy draws): every λ runs with each.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Where the runs and results go (default: `<demo>/on-policy`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One student's gradings: (step, grade).
type Curve = Vec<(u64, Grade)>;

/// One λ's gradings averaged over the seeds: (step, nats per byte, tokens written).
type MeanCurve = Vec<(u64, f64, f64)>;

/// Runs the comparison.
pub fn run(args: OnPolicyBenchArgs) -> Result<()> {
    let demo = Demo::at(&args);
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.demo.join("on-policy"));
    let inputs = Inputs::new()
        .with("the demo's training data", &demo.data)
        .with("the demo's warm-up student", &demo.student)
        .with("the teacher", &demo.teacher);
    inputs.check(&out, &Own::WorkDir)?;
    demo.verify(&args)?;
    claim_work_dir(&inputs, &out, "xtoken bench on-policy")?;
    let data = out.join("train-with-prompts.jsonl");
    write_prompts(&demo.data, &data)?;
    let pipeline = Pipeline::load(
        &demo.student,
        std::slice::from_ref(&demo.teacher),
        AlignParams::default(),
    )?;
    let prompts = held_out_prompts(&args, &pipeline)?;
    let mut results = Vec::new();
    for seed in args.seed..args.seed + args.seeds {
        for &fraction in &args.fractions {
            let name = format!("lambda-{fraction}-seed-{seed}");
            let dir = out.join("runs").join(&name);
            // This benchmark's own run of an earlier call.
            if dir.join("run.toml").exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            eprintln!("\n== λ = {fraction}, batches of seed {seed}");
            let config = RunConfig::parse(&config_text(&args, &demo, &data, &dir, fraction, seed))?;
            let work = Graded {
                config,
                teacher: demo.teacher.clone(),
                pipeline: &pipeline,
                prompts: &prompts,
                every: args.every,
                max_new_tokens: args.max_new_tokens,
            };
            let curve = on_backend(DeviceKind::Cpu, &[], work)?;
            results.push((fraction, seed, curve));
        }
    }
    let table = report(&args, &results);
    println!("{table}");
    std::fs::write(out.join("results.md"), &table)?;
    std::fs::write(out.join("grade.svg"), chart(&results))?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json(&results))?,
    )?;
    eprintln!("results in {}", out.display());
    Ok(())
}

/// What the comparison takes from the demo's directory.
struct Demo {
    /// The students' training documents.
    data: PathBuf,
    /// The warm-up student every λ starts from.
    student: PathBuf,
    /// The regime's trained teacher.
    teacher: PathBuf,
}

impl Demo {
    /// Where the demo's files are.
    fn at(args: &OnPolicyBenchArgs) -> Self {
        let dir = &args.demo;
        Demo {
            data: dir.join("train.jsonl"),
            student: dir.join("runs/warm-up/student"),
            teacher: dir
                .join("runs")
                .join(args.regime.name())
                .join("teacher/student"),
        }
    }

    /// Checks that the demo directory holds what the benchmark reads, made with `args.seed`.
    fn verify(&self, args: &OnPolicyBenchArgs) -> Result<()> {
        let dir = &args.demo;
        for path in [&self.data, &self.student, &self.teacher] {
            if !path.exists() {
                bail!(
                    "{}: missing; run `xtoken demo --out {}` first (with this teacher's regime)",
                    path.display(),
                    dir.display()
                );
            }
        }
        // The teachers' first document is the world's first draw after the world itself.
        let first = std::fs::read_to_string(dir.join("teacher-train.jsonl"))
            .with_context(|| format!("{}", dir.join("teacher-train.jsonl").display()))?;
        let first: serde_json::Value = serde_json::from_str(first.lines().next().unwrap_or("{}"))?;
        let mut rng = Rng::new(args.seed);
        let world = World::new(&mut rng);
        let (q, a) = world.document(&mut rng);
        if first["text"].as_str() != Some(&format!("{q}{a}\n")) {
            bail!(
                "{} was not made with seed {}: pass the seed it was made with (--seed)",
                dir.display(),
                args.seed
            );
        }
        Ok(())
    }
}

/// The demo's training documents with their question as the prompt (`Q: … A:`).
fn write_prompts(data: &Path, out: &Path) -> Result<()> {
    let text = std::fs::read_to_string(data).with_context(|| format!("{}", data.display()))?;
    let mut lines = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let record: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}:{}", data.display(), i + 1))?;
        let text = record["text"]
            .as_str()
            .ok_or_else(|| anyhow!("{}:{}: no text", data.display(), i + 1))?;
        let end = text
            .find(" A:")
            .map(|at| at + 3)
            .ok_or_else(|| anyhow!("{}:{}: no question", data.display(), i + 1))?;
        lines.push(serde_json::json!({"text": text, "prompt": &text[..end]}).to_string());
    }
    std::fs::write(out, lines.join("\n") + "\n")?;
    Ok(())
}

/// Held-out questions about the world's people, as the student's prompts, each with its own
/// sampling seed.
fn held_out_prompts(args: &OnPolicyBenchArgs, pipeline: &Pipeline) -> Result<Vec<Prompt>> {
    let mut rng = Rng::new(args.seed);
    let world = World::new(&mut rng);
    let mut held_out = Rng::new(mix(&[args.seed, 0x4845_4C44]));
    (0..args.prompts)
        .map(|i| {
            let (question, _) = world.problem(&mut held_out);
            Ok(Prompt {
                ids: pipeline.student.encode(&question)?,
                seed: mix(&[args.seed, 0x4752_4144, i as u64]),
            })
        })
        .collect()
}

/// The demo's distillation run (its student's settings) with on-policy sequences at `fraction`.
fn config_text(
    args: &OnPolicyBenchArgs,
    demo: &Demo,
    data: &Path,
    out: &Path,
    fraction: f64,
    seed: u64,
) -> String {
    let run = runs::Run {
        out,
        student: &demo.student,
        teacher: &demo.teacher,
        loss: &args.loss,
        alpha: ALPHA,
        steps: args.steps,
        lr: LR_DISTILL,
        data,
        seed,
        device: "cpu",
        stored: None,
        served: None,
    };
    format!(
        "{}\n[on_policy]\nfraction = {fraction}\nprompt_field = \"prompt\"\nmax_new_tokens = {}\n",
        run.toml(),
        args.max_new_tokens
    )
}

/// A run stepped through, graded every `every` steps.
struct Graded<'a> {
    config: RunConfig,
    teacher: PathBuf,
    pipeline: &'a Pipeline,
    prompts: &'a [Prompt],
    every: u64,
    max_new_tokens: usize,
}

impl OnBackend for Graded<'_> {
    type Output = Curve;

    fn run<B: TrainBackend + xtoken_kernels::memory::DeviceMemory>(
        self,
        mut devices: Vec<B::Device>,
    ) -> xtoken_train::Result<Curve> {
        let device = devices.remove(0);
        let teacher = Transformer::<B::InnerBackend>::load(&self.teacher, &device)?;
        let steps = self.config.training.steps;
        let mut run = Run::<B>::open(self.config, &RunOptions::default(), device, Worker::alone())?;
        let decoding = Decoding {
            max_new_tokens: self.max_new_tokens,
            use_cache: true,
        };
        let sampling = Sampling {
            temperature: 1.0,
            top_p: 1.0,
            vocab: self.pipeline.student.tokenizer_size(),
        };
        let mut curve = Vec::new();
        let mut grade_now = |run: &Run<B>| -> xtoken_train::Result<()> {
            use burn::module::AutodiffModule;
            let student = run.student().valid();
            let g = grade(
                &student,
                &teacher,
                self.pipeline,
                0,
                self.prompts,
                decoding,
                sampling,
            )?;
            let step = run.state().step;
            eprintln!(
                "step {step}: teacher log-likelihood {:.4} nats/byte of {:.1} tokens written",
                g.nats_per_byte, g.tokens
            );
            curve.push((step, g));
            Ok(())
        };
        grade_now(&run)?;
        while !run.done() {
            let row = run.step()?;
            run.log(row)?;
            if run.state().step % self.every == 0 || run.state().step == steps {
                grade_now(&run)?;
            }
        }
        Ok(curve)
    }
}

/// The mean grade of every λ at each step, over the seeds, as a Markdown table, with the gain
/// of each λ over the first's rise from step 0.
fn report(args: &OnPolicyBenchArgs, results: &[(f64, u64, Curve)]) -> String {
    let means = mean_curves(args, results);
    let mut out = format!(
        "Teacher-graded log-likelihood of the student's answers to {} held-out questions (nats per \
         byte, higher is better; up to {} tokens each, temperature 1), {} seed(s) of batches, \
         `{}` teacher, loss `{}`:\n\n| step |",
        args.prompts,
        args.max_new_tokens,
        args.seeds,
        args.regime.name(),
        args.loss
    );
    for &(fraction, _) in &means {
        out += &format!(" λ = {fraction} |");
    }
    out += "\n|---|";
    out += &"---|".repeat(means.len());
    out += "\n";
    let steps: Vec<u64> = means
        .first()
        .map(|(_, c)| c.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    for (i, step) in steps.iter().enumerate() {
        out += &format!("| {step} |");
        for (_, curve) in &means {
            let (_, nats, tokens) = curve[i];
            out += &format!(" {nats:.4} ({tokens:.1} tokens) |");
        }
        out += "\n";
    }
    out += "\nRise from step 0 to the last grading, nats/byte (the mean; each seed's):\n";
    for (fraction, curve) in &means {
        let rise = |points: &[(u64, f64, f64)]| match (points.first(), points.last()) {
            (Some(a), Some(b)) => b.1 - a.1,
            _ => 0.0,
        };
        let seeds: Vec<String> = results
            .iter()
            .filter(|r| r.0 == *fraction)
            .map(|(_, seed, c)| match (c.first(), c.last()) {
                (Some(a), Some(b)) => {
                    format!("{seed}: {:+.4}", b.1.nats_per_byte - a.1.nats_per_byte)
                }
                _ => format!("{seed}: none"),
            })
            .collect();
        out += &format!(
            "\n- λ = {fraction}: {:+.4} ({})",
            rise(curve),
            seeds.join(", ")
        );
    }
    out + "\n"
}

/// Per λ, the (step, mean nats/byte, mean tokens) over the seeds.
fn mean_curves(args: &OnPolicyBenchArgs, results: &[(f64, u64, Curve)]) -> Vec<(f64, MeanCurve)> {
    args.fractions
        .iter()
        .map(|&fraction| {
            let curves: Vec<&Curve> = results
                .iter()
                .filter(|r| r.0 == fraction)
                .map(|r| &r.2)
                .collect();
            let n = curves.len().max(1) as f64;
            let points = curves
                .first()
                .map(|c| {
                    (0..c.len())
                        .map(|i| {
                            let nats: f64 = curves.iter().map(|c| c[i].1.nats_per_byte).sum();
                            let tokens: f64 = curves.iter().map(|c| c[i].1.tokens).sum();
                            (c[i].0, nats / n, tokens / n)
                        })
                        .collect()
                })
                .unwrap_or_default();
            (fraction, points)
        })
        .collect()
}

/// Each run's curve.
fn chart(results: &[(f64, u64, Curve)]) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = results
        .iter()
        .map(|(fraction, seed, curve)| {
            let points = curve
                .iter()
                .map(|(s, g)| (*s as f64, g.nats_per_byte))
                .collect();
            (format!("λ = {fraction}, seed {seed}"), points)
        })
        .collect();
    line_chart(
        "the teacher's log-likelihood of the student's answers (nats/byte)",
        "step",
        &series,
    )
}

fn json(results: &[(f64, u64, Curve)]) -> serde_json::Value {
    let runs: Vec<_> = results
        .iter()
        .map(|(fraction, seed, curve)| {
            let points: Vec<_> = curve
                .iter()
                .map(|(step, g)| {
                    serde_json::json!({
                        "step": step,
                        "nats_per_byte": g.nats_per_byte,
                        "tokens": g.tokens,
                        "bytes": g.bytes,
                    })
                })
                .collect();
            serde_json::json!({"fraction": fraction, "seed": seed, "gradings": points})
        })
        .collect();
    serde_json::json!({ "runs": runs })
}
