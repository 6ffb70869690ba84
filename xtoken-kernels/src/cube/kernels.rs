//! The cubecl kernels. Logits and their gradient are in the tensor's own float type `F`
//! (f32/f16/bf16, chosen at launch); everything is computed and reduced in f32. Int arrays
//! (token ids, rows, W's indices, the merge plan) are i32.
//!
//! Every kernel takes its address width at launch (`address_type = "dynamic"`): 64-bit when a
//! buffer holds more than 2³² elements (a batch of 32k rows × 152k teacher logits does).
//!
//! No float atomics anywhere: reductions are fixed-order trees in shared memory, and the
//! projection's backward reads W through its transposed (per teacher id) layout or through a
//! scattered per-slot buffer, so a run is bit-reproducible on one device.

use cubecl::prelude::*;

/// Threads per cube of the row reductions.
pub const BLOCK: usize = 256;

/// Per row of `z` `[rows, v]`: `lse[row] = log Σ exp(z·t)`, and `bad[row] = 1` when the row
/// holds NaN or +∞ or only −∞ (then `lse` is meaningless). With `weighted`, in the same pass,
/// `mass[row] = Σ_s weights[s] p[row, s]`: P-KL's re-normalization `ρ` (W's row sums as the
/// weights), the hybrid losses' uncommon mass (1 on the ids without a partner). One cube per
/// row; each unit keeps an online (max, sum, weighted sum), merged by a tree in shared memory,
/// so the row is read once. With `split`, the same pass counts the row's order keys in a
/// histogram and finds the bin of the `keep`-th largest (`split_bin`), which `top_k` then
/// selects from in one more pass.
///
/// No infinity or NaN constants appear: WGSL has no literal for them, and a kernel that fails
/// to compile on the device would leave its outputs untouched. `f32::MIN` stands for "no value
/// yet"; a finite logit is always above it.
// The negated comparisons are the NaN tests (a kernel has no `partial_cmp`).
#[allow(clippy::neg_cmp_op_on_partial_ord)]
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn row_lse<F: Float>(
    z: &Array<F>,
    weights: &Array<f32>,
    excluded: &Array<i32>,
    lse: &mut Array<f32>,
    bad: &mut Array<u32>,
    mass: &mut Array<f32>,
    splits: &mut Array<u32>,
    rows: usize,
    v: usize,
    t: f32,
    keep: u32,
    #[comptime] block: usize,
    #[comptime] weighted: bool,
    #[comptime] split: bool,
    #[comptime] masked: bool,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let tid = UNIT_POS as usize;
    let hist = SharedMemory::<Atomic<u32>>::new(comptime!(if split { SPLIT_BINS } else { 1 }));
    if comptime![split] {
        let mut b = tid;
        while b < SPLIT_BINS {
            hist[b].store(0u32);
            b += block;
        }
    }
    sync_cube();
    let mut m = f32::new(f32::MIN);
    let mut s = 0.0f32;
    let mut sw = 0.0f32;
    let mut flag = 0u32;
    let mut c = tid;
    while c < v {
        let raw = f32::cast_from(z[row * v + c]);
        if comptime![split] {
            let key = entry_key(raw, excluded, c, masked);
            hist[usize::cast_from(key >> SPLIT_SHIFT)].fetch_add(1u32);
        }
        let x = raw * t;
        let mut w = 0.0f32;
        if comptime![weighted] {
            w = weights[c];
        }
        // `!(x < MAX)` catches NaN and +∞ alike.
        if !(x < f32::MAX) {
            flag = 1u32;
        } else if x > m {
            let rescale = (m - x).exp();
            s = s * rescale + 1.0f32;
            sw = sw * rescale + w;
            m = x;
        } else if x > f32::MIN {
            let e = (x - m).exp();
            s += e;
            sw += w * e;
        }
        c += block;
    }
    let mut max_shared = SharedMemory::<f32>::new(block);
    let mut sum_shared = SharedMemory::<f32>::new(block);
    let mut weighted_shared = SharedMemory::<f32>::new(block);
    let mut bad_shared = SharedMemory::<u32>::new(block);
    max_shared[tid] = m;
    sum_shared[tid] = s;
    weighted_shared[tid] = sw;
    bad_shared[tid] = flag;
    sync_cube();
    let mut stride = (CUBE_DIM / 2) as usize;
    while stride > 0 {
        if tid < stride {
            let (m1, s1) = (max_shared[tid], sum_shared[tid]);
            let (m2, s2) = (max_shared[tid + stride], sum_shared[tid + stride]);
            let mut mm = m1;
            if m2 > m1 {
                mm = m2;
            }
            let (r1, r2) = ((m1 - mm).exp(), (m2 - mm).exp());
            max_shared[tid] = mm;
            sum_shared[tid] = s1 * r1 + s2 * r2;
            weighted_shared[tid] = weighted_shared[tid] * r1 + weighted_shared[tid + stride] * r2;
            bad_shared[tid] = bad_shared[tid] | bad_shared[tid + stride];
        }
        sync_cube();
        stride /= 2;
    }
    if tid == 0 {
        let total = sum_shared[0];
        let mut flag = bad_shared[0];
        if !(total > 0.0f32) {
            flag = 1u32;
        }
        bad[row] = flag;
        lse[row] = max_shared[0] + total.ln();
        if comptime![weighted] {
            let mut found = 0.0f32;
            if total > 0.0f32 {
                found = weighted_shared[0] / total;
            }
            mass[row] = found;
        }
    }
    if comptime![split] {
        let mut found = SharedMemory::<u32>::new(3usize);
        split_bin(&hist, &mut found, keep, block);
        sync_cube();
        if tid < 3 {
            splits[row * 3 + tid] = found[tid];
        }
    }
}

/// The chunk merge: per slot, `σ = Σ (z[row, token]·t − lse[row])` over its continuation terms
/// (`start` is the slots' CSR offsets into `rows`/`tokens`). One unit per slot, summing in
/// term order.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn merge_shift<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    start: &Array<i32>,
    rows: &Array<i32>,
    tokens: &Array<i32>,
    sigma: &mut Array<f32>,
    slots: usize,
    v: usize,
    t: f32,
    #[define(F)] _dtype: StorageType,
) {
    let slot = ABSOLUTE_POS;
    if slot >= slots {
        terminate!();
    }
    let mut acc = 0.0f32;
    let end = usize::cast_from(start[slot + 1]);
    let mut i = usize::cast_from(start[slot]);
    while i < end {
        let row = usize::cast_from(rows[i]);
        let token = usize::cast_from(tokens[i]);
        acc += f32::cast_from(z[row * v + token]) * t - lse[row];
        i += 1;
    }
    sigma[slot] = acc;
}

