//! End-to-end tests on tiny tokenizers written here, and the errors malformed input must give.
//! These need no external files and always run.

use std::path::{Path, PathBuf};

use xtoken::core::canon::SpecialRole;
use xtoken::core::projection::{ProjectionParams, RowSource, SparseProjection};
use xtoken::core::vocab::{TokenKind, Vocabulary};
use xtoken::core::Error;

use crate::tokenizer_json;
use tokenizer_json::byte_level;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("xtoken-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn added(id: u32, content: &str, special: bool) -> String {
    format!(
        r#"{{"id":{id},"content":"{content}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":{special}}}"#
    )
}

/// A SentencePiece-style BPE tokenizer with byte fallback (Llama-2 layout: `<0xHH>` at 3..=258).
fn sentencepiece(pieces: &[&str], merges: &[&str]) -> String {
    let mut vocab = vec![
        r#""<unk>":0"#.to_string(),
        r#""<s>":1"#.to_string(),
        r#""</s>":2"#.to_string(),
    ];
    vocab.extend((0..256).map(|b| format!(r#""<0x{b:02X}>":{}"#, 3 + b)));
    vocab.extend(
        pieces
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}:{}", serde_json::to_string(p).unwrap(), 259 + i)),
    );
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,
        "added_tokens":[{},{},{}],
        "normalizer":{{"type":"Sequence","normalizers":[{{"type":"Prepend","prepend":"▁"}},
          {{"type":"Replace","pattern":{{"String":" "}},"content":"▁"}}]}},
        "pre_tokenizer":null,"post_processor":null,
        "decoder":{{"type":"Sequence","decoders":[{{"type":"Replace","pattern":{{"String":"▁"}},"content":" "}},
          {{"type":"ByteFallback"}},{{"type":"Fuse"}},{{"type":"Strip","content":" ","start":1,"stop":0}}]}},
        "model":{{"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,
          "end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":true,
          "vocab":{{{}}},"merges":{}}}}}"#,
        added(0, "<unk>", true),
        added(1, "<s>", true),
        added(2, "</s>", true),
        vocab.join(","),
        serde_json::to_string(merges).unwrap()
    )
}

