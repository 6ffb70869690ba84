//! The facade's integration tests: one binary, so that the stack links once; a module per
//! concern. The real-tokenizer tests read `XTOKEN_TOKENIZERS_DIR`.

mod book;
mod readme;
mod real_alignment;
mod real_tokenizers;
mod small_tokenizers;
mod support;
#[path = "support/tokenizer_json.rs"]
mod tokenizer_json;
