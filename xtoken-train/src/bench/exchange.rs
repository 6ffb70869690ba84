//! `xtoken bench exchange`: the time of one all-reduce of a flat f32 tensor between processes
//! (xtoken-collective's ring over WebSocket, as `xtoken train` sums a step's gradients across
//! processes), against two anchors measured in the same run: the same all-reduce between
//! threads of one process, and one pass over the tensor's memory (`a + b`). Run alone, it starts
//! its processes on this machine; under torchrun or srun it measures between the processes the
//! launcher started, on as many machines.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::backend::{Autodiff, NdArray};
use burn::tensor::Tensor;
use clap::Args;
use serde_json::json;

use super::median;
use xtoken_train::cluster::parallel::{run_workers, Worker};
use xtoken_train::cluster::{free_port_pair, join_as_node, Placement, Plan, Timeouts};

type Cpu = Autodiff<NdArray>;

/// Arguments of `xtoken bench exchange`.
#[derive(Args, Clone)]
pub struct ExchangeBenchArgs {
    /// Processes to start on this machine (ignored under a launcher, which starts them).
    #[arg(long, default_value_t = 2)]
    processes: usize,
    /// f32 values per all-reduce, one row each.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1048576,16777216,67108864"
    )]
    values: Vec<usize>,
    /// Timed all-reduces per size, after one warm-up that also checks the sum.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

/// Measures, or (under a launcher) takes part in the measurement as one process.
pub fn run(args: ExchangeBenchArgs) -> Result<()> {
    if args.rounds == 0 || args.values.contains(&0) {
        bail!("--rounds and every --values must be at least 1");
    }
    match Placement::from_env()? {
        Some(placement) if placement.world > 1 => {
            let seconds = as_process(&placement, &args)?;
            if placement.rank == 0 {
                for (values, s) in args.values.iter().zip(seconds) {
                    println!("{}", json!({ "values": values, "seconds": s }));
                }
            }
            Ok(())
        }
        _ => on_this_machine(&args),
    }
}

/// One process of a measurement across processes: the seconds per all-reduce of each size.
fn as_process(placement: &Placement, args: &ExchangeBenchArgs) -> Result<Vec<f64>> {
    let hash = xxhash_rust::xxh3::xxh3_64(format!("{:?} {}", args.values, args.rounds).as_bytes());
    let plan = Plan { workers: 1, hash };
    let (session, nodes) = join_as_node(placement, plan, Timeouts::from_env()?)?;
    let (values, rounds) = (args.values.clone(), args.rounds);
    let seconds = session.run(move || {
        let each = run_workers::<Cpu, _, _>(vec![Default::default()], Some(&nodes), |w, _| {
            time_sizes(&w, &values, rounds)
        })?;
        Ok(each.into_iter().next().unwrap_or_default())
    })?;
    session.finish(0)?;
    Ok(seconds)
}

/// Seconds per all-reduce of each size, as `worker` (the sum of ones is checked first).
fn time_sizes(worker: &Worker, values: &[usize], rounds: usize) -> xtoken_train::Result<Vec<f64>> {
    let mut seconds = Vec::with_capacity(values.len());
    for &n in values {
        let ones = Tensor::<NdArray, 1>::ones([n], &Default::default());
        let first = worker.sum_flat(ones.clone())?.slice(0..1).into_scalar();
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

/// Both anchors here, then the processes, then the table.
fn on_this_machine(args: &ExchangeBenchArgs) -> Result<()> {
    let n = args.processes;
    if n < 2 {
        bail!("--processes must be at least 2");
    }
    eprintln!("one pass over memory, then {n} threads of this process, then {n} processes");
    let memory: Vec<f64> = args
        .values
        .iter()
        .map(|&v| memory_pass(v, args.rounds))
        .collect();
    let (values, rounds) = (args.values.clone(), args.rounds);
    let threads = run_workers::<Cpu, _, _>(vec![Default::default(); n], None, |w, _| {
        time_sizes(&w, &values, rounds)
    })?
    .into_iter()
    .next()
    .unwrap_or_default();
    let processes = start_processes(args)?;
    print_table(args, n, &memory, &threads, &processes);
    Ok(())
}

/// Median seconds of `a + b` over `values` f32 values: reads two tensors, writes one.
fn memory_pass(values: usize, rounds: usize) -> f64 {
    let a = Tensor::<NdArray, 1>::ones([values], &Default::default());
    let b = a.clone() * 2.0;
    let times = (0..rounds.max(3))
        .map(|_| {
            let start = Instant::now();
            let c = a.clone() + b.clone();
            let elapsed = start.elapsed().as_secs_f64();
            drop(c);
            elapsed
        })
        .collect();
    median(times)
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

fn print_table(
    args: &ExchangeBenchArgs,
    n: usize,
    memory: &[f64],
    threads: &[f64],
    processes: &[f64],
) {
    println!(
        "| f32 values | MiB | memory pass (a + b) | {n} threads, one process | {n} processes | \
         processes / threads | processes / memory pass | processes: MB/s of tensor |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (i, &values) in args.values.iter().enumerate() {
        let (m, t, p) = (memory[i], threads[i], processes[i]);
        let mib = values as f64 * 4.0 / (1 << 20) as f64;
        println!(
            "| {values} | {mib:.0} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1}× | {:.0}× | {:.0} |",
            m * 1e3,
            t * 1e3,
            p * 1e3,
            p / t,
            p / m,
            values as f64 * 4.0 / p / 1e6
        );
    }
}
