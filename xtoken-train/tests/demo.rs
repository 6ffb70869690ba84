//! `xtoken demo`, reduced (fewer problems and steps): the whole pipeline end to end, not the
//! numbers.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Held-out problems of the reduced demo: every answer accuracy is a multiple of 1/12.
const HELD_OUT: f64 = 12.0;

/// Runs the reduced demo into `out`; returns its JSON and the wall time the test measured.
fn demo(out: &Path) -> (serde_json::Value, f64) {
    let start = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args(["demo", "--json", "--problems", "400", "--held-out", "12"])
        .args(["--teacher-steps", "6", "--student-steps", "4", "--out"])
        .arg(out)
        .output()
        .expect("run xtoken demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let json = serde_json::from_slice(&output.stdout).expect("--json prints one JSON object");
    (json, start.elapsed().as_secs_f64())
}

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

/// One method's result agrees with its run's metrics and with the Markdown table.
fn check_result(r: &serde_json::Value, runs: &Path, table: &str) {
    let method = r["method"].as_str().unwrap();
    let answer = r["answer_accuracy"].as_f64().unwrap();
    let numeral = r["numeral_accuracy"].as_f64().unwrap();
    let loss = r["final_loss"].as_f64().unwrap();
    assert!(
        (0.0..=1.0).contains(&answer) && (0.0..=1.0).contains(&numeral),
        "{r}"
    );
    let correct = answer * HELD_OUT;
    assert!((correct - correct.round()).abs() < 1e-9, "{r}: not k/12");
    // With 4 steps the last 10 % of the curve is its last step.
    let ce = ce_column(&runs.join(method.replace(' ', "-").to_lowercase()));
    assert_eq!(ce.len(), 4, "{method}: one metrics row per step");
    assert!(
        ce.iter().all(|v| v.is_finite() && *v > 0.0),
        "{method}: {ce:?}"
    );
    assert!(
        (loss - ce[3]).abs() <= 1e-9 * ce[3],
        "{method}: {loss} vs {ce:?}"
    );
    let row = format!(
        "| student, {method} | {:.1} % | {:.1} % | {loss:.3} |",
        100.0 * answer,
        100.0 * numeral
    );
    assert!(table.contains(&row), "{row} not in\n{table}");
}

#[test]
fn reduced_demo_runs_every_method_and_is_deterministic() {
    let dir = std::env::temp_dir().join(format!("xtoken-demo-{}", std::process::id()));
    let (first, wall) = demo(&dir.join("a"));
    let results = first["results"].as_array().expect("results");
    let methods: Vec<&str> = results
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods, ["CE only", "GOLD", "ULD", "P-KL", "H-KL"]);
    let table = std::fs::read_to_string(dir.join("a/results.md")).unwrap();
    for r in results {
        check_result(r, &dir.join("a/runs"), &table);
    }
    // The reported time is the demo's own, inside the time the test waited for it.
    let seconds = first["seconds"].as_f64().unwrap();
    assert!(
        seconds > 0.0 && seconds <= wall,
        "{seconds} s reported, {wall} s measured"
    );
    let svg = std::fs::read_to_string(dir.join("a/loss.svg")).unwrap();
    assert!(svg.starts_with("<svg"));
    for method in methods {
        assert!(svg.contains(method), "{method} has no curve");
    }
    // The tokenizers behave as the demo says: the teacher splits digits, the student does not.
    let teacher = std::fs::read_to_string(dir.join("a/teacher-init/tokenizer.json")).unwrap();
    assert!(teacher.contains("\"individual_digits\":true"));

    // Seeded: a second run gives the same numbers.
    let (second, _) = demo(&dir.join("b"));
    assert_eq!(first["results"], second["results"]);
    std::fs::remove_dir_all(&dir).ok();
}
