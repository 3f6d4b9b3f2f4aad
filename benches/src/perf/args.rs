//! The command line (nccl-tests' short options plus a few long ones), parsed by clap.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{ArgAction, CommandFactory, Parser};
use ringccl::{CollectiveKind, DataType, RedOp};

use super::coll;

/// Which libraries to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Libs {
    /// Measure ringccl.
    pub ringccl: bool,
    /// Measure NCCL.
    pub nccl: bool,
}

/// The text after the options in `--help`.
const AFTER_HELP: &str = "\
Time is the median over the -n iterations of the slowest rank's time (CUDA events on every
rank's stream). algbw = size / time; busbw = algbw x the collective's factor (nccl-tests'
PERFORMANCE.md). #wrong counts the elements that differ from the exactly computed expected
values over the -c check iterations (outputs poisoned before each). Exit status 1 on any
wrong element or error.

One process per GPU: `ringccl-run -n 2 ringccl-perf --procs 2 ...` (or torchrun
--nproc-per-node 2 ringccl-perf ...). Each process is one rank on GPU LOCAL_RANK; ringccl
and NCCL are measured in the same processes; rank 0 prints and writes the results.
ringccl-perf's own rendezvous listens on ringccl's port + 1 (MASTER_PORT + 2, or the port
of RINGCCL_COMM_ID + 1).";

/// Everything the command line sets; each field's documentation is its `--help` line.
///
/// The list-valued fields spell `Vec` with its full path so that clap takes each list as one
/// comma-separated value rather than as repeated values.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(
    name = "ringccl-perf",
    about = "ringccl-perf: bandwidth of ringccl's collectives next to NCCL's, \
             in the style of nccl-tests.",
    long_about = None,
    after_help = AFTER_HELP,
    args_override_self = true,
    allow_negative_numbers = true
)]
pub struct Options {
    /// Smallest size, bytes with optional K/M/G suffix (1024-based)
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE")]
    #[arg(default_value = "8", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE")]
    #[arg(default_value = "128M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiply the size by N at each step (N >= 2)
    #[arg(short = 'f', long = "stepfactor", value_name = "N")]
    #[arg(default_value = "2", value_parser = parse_count)]
    pub factor: usize,
    /// float|half|bfloat16|double|int8|uint8|int32|uint32|int64|uint64
    /// (also f32, f16, bf16, ...), comma-separated, or all
    #[arg(
        short = 'd',
        long = "datatype",
        value_name = "TYPES",
        verbatim_doc_comment
    )]
    #[arg(default_value = "float", value_parser = parse_dtypes)]
    pub dtypes: ::std::vec::Vec<DataType>,
    /// sum|prod|min|max|avg, comma-separated, or all
    #[arg(short = 'o', long = "op", value_name = "OPS")]
    #[arg(default_value = "sum", value_parser = parse_ops)]
    pub ops: ::std::vec::Vec<RedOp>,
    /// all_reduce|all_gather|reduce_scatter|broadcast|reduce|all_to_all|send_recv,
    /// comma-separated, or all (send_recv: a ring shift, as nccl-tests' sendrecv_perf)
    #[arg(
        short = 't',
        long = "collective",
        value_name = "COLLS",
        verbatim_doc_comment
    )]
    #[arg(default_value = "all_reduce", value_parser = parse_colls)]
    pub colls: ::std::vec::Vec<CollectiveKind>,
    /// Check iterations (0: no check)
    #[arg(short = 'c', long = "check", value_name = "N")]
    #[arg(default_value = "1", value_parser = parse_count)]
    pub check_iters: usize,
    /// Timed iterations
    #[arg(short = 'n', long = "iters", value_name = "N")]
    #[arg(default_value = "20", value_parser = parse_positive)]
    pub iters: usize,
    /// Warm-up iterations
    #[arg(short = 'w', long = "warmup_iters", value_name = "N")]
    #[arg(default_value = "5", value_parser = parse_count)]
    pub warmup: usize,
    /// Capture the -n iterations into a CUDA graph and time replays
    #[arg(short = 'G', long = "cudagraph", value_name = "0|1")]
    #[arg(default_value = "0", value_parser = parse_01, action = ArgAction::Set)]
    pub graph: bool,
    /// Turn cudarc's event tracking off, as a program that orders its streams by hand does
    /// (-G 1 implies it)
    #[arg(long = "untracked")]
    pub untracked: bool,
    /// Register ringccl's buffers with the communicator (Communicator::register, as
    /// ncclCommRegister) before a sweep, allocated with cuMemAlloc (which CUDA IPC can
    /// export, unlike cudarc's stream-ordered pool): point-to-point receives zero-copy,
    /// one-shot reads in place where RINGCCL_ZERO_COPY_READS=1 allows
    #[arg(long = "register")]
    pub register: bool,
    /// Root rank of broadcast and reduce
    #[arg(long, value_name = "R", default_value = "0", value_parser = parse_count)]
    pub root: usize,
    /// Libraries to measure: ringccl|nccl|both
    #[arg(long = "lib", value_name = "L", default_value = "both", value_parser = parse_libs)]
    pub libs: Libs,
    /// Use the first N GPUs [default: all]
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    pub ngpus: Option<usize>,
    /// One process per GPU, started by a launcher (ringccl-run -n N, torchrun): N must equal
    /// WORLD_SIZE. Under a launcher (RANK and WORLD_SIZE set) this mode is on without the flag
    #[arg(long, value_name = "N", value_parser = parse_positive)]
    pub procs: Option<usize>,
    /// Write the results as JSON
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the results as CSV
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Plot busbw against size (first collective and operator, every type)
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// No progress bar on stderr
    #[arg(long = "no-progress", action = ArgAction::SetFalse)]
    pub progress: bool,
}

