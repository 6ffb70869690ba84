use std::path::PathBuf;

/// Why a model could not be read, built or written. Every variant names the file, the
/// `config.json` field or the tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: field `{field}`: {why}")]
    Field {
        path: PathBuf,
        field: String,
        why: String,
    },
    #[error(
        "{path}: model_type {model_type:?} is not supported (supported: llama, mistral, qwen2, \
         qwen3, phi3, gemma2, gemma3_text)"
    )]
    UnknownModelType { path: PathBuf, model_type: String },
    #[error(
        "{path}: rope type {rope_type:?} is not supported \
         (supported: default, linear, llama3, longrope)"
    )]
    UnknownRopeType { path: PathBuf, rope_type: String },
    #[error("{path}: not a readable safetensors file: {why}")]
    Safetensors { path: PathBuf, why: String },
    #[error("{dir}: tensor `{name}` is missing from the checkpoint")]
    MissingTensor { dir: PathBuf, name: String },
    #[error("{path}: tensor `{name}` has shape {found:?}, the config implies {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor `{name}` has dtype {dtype}, expected F32, BF16, F16 or F64")]
    TensorDtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    #[error("{dir}: no model.safetensors or model.safetensors.index.json")]
    NoWeights { dir: PathBuf },
    #[error("the backend does not support {dtype:?} tensors on this device")]
    UnsupportedDtype { dtype: burn::tensor::DType },
    #[error("input ids: token {id} at sequence {sequence}, position {position} is outside the vocabulary of {vocab}")]
    TokenId {
        sequence: usize,
        position: usize,
        id: i64,
        vocab: usize,
    },
    #[error(
        "input ids: {len} positions, more than the model's max_position_embeddings = {limit} \
         (config.json)"
    )]
    TooLong { len: usize, limit: usize },
    #[error(
        "padding mask: sequence {sequence} has a token at position {token} after padding at \
         position {padding}; padding must come last (right padding)"
    )]
    NotRightPadded {
        sequence: usize,
        padding: usize,
        token: usize,
    },
    #[error("attention: {0}")]
    Kernel(#[from] xtoken_kernels::KernelError),
    #[error("scoring: {0}")]
    Scoring(String),
    #[error("{what}: expected {expected}, found {found}")]
    Shape {
        what: &'static str,
        expected: String,
        found: String,
    },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

pub(crate) fn io_error(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.into();
    move |source| ModelError::Io { path, source }
}
