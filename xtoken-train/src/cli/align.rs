//! `xtoken align` and `xtoken cache`: tokenize texts with the student and every teacher, align
//! each pair, and print the chunks or write the alignment cache; look into a cache.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use indicatif::ProgressBar;
use xtoken_core::align::{AlignParams, ChunkKind, Workspace};
use xtoken_core::cache::{AlignCache, TokenizerRecord};
use xtoken_core::vocab::Vocabulary;
use xtoken_train::config::DataFormat;
use xtoken_train::data::{align_file, load_tokenizers, AlignedText, FileJob, Pipeline};
use xtoken_train::output::{Inputs, Own};

/// An alignment cache: a file that starts with the cache's magic bytes.
const OWN_CACHE: Own<'static> = Own::File {
    what: "an alignment cache",
    is_own: xtoken_core::cache::is_cache,
};

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

/// Runs `xtoken align`.
pub fn run(args: AlignArgs) -> Result<()> {
    if let Some(out) = &args.out {
        let mut inputs = Inputs::new().tokenizer("the student tokenizer", &args.student);
        for teacher in &args.teacher {
            inputs = inputs.tokenizer("a teacher tokenizer", teacher);
        }
        if let Some(input) = &args.input {
            inputs.add("the --input data", input);
        }
        inputs.check(out, &OWN_CACHE)?;
    }
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
                format: DataFormat::of(input)?,
                text_field: &args.text_field,
                threads,
                params: args.params.params(),
                progress: true,
            };
            let stdout = std::io::stdout();
            let mut lines = std::io::BufWriter::new(stdout.lock());
            let json: Option<&mut dyn Write> = match args.json {
                true => Some(&mut lines),
                false => None,
            };
            let stats = align_file(&pipeline, &job, json)?;
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
                        "  teacher {}: aligned {:.2}% of student and {:.2}% of teacher positions; band widened in {} documents; text changed by a tokenizer in {} documents",
                        vocab.path().display(),
                        100.0 * tally.student_aligned as f64 / stats.student_tokens.max(1) as f64,
                        100.0 * tally.teacher_aligned as f64 / tally.teacher_tokens.max(1) as f64,
                        tally.widened,
                        tally.respelled
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
    doc: &AlignedText,
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
        if doc.respelled.get(t).copied().unwrap_or(false) {
            writeln!(
                out,
                "The two tokenizers spell different texts (a normalizer changed it): chunks pair \
                 equal bytes, not checked to be the same place of the text.\n"
            )?;
        }
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

/// Runs `xtoken cache …`.
pub fn cache(command: CacheCommand) -> Result<()> {
    match command {
        CacheCommand::Info { cache } => info(&cache),
        CacheCommand::Verify {
            cache,
            student,
            teacher,
        } => verify(&cache, student.as_deref(), &teacher),
        CacheCommand::Show {
            cache,
            doc,
            student,
            teacher,
            json,
        } => show(&cache, doc, (&student, &teacher), json),
    }
}

/// `xtoken cache info`: what the cache was made from.
fn info(cache: &Path) -> Result<()> {
    let opened = AlignCache::open(cache)?;
    let meta = opened.metadata();
    let bytes = std::fs::metadata(cache).map(|m| m.len()).unwrap_or(0);
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

/// `xtoken cache verify`: every document's checksum and structure, and the tokenizers.
fn verify(cache: &Path, student: Option<&Path>, teachers: &[PathBuf]) -> Result<()> {
    let opened = AlignCache::open(cache)?;
    if let Some(student) = student {
        let (s, t) = load_tokenizers(student, teachers)?;
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

/// `xtoken cache show`: one document's chunks side by side, or as JSON.
fn show(
    cache: &Path,
    doc: usize,
    (student, teachers): (&Path, &[PathBuf]),
    json: bool,
) -> Result<()> {
    let (s, t) = load_tokenizers(student, teachers)?;
    let refs: Vec<&Vocabulary> = t.iter().collect();
    let opened = AlignCache::open_verified(cache, &s, &refs)?;
    let cached = opened.doc(doc)?;
    let aligned = AlignedText {
        student_ids: cached.student_ids.to_vec(),
        teachers: cached
            .teachers
            .iter()
            .map(|c| (c.ids.to_vec(), c.alignment()))
            .collect(),
        respelled: Vec::new(),
        spans: Vec::new(),
    };
    if json {
        writeln!(std::io::stdout(), "{}", aligned.to_json())?;
    } else {
        print_table(&mut std::io::stdout().lock(), &s, &t, &aligned)?;
    }
    Ok(())
}
