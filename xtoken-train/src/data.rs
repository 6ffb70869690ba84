//! The training data: documents read from `.jsonl`, `.parquet` or `.txt`, tokenized and aligned
//! once into the alignment cache (issue 3's format, built by worker threads and reused by every
//! later run), then packed into rows of `context_length` student tokens in a seeded order by a
//! background thread that runs ahead of the training loop.
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

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use xtoken_core::align::{Alignment, Chunk, ChunkKind, Positions};
use xtoken_core::cache::AlignCache;
use xtoken_core::plan::{BatchPlan, ChunkPlan, MergeVariant, PlanItem};

use crate::config::DataFormat;
use crate::rng::SplitMix64;

/// One document as read, before its text is extracted (JSON is parsed by the workers).
pub struct RawDoc {
    /// 1-based line (or row) number, for error messages.
    pub line: usize,
    raw: String,
}

/// Reads the documents of a `.jsonl`, `.txt` or `.parquet` file in batches.
pub struct DocumentReader {
    path: PathBuf,
    format: DataFormat,
    field: String,
    lines: Option<BufReader<File>>,
    rows: Option<parquet::record::reader::RowIter<'static>>,
    line: usize,
    done: u64,
    total: u64,
}

impl DocumentReader {
    /// Opens `path`; `field` is the JSON field or parquet column holding the text.
    pub fn open(path: &Path, format: DataFormat, field: &str) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let mut reader = DocumentReader {
            path: path.to_path_buf(),
            format,
            field: field.to_string(),
            lines: None,
            rows: None,
            line: 0,
            done: 0,
            total: 0,
        };
        match format {
            DataFormat::Jsonl | DataFormat::Txt => {
                reader.total = file.metadata().map(|m| m.len()).unwrap_or(0);
                reader.lines = Some(BufReader::with_capacity(1 << 20, file));
            }
            DataFormat::Parquet => {
                use parquet::file::reader::{FileReader, SerializedFileReader};
                let parquet = SerializedFileReader::new(file).map_err(|e| {
                    anyhow::anyhow!("{}: not a readable parquet file: {e}", path.display())
                })?;
                let metadata = parquet.metadata().file_metadata();
                let columns: Vec<String> = metadata
                    .schema_descr()
                    .root_schema()
                    .get_fields()
                    .iter()
                    .map(|f| f.name().to_string())
                    .collect();
                if !columns.iter().any(|c| c == field) {
                    bail!(
                        "{}: no column `{field}` (columns: {}); set data.text_field",
                        path.display(),
                        columns.join(", ")
                    );
                }
                reader.total = metadata.num_rows().max(0) as u64;
                let rows = parquet::record::reader::RowIter::from_file_into(Box::new(parquet));
                reader.rows = Some(rows);
            }
        }
        Ok(reader)
    }

    /// The size the progress is measured against: bytes for text files, rows for parquet.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Progress so far, in the unit of [`total`](Self::total).
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Whether progress counts bytes (text files) or rows (parquet).
    pub fn counts_bytes(&self) -> bool {
        self.format != DataFormat::Parquet
    }

    /// The next documents, about `max_bytes` of them; empty only at the end of the file. Blank
    /// lines are skipped.
    pub fn next_batch(&mut self, max_bytes: usize) -> Result<Vec<RawDoc>> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while bytes < max_bytes || batch.is_empty() {
            if let Some(lines) = self.lines.as_mut() {
                let mut line = String::new();
                let n = lines.read_line(&mut line).with_context(|| {
                    format!("{}:{}: cannot read", self.path.display(), self.line + 1)
                })?;
                if n == 0 {
                    break;
                }
                self.line += 1;
                self.done += n as u64;
                bytes += n;
                if !line.trim().is_empty() {
                    batch.push(RawDoc {
                        line: self.line,
                        raw: line,
                    });
                }
            } else if let Some(rows) = self.rows.as_mut() {
                let Some(row) = rows.next() else { break };
                self.line += 1;
                self.done += 1;
                let row = row.map_err(|e| {
                    anyhow::anyhow!("{}: row {}: {e}", self.path.display(), self.line)
                })?;
                let text = row
                    .get_column_iter()
                    .find(|(name, _)| *name == &self.field)
                    .map(|(_, value)| value.clone());
                let text = match text {
                    Some(parquet::record::Field::Str(s)) => s,
                    Some(parquet::record::Field::Null) => String::new(),
                    Some(other) => bail!(
                        "{}: row {}: column `{}` is {other:?}, not a string",
                        self.path.display(),
                        self.line,
                        self.field
                    ),
                    None => bail!(
                        "{}: row {}: no column `{}`",
                        self.path.display(),
                        self.line,
                        self.field
                    ),
                };
                bytes += text.len();
                if !text.trim().is_empty() {
                    batch.push(RawDoc {
                        line: self.line,
                        raw: text,
                    });
                }
            } else {
                break;
            }
        }
        Ok(batch)
    }

    /// What turns a read document into its text (shareable with worker threads).
    pub fn extractor(&self) -> TextExtractor {
        TextExtractor {
            path: self.path.clone(),
            format: self.format,
            field: self.field.clone(),
        }
    }
}

