//! Attention that never builds the `[batch, heads, T, T]` scores, with its own backward
//! (FlashAttention-2's): the forward keeps the output and each query row's log-sum-exp, and the
//! backward recomputes each score from them, so the memory of a layer's attention is that of its
//! inputs and outputs whatever the length.
//!
//! The mask is described, not materialized ([`AttentionSpec`]): causal (query `i` of `T_q` sits
//! at position `T_k − T_q + i`, so a query block after a KV cache sees its past), a sliding
//! window, and padded keys per sequence. Grouped KV heads are read in place: query head `h`
//! reads KV head `h / (H / H_kv)`. Scores may be soft-capped (Gemma-2's `c · tanh(s / c)` of the
//! scaled score, before the mask and the softmax); the backward multiplies by its derivative.
//!
//! This module holds the spec, its checks and the portable host implementation every backend
//! gets through [`crate::XTokenBackend::xt_attention`]: the inputs are read to f32 once (any
//! float dtype), each query row is computed with an O(`T_k`) scratch row per thread, and the
//! results are uploaded in the inputs' dtypes. burn's `CubeBackend` (CUDA, wgpu) runs the same
//! algorithm in cubecl kernels instead (module `cube`, feature `cuda` or `wgpu`). `Autodiff<B>`
//! wraps either with the backward.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorData, TensorMetadata};
use rayon::prelude::*;

use crate::error::KernelError;
use crate::host::rows::read_floats;

/// Which keys a query sees, and the softmax scale.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    /// The scores' scale (usually `1 / √head_dim`).
    pub scale: f32,
    /// A query sees no key after its own position.
    pub causal: bool,
    /// A query at position `p` sees keys `j` with `j + window > p` only (Phi-3's sliding window).
    pub window: Option<usize>,
    /// `[batch · T_k]`, `true` where a key is padding, which no query sees.
    pub key_padding: Option<Arc<[bool]>>,
    /// `c`: each scaled score `s` becomes `c · tanh(s / c)` (Gemma-2's `attn_logit_softcapping`).
    pub softcap: Option<f32>,
}

impl AttentionSpec {
    /// Plain causal attention scaled by `1 / √head_dim`.
    pub fn causal(head_dim: usize) -> Self {
        Self {
            scale: 1.0 / (head_dim as f32).sqrt(),
            causal: true,
            window: None,
            key_padding: None,
            softcap: None,
        }
    }

    /// The score of a query and a key from their dot product: scaled, then soft-capped where
    /// the spec says.
    pub fn score(&self, dot: f32) -> f32 {
        let s = self.scale * dot;
        match self.softcap {
            Some(c) => c * (s / c).tanh(),
            None => s,
        }
    }

    /// `∂score / ∂(scaled score)` at a capped score `score`: `1 − (score / c)²` (1 uncapped).
    pub fn cap_slope(&self, score: f32) -> f32 {
        match self.softcap {
            Some(c) => {
                let t = score / c;
                1.0 - t * t
            }
            None => 1.0,
        }
    }
}

/// The forward's results: the output and what its backward needs besides the inputs.
#[derive(Debug, Clone)]
pub struct Attended<B: Backend> {
    /// `[batch, heads, T_q, head_dim]`, in the queries' dtype.
    pub output: FloatTensor<B>,
    /// Each query row's log-sum-exp of its scaled scores, `[batch, heads, T_q]`, f32
    /// (`f32::MIN` for a row that sees no key, on every backend: a device kernel has no
    /// infinity; its output is 0).
    pub lse: FloatTensor<B>,
}

/// The gradients with respect to the queries, keys and values, each in its input's dtype.
#[derive(Debug, Clone)]
pub struct AttentionGrads<B: Backend> {
    /// `∂/∂q`.
    pub q: FloatTensor<B>,
    /// `∂/∂k`.
    pub k: FloatTensor<B>,
    /// `∂/∂v`.
    pub v: FloatTensor<B>,
}

/// The sizes of one attention call, checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) queries: usize,
    pub(crate) keys: usize,
    pub(crate) head_dim: usize,
}

