//! The executor of the LL push all-reduce among processes ([`crate::plan::call::CallPlan::ProcessLl`];
//! also the LL all-gather and reduce-scatter, `ProcessLlGather`, `ProcessLlReduceScatter`,
//! and the broadcast and reduce on the all-reduce's kernel, `ProcessLlBroadcast`,
//! `ProcessLlReduce`, [`Rooted`]; kernel `gpu_kernels::ll`): ONE kernel per rank, which reads the input straight from the
//! caller's buffer (no staging copy into the scratch), stores it as packets with the flag
//! inside into every peer's LL area (in the peer's flag area, mapped by this process), and
//! folds the peers' packets in rank order into the output. One exchange per call; the epoch
//! lives on the device, so the call can be captured into a CUDA graph.
//!
//! Each rank's LL kernels must run in call order (the parity double-buffering relies on it):
//! the kernel is enqueued after the end of this rank's previous call (the communicator's end
//! event), as every call among processes is.

use cudarc::driver::CudaStream;

use super::process::ProcessCall;
use super::{internal, partly_enqueued, RankPtrs};
use crate::driver::ll::{ll_refusal, LlArgs, LlGatherArgs};
use crate::{DataType, RedOp, Result};
use gpu_kernels::oneshot::MAX_RANKS;

/// This rank's (input, output) of an LL all-reduce (`scatter` false: the output is the
/// receive buffer, or in place the send buffer) or reduce-scatter of `count` elements of
/// `size` bytes per rank (`scatter`: the receive buffer, or in place block `rank` of the send
/// buffer).
fn reduce_bufs(mine: RankPtrs, rank: usize, count: usize, size: usize, scatter: bool) -> (u64, u64) {
    let dst = match mine.recv {
        0 if scatter => mine.send.wrapping_add((rank * count * size) as u64),
        0 => mine.send,
        recv => recv,
    };
    (mine.send, dst)
}

/// A broadcast or reduce on the LL all-reduce kernel. Every rank runs the all-reduce, so every
/// rank pushes packets to every peer and the parity double-buffering stays safe as for the
/// all-reduce (a rank cannot start call `k + 2` before every peer's packets of call `k + 1`
/// have reached it, so every peer is done reading call `k`'s):
/// - a broadcast: the root's input, as bytes (`u8`, summed), with every other rank's input its
///   zeros ([`Windows::ll_zeros`]): `x + 0 + … + 0` is `x` exactly for integers, so every
///   rank gets the root's bytes, whatever their type;
/// - a reduce: the all-reduce itself, a non-root's output its sink ([`Windows::ll_sink`]).
///
/// [`Windows::ll_zeros`]: crate::transport::ipc::Windows::ll_zeros
/// [`Windows::ll_sink`]: crate::transport::ipc::Windows::ll_sink
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rooted {
    /// A broadcast from `root`.
    Broadcast {
        /// The root.
        root: usize,
    },
    /// A reduce to `root`.
    Reduce {
        /// The root.
        root: usize,
    },
}

/// This rank's (input, output) of a [`Rooted`] call (0 where it has none: refused).
fn rooted_bufs(call: &ProcessCall<'_>, rooted: Rooted, mine: RankPtrs) -> (u64, u64) {
    let windows = &call.state.windows;
    let (zeros, sink) = (windows.ll_zeros().unwrap_or(0), windows.ll_sink().unwrap_or(0));
    let r = call.state.rank;
    let or = |p: u64, other: u64| if p != 0 { p } else { other };
    match rooted {
        // The root's output: its receive buffer, in place its send buffer, or none (its sink).
        Rooted::Broadcast { root } if r == root => (mine.send, or(mine.recv, sink)),
        Rooted::Broadcast { .. } => (zeros, mine.recv),
        Rooted::Reduce { root } if r == root => (mine.send, or(mine.recv, mine.send)),
        Rooted::Reduce { .. } => (mine.send, sink),
    }
}

