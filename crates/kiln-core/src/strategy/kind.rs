//! Naming a strategy in configs and on the command line, and resolving `auto`.

use std::fmt;

/// A strategy chosen by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    /// [`Single`](super::Single): one device.
    Single,
    /// [`DataParallel`](super::DataParallel): one process, main-device optimizer.
    #[serde(rename = "dp")]
    DataParallel,
    /// [`Ddp`](super::Ddp): a replica per rank.
    Ddp,
    /// Let Kiln choose (see [`StrategyKind::resolve`]).
    #[default]
    Auto,
}

impl fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StrategyKind::Single => "single",
            StrategyKind::DataParallel => "dp",
            StrategyKind::Ddp => "ddp",
            StrategyKind::Auto => "auto",
        })
    }
}

/// A resolved choice and the reason for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoDecision {
    /// The concrete strategy.
    pub kind: StrategyKind,
    /// Why it was chosen, for logs and `kiln plan`.
    pub reason: String,
}

impl StrategyKind {
    /// Turns `Auto` into a concrete strategy for `world_size` ranks; other kinds stay.
    ///
    /// Until the memory-aware planner exists, `Auto` picks `Single` for one rank and `Ddp`
    /// otherwise: Ddp overlaps nothing it should not and never funnels gradients through one
    /// device, so it is the better default whenever the model fits on every device.
    pub fn resolve(self, world_size: usize) -> AutoDecision {
        match self {
            StrategyKind::Auto if world_size <= 1 => AutoDecision {
                kind: StrategyKind::Single,
                reason: "one rank: nothing to parallelise".into(),
            },
            StrategyKind::Auto => AutoDecision {
                kind: StrategyKind::Ddp,
                reason: format!(
                    "{world_size} ranks: a full replica per rank (memory-aware planning is not \
                     implemented yet, so the model is assumed to fit on every device)"
                ),
            },
            kind => AutoDecision {
                kind,
                reason: "chosen by the user".into(),
            },
        }
    }
}
