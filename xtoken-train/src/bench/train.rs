//! `xtoken bench train`: the whole training step of `xtoken train` (data loader, teacher
//! forward with top-K, student forward + backward with activation checkpointing, the fused
//! distillation and CE losses, clipping, AdamW) on random models with the real tokenizers'
//! vocabularies, timed per step, with the peak memory (the device pools where the backend
//! reports them, else the host heap's high-water mark over the timed steps) beside the estimate
//! `xtoken train --check` prints for the same run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use burn::backend::NdArray;
use burn::tensor::DType;
use clap::{Args, ValueEnum};
use xtoken_kernels::memory::DeviceMemory;
use xtoken_models::{Architecture, SaveDtype, Transformer};
use xtoken_train::backend::{on_backend, OnBackend, TrainBackend};
use xtoken_train::cluster::parallel::{ExchangeSettings, Worker};
use xtoken_train::cluster::{free_port_pair, join_as_node, run_workers, Placement, Plan, Timeouts};
use xtoken_train::config::{DeviceKind, ExchangeKind};
use xtoken_train::observe::profile::{self, HostMemory, Phase, StepProfile};
use xtoken_train::observe::roofline::{Limits, StepShape, TeacherShape};
use xtoken_train::output::{claim_work_dir, json_has, write_file, Inputs, Own};
use xtoken_train::train::preflight::remove_run;
use xtoken_train::{Run, RunConfig, RunOptions};

use super::alloc;

/// A model body (the vocabulary comes from the tokenizer).
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Body {
    /// hidden 64, 2 layers, MLP 128: for a quick look at the pipeline's own cost.
    Tiny,
    /// hidden 768, 12 layers, 12 heads (4 KV), MLP 2048.
    Llama100m,
    /// Llama-3.2-1B: hidden 2048, 16 layers, 32 heads (8 KV), MLP 8192, tied head.
    Llama1b,
    /// Qwen3-4B's size: hidden 2560, 36 layers, 32 heads (8 KV), MLP 9728 (Llama blocks).
    Qwen4b,
}

impl Body {
    fn architecture(self, vocab: usize) -> Architecture {
        match self {
            Body::Tiny => Architecture::llama(vocab, 64, 128, 2, 4, 2),
            Body::Llama100m => Architecture::llama(vocab, 768, 2048, 12, 12, 4),
            Body::Llama1b => Architecture::llama(vocab, 2048, 8192, 16, 32, 8),
            Body::Qwen4b => {
                let mut arch = Architecture::llama(vocab, 2560, 9728, 36, 32, 8);
                arch.head_dim = 128;
                arch.rope.rotary_dim = 128;
                // Qwen3-4B ties its head to the embedding (4.02 B parameters), as Llama does.
                arch
            }
        }
    }
}

/// A body's name on the command line (the teacher's name in the run, too).
fn body_name(body: Body) -> String {
    body.to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default()
}

/// Options of `xtoken bench train`.
#[derive(Args)]
pub struct TrainBenchArgs {
    /// Student tokenizer (directory or tokenizer.json).
    #[arg(long)]
    student_tokenizer: PathBuf,
    /// Teacher tokenizer.
    #[arg(long)]
    teacher_tokenizer: PathBuf,
    /// The student's body.
    #[arg(long, value_enum, default_value_t = Body::Tiny)]
    student: Body,
    /// The teacher's body.
    #[arg(long, value_enum, default_value_t = Body::Tiny)]
    teacher: Body,
    /// The teacher's loss (`pkl`, `hkl`, `gold`, `uld`, `auto`).
    #[arg(long, default_value = "pkl")]
    loss: String,
    /// Student tokens per sequence.
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 1)]
    micro_batch: usize,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Where dynamic scaling's γ is measured (`loss.scaling_scope`); `step,previous-step`
    /// times both in one run (the cost of the step scope's extra forward pass).
    #[arg(long, value_delimiter = ',', default_value = "previous-step")]
    scaling_scope: Vec<String>,
    /// Teacher entries kept per chunk.
    #[arg(long, default_value_t = 8192)]
    top_k: usize,
    /// Steps timed (after one warm-up step).
    #[arg(long, default_value_t = 3)]
    steps: u64,
    /// `cpu` (burn-flex), `flex`, `ndarray`, `cuda` or `wgpu`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Teacher weights' dtype (`auto`: bf16 where the backend has it).
    #[arg(long, default_value = "auto")]
    teacher_dtype: String,
    /// The student's compute dtype (`training.compute_dtype`); `f32,bf16` times both in one
    /// run (mixed precision against f32).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    compute_dtype: Vec<String>,
    /// Where the random models, the corpus and the run go (default: a temporary directory).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Also time each phase of every step, the device synchronized at each phase's boundary
    /// (which costs a GPU some overlap): a table for the first step and the mean of the next.
    #[arg(long)]
    profile: bool,
    /// Writes the results (and the profile) as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// On-policy distillation: this fraction λ of the sequences is written by the student
    /// before the step (`[on_policy] fraction`); the table then adds the writing's tokens/s
    /// and its share of the step.
    #[arg(long)]
    on_policy: Option<f64>,
    /// With `--on-policy`: prompt tokens (each document's first).
    #[arg(long, default_value_t = 64)]
    prompt_tokens: usize,
    /// With `--on-policy`: tokens the student writes per sequence at most.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Also store the teacher's targets (`xtoken teach`, at the run's top-K, in each of these
    /// dtypes: `f32`, `bf16`, `q8`, `compact`, `packed`) and time the same run reading them
    /// instead of running the teacher; the table adds the store's bytes per token and the pass's
    /// tokens/s.
    #[arg(long, value_delimiter = ',')]
    stored: Vec<String>,
    /// `nccl`: the one worker sums its gradients through NCCL all the same (a communicator of
    /// one, its id carried by a session of one process, the gradients in buckets), which must
    /// train to the same losses as without it; `none` (default): no exchange.
    #[arg(long, default_value = "none")]
    exchange: String,
    /// Also serve the teacher with `xtoken serve` (in this process, on `--device`) and time the
    /// first variant's run fed by it at each of these top-K, with JSON and binary answers: the
    /// loader's student tokens/s, the step, and the answers' bytes per teacher token.
    #[arg(long, value_delimiter = ',')]
    served: Vec<usize>,
}

