//! What pipeline stages exchange and how they become a model again: the [`Activation`] a
//! stage hands the next (and its wire format), and [`assemble`], which puts the stages'
//! parameters back into the whole model. The contract a model implements to split into
//! stages is [`crate::model::PipelineModel`].

mod activation;
mod assemble;
mod wire;

pub use activation::Activation;
pub use assemble::assemble;
pub(crate) use wire::{recv_activation, send_activation};
