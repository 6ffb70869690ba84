//! Streaming: documents read from the shards in a seeded order and aligned by worker threads
//! while training runs, with no cache and bounded memory.
//!
//! **Order.** Each source visits its shards in a seeded shuffle per epoch; inside a shard,
//! documents are read in windows of [`WINDOW`] and each window is visited in a seeded shuffle.
//! With several sources, the `n`-th document comes from the source a seeded draw picks by the
//! weights. Every choice is a function of the seed and a position, so a [`StreamCursor`] (the
//! draw count and each source's epoch, shard, window and place in it) says where the stream
//! stands, and a stream reopened at a cursor yields the very same documents after it.
//!
//! **Work.** [`AlignedStream`] reads on a thread of its own, aligns batches of documents on
//! `threads` worker threads (rayon), and hands them on in order through a bounded channel.

use std::collections::VecDeque;
use std::sync::Arc;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use xtoken_core::align::Workspace;

use super::background::Background;
use super::pipeline::{AlignedText, Pipeline};
use super::reader::{DocumentReader, Fields, RawDoc, TextExtractor};
use super::rng::{mix, unit, SplitMix64};
use super::sources::Source;
use crate::error::{Context, Error, Result};

/// Documents read before a window is shuffled: enough to mix neighbours, small enough to
/// reread on resume.
pub const WINDOW: usize = 1024;

/// Text aligned per batch of the worker threads, once the stream is under way.
const BATCH_BYTES: usize = 1 << 20;

/// Text of the first batch: the first step waits for it, and a short run (a smoke test, the
/// demo's few steps) reads little more; each batch after doubles up to [`BATCH_BYTES`].
const FIRST_BATCH_BYTES: usize = 8 << 10;

/// Documents in a row without text (a JSON field of `""`) after which the data is refused.
const BLANK_LIMIT: usize = 100_000;

/// Where a source stands: the next document is item `item` of window `window` (in its shuffled
/// order) of the `shard`-th shard of epoch `epoch`'s shard order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceCursor {
    /// Passes over the source completed.
    pub epoch: u64,
    /// Place in the epoch's shard order.
    pub shard: u32,
    /// Window of the shard ([`WINDOW`] documents each).
    pub window: u64,
    /// Place in the window's order.
    pub item: u32,
}

/// Where a stream stands: the documents drawn so far and each source's cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCursor {
    /// Documents drawn from the mixture so far.
    pub draws: u64,
    /// Per source.
    pub sources: Vec<SourceCursor>,
}

/// A seeded permutation of `0..n`.
fn shuffled(n: usize, seed: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut rng = SplitMix64(seed);
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    order
}

/// One source's documents in order.
struct SourceReader {
    index: usize,
    source: Source,
    seed: u64,
    fields: Fields,
    cursor: SourceCursor,
    shard_order: Vec<u32>,
    reader: Option<DocumentReader>,
    extractor: Arc<TextExtractor>,
    window: Vec<Option<RawDoc>>,
    order: Vec<u32>,
    /// Shards in a row that held no document (a whole epoch of them: the source is empty).
    empty_shards: usize,
}

impl SourceReader {
    fn open(
        index: usize,
        source: Source,
        seed: u64,
        fields: &Fields,
        at: SourceCursor,
    ) -> Result<Self> {
        let mut reader = SourceReader {
            index,
            shard_order: shuffled(source.shards.len(), mix(&[seed, index as u64, at.epoch])),
            source,
            seed,
            fields: fields.clone(),
            cursor: at,
            reader: None,
            extractor: Arc::new(TextExtractor::none()),
            window: Vec::new(),
            order: Vec::new(),
            empty_shards: 0,
        };
        if at.shard as usize >= reader.source.shards.len() {
            return Err(reader.changed());
        }
        reader.open_shard()?;
        let skipped = reader.skip_windows(at.window)?;
        reader.read_window()?;
        if !skipped || at.item as usize > reader.window.len() {
            return Err(reader.changed());
        }
        Ok(reader)
    }

