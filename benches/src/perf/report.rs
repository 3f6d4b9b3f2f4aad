//! Results: the records, the nccl-tests-like table, and the JSON and CSV writers.

use std::fmt::Write as _;

/// One measurement: one library, one collective, type, operator, size and placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub collective: &'static str,
    /// Rust name (`f32`, `bf16`, ...).
    pub dtype: &'static str,
    /// `sum`, ..., or `none` for data movement.
    pub op: &'static str,
    pub root: Option<usize>,
    /// The size column: the larger buffer, in bytes.
    pub bytes: usize,
    /// `bytes / element size`.
    pub count: usize,
    /// `ringccl` or `nccl`.
    pub lib: &'static str,
    pub inplace: bool,
    /// Median per-iteration time (slowest rank), microseconds; NaN on error.
    pub time_us: f64,
    pub time_us_min: f64,
    pub time_us_mean: f64,
    /// GB/s (1e9 bytes per second).
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements over the check iterations; `None` when not checked.
    pub wrong: Option<usize>,
    pub ngpus: usize,
    /// Whether the time comes from CUDA-graph replays.
    pub graph: bool,
    /// Timed samples behind the statistics (iterations, or graph replays).
    pub samples: usize,
    pub error: Option<String>,
}

/// Timing statistics of a list of per-iteration times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub mean: f64,
}

impl Stats {
    /// Median (mean of the two middle values for an even count), minimum and mean; NaN for an
    /// empty list.
    pub fn of(samples: &[f64]) -> Stats {
        if samples.is_empty() {
            return Stats {
                median: f64::NAN,
                min: f64::NAN,
                mean: f64::NAN,
            };
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let k = v.len();
        let median = if k % 2 == 1 {
            v[k / 2]
        } else {
            (v[k / 2 - 1] + v[k / 2]) / 2.0
        };
        Stats {
            median,
            min: v[0],
            mean: v.iter().sum::<f64>() / k as f64,
        }
    }
}

/// algbw and busbw in GB/s for `bytes` moved in `time_us` with the collective's factor.
pub fn bandwidths(bytes: usize, time_us: f64, factor: f64) -> (f64, f64) {
    if time_us.is_nan() || time_us <= 0.0 {
        return (f64::NAN, f64::NAN);
    }
    let algbw = bytes as f64 / (time_us * 1e-6) / 1e9;
    (algbw, algbw * factor)
}

/// The run's description, written beside the records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Meta {
    pub date: String,
    pub command: Vec<String>,
    /// (ordinal, name) per rank.
    pub gpus: Vec<(usize, String)>,
    /// `cuDriverGetVersion`, e.g. 13000.
    pub driver_version: Option<i32>,
    pub nccl_version: Option<String>,
    pub ringccl_version: String,
    pub iters: usize,
    pub warmup: usize,
    pub check_iters: usize,
    pub graph_requested: bool,
    pub notes: Vec<String>,
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    utc_from_unix(secs)
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian calendar).
pub fn utc_from_unix(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number, or `null` when not finite.
pub fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

fn json_opt<T: std::fmt::Display>(x: Option<T>) -> String {
    x.map_or_else(|| "null".into(), |v| v.to_string())
}

fn json_opt_str(x: Option<&str>) -> String {
    x.map_or_else(|| "null".into(), json_str)
}

/// One record as a JSON object.
pub fn record_json(r: &Record) -> String {
    format!(
        "{{\"collective\":{},\"dtype\":{},\"op\":{},\"root\":{},\"bytes\":{},\"count\":{},\"lib\":{},\"inplace\":{},\"time_us\":{},\"time_us_min\":{},\"time_us_mean\":{},\"algbw\":{},\"busbw\":{},\"wrong\":{},\"ngpus\":{},\"graph\":{},\"samples\":{},\"error\":{}}}",
        json_str(r.collective),
        json_str(r.dtype),
        json_str(r.op),
        json_opt(r.root),
        r.bytes,
        r.count,
        json_str(r.lib),
        r.inplace,
        json_num(r.time_us),
        json_num(r.time_us_min),
        json_num(r.time_us_mean),
        json_num(r.algbw),
        json_num(r.busbw),
        json_opt(r.wrong),
        r.ngpus,
        r.graph,
        r.samples,
        json_opt_str(r.error.as_deref()),
    )
}

/// The whole results file: `{"meta": {...}, "records": [...]}`.
pub fn to_json(meta: &Meta, records: &[Record]) -> String {
    let list = |v: Vec<String>| format!("[{}]", v.join(","));
    let gpus = list(
        meta.gpus
            .iter()
            .map(|(o, n)| format!("{{\"ordinal\":{o},\"name\":{}}}", json_str(n)))
            .collect(),
    );
    let mut out = String::new();
    out.push_str("{\n\"meta\":{");
    let _ = write!(
        out,
        "\"date\":{},\"command\":{},\"gpus\":{},\"driver_version\":{},\"nccl_version\":{},\"ringccl_version\":{},\"iters\":{},\"warmup\":{},\"check_iters\":{},\"graph_requested\":{},\"notes\":{}",
        json_str(&meta.date),
        list(meta.command.iter().map(|a| json_str(a)).collect()),
        gpus,
        json_opt(meta.driver_version),
        json_opt_str(meta.nccl_version.as_deref()),
        json_str(&meta.ringccl_version),
        meta.iters,
        meta.warmup,
        meta.check_iters,
        meta.graph_requested,
        list(meta.notes.iter().map(|a| json_str(a)).collect()),
    );
    out.push_str("},\n\"records\":[");
    for (i, r) in records.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        out.push_str(&record_json(r));
    }
    out.push_str("\n]\n}\n");
    out
}

