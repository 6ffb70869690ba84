//! Results as lm-evaluation-harness reports them: each metric's mean over a task's documents
//! and its standard error; tasks with subsets (MMLU's subjects, MATH's types) averaged with
//! subsets weighted by size and the subsets' errors pooled. Written as a Markdown table (in
//! percent, as the paper's tables) and as JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use super::task::{PromptSettings, Task};

/// A metric's value over some documents.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Metric {
    /// Its name (`acc`, `acc_norm`, `exact_match,strict-match`, …).
    pub name: String,
    /// The mean, in [0, 1].
    pub value: f64,
    /// Its standard error (NaN for a single document).
    pub stderr: f64,
    /// Documents.
    pub n: usize,
}

/// One task's results.
#[derive(Clone, Debug, Serialize)]
pub struct TaskReport {
    /// The task.
    pub task: String,
    /// The metric the average takes.
    pub headline: String,
    /// Every metric, over all documents.
    pub metrics: Vec<Metric>,
    /// Per subset (absent for tasks without).
    pub subsets: BTreeMap<String, Vec<Metric>>,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Mean and standard error (`sample std / √n`) of per-document scores.
pub fn mean_stderr(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (variance / n).sqrt())
}

/// The harness's `pooled_sample_stderr` over subsets of the given sizes.
pub fn pooled_stderr(stderrs: &[f64], sizes: &[usize]) -> f64 {
    let total: usize = sizes.iter().sum();
    let pooled: f64 = stderrs
        .iter()
        .zip(sizes)
        .map(|(se, &n)| (n as f64 - 1.0) * se * se * n as f64)
        .sum::<f64>()
        / (total as f64 - sizes.len() as f64);
    (pooled / total as f64).sqrt()
}

impl TaskReport {
    /// Aggregates `(subset, scores in metric order)` per document.
    pub fn aggregate(task: &dyn Task, scores: &[(String, Vec<f64>)], seconds: f64) -> Self {
        let mut by_subset: BTreeMap<String, Vec<&Vec<f64>>> = BTreeMap::new();
        for (subset, values) in scores {
            by_subset.entry(subset.clone()).or_default().push(values);
        }
        let subsets: BTreeMap<String, Vec<Metric>> = by_subset
            .iter()
            .map(|(subset, docs)| {
                let metrics = task
                    .metrics()
                    .iter()
                    .enumerate()
                    .map(|(m, name)| {
                        let values: Vec<f64> = docs.iter().map(|d| d[m]).collect();
                        let (value, stderr) = mean_stderr(&values);
                        Metric {
                            name: name.to_string(),
                            value,
                            stderr,
                            n: values.len(),
                        }
                    })
                    .collect();
                (subset.clone(), metrics)
            })
            .collect();
        let metrics = if subsets.len() == 1 {
            subsets.values().next().cloned().unwrap_or_default()
        } else {
            (0..task.metrics().len())
                .map(|m| {
                    let parts: Vec<&Metric> = subsets.values().map(|s| &s[m]).collect();
                    let sizes: Vec<usize> = parts.iter().map(|p| p.n).collect();
                    let total: usize = sizes.iter().sum();
                    let value =
                        parts.iter().map(|p| p.value * p.n as f64).sum::<f64>() / total as f64;
                    let stderrs: Vec<f64> = parts.iter().map(|p| p.stderr).collect();
                    Metric {
                        name: parts[0].name.clone(),
                        value,
                        stderr: pooled_stderr(&stderrs, &sizes),
                        n: total,
                    }
                })
                .collect()
        };
        TaskReport {
            task: task.name().to_string(),
            headline: task.headline().to_string(),
            metrics,
            subsets: if subsets.len() > 1 {
                subsets
            } else {
                BTreeMap::new()
            },
            seconds,
        }
    }

    /// The headline metric.
    pub fn headline_metric(&self) -> Option<&Metric> {
        self.metrics.iter().find(|m| m.name == self.headline)
    }
}

/// The results of one evaluation.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Per task, in the order asked.
    pub tasks: Vec<TaskReport>,
    /// The mean of the tasks' headline metrics.
    pub average: f64,
    /// Solved examples per prompt.
    pub shots: usize,
    /// The few-shot seed.
    pub seed: u64,
    /// Documents per subset at most.
    pub limit: Option<usize>,
}

impl Report {
    /// Collects the task reports.
    pub fn new(tasks: Vec<TaskReport>, settings: &PromptSettings) -> Self {
        let headlines: Vec<f64> = tasks
            .iter()
            .filter_map(|t| t.headline_metric().map(|m| m.value))
            .collect();
        Report {
            average: headlines.iter().sum::<f64>() / headlines.len().max(1) as f64,
            tasks,
            shots: settings.shots,
            seed: settings.seed,
            limit: settings.limit,
        }
    }

    /// A Markdown table: one row per task and metric (the headline marked), then the average.
    pub fn markdown(&self) -> String {
        let percent = |v: f64| {
            if v.is_finite() {
                format!("{:.2}", 100.0 * v)
            } else {
                "—".into()
            }
        };
        let mut text =
            format!(
            "{}-shot{}\n\n| Task | Metric | n | Value (%) | ± Stderr |\n|---|---|---:|---:|---:|\n",
            self.shots,
            self.limit.map(|l| format!(", at most {l} documents per subset")).unwrap_or_default()
        );
        for task in &self.tasks {
            for metric in &task.metrics {
                let mark = if metric.name == task.headline {
                    " *"
                } else {
                    ""
                };
                text.push_str(&format!(
                    "| {} | {}{mark} | {} | {} | {} |\n",
                    task.task,
                    metric.name,
                    metric.n,
                    percent(metric.value),
                    percent(metric.stderr)
                ));
            }
        }
        text.push_str(&format!(
            "| **Average** | * | | **{}** | |\n\n* the metric the average takes.\n",
            percent(self.average)
        ));
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_as_the_harness() {
        // numpy: np.std([1, 0, 1, 1], ddof=1) / 2 = 0.25
        let (mean, se) = mean_stderr(&[1.0, 0.0, 1.0, 1.0]);
        assert_eq!(mean, 0.75);
        assert!((se - 0.25).abs() < 1e-12);
        // One subset pooled is that subset's error.
        assert!((pooled_stderr(&[0.25], &[4]) - 0.25).abs() < 1e-12);
    }
}
