//! Nothing a user owns is deleted or overwritten, and runs that cannot go on fail early and by
//! name: `export`, `train`, `train --check` and `--resume` against run directories,
//! checkpoints, model directories, nested and symlinked layouts, on the tiny fixtures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use xtoken_testkit::files::{differences, snapshot};

use crate::fixture::*;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `args`, which must fail with exit 1 and `expect` in its message, changing no file
/// under `root`.
fn refused(root: &Path, args: &[&str], expect: &str) {
    let before = snapshot(root);
    let out = xtoken(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}:\n{err}");
    assert!(
        err.contains(expect),
        "{args:?}: expected {expect:?} in:\n{err}"
    );
    let changed = differences(&before, &snapshot(root));
    assert!(changed.is_empty(), "{args:?} changed {changed:?}");
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

/// `export --out` at the run directory, a checkpoint, a file or a new directory inside one, the
/// student's model directory or tokenizer, a directory that holds them, symbolic links to them,
/// and a directory of other files: each refused, no file anywhere changed, no temporary left.
/// A new directory, then the same one again (an earlier export), are written.
#[test]
#[cfg(unix)]
fn export_never_touches_a_file_it_did_not_write() {
    let f = fixture("harden-export");
    let path = config(&f, "run", "");
    ok(train(&path, &[]));
    let root = &f.dir.0;
    let run = root.join("run");
    let step = run.join("checkpoints/step-00000006");
    let foreign = root.join("notes");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("todo.txt"), "keep me").unwrap();
    symlink(&run, &root.join("run-link"));
    symlink(&f.student, &root.join("student-link"));
    let cases: Vec<(PathBuf, &str)> = vec![
        (run.clone(), "holds the run's configuration"),
        (step.clone(), "is the checkpoint"),
        (step.join("student.bin"), "inside the checkpoint"),
        (step.join("hf-new"), "inside the checkpoint"),
        (run.join("checkpoints"), "holds the checkpoint"),
        (run.join("exports/new"), "inside the run directory"),
        (run.join("student"), "inside the run directory"),
        (root.join("run-link"), "holds the run's configuration"),
        (root.join("run-link/new"), "inside the run directory"),
        (f.student.clone(), "the student's model directory"),
        (root.join("student-link"), "the student's model directory"),
        (
            f.student.join("tokenizer.json"),
            "inside the student's model directory",
        ),
        (foreign.join("todo.txt"), "a file is there"),
        (f.data.clone(), "this is the training data"),
        (root.clone(), "holds"),
        (foreign.clone(), "holds todo.txt"),
    ];
    for (out, expect) in &cases {
        let args = [
            "export",
            "--checkpoint",
            step.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        refused(root, &args, expect);
    }

    let fresh = root.join("exported");
    let args = [
        "export",
        "--checkpoint",
        step.to_str().unwrap(),
        "--out",
        fresh.to_str().unwrap(),
    ];
    ok(xtoken(&args));
    let first = snapshot(&fresh);
    let before = snapshot(&run);
    ok(xtoken(&args));
    assert_eq!(snapshot(&fresh), first, "an earlier export is replaced");
    assert!(differences(&before, &snapshot(&run)).is_empty());
    std::fs::write(fresh.join("mine.txt"), "x").unwrap();
    refused(root, &args, "holds mine.txt");
    let (nowhere, never) = (run.join("checkpoints/step-00000099"), root.join("never"));
    let args = [
        "export",
        "--checkpoint",
        nowhere.to_str().unwrap(),
        "--out",
        never.to_str().unwrap(),
    ];
    refused(root, &args, "step-00000099: no such checkpoint");

    // The run's final student replaced by a link to the student's model directory: resuming
    // (or checking the resumption) would write the student over its own input.
    std::fs::remove_dir_all(run.join("student")).unwrap();
    symlink(&f.student, &run.join("student"));
    let p = path.to_str().unwrap();
    for args in &train_and_check(p, &["--resume"]) {
        refused(root, args, "the student's model directory");
    }
}

/// `train` and `train --check` refuse, before anything loads and writing nothing, a run whose
/// `<output_dir>/student` is the student's model directory (through a link), whose `--config` is
/// the `run.toml` the run would write, whose `output_dir` is empty or a file; `--resume` with no
/// earlier run creates nothing; `--stop-after` past the last step is refused.
#[test]
#[cfg(unix)]
fn train_never_writes_over_its_inputs() {
    let f = fixture("harden-train");
    let root = &f.dir.0;
    let run = root.join("over");
    std::fs::create_dir_all(&run).unwrap();
    symlink(&f.student, &run.join("student"));
    let path = config(&f, "over", "");
    let p = path.to_str().unwrap();
    for args in &train_and_check(p, &[]) {
        refused(root, args, "the student's model directory");
    }

    let kept = root.join("kept");
    std::fs::create_dir_all(&kept).unwrap();
    let text = std::fs::read_to_string(config(&f, "kept", "")).unwrap();
    let own = kept.join("run.toml");
    std::fs::write(&own, format!("# my comments\n{text}")).unwrap();
    let o = own.to_str().unwrap();
    for args in &train_and_check(o, &[]) {
        refused(root, args, "the --config file is where the run records");
    }

    let empty = root.join("empty.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text.lines().find(|l| l.starts_with("output_dir")).unwrap();
    std::fs::write(&empty, text.replace(line, "output_dir = \"\"")).unwrap();
    refused(
        root,
        &["train", "--config", empty.to_str().unwrap()],
        "output_dir = \"\"",
    );

    let fresh = config(&f, "never-ran", "");
    let args = ["train", "--config", fresh.to_str().unwrap(), "--resume"];
    refused(root, &args, "holds no earlier run to resume");
    assert!(!root.join("never-ran").exists());
    let args = [
        "train",
        "--config",
        fresh.to_str().unwrap(),
        "--stop-after",
        "7",
    ];
    refused(root, &args, "past the run's last step");
}

/// A checkpoint is intact only if every file is: with every `state.json` unreadable, `--resume`
/// ends with "no intact checkpoint" instead of training from step 0 (and pruning the old ones);
/// a missing file is called missing.
#[test]
fn an_unreadable_state_is_a_damaged_checkpoint() {
    let f = fixture("harden-state");
    let path = config(&f, "run", "");
    ok(train(&path, &["--stop-after", "4"]));
    let checkpoints = f.dir.0.join("run/checkpoints");
    let newest = checkpoints.join("step-00000004");
    let student = newest.join("student.bin");
    let kept = std::fs::read(&student).unwrap();
    std::fs::remove_file(&student).unwrap();
    let export = f.dir.0.join("export");
    let args = [
        "export",
        "--checkpoint",
        newest.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
    ];
    refused(&f.dir.0, &args, "student.bin is missing");
    std::fs::write(&student, kept).unwrap();

    for step in ["step-00000002", "step-00000004"] {
        std::fs::write(checkpoints.join(step).join("state.json"), "{ not json").unwrap();
    }
    let args = ["train", "--config", path.to_str().unwrap(), "--resume"];
    refused(&f.dir.0, &args, "no intact checkpoint");
    let err = stderr(&xtoken(&args));
    assert!(
        err.contains("step-00000004: state.json") && err.contains("step-00000002: state.json"),
        "{err}"
    );
    assert!(newest.exists(), "no checkpoint was pruned");
}

/// A run directory in use by a live process (its lock names it) is refused, naming it; the
/// lock of a process that no longer runs is taken over with a warning and removed at the end.
#[test]
fn one_process_trains_in_a_run_directory() {
    let f = fixture("harden-lock");
    let path = config(&f, "run", "");
    let run = f.dir.0.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| std::env::var("HOSTNAME").unwrap_or_default());
    let lock = run.join("xtoken.lock");
    // Process 1 (init) always runs.
    std::fs::write(&lock, format!("pid=1\nhost={host}\n")).unwrap();
    let p = path.to_str().unwrap();
    for args in &train_and_check(p, &[]) {
        refused(&f.dir.0, args, &format!("process 1 on {host}"));
    }
    if std::path::Path::new("/proc/self").exists() {
        std::fs::write(&lock, format!("pid={}\nhost={host}\n", u32::MAX - 1)).unwrap();
        let log = ok(train(&path, &["--stop-after", "2"]));
        assert!(log.contains("which no longer runs"), "{log}");
        assert!(!lock.exists(), "the lock is released at the end");
    }
}

/// Data rewritten, grown or added under a checkpoint is named on `--resume`; with
/// `--allow-data-change` the run goes on and says what changed.
#[test]
fn data_changed_under_a_checkpoint_is_named() {
    let f = fixture("harden-data");
    let path = config(&f, "run", "");
    ok(train(&path, &["--stop-after", "2"]));
    let mut text = std::fs::read_to_string(&f.data).unwrap();
    text.push_str("{\"text\": \"Bob has 3 pears.\"}\n");
    std::fs::write(&f.data, text).unwrap();
    let args = ["train", "--config", path.to_str().unwrap(), "--resume"];
    refused(&f.dir.0, &args, "train.jsonl changed");
    let log = ok(train(&path, &["--resume", "--allow-data-change"]));
    assert!(
        log.contains("--allow-data-change: ") && log.contains("train.jsonl changed"),
        "{log}"
    );
    assert!(f.dir.0.join("run/student/model.safetensors").exists());
}

/// A context the machine cannot hold is refused before anything loads, naming the estimate
/// and what to lower (it once aborted after asking for 177 GB); `--check` says the same.
#[test]
fn a_run_larger_than_the_memory_is_refused_before_loading() {
    let f = fixture("harden-memory");
    let config_json = f.student.join("config.json");
    let mut hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_json).unwrap()).unwrap();
    hf["max_position_embeddings"] = serde_json::json!(262144);
    std::fs::write(&config_json, hf.to_string()).unwrap();
    let path = config(&f, "big", "");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("context_length = 24", "context_length = 200000")
        // The attention on the CPU is linear in the length: the micro-batch makes it too large
        // for any machine (about 2 TB of activations).
        .replace(
            "batch_size = 4\nmicro_batch = 2",
            "batch_size = 2048\nmicro_batch = 2048",
        );
    std::fs::write(&path, text).unwrap();
    let p = path.to_str().unwrap();
    for args in &train_and_check(p, &[]) {
        refused(&f.dir.0, args, "this machine has available");
        let err = stderr(&xtoken(args));
        assert!(err.contains("training.context_length"), "{err}");
    }
    assert!(!f.dir.0.join("big").exists());
}

