//! The AdamW update of `XTokenBackend::xt_adamw`: its portable composition gives burn's `AdamW`
//! bitwise (with the clipping scale applied to the gradient first), the host backends' one-pass
//! update gives the composition's bits, and all follow an f64 reference written from AdamW's
//! definition.

use crate::support;

use burn::backend::NdArray;
use burn::optim::{AdamWConfig, SimpleOptimizer};
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::Tensor;
use burn_flex::Flex;
use xtoken_kernels::adamw::{composed, AdamWStep};
use xtoken_kernels::XTokenBackend;

type B = NdArray;

/// The same three updates through burn's `AdamW`, the gradient scaled as clipping does.
fn burns_adamw() -> Vec<[Vec<f32>; 3]> {
    let device = Default::default();
    let tensor = |seed| support::logits::<B>(seed, [1, 5, 7], &device).reshape([5, 7]);
    let host = |t: &Tensor<B, 2>| t.to_data().to_vec::<f32>().expect("f32");
    let mut param = tensor(1);
    let mut state = None;
    let mut seen = Vec::new();
    for time in 1..=3usize {
        let decay = if time == 2 { 0.0 } else { 0.1 };
        let adamw = AdamWConfig::new()
            .with_beta_1(0.9)
            .with_beta_2(0.95)
            .with_epsilon(1e-8)
            .with_weight_decay(decay)
            .build();
        let mut grad = tensor(10 + time as u32);
        if time == 1 {
            grad = grad.mul_scalar(0.37);
        }
        let (p, s) = SimpleOptimizer::<B>::step(&adamw, 1e-3 * time as f64, param, grad, state);
        let s = s.expect("AdamW keeps a state");
        seen.push(
            [
                p.clone(),
                s.momentum.moment_1.clone(),
                s.momentum.moment_2.clone(),
            ]
            .map(|t| host(&t)),
        );
        param = p;
        state = Some(s);
    }
    seen
}

/// Each step's parameter and moments are the same bits.
fn assert_bitwise(ours: &[[Vec<f32>; 3]], theirs: &[[Vec<f32>; 3]], who: &str) {
    assert_eq!(ours.len(), theirs.len());
    for (step, (a, b)) in ours.iter().zip(theirs).enumerate() {
        for (what, (x, y)) in ["parameter", "m", "v"].iter().zip(a.iter().zip(b)) {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(x), bits(y), "{who}, step {}: {what} differs", step + 1);
        }
    }
}

#[test]
fn the_composed_update_is_burns_adamw_bitwise() {
    let ours = support::adamw_updates_by::<B>(&Default::default(), composed::<B>);
    assert_bitwise(&ours, &burns_adamw(), "composed ops");
}

/// ndarray and burn-flex update f32 parameters in one pass on the host: the same bits as the
/// composition (burn's `AdamW`), on both backends.
#[test]
fn the_host_update_is_the_composition_bitwise() {
    let burns = burns_adamw();
    assert_bitwise(
        &support::adamw_updates::<B>(&Default::default()),
        &burns,
        "ndarray's host update",
    );
    let flex = support::adamw_updates::<Flex>(&Default::default());
    assert_bitwise(&flex, &burns, "burn-flex's host update");
    let composed_on_flex = support::adamw_updates_by::<Flex>(&Default::default(), composed::<Flex>);
    assert_bitwise(
        &flex,
        &composed_on_flex,
        "burn-flex's host update against its composition",
    );
}

/// A tensor that owns its buffer is updated in place (no new allocation of the parameter's
/// size); one shared with another owner, or a view, is copied first and the other owner's
/// values are left as they were.
#[test]
fn the_host_update_writes_in_place_only_what_it_owns() {
    let step = AdamWStep {
        lr: 1e-2,
        beta_1: 0.9,
        beta_2: 0.95,
        epsilon: 1e-8,
        weight_decay: 0.1,
        time: 1,
        grad_scale: 0.5,
    };
    let device = Default::default();
    let tensor = |seed| {
        support::logits::<Flex>(seed, [1, 64, 33], &device)
            .reshape([64, 33])
            .into_primitive()
            .tensor()
    };
    let (param, grad) = (tensor(1), tensor(2));
    let address = param.bytes().as_ptr();
    let first = Flex::xt_adamw(param, grad.clone(), None, &step);
    assert_eq!(
        first.param.bytes().as_ptr(),
        address,
        "an owned parameter is updated in place"
    );
    let moments = first.moments.first.bytes().as_ptr();
    let kept = first.param.clone();
    let before = support::floats::<Flex, 2>(kept.clone());
    let second_step = AdamWStep { time: 2, ..step };
    let second = Flex::xt_adamw(first.param, grad.clone(), Some(first.moments), &second_step);
    assert_eq!(
        second.moments.first.bytes().as_ptr(),
        moments,
        "owned moments in place"
    );
    assert_ne!(
        second.param.bytes().as_ptr(),
        address,
        "a shared parameter is copied"
    );
    assert_eq!(
        support::floats::<Flex, 2>(kept),
        before,
        "the other owner's values"
    );
    // A transposed view: its values, not its buffer's order, are updated.
    let view = Flex::float_swap_dims(tensor(3), 0, 1);
    let grad_t = Flex::float_swap_dims(grad, 0, 1);
    let viewed = Flex::xt_adamw(view.clone(), grad_t.clone(), None, &step);
    let plain = composed::<Flex>(view, grad_t, None, &step);
    assert_eq!(
        support::floats::<Flex, 2>(viewed.param),
        support::floats::<Flex, 2>(plain.param)
    );
}

#[test]
fn the_update_follows_an_f64_reference() {
    let device = Default::default();
    let data = |seed| {
        support::logits::<B>(seed, [1, 5, 7], &device)
            .to_data()
            .to_vec::<f32>()
            .expect("f32")
    };
    let mut p: Vec<f64> = data(1).iter().map(|&x| f64::from(x)).collect();
    let (mut m, mut v) = (vec![0.0f64; p.len()], vec![0.0f64; p.len()]);
    let ours = support::adamw_updates::<B>(&device);
    for (time, seen) in (1..=3i32).zip(&ours) {
        let (lr, scale) = (1e-3 * f64::from(time), if time == 1 { 0.37 } else { 1.0 });
        let decay = if time == 2 { 0.0 } else { 0.1 };
        let (b1, b2) = (0.9f64, 0.95f64);
        for (i, g) in data(10 + time as u32).iter().enumerate() {
            let g = f64::from(*g) * scale;
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let update =
                (m[i] / (1.0 - b1.powi(time))) / ((v[i] / (1.0 - b2.powi(time))).sqrt() + 1e-8);
            p[i] = p[i] * (1.0 - lr * decay) - lr * update;
        }
        for (what, (got, want)) in ["parameter", "m", "v"]
            .iter()
            .zip(seen.iter().zip([&p, &m, &v]))
        {
            for (i, (&x, &y)) in got.iter().zip(want.iter()).enumerate() {
                // f32 rounding of a few operations on values of order 5 (the parameter) or of
                // their squares (v): a relative bound of 1e-5 with an absolute floor.
                let bound = 1e-5 * y.abs().max(1e-3);
                assert!(
                    (f64::from(x) - y).abs() <= bound,
                    "step {time}: {what}[{i}] = {x}, the f64 reference {y}"
                );
            }
        }
    }
}
