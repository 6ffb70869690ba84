//! DP span alignment of a student and a teacher token sequence that encode the same text (the
//! paper's appendix "DP span alignment scoring and recurrence").
//!
//! Needleman–Wunsch over the tokens' exact bytes, with the paper's moves and scores:
//!
//! | move | score |
//! |---|---|
//! | diagonal, equal tokens | `+α_exact` |
//! | diagonal, different tokens | `−α_exact` |
//! | one token = concatenation of `k ≤ L` tokens (1-to-k or k-to-1) | `+α_comb · k` |
//! | a token on one side left unaligned (gap) | `α_gap` |
//!
//! with `(α_exact, α_comb, α_gap, L) = (3, 1.5, −1.5, 4)` and the boundaries
//! `D(i, 0) = i·α_gap`, `D(0, j) = j·α_gap`. The backtrace gives [`Chunk`]s of consecutive
//! positions: diagonal matches and combinations are two-sided chunks (the loss's `(A_k^S, A_k^T)`);
//! gaps and mismatched diagonals leave their positions in one-sided [`ChunkKind::Gap`] chunks, which
//! the loss never sees.
//!
//! **What "equal" means.** Tokens are compared on the exact bytes they stand for, after rules 1–3
//! of [`crate::canon`] (`Ġ`/`▁` → space, `Ċ` → newline, `<0xHH>` → the byte), so a character split
//! across byte-level tokens (emoji, CJK) still aligns, and SentencePiece and byte-level tokenizers
//! compare alike. Special tokens compare by role (rule 5: Llama-3's `<|eot_id|>` equals Qwen3's
//! `<|im_end|>`) or by their literal text. Rules 2 and 4 (escaped `\n` → newline, `" ,"` → `","`)
//! are not applied: they change a token's byte count, so on two encodings of one text they could
//! only pair tokens that spell different text, and they would break the concatenation test of the
//! combination moves. They remain where they belong, in W's vocabulary matching. The space a
//! SentencePiece tokenizer puts before the whole text (Llama-2's `"▁Hello"` for `"Hello"`) is not
//! text: it is dropped from a sequence's first text token and from the first text token after each
//! special token (where SentencePiece inserts it again), so both sides spell the same bytes.
//! Both id sequences are expected to be each tokenizer's encoding of one whole document.
//!
//! **Same place.** Both sequences are expected to spell one text; when they do (special tokens
//! counting no bytes), a match or combination pairs tokens only where they start at the same byte
//! of it. The paper's scores alone would pair an equal token elsewhere where the two
//! tokenizations cross (`a|Xa` against `aX|a`: the first `a` with the last scores 3 − 1.5 − 1.5,
//! more than four gaps). Every alignment is then checked ([`Aligner::verify`]): a two-sided chunk
//! covering different bytes on the two sides is an [`Error::MisplacedChunk`]. When a tokenizer
//! changed the text (a normalizer, whitespace an added token swallows), the two texts differ, the
//! DP pairs by bytes alone as the paper does, and [`Workspace::same_text`] says so.
//!
//! **Ties** are broken deterministically, preferring at every cell (walking back from the end):
//! a diagonal match; a 1-to-k combination, smallest k first; a k-to-1 combination, smallest k
//! first; a gap, on the side whose text offset is ahead (so a path through an unaligned region
//! stays near the diagonal; the student side when level); a mismatched diagonal. Scores are kept in
//! fixed point (1/1024 units), so ties are exact and the result does not depend on floating-point
//! rounding.
//!
//! **Speed.** Both sides encode the same text, so the optimal path follows the diagonal of equal
//! byte offsets. The DP runs in a band around it: student token `i` may meet teacher token `j`
//! only when their byte ranges lie within `band_bytes` of each other (special tokens count zero
//! bytes here, so a BOS on one side does not shift the band). That is O((n + m) · band). When the
//! best path in the band touches the band's edge (extra special tokens, texts that differ), the
//! band is doubled and the DP rerun, up to the full table. [`Aligner::align_exhaustive`] always
//! runs the full O(n·m) table, as the reference.
//!
//! **Span recovery** (off by default, as in the paper): where the boundaries of both sides cross
//! (`"un|believ|able"` against `"unb|eli|evable"`), no move of the paper's DP applies and the
//! tokens become gaps. With [`AlignParams::recover_spans`], each run of unaligned tokens between
//! two aligned chunks is cut where both sides' byte offsets coincide, and every piece whose bytes
//! are equal on both sides becomes a many-to-many [`ChunkKind::Span`] chunk.

mod greedy;

pub use greedy::greedy;

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::matching::{ExactMatcher, Partners};
use crate::vocab::{TokenKind, Vocabulary};

