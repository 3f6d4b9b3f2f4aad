//! Reduction operators that carry data: [`Op`], a built-in [`RedOp`] or a PreMulSum (NCCL's
//! `ncclRedOpCreatePreMulSum`): each rank's input multiplied by a scalar, then summed.
//!
//! A PreMulSum call runs as a **pre-step** and a `Sum` (the step between validate and choose
//! in `Communicator::collective`): each held rank's input is scaled by its scalar with the
//! scale kernel (`ringccl_scale_{ty}`, NCCL's `FuncPreMulSum` arithmetic: the product rounded
//! to the element type), then the collective sums the scaled data.
//!
//! | collective | where the scaled input goes |
//! | --- | --- |
//! | all-reduce in place | the buffer itself (it is overwritten by the result anyway) |
//! | all-reduce out of place | the receive buffer; the sum then runs in place on it |
//! | reduce-scatter, reduce | a temporary from the stream-ordered allocator (`cuMemAllocAsync` on the rank's stream), freed on that stream after the call (`cuMemFreeAsync`); the caller's input is never written |
//!
//! Under CUDA-graph capture the temporary's allocation and free are captured as the graph's
//! memory nodes. `RINGCCL_DEBUG=info` reports the pre-step of each call.

use std::sync::Arc;

use crate::api::collective::Collective;
use crate::dtype::DeviceElement;
use crate::exec::premul::{Prescale, ScaleBy, Target};
use crate::schedule::Layout;
use crate::{Arg, DataType, Error, RedOp, Result};

/// Where a PreMulSum factor is, for one rank.
///
/// ```
/// use ringccl::Scalar;
/// let s = Scalar::Host(0.5f32);
/// assert_eq!(s, Scalar::Host(0.5));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar<T> {
    /// The value itself (NCCL's `ncclScalarHostImmediate`), copied when the operator is made.
    Host(T),
    /// The device address of one element of `T` (NCCL's `ncclScalarDevice`), read by the GPU
    /// when the collective runs, so work earlier on the rank's stream may write it.
    Device(u64),
}

/// A reduction operator: one of the five built-ins ([`RedOp`]) or a PreMulSum carrying its
/// scalar. Every reducing collective takes `impl Into<Op>`: a [`RedOp`] converts.
///
/// A PreMulSum computes, for every element, the sum over ranks of `x_r × s_r` where `s_r` is
/// rank `r`'s scalar; the product is NCCL's (`FuncPreMulSum`: rounded to the element type
/// before the sum). Its scalar's type must be the call's element type: another type is
/// [`Error::InvalidArgument`] (argument [`Arg::Op`]) before anything is launched.
///
/// ```
/// use ringccl::{Op, RedOp};
/// let sum: Op = RedOp::Sum.into();
/// assert_eq!(sum.builtin(), Some(RedOp::Sum));
/// let half = Op::pre_mul_sum(0.5f32);
/// assert_eq!(half.builtin(), None);
/// assert!(half.is_pre_mul_sum());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    inner: Inner,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Inner {
    Builtin(RedOp),
    PreMulSum {
        /// The scalars' element type.
        dtype: DataType,
        /// One per held rank, or one for every rank.
        scalars: Arc<[ScaleBy]>,
    },
}

impl From<RedOp> for Op {
    fn from(op: RedOp) -> Self {
        Op {
            inner: Inner::Builtin(op),
        }
    }
}

impl From<&Op> for Op {
    fn from(op: &Op) -> Self {
        op.clone()
    }
}

/// A host scalar's bits, zero-extended (the scale kernel's immediate).
fn bits_of<T: DeviceElement>(x: T) -> u64 {
    let size = std::mem::size_of::<T>();
    let mut b = [0u8; 8];
    // SAFETY: `T` is a plain `DeviceRepr` element of `size` <= 8 bytes (every `DeviceElement`
    // is 1, 2, 4 or 8 bytes with no padding); reading its bytes is reading its bits.
    unsafe {
        std::ptr::copy_nonoverlapping((&x as *const T).cast::<u8>(), b.as_mut_ptr(), size.min(8))
    };
    u64::from_le_bytes(b)
}

