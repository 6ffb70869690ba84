//! A tokenizer's vocabulary as exact bytes: what every id stands for, whether it is special, and
//! which role it plays, loaded from a Hugging Face `tokenizer.json` and its side files.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};
use tokenizers::{NormalizerWrapper, PreTokenizerWrapper, Tokenizer};

use crate::canon::{parse_byte_fallback, special_role, surface_bytes, SpecialRole, SurfaceScheme};
use crate::error::{Error, Result};

/// What kind of entry a vocabulary id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// An ordinary token of the model's vocabulary.
    Normal,
    /// A SentencePiece `<0xHH>` byte-fallback token.
    ByteFallback,
    /// An added token that is not special (`<think>` in Qwen3): matched by its text.
    Added,
    /// A special token (BOS, EOS, chat markers, reserved ids): paired by role, never by text.
    Special,
    /// An id past the tokenizer's vocabulary, in the model's padded embedding table.
    Padding,
}

/// One vocabulary entry.
#[derive(Debug, Clone)]
pub struct Token {
    /// The string `tokenizer.json` stores for this id (empty for padding).
    pub surface: String,
    /// The exact bytes this token decodes to.
    pub bytes: Box<[u8]>,
    /// What kind of entry this is.
    pub kind: TokenKind,
    /// The role of a special token, when it has one.
    pub role: Option<SpecialRole>,
}

impl Token {
    fn padding() -> Self {
        Token {
            surface: String::new(),
            bytes: Box::new([]),
            kind: TokenKind::Padding,
            role: None,
        }
    }

    /// The token's bytes as a readable, quoted string: control characters escaped, bytes that
    /// are not valid UTF-8 as `\xHH`; special tokens as their text.
    pub fn display(&self) -> String {
        match self.kind {
            TokenKind::Padding => "<padding>".to_string(),
            TokenKind::Special => self.surface.clone(),
            _ => format!("\"{}\"", escape_bytes(&self.bytes)),
        }
    }
}

/// Escapes bytes for display: valid UTF-8 with `escape_debug`, other bytes as `\xHH`.
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '"' {
                out.push('"');
            } else {
                out.extend(c.escape_debug());
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02X}");
        }
    }
    out
}

/// A loaded tokenizer and its vocabulary as exact bytes.
pub struct Vocabulary {
    path: PathBuf,
    sha256: String,
    scheme: SurfaceScheme,
    tokenizer: Tokenizer,
    /// The tokenizer with SentencePiece's automatic prefix space switched off, for encoding the
    /// text of a single token exactly (`None` when the tokenizer adds no prefix space).
    piece_encoder: Option<Tokenizer>,
    tokens: Vec<Token>,
    size: usize,
    /// The entry every padding id shares.
    padding: Token,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("path", &self.path)
            .field("scheme", &self.scheme)
            .field("tokens", &self.tokens.len())
            .field("size", &self.size)
            .finish()
    }
}

/// Resolves a directory or a `tokenizer.json` path to the `tokenizer.json` file.
pub fn resolve_tokenizer_json(path: &Path) -> Result<PathBuf> {
    if path.is_dir() {
        let file = path.join("tokenizer.json");
        if file.is_file() {
            Ok(file)
        } else {
            Err(Error::NoTokenizerJson {
                dir: path.to_path_buf(),
            })
        }
    } else if path.exists() {
        Ok(path.to_path_buf())
    } else {
        Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
        ))
    }
}

/// SHA-256 of a byte string, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