/// A varied synthetic corpus: prose with numerals, dates, amounts and code-like lines.
fn corpus(docs: usize) -> String {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let words = [
        "the",
        "model",
        "learns",
        "from",
        "a",
        "teacher",
        "whose",
        "tokenizer",
        "splits",
        "numbers",
        "into",
        "digits",
        "while",
        "student",
        "packs",
        "them",
        "and",
        "every",
        "step",
        "costs",
        "memory",
        "time",
        "for",
        "distillation",
        "across",
        "vocabularies",
    ];
    let mut out = String::new();
    for _ in 0..docs {
        let mut text = String::new();
        for s in 0..12 {
            for w in 0..10 {
                if w > 0 || s > 0 {
                    text.push(' ');
                }
                match next(7) {
                    0 => text.push_str(&next(100_000).to_string()),
                    1 => text.push_str(&format!("{}.{:02}", next(1000), next(100))),
                    _ => text.push_str(words[next(words.len() as u64) as usize]),
                }
            }
            text.push_str(if next(5) == 0 {
                ":\n    x = f(y, 42)\n"
            } else {
                "."
            });
        }
        out.push_str(&serde_json::json!({ "text": text }).to_string());
        out.push('\n');
    }
    out
}

/// `--json`: a JSON object with this benchmark's `runs`.
const OWN_JSON: Own<'static> = Own::File {
    what: "the JSON of `xtoken bench train`",
    is_own: |path| json_has(path, &["runs", "teacher_dtype"]),
};

/// The file that says which random model a work directory's model folder holds.
const MADE: &str = "xtoken-bench-model.json";

/// A model's vocabulary for a tokenizer of `vocab` tokens: padded to a multiple of 64, as
/// released checkpoints are.
fn padded(vocab: usize) -> usize {
    vocab.div_ceil(64) * 64
}

/// `body` at the tokenizer's width.
fn architecture(body: Body, tokenizer: &std::path::Path) -> Result<Architecture> {
    let json = xtoken_core::vocab::resolve_tokenizer_json(tokenizer)?;
    let vocab = xtoken_core::vocab::Vocabulary::load(&json)?.size();
    Ok(body.architecture(padded(vocab)))
}

/// What `--profile` sets each phase against: the step's shapes, and the limits of the device
/// (an H100's on CUDA; elsewhere this machine's CPU, measured).
struct Roofline {
    shape: StepShape,
    limits: Limits,
}

impl Roofline {
    fn new(args: &TrainBenchArgs, kind: DeviceKind) -> Result<Self> {
        let student = architecture(args.student, &args.student_tokenizer)?;
        let teacher = architecture(args.teacher, &args.teacher_tokenizer)?;
        let limits = match kind {
            DeviceKind::Cuda => Limits::h100(),
            _ => {
                eprintln!("measuring this machine's peak (a gemm and a copy, 2 s)");
                Limits::measure_cpu()
            }
        };
        let w_entries = student.vocab_size * 4;
        Ok(Self {
            shape: StepShape {
                student,
                batch: args.micro_batch,
                len: args.context,
                // The teacher's tokens per micro-batch are taken as the student's (their
                // tokenizers split text about alike).
                teachers: vec![TeacherShape {
                    name: body_name(args.teacher),
                    architecture: teacher,
                    tokens: args.micro_batch * args.context,
                }],
                top_k: args.top_k,
                compute_bytes: 4,
                w_entries,
            },
            limits,
        })
    }

    /// The shape with `compute`'s element size (`auto`: bf16 on CUDA, f32 elsewhere).
    fn for_compute(&self, compute: &str) -> StepShape {
        let mut shape = self.shape.clone();
        shape.compute_bytes = match compute {
            "bf16" | "f16" => 2,
            "auto" if self.limits == Limits::h100() => 2,
            _ => 4,
        };
        shape
    }
}

/// Writes a random model of `body` at the tokenizer's width into `dir`, or keeps the one a
/// previous run made there from the same body, tokenizer and seed (a `--work-dir` shared by
/// several runs makes each model once). Returns the seconds spent making it (0 when kept).
fn model_dir(
    dir: &std::path::Path,
    body: Body,
    tokenizer: &std::path::Path,
    seed: u64,
) -> Result<f64> {
    let json = xtoken_core::vocab::resolve_tokenizer_json(tokenizer)?;
    let vocab = xtoken_core::vocab::Vocabulary::load(&json)?.size();
    let arch = body.architecture(padded(vocab));
    let stamp = serde_json::json!({
        "body": body_name(body),
        "tokenizer": json.canonicalize()?.display().to_string(),
        "vocab": vocab,
        "seed": seed,
    })
    .to_string();
    if std::fs::read_to_string(dir.join(MADE)).ok().as_deref() == Some(stamp.as_str()) {
        eprintln!("keeping the random model in {}", dir.display());
        return Ok(0.0);
    }
    eprintln!(
        "writing a random model ({} parameters) into {}",
        arch.num_parameters(),
        dir.display()
    );
    let started = Instant::now();
    std::fs::remove_file(dir.join(MADE)).ok();
    let model = Transformer::<NdArray>::random(&arch, seed, DType::F32, &Default::default())?;
    model.save(dir, SaveDtype::BF16)?;
    std::fs::copy(&json, dir.join("tokenizer.json"))
        .with_context(|| format!("copying {}", json.display()))?;
    std::fs::write(dir.join(MADE), stamp)?;
    Ok(started.elapsed().as_secs_f64())
}

