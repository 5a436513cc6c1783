//! Mixed precision's compute-dtype copies of the parameters, written by the fused AdamW in the
//! pass that steps them, so that the next step's forward needs no cast of every parameter.
//!
//! The optimizer and the model share one [`LowCopies`]: after each step it holds, per parameter,
//! the f32 tensor the step put in the model and its bf16 or f16 copy; mixed precision adds the
//! copies of frozen parameters, which serve every step after the first. The model takes a copy
//! only while its parameter is still that very tensor ([`crate::ops::same_tensor`]): a
//! parameter loaded, broadcast or replaced in any other way since is cast as before. Backends
//! that cannot tell two tensors apart (the plain CubeCL backends) always cast.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor};

use crate::{KernelBackend, ops};

/// A parameter as a step put it in the model, and its copy if the step made one.
type Kept<B, const D: usize> = (Tensor<B, D>, Option<Tensor<B, 1>>);

/// The copies the fused AdamW leaves for mixed precision; clones share them. See the
/// [module docs](self).
#[derive(Clone)]
pub struct LowCopies {
    dtype: FloatDType,
    on: Arc<AtomicBool>,
    /// Per parameter, `(f32 tensor as the step put it in the model, its flat copy if the step
    /// made one)`, of some backend.
    copies: Arc<Mutex<HashMap<ParamId, Box<dyn Any + Send>>>>,
}

impl fmt::Debug for LowCopies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LowCopies")
            .field("dtype", &self.dtype)
            .field("on", &self.is_on())
            .finish_non_exhaustive()
    }
}

impl LowCopies {
    /// Copies in `dtype`, off until [`Self::set_on`].
    pub fn new(dtype: FloatDType) -> Self {
        Self {
            dtype,
            on: Arc::new(AtomicBool::new(false)),
            copies: Arc::default(),
        }
    }

    /// The copies' dtype.
    pub fn dtype(&self) -> FloatDType {
        self.dtype
    }

    /// Whether the optimizer writes copies: only where one model reads them, one rank.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Turns the copies on or off; off also forgets those held.
    pub fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
        if !on {
            self.lock().clear();
        }
    }

    /// Keeps `param`, the tensor a step put in the model as parameter `id` (or a frozen
    /// parameter as it is), and its `copy` if one was made: the copy serves while the parameter
    /// is that tensor.
    pub fn keep<B: Backend, const D: usize>(
        &self,
        id: ParamId,
        param: Tensor<B, D>,
        copy: Option<Tensor<B, 1>>,
    ) {
        self.lock().insert(id, Box::new((param, copy)));
    }

    /// Whether parameter `id` is still `param`, the tensor the last step put in the model
    /// (then it is a view of that step's flat output).
    pub(crate) fn is_current<B: KernelBackend, const D: usize>(
        &self,
        id: ParamId,
        param: &Tensor<B, D>,
    ) -> bool {
        self.lock()
            .get(&id)
            .and_then(|e| e.downcast_ref::<Kept<B, D>>())
            .is_some_and(|(kept, _)| ops::same_tensor(kept, param))
    }

    /// Parameter `id`'s copy, flat, if the optimizer made it from `param` as it is now.
    pub fn copy_of<B: KernelBackend, const D: usize>(
        &self,
        id: ParamId,
        param: &Tensor<B, D>,
    ) -> Option<Tensor<B, 1>> {
        let copies = self.lock();
        let (kept, copy) = copies.get(&id)?.downcast_ref::<Kept<B, D>>()?;
        if ops::same_tensor(kept, param) {
            copy.clone()
        } else {
            None
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<ParamId, Box<dyn Any + Send>>> {
        self.copies.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
