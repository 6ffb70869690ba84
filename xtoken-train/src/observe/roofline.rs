//! A training step's phases against the machine's limits: the floating-point operations and
//! the bytes each phase must move, from the shapes alone, and the time they would take at the
//! device's peak compute and memory bandwidth (`max(FLOPs / peak, bytes / bandwidth)`), so that
//! a measured phase reads as a fraction of its roofline.
//!
//! What is counted, per run of a phase (a micro-batch):
//! - a model's forward over `T` tokens: `2 · T` FLOPs per weight of its linear layers, and the
//!   causal attention's `2 · b · heads · L² · head_dim` per layer (half the square); bytes: its
//!   weights once and every linear layer's input and output in the compute dtype;
//! - the head (`student: head (logits)`): `2 · T · hidden · V`, the weight and the logits;
//! - the backward with recomputation: the forward once more and twice its FLOPs (input and
//!   weight gradients), bytes three times the forward's;
//! - the teacher's top-K: one read of its logits and `8 · K` bytes per row written;
//! - a loss: one read of the student's logits, one write of their gradient and the teacher's
//!   `8 · K` bytes per row (about 10 FLOPs per logit);
//! - clipping + AdamW: the parameters, their gradient and both moments read, three written, in
//!   f32 (28 bytes and about 15 FLOPs per parameter, the norm's read of the gradient besides).
//!
//! Phases whose cost is not a function of these shapes (waiting for data, the exchange between
//! processes) have no roofline.

use std::time::Instant;

use xtoken_models::config::Architecture;

/// A device's peak dense compute and memory bandwidth.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// FLOP/s.
    pub flops: f64,
    /// Bytes/s.
    pub bytes: f64,
    /// Where the figures come from.
    pub source: String,
}

impl Limits {
    /// An H100 SXM's datasheet limits: 989 TFLOP/s dense bf16 on the tensor cores, 3.35 TB/s
    /// of HBM3.
    pub fn h100() -> Self {
        Self {
            flops: 989e12,
            bytes: 3.35e12,
            source: "H100 SXM datasheet: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM".into(),
        }
    }

    /// This machine's CPU, measured: burn-flex's f32 matrix product (1024 × 1024, every core)
    /// for about a second, and a copy of 256 MiB (read + write) repeated for as long.
    pub fn measure_cpu() -> Self {
        let flops = gemm_rate(1.0);
        let bytes = copy_rate(1.0);
        Self {
            flops,
            bytes,
            source: format!(
                "this CPU, measured: {:.0} GFLOP/s f32 gemm, {:.1} GB/s copy",
                flops / 1e9,
                bytes / 1e9
            ),
        }
    }

    /// The seconds `work` takes at these limits.
    pub fn seconds(&self, work: Work) -> f64 {
        (work.flops / self.flops).max(work.bytes / self.bytes)
    }
}

/// FLOP/s of burn-flex's f32 matrix product (the gemm crate, on every core) of 1024 × 1024
/// matrices, repeated for about `seconds`.
fn gemm_rate(seconds: f64) -> f64 {
    use burn::tensor::backend::Backend;
    use burn::tensor::{Distribution, Tensor};
    type Cpu = burn_flex::Flex;
    const N: usize = 1024;
    let device = Default::default();
    let a = Tensor::<Cpu, 2>::random([N, N], Distribution::Default, &device);
    let b = Tensor::<Cpu, 2>::random([N, N], Distribution::Default, &device);
    // The first product warms the thread pool and the packing buffers.
    drop(a.clone().matmul(b.clone()));
    let start = Instant::now();
    let mut rounds = 0u64;
    while rounds == 0 || start.elapsed().as_secs_f64() < seconds {
        drop(std::hint::black_box(a.clone().matmul(b.clone())));
        let _ = Cpu::sync(&device);
        rounds += 1;
    }
    2.0 * (N * N * N) as f64 * rounds as f64 / start.elapsed().as_secs_f64()
}

