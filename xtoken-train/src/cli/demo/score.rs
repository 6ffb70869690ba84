//! Scoring a model of the demo on held-out problems: greedy answers, and next-token accuracy on
//! the answers' numeral tokens.

use std::path::Path;

use anyhow::{anyhow, Result};
use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use xtoken_core::vocab::Vocabulary;
use xtoken_models::{CausalLm, Transformer};

use super::corpus::Problem;

/// A model directory with its tokenizer, for evaluation on the CPU.
struct Evaluated {
    model: Transformer<NdArray>,
    tokenizer: tokenizers::Tokenizer,
    /// Per token id: whether it is a numeral (digits after an optional space).
    is_numeral: Vec<bool>,
}

impl Evaluated {
    fn load(model_dir: &Path) -> Result<Self> {
        let model = Transformer::<NdArray>::load(model_dir, &Default::default())?;
        let vocab = Vocabulary::load(model_dir)?;
        let is_numeral = vocab
            .tokens()
            .iter()
            .map(|t| {
                let digits = t.bytes.strip_prefix(b" ").unwrap_or(&t.bytes);
                !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
            })
            .collect();
        Ok(Self {
            model,
            tokenizer: vocab.tokenizer().clone(),
            is_numeral,
        })
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, false)
            .map_err(|e| anyhow!("{e}"))?
            .get_ids()
            .to_vec())
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| anyhow!("{e}"))
    }

    /// The most probable next token at every position.
    fn argmax(&self, ids: &[u32]) -> Result<Vec<u32>> {
        let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
        let n = ids.len();
        let input =
            Tensor::<NdArray, 2, Int>::from_data(TensorData::new(ids, [1, n]), &Default::default());
        let logits = self.model.forward(input, None)?;
        let argmax = logits.argmax(2).into_data().convert::<i64>();
        Ok(argmax
            .to_vec::<i64>()
            .map_err(|e| anyhow!("{e:?}"))?
            .into_iter()
            .map(|i| i as u32)
            .collect())
    }

    /// Teacher-forced: `(right, total)` over the numeral tokens of the answer (the question's
    /// numerals are random, so nothing can predict them).
    fn numerals(&self, prompt: &str, answer: &str) -> Result<(usize, usize)> {
        let ids = self.encode(&format!("{prompt}{answer}\n"))?;
        let prompt_len = self.encode(prompt)?.len();
        let predicted = self.argmax(&ids)?;
        let (mut right, mut total) = (0, 0);
        for p in prompt_len.saturating_sub(1)..ids.len() - 1 {
            if self
                .is_numeral
                .get(ids[p + 1] as usize)
                .copied()
                .unwrap_or(false)
            {
                total += 1;
                right += usize::from(predicted[p] == ids[p + 1]);
            }
        }
        Ok((right, total))
    }

    /// Whether greedy decoding after the prompt gives the answer.
    fn answers(&self, prompt: &str, answer: &str) -> Result<bool> {
        let mut ids = self.encode(prompt)?;
        let start = ids.len();
        for _ in 0..6 {
            let next = *self.argmax(&ids)?.last().unwrap_or(&0);
            ids.push(next);
            let text = self.decode(&ids[start..])?;
            if text.contains('\n') || text.trim().len() > answer.trim().len() {
                break;
            }
        }
        let text = self.decode(&ids[start..])?;
        let given: String = text
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Ok(given == answer.trim())
    }
}

/// A model's scores on the held-out problems.
#[derive(Debug, Clone, Copy, Default)]
pub struct Score {
    /// Share of problems answered right by greedy decoding.
    pub answer_accuracy: f64,
    /// Teacher-forced next-token accuracy on the answers' numeral tokens.
    pub numeral_accuracy: f64,
}

/// Scores the model in `model_dir` on `held_out`.
pub fn evaluate(model_dir: &Path, held_out: &[Problem]) -> Result<Score> {
    let model = Evaluated::load(model_dir)?;
    let (mut numeral_total, mut numeral_right) = (0usize, 0usize);
    let mut right = 0;
    for (prompt, answer) in held_out {
        let (r, total) = model.numerals(prompt, answer)?;
        numeral_right += r;
        numeral_total += total;
        right += usize::from(model.answers(prompt, answer)?);
    }
    let share = |r: usize, n: usize| r as f64 / n.max(1) as f64;
    Ok(Score {
        answer_accuracy: share(right, held_out.len()),
        numeral_accuracy: share(numeral_right, numeral_total),
    })
}
