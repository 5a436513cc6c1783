//! The in-process collective's guarantees: results, timeouts, failures, mismatches.
use std::time::{Duration, Instant};

use burn::backend::Flex;

use super::*;
use crate::collective::{Collective, CollectiveError, ReduceOp};

type T = Tensor<Flex, 1>;

fn tensor(values: &[f32]) -> T {
    Tensor::from_floats(values, &Default::default())
}

fn values(t: T) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

/// Runs `f(rank, handle)` on a thread per rank and returns the results in rank order.
fn on_ranks<R: Send>(
    world_size: usize,
    timeout: Duration,
    f: impl Fn(usize, InProcess<Flex>) -> R + Sync,
) -> Vec<R> {
    let handles = InProcess::<Flex>::group(world_size, timeout);
    std::thread::scope(|s| {
        let jobs: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(rank, c)| {
                let f = &f;
                s.spawn(move || f(rank, c))
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

const LONG: Duration = Duration::from_secs(30);

#[test]
fn all_reduce_ops_agree_on_every_rank() {
    for (op, expected) in [
        (ReduceOp::Sum, vec![6.0, 10.0]),
        (ReduceOp::Mean, vec![1.5, 2.5]),
        (ReduceOp::Max, vec![3.0, 4.0]),
    ] {
        let results = on_ranks(4, LONG, |rank, mut c| {
            let r = rank as f32;
            values(c.all_reduce(tensor(&[r, r + 1.0]), op).unwrap())
        });
        assert!(
            results.iter().all(|r| *r == expected),
            "{op:?}: {results:?}"
        );
    }
}

#[test]
fn many_rounds_in_a_row() {
    let results = on_ranks(3, LONG, |rank, mut c| {
        (0..50)
            .map(|i| {
                values(
                    c.all_reduce(tensor(&[(rank * i) as f32]), ReduceOp::Sum)
                        .unwrap(),
                )[0]
            })
            .collect::<Vec<_>>()
    });
    let expected: Vec<f32> = (0..50).map(|i| (3 * i) as f32).collect();
    assert!(results.iter().all(|r| *r == expected));
}

#[test]
fn broadcast_takes_the_root_values() {
    let results = on_ranks(3, LONG, |rank, mut c| {
        c.barrier().unwrap();
        values(c.broadcast(tensor(&[rank as f32; 3]), 2).unwrap())
    });
    assert!(results.iter().all(|r| *r == vec![2.0; 3]));
}

#[test]
fn a_missing_rank_is_named_within_the_timeout() {
    let timeout = Duration::from_millis(200);
    let results = on_ranks(3, timeout, |rank, mut c| {
        let start = Instant::now();
        let result = if rank == 1 {
            // Never arrives, but stays alive (does not drop its handle) past the deadline.
            std::thread::sleep(timeout * 3);
            return None;
        } else {
            c.all_reduce(tensor(&[1.0]), ReduceOp::Sum)
        };
        Some((result.unwrap_err(), start.elapsed()))
    });
    for (error, elapsed) in results.into_iter().flatten() {
        assert_eq!(error.culprit(), Some(1), "{error}");
        assert!(elapsed < timeout * 3, "took {elapsed:?}");
    }
}

#[test]
fn an_aborting_rank_releases_the_others_at_once() {
    let results = on_ranks(3, LONG, |rank, mut c| {
        let start = Instant::now();
        if rank == 2 {
            std::thread::sleep(Duration::from_millis(50));
            c.abort("out of data");
            return None;
        }
        let error = c.all_reduce(tensor(&[1.0]), ReduceOp::Sum).unwrap_err();
        Some((error, start.elapsed()))
    });
    for (error, elapsed) in results.into_iter().flatten() {
        assert!(matches!(
            &error,
            CollectiveError::PeerFailed { failed_rank: 2, reason, .. } if reason == "out of data"
        ));
        assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    }
}

#[test]
fn a_panicking_rank_poisons_the_group() {
    let handles = InProcess::<Flex>::group(2, LONG);
    let mut handles = handles.into_iter();
    let (mut first, second) = (handles.next().unwrap(), handles.next().unwrap());
    let dead = std::thread::spawn(move || {
        let _keep = second;
        panic!("boom");
    });
    assert!(dead.join().is_err());
    let error = first.barrier().unwrap_err();
    assert!(
        matches!(&error, CollectiveError::PeerFailed { failed_rank: 1, reason, .. } if reason == "panicked"),
        "{error}"
    );
}

#[test]
fn mismatched_shapes_are_reported_not_mixed() {
    let results = on_ranks(2, LONG, |rank, mut c| {
        let len = if rank == 0 { 2 } else { 3 };
        c.all_reduce(tensor(&vec![1.0; len]), ReduceOp::Sum)
    });
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CollectiveError::Mismatch { .. })))
    );
}

