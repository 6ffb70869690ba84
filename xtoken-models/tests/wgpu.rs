//! The models on a cubecl backend: burn's wgpu (Mesa lavapipe on CPU in CI), where the attention
//! takes burn's causal kernel path and half-precision parameters exist. Run with
//! `--features wgpu`.
#![cfg(feature = "wgpu")]

mod support;

use burn::backend::Wgpu;
use burn::tensor::DType;
use support::{fixture, max_logit, worst_difference};
use xtoken_models::{LoadOptions, Transformer};

type B = Wgpu;

/// Max |Δ| against HF's logits over every input of `case`, with parameters in `dtype`.
fn worst(case: &str, dtype: DType) -> f32 {
    let device = Default::default();
    let model =
        Transformer::<B>::load_with(&fixture(case), LoadOptions { dtype }, &device).unwrap();
    worst_difference(&model, case)
}

#[test]
fn f32_parity_on_wgpu() {
    for case in [
        "llama3",
        "llama3-tied-bf16",
        "qwen3",
        "qwen3-sharded",
        "phi3",
    ] {
        let worst = worst(case, DType::F32);
        assert!(worst <= 1e-4, "{case}: max |Δ| {worst:.2e}");
    }
}

#[test]
fn f16_parameters_on_wgpu_stay_close() {
    for case in ["llama3", "qwen3", "phi3"] {
        let worst = worst(case, DType::F16) as f64;
        let bound =
            xtoken_testkit::rounding_bound(xtoken_testkit::F16_UNIT_ROUNDOFF, max_logit(case));
        assert!(
            worst > 0.0 && worst <= bound,
            "{case}: max |Δ| {worst:.2e} (bound {bound:.2e})"
        );
    }
}
