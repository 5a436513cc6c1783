//! In-context evaluation: the frozen model acts on held-out goals for many consecutive
//! episodes, next to a random policy and the source algorithm on the same goals.

use burn::tensor::TensorData;
use burn::tensor::activation::softmax;
use kiln_core::data::dense_tensor;
use kiln_kernels::KernelBackend;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::dataset::{encode, feature_width};
use crate::env::{ACTIONS, Cell, DarkRoom, DarkRoomConfig};
use crate::history::{NO_ACTION, NO_REWARD, Token};
use crate::model::AdTransformer;
use crate::source::{QLearningConfig, run_q_learning};

/// How the evaluation runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Consecutive episodes per goal and seed.
    pub episodes: usize,
    /// Independent runs per held-out goal. A run's later returns are close to all or nothing
    /// (it found the goal or it did not), so few runs make a noisy mean: the source's last-10
    /// mean on the same goals read 12.90 with 4 runs per goal and 11.10 with 20.
    pub seeds: usize,
    /// Softmax temperature of the sampled actions (1 samples the model's distribution).
    pub temperature: f64,
    /// Compute each step's keys and values once and keep them (one new step per forward),
    /// instead of re-encoding the whole window at every step. Both compute the same actions;
    /// `false` is the plain path the cache is tested against.
    pub kv_cache: bool,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            episodes: 40,
            seeds: 20,
            temperature: 1.0,
            kv_cache: true,
        }
    }
}

/// How many of the latest steps a full window keeps when the next step arrives: all but the
/// oldest episode (`context − horizon`), or half the context when an episode does not fit.
///
/// The window does not slide one step at a time. With learned absolute positions every
/// cached key and value depends on its position in the window and, past the first layer, on
/// every step before it in the window, so a window that drops its oldest step changes them
/// all and nothing cached could be reused. Dropping an episode at once keeps every window
/// between `keep` and `context` steps long, like the training windows' prefixes, and costs
/// one re-encoding of `keep` steps per dropped episode instead of one per step.
pub fn window_keep(context: usize, horizon: usize) -> usize {
    if horizon < context {
        context - horizon
    } else {
        (context / 2).max(1)
    }
}

/// What the model remembers between episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// The context runs on across episode boundaries, as in the training windows.
    AcrossEpisodes,
    /// The context is cleared at every episode start: the control, which can only improve
    /// across episodes if it memorised goals instead of learning in context.
    OneEpisode,
}

/// Return per episode, averaged over goals × seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// Mean return of episode 1, 2, ….
    pub returns: Vec<f64>,
    /// Mean return of episode 1.
    pub first: f64,
    /// Mean return over the last 10 episodes (all of them when fewer).
    pub last10: f64,
    /// Mean return over all episodes.
    pub mean: f64,
}

impl Curve {
    /// Summarises per-episode means.
    pub fn new(returns: Vec<f64>) -> Self {
        let mean_of = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
        let tail = &returns[returns.len().saturating_sub(10)..];
        Self {
            first: returns.first().copied().unwrap_or(0.0),
            last10: mean_of(tail),
            mean: mean_of(&returns),
            returns,
        }
    }

    /// Averages `[run][episode]` returns over runs.
    fn from_runs(runs: &[Vec<f64>]) -> Self {
        let episodes = runs.first().map_or(0, Vec::len);
        Self::new(
            (0..episodes)
                .map(|e| runs.iter().map(|r| r[e]).sum::<f64>() / runs.len() as f64)
                .collect(),
        )
    }
}

/// One evaluation run per (goal, seed), goal-major: goal `i / seeds`.
fn runs(goals: &[Cell], seeds: usize) -> impl Iterator<Item = (usize, Cell)> + '_ {
    goals
        .iter()
        .flat_map(move |&g| std::iter::repeat_n(g, seeds))
        .enumerate()
}

