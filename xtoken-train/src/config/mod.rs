//! The run configuration: one TOML file whose every default is the paper's setting
//! (Llama-3.2-1B student, 30k steps of 768 × 4096 tokens, AdamW 5e-5 with 5 % warmup and cosine
//! decay to 0, weight decay 0.1, clipping 1.0, τ = 1, top-K 8192, W top-4 trained at 1e-2).
//! Unknown keys are refused by name, and [`RunConfig::validate`] names the key of a bad value.
//!
//! Every floor of the crate stands on it, and it stands on `error` alone: the choices it parses
//! ([`choices`]: dtypes, the device family, the scaling scope, the benchmarks' names) live here,
//! and the stages take them from here.
//!
//! ```
//! use xtoken_train::config::RunConfig;
//!
//! let config = RunConfig::parse(
//!     r#"
//! output_dir = "runs/llama1b-from-qwen3"
//! [student]
//! model = "models/Llama-3.2-1B"
//! [[teachers]]
//! model = "models/Qwen3-4B"
//! loss = "pkl"
//! [data]
//! path = "data/train.jsonl"
//! "#,
//! )?;
//! assert_eq!(config.training.lr, 5e-5);
//! assert_eq!(config.teacher_settings()?[0].name, "Qwen3-4B");
//! # Ok::<(), xtoken_train::Error>(())
//! ```

use std::path::{Path, PathBuf};

pub mod choices;
#[cfg(test)]
mod reference;

pub use choices::{
    DeviceKind, DtypeChoice, ExchangeChoice, ExchangeKind, Format, ScalingScope, ServedSettings,
    TaskName, ValueDtype, NCCL_BUILT,
};

use crate::error::{Context, Error, Failures, Result};
use serde::{Deserialize, Serialize};
use xtoken_core::align::AlignParams;
use xtoken_core::loss::multi::{ConfidenceMeasure, Weighting};
use xtoken_core::loss::{LossKind, LossParams, TopK};
use xtoken_core::plan::MergeVariant;

use xtoken_core::projection::ProjectionParams;

/// The whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Where checkpoints, metrics, plots, caches and the final student go.
    pub output_dir: PathBuf,
    /// Seeds the data order and the on-policy draws and samples (nothing else is random).
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    /// `cpu` (burn-flex, `auto` dtypes f32), `flex` (burn-flex, `auto` dtypes bf16), `ndarray`
    /// (burn's ndarray), `cuda` or `wgpu`; `--device` overrides it. A run directory's
    /// `run.toml` leaves it out (a run may resume on another device), so that it reads as the
    /// default.
    #[serde(default = "defaults::device", skip_serializing_if = "String::is_empty")]
    pub device: String,
    /// `[student]`.
    pub student: StudentConfig,
    /// `[[teachers]]`, one or more.
    pub teachers: Vec<TeacherConfig>,
    /// `[data]`.
    pub data: DataConfig,
    /// `[training]`.
    #[serde(default)]
    pub training: TrainingConfig,
    /// `[loss]`.
    #[serde(default)]
    pub loss: LossConfig,
    /// `[projection]`.
    #[serde(default)]
    pub projection: ProjectionConfig,
    /// `[checkpoint]`.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// `[eval]`: held-out evaluation during training (none without the section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalConfig>,
    /// `[on_policy]`: sequences the student writes and the teachers grade (none without the
    /// section).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_policy: Option<OnPolicyConfig>,
    /// `[teach]`: what `xtoken teach` stores of each teacher.
    #[serde(default)]
    pub teach: TeachConfig,
    /// `[parallel]`: how data-parallel workers sum their gradients.
    #[serde(default)]
    pub parallel: ParallelConfig,
}

/// How the data-parallel workers of a run (several devices, processes or machines) sum each
/// step's gradients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParallelConfig {
    /// `auto` (NCCL on CUDA devices, the ring elsewhere), `nccl` (NVIDIA's collectives between
    /// GPUs and machines; CUDA only, and with one worker it still runs, as a check) or `ring`
    /// (xtoken-collective: a tree over a process's devices, a ring over TCP between processes).
    pub exchange: String,
    /// Megabytes of gradients per all-reduce: the gradients are gathered into buckets of this
    /// size in the order the backward produces them, and each is sent once it is gathered (as
    /// PyTorch DDP's 25 MB buckets).
    pub bucket_mb: f64,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            exchange: "auto".into(),
            bucket_mb: 25.0,
        }
    }
}

/// What `xtoken teach` keeps of each teacher's pass over the data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TeachConfig {
    /// Entries kept per position (a run may keep fewer, never more).
    pub top_k: usize,
    /// How the values are stored: `f32` (exact), `bf16`, `q8` (8 bits relative to each
    /// position's largest value), `compact` (entries grouped by a value's code, best first,
    /// their ids Rice-coded: 12 more bits in the head, 5-bit tail codes that cost only their
    /// counts) or `packed` (compact with a code's ids bit-packed 32 at a time: more bytes at a
    /// K in the thousands, read ~3× faster).
    pub dtype: String,
    /// Whether the compact layout also keeps the confidence terms that adaptive weighting
    /// (`loss.weighting` = `neg_ce`, `neg_entropy` or `max_prob`) reads (16 bytes a token; the
    /// other layouts always keep them). Without them, `teach` skips computing them and a run with adaptive weighting is
    /// refused.
    pub confidence: bool,
    /// Teacher tokens read at once; a longer document is read in windows of this many, each
    /// on its own.
    pub window: usize,
    /// Documents per shard file (the unit that a killed pass keeps and several processes
    /// share out).
    pub shard_documents: usize,
}

impl Default for TeachConfig {
    fn default() -> Self {
        TeachConfig {
            top_k: 8192,
            dtype: "f32".into(),
            confidence: false,
            window: 4096,
            shard_documents: 1024,
        }
    }
}

/// On-policy distillation (GKD's λ across tokenizers): each sequence of a batch is, with
/// probability `fraction`, a prompt the student continues by sampling, which every teacher then
/// reads and grades; the X-Token loss applies to the generated span only, and no cross-entropy
/// (a generated token has no label).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OnPolicyConfig {
    /// λ: the probability that a sequence is generated by the student (a seeded draw per
    /// sequence); 0 turns on-policy distillation off, 1 makes every sequence on-policy.
    pub fraction: f64,
    /// A prompt is the first this many student tokens of a document (cut back to whole
    /// characters).
    pub prompt_tokens: usize,
    /// Or the prompt is this JSON field (parquet column) of each record, while `text_field`
    /// still feeds the off-policy sequences (streamed data only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_field: Option<String>,
    /// Tokens the student writes after a prompt at most (a special token such as EOS ends it
    /// sooner).
    pub max_new_tokens: usize,
    /// The sampling temperature; 0 is greedy decoding.
    pub temperature: f64,
    /// Nucleus sampling: draw among the likeliest tokens holding this much probability.
    pub top_p: f64,
    /// Sequences the student writes at once (its key/value cache holds that many); each
    /// sequence's text does not depend on it.
    pub generation_batch: usize,
}

