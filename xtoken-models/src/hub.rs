//! Model directories in the Hugging Face layout: `config.json` plus safetensors weights, read
//! into a [`Transformer`] and written back so that HF transformers loads them.

use std::path::Path;

use burn::module::Param;
use burn::nn::{Linear, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use xtoken_kernels::host::transpose;

use crate::checkpoint::{
    write_atomically, write_safetensors, Checkpoint, PendingTensor, SaveDtype, SINGLE_FILE,
};
use crate::config::{Architecture, HfConfig};
use crate::error::{io_error, ModelError, Result};
use crate::model::{Builder, Init, TensorSource, Transformer};

/// How to bring a checkpoint onto the device.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// The dtype of the parameters on the device; files in other dtypes are converted.
    /// `BF16`/`F16` need a backend that supports them (CUDA; not ndarray).
    pub dtype: DType,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { dtype: DType::F32 }
    }
}

struct CheckpointSource<'a>(&'a Checkpoint);

impl TensorSource for CheckpointSource<'_> {
    fn values(&mut self, name: &str, shape: &[usize], _init: Init) -> Result<Vec<f32>> {
        self.0.read_f32(name, shape)
    }
}

/// Seeded values from a counter-based generator, so a random model is the same on every backend
/// and every machine.
struct RandomSource {
    state: u64,
}

/// splitmix64's increment: its `k`-th draw after state `s` is `mix(s + k · GOLDEN)`, so any draw
/// can be computed without the ones before it.
/// The `config.json` field that names the xtoken version that wrote a model directory.
pub const WRITER_FIELD: &str = "xtoken_version";

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The `k`-th draw after `state`, in (0, 1).
fn uniform_at(state: u64, k: u64) -> f64 {
    let bits = mix(state.wrapping_add(k.wrapping_mul(GOLDEN)));
    ((bits >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

impl TensorSource for RandomSource {
    fn values(&mut self, _name: &str, shape: &[usize], init: Init) -> Result<Vec<f32>> {
        let count: usize = shape.iter().product();
        Ok(match init {
            Init::Ones => vec![1.0; count],
            Init::Zeros => vec![0.0; count],
            Init::Normal(std) => {
                // Box–Muller on draws 2j + 1 and 2j + 2: each value on its own, in parallel (a
                // 4B-parameter model is 8 billion draws), the same values as drawn in turn.
                use rayon::prelude::*;
                let start = self.state;
                self.state = start.wrapping_add((2 * count as u64).wrapping_mul(GOLDEN));
                (0..count as u64)
                    .into_par_iter()
                    .map(|j| {
                        let (u, v) = (uniform_at(start, 2 * j + 1), uniform_at(start, 2 * j + 2));
                        let normal =
                            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
                        (normal * std as f64) as f32
                    })
                    .collect()
            }
        })
    }
}

fn check_dtype<B: Backend>(dtype: DType, device: &B::Device) -> Result<()> {
    if dtype.is_float() && B::supports_dtype(device, dtype) {
        Ok(())
    } else {
        Err(ModelError::UnsupportedDtype { dtype })
    }
}

impl<B: Backend> Transformer<B> {
    /// Loads a local HF model directory in f32.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        Self::load_with(dir, LoadOptions::default(), device)
    }

    pub fn load_with(dir: &Path, options: LoadOptions, device: &B::Device) -> Result<Self> {
        check_dtype::<B>(options.dtype, device)?;
        let config = HfConfig::read(dir)?;
        let checkpoint = Checkpoint::open(dir)?;
        check_layer_count(&config, &checkpoint)?;
        let mut source = CheckpointSource(&checkpoint);
        let mut builder = Builder {
            source: &mut source,
            device: device.clone(),
            dtype: options.dtype,
            init_std: 0.0,
        };
        let mut model = Transformer::build(&mut builder, &config.architecture)?;
        model.hf_config = Some(config.raw);
        Ok(model)
    }

    /// A model with N(0, 0.02) weights (HF's `initializer_range`) and unit norms, the same for a
    /// given seed on every backend.
    pub fn random(
        architecture: &Architecture,
        seed: u64,
        dtype: DType,
        device: &B::Device,
    ) -> Result<Self> {
        check_dtype::<B>(dtype, device)?;
        architecture.validate(Path::new("<architecture>"))?;
        let mut source = RandomSource { state: seed };
        let mut builder = Builder {
            source: &mut source,
            device: device.clone(),
            dtype,
            init_std: 0.02,
        };
        Transformer::build(&mut builder, architecture)
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if needed), with HF's
    /// tensor names and layouts, in `dtype`. Each file is written to a temporary name first.
    /// `config.json` records the writer in [`WRITER_FIELD`] (as transformers records its own
    /// version), so that a later command knows the directory as one xtoken wrote.
    pub fn save(&self, dir: &Path, dtype: SaveDtype) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let mut config = self
            .hf_config
            .clone()
            .unwrap_or_else(|| self.architecture.to_hf_json());
        if let Some(fields) = config.as_object_mut() {
            fields.remove("dtype");
            fields.insert("torch_dtype".into(), dtype.torch_name().into());
            fields.insert(WRITER_FIELD.into(), env!("CARGO_PKG_VERSION").into());
        }
        write_safetensors(&dir.join(SINGLE_FILE), self.pending_tensors(), dtype)?;
        let text = serde_json::to_string_pretty(&config).map_err(|source| ModelError::Json {
            path: dir.join("config.json"),
            source,
        })?;
        write_atomically(&dir.join("config.json"), &text)
    }

    fn pending_tensors(&self) -> Vec<PendingTensor<'_>> {
        let mut out = Vec::new();
        let embedding = &self.embed_tokens.weight;
        out.push(pending(
            "model.embed_tokens.weight".into(),
            embedding,
            false,
        ));
        for (i, layer) in self.layers.iter().enumerate() {
            let prefix = format!("model.layers.{i}");
            let attention = &layer.self_attn;
            let projections = [
                ("q_proj", attention.q_proj.as_ref()),
                ("k_proj", attention.k_proj.as_ref()),
                ("v_proj", attention.v_proj.as_ref()),
                ("qkv_proj", attention.qkv_proj.as_ref()),
                ("o_proj", Some(&attention.o_proj)),
            ];
            for (name, linear) in projections {
                if let Some(linear) = linear {
                    push_linear(&mut out, format!("{prefix}.self_attn.{name}"), linear);
                }
            }
            for (name, norm) in [
                ("q_norm", attention.q_norm.as_ref()),
                ("k_norm", attention.k_norm.as_ref()),
            ] {
                if let Some(norm) = norm {
                    push_norm(&mut out, format!("{prefix}.self_attn.{name}"), norm);
                }
            }
            let mlp = &layer.mlp;
            let projections = [
                ("gate_proj", mlp.gate_proj.as_ref()),
                ("up_proj", mlp.up_proj.as_ref()),
                ("gate_up_proj", mlp.gate_up_proj.as_ref()),
                ("down_proj", Some(&mlp.down_proj)),
            ];
            for (name, linear) in projections {
                if let Some(linear) = linear {
                    push_linear(&mut out, format!("{prefix}.mlp.{name}"), linear);
                }
            }
            push_norm(
                &mut out,
                format!("{prefix}.input_layernorm"),
                &layer.input_layernorm,
            );
            push_norm(
                &mut out,
                format!("{prefix}.post_attention_layernorm"),
                &layer.post_attention_layernorm,
            );
            for (name, norm) in [
                (
                    "pre_feedforward_layernorm",
                    &layer.pre_feedforward_layernorm,
                ),
                (
                    "post_feedforward_layernorm",
                    &layer.post_feedforward_layernorm,
                ),
            ] {
                if let Some(norm) = norm {
                    push_norm(&mut out, format!("{prefix}.{name}"), norm);
                }
            }
        }
        push_norm(&mut out, "model.norm".into(), &self.norm);
        if let Some(head) = &self.lm_head {
            push_linear(&mut out, "lm_head".into(), head);
        }
        out
    }
}

