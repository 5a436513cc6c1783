//! What `kiln ad` shows while it runs: progress bars for training and evaluation, and a line
//! after each.

use indicatif::{ProgressBar, ProgressStyle};
use kiln_ad::report::EvalReport;
use kiln_ad::run::Observer;
use kiln_ad::train::{Data, TrainSummary};

/// A bar of `len` steps labelled `what`.
fn bar(len: usize, what: &str) -> ProgressBar {
    ProgressBar::new(len as u64).with_style(
        ProgressStyle::with_template(&format!(
            "{what:>5} {{bar:40}} {{pos}}/{{len}}  {{msg}}  [{{elapsed}}<{{eta}}]"
        ))
        .expect("valid template"),
    )
}

/// The training bar, then the evaluation bar, on the main thread.
pub struct Bars {
    train: ProgressBar,
    eval: Option<ProgressBar>,
    /// Shows nothing: a process of a multi-process run other than the first.
    quiet: bool,
}

impl Bars {
    /// Bars for a run of `steps` training steps.
    pub fn new(steps: usize) -> Self {
        Self {
            train: bar(steps, "train"),
            eval: None,
            quiet: false,
        }
    }

    /// Bars that show nothing, for the processes of a run that do not tell its story.
    pub fn quiet() -> Self {
        Self {
            train: ProgressBar::hidden(),
            eval: None,
            quiet: true,
        }
    }

    /// Starts the training bar at `step`, the step a resumed run continues from.
    pub fn start_at(&mut self, step: usize) {
        self.train.set_position(step as u64);
    }
}

impl Observer for Bars {
    fn data(&mut self, data: &Data) {
        if self.quiet {
            return;
        }
        tracing::info!("{}", data.summary());
    }

    fn step(&mut self, _step: usize, loss: f64) {
        self.train.set_message(format!("loss {loss:.4}"));
        self.train.inc(1);
    }

    fn trained(&mut self, summary: &TrainSummary) {
        self.train.finish_and_clear();
        if self.quiet {
            return;
        }
        let resumed = summary
            .resumed_from
            .map(|step| format!(" (resumed at step {step})"))
            .unwrap_or_default();
        println!(
            "trained with {} on {} rank(s): {} steps of {} windows{resumed}, loss {:.4} -> {:.4}, \
             {:.1} ms/step",
            summary.strategy,
            summary.world,
            summary.steps,
            summary.batch,
            summary.first_loss,
            summary.final_loss,
            summary.ms_per_step
        );
        if let Some(dir) = &summary.saved {
            println!("saved {dir}");
        }
    }

    fn eval_step(&mut self, done: usize, total: usize) {
        self.eval
            .get_or_insert_with(|| bar(total, "eval"))
            .set_position(done as u64);
    }

    fn evaluated(&mut self, report: &EvalReport) {
        if let Some(bar) = self.eval.take() {
            bar.finish_and_clear();
        }
        println!("{}", report.summary());
    }
}
