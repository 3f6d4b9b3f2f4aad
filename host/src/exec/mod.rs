//! Executors: turn a planned call into work on the ranks' streams, through a
//! [`Call`](crate::resources::Call) handle (the per-call view of the communicator's resources)
//! and the [`Transport`](crate::transport::Transport) between the ranks.
//!
//! * [`ring`]: a [`Prepared`](crate::plan::Prepared) schedule as one kernel launch per step,
//!   ordered across GPUs by events;
//! * [`process`], [`p2p`], [`net`] and [`hybrid`]: a rank of a job of processes, its peers
//!   reached over CUDA IPC, the network, or both (ranks on several machines);
//! * [`oneshot`]: the one-shot all-reduce, one kernel per rank, ordered by a device-side
//!   barrier, issued from one host thread per GPU at once ([`crate::resources::rank_threads`]);
//! * [`run`]: the one dispatch, from a [`CallPlan`](crate::plan::call::CallPlan) and the
//!   communicator's per-call [`Handle`] to the executor the plan names;
//! * here: what all share: the caller's buffers as addresses ([`RankPtrs`]), the CUDA-graph
//!   capture rules, and scratch for one call.
//!
//! ## CUDA graphs
//!
//! While the streams are being captured into a CUDA graph, an executor neither waits on the
//! previous call's end event nor records it (an event recorded outside a capture cannot be
//! waited on inside it, and vice versa): the graph's own order keeps scratch safe between its
//! calls, and scratch cannot grow during a capture (run the call once eagerly first). Every
//! rank's stream must be captured, in one capture, or none (a mix, or separate captures, is
//! rejected: [`capture`]). A scratch buffer a graph captured is never freed before the
//! communicator, and the communicator's device resources (kernels, scratch, flags, control
//! block) outlive it while a graph that captured one of its calls exists: each captured call
//! gives the graph a reference to them ([`crate::driver::graph::keep_alive_in_graph`]), so a
//! graph can be replayed after the communicator is dropped. Launches of such a graph must be
//! ordered (on the streams) with the communicator's other calls, eager or graphed, like any
//! two calls on it.
//!
//! A rank of a job of processes captures only its one-shot and two-shot calls
//! (`process::execute_oneshot`: barrier epochs on the device, staging in the exported scratch
//! at fixed addresses) and its point-to-point groups on the point-to-point kernel
//! (`p2p::execute_kernel`: counters on the device); the ring through the scratch, the
//! point-to-point groups of larger communicators and the network path number their signals on the host and are
//! refused under capture
//! ([`crate::plan::call::capture_limit`]). Its scratch does not grow in a capture, and once a
//! graph holds it a later growth keeps the old buffers and mappings
//! ([`crate::transport::ipc::Windows::mark_captured`]), handed to the graphs with the rest.
//!
//! Nothing here blocks the host.

pub mod copy_engine;
pub mod hybrid;
pub(crate) mod ll;
pub mod oneshot;
pub mod net;
pub mod p2p;
pub mod premul;
pub mod process;
pub mod ring;
mod run;

pub(crate) use run::run;
pub use run::{Args, Handle, Track};

use cudarc::driver::{CudaEvent, CudaStream};

pub use crate::driver::graph::Capture;

use crate::driver::graph::capture_of;
use crate::driver::launch::Prim;
use crate::per_rank::PerRank;
use crate::plan::tuning::Traffic;
use crate::resources::{Call, Health};
use crate::schedule::Step;
use crate::{Arg, Error, Result};

/// A caller's bracket around one rank's part of a call: `around(rank, part)` calls `part`
/// once, between its own work for that rank, and returns `part`'s result (see
/// [`oneshot::execute`]).
pub type Around<'a> = &'a (dyn Fn(usize, &dyn Fn() -> Result<()>) -> Result<()> + Sync);

/// The caller's buffers of one rank, as device addresses (0 where the rank has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankPtrs {
    /// The send (input) buffer.
    pub send: u64,
    /// The receive (output) buffer.
    pub recv: u64,
}

/// The primitive of `step` with its sources and destinations resolved to `srcs` and `dsts`
/// (addresses in step order; a second destination only if the step has one).
fn prim_for<'a>(step: &Step, srcs: &'a [u64], dsts: &[u64; 2], nranks: usize) -> Prim<'a> {
    let nsrc = step.srcs.len();
    let dst1 = (step.dsts.len() == 2).then_some(dsts[1]);
    let postdiv = if step.finish {
        u32::try_from(nranks).unwrap_or(u32::MAX)
    } else {
        1
    };
    match nsrc {
        1 => Prim::Copy {
            src: srcs[0],
            dst0: dsts[0],
            dst1,
        },
        2 => Prim::ReduceCopy {
            a: srcs[0],
            b: srcs[1],
            dst0: dsts[0],
            dst1,
            postdiv,
        },
        _ => Prim::Reduce {
            srcs: &srcs[..nsrc],
            dst: dsts[0],
            postdiv,
        },
    }
}

/// Where a step's traffic goes, from whether it reads and writes another GPU's memory.
fn traffic(reads_peer: bool, writes_peer: bool) -> Traffic {
    match (reads_peer, writes_peer) {
        (true, true) => Traffic::PeerDuplex,
        (false, false) => Traffic::Local,
        _ => Traffic::Peer,
    }
}

