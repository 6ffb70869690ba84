//! The losses against an independent f64 reference written as plain loops over the chunk spans
//! (not over the batch plan's index arrays), on small random cases: values, gradients against
//! central finite differences of the reference, and the paper's properties.

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Tensor, TensorData};
use xtoken_core::common::{CommonSet, CommonTables};
use xtoken_core::loss::{
    ce, gold, hkl, kl, multi, pkl::LearnableProjection, scaling, uld, Loss, LossParams,
    TeacherTargets, TopK,
};
use xtoken_core::plan::{BatchPlan, ChunkPlan, MergeVariant, PlanItem};
use xtoken_core::projection::SparseProjection;
use xtoken_core::Error;
use xtoken_testkit::reference::{self, log_softmax, top_k};

type B = Autodiff<NdArray>;

/// xorshift64*: deterministic cases without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn normal(&mut self) -> f64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let v = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (-2.0 * (u + 1e-12).ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// A batch: logits of both sides `[B, T, V]` as f32, ids, and the chunk plans.
#[derive(Clone)]
struct Case {
    batch: usize,
    ts: usize,
    tt: usize,
    vs: usize,
    vt: usize,
    student: Vec<f32>,
    teacher: Vec<f32>,
    student_ids: Vec<Vec<u32>>,
    teacher_ids: Vec<Vec<u32>>,
    plans: Vec<ChunkPlan>,
}

/// Random chunks of 1–3 tokens per side with random gaps; the second sequence is shorter
/// (padding) and the first chunk often starts at position 0 (skipped by the loss).
fn case(seed: u64, vs: usize, vt: usize) -> Case {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (batch, ts, tt) = (2, 7, 8);
    let mut plans = Vec::new();
    let mut student_ids = Vec::new();
    let mut teacher_ids = Vec::new();
    for b in 0..batch {
        let (ns, nt) = (ts - b, tt - 2 * b);
        let mut plan = ChunkPlan {
            student_len: ns as u32,
            teacher_len: nt as u32,
            ..Default::default()
        };
        let (mut i, mut j) = (0, 0);
        while i < ns && j < nt {
            match rng.below(6) {
                0 => i += 1,
                1 => j += 1,
                _ => {
                    let ls = (1 + rng.below(3)).min(ns - i);
                    let lt = (1 + rng.below(3)).min(nt - j);
                    plan.student.push((i as u32, ls as u32));
                    plan.teacher.push((j as u32, lt as u32));
                    i += ls;
                    j += lt;
                }
            }
        }
        plans.push(plan);
        student_ids.push((0..ns).map(|_| rng.below(vs) as u32).collect());
        teacher_ids.push((0..nt).map(|_| rng.below(vt) as u32).collect());
    }
    let mut logits = |n: usize| {
        (0..n)
            .map(|_| (2.0 * rng.normal()) as f32)
            .collect::<Vec<_>>()
    };
    Case {
        batch,
        ts,
        tt,
        vs,
        vt,
        student: logits(batch * ts * vs),
        teacher: logits(batch * tt * vt),
        student_ids,
        teacher_ids,
        plans,
    }
}

impl Case {
    fn batch_plan(&self, variant: MergeVariant) -> BatchPlan {
        let items: Vec<PlanItem> = (0..self.batch)
            .map(|b| PlanItem {
                plan: &self.plans[b],
                student_ids: &self.student_ids[b],
                teacher_ids: &self.teacher_ids[b],
            })
            .collect();
        BatchPlan::new(&items, self.ts, self.tt, variant).unwrap()
    }

    fn student_tensor(&self) -> Tensor<B, 3> {
        Tensor::from_data(
            TensorData::new(self.student.clone(), [self.batch, self.ts, self.vs]),
            &Default::default(),
        )
        .require_grad()
    }

    fn teacher_tensor(&self) -> Tensor<B, 3> {
        Tensor::from_data(
            TensorData::new(self.teacher.clone(), [self.batch, self.tt, self.vt]),
            &Default::default(),
        )
    }
}

// ---------------------------------------------------------------- the f64 reference

/// Merged log-distributions of every compared chunk, in plan order, from one side's logits.
#[allow(clippy::too_many_arguments)]
fn merged(
    logits: &[f64],
    t: usize,
    v: usize,
    spans: &[Vec<(u32, u32)>],
    ids: &[Vec<u32>],
    valid: &[Vec<bool>],
    variant: MergeVariant,
    tau: f64,
) -> Vec<Vec<f64>> {
    let row = |b: usize, p: usize| log_softmax(&logits[(b * t + p) * v..(b * t + p + 1) * v], tau);
    let mut out = Vec::new();
    for b in 0..spans.len() {
        for (k, &(start, len)) in spans[b].iter().enumerate() {
            if !valid[b][k] {
                continue;
            }
            let (a, end) = (start as usize, (start + len) as usize);
            let (predict, continuation) = match variant {
                MergeVariant::FirstToken => (a - 1, a + 1..end),
                MergeVariant::LastToken => (end - 2, a..end - 1),
            };
            let shift: f64 = continuation
                .map(|i| row(b, i - 1)[ids[b][i] as usize])
                .sum();
            out.push(row(b, predict).into_iter().map(|x| x + shift).collect());
        }
    }
    out
}

/// Which loss the reference computes.
#[derive(Clone)]
enum Ref {
    Kl,
    Pkl(Vec<Vec<(usize, f64)>>),
    Hybrid(Vec<(usize, usize)>, f64, f64),
}

