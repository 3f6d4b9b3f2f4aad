//! The PTX entry points: one list, expanded into the kernels and into their table.
//!
//! The `entry_points!` invocation at the end of this file is the only list of entry points. On
//! nvptx64 it expands into the `extern "ptx-kernel"` functions (shells around [`crate::prim`]
//! and [`crate::oneshot`], written in `kernels.rs`); on the host into [`ENTRY_POINTS`], their
//! names and shapes for the host and the build driver (`cargo xtask build-ptx` checks that the
//! PTX holds exactly these names).
//!
//! Every entry point is named `ringccl_{kind}_{type}` (copies, scales) or
//! `ringccl_{kind}_{op}_{type}` ([`EntryKind::name`], [`RedOp::name`], [`DataType::name`]). The
//! table lists the copies (one per type), then each reduction kind (one per type and operator),
//! then the scales (one per type), types in [`DataType::ALL`] order and operators in
//! [`RedOp::ALL`] order, so [`entry_index`] is arithmetic; the build fails if a row is not at
//! its index.
//!
//! Parameters, in order (pointers are device addresses, `u64`):
//! * [`EntryKind::Copy`]: `src, dst0, dst1 (0 = none), count: u64`
//! * [`EntryKind::Reduce`]: `s0..s7 (unused = 0), nsrc: u32, dst, count: u64, postdiv: u32`;
//!   `s0..s7` are the [`MAX_SRCS`] source slots
//! * [`EntryKind::ReduceCopy`]: `a, b, dst0, dst1 (0 = none), count: u64, postdiv: u32`
//! * [`EntryKind::OneShot`]: `s0..s7 (every rank's input in rank order, unused = 0), nsrc: u32
//!   (= nranks), dst, tmp (0 = out of place), count: u64, postdiv: u32, my_flags, f0..f7
//!   (every rank's flag array, unused = 0), rank: u32, ctl (the control block), timeout_ns: u64,
//!   stage (0, or this rank's input, first copied to its `s{rank}`: ranks in other processes),
//!   p0..p7 (0, or where rank `q` reads this rank's input in its process: a registered buffer
//!   read in place; see [`crate::ctl::PUBLISHED`])`;
//!   launch exactly one block per rank (see [`crate::oneshot`]). Both lists have [`MAX_RANKS`]
//!   slots.
//! * [`EntryKind::TwoShot`]: `s0..s7 (every rank's input), nsrc: u32, d0..d7 (every rank's
//!   output), count: u64, postdiv: u32, my_flags, f0..f7 (every rank's two-shot flag region),
//!   rank: u32, ctl, timeout_ns: u64, stage_in, stage_out` (0, or this rank's input, first
//!   copied to its `s{rank}`, and its output, to which `d{rank}` is copied at the end: ranks in
//!   other processes)`, what: u32, root: u32` (ignored: always the all-reduce); every rank
//!   launches the same number of blocks, at most
//!   [`MAX_TWO_SHOT_BLOCKS`](crate::twoshot::MAX_TWO_SHOT_BLOCKS) (see
//!   [`crate::twoshot::two_shot_slice`]).
//! * [`EntryKind::TwoShotColl`]: the same parameters; `what` and `root` choose the collective
//!   run on the two-shot barriers: reduce-scatter, all-gather, all-to-all, broadcast or reduce
//!   (see [`crate::twoshot::what`]).
//! * [`EntryKind::Ll`]: `src, dst, count: u64, postdiv: u32, a0..a7 (every rank's LL area,
//!   unused = 0), nranks: u32, rank: u32, ctl, timeout_ns: u64`; launch
//!   [`crate::ll::ll_blocks`] blocks per rank (see [`crate::ll`]).
//!
//! * [`EntryKind::Scale`]: `src, dst, count: u64, imm_bits: u64, scalar_ptr` (`dst[i] =
//!   src[i] * scalar`; the scalar is `*scalar_ptr`, read by the kernel, or when `scalar_ptr` is
//!   0 the low `8 * size` bits of `imm_bits`; `dst == src` allowed), any grid.
//!
//! One kernel has no element type and is not in the table: the bounded wait
//! [`WAIT_ENTRY`](crate::ctl::WAIT_ENTRY).
//!
//! `postdiv` is the rank count in the step that writes an `avg` result, else 1.
//!
//! [`MAX_SRCS`]: crate::prim::MAX_SRCS
//! [`MAX_RANKS`]: crate::ctl::MAX_RANKS
//! [`DataType::ALL`]: crate::element::DataType::ALL
//! [`DataType::name`]: crate::element::DataType::name