/// Tree sum of `block` partials in shared memory; unit 0 returns the total.
#[cube]
fn block_sum(partial: f32, #[comptime] block: usize) -> f32 {
    let tid = UNIT_POS as usize;
    let mut shared = SharedMemory::<f32>::new(block);
    shared[tid] = partial;
    sync_cube();
    let mut stride = (CUBE_DIM / 2) as usize;
    while stride > 0 {
        if tid < stride {
            shared[tid] = shared[tid] + shared[tid + stride];
        }
        sync_cube();
        stride /= 2;
    }
    shared[0]
}

/// The fused top-K KL of one compared slot per cube: over the teacher's kept entries `(id, lq)`,
/// `loss[i] = Σ q (lq − lp̂_S[id])` with `lp̂_S = z·t − lse + σ` read straight from the logit row,
/// and `dsigma[slot] = Σh = −Σ q`.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn kl_slots<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    teacher_ids: &Array<i32>,
    teacher_logp: &Array<f32>,
    loss: &mut Array<f32>,
    dsigma: &mut Array<f32>,
    valid: usize,
    k: usize,
    v: usize,
    t: f32,
    #[comptime] block: usize,
    #[define(F)] _dtype: StorageType,
) {
    let i = CUBE_POS;
    if i >= valid {
        terminate!();
    }
    let slot = usize::cast_from(valid_slot[i]);
    let row = usize::cast_from(valid_row[i]);
    let shift = sigma[slot] - lse[row];
    let mut acc_loss = 0.0f32;
    let mut acc_q = 0.0f32;
    let mut j = UNIT_POS as usize;
    while j < k {
        let lq = teacher_logp[slot * k + j];
        if lq > f32::MIN {
            let q = lq.exp();
            let id = usize::cast_from(teacher_ids[slot * k + j]);
            let ls = f32::cast_from(z[row * v + id]) * t + shift;
            acc_loss += q * (lq - ls);
            acc_q += q;
        }
        j += block;
    }
    let total_loss = block_sum(acc_loss, block);
    let total_q = block_sum(acc_q, block);
    if UNIT_POS == 0 {
        loss[i] = total_loss;
        dsigma[slot] = -total_q;
    }
}

/// KL's sparse gradient term on the predicting rows: `grad[row, id] += c·h = −c·q` at each kept
/// entry. Kept ids are distinct within a slot and rows predict one slot each, so no two units
/// write one element.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn kl_grad_sparse<F: Float>(
    grad: &mut Array<F>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    teacher_ids: &Array<i32>,
    teacher_logp: &Array<f32>,
    valid: usize,
    k: usize,
    v: usize,
    c: f32,
    #[define(F)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= valid * k {
        terminate!();
    }
    let i = ABSOLUTE_POS / k;
    let j = ABSOLUTE_POS % k;
    let slot = usize::cast_from(valid_slot[i]);
    let lq = teacher_logp[slot * k + j];
    if lq > f32::MIN {
        let row = usize::cast_from(valid_row[i]);
        let at = row * v + usize::cast_from(teacher_ids[slot * k + j]);
        grad[at] = F::cast_from(f32::cast_from(grad[at]) - c * lq.exp());
    }
}

/// W's row sums `r_s` over the occupied slots, one unit per student id.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn pkl_row_mass(
    indices: &Array<i32>,
    weights: &Array<f32>,
    row_mass: &mut Array<f32>,
    v: usize,
    kw: usize,
) {
    let s = ABSOLUTE_POS;
    if s >= v {
        terminate!();
    }
    let mut acc = 0.0f32;
    for kk in 0..kw {
        if indices[s * kw + kk] >= 0i32 {
            acc += weights[s * kw + kk];
        }
    }
    row_mass[s] = acc;
}

/// P-KL per kept entry `(i, j)` of a chunk of compared slots (`first..first + count`): the
/// re-normalized projected student probability through W's column of the teacher id,
/// `p̃ = e^σ / ρ · Σ_{e ∈ col(id)} w[e] · p[row, e / kw]` (0 when `ρ = 0`); writes the loss
/// term `q (lq − ln(p̃ + ε))`, `g = −q / (p̃ + ε)` into the chunk's dense `[count, V_T]` buffer
/// at the id (zero elsewhere), and `g · p̃` (its share of `Σh`).
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn pkl_entries<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    teacher_ids: &Array<i32>,
    teacher_logp: &Array<f32>,
    column_start: &Array<i32>,
    column_entries: &Array<i32>,
    weights: &Array<f32>,
    mass: &Array<f32>,
    terms: &mut Array<f32>,
    sigma_terms: &mut Array<f32>,
    scattered: &mut Array<f32>,
    first: usize,
    count: usize,
    k: usize,
    kw: usize,
    v: usize,
    vt: usize,
    t: f32,
    eps: f32,
    #[define(F)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= count * k {
        terminate!();
    }
    let local = ABSOLUTE_POS / k;
    let j = ABSOLUTE_POS % k;
    let slot = usize::cast_from(valid_slot[first + local]);
    let lq = teacher_logp[slot * k + j];
    if lq > f32::MIN {
        let row = usize::cast_from(valid_row[first + local]);
        let base = lse[row];
        let id = usize::cast_from(teacher_ids[slot * k + j]);
        let mut acc = 0.0f32;
        let end = usize::cast_from(column_start[id + 1]);
        let mut e = usize::cast_from(column_start[id]);
        while e < end {
            let entry = usize::cast_from(column_entries[e]);
            let s = entry / kw;
            acc += weights[entry] * (f32::cast_from(z[row * v + s]) * t - base).exp();
            e += 1;
        }
        let rho = mass[row];
        let mut projected = 0.0f32;
        if rho > 0.0f32 {
            projected = sigma[slot].exp() / rho * acc;
        }
        let q = lq.exp();
        let pt = projected + eps;
        let g = -q / pt;
        terms[ABSOLUTE_POS] = q * (lq - pt.ln());
        sigma_terms[ABSOLUTE_POS] = g * projected;
        scattered[local * vt + id] = g;
    } else {
        terms[ABSOLUTE_POS] = 0.0f32;
        sigma_terms[ABSOLUTE_POS] = 0.0f32;
    }
}

