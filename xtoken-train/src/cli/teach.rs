//! `xtoken teach --config run.toml --out DIR`: each teacher of a run read over its data once,
//! its targets stored in `DIR/<teacher name>/` for runs that name them in `teachers[].targets`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use xtoken_train::output::Inputs;
use xtoken_train::train::teach::{shard_bytes, teach_on_device};
use xtoken_train::RunConfig;

/// Options of `xtoken teach`.
#[derive(Args, Clone)]
pub struct TeachArgs {
    /// The run configuration whose `[[teachers]]`, `[data]`, `loss.temperature` and `[teach]`
    /// say what to store.
    #[arg(long)]
    pub config: PathBuf,
    /// The directory the stores go into, one per teacher (`DIR/<name>/`); a pass interrupted
    /// there continues where it stopped.
    #[arg(long)]
    pub out: PathBuf,
    /// `cpu`, `flex`, `ndarray`, `cuda` or `wgpu` (overrides `device` in the configuration).
    #[arg(long)]
    pub device: Option<String>,
}

/// Runs `xtoken teach`.
pub fn run(args: TeachArgs) -> Result<()> {
    Inputs::new()
        .with("the configuration file", &args.config)
        .refuse(&args.out)?;
    let mut config = RunConfig::load(&args.config)?;
    if let Some(device) = args.device {
        config.device = device;
    }
    let taught = teach_on_device(&config, &args.out)?;
    for t in &taught {
        println!(
            "{}: {} documents read now ({} tokens, {:.0} tokens/s), {:.1} MB of shards in {}",
            t.name,
            t.documents,
            t.tokens,
            t.tokens as f64 / t.seconds.max(1e-9),
            shard_bytes(&t.dir)? as f64 / 1e6,
            t.dir.display()
        );
    }
    Ok(())
}