/// f32 values of a parameter, in its burn layout.
fn host_values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert_dtype(DType::F32)
        .into_vec::<f32>()
        .expect("a float tensor converted to f32 reads as f32")
}

/// A parameter under its HF name; `transposed` for linear weights, stored `[in, out]` here and
/// `[out, in]` in HF files.
fn pending<B: Backend, const D: usize>(
    name: String,
    param: &Param<Tensor<B, D>>,
    transposed: bool,
) -> PendingTensor<'static> {
    let tensor = param.val();
    let dims = tensor.dims();
    let mut shape = dims.to_vec();
    if transposed {
        shape.reverse();
    }
    PendingTensor {
        name,
        shape,
        values: Box::new(move || {
            let values = host_values(tensor.clone());
            if transposed {
                transpose(&values, dims[0], dims[1])
            } else {
                values
            }
        }),
    }
}

fn push_linear<B: Backend>(out: &mut Vec<PendingTensor<'_>>, prefix: String, linear: &Linear<B>) {
    out.push(pending(format!("{prefix}.weight"), &linear.weight, true));
    if let Some(bias) = &linear.bias {
        out.push(pending(format!("{prefix}.bias"), bias, false));
    }
}

fn push_norm<B: Backend>(out: &mut Vec<PendingTensor<'_>>, prefix: String, norm: &RmsNorm<B>) {
    out.push(pending(format!("{prefix}.weight"), &norm.gamma, false));
}

/// The checkpoint holds no layer past `num_hidden_layers`: weights of a deeper model read with a
/// shallower config would load without a word and compute something else.
fn check_layer_count(config: &HfConfig, checkpoint: &Checkpoint) -> Result<()> {
    let layers = config.architecture.num_hidden_layers;
    let layer_of = |name: &str| -> Option<usize> {
        let rest = name.strip_prefix("model.layers.")?;
        rest.split('.').next()?.parse().ok()
    };
    let deepest = checkpoint.names().filter_map(layer_of).max();
    match deepest {
        Some(layer) if layer >= layers => Err(ModelError::Field {
            path: config.path.clone(),
            field: "num_hidden_layers".into(),
            why: format!(
                "{layers}, but the checkpoint has tensors of layer {layer} (`model.layers.{layer}.…`): \
                 the config does not describe these weights"
            ),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod random_tests {
    use super::*;

    /// The parallel draws are splitmix64's stream drawn in turn: the values, and the state the
    /// next tensor starts from.
    #[test]
    fn parallel_draws_are_the_sequential_stream() {
        let mut state = 7u64;
        let mut next = || {
            state = state.wrapping_add(GOLDEN);
            ((mix(state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut want = Vec::new();
        for _ in 0..1000 {
            let (u, v) = (next(), next());
            let normal = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
            want.push((normal * 0.02f32 as f64) as f32);
        }
        let following = next();
        let mut source = RandomSource { state: 7 };
        let got = source.values("w", &[10, 100], Init::Normal(0.02)).unwrap();
        assert_eq!(got, want);
        assert_eq!(uniform_at(source.state, 1), following);
    }
}
