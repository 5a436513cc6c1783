//! Learning histories: every step an RL algorithm took while it learned, episode after episode.

use crate::env::{ACTIONS, Cell, DarkRoomConfig};

/// The "previous action" of a history's very first step, which has none.
pub const NO_ACTION: u8 = ACTIONS as u8;
/// The "previous reward" of a history's very first step.
pub const NO_REWARD: u8 = 2;

/// Many learning histories of equal length, stored field by field.
///
/// Step `t` of history `h` is at `h * len + t`: the agent observed `cell`, took `action`, and
/// received `reward`. Episodes follow each other without a gap, `horizon` steps each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histories {
    room: DarkRoomConfig,
    len: usize,
    goals: Vec<Cell>,
    x: Vec<u8>,
    y: Vec<u8>,
    action: Vec<u8>,
    reward: Vec<u8>,
}

/// One step of a history as the model reads it: what it sees and what it must predict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    /// Column of the observed cell.
    pub x: u8,
    /// Row of the observed cell.
    pub y: u8,
    /// The action before this step ([`NO_ACTION`] at a history's start).
    pub prev_action: u8,
    /// The reward before this step ([`NO_REWARD`] at a history's start).
    pub prev_reward: u8,
}

impl Histories {
    /// Empty histories of `episodes` episodes for `goals` (one history per entry).
    pub fn with_goals(room: DarkRoomConfig, episodes: usize, goals: Vec<Cell>) -> Self {
        let len = episodes * room.horizon;
        let total = len * goals.len();
        Self {
            room,
            len,
            goals,
            x: vec![0; total],
            y: vec![0; total],
            action: vec![0; total],
            reward: vec![0; total],
        }
    }

    /// Records step `t` of history `h`.
    pub fn record(&mut self, h: usize, t: usize, cell: Cell, action: u8, reward: u8) {
        let i = h * self.len + t;
        (self.x[i], self.y[i], self.action[i], self.reward[i]) = (cell.0, cell.1, action, reward);
    }

    /// The room the histories were made in.
    pub fn room(&self) -> &DarkRoomConfig {
        &self.room
    }

    /// Number of histories.
    pub fn count(&self) -> usize {
        self.goals.len()
    }

    /// Steps per history.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the histories hold no step.
    pub fn is_empty(&self) -> bool {
        self.len == 0 || self.goals.is_empty()
    }

    /// The goal of history `h`.
    pub fn goal(&self, h: usize) -> Cell {
        self.goals[h]
    }

    /// The model's input at step `t` of history `h`.
    pub fn token(&self, h: usize, t: usize) -> Token {
        let i = h * self.len + t;
        let (prev_action, prev_reward) = if t == 0 {
            (NO_ACTION, NO_REWARD)
        } else {
            (self.action[i - 1], self.reward[i - 1])
        };
        Token {
            x: self.x[i],
            y: self.y[i],
            prev_action,
            prev_reward,
        }
    }

    /// The action taken at step `t` of history `h`: the model's target.
    pub fn action(&self, h: usize, t: usize) -> u8 {
        self.action[h * self.len + t]
    }

    /// Return of every episode of history `h`.
    pub fn episode_returns(&self, h: usize) -> Vec<f64> {
        let start = h * self.len;
        self.reward[start..start + self.len]
            .chunks(self.room.horizon)
            .map(|episode| episode.iter().map(|&r| f64::from(r)).sum())
            .collect()
    }

    /// Return of every episode, averaged over all histories.
    pub fn mean_episode_returns(&self) -> Vec<f64> {
        let mut mean = vec![0.0; self.len / self.room.horizon.max(1)];
        for h in 0..self.count() {
            for (m, r) in mean.iter_mut().zip(self.episode_returns(h)) {
                *m += r / self.count() as f64;
            }
        }
        mean
    }
}
