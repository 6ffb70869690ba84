//! The attention's cubecl kernels (`XTokenBackend::xt_attention` and its backward on burn's
//! wgpu backend, Mesa lavapipe in CI) give what the host version gives on the same tensors, for
//! every mask kind, in f32 and in f16, over sizes that span several query blocks and key tiles
//! and a head dimension that is not a multiple of the tile width; through `Autodiff<Wgpu>` the
//! gradients equal those of `Autodiff<NdArray>`; a row that sees no key gives zeros. On the
//! plain `CubeBackend` and, with `--features fusion`, on burn's fused backend (`super::Wgpu`).
#![cfg(feature = "wgpu")]

use std::sync::Arc;

use super::Wgpu;
use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use xtoken_kernels::attention::{self, AttentionSaved, AttentionSpec};
use xtoken_kernels::XTokenBackend;

/// One attention problem: sizes and mask.
#[derive(Clone)]
struct Case {
    heads: usize,
    kv_heads: usize,
    queries: usize,
    keys: usize,
    head_dim: usize,
    spec: AttentionSpec,
}

const BATCH: usize = 2;

impl Case {
    fn new(heads: usize, kv_heads: usize, queries: usize, keys: usize, head_dim: usize) -> Self {
        Self {
            heads,
            kv_heads,
            queries,
            keys,
            head_dim,
            spec: AttentionSpec::causal(head_dim),
        }
    }

    fn padded(mut self, hidden: impl Fn(usize, usize) -> bool) -> Self {
        let flags: Vec<bool> = (0..BATCH * self.keys)
            .map(|at| hidden(at / self.keys, at % self.keys))
            .collect();
        self.spec.key_padding = Some(Arc::from(flags));
        self
    }

    fn shapes(&self) -> [[usize; 4]; 4] {
        let q = [BATCH, self.heads, self.queries, self.head_dim];
        let kv = [BATCH, self.kv_heads, self.keys, self.head_dim];
        [q, kv, kv, q]
    }
}

fn cases() -> Vec<(&'static str, Case)> {
    let mut window = Case::new(2, 2, 45, 45, 40);
    window.spec.window = Some(7);
    let mut full = Case::new(2, 2, 11, 40, 40);
    full.spec.causal = false;
    let mut window_after_cache = Case::new(2, 1, 9, 41, 24);
    window_after_cache.spec.window = Some(12);
    let mut capped = Case::new(4, 2, 37, 37, 32);
    capped.spec.window = Some(20);
    capped.spec.softcap = Some(2.0);
    vec![
        ("soft-capped scores (Gemma-2), a window", capped),
        ("causal", Case::new(2, 2, 45, 45, 40)),
        (
            "padded keys, left and right",
            Case::new(2, 2, 45, 45, 40).padded(|b, j| (b == 0 && j < 3) || (b == 1 && j >= 35)),
        ),
        ("sliding window", window),
        ("grouped KV heads, head_dim 64", Case::new(4, 2, 37, 37, 64)),
        ("one KV head", Case::new(4, 1, 20, 20, 16)),
        ("queries after a cache", Case::new(2, 1, 5, 50, 40)),
        ("a window after a cache", window_after_cache),
        ("no mask", full),
    ]
}

fn values(seed: u32, n: usize) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let x = (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 10_007;
            x as f32 / 2500.0 - 2.0
        })
        .collect()
}

fn tensor<B: Backend>(seed: u32, shape: [usize; 4], dtype: DType) -> Tensor<B, 4> {
    let n = shape.iter().product();
    Tensor::from_data(
        TensorData::new(values(seed, n), shape),
        (&Default::default(), dtype),
    )
}

/// q, k, v and the output's gradient of a case.
fn inputs<B: Backend>(case: &Case, dtype: DType) -> [Tensor<B, 4>; 4] {
    let shapes = case.shapes();
    [0, 1, 2, 3].map(|i| tensor(i as u32 + 1, shapes[i], dtype))
}

fn host<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().expect("f32")
}

