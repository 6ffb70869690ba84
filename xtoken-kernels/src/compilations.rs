//! cubecl's kernel compilations: kept on disk between runs, and counted.
//!
//! cubecl reads its configuration once per process, at the first use of a device; [`configure`]
//! writes it before that, with two things of ours:
//! - **The kernel cache** ([`KernelCache`]): the autotune results (which kernel won for each
//!   shape class) and, on CUDA, the compiled PTX, in one directory, so that a second run skips
//!   the autotuning and the compiler. cubecl keeps one file per device and kernel family there
//!   and locks a file while it writes it, so processes (the ranks of a run, several runs) may
//!   share one directory, on a shared file system too. On wgpu only the autotune results are
//!   kept (cubecl 0.10 keeps compiled kernels for its SPIR-V path alone, which the build does
//!   not use).
//! - **The compilation log** a profile counts (the first step's compilations, and any later
//!   one that should not be): at its basic level cubecl logs one line per compiled kernel,
//!   naming it; it reports no compile times.
//!
//! Without a cubecl backend in the build nothing is configured or counted.

use std::path::{Path, PathBuf};

/// The environment variable that names the kernel cache's directory (`off`: cubecl's own
/// configuration, `cubecl.toml` or its defaults, decides).
pub const CACHE_VARIABLE: &str = "XTOKEN_KERNEL_CACHE";

/// Where cubecl keeps its autotune results and compiled kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// In this directory (made when missing).
    Dir(PathBuf),
    /// Wherever cubecl's own configuration says.
    Cubecl,
}

impl KernelCache {
    /// From [`CACHE_VARIABLE`]: a directory, `off`, or unset for [`KernelCache::default_dir`]
    /// (`Cubecl` when there is no home directory to put it in).
    pub fn from_env() -> Self {
        match std::env::var_os(CACHE_VARIABLE) {
            Some(v) if v == "off" => Self::Cubecl,
            Some(v) if !v.is_empty() => Self::Dir(PathBuf::from(v)),
            _ => Self::default_dir().map_or(Self::Cubecl, Self::Dir),
        }
    }

    /// `$XDG_CACHE_HOME/xtoken/kernels`, else `$HOME/.cache/xtoken/kernels`.
    pub fn default_dir() -> Option<PathBuf> {
        user_cache_dir("kernels")
    }
}

/// xtoken's directory `name` in the user's cache: `$XDG_CACHE_HOME/xtoken/NAME`, else
/// `$HOME/.cache/xtoken/NAME`; `None` without either variable.
pub fn user_cache_dir(name: &str) -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
    };
    Some(base.join("xtoken").join(name))
}

/// What [`configure`] set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Configured {
    /// cubecl keeps its autotune results and compiled kernels in the [`KernelCache::Dir`].
    pub cache: bool,
    /// The compilations are counted ([`count`], [`kernels`]).
    pub counting: bool,
}

/// Writes cubecl's configuration: `cache`, and with `log` the compilation log (made empty) that
/// [`count`] reads. Must come before a GPU device is first used; a second call, or one after
/// cubecl has read its configuration, changes nothing and returns all `false`. The log is not
/// counted when the user's configuration (`cubecl.toml`, `CUBECL_DEBUG_LOG`) logs compilations
/// itself or the file cannot be made; the cache is not set when its directory cannot be made.
pub fn configure(cache: &KernelCache, log: Option<&Path>) -> Configured {
    #[cfg(feature = "cube")]
    {
        cube::configure(cache, log)
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = (cache, log);
        Configured::default()
    }
}

/// Kernels compiled since [`configure`] started counting; `None` when nothing is counted.
pub fn count() -> Option<u64> {
    kernels().map(|names| names.len() as u64)
}

/// The names of the kernels compiled since [`configure`] started counting, in order (a kernel
/// compiled twice, say for two dtypes, appears twice); `None` when nothing is counted.
pub fn kernels() -> Option<Vec<String>> {
    #[cfg(feature = "cube")]
    {
        cube::kernels()
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

    use cubecl::config::cache::CacheConfig;
    use cubecl::config::compilation::CompilationLogLevel;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

    use super::{Configured, KernelCache};

    /// The log being counted.
    static LOG: OnceLock<PathBuf> = OnceLock::new();

    /// How cubecl starts a line of its basic compilation log.
    const LINE: &str = "[Compiling kernel]";

    pub(super) fn configure(cache: &KernelCache, log: Option<&Path>) -> Configured {
        // Held while the configuration is made, so that no device reads it in between.
        let mut stored = CubeClRuntimeConfig::storage().lock();
        if stored.is_some() {
            return Configured::default();
        }
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        let cached = match cache {
            KernelCache::Dir(dir) if std::fs::create_dir_all(dir).is_ok() => {
                config.autotune.cache = CacheConfig::File(dir.clone());
                config.compilation.cache = Some(CacheConfig::File(dir.clone()));
                true
            }
            _ => false,
        };
        let logger = &mut config.compilation.logger;
        // Every logger cubecl makes appends to one file that starts empty here.
        let counting = log.is_some_and(|log| {
            matches!(logger.level, CompilationLogLevel::Disabled)
                && std::fs::File::create(log).is_ok()
                && LOG.set(log.to_path_buf()).is_ok()
        });
        if let (true, Some(log)) = (counting, log) {
            logger.level = CompilationLogLevel::Basic;
            logger.file = Some(log.to_path_buf());
            logger.append = true;
        }
        *stored = Some(Arc::new(config));
        Configured {
            cache: cached,
            counting,
        }
    }

    pub(super) fn kernels() -> Option<Vec<String>> {
        let log = LOG.get()?;
        let text = std::fs::read_to_string(log).ok()?;
        let names = text.lines().filter_map(|l| l.strip_prefix(LINE));
        Some(names.map(|name| name.trim().to_string()).collect())
    }
}
