//! `XTokenBackend::xt_attention` on the CPU: its output equals an f64 loop over the full score
//! matrix, and its gradients (through `Autodiff<NdArray>`) equal those of burn's naive attention
//! computed in f64 (the scores materialized, the mask a tensor, the KV heads repeated) for every
//! mask kind: causal, padded keys, a sliding window, grouped KV heads, queries after a cache,
//! scores soft-capped (Gemma-2's `c · tanh(s / c)`);
//! they also match finite differences, and a row that sees no key gives zeros, not NaN.

use std::sync::Arc;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::activation::softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Element, Tensor, TensorData, TensorPrimitive};
use xtoken_kernels::attention::AttentionSpec;
use xtoken_kernels::XTokenBackend;

type A = Autodiff<NdArray>;
/// The naive reference's backend.
type A64 = Autodiff<NdArray<f64>>;

/// One attention problem: sizes and mask.
#[derive(Clone)]
struct Case {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    queries: usize,
    keys: usize,
    head_dim: usize,
    spec: AttentionSpec,
}

impl Case {
    fn new(heads: usize, kv_heads: usize, queries: usize, keys: usize) -> Self {
        Self {
            batch: 2,
            heads,
            kv_heads,
            queries,
            keys,
            head_dim: 8,
            spec: AttentionSpec::causal(8),
        }
    }

    fn sees(&self, b: usize, i: usize, j: usize) -> bool {
        let position = self.keys - self.queries + i;
        let padded = self
            .spec
            .key_padding
            .as_ref()
            .is_some_and(|p| p[b * self.keys + j]);
        let future = self.spec.causal && j > position;
        let far = self.spec.window.is_some_and(|w| j + w <= position);
        !(padded || future || far)
    }
}

fn values(seed: u32, n: usize) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let x = (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 10_007;
            x as f32 / 2500.0 - 2.0
        })
        .collect()
}

/// In `B`'s own float dtype: burn's default dtype is per device, and `NdArray<f64>` shares
/// its device with `NdArray<f32>`, so the first backend to make a tensor would set it for both.
fn tensor<B: Backend>(seed: u32, shape: [usize; 4]) -> Tensor<B, 4> {
    let n = shape.iter().product();
    let dtype = <B::FloatElem as Element>::dtype();
    Tensor::from_data(
        TensorData::new(values(seed, n), shape),
        (&Default::default(), dtype),
    )
}

fn host<B: Backend>(t: Tensor<B, 4>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().expect("f32")
}

/// Queries, keys, values and the output's upstream weights of a case.
fn inputs<B: Backend>(case: &Case) -> [Tensor<B, 4>; 4] {
    let (b, d) = (case.batch, case.head_dim);
    [
        tensor(1, [b, case.heads, case.queries, d]),
        tensor(2, [b, case.kv_heads, case.keys, d]),
        tensor(3, [b, case.kv_heads, case.keys, d]),
        tensor(4, [b, case.heads, case.queries, d]),
    ]
}

/// The output as an f64 loop over every score.
fn reference(case: &Case) -> Vec<f64> {
    let [q, k, v, _] = inputs::<A>(case).map(host);
    let (d, group) = (case.head_dim, case.heads / case.kv_heads);
    let mut out = Vec::new();
    for b in 0..case.batch {
        for h in 0..case.heads {
            let kv = b * case.kv_heads + h / group;
            for i in 0..case.queries {
                let qi = &q[((b * case.heads + h) * case.queries + i) * d..][..d];
                let seen: Vec<usize> = (0..case.keys).filter(|&j| case.sees(b, i, j)).collect();
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        let kj = &k[(kv * case.keys + j) * d..][..d];
                        let dot: f64 = qi.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let s = dot * case.spec.scale as f64;
                        match case.spec.softcap {
                            Some(c) => c as f64 * (s / c as f64).tanh(),
                            None => s,
                        }
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for c in 0..d {
                    let mut acc = 0.0;
                    for (&j, w) in seen.iter().zip(&weights) {
                        acc += w / sum * v[(kv * case.keys + j) * d + c] as f64;
                    }
                    out.push(acc);
                }
            }
        }
    }
    out
}

