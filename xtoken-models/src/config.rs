//! The one description every family's `config.json` is read into, and the parts of that file
//! the families share (`rope_scaling`, the hub's two spellings of it, `model_type`,
//! `layer_types`).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{io_error, ModelError, Result};
use crate::rope::{Rope, RopeScaling};
use crate::{gemma2, gemma3, llama, mistral, phi3, qwen2, qwen3};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen2,
    Qwen3,
    Phi3,
    Mistral,
    Gemma2,
    Gemma3,
}

impl Family {
    /// Every family, in the order the book lists them.
    pub const ALL: [Family; 7] = [
        Family::Llama,
        Family::Mistral,
        Family::Qwen2,
        Family::Qwen3,
        Family::Phi3,
        Family::Gemma2,
        Family::Gemma3,
    ];

    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Phi3 => "phi3",
            Family::Mistral => "mistral",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3_text",
        }
    }

    /// The transformers class a saved `config.json` names.
    pub fn hf_class(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Phi3 => "Phi3ForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Gemma2 => "Gemma2ForCausalLM",
            Family::Gemma3 => "Gemma3ForCausalLM",
        }
    }
}

/// The feed-forward's gate activation (`hidden_act` / `hidden_activation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) · up` (Llama, Qwen, Phi-3, Mistral).
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

/// Gemma's departures from the Llama block, all read from its `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmaShape {
    /// The scores' scale is `query_pre_attn_scalar^(-1/2)`, not `head_dim^(-1/2)`.
    pub query_pre_attn_scalar: f64,
    /// `c` in `c · tanh(s / c)` of each scaled attention score (Gemma-2's 50).
    pub attn_logit_softcapping: Option<f64>,
    /// `c` in `c · tanh(z / c)` of each output logit (Gemma-2's 30).
    pub final_logit_softcapping: Option<f64>,
    /// The RoPE of the sliding-window layers (Gemma-3's local base of 10,000, unscaled);
    /// `None`: every layer rotates by [`Architecture::rope`].
    pub local_rope: Option<Rope>,
}

/// The decoder-only transformer a config describes, with each family's features as switches.
#[derive(Clone, Debug, PartialEq)]
pub struct Architecture {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope: Rope,
    pub tie_word_embeddings: bool,
    /// Biases on q/k/v/o (Llama's `attention_bias`).
    pub attention_bias: bool,
    /// Biases on gate/up/down (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Qwen3's per-head RMSNorm of queries and keys before RoPE.
    pub qk_norm: bool,
    /// Biases on q/k/v but not o (Qwen2's layout).
    pub qkv_bias: bool,
    /// Phi-3's `qkv_proj` and `gate_up_proj` instead of separate projections.
    pub fused_projections: bool,
    /// A key is visible to query `i` only if `i − window < key ≤ i`, in the layers
    /// [`Self::sliding_layers`] names.
    pub sliding_window: Option<usize>,
    /// Per layer, whether it attends through `sliding_window` (`layer_types`'
    /// `"sliding_attention"`); `None`: every layer does.
    pub sliding_layers: Option<Vec<bool>>,
    /// The feed-forward's activation.
    pub activation: Activation,
    /// Gemma's blocks: RMSNorm weights as offsets from 1 (`x̂ · (1 + w)`, zero-initialised), a
    /// norm after attention and on both sides of the MLP, embeddings scaled by `√hidden`, and
    /// the fields of [`GemmaShape`].
    pub gemma: Option<GemmaShape>,
    /// Longest context the checkpoint claims; informative, written back on save.
    pub max_position_embeddings: usize,
}

