//! `auto`'s choice: the cost model's fastest layout that fits the run's ranks, when the run
//! describes its model and devices ([`Planner`]); a full replica per rank when it does not.

use super::StrategyKind;
use super::cost::{
    Candidate, Cluster, Fixed, Layout, PlanError, StageSplit, Workload, search_within,
};
use super::{AutoConfig, ConfigError, Schedule, ShardState, StrategyConfigs};
use crate::optim::{Precision, StateLayout};

/// What `auto` plans with: the model's step and the devices the ranks run on (their count is
/// the plan's, set when it resolves).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Planner {
    /// The model's step.
    pub workload: Workload,
    /// One machine's devices: memory, speed (or the model's [`Measured`](super::cost::Measured)
    /// step on one of them) and the links between them.
    pub cluster: Cluster,
    /// Machines the ranks spread over evenly (a launched run's nodes; 1 for one process).
    pub nodes: usize,
}

impl Planner {
    /// The machines as `ranks` devices, `ranks / nodes` on each. Ranks that share a CPU (the
    /// cluster has `cores`) share its memory too: the cluster's `memory` is then one
    /// machine's, and each rank's is its share.
    pub fn cluster(&self, ranks: usize) -> Cluster {
        let nodes = self.nodes.max(1);
        let per_node = (ranks / nodes).max(1);
        let memory = match self.cluster.cores {
            Some(_) => self.cluster.memory / per_node as u64,
            None => self.cluster.memory,
        };
        // Each device's own memory where the machine listed one per rank.
        let device_memory = match self.cluster.device_memory.len() == ranks {
            true => self.cluster.device_memory.clone(),
            false => Vec::new(),
        };
        Cluster {
            devices: ranks,
            per_node,
            memory,
            device_memory,
            // Every machine's cores: ranks crowd only those of their own machine.
            cores: self.cluster.cores.map(|cores| cores * nodes),
            ..self.cluster.clone()
        }
    }

    /// The same planner, its ranks linked as `link` says within and between machines (the
    /// collective a launched run's ranks meet through).
    pub fn linked(mut self, link: crate::collective::Link) -> Self {
        self.cluster.intra_latency = link.latency;
        self.cluster.inter_latency = link.latency;
        self.cluster.intra_bandwidth = link.bandwidth;
        self.cluster.inter_bandwidth = link.bandwidth;
        self
    }

    /// The planner's candidates on `ranks` devices of the machine, best first.
    ///
    /// # Errors
    /// [`PlanError`] when nothing fits.
    pub fn plan(&self, ranks: usize) -> Result<super::cost::Planned, PlanError> {
        self.plan_within(ranks, Fixed::default())
    }

    /// [`Self::plan`] among the layouts that keep to `fixed`.
    ///
    /// # Errors
    /// [`PlanError`] when nothing keeps to it and fits.
    pub fn plan_within(
        &self,
        ranks: usize,
        fixed: Fixed,
    ) -> Result<super::cost::Planned, PlanError> {
        search_within(&self.workload, &self.cluster(ranks), fixed)
    }
}

impl Fixed {
    /// The stages and shards of a run whose optimizer state is cut as `layout` (a
    /// checkpoint's: a run resumes on the layout it saved), on the pipeline's engine when the
    /// state is per stage.
    pub fn of_state(layout: StateLayout) -> Self {
        let (pp, tp) = match layout {
            StateLayout::Replica => (1, 1),
            StateLayout::Stages(stages) => (stages, 1),
            StateLayout::Sharded { stages, shards } => (stages, shards),
        };
        Self {
            pp: Some(pp),
            tp: Some(tp),
            staged: matches!(layout, StateLayout::Stages(_)),
            ..Self::default()
        }
    }

    /// What a run fixes of `auto`'s layout, and why: the layout of the checkpoint it resumes
    /// from (`resumed`), else what its `precision` rules out; `None` when that is nothing.
    pub fn of_run(resumed: Option<StateLayout>, precision: Precision) -> Option<(Self, String)> {
        let (fixed, because) = match resumed {
            Some(layout) => (
                Self::of_state(layout),
                "the checkpoint's layout".to_string(),
            ),
            None => (
                Self::of_precision(precision),
                format!("{precision} runs without pipeline stages"),
            ),
        };
        (!fixed.is_free()).then_some((fixed, because))
    }