/// Configures cubecl before any device starts: the kernel cache and, for a profile, the
/// compilation log; says where the cache is.
fn cubecl_setup(profile: bool, work: &Path) {
    use xtoken_kernels::compilations::{configure, KernelCache, CACHE_VARIABLE};
    let log = work.join("cubecl-compilations.log");
    let cache = KernelCache::from_env();
    let done = configure(&cache, profile.then_some(log.as_path()));
    match (&cache, done.cache) {
        (KernelCache::Dir(dir), true) => {
            println!("Kernel cache: {} ({CACHE_VARIABLE}).\n", dir.display())
        }
        (KernelCache::Dir(dir), false) => {
            eprintln!("the kernel cache {} cannot be made", dir.display())
        }
        (KernelCache::Cubecl, _) => {
            println!("Kernel cache: cubecl's own ({CACHE_VARIABLE}=off, or no home directory).\n")
        }
    }
    if profile && !done.counting {
        eprintln!(
            "kernel compilations are not counted: cubecl's configuration logs them itself, \
             was read already, or {} cannot be written",
            log.display()
        );
    }
}

/// Runs the benchmark and prints a Markdown table.
pub fn run(args: TrainBenchArgs) -> Result<()> {
    alloc::enable();
    let work = args.work_dir_or_temp();
    let inputs = Inputs::new()
        .tokenizer("the student tokenizer", &args.student_tokenizer)
        .tokenizer("the teacher tokenizer", &args.teacher_tokenizer);
    if let Some(json) = &args.json {
        inputs.check(json, &OWN_JSON)?;
        Inputs::new().with("the --json file", json).refuse(&work)?;
    }
    claim_work_dir(&inputs, &work, "xtoken bench train")?;
    let kind: DeviceKind = args.device.parse()?;
    if !kind.on_host() {
        cubecl_setup(args.profile, &work);
    }
    let (student, teacher) = (work.join("student"), work.join("teacher"));
    let made = [
        model_dir(&student, args.student, &args.student_tokenizer, 1)?,
        model_dir(&teacher, args.teacher, &args.teacher_tokenizer, 2)?,
    ];
    println!(
        "Random models made in {:.1} s (student {:.1} s, teacher {:.1} s; 0: kept from the work directory).\n",
        made[0] + made[1],
        made[0],
        made[1]
    );
    let data = work.join("corpus.jsonl");
    let sequences = args.micro_batch * args.grad_accum.max(1);
    let docs = (sequences * args.context * (args.steps as usize + 1) / 150).max(8) + 4;
    std::fs::write(&data, corpus(docs))?;
    let mut rows = Vec::new();
    for variant in args.variants() {
        let run_dir = work.join(format!("run-{}-{}", variant.scope, variant.compute));
        remove_run(&run_dir)?;
        let config = RunConfig::parse(&config_text(&args, &work, &run_dir, &variant))?;
        let kind = config.device.parse()?;
        let steps = Steps {
            config,
            profile: args.profile,
        };
        let timed = on_backend(kind, &[], steps)?;
        rows.push((variant, timed));
    }
    print_table(&args, &rows);
    if !args.stored.is_empty() {
        stored_runs(&args, &work, &rows)?;
    }
    if !args.served.is_empty() {
        served_runs(&args, &work, &rows)?;
    }
    if let Some(fraction) = args.on_policy {
        print_writing(fraction, &rows);
    }
    if args.profile {
        let roofline = Roofline::new(&args, kind)?;
        println!("\nRoofline: {}.", roofline.limits.source);
        for (variant, timed) in &rows {
            println!("\n{}", profile_table(variant, timed, &roofline));
        }
    }
    if let Some(path) = &args.json {
        let mut report = report(&args, &rows);
        report["model_seconds"] = serde_json::json!({"student": made[0], "teacher": made[1]});
        let json = serde_json::to_string_pretty(&report)?;
        write_file(path, |tmp| Ok(std::fs::write(tmp, json)?))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.work_dir.is_none() {
        std::fs::remove_dir_all(&work).ok();
    }
    Ok(())
}

/// One timed run's settings among those the options list.
struct Variant {
    scope: String,
    compute: String,
}

/// The run configuration of one timed run on the models and corpus in `work`.
fn config_text(
    args: &TrainBenchArgs,
    work: &std::path::Path,
    run_dir: &std::path::Path,
    variant: &Variant,
) -> String {
    let (student, teacher, data) = (
        work.join("student"),
        work.join("teacher"),
        work.join("corpus.jsonl"),
    );
    let on_policy = match args.on_policy {
        Some(fraction) => format!(
            "[on_policy]\nfraction = {fraction}\nprompt_tokens = {}\nmax_new_tokens = {}\n",
            args.prompt_tokens, args.max_new_tokens
        ),
        None => String::new(),
    };
    let parallel = match args.exchange.as_str() {
        "none" => String::new(),
        other => format!("[parallel]\nexchange = {other:?}\n"),
    };
    format!(
        r#"
output_dir = {out:?}
device = {device:?}
[student]
model = {student:?}
[[teachers]]
name = {name:?}
model = {teacher:?}
loss = {loss:?}
dtype = {dtype:?}
[data]
path = {data:?}
[training]
steps = {steps}
batch_size = {batch}
micro_batch = {micro}
context_length = {context}
compute_dtype = {compute:?}
[loss]
top_k = {top_k}
scaling_scope = {scope:?}
{on_policy}{parallel}"#,
        out = run_dir.display().to_string(),
        device = args.device,
        student = student.display().to_string(),
        teacher = teacher.display().to_string(),
        name = body_name(args.teacher),
        loss = args.loss,
        dtype = args.teacher_dtype,
        data = data.display().to_string(),
        steps = args.steps + 1,
        batch = args.micro_batch * args.grad_accum.max(1),
        micro = args.micro_batch,
        context = args.context,
        top_k = args.top_k,
        scope = variant.scope,
        compute = variant.compute,
    )
}

/// One row per timed run; the step scope's time against each cheaper scope's, and each
/// compute dtype's against f32's, where both ran.
fn print_table(args: &TrainBenchArgs, rows: &[(Variant, Timed)]) {
    println!(
        "| device | student | teacher | loss | micro-batches × sequences × context | top-K | scaling scope | compute | s/step | student tokens/s | peak memory | `--check` estimate |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let name = |b: Body| match b {
        Body::Tiny => "tiny",
        Body::Llama100m => "100M",
        Body::Llama1b => "Llama-3.2-1B",
        Body::Qwen4b => "Qwen3-4B-sized",
    };
    for (variant, timed) in rows {
        let seconds: f64 = timed.seconds.iter().sum();
        let tokens: u64 = timed.tokens.iter().sum();
        println!(
            "| {} | {} | {} | {} | {} × {} × {} | {} | {} | {} | {:.3} | {:.0} | {:.2} GiB | {:.2} GiB ({:.2}×) |",
            args.device,
            name(args.student),
            name(args.teacher),
            args.loss,
            args.grad_accum.max(1),
            args.micro_batch,
            args.context,
            args.top_k,
            variant.scope,
            variant.compute,
            mean_of(&timed.seconds),
            tokens as f64 / seconds.max(1e-9),
            timed.peak_bytes as f64 / (1u64 << 30) as f64,
            timed.estimate_bytes as f64 / (1u64 << 30) as f64,
            timed.estimate_bytes as f64 / timed.peak_bytes.max(1) as f64
        );
    }
    let find = |scope: &str, compute: &str| {
        rows.iter()
            .find(|(v, _)| v.scope == scope && v.compute == compute)
            .map(|(_, t)| (mean_of(&t.seconds), t.peak_bytes))
    };
    for compute in &args.compute_dtype {
        for other in ["previous-step", "micro-batch"] {
            if let (Some(step), Some(cheap)) = (find("step", compute), find(other, compute)) {
                println!(
                    "\nstep scope / {other} scope ({compute}): {:.2}× the time per step",
                    step.0 / cheap.0.max(1e-12)
                );
            }
        }
    }
    for scope in &args.scaling_scope {
        for compute in args.compute_dtype.iter().filter(|c| *c != "f32") {
            if let (Some(mixed), Some(exact)) = (find(scope, compute), find(scope, "f32")) {
                println!(
                    "\n{compute} / f32 compute ({scope}): {:.2}× the time per step, {:.2}× the peak memory",
                    mixed.0 / exact.0.max(1e-12),
                    mixed.1 as f64 / exact.1.max(1) as f64
                );
            }
        }
    }
}

/// `--stored`: per dtype, the teacher's targets stored over the corpus and the first variant
/// run again reading them; a table of the store and of the step against the online teacher's.
fn stored_runs(args: &TrainBenchArgs, work: &Path, rows: &[(Variant, Timed)]) -> Result<()> {
    let Some((variant, online)) = rows.first() else {
        return Ok(());
    };
    println!(
        "\nStored teacher targets (`xtoken teach`, top-{}), against the online teacher ({} scope, {} compute):\n",
        args.top_k, variant.scope, variant.compute
    );
    println!("| dtype | bytes/token (stored) | bytes/token (layout) | teach tokens/s | teacher forward share of `teach` | loader student tokens/s (online: {:.0}) | × one H100's need ({NEED:.0}) | s/step stored | s/step online | stored / online |", loader_rate(&RunConfig::parse(&config_text(args, work, &work.join("run-loader"), variant))?, None)?);
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ceilings = Vec::new();
    for dtype in &args.stored {
        let store = work.join(format!("store-{dtype}"));
        remove_store(&store)?;
        let run_dir = work.join(format!("run-stored-{dtype}"));
        remove_run(&run_dir)?;
        let online_text = config_text(args, work, &run_dir, variant);
        let teach_text = format!(
            "{online_text}\n[teach]\ntop_k = {}\ndtype = {dtype:?}\n",
            args.top_k
        );
        let taught =
            xtoken_train::train::teach::teach_on_device(&RunConfig::parse(&teach_text)?, &store)?;
        let taught = taught.first().context("the teacher was not stored")?;
        let opened = xtoken_train::targets::store::Store::open(&taught.dir)?;
        let (bytes, top_k) = (opened.bytes(), opened.manifest.top_k);
        let model_line = format!("model = {:?}", work.join("teacher").display().to_string());
        let stored_line = format!("targets = {:?}", taught.dir.display().to_string());
        let stored_text = online_text.replacen(&model_line, &stored_line, 1);
        let config = RunConfig::parse(&stored_text)?;
        let kind = config.device.parse()?;
        let timed = on_backend(
            kind,
            &[],
            Steps {
                config,
                profile: false,
            },
        )?;
        let (stored_s, online_s) = (mean_of(&timed.seconds), mean_of(&online.seconds));
        let (loader, entry_bytes) = stored_loader_rate(&RunConfig::parse(&stored_text)?, opened)?;
        ceilings.push((dtype.clone(), loader, entry_bytes));
        let value_dtype = xtoken_train::config::ValueDtype::parse("--stored", dtype)?;
        println!(
            "| {dtype} | {:.0} | {} | {:.0} | {:.0} % | {loader:.0} | {:.1} | {stored_s:.3} | {online_s:.3} | {:.2}× |",
            bytes as f64 / taught.tokens.max(1) as f64,
            xtoken_train::targets::Manifest::bytes_per_token(top_k, value_dtype)
                .map_or("varies".into(), |b| b.to_string()),
            taught.tokens as f64 / taught.seconds.max(1e-9),
            100.0 * taught.forward_seconds / taught.seconds.max(1e-9),
            loader / NEED,
            stored_s / online_s.max(1e-12)
        );
    }
    // The merge writes each entry once and the upload reads it once: a loader that moves
    // nothing else still moves twice its entries' bytes per student token.
    let copy = copy_bandwidth();
    println!(
        "\nThis machine copies {:.1} GB/s (read + written). The loader's ceiling at that rate, \
         moving only its merged entries (written once, read once):\n",
        copy / 1e9
    );
    println!("| dtype | entries' bytes / student token | ceiling, student tokens/s | × one H100's need | measured / ceiling |");
    println!("|---|---:|---:|---:|---:|");
    for (dtype, loader, bytes) in ceilings {
        let ceiling = copy / (2.0 * bytes).max(1.0);
        println!(
            "| {dtype} | {bytes:.0} | {ceiling:.0} | {:.1} | {:.2} |",
            ceiling / NEED,
            loader / ceiling
        );
    }
    Ok(())
}

/// Removes the stores an earlier `--stored` run wrote under `dir` (one directory per teacher:
/// its manifest, the teacher's config.json and tokenizer.json, and its shards' files) and
/// nothing else: a file of the user's there stays, and `xtoken teach` then refuses the
/// directory, naming it.
fn remove_store(dir: &Path) -> Result<()> {
    let Ok(teachers) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for teacher in teachers.flatten().map(|e| e.path()) {
        if !teacher.join(xtoken_train::targets::MANIFEST).is_file() {
            continue;
        }
        let shards = teacher.join("shards");
        for file in std::fs::read_dir(&shards).into_iter().flatten().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.ends_with(".xtt") || name.contains(".xtt.xtoken-tmp-") {
                std::fs::remove_file(file.path())?;
            }
        }
        std::fs::remove_dir(&shards).ok();
        for name in [
            xtoken_train::targets::MANIFEST,
            "config.json",
            "tokenizer.json",
        ] {
            std::fs::remove_file(teacher.join(name)).ok();
        }
        std::fs::remove_dir(&teacher).ok();
    }
    std::fs::remove_dir(dir).ok();
    Ok(())
}

