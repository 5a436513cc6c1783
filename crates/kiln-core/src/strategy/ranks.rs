//! The rank-thread runtime of the strategies whose ranks are worker threads (Ddp, Pipeline,
//! Tensor): each rank's loop ([`serve`]), and the caller's side ([`RankThreads`]) that sends
//! commands and collects one reply per rank, so that a failed or wedged rank can never hang
//! the caller.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use burn::tensor::backend::Backend;

use super::exchange::Share;
use super::facts::{RankFacts, share};
use super::handover::panic_error;
use super::{ConfigError, RankError, RankFailure, RankStats, StepOutput, StrategyError};
use crate::collective::Collective;
use crate::grads::BucketPlan;
use crate::optim::GuardReport;
use crate::world::Mesh;

/// A finished start-up or step of one rank.
pub(crate) struct RankDone {
    /// `Σ n · loss` over the samples this rank scored.
    pub loss_sum: f64,
    /// Samples this rank scored.
    pub samples: usize,
    /// Time in forward, backward and optimizer.
    pub compute: Duration,
    /// Time synchronising.
    pub communication: Duration,
    /// Gradient buckets of the rank's all-reduce.
    pub num_buckets: usize,
    /// The rank's running totals.
    pub stats: RankStats,
    /// What the guard did this step (every rank decides the same).
    pub guard: Option<GuardReport>,
    /// The rank's training-step output items, when the step asked for them
    /// ([`Shard::keep_items`]); typed by the strategy, which knows the model.
    pub items: Vec<Box<dyn Any + Send>>,
    /// Every rank's facts of the same step, in world-rank order ([`Self::shared`]).
    pub world: Vec<RankFacts>,
    /// Whether the rank's process asked to stop ([`Shard::stop`]).
    pub stop: bool,
}

impl RankDone {
    /// A rank's report: what it scored and spent, its bucket count from `plan`, and a copy of
    /// its running totals.
    pub fn new(
        (loss_sum, samples): (f64, usize),
        (compute, communication): (Duration, Duration),
        plan: Option<&BucketPlan>,
        stats: &RankStats,
    ) -> Self {
        Self {
            loss_sum,
            samples,
            compute,
            communication,
            num_buckets: plan.map_or(0, BucketPlan::num_buckets),
            stats: stats.clone(),
            guard: None,
            items: Vec::new(),
            world: Vec::new(),
            stop: false,
        }
    }

    /// This report with the stop request its shard carried.
    pub fn with_stop(self, stop: bool) -> Self {
        Self { stop, ..self }
    }

    /// This report with every rank's facts, learned through `world` (every rank of the world
    /// calls this at the same point): how a process learns the ranks of the others.
    pub fn shared<B: Backend>(
        mut self,
        world: &mut dyn Collective<B>,
        device: &B::Device,
    ) -> Result<Self, RankError> {
        self.stats.peak_bytes = crate::memory::rank_peak(self.stats.rank, device);
        self.stats.held_bytes = (!crate::memory::device::has_own_memory(device))
            .then(|| crate::memory::rank(self.stats.rank).map(|c| c.live))
            .flatten();
        self.world = share(world, &self.facts(), device)?;
        Ok(self)
    }

    /// What of this report every rank learns.
    fn facts(&self) -> RankFacts {
        RankFacts {
            loss_sum: self.loss_sum,
            samples: self.samples,
            compute: self.compute,
            communication: self.communication,
            stats: self.stats.clone(),
            stop: self.stop,
        }
    }

    /// This report with the guard's decision.
    pub fn with_guard(self, guard: Option<GuardReport>) -> Self {
        Self { guard, ..self }
    }

    /// This report with the rank's output items.
    pub fn with_items<T: Send + 'static>(self, items: Vec<T>) -> Self {
        let items = items
            .into_iter()
            .map(|item| Box::new(item) as Box<dyn Any + Send>)
            .collect();
        Self { items, ..self }
    }
}

