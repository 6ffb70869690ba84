//! `tokenizer.json` texts for tests that write their own tokenizers (included by `#[path]` from
//! the root package's and `xtoken-train`'s tests).

/// A byte-level BPE tokenizer (GPT-2 style) over the given vocabulary and merges.
pub fn byte_level(vocab: &[&str], merges: &[&str], added_tokens: &[String]) -> String {
    let vocab: Vec<String> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{}:{i}", serde_json::to_string(t).unwrap()))
        .collect();
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{}],
        "normalizer":null,
        "pre_tokenizer":{{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}},
        "post_processor":null,
        "decoder":{{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}},
        "model":{{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
          "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,
          "vocab":{{{}}},"merges":{}}}}}"#,
        added_tokens.join(","),
        vocab.join(","),
        serde_json::to_string(merges).unwrap()
    )
}
