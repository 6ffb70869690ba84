//! `xt_add_rows` (an embedding lookup's gradient added into its table's): on ndarray and
//! burn-flex the host pass gives the bits of burn's composition (a zero table, `select_add`,
//! the sum) for contiguous and transposed tables and repeated indices, against a plain f64 loop
//! as well; a backend without it, and a dtype the pass does not take, compose.

use burn::backend::NdArray;
use burn::tensor::{backend::Backend, DType, Int, Tensor, TensorData, TensorPrimitive};
use burn_flex::Flex;
use proptest::prelude::*;
use xtoken_kernels::{embedding, XTokenBackend};

use crate::support::values;

fn table<B: Backend>(v: &[f32], [rows, cols]: [usize; 2], transposed: bool) -> Tensor<B, 2> {
    let device = Default::default();
    match transposed {
        // Stored as `[cols, rows]` and viewed transposed, as autodiff leaves a tied head's.
        false => Tensor::from_data(TensorData::new(v.to_vec(), [rows, cols]), &device),
        true => {
            let stored: Vec<f32> = (0..cols)
                .flat_map(|c| (0..rows).map(move |r| v[r * cols + c]))
                .collect();
            Tensor::<B, 2>::from_data(TensorData::new(stored, [cols, rows]), &device).transpose()
        }
    }
}

fn inputs<B: Backend>(
    table_values: &[f32],
    shape: [usize; 2],
    transposed: bool,
    ids: &[i64],
    rows: &[f32],
) -> (Tensor<B, 2>, Tensor<B, 1, Int>, Tensor<B, 2>) {
    let device = Default::default();
    (
        table::<B>(table_values, shape, transposed),
        Tensor::from_data(TensorData::new(ids.to_vec(), [ids.len()]), &device),
        Tensor::from_data(
            TensorData::new(rows.to_vec(), [ids.len(), shape[1]]),
            &device,
        ),
    )
}

fn fused<B: XTokenBackend>(
    (t, ids, rows): (Tensor<B, 2>, Tensor<B, 1, Int>, Tensor<B, 2>),
) -> Vec<f32> {
    let out = B::xt_add_rows(
        t.into_primitive().tensor(),
        ids.into_primitive(),
        rows.into_primitive().tensor(),
    );
    bits(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)))
}

fn composed<B: Backend>(
    (t, ids, rows): (Tensor<B, 2>, Tensor<B, 1, Int>, Tensor<B, 2>),
) -> Vec<f32> {
    let out = embedding::add_rows_composed::<B>(
        t.into_primitive().tensor(),
        ids.into_primitive(),
        rows.into_primitive().tensor(),
    );
    bits(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)))
}

fn bits<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().expect("f32")
}

/// The sum in f64: each index's rows summed, added to the table.
fn reference(table: &[f32], cols: usize, ids: &[i64], rows: &[f32]) -> Vec<f64> {
    let mut out: Vec<f64> = table.iter().map(|&v| f64::from(v)).collect();
    for (&id, row) in ids.iter().zip(rows.chunks(cols)) {
        let at = id as usize * cols;
        for (o, &r) in out[at..at + cols].iter_mut().zip(row) {
            *o += f64::from(r);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_host_pass_gives_the_compositions_bits(
        vocab in 1usize..40,
        cols in 1usize..24,
        n in 0usize..30,
        seed in any::<u64>(),
        transposed in any::<bool>(),
    ) {
        let t = values(seed, vocab * cols, 1.0);
        let rows = values(seed ^ 1, n * cols, 1.0);
        // Few distinct ids, so that most repeat.
        let ids: Vec<i64> = values(seed ^ 2, n, 1.0)
            .iter()
            .map(|v| ((v.abs() * vocab as f32) as i64).min(vocab as i64 - 1) / 2)
            .collect();
        let shape = [vocab, cols];
        let want = composed::<NdArray>(inputs(&t, shape, false, &ids, &rows));
        let nd = fused::<NdArray>(inputs(&t, shape, transposed, &ids, &rows));
        let flex = fused::<Flex>(inputs(&t, shape, transposed, &ids, &rows));
        let flex_composed = composed::<Flex>(inputs(&t, shape, transposed, &ids, &rows));
        prop_assert_eq!(&nd, &want);
        prop_assert_eq!(&flex, &want);
        prop_assert_eq!(&flex_composed, &want);
        // Rounding: each sum of at most n terms of |·| ≤ 1, then one more addition.
        let bound = (n as f64 + 2.0) * f64::from(f32::EPSILON) * (n as f64 + 1.0);
        for (i, (&g, r)) in nd.iter().zip(reference(&t, cols, &ids, &rows)).enumerate() {
            prop_assert!((f64::from(g) - r).abs() <= bound, "[{}]: {} against {}", i, g, r);
        }
    }
}

/// A table that owns its buffer is updated in it: no second table is allocated.
#[test]
fn a_table_it_owns_is_updated_in_its_buffer() {
    let t = values(7, 50 * 8, 1.0);
    let (table, ids, rows) = inputs::<Flex>(&t, [50, 8], false, &[3, 3, 49], &values(8, 24, 1.0));
    let primitive = table.into_primitive().tensor();
    let before = primitive.storage::<f32>().as_ptr();
    let out = Flex::xt_add_rows(
        primitive,
        ids.into_primitive(),
        rows.into_primitive().tensor(),
    );
    assert_eq!(out.storage::<f32>().as_ptr(), before);
}

/// A bf16 table takes the composition.
#[test]
fn a_bf16_table_takes_the_composition() {
    let t = values(9, 12 * 4, 1.0);
    let rows = values(10, 3 * 4, 1.0);
    let cast = |(t, ids, r): (Tensor<Flex, 2>, Tensor<Flex, 1, Int>, Tensor<Flex, 2>)| {
        (t.cast(DType::BF16), ids, r.cast(DType::BF16))
    };
    let got = fused::<Flex>(cast(inputs(&t, [12, 4], false, &[0, 5, 5], &rows)));
    let want = composed::<Flex>(cast(inputs(&t, [12, 4], false, &[0, 5, 5], &rows)));
    assert_eq!(got, want);
}
