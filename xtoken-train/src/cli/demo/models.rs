//! The demo's tokenizers, trained here on its corpus, and its random tiny Llamas.

use std::path::Path;

use anyhow::{anyhow, Result};
use burn::backend::NdArray;
use burn::tensor::DType;
use xtoken_core::vocab::Vocabulary;
use xtoken_models::{Architecture, SaveDtype, Transformer};

/// How a tokenizer cuts text before BPE merges within the pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numerals {
    /// Every digit alone, as Qwen3's pre-tokenizer does.
    Digits,
    /// Runs of up to three digits, as Llama-3's pre-tokenizer does (the student's).
    UpToThree,
    /// Runs of up to three digits as well, and words cut into pieces of at most three letters
    /// (the first with its leading space): a tokenizer that agrees with the student's on
    /// numerals and disagrees on words (Phi-4-mini against Llama-3).
    UpToThreeShortWords,
}

impl Numerals {
    fn pre_tokenizer(self) -> String {
        let byte_level =
            r#"{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}"#;
        let digits = r#"{"type":"Digits","individual_digits":true}"#;
        let runs = r#"{"type":"Split","pattern":{"Regex":"\\p{N}{1,3}"},"behavior":"Isolated","invert":false}"#;
        let words = r#"{"type":"Split","pattern":{"Regex":"\\s?\\p{L}{1,3}"},"behavior":"Isolated","invert":false}"#;
        let pieces = match self {
            Numerals::Digits => vec![digits, byte_level],
            Numerals::UpToThree => vec![runs, byte_level],
            Numerals::UpToThreeShortWords => vec![runs, words, byte_level],
        };
        format!(
            r#"{{"type":"Sequence","pretokenizers":[{}]}}"#,
            pieces.join(",")
        )
    }
}

fn tokenizer_config(pre_tokenizer: &str) -> String {
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,
        "added_tokens":[{{"id":0,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}],
        "normalizer":null,"pre_tokenizer":{pre_tokenizer},"post_processor":null,
        "decoder":{{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}},
        "model":{{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
          "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{{}},"merges":[]}}}}"#
    )
}

/// Trains a byte-level BPE tokenizer of at most `vocab` tokens on `texts` and writes
/// `dir/tokenizer.json`.
pub fn train_tokenizer(
    dir: &Path,
    numerals: Numerals,
    vocab: usize,
    texts: &[String],
) -> Result<()> {
    use tokenizers::models::bpe::BpeTrainer;
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::{AddedToken, Tokenizer};
    let mut tokenizer: Tokenizer = tokenizer_config(&numerals.pre_tokenizer())
        .parse()
        .map_err(|e| anyhow!("building the tokenizer: {e}"))?;
    let mut trainer = TrainerWrapper::BpeTrainer(
        BpeTrainer::builder()
            .vocab_size(vocab)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .special_tokens(vec![AddedToken::from("<|endoftext|>", true)])
            .build(),
    );
    tokenizer
        .train(&mut trainer, texts.iter())
        .map_err(|e| anyhow!("training the tokenizer: {e}"))?;
    std::fs::create_dir_all(dir)?;
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(|e| anyhow!("saving the tokenizer: {e}"))?;
    Ok(())
}

/// How a tokenizer in `dir` cuts `text`, for the log: `" " "7" "4" "2"`.
pub fn pieces(dir: &Path, text: &str) -> Result<String> {
    let vocab = Vocabulary::load(dir)?;
    let ids = vocab.encode(text)?;
    let pieces: Vec<String> = ids
        .iter()
        .filter_map(|&i| vocab.token(i).map(|t| t.display()))
        .collect();
    Ok(format!(
        "{} tokens; {text:?} → {}",
        vocab.size(),
        pieces.join(" ")
    ))
}

/// A random tiny Llama (tied embeddings, 4 heads, 2 key-value heads) of `(hidden, layers)`
/// for the tokenizer in `dir`, saved beside it.
pub fn init_model(dir: &Path, (hidden, layers): (usize, usize), seed: u64) -> Result<()> {
    let vocab = Vocabulary::load(dir)?.size();
    let mut arch = Architecture::llama(vocab, hidden, hidden * 3, layers, 4, 2);
    // Llama-3's θ = 500 000 leaves heads this narrow almost blind to position; 10 000 lets
    // attention find the nearest name among the packed problems.
    arch.rope.theta = 10_000.0;
    Transformer::<NdArray>::random(&arch, seed, DType::F32, &Default::default())?
        .save(dir, SaveDtype::F32)?;
    Ok(())
}
