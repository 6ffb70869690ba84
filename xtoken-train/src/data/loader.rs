//! The background loader: whole optimizer steps assembled on their own thread, `prefetch`
//! ahead of the training loop.

use xtoken_core::plan::MergeVariant;

use super::background::Background;
use super::batch::{micro_batch, StepBatch};
use super::packer::Packer;
use crate::error::Result;

/// How the loader splits each global batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchShape {
    /// Rows per optimizer step over all workers.
    pub global: usize,
    /// Rows per micro-batch.
    pub micro: usize,
    /// Data-parallel workers.
    pub workers: usize,
    /// Which worker this is: rows `rank, rank + workers, …` of a batch are its own.
    pub rank: usize,
    /// Rows (the student's and each teacher's) are padded to a multiple of this many tokens.
    pub length_multiple: usize,
}

/// Assembles step batches on a background thread, `prefetch` ahead of the training loop.
pub struct Loader {
    steps: Background<StepBatch>,
}

impl Loader {
    /// Starts from where `packer` stands.
    pub fn start(
        mut packer: Packer,
        shape: BatchShape,
        variant: MergeVariant,
        prefetch: usize,
    ) -> Result<Self> {
        let next = move || -> Result<StepBatch> {
            let mut mine = Vec::with_capacity(shape.global / shape.workers);
            for i in 0..shape.global {
                let row = packer.next_row()?;
                if i % shape.workers == shape.rank {
                    mine.push(row);
                }
            }
            let micro = mine
                .chunks(shape.micro)
                .map(|rows| micro_batch(rows, variant, shape.length_multiple))
                .collect::<Result<Vec<_>>>()?;
            Ok(StepBatch {
                micro,
                state_after: packer.state()?,
            })
        };
        let steps = Background::spawn("xtoken-loader", "data loader", prefetch, next)?;
        Ok(Loader { steps })
    }

    /// The next step's batch.
    pub fn next_step(&mut self) -> Result<StepBatch> {
        self.steps.recv()
    }
}
