//! A teacher served over HTTP (`teachers[].server`): a vLLM server, or `xtoken serve`, asked
//! for each packed row's per-position top-K through the OpenAI-compatible `/v1/completions`
//! with vLLM's `prompt_logprobs`, and the answers merged as stored entries are.
//!
//! A served teacher reads each packed row whole, earlier documents included, exactly as the
//! in-process teacher does: so at f32 and equal top-K its entries are the in-process teacher's.
//! Its log-probabilities are at τ = 1 (what a server gives), so a run with a served teacher
//! keeps `loss.temperature = 1`.
//!
//! **Faults.** A request that times out, cannot connect or gets a 5xx is sent again after
//! 0.5 s, 1 s, 2 s, … (at most 8 s apart), `retries` times; then the run ends with an error
//! naming the server and its last answer. A 4xx, an answer that cannot be read, one for another
//! model or with token ids past the teacher's vocabulary ends it at once. The loader merges a
//! step's answers before the step is handed to training, so no step trains on a missing answer.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use xtoken_core::plan::BatchPlan;
use xtoken_core::vocab::Vocabulary;
use xtoken_kernels::host::{HostEntries, PositionTargets};
use xtoken_kernels::ConfidenceStats;

use super::answer::{self, PromptLogprobs, BINARY};
use super::merge::continuation_shifts;
pub use crate::config::{Format, ServedSettings};
use crate::error::{Error, Result};

/// Throughput of a served teacher since it was connected.
#[derive(Debug, Default)]
pub struct ServedStats {
    tokens: AtomicU64,
    bytes: AtomicU64,
    busy_nanos: AtomicU64,
    requests: AtomicU64,
}

impl ServedStats {
    /// Prompt tokens answered, answer bytes received, seconds spent waiting for answers (over
    /// the loader's steps, not their sum over requests) and requests answered.
    pub fn read(&self) -> (u64, u64, f64, u64) {
        (
            self.tokens.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            self.busy_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            self.requests.load(Ordering::Relaxed),
        )
    }
}

/// A connected served teacher.
pub struct ServedTeacher {
    settings: ServedSettings,
    base: String,
    k: usize,
    width: usize,
    binary: bool,
    agent: ureq::Agent,
    /// Its throughput so far.
    pub stats: ServedStats,
}

/// What a served teacher said of itself when connected.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// Every model the server lists.
    pub models: Vec<String>,
    /// The most prompt log-probabilities per position it gives, where it says (`xtoken serve`).
    pub max_logprobs: Option<usize>,
    /// The positions it serves per prompt, where it says.
    pub max_model_len: Option<usize>,
    /// Whether it answers in xtoken's binary layout.
    pub binary: bool,
}

#[derive(Deserialize)]
struct Models {
    data: Vec<ModelCard>,
}

#[derive(Deserialize)]
struct ModelCard {
    id: String,
    max_model_len: Option<usize>,
    max_logprobs: Option<usize>,
    #[serde(default)]
    answer_formats: Vec<String>,
}

#[derive(Deserialize)]
struct Completion {
    model: Option<String>,
    choices: Vec<Choice>,
}

#[derive(Deserialize)]
struct Choice {
    prompt_logprobs: Option<PromptLogprobs>,
}

/// Why an attempt failed: worth sending again, or not.
enum Failed {
    Again(String),
    Stop(String),
}

