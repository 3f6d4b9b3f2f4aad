//! Launching the LL push kernels (`gpu_kernels::ll`): the all-reduce's arguments ([`LlArgs`])
//! and the all-gather's ([`LlGatherArgs`]), each one launch of 1 to
//! `gpu_kernels::ll::LL_MAX_BLOCKS` blocks (`gpu_kernels::ll::ll_blocks`).

use std::ffi::c_void;

use cudarc::driver::CudaStream;
use gpu_kernels::ll::LL_MAX_BYTES;
use gpu_kernels::oneshot::MAX_RANKS;
use gpu_kernels::EntryKind;

use super::launch::LaunchPlan;
use super::Kernels;
use crate::{DataType, Error, RedOp, Result};

/// The arguments of one rank's LL all-reduce kernel (see `gpu_kernels::ll`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LlArgs<'a> {
    /// This rank's input (8-byte aligned).
    pub src: u64,
    /// This rank's output (8-byte aligned; may be `src`).
    pub dst: u64,
    /// Elements of the output (at most `LL_MAX_BYTES` bytes).
    pub count: usize,
    /// A reduce-scatter: `src` holds one block of `count` elements per rank, and this rank's
    /// output is the reduction of every rank's block `rank` (`dst` may be `src`'s block
    /// `rank`); else an all-reduce (`dst` may be `src`).
    pub scatter: bool,
    /// The rank count for avg's final division, else 1.
    pub postdiv: u32,
    /// Every rank's LL area, in rank order (2 to [`MAX_RANKS`]).
    pub areas: &'a [u64],
    /// This rank.
    pub rank: usize,
    /// The device address of the communicator's control block.
    pub ctl: u64,
    /// How long a wait may last, in nanoseconds (0: until aborted).
    pub timeout_ns: u64,
}

/// The arguments of one rank's LL all-gather kernel (see `gpu_kernels::ll::LL_GATHER_ENTRY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LlGatherArgs<'a> {
    /// This rank's input, `bytes` long.
    pub src: u64,
    /// The output, `nranks * bytes` long (`src` may be its block `rank`).
    pub dst: u64,
    /// Bytes per rank (at most `LL_MAX_BYTES`).
    pub bytes: usize,
    /// Every rank's LL area, in rank order (2 to [`MAX_RANKS`]).
    pub areas: &'a [u64],
    /// This rank.
    pub rank: usize,
    /// The device address of the communicator's control block.
    pub ctl: u64,
    /// How long a wait may last, in nanoseconds (0: until aborted).
    pub timeout_ns: u64,
}

/// Why the LL kernel cannot run a call, or `None` when it can: 2 to [`MAX_RANKS`] ranks, at
/// most [`LL_MAX_BYTES`] bytes, both buffers aligned to the element (`size` bytes; the kernel
/// moves 8-byte payloads, element by element where a buffer is not 8-byte aligned).
pub(crate) fn ll_refusal(nranks: usize, bytes: usize, (src, dst): (u64, u64), size: usize) -> Option<String> {
    if !(2..=MAX_RANKS).contains(&nranks) {
        return Some(format!("the LL kernel runs 2 to {MAX_RANKS} ranks, not {nranks}"));
    }
    if bytes > LL_MAX_BYTES {
        return Some(format!("the LL kernel runs at most {LL_MAX_BYTES} bytes, not {bytes}"));
    }
    let size = size.max(1) as u64;
    if src % size != 0 || dst % size != 0 {
        return Some(format!("buffers {src:#x}, {dst:#x} not aligned to their {size}-byte elements"));
    }
    None
}

fn param<T>(value: &T) -> *mut c_void {
    (value as *const T).cast_mut().cast()
}

impl Kernels {
    /// Checks, without launching, that the LL kernel for `dtype` and `op` exists.
    pub(crate) fn ll_ready(&self, dtype: DataType, op: RedOp) -> Result<LaunchPlan> {
        let (_, limit) = self.function(EntryKind::Ll, dtype, Some(op))?;
        Ok(LaunchPlan::one_block(limit))
    }

