//! ZeRO-3 one unit at a time, as FSDP runs it: a model that runs its units (decoder layers)
//! one after another, and each again in its backward (activation checkpointing), gathers a
//! unit's parameters from their owners just before it runs and drops them after, so a replica
//! holds its own part of the parameters and one unit whole, instead of the whole model the
//! strategy would gather before the step.
//!
//! The strategy lends its rank's data-parallel group to the step ([`lend`]); the model calls
//! [`gather_unit`] on each unit it runs, in the same order on every replica. Without a lending
//! (another strategy, a step that gathered the whole model, evaluation), `gather_unit` gives
//! the unit back unchanged.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use burn::module::{AutodiffModule, ParamId};
use burn::tensor::backend::AutodiffBackend;

use super::Owners;
use super::owners::param_ids;
use crate::collective::{Collective, CollectiveError};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

thread_local! {
    /// The group lent to the step running on this thread, as a [`Lent<B>`].
    static LENT: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// What a step borrows to gather its units.
struct Lent<B: AutodiffBackend> {
    owners: Arc<Owners>,
    group: Box<dyn Collective<Inner<B>>>,
    /// Every parameter gathered so far.
    gathered: HashSet<ParamId>,
    /// The first failed gather: the step is abandoned with it.
    error: Option<CollectiveError>,
}

/// What a step run by [`lend`] leaves: its result (or its panic), the group back, the
/// parameters it gathered and the gather that failed.
pub(crate) struct Returned<B: AutodiffBackend, R> {
    pub result: std::thread::Result<R>,
    pub group: Box<dyn Collective<Inner<B>>>,
    pub gathered: HashSet<ParamId>,
    pub error: Option<CollectiveError>,
}

/// `unit` with the parameters other replicas own gathered from them, when the step running on
/// this thread gathers unit by unit (ZeRO-3 with `gather_units`); else `unit` itself. Every
/// replica must gather the same units in the same order: the gathers are collective calls.
///
/// # Panics
/// When a gather fails (a peer failed or timed out): the strategy then reports the collective
/// error, naming the culprit, rather than the panic.
pub fn gather_unit<B: AutodiffBackend, M: AutodiffModule<B>>(unit: M) -> M {
    LENT.with(|lent| {
        let mut lent = lent.borrow_mut();
        let Some(lent) = lent.as_mut().and_then(|l| l.downcast_mut::<Lent<B>>()) else {
            return unit;
        };
        let held = param_ids::<B, M>(&unit);
        let gathered = lent
            .owners
            .broadcast_held::<B, M>(unit, &held, lent.group.as_mut());
        lent.gathered.extend(held);
        match gathered {
            Ok(unit) => unit,
            Err(error) => {
                let message = error.to_string();
                lent.error = Some(error);
                panic!("a unit's gather failed: {message}");
            }
        }
    })
}

/// Runs `step` with `group` lent to [`gather_unit`] on this thread, and returns the group
/// whatever the step did (a panic included), so that the rank can abort it.
pub(crate) fn lend<B: AutodiffBackend, R>(
    owners: Arc<Owners>,
    group: Box<dyn Collective<Inner<B>>>,
    step: impl FnOnce() -> R,
) -> Returned<B, R> {
    let lent = Lent::<B> {
        owners,
        group,
        gathered: HashSet::new(),
        error: None,
    };
    LENT.with(|l| *l.borrow_mut() = Some(Box::new(lent)));
    let result = catch_unwind(AssertUnwindSafe(step));
    let lent = LENT
        .with(|l| l.borrow_mut().take())
        .and_then(|l| l.downcast::<Lent<B>>().ok())
        .expect("the lent group is on this thread until the step returns");
    Returned {
        result,
        group: lent.group,
        gathered: lent.gathered,
        error: lent.error,
    }
}