    /// What the user fixed (`[parallel.auto]`, or `--stages`, `--tp`, `--micro-batches` and
    /// `--recompute`).
    pub fn of_config(config: &AutoConfig) -> Self {
        Self {
            pp: config.stages,
            tp: config.tp,
            staged: false,
            micro_batches: config.micro_batches,
            recompute: config.recompute,
        }
    }

    /// What Kiln's `precision` can run: f32 any layout; bf16 and f16 no pipeline stages yet
    /// ([`Plan::check_precision`](super::Plan::check_precision) refuses them).
    pub fn of_precision(precision: Precision) -> Self {
        Self {
            pp: (precision != Precision::F32).then_some(1),
            ..Self::default()
        }
    }
}

impl Candidate {
    /// `configs` with this candidate's layout written in: the strategy's stages, shards,
    /// micro-batches (pipeline micro-batches on the pipeline's engine, gradient accumulation
    /// otherwise) and recomputation, under the 1F1B schedule the cost model times.
    pub fn configs(&self, configs: &StrategyConfigs) -> StrategyConfigs {
        let blocks = (self.layout.split != StageSplit::Even).then_some(&self.blocks[..]);
        layout_configs(self.strategy, &self.layout, blocks, configs)
    }

    /// Ranks the candidate runs on.
    pub fn ranks(&self) -> usize {
        self.layout.dp * self.layout.pp * self.layout.tp
    }
}

/// `configs` with `layout` written in for `strategy` (see [`Candidate::configs`]): what runs a
/// layout, for the planner's choice and for the layouts it measures. `stage_blocks` are the
/// blocks of each stage where they are not the even split.
pub fn layout_configs(
    strategy: StrategyKind,
    layout: &Layout,
    stage_blocks: Option<&[usize]>,
    configs: &StrategyConfigs,
) -> StrategyConfigs {
    let mut configs = configs.clone();
    configs.set_grad_accumulation(1);
    let staged = layout.pp > 1 || strategy == StrategyKind::Pipeline;
    if staged {
        configs.pipeline.stages = layout.pp;
        configs.pipeline.micro_batches = layout.micro_batches;
        configs.pipeline.recompute = layout.recompute;
        configs.pipeline.schedule = Schedule::OneFOneB;
    } else {
        configs.set_grad_accumulation(layout.micro_batches);
    }
    configs.pipeline.stage_blocks = stage_blocks.map(<[usize]>::to_vec);
    configs.tensor.tp = layout.tp;
    configs.tensor.stages = layout.pp;
    if layout.shard_state != ShardState::None {
        configs.ddp.shard_state = layout.shard_state;
        // Without stages a layout recomputes only in a model that recomputes its blocks
        // (gradient checkpointing), which then gathers each as it runs it.
        configs.ddp.gather_units = layout.shard_state.splits_parameters() && layout.recompute;
    }
    configs
}

/// What fixes `auto`'s layout: the user's settings (`configs.auto`, and a gradient
/// accumulation beyond 1, which under `auto` names its micro-batches) and what the run fixes
/// (`run`: a checkpoint's layout, the precision's), with why.
///
/// # Errors
/// [`ConfigError::AutoFixedApart`] when the user and the run fix a setting apart;
/// [`ConfigError::AutoMicroBatchesApart`] when the micro-batches and the accumulation differ.
pub(super) fn fixed(
    configs: &StrategyConfigs,
    run: Option<(Fixed, String)>,
) -> Result<Option<(Fixed, String)>, ConfigError> {
    let mut config = configs.auto.clone();
    let accumulation = configs.grad_accumulation(StrategyKind::Auto);
    if accumulation > 1 {
        match config.micro_batches {
            Some(m) if m != accumulation => {
                return Err(ConfigError::AutoMicroBatchesApart {
                    micro_batches: m,
                    accumulation,
                });
            }
            _ => config.micro_batches = Some(accumulation),
        }
    }
    let config = &config;
    let user = (!config.is_free()).then(|| {
        (
            Fixed::of_config(config),
            "as [parallel.auto] or its flags fix".to_string(),
        )
    });
    Ok(match (user, run) {
        (None, run) => run,
        (user, None) => user,
        (Some((user, _)), Some((run, because))) => {
            let both = user.and(run).ok_or_else(|| ConfigError::AutoFixedApart {
                user: user.to_string(),
                run: run.to_string(),
                because: because.clone(),
            })?;
            Some((both, format!("as set, and {because}")))
        }
    })
}

