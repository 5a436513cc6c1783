//! The MPI collective across real processes: each test starts `mpirun -n 2` on this test
//! binary, whose processes (two ranks each, as threads) run one scenario and print what they
//! saw; the test reads it. Needs Open MPI (`.ci/run` installs it) and the `mpi` feature.
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::tensor::Tensor;
use kiln_core::World;
use kiln_core::collective::{CollectiveError, MeshCollectives, ReduceOp};
use kiln_core::world::{Mesh, ProcessInfo};

const SCENARIO: &str = "KILN_MPI_SCENARIO";

/// Runs `scenario` in 2 processes of 2 ranks each; their output, and how long it took.
fn mpirun(scenario: &str) -> (Output, Duration) {
    // A session directory of its own: Open MPI keeps every job's files under
    // `<tmpdir>/ompi.<host>.<uid>`, which a job that ends may remove while another test's job
    // is starting in it.
    let session = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ompi-{scenario}"));
    std::fs::remove_dir_all(&session).ok();
    std::fs::create_dir_all(&session).unwrap();
    let mut cmd = Command::new("mpirun");
    cmd.args(["-n", "2", "--oversubscribe", "--bind-to", "none"])
        .args(["--mca", "orte_tmpdir_base"])
        .arg(&session);
    if std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0")))
    {
        cmd.arg("--allow-run-as-root");
    }
    cmd.arg(std::env::current_exe().unwrap())
        .args(["--exact", "scenario", "--nocapture", "--test-threads", "1"])
        .env(SCENARIO, scenario);
    let start = Instant::now();
    let output = cmd.output().expect("mpirun runs (Open MPI installed)");
    (output, start.elapsed())
}

fn text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

