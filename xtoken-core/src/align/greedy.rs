//! GOLD's original aligner (TRL's `GOLDTrainer`), kept for comparison: grow a decoded-text
//! buffer per side, one token at a time on the shorter side, and close a group whenever the two
//! buffers are equal. It is linear and needs no scores, but one byte of disagreement that no
//! later token cancels (a BOS on one side only) keeps the buffers unequal to the end, where
//! everything left is forced into a single group (the paper's Table "TRL failure").

use super::{Aligner, Alignment, Chunk, ChunkKind, Positions};
use crate::error::Result;

/// Aligns by growing per-side byte buffers and closing a group whenever they are equal.
///
/// Groups of one token on each side are [`ChunkKind::Match`], one-to-many and many-to-one groups
/// are named so, and anything larger is a [`ChunkKind::Span`], including the final forced group.
/// It has no score: [`Alignment::score`] is NaN.
pub fn greedy(aligner: &Aligner, student: &[u32], teacher: &[u32]) -> Result<Alignment> {
    let mut ws = super::Workspace::default();
    aligner.load(&mut ws, student, teacher)?;
    let (s, t) = (&ws.student, &ws.teacher);
    let (n, m) = (s.len(), t.len());
    let mut chunks = Vec::new();
    let (mut i, mut j) = (0usize, 0usize);
    let (mut i0, mut j0) = (0usize, 0usize);
    while i < n || j < m {
        let student_bytes = s.offset[i] - s.offset[i0];
        let teacher_bytes = t.offset[j] - t.offset[j0];
        if (student_bytes <= teacher_bytes && i < n) || j == m {
            i += 1;
        } else {
            j += 1;
        }
        let closes = i > i0 && j > j0 && s.span(i0, i) == t.span(j0, j);
        if closes {
            chunks.push(group(i0, i, j0, j));
            (i0, j0) = (i, j);
        }
    }
    if i0 < n || j0 < m {
        chunks.push(group(i0, n, j0, m));
    }
    Ok(Alignment {
        chunks,
        student_len: n as u32,
        teacher_len: m as u32,
        score: f64::NAN,
        band_bytes: 0,
        band_edge_reached: false,
    })
}

fn group(i0: usize, i: usize, j0: usize, j: usize) -> Chunk {
    let kind = ChunkKind::from_lengths((i - i0) as u32, (j - j0) as u32);
    Chunk {
        student: Positions::new(i0, i),
        teacher: Positions::new(j0, j),
        kind,
    }
}
