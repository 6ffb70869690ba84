//! An embedding lookup's gradient added into its table's: `grad[ids[i]] += rows[i]`.
//!
//! burn's backward of a lookup builds a zero `[vocab, hidden]` table, adds the rows into it,
//! and adds that table to the gradient the parameter already has (a tied output head's): three
//! passes over the whole vocabulary for a few hundred rows, about a seventh of a 100M model's
//! forward + backward on the CPU at a 128K vocabulary. [`XTokenBackend::xt_add_rows`] is that
//! sum as one operation; a host backend adds the rows into the gradient's own buffer.
//!
//! [`XTokenBackend::xt_add_rows`]: crate::XTokenBackend::xt_add_rows

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorMetadata};

use crate::blocks::HostF32;

/// `table` `[rows, cols]` plus the table of burn's lookup backward: zeros with `values`
/// `[n, cols]` added at rows `indices` `[n]`, repeated indices summed in order.
pub fn add_rows_composed<B: Backend>(
    table: FloatTensor<B>,
    indices: IntTensor<B>,
    values: FloatTensor<B>,
) -> FloatTensor<B> {
    let zeros = B::float_zeros(
        table.shape(),
        &B::float_device(&table),
        table.dtype().into(),
    );
    let lookup = B::float_select_add(zeros, 0, indices, values);
    B::float_add(table, lookup)
}

/// [`add_rows_composed`] on the host, into `table`'s buffer (copied first only where it is
/// shared or strided). Each index's rows are summed first, from zero and in order, and the sum
/// added once, so the result is bitwise the composition's. Other dtypes, or an index out of
/// range, take the composition.
pub(crate) fn add_rows_on_host<B: HostF32>(
    table: FloatTensor<B>,
    indices: IntTensor<B>,
    values: FloatTensor<B>,
) -> FloatTensor<B> {
    let shape = table.shape();
    let (rows, cols) = (shape[0], shape.num_elements() / shape[0].max(1));
    let ids: Vec<i64> = Tensor::<B, 1, Int>::from_primitive(indices.clone())
        .into_data()
        .convert::<i64>()
        .into_vec()
        .unwrap_or_default();
    let sums = B::values(&values).and_then(|v| sums_by_index(&ids, &v, rows, cols));
    let Some(sums) = sums else {
        return add_rows_composed::<B>(table, indices, values);
    };
    match B::update_values(table, |buffer| {
        for (row, sum) in &sums {
            let target = &mut buffer[row * cols..(row + 1) * cols];
            target.iter_mut().zip(sum).for_each(|(t, s)| *t += s);
        }
    }) {
        Ok(updated) => updated,
        Err(table) => add_rows_composed::<B>(table, indices, values),
    }
}

/// Per distinct index, in the order first seen, the sum from zero of its rows of `values`
/// (`ids.len()` rows of `cols`); `None` when an index is outside `0..rows` or the values do not
/// hold `ids.len()` rows.
fn sums_by_index(
    ids: &[i64],
    values: &[f32],
    rows: usize,
    cols: usize,
) -> Option<Vec<(usize, Vec<f32>)>> {
    if values.len() != ids.len() * cols {
        return None;
    }
    let mut slot = std::collections::HashMap::new();
    let mut sums: Vec<(usize, Vec<f32>)> = Vec::new();
    for (&id, value) in ids.iter().zip(values.chunks_exact(cols.max(1))) {
        let row = usize::try_from(id).ok().filter(|&r| r < rows)?;
        let at = *slot.entry(row).or_insert_with(|| {
            sums.push((row, vec![0.0; cols]));
            sums.len() - 1
        });
        sums[at].1.iter_mut().zip(value).for_each(|(s, v)| *s += v);
    }
    Some(sums)
}
