//! `xtoken align`: tokenize texts with the student and every teacher, align each pair, and print
//! the chunks or write the alignment cache.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde_json::{json, Value};
use xtoken_core::align::{AlignParams, Aligner, Alignment, ChunkKind, Workspace};
use xtoken_core::cache::{encode_record, AlignCache, CacheMetadata, CacheWriter, TokenizerRecord};
use xtoken_core::vocab::Vocabulary;

use crate::config::DataFormat;
use crate::data::DocumentReader;

/// Scores and band of the alignment DP (defaults: the paper's).
#[derive(Args, Clone)]
pub struct AlignParamArgs {
    /// Reward of a diagonal match, penalty of a mismatch (α_exact).
    #[arg(long, default_value_t = 3.0, allow_negative_numbers = true)]
    alpha_exact: f64,
    /// Reward per token of a 1-to-k / k-to-1 combination (α_comb).
    #[arg(long, default_value_t = 1.5, allow_negative_numbers = true)]
    alpha_comb: f64,
    /// Score of a gap (α_gap, negative).
    #[arg(long, default_value_t = -1.5, allow_negative_numbers = true)]
    alpha_gap: f64,
    /// Most tokens a combination joins (L).
    #[arg(long, default_value_t = 4)]
    align_max_span: usize,
    /// Half-width of the DP band in bytes (widened automatically when too narrow).
    #[arg(long, default_value_t = 16)]
    band_bytes: u32,
    /// Also pair runs of crossing tokens whose bytes agree (many-to-many chunks; not in the paper).
    #[arg(long)]
    recover_spans: bool,
}

impl AlignParamArgs {
    /// The parameters these flags describe.
    pub fn params(&self) -> AlignParams {
        AlignParams {
            alpha_exact: self.alpha_exact,
            alpha_comb: self.alpha_comb,
            alpha_gap: self.alpha_gap,
            max_span: self.align_max_span,
            band_bytes: self.band_bytes,
            recover_spans: self.recover_spans,
        }
    }
}

/// Arguments of `xtoken align`.
#[derive(Args)]
pub struct AlignArgs {
    /// Student tokenizer: a directory holding tokenizer.json, or the file.
    #[arg(long)]
    student: PathBuf,
    /// Teacher tokenizer(s); repeat for several teachers (one alignment per teacher).
    #[arg(long, required = true)]
    teacher: Vec<PathBuf>,
    /// One text to align (prints the chunks side by side).
    #[arg(long, conflicts_with = "input")]
    text: Option<String>,
    /// A data file: JSON Lines (the text in `--text-field`), parquet (the column
    /// `--text-field`) or plain text (one document per line).
    #[arg(long)]
    input: Option<PathBuf>,
    /// The JSON field or parquet column holding the text.
    #[arg(long, default_value = "text")]
    text_field: String,
    /// Write the alignment cache here (with --input).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print JSON: one object for --text, one per input line for --input.
    #[arg(long)]
    json: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    params: AlignParamArgs,
}

/// Everything needed to turn a text into ids and alignments for every teacher.
pub struct Pipeline {
    /// The student tokenizer.
    pub student: Vocabulary,
    /// The teacher tokenizers.
    pub teachers: Vec<Vocabulary>,
    /// One aligner per teacher.
    pub aligners: Vec<Aligner>,
}

/// One document, tokenized and aligned against every teacher.
pub struct AlignedDoc {
    /// Student ids.
    pub student_ids: Vec<u32>,
    /// Per teacher: ids and alignment.
    pub teachers: Vec<(Vec<u32>, Alignment)>,
}

