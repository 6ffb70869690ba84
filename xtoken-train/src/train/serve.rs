//! `xtoken serve`: a teacher served once, on any device, to students anywhere — the subset of
//! vLLM's OpenAI-compatible API a served teacher is asked through (`GET /health`,
//! `GET /v1/models`, `POST /v1/completions` with a token-id prompt and `prompt_logprobs`), its
//! answers in vLLM's exact shape ([`crate::targets::answer`]), or in xtoken's compact binary
//! layout when the request's `Accept` names it.
//!
//! One engine thread owns the model: it takes every request waiting (up to `max_batch` rows and
//! `max_batch_tokens` tokens), runs them as one right-padded batch (causal attention: no real
//! position sees a padded one), and hands each row's top-K back; answers are written on the
//! runtime's threads while the engine runs the next batch. Requests are bounded
//! (`max_body_bytes`, the model's positions, `max_logprobs`); a malformed one gets a 400 that
//! says why.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use xtoken_core::loss::XTokenBackend;
use xtoken_core::vocab::Vocabulary;
use xtoken_kernels::host::PositionTargets;
use xtoken_models::{LoadOptions, Transformer};

use crate::backend::{on_backend, OnBackend, TrainBackend};
use crate::config::{DeviceKind, DtypeChoice};
use crate::error::{Context, Result};
use crate::targets::answer::{self, BINARY};
use crate::train::teachers::{dtype_of, tokens};

/// What `xtoken serve` serves, where, and its bounds.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The model's Hugging Face directory.
    pub model: PathBuf,
    /// Its tokenizer (default: the model directory).
    pub tokenizer: Option<PathBuf>,
    /// The model's name in `/v1/models` and requests (default: the directory's name).
    pub name: Option<String>,
    /// The address to bind (127.0.0.1 unless told otherwise).
    pub host: String,
    /// The port (0: any free one).
    pub port: u16,
    /// The most prompt log-probabilities per position a request may ask (vLLM's
    /// `--max-logprobs`, 20 by default).
    pub max_logprobs: usize,
    /// Rows run together in one forward.
    pub max_batch: usize,
    /// Tokens run together in one forward.
    pub max_batch_tokens: usize,
    /// The largest request body.
    pub max_body_bytes: usize,
    /// `cpu`, `flex`, `ndarray`, `cuda` or `wgpu`.
    pub device: String,
    /// The weights' dtype.
    pub dtype: DtypeChoice,
}

impl ServeOptions {
    /// Serving `model` on 127.0.0.1:8000 on the CPU, with vLLM's bounds.
    pub fn new(model: PathBuf) -> Self {
        Self {
            model,
            tokenizer: None,
            name: None,
            host: "127.0.0.1".into(),
            port: 8000,
            max_logprobs: 20,
            max_batch: 8,
            max_batch_tokens: 16384,
            max_body_bytes: 16 << 20,
            device: "cpu".into(),
            dtype: DtypeChoice::Auto,
        }
    }

    /// The served model's name.
    pub fn served_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            let name = self
                .model
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
            name.unwrap_or_else(|| "model".into())
        })
    }
}

/// One prompt for the engine, and where its targets go.
struct Job {
    prompt: Vec<u32>,
    k: usize,
    reply: tokio::sync::oneshot::Sender<std::result::Result<PositionTargets, String>>,
}

/// What the handlers share.
struct Shared {
    name: String,
    /// Each token's text as a JSON string literal, by id.
    decoded: Vec<String>,
    vocab: usize,
    max_positions: usize,
    options: ServeOptions,
    jobs: std::sync::Mutex<mpsc::Sender<Job>>,
    answered: AtomicU64,
}

/// Serves `options.model` until the process ends; `ready` is told the bound address once
/// requests are taken (the model loaded).
pub fn serve(options: ServeOptions, ready: impl FnOnce(SocketAddr) + Send) -> Result<()> {
    struct Work<F>(ServeOptions, F);
    impl<F: FnOnce(SocketAddr) + Send> OnBackend for Work<F> {
        type Output = ();
        fn run<B: TrainBackend>(self, devices: Vec<B::Device>) -> Result<()> {
            let device = devices.into_iter().next().unwrap_or_default();
            serve_on::<B::InnerBackend>(self.0, &device, self.1)
        }
    }
    let kind: DeviceKind = options.device.parse()?;
    on_backend(kind, &[], Work(options, ready))
}

