//! Stored teacher targets (`xtoken teach`, `teachers[].targets`): a run that reads them trains
//! exactly as the online teacher does at f32, one store serves students of other tokenizers,
//! and what does not fit the run is refused before step 1.

use std::path::{Path, PathBuf};

use crate::fixture::{fixture, metrics_without_timings, ok, train, xtoken, Fixture};

/// A one-teacher run of `loss` on the fixture: one document per row, each within a row and a
/// window, so that the online teacher reads each document alone as a stored pass does.
fn run_config(f: &Fixture, out: &str, teacher: &str, extra: &str) -> PathBuf {
    let text = format!(
        r#"
output_dir = "{out}"
seed = 5
[student]
model = "{student}"
[[teachers]]
name = "digits"
{teacher}
[data]
path = "{data}"
packing = "document"
[training]
steps = 3
batch_size = 2
micro_batch = 1
context_length = 96
warmup = 0.3
[loss]
top_k = 16
[checkpoint]
every = 100
[teach]
top_k = 16
shard_documents = 16
{extra}
"#,
        out = f.dir.0.join(out).display(),
        student = f.student.display(),
        data = f.data.display(),
    );
    let path = f.dir.0.join(format!("{out}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn teach(config: &Path, out: &Path) -> String {
    ok(xtoken(&[
        "teach",
        "--config",
        config.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]))
}

/// Per loss: the run from f32 stored targets ends with the online run's metrics and weights,
/// bit for bit. KL needs a teacher of the student's tokenizer: the student's own initial
/// weights are one.
#[test]
fn stored_targets_at_f32_train_exactly_as_the_online_teacher() {
    let f = fixture("stored-exact");
    let online_teacher = |model: &Path, loss: &str| {
        format!(
            "model = \"{}\"\nloss = \"{loss}\"\ndtype = \"f32\"",
            model.display()
        )
    };
    for (loss, loss_extra) in [
        ("pkl", ""),
        ("hkl", ""),
        ("gold", ""),
        ("uld", ""),
        ("kl", ""),
        ("pkl", "weighting = \"neg_entropy\""),
    ] {
        let (model, store) = match loss {
            "kl" => (&f.student, f.dir.0.join("store-same-tokenizer")),
            _ => (&f.teacher, f.dir.0.join("store")),
        };
        // `[loss]` appears once in the configuration: the extra key goes into it.
        let with_loss_extra = |config: &Path| {
            let text = std::fs::read_to_string(config).unwrap().replace(
                "[loss]\ntop_k = 16",
                &format!("[loss]\ntop_k = 16\n{loss_extra}"),
            );
            std::fs::write(config, text).unwrap();
        };
        let online = run_config(
            &f,
            &format!("online-{loss}"),
            &online_teacher(model, loss),
            "",
        );
        with_loss_extra(&online);
        ok(train(&online, &[]));
        if !store.join("digits/manifest.json").exists() {
            let log = teach(&online, &store);
            assert!(log.contains("teacher digits"), "{log}");
        }
        let stored_teacher = format!(
            "targets = \"{}\"\nloss = \"{loss}\"",
            store.join("digits").display()
        );
        let stored = run_config(&f, &format!("stored-{loss}"), &stored_teacher, "");
        with_loss_extra(&stored);
        let log = ok(train(&stored, &[]));
        assert!(log.contains("stored targets"), "{log}");
        let (a, b) = (
            f.dir.0.join(format!("online-{loss}")),
            f.dir.0.join(format!("stored-{loss}")),
        );
        assert_eq!(
            metrics_without_timings(&a),
            metrics_without_timings(&b),
            "{loss} {loss_extra}: the metrics differ"
        );
        assert!(
            std::fs::read(a.join("student/model.safetensors")).unwrap()
                == std::fs::read(b.join("student/model.safetensors")).unwrap(),
            "{loss} {loss_extra}: the trained students differ"
        );
        for run in [&a, &b] {
            std::fs::remove_dir_all(run).unwrap();
        }
    }
}

/// bf16 and 8-bit stores train within their rounding of the f32 store's losses, a packed one
/// exactly as the compact one (they code the same values, the ids each way exactly); a smaller
/// K than stored reads the best entries.
#[test]
fn rounded_stores_train_close_to_the_exact_one() {
    let f = fixture("stored-rounded");
    let teacher = format!(
        "model = \"{}\"\nloss = \"pkl\"\ndtype = \"f32\"",
        f.teacher.display()
    );
    let mut losses = Vec::new();
    for dtype in ["f32", "bf16", "q8", "compact", "packed"] {
        let config = run_config(
            &f,
            &format!("teach-{dtype}"),
            &teacher,
            &format!("dtype = \"{dtype}\""),
        );
        let store = f.dir.0.join(format!("store-{dtype}"));
        teach(&config, &store);
        let stored = format!(
            "targets = \"{}\"\nloss = \"pkl\"",
            store.join("digits").display()
        );
        let run = run_config(&f, &format!("run-{dtype}"), &stored, "");
        ok(train(&run, &["--stop-after", "1"]));
        let kd = crate::fixture::columns(&f.dir.0.join(format!("run-{dtype}")), &["kd"]);
        losses.push(kd[0][0]);
    }
    // Each stored value is within 2⁻⁸ relative (bf16) or half a step of 1/255 of the kept
    // range (8-bit); the first step's KD, a mean of KL terms over those values, moves by less
    // than that bound times its own size plus the range (here below 0.1 in log-space).
    // The compact layout's values err by at most 0.0005 in the head (within 4 nats of the
    // largest), where the mass is, and 0.066 of the rest of the range below.
    let (exact, bf16, q8, compact) = (losses[0], losses[1], losses[2], losses[3]);
    assert_eq!(losses[4].to_bits(), compact.to_bits(), "{losses:?}");
    assert!(
        (bf16 - exact).abs() <= exact.abs() * 0.02 + 1e-3,
        "{losses:?}"
    );
    assert!((q8 - exact).abs() <= exact.abs() * 0.1 + 1e-2, "{losses:?}");
    assert!(
        (compact - exact).abs() <= exact.abs() * 0.1 + 1e-2,
        "{losses:?}"
    );
    compact_confidence_is_kept_only_when_asked(&f, &teacher);
}

/// A compact store keeps the confidence terms only with `teach.confidence`: without them a run
/// with adaptive weighting is refused by name before step 1, with them it trains.
fn compact_confidence_is_kept_only_when_asked(f: &Fixture, teacher: &str) {
    let adaptive = |t: String| t.replace("[loss]\n", "[loss]\nweighting = \"neg_ce\"\n");
    let without = f.dir.0.join("store-compact").join("digits");
    let stored = format!("targets = \"{}\"\nloss = \"pkl\"", without.display());
    refused_before_step_1(
        f,
        ("adaptive", &stored),
        &adaptive,
        "teach.confidence = true",
    );
    let config = run_config(
        f,
        "teach-compact-confidence",
        teacher,
        "dtype = \"compact\"\nconfidence = true",
    );
    let store = f.dir.0.join("store-compact-confidence");
    teach(&config, &store);
    let stored = format!(
        "targets = \"{}\"\nloss = \"pkl\"",
        store.join("digits").display()
    );
    let run = run_config(f, "run-adaptive", &stored, "");
    std::fs::write(&run, adaptive(std::fs::read_to_string(&run).unwrap())).unwrap();
    ok(train(&run, &["--stop-after", "1"]));
}

/// One stored pass of a teacher serves two students of different tokenizers.
#[test]
fn one_store_trains_students_of_two_tokenizers() {
    let f = fixture("stored-two");
    let teacher = format!("model = \"{}\"\nloss = \"gold\"", f.teacher.display());
    let store = f.dir.0.join("store");
    teach(&run_config(&f, "teach", &teacher, ""), &store);
    let stored = format!(
        "targets = \"{}\"\nloss = \"auto\"",
        store.join("digits").display()
    );
    // The fixture's student packs digit pairs; its twin… shares it, so a byte-level student
    // (the teacher's own tokenizer family) is the second.
    let second = crate::fixture::model_dir(&f.dir.0.join("bytes-student"), false, 9);
    for (name, student) in [("pairs", &f.student), ("bytes", &second)] {
        let config = run_config(&f, name, &stored, "");
        let text = std::fs::read_to_string(&config).unwrap().replace(
            &f.student.display().to_string(),
            &student.display().to_string(),
        );
        std::fs::write(&config, text).unwrap();
        ok(train(&config, &[]));
        let rows = crate::fixture::columns(&f.dir.0.join(name), &["loss_digits"]);
        assert_eq!(rows.len(), 3);
        assert!(
            rows.iter().all(|r| r[0].is_finite() && r[0] > 0.0),
            "{name}: {rows:?}"
        );
    }
}

/// Real tokenizers: a Qwen3-tokenized teacher stored once trains a Llama-3.2 and a GPT-2
/// student.
#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn one_qwen3_store_trains_llama_and_gpt2_students() {
    let f = fixture("stored-real");
    let model = |name: &str, tokenizer: &str, vocab: usize, seed: u64| {
        crate::fixture::real_tokenizer_model(&f, name, tokenizer, vocab, seed)
    };
    let qwen = model("qwen3", "qwen3", 151_936, 2);
    let store = f.dir.0.join("store");
    let teacher = format!("model = \"{}\"", qwen.display());
    let teach_config = run_config(&f, "teach", &teacher, "");
    let text = std::fs::read_to_string(&teach_config)
        .unwrap()
        .replace("top_k = 16\nshard_documents", "top_k = 64\nshard_documents")
        .replace("name = \"digits\"", "name = \"qwen3\"");
    std::fs::write(&teach_config, text).unwrap();
    teach(&teach_config, &store);
    let stored = format!("targets = \"{}\"", store.join("qwen3").display());
    for (name, tokenizer, vocab) in [("llama", "llama-3.2", 128_256), ("gpt2", "gpt2", 50_257)] {
        let student = model(name, tokenizer, vocab, 1);
        let config = run_config(&f, &format!("run-{name}"), &stored, "");
        let text = std::fs::read_to_string(&config)
            .unwrap()
            .replace(
                &f.student.display().to_string(),
                &student.display().to_string(),
            )
            .replace("name = \"digits\"", "name = \"qwen3\"")
            .replace("steps = 3", "steps = 2");
        std::fs::write(&config, text).unwrap();
        let log = ok(train(&config, &[]));
        assert!(log.contains("stored targets"), "{name}: {log}");
        let rows = crate::fixture::columns(&f.dir.0.join(format!("run-{name}")), &["loss_qwen3"]);
        assert!(rows.iter().all(|r| r[0].is_finite()), "{name}: {rows:?}");
    }
}

/// The run `name` of the teacher `stored`, its configuration rewritten by `edit`: `train` and
/// `train --check` both end with exit 1 naming `needle`, and nothing trains.
fn refused_before_step_1(
    f: &Fixture,
    (name, stored): (&str, &str),
    edit: &dyn Fn(String) -> String,
    needle: &str,
) {
    let config = run_config(f, name, stored, "");
    let text = edit(std::fs::read_to_string(&config).unwrap());
    std::fs::write(&config, text).unwrap();
    for extra in [&[][..], &["--check"][..]] {
        let out = train(&config, extra);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{name} {extra:?}: {err}");
        assert!(err.contains(needle), "{name} {extra:?}: {err}");
    }
    assert!(!f.dir.0.join(name).join("metrics.csv").exists());
}

/// Other data, a larger top-K than stored, another temperature and a damaged shard are named
/// errors before step 1; so are a missing store and `model` with `targets`.
#[test]
fn stores_that_do_not_fit_the_run_are_refused() {
    let f = fixture("stored-refused");
    let teacher = format!("model = \"{}\"\nloss = \"pkl\"", f.teacher.display());
    let store = f.dir.0.join("store");
    teach(&run_config(&f, "teach", &teacher, ""), &store);
    let digits = store.join("digits");
    let stored = format!("targets = \"{}\"\nloss = \"pkl\"", digits.display());
    let refused = |name: &str, edit: &dyn Fn(String) -> String, needle: &str| {
        refused_before_step_1(&f, (name, &stored), edit, needle);
    };
    refused(
        "k",
        &|t| t.replace("[loss]\ntop_k = 16", "[loss]\ntop_k = 32"),
        "lower loss.top_k",
    );
    refused(
        "tau",
        &|t| {
            t.replace(
                "[loss]\ntop_k = 16",
                "[loss]\ntop_k = 16\ntemperature = 2.0",
            )
        },
        "temperature",
    );
    let other = f.dir.0.join("other.jsonl");
    std::fs::write(&other, "{\"text\": \"Bob has 3 pears.\"}\n").unwrap();
    refused(
        "data",
        &|t| t.replace(&f.data.display().to_string(), &other.display().to_string()),
        "other data",
    );
    refused(
        "both",
        &|t| {
            t.replace(
                "targets = ",
                &format!("model = \"{}\"\ntargets = ", f.teacher.display()),
            )
        },
        "not several",
    );
    // One flipped byte in a shard.
    let shard = std::fs::read_dir(digits.join("shards"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    refused("damaged", &|t| t, "damaged shard");
}

/// A killed pass keeps its finished pieces; running it again completes the store without
/// rewriting them, and a store of other settings is never mixed into.
#[test]
fn teach_resumes_and_refuses_to_mix_settings() {
    let f = fixture("stored-resume");
    let teacher = format!("model = \"{}\"", f.teacher.display());
    let config = run_config(&f, "teach", &teacher, "");
    let store = f.dir.0.join("store");
    teach(&config, &store);
    let shards = store.join("digits/shards");
    let mut pieces: Vec<PathBuf> = std::fs::read_dir(&shards)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    pieces.sort();
    assert!(pieces.len() >= 3, "{pieces:?}");
    let first = std::fs::metadata(&pieces[0]).unwrap().modified().unwrap();
    let last = pieces.pop().unwrap();
    let whole = std::fs::read(&last).unwrap();
    std::fs::remove_file(&last).unwrap();
    let log = teach(&config, &store);
    assert!(log.contains("pieces already in place"), "{log}");
    assert_eq!(
        std::fs::read(&last).unwrap(),
        whole,
        "the redone piece differs"
    );
    assert_eq!(
        std::fs::metadata(&pieces[0]).unwrap().modified().unwrap(),
        first
    );
    // Other settings into the same store.
    let other = run_config(&f, "teach-q8", &teacher, "dtype = \"q8\"");
    let out = xtoken(&[
        "teach",
        "--config",
        other.to_str().unwrap(),
        "--out",
        store.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("other settings (dtype)"),
        "{err}"
    );
    // The data as an output.
    let out = xtoken(&[
        "teach",
        "--config",
        config.to_str().unwrap(),
        "--out",
        f.dir.0.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("refusing to write over an input"),
        "{err}"
    );
}

/// A store's manifest cannot lie: one edited value (a temperature turned from 1 into 3, to
/// match a run at 3) fails its checksum, and a manifest rewritten whole with another top-K is
/// caught by the shards' own headers; both before step 1, in `train` and `--check` alike.
#[test]
fn a_manifest_that_lies_is_refused() {
    let f = fixture("stored-lies");
    let teacher = format!("model = \"{}\"\nloss = \"pkl\"", f.teacher.display());
    let store = f.dir.0.join("store");
    teach(&run_config(&f, "teach", &teacher, ""), &store);
    let digits = store.join("digits");
    let manifest = digits.join("manifest.json");
    let original = std::fs::read_to_string(&manifest).unwrap();
    let stored = format!("targets = \"{}\"\nloss = \"pkl\"", digits.display());
    let refused = |name: &str, loss: &str, needle: &str| {
        let edit = |t: String| t.replace("[loss]\ntop_k = 16", loss);
        refused_before_step_1(&f, (name, &stored), &edit, needle);
    };
    assert!(original.contains("\"temperature\": 1.0"), "{original}");
    std::fs::write(
        &manifest,
        original.replace("\"temperature\": 1.0", "\"temperature\": 3.0"),
    )
    .unwrap();
    refused(
        "tau",
        "[loss]\ntop_k = 16\ntemperature = 3.0",
        "its checksum does not match its content",
    );
    std::fs::write(&manifest, &original).unwrap();
    let mut lying = xtoken_train::targets::Manifest::read(&digits).unwrap();
    lying.top_k = 32;
    lying.write(&digits).unwrap();
    refused(
        "k",
        "[loss]\ntop_k = 32",
        "the shard holds top_k 16 (the manifest: 32)",
    );
    let mut lying = xtoken_train::targets::Manifest::read(&digits).unwrap();
    lying.top_k = 16;
    lying.temperature = 3.0;
    lying.write(&digits).unwrap();
    refused(
        "tau-whole",
        "[loss]\ntop_k = 16\ntemperature = 3.0",
        "temperature 1 (the manifest: 3)",
    );
}

/// The data is the same data by content: touched, or copied elsewhere, it is served; other data
/// is refused unless `--allow-data-change`, which logs what changed.
#[test]
fn a_store_knows_its_data_by_content() {
    let f = fixture("stored-content");
    let teacher = format!("model = \"{}\"\nloss = \"pkl\"", f.teacher.display());
    let store = f.dir.0.join("store");
    let teach_config = run_config(&f, "teach", &teacher, "");
    teach(&teach_config, &store);
    let digits = store.join("digits");
    let stored = format!("targets = \"{}\"\nloss = \"pkl\"", digits.display());
    // Touched: the same bytes, a later time.
    let bytes = std::fs::read(&f.data).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&f.data, &bytes).unwrap();
    ok(train(&run_config(&f, "touched", &stored, ""), &[]));
    // A copy at another path.
    let copy = f.dir.0.join("copy.jsonl");
    std::fs::copy(&f.data, &copy).unwrap();
    let config = run_config(&f, "copied", &stored, "");
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(&f.data.display().to_string(), &copy.display().to_string());
    std::fs::write(&config, text).unwrap();
    ok(train(&config, &["--check"]));
    // Other bytes of the same size: refused, then let through by --allow-data-change.
    let mut other = bytes.clone();
    let at = other.iter().position(|&b| b == b'7').unwrap();
    other[at] = b'8';
    std::fs::write(&copy, &other).unwrap();
    let out = train(&config, &["--check"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success() && err.contains("other data") && err.contains("--allow-data-change"),
        "{err}"
    );
    let err = ok(train(&config, &["--check", "--allow-data-change"]));
    assert!(
        err.contains("--allow-data-change:") && err.contains("copy.jsonl changed"),
        "{err}"
    );
    // A teach pass over the touched data goes on with the store it wrote.
    let log = teach(&teach_config, &store);
    assert!(log.contains("pieces already in place"), "{log}");
}

/// A teacher whose model has fewer positions than `teach.window` is read in windows of its
/// length, which is said; a temporary piece a killed pass left is removed by the next pass.
#[test]
fn teach_fits_the_window_to_the_model_and_clears_what_a_kill_left() {
    let f = fixture("stored-window");
    let short = f.dir.0.join("short");
    std::fs::create_dir_all(&short).unwrap();
    for entry in std::fs::read_dir(&f.teacher).unwrap() {
        let from = entry.unwrap().path();
        std::fs::copy(&from, short.join(from.file_name().unwrap())).unwrap();
    }
    let config_path = short.join("config.json");
    let mut hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    hf["max_position_embeddings"] = 16.into();
    std::fs::write(&config_path, hf.to_string()).unwrap();
    let teacher = format!("model = \"{}\"", short.display());
    let config = run_config(&f, "teach", &teacher, "");
    let store = f.dir.0.join("store");
    let log = teach(&config, &store);
    assert!(
        log.contains("teach.window = 4096 is longer than the model's max_position_embeddings (16)"),
        "{log}"
    );
    let manifest = xtoken_train::targets::Manifest::read(&store.join("digits")).unwrap();
    assert_eq!(manifest.window, 16);
    let shards = store.join("digits/shards");
    let mut pieces: Vec<PathBuf> = std::fs::read_dir(&shards)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    pieces.sort();
    let last = pieces.pop().unwrap();
    let left = shards.join(format!(
        "{}.xtoken-tmp-4000000",
        last.file_name().unwrap().to_string_lossy()
    ));
    std::fs::rename(&last, &left).unwrap();
    teach(&config, &store);
    assert!(last.is_file() && !left.exists());
}
