//! The four operators against the unsharded computation: values, and every gradient, with
//! two ranks as threads.

use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;

use super::ops::{copy_to_tp, gather_from_tp, reduce_from_tp, scatter_to_tp};
use super::{TpGroup, disconnect};
use crate::collective::{CollectiveError, InProcess};

type B = Autodiff<Flex>;
type T<const D: usize> = Tensor<B, D>;

/// Runs `f` on two ranks, each with its group, and returns their results in rank order.
fn on_two<R: Send>(f: impl Fn(TpGroup<B>) -> R + Sync) -> Vec<R> {
    let groups = InProcess::<Flex>::group(2, Duration::from_secs(30));
    std::thread::scope(|s| {
        let jobs: Vec<_> = groups
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(TpGroup::new(Box::new(c))))
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    })
}

/// Fixed random values, the same in every thread. Drawn from a generator of their own: the
/// backend's is one for the process, so two ranks that seed it and draw at once would each
/// draw a part of one stream (a test that failed now and then).
fn values<const D: usize>(dims: [usize; D], seed: u64) -> Tensor<Flex, D> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let count = dims.iter().product();
    let drawn: Vec<f32> = (0..count).map(|_| rng.random_range(-2.0..2.0)).collect();
    Tensor::from_data(
        burn::tensor::TensorData::new(drawn, dims),
        &Default::default(),
    )
}

fn close<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let (a, b) = (
        a.into_data().to_vec::<f32>().unwrap(),
        b.into_data().to_vec::<f32>().unwrap(),
    );
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(diff <= 1e-5, "{what}: differs by {diff}");
}

/// Column-parallel then row-parallel, twice from one input (one `f`, used twice): the output
/// and the gradients of the input and of every weight shard equal the unsharded model's.
#[test]
fn f_and_g_give_the_unsharded_gradients_for_an_input_used_twice() {
    let (x, w, v, u, z, probe) = (
        values([3, 4], 1),
        values([4, 6], 2),
        values([6, 5], 3),
        values([4, 6], 4),
        values([6, 5], 5),
        values([3, 5], 6),
    );
    // The whole model on one device.
    let leaf = |t: &Tensor<Flex, 2>| T::<2>::from_inner(t.clone()).require_grad();
    let (xw, ww, vw, uw, zw) = (leaf(&x), leaf(&w), leaf(&v), leaf(&u), leaf(&z));
    let y = xw.clone().matmul(ww.clone()).matmul(vw.clone())
        + xw.clone().matmul(uw.clone()).matmul(zw.clone());
    let grads = (y.clone() * T::from_inner(probe.clone())).sum().backward();
    let expected = (
        y.inner(),
        xw.grad(&grads).unwrap(),
        ww.grad(&grads).unwrap(),
        vw.grad(&grads).unwrap(),
        uw.grad(&grads).unwrap(),
    );
    let results = on_two(|tp| {
        let t = tp.rank();
        let cols = |m: &Tensor<Flex, 2>| leaf(&m.clone().narrow(1, 3 * t, 3));
        let rows = |m: &Tensor<Flex, 2>| leaf(&m.clone().narrow(0, 3 * t, 3));
        let (xs, ws, vs, us, zs) = (leaf(&x), cols(&w), rows(&v), cols(&u), rows(&z));
        let copied = copy_to_tp(xs.clone(), &tp);
        let y = reduce_from_tp(copied.clone().matmul(ws.clone()).matmul(vs.clone()), &tp)
            + reduce_from_tp(copied.matmul(us.clone()).matmul(zs.clone()), &tp);
        let grads = (y.clone() * T::from_inner(probe.clone())).sum().backward();
        (
            y.inner(),
            xs.grad(&grads).unwrap(),
            ws.grad(&grads).unwrap(),
            vs.grad(&grads).unwrap(),
            us.grad(&grads).unwrap(),
        )
    });
    for (t, (y, dx, dw, dv, du)) in results.into_iter().enumerate() {
        close(y, expected.0.clone(), "y");
        close(
            dx,
            expected.1.clone(),
            "dx: the input's gradient, summed over both uses",
        );
        close(dw, expected.2.clone().narrow(1, 3 * t, 3), "dW columns");
        close(dv, expected.3.clone().narrow(0, 3 * t, 3), "dV rows");
        close(du, expected.4.clone().narrow(1, 3 * t, 3), "dU columns");
    }
}

