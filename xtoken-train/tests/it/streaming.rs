//! Streamed training data end to end: shards of three formats in a weighted mixture, a run
//! killed and resumed bit for bit, and what a resumed run may change.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixture::*;

/// A directory `web/` with a `.jsonl.zst` and a `.parquet` shard, and `books.txt`.
fn corpus(f: &Fixture) -> (PathBuf, PathBuf) {
    let texts = problems(50);
    let web = f.dir.0.join("web");
    std::fs::create_dir_all(&web).unwrap();
    let lines: Vec<String> = texts[..20]
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    let compressed = zstd::encode_all((lines.join("\n") + "\n").as_bytes(), 3).unwrap();
    std::fs::write(web.join("a.jsonl.zst"), compressed).unwrap();
    write_parquet(&web.join("b.parquet"), &texts[20..35]);
    let books = f.dir.0.join("books.txt");
    std::fs::write(&books, texts[35..].join("\n") + "\n").unwrap();
    (web, books)
}

/// The fixture's run configuration over the mixture, with `edit` applied to its text.
fn mixture_config(f: &Fixture, out: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let (web, books) = corpus(f);
    let path = config(f, out, "");
    let data = format!(
        "path = [\"{}\", \"{}\"]\nweights = [2.0, 1.0]",
        web.display(),
        books.display()
    );
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace(&format!("path = \"{}\"", f.data.display()), &data);
    std::fs::write(&path, edit(text)).unwrap();
    path
}

fn metric_columns(run: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(run.join("metrics.csv"))
        .unwrap()
        .lines()
        .map(|l| l.split(',').take(9).map(String::from).collect())
        .collect()
}

#[test]
fn a_mixture_of_three_formats_killed_and_resumed_ends_bit_identical() {
    let f = fixture("stream-kill");
    let held_out = f.dir.0.join("held-out.txt");
    std::fs::write(&held_out, problems(60)[50..].join("\n") + "\n").unwrap();
    let eval = format!(
        "\n[eval]\npath = \"{}\"\nevery = 4\nmax_tokens = 60\n",
        held_out.display()
    );
    let longer = |t: String| t.replace("steps = 6", "steps = 16") + &eval;
    let straight = mixture_config(&f, "straight", longer);
    let log = ok(train(&straight, &[]));
    let run = f.dir.0.join("straight");
    assert!(!run.join("data").exists(), "streaming writes no cache");
    // Held-out evaluation every 4 steps, on the same rows each time.
    assert!(log.contains("held-out: 3 rows"), "{log}");
    assert!(log.contains("held-out after step 4: CE "), "{log}");
    let evals = std::fs::read_to_string(run.join("eval.csv")).unwrap();
    let steps: Vec<&str> = evals
        .lines()
        .skip(1)
        .map(|l| &l[..l.find(',').unwrap()])
        .collect();
    assert_eq!(steps, ["4", "8", "12", "16"], "{evals}");
    assert!(
        evals.starts_with("step,ce,loss_digits,loss_same"),
        "{evals}"
    );
    for line in evals.lines().skip(1) {
        let v: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
        assert!(v[1..].iter().all(|x| x.is_finite() && *x > 0.0), "{line}");
    }
    let svg = std::fs::read_to_string(run.join("loss.svg")).unwrap();
    assert!(svg.contains("held-out CE") && svg.contains("held-out digits"));

    // The same run, killed once its step-4 checkpoint is in place.
    let killed = mixture_config(&f, "killed", longer);
    let run2 = f.dir.0.join("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args(["train", "--config", killed.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !run2.join("checkpoints/step-00000004").exists() {
        assert!(start.elapsed() < Duration::from_secs(300), "no checkpoint");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!run2.join("student").exists(), "killed before the end");
    let log = ok(train(&killed, &["--resume"]));
    assert!(log.contains("resuming from"), "{log}");
    assert_eq!(metric_columns(&run2), metric_columns(&run));
    assert_eq!(
        std::fs::read_to_string(run2.join("eval.csv")).unwrap(),
        evals
    );
    assert_eq!(metric_columns(&run).len(), 17);
    assert_eq!(
        std::fs::read(run.join("student/model.safetensors")).unwrap(),
        std::fs::read(run2.join("student/model.safetensors")).unwrap(),
        "the resumed run must end with the very same weights"
    );
}

#[test]
fn a_resumed_run_may_change_logging_and_retention_and_extend_its_steps() {
    let f = fixture("stream-extend");
    let path = mixture_config(&f, "run", |t| t.replace("keep = 2", "keep = 3"));
    ok(train(&path, &["--stop-after", "4"]));
    let run = f.dir.0.join("run");
    let lr_4 = metric_columns(&run)[4][1].parse::<f64>().unwrap();

    // The math may not change; the error names the field.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("top_k = 16", "top_k = 8")).unwrap();
    let err = String::from_utf8_lossy(&train(&path, &["--resume"]).stderr).into_owned();
    assert!(err.contains("loss.top_k changed"), "{err}");

    // More steps need the flag that says how the schedule goes on.
    let changed = text
        .replace("keep = 3", "keep = 1")
        .replace("steps = 6", "steps = 8\nlog_every = 1");
    std::fs::write(&path, &changed).unwrap();
    let err = String::from_utf8_lossy(&train(&path, &["--resume"]).stderr).into_owned();
    assert!(
        err.contains("training.steps = 8") && err.contains("--extend-steps"),
        "{err}"
    );
    let log = ok(train(&path, &["--resume", "--extend-steps", "decay"]));
    assert!(log.contains("training.steps extended to 8"), "{log}");
    for step in 5..=8 {
        assert!(
            log.contains(&format!("step {step}/8 ")),
            "log_every = 1:\n{log}"
        );
    }
    let checkpoints: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(checkpoints, ["step-00000008"], "keep = 1");
    let rows = metric_columns(&run);
    assert_eq!(rows.len(), 9);
    // The rate decays from where it stood after step 4 (its step-5 rate under 6 steps) to 0.
    let lrs: Vec<f64> = rows[1..].iter().map(|r| r[1].parse().unwrap()).collect();
    assert!(lrs[4] < lr_4 && lrs[4] > 0.0, "{lrs:?}");
    assert!(lrs[4..].windows(2).all(|w| w[1] < w[0]), "{lrs:?}");
    assert!(std::fs::read_to_string(run.join("run.toml"))
        .unwrap()
        .contains("steps = 8"));
}

