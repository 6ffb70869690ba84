//! Greedy decoding of a batch of prompts, with the key/value cache or (to check it, and to
//! measure what it saves) by recomputing every position at every step.

use burn::tensor::{Bool, Int, Tensor, TensorData};
use xtoken_kernels::XTokenBackend;

use crate::cache::KvCache;
use crate::error::{ModelError, Result};
use crate::model::Transformer;

/// How a batch is decoded.
#[derive(Clone, Copy, Debug)]
pub struct Greedy {
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
        settings: Greedy,
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
            let next = if settings.use_cache {
                self.next_cached(prompts, &generated, &mut cache, &device)?
            } else {
                self.next_recomputed(prompts, &generated, &device)?
            };
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

    /// The next token of every row through the cache: the left-padded prompts first, then the
    /// last token of each row.
    fn next_cached(
        &self,
        prompts: &[Vec<u32>],
        generated: &[Vec<u32>],
        cache: &mut Option<KvCache<B>>,
        device: &B::Device,
    ) -> Result<Vec<u32>> {
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
        let hidden = self.forward_cached(ids, cache)?.narrow(1, fed - 1, 1);
        self.argmax_rows(hidden)
    }

    /// The next token of every row from a full pass over prompt and generated tokens,
    /// right-padded.
    fn next_recomputed(
        &self,
        prompts: &[Vec<u32>],
        generated: &[Vec<u32>],
        device: &B::Device,
    ) -> Result<Vec<u32>> {
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
        self.argmax_rows(hidden.reshape([rows, 1, size]))
    }

    /// The likeliest token after each row's hidden state `[rows, 1, hidden]`.
    fn argmax_rows(&self, hidden: Tensor<B, 3>) -> Result<Vec<u32>> {
        let [rows, _, size] = hidden.dims();
        let logits = self.logits_of_rows(hidden.reshape([rows, size]));
        let tokens = logits
            .argmax(1)
            .into_data()
            .convert::<i64>()
            .into_vec::<i64>()
            .map_err(|e| ModelError::Shape {
                what: "next tokens",
                expected: "integer values".into(),
                found: format!("{e:?}"),
            })?;
        Ok(tokens.into_iter().map(|t| t as u32).collect())
    }
}