/// Serves `options.model` on a thread of its own and returns the bound address once requests
/// are taken; a server that fails to start (its model, its address) returns its error here.
pub fn serve_in_background(options: ServeOptions) -> Result<SocketAddr> {
    let (send, receive) = mpsc::channel();
    let ready = send.clone();
    std::thread::spawn(move || {
        if let Err(e) = serve(options, move |address| {
            ready.send(Ok(address)).ok();
        }) {
            send.send(Err(e)).ok();
        }
    });
    receive
        .recv()
        .map_err(|_| crate::error::Error::Run("xtoken serve ended before it served".into()))?
}

fn serve_on<B: XTokenBackend>(
    options: ServeOptions,
    device: &B::Device,
    ready: impl FnOnce(SocketAddr),
) -> Result<()> {
    let dtype = dtype_of::<B>(options.dtype, device);
    let model = Transformer::<B>::load_with(&options.model, LoadOptions { dtype }, device)
        .with_context(|| format!("xtoken serve: {}", options.model.display()))?;
    let arch = &model.architecture;
    let tokenizer = options.tokenizer.clone().unwrap_or(options.model.clone());
    let vocab = Vocabulary::load_padded(&tokenizer, Some(arch.vocab_size))
        .with_context(|| format!("xtoken serve: the tokenizer {}", tokenizer.display()))?;
    // As vLLM writes them: a token that ends inside a character (a byte of it) is "".
    let decoded = (0..arch.vocab_size as u32)
        .map(|id| {
            let text = vocab.tokenizer().decode(&[id], false).unwrap_or_default();
            let text = if text.ends_with('\u{fffd}') {
                String::new()
            } else {
                text
            };
            serde_json::Value::String(text).to_string()
        })
        .collect();
    let (send, receive) = mpsc::channel();
    let shared = Arc::new(Shared {
        name: options.served_name(),
        decoded,
        vocab: arch.vocab_size,
        max_positions: arch.max_position_embeddings,
        jobs: std::sync::Mutex::new(send),
        answered: AtomicU64::new(0),
        options: options.clone(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("xtoken serve: starting its runtime")?;
    let address = format!("{}:{}", options.host, options.port);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&address))
        .with_context(|| format!("xtoken serve: binding {address}"))?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .layer(DefaultBodyLimit::max(options.max_body_bytes))
        .with_state(shared.clone());
    let server = runtime.spawn(async move { axum::serve(listener, app).await });
    tracing::info!(
        "xtoken serve: {} ({} parameters, {dtype:?}) as {:?} on http://{bound}/v1, top-{} at \
         most, batches of {} rows",
        options.model.display(),
        arch.num_parameters(),
        shared.name,
        options.max_logprobs,
        options.max_batch
    );
    ready(bound);
    engine(&model, device, &options, receive);
    runtime.block_on(server).ok();
    Ok(())
}

/// Runs the waiting prompts as batches until every sender is gone.
fn engine<B: XTokenBackend>(
    model: &Transformer<B>,
    device: &B::Device,
    options: &ServeOptions,
    jobs: mpsc::Receiver<Job>,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        let mut tokens = batch[0].prompt.len();
        while batch.len() < options.max_batch {
            let Ok(job) = jobs.try_recv() else { break };
            tokens += job.prompt.len();
            batch.push(job);
            if tokens >= options.max_batch_tokens {
                break;
            }
        }
        let answers = run_batch(model, device, &batch);
        for (job, answer) in batch.into_iter().zip(answers) {
            job.reply.send(answer).ok();
        }
    }
}