/// Per compared slot of a chunk (one cube each): sums its entries' loss terms into
/// `loss[first + local]` and their `g · p̃` into `dsigma[slot]`.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn slot_sums(
    terms: &Array<f32>,
    sigma_terms: &Array<f32>,
    valid_slot: &Array<i32>,
    loss: &mut Array<f32>,
    dsigma: &mut Array<f32>,
    first: usize,
    count: usize,
    k: usize,
    #[comptime] block: usize,
) {
    let local = CUBE_POS;
    if local >= count {
        terminate!();
    }
    let mut acc_loss = 0.0f32;
    let mut acc_sigma = 0.0f32;
    let mut j = UNIT_POS as usize;
    while j < k {
        acc_loss += terms[local * k + j];
        acc_sigma += sigma_terms[local * k + j];
        j += block;
    }
    let total_loss = block_sum(acc_loss, block);
    let total_sigma = block_sum(acc_sigma, block);
    if UNIT_POS == 0 {
        loss[first + local] = total_loss;
        let slot = usize::cast_from(valid_slot[first + local]);
        dsigma[slot] = total_sigma;
    }
}

/// The predicting rows' gradient, written whole: `grad[row, s] = c (h_s − p_s Σh)`. With
/// `hybrid`, `h_s = λ_ULD e^σ p_s` on the uncommon ids (`partner` is the student's partner
/// table); otherwise `h` is zero here. KL and the hybrid objectives add their sparse parts
/// afterwards; P-KL has its own kernel (`pkl_grad`).
// The comptime test stays apart from the runtime one it guards.
#[allow(clippy::collapsible_if)]
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn predicting_grad<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    dsigma: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    partner: &Array<i32>,
    grad: &mut Array<F>,
    count: usize,
    v: usize,
    t: f32,
    c: f32,
    lambda: f32,
    #[comptime] hybrid: bool,
    #[define(F)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= count * v {
        terminate!();
    }
    let local = ABSOLUTE_POS / v;
    let s = ABSOLUTE_POS % v;
    let slot = usize::cast_from(valid_slot[local]);
    let row = usize::cast_from(valid_row[local]);
    let at = row * v + s;
    let p = (f32::cast_from(z[at]) * t - lse[row]).exp();
    let mut h = 0.0f32;
    if comptime![hybrid] {
        if partner[s] < 0i32 {
            h = lambda * sigma[slot].exp() * p;
        }
    }
    grad[at] = F::cast_from(c * (h - p * dsigma[slot]));
}

/// P-KL's backward for a chunk of compared slots (`first..first + count`), one unit per student
/// id `s`, walking the chunk's rows: each logit is read once, its gradient written once
/// (`logits`), and W's gradient for row `s` summed in registers over the chunk and added once
/// (`weights_grad`). With `ρ` the row's re-normalization mass (0: nothing flows),
///
/// - `grad[row, s] = c (h_s − p_s Σh)`, `h_s = p_s (e^σ / ρ · Σ_k w[s, k] g[idx[s, k]] +
///   Σh (1 − r_s / ρ))`: the projection's backward to `p̂` through W's row and its
///   re-normalization, gathering the chunk's scattered `g`;
/// - `gw[s, k] += scale Σ_rows p_s / ρ (e^σ g[idx[s, k]] − Σh)` on occupied entries.
///
/// Adjacent units read adjacent logits of a row; `kw` (W's width) is fixed for a run.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn pkl_grad<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    dsigma: &Array<f32>,
    mass: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    indices: &Array<i32>,
    weights: &Array<f32>,
    scattered: &Array<f32>,
    grad: &mut Array<F>,
    grad_weights: &mut Array<f32>,
    first: usize,
    count: usize,
    v: usize,
    vt: usize,
    t: f32,
    c: f32,
    scale: f32,
    #[comptime] kw: usize,
    #[comptime] logits: bool,
    #[comptime] weights_grad: bool,
    #[define(F)] _dtype: StorageType,
) {
    let s = ABSOLUTE_POS;
    if s >= v {
        terminate!();
    }
    let mut ids = Array::<i32>::new(kw);
    let mut w = Array::<f32>::new(kw);
    let mut gw = Array::<f32>::new(kw);
    let mut r = 0.0f32;
    for kk in 0..kw {
        ids[kk] = indices[s * kw + kk];
        w[kk] = weights[s * kw + kk];
        gw[kk] = 0.0f32;
        if ids[kk] >= 0i32 {
            r += w[kk];
        }
    }
    for local in 0..count {
        let slot = usize::cast_from(valid_slot[first + local]);
        let row = usize::cast_from(valid_row[first + local]);
        let at = row * v + s;
        let p = (f32::cast_from(z[at]) * t - lse[row]).exp();
        let rho = mass[row];
        let ds = dsigma[slot];
        let mut h = 0.0f32;
        if rho > 0.0f32 {
            let es = sigma[slot].exp();
            let weight = scale * p / rho;
            let mut acc = 0.0f32;
            for kk in 0..kw {
                if ids[kk] >= 0i32 {
                    let g = scattered[local * vt + usize::cast_from(ids[kk])];
                    acc += w[kk] * g;
                    if comptime![weights_grad] {
                        gw[kk] += weight * (es * g - ds);
                    }
                }
            }
            h = p * (es / rho * acc + ds * (1.0f32 - r / rho));
        }
        if comptime![logits] {
            grad[at] = F::cast_from(c * (h - p * ds));
        }
    }
    if comptime![weights_grad] {
        for kk in 0..kw {
            grad_weights[s * kw + kk] += gw[kk];
        }
    }
}

/// Clears the chunk's scattered buffer where `pkl_entries` wrote, so it is all zero for the
/// next chunk without a full fill.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn clear_scattered(
    scattered: &mut Array<f32>,
    valid_slot: &Array<i32>,
    teacher_ids: &Array<i32>,
    first: usize,
    count: usize,
    k: usize,
    vt: usize,
) {
    if ABSOLUTE_POS >= count * k {
        terminate!();
    }
    let local = ABSOLUTE_POS / k;
    let j = ABSOLUTE_POS % k;
    let slot = usize::cast_from(valid_slot[first + local]);
    let id = usize::cast_from(teacher_ids[slot * k + j]);
    scattered[local * vt + id] = 0.0f32;
}