/// Fixed-point units per score point: scores are exact multiples of 1/1024.
const SCORE_SCALE: f64 = 1024.0;
/// Score of an unreachable cell; far enough from `i64::MIN` that adding scores cannot overflow.
const UNREACHABLE: i64 = i64::MIN / 4;
/// The most cells a band may hold (≈ 9 bytes each, 600 MB): widening stops before it, and a
/// band wider from the start is refused.
const MAX_CELLS: usize = 1 << 26;

// Backpointers: which move reached a cell.
const START: u8 = 0;
const MATCH: u8 = 1;
const GAP_STUDENT: u8 = 2;
const GAP_TEACHER: u8 = 3;
const MISMATCH: u8 = 4;
const ONE_TO_MANY: u8 = 0x10;
const MANY_TO_ONE: u8 = 0x20;

/// Scores and limits of the alignment DP; the defaults are the paper's.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlignParams {
    /// `α_exact`: reward of a diagonal match, and penalty of a diagonal mismatch.
    pub alpha_exact: f64,
    /// `α_comb`: reward per token of a 1-to-k or k-to-1 combination.
    pub alpha_comb: f64,
    /// `α_gap`: score of leaving one token unaligned (negative).
    pub alpha_gap: f64,
    /// `L`: the most tokens a combination joins on its many side.
    pub max_span: usize,
    /// Half-width of the DP band, in bytes of text around the equal-offset diagonal.
    pub band_bytes: u32,
    /// Turn runs of crossing, unaligned tokens with equal bytes into many-to-many chunks.
    pub recover_spans: bool,
}

impl Default for AlignParams {
    fn default() -> Self {
        AlignParams {
            alpha_exact: 3.0,
            alpha_comb: 1.5,
            alpha_gap: -1.5,
            max_span: 4,
            band_bytes: 16,
            recover_spans: false,
        }
    }
}

impl AlignParams {
    /// Checks every parameter, naming the first one out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: String, why| Err(Error::BadParameter { name, value, why });
        let positive = |x: f64| x.is_finite() && x > 0.0 && x < 1e6;
        if !positive(self.alpha_exact) {
            return bad(
                "alpha_exact",
                self.alpha_exact.to_string(),
                "must be a finite positive number below 1e6",
            );
        }
        if !positive(self.alpha_comb) {
            return bad(
                "alpha_comb",
                self.alpha_comb.to_string(),
                "must be a finite positive number below 1e6",
            );
        }
        if !positive(-self.alpha_gap) {
            return bad(
                "alpha_gap",
                self.alpha_gap.to_string(),
                "must be a finite negative number above -1e6 (a gap is a cost)",
            );
        }
        if !(2..=15).contains(&self.max_span) {
            return bad("max_span", self.max_span.to_string(), "must be in 2..=15");
        }
        if self.band_bytes == 0 {
            return bad("band_bytes", "0".into(), "must be at least 1");
        }
        Ok(())
    }
}

/// Which sequence of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The student's token sequence.
    Student,
    /// The teacher's token sequence.
    Teacher,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Student => "student",
            Side::Teacher => "teacher",
        }
    }
}

/// A run of consecutive positions in one sequence (possibly empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Positions {
    /// The first position.
    pub start: u32,
    /// How many positions.
    pub len: u32,
}

impl Positions {
    /// The positions as a range.
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }

    /// Whether the run holds no position.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    fn new(start: usize, end: usize) -> Self {
        Positions {
            start: start as u32,
            len: (end - start) as u32,
        }
    }
}

/// How a chunk's two sides correspond.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkKind {
    /// One student token equals one teacher token.
    Match,
    /// One student token equals the concatenation of several teacher tokens.
    OneToMany,
    /// Several student tokens concatenate to one teacher token.
    ManyToOne,
    /// Several tokens on each side spell the same bytes (span recovery only).
    Span,
    /// Positions of one side that no chunk pairs: gaps and mismatched diagonals.
    Gap,
}

/// Consecutive student positions and consecutive teacher positions that spell the same text, or
/// (for [`ChunkKind::Gap`]) positions of one side left unaligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Chunk {
    /// The student positions (empty for a teacher-side gap).
    pub student: Positions,
    /// The teacher positions (empty for a student-side gap).
    pub teacher: Positions,
    /// How the sides correspond.
    pub kind: ChunkKind,
}

impl ChunkKind {
    /// The kind a chunk of `student` × `teacher` positions has by its shape alone (a 1×1 chunk
    /// is a match, one empty side a gap, more than one token on both sides a span).
    pub fn from_lengths(student: u32, teacher: u32) -> Self {
        match (student, teacher) {
            (0, _) | (_, 0) => ChunkKind::Gap,
            (1, 1) => ChunkKind::Match,
            (1, _) => ChunkKind::OneToMany,
            (_, 1) => ChunkKind::ManyToOne,
            _ => ChunkKind::Span,
        }
    }
}

impl Chunk {
    /// Whether the chunk pairs positions of both sides (it contributes to the loss).
    pub fn is_aligned(&self) -> bool {
        self.kind != ChunkKind::Gap
    }
}

