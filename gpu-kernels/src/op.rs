//! Reduction operators: sum, prod, min, max, avg.
//!
//! Each operator is a zero-sized type implementing [`ReduceOp`], so kernels are specialised at
//! compile time; [`RedOp`] is the same set as a run-time value for the host.
//!
//! `avg` is a sum in every step; the step that writes the final value divides by the number of
//! ranks (the kernels' `postdiv` argument). Intermediate steps pass `postdiv = 1`.

use crate::element::Element;

/// A reduction operator, fixed at compile time.
///
/// ```
/// use gpu_kernels::op::{ReduceOp, Avg, Max};
/// assert_eq!(Max::combine(3i32, 7), 7);
/// assert_eq!(Avg::finish(10.0f32, 4), 2.5);
/// ```
pub trait ReduceOp: Copy + 'static {
    /// Name used in kernel entry points (`"sum"`, ...).
    const NAME: &'static str;
    /// The run-time value of this operator.
    const KIND: RedOp;
    /// Combines two elements.
    fn combine<T: Element>(a: T, b: T) -> T;
    /// Applied once to each value written by the final step (`postdiv` = rank count for avg).
    #[inline(always)]
    fn finish<T: Element>(x: T, _postdiv: u32) -> T {
        x
    }
}

/// Sum (wrapping for integers).
#[derive(Clone, Copy, Debug)]
pub struct Sum;
/// Product (wrapping for integers).
#[derive(Clone, Copy, Debug)]
pub struct Prod;
/// Minimum.
#[derive(Clone, Copy, Debug)]
pub struct Min;
/// Maximum.
#[derive(Clone, Copy, Debug)]
pub struct Max;
/// Average: a sum, divided by the rank count in the last step.
#[derive(Clone, Copy, Debug)]
pub struct Avg;

impl ReduceOp for Sum {
    const NAME: &'static str = "sum";
    const KIND: RedOp = RedOp::Sum;
    #[inline(always)]
    fn combine<T: Element>(a: T, b: T) -> T {
        a.add(b)
    }
}
impl ReduceOp for Prod {
    const NAME: &'static str = "prod";
    const KIND: RedOp = RedOp::Prod;
    #[inline(always)]
    fn combine<T: Element>(a: T, b: T) -> T {
        a.mul(b)
    }
}
impl ReduceOp for Min {
    const NAME: &'static str = "min";
    const KIND: RedOp = RedOp::Min;
    #[inline(always)]
    fn combine<T: Element>(a: T, b: T) -> T {
        a.min(b)
    }
}
impl ReduceOp for Max {
    const NAME: &'static str = "max";
    const KIND: RedOp = RedOp::Max;
    #[inline(always)]
    fn combine<T: Element>(a: T, b: T) -> T {
        a.max(b)
    }
}
impl ReduceOp for Avg {
    const NAME: &'static str = "avg";
    const KIND: RedOp = RedOp::Avg;
    #[inline(always)]
    fn combine<T: Element>(a: T, b: T) -> T {
        a.add(b)
    }
    #[inline(always)]
    fn finish<T: Element>(x: T, postdiv: u32) -> T {
        if postdiv > 1 {
            x.div_n(postdiv)
        } else {
            x
        }
    }
}

/// A reduction operator chosen at run time (what the host API takes).
///
/// ```
/// use gpu_kernels::op::RedOp;
/// assert_eq!(RedOp::Prod.combine(3u8, 100), 44); // 300 wraps
/// assert_eq!(RedOp::Avg.finish(9i32, 2), 4);
/// assert_eq!(RedOp::ALL.len(), 5);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Average over ranks.
    Avg,
}

impl RedOp {
    /// Every operator, in kernel-table order.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg];

