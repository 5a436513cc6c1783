//! `auto`'s choice: the cost model's fastest layout that fits the run's ranks, when the run
//! describes its model and devices ([`Planner`]); a full replica per rank when it does not.

use super::cost::{Candidate, Cluster, Fixed, Layout, PlanError, Workload, search_within};
use crate::optim::{Precision, StateLayout};
use crate::strategy::{Schedule, StrategyConfigs, StrategyKind};

/// What `auto` plans with: the model's step and the devices the ranks run on (their count is
/// the plan's, set when it resolves).
#[derive(Debug, Clone, PartialEq)]
pub struct Planner {
    /// The model's step.
    pub workload: Workload,
    /// One machine's devices: memory, speed (or the model's [`Measured`](super::cost::Measured)
    /// step on one of them) and the links between them.
    pub cluster: Cluster,
    /// What the run fixes of its layout, and why (say, a checkpoint's stages and shards).
    pub fixed: Option<(Fixed, String)>,
}

impl Planner {
    /// The machine as `ranks` devices. Ranks that share a CPU (the cluster has `cores`)
    /// share its memory too: the cluster's `memory` is then the machine's, and each rank's is
    /// its share.
    pub fn cluster(&self, ranks: usize) -> Cluster {
        let memory = match self.cluster.cores {
            Some(_) => self.cluster.memory / ranks.max(1) as u64,
            None => self.cluster.memory,
        };
        Cluster {
            devices: ranks,
            per_node: ranks,
            memory,
            ..self.cluster.clone()
        }
    }

    /// The planner's candidates on `ranks` devices of the machine, best first.
    ///
    /// # Errors
    /// [`PlanError`] when nothing fits.
    pub fn plan(&self, ranks: usize) -> Result<super::cost::Planned, PlanError> {
        let fixed = self.fixed.as_ref().map_or(Fixed::default(), |(f, _)| *f);
        search_within(&self.workload, &self.cluster(ranks), fixed)
    }

    /// The same planner, laying out only what `fixed` leaves free, `because` of what (in
    /// place of what it fixed before).
    pub fn within(self, fixed: Fixed, because: impl Into<String>) -> Self {
        Self {
            fixed: (!fixed.is_free()).then(|| (fixed, because.into())),
            ..self
        }
    }
}

impl Fixed {
    /// The stages and shards of a run whose optimizer state is cut as `layout` (a
    /// checkpoint's: a run resumes on the layout it saved).
    pub fn of_state(layout: StateLayout) -> Self {
        let (pp, tp) = match layout {
            StateLayout::Replica => (1, 1),
            StateLayout::Stages(stages) => (stages, 1),
            StateLayout::Sharded { stages, shards } => (stages, shards),
        };
        Self {
            pp: Some(pp),
            tp: Some(tp),
        }
    }

    /// What Kiln's `precision` can run: f32 any layout; bf16 and f16 no pipeline stages yet
    /// ([`PerformanceConfig::check_plan`](crate::optim::PerformanceConfig::check_plan) refuses them).
    pub fn of_precision(precision: Precision) -> Self {
        Self {
            pp: (precision != Precision::F32).then_some(1),
            tp: None,
        }
    }
}

impl Candidate {
    /// `configs` with this candidate's layout written in: the strategy's stages, shards,
    /// micro-batches (pipeline micro-batches with stages, gradient accumulation without) and
    /// recomputation, under the 1F1B schedule the cost model times.
    pub fn configs(&self, configs: &StrategyConfigs) -> StrategyConfigs {
        layout_configs(&self.layout, configs)
    }

    /// Ranks the candidate runs on.
    pub fn ranks(&self) -> usize {
        self.layout.dp * self.layout.pp * self.layout.tp
    }
}

