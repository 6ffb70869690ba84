//! Tests on the real Llama-3.2, Qwen3, Phi-4-mini, Llama-2, Mistral-v0.3 and GPT-2 tokenizer
//! files, read from `XTOKEN_TOKENIZERS_DIR` (CI: `../shared/tokenizers`), and on a generated
//! tokenizer of Gemma's structure (`support::gemma_like`). Without the folder they are ignored,
//! with a reason.

use crate::support::{gemma_like, tokenizers_dir};
use std::sync::OnceLock;

use proptest::prelude::*;
use xtoken::core::audit::{self, AuditOptions};
use xtoken::core::canon::{canonical_token, SpecialRole};
use xtoken::core::common::CommonSet;
use xtoken::core::projection::{BuildReport, ProjectionParams, RowSource, SparseProjection};
use xtoken::core::vocab::{TokenKind, Vocabulary};
use xtoken::core::Error;
use xtoken::loss::LossKind;

fn load(name: &str, padded: Option<usize>) -> Vocabulary {
    Vocabulary::load_padded(tokenizers_dir().join(name), padded)
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

struct Pair {
    student: Vocabulary,
    teacher: Vocabulary,
    w: SparseProjection,
    report: BuildReport,
}

fn pair(student: &str, teacher: &str, teacher_padded: Option<usize>) -> Pair {
    pair_of(load(student, None), load(teacher, teacher_padded))
}

fn pair_of(student: Vocabulary, teacher: Vocabulary) -> Pair {
    let (w, report) =
        SparseProjection::build(&student, &teacher, ProjectionParams::default()).unwrap();
    Pair {
        student,
        teacher,
        w,
        report,
    }
}

fn llama_qwen() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| pair("llama-3.2", "qwen3", Some(151_936)))
}

fn llama_phi() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| pair("llama-3.2", "phi-4-mini", Some(200_064)))
}

fn llama_llama2() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| pair("llama-3.2", "llama-2", None))
}

fn llama_mistral() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| pair("llama-3.2", "mistral-v0.3", None))
}

/// Gemma's structure, padded to Gemma-3's embedding (262,208 rows).
fn gemma() -> Vocabulary {
    Vocabulary::load_padded(gemma_like::dir(&tokenizers_dir()), Some(262_208)).unwrap()
}

fn llama_gemma() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| pair_of(load("llama-3.2", None), gemma()))
}

/// A Gemma-3 student under a Qwen teacher (Qwen2.5 shares Qwen3's tokenizer).
fn gemma_qwen() -> &'static Pair {
    static P: OnceLock<Pair> = OnceLock::new();
    P.get_or_init(|| pair_of(gemma(), load("qwen3", Some(151_936))))
}

