//! `xtoken bench data`: the streaming loader on a large generated corpus of `.jsonl.zst`
//! shards: the time from nothing to the first batch, and the student tokens/s the loader
//! delivers in whole steps with every teacher aligned, against reading and parsing the shards
//! alone (measured in the same run) and the rate one GPU trains at (`--need`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use xtoken_core::align::AlignParams;
use xtoken_core::plan::MergeVariant;
use xtoken_train::config::{DataConfig, DataPaths};
use xtoken_train::data::rng::SplitMix64;
use xtoken_train::data::{
    sources, AlignedStream, BatchShape, DocumentStream, Feed, Loader, LoaderState, Packer,
    Pipeline, StepPlan,
};
use xtoken_train::machine;
use xtoken_train::output::{claim_work_dir, Inputs};

use super::corpora;

/// Arguments of `xtoken bench data`.
#[derive(Args)]
pub struct DataBenchArgs {
    /// Student tokenizer: a directory holding tokenizer.json, or the file.
    #[arg(long)]
    student: PathBuf,
    /// A teacher tokenizer; repeat for each teacher.
    #[arg(long = "teacher", required = true)]
    teachers: Vec<PathBuf>,
    /// Bytes of text in the generated corpus (4.3 GiB is about a billion Llama-3 tokens).
    #[arg(long, default_value_t = 4_600_000_000)]
    corpus_bytes: u64,
    /// Bytes of text per shard.
    #[arg(long, default_value_t = 256 << 20)]
    shard_bytes: u64,
    /// Student tokens per packed row.
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// Rows per step.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Seconds each steady-state measurement runs.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Student tokens/s one GPU trains at, the rate the loader must keep up with.
    #[arg(long, default_value_t = 12_000.0)]
    need: f64,
    /// Alignment thread counts to measure (default: 1 and every core).
    #[arg(long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Where the corpus is generated (and reused by later runs of the same size).
    #[arg(long, default_value = "target/bench-data")]
    work_dir: PathBuf,
}

/// One row of the table.
struct Measured {
    threads: usize,
    first_batch: f64,
    docs_per_s: f64,
    tokens_per_s: f64,
    /// Peak resident memory above what the process held before the loader started.
    peak_rss: u64,
}

/// Generates (or reuses) the corpus, then times reading alone and the loader per thread count,
/// and prints a Markdown table.
pub fn run(args: DataBenchArgs) -> Result<()> {
    if args.seconds <= 0.0 || args.batch == 0 || args.context < 2 {
        anyhow::bail!("--seconds, --batch and --context must be positive (context ≥ 2)");
    }
    let mut inputs = Inputs::new().tokenizer("the student tokenizer", &args.student);
    for teacher in &args.teachers {
        inputs = inputs.tokenizer("a teacher tokenizer", teacher);
    }
    claim_work_dir(&inputs, &args.work_dir, "xtoken bench data")?;
    let corpus = ensure_corpus(&args)?;
    let data = DataConfig {
        path: DataPaths::One(corpus.clone()),
        weights: None,
        text_field: "text".into(),
        cache: None,
        workers: 0,
        prefetch: 2,
        packing: "concatenate".into(),
    };
    let started = Instant::now();
    let pipeline = Arc::new(Pipeline::load(
        &args.student,
        &args.teachers,
        AlignParams::default(),
    )?);
    let tokenizers = started.elapsed().as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = match args.threads.as_slice() {
        [] if cores > 1 => vec![1, cores],
        [] => vec![1],
        list => list.to_vec(),
    };
    let read = read_only(&data, args.seconds)?;
    let rows = threads
        .iter()
        .map(|&t| measure(&args, &data, &pipeline, t))
        .collect::<Result<Vec<_>>>()?;
    print_table(&args, &corpus, tokenizers, read, &rows);
    Ok(())
}

/// The corpus directory: `corpus_bytes` of documents of every kind of text, cut into
/// `.jsonl.zst` shards; generated once per size.
fn ensure_corpus(args: &DataBenchArgs) -> Result<PathBuf> {
    let dir = args
        .work_dir
        .join(format!("corpus-{}-{}", args.corpus_bytes, args.shard_bytes));
    if dir.join("done").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    let kinds: Vec<String> = corpora::all(4 << 20)
        .into_iter()
        .flatten()
        .map(|c| c.text)
        .collect();
    let docs: Vec<&str> = kinds
        .iter()
        .flat_map(|t| corpora::split(t, 6 << 10))
        .collect();
    let started = Instant::now();
    let mut rng = SplitMix64(7);
    let (mut written, mut shard) = (0u64, 0usize);
    while written < args.corpus_bytes {
        let path = dir.join(format!("shard-{shard:05}.jsonl.zst"));
        let file = std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?;
        let mut out = zstd::stream::write::Encoder::new(std::io::BufWriter::new(file), 1)?;
        let mut in_shard = 0u64;
        while in_shard < args.shard_bytes && written + in_shard < args.corpus_bytes {
            let doc = docs[rng.below(docs.len() as u64) as usize];
            let line = serde_json::json!({ "text": doc }).to_string();
            writeln!(out, "{line}")?;
            in_shard += doc.len() as u64;
        }
        out.finish()?.flush()?;
        written += in_shard;
        shard += 1;
        eprintln!(
            "generated {shard} shard(s), {:.2} of {:.2} GB, {:.0} s",
            written as f64 / 1e9,
            args.corpus_bytes as f64 / 1e9,
            started.elapsed().as_secs_f64()
        );
    }
    std::fs::write(dir.join("done"), format!("{shard} shards\n"))?;
    Ok(dir)
}