/// The alignment of one student sequence with one teacher sequence.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Alignment {
    /// Every position of both sides, in order: two-sided chunks and one-sided gap chunks.
    pub chunks: Vec<Chunk>,
    /// Number of student tokens.
    pub student_len: u32,
    /// Number of teacher tokens.
    pub teacher_len: u32,
    /// The DP score of the chosen path (before span recovery).
    pub score: f64,
    /// The band half-width the final DP ran with (`u32::MAX` for the full table).
    pub band_bytes: u32,
    /// True when the best path still touched the band's edge but widening stopped at the cell
    /// limit (a very long, very different pair): the result is the band's best, not the table's.
    pub band_edge_reached: bool,
}

impl Alignment {
    /// The two-sided chunks, in order.
    pub fn aligned(&self) -> impl Iterator<Item = &Chunk> {
        self.chunks.iter().filter(|c| c.is_aligned())
    }

    /// The two-sided chunks with their index in [`Alignment::chunks`].
    pub fn aligned_indexed(&self) -> impl Iterator<Item = (usize, &Chunk)> {
        self.chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_aligned())
    }

    /// How many student and teacher positions lie in two-sided chunks.
    pub fn aligned_positions(&self) -> (usize, usize) {
        self.aligned().fold((0, 0), |(s, t), c| {
            (s + c.student.len as usize, t + c.teacher.len as usize)
        })
    }
}

/// One vocabulary as the DP sees it: bytes, equality class and band width of every id.
struct SideTable {
    path: PathBuf,
    arena: Vec<u8>,
    start: Vec<u32>,
    class: Vec<u32>,
    special: Vec<bool>,
    /// For tokenizers that prepend a space to the text (SentencePiece's dummy prefix): the class
    /// of every id's bytes without their leading space, used for a document's first text token.
    unprefixed_class: Option<Vec<u32>>,
}

impl SideTable {
    fn bytes(&self, id: u32) -> &[u8] {
        let id = id as usize;
        &self.arena[self.start[id] as usize..self.start[id + 1] as usize]
    }

    fn size(&self) -> usize {
        self.class.len()
    }
}

/// One token sequence, unpacked for the DP.
#[derive(Default)]
struct Sequence {
    bytes: Vec<u8>,
    /// Byte offset of each token in `bytes`, plus the end (length n + 1).
    offset: Vec<u32>,
    /// Offset of each token in the text, special tokens counting zero bytes (length n + 1).
    band: Vec<u32>,
    class: Vec<u32>,
    special: Vec<bool>,
    /// The text the sequence spells: its bytes without the special tokens'.
    text: Vec<u8>,
}

impl Sequence {
    fn load(&mut self, table: &SideTable, ids: &[u32], side: Side) -> Result<()> {
        self.bytes.clear();
        self.offset.clear();
        self.band.clear();
        self.class.clear();
        self.special.clear();
        self.text.clear();
        self.offset.push(0);
        self.band.push(0);
        let mut band = 0u32;
        // The space a SentencePiece tokenizer puts before the text, and again after every special
        // token it finds in the text, is not in the text.
        let mut dummy_prefix = table.unprefixed_class.as_ref();
        for (position, &id) in ids.iter().enumerate() {
            if id as usize >= table.size() {
                return Err(Error::TokenOutOfRange {
                    path: table.path.clone(),
                    side: side.name(),
                    id,
                    position,
                    size: table.size(),
                });
            }
            let mut bytes = table.bytes(id);
            let mut class = table.class[id as usize];
            let special = table.special[id as usize];
            if special {
                dummy_prefix = table.unprefixed_class.as_ref();
            } else if let Some(unprefixed) = dummy_prefix.take() {
                if let Some(rest) = bytes.strip_prefix(b" ") {
                    bytes = rest;
                    class = unprefixed[id as usize];
                }
            }
            self.bytes.extend_from_slice(bytes);
            self.offset.push(self.bytes.len() as u32);
            if !special {
                band += bytes.len() as u32;
                self.text.extend_from_slice(bytes);
            }
            self.band.push(band);
            self.class.push(class);
            self.special.push(special);
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.class.len()
    }

    /// The bytes of tokens `a..b`.
    fn span(&self, a: usize, b: usize) -> &[u8] {
        &self.bytes[self.offset[a] as usize..self.offset[b] as usize]
    }

    fn token_len(&self, i: usize) -> u32 {
        self.offset[i + 1] - self.offset[i]
    }
}

/// Reusable buffers of the DP; one per worker thread avoids reallocating per sequence.
#[derive(Default)]
pub struct Workspace {
    student: Sequence,
    teacher: Sequence,
    lo: Vec<u32>,
    hi: Vec<u32>,
    row_start: Vec<usize>,
    score: Vec<i64>,
    back: Vec<u8>,
    /// The two-sided chunks of the backtrace, in sequence order.
    pairs: Vec<Chunk>,
    /// Whether both sides of the pair last loaded spell the same text.
    same_text: bool,
}

impl Workspace {
    /// Whether both sequences of the last pair aligned with this workspace spelled the same text,
    /// so that every two-sided chunk was placed, and checked, at the same bytes of it on both
    /// sides. False where a tokenizer changed the text (Qwen3's NFC normalizer on decomposed
    /// accents, an unknown token): the DP then pairs by bytes alone, as in the paper.
    pub fn same_text(&self) -> bool {
        self.same_text
    }
}

/// Fixed-point scores.
#[derive(Debug, Clone, Copy)]
struct Scores {
    exact: i64,
    comb: i64,
    gap: i64,
}

/// Aligns token sequences of one student tokenizer with one teacher tokenizer.
pub struct Aligner {
    student: SideTable,
    teacher: SideTable,
    params: AlignParams,
    scores: Scores,
}

impl std::fmt::Debug for Aligner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aligner")
            .field("student", &self.student.path)
            .field("teacher", &self.teacher.path)
            .field("params", &self.params)
            .finish()
    }
}

