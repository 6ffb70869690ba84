//! Mixed precision on burn-flex (the CPU backend with bf16): f32 parameters computing in bf16
//! keep HF's logits within bf16's rounding, and their gradients come back in f32.

use crate::support;

use crate::support::{fixture, max_logit, worst_difference};
use burn::backend::Autodiff;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::{DType, Int, Tensor};
use burn_flex::Flex;
use xtoken_models::{CausalLm, ModelError, Tokens, Transformer};

type Ad = Autodiff<Flex>;

#[test]
fn bf16_compute_keeps_hf_parity_within_bf16_rounding() {
    for case in [
        "llama3",
        "llama3-tied-bf16",
        "qwen3",
        "phi3",
        "qwen2",
        "mistral",
        "gemma2",
        "gemma3",
    ] {
        let model = Transformer::<Flex>::load(&fixture(case), &Default::default()).unwrap();
        assert_eq!(model.compute_dtype(), DType::F32);
        let exact = worst_difference(&model, case) as f64;
        assert!(exact <= 1e-4, "{case} in f32 on flex: max |Δ| {exact:.2e}");

        let model = model.with_compute_dtype(DType::BF16);
        let ids = Tensor::<Flex, 2, Int>::from_ints([[1, 2, 3]], &Default::default());
        let logits = CausalLm::forward(&model, ids, None).unwrap();
        assert_eq!(logits.dtype(), DType::BF16, "{case}");
        let mixed = worst_difference(&model, case) as f64;
        let bound = xtoken_testkit::compute_rounding_bound(
            xtoken_testkit::BF16_UNIT_ROUNDOFF,
            max_logit(case),
        );
        eprintln!("{case}: f32 {exact:.2e}, bf16 compute {mixed:.2e}, bound {bound:.2e}");
        assert!(
            mixed > exact && mixed <= bound,
            "{case}: max |Δ| {mixed:.2e} in bf16 compute (f32: {exact:.2e}, bound {bound:.2e})"
        );
    }
}

/// Every parameter's gradient in visiting order, with its dtype.
fn all_grads(model: &Transformer<Ad>, grads: &GradientsParams) -> Vec<(DType, Vec<f32>)> {
    struct Collect<'a>(&'a GradientsParams, Vec<(DType, Vec<f32>)>);
    impl ModuleVisitor<Ad> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
            let grad = self
                .0
                .get::<Flex, D>(param.id)
                .expect("every parameter has a gradient");
            let dtype = grad.dtype();
            let values = grad.into_data().convert::<f32>().into_vec::<f32>().unwrap();
            self.1.push((dtype, values));
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// One forward and backward of a fixed weighted log-likelihood.
fn gradients(case: &str, compute: DType, checkpointing: bool) -> (f32, Vec<(DType, Vec<f32>)>) {
    let device = Default::default();
    let model = Transformer::<Ad>::load(&fixture(case), &device)
        .unwrap()
        .with_compute_dtype(compute);
    let (ids, weights) = support::training_batch::<Ad>(&device);
    let backward = model
        .forward_backward(
            &Tokens::from_tensors(ids, None).unwrap(),
            checkpointing,
            |model, hidden| {
                let logits = model.logits_from_hidden(hidden).cast(DType::F32);
                Ok::<_, ModelError>((log_softmax(logits, 2) * weights).sum().neg() / 24.0)
            },
        )
        .unwrap();
    let loss = backward.loss.into_scalar();
    (loss, all_grads(&model, &backward.model))
}

/// Gradients in bf16 compute reach every f32 weight in f32, within bf16's rounding of the f32
/// computation's. The backward pass doubles the forward's matmuls (each product's two
/// gradients are matmuls whose results are rounded again), so the bound doubles
/// `compute_rounding_bound`'s count, relative to each tensor's largest gradient.
#[test]
fn bf16_compute_gradients_reach_the_f32_weights() {
    let u = xtoken_testkit::BF16_UNIT_ROUNDOFF;
    for case in ["llama3", "qwen3", "phi3"] {
        let (exact_loss, exact) = gradients(case, DType::F32, false);
        for checkpointing in [false, true] {
            let (loss, mixed) = gradients(case, DType::BF16, checkpointing);
            let at = format!("{case} (checkpointing {checkpointing})");
            assert!(
                (loss - exact_loss).abs() as f64 <= 57.0 * u * exact_loss.abs() as f64,
                "{at}: loss {loss} against {exact_loss} in f32"
            );
            assert_eq!(mixed.len(), exact.len());
            let mut moved = 0.0f64;
            for (i, ((dtype, got), (_, want))) in mixed.iter().zip(&exact).enumerate() {
                let what = format!("{at}: parameter {i}'s gradient");
                assert_eq!(*dtype, DType::F32, "{what}");
                let scale = xtoken_testkit::max_abs(&what, want).max(1e-6);
                let worst = xtoken_testkit::max_abs_diff(&what, got, want);
                assert!(
                    worst <= 2.0 * 57.0 * u * scale,
                    "{what}: max |Δ| {worst:.2e} of {scale:.2e}"
                );
                moved = moved.max(worst / scale);
            }
            assert!(
                moved > u / 4.0,
                "{at}: the gradients are f32's ({moved:.2e})"
            );
        }
    }
}