/// One forward over `batch`'s prompts, right-padded; each row's targets over all its positions
/// (the last one's next token unknown).
fn run_batch<B: XTokenBackend>(
    model: &Transformer<B>,
    device: &B::Device,
    batch: &[Job],
) -> Vec<std::result::Result<PositionTargets, String>> {
    let len = batch.iter().map(|j| j.prompt.len()).max().unwrap_or(1);
    let mut ids = vec![0i64; batch.len() * len];
    for (b, job) in batch.iter().enumerate() {
        for (p, &t) in job.prompt.iter().enumerate() {
            ids[b * len + p] = t as i64;
        }
    }
    let logits = tokens::<B>(&ids, &None, [batch.len(), len], device)
        .and_then(|t| Ok(model.forward_of(&t)?));
    let logits = match logits {
        Ok(l) => l,
        Err(e) => return batch.iter().map(|_| Err(e.report())).collect(),
    };
    let vocab = logits.dims()[2];
    batch
        .iter()
        .enumerate()
        .map(|(b, job)| {
            let n = job.prompt.len();
            let row = logits.clone().slice([b..b + 1, 0..n, 0..vocab]);
            let next: Vec<i32> = (0..n)
                .map(|p| job.prompt.get(p + 1).map_or(-1, |&t| t as i32))
                .collect();
            B::xt_position_targets(
                row.into_primitive().tensor(),
                &next,
                job.k.max(1),
                1.0,
                true,
            )
            .map_err(|e| e.to_string())
        })
        .collect()
}

/// A request to `/v1/completions`: what xtoken serve reads of it.
#[derive(Deserialize)]
struct CompletionRequest {
    model: String,
    prompt: serde_json::Value,
    max_tokens: Option<i64>,
    prompt_logprobs: Option<i64>,
    #[serde(default)]
    return_token_ids: bool,
}

/// A request refused: its status and why.
struct Refusal(StatusCode, String);

impl Refusal {
    fn bad(message: String) -> Self {
        Self(StatusCode::BAD_REQUEST, message)
    }
}

/// An error answer in the OpenAI shape vLLM uses.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let kind = match status {
        StatusCode::NOT_FOUND => "NotFoundError",
        StatusCode::BAD_REQUEST => "BadRequestError",
        _ => "InternalServerError",
    };
    let body = serde_json::json!({
        "error": {"message": message.into(), "type": kind, "param": null, "code": status.as_u16()}
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let created = unix_seconds();
    let body = serde_json::json!({
        "object": "list",
        "data": [{
            "id": shared.name,
            "object": "model",
            "created": created,
            "owned_by": "xtoken",
            "root": shared.options.model.display().to_string(),
            "max_model_len": shared.max_positions,
            "max_logprobs": shared.options.max_logprobs,
            "answer_formats": ["application/json", BINARY],
        }]
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn unix_seconds() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH);
    now.map_or(0, |d| d.as_secs())
}

/// Checks a request: its model, its prompt (token ids of this model), `max_tokens` and
/// `prompt_logprobs`; returns the prompt, the entries asked per position and whether the
/// prompt's ids are to be echoed.
fn read_request(
    shared: &Shared,
    body: &[u8],
) -> std::result::Result<(Vec<u32>, Option<usize>, bool), Refusal> {
    let bad = Refusal::bad;
    let r: CompletionRequest = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the request is not a completion request: {e}")))?;
    if r.model != shared.name {
        let m = format!(
            "The model `{}` does not exist. Valid aliases: {}.",
            r.model, shared.name
        );
        return Err(Refusal(StatusCode::NOT_FOUND, m));
    }
    let prompt: Vec<u32> = match &r.prompt {
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let id = v.as_u64().filter(|&id| (id as usize) < shared.vocab);
                id.map(|id| id as u32).ok_or_else(|| {
                    bad(format!(
                        "prompt[{i}] = {v}: not a token id of this model (0..{})",
                        shared.vocab
                    ))
                })
            })
            .collect::<std::result::Result<_, _>>()?,
        _ => {
            return Err(bad(
                "prompt: xtoken serve takes a list of token ids (tokenize with the model's \
                 tokenizer.json)"
                    .into(),
            ))
        }
    };
    if prompt.is_empty() {
        return Err(bad("prompt: empty; give at least one token id".into()));
    }
    if prompt.len() > shared.max_positions {
        return Err(bad(format!(
            "This model's maximum context length is {} tokens. However, your request has {} \
             input tokens.",
            shared.max_positions,
            prompt.len()
        )));
    }
    if r.max_tokens.is_some_and(|m| m != 1) {
        return Err(bad(format!(
            "max_tokens = {}: xtoken serve answers prompt log-probabilities and one greedy \
             token; ask max_tokens = 1",
            r.max_tokens.unwrap_or_default()
        )));
    }
    let k = match r.prompt_logprobs {
        None => None,
        Some(k) if k < 0 => return Err(bad(format!("prompt_logprobs = {k}: must be ≥ 0"))),
        Some(k) if k as usize > shared.options.max_logprobs => {
            return Err(bad(format!(
                "Requested prompt logprobs of {k}, which is greater than max allowed: {}",
                shared.options.max_logprobs
            )))
        }
        Some(k) => Some(k as usize),
    };
    Ok((prompt, k, r.return_token_ids))
}

