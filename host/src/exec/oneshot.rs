//! The one-shot and two-shot executor: an all-reduce as ONE kernel per rank (see
//! `gpu_kernels::oneshot`). On each rank's stream: a wait for the communicator's previous call
//! on that rank, one kernel, and the record of the end-of-call event. No event crosses GPUs.
//! The one-shot kernel ([`Shot::One`], small messages) is one block that reads every rank's
//! input directly and meets the other ranks' kernels at a device-side barrier; the two-shot
//! kernel ([`Shot::Two`], mid sizes) is many blocks, each folding a slice of this rank's shard
//! of every input and writing it into every rank's output, each with its own barrier. The same
//! kernel runs the other collectives but gather and scatter on those barriers ([`TwoShotOf`]).
//!
//! While capturing into a CUDA graph, the previous call's end is neither waited on nor recorded
//! (see [`crate::exec`]); the kernels keep their epoch on the device, so replays of the graph
//! stay in step.
//!
//! Eager calls issue the ranks' kernels from one host thread per GPU at once
//! ([`crate::resources::rank_threads`]) where the communicator has them.
//!
//! Containment: before anything is launched, every rank's context is checked (a fault from
//! earlier work is sticky and fails the query of the rank's end event), so a dead GPU is named
//! and no other rank's kernel is left waiting for it. If a launch still fails after some ranks'
//! kernels went out, the communicator is failed at once: its abort word releases the launched
//! kernels from the barrier within microseconds (they skip their work and end), and the call
//! returns [`Error::PartlyEnqueued`](crate::Error::PartlyEnqueued).

use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::CudaStream;
use gpu_kernels::oneshot::MAX_RANKS;

use crate::resources::rank_threads::RankThreads;
use super::{internal, partly_enqueued, record, scratch_for_call, wait, Around, RankPtrs};
use crate::driver::launch::{OneShotArgs, TwoShotArgs};
use crate::driver::Kernels;
use crate::resources::Call;
use crate::{DataType, RedOp, Result};

pub use crate::plan::call::{Shot, TwoShotOf};

