//! The source algorithm: tabular Q-learning with ε decaying over the history, run for many
//! agents in lockstep. Its learning histories are what Algorithm Distillation imitates.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::env::{ACTIONS, Cell, DarkRoom, DarkRoomConfig};
use crate::error::AdError;
use crate::history::Histories;

/// Q-learning settings and how many histories to record.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QLearningConfig {
    /// Learning histories per training goal (each a fresh agent with its own seed).
    pub histories_per_goal: usize,
    /// Episodes per history.
    pub episodes: usize,
    /// Step size α of the temporal-difference update.
    pub learning_rate: f64,
    /// Discount γ.
    pub discount: f64,
    /// Initial value of every Q entry; above 0 is optimistic and drives exploration.
    pub initial_q: f64,
    /// ε of the first episode.
    pub epsilon_start: f64,
    /// ε reached at `decay_fraction` of the history and kept after.
    pub epsilon_end: f64,
    /// Fraction of the history over which ε decays linearly.
    pub decay_fraction: f64,
    /// After each episode, replay its transitions backwards through the same update, so a
    /// reward reaches the start of the path at once instead of one step per visit
    /// (episodic backward update).
    pub backward_replay: bool,
    /// Training histories keep every `subsample`-th episode of an agent that learns for
    /// `episodes × subsample` episodes, its ε decaying over the same fraction of them: the
    /// learning the model sees is `subsample` times faster than the source's own (Laskin et
    /// al.'s subsampled histories). 1 keeps every episode. The evaluation's Q-learning runs
    /// its `episodes` unsampled.
    pub subsample: usize,
}

impl Default for QLearningConfig {
    fn default() -> Self {
        Self {
            histories_per_goal: 16,
            episodes: 40,
            learning_rate: 1.0,
            discount: 0.9,
            initial_q: 1.0,
            epsilon_start: 1.0,
            epsilon_end: 0.0,
            decay_fraction: 0.25,
            backward_replay: true,
            // Every other episode: over training seeds 1-3, AD's last-10 mean rose from 10.29
            // to 11.99 and its 40-episode mean from 0.86 to 1.00 of the source's (the book's
            // AD page, "How the defaults were chosen").
            subsample: 2,
        }
    }
}

impl QLearningConfig {
    /// ε during `episode` (0-based) of the history.
    pub fn epsilon(&self, episode: usize) -> f64 {
        self.epsilon_at(episode as f64)
    }

    /// ε at `episode` of the history, which may fall between two recorded episodes (a
    /// subsampled history's agent runs several for each).
    fn epsilon_at(&self, episode: f64) -> f64 {
        let decay_episodes = self.decay_fraction * self.episodes as f64;
        let progress = if decay_episodes > 0.0 {
            (episode / decay_episodes).min(1.0)
        } else {
            1.0
        };
        self.epsilon_start + (self.epsilon_end - self.epsilon_start) * progress
    }

    /// Checks every field.
    ///
    /// # Errors
    /// The first field out of its range.
    pub fn validate(&self) -> Result<(), AdError> {
        let unit = |name: &'static str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(AdError::OutOfRange {
                    field: name,
                    value: v,
                    range: "[0, 1]",
                })
            }
        };
        unit("source.learning_rate", self.learning_rate)?;
        unit("source.discount", self.discount)?;
        unit("source.epsilon_start", self.epsilon_start)?;
        unit("source.epsilon_end", self.epsilon_end)?;
        unit("source.decay_fraction", self.decay_fraction)?;
        if self.histories_per_goal == 0 || self.episodes == 0 {
            return Err(AdError::EmptyHistories);
        }
        if self.subsample == 0 {
            return Err(AdError::Zero("source.subsample"));
        }
        if !self.initial_q.is_finite() {
            return Err(AdError::OutOfRange {
                field: "source.initial_q",
                value: self.initial_q,
                range: "finite numbers",
            });
        }
        Ok(())
    }
}

/// One Q-learning agent: its table over (cell, action), its room and its random stream.
struct Agent {
    q: Vec<f64>,
    room: DarkRoom,
    rng: StdRng,
    /// This episode's transitions `(cell, action, reward, next cell)`, for the replay.
    episode: Vec<(usize, u8, u8, usize)>,
}

impl Agent {
    /// ε-greedy action; ties between greedy actions are broken at random, so an untrained
    /// agent does not march in one direction.
    fn act(&mut self, room: &DarkRoomConfig, cell: Cell, epsilon: f64) -> u8 {
        if self.rng.random::<f64>() < epsilon {
            return self.rng.random_range(0..ACTIONS as u8);
        }
        let row = &self.q[room.index(cell) * ACTIONS..][..ACTIONS];
        let best = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let ties = row.iter().filter(|&&v| v == best).count();
        let mut pick = self.rng.random_range(0..ties);
        for (a, &v) in row.iter().enumerate() {
            if v == best {
                if pick == 0 {
                    return a as u8;
                }
                pick -= 1;
            }
        }
        unreachable!("the maximum of a row is in the row")
    }

