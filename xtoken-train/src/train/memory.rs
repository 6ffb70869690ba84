//! Memory: the estimate `xtoken train --check` prints and `train` compares with the device (or
//! the host) before its first step, and the cap `XTOKEN_MEMORY_CAP` holds a run to, so that a
//! run that cannot fit is refused by name instead of failing inside an allocator.

use xtoken_models::Architecture;

use crate::config::DeviceKind;
use crate::config::ScalingScope;
use crate::config::{DtypeChoice, RunConfig};
use crate::error::{Error, Result};
use crate::train::inputs::RunInputs;

/// The environment variable that caps a run's memory: the process's heap on the CPU backends,
/// each device's memory pools on a GPU. Bytes, or a number with `KB`, `MB`, `GB`, `KiB`, `MiB` or `GiB`.
pub const CAP_VARIABLE: &str = "XTOKEN_MEMORY_CAP";

/// One device's memory, by part, in bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryEstimate {
    /// The student's weights, gradients and AdamW's two moments.
    pub student: u64,
    /// Every teacher's weights.
    pub teachers: u64,
    /// The largest of one micro-batch's passes: the student's (the layer boundaries kept by
    /// activation checkpointing, or every layer's activations without it, one layer's, and the
    /// logits with their gradients), a teacher's (its logits and their log-softmax), and, with
    /// on-policy sequences, the student's generation (its key/value cache, whose sliding-window
    /// layers keep a window only).
    pub activations: u64,
    /// The teachers' top-K targets: a whole step's of this worker with `scaling_scope = "step"`
    /// (kept over its micro-batches), else one micro-batch's.
    pub targets: u64,
    /// What the run reads besides the weights: tokenizers, aligners and tables (measured as the
    /// resident memory they took while read). On a GPU they stay in host memory.
    pub inputs: u64,
    /// The longest of the data shards' first documents, when one is longer than a piece of the
    /// alignment: it is held whole once aligned (its ids and alignment), in host memory
    /// ([`document_bytes`]).
    pub documents: u64,
    /// Whether the device's memory is the host's (the CPU backends).
    pub on_host: bool,
}

impl MemoryEstimate {
    /// One device's bytes: every part but the inputs on a GPU.
    pub fn total(&self) -> u64 {
        let device = self.student + self.teachers + self.activations + self.targets;
        device + if self.on_host { self.host() } else { 0 }
    }

    /// What every process holds in host memory once: the inputs and the longest document.
    fn host(&self) -> u64 {
        self.inputs + self.documents
    }

    /// One process's host memory with `workers` devices: the inputs once, and each device's
    /// memory where it is the host's.
    pub fn host_per_process(&self, workers: usize) -> u64 {
        match self.on_host {
            true => self.host() + workers as u64 * (self.total() - self.host()),
            false => self.host(),
        }
    }

    /// The largest part, with the settings that lower it.
    fn largest(&self) -> &'static str {
        let parts = [
            (self.student, "the student with gradients and AdamW"),
            (self.teachers, "the teachers' weights"),
            (
                self.activations,
                "one micro-batch's activations (lower training.context_length or \
                 training.micro_batch)",
            ),
            (
                self.targets,
                "the teachers' top-K targets (lower loss.top_k or training.micro_batch, or use \
                 loss.scaling_scope = \"previous-step\")",
            ),
            (self.inputs, "the tokenizers and aligners"),
            (
                self.documents,
                "the longest document, held whole once aligned (split it into smaller records)",
            ),
        ];
        // On a GPU the inputs and documents are in host memory, no part of the device's.
        let parts = match self.on_host {
            true => &parts[..],
            false => &parts[..4],
        };
        parts
            .iter()
            .max_by_key(|(bytes, _)| *bytes)
            .map_or("", |(_, what)| what)
    }
}

/// Bytes per element of a dtype choice on the backend `kind` (`auto`: bf16 where it has it, but
/// f32 on `cpu`).
fn dtype_bytes(choice: DtypeChoice, kind: DeviceKind) -> u64 {
    match choice {
        DtypeChoice::F32 => 4,
        DtypeChoice::Auto
            if matches!(
                kind,
                DeviceKind::Cpu | DeviceKind::Ndarray | DeviceKind::Wgpu
            ) =>
        {
            4
        }
        _ => 2,
    }
}

