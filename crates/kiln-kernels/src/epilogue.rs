//! What a linear layer does to `x·w + b` before it returns it, in the same pass over the
//! output: on a GPU one launch after the matmul where Burn's broadcast add, residual add and
//! ReLU are one launch each.

/// The epilogue of a linear layer `x·w + b`, over tensors `T`.
#[derive(Debug, Clone)]
pub enum Epilogue<T> {
    /// `x·w + b` as it is.
    None,
    /// `x·w + b + r`: a residual added, as after a transformer block's output projections.
    Residual(T),
    /// `relu(x·w + b)`: a feed-forward's first layer.
    Relu,
}

impl<T> Epilogue<T> {
    /// The same epilogue over `f(r)` for a residual `r`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Epilogue<U> {
        match self {
            Self::None => Epilogue::None,
            Self::Residual(r) => Epilogue::Residual(f(r)),
            Self::Relu => Epilogue::Relu,
        }
    }

    /// The residual, if there is one.
    pub fn residual(&self) -> Option<&T> {
        match self {
            Self::Residual(r) => Some(r),
            _ => None,
        }
    }
}