/// `auto`'s choice for `ranks` ranks within `fixed`: the strategy, its settings, and why.
///
/// # Errors
/// [`PlanError`] when the planner finds nothing that fits.
pub(super) fn choose(
    ranks: usize,
    from_cores: bool,
    planner: Option<&Planner>,
    fixed: Option<&(Fixed, String)>,
    configs: &StrategyConfigs,
) -> Result<(StrategyKind, StrategyConfigs, String), PlanError> {
    let Some(planner) = planner else {
        return Ok(replicas(ranks, from_cores, fixed, configs));
    };
    let within = fixed.map_or(Fixed::default(), |(f, _)| *f);
    // Validated with the configs: the limits and the margin read.
    let limits = configs.auto.limits().unwrap_or_default();
    let margin = configs.auto.margin().unwrap_or_default();
    let planned = match limits.is_empty() && margin.is_none() {
        true => planner.plan_within(ranks, within)?,
        false => {
            let mut limited = planner.clone();
            limited.cluster.max_memory = limits;
            limited.cluster.margin = margin;
            limited.plan_within(ranks, within)?
        }
    };
    let chosen = planned.chosen();
    let mut whose = match from_cores {
        true => format!("the CPU's cores as {ranks} single-threaded ranks; "),
        false => String::new(),
    };
    if let Some((fixed, because)) = fixed {
        whose.push_str(&format!("{fixed} ({because}); "));
    }
    Ok((
        chosen.strategy,
        chosen.configs(configs),
        format!("{whose}{}", planned.reason),
    ))
}

