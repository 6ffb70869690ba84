//! Shared by the test targets that read the real tokenizers (also included by `xtoken-train`'s
//! CLI tests through `#[path]`).

use std::path::{Path, PathBuf};

#[allow(dead_code)]
pub mod gemma_like;

/// Why a real-tokenizer test cannot run.
pub const NEEDS: &str =
    "needs XTOKEN_TOKENIZERS_DIR (the real tokenizers, e.g. ../shared/tokenizers)";

/// The folder of real tokenizers: `XTOKEN_TOKENIZERS_DIR` at run time, else at build time; a
/// relative path is tried from the working directory, then from the crate and its parents.
pub fn tokenizers_dir() -> PathBuf {
    let dir = std::env::var("XTOKEN_TOKENIZERS_DIR")
        .ok()
        .or(option_env!("XTOKEN_TOKENIZERS_DIR").map(String::from))
        .expect(NEEDS);
    let dir = PathBuf::from(dir);
    if dir.is_absolute() || dir.exists() {
        return dir;
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|a| a.join(&dir))
        .find(|p| p.exists())
        .unwrap_or(dir)
}