/// Extracts the text of documents read by a [`DocumentReader`].
#[derive(Debug, Clone)]
pub struct TextExtractor {
    path: PathBuf,
    format: DataFormat,
    field: String,
}

impl TextExtractor {
    /// The text of a document, with errors naming the file and line.
    pub fn text(&self, doc: &RawDoc) -> Result<String> {
        let where_ = || format!("{}:{}", self.path.display(), doc.line);
        match self.format {
            DataFormat::Txt => Ok(doc.raw.trim_end_matches(['\n', '\r']).to_string()),
            DataFormat::Parquet => Ok(doc.raw.clone()),
            DataFormat::Jsonl => {
                let value: Value = serde_json::from_str(&doc.raw)
                    .with_context(|| format!("{}: invalid JSON", where_()))?;
                match value.get(&self.field) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(other) => bail!(
                        "{}: field `{}` is {}, not a string",
                        where_(),
                        self.field,
                        kind_of(other)
                    ),
                    None => bail!("{}: no field `{}`", where_(), self.field),
                }
            }
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Where the loader stands: the next row starts at student position `offset` of the
/// `position`-th document of epoch `epoch`'s order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    pub epoch: u64,
    pub position: u64,
    pub offset: u32,
}

/// One packed row: student ids and, per teacher, its ids and the alignment of the two.
#[derive(Debug, Clone)]
pub struct PackedRow {
    pub student_ids: Vec<u32>,
    pub teachers: Vec<(Vec<u32>, Alignment)>,
}

/// A document's ids and alignments, with the positions where it may be cut.
struct DocView {
    student_ids: Vec<u32>,
    teachers: Vec<(Vec<u32>, Vec<Chunk>)>,
    /// Student positions where no teacher's chunk straddles, with each teacher's position
    /// there; ascending, starting with 0 and ending with the document's length.
    cuts: Vec<(u32, Vec<u32>)>,
}

impl DocView {
    fn new(cache: &AlignCache, doc: usize) -> Result<Self> {
        let cached = cache.doc(doc)?;
        let student_ids = cached.student_ids.to_vec();
        let teachers: Vec<(Vec<u32>, Vec<Chunk>)> = cached
            .teachers
            .iter()
            .map(|t| (t.ids.to_vec(), t.alignment().chunks))
            .collect();
        // Per teacher: student position → teacher position at every chunk boundary (a
        // teacher-only gap at a boundary stays with the chunks before it).
        let boundaries: Vec<std::collections::HashMap<u32, u32>> = teachers
            .iter()
            .map(|(_, chunks)| {
                let mut map = std::collections::HashMap::new();
                map.insert(0, 0);
                for c in chunks {
                    map.insert(
                        c.student.start + c.student.len,
                        c.teacher.start + c.teacher.len,
                    );
                }
                if let Some(first) = chunks.first() {
                    if first.student.len == 0 {
                        map.insert(0, first.teacher.len);
                    }
                }
                map
            })
            .collect();
        let mut cuts: Vec<(u32, Vec<u32>)> = Vec::new();
        let mut positions: Vec<u32> = boundaries
            .first()
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        positions.sort_unstable();
        for p in positions {
            let at: Option<Vec<u32>> = boundaries.iter().map(|m| m.get(&p).copied()).collect();
            if let Some(at) = at {
                cuts.push((p, at));
            }
        }
        // A cut at 0 starts at each teacher's position 0 (leading teacher-only gaps included).
        if let Some(first) = cuts.first_mut() {
            if first.0 == 0 {
                first.1.iter_mut().for_each(|q| *q = 0);
            }
        }
        Ok(DocView {
            student_ids,
            teachers,
            cuts,
        })
    }