/// The first `n` characters of a body, for an error message.
fn excerpt(text: &str) -> String {
    let cut: String = text.chars().take(300).collect();
    if cut.len() < text.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

impl ServedTeacher {
    /// Connects to `settings.server`: its model list must hold `settings.model`; answers are
    /// read at top-`k` for a teacher of `width` token ids.
    pub fn connect(settings: ServedSettings, k: usize, width: usize) -> Result<(Self, ServerInfo)> {
        let base = settings.server.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::Config(format!(
                "teacher {}: server = {:?}: expected an http:// or https:// address (the API's \
                 base, e.g. http://host:8000/v1)",
                settings.name, settings.server
            )));
        }
        // One connection kept open per request in flight.
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10).min(settings.timeout))
            .timeout(settings.timeout)
            .max_idle_connections_per_host(settings.requests.max(1))
            .build();
        let mut teacher = Self {
            base,
            k,
            width,
            binary: false,
            agent,
            settings,
            stats: ServedStats::default(),
        };
        let info = teacher.server_info()?;
        teacher.binary = info.binary && teacher.settings.format == Format::Negotiate;
        Ok((teacher, info))
    }

    fn name(&self) -> &str {
        &self.settings.name
    }

    /// The answers' entries per position.
    pub fn top_k(&self) -> usize {
        self.k
    }

    /// Whether answers come in the binary layout.
    pub fn binary(&self) -> bool {
        self.binary
    }

    /// `/models`, with retries: the server's models, and the run's among them.
    fn server_info(&self) -> Result<ServerInfo> {
        let url = format!("{}/models", self.base);
        let body = self.with_retries(&url, || {
            let response = self.agent.get(&url).call();
            read_response(response).map(|(_, bytes)| bytes)
        })?;
        let models: Models = serde_json::from_slice(&body).map_err(|e| {
            Error::Served(format!(
                "teacher {}: {url} answered what is not a model list ({e}): {}",
                self.name(),
                excerpt(&String::from_utf8_lossy(&body))
            ))
        })?;
        let ids: Vec<String> = models.data.iter().map(|m| m.id.clone()).collect();
        let Some(card) = models.data.iter().find(|m| m.id == self.settings.model) else {
            return Err(Error::Served(format!(
                "teacher {}: {} serves {ids:?}, not served_model = {:?}",
                self.name(),
                self.base,
                self.settings.model
            )));
        };
        Ok(ServerInfo {
            max_logprobs: card.max_logprobs,
            max_model_len: card.max_model_len,
            binary: card.answer_formats.iter().any(|f| f == BINARY),
            models: ids,
        })
    }

    /// Sends `attempt` until it succeeds, fails for good, or `retries` more tries failed.
    fn with_retries<T>(
        &self,
        url: &str,
        attempt: impl Fn() -> std::result::Result<T, Failed>,
    ) -> Result<T> {
        let started = Instant::now();
        let mut last = String::new();
        for tried in 0..=self.settings.retries {
            if tried > 0 {
                let wait = Duration::from_millis(500 << (tried - 1).min(4));
                tracing::warn!(
                    "teacher {}: {url}: {last}; sending it again in {:.1} s ({tried} of {})",
                    self.name(),
                    wait.as_secs_f64(),
                    self.settings.retries
                );
                std::thread::sleep(wait);
            }
            match attempt() {
                Ok(value) => return Ok(value),
                Err(Failed::Again(why)) => last = why,
                Err(Failed::Stop(why)) => {
                    return Err(Error::Served(format!(
                        "teacher {}: {url}: {why}",
                        self.name()
                    )))
                }
            }
        }
        Err(Error::Served(format!(
            "teacher {}: {url} did not answer in {} tries over {:.0} s; the last: {last}",
            self.name(),
            self.settings.retries + 1,
            started.elapsed().as_secs_f64()
        )))
    }

    /// The served teacher's targets for `prompt` (positions `0..prompt.len() − 1`).
    pub fn answer(&self, prompt: &[u32]) -> Result<PositionTargets> {
        let url = format!("{}/completions", self.base);
        let request = serde_json::json!({
            "model": self.settings.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": self.k,
        })
        .to_string();
        let accept = if self.binary {
            BINARY
        } else {
            "application/json"
        };
        let (targets, bytes) = self.with_retries(&url, || {
            let response = self
                .agent
                .post(&url)
                .set("Content-Type", "application/json")
                .set("Accept", accept)
                .send_string(&request);
            let (kind, body) = read_response(response)?;
            let targets = self
                .read_answer(prompt, &kind, &body)
                .map_err(Failed::Stop)?;
            Ok((targets, body.len()))
        })?;
        self.stats
            .tokens
            .fetch_add(prompt.len() as u64, Ordering::Relaxed);
        self.stats.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        Ok(targets)
    }

    /// Reads an answer of media type `kind`; what cannot be used is said with the body's start.
    fn read_answer(
        &self,
        prompt: &[u32],
        kind: &str,
        body: &[u8],
    ) -> std::result::Result<PositionTargets, String> {
        let garbage = |why: String| {
            format!(
                "answered what cannot be used ({why}): {}",
                excerpt(&String::from_utf8_lossy(body))
            )
        };
        let (model, targets) = if kind.starts_with(BINARY) {
            let (model, t) = answer::decode_binary(body).map_err(garbage)?;
            let (n, k) = (prompt.len().saturating_sub(1), t.k);
            if t.observed.len() != n || k != self.k {
                let why = format!(
                    "{} positions of top-{k}, asked for {n} of top-{}",
                    t.observed.len(),
                    self.k
                );
                return Err(garbage(why));
            }
            if let Some(&id) = t.ids.iter().find(|&&id| id as usize >= self.width) {
                return Err(garbage(format!(
                    "token id {id}, past the teacher tokenizer's {} ids",
                    self.width
                )));
            }
            (Some(model), t)
        } else {
            let c: Completion = serde_json::from_slice(body).map_err(|e| garbage(e.to_string()))?;
            let list = c
                .choices
                .into_iter()
                .next()
                .and_then(|c| c.prompt_logprobs)
                .ok_or_else(|| garbage("no choices[0].prompt_logprobs".into()))?;
            let t =
                answer::from_prompt_logprobs(prompt, &list, self.k, self.width).map_err(garbage)?;
            (c.model, t)
        };
        match model {
            Some(m) if m != self.settings.model => Err(format!(
                "answered for model {m:?}, the run asks {:?} (the server changed its model?)",
                self.settings.model
            )),
            _ => Ok(targets),
        }
    }

    /// The answers for every prompt, `requests` in flight at once; the first failure ends the
    /// others and is returned.
    pub fn answers(&self, prompts: &[Vec<u32>]) -> Result<Vec<PositionTargets>> {
        let started = Instant::now();
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let threads = self.settings.requests.clamp(1, prompts.len().max(1));
        let parts: Vec<Result<Vec<(usize, PositionTargets)>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        while !stop.load(Ordering::Relaxed) {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(prompt) = prompts.get(i) else { break };
                            match self.answer(prompt) {
                                Ok(t) => mine.push((i, t)),
                                Err(e) => {
                                    stop.store(true, Ordering::Relaxed);
                                    return Err(e);
                                }
                            }
                        }
                        Ok(mine)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Served("a request thread panicked".into())))
                })
                .collect()
        });
        let mut out: Vec<Option<PositionTargets>> = vec![None; prompts.len()];
        for part in parts {
            for (i, t) in part? {
                out[i] = Some(t);
            }
        }
        let nanos = started.elapsed().as_nanos() as u64;
        self.stats.busy_nanos.fetch_add(nanos, Ordering::Relaxed);
        out.into_iter()
            .map(|t| t.ok_or_else(|| Error::Served("a prompt went unanswered".into())))
            .collect()
    }

    /// Checks the run's teacher tokenizer against the server's on a probe prompt (`text` as
    /// `vocab` encodes it): every entry's token text must be the tokenizer's for that id (both
    /// without leading spaces, where neither is a partial character). Returns the probe's
    /// positions and the entries compared.
    pub fn probe(&self, vocab: &Vocabulary, text: &str) -> Result<(usize, usize)> {
        let ids = vocab.encode(text).map_err(|e| {
            Error::Served(format!("teacher {}: encoding the probe: {e}", self.name()))
        })?;
        let url = format!("{}/completions", self.base);
        let request = serde_json::json!({
            "model": self.settings.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": self.k,
        })
        .to_string();
        let body = self.with_retries(&url, || {
            let response = self
                .agent
                .post(&url)
                .set("Content-Type", "application/json")
                .send_string(&request);
            read_response(response).map(|(_, body)| body)
        })?;
        let list = serde_json::from_slice::<Completion>(&body)
            .ok()
            .and_then(|c| c.choices.into_iter().next())
            .and_then(|c| c.prompt_logprobs)
            .ok_or_else(|| {
                Error::Served(format!(
                    "teacher {}: {url}: the probe's answer has no prompt_logprobs: {}",
                    self.name(),
                    excerpt(&String::from_utf8_lossy(&body))
                ))
            })?;
        let mut compared = 0;
        for (at, entries) in list.iter().enumerate() {
            for (key, e) in entries.iter().flatten() {
                let (Ok(id), Some(theirs)) = (key.parse::<u32>(), &e.decoded_token) else {
                    continue;
                };
                let ours = vocab.tokenizer().decode(&[id], false).unwrap_or_default();
                let partial = |s: &str| s.contains('\u{fffd}');
                if partial(&ours) || partial(theirs) {
                    continue;
                }
                if ours.trim_start() != theirs.trim_start() {
                    return Err(Error::Served(format!(
                        "teacher {}: the server's token {id} is {theirs:?} (probe position \
                         {at}), the teacher tokenizer {} reads it as {ours:?}: the tokenizer is \
                         not the served model's",
                        self.name(),
                        vocab.path().display()
                    )));
                }
                compared += 1;
            }
        }
        Ok((list.len(), compared))
    }
}

