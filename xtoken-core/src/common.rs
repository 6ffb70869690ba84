//! The common set C of token pairs that the hybrid losses supervise with direct KL: GOLD's strict
//! 1-to-1 set (paper Eq. "gold_common") and H-KL's relaxed set, extended through W's top-1 (many
//! student tokens may share one teacher token); and [`CommonTables`], the set as the partner
//! tables the fused losses read.
//!
//! In both, a student token has at most one partner, `U_S` is the student tokens in no pair and
//! `U_T` the teacher tokens in no pair: a teacher token in C only through relaxed pairs is
//! supervised by their KL terms and is not also ranked in the sorted L1.

use std::sync::Arc;

use xtoken_kernels::CommonPairs;

use crate::error::{Error, Result};
use crate::matching::{ExactMatcher, Partners};
use crate::projection::SparseProjection;
use crate::vocab::Vocabulary;

/// A set of `(student id, teacher id)` pairs in which no student id occurs twice; GOLD's strict
/// set is also 1-to-1 on the teacher side, H-KL's relaxed set need not be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommonSet {
    pairs: Vec<(u32, u32)>,
    student_in: Vec<bool>,
}

impl CommonSet {
    /// GOLD's strict set: pairs whose canonical strings are equal (or special tokens paired by
    /// role) and that are each other's only exact partner.
    pub fn strict(student: &Vocabulary, teacher: &Vocabulary) -> Self {
        let forward = ExactMatcher::new(student, teacher);
        let backward = ExactMatcher::new(teacher, student);
        let sole = |p: Partners| match p {
            Partners::Text(ids) if ids.len() == 1 => Some(ids[0]),
            Partners::Special(id) => Some(id),
            _ => None,
        };
        let pairs = student
            .tokens()
            .iter()
            .enumerate()
            .filter_map(|(s, token)| {
                let t = sole(forward.partners(token))?;
                let back = sole(backward.partners(&teacher.tokens()[t as usize]))?;
                (back == s as u32).then_some((s as u32, t))
            })
            .collect();
        Self::from_pairs(pairs, student.size())
    }

    /// H-KL's relaxed set (paper §"H-KL: Relaxing the 1-to-1 Matching"): the strict set, plus
    /// `(s, argmax_t W[s,t])` for every student token `s` not in it whose top entry is
    /// non-zero. Several student tokens may share a teacher token, including one that has a
    /// strict partner (the paper pairs `Hundreds` with `Hund` although `Hund` has its own).
    /// Strict pairs are kept as they are: a student token with an exact partner keeps it.
    pub fn relaxed(strict: &CommonSet, w: &SparseProjection) -> Self {
        let mut pairs = strict.pairs.clone();
        pairs.extend((0..w.student_vocab_size() as u32).filter_map(|s| {
            let (t, _) = w.top1(s).filter(|_| !strict.contains_student(s))?;
            Some((s, t))
        }));
        pairs.sort_unstable();
        Self::from_pairs(pairs, w.student_vocab_size().max(strict.student_in.len()))
    }

    /// A set from explicit pairs over a student vocabulary of `student_size` ids; refuses a
    /// student id that occurs twice or lies past the vocabulary. Teacher ids may repeat.
    pub fn new(mut pairs: Vec<(u32, u32)>, student_size: usize) -> Result<Self> {
        pairs.sort_unstable();
        pairs.dedup();
        if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::BadParameter {
                name: "common set",
                value: format!(
                    "student id {} in two pairs (teachers {} and {})",
                    w[0].0, w[0].1, w[1].1
                ),
                why: "a student token has at most one partner",
            });
        }
        if let Some(&(s, _)) = pairs.iter().find(|&&(s, _)| s as usize >= student_size) {
            return Err(Error::BadParameter {
                name: "common set",
                value: format!("student id {s}"),
                why: "is past the student vocabulary",
            });
        }
        Ok(Self::from_pairs(pairs, student_size))
    }

    fn from_pairs(pairs: Vec<(u32, u32)>, student_size: usize) -> Self {
        let mut student_in = vec![false; student_size];
        for &(s, _) in &pairs {
            if let Some(slot) = student_in.get_mut(s as usize) {
                *slot = true;
            }
        }
        CommonSet { pairs, student_in }
    }

    /// The pairs, sorted by student id.
    pub fn pairs(&self) -> &[(u32, u32)] {
        &self.pairs
    }

    /// Number of pairs, |C|.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Whether student token `s` is in a pair.
    pub fn contains_student(&self, s: u32) -> bool {
        self.student_in.get(s as usize).copied().unwrap_or(false)
    }
}