impl Dims {
    pub(crate) fn of(
        q: &Shape,
        k: &Shape,
        v: &Shape,
        spec: &AttentionSpec,
    ) -> Result<Self, KernelError> {
        let four = |what, s: &Shape| match s.as_slice() {
            &[a, b, c, d] => Ok([a, b, c, d]),
            _ => Err(KernelError::Shape {
                what,
                expected: "[batch, heads, len, head_dim]".into(),
                found: format!("{:?}", s.as_slice()),
            }),
        };
        let ([batch, heads, queries, head_dim], kd) = (four("queries", q)?, four("keys", k)?);
        if four("values", v)? != kd {
            return Err(KernelError::Shape {
                what: "values",
                expected: format!("the keys' shape {kd:?}"),
                found: format!("{:?}", v.as_slice()),
            });
        }
        let [kb, kv_heads, keys, kdim] = kd;
        if kb != batch || kdim != head_dim || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(KernelError::Shape {
                what: "keys",
                expected: format!(
                    "[{batch}, a divisor of {heads} heads, len, {head_dim}] (the queries' batch \
                     and head_dim)"
                ),
                found: format!("{kd:?}"),
            });
        }
        if spec.causal && queries > keys {
            return Err(KernelError::Invalid {
                what: "causal attention",
                why: format!("{queries} queries over {keys} keys: the queries are the last keys"),
            });
        }
        if spec.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
            return Err(KernelError::Invalid {
                what: "attention soft-cap",
                why: format!("{:?} is not a positive number", spec.softcap),
            });
        }
        if spec.window == Some(0) {
            return Err(KernelError::Invalid {
                what: "attention window",
                why: "a window of 0 keys hides every key".into(),
            });
        }
        if let Some(padding) = &spec.key_padding {
            if padding.len() != batch * keys {
                return Err(KernelError::Shape {
                    what: "key padding",
                    expected: format!("{batch} × {keys} flags"),
                    found: format!("{}", padding.len()),
                });
            }
        }
        Ok(Self {
            batch,
            heads,
            kv_heads,
            queries,
            keys,
            head_dim,
        })
    }

    /// The query heads each KV head serves.
    pub(crate) fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// The keys query row `i` may see (before padding), as a range.
    fn visible(&self, spec: &AttentionSpec, i: usize) -> std::ops::Range<usize> {
        let position = self.keys - self.queries + i;
        let lo = spec.window.map_or(0, |w| (position + 1).saturating_sub(w));
        let hi = if spec.causal { position + 1 } else { self.keys };
        lo..hi
    }

    /// The query rows that may see key `j` (before padding), as a range.
    fn seeing(&self, spec: &AttentionSpec, j: usize) -> std::ops::Range<usize> {
        let offset = self.keys - self.queries;
        let lo = if spec.causal {
            j.saturating_sub(offset)
        } else {
            0
        };
        let hi = spec.window.map_or(self.queries, |w| {
            (j + w).saturating_sub(offset).min(self.queries)
        });
        lo..hi.max(lo)
    }
}

/// A tensor of any rank read to the host as flat f32 (the host module's reader, on a `[1, n]`
/// view).
fn host_f32<B: Backend>(t: FloatTensor<B>, what: &'static str) -> Result<Vec<f32>, KernelError> {
    let n = t.shape().num_elements();
    read_floats::<B>(B::float_reshape(t, Shape::new([1, n])), what)
}

fn upload<B: Backend>(
    values: Vec<f32>,
    shape: Shape,
    dtype: DType,
    device: &B::Device,
) -> FloatTensor<B> {
    let f32 = B::float_from_data(TensorData::new(values, shape), device);
    match dtype {
        DType::F32 => f32,
        other => B::float_cast(f32, other.into()),
    }
}

