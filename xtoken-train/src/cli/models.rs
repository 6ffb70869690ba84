//! `xtoken logits` and `xtoken convert`: a Hugging Face model directory run or re-saved.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::backend::NdArray;
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};
use clap::{Args, ValueEnum};
use safetensors::{Dtype, SafeTensors};
use xtoken_models::{CausalLm, HfConfig, SaveDtype, Transformer};
use xtoken_train::machine::check_fits;
use xtoken_train::output::{
    safetensors_holds, write_dir, write_file, written_by_xtoken, Inputs, Names, Own,
};
use xtoken_train::train::export::{copy_companions, model_names};

type B = NdArray;

/// Options of `xtoken logits`.
#[derive(Args)]
pub struct LogitsArgs {
    /// A Hugging Face model directory: config.json and model.safetensors (or sharded + index).
    #[arg(long)]
    model: PathBuf,
    /// safetensors file with `input_ids` (i64 or i32, [batch, len]) and optionally
    /// `attention_mask` ([batch, len], 1 = token, 0 = right padding).
    #[arg(long)]
    input: PathBuf,
    /// Where to write `logits` (f32, [batch, len, vocab]).
    #[arg(long)]
    out: PathBuf,
}

/// Options of `xtoken convert`.
#[derive(Args)]
pub struct ConvertArgs {
    /// The Hugging Face model directory to read.
    #[arg(long)]
    model: PathBuf,
    /// The directory to write: config.json, model.safetensors, and the source's other files
    /// (tokenizer, generation config) copied.
    #[arg(long)]
    out: PathBuf,
    /// Element type of the written weights.
    #[arg(long, value_enum, default_value_t = DtypeArg::Bf16)]
    dtype: DtypeArg,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    F32,
    Bf16,
    F16,
}

impl DtypeArg {
    /// The dtype parameters take on the device.
    pub fn dtype(self) -> DType {
        match self {
            DtypeArg::F32 => DType::F32,
            DtypeArg::Bf16 => DType::BF16,
            DtypeArg::F16 => DType::F16,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DtypeArg::F32 => "f32",
            DtypeArg::Bf16 => "bf16",
            DtypeArg::F16 => "f16",
        }
    }
}

impl From<DtypeArg> for SaveDtype {
    fn from(value: DtypeArg) -> Self {
        match value {
            DtypeArg::F32 => SaveDtype::F32,
            DtypeArg::Bf16 => SaveDtype::BF16,
            DtypeArg::F16 => SaveDtype::F16,
        }
    }
}

fn integers(path: &Path, file: &SafeTensors, name: &str) -> Result<Option<TensorData>> {
    let view = match file.tensor(name) {
        Ok(view) => view,
        Err(_) => return Ok(None),
    };
    if view.shape().len() != 2 {
        bail!(
            "{}: `{name}` has shape {:?}; expected [batch, len]",
            path.display(),
            view.shape()
        );
    }
    if view.shape().contains(&0) {
        bail!(
            "{}: `{name}` has shape {:?}: no ids to run (at least one sequence of one token)",
            path.display(),
            view.shape()
        );
    }
    let bytes = view.data();
    let values: Vec<i64> = match view.dtype() {
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("chunk of 8")))
            .collect(),
        Dtype::I32 => bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("chunk of 4")) as i64)
            .collect(),
        other => bail!(
            "{}: `{name}` has dtype {other:?}; expected I64 or I32",
            path.display()
        ),
    };
    Ok(Some(TensorData::new(values, view.shape().to_vec())))
}

/// An attention mask holds 1 (a token) and 0 (padding) only.
fn check_mask_values(path: &Path, mask: &TensorData) -> Result<()> {
    let values = mask
        .as_slice::<i64>()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let len = mask.shape[1].max(1);
    if let Some(at) = values.iter().position(|&v| v != 0 && v != 1) {
        bail!(
            "{}: attention_mask[{}][{}] = {}; expected 1 (token) or 0 (padding)",
            path.display(),
            at / len,
            at % len,
            values[at]
        );
    }
    Ok(())
}

/// The input fits the model's positions and this machine's memory, checked from `config.json`
/// before the weights are read.
fn check_input_size(args: &LogitsArgs, batch: usize, len: usize) -> Result<()> {
    let config = HfConfig::read(&args.model)?;
    let arch = &config.architecture;
    if len > arch.max_position_embeddings {
        bail!(
            "{}: input_ids has {len} positions, more than max_position_embeddings = {} in {}",
            args.input.display(),
            arch.max_position_embeddings,
            config.path.display()
        );
    }
    check_fits(
        &format!("logits over input_ids [{batch}, {len}]"),
        arch.forward_bytes(batch, len),
        "split the input into shorter or fewer sequences",
    )?;
    Ok(())
}

