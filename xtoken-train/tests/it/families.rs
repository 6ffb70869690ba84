//! Distillation between the newer model families, end to end on tiny bodies: a Gemma-3-shaped
//! student from a Qwen2.5-shaped teacher, and a Mistral-shaped student from a Gemma-2-shaped
//! teacher (soft-capped scores and logits). Each trains (on contexts longer than the sliding
//! windows), its checkpoint exports to a directory that loads back as the same family with the
//! same logits, and the student evaluates (log-likelihood and generation through the key/value
//! cache).

use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use burn::tensor::{DType, Int, Tensor};
use serde_json::{json, Value};
use xtoken_models::{CausalLm, HfConfig, SaveDtype, Transformer};

use crate::fixture::{columns, fixture, ok, tokenizer_json, train, xtoken};

/// The fields every tiny body shares.
fn body(vocab: usize, extra: Value) -> Value {
    let mut config = json!({
        "vocab_size": vocab,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": null,
        "eos_token_id": null,
    });
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    config
}

fn qwen25(vocab: usize) -> Value {
    body(
        vocab,
        json!({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
               "rope_theta": 1000000.0, "tie_word_embeddings": true,
               "use_sliding_window": false, "max_window_layers": 3}),
    )
}

fn gemma3(vocab: usize) -> Value {
    body(
        vocab,
        json!({"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
               "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 8,
               "sliding_window_pattern": 3, "rope_theta": 1000000.0,
               "rope_local_base_freq": 10000.0, "hidden_activation": "gelu_pytorch_tanh"}),
    )
}

fn gemma2(vocab: usize) -> Value {
    body(
        vocab,
        json!({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"],
               "head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 8,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "hidden_activation": "gelu_pytorch_tanh"}),
    )
}

fn mistral(vocab: usize) -> Value {
    body(
        vocab,
        json!({"model_type": "mistral", "architectures": ["MistralForCausalLM"],
               "sliding_window": 8, "rope_theta": 1000000.0, "tie_word_embeddings": false}),
    )
}

/// A model directory of `config`'s family: the fixture's tokenizer (digit pairs for a student)
/// and random weights of the architecture the config describes.
fn family_dir(dir: &Path, config: Value, digit_pairs: bool, seed: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json(digit_pairs)).unwrap();
    let parsed = HfConfig::parse(&config.to_string(), &dir.join("config.json")).unwrap();
    let mut model =
        Transformer::<NdArray>::random(&parsed.architecture, seed, DType::F32, &Default::default())
            .unwrap();
    model.hf_config = Some(config);
    model.save(dir, SaveDtype::F32).unwrap();
    dir.to_path_buf()
}

fn logits(dir: &Path) -> Vec<f32> {
    let device = Default::default();
    let ids = Tensor::<NdArray, 2, Int>::from_ints(
        [[1, 40, 41, 42, 7, 9, 11, 60, 61, 62, 5, 3]],
        &device,
    );
    let model = Transformer::<NdArray>::load(dir, &device).unwrap();
    let logits = model.forward(ids, None).unwrap();
    logits.into_data().to_vec::<f32>().unwrap()
}

/// Trains `student` from `teacher`, exports step 2, and evaluates the final student.
fn distill(tag: &str, student: Value, teacher: Value, family: &str) {
    let f = fixture(tag);
    let student = family_dir(&f.dir.0.join("student-family"), student, true, 1);
    let teacher = family_dir(&f.dir.0.join("teacher-family"), teacher, false, 2);
    let run = f.dir.0.join("run");
    let config = f.dir.0.join("run.toml");
    let text = format!(
        r#"output_dir = "{run}"
seed = 3

[student]
model = "{student}"

[[teachers]]
name = "teacher"
model = "{teacher}"
loss = "auto"

[data]
path = "{data}"

[training]
steps = 4
batch_size = 4
micro_batch = 2
context_length = 24

[loss]
top_k = 16

[checkpoint]
every = 2
keep = 2
hf = true
"#,
        run = run.display(),
        student = student.display(),
        teacher = teacher.display(),
        data = f.data.display(),
    );
    std::fs::write(&config, text).unwrap();
    ok(train(&config, &[]));
    let losses = columns(&run, &["loss"]);
    assert_eq!(losses.len(), 4, "{tag}");
    assert!(
        losses.iter().all(|l| l[0].is_finite() && l[0] > 0.0),
        "{tag}: {losses:?}"
    );

    // The step-2 checkpoint exports as a directory of the student's family, with its logits.
    let step = run.join("checkpoints/step-00000002");
    let out = f.dir.0.join("exported");
    ok(xtoken(&[
        "export",
        "--checkpoint",
        step.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]));
    let exported = HfConfig::read(&out).unwrap();
    assert_eq!(exported.architecture.family.model_type(), family, "{tag}");
    assert_eq!(
        exported.architecture,
        HfConfig::read(&student).unwrap().architecture,
        "{tag}: the export keeps the student's architecture"
    );
    assert_eq!(logits(&out), logits(&step.join("hf")), "{tag}");
    assert_ne!(logits(&out), logits(&student), "{tag}: the student trained");

    // The trained student evaluates: a log-likelihood task and a generation task.
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/harness/data");
    let results = f.dir.0.join("eval");
    let log = ok(xtoken(&[
        "eval",
        "--model",
        run.join("student").to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--tasks",
        "hellaswag,gsm8k",
        "--batch",
        "2",
        "--out",
        results.to_str().unwrap(),
    ]));
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("results.json")).unwrap())
            .unwrap();
    let tasks: Vec<(&str, u64)> = json["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["task"].as_str().unwrap(),
                t["metrics"][0]["n"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tasks,
        [("hellaswag", 3), ("gsm8k", 3)],
        "{tag}: {json}\n{log}"
    );
}

#[test]
fn a_gemma3_student_distills_from_a_qwen25_teacher() {
    distill("gemma3-from-qwen2", gemma3(356), qwen25(256), "gemma3_text");
}

#[test]
fn a_mistral_student_distills_from_a_gemma2_teacher() {
    distill("mistral-from-gemma2", mistral(356), gemma2(256), "mistral");
}
