//! What a resumed run may change: the fields that touch neither the math nor the data order
//! (logging, checkpoint cadence and retention, held-out evaluation, loader threads and prefetch,
//! the device) freely;
//! `training.steps` with an explicit [`Extension`] that says how the learning rate continues;
//! anything else is refused, naming the field.

use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::error::{Error, Result};

/// How the learning-rate schedule continues when a resumed run changes `training.steps`
/// (`xtoken train --resume --extend-steps MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Extension {
    /// From the learning rate reached at the resumed step, a half cosine down to
    /// `training.min_lr` at the new last step: no jump.
    Decay,
    /// The schedule recomputed over the new total, as if planned so from the start: the rate
    /// jumps to where that schedule stands at the resumed step.
    Stretch,
}

impl std::str::FromStr for Extension {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "decay" => Ok(Extension::Decay),
            "stretch" => Ok(Extension::Stretch),
            other => Err(Error::Config(format!(
                "--extend-steps {other}: expected `decay` or `stretch`"
            ))),
        }
    }
}

/// The configuration as resolved for this run, for the comparison on `--resume` (the device
/// may change between a run and its resumption).
pub(crate) fn resolved_text(config: &RunConfig) -> Result<String> {
    let mut c = config.clone();
    c.device = String::new();
    toml::to_string(&c).map_err(|e| Error::Config(format!("writing run.toml: {e}")))
}

/// The configuration with every field a resumed run may change set to one value.
fn fixed_part(config: &RunConfig) -> RunConfig {
    let mut c = config.clone();
    c.device = String::new();
    c.training.log_every = 1;
    c.training.steps = 1;
    c.checkpoint.every = 1;
    c.checkpoint.keep = 1;
    c.checkpoint.hf = false;
    c.eval = None;
    c.data.workers = 0;
    c.data.prefetch = 1;
    c
}

/// Checks that `config` may resume the run `saved` started: an error names each field that
/// changed and may not, and a changed `training.steps` needs `extension`. Returns whether the
/// steps changed.
pub fn check(saved: &RunConfig, config: &RunConfig, extension: Option<Extension>) -> Result<bool> {
    let (a, b) = (
        as_value(&fixed_part(saved))?,
        as_value(&fixed_part(config))?,
    );
    let mut changed = Vec::new();
    differing_keys("", &a, &b, &mut changed);
    if !changed.is_empty() {
        return Err(Error::Run(format!(
            "{} changed since the run started; it changes the math or the data order, so the run \
             cannot resume with it (restore it, or start a new run in another output_dir). A \
             resumed run may change training.log_every, checkpoint.every, checkpoint.keep, \
             checkpoint.hf, [eval], data.workers, data.prefetch and the device, and training.steps with --extend-steps",
            changed.join(", ")
        )));
    }
    let (was, now) = (saved.training.steps, config.training.steps);
    match (was == now, extension) {
        (true, None) => Ok(false),
        (true, Some(_)) => Err(Error::Config(format!(
            "--extend-steps: training.steps is still {now}; raise it in the configuration"
        ))),
        (false, _) if now < was => Err(Error::Config(format!(
            "training.steps = {now}: fewer than the run's {was}, and a run is never shortened \
             (its schedule depends on the total); restore {was}, and pass --stop-after {now} to \
             stop after step {now}"
        ))),
        (false, None) => Err(Error::Config(format!(
            "training.steps = {now}: the run was started with {was}; pass --extend-steps decay \
             (the rate reached decays to min_lr at the new end) or --extend-steps stretch (the \
             schedule recomputed over {now} steps)"
        ))),
        (false, Some(_)) => Ok(true),
    }
}

fn as_value(config: &RunConfig) -> Result<toml::Value> {
    toml::Value::try_from(config).map_err(|e| Error::Config(format!("run.toml: {e}")))
}

/// The dotted keys (`loss.top_k`, `teachers[1].alpha`) where `a` and `b` differ.
fn differing_keys(prefix: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    use toml::Value;
    let key = |k: &str| match prefix {
        "" => k.to_string(),
        p => format!("{p}.{k}"),
    };
    match (a, b) {
        (Value::Table(x), Value::Table(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => differing_keys(&key(k), u, v, out),
                    _ => out.push(key(k)),
                }
            }
        }
        (Value::Array(x), Value::Array(y))
            if x.len() == y.len() && x.iter().all(|v| v.is_table()) =>
        {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differing_keys(&format!("{prefix}[{i}]"), u, v, out);
            }
        }
        _ if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = r#"
output_dir = "runs/a"
[student]
model = "models/student"
[[teachers]]
model = "models/qwen3"
[[teachers]]
model = "models/phi4"
[data]
path = "data/train.jsonl"
[training]
steps = 100
"#;

    fn with(extra: &str) -> RunConfig {
        let text = RUN.replace("steps = 100", extra);
        RunConfig::parse(&text).unwrap()
    }

    #[test]
    fn logging_cadence_and_threads_may_change_the_math_may_not() {
        let saved = with("steps = 100");
        let free = with("steps = 100\nlog_every = 3\n[checkpoint]\nkeep = 9\nevery = 7");
        assert!(!check(&saved, &free, None).unwrap());
        let mut threads = saved.clone();
        (threads.data.workers, threads.data.prefetch) = (3, 9);
        threads.device = "cuda".into();
        assert!(!check(&saved, &threads, None).unwrap());

        let err = check(&saved, &with("steps = 100\nlr = 1e-4"), None)
            .unwrap_err()
            .report();
        assert!(err.starts_with("training.lr changed"), "{err}");
        let mut teacher = saved.clone();
        teacher.teachers[1].alpha = 0.5;
        teacher.seed = 7;
        let err = check(&saved, &teacher, None).unwrap_err().report();
        assert!(err.starts_with("seed, teachers[1].alpha changed"), "{err}");
    }

    #[test]
    fn steps_change_only_with_an_extension() {
        let saved = with("steps = 100");
        let longer = with("steps = 150");
        let err = check(&saved, &longer, None).unwrap_err().report();
        assert!(err.contains("--extend-steps decay"), "{err}");
        assert!(check(&saved, &longer, Some(Extension::Decay)).unwrap());
        assert!(check(&saved, &longer, Some(Extension::Stretch)).unwrap());
        let err = check(&saved, &saved, Some(Extension::Decay))
            .unwrap_err()
            .report();
        assert!(err.contains("still 100"), "{err}");
        // Fewer steps: never `--extend-steps` (which would refuse them), but `--stop-after`.
        for extension in [None, Some(Extension::Decay)] {
            let err = check(&saved, &with("steps = 50"), extension)
                .unwrap_err()
                .report();
            assert!(
                err.contains("never shortened") && err.contains("--stop-after 50"),
                "{err}"
            );
            assert!(!err.contains("pass --extend-steps"), "{err}");
        }
        assert_eq!("stretch".parse::<Extension>().unwrap(), Extension::Stretch);
        assert!("cosine".parse::<Extension>().is_err());
    }
}