/// One step's output from the facts of every rank of `mesh` (which each of this process's
/// reports carries, `done[0]`'s read); the ranks' totals replace `stats`. The tensor-parallel
/// shards of a replica score the same samples: only the first counts.
pub(crate) fn step_output(
    stats: &mut Vec<RankStats>,
    done: Vec<RankDone>,
    mesh: &Mesh,
) -> StepOutput {
    let first = done
        .into_iter()
        .next()
        .expect("a process has at least one rank");
    let mut output = StepOutput {
        loss: 0.0,
        samples: 0,
        compute: Duration::ZERO,
        communication: Duration::ZERO,
        guard: first.guard,
        stop: false,
    };
    let mut loss_sum = 0.0;
    stats.clear();
    for (rank, facts) in first.world.into_iter().enumerate() {
        if mesh.coord(rank, Mesh::TP) == 0 {
            loss_sum += facts.loss_sum;
            output.samples += facts.samples;
        }
        output.stop |= facts.stop;
        output.compute = output.compute.max(facts.compute);
        output.communication = output.communication.max(facts.communication);
        stats.push(facts.stats);
    }
    output.loss = loss_sum / output.samples.max(1) as f64;
    output
}

/// A rank's reply to one command.
struct Reply<D> {
    /// The rank answering (an index into this process's ranks).
    pub rank: usize,
    /// What it did, or why it could not.
    pub result: Result<D, RankError>,
}

/// Waits for one report from each of `ranks` ranks. Once any rank has failed, the others get
/// at most `grace` to report (their collectives time out before that), so the caller returns
/// with every failure named.
fn collect<D>(
    reports: &Receiver<Reply<D>>,
    ranks: usize,
    first: usize,
    grace: Duration,
) -> Result<Vec<D>, StrategyError> {
    let mut done: Vec<Option<D>> = (0..ranks).map(|_| None).collect();
    let mut failures = Vec::new();
    let mut pending = ranks;
    while pending > 0 {
        let report = if failures.is_empty() {
            reports.recv().map_err(|_| RecvTimeoutError::Disconnected)
        } else {
            reports.recv_timeout(grace)
        };
        match report {
            Ok(Reply { rank, result }) => {
                pending -= 1;
                match result {
                    Ok(d) => done[rank] = Some(d),
                    Err(error) => failures.push(RankFailure { rank, error }),
                }
            }
            Err(reason) => {
                let error = match reason {
                    RecvTimeoutError::Timeout => RankError::Silent(grace),
                    RecvTimeoutError::Disconnected => RankError::Gone,
                };
                for (rank, _) in done.iter().enumerate().filter(|(_, d)| d.is_none()) {
                    if !failures.iter().any(|f: &RankFailure| f.rank == rank) {
                        failures.push(RankFailure {
                            rank,
                            error: error.clone(),
                        });
                    }
                }
                break;
            }
        }
    }
    if failures.is_empty() {
        Ok(done
            .into_iter()
            .map(|d| d.expect("every rank reported"))
            .collect())
    } else {
        // Named by their rank in the world, not in this process.
        for failure in &mut failures {
            failure.rank += first;
        }
        Err(StrategyError::from_failures(failures))
    }
}

/// A rank's part of one global batch, cut once by the caller.
#[derive(Debug, Clone)]
pub(crate) struct Shard {
    /// The samples this rank (or its replica) trains on.
    pub indices: Arc<[usize]>,
    /// Samples of the whole global batch, over every replica: each micro-batch's loss is
    /// weighted by its share of them.
    pub global_samples: usize,
    /// Whether the rank sends back its training-step output items.
    pub keep_items: bool,
    /// Whether this process asked the run to stop ([`super::Strategy::ask_stop`]).
    pub stop: bool,
}

impl Shard {
    /// Each of `shards` (one per replica) with the total they add up to.
    pub fn of_replicas(shards: Vec<Vec<usize>>) -> Vec<Shard> {
        let global_samples = shards.iter().map(Vec::len).sum();
        shards
            .into_iter()
            .map(|indices| Shard {
                indices: indices.into(),
                global_samples,
                keep_items: false,
                stop: false,
            })
            .collect()
    }
}

