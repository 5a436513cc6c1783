//! The SVG chart: throughput against world size, one panel per model, one line per strategy,
//! and the ideal line (the single-rank throughput times the world size).

use std::path::Path;

use plotters::prelude::*;

use super::{BenchModel, Report};
use kiln_core::strategy::StrategyKind;

/// Writes the chart of `report` to `path`.
///
/// # Errors
/// When the file cannot be written.
pub fn write_svg(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let models: Vec<BenchModel> = BenchModel::ALL
        .into_iter()
        .filter(|m| report.results.iter().any(|r| r.scenario.model == *m))
        .collect();
    let columns = models.len().clamp(1, 2);
    let rows = models.len().div_ceil(2).max(1);
    let root = SVGBackend::new(path, (560 * columns as u32, 380 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((rows, columns));
    let max_world = report
        .matrix
        .worlds
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
        .max(2);
    for (model, panel) in models.iter().zip(panels) {
        draw_panel(report, *model, max_world, &panel)?;
    }
    root.present()?;
    Ok(())
}

fn draw_panel(
    report: &Report,
    model: BenchModel,
    max_world: usize,
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
) -> Result<(), Box<dyn std::error::Error>> {
    let results: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.scenario.model == model)
        .collect();
    let single = results
        .iter()
        .find(|r| r.scenario.strategy == StrategyKind::Single)
        .map(|r| r.samples_per_s);
    let highest = results
        .iter()
        .map(|r| r.samples_per_s)
        .chain(single.map(|s| s * max_world as f64))
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{model}: samples/s"), ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5..max_world as f64 + 0.5, 0.0..highest * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("world size (ranks)")
        .y_desc("samples/s")
        .x_labels(max_world + 1)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    if let Some(single) = single {
        chart
            .draw_series(LineSeries::new(
                (1..=max_world).map(|w| (w as f64, single * w as f64)),
                BLACK.mix(0.4).stroke_width(1),
            ))?
            .label("ideal: single × world")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN];
    for (strategy, color) in StrategyKind::ALL.into_iter().zip(colors.iter().cycle()) {
        let mut points: Vec<(f64, f64)> = results
            .iter()
            .filter(|r| r.scenario.strategy == strategy)
            .map(|r| (r.scenario.world as f64, r.samples_per_s))
            .collect();
        if points.is_empty() {
            continue;
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let style = color.stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.clone(), style))?
            .label(strategy.to_string())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