#[test]
fn invalid_root_is_an_error() {
    let mut c = InProcess::<Flex>::group(1, LONG).pop().unwrap();
    assert_eq!(
        c.broadcast(tensor(&[1.0]), 1).unwrap_err(),
        CollectiveError::InvalidRoot {
            root: 1,
            world_size: 1
        }
    );
}

#[test]
fn all_gather_concatenates_in_rank_order() {
    let results = on_ranks(3, LONG, |rank, mut c| {
        let r = rank as f32;
        values(c.all_gather(tensor(&[r, 10.0 + r])).unwrap())
    });
    let expected = vec![0.0, 10.0, 1.0, 11.0, 2.0, 12.0];
    assert!(results.iter().all(|r| *r == expected), "{results:?}");
}

#[test]
fn reduce_scatter_gives_each_rank_its_chunk_of_the_reduction() {
    for (op, expected) in [
        (ReduceOp::Sum, [6.0, 10.0, 14.0, 18.0]),
        (ReduceOp::Mean, [1.5, 2.5, 3.5, 4.5]),
    ] {
        // Rank r holds [r, r+1, r+2, r+3] · 1 over 4 ranks... per element e: Σ_r (r + e).
        let results = on_ranks(4, LONG, |rank, mut c| {
            let r = rank as f32;
            let input = [r, r + 1.0, r + 2.0, r + 3.0];
            values(c.reduce_scatter(tensor(&input), op).unwrap())
        });
        let chunks: Vec<Vec<f32>> = expected.iter().map(|v| vec![*v]).collect();
        assert_eq!(results, chunks, "{op:?}");
    }
}

#[test]
fn reduce_gives_the_root_alone_the_all_reduce_s_bits() {
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        for root in 0..3 {
            let results = on_ranks(3, LONG, |rank, mut c| {
                let input = [rank as f32 * 0.1, 1.0 / (rank as f32 + 3.0)];
                let reduced = c.reduce(tensor(&input), op, root).unwrap().map(values);
                let all = values(c.all_reduce(tensor(&input), op).unwrap());
                (reduced, all)
            });
            for (rank, (reduced, all)) in results.into_iter().enumerate() {
                let expected = (rank == root).then_some(all);
                assert_eq!(reduced, expected, "{op:?} to {root}, rank {rank}");
            }
        }
    }
}

#[test]
fn reduces_to_different_roots_are_reported_not_mixed() {
    let results = on_ranks(2, LONG, |rank, mut c| {
        c.reduce(tensor(&[1.0]), ReduceOp::Sum, rank)
    });
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(CollectiveError::Mismatch { .. }))),
        "{results:?}"
    );
    let mut alone = InProcess::<Flex>::group(1, LONG).pop().unwrap();
    assert_eq!(
        alone.reduce(tensor(&[1.0]), ReduceOp::Sum, 1).unwrap_err(),
        CollectiveError::InvalidRoot {
            root: 1,
            world_size: 1
        }
    );
}

