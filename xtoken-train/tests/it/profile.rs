//! `xtoken bench train --profile`: every phase of a step is named, runs as often as it should,
//! reports its memory, and the phases add up to the step measured around it; a step waits for
//! the device once; and rows padded for a GPU's kernels train as unpadded ones.

use crate::fixture;
use crate::support;

use crate::fixture::{bench_train_args, config, fixture, ok, xtoken};
use burn::backend::{Autodiff, NdArray};
use serde_json::Value;
use xtoken_testkit::backend::{reads, Counted};
use xtoken_train::{Run, RunConfig, RunOptions, Worker};

/// The phases one step of one teacher with a learnable W runs, with the times each runs over
/// two micro-batches under the step scope (pass 1 first).
const PHASES: [(&str, u64); 13] = [
    ("data wait", 1),
    ("teacher tiny: forward", 2),
    ("teacher tiny: top-K", 2),
    ("student: pass 1 (forward, losses)", 2),
    ("student: forward", 2),
    ("student: head (logits)", 2),
    ("loss: CE", 2),
    ("loss: teacher tiny", 2),
    ("student: backward (recomputation)", 2),
    ("gradient accumulation", 2),
    ("gradient exchange", 1),
    ("student: clipping + AdamW", 1),
    ("W: AdamW", 1),
];

fn phase_seconds(profile: &Value) -> f64 {
    profile["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| p["seconds"].as_f64().expect("seconds"))
        .sum()
}

#[test]
fn the_phases_add_up_to_the_step() {
    let f = fixture("profile");
    let (json, work) = (f.dir.0.join("profile.json"), f.dir.0.join("bench"));
    let extra = [
        "--context",
        "48",
        "--grad-accum",
        "2",
        "--top-k",
        "32",
        "--steps",
        "2",
        "--loss",
        "pkl",
        "--scaling-scope",
        "step",
        "--profile",
        "--json",
        json.to_str().unwrap(),
    ];
    let args = bench_train_args(&f, &work, &extra);
    let out = xtoken(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ok(out);
    assert!(stdout.contains("| phase | runs |"), "{stdout}");
    assert!(stdout.contains("The phases add up to"), "{stdout}");

    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["grad_accum"], 2);
    let run = &report["runs"][0];
    assert_eq!(run["scaling_scope"], "step");
    let profile = &run["profile"];
    let steps = profile["next_steps"].as_array().expect("next_steps");
    let measured = run["step_seconds"].as_array().expect("step_seconds");
    assert_eq!(steps.len(), 2);
    assert_eq!(measured.len(), 2);

    let mut pairs = vec![(
        &profile["first_step"],
        run["first_step_seconds"].as_f64().unwrap(),
    )];
    pairs.extend(
        steps
            .iter()
            .zip(measured.iter().map(|s| s.as_f64().unwrap())),
    );
    for (step, wall) in pairs {
        let sum = phase_seconds(step);
        assert!(
            (sum - wall).abs() <= 0.05 * wall,
            "the phases add up to {sum} s of a {wall} s step"
        );
        let phases = step["phases"].as_array().unwrap();
        let names: Vec<(&str, u64)> = phases
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["count"].as_u64().unwrap()))
            .collect();
        assert_eq!(names, PHASES, "the phases and their runs");
        for p in phases {
            assert!(p["memory_bytes"].as_u64().unwrap() > 0, "{p}");
            assert!(p["seconds"].as_f64().unwrap() >= 0.0, "{p}");
            // The CPU backends compile no kernels: nothing counts them.
            assert!(p["compilations"].is_null(), "{p}");
        }
    }
    let mean = &profile["next_steps_mean"];
    let mean_wall = run["mean_step_seconds"].as_f64().unwrap();
    assert!((phase_seconds(mean) - mean_wall).abs() <= 0.05 * mean_wall);
}

