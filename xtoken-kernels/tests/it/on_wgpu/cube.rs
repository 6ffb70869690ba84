//! The cubecl kernels (burn's wgpu backend; Mesa lavapipe on CPU in CI) against the portable
//! host implementation on ndarray, on random cases shaped to catch kernel bugs: vocabularies
//! and K that are not multiples of the cube size, W rows that are all empty slots, `-1` slots,
//! extreme logits, merged chunks, skipped slots and a row that both predicts and continues.
//! Then the gradients against finite differences on the device, bit-reproducibility, f16
//! logits and the errors. Run with `--features wgpu`.
#![cfg(feature = "wgpu")]

use std::sync::Arc;

use super::Wgpu;
use crate::support::reference::{self, Objective, Problem};
use crate::support::{Evaluation, Inputs};
use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};
use xtoken_kernels::traffic::{recording, total, Launch};
use xtoken_kernels::{
    CommonPairs, DistillSpec, EntriesSpec, GradRequest, KernelError, LossKind, MergePlan,
    ProjectionTensors, XTokenBackend,
};

fn mix(i: u64, salt: u64) -> u64 {
    let mut x = (i ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x632b_e59b_d9b4_e019);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Uniform in [-1, 1).
fn unit(i: u64, salt: u64) -> f32 {
    (mix(i, salt) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// A random case on the host.
struct Case {
    batch: usize,
    len: usize,
    student_vocab: usize,
    teacher_vocab: usize,
    top_k: usize,
    kw: usize,
    tau: f32,
    row_chunk: usize,
    student: Vec<f32>,
    teacher: Vec<f32>,
    /// A teacher as wide as the student, for KL (its ids index the student vocabulary).
    narrow_teacher: Vec<f32>,
    indices: Vec<i64>,
    weights: Vec<f32>,
    merge: MergePlan,
    targets: Vec<i32>,
}

impl Case {
    fn new(batch: usize, len: usize, (vs, vt): (usize, usize), top_k: usize, salt: u64) -> Self {
        let n = batch * len;
        let mut student: Vec<f32> = (0..n * vs).map(|i| 6.0 * unit(i as u64, salt)).collect();
        // Extreme rows: one logit far above the rest, one far below, a row of huge values.
        student[5 * vs + 17] = 80.0;
        student[11 * vs + 3] = -1.0e4;
        if n > 13 {
            for x in &mut student[13 * vs..14 * vs] {
                *x += 300.0;
            }
        }
        let teacher = (0..n * vt)
            .map(|i| 5.0 * unit(i as u64, salt + 1))
            .collect();
        let narrow_teacher = (0..n * vs)
            .map(|i| 5.0 * unit(i as u64, salt + 2))
            .collect();
        let kw = 3;
        let mut indices = vec![-1i64; vs * kw];
        let mut weights = vec![0.0f32; vs * kw];
        for s in 0..vs {
            if s % 50 == 7 {
                continue; // an empty row
            }
            let used = 1 + (mix(s as u64, salt + 3) % kw as u64) as usize;
            let mut total = 0.0;
            for k in 0..used {
                let id = (mix((s * kw + k) as u64, salt + 4) % vt as u64) as i64;
                if indices[s * kw..s * kw + k].contains(&id) {
                    continue; // a -1 slot
                }
                indices[s * kw + k] = id;
                weights[s * kw + k] = 0.2 + unit((s * kw + k) as u64, salt + 5).abs();
                total += weights[s * kw + k];
            }
            for w in &mut weights[s * kw..(s + 1) * kw] {
                *w /= total;
            }
        }
        // Chunks of 1–3 positions: the first position predicts, the others continue it; the
        // last 4 positions of the last sequence are padding (skipped slots).
        let mut predict_row = Vec::new();
        let mut continuation = Vec::new();
        for b in 0..batch {
            let mut p = 0;
            while p < len {
                let size = 1 + (mix((b * len + p) as u64, salt + 6) % 3) as usize;
                let slot = predict_row.len() as u32;
                let padded = b + 1 == batch && p + 4 >= len;
                predict_row.push((!padded).then_some((b * len + p) as u32));
                for q in p + 1..(p + size).min(len) {
                    // The teacher side reads the same plan: a token both vocabularies have.
                    let token = (mix((b * len + q) as u64, salt + 7) % vs.min(vt) as u64) as u32;
                    continuation.push(((b * len + q) as u32, token, slot));
                }
                p += size;
            }
        }
        // A row that predicts one slot and also continues another.
        if let Some(row) = predict_row[3] {
            continuation.push((row, 11, 1));
        }
        let targets = (0..n)
            .map(|r| {
                if r % 9 == 4 {
                    -1
                } else {
                    (mix(r as u64, salt + 8) % vs as u64) as i32
                }
            })
            .collect();
        Self {
            batch,
            len,
            student_vocab: vs,
            teacher_vocab: vt,
            top_k,
            kw,
            tau: 0.7,
            row_chunk: 5,
            student,
            teacher,
            narrow_teacher,
            indices,
            weights,
            merge: MergePlan {
                rows: n,
                predict_row,
                continuation,
            },
            targets,
        }
    }

    /// The teacher's extraction on the case's plan.
    fn entries_spec(&self) -> EntriesSpec {
        EntriesSpec {
            merge: self.merge.clone(),
            top_k: self.top_k,
            tau: self.tau,
            row_chunk: 4,
            next_token: None,
        }
    }

    fn evaluations(&self) -> Vec<Evaluation> {
        let (vs, vt) = (self.student_vocab, self.teacher_vocab);
        // A 1-to-1 common set over about 70 % of the student vocabulary.
        let mut teacher_ids: Vec<u32> = (0..vt as u32).collect();
        for i in (1..vt).rev() {
            teacher_ids.swap(i, (mix(i as u64, 31) % (i as u64 + 1)) as usize);
        }
        let pairs: Vec<(u32, u32)> = (0..vs as u32)
            .filter(|&s| mix(s as u64, 32) % 10 < 7)
            .zip(teacher_ids)
            .collect();
        let common = CommonPairs::new(&pairs, vs, vt).unwrap();
        // H-KL's relaxed set adds, for half the other student ids, a teacher id that another
        // pair may already hold: many-to-one (GOLD runs the same code on its 1-to-1 set).
        let mut relaxed = pairs.clone();
        relaxed.extend(
            (0..vs as u32)
                .filter(|s| {
                    common.student_partner[*s as usize] < 0 && mix(*s as u64, 33).is_multiple_of(2)
                })
                .map(|s| (s, (mix(s as u64, 34) % vt as u64) as u32)),
        );
        let relaxed = CommonPairs::new(&relaxed, vs, vt).unwrap();
        assert!((0..vt).any(|t| relaxed.students_of(t).len() > 1));
        vec![
            Evaluation::distill(LossKind::Kl, None, (1.0, 1.0)),
            Evaluation::distill(LossKind::Pkl, None, (1.0, 1.0)),
            Evaluation::distill(LossKind::Hkl, Some(relaxed), (0.8, 1.0)),
            // Plain ULD: no common set.
            Evaluation::distill(LossKind::Uld, None, (1.0, 1.0)),
            Evaluation::CrossEntropy(Arc::from(self.targets.clone())),
        ]
    }
}

/// What one evaluation returns, on the host.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    value: f32,
    grad_logits: Vec<f32>,
    grad_weights: Option<Vec<f32>>,
    /// The dtypes of the value, the logits' gradient and W's.
    dtypes: (DType, DType, Option<DType>),
    /// What the loss's launches declared they move (not the teacher's extraction).
    launches: Vec<Launch>,
}

fn floats<B: Backend>(t: burn::tensor::ops::FloatTensor<B>) -> Vec<f32> {
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t))
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 data")
}