/// Bytes/s (read + write) of copying 256 MiB, repeated for about `seconds`.
fn copy_rate(seconds: f64) -> f64 {
    let n = 1 << 26;
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let start = Instant::now();
    let mut rounds = 0u64;
    while rounds == 0 || start.elapsed().as_secs_f64() < seconds {
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        rounds += 1;
    }
    2.0 * 4.0 * n as f64 * rounds as f64 / start.elapsed().as_secs_f64()
}

/// What one run of a phase must do.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    /// Floating-point operations.
    pub flops: f64,
    /// Bytes read and written.
    pub bytes: f64,
}

impl Work {
    fn scaled(self, by: f64) -> Self {
        Self {
            flops: self.flops * by,
            bytes: self.bytes * by,
        }
    }

    fn plus(self, other: Self) -> Self {
        Self {
            flops: self.flops + other.flops,
            bytes: self.bytes + other.bytes,
        }
    }
}

/// A teacher of the step, by its name in the run.
#[derive(Debug, Clone)]
pub struct TeacherShape {
    /// Its name (`teacher NAME: …` in the phases).
    pub name: String,
    /// Its model.
    pub architecture: Architecture,
    /// Its tokens per micro-batch.
    pub tokens: usize,
}

/// The shapes of one step: what its phases' work follows from.
#[derive(Debug, Clone)]
pub struct StepShape {
    /// The student.
    pub student: Architecture,
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Student tokens per sequence.
    pub len: usize,
    /// The teachers.
    pub teachers: Vec<TeacherShape>,
    /// Teacher entries kept per row.
    pub top_k: usize,
    /// Bytes per element of the compute dtype (2 for bf16, 4 for f32).
    pub compute_bytes: usize,
    /// W's entries (`V_S × slots`), when a teacher's loss trains W.
    pub w_entries: usize,
}

impl StepShape {
    /// One run of the phase called `name`, or `None` for a phase without a roofline.
    pub fn work(&self, name: &str) -> Option<Work> {
        let tokens = (self.batch * self.len) as f64;
        let dtype = self.compute_bytes as f64;
        let s = &self.student;
        let body = body(s, self.batch, self.len, dtype);
        let head = head(s, tokens, dtype);
        let logits = tokens * s.vocab_size as f64;
        let entries = tokens * self.top_k as f64 * 8.0;
        match name {
            "student: forward" => Some(body),
            "student: head (logits)" => Some(head),
            "student: backward (recomputation)" => Some(body.plus(head).scaled(3.0)),
            "loss: CE" => Some(Work {
                flops: 5.0 * logits,
                bytes: 2.0 * dtype * logits,
            }),
            "student: clipping + AdamW" => Some(adamw(s.num_parameters() as f64)),
            "W: AdamW" => Some(adamw(self.w_entries as f64)),
            _ => self.teacher_work(name, logits, entries, dtype),
        }
    }

    fn teacher_work(&self, name: &str, logits: f64, entries: f64, dtype: f64) -> Option<Work> {
        if let Some(teacher) = name.strip_prefix("loss: teacher ") {
            self.teachers.iter().find(|t| t.name == teacher)?;
            return Some(Work {
                flops: 10.0 * logits,
                bytes: 2.0 * dtype * logits + entries,
            });
        }
        let rest = name.strip_prefix("teacher ")?;
        let (teacher, what) = rest.rsplit_once(": ")?;
        let t = self.teachers.iter().find(|t| t.name == teacher)?;
        let tokens = t.tokens as f64;
        let logits = tokens * t.architecture.vocab_size as f64;
        match what {
            "forward" => {
                let len = t.tokens.div_ceil(self.batch.max(1));
                Some(body(&t.architecture, self.batch, len, dtype).plus(head(
                    &t.architecture,
                    tokens,
                    dtype,
                )))
            }
            "top-K" => Some(Work {
                flops: 4.0 * logits,
                bytes: dtype * logits + tokens * self.top_k as f64 * 8.0,
            }),
            _ => None,
        }
    }
}