/// The model acting in context on `goals` of `room` as `config` says, its runs seeded from
/// `seed`: all runs step in lockstep, so every step is one batched forward pass over the runs'
/// windows (their latest steps, or the current episode's; see [`window_keep`] for what a full
/// window keeps). With `config.kv_cache` that pass takes only the newest step and reads the
/// earlier steps' keys and values from a cache, re-encoding the window only after it was
/// cut or cleared.
///
/// `on_step` is called after every environment step with the steps done so far.
#[allow(clippy::too_many_arguments)] // the run's whole description, each used once
pub fn in_context<B: KernelBackend>(
    model: &AdTransformer<B>,
    room: DarkRoomConfig,
    config: &EvalConfig,
    seed: u64,
    goals: &[Cell],
    memory: Memory,
    device: &B::Device,
    on_step: &mut dyn FnMut(usize),
) -> Curve {
    let context = model.context();
    let keep = window_keep(context, room.horizon);
    let width = feature_width(&room);
    let mut envs: Vec<(DarkRoom, StdRng)> = runs(goals, config.seeds)
        .map(|(i, g)| (DarkRoom::new(room, g), StdRng::seed_from_u64(mix(seed, i))))
        .collect();
    let n = envs.len();
    let fresh = |env: &DarkRoom| Token {
        x: env.observation().0,
        y: env.observation().1,
        prev_action: NO_ACTION,
        prev_reward: NO_REWARD,
    };
    let mut tokens: Vec<Vec<Token>> = envs.iter().map(|(env, _)| vec![fresh(env)]).collect();
    let mut returns = vec![vec![0.0; config.episodes]; n];
    let mut cache = model.cache();
    // Every run's window has the same length: they start together, episodes have a fixed
    // horizon, and they are cut and cleared at the same steps.
    let mut window_changed = true;
    for step in 0..config.episodes * room.horizon {
        let episode = step / room.horizon;
        let len = tokens[0].len();
        if window_changed || !config.kv_cache {
            cache = model.cache();
        }
        let new = cache.len()..len;
        let mut features = vec![0.0f32; n * new.len() * width];
        for (run, features) in tokens
            .iter()
            .zip(features.chunks_exact_mut(new.len() * width))
        {
            for (&token, features) in run[new.clone()]
                .iter()
                .zip(features.chunks_exact_mut(width))
            {
                encode(&room, token, features);
            }
        }
        let input =
            dense_tensor::<B, 3, _>(TensorData::new(features, [n, new.len(), width]), device);
        let last = model
            .forward_cached(input, &mut cache)
            .slice([0..n, new.len() - 1..new.len()])
            .reshape([n, ACTIONS]);
        let probs = softmax(last / config.temperature, 1)
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .expect("f32 probabilities");
        window_changed = false;
        for (i, ((env, rng), run)) in envs.iter_mut().zip(&mut tokens).enumerate() {
            let action = sample(&probs[i * ACTIONS..(i + 1) * ACTIONS], rng);
            let tr = env.step(action);
            returns[i][episode] += f64::from(tr.reward);
            let next = if tr.episode_done && memory == Memory::OneEpisode {
                run.clear();
                window_changed = true;
                fresh(env)
            } else {
                Token {
                    x: env.observation().0,
                    y: env.observation().1,
                    prev_action: action,
                    prev_reward: tr.reward,
                }
            };
            run.push(next);
            if run.len() > context {
                run.drain(..run.len() - keep);
                window_changed = true;
            }
        }
        on_step(step + 1);
    }
    Curve::from_runs(&returns)
}

/// A uniformly random policy on the same runs.
pub fn random_policy(
    room: DarkRoomConfig,
    goals: &[Cell],
    config: &EvalConfig,
    seed: u64,
) -> Curve {
    let returns: Vec<Vec<f64>> = runs(goals, config.seeds)
        .map(|(i, g)| {
            let mut env = DarkRoom::new(room, g);
            let mut rng = StdRng::seed_from_u64(mix(seed, i));
            (0..config.episodes)
                .map(|_| {
                    (0..room.horizon)
                        .map(|_| f64::from(env.step(rng.random_range(0..ACTIONS as u8)).reward))
                        .sum()
                })
                .collect()
        })
        .collect();
    Curve::from_runs(&returns)
}

/// The source algorithm learning from scratch on the same runs, with its own ε schedule,
/// over its first `config.episodes` episodes (fewer when its histories are shorter).
pub fn source_algorithm(
    room: DarkRoomConfig,
    goals: &[Cell],
    source: &QLearningConfig,
    config: &EvalConfig,
    seed: u64,
) -> Curve {
    let goals: Vec<Cell> = runs(goals, config.seeds).map(|(_, g)| g).collect();
    // The source as it learns, unsampled: what AD is measured against.
    let histories = run_q_learning(room, &goals, source, 1, seed);
    let runs: Vec<Vec<f64>> = (0..histories.count())
        .map(|h| {
            let mut r = histories.episode_returns(h);
            r.truncate(config.episodes);
            r
        })
        .collect();
    Curve::from_runs(&runs)
}

