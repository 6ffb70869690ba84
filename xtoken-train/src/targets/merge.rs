//! What the stored and the served merge share with the in-process one: each chunk slot's shift,
//! the sum of its continuation tokens' log-probabilities, added in the in-process kernel's order
//! (continuation rows ascending), so that the merged entries equal its own bit for bit.

use xtoken_core::plan::BatchPlan;

/// Per chunk slot of `plan`, `σ`: the sum of `observed(row)` over its continuation rows, in
/// f64, taken in the order of the sorted `(row, token, slot)` terms; a row `observed` has no
/// value for adds nothing.
pub fn continuation_shifts(plan: &BatchPlan, observed: impl Fn(usize) -> Option<f32>) -> Vec<f64> {
    let side = &plan.teacher;
    let mut terms: Vec<(u32, u32, u32)> = side
        .continuation_row
        .iter()
        .zip(&side.continuation_token)
        .zip(&side.continuation_chunk)
        .map(|((&r, &t), &c)| (r as u32, t as u32, c as u32))
        .collect();
    terms.sort_unstable();
    let mut sigma = vec![0.0f64; plan.batch * plan.chunks];
    for &(row, _, slot) in &terms {
        if let Some(value) = observed(row as usize) {
            sigma[slot as usize] += value as f64;
        }
    }
    sigma
}
