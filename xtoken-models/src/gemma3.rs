//! Gemma-3's text model (`gemma3_text`: Gemma-3-1B, and the language model of the larger
//! ones): Gemma-2's block without its soft-caps (unless the config sets them), per-head q/k
//! norms in Gemma's `1 + w` form, five sliding-window layers to each global one
//! (`sliding_window_pattern`, or `layer_types`), and two RoPEs: the global layers' (`rope_theta`,
//! 1,000,000, with `rope_scaling`) and the local layers' (`rope_local_base_freq`, 10,000,
//! unscaled) — or transformers 5's `rope_parameters` keyed by layer type.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::config::{
    default_rms_norm_eps, Architecture, CommonConfig, Family, FamilyShape, GemmaShape, RopeFields,
};
use crate::error::{ModelError, Result};
use crate::gemma2::{
    check_gelu_tanh, default_activation, default_head_dim, default_scalar, default_sliding_window,
};
use crate::rope::Rope;

/// `config.json` of a `model_type: "gemma3_text"` checkpoint; absent fields take HF's defaults.
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub common: CommonConfig,
    #[serde(default = "default_head_dim")]
    pub head_dim: usize,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_activation")]
    pub hidden_activation: String,
    #[serde(default = "default_scalar")]
    pub query_pre_attn_scalar: f64,
    #[serde(default = "default_sliding_window")]
    pub sliding_window: Option<usize>,
    #[serde(default = "default_pattern")]
    pub sliding_window_pattern: usize,
    pub rope_local_base_freq: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub use_bidirectional_attention: bool,
}

fn default_max_position_embeddings() -> usize {
    131_072
}

fn default_pattern() -> usize {
    6
}

impl Config {
    pub fn architecture(&self, path: &Path) -> Result<Architecture> {
        if self.use_bidirectional_attention {
            return Err(ModelError::Field {
                path: path.to_path_buf(),
                field: "use_bidirectional_attention".into(),
                why: "true is an encoder (EmbeddingGemma), not a causal language model".into(),
            });
        }
        let pattern = self.sliding_window_pattern.max(1);
        let sliding_layers = self
            .common
            .sliding_layers(path, |i| (i + 1) % pattern != 0)?;
        let (global, local) = self.ropes(path)?;
        let shape = FamilyShape {
            family: Family::Gemma3,
            head_dim: self.head_dim,
            rotary_dim: self.head_dim,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            original_max_position_embeddings: None,
            tied_by_default: true,
        };
        Ok(Architecture {
            rope: global,
            attention_bias: self.attention_bias,
            qk_norm: true,
            activation: check_gelu_tanh(path, &self.hidden_activation)?,
            sliding_window: self.sliding_window,
            sliding_layers: Some(sliding_layers),
            gemma: Some(GemmaShape {
                query_pre_attn_scalar: self.query_pre_attn_scalar,
                attn_logit_softcapping: self.attn_logit_softcapping,
                final_logit_softcapping: self.final_logit_softcapping,
                local_rope: Some(local),
            }),
            ..self.common.architecture_with_rope(path, shape)?
        })
    }

    /// The global and the local RoPE, from `rope_parameters` keyed by layer type where the
    /// config has it, else from `rope_theta` + `rope_scaling` and `rope_local_base_freq`.
    fn ropes(&self, path: &Path) -> Result<(Rope, Rope)> {
        let common = &self.common;
        let keyed = common
            .rope_parameters
            .as_ref()
            .filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some());
        let fields = |theta: f64, parameters: Option<&Value>, scaling: Option<&Value>| {
            RopeFields {
                path,
                rope_theta: Some(theta),
                rope_scaling: scaling,
                rope_parameters: parameters,
                rotary_dim: self.head_dim,
                max_position_embeddings: self.max_position_embeddings,
                original_max_position_embeddings: None,
            }
            .parse()
        };
        let global_theta = common.rope_theta.unwrap_or(1_000_000.0);
        let local_theta = self.rope_local_base_freq.unwrap_or(10_000.0);
        match keyed {
            Some(p) => Ok((
                fields(global_theta, p.get("full_attention"), None)?,
                fields(local_theta, p.get("sliding_attention"), None)?,
            )),
            None => Ok((
                fields(
                    global_theta,
                    common.rope_parameters.as_ref(),
                    common.rope_scaling.as_ref(),
                )?,
                fields(local_theta, None, None)?,
            )),
        }
    }
}
