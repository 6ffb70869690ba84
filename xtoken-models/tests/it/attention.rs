//! The training pass's tiled attention: the losses and gradients of burn's attention, computed
//! in f64, within f32 rounding and no further from them than burn's own f32 pass, for every
//! mask the models make (causal, padded keys, a sliding window, grouped KV heads, Qwen3's
//! per-head norms); and no `[batch, heads, T, T]` tensor anywhere in the pass.
//!
//! The shape test records every tensor the CPU backend makes, process-wide, so it runs as the
//! only test of a process of its own.

use crate::support::{fixture, training_step, Train};
use burn::tensor::backend::Backend;
use burn::tensor::Element;
use xtoken_models::{AttentionKernel, LoadOptions, Transformer};
use xtoken_testkit::backend::{Counted, Recording};

/// A fixture model in `B`'s default float dtype running `kernel`, its sliding window set to
/// `window` when given.
fn model<B: Backend>(case: &str, kernel: AttentionKernel, window: Option<usize>) -> Transformer<B> {
    let options = LoadOptions {
        dtype: B::FloatElem::dtype(),
    };
    let mut model = Transformer::<B>::load_with(&fixture(case), options, &Default::default())
        .unwrap()
        .with_attention(kernel);
    if window.is_some() {
        model.architecture.sliding_window = window;
    }
    model
}

type Step = (f32, Vec<Option<Vec<f32>>>);

/// `ours` is within f32 rounding of the f64 `reference` (the loss to 1e-6, each gradient to
/// 5e-4 of its largest entry) and no further from it than `burn`'s f32 step (twice its error,
/// plus 1e-6).
fn assert_as_close(what: &str, reference: &Step, burn: &Step, ours: &Step) {
    let loss_error = (ours.0 - reference.0).abs();
    assert!(
        loss_error <= 1e-6 * reference.0.abs(),
        "{what}: loss {} vs {}",
        ours.0,
        reference.0
    );
    let grads = reference.1.iter().zip(&burn.1).zip(&ours.1);
    for (i, ((reference, burn), ours)) in grads.enumerate() {
        let name = format!("{what}: parameter {i}");
        let reference = reference.as_ref().unwrap();
        let (burn, ours) = (burn.as_ref().unwrap(), ours.as_ref().unwrap());
        let scale = xtoken_testkit::max_abs(&name, reference).max(1e-6);
        let error = xtoken_testkit::max_abs_diff(&name, reference, ours) / scale;
        let burn_error = xtoken_testkit::max_abs_diff(&name, reference, burn) / scale;
        assert!(
            error <= 5e-4 && error <= 2.0 * burn_error + 1e-6,
            "{name}: relative error {error:.2e}, burn's {burn_error:.2e}"
        );
    }
}

fn compare(case: &str, padded: bool, window: Option<usize>) {
    let what = format!("{case} (padded: {padded}, window: {window:?})");
    let reference = training_step(
        &model::<Train<f64>>(case, AttentionKernel::Burn, window),
        padded,
        false,
    );
    let burn = training_step(
        &model::<Train>(case, AttentionKernel::Burn, window),
        padded,
        false,
    );
    let tiled = model::<Train>(case, AttentionKernel::Tiled, window);
    assert!(tiled.tiled_attention());
    for checkpointing in [false, true] {
        let ours = training_step(&tiled, padded, checkpointing);
        assert_as_close(
            &format!("{what}, checkpointing: {checkpointing}"),
            &reference,
            &burn,
            &ours,
        );
    }
}

#[test]
fn the_tiled_attention_trains_as_burns_does() {
    compare("llama3", false, None);
    compare("llama3", true, None);
    compare("qwen3", true, None);
    compare("phi3", true, Some(5));
    compare("phi3", false, Some(3));
    compare("gemma2", true, None);
    compare("gemma3", true, None);
    compare("qwen2", true, None);
    compare("mistral", false, None);
}

/// Whether a fixture model on `B` runs the tiled attention by default.
fn tiled_by_default<B: xtoken_kernels::XTokenBackend>() -> bool {
    let model = Transformer::<B>::load(&fixture("llama3"), &Default::default());
    model.unwrap().tiled_attention()
}

#[test]
fn the_cpu_backends_run_the_tiled_attention_by_default_where_it_is_faster() {
    type Flex = burn_flex::Flex;
    // Training passes on both CPU backends.
    assert!(tiled_by_default::<Train>());
    assert!(tiled_by_default::<burn::backend::Autodiff<Flex>>());
    // Inference: ndarray's attention builds the scores; burn-flex's forward is fused.
    assert!(tiled_by_default::<burn::backend::NdArray>());
    assert!(!tiled_by_default::<Flex>());
}

/// The shapes of the tensors a training step makes on ndarray (`Counted` records them): the
/// fixtures' batch is 2 × 12 tokens.
fn shapes_of_a_step(kernel: AttentionKernel) -> Vec<Vec<usize>> {
    type Seen = burn::backend::Autodiff<Counted<burn::backend::NdArray>>;
    let model = model::<Seen>("phi3", kernel, Some(5));
    let recording = Recording::start();
    let _ = training_step(&model, true, false);
    recording.finish()
}

#[test]
fn a_training_pass_builds_no_scores() {
    xtoken_testkit::process::alone(
        module_path!(),
        "a_training_pass_builds_no_scores",
        a_training_pass_builds_no_scores_alone,
    );
}

/// A recording sees every thread's tensors: no other test may run beside this one.
fn a_training_pass_builds_no_scores_alone() {
    let scores = |shape: &Vec<usize>| matches!(shape.as_slice(), [2, _, 12, 12]);
    let tiled = shapes_of_a_step(AttentionKernel::Tiled);
    assert!(tiled.len() > 100, "{} tensors recorded", tiled.len());
    let found: Vec<_> = tiled.iter().filter(|s| scores(s)).collect();
    assert!(
        found.is_empty(),
        "T × T tensors in the tiled pass: {found:?}"
    );
    // burn's attention makes them: the recording sees what it must not find.
    let burn = shapes_of_a_step(AttentionKernel::Burn);
    assert!(
        burn.iter().any(|s| s == &[2, 4, 12, 12]),
        "burn's pass made none"
    );
}
