//! Launching ringccl's kernels: the launch shape ([`LaunchPlan`]), the kernel arguments of each
//! primitive ([`Prim`]) and of the one-shot all-reduce ([`OneShotArgs`]), and one launcher
//! (`cuLaunchKernel` with the argument block, no per-launch allocation).
//!
//! The driver reads no policy: how many blocks a launch may use is the caller's argument
//! (`max_blocks`, from [`crate::plan::tuning::BlockCaps`]).

use std::ffi::c_void;

use cudarc::driver::{result, CudaFunction, CudaStream};
use gpu_kernels::oneshot::MAX_RANKS;
use gpu_kernels::prim::MAX_SRCS;
use gpu_kernels::EntryKind;

use super::Kernels;
use crate::{DataType, Error, RedOp, Result};

/// Threads per block the launchers use when the function allows it.
pub const DEFAULT_THREADS: u32 = 512;
/// Bytes one thread moves per loop iteration: a 16-byte vector, unrolled 4 times.
pub const BYTES_PER_THREAD_ITERATION: u64 = 16 * 4;

/// A 1-D launch shape: `blocks` × `threads`.
///
/// ```
/// use ringccl::internals::driver::launch::LaunchPlan;
/// // 1 GiB, at most 264 blocks: 264 blocks of 512 threads.
/// let p = LaunchPlan::new(1 << 30, 1024, 264);
/// assert_eq!((p.blocks, p.threads), (264, 512));
/// // A function limited to 384 threads per block gets 384.
/// assert_eq!(LaunchPlan::new(1 << 30, 384, 64).threads, 384);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchPlan {
    /// Blocks in the grid (≥ 1).
    pub blocks: u32,
    /// Threads per block (≥ 1, a multiple of 32 when the limit allows).
    pub threads: u32,
}

impl LaunchPlan {
    /// The shape for `count_bytes` bytes (the size of one destination) on a function that
    /// allows `max_threads` threads per block: [`DEFAULT_THREADS`] threads clamped to the
    /// limit (rounded down to whole warps), and enough blocks for each thread to do 4 16-byte
    /// vectors, at most `max_blocks` (at least 1). The kernels are grid-stride loops, so any
    /// shape is correct; this one is fast.
    pub fn new(count_bytes: u64, max_threads: u32, max_blocks: u32) -> Self {
        let threads = Self::threads(max_threads);
        let per_block = BYTES_PER_THREAD_ITERATION * u64::from(threads);
        let wanted = count_bytes.div_ceil(per_block).max(1);
        let blocks = u32::try_from(wanted.min(u64::from(max_blocks.max(1)))).unwrap_or(1);
        LaunchPlan { blocks, threads }
    }

    /// One block of [`DEFAULT_THREADS`] threads, clamped like [`LaunchPlan::new`].
    pub fn one_block(max_threads: u32) -> Self {
        LaunchPlan {
            blocks: 1,
            threads: Self::threads(max_threads),
        }
    }

    fn threads(max_threads: u32) -> u32 {
        let threads = DEFAULT_THREADS.min(max_threads.max(1));
        if threads >= 32 {
            threads - threads % 32
        } else {
            threads
        }
    }
}

/// One primitive step as kernel arguments (device addresses). A second destination of `None`
/// is not written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prim<'a> {
    /// `dst0 = src` (and `dst1`).
    Copy {
        src: u64,
        dst0: u64,
        dst1: Option<u64>,
    },
    /// `dst0 = finish(a ⊕ b)` (and `dst1`).
    ReduceCopy {
        a: u64,
        b: u64,
        dst0: u64,
        dst1: Option<u64>,
        postdiv: u32,
    },
    /// `dst = finish(srcs[0] ⊕ … ⊕ srcs[k-1])`, 2 to [`MAX_SRCS`] sources.
    Reduce {
        srcs: &'a [u64],
        dst: u64,
        postdiv: u32,
    },
}

