//! `xtoken bench exchange`: the time of one all-reduce of a flat tensor, as `xtoken train` sums a
//! step's gradients, on each exchange the machine has, against anchors measured in the same run:
//! one pass over the tensor's memory on the same device (`a + b`: the link's limit inside one
//! machine), and, for the ring, the same all-reduce between threads of one process.
//!
//! - The ring (xtoken-collective; `--device ndarray|cpu|wgpu`): run alone, it measures
//!   `--processes` threads, then as many processes it starts on this machine; under torchrun
//!   or srun it measures between the processes the launcher started, on as many machines.
//! - NCCL (`--device cuda`, `--exchange nccl` or `auto`): the GPUs `--devices` names, one
//!   worker each, in this process (under a launcher: one process per GPU, as `train` runs).
//!
//! The bus bandwidth is NCCL's own measure (nccl-tests' `busbw`): `2 (n − 1) / n` times the
//! bytes over the time, what each rank's link carries in a ring all-reduce.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, ElementConversion, Tensor};
use clap::Args;
use serde_json::json;

use super::median;
use xtoken_kernels::nccl::NcclBackend;
use xtoken_train::backend::{on_backend, OnBackend, TrainBackend};
use xtoken_train::cluster::parallel::{ExchangeSettings, Worker};
use xtoken_train::cluster::{free_port_pair, join_as_node, run_workers, Placement, Plan, Timeouts};
use xtoken_train::config::{DeviceKind, ExchangeChoice, ExchangeKind};

/// Arguments of `xtoken bench exchange`.
#[derive(Args, Clone)]
pub struct ExchangeBenchArgs {
    /// Processes (the ring) to start on this machine (ignored under a launcher, which starts
    /// them).
    #[arg(long, default_value_t = 2)]
    processes: usize,
    /// Values per all-reduce, one row each. The 1B student's gradients are 1235814400 values
    /// (4.9 GB in f32, 2.5 GB in bf16).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1048576,16777216,67108864"
    )]
    values: Vec<usize>,
    /// Timed all-reduces per size, after one warm-up that also checks the sum.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The device family: `ndarray` (the ring's CPU numbers in BENCHMARKS.md), `cpu`, `wgpu`
    /// or `cuda`.
    #[arg(long, default_value = "ndarray")]
    device: String,
    /// Device indices, one worker each (NCCL in this process).
    #[arg(long, value_delimiter = ',')]
    devices: Vec<usize>,
    /// `auto` (NCCL on CUDA), `nccl` or `ring`.
    #[arg(long, default_value = "auto")]
    exchange: String,
    /// The values' dtype: `f32` or `bf16`.
    #[arg(long, default_value = "f32")]
    dtype: String,
}

impl ExchangeBenchArgs {
    fn kind(&self) -> Result<DeviceKind> {
        Ok(self.device.parse()?)
    }

    fn dtype(&self) -> Result<DType> {
        match self.dtype.as_str() {
            "f32" => Ok(DType::F32),
            "bf16" if self.kind()? == DeviceKind::Ndarray => {
                bail!("--dtype bf16: ndarray holds f32 only; --device cpu (burn-flex) has bf16")
            }
            "bf16" => Ok(DType::BF16),
            other => bail!("--dtype {other:?}: expected \"f32\" or \"bf16\""),
        }
    }

    /// The exchange, NCCL or the ring, for the device.
    fn exchange(&self) -> Result<ExchangeKind> {
        let choice: ExchangeChoice = self.exchange.parse()?;
        Ok(choice
            .resolve(self.kind()?, usize::MAX)?
            .unwrap_or(ExchangeKind::Ring))
    }
}

/// Measures, or (under a launcher) takes part in the measurement as one process.
pub fn run(args: ExchangeBenchArgs) -> Result<()> {
    if args.rounds == 0 || args.values.contains(&0) {
        bail!("--rounds and every --values must be at least 1");
    }
    let (kind, exchange) = (args.kind()?, args.exchange()?);
    args.dtype()?;
    match Placement::from_env()? {
        Some(placement) if placement.world > 1 => {
            let job = Measure {
                args: &args,
                placement: Some(&placement),
                exchange,
            };
            let (_, seconds) = on_backend(kind, &args.devices, job)?;
            if placement.rank == 0 {
                for (values, s) in args.values.iter().zip(seconds) {
                    println!("{}", json!({ "values": values, "seconds": s }));
                }
            }
            Ok(())
        }
        _ => on_this_machine(&args, kind, exchange),
    }
}

