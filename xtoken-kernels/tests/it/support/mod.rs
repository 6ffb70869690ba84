//! One small distillation case (two sequences, chunks with continuation terms, a projection with
//! empty slots, a common set) with every loss and cross-entropy, on any backend.
#![allow(dead_code)]

pub mod reference;

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};
use xtoken_kernels::{
    host, CommonPairs, DistillSpec, EntriesSpec, GradRequest, KernelError, LossKind, LossOutput,
    MergePlan, ProjectionTensors, TeacherEntries, XTokenBackend,
};

/// `n` reproducible values in `[-scale, scale)` from `seed` (xorshift).
pub fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub const STUDENT_VOCAB: usize = 9;
pub const TEACHER_VOCAB: usize = 11;

pub fn logits<B: Backend>(seed: u32, shape: [usize; 3], device: &B::Device) -> Tensor<B, 3> {
    let n = shape.iter().product::<usize>();
    let data: Vec<f32> = (0..n as u32)
        .map(|i| {
            let x = (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 10_007;
            x as f32 / 1000.0 - 5.0
        })
        .collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

pub fn floats<B: Backend, const D: usize>(t: burn::tensor::ops::FloatTensor<B>) -> Vec<f32> {
    Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data")
}

pub fn ints<B: Backend, const D: usize>(t: burn::tensor::ops::IntTensor<B>) -> Vec<i64> {
    Tensor::<B, D, Int>::from_primitive(t)
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .expect("int data")
}

/// Two sequences of 6 positions; chunks predicted by rows 0, 2, 3 (sequence 0) and 6, 8
/// (sequence 1), with continuation terms on rows 1 and 9.
pub fn merge() -> MergePlan {
    MergePlan {
        rows: 12,
        predict_row: vec![Some(0), Some(2), Some(3), None, Some(6), Some(8)],
        continuation: vec![(1, 4, 0), (9, 2, 5)],
    }
}

pub fn teacher_spec() -> EntriesSpec {
    EntriesSpec {
        merge: merge(),
        top_k: 5,
        tau: 1.5,
        row_chunk: 2,
        next_token: Some(Arc::from(vec![3, 1, 4, 1, 5, -1, 9, 2, 6, 5, 3, -1])),
    }
}

/// W's ids `[STUDENT_VOCAB, 2]`: every seventh slot empty (-1), and row 4 wholly empty.
pub fn projection_indices() -> Vec<i64> {
    (0..STUDENT_VOCAB * 2)
        .map(|i| {
            if i % 7 == 3 || i / 2 == 4 {
                -1
            } else {
                (i * 5 % TEACHER_VOCAB) as i64
            }
        })
        .collect()
}

/// W's weights: 0.5 per occupied slot, so rows with an empty slot sum to 0.5.
pub fn projection_weights() -> Vec<f32> {
    projection_indices()
        .iter()
        .map(|&t| if t < 0 { 0.0 } else { 0.5 })
        .collect()
}

/// W with the ids and weights above.
pub fn projection<B: Backend>(device: &B::Device) -> ProjectionTensors<B> {
    let vs = STUDENT_VOCAB;
    let (indices, weights) = (projection_indices(), projection_weights());
    ProjectionTensors {
        indices: Tensor::<B, 2, Int>::from_data(TensorData::new(indices, [vs, 2]), device)
            .into_primitive(),
        weights: Tensor::<B, 2>::from_data(TensorData::new(weights, [vs, 2]), device)
            .into_primitive()
            .tensor(),
        layout: None,
    }
}

/// One evaluation of the tests: a distillation loss with its common set and weights, or
/// cross-entropy with its targets.
#[derive(Debug, Clone)]
pub enum Evaluation {
    Distill {
        loss: LossKind,
        common: Option<Arc<CommonPairs>>,
        lambda_kl: f32,
        lambda_uld: f32,
    },
    CrossEntropy(Arc<[i32]>),
}

/// What [`Evaluation::run`] evaluates on.
pub struct Inputs<B: Backend> {
    pub logits: FloatTensor<B>,
    pub teacher: TeacherEntries<B>,
    pub projection: Option<ProjectionTensors<B>>,
    pub merge: MergePlan,
    pub tau: f32,
    pub row_chunk: usize,
    pub want: GradRequest,
}

impl Evaluation {
    /// A distillation loss with the given common set and weights.
    pub fn distill(loss: LossKind, common: Option<CommonPairs>, lambdas: (f32, f32)) -> Self {
        Evaluation::Distill {
            loss,
            common: common.map(Arc::new),
            lambda_kl: lambdas.0,
            lambda_uld: lambdas.1,
        }
    }

    /// Whether this is the distillation loss `kind`.
    pub fn is(&self, kind: LossKind) -> bool {
        matches!(self, Evaluation::Distill { loss, .. } if *loss == kind)
    }

    /// Whether this is a distillation loss (not cross-entropy).
    pub fn is_distill(&self) -> bool {
        matches!(self, Evaluation::Distill { .. })
    }

    /// Whether this reads the projection W.
    pub fn reads_projection(&self) -> bool {
        self.is(LossKind::Pkl)
    }

    fn spec(&self, merge: MergePlan, tau: f32, row_chunk: usize) -> Option<DistillSpec> {
        match self {
            Evaluation::Distill {
                loss,
                common,
                lambda_kl,
                lambda_uld,
            } => Some(DistillSpec {
                loss: *loss,
                merge,
                tau,
                row_chunk,
                common: common.clone(),
                lambda_kl: *lambda_kl,
                lambda_uld: *lambda_uld,
                eps: 1e-10,
            }),
            Evaluation::CrossEntropy(_) => None,
        }
    }

    /// Runs it through the backend's operations.
    pub fn run<B: XTokenBackend>(&self, x: Inputs<B>) -> Result<LossOutput<B>, KernelError> {
        match (self, self.spec(x.merge, x.tau, x.row_chunk)) {
            (_, Some(spec)) => B::xt_distill(x.logits, x.teacher, x.projection, &spec, x.want),
            (Evaluation::CrossEntropy(targets), None) => {
                B::xt_cross_entropy(x.logits, targets, x.row_chunk, x.want.logits)
            }
            (Evaluation::Distill { .. }, None) => unreachable!("a distillation loss has a spec"),
        }
    }

    /// Runs it through the portable host implementation.
    pub fn run_host<B: Backend>(&self, x: Inputs<B>) -> Result<LossOutput<B>, KernelError> {
        match (self, self.spec(x.merge, x.tau, x.row_chunk)) {
            (_, Some(spec)) => host::distill::<B>(x.logits, x.teacher, x.projection, &spec, x.want),
            (Evaluation::CrossEntropy(targets), None) => {
                host::cross_entropy::<B>(x.logits, targets, x.row_chunk, x.want.logits)
            }
            (Evaluation::Distill { .. }, None) => unreachable!("a distillation loss has a spec"),
        }
    }
}

/// The small case's inputs for `evaluation`: `student` logits, the teacher entries it reads,
/// W when it reads one; both gradients requested.
pub fn small_inputs<B: XTokenBackend>(
    evaluation: &Evaluation,
    student: &Tensor<B, 3>,
    entries: &TeacherEntries<B>,
    device: &B::Device,
) -> Inputs<B> {
    Inputs {
        logits: student.clone().into_primitive().tensor(),
        teacher: entries_for::<B>(evaluation, entries, device),
        projection: evaluation
            .reads_projection()
            .then(|| projection::<B>(device)),
        merge: merge(),
        tau: 1.5,
        row_chunk: 2,
        want: GradRequest {
            logits: true,
            weights: true,
        },
    }
}

/// Every loss and cross-entropy on the small case.
pub fn evaluations() -> Vec<Evaluation> {
    let pairs: Vec<(u32, u32)> = vec![(0, 3), (2, 0), (5, 7), (8, 10)];
    let common = CommonPairs::new(&pairs, STUDENT_VOCAB, TEACHER_VOCAB).unwrap();
    // H-KL's relaxed set is many-to-one: teachers 3 and 7 have three and two student partners.
    let relaxed: Vec<(u32, u32)> = vec![(0, 3), (1, 3), (4, 3), (2, 0), (5, 7), (6, 7), (8, 10)];
    let relaxed = CommonPairs::new(&relaxed, STUDENT_VOCAB, TEACHER_VOCAB).unwrap();
    vec![
        Evaluation::distill(LossKind::Kl, None, (1.0, 1.0)),
        Evaluation::distill(LossKind::Pkl, None, (1.0, 1.0)),
        Evaluation::distill(LossKind::Gold, Some(common), (1.0, 0.5)),
        Evaluation::distill(LossKind::Hkl, Some(relaxed), (0.7, 1.0)),
        Evaluation::distill(LossKind::Uld, None, (1.0, 0.5)),
        Evaluation::CrossEntropy(Arc::from(vec![3, 1, 4, 1, 5, -1, 8, 2, 6, 5, 3, -1])),
    ]
}

/// The teacher entries `evaluation` reads: KL reads teacher ids as student ids, so it gets a
/// teacher as wide as the student; the others get `entries`.
pub fn entries_for<B: XTokenBackend>(
    evaluation: &Evaluation,
    entries: &TeacherEntries<B>,
    device: &B::Device,
) -> TeacherEntries<B> {
    if !evaluation.is(LossKind::Kl) {
        return entries.clone();
    }
    let narrow = logits::<B>(3, [2, 6, STUDENT_VOCAB], device);
    let spec = EntriesSpec {
        next_token: None,
        ..teacher_spec()
    };
    B::xt_teacher_entries(narrow.into_primitive().tensor(), &spec).unwrap()
}

/// Three AdamW updates of one `[5, 7]` parameter: the first from zero moments, with decay and a
/// clipping scale below 1, the later ones with new gradients; after each, the parameter and both
/// moments as host values.
pub fn adamw_updates<B: XTokenBackend>(device: &B::Device) -> Vec<[Vec<f32>; 3]> {
    adamw_updates_by::<B>(device, B::xt_adamw)
}

/// [`adamw_updates`] through `update` (an implementation of `xt_adamw`).
pub fn adamw_updates_by<B: Backend>(
    device: &B::Device,
    update: impl Fn(
        FloatTensor<B>,
        FloatTensor<B>,
        Option<xtoken_kernels::adamw::Moments<B>>,
        &xtoken_kernels::adamw::AdamWStep,
    ) -> xtoken_kernels::adamw::AdamWUpdate<B>,
) -> Vec<[Vec<f32>; 3]> {
    use xtoken_kernels::adamw::AdamWStep;
    let tensor = |seed| {
        logits::<B>(seed, [1, 5, 7], device)
            .reshape([5, 7])
            .into_primitive()
            .tensor()
    };
    let mut param = tensor(1);
    let mut moments = None;
    let mut seen = Vec::new();
    for time in 1..=3 {
        let step = AdamWStep {
            lr: 1e-3 * time as f64,
            beta_1: 0.9,
            beta_2: 0.95,
            epsilon: 1e-8,
            weight_decay: if time == 2 { 0.0 } else { 0.1 },
            time,
            grad_scale: if time == 1 { 0.37 } else { 1.0 },
        };
        let update = update(param, tensor(10 + time as u32), moments, &step);
        seen.push([
            floats::<B, 2>(update.param.clone()),
            floats::<B, 2>(update.moments.first.clone()),
            floats::<B, 2>(update.moments.second.clone()),
        ]);
        param = update.param;
        moments = Some(update.moments);
    }
    seen
}
