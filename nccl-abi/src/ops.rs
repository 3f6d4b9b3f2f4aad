//! Reduction operators: NCCL's five built-ins and the PreMulSum operators that
//! `ncclRedOpCreatePreMulSum` creates, one table per communicator handle (as NCCL keeps
//! `comm->userRedOps`).
//!
//! Values follow nccl.h: 0..`ncclNumOps` (5) are the built-ins, created operators lie in
//! `ncclNumOps..=ncclMaxRedOp`. Each created operator gets a value never handed out before in
//! this process (NCCL reuses a destroyed operator's slot; ringccl does not), so a value made
//! on another communicator, a destroyed one, or one nobody made is refused by every reducing
//! collective with `ncclInvalidArgument`. A failed `ncclRedOpCreatePreMulSum` writes
//! [`FAILED_OP`], which no table ever holds: a caller that ignores the failure (PyTorch does)
//! gets an error from the collective, never a plain sum.
//!
//! The one place a valid PreMulSum operator meets the data path is [`premul_for`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};

use ringccl::{DataType, RedOp};

use crate::error::{Fail, Result};
use crate::types::{self, ncclDataType_t, ncclRedOp_t, ncclScalarResidence_t};

/// `ncclNumOps`: the number of built-in operators.
pub const NCCL_NUM_OPS: ncclRedOp_t = 5;
/// `ncclMaxRedOp`: the largest valid `ncclRedOp_t`.
pub const NCCL_MAX_RED_OP: ncclRedOp_t = 0x7fff_ffff;
/// What a failed `ncclRedOpCreatePreMulSum` writes to `*op` (never a created operator).
pub const FAILED_OP: ncclRedOp_t = NCCL_MAX_RED_OP;
/// `ncclScalarDevice`: the scalar is read from device memory when the collective runs.
pub const NCCL_SCALAR_DEVICE: ncclScalarResidence_t = 0;
/// `ncclScalarHostImmediate`: the scalar is read from host memory at creation.
pub const NCCL_SCALAR_HOST_IMMEDIATE: ncclScalarResidence_t = 1;

/// Where a PreMulSum operator's factor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalar {
    /// `ncclScalarHostImmediate`: the value, copied at creation: the low
    /// `PreMul::dtype.size()` bytes of `bits` (little-endian), the element type's encoding.
    Host {
        /// The bytes of the value, zero-extended.
        bits: u64,
    },
    /// `ncclScalarDevice`: the address of one element of device memory, read when the
    /// collective runs (as NCCL does), so it may change between calls.
    Device {
        /// The device address.
        ptr: u64,
    },
}

/// A PreMulSum operator: each input is multiplied by the scalar, then the products are summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreMul {
    /// The factor.
    pub scalar: Scalar,
    /// The element type the operator was created for (the scalar's type too).
    pub dtype: DataType,
    /// The same, as the caller's `ncclDataType_t`.
    pub nccl_type: ncclDataType_t,
}

impl PreMul {
    /// The host scalar as an `f64` (`None` for a device scalar).
    ///
    /// ```
    /// use ringccl_nccl::ops::{PreMul, Scalar};
    /// let p = PreMul { scalar: Scalar::Host { bits: 0.5f32.to_bits() as u64 }, dtype: ringccl::DataType::F32, nccl_type: 7 };
    /// assert_eq!(p.host_value(), Some(0.5));
    /// ```
    pub fn host_value(&self) -> Option<f64> {
        let Scalar::Host { bits } = self.scalar else {
            return None;
        };
        Some(match self.dtype {
            DataType::F32 => f64::from(f32::from_bits(bits as u32)),
            DataType::F64 => f64::from_bits(bits),
            DataType::F16 => ringccl::half::f16::from_bits(bits as u16).to_f64(),
            DataType::BF16 => ringccl::half::bf16::from_bits(bits as u16).to_f64(),
            DataType::I8 => f64::from(bits as u8 as i8),
            DataType::U8 => f64::from(bits as u8),
            DataType::I32 => f64::from(bits as u32 as i32),
            DataType::U32 => f64::from(bits as u32),
            DataType::I64 => bits as i64 as f64,
            DataType::U64 => bits as f64,
            DataType::F8E4M3 => f64::from(ringccl::F8E4M3::from_bits(bits as u8).to_f32()),
            DataType::F8E5M2 => f64::from(ringccl::F8E5M2::from_bits(bits as u8).to_f32()),
        })
    }
}

/// What a reducing collective's `ncclRedOp_t` stands for on its communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// `ncclSum`, `ncclProd`, `ncclMax`, `ncclMin`, `ncclAvg`.
    Builtin(RedOp),
    /// An operator created on this communicator.
    PreMul(PreMul),
}

/// The PreMulSum operators created on one communicator and not destroyed.
#[derive(Debug, Default)]
pub struct OpTable {
    ops: HashMap<ncclRedOp_t, PreMul>,
}

/// The next value handed out (process-wide: values are never reused).
static NEXT: AtomicI32 = AtomicI32::new(NCCL_NUM_OPS);