use crate::element::{Bf16, F16, F8E4M3, F8E5M2};
#[cfg(not(target_arch = "nvptx64"))]
use crate::{element::DataType, op::RedOp};

/// Which primitive an entry point runs.
///
/// ```
/// use gpu_kernels::EntryKind;
/// assert_eq!(EntryKind::ReduceCopy.name(), "reduce_copy");
/// assert_eq!(EntryKind::ALL[0], EntryKind::Copy);
/// ```
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// One source to one or two destinations.
    Copy,
    /// Two to [`MAX_SRCS`](crate::prim::MAX_SRCS) sources folded into one destination.
    Reduce,
    /// Two sources folded, written to one or two destinations.
    ReduceCopy,
    /// A whole all-reduce of up to [`MAX_RANKS`](crate::oneshot::MAX_RANKS) ranks in one block
    /// per rank, with a device-side barrier over flags in every rank's memory (see
    /// [`crate::oneshot`]).
    OneShot,
    /// A whole all-reduce in one kernel per rank of many blocks: each rank folds its shard of
    /// every rank's input and writes it into every rank's output, block by block, with a
    /// device-side barrier per block (see [`crate::twoshot::two_shot_slice`]).
    TwoShot,
    /// The two-shot kernel's barriers and staging for the other collectives: reduce-scatter,
    /// all-gather, all-to-all, broadcast and reduce ([`crate::twoshot::what`]). Entry points
    /// of their own, so that the all-reduce's keep its registers.
    TwoShotColl,
    /// The LL push all-reduce (1 to 8 blocks per rank): packets with the flag inside the data
    /// pushed into every peer's LL area, one exchange per call (see [`crate::ll`]).
    Ll,
    /// `dst[i] = src[i] * scalar` ([`crate::prim::scale`]): NCCL's PreMulSum
    /// pre-multiplication. No operator; the last rows of the table.
    Scale,
}

#[cfg(not(target_arch = "nvptx64"))]
impl EntryKind {
    /// Every kind, in table order: the copy (no operator), the reductions, then the scale (no
    /// operator).
    pub const ALL: [EntryKind; 8] = [
        EntryKind::Copy,
        EntryKind::Reduce,
        EntryKind::ReduceCopy,
        EntryKind::OneShot,
        EntryKind::TwoShot,
        EntryKind::TwoShotColl,
        EntryKind::Ll,
        EntryKind::Scale,
    ];

    /// The name used in kernel entry points.
    pub const fn name(self) -> &'static str {
        match self {
            EntryKind::Copy => "copy",
            EntryKind::Reduce => "reduce",
            EntryKind::ReduceCopy => "reduce_copy",
            EntryKind::OneShot => "oneshot",
            EntryKind::TwoShot => "twoshot",
            EntryKind::TwoShotColl => "twoshot_coll",
            EntryKind::Ll => "ll",
            EntryKind::Scale => "scale",
        }
    }
}

/// One PTX entry point.
#[cfg(not(target_arch = "nvptx64"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    /// The symbol in the PTX.
    pub name: &'static str,
    /// The primitive.
    pub kind: EntryKind,
    /// The element type.
    pub dtype: DataType,
    /// The operator; `None` for copies.
    pub op: Option<RedOp>,
}

#[cfg(not(target_arch = "nvptx64"))]
impl EntryPoint {
    /// An entry point description (how [`ENTRY_POINTS`] is written; tests build their own).
    ///
    /// ```
    /// use gpu_kernels::entry::{EntryKind, EntryPoint};
    /// use gpu_kernels::DataType;
    /// let e = EntryPoint::new("ringccl_copy_u8", EntryKind::Copy, DataType::U8, None);
    /// assert_eq!(e.dtype.name(), "u8");
    /// ```
    pub const fn new(
        name: &'static str,
        kind: EntryKind,
        dtype: DataType,
        op: Option<RedOp>,
    ) -> Self {
        EntryPoint {
            name,
            kind,
            dtype,
            op,
        }
    }
}

