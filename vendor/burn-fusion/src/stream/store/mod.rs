mod base;
mod index;

pub(crate) use base::*;
pub(super) use index::*;
