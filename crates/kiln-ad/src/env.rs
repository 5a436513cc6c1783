//! Dark Room (Laskin et al., 2022): a dark square room with one invisible goal cell.
//!
//! The agent starts every episode at the centre, sees only its own `(x, y)`, and receives a
//! reward of 1 on every step it ends on the goal. Nothing in an observation says where the goal
//! is, so a policy that improves across episodes must remember earlier rewards: that memory is
//! what Algorithm Distillation learns to keep in context.

use serde::{Deserialize, Serialize};

/// Actions, in the order of their ids: up, down, left, right, stay.
pub const ACTIONS: usize = 5;

/// The room's geometry and episode length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DarkRoomConfig {
    /// Cells per side (odd, so the room has a centre).
    pub size: u8,
    /// Steps per episode.
    pub horizon: usize,
}

impl Default for DarkRoomConfig {
    fn default() -> Self {
        Self {
            size: 9,
            horizon: 20,
        }
    }
}

/// A cell of the room, `(x, y)` with `0 ≤ x, y < size`.
pub type Cell = (u8, u8);

impl DarkRoomConfig {
    /// Every cell, row-major: the possible goals.
    pub fn cells(&self) -> Vec<Cell> {
        (0..self.size)
            .flat_map(|y| (0..self.size).map(move |x| (x, y)))
            .collect()
    }

    /// Where every episode starts.
    pub fn centre(&self) -> Cell {
        (self.size / 2, self.size / 2)
    }

    /// The cell reached by taking `action` in `cell`; walls stop the agent.
    ///
    /// # Panics
    /// On an action id `≥ ACTIONS`, which is a bug in the caller.
    pub fn moved(&self, (x, y): Cell, action: u8) -> Cell {
        let last = self.size - 1;
        match action {
            0 => (x, (y + 1).min(last)),
            1 => (x, y.saturating_sub(1)),
            2 => (x.saturating_sub(1), y),
            3 => ((x + 1).min(last), y),
            4 => (x, y),
            _ => panic!("action {action} is not one of the {ACTIONS} Dark Room actions"),
        }
    }

    /// Index of `cell` in `0..size²`, for tables over states.
    pub fn index(&self, (x, y): Cell) -> usize {
        usize::from(y) * usize::from(self.size) + usize::from(x)
    }

    /// The best return of an episode with the goal at `goal`: walk straight there, then stay.
    pub fn optimal_return(&self, goal: Cell) -> usize {
        let (cx, cy) = self.centre();
        let distance = usize::from(goal.0.abs_diff(cx)) + usize::from(goal.1.abs_diff(cy));
        // Reward is paid for the step that arrives and every step after.
        (self.horizon + 1).saturating_sub(distance.max(1))
    }
}

/// One Dark Room with a fixed goal, stepping one agent through consecutive episodes.
#[derive(Debug, Clone)]
pub struct DarkRoom {
    config: DarkRoomConfig,
    goal: Cell,
    cell: Cell,
    step: usize,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The cell after the move.
    pub cell: Cell,
    /// 1 when that cell is the goal.
    pub reward: u8,
    /// Whether this step ended the episode (the room is already reset for the next one).
    pub episode_done: bool,
}

impl DarkRoom {
    /// A room with its goal at `goal`, the agent at the centre.
    pub fn new(config: DarkRoomConfig, goal: Cell) -> Self {
        Self {
            config,
            goal,
            cell: config.centre(),
            step: 0,
        }
    }

    /// What the agent observes now: its cell.
    pub fn observation(&self) -> Cell {
        self.cell
    }

    /// The goal (hidden from the agent).
    pub fn goal(&self) -> Cell {
        self.goal
    }

    /// Takes `action`. After the last step of an episode the agent is put back at the centre,
    /// so `observation` is already the next episode's first.
    pub fn step(&mut self, action: u8) -> Transition {
        let cell = self.config.moved(self.cell, action);
        let reward = u8::from(cell == self.goal);
        self.step += 1;
        let episode_done = self.step == self.config.horizon;
        if episode_done {
            self.step = 0;
            self.cell = self.config.centre();
        } else {
            self.cell = cell;
        }
        Transition {
            cell,
            reward,
            episode_done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walls_stop_the_agent_and_actions_move_one_cell() {
        let room = DarkRoomConfig::default();
        assert_eq!(room.moved((4, 4), 0), (4, 5));
        assert_eq!(room.moved((4, 4), 1), (4, 3));
        assert_eq!(room.moved((4, 4), 2), (3, 4));
        assert_eq!(room.moved((4, 4), 3), (5, 4));
        assert_eq!(room.moved((4, 4), 4), (4, 4));
        assert_eq!(room.moved((0, 0), 1), (0, 0));
        assert_eq!(room.moved((0, 0), 2), (0, 0));
        assert_eq!(room.moved((8, 8), 0), (8, 8));
        assert_eq!(room.moved((8, 8), 3), (8, 8));
    }

    #[test]
    fn reward_on_every_step_spent_on_the_goal_and_reset_after_the_horizon() {
        let config = DarkRoomConfig::default();
        let mut room = DarkRoom::new(config, (4, 6));
        let mut rewards = Vec::new();
        for t in 0..config.horizon {
            let action = if t < 2 { 0 } else { 4 };
            let tr = room.step(action);
            rewards.push(tr.reward);
            assert_eq!(tr.episode_done, t + 1 == config.horizon);
        }
        // Two steps to arrive, then on the goal for the remaining 18 steps.
        assert_eq!(rewards.iter().map(|&r| usize::from(r)).sum::<usize>(), 19);
        assert_eq!(rewards[0], 0);
        assert_eq!(room.observation(), config.centre());
        assert_eq!(config.optimal_return((4, 6)), 19);
        assert_eq!(config.optimal_return((4, 4)), 20);
    }
}