async fn completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (prompt, k, token_ids) = match read_request(&shared, &body) {
        Ok(r) => r,
        Err(Refusal(status, message)) => return error(status, message),
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job = Job {
        prompt: prompt.clone(),
        k: k.unwrap_or(1),
        reply,
    };
    let sent = match shared.jobs.lock() {
        Ok(jobs) => jobs.send(job).is_ok(),
        Err(_) => false,
    };
    if !sent {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped");
    }
    let targets = match answer.await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(_) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the engine dropped the request",
            )
        }
    };
    let binary = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(BINARY));
    let n = shared.answered.fetch_add(1, Ordering::Relaxed);
    let written = tokio::task::spawn_blocking(move || {
        let (generated, targets) = split_last(targets, k.unwrap_or(0));
        if binary {
            let body = answer::encode_binary(&shared.name, &targets);
            return ([(header::CONTENT_TYPE, BINARY)], body).into_response();
        }
        let body = completion_json(
            &shared,
            n,
            &prompt,
            k.map(|_| &targets),
            generated,
            token_ids,
        );
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    });
    written
        .await
        .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// The greedy token after the prompt (the last position's best), and the targets of the other
/// positions cut to `k` entries each.
fn split_last(t: PositionTargets, k: usize) -> (u32, PositionTargets) {
    let k = k.min(t.k);
    let n = t.observed.len();
    let generated = t.ids.get((n - 1) * t.k).copied().unwrap_or(0);
    let keep = n - 1;
    let cut = |v: &[u32]| -> Vec<u32> {
        (0..keep)
            .flat_map(|p| v[p * t.k..p * t.k + k].to_vec())
            .collect()
    };
    let cutf = |v: &[f32]| -> Vec<f32> {
        (0..keep)
            .flat_map(|p| v[p * t.k..p * t.k + k].to_vec())
            .collect()
    };
    let out = PositionTargets {
        k,
        ids: cut(&t.ids),
        logp: cutf(&t.logp),
        observed: t.observed[..keep].to_vec(),
        neg_ce: t.neg_ce[..keep].to_vec(),
        neg_entropy: t.neg_entropy[..keep].to_vec(),
        max_prob: t.max_prob[..keep].to_vec(),
        observed_rank: t.observed_rank[..keep].to_vec(),
    };
    (generated, out)
}

/// The completion in vLLM's shape.
fn completion_json(
    shared: &Shared,
    n: u64,
    prompt: &[u32],
    targets: Option<&PositionTargets>,
    generated: u32,
    token_ids: bool,
) -> String {
    let text = shared
        .decoded
        .get(generated as usize)
        .map_or("\"\"", String::as_str);
    let model = serde_json::Value::String(shared.name.clone());
    let mut out = format!(
        "{{\"id\":\"cmpl-xtoken-{n}\",\"object\":\"text_completion\",\"created\":{},\"model\":{model},\
         \"choices\":[{{\"index\":0,\"text\":{text},\"logprobs\":null,\"finish_reason\":\"length\",\
         \"stop_reason\":null,",
        unix_seconds()
    );
    let echoed = token_ids.then(|| serde_json::to_string(prompt).unwrap_or_default());
    match &echoed {
        Some(_) => out.push_str(&format!("\"token_ids\":[{generated}],")),
        None => out.push_str("\"token_ids\":null,"),
    }
    out.push_str("\"prompt_logprobs\":");
    match targets {
        Some(t) => answer::write_prompt_logprobs(&mut out, prompt, t, &shared.decoded),
        None => out.push_str("null"),
    }
    out.push_str(",\"prompt_token_ids\":");
    out.push_str(echoed.as_deref().unwrap_or("null"));
    let p = prompt.len();
    out.push_str(&format!(
        "}}],\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":1}}}}",
        p + 1
    ));
    out
}
