//! The DP on synthetic vocabularies: hand-checked cases, and property tests on random texts cut
//! into random tokens (byte boundaries anywhere, so UTF-8 characters split across tokens too).

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

/// A side whose vocabulary is exactly the given pieces; `specials` are special tokens.
struct Synth {
    pieces: Vec<Vec<u8>>,
    special: Vec<bool>,
    ids: HashMap<Vec<u8>, u32>,
}

impl Synth {
    fn new() -> Self {
        Synth {
            pieces: Vec::new(),
            special: Vec::new(),
            ids: HashMap::new(),
        }
    }

    fn id(&mut self, piece: &[u8], special: bool) -> u32 {
        if let Some(&id) = self.ids.get(piece) {
            return id;
        }
        let id = self.pieces.len() as u32;
        self.pieces.push(piece.to_vec());
        self.special.push(special);
        self.ids.insert(piece.to_vec(), id);
        id
    }

    fn encode(&mut self, pieces: &[&[u8]]) -> Vec<u32> {
        pieces.iter().map(|p| self.id(p, false)).collect()
    }
}

/// An aligner over two synthetic vocabularies; specials pair by equal text.
fn aligner(student: &Synth, teacher: &Synth, params: AlignParams) -> Aligner {
    let mut interned: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut table = |side: &Synth| {
        let mut arena = Vec::new();
        let mut start = vec![0u32];
        let mut class = Vec::new();
        for piece in &side.pieces {
            arena.extend_from_slice(piece);
            start.push(arena.len() as u32);
            let next = interned.len() as u32;
            class.push(*interned.entry(piece.clone()).or_insert(next));
        }
        SideTable {
            path: "synthetic".into(),
            arena,
            start,
            class,
            special: side.special.clone(),
            unprefixed_class: None,
        }
    };
    let s = table(student);
    let t = table(teacher);
    let scale = |x: f64| (x * SCORE_SCALE).round() as i64;
    Aligner {
        student: s,
        teacher: t,
        params,
        scores: Scores {
            exact: scale(params.alpha_exact),
            comb: scale(params.alpha_comb),
            gap: scale(params.alpha_gap),
        },
    }
}

fn pairs(a: &Alignment) -> Vec<(Vec<usize>, Vec<usize>)> {
    a.aligned()
        .map(|c| (c.student.range().collect(), c.teacher.range().collect()))
        .collect()
}

#[test]
fn bos_on_one_side_costs_one_gap() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let bos = s.id(b"<|begin_of_text|>", true);
    let mut student = vec![bos];
    student.extend(s.encode(&[b"Hello", b" world", b"."]));
    let teacher = t.encode(&[b"Hello", b" world", b"."]);
    let a = aligner(&s, &t, AlignParams::default())
        .align(&student, &teacher)
        .unwrap();
    assert_eq!(
        pairs(&a),
        vec![(vec![1], vec![0]), (vec![2], vec![1]), (vec![3], vec![2])]
    );
    assert_eq!(a.chunks[0].kind, ChunkKind::Gap);
    assert_eq!(a.chunks[0].student.range(), 0..1);
    assert_eq!(a.score, 3.0 * 3.0 - 1.5);
}

#[test]
fn equal_tokens_at_different_places_of_one_text_do_not_pair() {
    // "aXa" cut crosswise: "a|Xa" against "aX|a". The paper's scores alone would pair the
    // student's first "a" with the teacher's last (3 − 1.5 − 1.5 = 0 beats four gaps): the same
    // bytes, two bytes apart in the text.
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let student = s.encode(&[b"a", b"Xa"]);
    let teacher = t.encode(&[b"aX", b"a"]);
    let other = t.encode(&[b"aY", b"a"]);
    let al = aligner(&s, &t, AlignParams::default());
    for a in [
        al.align(&student, &teacher).unwrap(),
        al.align_exhaustive(&student, &teacher).unwrap(),
    ] {
        assert!(pairs(&a).is_empty(), "{:?}", a.chunks);
    }
    // When the texts differ, the DP pairs by bytes alone, as in the paper.
    let a = al.align(&student, &other).unwrap();
    assert_eq!(pairs(&a), vec![(vec![0], vec![1])]);
}

