//! Running `ptxas -v` on the PTX and reading its per-function resource report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_kernels::entry::EntryPoint;

/// What `ptxas -v` reports for one function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub registers: u32,
    pub stack_frame: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// Registers above this refuse 512-thread blocks (65536 registers per block / 512 threads).
pub const REGS_FOR_512_THREADS: u32 = 128;

/// `$PTXAS` if set, else `ptxas` on `PATH`.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("ptxas"))
        .find(|p| p.is_file())
}

/// `ptxas --version`'s last line (e.g. `Build cuda_13.0.r13.0/...`), for the report.
pub fn version(ptxas: &Path) -> String {
    Command::new(ptxas)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.lines()
                .find(|l| l.contains("release"))
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "version unknown".to_string())
}

/// Runs `ptxas -arch=<arch> <flags> -v <ptx> -o <cubin>` and returns its parsed report and the
/// cubin it wrote (also left at `cubin`, for inspection).
pub fn run(
    ptxas: &Path,
    arch: &str,
    flags: &[&str],
    ptx: &Path,
    cubin: &Path,
) -> Result<(BTreeMap<String, Resources>, Vec<u8>), String> {
    let _ = std::fs::remove_file(cubin);
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .args(flags)
        .arg("-v")
        .arg(ptx)
        .arg("-o")
        .arg(cubin)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    if !out.status.success() {
        return Err(format!(
            "`{} -arch={arch} {} -v {}` failed ({}):\n{}",
            ptxas.display(),
            flags.join(" "),
            ptx.display(),
            out.status,
            tail(&text, 40)
        ));
    }
    let bytes =
        std::fs::read(cubin).map_err(|e| format!("cannot read {}: {e}", cubin.display()))?;
    Ok((parse(&text), bytes))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Parses `ptxas -v` output into per-function resources.
///
/// The report is a sequence of blocks like
/// ```text
/// ptxas info    : Compiling entry function 'k' for 'sm_90'
/// ptxas info    : Function properties for k
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 96 registers, used 0 barriers, 380 bytes cmem[0]
/// ```
/// Lines are attributed to the function named by the latest `Compiling … function` or
/// `Function properties for` line.
pub fn parse(text: &str) -> BTreeMap<String, Resources> {
    let mut out: BTreeMap<String, Resources> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let body = line.split_once(" : ").map_or(line, |(_, b)| b).trim();
        if let Some(rest) = body
            .strip_prefix("Compiling entry function ")
            .or_else(|| body.strip_prefix("Compiling function "))
        {
            if let Some(name) = rest.split('\'').nth(1) {
                out.entry(name.to_string()).or_default();
                current = Some(name.to_string());
            }
        } else if let Some(name) = body.strip_prefix("Function properties for ") {
            let name = name.trim().trim_matches('\'');
            out.entry(name.to_string()).or_default();
            current = Some(name.to_string());
        } else if body.contains("bytes stack frame") {
            if let Some(r) = current.as_ref().and_then(|c| out.get_mut(c)) {
                for part in body.split(',') {
                    let n = leading_number(part);
                    if part.contains("stack frame") {
                        r.stack_frame = n;
                    } else if part.contains("spill stores") {
                        r.spill_stores = n;
                    } else if part.contains("spill loads") {
                        r.spill_loads = n;
                    }
                }
            }
        } else if let Some(rest) = body.strip_prefix("Used ") {
            if let Some(r) = current.as_ref().and_then(|c| out.get_mut(c)) {
                if rest
                    .split_whitespace()
                    .nth(1)
                    .is_some_and(|w| w.starts_with("register"))
                {
                    r.registers = leading_number(rest);
                }
            }
        }
    }
    out
}

fn leading_number(s: &str) -> u32 {
    let s = s.trim_start();
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s[..end].parse().unwrap_or(0)
}

/// The one exception to "no stack frame": fp8 kernels. Their lanes (16 per 16-byte vector)
/// each need a conversion to and from binary16 (in software on sm_80, which has no fp8
/// instructions) or, for min/max, a few selects, and the compiler then keeps a vector's lanes
/// in a small local-memory frame (measured: 160-240 bytes on sm_80, 176 bytes for min/max on
/// sm_90; sum, prod, avg and scale have none on sm_90). Correct, somewhat slower. Spills stay
/// forbidden, and the frame is bounded.
pub const FP8_MAX_STACK: u32 = 256;

fn stack_allowed(e: &EntryPoint) -> u32 {
    use gpu_kernels::DataType;
    if matches!(e.dtype, DataType::F8E4M3 | DataType::F8E5M2) {
        FP8_MAX_STACK
    } else {
        0
    }
}