/// `configs` with `layout` written in (see [`Candidate::configs`]): what runs a layout, for
/// the planner's choice and for the layouts it measures.
pub(crate) fn layout_configs(layout: &Layout, configs: &StrategyConfigs) -> StrategyConfigs {
    let mut configs = configs.clone();
    configs.set_grad_accumulation(1);
    let staged = layout.pp > 1;
    if staged {
        configs.pipeline.stages = layout.pp;
        configs.pipeline.micro_batches = layout.micro_batches;
        configs.pipeline.recompute = layout.recompute;
        configs.pipeline.schedule = Schedule::OneFOneB;
    } else {
        configs.set_grad_accumulation(layout.micro_batches);
    }
    configs.tensor.tp = layout.tp;
    configs.tensor.stages = layout.pp;
    configs
}

/// `auto`'s choice for `ranks` ranks: the strategy, its settings, and why.
///
/// # Errors
/// [`PlanError`] when the planner finds nothing that fits.
pub(super) fn choose(
    ranks: usize,
    from_cores: bool,
    planner: Option<&Planner>,
    configs: &StrategyConfigs,
) -> Result<(StrategyKind, StrategyConfigs, String), PlanError> {
    let Some(planner) = planner else {
        let (kind, reason) = match (ranks, from_cores) {
            (1, _) => (
                StrategyKind::Single,
                "one rank: nothing to parallelise".into(),
            ),
            (_, true) => (
                StrategyKind::Ddp,
                format!(
                    "the CPU's cores as {ranks} Ddp ranks (no model was described to the \
                     planner, so it is assumed to fit on every rank)"
                ),
            ),
            (_, false) => (
                StrategyKind::Ddp,
                format!(
                    "{ranks} ranks: a full replica per rank (no model was described to the \
                     planner, so it is assumed to fit on every device)"
                ),
            ),
        };
        return Ok((kind, configs.clone(), reason));
    };
    let planned = planner.plan(ranks)?;
    let chosen = planned.chosen();
    let mut whose = match from_cores {
        true => format!("the CPU's cores as {ranks} single-threaded ranks; "),
        false => String::new(),
    };
    if let Some((fixed, because)) = &planner.fixed {
        whose.push_str(&format!("{fixed} ({because}); "));
    }
    Ok((
        chosen.strategy,
        chosen.configs(configs),
        format!("{whose}{}", planned.reason),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::cost::{Measured, Precision, TransformerShape, Workload};
    use crate::plan::{Plan, PlanRequest};

    /// A transformer whose step is timed on one core of a 2-core machine: dispatch and an
    /// update as a small model on a CPU has them.
    fn planner(memory: u64) -> Planner {
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
        let workload = Workload::transformer(&shape, Precision::F32, 64);
        let cluster = Cluster {
            devices: 2,
            per_node: 2,
            memory,
            peak_flops: 1e10,
            efficiency: 1.0,
            intra_bandwidth: 5e9,
            inter_bandwidth: 5e9,
            intra_latency: 15e-6,
            inter_latency: 15e-6,
            cores: Some(2),
            measured: Some(Measured {
                per_sample: 150e-6,
                per_micro_batch: 300e-6,
                per_update: 200e-6,
                timings: Vec::new(),
                alone: 1.0,
                rendezvous: 0.0,
                handoff: 0.0,
            }),
        };
        Planner {
            workload,
            cluster,
            fixed: None,
        }
    }

    fn resolve(
        planner: Planner,
        world: Option<usize>,
    ) -> Result<Plan, crate::strategy::ConfigError> {
        Plan::resolve(PlanRequest {
            world,
            cpu_cores: Some(2),
            planner: Some(planner),
            ..PlanRequest::new(StrategyKind::Auto, 64)
        })
    }

    #[test]
    fn the_cores_become_replicas_when_the_model_fits_each() {
        let plan = resolve(planner(16 << 30), None).unwrap();
        assert_eq!(plan.strategy(), StrategyKind::Ddp, "{plan}");
        assert_eq!(plan.world_size(), 2);
        assert!(plan.reason().starts_with("the CPU's cores as 2"), "{plan}");
        assert!(plan.reason().contains("ms a step predicted"), "{plan}");
        let one = resolve(planner(16 << 30), Some(1)).unwrap();
        assert_eq!(one.strategy(), StrategyKind::Single);
        // 64 samples over 3 replicas: 22, 21 and 21, as Kiln's uneven shards cut them.
        let three = resolve(planner(16 << 30), Some(3)).unwrap();
        assert_eq!(
            (three.strategy(), three.world_size()),
            (StrategyKind::Ddp, 3)
        );
        let chosen = planner(16 << 30).plan(3).unwrap().chosen().clone();
        assert_eq!(chosen.layout.micro_batch * chosen.layout.micro_batches, 22);
    }

    #[test]
    fn a_model_too_big_for_a_rank_s_share_of_memory_is_split() {
        // The machine's memory is twice a replica's parameters and state: each of 4 ranks
        // gets half a replica's, so no rank holds a replica, and the model is split.
        let work = planner(0).workload;
        let replica = work.params as f64 * 16.0;
        let memory = (replica * 4.0 * 0.5) as u64;
        let plan = resolve(planner(memory), Some(4)).unwrap();
        assert_ne!(plan.strategy(), StrategyKind::Ddp, "{plan}");
        assert!(plan.degree("pp") * plan.degree("tp") > 1, "{plan}");
        // The chosen layout's settings are the plan's.
        let planned = planner(memory).plan(4).unwrap();
        let chosen = planned.chosen();
        assert_eq!(plan.degree("pp"), chosen.layout.pp, "{plan}");
        assert_eq!(plan.degree("tp"), chosen.layout.tp, "{plan}");
        let nothing = resolve(planner(1 << 10), Some(2)).unwrap_err();
        assert!(
            nothing.to_string().starts_with("auto: nothing fits"),
            "{nothing}"
        );
    }

    #[test]
    fn every_candidate_resolves_into_the_plan_it_describes() {
        let p = planner(16 << 30);
        for ranks in 1..=4 {
            for c in p.plan(ranks).unwrap().candidates {
                let plan = Plan::resolve(PlanRequest {
                    world: Some(c.ranks()),
                    configs: c.configs(&StrategyConfigs::default()),
                    ..PlanRequest::new(c.strategy, 64)
                })
                .unwrap_or_else(|e| panic!("{c:?}: {e}"));
                let l = &c.layout;
                assert_eq!(plan.strategy(), c.strategy);
                assert_eq!(
                    [plan.degree("dp"), plan.degree("pp"), plan.degree("tp")],
                    [l.dp, l.pp, l.tp],
                    "{c:?}"
                );
                let micro_batches = match l.pp {
                    1 => plan.grad_accumulation(),
                    _ => plan.configs().pipeline.micro_batches,
                };
                assert_eq!(micro_batches, l.micro_batches, "{c:?}");
            }
        }
    }

    #[test]
    fn a_fixed_layout_is_the_plan_s_and_its_reason_says_why() {
        let staged = Fixed::of_state(StateLayout::Stages(2));
        let plan = resolve(
            planner(16 << 30).within(staged, "the checkpoint's layout"),
            None,
        )
        .unwrap();
        assert_eq!(plan.degree("pp"), 2, "{plan}");
        assert!(
            plan.reason()
                .contains("pp=2 tp=1 (the checkpoint's layout)"),
            "{plan}"
        );
        // Mixed precision keeps stages out; f32 fixes nothing.
        assert_eq!(
            Fixed::of_precision(crate::optim::Precision::Bf16).pp,
            Some(1)
        );
        assert!(Fixed::of_precision(crate::optim::Precision::F32).is_free());
        let sharded = Fixed::of_state(StateLayout::Sharded {
            stages: 1,
            shards: 2,
        });
        assert_eq!((sharded.pp, sharded.tp), (Some(1), Some(2)));
    }
}