/// Parses a size: digits with an optional K, M or G suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (digits with an optional K, M or G)"))?;
    v.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Parses a data-type name as nccl-tests spells it (or the Rust name).
pub fn parse_dtype(s: &str) -> Option<DataType> {
    Some(match s.to_ascii_lowercase().as_str() {
        "int8" | "char" | "i8" => DataType::I8,
        "uint8" | "u8" => DataType::U8,
        "int32" | "int" | "i32" => DataType::I32,
        "uint32" | "u32" => DataType::U32,
        "int64" | "i64" => DataType::I64,
        "uint64" | "u64" => DataType::U64,
        "half" | "float16" | "f16" => DataType::F16,
        "float" | "float32" | "f32" => DataType::F32,
        "double" | "float64" | "f64" => DataType::F64,
        "bfloat16" | "bf16" => DataType::BF16,
        _ => return None,
    })
}

/// nccl-tests' name of a data type.
pub fn nccl_dtype_name(d: DataType) -> &'static str {
    match d {
        DataType::I8 => "int8",
        DataType::U8 => "uint8",
        DataType::I32 => "int32",
        DataType::U32 => "uint32",
        DataType::I64 => "int64",
        DataType::U64 => "uint64",
        DataType::F16 => "half",
        DataType::F32 => "float",
        DataType::F64 => "double",
        DataType::BF16 => "bfloat16",
        DataType::F8E4M3 => "f8e4m3",
        DataType::F8E5M2 => "f8e5m2",
    }
}

/// Parses a reduction-operator name.
pub fn parse_op(s: &str) -> Option<RedOp> {
    Some(match s.to_ascii_lowercase().as_str() {
        "sum" => RedOp::Sum,
        "prod" => RedOp::Prod,
        "min" => RedOp::Min,
        "max" => RedOp::Max,
        "avg" => RedOp::Avg,
        _ => return None,
    })
}

/// `-G`'s value: `0` or `1`.
fn parse_01(s: &str) -> Result<bool, String> {
    match s.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("takes 0 or 1".into()),
    }
}

/// A non-negative integer.
fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| "not a non-negative integer".to_string())
}

/// An integer of at least 1.
fn parse_positive(s: &str) -> Result<usize, String> {
    match parse_count(s)? {
        0 => Err("must be at least 1".into()),
        v => Ok(v),
    }
}

/// A comma-separated list, or `all`, without repeats (first occurrence kept).
fn parse_list<T: Copy + PartialEq>(
    s: &str,
    what: &str,
    all: &[T],
    one: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let items = if part.eq_ignore_ascii_case("all") {
            all.to_vec()
        } else {
            vec![one(part)?]
        };
        for x in items {
            if !out.contains(&x) {
                out.push(x);
            }
        }
    }
    if out.is_empty() {
        return Err(format!("no {what} given"));
    }
    Ok(out)
}

