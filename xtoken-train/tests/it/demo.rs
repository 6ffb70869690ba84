//! `xtoken demo`, reduced (fewer problems and steps): the whole pipeline end to end, not the
//! numbers.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Held-out problems of the reduced demo: every answer accuracy is a multiple of 1/12.
const HELD_OUT: f64 = 12.0;

const REGIMES: [&str; 2] = ["digit-splitting", "numeral-keeping"];
const MODELS: [&str; 6] = ["teacher", "CE only", "GOLD", "ULD", "P-KL", "H-KL"];

/// Runs the demo with `args` into `out`; returns its JSON and the wall time the test measured.
fn demo(out: &Path, args: &[&str]) -> (serde_json::Value, f64) {
    let start = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args([
            "demo",
            "--json",
            "--problems",
            "400",
            "--teacher-problems",
            "400",
        ])
        .args(["--held-out", "12"])
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run xtoken demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let json = serde_json::from_slice(&output.stdout).expect("--json prints one JSON object");
    (json, start.elapsed().as_secs_f64())
}

/// The reduced demo under both teachers: teachers 6 steps, warm-up 4, students 4.
const STEPS: [&str; 8] = [
    "--regimes",
    "digit-splitting,numeral-keeping",
    "--teacher-steps",
    "6",
    "--warmup-steps",
    "4",
    "--student-steps",
    "4",
];

/// The `ce` column of a run's metrics.csv, found by its header name.
fn ce_column(run: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let ce = header.iter().position(|&h| h == "ce").expect("a ce column");
    lines
        .map(|l| l.split(',').nth(ce).unwrap().parse().unwrap())
        .collect()
}

/// One row agrees with its run's metrics and with the Markdown table.
fn check_result(r: &serde_json::Value, runs: &Path, table: &str) {
    let regime = r["regime"].as_str().unwrap();
    let method = r["method"].as_str().unwrap();
    let answer = r["answer_accuracy"].as_f64().unwrap();
    let numeral = r["numeral_accuracy"].as_f64().unwrap();
    let loss = r["final_loss"].as_f64().unwrap();
    assert_eq!(r["seed"], 7, "{r}");
    assert!(
        (0.0..=1.0).contains(&answer) && (0.0..=1.0).contains(&numeral),
        "{r}"
    );
    let correct = answer * HELD_OUT;
    assert!((correct - correct.round()).abs() < 1e-9, "{r}: not k/12");
    // With 4 or 6 steps the last 10 % of the curve is its last step.
    let run = runs
        .join(regime)
        .join(method.replace(' ', "-").to_lowercase());
    let ce = ce_column(&run);
    let steps = if method == "teacher" { 6 } else { 4 };
    assert_eq!(
        ce.len(),
        steps,
        "{regime}/{method}: one metrics row per step"
    );
    assert!(
        ce.iter().all(|v| v.is_finite() && *v > 0.0),
        "{method}: {ce:?}"
    );
    let last = ce[steps - 1];
    assert!(
        (loss - last).abs() <= 1e-9 * last,
        "{method}: {loss} vs {ce:?}"
    );
    let pick = r["audit_pick"].as_bool().expect("an audit_pick field");
    let model = if method == "teacher" {
        assert!(!pick, "{r}");
        "teacher (cross-entropy)".to_string()
    } else if pick {
        format!("student, {method} (the audit's pick)")
    } else {
        format!("student, {method}")
    };
    let row = format!(
        "| {regime} | {model} | {:.1} % | {:.1} % | {loss:.3} |",
        100.0 * answer,
        100.0 * numeral
    );
    assert!(table.contains(&row), "{row} not in\n{table}");
}