/// One device's memory for the run `config` with `accum` micro-batches per step and worker:
/// see [`MemoryEstimate`]'s parts.
pub fn estimate(config: &RunConfig, inputs: &RunInputs, accum: usize) -> Result<MemoryEstimate> {
    let teachers: Vec<_> = inputs
        .teacher_configs
        .iter()
        .zip(&inputs.settings)
        .map(|(c, settings)| (&c.architecture, settings.dtype))
        .collect();
    let student = &inputs.student_config.architecture;
    estimate_shapes(config, student, &teachers, accum, inputs.resident_bytes)
}

/// [`estimate`] from the models' shapes: the student's, each teacher's with its dtype, and the
/// bytes the inputs take.
pub fn estimate_shapes(
    config: &RunConfig,
    student: &Architecture,
    teachers: &[(&Architecture, DtypeChoice)],
    accum: usize,
    inputs: u64,
) -> Result<MemoryEstimate> {
    let kind: DeviceKind = config.device.parse()?;
    let params = dtype_bytes(config.student_dtype()?, kind);
    let tokens = config.training.micro_batch as u64 * padded_context(config, kind);
    let bytes = |(arch, dtype): &(&Architecture, DtypeChoice)| {
        (
            arch.num_parameters() as u64,
            arch.vocab_size as u64,
            dtype_bytes(*dtype, kind),
        )
    };
    // A teacher's pass keeps its logits and their f32 log-softmax for the top-K.
    let teacher_pass = teachers
        .iter()
        .map(bytes)
        .map(|(_, vocab, b)| tokens * vocab * (b + 4))
        .max()
        .unwrap_or(0);
    let student_pass = student_activations(config, student, params, kind)?;
    let generation = match &config.on_policy {
        Some(on) if on.fraction > 0.0 => student.kv_cache_bytes(
            config.training.micro_batch,
            on.prompt_tokens + on.max_new_tokens,
            dtype_bytes(config.compute_dtype()?, kind) as usize,
        ),
        _ => 0,
    };
    Ok(MemoryEstimate {
        student: student.num_parameters() as u64 * params * 4,
        teachers: teachers.iter().map(bytes).map(|(n, _, b)| n * b).sum(),
        activations: student_pass.max(teacher_pass).max(generation),
        targets: targets(config, student, teachers.len(), accum, kind)?,
        inputs,
        documents: 0,
        on_host: kind.on_host(),
    })
}

/// Host bytes a document of `bytes` bytes and `tokens` tokens (the student's and every
/// teacher's together) adds to a run's peak: what is held once it is aligned (its text, every
/// side's ids and chunks: [`DOCUMENT_TOKEN_BYTES`] a token), and the work of aligning one
/// piece of it ([`PIECE_TOKEN_BYTES`] a token of the piece: the tokenizers' encodings and the
/// alignment's band), which grows with the tokens a piece holds, not with the document.
pub fn document_bytes(bytes: u64, tokens: u64) -> u64 {
    let piece = crate::data::pipeline::PIECE_BYTES as u64;
    let piece_tokens = tokens * bytes.min(piece) / bytes.max(1);
    tokens * DOCUMENT_TOKEN_BYTES + piece_tokens * PIECE_TOKEN_BYTES
}

/// Host bytes a long document holds per token of any side once aligned. Measured
/// (BENCHMARKS.md, "The longest document's memory"): one-line documents of 7.2 and 28.7 MB of
/// English words, Llama-3.2's tokens aligned with Qwen3's, raised a run's peak resident memory
/// by 437 MB and 1,032 MB over a run of short documents; the difference, 595 MB for 10.6 M
/// more tokens, is 56 bytes a token.
pub const DOCUMENT_TOKEN_BYTES: u64 = 60;

/// Host bytes the alignment of one piece of a long document takes per token of the piece
/// (every side's): the rest of those rises, 237 MB for pieces of 0.5 M tokens, and 548 MB for
/// pieces of 1.5 M tokens of symbols and digits (370–460 bytes a token).
pub const PIECE_TOKEN_BYTES: u64 = 460;

