//! The CUDA source of every kernel X-Token launches, made without a GPU, for NVRTC to compile
//! ahead of the first run on one (`scripts/cuda-compile.sh`).
//!
//! cubecl-cuda turns each kernel into CUDA C++ when it is first launched and compiles it with
//! NVRTC there; a kernel that compiles to WGSL can still fail on CUDA (bf16 conversions,
//! shared-memory atomics, warp operations). `record` runs the [`workload`] on a recording
//! cubecl runtime (`RecordRuntime`: cubecl-cuda's compiler, its device properties for one
//! architecture, host memory, nothing executed) in f32, bf16 and f16, and returns each distinct
//! kernel's source; `emit` writes them with a manifest. Those three need the feature `cuda`;
//! the workload and the manifest's names do not.

#[cfg(feature = "cuda")]
mod runtime;
pub mod workload;

use std::path::{Path, PathBuf};

use burn::tensor::DType;
#[cfg(feature = "cuda")]
use burn_cubecl::{CubeBackend, FloatElement};

#[cfg(feature = "cuda")]
pub use runtime::{CudaCompiler, RecordDevice, RecordRuntime, RecordServer};

use crate::KernelError;

/// The architectures `emit` writes: sm_90 (H100, H200) and sm_80 (A100).
pub const ARCHS: [u16; 2] = [90, 80];

/// The float dtypes the workload runs in.
pub const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// One kernel as cubecl-cuda would compile it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The architecture it was compiled for (compute capability × 10).
    pub arch: u32,
    /// The kernel's Rust type name.
    pub name: String,
    /// The workload step that first launched it (dtype and operation).
    pub context: String,
    /// The `extern "C"` function NVRTC compiles.
    pub entrypoint: String,
    /// Its cube (block) size.
    pub cube_dim: (u32, u32, u32),
    /// The dynamic shared memory a launch gives it, in bytes.
    pub shared_bytes: usize,
    /// The CUDA C++ source, or why cubecl could not produce it.
    pub source: Result<String, String>,
}

impl Recorded {
    /// The kernel's name without its module path or type parameters.
    pub fn short_name(&self) -> &str {
        let plain = self.name.split('<').next().unwrap_or(&self.name);
        plain.rsplit("::").next().unwrap_or(plain)
    }

    /// `xtoken` for X-Token's kernels, `burn` for burn's and cubecl's that its operations launch
    /// around them (casts, copies).
    pub fn origin(&self) -> &'static str {
        if self.name.starts_with("xtoken_kernels") {
            "xtoken"
        } else {
            "burn"
        }
    }

    /// Units per cube.
    pub fn threads(&self) -> u32 {
        self.cube_dim.0 * self.cube_dim.1 * self.cube_dim.2
    }
}

/// Runs the workload in every dtype of [`DTYPES`] on the recording device for `arch` and
/// returns the kernels it launched, each once, in the order of their first launch (the same
/// list at every call in a process).
#[cfg(feature = "cuda")]
pub fn record(arch: u16) -> Result<Vec<Recorded>, KernelError> {
    // One workload at a time: the labels are global, and a device compiles each kernel once.
    static RUNNING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
    for dtype in DTYPES {
        match dtype {
            DType::F32 => in_dtype::<f32>(arch, dtype)?,
            DType::BF16 => in_dtype::<burn::tensor::bf16>(arch, dtype)?,
            _ => in_dtype::<burn::tensor::f16>(arch, dtype)?,
        }
    }
    Ok(runtime::recorded(u32::from(arch)))
}

#[cfg(feature = "cuda")]
fn in_dtype<F: FloatElement>(arch: u16, dtype: DType) -> Result<(), KernelError> {
    type On<F> = CubeBackend<RecordRuntime, F, i32, u8>;
    let device = RecordDevice { arch };
    workload::run_on::<On<F>>(&device, dtype, &mut |what| runtime::set_context(what))
}

/// Why `emit` failed.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// The output directory holds files: nothing is written over.
    #[error("{0} exists and is not empty; give a new directory")]
    NotEmpty(PathBuf),
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The workload failed.
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

/// The manifest's columns, tab-separated, one kernel per line after this header.
pub const MANIFEST_HEADER: &str =
    "arch\tfile\tentrypoint\tkernel\torigin\tcube_dim\tthreads\tdynamic_shared_bytes\tlaunched_by";

/// The manifest's name in an emitted directory.
pub const MANIFEST: &str = "manifest.tsv";

/// Whether the file at `path` is a manifest `emit` wrote (its first line is the header).
pub fn is_manifest(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| text.lines().next() == Some(MANIFEST_HEADER))
}

/// Writes, for each architecture of `archs`, every recorded kernel's source into
/// `dir/sm_<arch>-<n>-<kernel>.cu` and one line per kernel into `dir/manifest.tsv`
/// ([`MANIFEST_HEADER`]), all in the one directory (`scripts/cuda-compile.sh` adds each
/// kernel's `.ptx` and `report.md` beside them). `dir` must not exist or be empty. A kernel cubecl could not turn
/// into CUDA is written as a `.error` file with the reason, and listed: the compile script
/// counts it as a failure. Returns the kernels per architecture.
#[cfg(feature = "cuda")]
pub fn emit(dir: &Path, archs: &[u16]) -> Result<Vec<(u16, Vec<Recorded>)>, EmitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EmitError::Io { path, source }
    };
    if dir.exists() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(EmitError::NotEmpty(dir.to_path_buf()));
    }
    let manifest_path = dir.join(MANIFEST);
    let mut manifest = vec![MANIFEST_HEADER.to_string()];
    let mut all = Vec::new();
    for &arch in archs {
        let kernels = record(arch)?;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for (i, k) in kernels.iter().enumerate() {
            let (ext, text) = match &k.source {
                Ok(source) => ("cu", source),
                Err(why) => ("error", why),
            };
            let file = format!("sm_{arch}-{i:03}-{}.{ext}", k.short_name());
            let path = dir.join(&file);
            std::fs::write(&path, text).map_err(io(&path))?;
            let (x, y, z) = k.cube_dim;
            manifest.push(format!(
                "{arch}\t{file}\t{}\t{}\t{}\t{x}x{y}x{z}\t{}\t{}\t{}",
                k.entrypoint,
                k.short_name(),
                k.origin(),
                k.threads(),
                k.shared_bytes,
                k.context
            ));
        }
        all.push((arch, kernels));
    }
    use std::io::Write;
    let mut out = std::fs::File::create(&manifest_path).map_err(io(&manifest_path))?;
    writeln!(out, "{}", manifest.join("\n")).map_err(io(&manifest_path))?;
    Ok(all)
}
