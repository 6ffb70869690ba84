//! `xtoken bench kernels`: one teacher's P-KL forward and backward (gradients to the student
//! logits and to W's values), its H-KL forward and backward, and its top-K extraction, through
//! `XTokenBackend::xt_distill` and `xt_teacher_entries` on a GPU backend: the cubecl
//! kernels, or (`--path portable`) the portable host path for comparison; then AdamW with the
//! clipping of its gradients over a Llama-3.2-1B-shaped student's parameter tensors, composed
//! of burn ops and fused (`XTokenBackend::xt_adamw`). The time is set against the HBM floor: the
//! bytes the evaluation must move at least once, over the copy bandwidth measured in the same
//! run. A last table gives the bytes each kernel's launches read and write, as their launch
//! plans declare them (`xtoken_kernels::traffic`), against the same floor.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Int, Tensor, TensorData};
use clap::{Args, ValueEnum};
use xtoken_kernels::layout::ProjectionLayout;
use xtoken_kernels::memory::DeviceMemory;
use xtoken_kernels::traffic::{by_kernel, recording, total, Launch};
use xtoken_kernels::{
    host, CommonPairs, DistillSpec, EntriesSpec, GradRequest, LossKind, MergePlan,
    ProjectionTensors, TeacherEntries, XTokenBackend,
};

use crate::cli::models::DtypeArg;
use xtoken_kernels::cuda_sources;
use xtoken_train::backend;
use xtoken_train::config::DeviceKind;
#[cfg(feature = "cuda-sources")]
use xtoken_train::output::write_dir;
use xtoken_train::output::{self, Names, Own};

