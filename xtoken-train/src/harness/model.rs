//! The model side of an evaluation: a student with its tokenizer and special tokens, and the
//! two requests lm-evaluation-harness makes of a model, log-likelihoods of continuations and
//! greedy generation, tokenized and batched as the harness does.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};
use tokenizers::Tokenizer;
use xtoken_kernels::XTokenBackend;
use xtoken_models::{token_log_probs, Decoding, Transformer};

use super::task::LogLikelihood;
use crate::error::{Error, Result};

/// A causal LM ready to be scored.
pub struct Scorable<'a, B: Backend> {
    /// The model.
    pub model: &'a Transformer<B>,
    /// Its tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Its special tokens.
    pub special: SpecialTokens,
    /// Sequences per forward pass.
    pub batch: usize,
    /// Tokens generated per prompt at most (the harness's `max_gen_toks`, 256).
    pub max_gen_toks: usize,
    /// Decode through the key/value cache.
    pub use_cache: bool,
}

/// The tokens the harness treats specially: the end of text (a stop for generation) and the
/// prefix an empty context is scored after.
#[derive(Clone, Debug, Default)]
pub struct SpecialTokens {
    /// Ids that end generation (`generation_config.json`'s and `config.json`'s
    /// `eos_token_id`, the tokenizer's `eos_token`).
    pub eos: Vec<u32>,
    /// The tokenizer's `eos_token` as text, a stop sequence of every generation.
    pub eos_text: Option<String>,
    /// BOS, else EOS: what an empty context is.
    pub prefix: Option<u32>,
    /// Whether decoded text gets transformers' `clean_up_tokenization` (`" ."` → `"."`, …):
    /// `clean_up_tokenization_spaces` in `tokenizer_config.json`, which transformers 5 ignores
    /// for BPE tokenizers (Llama-3, Qwen3, Phi-4's).
    pub clean_up_spaces: bool,
}

/// Reads a `tokenizer.json` as transformers uses it: without the truncation or padding the file
/// may configure (transformers sets its own per call, none by default).
pub fn read_tokenizer(path: &Path) -> Result<Tokenizer> {
    let file = xtoken_core::vocab::resolve_tokenizer_json(path)?;
    let mut tokenizer = Tokenizer::from_file(&file)
        .map_err(|e| Error::Data(format!("{}: not a readable tokenizer: {e}", file.display())))?;
    tokenizer
        .with_truncation(None)
        .map_err(|e| Error::Data(format!("{}: {e}", file.display())))?;
    tokenizer.with_padding(None);
    Ok(tokenizer)
}

/// transformers' `clean_up_tokenization`.
pub fn clean_up_tokenization(text: &str) -> String {
    [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ]
    .iter()
    .fold(text.to_string(), |text, (from, to)| text.replace(from, to))
}

impl SpecialTokens {
    /// Reads them from a model directory's `tokenizer_config.json`, `generation_config.json` and
    /// `config.json` (each optional).
    pub fn read(dir: &Path, tokenizer: &Tokenizer) -> Result<Self> {
        let json = |name: &str| -> Result<Option<serde_json::Value>> {
            let path = dir.join(name);
            if !path.is_file() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Error::Data(format!("{}: invalid JSON: {e}", path.display())))
        };
        let token = |config: &Option<serde_json::Value>, key: &str| {
            let value = config.as_ref()?.get(key)?;
            let text = value.as_str().or_else(|| value.get("content")?.as_str())?;
            Some((text.to_string(), tokenizer.token_to_id(text)?))
        };
        let tokenizer_config = json("tokenizer_config.json")?;
        let bos = token(&tokenizer_config, "bos_token");
        let eos = token(&tokenizer_config, "eos_token");
        let mut stops: Vec<u32> = eos.iter().map(|(_, id)| *id).collect();
        for name in ["generation_config.json", "config.json"] {
            if let Some(value) = json(name)?.and_then(|c| c.get("eos_token_id").cloned()) {
                let ids = match value {
                    serde_json::Value::Array(items) => items,
                    one => vec![one],
                };
                stops.extend(ids.iter().filter_map(|v| v.as_u64()).map(|v| v as u32));
            }
        }
        stops.sort_unstable();
        stops.dedup();
        let bpe = matches!(tokenizer.get_model(), tokenizers::ModelWrapper::BPE(_));
        let clean_up = tokenizer_config
            .as_ref()
            .and_then(|c| c.get("clean_up_tokenization_spaces")?.as_bool())
            .unwrap_or(false);
        Ok(SpecialTokens {
            clean_up_spaces: clean_up && !bpe,
            prefix: bos.as_ref().or(eos.as_ref()).map(|(_, id)| *id),
            eos_text: eos.map(|(text, _)| text),
            eos: stops,
        })
    }
}

/// One continuation to score: the model's input and which positions predict which tokens.
struct Scored {
    input: Vec<u32>,
    continuation: Vec<u32>,
}

