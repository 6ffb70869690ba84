//! `train`'s own output directory under the output rule every command follows, `--check` equal
//! to the run for devices, dtypes and outputs, and what a run records being a configuration it
//! accepts.

use std::path::Path;
use std::process::Output;

use xtoken_testkit::files::{differences, snapshot};

use crate::fixture::*;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The fixture's configuration with `output_dir` set to `out` (any path), written as `name`.
fn config_at(f: &Fixture, name: &str, out: &Path, extra: &str) -> String {
    let path = config(f, name, extra);
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text.lines().find(|l| l.starts_with("output_dir")).unwrap();
    let text = text.replace(line, &format!("output_dir = \"{}\"", out.display()));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// `train` and `train --check` both exit 1 with `expect` in their message, and no file under
/// the fixture changes.
fn both_refuse(f: &Fixture, config: &str, extra: &[&str], expect: &str) {
    for args in &train_and_check(config, extra) {
        let before = snapshot(&f.dir.0);
        let out = xtoken(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}:\n{err}");
        assert!(err.contains(expect), "{args:?}: {expect:?} in:\n{err}");
        let changed = differences(&before, &snapshot(&f.dir.0));
        assert!(changed.is_empty(), "{args:?} changed {changed:?}");
    }
}

/// An `output_dir` that is a checkpoint, lies inside a run, is a finished run (without
/// `--resume`), or holds a user's file, a store or a tokenizer is refused by `train` and
/// `--check` alike, writing nothing; a new directory, an empty one and one holding only an
/// alignment cache are taken.
#[test]
fn output_dir_is_new_empty_or_a_run_of_xtoken() {
    let f = fixture("run-dir");
    let root = &f.dir.0;
    let first = config(&f, "run", "");
    ok(train(&first, &[]));
    let run = root.join("run");
    let step = run.join("checkpoints/step-00000006");
    assert!(step.join("state.json").is_file());
    let notes = root.join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(notes.join("todo.txt"), "keep me").unwrap();
    let tokenizer = root.join("tokenizer-folder");
    std::fs::create_dir_all(&tokenizer).unwrap();
    std::fs::copy(
        f.student.join("tokenizer.json"),
        tokenizer.join("tokenizer.json"),
    )
    .unwrap();
    let store = root.join("store/digits");
    std::fs::create_dir_all(store.join("shards")).unwrap();
    std::fs::write(store.join("manifest.json"), "{}").unwrap();
    let cases = [
        (step.clone(), "which a training run did not write"),
        (run.join("checkpoints"), "holds step-0000000"),
        (run.join("checkpoints/new"), "lies inside"),
        (run.join("student/new"), "lies inside"),
        (notes.clone(), "holds todo.txt"),
        (tokenizer.clone(), "holds tokenizer.json"),
        (store.clone(), "holds"),
        (f.student.clone(), "is the student's model directory"),
        (root.clone(), "holds the student's model directory"),
    ];
    for (i, (out, expect)) in cases.iter().enumerate() {
        let c = config_at(&f, &format!("case{i}"), out, "");
        both_refuse(&f, &c, &[], expect);
        both_refuse(&f, &c, &[], "choose another output");
    }
    // A finished run, again without --resume: both name its checkpoints.
    both_refuse(
        &f,
        first.to_str().unwrap(),
        &[],
        "already holds checkpoints",
    );

    // Taken: new, empty, or holding only the alignment cache a failed start kept.
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let cached = root.join("cached");
    std::fs::create_dir_all(cached.join("data")).unwrap();
    let cache = cached.join("data/train.xtc");
    let args = [
        "align",
        "--student",
        f.student.to_str().unwrap(),
        "--teacher",
        f.teacher.to_str().unwrap(),
        "--input",
        f.data.to_str().unwrap(),
        "--out",
        cache.to_str().unwrap(),
    ];
    ok(xtoken(&args));
    for out in [root.join("new/deeper"), empty, cached] {
        let c = config_at(&f, "taken", &out, "");
        ok(xtoken(&["train", "--config", &c, "--check"]));
        ok(xtoken(&["train", "--config", &c, "--stop-after", "2"]));
        assert!(out.join("metrics.csv").is_file());
    }
}

/// Every (device, compute dtype) pair: `train --check` and `train` agree, both refusing with
/// the same message or both running; a refused `train` leaves no file behind.
#[test]
fn check_and_train_agree_on_every_device_and_dtype() {
    let f = fixture("run-dir-devices");
    let mut tried = 0;
    for device in ["cpu", "flex", "ndarray", "wgpu", "cuda"] {
        for dtype in ["auto", "f32", "bf16", "f16"] {
            let name = format!("{device}-{dtype}");
            let extra = format!("device = \"{device}\"\n");
            let path = config(&f, &name, "");
            let text = std::fs::read_to_string(&path).unwrap();
            let text = format!("{extra}{text}").replace(
                "steps = 6\n",
                &format!("steps = 6\ncompute_dtype = \"{dtype}\"\n"),
            );
            std::fs::write(&path, text).unwrap();
            let p = path.to_str().unwrap();
            let check = xtoken(&["train", "--config", p, "--check"]);
            let run = xtoken(&["train", "--config", p, "--stop-after", "1"]);
            let (check_err, run_err) = (stderr(&check), stderr(&run));
            assert_eq!(
                check.status.success(),
                run.status.success(),
                "{name}: --check {:?}, train {:?}\n--check: {check_err}\ntrain: {run_err}",
                check.status,
                run.status
            );
            assert_ne!(run.status.code(), Some(101), "{name} panicked: {run_err}");
            if !run.status.success() {
                let first = run_err
                    .lines()
                    .find(|l| l.contains(" = \""))
                    .unwrap_or_else(|| panic!("{name}: no key named in {run_err}"));
                let key = first
                    .trim_start_matches(['-', ' '])
                    .trim_start_matches("error: ");
                let key = key.split(':').next().unwrap();
                assert!(
                    check_err.contains(key),
                    "{name}: train says {first:?}; --check:\n{check_err}"
                );
                assert!(!f.dir.0.join(&name).exists(), "{name}: {run_err}");
            }
            tried += 1;
        }
    }
    assert_eq!(tried, 20);
}

/// `--check` with bad values also names a missing student and missing data, each failure
/// once, and no line derived from another bad value.
#[test]
fn check_lists_bad_values_beside_missing_inputs() {
    let f = fixture("run-dir-check-all");
    let root = &f.dir.0;
    let text = std::fs::read_to_string(config(&f, "run", "")).unwrap();
    let gone = |p: &Path| p.display().to_string();
    let bad = text
        .replace("warmup = 0.2", "warmup = 0.2\nlr = -1.0")
        .replace(&gone(&f.student), &gone(&root.join("no-student")))
        .replace(&gone(&f.data), &gone(&root.join("no-data.jsonl")));
    let path = root.join("bad.toml");
    std::fs::write(&path, bad).unwrap();
    let out = xtoken(&["train", "--config", path.to_str().unwrap(), "--check"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for expect in ["training.lr = -1", "student.model", "data.path"] {
        let lines = err.lines().filter(|l| l.contains(expect)).count();
        assert_eq!(lines, 1, "{expect:?} once in:\n{err}");
    }
    assert!(!err.contains("training.min_lr"), "a knock-on line:\n{err}");
    assert!(err.contains("3 problems"), "{err}");
}

/// The `run.toml` a run records is a configuration `train` accepts: `--resume` from it goes on.
#[test]
fn the_recorded_run_toml_resumes_its_run() {
    let f = fixture("run-dir-recorded");
    let path = config(&f, "run", "");
    ok(train(&path, &["--stop-after", "2"]));
    let recorded = f.dir.0.join("run/run.toml");
    let text = std::fs::read_to_string(&recorded).unwrap();
    assert!(!text.contains("device"), "{text}");
    ok(train(&recorded, &["--resume", "--check"]));
    ok(train(&recorded, &["--resume"]));
    let metrics = std::fs::read_to_string(f.dir.0.join("run/metrics.csv")).unwrap();
    assert_eq!(metrics.lines().count(), 7, "{metrics}");
}

/// What clears a benchmark's earlier run directory removes what the run wrote and nothing
/// else: a file of the user's in it stays, and a run there is then refused, naming it.
#[test]
fn clearing_a_run_keeps_the_users_files() {
    let f = fixture("run-dir-clear");
    let path = config(&f, "run", "");
    ok(train(&path, &["--stop-after", "2"]));
    let run = f.dir.0.join("run");
    std::fs::write(run.join("notes.txt"), "keep me").unwrap();
    xtoken_train::train::preflight::remove_run(&run).unwrap();
    let left: Vec<String> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["notes.txt"]);
    both_refuse(&f, path.to_str().unwrap(), &[], "holds notes.txt");
    // A folder that is no run's is left whole.
    let notes = f.dir.0.join("notes");
    std::fs::create_dir_all(notes.join("checkpoints")).unwrap();
    xtoken_train::train::preflight::remove_run(&notes).unwrap();
    assert!(notes.join("checkpoints").is_dir());
}

/// `--gpu-memory`: 0 is refused as no memory, a small size is written in its unit, the
/// device's largest part is never the host's tokenizers, and a CPU device refuses the option.
#[test]
fn gpu_memory_is_named_in_its_unit_and_refused_on_the_cpu() {
    let f = fixture("run-dir-gpu-memory");
    let path = config(&f, "run", "");
    let text = std::fs::read_to_string(&path).unwrap();
    let cuda = f.dir.0.join("cuda.toml");
    std::fs::write(&cuda, format!("device = \"cuda\"\n{text}")).unwrap();
    let c = cuda.to_str().unwrap();
    let err = stderr(&xtoken(&[
        "train",
        "--config",
        c,
        "--check",
        "--gpu-memory",
        "0",
    ]));
    assert!(err.contains("more than 0 bytes"), "{err}");
    let out = xtoken(&["train", "--config", c, "--check", "--gpu-memory", "1KB"]);
    let err = stderr(&out);
    assert!(err.contains("the 1.0 kB the device has free"), "{err}");
    assert!(!err.contains("tokenizers and aligners"), "{err}");
    let p = path.to_str().unwrap();
    let out = xtoken(&["train", "--config", p, "--check", "--gpu-memory", "80GB"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--gpu-memory: device = \"cpu\""), "{err}");
}

/// `train --config <path>` under `ulimit -v <kb>` and no `XTOKEN_MEMORY_CAP`, ended after two
/// minutes at most.
fn train_limited(path: &Path, kb: u64) -> Output {
    let script = format!(
        "ulimit -v {kb} && exec timeout 120 {} train --config {}",
        env!("CARGO_BIN_EXE_xtoken"),
        path.display()
    );
    std::process::Command::new("bash")
        .args(["-c", &script])
        .env_remove("XTOKEN_MEMORY_CAP")
        .output()
        .unwrap()
}

/// The fixture's run with micro-batches of `micro` sequences of `context` tokens, as `name`.
fn sized(f: &Fixture, name: &str, micro: usize, context: usize) -> std::path::PathBuf {
    let path = config(f, name, "");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            "context_length = 24",
            &format!("context_length = {context}"),
        )
        .replace("batch_size = 4", &format!("batch_size = {micro}"))
        .replace("micro_batch = 2", &format!("micro_batch = {micro}"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Under an address-space limit (`ulimit -v`) and no `XTOKEN_MEMORY_CAP`, a run estimated above
/// the limit is refused by name before its first step.
#[test]
#[cfg(target_os = "linux")]
fn an_address_space_limit_caps_the_run() {
    let f = fixture("run-dir-ulimit");
    let large = sized(&f, "large", 16, 60_000);
    let out = train_limited(&large, 2_000_000);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("address-space limit (ulimit -v) allows"),
        "{err}"
    );
    assert!(!f.dir.0.join("large").exists(), "{err}");
}

/// An allocation the system refuses under `ulimit -v` ends the run by name with exit 1, its
/// lock and temporary files removed, wherever it falls: limits rising from 200 MB, with real
/// tokenizers whose loading takes about 240 MB after the run's lock is taken, never abort
/// (exit 134), and one of them fails inside the locked run.
#[test]
#[cfg(target_os = "linux")]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn a_refused_allocation_ends_the_run_by_name() {
    let f = fixture("run-dir-refused");
    let student = real_tokenizer_model(&f, "llama", "llama-3.2", 128_256, 1);
    let teacher = real_tokenizer_model(&f, "qwen3", "qwen3", 151_936, 2);
    let mut inside = 0;
    for (i, mb) in (200..=1000).step_by(50).enumerate() {
        let path = config(&f, &format!("try{i}"), "");
        let swaps = [
            (f.student.as_path(), student.as_path()),
            (f.teacher.as_path(), teacher.as_path()),
            (f.twin.as_path(), student.as_path()),
        ];
        let text = swap_paths(&std::fs::read_to_string(&path).unwrap(), &swaps);
        std::fs::write(&path, text).unwrap();
        let out = train_limited(&path, mb * 1000);
        let err = stderr(&out);
        // Run through `timeout`, an abort shows as the signal, not as status 134.
        let signal = std::os::unix::process::ExitStatusExt::signal(&out.status);
        assert_eq!(signal, None, "{mb} MB: ended by a signal\n{err}");
        assert_ne!(out.status.code(), Some(134), "{mb} MB: an abort\n{err}");
        let run = f.dir.0.join(format!("try{i}"));
        assert!(
            !run.join("xtoken.lock").exists(),
            "{mb} MB: the lock is left\n{err}"
        );
        if out.status.success() {
            break;
        }
        assert_eq!(out.status.code(), Some(1), "{mb} MB: {err}");
        if err.contains("out of memory: the system refused an allocation") && run.exists() {
            inside += 1;
        }
    }
    assert!(inside > 0, "no limit failed inside a locked run");
}