fn reference(
    case: &Case,
    student: &[f64],
    loss: &Ref,
    variant: MergeVariant,
    tau: f64,
    k: usize,
    eps: f64,
) -> f64 {
    let valid: Vec<Vec<bool>> = case
        .plans
        .iter()
        .map(|p| (0..p.len()).map(|i| p.is_valid(i)).collect())
        .collect();
    let teacher: Vec<f64> = case.teacher.iter().map(|&x| x as f64).collect();
    let spans_s: Vec<_> = case.plans.iter().map(|p| p.student.clone()).collect();
    let spans_t: Vec<_> = case.plans.iter().map(|p| p.teacher.clone()).collect();
    let ps = merged(
        student,
        case.ts,
        case.vs,
        &spans_s,
        &case.student_ids,
        &valid,
        variant,
        tau,
    );
    let pt = merged(
        &teacher,
        case.tt,
        case.vt,
        &spans_t,
        &case.teacher_ids,
        &valid,
        variant,
        tau,
    );
    let mut total = 0.0;
    for (ls, lq) in ps.iter().zip(&pt) {
        let kept = top_k(lq, k);
        total += match loss {
            Ref::Kl => kept
                .iter()
                .map(|&t| lq[t].exp() * (lq[t] - ls[t]))
                .sum::<f64>(),
            Ref::Pkl(w) => reference::pkl_chunk(ls, lq, &kept, w, eps),
            Ref::Hybrid(pairs, lambda_kl, lambda_uld) => {
                reference::hybrid_chunk(ls, lq, &kept, pairs, (*lambda_kl, *lambda_uld))
            }
        };
    }
    if ps.is_empty() {
        0.0
    } else {
        tau * tau * total / ps.len() as f64
    }
}

/// Central differences of the reference with respect to every student logit.
fn numeric_grad(case: &Case, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut x: Vec<f64> = case.student.iter().map(|&v| v as f64).collect();
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let keep = x[i];
            x[i] = keep + h;
            let up = f(&x);
            x[i] = keep - h;
            let down = f(&x);
            x[i] = keep;
            (up - down) / (2.0 * h)
        })
        .collect()
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    xtoken_testkit::assert_close(what, got, want, tol, tol);
}

fn value(t: &Tensor<B, 1>) -> f64 {
    t.clone()
        .into_data()
        .convert::<f64>()
        .to_vec::<f64>()
        .unwrap()[0]
}

fn to_vec<const D: usize>(t: Tensor<NdArray, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

/// Random rows of 1–4 teacher ids with random weights (some rows empty).
fn random_projection(rng: &mut Rng, vs: usize, vt: usize) -> SparseProjection {
    let rows: Vec<Vec<(u32, f64)>> = (0..vs)
        .map(|s| {
            if s % 5 == 4 {
                return Vec::new();
            }
            (0..1 + rng.below(4))
                .map(|_| (rng.below(vt) as u32, 0.1 + rng.below(10) as f64))
                .collect()
        })
        .collect();
    SparseProjection::from_rows(&rows, vt, 4, None).unwrap()
}

fn projection_rows(w: &SparseProjection) -> Vec<Vec<(usize, f64)>> {
    (0..w.student_vocab_size() as u32)
        .map(|s| w.row(s).map(|(t, x)| (t as usize, x as f64)).collect())
        .collect()
}

/// A random 1-to-1 common set covering about half the student ids.
fn random_common(rng: &mut Rng, vs: usize, vt: usize) -> Vec<(usize, usize)> {
    let mut teachers: Vec<usize> = (0..vt).collect();
    for i in (1..vt).rev() {
        teachers.swap(i, rng.below(i + 1));
    }
    (0..vs)
        .filter(|_| rng.below(2) == 0)
        .zip(teachers)
        .collect()
}

fn common_set(pairs: &[(usize, usize)], vs: usize) -> CommonSet {
    CommonSet::new(
        pairs.iter().map(|&(s, t)| (s as u32, t as u32)).collect(),
        vs,
    )
    .unwrap()
}

struct Setup {
    params: LossParams,
    variant: MergeVariant,
    k: usize,
}

fn setups(vt: usize) -> Vec<Setup> {
    let mut out = Vec::new();
    for (tau, top, variant, row_chunk) in [
        (1.0, TopK::K(8192), MergeVariant::FirstToken, 64),
        (2.0, TopK::K(3), MergeVariant::FirstToken, 1),
        (0.7, TopK::All, MergeVariant::LastToken, 3),
        (1.0, TopK::K(5), MergeVariant::LastToken, 2),
    ] {
        out.push(Setup {
            params: LossParams {
                tau,
                top_k: top,
                row_chunk,
                ..Default::default()
            },
            variant,
            k: match top {
                TopK::K(k) => k.min(vt),
                TopK::All => vt,
            },
        });
    }
    out
}

/// Checks one loss's value and gradient against the reference over several seeds and setups.
fn check(
    vs: usize,
    vt: usize,
    make: impl Fn(&mut Rng) -> Ref,
    eval: impl Fn(&Case, Tensor<B, 3>, &TeacherTargets<B>, &Ref, &LossParams) -> Tensor<B, 1>,
) {
    for seed in 0..6u64 {
        let case = case(seed, vs, vt);
        let mut rng = Rng(seed + 77);
        let loss = make(&mut rng);
        for setup in setups(vt) {
            let plan = case.batch_plan(setup.variant);
            let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &setup.params).unwrap();
            let student = case.student_tensor();
            let got = eval(&case, student.clone(), &targets, &loss, &setup.params);
            let f = |x: &[f64]| {
                reference(
                    &case,
                    x,
                    &loss,
                    setup.variant,
                    setup.params.tau,
                    setup.k,
                    setup.params.eps,
                )
            };
            let student64: Vec<f64> = case.student.iter().map(|&x| x as f64).collect();
            let want = f(&student64);
            let tag = format!("seed {seed} tau {} k {}", setup.params.tau, setup.k);
            assert!(
                (value(&got) - want).abs() <= 2e-5 * (1.0 + want.abs()),
                "{tag}: value {} vs reference {want}",
                value(&got)
            );
            let grads = got.backward();
            let grad = to_vec(student.grad(&grads).unwrap());
            assert_close(
                &format!("{tag}: gradient"),
                &grad,
                &numeric_grad(&case, f),
                2e-4,
            );
        }
    }
}

#[test]
fn kl_matches_reference() {
    check(
        9,
        9,
        |_| Ref::Kl,
        |_, s, t, _, p| kl::loss(s, t, p).unwrap(),
    );
}

#[test]
fn pkl_matches_reference() {
    let (vs, vt) = (8, 11);
    for seed in 0..3u64 {
        let w = random_projection(&mut Rng(seed + 5), vs, vt);
        let rows = projection_rows(&w);
        check(
            vs,
            vt,
            |_| Ref::Pkl(rows.clone()),
            |_, s, t, _, p| {
                let module = LearnableProjection::<B>::new(&w, vs, &Default::default()).unwrap();
                xtoken_core::loss::pkl::loss(s, t, &module, p).unwrap()
            },
        );
    }
}