#[test]
fn reduced_demo_runs_every_method_under_both_teachers_and_is_deterministic() {
    let dir = std::env::temp_dir().join(format!("xtoken-demo-{}", std::process::id()));
    let (first, wall) = demo(&dir.join("a"), &STEPS);
    let results = first["results"].as_array().expect("results");
    let rows: Vec<(&str, &str)> = results
        .iter()
        .map(|r| (r["regime"].as_str().unwrap(), r["method"].as_str().unwrap()))
        .collect();
    // The teachers first, then each regime's students.
    let mut expected: Vec<(&str, &str)> = REGIMES.iter().map(|&r| (r, "teacher")).collect();
    for regime in REGIMES {
        expected.extend(MODELS[1..].iter().map(|&m| (regime, m)));
    }
    assert_eq!(rows, expected);
    // The audit picks one method per regime, P-KL or H-KL.
    for regime in REGIMES {
        let picks: Vec<&str> = results
            .iter()
            .filter(|r| r["regime"] == regime && r["audit_pick"] == true)
            .map(|r| r["method"].as_str().unwrap())
            .collect();
        assert!(
            picks == ["P-KL"] || picks == ["H-KL"],
            "{regime}: {picks:?}"
        );
    }
    let table = std::fs::read_to_string(dir.join("a/results.md")).unwrap();
    for r in results {
        check_result(r, &dir.join("a/runs"), &table);
    }
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("a/results.json")).unwrap())
            .unwrap();
    assert_eq!(written["results"], first["results"]);
    // The reported time is the demo's own, inside the time the test waited for it.
    let seconds = first["seconds"].as_f64().unwrap();
    assert!(
        seconds > 0.0 && seconds <= wall,
        "{seconds} s reported, {wall} s measured"
    );
    let svg = std::fs::read_to_string(dir.join("a/loss.svg")).unwrap();
    assert!(svg.starts_with("<svg"));
    let bars = std::fs::read_to_string(dir.join("a/accuracy.svg")).unwrap();
    for method in &MODELS[1..] {
        assert!(svg.contains(method), "{method} has no curve");
        assert!(bars.contains(method), "{method} has no bar");
    }
    // The tokenizers behave as the demo says: one teacher splits digits, the other keeps
    // numerals as the student does.
    let digits = std::fs::read_to_string(dir.join("a/teacher-init/tokenizer.json")).unwrap();
    assert!(digits.contains("\"individual_digits\":true"));
    let keeping =
        std::fs::read_to_string(dir.join("a/teacher-numerals-init/tokenizer.json")).unwrap();
    assert!(!keeping.contains("individual_digits") && keeping.contains("{1,3}"));

    // Seeded, and each regime on its own: a second run of one regime gives its rows the same
    // numbers.
    let mut one = STEPS;
    one[1] = "digit-splitting";
    let (second, _) = demo(&dir.join("b"), &one);
    let digit_rows: Vec<&serde_json::Value> = results
        .iter()
        .filter(|r| r["regime"] == "digit-splitting")
        .collect();
    let second: Vec<&serde_json::Value> = second["results"].as_array().unwrap().iter().collect();
    assert_eq!(digit_rows, second);
    on_policy_bench_runs_on_what_the_demo_left(&dir.join("a"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `xtoken bench on-policy` on a demo's directory: a student per λ, graded before its first
/// step and after each; the table, the curves and the JSON written beside, never over, the
/// demo's files; a directory of another seed refused.
fn on_policy_bench_runs_on_what_the_demo_left(demo: &Path) {
    let bench = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_xtoken"))
            .args(["bench", "on-policy", "--demo"])
            .arg(demo)
            .args(["--steps", "2", "--every", "1", "--prompts", "4"])
            .args(extra)
            .output()
            .expect("run xtoken bench on-policy")
    };
    let out = bench(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("| step | λ = 0 | λ = 0.5 |"), "{stdout}");
    for step in 0..=2 {
        assert!(stdout.contains(&format!("\n| {step} | -")), "{stdout}");
    }
    let results = demo.join("on-policy");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("results.json")).unwrap())
            .unwrap();
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["fraction"], 0.5);
    assert_eq!(runs[1]["gradings"].as_array().unwrap().len(), 3);
    assert!(std::fs::read_to_string(results.join("grade.svg"))
        .unwrap()
        .starts_with("<svg"));
    let refused = bench(&["--out", demo.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("refusing to write over an input"),
        "{err}"
    );
    let other = bench(&["--seed", "8"]);
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(
        !other.status.success() && err.contains("was not made with seed 8"),
        "{err}"
    );
}

#[test]
fn seeds_are_reported_as_mean_and_spread() {
    let dir = std::env::temp_dir().join(format!("xtoken-demo-seeds-{}", std::process::id()));
    // One regime.
    let args = [
        "--regimes",
        "digit-splitting",
        "--seeds",
        "2",
        "--teacher-steps",
        "2",
        "--warmup-steps",
        "0",
        "--student-steps",
        "2",
    ];
    let (json, _) = demo(&dir, &args);
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 2 * MODELS.len());
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["seed"], 7 + i as u64 / MODELS.len() as u64, "{r}");
        assert_eq!(r["regime"], "digit-splitting");
    }
    for seed in [7, 8] {
        assert!(dir
            .join(format!("seed-{seed}/runs/digit-splitting/p-kl/student"))
            .is_dir());
    }
    let table = std::fs::read_to_string(dir.join("results.md")).unwrap();
    assert!(
        table.contains("seeds 7–8 (mean ± standard deviation)"),
        "{table}"
    );
    let teacher = table
        .lines()
        .find(|l| l.contains("teacher (cross-entropy)"))
        .unwrap();
    assert_eq!(teacher.matches(" ± ").count(), 2, "{teacher}");
    assert!(!table.contains("| numeral-keeping |"), "{table}");

    let bad = Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args(["demo", "--seeds", "0", "--out"])
        .arg(dir.join("bad"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--seeds must be at least 1"));
    std::fs::remove_dir_all(&dir).ok();
}
