//! The public calls: collectives as methods on [`Communicator`].
//!
//! Every call goes the same way (read it top to bottom in [`Communicator::all_reduce`] →
//! `Communicator::collective`):
//! 1. **validate** ([`validate::validate`], [`send_recv::validate_send_recv`]): a pure function of
//!    the buffers' addresses, lengths and devices, the streams' devices, the counts and the
//!    root. A rejected call returns [`Error::InvalidArgument`](crate::Error::InvalidArgument)
//!    naming the rank and the problem, and nothing is enqueued;
//! 2. **plan** ([`crate::plan`]): the algorithm (one-shot or ring), the chunk, and the ring
//!    schedule for the collective, prepared once per call shape and cached;
//! 3. **enqueue** ([`crate::exec`]) on the given streams, one per rank, through the
//!    communicator's per-call handle. The call returns without waiting for the GPUs:
//!    synchronise the streams before using the results.
//!
//! A count of 0 is valid and enqueues nothing (the other arguments are still checked). A
//! communicator of one rank is valid too (a copy, or nothing for an in-place call). Buffer
//! shapes and in-place layouts are NCCL's (table in [`validate`]).
//!
//! Streams are passed as a slice of anything that is `AsRef<CudaStream>`: the communicator's own
//! ([`Communicator::streams`]), `[&Arc<CudaStream>]`, `Vec<Arc<CudaStream>>`…

pub mod buffer;
pub mod check;
pub mod collective;
pub mod p2p;
pub mod send_recv;
#[cfg(test)]
mod test_util;
pub mod validate;

pub use buffer::{DeviceSlice, DeviceSliceMut, Io, RawBuf};
pub use p2p::PeerOp;
pub use send_recv::SendRecv;

use buffer::RankArgs;
use collective::Collective;
use validate::{validate, validate_held, Held};

use std::sync::Mutex;

use cudarc::driver::{CudaStream, SyncOnDrop};

use crate::comm::{Communicator, ProcessRank};
use crate::config::Algorithm;
use crate::debug::report;
use crate::dtype::DeviceElement;
use crate::exec::{self, RankPtrs};
use crate::plan::{self, tuning, Prepared, ProcessPlan};
use crate::schedule::Layout;
use crate::{RedOp, Result};

/// Device ordinals of the given streams.
fn stream_devices<S: AsRef<CudaStream>>(streams: &[S]) -> Vec<usize> {
    streams.iter().map(|s| s.as_ref().context().ordinal()).collect()
}

/// cudarc's event tracking of the call's buffers (see [`buffer`]): each rank's stream waits for
/// earlier tracked accesses now; the returned guards record this call's accesses when dropped,
/// after everything is enqueued.
fn track<'s, T, S: AsRef<CudaStream>>(
    io: &'s mut [Io<'_, T>],
    streams: &'s [S],
    ptrs: &[validate::Ptrs],
    capturing: bool,
) -> Vec<[SyncOnDrop<'s>; 2]> {
    // Under CUDA-graph capture, a captured stream cannot wait on an event recorded outside the
    // capture (the capture is invalidated), and an event recorded inside it cannot be waited
    // on outside: a captured call leaves cudarc's events alone, and the graph's launches are
    // ordered by the caller, as with NCCL.
    if capturing {
        return Vec::new();
    }
    io.iter_mut()
        .zip(streams)
        .zip(ptrs)
        .map(|((io, s), p)| io.track(s.as_ref(), p.reads_send, p.writes_recv))
        .collect()
}

/// What a two-shot kernel runs for `c`; `None` for the collectives it cannot run (gather and
/// scatter).
fn twoshot_of(c: Collective) -> Option<exec::oneshot::TwoShotOf> {
    use exec::oneshot::TwoShotOf;
    match c {
        Collective::AllReduce { .. } => Some(TwoShotOf::AllReduce),
        Collective::ReduceScatter { .. } => Some(TwoShotOf::ReduceScatter),
        Collective::AllGather { .. } => Some(TwoShotOf::AllGather),
        Collective::AllToAll { .. } => Some(TwoShotOf::AllToAll),
        Collective::Broadcast { root, .. } => Some(TwoShotOf::Broadcast { root }),
        Collective::Reduce { root, .. } => Some(TwoShotOf::Reduce { root }),
        Collective::Gather { .. } | Collective::Scatter { .. } => None,
    }
}

