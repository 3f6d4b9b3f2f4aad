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
