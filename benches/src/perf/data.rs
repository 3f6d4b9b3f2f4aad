//! Exactly checkable data, as nccl-tests does it: every input is a small integer, chosen so
//! that every partial result of the reduction (in any order) and the final result are exactly
//! representable in the element type; the expected outputs are computed on the CPU in `f64`
//! (exact for these values) and compared element by element.
//!
//! * sum: `((r + i) % m) + 1` with `n * m` within the type's exact range;
//! * avg: `n * (((r + i) % m) + 1)` (so the sum is a multiple of `n` and the average an exact
//!   integer) with `n * n * m` in range, or the same value on every rank if `n * n` is not;
//! * prod: `1` or `2`, with at most `floor(log2(limit))` twos per element across ranks;
//! * min/max: `((5r + 3i) % 17) + 1`;
//! * data movement (all-gather, broadcast, all-to-all): `((37r + i) % m) + 1`.
//!
//! The one inexact case is NCCL's avg on floating-point types with a rank count that is not a
//! power of two (it multiplies each input by a rounded `1/n`): there, and only there, a
//! relative tolerance of `n` ulps of the type is allowed.

use cudarc::nccl::sys::ncclDataType_t;
#[cfg(test)]
use ringccl::DataType;
use ringccl::{DeviceElement, RedOp};

/// An element type ringccl-perf can measure.
pub trait PerfElem: DeviceElement + cudarc::driver::ValidAsZeroBits {
    /// NCCL's name for it.
    const NCCL: ncclDataType_t;
    /// Every integer in `0..=LIMIT` is exactly representable (and, for `f64` bookkeeping, at
    /// most 2^53). For unsigned types one below the maximum, so that all-ones (the poison
    /// pattern) is never a valid result.
    const LIMIT: u64;
    /// Significand bits (with the implicit bit) for floating-point types.
    const SIG_BITS: Option<u32>;
    /// The element holding the integer `x` (exact for `x <= LIMIT`).
    fn from_f64(x: f64) -> Self;
    /// The element's value.
    fn to_f64(self) -> f64;
}