/// A common set as the partner tables the fused loss reads, for logits of given widths.
#[derive(Debug, Clone)]
pub struct CommonTables {
    pairs: Arc<CommonPairs>,
    pair_count: usize,
}

impl CommonTables {
    /// Tables for student logits `student_vocab` wide and teacher logits `teacher_vocab` wide
    /// (model vocabularies may be padded beyond their tokenizers).
    pub fn new(set: &CommonSet, student_vocab: usize, teacher_vocab: usize) -> Result<Self> {
        let pairs = CommonPairs::new(set.pairs(), student_vocab, teacher_vocab)?;
        Ok(Self {
            pairs: Arc::new(pairs),
            pair_count: set.len(),
        })
    }

    /// Number of pairs, |C|.
    pub fn len(&self) -> usize {
        self.pair_count
    }

    /// Whether C is empty.
    pub fn is_empty(&self) -> bool {
        self.pair_count == 0
    }

    pub(crate) fn pairs_for(&self, student: usize, teacher: usize) -> Result<Arc<CommonPairs>> {
        let found = (self.pairs.student_partner.len(), self.pairs.teacher_vocab());
        if found != (student, teacher) {
            return Err(Error::Shape {
                what: "common set tables",
                expected: format!("student {student} × teacher {teacher} (the logits' widths)"),
                found: format!("student {} × teacher {}", found.0, found.1),
            });
        }
        Ok(self.pairs.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relaxed_pairs_every_row_with_its_top_1_and_keeps_strict_pairs() {
        let strict = CommonSet::from_pairs(vec![(0, 0)], 5);
        let rows = vec![
            vec![(2, 0.7), (0, 0.3)], // strict pair: kept, although W's top-1 is teacher 2
            vec![(0, 1.0)],           // shares teacher 0 with the strict pair ("Hundreds" → "Hund")
            vec![(1, 0.6), (2, 0.4)], // top-1 teacher 1
            vec![(1, 0.9), (3, 0.1)], // top-1 teacher 1 as well: both pairs are kept
            vec![],                   // an empty row adds nothing
        ];
        let w = SparseProjection::from_rows(&rows, 4, 4, None).unwrap();
        let relaxed = CommonSet::relaxed(&strict, &w);
        assert_eq!(relaxed.pairs(), &[(0, 0), (1, 0), (2, 1), (3, 1)]);
        assert!(!relaxed.contains_student(4));
        // The kernels' tables group the shared teacher tokens' partners.
        let tables = CommonTables::new(&relaxed, 5, 4).unwrap();
        let pairs = tables.pairs_for(5, 4).unwrap();
        assert_eq!(pairs.students_of(0), &[0, 1]);
        assert_eq!(pairs.students_of(1), &[2, 3]);
        assert!(pairs.students_of(2).is_empty() && pairs.students_of(3).is_empty());
    }

    #[test]
    fn a_student_token_with_two_partners_is_refused() {
        let err = CommonSet::new(vec![(1, 0), (1, 2)], 4).unwrap_err();
        assert!(
            err.to_string().contains("student id 1 in two pairs"),
            "{err}"
        );
        assert!(CommonSet::new(vec![(1, 0), (2, 0)], 4).is_ok());
    }
}