/// Options of `xtoken bench kernels`.
#[derive(Args)]
pub struct KernelBenchArgs {
    /// Compared rows (one 1-to-1 chunk each).
    #[arg(long, default_value_t = 4096)]
    rows: usize,
    /// Student vocabulary (Llama-3.2).
    #[arg(long, default_value_t = 128_256)]
    student_vocab: usize,
    /// Teacher vocabulary (Qwen3's model width).
    #[arg(long, default_value_t = 151_936)]
    teacher_vocab: usize,
    /// Teacher entries kept per row.
    #[arg(long, default_value_t = 8192)]
    top_k: usize,
    /// W's slots per student token.
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Rows per P-KL chunk (the `[chunk, V_T]` scatter buffer).
    #[arg(long, default_value_t = 512)]
    row_chunk: usize,
    /// Timed runs (after one warm-up); the table gives the fastest and the median.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Student logits' dtype (the gradient has the same).
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    dtype: DtypeArg,
    /// `cuda` or `wgpu` in a build with that feature; `ndarray` (CPU) runs the host
    /// implementation in place.
    #[arg(long, value_enum, required_unless_present = "emit_cuda")]
    device: Option<KernelDevice>,
    /// Instead of measuring: write the CUDA C++ source of every X-Token kernel a training
    /// step, `xtoken eval` and on-policy sampling launch (f32, bf16, f16; sm_90 and sm_80), as
    /// cubecl-cuda would compile it, into this new directory with `manifest.tsv`; no GPU needed
    /// (`scripts/cuda-compile.sh DIR` compiles them with NVRTC). Needs a build with the
    /// feature `cuda-sources` (on with `cuda`).
    #[arg(long, value_name = "DIR")]
    emit_cuda: Option<std::path::PathBuf>,
    /// `kernels` (cubecl) or `portable` (row chunks through host memory).
    #[arg(long, value_enum, default_value_t = PathArg::Kernels)]
    path: PathArg,
    /// The AdamW student's hidden width (Llama-3.2-1B: 2048; MLP 4×, K/V a quarter).
    #[arg(long, default_value_t = 2048)]
    hidden: usize,
    /// The AdamW student's layers (Llama-3.2-1B: 16; 9 tensors each, with the embedding and
    /// the final norm 146).
    #[arg(long, default_value_t = 16)]
    layers: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KernelDevice {
    Ndarray,
    Cuda,
    Wgpu,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PathArg {
    Kernels,
    Portable,
}

pub fn run(args: KernelBenchArgs) -> Result<()> {
    if let Some(dir) = &args.emit_cuda {
        // The output rule first, in every build: DIR is new, empty, or an earlier output.
        output::Inputs::new().check(dir, &cuda_sources_dir())?;
        return emit_cuda(dir);
    }
    let Some(device) = args.device else {
        bail!("--device is required (or --emit-cuda DIR)");
    };
    if args.rows == 0 || args.runs == 0 || args.slots == 0 || args.hidden < 4 {
        bail!("--rows, --runs and --slots must be positive, --hidden at least 4");
    }
    if args.top_k == 0 || args.top_k > args.teacher_vocab {
        bail!("--top-k must be between 1 and --teacher-vocab");
    }
    match device {
        KernelDevice::Ndarray => run_on::<burn::backend::NdArray>(&args, "CPU (ndarray)"),
        #[cfg(feature = "cuda")]
        KernelDevice::Cuda => {
            backend::start::<burn::backend::Cuda>(DeviceKind::Cuda, &[Default::default()])?;
            run_on::<burn::backend::Cuda>(&args, "CUDA")
        }
        #[cfg(feature = "wgpu")]
        KernelDevice::Wgpu => {
            backend::start::<burn::backend::Wgpu>(DeviceKind::Wgpu, &[Default::default()])?;
            run_on::<burn::backend::Wgpu>(&args, "wgpu")
        }
        #[allow(unreachable_patterns)]
        KernelDevice::Cuda => Ok(backend::check_available(DeviceKind::Cuda)?),
        #[allow(unreachable_patterns)]
        KernelDevice::Wgpu => Ok(backend::check_available(DeviceKind::Wgpu)?),
    }
}

/// What `--emit-cuda` writes: the kernels' sources, the manifest, and what
/// `scripts/cuda-compile.sh` adds (the PTX, the report).
fn cuda_sources_dir() -> Own<'static> {
    Own::Dir {
        what: "`xtoken bench kernels --emit-cuda`",
        names: Names::of([cuda_sources::MANIFEST, "report.md"])
            .pattern("sm_", ".cu")
            .pattern("sm_", ".error")
            .pattern("sm_", ".ptx"),
        signature: cuda_sources::MANIFEST,
        signed: cuda_sources::is_manifest,
    }
}

/// Writes every kernel's CUDA source and prints what was written, per architecture.
#[cfg(feature = "cuda-sources")]
fn emit_cuda(dir: &std::path::Path) -> Result<()> {
    use xtoken_kernels::cuda_sources::{emit, ARCHS};
    eprintln!("recording the kernels' CUDA sources into {}", dir.display());
    let written = write_dir(dir, |tmp| {
        emit(tmp, &ARCHS).map_err(|e| xtoken_train::error::Error::Run(e.to_string()))
    })?;
    println!("| arch | kernels | of them X-Token's | cubecl could not write |");
    println!("|---|---:|---:|---:|");
    let mut failed = 0;
    for (arch, kernels) in &written {
        let ours = kernels.iter().filter(|k| k.origin() == "xtoken").count();
        let bad: Vec<_> = kernels.iter().filter(|k| k.source.is_err()).collect();
        failed += bad.len();
        println!("| sm_{arch} | {} | {ours} | {} |", kernels.len(), bad.len());
    }
    println!(
        "\nWritten: {}/sm_*.cu and {}/manifest.tsv; compile them with \
         `scripts/cuda-compile.sh {}`.",
        dir.display(),
        dir.display(),
        dir.display()
    );
    if failed > 0 {
        bail!("cubecl could not write {failed} kernels as CUDA; their .error files say why");
    }
    Ok(())
}

#[cfg(not(feature = "cuda-sources"))]
fn emit_cuda(_: &std::path::Path) -> Result<()> {
    bail!("this xtoken was built without CUDA sources; rebuild with --features cuda-sources (or cuda)")
}

struct Inputs<B: Backend> {
    teacher_logits: Tensor<B, 3>,
    teacher_spec: EntriesSpec,
    logits: Tensor<B, 3>,
    entries: TeacherEntries<B>,
    projection: ProjectionTensors<B>,
    spec: DistillSpec,
    hybrid_spec: DistillSpec,
}

impl KernelBenchArgs {
    /// Rows, student and teacher vocabularies, teacher entries and W slots.
    fn sizes(&self) -> (usize, usize, usize, usize, usize) {
        (
            self.rows,
            self.student_vocab,
            self.teacher_vocab,
            self.top_k,
            self.slots,
        )
    }
}

/// Random logits, teacher entries (K distinct ids per row, spread over the vocabulary) and W
/// (1..=slots ids per student token), all built on the device or uploaded once.
fn inputs<B: XTokenBackend>(args: &KernelBenchArgs, device: &B::Device) -> Result<Inputs<B>> {
    let (n, vs, vt, k, kw) = args.sizes();
    let logits = Tensor::<B, 3>::random([1, n, vs], Distribution::Normal(0.0, 2.0), device)
        .cast(args.dtype.dtype());
    let teacher_logits = Tensor::<B, 3>::random([1, n, vt], Distribution::Normal(0.0, 2.0), device)
        .cast(args.dtype.dtype());
    let step = (vt / k).max(1);
    let ids: Vec<i32> = (0..n * k)
        .map(|i| {
            let (row, j) = (i / k, i % k);
            ((row * 7919 + j * step) % vt) as i32
        })
        .collect();
    let logp = vec![-(k as f32).ln(); n * k];
    let entries = TeacherEntries {
        ids: Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [n, k]), device).into_primitive(),
        logp: Tensor::<B, 2>::from_data(TensorData::new(logp, [n, k]), device)
            .into_primitive()
            .tensor(),
        k,
        vocab: vt,
        confidence: None,
        ids_in_vocab: false,
    };
    let projection = projection::<B>(vs, vt, kw, device)?;
    let merge = MergePlan {
        rows: n,
        predict_row: (0..n as u32).map(Some).collect(),
        continuation: Vec::new(),
    };
    let teacher_spec = EntriesSpec {
        merge: merge.clone(),
        top_k: k,
        tau: 1.0,
        row_chunk: args.row_chunk,
        next_token: None,
    };
    let common = common_pairs(vs, vt)?;
    let spec = DistillSpec {
        loss: LossKind::Pkl,
        merge,
        tau: 1.0,
        row_chunk: args.row_chunk,
        common: None,
        lambda_kl: 1.0,
        lambda_uld: 1.0,
        eps: 1e-10,
    };
    let hybrid_spec = DistillSpec {
        loss: LossKind::Hkl,
        common: Some(Arc::new(common)),
        ..spec.clone()
    };
    Ok(Inputs {
        teacher_logits,
        teacher_spec,
        logits,
        entries,
        projection,
        spec,
        hybrid_spec,
    })
}

