//! Chunk plans: an alignment turned into the index arrays the loss gathers with.
//!
//! The loss compares, per two-sided chunk k, a merged distribution on each side (the chunk merge
//! of the book's `docs/src/method/alignment.md`). Logits at row `j` predict token `j + 1`, so
//! for a chunk whose tokens sit at positions `a..b`:
//!
//! - [`MergeVariant::FirstToken`] (the default):
//!   `log p̂(v) = log p[a−1](v) + Σ_{i=a+1}^{b−1} log p[i−1](x_i)`, the distribution over the
//!   chunk's first token times the probability of its observed continuation;
//! - [`MergeVariant::LastToken`] (for ablations):
//!   `log p̂(v) = Σ_{i=a}^{b−2} log p[i−1](x_i) + log p[b−2](v)`.
//!
//! Either way the plan gives, per chunk and side, one **predicting row** (the full-vocabulary
//! term) and a list of **continuation terms** `(row, token)` (single log-probabilities to add).
//! A chunk starting at position 0 has no predicting row on that side and is masked out; gap and
//! padding positions belong to no chunk and never contribute.
//!
//! [`BatchPlan`] lays a batch out as flat arrays ready to become tensors: rows are flattened
//! `b · T + position` over the padded `[B, T]` logits and chunks `b · K + k` over `[B, K]`, with
//! `K` the most chunks in any sequence of the batch. With several teachers, build one plan per
//! teacher against the same student batch.

use crate::align::Alignment;
use crate::error::{Error, Result};

/// Which token's distribution a chunk compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeVariant {
    /// The chunk's first token, times the probability of the observed continuation (the paper's).
    #[default]
    FirstToken,
    /// The probability of the observed prefix, times the chunk's last token.
    LastToken,
}

/// The two-sided chunks of one aligned sequence pair, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkPlan {
    /// Student positions `[start, start + len)` of every chunk.
    pub student: Vec<(u32, u32)>,
    /// Teacher positions `[start, start + len)` of every chunk.
    pub teacher: Vec<(u32, u32)>,
    /// Number of student tokens.
    pub student_len: u32,
    /// Number of teacher tokens.
    pub teacher_len: u32,
}

impl ChunkPlan {
    /// Keeps the two-sided chunks of an alignment; gaps are dropped.
    pub fn new(alignment: &Alignment) -> Self {
        let (student, teacher) = alignment
            .aligned()
            .map(|c| {
                (
                    (c.student.start, c.student.len),
                    (c.teacher.start, c.teacher.len),
                )
            })
            .unzip();
        ChunkPlan {
            student,
            teacher,
            student_len: alignment.student_len,
            teacher_len: alignment.teacher_len,
        }
    }

    /// Number of chunks.
    pub fn len(&self) -> usize {
        self.student.len()
    }

    /// Whether the plan has no chunk.
    pub fn is_empty(&self) -> bool {
        self.student.is_empty()
    }

    /// The chunk id of every student position (`-1`: a gap).
    pub fn student_chunk_ids(&self) -> Vec<i32> {
        chunk_ids(&self.student, self.student_len)
    }

    /// The chunk id of every teacher position (`-1`: a gap).
    pub fn teacher_chunk_ids(&self) -> Vec<i32> {
        chunk_ids(&self.teacher, self.teacher_len)
    }

    /// Whether chunk `k` can be compared: it has a predicting row on both sides.
    pub fn is_valid(&self, k: usize) -> bool {
        self.student[k].0 > 0 && self.teacher[k].0 > 0
    }
}

fn chunk_ids(spans: &[(u32, u32)], len: u32) -> Vec<i32> {
    let mut ids = vec![-1; len as usize];
    for (k, &(start, n)) in spans.iter().enumerate() {
        ids[start as usize..(start + n) as usize].fill(k as i32);
    }
    ids
}

/// The gather indices of one side of a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideIndices {
    /// Per chunk slot `[B · K]`: the flattened row whose full distribution is compared
    /// (0 for masked slots; read [`BatchPlan::chunk_mask`]).
    pub predict_row: Vec<i32>,
    /// Per continuation term: the flattened row to read.
    pub continuation_row: Vec<i32>,
    /// Per continuation term: the token whose log-probability is read at that row.
    pub continuation_token: Vec<i32>,
    /// Per continuation term: the chunk slot `b · K + k` it adds to.
    pub continuation_chunk: Vec<i32>,
    /// Per position `[B · T]`: the chunk slot covering it, `-1` for gaps, padding and masked
    /// chunks.
    pub position_chunk: Vec<i32>,
    /// Per position `[B · T]`: the observed next token (the target of next-token cross-entropy),
    /// `-1` at each sequence's last position and on padding.
    pub next_token: Vec<i32>,
}

