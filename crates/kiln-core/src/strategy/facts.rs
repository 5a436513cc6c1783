//! The facts of a step that cross ranks (each rank's loss, samples, times and running totals)
//! go through the world's collective, so that every process learns every rank's, whether the
//! ranks are threads of one process or live in many.
//!
//! A rank encodes its facts as whole numbers (a loss as its `f64` bits, times in nanoseconds)
//! and splits each into 16-bit pieces, which an `f32` holds exactly: one all-gather of a few
//! dozen floats per step, with nothing rounded.

use std::time::Duration;

use burn::tensor::{Tensor, backend::Backend};

use super::RankStats;
use crate::collective::{Collective, CollectiveCounters, CollectiveError};
use crate::params::{floats_to_hashes, hashes_to_floats};
use crate::tensor_parallel::TpTraffic;

/// What one rank did in a step (or at start-up), as every rank learns it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RankFacts {
    /// `Σ n · loss` over the samples the rank scored.
    pub loss_sum: f64,
    /// Samples the rank scored.
    pub samples: usize,
    /// Time in forward, backward and optimizer.
    pub compute: Duration,
    /// Time synchronising.
    pub communication: Duration,
    /// The rank's running totals.
    pub stats: RankStats,
    /// Whether the rank's process asked to stop.
    pub stop: bool,
}

const FIELDS: usize = 23;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl RankFacts {
    fn encode(&self) -> [u64; FIELDS] {
        let s = &self.stats;
        [
            self.loss_sum.to_bits(),
            self.samples as u64,
            nanos(self.compute),
            nanos(self.communication),
            s.rank as u64,
            s.steps,
            s.samples,
            nanos(s.compute),
            nanos(s.communication),
            s.collective.calls,
            s.collective.elements,
            nanos(s.idle),
            s.peak_live_micro_batches as u64,
            s.peak_activation_bytes,
            s.param_bytes,
            s.grad_bytes,
            s.optimizer_bytes,
            s.shard_traffic.calls,
            s.shard_traffic.elements,
            nanos(s.shard_traffic.time),
            u64::from(self.stop),
            // 0 for "not counted", else one more than the bytes.
            s.peak_bytes.map_or(0, |b| b + 1),
            s.held_bytes.map_or(0, |b| b + 1),
        ]
    }

    fn decode(w: &[u64]) -> Self {
        let d = Duration::from_nanos;
        Self {
            loss_sum: f64::from_bits(w[0]),
            samples: w[1] as usize,
            compute: d(w[2]),
            communication: d(w[3]),
            stats: RankStats {
                rank: w[4] as usize,
                steps: w[5],
                samples: w[6],
                compute: d(w[7]),
                communication: d(w[8]),
                collective: CollectiveCounters {
                    calls: w[9],
                    elements: w[10],
                },
                idle: d(w[11]),
                peak_live_micro_batches: w[12] as usize,
                peak_activation_bytes: w[13],
                param_bytes: w[14],
                grad_bytes: w[15],
                optimizer_bytes: w[16],
                shard_traffic: TpTraffic {
                    calls: w[17],
                    elements: w[18],
                    time: d(w[19]),
                },
                peak_bytes: w[21].checked_sub(1),
                held_bytes: w[22].checked_sub(1),
            },
            stop: w[20] != 0,
        }
    }
}

/// Every rank's facts, in world-rank order, from this rank's `mine`: one all-gather over
/// `world` (every rank of the world calls this at the same point).
///
/// # Errors
/// The all-gather's failure.
pub(crate) fn share<B: Backend>(
    world: &mut dyn Collective<B>,
    mine: &RankFacts,
    device: &B::Device,
) -> Result<Vec<RankFacts>, CollectiveError> {
    let pieces = hashes_to_floats(mine.encode());
    let gathered = world
        .all_gather(Tensor::from_floats(pieces.as_slice(), device))?
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 facts");
    Ok(floats_to_hashes(&gathered)
        .chunks(FIELDS)
        .map(RankFacts::decode)
        .collect())
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;
    use crate::collective::InProcess;

    #[test]
    fn every_rank_learns_every_ranks_facts_exactly() {
        let facts = |rank: usize| RankFacts {
            loss_sum: 0.1 + rank as f64 / 3.0,
            samples: 7 + rank,
            compute: Duration::new(3, 123_456_789 + rank as u32),
            communication: Duration::from_nanos(u64::MAX / 3),
            stats: RankStats {
                rank,
                param_bytes: u64::MAX - rank as u64,
                optimizer_bytes: 1 << 40,
                peak_bytes: (rank > 0).then_some(u64::MAX - 1 - rank as u64),
                held_bytes: (rank != 1).then_some(u64::MAX - 1 - rank as u64),
                ..Default::default()
            },
            stop: rank == 1,
        };
        let handles = InProcess::<Flex>::group(3, Duration::from_secs(10));
        let learned: Vec<Vec<RankFacts>> = std::thread::scope(|s| {
            let jobs: Vec<_> = handles
                .into_iter()
                .map(|mut c| {
                    s.spawn(move || {
                        let mine = facts(c.rank());
                        share(&mut c, &mine, &Default::default()).unwrap()
                    })
                })
                .collect();
            jobs.into_iter().map(|j| j.join().unwrap()).collect()
        });
        let expected: Vec<RankFacts> = (0..3).map(facts).collect();
        for seen in learned {
            assert_eq!(seen, expected);
        }
    }
}