#[test]
fn check_reads_everything_and_trains_nothing() {
    let f = fixture("stream-check");
    let path = mixture_config(&f, "run", |t| t);
    let out = train(&path, &["--check"]);
    let plan = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "steps 6 · 1 worker(s) · 2 micro-batches per step and worker · 96 student tokens per step",
        "teacher digits",
        "auto → ",
        "built at the start",
        "teacher same",
        ": KL",
        "2 shard(s)",
        "67 % of the documents",
        "memory of one device, estimated",
        "host memory of one process, estimated",
    ] {
        assert!(plan.contains(expected), "{expected:?} in\n{plan}");
    }
    assert!(!f.dir.0.join("run").exists(), "--check writes nothing");

    // A shard with a bad line is named with its line.
    std::fs::write(f.dir.0.join("web/c.jsonl"), "{\"text\": \"fine\"}\n").unwrap();
    let out = train(&path, &["--check"]);
    assert!(out.status.success());
    std::fs::write(f.dir.0.join("web/c.jsonl"), "{\"text\": \n").unwrap();
    let out = train(&path, &["--check"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success() && err.contains("c.jsonl:1: invalid JSON"),
        "{err}"
    );
}

/// `[eval] tasks`: the student scored on benchmarks every `every` steps and after the last, the
/// results logged, in `benchmarks.csv` and kept up to the step of a resumed run; `xtoken eval`
/// scores a checkpoint the same way; a task that does not exist is named before anything loads.
#[test]
fn benchmarks_are_scored_during_training_and_on_checkpoints() {
    let f = fixture("bench-eval");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/harness/data");
    let eval = |tasks: &str| {
        format!(
            "\n[eval]\ntasks = {tasks}\ntasks_data = \"{}\"\ntasks_limit = 1\nevery = 4\n\
             tasks_log_samples = true\n",
            data.display()
        )
    };
    let path = config(&f, "bench", &eval(r#"["winogrande", "gsm8k"]"#));
    let log = ok(train(&path, &["--stop-after", "4"]));
    assert!(
        log.contains("benchmarks: winogrande, gsm8k (2 documents, 3-shot)"),
        "{log}"
    );
    assert!(
        log.contains("benchmarks after step 4: winogrande acc "),
        "{log}"
    );
    let log = ok(train(&path, &["--resume"]));
    assert!(log.contains("benchmarks after step 6: "), "{log}");
    let run = f.dir.0.join("bench");
    let csv = std::fs::read_to_string(run.join("benchmarks.csv")).unwrap();
    let rows: Vec<(&str, &str)> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let mut fields = l.split(',');
            (fields.next().unwrap(), fields.next().unwrap())
        })
        .collect();
    let expected = [("4", "winogrande"), ("4", "gsm8k"), ("4", "gsm8k")];
    let after = [("6", "winogrande"), ("6", "gsm8k"), ("6", "gsm8k")];
    assert_eq!(rows, [&expected[..], &after[..]].concat(), "{csv}");
    assert!(
        csv.contains("4,gsm8k,\"exact_match,strict-match\","),
        "{csv}"
    );
    // `tasks_log_samples`: each evaluation's records, GSM8k's once per filter.
    for step in ["step-00000004", "step-00000006"] {
        let dir = run.join("samples").join(step);
        let lines = |name: &str| {
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            let records: Vec<serde_json::Value> = text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            records
        };
        assert_eq!(lines("samples_winogrande.jsonl").len(), 1, "{step}");
        let gsm8k = lines("samples_gsm8k.jsonl");
        let filters: Vec<&str> = gsm8k
            .iter()
            .map(|r| r["filter"].as_str().unwrap())
            .collect();
        assert_eq!(filters, ["strict-match", "flexible-extract"], "{step}");
    }

    let checkpoint = run.join("checkpoints/step-00000006");
    let out = xtoken(&[
        "eval",
        "--model",
        checkpoint.to_str().unwrap(),
        "--tasks",
        "winogrande",
        "--data",
        data.to_str().unwrap(),
        "--limit",
        "1",
        "--json",
    ]);
    let err = ok(out.clone());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["tasks"][0]["task"], "winogrande", "{err}");
    let logged: f64 = csv
        .lines()
        .nth(4)
        .unwrap()
        .split(',')
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        json["tasks"][0]["metrics"][0]["value"].as_f64().unwrap(),
        logged
    );

    let bad = config(&f, "bad", &eval(r#"["winogrande", "arc"]"#));
    let err = String::from_utf8_lossy(&train(&bad, &[]).stderr).into_owned();
    assert!(err.contains("eval.tasks[1]: unknown task `arc`"), "{err}");
}