impl OpTable {
    /// Records `p` under a new operator value.
    pub fn create(&mut self, p: PreMul) -> Result<ncclRedOp_t> {
        let v = NEXT
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                (v < FAILED_OP - 1).then_some(v + 1)
            })
            .map_err(|_| {
                Fail::new(
                    types::NCCL_INTERNAL_ERROR,
                    "every ncclRedOp_t value was handed out already (2^31 operators created)",
                )
            })?;
        self.ops.insert(v, p);
        Ok(v)
    }

    /// `ncclRedOpDestroy`'s checks (NCCL's order and codes), then forgets `op`.
    pub fn destroy(&mut self, op: ncclRedOp_t) -> Result<()> {
        if (0..NCCL_NUM_OPS).contains(&op) {
            return Err(Fail::arg(format!(
                "operator {op} is a built-in (ncclSum..ncclAvg); only operators from \
                 ncclRedOpCreatePreMulSum are destroyed"
            )));
        }
        if op < 0 {
            return Err(Fail::arg(format!(
                "operator {op} is not an ncclRedOp_t (0..=ncclMaxRedOp)"
            )));
        }
        if self.ops.remove(&op).is_none() {
            return Err(Fail::arg(unknown(op)));
        }
        Ok(())
    }

    /// What `op` is for a reducing collective of `datatype` on this communicator.
    pub fn resolve(&self, op: ncclRedOp_t, datatype: ncclDataType_t) -> Result<Resolved> {
        if (0..NCCL_NUM_OPS).contains(&op) {
            let r = types::red_op(op).map_err(|e| Fail::new(types::NCCL_INTERNAL_ERROR, e))?;
            return Ok(Resolved::Builtin(r));
        }
        if op < 0 {
            return Err(Fail::arg(format!(
                "invalid reduction operation {op} (not an ncclRedOp_t)"
            )));
        }
        let Some(p) = self.ops.get(&op) else {
            return Err(Fail::arg(unknown(op)));
        };
        if p.nccl_type != datatype {
            return Err(Fail::arg(format!(
                "the datatype of the call ({datatype}) does not match the datatype operator \
                 {op} was created for ({}), as NCCL requires",
                p.nccl_type
            )));
        }
        Ok(Resolved::PreMul(*p))
    }

    /// How many operators are live.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether none is live.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

fn unknown(op: ncclRedOp_t) -> String {
    if op == FAILED_OP {
        format!(
            "operator {op} is the value a failed ncclRedOpCreatePreMulSum writes: that call \
             failed (its return code and ncclGetLastError say why), so there is no operator"
        )
    } else {
        format!(
            "reduction operator {op} is unknown to this communicator: not a built-in and not \
             created on it by ncclRedOpCreatePreMulSum, or destroyed since"
        )
    }
}

/// The PreMulSum operator a reducing collective runs with: `None` for a built-in. This is
/// the one place where a valid PreMulSum operator meets the host library: the call carries
/// `p` (the queued call's `premul`) to where the collective is issued (`coll::issue`), which
/// hands it to the host call as a `ringccl::Op` PreMulSum (the host scalar's bits as created,
/// or the device address, read when the collective runs).
///
/// ```
/// use ringccl_nccl::ops::{premul_for, PreMul, Resolved, Scalar};
/// assert_eq!(premul_for(&Resolved::Builtin(ringccl::RedOp::Sum)), Ok(None));
/// let p = PreMul { scalar: Scalar::Host { bits: 0 }, dtype: ringccl::DataType::F32, nccl_type: 7 };
/// assert_eq!(premul_for(&Resolved::PreMul(p)), Ok(Some(p)));
/// ```
pub fn premul_for(op: &Resolved) -> Result<Option<PreMul>> {
    match op {
        Resolved::Builtin(_) => Ok(None),
        Resolved::PreMul(p) => Ok(Some(*p)),
    }
}