/// A single-line document of 3 MB, whose alignment in one DP would exceed the memory one
/// alignment may use, is aligned in pieces and trained on.
#[test]
fn a_very_long_document_is_aligned_in_pieces() {
    let f = fixture("harden-long");
    let sentence = "Ann has 12 apples and gets 34 more, so she has 46 apples. ";
    let long = sentence.repeat(3_000_000 / sentence.len());
    let mut text = serde_json::json!({ "text": long }).to_string();
    text.push('\n');
    text.push_str(&std::fs::read_to_string(&f.data).unwrap());
    std::fs::write(&f.data, text).unwrap();
    let path = config(&f, "run", "");
    let check = xtoken(&["train", "--config", path.to_str().unwrap(), "--check"]);
    let plan = String::from_utf8_lossy(&check.stdout).into_owned();
    ok(check);
    assert!(
        plan.contains("train.jsonl: its first document is 3.00 MB long")
            && plan.contains("aligned in pieces of at most 1 MiB")
            && plan.contains("the longest document aligned"),
        "{plan}"
    );
    ok(train(&path, &["--stop-after", "2"]));

    // Held whole once aligned, the document is the estimate's largest part, and an ending out
    // of memory names it.
    let capped = |cap: &str, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_xtoken"))
            .args(args)
            .env("XTOKEN_MEMORY_CAP", cap)
            .output()
            .unwrap()
    };
    let p = path.to_str().unwrap();
    let out = capped("150MB", &["train", "--config", p, "--check"]);
    let err = stderr(&out);
    assert!(
        err.contains("the largest part is the longest document"),
        "{err}"
    );
    let fresh = config(&f, "capped", "");
    let out = capped("150MB", &["train", "--config", fresh.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("out of memory")
            && err.contains("the longest document aligned was 3.0 MB")
            && err.contains("train.jsonl:1"),
        "{err}"
    );
}

