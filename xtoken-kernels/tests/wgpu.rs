//! The losses' backend operations on burn's wgpu backend (Mesa lavapipe on CPU in CI) give what
//! they give on ndarray: teacher entries, loss values and gradients for every loss and
//! cross-entropy, and the gradient through `Autodiff<Wgpu>`. Run with `--features wgpu`.
#![cfg(feature = "wgpu")]

mod support;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Tensor, TensorPrimitive};
use burn_wgpu::Wgpu;
use support::{evaluations, floats, ints, logits, merge, small_inputs, teacher_spec};
use xtoken_kernels::{DistillSpec, EntriesSpec, GradRequest, LossKind, XTokenBackend};

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
