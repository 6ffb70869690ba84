//! 16-bit floats in training, on burn-flex (the CPU backend with bf16).

mod fixture;

use fixture::*;

/// The columns `names` of a run's metrics.csv, found by their header names.
fn columns(run: &std::path::Path, names: &[&str]) -> Vec<Vec<f64>> {
    let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at: Vec<usize> = names
        .iter()
        .map(|n| header.iter().position(|h| h == n).expect("a column"))
        .collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            at.iter().map(|&i| cells[i].parse().unwrap()).collect()
        })
        .collect()
}

/// A bf16 student used to end step 1 with an infinite loss on a GPU (KD 2.28e-41: a loss
/// value in the logits' 16 bits, read where an f32 was expected); on burn-flex the same step
/// panicked on the dtypes. Now every step's KD is a plain number like the f32 student's.
#[test]
fn a_bf16_student_trains_on_flex() {
    let f = fixture("bf16-student");
    let config = config(&f, "bf16", "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replacen("[student]\n", "[student]\ndtype = \"bf16\"\n", 1),
    )
    .unwrap();
    let log = ok(train(&config, &["--device", "flex"]));
    assert!(log.contains("parameters, BF16)"), "{log}");
    let rows = columns(&f.dir.0.join("bf16"), &["loss", "ce", "kd"]);
    assert_eq!(rows.len(), 6);
    for row in rows {
        let [loss, ce, kd] = row[..] else { panic!() };
        assert!(loss.is_finite() && ce > 1.0 && ce < 10.0, "{row:?}");
        assert!(kd > 1e-3 && kd < 100.0, "KD {kd}");
    }
}