impl Default for OnPolicyConfig {
    fn default() -> Self {
        OnPolicyConfig {
            fraction: 0.0,
            prompt_tokens: 64,
            prompt_field: None,
            max_new_tokens: 128,
            temperature: 1.0,
            top_p: 1.0,
            generation_batch: 32,
        }
    }
}

impl OnPolicyConfig {
    /// Whether any sequence is drawn on-policy.
    pub fn active(&self) -> bool {
        self.fraction > 0.0
    }

    /// Checks every value, naming the key of the first bad one; a prompt and its continuation
    /// must fit `context_length`.
    fn validate(&self, context_length: usize) -> Result<()> {
        if !(0.0..=1.0).contains(&self.fraction) {
            return Err(Error::Config(format!(
                "on_policy.fraction = {}: must be a fraction in [0, 1]",
                self.fraction
            )));
        }
        at_least_one("on_policy.prompt_tokens", self.prompt_tokens as u64)?;
        at_least_one("on_policy.max_new_tokens", self.max_new_tokens as u64)?;
        at_least_one("on_policy.generation_batch", self.generation_batch as u64)?;
        if self.prompt_field.as_deref() == Some("") {
            return Err(Error::Config(
                "on_policy.prompt_field = \"\": name the field, or leave it out to prompt with \
                 each document's first on_policy.prompt_tokens"
                    .into(),
            ));
        }
        let longest = self.prompt_tokens.max(1) + self.max_new_tokens;
        if self.prompt_field.is_none() && longest > context_length {
            return Err(Error::Config(format!(
                "on_policy.prompt_tokens + on_policy.max_new_tokens = {longest}: more than \
                 training.context_length = {context_length}; a generated sequence must fit a row"
            )));
        }
        if self.max_new_tokens >= context_length {
            return Err(Error::Config(format!(
                "on_policy.max_new_tokens = {}: must leave room for a prompt in \
                 training.context_length = {context_length}",
                self.max_new_tokens
            )));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::Config(format!(
                "on_policy.temperature = {}: must be ≥ 0 (0: greedy)",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Config(format!(
                "on_policy.top_p = {}: must be in (0, 1]",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// Evaluation during training, every `every` steps and after the last one: the same packed rows
/// of held-out text evaluated without a gradient, and benchmarks scored as `xtoken eval` scores
/// them. At least one of `path` and `tasks`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// The held-out text: a file, a directory, a glob or a list of them, as `data.path` (its
    /// `data.text_field`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<DataPaths>,
    /// Benchmarks to score (`xtoken eval`'s tasks: mmlu, gsm8k, math, winogrande, hellaswag).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<String>,
    /// Their files, as `xtoken eval --data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_data: Option<PathBuf>,
    /// Documents scored per task (per subject for MMLU and MATH) at most; default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_limit: Option<usize>,
    /// Solved examples per benchmark prompt.
    #[serde(default = "defaults::eval_shots")]
    pub tasks_shots: usize,
    /// Also write each benchmark document's record at every evaluation, as `xtoken eval
    /// --log-samples` does, into `<output_dir>/samples/step-<N>/`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tasks_log_samples: bool,
    /// Steps between evaluations.
    #[serde(default = "defaults::eval_every")]
    pub every: u64,
    /// Student tokens evaluated each time (whole rows of `context_length`; fewer when the
    /// held-out text ends first).
    #[serde(default = "defaults::eval_tokens")]
    pub max_tokens: u64,
}

/// The model being trained.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudentConfig {
    /// A Hugging Face model directory (config.json + safetensors).
    pub model: PathBuf,
    /// Its tokenizer (directory or tokenizer.json); default: the model directory.
    pub tokenizer: Option<PathBuf>,
    /// Parameter dtype: `f32` (master weights; the default) or `bf16`.
    #[serde(default = "defaults::student_dtype")]
    pub dtype: String,
}

/// One teacher.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeacherConfig {
    /// Short name for logs and metric columns; default: the model directory's name.
    pub name: Option<String>,
    /// A Hugging Face model directory: the teacher runs at every step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Or a teacher's stored targets (a directory `xtoken teach` wrote): no weights are
    /// loaded, the stored values are merged instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<PathBuf>,
    /// Or a served teacher: the base of an OpenAI-compatible API that answers vLLM's
    /// `prompt_logprobs` (a vLLM server, or `xtoken serve`), e.g. `http://host:8000/v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// A served teacher's model, as the server's `/v1/models` lists it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model: Option<String>,
    /// A served teacher's requests in flight at once (the loader asks `data.prefetch` steps
    /// ahead of training).
    #[serde(default = "defaults::requests")]
    pub requests: usize,
    /// The longest one request to a served teacher may take, in seconds.
    #[serde(default = "defaults::timeout_s")]
    pub timeout_s: f64,
    /// Times a request to a served teacher that timed out or got a 5xx is sent again (0.5 s,
    /// 1 s, 2 s, … apart) before the run ends.
    #[serde(default = "defaults::retries")]
    pub retries: u32,
    /// Whether a served teacher is asked for xtoken's binary answer where it offers one
    /// (`xtoken serve` does; exact confidence terms, fewer bytes); `false`: vLLM's JSON always.
    #[serde(default = "defaults::yes")]
    pub binary_answers: bool,
    /// Its tokenizer; default: the model (or targets) directory. A served teacher needs it: a
    /// directory with the served model's `tokenizer.json` and `config.json`.
    pub tokenizer: Option<PathBuf>,
    /// `kl`, `pkl`, `hkl`, `gold`, `uld`, or `auto` (the coverage audit's recommendation).
    #[serde(default = "defaults::loss_mode")]
    pub loss: String,
    /// Static weight α.
    #[serde(default = "defaults::alpha")]
    pub alpha: f64,
    /// W for P-KL / H-KL (safetensors); built and stored there when absent. Default:
    /// `<output_dir>/projections/<name>.W.safetensors`.
    pub projection: Option<PathBuf>,
    /// Parameter dtype: `auto` (bf16 where the backend has it, else f32), `f32`, `bf16`, `f16`.
    #[serde(default = "defaults::teacher_dtype")]
    pub dtype: String,
}

impl TeacherConfig {
    /// The model directory, the stored targets' directory, or a served teacher's tokenizer
    /// directory.
    pub fn dir(&self) -> &Path {
        let served = self.server.as_ref().and(self.tokenizer.as_deref());
        self.model
            .as_deref()
            .or(self.targets.as_deref())
            .or(served)
            .unwrap_or(Path::new(""))
    }

    /// How a served teacher named `name` is reached (`None`: not served).
    pub fn served(&self, name: &str) -> Option<ServedSettings> {
        Some(ServedSettings {
            name: name.to_string(),
            server: self.server.clone()?,
            model: self.served_model.clone().unwrap_or_default(),
            requests: self.requests,
            timeout: std::time::Duration::from_secs_f64(self.timeout_s.clamp(0.001, 1e6)),
            retries: self.retries,
            format: match self.binary_answers {
                true => Format::Negotiate,
                false => Format::Json,
            },
        })
    }
}

/// The training text.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// A file, a directory, a glob, or a list of them: `.jsonl`, `.jsonl.zst`, `.parquet`,
    /// `.txt` or `.txt.zst` shards (see [`crate::data::sources`]).
    pub path: DataPaths,
    /// With a list in `path`: each entry is a source of its own, drawn with this weight
    /// (a mixture); without, the list's shards form one source.
    pub weights: Option<Vec<f64>>,
    /// The JSON field or parquet column holding the text (`.txt` shards have none).
    #[serde(default = "defaults::text_field")]
    pub text_field: String,
    /// The alignment cache of a single-file `path`: `true` (at `<output_dir>/data/<file
    /// stem>.xtc`) or a path; built when absent. Without it the data is streamed: tokenized and
    /// aligned by the loader's threads while training runs.
    pub cache: Option<CacheSetting>,
    /// Tokenization/alignment threads; 0 = every core.
    #[serde(default)]
    pub workers: usize,
    /// Batches assembled ahead of the training loop by the background loader.
    #[serde(default = "defaults::prefetch")]
    pub prefetch: usize,
    /// `concatenate` (documents follow each other in a row, Hugging Face's packing) or
    /// `document` (each row holds one document, a longer one cut into several rows).
    #[serde(default = "defaults::packing")]
    pub packing: String,
}

/// `data.path`: one path (a file, a directory or a glob) or a list of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DataPaths {
    /// One entry.
    One(PathBuf),
    /// Several entries.
    Many(Vec<PathBuf>),
}

impl DataPaths {
    /// The entries, in order.
    pub fn entries(&self) -> &[PathBuf] {
        match self {
            DataPaths::One(p) => std::slice::from_ref(p),
            DataPaths::Many(list) => list,
        }
    }

    /// The key naming entry `i` in messages: `data.path`, or `data.path[i]` in a list.
    pub fn key(&self, i: usize) -> String {
        match self {
            DataPaths::One(_) => "data.path".to_string(),
            DataPaths::Many(_) => format!("data.path[{i}]"),
        }
    }

    /// Whether an entry is a glob pattern (`*`, `?`, `[…]`) rather than a path.
    pub fn is_glob(entry: &Path) -> bool {
        entry.to_string_lossy().contains(['*', '?', '['])
    }
}

impl From<PathBuf> for DataPaths {
    fn from(path: PathBuf) -> Self {
        DataPaths::One(path)
    }
}

/// `data.cache`: on at its default place, or at a path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CacheSetting {
    /// `true`: `<output_dir>/data/<file stem>.xtc`; `false`: stream.
    On(bool),
    /// This file.
    At(PathBuf),
}

/// Steps, batches and the optimizer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingConfig {
    /// Optimizer steps.
    pub steps: u64,
    /// Sequences per optimizer step, over all workers.
    pub batch_size: usize,
    /// Sequences per forward/backward pass on one device.
    pub micro_batch: usize,
    /// Micro-batches per step and worker; must equal batch_size / (micro_batch × workers)
    /// when given.
    pub grad_accum: Option<usize>,
    /// Student tokens per packed sequence.
    pub context_length: usize,
    /// Peak learning rate of the student.
    pub lr: f64,
    /// Fraction of the steps spent warming up linearly from 0.
    pub warmup: f64,
    /// The cosine's floor.
    pub min_lr: f64,
    /// Decoupled weight decay; norm weights are exempt, as in Hugging Face's Trainer.
    pub weight_decay: f64,
    /// AdamW's β₁.
    pub beta1: f64,
    /// AdamW's β₂.
    pub beta2: f64,
    /// AdamW's ε.
    pub epsilon: f64,
    /// Global gradient-norm clipping of the student; 0 disables it.
    pub grad_clip: f64,
    /// Recompute each decoder layer in the backward pass instead of storing its activations.
    pub activation_checkpointing: bool,
    /// The dtype the student's matmuls, attention and logits run in: `auto` (bf16 where the
    /// backend has it, else f32; f32 on `cpu`), `bf16`, `f16` or `f32` (16-bit is refused on
    /// `cpu`, where it is slower than f32; `flex` keeps it). Below `student.dtype` it is mixed
    /// precision: the weights, AdamW's moments, RMSNorm, RoPE, the residual stream and the
    /// losses' sums stay in the parameters' dtype.
    pub compute_dtype: String,
    /// A micro-batch's rows (the student's and each teacher's) are padded to a multiple of this
    /// many tokens; 0 (the default): 128 on CUDA and wgpu, whose kernels are compiled per
    /// shape, none on the CPU.
    pub length_multiple: usize,
    /// Print a metrics line every this many steps when no progress bar is drawn.
    pub log_every: u64,
}

