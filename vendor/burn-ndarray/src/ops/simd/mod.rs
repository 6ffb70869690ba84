pub(crate) mod avgpool;
mod base;
pub(crate) mod binary;
pub(crate) mod binary_elemwise;
pub(crate) mod cmp;
pub(crate) mod conv;
pub(crate) mod maxpool;
pub(crate) mod unary;

pub use base::*;
