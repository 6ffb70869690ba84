//! Llama, Mistral, Qwen2/2.5, Qwen3, Phi-3/Phi-4-mini, Gemma-2 and Gemma-3 as burn modules, loaded from Hugging Face `config.json`
//! and safetensors checkpoints and saved back in that layout, behind one [`CausalLm`] trait.
//!
//! ```no_run
//! use burn::backend::NdArray;
//! use burn::tensor::{Int, Tensor};
//! use xtoken_models::{CausalLm, Transformer};
//!
//! let device = Default::default();
//! let model = Transformer::<NdArray>::load("Llama-3.2-1B".as_ref(), &device)?;
//! let ids = Tensor::<NdArray, 2, Int>::from_ints([[128000, 9906, 1917, 13]], &device);
//! let logits = model.forward(ids, None)?; // [1, 4, 128256]
//! # Ok::<(), xtoken_models::ModelError>(())
//! ```

pub mod cache;
pub mod checkpoint;
pub mod config;
mod error;
pub mod gemma2;
pub mod gemma3;
pub mod generate;
mod hub;
pub mod llama;
pub mod masking;
pub mod mistral;
pub mod model;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
mod recompute;
pub mod rope;
pub mod sampling;
pub mod scoring;
mod tokens;

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use xtoken_kernels::XTokenBackend;

pub use cache::KvCache;
pub use checkpoint::SaveDtype;
pub use config::{Activation, Architecture, Family, GemmaShape, HfConfig};
pub use error::{ModelError, Result};
pub use generate::Decoding;
pub use hub::{LoadOptions, WRITER_FIELD};
pub use masking::{AttentionKernel, Masking};
pub use model::Transformer;
pub use recompute::Backward;
pub use sampling::Sampling;
pub use scoring::{token_log_probs, TokenScores};
pub use tokens::Tokens;

/// A causal language model: token ids in, next-token logits out. The hidden states are exposed
/// separately so a loss can fuse the output head instead of materialising the logits.
pub trait CausalLm<B: Backend> {
    fn vocab_size(&self) -> usize;

    /// `ids` `[batch, len]` → hidden states after the final norm, `[batch, len, hidden]`.
    /// `padding` is `true` at padded positions (pad on the right).
    fn hidden_states(
        &self,
        ids: Tensor<B, 2, Int>,
        padding: Option<Tensor<B, 2, Bool>>,
    ) -> Result<Tensor<B, 3>>;

    /// The output head: `[batch, len, hidden]` → `[batch, len, vocab]`.
    fn logits_from_hidden(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3>;

    /// `ids` `[batch, len]` → logits `[batch, len, vocab]`.
    fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        padding: Option<Tensor<B, 2, Bool>>,
    ) -> Result<Tensor<B, 3>> {
        Ok(self.logits_from_hidden(self.hidden_states(ids, padding)?))
    }
}

impl<B: XTokenBackend> CausalLm<B> for Transformer<B> {
    fn vocab_size(&self) -> usize {
        self.architecture.vocab_size
    }

    fn hidden_states(
        &self,
        ids: Tensor<B, 2, Int>,
        padding: Option<Tensor<B, 2, Bool>>,
    ) -> Result<Tensor<B, 3>> {
        Transformer::hidden_states(self, ids, padding)
    }

    fn logits_from_hidden(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        Transformer::logits_from_hidden(self, hidden)
    }
}
