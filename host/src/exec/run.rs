//! The one dispatch: [`run`] takes a [`CallPlan`] and the communicator's per-call [`Handle`]
//! and hands the call to the executor the plan names.

use std::sync::{Mutex, MutexGuard};

use cudarc::driver::CudaStream;

use super::process::ProcessCall;
use super::{copy_engine, hybrid, internal, ll, net, oneshot, process, ring, RankPtrs};
use crate::plan::call::CallPlan;
use crate::plan::tuning::Traffic;
use crate::resources::rank_threads::RankThreads;
use crate::resources::Call;
use crate::transport::net::NetRank;
use crate::{DataType, RedOp, Result};

/// The caller's bracket around a call's use of its buffers (cudarc's event tracking of the
/// buffers: wait for their earlier accesses, record this call's when done).
pub trait Track: Sync {
    /// Runs `part`, rank `r`'s part of the call, inside the tracking of `r`'s buffers, and
    /// returns its result.
    fn rank(&self, r: usize, part: &dyn Fn() -> Result<()>) -> Result<()>;
    /// Runs `part` inside the tracking of every rank's buffers, and returns its result.
    fn all(&self, part: &mut dyn FnMut() -> Result<()>) -> Result<()>;
}

/// What every executor of a call is given: the element type and operation, the caller's
/// buffers and streams (one per rank held here), and the bracket of the buffers' tracking.
pub struct Args<'a, S> {
    /// The element type.
    pub dtype: DataType,
    /// The reduction (ignored by the copies).
    pub op: RedOp,
    /// Each held rank's buffers, as validated.
    pub ptrs: &'a [RankPtrs],
    /// Each held rank's stream.
    pub streams: &'a [S],
    /// The caller's tracking of the buffers.
    pub track: &'a dyn Track,
}

