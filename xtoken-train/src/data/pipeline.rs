//! Tokenizing and aligning: every text is encoded by the student and each teacher and aligned
//! (the paper's DP span alignment), one document per worker thread; a data file becomes the
//! alignment cache that training packs from.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use xtoken_core::align::{AlignParams, Aligner, Alignment, Workspace};
use xtoken_core::cache::{encode_record, AlignCache, CacheMetadata, CacheWriter, TokenizerRecord};
use xtoken_core::temporary::Temporary;
use xtoken_core::vocab::Vocabulary;

use super::reader::{DocumentReader, RawDoc, TextExtractor};
use crate::config::{DataFormat, RunConfig};
use crate::error::{Context, Error, Result};

/// Everything needed to turn a text into ids and alignments for every teacher.
pub struct Pipeline {
    /// The student tokenizer.
    pub student: Vocabulary,
    /// The teacher tokenizers.
    pub teachers: Vec<Vocabulary>,
    /// One aligner per teacher.
    pub aligners: Vec<Aligner>,
}

/// Where a document's stretch lies in a packed row: teacher positions `at..at + len` of the
/// row are positions `from..from + len` of the document whose key is `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeacherSpan {
    /// First position in the row.
    pub at: u32,
    /// Positions.
    pub len: u32,
    /// The document's key ([`doc_key`] of its teacher ids).
    pub key: u64,
    /// First position in the document.
    pub from: u32,
}

/// The key a stored teacher pass finds a document by: xxh3-64 of its teacher ids.
pub fn doc_key(ids: &[u32]) -> u64 {
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// A text's student ids and, per teacher, its ids and their alignment: one document as
/// [`Pipeline::process`] returns it, or one packed row as the [`Packer`](super::Packer) makes
/// it.
#[derive(Debug, Clone)]
pub struct AlignedText {
    /// Student ids.
    pub student_ids: Vec<u32>,
    /// Per teacher: ids and alignment.
    pub teachers: Vec<(Vec<u32>, Alignment)>,
    /// Per teacher, for a document just aligned: whether that tokenizer spelled another text than
    /// the student's (a normalizer changed it, as Qwen3's NFC does to decomposed accents), so its
    /// chunks were paired by bytes alone and not checked in place. Empty when not known (rows
    /// packed from a cache).
    pub respelled: Vec<bool>,
    /// Per teacher, for a packed row: the documents' stretches in it, in order, which stored
    /// teacher targets are found by. Empty for a text just aligned.
    pub spans: Vec<Vec<TeacherSpan>>,
}

impl Pipeline {
    /// Loads the tokenizers (in parallel) and indexes every pair.
    pub fn load(student: &Path, teachers: &[PathBuf], params: AlignParams) -> Result<Self> {
        params.validate()?;
        let (student, teachers) = load_tokenizers(student, teachers)?;
        let aligners = teachers
            .iter()
            .map(|t| Aligner::new(&student, t, params))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Pipeline {
            student,
            teachers,
            aligners,
        })
    }

    /// Tokenizes `text` with every tokenizer (default encoding, special tokens included) and
    /// aligns each teacher with the student. A text longer than [`PIECE_BYTES`] is cut into
    /// pieces at whitespace, the same bytes for every tokenizer, each tokenized (the first with
    /// its special tokens, the others as running text) and aligned on its own, and the pieces
    /// joined: the DP over a whole very long document would need more memory than one alignment
    /// may use.
    pub fn process(&self, ws: &mut Workspace, text: &str) -> Result<AlignedText> {
        let mut pieces = pieces(text, PIECE_BYTES).into_iter();
        let first = pieces.next().unwrap_or(text);
        let mut whole = self.process_piece(ws, first, true)?;
        for piece in pieces {
            whole.append(self.process_piece(ws, piece, false)?);
        }
        Ok(whole)
    }

    fn process_piece(&self, ws: &mut Workspace, text: &str, first: bool) -> Result<AlignedText> {
        let encode = |vocab: &Vocabulary| encode_piece(vocab, text, first);
        let student_ids = encode(&self.student)?;
        let mut teachers = Vec::with_capacity(self.teachers.len());
        let mut respelled = Vec::with_capacity(self.teachers.len());
        for (vocab, aligner) in self.teachers.iter().zip(&self.aligners) {
            let ids = encode(vocab)?;
            let alignment = aligner.align_with(ws, &student_ids, &ids)?;
            teachers.push((ids, alignment));
            respelled.push(!ws.same_text());
        }
        Ok(AlignedText {
            student_ids,
            teachers,
            respelled,
            spans: Vec::new(),
        })
    }
}