/// What the dispatcher asks of a rank thread.
enum Command<R> {
    /// Train on this shard of a global batch.
    Step { shard: Shard, lr: f64 },
    /// Send back what the rank holds (its replica, or its stage).
    Hand(Sender<Option<R>>),
    /// Send back the rank's module whole, gathered with the other ranks where they hold parts
    /// of it.
    Gather(Sender<Result<R, RankError>>),
    /// Send back the rank's optimizer state, encoded.
    SaveOptimizer(Sender<Result<Vec<u8>, RankError>>),
    /// Replace the rank's optimizer state with this one.
    LoadOptimizer(Arc<[u8]>, Sender<Result<(), RankError>>),
    /// Gather what every rank holds, through the world's collective.
    Share(Share, Sender<Result<Vec<Vec<u8>>, RankError>>),
    /// Leave the loop.
    Stop,
}

/// A rank's side of a worker-thread strategy: how it starts, steps and hands over its module.
pub(crate) trait RankWork {
    /// What [`Command::Hand`] returns.
    type Held;

    /// Prepares the rank (moves its module to its device, plans its buckets).
    fn start(&mut self) -> Result<RankDone, RankError>;
    /// One optimizer step on the rank's `shard` of a global batch.
    fn step(&mut self, shard: &Shard, lr: f64) -> Result<RankDone, RankError>;
    /// A copy of what the rank holds, readable from another thread; `None` when it cannot.
    fn hand(&mut self) -> Option<Self::Held>;
    /// What the rank holds, whole: where the ranks hold parts of it between steps (ZeRO-3),
    /// every rank of the group makes this call together. By default, [`Self::hand`].
    fn gather(&mut self) -> Result<Self::Held, RankError> {
        self.hand().ok_or(RankError::Gone)
    }
    /// The rank's optimizer state, encoded.
    fn save_optimizer(&mut self) -> Result<Vec<u8>, RankError>;
    /// Replaces the rank's optimizer state with `bytes` (from [`Self::save_optimizer`]).
    fn load_optimizer(&mut self, bytes: &[u8]) -> Result<(), RankError>;
    /// Every rank's module or optimizer state, encoded, in world-rank order: every rank of
    /// the world makes this call together.
    fn share(&mut self, what: Share) -> Result<Vec<Vec<u8>>, RankError>;
    /// Fails every collective group of the rank, so no peer waits for it.
    fn abort(&mut self, reason: &str);
}

/// Runs `f`; a panic or error aborts the rank's groups so the other ranks stop waiting at once.
fn guarded<W: RankWork>(
    work: &mut W,
    f: impl FnOnce(&mut W) -> Result<RankDone, RankError>,
) -> Result<RankDone, RankError> {
    let result = catch_unwind(AssertUnwindSafe(|| f(work)))
        .unwrap_or_else(|payload| Err(panic_error(payload)));
    if let Err(error) = &result {
        work.abort(&error.to_string());
    }
    result
}

/// A rank thread's loop: start, then serve commands until `Stop` or until the dispatcher is
/// gone. After a failure every step answers [`RankError::Gone`].
fn serve<W: RankWork>(
    mut work: W,
    rank: usize,
    inbox: Receiver<Command<W::Held>>,
    reports: Sender<Reply<RankDone>>,
) {
    // A send fails only when the dispatcher is gone, and then there is nobody to serve.
    let report = |result| reports.send(Reply { rank, result }).is_ok();
    let result = guarded(&mut work, W::start);
    let mut failed = result.is_err();
    if !report(result) {
        return;
    }
    for command in inbox {
        match command {
            Command::Step { shard, lr } => {
                let result = if failed {
                    Err(RankError::Gone)
                } else {
                    guarded(&mut work, |w| w.step(&shard, lr))
                };
                failed |= result.is_err();
                if !report(result) {
                    return;
                }
            }
            Command::Hand(reply) => {
                let _ = reply.send(work.hand());
            }
            Command::SaveOptimizer(reply) => {
                let result = if failed {
                    Err(RankError::Gone)
                } else {
                    work.save_optimizer()
                };
                let _ = reply.send(result);
            }
            Command::Share(what, reply) => {
                let result = if failed {
                    Err(RankError::Gone)
                } else {
                    work.share(what)
                };
                failed |= aborted_on_error(&mut work, &result);
                let _ = reply.send(result);
            }
            Command::Gather(reply) => {
                let result = if failed {
                    Err(RankError::Gone)
                } else {
                    work.gather()
                };
                failed |= aborted_on_error(&mut work, &result);
                let _ = reply.send(result);
            }
            Command::LoadOptimizer(bytes, reply) => {
                let result = if failed {
                    Err(RankError::Gone)
                } else {
                    work.load_optimizer(&bytes)
                };
                let _ = reply.send(result);
            }
            Command::Stop => return,
        }
    }
}

