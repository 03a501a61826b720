//! The timeline as a picture (SVG, plotters' SVG backend only): per-rail throughput and SOUT
//! share over the whole stream, and a zoom on the change with the tolerance band and the
//! moment the split settled.

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use super::timeline::{Criteria, Settle, Timeline};

const SOUT: RGBColor = RGBColor(31, 119, 180);
const SUP: RGBColor = RGBColor(255, 127, 14);
const CHANGE: RGBColor = RGBColor(214, 39, 40);
const SETTLED: RGBColor = RGBColor(44, 160, 44);
const FONT: &str = "sans-serif";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Window-averaged series: `(start ms, [SOUT Gbit/s, SUP Gbit/s], share)` for windows
/// starting in `[from, to)`, every `step` ms.
fn windows(t: &Timeline, w: usize, from: usize, to: usize, step: usize) -> Vec<(f64, [f64; 2], Option<f64>)> {
    (from..to.min(t.full_bins().saturating_sub(w) + 1))
        .step_by(step.max(1))
        .map(|s| {
            let r = t.rates(s, s + w);
            (s as f64, [r[0] * 8.0, r[1] * 8.0], t.share(s, s + w))
        })
        .collect()
}

/// A vertical line at `x` over `[y0, y1]` in `chart`'s coordinates.
fn vline(x: f64, y0: f64, y1: f64, color: RGBColor) -> DashedPathElement<std::vec::IntoIter<(f64, f64)>, i32> {
    DashedPathElement::new(vec![(x, y0), (x, y1)], 6, 4, color.stroke_width(2))
}

/// Writes the picture to `path`. `what` names the change ("SOUT 4 -> 2 Gbit/s").
pub fn draw(path: &str, t: &Timeline, s: &Settle, c: Criteria, what: &str) -> Result<()> {
    let root = SVGBackend::new(path, (1100, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, rest) = root.split_vertically(330);
    let (mid, zoom) = rest.split_vertically(300);
    let n = t.full_bins();
    let end = n as f64;
    let step = if n > 3000 { 2 } else { 1 };
    let all = windows(t, c.window_ms, 0, n, step);
    let w = c.window_ms;

    // Throughput per rail over the whole stream.
    let ymax = all.iter().map(|(_, r, _)| r[0].max(r[1])).fold(0.5, f64::max) * 1.15;
    let mut ch = ChartBuilder::on(&top)
        .caption(
            format!("mpib auto split on emulated rails: {}-byte sends, {what} at {:.1} ms", t.size, s.change_ms),
            (FONT, 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..end, 0f64..ymax)?;
    ch.configure_mesh()
        .x_desc("ms since TIMELINE-START")
        .y_desc(format!("Gbit/s posted ({w} ms windows)"))
        .light_line_style(WHITE)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    for (i, (name, color)) in [("SOUT", SOUT), ("SUP", SUP)].into_iter().enumerate() {
        ch.draw_series(LineSeries::new(all.iter().map(|(x, r, _)| (*x, r[i])), color.stroke_width(1)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    ch.draw_series(std::iter::once(vline(s.change_ms, 0.0, ymax, CHANGE)))?
        .label(format!("change ({what})"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], CHANGE.stroke_width(2)));
    ch.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;

    // SOUT share over the whole stream.
    let mut ch = ChartBuilder::on(&mid)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..end, 0f64..1f64)?;
    ch.configure_mesh()
        .x_desc("ms since TIMELINE-START")
        .y_desc(format!("SOUT share ({w} ms windows)"))
        .light_line_style(WHITE)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    ch.draw_series(LineSeries::new(all.iter().filter_map(|(x, _, sh)| sh.map(|v| (*x, v))), SOUT.stroke_width(1)))?
        .label("SOUT share")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], SOUT.stroke_width(2)));
    for (from, to, v) in [(0.0, s.change_ms, s.before), (s.change_ms, end, s.after)] {
        ch.draw_series(DashedLineSeries::new(vec![(from, v), (to, v)], 4, 4, BLACK.stroke_width(1)))?;
    }
    ch.draw_series(std::iter::once(vline(s.change_ms, 0.0, 1.0, CHANGE)))?;
    ch.draw_series(std::iter::once(Text::new(
        format!("steady {:.3} -> {:.3}", s.before, s.after),
        (end * 0.02, 0.08),
        (FONT, 15),
    )))?;

    // Zoom: 30 ms before to 100 ms after the change.
    let (z0, z1) = ((s.change_ms - 30.0).max(0.0), (s.change_ms + 100.0).min(end));
    let bins: Vec<(f64, f64)> =
        (z0 as usize..z1 as usize).filter_map(|i| t.share(i, i + 1).map(|v| (i as f64 + 0.5, v))).collect();
    let win = windows(t, w, z0 as usize, z1 as usize, 1);
    let mut ch = ChartBuilder::on(&zoom)
        .caption(
            match s.settle_ms {
                Some(ms) => format!(
                    "settled {ms:.1} ms after the change: every {w} ms window within {:.0} % of {:.3} for {} ms",
                    c.tol * 100.0,
                    s.after,
                    c.hold_ms
                ),
                None => format!(
                    "not settled: no {} ms stretch of {w} ms windows within {:.0} % of {:.3}",
                    c.hold_ms,
                    c.tol * 100.0,
                    s.after
                ),
            },
            (FONT, 16),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(z0..z1, 0f64..1f64)?;
    ch.configure_mesh()
        .x_desc("ms since TIMELINE-START")
        .y_desc("SOUT share")
        .light_line_style(WHITE)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    ch.draw_series(bins.iter().map(|&p| Circle::new(p, 2, RGBColor(150, 150, 150).filled())))?
        .label("1 ms bins")
        .legend(|(x, y)| Circle::new((x + 10, y), 3, RGBColor(150, 150, 150).filled()));
    ch.draw_series(LineSeries::new(win.iter().filter_map(|(x, _, sh)| sh.map(|v| (*x, v))), SOUT.stroke_width(2)))?
        .label(format!("{w} ms window starting at t"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], SOUT.stroke_width(2)));
    for v in [s.after * (1.0 - c.tol), s.after * (1.0 + c.tol)] {
        ch.draw_series(DashedLineSeries::new(vec![(s.change_ms, v), (z1, v)], 4, 4, BLACK.stroke_width(1)))?;
    }
    ch.draw_series(std::iter::once(vline(s.change_ms, 0.0, 1.0, CHANGE)))?
        .label("change")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], CHANGE.stroke_width(2)));
    if let Some(ms) = s.settle_ms {
        ch.draw_series(std::iter::once(vline(s.change_ms + ms, 0.0, 1.0, SETTLED)))?
            .label(format!("settled (+{ms:.1} ms)"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], SETTLED.stroke_width(2)));
    }
    ch.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;
    root.present()?;
    Ok(())
}
