//! The training data, from text files to the micro-batches of one optimizer step:
//!
//! 1. [`sources`]: `data.path`'s files, directories and globs expanded into shards, grouped
//!    into the sources of a mixture;
//! 2. [`reader`]: documents read from `.jsonl`, `.parquet` or `.txt` (the text formats also
//!    `.zst`);
//! 3. [`pipeline`]: each document tokenized by the student and every teacher and aligned (the
//!    paper's DP) on worker threads;
//! 4. [`stream`]: by default the documents are streamed, read in a seeded order and aligned
//!    while training runs; [`open_or_build_cache`] instead makes (once) an alignment cache of a
//!    single file that later runs reuse (`data.cache`, or `xtoken align`);
//! 5. [`packer`]: documents packed into rows of `context_length` student tokens;
//! 6. [`batch`]: rows laid out as a [`MicroBatch`] with one [`BatchPlan`] per teacher;
//! 7. [`loader`]: whole steps assembled on a background thread ahead of the training loop;
//!    with `[on_policy]`, a seeded draw per sequence ([`prompts`]) makes it a prompt that the
//!    student will continue instead of a packed row, and what it writes is aligned like a
//!    document ([`mod@written`]).
//!
//! **Packing.** Documents follow each other in a row, as in Hugging Face's concatenate-and-chunk
//! packing; a document that does not fit the rest of a row is cut, and its remainder starts the
//! next row. Cuts fall on positions where no chunk of any teacher's alignment straddles (so
//! every chunk stays whole on both sides); only when a whole row has no such position is a cut
//! forced at the row's end, dropping the chunks it splits.
//!
//! **Order and resumption.** A cache's epoch `e` visits the documents in a Fisher–Yates shuffle
//! seeded by `(seed, e)`; a stream's order is a function of the seed too (see [`stream`]). The
//! loader's whole state is the document it stands at and how far into it
//! ([`LoaderState`]): a checkpoint stores the state after its last step, and a resumed run
//! starts from it with the very same rows.
//!
//! A training loop of your own can skip all of it: [`Pipeline::process`] aligns a text in
//! memory, and [`micro_batch`] lays such texts out for the models and the losses.
//!
//! It stands on the ground (`config`, `error`) and on nothing else of this crate;
//! [`rng`] is the seeded generator of its order (and of the benchmarks' corpora).
//!
//! [`BatchPlan`]: xtoken_core::plan::BatchPlan

mod background;
pub mod batch;
pub mod fingerprint;
pub mod loader;
pub mod packer;
pub mod pipeline;
pub mod prompts;
pub mod reader;
pub mod rng;
pub mod sources;
pub mod stream;
#[cfg(test)]
mod tests;
pub mod written;

pub use batch::{micro_batch, MicroBatch, StepBatch, TeacherBatch};
pub use loader::{BatchShape, Loader, StepPlan};
pub use packer::{Feed, LoaderState, Packer};
pub use pipeline::{
    align_file, doc_key, encode_text, load_tokenizers, open_or_build_cache, AlignedText, FileJob,
    FileStats, Pipeline, Tally, TeacherSpan,
};
pub use prompts::{OnPolicyDraw, Prompt, PromptBatch, PromptSource};
pub use reader::{DocumentReader, Fields, RawDoc, TextExtractor};
pub use sources::{Shard, Source};
pub use stream::{AlignedStream, DocumentStream, StreamCursor, StreamedDoc};
pub use written::{on_policy_batch, written, Written};
