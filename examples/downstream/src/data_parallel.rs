//! The same loop as data-parallel processes on this machine (feature `collective`), as torchrun
//! or srun would start them: each process takes every `N`-th text of the batch, weights its
//! losses by its share of the whole batch's positions and chunks, and sums its gradients with
//! the others (xtoken's all-reduce) before each optimizer step; so every process must end with
//! the parameters of one process that trains on the combined batch, which this program then
//! trains itself and compares.

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Device, Tensor};
use xtoken::loss::{ce, pkl, LossParams, TeacherTargets};
use xtoken::models::CausalLm;
use xtoken::train::cluster::parallel::{Exchange, ExchangeSettings, Worker};
use xtoken::train::cluster::{
    free_port_pair, join_as_node, run_workers, Placement, Plan, Timeouts,
};
use xtoken::train::config::ExchangeKind;

use crate::own_loop::{student_inputs, teacher_logits, Setup, TEXTS};
use crate::{Arguments, Error, B};

/// How long the processes may take, together.
const LIMIT: Duration = Duration::from_secs(600);

/// Starts `processes` processes of this program, trains one on the combined batch, and fails
/// unless every process ended with its parameters.
pub fn run(args: &Arguments, processes: usize) -> Result<(), Error> {
    if let Some(out) = &args.parameters_out {
        return as_rank(args, out);
    }
    if processes < 2 {
        return Err(format!("--processes {processes}: at least 2").into());
    }
    let dir = std::env::temp_dir().join(format!("xtoken-downstream-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let outcome = compare(args, processes, &dir);
    std::fs::remove_dir_all(&dir).ok();
    outcome
}

/// Runs the processes, then one on the combined batch, and compares their parameters.
fn compare(args: &Arguments, processes: usize, dir: &Path) -> Result<(), Error> {
    let port = free_port_pair()?;
    let children = (0..processes)
        .map(|rank| -> Result<Child, Error> {
            let mut command = Command::new(std::env::current_exe()?);
            command
                .args(std::env::args().skip(1))
                .arg("--parameters-out")
                .arg(dir.join(format!("rank{rank}.f32")))
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", processes.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string());
            Ok(command.spawn()?)
        })
        .collect::<Result<Vec<Child>, Error>>()?;
    wait_all(children)?;
    println!("{processes} processes done; now one process on the combined batch");
    let alone = train(args, &Worker::alone(), &TEXTS, &Default::default())?;
    let initial = parameters(&Setup::new(args)?);
    let moved = largest_difference(&alone, &initial);
    if moved <= 1e-4 {
        return Err(format!("training did not move the parameters ({moved:e})").into());
    }
    for rank in 0..processes {
        let bytes = std::fs::read(dir.join(format!("rank{rank}.f32")))?;
        let theirs: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let worst = largest_difference(&alone, &theirs);
        println!("rank {rank} against one process: largest difference {worst:e}");
        if theirs.len() != alone.len() || worst > 1e-5 {
            return Err(
                format!("rank {rank} ended elsewhere: largest difference {worst:e}").into(),
            );
        }
    }
    println!("{processes} processes ended where one process on the combined batch ends");
    Ok(())
}

/// Waits for every child, killing them all past [`LIMIT`] or when one fails.
fn wait_all(mut children: Vec<Child>) -> Result<(), Error> {
    let deadline = Instant::now() + LIMIT;
    let mut done = vec![false; children.len()];
    while done.iter().any(|d| !d) {
        for (rank, child) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    children.iter_mut().for_each(|c| drop(c.kill()));
                    return Err(format!("process {rank} failed: {status}").into());
                }
                done[rank] = true;
            }
        }
        if Instant::now() > deadline {
            children.iter_mut().for_each(|c| drop(c.kill()));
            return Err(format!("the processes took over {} s", LIMIT.as_secs()).into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// One of the processes: joins the others, trains its share, writes its parameters to `out`.
fn as_rank(args: &Arguments, out: &Path) -> Result<(), Error> {
    let placement = Placement::from_env()?.ok_or("no RANK / WORLD_SIZE in the environment")?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (&args.student_tokenizer, &args.teacher_tokenizer, args.steps).hash(&mut hasher);
    let plan = Plan {
        workers: 1,
        hash: hasher.finish(),
    };
    // The ring: these processes train on the CPU (NCCL sums CUDA buffers: with burn's CUDA
    // backend, ExchangeKind::Nccl here is the whole change). Gradients travel in DDP's 25 MB
    // buckets.
    let settings = ExchangeSettings {
        kind: ExchangeKind::Ring,
        bucket_bytes: 25_000_000,
    };
    let (session, nodes) = join_as_node(&placement, plan, Timeouts::from_env()?, settings.kind)?;
    let (rank, world) = (placement.rank, placement.world);
    let texts: Vec<&str> = TEXTS.iter().skip(rank).step_by(world).copied().collect();
    let mut ended = run_workers::<B, _, _>(
        vec![Default::default()],
        Some(&nodes),
        settings,
        |worker, device| {
            train(args, &worker, &texts, &device)
                .map_err(|e| xtoken::train::error::Error::Parallel(format!("rank {rank}: {e}")))
        },
    )?;
    let values = ended.pop().ok_or("no worker")?;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(out, bytes)?;
    let mut fingerprint = std::collections::hash_map::DefaultHasher::new();
    values
        .iter()
        .for_each(|v| v.to_bits().hash(&mut fingerprint));
    session.finish(fingerprint.finish())?;
    Ok(())
}

/// The loop of [`crate::own_loop`] on `texts`, this worker's share of a batch: its means
/// weighted by its share of the batch's CE positions and aligned chunks, its gradients summed
/// with the other workers'. Returns the student's and W's parameters.
fn train(
    args: &Arguments,
    worker: &Worker,
    texts: &[&str],
    device: &Device<B>,
) -> Result<Vec<f32>, Error> {
    let setup = Setup::new(args)?;
    let batch = setup.batch(texts)?;
    let Setup {
        mut student,
        teacher,
        mut w,
        ..
    } = setup;
    let (ids, padding) = student_inputs::<B>(&batch, device);
    let params = LossParams::default();
    let plan = &batch.teachers[0].plan;
    let logits = teacher_logits(&teacher, &batch, device)?;
    let targets = TeacherTargets::new(Tensor::from_inner(logits), plan, &params)?;
    let positions = plan.student.next_token.iter().filter(|&&t| t >= 0).count();
    let mine = [positions as f64, plan.valid_chunks() as f64];
    let all = worker.sum_values::<B>(mine.to_vec(), device)?;
    let (ce_share, kd_share) = (mine[0] / all[0], mine[1] / all[1]);
    let mut student_optim = AdamWConfig::new().with_weight_decay(0.1).init();
    let mut w_optim = AdamWConfig::new().with_weight_decay(0.0).init();
    for step in 1..=args.steps {
        let logits = student.forward(ids.clone(), padding.clone())?;
        let kd = pkl::loss(logits.clone(), &targets, &w, &params)?;
        let ce = ce::loss(logits, &plan.student.next_token, &params)?;
        let values = vec![
            ce_share * ce.clone().into_scalar() as f64,
            kd_share * kd.clone().into_scalar() as f64,
        ];
        let mut grads = (ce.mul_scalar(ce_share) + kd.mul_scalar(kd_share)).backward();
        let student_grads = GradientsParams::from_module(&mut grads, &student);
        let w_grads = GradientsParams::from_module(&mut grads, &w);
        let exchange = Exchange {
            student: &student,
            student_grads,
            projections: vec![Some((&w, w_grads))],
            values,
        };
        let mut summed = worker.sum(exchange, device)?;
        let w_grads = summed.projection_grads.remove(0).ok_or("W's gradients")?;
        student = student_optim.step(1e-3, student, summed.student_grads);
        w = w_optim.step(1e-2, w, w_grads);
        if worker.leads() {
            let (ce, kd) = (summed.values[0], summed.values[1]);
            println!("step {step}: CE {ce:.4} · P-KL {kd:.4} (whole batch)");
        }
    }
    let mut values = parameters_of(&student);
    values.extend(parameters_of(&w));
    Ok(values)
}

/// The initial parameters, as [`train`] returns them.
fn parameters(setup: &Setup) -> Vec<f32> {
    let mut values = parameters_of(&setup.student);
    values.extend(parameters_of(&setup.w));
    values
}

/// Every float parameter of `module`, in its visiting order.
fn parameters_of<M: Module<B>>(module: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let data = param.val().into_data().convert::<f32>();
            self.0.extend(data.iter::<f32>());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(
        if a.len() == b.len() {
            0.0
        } else {
            f32::INFINITY
        },
        f32::max,
    )
}