#[test]
fn gold_and_uld_match_reference() {
    let (vs, vt) = (8, 10);
    check(
        vs,
        vt,
        |rng| Ref::Hybrid(random_common(rng, vs, vt), 1.0, 1.0),
        |_, s, t, r, p| {
            let Ref::Hybrid(pairs, ..) = r else {
                unreachable!()
            };
            let tables = CommonTables::new(&common_set(pairs, vs), vs, vt).unwrap();
            gold::loss(s, t, &tables, p).unwrap()
        },
    );
    check(
        vs,
        vt,
        |_| Ref::Hybrid(Vec::new(), 0.0, 1.0),
        |_, s, t, _, p| uld::loss(s, t, p).unwrap(),
    );
}

#[test]
fn hybrid_weights_are_applied() {
    let (vs, vt) = (7, 9);
    check(
        vs,
        vt,
        |rng| Ref::Hybrid(random_common(rng, vs, vt), 0.3, 2.5),
        |_, s, t, r, p| {
            let Ref::Hybrid(pairs, ..) = r else {
                unreachable!()
            };
            let params = LossParams {
                lambda_kl: 0.3,
                lambda_uld: 2.5,
                ..p.clone()
            };
            let tables = CommonTables::new(&common_set(pairs, vs), vs, vt).unwrap();
            gold::loss(s, t, &tables, &params).unwrap()
        },
    );
}

/// The gradient with respect to W's slot logits, against central differences of the
/// reference through the row softmax.
#[test]
fn pkl_weight_gradient_matches_reference() {
    let (vs, vt) = (6, 9);
    let case = case(3, vs, vt);
    let w = random_projection(&mut Rng(9), vs, vt);
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
    let module = LearnableProjection::<B>::new(&w, vs, &Default::default()).unwrap();
    let loss =
        xtoken_core::loss::pkl::loss(case.student_tensor(), &targets, &module, &params).unwrap();
    let grads = loss.backward();
    let got = to_vec(module.slot_logits.grad(&grads).unwrap());

    let logits: Vec<f64> = to_vec(module.slot_logits.val().inner())
        .into_iter()
        .map(|x| x as f64)
        .collect();
    let indices = w.indices().to_vec();
    let student: Vec<f64> = case.student.iter().map(|&x| x as f64).collect();
    let f = |theta: &[f64]| {
        let rows: Vec<Vec<(usize, f64)>> = (0..vs)
            .map(|s| {
                let slots: Vec<usize> = (0..4).filter(|&k| indices[s * 4 + k] >= 0).collect();
                let max = slots
                    .iter()
                    .map(|&k| theta[s * 4 + k])
                    .fold(f64::MIN, f64::max);
                let z: f64 = slots.iter().map(|&k| (theta[s * 4 + k] - max).exp()).sum();
                slots
                    .iter()
                    .map(|&k| {
                        (
                            indices[s * 4 + k] as usize,
                            (theta[s * 4 + k] - max).exp() / z,
                        )
                    })
                    .collect()
            })
            .collect();
        reference(
            &case,
            &student,
            &Ref::Pkl(rows),
            MergeVariant::FirstToken,
            1.0,
            vt,
            params.eps,
        )
    };
    let mut theta = logits.clone();
    let want: Vec<f64> = (0..theta.len())
        .map(|i| {
            if indices[i] < 0 {
                return 0.0;
            }
            let keep = theta[i];
            theta[i] = keep + 1e-6;
            let up = f(&theta);
            theta[i] = keep - 1e-6;
            let down = f(&theta);
            theta[i] = keep;
            (up - down) / 2e-6
        })
        .collect();
    assert_close("dL/dθ", &got, &want, 2e-4);
}

/// Proposition 1: with λ_ULD = 0 the common-KL gradient on every uncommon student logit j is
/// `p_S[j] · Σ_{t∈C_T} p_T[t] ≥ 0` (one chunk, τ = 1, the whole teacher vocabulary).
#[test]
fn proposition_1_suppressive_gradient() {
    let (vs, vt) = (12, 10);
    for seed in 0..5u64 {
        let mut rng = Rng(seed + 1);
        let z: Vec<f32> = (0..2 * vs).map(|_| (2.0 * rng.normal()) as f32).collect();
        let zt: Vec<f32> = (0..2 * vt).map(|_| (2.0 * rng.normal()) as f32).collect();
        let pairs = random_common(&mut rng, vs, vt);
        // Two positions; the chunk at position 1 is predicted by row 0.
        let plan = ChunkPlan {
            student: vec![(0, 1), (1, 1)],
            teacher: vec![(0, 1), (1, 1)],
            student_len: 2,
            teacher_len: 2,
        };
        let ids = [0u32, 1];
        let item = PlanItem {
            plan: &plan,
            student_ids: &ids,
            teacher_ids: &ids,
        };
        let batch = BatchPlan::new(&[item], 2, 2, MergeVariant::FirstToken).unwrap();
        let params = LossParams {
            lambda_uld: 0.0,
            top_k: TopK::All,
            ..Default::default()
        };
        let device = Default::default();
        let teacher = Tensor::<B, 3>::from_data(TensorData::new(zt.clone(), [1, 2, vt]), &device);
        let targets = TeacherTargets::new(teacher, &batch, &params).unwrap();
        let student = Tensor::<B, 3>::from_data(TensorData::new(z.clone(), [1, 2, vs]), &device)
            .require_grad();
        let tables = CommonTables::new(&common_set(&pairs, vs), vs, vt).unwrap();
        let loss = gold::loss(student.clone(), &targets, &tables, &params).unwrap();
        let grad = to_vec(student.grad(&loss.backward()).unwrap());

        let ps: Vec<f64> = log_softmax(&z[..vs].iter().map(|&x| x as f64).collect::<Vec<_>>(), 1.0)
            .into_iter()
            .map(f64::exp)
            .collect();
        let pt: Vec<f64> =
            log_softmax(&zt[..vt].iter().map(|&x| x as f64).collect::<Vec<_>>(), 1.0)
                .into_iter()
                .map(f64::exp)
                .collect();
        let mass: f64 = pairs.iter().map(|&(_, t)| pt[t]).sum();
        for j in (0..vs).filter(|j| !pairs.iter().any(|p| p.0 == *j)) {
            let want = ps[j] * mass;
            assert!(
                grad[j] >= 0.0,
                "seed {seed}: uncommon logit {j} has gradient {}",
                grad[j]
            );
            assert!(
                (grad[j] as f64 - want).abs() <= 1e-6,
                "seed {seed}: logit {j}: {} vs p_S·M_C = {want}",
                grad[j]
            );
        }
        // Row 1 predicts nothing the loss compares: no gradient at all.
        assert!(grad[vs..].iter().all(|&g| g == 0.0));
    }
}

