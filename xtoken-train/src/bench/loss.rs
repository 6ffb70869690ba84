//! `xtoken bench loss`: forward + backward of one teacher's P-KL or H-KL on CPU (`Autodiff<NdArray>`),
//! the fused row-chunked losses of `xtoken_core::loss` against the same math composed from
//! plain burn tensor ops. Both see the same random logits, W and common set, and must agree on
//! the loss value; time and peak heap (above the inputs) are measured per run.

use std::time::Instant;

use anyhow::{bail, Result};
use burn::backend::{Autodiff, NdArray};
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Distribution, IndexingUpdateOp, Int, Tensor, TensorData};
use clap::Args;
use xtoken_core::common::CommonSet;
use xtoken_core::common::CommonTables;
use xtoken_core::loss::{hkl, pkl, LossParams, TeacherTargets, TopK};
use xtoken_core::plan::{BatchPlan, ChunkPlan, MergeVariant, PlanItem};
use xtoken_core::projection::SparseProjection;

use super::alloc;

type A = Autodiff<NdArray>;

/// Options of `xtoken bench loss`.
#[derive(Args)]
pub struct LossBenchArgs {
    /// Student positions (one sequence); every position after the first is a 1-to-1 chunk.
    #[arg(long, default_value_t = 1024)]
    rows: usize,
    /// Student vocabulary (Llama-3.2).
    #[arg(long, default_value_t = 128_256)]
    student_vocab: usize,
    /// Teacher vocabulary (Qwen3's tokenizer).
    #[arg(long, default_value_t = 151_669)]
    teacher_vocab: usize,
    /// Teacher entries kept per chunk.
    #[arg(long, default_value_t = 8192)]
    top_k: usize,
    /// Rows the fused losses evaluate at once.
    #[arg(long, default_value_t = 64)]
    row_chunk: usize,
    /// Skip the naive composition (it needs several GB more).
    #[arg(long)]
    skip_naive: bool,
    /// Runs per measurement (the table reports the fastest).
    #[arg(long, default_value_t = 1)]
    repeats: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Which {
    Pkl,
    Hkl,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Pkl => "P-KL",
            Which::Hkl => "H-KL",
        }
    }
}

struct Inputs {
    student: Tensor<A, 3>,
    teacher: Tensor<A, 3>,
    plan: BatchPlan,
    w: SparseProjection,
    common: CommonSet,
}