/// The arguments of one rank's one-shot all-reduce kernel (see `gpu_kernels::oneshot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OneShotArgs<'a> {
    /// Every rank's input, in rank order (2 to [`MAX_RANKS`]).
    pub srcs: &'a [u64],
    /// This rank's output.
    pub dst: u64,
    /// Staging for an in-place call (`count` elements of scratch), else `None`.
    pub tmp: Option<u64>,
    /// Elements.
    pub count: usize,
    /// The rank count for avg's final division, else 1.
    pub postdiv: u32,
    /// Every rank's flag array, in rank order.
    pub flags: &'a [u64],
    /// This rank.
    pub rank: usize,
    /// The device address of the communicator's control block (see `gpu_kernels::oneshot`).
    pub ctl: u64,
    /// How long a wait at the barrier may last, in nanoseconds (0: until aborted).
    pub timeout_ns: u64,
    /// This rank's input, which the kernel first copies into `srcs[rank]` (ranks in other
    /// processes, which read the copy), else `None`.
    pub stage: Option<u64>,
    /// Per rank `q`, where `q` reads this rank's input in its own process (this rank's
    /// registered input as `q` mapped it), or 0: `q` reads `srcs[rank]` as it mapped this
    /// rank's scratch. Empty: all 0 (see `gpu_kernels::oneshot::PUBLISHED`).
    pub publish: &'a [u64],
}

/// The arguments of one rank's two-shot all-reduce kernel (see `gpu_kernels::oneshot`, "The
/// two-shot all-reduce").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TwoShotArgs<'a> {
    /// Every rank's input, in rank order (2 to [`MAX_RANKS`]).
    pub srcs: &'a [u64],
    /// Every rank's output, in rank order.
    pub dsts: &'a [u64],
    /// Elements.
    pub count: usize,
    /// The rank count for avg's final division, else 1.
    pub postdiv: u32,
    /// Every rank's two-shot flag region, in rank order.
    pub flags: &'a [u64],
    /// This rank.
    pub rank: usize,
    /// Blocks (the same on every rank; 1 to `MAX_TWO_SHOT_BLOCKS`).
    pub blocks: u32,
    /// The device address of the communicator's control block.
    pub ctl: u64,
    /// How long a wait at a barrier may last, in nanoseconds (0: until aborted).
    pub timeout_ns: u64,
    /// This rank's input and output, when `srcs[rank]` and `dsts[rank]` are copies of them
    /// that the kernel fills first and empties last (ranks in other processes; 0 for a side
    /// that is not staged), else `None`.
    pub stage: Option<(u64, u64)>,
    /// The collective and its root (`gpu_kernels::oneshot::what`; 0 where it has none): the
    /// all-reduce, or another collective on the same barriers, whose `count` may be one rank's
    /// share.
    pub what: (u32, u32),
}

/// The arguments of one bounded wait (`gpu_kernels::oneshot::WAIT_ENTRY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaitArgs {
    /// The flag word waited on.
    pub flag: u64,
    /// The value it must reach.
    pub value: u64,
    /// The device address of the control block.
    pub ctl: u64,
    /// How long the wait may last, in nanoseconds (0: until aborted).
    pub timeout_ns: u64,
    /// The status slot the wait reports in.
    pub slot: u32,
    /// The rank whose signal is awaited (reported on a timeout).
    pub peer: u32,
}

/// The entry points of a two-shot kernel running `what` (`gpu_kernels::oneshot::what`): the
/// all-reduce's own, or those of the other collectives.
fn twoshot_kind(what: u32) -> EntryKind {
    if what == gpu_kernels::oneshot::what::ALL_REDUCE {
        EntryKind::TwoShot
    } else {
        EntryKind::TwoShotColl
    }
}

/// A pointer to one kernel argument, as `cuLaunchKernel` takes it.
fn param<T>(value: &T) -> *mut c_void {
    (value as *const T).cast_mut().cast()
}