/// Enqueues a one-shot or two-shot (`shot`) all-reduce of `count` elements, or another
/// collective on the two-shot kernel ([`TwoShotOf`], which says what `count` counts).
/// `ptrs[r].send` is rank `r`'s input and `ptrs[r].recv` its output; `in_place` when the
/// layout is in place on every rank: each rank's one-shot result is then staged in its scratch
/// (`count` elements) until every peer is done reading its input (the two-shot kernel needs no
/// staging: what it writes into a buffer is what it read from there).
/// The caller checks that one-shot is possible (2 to `MAX_RANKS` ranks, peer access between
/// every pair: [`crate::plan::tuning::all_reduce_algorithm`]). `capturing` as for
/// [`super::ring::execute`].
///
/// Each rank's part (wait for its previous call, launch, record) runs inside
/// `around(rank, part)`, which must call `part` once and return its result: the caller's
/// per-rank bracket (cudarc's event tracking of the rank's buffers). With `threads`, an eager
/// call issues the ranks' parts at the same time, one host thread per GPU; then a failure of
/// some ranks' launches is reported with the ranks that did launch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn execute<S: AsRef<CudaStream>>(
    call: &mut Call<'_>,
    shot: Shot,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    in_place: bool,
    count: usize,
    streams: &[S],
    capturing: bool,
    threads: Option<&RankThreads>,
    around: Around<'_>,
) -> Result<()> {
    let n = call.nranks();
    if ptrs.len() != n || streams.len() != n || !(2..=MAX_RANKS).contains(&n) {
        return Err(internal(format!(
            "one-shot all-reduce of {n} ranks with {} buffers and {} streams",
            ptrs.len(),
            streams.len()
        )));
    }
    if count == 0 {
        return Ok(());
    }
    let bytes = count
        .checked_mul(dtype.size())
        .ok_or_else(|| internal(format!("{count} elements overflow")))?;
    let mut flags = [0u64; MAX_RANKS];
    let mut srcs = [0u64; MAX_RANKS];
    let mut dsts = [0u64; MAX_RANKS];
    for r in 0..n {
        let f = &call.rank(r)?.flags;
        flags[r] = match shot {
            Shot::One => f.ptr,
            Shot::Two { .. } => f.two_shot(),
        };
        srcs[r] = ptrs[r].send;
        dsts[r] = ptrs[r].recv;
    }

    let mut tmp = [None; MAX_RANKS];
    if in_place && shot == Shot::One {
        for (r, t) in tmp.iter_mut().take(n).enumerate() {
            *t = Some(scratch_for_call(call, r, bytes, capturing)?);
        }
    }

    // Everything that can fail without a launch is checked for every rank first: a one-shot
    // kernel launched on some ranks only would wait for the others at its barrier.
    let health = call.health();
    health.check()?;
    if let Err(e) = call.check_contexts(streams, capturing) {
        health.fail(e.clone());
        return Err(e);
    }
    let (ctl, timeout_ns) = (health.ctl(), health.timeout_ns());
    for r in 0..n {
        ready(&call.rank(r)?.kernels, shot, dtype, op, n)?;
        call.end_event(r)?;
    }
    let streams: Vec<&CudaStream> = streams.iter().map(AsRef::as_ref).collect();
    let call_ref: &Call<'_> = call;
    // Which ranks' kernels went out (a rank's part can still fail after its launch).
    let launched: [AtomicBool; MAX_RANKS] = Default::default();
    // One rank's part: wait for its previous call, launch, record its end; inside `around`.
    let issue = |r: usize| -> Result<()> {
        around(r, &|| {
            let stream = streams[r];
            if !capturing {
                wait(stream, call_ref.end_event(r)?, r)?;
            }
            health.injected_failure(r)?;
            let kernel = RankKernel {
                shot,
                srcs: &srcs[..n],
                dsts: &dsts[..n],
                flags: &flags[..n],
                rank: r,
                count,
                dst: ptrs[r].recv,
                tmp: tmp[r],
                stage: None,
                ctl,
                timeout_ns,
                publish: &[],
            };
            // SAFETY: the collective validated every rank's `count`-element buffers (inputs
            // and outputs on their own devices, outputs not partially overlapping inputs; for
            // the two-shot kernel's other collectives, lengths in units of `count` as `of`
            // counts them, and a rank's output equals its input, is its shard of it in NCCL's
            // in-place layout, or overlaps neither; unused buffers are 0 and never touched);
            // `tmp` is `count` elements of rank `r`'s scratch, sized above; the flag arrays
            // (one-shot) and regions (two-shot) are the communicator's, used by its one-shot
            // (two-shot) kernels only and alive until its drop waits for this call's end (as
            // is the control block); the caller checked peer access between every pair.
            unsafe { kernel.launch(&call_ref.rank(r)?.kernels, stream, dtype, op)? };
            launched[r].store(true, Ordering::Relaxed);
            if !capturing {
                record(call_ref.end_event(r)?, stream, r)?;
            }
            Ok(())
        })
    };
    // Eager calls issue the ranks' parts at once, one host thread per GPU where there are
    // threads; otherwise (and while capturing, where other threads must not touch the
    // capture) one after the other, stopping at the first failure.
    let results: Vec<Result<()>> = match threads {
        Some(t) if !capturing => t.run(n, &issue),
        _ => {
            let mut out = Vec::with_capacity(n);
            for r in 0..n {
                let res = issue(r);
                let failed = res.is_err();
                out.push(res);
                if failed {
                    break;
                }
            }
            out
        }
    };
    let Some(cause) = results.into_iter().find_map(Result::err) else {
        return Ok(());
    };
    if !capturing {
        // Best effort, as in the ring executor: the next call (and the drop) waits for what
        // went out.
        for (r, stream) in streams.iter().enumerate() {
            if let Ok(end) = call.end_event(r) {
                let _ = end.record(stream);
            }
        }
    }
    // (`run` has returned: every rank's part is done.)
    let enqueued: Vec<usize> = (0..n).filter(|&r| launched[r].load(Ordering::Relaxed)).collect();
    if enqueued.is_empty() {
        return Err(cause);
    }
    // The launched ranks' kernels wait at the barrier for the others, which will never come:
    // fail the communicator, which sets the abort word and releases them.
    call.disable_oneshot();
    Err(partly_enqueued(call.health(), enqueued, cause))
}