/// A piece of a text tokenized as [`Pipeline::process`] does: the first with its special
/// tokens, the others as running text.
fn encode_piece(vocab: &Vocabulary, text: &str, first: bool) -> Result<Vec<u32>> {
    Ok(match first {
        true => vocab.encode(text)?,
        false => vocab.encode_pieces(&[text])?.swap_remove(0),
    })
}

/// A text's ids under `vocab`, exactly as [`Pipeline::process`] tokenizes each side of it.
pub fn encode_text(vocab: &Vocabulary, text: &str) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for (i, piece) in pieces(text, PIECE_BYTES).into_iter().enumerate() {
        ids.extend(encode_piece(vocab, piece, i == 0)?);
    }
    Ok(ids)
}

/// The longest text aligned in one DP (see [`Pipeline::process`]).
pub const PIECE_BYTES: usize = 1 << 20;

/// Notes a text longer than a piece before it is aligned (`place`: where it is), so that an
/// out-of-memory ending can name the longest ([`crate::machine::longest_document`]).
pub(crate) fn note_if_long(text: &str, place: impl FnOnce() -> String) {
    if text.len() > PIECE_BYTES {
        crate::machine::note_long_document(place, text.len());
    }
}

/// `text` cut into pieces of at most about `max` bytes, each ending before a whitespace
/// character (after a sentence's end where one lies in the piece's last quarter); a stretch
/// with no whitespace at all is cut at a character boundary.
pub fn pieces(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while rest.len() > max {
        let mut end = max;
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let window = &rest[..end];
        let sentence = window[end * 3 / 4..]
            .rfind(['.', '!', '?', '\n'])
            .map(|i| end * 3 / 4 + i + 1)
            .filter(|&i| rest[i..].starts_with(char::is_whitespace));
        let space = window
            .char_indices()
            .rev()
            .find(|&(i, c)| i > 0 && c.is_whitespace())
            .map(|(i, _)| i);
        let cut = sentence.or(space).unwrap_or(end);
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out.push(rest);
    out
}

impl AlignedText {
    /// No text: no ids, and for each of `teachers` teachers an alignment of nothing.
    pub fn empty(teachers: usize) -> Self {
        let nothing = Alignment {
            chunks: Vec::new(),
            student_len: 0,
            teacher_len: 0,
            score: f64::NAN,
            band_bytes: 0,
            band_edge_reached: false,
        };
        AlignedText {
            student_ids: Vec::new(),
            teachers: vec![(Vec::new(), nothing); teachers],
            respelled: Vec::new(),
            spans: vec![Vec::new(); teachers],
        }
    }

    /// Appends the next piece of the same document: its ids after these, its chunks' positions
    /// shifted past these.
    pub fn append(&mut self, next: AlignedText) {
        let shift = self.student_ids.len() as u32;
        self.student_ids.extend(next.student_ids);
        for ((ids, a), (more, b)) in self.teachers.iter_mut().zip(next.teachers) {
            let teacher_shift = ids.len() as u32;
            ids.extend(more);
            a.chunks.extend(b.chunks.into_iter().map(|mut c| {
                c.student.start += shift;
                c.teacher.start += teacher_shift;
                c
            }));
            a.student_len += b.student_len;
            a.teacher_len += b.teacher_len;
            a.score += b.score;
            a.band_bytes = a.band_bytes.max(b.band_bytes);
            a.band_edge_reached |= b.band_edge_reached;
        }
        for (r, more) in self.respelled.iter_mut().zip(next.respelled) {
            *r |= more;
        }
    }

    /// The cache record of this document.
    pub fn record(&self) -> Result<Vec<u8>> {
        let teachers: Vec<(&[u32], &Alignment)> = self
            .teachers
            .iter()
            .map(|(ids, a)| (ids.as_slice(), a))
            .collect();
        Ok(encode_record(&self.student_ids, &teachers)?)
    }

    /// `{"student_ids", "teacher_ids", "chunks"}` for one teacher; with several, the teachers'
    /// `{"teacher_ids", "chunks"}` in a `"teachers"` array.
    pub fn to_json(&self) -> Value {
        let teacher = |(ids, a): &(Vec<u32>, Alignment)| {
            let chunks: Vec<Value> = a
                .chunks
                .iter()
                .map(|c| {
                    let s: Vec<usize> = c.student.range().collect();
                    let t: Vec<usize> = c.teacher.range().collect();
                    json!([s, t])
                })
                .collect();
            json!({"teacher_ids": ids, "chunks": chunks})
        };
        if let [only] = self.teachers.as_slice() {
            let mut object = teacher(only);
            object["student_ids"] = json!(self.student_ids);
            return object;
        }
        json!({
            "student_ids": self.student_ids,
            "teachers": self.teachers.iter().map(teacher).collect::<Vec<_>>(),
        })
    }
}

/// Per-teacher counts of a file job.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Student positions in two-sided chunks.
    pub student_aligned: u64,
    /// Teacher positions in two-sided chunks.
    pub teacher_aligned: u64,
    /// Teacher tokens.
    pub teacher_tokens: u64,
    /// Documents whose DP band had to be widened.
    pub widened: u64,
    /// Documents this teacher's tokenizer spelled differently from the student's (see
    /// [`AlignedText::respelled`]).
    pub respelled: u64,
}