/// The layers' forward over `batch` sequences of `len` tokens.
fn body(a: &Architecture, batch: usize, len: usize, dtype: f64) -> Work {
    let tokens = (batch * len) as f64;
    let (h, f) = (a.hidden_size as f64, a.intermediate_size as f64);
    let q = (a.num_attention_heads * a.head_dim) as f64;
    let kv = (a.num_key_value_heads * a.head_dim) as f64;
    let layers = a.num_hidden_layers as f64;
    let linear = h * (q + 2.0 * kv) + q * h + 3.0 * h * f;
    let attention =
        2.0 * batch as f64 * a.num_attention_heads as f64 * (len * len) as f64 * a.head_dim as f64;
    // Each linear layer's input and output: q, k, v and o; gate, up and down.
    let activations = tokens * (4.0 * h + 2.0 * q + 2.0 * kv + 3.0 * h + 4.0 * f);
    Work {
        flops: layers * (2.0 * tokens * linear + attention),
        bytes: layers * (linear * dtype + activations * dtype),
    }
}

/// The head's `[tokens, hidden] · [hidden, V]`.
fn head(a: &Architecture, tokens: f64, dtype: f64) -> Work {
    let (h, v) = (a.hidden_size as f64, a.vocab_size as f64);
    Work {
        flops: 2.0 * tokens * h * v,
        bytes: dtype * (h * v + tokens * h + tokens * v),
    }
}

/// Clipping and AdamW over `n` f32 parameters.
fn adamw(n: f64) -> Work {
    Work {
        flops: 15.0 * n,
        bytes: 32.0 * n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> StepShape {
        StepShape {
            student: Architecture::llama(128_256, 2048, 8192, 16, 32, 8),
            batch: 1,
            len: 4096,
            teachers: vec![TeacherShape {
                name: "qwen".into(),
                architecture: Architecture::llama(151_936, 2560, 9728, 36, 32, 8),
                tokens: 4096,
            }],
            top_k: 8192,
            compute_bytes: 2,
            w_entries: 128_256 * 4,
        }
    }

    /// The student's forward is `2 · T · (non-embedding parameters)` plus attention, checked
    /// against the parameter count computed apart.
    #[test]
    fn the_forward_counts_two_flops_per_weight_and_token() {
        let s = shape();
        let body = s.work("student: forward").unwrap();
        let a = &s.student;
        let weights = (a.num_parameters()
            - a.vocab_size * a.hidden_size
            - a.hidden_size
            - a.num_hidden_layers * 2 * a.hidden_size) as f64;
        let attention = 16.0 * 2.0 * 32.0 * 4096f64.powi(2) * 64.0;
        assert!((body.flops - (2.0 * 4096.0 * weights + attention)).abs() < 1.0);
        let head = s.work("student: head (logits)").unwrap();
        assert_eq!(head.flops, 2.0 * 4096.0 * 2048.0 * 128_256.0);
        // At an H100's limits the 1B student's forward over 4096 tokens is compute-bound
        // and takes about 10 ms.
        let at = Limits::h100().seconds(body);
        assert!(at > 0.005 && at < 0.02, "{at}");
    }

    #[test]
    fn teachers_are_found_by_name_and_other_phases_have_no_roofline() {
        let s = shape();
        assert!(s.work("teacher qwen: forward").unwrap().flops > 1e13);
        let top_k = s.work("teacher qwen: top-K").unwrap();
        assert_eq!(
            top_k.bytes,
            2.0 * 4096.0 * 151_936.0 + 4096.0 * 8192.0 * 8.0
        );
        assert!(s.work("loss: teacher qwen").is_some());
        assert!(s.work("loss: teacher other").is_none());
        assert!(s.work("data wait").is_none());
        assert!(s.work("gradient exchange").is_none());
        let adamw = s.work("student: clipping + AdamW").unwrap();
        assert_eq!(adamw.bytes, 32.0 * s.student.num_parameters() as f64);
    }
}
