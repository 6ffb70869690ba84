use crate::{
    FloatNdArrayElement, NdArray, NdArrayTensor, SharedArray,
    element::{IntNdArrayElement, QuantElement},
};
use burn_backend::ExecutionError;
use burn_backend::ops::{TransactionOps, TransactionPrimitive, TransactionPrimitiveData};

impl<E: FloatNdArrayElement, I: IntNdArrayElement, Q: QuantElement> TransactionOps<Self>
    for NdArray<E, I, Q>
where
    NdArrayTensor: From<SharedArray<E>>,
    NdArrayTensor: From<SharedArray<I>>,
{
    // xtoken patch: a transaction is one read (see `reads`), whatever it holds.
    async fn tr_execute(
        transaction: TransactionPrimitive<Self>,
    ) -> Result<TransactionPrimitiveData, ExecutionError> {
        use burn_backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps, QTensorOps};
        crate::reads::note();
        let _inside = crate::reads::Paused::new();
        let mut data = TransactionPrimitiveData {
            read_floats: Vec::new(),
            read_qfloats: Vec::new(),
            read_ints: Vec::new(),
            read_bools: Vec::new(),
        };
        for t in transaction.read_floats {
            data.read_floats.push(Self::float_into_data(t).await?);
        }
        for t in transaction.read_qfloats {
            data.read_qfloats.push(Self::q_into_data(t).await?);
        }
        for t in transaction.read_ints {
            data.read_ints.push(Self::int_into_data(t).await?);
        }
        for t in transaction.read_bools {
            data.read_bools.push(Self::bool_into_data(t).await?);
        }
        Ok(data)
    }
}
