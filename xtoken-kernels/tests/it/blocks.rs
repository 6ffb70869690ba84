//! The decoder layer's fused blocks (RMSNorm, rotary embedding, SwiGLU) on the host backends:
//! their values follow f64 references written from the definitions, their gradients those of
//! burn's autodiff through the composed ops, burn-flex and ndarray give the same bits, and a
//! backend without them (or a dtype the host passes do not take) computes the composition.

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{backend::Backend, DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::Flex;
use proptest::prelude::*;
use xtoken_kernels::{blocks, XTokenBackend};

use crate::support::values;

type A = Autodiff<NdArray>;

fn tensor<B: Backend, const D: usize>(v: &[f32], shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape), &Default::default())
}

fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().expect("f32")
}

fn close(what: &str, got: &[f32], want: &[f64], rel: f64) {
    let scale = want.iter().fold(1e-3f64, |m, w| m.max(w.abs()));
    within(what, got, want, rel * scale);
}

fn within(what: &str, got: &[f32], want: &[f64], bound: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= bound,
            "{what}[{i}]: {g}, the reference {w} (bound {bound:e})"
        );
    }
}

fn close32(what: &str, got: &[f32], want: &[f32], rel: f64) {
    let want: Vec<f64> = want.iter().map(|&w| f64::from(w)).collect();
    close(what, got, &want, rel);
}

/// RMSNorm of each row in f64.
fn rms_reference(x: &[f32], gamma: &[f32], eps: f64) -> Vec<f64> {
    let d = gamma.len();
    x.chunks(d)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / d as f64;
            let r = (mean + eps).sqrt();
            row.iter()
                .zip(gamma)
                .map(move |(&v, &g)| f64::from(v) / r * f64::from(g))
        })
        .collect()
}

/// RMSNorm's gradients with respect to `x` and `γ` in f64, given the output's: with
/// `r = sqrt(mean(x²) + ε)` and `g = ∂y · γ`, `∂x = g / r − x · Σ(g·x) / (d · r³)` and
/// `∂γ = Σ_rows ∂y · x / r`.
/// Also the largest `|g| / r`: `∂x` is a difference of two terms of that size (at `d = 1` they
/// cancel to `g/r · ε/(x² + ε)`), so f32's error in it is relative to them, not to `∂x`.
fn rms_grad_reference(x: &[f32], gamma: &[f32], eps: f64, dy: &[f32]) -> (Vec<f64>, Vec<f64>, f64) {
    let d = gamma.len();
    let mut dx = Vec::with_capacity(x.len());
    let mut dgamma = vec![0f64; d];
    let mut terms = 0f64;
    for (row, dy) in x.chunks(d).zip(dy.chunks(d)) {
        let r = (row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / d as f64 + eps).sqrt();
        let g: Vec<f64> = dy
            .iter()
            .zip(gamma)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .collect();
        let dot: f64 = g.iter().zip(row).map(|(a, &v)| a * f64::from(v)).sum();
        for (i, &v) in row.iter().enumerate() {
            terms = terms.max(g[i].abs() / r);
            dx.push(g[i] / r - f64::from(v) * dot / (d as f64 * r.powi(3)));
            dgamma[i] += f64::from(dy[i]) * f64::from(v) / r;
        }
    }
    (dx, dgamma, terms)
}

/// HF's rotation of `[batch, len, heads, head_dim]` in f64.
fn rotary_reference(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    dims: [usize; 4],
    half: usize,
    table_rows: usize,
) -> Vec<f64> {
    let [_, len, heads, d] = dims;
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for (p, position) in out.chunks_mut(heads * d).enumerate() {
        let (b, t) = (p / len, p % len);
        let table = ((if table_rows == 1 { 0 } else { b }) * len + t) * half;
        for head in position.chunks_mut(d) {
            let original = head.to_vec();
            for i in 0..half {
                let (c, s) = (f64::from(cos[table + i]), f64::from(sin[table + i]));
                head[i] = original[i] * c - original[i + half] * s;
                head[i + half] = original[i + half] * c + original[i] * s;
            }
        }
    }
    out
}

