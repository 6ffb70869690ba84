//! The one error type of the host algorithms: every variant names the file, field or token at fault.

use std::path::PathBuf;

/// Errors of tokenizer loading, projection building, storage and auditing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A directory was given but holds no `tokenizer.json`.
    #[error("{dir}: no tokenizer.json in this directory")]
    NoTokenizerJson { dir: PathBuf },

    /// `tokenizer.json` could not be parsed by the `tokenizers` crate.
    #[error("{path}: not a valid Hugging Face tokenizer.json: {message}")]
    TokenizerParse { path: PathBuf, message: String },

    /// The tokenizer is of a family whose token surfaces we cannot turn into exact bytes.
    #[error("{path}: unsupported tokenizer ({detail}); xtoken supports byte-level BPE (GPT-2, Llama-3, Qwen, Phi-4) and SentencePiece-style tokenizers (▁ spaces, <0xHH> byte fallback)")]
    UnsupportedTokenizer { path: PathBuf, detail: String },

    /// A JSON side file (`tokenizer_config.json`, `special_tokens_map.json`) is malformed.
    #[error("{path}: field `{field}`: {message}")]
    BadConfigField {
        path: PathBuf,
        field: String,
        message: String,
    },

    /// A JSON side file is not valid JSON.
    #[error("{path}: invalid JSON: {message}")]
    BadJson { path: PathBuf, message: String },

    /// A padded vocabulary size was smaller than the tokenizer's own vocabulary.
    #[error("{path}: vocabulary size {requested} is smaller than the tokenizer's {actual} ids")]
    VocabSizeTooSmall {
        path: PathBuf,
        requested: usize,
        actual: usize,
    },

    /// Encoding a text with a tokenizer failed.
    #[error("{path}: encoding {text:?} failed: {message}")]
    Encode {
        path: PathBuf,
        text: String,
        message: String,
    },

    /// A projection or alignment parameter is out of its valid range.
    #[error("parameter `{name}` = {value}: {why}")]
    BadParameter {
        name: &'static str,
        value: String,
        why: &'static str,
    },

    /// A stored projection file is malformed.
    #[error("{path}: {message}")]
    BadProjectionFile { path: PathBuf, message: String },

    /// A stored projection was built from other tokenizer files than the ones given.
    #[error("{path}: built for {side} tokenizer with sha256 {expected}, but {given} has sha256 {actual}")]
    ProvenanceMismatch {
        path: PathBuf,
        side: &'static str,
        expected: String,
        given: PathBuf,
        actual: String,
    },

    /// A token given by text or id does not exist in the vocabulary.
    #[error("{path}: no token {token}")]
    UnknownToken { path: PathBuf, token: String },

    /// A two-sided chunk pairs tokens at different places of the text both sequences spell.
    #[error(
        "aligning {student} with {teacher}: chunk {chunk} pairs {pairs}; a two-sided chunk must \
         cover the same bytes of the text on both sides"
    )]
    MisplacedChunk {
        student: PathBuf,
        teacher: PathBuf,
        chunk: usize,
        /// Both sides' positions and the text bytes they cover.
        pairs: String,
    },

    /// The DP band of a document would need more memory than one alignment may use.
    #[error(
        "aligning {student} with {teacher}: a band of band_bytes = {band_bytes} (--band-bytes) \
         over this document ({} student, {} teacher tokens) needs {cells} DP cells, more than \
         the {limit} (about {} MB) one alignment may use; give a narrower band (the default is \
         16 and widens itself where needed)", tokens.0, tokens.1, (limit * 9) >> 20
    )]
    BandTooWide {
        student: PathBuf,
        teacher: PathBuf,
        band_bytes: u32,
        tokens: (usize, usize),
        cells: usize,
        limit: usize,
    },

    /// A token id is outside the vocabulary it is said to come from.
    #[error(
        "{path}: {side} id {id} at position {position} is outside the vocabulary of {size} ids"
    )]
    TokenOutOfRange {
        path: PathBuf,
        side: &'static str,
        id: u32,
        position: usize,
        size: usize,
    },

    /// A line of an input file is malformed.
    #[error("{path}:{line}: {message}")]
    BadInput {
        path: PathBuf,
        line: usize,
        message: String,
    },

    /// An alignment cache file is malformed, corrupted, or of another version.
    #[error("{path}: {message}")]
    BadCache { path: PathBuf, message: String },

    /// An audit category name is not one of the known categories.
    #[error("unknown audit category `{name}`; known: {known}")]
    UnknownCategory { name: String, known: String },

    /// Logits that the loss read hold NaN or +inf (or only -inf) at one position.
    #[error("{side} logits: non-finite value (NaN, +inf, or only -inf) at sequence {sequence}, position {position}")]
    NonFiniteLogits {
        side: &'static str,
        sequence: usize,
        position: usize,
    },

    /// A tensor handed to a loss has the wrong shape.
    #[error("{what}: expected shape {expected}, found {found}")]
    Shape {
        what: &'static str,
        expected: String,
        found: String,
    },

    /// A fused loss operation refused its input.
    #[error(transparent)]
    Kernel(#[from] xtoken_kernels::KernelError),
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