    /// The position of this operator in [`RedOp::ALL`].
    ///
    /// ```
    /// use gpu_kernels::op::RedOp;
    /// assert_eq!(RedOp::ALL[RedOp::Max.index()], RedOp::Max);
    /// ```
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The name used in kernel entry points.
    pub const fn name(self) -> &'static str {
        match self {
            RedOp::Sum => Sum::NAME,
            RedOp::Prod => Prod::NAME,
            RedOp::Min => Min::NAME,
            RedOp::Max => Max::NAME,
            RedOp::Avg => Avg::NAME,
        }
    }

    /// Combines two elements, as the kernel for this operator does.
    #[inline]
    pub fn combine<T: Element>(self, a: T, b: T) -> T {
        match self {
            RedOp::Sum => Sum::combine(a, b),
            RedOp::Prod => Prod::combine(a, b),
            RedOp::Min => Min::combine(a, b),
            RedOp::Max => Max::combine(a, b),
            RedOp::Avg => Avg::combine(a, b),
        }
    }

    /// The final-step transformation, as the kernel for this operator applies it.
    #[inline]
    pub fn finish<T: Element>(self, x: T, postdiv: u32) -> T {
        match self {
            RedOp::Avg => Avg::finish(x, postdiv),
            _ => x,
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::element::{Bf16, F16};
    use rand::{rngs::SmallRng, Rng, SeedableRng};
    use std::vec::Vec;

    /// Edge bit patterns (zero, one, all ones, sign bit, ...) and random ones, as `T`.
    fn samples<T: Element>(r: &mut SmallRng) -> Vec<T> {
        let mask = u64::MAX >> (64 - 8 * T::SIZE);
        let sign = 1u64 << (8 * T::SIZE - 1);
        let mut raws = std::vec![0, 1, 2, mask, mask - 1, sign, sign - 1, sign + 1];
        // Float ones, infinities and NaNs for the float types (harmless integers otherwise).
        raws.extend([
            0x3c00,
            0x3f80,
            0x7c00,
            0x7e00,
            0x7f80,
            0x7fc0,
            0x3f80_0000,
            0x7fc0_0000,
        ]);
        raws.extend([0x3ff0_0000_0000_0000, 0xfff8_0000_0000_0000]);
        raws.extend((0..60).map(|_| r.random::<u64>()));
        raws.into_iter().map(|x| T::from_raw(x & mask)).collect()
    }

    const POSTDIVS: [u32; 9] = [0, 1, 2, 3, 4, 7, 8, 255, u32::MAX];

    fn check_type<T: Element + core::fmt::Debug>(r: &mut SmallRng) {
        let xs = samples::<T>(r);
        for &a in &xs {
            for &b in &xs {
                let zst = [
                    Sum::combine(a, b),
                    Prod::combine(a, b),
                    Min::combine(a, b),
                    Max::combine(a, b),
                    Avg::combine(a, b),
                ];
                for (op, want) in RedOp::ALL.into_iter().zip(zst) {
                    let got = op.combine(a, b);
                    assert!(got.same_result(want), "{} {op:?}({a:?}, {b:?})", T::NAME);
                }
                assert!(zst[0].same_result(a.add(b)) && zst[1].same_result(a.mul(b)));
                assert!(zst[2].same_result(a.min(b)) && zst[3].same_result(a.max(b)));
                assert!(zst[4].same_result(zst[0]), "avg combines as a sum");
            }
            for n in POSTDIVS {
                let zst = [
                    Sum::finish(a, n),
                    Prod::finish(a, n),
                    Min::finish(a, n),
                    Max::finish(a, n),
                    Avg::finish(a, n),
                ];
                for (op, want) in RedOp::ALL.into_iter().zip(zst) {
                    assert_eq!(
                        op.finish(a, n).to_raw(),
                        want.to_raw(),
                        "{} {op:?} / {n}",
                        T::NAME
                    );
                }
                for (i, x) in zst.iter().enumerate().take(4) {
                    assert_eq!(x.to_raw(), a.to_raw(), "op {i} ignores postdiv {n}");
                }
                if n <= 1 {
                    assert_eq!(zst[4].to_raw(), a.to_raw(), "avg / {n} is the identity");
                } else {
                    assert!(
                        zst[4].same_result(a.div_n(n)),
                        "{} avg {a:?} / {n}",
                        T::NAME
                    );
                }
            }
        }
    }

    #[test]
    fn red_op_matches_the_zero_sized_ops_for_every_type() {
        let mut r = SmallRng::seed_from_u64(11);
        check_type::<f32>(&mut r);
        check_type::<f64>(&mut r);
        check_type::<F16>(&mut r);
        check_type::<Bf16>(&mut r);
        check_type::<i8>(&mut r);
        check_type::<u8>(&mut r);
        check_type::<i32>(&mut r);
        check_type::<u32>(&mut r);
        check_type::<i64>(&mut r);
        check_type::<u64>(&mut r);
        check_type::<crate::element::F8E4M3>(&mut r);
        check_type::<crate::element::F8E5M2>(&mut r);
    }

    #[test]
    fn all_and_names() {
        assert_eq!(
            RedOp::ALL,
            [RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg]
        );
        let names: Vec<&str> = RedOp::ALL.iter().map(|op| op.name()).collect();
        assert_eq!(names, ["sum", "prod", "min", "max", "avg"]);
        assert_eq!(
            [Sum::KIND, Prod::KIND, Min::KIND, Max::KIND, Avg::KIND],
            RedOp::ALL,
            "each ZST's KIND is its RedOp"
        );
        assert_eq!(
            [Sum::NAME, Prod::NAME, Min::NAME, Max::NAME, Avg::NAME],
            names.as_slice()
        );
        for (i, a) in RedOp::ALL.iter().enumerate() {
            assert_eq!(a.index(), i);
            for b in &RedOp::ALL[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(a.name(), b.name());
            }
        }
    }

    #[test]
    fn spelled_out() {
        assert_eq!(RedOp::Sum.combine(200u8, 100), 44);
        assert_eq!(RedOp::Prod.combine(-128i8, -1), -128);
        assert_eq!(
            RedOp::Min.combine(-0.0f32, 0.0).to_bits(),
            (-0.0f32).to_bits()
        );
        assert_eq!(RedOp::Max.combine(f64::NAN, -1.0), -1.0);
        assert_eq!(
            RedOp::Avg.combine(F16::from_f32(1.0), F16::from_f32(2.0)),
            F16::from_f32(3.0)
        );
        assert_eq!(RedOp::Avg.finish(-9i64, 2), -4);
        assert_eq!(
            RedOp::Avg.finish(Bf16::from_f32(3.0), 2),
            Bf16::from_f32(1.5)
        );
        assert_eq!(RedOp::Sum.finish(9u32, 2), 9);
    }
}