/// The data types this tool measures (`all`): every `DataType` but the fp8 ones, whose data
/// patterns it does not write.
pub const MEASURED_DTYPES: [DataType; 10] = [
    DataType::F32,
    DataType::F64,
    DataType::F16,
    DataType::BF16,
    DataType::I8,
    DataType::U8,
    DataType::I32,
    DataType::U32,
    DataType::I64,
    DataType::U64,
];

fn parse_dtypes(s: &str) -> Result<Vec<DataType>, String> {
    parse_list(s, "data type", &MEASURED_DTYPES, |p| {
        parse_dtype(p).ok_or_else(|| format!("unknown data type {p:?}"))
    })
}

fn parse_ops(s: &str) -> Result<Vec<RedOp>, String> {
    parse_list(s, "operator", &RedOp::ALL, |p| {
        parse_op(p).ok_or_else(|| format!("unknown operator {p:?}"))
    })
}

fn parse_colls(s: &str) -> Result<Vec<CollectiveKind>, String> {
    parse_list(s, "collective", &coll::MEASURED, coll::parse)
}

/// `--lib`'s value.
fn parse_libs(s: &str) -> Result<Libs, String> {
    let (ringccl, nccl) = match s.trim().to_ascii_lowercase().as_str() {
        "ringccl" => (true, false),
        "nccl" => (false, true),
        "both" => (true, true),
        _ => return Err("takes ringccl, nccl or both".into()),
    };
    Ok(Libs { ringccl, nccl })
}

/// The sizes of a sweep: `min`, `min * factor`, ... up to `max` inclusive.
pub fn sizes(o: &Options) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = o.min_bytes;
    while s <= o.max_bytes {
        out.push(s);
        if o.factor < 2 || s == 0 {
            break;
        }
        match s.checked_mul(o.factor) {
            Some(t) => s = t,
            None => break,
        }
    }
    out
}

