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
/// holds NaN or +∞ or only −∞ (then `lse` is meaningless). One cube per row; each unit keeps an
/// online (max, sum), merged by a tree in shared memory, so the row is read once.
///
/// No infinity or NaN constants appear: WGSL has no literal for them, and a kernel that fails
/// to compile on the device would leave its outputs untouched. `f32::MIN` stands for "no value
/// yet"; a finite logit is always above it.
// The negated comparisons are the NaN tests (a kernel has no `partial_cmp`).
#[allow(clippy::neg_cmp_op_on_partial_ord)]
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn row_lse<F: Float>(
    z: &Array<F>,
    lse: &mut Array<f32>,
    bad: &mut Array<u32>,
    rows: usize,
    v: usize,
    t: f32,
    #[comptime] block: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let tid = UNIT_POS as usize;
    let mut m = f32::new(f32::MIN);
    let mut s = 0.0f32;
    let mut flag = 0u32;
    let mut c = tid;
    while c < v {
        let x = f32::cast_from(z[row * v + c]) * t;
        // `!(x < MAX)` catches NaN and +∞ alike.
        if !(x < f32::MAX) {
            flag = 1u32;
        } else if x > m {
            s = s * (m - x).exp() + 1.0f32;
            m = x;
        } else if x > f32::MIN {
            s += (x - m).exp();
        }
        c += block;
    }
    let mut max_shared = SharedMemory::<f32>::new(block);
    let mut sum_shared = SharedMemory::<f32>::new(block);
    let mut bad_shared = SharedMemory::<u32>::new(block);
    max_shared[tid] = m;
    sum_shared[tid] = s;
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
            max_shared[tid] = mm;
            sum_shared[tid] = s1 * (m1 - mm).exp() + s2 * (m2 - mm).exp();
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

/// Per compared slot of a chunk (one cube each): the student mass that W maps,
/// `ρ = Σ_s r_s p[row, s]`, the denominator of P-KL's re-normalization.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn pkl_mass<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    valid_row: &Array<i32>,
    row_mass: &Array<f32>,
    mass: &mut Array<f32>,
    first: usize,
    count: usize,
    v: usize,
    t: f32,
    #[comptime] block: usize,
    #[define(F)] _dtype: StorageType,
) {
    let local = CUBE_POS;
    if local >= count {
        terminate!();
    }
    let row = usize::cast_from(valid_row[first + local]);
    let base = lse[row];
    let mut acc = 0.0f32;
    let mut s = UNIT_POS as usize;
    while s < v {
        acc += row_mass[s] * (f32::cast_from(z[row * v + s]) * t - base).exp();
        s += block;
    }
    let total = block_sum(acc, block);
    if UNIT_POS == 0 {
        mass[local] = total;
    }
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
        let rho = mass[local];
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
/// `projected`, `h_s = p_s (e^σ / ρ · Σ_k w[s, k] · g[idx[s, k]] + Σh (1 − r_s / ρ))` gathers
/// the chunk's scattered `g` (P-KL's backward through W and its re-normalization, in W's own
/// row layout; 0 when `ρ = 0`); with `hybrid`, `h_s = λ_ULD e^σ p_s` on
/// the uncommon ids (`indices` is then the student's partner table); otherwise `h` is zero here.
/// KL and the hybrid objectives add their sparse parts afterwards.
// The comptime tests stay apart from the runtime ones they guard.
#[allow(clippy::collapsible_if)]
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn predicting_grad<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    dsigma: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    indices: &Array<i32>,
    weights: &Array<f32>,
    scattered: &Array<f32>,
    mass: &Array<f32>,
    grad: &mut Array<F>,
    first: usize,
    count: usize,
    kw: usize,
    v: usize,
    vt: usize,
    t: f32,
    c: f32,
    lambda: f32,
    #[comptime] projected: bool,
    #[comptime] hybrid: bool,
    #[define(F)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= count * v {
        terminate!();
    }
    let local = ABSOLUTE_POS / v;
    let s = ABSOLUTE_POS % v;
    let slot = usize::cast_from(valid_slot[first + local]);
    let row = usize::cast_from(valid_row[first + local]);
    let at = row * v + s;
    let p = (f32::cast_from(z[at]) * t - lse[row]).exp();
    let mut h = 0.0f32;
    if comptime![projected] {
        let rho = mass[local];
        if rho > 0.0f32 {
            let mut acc = 0.0f32;
            let mut r = 0.0f32;
            for kk in 0..kw {
                let id = indices[s * kw + kk];
                if id >= 0i32 {
                    let w = weights[s * kw + kk];
                    acc += w * scattered[local * vt + usize::cast_from(id)];
                    r += w;
                }
            }
            h = p * (sigma[slot].exp() / rho * acc + dsigma[slot] * (1.0f32 - r / rho));
        }
    }
    if comptime![hybrid] {
        // `indices` is the student's partner table: uncommon ids get `λ_ULD · a` (d = 1).
        if indices[s] < 0i32 {
            h = lambda * sigma[slot].exp() * p;
        }
    }
    grad[at] = F::cast_from(c * (h - p * dsigma[slot]));
}