/// Whether `c` can run on the two-shot kernel's barriers besides the all-reduce.
fn twoshot_other(c: Collective) -> bool {
    twoshot_of(c).is_some_and(|of| of != exec::oneshot::TwoShotOf::AllReduce)
}

impl Communicator {
    /// The devices of the ranks held here, in [`Communicator::local_ranks`] order.
    fn devices(&self) -> Vec<usize> {
        self.local_ranks().iter().map(|&r| self.ordinal(r)).collect()
    }

    /// Validate, plan and enqueue one collective.
    fn collective<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        c: Collective,
        io: &mut [Io<'_, T>],
        op: RedOp,
        streams: &[S],
    ) -> Result<()> {
        // A failed or aborted communicator runs nothing more.
        self.health().check()?;
        if let Some(p) = self.process() {
            return self.collective_process(p, c, io, op, streams);
        }
        // 1. Validate.
        let size = T::DTYPE.size();
        let devices = self.devices();
        let args: Vec<RankArgs> = io.iter().map(Io::args).collect();
        let checked = validate(c, &args, &devices, &stream_devices(streams), size)?;
        if c.count() == 0 {
            return Ok(());
        }
        validate::context::check_contexts(
            &validate::context::rank_contexts(self),
            &checked.ptrs,
            streams,
        )?;
        // 2. Plan.
        let n = devices.len();
        let config = self.config();
        let max_bytes = c.max_elems(n).unwrap_or(0).saturating_mul(size);
        // Whether the streams are being captured into a CUDA graph (all or none: checked here,
        // before anything is enqueued).
        let capture = exec::capture(streams)?;
        let capturing = capture.is_some();
        let ce_possible = self.copy_engine_usable() && !capturing;
        let algorithm = match c {
            Collective::AllReduce { .. } => {
                tuning::all_reduce_algorithm(max_bytes, n, self.oneshot_usable(), ce_possible, capturing, config)
            }
            c if twoshot_other(c)
                && tuning::twoshot_algorithm(max_bytes, n, self.oneshot_usable() && ce_possible, false, config)
                    == Algorithm::TwoShot =>
            {
                Algorithm::TwoShot
            }
            Collective::AllGather { .. } | Collective::Broadcast { .. } | Collective::AllToAll { .. }
                if tuning::copies_on_copy_engines(
                    max_bytes,
                    matches!(c, Collective::Broadcast { .. }),
                    ce_possible,
                    config,
                ) =>
            {
                Algorithm::CopyEngine
            }
            _ => Algorithm::Ring,
        };
        let ptrs: Vec<RankPtrs> = checked
            .ptrs
            .iter()
            .map(|p| RankPtrs {
                send: p.send,
                recv: p.recv,
            })
            .collect();
        let in_place = checked.layout != Layout::OutOfPlace;
        let ce_plan = match (algorithm, c) {
            (Algorithm::CopyEngine, Collective::AllReduce { count }) => {
                let chunk = tuning::ce_chunk_elems(max_bytes, n, T::DTYPE, config);
                Some(plan::copy_engine::plan(self.ring(), count, chunk, tuning::CE_SLOTS)?)
            }
            (Algorithm::CopyEngine, Collective::AllGather { sendcount }) => {
                Some(plan::copy_engine::all_gather(n, sendcount, in_place))
            }
            (Algorithm::CopyEngine, Collective::Broadcast { count, root }) => {
                Some(plan::copy_engine::broadcast(n, count, root, in_place))
            }
            (Algorithm::CopyEngine, Collective::AllToAll { count_per_peer }) => {
                Some(plan::copy_engine::all_to_all(n, count_per_peer))
            }
            _ => None,
        };
        let prepared = match algorithm {
            Algorithm::OneShot | Algorithm::TwoShot | Algorithm::CopyEngine => None,
            Algorithm::Ring => {
                let chunk = tuning::chunk_elems(max_bytes, n, T::DTYPE, config);
                let key = c.schedule_key(checked.layout, chunk);
                let (p, new) = self
                    .plans()
                    .get_or_build(key, || {
                        Prepared::new(c.schedule(self.ring(), checked.layout, chunk))
                    })?;
                if new {
                    report!(
                        config.debug,
                        Info,
                        "{} {} count {} {:?}: ring {:?}, chunk {chunk} elements, {} steps",
                        c.name(),
                        T::DTYPE.name(),
                        c.count(),
                        checked.layout,
                        self.ring(),
                        p.schedule.steps.len()
                    );
                }
                Some(p)
            }
        };
        report!(
            config.debug,
            Trace,
            "{} {} count {} op {} {:?}: {algorithm}",
            c.name(),
            T::DTYPE.name(),
            c.count(),
            op.name(),
            checked.layout
        );
        // 3. Enqueue (after the last check: all ranks' streams captured into a CUDA graph, or
        // none). cudarc's event tracking (see `buffer`): wait for earlier tracked accesses
        // now, record this call's accesses when the guards drop, after everything is enqueued.
        // (A one-shot rank's kernel ends only after every peer is done reading its input, so
        // the record on its own stream covers the call too.)
        if let Some(capture) = &capture {
            self.keep_alive_in(capture)?;
        }
        let mut call = self.begin_call();
        if prepared.is_none() && ce_plan.is_none() {
            // One-shot or two-shot: each rank's part, its tracking included, is issued on its
            // own (on the rank's host thread, where the communicator has them). A rank's kernel
            // ends only after every peer is done reading its input (and, two-shot, writing its
            // output), so the record on its own stream covers the call.
            let shot = if algorithm == Algorithm::TwoShot {
                let mut sms = u32::MAX;
                for r in 0..n {
                    sms = sms.min(call.rank(r)?.kernels.sm_count());
                }
                exec::oneshot::Shot::Two {
                    blocks: tuning::twoshot_blocks(max_bytes, n, sms),
                    of: twoshot_of(c).ok_or_else(|| crate::Error::Internal {
                        reason: format!("two-shot chosen for a {}", c.name()),
                    })?,
                }
            } else {
                exec::oneshot::Shot::One
            };
            let stream_refs: Vec<&CudaStream> = streams.iter().map(AsRef::as_ref).collect();
            let ios: Vec<Mutex<&mut Io<'_, T>>> = io.iter_mut().map(Mutex::new).collect();
            let around = |r: usize, part: &dyn Fn() -> Result<()>| -> Result<()> {
                if capturing {
                    return part();
                }
                let (Some(io), Some(stream), Some(p)) = (ios.get(r), stream_refs.get(r), checked.ptrs.get(r))
                else {
                    return Err(crate::Error::Internal {
                        reason: format!("no buffers or stream for rank {r}"),
                    });
                };
                let mut io = io.lock().map_err(|_| crate::Error::Internal {
                    reason: format!("rank {r}'s buffers are poisoned"),
                })?;
                let guards = io.track(stream, p.reads_send, p.writes_recv);
                let result = part();
                drop(guards);
                result
            };
            let threads = self.rank_threads();
            let count = c.count();
            return exec::oneshot::execute(
                &mut call, shot, T::DTYPE, op, &ptrs, in_place, count, streams, capturing, threads, &around,
            );
        }
        let guards = track(io, streams, &checked.ptrs, capturing);
        let result = match (&prepared, &ce_plan) {
            (Some(p), _) => exec::ring::execute(&mut call, p, T::DTYPE, op, &ptrs, streams, capturing),
            (None, Some(p)) => exec::copy_engine::execute(&mut call, p, T::DTYPE, op, &ptrs, streams),
            (None, None) => Err(crate::Error::Internal {
                reason: "neither a ring, a copy-engine nor a one-shot plan".into(),
            }),
        };
        drop(call);
        drop(guards);
        result
    }