impl Kernels {
    /// Enqueues one primitive on `stream` over `count` elements of `dtype`, with at most
    /// `max_blocks` blocks. A count of 0 launches nothing.
    ///
    /// # Safety
    /// Every address must be device memory accessible from this context, of at least `count`
    /// elements of `dtype`, alive until the kernel has run; destinations must not overlap a
    /// source or each other except exactly (same address).
    pub(crate) unsafe fn launch_prim(
        &self,
        stream: &CudaStream,
        dtype: DataType,
        op: RedOp,
        prim: Prim<'_>,
        count: usize,
        max_blocks: u32,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let n = count as u64;
        let bytes = n.saturating_mul(dtype.size() as u64);
        match prim {
            Prim::Copy { src, dst0, dst1 } => {
                let (f, limit) = self.function(EntryKind::Copy, dtype, None)?;
                let dst1 = dst1.unwrap_or(0);
                let mut params = [param(&src), param(&dst0), param(&dst1), param(&n)];
                // SAFETY: `ringccl_copy_*(u64 src, u64 dst0, u64 dst1, u64 count)`; the caller
                // guarantees the memory.
                unsafe { self.launch(stream, f, LaunchPlan::new(bytes, limit, max_blocks), &mut params) }
            }
            Prim::ReduceCopy {
                a,
                b,
                dst0,
                dst1,
                postdiv,
            } => {
                let (f, limit) = self.function(EntryKind::ReduceCopy, dtype, Some(op))?;
                let dst1 = dst1.unwrap_or(0);
                let mut params = [
                    param(&a),
                    param(&b),
                    param(&dst0),
                    param(&dst1),
                    param(&n),
                    param(&postdiv),
                ];
                // SAFETY: `ringccl_reduce_copy_*(u64 × 5, u32)`; the caller guarantees the memory.
                unsafe { self.launch(stream, f, LaunchPlan::new(bytes, limit, max_blocks), &mut params) }
            }
            Prim::Reduce { srcs, dst, postdiv } => {
                if !(2..=MAX_SRCS).contains(&srcs.len()) {
                    return Err(Error::Internal {
                        reason: format!("reduce takes 2 to {MAX_SRCS} sources, not {}", srcs.len()),
                    });
                }
                let (f, limit) = self.function(EntryKind::Reduce, dtype, Some(op))?;
                let mut s = [0u64; MAX_SRCS];
                s[..srcs.len()].copy_from_slice(srcs);
                let nsrc = srcs.len() as u32;
                let mut params = [std::ptr::null_mut(); MAX_SRCS + 4];
                for (p, v) in params.iter_mut().zip(&s) {
                    *p = param(v);
                }
                params[MAX_SRCS..].copy_from_slice(&[param(&nsrc), param(&dst), param(&n), param(&postdiv)]);
                // SAFETY: `ringccl_reduce_*(u64 × MAX_SRCS, u32 nsrc, u64 dst, u64 count, u32
                // postdiv)`; the caller guarantees the memory.
                unsafe { self.launch(stream, f, LaunchPlan::new(bytes, limit, max_blocks), &mut params) }
            }
        }
    }

    /// Checks, without launching, that the one-shot kernel for `dtype` and `op` exists and can
    /// run `nranks` ranks (so a caller can check every rank before launching any).
    pub(crate) fn oneshot_ready(&self, dtype: DataType, op: RedOp, nranks: usize) -> Result<LaunchPlan> {
        let (_, limit) = self.function(EntryKind::OneShot, dtype, Some(op))?;
        let plan = LaunchPlan::one_block(limit);
        if !(2..=MAX_RANKS).contains(&nranks) || (plan.threads as usize) < nranks {
            return Err(Error::Internal {
                reason: format!(
                    "the one-shot kernel runs 2 to {MAX_RANKS} ranks with at least one thread \
                     each ({nranks} ranks, {} threads per block)",
                    plan.threads
                ),
            });
        }
        Ok(plan)
    }