/// burn's naive attention: the mask as a `[B, H, T_q, T_k]` tensor, the KV heads repeated.
fn naive<B: Backend>(
    case: &Case,
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let group = case.heads / case.kv_heads;
    let repeat = |t: Tensor<B, 4>| {
        let [b, kvh, len, d] = t.dims();
        t.unsqueeze_dim::<5>(2)
            .expand([b, kvh, group, len, d])
            .reshape([b, kvh * group, len, d])
    };
    let mut mask = Vec::new();
    for b in 0..case.batch {
        for _ in 0..case.heads {
            for i in 0..case.queries {
                mask.extend((0..case.keys).map(|j| !case.sees(b, i, j)));
            }
        }
    }
    let shape = [case.batch, case.heads, case.queries, case.keys];
    let mask = Tensor::<B, 4, Bool>::from_data(TensorData::new(mask, shape), &Default::default());
    let mut scores = q.matmul(repeat(k).swap_dims(2, 3)) * case.spec.scale;
    if let Some(c) = case.spec.softcap {
        scores = (scores / c).tanh() * c;
    }
    softmax(scores.mask_fill(mask, -1e30), 3).matmul(repeat(v))
}

/// An attention implementation under test.
type Attend<B> = fn(&Case, Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) -> Tensor<B, 4>;

fn fused(case: &Case, q: Tensor<A, 4>, k: Tensor<A, 4>, v: Tensor<A, 4>) -> Tensor<A, 4> {
    let p = |t: Tensor<A, 4>| t.into_primitive().tensor();
    let found = A::xt_attention(p(q), p(k), p(v), &case.spec).expect("attention");
    Tensor::from_primitive(TensorPrimitive::Float(found.output))
}

/// Gradients of `Σ out · w` with respect to q, k and v.
fn gradients<B: AutodiffBackend>(case: &Case, attend: Attend<B>) -> (Vec<f32>, [Vec<f32>; 3]) {
    let [q, k, v, w] = inputs(case);
    let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
    let out = attend(case, q.clone(), k.clone(), v.clone());
    let grads = (out.clone() * w).sum().backward();
    let g = |t: &Tensor<B, 4>| {
        let grad = t.grad(&grads).expect("a gradient");
        assert_eq!(
            grad.dtype(),
            <B::FloatElem as Element>::dtype(),
            "computed in B's dtype"
        );
        grad.into_data().convert::<f32>().to_vec().unwrap()
    };
    (host(out), [g(&q), g(&k), g(&v)])
}

fn cases() -> Vec<(&'static str, Case)> {
    let causal = Case::new(2, 2, 9, 9);
    let mut padded = causal.clone();
    let flags: Vec<bool> = (0..2 * 9).map(|i| i >= 9 + 6).collect();
    padded.spec.key_padding = Some(Arc::from(flags));
    let mut window = causal.clone();
    window.spec.window = Some(3);
    let grouped = Case::new(4, 2, 7, 7);
    let after_cache = Case::new(2, 1, 3, 10);
    let mut full = Case::new(2, 2, 5, 6);
    full.spec.causal = false;
    // A cap of 1.5 bends the scores of these inputs (|s| up to ≈ 4) well away from linear.
    let mut capped = Case::new(4, 2, 7, 7);
    capped.spec.window = Some(4);
    capped.spec.softcap = Some(1.5);
    vec![
        ("soft-capped scores, a window, grouped KV heads", capped),
        ("causal", causal),
        ("padded keys", padded),
        ("sliding window", window),
        ("grouped KV heads", grouped),
        ("queries after a cache", after_cache),
        ("no mask", full),
    ]
}

#[test]
fn the_output_equals_an_f64_loop() {
    for (name, case) in cases() {
        let [q, k, v, _] = inputs(&case);
        let got = host(fused(&case, q, k, v));
        for (i, (x, y)) in got.iter().zip(reference(&case)).enumerate() {
            assert!(
                (*x as f64 - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{name}: output[{i}] = {x}, the f64 loop {y}"
            );
        }
    }
}

#[test]
fn gradients_equal_the_naive_attention() {
    for (name, case) in cases() {
        let (out, grads) = gradients::<A>(&case, fused);
        // In f64: burn's f32 backward of the naive path errs by up to 2e-4 of the largest
        // entry (a causal first row's dq, exactly 0, comes out at 6e-4 on some CPUs).
        let (naive_out, naive_grads) = gradients::<A64>(&case, naive);
        let close = |what: &str, a: &[f32], b: &[f32]| {
            assert_eq!(a.len(), b.len());
            let scale = b.iter().fold(1.0f32, |m, y| m.max(y.abs()));
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-5 * scale,
                    "{name}: {what}[{i}] = {x}, naive {y} (largest {scale})"
                );
            }
        };
        close("output", &out, &naive_out);
        for (what, (a, b)) in ["dq", "dk", "dv"]
            .iter()
            .zip(grads.iter().zip(&naive_grads))
        {
            close(what, a, b);
        }
    }
}

