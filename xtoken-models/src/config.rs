//! The one description every family's `config.json` is read into, and the parts of that file
//! the families share (`rope_scaling`, the hub's two spellings of it, `model_type`).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{io_error, ModelError, Result};
use crate::rope::{Rope, RopeScaling};
use crate::{llama, phi3, qwen3};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen3,
    Phi3,
}

impl Family {
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen3 => "qwen3",
            Family::Phi3 => "phi3",
        }
    }
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
    /// Phi-3's `qkv_proj` and `gate_up_proj` instead of separate projections.
    pub fused_projections: bool,
    /// A key is visible to query `i` only if `i − window < key ≤ i` (Phi-3's `sliding_window`).
    pub sliding_window: Option<usize>,
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
            fused_projections: false,
            sliding_window: None,
            max_position_embeddings: 131_072,
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
        Ok(())
    }

    /// A hub-style `config.json` for a model that was not loaded from one.
    pub fn to_hf_json(&self) -> Value {
        let architecture = match self.family {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Phi3 => "Phi3ForCausalLM",
        };
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
            "hidden_act": "silu",
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
            Family::Qwen3 => {
                fields.insert("use_sliding_window".into(), false.into());
            }
            Family::Phi3 => {
                let partial = self.rope.rotary_dim as f64 / self.head_dim as f64;
                fields.insert("partial_rotary_factor".into(), partial.into());
                fields.insert("sliding_window".into(), self.sliding_window.into());
            }
        }
        json
    }

    pub fn num_parameters(&self) -> usize {
        let (h, f, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let attention = h * (q + 2 * kv) + q * h;
        let attention_bias = if self.attention_bias {
            q + 2 * kv + h
        } else {
            0
        };
        let mlp = 3 * h * f + if self.mlp_bias { 2 * f + h } else { 0 };
        let norms = 2 * h + if self.qk_norm { 2 * self.head_dim } else { 0 };
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
            "qwen3" => typed::<qwen3::Config>(&raw, path)?.architecture(path)?,
            "phi3" => typed::<phi3::Config>(&raw, path)?.architecture(path)?,
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
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_silu")]
    pub hidden_act: String,
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
}

impl CommonConfig {
    /// `hidden_size / num_attention_heads`, HF's default head width.
    pub(crate) fn default_head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads.max(1)
    }

    /// The architecture with every family switch off; the family turns on its own.
    pub(crate) fn architecture(&self, path: &Path, shape: FamilyShape) -> Result<Architecture> {
        check_silu(path, &self.hidden_act)?;
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
            tie_word_embeddings: self.tie_word_embeddings,
            attention_bias: false,
            mlp_bias: false,
            qk_norm: false,
            fused_projections: false,
            sliding_window: None,
            max_position_embeddings: shape.max_position_embeddings,
        })
    }
}

/// The rotary fields as they appear in hub files: `rope_theta` + `rope_scaling` (with its type
/// under `rope_type`, or `type` in older files), or transformers 5's `rope_parameters`.
struct RopeFields<'a> {
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
    fn parse(&self) -> Result<Rope> {
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
