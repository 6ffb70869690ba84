//! Micro-batches: aligned rows padded into the models' id tensors, with one batch plan per
//! teacher for the losses.

use xtoken_core::plan::{BatchPlan, ChunkPlan, MergeVariant, PlanItem};
use xtoken_kernels::host::HostEntries;

use super::packer::LoaderState;
use super::pipeline::AlignedText;
use super::pipeline::TeacherSpan;
use super::prompts::PromptBatch;
use crate::error::Result;

/// One forward/backward pass's inputs, laid out for the models and the losses.
pub struct MicroBatch {
    /// Rows in this micro-batch.
    pub rows: usize,
    /// Student ids `[rows, student_len]`, right-padded with 0.
    pub student_ids: Vec<i64>,
    /// The longest row's student tokens.
    pub student_len: usize,
    /// `true` on padded student positions; `None` when no row is padded.
    pub student_padding: Option<Vec<bool>>,
    /// Per teacher: ids, length, padding and the batch plan against the student.
    pub teachers: Vec<TeacherBatch>,
    /// Real (unpadded) student tokens.
    pub tokens: usize,
    /// Whether the student wrote these rows (on-policy): no position has a cross-entropy label,
    /// and the chunks lie in the generated spans.
    pub on_policy: bool,
    /// The tokens the student wrote in these rows (0 off-policy).
    pub generated: usize,
}

/// One teacher's side of a micro-batch.
pub struct TeacherBatch {
    /// Teacher ids `[rows, len]`, right-padded with 0.
    pub ids: Vec<i64>,
    /// The rows' length: the longest row's teacher tokens, rounded up to the micro-batch's
    /// multiple.
    pub len: usize,
    /// `true` on padded teacher positions; `None` when no row is padded.
    pub padding: Option<Vec<bool>>,
    /// The chunk plan of this teacher against the student, for the losses.
    pub plan: BatchPlan,
    /// Per row, its documents' stretches (packed rows; empty otherwise).
    pub spans: Vec<Vec<TeacherSpan>>,
    /// A stored teacher's entries for `plan`, merged by the loader (`None` for a teacher that
    /// runs).
    pub stored: Option<HostEntries>,
}

/// The micro-batches of one optimizer step on this worker, and the loader state after it.
pub struct StepBatch {
    /// The micro-batches, in order (with `[on_policy]`: the off-policy ones).
    pub micro: Vec<MicroBatch>,
    /// The on-policy micro-batches' prompts, which the student continues before the step.
    pub prompts: Vec<PromptBatch>,
    /// On-policy sequences in the step's global batch (over all workers).
    pub on_policy_rows: usize,
    /// Sequences in the step's global batch.
    pub rows: usize,
    /// Where the loader stands after this step (what a checkpoint records).
    pub state_after: LoaderState,
}

/// Rows padded on the right to the longest, rounded up to a multiple of `multiple`.
fn pad(rows: &[&[u32]], multiple: usize) -> (Vec<i64>, usize, Option<Vec<bool>>) {
    let longest = rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
    let len = longest.next_multiple_of(multiple.max(1));
    let mut ids = vec![0i64; rows.len() * len];
    let mut padding = vec![false; rows.len() * len];
    for (b, row) in rows.iter().enumerate() {
        for (p, &id) in row.iter().enumerate() {
            ids[b * len + p] = id as i64;
        }
        padding[b * len + row.len()..(b + 1) * len].fill(true);
    }
    let padded = padding.iter().any(|&p| p);
    (ids, len, padded.then_some(padding))
}

/// Lays out rows as a micro-batch: the student's rows and each teacher's padded to the
/// longest, rounded up to a multiple of `length_multiple` (see
/// `DeviceMemory::length_multiple`).
pub fn micro_batch(
    rows: &[AlignedText],
    variant: MergeVariant,
    length_multiple: usize,
) -> Result<MicroBatch> {
    let student: Vec<&[u32]> = rows.iter().map(|r| r.student_ids.as_slice()).collect();
    let (student_ids, student_len, student_padding) = pad(&student, length_multiple);
    let teachers = rows.first().map_or(0, |r| r.teachers.len());
    let mut out = Vec::with_capacity(teachers);
    for m in 0..teachers {
        let plans: Vec<ChunkPlan> = rows
            .iter()
            .map(|r| ChunkPlan::new(&r.teachers[m].1))
            .collect();
        let teacher: Vec<&[u32]> = rows.iter().map(|r| r.teachers[m].0.as_slice()).collect();
        let (ids, len, padding) = pad(&teacher, length_multiple);
        let items: Vec<PlanItem<'_>> = rows
            .iter()
            .zip(&plans)
            .map(|(r, plan)| PlanItem {
                plan,
                student_ids: &r.student_ids,
                teacher_ids: &r.teachers[m].0,
            })
            .collect();
        let plan = BatchPlan::new(&items, student_len, len, variant)?;
        out.push(TeacherBatch {
            ids,
            len,
            padding,
            plan,
            spans: rows
                .iter()
                .map(|r| r.spans.get(m).cloned().unwrap_or_default())
                .collect(),
            stored: None,
        });
    }
    Ok(MicroBatch {
        rows: rows.len(),
        student_ids,
        student_len,
        student_padding,
        teachers: out,
        tokens: student.iter().map(|r| r.len()).sum(),
        on_policy: false,
        generated: 0,
    })
}
