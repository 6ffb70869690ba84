//! The values generic over the backend that are not its tensors, moved field by field between
//! `Counted<I>` and `I` (whose tensors are the same types).

use burn_backend::ops::{
    DeformConv2dBackward, MaxPool1dBackward, MaxPool1dWithIndices, MaxPool2dBackward,
    MaxPool2dWithIndices, TransactionPrimitive,
};
use burn_backend::quantization::QuantizationParametersPrimitive;
use burn_backend::{Backend, TensorPrimitive};

use super::Counted;

pub(super) fn primitive_in<I: Backend>(t: TensorPrimitive<Counted<I>>) -> TensorPrimitive<I> {
    match t {
        TensorPrimitive::Float(t) => TensorPrimitive::Float(t),
        TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(t),
    }
}

pub(super) fn primitive_out<I: Backend>(t: TensorPrimitive<I>) -> TensorPrimitive<Counted<I>> {
    match t {
        TensorPrimitive::Float(t) => TensorPrimitive::Float(t),
        TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(t),
    }
}

pub(super) fn qparams_in<I: Backend>(
    p: QuantizationParametersPrimitive<Counted<I>>,
) -> QuantizationParametersPrimitive<I> {
    QuantizationParametersPrimitive { scales: p.scales }
}

/// A transaction reaches `tr_execute` with its order already taken (burn's `execute_async`).
pub(super) fn transaction_in<I: Backend>(
    t: TransactionPrimitive<Counted<I>>,
) -> TransactionPrimitive<I> {
    TransactionPrimitive::new(t.read_floats, t.read_qfloats, t.read_ints, t.read_bools)
}

pub(super) fn max_pool1d_with_indices_out<I: Backend>(
    p: MaxPool1dWithIndices<I>,
) -> MaxPool1dWithIndices<Counted<I>> {
    MaxPool1dWithIndices::new(p.output, p.indices)
}

pub(super) fn max_pool2d_with_indices_out<I: Backend>(
    p: MaxPool2dWithIndices<I>,
) -> MaxPool2dWithIndices<Counted<I>> {
    MaxPool2dWithIndices::new(p.output, p.indices)
}

pub(super) fn max_pool1d_backward_out<I: Backend>(
    p: MaxPool1dBackward<I>,
) -> MaxPool1dBackward<Counted<I>> {
    MaxPool1dBackward::new(p.x_grad)
}

pub(super) fn max_pool2d_backward_out<I: Backend>(
    p: MaxPool2dBackward<I>,
) -> MaxPool2dBackward<Counted<I>> {
    MaxPool2dBackward::new(p.x_grad)
}

pub(super) fn deform_conv2d_backward_out<I: Backend>(
    g: DeformConv2dBackward<I>,
) -> DeformConv2dBackward<Counted<I>> {
    DeformConv2dBackward::new(
        g.x_grad,
        g.offset_grad,
        g.weight_grad,
        g.mask_grad,
        g.bias_grad,
    )
}