impl Op {
    /// A PreMulSum with the same host scalar on every rank (NCCL's
    /// `ncclRedOpCreatePreMulSum` with `ncclScalarHostImmediate`).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io, Op};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).clone_htod(&[2.0f32; 16])).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// // Every output element: n × (2.0 × 0.5).
    /// comm.all_reduce(&mut io, 16, Op::pre_mul_sum(0.5f32), comm.streams())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pre_mul_sum<T: DeviceElement>(scalar: T) -> Op {
        Op {
            inner: Inner::PreMulSum {
                dtype: T::DTYPE,
                scalars: Arc::from([ScaleBy::Immediate(bits_of(scalar))]),
            },
        }
    }

    /// A PreMulSum with one host scalar per held rank (`scalars[i]` for
    /// [`Communicator::local_ranks`](crate::Communicator::local_ranks)`()[i]`), as NCCL ranks
    /// that each create their own operator. A length other than the number of held ranks is
    /// [`Error::InvalidArgument`] at the call.
    ///
    /// ```
    /// use ringccl::Op;
    /// let op = Op::pre_mul_sum_per_rank(&[1.0f64, 0.25]);
    /// assert!(op.is_pre_mul_sum());
    /// ```
    pub fn pre_mul_sum_per_rank<T: DeviceElement>(scalars: &[T]) -> Op {
        Op {
            inner: Inner::PreMulSum {
                dtype: T::DTYPE,
                scalars: scalars.iter().map(|&s| ScaleBy::Immediate(bits_of(s))).collect(),
            },
        }
    }

    /// A PreMulSum with each held rank's scalar on the host or on the device
    /// ([`Scalar`]): `scalars[i]` for the `i`-th held rank, or one entry for every rank. A
    /// null or misaligned device address, or a length that fits neither, is
    /// [`Error::InvalidArgument`] at the call.
    ///
    /// # Safety
    ///
    /// Every [`Scalar::Device`] address must be one element of `T` of device memory that the
    /// GPU of each rank it is used for can read (its own device's memory, or memory mapped
    /// for it), alive and not freed until every collective called with this operator has run
    /// on the GPU (the value is read then, not at this call).
    ///
    /// ```no_run
    /// use cudarc::driver::DevicePtr;
    /// use ringccl::{Communicator, Io, Op, Scalar};
    /// let comm = Communicator::init_rank(1, &ringccl::UniqueId::new()?, 0, 0)?;
    /// let stream = comm.stream(0);
    /// let factor = stream.clone_htod(&[0.5f32])?;
    /// let (ptr, _sync) = factor.device_ptr(stream);
    /// // SAFETY: `factor` is one f32 on rank 0's device and outlives the call's execution
    /// // (the stream is synchronized below, before it is dropped).
    /// let op = unsafe { Op::pre_mul_sum_scalars(&[Scalar::<f32>::Device(ptr)]) };
    /// let mut buf = stream.clone_htod(&[3.0f32; 8])?;
    /// comm.all_reduce(&mut [Io::in_place(&mut buf)], 8, op, &[stream])?;
    /// stream.synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn pre_mul_sum_scalars<T: DeviceElement>(scalars: &[Scalar<T>]) -> Op {
        Op {
            inner: Inner::PreMulSum {
                dtype: T::DTYPE,
                scalars: scalars
                    .iter()
                    .map(|s| match *s {
                        Scalar::Host(x) => ScaleBy::Immediate(bits_of(x)),
                        Scalar::Device(p) => ScaleBy::Device(p),
                    })
                    .collect(),
            },
        }
    }

    /// A PreMulSum with each held rank's scalar read from device memory when the collective
    /// runs (NCCL's `ncclScalarDevice`): `ptrs[i]` for the `i`-th held rank, or one address
    /// for every rank.
    ///
    /// # Safety
    ///
    /// As [`Op::pre_mul_sum_scalars`]: each address one readable element of `T` on the
    /// device of the rank(s) using it, alive until every collective called with this
    /// operator has run.
    ///
    /// ```
    /// use ringccl::Op;
    /// // SAFETY: the operator is only inspected, never used in a call.
    /// let op = unsafe { Op::pre_mul_sum_device::<half::bf16>(&[0x7000_0000]) };
    /// assert!(op.is_pre_mul_sum());
    /// ```
    pub unsafe fn pre_mul_sum_device<T: DeviceElement>(ptrs: &[u64]) -> Op {
        Op {
            inner: Inner::PreMulSum {
                dtype: T::DTYPE,
                scalars: ptrs.iter().map(|&p| ScaleBy::Device(p)).collect(),
            },
        }
    }

    /// The built-in operator, if this is one.
    ///
    /// ```
    /// use ringccl::{Op, RedOp};
    /// assert_eq!(Op::from(RedOp::Max).builtin(), Some(RedOp::Max));
    /// ```
    pub fn builtin(&self) -> Option<RedOp> {
        match self.inner {
            Inner::Builtin(op) => Some(op),
            Inner::PreMulSum { .. } => None,
        }
    }

    /// Whether this is a PreMulSum.
    ///
    /// ```
    /// use ringccl::{Op, RedOp};
    /// assert!(!Op::from(RedOp::Sum).is_pre_mul_sum());
    /// assert!(Op::pre_mul_sum(3i32).is_pre_mul_sum());
    /// ```
    pub fn is_pre_mul_sum(&self) -> bool {
        matches!(self.inner, Inner::PreMulSum { .. })
    }

    /// The element type of a PreMulSum's scalar (`None` for a built-in).
    ///
    /// ```
    /// use ringccl::{DataType, Op};
    /// assert_eq!(Op::pre_mul_sum(half::f16::ONE).scalar_type(), Some(DataType::F16));
    /// ```
    pub fn scalar_type(&self) -> Option<DataType> {
        match self.inner {
            Inner::Builtin(_) => None,
            Inner::PreMulSum { dtype, .. } => Some(dtype),
        }
    }
}