/// The CSV columns.
pub const CSV_HEADER: &str = "collective,dtype,op,root,bytes,count,lib,inplace,time_us,time_us_min,time_us_mean,algbw,busbw,wrong,ngpus,graph,samples,error";

/// A CSV field, quoted when needed.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn csv_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        String::new()
    }
}

/// The records as CSV, with a header line.
pub fn to_csv(records: &[Record]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in records {
        let fields = [
            r.collective.to_string(),
            r.dtype.to_string(),
            r.op.to_string(),
            r.root.map_or(String::new(), |x| x.to_string()),
            r.bytes.to_string(),
            r.count.to_string(),
            r.lib.to_string(),
            r.inplace.to_string(),
            csv_num(r.time_us),
            csv_num(r.time_us_min),
            csv_num(r.time_us_mean),
            csv_num(r.algbw),
            csv_num(r.busbw),
            r.wrong.map_or(String::new(), |x| x.to_string()),
            r.ngpus.to_string(),
            r.graph.to_string(),
            r.samples.to_string(),
            csv_field(r.error.as_deref().unwrap_or("")),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

/// The table's column headers (nccl-tests' layout, with a `lib` column and busbw ratios).
pub fn table_header(ratio: bool) -> String {
    let mut s = String::new();
    // Centred over their four columns (the cells start at columns 61 and 99).
    let _ = writeln!(s, "#{:>84}{:>36}", "out-of-place", "in-place");
    let _ = write!(
        s,
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>4}  {:>7}  {:>10}  {:>7}  {:>7}  {:>6}  {:>10}  {:>7}  {:>7}  {:>6}",
        "size", "count", "type", "redop", "root", "lib", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
    );
    if ratio {
        let _ = write!(s, "  {:>7}  {:>7}", "ratio", "ratio");
    }
    s.push('\n');
    let _ = write!(
        s,
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>4}  {:>7}  {:>10}  {:>7}  {:>7}  {:>6}  {:>10}  {:>7}  {:>7}  {:>6}",
        "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    if ratio {
        let _ = write!(s, "  {:>7}  {:>7}", "oop", "ip");
    }
    s
}

/// One measurement's four columns (or N/A, or an error marker).
fn cell(r: Option<&Record>) -> String {
    match r {
        None => format!("{:>10}  {:>7}  {:>7}  {:>6}", "N/A", "N/A", "N/A", "N/A"),
        Some(r) if r.error.is_some() => {
            format!("{:>10}  {:>7}  {:>7}  {:>6}", "error", "-", "-", "-")
        }
        Some(r) => format!(
            "{:>10.2}  {:>7.2}  {:>7.2}  {:>6}",
            r.time_us,
            r.algbw,
            r.busbw,
            r.wrong.map_or("N/A".to_string(), |w| w.to_string())
        ),
    }
}

/// ringccl busbw / NCCL busbw, formatted (`-` when undefined).
pub fn ratio(ringccl: Option<&Record>, nccl: Option<&Record>) -> String {
    match (ringccl, nccl) {
        (Some(a), Some(b)) if a.error.is_none() && b.error.is_none() => {
            let q = a.busbw / b.busbw;
            if q.is_finite() {
                format!("{q:.3}")
            } else {
                "-".into()
            }
        }
        _ => "-".into(),
    }
}

/// One table row: size, count, type, op, root, lib, out-of-place and in-place cells, and
/// optional ratio columns.
#[allow(clippy::too_many_arguments)]
pub fn table_row(
    bytes: usize,
    count: usize,
    dtype: &str,
    op: &str,
    root: Option<usize>,
    lib: &str,
    oop: Option<&Record>,
    ip: Option<&Record>,
    ratios: Option<(String, String)>,
) -> String {
    let mut s = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>4}  {:>7}  {}  {}",
        bytes,
        count,
        dtype,
        op,
        root.map_or("-1".to_string(), |r| r.to_string()),
        lib,
        cell(oop),
        cell(ip)
    );
    if let Some((a, b)) = ratios {
        let _ = write!(s, "  {a:>7}  {b:>7}");
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn rec(lib: &'static str, inplace: bool, bytes: usize, busbw: f64) -> Record {
        Record {
            collective: "all_reduce",
            dtype: "f32",
            op: "sum",
            root: None,
            bytes,
            count: bytes / 4,
            lib,
            inplace,
            time_us: 12.5,
            time_us_min: 11.0,
            time_us_mean: 12.75,
            algbw: busbw / 1.5,
            busbw,
            wrong: Some(0),
            ngpus: 4,
            graph: false,
            samples: 20,
            error: None,
        }
    }

    #[test]
    fn stats() {
        let s = Stats::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.mean), (2.0, 1.0, 2.0));
        let s = Stats::of(&[4.0, 1.0, 2.0, 3.0]);
        assert_eq!((s.median, s.min, s.mean), (2.5, 1.0, 2.5));
        assert!(Stats::of(&[]).median.is_nan());
    }

    #[test]
    fn bandwidth_units() {
        // 1 GB in 1 second = 1 GB/s; all-reduce factor on 4 ranks = 1.5.
        let (a, b) = bandwidths(1_000_000_000, 1e6, 1.5);
        assert!((a - 1.0).abs() < 1e-12 && (b - 1.5).abs() < 1e-12);
        assert!(bandwidths(8, 0.0, 1.0).0.is_nan());
    }

    #[test]
    fn dates() {
        assert_eq!(utc_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_from_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_from_unix(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc_now().len(), 20);
    }

    #[test]
    fn json_escapes_and_shape() {
        assert_eq!(json_str("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        assert_eq!(json_num(1.5), "1.5");
        assert_eq!(json_num(f64::NAN), "null");
        let mut bad = rec("nccl", true, 1024, f64::NAN);
        bad.error = Some("ncclInvalidUsage \"x\"".into());
        bad.wrong = None;
        let meta = Meta {
            date: "2026-01-01T00:00:00Z".into(),
            command: vec!["ringccl-perf".into(), "-b".into(), "8".into()],
            gpus: vec![(0, "NVIDIA H200".into())],
            driver_version: Some(13000),
            nccl_version: Some("2.27.3".into()),
            ringccl_version: "0.1.0".into(),
            iters: 20,
            warmup: 5,
            check_iters: 1,
            graph_requested: false,
            notes: vec![],
        };
        let j = to_json(&meta, &[rec("ringccl", false, 1024, 3.0), bad]);
        for needle in [
            "\"meta\":{\"date\":\"2026-01-01T00:00:00Z\"",
            "\"command\":[\"ringccl-perf\",\"-b\",\"8\"]",
            "\"gpus\":[{\"ordinal\":0,\"name\":\"NVIDIA H200\"}]",
            "\"driver_version\":13000",
            "\"nccl_version\":\"2.27.3\"",
            "\"lib\":\"ringccl\",\"inplace\":false,\"time_us\":12.5",
            "\"busbw\":3,\"wrong\":0,\"ngpus\":4,\"graph\":false",
            "\"busbw\":null,\"wrong\":null",
            "\"error\":\"ncclInvalidUsage \\\"x\\\"\"",
            "\"root\":null",
        ] {
            assert!(j.contains(needle), "{needle} missing in {j}");
        }
        // Balanced brackets and braces outside strings.
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        for c in j.chars() {
            match (in_str, esc, c) {
                (true, true, _) => esc = false,
                (true, false, '\\') => esc = true,
                (true, false, '"') => in_str = false,
                (false, _, '"') => in_str = true,
                (false, _, '{' | '[') => depth += 1,
                (false, _, '}' | ']') => {
                    depth -= 1;
                    assert!(depth >= 0);
                }
                _ => {}
            }
        }
        assert_eq!((depth, in_str), (0, false));
        assert_eq!(j.matches("\"collective\"").count(), 2);
    }

    #[test]
    fn csv_rows() {
        let mut bad = rec("nccl", true, 64, f64::NAN);
        bad.error = Some("a, \"b\"".into());
        let c = to_csv(&[rec("ringccl", false, 64, 2.0), bad]);
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], CSV_HEADER);
        let ncols = CSV_HEADER.split(',').count();
        assert_eq!(lines[1].split(',').count(), ncols);
        assert!(lines[1].starts_with("all_reduce,f32,sum,,64,16,ringccl,false,12.5,11,12.75,"));
        assert!(lines[2].ends_with(",\"a, \"\"b\"\"\""));
    }

    #[test]
    fn table_layout() {
        let h = table_header(true);
        assert_eq!(h.lines().count(), 3);
        assert!(h.contains("#wrong") && h.contains("busbw") && h.contains("ratio"));
        let a = rec("ringccl", false, 1 << 20, 3.0);
        let b = rec("nccl", false, 1 << 20, 4.0);
        assert_eq!(ratio(Some(&a), Some(&b)), "0.750");
        assert_eq!(ratio(Some(&a), None), "-");
        let row = table_row(
            1 << 20,
            1 << 18,
            "float",
            "sum",
            None,
            "ringccl",
            Some(&a),
            None,
            Some((ratio(Some(&a), Some(&b)), "-".into())),
        );
        assert!(row.contains("1048576") && row.contains("ringccl") && row.contains("12.50"));
        assert!(row.contains("N/A") && row.contains("0.750"));
        // Columns line up with the header's.
        let hdr_cols = h.lines().nth(1).unwrap().split_whitespace().count();
        assert_eq!(row.split_whitespace().count(), hdr_cols - 1);
    }
}