    fn len(&self) -> u32 {
        self.student_ids.len() as u32
    }

    /// The teacher positions at student position `p`: exact at a cut, else (a forced cut) the
    /// start of the chunk that straddles `p`.
    fn teacher_positions(&self, p: u32) -> Vec<u32> {
        if let Ok(i) = self.cuts.binary_search_by_key(&p, |c| c.0) {
            return self.cuts[i].1.clone();
        }
        self.teachers
            .iter()
            .map(|(ids, chunks)| {
                chunks
                    .iter()
                    .find(|c| c.student.start + c.student.len > p)
                    .map_or(ids.len() as u32, |c| c.teacher.start)
            })
            .collect()
    }

    /// Appends student positions `[a, b)` (and the matching teacher spans) to `row`.
    fn append_to(&self, row: &mut PackedRow, a: u32, b: u32) {
        let (from, to) = (self.teacher_positions(a), self.teacher_positions(b));
        let student_offset = row.student_ids.len() as u32;
        row.student_ids
            .extend_from_slice(&self.student_ids[a as usize..b as usize]);
        for (m, (ids, chunks)) in self.teachers.iter().enumerate() {
            let (ta, tb) = (from[m], to[m].max(from[m]));
            let (out_ids, out) = &mut row.teachers[m];
            let teacher_offset = out_ids.len() as u32;
            out_ids.extend_from_slice(&ids[ta as usize..tb as usize]);
            for c in chunks {
                let inside = c.student.start >= a
                    && c.student.start + c.student.len <= b
                    && c.teacher.start >= ta
                    && c.teacher.start + c.teacher.len <= tb;
                if inside && c.kind != ChunkKind::Gap {
                    out.chunks.push(Chunk {
                        student: Positions {
                            start: c.student.start - a + student_offset,
                            len: c.student.len,
                        },
                        teacher: Positions {
                            start: c.teacher.start - ta + teacher_offset,
                            len: c.teacher.len,
                        },
                        kind: c.kind,
                    });
                }
            }
            out.student_len = row.student_ids.len() as u32;
            out.teacher_len = out_ids.len() as u32;
        }
    }
}

/// Epoch `epoch`'s document order.
fn epoch_order(docs: usize, seed: u64, epoch: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..docs as u32).collect();
    let mut rng = SplitMix64(seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03));
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// Packs documents into rows of at most `context` student tokens, deterministically.
pub struct Packer {
    cache: Arc<AlignCache>,
    seed: u64,
    context: u32,
    teachers: usize,
    state: LoaderState,
    order: Vec<u32>,
    current: Option<(u64, DocView)>,
}

impl Packer {
    /// A packer positioned at `state`.
    pub fn new(
        cache: Arc<AlignCache>,
        seed: u64,
        context: usize,
        state: LoaderState,
    ) -> Result<Self> {
        if cache.is_empty() {
            bail!(
                "the training data has no documents (the cache {} is empty)",
                cache.metadata().source.display()
            );
        }
        let teachers = cache.metadata().teachers.len();
        let order = epoch_order(cache.len(), seed, state.epoch);
        Ok(Packer {
            cache,
            seed,
            context: context as u32,
            teachers,
            state,
            order,
            current: None,
        })
    }