fn row_text(p: &Pair, s: u32) -> Vec<(Vec<u8>, f32)> {
    p.w.row(s)
        .map(|(t, w)| (p.teacher.tokens()[t as usize].bytes.to_vec(), w))
        .collect()
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn llama_to_qwen_maps_201_to_2_0_1() {
    let p = llama_qwen();
    let s = p.student.find("201").unwrap();
    let row = row_text(p, s);
    let expect = [(b"2", 0.9009f32), (b"0", 0.0901), (b"1", 0.0090)];
    assert_eq!(row.len(), 3, "{row:?}");
    for ((bytes, w), (want, want_w)) in row.iter().zip(expect) {
        assert_eq!(bytes.as_slice(), want);
        assert!((w - want_w).abs() < 1e-4, "{row:?}");
    }
    assert_eq!(p.report.sources[s as usize], RowSource::MultiToken);
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn llama_to_phi_maps_201_exactly() {
    let p = llama_phi();
    let s = p.student.find("201").unwrap();
    assert_eq!(row_text(p, s), vec![(b"201".to_vec(), 1.0)]);
    assert_eq!(p.report.sources[s as usize], RowSource::Exact);
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn llama2_byte_fallback_newline_canonicalizes_to_newline() {
    let v = load("llama-2", None);
    let token = &v.tokens()[13];
    assert_eq!(token.surface, "<0x0A>");
    assert_eq!(token.kind, TokenKind::ByteFallback);
    assert_eq!(&*token.bytes, b"\n");
    assert_eq!(canonical_token(&token.surface, v.scheme()), b"\n");
    // All 256 byte-fallback tokens sit at ids 3..=258 and stand for their byte.
    for b in 0..=255u8 {
        let t = &v.tokens()[3 + b as usize];
        assert_eq!((t.kind, &*t.bytes), (TokenKind::ByteFallback, &[b][..]));
    }
    assert_eq!(&*v.tokens()[278].bytes, b" the");
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn vocabulary_sizes_and_padding() {
    for (name, size) in [
        ("llama-3.2", 128_256),
        ("qwen3", 151_669),
        ("phi-4-mini", 200_029),
        ("llama-2", 32_000),
        ("mistral-v0.3", 32_768),
        ("gpt2", 50_257),
    ] {
        assert_eq!(load(name, None).tokenizer_size(), size, "{name}");
    }
    assert_eq!(gemma().tokenizer_size(), gemma_like::SIZE);
    assert_eq!(gemma().size(), 262_208);
    let p = llama_qwen();
    assert_eq!(p.teacher.size(), 151_936);
    assert_eq!(p.teacher.token(151_700).unwrap().kind, TokenKind::Padding);
    assert!(p.teacher.token(151_936).is_none());
    assert_eq!(p.w.teacher_vocab_size(), 151_936);
    // Padded student rows exist and stay empty.
    let padded_student =
        Vocabulary::load_padded(tokenizers_dir().join("qwen3"), Some(151_936)).unwrap();
    let (w, report) =
        SparseProjection::build(&padded_student, &p.student, ProjectionParams::default()).unwrap();
    assert_eq!(w.student_vocab_size(), 151_936);
    assert_eq!(report.count(RowSource::Padding), 151_936 - 151_669);
    assert!(w.top1(151_900).is_none());
    let err = Vocabulary::load_padded(tokenizers_dir().join("qwen3"), Some(1000)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::VocabSizeTooSmall {
                actual: 151_669,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn special_tokens_pair_by_role() {
    let by_text = |v: &Vocabulary, text: &str| v.find(text).unwrap();
    let q = llama_qwen();
    for (llama, qwen, role) in [
        ("<|end_of_text|>", "<|endoftext|>", SpecialRole::Eos),
        ("<|eot_id|>", "<|im_end|>", SpecialRole::TurnEnd),
        (
            "<|start_header_id|>",
            "<|im_start|>",
            SpecialRole::TurnStart,
        ),
    ] {
        let s = by_text(&q.student, llama);
        assert_eq!(q.student.tokens()[s as usize].role, Some(role));
        assert_eq!(
            q.w.top1(s),
            Some((by_text(&q.teacher, qwen), 1.0)),
            "{llama}"
        );
        assert_eq!(q.report.sources[s as usize], RowSource::Special);
    }
    // Qwen3 has no BOS, so Llama's stays unpaired; reserved tokens have no counterpart.
    assert!(q.w.top1(by_text(&q.student, "<|begin_of_text|>")).is_none());
    assert!(q
        .w
        .top1(by_text(&q.student, "<|reserved_special_token_0|>"))
        .is_none());
    let p = llama_phi();
    let eot = by_text(&p.student, "<|eot_id|>");
    assert_eq!(p.w.top1(eot), Some((by_text(&p.teacher, "<|end|>"), 1.0)));
    // Phi-4-mini's config calls <|endoftext|> bos, eos, pad and unk at once: it is the EOS.
    let eos = by_text(&p.student, "<|end_of_text|>");
    assert_eq!(
        p.w.top1(eos),
        Some((by_text(&p.teacher, "<|endoftext|>"), 1.0))
    );
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn byte_identical_partners_win_over_canonical_rules() {
    let p = llama_qwen();
    for text in ["\n", "\\n", " ,", ",", " .", " the"] {
        let s = p.student.find(text).unwrap();
        assert_eq!(
            row_text(p, s),
            vec![(text.as_bytes().to_vec(), 1.0)],
            "{text:?}"
        );
    }
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn every_row_is_accounted_for() {
    for p in [
        llama_qwen(),
        llama_phi(),
        llama_llama2(),
        llama_mistral(),
        llama_gemma(),
        gemma_qwen(),
    ] {
        let n = p.w.student_vocab_size();
        let counted: usize = [
            RowSource::Exact,
            RowSource::Special,
            RowSource::MultiToken,
            RowSource::Empty,
            RowSource::Padding,
        ]
        .iter()
        .map(|&s| p.report.count(s))
        .sum();
        assert_eq!(counted, n);
        assert_eq!(p.report.empty.len(), p.report.count(RowSource::Empty));
        for s in 0..n as u32 {
            let empty = p.w.top1(s).is_none();
            let source = p.report.sources[s as usize];
            assert_eq!(
                empty,
                matches!(source, RowSource::Empty | RowSource::Padding),
                "row {s}"
            );
        }
    }
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn multi_token_rows_never_lose_or_invent_bytes() {
    // Llama-2 (SentencePiece, byte fallback, no normalization beyond ▁) and Phi-4-mini (no
    // normalizer): the teacher tokens of a multi-token row, heaviest first, spell the student's
    // exact bytes. This would fail if the SentencePiece prefix space leaked in or partial UTF-8
    // went through U+FFFD.
    // Rows spelled exactly by their tokens, at least: Llama-2's and Phi-4-mini's many, Mistral's
    // 32k pieces fewer, the generated Gemma-like one's fewer still (its pieces past Llama-2's
    // are Llama-3's own words, which are exact rows, not multi-token ones).
    for (p, least) in [
        (llama_llama2(), 5000),
        (llama_phi(), 5000),
        (llama_mistral(), 2000),
        (llama_gemma(), 100),
    ] {
        let mut exact = 0;
        for (s, source) in p.report.sources.iter().enumerate() {
            if *source != RowSource::MultiToken {
                continue;
            }
            let spelled: Vec<u8> =
                p.w.row(s as u32)
                    .flat_map(|(t, _)| p.teacher.tokens()[t as usize].bytes.iter().copied())
                    .collect();
            let student = &p.student.tokens()[s].bytes;
            if spelled == student.to_vec() {
                exact += 1;
                continue;
            }
            // Otherwise the re-encoding repeated a token, which a row holds once: its tokens are
            // still in-order, non-overlapping pieces of the student's bytes.
            let mut at = 0;
            for (t, _) in p.w.row(s as u32) {
                let piece = &p.teacher.tokens()[t as usize].bytes;
                let found = student[at..]
                    .windows(piece.len())
                    .position(|w| w == &piece[..]);
                at += found.unwrap_or_else(|| panic!("row {s}: {piece:?} not in {student:?}"))
                    + piece.len();
            }
            let Ok(text) = std::str::from_utf8(student) else {
                continue;
            };
            let ids = &p.teacher.encode_pieces(&[text]).unwrap()[0];
            let mut unique = ids.clone();
            unique.sort_unstable();
            unique.dedup();
            assert!(
                unique.len() < ids.len(),
                "row {s} {text:?}: {ids:?} spells {spelled:?}"
            );
        }
        assert!(exact > least, "{exact} of at least {least}");
    }
    let p = llama_llama2();
    let s = p.student.find("Hundreds").unwrap();
    let texts: Vec<Vec<u8>> = row_text(p, s).into_iter().map(|(b, _)| b).collect();
    assert_eq!(
        texts,
        vec![b"H".to_vec(), b"undred".to_vec(), b"s".to_vec()]
    );
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn strict_common_set_is_one_to_one() {
    for p in [llama_qwen(), llama_phi()] {
        let c = CommonSet::strict(&p.student, &p.teacher);
        let mut teachers: Vec<u32> = c.pairs().iter().map(|&(_, t)| t).collect();
        teachers.sort_unstable();
        teachers.dedup();
        assert_eq!(teachers.len(), c.len());
        // The relaxed set keeps every strict pair as it is (it is many-to-one beyond them).
        let relaxed = CommonSet::relaxed(&c, &p.w);
        for pair in c.pairs() {
            assert!(relaxed.pairs().binary_search(pair).is_ok(), "{pair:?}");
        }
    }
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn audit_matches_the_papers_table() {
    let options = AuditOptions::default();
    let q = llama_qwen();
    let report = audit::audit(&q.student, &q.teacher, &q.w, &options);
    let get = |r: &audit::AuditReport, name: &str| {
        r.categories
            .iter()
            .find(|c| c.name == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        (
            get(&report, "digits_1").common,
            get(&report, "digits_1").total
        ),
        (10, 10)
    );
    assert_eq!(
        (
            get(&report, "digits_2").common,
            get(&report, "digits_2").total
        ),
        (0, 100)
    );
    assert_eq!(
        (
            get(&report, "digits_3").common,
            get(&report, "digits_3").total
        ),
        (0, 1000)
    );
    assert_eq!(get(&report, "digits_3").projected, 1000);
    assert_eq!(report.recommendation, LossKind::Pkl);

    let p = llama_phi();
    let report = audit::audit(&p.student, &p.teacher, &p.w, &options);
    assert_eq!(get(&report, "digits_2").common, 100);
    assert_eq!(get(&report, "digits_3").common, 1000);
    assert_eq!(report.recommendation, LossKind::Hkl);

    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["recommendation"], "hkl");
    assert!(json["reason"].as_str().unwrap().len() > 20);
    let names: Vec<&str> = json["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for name in [
        "digits_1",
        "digits_2",
        "digits_3",
        "ascii_punct",
        "alpha",
        "non_ascii",
        "special",
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    for c in json["categories"].as_array().unwrap() {
        for key in ["total", "common", "relaxed"] {
            assert!(c[key].is_u64(), "{c}");
        }
    }
    let markdown = report.to_markdown();
    assert!(
        markdown.contains("| 2-digit numerals | `digits_2` | 100 | 100/100 (100%)"),
        "{markdown}"
    );
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn the_relaxed_set_pairs_every_token_with_a_row_of_w() {
    for (name, p) in [("Qwen3", llama_qwen()), ("Phi-4-mini", llama_phi())] {
        let strict = CommonSet::strict(&p.student, &p.teacher);
        let relaxed = CommonSet::relaxed(&strict, &p.w);
        let with_row = (0..p.w.student_vocab_size() as u32)
            .filter(|&s| strict.contains_student(s) || p.w.top1(s).is_some())
            .count();
        assert_eq!(relaxed.len(), with_row, "{name}");
        // Many student tokens share a teacher token (`olumn` and `Ġcolumn`'s pieces, numerals
        // and their first digit).
        let mut teachers: Vec<u32> = relaxed.pairs().iter().map(|&(_, t)| t).collect();
        teachers.sort_unstable();
        teachers.dedup();
        assert!(teachers.len() < relaxed.len(), "{name}");
        let report = audit::audit(&p.student, &p.teacher, &p.w, &AuditOptions::default());
        for c in &report.categories {
            assert!(c.relaxed >= c.common.max(c.projected), "{name}: {c:?}");
        }
        let digits = |n: &str| {
            report
                .categories
                .iter()
                .find(|c| c.name == n)
                .unwrap()
                .relaxed
        };
        assert_eq!(
            (digits("digits_2"), digits("digits_3")),
            (100, 1000),
            "{name}"
        );
        eprintln!(
            "Llama-3.2 → {name}: strict {} pairs, relaxed {} pairs over {} teacher tokens",
            strict.len(),
            relaxed.len(),
            teachers.len()
        );
    }
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn real_projection_survives_save_and_load_and_checks_provenance() {
    let p = llama_qwen();
    let file = std::env::temp_dir().join(format!("xtoken-real-{}.safetensors", std::process::id()));
    p.w.save(&file).unwrap();
    let back = SparseProjection::load_verified(&file, &p.student, &p.teacher).unwrap();
    assert_eq!(back, p.w);
    // The wrong teacher is named, with both hashes.
    let phi = &llama_phi().teacher;
    let err = SparseProjection::load_verified(&file, &p.student, phi).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("teacher") && msg.contains(phi.sha256()),
        "{msg}"
    );
    // The right file with the wrong padded size.
    let unpadded = load("qwen3", None);
    let err = SparseProjection::load_verified(&file, &p.student, &unpadded).unwrap_err();
    assert!(err.to_string().contains("151936"), "{err}");
    std::fs::remove_file(&file).ok();
}

/// Every row of a real W (128k of them: cheap) is empty or a distribution over distinct teacher
/// ids, heaviest first.
fn check_every_row(name: &str, p: &Pair) {
    let vt = p.teacher.size() as u32;
    let mut empty = 0;
    for s in 0..p.w.student_vocab_size() as u32 {
        let row: Vec<(u32, f32)> = p.w.row(s).collect();
        if row.is_empty() {
            empty += 1;
            continue;
        }
        let weights: Vec<f32> = row.iter().map(|&(_, w)| w).collect();
        xtoken_testkit::assert_finite(&format!("{name}: row {s}"), &weights);
        assert!(
            weights.iter().all(|&w| w > 0.0) && weights.windows(2).all(|w| w[0] >= w[1]),
            "{name}: row {s} is not positive and heaviest first: {row:?}"
        );
        let mut ids: Vec<u32> = row.iter().map(|&(t, _)| t).collect();
        assert!(ids.iter().all(|&t| t < vt), "{name}: row {s}: {row:?}");
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(
            ids.len(),
            row.len(),
            "{name}: row {s} repeats an id: {row:?}"
        );
        let total: f64 = weights.iter().map(|&w| w as f64).sum();
        assert!(
            (total - 1.0).abs() < 1e-6,
            "{name}: row {s} sums to {total}"
        );
    }
    // Empty rows are the exception (specials without a partner, tokens no rule reaches).
    assert!(
        empty * 100 < p.w.student_vocab_size(),
        "{name}: {empty} empty rows"
    );
    eprintln!("{name}: {empty} empty rows of {}", p.w.student_vocab_size());
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn every_real_row_is_empty_or_a_distribution() {
    check_every_row("Llama-3.2 → Qwen3", llama_qwen());
    check_every_row("Llama-3.2 → Phi-4-mini", llama_phi());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    #[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
    fn real_projection_of_a_distribution_is_a_distribution(
        support in proptest::collection::vec((0u32..128_256, 0.0f64..1.0), 1..200)) {
        let p = llama_phi();
        let mut dist = vec![0.0; p.w.student_vocab_size()];
        for (s, mass) in support {
            if p.w.top1(s).is_some() {
                dist[s as usize] += mass;
            }
        }
        let z: f64 = dist.iter().sum();
        prop_assume!(z > 0.0);
        dist.iter_mut().for_each(|v| *v /= z);
        let q = p.w.project(&dist);
        prop_assert_eq!(q.len(), 200_064);
        prop_assert!(q.iter().all(|&v| v >= 0.0));
        prop_assert!((q.iter().sum::<f64>() - 1.0).abs() < 1e-6);
    }
}

#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn gpt2_and_llama2_load_with_their_roles() {
    let gpt2 = load("gpt2", None);
    let eot = gpt2.find("<|endoftext|>").unwrap();
    assert_eq!(eot, 50_256);
    assert_eq!(gpt2.tokens()[eot as usize].role, Some(SpecialRole::Eos));
    let llama2 = load("llama-2", None);
    assert_eq!(llama2.tokens()[1].role, Some(SpecialRole::Bos));
    assert_eq!(llama2.tokens()[0].role, Some(SpecialRole::Unk));
    let qwen = load("qwen3", None);
    // <think> is an added token that is not special: it is matched by text, not role.
    let think = qwen.find("<think>").unwrap();
    assert_eq!(qwen.tokens()[think as usize].kind, TokenKind::Added);
}

/// Mistral-7B-v0.3's SentencePiece vocabulary: 771 control tokens (its specials and
/// `[control_N]`) before the 256 byte-fallback tokens, pieces with `▁` for a space; and the
/// generated Gemma-like one: Gemma-3's specials, then its bytes.
#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn mistral_and_gemma_vocabularies_canonicalize() {
    let mistral = load("mistral-v0.3", None);
    let roles = [
        (0, SpecialRole::Unk),
        (1, SpecialRole::Bos),
        (2, SpecialRole::Eos),
    ];
    for (id, role) in roles {
        assert_eq!(mistral.tokens()[id].role, Some(role), "mistral id {id}");
    }
    for id in [3, 4, 10, 770] {
        assert_eq!(
            mistral.tokens()[id].kind,
            TokenKind::Special,
            "mistral id {id}"
        );
    }
    for b in 0..=255u8 {
        let t = &mistral.tokens()[771 + b as usize];
        assert_eq!((t.kind, &*t.bytes), (TokenKind::ByteFallback, &[b][..]));
    }
    let the = mistral.find(" the").unwrap();
    assert_eq!(mistral.tokens()[the as usize].surface, "\u{2581}the");
    assert_eq!(canonical_token("\u{2581}the", mistral.scheme()), b" the");
    // A text encodes as Mistral does: <s>, then ▁-pieces, digits one by one.
    let ids = mistral.encode("Hello world 2024").unwrap();
    assert_eq!(ids[0], 1);
    let spelled: Vec<u8> = ids[1..]
        .iter()
        .flat_map(|&id| mistral.tokens()[id as usize].bytes.to_vec())
        .collect();
    // The first piece keeps SentencePiece's prefix space (the aligner drops it).
    assert_eq!(spelled, b" Hello world 2024");
    assert!(ids.len() >= 1 + 2 + 1 + 4, "{ids:?}");

    let gemma = gemma();
    let roles = [
        ("<pad>", SpecialRole::Pad),
        ("<eos>", SpecialRole::Eos),
        ("<bos>", SpecialRole::Bos),
        ("<unk>", SpecialRole::Unk),
        ("<start_of_turn>", SpecialRole::TurnStart),
        ("<end_of_turn>", SpecialRole::TurnEnd),
    ];
    for (text, role) in roles {
        let id = gemma.find(text).unwrap();
        assert_eq!(gemma.tokens()[id as usize].role, Some(role), "{text}");
    }
    assert_eq!(gemma.find("<start_of_turn>").unwrap(), 105);
    let first_byte = gemma_like::specials().len();
    assert_eq!(&*gemma.tokens()[first_byte + 10].bytes, b"\n");
    assert_eq!(
        gemma.tokens()[first_byte + 10].kind,
        TokenKind::ByteFallback
    );
    let ids = gemma.encode("The year 2024 had 366 days.").unwrap();
    assert_eq!(ids[0], 2, "Gemma puts <bos> first");
    let digits = ids
        .iter()
        .filter(|&&id| {
            gemma.tokens()[id as usize]
                .bytes
                .iter()
                .any(u8::is_ascii_digit)
        })
        .count();
    assert_eq!(digits, 7, "every digit a token of its own");
}

/// Llama-3.2's specials pair with Mistral's and Gemma's by role.
#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn mistral_and_gemma_specials_pair_by_role() {
    let by_text = |v: &Vocabulary, text: &str| v.find(text).unwrap();
    let m = llama_mistral();
    for (llama, mistral) in [("<|begin_of_text|>", "<s>"), ("<|end_of_text|>", "</s>")] {
        let s = by_text(&m.student, llama);
        assert_eq!(
            m.w.top1(s),
            Some((by_text(&m.teacher, mistral), 1.0)),
            "{llama}"
        );
    }
    let g = llama_gemma();
    for (llama, gemma) in [
        ("<|begin_of_text|>", "<bos>"),
        ("<|end_of_text|>", "<eos>"),
        ("<|start_header_id|>", "<start_of_turn>"),
        ("<|eot_id|>", "<end_of_turn>"),
    ] {
        let s = by_text(&g.student, llama);
        assert_eq!(
            g.w.top1(s),
            Some((by_text(&g.teacher, gemma), 1.0)),
            "{llama}"
        );
    }
}

/// The coverage audit on the new pairs: Mistral and Gemma split digits as Qwen does, so a
/// Llama-3.2 student needs P-KL under either, and a Gemma student under a Qwen teacher has every
/// digit in common (both split them) and takes H-KL.
#[test]
#[cfg_attr(not(xtoken_tokenizers), ignore = "needs XTOKEN_TOKENIZERS_DIR")]
fn the_audit_reads_mistral_and_gemma_pairs() {
    let options = AuditOptions::default();
    let common = |r: &audit::AuditReport, name: &str| {
        let c = r.categories.iter().find(|c| c.name == name).unwrap();
        (c.common, c.total)
    };
    for p in [llama_mistral(), llama_gemma()] {
        let report = audit::audit(&p.student, &p.teacher, &p.w, &options);
        assert_eq!(common(&report, "digits_1"), (10, 10));
        assert_eq!(common(&report, "digits_2"), (0, 100));
        assert_eq!(report.recommendation, LossKind::Pkl);
        assert!(report.to_markdown().contains("digits_2"));
    }
    let p = gemma_qwen();
    let report = audit::audit(&p.student, &p.teacher, &p.w, &options);
    assert_eq!(common(&report, "digits_1"), (10, 10));
    assert!(report
        .categories
        .iter()
        .find(|c| c.name == "digits_2")
        .is_none_or(|c| c.total == 0));
    assert_eq!(report.recommendation, LossKind::Hkl, "{}", report.reason);
}
