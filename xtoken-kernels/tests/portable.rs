//! The in-place ndarray path and the portable path (row chunks copied with `into_data`, which
//! every backend gets) give the same targets, loss and gradients; a view the kernels cannot read
//! in place falls back to the portable path with the same result; and both match an f64
//! reference written from the losses' definitions.

mod support;

use burn::backend::NdArray;
use burn::tensor::Tensor;
use support::reference::{self, Objective, Problem};
use support::{
    evaluations, floats, ints, logits, merge, projection_indices, projection_weights, small_inputs,
    teacher_spec, STUDENT_VOCAB, TEACHER_VOCAB,
};
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

/// P-KL (W rows summing to 1 and to 0.5, a wholly empty row) and the hybrid objectives (H-KL's
/// many-to-one set) on the host: the value against the f64 reference, both gradients against
/// its central differences.
#[test]
fn the_host_matches_an_f64_reference() {
    let device = Default::default();
    let (vs, vt) = (STUDENT_VOCAB, TEACHER_VOCAB);
    let teacher = logits::<B>(1, [2, 6, vt], &device);
    let student = logits::<B>(2, [2, 6, vs], &device);
    let spec = teacher_spec();
    let entries = B::xt_teacher_entries(teacher.clone().into_primitive().tensor(), &spec).unwrap();
    let wide = |t: &Tensor<B, 3>| -> Vec<f64> {
        let values = t.to_data().to_vec::<f32>().unwrap();
        values.into_iter().map(f64::from).collect()
    };
    let (zs, zt) = (wide(&student), wide(&teacher));
    let weights: Vec<f64> = projection_weights().into_iter().map(f64::from).collect();
    let (indices, merge) = (projection_indices(), merge());
    let problem = Problem {
        student: &zs,
        teacher: &zt,
        vs,
        vt,
        merge: &merge,
        tau: spec.tau as f64,
        top_k: spec.top_k,
        kw: 2,
        indices: &indices,
        weights: &weights,
        eps: 1e-10,
    };
    let mut checked = 0;
    for evaluation in evaluations() {
        let Some(objective) = Objective::of(&evaluation) else {
            continue;
        };
        let what = format!("{evaluation:?}");
        let out = evaluation
            .run(small_inputs::<B>(&evaluation, &student, &entries, &device))
            .unwrap();
        let value = floats::<B, 1>(out.value)[0] as f64;
        let want = reference::loss(&problem, &objective);
        assert!(
            (value - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{what}: {value} vs the reference {want}"
        );
        let grad = floats::<B, 3>(out.grad_logits.unwrap());
        let want: Vec<f64> = (0..zs.len())
            .map(|i| reference::partial(&problem, &objective, i, false))
            .collect();
        let tol = 1e-4 * xtoken_testkit::max_abs(&what, &want) + 1e-6;
        xtoken_testkit::assert_close(&format!("{what} grad logits"), &grad, &want, tol, 0.0);
        if let Some(gw) = out.grad_weights {
            let gw = floats::<B, 2>(gw);
            let want: Vec<f64> = (0..weights.len())
                .map(|i| reference::partial(&problem, &objective, i, true))
                .collect();
            let tol = 1e-4 * xtoken_testkit::max_abs(&what, &want) + 1e-6;
            xtoken_testkit::assert_close(&format!("{what} grad W"), &gw, &want, tol, 0.0);
        }
        checked += 1;
    }
    assert_eq!(checked, 4, "P-KL, GOLD, H-KL and ULD");
}

/// P-KL with a W whose every slot is empty is an error that names W, not a loss of `−log ε`.
#[test]
fn a_projection_without_entries_is_refused() {
    use burn::tensor::{Int, TensorData};
    let device = Default::default();
    let teacher = logits::<B>(1, [2, 6, TEACHER_VOCAB], &device);
    let student = logits::<B>(2, [2, 6, STUDENT_VOCAB], &device);
    let entries =
        B::xt_teacher_entries(teacher.into_primitive().tensor(), &teacher_spec()).unwrap();
    let evaluation = evaluations()
        .into_iter()
        .find(|e| e.reads_projection())
        .unwrap();
    let mut inputs = small_inputs::<B>(&evaluation, &student, &entries, &device);
    let shape = [STUDENT_VOCAB, 2];
    let projection = inputs.projection.as_mut().unwrap();
    projection.indices =
        Tensor::<B, 2, Int>::from_data(TensorData::new(vec![-1i64; 18], shape), &device)
            .into_primitive();
    let Err(err) = evaluation.run(inputs) else {
        panic!("an empty W was accepted");
    };
    assert!(err.to_string().contains("W has no entry"), "{err}");
}
