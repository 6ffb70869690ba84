//! What a fused evaluation needs besides tensors: the merge plan of one side, the loss and its
//! parameters, the temperature. All of it is host data built once per batch (the plan) or once
//! per run (the common set), so every backend reads it the same way.

use std::sync::Arc;

use crate::error::KernelError;
use crate::loss_kind::LossKind;

/// How one side's merged chunk distributions are gathered from its flattened logits `[N, V]`.
///
/// Chunk slot `c` compares `log p̂_c(v) = log p[predict_row[c]](v) + σ_c`, where `σ_c` sums
/// `log p[row](token)` over the continuation terms of slot `c` (the chunk merge of
/// `docs/src/method/alignment.md`). Slots with no predicting row are padding or chunks without a
/// predicting position: the loss skips them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergePlan {
    /// Rows of the flattened logits.
    pub rows: usize,
    /// Per chunk slot: the predicting row, `None` for a slot the loss skips.
    pub predict_row: Vec<Option<u32>>,
    /// Continuation terms `(row, token, slot)`.
    pub continuation: Vec<(u32, u32, u32)>,
}

impl MergePlan {
    /// Number of chunk slots.
    pub fn slots(&self) -> usize {
        self.predict_row.len()
    }

    /// Number of slots the loss compares (the mean's denominator).
    pub fn valid(&self) -> usize {
        self.predicting().count()
    }

    /// The compared slots and their predicting rows, `(slot, row)`, in slot order.
    pub fn predicting(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.predict_row
            .iter()
            .enumerate()
            .filter_map(|(slot, row)| row.map(|row| (slot, row)))
    }

    /// Every row the merge reads: the predicting rows, then the continuation rows.
    pub fn rows_read(&self) -> impl Iterator<Item = u32> + '_ {
        let predicting = self.predict_row.iter().flatten().copied();
        predicting.chain(self.continuation.iter().map(|&(row, _, _)| row))
    }

    /// Checks every row and token against the logits' shape.
    pub fn check(&self, side: &'static str, rows: usize, vocab: usize) -> Result<(), KernelError> {
        if rows != self.rows {
            return Err(KernelError::Shape {
                what: side,
                expected: format!("{} rows", self.rows),
                found: format!("{rows} rows"),
            });
        }
        let bad_row = |row: u32| KernelError::IndexOutOfRange {
            what: side,
            field: "row",
            index: row as i64,
            size: rows,
        };
        let mut seen = vec![false; rows];
        for &row in self.predict_row.iter().flatten() {
            match seen.get_mut(row as usize) {
                None => return Err(bad_row(row)),
                Some(true) => {
                    return Err(KernelError::Invalid {
                        what: side,
                        why: format!("row {row} predicts two chunk slots; each row predicts one"),
                    })
                }
                Some(slot) => *slot = true,
            }
        }
        for &(row, token, slot) in &self.continuation {
            if row as usize >= rows {
                return Err(bad_row(row));
            }
            if token as usize >= vocab {
                return Err(KernelError::IndexOutOfRange {
                    what: side,
                    field: "continuation token",
                    index: token as i64,
                    size: vocab,
                });
            }
            if slot as usize >= self.slots() {
                return Err(KernelError::IndexOutOfRange {
                    what: side,
                    field: "continuation slot",
                    index: slot as i64,
                    size: self.slots(),
                });
            }
        }
        Ok(())
    }
}

/// The common set C of the hybrid losses as partner tables. A student id has at most one teacher
/// partner; a teacher id may have several student partners (H-KL's relaxed set pairs every
/// student token with its top-1 teacher token under W, so several may share one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommonPairs {
    /// Per student id: its teacher partner (`-1`: none).
    pub student_partner: Vec<i32>,
    /// Per teacher id `t`: its student partners are
    /// `teacher_students[teacher_first[t]..teacher_first[t + 1]]` (`V_T + 1` offsets).
    pub teacher_first: Vec<i32>,
    /// The student partners of every teacher id, grouped by teacher id, ascending within a group.
    pub teacher_students: Vec<i32>,
}

impl CommonPairs {
    /// Builds the tables from pairs; a student id in two pairs, or an id past its vocabulary,
    /// is an error.
    pub fn new(
        pairs: &[(u32, u32)],
        student_vocab: usize,
        teacher_vocab: usize,
    ) -> Result<Self, KernelError> {
        let mut student_partner = vec![-1; student_vocab];
        for &(s, t) in pairs {
            let (Some(sp), true) = (
                student_partner.get_mut(s as usize),
                (t as usize) < teacher_vocab,
            ) else {
                return Err(KernelError::IndexOutOfRange {
                    what: "common set",
                    field: "pair",
                    index: s.max(t) as i64,
                    size: student_vocab.min(teacher_vocab),
                });
            };
            if *sp >= 0 {
                return Err(KernelError::Invalid {
                    what: "common set",
                    why: format!(
                        "student id {s} is in two pairs (teachers {} and {t}): a student token \
                         has at most one partner",
                        *sp
                    ),
                });
            }
            *sp = t as i32;
        }
        Ok(Self::from_student_partners(student_partner, teacher_vocab))
    }