    /// Enqueues rank `args.rank`'s kernel of a one-shot all-reduce (one block; see
    /// `gpu_kernels::oneshot`). Every rank's kernel of the call must be enqueued, with the same
    /// sources, count, type and operator, or the others wait at the device barrier.
    ///
    /// # Safety
    /// As for [`Kernels::launch_prim`], for every source, `dst` and `tmp` (`count` elements
    /// each); every flag array is `gpu_kernels::oneshot::FLAG_WORDS` `u64` of a live allocation
    /// accessible from this context, used by no one but this communicator's one-shot kernels.
    pub(crate) unsafe fn launch_oneshot(
        &self,
        stream: &CudaStream,
        dtype: DataType,
        op: RedOp,
        args: &OneShotArgs<'_>,
    ) -> Result<()> {
        let n = args.srcs.len();
        if args.flags.len() != n || args.rank >= n || !(args.publish.is_empty() || args.publish.len() == n) {
            return Err(Error::Internal {
                reason: format!(
                    "one-shot all-reduce: {n} sources, {} flag arrays, {} published addresses, rank {}",
                    args.flags.len(),
                    args.publish.len(),
                    args.rank
                ),
            });
        }
        let plan = self.oneshot_ready(dtype, op, n)?;
        if args.count == 0 {
            return Ok(());
        }
        let (f, _) = self.function(EntryKind::OneShot, dtype, Some(op))?;
        let mut s = [0u64; MAX_RANKS];
        s[..n].copy_from_slice(args.srcs);
        let mut fl = [0u64; MAX_RANKS];
        fl[..n].copy_from_slice(args.flags);
        let (nsrc, tmp, count, my_flags, rank) = (
            n as u32,
            args.tmp.unwrap_or(0),
            args.count as u64,
            args.flags[args.rank],
            args.rank as u32,
        );
        let stage = args.stage.unwrap_or(0);
        let mut publish = [0u64; MAX_RANKS];
        publish[..args.publish.len()].copy_from_slice(args.publish);
        let mut params = [std::ptr::null_mut(); 3 * MAX_RANKS + 10];
        for (p, v) in params.iter_mut().zip(&s) {
            *p = param(v);
        }
        params[MAX_RANKS..MAX_RANKS + 6].copy_from_slice(&[
            param(&nsrc),
            param(&args.dst),
            param(&tmp),
            param(&count),
            param(&args.postdiv),
            param(&my_flags),
        ]);
        for (p, v) in params[MAX_RANKS + 6..].iter_mut().zip(&fl) {
            *p = param(v);
        }
        params[2 * MAX_RANKS + 6] = param(&rank);
        params[2 * MAX_RANKS + 7] = param(&args.ctl);
        params[2 * MAX_RANKS + 8] = param(&args.timeout_ns);
        params[2 * MAX_RANKS + 9] = param(&stage);
        for (p, v) in params[2 * MAX_RANKS + 10..].iter_mut().zip(&publish) {
            *p = param(v);
        }
        // SAFETY: `ringccl_oneshot_*(u64 × MAX_RANKS, u32 nsrc, u64 dst, u64 tmp, u64 count,
        // u32 postdiv, u64 my_flags, u64 × MAX_RANKS, u32 rank, u64 ctl, u64 timeout_ns, u64
        // stage, u64 × MAX_RANKS publish)`; the caller guarantees the memory.
        unsafe { self.launch(stream, f, plan, &mut params) }
    }

    /// Checks, without launching, that the two-shot kernel for `dtype` and `op` exists and can
    /// run `nranks` ranks in `blocks` blocks.
    pub(crate) fn twoshot_ready(
        &self,
        dtype: DataType,
        op: RedOp,
        nranks: usize,
        blocks: u32,
        what: u32,
    ) -> Result<LaunchPlan> {
        let (_, limit) = self.function(twoshot_kind(what), dtype, Some(op))?;
        let plan = LaunchPlan {
            blocks,
            threads: LaunchPlan::one_block(limit).threads,
        };
        let max = gpu_kernels::oneshot::MAX_TWO_SHOT_BLOCKS;
        if !(2..=MAX_RANKS).contains(&nranks) || (plan.threads as usize) < nranks || !(1..=max).contains(&(blocks as usize)) {
            return Err(Error::Internal {
                reason: format!(
                    "the two-shot kernel runs 2 to {MAX_RANKS} ranks in 1 to {max} blocks of at \
                     least one thread per rank ({nranks} ranks, {blocks} blocks of {} threads)",
                    plan.threads
                ),
            });
        }
        Ok(plan)
    }

