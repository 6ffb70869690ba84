//! What the newer families add beyond their logits: decoding through the key/value cache
//! (whose sliding-window layers keep only the keys a later query sees) equals the full forward
//! pass at every position, for rows left-padded by different amounts; the cache of a
//! sliding-window model stays bounded; a saved model loads back with the same architecture and
//! logits; and configurations xtoken cannot run are refused by field.

use crate::support::fixture;
use burn::backend::NdArray;
use burn::tensor::{Int, Tensor};
use xtoken_models::{HfConfig, KvCache, SaveDtype, Transformer};

type B = NdArray;

fn load(case: &str) -> Transformer<B> {
    Transformer::<B>::load(&fixture(case), &Default::default()).unwrap()
}

fn values(t: Tensor<B, 3>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

/// Row `r`'s ids: 21 tokens for row 0, 14 for row 1 (left-padded by 7).
fn row(r: usize) -> Vec<i64> {
    let len = if r == 0 { 21 } else { 14 };
    (0..len)
        .map(|i| ((i * 37 + r * 11 + 5) % 127) as i64)
        .collect()
}

#[test]
fn the_cache_decodes_as_the_full_pass_past_the_window() {
    let device = Default::default();
    for case in ["mistral", "gemma2", "gemma3", "qwen2"] {
        let model = load(case);
        let hidden = model.architecture.hidden_size;
        let starts = vec![0, 7];
        let mut cache = KvCache::new(starts.clone());
        // Slot s of row r holds row(r)[s − start] (0 in the padding).
        let slot = |r: usize, s: usize| match s.checked_sub(starts[r]) {
            Some(i) => row(r)[i],
            None => 0,
        };
        let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(), Vec::new()];
        let mut fed = 0;
        for step in [10usize, 1, 1, 3, 1, 1, 1, 1, 1, 1] {
            let ids: Vec<i64> = (0..2)
                .flat_map(|r| (fed..fed + step).map(move |s| (r, s)))
                .map(|(r, s)| slot(r, s))
                .collect();
            let ids = Tensor::<B, 2, Int>::from_data(
                burn::tensor::TensorData::new(ids, [2, step]),
                &device,
            );
            let out = values(model.forward_cached(ids, &mut cache).unwrap());
            for (r, rows) in got.iter_mut().enumerate() {
                for i in 0..step {
                    let at = (r * step + i) * hidden;
                    if fed + i >= starts[r] {
                        rows.push(out[at..at + hidden].to_vec());
                    }
                }
            }
            fed += step;
        }
        assert_eq!(fed, 21);
        for (r, rows) in got.iter().enumerate() {
            let ids = Tensor::<B, 2, Int>::from_data(
                burn::tensor::TensorData::new(row(r), [1, row(r).len()]),
                &device,
            );
            let full = values(model.hidden_states(ids, None).unwrap());
            assert_eq!(rows.len() * hidden, full.len(), "{case} row {r}");
            let ours: Vec<f32> = rows.concat();
            let worst = xtoken_testkit::max_abs_diff(case, &ours, &full);
            assert!(
                worst <= 1e-4,
                "{case} row {r}: cached vs full max |Δ| {worst:.2e}"
            );
        }
    }
}

#[test]
fn a_sliding_window_bounds_the_cache_estimate() {
    let mistral = load("mistral").architecture;
    let gemma3 = load("gemma3").architecture;
    let per_slot = |a: &xtoken_models::Architecture| 2 * a.num_key_value_heads * a.head_dim * 4;
    // Mistral: every layer keeps window − 1 = 7 slots however long the text.
    assert_eq!(
        mistral.kv_cache_bytes(1, 1000, 4),
        (2 * 7 * per_slot(&mistral)) as u64
    );
    // Gemma-3: two sliding layers of 7 slots, one global layer of all 1000.
    assert_eq!(
        gemma3.kv_cache_bytes(1, 1000, 4),
        ((2 * 7 + 1000) * per_slot(&gemma3)) as u64
    );
    assert_eq!(
        gemma3.kv_cache_bytes(1, 5, 4),
        (3 * 5 * per_slot(&gemma3)) as u64
    );
}

#[test]
fn a_saved_model_of_each_family_loads_back_alike() {
    let dir = std::env::temp_dir().join(format!("xtoken-families-{}", std::process::id()));
    for case in [
        "qwen2",
        "qwen3-window",
        "mistral",
        "gemma2",
        "gemma3",
        "gemma3-saved",
    ] {
        let model = load(case);
        let out = dir.join(case);
        model.save(&out, SaveDtype::F32).unwrap();
        let back = Transformer::<B>::load(&out, &Default::default()).unwrap();
        assert_eq!(back.architecture, model.architecture, "{case}");
        let worst = crate::support::worst_difference(&back, case);
        assert!(
            worst <= 1e-4,
            "{case} saved and loaded: max |Δ| {worst:.2e}"
        );
        // A model made without a config.json writes one of its family's own.
        let mut bare = model.clone();
        bare.hf_config = None;
        let out = dir.join(format!("{case}-bare"));
        bare.save(&out, SaveDtype::F32).unwrap();
        let config = HfConfig::read(&out).unwrap();
        assert_eq!(
            config.architecture, model.architecture,
            "{case} from to_hf_json"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A field changed in a fixture's config.json, parsed.
fn parse_with(case: &str, key: &str, value: serde_json::Value) -> String {
    let path = fixture(case).join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json[key] = value;
    match HfConfig::parse(&json.to_string(), &path) {
        Ok(_) => "accepted".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn configurations_xtoken_cannot_run_are_named() {
    let refused = [
        ("gemma2", "hidden_activation", serde_json::json!("gelu")),
        (
            "gemma3",
            "use_bidirectional_attention",
            serde_json::json!(true),
        ),
        (
            "gemma3",
            "layer_types",
            serde_json::json!(["sliding_attention", "chunked_attention", "full_attention"]),
        ),
        (
            "gemma3",
            "layer_types",
            serde_json::json!(["sliding_attention"]),
        ),
        ("gemma2", "attn_logit_softcapping", serde_json::json!(-1.0)),
        ("gemma3", "model_type", serde_json::json!("gemma3")),
        ("mistral", "hidden_act", serde_json::json!("gelu")),
        ("qwen2", "model_type", serde_json::json!("olmo2")),
    ];
    for (case, key, value) in refused {
        let error = parse_with(case, key, value.clone());
        let named = if key == "model_type" && value == "olmo2" {
            "olmo2"
        } else {
            key
        };
        assert!(error.contains(named), "{case}: {key} = {value}: {error}");
    }
    // Gemma-2's soft-caps set to null turn them off, as transformers reads them.
    assert_eq!(
        parse_with("gemma2", "attn_logit_softcapping", serde_json::Value::Null),
        "accepted"
    );
}