fn identity_projection(v: usize) -> SparseProjection {
    let rows: Vec<Vec<(u32, f64)>> = (0..v).map(|s| vec![(s as u32, 1.0)]).collect();
    SparseProjection::from_rows(&rows, v, 4, None).unwrap()
}

#[test]
fn pkl_with_identity_w_and_equal_logits_is_zero() {
    let v = 9;
    let mut equal = case(4, v, v);
    equal.tt = equal.ts;
    equal.teacher = equal.student.clone();
    equal.teacher_ids = equal.student_ids.clone();
    for plan in &mut equal.plans {
        plan.teacher = plan.student.clone();
        plan.teacher_len = plan.student_len;
    }
    let w = LearnableProjection::<B>::new(&identity_projection(v), v, &Default::default()).unwrap();
    for top_k in [TopK::K(3), TopK::All] {
        let params = LossParams {
            top_k,
            ..Default::default()
        };
        let plan = equal.batch_plan(MergeVariant::FirstToken);
        let targets = TeacherTargets::new(equal.teacher_tensor(), &plan, &params).unwrap();
        let loss =
            xtoken_core::loss::pkl::loss(equal.student_tensor(), &targets, &w, &params).unwrap();
        assert!(value(&loss).abs() < 1e-6, "{top_k:?}: {}", value(&loss));
    }
}

#[test]
fn hkl_with_exact_only_w_equals_gold() {
    let (vs, vt) = (8, 10);
    let case = case(2, vs, vt);
    let pairs = random_common(&mut Rng(3), vs, vt);
    let strict = common_set(&pairs, vs);
    // W holds only the exact matches: weight 1 on each strict partner, nothing elsewhere.
    let rows: Vec<Vec<(u32, f64)>> = (0..vs)
        .map(|s| {
            pairs
                .iter()
                .filter(|p| p.0 == s)
                .map(|&(_, t)| (t as u32, 1.0))
                .collect()
        })
        .collect();
    let w = SparseProjection::from_rows(&rows, vt, 4, None).unwrap();
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
    let relaxed = hkl::tables(&strict, &w, vs, vt).unwrap();
    let gold_tables = CommonTables::new(&strict, vs, vt).unwrap();
    assert_eq!(relaxed.len(), gold_tables.len());
    let h = hkl::loss(case.student_tensor(), &targets, &relaxed, &params).unwrap();
    let g = gold::loss(case.student_tensor(), &targets, &gold_tables, &params).unwrap();
    assert_eq!(value(&h), value(&g));
}

/// W's rows for the H-KL tests, as plain lists: a distinct heaviest teacher token per row, and
/// most rows share it with others (teacher 0, the strict partner of student 0, and teacher 5);
/// every fifth row is empty.
fn shared_top1_rows(rng: &mut Rng, vs: usize, vt: usize) -> Vec<Vec<(u32, f64)>> {
    (0..vs)
        .map(|s| {
            if s % 5 == 4 {
                return Vec::new();
            }
            let top = [0, 5, rng.below(vt)][s % 3];
            let mut row = vec![(top as u32, 5.0 + rng.below(5) as f64)];
            for _ in 0..rng.below(4) {
                let t = rng.below(vt) as u32;
                if row.iter().all(|&(u, _)| u != t) {
                    row.push((t, 0.5 + rng.below(8) as f64 / 2.0));
                }
            }
            row
        })
        .collect()
}

/// The relaxed set as the paper defines it, from W's rows and the strict pairs alone: strict
/// pairs as they are, and every other student token with a non-empty row paired with its
/// heaviest teacher token, whoever else is paired with that token.
fn paper_relaxed(strict: &[(usize, usize)], rows: &[Vec<(u32, f64)>]) -> Vec<(usize, usize)> {
    let mut pairs = strict.to_vec();
    for (s, row) in rows.iter().enumerate() {
        if strict.iter().any(|&(p, _)| p == s) {
            continue;
        }
        let heaviest = row
            .iter()
            .fold(None, |best: Option<(u32, f64)>, &(t, w)| match best {
                Some((_, b)) if b >= w => best,
                _ => Some((t, w)),
            });
        if let Some((t, _)) = heaviest {
            pairs.push((s, t as usize));
        }
    }
    pairs
}

#[test]
fn hkl_matches_the_reference_on_the_papers_relaxed_set() {
    let (vs, vt) = (12, 10);
    let strict = vec![(0, 0), (1, 1)];
    let w = std::cell::RefCell::new(None);
    check(
        vs,
        vt,
        |rng| {
            let rows = shared_top1_rows(rng, vs, vt);
            let pairs = paper_relaxed(&strict, &rows);
            // Many-to-one: teacher 0 has its strict partner and relaxed ones, teacher 5 several.
            assert!(pairs.iter().filter(|p| p.1 == 0).count() >= 2, "{pairs:?}");
            assert!(pairs.iter().filter(|p| p.1 == 5).count() >= 2, "{pairs:?}");
            *w.borrow_mut() = Some(SparseProjection::from_rows(&rows, vt, 4, None).unwrap());
            Ref::Hybrid(pairs, 1.0, 1.0)
        },
        |_, s, t, _, p| {
            let w = w.borrow();
            let tables = hkl::tables(&common_set(&strict, vs), w.as_ref().unwrap(), vs, vt);
            hkl::loss(s, t, &tables.unwrap(), p).unwrap()
        },
    );
}

