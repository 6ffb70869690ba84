//! DP alignment on the real Llama-3.2, Qwen3, Phi-4-mini, Llama-2 and Mistral-v0.3 tokenizers
//! and a generated one of Gemma's structure (`support::gemma_like`), read from
//! `XTOKEN_TOKENIZERS_DIR` (CI: `../shared/tokenizers`). Without it they are ignored, with a reason.

use crate::support::{gemma_like, tokenizers_dir};
use std::sync::OnceLock;

use proptest::prelude::*;
use xtoken::core::align::{
    greedy, AlignParams, Aligner, Alignment, Chunk, ChunkKind, Positions, Workspace,
};
use xtoken::core::cache::{AlignCache, CacheMetadata, CacheWriter, TokenizerRecord};
use xtoken::core::plan::{BatchPlan, ChunkPlan, MergeVariant, PlanItem};
use xtoken::core::vocab::{TokenKind, Vocabulary};
use xtoken::train::config::DataFormat;
use xtoken::train::data::pipeline::{align_file, FileJob, Pipeline};
use xtoken::train::data::written::written;

struct Vocabs {
    llama3: Vocabulary,
    qwen3: Vocabulary,
    phi4: Vocabulary,
    llama2: Vocabulary,
    mistral: Vocabulary,
    gemma: Vocabulary,
}

fn vocabs() -> &'static Vocabs {
    static V: OnceLock<Vocabs> = OnceLock::new();
    V.get_or_init(|| {
        let load = |name: &str| {
            Vocabulary::load(tokenizers_dir().join(name))
                .unwrap_or_else(|e| panic!("loading {name}: {e}"))
        };
        Vocabs {
            llama3: load("llama-3.2"),
            qwen3: load("qwen3"),
            phi4: load("phi-4-mini"),
            llama2: load("llama-2"),
            mistral: load("mistral-v0.3"),
            gemma: Vocabulary::load(gemma_like::dir(&tokenizers_dir())).unwrap(),
        }
    })
}

/// Llama-3.2 against each teacher, with the paper's parameters and with span recovery.
fn aligners() -> &'static Vec<(&'static str, &'static Vocabulary, Aligner, Aligner)> {
    static A: OnceLock<Vec<(&str, &Vocabulary, Aligner, Aligner)>> = OnceLock::new();
    A.get_or_init(|| {
        let v = vocabs();
        let recover = AlignParams {
            recover_spans: true,
            ..AlignParams::default()
        };
        [
            ("qwen3", &v.qwen3),
            ("phi-4-mini", &v.phi4),
            ("llama-2", &v.llama2),
            ("mistral-v0.3", &v.mistral),
            ("gemma-like", &v.gemma),
        ]
        .into_iter()
        .map(|(name, t)| {
            (
                name,
                t,
                Aligner::new(&v.llama3, t, AlignParams::default()).unwrap(),
                Aligner::new(&v.llama3, t, recover).unwrap(),
            )
        })
        .collect()
    })
}

/// Coverage, order, and byte equality of two-sided chunks (both sides encode one text).
fn check_invariants(
    al: &Aligner,
    a: &Alignment,
    student: &[u32],
    teacher: &[u32],
    teacher_vocab: &Vocabulary,
) {
    use xtoken::core::align::Side;
    let (s_bytes, s_off) = al.spell(Side::Student, student).unwrap();
    let (t_bytes, t_off) = al.spell(Side::Teacher, teacher).unwrap();
    let (mut p, mut q) = (0u32, 0u32);
    for c in &a.chunks {
        assert_eq!(
            (c.student.start, c.teacher.start),
            (p, q),
            "chunks out of order"
        );
        p += c.student.len;
        q += c.teacher.len;
        if !c.is_aligned() {
            assert!(c.student.is_empty() || c.teacher.is_empty());
            continue;
        }
        let (sr, tr) = (c.student.range(), c.teacher.range());
        let special = |v: &Vocabulary, id: u32| v.token(id).unwrap().kind == TokenKind::Special;
        if c.kind == ChunkKind::Match
            && special(&vocabs().llama3, student[sr.start])
            && special(teacher_vocab, teacher[tr.start])
        {
            // Special tokens pair by role (Llama-3's BOS with Llama-2's `<s>`), not by text.
            continue;
        }
        let s = &s_bytes[s_off[sr.start] as usize..s_off[sr.end] as usize];
        let t = &t_bytes[t_off[tr.start] as usize..t_off[tr.end] as usize];
        // Raw bytes: a lossy UTF-8 view turns any two partial characters into the same U+FFFD.
        assert!(
            s == t,
            "two-sided chunk {c:?} spells different bytes: student \"{}\", teacher \"{}\"",
            s.escape_ascii(),
            t.escape_ascii()
        );
    }
    assert_eq!(
        (p, q),
        (a.student_len, a.teacher_len),
        "chunks do not cover both sequences"
    );
    // Every two-sided chunk covers the same bytes of the text on both sides.
    al.verify(student, teacher, a).unwrap();
}

