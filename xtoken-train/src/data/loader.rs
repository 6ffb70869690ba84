//! The background loader: whole optimizer steps assembled on their own thread, `prefetch`
//! ahead of the training loop.

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

use xtoken_core::plan::MergeVariant;

use super::batch::{micro_batch, StepBatch};
use super::packer::Packer;
use crate::error::{Error, Result};

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
}

/// Assembles step batches on a background thread, `prefetch` ahead of the training loop.
pub struct Loader {
    receiver: Receiver<Result<StepBatch>>,
    handle: Option<JoinHandle<()>>,
}

impl Loader {
    /// Starts from where `packer` stands.
    pub fn start(
        mut packer: Packer,
        shape: BatchShape,
        variant: MergeVariant,
        prefetch: usize,
    ) -> Result<Self> {
        let (sender, receiver) = sync_channel(prefetch);
        let handle = std::thread::Builder::new()
            .name("xtoken-loader".into())
            .spawn(move || loop {
                let step = (|| -> Result<StepBatch> {
                    let mut mine = Vec::with_capacity(shape.global / shape.workers);
                    for i in 0..shape.global {
                        let row = packer.next_row()?;
                        if i % shape.workers == shape.rank {
                            mine.push(row);
                        }
                    }
                    let micro = mine
                        .chunks(shape.micro)
                        .map(|rows| micro_batch(rows, variant))
                        .collect::<Result<Vec<_>>>()?;
                    Ok(StepBatch {
                        micro,
                        state_after: packer.state()?,
                    })
                })();
                let failed = step.is_err();
                if sender.send(step).is_err() || failed {
                    return;
                }
            })
            .map_err(|e| Error::Run(format!("starting the data loader thread: {e}")))?;
        Ok(Loader {
            receiver,
            handle: Some(handle),
        })
    }

    /// The next step's batch.
    pub fn next_step(&mut self) -> Result<StepBatch> {
        match self.receiver.recv() {
            Ok(step) => step,
            Err(_) => Err(Error::Data("the data loader stopped".into())),
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Disconnecting the channel fails the thread's next (or pending) send, which ends it.
        if let Some(handle) = self.handle.take() {
            drop(std::mem::replace(&mut self.receiver, sync_channel(1).1));
            let _ = handle.join();
        }
    }
}
