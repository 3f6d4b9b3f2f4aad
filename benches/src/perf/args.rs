//! The command line, parsed by hand (nccl-tests' short options plus a few long ones).

use std::path::PathBuf;

use ringccl::{CollectiveKind, DataType, RedOp};

use super::coll;

/// Which libraries to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Libs {
    pub ringccl: bool,
    pub nccl: bool,
}

/// Everything the command line sets.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub factor: usize,
    pub dtypes: Vec<DataType>,
    pub ops: Vec<RedOp>,
    pub check_iters: usize,
    pub iters: usize,
    pub warmup: usize,
    pub graph: bool,
    pub colls: Vec<CollectiveKind>,
    pub root: usize,
    pub libs: Libs,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub svg: Option<PathBuf>,
    pub progress: bool,
    pub ngpus: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            min_bytes: 8,
            max_bytes: 128 << 20,
            factor: 2,
            dtypes: vec![DataType::F32],
            ops: vec![RedOp::Sum],
            check_iters: 1,
            iters: 20,
            warmup: 5,
            graph: false,
            colls: vec![CollectiveKind::AllReduce],
            root: 0,
            libs: Libs {
                ringccl: true,
                nccl: true,
            },
            json: None,
            csv: None,
            svg: None,
            progress: true,
            ngpus: None,
        }
    }
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Run(Box<Options>),
    Help,
}

/// The `--help` text.
pub const USAGE: &str = "\
ringccl-perf: bandwidth of ringccl's collectives next to NCCL's, in the style of nccl-tests.

USAGE: ringccl-perf [OPTIONS]

  -b, --minbytes SIZE      smallest size, bytes with optional K/M/G suffix (1024-based) [8]
  -e, --maxbytes SIZE      largest size [128M]
  -f, --stepfactor N       multiply the size by N at each step (N >= 2) [2]
  -d, --datatype TYPES     float|half|bfloat16|double|int8|uint8|int32|uint32|int64|uint64
                           (also f32, f16, bf16, ..., comma-separated lists, or all) [float]
  -o, --op OPS             sum|prod|min|max|avg, comma-separated, or all [sum]
  -t, --collective COLLS   all_reduce|all_gather|reduce_scatter|broadcast|reduce|all_to_all,
                           comma-separated, or all [all_reduce]
  -c, --check N            check iterations (0: no check) [1]
  -n, --iters N            timed iterations [20]
  -w, --warmup_iters N     warm-up iterations [5]
  -G, --cudagraph 0|1      capture the -n iterations into a CUDA graph and time replays [0]
      --root R             root rank of broadcast and reduce [0]
      --lib L              ringccl|nccl|both [both]
      --ngpus N            use the first N GPUs [all]
      --json FILE          write the results as JSON
      --csv FILE           write the results as CSV
      --svg FILE           plot busbw against size (first collective and type)
      --no-progress        no progress line on stderr
  -h, --help               this text

Time is the median over the -n iterations of the slowest rank's time (CUDA events on every
rank's stream). algbw = size / time; busbw = algbw x the collective's factor (nccl-tests'
PERFORMANCE.md). #wrong counts the elements that differ from the exactly computed expected
values over the -c check iterations (outputs poisoned before each). Exit status 1 on any
wrong element or error.";

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

/// A comma-separated list, or `all`.
fn parse_list<T: Copy + PartialEq>(
    s: &str,
    what: &str,
    all: &[T],
    one: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("all") {
            for &x in all {
                if !out.contains(&x) {
                    out.push(x);
                }
            }
            continue;
        }
        let x = one(part).ok_or_else(|| format!("unknown {what} {part:?}"))?;
        if !out.contains(&x) {
            out.push(x);
        }
    }
    if out.is_empty() {
        return Err(format!("no {what} given"));
    }
    Ok(out)
}

fn parse_num(s: &str, what: &str) -> Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{what}: {s:?} is not a non-negative integer"))
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

