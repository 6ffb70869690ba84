//! The background loader: whole optimizer steps assembled on their own thread, `prefetch`
//! ahead of the training loop.

use xtoken_core::plan::MergeVariant;

use super::background::Background;
use super::batch::{micro_batch, MicroBatch, StepBatch};
use super::packer::Packer;
use super::prompts::{OnPolicyDraw, Prompt, PromptBatch};
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

/// Work the loader's thread does on each step's micro-batches once laid out (stored or served
/// teacher targets merged into them).
pub type Finish = Box<dyn Fn(&mut [MicroBatch]) -> Result<()> + Send>;

/// Which steps a loader makes, and how it draws their on-policy sequences.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepPlan {
    /// Steps done before the loader's first (a resumed run's step).
    pub done: u64,
    /// The on-policy draw (`None`: every sequence is a packed row).
    pub on_policy: Option<OnPolicyDraw>,
}

impl Loader {
    /// Starts from where `packer` stands. Each sequence of a step's global batch is a packed
    /// row or, as `plan`'s draw says, an on-policy prompt; this worker's rows are laid out as
    /// micro-batches of their kind, so that each micro-batch is wholly one or the other.
    pub fn start(
        mut packer: Packer,
        shape: BatchShape,
        variant: MergeVariant,
        prefetch: usize,
        plan: StepPlan,
        finish: Option<Finish>,
    ) -> Result<Self> {
        let mut step = plan.done;
        let next = move || -> Result<StepBatch> {
            step += 1;
            let mut mine = Vec::with_capacity(shape.global / shape.workers);
            let mut prompts = Vec::new();
            let mut on_policy_rows = 0;
            for i in 0..shape.global {
                let draw = plan.on_policy.filter(|d| d.on_policy(step, i));
                let own = i % shape.workers == shape.rank;
                match draw {
                    Some(draw) => {
                        on_policy_rows += 1;
                        let ids = packer.next_prompt(draw.source)?;
                        if own {
                            let seed = draw.sampling_seed(step, i);
                            prompts.push(Prompt { ids, seed });
                        }
                    }
                    None => {
                        let row = packer.next_row()?;
                        if own {
                            mine.push(row);
                        }
                    }
                }
            }
            let mut micro = mine
                .chunks(shape.micro)
                .map(|rows| micro_batch(rows, variant, shape.length_multiple))
                .collect::<Result<Vec<_>>>()?;
            if let Some(finish) = &finish {
                finish(&mut micro)?;
            }
            let prompts = prompts
                .chunks(shape.micro)
                .map(|p| PromptBatch {
                    prompts: p.to_vec(),
                })
                .collect();
            Ok(StepBatch {
                micro,
                prompts,
                on_policy_rows,
                rows: shape.global,
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
