//! Decoding with a key/value cache: each layer keeps the rotated keys and the values of every
//! position seen so far, so generating a token costs one position's forward pass instead of the
//! whole sequence's.
//!
//! Rows of a batch may hold prompts of different lengths: they are padded on the **left**, and
//! each row's positions count from its first real token, so a row's logits do not depend on
//! its neighbours. Padded slots are hidden from every query.
//!
//! A sliding-window layer keeps only the last `window − 1` slots after each call (all the next
//! query can see), so its cache stays bounded however long the generation runs.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor};
use xtoken_kernels::XTokenBackend;

use crate::error::{ModelError, Result};
use crate::masking::Masking;
use crate::model::{check_ids, ByWindow, DecoderLayer, Transformer};

/// The keys and values of one batch of rows, for every layer.
#[derive(Clone, Debug)]
pub struct KvCache<B: Backend> {
    /// Per layer: keys and values `[rows, kv_heads, slots, head_dim]`.
    layers: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
    /// Per row: the slot of its first real token (the left padding before it).
    starts: Vec<usize>,
    slots: usize,
    /// Slots the sliding-window layers have dropped from their front.
    dropped: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for rows whose first `starts[r]` slots will be left padding.
    pub fn new(starts: Vec<usize>) -> Self {
        KvCache {
            layers: Vec::new(),
            starts,
            slots: 0,
            dropped: 0,
        }
    }

    /// The rows it holds.
    pub fn rows(&self) -> usize {
        self.starts.len()
    }

    /// Slots filled so far (padding included).
    pub fn len(&self) -> usize {
        self.slots
    }

    /// Whether nothing has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.slots == 0
    }

    /// The position (0 at a row's first real token) of slot `past + i` in each row, `[rows, n]`
    /// row-major; padding slots read 0 (they are masked).
    fn positions(&self, n: usize) -> Vec<usize> {
        let past = self.slots;
        self.starts
            .iter()
            .flat_map(|&start| (0..n).map(move |i| (past + i).saturating_sub(start)))
            .collect()
    }

    /// For burn's attention (decoding keeps no graph, and burn's forward is fused):
    /// `[rows, 1, n, past + n]`, `true` where a new query may not see a key: the future, left
    /// padding and keys beyond the sliding window. No mask (with whether plain causal masking
    /// applies) when no key needs hiding beyond that.
    ///
    /// `dropped` slots are gone from the front of the layer's keys (a sliding layer's).
    fn mask(
        &self,
        n: usize,
        window: Option<usize>,
        dropped: usize,
        device: &B::Device,
    ) -> Masking<B> {
        let keys = self.slots + n - dropped;
        let window = window.filter(|&w| w < keys);
        let padded = self.starts.iter().any(|&s| s > dropped);
        let past = keys - n;
        if !padded && window.is_none() && (past == 0 || n == 1) {
            // A fresh pass is causal; a single new query sees every cached key.
            return Masking::Burn {
                mask: None,
                causal: past == 0,
            };
        }
        let starts = &self.starts;
        let left_padding = |row: usize, key: usize| key + dropped < starts[row];
        Masking::burn_mask(self.rows(), (n, keys), window, left_padding, device)
    }

    /// Drops a sliding layer's keys that no later query sees: it keeps the last `window − 1`.
    fn trim(kv: &mut Option<(Tensor<B, 4>, Tensor<B, 4>)>, keep: usize) {
        if let Some((k, v)) = kv.take() {
            let slots = k.dims()[2];
            let from = slots.saturating_sub(keep);
            *kv = Some((
                k.narrow(2, from, slots - from),
                v.narrow(2, from, slots - from),
            ));
        }
    }
}

impl<B: XTokenBackend> DecoderLayer<B> {
    fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        rotation: (&Tensor<B, 4>, &Tensor<B, 4>),
        masking: &Masking<B>,
        cache: &mut Option<(Tensor<B, 4>, Tensor<B, 4>)>,
        compute: DType,
    ) -> Result<Tensor<B, 3>> {
        let attention = &self.self_attn;
        let (q, k, v) =
            attention.rotated(self.input_norm(x.clone()), rotation.0, rotation.1, compute);
        let (k, v) = match cache.take() {
            Some((past_k, past_v)) => (
                Tensor::cat(vec![past_k, k], 2),
                Tensor::cat(vec![past_v, v], 2),
            ),
            None => (k, v),
        };
        *cache = Some((k.clone(), v.clone()));
        let attended = attention.attend(q, k, v, masking, compute)?;
        Ok(self.after_attention(x, attended, compute))
    }
}

impl<B: XTokenBackend> Transformer<B> {
    /// Feeds `ids` `[rows, n]` after what `cache` holds and returns their hidden states after
    /// the final norm, `[rows, n, hidden]`; the cache then holds them too. The first call is
    /// the prompt (left-padded as the cache's `starts` say), each later one the next tokens.
    pub fn forward_cached(
        &self,
        ids: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
    ) -> Result<Tensor<B, 3>> {
        let architecture = &self.architecture;
        let [rows, n] = ids.dims();
        if rows != cache.rows() || n == 0 {
            return Err(ModelError::Shape {
                what: "input ids",
                expected: format!("[{}, at least 1] like the cache's rows", cache.rows()),
                found: format!("{:?}", [rows, n]),
            });
        }
        let total = cache.len() + n;
        if total > architecture.max_position_embeddings {
            return Err(ModelError::TooLong {
                len: total,
                limit: architecture.max_position_embeddings,
            });
        }
        check_ids(architecture, &ids)?;
        let device = ids.device();
        let positions = cache.positions(n);
        let span = positions.iter().max().map_or(1, |&p| p + 1);
        let mut x = self.scaled_embeddings(self.embed_tokens.forward(ids));
        let dtype = x.dtype();
        let tables = ByWindow::tables(architecture, |rope| {
            let (cos, sin) = rope.tables_at::<B>(&positions, rows, span, &device);
            (cos.cast(dtype), sin.cast(dtype))
        });
        let masks = ByWindow::masking(architecture, |slides| match slides {
            true => cache.mask(n, architecture.sliding_window, cache.dropped, &device),
            false => cache.mask(n, None, 0, &device),
        });
        cache.layers.resize(self.layers.len(), None);
        let compute = self.compute_dtype();
        let kept = architecture.window_slots();
        for (i, (layer, kv)) in self.layers.iter().zip(cache.layers.iter_mut()).enumerate() {
            let slides = architecture.layer_window(i).is_some();
            let (cos, sin) = tables.get(slides);
            x = layer.forward_cached(x, (cos, sin), masks.get(slides), kv, compute)?;
            if let (true, Some(kept)) = (slides, kept) {
                KvCache::trim(kv, kept);
            }
        }
        cache.slots = total;
        if let Some(kept) = kept {
            cache.dropped = total.saturating_sub(kept).max(cache.dropped);
        }
        Ok(self.final_norm(x))
    }
}