/// `scripts/gpu-step.sh`'s dry run on the CPU: the same commands at tiny shapes, every part
/// ending well, the report in Markdown and JSON, and an OUT that holds anything refused.
#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn the_gpu_step_script_runs_dry_on_the_cpu() {
    let tokenizers = support::tokenizers_dir();
    let work = std::env::temp_dir().join(format!("xtoken-gpu-step-{}", std::process::id()));
    std::fs::remove_dir_all(&work).ok();
    let out = work.join("report");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gpu-step.sh");
    let run = || {
        std::process::Command::new("bash")
            .arg(&script)
            .arg(&out)
            .env("XTOKEN", env!("CARGO_BIN_EXE_xtoken"))
            .env("XTOKEN_TOKENIZERS_DIR", &tokenizers)
            .env("DEVICE", "cpu")
            .env("LIMIT_S", "300")
            .output()
            .unwrap()
    };
    let done = run();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{stderr}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    for part in [
        "train-f32",
        "train-bf16",
        "train-bf16-warm",
        "forward",
        "kernels",
    ] {
        assert_eq!(report["parts"][part]["exit"], 0, "{part}: {report}");
    }
    // The first step again, with the kernel cache the first parts left (none on the CPU).
    let warm = &report["train_bf16_warm"]["runs"][0];
    assert_eq!(warm["compute_dtype"], "bf16", "{report}");
    for compute in ["f32", "bf16"] {
        let run = &report[format!("train_{compute}")]["runs"][0];
        assert_eq!(run["compute_dtype"], compute, "{report}");
        let steps = run["profile"]["next_steps"]
            .as_array()
            .expect("the profile's steps");
        assert_eq!(steps.len(), 1);
    }
    // The first training part makes the random models, the second keeps them.
    for body in ["student", "teacher"] {
        let made = |part: &str| report[part]["model_seconds"][body].as_f64();
        assert!(made("train_f32").is_some_and(|s| s > 0.0), "{report}");
        assert_eq!(made("train_bf16"), Some(0.0), "{report}");
    }
    let markdown = std::fs::read_to_string(out.join("report.md")).unwrap();
    for heading in [
        "## train-f32 (exit 0",
        "## train-bf16 (exit 0",
        "## train-bf16-warm (exit 0",
        "## forward (exit 0",
        "## kernels (exit 0",
    ] {
        assert!(markdown.contains(heading), "{heading}:\n{markdown}");
    }
    assert!(markdown.contains("| teacher tiny: top-K |"), "{markdown}");

    // Run again into the same OUT: refused, and the report is kept.
    let again = run();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("is not empty"));
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        markdown
    );
    std::fs::remove_dir_all(&work).ok();
}

/// Every read of tensor data to the host makes a GPU wait for its queue. The test kit's
/// `Counted` backend counts the reads a thread makes outside the X-Token kernels (whose reads
/// are their own work: a cube kernel does it on the device). A step of the fixture's run (two micro-batches, a
/// P-KL teacher with a learnable W and a KL teacher, dynamic scaling) reads once: the loss
/// values and the gradient norm together, before the weights are touched. Under the paper's
/// step scope, pass 1's values are read once more, before the backward passes that need them;
/// so are the previous-step scope's in its first step, which has no previous step to take them
/// from.
#[test]
fn a_step_reads_from_the_device_once() {
    let f = fixture("reads");
    for (scope, per_step) in [("previous-step", [2, 1, 1]), ("step", [2; 3])] {
        let setting = format!("scaling_scope = \"{scope}\"");
        let mut run = open_run(&f, scope, ("top_k = 16", &setting));
        let reads: Vec<u64> = (0..3)
            .map(|_| {
                let before = reads();
                run.step().expect("step");
                reads() - before
            })
            .collect();
        assert_eq!(reads, per_step, "{scope}: reads per step");
    }
}

/// On CUDA and wgpu a micro-batch's rows (the student's and each teacher's) are padded to a
/// multiple of 128 so that the kernels see few shapes (`training.length_multiple`, 0: the
/// backend's choice). Padding on the right under causal attention, read by plans and
/// cross-entropy of real rows only, changes nothing: three steps of the fixture's run give the
/// losses and gradient norms of the unpadded run.
#[test]
fn padded_rows_train_as_unpadded_ones() {
    let f = fixture("multiple");
    let metrics = |multiple: usize| {
        let setting = format!("length_multiple = {multiple}");
        let mut run = open_run(
            &f,
            &format!("multiple-{multiple}"),
            ("warmup = 0.2", &setting),
        );
        (0..3)
            .map(|_| {
                let m = run.step().expect("step");
                let mut values = vec![m.loss, m.ce, m.kd, m.grad_norm];
                values.extend(m.teachers.iter().map(|t| t.0));
                values
            })
            .collect::<Vec<_>>()
    };
    let (plain, padded) = (metrics(1), metrics(128));
    for (a, b) in plain.iter().flatten().zip(padded.iter().flatten()) {
        assert!(
            (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
            "{plain:?}\nvs\n{padded:?}"
        );
    }
}

/// The fixture's run `name` on ndarray, with `setting` written on the line after `after` of its
/// configuration.
fn open_run(
    f: &fixture::Fixture,
    name: &str,
    (after, setting): (&str, &str),
) -> Run<Autodiff<Counted<NdArray>>> {
    let path = config(f, name, "");
    let text = std::fs::read_to_string(&path).expect("config");
    let text = text.replace(after, &format!("{after}\n{setting}"));
    std::fs::write(&path, text).expect("config");
    let config = RunConfig::load(&path).expect("config");
    let options = RunOptions::default();
    Run::open(config, &options, Default::default(), Worker::alone()).expect("open")
}