fn is_text(id: u32) -> bool {
    vocabs().llama3.token(id).unwrap().kind != TokenKind::Special
}

/// Student positions that are ordinary text (not special tokens).
fn text_positions(ids: &[u32]) -> usize {
    ids.iter().filter(|&&id| is_text(id)).count()
}

/// Student text positions in two-sided chunks.
fn aligned_text_positions(a: &Alignment, ids: &[u32]) -> usize {
    a.aligned()
        .flat_map(|c| c.student.range())
        .filter(|&p| is_text(ids[p]))
        .count()
}

/// The first text token of `vocab` whose bytes are `bytes`.
fn byte_token(vocab: &Vocabulary, bytes: &[u8]) -> u32 {
    let found = vocab.tokens().iter().position(|t| &*t.bytes == bytes);
    found.unwrap_or_else(|| panic!("no token spells {bytes:?}")) as u32
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn the_invariant_check_sees_split_characters() {
    // Two different halves of CJK characters (日 = E6 97 A5, 期 = E6 9C 9F): as lossy UTF-8
    // both read "\u{FFFD}", as bytes they differ. A chunk pairing them must fail the check.
    let v = vocabs();
    let student = vec![byte_token(&v.llama3, &[0xE6, 0x97])];
    let teacher = vec![byte_token(&v.qwen3, &[0xE6, 0x9C])];
    assert_eq!(
        String::from_utf8_lossy(&[0xE6, 0x97]),
        String::from_utf8_lossy(&[0xE6, 0x9C])
    );
    let (_, _, al, _) = &aligners()[0];
    let wrong = Alignment {
        chunks: vec![Chunk {
            student: Positions { start: 0, len: 1 },
            teacher: Positions { start: 0, len: 1 },
            kind: ChunkKind::Match,
        }],
        student_len: 1,
        teacher_len: 1,
        score: 3.0,
        band_bytes: 16,
        band_edge_reached: false,
    };
    let caught =
        std::panic::catch_unwind(|| check_invariants(al, &wrong, &student, &teacher, &v.qwen3));
    assert!(
        caught.is_err(),
        "a chunk of two different partial characters passed"
    );
    // The aligner itself leaves them unaligned.
    let found = al.align(&student, &teacher).unwrap();
    assert_eq!(found.aligned().count(), 0, "{:?}", found.chunks);
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn paper_hello_world_bos_costs_one_gap() {
    let v = vocabs();
    let student = v.llama3.encode("Hello world.").unwrap();
    assert_eq!(student.len(), 4, "Llama-3.2 adds <|begin_of_text|>");
    for (name, teacher_vocab, al, _) in aligners() {
        let teacher = teacher_vocab.encode("Hello world.").unwrap();
        let a = al.align(&student, &teacher).unwrap();
        check_invariants(al, &a, &student, &teacher, teacher_vocab);
        if ["llama-2", "mistral-v0.3", "gemma-like"].contains(name) {
            // These add their own BOS: the two pair by role, then three matches.
            assert_eq!(a.chunks.len(), 4, "{name}: {:?}", a.chunks);
            assert!(
                a.chunks.iter().all(|c| c.kind == ChunkKind::Match),
                "{name}: {:?}",
                a.chunks
            );
            continue;
        }
        let gaps: Vec<_> = a.chunks.iter().filter(|c| !c.is_aligned()).collect();
        let bos_gap = gaps
            .iter()
            .any(|c| c.student.range() == (0..1) && c.teacher.is_empty());
        assert!(
            bos_gap,
            "{name}: BOS must be a one-sided gap: {:?}",
            a.chunks
        );
        assert_eq!(a.aligned_positions().0, 3, "{name}: {:?}", a.chunks);
        if *name == "qwen3" {
            // The paper's table: one gap, then three 1-to-1 matches.
            assert_eq!(a.chunks.len(), 4);
            assert!(a.chunks[1..].iter().all(|c| c.kind == ChunkKind::Match));
            // GOLD's buffer aligner lumps everything into one forced group.
            let g = greedy(al, &student, &teacher).unwrap();
            assert_eq!(g.chunks.len(), 1, "{:?}", g.chunks);
            assert_eq!(g.chunks[0].student.len, 4);
            assert_eq!(g.chunks[0].teacher.len, 3);
        }
    }
}

const HARD_TEXTS: &[&str] = &[
    "line one\r\nline two\r\n\r\n",
    "a   b\t\tc\n\n\n    indented\n",
    "Emoji: 😀👍🏽👨‍👩‍👧‍👦 🇯🇵!",
    "日本語のテキストと中文文本，还有한국어 문장.",
    "مرحبا بالعالم، هذا نص عربي.",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "π ≈ 3.14159; e = 2.71828; 1,234,567.89 and 0x1F",
    "See https://example.com/a/b?c=1&d=two#frag or mailto:x@y.org.",
    "   leading spaces and trailing   ",
    "",
];

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn hard_texts_keep_the_invariants_and_align_every_text_token() {
    let v = vocabs();
    for text in HARD_TEXTS {
        let student = v.llama3.encode(text).unwrap();
        for (name, teacher_vocab, paper, recovering) in aligners() {
            let teacher = teacher_vocab.encode(text).unwrap();
            for al in [paper, recovering] {
                let a = al.align(&student, &teacher).unwrap();
                check_invariants(al, &a, &student, &teacher, teacher_vocab);
                let full = al.align_exhaustive(&student, &teacher).unwrap();
                assert_eq!(a.score, full.score, "{name} {text:?}");
            }
            // With span recovery every text token of the student is in a two-sided chunk (but
            // for Mistral's first token after leading spaces: see the Qwen student's test).
            let a = recovering.align(&student, &teacher).unwrap();
            let allowed = usize::from(text.starts_with(' ') && *name == "mistral-v0.3");
            let aligned = aligned_text_positions(&a, &student);
            assert!(
                text_positions(&student) - aligned <= allowed,
                "{name} {text:?}: {aligned} of {} aligned: {:?}",
                text_positions(&student),
                a.chunks
            );
        }
    }
}

/// Qwen3 as the student (a Qwen2.5 or Qwen3 student shares its tokenizer) against the
/// SentencePiece teachers: every text token of the hard texts lands in a two-sided chunk.
#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn a_qwen_student_aligns_with_mistral_and_gemma_teachers() {
    let v = vocabs();
    let recover = AlignParams {
        recover_spans: true,
        ..AlignParams::default()
    };
    for (name, teacher_vocab) in [("mistral-v0.3", &v.mistral), ("gemma-like", &v.gemma)] {
        let al = Aligner::new(&v.qwen3, teacher_vocab, recover).unwrap();
        for text in HARD_TEXTS {
            let student = v.qwen3.encode(text).unwrap();
            let teacher = teacher_vocab.encode(text).unwrap();
            let a = al.align(&student, &teacher).unwrap();
            al.verify(&student, &teacher, &a).unwrap();
            let text_tokens = student
                .iter()
                .filter(|&&id| v.qwen3.token(id).unwrap().kind != TokenKind::Special)
                .count();
            let aligned = a
                .aligned()
                .flat_map(|c| c.student.range())
                .filter(|&p| v.qwen3.token(student[p]).unwrap().kind != TokenKind::Special)
                .count();
            // Mistral-v0.3 puts its prefix space only before a text that does not start with
            // one, which its ids do not tell: a text that starts with spaces may leave its first
            // token unaligned (a one-sided gap, never a wrong pair: `verify` holds).
            let leading_space = text.starts_with(' ') && name == "mistral-v0.3";
            let allowed = if leading_space { 1 } else { 0 };
            assert!(
                text_tokens - aligned <= allowed,
                "{name} {text:?}: {aligned} of {text_tokens} aligned: {:?}",
                a.chunks
            );
        }
    }
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn numerals_combine_one_to_many_under_qwen3() {
    let v = vocabs();
    let (_, teacher_vocab, al, _) = &aligners()[0];
    let student = v.llama3.encode("3.14159").unwrap();
    let teacher = teacher_vocab.encode("3.14159").unwrap();
    let a = al.align(&student, &teacher).unwrap();
    let shape: Vec<(u32, u32)> = a
        .aligned()
        .map(|c| (c.student.len, c.teacher.len))
        .collect();
    // "3" "." "141" "59" against single digits.
    assert_eq!(shape, vec![(1, 1), (1, 1), (1, 3), (1, 2)]);
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn identical_tokenizers_give_only_one_to_one_chunks() {
    let v = vocabs();
    let al = Aligner::new(&v.llama3, &v.llama3, AlignParams::default()).unwrap();
    for text in HARD_TEXTS {
        let ids = v.llama3.encode(text).unwrap();
        let a = al.align(&ids, &ids).unwrap();
        assert_eq!(a.chunks.len(), ids.len());
        assert!(a.chunks.iter().all(|c| c.kind == ChunkKind::Match));
    }
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn banded_equals_exhaustive_on_a_long_mixed_document() {
    let v = vocabs();
    let text = HARD_TEXTS.concat().repeat(6);
    let student = v.llama3.encode(&text).unwrap();
    assert!(student.len() > 500);
    for (name, teacher_vocab, al, _) in aligners() {
        let teacher = teacher_vocab.encode(&text).unwrap();
        let banded = al.align(&student, &teacher).unwrap();
        let full = al.align_exhaustive(&student, &teacher).unwrap();
        assert_eq!(banded.score, full.score, "{name}");
        assert_eq!(banded.chunks, full.chunks, "{name}");
        let s = aligned_text_positions(&banded, &student);
        // Gemma's SentencePiece has no pre-tokenizer: runs of spaces and tabs merge with the
        // word after them in other places than Llama-3's byte-level pieces cut them, and the
        // paper's aligner leaves such a crossing pair unaligned (span recovery aligns it: see
        // the hard texts above).
        let share = if *name == "gemma-like" { 0.9 } else { 0.97 };
        assert!(
            s as f64 >= share * text_positions(&student) as f64,
            "{name}: only {s} of {} student tokens aligned",
            student.len()
        );
    }
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn multi_teacher_plans_and_cache_round_trip() {
    let v = vocabs();
    let text = "The year 2024 had 366 days. 日本 😀\n";
    let student = v.llama3.encode(text).unwrap();
    let teachers: Vec<(Vec<u32>, Alignment)> = aligners()[..2]
        .iter()
        .map(|(_, t, al, _)| {
            let ids = t.encode(text).unwrap();
            let a = al.align(&student, &ids).unwrap();
            (ids, a)
        })
        .collect();
    // One plan per teacher against the same student sequence.
    let plans: Vec<ChunkPlan> = teachers.iter().map(|(_, a)| ChunkPlan::new(a)).collect();
    for ((ids, _), plan) in teachers.iter().zip(&plans) {
        let item = PlanItem {
            plan,
            student_ids: &student,
            teacher_ids: ids,
        };
        let batch =
            BatchPlan::new(&[item], student.len(), ids.len(), MergeVariant::FirstToken).unwrap();
        assert!(batch.valid_chunks() >= plan.len() - 1);
    }
    let path = std::env::temp_dir().join(format!("xtoken-real-cache-{}", std::process::id()));
    let meta = CacheMetadata {
        student: TokenizerRecord::of(&v.llama3),
        teachers: vec![TokenizerRecord::of(&v.qwen3), TokenizerRecord::of(&v.phi4)],
        params: AlignParams::default(),
        source: "inline".into(),
        text_field: "text".into(),
        student_tokens: 0,
        created_by: "test".into(),
    };
    let mut w = CacheWriter::create(&path, meta).unwrap();
    let refs: Vec<(&[u32], &Alignment)> = teachers.iter().map(|(i, a)| (i.as_slice(), a)).collect();
    w.push(
        &xtoken::core::cache::encode_record(&student, &refs).unwrap(),
        student.len(),
    )
    .unwrap();
    w.finish().unwrap();
    let cache = AlignCache::open_verified(&path, &v.llama3, &[&v.qwen3, &v.phi4]).unwrap();
    let doc = cache.doc(0).unwrap();
    assert_eq!(doc.student_ids, student.as_slice());
    for (cached, (ids, a)) in doc.teachers.iter().zip(&teachers) {
        assert_eq!(cached.ids, ids.as_slice());
        let back: Vec<_> = cached
            .alignment()
            .chunks
            .iter()
            .map(|c| (c.student, c.teacher))
            .collect();
        let orig: Vec<_> = a.chunks.iter().map(|c| (c.student, c.teacher)).collect();
        assert_eq!(back, orig);
    }
    // Other tokenizers, or another teacher order, are refused with the side named.
    let err = AlignCache::open_verified(&path, &v.llama3, &[&v.phi4, &v.qwen3])
        .unwrap_err()
        .to_string();
    assert!(err.contains("teacher tokenizer with sha256"), "{err}");
    let err = AlignCache::open_verified(&path, &v.llama2, &[&v.qwen3, &v.phi4])
        .unwrap_err()
        .to_string();
    assert!(err.contains("student tokenizer"), "{err}");
    assert!(AlignCache::open_verified(&path, &v.llama3, &[&v.qwen3]).is_err());
    std::fs::remove_file(&path).ok();
}

/// Random text from pieces of many scripts, with special-token spellings sprinkled in.
fn any_text() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "the",
        " cat",
        " sat",
        ".",
        ",",
        " ",
        "  ",
        "\n",
        "\r\n",
        "\t",
        "1",
        "23",
        "456",
        "7890",
        " 3.14",
        "é",
        "ß",
        "日本",
        "語",
        "中文",
        "한국",
        "😀",
        "👍🏽",
        "👨‍👩‍👧",
        "مرحبا",
        "Ω",
        "=>",
        "()",
        "{}",
        "http://a.b/c",
    ]);
    let piece = prop_oneof![3 => pieces, 1 => prop::sample::select(SPECIAL_SPELLINGS.to_vec())];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

/// The spellings of the five families' special and added tokens (and near misses), as they
/// appear in chat transcripts, templates and code quoted in training data.
const SPECIAL_SPELLINGS: &[&str] = &[
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|reserved_special_token_3|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<|fim_prefix|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<|tool|>",
    "<s>",
    "</s>",
    "<unk>",
    "<|im_start",
    "|>",
];

/// Positions of special tokens in `ids`.
fn special_positions(vocab: &Vocabulary, ids: &[u32]) -> Vec<usize> {
    let special = |id: u32| vocab.token(id).unwrap().kind == TokenKind::Special;
    (0..ids.len()).filter(|&p| special(ids[p])).collect()
}

/// Where each tokenizer's post-processor puts its own special tokens for a document: Llama-3's
/// and Llama-2's BOS at position 0, none for Qwen3 and Phi-4-mini.
fn added_specials(vocab: &Vocabulary) -> Vec<usize> {
    special_positions(vocab, &vocab.encode("x").unwrap())
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn special_token_spellings_in_text_are_text_on_both_sides() {
    // Each tokenizer knows other specials: matched as control ids, `<|begin_of_text|>` became
    // Llama's BOS and `<|im_start|>` Qwen3's, and a chunk paired the student's "<" of one with
    // the teacher's "<" of the other.
    let v = vocabs();
    let text = "<|begin_of_text|>hi<|im_start|>user";
    let student = v.llama3.encode(text).unwrap();
    assert_eq!(special_positions(&v.llama3, &student), vec![0]);
    for (name, teacher_vocab, al, _) in aligners() {
        let teacher = teacher_vocab.encode(text).unwrap();
        let expected = added_specials(teacher_vocab);
        assert_eq!(
            special_positions(teacher_vocab, &teacher),
            expected,
            "{name}"
        );
        let a = al.align(&student, &teacher).unwrap();
        check_invariants(al, &a, &student, &teacher, teacher_vocab);
        assert_eq!(
            aligned_text_positions(&a, &student),
            text_positions(&student),
            "{name}: {:?}",
            a.chunks
        );
    }
}

/// The data pipeline with Llama-3.2 as the student and the three teachers, loaded once.
fn pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| {
        let dir = tokenizers_dir();
        let teachers = ["qwen3", "phi-4-mini", "llama-2"].map(|t| dir.join(t));
        Pipeline::load(&dir.join("llama-3.2"), &teachers, AlignParams::default()).unwrap()
    })
}

/// Writes `texts` as a JSON Lines file, aligns it into a cache with the data pipeline, and
/// checks every document read back: its ids are the tokenizers' encodings of its text, special
/// ids sit only where the post-processors put them, both sides spell the same text (but where a
/// tokenizer drops characters) and every two-sided chunk covers the same bytes of it.
fn check_through_the_pipeline(texts: &[String], case: usize) {
    let p = pipeline();
    let dir = std::env::temp_dir().join(format!("xtoken-specials-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("docs-{case}.jsonl"));
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = input.with_extension("xtc");
    let job = FileJob {
        input: &input,
        format: DataFormat::Jsonl,
        out: Some(&out),
        text_field: "text",
        threads: 1,
        params: AlignParams::default(),
        progress: false,
    };
    align_file(p, &job, None).unwrap();
    let teachers: Vec<&Vocabulary> = p.teachers.iter().collect();
    let cache = AlignCache::open_verified(&out, &p.student, &teachers).unwrap();
    // Empty texts are skipped.
    let docs: Vec<&String> = texts.iter().filter(|t| !t.trim().is_empty()).collect();
    assert_eq!(cache.len(), docs.len());
    let mut ws = Workspace::default();
    for (d, text) in docs.into_iter().enumerate() {
        let doc = cache.doc(d).unwrap();
        assert_eq!(doc.student_ids, p.student.encode(text).unwrap().as_slice());
        let student_specials = special_positions(&p.student, doc.student_ids);
        assert_eq!(student_specials, added_specials(&p.student), "{text:?}");
        // Phi-4-mini's tool tokens swallow the whitespace after them (`rstrip`), so that teacher
        // spells another text, aligned by bytes alone; every other pair spells the same text.
        let swallowed = ["<|tool|>", "<|/tool|>"].iter().any(|tool| {
            let after =
                |(at, _): (usize, &str)| text[at + tool.len()..].starts_with(char::is_whitespace);
            text.match_indices(tool).any(after)
        });
        let fresh = p.process(&mut ws, text).unwrap();
        assert_eq!(fresh.respelled, vec![false, swallowed, false], "{text:?}");
        for ((cached, aligner), vocab) in doc.teachers.iter().zip(&p.aligners).zip(&teachers) {
            let ids = cached.ids;
            assert_eq!(
                special_positions(vocab, ids),
                added_specials(vocab),
                "{text:?}"
            );
            let alignment = cached.alignment();
            aligner
                .verify(doc.student_ids, ids, &alignment)
                .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            check_invariants(aligner, &alignment, doc.student_ids, ids, vocab);
        }
    }
    std::fs::remove_file(&input).ok();
    std::fs::remove_file(&out).ok();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(xtoken_tokenizers) { 24 } else { 1 }))]

    /// Random documents with special-token spellings sprinkled in, through the data pipeline.
    #[test]
    #[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
    fn special_spellings_keep_every_chunk_in_place_through_the_data_pipeline(
        texts in prop::collection::vec(any_text(), 1..6),
        case in any::<usize>(),
    ) {
        check_through_the_pipeline(&texts, case);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(xtoken_tokenizers) { 64 } else { 1 }))]

    #[test]
    #[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
    fn real_alignments_keep_the_invariants(text in any_text()) {
        let v = vocabs();
        let student = v.llama3.encode(&text).unwrap();
        for (_, teacher_vocab, paper, recovering) in aligners() {
            let teacher = teacher_vocab.encode(&text).unwrap();
            for al in [paper, recovering] {
                let a = al.align(&student, &teacher).unwrap();
                check_invariants(al, &a, &student, &teacher, teacher_vocab);
                prop_assert!(!a.band_edge_reached);
            }
        }
    }
}