fn flat<B: Backend, const D: usize>(
    t: burn::tensor::ops::FloatTensor<B>,
) -> burn::tensor::ops::FloatTensor<B> {
    let t = Tensor::<B, D>::from_primitive(TensorPrimitive::Float(t));
    let n = t.shape().num_elements();
    t.reshape([n]).into_primitive().tensor()
}

/// Evaluates `evaluation` on backend `B` with the case's data, student logits replaced by
/// `student` and W's weights by `weights` (for the finite differences), logits in `dtype`.
fn evaluate<B: XTokenBackend>(
    case: &Case,
    evaluation: &Evaluation,
    student: &[f32],
    weights: &[f32],
    dtype: DType,
) -> Result<Outcome, KernelError> {
    let device = Default::default();
    let (b, t, vs, vt) = (case.batch, case.len, case.student_vocab, case.teacher_vocab);
    let kl = evaluation.is(LossKind::Kl);
    let (teacher, width) = if kl {
        (case.narrow_teacher.clone(), vs)
    } else {
        (case.teacher.clone(), vt)
    };
    let teacher = Tensor::<B, 3>::from_data(TensorData::new(teacher, [b, t, width]), &device);
    let entries = B::xt_teacher_entries(teacher.into_primitive().tensor(), &case.entries_spec())?;
    let logits = Tensor::<B, 3>::from_data(TensorData::new(student.to_vec(), [b, t, vs]), &device)
        .cast(dtype);
    let projection = evaluation.reads_projection().then(|| ProjectionTensors {
        indices: Tensor::<B, 2, Int>::from_data(
            TensorData::new(case.indices.clone(), [vs, case.kw]),
            &device,
        )
        .into_primitive(),
        weights: Tensor::<B, 2>::from_data(
            TensorData::new(weights.to_vec(), [vs, case.kw]),
            &device,
        )
        .into_primitive()
        .tensor(),
        layout: None,
    });
    let (out, launches) = recording(|| {
        evaluation.run(Inputs::<B> {
            logits: logits.into_primitive().tensor(),
            teacher: entries,
            projection,
            merge: case.merge.clone(),
            tau: case.tau,
            row_chunk: case.row_chunk,
            want: GradRequest {
                logits: true,
                weights: true,
            },
        })
    });
    let out = out?;
    let dtype = |t: &burn::tensor::ops::FloatTensor<B>| {
        Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t.clone())).dtype()
    };
    let grad = out.grad_logits.as_ref().expect("asked for");
    let dtypes = (
        dtype(&out.value),
        dtype(grad),
        out.grad_weights.as_ref().map(dtype),
    );
    Ok(Outcome {
        dtypes,
        launches,
        value: floats::<B>(out.value)[0],
        grad_logits: floats::<B>(flat::<B, 3>(out.grad_logits.expect("asked for"))),
        grad_weights: out.grad_weights.map(|g| floats::<B>(flat::<B, 2>(g))),
    })
}