/// `--served`: the teacher served by `xtoken serve` in a thread of this process, and per top-K
/// the first variant run against it (JSON and binary answers) beside the same run with the
/// teacher in-process.
fn served_runs(args: &TrainBenchArgs, work: &Path, rows: &[(Variant, Timed)]) -> Result<()> {
    let Some((variant, _)) = rows.first() else {
        return Ok(());
    };
    let teacher = work.join("teacher");
    let mut options = xtoken_train::train::serve::ServeOptions::new(teacher.clone());
    options.name = Some("teacher".into());
    options.port = 0;
    options.max_logprobs = args.served.iter().copied().max().unwrap_or(20);
    options.device = args.device.clone();
    options.dtype =
        xtoken_train::config::DtypeChoice::parse("--teacher-dtype", &args.teacher_dtype, true)?;
    let address = xtoken_train::train::serve::serve_in_background(options)?;
    let url = format!("http://{address}/v1");
    println!(
        "
Served teacher (`xtoken serve` on {url}, {} device, in this process: it shares the cores with training), against the in-process teacher ({} scope, {} compute):
",
        args.device, variant.scope, variant.compute
    );
    println!("| top-K | answers | bytes / teacher token (wire) | loader student tokens/s (served) | s/step served | s/step in-process | served / in-process |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let model_line = format!("model = {:?}", teacher.display().to_string());
    for &k in &args.served {
        let run_dir = work.join(format!("run-served-{k}"));
        let with_k = |text: String| {
            text.replacen(
                &format!("\ntop_k = {}\n", args.top_k),
                &format!("\ntop_k = {k}\n"),
                1,
            )
        };
        remove_run(&run_dir)?;
        let online_text = with_k(config_text(args, work, &run_dir, variant));
        let online = timed_steps(RunConfig::parse(&online_text)?)?;
        remove_run(&run_dir)?;
        for binary in [false, true] {
            let served_line = format!(
                "server = {url:?}\nserved_model = \"teacher\"\ntokenizer = {:?}\nbinary_answers = {binary}\nrequests = 4",
                teacher.display().to_string()
            );
            let text = online_text.replacen(&model_line, &served_line, 1);
            let (loader, bytes) = served_loader_rate(&RunConfig::parse(&text)?)?;
            let timed = timed_steps(RunConfig::parse(&text)?)?;
            remove_run(&run_dir)?;
            let (served_s, online_s) = (mean_of(&timed.seconds), mean_of(&online.seconds));
            println!(
                "| {k} | {} | {bytes:.0} | {loader:.0} | {served_s:.3} | {online_s:.3} | {:.2}× |",
                if binary { "binary" } else { "JSON" },
                served_s / online_s.max(1e-12)
            );
        }
    }
    Ok(())
}

/// The steps of one run of `config`, timed.
fn timed_steps(config: RunConfig) -> Result<Timed> {
    let kind = config.device.parse()?;
    let steps = Steps {
        config,
        profile: false,
    };
    Ok(on_backend(kind, &[], steps)?)
}

/// The student tokens/s a run's loader delivers on its own once warm, fed by its served teacher,
/// and the answers' bytes per teacher token.
fn served_loader_rate(config: &RunConfig) -> Result<(f64, f64)> {
    let inputs = xtoken_train::train::inputs::RunInputs::load(config, false)?;
    let vocab = inputs.teacher_configs[0].architecture.vocab_size;
    let (served, _) = xtoken_train::train::teachers::connect_served(config, &inputs, 0)?;
    let served = std::sync::Arc::new(served);
    let host = xtoken_train::targets::HostTargets::Served(served.clone());
    let (rate, _) = loader_rate_of(config, &inputs, Some((host, vocab)))?;
    let (tokens, bytes, _, _) = served.stats.read();
    Ok((rate, bytes as f64 / tokens.max(1) as f64))
}

/// Seconds a loader runs before its rate is measured, and seconds it is measured over (long
/// enough to take in the stream's bursts of work as it tops its queue up).
const LOADER_WARM_UP_S: f64 = 10.0;
const LOADER_MEASURED_S: f64 = 10.0;

/// Student tokens/s one H100 trains at in the PyTorch eager step this project measures against
/// (1B student, 4B teacher, 4096 tokens).
const NEED: f64 = 11_600.0;

/// The student tokens/s a run's loader delivers on its own once warm ([`LOADER_WARM_UP_S`]),
/// with `store` merged for its teacher.
fn loader_rate(
    config: &RunConfig,
    store: Option<xtoken_train::targets::store::Store>,
) -> Result<f64> {
    let inputs = xtoken_train::train::inputs::RunInputs::load(config, false)?;
    let vocab = inputs.teacher_configs[0].architecture.vocab_size;
    let stored = store.map(|s| xtoken_train::targets::HostTargets::Stored(std::sync::Arc::new(s)));
    Ok(loader_rate_of(config, &inputs, stored.map(|s| (s, vocab)))?.0)
}

/// The loader's rate with a store, and the bytes of merged entries (a `u32` id and an `f32`
/// value each) it hands over per student token.
fn stored_loader_rate(
    config: &RunConfig,
    store: xtoken_train::targets::store::Store,
) -> Result<(f64, f64)> {
    let inputs = xtoken_train::train::inputs::RunInputs::load(config, false)?;
    let vocab = inputs.teacher_configs[0].architecture.vocab_size;
    let stored = xtoken_train::targets::HostTargets::Stored(std::sync::Arc::new(store));
    loader_rate_of(config, &inputs, Some((stored, vocab)))
}

/// Bytes/s this machine copies (read and written) between buffers larger than its caches: the
/// ceiling of a loader that moves entries.
fn copy_bandwidth() -> f64 {
    let from = vec![1u8; 256 << 20];
    let mut to = vec![0u8; 256 << 20];
    to.copy_from_slice(&from);
    let started = Instant::now();
    for _ in 0..4 {
        to.copy_from_slice(&from);
        std::hint::black_box(&mut to);
    }
    2.0 * 4.0 * from.len() as f64 / started.elapsed().as_secs_f64()
}

/// The student tokens/s a run's loader delivers on its own once warm ([`LOADER_WARM_UP_S`]),
/// with `host`'s entries merged for its teacher.
fn loader_rate_of(
    config: &RunConfig,
    inputs: &xtoken_train::train::inputs::RunInputs,
    host: Option<(xtoken_train::targets::HostTargets, usize)>,
) -> Result<(f64, f64)> {
    let mut loader = xtoken_train::train::run::open_loader(config, inputs, vec![host])?;
    loader.next_step()?;
    // Until the stream's workers have filled their queue (batches of up to 1 MiB of text,
    // `data.prefetch` of them ahead), they take the cores the merge would use: the rate of a
    // long run is the one after that.
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < LOADER_WARM_UP_S {
        loader.next_step()?;
    }
    let (started, mut tokens, mut bytes) = (Instant::now(), 0usize, 0usize);
    while started.elapsed().as_secs_f64() < LOADER_MEASURED_S {
        let step = loader.next_step()?;
        tokens += step.micro.iter().map(|m| m.tokens).sum::<usize>();
        let stored = step.micro.iter().flat_map(|m| &m.teachers);
        bytes += stored
            .filter_map(|t| t.stored.as_ref())
            .map(|e| 4 * e.ids.len() + 4 * e.logp.len())
            .sum::<usize>();
    }
    let rate = tokens as f64 / started.elapsed().as_secs_f64();
    Ok((rate, bytes as f64 / tokens.max(1) as f64))
}

/// The student's writing against the step, per timed run (`--on-policy`).
fn print_writing(fraction: f64, rows: &[(Variant, Timed)]) {
    println!(
        "\nOn-policy, λ = {fraction}: the student writes its sequences before each step (key/value cache, sampling, then every teacher tokenizes and aligns the text).\n"
    );
    println!("| scaling scope | compute | sequences written per step | tokens written per sequence | writing, tokens/s | writing, s/step | share of the step |");
    println!("|---|---|---|---|---|---|---|");
    for (variant, timed) in rows {
        let (seconds, tokens, sequences) = timed
            .writing
            .iter()
            .fold((0.0, 0.0, 0.0), |a, w| (a.0 + w.0, a.1 + w.1, a.2 + w.2));
        let steps = timed.writing.len().max(1) as f64;
        let step: f64 = timed.seconds.iter().sum();
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.0} | {:.3} | {:.1} % |",
            variant.scope,
            variant.compute,
            sequences / steps,
            tokens / sequences.max(1.0),
            tokens / seconds.max(1e-9),
            seconds / steps,
            100.0 * seconds / step.max(1e-12)
        );
    }
}