/// Refuses the call on this rank when `why` says it cannot run, before anything is launched
/// (the planner chose an LL kernel for the size and rank count; the buffers must be aligned to
/// their elements, which every other kernel needs too: a misaligned element access is a GPU
/// fault). The peers' LL kernels then end at their timeout.
fn refuse(call: &ProcessCall<'_>, why: Option<String>) -> Result<()> {
    match why {
        None => Ok(()),
        Some(why) => Err(crate::Error::invalid(Some(call.state.rank), crate::Arg::Send, why)),
    }
}

/// Why this rank cannot run an LL all-gather of `bytes` per rank on `mine`, or `None`.
fn gather_refusal(call: &ProcessCall<'_>, bytes: usize, mine: RankPtrs) -> Option<String> {
    if !call.me.kernels.has_ll_gather() {
        return Some(format!(
            "the loaded kernels lack {}",
            gpu_kernels::ll::LL_GATHER_ENTRY
        ));
    }
    ll_refusal(call.state.sent.len(), bytes, (mine.send, mine.recv), 1)
}

/// The start of an LL call's issue on `stream` among `n` ranks: every rank's LL area, in rank
/// order, once the communicator is checked healthy and, eager, the stream ordered after the
/// previous call. Captured, the previous call's end (an event recorded outside the capture) is
/// not waited on, as for the one-shot kernel; the epoch lives in the LL area, so a replay meets
/// the peers' replays whatever ran before.
fn begin(call: &ProcessCall<'_>, stream: &CudaStream, n: usize) -> Result<[u64; MAX_RANKS]> {
    let mut areas = [0u64; MAX_RANKS];
    for (q, a) in areas.iter_mut().enumerate().take(n) {
        *a = call
            .state
            .windows
            .ll_area(q)
            .ok_or_else(|| internal(format!("no LL area for rank {q}")))?;
    }
    call.health.check()?;
    if !call.capturing {
        call.state.order.wait(stream, call.state.rank)?;
    }
    Ok(areas)
}

/// Enqueues this rank's LL all-gather of `bytes` per rank from `mine.send` into `mine.recv`
/// (`gpu_kernels::ll::LL_GATHER_ENTRY`), ordered as the all-reduce is; refused first where
/// it cannot run ([`gather_refusal`]).
pub(crate) fn execute_gather(
    call: &mut ProcessCall<'_>,
    mine: RankPtrs,
    bytes: usize,
    stream: &CudaStream,
) -> Result<()> {
    refuse(call, gather_refusal(call, bytes, mine))?;
    let (r, n) = call.kernel_ranks("LL all-gather")?;
    if bytes == 0 {
        return Ok(());
    }
    let areas = begin(call, stream, n)?;
    let args = LlGatherArgs {
        src: mine.send,
        dst: mine.recv,
        bytes,
        areas: &areas[..n],
        rank: r,
        ctl: call.health.ctl(),
        timeout_ns: call.health.timeout_ns(),
    };
    // SAFETY: `mine.send` is this rank's input of `bytes` and `mine.recv` its output of
    // `n * bytes` (validated by the collective; in place the input is the output's block `r`);
    // the LL areas and the order of this rank's LL kernels as for the all-reduce below.
    let launched = call
        .health
        .injected_failure(r)
        .and_then(|()| unsafe { call.me.kernels.launch_ll_gather(stream, &args) });
    after_launch(call, launched, stream)
}

/// The end of an LL call's issue, given its launch's result: eager, a failed launch fails the
/// communicator (the peers' kernels wait for this one's packets until their timeout) and a
/// launched one records the call's end; captured, neither (the error is the caller's).
fn after_launch(call: &mut ProcessCall<'_>, launched: Result<()>, stream: &CudaStream) -> Result<()> {
    let r = call.state.rank;
    match launched {
        Err(cause) if call.capturing => Err(cause),
        Err(cause) => Err(partly_enqueued(call.health, vec![r], cause)),
        Ok(()) if call.capturing => Ok(()),
        Ok(()) => call.state.order.record(stream, r),
    }
}

