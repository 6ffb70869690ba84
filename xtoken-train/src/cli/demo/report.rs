//! The demo's results: the Markdown table (mean ± standard deviation over seeds), `results.md`,
//! `results.json`, the students' curves (`loss.svg`) and the accuracies (`accuracy.svg`).

use anyhow::Result;
use serde::Serialize;

use xtoken_train::observe::metrics::{bar_chart, line_chart};

use super::setup::{DemoArgs, Regime, ALPHA, METHODS, SERVED_METHOD, STORED_METHOD};

/// One model's evaluation: a teacher's (`method` "teacher") or a student's.
#[derive(Debug, Clone, Serialize)]
pub struct MethodResult {
    /// Which teacher: `digit-splitting` or `numeral-keeping`.
    pub regime: Regime,
    pub method: String,
    pub seed: u64,
    pub answer_accuracy: f64,
    pub numeral_accuracy: f64,
    /// The training cross-entropy at the end (mean of the last 10 % of steps): the one loss
    /// every method shares.
    pub final_loss: f64,
    /// Whether `xtoken audit` recommends this method for this regime's teacher.
    pub audit_pick: bool,
}

/// `(step, value)` points.
pub type Points = Vec<(f64, f64)>;

/// A named curve.
pub type Curve = (String, Points);

/// Mean and sample standard deviation (0 for one value).
fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// A row's cell: `52.0 %`, or `52.0 ± 3.1 %` over several seeds.
fn percent(values: &[f64], seeds: bool) -> String {
    let (mean, sd) = mean_sd(values);
    if seeds {
        format!("{:.1} ± {:.1} %", 100.0 * mean, 100.0 * sd)
    } else {
        format!("{:.1} %", 100.0 * mean)
    }
}

/// The methods in table order: the teacher, then the students (the ones from stored targets,
/// `--stored`, and from a served teacher, `--served`, last, where they ran).
fn methods(results: &[MethodResult]) -> impl Iterator<Item = &'static str> + '_ {
    let ran = |method: &'static str| results.iter().any(|r| r.method == method).then_some(method);
    std::iter::once("teacher")
        .chain(METHODS.iter().map(|m| m.0))
        .chain(ran(STORED_METHOD))
        .chain(ran(SERVED_METHOD))
}

/// The rows of one regime and method, over the seeds.
fn of<'a>(results: &'a [MethodResult], regime: Regime, method: &str) -> Vec<&'a MethodResult> {
    results
        .iter()
        .filter(|r| r.regime == regime && r.method == method)
        .collect()
}

/// The Markdown table: one row per regime and method, averaged over the seeds.
pub fn table(regimes: &[Regime], results: &[MethodResult], seeds: u64) -> String {
    let mut table = String::from(
        "| teacher's tokenizer | model | answer accuracy | numeral-token accuracy | final training CE |\n|---|---|---:|---:|---:|\n",
    );
    for &regime in regimes {
        for method in methods(results) {
            let rows = of(results, regime, method);
            if rows.is_empty() {
                continue;
            }
            let pick = |f: fn(&MethodResult) -> f64| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
            let model = if method == "teacher" {
                "teacher (cross-entropy)".to_string()
            } else if rows.iter().any(|r| r.audit_pick) {
                format!("student, {method} (the audit's pick)")
            } else {
                format!("student, {method}")
            };
            table.push_str(&format!(
                "| {} | {model} | {} | {} | {:.3} |\n",
                regime.name(),
                percent(&pick(|r| r.answer_accuracy), seeds > 1),
                percent(&pick(|r| r.numeral_accuracy), seeds > 1),
                mean_sd(&pick(|r| r.final_loss)).0,
            ));
        }
    }
    table
}

/// Grouped bars of mean numeral-token accuracy: one group per regime, one bar per model.
fn accuracy_chart(regimes: &[Regime], results: &[MethodResult]) -> String {
    let groups: Vec<(String, Vec<(String, f64)>)> = regimes
        .iter()
        .map(|&regime| {
            let bars = methods(results)
                .map(|method| {
                    let values: Vec<f64> = of(results, regime, method)
                        .iter()
                        .map(|r| 100.0 * r.numeral_accuracy)
                        .collect();
                    (method.to_string(), mean_sd(&values).0)
                })
                .collect();
            (format!("{} teacher", regime.name()), bars)
        })
        .collect();
    bar_chart(
        "xtoken demo: numeral-token accuracy on held-out problems",
        "%",
        &groups,
    )
}