/// The continuation rows' gradient, added: `grad[row, x] += c (Σ_terms [x = token] Σh_slot −
/// p_x Σ_terms Σh_slot)`. `start` gives each listed row's CSR range of `(token, slot)` terms.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn continuation_grad<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    dsigma: &Array<f32>,
    rows: &Array<i32>,
    start: &Array<i32>,
    tokens: &Array<i32>,
    slots: &Array<i32>,
    grad: &mut Array<F>,
    count: usize,
    v: usize,
    t: f32,
    c: f32,
    #[define(F)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= count * v {
        terminate!();
    }
    let i = ABSOLUTE_POS / v;
    let x = ABSOLUTE_POS % v;
    let row = usize::cast_from(rows[i]);
    let at = row * v + x;
    let mut total = 0.0f32;
    let mut hit = 0.0f32;
    let end = usize::cast_from(start[i + 1]);
    let mut e = usize::cast_from(start[i]);
    while e < end {
        let d = dsigma[usize::cast_from(slots[e])];
        total += d;
        if usize::cast_from(tokens[e]) == x {
            hit += d;
        }
        e += 1;
    }
    let p = (f32::cast_from(z[at]) * t - lse[row]).exp();
    grad[at] = F::cast_from(f32::cast_from(grad[at]) + c * (hit - p * total));
}

/// Zeroes whole rows (listed) of a `[rows, v]` array: the rows no slot reads.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn zero_rows<F: Float>(
    grad: &mut Array<F>,
    rows: &Array<i32>,
    count: usize,
    v: usize,
    #[define(F)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= count * v {
        terminate!();
    }
    let row = usize::cast_from(rows[ABSOLUTE_POS / v]);
    grad[row * v + ABSOLUTE_POS % v] = F::new(0.0);
}

/// Next-token cross-entropy per row (`targets[row] < 0`: skipped): the loss term
/// `lse − z[y]` and, with `with_grad`, the whole gradient row `(p − e_y) · inv` (0 on skipped
/// rows).
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn cross_entropy_grad<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    targets: &Array<i32>,
    grad: &mut Array<F>,
    rows: usize,
    v: usize,
    inv: f32,
    #[define(F)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= rows * v {
        terminate!();
    }
    let row = ABSOLUTE_POS / v;
    let x = ABSOLUTE_POS % v;
    let y = targets[row];
    let mut g = 0.0f32;
    if y >= 0i32 {
        g = (f32::cast_from(z[ABSOLUTE_POS]) - lse[row]).exp() * inv;
        if usize::cast_from(y) == x {
            g -= inv;
        }
    }
    grad[ABSOLUTE_POS] = F::cast_from(g);
}

/// Per row, the cross-entropy term `lse − z[y]` (0 on skipped rows).
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn cross_entropy_terms<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    targets: &Array<i32>,
    terms: &mut Array<f32>,
    rows: usize,
    v: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = ABSOLUTE_POS;
    if row >= rows {
        terminate!();
    }
    let y = targets[row];
    let mut term = 0.0f32;
    if y >= 0i32 {
        term = lse[row] - f32::cast_from(z[row * v + usize::cast_from(y)]);
    }
    terms[row] = term;
}

/// `out[0] = scale · Σ values` in one cube, in a fixed order.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn scaled_sum<F: Float>(
    values: &Array<f32>,
    out: &mut Array<F>,
    n: usize,
    scale: f32,
    #[comptime] block: usize,
    #[define(F)] _dtype: StorageType,
) {
    let mut acc = 0.0f32;
    let mut i = UNIT_POS as usize;
    while i < n {
        acc += values[i];
        i += block;
    }
    let total = block_sum(acc, block);
    if UNIT_POS == 0 {
        out[0] = F::cast_from(total * scale);
    }
}

/// `flag[0] = 1` when any of the `n` listed rows is flagged in `bad`, in one cube.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn any_flagged(
    bad: &Array<u32>,
    rows: &Array<i32>,
    flag: &mut Array<u32>,
    n: usize,
    #[comptime] block: usize,
) {
    let mut i = UNIT_POS as usize;
    while i < n {
        if bad[usize::cast_from(rows[i])] != 0u32 {
            flag[0] = 1u32;
        }
        i += block;
    }
}

/// `out[i] = marker` for every `i` when `flag[0]` is set (the marker, NaN, is a runtime value:
/// WGSL has no literal for it).
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn poison(flag: &Array<u32>, out: &mut Array<f32>, marker: f32, n: usize) {
    if ABSOLUTE_POS < n && flag[0] != 0u32 {
        out[ABSOLUTE_POS] = marker;
    }
}

/// `out[i] = 0` in any numeric storage type. burn's own fill sizes its cubes and vectors by the
/// length, so each length the data brings compiles it again; this one compiles once per type.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn zero<N: Numeric>(out: &mut Array<N>, n: usize, #[define(N)] _dtype: StorageType) {
    if ABSOLUTE_POS < n {
        out[ABSOLUTE_POS] = N::from_int(0);
    }
}

/// `out[i] = value` (a runtime value: WGSL has no literal for −∞).
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn fill(out: &mut Array<f32>, value: f32, n: usize) {
    if ABSOLUTE_POS < n {
        out[ABSOLUTE_POS] = value;
    }
}

/// A float's bits as an unsigned key with the same order as `f32::total_cmp`.
#[cube]
fn order_key(x: f32) -> u32 {
    let bits = u32::reinterpret(x);
    let mut key = bits | 0x8000_0000u32;
    if bits >= 0x8000_0000u32 {
        key = !bits;
    }
    key
}

/// The order key of entry `x`; with `masked`, entries with `excluded[x] >= 0` get 0, below
/// every real value, so they are never selected while enough others remain.
// The comptime test stays apart: without `masked`, `excluded` is a one-element placeholder.
#[allow(clippy::collapsible_if)]
#[cube]
fn entry_key(value: f32, excluded: &Array<i32>, x: usize, #[comptime] masked: bool) -> u32 {
    let mut key = order_key(value);
    if comptime![masked] {
        if excluded[x] >= 0i32 {
            key = 0u32;
        }
    }
    key
}