/// A communicator's per-call handle, per kind.
pub enum Handle<'a> {
    /// One process driving every rank: its resources with the per-call state locked, the host
    /// threads of the ranks, and whether the streams are being captured into a CUDA graph.
    Local {
        /// The per-call view of the ranks' resources.
        call: Call<'a>,
        /// One host thread per GPU but the first, where the communicator has them.
        threads: Option<&'a RankThreads>,
        /// Whether the streams are being captured.
        capturing: bool,
    },
    /// One rank of a job of processes: its per-call state locked, and the network path.
    Process {
        /// The rank's per-call view.
        call: ProcessCall<'a>,
        /// The network path, where the job has one.
        net: Option<&'a Mutex<NetRank>>,
    },
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Enqueues `plan` through `handle` with `args`: the executor the plan names. A plan for the
/// other kind of communicator is an internal error.
pub(crate) fn run<S: AsRef<CudaStream>>(plan: &CallPlan, handle: Handle<'_>, args: &Args<'_, S>) -> Result<()> {
    let Args {
        dtype,
        op,
        ptrs,
        streams,
        track,
    } = *args;
    match handle {
        Handle::Local {
            mut call,
            threads,
            capturing,
        } => match plan {
            // Each rank's part, its tracking included, is issued on its own (on the rank's host
            // thread, where the communicator has them). A rank's kernel ends only after every
            // peer is done reading its input (and, two-shot, writing its output), so the
            // record on its own stream covers the call.
            CallPlan::Shot { shot, count, in_place } => {
                let around = |r: usize, part: &dyn Fn() -> Result<()>| track.rank(r, part);
                oneshot::execute(
                    &mut call, *shot, dtype, op, ptrs, *in_place, *count, streams, capturing, threads, &around,
                )
            }
            CallPlan::CopyEngine(p) => track.all(&mut || copy_engine::execute(&mut call, p, dtype, op, ptrs, streams)),
            CallPlan::Ring { prepared, .. } => {
                track.all(&mut || ring::execute(&mut call, prepared, dtype, op, ptrs, streams, capturing))
            }
            other => Err(internal(format!("{other:?} on a communicator of one process"))),
        },
        Handle::Process { mut call, net } => {
            let (Some(&mine), Some(stream)) = (ptrs.first(), streams.first()) else {
                return Err(internal("no arguments for this process's rank".into()));
            };
            let stream = stream.as_ref();
            let signal_free = |p: &CallPlan| match p {
                CallPlan::ProcessShot { .. }
                | CallPlan::ProcessShotChunks { .. }
                | CallPlan::ProcessPeers { .. }
                | CallPlan::ProcessLl { .. }
                | CallPlan::ProcessLlGather { .. }
                | CallPlan::ProcessLlReduceScatter { .. }
                | CallPlan::ProcessLlBroadcast { .. }
                | CallPlan::ProcessLlReduce { .. } => true,
                CallPlan::ProcessRing { plan, .. } => plan.signals.count.iter().all(|&k| k == 0),
                _ => false,
            };
            if call.capturing && !signal_free(plan) {
                // `choose` refuses these under capture: their signals are numbered on the host.
                return Err(internal(format!("{plan:?} chosen under CUDA-graph capture")));
            }
            match plan {
                CallPlan::ProcessShot { shot, count, scratch } => track.all(&mut || {
                    call.ensure_scratch(*scratch)?;
                    process::execute_oneshot(&mut call, *shot, dtype, op, mine, *count, stream)
                }),
                CallPlan::ProcessShotChunks {
                    shot,
                    count,
                    chunk,
                    scratch,
                } => track.all(&mut || {
                    call.ensure_scratch(*scratch)?;
                    process::execute_chunks(&mut call, *shot, dtype, op, mine, (*count, *chunk), stream)
                }),
                CallPlan::ProcessPeers { collective } => {
                    if !call.capturing {
                        // `choose` takes it under capture only (eager calls run the ring).
                        return Err(internal(format!("{plan:?} outside a CUDA-graph capture")));
                    }
                    track.all(&mut || super::p2p::collective(&mut call, *collective, (dtype, op), mine, stream))
                }
                // Each LL executor refuses a call it cannot run before anything is launched.
                CallPlan::ProcessLl { count } => {
                    track.all(&mut || ll::execute(&mut call, dtype, op, mine, (*count, false), stream))
                }
                CallPlan::ProcessLlGather { sendcount } => track.all(&mut || {
                    ll::execute_gather(&mut call, mine, sendcount.saturating_mul(dtype.size()), stream)
                }),
                CallPlan::ProcessLlReduceScatter { recvcount } => {
                    track.all(&mut || ll::execute(&mut call, dtype, op, mine, (*recvcount, true), stream))
                }
                &CallPlan::ProcessLlBroadcast { bytes, root } => track.all(&mut || {
                    let rooted = ll::Rooted::Broadcast { root };
                    ll::execute_rooted(&mut call, rooted, (DataType::U8, RedOp::Sum), mine, bytes, stream)
                }),
                &CallPlan::ProcessLlReduce { count, root } => track.all(&mut || {
                    ll::execute_rooted(&mut call, ll::Rooted::Reduce { root }, (dtype, op), mine, count, stream)
                }),
                CallPlan::ProcessRing { plan, .. } => {
                    call.ensure_scratch(plan.prepared.schedule.scratch_len.saturating_mul(dtype.size()))?;
                    track.all(&mut || {
                        process::execute(&mut call, &plan.prepared, &plan.signals, dtype, op, mine, stream)
                    })
                }
                CallPlan::Network(p) | CallPlan::Hybrid(p) => {
                    let Some(net) = net else {
                        return Err(internal(format!("{plan:?} without the network path")));
                    };
                    track.all(&mut || {
                        let mut net = lock(net);
                        let cap = call.me.caps.for_traffic(Traffic::Local);
                        let bound = net::Bound {
                            kernels: &call.me.kernels,
                            health: call.health,
                        };
                        let bufs = (mine.send, mine.recv);
                        let groups = (&p.groups[..], p.unit);
                        if matches!(plan, CallPlan::Network(_)) {
                            net::collective(
                                &mut net,
                                call.memops,
                                bound,
                                cap,
                                (dtype, op),
                                bufs,
                                groups,
                                stream,
                                &mut call.state.order,
                            )
                        } else {
                            hybrid::collective(&mut net, &mut call, bound, cap, (dtype, op), bufs, groups, stream)
                        }
                    })
                }
                other => Err(internal(format!("{other:?} on a rank of a job of processes"))),
            }
        }
    }
}
