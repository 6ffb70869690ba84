//! xtoken: cross-tokenizer knowledge distillation of language models (the X-Token method) on burn.
//!
//! This facade re-exports the workspace crates so that a user depends on one package:
//! [`core`] holds the tokenizer layer, the projection matrix W and the coverage audit.

pub use xtoken_core as core;
pub use xtoken_core::{Error, Result};