/// Whether `result` of a call every rank makes together failed: the rank then aborts its
/// groups, since the other ranks wait for it in that call.
fn aborted_on_error<W: RankWork, T>(work: &mut W, result: &Result<T, RankError>) -> bool {
    match result {
        Err(error) => {
            work.abort(&error.to_string());
            true
        }
        Ok(_) => false,
    }
}

struct RankHandle<R> {
    commands: Sender<Command<R>>,
    thread: Option<JoinHandle<()>>,
}

/// The dispatcher's side: one thread per rank, commands out, one report per rank back.
pub(crate) struct RankThreads<R> {
    ranks: Vec<RankHandle<R>>,
    /// The world's rank of this process's first rank.
    first: usize,
    reports: Receiver<Reply<RankDone>>,
    grace: Duration,
    broken: Option<usize>,
}

impl<R: Send + 'static> RankThreads<R> {
    /// Starts a thread named `name-rank{r}` per worker (this process's ranks, the first of
    /// which is the world's rank `first`), each inside its rank's thread pool, and waits for
    /// their start-up reports. `timeout` is the collectives' timeout: a rank silent for longer
    /// after another failed is reported as such.
    pub fn spawn<W>(
        name: &str,
        first: usize,
        workers: Vec<(W, super::threads::RankPool)>,
        timeout: Duration,
    ) -> Result<(Self, Vec<RankDone>), StrategyError>
    where
        W: RankWork<Held = R> + Send + 'static,
    {
        let (report_tx, reports) = mpsc::channel();
        let mut ranks = Vec::with_capacity(workers.len());
        for (rank, (work, pool)) in workers.into_iter().enumerate() {
            let (commands, inbox) = mpsc::channel();
            let reports = report_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("{name}-rank{}", first + rank))
                .spawn(move || {
                    // The rank's peak starts with it (a rank of an earlier strategy in this
                    // process may have had its number).
                    crate::memory::restart_rank_peak(first + rank);
                    pool.install(move || serve(work, rank, inbox, reports))
                })
                .map_err(|e| ConfigError::ThreadPool {
                    rank,
                    reason: e.to_string(),
                })?;
            ranks.push(RankHandle {
                commands,
                thread: Some(thread),
            });
        }
        let mut threads = Self {
            ranks,
            first,
            reports,
            grace: timeout + Duration::from_secs(1),
            broken: None,
        };
        let ready = threads.collect()?;
        Ok((threads, ready))
    }

    /// The world's rank of this process's first rank.
    pub fn first(&self) -> usize {
        self.first
    }

    /// Ranks of this process.
    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    /// Sends every rank one step on its shard (`shards[rank]`) and waits for all reports.
    /// After a failure the strategy is broken and every later step is refused.
    pub fn step(&mut self, shards: Vec<Shard>, lr: f64) -> Result<Vec<RankDone>, StrategyError> {
        if let Some(culprit) = self.broken {
            return Err(StrategyError::Broken { culprit });
        }
        // A missing shard would leave its rank's report missing, and `collect` waiting.
        assert_eq!(shards.len(), self.ranks.len(), "one shard per rank");
        for (rank, shard) in self.ranks.iter().zip(shards) {
            // A rank whose thread is gone is noticed in `collect` by its missing report.
            let _ = rank.commands.send(Command::Step { shard, lr });
        }
        self.collect()
    }

    /// What rank `rank` holds.
    pub fn hand(&self, rank: usize) -> Result<R, StrategyError> {
        let (reply, answer) = mpsc::channel();
        let sent = self.ranks[rank].commands.send(Command::Hand(reply)).is_ok();
        match answer.recv() {
            Ok(Some(held)) if sent => Ok(held),
            _ => Err(StrategyError::Broken {
                culprit: self.broken.unwrap_or(self.first + rank),
            }),
        }
    }

    /// What the process's first rank holds, whole, gathered by every rank of this process
    /// (every process must ask at the same point; see [`RankWork::gather`]).
    pub fn gather(&self) -> Result<R, StrategyError> {
        let held = self.ask_each(|_, reply| Command::Gather(reply))?;
        Ok(held
            .into_iter()
            .next()
            .expect("a process has at least one rank"))
    }

    /// Rank `rank`'s optimizer state, encoded.
    pub fn save_optimizer(&self, rank: usize) -> Result<Vec<u8>, StrategyError> {
        if let Some(culprit) = self.broken {
            return Err(StrategyError::Broken { culprit });
        }
        let (reply, answer) = mpsc::channel();
        let _ = self.ranks[rank]
            .commands
            .send(Command::SaveOptimizer(reply));
        match answer.recv() {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(error)) => Err(StrategyError::from_failures(vec![RankFailure {
                rank: self.first + rank,
                error,
            }])),
            Err(_) => Err(StrategyError::Broken {
                culprit: self.first + rank,
            }),
        }
    }

    /// What every rank of the world holds ([`Share`]), gathered through the collective by
    /// this process's ranks (every process must ask at the same point): one answer, the same
    /// on every rank.
    pub fn share(&self, what: Share) -> Result<Vec<Vec<u8>>, StrategyError> {
        let answers = self.ask_each(|_, reply| Command::Share(what, reply))?;
        Ok(answers
            .into_iter()
            .next()
            .expect("a process has at least one rank"))
    }

    /// Loads `parts[rank]` into every rank's optimizer.
    pub fn load_optimizer(&self, parts: Vec<Arc<[u8]>>) -> Result<(), StrategyError> {
        assert_eq!(parts.len(), self.ranks.len(), "one state per rank");
        self.ask_each(|i, reply| Command::LoadOptimizer(parts[i].clone(), reply))
            .map(drop)
    }

    /// Sends every rank the command `command(rank's index, reply)` makes and waits for every
    /// answer; the failures are named by their rank in the world.
    fn ask_each<T>(
        &self,
        command: impl Fn(usize, Sender<Result<T, RankError>>) -> Command<R>,
    ) -> Result<Vec<T>, StrategyError> {
        if let Some(culprit) = self.broken {
            return Err(StrategyError::Broken { culprit });
        }
        let answers: Vec<_> = self
            .ranks
            .iter()
            .enumerate()
            .map(|(i, rank)| {
                let (reply, answer) = mpsc::channel();
                // A rank whose thread is gone is noticed by its missing answer.
                let _ = rank.commands.send(command(i, reply));
                answer
            })
            .collect();
        let mut done = Vec::with_capacity(answers.len());
        let mut failures = Vec::new();
        for (i, answer) in answers.into_iter().enumerate() {
            let rank = self.first + i;
            match answer.recv() {
                Ok(Ok(value)) => done.push(value),
                Ok(Err(error)) => failures.push(RankFailure { rank, error }),
                Err(_) => failures.push(RankFailure {
                    rank,
                    error: RankError::Gone,
                }),
            }
        }
        if failures.is_empty() {
            Ok(done)
        } else {
            // The failed ranks answer every later command with `Gone`.
            Err(StrategyError::from_failures(failures))
        }
    }

    fn collect(&mut self) -> Result<Vec<RankDone>, StrategyError> {
        collect(&self.reports, self.ranks.len(), self.first, self.grace).inspect_err(|error| {
            self.broken = error.culprit();
        })
    }
}

impl<R> Drop for RankThreads<R> {
    fn drop(&mut self) {
        for rank in &self.ranks {
            let _ = rank.commands.send(Command::Stop);
        }
        for rank in &mut self.ranks {
            if let Some(thread) = rank.thread.take() {
                let _ = thread.join();
            }
        }
    }
}
