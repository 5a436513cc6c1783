//! The report of a non-finite loss or gradient.

use std::fmt;

/// Where the first non-finite value was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NonFiniteValue {
    /// The loss of the rank's samples.
    Loss,
    /// The gradient of the parameter at this module path (`blocks.1.attn.query.weight`), or
    /// of a parameter of another pipeline stage, which this rank cannot name.
    Gradient {
        /// The parameter's module path, when the reporting rank holds it.
        param: Option<String>,
        /// The parameter's position in its module's visiting order.
        ordinal: usize,
    },
    /// Every gradient was finite, but the global norm overflows f32 (gradients of about 1e19,
    /// or finite gradients whose sum over the ranks overflowed).
    NormOverflow,
}

/// A NaN or infinity found by the [`PerformanceOptimizer`](super::PerformanceOptimizer)'s guard.
///
/// Every rank builds the same report from the same synchronised facts, so under
/// [`NanPolicy::Halt`](super::NanPolicy::Halt) all ranks fail with an equal error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct NonFinite {
    /// The optimizer step (1 for the first) whose gradients were not finite.
    pub step: u64,
    /// The rank where the value appeared (the lowest with a non-finite loss, else the lowest
    /// with a non-finite gradient); `None` for [`NonFiniteValue::NormOverflow`].
    pub rank: Option<usize>,
    /// That rank's tensor-parallel shard, when the model is sharded.
    pub shard: Option<usize>,
    /// What was not finite on that rank.
    pub value: NonFiniteValue,
    /// How many ranks had non-finite values of their own.
    pub ranks_affected: usize,
}

impl NonFinite {
    /// What was not finite, and where, without advice: what the warning of a skipped step
    /// says (the error under `halt` adds what to do).
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = self.write_summary(&mut s);
        s
    }

    fn write_summary(&self, f: &mut impl fmt::Write) -> fmt::Result {
        match &self.value {
            NonFiniteValue::Loss => write!(f, "the loss is NaN or infinite")?,
            NonFiniteValue::Gradient {
                param: Some(path), ..
            } => write!(f, "the gradient of {path} holds NaN or infinity")?,
            NonFiniteValue::Gradient {
                param: None,
                ordinal,
            } => write!(
                f,
                "the gradient of parameter #{ordinal} of another pipeline stage holds NaN or \
                 infinity"
            )?,
            NonFiniteValue::NormOverflow => write!(
                f,
                "the gradients are finite but their global norm overflows f32"
            )?,
        }
        write!(f, " at step {}", self.step)?;
        if let Some(rank) = self.rank {
            write!(f, " on rank {rank}")?;
        }
        if let Some(shard) = self.shard {
            write!(f, " (tensor-parallel shard {shard})")?;
        }
        if self.ranks_affected > 1 {
            write!(f, " (and on {} other ranks)", self.ranks_affected - 1)?;
        }
        Ok(())
    }
}

impl fmt::Display for NonFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_summary(f)?;
        write!(
            f,
            "; lower the learning rate, set clip_norm, check the data of that step, or use \
             nan_policy skip to skip such steps"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_skip_warning_says_what_without_advising_the_policy_already_on() {
        let report = NonFinite {
            step: 3,
            rank: Some(1),
            shard: None,
            value: NonFiniteValue::Loss,
            ranks_affected: 1,
        };
        assert_eq!(
            report.summary(),
            "the loss is NaN or infinite at step 3 on rank 1"
        );
        assert!(report.to_string().contains("nan_policy skip"), "{report}");
    }
}