/// The distillation objective.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossConfig {
    /// τ, on the logits of both sides.
    pub temperature: f64,
    /// Teacher entries kept per chunk; 0 keeps the whole vocabulary.
    pub top_k: usize,
    /// Weight of GOLD's and H-KL's common KL.
    pub lambda_kl: f64,
    /// Weight of the sorted L1 (GOLD, H-KL, ULD).
    pub lambda_uld: f64,
    /// `L = sg(L_CE / L_KD) · L_KD + L_CE` (paper §2.8); otherwise `L_CE + L_KD`.
    pub dynamic_scaling: bool,
    /// `static` (each teacher's α), or adaptive: `neg_ce`, `neg_entropy`, `max_prob`.
    pub weighting: String,
    /// Where dynamic scaling's ratio and adaptive α are measured: `step` (the paper: once per
    /// optimizer step, over every micro-batch and worker), `previous-step` (the previous
    /// step's, which costs no extra pass) or `micro-batch` (each its own).
    pub scaling_scope: String,
    /// `first_token` (the paper's chunk merge) or `last_token`.
    pub merge: String,
    /// Rows evaluated at once by the fused losses.
    pub row_chunk: usize,
}

/// W's construction and training.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProjectionConfig {
    /// Entries kept per row of W.
    pub top_k: usize,
    /// Longest teacher re-encoding the multi-token rule (and the alignment) accepts.
    pub max_span: usize,
    /// Weight of the first sub-token (β).
    pub beta: f64,
    /// Decay per further sub-token (γ).
    pub gamma: f64,
    /// Learning rate of W's values under P-KL (AdamW, no clipping, no decay).
    pub lr: f64,
    /// Train W under P-KL (the paper does; it is always frozen under H-KL).
    pub learnable: bool,
}