/// The longest row a micro-batch can hold: `context_length` rounded up to the multiple its
/// rows are padded to (`training.length_multiple`; 0: the device's, 128 on CUDA and wgpu).
fn padded_context(config: &RunConfig, kind: DeviceKind) -> u64 {
    let multiple = match config.training.length_multiple {
        0 => kind.length_multiple(),
        m => m,
    };
    config.training.context_length.div_ceil(multiple.max(1)) as u64 * multiple.max(1) as u64
}

/// The student's pass over one micro-batch: the residual stream in the parameters' dtype
/// (`params` bytes), the projections, the attention and the MLP in the compute dtype, and the
/// logits with their gradients. Every backend trains with X-Token's attention, which keeps no
/// scores: on the CPU backends its f32 copies of the queries, keys, values and output count; on
/// a GPU the queries, keys, values and output it keeps for its backward (in the compute dtype)
/// and each query row's f32 log-sum-exp.
fn student_activations(
    config: &RunConfig,
    s: &Architecture,
    params: u64,
    kind: DeviceKind,
) -> Result<u64> {
    let t = &config.training;
    let compute = dtype_bytes(config.compute_dtype()?, kind);
    let (micro, context) = (t.micro_batch as u64, padded_context(config, kind));
    let tokens = micro * context;
    let boundary = tokens * s.hidden_size as u64 * params;
    let heads = s.num_attention_heads as u64;
    let attention = match kind.on_host() {
        true => 4 * tokens * heads * s.head_dim as u64 * 4,
        false => tokens * (4 * heads * s.head_dim as u64 * compute + 4 * heads),
    };
    let mlp = tokens * s.intermediate_size as u64 * compute;
    let one_layer = attention + 8 * boundary + 3 * mlp;
    let layers = s.num_hidden_layers as u64;
    let kept = match t.activation_checkpointing {
        true => layers * boundary + one_layer,
        false => layers * one_layer,
    };
    // The logits, the losses' gradient of them and its sum; on the CPU backends the host
    // losses also hold their f32 gradient before uploading it, and bf16 compute saved no memory
    // there when measured (`xtoken bench train`), so all four count as f32.
    let per_logit = match kind.on_host() {
        true => 4 * 4,
        false => 3 * compute,
    };
    Ok(kept + tokens * s.vocab_size as u64 * per_logit)
}

/// Every chunk keeps top-K (value, index) pairs per teacher, at most one chunk per student
/// token; with the step's γ and α a worker keeps its whole step's targets.
fn targets(
    config: &RunConfig,
    student: &Architecture,
    teachers: usize,
    accum: usize,
    kind: DeviceKind,
) -> Result<u64> {
    let t = &config.training;
    let vocab = student.vocab_size;
    let top_k = match config.loss.top_k {
        0 => vocab,
        k => k.min(vocab),
    } as u64;
    let kept = match config.scaling_scope()? {
        ScalingScope::Step => accum as u64,
        _ => 1,
    };
    let tokens = t.micro_batch as u64 * padded_context(config, kind);
    Ok(teachers as u64 * 8 * top_k * tokens * kept)
}

/// Refuses a run whose estimated memory `m` (of one worker's share of the step) is more than
/// its limit: on the CPU backends the memory the machine has available, on a GPU the device's
/// free memory (`free`, where the backend reports it), and the cap [`CAP_VARIABLE`] sets,
/// whichever is lower. The error names the estimate, the limit, the largest part and what to
/// lower, and where its parts are shown (`seen`).
pub fn check_fits(m: &MemoryEstimate, free: Option<u64>, seen: &str) -> Result<()> {
    let mut limit = match m.on_host {
        true => (
            crate::machine::available_memory(),
            "this machine has available".to_string(),
        ),
        false => (free, "the device has free".to_string()),
    };
    if let Some((cap, whose)) = host_limit()? {
        // The address space bounds host memory only; a GPU's is its own.
        let applies = m.on_host || whose == CAP_WHOSE;
        if applies && limit.0.is_none_or(|have| cap <= have) {
            limit = (Some(cap), whose.to_string());
        }
    }
    let (limit, whose) = limit;
    match limit {
        Some(limit) if m.total() > limit => Err(Error::Memory(format!(
            "the run needs about {} of memory, more than the {} {whose}; the largest part is \
             {} ({seen})",
            size(m.total()),
            size(limit),
            m.largest()
        ))),
        _ => Ok(()),
    }
}

