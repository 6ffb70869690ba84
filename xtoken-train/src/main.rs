//! `xtoken`: the command-line tool of the X-Token cross-tokenizer distillation framework.

mod align;
mod alloc;
mod bench;
mod bench_forward;
mod bench_kernels;
mod bench_loss;
mod bench_train;
mod config;
mod data;
mod ddp;
mod demo;
mod metrics;
mod models;
mod rng;
mod train;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use xtoken_core::audit::{self, AuditOptions, Category};
use xtoken_core::canon::SpecialRole;
use xtoken_core::matching::{ExactMatcher, Partners};
use xtoken_core::projection::{EmptyReason, ProjectionParams, RowSource, SparseProjection};
use xtoken_core::vocab::{TokenKind, Vocabulary};

#[derive(Parser)]
#[command(
    name = "xtoken",
    version,
    about = "Cross-tokenizer knowledge distillation (X-Token) on burn"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The paper's main result in miniature on a CPU: synthetic arithmetic, tokenizers trained
    /// here (digit-splitting teacher, 1–3-digit student), a tiny teacher, and students distilled
    /// with CE only, GOLD, ULD, P-KL and H-KL; prints the table and writes a plot.
    Demo(demo::DemoArgs),
    /// Distill a student from one or more teachers: `xtoken train --config run.toml`.
    Train(train::TrainArgs),
    /// Build or inspect the projection matrix W between a student and a teacher tokenizer.
    #[command(subcommand)]
    Projection(ProjectionCommand),
    /// Coverage audit of a tokenizer pair: per category, how many student tokens land in GOLD's
    /// common set C and H-KL's relaxed set; recommends P-KL or H-KL.
    Audit(AuditArgs),
    /// Align student and teacher tokenizations of texts (DP span alignment): print the chunks of
    /// one text, or write the alignment cache of a JSONL file.
    Align(align::AlignArgs),
    /// Inspect an alignment cache written by `xtoken align --out`.
    #[command(subcommand)]
    Cache(align::CacheCommand),
    /// Logits of a Hugging Face model directory (Llama, Qwen3, Phi-3) for ids in a safetensors
    /// file (`input_ids`, optional `attention_mask`), written as `logits` f32 [batch, len, vocab].
    Logits(models::LogitsArgs),
    /// Re-save a Hugging Face model directory in f32, bf16 or f16.
    Convert(models::ConvertArgs),
    /// Benchmarks that print Markdown tables for BENCHMARKS.md.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum ProjectionCommand {
    /// Build W per the paper's rule-based algorithm and store it as safetensors.
    Build(BuildArgs),
    /// Print one student token's row of W as teacher tokens with weights.
    Show(ShowArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Wall time of `projection build` (tokenizer loading included), per stage.
    Projection(bench::ProjectionBenchArgs),
    /// Alignment speed per kind of text: the DP alone, and `xtoken align` end to end.
    Align(bench::AlignBenchArgs),
    /// Forward + backward time and peak memory of P-KL and H-KL on CPU (ndarray): the fused,
    /// row-chunked losses against a naive composition of burn tensor ops.
    Loss(bench_loss::LossBenchArgs),
    /// Forward and forward+backward tokens/s and peak memory of a random Llama-shaped model on
    /// CPU (ndarray), with and without activation checkpointing.
    Forward(bench_forward::ForwardBenchArgs),
    /// One teacher's P-KL forward + backward through the cubecl kernels on a GPU (`--device
    /// cuda|wgpu`, in a build with that feature), against the HBM floor.
    Kernels(bench_kernels::KernelBenchArgs),
    /// `xtoken train`'s whole step (loader, teacher top-K, student forward + backward, losses,
    /// AdamW) on random models with real tokenizer vocabularies: s/step, tokens/s, peak memory.
    Train(bench_train::TrainBenchArgs),
}

/// A student and a teacher tokenizer, each a directory with tokenizer.json or the file itself.
#[derive(Args, Clone)]
pub struct PairArgs {
    /// Student tokenizer: a directory holding tokenizer.json, or the file.
    #[arg(long)]
    student: PathBuf,
    /// Teacher tokenizer: a directory holding tokenizer.json, or the file.
    #[arg(long)]
    teacher: PathBuf,
    /// Rows of the student's embedding table if padded past the tokenizer.
    #[arg(long)]
    student_vocab_size: Option<usize>,
    /// Rows of the teacher's embedding table if padded past the tokenizer (Qwen3: 151936).
    #[arg(long)]
    teacher_vocab_size: Option<usize>,
}

