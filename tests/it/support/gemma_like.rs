//! A tokenizer of Gemma's structure, generated (Gemma's own tokenizer.json is not among the
//! real tokenizers the tests read): SentencePiece BPE with byte fallback over 262,144 ids,
//! spaces normalized to `▁` with no dummy prefix, digits always single tokens, runs of
//! whitespace as tokens, and Gemma-3's special-token layout — `<pad>` `<eos>` `<bos>` `<unk>`
//! `<mask>` at ids 0–4, `[multimodal]`, `<unused0>`–`<unused98>`, `<start_of_turn>` (105) and
//! `<end_of_turn>` (106), then the 256 byte tokens `<0x00>`–`<0xFF>`. Its pieces are the
//! SentencePiece pieces of Llama-2 and the words of Llama-3.2 (spaces as `▁`), then pairs of
//! them up to the size; every piece past one character has the merge that makes it one token
//! under the merges before it.
//! Like Gemma's, it puts `<bos>` before every text.

use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Gemma-3's tokenizer size (its model's embedding is padded to 262,208).
pub const SIZE: usize = 262_144;

/// The specials at the front, in id order.
pub fn specials() -> Vec<String> {
    let mut out: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]"]
        .map(String::from)
        .into();
    out.extend((0..99).map(|i| format!("<unused{i}>")));
    out.push("<start_of_turn>".into());
    out.push("<end_of_turn>".into());
    out
}

/// The pieces of a real tokenizer's vocabulary, in id order.
fn vocab_pieces(path: &Path) -> Vec<String> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut pieces: Vec<(u64, String)> = vocab
        .iter()
        .map(|(piece, id)| (id.as_u64().unwrap(), piece.clone()))
        .collect();
    pieces.sort();
    pieces.into_iter().map(|(_, p)| p).collect()
}

/// A byte-level piece of GPT-2's alphabet back to its text, if it is whole UTF-8.
fn byte_level_text(piece: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = piece
        .chars()
        .map(|c| (0..=255u8).find(|&b| xtoken_core::canon::byte_level_char(b) == c))
        .collect();
    String::from_utf8(bytes?).ok()
}

/// Whether Gemma would hold `piece`: no digit beside another character, no special spelling.
fn gemma_like(piece: &str) -> bool {
    let digits = piece.chars().filter(char::is_ascii_digit).count();
    !piece.is_empty()
        && (digits == 0 || piece.chars().count() == 1)
        && !piece.starts_with('<')
        && !piece.contains(' ')
}

/// The generated `tokenizer.json`, its pieces read from `real` (the real tokenizers' folder).
pub fn tokenizer_json(real: &Path) -> String {
    let specials = specials();
    let mut pieces: Vec<String> = specials.clone();
    pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let mut seen: HashSet<String> = pieces.iter().cloned().collect();
    let mut merges: Vec<(String, String)> = Vec::new();
    let mut ranks: HashMap<(String, String), usize> = HashMap::new();
    // A piece joins when the merges so far cut it in two: its merge then makes it one token,
    // as BPE training adds them (a piece they cut in three or more is left out).
    let mut add = |piece: String, pieces: &mut Vec<String>, merges: &mut Vec<(String, String)>| {
        if pieces.len() >= SIZE || seen.contains(&piece) {
            return;
        }
        if piece.chars().count() > 1 {
            match segment(&piece, &ranks).as_slice() {
                [left, right] => {
                    let pair = (left.clone(), right.clone());
                    ranks.insert(pair.clone(), merges.len());
                    merges.push(pair);
                }
                _ => return,
            }
        }
        seen.insert(piece.clone());
        pieces.push(piece);
    };
    let llama2 = vocab_pieces(&real.join("llama-2/tokenizer.json"));
    let llama3: Vec<String> = vocab_pieces(&real.join("llama-3.2/tokenizer.json"))
        .iter()
        .filter_map(|p| byte_level_text(p))
        .map(|text| text.replace(' ', "\u{2581}"))
        .collect();
    let mut candidates: Vec<String> = llama2
        .into_iter()
        .chain(llama3)
        .filter(|p| gemma_like(p) && !p.starts_with("<0x"))
        .collect();
    // Whitespace runs: spaces (as ▁), newlines, tabs.
    for n in 2..=31 {
        for c in ["\u{2581}", "\n", "\t"] {
            candidates.push(c.repeat(n));
        }
    }
    // Characters first, so that every longer piece finds its parts; then by length.
    let mut chars: Vec<String> = candidates
        .iter()
        .flat_map(|p| p.chars())
        .map(String::from)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    chars.sort();
    for c in chars {
        add(c, &mut pieces, &mut merges);
    }
    candidates.sort_by_key(|p| p.chars().count());
    for piece in candidates {
        add(piece, &mut pieces, &mut merges);
    }
    // Up to the size: pairs of word pieces, as a larger vocabulary's longer words.
    let words: Vec<String> = pieces
        .iter()
        .filter(|p| p.starts_with('\u{2581}') && p.chars().count() >= 3)
        .take(2000)
        .cloned()
        .collect();
    let tails: Vec<String> = pieces
        .iter()
        .filter(|p| !p.starts_with('\u{2581}') && p.chars().all(char::is_alphabetic))
        .filter(|p| p.chars().count() >= 2)
        .take(200)
        .cloned()
        .collect();
    'fill: for w in &words {
        for t in &tails {
            if pieces.len() >= SIZE {
                break 'fill;
            }
            add(format!("{w}{t}"), &mut pieces, &mut merges);
        }
    }
    assert_eq!(pieces.len(), SIZE, "the generated vocabulary falls short");
    render(&pieces, &merges, specials.len())
}

/// `piece` cut as BPE cuts it with `ranks`: from its characters, the adjacent pair of lowest
/// rank merged until none is left.
fn segment(piece: &str, ranks: &HashMap<(String, String), usize>) -> Vec<String> {
    let mut parts: Vec<String> = piece.chars().map(String::from).collect();
    loop {
        let best = parts
            .windows(2)
            .enumerate()
            .filter_map(|(i, w)| ranks.get(&(w[0].clone(), w[1].clone())).map(|&r| (r, i)))
            .min();
        let Some((_, i)) = best else { return parts };
        let right = parts.remove(i + 1);
        parts[i].push_str(&right);
    }
}

fn render(pieces: &[String], merges: &[(String, String)], specials: usize) -> String {
    let added: Vec<serde_json::Value> = pieces[..specials]
        .iter()
        .enumerate()
        .map(|(id, content)| {
            serde_json::json!({"id": id, "content": content, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let vocab: serde_json::Map<String, serde_json::Value> = pieces
        .iter()
        .enumerate()
        .map(|(id, p)| (p.clone(), id.into()))
        .collect();
    let merges: Vec<[&str; 2]> = merges
        .iter()
        .map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
        "pre_tokenizer": null,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"}
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": merges}
    })
    .to_string()
}

/// A folder of the build's test scratch space holding the generated tokenizer (written once
/// per test process, through a temporary name: test processes run side by side).
pub fn dir(real: &Path) -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gemma-like");
        std::fs::create_dir_all(&dir).unwrap();
        let partial = dir.join(format!("tokenizer.json.{}", std::process::id()));
        std::fs::write(&partial, tokenizer_json(real)).unwrap();
        std::fs::rename(&partial, dir.join("tokenizer.json")).unwrap();
        dir
    })
    .clone()
}