#[test]
fn a_chunk_out_of_place_is_a_named_error() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let student = s.encode(&[b"a", b"Xa"]);
    let teacher = t.encode(&[b"aX", b"a"]);
    let al = aligner(&s, &t, AlignParams::default());
    let misplaced = Alignment {
        chunks: vec![
            Chunk {
                student: Positions::new(0, 1),
                teacher: Positions::new(0, 0),
                kind: ChunkKind::Gap,
            },
            Chunk {
                student: Positions::new(1, 1),
                teacher: Positions::new(0, 1),
                kind: ChunkKind::Gap,
            },
            Chunk {
                student: Positions::new(1, 2),
                teacher: Positions::new(1, 2),
                kind: ChunkKind::Match,
            },
        ],
        student_len: 2,
        teacher_len: 2,
        score: 0.0,
        band_bytes: 16,
        band_edge_reached: false,
    };
    let err = al.verify(&student, &teacher, &misplaced).unwrap_err();
    assert!(
        matches!(err, Error::MisplacedChunk { chunk: 2, .. }),
        "{err:?}"
    );
    let message = err.to_string();
    for part in ["chunk 2", "1..2 (text bytes 1..3)", "(text bytes 2..3)"] {
        assert!(message.contains(part), "{message}");
    }
    // A chunk past the sequences is refused too, and a correct alignment passes.
    let past = Alignment {
        chunks: vec![Chunk {
            student: Positions::new(0, 3),
            teacher: Positions::new(0, 2),
            kind: ChunkKind::Span,
        }],
        ..misplaced
    };
    assert!(al.verify(&student, &teacher, &past).is_err());
    let found = al.align(&student, &teacher).unwrap();
    al.verify(&student, &teacher, &found).unwrap();
}

#[test]
fn a_band_too_wide_for_the_document_is_refused_before_allocating() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let words: Vec<&[u8]> = [&b"one "[..], b"two ", b"three "].repeat(3000);
    let (student, teacher) = (s.encode(&words), t.encode(&words));
    let wide = AlignParams {
        band_bytes: 1_000_000_000,
        ..AlignParams::default()
    };
    let err = aligner(&s, &t, wide).align(&student, &teacher).unwrap_err();
    assert!(
        matches!(err, Error::BandTooWide { cells, .. } if cells > MAX_CELLS),
        "{err:?}"
    );
    let message = err.to_string();
    for part in [
        "band_bytes = 1000000000",
        "9000 student, 9000 teacher tokens",
    ] {
        assert!(message.contains(part), "{message}");
    }
    // The default band aligns the same document.
    let a = aligner(&s, &t, AlignParams::default())
        .align(&student, &teacher)
        .unwrap();
    assert_eq!(a.aligned().count(), 9000);
}

#[test]
fn combinations_both_ways() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    // "3.14159": student packs digits, teacher splits them.
    let student = s.encode(&[b"3", b".", b"141", b"59"]);
    let teacher = t.encode(&[b"3", b".", b"1", b"4", b"1", b"5", b"9"]);
    let a = aligner(&s, &t, AlignParams::default())
        .align(&student, &teacher)
        .unwrap();
    let kinds: Vec<ChunkKind> = a.chunks.iter().map(|c| c.kind).collect();
    use ChunkKind::*;
    assert_eq!(kinds, vec![Match, Match, OneToMany, OneToMany]);
    assert_eq!(a.score, 3.0 + 3.0 + 4.5 + 3.0);
    let swapped = aligner(&t, &s, AlignParams::default())
        .align(&teacher, &student)
        .unwrap();
    let kinds: Vec<ChunkKind> = swapped.chunks.iter().map(|c| c.kind).collect();
    assert_eq!(kinds, vec![Match, Match, ManyToOne, ManyToOne]);
}

#[test]
fn emoji_split_across_byte_tokens() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let smile = "😀".as_bytes();
    let student = s.encode(&[b"hi", b" ", smile]);
    let teacher = t.encode(&[b"hi", b" ", &smile[..2], &smile[2..]]);
    let a = aligner(&s, &t, AlignParams::default())
        .align(&student, &teacher)
        .unwrap();
    assert_eq!(pairs(&a).last().unwrap(), &(vec![2], vec![2, 3]));
}

#[test]
fn crossing_boundaries_are_gaps_unless_recovered() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let student = s.encode(&[b" the", b"un", b"believ", b"able", b" end"]);
    let teacher = t.encode(&[b" the", b"unb", b"eliev", b"able", b" end"]);
    let paper = aligner(&s, &t, AlignParams::default())
        .align(&student, &teacher)
        .unwrap();
    assert_eq!(
        pairs(&paper),
        vec![(vec![0], vec![0]), (vec![3], vec![3]), (vec![4], vec![4])]
    );
    let params = AlignParams {
        recover_spans: true,
        ..AlignParams::default()
    };
    let recovered = aligner(&s, &t, params).align(&student, &teacher).unwrap();
    assert_eq!(
        pairs(&recovered),
        vec![
            (vec![0], vec![0]),
            (vec![1, 2], vec![1, 2]),
            (vec![3], vec![3]),
            (vec![4], vec![4])
        ]
    );
    assert_eq!(recovered.chunks[1].kind, ChunkKind::Span);
}