impl PairArgs {
    fn load(&self) -> Result<(Vocabulary, Vocabulary)> {
        Ok(Vocabulary::load_pair(
            (&self.student, self.student_vocab_size),
            (&self.teacher, self.teacher_vocab_size),
        )?)
    }
}

/// Parameters of the rule-based construction (defaults: the paper's).
#[derive(Args, Clone)]
pub struct ParamArgs {
    /// Entries kept per row of W (K).
    #[arg(long, default_value_t = 4)]
    top_k: usize,
    /// Longest teacher re-encoding the multi-token pass accepts (L).
    #[arg(long, default_value_t = 4)]
    max_span: usize,
    /// Weight of the first sub-token (β).
    #[arg(long, default_value_t = 0.9)]
    beta: f64,
    /// Decay per further sub-token (γ).
    #[arg(long, default_value_t = 0.1)]
    gamma: f64,
}

impl ParamArgs {
    fn params(&self) -> ProjectionParams {
        ProjectionParams {
            top_k: self.top_k,
            max_span: self.max_span,
            beta: self.beta,
            gamma: self.gamma,
        }
    }
}

#[derive(Args)]
struct BuildArgs {
    #[command(flatten)]
    pair: PairArgs,
    #[command(flatten)]
    params: ParamArgs,
    /// Where to write W (safetensors).
    #[arg(long)]
    out: PathBuf,
    /// How many empty rows to list as examples.
    #[arg(long, default_value_t = 8)]
    examples: usize,
}

#[derive(Args)]
struct ShowArgs {
    /// The stored W.
    projection: PathBuf,
    #[command(flatten)]
    pair: PairArgs,
    /// The student token: its text (" the", "201"), its tokenizer.json surface ("Ġthe"), or #ID.
    #[arg(long)]
    token: String,
}

#[derive(Args)]
struct AuditArgs {
    #[command(flatten)]
    pair: PairArgs,
    #[command(flatten)]
    params: ParamArgs,
    /// Use this stored W (verified against the tokenizers) instead of building one.
    #[arg(long)]
    projection: Option<PathBuf>,
    /// Print JSON instead of a Markdown table.
    #[arg(long)]
    json: bool,
    /// Critical categories, comma-separated: P-KL is recommended when one falls mostly outside C.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "digits_1,digits_2,digits_3"
    )]
    critical: Vec<String>,
    /// Fraction of a critical category that must be in C for H-KL.
    #[arg(long, default_value_t = 0.5)]
    min_coverage: f64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Train(args) => train::start(args),
        Command::Projection(ProjectionCommand::Build(args)) => build(args),
        Command::Projection(ProjectionCommand::Show(args)) => show(args),
        Command::Audit(args) => run_audit(args),
        Command::Align(args) => align::run(args),
        Command::Cache(command) => align::cache(command),
        Command::Bench(BenchCommand::Projection(args)) => bench::projection(args),
        Command::Bench(BenchCommand::Align(args)) => bench::align(args),
        Command::Bench(BenchCommand::Loss(args)) => bench_loss::run(args),
        Command::Bench(BenchCommand::Forward(args)) => bench_forward::run(args),
        Command::Bench(BenchCommand::Kernels(args)) => bench_kernels::run(args),
        Command::Bench(BenchCommand::Train(args)) => bench_train::run(args),
        Command::Logits(args) => models::logits(args),
        Command::Convert(args) => models::convert(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`xtoken … | head`): nothing left to say.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn build(args: BuildArgs) -> Result<()> {
    let params = args.params.params();
    params.validate()?;
    let start = Instant::now();
    let (student, teacher) = args.pair.load()?;
    let loaded = start.elapsed();
    let (w, report) = SparseProjection::build(&student, &teacher, params)?;
    let built = start.elapsed() - loaded;
    w.save(&args.out)?;
    let total = start.elapsed();

    println!(
        "W: {} × {} (student {} → teacher {}), top-{} rows, L = {}, β = {}, γ = {}",
        w.student_vocab_size(),
        w.teacher_vocab_size(),
        student.path().display(),
        teacher.path().display(),
        params.top_k,
        params.max_span,
        params.beta,
        params.gamma
    );
    let rows = [
        ("exact (canonical match)", RowSource::Exact),
        ("special (paired by role)", RowSource::Special),
        ("multi-token (re-encoded)", RowSource::MultiToken),
        ("empty", RowSource::Empty),
        ("padding", RowSource::Padding),
    ];
    for (label, source) in rows {
        let n = report.count(source);
        if n > 0 || source != RowSource::Padding {
            println!(
                "  {label:<26} {n:>8}  {:>5.1}%",
                100.0 * n as f64 / w.student_vocab_size() as f64
            );
        }
    }
    if !report.empty.is_empty() {
        let mut reasons: Vec<(String, usize)> = Vec::new();
        for (_, reason) in &report.empty {
            let key = reason_summary(reason);
            match reasons.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 += 1,
                None => reasons.push((key, 1)),
            }
        }
        println!("  empty rows by reason:");
        for (reason, n) in reasons {
            println!("    {n:>8}  {reason}");
        }
        println!("  examples of empty rows:");
        for (s, reason) in report.empty.iter().take(args.examples) {
            let token = student.token(*s).context("student id out of range")?;
            println!(
                "    #{s:<7} {:<32} {}",
                token.display(),
                reason_detail(reason)
            );
        }
    }
    println!(
        "wrote {} in {:.2} s (tokenizers loaded in {:.2} s, W built in {:.2} s)",
        args.out.display(),
        total.as_secs_f64(),
        loaded.as_secs_f64(),
        built.as_secs_f64()
    );
    Ok(())
}

