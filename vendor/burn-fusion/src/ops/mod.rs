mod activation;
mod binary;
mod bool_tensor;
#[cfg(feature = "distributed")]
mod distributed;
mod int_tensor;
mod module;
mod qtensor;
mod tensor;
mod transaction;
mod unary;

mod base;
pub use base::NoOp;