/// Enqueues this rank's LL all-reduce of `count` elements (see the module docs), or with
/// `scatter` its reduce-scatter of `count` elements per rank (the same kernel: block `q` of
/// the input goes to peer `q`, `gpu_kernels::ll`'s last section); refused first where it
/// cannot run (`ll_refusal`).
pub(crate) fn execute(
    call: &mut ProcessCall<'_>,
    dtype: DataType,
    op: RedOp,
    mine: RankPtrs,
    (count, scatter): (usize, bool),
    stream: &CudaStream,
) -> Result<()> {
    let what = if scatter { "LL reduce-scatter" } else { "LL all-reduce" };
    let bufs = reduce_bufs(mine, call.state.rank, count, dtype.size(), scatter);
    let bytes = count.saturating_mul(dtype.size());
    refuse(call, ll_refusal(call.state.sent.len(), bytes, bufs, dtype.size()))?;
    // SAFETY: `bufs` are this rank's buffers of `count` elements, or with `scatter` `n * count`
    // and `count` (in place, block `r` of the input) (validated by the collective).
    unsafe { launch_reduce(call, what, (dtype, op), bufs, (count, scatter), stream) }
}

/// Enqueues this rank's part of the [`Rooted`] call of `count` elements of `dtype` (a
/// broadcast: bytes, `u8` and `Sum`) on the LL all-reduce kernel; refused first where this
/// rank has no input or output, or where `ll_refusal` refuses them.
pub(crate) fn execute_rooted(
    call: &mut ProcessCall<'_>,
    rooted: Rooted,
    (dtype, op): (DataType, RedOp),
    mine: RankPtrs,
    count: usize,
    stream: &CudaStream,
) -> Result<()> {
    let what = match rooted {
        Rooted::Broadcast { .. } => "LL broadcast",
        Rooted::Reduce { .. } => "LL reduce",
    };
    let bufs = rooted_bufs(call, rooted, mine);
    let why = if bufs.0 == 0 || bufs.1 == 0 {
        Some(format!("{rooted:?} on the LL kernel without an input or an output on this rank"))
    } else {
        ll_refusal(call.state.sent.len(), count.saturating_mul(dtype.size()), bufs, dtype.size())
    };
    refuse(call, why)?;
    // SAFETY: the root's input and output are its buffers of `count` elements (validated by the
    // collective; its output may be its input, or its sink); a non-root's input is its send
    // buffer (a reduce) or its zeros (a broadcast), its output its receive buffer (a
    // broadcast) or its sink (a reduce), each `LL_MAX_BYTES` of its flag area, at least
    // `count` elements (`ll_refusal`), which no other kernel touches.
    unsafe { launch_reduce(call, what, (dtype, op), bufs, (count, false), stream) }
}

/// Enqueues this rank's LL all-reduce kernel of `count` elements from `src` into `dst` (with
/// `scatter`, its reduce-scatter of `count` elements per rank).
///
/// # Safety
/// `src` and `dst` are device memory of this rank's context of `count` elements, or with
/// `scatter` `n * count` and `count` (`dst` may be `src`, or its block `rank`), alive until the
/// kernel has run.
unsafe fn launch_reduce(
    call: &mut ProcessCall<'_>,
    what: &str,
    (dtype, op): (DataType, RedOp),
    (src, dst): (u64, u64),
    (count, scatter): (usize, bool),
    stream: &CudaStream,
) -> Result<()> {
    let (r, n) = call.kernel_ranks(what)?;
    if count == 0 {
        return Ok(());
    }
    call.me.kernels.ll_ready(dtype, op)?;
    let areas = begin(call, stream, n)?;
    // The rank count, as the one-shot kernel has it (only `avg`'s finish uses it).
    let postdiv = u32::try_from(n).unwrap_or(u32::MAX);
    let args = LlArgs {
        src,
        dst,
        count,
        scatter,
        postdiv,
        areas: &areas[..n],
        rank: r,
        ctl: call.health.ctl(),
        timeout_ns: call.health.timeout_ns(),
    };
    // SAFETY: `src` and `dst` as the caller promises; every LL area is a rank's flag area's LL part, mapped for the
    // communicator's life and used only by its LL kernels, which on this rank run in call
    // order (the end of the previous call is waited for above, or, captured, the caller orders
    // the graph's launches); the control block is the communicator's.
    let launched = call
        .health
        .injected_failure(r)
        .and_then(|()| unsafe { call.me.kernels.launch_ll(stream, dtype, op, &args) });
    after_launch(call, launched, stream)
}
