//! `ENTRY_POINTS` (the host's mirror) against the `entry_points!` invocation in `kernels.rs`
//! (which exists only in the nvptx64 build, so its source text is parsed here).

use gpu_kernels::entry::{find_entry, EntryPoint};
use gpu_kernels::op::RedOp;
use gpu_kernels::{EntryKind, ENTRY_POINTS};
use std::collections::HashSet;

const KERNELS_RS: &str = include_str!("../src/kernels.rs");

const DTYPES: [&str; 10] = [
    "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64",
];

/// One line of the invocation: `copy ringccl_copy_f32: f32;` or
/// `reduce ringccl_reduce_sum_f16: F16, Sum;`, as an entry.
fn parse_line(line: &str) -> EntryPoint {
    let line = line
        .strip_suffix(';')
        .unwrap_or_else(|| panic!("no ';' in {line:?}"));
    let (head, ty) = line
        .split_once(':')
        .unwrap_or_else(|| panic!("no ':' in {line:?}"));
    let mut head = head.split_whitespace();
    let kind = match head.next() {
        Some("copy") => EntryKind::Copy,
        Some("reduce") => EntryKind::Reduce,
        Some("reduce_copy") => EntryKind::ReduceCopy,
        Some("oneshot") => EntryKind::OneShot,
        other => panic!("unknown kind {other:?} in {line:?}"),
    };
    let name: &'static str = head.next().expect("a name").to_string().leak();
    assert!(head.next().is_none(), "{line:?}");
    let mut ty = ty.split(',').map(str::trim);
    let dtype = match ty.next().expect("a type") {
        "F16" => "f16",
        "Bf16" => "bf16",
        t => DTYPES
            .iter()
            .find(|&&d| d == t)
            .unwrap_or_else(|| panic!("unknown type {t}")),
    };
    let op = ty.next().map(|o| match o {
        "Sum" => RedOp::Sum,
        "Prod" => RedOp::Prod,
        "Min" => RedOp::Min,
        "Max" => RedOp::Max,
        "Avg" => RedOp::Avg,
        o => panic!("unknown op {o}"),
    });
    assert!(ty.next().is_none(), "{line:?}");
    EntryPoint {
        name,
        kind,
        dtype,
        op,
    }
}

/// The entries of the `entry_points! { ... }` invocation, in source order.
fn kernel_source_entries() -> Vec<EntryPoint> {
    let start = KERNELS_RS
        .lines()
        .position(|l| l.trim() == "entry_points! {")
        .expect("the entry_points! invocation");
    let mut out = Vec::new();
    for line in KERNELS_RS.lines().skip(start + 1) {
        let line = line.trim();
        if line == "}" {
            return out;
        }
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        out.push(parse_line(line));
    }
    panic!("unterminated entry_points! invocation");
}

#[test]
fn table_matches_kernel_source() {
    let src = kernel_source_entries();
    assert_eq!(src.len(), 160, "kernels.rs entry count");
    assert_eq!(ENTRY_POINTS.len(), 160, "ENTRY_POINTS count");
    for e in &src {
        let n = ENTRY_POINTS.iter().filter(|t| t.name == e.name).count();
        assert_eq!(n, 1, "{} appears {n} times in ENTRY_POINTS", e.name);
    }
    for t in ENTRY_POINTS {
        let n = src.iter().filter(|e| e.name == t.name).count();
        assert_eq!(n, 1, "{} appears {n} times in kernels.rs", t.name);
    }
    // Same kind, type and operator for each name; same order too.
    assert_eq!(src.as_slice(), ENTRY_POINTS);
}

#[test]
fn names_are_unique_and_systematic() {
    let names: HashSet<&str> = ENTRY_POINTS.iter().map(|e| e.name).collect();
    assert_eq!(names.len(), ENTRY_POINTS.len(), "duplicate names");
    for e in ENTRY_POINTS {
        let want = match (e.kind, e.op) {
            (EntryKind::Copy, None) => format!("ringccl_copy_{}", e.dtype),
            (EntryKind::Reduce, Some(op)) => format!("ringccl_reduce_{}_{}", op.name(), e.dtype),
            (EntryKind::ReduceCopy, Some(op)) => {
                format!("ringccl_reduce_copy_{}_{}", op.name(), e.dtype)
            }
            (EntryKind::OneShot, Some(op)) => {
                format!("ringccl_oneshot_{}_{}", op.name(), e.dtype)
            }
            _ => panic!("{e:?}: copies have no operator, reductions have one"),
        };
        assert_eq!(e.name, want);
        assert!(DTYPES.contains(&e.dtype), "{e:?}");
    }
    // Copies first, as documented.
    let copies = ENTRY_POINTS
        .iter()
        .take_while(|e| e.kind == EntryKind::Copy)
        .count();
    assert_eq!(copies, 10);
}

#[test]
fn find_entry_for_every_kind_type_and_op() {
    for dtype in DTYPES {
        let e = find_entry(EntryKind::Copy, dtype, None).expect("copy entry");
        assert_eq!((e.kind, e.dtype, e.op), (EntryKind::Copy, dtype, None));
        for op in RedOp::ALL {
            assert!(find_entry(EntryKind::Copy, dtype, Some(op)).is_none());
            for kind in [EntryKind::Reduce, EntryKind::ReduceCopy, EntryKind::OneShot] {
                let e = find_entry(kind, dtype, Some(op))
                    .unwrap_or_else(|| panic!("{kind:?} {dtype} {op:?}"));
                assert_eq!((e.kind, e.dtype, e.op), (kind, dtype, Some(op)));
                assert_eq!(ENTRY_POINTS.iter().filter(|t| *t == e).count(), 1);
            }
        }
        for kind in [EntryKind::Reduce, EntryKind::ReduceCopy, EntryKind::OneShot] {
            assert!(find_entry(kind, dtype, None).is_none());
        }
    }
    assert!(find_entry(EntryKind::Copy, "f8", None).is_none());
    assert!(find_entry(EntryKind::Reduce, "F16", Some(RedOp::Sum)).is_none());
    // 10 copies + 10 types x 5 ops x 3 kinds.
    assert_eq!(10 + 10 * 5 * 3, ENTRY_POINTS.len());
}

#[test]
fn oneshot_entries_come_last_one_per_type_and_op() {
    let oneshot: Vec<&EntryPoint> = ENTRY_POINTS
        .iter()
        .filter(|e| e.kind == EntryKind::OneShot)
        .collect();
    assert_eq!(oneshot.len(), 50);
    // They are the table's last 50 rows (appended after the ring primitives).
    assert!(ENTRY_POINTS[ENTRY_POINTS.len() - 50..]
        .iter()
        .all(|e| e.kind == EntryKind::OneShot));
    for dtype in DTYPES {
        for op in RedOp::ALL {
            assert_eq!(
                oneshot
                    .iter()
                    .filter(|e| e.dtype == dtype && e.op == Some(op))
                    .count(),
                1,
                "{dtype} {op:?}"
            );
        }
    }
}
