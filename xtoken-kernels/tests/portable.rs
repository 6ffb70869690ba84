//! The portable path (row chunks copied with `into_data`, which every backend gets) and the
//! in-place ndarray path give the same targets, loss and gradients.

mod support;

use burn::backend::NdArray;
use support::{evaluations, floats, ints, logits, small_inputs, teacher_spec};
use xtoken_kernels::{host, MergePlan, XTokenBackend};

type B = NdArray;

#[test]
fn portable_and_in_place_paths_agree() {
    let device = Default::default();
    let (vs, vt) = (support::STUDENT_VOCAB, support::TEACHER_VOCAB);
    let teacher = logits::<B>(1, [2, 6, vt], &device);
    let student = logits::<B>(2, [2, 6, vs], &device);
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
        let inputs = || small_inputs::<B>(&evaluation, &student, &fast, &device);
        let a = evaluation.run(inputs()).unwrap();
        let b = evaluation.run_host(inputs()).unwrap();
        assert_eq!(
            floats::<B, 1>(a.value),
            floats::<B, 1>(b.value),
            "{evaluation:?}"
        );
        let (ga, gb) = (a.grad_logits.unwrap(), b.grad_logits.unwrap());
        assert_eq!(floats::<B, 3>(ga), floats::<B, 3>(gb), "{evaluation:?}");
        assert_eq!(
            a.grad_weights.map(floats::<B, 2>),
            b.grad_weights.map(floats::<B, 2>),
            "{evaluation:?}"
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