impl Architecture {
    /// A Llama-shaped architecture with plain RoPE, for benchmarks and tests without a checkpoint.
    pub fn llama(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> Self {
        let head_dim = hidden_size / num_attention_heads;
        Architecture {
            family: Family::Llama,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: 1e-5,
            rope: Rope {
                theta: 500_000.0,
                rotary_dim: head_dim,
                scaling: RopeScaling::None,
            },
            tie_word_embeddings: true,
            attention_bias: false,
            mlp_bias: false,
            qk_norm: false,
            qkv_bias: false,
            fused_projections: false,
            sliding_window: None,
            sliding_layers: None,
            activation: Activation::Silu,
            gemma: None,
            max_position_embeddings: 131_072,
        }
    }

    /// This shape with `family`'s switches on, as its released checkpoints set them (`window`:
    /// the sliding window of the families that have one): for benchmarks and tests that compare
    /// families at one size without a checkpoint.
    pub fn with_family(self, family: Family, window: usize) -> Self {
        let layers = self.num_hidden_layers;
        let gemma = |caps: Option<(f64, f64)>, local_rope| GemmaShape {
            query_pre_attn_scalar: self.head_dim as f64,
            attn_logit_softcapping: caps.map(|c| c.0),
            final_logit_softcapping: caps.map(|c| c.1),
            local_rope,
        };
        let base = Architecture {
            family,
            ..self.clone()
        };
        match family {
            Family::Llama => base,
            Family::Mistral => Architecture {
                sliding_window: Some(window),
                ..base
            },
            Family::Qwen2 => Architecture {
                qkv_bias: true,
                ..base
            },
            Family::Qwen3 => Architecture {
                qk_norm: true,
                ..base
            },
            Family::Phi3 => Architecture {
                fused_projections: true,
                ..base
            },
            Family::Gemma2 => Architecture {
                activation: Activation::GeluTanh,
                sliding_window: Some(window),
                sliding_layers: Some((0..layers).map(|i| i % 2 == 0).collect()),
                gemma: Some(gemma(Some((50.0, 30.0)), None)),
                ..base
            },
            Family::Gemma3 => {
                let local = Rope {
                    theta: 10_000.0,
                    rotary_dim: self.head_dim,
                    scaling: RopeScaling::None,
                };
                Architecture {
                    activation: Activation::GeluTanh,
                    qk_norm: true,
                    sliding_window: Some(window),
                    sliding_layers: Some((0..layers).map(|i| (i + 1) % 6 != 0).collect()),
                    gemma: Some(gemma(None, Some(local))),
                    ..base
                }
            }
        }
    }

    /// The sliding window layer `layer` attends through, if any.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        let slides = match &self.sliding_layers {
            Some(layers) => layers.get(layer).copied().unwrap_or(false),
            None => true,
        };
        self.sliding_window.filter(|_| slides)
    }

    /// Whether some layers slide and others see every earlier key.
    pub fn mixes_windows(&self) -> bool {
        self.sliding_window.is_some()
            && self
                .sliding_layers
                .as_ref()
                .is_some_and(|l| l.contains(&true) && l.contains(&false))
    }

    /// The attention scores' scale.
    pub fn attention_scale(&self) -> f64 {
        match &self.gemma {
            Some(g) => g.query_pre_attn_scalar.powf(-0.5),
            None => (self.head_dim as f64).powf(-0.5),
        }
    }

    /// Whether the scores take a soft-cap or a scale other than `head_dim^(-1/2)` (Gemma's).
    pub fn scores_of_their_own(&self) -> bool {
        self.gemma.as_ref().is_some_and(|g| {
            g.attn_logit_softcapping.is_some()
                || self.attention_scale() != (self.head_dim as f64).powf(-0.5)
        })
    }

    /// The slots a sliding layer's key/value cache keeps between decoding calls: the
    /// `window − 1` keys before the next query that it sees (at least one).
    pub fn window_slots(&self) -> Option<usize> {
        self.sliding_window.map(|w| w.saturating_sub(1).max(1))
    }

    /// The RoPE of layer `layer`: Gemma-3's local one in its sliding layers.
    pub fn layer_rope(&self, layer: usize) -> &Rope {
        match self.gemma.as_ref().and_then(|g| g.local_rope.as_ref()) {
            Some(local) if self.layer_window(layer).is_some() => local,
            _ => &self.rope,
        }
    }

    /// Checks what the model code relies on; `path` names the config in the error.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let field = |field: &str, why: String| ModelError::Field {
            path: path.to_path_buf(),
            field: field.into(),
            why,
        };
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 {
                return Err(field(name, "must be positive".into()));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(field(
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        let rotary = self.rope.rotary_dim;
        if rotary == 0 || !rotary.is_multiple_of(2) || rotary > self.head_dim {
            return Err(field(
                "partial_rotary_factor",
                format!(
                    "gives {rotary} rotary channels; need an even number in 2..={}",
                    self.head_dim
                ),
            ));
        }
        if !positive(self.rms_norm_eps) {
            return Err(field("rms_norm_eps", "must be positive".into()));
        }
        if !positive(self.rope.theta) {
            return Err(field("rope_theta", "must be positive".into()));
        }
        if let RopeScaling::LongRope {
            short_factor,
            long_factor,
            ..
        } = &self.rope.scaling
        {
            for (name, factors) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                if factors.len() != rotary / 2 {
                    return Err(field(
                        &format!("rope_scaling.{name}"),
                        format!(
                            "has {} values; rotary dimension {rotary} needs {}",
                            factors.len(),
                            rotary / 2
                        ),
                    ));
                }
                if !factors.iter().all(|f| positive(*f)) {
                    return Err(field(
                        &format!("rope_scaling.{name}"),
                        "values must be positive".into(),
                    ));
                }
            }
        }
        if self.sliding_window == Some(0) {
            return Err(field("sliding_window", "must be positive".into()));
        }
        if let Some(layers) = &self.sliding_layers {
            if layers.len() != self.num_hidden_layers {
                return Err(field(
                    "layer_types",
                    format!(
                        "has {} entries for {} layers",
                        layers.len(),
                        self.num_hidden_layers
                    ),
                ));
            }
        }
        if let Some(g) = &self.gemma {
            if !positive(g.query_pre_attn_scalar) {
                return Err(field("query_pre_attn_scalar", "must be positive".into()));
            }
            for (name, cap) in [
                ("attn_logit_softcapping", g.attn_logit_softcapping),
                ("final_logit_softcapping", g.final_logit_softcapping),
            ] {
                if cap.is_some_and(|c| !positive(c)) {
                    return Err(field(name, "must be positive or null".into()));
                }
            }
        }
        Ok(())
    }

    /// A hub-style `config.json` for a model that was not loaded from one.
    pub fn to_hf_json(&self) -> Value {
        let architecture = self.family.hf_class();
        let mut json = serde_json::json!({
            "architectures": [architecture],
            "model_type": self.family.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": match self.activation {
                Activation::Silu => "silu",
                Activation::GeluTanh => "gelu_pytorch_tanh",
            },
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope.theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            // Unknown without a tokenizer; HF's class defaults (Phi-3's pad 32000) may not even
            // fit the vocabulary.
            "bos_token_id": null,
            "eos_token_id": null,
            "pad_token_id": null,
        });
        let fields = json.as_object_mut().expect("built as an object");
        let scaling = match &self.rope.scaling {
            RopeScaling::None => Value::Null,
            RopeScaling::Linear { factor } => {
                serde_json::json!({"rope_type": "linear", "factor": factor})
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => serde_json::json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            } => {
                fields.insert(
                    "original_max_position_embeddings".into(),
                    (*original_max_position_embeddings).into(),
                );
                serde_json::json!({
                    "type": "longrope",
                    "short_factor": short_factor,
                    "long_factor": long_factor,
                    "attention_factor": attention_factor,
                })
            }
        };
        fields.insert("rope_scaling".into(), scaling);
        match self.family {
            Family::Llama => {
                fields.insert("mlp_bias".into(), self.mlp_bias.into());
            }
            Family::Phi3 => {
                let partial = self.rope.rotary_dim as f64 / self.head_dim as f64;
                fields.insert("partial_rotary_factor".into(), partial.into());
                fields.insert("sliding_window".into(), self.sliding_window.into());
            }
            Family::Mistral => {
                fields.insert("sliding_window".into(), self.sliding_window.into());
            }
            Family::Qwen2 | Family::Qwen3 => {
                if self.family == Family::Qwen2 {
                    // Qwen2 has its biases by design, not by this field.
                    fields.remove("attention_bias");
                }
                // The sliding layers are the last ones, from `max_window_layers` on.
                let window_from = match &self.sliding_layers {
                    Some(layers) => layers
                        .iter()
                        .position(|&s| s)
                        .unwrap_or(self.num_hidden_layers),
                    None => 0,
                };
                fields.insert(
                    "use_sliding_window".into(),
                    self.sliding_window.is_some().into(),
                );
                fields.insert("sliding_window".into(), self.sliding_window.into());
                fields.insert("max_window_layers".into(), window_from.into());
            }
            Family::Gemma2 | Family::Gemma3 => self.gemma_fields(fields),
        }
        json
    }

    /// Gemma's own fields of a saved `config.json`.
    fn gemma_fields(&self, fields: &mut serde_json::Map<String, Value>) {
        fields.remove("hidden_act");
        fields.insert("hidden_activation".into(), "gelu_pytorch_tanh".into());
        fields.insert("sliding_window".into(), self.sliding_window.into());
        let types: Vec<&str> = (0..self.num_hidden_layers)
            .map(|i| match self.layer_window(i) {
                Some(_) => "sliding_attention",
                None => "full_attention",
            })
            .collect();
        fields.insert("layer_types".into(), types.into());
        let Some(g) = &self.gemma else { return };
        fields.insert(
            "query_pre_attn_scalar".into(),
            g.query_pre_attn_scalar.into(),
        );
        fields.insert(
            "attn_logit_softcapping".into(),
            g.attn_logit_softcapping.into(),
        );
        fields.insert(
            "final_logit_softcapping".into(),
            g.final_logit_softcapping.into(),
        );
        if let Some(local) = &g.local_rope {
            fields.insert("rope_local_base_freq".into(), local.theta.into());
        }
    }

    pub fn num_parameters(&self) -> usize {
        let (h, f, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let attention = h * (q + 2 * kv) + q * h;
        let attention_bias = match (self.attention_bias, self.qkv_bias) {
            (true, _) => q + 2 * kv + h,
            (false, true) => q + 2 * kv,
            (false, false) => 0,
        };
        let mlp = 3 * h * f + if self.mlp_bias { 2 * f + h } else { 0 };
        let sandwich = if self.gemma.is_some() { 2 * h } else { 0 };
        let norms = 2 * h + sandwich + if self.qk_norm { 2 * self.head_dim } else { 0 };
        let layer = attention + attention_bias + mlp + norms;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * layer + h + head
    }

    /// Roughly the most bytes an f32 forward pass over `[batch, len]` ids holds at once on a
    /// host backend: the weights, three `[batch, heads, len, len]` attention buffers (scores,
    /// mask, softmax) and the logits three times (the tensor and two copies on their way to a
    /// file). Enough to refuse an input that cannot fit before trying it.
    pub fn forward_bytes(&self, batch: usize, len: usize) -> u64 {
        let (b, t) = (batch as u64, len as u64);
        let weights = self.num_parameters() as u64;
        let attention = 3 * b * self.num_attention_heads as u64 * t * t;
        let logits = 3 * b * t * self.vocab_size as u64;
        4 * (weights + attention + logits)
    }

    /// Bytes the key/value cache of `rows` sequences of `len` positions takes in a dtype of
    /// `bytes` per value (evaluation's generation): a sliding-window layer keeps its last
    /// `window − 1` positions only, the others every position.
    pub fn kv_cache_bytes(&self, rows: usize, len: usize, bytes: usize) -> u64 {
        let per_slot = 2 * self.num_key_value_heads * self.head_dim * bytes;
        (0..self.num_hidden_layers)
            .map(|layer| {
                let slots = match (self.layer_window(layer), self.window_slots()) {
                    (Some(_), Some(kept)) => len.min(kept),
                    _ => len,
                };
                (rows * slots * per_slot) as u64
            })
            .sum()
    }
}

