//! A training loop of your own with the X-Token losses, on a small model.
//!
//! A tiny random Llama student learns from a tiny random teacher that has another tokenizer,
//! under P-KL with a learnable W, cross-entropy and dynamic scaling: the texts are tokenized
//! and aligned in memory (no cache, no run directory), the batch's chunk plan comes from the
//! library, and the loop, the optimizers and the schedule are yours. It overfits one batch, so
//! the loss must fall.
//!
//! ```sh
//! cargo run --release --example own_training_loop -- STUDENT_TOKENIZER TEACHER_TOKENIZER [STEPS]
//! ```
//!
//! The tokenizers are directories holding `tokenizer.json` (or the files); without arguments
//! the example takes Llama-3.2's and Qwen3's from `$XTOKEN_TOKENIZERS_DIR`.

use std::path::PathBuf;

use burn::backend::{Autodiff, NdArray};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};
use xtoken::core::align::{AlignParams, Workspace};
use xtoken::core::plan::MergeVariant;
use xtoken::core::projection::{ProjectionParams, SparseProjection};
use xtoken::loss::pkl::LearnableProjection;
use xtoken::loss::{ce, pkl, scaling, LossParams, TeacherTargets};
use xtoken::models::{Architecture, CausalLm, Tokens, Transformer};
use xtoken::train::data::{micro_batch, MicroBatch, Pipeline};
use xtoken::XTokenBackend;

type B = Autodiff<NdArray>;
type Error = Box<dyn std::error::Error>;

/// Texts whose numerals the two tokenizers split differently.
const TEXTS: [&str; 4] = [
    "The 2024 budget was 1,375 million, up 12 percent from 1998.",
    "Eva had 417 coins and found one more, so she had 418.",
    "fn area(w: u32, h: u32) -> u32 { w * h } // 640 x 480",
    "Mount Everest is 8848 metres high; K2 is 8611 metres.",
];

fn main() -> Result<(), Error> {
    let (student_tokenizer, teacher_tokenizer, steps) = arguments()?;
    let device = Default::default();

    // The batch: every text tokenized by both tokenizers and aligned (the paper's DP), then
    // padded, with the chunk plan the losses read.
    let pipeline = Pipeline::load(
        &student_tokenizer,
        &[teacher_tokenizer],
        AlignParams::default(),
    )?;
    let aligned = TEXTS
        .iter()
        .map(|text| pipeline.process(&mut Workspace::default(), text))
        .collect::<Result<Vec<_>, _>>()?;
    // 1: the teacher's rows are not padded to a multiple (a GPU backend's trainer pads them to
    // 128, so that its kernels see few shapes).
    let batch = micro_batch(&aligned, MergeVariant::FirstToken, 1)?;
    let (student_vocab, teacher_vocab) = (pipeline.student.size(), pipeline.teachers[0].size());
    println!(
        "{} texts: {} student × {} teacher tokens per row, {} aligned chunks",
        batch.rows,
        batch.student_len,
        batch.teachers[0].len,
        batch.teachers[0].plan.valid_chunks()
    );

    // The models (tiny and random here; `Transformer::load` reads a Hugging Face directory) and
    // the projection matrix W, built by the paper's rule and trained under P-KL.
    let tiny = |vocab| Architecture::llama(vocab, 64, 128, 2, 4, 2);
    let mut student = Transformer::<B>::random(&tiny(student_vocab), 1, DType::F32, &device)?;
    let teacher = Transformer::<NdArray>::random(&tiny(teacher_vocab), 2, DType::F32, &device)?;
    let (sparse_w, _) = SparseProjection::build(
        &pipeline.student,
        &pipeline.teachers[0],
        ProjectionParams::default(),
    )?;
    let mut w = LearnableProjection::<B>::new(&sparse_w, student_vocab, &device)?;
    let (ids, padding) = student_inputs::<B>(&batch, &device);
    let teacher_logits = teacher_logits(&teacher, &batch, &device)?;

    // README:begin
    let params = LossParams::default(); // τ = 1, top-K 8192, λ_KL = λ_ULD = 1
    let plan = &batch.teachers[0].plan;
    // The teacher runs without a graph; keep its top-K per aligned chunk, drop its logits.
    let targets = TeacherTargets::new(Tensor::from_inner(teacher_logits), plan, &params)?;
    let mut student_optim = AdamWConfig::new().with_weight_decay(0.1).init();
    let mut w_optim = AdamWConfig::new().with_weight_decay(0.0).init();
    let mut losses = Vec::new();
    for step in 1..=steps {
        let logits = student.forward(ids.clone(), padding.clone())?; // [B, T, V_S]
        let kd = pkl::loss(logits.clone(), &targets, &w, &params)?; // KL(p̂_T ‖ Wᵀp̂_S)
        let ce = ce::loss(logits, &plan.student.next_token, &params)?;
        let loss = scaling::dynamic(ce.clone(), kd.clone()); // sg(CE/KD)·KD + CE
        let mut grads = loss.backward();
        let student_grads = GradientsParams::from_module(&mut grads, &student);
        let w_grads = GradientsParams::from_module(&mut grads, &w);
        student = student_optim.step(1e-3, student, student_grads);
        w = w_optim.step(1e-2, w, w_grads); // W: its own AdamW, lr 1e-2, unclipped
        let (ce, kd) = (ce.into_scalar(), kd.into_scalar());
        println!("step {step}: CE {ce:.4} · P-KL {kd:.4}");
        losses.push(ce + kd);
    }
    // README:end

    match (losses.first(), losses.last()) {
        (Some(first), Some(last)) if last.is_finite() && last < first => {
            println!("the loss fell from {first:.4} to {last:.4}");
            Ok(())
        }
        (first, last) => Err(format!("the loss did not fall: {first:?} → {last:?}").into()),
    }
}