    /// The state before the next row.
    pub fn state(&self) -> LoaderState {
        self.state
    }

    fn advance_document(&mut self) {
        self.state.position += 1;
        self.state.offset = 0;
        if self.state.position as usize >= self.order.len() {
            self.state.epoch += 1;
            self.state.position = 0;
            self.order = epoch_order(self.cache.len(), self.seed, self.state.epoch);
        }
    }

    fn view(&mut self) -> Result<&DocView> {
        let key = self.state.epoch * self.order.len() as u64 + self.state.position;
        if self.current.as_ref().map(|c| c.0) != Some(key) {
            let doc = self.order[self.state.position as usize] as usize;
            self.current = Some((key, DocView::new(&self.cache, doc)?));
        }
        Ok(&self.current.as_ref().expect("just set").1)
    }

    /// The next row.
    pub fn next_row(&mut self) -> Result<PackedRow> {
        let mut row = PackedRow {
            student_ids: Vec::new(),
            teachers: vec![
                (
                    Vec::new(),
                    Alignment {
                        chunks: Vec::new(),
                        student_len: 0,
                        teacher_len: 0,
                        score: f64::NAN,
                        band_bytes: 0,
                        band_edge_reached: false,
                    },
                );
                self.teachers
            ],
        };
        let mut empty_documents = 0usize;
        loop {
            let room = self.context - row.student_ids.len() as u32;
            if room == 0 {
                return Ok(row);
            }
            let offset = self.state.offset;
            let view = self.view()?;
            let len = view.len();
            if len <= offset {
                empty_documents += 1;
                if empty_documents > self.order.len() {
                    bail!("every document of the training data is empty");
                }
                self.advance_document();
                continue;
            }
            let limit = offset + room;
            if len <= limit {
                view.append_to(&mut row, offset, len);
                self.advance_document();
                continue;
            }
            // The largest clean cut that fits.
            let cut = view
                .cuts
                .iter()
                .rev()
                .map(|c| c.0)
                .find(|&p| p > offset && p <= limit);
            let cut = match cut {
                Some(p) => p,
                None if !row.student_ids.is_empty() => return Ok(row),
                None => limit,
            };
            view.append_to(&mut row, offset, cut);
            self.state.offset = cut;
        }
    }
}

/// One forward/backward pass's inputs, laid out for the models and the losses.
pub struct MicroBatch {
    /// Rows in this micro-batch.
    pub rows: usize,
    /// Student ids `[rows, student_len]`, right-padded with 0.
    pub student_ids: Vec<i64>,
    pub student_len: usize,
    /// `true` on padded student positions; `None` when no row is padded.
    pub student_padding: Option<Vec<bool>>,
    /// Per teacher: ids, length, padding and the batch plan against the student.
    pub teachers: Vec<TeacherBatch>,
    /// Real (unpadded) student tokens.
    pub tokens: usize,
}

/// One teacher's side of a micro-batch.
pub struct TeacherBatch {
    pub ids: Vec<i64>,
    pub len: usize,
    pub padding: Option<Vec<bool>>,
    pub plan: BatchPlan,
}

/// The micro-batches of one optimizer step on this worker, and the loader state after it.
pub struct StepBatch {
    pub micro: Vec<MicroBatch>,
    pub state_after: LoaderState,
}

fn pad(rows: &[&[u32]]) -> (Vec<i64>, usize, Option<Vec<bool>>) {
    let len = rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
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

/// Lays out rows as a micro-batch.
pub fn micro_batch(rows: &[PackedRow], variant: MergeVariant) -> Result<MicroBatch> {
    let student: Vec<&[u32]> = rows.iter().map(|r| r.student_ids.as_slice()).collect();
    let (student_ids, student_len, student_padding) = pad(&student);
    let teachers = rows.first().map_or(0, |r| r.teachers.len());
    let mut out = Vec::with_capacity(teachers);
    for m in 0..teachers {
        let plans: Vec<ChunkPlan> = rows
            .iter()
            .map(|r| ChunkPlan::new(&r.teachers[m].1))
            .collect();
        let teacher: Vec<&[u32]> = rows.iter().map(|r| r.teachers[m].0.as_slice()).collect();
        let (ids, len, padding) = pad(&teacher);
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
        });
    }
    Ok(MicroBatch {
        rows: rows.len(),
        student_ids,
        student_len,
        student_padding,
        teachers: out,
        tokens: student.iter().map(|r| r.len()).sum(),
    })
}