fn assert_close(what: &str, device: &[f32], host: &[f32], rel: f32) {
    let scale = xtoken_testkit::max_abs(what, host);
    xtoken_testkit::assert_close(what, device, host, rel as f64 * scale + 1e-9, 0.0);
}

fn compare(case: &Case) {
    for evaluation in case.evaluations() {
        let on_device =
            evaluate::<Wgpu>(case, &evaluation, &case.student, &case.weights, DType::F32).unwrap();
        let on_host =
            evaluate::<NdArray>(case, &evaluation, &case.student, &case.weights, DType::F32)
                .unwrap();
        let name = format!("{evaluation:?}")
            .chars()
            .take(12)
            .collect::<String>();
        let (a, b) = (on_device.value, on_host.value);
        assert!(
            (a - b).abs() <= 2e-5 * b.abs().max(1.0),
            "{name} value: device {a} vs host {b}"
        );
        assert_close(
            &format!("{name} grad logits"),
            &on_device.grad_logits,
            &on_host.grad_logits,
            2e-5,
        );
        match (&on_device.grad_weights, &on_host.grad_weights) {
            (Some(a), Some(b)) => assert_close(&format!("{name} grad weights"), a, b, 2e-5),
            (None, None) => {}
            _ => panic!("{name}: one side returned W's gradient, the other not"),
        }
    }
}

#[test]
fn kernels_match_the_host_on_odd_sizes() {
    // 1000 and 1237 are not multiples of any cube size; K = 300 leaves a partial block.
    compare(&Case::new(2, 37, (1000, 1237), 300, 1));
}

#[test]
fn kernels_match_the_host_with_k_above_the_block_and_one_row() {
    compare(&Case::new(1, 20, (300, 257), 257, 2));
}

#[test]
fn kernels_match_the_host_when_a_rows_split_bin_overflows() {
    // Student logits on a grid of 8: most are 0, so the student's uncommon top-K (GOLD, H-KL,
    // ULD) finds more candidates in its split bin than its scratch list holds, at both levels.
    let base = Case::new(1, 20, (300, 257), 100, 3);
    let mut case = Case::new(1, 20, (300, 257), 100, 3);
    for x in &mut case.student {
        *x = (*x / 8.0).round() * 8.0;
    }
    compare(&case);
    // Logits in [4, 4.75]: one first-level bin, split by the second level.
    let mut case = base;
    for x in &mut case.student {
        *x = 4.0 + x.abs() / 8.0;
    }
    compare(&case);
}