impl SideIndices {
    /// Per position `[B · T]`: 1 where the position is in a compared chunk, else 0.
    pub fn position_mask(&self) -> Vec<f32> {
        self.position_chunk
            .iter()
            .map(|&c| if c >= 0 { 1.0 } else { 0.0 })
            .collect()
    }
}

/// One sequence pair of a batch: its plan and both sides' token ids.
#[derive(Debug, Clone, Copy)]
pub struct PlanItem<'a> {
    /// The chunks.
    pub plan: &'a ChunkPlan,
    /// The student's token ids (the continuation tokens are read from here).
    pub student_ids: &'a [u32],
    /// The teacher's token ids.
    pub teacher_ids: &'a [u32],
}

/// A batch of chunk plans as flat, padded index arrays.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchPlan {
    /// Sequences in the batch (`B`).
    pub batch: usize,
    /// Chunk slots per sequence (`K`, the most chunks of any sequence).
    pub chunks: usize,
    /// Padded student length (`T_S`).
    pub student_len: usize,
    /// Padded teacher length (`T_T`).
    pub teacher_len: usize,
    /// Which variant the indices encode.
    pub variant: MergeVariant,
    /// Student-side indices over `[B, T_S]` rows.
    pub student: SideIndices,
    /// Teacher-side indices over `[B, T_T]` rows.
    pub teacher: SideIndices,
    /// Per chunk slot `[B · K]`: 1 for a chunk compared by the loss, 0 for padding slots and
    /// chunks without a predicting row.
    pub chunk_mask: Vec<f32>,
}