#[test]
fn greedy_fails_on_bos_where_the_dp_does_not() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let bos = s.id(b"<|begin_of_text|>", true);
    let mut student = vec![bos];
    student.extend(s.encode(&[b"Hello", b" world", b"."]));
    let teacher = t.encode(&[b"Hello", b" world", b"."]);
    let al = aligner(&s, &t, AlignParams::default());
    let g = greedy(&al, &student, &teacher).unwrap();
    assert_eq!(g.chunks.len(), 1, "one forced super-group: {:?}", g.chunks);
    assert_eq!(g.chunks[0].student.range(), 0..4);
    assert_eq!(g.chunks[0].teacher.range(), 0..3);
    // Without the BOS the greedy aligner is right.
    let g = greedy(&al, &student[1..], &teacher).unwrap();
    assert_eq!(g.chunks.len(), 3);
}

#[test]
fn empty_sides() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let student = s.encode(&[b"a", b"b"]);
    let _ = t.id(b"x", false);
    let al = aligner(&s, &t, AlignParams::default());
    let a = al.align(&student, &[]).unwrap();
    assert_eq!(a.chunks.len(), 1);
    assert_eq!(a.chunks[0].student.range(), 0..2);
    assert_eq!(a.score, -3.0);
    let a = al.align(&[], &[]).unwrap();
    assert!(a.chunks.is_empty());
    assert_eq!(a.score, 0.0);
}

#[test]
fn out_of_range_ids_are_named() {
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let student = s.encode(&[b"a"]);
    let teacher = t.encode(&[b"a"]);
    let al = aligner(&s, &t, AlignParams::default());
    let err = al
        .align(&student, &[teacher[0], 7])
        .unwrap_err()
        .to_string();
    assert!(err.contains("teacher id 7 at position 1"), "{err}");
}

#[test]
fn bad_parameters_are_named() {
    for (params, name) in [
        (
            AlignParams {
                alpha_gap: 1.0,
                ..Default::default()
            },
            "alpha_gap",
        ),
        (
            AlignParams {
                max_span: 1,
                ..Default::default()
            },
            "max_span",
        ),
        (
            AlignParams {
                alpha_exact: f64::NAN,
                ..Default::default()
            },
            "alpha_exact",
        ),
    ] {
        let err = params.validate().unwrap_err().to_string();
        assert!(err.contains(name), "{err}");
    }
}

