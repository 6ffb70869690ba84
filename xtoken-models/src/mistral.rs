//! Mistral (Mistral-7B v0.1–v0.3, and the Llama-shaped Ministral checkpoints): Llama's block
//! with a sliding window over every layer where the config sets `sliding_window` (v0.1's 4096;
//! v0.2 and v0.3 publish `null`, full attention).

use std::path::Path;

use serde::Deserialize;

use crate::config::{default_rms_norm_eps, Architecture, CommonConfig, Family, FamilyShape};
use crate::error::Result;

/// `config.json` of a `model_type: "mistral"` checkpoint; absent fields take HF's defaults.
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub common: CommonConfig,
    pub head_dim: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: usize,
    /// Absent: transformers' default of 4096; `null`: full attention.
    #[serde(default = "default_sliding_window")]
    pub sliding_window: Option<usize>,
}

fn default_max_position_embeddings() -> usize {
    4096 * 32
}

fn default_sliding_window() -> Option<usize> {
    Some(4096)
}

impl Config {
    pub fn architecture(&self, path: &Path) -> Result<Architecture> {
        let head_dim = self.head_dim.unwrap_or(self.common.default_head_dim());
        let shape = FamilyShape {
            family: Family::Mistral,
            head_dim,
            rotary_dim: head_dim,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            original_max_position_embeddings: None,
            tied_by_default: false,
        };
        Ok(Architecture {
            sliding_window: self.sliding_window,
            ..self.common.architecture(path, shape)?
        })
    }
}
