//! Drawing the next token from the model's distribution: temperature, nucleus (top-p)
//! truncation, and an inverse-CDF draw with a uniform number the caller supplies, so that a
//! seeded generator per row makes a sequence reproducible whatever else shares its batch.
//!
//! The tempered softmax is the device's work ([`Transformer::generate_sampled`] reads
//! `softmax(logits / T)` in f32); the host only walks the probabilities, so a row of a 128k
//! vocabulary costs one pass of additions, and the nucleus is found by partial selection, not
//! a sort of the whole row.
//!
//! [`Transformer::generate_sampled`]: crate::Transformer::generate_sampled

use std::cmp::Ordering;

use crate::error::{ModelError, Result};

/// How a token is drawn from the model's next-token distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 takes the likeliest token (greedy).
    pub temperature: f64,
    /// Draws from the smallest set of likeliest tokens whose probability reaches this (1: all).
    pub top_p: f64,
    /// Ids at or past this are never drawn: a checkpoint's embedding table is often padded past
    /// its tokenizer, and those rows stand for no text.
    pub vocab: usize,
}

/// The nucleus is looked for among this many likeliest ids first, then four times as many.
const FIRST_CANDIDATES: usize = 64;

impl Sampling {
    /// Checks the settings, naming the one at fault.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &'static str, expected: &str, found: f64| ModelError::Shape {
            what,
            expected: expected.into(),
            found: found.to_string(),
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(bad(
                "sampling temperature",
                "a finite value ≥ 0",
                self.temperature,
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("sampling top_p", "a value in (0, 1]", self.top_p));
        }
        if self.vocab == 0 {
            return Err(bad("sampling vocabulary", "at least one id", 0.0));
        }
        Ok(())
    }

    /// Whether the draw is greedy (temperature 0).
    pub fn greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The token drawn from one row with `u`, a uniform number in `[0, 1)`. The row is the
    /// logits when the draw is [`greedy`](Self::greedy) (the likeliest kept id is taken), else
    /// the tempered distribution `softmax(logits / temperature)`: the first id whose cumulative
    /// probability (likeliest first under top-p, else in id order) passes `u` times the kept
    /// mass, summed in f64.
    pub fn draw(&self, row: &[f32], u: f64) -> Result<u32> {
        let n = self.vocab.min(row.len());
        let row = &row[..n];
        if let Some(id) = row.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Shape {
                what: "next-token distribution",
                expected: "finite values".into(),
                found: format!("{} at id {id}", row[id]),
            });
        }
        let argmax = (0..n).reduce(|best, i| if row[i] > row[best] { i } else { best });
        let Some(argmax) = argmax else {
            return Err(ModelError::Shape {
                what: "next-token distribution",
                expected: "at least one id".into(),
                found: "none".into(),
            });
        };
        if self.greedy() {
            return Ok(argmax as u32);
        }
        let weight = |i: usize| f64::from(row[i]);
        let total: f64 = row.iter().map(|&p| f64::from(p)).sum();
        let order: Vec<usize> = match self.top_p < 1.0 {
            true => nucleus(row, self.top_p * total),
            false => (0..n).collect(),
        };
        let kept: f64 = order.iter().map(|&i| weight(i)).sum();
        let target = u.clamp(0.0, 1.0) * kept;
        let mut sum = 0.0;
        for &i in &order {
            sum += weight(i);
            if sum > target {
                return Ok(i as u32);
            }
        }
        // `u` at 1, or rounding at the end: the last kept id with any weight.
        let last = order.iter().rev().find(|&&i| weight(i) > 0.0);
        Ok(*last.unwrap_or(&argmax) as u32)
    }
}