#[test]
fn a_shifted_text_widens_the_band() {
    // The teacher's text starts with 100 bytes the student does not have: the band must widen
    // until it finds the shared tail.
    let (mut s, mut t) = (Synth::new(), Synth::new());
    let words: Vec<Vec<u8>> = (0..40).map(|i| format!(" w{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
    let student = s.encode(&refs);
    let mut teacher = t.encode(&[&[b'x'; 100][..]]);
    teacher.extend(t.encode(&refs));
    let al = aligner(&s, &t, AlignParams::default());
    let banded = al.align(&student, &teacher).unwrap();
    let full = al.align_exhaustive(&student, &teacher).unwrap();
    assert_eq!(banded.score, full.score);
    assert_eq!(banded.chunks, full.chunks);
    assert!(banded.band_bytes > 16);
    assert_eq!(banded.aligned_positions(), (40, 40));
}

/// A random text of short "words" with digits, punctuation, accents, CJK and emoji.
fn text() -> impl Strategy<Value = Vec<u8>> {
    let atoms = prop::sample::select(vec![
        " the", " a", "ab", "b", "1", "23", ".", ",", "\n", "  ", "é", "日本", "😀", " cat", "s",
    ]);
    prop::collection::vec(atoms, 0..60).prop_map(|v| v.concat().into_bytes())
}

/// Cuts `text` at random byte positions into pieces of 1..=6 bytes.
fn cut(text: &[u8], seed: &[u8]) -> Vec<Vec<u8>> {
    let mut pieces = Vec::new();
    let (mut at, mut k) = (0, 0);
    while at < text.len() {
        let len = 1 + (seed[k % seed.len()] as usize % 6);
        let end = (at + len).min(text.len());
        pieces.push(text[at..end].to_vec());
        at = end;
        k += 1;
    }
    pieces
}

/// Checks the invariants every alignment must satisfy.
fn check(a: &Alignment, s: &Synth, student: &[u32], t: &Synth, teacher: &[u32], same_text: bool) {
    let (mut p, mut q) = (0u32, 0u32);
    for c in &a.chunks {
        // Monotone, disjoint and covering: every chunk starts where the last ended.
        assert_eq!((c.student.start, c.teacher.start), (p, q), "{:?}", a.chunks);
        assert!(c.student.len + c.teacher.len > 0);
        p += c.student.len;
        q += c.teacher.len;
        if c.is_aligned() {
            assert!(c.student.len > 0 && c.teacher.len > 0);
            if same_text {
                let sb: Vec<u8> = c
                    .student
                    .range()
                    .flat_map(|i| s.pieces[student[i] as usize].clone())
                    .collect();
                let tb: Vec<u8> = c
                    .teacher
                    .range()
                    .flat_map(|j| t.pieces[teacher[j] as usize].clone())
                    .collect();
                assert_eq!(sb, tb, "chunk {c:?}");
            }
        } else {
            assert!(c.student.len == 0 || c.teacher.len == 0);
        }
    }
    assert_eq!((p, q), (a.student_len, a.teacher_len));
}

/// Text offsets (special tokens counting zero bytes) of every token boundary of a sequence.
fn text_offsets(side: &Synth, ids: &[u32]) -> Vec<usize> {
    let mut at = vec![0usize];
    for &id in ids {
        let len = if side.special[id as usize] {
            0
        } else {
            side.pieces[id as usize].len()
        };
        at.push(at.last().unwrap() + len);
    }
    at
}

/// The largest distance, in text bytes, between the start of a chunk's student side and the
/// start of its teacher side.
fn max_pairing_distance(
    a: &Alignment,
    s: &Synth,
    student: &[u32],
    t: &Synth,
    teacher: &[u32],
) -> usize {
    let (so, to) = (text_offsets(s, student), text_offsets(t, teacher));
    a.aligned()
        .map(|c| so[c.student.start as usize].abs_diff(to[c.teacher.start as usize]))
        .max()
        .unwrap_or(0)
}

/// The largest gap, in text bytes, between the byte range of a chunk's student side and that
/// of its teacher side (0 when they overlap): what the band bounds.
fn max_pairing_gap(a: &Alignment, s: &Synth, student: &[u32], t: &Synth, teacher: &[u32]) -> usize {
    let (so, to) = (text_offsets(s, student), text_offsets(t, teacher));
    a.aligned()
        .map(|c| {
            let (sr, tr) = (c.student.range(), c.teacher.range());
            let start = so[sr.start].max(to[tr.start]);
            let end = so[sr.end].min(to[tr.end]);
            start.saturating_sub(end)
        })
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn banded_equals_exhaustive_and_invariants_hold(
        text in text(),
        seed_s in prop::collection::vec(any::<u8>(), 1..16),
        seed_t in prop::collection::vec(any::<u8>(), 1..16),
        bos in any::<bool>(),
        recover in any::<bool>(),
    ) {
        let (mut s, mut t) = (Synth::new(), Synth::new());
        let sp = cut(&text, &seed_s);
        let tp = cut(&text, &seed_t);
        let mut student: Vec<u32> = Vec::new();
        if bos {
            student.push(s.id(b"<s>", true));
        }
        student.extend(sp.iter().map(|p| s.id(p, false)));
        let teacher: Vec<u32> = tp.iter().map(|p| t.id(p, false)).collect();
        let params = AlignParams { recover_spans: recover, ..AlignParams::default() };
        let al = aligner(&s, &t, params);
        let banded = al.align(&student, &teacher).unwrap();
        let full = al.align_exhaustive(&student, &teacher).unwrap();
        // The band is also a guard: it never pairs byte ranges further apart than its width.
        // Where the unrestricted optimum pairs starts within that width, both find the same
        // score.
        let width = banded.band_bytes as usize;
        if max_pairing_distance(&full, &s, &student, &t, &teacher) <= width {
            prop_assert_eq!(banded.score, full.score);
        } else {
            prop_assert!(banded.score <= full.score);
        }
        prop_assert!(max_pairing_gap(&banded, &s, &student, &t, &teacher) <= width);
        check(&banded, &s, &student, &t, &teacher, true);
        check(&full, &s, &student, &t, &teacher, true);
        prop_assert!(!banded.band_edge_reached);
        // The same tokenizer on both sides aligns every token 1-to-1.
        let (mut u, mut v) = (Synth::new(), Synth::new());
        let a: Vec<u32> = sp.iter().map(|p| u.id(p, false)).collect();
        let b: Vec<u32> = sp.iter().map(|p| v.id(p, false)).collect();
        let same = aligner(&u, &v, params).align(&a, &b).unwrap();
        prop_assert!(same.chunks.iter().all(|c| c.kind == ChunkKind::Match));
        prop_assert_eq!(same.chunks.len(), a.len());
    }

    #[test]
    fn unrelated_texts_keep_the_invariants(
        a in text(),
        b in text(),
        seed in prop::collection::vec(any::<u8>(), 1..16),
    ) {
        let (mut s, mut t) = (Synth::new(), Synth::new());
        let student: Vec<u32> = cut(&a, &seed).iter().map(|p| s.id(p, false)).collect();
        let teacher: Vec<u32> = cut(&b, &seed).iter().map(|p| t.id(p, false)).collect();
        let al = aligner(&s, &t, AlignParams::default());
        let banded = al.align(&student, &teacher).unwrap();
        let full = al.align_exhaustive(&student, &teacher).unwrap();
        check(&banded, &s, &student, &t, &teacher, false);
        check(&full, &s, &student, &t, &teacher, false);
        prop_assert!(banded.score <= full.score);
    }
}

// ------------------------------------------------- an independent reference: every path

/// One move of the paper's recurrence from cell `(i, j)`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Move {
    /// Diagonal: `+α_exact` for equal tokens (a match chunk), `−α_exact` otherwise.
    Diagonal,
    /// Student token `i` equals the next `k` teacher tokens (`2 ≤ k ≤ L`).
    OneToMany(usize),
    /// The next `k` student tokens equal teacher token `j`.
    ManyToOne(usize),
    GapStudent,
    GapTeacher,
}

/// The paper's scores, read from the recurrence as written: a combination is a move only where
/// its indicator holds (with the indicator 0 it would score 0, more than the gaps it replaces,
/// so the recurrence can only mean the move is unavailable). When both sides spell the same text,
/// tokens pair only where they start at the same byte of it (an equal token elsewhere is another
/// piece of the text, so it counts as different).
struct Paper<'a> {
    params: AlignParams,
    student: Vec<&'a [u8]>,
    teacher: Vec<&'a [u8]>,
}

