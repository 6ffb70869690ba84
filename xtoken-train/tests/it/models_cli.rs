//! `xtoken logits` and `xtoken convert` on the HF parity fixtures of xtoken-models.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

fn xtoken(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtoken"))
        .args(args)
        .output()
        .expect("run xtoken")
}

fn logits_command(model: &Path, input: &Path, out: &Path) -> Output {
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let (model, input, out) = (path(model), path(input), path(out));
    xtoken(&[
        "logits", "--model", &model, "--input", &input, "--out", &out,
    ])
}

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../xtoken-models/tests/fixtures/parity")
        .join(case)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtoken-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Writes the fixture's `<input>.input_ids` / `.attention_mask` as an `xtoken logits` input and
/// returns HF's logits for it.
fn input_file(case: &str, input: &str, path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(fixture(case).join("parity.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: HashMap<String, TensorView> = HashMap::new();
    for (name, key) in [
        ("input_ids", "input_ids"),
        ("attention_mask", "attention_mask"),
    ] {
        if let Ok(view) = file.tensor(&format!("{input}.{key}")) {
            tensors.insert(name.into(), view);
        }
    }
    safetensors::serialize_to_file(tensors, None, path).unwrap();
    f32s(file.tensor(&format!("{input}.logits")).unwrap().data())
}

fn read_logits(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let view = file.tensor("logits").unwrap();
    assert_eq!(view.dtype(), Dtype::F32);
    (view.shape().to_vec(), f32s(view.data()))
}

#[test]
fn logits_match_hf_with_padding() {
    let dir = scratch("logits");
    let input = dir.join("ids.safetensors");
    let out = dir.join("logits.safetensors");
    let expected = input_file("qwen3", "padded", &input);
    let model = fixture("qwen3");
    let run = logits_command(&model, &input, &out);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (shape, logits) = read_logits(&out);
    assert_eq!(shape, vec![2, 24, 128]);
    assert!(xtoken_testkit::max_abs_diff("logits", &logits, &expected) <= 1e-4);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn convert_to_bf16_then_logits_stay_close() {
    let dir = scratch("convert");
    let converted = dir.join("phi3-bf16");
    let model = fixture("phi3");
    let run = xtoken(&[
        "convert",
        "--model",
        model.to_str().unwrap(),
        "--out",
        converted.to_str().unwrap(),
        "--dtype",
        "bf16",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let config = std::fs::read_to_string(converted.join("config.json")).unwrap();
    assert!(config.contains("\"torch_dtype\": \"bfloat16\""), "{config}");
    let weights = std::fs::read(converted.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&weights).unwrap();
    assert!(file.tensors().iter().all(|(_, v)| v.dtype() == Dtype::BF16));
    // The fixture's parity file is not a model file, so it is copied along.
    assert!(converted.join("parity.safetensors").exists());

    let input = dir.join("ids.safetensors");
    let out = dir.join("logits.safetensors");
    let expected = input_file("phi3", "long", &input);
    let run = logits_command(&converted, &input, &out);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let worst = xtoken_testkit::max_abs_diff("logits", &read_logits(&out).1, &expected);
    let bound = xtoken_testkit::rounding_bound(
        xtoken_testkit::BF16_UNIT_ROUNDOFF,
        xtoken_testkit::max_abs("HF logits", &expected),
    );
    assert!(
        worst > 0.0 && worst <= bound,
        "bf16 moved the logits by {worst} (bound {bound})"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn logits_errors_name_the_token_the_tensor_and_the_file() {
    let dir = scratch("errors");
    let input = dir.join("ids.safetensors");
    let out = dir.join("logits.safetensors");
    let model = fixture("llama3");
    let run_with = |ids: &[i64]| {
        let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = TensorView::new(Dtype::I64, vec![1, ids.len()], &bytes).unwrap();
        safetensors::serialize_to_file([("input_ids", view)], None, &input).unwrap();
        logits_command(&model, &input, &out)
    };
    let run = run_with(&[5, 6, 128, 7]);
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("token 128 at sequence 0, position 2") && err.contains("128"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let view = TensorView::new(Dtype::I64, vec![1, 1], &[0u8; 8]).unwrap();
    safetensors::serialize_to_file([("ids", view)], None, &input).unwrap();
    let run = logits_command(&model, &input, &out);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && err.contains("input_ids"), "{err}");

    let view = TensorView::new(Dtype::I64, vec![1, 1], &[0u8; 8]).unwrap();
    safetensors::serialize_to_file([("input_ids", view)], None, &input).unwrap();
    let run = xtoken(&[
        "logits",
        "--model",
        "/no/such/model",
        "--input",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && err.contains("/no/such/model/config.json"),
        "{err}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Writes `input_ids` (and an `attention_mask`) of shape `[batch, len]` as a logits input.
fn write_input(path: &Path, shape: [usize; 2], ids: &[i64], mask: Option<&[i64]>) {
    let bytes =
        |values: &[i64]| -> Vec<u8> { values.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let (id_bytes, mask_bytes) = (bytes(ids), mask.map(bytes));
    let mut views = vec![(
        "input_ids",
        TensorView::new(Dtype::I64, shape.to_vec(), &id_bytes).unwrap(),
    )];
    if let Some(m) = &mask_bytes {
        views.push((
            "attention_mask",
            TensorView::new(Dtype::I64, shape.to_vec(), m).unwrap(),
        ));
    }
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// A copy of the llama3 fixture with `config.json` fields replaced.
fn edited_fixture(dir: &Path, fields: serde_json::Value) -> PathBuf {
    let model = dir.join("edited");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(
        fixture("llama3").join("model.safetensors"),
        model.join("model.safetensors"),
    )
    .unwrap();
    let text = std::fs::read_to_string(fixture("llama3").join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (key, value) in fields.as_object().unwrap() {
        config[key] = value.clone();
    }
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    model
}

/// Sizes the model or the machine cannot take, masks that are not 0/1 right padding, and a
/// config that describes fewer layers than the weights hold: each a named error with exit code
/// 1 and nothing written, never an abort.
#[test]
fn logits_refuses_what_the_model_or_the_machine_cannot_take() {
    let dir = scratch("sizes");
    let (input, out) = (dir.join("ids.safetensors"), dir.join("logits.safetensors"));
    let refused = |model: &Path, expected: &[&str]| {
        let run = logits_command(model, &input, &out);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{err}");
        for part in expected {
            assert!(err.contains(part), "{part:?} not in: {err}");
        }
        assert!(!err.contains("panicked") && !out.exists(), "{err}");
    };
    let llama = fixture("llama3");
    // No ids at all.
    write_input(&input, [1, 0], &[], None);
    refused(&llama, &["`input_ids` has shape [1, 0]: no ids to run"]);
    // 600 positions for max_position_embeddings = 512.
    write_input(&input, [1, 600], &[5; 600], None);
    refused(&llama, &["600 positions", "max_position_embeddings = 512"]);
    // 60,000 positions a config allows, but not this machine's memory.
    let long = edited_fixture(&dir, serde_json::json!({"max_position_embeddings": 131072}));
    write_input(&input, [1, 60_000], &[5; 60_000], None);
    refused(
        &long,
        &["logits over input_ids [1, 60000] needs about", "GB"],
    );
    // Masks: a 2, and a token after padding.
    write_input(&input, [1, 4], &[5, 6, 7, 8], Some(&[1, 1, 2, 0]));
    refused(
        &llama,
        &["attention_mask[0][2] = 2", "1 (token) or 0 (padding)"],
    );
    write_input(&input, [2, 3], &[5; 6], Some(&[1, 1, 1, 1, 0, 1]));
    refused(
        &llama,
        &["sequence 1 has a token at position 2 after padding at position 1"],
    );
    // The fixture's weights have 2 layers; a config of 1 layer would ignore one.
    std::fs::remove_dir_all(&long).unwrap();
    let shallow = edited_fixture(&dir, serde_json::json!({"num_hidden_layers": 1}));
    write_input(&input, [1, 4], &[5, 6, 7, 8], None);
    refused(&shallow, &["num_hidden_layers", "tensors of layer 1"]);
    std::fs::remove_dir_all(dir).unwrap();
}

/// `logits --out` naming the input and `convert --out` naming the model directory under another
/// spelling are refused before anything is written: the inputs keep their bytes.
#[test]
fn outputs_never_replace_inputs() {
    let dir = scratch("aliases");
    let model = dir.join("m");
    std::fs::create_dir_all(&model).unwrap();
    for name in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("llama3").join(name), model.join(name)).unwrap();
    }
    let input = dir.join("x.safetensors");
    input_file("llama3", "padded", &input);
    let before = std::fs::read(&input).unwrap();
    let out = logits_command(&model, &input, &input);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to write over an input"), "{err}");
    assert_eq!(std::fs::read(&input).unwrap(), before);

    let weights = std::fs::read(model.join("model.safetensors")).unwrap();
    let spelled = format!("{}/./", model.display());
    let out = xtoken(&[
        "convert",
        "--model",
        model.to_str().unwrap(),
        "--out",
        &spelled,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to write over an input"), "{err}");
    assert_eq!(
        std::fs::read(model.join("model.safetensors")).unwrap(),
        weights
    );
    std::fs::remove_dir_all(&dir).ok();
}
