//! The losses' backend operations on burn's wgpu backend (Mesa lavapipe on CPU in CI) give what
//! they give on ndarray: teacher entries, loss values and gradients for every loss and
//! cross-entropy, and the gradient through `Autodiff<Wgpu>`; with their checks deferred, they
//! read nothing back. Run with `--features wgpu`.
#![cfg(feature = "wgpu")]

use crate::support;

use super::Wgpu;
use crate::support::{evaluations, floats, ints, logits, merge, small_inputs, teacher_spec};
use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorPrimitive};
use xtoken_kernels::cube::reads;
use xtoken_kernels::deferred::defer;
use xtoken_kernels::layout::ProjectionLayout;
use xtoken_kernels::{DistillSpec, EntriesSpec, GradRequest, KernelError, LossKind, XTokenBackend};

/// Everything the two operations return on one backend, as host values.
fn outcomes<B: XTokenBackend>() -> Vec<Vec<f64>> {
    let device = Default::default();
    let (vs, vt) = (support::STUDENT_VOCAB, support::TEACHER_VOCAB);
    let teacher = logits::<B>(1, [2, 6, vt], &device);
    let student = logits::<B>(2, [2, 6, vs], &device);
    let spec = teacher_spec();
    let entries = B::xt_teacher_entries(teacher.into_primitive().tensor(), &spec).unwrap();
    let mut out = vec![
        floats::<B, 2>(entries.logp.clone())
            .into_iter()
            .map(f64::from)
            .collect(),
        ints::<B, 2>(entries.ids.clone())
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        entries
            .confidence
            .map(|c| vec![c.neg_cross_entropy, c.neg_entropy, c.max_prob])
            .unwrap_or_default(),
    ];
    for evaluation in evaluations() {
        let result = evaluation
            .run(small_inputs::<B>(&evaluation, &student, &entries, &device))
            .unwrap();
        out.push(
            floats::<B, 1>(result.value)
                .into_iter()
                .map(f64::from)
                .collect(),
        );
        out.push(
            floats::<B, 3>(result.grad_logits.unwrap())
                .into_iter()
                .map(f64::from)
                .collect(),
        );
        if let Some(g) = result.grad_weights {
            out.push(floats::<B, 2>(g).into_iter().map(f64::from).collect());
        }
    }
    out
}

#[test]
fn wgpu_matches_ndarray_for_every_loss() {
    let on_wgpu = outcomes::<Wgpu>();
    let on_ndarray = outcomes::<NdArray>();
    assert_eq!(on_wgpu.len(), on_ndarray.len());
    for (i, (a, b)) in on_wgpu.iter().zip(&on_ndarray).enumerate() {
        assert_eq!(a.len(), b.len(), "output {i}");
        for (x, y) in a.iter().zip(b) {
            assert!(
                x == y || (x - y).abs() <= 1e-6 * (1.0 + y.abs()),
                "output {i}: {x} vs {y}"
            );
        }
    }
}

#[test]
fn autodiff_on_wgpu_returns_the_fused_gradient() {
    type A = Autodiff<Wgpu>;
    let device = Default::default();
    let vs = support::STUDENT_VOCAB;
    let teacher = logits::<Wgpu>(3, [2, 6, vs], &device);
    let spec = EntriesSpec {
        next_token: None,
        ..teacher_spec()
    };
    let entries = <Wgpu>::xt_teacher_entries(teacher.into_primitive().tensor(), &spec).unwrap();
    let loss_spec = DistillSpec {
        loss: LossKind::Kl,
        merge: merge(),
        tau: 1.5,
        row_chunk: 2,
        common: None,
        lambda_kl: 1.0,
        lambda_uld: 1.0,
        eps: 1e-10,
    };
    let want = GradRequest {
        logits: true,
        weights: false,
    };
    let student = logits::<Wgpu>(2, [2, 6, vs], &device);
    let direct = <Wgpu>::xt_distill(
        student.clone().into_primitive().tensor(),
        entries.clone(),
        None,
        &loss_spec,
        want,
    )
    .unwrap();
    let tracked = Tensor::<A, 3>::from_inner(student).require_grad();
    let result = A::xt_distill(
        tracked.clone().into_primitive().tensor(),
        xtoken_kernels::TeacherEntries {
            ids: entries.ids,
            logp: Tensor::<A, 2>::from_inner(Tensor::<Wgpu, 2>::from_primitive(
                TensorPrimitive::Float(entries.logp),
            ))
            .into_primitive()
            .tensor(),
            k: entries.k,
            vocab: entries.vocab,
            confidence: entries.confidence,
            ids_in_vocab: entries.ids_in_vocab,
        },
        None,
        &loss_spec,
        GradRequest {
            logits: false,
            weights: false,
        },
    )
    .unwrap();
    let loss = Tensor::<A, 1>::from_primitive(TensorPrimitive::Float(result.value));
    let grads = loss.backward();
    let through_autodiff = tracked
        .grad(&grads)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let fused = floats::<Wgpu, 3>(direct.grad_logits.unwrap());
    assert_eq!(through_autodiff, fused);
}

