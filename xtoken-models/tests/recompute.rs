//! Activation checkpointing per decoder layer gives the gradients of the plain backward pass.

mod support;

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};
use support::fixture;
use xtoken_models::{ModelError, Tokens, Transformer};

type B = Autodiff<NdArray>;

/// Every parameter's gradient, flattened, in visiting order (`None` where it has none).
fn all_grads(model: &Transformer<B>, grads: &GradientsParams) -> Vec<Option<Vec<f32>>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Option<Vec<f32>>>);
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = self.0.get::<NdArray, D>(param.id);
            self.1
                .push(grad.map(|g| g.into_data().into_vec::<f32>().unwrap()));
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

fn step(case: &str, padded: bool, checkpointing: bool) -> (f32, Vec<Option<Vec<f32>>>) {
    let device = Default::default();
    let model = Transformer::<B>::load(&fixture(case), &device).unwrap();
    let (ids, weights) = support::training_batch::<B>(&device);
    let padding = padded.then(|| {
        Tensor::<B, 2, Int>::from_ints(
            [
                [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
            ],
            &device,
        )
        .equal_elem(1)
    });
    let backward = model
        .forward_backward(
            &Tokens::from_tensors(ids, padding).unwrap(),
            checkpointing,
            |model, hidden| {
                let logits = model.logits_from_hidden(hidden);
                Ok::<_, ModelError>((log_softmax(logits, 2) * weights).sum().neg() / 24.0)
            },
        )
        .unwrap();
    let loss = backward.loss.into_scalar();
    (loss, all_grads(&model, &backward.model))
}

fn compare(case: &str, padded: bool) {
    let (plain_loss, plain) = step(case, padded, false);
    let (loss, checkpointed) = step(case, padded, true);
    assert!(
        (plain_loss - loss).abs() <= 1e-5 * plain_loss.abs(),
        "{case}: {plain_loss} vs {loss}"
    );
    assert_eq!(plain.len(), checkpointed.len());
    for (i, (a, b)) in plain.iter().zip(&checkpointed).enumerate() {
        let (a, b) = (
            a.as_ref().unwrap(),
            b.as_ref()
                .unwrap_or_else(|| panic!("{case}: parameter {i} lost its gradient")),
        );
        let what = format!("{case}: parameter {i} gradient");
        let scale = xtoken_testkit::max_abs(&what, a).max(1e-6);
        let worst = xtoken_testkit::max_abs_diff(&what, a, b);
        assert!(
            worst <= 1e-4 * scale,
            "{case}: parameter {i}: max |Δ| {worst} (scale {scale})"
        );
    }
}

#[test]
fn llama_untied_with_padding() {
    compare("llama3", true);
}

#[test]
fn qwen3_tied_head_and_embedding_gradients_add_up() {
    compare("qwen3", false);
}

#[test]
fn phi3_fused_projections_and_sliding_window() {
    compare("phi3", false);
}
