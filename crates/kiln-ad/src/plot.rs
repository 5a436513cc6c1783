//! The figure of an evaluation: return per episode for AD, its one-episode control, the
//! source algorithm and a random policy, with the optimum for scale.

use std::path::Path;

use plotters::prelude::*;

use crate::error::AdError;
use crate::report::EvalReport;

/// Writes the return-vs-episode plot of `report` as an SVG file.
///
/// # Errors
/// When the file cannot be written.
pub fn write_svg(report: &EvalReport, path: &Path) -> Result<(), AdError> {
    draw(report, path).map_err(|e| AdError::Plot {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn draw(report: &EvalReport, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let episodes = report.episodes.max(1);
    let top = (report.optimal * 1.1).max(1.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Dark Room, {} held-out goals x {} seeds",
                report.goals.len(),
                report.seeds
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(1..episodes, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("episode")
        .y_desc("mean return")
        .draw()?;
    let series = [
        ("AD (context across episodes)", &report.ad.returns, RED),
        (
            "AD, context cut to one episode",
            &report.control.returns,
            MAGENTA,
        ),
        ("source: Q-learning", &report.source.returns, BLUE),
        ("random policy", &report.random.returns, BLACK),
    ];
    for (name, returns, color) in series {
        chart
            .draw_series(LineSeries::new(
                returns.iter().enumerate().map(|(e, &r)| (e + 1, r)),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .draw_series(LineSeries::new(
            [(1, report.optimal), (episodes, report.optimal)],
            GREEN.stroke_width(1),
        ))?
        .label("optimal")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], GREEN));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