    /// The error of a cursor that does not fit the data any more.
    fn changed(&self) -> Error {
        Error::Data(format!(
            "data source {} ({}): the checkpoint's position (epoch {}, shard {}, window {}, item \
             {}) is past its end; its shards changed since the run started",
            self.index,
            self.source.name,
            self.cursor.epoch,
            self.cursor.shard,
            self.cursor.window,
            self.cursor.item
        ))
    }

    fn open_shard(&mut self) -> Result<()> {
        let shard = &self.source.shards[self.shard_order[self.cursor.shard as usize] as usize];
        let reader = DocumentReader::open(&shard.path, shard.format, self.fields.clone())?;
        self.extractor = Arc::new(reader.extractor());
        self.reader = Some(reader);
        Ok(())
    }

    fn skip_windows(&mut self, windows: u64) -> Result<bool> {
        match self.reader.as_mut() {
            Some(reader) => reader.skip(windows * WINDOW as u64),
            None => Ok(windows == 0),
        }
    }

    /// Reads the cursor's window and shuffles it.
    fn read_window(&mut self) -> Result<()> {
        self.window.clear();
        if let Some(reader) = self.reader.as_mut() {
            while self.window.len() < WINDOW {
                match reader.next_doc()? {
                    Some(doc) => self.window.push(Some(doc)),
                    None => break,
                }
            }
        }
        let c = self.cursor;
        let seed = mix(&[
            self.seed,
            self.index as u64,
            c.epoch,
            c.shard as u64,
            c.window,
        ]);
        self.order = shuffled(self.window.len(), seed);
        Ok(())
    }

    /// The next document, with the cursor that points at it.
    fn next(&mut self) -> Result<(SourceCursor, RawDoc, Arc<TextExtractor>)> {
        loop {
            let item = self.cursor.item as usize;
            if item < self.window.len() {
                let at = self.cursor;
                self.cursor.item += 1;
                let doc = self.window[self.order[item] as usize].take();
                let doc = doc.ok_or_else(|| Error::Data("a document read twice".into()))?;
                self.empty_shards = 0;
                return Ok((at, doc, self.extractor.clone()));
            }
            if self.window.len() == WINDOW {
                self.cursor.window += 1;
                self.cursor.item = 0;
                self.read_window()?;
                if !self.window.is_empty() {
                    continue;
                }
            }
            self.next_shard()?;
        }
    }

    /// Moves to the next shard, and past the last one to the next epoch's order.
    fn next_shard(&mut self) -> Result<()> {
        if item_free(self.cursor) && self.window.is_empty() {
            self.empty_shards += 1;
            if self.empty_shards > self.source.shards.len() {
                return Err(Error::Data(format!(
                    "data source {} ({}): no document with text in any of its {} shard(s)",
                    self.index,
                    self.source.name,
                    self.source.shards.len()
                )));
            }
        }
        let c = &mut self.cursor;
        (c.shard, c.window, c.item) = (c.shard + 1, 0, 0);
        if c.shard as usize == self.source.shards.len() {
            c.epoch += 1;
            c.shard = 0;
            self.shard_order = shuffled(
                self.source.shards.len(),
                mix(&[self.seed, self.index as u64, c.epoch]),
            );
        }
        self.open_shard()?;
        self.read_window()
    }
}

/// Whether a cursor is at the start of a shard.
fn item_free(c: SourceCursor) -> bool {
    c.window == 0 && c.item == 0
}

/// The raw documents of every source, drawn in the seeded mixture order.
pub struct DocumentStream {
    sources: Vec<SourceReader>,
    /// Cumulative normalized weights.
    bounds: Vec<f64>,
    seed: u64,
    draws: u64,
}

impl DocumentStream {
    /// The stream over `sources`, standing at `at` (the start when `None`); `fields` names the
    /// text's field (a `&str`) and the prompt's, where one is read.
    pub fn open(
        sources: Vec<Source>,
        seed: u64,
        fields: impl Into<Fields>,
        at: Option<&StreamCursor>,
    ) -> Result<Self> {
        Self::open_with(sources, seed, &fields.into(), at, false)
    }