/// What a student might write after a prompt: text (special-token spellings included), any ids
/// of its vocabulary (special tokens, which end a continuation, among them), and single bytes,
/// which leave a character unfinished or are no UTF-8 at all.
fn any_continuation() -> impl Strategy<Value = Vec<u32>> {
    let size = vocabs().llama3.tokenizer_size() as u32;
    let text = any_text().prop_map(|t| {
        let mut ids = vocabs().llama3.encode_pieces(&[&t]).unwrap();
        ids.remove(0)
    });
    let bytes = prop::collection::vec(any::<u8>(), 1..4).prop_map(|bytes| {
        let v = &vocabs().llama3;
        bytes.iter().map(|&b| byte_token(v, &[b])).collect()
    });
    let piece = prop_oneof![
        3 => text,
        1 => prop::collection::vec(0..size, 1..6),
        2 => bytes,
    ];
    prop::collection::vec(piece, 0..6).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(xtoken_tokenizers) { 64 } else { 1 }))]

    /// On-policy rows: a prompt cut anywhere (inside a character too) and whatever the student
    /// wrote after it become a row whose ids are a prefix of the two, cut at the first special
    /// token and back to whole characters; the text the teachers read is what those ids spell,
    /// every teacher's ids encode it, the alignments keep the invariants, and the chunks kept
    /// for the loss start in the continuation.
    #[test]
    #[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
    fn written_text_keeps_the_invariants(
        prompt_text in any_text(),
        cut in 1usize..40,
        continuation in any_continuation(),
    ) {
        let p = pipeline();
        let v = &vocabs().llama3;
        let full = v.encode(&prompt_text).unwrap();
        let prompt = &full[..cut.min(full.len())];
        let w = written(p, &mut Workspace::default(), prompt, &continuation).unwrap();
        let ids = &w.row.student_ids;
        let stop = continuation.iter().position(|&id| !is_text(id)).unwrap_or(continuation.len());
        let wanted: Vec<u32> = prompt.iter().chain(&continuation[..stop]).copied().collect();
        prop_assert!(wanted.starts_with(ids));
        prop_assert_eq!(w.prompt_len, prompt.len().min(ids.len()));
        prop_assert_eq!(w.generated, ids.len() - w.prompt_len);
        let spelled: Vec<u8> = ids
            .iter()
            .filter(|&&id| is_text(id))
            .flat_map(|&id| v.token(id).unwrap().bytes.to_vec())
            .collect();
        prop_assert_eq!(spelled.as_slice(), w.text.as_bytes());
        // Nothing whole was cut: the next token would leave the text unfinished (or stop).
        if ids.len() < wanted.len() {
            let mut longer = spelled.clone();
            longer.extend_from_slice(&v.token(wanted[ids.len()]).unwrap().bytes);
            prop_assert!(std::str::from_utf8(&longer).is_err());
        }
        for (((teacher_ids, alignment), aligner), vocab) in
            w.row.teachers.iter().zip(&p.aligners).zip(&p.teachers)
        {
            prop_assert_eq!(teacher_ids, &vocab.encode(&w.text).unwrap());
            check_invariants(aligner, alignment, ids, teacher_ids, vocab);
        }
        let prompt_len = w.prompt_len as u32;
        let trained = w.trained();
        for (_, alignment) in &trained.teachers {
            prop_assert!(alignment.chunks.iter().all(|c| c.student.start >= prompt_len));
        }
    }
}
