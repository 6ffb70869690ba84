//! The distillation losses of one compared chunk in plain f64, written from their definitions
//! (the book's page on the losses), for the tests of every crate to check the implementations
//! against.
//! `ls` and `lq` are the chunk's merged log-probabilities of the student (over V_S) and of the
//! teacher (over V_T); `kept` the teacher ids of its top-K.

/// `log softmax(z / τ)` of one logit row.
pub fn log_softmax(z: &[f64], tau: f64) -> Vec<f64> {
    let max = z.iter().map(|x| x / tau).fold(f64::NEG_INFINITY, f64::max);
    let lse = max + z.iter().map(|x| (x / tau - max).exp()).sum::<f64>().ln();
    z.iter().map(|x| x / tau - lse).collect()
}

/// The ids of the `k` largest entries of `lq`, largest first.
pub fn top_k(lq: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lq.len()).collect();
    order.sort_by(|&a, &b| lq[b].total_cmp(&lq[a]));
    order.truncate(k);
    order
}

/// The sorted L1 of ULD: both sides sorted descending, the shorter zero-padded.
pub fn sorted_l1(mut a: Vec<f64>, mut b: Vec<f64>) -> f64 {
    a.sort_by(|x, y| y.total_cmp(x));
    b.sort_by(|x, y| y.total_cmp(x));
    let n = a.len().max(b.len());
    a.resize(n, 0.0);
    b.resize(n, 0.0);
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum()
}

/// GOLD / H-KL / ULD: `λ_KL` times the common KL over the pairs `(s, t)` whose `t` is kept (a
/// teacher id in k pairs is in k terms), plus `λ_ULD` times the sorted L1 between the student
/// ids in no pair and the kept teacher ids in no pair.
pub fn hybrid_chunk(
    ls: &[f64],
    lq: &[f64],
    kept: &[usize],
    pairs: &[(usize, usize)],
    (lambda_kl, lambda_uld): (f64, f64),
) -> f64 {
    let common: f64 = pairs
        .iter()
        .filter(|(_, t)| kept.contains(t))
        .map(|&(s, t)| lq[t].exp() * (lq[t] - ls[s]))
        .sum();
    let student = (0..ls.len())
        .filter(|&s| !pairs.iter().any(|p| p.0 == s))
        .map(|s| ls[s].exp())
        .collect();
    let teacher = kept
        .iter()
        .filter(|&&t| !pairs.iter().any(|p| p.1 == t))
        .map(|&t| lq[t].exp())
        .collect();
    lambda_kl * common + lambda_uld * sorted_l1(student, teacher)
}

/// P-KL: `Σ_{t kept} q_t (log q_t − log(p̃_t + ε))` with the projection re-normalized to the
/// student chunk's mass, `p̃ = Wᵀp̂ · Σ_s p̂_s / Σ_s r_s p̂_s` (0 when W maps none of it); W as
/// its rows of `(teacher id, weight)`.
pub fn pkl_chunk(
    ls: &[f64],
    lq: &[f64],
    kept: &[usize],
    rows: &[Vec<(usize, f64)>],
    eps: f64,
) -> f64 {
    let mut projected = vec![0.0; lq.len()];
    let (mut mass, mut mapped) = (0.0, 0.0);
    for (row, &l) in rows.iter().zip(ls) {
        mass += l.exp();
        for &(t, weight) in row {
            projected[t] += weight * l.exp();
            mapped += weight * l.exp();
        }
    }
    let mass = mass + ls[rows.len()..].iter().map(|l| l.exp()).sum::<f64>();
    let norm = if mapped > 0.0 { mass / mapped } else { 0.0 };
    kept.iter()
        .map(|&t| lq[t].exp() * (lq[t] - (norm * projected[t] + eps).ln()))
        .sum()
}
