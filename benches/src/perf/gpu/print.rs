//! The lines of the table around the measured rows, as text: the run's preamble, each sweep's
//! header, each size's rows (and its errors), and the summary. `scripts/perf-table.py` and
//! `scripts/perf-compare.py` read the files ringccl-perf writes; people and logs read these.

use std::fmt::Write as _;

use ringccl::CollectiveKind;

use super::super::args::Options;
use super::super::report::{self, Meta, Record};
use super::Lib;

/// The lines before the first sweep: the sizes and iterations, the devices, the driver and NCCL
/// versions, the notes.
pub(super) fn preamble(opts: &Options, meta: &Meta, sizes: &[usize]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# ringccl-perf {}  minBytes {} maxBytes {} step: {}(factor) sizes: {} warmup iters: {} iters: {} check iters: {} graph: {}",
        meta.ringccl_version,
        opts.min_bytes,
        opts.max_bytes,
        opts.factor,
        sizes.len(),
        opts.warmup,
        opts.iters,
        opts.check_iters,
        u8::from(opts.graph)
    );
    let _ = writeln!(s, "#");
    let _ = writeln!(s, "# Using devices");
    for (r, g) in meta.gpus.iter().enumerate() {
        let _ = writeln!(s, "#  Rank {r:2} device {:2} [{}]", g.ordinal, g.name);
    }
    if meta.procs > 1 {
        let _ = writeln!(s, "# One process per GPU: {} processes", meta.procs);
    }
    let _ = writeln!(
        s,
        "# CUDA driver {}  NCCL {}",
        meta.driver_version
            .map_or("unknown".to_string(), |v| format!(
                "{}.{} ({v})",
                v / 1000,
                (v % 1000) / 10
            )),
        meta.nccl_version.as_deref().unwrap_or("not loaded")
    );
    for note in &meta.notes {
        let _ = writeln!(s, "# note: {note}");
    }
    s
}

/// The lines after the last sweep: the notes, the wrong elements, the failed measurements and
/// each library's average bus bandwidth.
pub(super) fn summary(records: &[Record], meta: &Meta, wrong: usize, errors: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#");
    for note in &meta.notes {
        let _ = writeln!(s, "# note: {note}");
    }
    let _ = writeln!(
        s,
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    );
    if errors > 0 {
        let _ = writeln!(s, "# Errors               : {errors} measurement(s) failed");
    }
    for lib in ["ringccl", "nccl"] {
        let bw: Vec<f64> = records
            .iter()
            .filter(|r| r.lib == lib && r.error.is_none() && r.busbw.is_finite() && r.bytes > 0)
            .map(|r| r.busbw)
            .collect();
        if !bw.is_empty() {
            let _ = writeln!(
                s,
                "# Avg bus bandwidth ({lib:7}) : {:.3} GB/s",
                bw.iter().sum::<f64>() / bw.len() as f64
            );
        }
    }
    let _ = writeln!(s, "#");
    s
}

/// A sweep's header: the collective, the type (NCCL's name and ringccl's), the operator, the
/// root (`-` for none) and the ranks, then the column names (`both`: with the ratio columns).
pub(super) fn sweep_header(
    kind: CollectiveKind,
    (nccl_type, dtype): (&str, &str),
    op: &str,
    root: Option<usize>,
    n: usize,
    both: bool,
) -> String {
    format!(
        "#\n# Collective: {}   type: {} ({})   op: {}   root: {}   ranks: {}\n{}\n",
        kind.name(),
        nccl_type,
        dtype,
        op,
        root.map_or("-".to_string(), |r| r.to_string()),
        n,
        report::table_header(both)
    )
}

