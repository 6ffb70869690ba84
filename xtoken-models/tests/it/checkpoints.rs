//! Saving and loading HF directories: round trips in f32, bf16 and f16, HF's tensor names and
//! layouts, generated configs, and the errors a broken directory gets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::support::{fixture, max_logit, worst_difference};
use burn::backend::NdArray;
use burn::tensor::{DType, Int, Tensor, TensorData};
use safetensors::SafeTensors;
use xtoken_models::{CausalLm, HfConfig, LoadOptions, ModelError, SaveDtype, Tokens, Transformer};
use xtoken_testkit::backend::{reads, Counted};

type B = NdArray;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtoken-models-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// name → (dtype, shape, bytes) of every tensor in a directory's safetensors files.
fn tensors(dir: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.starts_with("model") || !name.ends_with(".safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        for (tensor, view) in file.tensors() {
            out.insert(
                tensor,
                (
                    format!("{:?}", view.dtype()),
                    view.shape().to_vec(),
                    view.data().to_vec(),
                ),
            );
        }
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

#[test]
fn f32_round_trip_is_byte_identical_to_hf_files_for_every_family() {
    for case in ["llama3", "qwen3", "phi3"] {
        let model = Transformer::<B>::load(&fixture(case), &Default::default()).unwrap();
        let out = scratch(&format!("f32-{case}"));
        model.save(&out, SaveDtype::F32).unwrap();
        assert_eq!(
            tensors(&out),
            tensors(&fixture(case)),
            "{case}: names, shapes or bytes differ"
        );
        let metadata = {
            let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
            let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
            meta.metadata().clone().unwrap()
        };
        assert_eq!(metadata.get("format").map(String::as_str), Some("pt"));
        let reloaded = Transformer::<B>::load(&out, &Default::default()).unwrap();
        assert!(worst_difference(&reloaded, case) <= 1e-4);
        // The saved config keeps the fields we do not interpret.
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["bos_token_id"], 1);
        assert_eq!(config["torch_dtype"], "float32");
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn bf16_file_round_trips_exactly_and_f16_saves_load_back() {
    let model = Transformer::<B>::load(&fixture("llama3-tied-bf16"), &Default::default()).unwrap();
    let out = scratch("bf16");
    model.save(&out, SaveDtype::BF16).unwrap();
    assert_eq!(tensors(&out), tensors(&fixture("llama3-tied-bf16")));
    assert!(
        !tensors(&out).contains_key("lm_head.weight"),
        "a tied head is not written"
    );

    let f16 = scratch("f16");
    model.save(&f16, SaveDtype::F16).unwrap();
    for (name, (dtype, _, _)) in tensors(&f16) {
        assert_eq!(dtype, "F16", "{name}");
    }
    let reloaded = Transformer::<B>::load(&f16, &Default::default()).unwrap();
    // bf16 values have 8 significant bits, f16 has 11: the conversion is exact.
    assert!(worst_difference(&reloaded, "llama3-tied-bf16") <= 1e-4);
    let config = HfConfig::read(&f16).unwrap();
    assert_eq!(config.torch_dtype(), Some("float16"));
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_dir_all(&f16).unwrap();
}

#[test]
fn bf16_save_of_an_f32_model_stays_close() {
    let model = Transformer::<B>::load(&fixture("phi3"), &Default::default()).unwrap();
    let out = scratch("phi3-bf16");
    model.save(&out, SaveDtype::BF16).unwrap();
    // Every weight is the f32 fixture's, rounded to nearest (ties to even): truncation, or a
    // rounding off by one ulp, fails here even where the logits could not tell.
    let (original, saved) = (tensors(&fixture("phi3")), tensors(&out));
    assert_eq!(
        original.keys().collect::<Vec<_>>(),
        saved.keys().collect::<Vec<_>>()
    );
    for (name, (dtype, shape, bytes)) in &original {
        assert_eq!(dtype, "F32", "{name}");
        let want: Vec<u8> = bytes
            .chunks_exact(4)
            .flat_map(|b| {
                xtoken_testkit::bf16_bits(f32::from_le_bytes(b.try_into().unwrap())).to_le_bytes()
            })
            .collect();
        assert_eq!(
            saved[name],
            ("BF16".to_string(), shape.clone(), want),
            "{name}"
        );
    }
    let reloaded = Transformer::<B>::load(&out, &Default::default()).unwrap();
    let worst = worst_difference(&reloaded, "phi3") as f64;
    let bound =
        xtoken_testkit::rounding_bound(xtoken_testkit::BF16_UNIT_ROUNDOFF, max_logit("phi3"));
    assert!(
        worst > 0.0 && worst <= bound,
        "bf16 rounding moved logits by {worst} (bound {bound})"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn random_models_save_a_config_that_parses_back_to_the_same_architecture() {
    for case in ["llama3", "qwen3", "phi3"] {
        let architecture = HfConfig::read(&fixture(case)).unwrap().architecture;
        let device = Default::default();
        let model = Transformer::<B>::random(&architecture, 7, DType::F32, &device).unwrap();
        let out = scratch(&format!("random-{case}"));
        model.save(&out, SaveDtype::F32).unwrap();
        let config = HfConfig::read(&out).unwrap();
        assert_eq!(config.architecture, architecture, "{case}");
        // HF's class defaults for special ids (Phi-3's pad 32000) would not fit this vocabulary,
        // which HF refuses to load; a generated config says "unknown" instead.
        assert!(config.raw["pad_token_id"].is_null() && config.raw["eos_token_id"].is_null());
        let reloaded = Transformer::<B>::load(&out, &device).unwrap();
        let ids = Tensor::<B, 2, Int>::from_ints([[3, 1, 4, 1, 5, 9, 2, 6]], &device);
        let a = model.forward(ids.clone(), None).unwrap().into_data();
        let b = reloaded.forward(ids, None).unwrap().into_data();
        assert_eq!(a, b, "{case}");
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn same_seed_same_model() {
    let architecture = HfConfig::read(&fixture("qwen3")).unwrap().architecture;
    let device = Default::default();
    let a = Transformer::<B>::random(&architecture, 11, DType::F32, &device).unwrap();
    let b = Transformer::<B>::random(&architecture, 11, DType::F32, &device).unwrap();
    let c = Transformer::<B>::random(&architecture, 12, DType::F32, &device).unwrap();
    let weight = |m: &Transformer<B>| m.embed_tokens.weight.val().into_data();
    assert_eq!(weight(&a), weight(&b));
    assert_ne!(weight(&a), weight(&c));
}

/// A copy of the llama3 fixture with `edit` applied to its config, loaded.
fn load_edited(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> (PathBuf, ModelError) {
    let dir = scratch(name);
    copy_dir(&fixture("llama3"), &dir);
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    let error = Transformer::<B>::load(&dir, &Default::default()).unwrap_err();
    (dir, error)
}

fn assert_names(error: &ModelError, parts: &[&str]) {
    let message = error.to_string();
    for part in parts {
        assert!(message.contains(part), "{message:?} should name {part:?}");
    }
}

#[test]
fn config_errors_name_the_field() {
    let (dir, e) = load_edited("unknown-type", |c| c["model_type"] = "gpt2".into());
    assert_names(
        &e,
        &[
            "config.json",
            "\"gpt2\"",
            "llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text",
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();

    let (dir, e) = load_edited("unknown-rope", |c| {
        c["rope_scaling"]["rope_type"] = "yarn".into()
    });
    assert_names(&e, &["config.json", "\"yarn\"", "llama3"]);
    std::fs::remove_dir_all(dir).unwrap();

    let (dir, e) = load_edited("missing-field", |c| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    assert_names(&e, &["config.json", "hidden_size"]);
    std::fs::remove_dir_all(dir).unwrap();

    let (dir, e) = load_edited("rope-field", |c| {
        c["rope_scaling"]
            .as_object_mut()
            .unwrap()
            .remove("low_freq_factor");
    });
    assert_names(&e, &["rope_scaling.low_freq_factor", "missing"]);
    std::fs::remove_dir_all(dir).unwrap();

    let (dir, e) = load_edited("heads", |c| c["num_key_value_heads"] = 3.into());
    assert_names(&e, &["num_key_value_heads", "does not divide"]);
    std::fs::remove_dir_all(dir).unwrap();

    let (dir, e) = load_edited("activation", |c| c["hidden_act"] = "gelu".into());
    assert_names(&e, &["hidden_act", "gelu"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn longrope_factor_count_is_checked() {
    let dir = scratch("longrope");
    copy_dir(&fixture("phi3"), &dir);
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["rope_scaling"]["short_factor"] = serde_json::json!([1.0, 2.0]);
    std::fs::write(&path, config.to_string()).unwrap();
    let e = Transformer::<B>::load(&dir, &Default::default()).unwrap_err();
    assert_names(
        &e,
        &["rope_scaling.short_factor", "has 2 values", "needs 3"],
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn weight_errors_name_the_tensor_or_file() {
    // A shape the config does not imply.
    let (dir, e) = load_edited("shape", |c| c["intermediate_size"] = 48.into());
    assert_names(
        &e,
        &[
            "model.layers.0.mlp.gate_proj.weight",
            "[64, 32]",
            "[48, 32]",
        ],
    );
    std::fs::remove_dir_all(dir).unwrap();

    // A missing tensor: untie a tied model whose file has no lm_head.
    let dir = scratch("missing-tensor");
    copy_dir(&fixture("qwen3"), &dir);
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["tie_word_embeddings"] = false.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let e = Transformer::<B>::load(&dir, &Default::default()).unwrap_err();
    assert!(matches!(e, ModelError::MissingTensor { .. }));
    assert_names(&e, &["lm_head.weight", "missing"]);
    std::fs::remove_dir_all(dir).unwrap();

    // A truncated file.
    let dir = scratch("truncated");
    copy_dir(&fixture("llama3"), &dir);
    let weights = dir.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() - 100]).unwrap();
    let e = Transformer::<B>::load(&dir, &Default::default()).unwrap_err();
    assert_names(&e, &["model.safetensors", "truncated"]);
    // A file cut inside its header.
    std::fs::write(&weights, &bytes[..20]).unwrap();
    let e = Transformer::<B>::load(&dir, &Default::default()).unwrap_err();
    assert_names(&e, &["model.safetensors", "truncated"]);
    // No weights at all.
    std::fs::remove_file(&weights).unwrap();
    let e = Transformer::<B>::load(&dir, &Default::default()).unwrap_err();
    assert_names(&e, &["no model.safetensors"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bf16_parameters_are_refused_where_the_backend_lacks_them() {
    let options = LoadOptions { dtype: DType::BF16 };
    let e =
        Transformer::<B>::load_with(&fixture("llama3"), options, &Default::default()).unwrap_err();
    assert!(matches!(e, ModelError::UnsupportedDtype { .. }), "{e}");
}

/// Ids made on the host are checked there, with the errors the tensor path gives, and the
/// forward pass on them reads nothing back from the device (the test kit's `Counted` backend
/// counts the reads); on tensors the check reads them once.
#[test]
fn tokens_made_on_the_host_are_checked_without_reading_the_device() {
    type B = Counted<NdArray>;
    let device = Default::default();
    let model = Transformer::<B>::load(&fixture("llama3"), &device).unwrap();
    let ids = [5i64, 9, 2, 7, 1, 3];
    let padding = [false, false, false, false, true, true];
    let tokens = Tokens::<B>::from_host(&ids, Some(&padding), [2, 3], &device).unwrap();
    let before = reads();
    let logits = model.forward_of(&tokens).unwrap();
    assert_eq!(reads(), before);
    let on_device = Tensor::<B, 2, Int>::from_data(TensorData::new(ids.to_vec(), [2, 3]), &device);
    let mask =
        Tensor::<B, 2, Int>::from_data(TensorData::new(vec![0, 0, 0, 0, 1, 1], [2, 3]), &device)
            .equal_elem(1);
    let read = model.forward(on_device, Some(mask)).unwrap();
    assert_eq!(reads(), before + 1);
    assert_eq!(logits.into_data(), read.into_data());

    let refused = |ids: &[i64], padding: Option<&[bool]>, dims: [usize; 2]| {
        Tokens::<B>::from_host(ids, padding, dims, &device)
            .and_then(|t| model.forward_of(&t))
            .unwrap_err()
    };
    assert_names(
        &refused(&ids[..5], None, [2, 3]),
        &["input ids", "[2, 3]", "5 values"],
    );
    assert_names(
        &refused(&ids, Some(&padding[..4]), [2, 3]),
        &["padding mask", "[2, 3]", "4 values"],
    );
    let left = [true, false, false, false, false, false];
    assert_names(
        &refused(&ids, Some(&left), [2, 3]),
        &["sequence 0", "position 1", "after padding at position 0"],
    );
    assert_names(
        &refused(&[1, 2, 300, 4, -1, 6], None, [2, 3]),
        &["token -1 at sequence 1, position 1", "vocabulary of 128"],
    );
    assert_names(
        &refused(&[1, 2, 300, 4, 5, 6], None, [2, 3]),
        &["token 300 at sequence 0, position 2", "vocabulary of 128"],
    );
    let long: Vec<i64> = vec![1; 100_000];
    assert_names(&refused(&long, None, [1, 100_000]), &["100000"]);
}

#[test]
fn padding_mask_of_the_wrong_shape_is_refused() {
    let device = Default::default();
    let model = Transformer::<B>::load(&fixture("llama3"), &device).unwrap();
    let ids = Tensor::<B, 2, Int>::from_ints([[1, 2, 3]], &device);
    let padding = Tensor::<B, 2, Int>::from_ints([[0, 0]], &device).equal_elem(1);
    let e = model.forward(ids, Some(padding)).unwrap_err();
    assert_names(&e, &["padding mask", "[1, 3]", "[1, 2]"]);
    let empty = Tensor::<B, 2, Int>::from_data(TensorData::new(Vec::<i64>::new(), [1, 0]), &device);
    let e = model.forward(empty, None).unwrap_err();
    assert_names(&e, &["input ids", "at least one token", "[1, 0]"]);
    let negative = Tensor::<B, 2, Int>::from_ints([[1, 2], [3, -4]], &device);
    let e = model.forward(negative, None).unwrap_err();
    assert_names(
        &e,
        &["token -4 at sequence 1, position 1", "vocabulary of 128"],
    );
}