/// A model directory's `config.json`: the parsed architecture, plus the original JSON so that a
/// saved model keeps every field we do not interpret.
#[derive(Clone, Debug)]
pub struct HfConfig {
    pub path: PathBuf,
    pub architecture: Architecture,
    pub raw: Value,
}

impl HfConfig {
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(io_error(&path))?;
        Self::parse(&text, &path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let raw: Value = serde_json::from_str(text).map_err(|source| ModelError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let model_type = match raw.get("model_type") {
            Some(Value::String(kind)) => kind.clone(),
            Some(_) => {
                return Err(ModelError::Field {
                    path: path.to_path_buf(),
                    field: "model_type".into(),
                    why: "must be a string".into(),
                })
            }
            None => {
                return Err(ModelError::Field {
                    path: path.to_path_buf(),
                    field: "model_type".into(),
                    why: "missing".into(),
                })
            }
        };
        let architecture = match model_type.as_str() {
            "llama" => typed::<llama::Config>(&raw, path)?.architecture(path)?,
            "mistral" => typed::<mistral::Config>(&raw, path)?.architecture(path)?,
            "qwen2" => typed::<qwen2::Config>(&raw, path)?.architecture(path)?,
            "qwen3" => typed::<qwen3::Config>(&raw, path)?.architecture(path)?,
            "phi3" => typed::<phi3::Config>(&raw, path)?.architecture(path)?,
            "gemma2" => typed::<gemma2::Config>(&raw, path)?.architecture(path)?,
            "gemma3_text" => typed::<gemma3::Config>(&raw, path)?.architecture(path)?,
            "gemma3" => {
                return Err(ModelError::Field {
                    path: path.to_path_buf(),
                    field: "model_type".into(),
                    why: "\"gemma3\" is the multimodal model (Gemma3ForConditionalGeneration); \
                          xtoken loads its text model, model_type \"gemma3_text\" (Gemma-3-1B, or \
                          text_config with the language model's weights)"
                        .into(),
                })
            }
            _ => {
                return Err(ModelError::UnknownModelType {
                    path: path.to_path_buf(),
                    model_type,
                })
            }
        };
        architecture.validate(path)?;
        Ok(HfConfig {
            path: path.to_path_buf(),
            architecture,
            raw,
        })
    }

    /// The dtype the checkpoint was published in (`torch_dtype`, or `dtype` in newer files).
    pub fn torch_dtype(&self) -> Option<&str> {
        ["torch_dtype", "dtype"]
            .iter()
            .find_map(|key| self.raw.get(key).and_then(Value::as_str))
    }
}

fn typed<T: DeserializeOwned>(raw: &Value, path: &Path) -> Result<T> {
    serde_json::from_value(raw.clone()).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// The fields every family's `config.json` shares, flattened into each family's `Config`.
#[derive(Clone, Debug, Deserialize)]
pub struct CommonConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<Value>,
    pub rope_parameters: Option<Value>,
    /// Absent: the family's default (tied for Gemma, separate for the rest).
    pub tie_word_embeddings: Option<bool>,
    #[serde(default = "default_silu")]
    pub hidden_act: String,
    /// `"sliding_attention"` / `"full_attention"` per layer (transformers' newer configs).
    pub layer_types: Option<Vec<String>>,
}

/// What a family decides about the shared fields before they become an [`Architecture`].
pub(crate) struct FamilyShape {
    pub family: Family,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    /// Phi-3 keeps the pretraining length at the top level, and it wins over `rope_scaling`'s.
    pub original_max_position_embeddings: Option<usize>,
    /// `tie_word_embeddings` when the config does not say (transformers' class default).
    pub tied_by_default: bool,
}

impl CommonConfig {
    /// `hidden_size / num_attention_heads`, HF's default head width.
    pub(crate) fn default_head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// The architecture with every family switch off; the family turns on its own.
    pub(crate) fn architecture(&self, path: &Path, shape: FamilyShape) -> Result<Architecture> {
        check_silu(path, &self.hidden_act)?;
        self.architecture_with_rope(path, shape)
    }