fn float<B: Backend, const D: usize>(t: burn::tensor::ops::FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Output, log-sum-exps and the three gradients, by the cube kernels (`kernel`) or the host
/// version on the same backend.
fn run(case: &Case, dtype: DType, kernel: bool) -> [Vec<f32>; 5] {
    let [q, k, v, g] = inputs::<Wgpu>(case, dtype).map(|t| t.into_primitive().tensor());
    let spec = &case.spec;
    let found = match kernel {
        true => <Wgpu>::xt_attention(q.clone(), k.clone(), v.clone(), spec),
        false => attention::forward::<Wgpu>(q.clone(), k.clone(), v.clone(), spec),
    }
    .expect("forward");
    let saved = AttentionSaved {
        q,
        k,
        v,
        output: found.output.clone(),
        lse: found.lse.clone(),
    };
    let grads = match kernel {
        true => <Wgpu>::xt_attention_backward(saved, g, spec),
        false => attention::backward::<Wgpu>(saved, g, spec),
    }
    .expect("backward");
    for (what, t) in [("dq", &grads.q), ("dk", &grads.k), ("dv", &grads.v)] {
        assert_eq!(
            float::<Wgpu, 4>(t.clone()).dtype(),
            dtype,
            "{what} in the inputs' dtype"
        );
    }
    [
        host(float::<Wgpu, 4>(found.output)),
        host(float::<Wgpu, 3>(found.lse)),
        host(float::<Wgpu, 4>(grads.q)),
        host(float::<Wgpu, 4>(grads.k)),
        host(float::<Wgpu, 4>(grads.v)),
    ]
}

/// `|a − b| ≤ tol · max |b|` element by element.
fn assert_close(name: &str, what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{name}: {what}");
    let scale = b
        .iter()
        .filter(|y| y.is_finite())
        .fold(1.0f32, |m, y| m.max(y.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{name}: {what}[{i}] = {x}, host {y} (largest {scale})"
        );
    }
}

fn kernels_match_the_host(dtype: DType, tol: f32) {
    for (name, case) in cases() {
        let kernel = run(&case, dtype, true);
        let reference = run(&case, dtype, false);
        for (what, (a, b)) in ["output", "lse", "dq", "dk", "dv"]
            .iter()
            .zip(kernel.iter().zip(&reference))
        {
            assert_close(name, what, a, b, tol);
        }
    }
}

#[test]
fn the_kernels_equal_the_host_version_in_f32() {
    kernels_match_the_host(DType::F32, 2e-5);
}

/// f16 inputs: both read them to f32 and round their results to f16, so they differ by the
/// rounding of differently ordered f32 sums.
#[test]
fn the_kernels_equal_the_host_version_in_f16() {
    kernels_match_the_host(DType::F16, 2e-3);
}

/// Gradients of `Σ out · w` through `Autodiff<B>`.
fn autodiff_gradients<B: AutodiffBackend + XTokenBackend>(case: &Case) -> [Vec<f32>; 4] {
    let [q, k, v, w] = inputs::<B>(case, DType::F32);
    let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
    let p = |t: &Tensor<B, 4>| t.clone().into_primitive().tensor();
    let found = B::xt_attention(p(&q), p(&k), p(&v), &case.spec).expect("attention");
    let out = float::<B, 4>(found.output);
    let grads = (out.clone() * w).sum().backward();
    let g = |t: &Tensor<B, 4>| host(t.grad(&grads).expect("a gradient"));
    [host(out), g(&q), g(&k), g(&v)]
}

#[test]
fn autodiff_on_wgpu_equals_autodiff_on_ndarray() {
    for (name, case) in cases() {
        let on_wgpu = autodiff_gradients::<Autodiff<Wgpu>>(&case);
        let on_ndarray = autodiff_gradients::<Autodiff<NdArray>>(&case);
        for (what, (a, b)) in ["output", "dq", "dk", "dv"]
            .iter()
            .zip(on_wgpu.iter().zip(&on_ndarray))
        {
            assert_close(name, what, a, b, 2e-5);
        }
    }
}

/// Sequence 0's keys are all padding: its rows see nothing, their output and gradients are zero
/// and their log-sum-exp is `f32::MIN` (no infinity in a kernel); sequence 1 is untouched.
#[test]
fn a_row_that_sees_no_key_gives_zeros() {
    let case = Case::new(2, 2, 12, 12, 16).padded(|b, _| b == 0);
    let [out, lse, dq, dk, dv] = run(&case, DType::F32, true);
    let half = |v: &[f32]| v.len() / 2;
    assert!(out[..half(&out)].iter().all(|&x| x == 0.0));
    assert!(out[half(&out)..].iter().all(|x| x.is_finite() && *x != 0.0));
    assert!(lse[..half(&lse)].iter().all(|&x| x == f32::MIN));
    for g in [&dq, &dk, &dv] {
        assert!(g[..half(g)].iter().all(|&x| x == 0.0));
        assert!(g.iter().all(|x| x.is_finite()));
    }
}

/// The device reports the shared memory the kernels need at a head dimension, and a head
/// dimension beyond it is a named error, not a kernel that fails to compile.
#[test]
fn a_head_dim_beyond_the_shared_memory_is_named() {
    let case = Case::new(1, 1, 4, 4, 4096);
    let [q, k, v, _] = inputs::<Wgpu>(&case, DType::F32).map(|t| t.into_primitive().tensor());
    let e = <Wgpu>::xt_attention(q, k, v, &case.spec).unwrap_err();
    assert!(e.to_string().contains("head_dim"), "{e}");
    assert!(xtoken_kernels::cube::attention_shared_bytes(128) <= 32 * 1024);
}