/// `--check` runs every check `train` runs before its first step and names every failure, not
/// only the first: KL across tokenizers, a bf16 student and bf16 compute on the CPU, an empty
/// data file, an `output_dir` that is a file.
#[test]
fn check_names_every_failure() {
    let f = fixture("harden-check");
    let empty = f.dir.0.join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    std::fs::write(f.dir.0.join("taken"), "a file").unwrap();
    let path = config(&f, "taken", "");
    // burn's ndarray, which holds f32 only.
    let text = std::fs::read_to_string(&path).unwrap();
    let text = format!("device = \"ndarray\"\n{text}")
        .replace("loss = \"auto\"", "loss = \"kl\"")
        .replace(f.data.to_str().unwrap(), empty.to_str().unwrap())
        .replace("steps = 6\n", "steps = 6\ncompute_dtype = \"bf16\"\n")
        .replace(
            &format!("[student]\nmodel = \"{}\"", f.student.display()),
            &format!(
                "[student]\nmodel = \"{}\"\ndtype = \"bf16\"",
                f.student.display()
            ),
        );
    std::fs::write(&path, text).unwrap();
    let args = ["train", "--config", path.to_str().unwrap(), "--check"];
    refused(&f.dir.0, &args, "5 problems");
    let err = stderr(&xtoken(&args));
    for expect in [
        "output_dir: ",
        "student.dtype = \"bf16\"",
        "training.compute_dtype = \"bf16\": the ndarray backend has no bf16 tensors (it has f32)",
        "teachers[0].loss = \"kl\"",
        "no document in its 1 shard(s)",
    ] {
        assert!(err.contains(expect), "{expect:?} in:\n{err}");
    }
}

