//! The figure of an evaluation: return per episode for AD, its one-episode control, the
//! source algorithm and a random policy, with the optimum for scale.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::AdError;
use crate::report::EvalReport;

/// Writes the return-vs-episode plot of `report` as an SVG file, drawn in memory and put in
/// place whole ([`kiln_core::output::write_file`]): an old plot is replaced, never cut short.
///
/// # Errors
/// When the file cannot be written.
pub fn write_svg(report: &EvalReport, path: &Path) -> Result<(), AdError> {
    let plot = |reason: String| AdError::Plot {
        path: path.display().to_string(),
        reason,
    };
    let mut svg = String::new();
    draw(
        report,
        SVGBackend::with_string(&mut svg, SIZE).into_drawing_area(),
    )
    .map_err(|e| plot(e.to_string()))?;
    kiln_core::output::write_file(path, svg.as_bytes()).map_err(|e| plot(e.to_string()))
}

/// The figure's size in pixels.
const SIZE: (u32, u32) = (800, 500);

/// The y axis ends at the optimum times this.
const HEADROOM: f64 = 1.6;

fn draw<DB: DrawingBackend>(
    report: &EvalReport,
    root: DrawingArea<DB, Shift>,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let episodes = report.episodes.max(1);
    // No curve rises above the optimum, so the band above it is left free for the legend:
    // five entries take about a third of the plot's height.
    let top = (report.optimal * HEADROOM).max(1.0);
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
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::Curve;
    use crate::report::Acceptance;

    /// `(x, y)` pairs of an SVG `points` attribute.
    fn points(element: &str) -> Vec<(f64, f64)> {
        let list = element.split("points=\"").nth(1).unwrap().split('"').next();
        list.unwrap()
            .split_whitespace()
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect()
    }

    fn attribute(element: &str, name: &str) -> f64 {
        let value = element.split(&format!(" {name}=\"")).nth(1).unwrap();
        value.split('"').next().unwrap().parse().unwrap()
    }

    /// Curves where a legend could cover them: two along the bottom, one at the optimum
    /// throughout, one on the diagonal from 0 to the optimum.
    fn report() -> EvalReport {
        let episodes = 40;
        let optimal = 15.6;
        let curve = |f: &dyn Fn(usize) -> f64| Curve::new((0..episodes).map(f).collect());
        let (ad, control) = (curve(&|_| optimal), curve(&|_| 0.0));
        let (source, random) = (curve(&|e| optimal * e as f64 / 39.0), curve(&|_| 0.3));
        EvalReport {
            goals: vec![(0, 0); 10],
            seeds: 4,
            episodes,
            optimal,
            acceptance: Acceptance::check(&ad, &control, &source, &random),
            ad,
            control,
            source,
            random,
        }
    }

    #[test]
    fn the_legend_covers_no_curve() {
        let mut svg = String::new();
        draw(
            &report(),
            SVGBackend::with_string(&mut svg, SIZE).into_drawing_area(),
        )
        .unwrap();
        let legend = svg
            .split('<')
            .find(|e| e.starts_with("rect") && e.contains("opacity=\"0.8\""))
            .expect("the legend's background");
        let (left, top) = (attribute(legend, "x"), attribute(legend, "y"));
        let (right, bottom) = (
            left + attribute(legend, "width"),
            top + attribute(legend, "height"),
        );
        let inside =
            |(x, y): (f64, f64)| (left..=right).contains(&x) && (top..=bottom).contains(&y);
        // Every line longer than a legend entry's sample: the four curves and the optimum.
        let lines: Vec<Vec<(f64, f64)>> = svg
            .split('<')
            .filter(|e| {
                e.starts_with("polyline")
                    && (e.contains("stroke-width=\"2\"") || e.contains("#00FF00"))
            })
            .map(points)
            .filter(|p| {
                p.len() > 2
                    || p.first()
                        .zip(p.last())
                        .is_some_and(|(a, b)| b.0 - a.0 > 40.0)
            })
            .collect();
        assert_eq!(lines.len(), 5, "four curves and the optimum");
        for line in lines {
            for pair in line.windows(2) {
                for i in 0..=20 {
                    let t = f64::from(i) / 20.0;
                    let at = (
                        pair[0].0 + t * (pair[1].0 - pair[0].0),
                        pair[0].1 + t * (pair[1].1 - pair[0].1),
                    );
                    assert!(!inside(at), "the legend {legend} covers {at:?}");
                }
            }
        }
    }
}