impl TrainBenchArgs {
    /// Every scaling scope with every compute dtype.
    fn variants(&self) -> Vec<Variant> {
        self.scaling_scope
            .iter()
            .flat_map(|scope| {
                self.compute_dtype.iter().map(|compute| Variant {
                    scope: scope.clone(),
                    compute: compute.clone(),
                })
            })
            .collect()
    }

    fn work_dir_or_temp(&self) -> PathBuf {
        self.work_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("xtoken-bench-train-{}", std::process::id()))
        })
    }
}

/// The timed steps of a run (the warm-up step left out).
struct Timed {
    seconds: Vec<f64>,
    tokens: Vec<u64>,
    peak_bytes: u64,
    /// One device's memory as `xtoken train --check` estimates it.
    estimate_bytes: u64,
    /// The warm-up step's wall time.
    first_seconds: f64,
    /// Every step's phases, the warm-up step first (with `--profile`).
    profiles: Vec<StepProfile>,
    /// Every step's loss, the warm-up step's first: two builds or dtypes train alike when these
    /// agree.
    losses: Vec<f64>,
    /// Per timed step with `--on-policy`: the seconds the student spent writing, the tokens it
    /// wrote, and the sequences it wrote.
    writing: Vec<(f64, f64, f64)>,
}

/// A run's steps on the backend its configuration names, one warm-up step first; no
/// checkpoints and no exported student.
struct Steps {
    config: RunConfig,
    profile: bool,
}

