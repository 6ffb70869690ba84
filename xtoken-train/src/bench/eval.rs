//! `xtoken bench eval`: `xtoken eval`'s throughput on a random model of a real shape (default
//! Llama-3.2-1B's) with a real tokenizer, on the 3-shot prompts of local task files: documents/s
//! per task, and greedy generation with the key/value cache against recomputing every position
//! at each step (the same prompts and tokens, measured in the same run); and the scoring of
//! log-probabilities at the model's vocabulary width against burn's `log_softmax`, in time and
//! in error against f64.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::backend::NdArray;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use clap::Args;
use tokenizers::Tokenizer;
use xtoken_kernels::XTokenBackend;
use xtoken_models::{token_log_probs, Decoding, Transformer};
use xtoken_train::data::rng::{unit, SplitMix64};
use xtoken_train::harness::model::{read_tokenizer, Scorable, SpecialTokens};
use xtoken_train::harness::task::{prompts, PromptSettings, Request};
use xtoken_train::harness::{answer, task_dir, tasks};

use super::forward::{DeviceArg, Preset};
use crate::cli::models::DtypeArg;
use xtoken_train::backend;
use xtoken_train::config::DeviceKind;

/// Options of `xtoken bench eval`.
#[derive(Args)]
pub struct EvalBenchArgs {
    #[arg(long, value_enum, default_value_t = Preset::Llama1b)]
    preset: Preset,
    /// The tokenizer (a directory with tokenizer.json, or the file): Llama-3.2's for the 1B
    /// shape.
    #[arg(long)]
    tokenizer: PathBuf,
    /// Task files, as `xtoken eval --data` (the test fixtures will do).
    #[arg(long)]
    data: PathBuf,
    /// Tasks timed, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mmlu,hellaswag,winogrande,gsm8k"
    )]
    tasks: Vec<String>,
    /// Documents per task (per subject) at most.
    #[arg(long, default_value_t = 2)]
    limit: usize,
    /// Sequences per forward pass.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Tokens generated per GSM8k document, and per prompt in the KV cache comparison.
    #[arg(long, default_value_t = 16)]
    new_tokens: usize,
    /// Prompt tokens (the last ones of GSM8k's prompts) in the KV cache comparison.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    dtype: DtypeArg,
}

pub fn run(args: EvalBenchArgs) -> Result<()> {
    if args.batch == 0 || args.new_tokens == 0 || args.prompt_tokens == 0 {
        bail!("--batch, --new-tokens and --prompt-tokens must be positive");
    }
    match args.device {
        DeviceArg::Ndarray => run_on::<NdArray>(&args, &Default::default(), "CPU (ndarray)"),
        DeviceArg::Cpu | DeviceArg::Flex => {
            run_on::<burn_flex::Flex>(&args, &Default::default(), "CPU (flex)")
        }
        #[cfg(feature = "cuda")]
        DeviceArg::Cuda => {
            let device = Default::default();
            backend::start::<burn::backend::Cuda>(DeviceKind::Cuda, std::slice::from_ref(&device))?;
            run_on::<burn::backend::Cuda>(&args, &device, "CUDA")
        }
        #[cfg(not(feature = "cuda"))]
        DeviceArg::Cuda => Ok(backend::check_available(DeviceKind::Cuda)?),
        #[cfg(feature = "wgpu")]
        DeviceArg::Wgpu => {
            let device = Default::default();
            backend::start::<burn::backend::Wgpu>(DeviceKind::Wgpu, std::slice::from_ref(&device))?;
            run_on::<burn::backend::Wgpu>(&args, &device, "wgpu")
        }
        #[cfg(not(feature = "wgpu"))]
        DeviceArg::Wgpu => Ok(backend::check_available(DeviceKind::Wgpu)?),
    }
}