/// Parses the arguments (without the program name).
pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<Command, String> {
    let mut o = Options::default();
    let mut it = args.iter().map(|a| a.as_ref().to_string());
    while let Some(arg) = it.next() {
        // `--name=value` or `--name value`, `-x value`.
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let flag = |o: &mut Options, name: &str| -> Result<bool, String> {
            match name {
                "--no-progress" => o.progress = false,
                "-h" | "--help" => return Err(String::new()),
                _ => return Ok(false),
            }
            Ok(true)
        };
        match flag(&mut o, &name) {
            Ok(true) => {
                if inline.is_some() {
                    return Err(format!("{name} takes no value"));
                }
                continue;
            }
            Ok(false) => {}
            Err(_) => return Ok(Command::Help),
        }
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().ok_or_else(|| format!("{name} needs a value")),
            }
        };
        match name.as_str() {
            "-b" | "--minbytes" => o.min_bytes = parse_size(&value()?)?,
            "-e" | "--maxbytes" => o.max_bytes = parse_size(&value()?)?,
            "-f" | "--stepfactor" => o.factor = parse_num(&value()?, "-f")?,
            "-d" | "--datatype" => {
                o.dtypes = parse_list(&value()?, "data type", &DataType::ALL, parse_dtype)?
            }
            "-o" | "--op" => o.ops = parse_list(&value()?, "operator", &RedOp::ALL, parse_op)?,
            "-t" | "--collective" => {
                o.colls = parse_list(&value()?, "collective", &coll::MEASURED, |s| {
                    coll::parse(s).ok()
                })?
            }
            "-c" | "--check" => o.check_iters = parse_num(&value()?, "-c")?,
            "-n" | "--iters" => o.iters = parse_num(&value()?, "-n")?,
            "-w" | "--warmup_iters" => o.warmup = parse_num(&value()?, "-w")?,
            "-G" | "--cudagraph" => {
                o.graph = match value()?.trim() {
                    "0" => false,
                    "1" => true,
                    v => return Err(format!("-G takes 0 or 1, not {v:?}")),
                }
            }
            "--root" => o.root = parse_num(&value()?, "--root")?,
            "--lib" => {
                o.libs = match value()?.to_ascii_lowercase().as_str() {
                    "ringccl" => Libs {
                        ringccl: true,
                        nccl: false,
                    },
                    "nccl" => Libs {
                        ringccl: false,
                        nccl: true,
                    },
                    "both" => Libs {
                        ringccl: true,
                        nccl: true,
                    },
                    v => return Err(format!("--lib takes ringccl, nccl or both, not {v:?}")),
                }
            }
            "--ngpus" => {
                let n = parse_num(&value()?, "--ngpus")?;
                if n == 0 {
                    return Err("--ngpus must be at least 1".into());
                }
                o.ngpus = Some(n);
            }
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--csv" => o.csv = Some(PathBuf::from(value()?)),
            "--svg" => o.svg = Some(PathBuf::from(value()?)),
            _ => return Err(format!("unknown option {name:?}")),
        }
    }
    if o.min_bytes == 0 {
        return Err("-b must be at least 1 byte".into());
    }
    if o.min_bytes > o.max_bytes {
        return Err(format!(
            "-b ({}) is larger than -e ({})",
            o.min_bytes, o.max_bytes
        ));
    }
    if o.factor < 2 && o.min_bytes != o.max_bytes {
        return Err("-f must be at least 2 (or give -b equal to -e)".into());
    }
    if o.iters == 0 {
        return Err("-n must be at least 1".into());
    }
    Ok(Command::Run(Box::new(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Options {
        match parse(args) {
            Ok(Command::Run(o)) => *o,
            other => panic!("{args:?} gave {other:?}"),
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
        for d in DataType::ALL {
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
        assert_eq!(o, Options::default());
        assert_eq!((o.iters, o.warmup, o.check_iters), (20, 5, 1));
        assert!(o.libs.ringccl && o.libs.nccl && !o.graph && o.progress);
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
        assert_eq!(o.dtypes, DataType::ALL.to_vec());
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
        assert_eq!(parse(&["--help"]), Ok(Command::Help));
        assert_eq!(parse(&["-n", "3", "-h"]), Ok(Command::Help));
        for bad in [
            &["-b"][..],
            &["-x"],
            &["-d", "fp8"],
            &["-o", "premulsum"],
            &["-t", "gather_all"],
            &["-t", "gather"],
            &["-G", "2"],
            &["--lib", "mpi"],
            &["-b", "1M", "-e", "1K"],
            &["-n", "0"],
            &["-f", "1"],
            &["-b", "0"],
            &["--ngpus", "0"],
            &["--no-progress=1"],
            &["-c", "x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should fail");
        }
        assert!(parse(&["-f", "1", "-b", "64", "-e", "64"]).is_ok());
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
