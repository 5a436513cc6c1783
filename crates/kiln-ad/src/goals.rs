//! The fixed, seeded split of Dark Room's goals into training goals and held-out goals.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::env::{Cell, DarkRoomConfig};
use crate::error::AdError;

/// How goals are split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GoalSplitConfig {
    /// Goals never seen in training, on which the model is evaluated.
    pub held_out: usize,
    /// Seed of the split (independent of the training seed, so runs share one split).
    pub seed: u64,
}

impl Default for GoalSplitConfig {
    fn default() -> Self {
        Self {
            held_out: 10,
            seed: 2022,
        }
    }
}

/// Training goals and held-out goals; disjoint, together every cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoalSplit {
    /// Goals with learning histories in the data set.
    pub train: Vec<Cell>,
    /// Goals for evaluation only.
    pub held_out: Vec<Cell>,
}

impl GoalSplit {
    /// Shuffles every cell of `room` with `config.seed` and holds out the first
    /// `config.held_out`; each list is sorted so reports read in a stable order.
    ///
    /// # Errors
    /// When the split would leave no goal on one side.
    pub fn new(room: &DarkRoomConfig, config: &GoalSplitConfig) -> Result<Self, AdError> {
        let mut cells = room.cells();
        if config.held_out == 0 || config.held_out >= cells.len() {
            return Err(AdError::HeldOut {
                held_out: config.held_out,
                goals: cells.len(),
            });
        }
        cells.shuffle(&mut StdRng::seed_from_u64(config.seed));
        let mut train = cells.split_off(config.held_out);
        let mut held_out = cells;
        train.sort_unstable();
        held_out.sort_unstable();
        Ok(Self { train, held_out })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_disjoint_complete_and_seeded() {
        let room = DarkRoomConfig::default();
        let config = GoalSplitConfig::default();
        let split = GoalSplit::new(&room, &config).unwrap();
        assert_eq!(split.held_out.len(), 10);
        assert_eq!(split.train.len(), 71);
        assert!(split.held_out.iter().all(|g| !split.train.contains(g)));
        assert_eq!(split, GoalSplit::new(&room, &config).unwrap());
        let other = GoalSplit::new(&room, &GoalSplitConfig { seed: 7, ..config }).unwrap();
        assert_ne!(split.held_out, other.held_out);
    }

    #[test]
    fn empty_sides_are_rejected() {
        let room = DarkRoomConfig::default();
        for held_out in [0, 81, 100] {
            let config = GoalSplitConfig { held_out, seed: 1 };
            assert!(GoalSplit::new(&room, &config).is_err());
        }
    }
}