/// Checkpointing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Steps between checkpoints (a last one is written at the end).
    pub every: u64,
    /// Checkpoints kept; older ones are deleted.
    pub keep: usize,
    /// dtype of the final student directory: `bf16`, `f16` or `f32`.
    pub save_dtype: String,
    /// Also write the student as a Hugging Face directory `hf/` into every checkpoint.
    pub hf: bool,
}

mod defaults {
    pub fn seed() -> u64 {
        42
    }
    pub fn device() -> String {
        "cpu".into()
    }
    pub fn student_dtype() -> String {
        "f32".into()
    }
    pub fn teacher_dtype() -> String {
        "auto".into()
    }
    pub fn loss_mode() -> String {
        "auto".into()
    }
    pub fn alpha() -> f64 {
        1.0
    }
    pub fn yes() -> bool {
        true
    }
    pub fn requests() -> usize {
        8
    }
    pub fn timeout_s() -> f64 {
        120.0
    }
    pub fn retries() -> u32 {
        5
    }
    pub fn text_field() -> String {
        "text".into()
    }
    pub fn prefetch() -> usize {
        4
    }
    pub fn packing() -> String {
        "concatenate".into()
    }
    pub fn eval_every() -> u64 {
        1000
    }
    pub fn eval_shots() -> usize {
        3
    }
    pub fn eval_tokens() -> u64 {
        1 << 20
    }
}

impl Default for TrainingConfig {
    fn default() -> Self {
        TrainingConfig {
            steps: 30_000,
            batch_size: 768,
            micro_batch: 1,
            grad_accum: None,
            context_length: 4096,
            lr: 5e-5,
            warmup: 0.05,
            min_lr: 0.0,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            grad_clip: 1.0,
            activation_checkpointing: true,
            compute_dtype: "auto".into(),
            length_multiple: 0,
            log_every: 10,
        }
    }
}

impl Default for LossConfig {
    fn default() -> Self {
        let params = LossParams::default();
        LossConfig {
            temperature: params.tau,
            top_k: 8192,
            lambda_kl: params.lambda_kl,
            lambda_uld: params.lambda_uld,
            dynamic_scaling: true,
            weighting: "static".into(),
            scaling_scope: "previous-step".into(),
            merge: "first_token".into(),
            row_chunk: params.row_chunk,
        }
    }
}

impl Default for ProjectionConfig {
    fn default() -> Self {
        let params = ProjectionParams::default();
        ProjectionConfig {
            top_k: params.top_k,
            max_span: params.max_span,
            beta: params.beta,
            gamma: params.gamma,
            lr: 1e-2,
            learnable: true,
        }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            every: 1000,
            keep: 2,
            save_dtype: "bf16".into(),
            hf: false,
        }
    }
}

/// A teacher's `loss` key: a [`LossKind`], or `None` for `auto` (the coverage audit picks).
fn parse_loss(key: &str, value: &str) -> Result<Option<LossKind>> {
    if value == "auto" {
        return Ok(None);
    }
    value.parse::<LossKind>().map(Some).map_err(|_| {
        Error::Config(format!(
            "{key} = {value:?}: expected one of \"kl\", \"pkl\", \"hkl\", \"gold\", \"uld\", \"auto\""
        ))
    })
}

/// A teacher with every default filled in.
#[derive(Debug, Clone)]
pub struct TeacherSettings {
    /// Its name in logs, metric columns and checkpoint files.
    pub name: String,
    /// The Hugging Face model directory, or for stored targets their directory (which holds
    /// the teacher's config.json and tokenizer.json).
    pub model: PathBuf,
    /// Stored targets to read instead of running the model.
    pub targets: Option<PathBuf>,
    /// A served teacher's server, asked instead of running the model.
    pub server: Option<ServedSettings>,
    /// Its tokenizer (directory or tokenizer.json).
    pub tokenizer: PathBuf,
    /// The loss; `None` lets the coverage audit choose between P-KL and H-KL.
    pub loss: Option<LossKind>,
    /// Static weight α.
    pub alpha: f64,
    /// Where W is read from, or built into when absent.
    pub projection: PathBuf,
    /// Parameter dtype.
    pub dtype: DtypeChoice,
}

fn positive(key: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::Config(format!(
            "{key} = {v}: must be a positive finite number"
        )));
    }
    Ok(())
}

fn non_negative(key: &str, v: f64) -> Result<()> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(Error::Config(format!(
            "{key} = {v}: must be a non-negative finite number"
        )));
    }
    Ok(())
}

fn at_least_one(key: &str, v: u64) -> Result<()> {
    if v == 0 {
        return Err(Error::Config(format!("{key} = 0: must be at least 1")));
    }
    Ok(())
}