/// Parses the arguments (without the program name). `--help` and every bad argument come
/// back as a [`clap::Error`]: [`clap::Error::exit`] prints it (help on stdout, errors on
/// stderr) and exits with status 0 for help, 2 for errors.
pub fn parse<I, T>(args: I) -> Result<Options, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv =
        std::iter::once(OsString::from("ringccl-perf")).chain(args.into_iter().map(Into::into));
    let o = Options::try_parse_from(argv)?;
    let invalid = |msg: String| Options::command().error(ErrorKind::ValueValidation, msg);
    if o.min_bytes == 0 {
        return Err(invalid("-b must be at least 1 byte".into()));
    }
    if o.min_bytes > o.max_bytes {
        return Err(invalid(format!(
            "-b ({}) is larger than -e ({})",
            o.min_bytes, o.max_bytes
        )));
    }
    if o.factor < 2 && o.min_bytes != o.max_bytes {
        return Err(invalid(
            "-f must be at least 2 (or give -b equal to -e)".into(),
        ));
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Options {
        match parse(args) {
            Ok(o) => o,
            Err(e) => panic!("{args:?} gave {e}"),
        }
    }

    /// The error message for `args` (which must fail).
    fn error(args: &[&str]) -> String {
        match parse(args) {
            Ok(o) => panic!("{args:?} should fail, gave {o:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("128M"), Ok(128 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("1T").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn type_and_op_names() {
        for (name, d) in [
            ("float", DataType::F32),
            ("half", DataType::F16),
            ("bfloat16", DataType::BF16),
            ("double", DataType::F64),
            ("int32", DataType::I32),
            ("int", DataType::I32),
            ("uint8", DataType::U8),
            ("char", DataType::I8),
            ("int64", DataType::I64),
            ("uint64", DataType::U64),
            ("uint32", DataType::U32),
            ("f16", DataType::F16),
        ] {
            assert_eq!(parse_dtype(name), Some(d), "{name}");
        }
        assert_eq!(parse_dtype("fp8"), None);
        for d in MEASURED_DTYPES {
            assert_eq!(parse_dtype(nccl_dtype_name(d)), Some(d));
            assert_eq!(parse_dtype(d.name()), Some(d));
        }
        for op in RedOp::ALL {
            assert_eq!(parse_op(op.name()), Some(op));
        }
        assert_eq!(parse_op("premulsum"), None);
    }

    #[test]
    fn defaults() {
        let o = run(&[]);
        assert_eq!((o.min_bytes, o.max_bytes, o.factor), (8, 128 << 20, 2));
        assert_eq!(o.dtypes, vec![DataType::F32]);
        assert_eq!(o.ops, vec![RedOp::Sum]);
        assert_eq!(o.colls, vec![CollectiveKind::AllReduce]);
        assert_eq!((o.iters, o.warmup, o.check_iters, o.root), (20, 5, 1, 0));
        assert!(o.libs.ringccl && o.libs.nccl && !o.graph && o.progress);
        assert_eq!((o.json, o.csv, o.svg, o.ngpus), (None, None, None, None));
        assert_eq!(o.procs, None);
    }

    #[test]
    fn full_command_line() {
        let o = run(&[
            "-b",
            "8",
            "-e",
            "1G",
            "-f",
            "4",
            "-d",
            "all",
            "-o",
            "sum,max",
            "-c",
            "3",
            "-n",
            "7",
            "-w",
            "2",
            "-G",
            "1",
            "-t",
            "all",
            "--root",
            "1",
            "--lib",
            "nccl",
            "--json=r.json",
            "--csv",
            "r.csv",
            "--svg",
            "r.svg",
            "--no-progress",
            "--ngpus",
            "2",
        ]);
        assert_eq!((o.min_bytes, o.max_bytes, o.factor), (8, 1 << 30, 4));
        assert_eq!(o.dtypes, MEASURED_DTYPES.to_vec());
        assert_eq!(o.ops, vec![RedOp::Sum, RedOp::Max]);
        assert_eq!((o.check_iters, o.iters, o.warmup, o.graph), (3, 7, 2, true));
        assert_eq!(o.colls, coll::MEASURED.to_vec());
        assert_eq!(o.root, 1);
        assert_eq!(
            o.libs,
            Libs {
                ringccl: false,
                nccl: true
            }
        );
        assert_eq!(o.json, Some(PathBuf::from("r.json")));
        assert_eq!(o.csv, Some(PathBuf::from("r.csv")));
        assert_eq!(o.svg, Some(PathBuf::from("r.svg")));
        assert!(!o.progress);
        assert_eq!(o.ngpus, Some(2));
        let o = run(&[
            "-o",
            "all",
            "-d",
            "half,bfloat16,half",
            "-t",
            "reduce_scatter,bcast",
        ]);
        assert_eq!(o.ops, RedOp::ALL.to_vec());
        assert_eq!(o.dtypes, vec![DataType::F16, DataType::BF16]);
        assert_eq!(
            o.colls,
            vec![CollectiveKind::ReduceScatter, CollectiveKind::Broadcast]
        );
    }

    #[test]
    fn help_and_errors() {
        Options::command().debug_assert();
        for args in [&["--help"][..], &["-n", "3", "-h"]] {
            let e = parse(args).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{args:?}");
        }
        let help = Options::command().render_help().to_string();
        for flag in [
            "-b, --minbytes <SIZE>",
            "-e, --maxbytes <SIZE>",
            "-f, --stepfactor <N>",
            "-d, --datatype <TYPES>",
            "-o, --op <OPS>",
            "-t, --collective <COLLS>",
            "-c, --check <N>",
            "-n, --iters <N>",
            "-w, --warmup_iters <N>",
            "-G, --cudagraph <0|1>",
            "--root <R>",
            "--lib <L>",
            "--ngpus <N>",
            "--procs <N>",
            "--json <FILE>",
            "--csv <FILE>",
            "--svg <FILE>",
            "--no-progress",
            "-h, --help",
            "[default: 128M]",
            "busbw = algbw",
        ] {
            assert!(help.contains(flag), "{flag} missing from\n{help}");
        }
        // Each bad value is an error naming its flag (and the offending value).
        for (bad, needles) in [
            (&["-b"][..], &["--minbytes"][..]),
            (&["-x"], &["-x"]),
            (&["-b", "1T"], &["--minbytes", "1T"]),
            (&["-b", "-1"], &["--minbytes", "-1"]),
            (&["-n", "-3"], &["--iters", "-3"]),
            (&["-d", "fp8"], &["--datatype", "fp8"]),
            (&["-d", ","], &["--datatype", "no data type"]),
            (&["-o", "premulsum"], &["--op", "premulsum"]),
            (&["-t", "gather_all"], &["--collective", "gather_all"]),
            (
                &["-t", "gather"],
                &["--collective", "does not measure gather"],
            ),
            (&["-G", "2"], &["--cudagraph", "2"]),
            (&["--lib", "mpi"], &["--lib", "mpi"]),
            (
                &["-b", "1M", "-e", "1K"],
                &["-b (1048576) is larger than -e (1024)"],
            ),
            (&["-n", "0"], &["--iters", "at least 1"]),
            (&["-f", "1"], &["-f must be at least 2"]),
            (&["-b", "0"], &["-b must be at least 1 byte"]),
            (&["--ngpus", "0"], &["--ngpus", "at least 1"]),
            (&["--procs", "0"], &["--procs", "at least 1"]),
            (&["--procs", "two"], &["--procs", "two"]),
            (&["--no-progress=1"], &["--no-progress"]),
            (&["-c", "x"], &["--check", "x"]),
        ] {
            let e = error(bad);
            for needle in needles {
                assert!(e.contains(needle), "{bad:?}: {needle:?} not in {e:?}");
            }
        }
        assert!(parse(["-f", "1", "-b", "64", "-e", "64"]).is_ok());
        // The last of a repeated option wins; `--name=value` and `-xvalue` work too.
        let o = run(&[
            "-n",
            "3",
            "-n",
            "4",
            "--minbytes=1K",
            "-e64K",
            "--lib",
            "RingCCL",
        ]);
        assert_eq!((o.iters, o.min_bytes, o.max_bytes), (4, 1024, 64 << 10));
        assert_eq!(
            o.libs,
            Libs {
                ringccl: true,
                nccl: false
            }
        );
    }

    #[test]
    fn documented_command_lines() {
        // As scripts/gpu-run.sh and the perf README run the tool.
        let o = run(&[
            "-t",
            "all_reduce",
            "-d",
            "float,bfloat16",
            "-b",
            "8",
            "-e",
            "1G",
            "-f",
            "4",
            "-n",
            "20",
            "-w",
            "5",
            "--no-progress",
            "--json",
            "out/perf-all_reduce.json",
            "--csv",
            "out/perf-all_reduce.csv",
            "--svg",
            "out/perf-all_reduce.svg",
        ]);
        assert_eq!(o.dtypes, vec![DataType::F32, DataType::BF16]);
        assert_eq!((o.min_bytes, o.max_bytes, o.factor), (8, 1 << 30, 4));
        assert!(!o.progress && o.svg.is_some() && o.csv.is_some() && o.json.is_some());
        let o = run(&[
            "-t",
            "all_reduce",
            "-d",
            "float",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "2",
            "-n",
            "20",
            "-w",
            "5",
            "-G",
            "1",
            "--no-progress",
        ]);
        assert!(o.graph && o.max_bytes == 64 << 10);
        let o = run(&[
            "-t",
            "all_gather,reduce_scatter,broadcast,reduce,all_to_all",
            "-d",
            "float",
            "-b",
            "1K",
            "-e",
            "1G",
            "-f",
            "4",
            "-n",
            "10",
            "-w",
            "3",
        ]);
        assert_eq!(o.colls, coll::MEASURED[1..6].to_vec());
        let o = run(&["-b", "64M", "-e", "1G", "--lib", "ringccl", "--no-progress"]);
        assert!(o.libs.ringccl && !o.libs.nccl);
    }

    #[test]
    fn sweep_sizes() {
        let o = run(&["-b", "8", "-e", "128", "-f", "2"]);
        assert_eq!(sizes(&o), vec![8, 16, 32, 64, 128]);
        let o = run(&["-b", "1K", "-e", "10K", "-f", "3"]);
        assert_eq!(sizes(&o), vec![1024, 3072, 9216]);
        let o = run(&["-b", "64", "-e", "64", "-f", "1"]);
        assert_eq!(sizes(&o), vec![64]);
    }
}