/// 16-bit compute on `device = "cpu"` is refused before anything loads, saying why and what to
/// use; `device = "flex"` keeps it.
#[test]
fn sixteen_bit_compute_on_the_cpu_device_is_refused() {
    let f = fixture("harden-cpu-bf16");
    let path = config(&f, "cpu-bf16", "");
    let text = std::fs::read_to_string(&path).unwrap();
    let text = format!("device = \"cpu\"\n{text}")
        .replace("steps = 6\n", "steps = 6\ncompute_dtype = \"bf16\"\n");
    std::fs::write(&path, &text).unwrap();
    let args = ["train", "--config", path.to_str().unwrap(), "--check"];
    refused(
        &f.dir.0,
        &args,
        "training.compute_dtype = \"bf16\" on device = \"cpu\"",
    );
    let err = stderr(&xtoken(&args));
    assert!(
        err.contains("about 1.8×") && err.contains("device = \"flex\""),
        "{err}"
    );
    std::fs::write(&path, text.replace("device = \"cpu\"", "device = \"flex\"")).unwrap();
    let out = xtoken(&args);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A failed `train` removes what it created (run.toml, the W it built, the directory); a run
/// extended with `--extend-steps decay` after it finished trains its new steps at a rate above 0.
#[test]
fn a_failed_run_leaves_nothing_and_an_extended_one_trains() {
    let f = fixture("harden-failed");
    // The second teacher's weights are missing: the run fails after building the first's W.
    let broken = f.dir.0.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(f.twin.join(file), broken.join(file)).unwrap();
    }
    let path = config(&f, "failed", "");
    let bad = std::fs::read_to_string(&path)
        .unwrap()
        .replace(&f.twin.display().to_string(), broken.to_str().unwrap());
    std::fs::write(&path, bad).unwrap();
    let out = train(&path, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!f.dir.0.join("failed").exists(), "{}", stderr(&out));

    let path = config(&f, "done", "");
    ok(train(&path, &[]));
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("steps = 6", "steps = 8");
    std::fs::write(&path, text).unwrap();
    ok(train(&path, &["--resume", "--extend-steps", "decay"]));
    let metrics = std::fs::read_to_string(f.dir.0.join("done/metrics.csv")).unwrap();
    for row in metrics.lines().skip(7) {
        let lr: f64 = row.split(',').nth(1).unwrap().parse().unwrap();
        assert!(lr > 0.0, "{metrics}");
    }
    assert_eq!(metrics.lines().count(), 9, "{metrics}");
}

