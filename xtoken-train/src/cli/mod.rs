//! The commands of the `xtoken` tool, one module each; `main.rs` parses and dispatches.

pub mod align;
pub mod audit;
pub mod demo;
pub mod eval;
pub mod models;
pub mod projection;
#[cfg(test)]
mod reference;
pub mod serve;
pub mod teach;
pub mod train;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use xtoken_core::projection::ProjectionParams;
use xtoken_core::vocab::Vocabulary;
use xtoken_train::output::{safetensors_holds, Inputs, Own};

/// A stored W: a safetensors file of `indices` and `weights`.
pub const OWN_W: Own<'static> = Own::File {
    what: "a projection matrix W",
    is_own: |path| safetensors_holds(path, &["indices", "weights"]),
};

use crate::bench::BenchCommand;

/// The command line.
#[derive(Parser)]
#[command(
    name = "xtoken",
    version,
    about = "Cross-tokenizer knowledge distillation (X-Token) on burn"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand)]
pub enum Command {
    /// The paper's main result in miniature on a CPU: questions whose answers are numerals,
    /// tokenizers trained here (digit-splitting teacher, 1–3-digit student; a numeral-keeping
    /// teacher with `--regimes`), tiny teachers, and students distilled with CE only, GOLD, ULD,
    /// P-KL and H-KL; prints the table and writes plots.
    Demo(demo::DemoArgs),
    /// Distill a student from one or more teachers: `xtoken train --config run.toml`.
    Train(train::TrainArgs),
    /// Run each teacher of a configuration over its data once and store its top-K targets, for
    /// runs of students of any tokenizer that read them (`teachers[].targets`) instead.
    Teach(teach::TeachArgs),
    /// Serve a teacher over HTTP in vLLM's API subset (`/v1/models`, `/v1/completions` with
    /// token-id prompts and `prompt_logprobs`, `/health`), for runs whose `teachers[].server`
    /// names it.
    Serve(serve::ServeArgs),
    /// Build or inspect the projection matrix W between a student and a teacher tokenizer.
    #[command(subcommand)]
    Projection(projection::ProjectionCommand),
    /// Coverage audit of a tokenizer pair: per category, how many student tokens land in GOLD's
    /// common set C and H-KL's relaxed set; recommends P-KL or H-KL.
    Audit(audit::AuditArgs),
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
    /// Write the student of a training checkpoint as a Hugging Face directory (with its
    /// tokenizer, chat template and generation configuration).
    Export(models::ExportArgs),
    /// The paper's benchmarks (3-shot MMLU, GSM8k, MATH, WinoGrande, HellaSwag) from local
    /// copies of the datasets, scored as lm-evaluation-harness scores them.
    Eval(eval::EvalArgs),
    /// Benchmarks that print Markdown tables for BENCHMARKS.md.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// A student and a teacher tokenizer, each a directory with tokenizer.json or the file itself.
#[derive(Args, Clone)]
pub struct PairArgs {
    /// Student tokenizer: a directory holding tokenizer.json, or the file.
    #[arg(long)]
    pub student: PathBuf,
    /// Teacher tokenizer: a directory holding tokenizer.json, or the file.
    #[arg(long)]
    pub teacher: PathBuf,
    /// Rows of the student's embedding table if padded past the tokenizer.
    #[arg(long)]
    student_vocab_size: Option<usize>,
    /// Rows of the teacher's embedding table if padded past the tokenizer (Qwen3: 151936).
    #[arg(long)]
    teacher_vocab_size: Option<usize>,
}

impl PairArgs {
    /// The two tokenizers as a command's inputs.
    pub fn inputs(&self) -> Inputs {
        Inputs::new()
            .tokenizer("the student tokenizer", &self.student)
            .tokenizer("the teacher tokenizer", &self.teacher)
    }

    pub fn load(&self) -> Result<(Vocabulary, Vocabulary)> {
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
    pub fn params(&self) -> ProjectionParams {
        ProjectionParams {
            top_k: self.top_k,
            max_span: self.max_span,
            beta: self.beta,
            gamma: self.gamma,
        }
    }
}
