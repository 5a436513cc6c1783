//! What several ranks cost beyond their parts, timed on the model's own ranks: the costs no
//! probe of a collective sees (thread wake-ups, buckets packed, shards meeting mid-block,
//! ranks taking turns on too few cores), each fitted as what makes the cost model's
//! prediction of a timed step the time it took.

use super::{
    Budget, MOST_SHARDS, MeasureError, beside, cannot_cut, longer, time_steps, timing_plan,
};
use burn::tensor::backend::AutodiffBackend;
use kiln_core::data::DataSource;
use kiln_core::plan::StrategyKind;
use kiln_core::plan::cost::{Layout, Measured, StageSplit, TP_CALLS_PER_BLOCK, step_time};
use kiln_core::plan::{Plan, PlanRequest, Planner};
use kiln_core::strategy::StrategyModel;
use kiln_core::strategy::{OptimizerSpec, StrategyConfigs, StrategyError};
use kiln_core::tensor_parallel::TpBackend;

/// The ranks [`calibrate_ranks`] times over at most, and so the devices a CPU planner is given:
/// two for the costs of ranks meeting, three replicas to crowd two cores, and four shards.
pub const TIMED_RANKS: usize = MOST_SHARDS;

/// The replicas [`calibrate_ranks`] crowds two cores' worth with: one more.
const CROWDED_REPLICAS: usize = 3;