impl Vocabulary {
    /// Loads a tokenizer from a directory holding `tokenizer.json` or from the file itself;
    /// `tokenizer_config.json` and `special_tokens_map.json` beside it are read when present.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::load_padded(path, None)
    }

    /// Like [`Vocabulary::load`], with the model's padded embedding size (Qwen3: 151,936 rows for
    /// 151,669 tokenizer ids). Ids past the tokenizer are [`TokenKind::Padding`].
    pub fn load_padded(path: impl AsRef<Path>, padded_size: Option<usize>) -> Result<Self> {
        let path = resolve_tokenizer_json(path.as_ref())?;
        let raw = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
        if raw.starts_with(b"version https://git-lfs") {
            return Err(Error::TokenizerParse {
                path,
                message: "this is a Git LFS pointer, not the file; run `git lfs pull`".into(),
            });
        }
        let sha256 = sha256_hex(&raw);
        let mut tokenizer = Tokenizer::from_bytes(&raw).map_err(|e| Error::TokenizerParse {
            path: path.clone(),
            message: e.to_string(),
        })?;
        // A `truncation` or `padding` section would silently cut or pad running text, and the
        // two sides of an alignment must encode all of it.
        tokenizer
            .with_truncation(None)
            .map_err(|e| Error::TokenizerParse {
                path: path.clone(),
                message: e.to_string(),
            })?;
        tokenizer.with_padding(None);
        // Text is text: a document that spells `<|im_start|>` or `<|begin_of_text|>` means those
        // characters, not the control ids (Hugging Face's `split_special_tokens`). Each tokenizer
        // knows different specials, so matching them in text would make the two sides encode
        // different texts. The specials the post-processor adds (Llama-3's BOS) keep their role.
        tokenizer.set_encode_special_tokens(true);
        drop(raw);
        check_ids(&path, &tokenizer)?;
        let scheme = detect_scheme(&path, &tokenizer)?;
        let config_roles = read_config_roles(path.parent().unwrap_or(Path::new(".")))?;
        let tokens = collect_tokens(&tokenizer, scheme, &config_roles);
        let size = match padded_size {
            Some(n) if n < tokens.len() => {
                return Err(Error::VocabSizeTooSmall {
                    path,
                    requested: n,
                    actual: tokens.len(),
                })
            }
            Some(n) => n,
            None => tokens.len(),
        };
        let piece_encoder = piece_encoder(&path, &tokenizer)?;
        Ok(Vocabulary {
            path,
            sha256,
            scheme,
            tokenizer,
            piece_encoder,
            tokens,
            size,
            padding: Token::padding(),
        })
    }

    /// Loads a student and a teacher tokenizer in parallel, each with an optional padded size.
    pub fn load_pair<P: AsRef<Path> + Sync>(
        student: (P, Option<usize>),
        teacher: (P, Option<usize>),
    ) -> Result<(Vocabulary, Vocabulary)> {
        std::thread::scope(|scope| {
            let t = scope.spawn(|| Vocabulary::load_padded(&teacher.0, teacher.1));
            let s = Vocabulary::load_padded(&student.0, student.1);
            let t = t
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            Ok((s?, t?))
        })
    }

    /// The `tokenizer.json` this vocabulary was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// SHA-256 of the `tokenizer.json` file, lowercase hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// How this family spells bytes in its vocabulary.
    pub fn scheme(&self) -> SurfaceScheme {
        self.scheme
    }

    /// Number of rows the model uses: the tokenizer's ids plus any padding.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Number of ids the tokenizer itself defines.
    pub fn tokenizer_size(&self) -> usize {
        self.tokens.len()
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The entry for `id`; padding ids yield a [`TokenKind::Padding`] entry, ids past
    /// [`Vocabulary::size`] `None`.
    pub fn token(&self, id: u32) -> Option<&Token> {
        let id = id as usize;
        if id < self.tokens.len() {
            Some(&self.tokens[id])
        } else if id < self.size {
            Some(&self.padding)
        } else {
            None
        }
    }

    /// The tokenizer's own entries (without padding), indexed by id.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// Finds a token by what a person would type: its exact text (`" the"`, `"201"`), its
    /// surface in `tokenizer.json` (`"Ġthe"`), or `#ID`.
    pub fn find(&self, query: &str) -> Result<u32> {
        if let Some(id) = query.strip_prefix('#').and_then(|s| s.parse::<u32>().ok()) {
            if (id as usize) < self.size {
                return Ok(id);
            }
        }
        let by_bytes = self
            .tokens
            .iter()
            .position(|t| t.kind != TokenKind::ByteFallback && &*t.bytes == query.as_bytes());
        let by_surface = || self.tokens.iter().position(|t| t.surface == query);
        by_bytes
            .or_else(by_surface)
            .map(|i| i as u32)
            .ok_or_else(|| Error::UnknownToken {
                path: self.path.clone(),
                token: format!("{query:?}"),
            })
    }

    /// Whether encoding puts a space before the text that the text does not have (SentencePiece's
    /// dummy prefix: Llama-2 encodes `"Hello"` as `"▁Hello"`).
    pub fn adds_prefix_space(&self) -> bool {
        self.piece_encoder.is_some()
    }

    /// Encodes a document the way the model sees it: the tokenizer's default encoding, with the
    /// special tokens its post-processor adds (Llama-3's BOS; none for Qwen3), never truncated.
    /// Special-token spellings in the text are encoded as the characters they are.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer
            .encode_fast(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| Error::Encode {
                path: self.path.clone(),
                text: text.chars().take(80).collect(),
                message: e.to_string(),
            })
    }

    /// Encodes each text as this tokenizer would inside running text: no special tokens added
    /// and no SentencePiece prefix space inserted, so the ids decode to exactly the text.
    pub fn encode_pieces(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let encoder = self.piece_encoder.as_ref().unwrap_or(&self.tokenizer);
        match encoder.encode_batch_fast(texts.to_vec(), false) {
            Ok(encodings) => Ok(encodings
                .into_iter()
                .map(|e| e.get_ids().to_vec())
                .collect()),
            // The batch error does not say which text failed: find it, to name it.
            Err(batch_error) => {
                for text in texts {
                    if let Err(e) = encoder.encode_fast(*text, false) {
                        return Err(Error::Encode {
                            path: self.path.clone(),
                            text: text.to_string(),
                            message: e.to_string(),
                        });
                    }
                }
                Err(Error::Encode {
                    path: self.path.clone(),
                    text: format!("a batch of {} texts", texts.len()),
                    message: batch_error.to_string(),
                })
            }
        }
    }
}