/// `auto` without a planner: a full replica per rank, of the stages and shards `fixed` names
/// (the plan then checks that they divide the ranks), cut into the micro-batches it names,
/// its stages recomputing as it says.
fn replicas(
    ranks: usize,
    from_cores: bool,
    fixed: Option<&(Fixed, String)>,
    configs: &StrategyConfigs,
) -> (StrategyKind, StrategyConfigs, String) {
    let within = fixed.map_or(Fixed::default(), |(f, _)| *f);
    let (pp, tp) = (within.pp.unwrap_or(1), within.tp.unwrap_or(1));
    let whose = match from_cores {
        true => "the CPU's cores as ",
        false => "",
    };
    let unplanned = match from_cores {
        true => "assumed to fit on every rank",
        false => "assumed to fit on every device",
    };
    let mut chosen = configs.clone();
    // The accumulation `auto` runs with, as configured, unless fixed.
    let micro_batches = within
        .micro_batches
        .unwrap_or_else(|| configs.grad_accumulation(StrategyKind::Auto));
    if pp * tp == 1 && !within.staged {
        chosen.set_grad_accumulation(micro_batches);
        let (kind, reason) = match ranks {
            1 => (
                StrategyKind::Single,
                "one rank: nothing to parallelise".into(),
            ),
            _ => (
                StrategyKind::Ddp,
                format!(
                    "{whose}{ranks} ranks: a full replica per rank (no model was described to \
                     the planner, so it is {unplanned})"
                ),
            ),
        };
        let reason = match fixed {
            Some((fixed, because)) => format!("{fixed} ({because}); {reason}"),
            None => reason,
        };
        return (kind, chosen, reason);
    }
    // Stages and shards as fixed; the rest of the pipeline's settings as configured, but for
    // what is fixed.
    let kind = match tp {
        1 => StrategyKind::Pipeline,
        _ => StrategyKind::Tensor,
    };
    // As a planned layout's are written in (`layout_configs`): the pipeline's micro-batches
    // on its engine, gradient accumulation otherwise.
    chosen.set_grad_accumulation(configs.grad_accumulation(StrategyKind::Auto));
    match (
        pp > 1 || kind == StrategyKind::Pipeline,
        within.micro_batches,
    ) {
        (true, Some(m)) => chosen.pipeline.micro_batches = m,
        (false, Some(m)) => chosen.set_grad_accumulation(m),
        (_, None) => {}
    }
    if let Some(recompute) = within.recompute {
        chosen.pipeline.recompute = recompute;
    }
    chosen.pipeline.stages = pp;
    chosen.tensor.stages = pp;
    chosen.tensor.tp = tp;
    let (fixed, because) = fixed.expect("a layout beyond a replica was fixed");
    (
        kind,
        chosen,
        format!(
            "{fixed} ({because}); {whose}{ranks} ranks: the rest data-parallel replicas of it \
             (no model was described to the planner, so it is {unplanned})"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::cost::{Measured, Workload};
    use crate::plan::{Plan, PlanRequest};

    #[test]
    fn a_layout_whose_replicas_split_the_optimizer_state_runs_ddp_with_it() {
        let layout = Layout {
            dp: 2,
            pp: 1,
            tp: 1,
            micro_batches: 1,
            micro_batch: 4,
            recompute: false,
            shard_state: ShardState::Optimizer,
            split: StageSplit::Even,
        };
        let split = layout_configs(
            StrategyKind::Ddp,
            &layout,
            None,
            &StrategyConfigs::default(),
        );
        assert_eq!(split.ddp.shard_state, ShardState::Optimizer);
        let whole = Layout {
            shard_state: ShardState::None,
            ..layout
        };
        let whole = layout_configs(StrategyKind::Ddp, &whole, None, &StrategyConfigs::default());
        assert_eq!(whole.ddp.shard_state, ShardState::None);
        // ZeRO-3 recomputed (a model that recomputes its blocks) gathers one block at a time;
        // gathered whole, it does not.
        for recompute in [false, true] {
            let zero3 = Layout {
                shard_state: ShardState::Parameters,
                recompute,
                ..layout
            };
            let configs =
                layout_configs(StrategyKind::Ddp, &zero3, None, &StrategyConfigs::default());
            assert_eq!(configs.ddp.shard_state, ShardState::Parameters);
            assert_eq!(configs.ddp.gather_units, recompute);
        }
    }

    #[test]
    fn a_layout_of_uneven_stages_runs_the_pipeline_with_its_blocks() {
        let layout = Layout {
            dp: 1,
            pp: 2,
            tp: 1,
            micro_batches: 2,
            micro_batch: 2,
            recompute: false,
            shard_state: ShardState::None,
            split: StageSplit::Balanced,
        };
        let base = StrategyConfigs::default();
        let cut = layout_configs(StrategyKind::Pipeline, &layout, Some(&[1, 3]), &base);
        assert_eq!(cut.pipeline.stage_blocks, Some(vec![1, 3]));
        assert_eq!(cut.pipeline.ranges(4).unwrap(), [0..1, 1..4]);
        let even = layout_configs(StrategyKind::Pipeline, &layout, None, &base);
        assert_eq!(even.pipeline.stage_blocks, None);
    }

    /// A transformer whose step is timed on one core of a 2-core machine: dispatch and an
    /// update as a small model on a CPU has them.
    fn planner(memory: u64) -> Planner {
        let shape = crate::plan::cost::tests::tiny_transformer();
        let workload = Workload::transformer(&shape, crate::optim::Precision::F32, 64);
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
            device_memory: Vec::new(),
            max_memory: Default::default(),
            margin: None,
            measured: Some(Measured {
                per_sample: 150e-6,
                per_micro_batch: 300e-6,
                per_update: 200e-6,
                timings: Vec::new(),
                alone: 1.0,
                rendezvous: 0.0,
                handoff: 0.0,
                tp_call: 0.0,
                tp_unsplit: 0.0,
                crowded: 1.0,
            }),
        };
        Planner {
            workload,
            cluster,
            nodes: 1,
        }
    }

    fn resolve(planner: Planner, world: Option<usize>) -> Result<Plan, ConfigError> {
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

    fn resolve_limited(limits: &str) -> Result<Plan, ConfigError> {
        let mut configs = StrategyConfigs::default();
        configs.auto.max_memory = Some(limits.to_string());
        Plan::resolve(PlanRequest {
            world: Some(2),
            cpu_cores: Some(2),
            planner: Some(planner(16 << 30)),
            configs,
            ..PlanRequest::new(StrategyKind::Auto, 64)
        })
    }

    #[test]
    fn per_device_limits_bound_what_auto_plans() {
        // Plenty for both: the same choice as without limits.
        let roomy = resolve_limited("0=4GiB,1=4GiB").unwrap();
        assert_eq!(roomy.strategy(), StrategyKind::Ddp, "{roomy}");
        // Rank 1 may hold 1 KiB: nothing fits, and the error names it and by how much.
        let tight = resolve_limited("1=1KiB").unwrap_err().to_string();
        assert!(
            tight.starts_with("auto: nothing fits: the least full layout")
                && tight.contains("device 1 needs")
                && tight.contains("over the 1.0 KiB it may use"),
            "{tight}"
        );
        let outside = resolve_limited("5=1GiB").unwrap_err().to_string();
        assert!(
            outside.contains("a memory limit is set for device 5, but the run has 2"),
            "{outside}"
        );
        let unread = resolve_limited("1:1GiB").unwrap_err();
        assert!(matches!(unread, ConfigError::MaxMemory { .. }), "{unread}");
        // A margin as large as a rank's share leaves nothing: refused, naming the device.
        let mut configs = StrategyConfigs::default();
        configs.auto.memory_margin = Some("9GiB".into());
        let request = |configs: StrategyConfigs| PlanRequest {
            world: Some(2),
            cpu_cores: Some(2),
            planner: Some(planner(16 << 30)),
            configs,
            ..PlanRequest::new(StrategyKind::Auto, 64)
        };
        let emptied = Plan::resolve(request(configs.clone()))
            .unwrap_err()
            .to_string();
        assert!(
            emptied.contains("a memory margin of 9.0 GiB leaves nothing"),
            "{emptied}"
        );
        configs.auto.memory_margin = Some("lots".into());
        let unread = Plan::resolve(request(configs)).unwrap_err();
        assert!(
            matches!(unread, ConfigError::MemoryMargin { .. }),
            "{unread}"
        );
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

    /// `auto` on `world` ranks with `configs`, what the run fixes (`fixed`) and, if given, a
    /// planner.
    fn resolve_within(
        planner: Option<Planner>,
        world: usize,
        configs: StrategyConfigs,
        fixed: Option<(Fixed, String)>,
    ) -> Result<Plan, ConfigError> {
        Plan::resolve(PlanRequest {
            world: Some(world),
            configs,
            planner,
            fixed,
            ..PlanRequest::new(StrategyKind::Auto, 64)
        })
    }

    #[test]
    fn a_fixed_layout_is_the_plan_s_and_its_reason_says_why() {
        let staged = Fixed::of_run(Some(StateLayout::Stages(2)), Precision::F32);
        let plan = resolve_within(Some(planner(16 << 30)), 2, Default::default(), staged).unwrap();
        assert_eq!(plan.degree("pp"), 2, "{plan}");
        assert!(
            plan.reason()
                .contains("pp=2 tp=1 (the checkpoint's layout)"),
            "{plan}"
        );
        // Mixed precision keeps stages out; f32 fixes nothing.
        let (bf16, because) = Fixed::of_run(None, Precision::Bf16).unwrap();
        assert_eq!(
            (bf16.pp, because.as_str()),
            (Some(1), "bf16 runs without pipeline stages")
        );
        assert_eq!(Fixed::of_run(None, Precision::F32), None);
        let sharded = Fixed::of_state(StateLayout::Sharded {
            stages: 1,
            shards: 2,
        });
        assert_eq!((sharded.pp, sharded.tp), (Some(1), Some(2)));
    }

    #[test]
    fn a_one_stage_pipeline_s_checkpoint_resumes_on_a_one_stage_pipeline() {
        // Its state is per stage, which Single and Ddp do not load: with the planner or
        // without, on one rank or two, `auto` keeps the pipeline's engine.
        let one = || Fixed::of_run(Some(StateLayout::Stages(1)), Precision::F32);
        for (planner, world) in [(None, 1), (None, 2), (Some(planner(16 << 30)), 2)] {
            let plan = resolve_within(planner, world, Default::default(), one()).unwrap();
            assert_eq!(plan.strategy(), StrategyKind::Pipeline, "{plan}");
            assert_eq!(plan.state_layout(), StateLayout::Stages(1), "{plan}");
            assert_eq!(plan.world_size(), world);
        }
        // A replica's checkpoint resumes on replicas.
        let replica = || Fixed::of_run(Some(StateLayout::Replica), Precision::F32);
        let plan = resolve_within(None, 1, Default::default(), replica()).unwrap();
        assert_eq!(plan.strategy(), StrategyKind::Single);
        let plan = resolve_within(Some(planner(16 << 30)), 2, Default::default(), replica());
        assert_eq!(plan.unwrap().state_layout(), StateLayout::Replica);
    }

    #[test]
    fn the_user_s_degrees_are_kept_and_the_rest_laid_out() {
        let with = |stages: Option<usize>, tp: Option<usize>| StrategyConfigs {
            auto: AutoConfig {
                stages,
                tp,
                ..Default::default()
            },
            ..Default::default()
        };
        // The planner lays out the replicas and micro-batches around two stages.
        let plan = resolve_within(Some(planner(16 << 30)), 4, with(Some(2), None), None).unwrap();
        assert_eq!((plan.degree("dp"), plan.degree("pp")), (2, 2), "{plan}");
        assert!(
            plan.reason().contains("pp=2 tp=any (as [parallel.auto]"),
            "{plan}"
        );
        // Without a planner, replicas of the fixed shards.
        let plan = resolve_within(None, 4, with(None, Some(2)), None).unwrap();
        assert_eq!(plan.strategy(), StrategyKind::Tensor);
        assert_eq!([plan.degree("dp"), plan.degree("tp")], [2, 2], "{plan}");
        let plan = resolve_within(None, 2, with(Some(2), Some(1)), None).unwrap();
        assert_eq!(
            (plan.strategy(), plan.degree("pp")),
            (StrategyKind::Pipeline, 2)
        );
        // Degrees the ranks do not divide into, or of zero, are refused.
        assert!(matches!(
            resolve_within(None, 4, with(Some(3), None), None),
            Err(ConfigError::WorldNotMesh { .. })
        ));
        assert_eq!(
            resolve_within(None, 4, with(None, Some(0)), None),
            Err(ConfigError::ZeroShards)
        );
        // What the user fixes and what the run fixes must agree.
        let bf16 = Fixed::of_run(None, Precision::Bf16);
        let apart = resolve_within(None, 4, with(Some(2), None), bf16.clone()).unwrap_err();
        assert!(
            matches!(apart, ConfigError::AutoFixedApart { .. }),
            "{apart}"
        );
        assert!(
            apart
                .to_string()
                .contains("against pp=1 tp=any (bf16 runs without pipeline stages)")
        );
        let kept = resolve_within(None, 4, with(None, Some(2)), bf16).unwrap();
        assert_eq!((kept.degree("pp"), kept.degree("tp")), (1, 2), "{kept}");
    }

    #[test]
    fn fixed_micro_batches_and_recomputation_are_kept() {
        let with = |micro_batches: Option<usize>, recompute: Option<bool>| StrategyConfigs {
            auto: AutoConfig {
                micro_batches,
                recompute,
                ..Default::default()
            },
            ..Default::default()
        };
        let p = || Some(planner(16 << 30));
        // Every candidate keeps the fixed micro-batches: 4 micro-batches of 8 for 2 replicas.
        for c in planner(16 << 30)
            .plan_within(2, Fixed::of_config(&with(Some(4), None).auto))
            .unwrap()
            .candidates
        {
            assert_eq!(c.layout.micro_batches, 4, "{c:?}");
        }
        let plan = resolve_within(p(), 2, with(Some(4), None), None).unwrap();
        let micro_batches = match plan.degree("pp") {
            1 => plan.grad_accumulation(),
            _ => plan.configs().pipeline.micro_batches,
        };
        assert_eq!(micro_batches, 4, "{plan}");
        assert!(plan.reason().contains("4 micro-batch(es)"), "{plan}");
        // Under auto, a gradient accumulation names the same micro-batches; two that differ
        // are refused.
        let mut accumulated = StrategyConfigs::default();
        accumulated.set_grad_accumulation(4);
        let plan = resolve_within(p(), 2, accumulated.clone(), None).unwrap();
        assert!(plan.reason().contains("4 micro-batch(es)"), "{plan}");
        accumulated.auto.micro_batches = Some(2);
        assert_eq!(
            resolve_within(p(), 2, accumulated, None),
            Err(ConfigError::AutoMicroBatchesApart {
                micro_batches: 2,
                accumulation: 4
            })
        );
        // Micro-batches that cut no replica's samples evenly: 5 of a replica's 32 or 64.
        let uneven = resolve_within(p(), 2, with(Some(5), None), None).unwrap_err();
        assert!(
            uneven
                .to_string()
                .contains("5 micro-batch(es) cut no layout's"),
            "{uneven}"
        );
        // Recomputation fixed: every layout with stages recomputes (those without have
        // nothing to recompute).
        let recomputed = Fixed::of_config(&with(None, Some(true)).auto);
        let candidates = planner(16 << 30)
            .plan_within(2, recomputed)
            .unwrap()
            .candidates;
        assert!(candidates.iter().any(|c| c.layout.pp > 1));
        for c in candidates {
            assert_eq!(c.layout.recompute, c.layout.pp > 1, "{c:?}");
        }
        // Without a planner: the fixed settings written into the replicas' strategy.
        let plan = resolve_within(None, 2, with(Some(4), None), None).unwrap();
        assert_eq!(
            (plan.strategy(), plan.grad_accumulation()),
            (StrategyKind::Ddp, 4)
        );
        let staged = StrategyConfigs {
            auto: AutoConfig {
                stages: Some(2),
                micro_batches: Some(8),
                recompute: Some(true),
                ..Default::default()
            },
            ..Default::default()
        };
        let plan = resolve_within(None, 2, staged, None).unwrap();
        let pipeline = &plan.configs().pipeline;
        assert_eq!((pipeline.micro_batches, pipeline.recompute), (8, true));
        assert_eq!(
            resolve_within(None, 2, with(Some(0), None), None),
            Err(ConfigError::ZeroMicroBatches)
        );
    }

    #[test]
    fn replicas_of_fixed_stages_take_as_many_ranks_as_they_need() {
        let staged = StrategyConfigs {
            auto: AutoConfig {
                stages: Some(2),
                ..Default::default()
            },
            ..Default::default()
        };
        // `--dp 2` with two stages: four ranks, not two.
        let plan = Plan::resolve(PlanRequest {
            dp: Some(2),
            configs: staged.clone(),
            ..PlanRequest::new(StrategyKind::Auto, 64)
        })
        .unwrap();
        assert_eq!((plan.world_size(), plan.degree("dp")), (4, 2), "{plan}");
        // Three cores hold one replica of two stages.
        let plan = Plan::resolve(PlanRequest {
            cpu_cores: Some(3),
            configs: staged,
            ..PlanRequest::new(StrategyKind::Auto, 64)
        })
        .unwrap();
        assert_eq!((plan.world_size(), plan.degree("pp")), (2, 2), "{plan}");
    }

    #[test]
    fn the_ranks_of_several_machines_crowd_their_own_machine_s_cores() {
        let one = planner(16 << 30);
        let two = Planner {
            nodes: 2,
            ..one.clone()
        };
        // Four ranks on each of two 2-core machines: each machine's ranks share its memory, and
        // crowd its cores as four ranks crowd one machine's.
        let (a, b) = (two.cluster(8), one.cluster(4));
        assert_eq!((a.per_node, a.cores, a.memory), (4, Some(4), b.memory));
        assert_eq!(a.crowding(), b.crowding());
        // A run too large for its timeout is refused before anything waits.
        let mut configs = StrategyConfigs::default();
        configs.ddp.collective_timeout_s = 1e20;
        let refused = Plan::resolve(PlanRequest {
            configs,
            ..PlanRequest::new(StrategyKind::Auto, 64).with_world(2)
        });
        assert_eq!(refused.unwrap_err(), ConfigError::Timeout(1e20));
    }
}
