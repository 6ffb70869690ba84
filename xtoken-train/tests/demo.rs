//! `xtoken demo`, reduced (fewer problems and steps): the whole pipeline end to end, not the
//! numbers.

use std::process::Command;

fn demo(out: &std::path::Path) -> serde_json::Value {
    let output = Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args(["demo", "--json", "--problems", "400", "--held-out", "12"])
        .args(["--teacher-steps", "6", "--student-steps", "4", "--out"])
        .arg(out)
        .output()
        .expect("run xtoken demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    serde_json::from_slice(&output.stdout).expect("--json prints one JSON object")
}

#[test]
fn reduced_demo_runs_every_method_and_is_deterministic() {
    let dir = std::env::temp_dir().join(format!("xtoken-demo-{}", std::process::id()));
    let first = demo(&dir.join("a"));
    let results = first["results"].as_array().expect("results");
    let methods: Vec<&str> = results
        .iter()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods, ["CE only", "GOLD", "ULD", "P-KL", "H-KL"]);
    for r in results {
        for key in ["answer_accuracy", "numeral_accuracy"] {
            let v = r[key].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{r}");
        }
        let loss = r["final_loss"].as_f64().unwrap();
        assert!(loss.is_finite() && loss > 0.0, "{r}");
    }
    assert!(first["seconds"].as_f64().unwrap() > 0.0);
    let table = std::fs::read_to_string(dir.join("a/results.md")).unwrap();
    assert!(table.contains("| student, P-KL |"), "{table}");
    let svg = std::fs::read_to_string(dir.join("a/loss.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("H-KL"));
    // The tokenizers behave as the demo says: the teacher splits digits, the student does not.
    let teacher = std::fs::read_to_string(dir.join("a/teacher-init/tokenizer.json")).unwrap();
    assert!(teacher.contains("\"individual_digits\":true"));

    // Seeded: a second run gives the same numbers.
    let second = demo(&dir.join("b"));
    assert_eq!(first["results"], second["results"]);
    std::fs::remove_dir_all(&dir).ok();
}
