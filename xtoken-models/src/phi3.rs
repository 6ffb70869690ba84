//! Phi-3 and Phi-4-mini: fused `qkv_proj` and `gate_up_proj`, RoPE on only the first
//! `partial_rotary_factor · head_dim` channels, LongRoPE whose short or long factors are chosen
//! per forward pass by its length, and an optional sliding attention window.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::config::{Architecture, CommonConfig, Family, FamilyShape};
use crate::error::Result;

/// `config.json` of a `model_type: "phi3"` checkpoint; absent fields take HF's defaults.
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    #[serde(flatten)]
    pub common: CommonConfig,
    pub head_dim: Option<usize>,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    pub partial_rotary_factor: Option<f64>,
    #[serde(default = "default_max_position_embeddings")]
    pub max_position_embeddings: usize,
    pub original_max_position_embeddings: Option<usize>,
    pub sliding_window: Option<usize>,
}

fn default_rms_norm_eps() -> f64 {
    1e-5
}

fn default_max_position_embeddings() -> usize {
    4096
}

impl Config {
    pub fn architecture(&self, path: &Path) -> Result<Architecture> {
        let head_dim = self.head_dim.unwrap_or(self.common.default_head_dim());
        // transformers 5 moves the factor into `rope_parameters`.
        let partial = self
            .partial_rotary_factor
            .or_else(|| {
                self.common
                    .rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("partial_rotary_factor"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(1.0);
        let shape = FamilyShape {
            family: Family::Phi3,
            head_dim,
            rotary_dim: (head_dim as f64 * partial) as usize,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            original_max_position_embeddings: self.original_max_position_embeddings,
            tied_by_default: false,
        };
        Ok(Architecture {
            fused_projections: true,
            sliding_window: self.sliding_window,
            ..self.common.architecture(path, shape)?
        })
    }
}
