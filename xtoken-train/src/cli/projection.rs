//! `xtoken projection build` and `xtoken projection show`: W per the paper's rule-based
//! algorithm, with where its rows came from; one student token's row.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use xtoken_core::audit::Category;
use xtoken_core::canon::SpecialRole;
use xtoken_core::matching::{ExactMatcher, Partners};
use xtoken_core::projection::{EmptyReason, RowSource, SparseProjection};
use xtoken_core::vocab::TokenKind;

use xtoken_train::output::write_file;

use super::OWN_W;

use super::{PairArgs, ParamArgs};

/// `xtoken projection …`.
#[derive(Subcommand)]
pub enum ProjectionCommand {
    /// Build W per the paper's rule-based algorithm and store it as safetensors.
    Build(BuildArgs),
    /// Print one student token's row of W as teacher tokens with weights.
    Show(ShowArgs),
}

/// Runs `xtoken projection …`.
pub fn run(command: ProjectionCommand) -> Result<()> {
    match command {
        ProjectionCommand::Build(args) => build(args),
        ProjectionCommand::Show(args) => show(args),
    }
}

/// Options of `xtoken projection build`.
#[derive(Args)]
pub struct BuildArgs {
    #[command(flatten)]
    pair: PairArgs,
    #[command(flatten)]
    params: ParamArgs,
    /// Where to write W (safetensors).
    #[arg(long)]
    out: PathBuf,
    /// How many empty rows to list as examples.
    #[arg(long, default_value_t = 8)]
    examples: usize,
}

/// Options of `xtoken projection show`.
#[derive(Args)]
pub struct ShowArgs {
    /// The stored W.
    projection: PathBuf,
    #[command(flatten)]
    pair: PairArgs,
    /// The student token: its text (" the", "201"), its tokenizer.json surface ("Ġthe"), or #ID.
    #[arg(long)]
    token: String,
}

fn build(args: BuildArgs) -> Result<()> {
    let params = args.params.params();
    params.validate()?;
    args.pair.inputs().check(&args.out, &OWN_W)?;
    let start = Instant::now();
    let (student, teacher) = args.pair.load()?;
    let loaded = start.elapsed();
    let (w, report) = SparseProjection::build(&student, &teacher, params)?;
    let built = start.elapsed() - loaded;
    write_file(&args.out, |tmp| Ok(w.save(tmp)?))?;
    let total = start.elapsed();

    println!(
        "W: {} × {} (student {} → teacher {}), top-{} rows, L = {}, β = {}, γ = {}",
        w.student_vocab_size(),
        w.teacher_vocab_size(),
        student.path().display(),
        teacher.path().display(),
        params.top_k,
        params.max_span,
        params.beta,
        params.gamma
    );
    let rows = [
        ("exact (canonical match)", RowSource::Exact),
        ("special (paired by role)", RowSource::Special),
        ("multi-token (re-encoded)", RowSource::MultiToken),
        ("empty", RowSource::Empty),
        ("padding", RowSource::Padding),
    ];
    for (label, source) in rows {
        let n = report.count(source);
        if n > 0 || source != RowSource::Padding {
            println!(
                "  {label:<26} {n:>8}  {:>5.1}%",
                100.0 * n as f64 / w.student_vocab_size() as f64
            );
        }
    }
    if !report.empty.is_empty() {
        let mut reasons: Vec<(String, usize)> = Vec::new();
        for (_, reason) in &report.empty {
            let key = reason_summary(reason);
            match reasons.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 += 1,
                None => reasons.push((key, 1)),
            }
        }
        println!("  empty rows by reason:");
        for (reason, n) in reasons {
            println!("    {n:>8}  {reason}");
        }
        println!("  examples of empty rows:");
        for (s, reason) in report.empty.iter().take(args.examples) {
            let token = student.token(*s).context("student id out of range")?;
            println!(
                "    #{s:<7} {:<32} {}",
                token.display(),
                reason_detail(reason)
            );
        }
    }
    println!(
        "wrote {} in {:.2} s (tokenizers loaded in {:.2} s, W built in {:.2} s)",
        args.out.display(),
        total.as_secs_f64(),
        loaded.as_secs_f64(),
        built.as_secs_f64()
    );
    Ok(())
}

fn reason_summary(reason: &EmptyReason) -> String {
    match reason {
        EmptyReason::UnpairedSpecial => "special token without a counterpart".into(),
        EmptyReason::TooLong { .. } => "teacher re-encoding longer than L".into(),
        EmptyReason::NoByteToken { .. } => "byte without a teacher byte token".into(),
        EmptyReason::EncodedToNothing => "teacher encodes the text to nothing".into(),
    }
}

fn reason_detail(reason: &EmptyReason) -> String {
    match reason {
        EmptyReason::TooLong { length } => format!("teacher re-encoding has {length} tokens"),
        EmptyReason::NoByteToken { byte } => format!("teacher has no token for byte {byte:#04x}"),
        other => reason_summary(other),
    }
}

fn show(args: ShowArgs) -> Result<()> {
    let (student, teacher) = args.pair.load()?;
    let w = SparseProjection::load_verified(&args.projection, &student, &teacher)?;
    let s = student.find(&args.token)?;
    let token = student.token(s).context("student id out of range")?;
    let source = match ExactMatcher::new(&student, &teacher).partners(token) {
        Partners::Text(_) => "exact canonical match",
        Partners::Special(_) => "special token paired by role",
        Partners::None if w.top1(s).is_some() => "multi-token rule",
        Partners::None => "empty row",
    };
    let role = token
        .role
        .map(|r: SpecialRole| format!(", role {}", r.name()))
        .unwrap_or_default();
    println!(
        "student #{s} {} ({}{role}): {source}",
        token.display(),
        Category::of(token.kind, &token.bytes).name()
    );
    for (t, weight) in w.row(s) {
        let teacher_token = teacher.token(t).context("teacher id out of range")?;
        println!(
            "  teacher #{t:<7} {:<24} {weight:.4}",
            teacher_token.display()
        );
    }
    if w.top1(s).is_none() && token.kind != TokenKind::Padding {
        println!("  (no teacher tokens: P-KL gives this row no mass, H-KL leaves it to ULD)");
    }
    Ok(())
}