/// Compare-exchange of entries `a < b` of one slot's list: the better (larger value, then
/// smaller id) goes first. Entries at `k` and beyond do not exist (they count as worst).
#[cube]
fn keep_better_first(
    ids: &mut Array<i32>,
    values: &mut Array<f32>,
    out: usize,
    a: usize,
    b: usize,
    k: usize,
) {
    if b < k {
        let (va, vb) = (values[out + a], values[out + b]);
        let (ia, ib) = (ids[out + a], ids[out + b]);
        // By key, not by float comparison: −0 ranks below +0, as in `total_cmp`.
        let (ka, kb) = (order_key(va), order_key(vb));
        if ka < kb || (ka == kb && ia > ib) {
            values[out + a] = vb;
            values[out + b] = va;
            ids[out + a] = ib;
            ids[out + b] = ia;
        }
    }
}

/// Bits of the order key that the row pass's histogram resolves (`row_lse` with `split`).
pub const SPLIT_BITS: u32 = 11;
/// Bins of that histogram.
pub const SPLIT_BINS: usize = 1 << SPLIT_BITS;
/// The shift that leaves a key's histogram bin.
const SPLIT_SHIFT: u32 = 32 - SPLIT_BITS;
/// The shift and mask of a key's second-level bin (the next `SPLIT_BITS`).
const SUB_SHIFT: u32 = SPLIT_SHIFT - SPLIT_BITS;
const SUB_MASK: u32 = (1 << SPLIT_BITS) - 1;

/// From a histogram of `SPLIT_BINS` bins of order-key bits, the bin that holds the `keep`-th
/// largest: `found = (bin, entries in higher bins, entries in the bin)`, set by one unit (the
/// caller syncs before reading it; nothing is set when the histogram holds fewer than `keep`).
/// The units' counts go in by shared-memory atomics (integer counts: the result does not
/// depend on their order).
#[cube]
fn split_bin(
    hist: &SharedMemory<Atomic<u32>>,
    found: &mut SharedMemory<u32>,
    keep: u32,
    #[comptime] block: usize,
) {
    let tid = UNIT_POS as usize;
    let per = comptime!(SPLIT_BINS / block);
    let mut own = 0u32;
    for j in 0..per {
        own += hist[tid * per + j].load();
    }
    // Inclusive suffix sums over the units: `suffix[u]` counts the keys in units `u..`.
    let mut suffix = SharedMemory::<u32>::new(block);
    suffix[tid] = own;
    sync_cube();
    let mut offset = 1usize;
    while offset < block {
        let mut add = 0u32;
        if tid + offset < block {
            add = suffix[tid + offset];
        }
        sync_cube();
        suffix[tid] += add;
        sync_cube();
        offset *= 2;
    }
    let after = suffix[tid] - own;
    if after < keep && suffix[tid] >= keep {
        let mut above = after;
        let mut done = false;
        for j in 0..per {
            let bin = tid * per + per - 1 - j;
            let count = hist[bin].load();
            if !done {
                if above + count >= keep {
                    found[0] = u32::cast_from(bin);
                    found[1] = above;
                    found[2] = count;
                    done = true;
                } else {
                    above += count;
                }
            }
        }
    }
}

/// The top-K of one compared slot per cube, best first (larger logit, then smaller id, as the
/// host orders them), with merged log-probabilities `z·t − lse + σ`: the teacher's kept entries,
/// or (with `masked`) the student's largest probabilities outside the common set.
///
/// `row_lse` has found, in its pass over the row, the histogram bin of the K-th largest key
/// (`splits`: the bin, the entries above it, the entries in it). Then:
///
/// 1. One coalesced pass over the row: entries of higher bins are kept (each unit appends by a
///    shared-memory counter), entries of the bin are the candidates, appended to the slot's
///    scratch list (`cap` long).
/// 2. The candidates are sorted best first in place and the best `K − above` kept.
/// 3. A bitonic sort of the K entries in place (compare-exchanges between `sync_storage`
///    barriers, over `cap`: K rounded up to a power of two, the scratch list's length too).
///
/// A row whose bin holds more than `cap` candidates first splits the bin by the keys' next
/// `SPLIT_BITS` bits in one more pass (the bin's keys above the sub-bin are kept, the sub-bin's
/// are the candidates); where even that overflows (most of the row equal, say), the row takes
/// the exact radix select (`radix_select`: eight more passes of 4 bits, a count and a
/// compaction). Every barrier sits in control flow uniform over the cube: which path runs is
/// decided by data, so both paths' loops run and only their bodies are skipped.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn top_k<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    excluded: &Array<i32>,
    splits: &Array<u32>,
    ids: &mut Array<i32>,
    values: &mut Array<f32>,
    scratch_ids: &mut Array<i32>,
    scratch_values: &mut Array<f32>,
    valid: usize,
    v: usize,
    k: usize,
    cap: usize,
    t: f32,
    #[comptime] block: usize,
    #[comptime] masked: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = CUBE_POS;
    if i >= valid {
        terminate!();
    }
    let tid = UNIT_POS as usize;
    let row = usize::cast_from(valid_row[i]);
    let slot = usize::cast_from(valid_slot[i]);
    let base = row * v;
    let out = slot * k;
    let bin = splits[row * 3];
    let above_bin = splits[row * 3 + 1];
    let in_bin = usize::cast_from(splits[row * 3 + 2]);
    let scratch = i * cap;

    // A bin that overflows the list: the next `SPLIT_BITS` of its keys, in one more pass.
    let refine = in_bin > cap;
    let mut found = SharedMemory::<u32>::new(3usize);
    let keep = u32::cast_from(k) - above_bin;
    split_within(
        z, excluded, &mut found, base, v, bin, keep, refine, block, masked,
    );
    let mut sub = 0u32;
    let mut above = usize::cast_from(above_bin);
    let mut candidates = in_bin;
    if refine {
        sub = found[0];
        above += usize::cast_from(found[1]);
        candidates = usize::cast_from(found[2]);
    }
    let fast = candidates <= cap;

    let counters = SharedMemory::<Atomic<u32>>::new(2usize);
    if tid == 0 {
        counters[0].store(0u32);
        counters[1].store(0u32);
    }
    sync_cube();
    if fast {
        let mut x = tid;
        while x < v {
            let value = f32::cast_from(z[base + x]);
            let key = entry_key(value, excluded, x, masked);
            let top = key >> SPLIT_SHIFT;
            let mid = (key >> SUB_SHIFT) & SUB_MASK;
            if top > bin || (refine && top == bin && mid > sub) {
                let at = usize::cast_from(counters[0].fetch_add(1u32));
                ids[out + at] = i32::cast_from(x);
                values[out + at] = value;
            } else if top == bin && (!refine || mid == sub) {
                let at = usize::cast_from(counters[1].fetch_add(1u32));
                scratch_ids[scratch + at] = i32::cast_from(x);
                scratch_values[scratch + at] = value;
            }
            x += block;
        }
    }
    sync_storage();
    sync_cube();
    // The candidates best first: a sort over `cap` (uniform) of those that exist.
    let mut listed = 0usize;
    if fast {
        listed = candidates;
    }
    sort_best_first(scratch_ids, scratch_values, scratch, cap, listed, block);
    if fast {
        let mut j = tid;
        while j < k - above {
            ids[out + above + j] = scratch_ids[scratch + j];
            values[out + above + j] = scratch_values[scratch + j];
            j += block;
        }
    }
    radix_select(
        z, excluded, ids, values, base, out, v, k, !fast, block, masked,
    );
    sync_storage();
    sync_cube();

    sort_best_first(ids, values, out, cap, k, block);
    let shift = sigma[slot] - lse[row];
    let mut j = tid;
    while j < k {
        values[out + j] = values[out + j] * t + shift;
        j += block;
    }
}

