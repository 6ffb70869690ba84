//! The in-place paths (ndarray's and burn-flex's f32 logits) and the portable path (row chunks copied with `into_data`, which
//! every backend gets) give the same targets, loss and gradients; a view the kernels cannot read
//! in place falls back to the portable path with the same result; and both match an f64
//! reference written from the losses' definitions.

use crate::support;

use crate::support::reference::{self, Objective, Problem};
use crate::support::{
    evaluations, floats, ints, logits, merge, projection_indices, projection_weights, small_inputs,
    teacher_spec, STUDENT_VOCAB, TEACHER_VOCAB,
};
use burn::backend::NdArray;
use burn::tensor::ops::FloatTensor;
use burn::tensor::Tensor;
use xtoken_kernels::{flex_reads_in_place, host, ndarray_reads_in_place, MergePlan, XTokenBackend};

type B = NdArray;

/// The same values as `logits`, as a transposed view (positions vary fastest) that cannot be
/// read as one contiguous slice.
fn strided<B: XTokenBackend>(logits: &Tensor<B, 3>) -> Tensor<B, 3> {
    let flipped = logits.clone().swap_dims(1, 2).to_data();
    Tensor::<B, 3>::from_data(flipped, &logits.device()).swap_dims(1, 2)
}

#[test]
fn portable_and_in_place_paths_agree() {
    paths_agree::<NdArray>(ndarray_reads_in_place);
    paths_agree::<burn_flex::Flex>(flex_reads_in_place);
}

fn paths_agree<B: XTokenBackend>(reads_in_place: fn(&FloatTensor<B>) -> bool) {
    let device = Default::default();
    let (vs, vt) = (support::STUDENT_VOCAB, support::TEACHER_VOCAB);
    let teacher = logits::<B>(1, [2, 6, vt], &device);
    let student = logits::<B>(2, [2, 6, vs], &device);
    // The trait methods below take the in-place path for these tensors, the strided view not.
    assert!(reads_in_place(&teacher.clone().into_primitive().tensor()));
    assert!(reads_in_place(&student.clone().into_primitive().tensor()));
    let view = strided(&student);
    assert!(!reads_in_place(&view.clone().into_primitive().tensor()));
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

/// burn-flex holds bf16 logits: every loss reads them, gives the f32 result to bf16's
/// precision, and returns its value in f32 (a 16-bit value meeting the loss's other f32 values
/// would be read as f32: a bf16 student's KD of about 1 came out as 2.28e-41, the bit pattern
/// 0x3F80 read as an f32), the logits' gradient in bf16 (it flows into a bf16 output head) and
/// W's in W's dtype.
#[test]
fn bf16_logits_give_an_f32_value_and_gradients_in_their_inputs_dtypes() {
    use burn::tensor::DType;
    use burn_flex::Flex;
    let (vs, vt) = (support::STUDENT_VOCAB, support::TEACHER_VOCAB);
    let (host, flex) = (Default::default(), Default::default());
    let reference = {
        let teacher = logits::<B>(1, [2, 6, vt], &host);
        B::xt_teacher_entries(teacher.into_primitive().tensor(), &teacher_spec()).unwrap()
    };
    let teacher = logits::<Flex>(1, [2, 6, vt], &flex);
    let entries = Flex::xt_teacher_entries(teacher.into_primitive().tensor(), &teacher_spec());
    let entries = entries.unwrap();
    let student = logits::<Flex>(2, [2, 6, vs], &flex).cast(DType::BF16);
    let rounded = Tensor::<B, 3>::from_data(student.to_data().convert::<f32>(), &host);
    for evaluation in evaluations() {
        let what = format!("{evaluation:?}");
        let out = evaluation
            .run(small_inputs::<Flex>(&evaluation, &student, &entries, &flex))
            .unwrap();
        let want = evaluation
            .run(small_inputs::<B>(&evaluation, &rounded, &reference, &host))
            .unwrap();
        let tensor = |t| Tensor::<Flex, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(t));
        assert_eq!(tensor(out.value.clone()).dtype(), DType::F32, "{what}");
        let (value, expected) = (
            floats::<Flex, 1>(out.value)[0],
            floats::<B, 1>(want.value)[0],
        );
        // The logits are the same bf16 values on both sides; only the upload of the teacher's
        // entries and the order of the sums differ.
        assert!(
            (value - expected).abs() <= 1e-4 * expected.abs().max(1.0),
            "{what}: flex {value} vs ndarray {expected}"
        );
        let grad = out.grad_logits.expect("asked for");
        let grad_dtype =
            Tensor::<Flex, 3>::from_primitive(burn::tensor::TensorPrimitive::Float(grad.clone()))
                .dtype();
        assert_eq!(grad_dtype, DType::BF16, "{what}");
        let (got, want_grad) = (
            floats::<Flex, 3>(grad),
            floats::<B, 3>(want.grad_logits.unwrap()),
        );
        let scale = want_grad.iter().fold(0f32, |m, g| m.max(g.abs()));
        for (a, b) in got.iter().zip(&want_grad) {
            // bf16 keeps 8 significant bits: a relative rounding of 2^-8 at most.
            assert!(
                (a - b).abs() <= 4e-3 * b.abs() + 1e-6 * scale,
                "{what}: {a} vs {b}"
            );
        }
        if let Some(gw) = out.grad_weights {
            let gw = Tensor::<Flex, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(gw));
            assert_eq!(gw.dtype(), DType::F32, "{what}: W's gradient");
        }
    }
}
