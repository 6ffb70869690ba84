//! `xtoken serve --model DIR`: a teacher served over HTTP in vLLM's API subset, for runs whose
//! `teachers[].server` names it.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use xtoken_train::config::DtypeChoice;
use xtoken_train::train::serve::{serve, ServeOptions};

/// Options of `xtoken serve`.
#[derive(Args, Clone)]
pub struct ServeArgs {
    /// The model's Hugging Face directory (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Its tokenizer, when not in the model directory.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The model's name in /v1/models and requests (default: the directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// The address to bind: 127.0.0.1 unless you mean to serve other machines.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port (0: any free one, printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The most prompt log-probabilities per position a request may ask (vLLM's flag).
    #[arg(long, default_value_t = 20)]
    pub max_logprobs: usize,
    /// Rows run together in one forward.
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// Tokens run together in one forward.
    #[arg(long, default_value_t = 16384)]
    pub max_batch_tokens: usize,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    pub max_body_bytes: usize,
    /// `cpu`, `flex`, `ndarray`, `cuda` or `wgpu`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The weights' dtype: `auto` (bf16 where the device has it), `f32`, `bf16`, `f16`.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
}

/// Runs `xtoken serve` until it is stopped.
pub fn run(args: ServeArgs) -> Result<()> {
    if args.max_batch == 0 || args.max_logprobs == 0 {
        anyhow::bail!("--max-batch and --max-logprobs must be at least 1");
    }
    let options = ServeOptions {
        tokenizer: args.tokenizer,
        name: args.served_model_name,
        host: args.host,
        port: args.port,
        max_logprobs: args.max_logprobs,
        max_batch: args.max_batch,
        max_batch_tokens: args.max_batch_tokens.max(1),
        max_body_bytes: args.max_body_bytes,
        device: args.device,
        dtype: DtypeChoice::parse("--dtype", &args.dtype, true)?,
        ..ServeOptions::new(args.model)
    };
    serve(options, |address| {
        // The one line a script waits for.
        println!("serving on http://{address}/v1");
        std::io::stdout().flush().ok();
    })?;
    Ok(())
}
