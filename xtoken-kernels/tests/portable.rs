//! The portable path (row chunks copied with `into_data`, which every backend gets) and the
//! in-place ndarray path give the same targets, loss and gradients.

use std::sync::Arc;

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};
use xtoken_kernels::{
    host, CommonPairs, GradRequest, LossSpec, MergePlan, Objective, ProjectionTensors, TeacherSpec,
    XTokenBackend,
};

type B = NdArray;

fn logits(seed: u32, shape: [usize; 3]) -> Tensor<B, 3> {
    let n = shape.iter().product::<usize>();
    let data: Vec<f32> = (0..n as u32)
        .map(|i| {
            let x = (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 10_007;
            x as f32 / 1000.0 - 5.0
        })
        .collect();
    Tensor::from_data(TensorData::new(data, shape), &Default::default())
}

fn any_floats<const D: usize>(t: burn::tensor::ops::FloatTensor<B>) -> Vec<f32> {
    Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .to_vec::<f32>()
        .expect("f32 data")
}

#[test]
fn portable_and_in_place_paths_agree() {
    // Two sequences of 6 positions; chunks predicted by rows 0, 2, 3 (sequence 0) and 6, 8
    // (sequence 1), with continuation terms on rows 1 and 9.
    let merge = MergePlan {
        rows: 12,
        predict_row: vec![Some(0), Some(2), Some(3), None, Some(6), Some(8)],
        continuation: vec![(1, 4, 0), (9, 2, 5)],
    };
    let (vs, vt) = (9, 11);
    let teacher = logits(1, [2, 6, vt]);
    let student = logits(2, [2, 6, vs]);
    let spec = TeacherSpec {
        merge: merge.clone(),
        top_k: 5,
        tau: 1.5,
        row_chunk: 2,
        next_token: Some(Arc::from(vec![3, 1, 4, 1, 5, -1, 9, 2, 6, 5, 3, -1])),
    };
    let fast = B::xt_teacher_entries(teacher.clone().into_primitive().tensor(), &spec).unwrap();
    let slow = host::teacher_entries::<B>(teacher.into_primitive().tensor(), &spec).unwrap();
    assert_eq!(
        any_floats::<2>(fast.logp.clone()),
        any_floats::<2>(slow.logp.clone())
    );
    assert_eq!(
        Tensor::<B, 2, Int>::from_primitive(fast.ids.clone()).into_data(),
        Tensor::<B, 2, Int>::from_primitive(slow.ids.clone()).into_data()
    );
    assert_eq!(fast.confidence, slow.confidence);

    let indices: Vec<i64> = (0..vs * 2)
        .map(|i| if i % 7 == 3 { -1 } else { (i * 5 % vt) as i64 })
        .collect();
    let weights: Vec<f32> = (0..vs * 2)
        .map(|i| if i % 7 == 3 { 0.0 } else { 0.5 })
        .collect();
    let projection = || ProjectionTensors::<B> {
        indices: Tensor::<B, 2, Int>::from_data(
            TensorData::new(indices.clone(), [vs, 2]),
            &Default::default(),
        )
        .into_primitive(),
        weights: Tensor::<B, 2>::from_data(
            TensorData::new(weights.clone(), [vs, 2]),
            &Default::default(),
        )
        .into_primitive()
        .tensor(),
    };
    let pairs: Vec<(u32, u32)> = vec![(0, 3), (2, 0), (5, 7), (8, 10)];
    let objectives = [
        Objective::Kl,
        Objective::Projected { eps: 1e-10 },
        Objective::Hybrid {
            common: Arc::new(CommonPairs::new(&pairs, vs, vt).unwrap()),
            lambda_kl: 1.0,
            lambda_uld: 0.5,
        },
        Objective::CrossEntropy {
            targets: Arc::from(vec![3, 1, 4, 1, 5, -1, 8, 2, 6, 5, 3, -1]),
        },
    ];
    for objective in objectives {
        let kl = matches!(objective, Objective::Kl);
        // KL reads teacher ids as student ids: use a teacher as wide as the student.
        let entries = if kl {
            let narrow = logits(3, [2, 6, vs]);
            let spec = TeacherSpec {
                next_token: None,
                ..spec.clone()
            };
            B::xt_teacher_entries(narrow.into_primitive().tensor(), &spec).unwrap()
        } else {
            fast.clone()
        };
        let spec = LossSpec {
            objective: objective.clone(),
            merge: merge.clone(),
            tau: 1.5,
            row_chunk: 2,
        };
        let want = GradRequest {
            logits: true,
            weights: true,
        };
        let proj = matches!(objective, Objective::Projected { .. }).then(projection);
        let a = B::xt_loss(
            student.clone().into_primitive().tensor(),
            proj.clone(),
            Some(entries.clone()),
            &spec,
            want,
        )
        .unwrap();
        let b = host::loss::<B>(
            student.clone().into_primitive().tensor(),
            proj,
            Some(entries),
            &spec,
            want,
        )
        .unwrap();
        assert_eq!(
            any_floats::<1>(a.value),
            any_floats::<1>(b.value),
            "{objective:?}"
        );
        let (ga, gb) = (a.grad_logits.unwrap(), b.grad_logits.unwrap());
        assert_eq!(any_floats::<3>(ga), any_floats::<3>(gb), "{objective:?}");
        assert_eq!(
            a.grad_weights.map(any_floats::<2>),
            b.grad_weights.map(any_floats::<2>),
            "{objective:?}"
        );
    }
}

#[test]
fn a_row_predicting_two_slots_is_refused() {
    let merge = MergePlan {
        rows: 4,
        predict_row: vec![Some(1), Some(1)],
        continuation: Vec::new(),
    };
    let err = merge.check("student", 4, 5).unwrap_err();
    assert!(
        err.to_string().contains("row 1 predicts two chunk slots"),
        "{err}"
    );
}