    /// [`Self::architecture`] without the SwiGLU check (Gemma's activation is its own field).
    pub(crate) fn architecture_with_rope(
        &self,
        path: &Path,
        shape: FamilyShape,
    ) -> Result<Architecture> {
        let rope = RopeFields {
            path,
            rope_theta: self.rope_theta,
            rope_scaling: self.rope_scaling.as_ref(),
            rope_parameters: self.rope_parameters.as_ref(),
            rotary_dim: shape.rotary_dim,
            max_position_embeddings: shape.max_position_embeddings,
            original_max_position_embeddings: shape.original_max_position_embeddings,
        }
        .parse()?;
        Ok(Architecture {
            family: shape.family,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            head_dim: shape.head_dim,
            rms_norm_eps: shape.rms_norm_eps,
            rope,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(shape.tied_by_default),
            attention_bias: false,
            mlp_bias: false,
            qk_norm: false,
            qkv_bias: false,
            fused_projections: false,
            sliding_window: None,
            sliding_layers: None,
            activation: Activation::Silu,
            gemma: None,
            max_position_embeddings: shape.max_position_embeddings,
        })
    }

    /// Qwen2's and Qwen3's window: none unless `use_sliding_window` (transformers drops it
    /// then), else in the layers from `max_window_layers` on, or as `layer_types` says.
    pub(crate) fn qwen_window(
        &self,
        path: &Path,
        use_sliding_window: bool,
        window: Option<usize>,
        max_window_layers: usize,
    ) -> Result<(Option<usize>, Option<Vec<bool>>)> {
        match window.filter(|_| use_sliding_window) {
            Some(w) => {
                let layers = self.sliding_layers(path, |i| i >= max_window_layers)?;
                Ok((Some(w), Some(layers)))
            }
            None => Ok((None, None)),
        }
    }