    /// Enqueues rank `args.rank`'s kernel of a two-shot all-reduce (or of another collective on
    /// its barriers, `args.what`).
    /// Every rank's kernel of the call must be enqueued, with the same buffers, count, blocks,
    /// collective, type and operator, or the others wait at the device barriers.
    ///
    /// # Safety
    /// As for [`Kernels::launch_prim`], for every source and destination (`count` elements
    /// each for the all-reduce; for another collective, the lengths `gpu_kernels::oneshot::what`
    /// names in units of `count`; a rank's destination equals its source, is the shard of it
    /// NCCL's in-place layout names, or overlaps nothing); every flag region is
    /// `gpu_kernels::oneshot::TWO_SHOT_FLAG_WORDS` `u64` of a live allocation accessible from
    /// this context, used by no one but this communicator's two-shot kernels.
    pub(crate) unsafe fn launch_twoshot(
        &self,
        stream: &CudaStream,
        dtype: DataType,
        op: RedOp,
        args: &TwoShotArgs<'_>,
    ) -> Result<()> {
        let n = args.srcs.len();
        if args.flags.len() != n || args.dsts.len() != n || args.rank >= n || args.what.1 as usize >= n {
            return Err(Error::Internal {
                reason: format!(
                    "two-shot kernel: {n} sources, {} destinations, {} flag regions, rank {}, root {}",
                    args.dsts.len(),
                    args.flags.len(),
                    args.rank,
                    args.what.1
                ),
            });
        }
        let plan = self.twoshot_ready(dtype, op, n, args.blocks, args.what.0)?;
        if args.count == 0 {
            return Ok(());
        }
        let (f, _) = self.function(twoshot_kind(args.what.0), dtype, Some(op))?;
        let (mut s, mut d, mut fl) = ([0u64; MAX_RANKS], [0u64; MAX_RANKS], [0u64; MAX_RANKS]);
        s[..n].copy_from_slice(args.srcs);
        d[..n].copy_from_slice(args.dsts);
        fl[..n].copy_from_slice(args.flags);
        let (nsrc, count, my_flags, rank) = (n as u32, args.count as u64, args.flags[args.rank], args.rank as u32);
        let (stage_in, stage_out) = args.stage.unwrap_or((0, 0));
        let mut params = [std::ptr::null_mut(); 3 * MAX_RANKS + 11];
        let (ps, rest) = params.split_at_mut(MAX_RANKS);
        for (p, v) in ps.iter_mut().zip(&s) {
            *p = param(v);
        }
        rest[0] = param(&nsrc);
        for (p, v) in rest[1..=MAX_RANKS].iter_mut().zip(&d) {
            *p = param(v);
        }
        let rest = &mut rest[MAX_RANKS + 1..];
        rest[..3].copy_from_slice(&[param(&count), param(&args.postdiv), param(&my_flags)]);
        for (p, v) in rest[3..3 + MAX_RANKS].iter_mut().zip(&fl) {
            *p = param(v);
        }
        rest[3 + MAX_RANKS..].copy_from_slice(&[
            param(&rank),
            param(&args.ctl),
            param(&args.timeout_ns),
            param(&stage_in),
            param(&stage_out),
            param(&args.what.0),
            param(&args.what.1),
        ]);
        // SAFETY: `ringccl_twoshot_*(u64 × MAX_RANKS, u32 nsrc, u64 × MAX_RANKS, u64 count, u32
        // postdiv, u64 my_flags, u64 × MAX_RANKS, u32 rank, u64 ctl, u64 timeout_ns, u64
        // stage_in, u64 stage_out, u32 what, u32 root)`; the caller guarantees the memory.
        unsafe { self.launch(stream, f, plan, &mut params) }
    }

    /// Enqueues a bounded wait on `stream`: the stream's later work starts once `*flag >=
    /// value`, or once the wait gave up (abort word, timeout: status in the control block).
    ///
    /// # Safety
    /// `args.flag` is a `u64` and `args.ctl` a control block (`gpu_kernels::oneshot::CTL_WORDS`
    /// words), both accessible from this context and alive until the wait has run.
    pub(crate) unsafe fn launch_wait(&self, stream: &CudaStream, args: &WaitArgs) -> Result<()> {
        let f = &self.wait;
        let mut params = [
            param(&args.flag),
            param(&args.value),
            param(&args.ctl),
            param(&args.timeout_ns),
            param(&args.slot),
            param(&args.peer),
        ];
        let plan = LaunchPlan {
            blocks: 1,
            threads: 32,
        };
        // SAFETY: `ringccl_wait_geq(u64 flag, u64 value, u64 ctl, u64 timeout_ns, u32 slot,
        // u32 peer)`; the caller guarantees the memory.
        unsafe { self.launch(stream, f, plan, &mut params) }
    }

    /// Whether the point-to-point kernel is loaded (`gpu_kernels::p2p`).
    pub(crate) fn has_p2p(&self) -> bool {
        self.p2p.is_some()
    }