#[test]
fn hkl_relaxed_set_changes_the_loss_when_w_adds_pairs() {
    let (vs, vt) = (12, 10);
    let case = case(6, vs, vt);
    let strict = vec![(0, 0), (1, 1)];
    let rows = shared_top1_rows(&mut Rng(4), vs, vt);
    let w = SparseProjection::from_rows(&rows, vt, 4, None).unwrap();
    let relaxed = hkl::tables(&common_set(&strict, vs), &w, vs, vt).unwrap();
    let pairs = paper_relaxed(&strict, &rows);
    assert_eq!(relaxed.len(), pairs.len());
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
    let student: Vec<f64> = case.student.iter().map(|&x| x as f64).collect();
    let reference = |pairs: Vec<(usize, usize)>| {
        let hybrid = Ref::Hybrid(pairs, 1.0, 1.0);
        reference(
            &case,
            &student,
            &hybrid,
            MergeVariant::FirstToken,
            1.0,
            vt,
            params.eps,
        )
    };
    let h = value(&hkl::loss(case.student_tensor(), &targets, &relaxed, &params).unwrap());
    let strict_tables = CommonTables::new(&common_set(&strict, vs), vs, vt).unwrap();
    let g = value(&gold::loss(case.student_tensor(), &targets, &strict_tables, &params).unwrap());
    let (want_h, want_g) = (reference(pairs), reference(strict));
    assert!(
        (h - want_h).abs() < 1e-5 * (1.0 + want_h),
        "H-KL {h} vs {want_h}"
    );
    assert!(
        (g - want_g).abs() < 1e-5 * (1.0 + want_g),
        "GOLD {g} vs {want_g}"
    );
    // The relaxed pairs move the loss far beyond rounding.
    assert!((h - g).abs() > 1e-2 * (1.0 + g), "H-KL {h} and GOLD {g}");
}

#[test]
fn one_teacher_with_alpha_one_equals_the_single_teacher_loss() {
    let (vs, vt) = (8, 11);
    let case = case(1, vs, vt);
    let w = random_projection(&mut Rng(2), vs, vt);
    let module = LearnableProjection::<B>::new(&w, vs, &Default::default()).unwrap();
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
    let single =
        xtoken_core::loss::pkl::loss(case.student_tensor(), &targets, &module, &params).unwrap();
    let teachers = [multi::Teacher {
        targets: &targets,
        loss: Loss::pkl(&module),
        alpha: 1.0,
    }];
    let combined = multi::loss(
        case.student_tensor(),
        &teachers,
        multi::Weighting::Static,
        &params,
    )
    .unwrap();
    assert_eq!(value(&combined.total), value(&single));
    assert_eq!(combined.alphas, vec![1.0]);
}

#[test]
fn two_teachers_sum_with_their_weights_and_gradients_add() {
    let (vs, vt) = (8, 11);
    let case_a = case(1, vs, vt);
    let mut case_b = case(2, vs, vs);
    case_b.student = case_a.student.clone();
    case_b.student_ids = case_a.student_ids.clone();
    case_b.plans = case_a.plans.clone();
    case_b.tt = case_a.tt;
    case_b.teacher_ids = case_a
        .teacher_ids
        .iter()
        .map(|ids| ids.iter().map(|&t| t % vs as u32).collect())
        .collect();
    let w = random_projection(&mut Rng(2), vs, vt);
    let module = LearnableProjection::<B>::new(&w, vs, &Default::default()).unwrap();
    let params = LossParams::default();
    let targets_a = TeacherTargets::new(
        case_a.teacher_tensor(),
        &case_a.batch_plan(MergeVariant::FirstToken),
        &params,
    )
    .unwrap();
    let targets_b = TeacherTargets::new(
        case_b.teacher_tensor(),
        &case_b.batch_plan(MergeVariant::FirstToken),
        &params,
    )
    .unwrap();
    let student = case_a.student_tensor();
    let teachers = [
        multi::Teacher {
            targets: &targets_a,
            loss: Loss::pkl(&module),
            alpha: 0.7,
        },
        multi::Teacher {
            targets: &targets_b,
            loss: Loss::kl(),
            alpha: 0.3,
        },
    ];
    let combined = multi::loss(
        student.clone(),
        &teachers,
        multi::Weighting::Static,
        &params,
    )
    .unwrap();
    let student64: Vec<f64> = case_a.student.iter().map(|&x| x as f64).collect();
    let rows = projection_rows(&w);
    let f = |x: &[f64]| {
        0.7 * reference(
            &case_a,
            x,
            &Ref::Pkl(rows.clone()),
            MergeVariant::FirstToken,
            1.0,
            vt,
            params.eps,
        ) + 0.3
            * reference(
                &case_b,
                x,
                &Ref::Kl,
                MergeVariant::FirstToken,
                1.0,
                vs,
                params.eps,
            )
    };
    assert!((value(&combined.total) - f(&student64)).abs() < 2e-5);
    let grad = to_vec(student.grad(&combined.total.backward()).unwrap());
    assert_close(
        "multi-teacher gradient",
        &grad,
        &numeric_grad(&case_a, f),
        2e-4,
    );
}

