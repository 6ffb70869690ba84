//! The choices a run configuration parses from its strings: dtypes, the device family, where
//! dynamic scaling measures, and the benchmarks' names. They live here, below every stage that
//! acts on them, so that the configuration stands on nothing above it.

use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A dtype key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeChoice {
    /// bf16 where the backend has it, else f32.
    Auto,
    /// 32-bit floats.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl DtypeChoice {
    /// `value` of `key`: `auto` (where `allow_auto`), `f32`, `bf16` or `f16`.
    pub fn parse(key: &str, value: &str, allow_auto: bool) -> Result<Self> {
        Ok(match value {
            "auto" if allow_auto => DtypeChoice::Auto,
            "f32" => DtypeChoice::F32,
            "bf16" => DtypeChoice::Bf16,
            "f16" => DtypeChoice::F16,
            other => {
                return Err(Error::Config(format!(
                    "{key} = {other:?}: expected {}\"f32\", \"bf16\" or \"f16\"",
                    if allow_auto { "\"auto\", " } else { "" }
                )))
            }
        })
    }
}

/// A device family by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU: burn-flex (gemm matmuls; f32, f16 and bf16 tensors), with `auto` dtypes f32:
    /// it converts 16-bit values to f32 around each operation, which costs a CPU time.
    Cpu,
    /// burn-flex with `auto` dtypes bf16: 16-bit numerics on the CPU, for checking them.
    Flex,
    /// burn's ndarray (f32 only), as published: it copies both operands of every matmul, so
    /// a large model runs slower than on `cpu` (BENCHMARKS.md).
    Ndarray,
    /// burn's CUDA backend (cargo feature `cuda`).
    Cuda,
    /// burn's wgpu backend (cargo feature `wgpu`).
    Wgpu,
}

impl DeviceKind {
    /// Whether the backend's memory is the host's.
    pub fn on_host(self) -> bool {
        matches!(
            self,
            DeviceKind::Cpu | DeviceKind::Flex | DeviceKind::Ndarray
        )
    }

    /// The multiple a micro-batch's rows are padded to by default
    /// (`DeviceMemory::length_multiple` of the backend this kind names).
    pub fn length_multiple(self) -> usize {
        match self {
            DeviceKind::Cuda | DeviceKind::Wgpu => xtoken_kernels::memory::CUBE_LENGTH_MULTIPLE,
            DeviceKind::Cpu | DeviceKind::Flex | DeviceKind::Ndarray => 1,
        }
    }
}

impl FromStr for DeviceKind {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "cpu" => Ok(DeviceKind::Cpu),
            "flex" => Ok(DeviceKind::Flex),
            "ndarray" => Ok(DeviceKind::Ndarray),
            "cuda" => Ok(DeviceKind::Cuda),
            "wgpu" => Ok(DeviceKind::Wgpu),
            other => Err(Error::Config(format!(
                "device = {other:?}: expected \"cpu\", \"flex\", \"ndarray\", \"cuda\" or \"wgpu\""
            ))),
        }
    }
}

/// Where dynamic scaling's ratio `γ` and adaptive α are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalingScope {
    /// Once per optimizer step, on the whole step's batch (the paper).
    Step,
    /// The previous step's, on its whole batch; the first step (and the first after resuming
    /// from a checkpoint that holds none) measures its own batch first, as `Step` does.
    PreviousStep,
    /// On each micro-batch's own losses.
    MicroBatch,
}

/// A benchmark of the paper, by the name `[eval] tasks` and `xtoken eval --tasks` give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskName {
    /// MMLU.
    Mmlu,
    /// GSM8k.
    Gsm8k,
    /// MATH (`math` or `hendrycks_math`).
    Math,
    /// WinoGrande.
    WinoGrande,
    /// HellaSwag.
    HellaSwag,
}

impl TaskName {
    /// The names, in the paper's order.
    pub const NAMES: [&'static str; 5] = ["mmlu", "gsm8k", "math", "winogrande", "hellaswag"];
}

impl FromStr for TaskName {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        Ok(match name {
            "mmlu" => TaskName::Mmlu,
            "gsm8k" => TaskName::Gsm8k,
            "math" | "hendrycks_math" => TaskName::Math,
            "winogrande" => TaskName::WinoGrande,
            "hellaswag" => TaskName::HellaSwag,
            other => {
                return Err(Error::Config(format!(
                    "unknown task `{other}` (tasks: {})",
                    Self::NAMES.join(", ")
                )))
            }
        })
    }
}

/// How stored log-probabilities are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueDtype {
    /// 4 bytes per entry, exact: a run trains exactly as with the online teacher.
    F32,
    /// 2 bytes per entry: bf16, rounded to nearest (relative error ≤ 2⁻⁹).
    Bf16,
    /// 1 byte per entry and 8 per position: `q = round((m − x) / s)` with `m` the position's
    /// largest kept value and `s = (m − min) / 255` (absolute error ≤ s / 2).
    Q8,
    /// The compact layout: values as their depth below the position's largest (kept exactly),
    /// a fine code in the head (within 4 nats of it and above probability 1/256; error
    /// ≤ 0.0005), 5-bit codes on a square-law scale below, the kept mass exact; the entries
    /// stored code by code, best first, each code's ids Rice-coded (a code costs its count, not
    /// bits an entry); the confidence terms only with `teach.confidence`. About
    /// `log₂(V/K) + 6` bits an entry.
    Compact,
    /// The compact layout with a code's ids bit-packed 32 at a time (the last fewer than 32
    /// Rice-coded): about 1.2 bits an entry more where a code holds hundreds of ids (K in the
    /// thousands), read ~3× faster; at K ≤ 128 as small as `compact`.
    Packed,
}

