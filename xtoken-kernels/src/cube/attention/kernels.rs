//! The attention kernels. A cube is [`ROWS`] rows × [`LANES`] lanes (256 units): the forward and
//! `∂q` take a block of `ROWS` query rows and walk the keys a tile of `LANES` at a time; `∂k`,
//! `∂v` take a block of `ROWS` keys and walk the query rows of every query head of its KV
//! group. Unit `(y, x)` computes the score of row `y` with column `x` of the tile; the row's
//! sums over the tile read the other lanes' values from shared memory, and each unit then
//! accumulates the head-dimension elements `x, x + LANES, …` of its row in registers. Inputs
//! are read in their own float type and held in shared memory as f32; everything accumulates
//! in f32. Tiles in shared memory have rows of `head_dim + 1` floats, so that the 32 lanes
//! reading 32 rows at one column hit 32 different banks.
//!
//! Cube `c` takes block `c % blocks` of head `c / blocks` (`blocks` row blocks per head, and
//! `cubes` in all, from the host); the mask comes as scalars ([`Mask`]).
//!
//! No infinity appears (WGSL has no literal for it): `f32::MIN` marks a score no key gave and
//! is a row's log-sum-exp when it sees no key. No atomics: every output element has one writer.

use cubecl::prelude::*;

/// Rows (query rows, or keys in the `∂k`/`∂v` kernel) per cube.
pub const ROWS: usize = 8;
/// Columns of a tile (keys, or query rows in the `∂k`/`∂v` kernel) per cube.
pub const LANES: usize = 32;

/// The mask, as kernel scalars: queries are the last `queries` of `keys` positions.
#[derive(CubeType, Clone, Copy)]
pub struct Mask {
    /// `keys − queries`: the position of query row 0.
    pub offset: usize,
    pub queries: usize,
    pub keys: usize,
    /// 1 when a query sees no later key.
    pub causal: u32,
    /// The sliding window in keys, 0 for none.
    pub window: usize,
    /// 1 when `padding` (`[batch · keys]`, nonzero where a key is padding) applies.
    pub padded: u32,
}

/// The mask of a launch, from its scalars.
#[cube]
fn mask_of(queries: usize, keys: usize, causal: u32, window: usize, padded: u32) -> Mask {
    Mask {
        offset: keys - queries,
        queries,
        keys,
        causal,
        window,
        padded,
    }
}

/// The first key query row `i` may see.
#[cube]
fn first_key(mask: &Mask, i: usize) -> usize {
    let position = mask.offset + i;
    let mut lo = 0usize;
    if mask.window > 0 && position + 1 > mask.window {
        lo = position + 1 - mask.window;
    }
    lo
}

/// One past the last key query row `i` may see.
#[cube]
fn end_key(mask: &Mask, i: usize) -> usize {
    let mut hi = mask.keys;
    if mask.causal != 0 {
        hi = mask.offset + i + 1;
    }
    hi
}

/// The first query row that may see key `j`.
#[cube]
fn first_query(mask: &Mask, j: usize) -> usize {
    let mut lo = 0usize;
    if mask.causal != 0 && j > mask.offset {
        lo = j - mask.offset;
    }
    lo
}

/// One past the last query row that may see key `j`.
#[cube]
fn end_query(mask: &Mask, j: usize) -> usize {
    let mut hi = mask.queries;
    if mask.window > 0 {
        hi = 0usize;
        if j + mask.window > mask.offset {
            hi = j + mask.window - mask.offset;
        }
        if hi > mask.queries {
            hi = mask.queries;
        }
    }
    hi
}

/// The last row of the block starting at `first`, of `len` rows in all.
#[cube]
fn last_of(first: usize, len: usize) -> usize {
    let mut end = first + ROWS;
    if end > len {
        end = len;
    }
    end - 1
}

/// Whether query row `i` of sequence `b` sees key `j` (both in range or not).
#[cube]
fn sees(mask: &Mask, padding: &Array<i32>, b: usize, i: usize, j: usize) -> bool {
    let mut seen = false;
    if i < mask.queries && j < mask.keys {
        seen = j >= first_key(mask, i) && j < end_key(mask, i);
        if mask.padded != 0 && padding[b * mask.keys + j] != 0 {
            seen = false;
        }
    }
    seen
}

