//! Scoring text: the log-probability of each observed token under a model's logits, as
//! benchmarks and graders read it.
//!
//! `log p(t) = z_t − log Σ_v exp(z_v)`, whose normaliser sums 128k–200k terms. Summed one term
//! after another in f32, as burn's ndarray backend sums a row, each small term is rounded
//! against a large running total and the sum comes out too small: tokens come out up to ~2e-4
//! too likely, always in that direction. Here the terms are summed in blocks of [`BLOCK`], the
//! block sums again in blocks, and so on: no running total holds more than [`BLOCK`] terms, and
//! the bias falls below f32's rounding of one term. A GPU's tree reduction gets the same blocks.
//! The last subtraction and the logarithm are taken in f64.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData};

use crate::error::{ModelError, Result};

/// Terms per running total in the normaliser's sum.
pub const BLOCK: usize = 64;

/// The observed tokens' log-probabilities, and whether each is its row's most likely token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenScores {
    /// `log p(token)` in nats, per row.
    pub log_probs: Vec<f64>,
    /// Whether the row's token is its argmax (the first, at a tie).
    pub greedy: Vec<bool>,
}

/// `log softmax(logits)[r, tokens[r]]` for each row `r` of `logits` `[rows, vocab]` (any float
/// dtype; summed in f32), and whether `tokens[r]` is row `r`'s argmax.
pub fn token_log_probs<B: Backend>(logits: Tensor<B, 2>, tokens: &[u32]) -> Result<TokenScores> {
    let [rows, vocab] = logits.dims();
    if tokens.len() != rows {
        return Err(ModelError::Scoring(format!(
            "{} tokens to score against {rows} rows of logits",
            tokens.len()
        )));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::Scoring(format!(
            "token {bad} lies outside the vocabulary of {vocab}"
        )));
    }
    if rows == 0 {
        return Ok(TokenScores {
            log_probs: Vec::new(),
            greedy: Vec::new(),
        });
    }
    let device = logits.device();
    let logits = logits.cast(DType::F32);
    let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, 1]), &device);
    let max = logits.clone().max_dim(1);
    let argmax = logits.clone().argmax(1);
    let picked = logits.clone().gather(1, ids) - max.clone();
    let sum = blocked_row_sum((logits - max).exp());
    let picked = read_f64(picked, "the tokens' logits")?;
    let sum = read_f64(sum, "the normalisers")?;
    let argmax = argmax
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| ModelError::Scoring(format!("reading the argmax: {e:?}")))?;
    Ok(TokenScores {
        log_probs: picked.iter().zip(&sum).map(|(z, s)| z - s.ln()).collect(),
        greedy: argmax
            .iter()
            .zip(tokens)
            .map(|(&a, &t)| a == t as i64)
            .collect(),
    })
}

/// Each row's sum `[rows, 1]` of non-negative `terms` `[rows, width]`, in levels of blocks of
/// [`BLOCK`] terms (the last block padded with zeros).
fn blocked_row_sum<B: Backend>(mut terms: Tensor<B, 2>) -> Tensor<B, 2> {
    let [rows, mut width] = terms.dims();
    while width > BLOCK {
        let blocks = width.div_ceil(BLOCK);
        let padded = blocks * BLOCK;
        if padded > width {
            // Zeros of the terms' own dtype (the backend's default float may be another).
            let zeros = terms
                .clone()
                .slice([0..rows, 0..padded - width])
                .zeros_like();
            terms = Tensor::cat(vec![terms, zeros], 1);
        }
        terms = terms
            .reshape([rows, blocks, BLOCK])
            .sum_dim(2)
            .reshape([rows, blocks]);
        width = blocks;
    }
    terms.sum_dim(1)
}

fn read_f64<B: Backend>(values: Tensor<B, 2>, what: &str) -> Result<Vec<f64>> {
    values
        .into_data()
        .convert::<f64>()
        .into_vec::<f64>()
        .map_err(|e| ModelError::Scoring(format!("reading {what}: {e:?}")))
}
