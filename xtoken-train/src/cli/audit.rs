//! `xtoken audit`: the coverage audit of a tokenizer pair, as a Markdown table or JSON.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use xtoken_core::audit::{self, AuditOptions, Category};
use xtoken_core::projection::SparseProjection;

use super::{PairArgs, ParamArgs};

/// Options of `xtoken audit`.
#[derive(Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pair: PairArgs,
    #[command(flatten)]
    params: ParamArgs,
    /// Use this stored W (verified against the tokenizers) instead of building one.
    #[arg(long)]
    projection: Option<PathBuf>,
    /// Print JSON instead of a Markdown table.
    #[arg(long)]
    json: bool,
    /// Critical categories, comma-separated: P-KL is recommended when one falls mostly outside C.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "digits_1,digits_2,digits_3"
    )]
    critical: Vec<String>,
    /// Fraction of a critical category that must be in C for H-KL.
    #[arg(long, default_value_t = 0.5)]
    min_coverage: f64,
}

/// Runs `xtoken audit`.
pub fn run(args: AuditArgs) -> Result<()> {
    let critical = args
        .critical
        .iter()
        .map(|name| Category::parse(name.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    if !(0.0..=1.0).contains(&args.min_coverage) {
        anyhow::bail!("--min-coverage {} must be in [0, 1]", args.min_coverage);
    }
    let (student, teacher) = args.pair.load()?;
    let w = match &args.projection {
        Some(path) => SparseProjection::load_verified(path, &student, &teacher)?,
        None => SparseProjection::build(&student, &teacher, args.params.params())?.0,
    };
    let options = AuditOptions {
        critical,
        min_coverage: args.min_coverage,
    };
    let report = audit::audit(&student, &teacher, &w, &options);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_markdown());
    }
    Ok(())
}