/// A scaled score soft-capped to `c · tanh(s / c)` where `softcap` (`c`) is positive.
#[cube]
fn capped(s: f32, softcap: f32) -> f32 {
    let mut out = s;
    if softcap > 0.0f32 {
        out = softcap * (s / softcap).tanh();
    }
    out
}

/// The cap's derivative at a capped score: `1 − (score / c)²`, or 1 without a cap.
#[cube]
fn cap_slope(score: f32, softcap: f32) -> f32 {
    let mut slope = 1.0f32;
    if softcap > 0.0f32 {
        let t = score / softcap;
        slope = 1.0f32 - t * t;
    }
    slope
}

/// Rows `first..first + count` of a `[rows, head_dim]` block at `base` of `src`, times `scale`,
/// into `dst` with rows of `stride` floats; rows at or past `avail` are zeros.
#[cube]
fn load_rows<F: Float>(
    src: &Array<F>,
    dst: &mut SharedMemory<f32>,
    base: usize,
    first: usize,
    avail: usize,
    scale: f32,
    #[comptime] count: usize,
    #[comptime] head_dim: usize,
    #[comptime] stride: usize,
) {
    let n = comptime!(count * head_dim);
    let mut e = UNIT_POS as usize;
    while e < n {
        let r = e / head_dim;
        let d = e % head_dim;
        let mut x = 0.0f32;
        if first + r < avail {
            x = f32::cast_from(src[base + (first + r) * head_dim + d]) * scale;
        }
        dst[r * stride + d] = x;
        e += comptime!(ROWS * LANES);
    }
}

/// `Σ_d a[a0 + d] · b[b0 + d]` over `n` elements of shared memory.
#[cube]
fn dot(
    a: &SharedMemory<f32>,
    a0: usize,
    b: &SharedMemory<f32>,
    b0: usize,
    #[comptime] n: usize,
) -> f32 {
    let mut acc = 0.0f32;
    for d in 0..n {
        acc += a[a0 + d] * b[b0 + d];
    }
    acc
}

/// `acc[c] = acc[c] · keep + Σ_t weights[row, t] · tile[t, x + c · LANES]` over the tile's
/// `LANES` columns: one row's weighted sum of a tile's rows, for the head-dim elements unit
/// `x` owns.
#[cube]
fn accumulate(
    acc: &mut Array<f32>,
    keep: f32,
    weights: &SharedMemory<f32>,
    row: usize,
    tile: &SharedMemory<f32>,
    x: usize,
    #[comptime] head_dim: usize,
) {
    #[unroll]
    for c in 0..comptime!(head_dim.div_ceil(LANES)) {
        let d = x + c * LANES;
        if d < head_dim {
            let mut a = acc[c] * keep;
            for t in 0..LANES {
                a += weights[row * LANES + t] * tile[t * comptime!(head_dim + 1) + d];
            }
            acc[c] = a;
        }
    }
}

/// An accumulator of the head-dim elements a unit owns, zeroed.
#[cube]
fn zeroed(#[comptime] head_dim: usize) -> Array<f32> {
    let mut acc = Array::<f32>::new(comptime!(head_dim.div_ceil(LANES)));
    #[unroll]
    for c in 0..comptime!(head_dim.div_ceil(LANES)) {
        acc[c] = 0.0f32;
    }
    acc
}

/// Writes `acc · scale` to row `row` of `out` (`[rows, head_dim]`), the elements unit `x` owns.
#[cube]
fn store<F: Float>(
    out: &mut Array<F>,
    row: usize,
    acc: &Array<f32>,
    scale: f32,
    x: usize,
    #[comptime] head_dim: usize,
) {
    #[unroll]
    for c in 0..comptime!(head_dim.div_ceil(LANES)) {
        let d = x + c * LANES;
        if d < head_dim {
            out[row * head_dim + d] = F::cast_from(acc[c] * scale);
        }
    }
}