fn run_on<B: XTokenBackend>(args: &EvalBenchArgs, device: &B::Device, place: &str) -> Result<()> {
    let architecture = args.preset.architecture();
    let model = Transformer::<B>::random(&architecture, 0, args.dtype.dtype(), device)?;
    let tokenizer = read_tokenizer(&args.tokenizer)?;
    let scorable = Scorable {
        model: &model,
        tokenizer: &tokenizer,
        special: SpecialTokens::default(),
        batch: args.batch,
        max_gen_toks: args.new_tokens,
        use_cache: true,
    };
    let settings = PromptSettings {
        shots: 3,
        seed: 1234,
        limit: Some(args.limit),
    };
    eprintln!(
        "{} ({} parameters, {}) on {place}, batch {}",
        args.preset.name(),
        architecture.num_parameters(),
        args.dtype.name(),
        args.batch
    );
    // One untimed pass first: a GPU compiles and autotunes its kernels on first use.
    warm_up(&scorable)?;
    normaliser::<B>(architecture.vocab_size, args.batch * 16, device)?;
    println!("| Task (3-shot) | Documents | Requests | Prompt tokens | s | Documents/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut gsm8k_contexts = Vec::new();
    for name in &args.tasks {
        let task = tasks::named(name)?;
        let items = prompts(
            task.as_ref(),
            &task_dir(&args.data, task.as_ref())?,
            &settings,
        )?;
        let requests: Vec<&Request> = items.iter().map(|i| &i.request).collect();
        let (count, tokens) = request_size(&tokenizer, &requests)?;
        let start = Instant::now();
        answer(&scorable, name, &requests)?;
        let seconds = start.elapsed().as_secs_f64();
        println!(
            "| {name} | {} | {count} | {tokens} | {seconds:.2} | {:.3} |",
            items.len(),
            items.len() as f64 / seconds
        );
        if name == "gsm8k" {
            gsm8k_contexts = requests
                .iter()
                .filter_map(|r| match r {
                    Request::Generate { context, .. } => Some(context.clone()),
                    Request::Choice { .. } => None,
                })
                .collect();
        }
    }
    if gsm8k_contexts.is_empty() {
        return Ok(());
    }
    generation(&model, &tokenizer, &gsm8k_contexts, args)
}

fn warm_up<B: XTokenBackend>(scorable: &Scorable<'_, B>) -> Result<()> {
    let pairs = vec![("Warm up".to_string(), " once".to_string())];
    scorable.loglikelihoods(&pairs, |_| {})?;
    let generate = vec![("Warm up".to_string(), Vec::new())];
    scorable.generate(&generate, |_| {})?;
    Ok(())
}

/// Scoring's log-probabilities of `rows` rows of `vocab` logits spread as trained models' are:
/// burn's `log_softmax` then a gather (the anchor) against [`token_log_probs`], each timed and
/// compared with an f64 log-softmax of the same f32 logits.
fn normaliser<B: XTokenBackend>(vocab: usize, rows: usize, device: &B::Device) -> Result<()> {
    let mut random = SplitMix64(61);
    let mut logits = Vec::with_capacity(rows * vocab);
    let mut tokens = Vec::with_capacity(rows);
    for row in 0..rows {
        // Spreads σ of 1, 2 and 4, and a row whose top token stands 15 above the rest.
        let (sigma, peak) = [(1.0, 0.0), (2.0, 0.0), (4.0, 0.0), (1.0, 15.0)][row % 4];
        for _ in 0..vocab {
            let (u, v) = (unit(random.next_u64()).max(1e-300), unit(random.next_u64()));
            let normal = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            logits.push((normal * sigma) as f32);
        }
        let token = random.below(vocab as u64) as u32;
        logits[row * vocab + token as usize] += peak as f32;
        tokens.push(token);
    }
    let exact: Vec<f64> = tokens
        .iter()
        .enumerate()
        .map(|(row, &token)| {
            let z = &logits[row * vocab..(row + 1) * vocab];
            let max = z.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
            let sum: f64 = z.iter().map(|&x| (x as f64 - max).exp()).sum();
            z[token as usize] as f64 - max - sum.ln()
        })
        .collect();
    let tensor = Tensor::<B, 2>::from_data(TensorData::new(logits, [rows, vocab]), device);
    let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, 1]), device);
    println!(
        "| Log-probabilities of {rows} rows × {vocab} | ms | × | max \\|error\\| | mean error |"
    );
    println!("|---|---:|---:|---:|---:|");
    let score = |plain: bool| -> Result<Vec<f64>> {
        Ok(match plain {
            true => log_softmax(tensor.clone(), 1)
                .gather(1, ids.clone())
                .into_data()
                .convert::<f64>()
                .into_vec()
                .map_err(|e| anyhow::anyhow!("{e:?}"))?,
            false => token_log_probs(tensor.clone(), &tokens)?.log_probs,
        })
    };
    // Alternated three times; the fastest of each.
    let mut best = [f64::INFINITY; 2];
    let mut found = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (i, plain) in [true, false].into_iter().enumerate() {
            let start = Instant::now();
            found[i] = score(plain)?;
            best[i] = best[i].min(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let labels = ["`log_softmax`, then a gather (anchor)", "`token_log_probs`"];
    for ((label, ms), found) in labels.iter().zip(best).zip(&found) {
        let errors: Vec<f64> = found.iter().zip(&exact).map(|(f, e)| f - e).collect();
        let worst = errors.iter().fold(0.0f64, |m, e| m.max(e.abs()));
        let mean = errors.iter().sum::<f64>() / rows as f64;
        println!(
            "| {label} | {ms:.1} | {:.2} | {worst:.1e} | {mean:+.1e} |",
            best[0] / ms
        );
    }
    println!();
    Ok(())
}

/// Requests (choices count one each) and the prompt tokens they hold.
fn request_size(tokenizer: &Tokenizer, requests: &[&Request]) -> Result<(usize, usize)> {
    let mut count = 0;
    let mut tokens = 0;
    let length = |text: &str| -> Result<usize> {
        let encoding = tokenizer
            .encode(text, true)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(encoding.len())
    };
    for request in requests {
        match request {
            Request::Choice { pairs } => {
                count += pairs.len();
                for (context, continuation) in pairs {
                    tokens += length(&format!("{context}{continuation}"))?;
                }
            }
            Request::Generate { context, .. } => {
                count += 1;
                tokens += length(context)?;
            }
        }
    }
    Ok((count, tokens))
}

/// Greedy decoding of GSM8k's prompts (their last `prompt_tokens`), a fixed number of tokens,
/// with the cache and by recomputation.
fn generation<B: XTokenBackend>(
    model: &Transformer<B>,
    tokenizer: &Tokenizer,
    contexts: &[String],
    args: &EvalBenchArgs,
) -> Result<()> {
    let prompts = contexts
        .iter()
        .map(|context| {
            let ids = tokenizer
                .encode(context.as_str(), true)
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("tokenizing a GSM8k prompt")?
                .get_ids()
                .to_vec();
            Ok(ids[ids.len().saturating_sub(args.prompt_tokens)..].to_vec())
        })
        .collect::<Result<Vec<_>>>()?;
    let new_tokens = prompts.len() * args.new_tokens;
    println!(
        "\n| Greedy generation ({} prompts of ≤ {} tokens, {} new each, batch {}) | s | New tokens/s | × |",
        prompts.len(),
        args.prompt_tokens,
        args.new_tokens,
        args.batch
    );
    println!("|---|---:|---:|---:|");
    let mut anchor = None;
    let mut outputs = Vec::new();
    for (label, use_cache) in [
        ("recomputing every position (anchor)", false),
        ("KV cache", true),
    ] {
        let settings = Decoding {
            max_new_tokens: args.new_tokens,
            use_cache,
        };
        let start = Instant::now();
        let mut generated = Vec::new();
        for batch in prompts.chunks(args.batch) {
            generated.extend(model.generate_greedy(batch, settings, |_, _| false)?);
        }
        let seconds = start.elapsed().as_secs_f64();
        let anchor = *anchor.get_or_insert(seconds);
        println!(
            "| {label} | {seconds:.2} | {:.2} | {:.2} |",
            new_tokens as f64 / seconds,
            anchor / seconds
        );
        outputs.push(generated);
    }
    if outputs[0] != outputs[1] {
        bail!("the KV cache generated other tokens than recomputation");
    }
    Ok(())
}