impl Tally {
    /// Counts one document's alignment against this teacher; `band` is the band it started
    /// with, so a wider one means the DP widened it.
    fn add(&mut self, teacher_ids: &[u32], alignment: &Alignment, band: u32, respelled: bool) {
        let (s, t) = alignment.aligned_positions();
        self.student_aligned += s as u64;
        self.teacher_aligned += t as u64;
        self.teacher_tokens += teacher_ids.len() as u64;
        self.widened += u64::from(alignment.band_bytes != band);
        self.respelled += u64::from(respelled);
    }
}

/// How often [`align_file`] logs its progress when it draws no bar.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// What [`align_file`] reads, writes and how.
pub struct FileJob<'a> {
    /// The input file.
    pub input: &'a Path,
    /// Its format.
    pub format: DataFormat,
    /// Where to write the cache, if anywhere.
    pub out: Option<&'a Path>,
    /// The field holding the text.
    pub text_field: &'a str,
    /// Worker threads.
    pub threads: usize,
    /// The alignment parameters (recorded in the cache).
    pub params: AlignParams,
    /// Whether to draw a progress bar (on a terminal).
    pub progress: bool,
}

/// Totals of a file job.
pub struct FileStats {
    /// Documents aligned.
    pub docs: u64,
    /// Student tokens over all documents.
    pub student_tokens: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Per teacher.
    pub teachers: Vec<Tally>,
}

