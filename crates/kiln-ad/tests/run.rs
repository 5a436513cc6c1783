//! The AD run end to end: a fast smoke version in `cargo test`, and the full acceptance
//! run (default config, release build) by hand:
//!
//! ```text
//! cargo test --release -p kiln-ad --test run -- --ignored --nocapture
//! ```

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use kiln_ad::checkpoint;
use kiln_ad::config::AdConfig;
use kiln_ad::env::DarkRoomConfig;
use kiln_ad::plot::write_svg;
use kiln_ad::report::evaluate;
use kiln_ad::run::{LogProgress, RunOptions, run};
use kiln_core::params::checksum;
use kiln_core::strategy::StrategyKind;

type B = Autodiff<Flex>;

/// The backend's seed is global to the process: tests that initialise models from it take
/// turns, or a concurrent test's seeding lands between another's seeding and its model.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeded() -> std::sync::MutexGuard<'static, ()> {
    SEEDED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A 5×5 room, short histories, a tiny model, a few steps: every stage runs in seconds.
fn smoke_config() -> AdConfig {
    let mut c = AdConfig {
        env: DarkRoomConfig {
            size: 5,
            horizon: 8,
        },
        ..AdConfig::default()
    };
    c.goals.held_out = 3;
    c.source.histories_per_goal = 2;
    c.source.episodes = 6;
    c.model.context = 16;
    c.model.d_model = 16;
    c.model.d_ff = 32;
    c.train.steps = 6;
    c.train.warmup_steps = 2;
    c.train.batch = 8;
    c.eval.episodes = 3;
    c.eval.seeds = 2;
    c
}