impl Paper<'_> {
    /// Where token `i` of `pieces` starts in the text.
    fn start(pieces: &[&[u8]], i: usize) -> usize {
        pieces[..i].iter().map(|p| p.len()).sum()
    }

    /// Whether student token `i` and teacher token `j` may pair.
    fn placed(&self, i: usize, j: usize) -> bool {
        self.student.concat() != self.teacher.concat()
            || Self::start(&self.student, i) == Self::start(&self.teacher, j)
    }

    /// The moves available at `(i, j)`, with their scores and whether they pair tokens.
    fn moves(&self, i: usize, j: usize) -> Vec<(Move, f64, bool)> {
        let (n, m) = (self.student.len(), self.teacher.len());
        let p = &self.params;
        let mut out = Vec::new();
        let placed = self.placed(i, j);
        if i < n && j < m {
            let equal = self.student[i] == self.teacher[j] && placed;
            let score = if equal { p.alpha_exact } else { -p.alpha_exact };
            out.push((Move::Diagonal, score, equal));
        }
        for k in 2..=p.max_span {
            let combines = |one: &[u8], many: &[&[u8]]| placed && one == many.concat();
            if i < n && j + k <= m && combines(self.student[i], &self.teacher[j..j + k]) {
                out.push((Move::OneToMany(k), p.alpha_comb * k as f64, true));
            }
            if j < m && i + k <= n && combines(self.teacher[j], &self.student[i..i + k]) {
                out.push((Move::ManyToOne(k), p.alpha_comb * k as f64, true));
            }
        }
        if i < n {
            out.push((Move::GapStudent, p.alpha_gap, false));
        }
        if j < m {
            out.push((Move::GapTeacher, p.alpha_gap, false));
        }
        out
    }

    /// The best score of every path from `(i, j)` to the end, enumerated move by move (no
    /// memo: exponential, for short sequences only). With `pairs`, only paths whose two-sided
    /// chunks are exactly those, in order, count (`None`: no such path).
    fn best(&self, i: usize, j: usize, pairs: Option<&[Chunk]>) -> Option<f64> {
        if (i, j) == (self.student.len(), self.teacher.len()) {
            return pairs.is_none_or(|p| p.is_empty()).then_some(0.0);
        }
        let mut best: Option<f64> = None;
        for (mv, score, pairing) in self.moves(i, j) {
            let (di, dj) = match mv {
                Move::Diagonal => (1, 1),
                Move::OneToMany(k) => (1, k),
                Move::ManyToOne(k) => (k, 1),
                Move::GapStudent => (1, 0),
                Move::GapTeacher => (0, 1),
            };
            let rest = match pairs {
                None => None,
                Some(p) => {
                    let next = p.first();
                    let here = Positions::new(i, i + di)
                        == next.map_or(Positions::new(0, 0), |c| c.student)
                        && Positions::new(j, j + dj)
                            == next.map_or(Positions::new(0, 0), |c| c.teacher);
                    match (pairing, here) {
                        (true, true) => Some(&p[1..]),
                        (true, false) => continue,
                        // An unpaired move may not run into the next chunk's positions.
                        (false, _) => match next {
                            Some(c)
                                if i + di > c.student.start as usize
                                    || j + dj > c.teacher.start as usize =>
                            {
                                continue
                            }
                            _ => Some(p),
                        },
                    }
                }
            };
            if let Some(tail) = self.best(i + di, j + dj, rest) {
                let total = score + tail;
                best = Some(best.map_or(total, |b: f64| b.max(total)));
            }
        }
        best
    }
}

