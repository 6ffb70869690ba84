//! Llama (Llama-2, Llama-3.x): GQA, SwiGLU, RMSNorm, rotate-half RoPE with Llama-3's
//! frequency-dependent `rope_scaling`, tied or separate output head.

use std::path::Path;

use serde::Deserialize;

use crate::config::{default_rms_norm_eps, Architecture, CommonConfig, Family, FamilyShape};
use crate::error::Result;

/// `config.json` of a `model_type: "llama"` checkpoint; absent fields take HF's defaults.
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub common: CommonConfig,
    pub head_dim: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
}

fn default_max_position_embeddings() -> usize {
    2048
}

impl Config {
    pub fn architecture(&self, path: &Path) -> Result<Architecture> {
        let head_dim = self.head_dim.unwrap_or(self.common.default_head_dim());
        let shape = FamilyShape {
            family: Family::Llama,
            head_dim,
            rotary_dim: head_dim,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            original_max_position_embeddings: None,
            tied_by_default: false,
        };
        Ok(Architecture {
            attention_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            ..self.common.architecture(path, shape)?
        })
    }
}