impl TrainingConfig {
    /// Checks every value of `[training]`, naming the key of each bad one.
    fn validate(&self) -> Result<()> {
        let t = self;
        let mut f = Failures::default();
        f.note(at_least_one("training.steps", t.steps));
        f.note(at_least_one("training.batch_size", t.batch_size as u64));
        f.note(at_least_one("training.micro_batch", t.micro_batch as u64));
        if t.context_length < 2 {
            f.note::<()>(Err(Error::Config(format!(
                "training.context_length = {}: must be at least 2",
                t.context_length
            ))));
        }
        let lr = f.note(positive("training.lr", t.lr));
        if !(0.0..1.0).contains(&t.warmup) {
            f.note::<()>(Err(Error::Config(format!(
                "training.warmup = {}: must be a fraction in [0, 1)",
                t.warmup
            ))));
        }
        let min_lr = f.note(non_negative("training.min_lr", t.min_lr));
        // Compared only when both are valid: a bad lr is named once, not again through min_lr.
        if lr.and(min_lr).is_some() && t.min_lr > t.lr {
            f.note::<()>(Err(Error::Config(format!(
                "training.min_lr = {}: must not exceed training.lr = {}",
                t.min_lr, t.lr
            ))));
        }
        f.note(non_negative("training.weight_decay", t.weight_decay));
        for (key, v) in [("training.beta1", t.beta1), ("training.beta2", t.beta2)] {
            if !(0.0..1.0).contains(&v) {
                f.note::<()>(Err(Error::Config(format!(
                    "{key} = {v}: must be in [0, 1)"
                ))));
            }
        }
        f.note(positive("training.epsilon", t.epsilon));
        f.note(non_negative("training.grad_clip", t.grad_clip));
        f.note(at_least_one("training.log_every", t.log_every));
        if let Some(accum) = t.grad_accum {
            f.note(at_least_one("training.grad_accum", accum as u64));
        }
        f.or_value(())
    }
}

/// `[eval]`: positive cadences, something to evaluate, known tasks with their data.
fn validate_eval(eval: &EvalConfig) -> Result<()> {
    at_least_one("eval.every", eval.every)?;
    at_least_one("eval.max_tokens", eval.max_tokens)?;
    if eval.path.as_ref().is_some_and(|p| p.entries().is_empty()) {
        return Err(Error::Config("eval.path: the list is empty".into()));
    }
    if eval.path.is_none() && eval.tasks.is_empty() {
        return Err(Error::Config(
            "[eval]: give `path` (held-out text), `tasks` (benchmarks) or both".into(),
        ));
    }
    for (i, task) in eval.tasks.iter().enumerate() {
        task.parse::<TaskName>()
            .map_err(|e| Error::Config(format!("eval.tasks[{i}]: {e}")))?;
    }
    if !eval.tasks.is_empty() && eval.tasks_data.is_none() {
        return Err(Error::Config(
            "eval.tasks_data: the benchmarks' files are needed with eval.tasks".into(),
        ));
    }
    Ok(())
}