/// P-KL's gradient to W's values, one unit per student id `s` (its `kw` entries), summing the
/// chunk's slots in order: `gw[s, k] += scale Σ_i p_i[s] / ρ_i (e^σ_i g_i[idx[s, k]] − Σh_i)`;
/// the second term is the re-normalization's, through `ρ_i`, on every occupied entry.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn pkl_grad_weights<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    dsigma: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    indices: &Array<i32>,
    scattered: &Array<f32>,
    mass: &Array<f32>,
    grad_weights: &mut Array<f32>,
    first: usize,
    count: usize,
    kw: usize,
    v: usize,
    vt: usize,
    t: f32,
    scale: f32,
    #[define(F)] _dtype: StorageType,
) {
    let s = ABSOLUTE_POS;
    if s >= v {
        terminate!();
    }
    // The unit owns its row's entries: read-modify-write without races, `p` once per slot.
    for local in 0..count {
        let rho = mass[local];
        if rho > 0.0f32 {
            let slot = usize::cast_from(valid_slot[first + local]);
            let row = usize::cast_from(valid_row[first + local]);
            let weight = scale * (f32::cast_from(z[row * v + s]) * t - lse[row]).exp() / rho;
            let es = sigma[slot].exp();
            for kk in 0..kw {
                let id = indices[s * kw + kk];
                if id >= 0i32 {
                    let g = scattered[local * vt + usize::cast_from(id)];
                    grad_weights[s * kw + kk] += weight * (es * g - dsigma[slot]);
                }
            }
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

/// The top-K of one compared slot per cube, best first (larger logit, then smaller id, as the
/// host orders them), with merged log-probabilities `z·t − lse + σ`: the teacher's kept entries,
/// or (with `masked`) the student's largest probabilities outside the common set.
///
/// 1. Radix select, 8 passes of 4 bits from the top of the order key: per-unit histograms in
///    shared memory (no atomics), summed per bin, give the K-th largest key and how many
///    entries equal to it are kept (the smallest ids among ties).
/// 2. Compaction in id order: each unit owns a contiguous segment; a scan of the per-unit
///    counts gives every kept entry its place.
/// 3. A bitonic sort of the K entries in place (compare-exchanges between `sync_storage`
///    barriers; `n2` is K rounded up to a power of two).
// Kernels have no `usize::div_ceil`.
#[allow(clippy::manual_div_ceil)]
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn top_k<F: Float>(
    z: &Array<F>,
    lse: &Array<f32>,
    sigma: &Array<f32>,
    valid_slot: &Array<i32>,
    valid_row: &Array<i32>,
    excluded: &Array<i32>,
    ids: &mut Array<i32>,
    values: &mut Array<f32>,
    valid: usize,
    v: usize,
    k: usize,
    n2: usize,
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
    let segment = (v + block - 1) / block;
    let mut lo = tid * segment;
    if lo > v {
        lo = v;
    }
    let mut hi = lo + segment;
    if hi > v {
        hi = v;
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
    sync_storage();
    sync_cube();

    let pairs = n2 / 2;
    let mut size = 2usize;
    while size <= n2 {
        let half = size / 2;
        let mut p = tid;
        while p < pairs {
            let start = (p / half) * size;
            let offset = p % half;
            keep_better_first(
                ids,
                values,
                out,
                start + offset,
                start + size - 1 - offset,
                k,
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
                keep_better_first(ids, values, out, a, a + d, k);
                p += block;
            }
            sync_storage();
            sync_cube();
            d /= 2;
        }
        size *= 2;
    }

    let shift = sigma[slot] - lse[row];
    let mut j = tid;
    while j < k {
        values[out + j] = values[out + j] * t + shift;
        j += block;
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

/// GOLD / H-KL / ULD of one compared slot per cube. The common KL runs over the pairs of C whose
/// teacher token is a kept entry (a teacher token may have several student partners); the
/// sorted L1 pairs the teacher's remaining entries (already
/// in descending order, as the entries are best first) with the student's largest uncommon
/// probabilities, selected beforehand by `top_k` with the common ids masked. Writes the loss,
/// `Σh`, and per selected entry the correction `a (d − 1)` of its gradient term (`d` the sign of
/// `a − b`; the dense kernel assumes `d = 1` for every uncommon id).
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
    student_partner: &Array<i32>,
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
    let mut mass = 0.0f32;
    let mut s = tid;
    while s < v {
        if student_partner[s] < 0i32 {
            mass += (f32::cast_from(z[row * v + s]) * t + shift).exp();
        }
        s += block;
    }
    let kl_total = block_sum(kl, block);
    let common_total = block_sum(common_q, block);
    let mass_total = block_sum(mass, block);

    let mut count = SharedMemory::<u32>::new(1usize);
    if tid == 0 {
        let mut found = 0u32;
        for jj in 0..k {
            let id = usize::cast_from(teacher_ids[slot * k + jj]);
            if teacher_first[id] == teacher_first[id + 1] {
                let lq = teacher_logp[slot * k + jj];
                let mut q = 0.0f32;
                if lq > f32::MIN {
                    q = lq.exp();
                }
                rest[slot * k + usize::cast_from(found)] = q;
                found += 1u32;
            }
        }
        count[0usize] = found;
    }
    sync_storage();
    sync_cube();
    let found = usize::cast_from(count[0usize]);
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
