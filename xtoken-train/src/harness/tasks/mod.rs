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
use crate::error::{Error, Result};

/// The tasks by name, in the paper's order.
pub const NAMES: [&str; 5] = ["mmlu", "gsm8k", "math", "winogrande", "hellaswag"];

/// The task called `name`.
pub fn named(name: &str) -> Result<Box<dyn Task>> {
    Ok(match name {
        "mmlu" => Box::new(Mmlu),
        "gsm8k" => Box::new(Gsm8k),
        "math" | "hendrycks_math" => Box::new(Math),
        "winogrande" => Box::new(WinoGrande),
        "hellaswag" => Box::new(HellaSwag),
        other => {
            return Err(Error::Config(format!(
                "unknown task `{other}` (tasks: {})",
                NAMES.join(", ")
            )))
        }
    })
}
