//! `xtoken bench forward`: tokens/s and peak memory of a random Llama-shaped model: inference
//! forward, and a training step (forward + backward of next-token cross-entropy) with and
//! without activation checkpointing per decoder layer. `--attention both` instead times the
//! inference forward and the training step with the tiled attention and with burn's, and
//! prints their ratios (one layer
//! and a small vocabulary, `--layers 1 --vocab 256`, isolate a layer). `--families` times the
//! inference forward and the training step of each model family at the preset's size, against
//! Llama's in the same run. On CPU (ndarray) the peak
//! is the heap the counting allocator saw above the weights; on CUDA and wgpu (`--features
//! cuda` or `wgpu`, `--device cuda|wgpu`) it is the memory the device pools reserved, weights
//! included.

use std::time::Instant;

use anyhow::{bail, Result};
use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use clap::{Args, ValueEnum};
use xtoken_kernels::memory::DeviceMemory;
use xtoken_kernels::XTokenBackend;
use xtoken_models::rope::RopeScaling;
use xtoken_models::{
    Architecture, AttentionKernel, CausalLm, Family, ModelError, Tokens, Transformer,
};

use super::alloc;
use crate::cli::models::DtypeArg;
use xtoken_train::backend;
use xtoken_train::config::DeviceKind;

#[derive(Clone, Copy, ValueEnum)]
pub enum Preset {
    /// A dry run's: vocab 32,000, hidden 64, 2 layers, 4 heads (2 KV), MLP 128, tied.
    Tiny,
    /// ~100M parameters: vocab 32,000, hidden 768, 12 layers, 12 heads (4 KV), MLP 2048, tied.
    Llama100m,
    /// Llama-3.2-1B's shape: vocab 128,256, hidden 2048, 16 layers, 32 heads (8 KV), MLP 8192.
    Llama1b,
}

impl Preset {
    pub(crate) fn architecture(self) -> Architecture {
        match self {
            Preset::Tiny => Architecture::llama(32_000, 64, 128, 2, 4, 2),
            Preset::Llama100m => Architecture::llama(32_000, 768, 2048, 12, 12, 4),
            Preset::Llama1b => {
                let mut arch = Architecture::llama(128_256, 2048, 8192, 16, 32, 8);
                arch.rope.scaling = RopeScaling::Llama3 {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                };
                arch
            }
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny Llama-shaped",
            Preset::Llama100m => "Llama-shaped 100M",
            Preset::Llama1b => "Llama-3.2-1B-shaped",
        }
    }
}