/// wgpu's memory pools report what they hold, so a run's memory cap can be checked against them
/// after each step: a 64 MiB tensor grows them by at least that much.
#[test]
fn wgpu_reports_its_pools() {
    use burn::tensor::backend::Backend;
    use xtoken_kernels::memory::DeviceMemory;
    type W = Wgpu<f32>;
    let device = Default::default();
    let before = W::reserved_bytes(&device).expect("wgpu reports its pools");
    let big = Tensor::<W, 1>::ones([16 << 20], &device);
    W::sync(&device).unwrap();
    let after = W::reserved_bytes(&device).expect("wgpu reports its pools");
    assert!(after >= before + (64 << 20), "{before} → {after} bytes");
    drop(big);
    assert_eq!(W::free_bytes(&device), None);
}

/// Every evaluation of the small case on wgpu (the teacher's top-K, then each loss and
/// cross-entropy), W laid out once or not: the loss values, or the errors.
fn evaluate_all(
    student: &Tensor<Wgpu, 3>,
    teacher: &Tensor<Wgpu, 3>,
    laid_out: bool,
) -> Vec<Result<f32, KernelError>> {
    let device = Default::default();
    let (vs, vt) = (support::STUDENT_VOCAB, support::TEACHER_VOCAB);
    let spec = EntriesSpec {
        next_token: None,
        ..teacher_spec()
    };
    let entries = <Wgpu>::xt_teacher_entries(teacher.clone().into_primitive().tensor(), &spec)
        .expect("the teacher's entries");
    evaluations()
        .iter()
        .map(|evaluation| {
            let mut inputs = small_inputs::<Wgpu>(evaluation, student, &entries, &device);
            if let Some(w) = inputs.projection.as_mut().filter(|_| laid_out) {
                let ids = support::projection_indices();
                w.layout = Some(ProjectionLayout::new(ids, [vs, 2], vt).unwrap());
            }
            evaluation
                .run(inputs)
                .map(|out| floats::<Wgpu, 1>(out.value)[0])
        })
        .collect()
}

/// `t` with its first row (sequence 0, position 0) NaN.
fn nan_row(t: &Tensor<Wgpu, 3>) -> Tensor<Wgpu, 3> {
    let shape = t.dims();
    let mut values = floats::<Wgpu, 3>(t.clone().into_primitive().tensor());
    values[..shape[2]].fill(f32::NAN);
    Tensor::from_data(burn::tensor::TensorData::new(values, shape), &t.device())
}

/// As a training step runs them, under `deferred::defer()` and with W laid out once, the cube
/// kernels read nothing back from the device (`cube::reads` counts their reads) and give the
/// values of the eager path. A NaN row of the student (or of the teacher) then makes every loss
/// that reads it NaN on the device (a GPU's `max` drops NaN, so the kernels poison the value),
/// and `explain` names the row; eagerly, every evaluation refuses the student's row at once.
#[test]
fn deferred_checks_leave_the_kernels_without_reads() {
    let device = Default::default();
    let student = logits::<Wgpu>(2, [2, 6, support::STUDENT_VOCAB], &device);
    let teacher = logits::<Wgpu>(1, [2, 6, support::TEACHER_VOCAB], &device);
    let before = reads();
    let eager = evaluate_all(&student, &teacher, false);
    assert!(reads() > before, "the eager path reads its checks");

    let deferred = defer();
    let before = reads();
    let kept = evaluate_all(&student, &teacher, true);
    assert_eq!(reads(), before, "no read while deferred");
    for (a, b) in eager.iter().zip(&kept) {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert!(
            a.is_finite() && (a - b).abs() <= 1e-6 * (1.0 + a.abs()),
            "{a} vs {b}"
        );
    }
    deferred.explain().unwrap();

    for value in evaluate_all(&nan_row(&student), &teacher, true) {
        assert!(!value.unwrap().is_finite());
    }
    let e = deferred.explain().unwrap_err();
    assert!(e.to_string().contains("student logits: row 0"), "{e}");
    let values = evaluate_all(&student, &nan_row(&teacher), true);
    for (evaluation, value) in evaluations().iter().zip(values) {
        // KL reads a teacher of its own (see `entries_for`); cross-entropy none.
        let reads_teacher = !evaluation.is(LossKind::Kl) && evaluation.is_distill();
        assert_eq!(!value.unwrap().is_finite(), reads_teacher, "{evaluation:?}");
    }
    let e = deferred.explain().unwrap_err();
    assert!(e.to_string().contains("teacher logits: row 0"), "{e}");
    drop(deferred);
    for result in evaluate_all(&nan_row(&student), &teacher, true) {
        let e = result.unwrap_err();
        assert!(e.to_string().contains("row 0"), "{e}");
    }
}

/// The fused AdamW kernel (one launch per tensor) gives the composed update of ndarray within
/// f32 rounding: the first update from zero moments, with decay and a clipping scale, and two
/// more from its state.
#[test]
fn the_fused_adamw_kernel_matches_the_composed_update() {
    let fused = support::adamw_updates::<Wgpu>(&Default::default());
    let composed = support::adamw_updates::<NdArray>(&Default::default());
    for (step, (a, b)) in fused.iter().zip(&composed).enumerate() {
        for (what, (x, y)) in ["parameter", "m", "v"].iter().zip(a.iter().zip(b)) {
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                // A few f32 operations whose rounding (and contraction) may differ.
                assert!(
                    (x - y).abs() <= 1e-6 * y.abs().max(1e-3),
                    "step {}: {what}[{i}] = {x} fused, {y} composed",
                    step + 1
                );
            }
        }
    }
}