#[cfg(not(target_arch = "nvptx64"))]
const TYPES: usize = DataType::ALL.len();
#[cfg(not(target_arch = "nvptx64"))]
const OPS: usize = RedOp::ALL.len();
/// Kinds with an operator: every kind but the copy and the scale.
#[cfg(not(target_arch = "nvptx64"))]
const REDUCTIONS: usize = EntryKind::ALL.len() - 2;
/// Where the scale rows start: after the copies and the reductions.
#[cfg(not(target_arch = "nvptx64"))]
const SCALES: usize = TYPES * (1 + REDUCTIONS * OPS);
#[cfg(not(target_arch = "nvptx64"))]
const COUNT: usize = SCALES + TYPES;

/// The index in [`ENTRY_POINTS`] of the entry point for a primitive, element type and operator;
/// `None` for a copy with an operator or a reduction without one. Constant time.
///
/// ```
/// use gpu_kernels::entry::entry_index;
/// use gpu_kernels::op::RedOp;
/// use gpu_kernels::{DataType, EntryKind, ENTRY_POINTS};
/// let i = entry_index(EntryKind::Reduce, DataType::F16, Some(RedOp::Max)).unwrap();
/// assert_eq!(ENTRY_POINTS[i].name, "ringccl_reduce_max_f16");
/// assert_eq!(entry_index(EntryKind::Copy, DataType::F16, Some(RedOp::Max)), None);
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub const fn entry_index(kind: EntryKind, dtype: DataType, op: Option<RedOp>) -> Option<usize> {
    match (kind, op) {
        (EntryKind::Copy, None) => Some(dtype.index()),
        (EntryKind::Scale, None) => Some(SCALES + dtype.index()),
        (EntryKind::Copy | EntryKind::Scale, Some(_)) | (_, None) => None,
        // The reductions are `ALL[1..7]`.
        (kind, Some(op)) => {
            Some(TYPES + ((kind as usize - 1) * TYPES + dtype.index()) * OPS + op.index())
        }
    }
}

/// The entry point for a primitive, element type and operator (`None` for copies); `None` for
/// a combination that has none (see [`entry_index`]).
///
/// ```
/// use gpu_kernels::entry::find_entry;
/// use gpu_kernels::{DataType, EntryKind};
/// assert_eq!(find_entry(EntryKind::Copy, DataType::I64, None).unwrap().name, "ringccl_copy_i64");
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub const fn find_entry(
    kind: EntryKind,
    dtype: DataType,
    op: Option<RedOp>,
) -> Option<&'static EntryPoint> {
    match entry_index(kind, dtype, op) {
        Some(i) if i < ENTRY_POINTS.len() => Some(&ENTRY_POINTS[i]),
        _ => None,
    }
}

/// [`ENTRY_POINTS`] from the rows `entry_points!` writes: the copies, then `[kind][type][op]`,
/// then the scales.
/// Fails the build if a row is not at its [`entry_index`] (a list out of `ALL` order).
#[cfg(not(target_arch = "nvptx64"))]
const fn table(
    copies: [EntryPoint; TYPES],
    reductions: [[[EntryPoint; OPS]; TYPES]; REDUCTIONS],
    scales: [EntryPoint; TYPES],
) -> [EntryPoint; COUNT] {
    let mut out = [copies[0]; COUNT];
    let mut i = 0;
    while i < COUNT {
        let e = if i < TYPES {
            copies[i]
        } else if i >= SCALES {
            scales[i - SCALES]
        } else {
            let r = i - TYPES;
            reductions[r / (TYPES * OPS)][r / OPS % TYPES][r % OPS]
        };
        assert!(
            matches!(entry_index(e.kind, e.dtype, e.op), Some(j) if j == i),
            "the entry point list is not in DataType::ALL / RedOp::ALL / EntryKind::ALL order"
        );
        out[i] = e;
        i += 1;
    }
    out
}