/// The launches' declared traffic on a 1-to-1 plan (`xtoken_kernels::traffic`): the teacher's
/// top-K, P-KL, KL and the cross-entropy read their logits in full twice (the row pass, then
/// the selection or the gradient's pass), the hybrid losses three times (the row pass, their
/// uncommon top-K, the gradient's pass); besides, only gathers at single ids. Each loss writes
/// its gradient in full once and reads it back only where it adds a sparse term.
#[test]
fn the_operations_read_their_logits_a_fixed_number_of_times() {
    let mut case = Case::new(2, 37, (1000, 1237), 300, 1);
    let n = case.batch * case.len;
    case.merge = MergePlan {
        rows: n,
        predict_row: (0..n as u32).map(Some).collect(),
        continuation: Vec::new(),
    };
    let gathers = [
        "merge_shift",
        "pkl_entries",
        "cross_entropy_terms",
        "kl_slots",
        "hybrid_slots",
    ];
    let sparse_grad = ["kl_grad_sparse", "hybrid_grad_sparse"];
    let dense = |launches: &[Launch], skip: &[&str]| -> (u64, u64, u64) {
        let kept: Vec<Launch> = launches
            .iter()
            .filter(|l| !skip.contains(&l.kernel))
            .copied()
            .collect();
        let (read, written) = total(&kept);
        (read.logits, read.gradient, written.gradient)
    };
    let pass = (n * case.student_vocab * 4) as u64;
    for evaluation in case.evaluations() {
        let name = format!("{evaluation:?}")
            .chars()
            .take(12)
            .collect::<String>();
        let found =
            evaluate::<Wgpu>(&case, &evaluation, &case.student, &case.weights, DType::F32).unwrap();
        let passes = if evaluation.is(LossKind::Hkl) || evaluation.is(LossKind::Uld) {
            3
        } else {
            2
        };
        let (read, _, _) = dense(&found.launches, &gathers);
        assert_eq!(read, passes * pass, "{name}: full reads of the logits");
        let (_, grad_read, grad_written) = dense(&found.launches, &sparse_grad);
        assert_eq!(grad_read, 0, "{name}: full reads of the gradient");
        assert_eq!(grad_written, pass, "{name}: full writes of the gradient");
    }
    let teacher = Tensor::<Wgpu, 3>::from_data(
        TensorData::new(
            case.teacher.clone(),
            [case.batch, case.len, case.teacher_vocab],
        ),
        &Default::default(),
    );
    let spec = case.entries_spec();
    let (entries, launches) =
        recording(|| <Wgpu>::xt_teacher_entries(teacher.into_primitive().tensor(), &spec));
    entries.unwrap();
    let (read, _, _) = dense(&launches, &gathers);
    assert_eq!(
        read,
        2 * (n * case.teacher_vocab * 4) as u64,
        "teacher top-K"
    );
}

/// Central differences of the device loss at the coordinates with the largest gradient and a
/// few others, for the logits and (P-KL) W's weights. The hybrid objectives' sorted L1 has kinks
/// where a difference changes sign; their gradient is checked against the host's.
#[test]
fn device_gradients_match_finite_differences() {
    let case = Case::new(1, 12, (300, 350), 40, 3);
    for evaluation in case.evaluations() {
        if evaluation.is(LossKind::Hkl) || evaluation.is(LossKind::Uld) {
            continue;
        }
        let base =
            evaluate::<Wgpu>(&case, &evaluation, &case.student, &case.weights, DType::F32).unwrap();
        let mut order: Vec<usize> = (0..base.grad_logits.len()).collect();
        order.sort_by(|&a, &b| {
            base.grad_logits[b]
                .abs()
                .total_cmp(&base.grad_logits[a].abs())
        });
        let mut picks: Vec<usize> = order[..6].to_vec();
        picks.extend((0..4).map(|i| (mix(i, 9) % base.grad_logits.len() as u64) as usize));
        let scale = base.grad_logits[order[0]].abs();
        let h = 1e-2f32;
        for &i in &picks {
            let mut plus = case.student.clone();
            let mut minus = case.student.clone();
            plus[i] += h;
            minus[i] -= h;
            let f = |z: &[f32]| {
                evaluate::<Wgpu>(&case, &evaluation, z, &case.weights, DType::F32)
                    .unwrap()
                    .value
            };
            let numeric = (f(&plus) - f(&minus)) / (2.0 * h);
            let analytic = base.grad_logits[i];
            assert!(
                (numeric - analytic).abs() <= 2e-3 * scale + 2e-4,
                "{evaluation:?} logit {i}: finite difference {numeric} vs kernel {analytic}"
            );
        }
        if let Some(gw) = &base.grad_weights {
            let mut order: Vec<usize> = (0..gw.len()).collect();
            order.sort_by(|&a, &b| gw[b].abs().total_cmp(&gw[a].abs()));
            let scale = gw[order[0]].abs();
            for &i in &order[..6] {
                let mut plus = case.weights.clone();
                let mut minus = case.weights.clone();
                plus[i] += h;
                minus[i] -= h;
                let f = |w: &[f32]| {
                    evaluate::<Wgpu>(&case, &evaluation, &case.student, w, DType::F32)
                        .unwrap()
                        .value
                };
                let numeric = (f(&plus) - f(&minus)) / (2.0 * h);
                assert!(
                    (numeric - gw[i]).abs() <= 2e-3 * scale + 2e-4,
                    "W weight {i}: finite difference {numeric} vs kernel {}",
                    gw[i]
                );
            }
        }
    }
}

