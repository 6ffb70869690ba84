//! The blocks on f32 slices on the host, a task per band of rows on every core. Each reads its
//! inputs once and writes its output once; the sums of a row are over eight partial sums (the
//! compiler keeps them in one vector register). Results do not depend on the number of
//! threads: a row is always computed by one task, and RMSNorm's `∂γ` adds the bands' partial
//! sums in band order.

use rayon::prelude::*;

/// Rows per task: enough work per task that scheduling is noise.
fn band(d: usize) -> usize {
    (16_384 / d.max(1)).max(1)
}

/// `Σ a·b` over eight partial sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

/// Each row's `r = sqrt(mean(x²) + ε)` (f32, as burn's RMSNorm computes it).
fn rms(row: &[f32], epsilon: f64) -> f32 {
    let mean = dot(row, row) / row.len() as f32;
    (mean + epsilon as f32).sqrt()
}

/// RMSNorm of `x` (rows of `gamma.len()`) into a new buffer: `y = (x / r) · γ`.
pub fn rms_norm(x: &[f32], gamma: &[f32], epsilon: f64) -> Vec<f32> {
    let d = gamma.len();
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(d * band(d))
        .zip(x.par_chunks(d * band(d)))
        .for_each(|(y, x)| {
            for (y, x) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                let r = rms(x, epsilon);
                for ((y, &x), &g) in y.iter_mut().zip(x).zip(gamma) {
                    *y = (x / r) * g;
                }
            }
        });
    y
}

/// RMSNorm's gradients given the output's `dy`: `∂x = g / r − x · Σ(g·x) / (d · r³)` with
/// `g = dy · γ`, and `∂γ = Σ_rows dy · x / r`.
pub fn rms_norm_backward(
    x: &[f32],
    gamma: &[f32],
    epsilon: f64,
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let d = gamma.len();
    let mut dx = vec![0.0f32; x.len()];
    let rows = band(d) * d;
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(rows)
        .zip(x.par_chunks(rows).zip(dy.par_chunks(rows)))
        .map(|(dx, (x, dy))| {
            let mut dgamma = vec![0.0f32; d];
            let mut g = vec![0.0f32; d];
            for ((dx, x), dy) in dx
                .chunks_exact_mut(d)
                .zip(x.chunks_exact(d))
                .zip(dy.chunks_exact(d))
            {
                let r = rms(x, epsilon);
                for ((g, &dy), &gamma) in g.iter_mut().zip(dy).zip(gamma) {
                    *g = dy * gamma;
                }
                let scale = dot(&g, x) / (d as f32 * r * r * r);
                for ((dx, &g), &x) in dx.iter_mut().zip(&g).zip(x) {
                    *dx = g / r - x * scale;
                }
                for ((acc, &dy), &x) in dgamma.iter_mut().zip(dy).zip(x) {
                    *acc += dy * x / r;
                }
            }
            dgamma
        })
        .collect();
    let mut dgamma = vec![0.0f32; d];
    for partial in &partials {
        for (acc, p) in dgamma.iter_mut().zip(partial) {
            *acc += p;
        }
    }
    (dx, dgamma)
}

/// The sizes of a rotation: `x` `[batch, len, heads, head_dim]`, tables `[table_rows, len, half]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotaryShape {
    /// Sequences.
    pub batch: usize,
    /// Positions per sequence.
    pub len: usize,
    /// Heads.
    pub heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Rotated pairs per head (`rotary_dim / 2`).
    pub half: usize,
    /// The tables' rows: 1 (every sequence at the same positions) or `batch`.
    pub table_rows: usize,
}

/// The rotation of every head of `x` (rotating by the opposite angle when `inverse`: the
/// backward), into a new buffer.
pub fn rotary(x: &[f32], cos: &[f32], sin: &[f32], shape: RotaryShape, inverse: bool) -> Vec<f32> {
    let RotaryShape {
        len,
        heads,
        head_dim,
        half,
        table_rows,
        ..
    } = shape;
    let position = heads * head_dim;
    let mut y = vec![0.0f32; x.len()];
    y.par_chunks_mut(position)
        .zip(x.par_chunks(position))
        .enumerate()
        .for_each(|(p, (y, x))| {
            let (b, t) = (p / len, p % len);
            let table = ((if table_rows == 1 { 0 } else { b }) * len + t) * half;
            let (cos, sin) = (&cos[table..table + half], &sin[table..table + half]);
            for (y, x) in y.chunks_exact_mut(head_dim).zip(x.chunks_exact(head_dim)) {
                let (x1, rest) = x.split_at(half);
                let (x2, pass) = rest.split_at(half);
                let (y1, rest) = y.split_at_mut(half);
                let (y2, y_pass) = rest.split_at_mut(half);
                for i in 0..half {
                    let (c, s) = (cos[i], sin[i]);
                    if inverse {
                        y1[i] = x1[i] * c + x2[i] * s;
                        y2[i] = x2[i] * c - x1[i] * s;
                    } else {
                        y1[i] = x1[i] * c - x2[i] * s;
                        y2[i] = x2[i] * c + x1[i] * s;
                    }
                }
                y_pass.copy_from_slice(pass);
            }
        });
    y
}

/// `σ(z)` in f32 as burn computes it on the host.
fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// `silu(gate) · up` into a new buffer.
pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    const CHUNK: usize = 1 << 14;
    let mut h = vec![0.0f32; gate.len()];
    h.par_chunks_mut(CHUNK)
        .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
        .for_each(|(h, (gate, up))| {
            for ((h, &g), &u) in h.iter_mut().zip(gate).zip(up) {
                *h = g * sigmoid(g) * u;
            }
        });
    h
}

/// SwiGLU's gradients given the output's `dh`: with `s = σ(gate)`,
/// `∂gate = dh · up · s · (1 + gate · (1 − s))` and `∂up = dh · gate · s`.
pub fn swiglu_backward(gate: &[f32], up: &[f32], dh: &[f32]) -> (Vec<f32>, Vec<f32>) {
    const CHUNK: usize = 1 << 14;
    let (mut dgate, mut dup) = (vec![0.0f32; gate.len()], vec![0.0f32; gate.len()]);
    dgate
        .par_chunks_mut(CHUNK)
        .zip(dup.par_chunks_mut(CHUNK))
        .zip(
            gate.par_chunks(CHUNK)
                .zip(up.par_chunks(CHUNK))
                .zip(dh.par_chunks(CHUNK)),
        )
        .for_each(|((dgate, dup), ((gate, up), dh))| {
            for i in 0..gate.len() {
                let (g, u, d) = (gate[i], up[i], dh[i]);
                let s = sigmoid(g);
                dgate[i] = d * u * s * (1.0 + g * (1.0 - s));
                dup[i] = d * g * s;
            }
        });
    (dgate, dup)
}