/// Bytes as a person reads them: GB, MB or kB with one decimal, bytes below a kilobyte.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000_000 => format!("{:.1} GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.1} MB", b as f64 / 1e6),
        b if b >= 1_000 => format!("{:.1} kB", b as f64 / 1e3),
        b => format!("{b} bytes"),
    }
}

/// How the cap [`CAP_VARIABLE`] is named in messages.
const CAP_WHOSE: &str = "cap XTOKEN_MEMORY_CAP sets";

/// The most host memory this process may take, and what sets it: [`CAP_VARIABLE`], else the
/// address-space limit (`ulimit -v`), so that a run under such a limit is refused or ended by
/// name instead of aborting inside the allocator.
pub fn host_limit() -> Result<Option<(u64, &'static str)>> {
    if let Some(cap) = cap()? {
        return Ok(Some((cap, CAP_WHOSE)));
    }
    Ok(address_space_limit().map(|bytes| (bytes, "address-space limit (ulimit -v) allows")))
}

/// The soft limit of this process's address space, when one is set.
fn address_space_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the limit into the struct it is given.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) };
        // `rlim_t` is u64 on Linux but not on every platform.
        #[allow(clippy::unnecessary_cast)]
        let bytes = limit.rlim_cur as u64;
        (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(bytes)
    }
    #[cfg(not(unix))]
    None
}

/// The cap [`CAP_VARIABLE`] sets, in bytes; `None` when it is unset.
pub fn cap() -> Result<Option<u64>> {
    match std::env::var(CAP_VARIABLE) {
        Ok(text) => parse_bytes(&text).map(Some).ok_or_else(|| {
            Error::Config(format!(
                "{CAP_VARIABLE} = {text:?}: expected bytes, or a number with KB, MB, GB, KiB, \
                 MiB or GiB (\"12GB\")"
            ))
        }),
        Err(_) => Ok(None),
    }
}

/// `"12GB"`, `"1.5 GiB"`, `"4096"` in bytes.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        _ => return None,
    };
    let bytes = number * scale as f64;
    (bytes.is_finite() && bytes >= 1.0).then_some(bytes as u64)
}

/// On a GPU, fails once the device's pools hold more than `cap` (`reserved` bytes, read after
/// a step; pools keep the largest working set, so this is the step's peak).
pub fn check_pools(cap: u64, reserved: Option<u64>, step: u64) -> Result<()> {
    match reserved {
        Some(held) if held > cap => Err(Error::Memory(format!(
            "out of memory at step {step}: the device's memory pools hold {:.2} GB, more than \
             the {:.2} GB cap {CAP_VARIABLE} sets; lower training.micro_batch or \
             training.context_length (see `xtoken train --check`)",
            held as f64 / 1e9,
            cap as f64 / 1e9
        ))),
        _ => Ok(()),
    }
}