impl Aligner {
    /// Indexes both vocabularies: every id's bytes and an equality class shared across the two
    /// sides (equal bytes, or special tokens paired by role). O(|V_S| + |V_T|).
    pub fn new(student: &Vocabulary, teacher: &Vocabulary, params: AlignParams) -> Result<Self> {
        params.validate()?;
        let mut interned: HashMap<&[u8], u32> = HashMap::new();
        let student_classes = class_ids(student, &mut interned, u32::MAX);
        let mut teacher_classes = class_ids(teacher, &mut interned, u32::MAX - 1);
        let student_unprefixed = unprefixed_classes(student, &mut interned, u32::MAX - 2);
        let teacher_unprefixed = unprefixed_classes(teacher, &mut interned, u32::MAX - 3);
        drop(interned);
        let matcher = ExactMatcher::new(student, teacher);
        for (id, token) in student.tokens().iter().enumerate() {
            if token.kind == TokenKind::Special {
                if let Partners::Special(t) = matcher.partners(token) {
                    teacher_classes[t as usize] = student_classes[id];
                }
            }
        }
        let scale = |x: f64| (x * SCORE_SCALE).round() as i64;
        Ok(Aligner {
            student: side_table(student, student_classes, student_unprefixed),
            teacher: side_table(teacher, teacher_classes, teacher_unprefixed),
            params,
            scores: Scores {
                exact: scale(params.alpha_exact),
                comb: scale(params.alpha_comb),
                gap: scale(params.alpha_gap),
            },
        })
    }

    /// The parameters this aligner runs with.
    pub fn params(&self) -> &AlignParams {
        &self.params
    }

    /// The bytes a sequence spells as the DP sees them (special tokens as their literal text, a
    /// SentencePiece dummy prefix space dropped), and each token's start offset plus the end.
    pub fn spell(&self, side: Side, ids: &[u32]) -> Result<(Vec<u8>, Vec<u32>)> {
        let mut seq = Sequence::default();
        seq.load(self.table(side), ids, side)?;
        Ok((seq.bytes, seq.offset))
    }

    fn table(&self, side: Side) -> &SideTable {
        match side {
            Side::Student => &self.student,
            Side::Teacher => &self.teacher,
        }
    }

    /// Aligns `student` ids with `teacher` ids with the banded DP.
    pub fn align(&self, student: &[u32], teacher: &[u32]) -> Result<Alignment> {
        self.align_with(&mut Workspace::default(), student, teacher)
    }

    /// [`Aligner::align`] reusing a workspace's buffers.
    pub fn align_with(
        &self,
        ws: &mut Workspace,
        student: &[u32],
        teacher: &[u32],
    ) -> Result<Alignment> {
        self.load(ws, student, teacher)?;
        let (n, m) = (ws.student.len(), ws.teacher.len());
        let (bs, bt) = (ws.student.band[n], ws.teacher.band[m]);
        // The end cell must lie in the band whatever the texts' lengths.
        let mut needed = 0;
        if n > 0 {
            needed = needed.max(ws.student.band[n - 1].saturating_sub(bt));
        }
        if m > 0 {
            needed = needed.max(ws.teacher.band[m - 1].saturating_sub(bs));
        }
        let full_width = bs.max(bt);
        let mut width = self.params.band_bytes.max(needed);
        loop {
            let full = width >= full_width;
            let band_width = if full { u32::MAX } else { width };
            let touched = self.run(ws, band_width, self.params.band_bytes)?;
            if !touched || full {
                return self.checked(ws, band_width, false);
            }
            let wider = width.saturating_mul(2);
            let next_cells = if wider >= full_width {
                (n + 1).saturating_mul(m + 1)
            } else {
                band_rows(&ws.student.band, &ws.teacher.band, wider, |_, _, _| {})
            };
            if next_cells > MAX_CELLS {
                return self.checked(ws, width, true);
            }
            width = wider;
        }
    }

