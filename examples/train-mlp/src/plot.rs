//! The loss curve as an SVG.

use plotters::prelude::*;

/// Draws the loss per step (and, if given, the single-GPU reference's) into `path`.
pub fn loss_curve(
    path: &str,
    title: &str,
    losses: &[f32],
    reference: Option<&[f32]>,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let finite = |v: &[f32]| {
        v.iter()
            .copied()
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect::<Vec<_>>()
    };
    let all: Vec<f32> = finite(losses)
        .into_iter()
        .chain(reference.map(finite).unwrap_or_default())
        .collect();
    let hi = all.iter().copied().fold(f32::MIN, f32::max).max(1e-6) as f64;
    let lo = all.iter().copied().fold(f32::MAX, f32::min).min(hi as f32) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(1..losses.len().max(2), (lo * 0.95).max(0.0)..hi * 1.02)?;
    chart
        .configure_mesh()
        .y_labels(12)
        .x_desc("step")
        .y_desc("loss (mean squared error, mean over ranks)")
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            losses.iter().enumerate().map(|(s, l)| (s + 1, *l as f64)),
            BLUE.stroke_width(2),
        ))?
        .label("data-parallel (ringccl reducer)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    if let Some(reference) = reference {
        chart
            .draw_series(DashedLineSeries::new(
                reference
                    .iter()
                    .enumerate()
                    .map(|(s, l)| (s + 1, *l as f64)),
                6,
                4,
                RED.stroke_width(1),
            ))?
            .label("one GPU, combined batch")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}