/// Deterministic ids: a multiplicative hash of the position.
fn hash(i: usize, salt: u64) -> u64 {
    let mut x = (i as u64 ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 29;
    x.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ (x >> 32)
}

fn inputs(args: &LossBenchArgs) -> Result<Inputs> {
    let (n, vs, vt) = (args.rows, args.student_vocab, args.teacher_vocab);
    if n < 2 || vs < args.top_k || vt < args.top_k {
        bail!("need at least 2 rows and vocabularies of at least --top-k entries");
    }
    let device = Default::default();
    let student = Tensor::<A, 3>::random([1, n, vs], Distribution::Normal(0.0, 2.0), &device);
    let teacher = Tensor::<A, 3>::random([1, n, vt], Distribution::Normal(0.0, 2.0), &device);
    // W: 1–4 teacher ids per row with decaying weights, like the multi-token rule.
    let rows: Vec<Vec<(u32, f64)>> = (0..vs)
        .map(|s| {
            let len = 1 + (hash(s, 1) % 4) as usize;
            (0..len)
                .map(|i| {
                    (
                        (hash(s * 4 + i, 2) % vt as u64) as u32,
                        0.9 * 0.1f64.powi(i as i32),
                    )
                })
                .collect()
        })
        .collect();
    let w = SparseProjection::from_rows(&rows, vt, 4, None)?;
    // H-KL's relaxed common set: a 1-to-1 strict set over about 70 % of the student vocabulary,
    // the other rows paired with their top-1 teacher token under W (many-to-one).
    let mut teacher_ids: Vec<u32> = (0..vt as u32).collect();
    for i in (1..vt).rev() {
        teacher_ids.swap(i, (hash(i, 3) % (i as u64 + 1)) as usize);
    }
    let pairs: Vec<(u32, u32)> = (0..vs as u32)
        .filter(|&s| hash(s as usize, 4) % 10 < 7)
        .zip(teacher_ids)
        .collect();
    let common = CommonSet::relaxed(&CommonSet::new(pairs, vs)?, &w);
    let plan = ChunkPlan {
        student: (0..n as u32).map(|p| (p, 1)).collect(),
        teacher: (0..n as u32).map(|p| (p, 1)).collect(),
        student_len: n as u32,
        teacher_len: n as u32,
    };
    let ids: Vec<u32> = (0..n).map(|p| (hash(p, 5) % vs as u64) as u32).collect();
    let item = PlanItem {
        plan: &plan,
        student_ids: &ids,
        teacher_ids: &ids,
    };
    let plan = BatchPlan::new(&[item], n, n, MergeVariant::FirstToken)?;
    Ok(Inputs {
        student,
        teacher,
        plan,
        w,
        common,
    })
}

/// The fused losses: loss value and the student gradient's sum (to check both paths agree).
fn fused(inputs: &Inputs, which: Which, params: &LossParams) -> Result<(f64, Grad)> {
    let student = inputs.student.clone().require_grad();
    let targets = TeacherTargets::new(inputs.teacher.clone(), &inputs.plan, params)?;
    let [_, _, vs] = student.dims();
    let vt = targets.teacher_vocab();
    let loss = match which {
        Which::Pkl => {
            let w = pkl::LearnableProjection::<A>::new(&inputs.w, vs, &Default::default())?;
            pkl::loss(student.clone(), &targets, &w, params)?
        }
        Which::Hkl => {
            let tables = CommonTables::new(&inputs.common, vs, vt)?;
            hkl::loss(student.clone(), &targets, &tables, params)?
        }
    };
    finish(student, loss)
}

/// Runs the backward step; returns the loss value and the student gradient.
fn finish(student: Tensor<A, 3>, loss: Tensor<A, 1>) -> Result<(f64, Grad)> {
    let value = scalar(loss.clone());
    let grads = loss.backward();
    let grad = student
        .grad(&grads)
        .ok_or_else(|| anyhow::anyhow!("no gradient reached the student logits"))?;
    Ok((value, grad))
}

type Grad = Tensor<NdArray, 3>;

fn scalar(t: Tensor<A, 1>) -> f64 {
    t.into_scalar() as f64
}

/// The same loss composed from burn tensor ops, as one would write it first.
fn naive(inputs: &Inputs, which: Which, k: usize, eps: f64) -> Result<(f64, Grad)> {
    let device = Default::default();
    let student = inputs.student.clone().require_grad();
    let [_, t, vs] = student.dims();
    let [_, _, vt] = inputs.teacher.dims();
    let n = t - 1;
    let s = student.clone().slice([0..1, 0..n, 0..vs]).reshape([n, vs]);
    let teacher = inputs
        .teacher
        .clone()
        .slice([0..1, 0..n, 0..vt])
        .reshape([n, vt]);
    let (top_logp, top_ids) = log_softmax(teacher, 1).topk_with_indices(k, 1);
    let q = top_logp.clone().exp();
    let loss = match which {
        Which::Pkl => {
            let kw = inputs.w.top_k();
            // Empty slots scatter into a spare column vt.
            let idx: Vec<i64> = inputs
                .w
                .indices()
                .iter()
                .map(|&i| if i < 0 { vt as i64 } else { i as i64 })
                .collect();
            let idx = Tensor::<A, 1, Int>::from_data(TensorData::new(idx, [vs * kw]), &device);
            let w = Tensor::<A, 1>::from_data(
                TensorData::new(inputs.w.weights().to_vec(), [vs * kw]),
                &device,
            );
            // The re-normalization's denominator: the student mass W maps, `Σ_s r_s p_s`.
            let row_mass: Vec<f32> = (0..vs)
                .map(|s| (0..kw).map(|k| inputs.w.weights()[s * kw + k]).sum())
                .collect();
            let row_mass = Tensor::<A, 1>::from_data(TensorData::new(row_mass, [vs]), &device);
            let p = softmax(s, 1);
            let mapped = (p.clone() * row_mass.reshape([1, vs])).sum_dim(1);
            let contrib = (p.unsqueeze_dim::<3>(2) * w.reshape([1, vs, kw])).reshape([n, vs * kw]);
            let projected = Tensor::<A, 2>::zeros([n, vt + 1], &device).scatter(
                1,
                idx.reshape([1, vs * kw]).expand([n, vs * kw]),
                contrib,
                IndexingUpdateOp::Add,
            );
            let at_top = projected.gather(1, top_ids) / mapped;
            (q * (top_logp - (at_top + eps).log())).sum() / n as f64
        }
        Which::Hkl => {
            // Per student id its teacher partner (the spare column vt when none); per teacher id
            // whether it is in C.
            let mut student_partner = vec![vt as i64; vs];
            let mut uncommon = vec![1.0f32; vs];
            let mut teacher_in = vec![0.0f32; vt];
            for &(s, t) in inputs.common.pairs() {
                student_partner[s as usize] = t as i64;
                uncommon[s as usize] = 0.0;
                teacher_in[t as usize] = 1.0;
            }
            // The teacher's kept entries, dense over V_T + 1 (zero elsewhere), read at every
            // student id's partner: one common-KL term per pair.
            let dense = |x: Tensor<A, 2>| {
                Tensor::<A, 2>::zeros([n, vt + 1], &device).scatter(
                    1,
                    top_ids.clone(),
                    x,
                    IndexingUpdateOp::Add,
                )
            };
            let partner =
                Tensor::<A, 1, Int>::from_data(TensorData::new(student_partner, [vs]), &device)
                    .reshape([1, vs])
                    .expand([n, vs]);
            let q_at = dense(q.clone()).gather(1, partner.clone());
            let lq_at = dense(top_logp.clone()).gather(1, partner);
            let log_p = log_softmax(s, 1);
            let common = (q_at * (lq_at - log_p.clone())).sum();
            let teacher_in = Tensor::<A, 1>::from_data(TensorData::new(teacher_in, [vt]), &device);
            let in_common = teacher_in
                .select(0, top_ids.reshape([n * k]))
                .reshape([n, k]);
            let uncommon = Tensor::<A, 1>::from_data(TensorData::new(uncommon, [vs]), &device);
            let student_rest = (log_p.exp() * uncommon.reshape([1, vs])).sort_descending(1);
            let teacher_rest = (q * (in_common.neg() + 1.0)).sort_descending(1);
            let teacher_rest =
                Tensor::cat(vec![teacher_rest, Tensor::zeros([n, vs - k], &device)], 1);
            (common + (student_rest - teacher_rest).abs().sum()) / n as f64
        }
    };
    finish(student, loss)
}

struct Run {
    seconds: f64,
    peak_bytes: usize,
    value: f64,
    grad_l1: f64,
}

/// Times `f` and its peak heap; the gradient check runs after the measurement.
fn measure(repeats: usize, f: impl Fn() -> Result<(f64, Grad)>) -> Result<Run> {
    let mut best: Option<Run> = None;
    for _ in 0..repeats.max(1) {
        let base = alloc::current();
        alloc::reset_peak();
        let start = Instant::now();
        let (value, grad) = f()?;
        let seconds = start.elapsed().as_secs_f64();
        let peak_bytes = alloc::peak_above(base);
        let run = Run {
            seconds,
            peak_bytes,
            value,
            grad_l1: grad.abs().sum().into_scalar() as f64,
        };
        if best.as_ref().is_none_or(|b| run.seconds < b.seconds) {
            best = Some(run);
        }
    }
    best.ok_or_else(|| anyhow::anyhow!("no run"))
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Runs the benchmark and prints the Markdown table.
pub fn run(args: LossBenchArgs) -> Result<()> {
    alloc::enable();
    eprintln!(
        "building inputs: {} rows, V_S = {}, V_T = {}, K = {}",
        args.rows, args.student_vocab, args.teacher_vocab, args.top_k
    );
    let inputs = inputs(&args)?;
    let input_bytes = 4 * args.rows * (args.student_vocab + args.teacher_vocab);
    let params = LossParams {
        top_k: TopK::K(args.top_k),
        row_chunk: args.row_chunk,
        ..Default::default()
    };
    println!(
        "Forward + backward of one teacher's loss, `Autodiff<NdArray>`, {} rows, V_S = {}, V_T = {}, \
         K = {}, row chunk {}, {} threads. Peak = heap high-water mark above the inputs ({:.0} MiB \
         of logits), the gradient included.\n",
        args.rows,
        args.student_vocab,
        args.teacher_vocab,
        args.top_k,
        args.row_chunk,
        rayon::current_num_threads(),
        mib(input_bytes)
    );
    println!(
        "| loss | path | time (s) | peak (MiB) | loss value | Σ|∂L/∂z| | speed-up | memory ratio |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for which in [Which::Pkl, Which::Hkl] {
        eprintln!("{}: fused", which.name());
        let fast = measure(args.repeats, || fused(&inputs, which, &params))?;
        println!(
            "| {} | fused | {:.2} | {:.0} | {:.6} | {:.6} | | |",
            which.name(),
            fast.seconds,
            mib(fast.peak_bytes),
            fast.value,
            fast.grad_l1
        );
        if args.skip_naive {
            continue;
        }
        eprintln!("{}: naive", which.name());
        let slow = measure(args.repeats, || {
            naive(&inputs, which, args.top_k, params.eps)
        })?;
        println!(
            "| {} | naive burn ops | {:.2} | {:.0} | {:.6} | {:.6} | {:.1}× | {:.1}× |",
            which.name(),
            slow.seconds,
            mib(slow.peak_bytes),
            slow.value,
            slow.grad_l1,
            slow.seconds / fast.seconds,
            slow.peak_bytes as f64 / fast.peak_bytes.max(1) as f64
        );
        let agree = (slow.value - fast.value).abs() <= 1e-3 * (1.0 + fast.value.abs());
        if !agree {
            bail!(
                "{}: the fused loss {} and the naive loss {} disagree",
                which.name(),
                fast.value,
                slow.value
            );
        }
    }
    Ok(())
}