impl BatchPlan {
    /// Lays out a batch over logits padded to `student_len` and `teacher_len` positions.
    pub fn new(
        items: &[PlanItem<'_>],
        student_len: usize,
        teacher_len: usize,
        variant: MergeVariant,
    ) -> Result<Self> {
        let chunks = items.iter().map(|i| i.plan.len()).max().unwrap_or(0);
        let batch = items.len();
        let mut out = BatchPlan {
            batch,
            chunks,
            student_len,
            teacher_len,
            variant,
            student: SideIndices::default(),
            teacher: SideIndices::default(),
            chunk_mask: vec![0.0; batch * chunks],
        };
        out.student.predict_row = vec![0; batch * chunks];
        out.teacher.predict_row = vec![0; batch * chunks];
        out.student.position_chunk = vec![-1; batch * student_len];
        out.teacher.position_chunk = vec![-1; batch * teacher_len];
        out.student.next_token = vec![-1; batch * student_len];
        out.teacher.next_token = vec![-1; batch * teacher_len];
        for (b, item) in items.iter().enumerate() {
            let plan = item.plan;
            check_len(
                "student",
                b,
                item.student_ids.len(),
                plan.student_len,
                student_len,
            )?;
            check_len(
                "teacher",
                b,
                item.teacher_ids.len(),
                plan.teacher_len,
                teacher_len,
            )?;
            for (side, ids, len) in [
                (&mut out.student, item.student_ids, student_len),
                (&mut out.teacher, item.teacher_ids, teacher_len),
            ] {
                for (p, &next) in ids.iter().enumerate().skip(1) {
                    side.next_token[b * len + p - 1] = next as i32;
                }
            }
            for k in 0..plan.len() {
                if !plan.is_valid(k) {
                    continue;
                }
                let slot = b * chunks + k;
                out.chunk_mask[slot] = 1.0;
                add_chunk(
                    &mut out.student,
                    variant,
                    b * student_len,
                    plan.student[k],
                    item.student_ids,
                    slot,
                );
                add_chunk(
                    &mut out.teacher,
                    variant,
                    b * teacher_len,
                    plan.teacher[k],
                    item.teacher_ids,
                    slot,
                );
            }
        }
        Ok(out)
    }

    /// Number of chunks the loss compares.
    pub fn valid_chunks(&self) -> usize {
        self.chunk_mask.iter().filter(|&&m| m > 0.0).count()
    }
}

fn check_len(side: &str, b: usize, ids: usize, plan: u32, padded: usize) -> Result<()> {
    if ids != plan as usize || ids > padded {
        return Err(Error::BadParameter {
            name: "batch plan",
            value: format!(
                "sequence {b}: {ids} {side} ids, plan for {plan}, padded length {padded}"
            ),
            why: "the ids must be the ones the plan was aligned on and fit the padded length",
        });
    }
    Ok(())
}

/// Adds one chunk's predicting row and continuation terms (row offset `base` = `b · T`).
fn add_chunk(
    side: &mut SideIndices,
    variant: MergeVariant,
    base: usize,
    (start, len): (u32, u32),
    ids: &[u32],
    slot: usize,
) {
    let (a, b) = (start as usize, (start + len) as usize);
    let (predict, continuation) = match variant {
        MergeVariant::FirstToken => (a - 1, a + 1..b),
        MergeVariant::LastToken => (b - 2, a..b - 1),
    };
    side.predict_row[slot] = (base + predict) as i32;
    for i in continuation {
        side.continuation_row.push((base + i - 1) as i32);
        side.continuation_token.push(ids[i] as i32);
        side.continuation_chunk.push(slot as i32);
    }
    side.position_chunk[base + a..base + b].fill(slot as i32);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::align::{Chunk, ChunkKind, Positions};

    fn chunk(s: (u32, u32), t: (u32, u32)) -> Chunk {
        let kind = if s.1 == 0 || t.1 == 0 {
            ChunkKind::Gap
        } else {
            ChunkKind::Match
        };
        Chunk {
            student: Positions {
                start: s.0,
                len: s.1,
            },
            teacher: Positions {
                start: t.0,
                len: t.1,
            },
            kind,
        }
    }

    /// `<bos> Hello world .` against `Hello world .` and a 1-to-3 chunk after them.
    fn example() -> (Alignment, Vec<u32>, Vec<u32>) {
        let alignment = Alignment {
            chunks: vec![
                chunk((0, 1), (0, 0)),
                chunk((1, 1), (0, 1)),
                chunk((2, 1), (1, 1)),
                chunk((3, 1), (2, 3)),
            ],
            student_len: 4,
            teacher_len: 5,
            score: 0.0,
            band_bytes: 16,
            band_edge_reached: false,
        };
        (
            alignment,
            vec![100, 101, 102, 103],
            vec![201, 202, 203, 204, 205],
        )
    }

    #[test]
    fn chunk_ids_and_validity() {
        let (alignment, _, _) = example();
        let plan = ChunkPlan::new(&alignment);
        assert_eq!(plan.len(), 3);
        assert_eq!(plan.student_chunk_ids(), vec![-1, 0, 1, 2]);
        assert_eq!(plan.teacher_chunk_ids(), vec![0, 1, 2, 2, 2]);
        // "Hello" is at teacher position 0: nothing predicts it there.
        assert!(!plan.is_valid(0));
        assert!(plan.is_valid(1) && plan.is_valid(2));
    }

    #[test]
    fn first_and_last_token_indices() {
        let (alignment, s, t) = example();
        let plan = ChunkPlan::new(&alignment);
        let item = PlanItem {
            plan: &plan,
            student_ids: &s,
            teacher_ids: &t,
        };
        let first = BatchPlan::new(&[item, item], 6, 5, MergeVariant::FirstToken).unwrap();
        assert_eq!(first.chunks, 3);
        assert_eq!(first.chunk_mask, vec![0., 1., 1., 0., 1., 1.]);
        // Sequence 1, chunk 2: student row 2 predicts position 3; teacher row 1 predicts
        // position 2, continued by tokens 204 (read at row 2) and 205 (row 3).
        assert_eq!(first.student.predict_row[5], 6 + 2);
        assert_eq!(first.teacher.predict_row[5], 5 + 1);
        let terms: Vec<(i32, i32, i32)> = (0..first.teacher.continuation_row.len())
            .map(|i| {
                (
                    first.teacher.continuation_row[i],
                    first.teacher.continuation_token[i],
                    first.teacher.continuation_chunk[i],
                )
            })
            .collect();
        assert_eq!(
            terms,
            vec![(2, 204, 2), (3, 205, 2), (7, 204, 5), (8, 205, 5)]
        );
        assert!(first.student.continuation_row.is_empty());
        assert_eq!(
            first.student.position_chunk,
            vec![-1, -1, 1, 2, -1, -1, -1, -1, 4, 5, -1, -1]
        );
        let last = BatchPlan::new(&[item], 4, 5, MergeVariant::LastToken).unwrap();
        // Teacher chunk 2 spans 2..5: prefix tokens 203 (row 1) and 204 (row 2), last row 3.
        assert_eq!(last.teacher.predict_row[2], 3);
        assert_eq!(last.teacher.continuation_row, vec![1, 2]);
        assert_eq!(last.teacher.continuation_token, vec![203, 204]);
        assert_eq!(last.valid_chunks(), 2);
    }

    #[test]
    fn wrong_lengths_are_refused() {
        let (alignment, s, t) = example();
        let plan = ChunkPlan::new(&alignment);
        let item = PlanItem {
            plan: &plan,
            student_ids: &s[..3],
            teacher_ids: &t,
        };
        let err = BatchPlan::new(&[item], 8, 8, MergeVariant::FirstToken).unwrap_err();
        assert!(
            err.to_string().contains("3 student ids, plan for 4"),
            "{err}"
        );
        let item = PlanItem {
            plan: &plan,
            student_ids: &s,
            teacher_ids: &t,
        };
        assert!(BatchPlan::new(&[item], 3, 8, MergeVariant::FirstToken).is_err());
    }
}
