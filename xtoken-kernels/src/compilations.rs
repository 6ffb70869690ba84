//! How many kernels cubecl has compiled: a profile names the phases that compile (the first
//! step's, and any later one that should not). cubecl logs each compilation, at its basic level
//! one line, to the file [`watch`] names; it reports no compile times. Without a cubecl backend
//! in the build nothing is counted.

use std::path::Path;

/// Starts counting the kernels cubecl compiles, logging them to `log` (made empty). Must come
/// before a GPU device is first used: cubecl reads its configuration once. `false` (nothing
/// counted) when it has read it already, when the user's configuration (`cubecl.toml`,
/// `CUBECL_DEBUG_LOG`) logs compilations itself, or without a cubecl backend in the build.
pub fn watch(log: &Path) -> bool {
    #[cfg(feature = "cube")]
    {
        cube::watch(log)
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = log;
        false
    }
}

/// Kernels compiled since [`watch`] started counting; `None` when nothing is counted.
pub fn count() -> Option<u64> {
    #[cfg(feature = "cube")]
    {
        cube::count()
    }
    #[cfg(not(feature = "cube"))]
    {
        None
    }
}

#[cfg(feature = "cube")]
mod cube {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, OnceLock};

    use cubecl::config::compilation::CompilationLogLevel;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

    /// The log being counted.
    static LOG: OnceLock<PathBuf> = OnceLock::new();

    /// How cubecl starts a line of its basic compilation log.
    const LINE: &str = "[Compiling kernel]";

    pub(super) fn watch(log: &Path) -> bool {
        // Held while the configuration is made, so that no device reads it in between.
        let mut stored = CubeClRuntimeConfig::storage().lock();
        if stored.is_some() || LOG.get().is_some() {
            return false;
        }
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        let logger = &mut config.compilation.logger;
        // Every logger cubecl makes appends to one file that starts empty here.
        let counting = matches!(logger.level, CompilationLogLevel::Disabled)
            && std::fs::File::create(log).is_ok();
        if counting {
            logger.level = CompilationLogLevel::Basic;
            logger.file = Some(log.to_path_buf());
            logger.append = true;
        }
        *stored = Some(Arc::new(config));
        counting && LOG.set(log.to_path_buf()).is_ok()
    }

    pub(super) fn count() -> Option<u64> {
        let log = LOG.get()?;
        let text = std::fs::read_to_string(log).ok()?;
        Some(text.lines().filter(|l| l.starts_with(LINE)).count() as u64)
    }
}