    /// [`Communicator::collective`] for a rank of a job of processes: the same three stages,
    /// with the schedule rewritten so that ranks reach each other only in their exported
    /// scratch, and ordered by signals ([`exec::process`]).
    fn collective_process<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        p: &ProcessRank,
        c: Collective,
        io: &mut [Io<'_, T>],
        op: RedOp,
        streams: &[S],
    ) -> Result<()> {
        // 1. Validate what this process holds.
        let size = T::DTYPE.size();
        let devices = self.devices();
        let args: Vec<RankArgs> = io.iter().map(Io::args).collect();
        let held = Held {
            nranks: p.nranks,
            ranks: self.local_ranks(),
            devices: &devices,
        };
        let checked = validate_held(c, &args, &held, &stream_devices(streams), size)?;
        if self.config().check_calls {
            // Before the count-0 return: every rank takes part in the exchange.
            let op = c.kind().has_op().then_some(op);
            let sig = check::CallSig::collective(c.name(), T::DTYPE, op, c.count(), c.root());
            check::compare(p.rank, &p.boot.all_gather(&sig.encode())?)?;
        }
        if c.count() == 0 {
            return Ok(());
        }
        validate::context::check_contexts(
            &validate::context::rank_contexts(self),
            &checked.ptrs,
            streams,
        )?;
        if exec::capturing(streams)? {
            return Err(crate::Error::invalid(
                Some(p.rank),
                crate::Arg::Stream,
                "a communicator of processes cannot be captured into a CUDA graph yet: call it \
                 eagerly",
            ));
        }
        // 2. Plan.
        let n = p.nranks;
        let config = self.config();
        let max_bytes = c.max_elems(n).unwrap_or(0).saturating_mul(size);
        let (Some(ptrs), Some(stream)) = (checked.ptrs.first(), streams.first()) else {
            return Err(crate::Error::Internal {
                reason: "no arguments for this process's rank".into(),
            });
        };
        let mine = RankPtrs {
            send: ptrs.send,
            recv: ptrs.recv,
        };
        let me = self.resources(p.rank);
        if let Some(net) = &p.net {
            // Some ranks are on other machines (or every pair is forced onto the network):
            // the collective as groups of point-to-point transfers, receives combined by a
            // reduce kernel where it reduces (`plan::net`). Each group's transfers with ranks
            // of this machine go over CUDA IPC, the others over the network
            // (`exec::hybrid`); all-reduce, all-gather and broadcast are hierarchical where
            // every machine has as many ranks, two or more (`plan::net::hierarchical`).
            let in_place = checked.layout != Layout::OutOfPlace;
            let what = (c.kind(), c.count(), c.root().unwrap_or(0));
            let hierarchical = match p.net_all {
                false => plan::net::hierarchical(what, p.rank, &p.machines, size, in_place),
                true => None,
            };
            let how = if hierarchical.is_some() { "hierarchical" } else { "flat" };
            let groups =
                hierarchical.unwrap_or_else(|| plan::net::groups(what, (p.rank, n), size, in_place));
            report!(
                config.debug,
                Trace,
                "{} {} count {} across processes: {how} groups over the network{}, {} groups",
                c.name(),
                T::DTYPE.name(),
                c.count(),
                if p.net_all { "" } else { " and CUDA IPC" },
                groups.len()
            );
            let guards = track(io, streams, &checked.ptrs, false);
            let mut state = p.lock();
            let mut net = net.lock().unwrap_or_else(|e| e.into_inner());
            let cap = me.caps.for_traffic(tuning::Traffic::Local);
            let bound = exec::net::Bound {
                kernels: &me.kernels,
                health: self.health(),
            };
            let unit = c.count().saturating_mul(size);
            let result = if p.net_all {
                exec::net::collective(
                    &mut net,
                    &p.memops,
                    bound,
                    cap,
                    (T::DTYPE, op),
                    (mine.send, mine.recv),
                    (&groups, unit),
                    stream.as_ref(),
                    &state.end,
                )
            } else {
                let mut call = exec::process::ProcessCall {
                    me,
                    state: &mut state,
                    memops: &p.memops,
                    health: self.health(),
                };
                exec::hybrid::collective(
                    &mut net,
                    &mut call,
                    bound,
                    cap,
                    (T::DTYPE, op),
                    (mine.send, mine.recv),
                    (&groups, unit),
                    stream.as_ref(),
                )
            };
            drop(guards);
            return result;
        }
        if let Some(q) = p.lock().windows.remote_peer() {
            return Err(crate::Error::Network {
                rank: Some(p.rank),
                peer: Some(q),
                reason: format!(
                    "rank {q} runs on another machine: it is reached only over the network \
                     transport (RINGCCL_NET=ucx)"
                ),
            });
        }
        let algorithm = match c {
            Collective::AllReduce { .. } => Some(tuning::process_all_reduce_algorithm(max_bytes, n, config)),
            c if twoshot_other(c) => Some(tuning::twoshot_algorithm(max_bytes, n, true, true, config)),
            _ => None,
        };
        if let Some(algorithm) = algorithm {
            let shot = match algorithm {
                Algorithm::OneShot => Some(exec::oneshot::Shot::One),
                Algorithm::TwoShot => Some(exec::oneshot::Shot::Two {
                    blocks: tuning::twoshot_blocks(max_bytes, n, p.lock().windows.two_shot_sms()),
                    of: twoshot_of(c).ok_or_else(|| crate::Error::Internal {
                        reason: format!("two-shot chosen for a {}", c.name()),
                    })?,
                }),
                _ => None,
            };
            if let Some(shot) = shot {
                let count = c.count();
                report!(
                    config.debug,
                    Trace,
                    "{} {} count {count} across processes: {algorithm}",
                    c.name(),
                    T::DTYPE.name()
                );
                let bytes = count.saturating_mul(size);
                let scratch = exec::process::scratch_for(shot, bytes, n).ok_or_else(|| crate::Error::Internal {
                    reason: format!("a call of {bytes} bytes per rank overflows the scratch size"),
                })?;
                let guards = track(io, streams, &checked.ptrs, false);
                let mut state = p.lock();
                p.ensure_scratch(&mut state, scratch, self.health())?;
                let mut call = exec::process::ProcessCall {
                    me,
                    state: &mut state,
                    memops: &p.memops,
                    health: self.health(),
                };
                let result =
                    exec::process::execute_oneshot(&mut call, shot, T::DTYPE, op, mine, count, stream.as_ref());
                drop(guards);
                return result;
            }
        }
        let chunk = tuning::chunk_elems(max_bytes, n, T::DTYPE, config);
        let key = c.schedule_key(checked.layout, chunk);
        let (plan, new) = p.plans.get_or_build(key, || {
            ProcessPlan::new(&c.schedule(self.ring(), checked.layout, chunk))
        })?;
        if new {
            report!(
                config.debug,
                Info,
                "{} {} count {} {:?}: ring {:?} across processes, chunk {chunk} elements, {} steps, {} signals",
                c.name(),
                T::DTYPE.name(),
                c.count(),
                checked.layout,
                self.ring(),
                plan.prepared.schedule.steps.len(),
                plan.signals.count.iter().sum::<u64>()
            );
        }
        // 3. Enqueue (scratch grows first, collectively, if this shape needs more).
        let mut state = p.lock();
        p.ensure_scratch(
            &mut state,
            plan.prepared.schedule.scratch_len.saturating_mul(size),
            self.health(),
        )?;
        let guards = track(io, streams, &checked.ptrs, false);
        let mut call = exec::process::ProcessCall {
            me,
            state: &mut state,
            memops: &p.memops,
            health: self.health(),
        };
        let result = exec::process::execute(
            &mut call,
            &plan.prepared,
            &plan.signals,
            T::DTYPE,
            op,
            mine,
            stream.as_ref(),
        );
        drop(guards);
        result
    }