/// The forward: per query row, the online softmax over its visible keys (running max `m` and
/// sum `l`, rescaled per tile) and the weighted sum of their values; `lse = m + ln l`.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn attention_forward<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    padding: &Array<i32>,
    out: &mut Array<F>,
    lse: &mut Array<f32>,
    queries: usize,
    keys: usize,
    causal: u32,
    window: usize,
    padded: u32,
    heads: usize,
    group: usize,
    scale: f32,
    softcap: f32,
    cubes: usize,
    blocks: usize,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: StorageType,
) {
    if CUBE_POS >= cubes {
        terminate!();
    }
    let mask = mask_of(queries, keys, causal, window, padded);
    let bh = CUBE_POS / blocks;
    let i0 = (CUBE_POS % blocks) * ROWS;
    let b = bh / heads;
    let kv_base = (b * (heads / group) + (bh % heads) / group) * mask.keys * head_dim;
    let tid = UNIT_POS as usize;
    let x = tid % LANES;
    let y = tid / LANES;
    let i = i0 + y;
    let mut qs = SharedMemory::<f32>::new(comptime!(ROWS * head_dim));
    let mut tile = SharedMemory::<f32>::new(comptime!(LANES * (head_dim + 1)));
    let mut scores = SharedMemory::<f32>::new(comptime!(ROWS * LANES));
    let mut probs = SharedMemory::<f32>::new(comptime!(ROWS * LANES));
    let q_base = bh * mask.queries * head_dim;
    load_rows::<F>(
        q,
        &mut qs,
        q_base,
        i0,
        mask.queries,
        scale,
        ROWS,
        head_dim,
        head_dim,
    );
    let last = last_of(i0, mask.queries);
    let hi = end_key(&mask, last);
    let mut m = f32::new(f32::MIN);
    let mut l = 0.0f32;
    let mut acc = zeroed(head_dim);
    let mut kt = first_key(&mask, i0);
    while kt < hi {
        sync_cube();
        load_rows::<F>(
            k,
            &mut tile,
            kv_base,
            kt,
            mask.keys,
            1.0f32,
            LANES,
            head_dim,
            comptime!(head_dim + 1),
        );
        sync_cube();
        let seen = sees(&mask, padding, b, i, kt + x);
        let mut s = f32::new(f32::MIN);
        if seen {
            s = capped(
                dot(
                    &qs,
                    y * head_dim,
                    &tile,
                    x * comptime!(head_dim + 1),
                    head_dim,
                ),
                softcap,
            );
        }
        scores[tid] = s;
        sync_cube();
        let mut m_new = m;
        for t in 0..LANES {
            let other = scores[y * LANES + t];
            if other > m_new {
                m_new = other;
            }
        }
        let mut p = 0.0f32;
        if seen {
            p = (s - m_new).exp();
        }
        probs[tid] = p;
        sync_cube();
        let mut tile_sum = 0.0f32;
        for t in 0..LANES {
            tile_sum += probs[y * LANES + t];
        }
        let keep = (m - m_new).exp();
        l = l * keep + tile_sum;
        m = m_new;
        load_rows::<F>(
            v,
            &mut tile,
            kv_base,
            kt,
            mask.keys,
            1.0f32,
            LANES,
            head_dim,
            comptime!(head_dim + 1),
        );
        sync_cube();
        accumulate(&mut acc, keep, &probs, y, &tile, x, head_dim);
        kt += LANES;
    }
    if i < mask.queries {
        let row = bh * mask.queries + i;
        let mut inv = 0.0f32;
        let mut row_lse = f32::new(f32::MIN);
        if l > 0.0f32 {
            inv = 1.0f32 / l;
            row_lse = m + l.ln();
        }
        store::<F>(out, row, &acc, inv, x, head_dim);
        if x == 0 {
            lse[row] = row_lse;
        }
    }
}

/// The backward's row term: `delta[r] = Σ_d dO[r, d] · O[r, d]`, one unit per row.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn attention_delta<F: Float>(
    grad_out: &Array<F>,
    out: &Array<F>,
    delta: &mut Array<f32>,
    rows: usize,
    head_dim: usize,
    #[define(F)] _dtype: StorageType,
) {
    let r = ABSOLUTE_POS;
    if r >= rows {
        terminate!();
    }
    let mut acc = 0.0f32;
    for d in 0..head_dim {
        acc += f32::cast_from(grad_out[r * head_dim + d]) * f32::cast_from(out[r * head_dim + d]);
    }
    delta[r] = acc;
}

