//! X-Token's host algorithms: the tokenizer layer (exact-byte vocabularies and canonicalization),
//! the projection matrix W, the common sets of the hybrid losses, and the coverage audit.
//!
//! ```no_run
//! use xtoken_core::{audit, projection::{ProjectionParams, SparseProjection}, vocab::Vocabulary};
//! let (student, teacher) = Vocabulary::load_pair(
//!     ("tokenizers/llama-3.2", None),
//!     ("tokenizers/qwen3", Some(151_936)),
//! )?;
//! let (w, report) = SparseProjection::build(&student, &teacher, ProjectionParams::default())?;
//! w.save("llama-qwen.W.safetensors")?;
//! let audit = audit::audit(&student, &teacher, &w, &Default::default());
//! println!("{}", audit.to_markdown());
//! # Ok::<(), xtoken_core::Error>(())
//! ```

pub mod align;
pub mod audit;
pub mod cache;
pub mod canon;
pub mod common;
pub mod error;
pub mod loss;
pub mod matching;
pub mod plan;
pub mod projection;
pub mod projection_cache;
/// Files written under a temporary name (kept in `xtoken-kernels`, below the models' writers).
pub use xtoken_kernels::temporary;
pub mod vocab;

pub use error::{Error, Result};
