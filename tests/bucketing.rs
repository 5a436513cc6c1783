//! Gradient bucketing: a model of many small parameters needs far fewer all-reduce calls
//! than it has parameters, and the bucket cap controls how many.

mod common;

use burn::optim::AdamWConfig;
use common::*;
use kiln::core::World;
use kiln::core::strategy::{Ddp, DdpConfig, Strategy};

fn calls_per_step(bucket_cap_mb: f64) -> (u64, usize) {
    // 49 hidden layers + a head: 50 Linear layers, 100 parameter tensors.
    let case = mlp_case(49, 8);
    let world = World::local(vec![Default::default(); 2]).unwrap();
    let config = DdpConfig {
        bucket_cap_mb,
        threads_per_rank: Some(1),
        ..DdpConfig::default()
    };
    let mut ddp = Ddp::new(
        &world,
        case.model.clone(),
        AdamWConfig::new().init(),
        case.source(),
        config,
    )
    .unwrap();
    let before = ddp.stats()[0].collective.calls;
    for batch in batches(case.dataset.len(), 8, 2) {
        ddp.step(&batch, LR).unwrap();
    }
    // Per step: one all-reduce per bucket, and the all-gather that tells every rank the
    // step's facts (losses, counts, statistics).
    let calls = (ddp.stats()[0].collective.calls - before) / 2 - 1;
    (calls, ddp.num_buckets())
}

#[test]
fn many_small_parameters_need_few_all_reduces() {
    let (calls, buckets) = calls_per_step(25.0);
    assert_eq!(calls, buckets as u64);
    assert!(calls < 100, "{calls} all-reduce calls for 100 parameters");
    assert_eq!(calls, 1, "3.6k floats fit one 25 MiB bucket");
}

#[test]
fn a_smaller_cap_gives_more_buckets() {
    // Each of the 48 inner hidden layers holds 8·8 + 8 floats = 288 bytes, so a 1 KiB cap
    // packs about three layers per bucket: ~16 buckets for them, plus the input and head.
    let (calls, buckets) = calls_per_step(1.0 / 1024.0);
    assert_eq!(calls, buckets as u64);
    assert!((16..=20).contains(&buckets), "{buckets} buckets");
}