/// Checks every entry point's report: present, no stack frame (but up to [`FP8_MAX_STACK`]
/// bytes for the fp8 kernels), no spills.
pub fn check(
    arch: &str,
    entries: &[EntryPoint],
    report: &BTreeMap<String, Resources>,
) -> Vec<String> {
    let mut errors = Vec::new();
    for e in entries {
        let allowed = stack_allowed(e);
        match report.get(e.name) {
            None => errors.push(format!("{arch}: ptxas reported nothing for entry `{}`", e.name)),
            Some(r) if allowed > 0 && r.stack_frame <= allowed && r.spill_stores == 0 && r.spill_loads == 0 => {}
            Some(r) if r.stack_frame != 0 || r.spill_stores != 0 || r.spill_loads != 0 => errors.push(format!(
                "{arch}: `{}` has {} bytes stack frame, {} bytes spill stores, {} bytes spill loads (must all be 0)",
                e.name, r.stack_frame, r.spill_stores, r.spill_loads
            )),
            Some(_) => {}
        }
    }
    errors
}

/// [`check`] for one entry point outside the table (the bounded wait kernel).
pub fn check_named(arch: &str, name: &str, report: &BTreeMap<String, Resources>) -> Vec<String> {
    match report.get(name) {
        None => vec![format!("{arch}: ptxas reported nothing for entry `{name}`")],
        Some(r) if r.stack_frame != 0 || r.spill_stores != 0 || r.spill_loads != 0 => vec![format!(
            "{arch}: `{name}` has {} bytes stack frame, {} bytes spill stores, {} bytes spill loads (must all be 0)",
            r.stack_frame, r.spill_stores, r.spill_loads
        )],
        Some(_) => Vec::new(),
    }
}