/// Whether a panic's message is an allocation failure of a device backend (cubecl's
/// `BufferTooBig` or an out-of-memory launch error).
pub fn is_out_of_memory(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    [
        "buffertoobig",
        "out of memory",
        "outofmemory",
        "out-of-memory",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_read_with_their_units() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("12GB"), Some(12_000_000_000));
        assert_eq!(parse_bytes("1.5 GiB"), Some(3 << 29));
        assert_eq!(parse_bytes("300mb"), Some(300_000_000));
        for bad in ["", "GB", "twelve", "12 TB", "0", "-1GB"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn pools_past_the_cap_end_the_run_by_name() {
        check_pools(100, Some(100), 3).unwrap();
        check_pools(100, None, 3).unwrap();
        let message = check_pools(1_000_000_000, Some(3_000_000_000), 3)
            .unwrap_err()
            .to_string();
        assert!(message.contains("out of memory at step 3"), "{message}");
        assert!(message.contains("hold 3.00 GB"), "{message}");
        assert!(
            message.contains("1.00 GB cap XTOKEN_MEMORY_CAP sets"),
            "{message}"
        );
    }

    /// Llama-3.2-1B, Qwen3-4B and Phi-4-mini as their `config.json` files give them.
    fn paper_models() -> [(&'static str, Architecture, f64); 3] {
        let mut qwen3 = Architecture::llama(151_936, 2560, 9728, 36, 32, 8);
        qwen3.head_dim = 128;
        let phi4 = Architecture::llama(200_064, 3072, 8192, 32, 24, 8);
        let llama = Architecture::llama(128_256, 2048, 8192, 16, 32, 8);
        [
            ("Llama-3.2-1B", llama, 1.236e9),
            ("Qwen3-4B", qwen3, 4.02e9),
            ("Phi-4-mini", phi4, 3.84e9),
        ]
    }

    /// The shipped GPU configurations on 8 devices (the paper's batch, one 4096-token sequence
    /// per micro-batch) fit an 80 GB device with room for the pools' slack, each teacher as
    /// its configuration names it; under `scaling_scope = "step"` two teachers' targets would
    /// not.
    #[test]
    fn the_shipped_gpu_configurations_fit_80_gb_on_8_devices() {
        let models = paper_models();
        for (name, arch, published) in &models {
            let n = arch.num_parameters() as f64;
            assert!((n / published - 1.0).abs() < 0.02, "{name}: {n} parameters");
        }
        let configs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs");
        for file in [
            "llama1b-qwen3-pkl.toml",
            "llama1b-phi4-hkl.toml",
            "llama1b-two-teachers.toml",
        ] {
            let config = RunConfig::load(&configs.join(file)).unwrap();
            let settings = config.teacher_settings().unwrap();
            let teachers: Vec<_> = settings
                .iter()
                .map(|s| {
                    let name = s.model.display().to_string();
                    let (_, arch, _) = models
                        .iter()
                        .find(|(n, ..)| name.contains(n.split('-').next().unwrap()))
                        .unwrap();
                    (arch, s.dtype)
                })
                .collect();
            let accum = config.grad_accum(8).unwrap();
            let m = estimate_shapes(&config, &models[0].1, &teachers, accum, 0).unwrap();
            assert!((m.total() as f64) < 70e9, "{file}: {m:?}");
            // The step's γ and α keep a worker's whole step of targets: 96 micro-batches' worth.
            let mut step = config.clone();
            step.loss.scaling_scope = "step".into();
            let exact = estimate_shapes(&step, &models[0].1, &teachers, accum, 0).unwrap();
            assert_eq!(exact.targets, 96 * m.targets, "{file}");
            if teachers.len() == 2 {
                let total = exact.total() as f64;
                assert!(total > 80e9, "{file} under the step scope: {exact:?}");
            }
        }
    }

    /// A GPU pads each row to a multiple of 128 tokens: 4000 tokens of context cost what 4096
    /// do there, less on the CPU (no padding), and `training.length_multiple` overrides it.
    #[test]
    fn the_estimate_counts_the_rows_padding() {
        let configs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs");
        let mut config = RunConfig::load(&configs.join("llama1b-qwen3-pkl.toml")).unwrap();
        let [(_, student, _), (_, qwen3, _), _] = paper_models();
        let teachers = [(&qwen3, DtypeChoice::Bf16)];
        let mut total = |device: &str, context: usize, multiple: usize| {
            config.device = device.into();
            config.training.context_length = context;
            config.training.length_multiple = multiple;
            estimate_shapes(&config, &student, &teachers, 1, 0)
                .unwrap()
                .total()
        };
        assert_eq!(total("cuda", 4000, 0), total("cuda", 4096, 0));
        assert!(total("cuda", 4096, 0) < total("cuda", 4097, 0));
        assert!(total("cpu", 4000, 0) < total("cpu", 4096, 0));
        assert_eq!(total("cpu", 4000, 256), total("cpu", 4096, 0));
        assert!(total("cuda", 4000, 1) < total("cuda", 4096, 1));
    }

    #[test]
    fn device_allocation_failures_are_recognized() {
        assert!(is_out_of_memory("IoError: BufferTooBig { size: 1 }"));
        assert!(is_out_of_memory(
            "An out-of-memory error happened during launch"
        ));
        assert!(!is_out_of_memory("index out of bounds"));
    }
}
