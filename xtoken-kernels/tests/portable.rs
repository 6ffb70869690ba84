//! The in-place ndarray path and the portable path (row chunks copied with `into_data`, which
//! every backend gets) give the same targets, loss and gradients; a view the kernels cannot read
//! in place falls back to the portable path with the same result.

mod support;

use burn::backend::NdArray;
use burn::tensor::Tensor;
use support::{evaluations, floats, ints, logits, small_inputs, teacher_spec};
use xtoken_kernels::{host, ndarray_reads_in_place, MergePlan, XTokenBackend};

type B = NdArray;

/// The same values as `logits`, as a transposed view (positions vary fastest) that cannot be
/// read as one contiguous slice.
fn strided(logits: &Tensor<B, 3>) -> Tensor<B, 3> {
    let flipped = logits.clone().swap_dims(1, 2).to_data();
    Tensor::<B, 3>::from_data(flipped, &logits.device()).swap_dims(1, 2)
}

#[test]
fn portable_and_in_place_paths_agree() {
    let device = Default::default();
    let (vs, vt) = (support::STUDENT_VOCAB, support::TEACHER_VOCAB);
    let teacher = logits::<B>(1, [2, 6, vt], &device);
    let student = logits::<B>(2, [2, 6, vs], &device);
    // The trait methods below take the in-place path for these tensors, the strided view not.
    assert!(ndarray_reads_in_place(
        &teacher.clone().into_primitive().tensor()
    ));
    assert!(ndarray_reads_in_place(
        &student.clone().into_primitive().tensor()
    ));
    let view = strided(&student);
    assert!(!ndarray_reads_in_place(
        &view.clone().into_primitive().tensor()
    ));
    assert_eq!(view.to_data(), student.to_data());
    let spec = teacher_spec();
    let fast = B::xt_teacher_entries(teacher.clone().into_primitive().tensor(), &spec).unwrap();
    let slow = host::teacher_entries::<B>(teacher.into_primitive().tensor(), &spec).unwrap();
    assert_eq!(
        floats::<B, 2>(fast.logp.clone()),
        floats::<B, 2>(slow.logp.clone())
    );
    assert_eq!(
        ints::<B, 2>(fast.ids.clone()),
        ints::<B, 2>(slow.ids.clone())
    );
    assert_eq!(fast.confidence, slow.confidence);

    for evaluation in evaluations() {
        let inputs = |logits| small_inputs::<B>(&evaluation, logits, &fast, &device);
        let in_place = evaluation.run(inputs(&student)).unwrap();
        let portable = evaluation.run_host(inputs(&student)).unwrap();
        let fallback = evaluation.run(inputs(&view)).unwrap();
        for other in [portable, fallback] {
            let what = format!("{evaluation:?}");
            assert_eq!(
                floats::<B, 1>(in_place.value.clone()),
                floats::<B, 1>(other.value),
                "{what}"
            );
            let (ga, gb) = (
                in_place.grad_logits.clone().unwrap(),
                other.grad_logits.unwrap(),
            );
            assert_eq!(floats::<B, 3>(ga), floats::<B, 3>(gb), "{what}");
            assert_eq!(
                in_place.grad_weights.clone().map(floats::<B, 2>),
                other.grad_weights.map(floats::<B, 2>),
                "{what}"
            );
        }
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