fn swiglu_reference(gate: &[f32], up: &[f32]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = f64::from(g);
            g / (1.0 + (-g).exp()) * f64::from(u)
        })
        .collect()
}

/// The gradients of `Σ out · weights` through burn's autodiff of the composed ops and through
/// the fused op with its own backward, for inputs `inputs`.
fn gradients<const D: usize>(
    inputs: &[(Vec<f32>, [usize; D])],
    weights: &[f32],
    op: impl Fn(&[Tensor<A, D>], bool) -> Tensor<A, D>,
) -> [Vec<Vec<f32>>; 2] {
    [false, true].map(|fused| {
        let xs: Vec<Tensor<A, D>> = inputs
            .iter()
            .map(|(v, s)| tensor::<A, D>(v, *s).require_grad())
            .collect();
        let out = op(&xs, fused);
        let w = tensor::<A, D>(weights, out.dims());
        let grads = (out * w).sum().backward();
        xs.iter()
            .map(|x| host(x.grad(&grads).expect("a gradient")))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn rms_norm_follows_the_reference_and_burns_gradients(
        rows in 1usize..40, d in 1usize..70, seed in 0u64..1000, scale in 0.01f32..30.0
    ) {
        let (x, gamma) = (values(seed, rows * d, scale), values(seed + 1, d, 2.0));
        let eps = 1e-6;
        let want = rms_reference(&x, &gamma, eps);
        for got in [
            host(blocks::rms_norm(tensor::<NdArray, 2>(&x, [rows, d]), tensor(&gamma, [d]), eps)),
            host(blocks::rms_norm(tensor::<Flex, 2>(&x, [rows, d]), tensor(&gamma, [d]), eps)),
        ] {
            close("rms_norm", &got, &want, 2e-6);
        }
        let upstream = values(seed + 2, rows * d, 1.0);
        let [burn, fused] = gradients(&[(x.clone(), [rows, d]), (gamma.clone(), [1, d])], &upstream, |t, fused| {
            let gamma = t[1].clone().reshape([d]);
            if fused {
                blocks::rms_norm(t[0].clone(), gamma, eps)
            } else {
                let y = blocks::rms_norm_composed::<A>(
                    t[0].clone().into_primitive().tensor(),
                    gamma.into_primitive().tensor(),
                    eps,
                );
                Tensor::from_primitive(TensorPrimitive::Float(y))
            }
        });
        // Both f32, in other orders: each within its rounding of the f64 gradients. burn's
        // composition rounds more (its reductions' order follows the CPU's vector width: up to
        // 1.2e-4 of the terms on an AVX2 EPYC, under 1e-4 with AVX-512); ours keeps 2e-5 below.
        let (dx, dgamma, terms) = rms_grad_reference(&x, &gamma, eps, &upstream);
        for (which, grads, bound) in [("fused", &fused, 1e-4), ("burn", &burn, 3e-4)] {
            within(&format!("∂x ({which})"), &grads[0], &dx, bound * terms);
            close("∂γ", &grads[1], &dgamma, 1e-4);
        }
        within("∂x (fused, tight)", &fused[0], &dx, 2e-5 * terms);
    }

    #[test]
    fn the_rotation_follows_the_reference_and_burns_gradients(
        batch in 1usize..3, len in 1usize..9, heads in 1usize..4, half in 1usize..9,
        pass in 0usize..3, per_row in any::<bool>(), seed in 0u64..1000
    ) {
        let d = 2 * half + 2 * pass;
        let dims = [batch, len, heads, d];
        let table_rows = if per_row { batch } else { 1 };
        let x = values(seed, batch * len * heads * d, 3.0);
        let angles = values(seed + 1, table_rows * len * half, 3.0);
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        let want = rotary_reference(&x, &cos, &sin, dims, half, table_rows);
        let tables = [table_rows, len, half];
        for got in [
            host(blocks::rotary(tensor::<NdArray, 4>(&x, dims), tensor(&cos, tables), tensor(&sin, tables))),
            host(blocks::rotary(tensor::<Flex, 4>(&x, dims), tensor(&cos, tables), tensor(&sin, tables))),
        ] {
            close("rotary", &got, &want, 2e-6);
        }
        let upstream = values(seed + 2, x.len(), 1.0);
        let [burn, fused] = gradients(&[(x, dims)], &upstream, |t, fused| {
            let (c, s) = (tensor::<A, 3>(&cos, tables), tensor::<A, 3>(&sin, tables));
            if fused {
                blocks::rotary(t[0].clone(), c, s)
            } else {
                let y = blocks::rotary_composed::<A>(
                    t[0].clone().into_primitive().tensor(),
                    c.into_primitive().tensor(),
                    s.into_primitive().tensor(),
                );
                Tensor::from_primitive(TensorPrimitive::Float(y))
            }
        });
        close32("∂x", &fused[0], &burn[0], 2e-6);
    }

    #[test]
    fn swiglu_follows_the_reference_and_burns_gradients(
        n in 1usize..3000, seed in 0u64..1000, scale in 0.1f32..12.0
    ) {
        let (gate, up) = (values(seed, n, scale), values(seed + 1, n, 2.0));
        let want = swiglu_reference(&gate, &up);
        for got in [
            host(blocks::swiglu(tensor::<NdArray, 1>(&gate, [n]), tensor(&up, [n]))),
            host(blocks::swiglu(tensor::<Flex, 1>(&gate, [n]), tensor(&up, [n]))),
        ] {
            close("swiglu", &got, &want, 2e-6);
        }
        let upstream = values(seed + 2, n, 1.0);
        let [burn, fused] = gradients(&[(gate, [n]), (up, [n])], &upstream, |t, fused| {
            if fused {
                blocks::swiglu(t[0].clone(), t[1].clone())
            } else {
                let y = blocks::swiglu_composed::<A>(
                    t[0].clone().into_primitive().tensor(),
                    t[1].clone().into_primitive().tensor(),
                );
                Tensor::from_primitive(TensorPrimitive::Float(y))
            }
        });
        close32("∂gate", &fused[0], &burn[0], 2e-6);
        close32("∂up", &fused[1], &burn[1], 2e-6);
    }
}

/// The host backends run the blocks fused, with the same bits on both; views (a transposed
/// input) read as their values; bf16 on burn-flex, which the host passes do not take, is the
/// composition of burn's ops.
#[test]
fn both_host_backends_fuse_the_blocks_alike() {
    assert!(<NdArray>::xt_blocks_native() && Flex::xt_blocks_native() && A::xt_blocks_native());
    let (rows, d) = (37, 96);
    let (x, gamma) = (values(7, rows * d, 4.0), values(8, d, 1.5));
    let nd = host(blocks::rms_norm(
        tensor::<NdArray, 2>(&x, [rows, d]),
        tensor(&gamma, [d]),
        1e-5,
    ));
    let flex = host(blocks::rms_norm(
        tensor::<Flex, 2>(&x, [rows, d]),
        tensor(&gamma, [d]),
        1e-5,
    ));
    assert_eq!(nd, flex);
    let transposed = tensor::<Flex, 2>(&x, [d, rows]).transpose();
    let contiguous = Tensor::<Flex, 2>::from_data(transposed.to_data(), &Default::default());
    assert_eq!(
        host(blocks::swiglu(transposed.clone(), transposed.clone())),
        host(blocks::swiglu(contiguous.clone(), contiguous))
    );
    let bf16 = |t: Tensor<Flex, 2>| t.cast(DType::BF16);
    let x16 = bf16(tensor::<Flex, 2>(&x, [rows, d]));
    let g16 = tensor::<Flex, 1>(&gamma, [d]).cast(DType::BF16);
    let fused = blocks::rms_norm(x16.clone(), g16.clone(), 1e-5);
    assert_eq!(fused.dtype(), DType::BF16);
    let composed = blocks::rms_norm_composed::<Flex>(
        x16.into_primitive().tensor(),
        g16.into_primitive().tensor(),
        1e-5,
    );
    assert_eq!(
        host(fused),
        host(Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(
            composed
        )))
    );
}
