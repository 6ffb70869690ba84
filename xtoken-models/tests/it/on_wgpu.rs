//! The models on a cubecl backend: burn's wgpu (Mesa lavapipe on CPU in CI), where inference
//! takes burn's fused attention, a training pass X-Token's attention kernels, and
//! half-precision parameters exist. Run with `--features wgpu`, on the plain `CubeBackend` (burn's
//! `Wgpu` without fusion, which the `fusion` feature of a shared build would turn on).
#![cfg(feature = "wgpu")]

use crate::support::{fixture, max_logit, training_step, worst_difference};
use burn::backend::wgpu::{CubeBackend, WgpuRuntime};
use burn::backend::Autodiff;
use burn::tensor::DType;
use xtoken_models::{AttentionKernel, LoadOptions, Transformer};

type Wgpu = CubeBackend<WgpuRuntime, f32, i32, u32>;
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
        "qwen2",
        "mistral",
        "gemma2",
        "gemma3",
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

/// A fixture model on `Autodiff<Wgpu>` running `kernel`, its sliding window set when given.
fn trained(case: &str, kernel: AttentionKernel, window: Option<usize>) -> Transformer<Autodiff<B>> {
    let device = Default::default();
    let mut model = Transformer::<Autodiff<B>>::load(&fixture(case), &device)
        .unwrap()
        .with_attention(kernel);
    if window.is_some() {
        model.architecture.sliding_window = window;
    }
    model
}

/// A training pass on the device takes the attention kernels (no `T × T` scores), inference
/// burn's fused forward; the kernels' loss and gradients equal those of burn's attention on the
/// same backend within f32 rounding, for every mask the models make.
#[test]
fn a_training_pass_on_wgpu_runs_the_attention_kernels_as_burns_trains() {
    let device = Default::default();
    assert!(trained("llama3", AttentionKernel::Auto, None).tiled_attention());
    assert!(!Transformer::<B>::load(&fixture("llama3"), &device)
        .unwrap()
        .tiled_attention());
    for (case, padded, window) in [
        ("llama3", true, None),
        ("qwen3", true, None),
        ("phi3", true, Some(5)),
        ("phi3", false, Some(3)),
        ("gemma2", true, None),
        ("gemma3", true, None),
        ("qwen2", false, None),
    ] {
        let what = format!("{case} (padded: {padded}, window: {window:?})");
        let burn = training_step(&trained(case, AttentionKernel::Burn, window), padded, false);
        let ours = training_step(&trained(case, AttentionKernel::Auto, window), padded, false);
        assert!(
            (ours.0 - burn.0).abs() <= 1e-5 * burn.0.abs(),
            "{what}: loss {} vs burn's {}",
            ours.0,
            burn.0
        );
        for (i, (a, b)) in ours.1.iter().zip(&burn.1).enumerate() {
            let name = format!("{what}: parameter {i}");
            let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
            let scale = xtoken_testkit::max_abs(&name, b).max(1e-6);
            let error = xtoken_testkit::max_abs_diff(&name, b, a) / scale;
            assert!(error <= 5e-4, "{name}: relative difference {error:.2e}");
        }
    }
}