/// `ncclRedOpCreatePreMulSum`'s arguments checked: the operator to record.
///
/// # Safety
///
/// `scalar` is NULL or, for `ncclScalarHostImmediate`, valid to read one element of
/// `datatype`.
pub unsafe fn premul_from_c(
    scalar: *const std::ffi::c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
) -> Result<PreMul> {
    let dtype = types::data_type(datatype).map_err(Fail::arg)?;
    if scalar.is_null() {
        return Err(Fail::arg("scalar is NULL"));
    }
    let scalar = match residence {
        NCCL_SCALAR_HOST_IMMEDIATE => {
            let mut b = [0u8; 8];
            let n = dtype.size().min(8);
            // SAFETY: the caller's contract: one element of `datatype` (n bytes) to read.
            unsafe { std::ptr::copy_nonoverlapping(scalar.cast::<u8>(), b.as_mut_ptr(), n) };
            Scalar::Host {
                bits: u64::from_le_bytes(b),
            }
        }
        NCCL_SCALAR_DEVICE => Scalar::Device { ptr: scalar as u64 },
        r => {
            return Err(Fail::arg(format!(
                "residence {r} is neither ncclScalarDevice (0) nor ncclScalarHostImmediate (1)"
            )))
        }
    };
    Ok(PreMul {
        scalar,
        dtype,
        nccl_type: datatype,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn half_f32() -> PreMul {
        let s = 0.5f32;
        // SAFETY: `s` is one f32.
        unsafe { premul_from_c((&s as *const f32).cast(), 7, NCCL_SCALAR_HOST_IMMEDIATE) }.unwrap()
    }

    #[test]
    fn a_host_scalar_is_copied_at_creation() {
        let p = half_f32();
        assert_eq!(
            p.scalar,
            Scalar::Host {
                bits: u64::from(0.5f32.to_bits())
            }
        );
        assert_eq!(p.host_value(), Some(0.5));
        let d = 3.0f64;
        // SAFETY: `d` is one f64.
        let p = unsafe { premul_from_c((&d as *const f64).cast(), 8, 1) }.unwrap();
        assert_eq!(p.host_value(), Some(3.0));
        let h = ringccl::half::bf16::from_f32(0.25);
        // SAFETY: `h` is one bf16.
        let p = unsafe { premul_from_c((&h as *const ringccl::half::bf16).cast(), 9, 1) }.unwrap();
        assert_eq!(p.host_value(), Some(0.25));
    }

    #[test]
    fn a_device_scalar_keeps_its_address() {
        let p = unsafe { premul_from_c(0x7000_0000 as *const _, 7, NCCL_SCALAR_DEVICE) }.unwrap();
        assert_eq!(p.scalar, Scalar::Device { ptr: 0x7000_0000 });
        assert_eq!(p.host_value(), None);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let s = 1.0f32;
        let ptr = (&s as *const f32).cast();
        // SAFETY: nothing is read for these.
        unsafe {
            assert!(premul_from_c(std::ptr::null(), 7, 1).is_err());
            assert!(premul_from_c(ptr, 12, 1).is_err());
            assert!(premul_from_c(ptr, 7, 2).is_err());
        }
    }

    #[test]
    fn created_operators_resolve_and_die() {
        let mut t = OpTable::default();
        let op = t.create(half_f32()).unwrap();
        assert!((NCCL_NUM_OPS..FAILED_OP).contains(&op));
        assert_eq!(t.resolve(op, 7), Ok(Resolved::PreMul(half_f32())));
        // Another datatype than the one it was made for.
        let e = t.resolve(op, 9).unwrap_err();
        assert_eq!(e.code, types::NCCL_INVALID_ARGUMENT);
        assert!(e.message.contains("does not match"), "{}", e.message);
        // A second operator gets another value.
        let op2 = t.create(half_f32()).unwrap();
        assert_ne!(op, op2);
        assert_eq!(t.len(), 2);
        t.destroy(op).unwrap();
        // Destroyed: refused by collectives and by a second destroy.
        assert_eq!(
            t.resolve(op, 7).unwrap_err().code,
            types::NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            t.destroy(op).unwrap_err().code,
            types::NCCL_INVALID_ARGUMENT
        );
        assert!(t.resolve(op2, 7).is_ok());
        // Values of another communicator's table are unknown here.
        let mut other = OpTable::default();
        let foreign = other.create(half_f32()).unwrap();
        assert!(t.resolve(foreign, 7).is_err());
        assert!(t.destroy(foreign).is_err());
    }

    #[test]
    fn builtins_pass_and_everything_else_is_refused() {
        let t = OpTable::default();
        for (v, r) in [
            (0, RedOp::Sum),
            (1, RedOp::Prod),
            (2, RedOp::Max),
            (3, RedOp::Min),
            (4, RedOp::Avg),
        ] {
            assert_eq!(t.resolve(v, 7), Ok(Resolved::Builtin(r)));
            assert_eq!(premul_for(&Resolved::Builtin(r)), Ok(None));
        }
        for v in [-1, 5, 6, 1000, FAILED_OP, i32::MIN] {
            let e = t.resolve(v, 7).unwrap_err();
            assert_eq!(e.code, types::NCCL_INVALID_ARGUMENT, "{v}");
        }
        assert!(t
            .resolve(FAILED_OP, 7)
            .unwrap_err()
            .message
            .contains("failed ncclRedOpCreatePreMulSum"));
        let mut t = t;
        for v in [0, 4, -1, 5, FAILED_OP] {
            assert_eq!(
                t.destroy(v).unwrap_err().code,
                types::NCCL_INVALID_ARGUMENT,
                "{v}"
            );
        }
    }

    #[test]
    fn a_valid_premul_is_carried_to_the_call() {
        assert_eq!(
            premul_for(&Resolved::PreMul(half_f32())),
            Ok(Some(half_f32()))
        );
        // SAFETY: nothing is read for a device scalar.
        let d = unsafe { premul_from_c(0x7000_0000 as *const _, 10, NCCL_SCALAR_DEVICE) };
        let d = d.unwrap();
        assert_eq!(d.dtype, DataType::F8E4M3);
        assert_eq!(premul_for(&Resolved::PreMul(d)), Ok(Some(d)));
    }
}
