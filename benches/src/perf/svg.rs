//! The plot (plotters, SVG backend): bus bandwidth against size on a log2 x axis, one line
//! per (type, library, placement), for the first collective and operator of the run.

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use super::report::Record;

/// Width and height of the picture, pixels.
const SIZE: (u32, u32) = (860, 520);

/// One plotted line.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Rust name of the element type.
    pub dtype: &'static str,
    /// `ringccl` or `nccl`.
    pub lib: &'static str,
    /// Whether the calls ran in place.
    pub inplace: bool,
    /// (size in bytes, busbw in GB/s), sorted by size.
    pub points: Vec<(f64, f64)>,
}

/// The series to plot: records of the first (collective, operator) with a finite busbw and a
/// positive size, grouped by (type, library, placement) in the order they first appear.
pub fn series(records: &[Record]) -> Vec<Series> {
    let Some(first) = records.first() else {
        return Vec::new();
    };
    let mut out: Vec<Series> = Vec::new();
    for r in records {
        if (r.collective, r.op) != (first.collective, first.op)
            || r.error.is_some()
            || r.bytes == 0
            || !r.busbw.is_finite()
        {
            continue;
        }
        let pos = out
            .iter()
            .position(|s| (s.dtype, s.lib, s.inplace) == (r.dtype, r.lib, r.inplace))
            .unwrap_or_else(|| {
                out.push(Series {
                    dtype: r.dtype,
                    lib: r.lib,
                    inplace: r.inplace,
                    points: Vec::new(),
                });
                out.len() - 1
            });
        out[pos].points.push((r.bytes as f64, r.busbw));
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// A byte count as `8B`, `4K`, `16M`, `1G`.
pub fn human_bytes(b: f64) -> String {
    for (unit, v) in [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if b >= v as f64 {
            return format!("{}{unit}", (b / v as f64 * 100.0).round() / 100.0);
        }
    }
    format!("{b}B")
}

/// The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `x`.
fn nice_ceiling(x: f64) -> f64 {
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 2.5, 5.0]
        .into_iter()
        .map(|m| m * p)
        .find(|&v| v >= x)
        .unwrap_or(10.0 * p)
}

/// `x` with at most two decimals, without trailing zeros.
fn trim_num(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Tableau colours in (ringccl, NCCL) pairs, one pair per element type.
const COLORS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// The plot as an SVG document. `ngpus` goes in the title.
pub fn plot(records: &[Record], ngpus: usize) -> Result<String, String> {
    let mut svg = String::new();
    draw(&mut svg, records, ngpus).map_err(|e| format!("plot: {e}"))?;
    Ok(svg)
}

fn draw(
    out: &mut String,
    records: &[Record],
    ngpus: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let ser = series(records);
    let mut dtypes: Vec<&str> = Vec::new();
    for s in &ser {
        if !dtypes.contains(&s.dtype) {
            dtypes.push(s.dtype);
        }
    }
    let title = match records.first() {
        None => "no results".to_string(),
        Some(r) => {
            let mut what = vec![r.collective];
            if let [dtype] = dtypes[..] {
                what.push(dtype);
            }
            if r.op != "none" {
                what.push(r.op);
            }
            format!("{}: bus bandwidth vs size ({ngpus} GPUs)", what.join(" "))
        }
    };
    // x: whole powers of two around the sizes; y: from 0 to a round number above the top.
    let points = ser.iter().flat_map(|s| &s.points);
    let (lo, hi, top) = points.fold((f64::INFINITY, 0f64, 0f64), |(lo, hi, top), &(x, y)| {
        (lo.min(x), hi.max(x), top.max(y))
    });
    let (a, b) = if lo.is_finite() {
        (lo.log2().floor(), hi.log2().ceil())
    } else {
        (10.0, 10.0)
    };
    // At least two doublings, so that the axis has a few whole-power ticks.
    let (x0, x1) = if b - a < 2.0 {
        ((a - 1.0).exp2(), (a + 1.0).exp2())
    } else {
        (a.exp2(), b.exp2())
    };
    let ymax = if top > 0.0 {
        nice_ceiling(top * 1.05)
    } else {
        1.0
    };

    let root = SVGBackend::with_string(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .margin_right(28)
        .x_label_area_size(56)
        .y_label_area_size(72)
        .build_cartesian_2d((x0..x1).log_scale().base(2.0), 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes, log2 scale)")
        .y_desc("bus bandwidth (GB/s)")
        .x_label_formatter(&|x| human_bytes(*x))
        .y_label_formatter(&|y| trim_num(*y))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for s in &ser {
        let t = dtypes.iter().position(|d| *d == s.dtype).unwrap_or(0);
        let color = COLORS[(2 * t + usize::from(s.lib != "ringccl")) % COLORS.len()];
        let style = color.stroke_width(2);
        let placement = if s.inplace {
            "in-place"
        } else {
            "out-of-place"
        };
        let label = match dtypes.len() {
            1 => format!("{} {placement}", s.lib),
            _ => format!("{} {} {placement}", s.dtype, s.lib),
        };
        let line = if s.inplace {
            chart.draw_series(DashedLineSeries::new(s.points.clone(), 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(s.points.clone(), style))?
        };
        let dashed = s.inplace;
        line.label(label).legend(move |(x, y)| {
            let ends = vec![(x, y), (x + 24, y)];
            if dashed {
                DashedPathElement::new(ends, 6, 4, style).into_dyn()
            } else {
                PathElement::new(ends, style).into_dyn()
            }
        });
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 2, color.filled())))?;
    }
    if !ser.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(lib: &'static str, inplace: bool, bytes: usize, busbw: f64) -> Record {
        Record {
            collective: "all_reduce",
            dtype: "f32",
            op: "sum",
            bytes,
            count: bytes / 4,
            lib,
            inplace,
            time_us: 1.0,
            time_us_min: 1.0,
            time_us_mean: 1.0,
            host_us: f64::NAN,
            algbw: busbw,
            busbw,
            wrong: Some(0),
            ngpus: 2,
            samples: 1,
            ..Record::default()
        }
    }

    /// Whether the document has a `<text>` element reading `t`.
    fn has_text(svg: &str, t: &str) -> bool {
        svg.contains(&format!(">\n{t}\n</text>"))
    }

    /// A small well-formedness check: every `<tag ...>` is closed (self-closing or by a
    /// matching `</tag>`), in order.
    fn well_formed(doc: &str) -> bool {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = doc;
        while let Some(start) = rest.find('<') {
            let Some(end) = rest[start..].find('>') else {
                return false;
            };
            let tag = &rest[start + 1..start + end];
            rest = &rest[start + end + 1..];
            if tag.starts_with('?') {
                continue;
            }
            if let Some(name) = tag.strip_prefix('/') {
                if stack.pop().as_deref() != Some(name.trim()) {
                    return false;
                }
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().unwrap_or("").to_string();
                stack.push(name);
            }
        }
        stack.is_empty()
    }

    #[test]
    fn plot_has_both_libraries_and_is_well_formed() {
        let mut recs = Vec::new();
        for k in 3..20 {
            let b = 1usize << k;
            recs.push(rec("ringccl", false, b, k as f64));
            recs.push(rec("ringccl", true, b, k as f64 * 0.9));
            recs.push(rec("nccl", false, b, k as f64 * 1.1));
            recs.push(rec("nccl", true, b, k as f64));
        }
        // Other collectives, errors and zero sizes are left out.
        let mut other = rec("nccl", false, 1 << 10, 99.0);
        other.collective = "all_gather";
        recs.push(other);
        let mut err = rec("ringccl", false, 1 << 12, 1.0);
        err.error = Some("x<y".into());
        recs.push(err);
        recs.push(rec("ringccl", false, 0, 0.0));
        let svg = plot(&recs, 2).unwrap();
        assert!(well_formed(&svg), "{svg}");
        assert!(svg.starts_with("<svg"));
        for name in [
            "ringccl out-of-place",
            "nccl out-of-place",
            "ringccl in-place",
            "nccl in-place",
        ] {
            assert!(has_text(&svg, name), "{name}");
        }
        assert!(svg.contains("bus bandwidth (GB/s)"));
        assert!(svg.contains("message size (bytes, log2 scale)"));
        assert!(has_text(
            &svg,
            "all_reduce f32 sum: bus bandwidth vs size (2 GPUs)"
        ));
        assert!(has_text(&svg, "8B") && has_text(&svg, "512K"));
        assert!(!svg.contains("x<y"));
        let s = series(&recs);
        assert_eq!(s.len(), 4);
        assert!(s.iter().all(|s| s.points.len() == 17));
        assert_eq!(s[1].lib, "ringccl");
        assert!(s[1].inplace);
    }

    #[test]
    fn one_line_per_type() {
        let mut recs = Vec::new();
        for dtype in ["f32", "bf16"] {
            for k in 10..14 {
                let mut r = rec("ringccl", false, 1 << k, k as f64);
                r.dtype = dtype;
                recs.push(r);
            }
        }
        let svg = plot(&recs, 8).unwrap();
        assert!(well_formed(&svg));
        assert!(has_text(&svg, "f32 ringccl out-of-place"));
        assert!(has_text(&svg, "bf16 ringccl out-of-place"));
        assert!(has_text(
            &svg,
            "all_reduce sum: bus bandwidth vs size (8 GPUs)"
        ));
        assert_eq!(series(&recs).len(), 2);
    }

    #[test]
    fn empty_and_single_point() {
        let svg = plot(&[], 1).unwrap();
        assert!(well_formed(&svg) && has_text(&svg, "no results"));
        let mut one = rec("nccl", false, 1024, 5.0);
        one.op = "none";
        one.collective = "broadcast";
        let svg = plot(&[one], 1).unwrap();
        assert!(well_formed(&svg));
        assert!(has_text(
            &svg,
            "broadcast f32: bus bandwidth vs size (1 GPUs)"
        ));
        assert!(has_text(&svg, "nccl out-of-place"));
    }

    #[test]
    fn helpers() {
        assert_eq!(human_bytes(8.0), "8B");
        assert_eq!(human_bytes(4096.0), "4K");
        assert_eq!(human_bytes((1u64 << 30) as f64), "1G");
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(180.0), 200.0);
        assert_eq!(nice_ceiling(9.0), 10.0);
        assert_eq!(trim_num(2.50), "2.5");
        assert_eq!(trim_num(0.30000000000000004), "0.3");
    }
}