/// `∂q` per block of query rows: `∂q_i = scale · Σ_j p_ij (dO_i · v_j − delta_i) k_j`, with
/// `p_ij = exp(scale · q_i · k_j − lse_i)` recomputed tile by tile.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn attention_grad_q<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    grad_out: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    padding: &Array<i32>,
    grad_q: &mut Array<F>,
    queries: usize,
    keys: usize,
    causal: u32,
    window: usize,
    padded: u32,
    heads: usize,
    group: usize,
    scale: f32,
    softcap: f32,
    cubes: usize,
    blocks: usize,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: StorageType,
) {
    if CUBE_POS >= cubes {
        terminate!();
    }
    let mask = mask_of(queries, keys, causal, window, padded);
    let bh = CUBE_POS / blocks;
    let i0 = (CUBE_POS % blocks) * ROWS;
    let b = bh / heads;
    let kv_base = (b * (heads / group) + (bh % heads) / group) * mask.keys * head_dim;
    let tid = UNIT_POS as usize;
    let x = tid % LANES;
    let y = tid / LANES;
    let i = i0 + y;
    let mut qs = SharedMemory::<f32>::new(comptime!(ROWS * head_dim));
    let mut gs = SharedMemory::<f32>::new(comptime!(ROWS * head_dim));
    let mut tile = SharedMemory::<f32>::new(comptime!(LANES * (head_dim + 1)));
    let mut dss = SharedMemory::<f32>::new(comptime!(ROWS * LANES));
    let q_base = bh * mask.queries * head_dim;
    load_rows::<F>(
        q,
        &mut qs,
        q_base,
        i0,
        mask.queries,
        scale,
        ROWS,
        head_dim,
        head_dim,
    );
    load_rows::<F>(
        grad_out,
        &mut gs,
        q_base,
        i0,
        mask.queries,
        1.0f32,
        ROWS,
        head_dim,
        head_dim,
    );
    let mut row_lse = 0.0f32;
    let mut row_delta = 0.0f32;
    if i < mask.queries {
        row_lse = lse[bh * mask.queries + i];
        row_delta = delta[bh * mask.queries + i];
    }
    let last = last_of(i0, mask.queries);
    let hi = end_key(&mask, last);
    let mut acc = zeroed(head_dim);
    let mut kt = first_key(&mask, i0);
    while kt < hi {
        let seen = sees(&mask, padding, b, i, kt + x);
        sync_cube();
        load_rows::<F>(
            v,
            &mut tile,
            kv_base,
            kt,
            mask.keys,
            1.0f32,
            LANES,
            head_dim,
            comptime!(head_dim + 1),
        );
        sync_cube();
        let mut dp = 0.0f32;
        if seen {
            dp = dot(
                &gs,
                y * head_dim,
                &tile,
                x * comptime!(head_dim + 1),
                head_dim,
            );
        }
        sync_cube();
        load_rows::<F>(
            k,
            &mut tile,
            kv_base,
            kt,
            mask.keys,
            1.0f32,
            LANES,
            head_dim,
            comptime!(head_dim + 1),
        );
        sync_cube();
        let mut ds = 0.0f32;
        if seen {
            let s = capped(
                dot(
                    &qs,
                    y * head_dim,
                    &tile,
                    x * comptime!(head_dim + 1),
                    head_dim,
                ),
                softcap,
            );
            ds = (s - row_lse).exp() * (dp - row_delta) * cap_slope(s, softcap);
        }
        dss[tid] = ds;
        sync_cube();
        accumulate(&mut acc, 1.0f32, &dss, y, &tile, x, head_dim);
        kt += LANES;
    }
    if i < mask.queries {
        store::<F>(grad_q, bh * mask.queries + i, &acc, scale, x, head_dim);
    }
}