/// Reads the documents of a data file in batches, processes each batch on all cores, and writes
/// the results in input order: cache records to `job.out`, and one JSON object per document
/// ([`AlignedText::to_json`]) to `json` when given.
pub fn align_file(
    pipeline: &Pipeline,
    job: &FileJob<'_>,
    mut json: Option<&mut dyn Write>,
) -> Result<FileStats> {
    let start = Instant::now();
    let mut reader = DocumentReader::open(job.input, job.format, job.text_field)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(job.threads)
        .build()
        .map_err(|e| Error::Run(format!("starting worker threads: {e}")))?;
    let mut writer = cache_writer(pipeline, job)?;
    let progress = file_progress(&reader, job);
    let mut tallies = vec![Tally::default(); pipeline.teachers.len()];
    let (mut docs, mut student_tokens) = (0u64, 0u64);
    let mut last_line = Instant::now();
    loop {
        // A batch of about 4 MiB of text keeps every core busy and memory small.
        let batch = reader.next_batch(4 << 20)?;
        progress.set_position(reader.done());
        let extractor = reader.extractor();
        let results = pool.install(|| align_batch(pipeline, job, &extractor, &batch));
        for result in results {
            let Some((doc, record)) = result? else {
                continue;
            };
            docs += 1;
            student_tokens += doc.student_ids.len() as u64;
            for (t, (tally, (ids, a))) in tallies.iter_mut().zip(&doc.teachers).enumerate() {
                let respelled = doc.respelled.get(t).copied().unwrap_or(false);
                tally.add(ids, a, job.params.band_bytes, respelled);
            }
            if let (Some(w), Some(record)) = (writer.as_mut(), record) {
                w.push(&record, doc.student_ids.len())?;
            }
            if let Some(out) = json.as_mut() {
                writeln!(out, "{}", doc.to_json())?;
            }
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        let rate = format!(
            "{docs} docs · {:.0}k student tok/s",
            student_tokens as f64 / secs / 1e3
        );
        // Off a terminal (no bar), a line every PROGRESS_EVERY when a cache is written.
        if !job.progress && job.out.is_some() && last_line.elapsed() >= PROGRESS_EVERY {
            last_line = Instant::now();
            let share = 100.0 * reader.done() as f64 / reader.total().max(1) as f64;
            tracing::info!("{}: {share:.1} % · {rate}", job.input.display());
        }
        progress.set_message(rate);
        if batch.is_empty() {
            break;
        }
    }
    if let Some(out) = json.as_mut() {
        out.flush()?;
    }
    progress.finish_and_clear();
    if let Some(w) = writer {
        w.finish()?;
    }
    Ok(FileStats {
        docs,
        student_tokens,
        seconds: start.elapsed().as_secs_f64(),
        teachers: tallies,
    })
}

/// The cache writer of a job that writes one, recording what the cache is made from.
fn cache_writer(pipeline: &Pipeline, job: &FileJob<'_>) -> Result<Option<CacheWriter>> {
    let Some(out) = job.out else { return Ok(None) };
    let metadata = CacheMetadata {
        student: TokenizerRecord::of(&pipeline.student),
        teachers: pipeline.teachers.iter().map(TokenizerRecord::of).collect(),
        params: job.params,
        source: job.input.to_path_buf(),
        text_field: job.text_field.to_string(),
        student_tokens: 0,
        created_by: format!("xtoken {}", env!("CARGO_PKG_VERSION")),
    };
    Ok(Some(CacheWriter::create(out, metadata)?))
}

/// A progress bar over the file's bytes (text) or rows (parquet), drawn when a cache is
/// written and `job.progress` asks for it.
fn file_progress(reader: &DocumentReader, job: &FileJob<'_>) -> ProgressBar {
    if !(job.progress && job.out.is_some()) {
        return ProgressBar::hidden();
    }
    let template = if reader.counts_bytes() {
        "{bar:30} {percent:>3}% {binary_bytes}/{binary_total_bytes} · {msg} · ETA {eta}"
    } else {
        "{bar:30} {percent:>3}% {pos}/{len} rows · {msg} · ETA {eta}"
    };
    ProgressBar::new(reader.total()).with_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// One aligned document and, when the job writes a cache, its record.
type AlignedDoc = (AlignedText, Option<Vec<u8>>);

/// Tokenizes and aligns a batch of documents on the current thread pool, in input order, with
/// each document's cache record when the job writes a cache; `None` for an empty text (skipped).
fn align_batch(
    pipeline: &Pipeline,
    job: &FileJob<'_>,
    extractor: &TextExtractor,
    batch: &[RawDoc],
) -> Vec<Result<Option<AlignedDoc>>> {
    batch
        .par_iter()
        .map_init(Workspace::default, |ws, raw| {
            let text = extractor.text(raw)?;
            if text.trim().is_empty() {
                return Ok(None);
            }
            let place = || format!("{}:{}", job.input.display(), raw.line);
            note_if_long(&text, place);
            let doc = pipeline
                .process(ws, &text)
                .with_context(|| format!("{}: aligning this document", place()))?;
            let record = match job.out {
                Some(_) => Some(doc.record()?),
                None => None,
            };
            Ok(Some((doc, record)))
        })
        .collect()
}

/// Loads the student and every teacher tokenizer, one thread each.
pub fn load_tokenizers(
    student: &Path,
    teachers: &[PathBuf],
) -> Result<(Vocabulary, Vec<Vocabulary>)> {
    let (student, teachers) = std::thread::scope(|scope| {
        let handles: Vec<_> = teachers
            .iter()
            .map(|t| scope.spawn(move || Vocabulary::load(t)))
            .collect();
        let student = Vocabulary::load(student);
        let teachers: Result<Vec<_>, _> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        (student, teachers)
    });
    Ok((student?, teachers?))
}

/// Documents of an existing cache checked before training (each document is checked again when
/// read).
const SAMPLED_DOCUMENTS: usize = 64;

/// The alignment cache of a run's training data (`data.cache`): opened (and checked against the
/// tokenizers, the source and the alignment settings) when it exists, else built by all cores
/// (or `data.workers` threads) under a temporary name and renamed into place.
pub fn open_or_build_cache(
    config: &RunConfig,
    pipeline: &Pipeline,
    progress: bool,
) -> Result<AlignCache> {
    let path = config
        .cache_path()
        .ok_or_else(|| Error::Config("data.cache: not set".into()))?;
    let input = config.data.path.entries()[0].clone();
    let teachers: Vec<&Vocabulary> = pipeline.teachers.iter().collect();
    if path.exists() {
        let cache = AlignCache::open_verified(&path, &pipeline.student, &teachers)
            .and_then(|cache| cache.verify_sample(SAMPLED_DOCUMENTS).map(|_| cache))
            .with_context(|| format!("{} (delete it to rebuild)", path.display()))?;
        let meta = cache.metadata();
        if meta.source != input || meta.params != config.align_params() {
            return Err(Error::Data(format!(
                "{}: made from {} with other alignment settings or data than data.path = {}; delete it or set data.cache",
                path.display(),
                meta.source.display(),
                input.display()
            )));
        }
        return Ok(cache);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("{}", parent.display()))?;
    }
    let threads = config.data_threads();
    tracing::info!(
        "tokenizing and aligning {} with {threads} threads into {}",
        input.display(),
        path.display()
    );
    // Written under a name of this process's own, then renamed: several processes may build the
    // same cache at once. The guard removes it when the job fails or cannot rename it.
    let partial = Temporary::beside(&path, "partial");
    let job = FileJob {
        input: &input,
        format: config.data_format()?,
        out: Some(partial.path()),
        text_field: &config.data.text_field,
        threads,
        params: config.align_params(),
        progress,
    };
    let stats = align_file(pipeline, &job, None)?;
    let shown = partial.path().display().to_string();
    partial
        .persist(&path)
        .with_context(|| format!("renaming {shown} into place"))?;
    tracing::info!(
        "  {} documents, {} student tokens in {:.1} s",
        stats.docs,
        stats.student_tokens,
        stats.seconds
    );
    Ok(AlignCache::open(&path)?)
}

#[cfg(test)]
mod piece_tests {
    use super::pieces;

    #[test]
    fn pieces_join_to_the_text_and_end_before_whitespace() {
        let text = "One sentence here. Another one follows! ".repeat(50) + &"x".repeat(300);
        let parts = pieces(&text, 128);
        assert_eq!(parts.concat(), text);
        for part in &parts[..parts.len() - 1] {
            assert!(part.len() <= 128, "{part:?}");
        }
        // Cut before a whitespace: every later piece starts with one, up to the word run.
        assert!(parts[1..parts.len() - 2]
            .iter()
            .all(|p| p.starts_with(char::is_whitespace)));
        // A sentence end near the cut is preferred.
        assert!(
            parts[0].ends_with('.') || parts[0].ends_with('!'),
            "{:?}",
            parts[0]
        );
        // Multi-byte characters are never split.
        let accents = "é".repeat(100);
        assert_eq!(pieces(&accents, 33).concat(), accents);
        assert_eq!(pieces("short", 128), vec!["short"]);
    }
}
