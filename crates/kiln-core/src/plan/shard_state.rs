//! Which training state `ddp`'s replicas split among themselves (ZeRO's stages): a name the
//! settings ([`super::DdpConfig`]) and the planner's layouts ([`super::cost::Layout`]) share.

/// Which training state `ddp`'s replicas split among themselves: ZeRO's stages, as DeepSpeed
/// numbers them, and FSDP's `SHARD_GRAD_OP` / `FULL_SHARD` beyond.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ShardState {
    /// Every replica holds the parameters, the gradients and the optimizer state whole.
    #[default]
    None,
    /// ZeRO-1: each replica owns whole parameters, about `1 / dp` of them by elements, keeps
    /// the optimizer state only for those and steps only those; the updated parameters are
    /// then broadcast from their owners. Training is exactly plain `ddp`'s.
    Optimizer,
    /// ZeRO-2: as [`ShardState::Optimizer`], and each owner alone receives the reduced
    /// gradients of its parameters (a reduction to each owner in place of the all-reduce), so
    /// a replica holds about `1 / dp` of the reduced gradients; the clipping norm adds the
    /// owners' parts. Training is exactly plain `ddp`'s.
    Gradients,
    /// ZeRO-3: as [`ShardState::Gradients`], and between steps each replica holds only its own
    /// trainable parameters: the others' are released after the step and gathered from their
    /// owners (one broadcast per bucket of each part) before the next forward. Frozen
    /// parameters stay whole. Training is exactly plain `ddp`'s. Burn's autodiff keeps every
    /// parameter a forward used until its backward, so a model gathered whole lives whole
    /// through the step: that cuts what a replica holds between steps, not its peak. A model
    /// that recomputes its units gathers each as it runs it (`gather_units`), and then the
    /// step holds the replica's part and one unit.
    Parameters,
}

impl ShardState {
    /// Every setting.
    pub const ALL: [ShardState; 4] = [
        ShardState::None,
        ShardState::Optimizer,
        ShardState::Gradients,
        ShardState::Parameters,
    ];

    /// Their names, as [`ShardState::ALL`] lists them.
    pub const ALL_NAMES: [&'static str; 4] = [
        Self::ALL[0].name(),
        Self::ALL[1].name(),
        Self::ALL[2].name(),
        Self::ALL[3].name(),
    ];

    /// The name configs and command lines use.
    pub const fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Optimizer => "optimizer",
            Self::Gradients => "gradients",
            Self::Parameters => "parameters",
        }
    }

    /// Whether each replica keeps the optimizer state of its own parameters only.
    pub const fn splits_optimizer(self) -> bool {
        !matches!(self, Self::None)
    }

    /// Whether each replica receives the reduced gradients of its own parameters only.
    pub const fn splits_gradients(self) -> bool {
        matches!(self, Self::Gradients | Self::Parameters)
    }

    /// Whether each replica holds only its own trainable parameters between steps.
    pub const fn splits_parameters(self) -> bool {
        matches!(self, Self::Parameters)
    }

    /// DeepSpeed's number for the stage: 0 to 3.
    pub const fn zero_stage(self) -> u8 {
        match self {
            Self::None => 0,
            Self::Optimizer => 1,
            Self::Gradients => 2,
            Self::Parameters => 3,
        }
    }
}

impl std::fmt::Display for ShardState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ShardState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|state| state.name() == s)
            .ok_or_else(|| {
                format!("unknown shard_state {s:?}; use none, optimizer, gradients or parameters")
            })
    }
}