/// The second-level split of the first-level `bin` of the row at `base` (`v` long): with
/// `active`, one pass counts the bin's keys by their next `SPLIT_BITS` bits and
/// `found` gets the sub-bin of the `keep`-th largest among them (`split_bin`); without, the
/// barriers run and nothing is read.
#[allow(clippy::too_many_arguments)]
#[cube]
fn split_within<F: Float>(
    z: &Array<F>,
    excluded: &Array<i32>,
    found: &mut SharedMemory<u32>,
    base: usize,
    v: usize,
    bin: u32,
    keep: u32,
    active: bool,
    #[comptime] block: usize,
    #[comptime] masked: bool,
) {
    let tid = UNIT_POS as usize;
    let hist = SharedMemory::<Atomic<u32>>::new(SPLIT_BINS);
    let mut b = tid;
    while b < SPLIT_BINS {
        hist[b].store(0u32);
        b += block;
    }
    sync_cube();
    if active {
        let mut x = tid;
        while x < v {
            let key = entry_key(f32::cast_from(z[base + x]), excluded, x, masked);
            if key >> SPLIT_SHIFT == bin {
                hist[usize::cast_from((key >> SUB_SHIFT) & SUB_MASK)].fetch_add(1u32);
            }
            x += block;
        }
    }
    sync_cube();
    split_bin(&hist, found, keep, block);
    sync_cube();
}

/// Bitonic sort of `list[at..at + n]`, best first, where entries at `limit` and beyond do not
/// exist (`n` a power of two, uniform over the cube).
#[cube]
fn sort_best_first(
    ids: &mut Array<i32>,
    values: &mut Array<f32>,
    at: usize,
    n: usize,
    limit: usize,
    #[comptime] block: usize,
) {
    let tid = UNIT_POS as usize;
    let pairs = n / 2;
    let mut size = 2usize;
    while size <= n {
        let half = size / 2;
        let mut p = tid;
        while p < pairs {
            let start = (p / half) * size;
            let offset = p % half;
            keep_better_first(
                ids,
                values,
                at,
                start + offset,
                start + size - 1 - offset,
                limit,
            );
            p += block;
        }
        sync_storage();
        sync_cube();
        let mut d = half / 2;
        while d > 0 {
            let mut p = tid;
            while p < pairs {
                let a = (p / d) * 2 * d + p % d;
                keep_better_first(ids, values, at, a, a + d, limit);
                p += block;
            }
            sync_storage();
            sync_cube();
            d /= 2;
        }
        size *= 2;
    }
}

/// The exact top-K of a row in id order, unsorted, when `active` (the cube's barriers run
/// either way; only the work is skipped).
///
/// 1. Radix select, 8 passes of 4 bits from the top of the order key: per-unit histograms in
///    shared memory (no atomics), summed per bin, give the K-th largest key and how many
///    entries equal to it are kept (the smallest ids among ties).
/// 2. Compaction in id order: each unit owns a contiguous segment; a scan of the per-unit
///    counts gives every kept entry its place.
// Kernels have no `usize::div_ceil`.
#[allow(clippy::manual_div_ceil, clippy::too_many_arguments)]
#[cube]
fn radix_select<F: Float>(
    z: &Array<F>,
    excluded: &Array<i32>,
    ids: &mut Array<i32>,
    values: &mut Array<f32>,
    base: usize,
    out: usize,
    v: usize,
    k: usize,
    active: bool,
    #[comptime] block: usize,
    #[comptime] masked: bool,
) {
    let tid = UNIT_POS as usize;
    let segment = (v + block - 1) / block;
    let mut lo = tid * segment;
    if lo > v {
        lo = v;
    }
    let mut hi = lo + segment;
    if hi > v {
        hi = v;
    }
    if !active {
        hi = lo;
    }

    let mut hist = SharedMemory::<u32>::new(block * 16usize);
    let mut totals = SharedMemory::<u32>::new(16usize);
    let mut state = SharedMemory::<u32>::new(2usize);
    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut remaining = u32::cast_from(k);
    for pass in 0..8usize {
        let shift = u32::cast_from(28 - 4 * pass);
        for d in 0..16usize {
            hist[tid * 16 + d] = 0u32;
        }
        let mut x = lo;
        while x < hi {
            let key = entry_key(f32::cast_from(z[base + x]), excluded, x, masked);
            if (key & mask) == prefix {
                let d = usize::cast_from((key >> shift) & 15u32);
                hist[tid * 16 + d] += 1u32;
            }
            x += 1;
        }
        sync_cube();
        if tid < 16 {
            let mut total = 0u32;
            for u in 0..block {
                total += hist[u * 16 + tid];
            }
            totals[tid] = total;
        }
        sync_cube();
        if tid == 0 {
            // Exactly one bin holds the K-th largest: the one where the count of larger
            // keys first reaches `remaining`.
            let mut rest = remaining;
            let mut chosen = 0u32;
            let mut larger = 0u32;
            for b in 0..16usize {
                let bin = 15usize - b;
                let count = totals[bin];
                if larger < remaining && larger + count >= remaining {
                    chosen = u32::cast_from(bin);
                    rest = remaining - larger;
                }
                larger += count;
            }
            state[0usize] = chosen;
            state[1usize] = rest;
        }
        sync_cube();
        prefix |= state[0usize] << shift;
        mask |= 15u32 << shift;
        remaining = state[1usize];
        sync_cube();
    }

    // `prefix` is now the K-th largest key; `remaining` entries equal to it are kept.
    let mut above_count = SharedMemory::<u32>::new(block);
    let mut equal_count = SharedMemory::<u32>::new(block);
    let mut above = 0u32;
    let mut equal = 0u32;
    let mut x = lo;
    while x < hi {
        let key = entry_key(f32::cast_from(z[base + x]), excluded, x, masked);
        if key > prefix {
            above += 1u32;
        } else if key == prefix {
            equal += 1u32;
        }
        x += 1;
    }
    above_count[tid] = above;
    equal_count[tid] = equal;
    sync_cube();
    if tid == 0 {
        let mut sum_above = 0u32;
        let mut sum_equal = 0u32;
        for u in 0..block {
            let (a, e) = (above_count[u], equal_count[u]);
            above_count[u] = sum_above;
            equal_count[u] = sum_equal;
            sum_above += a;
            sum_equal += e;
        }
    }
    sync_cube();
    let first_tie = u32::cast_from(k) - remaining;
    let mut at_above = above_count[tid];
    let mut at_equal = equal_count[tid];
    let mut x = lo;
    while x < hi {
        let value = f32::cast_from(z[base + x]);
        let key = entry_key(value, excluded, x, masked);
        if key > prefix {
            ids[out + usize::cast_from(at_above)] = i32::cast_from(x);
            values[out + usize::cast_from(at_above)] = value;
            at_above += 1u32;
        } else if key == prefix {
            if at_equal < remaining {
                let at = usize::cast_from(first_tie + at_equal);
                ids[out + at] = i32::cast_from(x);
                values[out + at] = value;
            }
            at_equal += 1u32;
        }
        x += 1;
    }
}