    /// Which layers slide, from `layer_types` when the config has it, else `derived` (the
    /// family's own rule over the layer index).
    pub(crate) fn sliding_layers(
        &self,
        path: &Path,
        derived: impl Fn(usize) -> bool,
    ) -> Result<Vec<bool>> {
        match &self.layer_types {
            None => Ok((0..self.num_hidden_layers).map(derived).collect()),
            Some(types) => types
                .iter()
                .enumerate()
                .map(|(i, kind)| match kind.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(ModelError::Field {
                        path: path.to_path_buf(),
                        field: format!("layer_types[{i}]"),
                        why: format!(
                            "{other:?} is not supported (sliding_attention or full_attention)"
                        ),
                    }),
                })
                .collect(),
        }
    }
}

/// The rotary fields as they appear in hub files: `rope_theta` + `rope_scaling` (with its type
/// under `rope_type`, or `type` in older files), or transformers 5's `rope_parameters`.
pub(crate) struct RopeFields<'a> {
    pub path: &'a Path,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<&'a Value>,
    pub rope_parameters: Option<&'a Value>,
    pub rotary_dim: usize,
    pub max_position_embeddings: usize,
    /// Phi-3 keeps the pretraining length at the top level, and it wins over `rope_scaling`'s.
    pub original_max_position_embeddings: Option<usize>,
}