/// How the loader splits each global batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchShape {
    /// Rows per optimizer step over all workers.
    pub global: usize,
    /// Rows per micro-batch.
    pub micro: usize,
    /// Workers, and which one this is (rows `rank, rank + workers, …` of a batch are its own).
    pub workers: usize,
    pub rank: usize,
}

/// Assembles step batches on a background thread, `prefetch` ahead of the training loop.
pub struct Loader {
    receiver: Receiver<Result<StepBatch>>,
    handle: Option<JoinHandle<()>>,
}

impl Loader {
    /// Starts at `state`.
    pub fn start(
        mut packer: Packer,
        shape: BatchShape,
        variant: MergeVariant,
        prefetch: usize,
    ) -> Self {
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
                        state_after: packer.state(),
                    })
                })();
                let failed = step.is_err();
                if sender.send(step).is_err() || failed {
                    return;
                }
            })
            .expect("spawning the data loader thread");
        Loader {
            receiver,
            handle: Some(handle),
        }
    }

    /// The next step's batch.
    pub fn next(&mut self) -> Result<StepBatch> {
        match self.receiver.recv() {
            Ok(step) => step,
            Err(_) => bail!("the data loader stopped"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use xtoken_core::cache::{encode_record, CacheMetadata, CacheWriter, TokenizerRecord};

    /// The teacher spelling of a student id: odd ids split in two, as a digit-splitting
    /// teacher splits a packed numeral.
    fn spell(s: u32) -> Vec<u32> {
        if s % 2 == 0 {
            vec![s]
        } else {
            vec![s, s + 1000]
        }
    }

    /// A cache of `docs` documents of varied lengths, each aligned chunk by chunk, with a
    /// teacher-only gap (id 9999) after every seventh token.
    fn cache(dir: &Path, docs: usize) -> (AlignCache, Vec<Vec<u32>>) {
        let record = |name: &str| TokenizerRecord {
            path: PathBuf::from(name),
            sha256: String::new(),
            size: 20_000,
        };
        let path = dir.join("docs.xtc");
        let mut writer = CacheWriter::create(
            &path,
            CacheMetadata {
                student: record("student"),
                teachers: vec![record("teacher")],
                params: Default::default(),
                source: PathBuf::from("docs.jsonl"),
                text_field: "text".into(),
                student_tokens: 0,
                created_by: "test".into(),
            },
        )
        .unwrap();
        let mut all = Vec::new();
        for d in 0..docs {
            let student: Vec<u32> = (0..(d * 5 % 17) as u32).map(|i| i * 3 + d as u32).collect();
            let (mut teacher, mut chunks) = (Vec::new(), Vec::new());
            for (p, &s) in student.iter().enumerate() {
                let t = spell(s);
                chunks.push(Chunk {
                    student: Positions {
                        start: p as u32,
                        len: 1,
                    },
                    teacher: Positions {
                        start: teacher.len() as u32,
                        len: t.len() as u32,
                    },
                    kind: ChunkKind::from_lengths(1, t.len() as u32),
                });
                teacher.extend(t);
                if p % 7 == 6 {
                    chunks.push(Chunk {
                        student: Positions {
                            start: p as u32 + 1,
                            len: 0,
                        },
                        teacher: Positions {
                            start: teacher.len() as u32,
                            len: 1,
                        },
                        kind: ChunkKind::Gap,
                    });
                    teacher.push(9999);
                }
            }
            let alignment = Alignment {
                chunks,
                student_len: student.len() as u32,
                teacher_len: teacher.len() as u32,
                score: 0.0,
                band_bytes: 16,
                band_edge_reached: false,
            };
            let bytes = encode_record(&student, &[(&teacher, &alignment)]).unwrap();
            writer.push(&bytes, student.len()).unwrap();
            all.push(student);
        }
        writer.finish().unwrap();
        (AlignCache::open(&path).unwrap(), all)
    }

    #[test]
    fn packing_keeps_every_token_and_chunk_and_resumes_exactly() {
        let dir = std::env::temp_dir().join(format!("xtoken-packing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cache, docs) = cache(&dir, 30);
        let cache = Arc::new(cache);
        let context = 9;
        let mut packer = Packer::new(cache.clone(), 5, context, LoaderState::default()).unwrap();
        let mut rows = Vec::new();
        let mut states = Vec::new();
        while packer.state().epoch == 0 {
            states.push(packer.state());
            rows.push(packer.next_row().unwrap());
        }
        // Epoch 0 is every document once, in the seeded order, cut into rows of ≤ context; the
        // row that ends it is filled from epoch 1's order.
        let order = epoch_order(docs.len(), 5, 0);
        let next = epoch_order(docs.len(), 5, 1);
        let expected: Vec<u32> = order
            .iter()
            .flat_map(|&d| docs[d as usize].clone())
            .collect();
        let packed: Vec<u32> = rows.iter().flat_map(|r| r.student_ids.clone()).collect();
        assert_eq!(packed[..expected.len()], expected[..]);
        let spill = &packed[expected.len()..];
        assert!(spill.len() < context);
        let following: Vec<u32> = next
            .iter()
            .flat_map(|&d| docs[d as usize].clone())
            .collect();
        assert_eq!(spill, &following[..spill.len()]);
        for row in &rows {
            assert!(row.student_ids.len() <= context);
            let (teacher, alignment) = &row.teachers[0];
            assert_eq!(alignment.student_len as usize, row.student_ids.len());
            assert_eq!(alignment.teacher_len as usize, teacher.len());
            // Every token is a one-token chunk here, so every chunk survives the cuts…
            assert_eq!(alignment.chunks.len(), row.student_ids.len());
            // …and pairs a student token with its own spelling.
            for c in &alignment.chunks {
                let s = row.student_ids[c.student.start as usize];
                let t = &teacher[c.teacher.range()];
                assert_eq!(t, spell(s).as_slice());
            }
        }
        // Starting from any saved state gives the same rows.
        for (i, &state) in states.iter().enumerate().step_by(3) {
            let mut resumed = Packer::new(cache.clone(), 5, context, state).unwrap();
            for row in &rows[i..(i + 3).min(rows.len())] {
                assert_eq!(resumed.next_row().unwrap().student_ids, row.student_ids);
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn micro_batches_pad_and_plan_every_row() {
        let dir = std::env::temp_dir().join(format!("xtoken-micro-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cache, _) = cache(&dir, 12);
        let mut packer = Packer::new(Arc::new(cache), 1, 16, LoaderState::default()).unwrap();
        let rows: Vec<PackedRow> = (0..3).map(|_| packer.next_row().unwrap()).collect();
        let batch = micro_batch(&rows, MergeVariant::FirstToken).unwrap();
        assert_eq!(batch.rows, 3);
        assert_eq!(
            batch.tokens,
            rows.iter().map(|r| r.student_ids.len()).sum::<usize>()
        );
        let plan = &batch.teachers[0].plan;
        assert_eq!((plan.batch, plan.student_len), (3, batch.student_len));
        assert_eq!(plan.teacher_len, batch.teachers[0].len);
        // Every chunk but one starting a row at position 0 is compared.
        let chunks: usize = rows.iter().map(|r| r.teachers[0].1.chunks.len()).sum();
        assert!(plan.valid_chunks() >= chunks - 3 && plan.valid_chunks() <= chunks);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn epoch_orders_are_seeded_permutations() {
        let a = epoch_order(100, 7, 0);
        assert_eq!(a, epoch_order(100, 7, 0));
        assert_ne!(a, epoch_order(100, 7, 1));
        assert_ne!(a, epoch_order(100, 8, 0));
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<u32>>());
    }
}
