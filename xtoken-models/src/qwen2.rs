//! Qwen2 and Qwen2.5 (dense, -Math and -Coder alike): Llama's block with biases on the query, key
//! and value projections (not the output's), tied or separate heads, and a sliding window in the
//! layers from `max_window_layers` on when `use_sliding_window` is set (no released checkpoint
//! sets it; transformers honours it, and so does xtoken).

use std::path::Path;

use serde::Deserialize;

use crate::config::{default_rms_norm_eps, Architecture, CommonConfig, Family, FamilyShape};
use crate::error::Result;

/// `config.json` of a `model_type: "qwen2"` checkpoint; absent fields take HF's defaults.
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
    pub use_sliding_window: bool,
    #[serde(default = "default_sliding_window")]
    pub sliding_window: Option<usize>,
    #[serde(default = "default_max_window_layers")]
    pub max_window_layers: usize,
}

fn default_max_position_embeddings() -> usize {
    32_768
}

fn default_sliding_window() -> Option<usize> {
    Some(4096)
}

fn default_max_window_layers() -> usize {
    28
}

impl Config {
    pub fn architecture(&self, path: &Path) -> Result<Architecture> {
        let head_dim = self.head_dim.unwrap_or(self.common.default_head_dim());
        let shape = FamilyShape {
            family: Family::Qwen2,
            head_dim,
            rotary_dim: head_dim,
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
            qkv_bias: true,
            sliding_window: window,
            sliding_layers,
            ..self.common.architecture(path, shape)?
        })
    }
}