impl RunConfig {
    /// Reads and checks `path`; every error names the file and the key at fault.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read the run configuration", path.display()))?;
        Self::parse(&text).with_context(|| format!("{}", path.display()))
    }

    /// Reads a run directory's `run.toml`, written with the device left out (a run may resume
    /// on another): it is read as `cpu`. Earlier builds wrote `device = ""`, read the same way.
    pub fn load_saved(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read the run configuration", path.display()))?;
        let mut config: RunConfig =
            toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        if config.device.is_empty() {
            config.device = defaults::device();
        }
        config
            .validate()
            .with_context(|| format!("{}", path.display()))?;
        Ok(config)
    }

    /// Reads a configuration file without validating its values, for `train --check`, which
    /// lists bad values beside every other failure ([`RunConfig::validate`]).
    pub fn load_unchecked(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read the run configuration", path.display()))?;
        toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// Parses and validates a configuration text; relative paths stay relative to the working
    /// directory.
    pub fn parse(text: &str) -> Result<Self> {
        let config: RunConfig = toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value, naming the key of each bad one (all of them, not only the first).
    pub fn validate(&self) -> Result<()> {
        let mut f = Failures::default();
        if self.output_dir.as_os_str().is_empty() {
            f.note::<()>(Err(Error::Config(
                "output_dir = \"\": name the run's directory (an empty one would write into \
                 the working directory)"
                    .into(),
            )));
        }
        f.note(self.device.parse::<DeviceKind>());
        f.note(self.student_dtype());
        f.note(self.compute_dtype());
        f.note(self.validate_teachers());
        f.note(self.validate_data());
        if let Some(eval) = &self.eval {
            f.note(validate_eval(eval));
        }
        f.note(at_least_one("data.prefetch", self.data.prefetch as u64));
        f.note(self.document_rows());
        f.note(self.teach_dtype());
        f.note(at_least_one("teach.top_k", self.teach.top_k as u64));
        f.note(at_least_one(
            "teach.shard_documents",
            self.teach.shard_documents as u64,
        ));
        if self.teach.window < 2 {
            f.note::<()>(Err(Error::Config(format!(
                "teach.window = {}: must be at least 2",
                self.teach.window
            ))));
        }
        f.note(self.training.validate());
        f.note(self.exchange_choice());
        f.note(positive("parallel.bucket_mb", self.parallel.bucket_mb));
        if let Some(on_policy) = &self.on_policy {
            f.note(on_policy.validate(self.training.context_length));
            if on_policy.prompt_field.is_some() && self.data.cache.is_some() {
                f.note::<()>(Err(Error::Config(
                    "on_policy.prompt_field: an alignment cache (data.cache) keeps no prompts; \
                     stream the data, or prompt with on_policy.prompt_tokens"
                        .into(),
                )));
            }
        }
        if f.is_empty() {
            f.note(self.grad_accum(1));
        }
        let l = &self.loss;
        f.note(positive("loss.temperature", l.temperature));
        f.note(non_negative("loss.lambda_kl", l.lambda_kl));
        f.note(non_negative("loss.lambda_uld", l.lambda_uld));
        f.note(at_least_one("loss.row_chunk", l.row_chunk as u64));
        f.note(self.weighting());
        f.note(self.scaling_scope());
        f.note(self.merge_variant());
        let params = self.projection_params().validate();
        f.note(params.map_err(|e| Error::Config(format!("projection: {e}"))));
        f.note(positive("projection.lr", self.projection.lr));
        f.note(at_least_one("checkpoint.every", self.checkpoint.every));
        f.note(at_least_one("checkpoint.keep", self.checkpoint.keep as u64));
        f.note(self.save_dtype());
        f.or_value(())
    }

    /// Teacher `i` names one source of targets: a model, stored targets, or a server (with its
    /// model, tokenizer and request settings, at τ = 1).
    fn validate_source(&self, i: usize, t: &TeacherConfig) -> Result<()> {
        let given = [t.model.is_some(), t.targets.is_some(), t.server.is_some()];
        if given.iter().filter(|&&g| g).count() != 1 {
            return Err(Error::Config(format!(
                "teachers[{i}]: give one of `model` (a Hugging Face directory: the teacher runs \
                 at every step), `targets` (a directory `xtoken teach` wrote) or `server` (a \
                 served teacher's API, e.g. \"http://host:8000/v1\"){}",
                if given.iter().any(|&g| g) {
                    ", not several"
                } else {
                    ""
                }
            )));
        }
        if t.server.is_none() {
            return match t.served_model {
                Some(_) => Err(Error::Config(format!(
                    "teachers[{i}].served_model: only with `server`"
                ))),
                None => Ok(()),
            };
        }
        let mut f = Failures::default();
        if t.served_model.as_deref().is_none_or(str::is_empty) {
            f.note::<()>(Err(Error::Config(format!(
                "teachers[{i}].served_model: a served teacher needs its model's name, as the \
                 server's /v1/models lists it"
            ))));
        }
        if t.tokenizer.is_none() {
            f.note::<()>(Err(Error::Config(format!(
                "teachers[{i}].tokenizer: a served teacher needs a directory with the served \
                 model's tokenizer.json and config.json"
            ))));
        }
        f.note(at_least_one(
            &format!("teachers[{i}].requests"),
            t.requests as u64,
        ));
        f.note(positive(&format!("teachers[{i}].timeout_s"), t.timeout_s));
        if self.loss.temperature != 1.0 {
            f.note::<()>(Err(Error::Config(format!(
                "teachers[{i}].server: a served teacher's log-probabilities are at temperature \
                 1, the run's loss.temperature is {}; set it to 1 or run the teacher in-process",
                self.loss.temperature
            ))));
        }
        f.or_value(())
    }

    /// At least one teacher; names usable in file names and distinct; α non-negative.
    fn validate_teachers(&self) -> Result<()> {
        if self.teachers.is_empty() {
            return Err(Error::Config(
                "teachers: at least one [[teachers]] table is needed".into(),
            ));
        }
        for (i, t) in self.teachers.iter().enumerate() {
            self.validate_source(i, t)?;
        }
        let served = self.teachers.iter().any(|t| t.server.is_some());
        if served && self.on_policy_active().is_some() {
            return Err(Error::Config(
                "on_policy: a served teacher (teachers[].server) cannot grade what the student \
                 writes during the run yet; use `model` for on-policy teachers"
                    .into(),
            ));
        }
        let stored = self.teachers.iter().any(|t| t.targets.is_some());
        if stored && self.on_policy_active().is_some() {
            return Err(Error::Config(
                "on_policy: stored teacher targets (teachers[].targets) cannot grade what the \
                 student writes during the run; use `model` for on-policy teachers"
                    .into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, teacher) in self.teacher_settings()?.into_iter().enumerate() {
            non_negative(&format!("teachers[{i}].alpha"), teacher.alpha)?;
            let name = teacher.name;
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_alphanumeric() || "-_.".contains(c))
            {
                return Err(Error::Config(format!(
                    "teachers[{i}].name = {name:?}: use letters, digits, '-', '_' or '.'"
                )));
            }
            if !names.insert(name.clone()) {
                return Err(Error::Config(format!(
                    "teachers[{i}].name = {name:?}: two teachers share this name"
                )));
            }
        }
        Ok(())
    }

    /// Micro-batches per step on each of `workers` workers.
    pub fn grad_accum(&self, workers: usize) -> Result<usize> {
        let t = &self.training;
        let per_pass = t.micro_batch * workers;
        if !t.batch_size.is_multiple_of(per_pass) {
            return Err(Error::Config(format!(
                "training.batch_size = {}: must be a multiple of training.micro_batch ({}) × workers ({workers})",
                t.batch_size,
                t.micro_batch
            )));
        }
        let accum = t.batch_size / per_pass;
        if let Some(given) = t.grad_accum {
            if given != accum {
                return Err(Error::Config(format!(
                    "training.grad_accum = {given}: batch_size {} / (micro_batch {} × workers {workers}) is {accum}",
                    t.batch_size,
                    t.micro_batch
                )));
            }
        }
        Ok(accum)
    }

    /// The on-policy settings, when any sequence is drawn on-policy (`fraction` above 0).
    pub fn on_policy_active(&self) -> Option<&OnPolicyConfig> {
        self.on_policy.as_ref().filter(|o| o.active())
    }

    /// Teacher `i`'s name.
    pub fn teacher_name(&self, i: usize) -> String {
        let teacher = &self.teachers[i];
        let served = teacher.served_model.as_deref();
        let served = served.and_then(|m| m.rsplit('/').next().filter(|n| !n.is_empty()));
        teacher
            .name
            .clone()
            .or(served.map(String::from))
            .unwrap_or_else(|| {
                teacher
                    .dir()
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| format!("teacher{i}"))
            })
    }

    /// The teachers with every default filled in.
    pub fn teacher_settings(&self) -> Result<Vec<TeacherSettings>> {
        self.teachers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let name = self.teacher_name(i);
                Ok(TeacherSettings {
                    server: t.served(&name),
                    projection: t.projection.clone().unwrap_or_else(|| {
                        self.output_dir
                            .join("projections")
                            .join(format!("{name}.W.safetensors"))
                    }),
                    name,
                    model: t.dir().to_path_buf(),
                    targets: t.targets.clone(),
                    tokenizer: t.tokenizer.clone().unwrap_or_else(|| t.dir().to_path_buf()),
                    loss: parse_loss(&format!("teachers[{i}].loss"), &t.loss)?,
                    alpha: t.alpha,
                    dtype: self.on_device(DtypeChoice::parse(
                        &format!("teachers[{i}].dtype"),
                        &t.dtype,
                        true,
                    )?),
                })
            })
            .collect()
    }

    /// Whether each packed row holds one document (`data.packing = "document"`).
    pub fn document_rows(&self) -> Result<bool> {
        match self.data.packing.as_str() {
            "concatenate" => Ok(false),
            "document" => Ok(true),
            other => Err(Error::Config(format!(
                "data.packing = {other:?}: expected \"concatenate\" or \"document\""
            ))),
        }
    }

    /// Which all-reduce sums the workers' gradients (`parallel.exchange`).
    pub fn exchange_choice(&self) -> Result<ExchangeChoice> {
        self.parallel.exchange.parse()
    }

    /// Bytes of gradients per all-reduce (`parallel.bucket_mb`), at least one.
    pub fn bucket_bytes(&self) -> usize {
        ((self.parallel.bucket_mb * 1e6) as usize).max(1)
    }

    /// How `xtoken teach` stores values (`teach.dtype`).
    pub fn teach_dtype(&self) -> Result<ValueDtype> {
        ValueDtype::parse("teach.dtype", &self.teach.dtype)
    }

    /// The student's tokenizer path.
    pub fn student_tokenizer(&self) -> PathBuf {
        self.student
            .tokenizer
            .clone()
            .unwrap_or_else(|| self.student.model.clone())
    }

    /// The student's parameter dtype.
    pub fn student_dtype(&self) -> Result<DtypeChoice> {
        DtypeChoice::parse("student.dtype", &self.student.dtype, false)
    }

    /// The dtype of the student's matmuls, attention and logits.
    pub fn compute_dtype(&self) -> Result<DtypeChoice> {
        let choice =
            DtypeChoice::parse("training.compute_dtype", &self.training.compute_dtype, true)?;
        Ok(self.on_device(choice))
    }

    /// `auto` is f32 on `device = "cpu"`: burn-flex converts 16-bit values to f32 around each
    /// operation, which costs a CPU time and saves only memory.
    fn on_device(&self, choice: DtypeChoice) -> DtypeChoice {
        match (choice, self.device.parse::<DeviceKind>()) {
            (DtypeChoice::Auto, Ok(DeviceKind::Cpu)) => DtypeChoice::F32,
            (choice, _) => choice,
        }
    }

    /// The final student's dtype on disk.
    pub fn save_dtype(&self) -> Result<DtypeChoice> {
        DtypeChoice::parse("checkpoint.save_dtype", &self.checkpoint.save_dtype, false)
    }

    /// The loss hyper-parameters.
    pub fn loss_params(&self) -> LossParams {
        let l = &self.loss;
        LossParams {
            tau: l.temperature,
            top_k: if l.top_k == 0 {
                TopK::All
            } else {
                TopK::K(l.top_k)
            },
            lambda_kl: l.lambda_kl,
            lambda_uld: l.lambda_uld,
            row_chunk: l.row_chunk,
            ..LossParams::default()
        }
    }

    /// How the teachers are weighted.
    pub fn weighting(&self) -> Result<Weighting> {
        Ok(match self.loss.weighting.as_str() {
            "static" => Weighting::Static,
            "neg_ce" => Weighting::Adaptive(ConfidenceMeasure::NegCrossEntropy),
            "neg_entropy" => Weighting::Adaptive(ConfidenceMeasure::NegEntropy),
            "max_prob" => Weighting::Adaptive(ConfidenceMeasure::MaxProb),
            other => return Err(Error::Config(format!(
                "loss.weighting = {other:?}: expected \"static\", \"neg_ce\", \"neg_entropy\" or \"max_prob\""
            ))),
        })
    }

    /// Where dynamic scaling's ratio and adaptive α are measured.
    pub fn scaling_scope(&self) -> Result<ScalingScope> {
        Ok(match self.loss.scaling_scope.as_str() {
            "step" => ScalingScope::Step,
            "previous-step" => ScalingScope::PreviousStep,
            "micro-batch" => ScalingScope::MicroBatch,
            other => {
                return Err(Error::Config(format!(
                    "loss.scaling_scope = {other:?}: expected \"step\", \"previous-step\" or \
                     \"micro-batch\""
                )))
            }
        })
    }

    /// The chunk merge.
    pub fn merge_variant(&self) -> Result<MergeVariant> {
        Ok(match self.loss.merge.as_str() {
            "first_token" => MergeVariant::FirstToken,
            "last_token" => MergeVariant::LastToken,
            other => {
                return Err(Error::Config(format!(
                    "loss.merge = {other:?}: expected \"first_token\" or \"last_token\""
                )))
            }
        })
    }

    /// W's construction rule.
    pub fn projection_params(&self) -> ProjectionParams {
        let p = &self.projection;
        ProjectionParams {
            top_k: p.top_k,
            max_span: p.max_span,
            beta: p.beta,
            gamma: p.gamma,
        }
    }

    /// The alignment's parameters (the paper's).
    pub fn align_params(&self) -> AlignParams {
        AlignParams {
            max_span: self.projection.max_span,
            ..AlignParams::default()
        }
    }

    /// The format of a single-file `data.path`.
    pub fn data_format(&self) -> Result<DataFormat> {
        match self.data.path.entries() {
            [one] => DataFormat::of(one).with_context(|| "data.path"),
            _ => Err(Error::Config(
                "data.path: a list of shards has no single format".into(),
            )),
        }
    }

    /// Tokenization and alignment threads: `data.workers`, or every core.
    pub fn data_threads(&self) -> usize {
        match self.data.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// The alignment cache's path, when `data.cache` asks for one.
    pub fn cache_path(&self) -> Option<PathBuf> {
        match self.data.cache.as_ref()? {
            CacheSetting::On(false) => None,
            CacheSetting::At(path) => Some(path.clone()),
            CacheSetting::On(true) => {
                let stem = self.data.path.entries().first().and_then(|p| {
                    let name = p.file_name()?.to_string_lossy().into_owned();
                    Some(name.split('.').next().unwrap_or("data").to_string())
                });
                let stem = stem.unwrap_or_else(|| "data".into());
                Some(self.output_dir.join("data").join(format!("{stem}.xtc")))
            }
        }
    }

    /// `[data]`'s paths, weights and cache, as far as they can be checked without reading the
    /// file system: every entry named like a file has a known format, the weights match the entries,
    /// and a cache is made of one file.
    fn validate_data(&self) -> Result<()> {
        let d = &self.data;
        let entries = d.path.entries();
        if entries.is_empty() {
            return Err(Error::Config("data.path: the list is empty".into()));
        }
        for (i, entry) in entries.iter().enumerate() {
            // A name with an extension must be a data file's; one without may be a directory
            // that does not exist yet (found when the run starts).
            if !DataPaths::is_glob(entry) && entry.extension().is_some() && !entry.is_dir() {
                DataFormat::of(entry).with_context(|| d.path.key(i))?;
            }
        }
        if let Some(weights) = &d.weights {
            if entries.len() == 1 {
                return Err(Error::Config(
                    "data.weights: a mixture needs two or more data.path entries; one path is \
                     read whole (leave data.weights out)"
                        .into(),
                ));
            }
            if weights.len() != entries.len() {
                return Err(Error::Config(format!(
                    "data.weights: {} weights for {} data.path entries",
                    weights.len(),
                    entries.len()
                )));
            }
            for (i, &w) in weights.iter().enumerate() {
                positive(&format!("data.weights[{i}]"), w)?;
            }
        }
        if self.cache_path().is_some() {
            let single = matches!(entries, [one] if !one.is_dir() && !DataPaths::is_glob(one));
            let format = if single {
                self.data_format()?
            } else {
                DataFormat::Jsonl
            };
            if !single || d.weights.is_some() || DataFormat::compressed(&entries[0]) {
                return Err(Error::Config(
                    "data.cache: an alignment cache is made of one uncompressed file; stream \
                     shards, directories and mixtures (leave data.cache out)"
                        .into(),
                ));
            }
            if format == DataFormat::Txt && d.text_field != "text" {
                return Err(Error::Config(
                    "data.text_field: a .txt file has no fields (one document per line)".into(),
                ));
            }
        }
        Ok(())
    }
}

