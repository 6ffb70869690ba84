//! Reading the parity fixtures that `fixtures/make_parity.py` writes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Int, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use xtoken_kernels::XTokenBackend;
use xtoken_models::{CausalLm, ModelError, Tokens, Transformer};

pub fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(case)
}

/// One fixture input: ids, optional HF attention mask, HF's logits.
pub struct Expected {
    pub name: String,
    pub ids: TensorData,
    pub mask: Option<TensorData>,
    pub logits: TensorData,
}

fn data(view: &safetensors::tensor::TensorView) -> TensorData {
    let bytes = view.data();
    match view.dtype() {
        Dtype::I64 => TensorData::new(
            bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect::<Vec<_>>(),
            view.shape().to_vec(),
        ),
        Dtype::F32 => TensorData::new(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect::<Vec<_>>(),
            view.shape().to_vec(),
        ),
        other => panic!("fixture dtype {other:?}"),
    }
}

pub fn expected(case: &str) -> Vec<Expected> {
    let bytes = std::fs::read(fixture(case).join("parity.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let tensors: BTreeMap<String, TensorData> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, data(&view)))
        .collect();
    tensors
        .keys()
        .filter_map(|k| k.strip_suffix(".input_ids"))
        .map(|name| Expected {
            name: name.to_string(),
            ids: tensors[&format!("{name}.input_ids")].clone(),
            mask: tensors.get(&format!("{name}.attention_mask")).cloned(),
            logits: tensors[&format!("{name}.logits")].clone(),
        })
        .collect()
}

/// The largest |logit| of HF's over every input of `case`: the scale rounding errors are
/// measured against.
pub fn max_logit(case: &str) -> f64 {
    expected(case)
        .into_iter()
        .map(|input| {
            let logits = input.logits.into_vec::<f32>().unwrap();
            xtoken_testkit::max_abs(&format!("{case}/{} logits", input.name), &logits)
        })
        .fold(0.0, f64::max)
}

/// Max |Δ| between our logits and HF's over every input of `case`, for a loaded `model` on
/// any backend (logits of any float dtype are compared in f32); panics on a logit that is not
/// finite.
pub fn worst_difference<B: XTokenBackend>(model: &Transformer<B>, case: &str) -> f32 {
    let device = model.embed_tokens.weight.device();
    let mut worst = 0.0f32;
    for input in expected(case) {
        let ids = Tensor::<B, 2, Int>::from_data(input.ids.clone(), &device);
        let padding = input
            .mask
            .map(|mask| Tensor::<B, 2, Int>::from_data(mask, &device).equal_elem(0));
        let padding: Option<Tensor<B, 2, Bool>> = padding;
        let logits = model.forward(ids, padding).unwrap();
        assert_eq!(
            logits.dims().to_vec(),
            input.logits.shape.to_vec(),
            "{case}/{}",
            input.name
        );
        let ours = logits
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .unwrap();
        let theirs = input.logits.into_vec::<f32>().unwrap();
        let what = format!("{case}/{} logits", input.name);
        let diff = xtoken_testkit::max_abs_diff(&what, &ours, &theirs) as f32;
        eprintln!(
            "{} {case}/{}: max |Δ| = {diff:.2e}",
            B::name(&device),
            input.name
        );
        worst = worst.max(diff);
    }
    worst
}

/// A fixed two-row training batch for the fixtures' 128-token vocabulary: ids `[2, 12]` and
/// per-position target weights `[2, 12, 128]` for a weighted log-likelihood.
pub fn training_batch<B: Backend>(device: &B::Device) -> (Tensor<B, 2, Int>, Tensor<B, 3>) {
    let ids = Tensor::<B, 2, Int>::from_ints(
        [
            [5, 17, 99, 3, 64, 21, 8, 120, 45, 7, 2, 33],
            [9, 1, 77, 101, 4, 56, 12, 90, 3, 3, 0, 127],
        ],
        device,
    );
    let weights: Vec<f32> = (0..2 * 12 * 128)
        .map(|i| ((i * 7919) % 101) as f32 / 100.0)
        .collect();
    let weights = Tensor::<B, 3>::from_data(TensorData::new(weights, [2, 12, 128]), device);
    (ids, weights)
}

/// The CPU training backend of the gradient tests (`f64`: their reference).
pub type Train<E = f32> = Autodiff<NdArray<E>>;

/// Every parameter's gradient, flattened to f32, in visiting order (`None` where it has none).
pub fn all_grads<B: AutodiffBackend>(
    model: &Transformer<B>,
    grads: &GradientsParams,
) -> Vec<Option<Vec<f32>>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Option<Vec<f32>>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = self.0.get::<B::InnerBackend, D>(param.id);
            let values = |g: Tensor<B::InnerBackend, D>| {
                g.into_data().convert::<f32>().into_vec::<f32>().unwrap()
            };
            self.1.push(grad.map(values));
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// One forward and backward of [`training_batch`]'s weighted log-likelihood, the second row
/// padded after 8 tokens when `padded`: the loss and every parameter's gradient.
pub fn training_step<B>(
    model: &Transformer<B>,
    padded: bool,
    checkpointing: bool,
) -> (f32, Vec<Option<Vec<f32>>>)
where
    B: AutodiffBackend + XTokenBackend,
    B::InnerBackend: XTokenBackend,
{
    let device = model.embed_tokens.weight.device();
    let (ids, weights) = training_batch::<B>(&device);
    let weights = weights.cast(model.embed_tokens.weight.dtype());
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
    // The whole step ran in the parameters' dtype (a reference in f64 stays in f64).
    assert_eq!(backward.loss.dtype(), model.embed_tokens.weight.dtype());
    let loss = backward
        .loss
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap()[0];
    (loss, all_grads(model, &backward.model))
}

/// Asserts two [`training_step`]s agree: the loss within 1e-5 and every gradient within
/// `tolerance` of its largest entry.
pub fn assert_same_step(
    what: &str,
    (loss_a, a): &(f32, Vec<Option<Vec<f32>>>),
    (loss_b, b): &(f32, Vec<Option<Vec<f32>>>),
    tolerance: f64,
) {
    assert!(
        (loss_a - loss_b).abs() <= 1e-5 * loss_a.abs(),
        "{what}: loss {loss_a} vs {loss_b}"
    );
    assert_eq!(a.len(), b.len());
    for (i, (a, b)) in a.iter().zip(b).enumerate() {
        let (a, b) = (
            a.as_ref().unwrap(),
            b.as_ref()
                .unwrap_or_else(|| panic!("{what}: parameter {i} lost its gradient")),
        );
        let name = format!("{what}: parameter {i} gradient");
        let scale = xtoken_testkit::max_abs(&name, a).max(1e-6);
        let worst = xtoken_testkit::max_abs_diff(&name, a, b);
        assert!(
            worst <= tolerance * scale,
            "{what}: parameter {i}: max |Δ| {worst} (scale {scale})"
        );
    }
}