fn heap_peak() -> u64 {
    alloc::peak().max(0) as u64
}

impl OnBackend for Steps {
    type Output = Timed;

    fn run<B: TrainBackend + DeviceMemory>(
        self,
        mut devices: Vec<B::Device>,
    ) -> xtoken_train::Result<Timed> {
        let device = devices.remove(0);
        let kind = self.config.device.parse()?;
        match self.config.exchange_choice()?.resolve(kind, 1)? {
            None => self.timed::<B>(device, Worker::alone()),
            Some(exchange) => self.through::<B>(exchange, device),
        }
    }
}

impl Steps {
    /// The steps of one worker that sums through `exchange` all the same: a session of one
    /// process (which carries NCCL's id) and its one worker.
    fn through<B: TrainBackend + DeviceMemory>(
        self,
        exchange: ExchangeKind,
        device: B::Device,
    ) -> xtoken_train::Result<Timed> {
        let placement = Placement {
            rank: 0,
            world: 1,
            local_rank: 0,
            master: "127.0.0.1".into(),
            port: free_port_pair()?,
            launcher: "bench train",
        };
        let plan = Plan {
            workers: 1,
            hash: 0,
        };
        let (session, nodes) = join_as_node(&placement, plan, Timeouts::from_env()?, exchange)?;
        let settings = ExchangeSettings {
            kind: exchange,
            bucket_bytes: self.config.bucket_bytes(),
        };
        let mut timed = run_workers::<B, _, _>(vec![device], Some(&nodes), settings, |w, d| {
            let steps = Steps {
                config: self.config.clone(),
                profile: self.profile,
            };
            steps.timed::<B>(d, w)
        })?;
        session.finish(0)?;
        timed
            .pop()
            .ok_or_else(|| xtoken_train::Error::Parallel("no worker ended".into()))
    }