#[test]
fn smoke_run_trains_saves_loads_and_evaluates() {
    let _seeded = seeded();
    let config = smoke_config();
    let dir = std::env::temp_dir().join(format!("kiln-ad-smoke-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let run = run::<B>(
        &config,
        &config.plan(1).unwrap(),
        vec![Default::default()],
        RunOptions {
            save_to: Some(&dir),
            ..RunOptions::default()
        },
        &mut LogProgress::new(config.train.steps),
    )
    .unwrap();
    assert!(
        run.train
            .saved
            .as_deref()
            .is_some_and(|s| s.ends_with("step-00000006"))
    );
    assert_eq!(run.train.steps, 6);
    assert!(run.train.final_loss.is_finite());
    assert!(run.train.first_loss > 0.0);
    let eval = run.eval.as_ref().expect("evaluated");
    assert_eq!(eval.goals.len(), 3);
    for curve in [&eval.ad, &eval.control, &eval.source, &eval.random] {
        assert_eq!(curve.returns.len(), 3);
        assert!(curve.returns.iter().all(|&r| (0.0..=8.0).contains(&r)));
    }

    // The checkpoint round-trips, and the loaded model evaluates to the same curves.
    let (loaded_config, loaded) = checkpoint::load::<Flex>(&dir, &Default::default()).unwrap();
    assert_eq!(loaded_config, config);
    assert_eq!(checksum(&loaded), checksum(&run.model));
    assert_eq!(loaded.num_params(), run.model.num_params());
    let again = evaluate(
        &loaded,
        &config,
        &eval.goals,
        &Default::default(),
        &mut |_, _| {},
    );
    assert_eq!(again.ad, eval.ad);
    // An evaluation asked for more than any run could hold is refused before the model is
    // built (it once overflowed its counts or aborted allocating).
    let err = checkpoint::load_with::<Flex>(&dir, &Default::default(), |eval| {
        eval.episodes = usize::MAX;
    })
    .map(|_| ())
    .unwrap_err();
    assert!(err.to_string().contains("eval.episodes"), "{err}");

    let svg = dir.join("returns.svg");
    write_svg(eval, &svg).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("random policy"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn smoke_run_runs_through_ddp() {
    let _seeded = seeded();
    let mut config = smoke_config();
    config.train.strategy = StrategyKind::Ddp;
    let run = run::<B>(
        &config,
        &config.plan(2).unwrap(),
        vec![Default::default(); 2],
        RunOptions::default(),
        &mut LogProgress::new(config.train.steps),
    )
    .unwrap();
    assert_eq!(run.train.strategy, "ddp");
    assert_eq!(run.train.world, 2);
    assert!(run.train.final_loss.is_finite());
}

#[test]
fn missing_checkpoint_is_a_clear_error() {
    let _seeded = seeded();
    let err = checkpoint::load::<Flex>(
        std::path::Path::new("/nonexistent/run"),
        &Default::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/run"), "{err}");
}

#[test]
fn a_run_resumed_from_its_checkpoint_ends_where_an_uninterrupted_one_does() {
    let _seeded = seeded();
    let mut config = smoke_config();
    config.checkpoint.every = Some(2);
    let plan = config.plan(1).unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-ad-resume-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let options = RunOptions {
        no_eval: true,
        ..RunOptions::default()
    };
    let straight = run::<B>(
        &config,
        &plan,
        vec![Default::default()],
        options,
        &mut LogProgress::new(6),
    )
    .unwrap();

    // Stopped after step 3 of 6 (as SIGINT does): saved there, not evaluated.
    // Asked after every step: true once a step is saved (the folder also holds its lock).
    let stop_at_3 = || {
        std::fs::read_dir(checkpoint::checkpoints(&dir)).is_ok_and(|entries| {
            entries
                .filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().starts_with("step-"))
        })
    };
    let stopped = run::<B>(
        &config,
        &plan,
        vec![Default::default()],
        RunOptions {
            save_to: Some(&dir),
            stop: Some(&stop_at_3),
            ..RunOptions::default()
        },
        &mut LogProgress::new(6),
    )
    .unwrap();
    assert!(stopped.train.stopped && stopped.eval.is_none());
    assert_eq!(
        stopped.train.last_step, 3,
        "the periodic save at 2 made the stop ask at 3"
    );

    let from = checkpoint::open(&dir).unwrap();
    assert_eq!(from.step(), 3);
    let resumed = run::<B>(
        &config,
        &plan,
        vec![Default::default()],
        RunOptions {
            save_to: Some(&dir),
            resume: Some(&from),
            ..options
        },
        &mut LogProgress::new(6),
    )
    .unwrap();
    assert_eq!(resumed.train.resumed_from, Some(3));
    assert_eq!(resumed.train.steps, 3);
    assert_eq!(checksum(&resumed.model), checksum(&straight.model));

    // Another model under the same flags is refused, naming what differs.
    let mut other = config.clone();
    other.model.d_model = 32;
    let err = checkpoint::check_config(&from, &other).unwrap_err();
    assert!(err.to_string().contains("model.d_model"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// AD's least mean return over the last 10 of 40 episodes on the held-out goals, with the
/// default config: within a few points of the source's (about 11.5 there). The default run
/// measured 11.27 (the book's AD page has the run and the spread over seeds).
const LAST10: f64 = 10.0;

/// The acceptance with the default config: ≥ 8 held-out goals × 20 seeds × 40 episodes,
/// in-context improvement, ≥ 10× random, a flat one-episode control, a mean over the 40
/// episodes ≥ 0.8 × the source's, and a last-10 mean ≥ [`LAST10`].
fn acceptance(world: usize) {
    let config = AdConfig::default();
    let start = std::time::Instant::now();
    let run = run::<B>(
        &config,
        &config.plan(world).unwrap(),
        vec![Default::default(); world],
        RunOptions::default(),
        &mut LogProgress::new(config.train.steps),
    )
    .unwrap();
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "world {world}: {} in {seconds:.0} s, {:.1} ms/step",
        run.train.strategy, run.train.ms_per_step
    );
    let eval = run.eval.as_ref().expect("evaluated");
    println!("{}", eval.summary());
    println!("AD curve: {:.2?}", eval.ad.returns);
    assert!(eval.goals.len() >= 8 && eval.seeds >= 20 && eval.episodes >= 40);
    assert!(eval.acceptance.ad_improves, "{}", eval.summary());
    assert!(eval.acceptance.beats_random, "{}", eval.summary());
    assert!(eval.acceptance.control_flat, "{}", eval.summary());
    assert!(eval.acceptance.keeps_pace, "{}", eval.summary());
    assert!(eval.acceptance.passed, "{}", eval.summary());
    assert!(eval.ad.last10 >= LAST10, "{}", eval.summary());
}

#[test]
#[ignore = "the full default run: ~5 minutes in release; run by hand"]
fn acceptance_single() {
    let _seeded = seeded();
    acceptance(1);
}

#[test]
#[ignore = "the full default run through Ddp at world 2: ~3 minutes in release; run by hand"]
fn acceptance_ddp_world_2() {
    let _seeded = seeded();
    acceptance(2);
}
