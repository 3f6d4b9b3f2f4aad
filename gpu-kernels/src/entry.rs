//! The names and shapes of the PTX entry points, for the host and the build driver.
//!
//! The kernels themselves exist only in the nvptx64 build; this table mirrors them (a test checks
//! it against the kernel source, and `cargo xtask build-ptx` against the PTX).
//!
//! Parameters, in order (pointers are device addresses, `u64`):
//! * [`EntryKind::Copy`]: `src, dst0, dst1 (0 = none), count: u64`
//! * [`EntryKind::Reduce`]: `s0..s7 (unused = 0), nsrc: u32, dst, count: u64, postdiv: u32`
//! * [`EntryKind::ReduceCopy`]: `a, b, dst0, dst1 (0 = none), count: u64, postdiv: u32`
//!
//! `postdiv` is the rank count in the step that writes an `avg` result, else 1.

use crate::op::RedOp;

/// Which primitive an entry point runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// One source to one or two destinations.
    Copy,
    /// Two to eight sources folded into one destination.
    Reduce,
    /// Two sources folded, written to one or two destinations.
    ReduceCopy,
}

/// One PTX entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    /// The symbol in the PTX.
    pub name: &'static str,
    /// The primitive.
    pub kind: EntryKind,
    /// Element type name ([`crate::element::Element::NAME`]).
    pub dtype: &'static str,
    /// The operator; `None` for copies.
    pub op: Option<RedOp>,
}

const fn ep(name: &'static str, kind: EntryKind, dtype: &'static str, op: Option<RedOp>) -> EntryPoint {
    EntryPoint { name, kind, dtype, op }
}

