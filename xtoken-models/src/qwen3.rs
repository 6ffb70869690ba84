//! Qwen3 (dense): Llama's block plus a per-head RMSNorm of queries and keys before RoPE, and a
//! `head_dim` that need not equal `hidden_size / num_attention_heads`; with
//! `use_sliding_window` (no released checkpoint sets it), Qwen2's sliding window in the layers
//! from `max_window_layers` on.

use std::path::Path;

use serde::Deserialize;

use crate::config::{default_rms_norm_eps, Architecture, CommonConfig, Family, FamilyShape};
use crate::error::Result;

/// `config.json` of a `model_type: "qwen3"` checkpoint; absent fields take HF's defaults.
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
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub use_sliding_window: bool,
    #[serde(default = "default_sliding_window")]
    pub sliding_window: Option<usize>,
    #[serde(default = "default_max_window_layers")]
    pub max_window_layers: usize,
}

fn default_sliding_window() -> Option<usize> {
    Some(4096)
}

fn default_max_window_layers() -> usize {
    28
}

fn default_head_dim() -> usize {
    128
}

fn default_max_position_embeddings() -> usize {
    32_768
}

impl Config {
    pub fn architecture(&self, path: &Path) -> Result<Architecture> {
        let shape = FamilyShape {
            family: Family::Qwen3,
            head_dim: self.head_dim,
            rotary_dim: self.head_dim,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            original_max_position_embeddings: None,
            tied_by_default: false,
        };
        let (window, sliding_layers) = self.common.qwen_window(
            path,
            self.use_sliding_window,
            self.sliding_window,
            self.max_window_layers,
        )?;
        Ok(Architecture {
            attention_bias: self.attention_bias,
            qk_norm: true,
            sliding_window: window,
            sliding_layers,
            ..self.common.architecture(path, shape)?
        })
    }
}