/// The media type and body of a response; a status, transport error or cut body says whether
/// it is worth sending again.
fn read_response(
    response: std::result::Result<ureq::Response, ureq::Error>,
) -> std::result::Result<(String, Vec<u8>), Failed> {
    let read = |r: ureq::Response| -> std::result::Result<(String, Vec<u8>), String> {
        let kind = r.content_type().to_string();
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut r.into_reader(), &mut body)
            .map_err(|e| format!("its answer was cut off: {e}"))?;
        Ok((kind, body))
    };
    match response {
        Ok(r) => read(r).map_err(Failed::Again),
        Err(ureq::Error::Status(code, r)) => {
            let body = read(r).map(|(_, b)| String::from_utf8_lossy(&b).into_owned());
            let why = format!("HTTP {code}: {}", excerpt(&body.unwrap_or_default()));
            Err(if code >= 500 || code == 429 {
                Failed::Again(why)
            } else {
                Failed::Stop(why)
            })
        }
        Err(ureq::Error::Transport(t)) => Err(Failed::Again(t.to_string())),
    }
}

/// The teacher entries of a micro-batch laid out by `plan` (rows of `len` teacher positions)
/// from the served answers of its rows (`answers[b]` over row `b`'s first `lens[b]` tokens), as
/// the in-process teacher merges its logits: per compared chunk slot, the first `k` entries of
/// its predicting position shifted by the log-probabilities of its continuation. With
/// `confidence`, adaptive weighting's batch means over the positions with a next token.
pub fn entries(
    plan: &mut BatchPlan,
    answers: &[PositionTargets],
    lens: &[usize],
    k: usize,
    confidence: Option<&[i32]>,
) -> HostEntries {
    let len = plan.teacher_len;
    let at = |r: usize| -> Option<(&PositionTargets, usize)> {
        let (b, p) = (r / len, r % len);
        (p + 1 < *lens.get(b)?).then(|| (&answers[b], p))
    };
    let sigma = continuation_shifts(plan, |row| at(row).map(|(a, p)| a.observed[p]));
    let (slots, side) = (plan.batch * plan.chunks, &plan.teacher);
    let mut out = HostEntries {
        ids: vec![0; slots * k],
        logp: vec![f32::NEG_INFINITY; slots * k],
        k,
        confidence: None,
    };
    for (slot, &shift) in sigma.iter().enumerate() {
        let found = (plan.chunk_mask[slot] > 0.0)
            .then(|| at(side.predict_row[slot] as usize))
            .flatten();
        let Some((a, p)) = found else {
            plan.chunk_mask[slot] = 0.0;
            continue;
        };
        let from = p * a.k;
        let ids = &mut out.ids[slot * k..(slot + 1) * k];
        let logp = &mut out.logp[slot * k..(slot + 1) * k];
        for (j, (id, value)) in ids.iter_mut().zip(logp.iter_mut()).enumerate() {
            *id = a.ids[from + j];
            *value = (a.logp[from + j] as f64 + shift) as f32;
        }
    }
    if let Some(next) = confidence {
        let (mut sums, mut count) = ((0.0f64, 0.0f64, 0.0f64), 0usize);
        for (r, &y) in next.iter().enumerate() {
            let Some((a, p)) = at(r).filter(|_| y >= 0) else {
                continue;
            };
            sums.0 += a.neg_ce[p] as f64;
            sums.1 += a.neg_entropy[p];
            sums.2 += a.max_prob[p] as f64;
            count += 1;
        }
        let n = count.max(1) as f64;
        out.confidence = Some(ConfidenceStats {
            neg_cross_entropy: sums.0 / n,
            neg_entropy: sums.1 / n,
            max_prob: sums.2 / n,
            positions: count,
        });
    }
    out
}
