//! The AdamW update of `XTokenBackend::xt_adamw`: its portable composition gives burn's `AdamW`
//! bitwise (with the clipping scale applied to the gradient first), and both follow an f64
//! reference written from AdamW's definition.

use crate::support;

use burn::backend::NdArray;
use burn::optim::{AdamWConfig, SimpleOptimizer};
use burn::tensor::Tensor;

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

#[test]
fn the_composed_update_is_burns_adamw_bitwise() {
    let ours = support::adamw_updates::<B>(&Default::default());
    let burns = burns_adamw();
    for (step, (a, b)) in ours.iter().zip(&burns).enumerate() {
        for (what, (x, y)) in ["parameter", "m", "v"].iter().zip(a.iter().zip(b)) {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(x), bits(y), "step {}: {what} differs", step + 1);
        }
    }
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
