//! xtoken: cross-tokenizer knowledge distillation of language models (the X-Token method) on burn.
//!
//! This facade re-exports the workspace crates so that a user depends on one package:
//! [`core`] holds the tokenizer layer, the projection matrix W, the coverage audit, the DP
//! alignment and the chunk plans; [`loss`] the distillation losses (KL, ULD, GOLD, P-KL, H-KL,
//! multi-teacher, dynamic scaling) for a burn training loop; [`kernels`] the backend extension
//! they run on; [`models`] Llama-3, Qwen3 and Phi-3/Phi-4-mini loaded from (and saved to)
//! Hugging Face model directories; [`train`] the run configuration, the data pipeline (in-memory
//! alignment, the alignment cache, packing, the loader), the training step and loop,
//! checkpoints and data parallelism. The book (`docs/`) maps the crates and the math.

pub use xtoken_core as core;
pub use xtoken_core::loss;
pub use xtoken_core::{Error, Result};
pub use xtoken_kernels as kernels;
pub use xtoken_kernels::XTokenBackend;
pub use xtoken_models as models;
pub use xtoken_models::{CausalLm, Transformer};
pub use xtoken_train as train;