#[test]
fn adaptive_alpha_is_a_softmax_of_teacher_confidence() {
    let (vs, vt) = (8, 9);
    let case_a = case(1, vs, vt);
    let case_b = case(5, vs, vt);
    let params = LossParams::default();
    let ta = TeacherTargets::with_confidence(
        case_a.teacher_tensor(),
        &case_a.batch_plan(MergeVariant::FirstToken),
        &params,
    )
    .unwrap();
    let tb = TeacherTargets::with_confidence(
        case_b.teacher_tensor(),
        &case_b.batch_plan(MergeVariant::FirstToken),
        &params,
    )
    .unwrap();
    // Reference confidence: means over teacher positions that have a next token.
    let conf = |c: &Case| {
        let mut sums = [0.0f64; 3];
        let mut n = 0.0;
        for (b, ids) in c.teacher_ids.iter().enumerate() {
            for p in 0..ids.len() - 1 {
                let z: Vec<f64> = c.teacher[(b * c.tt + p) * c.vt..(b * c.tt + p + 1) * c.vt]
                    .iter()
                    .map(|&x| x as f64)
                    .collect();
                let lp = log_softmax(&z, 1.0);
                sums[0] += lp[ids[p + 1] as usize];
                sums[1] += lp.iter().map(|l| l.exp() * l).sum::<f64>();
                sums[2] += lp.iter().cloned().fold(f64::MIN, f64::max).exp();
                n += 1.0;
            }
        }
        sums.map(|s| s / n)
    };
    let (ca, cb) = (conf(&case_a), conf(&case_b));
    for (kind, i) in [
        (multi::ConfidenceMeasure::NegCrossEntropy, 0),
        (multi::ConfidenceMeasure::NegEntropy, 1),
        (multi::ConfidenceMeasure::MaxProb, 2),
    ] {
        let teachers = [
            multi::Teacher {
                targets: &ta,
                loss: Loss::uld(),
                alpha: 0.0,
            },
            multi::Teacher {
                targets: &tb,
                loss: Loss::uld(),
                alpha: 0.0,
            },
        ];
        let alphas = multi::alphas(&teachers, multi::Weighting::Adaptive(kind)).unwrap();
        let want_a = 1.0 / (1.0 + (cb[i] - ca[i]).exp());
        assert!(
            (alphas[0] - want_a).abs() < 1e-5,
            "{kind:?}: {alphas:?} vs {want_a}"
        );
        assert!((alphas[0] + alphas[1] - 1.0).abs() < 1e-12);
    }
    let plain = TeacherTargets::new(
        case_a.teacher_tensor(),
        &case_a.batch_plan(MergeVariant::FirstToken),
        &params,
    )
    .unwrap();
    let teachers = [multi::Teacher {
        targets: &plain,
        loss: Loss::uld(),
        alpha: 1.0,
    }];
    let err = multi::alphas(
        &teachers,
        multi::Weighting::Adaptive(multi::ConfidenceMeasure::MaxProb),
    )
    .unwrap_err();
    assert!(err.to_string().contains("with_confidence"), "{err}");
}

#[test]
fn cross_entropy_matches_reference() {
    let (vs, vt) = (9, 9);
    let case = case(3, vs, vt);
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let student = case.student_tensor();
    let params = LossParams {
        row_chunk: 3,
        ..Default::default()
    };
    let loss = ce::loss(student.clone(), &plan.student.next_token, &params).unwrap();
    let f = |x: &[f64]| {
        let mut total = 0.0;
        let mut n = 0.0;
        for (b, ids) in case.student_ids.iter().enumerate() {
            for p in 0..ids.len() - 1 {
                let lp = log_softmax(&x[(b * case.ts + p) * vs..(b * case.ts + p + 1) * vs], 1.0);
                total -= lp[ids[p + 1] as usize];
                n += 1.0;
            }
        }
        total / n
    };
    let x: Vec<f64> = case.student.iter().map(|&v| v as f64).collect();
    assert!((value(&loss) - f(&x)).abs() < 1e-5);
    let grad = to_vec(student.grad(&loss.backward()).unwrap());
    assert_close("CE gradient", &grad, &numeric_grad(&case, f), 2e-4);
}

#[test]
fn dynamic_scaling_value_and_gradient() {
    let device = Default::default();
    let x = Tensor::<B, 1>::from_data(TensorData::new(vec![0.4f32, -1.3, 2.0], [3]), &device)
        .require_grad();
    let ce = (x.clone() * x.clone()).sum(); // CE(x) = Σ x², ∇ = 2x
    let kd = (x.clone() * 3.0).exp().sum(); // KD(x) = Σ e^{3x}, ∇ = 3 e^{3x}
    let (ce_v, kd_v) = (value(&ce), value(&kd));
    let total = scaling::dynamic(ce, kd);
    assert!((value(&total) - 2.0 * ce_v).abs() < 1e-4 * ce_v);
    let grad = to_vec(x.grad(&total.backward()).unwrap());
    let xs = [0.4f64, -1.3, 2.0];
    let want: Vec<f64> = xs
        .iter()
        .map(|&v| ce_v / kd_v * 3.0 * (3.0 * v).exp() + 2.0 * v)
        .collect();
    assert_close("dynamic scaling gradient", &grad, &want, 1e-4);
}

/// γ = CE / max(|KD|, floor) for every finite KD: the paper's ratio in magnitude above the
/// floor, bounded and continuous through 0, never negative; the gradient is γ ∇KD + ∇CE.
#[test]
fn dynamic_scaling_is_defined_for_every_kd() {
    let device = Default::default();
    let floor = scaling::KD_FLOOR;
    let ce_v = 1.5f64;
    for kd_v in [
        2.0,
        0.3,
        floor * 1.5,
        floor,
        floor / 2.0,
        0.0,
        -floor / 2.0,
        -floor * 3.0,
        -0.361,
        -2.0,
    ] {
        let x =
            Tensor::<B, 1>::from_data(TensorData::new(vec![1.0f32], [1]), &device).require_grad();
        // CE(x) = 1.5 x², KD(x) = kd · x³ at x = 1: ∇CE = 3, ∇KD = 3 kd.
        let ce = x.clone().powf_scalar(2.0) * ce_v;
        let kd = x.clone().powf_scalar(3.0) * kd_v;
        let total = scaling::dynamic(ce, kd);
        let gamma = ce_v / kd_v.abs().max(floor);
        assert!(gamma >= 0.0 && gamma <= ce_v / floor);
        assert_eq!(scaling::ratio_of(ce_v, kd_v), gamma);
        let want_value = gamma * kd_v + ce_v;
        assert!(
            (value(&total) - want_value).abs() <= 1e-5 * want_value.abs().max(1.0),
            "KD {kd_v}: value {} vs {want_value}",
            value(&total)
        );
        assert!((scaling::dynamic_value(ce_v, kd_v) - want_value).abs() < 1e-12);
        let grad = to_vec(x.grad(&total.backward()).unwrap());
        let want_grad = gamma * 3.0 * kd_v + 3.0;
        assert!(
            (grad[0] as f64 - want_grad).abs() <= 1e-4 * want_grad.abs().max(1.0),
            "KD {kd_v}: gradient {} vs {want_grad}",
            grad[0]
        );
    }
    // Continuous at the floor from both sides of 0.
    for sign in [1.0, -1.0] {
        let below = scaling::ratio_of(ce_v, sign * floor * (1.0 - 1e-9));
        let above = scaling::ratio_of(ce_v, sign * floor * (1.0 + 1e-9));
        assert!((below - above).abs() < 1e-5 * below);
    }
}