/// The ids of `tokenizer.json` name each entry once and run from 0 without gaps: two tokens of
/// one id, or an id past the entry count, would silently lose a token.
fn check_ids(path: &Path, tokenizer: &Tokenizer) -> Result<()> {
    let bad = |message: String| {
        Err(Error::TokenizerParse {
            path: path.to_path_buf(),
            message,
        })
    };
    let mut model: Vec<(u32, String)> = tokenizer
        .get_vocab(false)
        .into_iter()
        .map(|(token, id)| (id, token))
        .collect();
    model.sort_unstable();
    if let Some(pair) = model.windows(2).find(|w| w[0].0 == w[1].0) {
        return bad(format!(
            "model.vocab gives id {} to both {:?} and {:?}",
            pair[0].0, pair[0].1, pair[1].1
        ));
    }
    let added = tokenizer.get_added_tokens_decoder();
    let mut ids: Vec<u32> = model.iter().map(|(id, _)| *id).collect();
    ids.extend(added.keys().copied());
    ids.sort_unstable();
    ids.dedup();
    let Some(&last) = ids.last() else {
        return bad("the vocabulary is empty (no model.vocab entry, no added token)".into());
    };
    if last as usize + 1 != ids.len() {
        let missing = (0..)
            .zip(&ids)
            .find(|(i, id)| i != *id)
            .map_or(0, |(i, _)| i);
        let name = |id: u32| {
            let in_model = model.binary_search_by_key(&id, |(i, _)| *i).ok();
            in_model.map_or_else(
                || added.get(&id).map_or(String::new(), |t| t.content.clone()),
                |k| model[k].1.clone(),
            )
        };
        return bad(format!(
            "no token has id {missing}, but {:?} has id {last}: ids must run from 0 to the \
             number of entries ({}) without gaps",
            name(last),
            ids.len()
        ));
    }
    Ok(())
}

/// Collects the `"type"` fields of a serialized tokenizer component, depth first.
fn component_types(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(t)) = map.get("type") {
                out.push(t.clone());
            }
            map.values().for_each(|v| component_types(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| component_types(v, out)),
        _ => {}
    }
}

fn detect_scheme(path: &Path, tokenizer: &Tokenizer) -> Result<SurfaceScheme> {
    let to_value = |v: Option<Value>| v.unwrap_or(Value::Null);
    let decoder = to_value(
        tokenizer
            .get_decoder()
            .and_then(|d| serde_json::to_value(d).ok()),
    );
    let pre_tokenizer = to_value(
        tokenizer
            .get_pre_tokenizer()
            .and_then(|p| serde_json::to_value(p).ok()),
    );
    let mut types = Vec::new();
    component_types(&decoder, &mut types);
    let has = |t: &str| types.iter().any(|x| x == t);
    if has("ByteLevel") {
        return Ok(SurfaceScheme::ByteLevel);
    }
    let replaces_metaspace = decoder.to_string().contains('\u{2581}');
    if has("ByteFallback") || has("Metaspace") || replaces_metaspace {
        return Ok(SurfaceScheme::SentencePiece {
            byte_fallback: has("ByteFallback"),
        });
    }
    let mut pre_types = Vec::new();
    component_types(&pre_tokenizer, &mut pre_types);
    if types.is_empty() && pre_types.iter().any(|t| t == "ByteLevel") {
        return Ok(SurfaceScheme::ByteLevel);
    }
    Err(Error::UnsupportedTokenizer {
        path: path.to_path_buf(),
        detail: if types.is_empty() {
            "no decoder".to_string()
        } else {
            format!("decoder {}", types.join(" + "))
        },
    })
}

