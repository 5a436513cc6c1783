//! Algorithm Distillation on Dark Room with the default config: Q-learning histories on the
//! training goals, the AD transformer trained through a Kiln strategy, and in-context
//! evaluation on held-out goals next to the source and a random policy.
//!
//! ```text
//! cargo run --release --example ad_darkroom            # one rank
//! cargo run --release --example ad_darkroom -- 2       # Ddp over two ranks
//! ```
//! Writes `runs/ad_darkroom/returns.svg`. `kiln ad train` is the same job with flags, a
//! config file, progress bars and a saved checkpoint.

use burn::backend::{Autodiff, Flex};
use kiln::ad::config::AdConfig;
use kiln::ad::plot::write_svg;
use kiln::ad::run::{LogProgress, RunOptions, run};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    let world = std::env::args()
        .nth(1)
        .map(|w| w.parse::<usize>())
        .transpose()
        .map_err(|e| format!("the argument is the number of ranks: {e}"))?
        .unwrap_or(1);
    // ANCHOR: run
    let config = AdConfig::default();
    config.validate()?;
    // `auto` on `world` ranks: the plan says which strategy and why.
    let plan = config.plan(world)?;

    let devices = vec![Default::default(); world];
    let mut log = LogProgress::new(config.train.steps);
    let run = run::<Autodiff<Flex>>(&config, &plan, devices, RunOptions::default(), &mut log)?;
    let eval = run.eval.as_ref().expect("the run evaluates");
    println!(
        "trained with {} on {} rank(s) in {:.0} s ({:.1} ms/step)",
        run.train.strategy, run.train.world, run.train.wall_s, run.train.ms_per_step
    );
    println!("{}", eval.summary());
    // ANCHOR_END: run
    let dir = std::path::Path::new("runs/ad_darkroom");
    std::fs::create_dir_all(dir)?;
    write_svg(eval, &dir.join("returns.svg"))?;
    println!("wrote {}", dir.join("returns.svg").display());
    Ok(())
}