/// Per row with an observed next token `y` (one cube each), on the untempered distribution:
/// `stats[3i..3i+3] = (log p[y], Σ p log p, max p)`.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn confidence_rows<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    rows: &Array<i32>,
    targets: &Array<i32>,
    stats: &mut Array<f32>,
    count: usize,
    v: usize,
    #[comptime] block: usize,
    #[define(F)] _dtype: StorageType,
) {
    let i = CUBE_POS;
    if i >= count {
        terminate!();
    }
    let row = usize::cast_from(rows[i]);
    let l = lse[row];
    let mut plogp = 0.0f32;
    let mut best = f32::new(f32::MIN);
    let mut c = UNIT_POS as usize;
    while c < v {
        let x = f32::cast_from(z[row * v + c]) - l;
        let p = x.exp();
        if p > 0.0f32 {
            plogp += p * x;
        }
        if x > best {
            best = x;
        }
        c += block;
    }
    let total = block_sum(plogp, block);
    let mut shared = SharedMemory::<f32>::new(block);
    shared[UNIT_POS as usize] = best;
    sync_cube();
    let mut stride = (CUBE_DIM / 2) as usize;
    while stride > 0 {
        let tid = UNIT_POS as usize;
        if tid < stride && shared[tid + stride] > shared[tid] {
            shared[tid] = shared[tid + stride];
        }
        sync_cube();
        stride /= 2;
    }
    if UNIT_POS == 0 {
        let y = usize::cast_from(targets[i]);
        stats[3 * i] = f32::cast_from(z[row * v + y]) - l;
        stats[3 * i + 1] = total;
        stats[3 * i + 2] = shared[0].exp();
    }
}

/// Per row with an observed next token `y` (one cube each): `out[2i] = z[y]·t − lse[row]`, the
/// token's tempered log-probability as the host computes it, and `out[2i + 1]` its rank, 1 + how
/// many logits of the row are larger (counted in f32: exact for any vocabulary below 2²⁴).
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn observed_rows<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    rows: &Array<i32>,
    targets: &Array<i32>,
    out: &mut Array<f32>,
    count: usize,
    v: usize,
    t: f32,
    #[comptime] block: usize,
    #[define(F)] _dtype: StorageType,
) {
    let i = CUBE_POS;
    if i >= count {
        terminate!();
    }
    let row = usize::cast_from(rows[i]);
    let zy = f32::cast_from(z[row * v + usize::cast_from(targets[i])]);
    let mut larger = 0.0f32;
    let mut c = UNIT_POS as usize;
    while c < v {
        if f32::cast_from(z[row * v + c]) > zy {
            larger += 1.0f32;
        }
        c += block;
    }
    let total = block_sum(larger, block);
    if UNIT_POS == 0 {
        out[2 * i] = zy * t - lse[row];
        out[2 * i + 1] = total + 1.0f32;
    }
}

/// Packs the probabilities of a slot's teacher entries without a student partner into
/// `rest[out..]`, in entry order, and returns how many: per run of `block` entries, a flag per
/// unit and an inclusive scan of the flags in shared memory give each its place.
#[cube]
fn pack_rest(
    teacher_ids: &Array<i32>,
    teacher_logp: &Array<f32>,
    teacher_first: &Array<i32>,
    rest: &mut Array<f32>,
    out: usize,
    k: usize,
    #[comptime] block: usize,
) -> usize {
    let tid = UNIT_POS as usize;
    let mut scan = SharedMemory::<u32>::new(block);
    let mut found = 0usize;
    let mut base = 0usize;
    while base < k {
        let j = base + tid;
        let mut flag = 0u32;
        let mut q = 0.0f32;
        if j < k {
            let id = usize::cast_from(teacher_ids[out + j]);
            if teacher_first[id] == teacher_first[id + 1] {
                flag = 1u32;
                let lq = teacher_logp[out + j];
                if lq > f32::MIN {
                    q = lq.exp();
                }
            }
        }
        scan[tid] = flag;
        sync_cube();
        let mut offset = 1usize;
        while offset < block {
            let mut add = 0u32;
            if tid >= offset {
                add = scan[tid - offset];
            }
            sync_cube();
            scan[tid] += add;
            sync_cube();
            offset *= 2;
        }
        if flag == 1u32 {
            rest[out + found + usize::cast_from(scan[tid]) - 1] = q;
        }
        found += usize::cast_from(scan[block - 1]);
        sync_cube();
        base += block;
    }
    found
}