/// One size's lines: a row per library (ringccl's with its ratios to NCCL's when both ran),
/// then a line per failed measurement.
pub(super) fn size_rows(
    rows: &[(Lib, Option<Record>, Option<Record>)],
    (bytes, elems): (usize, usize),
    (nccl_type, op): (&str, &str),
    root: Option<usize>,
    both: bool,
) -> String {
    let find = |l: Lib, ip: bool| {
        rows.iter()
            .find(|(x, _, _)| *x == l)
            .and_then(|(_, o, i)| if ip { i.as_ref() } else { o.as_ref() })
    };
    let mut out = String::new();
    for (lib, oop, ip) in rows {
        let ratios = both.then(|| {
            if *lib == Lib::Ringccl {
                (
                    report::ratio(find(Lib::Ringccl, false), find(Lib::Nccl, false)),
                    report::ratio(find(Lib::Ringccl, true), find(Lib::Nccl, true)),
                )
            } else {
                (String::new(), String::new())
            }
        });
        let _ = writeln!(
            out,
            "{}",
            report::table_row(
                bytes,
                elems,
                nccl_type,
                op,
                root,
                lib.name(),
                oop.as_ref(),
                ip.as_ref(),
                ratios,
            )
        );
    }
    for (_, oop, ip) in rows {
        for r in [oop, ip].into_iter().flatten() {
            if let Some(e) = &r.error {
                let _ = writeln!(
                    out,
                    "#   {} {} {}: {e}",
                    r.lib,
                    if r.inplace {
                        "in-place"
                    } else {
                        "out-of-place"
                    },
                    r.bytes
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::super::args;
    use super::super::super::report::Gpu;
    use super::*;

    fn rec(lib: &'static str, inplace: bool, busbw: f64, error: Option<&str>) -> Record {
        Record {
            collective: "all_reduce",
            dtype: "f32",
            op: "sum",
            root: None,
            bytes: 1024,
            count: 256,
            lib,
            inplace,
            time_us: 10.0,
            time_us_min: 9.0,
            time_us_mean: 10.5,
            host_us: f64::NAN,
            algbw: busbw,
            busbw,
            wrong: Some(0),
            ngpus: 2,
            graph: false,
            samples: 20,
            error: error.map(str::to_string),
            procs: 2,
        }
    }

    fn meta(procs: usize, notes: Vec<String>) -> Meta {
        Meta {
            date: "2026-12-01T00:00:00Z".into(),
            command: vec!["ringccl-perf".into()],
            gpus: vec![
                Gpu {
                    ordinal: 0,
                    name: "NVIDIA H200".into(),
                },
                Gpu {
                    ordinal: 1,
                    name: "NVIDIA H200".into(),
                },
            ],
            driver_version: Some(12080),
            nccl_version: Some("2.28.3".into()),
            ringccl_version: "0.1.0".into(),
            iters: 100,
            warmup: 10,
            check_iters: 1,
            graph_requested: false,
            notes,
            procs,
        }
    }

    #[test]
    fn the_preamble_names_sizes_devices_and_versions() {
        let opts = match args::parse(["-b", "8", "-e", "64M", "-f", "8", "-n", "100", "-w", "10"]) {
            Ok(o) => o,
            Err(e) => panic!("{e}"),
        };
        let sizes = args::sizes(&opts);
        let text = preamble(&opts, &meta(2, vec!["a note".into()]), &sizes);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            format!(
                "# ringccl-perf 0.1.0  minBytes 8 maxBytes {} step: 8(factor) sizes: {} warmup iters: 10 iters: 100 check iters: {} graph: 0",
                64 << 20,
                sizes.len(),
                opts.check_iters
            )
        );
        assert_eq!(&lines[1..3], ["#", "# Using devices"]);
        assert_eq!(lines[3], "#  Rank  0 device  0 [NVIDIA H200]");
        assert_eq!(lines[4], "#  Rank  1 device  1 [NVIDIA H200]");
        assert_eq!(lines[5], "# One process per GPU: 2 processes");
        assert_eq!(lines[6], "# CUDA driver 12.8 (12080)  NCCL 2.28.3");
        assert_eq!(lines[7], "# note: a note");
        assert_eq!(lines.len(), 8);
        // One process: no line for the processes; no driver version: "unknown".
        let mut m = meta(1, Vec::new());
        m.driver_version = None;
        m.nccl_version = None;
        let text = preamble(&opts, &m, &sizes);
        assert!(!text.contains("One process per GPU"));
        assert!(text.contains("# CUDA driver unknown  NCCL not loaded\n"));
    }

    #[test]
    fn the_summary_averages_each_librarys_bus_bandwidth() {
        let records = [
            rec("ringccl", false, 10.0, None),
            rec("ringccl", true, 20.0, None),
            rec("ringccl", true, f64::NAN, Some("failed")),
            rec("nccl", false, 30.0, None),
        ];
        let text = summary(&records, &meta(1, Vec::new()), 0, 1);
        assert_eq!(
            text,
            "#\n# Out of bounds values : 0 OK\n# Errors               : 1 measurement(s) failed\n\
             # Avg bus bandwidth (ringccl) : 15.000 GB/s\n# Avg bus bandwidth (nccl   ) : 30.000 GB/s\n#\n"
        );
        let text = summary(&records[..1], &meta(1, vec!["n".into()]), 3, 0);
        assert_eq!(
            text,
            "#\n# note: n\n# Out of bounds values : 3 FAILED\n# Avg bus bandwidth (ringccl) : 10.000 GB/s\n#\n"
        );
    }

    #[test]
    fn a_sweep_header_names_the_call() {
        let h = sweep_header(
            CollectiveKind::Broadcast,
            ("float", "f32"),
            "none",
            Some(1),
            2,
            false,
        );
        assert_eq!(
            h,
            format!(
                "#\n# Collective: broadcast   type: float (f32)   op: none   root: 1   ranks: 2\n{}\n",
                report::table_header(false)
            )
        );
        let h = sweep_header(
            CollectiveKind::AllReduce,
            ("half", "f16"),
            "sum",
            None,
            8,
            true,
        );
        assert!(h.contains("   root: -   ranks: 8\n"));
        assert!(h.ends_with(&format!("{}\n", report::table_header(true))));
    }

    #[test]
    fn a_sizes_rows_carry_ratios_on_ringccls_row_and_errors_last() {
        let rows = vec![
            (
                Lib::Ringccl,
                Some(rec("ringccl", false, 10.0, None)),
                Some(rec("ringccl", true, 20.0, Some("boom"))),
            ),
            (
                Lib::Nccl,
                Some(rec("nccl", false, 20.0, None)),
                Some(rec("nccl", true, 20.0, None)),
            ),
        ];
        let text = size_rows(&rows, (1024, 256), ("float", "sum"), None, true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let ratios = (
            report::ratio(rows[0].1.as_ref(), rows[1].1.as_ref()),
            report::ratio(rows[0].2.as_ref(), rows[1].2.as_ref()),
        );
        let want = report::table_row(
            1024,
            256,
            "float",
            "sum",
            None,
            "ringccl",
            rows[0].1.as_ref(),
            rows[0].2.as_ref(),
            Some(ratios),
        );
        assert_eq!(lines[0], want);
        let want = report::table_row(
            1024,
            256,
            "float",
            "sum",
            None,
            "nccl",
            rows[1].1.as_ref(),
            rows[1].2.as_ref(),
            Some((String::new(), String::new())),
        );
        assert_eq!(lines[1], want);
        assert_eq!(lines[2], "#   ringccl in-place 1024: boom");
        // One library: no ratio columns.
        let text = size_rows(&rows[..1], (1024, 256), ("float", "sum"), None, false);
        let want = report::table_row(
            1024,
            256,
            "float",
            "sum",
            None,
            "ringccl",
            rows[0].1.as_ref(),
            rows[0].2.as_ref(),
            None,
        );
        assert_eq!(text.lines().next(), Some(want.as_str()));
    }
}
