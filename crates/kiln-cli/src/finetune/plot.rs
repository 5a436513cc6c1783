//! `--svg`: the loss of every step and the held-out loss of every evaluation against the step,
//! drawn when the run ends and put in place whole.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::eval::EvalPoint;

/// The figure's size in pixels.
const SIZE: (u32, u32) = (800, 500);

/// Draws `losses` (step `first_step + 1` on) and `evals` as an SVG file at `path`.
///
/// # Errors
/// A figure that cannot be drawn, or a file that cannot be written.
pub fn write_svg(
    path: &Path,
    first_step: usize,
    losses: &[f64],
    evals: &[EvalPoint],
) -> Result<(), String> {
    let mut svg = String::new();
    draw(
        SVGBackend::with_string(&mut svg, SIZE).into_drawing_area(),
        first_step,
        losses,
        evals,
    )
    .map_err(|e| format!("cannot draw: {e}"))?;
    kiln_core::output::write_file(path, svg.as_bytes()).map_err(|e| e.to_string())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    first_step: usize,
    losses: &[f64],
    evals: &[EvalPoint],
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let train = losses
        .iter()
        .enumerate()
        .map(|(i, &l)| (first_step + i + 1, l));
    let eval = evals.iter().map(|p| (p.step, p.loss));
    let finite: Vec<(usize, f64)> = train
        .clone()
        .chain(eval.clone())
        .filter(|p| p.1.is_finite())
        .collect();
    let last = finite
        .iter()
        .map(|p| p.0)
        .max()
        .unwrap_or(1)
        .max(first_step + 1);
    let low = finite.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let high = finite.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let (low, high) = match low < high {
        true => (low - 0.05 * (high - low), high + 0.05 * (high - low)),
        false if low.is_finite() => (low - 0.5, low + 0.5),
        false => (0.0, 1.0),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption("Fine-tuning loss", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(first_step..last, low..high)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            train.filter(|p| p.1.is_finite()),
            BLUE.stroke_width(2),
        ))?
        .label("training loss")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    if !evals.is_empty() {
        chart
            .draw_series(LineSeries::new(eval.clone(), RED.stroke_width(2)))?
            .label("eval loss")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
        chart.draw_series(eval.map(|p| Circle::new(p, 4, RED.filled())))?;
    }
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

    #[test]
    fn the_figure_holds_both_curves() {
        let path = std::env::temp_dir().join(format!("kiln-loss-{}.svg", std::process::id()));
        let evals = [2, 4].map(|step| EvalPoint {
            step,
            loss: 3.0 / step as f64,
            perplexity: 0.0,
        });
        write_svg(&path, 0, &[4.0, 3.0, 2.5, f64::NAN], &evals).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("training loss"));
        assert!(svg.contains("eval loss"));
        // One polyline per curve, the NaN step left out of the training one.
        let lines: Vec<&str> = svg.split("<polyline").skip(1).collect();
        assert!(lines.len() >= 2, "{svg}");
        write_svg(&path, 10, &[], &[]).unwrap();
        std::fs::remove_file(&path).ok();
    }
}