/// Times `model`'s step over two ranks of `devices` (one intra-op thread each, the machine's
/// other `others` cores running copies of a rank's step beside them) as Ddp, as two
/// tensor-parallel shards and as a pipeline of two stages, and gives `planner`'s costs what
/// each took beyond what the cost model predicts for it: the ranks'
/// [`rendezvous`](Measured::rendezvous) (a cost of every step of several ranks), the shards'
/// meeting at each of a block's all-reduces ([`tp_call`](Measured::tp_call)) and a stage's
/// [`handoff`](Measured::handoff) (of every micro-batch passed between stages). These are
/// costs no probe of a collective sees (thread wake-ups, buckets packed), measured on the
/// model's own ranks. A model that cannot be cut has none of the cut's costs to time.
///
/// Those steps have two samples (a sample a replica; both through each stage or shard): none
/// of the costs grows with the samples, and the timings' noise does (a few percent of a 10 ms
/// step is more than any). The shards are timed once more at the calibration's batch of
/// `calibrated` samples, two and, with a fourth device, four of them, for the share of a
/// block's work that each runs whole ([`tp_unsplit`](Measured::tp_unsplit)): that one grows
/// with the samples and with the shards a device runs, and is fitted to both timings.
///
/// On a CPU (the planner's cluster has cores) with a third device, three Ddp replicas are
/// timed at the calibration's batch with the same companions, one thread more than the
/// cores, for how ranks beyond the cores share them ([`crowded`](Measured::crowded)).
///
/// # Errors
/// What a step returns.
#[allow(clippy::too_many_arguments)]
pub fn calibrate_ranks<B, M, S, I>(
    mut planner: Planner,
    devices: &[B::Device],
    model: &M,
    optim: &S,
    data: &DataSource<B, I, M::Input>,
    (calibrated, others): (usize, usize),
    budget: Budget,
    seed: u64,
) -> Result<Planner, MeasureError>
where
    B: AutodiffBackend + TpBackend,
    M: StrategyModel<B>,
    S: OptimizerSpec<B> + Sync,
    I: Send + 'static,
{
    // Two ranks need a sample each.
    if planner.cluster.measured.is_none() || data.len() < 2 || devices.len() < 2 {
        return Ok(planner);
    }
    let batch = 2;
    let single = timing_plan(StrategyKind::Single, 1, 1, 1)?;
    let time_ranks = |plan: &Plan, budget: Budget| {
        let companions = (0..others).map(|_| {
            let (model, data, single) = (model.clone(), data.clone(), &single);
            let device = std::slice::from_ref(&devices[0]);
            move || time_steps(single, device, model, optim, data, longer(budget), seed)
        });
        let ranks = &devices[..plan.world_size()];
        beside(companions, || {
            time_steps(
                plan,
                ranks,
                model.clone(),
                optim,
                data.clone(),
                budget,
                seed,
            )
        })
        .map(|t| t.median())
    };
    let predict = |planner: &Planner, layout: Layout| {
        // Every core was busy (the ranks and their companions), as when every core holds a
        // rank: the ranks' cluster on two cores, not on an otherwise idle machine.
        let mut cluster = planner.cluster(layout.dp * layout.pp * layout.tp);
        cluster.cores = cluster.cores.map(|cores| cores.min(2));
        step_time(&planner.workload, &cluster, &layout).total
    };
    let layout = Layout {
        dp: 2,
        pp: 1,
        tp: 1,
        micro_batches: 1,
        micro_batch: 1,
        recompute: false,
        shard_state: kiln_core::plan::ShardState::None,
        split: StageSplit::Even,
    };
    let ddp = time_ranks(&timing_plan(StrategyKind::Ddp, 2, batch, 1)?, budget)?;
    let predicted = predict(&planner, layout);
    planner.cluster.measured = planner
        .cluster
        .measured
        .map(|m| m.with_rendezvous(ddp, predicted));
    // Three replicas on two cores' worth: how the turns go, at the calibration's batch (the
    // turns are a share of the work, which grows with the samples).
    let crowdable = planner.cluster.cores.is_some_and(|cores| cores >= 2);
    if crowdable && devices.len() >= CROWDED_REPLICAS && data.len() >= CROWDED_REPLICAS {
        let replicas = CROWDED_REPLICAS;
        let per_replica = (calibrated.min(data.len()) / replicas).max(1);
        let plan = timing_plan(StrategyKind::Ddp, replicas, per_replica * replicas, 1)?;
        // Twice as long as the other timings: a share of the step, it is fitted from one.
        let crowded = time_ranks(&plan, budget.scaled(2.0))?;
        let at = Layout {
            dp: replicas,
            micro_batch: per_replica,
            ..layout
        };
        planner = fit_share(
            planner,
            &[(crowded, at)],
            |m, share| m.crowded = share,
            predict,
        );
    }
    // Two shards: their meetings mid-block, a cost per all-reduce, timed at two samples where
    // the work is small; and the share of a block's work each runs whole, timed at the
    // calibration's batch where the work is most of the step, over two shards and, where
    // there are the devices, four. A model that does not shard has neither.
    match time_ranks(&timing_plan(StrategyKind::Tensor, 2, batch, 1)?, budget) {
        Err(error) if cannot_cut(&error) => {}
        small => {
            let small = small?;
            let samples = calibrated.min(data.len()).max(batch);
            let shards = Layout {
                dp: 1,
                tp: 2,
                micro_batch: batch,
                ..layout
            };
            // The unsplit share runs whole on every shard, so its error weighs with the
            // shards a core runs: fitted on two alone, it read 0 to 0.66 from run to run on
            // this project's 2-core machine, and four shards there came out 11 to 66 % slow.
            let mut large = Vec::new();
            for tp in [2, MOST_SHARDS]
                .into_iter()
                .filter(|&tp| tp <= devices.len())
            {
                match time_ranks(&timing_plan(StrategyKind::Tensor, tp, samples, 1)?, budget) {
                    // Heads that four shards cannot divide.
                    Err(error) if cannot_cut(&error) => {}
                    seconds => large.push((
                        seconds?,
                        Layout {
                            tp,
                            micro_batch: samples,
                            ..shards
                        },
                    )),
                }
            }
            let calls = planner.workload.layers * TP_CALLS_PER_BLOCK;
            // Each fit holds the other fixed; twice round settles both.
            for _ in 0..2 {
                // The prediction without meetings: the difference is theirs.
                if let Some(m) = &mut planner.cluster.measured {
                    m.tp_call = 0.0;
                }
                let predicted = predict(&planner, shards);
                planner.cluster.measured = planner
                    .cluster
                    .measured
                    .map(|m| m.with_tp_call(small, predicted, calls));
                planner = fit_share(planner, &large, |m, share| m.tp_unsplit = share, predict);
            }
        }
    }
    // A model of one block has no two stages to hand a micro-batch between.
    if planner.workload.layers < 2 {
        return Ok(planner);
    }
    let mut configs = StrategyConfigs::default();
    configs.set_threads_per_rank(1);
    configs.pipeline.stages = 2;
    configs.pipeline.micro_batches = 1;
    let staged = Plan::resolve(
        PlanRequest::new(StrategyKind::Pipeline, batch)
            .with_world(2)
            .with_configs(configs),
    )
    .map_err(StrategyError::from)?;
    let pipeline = match time_ranks(&staged, budget) {
        // A model that cannot be cut in two stages has no hand-off to time.
        Err(error) if cannot_cut(&error) => return Ok(planner),
        other => other?,
    };
    let layout = Layout {
        dp: 1,
        pp: 2,
        micro_batch: batch,
        ..layout
    };
    let predicted = predict(&planner, layout);
    planner.cluster.measured = planner
        .cluster
        .measured
        .map(|m| m.with_handoff(pipeline, predicted, 2));
    Ok(planner)
}

