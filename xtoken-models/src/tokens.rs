//! A batch of token ids as a forward pass takes it: the ids on the device, and what the pass
//! must know about them on the host (the shape, which positions are padding, the largest id).
//! Ids made on the host are checked there, so a training step never reads them back from the
//! device; a GPU would wait for its queue at every such read.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData, Transaction};

use crate::config::Architecture;
use crate::error::{ModelError, Result};

/// Token ids `[batch, len]` with their padding, checked for shape, sign and right padding when
/// made; a model checks them against its vocabulary and context without reading the device.
#[derive(Debug, Clone)]
pub struct Tokens<B: Backend> {
    ids: Tensor<B, 2, Int>,
    /// `true` at padded positions, row-major; `None`: no padding.
    padded: Option<Vec<bool>>,
    /// The smallest and the largest id, each with its flat index.
    range: [(i64, usize); 2],
}

impl<B: Backend> Tokens<B> {
    /// Ids `[batch, len]` (row-major) held on the host, and their padding (`true`: padded;
    /// pad on the right), uploaded to `device`.
    pub fn from_host(
        ids: &[i64],
        padding: Option<&[bool]>,
        [batch, len]: [usize; 2],
        device: &B::Device,
    ) -> Result<Self> {
        check_shape("input ids", ids.len(), [batch, len])?;
        if let Some(padding) = padding {
            check_shape("padding mask", padding.len(), [batch, len])?;
        }
        let range = range(ids);
        let padded = padding.map(<[bool]>::to_vec);
        if let Some(padded) = &padded {
            check_right_padding(padded, len)?;
        }
        let data = TensorData::new(ids.to_vec(), [batch, len]);
        Ok(Tokens {
            ids: Tensor::from_data(data, device),
            padded,
            range,
        })
    }

    /// Ids and padding already on the device: read back once (one transaction) to be checked.
    pub fn from_tensors(
        ids: Tensor<B, 2, Int>,
        padding: Option<Tensor<B, 2, Bool>>,
    ) -> Result<Self> {
        let [batch, len] = ids.dims();
        if let Some(p) = padding.as_ref().filter(|p| p.dims() != [batch, len]) {
            return Err(ModelError::Shape {
                what: "padding mask",
                expected: format!("{:?} like the ids", [batch, len]),
                found: format!("{:?}", p.dims()),
            });
        }
        let mut read = Transaction::default().register(ids.clone());
        // Bool storage differs per backend (u8 on ndarray, u32 on wgpu): read integers.
        if let Some(p) = &padding {
            read = read.register(p.clone().int());
        }
        let mut data = read.execute().into_iter();
        let values = integers(data.next(), "input ids", "integer values")?;
        let padded: Option<Vec<bool>> = match padding {
            None => None,
            Some(_) => Some(
                integers(data.next(), "padding mask", "boolean values")?
                    .into_iter()
                    .map(|v| v != 0)
                    .collect(),
            ),
        };
        check_shape("input ids", values.len(), [batch, len])?;
        let range = range(&values);
        if let Some(padded) = &padded {
            check_right_padding(padded, len)?;
        }
        Ok(Tokens { ids, padded, range })
    }

    /// The ids on the device.
    pub fn ids(&self) -> Tensor<B, 2, Int> {
        self.ids.clone()
    }

    /// `[batch, len]`.
    pub fn dims(&self) -> [usize; 2] {
        self.ids.dims()
    }

    /// `true` at padded positions (row-major); `None` when nothing is padded.
    pub fn padding(&self) -> Option<&[bool]> {
        self.padded.as_deref()
    }

    /// The same tokens on the inner backend of an autodiff backend.
    pub fn inner(&self) -> Tokens<B::InnerBackend>
    where
        B: burn::tensor::backend::AutodiffBackend,
    {
        Tokens {
            ids: self.ids.clone().inner(),
            padded: self.padded.clone(),
            range: self.range,
        }
    }

    /// Every id is in `architecture`'s vocabulary (an out-of-range id would index past the
    /// embedding) and the rows fit its context.
    pub(crate) fn check(&self, architecture: &Architecture) -> Result<()> {
        let len = self.dims()[1];
        if len > architecture.max_position_embeddings {
            return Err(ModelError::TooLong {
                len,
                limit: architecture.max_position_embeddings,
            });
        }
        let vocab = architecture.vocab_size;
        let [smallest, largest] = self.range;
        let outside = [smallest, largest]
            .into_iter()
            .find(|&(id, _)| id < 0 || id >= vocab as i64);
        match outside {
            Some((id, at)) => Err(ModelError::TokenId {
                sequence: at / len,
                position: at % len,
                id,
                vocab,
            }),
            None => Ok(()),
        }
    }
}

/// `n` values make `[batch, len]`, with at least one sequence of at least one token.
fn check_shape(what: &'static str, n: usize, [batch, len]: [usize; 2]) -> Result<()> {
    if batch == 0 || len == 0 || n != batch * len {
        return Err(ModelError::Shape {
            what,
            expected: format!(
                "{:?}: at least one sequence of at least one token",
                [batch, len]
            ),
            found: format!("{n} values"),
        });
    }
    Ok(())
}

/// The smallest and the largest of (non-empty) ids, each with its first flat index.
fn range(ids: &[i64]) -> [(i64, usize); 2] {
    let mut range = [(ids[0], 0); 2];
    for (at, &id) in ids.iter().enumerate() {
        if id < range[0].0 {
            range[0] = (id, at);
        }
        if id > range[1].0 {
            range[1] = (id, at);
        }
    }
    range
}

/// The values of a read tensor as integers.
fn integers(
    data: Option<TensorData>,
    what: &'static str,
    expected: &'static str,
) -> Result<Vec<i64>> {
    let shape_error = |found: String| ModelError::Shape {
        what,
        expected: expected.into(),
        found,
    };
    data.ok_or_else(|| shape_error("nothing read".into()))?
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| shape_error(format!("{e:?}")))
}

/// Every sequence's padding (`true`) comes after all its tokens.
fn check_right_padding(padded: &[bool], len: usize) -> Result<()> {
    for (sequence, row) in padded.chunks(len).enumerate() {
        if let Some(padding) = row.iter().position(|&p| p) {
            if let Some(after) = row[padding..].iter().position(|&p| !p) {
                return Err(ModelError::NotRightPadded {
                    sequence,
                    padding,
                    token: padding + after,
                });
            }
        }
    }
    Ok(())
}
