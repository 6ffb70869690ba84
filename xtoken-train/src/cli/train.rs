//! `xtoken train --config run.toml`: the run a configuration file describes, on the device it
//! names or `--device`, one worker or data-parallel ones (`--devices`).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use xtoken_train::config::DeviceKind;
use xtoken_train::train::launch::{train_on, Devices};
use xtoken_train::train::preflight::{check_on, Target};
use xtoken_train::train::resume::Extension;
use xtoken_train::{RunConfig, RunOptions};

/// Options of `xtoken train`.
#[derive(Args, Clone)]
pub struct TrainArgs {
    /// The run configuration (TOML; every default is the paper's).
    #[arg(long)]
    pub config: PathBuf,
    /// Continue from the newest complete checkpoint in the run directory.
    #[arg(long)]
    pub resume: bool,
    /// `cpu` (burn-flex), `flex`, `ndarray`, `cuda` or `wgpu` (overrides `device` in the configuration).
    #[arg(long)]
    pub device: Option<String>,
    /// Stop (with a checkpoint) after this step instead of `training.steps`.
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// With --resume, accept a raised `training.steps`: `decay` (the rate reached decays to
    /// min_lr at the new end) or `stretch` (the schedule recomputed over the new total).
    #[arg(long, value_name = "MODE")]
    pub extend_steps: Option<Extension>,
    /// Devices of this machine to train on, one worker each (`0,1,2,3`); more than one needs
    /// the `collective` feature.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<usize>,
    /// With --resume, train on although the data's shards changed since the checkpoint
    /// (rewritten, truncated, added or removed); with stored teacher targets, although the data
    /// differs from what they were written from. Without it that is an error naming them.
    #[arg(long)]
    pub allow_data_change: bool,
    /// Read and check everything the run needs (configuration, models' configurations and
    /// weight headers, tokenizers, every data shard's first document, W) and print the plan
    /// (steps, tokens, each teacher's loss, memory estimate) without training.
    #[arg(long)]
    pub check: bool,
    /// With --check: one device's memory (`80GB`, `141GiB`), for the estimate of a GPU run
    /// planned where the GPU cannot be asked (a login node).
    #[arg(long, value_name = "BYTES", requires = "check", value_parser = bytes)]
    pub gpu_memory: Option<u64>,
}

fn bytes(text: &str) -> Result<u64, String> {
    let zero = text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == ' ')
        .parse::<f64>()
        .is_ok_and(|n| n == 0.0);
    if zero {
        return Err(format!("{text:?}: a device's memory is more than 0 bytes"));
    }
    xtoken_train::train::memory::parse_bytes(text).ok_or_else(|| {
        format!("{text:?}: expected bytes, or a number with KB, MB, GB, KiB, MiB or GiB")
    })
}

/// Runs `xtoken train`.
pub fn run(args: TrainArgs) -> Result<()> {
    // `--check` validates the values itself, to list them beside every other failure.
    let mut config = match args.check {
        true => RunConfig::load_unchecked(&args.config)?,
        false => RunConfig::load(&args.config)?,
    };
    // The device decides what `auto` dtypes mean (f32 on `cpu`, bf16 on `flex`).
    if let Some(device) = args.device {
        config.device = device;
    }
    // An unknown device is among the values `--check` lists.
    let kind = match (args.check, config.device.parse()) {
        (true, Err(_)) => DeviceKind::Cpu,
        (_, kind) => kind?,
    };
    let devices = Devices::placed(kind, args.devices)?;
    let options = RunOptions {
        resume: args.resume,
        stop_after: args.stop_after,
        extend: args.extend_steps,
        allow_data_change: args.allow_data_change,
        config_file: Some(args.config.clone()),
        skip_memory_check: false,
    };
    if args.check {
        let processes = devices.placement.as_ref().map_or(1, |p| p.world);
        let target = Target {
            workers: devices.indices.len().max(1) * processes,
            kind,
            device_memory: args.gpu_memory,
        };
        let checked = check_on(&config, target, &options);
        if let Some(plan) = &checked.plan {
            println!("{plan}");
        }
        return Ok(checked.verdict?);
    }
    train_on(config, &options, &devices)?;
    Ok(())
}
