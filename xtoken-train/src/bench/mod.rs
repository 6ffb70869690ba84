//! `xtoken bench …`: benchmarks that print Markdown tables for BENCHMARKS.md. Memory is
//! measured here: the counting allocator ([`alloc`]) for host backends, the device pools
//! (`DeviceMemory`) for GPU ones.

pub mod align;
pub mod alloc;
mod corpora;
pub mod data;
pub mod eval;
#[cfg(feature = "collective")]
pub mod exchange;
pub mod forward;
pub mod kernels;
pub mod loss;
pub mod on_policy;
pub mod projection;
pub mod store;
pub mod train;

use anyhow::Result;
use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
// Parsed once per process: `train`'s many options cost nothing worth boxing.
#[allow(clippy::large_enum_variant)]
pub enum BenchCommand {
    /// Wall time of `projection build` (tokenizer loading included), per stage.
    Projection(projection::ProjectionBenchArgs),
    /// Alignment speed per kind of text: the DP alone, and `xtoken align` end to end.
    Align(align::AlignBenchArgs),
    /// The streaming loader on a generated corpus: time to the first batch, and student
    /// tokens/s delivered with every teacher against reading alone and the trainer's need.
    Data(data::DataBenchArgs),
    /// Forward + backward time and peak memory of P-KL and H-KL on CPU (ndarray): the fused,
    /// row-chunked losses against a naive composition of burn tensor ops.
    Loss(loss::LossBenchArgs),
    /// `xtoken eval`'s documents/s per task on a random model of a real shape with a real
    /// tokenizer, and greedy generation with the KV cache against recomputation.
    Eval(eval::EvalBenchArgs),
    /// Forward and forward+backward tokens/s and peak memory of a random Llama-shaped model on
    /// CPU (ndarray), with and without activation checkpointing.
    Forward(forward::ForwardBenchArgs),
    /// One teacher's P-KL forward + backward through the cubecl kernels on a GPU (`--device
    /// cuda|wgpu`, in a build with that feature), against the HBM floor.
    Kernels(kernels::KernelBenchArgs),
    /// `xtoken train`'s whole step (loader, teacher top-K, student forward + backward, losses,
    /// AdamW) on random models with real tokenizer vocabularies: s/step, tokens/s, peak memory.
    Train(train::TrainBenchArgs),
    /// Stored teacher targets per layout and top-K: bytes a teacher token takes, the error of
    /// what training reads (log-probabilities, top-K KL, P-KL's loss and gradient) against f32
    /// and one core's time to read an entry back against f32's, beside DistillKit's schemes, on
    /// Zipf-shaped logits at a real vocabulary's width (ids spread evenly, by a Zipf prior, or by a
    /// real tokenizer's token frequencies: `--frequencies`) and on a trained model's (`--model`,
    /// `--text`).
    Store(store::StoreBenchArgs),
    /// On-policy against off-policy distillation in `xtoken demo`'s world (after the demo):
    /// the teacher's grade of the student's own answers as each λ trains.
    OnPolicy(on_policy::OnPolicyBenchArgs),
    /// One all-reduce of a flat tensor, as `xtoken train` sums a step's gradients: the ring
    /// between processes against the same between threads, or NCCL between GPUs (`--device
    /// cuda`), each against a memory pass on the device and as bus GB/s (feature `collective`;
    /// under torchrun or srun: between the machines they started).
    #[cfg(feature = "collective")]
    Exchange(exchange::ExchangeBenchArgs),
}

/// Runs a benchmark.
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Projection(args) => projection::run(args),
        BenchCommand::Align(args) => align::run(args),
        BenchCommand::Data(args) => data::run(args),
        BenchCommand::Loss(args) => loss::run(args),
        BenchCommand::Eval(args) => eval::run(args),
        BenchCommand::Forward(args) => forward::run(args),
        BenchCommand::Kernels(args) => kernels::run(args),
        BenchCommand::Train(args) => train::run(args),
        BenchCommand::Store(args) => store::run(args),
        BenchCommand::OnPolicy(args) => on_policy::run(args),
        #[cfg(feature = "collective")]
        BenchCommand::Exchange(args) => exchange::run(args),
    }
}

/// The median of a non-empty list.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