/// GOLD / H-KL / ULD of one compared slot per cube. The common KL runs over the pairs of C whose
/// teacher token is a kept entry (a teacher token may have several student partners); the
/// sorted L1 pairs the teacher's remaining entries (already
/// in descending order, as the entries are best first) with the student's largest uncommon
/// probabilities, selected beforehand by `top_k` with the common ids masked; the uncommon ids'
/// whole mass comes from the row's pass (`uncommon_mass`, per row), so the kernel reads no full
/// row. Writes the loss, `Σh`, and per selected entry the correction `a (d − 1)` of its gradient
/// term (`d` the sign of `a − b`; the dense kernel assumes `d = 1` for every uncommon id).
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn hybrid_slots<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    teacher_ids: &Array<i32>,
    teacher_logp: &Array<f32>,
    teacher_first: &Array<i32>,
    teacher_students: &Array<i32>,
    uncommon_mass: &Array<f32>,
    selected_logp: &Array<f32>,
    rest: &mut Array<f32>,
    corrections: &mut Array<f32>,
    loss: &mut Array<f32>,
    dsigma: &mut Array<f32>,
    valid: usize,
    k: usize,
    selected: usize,
    uncommon: usize,
    v: usize,
    t: f32,
    lambda_kl: f32,
    lambda_uld: f32,
    #[comptime] block: usize,
    #[define(F)] _dtype: StorageType,
) {
    let i = CUBE_POS;
    if i >= valid {
        terminate!();
    }
    let tid = UNIT_POS as usize;
    let slot = usize::cast_from(valid_slot[i]);
    let row = usize::cast_from(valid_row[i]);
    let shift = sigma[slot] - lse[row];

    let mut kl = 0.0f32;
    let mut common_q = 0.0f32;
    let mut j = tid;
    while j < k {
        let lq = teacher_logp[slot * k + j];
        let id = usize::cast_from(teacher_ids[slot * k + j]);
        let mut p = usize::cast_from(teacher_first[id]);
        let end = usize::cast_from(teacher_first[id + 1]);
        if p < end && lq > f32::MIN {
            let q = lq.exp();
            // As on the host, an entry whose probability underflows to 0 contributes nothing
            // (not 0 · ∞ where the student's logit is −∞).
            if q > 0.0f32 {
                // One term per pair: an entry shared by several student tokens counts for each.
                while p < end {
                    let partner = usize::cast_from(teacher_students[p]);
                    let ls = f32::cast_from(z[row * v + partner]) * t + shift;
                    kl += q * (lq - ls);
                    common_q += q;
                    p += 1;
                }
            }
        }
        j += block;
    }
    let kl_total = block_sum(kl, block);
    let common_total = block_sum(common_q, block);
    // The uncommon ids' merged mass, `e^σ Σ_uncommon p`, from the row's pass (`row_lse`).
    let mass_total = sigma[slot].exp() * uncommon_mass[row];
    let found = pack_rest(
        teacher_ids,
        teacher_logp,
        teacher_first,
        rest,
        slot * k,
        k,
        block,
    );
    sync_storage();
    sync_cube();
    let mut paired = found;
    if uncommon < paired {
        paired = uncommon;
    }
    let mut l1 = 0.0f32;
    let mut signed = 0.0f32;
    let mut selected_mass = 0.0f32;
    let mut r = tid;
    while r < selected {
        let mut correction = 0.0f32;
        if r < paired {
            let a = selected_logp[slot * selected + r].exp();
            let b = rest[slot * k + r];
            let mut d = 0.0f32;
            if a > b {
                d = 1.0f32;
                l1 += a - b;
            } else if a < b {
                d = -1.0f32;
                l1 += b - a;
            }
            signed += a * d;
            selected_mass += a;
            correction = a * (d - 1.0f32);
        }
        corrections[slot * selected + r] = correction;
        r += block;
    }
    let mut r = paired + tid;
    while r < found {
        l1 += rest[slot * k + r];
        r += block;
    }
    let l1_total = block_sum(l1, block);
    let signed_total = block_sum(signed, block);
    let selected_total = block_sum(selected_mass, block);
    if tid == 0 {
        // The uncommon probabilities not paired with a teacher entry count whole (d = 1).
        let unpaired = mass_total - selected_total;
        loss[i] = lambda_kl * kl_total + lambda_uld * (l1_total + unpaired);
        dsigma[slot] = lambda_uld * (signed_total + unpaired) - lambda_kl * common_total;
    }
}

/// The hybrid objectives' sparse gradient terms on the predicting rows: `−c λ_KL q` at each
/// student partner of a kept teacher entry, and `c λ_ULD a (d − 1)` at each paired uncommon id.
/// A student id has at most one partner, so the partners of distinct entries are distinct;
/// selected ids are distinct and never common: no two units write one element.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn hybrid_grad_sparse<F: Float>(
    grad: &mut Array<F>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    teacher_ids: &Array<i32>,
    teacher_logp: &Array<f32>,
    teacher_first: &Array<i32>,
    teacher_students: &Array<i32>,
    selected_ids: &Array<i32>,
    corrections: &Array<f32>,
    valid: usize,
    k: usize,
    selected: usize,
    v: usize,
    c: f32,
    lambda_kl: f32,
    lambda_uld: f32,
    #[define(F)] _dtype: StorageType,
) {
    let per = k + selected;
    if ABSOLUTE_POS >= valid * per {
        terminate!();
    }
    let i = ABSOLUTE_POS / per;
    let j = ABSOLUTE_POS % per;
    let slot = usize::cast_from(valid_slot[i]);
    let row = usize::cast_from(valid_row[i]);
    if j < k {
        let lq = teacher_logp[slot * k + j];
        let id = usize::cast_from(teacher_ids[slot * k + j]);
        let mut p = usize::cast_from(teacher_first[id]);
        let end = usize::cast_from(teacher_first[id + 1]);
        if lq > f32::MIN {
            let step = c * lambda_kl * lq.exp();
            while p < end {
                let at = row * v + usize::cast_from(teacher_students[p]);
                grad[at] = F::cast_from(f32::cast_from(grad[at]) - step);
                p += 1;
            }
        }
    } else {
        let r = j - k;
        let correction = corrections[slot * selected + r];
        if correction != 0.0f32 {
            let at = row * v + usize::cast_from(selected_ids[slot * selected + r]);
            grad[at] = F::cast_from(f32::cast_from(grad[at]) + c * lambda_uld * correction);
        }
    }
}