/// The tokenizer with its SentencePiece prefix space switched off, if it inserts one: the
/// `Prepend("▁")` normalizer of Llama-2 and the `prepend_scheme` of a `Metaspace` pre-tokenizer.
fn piece_encoder(path: &Path, tokenizer: &Tokenizer) -> Result<Option<Tokenizer>> {
    let unsupported = |what: &str, e: serde_json::Error| Error::UnsupportedTokenizer {
        path: path.to_path_buf(),
        detail: format!("{what} could not be rebuilt without its prefix space: {e}"),
    };
    let mut modified = None::<Tokenizer>;
    if let Some(normalizer) = tokenizer
        .get_normalizer()
        .and_then(|n| serde_json::to_value(n).ok())
    {
        if let Some(stripped) = without_prepend(&normalizer) {
            let mut t = tokenizer.clone();
            if stripped.is_null() {
                t.with_normalizer(None::<NormalizerWrapper>);
            } else {
                let n: NormalizerWrapper =
                    serde_json::from_value(stripped).map_err(|e| unsupported("normalizer", e))?;
                t.with_normalizer(Some(n));
            }
            modified = Some(t);
        }
    }
    if let Some(mut pre) = tokenizer
        .get_pre_tokenizer()
        .and_then(|p| serde_json::to_value(p).ok())
    {
        if disable_metaspace_prefix(&mut pre) {
            let p: PreTokenizerWrapper =
                serde_json::from_value(pre).map_err(|e| unsupported("pre_tokenizer", e))?;
            let mut t = modified.unwrap_or_else(|| tokenizer.clone());
            t.with_pre_tokenizer(Some(p));
            modified = Some(t);
        }
    }
    Ok(modified)
}

/// The normalizer without its `Prepend` steps (`Null` when nothing is left); `None` if it has none.
fn without_prepend(normalizer: &Value) -> Option<Value> {
    let is_prepend = |v: &Value| v.get("type").and_then(Value::as_str) == Some("Prepend");
    if is_prepend(normalizer) {
        return Some(Value::Null);
    }
    let steps = normalizer.get("normalizers")?.as_array()?;
    if !steps.iter().any(is_prepend) {
        return None;
    }
    let kept: Vec<Value> = steps.iter().filter(|v| !is_prepend(v)).cloned().collect();
    if kept.is_empty() {
        return Some(Value::Null);
    }
    let mut out = normalizer.clone();
    out["normalizers"] = Value::Array(kept);
    Some(out)
}

/// Sets every `Metaspace` pre-tokenizer to never prepend a space; true if one did.
fn disable_metaspace_prefix(value: &mut Value) -> bool {
    match value {
        Value::Object(map) => {
            let mut changed = false;
            if map.get("type").and_then(Value::as_str) == Some("Metaspace") {
                let prepends = map
                    .get("prepend_scheme")
                    .and_then(Value::as_str)
                    .map(|s| s != "never")
                    .or_else(|| map.get("add_prefix_space").and_then(Value::as_bool))
                    .unwrap_or(true);
                if prepends {
                    map.insert("prepend_scheme".into(), Value::String("never".into()));
                    if map.contains_key("add_prefix_space") {
                        map.insert("add_prefix_space".into(), Value::Bool(false));
                    }
                    changed = true;
                }
            }
            for v in map.values_mut() {
                changed |= disable_metaspace_prefix(v);
            }
            changed
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |acc, v| disable_metaspace_prefix(v) | acc),
        _ => false,
    }
}

