//! `xtoken bench projection`: the wall time of building W, per stage (tokenizer loading, the
//! build, saving).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use xtoken_core::projection::SparseProjection;

use super::median;
use crate::cli::{PairArgs, ParamArgs, OWN_W};
use xtoken_train::output::write_file;

/// Arguments of `xtoken bench projection`.
#[derive(Args)]
pub struct ProjectionBenchArgs {
    #[command(flatten)]
    pair: PairArgs,
    #[command(flatten)]
    params: ParamArgs,
    /// Timed runs (after one warm-up run that fills the page cache).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Where the runs write W (overwritten each run).
    #[arg(long, default_value = "target/bench-projection.safetensors")]
    out: PathBuf,
}

struct Stages {
    load: Duration,
    build: Duration,
    save: Duration,
}

fn one_run(args: &ProjectionBenchArgs) -> Result<Stages> {
    let start = Instant::now();
    let (student, teacher) = args.pair.load()?;
    let load = start.elapsed();
    let (w, _) = SparseProjection::build(&student, &teacher, args.params.params())?;
    let build = start.elapsed() - load;
    write_file(&args.out, |tmp| Ok(w.save(tmp)?))?;
    let save = start.elapsed() - load - build;
    Ok(Stages { load, build, save })
}

/// Times load + build + save of W and prints min / median / max per stage.
pub fn run(args: ProjectionBenchArgs) -> Result<()> {
    if args.runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    args.pair.inputs().check(&args.out, &OWN_W)?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    one_run(&args)?;
    let mut runs = Vec::with_capacity(args.runs);
    for i in 0..args.runs {
        eprint!("\rrun {}/{}", i + 1, args.runs);
        runs.push(one_run(&args)?);
    }
    eprintln!();
    let secs = |f: fn(&Stages) -> Duration| -> Vec<f64> {
        runs.iter().map(|r| f(r).as_secs_f64()).collect()
    };
    let stages: [(&str, Vec<f64>); 4] = [
        ("load both tokenizers (parallel)", secs(|r| r.load)),
        ("build W (exact + multi-token + top-K)", secs(|r| r.build)),
        ("save safetensors", secs(|r| r.save)),
        ("**total**", secs(|r| r.load + r.build + r.save)),
    ];
    println!(
        "xtoken projection build: {} → {} ({} runs, {} threads)\n",
        args.pair.student.display(),
        args.pair.teacher.display(),
        args.runs,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("| stage | min (s) | median (s) | max (s) |\n|---|---:|---:|---:|");
    for (name, v) in stages {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        println!("| {name} | {min:.3} | {:.3} | {max:.3} |", median(v));
    }
    Ok(())
}