/// W with 1..=`kw` teacher ids per student token, spread over the teacher vocabulary.
fn projection<B: Backend>(
    vs: usize,
    vt: usize,
    kw: usize,
    device: &B::Device,
) -> Result<ProjectionTensors<B>> {
    let mut indices = vec![-1i32; vs * kw];
    let mut weights = vec![0.0f32; vs * kw];
    for s in 0..vs {
        let used = 1 + s % kw;
        for j in 0..used {
            indices[s * kw + j] = ((s * 104_729 + j * 7_368_787) % vt) as i32;
            weights[s * kw + j] = 1.0 / used as f32;
        }
    }
    // Laid out once, as a run's W is.
    let ids = indices.iter().map(|&t| t as i64).collect();
    let layout = ProjectionLayout::new(ids, [vs, kw], vt)?;
    Ok(ProjectionTensors {
        indices: Tensor::<B, 2, Int>::from_data(TensorData::new(indices, [vs, kw]), device)
            .into_primitive(),
        weights: Tensor::<B, 2>::from_data(TensorData::new(weights, [vs, kw]), device)
            .into_primitive()
            .tensor(),
        layout: Some(layout),
    })
}

/// H-KL's common set: about 70 % of the student vocabulary, 1-to-1.
fn common_pairs(vs: usize, vt: usize) -> Result<CommonPairs> {
    let pairs: Vec<(u32, u32)> = (0..vs as u32)
        .filter(|&s| (s as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60 < 11)
        .enumerate()
        .map(|(i, s)| (s, ((i * 7_368_787) % vt) as u32))
        .collect();
    let mut seen = vec![false; vt];
    let pairs: Vec<(u32, u32)> = pairs
        .into_iter()
        .filter(|&(_, t)| !std::mem::replace(&mut seen[t as usize], true))
        .collect();
    Ok(CommonPairs::new(&pairs, vs, vt)?)
}

/// What one timed run evaluates.
#[derive(Clone, Copy)]
enum Op {
    /// P-KL forward and backward.
    Loss,
    /// H-KL forward and backward.
    Hybrid,
    /// The teacher's top-K extraction.
    TopK,
}

/// One evaluation, waited for.
fn evaluate<B: XTokenBackend>(
    inputs: &Inputs<B>,
    op: Op,
    path: PathArg,
    device: &B::Device,
) -> Result<f64> {
    let want = GradRequest {
        logits: true,
        weights: true,
    };
    let start = Instant::now();
    match op {
        Op::Loss => {
            let logits = inputs.logits.clone().into_primitive().tensor();
            let projection = Some(inputs.projection.clone());
            let entries = inputs.entries.clone();
            let out = match path {
                PathArg::Kernels => B::xt_distill(logits, entries, projection, &inputs.spec, want)?,
                PathArg::Portable => {
                    host::distill::<B>(logits, entries, projection, &inputs.spec, want)?
                }
            };
            B::sync(device)?;
            drop(out);
        }
        Op::Hybrid => {
            let logits = inputs.logits.clone().into_primitive().tensor();
            let entries = inputs.entries.clone();
            let spec = &inputs.hybrid_spec;
            let want = GradRequest {
                logits: true,
                weights: false,
            };
            let out = match path {
                PathArg::Kernels => B::xt_distill(logits, entries, None, spec, want)?,
                PathArg::Portable => host::distill::<B>(logits, entries, None, spec, want)?,
            };
            B::sync(device)?;
            drop(out);
        }
        Op::TopK => {
            let logits = inputs.teacher_logits.clone().into_primitive().tensor();
            let out = match path {
                PathArg::Kernels => B::xt_teacher_entries(logits, &inputs.teacher_spec)?,
                PathArg::Portable => host::teacher_entries::<B>(logits, &inputs.teacher_spec)?,
            };
            B::sync(device)?;
            drop(out);
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Device copy bandwidth in bytes/s: the best of five `y = x · 1` over as many f32 as the
/// logits have, between 64 MiB and 1 GiB (the kernel reads and writes every byte once).
fn copy_bandwidth<B: Backend>(elements: usize, device: &B::Device) -> Result<f64> {
    let elements = elements.clamp(1 << 24, 1 << 28);
    let x = Tensor::<B, 1>::ones([elements], device);
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        let start = Instant::now();
        let y = x.clone().mul_scalar(1.0);
        B::sync(device)?;
        best = best.min(start.elapsed().as_secs_f64());
        drop(y);
    }
    Ok(2.0 * 4.0 * elements as f64 / best)
}

fn run_on<B: XTokenBackend + DeviceMemory>(args: &KernelBenchArgs, place: &str) -> Result<()> {
    let device = B::Device::default();
    let (n, vs, vt, k, kw) = args.sizes();
    eprintln!("measuring the copy bandwidth");
    let bandwidth = copy_bandwidth::<B>(n * vs, &device)?;
    eprintln!("building inputs: {n} rows, V_S = {vs}, V_T = {vt}, K = {k}");
    let inputs = inputs::<B>(args, &device)?;
    B::sync(&device)?;
    let before = B::reserved_bytes(&device);
    let element = match args.dtype.dtype() {
        DType::F32 => 4,
        _ => 2,
    };
    println!(
        "On {place}, {} path, {n} rows, V_S = {vs}, V_T = {vt}, K = {k}, W slots {kw}, row chunk \
         {}, {} logits; copy bandwidth {:.0} GB/s. Floor = bytes that must move once over that \
         bandwidth.\n",
        match args.path {
            PathArg::Kernels => "`xt_distill` / `xt_teacher_entries`",
            PathArg::Portable => "portable `host::`",
        },
        args.row_chunk,
        args.dtype.name(),
        bandwidth / 1e9
    );
    println!(
        "| operation | dtype | best (ms) | median (ms) | bytes moved (GB) | floor (ms) | best / floor | reserved (GiB) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    // P-KL: read the logits, write their gradient; read the teacher's ids and
    // log-probabilities; read W's ids and weights and write W's gradient. Top-K: read the
    // teacher's logits, write K ids and log-probabilities per row.
    let operations = [
        (
            Op::Loss,
            "P-KL forward + backward",
            2 * n * vs * element + n * k * 8 + vs * kw * 12,
        ),
        (
            Op::Hybrid,
            "H-KL forward + backward",
            2 * n * vs * element + n * k * 8,
        ),
        (Op::TopK, "teacher top-K", n * vt * element + n * k * 8),
    ];
    let mut traffic = Vec::new();
    for (op, name, floor_bytes) in operations {
        eprintln!("{name}");
        // The warm-up run records what each launch declares it moves.
        let (warm, launches) = recording(|| evaluate(&inputs, op, args.path, &device));
        warm?;
        let pass = match op {
            Op::TopK => n * vt * element,
            Op::Loss | Op::Hybrid => n * vs * element,
        };
        traffic.push((name, launches, pass, floor_bytes));
        let mut times = Vec::with_capacity(args.runs);
        for i in 0..args.runs {
            eprint!("\rrun {}/{}", i + 1, args.runs);
            times.push(evaluate(&inputs, op, args.path, &device)?);
        }
        eprintln!();
        let row = Row {
            name,
            dtype: args.dtype.name(),
            floor_bytes,
        };
        row.print::<B>(times, bandwidth, before, &device);
    }
    drop(inputs);
    adamw_rows::<B>(args, bandwidth, &device)?;
    traffic_table(&traffic);
    Ok(())
}

/// Per operation, what each kernel's launches declare they read and write ([`traffic`]), in
/// passes over the operation's logits (`[rows, V]` in their dtype) and in GB, against the floor.
fn traffic_table(ops: &[(&str, Vec<Launch>, usize, usize)]) {
    println!(
        "\nBytes per launch, as each launch plan declares them (one evaluation; a pass = one \
         read or write of the operation's `[rows, V]` logits):\n"
    );
    println!(
        "| operation | kernel | launches | logits read (passes) | gradient read (passes) | \
         gradient written (passes) | other (GB) | total (GB) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (name, launches, pass, floor) in ops {
        if launches.is_empty() {
            println!("| {name} | (the host path declares no launches) | | | | | | |");
            continue;
        }
        let passes = |b: u64| b as f64 / *pass as f64;
        let gb = |b: u64| b as f64 / 1e9;
        for k in by_kernel(launches) {
            println!(
                "| {name} | `{}` | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} |",
                k.kernel,
                k.launches,
                passes(k.read.logits),
                passes(k.read.gradient),
                passes(k.written.gradient),
                gb(k.read.other + k.written.other),
                gb(k.read.total() + k.written.total()),
            );
        }
        let (read, written) = total(launches);
        let all = read.total() + written.total();
        println!(
            "| **{name}** | **all {} launches** | | **{:.2}** | **{:.2}** | **{:.2}** | **{:.3}** | \
             **{:.2} = {:.1}× the floor's {:.2}** |",
            launches.len(),
            passes(read.logits),
            passes(read.gradient),
            passes(written.gradient),
            gb(read.other + written.other),
            gb(all),
            all as f64 / *floor as f64,
            *floor as f64 / 1e9,
        );
    }
}

/// One line of the table.
struct Row<'a> {
    name: &'a str,
    dtype: &'a str,
    floor_bytes: usize,
}

impl Row<'_> {
    fn print<B: DeviceMemory>(
        &self,
        mut times: Vec<f64>,
        bandwidth: f64,
        before: Option<u64>,
        device: &B::Device,
    ) {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        times.sort_by(f64::total_cmp);
        let (best, median) = (times[0], times[times.len() / 2]);
        let floor = self.floor_bytes as f64 / bandwidth;
        let peak = match (before, B::reserved_bytes(device)) {
            (Some(b), Some(p)) => format!("{:.2} ({:.2} before)", gib(p), gib(b)),
            _ => "n/a".into(),
        };
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}× | {peak} |",
            self.name,
            self.dtype,
            best * 1e3,
            median * 1e3,
            self.floor_bytes as f64 / 1e9,
            floor * 1e3,
            best / floor,
        );
    }
}