    /// As [`open`](Self::open), for data the user changed under a checkpoint on purpose
    /// (`--allow-data-change`): a source whose position no longer fits its shards starts its
    /// next epoch instead, with a warning.
    pub fn open_after_change(
        sources: Vec<Source>,
        seed: u64,
        fields: impl Into<Fields>,
        at: Option<&StreamCursor>,
    ) -> Result<Self> {
        Self::open_with(sources, seed, &fields.into(), at, true)
    }

    fn open_with(
        sources: Vec<Source>,
        seed: u64,
        fields: &Fields,
        at: Option<&StreamCursor>,
        lenient: bool,
    ) -> Result<Self> {
        if sources.is_empty() || sources.iter().any(|s| s.shards.is_empty()) {
            return Err(Error::Data("the training data has no shard".into()));
        }
        if let Some(at) = at.filter(|at| at.sources.len() != sources.len()) {
            return Err(Error::Data(format!(
                "the checkpoint's data position has {} source(s), the configuration {}",
                at.sources.len(),
                sources.len()
            )));
        }
        let total: f64 = sources.iter().map(|s| s.weight).sum();
        let bounds = sources
            .iter()
            .scan(0.0, |acc, s| {
                *acc += s.weight / total;
                Some(*acc)
            })
            .collect();
        let readers = sources
            .into_iter()
            .enumerate()
            .map(|(i, source)| {
                let cursor = at.map(|at| at.sources[i]).unwrap_or_default();
                match SourceReader::open(i, source.clone(), seed, fields, cursor) {
                    Err(e) if lenient => {
                        tracing::warn!("{e}; the source starts its next epoch");
                        let next = SourceCursor {
                            epoch: cursor.epoch + 1,
                            ..Default::default()
                        };
                        SourceReader::open(i, source, seed, fields, next)
                    }
                    opened => opened,
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DocumentStream {
            sources: readers,
            bounds,
            seed,
            draws: at.map_or(0, |at| at.draws),
        })
    }

    /// The source of draw `n`.
    fn pick(&self, n: u64) -> usize {
        if self.sources.len() == 1 {
            return 0;
        }
        let u = unit(mix(&[self.seed, u64::MAX, n]));
        self.bounds
            .iter()
            .position(|&b| u < b)
            .unwrap_or(self.sources.len() - 1)
    }

    /// The next document, with the cursor that points at it.
    pub fn next_doc(&mut self) -> Result<(StreamCursor, RawDoc, Arc<TextExtractor>)> {
        let s = self.pick(self.draws);
        let (at, doc, extractor) = self.sources[s].next()?;
        let mut cursor = StreamCursor {
            draws: self.draws,
            sources: self.sources.iter().map(|r| r.cursor).collect(),
        };
        cursor.sources[s] = at;
        self.draws += 1;
        Ok((cursor, doc, extractor))
    }
}

/// A document as the stream hands it on.
pub struct StreamedDoc {
    /// Where it is.
    pub cursor: StreamCursor,
    /// Its ids and alignments.
    pub doc: AlignedText,
    /// With a prompt field: the student ids of the record's prompt (`None`: it has none).
    pub prompt: Option<Vec<u32>>,
}

/// Aligned documents in stream order, made on worker threads ahead of their use.
pub struct AlignedStream {
    batches: Background<Vec<StreamedDoc>>,
    buffer: VecDeque<StreamedDoc>,
}

impl AlignedStream {
    /// Starts reading `stream` and aligning its documents with `pipeline` on `threads` threads,
    /// at most `ahead` batches ahead of [`next_doc`](Self::next_doc): the first of about 8 KiB
    /// of text, each next one twice as large up to 1 MiB.
    pub fn start(
        pipeline: Arc<Pipeline>,
        mut stream: DocumentStream,
        threads: usize,
        ahead: usize,
    ) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("xtoken-align-{i}"))
            .build()
            .map_err(|e| Error::Run(format!("starting the alignment threads: {e}")))?;
        let mut blank = 0usize;
        let mut sizes = batch_sizes();
        let next = move || {
            let raw = read_batch(&mut stream, sizes.next().unwrap_or(BATCH_BYTES))?;
            let read = raw.len();
            let aligned = pool.install(|| align_batch(&pipeline, raw))?;
            blank = if aligned.is_empty() { blank + read } else { 0 };
            if blank > BLANK_LIMIT {
                return Err(Error::Data(format!(
                    "the last {blank} documents of the training data have no text"
                )));
            }
            Ok(aligned)
        };
        let batches = Background::spawn("xtoken-stream", "data stream", ahead, next)?;
        Ok(AlignedStream {
            batches,
            buffer: VecDeque::new(),
        })
    }