/// Central differences of `Σ out · w` in f64 over a few entries of q, k and v, against the
/// backward (tiny shapes, so that f32 rounding stays far below the step's truncation error).
#[test]
fn gradients_match_finite_differences() {
    let mut case = Case::new(2, 1, 4, 4);
    case.spec.window = Some(3);
    case.spec.softcap = Some(1.5);
    let (_, grads) = gradients(&case, fused);
    let base = inputs::<A>(&case).map(host);
    let loss = |which: usize, at: usize, delta: f32| {
        let mut moved = base.clone();
        moved[which][at] += delta;
        let shapes = inputs::<A>(&case).map(|t| t.dims());
        let [q, k, v, w] = [0, 1, 2, 3].map(|i| {
            Tensor::<A, 4>::from_data(
                TensorData::new(moved[i].clone(), shapes[i]),
                &Default::default(),
            )
        });
        let out = host(fused(&case, q, k, v));
        out.iter()
            .zip(host(w))
            .map(|(o, w)| *o as f64 * w as f64)
            .sum::<f64>()
    };
    let h = 1e-2f32;
    for (which, grad) in grads.iter().enumerate() {
        for at in [0, 5, 17, grad.len() - 1] {
            let numeric = (loss(which, at, h) - loss(which, at, -h)) / (2.0 * h as f64);
            let analytic = grad[at] as f64;
            assert!(
                (numeric - analytic).abs() <= 2e-2 * (1.0 + analytic.abs()),
                "input {which}[{at}]: backward {analytic}, finite differences {numeric}"
            );
        }
    }
}

/// A sequence whose keys are all padding: its rows see nothing; their output and gradients are
/// zero (the naive path gives NaN there), and the other sequence is untouched.
#[test]
fn a_row_that_sees_no_key_gives_zeros() {
    let mut case = Case::new(2, 2, 4, 4);
    let flags: Vec<bool> = (0..2 * 4).map(|i| i < 4).collect();
    case.spec.key_padding = Some(Arc::from(flags));
    let (out, grads) = gradients(&case, fused);
    let half = out.len() / 2;
    assert!(out[..half].iter().all(|&x| x == 0.0), "{:?}", &out[..half]);
    assert!(out[half..].iter().all(|x| x.is_finite() && *x != 0.0));
    for g in &grads {
        assert!(g[..g.len() / 2].iter().all(|&x| x == 0.0));
        assert!(g.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn shapes_that_do_not_fit_are_named() {
    let case = Case::new(3, 2, 4, 4);
    let [q, k, v, _] = inputs(&case);
    let p = |t: Tensor<A, 4>| t.into_primitive().tensor();
    let e = A::xt_attention(p(q), p(k), p(v), &case.spec).unwrap_err();
    assert!(e.to_string().contains("keys"), "{e}");
    let case = Case::new(2, 2, 6, 4);
    let [q, k, v, _] = inputs(&case);
    let e = A::xt_attention(p(q), p(k), p(v), &case.spec).unwrap_err();
    assert!(e.to_string().contains("causal attention"), "{e}");
    let mut case = Case::new(2, 2, 4, 4);
    case.spec.window = Some(0);
    let [q, k, v, _] = inputs(&case);
    let e = A::xt_attention(p(q), p(k), p(v), &case.spec).unwrap_err();
    assert!(e.to_string().contains("attention window"), "{e}");
    let mut case = Case::new(2, 2, 4, 4);
    case.spec.softcap = Some(0.0);
    let [q, k, v, _] = inputs(&case);
    let e = A::xt_attention(p(q), p(k), p(v), &case.spec).unwrap_err();
    assert!(e.to_string().contains("soft-cap"), "{e}");
}
