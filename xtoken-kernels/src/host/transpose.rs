//! A matrix transposed on the host, in cache-sized blocks, on all cores: loading a multi-GB
//! checkpoint is mostly this and the dtype conversion, and a gradient that autodiff leaves as a
//! transposed view (a tied head's) is made contiguous by it several times faster than an
//! element-by-element strided copy.

/// Row-major `[rows, cols]` → row-major `[cols, rows]`.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    use rayon::prelude::*;
    const BLOCK: usize = 32;
    let mut out = vec![0.0; values.len()];
    if rows == 0 || cols == 0 {
        return out;
    }
    out.par_chunks_mut(BLOCK * rows)
        .enumerate()
        .for_each(|(block, out_rows)| {
            let c0 = block * BLOCK;
            let c1 = (c0 + BLOCK).min(cols);
            for r0 in (0..rows).step_by(BLOCK) {
                for r in r0..(r0 + BLOCK).min(rows) {
                    for c in c0..c1 {
                        out_rows[(c - c0) * rows + r] = values[r * cols + c];
                    }
                }
            }
        });
    out
}