    fn learn(&mut self, config: &QLearningConfig, (s, a, r, next): (usize, u8, u8, usize)) {
        let next_best = self.q[next * ACTIONS..][..ACTIONS]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let q = &mut self.q[s * ACTIONS + usize::from(a)];
        // The episode ends on a time limit the agent cannot observe, so the last step
        // bootstraps like any other (the state carries no clock).
        *q += config.learning_rate * (f64::from(r) + config.discount * next_best - *q);
    }
}

/// Runs one fresh Q-learning agent per entry of `goals` for `config.episodes × subsample`
/// episodes and records every step of every `subsample`-th episode (the last of each run of
/// `subsample`), `config.episodes` in all.
///
/// Agents step in lockstep, one episode step for all at a time, spread over Rayon's threads;
/// agent `i` draws from its own generator seeded by `(seed, i)`, so the histories depend on the
/// seed only, not on the thread count.
pub fn run_q_learning(
    room: DarkRoomConfig,
    goals: &[Cell],
    config: &QLearningConfig,
    subsample: usize,
    seed: u64,
) -> Histories {
    let subsample = subsample.max(1);
    let mut agents: Vec<Agent> = goals
        .iter()
        .enumerate()
        .map(|(i, &goal)| Agent {
            q: vec![config.initial_q; usize::from(room.size).pow(2) * ACTIONS],
            room: DarkRoom::new(room, goal),
            rng: StdRng::seed_from_u64(agent_seed(seed, i)),
            episode: Vec::with_capacity(room.horizon),
        })
        .collect();
    let mut histories = Histories::with_goals(room, config.episodes, goals.to_vec());
    let mut steps = vec![(0u8, 0u8, (0u8, 0u8)); agents.len()];
    for run in 0..config.episodes * subsample {
        let epsilon = config.epsilon_at(run as f64 / subsample as f64);
        let (episode, recorded) = (run / subsample, run % subsample == subsample - 1);
        for t in 0..room.horizon {
            agents
                .par_iter_mut()
                .zip(steps.par_iter_mut())
                .for_each(|(agent, step)| {
                    let cell = agent.room.observation();
                    let action = agent.act(&room, cell, epsilon);
                    let tr = agent.room.step(action);
                    let transition = (room.index(cell), action, tr.reward, room.index(tr.cell));
                    agent.learn(config, transition);
                    if config.backward_replay {
                        agent.episode.push(transition);
                        if tr.episode_done {
                            for t in std::mem::take(&mut agent.episode).into_iter().rev() {
                                agent.learn(config, t);
                            }
                        }
                    }
                    *step = (action, tr.reward, cell);
                });
            if recorded {
                let at = episode * room.horizon + t;
                for (h, &(action, reward, cell)) in steps.iter().enumerate() {
                    histories.record(h, at, cell, action, reward);
                }
            }
        }
    }
    histories
}

/// Learning histories for every goal in `goals`, `histories_per_goal` each.
pub fn learning_histories(
    room: DarkRoomConfig,
    goals: &[Cell],
    config: &QLearningConfig,
    seed: u64,
) -> Histories {
    let per_goal: Vec<Cell> = goals
        .iter()
        .flat_map(|&g| std::iter::repeat_n(g, config.histories_per_goal))
        .collect();
    run_q_learning(room, &per_goal, config, config.subsample, seed)
}

/// A well-mixed seed for agent `i`, so neighbouring agents' streams are unrelated.
pub(crate) fn agent_seed(seed: u64, i: usize) -> u64 {
    let mut z = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histories_are_deterministic_and_learn() {
        let room = DarkRoomConfig::default();
        let goals: Vec<Cell> = room.cells();
        let config = QLearningConfig::default();
        let a = learning_histories(room, &goals, &config, 3);
        let b = learning_histories(room, &goals, &config, 3);
        assert_eq!(a, b);
        let curve = a.mean_episode_returns();
        eprintln!(
            "{:?}",
            curve.iter().map(|r| format!("{r:.1}")).collect::<Vec<_>>()
        );
        let early: f64 = curve[..10].iter().sum::<f64>() / 10.0;
        let late: f64 = curve[curve.len() - 10..].iter().sum::<f64>() / 10.0;
        assert!(
            late > 3.0 * early && late > 10.0,
            "early {early}, late {late}"
        );
    }

    #[test]
    fn a_subsampled_history_records_every_other_episode_of_a_run_twice_as_long() {
        let room = DarkRoomConfig::default();
        let goals = [(1, 2), (7, 3), (4, 4)];
        let config = QLearningConfig {
            episodes: 6,
            ..QLearningConfig::default()
        };
        let long = QLearningConfig {
            episodes: 12,
            ..config
        };
        // ε decays over the same share of the run, so the agents act alike step for step.
        let every = run_q_learning(room, &goals, &long, 1, 5);
        let sampled = run_q_learning(room, &goals, &config, 2, 5);
        assert_eq!(sampled.len(), 6 * room.horizon);
        for h in 0..goals.len() {
            let (all, kept) = (every.episode_returns(h), sampled.episode_returns(h));
            for e in 0..6 {
                assert_eq!(kept[e], all[2 * e + 1], "history {h}, episode {e}");
                for t in 0..room.horizon {
                    let (at, from) = (e * room.horizon + t, (2 * e + 1) * room.horizon + t);
                    assert_eq!(sampled.action(h, at), every.action(h, from));
                }
            }
        }
    }
}
