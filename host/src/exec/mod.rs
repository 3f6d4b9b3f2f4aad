//! Executors: turn a planned call into work on the ranks' streams, through a
//! [`Call`](crate::resources::Call) handle (the per-call view of the communicator's resources)
//! and the [`Transport`](crate::transport::Transport) between the ranks.
//!
//! * [`ring`]: a [`Prepared`](crate::plan::Prepared) schedule as one kernel launch per step,
//!   ordered across GPUs by events;
//! * [`oneshot`]: the one-shot all-reduce, one kernel per rank, ordered by a device-side
//!   barrier;
//! * here: what both share: the caller's buffers as addresses ([`RankPtrs`]), the CUDA-graph
//!   capture rules, and scratch for one call.
//!
//! ## CUDA graphs
//!
//! While the streams are being captured into a CUDA graph, an executor neither waits on the
//! previous call's end event nor records it (an event recorded outside a capture cannot be
//! waited on inside it, and vice versa): the graph's own order keeps scratch safe between its
//! calls, and scratch cannot grow during a capture (run the call once eagerly first). Every
//! rank's stream must be captured, in one capture, or none (a mix is rejected). A scratch
//! buffer a graph captured is never freed before the communicator. Launches of such a graph
//! must be ordered (on the streams) with the communicator's other calls, eager or graphed, like
//! any two calls on it.
//!
//! Nothing here blocks the host.

pub mod copy_engine;
pub mod oneshot;
pub mod net;
pub mod p2p;
pub mod process;
pub mod ring;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use crate::driver::launch::Prim;
use crate::plan::tuning::Traffic;
use crate::resources::Call;
use crate::schedule::Step;
use crate::{Arg, Error, Result};

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

/// Whether the streams are being captured into a CUDA graph: all of them or none (a mix would
/// launch some ranks now and the others at graph launch, or fail half-issued on a cross-stream
/// wait, so it is rejected before anything is enqueued).
pub fn capturing<S: AsRef<CudaStream>>(streams: &[S]) -> Result<bool> {
    let mut any = false;
    let mut all = true;
    let mut first_not = None;
    for (r, stream) in streams.iter().enumerate() {
        let status = stream
            .as_ref()
            .capture_status()
            .map_err(|e| Error::cuda("cuStreamIsCapturing", Some(r), e))?;
        let active = status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
        any |= active;
        all &= active;
        if !active && first_not.is_none() {
            first_not = Some(r);
        }
    }
    capture_state(any, all, first_not)
}

/// The all-or-none rule of [`capturing`]: `first_not` is the first rank whose stream is not
/// captured.
fn capture_state(any: bool, all: bool, first_not: Option<usize>) -> Result<bool> {
    if any && !all {
        return Err(Error::invalid(
            first_not,
            Arg::Stream,
            "some ranks' streams are being captured into a CUDA graph and this one is not: \
             capture every rank's stream (in one capture) or none",
        ));
    }
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::capture_state;
    use crate::{Arg, Error};

    fn state(active: &[bool]) -> crate::Result<bool> {
        let any = active.iter().any(|&a| a);
        let all = active.iter().all(|&a| a);
        capture_state(any, all, active.iter().position(|&a| !a))
    }

    #[test]
    fn capture_is_all_or_none() {
        assert_eq!(state(&[false, false]).ok(), Some(false));
        assert_eq!(state(&[true, true, true]).ok(), Some(true));
        assert_eq!(state(&[]).ok(), Some(false));
        for mixed in [[true, false, true], [false, true, true], [true, true, false]] {
            match state(&mixed) {
                Err(Error::InvalidArgument {
                    rank: Some(r),
                    arg: Arg::Stream,
                    ..
                }) => assert!(!mixed[r], "names a rank that is not captured"),
                other => panic!("mixed capture accepted: {other:?}"),
            }
        }
    }
}