    /// All-reduce: every rank's output gets the reduction (`op`) over ranks of their `count`
    /// inputs. `io[r]` and `streams[r]` belong to rank `r`; each rank needs `count` elements
    /// of input and output, or one buffer in place.
    ///
    /// Returns once the work is enqueued: synchronise the streams before using the results.
    /// Arrays serve as well as vectors: one rank's call reads
    /// `comm.all_reduce(&mut [Io::in_place(&mut buf)], count, op, &[stream])`.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io, RedOp};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let send = (0..n).map(|r| comm.stream(r).clone_htod(&[1.0f32; 64])).collect::<Result<Vec<_>, _>>()?;
    /// let mut recv = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(64)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = send.iter().zip(recv.iter_mut()).map(|(s, r)| Io::out_of_place(s, r)).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.all_reduce(&mut io, 64, RedOp::Avg, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_reduce<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        streams: &[S],
    ) -> Result<()> {
        self.collective(Collective::AllReduce { count }, io, op, streams)
    }

    /// Reduce-scatter: rank `r`'s output (`recvcount` elements) gets block `r` of the reduction
    /// over ranks of their inputs (`nranks * recvcount` elements each). In place: the buffer is
    /// the input and rank `r`'s output is its block `r`.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io, RedOp};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(n * 32)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.reduce_scatter(&mut io, 32, RedOp::Sum, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce_scatter<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        io: &mut [Io<'_, T>],
        recvcount: usize,
        op: RedOp,
        streams: &[S],
    ) -> Result<()> {
        self.collective(Collective::ReduceScatter { recvcount }, io, op, streams)
    }

    /// All-gather: every rank's output (`nranks * sendcount` elements) gets every rank's input
    /// (`sendcount` elements), in rank order. In place: the buffer is the output, holding
    /// rank `r`'s input at element `r * sendcount`.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).alloc_zeros::<u8>(n * 100)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.all_gather(&mut io, 100, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_gather<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        io: &mut [Io<'_, T>],
        sendcount: usize,
        streams: &[S],
    ) -> Result<()> {
        self.collective(Collective::AllGather { sendcount }, io, RedOp::Sum, streams)
    }

    /// Broadcast: every rank's output gets the root's `count` input elements. The root gives
    /// an input ([`Io::send_only`], or an output too, or one buffer in place); the others give
    /// an output ([`Io::recv_only`]).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).alloc_zeros::<f64>(10)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.broadcast(&mut io, 10, 0, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn broadcast<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        io: &mut [Io<'_, T>],
        count: usize,
        root: usize,
        streams: &[S],
    ) -> Result<()> {
        self.collective(
            Collective::Broadcast { count, root },
            io,
            RedOp::Sum,
            streams,
        )
    }

    /// Reduce: the root's output gets the reduction over ranks of their `count` inputs. Every
    /// rank gives an input; the root also an output (or one buffer in place).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io, RedOp};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n).map(|r| comm.stream(r).alloc_zeros::<i32>(10)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.reduce(&mut io, 10, RedOp::Max, 0, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reduce<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        root: usize,
        streams: &[S],
    ) -> Result<()> {
        self.collective(Collective::Reduce { count, root }, io, op, streams)
    }

    /// All-to-all: block `j` (`count_per_peer` elements) of rank `i`'s input goes to block `i`
    /// of rank `j`'s output; both buffers hold `nranks * count_per_peer` elements. Out of place
    /// only (as in NCCL).
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let send = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(n * 8)).collect::<Result<Vec<_>, _>>()?;
    /// let mut recv = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(n * 8)).collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = send.iter().zip(recv.iter_mut()).map(|(s, r)| Io::out_of_place(s, r)).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.all_to_all(&mut io, 8, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn all_to_all<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        io: &mut [Io<'_, T>],
        count_per_peer: usize,
        streams: &[S],
    ) -> Result<()> {
        self.collective(
            Collective::AllToAll { count_per_peer },
            io,
            RedOp::Sum,
            streams,
        )
    }

    /// Gather: the root's output (`nranks * sendcount` elements) gets every rank's input
    /// (`sendcount` elements), in rank order. In place on the root: the output buffer, holding
    /// the root's input at element `root * sendcount`.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let send = (0..n).map(|r| comm.stream(r).alloc_zeros::<f32>(4)).collect::<Result<Vec<_>, _>>()?;
    /// let mut out = comm.stream(0).alloc_zeros::<f32>(n * 4)?;
    /// let mut io = vec![Io::out_of_place(&send[0], &mut out)];
    /// io.extend(send[1..].iter().map(Io::send_only));
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.gather(&mut io, 4, 0, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn gather<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        io: &mut [Io<'_, T>],
        sendcount: usize,
        root: usize,
        streams: &[S],
    ) -> Result<()> {
        self.collective(
            Collective::Gather { sendcount, root },
            io,
            RedOp::Sum,
            streams,
        )
    }

    /// Scatter: rank `r`'s output (`recvcount` elements) gets block `r` of the root's input
    /// (`nranks * recvcount` elements). In place on the root: the input buffer, whose block
    /// `root` is the root's output.
    ///
    /// ```no_run
    /// use ringccl::{Communicator, Io};
    /// let comm = Communicator::all()?;
    /// let n = comm.nranks();
    /// let mut bufs = (0..n)
    ///     .map(|r| comm.stream(r).alloc_zeros::<f32>(if r == 0 { n * 4 } else { 4 }))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let mut io: Vec<_> = bufs.iter_mut().map(Io::in_place).collect();
    /// let streams: Vec<_> = (0..n).map(|r| comm.stream(r)).collect();
    /// comm.scatter(&mut io, 4, 0, &streams)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scatter<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        io: &mut [Io<'_, T>],
        recvcount: usize,
        root: usize,
        streams: &[S],
    ) -> Result<()> {
        self.collective(
            Collective::Scatter { recvcount, root },
            io,
            RedOp::Sum,
            streams,
        )
    }
}