fn reason_summary(reason: &EmptyReason) -> String {
    match reason {
        EmptyReason::UnpairedSpecial => "special token without a counterpart".into(),
        EmptyReason::TooLong { .. } => "teacher re-encoding longer than L".into(),
        EmptyReason::NoByteToken { .. } => "byte without a teacher byte token".into(),
        EmptyReason::EncodedToNothing => "teacher encodes the text to nothing".into(),
    }
}

fn reason_detail(reason: &EmptyReason) -> String {
    match reason {
        EmptyReason::TooLong { length } => format!("teacher re-encoding has {length} tokens"),
        EmptyReason::NoByteToken { byte } => format!("teacher has no token for byte {byte:#04x}"),
        other => reason_summary(other),
    }
}

fn show(args: ShowArgs) -> Result<()> {
    let (student, teacher) = args.pair.load()?;
    let w = SparseProjection::load_verified(&args.projection, &student, &teacher)?;
    let s = student.find(&args.token)?;
    let token = student.token(s).context("student id out of range")?;
    let source = match ExactMatcher::new(&student, &teacher).partners(token) {
        Partners::Text(_) => "exact canonical match",
        Partners::Special(_) => "special token paired by role",
        Partners::None if w.top1(s).is_some() => "multi-token rule",
        Partners::None => "empty row",
    };
    let role = token
        .role
        .map(|r: SpecialRole| format!(", role {}", r.name()))
        .unwrap_or_default();
    println!(
        "student #{s} {} ({}{role}): {source}",
        token.display(),
        Category::of(token.kind, &token.bytes).name()
    );
    for (t, weight) in w.row(s) {
        let teacher_token = teacher.token(t).context("teacher id out of range")?;
        println!(
            "  teacher #{t:<7} {:<24} {weight:.4}",
            teacher_token.display()
        );
    }
    if w.top1(s).is_none() && token.kind != TokenKind::Padding {
        println!("  (no teacher tokens: P-KL gives this row no mass, H-KL leaves it to ULD)");
    }
    Ok(())
}

fn run_audit(args: AuditArgs) -> Result<()> {
    let critical = args
        .critical
        .iter()
        .map(|name| Category::parse(name.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    if !(0.0..=1.0).contains(&args.min_coverage) {
        anyhow::bail!("--min-coverage {} must be in [0, 1]", args.min_coverage);
    }
    let (student, teacher) = args.pair.load()?;
    let w = match &args.projection {
        Some(path) => SparseProjection::load_verified(path, &student, &teacher)?,
        None => SparseProjection::build(&student, &teacher, args.params.params())?.0,
    };
    let options = AuditOptions {
        critical,
        min_coverage: args.min_coverage,
    };
    let report = audit::audit(&student, &teacher, &w, &options);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_markdown());
    }
    Ok(())
}