/// Documents/s of reading, decompressing and parsing alone (one thread), in the stream's order.
fn read_only(data: &DataConfig, seconds: f64) -> Result<f64> {
    let mut stream = DocumentStream::open(sources::sources(data)?, 1, &data.text_field, None)?;
    let started = Instant::now();
    let mut docs = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        let (_, raw, extractor) = stream.next_doc()?;
        std::hint::black_box(extractor.text(&raw)?);
        docs += 1;
    }
    Ok(docs as f64 / started.elapsed().as_secs_f64())
}

/// The loader from nothing (shards found, stream opened) to its first step, then steps for
/// `args.seconds`.
fn measure(
    args: &DataBenchArgs,
    data: &DataConfig,
    pipeline: &Arc<Pipeline>,
    threads: usize,
) -> Result<Measured> {
    // Resident memory, not the counting allocator: its shared counters would slow the
    // alignment threads this measures.
    let base = machine::reset_peak_resident().context("resetting the peak resident memory")?;
    let started = Instant::now();
    let stream = DocumentStream::open(sources::sources(data)?, 1, &data.text_field, None)?;
    let stream = AlignedStream::start(pipeline.clone(), stream, threads, data.prefetch)?;
    let teachers = pipeline.teachers.len();
    let state = LoaderState::default();
    let packer = Packer::new(Feed::Stream(stream), teachers, 1, args.context, state)?;
    let shape = BatchShape {
        global: args.batch,
        micro: args.batch,
        workers: 1,
        rank: 0,
        length_multiple: 1,
    };
    let plan = StepPlan::default();
    let mut loader = Loader::start(
        packer,
        shape,
        MergeVariant::FirstToken,
        data.prefetch,
        plan,
        None,
    )?;
    let first = loader.next_step()?;
    let first_batch = started.elapsed().as_secs_f64();
    let draws = |s: &LoaderState| s.stream.as_ref().map_or(0, |c| c.draws);
    let (from_docs, steady) = (draws(&first.state_after), Instant::now());
    let (mut tokens, mut docs) = (0usize, from_docs);
    while steady.elapsed().as_secs_f64() < args.seconds {
        let step = loader.next_step()?;
        tokens += step.micro.iter().map(|m| m.tokens).sum::<usize>();
        docs = draws(&step.state_after);
    }
    let elapsed = steady.elapsed().as_secs_f64();
    drop(loader);
    Ok(Measured {
        threads,
        first_batch,
        docs_per_s: (docs - from_docs) as f64 / elapsed,
        tokens_per_s: tokens as f64 / elapsed,
        peak_rss: machine::peak_resident().unwrap_or(0).saturating_sub(base),
    })
}

fn print_table(
    args: &DataBenchArgs,
    corpus: &Path,
    tokenizers: f64,
    read_docs_per_s: f64,
    rows: &[Measured],
) {
    let names: Vec<String> = args
        .teachers
        .iter()
        .map(|t| t.display().to_string())
        .collect();
    println!(
        "xtoken bench data: {} → {} · corpus {} ({:.2} GB of text in .jsonl.zst shards) · \
         {} rows × {} tokens per step · {:.0} s per measurement\n",
        args.student.display(),
        names.join(" + "),
        corpus.display(),
        args.corpus_bytes as f64 / 1e9,
        args.batch,
        args.context,
        args.seconds
    );
    println!("Tokenizers loaded in {tokenizers:.2} s (once per run, before the loader starts).\n");
    println!(
        "| loader | threads | first batch (s) | documents/s | student tokens/s | × one GPU's need ({:.0} tok/s) | peak memory |",
        args.need
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!("| read + decompress + parse only | 1 | – | {read_docs_per_s:.0} | – | – | – |");
    for r in rows {
        println!(
            "| stream: tokenize + align {} teacher(s) + pack | {} | {:.2} | {:.0} | {:.0} | {:.1} | {:.0} MiB |",
            args.teachers.len(),
            r.threads,
            r.first_batch,
            r.docs_per_s,
            r.tokens_per_s,
            r.tokens_per_s / args.need,
            r.peak_rss as f64 / (1 << 20) as f64
        );
    }
}