/// The device against the f64 reference written from the definitions: P-KL re-normalized over
/// W's rows (an empty row, rows of one to three slots) and H-KL on a many-to-one set, the value
/// and both gradients (central differences of the reference): the logits' at the largest and at
/// random coordinates, W's everywhere.
#[test]
fn device_matches_an_f64_reference() {
    let case = Case::new(1, 12, (300, 350), 40, 3);
    let wide = |x: &[f32]| -> Vec<f64> { x.iter().map(|&v| v as f64).collect() };
    let (zs, zt, weights) = (
        wide(&case.student),
        wide(&case.teacher),
        wide(&case.weights),
    );
    let problem = Problem {
        student: &zs,
        teacher: &zt,
        vs: case.student_vocab,
        vt: case.teacher_vocab,
        merge: &case.merge,
        tau: case.tau as f64,
        top_k: case.top_k,
        kw: case.kw,
        indices: &case.indices,
        weights: &weights,
        eps: 1e-10,
    };
    // The coordinates with the largest gradients, and a few others.
    let picks = |g: &[f32], salt: u64| {
        let mut order: Vec<usize> = (0..g.len()).collect();
        order.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
        let mut picks = order[..6].to_vec();
        picks.extend((0..6).map(|i| (mix(i, salt) % g.len() as u64) as usize));
        picks
    };
    let mut checked = Vec::new();
    for evaluation in case.evaluations() {
        let Some(objective) = Objective::of(&evaluation) else {
            continue;
        };
        if evaluation.is(LossKind::Uld) {
            continue;
        }
        let what = format!("{evaluation:?}");
        let out =
            evaluate::<Wgpu>(&case, &evaluation, &case.student, &case.weights, DType::F32).unwrap();
        let want = reference::loss(&problem, &objective);
        assert!(
            (out.value as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
            "{what}: device {} vs the reference {want}",
            out.value
        );
        let scale = xtoken_testkit::max_abs(&what, &out.grad_logits);
        for i in picks(&out.grad_logits, 11) {
            let want = reference::partial(&problem, &objective, i, false);
            let got = out.grad_logits[i] as f64;
            assert!(
                (got - want).abs() <= 1e-3 * want.abs() + 1e-5 * scale,
                "{what} logit {i}: device {got} vs the reference {want}"
            );
        }
        if let Some(gw) = &out.grad_weights {
            let scale = xtoken_testkit::max_abs(&what, gw);
            for (i, &got) in gw.iter().enumerate() {
                let want = reference::partial(&problem, &objective, i, true);
                assert!(
                    (got as f64 - want).abs() <= 1e-3 * want.abs() + 1e-5 * scale + 1e-9,
                    "{what} W weight {i}: device {got} vs the reference {want}"
                );
            }
        }
        checked.push(what);
    }
    assert_eq!(checked.len(), 2, "P-KL and H-KL: {checked:?}");
}

#[test]
fn device_results_are_bit_reproducible() {
    let case = Case::new(2, 37, (1000, 1237), 300, 4);
    for evaluation in case.evaluations() {
        let run = || {
            evaluate::<Wgpu>(&case, &evaluation, &case.student, &case.weights, DType::F32).unwrap()
        };
        let first = run();
        let second = run();
        assert_eq!(first.value.to_bits(), second.value.to_bits());
        assert!(first
            .grad_logits
            .iter()
            .zip(&second.grad_logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_eq!(first.grad_weights, second.grad_weights);
    }
}

#[test]
fn f16_logits_give_the_f32_result_to_f16_precision() {
    let case = Case::new(1, 20, (300, 257), 64, 5);
    // The extreme rows overflow f16; keep them in range.
    let student: Vec<f32> = case.student.iter().map(|x| x.clamp(-60.0, 60.0)).collect();
    for evaluation in case.evaluations() {
        let full =
            evaluate::<Wgpu>(&case, &evaluation, &student, &case.weights, DType::F32).unwrap();
        let half =
            evaluate::<Wgpu>(&case, &evaluation, &student, &case.weights, DType::F16).unwrap();
        assert!(
            (full.value - half.value).abs() <= 2e-2 * full.value.abs().max(1.0),
            "{evaluation:?}: f16 {} vs f32 {}",
            half.value,
            full.value
        );
        assert_close("f16 grad", &half.grad_logits, &full.grad_logits, 2e-2);
        // The value is a reduction and meets other f32 values: f32 whatever the logits' dtype
        // (an f16 value there would be read as f32's bits). Each gradient in its input's dtype.
        let w = half.grad_weights.is_some().then_some(DType::F32);
        assert_eq!(half.dtypes, (DType::F32, DType::F16, w), "{evaluation:?}");
    }
}

#[test]
fn a_nan_in_a_compared_row_is_an_error_naming_it() {
    let case = Case::new(1, 12, (300, 350), 40, 6);
    let row = case.merge.predict_row[2].expect("slot 2 is compared") as usize;
    let mut student = case.student.clone();
    student[row * case.student_vocab + 9] = f32::NAN;
    for evaluation in case.evaluations() {
        if let Evaluation::CrossEntropy(targets) = &evaluation {
            assert!(targets[row] >= 0, "row {row} has a target");
        }
        let err = evaluate::<Wgpu>(&case, &evaluation, &student, &case.weights, DType::F32)
            .expect_err("NaN logits must fail");
        assert!(
            matches!(err, KernelError::NonFinite { side: "student", row: r } if r == row),
            "{evaluation:?}: {err}"
        );
    }
}

#[test]
fn out_of_range_teacher_ids_are_refused_on_the_device() {
    let device = Default::default();
    let (vs, k) = (40, 4);
    let merge = MergePlan {
        rows: 2,
        predict_row: vec![Some(0), Some(1)],
        continuation: vec![],
    };
    let ids = vec![0i64, 1, 2, 3, 4, 5, 6, vs as i64];
    let entries = xtoken_kernels::TeacherEntries::<Wgpu> {
        ids: Tensor::<Wgpu, 2, Int>::from_data(TensorData::new(ids, [2, k]), &device)
            .into_primitive(),
        logp: Tensor::<Wgpu, 2>::from_data(TensorData::new(vec![-1.5f32; 2 * k], [2, k]), &device)
            .into_primitive()
            .tensor(),
        k,
        vocab: vs,
        confidence: None,
        ids_in_vocab: false,
    };
    let logits = Tensor::<Wgpu, 3>::zeros([1, 2, vs], &device);
    let spec = DistillSpec {
        loss: LossKind::Kl,
        merge,
        tau: 1.0,
        row_chunk: 4,
        common: None,
        lambda_kl: 1.0,
        lambda_uld: 1.0,
        eps: 1e-10,
    };
    let err = <Wgpu>::xt_distill(
        logits.into_primitive().tensor(),
        entries,
        None,
        &spec,
        GradRequest::default(),
    )
    .expect_err("id 40 is outside a 40-token vocabulary");
    assert!(
        matches!(
            err,
            KernelError::IndexOutOfRange {
                index: 40,
                size: 40,
                ..
            }
        ),
        "{err}"
    );
}

/// Teacher entries (ids exactly, log-probabilities and confidence closely) on the device and on
/// the host, for K below, at and far below the vocabulary, with many ties and −∞ logits.
#[test]
fn device_top_k_matches_the_host() {
    let device = Default::default();
    for (case_index, (v, k, step)) in [
        (1237, 300, 0.0),
        (257, 257, 0.0),
        (1000, 1, 0.0),
        (700, 699, 0.5),
        (513, 64, 0.25),
        // Every logit in [4, 4.8]: one histogram bin holds them all, more than the scratch
        // list; the second-level split resolves them.
        (600, 100, -1.0),
        // Nearly every logit is ±0: the second level overflows too, and the rows take the
        // radix select.
        (600, 100, 8.0),
    ]
    .into_iter()
    .enumerate()
    {
        let (b, t) = (2, 9);
        let n = b * t;
        let mut logits: Vec<f32> = (0..n * v)
            .map(|i| {
                let x = 4.0 * unit(i as u64, 20 + case_index as u64);
                if step > 0.0 {
                    (x / step).round() * step // many ties
                } else if step < 0.0 {
                    4.0 + x.abs() / 5.0
                } else {
                    x
                }
            })
            .collect();
        logits[3 * v + 5] = f32::NEG_INFINITY;
        logits[3 * v + 6] = f32::NEG_INFINITY;
        logits[4 * v + 1] = 40.0;
        let merge = MergePlan {
            rows: n,
            predict_row: (0..n as u32).map(|r| (r % 5 != 2).then_some(r)).collect(),
            continuation: vec![(2, 7, 1), (7, 3, 6), (9, 0, 6), (12, 1, 11)],
        };
        let next: Vec<i32> = (0..n)
            .map(|r| if r % 4 == 1 { -1 } else { (r * 31 % v) as i32 })
            .collect();
        let spec = EntriesSpec {
            merge,
            top_k: k,
            tau: 1.3,
            row_chunk: 4,
            next_token: Some(Arc::from(next)),
        };
        let run = |on_device: bool| {
            let data = TensorData::new(logits.clone(), [b, t, v]);
            if on_device {
                let z = Tensor::<Wgpu, 3>::from_data(data, &device);
                let e = <Wgpu>::xt_teacher_entries(z.into_primitive().tensor(), &spec).unwrap();
                (
                    Tensor::<Wgpu, 2, Int>::from_primitive(e.ids)
                        .into_data()
                        .convert::<i64>()
                        .to_vec::<i64>()
                        .unwrap(),
                    floats::<Wgpu>(flat::<Wgpu, 2>(e.logp)),
                    e.confidence.unwrap(),
                )
            } else {
                let z = Tensor::<NdArray, 3>::from_data(data, &Default::default());
                let e = <NdArray>::xt_teacher_entries(z.into_primitive().tensor(), &spec).unwrap();
                (
                    Tensor::<NdArray, 2, Int>::from_primitive(e.ids)
                        .into_data()
                        .convert::<i64>()
                        .to_vec::<i64>()
                        .unwrap(),
                    floats::<NdArray>(flat::<NdArray, 2>(e.logp)),
                    e.confidence.unwrap(),
                )
            }
        };
        let (device_ids, device_logp, device_conf) = run(true);
        let (host_ids, host_logp, host_conf) = run(false);
        if let Some(i) = (0..host_ids.len()).find(|&i| device_ids[i] != host_ids[i]) {
            panic!(
                "V = {v}, K = {k}: id {i} (slot {}, entry {}): device {:?} vs host {:?}",
                i / k,
                i % k,
                &device_ids[i.saturating_sub(2)..(i + 3).min(k * (i / k + 1))],
                &host_ids[i.saturating_sub(2)..(i + 3).min(k * (i / k + 1))]
            );
        }
        for (i, (a, b)) in device_logp.iter().zip(&host_logp).enumerate() {
            assert!(
                a == b || (a - b).abs() <= 2e-5 * b.abs().max(1.0),
                "V = {v}, K = {k}: log-probability {i}: device {a} vs host {b}"
            );
        }
        for (a, b) in [
            (device_conf.neg_cross_entropy, host_conf.neg_cross_entropy),
            (device_conf.neg_entropy, host_conf.neg_entropy),
            (device_conf.max_prob, host_conf.max_prob),
        ] {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "V = {v}: confidence {a} vs {b}"
            );
        }
        assert_eq!(device_conf.positions, host_conf.positions);
    }
}

/// `xtoken teach`'s selection on the device (every row's top-K, its observed token's
/// log-probability and rank, the confidence terms per row) gives the host's: the same ids and
/// ranks, values within f32 rounding — tempered and not, with ties, −∞ logits and a row
/// without a next token.
#[test]
fn device_position_targets_match_the_host() {
    let device = Default::default();
    for (case_index, (v, k, step, tau, confidence)) in [
        (1237, 300, 0.0, 1.3, true),
        (1000, 1, 0.0, 1.0, true),
        (513, 64, 0.25, 0.7, false),
        (700, 699, 0.5, 1.0, true),
    ]
    .into_iter()
    .enumerate()
    {
        let (b, t) = (2, 7);
        let n = b * t;
        let mut logits: Vec<f32> = (0..n * v)
            .map(|i| {
                let x = 4.0 * unit(i as u64, 60 + case_index as u64);
                if step > 0.0 {
                    (x / step).round() * step
                } else {
                    x
                }
            })
            .collect();
        logits[3 * v + 5] = f32::NEG_INFINITY;
        logits[4 * v + 1] = 40.0;
        let next: Vec<i32> = (0..n)
            .map(|r| if r % 5 == 4 { -1 } else { (r * 31 % v) as i32 })
            .collect();
        let data = TensorData::new(logits, [b, t, v]);
        let on_device = Tensor::<Wgpu, 3>::from_data(data.clone(), &device);
        let on_host = Tensor::<NdArray, 3>::from_data(data, &Default::default());
        let got = <Wgpu>::xt_position_targets(
            on_device.into_primitive().tensor(),
            &next,
            k,
            tau,
            confidence,
        )
        .unwrap();
        let want = <NdArray>::xt_position_targets(
            on_host.into_primitive().tensor(),
            &next,
            k,
            tau,
            confidence,
        )
        .unwrap();
        let what = format!("V = {v}, K = {k}, τ = {tau}");
        assert_eq!(got.k, want.k, "{what}");
        assert_eq!(got.ids, want.ids, "{what}: ids");
        assert_eq!(got.observed_rank, want.observed_rank, "{what}: ranks");
        assert_close(&what, &got.logp, &want.logp, 2e-5);
        assert_close(&what, &got.observed, &want.observed, 2e-5);
        assert_eq!(
            got.neg_entropy.len(),
            if confidence { n } else { 0 },
            "{what}"
        );
        assert_close(&what, &got.neg_ce, &want.neg_ce, 1e-5);
        assert_close(&what, &got.max_prob, &want.max_prob, 1e-5);
        for (a, b) in got.neg_entropy.iter().zip(&want.neg_entropy) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{what}: Σ p log p {a} vs {b}"
            );
        }
    }
}