/// Roles the side files give special-token texts: `bos_token`, `eos_token`, `pad_token`,
/// `unk_token` of `special_tokens_map.json` and `tokenizer_config.json`, in that order.
fn read_config_roles(dir: &Path) -> Result<HashMap<String, Vec<SpecialRole>>> {
    const FIELDS: [(&str, SpecialRole); 4] = [
        ("bos_token", SpecialRole::Bos),
        ("eos_token", SpecialRole::Eos),
        ("pad_token", SpecialRole::Pad),
        ("unk_token", SpecialRole::Unk),
    ];
    let mut roles: HashMap<String, Vec<SpecialRole>> = HashMap::new();
    for name in ["special_tokens_map.json", "tokenizer_config.json"] {
        let file = dir.join(name);
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&file, e)),
        };
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::BadJson {
            path: file.clone(),
            message: e.to_string(),
        })?;
        for (field, role) in FIELDS {
            let content = match json.get(field) {
                None | Some(Value::Null) => continue,
                Some(Value::String(s)) => Some(s.as_str()),
                Some(Value::Object(o)) => o.get("content").and_then(Value::as_str),
                Some(_) => None,
            };
            let Some(content) = content.map(str::to_string) else {
                return Err(Error::BadConfigField {
                    path: file.clone(),
                    field: field.into(),
                    message: "expected a string or an object with a string `content`".into(),
                });
            };
            let entry = roles.entry(content).or_default();
            if !entry.contains(&role) {
                entry.push(role);
            }
        }
    }
    Ok(roles)
}

fn collect_tokens(
    tokenizer: &Tokenizer,
    scheme: SurfaceScheme,
    config_roles: &HashMap<String, Vec<SpecialRole>>,
) -> Vec<Token> {
    let added = tokenizer.get_added_tokens_decoder();
    let max_added = added.keys().map(|&id| id as usize + 1).max().unwrap_or(0);
    let n = tokenizer.get_vocab_size(true).max(max_added);
    let byte_fallback = matches!(
        scheme,
        SurfaceScheme::SentencePiece {
            byte_fallback: true
        }
    );
    (0..n as u32)
        .map(|id| {
            if let Some(a) = added.get(&id) {
                let roles = config_roles
                    .get(&a.content)
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                let special = a.special || !roles.is_empty();
                return Token {
                    surface: a.content.clone(),
                    bytes: a.content.as_bytes().into(),
                    kind: if special {
                        TokenKind::Special
                    } else {
                        TokenKind::Added
                    },
                    role: if special {
                        special_role(&a.content, roles)
                    } else {
                        None
                    },
                };
            }
            match tokenizer.id_to_token(id) {
                Some(surface) => {
                    let kind = if byte_fallback && parse_byte_fallback(&surface).is_some() {
                        TokenKind::ByteFallback
                    } else {
                        TokenKind::Normal
                    };
                    Token {
                        bytes: surface_bytes(&surface, scheme).into(),
                        surface,
                        kind,
                        role: None,
                    }
                }
                // A hole in the id range: nothing the tokenizer can emit.
                None => Token::padding(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_sha256_hex() {
        // hashlib.sha256("".encode()).hexdigest() and of "abc".
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn escape_bytes_shows_partial_utf8_and_controls() {
        assert_eq!(escape_bytes(b" the"), " the");
        assert_eq!(escape_bytes(b"\n"), "\\n");
        assert_eq!(escape_bytes(&[0xE2, 0x82]), "\\xE2\\x82");
        assert_eq!(escape_bytes("é".as_bytes()), "é");
    }

    #[test]
    fn prepend_is_removed_from_a_normalizer_sequence() {
        let n = serde_json::json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]});
        let out = without_prepend(&n).unwrap();
        assert_eq!(out["normalizers"].as_array().unwrap().len(), 1);
        assert!(without_prepend(&serde_json::json!({"type": "NFC"})).is_none());
    }

    #[test]
    fn metaspace_prefix_is_switched_off() {
        let mut p = serde_json::json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true});
        assert!(disable_metaspace_prefix(&mut p));
        assert_eq!(p["prepend_scheme"], "never");
        assert!(!disable_metaspace_prefix(&mut p));
    }

    #[test]
    fn missing_paths_are_named() {
        let err = Vocabulary::load("/nonexistent/dir/tokenizer.json").unwrap_err();
        assert!(err.to_string().contains("/nonexistent/dir/tokenizer.json"));
        let dir = std::env::temp_dir().join("xtoken-empty-dir-test");
        std::fs::create_dir_all(&dir).unwrap();
        let err = Vocabulary::load(&dir).unwrap_err();
        assert!(matches!(err, Error::NoTokenizerJson { .. }), "{err}");
    }
}