/// The entry of the processes mpirun starts; a no-op in the ordinary test run.
#[test]
fn scenario() {
    let Ok(name) = std::env::var(SCENARIO) else {
        return;
    };
    let process = ProcessInfo::from_launcher().unwrap();
    let mesh = Mesh::new(&[("dp", 2), ("pp", 2)]).unwrap();
    let world = World::new(process, vec![(); 2])
        .unwrap()
        .with_mesh(mesh)
        .unwrap();
    let timeout = Duration::from_secs(if name == "stall" { 2 } else { 30 });
    let ranks = MeshCollectives::<Flex>::for_world(&world, timeout).unwrap();
    let lines: Vec<String> = std::thread::scope(|s| {
        let jobs: Vec<_> = ranks
            .into_iter()
            .map(|c| {
                let name = name.clone();
                s.spawn(move || run(&name, c))
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for line in lines {
        println!("{line}");
    }
    if name == "ops" {
        kiln_core::collective::mpi::finalize();
    } else {
        // A failed job ends without finalising, as a failed run does, which makes mpirun end
        // the other process: first give it the time to report what it learned.
        std::thread::sleep(Duration::from_secs(2));
        std::process::exit(0);
    }
}

fn floats(t: Tensor<Flex, 1>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().unwrap()
}

fn x(values: &[f32]) -> Tensor<Flex, 1> {
    Tensor::from_floats(values, &Default::default())
}

/// One rank's part of `scenario`, reported as one line.
fn run(scenario: &str, mut c: MeshCollectives<Flex>) -> String {
    let rank = c.rank();
    match scenario {
        "ops" => {
            let r = rank as f32;
            let w = c.world();
            let sum = floats(w.all_reduce(x(&[r, 1.0]), ReduceOp::Sum).unwrap());
            let mean = floats(w.all_reduce(x(&[r]), ReduceOp::Mean).unwrap());
            let max = floats(w.all_reduce(x(&[r]), ReduceOp::Max).unwrap());
            let from3 = floats(w.broadcast(x(&[r * 10.0]), 3).unwrap());
            let gathered = floats(w.all_gather(x(&[r, -r])).unwrap());
            let scattered = floats(
                w.reduce_scatter(x(&[1.0, 2.0, 3.0, 4.0]), ReduceOp::Sum)
                    .unwrap(),
            );
            // To each rank in turn: a process's leader (0, 2) and not (1, 3), each process's.
            let reduced: Vec<Option<Vec<f32>>> = (0..4)
                .map(|root| {
                    let op = if root == 0 {
                        ReduceOp::Mean
                    } else {
                        ReduceOp::Sum
                    };
                    w.reduce(x(&[r, 1.0]), op, root).unwrap().map(floats)
                })
                .collect();
            // Point to point: around the ring 0 → 1 → 2 → 3 → 0 (1 → 2 and 3 → 0 cross
            // processes), two messages each, which must arrive in order.
            let (next, prev) = ((rank + 1) % 4, (rank + 3) % 4);
            w.send(x(&[r, 1.0]), next).unwrap();
            w.send(x(&[r, 2.0]), next).unwrap();
            let first = floats(w.recv(prev, 2, &Default::default()).unwrap());
            let second = floats(w.recv(prev, 2, &Default::default()).unwrap());
            w.barrier().unwrap();
            // The axes: dp {0, 2} and {1, 3} cross the processes, pp {0, 1} and {2, 3} do not.
            let dp = floats(
                c.axis("dp")
                    .unwrap()
                    .all_reduce(x(&[r]), ReduceOp::Sum)
                    .unwrap(),
            );
            let pp = floats(
                c.axis("pp")
                    .unwrap()
                    .all_reduce(x(&[r]), ReduceOp::Sum)
                    .unwrap(),
            );
            format!(
                "OPS rank {rank}: sum {sum:?} mean {mean:?} max {max:?} bcast {from3:?} gather \
                 {gathered:?} scatter {scattered:?} reduce {reduced:?} recv {first:?} {second:?} \
                 dp {dp:?} pp {pp:?}"
            )
        }
        "stall" => {
            // The second process (ranks 2 and 3) arrives far too late.
            if rank >= 2 {
                std::thread::sleep(Duration::from_secs(8));
                return format!("LATE rank {rank}");
            }
            match c.world().all_reduce(x(&[1.0]), ReduceOp::Sum) {
                Err(e) => format!("ERR rank {rank}: culprit {:?}: {e}", e.culprit()),
                Ok(_) => format!("OK rank {rank}"),
            }
        }
        "abort" => {
            if rank == 3 {
                c.world().abort("out of memory");
                return format!("ABORTED rank {rank}");
            }
            match c.world().all_reduce(x(&[1.0]), ReduceOp::Sum) {
                Err(e @ CollectiveError::PeerFailed { .. }) => {
                    format!("ERR rank {rank}: culprit {:?}: {e}", e.culprit())
                }
                other => format!("UNEXPECTED rank {rank}: {other:?}"),
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
fn every_operation_across_two_processes_of_two_ranks() {
    let (output, _) = mpirun("ops");
    let out = text(&output);
    assert!(output.status.success(), "{out}");
    for rank in 0..4usize {
        let r = rank as f32;
        let (prev, g) = (
            ((rank + 3) % 4) as f32,
            [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0],
        );
        let dp = if rank % 2 == 0 { 2.0 } else { 4.0 };
        let pp = if rank < 2 { 1.0 } else { 5.0 };
        // The root alone receives the reduction.
        let reduced: Vec<Option<Vec<f32>>> = (0..4)
            .map(|root| match (root == rank, root) {
                (false, _) => None,
                (true, 0) => Some(vec![1.5, 1.0]),
                (true, _) => Some(vec![6.0, 4.0]),
            })
            .collect();
        let expected = format!(
            "OPS rank {rank}: sum {:?} mean {:?} max {:?} bcast {:?} gather {:?} scatter {:?} \
             reduce {:?} recv {:?} {:?} dp {:?} pp {:?}",
            [6.0f32, 4.0],
            [1.5f32],
            [3.0f32],
            [30.0f32],
            g,
            [4.0 * (r + 1.0)],
            reduced,
            [prev, 1.0],
            [prev, 2.0],
            [dp],
            [pp],
        );
        assert!(
            out.contains(&expected),
            "rank {rank}: expected\n{expected}\nin\n{out}"
        );
    }
}

#[test]
fn a_stalled_process_is_named_by_the_timeout() {
    let (output, took) = mpirun("stall");
    let out = text(&output);
    for rank in [0, 1] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("ERR rank {rank}:")))
            .unwrap_or_else(|| panic!("rank {rank} reports an error:\n{out}"));
        assert!(line.contains("culprit Some(2)"), "{line}");
        assert!(line.contains("[2, 3] never arrived"), "{line}");
    }
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn an_aborting_rank_fails_every_other_process() {
    let (output, _) = mpirun("abort");
    let out = text(&output);
    for rank in [0, 1, 2] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("ERR rank {rank}:")))
            .unwrap_or_else(|| panic!("rank {rank} reports an error:\n{out}"));
        assert!(line.contains("culprit Some(3)"), "{line}");
        assert!(line.contains("out of memory"), "{line}");
    }
}
