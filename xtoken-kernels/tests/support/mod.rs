//! One small distillation case (two sequences, chunks with continuation terms, a projection with
//! empty slots, a common set) with all four objectives, on any backend.
#![allow(dead_code)]

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};
use xtoken_kernels::{
    CommonPairs, MergePlan, Objective, ProjectionTensors, TeacherEntries, TeacherSpec,
    XTokenBackend,
};

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

pub fn teacher_spec() -> TeacherSpec {
    TeacherSpec {
        merge: merge(),
        top_k: 5,
        tau: 1.5,
        row_chunk: 2,
        next_token: Some(Arc::from(vec![3, 1, 4, 1, 5, -1, 9, 2, 6, 5, 3, -1])),
    }
}

/// W with every seventh slot empty (-1).
pub fn projection<B: Backend>(device: &B::Device) -> ProjectionTensors<B> {
    let (vs, vt) = (STUDENT_VOCAB, TEACHER_VOCAB);
    let indices: Vec<i64> = (0..vs * 2)
        .map(|i| if i % 7 == 3 { -1 } else { (i * 5 % vt) as i64 })
        .collect();
    let weights: Vec<f32> = (0..vs * 2)
        .map(|i| if i % 7 == 3 { 0.0 } else { 0.5 })
        .collect();
    ProjectionTensors {
        indices: Tensor::<B, 2, Int>::from_data(TensorData::new(indices, [vs, 2]), device)
            .into_primitive(),
        weights: Tensor::<B, 2>::from_data(TensorData::new(weights, [vs, 2]), device)
            .into_primitive()
            .tensor(),
    }
}

pub fn objectives() -> Vec<Objective> {
    let pairs: Vec<(u32, u32)> = vec![(0, 3), (2, 0), (5, 7), (8, 10)];
    vec![
        Objective::Kl,
        Objective::Projected { eps: 1e-10 },
        Objective::Hybrid {
            common: Arc::new(CommonPairs::new(&pairs, STUDENT_VOCAB, TEACHER_VOCAB).unwrap()),
            lambda_kl: 1.0,
            lambda_uld: 0.5,
        },
        Objective::CrossEntropy {
            targets: Arc::from(vec![3, 1, 4, 1, 5, -1, 8, 2, 6, 5, 3, -1]),
        },
    ]
}

/// The teacher entries `objective` reads: KL reads teacher ids as student ids, so it gets a
/// teacher as wide as the student; the others get `entries`.
pub fn entries_for<B: XTokenBackend>(
    objective: &Objective,
    entries: &TeacherEntries<B>,
    device: &B::Device,
) -> TeacherEntries<B> {
    if !matches!(objective, Objective::Kl) {
        return entries.clone();
    }
    let narrow = logits::<B>(3, [2, 6, STUDENT_VOCAB], device);
    let spec = TeacherSpec {
        next_token: None,
        ..teacher_spec()
    };
    B::xt_teacher_entries(narrow.into_primitive().tensor(), &spec).unwrap()
}
