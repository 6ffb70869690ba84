//! The choices a run configuration parses from its strings: dtypes, the device family, where
//! dynamic scaling measures, and the benchmarks' names. They live here, below every stage that
//! acts on them, so that the configuration stands on nothing above it.

use std::str::FromStr;

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
    pub(super) fn parse(key: &str, value: &str, allow_auto: bool) -> Result<Self> {
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
}

impl ValueDtype {
    /// The dtype a `teach.dtype` value names.
    pub fn parse(key: &str, value: &str) -> Result<Self> {
        match value {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            "q8" | "8bit" | "int8" => Ok(Self::Q8),
            _ => Err(Error::Config(format!(
                "{key} = {value:?}: expected \"f32\", \"bf16\" or \"q8\" (8-bit relative to each \
                 position's largest value)"
            ))),
        }
    }
    /// Its name in `teach.dtype` and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Q8 => "q8",
        }
    }
}