/// The memory anchor and the workers of this process (with `placement`, as one process of
/// several), each size's seconds per all-reduce.
struct Measure<'a> {
    args: &'a ExchangeBenchArgs,
    placement: Option<&'a Placement>,
    exchange: ExchangeKind,
}

impl OnBackend for Measure<'_> {
    /// Per size: the memory pass's seconds, the all-reduce's seconds.
    type Output = (Vec<f64>, Vec<f64>);

    fn run<B: TrainBackend>(
        self,
        mut devices: Vec<B::Device>,
    ) -> xtoken_train::Result<Self::Output> {
        let args = self.args;
        let dtype = args
            .dtype()
            .map_err(|e| xtoken_train::Error::Config(e.to_string()))?;
        if self.exchange == ExchangeKind::Ring && self.placement.is_none() {
            devices = vec![devices[0].clone(); args.processes];
        }
        let memory = args
            .values
            .iter()
            .map(|&v| memory_pass::<B::InnerBackend>(v, dtype, args.rounds, &devices[0]))
            .collect();
        let settings = ExchangeSettings {
            kind: self.exchange,
            bucket_bytes: usize::MAX,
        };
        let (values, rounds) = (args.values.clone(), args.rounds);
        let measure = move |w: Worker, device: B::Device| {
            time_sizes::<B::InnerBackend>(&w, &values, rounds, dtype, &device)
        };
        let seconds = match self.placement {
            Some(placement) => {
                let hash = xxhash_rust::xxh3::xxh3_64(
                    format!("{:?} {} {:?}", args.values, args.rounds, args.dtype).as_bytes(),
                );
                let plan = Plan {
                    workers: devices.len(),
                    hash,
                };
                let (session, nodes) =
                    join_as_node(placement, plan, Timeouts::from_env()?, self.exchange)?;
                let seconds = session.run(move || {
                    run_workers::<B, _, _>(devices, Some(&nodes), settings, measure)
                })?;
                session.finish(0)?;
                seconds
            }
            None => run_workers::<B, _, _>(devices, None, settings, measure)?,
        };
        Ok((memory, seconds.into_iter().next().unwrap_or_default()))
    }
}

/// Seconds per all-reduce of each size, as `worker` (the sum of ones is checked first).
fn time_sizes<B: Backend + NcclBackend>(
    worker: &Worker,
    values: &[usize],
    rounds: usize,
    dtype: DType,
    device: &B::Device,
) -> xtoken_train::Result<Vec<f64>> {
    let mut seconds = Vec::with_capacity(values.len());
    for &n in values {
        let ones = Tensor::<B, 1>::ones([n], device).cast(dtype);
        let first: f32 = worker
            .sum_flat(ones.clone())?
            .slice(0..1)
            .into_scalar()
            .elem();
        if first != worker.count as f32 {
            return Err(xtoken_train::Error::Parallel(format!(
                "the all-reduce of {n} ones summed to {first}, not {}",
                worker.count
            )));
        }
        let start = Instant::now();
        for _ in 0..rounds {
            worker.sum_flat(ones.clone())?;
        }
        seconds.push(start.elapsed().as_secs_f64() / rounds as f64);
    }
    Ok(seconds)
}

/// Median seconds of `a + b` over `values` values on `device`: reads two tensors, writes one
/// (one value read back waits for the device).
fn memory_pass<B: Backend>(values: usize, dtype: DType, rounds: usize, device: &B::Device) -> f64 {
    let a = Tensor::<B, 1>::ones([values], device).cast(dtype);
    let b = a.clone() * 2.0;
    let _ = (a.clone() + b.clone()).slice(0..1).into_data();
    let times = (0..rounds.max(3))
        .map(|_| {
            let start = Instant::now();
            let c = a.clone() + b.clone();
            let _ = c.clone().slice(0..1).into_data();
            let elapsed = start.elapsed().as_secs_f64();
            drop(c);
            elapsed
        })
        .collect();
    median(times)
}

