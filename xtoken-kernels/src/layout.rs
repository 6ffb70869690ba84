//! W's fixed structure, laid out once. While W learns only its weights change; its teacher ids
//! stay. Checking them and sorting them by teacher id (the columns P-KL walks) on every
//! evaluation would read `V_S · K_w` ids back from the device (a wait on a GPU) and sort them
//! again each time; a [`ProjectionLayout`] does both once, when W is made.

use std::sync::Arc;

use crate::checks::{check_id_range, check_projection_entries, id_range, projection_width};
use crate::error::KernelError;

/// W transposed: per teacher id, the flat slots `s · K_w + k` that point to it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Columns {
    pub(crate) start: Vec<u32>,
    pub(crate) slots: Vec<u32>,
}

impl Columns {
    /// A counting sort of the slots by teacher id.
    pub(crate) fn new(indices: &[i64], teacher_vocab: usize) -> Self {
        let mut start = vec![0u32; teacher_vocab + 1];
        for &t in indices.iter().filter(|&&t| t >= 0) {
            start[t as usize + 1] += 1;
        }
        for t in 0..teacher_vocab {
            start[t + 1] += start[t];
        }
        let mut fill = start.clone();
        let mut slots = vec![0u32; start[teacher_vocab] as usize];
        for (slot, &t) in indices.iter().enumerate() {
            if t >= 0 {
                slots[fill[t as usize] as usize] = slot as u32;
                fill[t as usize] += 1;
            }
        }
        Self { start, slots }
    }

    /// The slots of teacher id `t` (none past the ids W knows).
    pub(crate) fn of(&self, t: usize) -> &[u32] {
        match (self.start.get(t), self.start.get(t + 1)) {
            (Some(&a), Some(&b)) => &self.slots[a as usize..b as usize],
            _ => &[],
        }
    }

    /// `start` for a teacher vocabulary of `teacher_vocab` ids (≥ W's): ids W never names
    /// start, and end, where the last column ends.
    #[cfg_attr(not(feature = "cube"), allow(dead_code))]
    pub(crate) fn start_for(&self, teacher_vocab: usize) -> Vec<u32> {
        let mut start = self.start.clone();
        let end = start.last().copied().unwrap_or(0);
        start.resize(teacher_vocab.max(start.len() - 1) + 1, end);
        start
    }
}

/// W's teacher ids `[V_S, K_w]` (`-1`: empty slot), checked and sorted by teacher id.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectionLayout {
    indices: Vec<i64>,
    shape: [usize; 2],
    teacher_vocab: usize,
    pub(crate) columns: Columns,
}

impl ProjectionLayout {
    /// Lays out W's ids `[V_S, K_w]` (row-major) pointing into `teacher_vocab` ids: every id is
    /// `-1` or below `teacher_vocab`, and at least one slot is occupied.
    pub fn new(
        indices: Vec<i64>,
        shape: [usize; 2],
        teacher_vocab: usize,
    ) -> Result<Arc<Self>, KernelError> {
        if indices.len() != shape[0] * shape[1] {
            return Err(KernelError::Shape {
                what: "projection indices",
                expected: format!("{shape:?}"),
                found: format!("{} ids", indices.len()),
            });
        }
        check_id_range(
            id_range(&indices),
            -1,
            teacher_vocab,
            "projection indices",
            "teacher id",
        )?;
        check_projection_entries(&indices)?;
        let columns = Columns::new(&indices, teacher_vocab);
        Ok(Arc::new(Self {
            indices,
            shape,
            teacher_vocab,
            columns,
        }))
    }

    /// The teacher ids, row-major.
    pub fn indices(&self) -> &[i64] {
        &self.indices
    }

    /// `[V_S, K_w]`.
    pub fn shape(&self) -> [usize; 2] {
        self.shape
    }

    /// Checks that this layout describes W's tensors of `indices` and `weights` shapes, for
    /// logits `student_vocab` wide, into a teacher vocabulary of `teacher_vocab` ids; returns
    /// `K_w`.
    pub(crate) fn fits(
        &self,
        (indices, weights): (&[usize], &[usize]),
        student_vocab: usize,
        teacher_vocab: usize,
    ) -> Result<usize, KernelError> {
        let kw = projection_width(indices, weights, student_vocab)?;
        if indices != self.shape || self.teacher_vocab > teacher_vocab {
            return Err(KernelError::Shape {
                what: "projection layout",
                expected: format!("{indices:?} into at most {teacher_vocab} teacher ids"),
                found: format!("{:?} into {} teacher ids", self.shape, self.teacher_vocab),
            });
        }
        Ok(kw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The columns list each teacher id's slots in slot order; ids past W's have none, and the
    /// widened `start` agrees with the columns.
    #[test]
    fn columns_list_each_teacher_ids_slots() {
        let layout = ProjectionLayout::new(vec![2, -1, 0, 2, 1, -1], [3, 2], 3).unwrap();
        let c = &layout.columns;
        assert_eq!(
            [c.of(0), c.of(1), c.of(2), c.of(7)],
            [&[2][..], &[4], &[0, 3], &[]]
        );
        let start = c.start_for(5);
        assert_eq!(start, vec![0, 1, 2, 4, 4, 4]);
        let e = ProjectionLayout::new(vec![3, -1], [1, 2], 3).unwrap_err();
        assert!(e.to_string().contains("teacher id"), "{e}");
        assert!(ProjectionLayout::new(vec![-1, -1], [1, 2], 3).is_err());
        assert!(ProjectionLayout::new(vec![0], [1, 2], 3).is_err());
    }
}