/// Every entry point in the PTX, copies first.
///
/// ```
/// use gpu_kernels::{entry::find_entry, EntryKind, ENTRY_POINTS};
/// use gpu_kernels::op::RedOp;
/// assert_eq!(ENTRY_POINTS.len(), 110);
/// let e = find_entry(EntryKind::ReduceCopy, "bf16", Some(RedOp::Sum)).unwrap();
/// assert_eq!(e.name, "ringccl_reduce_copy_sum_bf16");
/// ```
pub const ENTRY_POINTS: &[EntryPoint] = &[
    ep("ringccl_copy_f32", EntryKind::Copy, "f32", None),
    ep("ringccl_copy_f64", EntryKind::Copy, "f64", None),
    ep("ringccl_copy_f16", EntryKind::Copy, "f16", None),
    ep("ringccl_copy_bf16", EntryKind::Copy, "bf16", None),
    ep("ringccl_copy_i8", EntryKind::Copy, "i8", None),
    ep("ringccl_copy_u8", EntryKind::Copy, "u8", None),
    ep("ringccl_copy_i32", EntryKind::Copy, "i32", None),
    ep("ringccl_copy_u32", EntryKind::Copy, "u32", None),
    ep("ringccl_copy_i64", EntryKind::Copy, "i64", None),
    ep("ringccl_copy_u64", EntryKind::Copy, "u64", None),
    ep("ringccl_reduce_sum_f32", EntryKind::Reduce, "f32", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_f32", EntryKind::Reduce, "f32", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_f32", EntryKind::Reduce, "f32", Some(RedOp::Min)),
    ep("ringccl_reduce_max_f32", EntryKind::Reduce, "f32", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_f32", EntryKind::Reduce, "f32", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_f64", EntryKind::Reduce, "f64", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_f64", EntryKind::Reduce, "f64", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_f64", EntryKind::Reduce, "f64", Some(RedOp::Min)),
    ep("ringccl_reduce_max_f64", EntryKind::Reduce, "f64", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_f64", EntryKind::Reduce, "f64", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_f16", EntryKind::Reduce, "f16", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_f16", EntryKind::Reduce, "f16", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_f16", EntryKind::Reduce, "f16", Some(RedOp::Min)),
    ep("ringccl_reduce_max_f16", EntryKind::Reduce, "f16", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_f16", EntryKind::Reduce, "f16", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_bf16", EntryKind::Reduce, "bf16", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_bf16", EntryKind::Reduce, "bf16", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_bf16", EntryKind::Reduce, "bf16", Some(RedOp::Min)),
    ep("ringccl_reduce_max_bf16", EntryKind::Reduce, "bf16", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_bf16", EntryKind::Reduce, "bf16", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_i8", EntryKind::Reduce, "i8", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_i8", EntryKind::Reduce, "i8", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_i8", EntryKind::Reduce, "i8", Some(RedOp::Min)),
    ep("ringccl_reduce_max_i8", EntryKind::Reduce, "i8", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_i8", EntryKind::Reduce, "i8", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_u8", EntryKind::Reduce, "u8", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_u8", EntryKind::Reduce, "u8", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_u8", EntryKind::Reduce, "u8", Some(RedOp::Min)),
    ep("ringccl_reduce_max_u8", EntryKind::Reduce, "u8", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_u8", EntryKind::Reduce, "u8", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_i32", EntryKind::Reduce, "i32", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_i32", EntryKind::Reduce, "i32", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_i32", EntryKind::Reduce, "i32", Some(RedOp::Min)),
    ep("ringccl_reduce_max_i32", EntryKind::Reduce, "i32", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_i32", EntryKind::Reduce, "i32", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_u32", EntryKind::Reduce, "u32", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_u32", EntryKind::Reduce, "u32", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_u32", EntryKind::Reduce, "u32", Some(RedOp::Min)),
    ep("ringccl_reduce_max_u32", EntryKind::Reduce, "u32", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_u32", EntryKind::Reduce, "u32", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_i64", EntryKind::Reduce, "i64", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_i64", EntryKind::Reduce, "i64", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_i64", EntryKind::Reduce, "i64", Some(RedOp::Min)),
    ep("ringccl_reduce_max_i64", EntryKind::Reduce, "i64", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_i64", EntryKind::Reduce, "i64", Some(RedOp::Avg)),
    ep("ringccl_reduce_sum_u64", EntryKind::Reduce, "u64", Some(RedOp::Sum)),
    ep("ringccl_reduce_prod_u64", EntryKind::Reduce, "u64", Some(RedOp::Prod)),
    ep("ringccl_reduce_min_u64", EntryKind::Reduce, "u64", Some(RedOp::Min)),
    ep("ringccl_reduce_max_u64", EntryKind::Reduce, "u64", Some(RedOp::Max)),
    ep("ringccl_reduce_avg_u64", EntryKind::Reduce, "u64", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_f32", EntryKind::ReduceCopy, "f32", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_f32", EntryKind::ReduceCopy, "f32", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_f32", EntryKind::ReduceCopy, "f32", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_f32", EntryKind::ReduceCopy, "f32", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_f32", EntryKind::ReduceCopy, "f32", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_f64", EntryKind::ReduceCopy, "f64", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_f64", EntryKind::ReduceCopy, "f64", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_f64", EntryKind::ReduceCopy, "f64", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_f64", EntryKind::ReduceCopy, "f64", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_f64", EntryKind::ReduceCopy, "f64", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_f16", EntryKind::ReduceCopy, "f16", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_f16", EntryKind::ReduceCopy, "f16", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_f16", EntryKind::ReduceCopy, "f16", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_f16", EntryKind::ReduceCopy, "f16", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_f16", EntryKind::ReduceCopy, "f16", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_bf16", EntryKind::ReduceCopy, "bf16", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_bf16", EntryKind::ReduceCopy, "bf16", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_bf16", EntryKind::ReduceCopy, "bf16", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_bf16", EntryKind::ReduceCopy, "bf16", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_bf16", EntryKind::ReduceCopy, "bf16", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_i8", EntryKind::ReduceCopy, "i8", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_i8", EntryKind::ReduceCopy, "i8", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_i8", EntryKind::ReduceCopy, "i8", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_i8", EntryKind::ReduceCopy, "i8", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_i8", EntryKind::ReduceCopy, "i8", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_u8", EntryKind::ReduceCopy, "u8", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_u8", EntryKind::ReduceCopy, "u8", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_u8", EntryKind::ReduceCopy, "u8", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_u8", EntryKind::ReduceCopy, "u8", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_u8", EntryKind::ReduceCopy, "u8", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_i32", EntryKind::ReduceCopy, "i32", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_i32", EntryKind::ReduceCopy, "i32", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_i32", EntryKind::ReduceCopy, "i32", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_i32", EntryKind::ReduceCopy, "i32", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_i32", EntryKind::ReduceCopy, "i32", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_u32", EntryKind::ReduceCopy, "u32", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_u32", EntryKind::ReduceCopy, "u32", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_u32", EntryKind::ReduceCopy, "u32", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_u32", EntryKind::ReduceCopy, "u32", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_u32", EntryKind::ReduceCopy, "u32", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_i64", EntryKind::ReduceCopy, "i64", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_i64", EntryKind::ReduceCopy, "i64", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_i64", EntryKind::ReduceCopy, "i64", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_i64", EntryKind::ReduceCopy, "i64", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_i64", EntryKind::ReduceCopy, "i64", Some(RedOp::Avg)),
    ep("ringccl_reduce_copy_sum_u64", EntryKind::ReduceCopy, "u64", Some(RedOp::Sum)),
    ep("ringccl_reduce_copy_prod_u64", EntryKind::ReduceCopy, "u64", Some(RedOp::Prod)),
    ep("ringccl_reduce_copy_min_u64", EntryKind::ReduceCopy, "u64", Some(RedOp::Min)),
    ep("ringccl_reduce_copy_max_u64", EntryKind::ReduceCopy, "u64", Some(RedOp::Max)),
    ep("ringccl_reduce_copy_avg_u64", EntryKind::ReduceCopy, "u64", Some(RedOp::Avg)),
];

/// The entry point for a primitive, element type and operator (`None` for copies).
pub fn find_entry(kind: EntryKind, dtype: &str, op: Option<RedOp>) -> Option<&'static EntryPoint> {
    ENTRY_POINTS
        .iter()
        .find(|e| e.kind == kind && e.dtype == dtype && e.op == op)
}
