//! Results: the records, the nccl-tests-like table, and the JSON and CSV files (serde).

use std::fmt::Write as _;

use serde::{Serialize, Serializer};

/// One measurement: one library, one collective, type, operator, size and placement.
///
/// Serialised (JSON object, CSV row) with the fields in this order and under these names;
/// a time or bandwidth that is not finite (not measured) is `null` in JSON and an empty CSV
/// field.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Record {
    /// The collective's name (`all_reduce`, ...).
    pub collective: &'static str,
    /// Rust name (`f32`, `bf16`, ...).
    pub dtype: &'static str,
    /// `sum`, ..., or `none` for data movement.
    pub op: &'static str,
    /// The root rank, for collectives that have one.
    pub root: Option<usize>,
    /// The size column: the larger buffer, in bytes.
    pub bytes: usize,
    /// `bytes / element size`.
    pub count: usize,
    /// `ringccl` or `nccl`.
    pub lib: &'static str,
    /// Whether the call ran in place.
    pub inplace: bool,
    /// Median per-iteration time (slowest rank), microseconds; NaN on error.
    #[serde(serialize_with = "finite")]
    pub time_us: f64,
    /// Smallest per-iteration time, microseconds.
    #[serde(serialize_with = "finite")]
    pub time_us_min: f64,
    /// Mean per-iteration time, microseconds.
    #[serde(serialize_with = "finite")]
    pub time_us_mean: f64,
    /// Host wall time per call of the timed eager loop (the call and the timing event's
    /// record; the slowest rank's), microseconds: when it is close to `time_us`, the calls are
    /// bound by their issue on the host, not by the GPU. `null` for graph replays.
    #[serde(serialize_with = "finite")]
    pub host_us: f64,
    /// GB/s (1e9 bytes per second).
    #[serde(serialize_with = "finite")]
    pub algbw: f64,
    /// algbw times the collective's bus factor, GB/s.
    #[serde(serialize_with = "finite")]
    pub busbw: f64,
    /// Wrong elements over the check iterations; `None` when not checked.
    pub wrong: Option<usize>,
    /// Ranks (one GPU each).
    pub ngpus: usize,
    /// Whether the time comes from CUDA-graph replays.
    pub graph: bool,
    /// Timed samples behind the statistics (iterations, or graph replays).
    pub samples: usize,
    /// Why the measurement failed, if it did.
    pub error: Option<String>,
    /// Processes the ranks ran in: 1 (one process drove every GPU) or one per rank
    /// (`--procs`, started by a launcher).
    pub procs: usize,
}

/// A number, or nothing (JSON `null`, an empty CSV field) when it is not finite.
fn finite<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else {
        s.serialize_none()
    }
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

/// The run's description, written beside the records (the JSON file's `meta`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Meta {
    /// When the run started, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    /// The command line, program name first.
    pub command: Vec<String>,
    /// The GPU of each rank, in rank order.
    pub gpus: Vec<Gpu>,
    /// `cuDriverGetVersion`, e.g. 13000.
    pub driver_version: Option<i32>,
    /// NCCL's version (`2.28.3`), when it was loaded.
    pub nccl_version: Option<String>,
    /// This crate's version.
    pub ringccl_version: String,
    /// `-n`.
    pub iters: usize,
    /// `-w`.
    pub warmup: usize,
    /// `-c`.
    pub check_iters: usize,
    /// `-G 1`.
    pub graph_requested: bool,
    /// What happened that the records do not say (a library missing, a capture failing...).
    pub notes: Vec<String>,
    /// Processes: 1 (one process drove every GPU) or one per rank (started by a launcher).
    pub procs: usize,
}

/// One rank's GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Gpu {
    /// Device ordinal.
    pub ordinal: usize,
    /// Device name.
    pub name: String,
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

/// The whole results file: `{"meta": {...}, "records": [...]}`, one record per line.
pub fn to_json(meta: &Meta, records: &[Record]) -> Result<String, String> {
    fn json<T: Serialize>(v: &T) -> Result<String, String> {
        serde_json::to_string(v).map_err(|e| format!("JSON: {e}"))
    }
    let mut out = format!("{{\n\"meta\":{},\n\"records\":[", json(meta)?);
    for (i, r) in records.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        out.push_str(&json(r)?);
    }
    out.push_str("\n]\n}\n");
    Ok(out)
}

