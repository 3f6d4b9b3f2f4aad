//! A hand-written SVG plot: bus bandwidth against size (log2 x axis), one line per
//! (library, placement), for the first collective/type/operator of the run.

use std::fmt::Write as _;

use super::report::Record;

/// One plotted line: (library, in place) and its (size, busbw) points.
pub type Series = ((&'static str, bool), Vec<(f64, f64)>);

const W: f64 = 860.0;
const H: f64 = 520.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A byte count as `8B`, `4K`, `16M`, `1G`.
pub fn human_bytes(b: f64) -> String {
    let units = [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (u, v) in units {
        if b >= v as f64 {
            return format!("{}{u}", (b / v as f64 * 100.0).round() / 100.0);
        }
    }
    format!("{b}B")
}

/// The series to plot: records of the first (collective, dtype, op) with a finite busbw and a
/// positive size, grouped by (lib, inplace), each sorted by size.
pub fn series(records: &[Record]) -> Vec<Series> {
    let Some(first) = records.first() else {
        return Vec::new();
    };
    let key = (first.collective, first.dtype, first.op);
    let mut out: Vec<Series> = Vec::new();
    for r in records {
        if (r.collective, r.dtype, r.op) != key
            || r.error.is_some()
            || r.bytes == 0
            || !r.busbw.is_finite()
        {
            continue;
        }
        let k = (r.lib, r.inplace);
        let pos = match out.iter().position(|(kk, _)| *kk == k) {
            Some(p) => p,
            None => {
                out.push((k, Vec::new()));
                out.len() - 1
            }
        };
        out[pos].1.push((r.bytes as f64, r.busbw));
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The plot as an SVG document. `ngpus` goes in the title.
pub fn plot(records: &[Record], ngpus: usize) -> String {
    let ser = series(records);
    let title = match records.first() {
        Some(r) if r.op != "none" => format!(
            "{} {} {}: bus bandwidth vs size ({ngpus} GPUs)",
            r.collective, r.dtype, r.op
        ),
        Some(r) => format!(
            "{} {}: bus bandwidth vs size ({ngpus} GPUs)",
            r.collective, r.dtype
        ),
        None => "no results".to_string(),
    };
    let pts = ser.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x.log2());
        x1 = x1.max(x.log2());
        ymax = ymax.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let (x0, mut x1) = (x0.floor(), x1.ceil());
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let ymax = if ymax > 0.0 {
        nice_ceiling(ymax * 1.05)
    } else {
        1.0
    };
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |lx: f64| LEFT + (lx - x0) / (x1 - x0) * pw;
    let sy = |y: f64| TOP + ph - y / ymax * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>
<text x="{}" y="28" text-anchor="middle" font-size="16">{}</text>"#,
        LEFT + pw / 2.0,
        esc(&title)
    );
    // Grid, ticks and tick labels.
    let xticks = (x1 - x0) as usize;
    let step = xticks.div_ceil(12).max(1);
    for k in (0..=xticks).step_by(step) {
        let lx = x0 + k as f64;
        let x = sx(lx);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e0e0e0"/>
<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 18.0,
            human_bytes(lx.exp2())
        );
    }
    for k in 0..=5 {
        let y = ymax * k as f64 / 5.0;
        let py = sy(y);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e0e0e0"/>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 8.0,
            py + 4.0,
            trim_num(y)
        );
    }
    // Axes and their labels.
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>
<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">message size (bytes, log2 scale)</text>
<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">bus bandwidth (GB/s)</text>"##,
        TOP + ph,
        LEFT + pw,
        TOP + ph,
        TOP + ph,
        LEFT + pw / 2.0,
        H - 20.0,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    // Series and legend.
    for (i, ((lib, inplace), p)) in ser.iter().enumerate() {
        let color = if *lib == "ringccl" {
            "#1f77b4"
        } else {
            "#ff7f0e"
        };
        let dash = if *inplace {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let name = format!(
            "{lib} {}",
            if *inplace { "in-place" } else { "out-of-place" }
        );
        let points: Vec<String> = p
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x.log2()), sy(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline class="series" data-series="{}" fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            esc(&name),
            points.join(" ")
        );
        for &(x, y) in p {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                sx(x.log2()),
                sy(y)
            );
        }
        let ly = TOP + 10.0 + 22.0 * i as f64;
        let lx = LEFT + pw + 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/>
<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 30.0,
            lx + 38.0,
            ly + 4.0,
            esc(&name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `x`.
fn nice_ceiling(x: f64) -> f64 {
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= x {
            return m * p;
        }
    }
    10.0 * p
}

fn trim_num(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(lib: &'static str, inplace: bool, bytes: usize, busbw: f64) -> Record {
        Record {
            collective: "all_reduce",
            dtype: "f32",
            op: "sum",
            root: None,
            bytes,
            count: bytes / 4,
            lib,
            inplace,
            time_us: 1.0,
            time_us_min: 1.0,
            time_us_mean: 1.0,
            algbw: busbw,
            busbw,
            wrong: Some(0),
            ngpus: 2,
            graph: false,
            samples: 1,
            error: None,
        }
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
            recs.push(rec("nccl", false, b, k as f64 * 1.1));
            recs.push(rec("ringccl", true, b, k as f64 * 0.9));
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
        let svg = plot(&recs, 2);
        assert!(well_formed(&svg), "{svg}");
        assert!(svg.starts_with("<?xml"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        for name in [
            "ringccl out-of-place",
            "nccl out-of-place",
            "ringccl in-place",
            "nccl in-place",
        ] {
            assert!(svg.contains(&format!("data-series=\"{name}\"")), "{name}");
        }
        assert!(svg.contains("bus bandwidth (GB/s)"));
        assert!(svg.contains("message size (bytes, log2 scale)"));
        assert!(svg.contains("all_reduce f32 sum"));
        let s = series(&recs);
        assert_eq!(s.len(), 4);
        assert!(s.iter().all(|(_, p)| p.len() == 17));
    }

    #[test]
    fn empty_and_single_point() {
        assert!(well_formed(&plot(&[], 1)));
        let svg = plot(&[rec("nccl", false, 1024, 5.0)], 1);
        assert!(well_formed(&svg));
        assert_eq!(svg.matches("<polyline").count(), 1);
    }

    #[test]
    fn helpers() {
        assert_eq!(human_bytes(8.0), "8B");
        assert_eq!(human_bytes(4096.0), "4K");
        assert_eq!(human_bytes((1u64 << 30) as f64), "1G");
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(180.0), 200.0);
        assert_eq!(trim_num(2.50), "2.5");
    }
}