    fn timed<B: TrainBackend + DeviceMemory>(
        self,
        device: B::Device,
        worker: Worker,
    ) -> xtoken_train::Result<Timed> {
        let options = RunOptions {
            skip_memory_check: true,
            ..RunOptions::default()
        };
        let rows = self.config.training.batch_size as f64;
        let mut run = Run::<B>::open(self.config, &options, device.clone(), worker)?;
        let estimate_bytes = run.memory_estimate().total();
        if self.profile {
            profile::record(Some(HostMemory {
                reset_peak: alloc::reset_peak,
                peak_bytes: heap_peak,
            }));
        }
        let start = Instant::now();
        let first = run.step()?;
        let first_seconds = start.elapsed().as_secs_f64();
        alloc::reset_peak();
        let mut timed = Timed {
            seconds: Vec::new(),
            tokens: Vec::new(),
            peak_bytes: 0,
            estimate_bytes,
            first_seconds,
            profiles: Vec::new(),
            losses: vec![first.loss],
            writing: Vec::new(),
        };
        while !run.done() {
            let (start, before) = (Instant::now(), run.state().tokens);
            let step = run.step()?;
            timed.losses.push(step.loss);
            if let Some(on) = step.on_policy {
                let sequences = on.share * rows;
                timed
                    .writing
                    .push((on.seconds, on.generated * sequences, sequences));
            }
            timed.seconds.push(start.elapsed().as_secs_f64());
            timed.tokens.push(run.state().tokens - before);
        }
        timed.profiles = profile::finish();
        timed.peak_bytes = match B::reserved_bytes(&device) {
            Some(bytes) => bytes,
            // The profile restarts the high-water mark at each phase: its phases hold it.
            None if self.profile => timed.profiles[1..]
                .iter()
                .flat_map(|p| &p.phases)
                .map(|p| p.memory_bytes)
                .max()
                .unwrap_or(0),
            None => heap_peak(),
        };
        Ok(timed)
    }
}

/// The phases of the steps after the first, each the mean over those steps (memory: the
/// largest; kernel compilations: their total, since any after the first step is worth seeing).
fn mean_phases(steps: &[StepProfile]) -> StepProfile {
    let mut mean = StepProfile::default();
    steps
        .iter()
        .flat_map(|step| &step.phases)
        .for_each(|p| mean.absorb(p));
    let n = steps.len().max(1) as f64;
    for m in &mut mean.phases {
        m.seconds /= n;
        m.count = (m.count as f64 / n).round() as u32;
    }
    mean
}