#[test]
fn a_nan_in_a_stored_teachers_row_is_an_error_naming_it() {
    let (t, v) = (5, 300);
    let mut logits: Vec<f32> = (0..t * v).map(|i| unit(i as u64, 41)).collect();
    logits[2 * v + 7] = f32::NAN;
    let z = Tensor::<Wgpu, 3>::from_data(TensorData::new(logits, [1, t, v]), &Default::default());
    let next = [1, 2, 3, 4, -1];
    let err = <Wgpu>::xt_position_targets(z.into_primitive().tensor(), &next, 8, 1.0, false)
        .expect_err("a NaN teacher logit must fail");
    assert!(
        matches!(
            err,
            KernelError::NonFinite {
                side: "teacher",
                row: 2
            }
        ),
        "{err}"
    );
}

#[test]
fn a_nan_in_a_teacher_row_is_an_error_naming_it() {
    let device = Default::default();
    let (t, v) = (6, 300);
    let mut logits: Vec<f32> = (0..t * v).map(|i| unit(i as u64, 40)).collect();
    logits[4 * v + 10] = f32::NAN;
    let spec = EntriesSpec {
        merge: MergePlan {
            rows: t,
            predict_row: (0..t as u32).map(Some).collect(),
            continuation: vec![],
        },
        top_k: 16,
        tau: 1.0,
        row_chunk: 4,
        next_token: None,
    };
    let z = Tensor::<Wgpu, 3>::from_data(TensorData::new(logits, [1, t, v]), &device);
    let err = <Wgpu>::xt_teacher_entries(z.into_primitive().tensor(), &spec)
        .expect_err("a NaN teacher logit must fail");
    assert!(
        matches!(
            err,
            KernelError::NonFinite {
                side: "teacher",
                row: 4
            }
        ),
        "{err}"
    );
}