#[test]
fn reduce_scatter_refuses_a_length_that_does_not_split() {
    let results = on_ranks(2, LONG, |_, mut c| {
        c.reduce_scatter(tensor(&[1.0, 2.0, 3.0]), ReduceOp::Sum)
    });
    for result in results {
        let error = result.unwrap_err();
        assert!(
            matches!(error, CollectiveError::Indivisible { .. })
                || matches!(error, CollectiveError::PeerFailed { .. }),
            "{error}"
        );
    }
}

#[test]
fn messages_between_two_ranks_arrive_in_order_on_the_receivers_device() {
    let results = on_ranks(3, LONG, |rank, mut c| match rank {
        0 => {
            for i in 0..5 {
                c.send(tensor(&[i as f32, -(i as f32)]), 2).unwrap();
            }
            c.send(tensor(&[7.0]), 1).unwrap();
            vec![]
        }
        1 => values(c.recv(0, 1, &Default::default()).unwrap()),
        _ => (0..5)
            .flat_map(|_| values(c.recv(0, 2, &Default::default()).unwrap()))
            .collect(),
    });
    assert_eq!(results[1], vec![7.0]);
    assert_eq!(
        results[2],
        vec![0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 3.0, -3.0, 4.0, -4.0]
    );
}

#[test]
fn a_send_that_never_comes_is_named_within_the_timeout() {
    let timeout = Duration::from_millis(200);
    let results = on_ranks(2, timeout, |rank, mut c| {
        if rank == 0 {
            // Alive past the deadline, but never sends.
            std::thread::sleep(timeout * 3);
            return None;
        }
        let start = Instant::now();
        let error = c.recv(0, 4, &Default::default()).unwrap_err();
        Some((error, start.elapsed()))
    });
    let (error, elapsed) = results[1].clone().unwrap();
    assert!(
        matches!(&error, CollectiveError::Timeout { missing, op: CollectiveOp::Recv { from: 0 }, .. } if *missing == vec![0]),
        "{error}"
    );
    assert_eq!(error.culprit(), Some(0));
    assert!(elapsed < timeout * 3, "took {elapsed:?}");
}

#[test]
fn a_panicking_sender_releases_its_receiver_at_once() {
    let handles = InProcess::<Flex>::group(2, LONG);
    let mut handles = handles.into_iter();
    let (sender, mut receiver) = (handles.next().unwrap(), handles.next().unwrap());
    let dead = std::thread::spawn(move || {
        let _keep = sender;
        std::thread::sleep(Duration::from_millis(50));
        panic!("boom");
    });
    let start = Instant::now();
    let error = receiver.recv(0, 1, &Default::default()).unwrap_err();
    assert!(dead.join().is_err());
    assert!(
        matches!(&error, CollectiveError::PeerFailed { failed_rank: 0, reason, .. } if reason == "panicked"),
        "{error}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_message_of_the_wrong_length_is_reported_and_fails_the_group() {
    let results = on_ranks(2, LONG, |rank, mut c| {
        if rank == 0 {
            c.send(tensor(&[1.0, 2.0, 3.0]), 1).unwrap();
            // The sender learns of the failure at its next call.
            c.barrier().map(|()| 0)
        } else {
            c.recv(0, 2, &Default::default()).map(|_| 0)
        }
    });
    assert_eq!(
        results[1].clone().unwrap_err().to_string(),
        "collective #0: rank 1 called recv(from rank 0) with 2 elements but rank 0 called \
         send(to rank 1) with 3; every rank must make the same calls in the same order with \
         the same shapes"
    );
    assert!(
        matches!(
            &results[0],
            Err(CollectiveError::PeerFailed { failed_rank: 1, .. })
        ),
        "{:?}",
        results[0]
    );
}

#[test]
fn peers_outside_the_group_are_errors() {
    let mut c = InProcess::<Flex>::group(2, LONG).pop().unwrap();
    assert!(matches!(
        c.send(tensor(&[1.0]), 2),
        Err(CollectiveError::InvalidPeer {
            peer: 2,
            world_size: 2,
            ..
        })
    ));
    assert!(matches!(
        c.recv(5, 1, &Default::default()),
        Err(CollectiveError::InvalidPeer { peer: 5, .. })
    ));
}
