//! `xtoken bench align`: alignment speed per kind of text, the DP alone on one thread and
//! `xtoken align --input … --out …` end to end on all threads.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use xtoken_train::config::DataFormat;
use xtoken_train::data::{align_file, FileJob, Pipeline};
use xtoken_train::output::{claim_work_dir, Inputs};

use super::{corpora, median};
use crate::cli::align::AlignParamArgs;

/// Arguments of `xtoken bench align`.
#[derive(Args)]
pub struct AlignBenchArgs {
    /// Student tokenizer: a directory holding tokenizer.json, or the file.
    #[arg(long)]
    student: PathBuf,
    /// Teacher tokenizer: a directory holding tokenizer.json, or the file.
    #[arg(long)]
    teacher: PathBuf,
    /// Bytes of text per document (about 4096 Llama-3 tokens of English at 16 KiB).
    #[arg(long, default_value_t = 16 << 10)]
    doc_bytes: usize,
    /// Most bytes of text per kind.
    #[arg(long, default_value_t = 2 << 20)]
    kind_bytes: usize,
    /// Timed runs per measurement (the table shows the median).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Worker threads of the end-to-end run (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Where the end-to-end runs write their JSONL inputs and caches.
    #[arg(long, default_value = "target/bench-align")]
    work_dir: PathBuf,
    #[command(flatten)]
    params: AlignParamArgs,
}

/// Times the DP alone (one thread) and `xtoken align --input … --out …` end to end (all
/// threads) per kind of text, and prints a Markdown table.
pub fn run(args: AlignBenchArgs) -> Result<()> {
    use xtoken_core::align::{AlignParams, Aligner, Workspace};

    if args.runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    let params = args.params.params();
    let pipeline = Pipeline::load(&args.student, std::slice::from_ref(&args.teacher), params)?;
    let recovering = Aligner::new(
        &pipeline.student,
        &pipeline.teachers[0],
        AlignParams {
            recover_spans: true,
            ..params
        },
    )?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let inputs = Inputs::new()
        .tokenizer("the student tokenizer", &args.student)
        .tokenizer("the teacher tokenizer", &args.teacher);
    claim_work_dir(&inputs, &args.work_dir, "xtoken bench align")?;
    println!(
        "xtoken align: {} → {} · {} threads end to end · band {} bytes · {} runs, median\n",
        args.student.display(),
        args.teacher.display(),
        threads,
        params.band_bytes,
        args.runs
    );
    println!(
        "| kind | source | docs | student tokens | tokens/doc | DP only, 1 thread (tok/s) | end to end, {threads} threads (tok/s) | aligned (paper DP) | aligned (+ span recovery) | band widened |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for corpus in corpora::all(args.kind_bytes) {
        let Some(corpus) = corpus else { continue };
        let docs = corpora::split(&corpus.text, args.doc_bytes);
        // DP alone, on pre-tokenized documents.
        let encoded: Vec<(Vec<u32>, Vec<u32>)> = docs
            .iter()
            .map(|d| Ok((pipeline.student.encode(d)?, pipeline.teachers[0].encode(d)?)))
            .collect::<Result<_>>()?;
        let student_tokens: usize = encoded.iter().map(|e| e.0.len()).sum();
        let mut ws = Workspace::default();
        let aligner = &pipeline.aligners[0];
        let (mut aligned, mut recovered, mut widened) = (0usize, 0usize, 0usize);
        for (s, t) in &encoded {
            let a = aligner.align_with(&mut ws, s, t)?;
            aligned += a.aligned_positions().0;
            widened += usize::from(a.band_bytes != params.band_bytes);
            recovered += recovering.align_with(&mut ws, s, t)?.aligned_positions().0;
        }
        let mut dp = Vec::new();
        for _ in 0..args.runs {
            let start = Instant::now();
            for (s, t) in &encoded {
                std::hint::black_box(aligner.align_with(&mut ws, s, t)?);
            }
            dp.push(student_tokens as f64 / start.elapsed().as_secs_f64());
        }
        let e2e = end_to_end(&pipeline, &args, threads, corpus.kind, &docs)?;
        let pct = |n: usize| 100.0 * n as f64 / student_tokens.max(1) as f64;
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.2} M | {:.0} k | {:.2} % | {:.2} % | {} |",
            corpus.kind,
            corpus.source,
            docs.len(),
            student_tokens,
            student_tokens as f64 / docs.len().max(1) as f64,
            median(dp) / 1e6,
            median(e2e) / 1e3,
            pct(aligned),
            pct(recovered),
            widened
        );
    }
    Ok(())
}

/// Student tokens/s of each run of `xtoken align --input … --out …` (the same code path) on
/// `docs`, written as JSON lines under the work directory.
fn end_to_end(
    pipeline: &Pipeline,
    args: &AlignBenchArgs,
    threads: usize,
    kind: &str,
    docs: &[&str],
) -> Result<Vec<f64>> {
    let input = args.work_dir.join(format!("{kind}.jsonl"));
    let out = args.work_dir.join(format!("{kind}.xtalign"));
    let mut jsonl = String::new();
    for d in docs {
        jsonl.push_str(&serde_json::json!({ "text": d }).to_string());
        jsonl.push('\n');
    }
    std::fs::write(&input, jsonl)?;
    let mut e2e = Vec::new();
    for _ in 0..args.runs {
        let job = FileJob {
            input: &input,
            format: DataFormat::Jsonl,
            out: Some(&out),
            text_field: "text",
            threads,
            params: args.params.params(),
            progress: false,
        };
        let stats = align_file(pipeline, &job, None)?;
        e2e.push(stats.student_tokens as f64 / stats.seconds);
    }
    Ok(e2e)
}
