//! Gemma-2: RMSNorm as `x̂ · (1 + w)`, a norm after attention and on both sides of the MLP,
//! GeGLU (`gelu_pytorch_tanh`), embeddings scaled by `√hidden`, scores scaled by
//! `query_pre_attn_scalar^(-1/2)` and soft-capped (`attn_logit_softcapping`), logits
//! soft-capped (`final_logit_softcapping`), and sliding-window and global layers alternating
//! (even layers slide, unless `layer_types` says otherwise).

use std::path::Path;

use serde::Deserialize;

use crate::config::{
    default_rms_norm_eps, Activation, Architecture, CommonConfig, Family, FamilyShape, GemmaShape,
};
use crate::error::{ModelError, Result};

/// `config.json` of a `model_type: "gemma2"` checkpoint; absent fields take HF's defaults.
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
    #[serde(default = "default_attn_softcap")]
    pub attn_logit_softcapping: Option<f64>,
    #[serde(default = "default_final_softcap")]
    pub final_logit_softcapping: Option<f64>,
    #[serde(default)]
    pub attention_bias: bool,
}

pub(crate) fn default_head_dim() -> usize {
    256
}

fn default_max_position_embeddings() -> usize {
    8192
}

pub(crate) fn default_activation() -> String {
    "gelu_pytorch_tanh".into()
}

pub(crate) fn default_scalar() -> f64 {
    256.0
}

pub(crate) fn default_sliding_window() -> Option<usize> {
    Some(4096)
}

fn default_attn_softcap() -> Option<f64> {
    Some(50.0)
}

fn default_final_softcap() -> Option<f64> {
    Some(30.0)
}

/// Gemma's feed-forward is GeGLU with the tanh GELU; anything else would be silently wrong.
pub(crate) fn check_gelu_tanh(path: &Path, activation: &str) -> Result<Activation> {
    match activation {
        "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
        other => Err(ModelError::Field {
            path: path.to_path_buf(),
            field: "hidden_activation".into(),
            why: format!("{other:?} is not supported (only gelu_pytorch_tanh)"),
        }),
    }
}

impl Config {
    pub fn architecture(&self, path: &Path) -> Result<Architecture> {
        let shape = FamilyShape {
            family: Family::Gemma2,
            head_dim: self.head_dim,
            rotary_dim: self.head_dim,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            original_max_position_embeddings: None,
            tied_by_default: true,
        };
        let sliding_layers = self.common.sliding_layers(path, |i| i % 2 == 0)?;
        Ok(Architecture {
            attention_bias: self.attention_bias,
            activation: check_gelu_tanh(path, &self.hidden_activation)?,
            sliding_window: self.sliding_window,
            sliding_layers: Some(sliding_layers),
            gemma: Some(GemmaShape {
                query_pre_attn_scalar: self.query_pre_attn_scalar,
                attn_logit_softcapping: self.attn_logit_softcapping,
                final_logit_softcapping: self.final_logit_softcapping,
                local_rope: None,
            }),
            ..self.common.architecture_with_rope(path, shape)?
        })
    }
}