/// The anchors and this process's workers, then (the ring) the processes, then the table.
fn on_this_machine(
    args: &ExchangeBenchArgs,
    kind: DeviceKind,
    exchange: ExchangeKind,
) -> Result<()> {
    let n = match exchange {
        ExchangeKind::Ring => args.processes,
        ExchangeKind::Nccl => args.devices.len().max(1),
    };
    if exchange == ExchangeKind::Ring && n < 2 {
        bail!("--processes must be at least 2");
    }
    eprintln!(
        "one pass over memory, then {n} workers of this process over {}",
        exchange.name()
    );
    let job = Measure {
        args,
        placement: None,
        exchange,
    };
    let (memory, workers) = on_backend(kind, &args.devices, job)?;
    let processes = match exchange {
        ExchangeKind::Ring => Some(start_processes(args)?),
        ExchangeKind::Nccl => None,
    };
    print_table(args, n, &memory, &workers, processes.as_deref());
    Ok(())
}

/// Starts `--processes` copies of this command on this machine with torchrun's variables and
/// returns rank 0's seconds per size.
fn start_processes(args: &ExchangeBenchArgs) -> Result<Vec<f64>> {
    let port = free_port_pair()?;
    let exe = std::env::current_exe()?;
    let values: Vec<String> = args.values.iter().map(usize::to_string).collect();
    let mut children = Vec::new();
    for rank in 0..args.processes {
        let child = Command::new(&exe)
            .args(["bench", "exchange", "--rounds", &args.rounds.to_string()])
            .args(["--values", &values.join(",")])
            .args([
                "--device",
                &args.device,
                "--exchange",
                "ring",
                "--dtype",
                &args.dtype,
            ])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", args.processes.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting a process")?;
        children.push(child);
    }
    let mut outputs = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            let mut err = String::new();
            out.stderr.as_slice().read_to_string(&mut err)?;
            bail!("process {rank} failed:\n{err}");
        }
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    outputs[0]
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line)?;
            row["seconds"]
                .as_f64()
                .with_context(|| format!("rank 0 printed {line:?}"))
        })
        .collect()
}

/// NCCL's bus bandwidth of an all-reduce of `bytes` over `n` ranks in `seconds`, GB/s.
fn bus_gbs(bytes: f64, n: usize, seconds: f64) -> f64 {
    let share = match n {
        1 => 1.0,
        n => 2.0 * (n - 1) as f64 / n as f64,
    };
    share * bytes / seconds / 1e9
}

fn print_table(
    args: &ExchangeBenchArgs,
    n: usize,
    memory: &[f64],
    workers: &[f64],
    processes: Option<&[f64]>,
) {
    let bytes_per = if args.dtype == "bf16" { 2.0 } else { 4.0 };
    match processes {
        Some(_) => println!(
            "| values | MiB | dtype | memory pass (a + b) | {n} threads, one process | {n} processes \
             | processes / threads | processes / memory pass | processes: bus GB/s | memory GB/s |\n\
             |---|---|---|---|---|---|---|---|---|---|"
        ),
        None => println!(
            "| values | MiB | dtype | memory pass (a + b) | {n} GPU(s), NCCL | NCCL / memory pass | \
             NCCL: bus GB/s | memory GB/s |\n|---|---|---|---|---|---|---|---|"
        ),
    }
    for (i, &values) in args.values.iter().enumerate() {
        let (m, t) = (memory[i], workers[i]);
        let bytes = values as f64 * bytes_per;
        let row = format!(
            "| {values} | {:.0} | {} | {:.2} ms | {:.2} ms |",
            bytes / (1 << 20) as f64,
            args.dtype,
            m * 1e3,
            t * 1e3
        );
        let memory_gbs = 3.0 * bytes / m / 1e9;
        match processes {
            Some(p) => println!(
                "{row} {:.2} ms | {:.1}× | {:.0}× | {:.2} | {memory_gbs:.1} |",
                p[i] * 1e3,
                p[i] / t,
                p[i] / m,
                bus_gbs(bytes, n, p[i])
            ),
            None => println!(
                "{row} {:.1}× | {:.2} | {memory_gbs:.1} |",
                t / m,
                bus_gbs(bytes, n, t)
            ),
        }
    }
}
