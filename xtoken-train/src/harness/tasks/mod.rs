//! The paper's five benchmarks, each in lm-evaluation-harness's definition (the task named
//! after it there): `mmlu`, `gsm8k`, `hendrycks_math` (here `math`), `winogrande`,
//! `hellaswag`.

mod gsm8k;
mod hellaswag;
pub mod math;
mod mmlu;
mod winogrande;

pub use gsm8k::Gsm8k;
pub use hellaswag::HellaSwag;
pub use math::Math;
pub use mmlu::Mmlu;
pub use winogrande::WinoGrande;

use super::task::Task;
use crate::config::TaskName;
use crate::error::Result;

/// The tasks by name, in the paper's order.
pub const NAMES: [&str; 5] = TaskName::NAMES;

/// The task called `name` (see [`TaskName`]).
pub fn named(name: &str) -> Result<Box<dyn Task>> {
    Ok(match name.parse::<TaskName>()? {
        TaskName::Mmlu => Box::new(Mmlu),
        TaskName::Gsm8k => Box::new(Gsm8k),
        TaskName::Math => Box::new(Math),
        TaskName::WinoGrande => Box::new(WinoGrande),
        TaskName::HellaSwag => Box::new(HellaSwag),
    })
}