/// What a call runs for its operator: the kernels' operator and, for a PreMulSum, the
/// pre-step. Built by [`resolve`] (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The operator the collective itself runs (`Sum` for a PreMulSum).
    pub op: RedOp,
    /// The pre-step, for a PreMulSum.
    pub pre: Option<Prescale>,
}

/// Checks `op` for a collective `c` of element type `dtype` whose validated layout is
/// `layout`, with `held` ranks held here, and says what runs. Pure: no GPU.
///
/// ```
/// use ringccl::internals::api::{collective::Collective, premul::resolve};
/// use ringccl::internals::exec::premul::Target;
/// use ringccl::internals::schedule::Layout;
/// use ringccl::{DataType, Op, RedOp};
/// let c = Collective::ReduceScatter { recvcount: 4 };
/// let r = resolve(&Op::pre_mul_sum(2.0f32), c, DataType::F32, Layout::OutOfPlace, 2, 2)?;
/// assert_eq!(r.op, RedOp::Sum);
/// let pre = r.pre.unwrap();
/// assert_eq!((pre.elems, pre.into, pre.scalars.len()), (8, Target::Temp, 2));
/// // A scalar of another type than the buffers'.
/// assert!(resolve(&Op::pre_mul_sum(2.0f64), c, DataType::F32, Layout::OutOfPlace, 2, 2).is_err());
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn resolve(
    op: &Op,
    c: Collective,
    dtype: DataType,
    layout: Layout,
    nranks: usize,
    held: usize,
) -> Result<Resolved> {
    let (sdtype, scalars) = match &op.inner {
        Inner::Builtin(op) => return Ok(Resolved { op: *op, pre: None }),
        Inner::PreMulSum { dtype, scalars } => (*dtype, scalars),
    };
    let name = c.name();
    let into = match c {
        Collective::AllReduce { .. } if matches!(layout, Layout::SendInRecv { .. }) => {
            Target::InPlace
        }
        Collective::AllReduce { .. } => Target::Recv,
        Collective::ReduceScatter { .. } | Collective::Reduce { .. } => Target::Temp,
        _ => {
            return Err(Error::invalid(
                None,
                Arg::Op,
                format!("{name} takes no reduction operator, so no PreMulSum"),
            ))
        }
    };
    if sdtype != dtype {
        return Err(Error::invalid(
            None,
            Arg::Op,
            format!(
                "{name}: the PreMulSum scalar is {} but the buffers are {}: make the operator \
                 with a scalar of the buffers' type",
                sdtype.name(),
                dtype.name()
            ),
        ));
    }
    let scalars: Vec<ScaleBy> = match scalars.len() {
        1 => vec![scalars[0]; held],
        n if n == held => scalars.to_vec(),
        n => {
            return Err(Error::invalid(
                None,
                Arg::Op,
                format!(
                    "{name}: the PreMulSum has {n} scalars for {held} ranks held here: give one, \
                     or one per held rank"
                ),
            ))
        }
    };
    let size = dtype.size() as u64;
    for (i, s) in scalars.iter().enumerate() {
        if let ScaleBy::Device(p) = *s {
            if p == 0 || p % size != 0 {
                return Err(Error::invalid(
                    None,
                    Arg::Op,
                    format!(
                        "{name}: the PreMulSum device scalar of held rank {i} is {p:#x}: null or \
                         not aligned to {size} bytes ({})",
                        dtype.name()
                    ),
                ));
            }
        }
    }
    let elems = c.needs(0, nranks).0.elems();
    Ok(Resolved {
        op: RedOp::Sum,
        pre: Some(Prescale {
            scalars,
            elems,
            into,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    const AR: Collective = Collective::AllReduce { count: 8 };
    const RS: Collective = Collective::ReduceScatter { recvcount: 3 };
    const RD: Collective = Collective::Reduce { count: 5, root: 1 };
    const IN_PLACE: Layout = Layout::SendInRecv { stride: 0 };

    fn bad(r: Result<Resolved>, what: &str) {
        match r {
            Err(Error::InvalidArgument { arg: Arg::Op, reason, .. }) => {
                assert!(reason.contains(what), "{reason}")
            }
            other => panic!("expected an invalid operator ({what}), got {other:?}"),
        }
    }

    #[test]
    fn builtins_have_no_pre_step() {
        for op in RedOp::ALL {
            for c in [AR, RS, RD] {
                let r = resolve(&op.into(), c, DataType::F32, Layout::OutOfPlace, 4, 4).unwrap();
                assert_eq!(r, Resolved { op, pre: None });
            }
            assert_eq!(Op::from(op).builtin(), Some(op));
            assert_eq!(Op::from(op).scalar_type(), None);
        }
    }

    #[test]
    fn host_scalars_keep_their_bits() {
        let cases: [(Op, DataType, u64); 7] = [
            (Op::pre_mul_sum(0.5f32), DataType::F32, u64::from(0.5f32.to_bits())),
            (Op::pre_mul_sum(-3.0f64), DataType::F64, (-3.0f64).to_bits()),
            (Op::pre_mul_sum(f16::from_f32(0.25)), DataType::F16, 0x3400),
            (Op::pre_mul_sum(bf16::from_f32(2.0)), DataType::BF16, 0x4000),
            (Op::pre_mul_sum(-1i8), DataType::I8, 0xff),
            (Op::pre_mul_sum(-2i32), DataType::I32, 0xffff_fffe),
            (Op::pre_mul_sum(crate::F8E4M3::from_f32(1.0)), DataType::F8E4M3, 0x38),
        ];
        for (op, dt, bits) in cases {
            assert_eq!(op.scalar_type(), Some(dt));
            let r = resolve(&op, AR, dt, IN_PLACE, 2, 2).unwrap();
            assert_eq!(r.op, RedOp::Sum);
            let pre = r.pre.unwrap();
            assert_eq!(pre.scalars, vec![ScaleBy::Immediate(bits); 2], "{}", dt.name());
        }
    }

    #[test]
    fn the_pre_step_is_chosen_per_collective_and_layout() {
        let op = Op::pre_mul_sum(2u32);
        let u = DataType::U32;
        let pre = |c, layout| resolve(&op, c, u, layout, 4, 4).unwrap().pre.unwrap();
        let p = pre(AR, IN_PLACE);
        assert_eq!((p.into, p.elems), (Target::InPlace, 8));
        let p = pre(AR, Layout::OutOfPlace);
        assert_eq!((p.into, p.elems), (Target::Recv, 8));
        // Reduce-scatter's input is nranks × recvcount, in place or not.
        for layout in [Layout::OutOfPlace, Layout::RecvInSend { stride: 3 }] {
            let p = pre(RS, layout);
            assert_eq!((p.into, p.elems), (Target::Temp, 12));
        }
        for layout in [Layout::OutOfPlace, IN_PLACE] {
            let p = pre(RD, layout);
            assert_eq!((p.into, p.elems), (Target::Temp, 5));
        }
        // Collectives without an operator refuse one.
        for c in [
            Collective::AllGather { sendcount: 2 },
            Collective::Broadcast { count: 2, root: 0 },
        ] {
            bad(resolve(&op, c, u, Layout::OutOfPlace, 4, 4), "no reduction operator");
        }
    }

    #[test]
    fn a_scalar_of_another_type_is_refused() {
        for (op, dt) in [
            (Op::pre_mul_sum(1.0f32), DataType::F64),
            (Op::pre_mul_sum(f16::ONE), DataType::BF16),
            (Op::pre_mul_sum(1i32), DataType::U32),
            (Op::pre_mul_sum(1u8), DataType::F8E5M2),
        ] {
            bad(resolve(&op, AR, dt, IN_PLACE, 2, 2), "scalar is");
        }
    }

    #[test]
    fn device_scalars_are_checked() {
        // SAFETY: these operators are resolved, never run.
        let (null, odd, good, mixed) = unsafe {
            (
                Op::pre_mul_sum_device::<f32>(&[0]),
                Op::pre_mul_sum_device::<f32>(&[0x1002]),
                Op::pre_mul_sum_device::<f32>(&[0x1000, 0x2000]),
                Op::pre_mul_sum_scalars(&[Scalar::Host(2.0f32), Scalar::Device(0x3000)]),
            )
        };
        bad(resolve(&null, AR, DataType::F32, IN_PLACE, 2, 2), "null");
        bad(resolve(&odd, RS, DataType::F32, IN_PLACE, 2, 2), "aligned");
        let r = resolve(&good, RD, DataType::F32, IN_PLACE, 2, 2).unwrap().pre.unwrap();
        assert_eq!(r.scalars, vec![ScaleBy::Device(0x1000), ScaleBy::Device(0x2000)]);
        let r = resolve(&mixed, RD, DataType::F32, IN_PLACE, 2, 2).unwrap().pre.unwrap();
        assert_eq!(
            r.scalars,
            vec![ScaleBy::Immediate(u64::from(2.0f32.to_bits())), ScaleBy::Device(0x3000)]
        );
        // Two scalars for three held ranks.
        bad(resolve(&good, AR, DataType::F32, IN_PLACE, 3, 3), "2 scalars for 3");
        let per = Op::pre_mul_sum_per_rank(&[1.0f32, 2.0, 3.0]);
        bad(resolve(&per, AR, DataType::F32, IN_PLACE, 2, 2), "3 scalars for 2");
        assert!(resolve(&per, AR, DataType::F32, IN_PLACE, 3, 3).is_ok());
    }
}