    /// Enqueues the point-to-point kernel on `stream` with `args` (its one parameter, by
    /// value), `args.blocks()` blocks of up to 512 threads.
    ///
    /// # Safety
    /// Every address in `args` is valid as `gpu_kernels::p2p::P2pArgs` says, accessible from
    /// this context and alive until the kernel has run; the header and slots are used by the
    /// point-to-point kernels of one communicator only.
    pub(crate) unsafe fn launch_p2p(&self, stream: &CudaStream, args: &gpu_kernels::p2p::P2pArgs) -> Result<()> {
        let Some((f, limit)) = &self.p2p else {
            return Err(Error::Kernel {
                reason: format!("entry point {} not found", gpu_kernels::p2p::P2P_ENTRY),
            });
        };
        let blocks = args.blocks();
        if blocks == 0 {
            return Ok(());
        }
        // A group that fits the small parameter launches with it: the same kernel, a sixth of
        // the bytes to copy into the launch.
        if let (Some((fs, limit)), Some(small)) = (&self.p2p_small, args.small()) {
            let plan = LaunchPlan {
                blocks,
                threads: LaunchPlan::one_block(*limit).threads,
            };
            let mut params = [param(&small)];
            // SAFETY: `ringccl_p2p_small(P2pArgsSmall args)`, one `#[repr(C)]` parameter
            // passed by value, the same group as `args` (`P2pArgs::small`); the caller
            // guarantees the memory.
            return unsafe { self.launch(stream, fs, plan, &mut params) };
        }
        let plan = LaunchPlan {
            blocks,
            threads: LaunchPlan::one_block(*limit).threads,
        };
        let mut params = [param(args)];
        // SAFETY: `ringccl_p2p(P2pArgs args)`, one `#[repr(C)]` parameter passed by value
        // (the driver copies its bytes); the caller guarantees the memory.
        unsafe { self.launch(stream, f, plan, &mut params) }
    }

    /// The one launcher: makes the stream's context current and calls `cuLaunchKernel`.
    ///
    /// # Safety
    /// `params` points at values matching `f`'s parameter list, which the kernel may use as
    /// the caller's contract says.
    pub(super) unsafe fn launch(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        plan: LaunchPlan,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", self.rank, e))?;
        // SAFETY: `f` is a live function of this context's module; `params` as promised.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (plan.blocks, 1, 1),
                (plan.threads, 1, 1),
                0,
                stream.cu_stream(),
                params,
            )
        }
        .map_err(|e| Error::cuda("cuLaunchKernel", self.rank, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_clamp_to_the_function_limit_in_whole_warps() {
        for (limit, want) in [
            (1024, 512),
            (512, 512),
            (384, 384),
            (400, 384),
            (255, 224),
            (32, 32),
            (20, 20),
            (0, 1),
        ] {
            assert_eq!(LaunchPlan::new(1 << 20, limit, 264).threads, want, "limit {limit}");
            assert_eq!(LaunchPlan::one_block(limit).threads, want, "limit {limit}");
        }
    }

    #[test]
    fn blocks_follow_size_then_cap() {
        // One block handles 64 B × threads per iteration.
        let per_block = BYTES_PER_THREAD_ITERATION * 512;
        assert_eq!(LaunchPlan::new(1, 1024, 264).blocks, 1);
        assert_eq!(LaunchPlan::new(0, 1024, 264).blocks, 1);
        assert_eq!(LaunchPlan::new(per_block, 1024, 264).blocks, 1);
        assert_eq!(LaunchPlan::new(per_block + 1, 1024, 264).blocks, 2);
        assert_eq!(LaunchPlan::new(per_block * 100, 1024, 264).blocks, 100);
        assert_eq!(LaunchPlan::new(per_block * 100, 1024, 64).blocks, 64);
        assert_eq!(LaunchPlan::new(u64::MAX, 1024, 264).blocks, 264);
        // Fewer threads per block → more blocks for the same bytes.
        assert_eq!(LaunchPlan::new(per_block * 10, 256, 264).blocks, 20);
        // A cap of 0 still launches one block.
        assert_eq!(LaunchPlan::new(u64::MAX, 1024, 0).blocks, 1);
    }

    #[test]
    fn params_point_at_the_values() {
        let (a, b) = (7u64, 3u32);
        // SAFETY: reading back the values just pointed at.
        unsafe {
            assert_eq!(*param(&a).cast::<u64>(), 7);
            assert_eq!(*param(&b).cast::<u32>(), 3);
        }
    }
}