/// The profile of one run as Markdown: the first step, the mean of the next, and how much of
/// the measured step the phases account for.
fn profile_table(variant: &Variant, timed: &Timed, roofline: &Roofline) -> String {
    let Some((first, rest)) = timed.profiles.split_first() else {
        return String::new();
    };
    let mean = mean_phases(rest);
    let step = mean_of(&timed.seconds);
    let shape = roofline.for_compute(&variant.compute);
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut out = format!(
        "Phases (scaling scope {}, compute {}): first step {:.3} s, then {:.3} s per step\n\n\
         | phase | runs | first step (s) | next steps, mean (s) | share | memory in use (GiB) | kernels compiled: first step, next steps | GFLOP | GB moved | at the roofline (s) | measured / roofline |\n\
         |---|---|---|---|---|---|---|---:|---:|---:|---:|\n",
        variant.scope, variant.compute, timed.first_seconds, step
    );
    let counted = first.phases.iter().any(|p| p.compilations.is_some());
    let compiled_in = |profile: &StepProfile, name: &str| match counted {
        false => "—".to_string(),
        true => profile
            .phase(name)
            .and_then(|p| p.compilations)
            .unwrap_or(0)
            .to_string(),
    };
    let seconds_in =
        |profile: &StepProfile, name: &str| profile.phase(name).map_or(0.0, |p| p.seconds);
    let names = first
        .phases
        .iter()
        .chain(&mean.phases)
        .map(|p: &Phase| &p.name);
    let mut seen: Vec<&String> = Vec::new();
    for name in names {
        if seen.contains(&name) {
            continue;
        }
        seen.push(name);
        let p = mean
            .phases
            .iter()
            .chain(&first.phases)
            .find(|p| &p.name == name);
        let (runs, memory) = p.map(|p| (p.count, p.memory_bytes)).unwrap_or((0, 0));
        let next = seconds_in(&mean, name);
        let roof = match shape.work(name) {
            Some(work) => {
                let at = roofline.limits.seconds(work) * f64::from(runs.max(1));
                format!(
                    "{:.1} | {:.2} | {:.4} | {:.1}×",
                    work.flops * f64::from(runs.max(1)) / 1e9,
                    work.bytes * f64::from(runs.max(1)) / 1e9,
                    at,
                    next / at.max(1e-12)
                )
            }
            None => "— | — | — | —".into(),
        };
        out += &format!(
            "| {name} | {runs} | {:.4} | {:.4} | {:.1} % | {:.2} | {}, {} | {roof} |\n",
            seconds_in(first, name),
            next,
            100.0 * next / step.max(1e-12),
            gib(memory),
            compiled_in(first, name),
            compiled_in(&mean, name),
        );
    }
    out += &format!(
        "\nThe phases add up to {:.1} % of the first step and {:.1} % of the next.\n",
        100.0 * first.seconds() / timed.first_seconds.max(1e-12),
        100.0 * mean.seconds() / step.max(1e-12)
    );
    out + &compiled_later(rest)
}

/// The kernels compiled after the first step, by step and phase: each is a step that waited on
/// a compiler (a shape or variant the first step did not launch).
fn compiled_later(rest: &[StepProfile]) -> String {
    let mut out = String::new();
    for (i, step) in rest.iter().enumerate() {
        for phase in step.phases.iter().filter(|p| !p.kernels.is_empty()) {
            // cubecl names a kernel by its type path; the last segments say which.
            let short: Vec<_> = phase.kernels.iter().map(|k| short_kernel(k)).collect();
            out += &format!("- step {}, {}: {}\n", i + 2, phase.name, short.join(", "));
        }
    }
    match out.is_empty() {
        true => out,
        false => format!("\nKernels compiled after the first step:\n\n{out}"),
    }
}

/// `module::kernel::Kernel` of a kernel's type path.
fn short_kernel(path: &str) -> &str {
    let cut = path.rmatch_indices("::").nth(1).map_or(0, |(i, _)| i + 2);
    &path[cut..]
}

fn mean_of(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// The results as JSON: the settings, and per timed run the steps and their phases.
fn report(args: &TrainBenchArgs, rows: &[(Variant, Timed)]) -> serde_json::Value {
    let runs: Vec<_> = rows
        .iter()
        .map(|(variant, timed)| {
            let mut run = serde_json::json!({
                "scaling_scope": variant.scope,
                "compute_dtype": variant.compute,
                "first_step_seconds": timed.first_seconds,
                "step_seconds": timed.seconds,
                "mean_step_seconds": mean_of(&timed.seconds),
                "student_tokens": timed.tokens,
                "losses": timed.losses,
                "writing": timed.writing.iter().map(|w| serde_json::json!({
                    "seconds": w.0, "tokens": w.1, "sequences": w.2,
                })).collect::<Vec<_>>(),
                "peak_memory_bytes": timed.peak_bytes,
                "estimated_memory_bytes": timed.estimate_bytes,
            });
            if let Some((first, rest)) = timed.profiles.split_first() {
                run["profile"] = serde_json::json!({
                    "first_step": first,
                    "next_steps_mean": mean_phases(rest),
                    "next_steps": rest,
                });
            }
            run
        })
        .collect();
    serde_json::json!({
        "device": args.device,
        "student": body_name(args.student),
        "teacher": body_name(args.teacher),
        "loss": args.loss,
        "context": args.context,
        "micro_batch": args.micro_batch,
        "grad_accum": args.grad_accum.max(1),
        "top_k": args.top_k,
        "teacher_dtype": args.teacher_dtype,
        "on_policy": args.on_policy,
        "exchange": args.exchange,
        "runs": runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(name: &str, kernels: &[&str]) -> Phase {
        Phase {
            name: name.into(),
            seconds: 0.0,
            count: 1,
            memory_bytes: 0,
            compilations: Some(kernels.len() as u64),
            kernels: kernels.iter().map(|k| k.to_string()).collect(),
        }
    }

    /// The kernels a later step compiled are listed by step and phase, by their last two path
    /// segments; nothing is listed when none was compiled.
    #[test]
    fn later_compilations_are_named_by_step_and_phase() {
        let quiet = StepProfile {
            phases: vec![phase("loss: CE", &[])],
        };
        assert_eq!(compiled_later(std::slice::from_ref(&quiet)), "");
        let loud = StepProfile {
            phases: vec![
                phase("loss: CE", &[]),
                phase(
                    "student: backward",
                    &["burn_cubecl_fusion::optim::elemwise::ElemwiseFuse", "Plain"],
                ),
            ],
        };
        assert_eq!(
            compiled_later(&[quiet, loud]),
            "\nKernels compiled after the first step:\n\n\
             - step 3, student: backward: elemwise::ElemwiseFuse, Plain\n"
        );
    }
}