    /// The full O(n·m) DP: the reference the banded DP is tested against.
    pub fn align_exhaustive(&self, student: &[u32], teacher: &[u32]) -> Result<Alignment> {
        let ws = &mut Workspace::default();
        self.load(ws, student, teacher)?;
        self.run(ws, u32::MAX, u32::MAX)?;
        self.checked(ws, u32::MAX, false)
    }

    /// [`Aligner::finish`], then the run-time check that every chunk is in its place.
    fn checked(&self, ws: &mut Workspace, band: u32, edge_reached: bool) -> Result<Alignment> {
        let alignment = self.finish(ws, band, edge_reached);
        self.check_places(ws, &alignment)?;
        Ok(alignment)
    }

    /// One DP in a band of half-width `width` (`u32::MAX`: the full table): lays out the band,
    /// fills it and walks back. Returns whether the path touched the band's edge; `requested` is
    /// the width the caller asked for, named if the band is refused.
    fn run(&self, ws: &mut Workspace, width: u32, requested: u32) -> Result<bool> {
        self.allocate(ws, width, requested)?;
        self.fill(ws);
        Ok(self.backtrace(ws))
    }

    fn load(&self, ws: &mut Workspace, student: &[u32], teacher: &[u32]) -> Result<()> {
        ws.student.load(&self.student, student, Side::Student)?;
        ws.teacher.load(&self.teacher, teacher, Side::Teacher)?;
        ws.same_text = ws.student.text == ws.teacher.text;
        Ok(())
    }

    /// Checks that every two-sided chunk of `alignment` covers the same bytes of the text on both
    /// sides (special tokens counting none), when both sequences spell the same text; a chunk that
    /// does not is an [`Error::MisplacedChunk`]. The DP never makes one; this guards what it
    /// returns, and alignments read from elsewhere.
    pub fn verify(&self, student: &[u32], teacher: &[u32], alignment: &Alignment) -> Result<()> {
        let ws = &mut Workspace::default();
        self.load(ws, student, teacher)?;
        self.check_places(ws, alignment)
    }