/// `Σ a·b` over eight partial sums, which the compiler keeps in one vector register (a single
/// running sum is a chain of dependent additions it may not reorder).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0.0f32; LANES];
    let (a8, b8) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for lane in 0..LANES {
            acc[lane] += x[lane] * y[lane];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The batch row and the KV head of a query head.
struct Heads {
    b: usize,
    kv: usize,
}

/// The inputs read to the host, with their layout.
struct Host {
    d: Dims,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Host {
    fn q_row(&self, bh: usize, i: usize) -> &[f32] {
        let at = (bh * self.d.queries + i) * self.d.head_dim;
        &self.q[at..at + self.d.head_dim]
    }

    /// The batch row and the KV head (batch · KV heads + KV head) query head `bh` (batch ·
    /// heads + head) reads: found once per query row, not per key.
    fn heads_of(&self, bh: usize) -> Heads {
        let (b, h) = (bh / self.d.heads, bh % self.d.heads);
        Heads {
            b,
            kv: b * self.d.kv_heads + h / self.d.group(),
        }
    }

    /// Key and value rows `j` of KV head `kv`.
    fn kv_at(&self, kv: usize, j: usize) -> (&[f32], &[f32]) {
        let at = (kv * self.d.keys + j) * self.d.head_dim;
        let n = self.d.head_dim;
        (&self.k[at..at + n], &self.v[at..at + n])
    }

    /// Whether key `j` of batch row `b` is padding.
    fn padded_at(&self, spec: &AttentionSpec, b: usize, j: usize) -> bool {
        spec.key_padding
            .as_ref()
            .is_some_and(|p| p[b * self.d.keys + j])
    }

    /// Query row `(bh, i)`'s scaled scores over its visible keys into `scores` (−∞ for padded
    /// keys); returns the range they cover.
    fn scores(
        &self,
        spec: &AttentionSpec,
        bh: usize,
        i: usize,
        scores: &mut Vec<f32>,
    ) -> std::ops::Range<usize> {
        let range = self.d.visible(spec, i);
        let q = self.q_row(bh, i);
        let Heads { b, kv } = self.heads_of(bh);
        scores.clear();
        scores.extend(range.clone().map(|j| match self.padded_at(spec, b, j) {
            true => f32::NEG_INFINITY,
            false => spec.score(dot(q, self.kv_at(kv, j).0)),
        }));
        range
    }
}

/// The forward on the host: each query row's softmax over its visible keys, in f32.
pub fn forward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    spec: &AttentionSpec,
) -> Result<Attended<B>, KernelError> {
    let d = Dims::of(&q.shape(), &k.shape(), &v.shape(), spec)?;
    let (device, dtype, shape) = (B::float_device(&q), q.dtype(), q.shape());
    let host = Host {
        d,
        q: host_f32::<B>(q, "queries")?,
        k: host_f32::<B>(k, "keys")?,
        v: host_f32::<B>(v, "values")?,
    };
    let rows = d.batch * d.heads * d.queries;
    let mut output = vec![0.0f32; rows * d.head_dim];
    let mut lse = vec![f32::MIN; rows];
    output
        .par_chunks_mut(d.head_dim.max(1))
        .zip(lse.par_iter_mut())
        .enumerate()
        .for_each_init(Vec::new, |scores, (row, (out, lse))| {
            let (bh, i) = (row / d.queries, row % d.queries);
            let range = host.scores(spec, bh, i, scores);
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if max == f32::NEG_INFINITY {
                return;
            }
            let mut sum = 0.0f32;
            let kv = host.heads_of(bh).kv;
            for (s, j) in scores.iter_mut().zip(range) {
                *s = (*s - max).exp();
                sum += *s;
                if *s > 0.0 {
                    let value = host.kv_at(kv, j).1;
                    out.iter_mut().zip(value).for_each(|(o, x)| *o += *s * x);
                }
            }
            out.iter_mut().for_each(|o| *o /= sum);
            *lse = max + sum.ln();
        });
    Ok(Attended {
        output: upload::<B>(output, shape.clone(), dtype, &device),
        lse: upload::<B>(
            lse,
            Shape::new([d.batch, d.heads, d.queries]),
            DType::F32,
            &device,
        ),
    })
}

/// What the backward reads besides the output's gradient: the inputs and the forward's results.
#[derive(Debug, Clone)]
pub struct AttentionSaved<B: Backend> {
    /// The queries.
    pub q: FloatTensor<B>,
    /// The keys.
    pub k: FloatTensor<B>,
    /// The values.
    pub v: FloatTensor<B>,
    /// The forward's output.
    pub output: FloatTensor<B>,
    /// The forward's log-sum-exps.
    pub lse: FloatTensor<B>,
}

/// The backward on the host: `∂q` per query row, then `∂k`, `∂v` per key row (over the query
/// heads of its group), each recomputing its scores; no accumulation is shared between threads,
/// so the result is deterministic.
pub fn backward<B: Backend>(
    saved: AttentionSaved<B>,
    grad_output: FloatTensor<B>,
    spec: &AttentionSpec,
) -> Result<AttentionGrads<B>, KernelError> {
    let (qs, ks, vs) = (saved.q.shape(), saved.k.shape(), saved.v.shape());
    let d = Dims::of(&qs, &ks, &vs, spec)?;
    let device = B::float_device(&saved.q);
    let dtypes = (saved.q.dtype(), saved.k.dtype(), saved.v.dtype());
    let host = Host {
        d,
        q: host_f32::<B>(saved.q, "queries")?,
        k: host_f32::<B>(saved.k, "keys")?,
        v: host_f32::<B>(saved.v, "values")?,
    };
    let output = host_f32::<B>(saved.output, "attention output")?;
    let lse = host_f32::<B>(saved.lse, "attention log-sum-exps")?;
    let grad = host_f32::<B>(grad_output, "attention output gradient")?;
    let n = d.head_dim;
    // `Σ_d dO · O` per query row: the softmax backward's row term.
    let delta: Vec<f32> = grad
        .par_chunks(n.max(1))
        .zip(output.par_chunks(n.max(1)))
        .map(|(g, o)| dot(g, o))
        .collect();
    let row = |bh: usize, i: usize| bh * d.queries + i;
    let grad_row = |r: usize| &grad[r * n..r * n + n];
    // p_ij and ∂s_ij (of the scaled score, before any cap) of query row r (query q, output gradient g) and key j of KV head kv.
    let terms = |(r, q, g): (usize, &[f32], &[f32]), kv: usize, j: usize| {
        let (key, value) = host.kv_at(kv, j);
        let score = spec.score(dot(q, key));
        let p = (score - lse[r]).exp();
        (p, p * (dot(g, value) - delta[r]) * spec.cap_slope(score))
    };
    let mut dq = vec![0.0f32; host.q.len()];
    dq.par_chunks_mut(n.max(1)).enumerate().for_each(|(r, dq)| {
        let (bh, i) = (r / d.queries, r % d.queries);
        let Heads { b, kv } = host.heads_of(bh);
        let query = (r, host.q_row(bh, i), grad_row(r));
        for j in d.visible(spec, i) {
            if !host.padded_at(spec, b, j) {
                let ds = terms(query, kv, j).1 * spec.scale;
                let key = host.kv_at(kv, j).0;
                dq.iter_mut().zip(key).for_each(|(g, x)| *g += ds * x);
            }
        }
    });
    let mut dk = vec![0.0f32; host.k.len()];
    let mut dv = vec![0.0f32; host.v.len()];
    dk.par_chunks_mut(n.max(1))
        .zip(dv.par_chunks_mut(n.max(1)))
        .enumerate()
        .for_each(|(kv_row, (dk, dv))| {
            let (kv, j) = (kv_row / d.keys, kv_row % d.keys);
            let (b, g) = (kv / d.kv_heads, kv % d.kv_heads);
            for h in g * d.group()..(g + 1) * d.group() {
                let bh = b * d.heads + h;
                if host.padded_at(spec, b, j) {
                    continue;
                }
                for i in d.seeing(spec, j) {
                    let r = row(bh, i);
                    let (q, g_out) = (host.q_row(bh, i), grad_row(r));
                    let (p, ds) = terms((r, q, g_out), kv, j);
                    dv.iter_mut().zip(g_out).for_each(|(a, x)| *a += p * x);
                    dk.iter_mut()
                        .zip(q)
                        .for_each(|(a, x)| *a += ds * spec.scale * x);
                }
            }
        });
    Ok(AttentionGrads {
        q: upload::<B>(dq, qs, dtypes.0, &device),
        k: upload::<B>(dk, ks, dtypes.1, &device),
        v: upload::<B>(dv, vs, dtypes.2, &device),
    })
}