    /// Enqueues rank `args.rank`'s kernel of an LL all-reduce (`ll_blocks` blocks; see
    /// `gpu_kernels::ll`). Every rank's kernel of the call must be enqueued, with the same
    /// count, type and operator, or the others wait (until their timeout).
    ///
    /// # Safety
    /// As for [`Kernels::launch_prim`] for `src` and `dst` (`count` elements each; with
    /// `scatter`, `src` `nranks * count` and `dst` `count`, or `src`'s block `rank`); every area
    /// is `gpu_kernels::ll::LL_AREA_BYTES` of a live allocation accessible from this context,
    /// used by no one but this communicator's LL kernels, which run on this rank one after the
    /// other in call order.
    pub(crate) unsafe fn launch_ll(
        &self,
        stream: &CudaStream,
        dtype: DataType,
        op: RedOp,
        args: &LlArgs<'_>,
    ) -> Result<()> {
        let n = args.areas.len();
        let bytes = args.count.saturating_mul(dtype.size());
        if let Some(why) = ll_refusal(n, bytes, (args.src, args.dst), dtype.size()) {
            return Err(Error::Internal { reason: why });
        }
        if args.rank >= n {
            return Err(Error::Internal {
                reason: format!("LL all-reduce: rank {} of {n}", args.rank),
            });
        }
        let plan = ll_plan(self.ll_ready(dtype, op)?, bytes);
        if args.count == 0 {
            return Ok(());
        }
        let (f, _) = self.function(EntryKind::Ll, dtype, Some(op))?;
        let mut a = [0u64; MAX_RANKS];
        a[..n].copy_from_slice(args.areas);
        let (count, nranks, rank) = (args.count as u64, n as u32, args.rank as u32);
        let scatter = u32::from(args.scatter);
        let mut params = [std::ptr::null_mut(); MAX_RANKS + 9];
        params[..5].copy_from_slice(&[
            param(&args.src),
            param(&args.dst),
            param(&count),
            param(&scatter),
            param(&args.postdiv),
        ]);
        for (p, v) in params[5..5 + MAX_RANKS].iter_mut().zip(&a) {
            *p = param(v);
        }
        params[MAX_RANKS + 5..].copy_from_slice(&[
            param(&nranks),
            param(&rank),
            param(&args.ctl),
            param(&args.timeout_ns),
        ]);
        // SAFETY: `ringccl_ll_*(u64 src, u64 dst, u64 count, u32 scatter, u32 postdiv, u64 × MAX_RANKS,
        // u32 nranks, u32 rank, u64 ctl, u64 timeout_ns)`; the caller guarantees the memory.
        unsafe { self.launch(stream, f, plan, &mut params) }
    }

    /// Whether the LL all-gather kernel is loaded.
    pub(crate) fn has_ll_gather(&self) -> bool {
        self.ll_gather.is_some()
    }

    /// Enqueues rank `args.rank`'s kernel of an LL all-gather (`ll_blocks` blocks; see
    /// `gpu_kernels::ll::LL_GATHER_ENTRY`). Every rank's kernel of the call must be enqueued,
    /// with the same byte count, or the others wait (until their timeout).
    ///
    /// # Safety
    /// `src` is `bytes` and `dst` `nranks * bytes` of live device memory of this context
    /// (`src` may be `dst`'s block `rank`, no other overlap), alive until the kernel has run;
    /// the areas as for [`Kernels::launch_ll`].
    pub(crate) unsafe fn launch_ll_gather(&self, stream: &CudaStream, args: &LlGatherArgs<'_>) -> Result<()> {
        let n = args.areas.len();
        if let Some(why) = ll_refusal(n, args.bytes, (args.src, args.dst), 1) {
            return Err(Error::Internal { reason: why });
        }
        if args.rank >= n {
            return Err(Error::Internal {
                reason: format!("LL all-gather: rank {} of {n}", args.rank),
            });
        }
        let Some((f, limit)) = &self.ll_gather else {
            return Err(Error::Kernel {
                reason: format!("entry point {} not found", gpu_kernels::ll::LL_GATHER_ENTRY),
            });
        };
        if args.bytes == 0 {
            return Ok(());
        }
        let mut a = [0u64; MAX_RANKS];
        a[..n].copy_from_slice(args.areas);
        let (bytes, nranks, rank) = (args.bytes as u64, n as u32, args.rank as u32);
        let mut params = [std::ptr::null_mut(); MAX_RANKS + 7];
        params[..3].copy_from_slice(&[param(&args.src), param(&args.dst), param(&bytes)]);
        for (p, v) in params[3..3 + MAX_RANKS].iter_mut().zip(&a) {
            *p = param(v);
        }
        params[MAX_RANKS + 3..].copy_from_slice(&[
            param(&nranks),
            param(&rank),
            param(&args.ctl),
            param(&args.timeout_ns),
        ]);
        let plan = ll_plan(LaunchPlan::one_block(*limit), args.bytes);
        // SAFETY: `ringccl_ll_gather(u64 src, u64 dst, u64 bytes, u64 × MAX_RANKS, u32 nranks,
        // u32 rank, u64 ctl, u64 timeout_ns)`; the caller guarantees the memory.
        unsafe { self.launch(stream, f, plan, &mut params) }
    }
}

/// The grid of an LL call moving `bytes` per peer, from its one-block shape `one`:
/// `gpu_kernels::ll::ll_blocks` blocks of the same threads.
fn ll_plan(one: LaunchPlan, bytes: usize) -> LaunchPlan {
    let blocks = gpu_kernels::ll::ll_blocks(bytes, one.threads as usize);
    LaunchPlan {
        blocks: u32::try_from(blocks).unwrap_or(1),
        threads: one.threads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals() {
        let b = (0x1000, 0x2000);
        assert!(ll_refusal(2, 8, b, 4).is_none());
        assert!(ll_refusal(8, LL_MAX_BYTES, (0x1000, 0x1000), 8).is_none());
        assert!(ll_refusal(2, 8, (0x1004, 0x2002), 2).is_none(), "element-aligned is enough");
        assert!(ll_refusal(1, 8, b, 4).is_some());
        assert!(ll_refusal(MAX_RANKS + 1, 8, b, 4).is_some());
        assert!(ll_refusal(2, LL_MAX_BYTES + 1, b, 4).is_some());
        assert!(ll_refusal(2, 8, (0x1004, 0x2000), 8).is_some());
        assert!(ll_refusal(2, 8, (0x1000, 0x2002), 4).is_some());
    }
}