    /// The next aligned document.
    pub fn next_doc(&mut self) -> Result<StreamedDoc> {
        loop {
            if let Some(doc) = self.buffer.pop_front() {
                return Ok(doc);
            }
            self.buffer.extend(self.batches.recv()?);
        }
    }
}

type RawBatch = Vec<(StreamCursor, RawDoc, Arc<TextExtractor>)>;

/// The text of each batch in turn: [`FIRST_BATCH_BYTES`], doubling up to [`BATCH_BYTES`].
fn batch_sizes() -> impl Iterator<Item = usize> + Send {
    std::iter::successors(Some(FIRST_BATCH_BYTES), |&b| Some((2 * b).min(BATCH_BYTES)))
}

/// About `size` bytes of documents (the stream never ends: sources restart their epochs).
fn read_batch(stream: &mut DocumentStream, size: usize) -> Result<RawBatch> {
    let mut batch = Vec::new();
    let mut bytes = 0;
    while bytes < size {
        let doc = stream.next_doc()?;
        bytes += doc.1.len();
        batch.push(doc);
    }
    Ok(batch)
}

/// Extracts, tokenizes and aligns a batch on the current pool, in order; documents whose text
/// (and prompt) is blank are left out. A prompt is tokenized by the student alone.
fn align_batch(pipeline: &Pipeline, batch: RawBatch) -> Result<Vec<StreamedDoc>> {
    let aligned: Vec<Result<Option<StreamedDoc>>> = batch
        .into_par_iter()
        .map_init(Workspace::default, |ws, (cursor, raw, extractor)| {
            let (text, prompt) = extractor.extract(&raw)?;
            let prompt = prompt.filter(|p| !p.trim().is_empty());
            if text.trim().is_empty() && prompt.is_none() {
                return Ok(None);
            }
            let place = || extractor.place(&raw);
            super::pipeline::note_if_long(&text, place);
            let doc = match text.trim().is_empty() {
                true => AlignedText::empty(pipeline.teachers.len()),
                false => pipeline
                    .process(ws, &text)
                    .with_context(|| format!("{}: aligning this document", place()))?,
            };
            let prompt = prompt
                .map(|p| pipeline.student.encode(&p))
                .transpose()
                .with_context(|| format!("{}: tokenizing its prompt", place()))?;
            Ok(Some(StreamedDoc {
                cursor,
                doc,
                prompt,
            }))
        })
        .collect();
    aligned.into_iter().filter_map(Result::transpose).collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::Path;

    use super::*;
    use crate::config::DataFormat;
    use crate::data::sources::Shard;

    /// Writes `n` documents named `{tag}{i}`, one per line: `.txt`, `.jsonl` or `.jsonl.zst`,
    /// with a blank line now and then.
    fn shard(dir: &Path, name: &str, tag: &str, n: usize) -> Shard {
        let path = dir.join(name);
        let mut text = String::new();
        for i in 0..n {
            if name.contains("jsonl") {
                text.push_str(&format!("{{\"text\": \"{tag}{i}\"}}\n"));
            } else {
                text.push_str(&format!("{tag}{i}\n"));
            }
            if i % 97 == 0 {
                text.push('\n');
            }
        }
        let bytes = if name.ends_with(".zst") {
            zstd::encode_all(text.as_bytes(), 3).unwrap()
        } else {
            text.into_bytes()
        };
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        let format = DataFormat::of(&path).unwrap();
        Shard { path, format }
    }

    fn take(stream: &mut DocumentStream, n: usize) -> Vec<(StreamCursor, String)> {
        (0..n)
            .map(|_| {
                let (cursor, raw, extractor) = stream.next_doc().unwrap();
                (cursor, extractor.text(&raw).unwrap())
            })
            .collect()
    }

    #[test]
    fn a_mixture_is_seeded_covers_every_document_and_reopens_at_any_cursor() {
        let dir = std::env::temp_dir().join(format!("xtoken-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let web = Source {
            name: "web".into(),
            shards: vec![
                shard(&dir, "a.jsonl", "a", 1500),
                shard(&dir, "b.jsonl.zst", "b", 700),
            ],
            weight: 3.0,
        };
        let books = Source {
            name: "books".into(),
            shards: vec![shard(&dir, "c.txt", "c", 300)],
            weight: 1.0,
        };
        let sources = vec![web, books];
        let open = |at: Option<&StreamCursor>| {
            DocumentStream::open(sources.clone(), 9, "text", at).unwrap()
        };
        let docs = take(&mut open(None), 3000);
        assert_eq!(
            docs.iter().map(|d| &d.1).collect::<Vec<_>>(),
            take(&mut open(None), 3000)
                .iter()
                .map(|d| &d.1)
                .collect::<Vec<_>>(),
            "the order is a function of the seed"
        );
        let other = DocumentStream::open(sources.clone(), 10, "text", None).unwrap();
        assert_ne!(
            take(&mut { other }, 50)
                .into_iter()
                .map(|d| d.1)
                .collect::<Vec<_>>(),
            docs[..50].iter().map(|d| d.1.clone()).collect::<Vec<_>>()
        );
        // About three web documents per book one.
        let books_drawn = docs.iter().filter(|d| d.1.starts_with('c')).count();
        assert!((600..900).contains(&books_drawn), "{books_drawn}");
        // Each source's first epoch holds each of its documents once.
        let web_docs: Vec<&String> = docs
            .iter()
            .map(|d| &d.1)
            .filter(|t| !t.starts_with('c'))
            .take(2200)
            .collect();
        let mut sorted: Vec<&String> = web_docs.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 2200);
        // Windows are shuffled: the first shard read is not in file order.
        let in_file_order: Vec<String> = (0..10)
            .map(|i| format!("{}{i}", &web_docs[0][..1]))
            .collect();
        assert_ne!(
            web_docs[..10]
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>(),
            in_file_order
        );
        // Reopened at any document's cursor, the stream goes on with that very document.
        for i in [0, 1, 517, 1024, 1777, 2400, 2999] {
            let (cursor, _) = &docs[i];
            let again = take(&mut open(Some(cursor)), (3000 - i).min(40));
            let expected: Vec<&String> = docs[i..].iter().take(40).map(|d| &d.1).collect();
            assert_eq!(
                again.iter().map(|d| &d.1).collect::<Vec<_>>(),
                expected,
                "at {i}"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn batches_start_small_and_double_up_to_a_mebibyte() {
        let sizes: Vec<usize> = batch_sizes().take(9).collect();
        assert_eq!(sizes[0], 8 << 10);
        assert_eq!(sizes[7], 1 << 20);
        assert_eq!(sizes[8], 1 << 20);
        assert!(
            sizes.windows(2).take(7).all(|w| w[1] == 2 * w[0]),
            "{sizes:?}"
        );
        // A batch holds the documents in stream order up to the first that reaches its size.
        let dir = std::env::temp_dir().join(format!("xtoken-batches-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = Source {
            name: "web".into(),
            shards: vec![shard(&dir, "a.jsonl", "a", 5000)],
            weight: 1.0,
        };
        let open = || DocumentStream::open(vec![source.clone()], 3, "text", None).unwrap();
        let batch = read_batch(&mut open(), sizes[0]).unwrap();
        let lengths: Vec<usize> = batch.iter().map(|(_, raw, _)| raw.len()).collect();
        let total: usize = lengths.iter().sum();
        let last = lengths[lengths.len() - 1];
        assert!(
            total >= sizes[0] && total - last < sizes[0],
            "{total} bytes"
        );
        let read: Vec<StreamCursor> = batch.iter().map(|(c, _, _)| c.clone()).collect();
        let expected: Vec<StreamCursor> = take(&mut open(), read.len())
            .into_iter()
            .map(|d| d.0)
            .collect();
        assert_eq!(read, expected);
        std::fs::remove_dir_all(&dir).ok();
    }
}