impl ValueDtype {
    /// The dtype a `teach.dtype` value names.
    pub fn parse(key: &str, value: &str) -> Result<Self> {
        match value {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            "q8" | "8bit" | "int8" => Ok(Self::Q8),
            "compact" => Ok(Self::Compact),
            "packed" => Ok(Self::Packed),
            _ => Err(Error::Config(format!(
                "{key} = {value:?}: expected \"f32\", \"bf16\", \"q8\" (8-bit relative to each \
                 position's largest value), \"compact\" (ids Rice-coded per value code, best first; a \
                 12-bit head and 5-bit tail codes) or \"packed\" (compact with ids bit-packed 32 at a \
                 time: more bytes at large K, read faster)"
            ))),
        }
    }
    /// Its name in `teach.dtype` and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Q8 => "q8",
            Self::Compact => "compact",
            Self::Packed => "packed",
        }
    }
}

/// `parallel.exchange`: which all-reduce sums the data-parallel workers' gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeChoice {
    /// NCCL on CUDA devices (where the build has it), the ring elsewhere.
    Auto,
    /// NCCL: NVIDIA's collectives over NVLink, PCIe and the network, on CUDA devices only.
    Nccl,
    /// xtoken-collective: a tree over one process's devices, a ring over TCP between processes.
    Ring,
}

/// The all-reduce a run's workers use, once resolved for its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// NCCL ([`ExchangeChoice::Nccl`]).
    Nccl,
    /// xtoken-collective ([`ExchangeChoice::Ring`]).
    Ring,
}

/// Whether this build can sum gradients with NCCL: data parallelism (`collective`) and the
/// CUDA kernels (`cuda` or `cuda-sources`).
pub const NCCL_BUILT: bool = cfg!(all(feature = "collective", feature = "cuda-sources"));

impl ExchangeKind {
    /// Its name in logs and plans.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nccl => "NCCL",
            Self::Ring => "the ring (xtoken-collective)",
        }
    }
}

impl FromStr for ExchangeChoice {
    type Err = Error;

    fn from_str(value: &str) -> Result<Self> {
        match value {
            "auto" => Ok(Self::Auto),
            "nccl" => Ok(Self::Nccl),
            "ring" => Ok(Self::Ring),
            other => Err(Error::Config(format!(
                "parallel.exchange = {other:?}: expected \"auto\", \"nccl\" or \"ring\""
            ))),
        }
    }
}

impl ExchangeChoice {
    /// The all-reduce of `workers` data-parallel workers on `device`; `None` where nothing is
    /// exchanged (one worker, unless NCCL is asked for: then it runs alone, as a check). NCCL
    /// is refused, by name, off CUDA and in a build without it.
    pub fn resolve(self, device: DeviceKind, workers: usize) -> Result<Option<ExchangeKind>> {
        let kind =
            match self {
                Self::Ring => ExchangeKind::Ring,
                Self::Auto if device == DeviceKind::Cuda && NCCL_BUILT => ExchangeKind::Nccl,
                Self::Auto => ExchangeKind::Ring,
                Self::Nccl if device != DeviceKind::Cuda => {
                    return Err(Error::Config(format!(
                    "parallel.exchange = \"nccl\" sums buffers of NVIDIA GPUs: it needs --device \
                     cuda, not {device:?} (\"ring\" or \"auto\" run on every device)"
                )))
                }
                Self::Nccl if !NCCL_BUILT => return Err(Error::Config(
                    "parallel.exchange = \"nccl\": this xtoken was built without NCCL (build it \
                     with `--features cuda,collective`)"
                        .into(),
                )),
                Self::Nccl => return Ok(Some(ExchangeKind::Nccl)),
            };
        Ok((workers > 1).then_some(kind))
    }
}

/// How to reach a served teacher.
#[derive(Debug, Clone)]
pub struct ServedSettings {
    /// The teacher's name in the run.
    pub name: String,
    /// The API's base, e.g. `http://host:8000/v1`.
    pub server: String,
    /// The model's name as the server's `/v1/models` lists it.
    pub model: String,
    /// Requests in flight at once.
    pub requests: usize,
    /// The longest a request may take.
    pub timeout: Duration,
    /// Times a failed request is sent again before the run ends.
    pub retries: u32,
    /// Whether the binary answer may be asked for where the server offers it.
    pub format: Format,
}

/// The answer format a served teacher is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// xtoken's binary layout where the server offers it, else JSON.
    Negotiate,
    /// JSON, vLLM's shape, always.
    Json,
}