/// The records as CSV: a header line with [`Record`]'s field names, then one row each.
pub fn to_csv(records: &[Record]) -> Result<String, String> {
    // serde names the columns when it writes the first row: without records, write a
    // placeholder's and keep the header only.
    let placeholder = [Record::default()];
    let rows = if records.is_empty() {
        &placeholder[..]
    } else {
        records
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r).map_err(|e| format!("CSV: {e}"))?;
    }
    let bytes = w.into_inner().map_err(|e| format!("CSV: {}", e.error()))?;
    let mut out = String::from_utf8(bytes).map_err(|e| format!("CSV: {e}"))?;
    if records.is_empty() {
        out.truncate(out.find('\n').map_or(0, |i| i + 1));
    }
    Ok(out)
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
            host_us: 9.5,
            algbw: busbw / 1.5,
            busbw,
            wrong: Some(0),
            ngpus: 4,
            graph: false,
            samples: 20,
            error: None,
            procs: 1,
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

    /// The fields, in order, that the JSON objects and the CSV header have.
    const FIELDS: [&str; 20] = [
        "collective",
        "dtype",
        "op",
        "root",
        "bytes",
        "count",
        "lib",
        "inplace",
        "time_us",
        "time_us_min",
        "time_us_mean",
        "host_us",
        "algbw",
        "busbw",
        "wrong",
        "ngpus",
        "graph",
        "samples",
        "error",
        "procs",
    ];

    #[test]
    fn record_as_json_object() {
        let j = serde_json::to_string(&rec("ringccl", false, 1024, 3.0)).unwrap();
        assert_eq!(
            j,
            "{\"collective\":\"all_reduce\",\"dtype\":\"f32\",\"op\":\"sum\",\"root\":null,\
             \"bytes\":1024,\"count\":256,\"lib\":\"ringccl\",\"inplace\":false,\
             \"time_us\":12.5,\"time_us_min\":11.0,\"time_us_mean\":12.75,\"host_us\":9.5,\"algbw\":2.0,\
             \"busbw\":3.0,\"wrong\":0,\"ngpus\":4,\"graph\":false,\"samples\":20,\"error\":null,\
             \"procs\":1}"
        );
        // Not measured: null numbers, the error as a JSON string.
        let mut bad = rec("nccl", true, 1024, f64::NAN);
        bad.root = Some(1);
        bad.wrong = None;
        bad.error = Some("ncclInvalidUsage \"x\"\n".into());
        let v: serde_json::Value = serde_json::to_value(&bad).unwrap();
        assert!(v["busbw"].is_null() && v["algbw"].is_null() && v["wrong"].is_null());
        assert_eq!(v["root"], 1);
        assert_eq!(v["error"], "ncclInvalidUsage \"x\"\n");
        // Every field, in order.
        let j = serde_json::to_string(&bad).unwrap();
        let pos: Vec<usize> = FIELDS
            .iter()
            .map(|f| j.find(&format!("\"{f}\":")).unwrap())
            .collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{j}");
        assert_eq!(v.as_object().unwrap().len(), FIELDS.len());
    }

    #[test]
    fn results_file() {
        let mut bad = rec("nccl", true, 1024, f64::NAN);
        bad.error = Some("ncclInvalidUsage".into());
        let meta = Meta {
            date: "2026-01-01T00:00:00Z".into(),
            command: vec!["ringccl-perf".into(), "-b".into(), "8".into()],
            gpus: vec![Gpu {
                ordinal: 0,
                name: "NVIDIA H200".into(),
            }],
            driver_version: Some(13000),
            nccl_version: Some("2.27.3".into()),
            ringccl_version: "0.1.0".into(),
            iters: 20,
            warmup: 5,
            check_iters: 1,
            graph_requested: false,
            notes: vec![],
            procs: 2,
        };
        let recs = [rec("ringccl", false, 1024, 3.0), bad];
        let j = to_json(&meta, &recs).unwrap();
        let lines: Vec<&str> = j.lines().collect();
        assert_eq!(lines.len(), 7, "{j}");
        assert_eq!(
            lines[1],
            "\"meta\":{\"date\":\"2026-01-01T00:00:00Z\",\"command\":[\"ringccl-perf\",\"-b\",\"8\"],\
             \"gpus\":[{\"ordinal\":0,\"name\":\"NVIDIA H200\"}],\"driver_version\":13000,\
             \"nccl_version\":\"2.27.3\",\"ringccl_version\":\"0.1.0\",\"iters\":20,\"warmup\":5,\
             \"check_iters\":1,\"graph_requested\":false,\"notes\":[],\"procs\":2},"
        );
        assert_eq!(
            lines[3].trim_end_matches(','),
            serde_json::to_string(&recs[0]).unwrap()
        );
        // What the table script reads.
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["meta"]["gpus"][0]["name"], "NVIDIA H200");
        assert_eq!(v["records"].as_array().unwrap().len(), 2);
        assert_eq!(v["records"][0]["busbw"], 3.0);
        assert_eq!(v["records"][1]["inplace"], true);
        assert_eq!(v["meta"]["procs"], 2);
        assert!(v["records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["procs"] == 1));
        let empty: serde_json::Value = serde_json::from_str(&to_json(&meta, &[]).unwrap()).unwrap();
        assert_eq!(empty["records"].as_array().unwrap().len(), 0);
    }

    #[test]
    fn csv_header_and_rows() {
        let mut bad = rec("nccl", true, 64, f64::NAN);
        bad.error = Some("a, \"b\"".into());
        bad.wrong = None;
        let c = to_csv(&[rec("ringccl", false, 64, 2.0), bad]).unwrap();
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], FIELDS.join(","));
        assert_eq!(
            lines[1],
            "all_reduce,f32,sum,,64,16,ringccl,false,12.5,11.0,12.75,9.5,1.3333333333333333,2.0,0,4,false,20,,1"
        );
        assert_eq!(
            lines[2],
            "all_reduce,f32,sum,,64,16,nccl,true,12.5,11.0,12.75,9.5,,,,4,false,20,\"a, \"\"b\"\"\",1"
        );
        // No records: the header alone.
        assert_eq!(to_csv(&[]).unwrap(), format!("{}\n", FIELDS.join(",")));
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
