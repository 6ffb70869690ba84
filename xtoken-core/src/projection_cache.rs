//! W built once per tokenizer pair. Building W encodes every student token without an exact
//! partner with the teacher's tokenizer (tens of thousands of texts for Llama-3.2 against
//! Qwen3), so a run reads it from a cache in the user's cache directory when the same pair was
//! built before with the same parameters: an entry's name is the SHA-256 of both tokenizer
//! files' hashes and sizes, W's parameters and [`BUILD_VERSION`]. An entry is verified as a
//! run's own W file is (the tokenizers' hashes and vocabulary sizes); one that fails is built
//! again and replaced. The cache only accelerates: where it cannot be read or written, W is
//! built as without it.

use std::path::{Path, PathBuf};

use crate::projection::{ProjectionParams, SparseProjection};
use crate::temporary::Temporary;
use crate::vocab::{sha256_hex, Vocabulary};
use crate::Result;

/// The environment variable that names the cache's directory (`off`: no cache).
pub const VARIABLE: &str = "XTOKEN_PROJECTION_CACHE";

/// The version of W's construction: entries of another version are never read. Bump it with
/// any change to what [`SparseProjection::build`] makes of the same tokenizers and parameters
/// (a test holds a built W's digest, and fails until it is bumped).
pub const BUILD_VERSION: u32 = 1;

/// Where built projections are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectionCache {
    /// In this directory (made when first written).
    Dir(PathBuf),
    /// Nowhere: W is built every time.
    Off,
}

/// Where a W came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Read from this cache entry.
    Cached(PathBuf),
    /// Built, and stored in this entry (`None`: no cache, or it could not be written).
    Built(Option<PathBuf>),
}

impl ProjectionCache {
    /// From [`VARIABLE`]: a directory, `off`, or unset for `xtoken/projections` in the user's
    /// cache directory (`Off` without a home directory).
    pub fn from_env() -> Self {
        match std::env::var_os(VARIABLE) {
            Some(v) if v == "off" => Self::Off,
            Some(v) if !v.is_empty() => Self::Dir(PathBuf::from(v)),
            _ => xtoken_kernels::compilations::user_cache_dir("projections")
                .map_or(Self::Off, Self::Dir),
        }
    }

    /// The entry W of this pair and these parameters is kept in (`None`: no cache).
    pub fn entry(
        &self,
        student: &Vocabulary,
        teacher: &Vocabulary,
        params: &ProjectionParams,
    ) -> Option<PathBuf> {
        let Self::Dir(dir) = self else {
            return None;
        };
        let key = format!(
            "xtoken W v{BUILD_VERSION}\nstudent {} {}\nteacher {} {}\n{params:?}",
            student.sha256(),
            student.size(),
            teacher.sha256(),
            teacher.size()
        );
        Some(dir.join(format!(
            "{}.W.safetensors",
            &sha256_hex(key.as_bytes())[..32]
        )))
    }

    /// W of the pair: the cache's entry where it holds one that verifies, else built (and
    /// stored when there is a cache: a failure to store is logged, not an error).
    pub fn get_or_build(
        &self,
        student: &Vocabulary,
        teacher: &Vocabulary,
        params: ProjectionParams,
    ) -> Result<(SparseProjection, Source)> {
        let entry = self.entry(student, teacher, &params);
        if let Some(path) = entry.as_ref().filter(|p| p.is_file()) {
            match SparseProjection::load_verified(path, student, teacher) {
                Ok(w) if w.top_k() == params.top_k => return Ok((w, Source::Cached(path.clone()))),
                Ok(_) => tracing::warn!("{}: not this W's top-K; building W", path.display()),
                Err(e) => tracing::warn!("{}: {e}; building W again", path.display()),
            }
        }
        let (w, _) = SparseProjection::build(student, teacher, params)?;
        let stored = entry.filter(|path| match store(&w, path) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("W not cached at {}: {e}", path.display());
                false
            }
        });
        Ok((w, Source::Built(stored)))
    }
}

/// Writes `w` to `path` under a temporary name first, so that a reader never sees half of it.
fn store(w: &SparseProjection, path: &Path) -> std::result::Result<(), String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let partial = Temporary::beside(path, "partial");
    w.save(partial.path()).map_err(|e| e.to_string())?;
    partial.persist(path).map_err(|e| e.to_string())
}