/// Options of `xtoken bench forward`.
#[derive(Args)]
pub struct ForwardBenchArgs {
    #[arg(long, value_enum, default_value_t = Preset::Llama100m)]
    preset: Preset,
    /// Sequences per step.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    len: usize,
    /// Timed steps per pass (after one untimed warm-up step).
    #[arg(long, default_value_t = 2)]
    steps: usize,
    /// Where to run: `ndarray` or `flex` (CPU), or `cuda` in a build with `--features cuda`.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Parameter dtype (`bf16` and `f16` need a backend that has them: flex, CUDA).
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    dtype: DtypeArg,
    /// Decoder layers, instead of the preset's.
    #[arg(long)]
    layers: Option<usize>,
    /// Vocabulary size, instead of the preset's (a small one takes the output head out of the
    /// figures).
    #[arg(long)]
    vocab: Option<usize>,
    /// The attention of the passes: `auto` (the tiled one for training where the backend runs
    /// it, burn's otherwise), `tiled`, `burn`, or `both` (the training step with each, and
    /// their ratios).
    #[arg(long, value_enum, default_value_t = AttentionArg::Auto)]
    attention: AttentionArg,
    /// Untimed steps before the timed ones.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Time these families at the preset's size (`llama` first, the anchor, whether named or
    /// not), each with its own switches on: comma-separated `model_type`s (`llama`, `mistral`,
    /// `qwen2`, `qwen3`, `phi3`, `gemma2`, `gemma3_text`).
    #[arg(long, value_delimiter = ',')]
    families: Vec<String>,
    /// The sliding window of the families that have one, with `--families` (default: a quarter
    /// of `--len`, so that it acts).
    #[arg(long)]
    window: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AttentionArg {
    Auto,
    Tiled,
    Burn,
    Both,
}

impl AttentionArg {
    fn kernel(self) -> AttentionKernel {
        match self {
            AttentionArg::Auto | AttentionArg::Both => AttentionKernel::Auto,
            AttentionArg::Tiled => AttentionKernel::Tiled,
            AttentionArg::Burn => AttentionKernel::Burn,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The CPU: burn-flex, as `xtoken train --device cpu`.
    Cpu,
    /// burn's ndarray, as published (f32 only).
    Ndarray,
    /// burn-flex: the CPU with f16 and bf16 (the same backend as `cpu`).
    Flex,
    Cuda,
    /// burn's wgpu backend (Vulkan, Metal; Mesa lavapipe on a machine without a GPU).
    Wgpu,
}

struct Row {
    pass: String,
    seconds: f64,
    peak: usize,
}

pub fn run(args: ForwardBenchArgs) -> Result<()> {
    alloc::enable();
    if args.batch == 0 || args.len < 2 || args.steps == 0 {
        bail!("--batch and --steps must be positive and --len at least 2");
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

fn run_on<B: DeviceMemory + XTokenBackend>(
    args: &ForwardBenchArgs,
    device: &B::Device,
    place: &str,
) -> Result<()> {
    let mut architecture = args.preset.architecture();
    architecture.num_hidden_layers = args.layers.unwrap_or(architecture.num_hidden_layers);
    architecture.vocab_size = args.vocab.unwrap_or(architecture.vocab_size);
    if architecture.num_hidden_layers == 0 || architecture.vocab_size < 2 {
        bail!("--layers must be positive and --vocab at least 2");
    }
    if !args.families.is_empty() {
        return family_rows::<B>(args, &architecture, device, place);
    }
    let model = Transformer::<Autodiff<B>>::random(&architecture, 0, args.dtype.dtype(), device)?
        .with_attention(args.attention.kernel());
    let tokens = args.batch * args.len;
    let ids: Vec<i64> = (0..tokens)
        .map(|i| ((i as u64 * 2_654_435_761) % architecture.vocab_size as u64) as i64)
        .collect();
    let ids = TensorData::new(ids, [args.batch, args.len]);
    eprintln!(
        "{}: {} parameters ({} layers, vocabulary {}), {} × {} tokens, {} timed steps per pass",
        args.preset.name(),
        architecture.num_parameters(),
        architecture.num_hidden_layers,
        architecture.vocab_size,
        args.batch,
        args.len,
        args.steps
    );
    let bench = Bench {
        args,
        device,
        ids: &ids,
    };
    let rows = match args.attention {
        AttentionArg::Both => attention_rows(&bench, &model)?,
        _ => vec![
            bench.inference(&model, "forward (inference)")?,
            bench.training(&model, "forward + backward", false)?,
            bench.training(&model, "forward + backward, checkpointing", true)?,
        ],
    };
    print_rows::<B>(args, &architecture, device, place, &rows);
    if let [tiled_inference, tiled, burn_inference, burn] = rows.as_slice() {
        println!(
            "\ntiled / burn's attention: training time {:.2}×, peak memory {:.3}×; inference \
             time {:.2}×, peak memory {:.3}×",
            tiled.seconds / burn.seconds,
            tiled.peak as f64 / burn.peak.max(1) as f64,
            tiled_inference.seconds / burn_inference.seconds,
            tiled_inference.peak as f64 / burn_inference.peak.max(1) as f64,
        );
    }
    Ok(())
}

/// `--families`: the inference forward and the training step of each family at the preset's
/// size, Llama's first, and each one's time against Llama's.
fn family_rows<B: DeviceMemory + XTokenBackend>(
    args: &ForwardBenchArgs,
    shape: &Architecture,
    device: &B::Device,
    place: &str,
) -> Result<()> {
    let mut families = vec![Family::Llama];
    for name in &args.families {
        let Some(family) = Family::ALL.iter().find(|f| f.model_type() == name) else {
            bail!(
                "--families: unknown family {name:?} (one of {})",
                Family::ALL.map(Family::model_type).join(", ")
            );
        };
        if !families.contains(family) {
            families.push(*family);
        }
    }
    let window = args.window.unwrap_or((args.len / 4).max(1));
    let ids: Vec<i64> = (0..args.batch * args.len)
        .map(|i| ((i as u64 * 2_654_435_761) % shape.vocab_size as u64) as i64)
        .collect();
    let ids = TensorData::new(ids, [args.batch, args.len]);
    let bench = Bench {
        args,
        device,
        ids: &ids,
    };
    let mut measured = Vec::new();
    for family in families {
        let architecture = shape.clone().with_family(family, window);
        let model =
            Transformer::<Autodiff<B>>::random(&architecture, 0, args.dtype.dtype(), device)?
                .with_attention(args.attention.kernel());
        let name = family.model_type();
        let inference = bench.inference(&model, &format!("{name}: forward (inference)"))?;
        let training = bench.training(&model, &format!("{name}: forward + backward"), false)?;
        measured.push((family, architecture.num_parameters(), inference, training));
    }
    println!(
        "{} shape, {place}, {}, {} × {} tokens, sliding window {window} where the family has one",
        args.preset.name(),
        args.dtype.name(),
        args.batch,
        args.len
    );
    println!("| family | parameters | inference s/step | × Llama | training s/step | × Llama | training peak |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let (anchor_inference, anchor_training) = (measured[0].2.seconds, measured[0].3.seconds);
    for (family, parameters, inference, training) in &measured {
        println!(
            "| {} | {:.1}M | {:.3} | {:.2}× | {:.3} | {:.2}× | {:.0} MiB |",
            family.model_type(),
            *parameters as f64 / 1e6,
            inference.seconds,
            inference.seconds / anchor_inference,
            training.seconds,
            training.seconds / anchor_training,
            training.peak as f64 / (1024.0 * 1024.0)
        );
    }
    Ok(())
}

/// `--attention both`: the inference forward and the training step with the tiled attention,
/// then with burn's.
fn attention_rows<B: DeviceMemory + XTokenBackend>(
    bench: &Bench<'_, B>,
    model: &Transformer<Autodiff<B>>,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (kernel, name) in [
        (AttentionKernel::Tiled, "tiled attention"),
        (AttentionKernel::Burn, "burn's attention"),
    ] {
        let model = model.clone().with_attention(kernel);
        rows.push(bench.inference(&model, &format!("forward (inference), {name}"))?);
        rows.push(bench.training(&model, &format!("forward + backward, {name}"), false)?);
    }
    Ok(rows)
}

/// The passes of one run.
struct Bench<'a, B: Backend> {
    args: &'a ForwardBenchArgs,
    device: &'a B::Device,
    ids: &'a TensorData,
}

impl<B: DeviceMemory + XTokenBackend> Bench<'_, B> {
    fn inference(&self, model: &Transformer<Autodiff<B>>, pass: &str) -> Result<Row> {
        let inference = model.valid();
        self.measure(pass.into(), || {
            let ids = Tensor::<B, 2, Int>::from_data(self.ids.clone(), self.device);
            let logits = inference.forward(ids, None)?;
            let _ = logits.sum().into_data();
            Ok(())
        })
    }

    fn training(
        &self,
        model: &Transformer<Autodiff<B>>,
        pass: &str,
        checkpointing: bool,
    ) -> Result<Row> {
        self.measure(pass.into(), || {
            let ids = Tensor::<Autodiff<B>, 2, Int>::from_data(self.ids.clone(), self.device);
            let tokens = Tokens::from_tensors(ids.clone(), None)?;
            let backward = model.forward_backward(&tokens, checkpointing, |model, hidden| {
                next_token_loss(model, hidden, ids.clone())
            })?;
            let _ = backward.loss.into_data();
            Ok(())
        })
    }

    fn measure(&self, pass: String, mut step: impl FnMut() -> Result<()>) -> Result<Row> {
        // Device pools keep what an earlier pass reserved; return it so each pass shows its own.
        B::memory_cleanup(self.device);
        for _ in 0..self.args.warmup {
            step()?;
        }
        let base = alloc::current();
        alloc::reset_peak();
        let start = Instant::now();
        for _ in 0..self.args.steps {
            step()?;
        }
        let seconds = start.elapsed().as_secs_f64() / self.args.steps as f64;
        let peak = match B::reserved_bytes(self.device) {
            Some(reserved) => reserved as usize,
            None => alloc::peak_above(base),
        };
        eprintln!("{pass}: {seconds:.2} s/step");
        Ok(Row {
            pass,
            seconds,
            peak,
        })
    }
}

fn print_rows<B: DeviceMemory>(
    args: &ForwardBenchArgs,
    architecture: &Architecture,
    device: &B::Device,
    place: &str,
    rows: &[Row],
) {
    let memory = if B::reserved_bytes(device).is_some() {
        "device memory reserved"
    } else {
        "peak heap above weights"
    };
    println!("| model | parameters | device, dtype | tokens/step | pass | s/step | tokens/s | {memory} |");
    println!("|---|---:|---|---:|---|---:|---:|---:|");
    let tokens = args.batch * args.len;
    for row in rows {
        println!(
            "| {} | {:.0}M | {place}, {} | {} × {} | {} | {:.2} | {:.0} | {:.0} MiB |",
            args.preset.name(),
            architecture.num_parameters() as f64 / 1e6,
            args.dtype.name(),
            args.batch,
            args.len,
            row.pass,
            row.seconds,
            tokens as f64 / row.seconds,
            row.peak as f64 / (1024.0 * 1024.0)
        );
    }
}

/// Mean next-token cross-entropy of the logits (in f32); the gradient flows through the whole
/// model.
fn next_token_loss<B: Backend>(
    model: &Transformer<Autodiff<B>>,
    hidden: Tensor<Autodiff<B>, 3>,
    ids: Tensor<Autodiff<B>, 2, Int>,
) -> Result<Tensor<Autodiff<B>, 1>, ModelError> {
    let [batch, len, _] = hidden.dims();
    let logits = model
        .logits_from_hidden(hidden.narrow(1, 0, len - 1))
        .cast(FloatDType::F32);
    let targets = ids.narrow(1, 1, len - 1).unsqueeze_dim::<3>(2);
    let picked = log_softmax(logits, 2).gather(2, targets);
    Ok(picked.sum().neg() / (batch * (len - 1)) as f64)
}