impl Pipeline {
    /// Loads the tokenizers (in parallel) and indexes every pair.
    pub fn load(student: &Path, teachers: &[PathBuf], params: AlignParams) -> Result<Self> {
        params.validate()?;
        let (student, teachers) = load_all(student, teachers)?;
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
    /// aligns each teacher with the student.
    pub fn process(&self, ws: &mut Workspace, text: &str) -> Result<AlignedDoc> {
        let student_ids = self.student.encode(text)?;
        let mut teachers = Vec::with_capacity(self.teachers.len());
        for (vocab, aligner) in self.teachers.iter().zip(&self.aligners) {
            let ids = vocab.encode(text)?;
            let alignment = aligner.align_with(ws, &student_ids, &ids)?;
            teachers.push((ids, alignment));
        }
        Ok(AlignedDoc {
            student_ids,
            teachers,
        })
    }
}

impl AlignedDoc {
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

/// Runs `xtoken align`.
pub fn run(args: AlignArgs) -> Result<()> {
    let pipeline = Pipeline::load(&args.student, &args.teacher, args.params.params())?;
    match (&args.text, &args.input) {
        (Some(text), _) => {
            if args.out.is_some() {
                bail!("--out writes a cache of an --input file; with --text, use --json");
            }
            let doc = pipeline.process(&mut Workspace::default(), text)?;
            if args.json {
                writeln!(std::io::stdout(), "{}", doc.to_json())?;
            } else {
                let mut out = std::io::stdout().lock();
                print_table(&mut out, &pipeline.student, &pipeline.teachers, &doc)?;
            }
            Ok(())
        }
        (None, Some(input)) => {
            if args.out.is_none() && !args.json {
                bail!("with --input, give --out CACHE (the alignment cache) or --json (to stdout)");
            }
            let threads = args
                .threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            let job = FileJob {
                input,
                out: args.out.as_deref(),
                json: args.json,
                format: DataFormat::of(input)?,
                text_field: &args.text_field,
                threads,
                params: args.params.params(),
                progress: true,
            };
            let stats = align_file(&pipeline, &job)?;
            if let Some(out) = &args.out {
                eprintln!(
                    "wrote {}: {} documents, {} student tokens in {:.2} s ({:.0} student tokens/s, {threads} threads)",
                    out.display(),
                    stats.docs,
                    stats.student_tokens,
                    stats.seconds,
                    stats.student_tokens as f64 / stats.seconds.max(1e-9)
                );
                for (tally, vocab) in stats.teachers.iter().zip(&pipeline.teachers) {
                    eprintln!(
                        "  teacher {}: aligned {:.2}% of student and {:.2}% of teacher positions; band widened in {} documents",
                        vocab.path().display(),
                        100.0 * tally.student_aligned as f64 / stats.student_tokens.max(1) as f64,
                        100.0 * tally.teacher_aligned as f64 / tally.teacher_tokens.max(1) as f64,
                        tally.widened
                    );
                }
            }
            Ok(())
        }
        (None, None) => bail!("give --text TEXT or --input FILE.jsonl"),
    }
}

/// Prints the chunks side by side as a Markdown table.
fn print_table(
    out: &mut impl Write,
    student: &Vocabulary,
    teachers: &[Vocabulary],
    doc: &AlignedDoc,
) -> std::io::Result<()> {
    let show = |vocab: &Vocabulary, ids: &[u32], range: std::ops::Range<usize>| -> String {
        if range.is_empty() {
            return "·".into();
        }
        let tokens: Vec<String> = ids[range.clone()]
            .iter()
            .map(|&id| vocab.token(id).map_or(format!("#{id}"), |t| t.display()))
            .collect();
        let at = if range.len() == 1 {
            format!("{}", range.start)
        } else {
            format!("{}–{}", range.start, range.end - 1)
        };
        format!("{at}: {}", tokens.join(" ")).replace('|', "\\|")
    };
    for (t, ((ids, alignment), vocab)) in doc.teachers.iter().zip(teachers).enumerate() {
        let (s_aligned, t_aligned) = alignment.aligned_positions();
        let score = if alignment.score.is_nan() {
            String::new()
        } else {
            format!("score {:.1}; ", alignment.score)
        };
        writeln!(
            out,
            "student {} ({} tokens) · teacher {} ({} tokens)\n\
             {score}aligned: {s_aligned}/{} student, {t_aligned}/{} teacher positions\n",
            student.path().display(),
            doc.student_ids.len(),
            vocab.path().display(),
            ids.len(),
            doc.student_ids.len(),
            ids.len(),
        )?;
        writeln!(out, "| # | kind | student | teacher |\n|---:|---|---|---|")?;
        for (k, chunk) in alignment.chunks.iter().enumerate() {
            let kind = match chunk.kind {
                ChunkKind::Match => "match",
                ChunkKind::OneToMany => "1-to-k",
                ChunkKind::ManyToOne => "k-to-1",
                ChunkKind::Span => "span",
                ChunkKind::Gap => "**gap**",
            };
            writeln!(
                out,
                "| {k} | {kind} | {} | {} |",
                show(student, &doc.student_ids, chunk.student.range()),
                show(vocab, ids, chunk.teacher.range())
            )?;
        }
        if t + 1 < doc.teachers.len() {
            writeln!(out)?;
        }
    }
    Ok(())
}

/// Per-teacher counts of a file job.
#[derive(Default, Clone)]
pub struct Tally {
    /// Student positions in two-sided chunks.
    pub student_aligned: u64,
    /// Teacher positions in two-sided chunks.
    pub teacher_aligned: u64,
    /// Teacher tokens.
    pub teacher_tokens: u64,
    /// Documents whose DP band had to be widened.
    pub widened: u64,
}

/// What [`align_file`] reads, writes and how.
pub struct FileJob<'a> {
    /// The input file.
    pub input: &'a Path,
    /// Its format.
    pub format: DataFormat,
    /// Where to write the cache, if anywhere.
    pub out: Option<&'a Path>,
    /// Whether to print one JSON object per document to stdout.
    pub json: bool,
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

/// Reads texts from a JSONL file in batches, processes each batch on all cores, and writes the
/// results in input order (cache records and/or JSON lines).
pub fn align_file(pipeline: &Pipeline, job: &FileJob<'_>) -> Result<FileStats> {
    let start = Instant::now();
    let input = job.input;
    let mut reader = DocumentReader::open(input, job.format, job.text_field)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(job.threads)
        .build()
        .context("starting worker threads")?;
    let mut writer = match job.out {
        Some(out) => Some(CacheWriter::create(
            out,
            CacheMetadata {
                student: TokenizerRecord::of(&pipeline.student),
                teachers: pipeline.teachers.iter().map(TokenizerRecord::of).collect(),
                params: job.params,
                source: input.to_path_buf(),
                text_field: job.text_field.to_string(),
                student_tokens: 0,
                created_by: format!("xtoken {}", env!("CARGO_PKG_VERSION")),
            },
        )?),
        None => None,
    };
    let progress = if job.progress && job.out.is_some() {
        ProgressBar::new(reader.total())
    } else {
        ProgressBar::hidden()
    };
    let template = if reader.counts_bytes() {
        "{bar:30} {percent:>3}% {binary_bytes}/{binary_total_bytes} · {msg} · ETA {eta}"
    } else {
        "{bar:30} {percent:>3}% {pos}/{len} rows · {msg} · ETA {eta}"
    };
    progress.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut tallies = vec![Tally::default(); pipeline.teachers.len()];
    let (mut docs, mut student_tokens) = (0u64, 0u64);
    loop {
        // A batch of about 4 MiB of text keeps every core busy and memory small.
        let batch = reader.next_batch(4 << 20)?;
        progress.set_position(reader.done());
        let eof = batch.is_empty();
        let extractor = reader.extractor();
        let extractor = &extractor;
        let results: Vec<Result<(AlignedDoc, Option<Vec<u8>>)>> = pool.install(|| {
            batch
                .par_iter()
                .map_init(Workspace::default, |ws, raw| {
                    let text = extractor.text(raw)?;
                    let doc = pipeline.process(ws, &text).with_context(|| {
                        format!("{}:{}: aligning this document", input.display(), raw.line)
                    })?;
                    let record = if job.out.is_some() {
                        Some(doc.record()?)
                    } else {
                        None
                    };
                    Ok((doc, record))
                })
                .collect()
        });
        for result in results {
            let (doc, record) = result?;
            docs += 1;
            student_tokens += doc.student_ids.len() as u64;
            for (tally, (ids, a)) in tallies.iter_mut().zip(&doc.teachers) {
                let (s, t) = a.aligned_positions();
                tally.student_aligned += s as u64;
                tally.teacher_aligned += t as u64;
                tally.teacher_tokens += ids.len() as u64;
                tally.widened += u64::from(a.band_bytes != job.params.band_bytes);
            }
            if let (Some(w), Some(record)) = (writer.as_mut(), record) {
                w.push(&record, doc.student_ids.len())?;
            }
            if job.json {
                writeln!(out, "{}", doc.to_json())?;
            }
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        progress.set_message(format!(
            "{docs} docs · {:.0}k student tok/s",
            student_tokens as f64 / secs / 1e3
        ));
        if eof {
            break;
        }
    }
    out.flush()?;
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

/// `xtoken cache …`: look into an alignment cache.
#[derive(clap::Subcommand)]
pub enum CacheCommand {
    /// What the cache was made from: tokenizers, parameters, source, size.
    Info {
        /// The cache file.
        cache: PathBuf,
    },
    /// Check every document's checksum and structure, and optionally the tokenizers.
    Verify {
        /// The cache file.
        cache: PathBuf,
        /// The student tokenizer the cache must have been made with.
        #[arg(long, requires = "teacher")]
        student: Option<PathBuf>,
        /// The teacher tokenizers, in the cache's order.
        #[arg(long)]
        teacher: Vec<PathBuf>,
    },
    /// Print one document's chunks side by side (or as JSON).
    Show {
        /// The cache file.
        cache: PathBuf,
        /// The document, counted from 0 in input order.
        #[arg(long)]
        doc: usize,
        /// The student tokenizer (checked against the cache).
        #[arg(long)]
        student: PathBuf,
        /// The teacher tokenizers, in the cache's order.
        #[arg(long, required = true)]
        teacher: Vec<PathBuf>,
        /// Print the JSON object `xtoken align --json` prints.
        #[arg(long)]
        json: bool,
    },
}

/// Loads the student and every teacher tokenizer, one thread each.
fn load_all(student: &Path, teachers: &[PathBuf]) -> Result<(Vocabulary, Vec<Vocabulary>)> {
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

/// Runs `xtoken cache …`.
pub fn cache(command: CacheCommand) -> Result<()> {
    match command {
        CacheCommand::Info { cache } => {
            let opened = AlignCache::open(&cache)?;
            let meta = opened.metadata();
            let bytes = std::fs::metadata(&cache).map(|m| m.len()).unwrap_or(0);
            println!(
                "{}: {} documents, {} student tokens, {bytes} bytes",
                cache.display(),
                opened.len(),
                meta.student_tokens
            );
            let side = |name: &str, r: &TokenizerRecord| {
                println!(
                    "  {name}: {} ({} ids, sha256 {})",
                    r.path.display(),
                    r.size,
                    r.sha256
                );
            };
            side("student", &meta.student);
            for t in &meta.teachers {
                side("teacher", t);
            }
            println!(
                "  source: {} (field `{}`)",
                meta.source.display(),
                meta.text_field
            );
            println!("  alignment: {}", serde_json::to_string(&meta.params)?);
            println!("  written by {}", meta.created_by);
            Ok(())
        }
        CacheCommand::Verify {
            cache,
            student,
            teacher,
        } => {
            let opened = AlignCache::open(&cache)?;
            if let Some(student) = student {
                let (s, t) = load_all(&student, &teacher)?;
                let refs: Vec<&Vocabulary> = t.iter().collect();
                opened.check_tokenizers(&s, &refs)?;
            }
            let progress = ProgressBar::new(opened.len() as u64);
            for i in 0..opened.len() {
                opened.doc(i)?;
                progress.inc(1);
            }
            progress.finish_and_clear();
            println!("{}: ok, {} documents", cache.display(), opened.len());
            Ok(())
        }
        CacheCommand::Show {
            cache,
            doc,
            student,
            teacher,
            json,
        } => {
            let (s, t) = load_all(&student, &teacher)?;
            let refs: Vec<&Vocabulary> = t.iter().collect();
            let opened = AlignCache::open_verified(&cache, &s, &refs)?;
            let cached = opened.doc(doc)?;
            let aligned = AlignedDoc {
                student_ids: cached.student_ids.to_vec(),
                teachers: cached
                    .teachers
                    .iter()
                    .map(|c| (c.ids.to_vec(), c.alignment()))
                    .collect(),
            };
            if json {
                writeln!(std::io::stdout(), "{}", aligned.to_json())?;
            } else {
                print_table(&mut std::io::stdout().lock(), &s, &t, &aligned)?;
            }
            Ok(())
        }
    }
}