/// Ctrl-C during `align --out` leaves no `X.xtc.tmp` behind.
#[test]
#[cfg(unix)]
fn an_interrupted_align_leaves_no_temporary_file() {
    let f = fixture("harden-ctrlc");
    let input = f.dir.0.join("many.jsonl");
    let line = serde_json::json!({ "text": "Ann has 12 apples. ".repeat(200) }).to_string();
    std::fs::write(&input, format!("{line}\n").repeat(5_000)).unwrap();
    let out = f.dir.0.join("many.xtc");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args([
            "align",
            "--student",
            f.student.to_str().unwrap(),
            "--teacher",
            f.teacher.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let tmp = f.dir.0.join("many.xtc.tmp");
    let started = std::time::Instant::now();
    while !tmp.exists() && started.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        tmp.exists(),
        "the cache is written under its temporary name"
    );
    // The shell's own `kill`, so that no separate package is needed.
    let killed = std::process::Command::new("sh")
        .args(["-c", &format!("kill -INT {}", child.id())])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(!tmp.exists() && !out.exists());
}

/// The files of a directory by name, with their bytes.
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

/// Ctrl-C at any moment of `export --out` over an earlier export leaves either the earlier
/// export whole or the new one whole, and nothing beside it.
#[test]
#[cfg(unix)]
fn an_interrupted_export_leaves_the_earlier_one_whole() {
    let f = fixture("harden-export-int");
    ok(train(&config(&f, "run", ""), &[]));
    let root = &f.dir.0;
    let step = |n: u32| {
        let dir = root.join(format!("run/checkpoints/step-{n:08}"));
        dir.display().to_string()
    };
    let export = |checkpoint: &str, out: &Path| {
        let args = [
            "export",
            "--checkpoint",
            checkpoint,
            "--out",
            out.to_str().unwrap(),
        ];
        ok(xtoken(&args));
    };
    let (old, new) = (root.join("old"), root.join("new"));
    export(&step(6), &old);
    export(&step(4), &new);
    let (old, new) = (contents(&old), contents(&new));
    assert_ne!(old, new);
    let out = root.join("exports/current");
    let mut interrupted = 0;
    for attempt in 0..32u64 {
        std::fs::remove_dir_all(root.join("exports")).ok();
        export(&step(6), &out);
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_xtoken"))
            .args([
                "export",
                "--checkpoint",
                &step(4),
                "--out",
                out.to_str().unwrap(),
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // From the handler's start to the swap and after: each attempt a little later.
        std::thread::sleep(std::time::Duration::from_millis(attempt));
        let signal = format!("kill -INT {} 2>/dev/null", child.id());
        std::process::Command::new("sh")
            .args(["-c", &signal])
            .status()
            .unwrap();
        let status = child.wait().unwrap();
        interrupted += usize::from(status.code() == Some(130));
        let now = contents(&out);
        assert!(
            now == old || now == new,
            "attempt {attempt}: a mixed export"
        );
        let beside: Vec<_> = std::fs::read_dir(root.join("exports")).unwrap().collect();
        assert_eq!(
            beside.len(),
            1,
            "attempt {attempt}: something left beside the export"
        );
    }
    assert!(interrupted > 0, "no attempt was interrupted");
}

/// For every refusal `train` makes before its first step, `train --check` makes the same one,
/// with the same words: on resumption (data changed, a refused field changed, steps raised
/// without `--extend-steps` or lowered, `--stop-after` already passed, every checkpoint
/// damaged), `[eval]` benchmarks without their files, and on-policy prompts missing or empty in
/// every record. Neither writes a file.
#[test]
fn check_refuses_what_train_refuses() {
    let f = fixture("harden-check-equals");
    let root = &f.dir.0;
    let path = config(&f, "run", "");
    ok(train(&path, &["--stop-after", "4"]));
    let edited = |name: &str, from: &str, to: &str| {
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from:?}");
        let out = root.join(name);
        std::fs::write(&out, text.replace(from, to)).unwrap();
        out.display().to_string()
    };
    let same_for_both = |config: &str, extra: &[&str], expect: &str| {
        for args in &train_and_check(config, extra) {
            refused(root, args, expect);
        }
    };
    let p = path.to_str().unwrap();
    same_for_both(
        &edited("top-k.toml", "top_k = 16", "top_k = 8"),
        &["--resume"],
        "loss.top_k changed since the run started",
    );
    same_for_both(
        &edited("lr.toml", "warmup = 0.2", "warmup = 0.2\nlr = 0.01"),
        &["--resume"],
        "training.lr changed since the run started",
    );
    same_for_both(
        &edited("more.toml", "steps = 6", "steps = 9"),
        &["--resume"],
        "pass --extend-steps decay",
    );
    same_for_both(
        &edited("fewer.toml", "steps = 6", "steps = 3"),
        &["--resume"],
        "a run is never shortened",
    );
    same_for_both(
        p,
        &["--resume", "--stop-after", "3"],
        "--stop-after 3: the run resumed at step 4",
    );
    let data = std::fs::read(&f.data).unwrap();
    std::fs::write(&f.data, [&data[..], b"{\"text\": \"one more\"}\n"].concat()).unwrap();
    same_for_both(
        p,
        &["--resume"],
        "the training data changed since the checkpoint of step 4",
    );
    std::fs::write(&f.data, &data).unwrap();

    let eval = format!(
        "[eval]\nevery = 2\ntasks = [\"gsm8k\"]\ntasks_data = \"{}\"\n",
        root.join("nowhere").display()
    );
    let benchmarks = config(&f, "benchmarks", &eval);
    same_for_both(
        benchmarks.to_str().unwrap(),
        &[],
        "nowhere: no such directory",
    );
    let on_policy = "[on_policy]\nfraction = 0.5\nprompt_field = \"prompt\"\nmax_new_tokens = 8\n";
    let prompts = config(&f, "prompts", on_policy);
    same_for_both(
        prompts.to_str().unwrap(),
        &[],
        "none of the first 40 records",
    );
    assert!(!root.join("benchmarks").exists() && !root.join("prompts").exists());

    for step in ["step-00000002", "step-00000004"] {
        std::fs::write(
            root.join("run/checkpoints").join(step).join("state.json"),
            "{",
        )
        .unwrap();
    }
    same_for_both(p, &["--resume"], "no intact checkpoint");
}

/// `--check` names each bad value and each missing input, not only the first; refused for
/// memory it prints the estimate's table first; for a CUDA run planned on a machine without the
/// GPU it prints the plan with `--gpu-memory`'s limit and lists the missing device.
#[test]
fn check_lists_every_bad_value_and_input_and_shows_its_plan() {
    let f = fixture("harden-check-all");
    let root = &f.dir.0;
    let path = config(&f, "run", "");
    let text = std::fs::read_to_string(&path).unwrap();
    let bad = root.join("bad.toml");
    let values = text
        .replace("warmup = 0.2", "warmup = 0.2\nlr = -1.0\nbeta1 = 2.0")
        .replace("every = 2", "every = 0");
    std::fs::write(&bad, values).unwrap();
    let args = ["train", "--config", bad.to_str().unwrap(), "--check"];
    refused(root, &args, "problems");
    let err = stderr(&xtoken(&args));
    for expect in [
        "training.lr = -1",
        "training.beta1 = 2",
        "checkpoint.every = 0",
    ] {
        assert!(err.contains(expect), "{expect:?} in:\n{err}");
    }

    let missing = root.join("missing.toml");
    let gone = |p: &Path| p.display().to_string();
    let text = text
        .replace(&gone(&f.student), &gone(&root.join("no-student")))
        .replace(&gone(&f.teacher), &gone(&root.join("no-teacher")))
        .replace(&gone(&f.data), &gone(&root.join("no-data.jsonl")));
    std::fs::write(&missing, format!("device = \"cuda\"\n{text}")).unwrap();
    let args = ["train", "--config", missing.to_str().unwrap(), "--check"];
    let err = stderr(&xtoken(&args));
    for expect in [
        "student.model",
        "teachers[0].model (digits)",
        "data.path",
        "cuda",
    ] {
        assert!(err.contains(expect), "{expect:?} in:\n{err}");
    }

    // On the CUDA device of a machine without one: the plan, its estimate for 1 GB of device
    // memory, and the missing device among the failures.
    let cuda = root.join("cuda.toml");
    std::fs::write(
        &cuda,
        format!(
            "device = \"cuda\"\n{}",
            std::fs::read_to_string(&path).unwrap()
        ),
    )
    .unwrap();
    let c = cuda.to_str().unwrap();
    let out = xtoken(&["train", "--config", c, "--check", "--gpu-memory", "1GB"]);
    let plan = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{plan}");
    assert!(plan.contains("Steps") || plan.contains("steps"), "{plan}");
    assert!(plan.to_lowercase().contains("memory"), "{plan}");
    let out = xtoken(&["train", "--config", c, "--check", "--gpu-memory", "1MB"]);
    let (plan, err) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr(&out),
    );
    assert!(
        plan.to_lowercase().contains("memory"),
        "the estimate comes first:\n{plan}"
    );
    assert!(
        err.contains("more than the 1.0 MB the device has free")
            && err.contains("the estimate is above"),
        "{err}"
    );
}
