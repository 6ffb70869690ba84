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

/// The tasks `names` call for, each once in the order first named (`math` and
/// `hendrycks_math` are one task): a task named twice is scored once, which is said.
pub fn distinct<S: AsRef<str>>(names: &[S]) -> Result<Vec<Box<dyn Task>>> {
    let mut seen: Vec<TaskName> = Vec::new();
    let mut tasks = Vec::new();
    for name in names.iter().map(|n| n.as_ref().trim()) {
        let task: TaskName = name.parse()?;
        if seen.contains(&task) {
            tracing::warn!("--tasks: {name} is named twice; it is scored once");
            continue;
        }
        seen.push(task);
        tasks.push(named(name)?);
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_named_twice_is_scored_once() {
        let names = ["hellaswag", " hellaswag", "math", "hendrycks_math", "mmlu"];
        let tasks = distinct(&names).unwrap();
        let found: Vec<&str> = tasks.iter().map(|t| t.name()).collect();
        assert_eq!(found, ["hellaswag", "math", "mmlu"]);
        assert!(distinct(&["hellaswag", "nope"]).is_err());
    }
}