/// Short pieces over a tiny alphabet, so that equal tokens and combinations are frequent.
fn pieces() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let piece = prop::sample::select(vec!["a", "b", "ab", "ba", "aa", "abb", "é"]);
    prop::collection::vec(piece.prop_map(|p| p.as_bytes().to_vec()), 0..6)
}

/// Scores of the paper's shape (a gap costs, matches and combinations pay), in exact halves.
fn params() -> impl Strategy<Value = AlignParams> {
    (1u8..=8, 1u8..=6, 1u8..=6, 2usize..=4).prop_map(|(exact, comb, gap, max_span)| AlignParams {
        alpha_exact: exact as f64 / 2.0,
        alpha_comb: comb as f64 / 2.0,
        alpha_gap: -(gap as f64) / 2.0,
        max_span,
        ..AlignParams::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The DP's score is the best score over every path of the paper's recurrence, and the
    /// chunks it returns are the pairs of a path reaching that score.
    #[test]
    fn the_dp_finds_the_best_of_every_path(
        student_pieces in pieces(),
        teacher_pieces in pieces(),
        recut in any::<bool>(),
        seed in prop::collection::vec(any::<u8>(), 1..8),
        params in params(),
    ) {
        // Half the cases: the teacher encodes the student's text, cut elsewhere (3 bytes at
        // most per token, at most 6 tokens, so every path can be enumerated).
        let teacher_pieces = if recut {
            let text = student_pieces.concat();
            let mut cut = Vec::new();
            let (mut at, mut k) = (0, 0);
            while at < text.len() {
                let end = (at + 1 + seed[k % seed.len()] as usize % 3).min(text.len());
                cut.push(text[at..end].to_vec());
                (at, k) = (end, k + 1);
            }
            cut
        } else {
            teacher_pieces
        };
        prop_assume!(teacher_pieces.len() <= 6);
        let (mut s, mut t) = (Synth::new(), Synth::new());
        let student: Vec<u32> = student_pieces.iter().map(|p| s.id(p, false)).collect();
        let teacher: Vec<u32> = teacher_pieces.iter().map(|p| t.id(p, false)).collect();
        let al = aligner(&s, &t, params);
        let paper = Paper {
            params,
            student: student_pieces.iter().map(Vec::as_slice).collect(),
            teacher: teacher_pieces.iter().map(Vec::as_slice).collect(),
        };
        let best = paper.best(0, 0, None).expect("the all-gaps path");
        for a in [al.align_exhaustive(&student, &teacher).unwrap(), al.align(&student, &teacher).unwrap()] {
            prop_assert_eq!(a.score, best);
            let pairs: Vec<Chunk> = a.aligned().copied().collect();
            prop_assert_eq!(paper.best(0, 0, Some(&pairs)), Some(best), "chunks {:?}", a.chunks);
        }
    }
}