/// Every single byte as a byte-level token, then `extra`.
fn byte_level_alphabet_plus(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = (0..=255u8)
        .map(|b| xtoken::core::canon::byte_level_char(b).to_string())
        .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn student_dir() -> TempDir {
    let dir = TempDir::new("student");
    let vocab = byte_level_alphabet_plus(&["Ġt", "he", "Ġthe", "20", "201", "Ġ,"]);
    let vocab: Vec<&str> = vocab.iter().map(String::as_str).collect();
    dir.write(
        "tokenizer.json",
        &byte_level(
            &vocab,
            &["Ġ t", "h e", "Ġt he", "2 0", "20 1", "Ġ ,"],
            &[
                added(262, "<|eos|>", true),
                added(263, "<|reserved|>", true),
            ],
        ),
    );
    dir.write("special_tokens_map.json", r#"{"eos_token": "<|eos|>"}"#);
    dir
}

fn teacher_dir() -> TempDir {
    let dir = TempDir::new("teacher");
    dir.write(
        "tokenizer.json",
        &sentencepiece(
            &["▁", "t", "h", "e", "▁t", "he", "▁the", ","],
            &["▁ t", "h e", "▁t he"],
        ),
    );
    dir.write(
        "special_tokens_map.json",
        r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "unk_token": "<unk>"}"#,
    );
    dir
}

fn row_bytes(teacher: &Vocabulary, w: &SparseProjection, s: u32) -> Vec<(Vec<u8>, f32)> {
    w.row(s)
        .map(|(t, x)| (teacher.tokens()[t as usize].bytes.to_vec(), x))
        .collect()
}

#[test]
fn tiny_byte_level_student_to_sentencepiece_teacher() {
    let (s_dir, t_dir) = (student_dir(), teacher_dir());
    let student = Vocabulary::load(&s_dir.0).unwrap();
    let teacher = Vocabulary::load(t_dir.0.join("tokenizer.json")).unwrap();
    assert_eq!(student.tokenizer_size(), 264);
    assert_eq!(teacher.tokenizer_size(), 267);
    let (w, report) =
        SparseProjection::build(&student, &teacher, ProjectionParams::default()).unwrap();

    // " the" is spelled Ġthe and ▁the: an exact match.
    let the = student.find(" the").unwrap();
    assert_eq!(row_bytes(&teacher, &w, the), vec![(b" the".to_vec(), 1.0)]);
    assert_eq!(report.sources[the as usize], RowSource::Exact);
    // "201" re-encodes through byte fallback to 2, 0, 1 with the paper's weights, with no
    // SentencePiece prefix space added.
    let n201 = student.find("201").unwrap();
    let row = row_bytes(&teacher, &w, n201);
    let texts: Vec<&[u8]> = row.iter().map(|(b, _)| b.as_slice()).collect();
    assert_eq!(texts, [b"2", b"0", b"1"]);
    assert!((row[0].1 - 0.9009).abs() < 1e-4 && (row[2].1 - 0.0090).abs() < 1e-4);
    // " ," has no byte-identical partner in the teacher; rule 4 pairs it with ",".
    let comma = student.find(" ,").unwrap();
    assert_eq!(row_bytes(&teacher, &w, comma), vec![(b",".to_vec(), 1.0)]);
    // Single bytes match byte-fallback tokens exactly.
    let newline = student.find("\n").unwrap();
    assert_eq!(
        row_bytes(&teacher, &w, newline),
        vec![(b"\n".to_vec(), 1.0)]
    );
    // The EOS pairs by role; the reserved special has no counterpart and is reported.
    let eos = student.find("<|eos|>").unwrap();
    assert_eq!(student.tokens()[eos as usize].role, Some(SpecialRole::Eos));
    assert_eq!(w.top1(eos), Some((2, 1.0)));
    let reserved = student.find("<|reserved|>").unwrap();
    assert!(w.top1(reserved).is_none());
    assert!(report.empty.iter().any(|(s, _)| *s == reserved));
}

#[test]
fn partial_utf8_student_tokens_keep_their_bytes() {
    let (s_dir, t_dir) = (student_dir(), teacher_dir());
    // Add a student token holding the first two bytes of "€" (E2 82 AC).
    let vocab = byte_level_alphabet_plus(&["âĤ"]);
    let vocab: Vec<&str> = vocab.iter().map(String::as_str).collect();
    s_dir.write("tokenizer.json", &byte_level(&vocab, &["â Ĥ"], &[]));
    let student = Vocabulary::load(&s_dir.0).unwrap();
    let teacher = Vocabulary::load(&t_dir.0).unwrap();
    let (w, _) = SparseProjection::build(&student, &teacher, ProjectionParams::default()).unwrap();
    let s = 256;
    assert_eq!(&*student.tokens()[s].bytes, &[0xE2, 0x82]);
    let row = row_bytes(&teacher, &w, s as u32);
    assert_eq!(
        row.iter().map(|(b, _)| b[0]).collect::<Vec<_>>(),
        [0xE2, 0x82]
    );
}

fn assert_names(err: Error, path: &Path, words: &str) {
    let msg = err.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains(words), "{msg}");
}