pub fn logits(args: LogitsArgs) -> Result<()> {
    let inputs = Inputs::new()
        .with("the --input file", &args.input)
        .with("the --model directory", &args.model);
    let own = Own::File {
        what: "a logits file",
        is_own: |path| safetensors_holds(path, &["logits"]),
    };
    inputs.check(&args.out, &own)?;
    let bytes =
        std::fs::read(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a safetensors file: {e}", args.input.display()))?;
    let ids = integers(&args.input, &file, "input_ids")?
        .with_context(|| format!("{}: no tensor named `input_ids`", args.input.display()))?;
    let mask = integers(&args.input, &file, "attention_mask")?;
    if let Some(mask) = &mask {
        check_mask_values(&args.input, mask)?;
    }
    check_input_size(&args, ids.shape[0], ids.shape[1])?;

    let start = Instant::now();
    let device = Default::default();
    eprintln!("loading {} …", args.model.display());
    let model = Transformer::<B>::load(&args.model, &device)?;
    eprintln!(
        "loaded {} ({} parameters) in {:.1} s",
        args.model.display(),
        model.architecture.num_parameters(),
        start.elapsed().as_secs_f64()
    );
    let ids = Tensor::<B, 2, Int>::from_data(ids, &device);
    let padding: Option<Tensor<B, 2, Bool>> = match mask {
        Some(mask) => {
            let mask = Tensor::<B, 2, Int>::from_data(mask, &device);
            if mask.dims() != ids.dims() {
                bail!(
                    "{}: attention_mask has shape {:?}, input_ids {:?}",
                    args.input.display(),
                    mask.dims(),
                    ids.dims()
                );
            }
            Some(mask.equal_elem(0))
        }
        None => None,
    };
    let start = Instant::now();
    let logits = model.forward(ids, padding)?;
    let shape = logits.dims();
    let values = logits
        .into_data()
        .into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let tokens = shape[0] * shape[1];
    eprintln!(
        "{tokens} tokens in {:.2} s ({:.0} tokens/s)",
        start.elapsed().as_secs_f64(),
        tokens as f64 / start.elapsed().as_secs_f64()
    );
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.to_vec(), &bytes)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    write_file(&args.out, |tmp| {
        safetensors::serialize_to_file([("logits", view)], metadata, tmp)
            .map_err(|e| xtoken_train::Error::Run(format!("{}: {e}", tmp.display())))
    })
    .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote logits {shape:?} to {}", args.out.display());
    Ok(())
}

/// Options of `xtoken export`.
#[derive(Args)]
pub struct ExportArgs {
    /// A checkpoint directory (`<output_dir>/checkpoints/step-NNNNNNNN`).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// The Hugging Face directory to write.
    #[arg(long)]
    pub out: PathBuf,
    /// The run's configuration; default: `run.toml` of the checkpoint's run directory.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn export(args: ExportArgs) -> Result<()> {
    let start = Instant::now();
    let path = match args.config {
        Some(path) => path,
        None => xtoken_train::train::export::run_config_of(&args.checkpoint)?,
    };
    Inputs::new()
        .with("the run's configuration", &path)
        .refuse(&args.out)?;
    let config = xtoken_train::RunConfig::load_saved(&path)?;
    let device = Default::default();
    let (out, step) = xtoken_train::train::export::export_checkpoint::<B>(
        &config,
        &args.checkpoint,
        &args.out,
        &device,
    )?;
    eprintln!(
        "wrote the student of step {step} to {} in {:.1} s (config {})",
        out.display(),
        start.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(())
}

pub fn convert(args: ConvertArgs) -> Result<()> {
    // The weights are read while writing: `--out` must be another directory, however spelled.
    let own = Own::Dir {
        what: "a conversion",
        names: Names::of(model_names(&args.model)?),
        signature: "config.json",
        signed: written_by_xtoken,
    };
    Inputs::new()
        .with("the --model directory", &args.model)
        .check(&args.out, &own)?;
    let start = Instant::now();
    eprintln!("loading {} …", args.model.display());
    let model = Transformer::<B>::load(&args.model, &Default::default())?;
    let copied = write_dir(&args.out, |tmp| {
        model.save(tmp, args.dtype.into())?;
        copy_companions(&args.model, tmp)
    })?;
    eprintln!(
        "wrote {} as {} in {:.1} s{}",
        args.out.display(),
        SaveDtype::from(args.dtype).torch_name(),
        start.elapsed().as_secs_f64(),
        if copied.is_empty() {
            String::new()
        } else {
            format!("; copied {}", copied.join(", "))
        }
    );
    Ok(())
}