#[test]
fn learnable_w_rows_stay_stochastic_under_adamw() {
    let (vs, vt) = (8, 11);
    let case = case(2, vs, vt);
    let w = random_projection(&mut Rng(8), vs, vt);
    let mut module = LearnableProjection::<B>::new(&w, vs, &Default::default()).unwrap();
    let before = to_vec(module.weights().inner());
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
    let mut optim = AdamWConfig::new().with_weight_decay(0.0).init();
    let mut losses = Vec::new();
    for _ in 0..30 {
        let loss = xtoken_core::loss::pkl::loss(case.student_tensor(), &targets, &module, &params)
            .unwrap();
        losses.push(value(&loss));
        let grads = GradientsParams::from_grads(loss.backward(), &module);
        module = optim.step(1e-2, module, grads);
    }
    let after = to_vec(module.weights().inner());
    let indices = w.indices();
    for s in 0..vs {
        let row = &after[s * 4..(s + 1) * 4];
        assert!(row.iter().all(|&x| x >= 0.0), "row {s}: {row:?}");
        for k in 0..4 {
            if indices[s * 4 + k] < 0 {
                assert_eq!(row[k], 0.0, "row {s}: empty slot {k} got weight");
            }
        }
        let sum: f32 = row.iter().sum();
        let expected = if indices[s * 4] >= 0 { 1.0 } else { 0.0 };
        assert!((sum - expected).abs() < 1e-5, "row {s} sums to {sum}");
    }
    assert_ne!(before, after, "the optimizer did not move W");
    assert!(
        losses.last() < losses.first(),
        "P-KL did not decrease: {losses:?}"
    );
    // Frozen (H-KL's setting): no gradient reaches it.
    let frozen = module.no_grad();
    let loss =
        xtoken_core::loss::pkl::loss(case.student_tensor(), &targets, &frozen, &params).unwrap();
    assert!(frozen.slot_logits.grad(&loss.backward()).is_none());
}

#[test]
fn initial_learnable_weights_reproduce_w() {
    let w = random_projection(&mut Rng(12), 10, 13);
    let module = LearnableProjection::<NdArray>::new(&w, 12, &Default::default()).unwrap();
    let got = to_vec(module.weights());
    assert_eq!(got.len(), 12 * 4);
    for (i, (&g, &want)) in got.iter().zip(w.weights()).enumerate() {
        assert!((g - want).abs() < 1e-6, "slot {i}: {g} vs {want}");
    }
    assert!(
        got[40..].iter().all(|&x| x == 0.0),
        "padding rows must be empty"
    );
}

#[test]
fn row_chunk_does_not_change_the_result() {
    let (vs, vt) = (8, 10);
    let case = case(9, vs, vt);
    let pairs = random_common(&mut Rng(1), vs, vt);
    let tables = CommonTables::new(&common_set(&pairs, vs), vs, vt).unwrap();
    let mut seen = Vec::new();
    for row_chunk in [1, 2, 5, 1000] {
        let params = LossParams {
            row_chunk,
            ..Default::default()
        };
        let plan = case.batch_plan(MergeVariant::FirstToken);
        let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
        let student = case.student_tensor();
        let loss = gold::loss(student.clone(), &targets, &tables, &params).unwrap();
        let grad = to_vec(student.grad(&loss.backward()).unwrap());
        seen.push((value(&loss), grad));
    }
    for other in &seen[1..] {
        assert_eq!(other.0, seen[0].0);
        assert_eq!(other.1, seen[0].1);
    }
}

#[test]
fn gap_and_padding_positions_get_no_gradient() {
    let (vs, vt) = (8, 10);
    let case = case(11, vs, vt);
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
    let student = case.student_tensor();
    let loss = uld::loss(student.clone(), &targets, &params).unwrap();
    let grad = to_vec(student.grad(&loss.backward()).unwrap());
    // The rows a chunk reads, from its spans alone (first-token merge): the row before its first
    // student token predicts it, and the rows of its other tokens but the last predict their
    // successors (the continuation terms). A chunk starting at position 0 on either side has no
    // predicting row and is not compared.
    let mut used = vec![false; case.batch * case.ts];
    for (b, p) in case.plans.iter().enumerate() {
        for (&(s, len), &(t, _)) in p.student.iter().zip(&p.teacher) {
            if s > 0 && t > 0 {
                let rows = (s - 1) as usize..(s + len - 1) as usize;
                used[b * case.ts + rows.start..b * case.ts + rows.end].fill(true);
            }
        }
    }
    assert!(used.iter().any(|&u| u) && used.iter().any(|&u| !u));
    xtoken_testkit::assert_finite("gradient", &grad);
    let mut read_with_gradient = 0;
    for (row, &u) in used.iter().enumerate() {
        let g = &grad[row * vs..(row + 1) * vs];
        if u {
            // A read row may still get none: where every sorted student probability exceeds
            // the teacher's, the sorted L1 is the chunk's total mass minus a constant.
            read_with_gradient += g.iter().any(|&x| x != 0.0) as usize;
        } else {
            assert!(
                g.iter().all(|&x| x == 0.0),
                "row {row} is read by no chunk but has {g:?}"
            );
        }
    }
    assert!(
        read_with_gradient >= 2,
        "the loss reaches the rows it reads"
    );
}

#[test]
fn non_finite_logits_are_named() {
    let (vs, vt) = (8, 10);
    let case = case(2, vs, vt);
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let (slot, &row) = plan
        .student
        .predict_row
        .iter()
        .enumerate()
        .find(|(c, _)| plan.chunk_mask[*c] > 0.0)
        .unwrap();
    let (b, p) = (row as usize / case.ts, row as usize % case.ts);
    for bad in [f32::NAN, f32::INFINITY] {
        let mut broken = case.clone();
        broken.student[(row as usize) * vs + 3] = bad;
        let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
        let err = kl_free_loss(&broken, &targets, &params).unwrap_err();
        match &err {
            Error::NonFiniteLogits {
                side: "student",
                sequence,
                position,
            } => assert_eq!((*sequence, *position), (b, p), "{err}"),
            other => panic!("{bad}: expected a named non-finite error, got {other}"),
        }
        assert!(err
            .to_string()
            .contains(&format!("sequence {b}, position {p}")));

        let mut broken = case.clone();
        let trow = plan.teacher.predict_row[slot] as usize;
        broken.teacher[trow * vt] = bad;
        let err = TeacherTargets::new(broken.teacher_tensor(), &plan, &params).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NonFiniteLogits {
                    side: "teacher",
                    ..
                }
            ),
            "{err}"
        );
    }
}

