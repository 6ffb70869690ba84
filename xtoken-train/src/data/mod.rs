//! The training data, from text files to the micro-batches of one optimizer step:
//!
//! 1. [`reader`]: documents read from `.jsonl`, `.parquet` or `.txt`;
//! 2. [`pipeline`]: each document tokenized by the student and every teacher and aligned (the
//!    paper's DP), on worker threads, once, into the alignment cache that later runs and
//!    resumes reuse ([`open_or_build_cache`]);
//! 3. [`packer`]: documents packed into rows of `context_length` student tokens in a seeded
//!    order;
//! 4. [`batch`]: rows laid out as a [`MicroBatch`] with one [`BatchPlan`] per teacher;
//! 5. [`loader`]: whole steps assembled on a background thread ahead of the training loop.
//!
//! **Packing.** Documents follow each other in a row, as in Hugging Face's concatenate-and-chunk
//! packing; a document that does not fit the rest of a row is cut, and its remainder starts the
//! next row. Cuts fall on positions where no chunk of any teacher's alignment straddles (so
//! every chunk stays whole on both sides); only when a whole row has no such position is a cut
//! forced at the row's end, dropping the chunks it splits.
//!
//! **Order and resumption.** Epoch `e` visits the documents in a Fisher–Yates shuffle seeded by
//! `(seed, e)`. The loader's whole state is `(epoch, document, offset)`: a checkpoint stores the
//! state after its last step, and a resumed run starts from it with the very same rows.
//!
//! A training loop of your own can skip the cache: [`Pipeline::process`] aligns a text in
//! memory, and [`micro_batch`] lays such texts out for the models and the losses.
//!
//! [`BatchPlan`]: xtoken_core::plan::BatchPlan

pub mod batch;
pub mod loader;
pub mod packer;
pub mod pipeline;
pub mod reader;
#[cfg(test)]
mod tests;

pub use batch::{micro_batch, MicroBatch, StepBatch, TeacherBatch};
pub use loader::{BatchShape, Loader};
pub use packer::{LoaderState, Packer};
pub use pipeline::{
    align_file, load_tokenizers, open_or_build_cache, AlignedText, FileJob, FileStats, Pipeline,
    Tally,
};
pub use reader::{DocumentReader, RawDoc, TextExtractor};