/// A call that failed after part of it was enqueued (`enqueued`: the ranks whose work went
/// out): the communicator is failed, its abort word ending the device waits already enqueued,
/// and the error tells the caller its buffers hold no result.
fn partly_enqueued(health: &Health, enqueued: Vec<usize>, cause: Error) -> Error {
    let e = Error::PartlyEnqueued {
        enqueued,
        cause: Box::new(cause),
    };
    health.fail(e.clone());
    e
}

/// Records rank `q`'s next event of the call on `stream` (best effort, after a failure): its
/// index, if recorded.
fn mark(call: &mut Call<'_>, q: usize, stream: &CudaStream) -> Option<usize> {
    let ix = call.next_event(q).ok()?;
    call.event(q, ix).is_ok_and(|e| e.record(stream).is_ok()).then_some(ix)
}

/// After a failed issue (best effort): every rank's stream waits for every rank's `marks`
/// (what went out may touch any rank's memory), then records the rank's end, so that the next
/// call's start (and a scratch reallocation) waits for all of it.
fn join_at_end<S: AsRef<CudaStream>>(call: &Call<'_>, streams: &[S], marks: &[Option<usize>]) {
    for (r, stream) in streams.iter().enumerate() {
        for (q, ix) in marks.iter().enumerate() {
            if let Some(e) = ix.and_then(|ix| call.event(q, ix).ok()) {
                let _ = stream.as_ref().wait(e);
            }
        }
        if let Ok(end) = call.end_event(r) {
            let _ = end.record(stream.as_ref());
        }
    }
}

fn internal(reason: String) -> Error {
    Error::Internal { reason }
}

fn wait(stream: &CudaStream, ev: &CudaEvent, rank: usize) -> Result<()> {
    stream
        .wait(ev)
        .map_err(|e| Error::cuda("cuStreamWaitEvent", Some(rank), e))
}

fn record(ev: &CudaEvent, stream: &CudaStream, rank: usize) -> Result<()> {
    ev.record(stream)
        .map_err(|e| Error::cuda("cuEventRecord", Some(rank), e))
}

/// Rank `r`'s scratch of at least `bytes` for this call. During a CUDA-graph capture it cannot
/// grow (the allocation and the wait it needs would go into the graph): that is an error telling
/// the caller to run the call once before capturing.
fn scratch_for_call(call: &mut Call<'_>, r: usize, bytes: usize, capturing: bool) -> Result<u64> {
    if capturing {
        if call.scratch_bytes(r) < bytes {
            return Err(Error::invalid(
                Some(r),
                Arg::Stream,
                "the stream is being captured into a CUDA graph and this call needs more scratch \
                 memory than the communicator has: run the same call once before capturing",
            ));
        }
        call.mark_scratch_captured(r);
    }
    call.scratch_ptr(r, bytes)
}

/// The CUDA-graph capture the streams are in: all of them in one capture, or none (a mix, or
/// ranks in separate captures, would launch some ranks now and the others at graph launch, or
/// replay the ranks' parts separately and out of step: rejected before anything is enqueued).
pub fn capture<S: AsRef<CudaStream>>(streams: &[S]) -> Result<Option<Capture>> {
    let captures = streams
        .iter()
        .enumerate()
        .map(|(r, s)| capture_of(s.as_ref(), Some(r)))
        .collect::<Result<PerRank<_>>>()?;
    let ids: PerRank<Option<u64>> = captures.iter().map(|c| c.map(|c| c.id)).collect();
    one_capture(&ids)?;
    Ok(captures.first().copied().flatten())
}

/// The rule of [`capture`] on the ranks' capture ids (`None`: not captured).
fn one_capture(ids: &[Option<u64>]) -> Result<()> {
    let Some(first) = ids.iter().flatten().next() else {
        return Ok(());
    };
    if let Some(r) = ids.iter().position(Option::is_none) {
        return Err(Error::invalid(
            Some(r),
            Arg::Stream,
            "some ranks' streams are being captured into a CUDA graph and this one is not: \
             capture every rank's stream (in one capture) or none",
        ));
    }
    if let Some(r) = ids.iter().position(|id| id != &Some(*first)) {
        return Err(Error::invalid(
            Some(r),
            Arg::Stream,
            "this rank's stream is in a different CUDA-graph capture than the first rank's: \
             capture every rank's stream in one capture (begin it on one stream and join the \
             others with an event), so that the ranks' parts of a call are replayed together",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::one_capture;
    use crate::{Arg, Error};

    fn rejected_rank(ids: &[Option<u64>]) -> Option<usize> {
        match one_capture(ids) {
            Ok(()) => None,
            Err(Error::InvalidArgument {
                rank: Some(r),
                arg: Arg::Stream,
                ..
            }) => Some(r),
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }

    #[test]
    fn capture_is_all_or_none() {
        assert_eq!(rejected_rank(&[None, None]), None);
        assert_eq!(rejected_rank(&[Some(4), Some(4), Some(4)]), None);
        assert_eq!(rejected_rank(&[]), None);
        for mixed in [[Some(1), None, Some(1)], [None, Some(1), Some(1)], [Some(1), Some(1), None]] {
            let r = rejected_rank(&mixed).expect("a mix of captured and not captured is rejected");
            assert!(mixed[r].is_none(), "names a rank that is captured");
        }
    }

    #[test]
    fn every_rank_is_in_one_capture() {
        assert_eq!(rejected_rank(&[Some(7), Some(8)]), Some(1));
        assert_eq!(rejected_rank(&[Some(7), Some(7), Some(9)]), Some(2));
        // Separate captures and a rank not captured at all: the missing rank is named first.
        assert_eq!(rejected_rank(&[Some(7), Some(8), None]), Some(2));
    }
}
