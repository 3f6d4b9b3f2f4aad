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
//! returns [`Error::PartlyEnqueued`].

use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::CudaStream;
use gpu_kernels::oneshot::MAX_RANKS;

use crate::resources::rank_threads::RankThreads;
use super::{internal, record, scratch_for_call, wait, Around, RankPtrs};
use crate::driver::launch::{OneShotArgs, TwoShotArgs};
use crate::resources::Call;
use crate::{DataType, Error, RedOp, Result};

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
    let postdiv = match shot {
        Shot::One => TwoShotOf::AllReduce.postdiv(n),
        Shot::Two { of, .. } => of.postdiv(n),
    };

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
        let kernels = &call.rank(r)?.kernels;
        match shot {
            Shot::One => kernels.oneshot_ready(dtype, op, n).map(drop)?,
            Shot::Two { blocks, of } => kernels.twoshot_ready(dtype, op, n, blocks, of.what()).map(drop)?,
        }
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
            let kernels = &call_ref.rank(r)?.kernels;
            match shot {
                Shot::One => {
                    let args = OneShotArgs {
                        srcs: &srcs[..n],
                        dst: ptrs[r].recv,
                        tmp: tmp[r],
                        count,
                        postdiv,
                        flags: &flags[..n],
                        rank: r,
                        ctl,
                        timeout_ns,
                        stage: None,
                    };
                    // SAFETY: the collective validated every rank's `count`-element buffers
                    // (inputs and outputs on their own devices, outputs not partially
                    // overlapping inputs); `tmp` is `count` elements of rank `r`'s scratch,
                    // sized above; the flag arrays are the communicator's, alive until its drop
                    // waits for this call's end (as is the control block); the caller checked
                    // peer access between every pair of ranks.
                    unsafe { kernels.launch_oneshot(stream, dtype, op, &args)? };
                }
                Shot::Two { blocks, of } => {
                    let args = TwoShotArgs {
                        srcs: &srcs[..n],
                        dsts: &dsts[..n],
                        count,
                        postdiv,
                        flags: &flags[..n],
                        rank: r,
                        blocks,
                        ctl,
                        timeout_ns,
                        stage: None,
                        what: (of.what(), of.root()),
                    };
                    // SAFETY: as for the one-shot kernel, for every rank's input and output
                    // (validated for the collective `of` runs: lengths in units of `count`, and a
                    // rank's output equals its input, is its shard of it in NCCL's in-place
                    // layout, or overlaps neither; unused buffers are 0 and never touched); the
                    // two-shot flag regions are the communicator's, used by its two-shot kernels
                    // only.
                    unsafe { kernels.launch_twoshot(stream, dtype, op, &args)? };
                }
            }
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
    let e = Error::PartlyEnqueued {
        enqueued,
        cause: Box::new(cause),
    };
    call.health().fail(e.clone());
    Err(e)
}
