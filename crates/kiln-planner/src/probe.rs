//! The in-process collective's latency and bandwidth between two ranks, probed.

use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use super::measure::MeasureError;
use kiln_core::collective::{Collective, CollectiveError, InProcess, Link, ReduceOp};
use kiln_core::stats::{WARMUP, median};

/// The in-process collective between two ranks on `device`, `calls` timed each way after a
/// warm-up:
/// - its latency: the second rank sleeps before each all-reduce of 16 values, so the first
///   is asleep in the call when the second arrives, as ranks reach a step's collectives one
///   after the other; the latency is the time from the second's arrival to the first's
///   return (waking a thread, on a machine of few cores, is most of a small collective);
/// - its bandwidth: all-reduces of 1 Mi values (4 MiB) against ones of 16, back to back.
///
/// # Errors
/// A collective that fails (a timeout: a rank that does not arrive in `timeout`).
pub fn probe_links<B: AutodiffBackend>(
    device: &B::Device,
    calls: usize,
    timeout: Duration,
) -> Result<Link, MeasureError> {
    const SMALL: usize = 16;
    const LARGE: usize = 1 << 20;
    /// How long the second rank sleeps before each latency call: enough for the first to
    /// fall asleep waiting.
    const LATE: Duration = Duration::from_micros(300);
    let rounds = calls + WARMUP;
    let arrivals: Vec<std::sync::OnceLock<Instant>> =
        (0..rounds).map(|_| std::sync::OnceLock::new()).collect();
    let run = |mut rank: InProcess<B>| -> Result<(f64, f64, f64), CollectiveError> {
        let tensor = |len: usize| {
            Tensor::<B, 1>::from_data(TensorData::new(vec![1.0f32; len], [len]), device)
        };
        let (small, large) = (tensor(SMALL), tensor(LARGE));
        let mut woken = Vec::with_capacity(calls);
        for (call, arrival) in arrivals.iter().enumerate() {
            if rank.rank() == 1 {
                std::thread::sleep(LATE);
                let _ = arrival.set(Instant::now());
            }
            let _ = rank.all_reduce(small.clone(), ReduceOp::Sum)?.into_data();
            if rank.rank() == 0 && call >= WARMUP {
                let arrived = *arrival.get().expect("the second rank arrived first");
                woken.push(arrived.elapsed().as_secs_f64());
            }
        }
        let mut back_to_back = |tensor: &Tensor<B, 1>| -> Result<f64, CollectiveError> {
            let mut times = Vec::with_capacity(calls);
            for call in 0..rounds {
                let start = Instant::now();
                // The result read back, as a step's gradients are used.
                let _ = rank.all_reduce(tensor.clone(), ReduceOp::Sum)?.into_data();
                if call >= WARMUP {
                    times.push(start.elapsed().as_secs_f64());
                }
            }
            Ok(median(&times))
        };
        Ok((median(&woken), back_to_back(&small)?, back_to_back(&large)?))
    };
    let [first, second]: [InProcess<B>; 2] = InProcess::group(2, timeout)
        .try_into()
        .unwrap_or_else(|_| unreachable!("a group of two"));
    let (latency, small, large) = std::thread::scope(|s| {
        let other = s.spawn(|| run(second));
        let mine = run(first);
        let theirs = other
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        theirs.and(mine)
    })?;
    Ok(Link::probed(latency, small, large, (LARGE * 4) as f64))
}