fn kl_free_loss(
    case: &Case,
    targets: &TeacherTargets<B>,
    params: &LossParams,
) -> Result<Tensor<B, 1>, Error> {
    uld::loss(case.student_tensor(), targets, params)
}

#[test]
fn shapes_and_parameters_are_checked() {
    let (vs, vt) = (8, 10);
    let case = case(2, vs, vt);
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let targets = TeacherTargets::new(case.teacher_tensor(), &plan, &params).unwrap();
    // Student logits of the wrong length.
    let short = Tensor::<B, 3>::zeros([case.batch, case.ts - 1, vs], &Default::default());
    let err = uld::loss(short, &targets, &params).unwrap_err();
    assert!(err.to_string().contains("student logits"), "{err}");
    // KL needs teacher ids inside the student vocabulary.
    let narrow = Tensor::<B, 3>::zeros([case.batch, case.ts, 4], &Default::default());
    let err = kl::loss(narrow, &targets, &params).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    // Tables built for other widths.
    let tables = CommonTables::new(&common_set(&[(0, 0)], vs), vs, vt + 1).unwrap();
    let err = gold::loss(case.student_tensor(), &targets, &tables, &params).unwrap_err();
    assert!(err.to_string().contains("common set tables"), "{err}");
    // A bad temperature is named.
    let bad = LossParams {
        tau: 0.0,
        ..Default::default()
    };
    let err = TeacherTargets::new(case.teacher_tensor(), &plan, &bad).unwrap_err();
    assert!(err.to_string().contains("`tau`"), "{err}");
    // Targets built at one temperature, loss asked at another.
    let other = LossParams {
        tau: 2.0,
        ..Default::default()
    };
    let err = uld::loss(case.student_tensor(), &targets, &other).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
}

#[test]
fn losses_run_without_autodiff() {
    let (vs, vt) = (8, 10);
    let case = case(2, vs, vt);
    let params = LossParams::default();
    let plan = case.batch_plan(MergeVariant::FirstToken);
    let device = Default::default();
    let teacher = Tensor::<NdArray, 3>::from_data(
        TensorData::new(case.teacher.clone(), [case.batch, case.tt, vt]),
        &device,
    );
    let student = Tensor::<NdArray, 3>::from_data(
        TensorData::new(case.student.clone(), [case.batch, case.ts, vs]),
        &device,
    );
    let targets = TeacherTargets::new(teacher, &plan, &params).unwrap();
    let loss = uld::loss(student, &targets, &params).unwrap();
    let x: Vec<f64> = case.student.iter().map(|&v| v as f64).collect();
    let want = reference(
        &case,
        &x,
        &Ref::Hybrid(Vec::new(), 0.0, 1.0),
        MergeVariant::FirstToken,
        1.0,
        vt,
        params.eps,
    );
    let got = loss.into_data().convert::<f64>().to_vec::<f64>().unwrap()[0];
    assert!((got - want).abs() < 1e-5 * (1.0 + want));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// With 1-token chunks both sides are distributions, so every loss is non-negative, and it is
    /// 0 exactly when the student equals a same-tokenizer teacher.
    #[test]
    fn losses_are_non_negative_on_single_token_chunks(seed in 0u64..1_000_000, tau in 0.5f64..3.0) {
        let (vs, vt) = (9, 12);
        let mut c = case(seed, vs, vt);
        for plan in &mut c.plans {
            let n = plan.student_len.min(plan.teacher_len);
            plan.student = (0..n).map(|p| (p, 1)).collect();
            plan.teacher = plan.student.clone();
        }
        let params = LossParams { tau, top_k: TopK::All, ..Default::default() };
        let plan = c.batch_plan(MergeVariant::FirstToken);
        let targets = TeacherTargets::new(c.teacher_tensor(), &plan, &params).unwrap();
        let mut rng = Rng(seed ^ 0xabcd);
        let w = LearnableProjection::<B>::new(&random_projection(&mut rng, vs, vt), vs, &Default::default()).unwrap();
        let tables = CommonTables::new(&common_set(&random_common(&mut rng, vs, vt), vs), vs, vt).unwrap();
        for (name, loss) in [
            ("ULD", uld::loss(c.student_tensor(), &targets, &params).unwrap()),
            ("GOLD", gold::loss(c.student_tensor(), &targets, &tables, &params).unwrap()),
            ("P-KL", xtoken_core::loss::pkl::loss(c.student_tensor(), &targets, &w, &params).unwrap()),
        ] {
            proptest::prop_assert!(value(&loss) >= -1e-5, "{name}: {}", value(&loss));
        }
        let mut same = c.clone();
        same.vt = vs;
        same.teacher = (0..c.batch * c.tt * vs).map(|i| {
            let (b, p, tok) = (i / (c.tt * vs), (i / vs) % c.tt, i % vs);
            if p < c.ts { c.student[(b * c.ts + p) * vs + tok] } else { 0.0 }
        }).collect();
        let plan = same.batch_plan(MergeVariant::FirstToken);
        let targets = TeacherTargets::new(same.teacher_tensor(), &plan, &params).unwrap();
        let kl_same = value(&kl::loss(same.student_tensor(), &targets, &params).unwrap());
        proptest::prop_assert!(kl_same.abs() < 1e-5, "KL(p || p) = {kl_same}");
    }
}

/// A W without a single entry would make P-KL compare the teacher with nothing: refused when
/// the learnable projection is built, naming W.
#[test]
fn a_projection_without_entries_is_refused() {
    let empty: Vec<Vec<(u32, f64)>> = vec![Vec::new(); 6];
    let w = SparseProjection::from_rows(&empty, 9, 4, None).unwrap();
    let err = LearnableProjection::<B>::new(&w, 6, &Default::default()).unwrap_err();
    assert!(err.to_string().contains("W has no entry"), "{err}");
}