/// The formats `data.path` may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFormat {
    /// JSON Lines (`.jsonl`, `.json`): one object per line, the text in a field.
    Jsonl,
    /// Apache Parquet: the text in a column.
    Parquet,
    /// Plain text: one document per line.
    Txt,
}

impl DataFormat {
    /// The format of a data file, by its extension; `.jsonl.zst` and `.txt.zst` are the same
    /// formats compressed with zstd.
    pub fn of(path: &Path) -> Result<Self> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        let name = name.strip_suffix(".zst").unwrap_or(&name);
        let ext = name.rsplit_once('.').map(|(_, e)| e);
        Ok(match ext {
            Some("jsonl") | Some("json") => DataFormat::Jsonl,
            Some("parquet") if !Self::compressed(path) => DataFormat::Parquet,
            Some("txt") => DataFormat::Txt,
            _ => {
                return Err(Error::Config(format!(
                    "{}: expected a .jsonl, .jsonl.zst, .parquet, .txt or .txt.zst file",
                    path.display()
                )))
            }
        })
    }

    /// Whether `path` is zstd-compressed (by its `.zst` extension).
    pub fn compressed(path: &Path) -> bool {
        path.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("zst"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
output_dir = "runs/a"
[student]
model = "models/student"
[[teachers]]
model = "models/qwen3"
[data]
path = "data/train.jsonl"
"#;

    #[test]
    fn defaults_are_the_papers() {
        let config = RunConfig::parse(MINIMAL).unwrap();
        let t = &config.training;
        assert_eq!(
            (t.steps, t.batch_size, t.context_length),
            (30_000, 768, 4096)
        );
        assert_eq!((t.lr, t.warmup, t.min_lr), (5e-5, 0.05, 0.0));
        assert_eq!((t.weight_decay, t.grad_clip), (0.1, 1.0));
        assert_eq!(config.loss.temperature, 1.0);
        assert_eq!(config.loss_params().top_k, TopK::K(8192));
        assert_eq!((config.loss.lambda_kl, config.loss.lambda_uld), (1.0, 1.0));
        assert!(config.loss.dynamic_scaling);
        assert_eq!((config.projection.top_k, config.projection.lr), (4, 1e-2));
        assert!(config.projection.learnable);
        let teachers = config.teacher_settings().unwrap();
        assert_eq!(teachers[0].name, "qwen3");
        assert_eq!(teachers[0].loss, None);
        assert_eq!(teachers[0].alpha, 1.0);
        assert_eq!(
            teachers[0].projection,
            Path::new("runs/a/projections/qwen3.W.safetensors")
        );
        assert_eq!(config.cache_path(), None, "the data is streamed");
        let cached = RunConfig::parse(&MINIMAL.replace("[data]", "[data]\ncache = true")).unwrap();
        assert_eq!(
            cached.cache_path().as_deref(),
            Some(Path::new("runs/a/data/train.xtc"))
        );
        assert_eq!(config.grad_accum(1).unwrap(), 768);
        assert_eq!(config.grad_accum(8).unwrap(), 96);
    }

    fn error_of(text: &str) -> String {
        format!("{:#}", RunConfig::parse(text).unwrap_err())
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = error_of(&format!("{MINIMAL}\n[training]\nlearning_rate = 1e-4\n"));
        assert!(err.contains("learning_rate"), "{err}");
        let err = error_of(&MINIMAL.replace("[data]", "[data]\nformat = \"csv\""));
        assert!(err.contains("format"), "{err}");
        let err = error_of(&format!("{MINIMAL}\n[training]\nlr = -1.0\n"));
        assert!(err.contains("training.lr"), "{err}");
        let err = error_of(&format!("{MINIMAL}\n[training]\nwarmup = 1.5\n"));
        assert!(err.contains("training.warmup"), "{err}");
        let err = error_of(&format!(
            "{MINIMAL}\n[training]\nbatch_size = 10\nmicro_batch = 4\n"
        ));
        assert!(err.contains("training.batch_size"), "{err}");
        let err = error_of(&MINIMAL.replace(
            "model = \"models/qwen3\"",
            "model = \"models/qwen3\"\nloss = \"pkll\"",
        ));
        assert!(
            err.contains("teachers[0].loss") && err.contains("pkll"),
            "{err}"
        );
        let err = error_of(&MINIMAL.replace("train.jsonl", "train.csv"));
        assert!(err.contains("data.path"), "{err}");
        let err = error_of(&format!("{MINIMAL}\n[loss]\nweighting = \"best\"\n"));
        assert!(err.contains("loss.weighting"), "{err}");
        let err = error_of(&format!("{MINIMAL}\n[loss]\nscaling_scope = \"epoch\"\n"));
        assert!(err.contains("loss.scaling_scope"), "{err}");
        let err = error_of(&format!("{MINIMAL}\n[projection]\ngamma = 2.0\n"));
        assert!(err.contains("gamma"), "{err}");
        let err = error_of(&format!("{MINIMAL}\n[training]\nsteps = \"many\"\n"));
        assert!(err.contains("steps"), "{err}");
        let err = error_of(&MINIMAL.replace("output_dir = \"runs/a\"", ""));
        assert!(err.contains("output_dir"), "{err}");
    }

    #[test]
    fn a_mixture_needs_two_paths() {
        let err = error_of(&MINIMAL.replace(
            "[data]\npath = \"data/train.jsonl\"",
            "[data]\npath = \"data/train.jsonl\"\nweights = [1.0]",
        ));
        assert!(
            err.contains("data.weights: a mixture needs two or more"),
            "{err}"
        );
    }
}