/// Writes `results.md`, `results.json`, `loss.svg` and `accuracy.svg`, and prints the table
/// (or the JSON).
pub fn write(
    args: &DemoArgs,
    results: &[MethodResult],
    curves: &[Curve],
    seconds: f64,
) -> Result<()> {
    let out = &args.out;
    std::fs::create_dir_all(out)?;
    let table = table(&args.regimes, results, args.seeds);
    let seeds = if args.seeds == 1 {
        format!("seed {}", args.seed)
    } else {
        format!(
            "seeds {}–{} (mean ± standard deviation)",
            args.seed,
            args.seed + args.seeds - 1
        )
    };
    let report = format!(
        "# xtoken demo\n\n{} documents for the teachers, {} for the students (each states a person's house with probability {}, else an old address), {} held-out questions; each teacher {} steps; the student {} steps of cross-entropy warm-up, then each method {} steps from there on the same batches, `L = CE + α KD` with α = {}; {seeds}; {seconds:.0} s.\n\n{table}\nAnswer accuracy: greedy decoding after \"A:\", against the most likely answer (the house). Numeral-token accuracy: teacher-forced next-token accuracy on the answers' numeral tokens (1–3 digits per token for the student and the numeral-keeping teacher, one digit for the digit-splitting teacher).\n",
        args.teacher_problems,
        args.problems,
        super::corpus::P_HOUSE,
        args.held_out,
        args.teacher_steps,
        args.warmup_steps,
        args.student_steps,
        ALPHA
    );
    std::fs::write(out.join("results.md"), &report)?;
    let json = serde_json::json!({ "results": results, "seconds": seconds });
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    let title = format!(
        "xtoken demo: students' training cross-entropy ({} teacher)",
        args.regimes[0].name()
    );
    std::fs::write(out.join("loss.svg"), line_chart(&title, "step", curves))?;
    std::fs::write(
        out.join("accuracy.svg"),
        accuracy_chart(&args.regimes, results),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!("\n{table}");
        println!(
            "wrote {}, {}, {} and {} ({seconds:.0} s)",
            out.join("results.md").display(),
            out.join("results.json").display(),
            out.join("loss.svg").display(),
            out.join("accuracy.svg").display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(regime: Regime, method: &str, seed: u64, answer: f64) -> MethodResult {
        MethodResult {
            regime,
            method: method.into(),
            seed,
            answer_accuracy: answer,
            numeral_accuracy: answer,
            final_loss: 0.5,
            audit_pick: false,
        }
    }

    #[test]
    fn seeds_give_mean_and_sample_standard_deviation() {
        assert_eq!(mean_sd(&[0.5]), (0.5, 0.0));
        let (mean, sd) = mean_sd(&[0.2, 0.4, 0.6]);
        assert!((mean - 0.4).abs() < 1e-12 && (sd - 0.2).abs() < 1e-12);
        let rows = [
            row(Regime::DigitSplitting, "P-KL", 7, 0.2),
            row(Regime::DigitSplitting, "P-KL", 8, 0.4),
            row(Regime::DigitSplitting, "P-KL", 9, 0.6),
        ];
        let table = table(&[Regime::DigitSplitting], &rows, 3);
        assert!(
            table.contains(
                "| digit-splitting | student, P-KL | 40.0 ± 20.0 % | 40.0 ± 20.0 % | 0.500 |"
            ),
            "{table}"
        );
        assert!(
            !table.contains("teacher (cross-entropy)"),
            "no teacher row without a teacher result"
        );
        let picked = MethodResult {
            audit_pick: true,
            ..row(Regime::NumeralKeeping, "H-KL", 7, 0.5)
        };
        let table = super::table(&[Regime::NumeralKeeping], &[picked], 1);
        assert!(
            table.contains("| numeral-keeping | student, H-KL (the audit's pick) | 50.0 % |"),
            "{table}"
        );
    }
}