    /// The teacher-side groups from the student-side table (a counting sort by teacher id).
    fn from_student_partners(student_partner: Vec<i32>, teacher_vocab: usize) -> Self {
        let mut teacher_first = vec![0i32; teacher_vocab + 1];
        for &t in student_partner.iter().filter(|&&t| t >= 0) {
            teacher_first[t as usize + 1] += 1;
        }
        for t in 0..teacher_vocab {
            teacher_first[t + 1] += teacher_first[t];
        }
        let mut next = teacher_first.clone();
        let mut teacher_students = vec![0i32; teacher_first[teacher_vocab] as usize];
        for (s, &t) in student_partner.iter().enumerate() {
            if t >= 0 {
                teacher_students[next[t as usize] as usize] = s as i32;
                next[t as usize] += 1;
            }
        }
        Self {
            student_partner,
            teacher_first,
            teacher_students,
        }
    }

    /// The student partners of teacher id `t` (empty when `t` is not in C).
    pub fn students_of(&self, t: usize) -> &[i32] {
        let (a, b) = (self.teacher_first[t], self.teacher_first[t + 1]);
        &self.teacher_students[a as usize..b as usize]
    }

    /// `V_T`, the teacher width the tables were built for.
    pub fn teacher_vocab(&self) -> usize {
        self.teacher_first.len().saturating_sub(1)
    }

    /// Checks the tables against the logits' widths.
    pub fn check(&self, student_vocab: usize, teacher_vocab: usize) -> Result<(), KernelError> {
        if self.student_partner.len() != student_vocab || self.teacher_vocab() != teacher_vocab {
            return Err(KernelError::Shape {
                what: "common set",
                expected: format!("tables of {student_vocab} and {teacher_vocab} entries"),
                found: format!(
                    "{} and {}",
                    self.student_partner.len(),
                    self.teacher_vocab()
                ),
            });
        }
        Ok(())
    }

    /// No common pairs: every token is in the remainders (plain ULD).
    pub fn none(student_vocab: usize, teacher_vocab: usize) -> Self {
        Self::from_student_partners(vec![-1; student_vocab], teacher_vocab)
    }
}

/// Everything but tensors that one fused distillation evaluation needs.
#[derive(Debug, Clone)]
pub struct DistillSpec {
    /// The loss.
    pub loss: LossKind,
    /// The student side of the merge.
    pub merge: MergePlan,
    /// Temperature τ, applied to the logits of both sides; the loss is multiplied by τ².
    pub tau: f32,
    /// Rows evaluated at once: bounds the working memory to a few `row_chunk × V` buffers.
    pub row_chunk: usize,
    /// GOLD and H-KL: the common set C (required); the other losses read none.
    pub common: Option<Arc<CommonPairs>>,
    /// GOLD, H-KL: weight of the common KL term.
    pub lambda_kl: f32,
    /// GOLD, H-KL, ULD: weight of the sorted-L1 term.
    pub lambda_uld: f32,
    /// P-KL evaluates `log(p̃_S + eps)` (`p̃_S` the re-normalized projection), so that teacher
    /// tokens no student row reaches cost a constant instead of infinity.
    pub eps: f32,
}

impl DistillSpec {
    /// The common set the hybrid computation reads: C for GOLD and H-KL, no pair for ULD.
    pub fn hybrid_pairs(
        &self,
        student_vocab: usize,
        teacher_vocab: usize,
    ) -> Result<Arc<CommonPairs>, KernelError> {
        if self.loss == LossKind::Uld {
            return Ok(Arc::new(CommonPairs::none(student_vocab, teacher_vocab)));
        }
        let common = self.common.clone().ok_or(KernelError::Invalid {
            what: "loss",
            why: format!("{} needs the common set C", self.loss),
        })?;
        common.check(student_vocab, teacher_vocab)?;
        Ok(common)
    }

    /// `(λ_KL, λ_ULD)` as the hybrid computation applies them (ULD has no common term).
    pub fn hybrid_lambdas(&self) -> (f32, f32) {
        match self.loss {
            LossKind::Uld => (0.0, self.lambda_uld),
            _ => (self.lambda_kl, self.lambda_uld),
        }
    }
}

/// Everything but tensors that extracting the teacher's entries needs.
#[derive(Debug, Clone)]
pub struct EntriesSpec {
    /// The teacher side of the merge.
    pub merge: MergePlan,
    /// Entries kept per chunk (`usize::MAX` keeps the whole vocabulary).
    pub top_k: usize,
    /// Temperature τ.
    pub tau: f32,
    /// Rows read at once.
    pub row_chunk: usize,
    /// Per row, the observed next token (`-1`: none); when given, the confidence statistics of
    /// adaptive multi-teacher weighting are computed over these rows.
    pub next_token: Option<Arc<[i32]>>,
}

/// Which gradients a fused evaluation should produce.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GradRequest {
    /// With respect to the student logits.
    pub logits: bool,
    /// With respect to the projection weights.
    pub weights: bool,
}

/// Batch means of a teacher's per-position confidence (paper, appendix "Confidence-adaptive
/// weight schedules"), on its untempered distribution.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ConfidenceStats {
    /// Mean of `log p[y]` over positions with an observed next token `y` (that is, `−CE`).
    pub neg_cross_entropy: f64,
    /// Mean of `Σ p log p` (that is, `−H`).
    pub neg_entropy: f64,
    /// Mean of `max p`.
    pub max_prob: f64,
    /// Positions averaged.
    pub positions: usize,
}
