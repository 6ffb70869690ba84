//! Decoding a batch of prompts, greedily or by sampling ([`Sampling`]), with the key/value
//! cache or (to check it, and to measure what it saves) by recomputing every position at every
//! step.

use burn::tensor::{Bool, Int, Tensor, TensorData};
use xtoken_kernels::XTokenBackend;

use crate::cache::KvCache;
use crate::error::{ModelError, Result};
use crate::model::{host_values, Transformer};
use crate::sampling::Sampling;

/// How far a batch is decoded, and how.
#[derive(Clone, Copy, Debug)]
pub struct Decoding {
    /// Tokens generated per prompt at most.
    pub max_new_tokens: usize,
    /// Decode through a [`KvCache`] (one position per step) instead of recomputing the whole
    /// sequence at every step.
    pub use_cache: bool,
}

impl<B: XTokenBackend> Transformer<B> {
    /// Greedily continues each prompt (token ids) until `stop(row, generated)` says so or
    /// `max_new_tokens` are generated; returns each row's generated ids (the stopping token
    /// included). Rows of different lengths are padded; a row's tokens do not depend on the
    /// others'.
    pub fn generate_greedy(
        &self,
        prompts: &[Vec<u32>],
        settings: Decoding,
        stop: impl FnMut(usize, &[u32]) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        self.decode(
            prompts,
            settings,
            |model, hidden| model.argmax_rows(hidden),
            stop,
        )
    }

    /// Continues each prompt by drawing every token from the model's distribution under
    /// `sampling`, row `r`'s draws taking their uniform numbers from `uniform(r)` (a seeded
    /// generator per row makes each row's text reproducible, whatever else shares the batch);
    /// stops as [`generate_greedy`](Self::generate_greedy) does. Each step's tempered softmax
    /// (in f32) runs on the device, and its rows are read to the host for the draws.
    pub fn generate_sampled(
        &self,
        prompts: &[Vec<u32>],
        settings: Decoding,
        sampling: Sampling,
        mut uniform: impl FnMut(usize) -> f64,
        stop: impl FnMut(usize, &[u32]) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        sampling.validate()?;
        let pick = |model: &Self, hidden: Tensor<B, 3>| {
            let rows = model.last_distribution(hidden, sampling)?;
            let width = rows.len() / prompts.len().max(1);
            rows.chunks(width.max(1))
                .enumerate()
                .map(|(row, values)| sampling.draw(values, uniform(row)))
                .collect()
        };
        self.decode(prompts, settings, pick, stop)
    }

    /// The decoding loop: `pick` turns the last positions' hidden states `[rows, 1, hidden]`
    /// into each row's next token. A finished row is still fed (its pick is dropped), so the
    /// batch keeps its shape.
    fn decode(
        &self,
        prompts: &[Vec<u32>],
        settings: Decoding,
        mut pick: impl FnMut(&Self, Tensor<B, 3>) -> Result<Vec<u32>>,
        mut stop: impl FnMut(usize, &[u32]) -> bool,
    ) -> Result<Vec<Vec<u32>>> {
        if prompts.iter().any(Vec::is_empty) {
            return Err(ModelError::Shape {
                what: "prompt",
                expected: "at least one token".into(),
                found: "none".into(),
            });
        }
        let rows = prompts.len();
        let mut generated = vec![Vec::new(); rows];
        let mut done = vec![false; rows];
        let device = self.embed_tokens.weight.device();
        let mut cache = None;
        for _ in 0..settings.max_new_tokens {
            if rows == 0 || done.iter().all(|&d| d) {
                break;
            }
            let hidden = if settings.use_cache {
                self.last_cached(prompts, &generated, &mut cache, &device)?
            } else {
                self.last_recomputed(prompts, &generated, &device)?
            };
            let next = pick(self, hidden)?;
            for (row, token) in next.into_iter().enumerate() {
                if done[row] {
                    continue;
                }
                generated[row].push(token);
                done[row] = stop(row, &generated[row]);
            }
        }
        Ok(generated)
    }

