#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

//! Burn ndarray backend.

#[cfg(any(
    feature = "blas-netlib",
    feature = "blas-openblas",
    feature = "blas-openblas-system",
))]
extern crate blas_src;

mod backend;
mod element;
mod ops;
mod parallel;
mod rand;
/// xtoken patch: the count of reads to the host.
pub mod reads;
mod sharing;
/// xtoken patch: a record of the shapes of the tensors made.
pub mod shapes;
mod storage;
mod tensor;

pub use backend::*;
pub use element::*;
pub(crate) use sharing::*;
pub(crate) use storage::*;
pub use tensor::*;

extern crate alloc;