/// Mean best return over the goals: the ceiling of every curve.
pub fn optimal_return(room: DarkRoomConfig, goals: &[Cell]) -> f64 {
    goals
        .iter()
        .map(|&g| room.optimal_return(g) as f64)
        .sum::<f64>()
        / goals.len().max(1) as f64
}

fn sample(probs: &[f32], rng: &mut StdRng) -> u8 {
    let mut u = rng.random::<f32>() * probs.iter().sum::<f32>();
    for (a, &p) in probs.iter().enumerate() {
        if u < p {
            return a as u8;
        }
        u -= p;
    }
    // Rounding left `u` just above the last bucket.
    (probs.len() - 1) as u8
}

/// Seed of evaluation run `i`: distinct from the source's training agents' streams.
fn mix(seed: u64, i: usize) -> u64 {
    crate::source::agent_seed(seed ^ 0xE7A1_0000_0000_0000, i)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::Param;
    use burn::tensor::{Distribution, Tensor};

    use super::*;
    use crate::model::AdModelConfig;

    /// An untrained model whose positions matter as much as its inputs (the initial std of
    /// 0.02 would hide a cache that put a step at the wrong position).
    fn model(context: usize) -> AdTransformer<Flex> {
        let device = Default::default();
        let config = AdModelConfig {
            context,
            ..AdModelConfig::default()
        };
        let mut model = config.init::<Flex>(&DarkRoomConfig::default(), &device);
        model.positions = Param::from_tensor(Tensor::random(
            [context, config.d_model],
            Distribution::Normal(0.0, 1.0),
            &device,
        ));
        model
    }

    /// Steps fed one at a time through the cache give the logits of the whole window.
    #[test]
    fn cached_steps_equal_the_whole_window() {
        let model = model(12);
        let device = Default::default();
        let width = feature_width(&DarkRoomConfig::default());
        let features =
            Tensor::<Flex, 3>::random([3, 12, width], Distribution::Bernoulli(0.2), &device);
        let full = model.forward(features.clone());
        let mut cache = model.cache();
        let mut parts = vec![model.forward_cached(features.clone().narrow(1, 0, 5), &mut cache)];
        for t in 5..12 {
            parts.push(model.forward_cached(features.clone().narrow(1, t, 1), &mut cache));
        }
        assert_eq!(cache.len(), 12);
        let cached = Tensor::cat(parts, 1);
        let (full, cached) = (
            full.into_data().to_vec::<f32>().unwrap(),
            cached.into_data().to_vec::<f32>().unwrap(),
        );
        let scale = full.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in cached.iter().zip(&full).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "logit {i}: cached {a}, whole window {b}"
            );
        }
    }

    /// The cached evaluation takes the same actions as the one that re-encodes the window at
    /// every step: equal curves, across a window that fills, is cut and refills, and with
    /// the one-episode control that clears it.
    #[test]
    fn cached_evaluation_equals_the_uncached_one() {
        let model = model(30);
        let room = DarkRoomConfig::default();
        let goals = [(1, 7), (6, 2)];
        let device = Default::default();
        for memory in [Memory::AcrossEpisodes, Memory::OneEpisode] {
            let curve = |kv_cache| {
                let config = EvalConfig {
                    episodes: 5,
                    seeds: 3,
                    temperature: 1.0,
                    kv_cache,
                };
                in_context(
                    &model,
                    room,
                    &config,
                    9,
                    &goals,
                    memory,
                    &device,
                    &mut |_| {},
                )
            };
            assert_eq!(curve(true), curve(false), "{memory:?}");
        }
    }

    #[test]
    fn a_full_window_keeps_all_but_its_oldest_episode() {
        assert_eq!(window_keep(60, 20), 40);
        assert_eq!(window_keep(20, 20), 10);
        assert_eq!(window_keep(1, 20), 1);
    }

    #[test]
    fn curve_summaries() {
        let c = Curve::new((1..=20).map(f64::from).collect());
        assert_eq!(c.first, 1.0);
        assert_eq!(c.last10, 15.5);
        assert_eq!(c.mean, 10.5);
    }

    #[test]
    fn random_policy_rarely_finds_far_goals() {
        let room = DarkRoomConfig::default();
        let config = EvalConfig::default();
        let far = random_policy(room, &[(0, 0), (8, 8)], &config, 1);
        let here = random_policy(room, &[(4, 4)], &config, 1);
        assert!(far.mean < 0.5, "{}", far.mean);
        assert!(
            here.mean > 2.0 * far.mean.max(0.1),
            "{} vs {}",
            here.mean,
            far.mean
        );
    }
}