macro_rules! perf_int {
    ($($t:ty => $nccl:ident, $limit:expr;)*) => {$(
        impl PerfElem for $t {
            const NCCL: ncclDataType_t = ncclDataType_t::$nccl;
            const LIMIT: u64 = $limit;
            const SIG_BITS: Option<u32> = None;
            fn from_f64(x: f64) -> Self { x as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}

perf_int! {
    i8 => ncclInt8, i8::MAX as u64;
    u8 => ncclUint8, u8::MAX as u64 - 1;
    i32 => ncclInt32, i32::MAX as u64;
    u32 => ncclUint32, u32::MAX as u64 - 1;
    i64 => ncclInt64, 1 << 53;
    u64 => ncclUint64, 1 << 53;
}

impl PerfElem for f32 {
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat32;
    const LIMIT: u64 = 1 << 24;
    const SIG_BITS: Option<u32> = Some(24);
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl PerfElem for f64 {
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat64;
    const LIMIT: u64 = 1 << 53;
    const SIG_BITS: Option<u32> = Some(53);
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl PerfElem for half::f16 {
    const NCCL: ncclDataType_t = ncclDataType_t::ncclFloat16;
    const LIMIT: u64 = 1 << 11;
    const SIG_BITS: Option<u32> = Some(11);
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
}

impl PerfElem for half::bf16 {
    const NCCL: ncclDataType_t = ncclDataType_t::ncclBfloat16;
    const LIMIT: u64 = 1 << 8;
    const SIG_BITS: Option<u32> = Some(8);
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
}

/// The exact-integer limit of a run-time type (as [`PerfElem::LIMIT`]).
#[cfg(test)]
pub fn limit_of(d: DataType) -> u64 {
    match d {
        DataType::F32 => f32::LIMIT,
        DataType::F64 => f64::LIMIT,
        DataType::F16 => half::f16::LIMIT,
        DataType::BF16 => half::bf16::LIMIT,
        DataType::I8 => i8::LIMIT,
        DataType::U8 => u8::LIMIT,
        DataType::I32 => i32::LIMIT,
        DataType::U32 => u32::LIMIT,
        DataType::I64 => i64::LIMIT,
        DataType::U64 => u64::LIMIT,
        // Not measured by the tool (no `PerfElem`): the exact integers of 4 and 3 significant
        // bits.
        DataType::F8E4M3 => 1 << 4,
        DataType::F8E5M2 => 1 << 3,
    }
}

/// The inputs of one measurement: `value(rank, i)` for element `i` of a rank's send buffer,
/// periodic in `i` with period [`Pattern::period`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// `((r + i) % m) + 1`.
    Sum { m: u64 },
    /// `scale * (((r + i) % m) + 1)`.
    Avg { m: u64, scale: u64 },
    /// `(i % m) + 1` on every rank.
    AvgConst { m: u64 },
    /// `2` where `(r + i) % p == 0`, else `1`.
    Prod { p: u64 },
    /// `((5r + 3i) % 17) + 1`.
    MinMax,
    /// `((37r + i) % m) + 1`.
    Copy { m: u64 },
}

impl Pattern {
    /// The pattern for a reduction with `op` over `n` ranks, for a type whose exact integers
    /// go up to `limit`.
    pub fn reduction(op: RedOp, n: usize, limit: u64) -> Pattern {
        let n = n.max(1) as u64;
        match op {
            RedOp::Sum => Pattern::Sum {
                m: (limit / n).clamp(1, 1000),
            },
            RedOp::Avg => {
                if n * n <= limit {
                    Pattern::Avg {
                        m: (limit / (n * n)).clamp(1, 1000),
                        scale: n,
                    }
                } else {
                    Pattern::AvgConst {
                        m: (limit / n).clamp(1, 1000),
                    }
                }
            }
            RedOp::Prod => {
                let kmax = (63 - limit.max(2).leading_zeros()) as u64; // floor(log2(limit))
                Pattern::Prod {
                    p: n.div_ceil(kmax).max(2),
                }
            }
            RedOp::Min | RedOp::Max => Pattern::MinMax,
        }
    }

    /// The pattern for data movement.
    pub fn copy(limit: u64) -> Pattern {
        Pattern::Copy {
            m: limit.clamp(1, 1021),
        }
    }

    /// `value(r, i) == value(r, i % period())`.
    pub fn period(self) -> usize {
        (match self {
            Pattern::Sum { m } | Pattern::Avg { m, .. } | Pattern::AvgConst { m } => m,
            Pattern::Copy { m } => m,
            Pattern::Prod { p } => p,
            Pattern::MinMax => 17,
        }) as usize
    }

    /// Rank `r`'s input at element `i`.
    #[inline]
    pub fn value(self, r: usize, i: usize) -> f64 {
        let (r, i) = (r as u64, i as u64);
        (match self {
            Pattern::Sum { m } => (r + i) % m + 1,
            Pattern::Avg { m, scale } => scale * ((r + i) % m + 1),
            Pattern::AvgConst { m } => i % m + 1,
            Pattern::Prod { p } => 1 + u64::from((r + i) % p == 0),
            Pattern::MinMax => (5 * r + 3 * (i % 17)) % 17 + 1,
            Pattern::Copy { m } => (37 * r + i) % m + 1,
        }) as f64
    }

    /// The reduction over `n` ranks of element `k` for `k` in one period (exact in `f64`).
    pub fn reduced_table(self, op: RedOp, n: usize) -> Vec<f64> {
        (0..self.period()).map(|k| self.reduced(op, n, k)).collect()
    }

    /// The reduction with `op` of element `i` over ranks `0..n` (in rank order, in `f64`; avg
    /// divides the sum by `n`).
    pub fn reduced(self, op: RedOp, n: usize, i: usize) -> f64 {
        let mut acc = self.value(0, i);
        for r in 1..n {
            let v = self.value(r, i);
            acc = match op {
                RedOp::Sum | RedOp::Avg => acc + v,
                RedOp::Prod => acc * v,
                RedOp::Min => acc.min(v),
                RedOp::Max => acc.max(v),
            };
        }
        if op == RedOp::Avg {
            acc / n.max(1) as f64
        } else {
            acc
        }
    }

    /// The largest partial result any order of the reduction can produce (for the exactness
    /// tests: every partial result is at most this, and at least 1).
    #[cfg(test)]
    pub fn max_partial(self, op: RedOp, n: usize) -> f64 {
        (0..self.period())
            .map(|k| {
                let vals = (0..n).map(|r| self.value(r, k));
                match op {
                    RedOp::Sum | RedOp::Avg => vals.sum::<f64>(),
                    RedOp::Prod => vals.product::<f64>(),
                    RedOp::Min | RedOp::Max => vals.fold(0.0, f64::max),
                }
            })
            .fold(0.0, f64::max)
    }
}

/// Relative tolerance of the check: 0 (exact) except NCCL-style avg on floats with a rank
/// count that is not a power of two.
pub fn tolerance(op: RedOp, n: usize, sig_bits: Option<u32>) -> f64 {
    match (op, sig_bits) {
        (RedOp::Avg, Some(bits)) if !n.is_power_of_two() => {
            n as f64 * (-(bits as f64 - 1.0)).exp2()
        }
        _ => 0.0,
    }
}

/// Rank `r`'s `len` inputs (elements `offset..offset + len` of the pattern), fast: one period
/// is converted, then tiled.
pub fn fill<T: PerfElem>(pat: Pattern, r: usize, offset: usize, len: usize) -> Vec<T> {
    let p = pat.period().max(1);
    let period: Vec<T> = (0..p)
        .map(|k| T::from_f64(pat.value(r, offset + k)))
        .collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = (len - out.len()).min(p);
        out.extend_from_slice(&period[..take]);
    }
    out
}

/// How many of `got` differ from `expect(j)` (beyond the relative tolerance `tol`).
pub fn count_wrong<T: PerfElem>(got: &[T], tol: f64, expect: impl Fn(usize) -> f64) -> usize {
    got.iter()
        .enumerate()
        .filter(|&(j, &g)| {
            let (g, e) = (g.to_f64(), expect(j));
            !(g == e || (tol > 0.0 && (g - e).abs() <= tol * e.abs()))
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value a reduction can meet (inputs, partial results in any order, the result) is
    /// an integer in `1..=limit`, so exactly representable, for every type, op and rank count.
    #[test]
    fn reductions_stay_exact() {
        for d in super::super::args::MEASURED_DTYPES {
            let limit = limit_of(d);
            for n in 1..=16 {
                for op in RedOp::ALL {
                    let pat = Pattern::reduction(op, n, limit);
                    let p = pat.period();
                    assert!(p >= 1);
                    for r in 0..n {
                        for i in 0..3 * p {
                            let v = pat.value(r, i);
                            assert_eq!(v, pat.value(r, i % p), "{pat:?} not periodic");
                            assert!(v >= 1.0 && v.fract() == 0.0 && v <= limit as f64);
                        }
                    }
                    let max = pat.max_partial(op, n);
                    assert!(max <= limit as f64, "{d:?} {op:?} n={n}: {max} > {limit}");
                    for (k, &e) in pat.reduced_table(op, n).iter().enumerate() {
                        assert!(
                            e >= 1.0 && e.fract() == 0.0,
                            "{d:?} {op:?} n={n} k={k}: {e}"
                        );
                    }
                }
            }
        }
    }

    /// The same, checked through the element types themselves: converting the inputs and the
    /// expected results to `T` and back loses nothing, and folding in `T` (as the GPU does, in
    /// two different orders) gives the expected value.
    fn exact_in<T: PerfElem>(n: usize) {
        for op in RedOp::ALL {
            let pat = Pattern::reduction(op, n, T::LIMIT);
            let table = pat.reduced_table(op, n);
            for (k, &e) in table.iter().enumerate() {
                assert_eq!(T::from_f64(e).to_f64(), e, "{:?} {op:?} {e}", T::DTYPE);
                let vals: Vec<T::Math> = (0..n)
                    .map(|r| {
                        let v = pat.value(r, k);
                        assert_eq!(T::from_f64(v).to_f64(), v);
                        T::from_f64(v).to_math()
                    })
                    .collect();
                let fold = |it: &mut dyn Iterator<Item = &T::Math>| {
                    let first = *it.next().unwrap();
                    let acc = it.fold(first, |a, &b| op.combine(a, b));
                    T::from_math(op.finish(acc, n as u32)).to_f64()
                };
                assert_eq!(fold(&mut vals.iter()), e, "{:?} {op:?} n={n}", T::DTYPE);
                assert_eq!(
                    fold(&mut vals.iter().rev()),
                    e,
                    "{:?} {op:?} n={n}",
                    T::DTYPE
                );
            }
        }
        let pat = Pattern::copy(T::LIMIT);
        for r in 0..n {
            for i in 0..pat.period() {
                let v = pat.value(r, i);
                assert_eq!(T::from_f64(v).to_f64(), v);
                assert_eq!(v, pat.value(r, i + pat.period()));
            }
        }
    }

    #[test]
    fn exact_in_every_type() {
        for n in [1, 2, 3, 4, 5, 7, 8, 16] {
            exact_in::<f32>(n);
            exact_in::<f64>(n);
            exact_in::<half::f16>(n);
            exact_in::<half::bf16>(n);
            exact_in::<i8>(n);
            exact_in::<u8>(n);
            exact_in::<i32>(n);
            exact_in::<u32>(n);
            exact_in::<i64>(n);
            exact_in::<u64>(n);
        }
    }

    #[test]
    fn patterns_vary_across_ranks() {
        // A bug that reads one rank only must not go unnoticed: inputs differ between ranks.
        for op in RedOp::ALL {
            let pat = Pattern::reduction(op, 8, half::bf16::LIMIT);
            let differ = (0..pat.period()).any(|i| pat.value(0, i) != pat.value(1, i));
            assert!(differ, "{op:?}: {pat:?}");
        }
        let pat = Pattern::copy(i8::LIMIT);
        assert!((0..8).all(|r| pat.value(r, 0) != pat.value((r + 1) % 8, 0)));
    }

    #[test]
    fn fill_and_count() {
        let pat = Pattern::copy(u8::LIMIT);
        let v: Vec<u8> = fill(pat, 3, 10, 3000);
        assert_eq!(v.len(), 3000);
        for (i, &x) in v.iter().enumerate() {
            assert_eq!(x as f64, pat.value(3, 10 + i));
        }
        let mut got: Vec<f32> = (0..100).map(|i| i as f32).collect();
        assert_eq!(count_wrong(&got, 0.0, |j| j as f64), 0);
        got[5] = f32::NAN;
        got[7] = 8.0;
        got[99] = 0.0;
        assert_eq!(count_wrong(&got, 0.0, |j| j as f64), 3);
        // Tolerance only where allowed.
        assert_eq!(tolerance(RedOp::Avg, 4, Some(24)), 0.0);
        assert_eq!(tolerance(RedOp::Sum, 3, Some(24)), 0.0);
        assert_eq!(tolerance(RedOp::Avg, 3, None), 0.0);
        let t = tolerance(RedOp::Avg, 3, Some(24));
        assert!(t > 0.0 && t < 1e-6);
        let got = [1.0f32 + 1e-7, 2.0];
        assert_eq!(count_wrong(&got, t, |j| (j + 1) as f64), 0);
        assert_eq!(count_wrong(&got, 0.0, |j| (j + 1) as f64), 1);
    }

    #[test]
    fn poison_is_never_expected() {
        // Outputs are poisoned with all-ones bytes: NaN for floats, -1 for signed and MAX for
        // unsigned integers; every expected value is an integer in 1..=LIMIT.
        let limits = [
            (u8::MAX as u64, u8::LIMIT),
            (u32::MAX as u64, u32::LIMIT),
            (u64::MAX, u64::LIMIT),
        ];
        for (max, limit) in limits {
            assert!(max > limit);
        }
        assert!(half::f16::from_bits(0xffff).is_nan());
        assert!(half::bf16::from_bits(0xffff).is_nan());
        assert!(f32::from_bits(u32::MAX).is_nan());
    }
}