    fn check_places(&self, ws: &Workspace, alignment: &Alignment) -> Result<()> {
        if !ws.same_text {
            return Ok(());
        }
        let (s, t) = (&ws.student.band, &ws.teacher.band);
        for (index, chunk) in alignment.aligned_indexed() {
            let (sr, tr) = (chunk.student.range(), chunk.teacher.range());
            let (student_bytes, teacher_bytes) = (text_range(s, &sr), text_range(t, &tr));
            if student_bytes.is_none() || student_bytes != teacher_bytes {
                let show = |r: Option<std::ops::Range<u32>>| {
                    r.map_or("past the sequence's end".into(), |r| format!("{r:?}"))
                };
                return Err(Error::MisplacedChunk {
                    student: self.student.path.clone(),
                    teacher: self.teacher.path.clone(),
                    chunk: index,
                    pairs: format!(
                        "student positions {sr:?} (text bytes {}) with teacher positions {tr:?} \
                         (text bytes {})",
                        show(student_bytes),
                        show(teacher_bytes)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Lays out the band for half-width `width` bytes; returns its number of cells.
    fn band(&self, ws: &mut Workspace, width: u32) -> usize {
        let Workspace {
            student,
            teacher,
            lo,
            hi,
            row_start,
            ..
        } = ws;
        lo.clear();
        hi.clear();
        row_start.clear();
        band_rows(&student.band, &teacher.band, width, |l, h, start| {
            lo.push(l);
            hi.push(h);
            row_start.push(start);
        })
    }

    /// Lays out the band and allocates its cells, refusing a band of more than [`MAX_CELLS`]
    /// (a band as wide as a long document would need gigabytes).
    fn allocate(&self, ws: &mut Workspace, width: u32, requested: u32) -> Result<()> {
        let cells = self.band(ws, width);
        if cells > MAX_CELLS {
            return Err(Error::BandTooWide {
                student: self.student.path.clone(),
                teacher: self.teacher.path.clone(),
                band_bytes: requested,
                tokens: (ws.student.len(), ws.teacher.len()),
                cells,
                limit: MAX_CELLS,
            });
        }
        ws.score.clear();
        ws.score.resize(cells, UNREACHABLE);
        ws.back.clear();
        ws.back.resize(cells, START);
        Ok(())
    }

    /// Fills the band with the recurrence; ties go to the move tried first (see the module docs).
    fn fill(&self, ws: &mut Workspace) {
        let Workspace {
            student: s,
            teacher: t,
            lo,
            hi,
            row_start,
            score,
            back,
            same_text,
            ..
        } = ws;
        // When both sides spell the same text, tokens pair only where they start at the same
        // byte of it: equal bytes elsewhere are another place of the text, not the same piece.
        let anchored = *same_text;
        let placed = |i: usize, j: usize| !anchored || s.band[i] == t.band[j];
        let n = s.len();
        let max_span = self.params.max_span;
        let Scores { exact, comb, gap } = self.scores;
        let at = |score: &[i64], i: usize, j: usize| -> i64 {
            let (l, h) = (lo[i] as usize, hi[i] as usize);
            if j < l || j > h {
                UNREACHABLE
            } else {
                score[row_start[i] + j - l]
            }
        };
        for i in 0..=n {
            let (l, h) = (lo[i] as usize, hi[i] as usize);
            let base = row_start[i];
            let student_len = if i > 0 { s.token_len(i - 1) } else { 0 };
            for j in l..=h {
                let idx = base + j - l;
                if i == 0 && j == 0 {
                    score[idx] = 0;
                    back[idx] = START;
                    continue;
                }
                let mut best = UNREACHABLE;
                let mut mv = START;
                let mut consider = |value: i64, m: u8| {
                    if value > best {
                        best = value;
                        mv = m;
                    }
                };
                let diagonal = if i > 0 && j > 0 {
                    at(score, i - 1, j - 1)
                } else {
                    UNREACHABLE
                };
                // Equal tokens at different places of the text count as different tokens.
                let same =
                    i > 0 && j > 0 && s.class[i - 1] == t.class[j - 1] && placed(i - 1, j - 1);
                if same {
                    consider(diagonal + exact, MATCH);
                }
                // 1-to-k: student token i equals teacher tokens j-k+1..=j.
                if i > 0 && student_len > 0 {
                    for k in 2..=max_span.min(j) {
                        let teacher_len = t.offset[j] - t.offset[j - k];
                        if teacher_len > student_len {
                            break;
                        }
                        if teacher_len == student_len
                            && placed(i - 1, j - k)
                            && s.span(i - 1, i) == t.span(j - k, j)
                        {
                            consider(
                                at(score, i - 1, j - k) + comb * k as i64,
                                ONE_TO_MANY | k as u8,
                            );
                        }
                    }
                }
                // k-to-1: student tokens i-k+1..=i equal teacher token j.
                if j > 0 {
                    let teacher_len = t.token_len(j - 1);
                    if teacher_len > 0 {
                        for k in 2..=max_span.min(i) {
                            let student_span = s.offset[i] - s.offset[i - k];
                            if student_span > teacher_len {
                                break;
                            }
                            if student_span == teacher_len
                                && placed(i - k, j - 1)
                                && s.span(i - k, i) == t.span(j - 1, j)
                            {
                                consider(
                                    at(score, i - k, j - 1) + comb * k as i64,
                                    MANY_TO_ONE | k as u8,
                                );
                            }
                        }
                    }
                }
                // Gaps: of two equal ways through an unaligned region, take the step back toward
                // the diagonal, so the path stays near it and does not reach the band's edge.
                let up = if i > 0 {
                    at(score, i - 1, j) + gap
                } else {
                    UNREACHABLE
                };
                let left = if j > l {
                    score[idx - 1] + gap
                } else {
                    UNREACHABLE
                };
                if s.band[i] >= t.band[j] {
                    consider(up, GAP_STUDENT);
                    consider(left, GAP_TEACHER);
                } else {
                    consider(left, GAP_TEACHER);
                    consider(up, GAP_STUDENT);
                }
                if i > 0 && j > 0 && !same {
                    consider(diagonal - exact, MISMATCH);
                }
                score[idx] = best;
                back[idx] = mv;
            }
        }
    }

    /// Walks back from the end cell, recording the two-sided chunks in sequence order; returns
    /// whether the path touched the band's edge (where a path outside the band could enter).
    fn backtrace(&self, ws: &mut Workspace) -> bool {
        let (n, m) = (ws.student.len(), ws.teacher.len());
        ws.pairs.clear();
        let (mut i, mut j) = (n, m);
        let mut touched = false;
        while i > 0 || j > 0 {
            let (l, h) = (ws.lo[i] as usize, ws.hi[i] as usize);
            touched |= (j == l && l > 0) || (j == h && h < m);
            let mv = ws.back[ws.row_start[i] + j - l];
            match mv {
                MATCH => {
                    ws.pairs.push(Chunk {
                        student: Positions::new(i - 1, i),
                        teacher: Positions::new(j - 1, j),
                        kind: ChunkKind::Match,
                    });
                    i -= 1;
                    j -= 1;
                }
                // Gaps and mismatches leave their positions between two pairs: `finish` emits
                // everything between consecutive pairs as unaligned.
                MISMATCH => {
                    i -= 1;
                    j -= 1;
                }
                GAP_STUDENT => i -= 1,
                GAP_TEACHER => j -= 1,
                _ if mv & ONE_TO_MANY != 0 => {
                    let k = (mv & 0x0F) as usize;
                    ws.pairs.push(Chunk {
                        student: Positions::new(i - 1, i),
                        teacher: Positions::new(j - k, j),
                        kind: ChunkKind::OneToMany,
                    });
                    i -= 1;
                    j -= k;
                }
                _ if mv & MANY_TO_ONE != 0 => {
                    let k = (mv & 0x0F) as usize;
                    ws.pairs.push(Chunk {
                        student: Positions::new(i - k, i),
                        teacher: Positions::new(j - 1, j),
                        kind: ChunkKind::ManyToOne,
                    });
                    i -= k;
                    j -= 1;
                }
                // Every band cell but the origin is reached by some move (the band is connected).
                _ => unreachable!("backtrace reached an unfilled cell ({i}, {j})"),
            }
        }
        ws.pairs.reverse();
        touched
    }

    /// Turns the backtrace into chunks (with span recovery when asked).
    fn finish(&self, ws: &mut Workspace, band_bytes: u32, band_edge_reached: bool) -> Alignment {
        let (n, m) = (ws.student.len(), ws.teacher.len());
        let end = ws.score.len() - 1;
        let score = ws.score[end] as f64 / SCORE_SCALE;
        let mut chunks = Vec::with_capacity(n.max(m));
        // Everything between two consecutive two-sided chunks is unaligned on both sides.
        let (mut p, mut q) = (0usize, 0usize);
        let pairs = std::mem::take(&mut ws.pairs);
        for pair in &pairs {
            let (student, teacher) = (pair.student.range(), pair.teacher.range());
            self.flush(ws, &mut chunks, p..student.start, q..teacher.start);
            chunks.push(*pair);
            (p, q) = (student.end, teacher.end);
        }
        self.flush(ws, &mut chunks, p..n, q..m);
        ws.pairs = pairs;
        Alignment {
            chunks,
            student_len: n as u32,
            teacher_len: m as u32,
            score,
            band_bytes,
            band_edge_reached,
        }
    }

    /// Emits an unaligned region: as gap chunks, or recovered into spans where bytes agree.
    fn flush(
        &self,
        ws: &Workspace,
        chunks: &mut Vec<Chunk>,
        student: std::ops::Range<usize>,
        teacher: std::ops::Range<usize>,
    ) {
        if self.params.recover_spans && !student.is_empty() && !teacher.is_empty() {
            recover_spans(&ws.student, &ws.teacher, student, teacher, chunks);
        } else {
            push_gaps(chunks, student, teacher);
        }
    }
}

/// Walks the rows of the band of half-width `width` over two sequences' text offsets, giving
/// each row's first and last column and its first cell; returns the number of cells.
///
/// Cell `(i, j)` (student prefix `i`, teacher prefix `j`) is in the band when student token
/// `i`'s text range and teacher token `j`'s text range are within `width` bytes. Both bounds
/// grow with `i`, so each row is one contiguous run of columns, found by two pointers.
fn band_rows(s: &[u32], t: &[u32], width: u32, mut row: impl FnMut(u32, u32, usize)) -> usize {
    let (n, m) = (s.len() - 1, t.len() - 1);
    let (mut lo, mut hi) = (0usize, 0usize);
    let mut cells = 0usize;
    for i in 0..=n {
        let token_start = if i == 0 { 0 } else { s[i - 1] };
        let token_end = s[i];
        while lo < m && t[lo].saturating_add(width) < token_start {
            lo += 1;
        }
        while hi < m && t[hi] <= token_end.saturating_add(width) {
            hi += 1;
        }
        let lo_i = lo.min(hi);
        row(lo_i as u32, hi as u32, cells);
        cells += hi - lo_i + 1;
    }
    cells
}

/// The text bytes `positions` cover, given a sequence's text offsets (`None` past its end).
fn text_range(band: &[u32], positions: &std::ops::Range<usize>) -> Option<std::ops::Range<u32>> {
    Some(*band.get(positions.start)?..*band.get(positions.end)?)
}

/// Emits one-sided gap chunks for a student run and a teacher run (either may be empty).
fn push_gaps(
    chunks: &mut Vec<Chunk>,
    student: std::ops::Range<usize>,
    teacher: std::ops::Range<usize>,
) {
    if !student.is_empty() {
        chunks.push(Chunk {
            student: Positions::new(student.start, student.end),
            teacher: Positions::new(teacher.start, teacher.start),
            kind: ChunkKind::Gap,
        });
    }
    if !teacher.is_empty() {
        chunks.push(Chunk {
            student: Positions::new(student.end, student.end),
            teacher: Positions::new(teacher.start, teacher.end),
            kind: ChunkKind::Gap,
        });
    }
}

/// Cuts an unaligned region where both sides' byte offsets coincide and pairs every piece whose
/// bytes are equal. Special tokens at the region's ends stay gaps (a BOS spells no text).
fn recover_spans(
    s: &Sequence,
    t: &Sequence,
    student: std::ops::Range<usize>,
    teacher: std::ops::Range<usize>,
    chunks: &mut Vec<Chunk>,
) {
    // The run without the special tokens at its ends.
    let text_core = |seq: &Sequence, r: &std::ops::Range<usize>| {
        let (mut head, mut tail) = (r.start, r.end);
        while head < tail && seq.special[head] {
            head += 1;
        }
        while tail > head && seq.special[tail - 1] {
            tail -= 1;
        }
        head..tail
    };
    let (s_inner, t_inner) = (text_core(s, &student), text_core(t, &teacher));
    push_gaps(
        chunks,
        student.start..s_inner.start,
        teacher.start..t_inner.start,
    );
    let (mut p, mut q) = (s_inner.start, t_inner.start);
    // Unaligned positions not yet emitted, since (gap_p, gap_q).
    let (mut gap_p, mut gap_q) = (p, q);
    while p < s_inner.end && q < t_inner.end {
        let (p0, q0) = (p, q);
        let mut ls = s.token_len(p);
        let mut lt = t.token_len(q);
        p += 1;
        q += 1;
        while ls != lt {
            if ls < lt {
                if p == s_inner.end {
                    break;
                }
                ls += s.token_len(p);
                p += 1;
            } else {
                if q == t_inner.end {
                    break;
                }
                lt += t.token_len(q);
                q += 1;
            }
        }
        if ls != lt {
            break;
        }
        if ls > 0 && s.span(p0, p) == t.span(q0, q) {
            push_gaps(chunks, gap_p..p0, gap_q..q0);
            chunks.push(Chunk {
                student: Positions::new(p0, p),
                teacher: Positions::new(q0, q),
                kind: ChunkKind::Span,
            });
            gap_p = p;
            gap_q = q;
        }
    }
    push_gaps(chunks, gap_p..s_inner.end, gap_q..t_inner.end);
    push_gaps(chunks, s_inner.end..student.end, t_inner.end..teacher.end);
}

/// The class of `bytes`: the one it already has, or the next free one.
fn intern<'v>(interned: &mut HashMap<&'v [u8], u32>, bytes: &'v [u8]) -> u32 {
    let next = interned.len() as u32;
    *interned.entry(bytes).or_insert(next)
}

/// Equality class of every id: interned bytes for text and special tokens, a never-matching
/// sentinel for padding.
fn class_ids<'v>(
    vocab: &'v Vocabulary,
    interned: &mut HashMap<&'v [u8], u32>,
    padding: u32,
) -> Vec<u32> {
    let mut classes: Vec<u32> = vocab
        .tokens()
        .iter()
        .map(|token| match token.kind {
            TokenKind::Padding => padding,
            _ if token.bytes.is_empty() => padding,
            _ => intern(interned, &token.bytes),
        })
        .collect();
    classes.resize(vocab.size(), padding);
    classes
}

/// For a tokenizer with a dummy prefix space: the class of every id's bytes without their
/// leading space (`empty`, a never-matching class, where nothing is left).
fn unprefixed_classes<'v>(
    vocab: &'v Vocabulary,
    interned: &mut HashMap<&'v [u8], u32>,
    empty: u32,
) -> Option<Vec<u32>> {
    if !vocab.adds_prefix_space() {
        return None;
    }
    let classes = (0..vocab.size() as u32)
        .map(|id| {
            let rest = vocab
                .token(id)
                .filter(|t| matches!(t.kind, TokenKind::Normal | TokenKind::ByteFallback))
                .and_then(|t| t.bytes.strip_prefix(b" "))
                .filter(|rest| !rest.is_empty());
            rest.map_or(empty, |rest| intern(interned, rest))
        })
        .collect();
    Some(classes)
}

fn side_table(
    vocab: &Vocabulary,
    class: Vec<u32>,
    unprefixed_class: Option<Vec<u32>>,
) -> SideTable {
    let mut arena = Vec::new();
    let mut start = Vec::with_capacity(vocab.size() + 1);
    let mut special = Vec::with_capacity(vocab.size());
    start.push(0);
    for id in 0..vocab.size() as u32 {
        let token = vocab.token(id);
        if let Some(token) = token {
            if token.kind != TokenKind::Padding {
                arena.extend_from_slice(&token.bytes);
            }
        }
        start.push(arena.len() as u32);
        special.push(matches!(token.map(|t| t.kind), Some(TokenKind::Special)));
    }
    SideTable {
        path: vocab.path().to_path_buf(),
        arena,
        start,
        class,
        special,
        unprefixed_class,
    }
}

#[cfg(test)]
mod tests;
