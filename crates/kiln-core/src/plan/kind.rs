//! Naming a strategy in configs and on the command line. What `auto` becomes is the plan's
//! decision ([`Plan::resolve`](super::Plan::resolve)).

use std::fmt;

/// A strategy chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    /// [`Single`](crate::strategy::Single): one device.
    Single,
    /// [`DataParallel`](crate::strategy::DataParallel): one process, main-device optimizer.
    DataParallel,
    /// [`Ddp`](crate::strategy::Ddp): a replica per rank.
    Ddp,
    /// [`Pipeline`](crate::strategy::Pipeline): the model's stages on ranks, micro-batches through them.
    Pipeline,
    /// [`Tensor`](crate::strategy::Tensor): the model's layers sharded over ranks (times stages and
    /// replicas).
    Tensor,
    /// Let Kiln choose (see [`Plan::resolve`](super::Plan::resolve)).
    #[default]
    Auto,
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl StrategyKind {
    /// Why this strategy cannot span processes, and what to use instead; `None` when it can.
    pub(crate) const fn single_process_only(self) -> Option<&'static str> {
        match self {
            StrategyKind::Ddp
            | StrategyKind::Pipeline
            | StrategyKind::Tensor
            | StrategyKind::Auto => None,
            StrategyKind::Single => Some(
                "it trains on one device; under a launcher use ddp (one replica per process), or \
                 run one process",
            ),
            StrategyKind::DataParallel => Some(
                "it gathers every replica's gradients on one main device, which only threads of \
                 one process share; use ddp, which all-reduces them",
            ),
        }
    }

    /// The name configs and command lines use.
    pub const fn name(self) -> &'static str {
        match self {
            StrategyKind::Single => "single",
            StrategyKind::DataParallel => "data_parallel",
            StrategyKind::Ddp => "ddp",
            StrategyKind::Pipeline => "pipeline",
            StrategyKind::Tensor => "tensor",
            StrategyKind::Auto => "auto",
        }
    }

    /// Every strategy, in the order help texts list them.
    pub const ALL: [StrategyKind; 6] = [
        StrategyKind::Single,
        StrategyKind::DataParallel,
        StrategyKind::Ddp,
        StrategyKind::Pipeline,
        StrategyKind::Tensor,
        StrategyKind::Auto,
    ];

    /// The names configs and command lines use, as [`StrategyKind::ALL`] lists them.
    pub const ALL_NAMES: [&'static str; 6] = [
        Self::ALL[0].name(),
        Self::ALL[1].name(),
        Self::ALL[2].name(),
        Self::ALL[3].name(),
        Self::ALL[4].name(),
        Self::ALL[5].name(),
    ];
}

impl StrategyKind {
    /// The world `auto` asks for on a CPU backend when nobody named one: every core a
    /// single-threaded Ddp rank, but no more ranks than the global batch has samples.
    ///
    /// On the CPU, intra-op threading gains little at Kiln's model sizes while separate ranks
    /// scale (measured: two single-threaded ranks train the AD model 2.3× faster than one rank
    /// with two threads), and Ddp trains exactly as one rank does, up to float rounding.
    pub fn auto_cpu_world(cores: usize, global_batch: usize) -> usize {
        cores.min(global_batch).max(1)
    }
}

impl std::str::FromStr for StrategyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == s)
            .ok_or_else(|| format!("unknown strategy {s:?}; use {}", Self::ALL_NAMES.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_the_cores_the_batch_can_feed() {
        assert_eq!(StrategyKind::auto_cpu_world(2, 32), 2);
        assert_eq!(StrategyKind::auto_cpu_world(16, 8), 8);
        assert_eq!(StrategyKind::auto_cpu_world(1, 32), 1);
        assert_eq!(StrategyKind::auto_cpu_world(0, 32), 1);
    }
}
