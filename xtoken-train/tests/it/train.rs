//! `xtoken train` end to end on CPU, on the fixtures of `fixture/`.

use crate::fixture::*;
use burn::backend::NdArray;
use xtoken_models::Transformer;

#[test]
fn trains_two_teachers_resumes_exactly_and_saves_the_student() {
    let f = fixture("resume");
    // A run straight through.
    let straight = config(&f, "straight", "");
    let log = ok(train(&straight, &[]));
    eprintln!("{log}");
    assert!(log.contains("auto → Pkl"), "{log}");
    let run = f.dir.0.join("straight");
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let rows: Vec<&str> = metrics.lines().collect();
    assert_eq!(rows.len(), 7, "{metrics}");
    assert!(rows[0].starts_with("step,lr,loss,ce,kd,loss_digits,alpha_digits,loss_same,alpha_same"));
    for row in &rows[1..] {
        let values: Vec<f64> = row.split(',').map(|v| v.parse().unwrap()).collect();
        assert!(values.iter().all(|v| v.is_finite()), "{row}");
        // Dynamic scaling: the value of L is 2·CE; both teachers contribute.
        assert!(
            (values[2] - 2.0 * values[3]).abs() < 1e-4 * values[2].abs(),
            "{row}"
        );
        assert!(values[5] > 0.0 && values[7] > 0.0, "{row}");
        assert_eq!((values[6], values[8]), (1.0, 0.5), "{row}");
    }
    let events: Vec<_> = std::fs::read_dir(run.join("tensorboard"))
        .unwrap()
        .collect();
    assert_eq!(events.len(), 1, "one TensorBoard event file");
    let svg = std::fs::read_to_string(run.join("loss.svg")).unwrap();
    assert!(svg.contains("<polyline") && svg.contains("digits"));
    let mut checkpoints: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    checkpoints.sort();
    assert_eq!(checkpoints, ["step-00000004", "step-00000006"]);
    // The student is a Hugging Face directory the models crate loads back.
    let student = run.join("student");
    assert!(student.join("tokenizer.json").exists());
    let loaded = Transformer::<NdArray>::load(&student, &Default::default()).unwrap();
    assert_eq!(loaded.architecture.vocab_size, 356);
    // W was built once and stored.
    assert!(run.join("projections/digits.W.safetensors").exists());

    // The same run, stopped after step 3, killed while saving step 4, then resumed.
    resumes_exactly(&f, "straight", "interrupted", "");

    // A finished run refuses to start over in the same directory.
    let out = train(&straight, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--resume"));
}

/// Flips one bit in the middle of `path`.
fn flip_a_bit(path: &std::path::Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

/// One flipped bit in the newest checkpoint's student: `--resume` names the file, falls back to
/// the previous checkpoint and ends with the weights of a run straight through; with every
/// checkpoint damaged it stops with an error naming each, loading nothing.
#[test]
fn a_damaged_checkpoint_is_never_loaded() {
    let f = fixture("damaged");
    let straight = config(&f, "straight", "save_dtype = \"f32\"");
    ok(train(&straight, &[]));
    let damaged = config(&f, "damaged", "save_dtype = \"f32\"");
    ok(train(&damaged, &["--stop-after", "4"]));
    let run = f.dir.0.join("damaged");
    let checkpoints = run.join("checkpoints");
    assert!(checkpoints.join("step-00000002/manifest.json").exists());
    flip_a_bit(&checkpoints.join("step-00000004/student.bin"));
    let log = ok(train(&damaged, &["--resume"]));
    assert!(
        log.contains("step-00000004 is damaged: student.bin does not match its checksum"),
        "{log}"
    );
    assert!(
        log.contains("resuming from") && log.contains("(step 2)"),
        "{log}"
    );
    assert_eq!(
        std::fs::read(f.dir.0.join("straight/student/model.safetensors")).unwrap(),
        std::fs::read(run.join("student/model.safetensors")).unwrap(),
        "resumed from the older checkpoint, the run ends where a straight run ends"
    );

    for step in ["step-00000004", "step-00000006"] {
        flip_a_bit(&checkpoints.join(step).join("optim-decay.bin"));
    }
    let out = train(&damaged, &["--resume"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no intact checkpoint"), "{err}");
    assert!(
        err.contains("step-00000004: optim-decay.bin does not match")
            && err.contains("step-00000006: optim-decay.bin does not match"),
        "{err}"
    );
}

#[test]
fn other_losses_and_text_formats() {
    let f = fixture("formats");
    let txt = f.dir.0.join("train.txt");
    std::fs::write(&txt, problems(12).join("\n\n") + "\n").unwrap();
    let parquet = f.dir.0.join("train.parquet");
    write_parquet(&parquet, &problems(12));
    for (tag, loss, data) in [
        ("hkl", "hkl", &txt),
        ("gold", "gold", &txt),
        ("uld", "uld", &parquet),
    ] {
        let path = config(&f, tag, "");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("loss = \"auto\"", &format!("loss = \"{loss}\""))
            .replace(&f.data.display().to_string(), &data.display().to_string())
            .replace("steps = 6", "steps = 2");
        std::fs::write(&path, text).unwrap();
        ok(train(&path, &[]));
        let metrics = std::fs::read_to_string(f.dir.0.join(tag).join("metrics.csv")).unwrap();
        assert_eq!(metrics.lines().count(), 3, "{loss}: {metrics}");
    }
}

/// P-KL with `projection.learnable = false`: W takes no optimizer step, stays in place over
/// every step (it was once dropped after the first) and is still checkpointed.
#[test]
fn pkl_with_a_frozen_w_trains_every_step() {
    let f = fixture("frozen");
    let path = config(&f, "frozen", "[projection]\nlearnable = false");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("loss = \"auto\"", "loss = \"pkl\"")
        .replace("steps = 6", "steps = 3");
    std::fs::write(&path, text).unwrap();
    ok(train(&path, &[]));
    let run = f.dir.0.join("frozen");
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert_eq!(metrics.lines().count(), 4, "{metrics}");
    let last = run.join("checkpoints/step-00000003");
    assert!(last.join("w-digits.bin").exists());
    assert!(
        !last.join("w-optim-digits.bin").exists(),
        "a frozen W has no optimizer"
    );
}

#[test]
fn bad_configurations_name_the_key() {
    let f = fixture("errors");
    let cases = [
        ("[training]\nsteps = 6", "[training]\nstep = 6", "step"),
        (
            "loss = \"auto\"",
            "loss = \"projected\"",
            "teachers[0].loss",
        ),
        ("micro_batch = 2", "micro_batch = 3", "training.batch_size"),
        (
            "top_k = 16",
            "top_k = 16\ntemperature = 0.0",
            "loss.temperature",
        ),
    ];
    for (from, to, named) in cases {
        let path = config(&f, "bad", "");
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replacen(from, to, 1);
        std::fs::write(&path, text).unwrap();
        let out = train(&path, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{to}");
        assert!(
            err.contains(named) && err.contains("bad.toml"),
            "{to}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // A student tokenizer that is not the teacher's cannot be distilled with KL.
    let path = config(&f, "kl", "");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("loss = \"auto\"", "loss = \"kl\"");
    std::fs::write(&path, text).unwrap();
    let out = train(&path, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("teachers[0].loss = \"kl\""), "{err}");
    // A JSON line without the text field names the file and line.
    std::fs::write(&f.data, "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n").unwrap();
    let path = config(&f, "data", "");
    let out = train(&path, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("train.jsonl:2") && err.contains("text"),
        "{err}"
    );
    // The failed run leaves no temporary file: the cache is only ever half written under one.
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(temporary_files(&f.dir.0.join("data")), Vec::<String>::new());
}

/// Files under `dir` (recursively) whose names mark them temporary.
fn temporary_files(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(temporary_files(&path));
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains(".partial") || name.contains(".tmp") {
            found.push(path.display().to_string());
        }
    }
    found
}

/// Replaces one field of a model directory's `config.json`.
fn set_config_field(model: &std::path::Path, key: &str, value: serde_json::Value) {
    let path = model.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config[key] = value;
    std::fs::write(&path, config.to_string()).unwrap();
}

#[test]
fn sizes_and_stops_a_run_cannot_take_are_named_errors() {
    let f = fixture("sizes");
    let refused = |name: &str, extra: &[&str], expected: &[&str]| {
        let out = train(&config(&f, name, ""), extra);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{err}");
        for part in expected {
            assert!(err.contains(part), "{part:?} not in: {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    };
    // context_length = 24 for a student trained on 16 positions.
    set_config_field(&f.student, "max_position_embeddings", 16.into());
    refused(
        "short-student",
        &[],
        &[
            "training.context_length = 24",
            "max_position_embeddings = 16",
        ],
    );
    set_config_field(&f.student, "max_position_embeddings", 131072.into());
    // The digit-splitting teacher needs more positions for the same rows than it has.
    set_config_field(&f.teacher, "max_position_embeddings", 20.into());
    refused(
        "short-teacher",
        &[],
        &[
            "teacher digits: a packed row holds",
            "max_position_embeddings = 20",
        ],
    );
    set_config_field(&f.teacher, "max_position_embeddings", 131072.into());
    // A stop before any step, or at a step a resumed run has passed.
    refused("zero", &["--stop-after", "0"], &["--stop-after 0"]);
    ok(train(&config(&f, "resumed", ""), &["--stop-after", "4"]));
    refused(
        "resumed",
        &["--resume", "--stop-after", "2"],
        &["--stop-after 2: the run resumed at step 4"],
    );
    assert!(f.dir.0.join("resumed/checkpoints/step-00000004").exists());
}

/// The real pipeline at full vocabulary widths: Llama-3.2's tokenizer for the student, Qwen3's
/// (151,936 rows) and Phi-4-mini's for two teachers, tiny random models, `auto` losses.
#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn real_tokenizers_llama_student_qwen3_and_phi4_teachers() {
    let f = fixture("real");
    let model = |name: &str, tokenizer: &str, vocab: usize, seed: u64| {
        crate::fixture::real_tokenizer_model(&f, name, tokenizer, vocab, seed)
    };
    let student = model("llama", "llama-3.2", 128_256, 1);
    let qwen = model("qwen3", "qwen3", 151_936, 2);
    let phi = model("phi4", "phi-4-mini", 200_064, 3);
    let path = f.dir.0.join("real.toml");
    std::fs::write(
        &path,
        format!(
            r#"
output_dir = "{out}"
[student]
model = "{student}"
[[teachers]]
model = "{qwen}"
[[teachers]]
model = "{phi}"
alpha = 0.5
[data]
path = "{data}"
[training]
steps = 2
batch_size = 2
micro_batch = 1
context_length = 48
[loss]
top_k = 64
"#,
            out = f.dir.0.join("run").display(),
            student = student.display(),
            qwen = qwen.display(),
            phi = phi.display(),
            data = f.data.display(),
        ),
    )
    .unwrap();
    let log = ok(train(&path, &[]));
    eprintln!("{log}");
    // Numerals: Llama-3 packs up to 3 digits, Qwen3 splits them → P-KL.
    assert!(log.contains("teacher qwen3: auto → Pkl"), "{log}");
    let metrics = std::fs::read_to_string(f.dir.0.join("run/metrics.csv")).unwrap();
    assert_eq!(metrics.lines().count(), 3, "{metrics}");
    assert!(metrics
        .lines()
        .next()
        .unwrap()
        .contains("loss_qwen3,alpha_qwen3,loss_phi4"));
    let saved =
        Transformer::<NdArray>::load(&f.dir.0.join("run/student"), &Default::default()).unwrap();
    assert_eq!(saved.architecture.vocab_size, 128_256);
}

/// `checkpoint.hf` writes the student as a Hugging Face directory into every checkpoint (under
/// its manifest), and `xtoken export` writes any checkpoint's student afterwards.
#[test]
fn checkpoints_open_as_hugging_face_directories() {
    use burn::tensor::{Int, Tensor};
    use xtoken_models::CausalLm;
    let f = fixture("export");
    std::fs::write(
        f.student.join("generation_config.json"),
        "{\"do_sample\": false}",
    )
    .unwrap();
    let path = config(&f, "run", "hf = true");
    ok(train(&path, &[]));
    let run = f.dir.0.join("run");
    let step = |n: u64| run.join(format!("checkpoints/step-{n:08}"));
    for n in [4, 6] {
        for file in [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "generation_config.json",
        ] {
            assert!(step(n).join("hf").join(file).exists(), "step {n}: {file}");
        }
    }
    let bytes = |p: std::path::PathBuf| std::fs::read(p).unwrap();
    assert_eq!(
        bytes(step(6).join("hf/model.safetensors")),
        bytes(run.join("student/model.safetensors")),
        "the last checkpoint's export is the final student"
    );

    let out = f.dir.0.join("exported-4");
    let exported = xtoken(&[
        "export",
        "--checkpoint",
        step(4).to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let log = ok(exported);
    assert!(log.contains("step 4"), "{log}");
    assert_eq!(
        bytes(out.join("model.safetensors")),
        bytes(step(4).join("hf/model.safetensors"))
    );
    assert!(out.join("generation_config.json").exists() && out.join("tokenizer.json").exists());
    // It loads, and is the step-4 student: its logits differ from the final one's.
    let device = Default::default();
    let ids = Tensor::<NdArray, 2, Int>::from_ints([[1, 40, 41, 42, 7]], &device);
    let logits = |dir: &std::path::Path| {
        let model = Transformer::<NdArray>::load(dir, &device).unwrap();
        let logits = model.forward(ids.clone(), None).unwrap();
        logits.into_data().to_vec::<f32>().unwrap()
    };
    let (at_4, at_6) = (logits(&out), logits(&run.join("student")));
    assert_eq!(at_4, logits(&step(4).join("hf")));
    assert!(at_4.iter().zip(&at_6).any(|(a, b)| (a - b).abs() > 1e-4));

    // A damaged checkpoint is not exported; an export never replaces its checkpoint.
    flip_a_bit(&step(4).join("student.bin"));
    let damaged = xtoken(&[
        "export",
        "--checkpoint",
        step(4).to_str().unwrap(),
        "--out",
        f.dir.0.join("exported-damaged").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&damaged.stderr).into_owned();
    assert!(
        !damaged.status.success() && err.contains("student.bin does not match"),
        "{err}"
    );
    let into_itself = xtoken(&[
        "export",
        "--checkpoint",
        step(6).to_str().unwrap(),
        "--out",
        step(6).to_str().unwrap(),
    ]);
    assert!(!into_itself.status.success());
    assert!(step(6).join("manifest.json").exists());
}