/// The student's ids `[rows, len]` and padding mask.
fn student_inputs<Q: Backend>(
    batch: &MicroBatch,
    device: &Q::Device,
) -> (Tensor<Q, 2, Int>, Option<Tensor<Q, 2, Bool>>) {
    let shape = [batch.rows, batch.student_len];
    let ids = Tensor::from_data(TensorData::new(batch.student_ids.clone(), shape), device);
    let padding = batch
        .student_padding
        .clone()
        .map(|p| Tensor::from_data(TensorData::new(p, shape), device));
    (ids, padding)
}

/// The teacher's logits `[rows, len, V_T]` of its side of the batch.
fn teacher_logits<Q: XTokenBackend>(
    teacher: &Transformer<Q>,
    batch: &MicroBatch,
    device: &Q::Device,
) -> Result<Tensor<Q, 3>, Error> {
    let side = &batch.teachers[0];
    // Made on the host, checked there: the forward pass reads nothing back from the device.
    let tokens = Tokens::from_host(
        &side.ids,
        side.padding.as_deref(),
        [batch.rows, side.len],
        device,
    )?;
    Ok(teacher.forward_of(&tokens)?)
}

/// The two tokenizers and the number of steps, from the command line or
/// `$XTOKEN_TOKENIZERS_DIR`.
fn arguments() -> Result<(PathBuf, PathBuf, usize), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let steps = |s: Option<&String>| -> Result<usize, Error> {
        Ok(s.map(|s| s.parse()).transpose()?.unwrap_or(10))
    };
    match args.as_slice() {
        [student, teacher, rest @ ..] if rest.len() <= 1 => {
            Ok((student.into(), teacher.into(), steps(rest.first())?))
        }
        [] | [_] => {
            let dir = std::env::var_os("XTOKEN_TOKENIZERS_DIR").ok_or(
                "give STUDENT_TOKENIZER TEACHER_TOKENIZER, or set XTOKEN_TOKENIZERS_DIR to a \
                 directory holding llama-3.2/ and qwen3/",
            )?;
            let dir = PathBuf::from(dir);
            Ok((
                dir.join("llama-3.2"),
                dir.join("qwen3"),
                steps(args.first())?,
            ))
        }
        _ => Err("usage: own_training_loop [STUDENT_TOKENIZER TEACHER_TOKENIZER] [STEPS]".into()),
    }
}