/// `∂k`, `∂v` per block of keys of one KV head, over the query rows of every query head it
/// serves: `∂v_j = Σ_i p_ij dO_i`, `∂k_j = scale · Σ_i p_ij (dO_i · v_j − delta_i) q_i`.
#[cube(launch_unchecked, address_type = "dynamic")]
pub fn attention_grad_kv<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    grad_out: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    padding: &Array<i32>,
    grad_k: &mut Array<F>,
    grad_v: &mut Array<F>,
    queries: usize,
    keys: usize,
    causal: u32,
    window: usize,
    padded: u32,
    heads: usize,
    group: usize,
    scale: f32,
    softcap: f32,
    cubes: usize,
    blocks: usize,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: StorageType,
) {
    if CUBE_POS >= cubes {
        terminate!();
    }
    let mask = mask_of(queries, keys, causal, window, padded);
    let kv = CUBE_POS / blocks;
    let j0 = (CUBE_POS % blocks) * ROWS;
    let kv_heads = heads / group;
    let b = kv / kv_heads;
    let tid = UNIT_POS as usize;
    let x = tid % LANES;
    let y = tid / LANES;
    let j = j0 + y;
    let mut ks = SharedMemory::<f32>::new(comptime!(ROWS * head_dim));
    let mut vs = SharedMemory::<f32>::new(comptime!(ROWS * head_dim));
    let mut tile = SharedMemory::<f32>::new(comptime!(LANES * (head_dim + 1)));
    let mut ps = SharedMemory::<f32>::new(comptime!(ROWS * LANES));
    let mut dss = SharedMemory::<f32>::new(comptime!(ROWS * LANES));
    let kv_base = kv * mask.keys * head_dim;
    load_rows::<F>(
        k, &mut ks, kv_base, j0, mask.keys, scale, ROWS, head_dim, head_dim,
    );
    load_rows::<F>(
        v, &mut vs, kv_base, j0, mask.keys, 1.0f32, ROWS, head_dim, head_dim,
    );
    let last = last_of(j0, mask.keys);
    let lo = first_query(&mask, j0);
    let hi = end_query(&mask, last);
    let mut dk = zeroed(head_dim);
    let mut dv = zeroed(head_dim);
    let first_head = (kv % kv_heads) * group;
    for h in first_head..first_head + group {
        let bh = b * heads + h;
        let q_base = bh * mask.queries * head_dim;
        let mut it = lo;
        while it < hi {
            let i = it + x;
            let seen = sees(&mask, padding, b, i, j);
            let mut row_lse = 0.0f32;
            let mut row_delta = 0.0f32;
            if seen {
                row_lse = lse[bh * mask.queries + i];
                row_delta = delta[bh * mask.queries + i];
            }
            sync_cube();
            load_rows::<F>(
                q,
                &mut tile,
                q_base,
                it,
                mask.queries,
                1.0f32,
                LANES,
                head_dim,
                comptime!(head_dim + 1),
            );
            sync_cube();
            let mut p = 0.0f32;
            let mut slope = 1.0f32;
            if seen {
                let s = capped(
                    dot(
                        &ks,
                        y * head_dim,
                        &tile,
                        x * comptime!(head_dim + 1),
                        head_dim,
                    ),
                    softcap,
                );
                p = (s - row_lse).exp();
                slope = cap_slope(s, softcap);
            }
            sync_cube();
            load_rows::<F>(
                grad_out,
                &mut tile,
                q_base,
                it,
                mask.queries,
                1.0f32,
                LANES,
                head_dim,
                comptime!(head_dim + 1),
            );
            sync_cube();
            let mut ds = 0.0f32;
            if seen {
                let dp = dot(
                    &vs,
                    y * head_dim,
                    &tile,
                    x * comptime!(head_dim + 1),
                    head_dim,
                );
                ds = p * (dp - row_delta) * slope;
            }
            ps[tid] = p;
            dss[tid] = ds;
            sync_cube();
            accumulate(&mut dv, 1.0f32, &ps, y, &tile, x, head_dim);
            sync_cube();
            load_rows::<F>(
                q,
                &mut tile,
                q_base,
                it,
                mask.queries,
                1.0f32,
                LANES,
                head_dim,
                comptime!(head_dim + 1),
            );
            sync_cube();
            accumulate(&mut dk, 1.0f32, &dss, y, &tile, x, head_dim);
            it += LANES;
        }
    }
    if j < mask.keys {
        store::<F>(grad_k, kv * mask.keys + j, &dk, scale, x, head_dim);
        store::<F>(grad_v, kv * mask.keys + j, &dv, 1.0f32, x, head_dim);
    }
}
