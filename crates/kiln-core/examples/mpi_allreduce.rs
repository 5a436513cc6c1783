//! All-reduce bandwidth of Kiln's MPI collective next to a raw rsmpi all-reduce of the same
//! bytes, in the same processes, alternating, so that both see the same machine:
//!
//! ```text
//! cargo build --release -p kiln-core --features mpi --example mpi_allreduce
//! mpirun -n 2 --oversubscribe --bind-to none target/release/examples/mpi_allreduce
//! ```
//!
//! Kiln's call includes what a strategy pays: the tensor's copy to host memory and back, and
//! the wait loop that gives MPI a timeout.

use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::tensor::Tensor;
use kiln_core::World;
use kiln_core::collective::{MeshCollectives, ReduceOp};
use kiln_core::world::ProcessInfo;
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use mpi::topology::{Communicator, SimpleCommunicator};

const ROUNDS: usize = 15;

/// The `kiln` binary's allocator, whose kept pages a fresh receive buffer reuses.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The median round, as the planner reads its timings ([`kiln_core::stats::median`]).
fn median(times: Vec<Duration>) -> Duration {
    let seconds: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(kiln_core::stats::median(&seconds))
}

fn main() {
    let process = ProcessInfo::from_launcher().expect("launched by mpirun");
    let world = World::new(process, vec![()]).expect("one rank per process");
    let mut ranks = MeshCollectives::<Flex>::for_world(&world, Duration::from_secs(60))
        .expect("MPI connects the processes");
    let kiln = ranks[0].world();
    // Initialised by Kiln's collective above; the raw calls use the same MPI.
    let raw = SimpleCommunicator::world();
    let (me, processes) = (raw.rank(), raw.size() as usize);
    if me == 0 {
        println!("{processes} processes; median of {ROUNDS} rounds after a warm-up");
        println!(
            "{:>8} {:>12} {:>12} {:>10} {:>10} {:>7}",
            "MB", "raw ms", "kiln ms", "raw GB/s", "kiln GB/s", "kiln/raw"
        );
    }
    for mb in [1usize, 25, 100] {
        let n = mb * 1_000_000 / 4;
        let values: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        let mut out = vec![0f32; n];
        let (mut raw_t, mut kiln_t) = (Vec::new(), Vec::new());
        for round in 0..=ROUNDS {
            raw.barrier();
            let start = Instant::now();
            raw.all_reduce_into(&values[..], &mut out[..], SystemOperation::sum());
            let raw_took = start.elapsed();
            // A fresh tensor, as a strategy's gradient bucket is.
            let tensor = Tensor::<Flex, 1>::from_floats(values.as_slice(), &Default::default());
            raw.barrier();
            let start = Instant::now();
            let reduced = kiln.all_reduce(tensor, ReduceOp::Sum).expect("all-reduce");
            let kiln_took = start.elapsed();
            if round == 0 {
                // Warm-up; and both must agree.
                let got = reduced.into_data().into_vec::<f32>().unwrap();
                assert_eq!(got, out, "Kiln's all-reduce differs from MPI's");
                continue;
            }
            raw_t.push(raw_took);
            kiln_t.push(kiln_took);
        }
        let (r, k) = (median(raw_t), median(kiln_t));
        // Bus bandwidth as nccl-tests report it: 2 (p - 1) / p of the bytes cross per rank.
        let bus = |t: Duration| {
            let bytes = (n * 4) as f64 * 2.0 * (processes - 1) as f64 / processes as f64;
            bytes / t.as_secs_f64() / 1e9
        };
        if me == 0 {
            println!(
                "{mb:>8} {:>12.2} {:>12.2} {:>10.2} {:>10.2} {:>7.2}",
                r.as_secs_f64() * 1e3,
                k.as_secs_f64() * 1e3,
                bus(r),
                bus(k),
                k.as_secs_f64() / r.as_secs_f64()
            );
        }
    }
    drop(ranks);
    kiln_core::collective::mpi::finalize();
}