/// A compact register table: one row per primitive (× operator), one column per element type.
pub fn register_table(
    arch: &str,
    entries: &[EntryPoint],
    report: &BTreeMap<String, Resources>,
) -> String {
    let mut dtypes: Vec<&str> = Vec::new();
    let mut rows: Vec<(String, BTreeMap<&str, String>)> = Vec::new();
    let mut regs: Vec<(u32, &str)> = Vec::new();
    let (mut stack, mut spills) = (0u32, 0u32);
    for e in entries {
        let dtype = e.dtype.name();
        if !dtypes.contains(&dtype) {
            dtypes.push(dtype);
        }
        let kind = e.kind.name();
        let row = match e.op {
            Some(op) => format!("{kind} {}", op.name()),
            None => kind.to_string(),
        };
        let cell = match report.get(e.name) {
            Some(r) => {
                regs.push((r.registers, e.name));
                stack = stack.max(r.stack_frame);
                spills = spills.max(r.spill_stores.max(r.spill_loads));
                r.registers.to_string()
            }
            None => "?".to_string(),
        };
        match rows.iter_mut().find(|(name, _)| *name == row) {
            Some((_, cells)) => {
                cells.insert(dtype, cell);
            }
            None => rows.push((row, BTreeMap::from([(dtype, cell)]))),
        }
    }
    let label_w = rows
        .iter()
        .map(|(r, _)| r.len())
        .max()
        .unwrap_or(0)
        .max(arch.len() + 5);
    let col_w = dtypes.iter().map(|d| d.len()).max().unwrap_or(3).max(3) + 1;
    let mut s = format!("{:<label_w$}", format!("{arch} regs"));
    for d in &dtypes {
        s += &format!("{d:>col_w$}");
    }
    s.push('\n');
    for (row, cells) in &rows {
        s += &format!("{row:<label_w$}");
        for d in &dtypes {
            s += &format!("{:>col_w$}", cells.get(d).map_or("-", String::as_str));
        }
        s.push('\n');
    }
    regs.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    if let (Some(max), Some(min)) = (regs.first(), regs.last()) {
        s += &format!(
            "{} entries: {}..{} registers, max stack frame {stack} bytes, max spill {spills} bytes",
            regs.len(),
            min.0,
            max.0
        );
        let heavy: Vec<&(u32, &str)> = regs.iter().filter(|r| r.0 > REGS_FOR_512_THREADS).collect();
        if !heavy.is_empty() {
            let shown: Vec<String> = heavy
                .iter()
                .take(4)
                .map(|(n, name)| format!("{name} {n}"))
                .collect();
            s += &format!(
                "; {} over {REGS_FOR_512_THREADS} (no 512-thread blocks): {}{}",
                heavy.len(),
                shown.join(", "),
                if heavy.len() > shown.len() {
                    ", ..."
                } else {
                    ""
                }
            );
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_kernels::op::RedOp;
    use gpu_kernels::{DataType, EntryKind};

    const SAMPLE: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'ringccl_copy_f32' for 'sm_90'
ptxas info    : Function properties for ringccl_copy_f32
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers
ptxas info    : Compile time = 12.500 ms
ptxas info    : Compiling entry function 'ringccl_reduce_sum_f32' for 'sm_90'
ptxas info    : Function properties for ringccl_reduce_sum_f32
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 380 bytes cmem[0]
ptxas info    : Function properties for helper
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'ringccl_copy_f64' for 'sm_80'
ptxas info    : Function properties for ringccl_copy_f64
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 130 registers, 400 bytes cmem[0]
";

    use gpu_kernels::entry::EntryPoint as Ep;

    #[test]
    fn parses_registers_stack_and_spills() {
        let r = parse(SAMPLE);
        assert_eq!(r.len(), 4);
        assert_eq!(
            r["ringccl_copy_f32"],
            Resources {
                registers: 24,
                stack_frame: 0,
                spill_stores: 0,
                spill_loads: 0
            }
        );
        assert_eq!(
            r["ringccl_reduce_sum_f32"],
            Resources {
                registers: 255,
                stack_frame: 16,
                spill_stores: 8,
                spill_loads: 4
            }
        );
        assert_eq!(r["helper"], Resources::default());
        assert_eq!(r["ringccl_copy_f64"].registers, 130);
    }

    #[test]
    fn check_flags_stack_spills_and_missing_entries() {
        let r = parse(SAMPLE);
        let entries = [
            Ep::new("ringccl_copy_f32", EntryKind::Copy, DataType::F32, None),
            Ep::new(
                "ringccl_reduce_sum_f32",
                EntryKind::Reduce,
                DataType::F32,
                Some(RedOp::Sum),
            ),
            Ep::new("ringccl_copy_u8", EntryKind::Copy, DataType::U8, None),
        ];
        let errors = check("sm_90", &entries, &r);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].contains("ringccl_reduce_sum_f32")
                && errors[0].contains("16 bytes stack frame")
        );
        assert!(errors[1].contains("ringccl_copy_u8") && errors[1].contains("nothing"));
        assert!(check("sm_90", &entries[..1], &r).is_empty());
    }

    #[test]
    fn only_fp8_kernels_may_have_a_bounded_stack_frame() {
        let res = |stack, spills| Resources {
            registers: 64,
            stack_frame: stack,
            spill_stores: spills,
            spill_loads: 0,
        };
        let fp8 = Ep::new("k", EntryKind::Copy, DataType::F8E4M3, None);
        let other = Ep::new("k", EntryKind::Copy, DataType::U8, None);
        let with = |r: Resources| BTreeMap::from([("k".to_string(), r)]);
        assert!(check("sm_80", &[fp8], &with(res(240, 0))).is_empty());
        assert!(check("sm_90", &[fp8], &with(res(FP8_MAX_STACK, 0))).is_empty());
        assert_eq!(
            check("sm_90", &[fp8], &with(res(FP8_MAX_STACK + 16, 0))).len(),
            1
        );
        assert_eq!(
            check("sm_80", &[fp8], &with(res(240, 8))).len(),
            1,
            "spills never"
        );
        assert_eq!(check("sm_90", &[other], &with(res(16, 0))).len(), 1);
        assert_eq!(check("sm_80", &[other], &with(res(16, 0))).len(), 1);
    }

    #[test]
    fn table_has_one_row_per_primitive_and_op() {
        let r = parse(SAMPLE);
        let entries = [
            Ep::new("ringccl_copy_f32", EntryKind::Copy, DataType::F32, None),
            Ep::new("ringccl_copy_f64", EntryKind::Copy, DataType::F64, None),
            Ep::new(
                "ringccl_reduce_sum_f32",
                EntryKind::Reduce,
                DataType::F32,
                Some(RedOp::Sum),
            ),
        ];
        let t = register_table("sm_90", &entries, &r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["sm_90", "regs", "f32", "f64"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["copy", "24", "130"]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["reduce", "sum", "255", "-"]
        );
        assert!(lines[3].starts_with("3 entries: 24..255 registers"), "{t}");
        assert!(
            lines[3].contains("2 over 128") && lines[3].contains("ringccl_reduce_sum_f32 255"),
            "{t}"
        );
    }
}