/// Expands the list of entry points (see the module docs): kernels on nvptx64, [`ENTRY_POINTS`]
/// on the host. `types` are element types with their symbol names, `ops` operators (`RedOp`
/// variants, also `crate::op` types) with theirs, `copy` and `reductions` `EntryKind` variants
/// (`crate::kernels::kernel!` has one kernel shape per variant) with theirs.
macro_rules! entry_points {
    (
        types: $types:tt,
        ops: $ops:tt,
        copy: $copy:ident => $copy_name:literal,
        reductions: [$($kind:ident => $kind_name:literal),* $(,)?],
        scale: $scale:ident => $scale_name:literal $(,)?
    ) => {
        #[cfg(target_arch = "nvptx64")]
        entry_points!(@copy_kernels $copy $copy_name $types);
        #[cfg(target_arch = "nvptx64")]
        entry_points!(@copy_kernels $scale $scale_name $types);
        $(
            #[cfg(target_arch = "nvptx64")]
            entry_points!(@kernels $kind $kind_name $types $ops);
        )*

        /// Every entry point in the PTX: the copies, the reductions, then the scales (see the
        /// module docs for the order); [`entry_index`] finds one in constant time.
        ///
        /// ```
        /// use gpu_kernels::{entry::find_entry, DataType, EntryKind, ENTRY_POINTS};
        /// use gpu_kernels::op::RedOp;
        /// assert_eq!(ENTRY_POINTS.len(), 384);
        /// let e = find_entry(EntryKind::ReduceCopy, DataType::BF16, Some(RedOp::Sum)).unwrap();
        /// assert_eq!(e.name, "ringccl_reduce_copy_sum_bf16");
        /// ```
        #[cfg(not(target_arch = "nvptx64"))]
        pub const ENTRY_POINTS: &[EntryPoint] = &table(
            entry_points!(@copy_rows $copy $copy_name $types),
            [$(entry_points!(@rows $kind $kind_name $types $ops)),*],
            entry_points!(@copy_rows $scale $scale_name $types),
        );
    };

    // nvptx64: one kernel per type (copy), per type and operator (reductions).
    (@copy_kernels $kind:ident $kind_name:literal [$($t:ty => $t_name:literal),* $(,)?]) => {
        $(crate::kernels::kernel!($kind, concat!("ringccl_", $kind_name, "_", $t_name), $t);)*
    };
    (@kernels $kind:ident $kind_name:literal [$($t:ty => $t_name:literal),* $(,)?] $ops:tt) => {
        $(entry_points!(@type_kernels $kind $kind_name $t => $t_name, $ops);)*
    };
    (
        @type_kernels $kind:ident $kind_name:literal $t:ty => $t_name:literal,
        [$($op:ident => $op_name:literal),* $(,)?]
    ) => {
        $(crate::kernels::kernel!(
            $kind,
            concat!("ringccl_", $kind_name, "_", $op_name, "_", $t_name),
            $t,
            crate::op::$op
        );)*
    };

    // Host: the rows of the table, `[type]` (copy) and `[type][op]` (each reduction).
    (@copy_rows $kind:ident $kind_name:literal [$($t:ty => $t_name:literal),* $(,)?]) => {
        [$(EntryPoint::new(
            concat!("ringccl_", $kind_name, "_", $t_name),
            EntryKind::$kind,
            <$t as crate::element::Element>::DTYPE,
            None,
        )),*]
    };
    (@rows $kind:ident $kind_name:literal [$($t:ty => $t_name:literal),* $(,)?] $ops:tt) => {
        [$(entry_points!(@type_rows $kind $kind_name $t => $t_name, $ops)),*]
    };
    (
        @type_rows $kind:ident $kind_name:literal $t:ty => $t_name:literal,
        [$($op:ident => $op_name:literal),* $(,)?]
    ) => {
        [$(EntryPoint::new(
            concat!("ringccl_", $kind_name, "_", $op_name, "_", $t_name),
            EntryKind::$kind,
            <$t as crate::element::Element>::DTYPE,
            Some(RedOp::$op),
        )),*]
    };
}

entry_points! {
    // Element types (in `DataType::ALL` order) and their names in the symbols.
    types: [
        f32 => "f32",
        f64 => "f64",
        F16 => "f16",
        Bf16 => "bf16",
        i8 => "i8",
        u8 => "u8",
        i32 => "i32",
        u32 => "u32",
        i64 => "i64",
        u64 => "u64",
        F8E4M3 => "f8e4m3",
        F8E5M2 => "f8e5m2",
    ],
    // Operators (in `RedOp::ALL` order).
    ops: [Sum => "sum", Prod => "prod", Min => "min", Max => "max", Avg => "avg"],
    // The primitive without an operator: one entry point per type.
    copy: Copy => "copy",
    // The primitives with one: one entry point per type and operator.
    reductions: [
        Reduce => "reduce",
        ReduceCopy => "reduce_copy",
        OneShot => "oneshot",
        TwoShot => "twoshot",
        TwoShotColl => "twoshot_coll",
        Ll => "ll",
    ],
    // The other primitive without an operator: one entry point per type.
    scale: Scale => "scale",
}
