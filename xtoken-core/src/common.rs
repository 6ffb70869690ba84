//! The common set C of token pairs that the hybrid losses supervise with direct KL: GOLD's strict
//! 1-to-1 set (paper Eq. "gold_common") and H-KL's relaxed set, extended through W's top-1; and
//! [`CommonTables`], the set as the partner tables the fused losses read.

use std::sync::Arc;

use xtoken_kernels::CommonPairs;

use crate::error::{Error, Result};
use crate::matching::{ExactMatcher, Partners};
use crate::projection::SparseProjection;
use crate::vocab::Vocabulary;

/// A 1-to-1 set of `(student id, teacher id)` pairs: no student and no teacher id occurs twice.
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

    /// H-KL's relaxed set: the strict set extended by `(s, argmax_t W[s,t])` for every student row
    /// not yet in it whose top entry is non-zero. Strict pairs keep priority; a teacher token
    /// claimed by several rows goes to the heaviest `W[s,t]` (ties: the lowest student id).
    pub fn relaxed(strict: &CommonSet, w: &SparseProjection) -> Self {
        let mut claimed: std::collections::HashMap<u32, (f32, u32)> =
            std::collections::HashMap::new();
        let taken: std::collections::HashSet<u32> = strict.pairs.iter().map(|&(_, t)| t).collect();
        for s in 0..w.student_vocab_size() as u32 {
            if strict.contains_student(s) {
                continue;
            }
            let Some((t, weight)) = w.top1(s) else {
                continue;
            };
            if taken.contains(&t) {
                continue;
            }
            let entry = claimed.entry(t).or_insert((weight, s));
            if weight > entry.0 {
                *entry = (weight, s);
            }
        }
        let mut pairs = strict.pairs.clone();
        pairs.extend(claimed.into_iter().map(|(t, (_, s))| (s, t)));
        pairs.sort_unstable();
        Self::from_pairs(pairs, w.student_vocab_size().max(strict.student_in.len()))
    }

    /// A set from explicit pairs over a student vocabulary of `student_size` ids; refuses a
    /// student or teacher id that occurs twice or a student id past the vocabulary.
    pub fn new(mut pairs: Vec<(u32, u32)>, student_size: usize) -> Result<Self> {
        pairs.sort_unstable();
        let mut teachers: Vec<u32> = pairs.iter().map(|&(_, t)| t).collect();
        teachers.sort_unstable();
        let repeated_student = pairs.windows(2).find(|w| w[0].0 == w[1].0).map(|w| w[0].0);
        let repeated_teacher = teachers.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
        if let Some((side, id)) = repeated_student
            .map(|s| ("student", s))
            .or(repeated_teacher.map(|t| ("teacher", t)))
        {
            return Err(Error::BadParameter {
                name: "common set",
                value: format!("{side} id {id} in two pairs"),
                why: "the common set must be 1-to-1",
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
        let found = (
            self.pairs.student_partner.len(),
            self.pairs.teacher_partner.len(),
        );
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
    fn relaxed_keeps_strict_pairs_and_gives_contested_tokens_to_the_heaviest() {
        let strict = CommonSet::from_pairs(vec![(0, 0)], 4);
        let rows = vec![
            vec![(0, 1.0)],           // strict pair
            vec![(0, 1.0)],           // wants teacher 0, already taken by the strict pair
            vec![(1, 0.6), (2, 0.4)], // top-1 teacher 1 with 0.6
            vec![(1, 0.9), (3, 0.1)], // top-1 teacher 1 with 0.9: wins
        ];
        let w = SparseProjection::from_rows(&rows, 4, 4, None).unwrap();
        let relaxed = CommonSet::relaxed(&strict, &w);
        assert_eq!(relaxed.pairs(), &[(0, 0), (3, 1)]);
        let teachers: std::collections::HashSet<_> = relaxed.pairs().iter().map(|p| p.1).collect();
        assert_eq!(teachers.len(), relaxed.len(), "1-to-1");
    }
}
