//! The run configurations shipped in `examples/configs` parse, validate, and say what their
//! comments promise.

use std::path::{Path, PathBuf};

use xtoken_core::loss::LossKind;
use xtoken_train::config::DeviceKind;
use xtoken_train::RunConfig;

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs")
}

fn load(name: &str) -> RunConfig {
    let path = configs().join(name);
    RunConfig::load(&path).unwrap_or_else(|e| panic!("{}: {}", path.display(), e.report()))
}

fn losses(config: &RunConfig) -> Vec<Option<LossKind>> {
    let settings = config.teacher_settings().unwrap();
    settings.iter().map(|t| t.loss).collect()
}

#[test]
fn every_shipped_config_is_valid() {
    let mut names: Vec<String> = std::fs::read_dir(configs())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "demo-cpu.toml",
            "llama1b-phi4-hkl.toml",
            "llama1b-qwen3-on-policy.toml",
            "llama1b-qwen3-pkl.toml",
            "llama1b-two-teachers.toml"
        ]
    );
    for name in &names {
        load(name);
    }
}

#[test]
fn the_papers_setups_keep_its_defaults() {
    for (name, expected) in [
        ("llama1b-qwen3-pkl.toml", vec![Some(LossKind::Pkl)]),
        ("llama1b-phi4-hkl.toml", vec![Some(LossKind::Hkl)]),
        (
            "llama1b-two-teachers.toml",
            vec![Some(LossKind::Pkl), Some(LossKind::Hkl)],
        ),
    ] {
        let config = load(name);
        assert_eq!(losses(&config), expected, "{name}");
        assert_eq!(
            config.device.parse::<DeviceKind>().unwrap(),
            DeviceKind::Cuda
        );
        let t = &config.training;
        assert_eq!(
            (t.steps, t.batch_size, t.context_length, t.lr),
            (30_000, 768, 4096, 5e-5),
            "{name}"
        );
        assert!(config.student.model.ends_with("Llama-3.2-1B"), "{name}");
    }
}

#[test]
fn the_cpu_config_runs_on_what_the_demo_leaves() {
    let config = load("demo-cpu.toml");
    assert_eq!(
        config.device.parse::<DeviceKind>().unwrap(),
        DeviceKind::Cpu
    );
    assert_eq!(losses(&config), [None]);
    assert!(config.student.model.starts_with("xtoken-demo"));
    assert!(config.data.path.entries()[0].starts_with("xtoken-demo"));
    let teacher = &config.teacher_settings().unwrap()[0];
    assert_eq!(
        teacher.model,
        Path::new("xtoken-demo/runs/digit-splitting/teacher/student")
    );
}

/// The on-policy phase continues the P-KL run's student from the same teacher, half of every
/// batch written by the student, and each written sequence fits a row.
#[test]
fn the_on_policy_phase_continues_the_pkl_run() {
    let config = load("llama1b-qwen3-on-policy.toml");
    let first = load("llama1b-qwen3-pkl.toml");
    assert_eq!(
        config.student.model,
        first.output_dir.join("student"),
        "the student the first phase exports"
    );
    assert_eq!(config.teachers[0].model, first.teachers[0].model);
    assert_eq!(losses(&config), [Some(LossKind::Pkl)]);
    let on = config.on_policy.as_ref().unwrap();
    assert_eq!(on.fraction, 0.5);
    assert!(on.prompt_tokens + on.max_new_tokens <= config.training.context_length);
    assert_eq!(
        config.device.parse::<DeviceKind>().unwrap(),
        DeviceKind::Cuda
    );
}