impl RopeFields<'_> {
    pub(crate) fn parse(&self) -> Result<Rope> {
        let params = match (self.rope_scaling, self.rope_parameters) {
            (Some(Value::Null) | None, Some(Value::Null) | None) => None,
            (Some(Value::Null) | None, Some(p)) => Some(("rope_parameters", p)),
            (Some(s), _) => Some(("rope_scaling", s)),
        };
        let theta = params
            .and_then(|(_, p)| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .or(self.rope_theta)
            .unwrap_or(10_000.0);
        let scaling = match params {
            None => RopeScaling::None,
            Some((section, params)) => self.scaling(section, params)?,
        };
        Ok(Rope {
            theta,
            rotary_dim: self.rotary_dim,
            scaling,
        })
    }

    fn field(&self, field: String, why: &str) -> ModelError {
        ModelError::Field {
            path: self.path.to_path_buf(),
            field,
            why: why.into(),
        }
    }

    fn number(&self, section: &str, params: &Value, key: &str) -> Result<f64> {
        match params.get(key) {
            Some(value) => value
                .as_f64()
                .ok_or_else(|| self.field(format!("{section}.{key}"), "must be a number")),
            None => Err(self.field(format!("{section}.{key}"), "missing")),
        }
    }

    fn factors(&self, section: &str, params: &Value, key: &str) -> Result<Vec<f64>> {
        let bad = || self.field(format!("{section}.{key}"), "must be a list of numbers");
        params
            .get(key)
            .ok_or_else(|| self.field(format!("{section}.{key}"), "missing"))?
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|v| v.as_f64().ok_or_else(bad))
            .collect()
    }

    fn scaling(&self, section: &str, params: &Value) -> Result<RopeScaling> {
        if !params.is_object() {
            return Err(self.field(section.into(), "must be an object or null"));
        }
        let kind = params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let original = |params: &Value| -> Result<usize> {
            if let Some(value) = self.original_max_position_embeddings {
                return Ok(value);
            }
            match params.get("original_max_position_embeddings") {
                Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| {
                    self.field(
                        format!("{section}.original_max_position_embeddings"),
                        "must be a positive integer",
                    )
                }),
                None => Ok(self.max_position_embeddings),
            }
        };
        Ok(match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: self.number(section, params, "factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: self.number(section, params, "factor")?,
                low_freq_factor: self.number(section, params, "low_freq_factor")?,
                high_freq_factor: self.number(section, params, "high_freq_factor")?,
                original_max_position_embeddings: original(params)?,
            },
            // "su" is the name Phi-3's first releases gave LongRoPE.
            "longrope" | "su" => {
                let original = original(params)?;
                if original == 0 {
                    return Err(self.field(
                        "original_max_position_embeddings".into(),
                        "must be positive",
                    ));
                }
                let factor = match params.get("factor").and_then(Value::as_f64) {
                    Some(factor) => factor,
                    None => self.max_position_embeddings as f64 / original as f64,
                };
                let attention_factor = match params.get("attention_factor").and_then(Value::as_f64)
                {
                    Some(given) => given,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
                };
                RopeScaling::LongRope {
                    short_factor: self.factors(section, params, "short_factor")?,
                    long_factor: self.factors(section, params, "long_factor")?,
                    original_max_position_embeddings: original,
                    attention_factor,
                }
            }
            other => {
                return Err(ModelError::UnknownRopeType {
                    path: self.path.to_path_buf(),
                    rope_type: other.into(),
                })
            }
        })
    }
}

/// Finite and above zero (NaN is neither).
fn positive(value: f64) -> bool {
    value.is_finite() && value > 0.0
}

pub(crate) fn default_rms_norm_eps() -> f64 {
    1e-6
}

fn default_silu() -> String {
    "silu".into()
}

/// The families' feed-forward is SwiGLU; anything else would be silently wrong.
fn check_silu(path: &Path, hidden_act: &str) -> Result<()> {
    if hidden_act == "silu" {
        Ok(())
    } else {
        Err(ModelError::Field {
            path: path.to_path_buf(),
            field: "hidden_act".into(),
            why: format!("{hidden_act:?} is not supported (only silu)"),
        })
    }
}