/// The shapes of a Llama-3.2-1B-like student's parameters at `hidden` width: per layer the
/// attention's q, k, v, o, the MLP's gate, up, down and two norms; the embedding (tied) and the
/// final norm.
fn student_shapes(hidden: usize, layers: usize, vocab: usize) -> Vec<Vec<usize>> {
    let (h, kv, mlp) = (hidden, hidden / 4, hidden * 4);
    let layer = [
        vec![h, h],
        vec![kv, h],
        vec![kv, h],
        vec![h, h],
        vec![mlp, h],
        vec![mlp, h],
        vec![h, mlp],
        vec![h],
        vec![h],
    ];
    let mut shapes: Vec<Vec<usize>> = (0..layers).flat_map(|_| layer.clone()).collect();
    shapes.push(vec![vocab, h]);
    shapes.push(vec![h]);
    shapes
}

/// AdamW after the clipping of its gradients (scale 0.5) over every tensor of the student, from
/// a step with moments: burn's ops composed (one launch per op, as burn's `AdamW` and a separate
/// clipping run), and one `xt_adamw` per tensor. The floor reads parameter, gradient and both
/// moments and writes three of them: 28 bytes per f32 parameter.
fn adamw_rows<B: XTokenBackend + DeviceMemory>(
    args: &KernelBenchArgs,
    bandwidth: f64,
    device: &B::Device,
) -> Result<()> {
    use xtoken_kernels::adamw::{composed, AdamWStep, Moments};
    let shapes = student_shapes(args.hidden, args.layers, args.student_vocab);
    let params: usize = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
    eprintln!("AdamW over {} tensors, {params} parameters", shapes.len());
    let tensor = |shape: &Vec<usize>| {
        let n = shape.iter().product::<usize>();
        let flat = Tensor::<B, 1>::random([n], Distribution::Normal(0.0, 0.02), device);
        B::float_reshape(flat.into_primitive().tensor(), shape.clone().into())
    };
    let state: Vec<_> = shapes
        .iter()
        .map(|s| (tensor(s), tensor(s), tensor(s), B::float_abs(tensor(s))))
        .collect();
    B::sync(device)?;
    let before = B::reserved_bytes(device);
    let step = AdamWStep {
        lr: 3e-4,
        beta_1: 0.9,
        beta_2: 0.95,
        epsilon: 1e-8,
        weight_decay: 0.1,
        time: 2,
        grad_scale: 0.5,
    };
    for fused in [false, true] {
        let name = match fused {
            false => format!("AdamW + clipping, composed ({} tensors)", shapes.len()),
            true => format!("AdamW + clipping, fused ({} tensors)", shapes.len()),
        };
        eprintln!("{name}");
        let mut times = Vec::with_capacity(args.runs);
        for i in 0..=args.runs {
            let start = Instant::now();
            let updated: Vec<_> = state
                .iter()
                .map(|(p, g, m, v)| {
                    let moments = Some(Moments {
                        first: m.clone(),
                        second: v.clone(),
                    });
                    match fused {
                        false => composed::<B>(p.clone(), g.clone(), moments, &step),
                        true => B::xt_adamw(p.clone(), g.clone(), moments, &step),
                    }
                })
                .collect();
            B::sync(device)?;
            // The first run, which compiles, is the warm-up.
            if i > 0 {
                times.push(start.elapsed().as_secs_f64());
            }
            drop(updated);
        }
        let row = Row {
            name: &name,
            dtype: "f32",
            floor_bytes: 28 * params,
        };
        row.print::<B>(times, bandwidth, before, device);
    }
    Ok(())
}