/// Checks that `kernels` can run `shot` for `dtype`, `op` and `n` ranks, before anything of
/// the call is launched.
pub(crate) fn ready(kernels: &Kernels, shot: Shot, dtype: DataType, op: RedOp, n: usize) -> Result<()> {
    match shot {
        Shot::One => kernels.oneshot_ready(dtype, op, n).map(drop),
        Shot::Two { blocks, of } => kernels.twoshot_ready(dtype, op, n, blocks, of.what()).map(drop),
    }
}

/// One rank's kernel of a one-shot or two-shot call, its addresses resolved: the part both
/// kinds of communicator share. They differ only in where the peers' memory comes from (direct
/// peer access to the caller's buffers in one process; the peers' scratch, mapped over CUDA
/// IPC, among processes: `exec::process`) and so in what is staged.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RankKernel<'a> {
    /// Which kernel, and for two-shot the collective.
    pub shot: Shot,
    /// Every rank's input (or its copy), in rank order.
    pub srcs: &'a [u64],
    /// Every rank's output (or where it is gathered), in rank order (two-shot).
    pub dsts: &'a [u64],
    /// Every rank's flag array (one-shot) or region (two-shot), in rank order.
    pub flags: &'a [u64],
    /// This rank.
    pub rank: usize,
    /// The kernel's count ([`TwoShotOf`] says what it counts).
    pub count: usize,
    /// This rank's output (one-shot).
    pub dst: u64,
    /// Staging of an in-place one-shot result (`count` elements of scratch).
    pub tmp: Option<u64>,
    /// This rank's input and output, where `srcs[rank]` (and, two-shot, `dsts[rank]`) are
    /// copies the kernel fills first (and empties last); the one-shot kernel uses the input.
    pub stage: Option<(u64, u64)>,
    /// The control block's device address.
    pub ctl: u64,
    /// How long a wait at a barrier may last, in nanoseconds.
    pub timeout_ns: u64,
    /// One-shot among processes: per rank `q`, where `q` reads this rank's registered input
    /// in place (0: `srcs[rank]` as `q` mapped it); empty: all 0.
    pub publish: &'a [u64],
}

impl RankKernel<'_> {
    /// Enqueues the kernel on `stream`.
    ///
    /// # Safety
    /// As for `Kernels::launch_oneshot` (one-shot) and `Kernels::launch_twoshot` (two-shot):
    /// every address is of a live allocation that `kernels`' context reaches, as long as the
    /// kernel's contract says in units of `count`, and the flag arrays are used by no one but
    /// the communicator's kernels of the same kind.
    pub(crate) unsafe fn launch(&self, kernels: &Kernels, stream: &CudaStream, dtype: DataType, op: RedOp) -> Result<()> {
        let n = self.srcs.len();
        match self.shot {
            Shot::One => {
                let args = OneShotArgs {
                    srcs: self.srcs,
                    dst: self.dst,
                    tmp: self.tmp,
                    count: self.count,
                    postdiv: TwoShotOf::AllReduce.postdiv(n),
                    flags: self.flags,
                    rank: self.rank,
                    ctl: self.ctl,
                    timeout_ns: self.timeout_ns,
                    stage: self.stage.map(|(send, _)| send),
                    publish: self.publish,
                };
                // SAFETY: the caller's contract.
                unsafe { kernels.launch_oneshot(stream, dtype, op, &args) }
            }
            Shot::Two { blocks, of } => {
                let args = TwoShotArgs {
                    srcs: self.srcs,
                    dsts: self.dsts,
                    count: self.count,
                    postdiv: of.postdiv(n),
                    flags: self.flags,
                    rank: self.rank,
                    blocks,
                    ctl: self.ctl,
                    timeout_ns: self.timeout_ns,
                    stage: self.stage,
                    what: (of.what(), of.root()),
                };
                // SAFETY: the caller's contract.
                unsafe { kernels.launch_twoshot(stream, dtype, op, &args) }
            }
        }
    }
}