/// Gather and scatter: the gathered output is the whole product, and the gradients flow back
/// to each rank's slice; the scattered input's gradient is the whole input's.
#[test]
fn gather_and_scatter_give_the_unsharded_gradients() {
    let (x, w, probe) = (
        values([2, 3, 4], 7),
        values([4, 6], 8),
        values([2, 3, 6], 9),
    );
    let x_leaf = T::<3>::from_inner(x.clone()).require_grad();
    let w_leaf = T::<2>::from_inner(w.clone()).require_grad();
    let y = x_leaf.clone().matmul(w_leaf.clone().unsqueeze());
    let grads = (y.clone() * T::from_inner(probe.clone())).sum().backward();
    let (y_full, dx_full, dw_full) = (
        y.inner(),
        x_leaf.grad(&grads).unwrap(),
        w_leaf.grad(&grads).unwrap(),
    );
    let results = on_two(|tp| {
        let t = tp.rank();
        // Column-parallel with a gathered output: each rank's columns, gathered.
        let xs = T::<3>::from_inner(x.clone()).require_grad();
        let ws = T::<2>::from_inner(w.clone().narrow(1, 3 * t, 3)).require_grad();
        let gathered = gather_from_tp(
            copy_to_tp(xs.clone(), &tp).matmul(ws.clone().unsqueeze()),
            &tp,
        );
        let grads = (gathered.clone() * T::from_inner(probe.clone()))
            .sum()
            .backward();
        let column = (
            gathered.inner(),
            xs.grad(&grads).unwrap(),
            ws.grad(&grads).unwrap(),
        );
        // Row-parallel from the whole input: scattered here, partial products summed.
        let xr = T::<3>::from_inner(x.clone()).require_grad();
        let wr = T::<2>::from_inner(w.clone().narrow(0, 2 * t, 2)).require_grad();
        let summed = reduce_from_tp(
            scatter_to_tp(xr.clone(), &tp).matmul(wr.clone().unsqueeze()),
            &tp,
        );
        let grads = (summed.clone() * T::from_inner(probe.clone()))
            .sum()
            .backward();
        let row = (
            summed.inner(),
            xr.grad(&grads).unwrap(),
            wr.grad(&grads).unwrap(),
        );
        (column, row)
    });
    for (t, (column, row)) in results.into_iter().enumerate() {
        close(column.0, y_full.clone(), "gathered output");
        close(column.1, dx_full.clone(), "column: dx");
        close(column.2, dw_full.clone().narrow(1, 3 * t, 3), "column: dW");
        close(row.0, y_full.clone(), "row output");
        close(row.1, dx_full.clone(), "row: dx of the scattered input");
        close(row.2, dw_full.clone().narrow(0, 2 * t, 2), "row: dW");
    }
}

/// A rank that fails releases its peer blocked in an operator: the peer's forward unwinds
/// with the collective error naming the failed rank, well within the timeout.
#[test]
fn a_failed_rank_releases_its_peer_inside_a_forward() {
    let groups = InProcess::<Flex>::group(2, Duration::from_secs(30));
    let start = std::time::Instant::now();
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let jobs: Vec<_> = groups
            .into_iter()
            .map(|c| {
                s.spawn(move || {
                    let tp = TpGroup::<B>::new(Box::new(c));
                    if tp.rank() == 1 {
                        tp.abort("out of memory");
                        return None;
                    }
                    let x = T::<2>::from_inner(values([2, 2], 1));
                    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        reduce_from_tp(x, &tp)
                    }));
                    Some(
                        caught
                            .err()
                            .and_then(|p| p.downcast::<CollectiveError>().ok()),
                    )
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    let error = outcomes[0]
        .clone()
        .flatten()
        .expect("rank 0's forward unwound");
    assert_eq!(error.culprit(), Some(1), "{error}");
}

/// A group of one is the identity, and an unconnected group only answers its size.
#[test]
fn a_group_of_one_is_the_identity() {
    let one = TpGroup::<B>::single();
    let x = T::<2>::from_inner(values([2, 3], 1));
    for y in [
        copy_to_tp(x.clone(), &one),
        reduce_from_tp(x.clone(), &one),
        gather_from_tp(x.clone(), &one),
        scatter_to_tp(x.clone(), &one),
    ] {
        close(y.inner(), x.clone().inner(), "identity");
    }
    let unconnected = TpGroup::<B>::unconnected(4);
    assert_eq!((unconnected.rank(), unconnected.size()), (0, 4));
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reduce_from_tp(x, &unconnected)
    }));
    assert!(refused.is_err(), "an unconnected group cannot run");
}

/// A group handed out of its run ([`disconnect`]) refuses to run at once, naming why, while the
/// rank's own handle keeps working with its peer.
#[test]
fn a_disconnected_copy_refuses_to_run_and_the_rank_keeps_its_group() {
    let sums = on_two(|group| {
        let handed = disconnect::<B, _>(group.clone());
        assert_eq!((handed.rank(), handed.size()), (group.rank(), 2));
        let x = T::<2>::from_inner(values([2, 3], 5));
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            reduce_from_tp(x.clone(), &handed)
        }))
        .expect_err("a disconnected group cannot run");
        let message = refused
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(message.contains("not connected to its peers"), "{message}");
        reduce_from_tp(x, &group).inner()
    });
    close(
        sums[0].clone(),
        values([2, 3], 5).mul_scalar(2.0),
        "the rank's own group",
    );
}