impl<B: XTokenBackend> Scorable<'_, B> {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| Error::Data(format!("tokenizing {:?}: {e}", preview(text))))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn max_length(&self) -> usize {
        self.model.architecture.max_position_embeddings
    }

    /// The harness's split of a pair into tokens: the context's trailing spaces move to the
    /// continuation; the continuation's tokens are those of `context + continuation` past the
    /// context's own.
    pub fn encode_pair(&self, context: &str, continuation: &str) -> Result<(Vec<u32>, Vec<u32>)> {
        if context.is_empty() {
            let continuation = self
                .tokenizer
                .encode(continuation, false)
                .map_err(|e| Error::Data(format!("tokenizing {:?}: {e}", preview(continuation))))?
                .get_ids()
                .to_vec();
            let prefix = self.special.prefix.ok_or_else(|| {
                Error::Data(
                    "an empty context needs a BOS or EOS token; the tokenizer has neither".into(),
                )
            })?;
            return Ok(match continuation.first() {
                Some(&first) if first == prefix => (vec![first], continuation[1..].to_vec()),
                _ => (vec![prefix], continuation),
            });
        }
        let kept = context.trim_end();
        let moved = &context[kept.len()..];
        let whole = self.encode(&format!("{kept}{moved}{continuation}"))?;
        let context = self.encode(kept)?;
        let split = context.len().min(whole.len());
        Ok((context, whole[split..].to_vec()))
    }

    /// The log-likelihood (nats) of each continuation after its context, as the harness's
    /// `loglikelihood`: the pairs tokenized by [`encode_pair`](Self::encode_pair), then
    /// [`token_loglikelihoods`]. `progress` is told how many pairs each batch finished.
    pub fn loglikelihoods(
        &self,
        pairs: &[(String, String)],
        progress: impl FnMut(usize),
    ) -> Result<Vec<LogLikelihood>> {
        let tokens = pairs
            .iter()
            .map(|(context, continuation)| self.encode_pair(context, continuation))
            .collect::<Result<Vec<_>>>()?;
        token_loglikelihoods(self.model, self.batch, &tokens, progress)
    }

    /// Greedy generations after each context, as the harness's `generate_until`: the context
    /// left-truncated to leave room for `max_gen_toks`, generation ended by an EOS token or a
    /// stop sequence, the text (special tokens skipped) cut at its first stop sequence. Batched
    /// longest first; `progress` is told how many contexts each batch finished.
    pub fn generate(
        &self,
        requests: &[(String, Vec<String>)],
        mut progress: impl FnMut(usize),
    ) -> Result<Vec<String>> {
        let room = self.max_length().saturating_sub(self.max_gen_toks).max(1);
        let mut prompts = Vec::with_capacity(requests.len());
        for (context, _) in requests {
            let ids = self.encode(context)?;
            prompts.push(ids[ids.len().saturating_sub(room)..].to_vec());
        }
        let stops: Vec<Vec<String>> = requests
            .iter()
            .map(|(_, until)| {
                let mut until = until.clone();
                if let Some(eos) = &self.special.eos_text {
                    if !until.contains(eos) {
                        until.push(eos.clone());
                    }
                }
                until
            })
            .collect();
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by(|&a, &b| prompts[b].len().cmp(&prompts[a].len()).then(a.cmp(&b)));
        let mut out = vec![String::new(); requests.len()];
        for batch in order.chunks(self.batch.max(1)) {
            let batch_prompts: Vec<Vec<u32>> = batch.iter().map(|&i| prompts[i].clone()).collect();
            let settings = Decoding {
                max_new_tokens: self.max_gen_toks,
                use_cache: self.use_cache,
            };
            let generated = self
                .model
                .generate_greedy(&batch_prompts, settings, |row, ids| {
                    let last = ids.last().copied().unwrap_or(0);
                    if self.special.eos.contains(&last) {
                        return true;
                    }
                    // Decoded once per step, then searched for every stop sequence.
                    let text = self.decode(ids);
                    stops[batch[row]]
                        .iter()
                        .any(|s| !s.is_empty() && text.contains(s.as_str()))
                })?;
            for (&i, ids) in batch.iter().zip(generated) {
                out[i] = cut_at_stops(self.decode(&ids), &stops[i]);
            }
            progress(batch.len());
        }
        Ok(out)
    }

    fn decode(&self, ids: &[u32]) -> String {
        let text = self.tokenizer.decode(ids, true).unwrap_or_default();
        match self.special.clean_up_spaces {
            true => clean_up_tokenization(&text),
            false => text,
        }
    }
}

