//! Launching the scale kernel (`ringccl_scale_{ty}`, `gpu_kernels::prim::scale`):
//! `dst[i] = src[i] * scalar` with NCCL's PreMulSum pre-multiplication arithmetic for the
//! element type, the scalar passed by value ([`ScaleBy::Immediate`], NCCL's
//! `ncclScalarHostImmediate`) or read by the kernel from device memory when it runs
//! ([`ScaleBy::Device`], NCCL's `ncclScalarDevice`).
//!
//! ```
//! use ringccl::internals::driver::scale::{check_scale, ScaleBy};
//! use ringccl::DataType;
//! // 0.5 as an f16 immediate, in place.
//! let half = ScaleBy::Immediate(u64::from(half::f16::from_f32(0.5).to_bits()));
//! assert!(check_scale(DataType::F16, 0x1000, 0x1000, 8, half).is_ok());
//! // Bits above the element's size are refused, not ignored.
//! assert!(check_scale(DataType::U8, 0x1000, 0x2000, 8, ScaleBy::Immediate(0x100)).is_err());
//! ```

use std::ffi::c_void;

use cudarc::driver::CudaStream;
use gpu_kernels::EntryKind;

use super::launch::LaunchPlan;
use super::Kernels;
use crate::{Arg, DataType, Error, Result};

/// Where the scale kernel takes its scalar from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleBy {
    /// The scalar's bits, zero-extended to 64 (an `f32` as `to_bits() as u64`, an fp8 as its
    /// byte): passed by value.
    Immediate(u64),
    /// The device address of one element of the buffer's type, read by the kernel when it runs
    /// (so a value written there by earlier work on the stream is the one used).
    Device(u64),
}

/// Checks the arguments of [`launch_scale`] without launching: non-null buffers aligned to
/// the element size when `count > 0`, an immediate with no bits beyond the element's size, a
/// non-null aligned device scalar.
pub fn check_scale(
    dtype: DataType,
    src: u64,
    dst: u64,
    count: usize,
    scalar: ScaleBy,
) -> Result<()> {
    let size = dtype.size() as u64;
    let bad = |arg: Arg, reason: String| Error::InvalidArgument {
        rank: None,
        arg,
        reason,
    };
    if count > 0 {
        for (arg, ptr, what) in [(Arg::Send, src, "source"), (Arg::Recv, dst, "destination")] {
            if ptr == 0 || ptr % size != 0 {
                return Err(bad(
                    arg,
                    format!(
                        "the scale's {what} {ptr:#x} is null or not aligned to {size} bytes ({})",
                        dtype.name()
                    ),
                ));
            }
        }
        let bytes = (count as u64).checked_mul(size);
        if bytes.is_none_or(|b| src.checked_add(b).is_none() || dst.checked_add(b).is_none()) {
            return Err(bad(Arg::Count, format!("{count} elements overflow the address space")));
        }
    }
    match scalar {
        ScaleBy::Immediate(bits) if size < 8 && bits >> (8 * size) != 0 => Err(Error::Internal {
            reason: format!(
                "a {} scale immediate has bits beyond its {size} byte(s): {bits:#x}",
                dtype.name()
            ),
        }),
        ScaleBy::Device(ptr) if ptr == 0 || ptr % size != 0 => Err(Error::Internal {
            reason: format!(
                "the device scalar {ptr:#x} is null or not aligned to {size} bytes ({})",
                dtype.name()
            ),
        }),
        _ => Ok(()),
    }
}

/// Enqueues `dst[i] = src[i] * scalar` for `i < count` elements of `dtype` on `stream`, with
/// at most `max_blocks` blocks; `src == dst` (in place) is allowed. A count of 0 launches
/// nothing. The arguments are checked first ([`check_scale`]): a bad one is an error and
/// nothing is launched.
///
/// # Safety
/// `src` and `dst` must be device memory accessible from `kernels`' context, of at least
/// `count` elements, equal or not overlapping, alive until the kernel has run; a
/// [`ScaleBy::Device`] address one readable element of `dtype`, alive until then too.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_scale(
    kernels: &Kernels,
    stream: &CudaStream,
    dtype: DataType,
    src: u64,
    dst: u64,
    count: usize,
    scalar: ScaleBy,
    max_blocks: u32,
) -> Result<()> {
    check_scale(dtype, src, dst, count, scalar)?;
    if count == 0 {
        return Ok(());
    }
    let (f, limit) = kernels.function(EntryKind::Scale, dtype, None)?;
    let n = count as u64;
    let (imm, ptr) = match scalar {
        ScaleBy::Immediate(bits) => (bits, 0u64),
        ScaleBy::Device(p) => (0, p),
    };
    let arg = |v: &u64| (v as *const u64).cast_mut().cast::<c_void>();
    let mut params = [arg(&src), arg(&dst), arg(&n), arg(&imm), arg(&ptr)];
    let bytes = n.saturating_mul(dtype.size() as u64);
    // SAFETY: `ringccl_scale_*(u64 src, u64 dst, u64 count, u64 imm_bits, u64 scalar_ptr)`;
    // the caller guarantees the memory.
    unsafe {
        kernels.launch(
            stream,
            f,
            LaunchPlan::new(bytes, limit, max_blocks),
            &mut params,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked() {
        let imm = ScaleBy::Immediate;
        for dt in DataType::ALL {
            let s = dt.size() as u64;
            assert!(check_scale(dt, 0x1000, 0x2000, 5, imm(1)).is_ok());
            assert!(check_scale(dt, 0x1000, 0x1000, 5, ScaleBy::Device(0x3000)).is_ok());
            // Count 0: the buffers are not looked at.
            assert!(check_scale(dt, 0, 0, 0, imm(0)).is_ok());
            let e = check_scale(dt, 0, 0x2000, 1, imm(0)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { arg: Arg::Send, .. }), "{e}");
            let e = check_scale(dt, 0x1000, 0, 1, imm(0)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { arg: Arg::Recv, .. }), "{e}");
            assert!(check_scale(dt, 0x1000, 0x2000, 1, ScaleBy::Device(0)).is_err());
            let e = check_scale(dt, 0x1000, 0x2000, usize::MAX, imm(0)).unwrap_err();
            assert!(
                s == 1 || matches!(e, Error::InvalidArgument { arg: Arg::Count, .. }),
                "{e}"
            );
            if s > 1 {
                assert!(check_scale(dt, 0x1001, 0x2000, 1, imm(0)).is_err());
                assert!(check_scale(dt, 0x1000, 0x2001, 1, imm(0)).is_err());
                assert!(check_scale(dt, 0x1000, 0x2000, 1, ScaleBy::Device(0x3001)).is_err());
            }
            if s < 8 {
                let top = (1u64 << (8 * s)) - 1;
                assert!(check_scale(dt, 0x1000, 0x2000, 1, imm(top)).is_ok());
                assert!(check_scale(dt, 0x1000, 0x2000, 1, imm(top + 1)).is_err());
            } else {
                assert!(check_scale(dt, 0x1000, 0x2000, 1, imm(u64::MAX)).is_ok());
            }
        }
    }
}