/// The likeliest ids whose probabilities first reach `mass`, likeliest first (ties: the lower
/// id): the largest few are selected and sorted, and more only when they fall short.
fn nucleus(row: &[f32], mass: f64) -> Vec<usize> {
    let by = |a: &usize, b: &usize| match row[*b].total_cmp(&row[*a]) {
        Ordering::Equal => a.cmp(b),
        other => other,
    };
    let n = row.len();
    let mut order: Vec<usize> = (0..n).collect();
    let mut k = FIRST_CANDIDATES.min(n);
    loop {
        if k < n {
            order.select_nth_unstable_by(k - 1, by);
        }
        order[..k].sort_by(by);
        let mut sum = 0.0;
        let reached = order[..k].iter().position(|&i| {
            sum += f64::from(row[i]);
            sum >= mass
        });
        match reached {
            Some(p) => {
                order.truncate(p + 1);
                return order;
            }
            None if k == n => return order,
            None => k = (k * 4).min(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(temperature: f64, top_p: f64, vocab: usize) -> Sampling {
        Sampling {
            temperature,
            top_p,
            vocab,
        }
    }

    /// `softmax(logits / T)` in f64, as f32: what the device hands the draw.
    fn tempered(logits: &[f32], t: f64) -> Vec<f32> {
        let top = logits.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let exp: Vec<f64> = logits
            .iter()
            .map(|&v| ((v as f64 - top) / t).exp())
            .collect();
        let z: f64 = exp.iter().sum();
        exp.iter().map(|e| (e / z) as f32).collect()
    }

    /// The draws' frequencies over a fine grid of `u` are the softmax of the logits at the
    /// temperature, computed here by an independent f64 loop.
    #[test]
    fn draws_follow_the_tempered_softmax() {
        let logits = [1.0f32, 3.0, -2.0, 0.5, 2.0];
        for temperature in [0.5, 1.0, 2.0] {
            let s = sampling(temperature, 1.0, logits.len());
            let probs = tempered(&logits, temperature);
            let grid = 100_000;
            let mut counts = [0usize; 5];
            for k in 0..grid {
                let u = (k as f64 + 0.5) / grid as f64;
                counts[s.draw(&probs, u).unwrap() as usize] += 1;
            }
            let exp: Vec<f64> = logits
                .iter()
                .map(|&v| (v as f64 / temperature).exp())
                .collect();
            let z: f64 = exp.iter().sum();
            for (c, e) in counts.iter().zip(&exp) {
                let want = e / z;
                let got = *c as f64 / grid as f64;
                assert!(
                    (got - want).abs() < 1e-4,
                    "T {temperature}: {got} vs {want}"
                );
            }
        }
    }

    /// Top-p keeps the likeliest ids until their mass reaches p, and draws among them in
    /// proportion; temperature 0 is the argmax of the logits; ids past the vocabulary are
    /// never drawn, their mass left out.
    #[test]
    fn nucleus_greedy_and_the_vocabulary_limit() {
        // Probabilities 0.5, 0.3, 0.2 (ids 2, 0, 1), and a padding id of mass 0.5 more.
        let probs = [0.15f32, 0.1, 0.25, 0.5];
        let s = sampling(1.0, 0.75, 3);
        let mut counts = [0usize; 4];
        for k in 0..10_000 {
            counts[s.draw(&probs, (k as f64 + 0.5) / 1e4).unwrap() as usize] += 1;
        }
        assert_eq!(counts[1] + counts[3], 0, "{counts:?}");
        assert!((counts[2] as f64 / 1e4 - 0.625).abs() < 1e-3, "{counts:?}");
        let logits = [0.3f32.ln(), 0.2f32.ln(), 0.5f32.ln(), 100.0];
        assert_eq!(sampling(0.0, 1.0, 3).draw(&logits, 0.9).unwrap(), 2);
        assert_eq!(sampling(0.0, 1.0, 4).draw(&logits, 0.9).unwrap(), 3);
        assert_eq!(sampling(1.0, 1.0, 3).draw(&probs, 0.999_999).unwrap(), 2);
    }

    /// On a long row the nucleus found by partial selection is the one a full sort finds.
    #[test]
    fn the_nucleus_of_a_long_row_is_a_full_sorts() {
        let n = 5000;
        let mut state = 7u64;
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 12.0
            })
            .collect();
        let probs = tempered(&logits, 1.0);
        for top_p in [0.1, 0.5, 0.9, 0.99, 1.0 - 1e-7] {
            let total: f64 = probs.iter().map(|&p| p as f64).sum();
            let fast = nucleus(&probs, top_p * total);
            let mut sorted: Vec<usize> = (0..n).collect();
            sorted.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
            let mut sum = 0.0;
            let keep = sorted
                .iter()
                .position(|&i| {
                    sum += probs[i] as f64;
                    sum >= top_p * total
                })
                .map_or(n, |p| p + 1);
            assert_eq!(fast, sorted[..keep], "top_p {top_p}");
        }
    }

    #[test]
    fn bad_settings_and_rows_are_named() {
        let err = |s: Sampling| s.validate().unwrap_err().to_string();
        assert!(err(sampling(-1.0, 1.0, 3)).contains("temperature"));
        assert!(err(sampling(1.0, 0.0, 3)).contains("top_p"));
        assert!(err(sampling(1.0, 1.5, 3)).contains("top_p"));
        let e = sampling(1.0, 1.0, 3)
            .draw(&[0.0, f32::NAN, 1.0], 0.5)
            .unwrap_err();
        assert!(e.to_string().contains("NaN at id 1"), "{e}");
    }
}