    /// The hidden state of every row's last position through the cache: the left-padded
    /// prompts first, then the last token of each row.
    fn last_cached(
        &self,
        prompts: &[Vec<u32>],
        generated: &[Vec<u32>],
        cache: &mut Option<KvCache<B>>,
        device: &B::Device,
    ) -> Result<Tensor<B, 3>> {
        let rows = prompts.len();
        let (ids, fed) = match cache {
            None => {
                let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
                let starts: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
                let mut ids = Vec::with_capacity(rows * width);
                for (prompt, &start) in prompts.iter().zip(&starts) {
                    ids.extend(std::iter::repeat_n(0, start));
                    ids.extend(prompt.iter().map(|&t| t as i64));
                }
                *cache = Some(KvCache::new(starts));
                (ids, width)
            }
            Some(_) => {
                // A finished row's last token is fed again; its output is not read.
                let last = generated
                    .iter()
                    .zip(prompts)
                    .map(|(g, p)| *g.last().or(p.last()).unwrap_or(&0) as i64)
                    .collect();
                (last, 1)
            }
        };
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, fed]), device);
        let cache = cache.as_mut().expect("set above");
        Ok(self.forward_cached(ids, cache)?.narrow(1, fed - 1, 1))
    }

    /// The hidden state of every row's last position from a full pass over prompt and generated
    /// tokens, right-padded.
    fn last_recomputed(
        &self,
        prompts: &[Vec<u32>],
        generated: &[Vec<u32>],
        device: &B::Device,
    ) -> Result<Tensor<B, 3>> {
        let rows = prompts.len();
        let lens: Vec<usize> = prompts
            .iter()
            .zip(generated)
            .map(|(p, g)| p.len() + g.len())
            .collect();
        let width = lens.iter().copied().max().unwrap_or(0);
        let mut ids = vec![0i64; rows * width];
        let mut padded = vec![true; rows * width];
        for (row, (p, g)) in prompts.iter().zip(generated).enumerate() {
            for (i, &t) in p.iter().chain(g).enumerate() {
                ids[row * width + i] = t as i64;
                padded[row * width + i] = false;
            }
        }
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, width]), device);
        let padding = padded.iter().any(|&p| p).then(|| {
            Tensor::<B, 2, Bool>::from_data(TensorData::new(padded, [rows, width]), device)
        });
        let hidden = self.hidden_states(ids, padding)?;
        let [_, _, size] = hidden.dims();
        let last: Vec<i64> = lens
            .iter()
            .enumerate()
            .map(|(row, &len)| (row * width + len - 1) as i64)
            .collect();
        let last = Tensor::<B, 1, Int>::from_data(TensorData::new(last, [rows]), device);
        let hidden = hidden.reshape([rows * width, size]).select(0, last);
        Ok(hidden.reshape([rows, 1, size]))
    }

    /// The likeliest token after each row's hidden state `[rows, 1, hidden]`.
    fn argmax_rows(&self, hidden: Tensor<B, 3>) -> Result<Vec<u32>> {
        let [rows, _, size] = hidden.dims();
        let logits = self.logits_of_rows(hidden.reshape([rows, size]));
        let tokens = host_values::<i64>(logits.argmax(1).into_data(), "next tokens", "integers")?;
        Ok(tokens.into_iter().map(|t| t as u32).collect())
    }

    /// What [`Sampling::draw`] reads after each row's hidden state `[rows, 1, hidden]`, as f32,
    /// row-major: the logits for a greedy draw, else `softmax(logits / temperature)`.
    fn last_distribution(&self, hidden: Tensor<B, 3>, sampling: Sampling) -> Result<Vec<f32>> {
        use burn::tensor::activation::softmax;
        use burn::tensor::FloatDType;
        let [rows, _, size] = hidden.dims();
        let logits = self
            .logits_of_rows(hidden.reshape([rows, size]))
            .cast(FloatDType::F32);
        let values = match sampling.greedy() {
            true => logits,
            false => softmax(logits / sampling.temperature, 1),
        };
        host_values::<f32>(
            values.into_data(),
            "next-token distribution",
            "float values",
        )
    }
}
