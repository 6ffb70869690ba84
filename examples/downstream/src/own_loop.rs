//! A training loop of your own with the X-Token losses, on a small model.
//!
//! A tiny random Llama student learns from a tiny random teacher that has another tokenizer,
//! under P-KL with a learnable W, cross-entropy and dynamic scaling: the texts are tokenized
//! and aligned in memory (no cache, no run directory), the batch's chunk plan comes from the
//! library, and the loop, the optimizers and the schedule are yours. It overfits one batch, so
//! the loss must fall.

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

use crate::{Arguments, Error, Inner, B};

/// Texts whose numerals the two tokenizers split differently.
pub const TEXTS: [&str; 4] = [
    "The 2024 budget was 1,375 million, up 12 percent from 1998.",
    "Eva had 417 coins and found one more, so she had 418.",
    "fn area(w: u32, h: u32) -> u32 { w * h } // 640 x 480",
    "Mount Everest is 8848 metres high; K2 is 8611 metres.",
];

/// What every loop starts from: the tokenizers' pipeline, a random student and teacher, and
/// the projection matrix W built by the paper's rule.
pub struct Setup {
    pub pipeline: Pipeline,
    pub student: Transformer<B>,
    pub teacher: Transformer<Inner>,
    pub w: LearnableProjection<B>,
}

impl Setup {
    pub fn new(args: &Arguments) -> Result<Self, Error> {
        let device = Default::default();
        let pipeline = Pipeline::load(
            &args.student_tokenizer,
            std::slice::from_ref(&args.teacher_tokenizer),
            AlignParams::default(),
        )?;
        let (student_vocab, teacher_vocab) = (pipeline.student.size(), pipeline.teachers[0].size());
        // The models (tiny and random here; `Transformer::load` reads a Hugging Face directory)
        // and W, trained under P-KL.
        let tiny = |vocab| Architecture::llama(vocab, 64, 128, 2, 4, 2);
        let student = Transformer::<B>::random(&tiny(student_vocab), 1, DType::F32, &device)?;
        let teacher = Transformer::<Inner>::random(&tiny(teacher_vocab), 2, DType::F32, &device)?;
        let (sparse_w, _) = SparseProjection::build(
            &pipeline.student,
            &pipeline.teachers[0],
            ProjectionParams::default(),
        )?;
        let w = LearnableProjection::<B>::new(&sparse_w, student_vocab, &device)?;
        Ok(Setup {
            pipeline,
            student,
            teacher,
            w,
        })
    }

    /// `texts` tokenized by both tokenizers and aligned (the paper's DP), then padded, with the
    /// chunk plan the losses read.
    pub fn batch(&self, texts: &[&str]) -> Result<MicroBatch, Error> {
        let aligned = texts
            .iter()
            .map(|text| self.pipeline.process(&mut Workspace::default(), text))
            .collect::<Result<Vec<_>, _>>()?;
        // 1: the teacher's rows are not padded to a multiple (a GPU backend's trainer pads them
        // to 128, so that its kernels see few shapes).
        Ok(micro_batch(&aligned, MergeVariant::FirstToken, 1)?)
    }
}

/// Overfits one batch of [`TEXTS`] for `args.steps` steps; fails unless the loss falls.
pub fn run(args: &Arguments) -> Result<(), Error> {
    let setup = Setup::new(args)?;
    let batch = setup.batch(&TEXTS)?;
    let Setup {
        mut student,
        teacher,
        mut w,
        ..
    } = setup;
    let (steps, device) = (args.steps, Default::default());
    println!(
        "{} texts: {} student × {} teacher tokens per row, {} aligned chunks",
        batch.rows,
        batch.student_len,
        batch.teachers[0].len,
        batch.teachers[0].plan.valid_chunks()
    );
    let (ids, padding) = student_inputs::<B>(&batch, &device);
    let teacher_logits = teacher_logits(&teacher, &batch, &device)?;

    // ANCHOR: own_loop
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
    // ANCHOR_END: own_loop

    match (losses.first(), losses.last()) {
        (Some(first), Some(last)) if last.is_finite() && last < first => {
            println!("the loss fell from {first:.4} to {last:.4}");
            Ok(())
        }
        (first, last) => Err(format!("the loss did not fall: {first:?} → {last:?}").into()),
    }
}

/// The student's ids `[rows, len]` and padding mask.
pub fn student_inputs<Q: Backend>(
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
pub fn teacher_logits<Q: XTokenBackend>(
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
