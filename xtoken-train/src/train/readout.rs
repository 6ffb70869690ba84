//! The scalars a step reports (its loss values, the gradient norm) gathered on the device and
//! read to the host together. Every read of a GPU's memory waits for its queue to drain, so a
//! step reads once, at its end, instead of once per value.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

use crate::error::{Error, Result};

/// `[1]` values waiting on the device for one read.
pub struct Readout<B: Backend> {
    parts: Vec<Tensor<B, 1>>,
}

impl<B: Backend> Default for Readout<B> {
    fn default() -> Self {
        Readout { parts: Vec::new() }
    }
}

impl<B: Backend> Readout<B> {
    /// Adds a `[1]` value; returns its index among [`Readout::read`]'s values.
    pub fn push(&mut self, value: Tensor<B, 1>) -> usize {
        self.parts.push(value.cast(DType::F32));
        self.parts.len() - 1
    }

    /// Every value, in the order pushed, in one read (none when nothing was pushed).
    pub fn read(self) -> Result<Vec<f64>> {
        if self.parts.is_empty() {
            return Ok(Vec::new());
        }
        let count = self.parts.len();
        let values = Tensor::cat(self.parts, 0)
            .into_data()
            .convert::<f64>()
            .into_vec::<f64>()
            .map_err(|e| Error::Run(format!("reading the step's values: {e:?}")))?;
        if values.len() != count {
            return Err(Error::Run(format!(
                "reading the step's values: {} values for {count}",
                values.len()
            )));
        }
        Ok(values)
    }
}