/// `planner` with a share of its measured costs (one of [`Measured`]'s fields between 0 and
/// 1, which `set` writes) that makes `predict`'s step of each layout of `timed` nearest the
/// seconds it was timed at: the least squares of their relative errors, over the shares
/// between none and all. With one timing, the share whose prediction is that step, as near
/// as one can be (the prediction grows with the share).
fn fit_share(
    mut planner: Planner,
    timed: &[(f64, Layout)],
    set: impl Fn(&mut Measured, f64),
    predict: impl Fn(&Planner, Layout) -> f64,
) -> Planner {
    let error = |share: f64| {
        let mut planner = planner.clone();
        if let Some(m) = &mut planner.cluster.measured {
            set(m, share);
        }
        timed
            .iter()
            .map(|&(seconds, layout)| (predict(&planner, layout) / seconds - 1.0).powi(2))
            .sum::<f64>()
    };
    // A grid finds the valley (a step's prediction bends where crowded ranks' turns start to
    // set the pace, so the error need not have one minimum over all shares); a golden-section
    // search then narrows it within the grid's neighbouring points.
    const GRID: usize = 100;
    let (best, _) = (0..=GRID)
        .map(|i| i as f64 / GRID as f64)
        .map(|share| (share, error(share)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("the grid has points");
    let step = 1.0 / GRID as f64;
    let (mut low, mut high) = ((best - step).max(0.0), (best + step).min(1.0));
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..60 {
        let (a, b) = (high - ratio * (high - low), low + ratio * (high - low));
        match error(a) <= error(b) {
            true => high = b,
            false => low = a,
        }
    }
    if let Some(m) = &mut planner.cluster.measured {
        set(m, 0.5 * (low + high));
    }
    planner
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_planner;
    use kiln_core::collective::Link;
    use kiln_core::optim::Precision;
    use kiln_core::plan::cost::{Timing, TransformerShape, Workload};

    /// The tiny transformer as planned on `cores` cores, its step fitted to three timings.
    fn tiny_planner(cores: usize) -> Planner {
        // kiln-core's own planner tests use this transformer too: 4 blocks of width 64.
        let shape = TransformerShape {
            layers: 4,
            hidden: 64,
            heads: 4,
            kv_heads: 4,
            head_dim: 16,
            qkv_bias: false,
            o_bias: false,
            ffn: 256,
            seq: 16,
            vocab: 16,
            gated: false,
            tied: false,
        };
        let timings = [(8, 1, 2e-3), (32, 1, 6e-3), (32, 4, 7e-3)].map(|(s, m, t)| Timing {
            samples: s,
            micro_batches: m,
            seconds: t,
            spread: 0.0,
            steps: 0,
            peak_bytes: None,
        });
        let link = Link {
            latency: 15e-6,
            bandwidth: 5e9,
        };
        cpu_planner(
            Workload::transformer(&shape, Precision::F32, 32),
            Measured::fit(&timings).unwrap(),
            link,
            cores,
        )
    }

    /// `fit_share` of the field `set` writes recovers `truth`, and is none for a step faster
    /// than any share predicts and all for one slower.
    fn recovers(
        planner: &Planner,
        truth: f64,
        set: impl Fn(&mut Measured, f64) + Copy,
        get: impl Fn(&Measured) -> f64,
        layout: Layout,
    ) {
        let predict = |p: &Planner, layout: Layout| {
            let ranks = layout.dp * layout.pp * layout.tp;
            step_time(&p.workload, &p.cluster(ranks), &layout).total
        };
        let share = |p: &Planner| get(p.cluster.measured.as_ref().unwrap());
        let mut true_planner = planner.clone();
        set(true_planner.cluster.measured.as_mut().unwrap(), truth);
        let fit = |seconds: f64| {
            let fitted = fit_share(planner.clone(), &[(seconds, layout)], set, predict);
            share(&fitted)
        };
        let fitted = fit(predict(&true_planner, layout));
        assert!((fitted - truth).abs() < 1e-6, "{fitted}");
        assert!(
            fit(1e-9) < 1e-6,
            "a step faster than any share predicts: none"
        );
        assert!(fit(1.0) > 1.0 - 1e-6, "one slower: all");
    }

    #[test]
    fn the_unsplit_share_is_the_one_whose_prediction_is_the_timed_step() {
        let shards = Layout {
            dp: 1,
            pp: 1,
            tp: 2,
            micro_batches: 1,
            micro_batch: 32,
            recompute: false,
            shard_state: kiln_core::plan::ShardState::None,
            split: StageSplit::Even,
        };
        recovers(
            &tiny_planner(2),
            0.3,
            |m, share| m.tp_unsplit = share,
            |m| m.tp_unsplit,
            shards,
        );
    }

    #[test]
    fn the_unsplit_share_of_two_and_four_shards_fits_both_timings() {
        let planner = tiny_planner(2);
        let shards = |tp: usize| Layout {
            dp: 1,
            pp: 1,
            tp,
            micro_batches: 1,
            micro_batch: 32,
            recompute: false,
            shard_state: kiln_core::plan::ShardState::None,
            split: StageSplit::Even,
        };
        let predict = |p: &Planner, layout: Layout| {
            step_time(&p.workload, &p.cluster(layout.tp), &layout).total
        };
        let set = |m: &mut Measured, share: f64| m.tp_unsplit = share;
        let fitted = |timed: &[(f64, Layout)]| {
            let planner = fit_share(planner.clone(), timed, set, predict);
            planner.cluster.measured.unwrap().tp_unsplit
        };
        let mut truth = planner.clone();
        set(truth.cluster.measured.as_mut().unwrap(), 0.2);
        let (two, four) = (predict(&truth, shards(2)), predict(&truth, shards(4)));
        // Timings the model can meet: the share behind them.
        let both = fitted(&[(two, shards(2)), (four, shards(4))]);
        assert!((both - 0.2).abs() < 1e-6, "{both}");
        // Timings it cannot: between what each alone says, nearer the one that weighs more
        // (four shards on two cores run the share four times on each core's two).
        let (slow, fast) = ((two * 1.1, shards(2)), (four * 0.9, shards(4)));
        let (alone_two, alone_four) = (fitted(&[slow]), fitted(&[fast]));
        let between = fitted(&[slow, fast]);
        assert!(
            alone_four < between && between < alone_two,
            "{alone_four} {between} {alone_two}"
        );
        assert!(
            between - alone_four < alone_two - between,
            "{alone_four} {between} {alone_two}"
        );
    }

    #[test]
    fn the_crowded_share_is_the_one_whose_prediction_is_the_timed_step() {
        let replicas = Layout {
            dp: 3,
            pp: 1,
            tp: 1,
            micro_batches: 1,
            micro_batch: 32,
            recompute: false,
            shard_state: kiln_core::plan::ShardState::None,
            split: StageSplit::Even,
        };
        recovers(
            &tiny_planner(2),
            0.4,
            |m, share| m.crowded = share,
            |m| m.crowded,
            replicas,
        );
    }
}