#[test]
fn missing_and_malformed_files_name_the_file() {
    let dir = TempDir::new("malformed");
    let missing = dir.0.join("nope").join("tokenizer.json");
    assert_names(
        Vocabulary::load(&missing).unwrap_err(),
        &missing,
        "no such file",
    );
    assert_names(
        Vocabulary::load(&dir.0).unwrap_err(),
        &dir.0,
        "no tokenizer.json",
    );

    let garbage = dir.write("tokenizer.json", "{ not json");
    assert_names(
        Vocabulary::load(&dir.0).unwrap_err(),
        &garbage,
        "not a valid Hugging Face tokenizer.json",
    );
    let lfs = dir.write(
        "tokenizer.json",
        "version https://git-lfs.github.com/spec/v1\noid sha256:abc\n",
    );
    assert_names(Vocabulary::load(&lfs).unwrap_err(), &lfs, "Git LFS pointer");

    let vocab = byte_level_alphabet_plus(&[]);
    let vocab: Vec<&str> = vocab.iter().map(String::as_str).collect();
    dir.write("tokenizer.json", &byte_level(&vocab, &[], &[]));
    let config = dir.write("tokenizer_config.json", r#"{"bos_token": 5}"#);
    assert_names(
        Vocabulary::load(&dir.0).unwrap_err(),
        &config,
        "`bos_token`",
    );
    let config = dir.write("tokenizer_config.json", "{");
    assert_names(
        Vocabulary::load(&dir.0).unwrap_err(),
        &config,
        "invalid JSON",
    );
    std::fs::remove_file(&config).unwrap();
    assert!(Vocabulary::load(&dir.0).is_ok());
}

#[test]
fn vocabularies_that_would_lose_a_token_are_refused_by_name() {
    let dir = TempDir::new("ids");
    let abc = byte_level(&["a", "b", "c"], &[], &[]);
    let cases = [
        (byte_level(&[], &[], &[]), "the vocabulary is empty"),
        (
            abc.replace(r#""c":2"#, r#""c":1"#),
            r#"model.vocab gives id 1 to both "b" and "c""#,
        ),
        (
            abc.replace(r#""c":2"#, r#""c":7"#),
            r#"no token has id 2, but "c" has id 7"#,
        ),
    ];
    for (text, words) in cases {
        let file = dir.write("tokenizer.json", &text);
        assert_names(Vocabulary::load(&file).unwrap_err(), &file, words);
    }
    // Added tokens may repeat a model entry (Llama-2's `<s>`) and extend the ids.
    let file = dir.write(
        "tokenizer.json",
        &byte_level(
            &["a", "b", "c"],
            &[],
            &[added(2, "c", true), added(3, "<x>", true)],
        ),
    );
    assert_eq!(Vocabulary::load(&file).unwrap().tokenizer_size(), 4);
}

#[test]
fn unsupported_tokenizer_families_are_refused_by_name() {
    let dir = TempDir::new("wordpiece");
    let file = dir.write(
        "tokenizer.json",
        r###"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
        "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,
        "decoder":{"type":"WordPiece","prefix":"##","cleanup":true},
        "model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##",
          "max_input_chars_per_word":100,"vocab":{"[UNK]":0,"a":1,"##b":2}}}"###,
    );
    assert_names(
        Vocabulary::load(&file).unwrap_err(),
        &file,
        "decoder WordPiece",
    );
}

#[test]
fn kinds_of_entries() {
    let t_dir = teacher_dir();
    let teacher = Vocabulary::load_padded(&t_dir.0, Some(300)).unwrap();
    assert_eq!(teacher.tokens()[0].kind, TokenKind::Special);
    assert_eq!(teacher.tokens()[3 + 0x41].kind, TokenKind::ByteFallback);
    assert_eq!(teacher.tokens()[259].kind, TokenKind::Normal);
    assert_eq!(&*teacher.tokens()[259].bytes, b" ");
    assert_eq!(teacher.token(299).map(|t| t.kind), Some(TokenKind::Padding));
    assert!(teacher.token(300).is_none());
    assert_eq!(teacher.find("#299").unwrap(), 299);
    assert!(teacher
        .find("zzz")
        .unwrap_err()
        .to_string()
        .contains("\"zzz\""));
}

/// SHA-256 of W's rows (each slot's teacher id and weight bits) and its sizes.
pub fn w_digest(w: &SparseProjection) -> String {
    let mut bytes = Vec::new();
    for n in [w.student_vocab_size(), w.teacher_vocab_size(), w.top_k()] {
        bytes.extend_from_slice(&(n as u64).to_le_bytes());
    }
    for s in 0..w.student_vocab_size() as u32 {
        for (t, x) in w.row(s) {
            bytes.extend_from_slice(&t.to_le_bytes());
            bytes.extend_from_slice(&x.to_bits().to_le_bytes());
        }
        bytes.push(0xff);
    }
    xtoken::core::vocab::sha256_hex(&bytes)
}

/// W of a pair is built once and read from the cache after, under a name its tokenizers and
/// parameters decide; a damaged entry is built again and replaced, and `Off` writes nothing.
#[test]
fn the_projection_cache_builds_once_per_pair() {
    use xtoken::core::projection_cache::{ProjectionCache, Source};
    let (s_dir, t_dir) = (student_dir(), teacher_dir());
    let student = Vocabulary::load(&s_dir.0).unwrap();
    let teacher = Vocabulary::load(&t_dir.0).unwrap();
    let dir = TempDir::new("w-cache");
    let cache = ProjectionCache::Dir(dir.0.join("projections"));
    let params = ProjectionParams::default();
    let (built, source) = cache.get_or_build(&student, &teacher, params).unwrap();
    let entry = cache.entry(&student, &teacher, &params).unwrap();
    assert_eq!(source, Source::Built(Some(entry.clone())));
    let (cached, source) = cache.get_or_build(&student, &teacher, params).unwrap();
    assert_eq!(source, Source::Cached(entry.clone()));
    assert_eq!(w_digest(&cached), w_digest(&built));
    // Other parameters, another entry; the reversed pair, another.
    let two = ProjectionParams { top_k: 2, ..params };
    assert_ne!(cache.entry(&student, &teacher, &two), Some(entry.clone()));
    assert_ne!(
        cache.entry(&teacher, &student, &params),
        Some(entry.clone())
    );
    // A damaged entry is not used: W is built again, and the entry replaced.
    let whole = std::fs::read(&entry).unwrap();
    std::fs::write(&entry, &whole[..whole.len() / 2]).unwrap();
    let (again, source) = cache.get_or_build(&student, &teacher, params).unwrap();
    assert_eq!(source, Source::Built(Some(entry.clone())));
    assert_eq!(w_digest(&again), w_digest(&built));
    // The replaced entry is whole again and read as it was written (its metadata map is
    // written in no fixed order, so the bytes may differ).
    let (reread, source) = cache.get_or_build(&student, &teacher, params).unwrap();
    assert_eq!(source, Source::Cached(entry.clone()));
    assert_eq!(w_digest(&reread), w_digest(&built));
    // Off: built, nothing stored.
    let (_, source) = ProjectionCache::Off
        .get_or_build(&student, &teacher, params)
        .unwrap();
    assert_eq!(source, Source::Built(None));
}

/// The digest of W on the tiny pair: a change to what `SparseProjection::build` makes fails
/// it, and must come with a new `projection_cache::BUILD_VERSION` (cached entries of the old
/// construction are then never read) and the new digest here.
#[test]
fn a_change_to_ws_construction_bumps_the_cache_version() {
    let (s_dir, t_dir) = (student_dir(), teacher_dir());
    let student = Vocabulary::load(&s_dir.0).unwrap();
    let teacher = Vocabulary::load(&t_dir.0).unwrap();
    let (w, _) = SparseProjection::build(&student, &teacher, ProjectionParams::default()).unwrap();
    assert_eq!(xtoken::core::projection_cache::BUILD_VERSION, 1);
    assert_eq!(
        w_digest(&w),
        "7eea28e04d6a6ffaa283a242e8dae37b23c1921a51c0f2df98cb89397b9d30bc"
    );
}