/// The log-likelihood (nats) of each `(context, continuation)` of token ids, as the harness's
/// `_loglikelihood_tokens`: inputs truncated on the left to the model's length, batched
/// longest first, padded on the right; pairs with the same input (MMLU's four letters) share
/// one pass. `progress` is told how many pairs each batch finished.
pub fn token_loglikelihoods<B: XTokenBackend>(
    model: &Transformer<B>,
    batch: usize,
    pairs: &[(Vec<u32>, Vec<u32>)],
    mut progress: impl FnMut(usize),
) -> Result<Vec<LogLikelihood>> {
    let max_length = model.architecture.max_position_embeddings;
    let mut scored = Vec::with_capacity(pairs.len());
    for (context, continuation) in pairs {
        if continuation.is_empty() || context.is_empty() {
            return Err(Error::Data(
                "a context or continuation tokenized to nothing".into(),
            ));
        }
        let whole: Vec<u32> = context.iter().chain(continuation).copied().collect();
        let keep = whole.len().min(max_length + 1);
        let input = whole[whole.len() - keep..whole.len() - 1].to_vec();
        scored.push(Scored {
            input,
            continuation: continuation.clone(),
        });
    }
    let mut inputs: HashMap<&[u32], Vec<usize>> = HashMap::new();
    for (i, s) in scored.iter().enumerate() {
        inputs.entry(s.input.as_slice()).or_default().push(i);
    }
    let mut unique: Vec<(&[u32], Vec<usize>)> = inputs.into_iter().collect();
    unique.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
    let mut out = vec![
        LogLikelihood {
            value: 0.0,
            greedy: true,
        };
        pairs.len()
    ];
    for chunk in unique.chunks(batch.max(1)) {
        score_batch(model, chunk, &scored, &mut out)?;
        progress(chunk.iter().map(|(_, users)| users.len()).sum());
    }
    Ok(out)
}

fn score_batch<B: XTokenBackend>(
    model: &Transformer<B>,
    batch: &[(&[u32], Vec<usize>)],
    scored: &[Scored],
    out: &mut [LogLikelihood],
) -> Result<()> {
    let device = model.embed_tokens.weight.device();
    let rows = batch.len();
    let width = batch
        .iter()
        .map(|(input, _)| input.len())
        .max()
        .unwrap_or(0);
    let mut ids = vec![0i64; rows * width];
    let mut padded = vec![true; rows * width];
    // (flat position, target token, request) of every scored token.
    let mut targets = Vec::new();
    for (row, (input, users)) in batch.iter().enumerate() {
        for (i, &t) in input.iter().enumerate() {
            ids[row * width + i] = t as i64;
            padded[row * width + i] = false;
        }
        for &user in users {
            let continuation = &scored[user].continuation;
            let first = input.len() + 1 - continuation.len();
            for (j, &token) in continuation.iter().enumerate() {
                targets.push((row * width + first + j - 1, token, user));
            }
        }
    }
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, width]), &device);
    let padding = padded
        .iter()
        .any(|&p| p)
        .then(|| Tensor::<B, 2, Bool>::from_data(TensorData::new(padded, [rows, width]), &device));
    let hidden = model.hidden_states(ids, padding)?;
    let size = hidden.dims()[2];
    let count = targets.len();
    let at: Vec<i64> = targets.iter().map(|&(p, _, _)| p as i64).collect();
    let tokens: Vec<u32> = targets.iter().map(|&(_, t, _)| t).collect();
    let at = Tensor::<B, 1, Int>::from_data(TensorData::new(at, [count]), &device);
    let hidden = hidden.reshape([rows * width, size]).select(0, at);
    // The harness's `is_greedy`: every continuation token is its row's argmax.
    let scores = token_log_probs(model.logits_of_rows(hidden), &tokens)?;
    let scored = scores.log_probs.iter().zip(&scores.greedy);
    for ((_, _, user), (lp, &top)) in targets.iter().zip(scored) {
        out[*user].value += lp;
        out[*user].greedy &= top;
    }
    Ok(())
}

/// The text before the first occurrence of any stop sequence.
pub fn cut_at_stops(mut text: String, stops: &[String]) -> String {
    for stop in stops.iter().filter(|s| !s.is_empty()) {
        if let Some(at) = text.find(stop.as_str()) {
            text.truncate(at);
        }
    }
    text
}

fn preview(text: &str) -> String {
    text.chars().take(60).collect()
}

/// A model loaded for evaluation, with its tokenizer and special tokens.
pub struct Loaded<B: Backend> {
    /// The model.
    pub model: Transformer<B>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its special tokens.
    pub special: SpecialTokens,
    /// What was loaded, for messages (`dir` or `checkpoint dir (step N)`).
    pub source: String,
}

impl<B: Backend> Loaded<B> {
    /// Loads a Hugging Face model directory with its tokenizer and special tokens. (A training
    /// checkpoint is read by `train::export::load_for_eval`, which ends here.)
    pub fn hub(path: &Path, dtype: burn::tensor::DType, device: &B::Device) -> Result<Self> {
        let options = xtoken_models::LoadOptions { dtype };
        let model = Transformer::<B>::load_with(path, options, device)
            .map_err(|e| Error::Data(format!("{}: {e}", path.display())))?;
        Self::with(model, path, path, path.display().to_string())
    }

    /// `model` with the tokenizer at `tokenizer` and the special tokens of the Hugging Face
    /// directory `model_dir`; `source` names it in messages.
    pub fn with(
        model: Transformer<B>,
        model_dir: &Path,
        tokenizer: &Path,
        source: String,
    ) -> Result<Self> {
        let tokenizer = read_tokenizer(tokenizer)?;
        let special = SpecialTokens::read(model_dir, &tokenizer)?;
        Ok(Loaded {
            model,
            tokenizer,
            special,
            source,
        })
    }
}
