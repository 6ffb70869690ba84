//! An f64 reference of P-KL and the hybrid objectives (GOLD, H-KL, ULD) in plain loops: the
//! chain-rule merge of both sides through a kernel merge plan, the teacher's top-K, then the
//! objective per compared slot (`xtoken_testkit::reference`), `τ² / slots · Σ`. Gradients come
//! from central differences of it.

use xtoken_kernels::{LossKind, MergePlan};
use xtoken_testkit::reference::{self, log_softmax, top_k};

use super::Evaluation;

/// One problem: logits `[rows, v]` of both sides read through one merge plan, and W.
pub struct Problem<'a> {
    pub student: &'a [f64],
    pub teacher: &'a [f64],
    pub vs: usize,
    pub vt: usize,
    pub merge: &'a MergePlan,
    pub tau: f64,
    pub top_k: usize,
    /// W `[vs, kw]`: teacher ids (`-1`: empty slot) and raw weights (rows need not sum to 1).
    pub kw: usize,
    pub indices: &'a [i64],
    pub weights: &'a [f64],
    pub eps: f64,
}

/// Which objective.
pub enum Objective {
    /// KL against the projection re-normalized to the student chunk's mass.
    Pkl,
    /// `λ_KL` common KL over the pairs (many-to-one allowed) + `λ_ULD` sorted L1 over the
    /// student ids in no pair and the kept teacher ids in no pair.
    Hybrid {
        pairs: Vec<(u32, u32)>,
        lambda_kl: f64,
        lambda_uld: f64,
    },
}

impl Objective {
    /// The objective an evaluation computes (`None` for KL and cross-entropy).
    pub fn of(evaluation: &Evaluation) -> Option<Self> {
        let Evaluation::Distill {
            loss,
            common,
            lambda_kl,
            lambda_uld,
        } = evaluation
        else {
            return None;
        };
        let pairs = common
            .iter()
            .flat_map(|c| c.student_partner.iter().enumerate())
            .filter(|(_, &t)| t >= 0)
            .map(|(s, &t)| (s as u32, t as u32))
            .collect();
        match loss {
            LossKind::Pkl => Some(Objective::Pkl),
            LossKind::Gold | LossKind::Hkl | LossKind::Uld => Some(Objective::Hybrid {
                pairs,
                lambda_kl: *lambda_kl as f64,
                lambda_uld: *lambda_uld as f64,
            }),
            LossKind::Kl => None,
        }
    }
}

/// Per slot, the merged log-distribution (`None` for a skipped slot).
fn merged(logits: &[f64], v: usize, merge: &MergePlan, tau: f64) -> Vec<Option<Vec<f64>>> {
    let row = |r: usize| log_softmax(&logits[r * v..(r + 1) * v], tau);
    let mut shift = vec![0.0; merge.predict_row.len()];
    for &(r, token, slot) in &merge.continuation {
        shift[slot as usize] += row(r as usize)[token as usize];
    }
    merge
        .predict_row
        .iter()
        .zip(&shift)
        .map(|(r, &sigma)| r.map(|r| row(r as usize).into_iter().map(|x| x + sigma).collect()))
        .collect()
}

/// W's rows as `(teacher id, weight)` lists.
fn rows(x: &Problem<'_>) -> Vec<Vec<(usize, f64)>> {
    (0..x.vs)
        .map(|s| {
            (0..x.kw)
                .map(|k| (x.indices[s * x.kw + k], x.weights[s * x.kw + k]))
                .filter(|&(t, _)| t >= 0)
                .map(|(t, w)| (t as usize, w))
                .collect()
        })
        .collect()
}

/// The loss.
pub fn loss(x: &Problem<'_>, objective: &Objective) -> f64 {
    let student = merged(x.student, x.vs, x.merge, x.tau);
    let teacher = merged(x.teacher, x.vt, x.merge, x.tau);
    let mut total = 0.0;
    let mut slots = 0;
    for (ls, lq) in student.iter().zip(&teacher) {
        let (Some(ls), Some(lq)) = (ls, lq) else {
            continue;
        };
        let kept = top_k(lq, x.top_k);
        total += match objective {
            Objective::Pkl => reference::pkl_chunk(ls, lq, &kept, &rows(x), x.eps),
            Objective::Hybrid {
                pairs,
                lambda_kl,
                lambda_uld,
            } => {
                let pairs: Vec<(usize, usize)> = pairs
                    .iter()
                    .map(|&(s, t)| (s as usize, t as usize))
                    .collect();
                reference::hybrid_chunk(ls, lq, &kept, &pairs, (*lambda_kl, *lambda_uld))
            }
        };
        slots += 1;
    }
    if slots == 0 {
        0.0
    } else {
        x.tau * x.tau * total / slots as f64
    }
}

/// Central differences of the loss at coordinate `i` of the student logits (`weights: false`)
/// or of W's weights.
pub fn partial(x: &Problem<'_>, objective: &Objective, i: usize, weights: bool) -> f64 {
    let h = 1e-6;
    let at = |delta: f64| {
        let mut moved = if weights {
            x.weights.to_vec()
        } else {
            x.student.to_vec()
        };
        moved[i] += delta;
        let p = if weights {
            Problem {
                weights: &moved,
                ..*x
            }
        } else {
            Problem {
                student: &moved,
                ..*x
            }
        };
        loss(&p, objective)
    };
    (at(h) - at(-h)) / (2.0 * h)
}
