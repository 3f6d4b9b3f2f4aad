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
//! The reducing calls take any `impl Into<`[`Op`]`>`: a [`RedOp`], or a PreMulSum
//! ([`Op::pre_mul_sum`]), which step 1 resolves (`premul::resolve`) to a sum preceded by a
//! pre-step that scales each rank's input, enqueued first in step 3 (`premul`).
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
pub mod premul;
mod register;
pub mod send_recv;
#[cfg(test)]
mod test_util;
pub mod validate;

pub use buffer::{DeviceSlice, DeviceSliceMut, Io, RawBuf};
pub use p2p::PeerOp;
pub use premul::{Op, Scalar};
pub use send_recv::SendRecv;

use buffer::RankArgs;
use collective::Collective;
use validate::{validate, validate_held, Held};

use std::sync::Mutex;

use cudarc::driver::CudaStream;

use crate::comm::{Communicator, Kind};
use crate::debug::report;
use crate::dtype::DeviceElement;
use crate::exec::{self, RankPtrs};
use crate::plan::call::{CallPlan, CallShape, CommView, LocalView, NetView, ProcessView};
use crate::per_rank::PerRank;
use crate::plan;
use crate::schedule::Layout;
use crate::{RedOp, Result};

/// Device ordinals of the given streams.
fn stream_devices<S: AsRef<CudaStream>>(streams: &[S]) -> PerRank<usize> {
    streams.iter().map(|s| s.as_ref().context().ordinal()).collect()
}

/// cudarc's event tracking of a call's buffers (see [`buffer`]), as the executors' bracket
/// ([`exec::Track`]): a rank's stream waits for earlier tracked accesses of its buffers before
/// its part of the call, and this call's accesses are recorded after it.
///
/// Under CUDA-graph capture, a captured stream cannot wait on an event recorded outside the
/// capture (the capture is invalidated), and an event recorded inside it cannot be waited on
/// outside: a captured call leaves cudarc's events alone, and the graph's launches are ordered
/// by the caller, as with NCCL.
struct Tracked<'a, 'b, T> {
    /// Each held rank's buffers and stream.
    ranks: PerRank<Mutex<(&'a mut Io<'b, T>, &'a CudaStream)>>,
    ptrs: &'a [validate::Ptrs],
    capturing: bool,
}

impl<'a, 'b, T> Tracked<'a, 'b, T> {
    fn new<S: AsRef<CudaStream>>(
        io: &'a mut [Io<'b, T>],
        streams: &'a [S],
        ptrs: &'a [validate::Ptrs],
        capturing: bool,
    ) -> Self {
        let ranks = io.iter_mut().zip(streams).map(|(io, s)| Mutex::new((io, s.as_ref()))).collect();
        Tracked { ranks, ptrs, capturing }
    }

    /// `part` inside the tracking of ranks `r..`.
    fn nest(&self, r: usize, part: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let (Some(rank), Some(p)) = (self.ranks.get(r), self.ptrs.get(r)) else {
            return part();
        };
        let mut rank = rank.lock().unwrap_or_else(|e| e.into_inner());
        let (io, stream) = &mut *rank;
        let guards = io.track(stream, p.reads_send, p.writes_recv);
        let result = self.nest(r + 1, part);
        drop(guards);
        result
    }
}

impl<T: DeviceElement> exec::Track for Tracked<'_, '_, T> {
    fn rank(&self, r: usize, part: &dyn Fn() -> Result<()>) -> Result<()> {
        if self.capturing {
            return part();
        }
        let (Some(rank), Some(p)) = (self.ranks.get(r), self.ptrs.get(r)) else {
            return Err(crate::Error::Internal {
                reason: format!("no buffers or stream for rank {r}"),
            });
        };
        let mut rank = rank.lock().map_err(|_| crate::Error::Internal {
            reason: format!("rank {r}'s buffers are poisoned"),
        })?;
        let (io, stream) = &mut *rank;
        let guards = io.track(stream, p.reads_send, p.writes_recv);
        let result = part();
        drop(guards);
        result
    }

    fn all(&self, part: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        if self.capturing {
            return part();
        }
        self.nest(0, part)
    }
}

/// A call, validated: what [`plan::call::choose`] and [`exec::run`] need of it.
struct Checked {
    ptrs: PerRank<validate::Ptrs>,
    layout: Layout,
    /// The CUDA-graph capture the streams are in (all or none), if any.
    capture: Option<exec::Capture>,
}

impl Communicator {
    /// The devices of the ranks held here, in [`Communicator::local_ranks`] order.
    fn devices(&self) -> PerRank<usize> {
        self.local_ranks().iter().map(|&r| self.ordinal(r)).collect()
    }

    /// Validate, choose the plan, run it: one collective, on either kind of communicator.
    fn collective<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        c: Collective,
        io: &mut [Io<'_, T>],
        op: Op,
        streams: &[S],
    ) -> Result<()> {
        // 1. Validate (a failed or aborted communicator runs nothing more); a PreMulSum
        // resolves to its pre-step and a sum (`premul::resolve`).
        let Some((checked, resolved)) = self.validate_collective(c, io, &op, streams)? else {
            return Ok(()); // a count of 0
        };
        let ptrs: PerRank<RankPtrs> = checked
            .ptrs
            .iter()
            .map(|p| RankPtrs {
                send: p.send,
                recv: p.recv,
            })
            .collect();
        let capturing = checked.capture.is_some();
        // 2. Choose the plan (for a PreMulSum, of the sum over the scaled inputs, whose layout
        // the pre-step sets).
        let layout = resolved
            .pre
            .as_ref()
            .map_or(checked.layout, |pre| pre.layout(checked.layout));
        let call = CallShape {
            collective: c,
            dtype: T::DTYPE,
            layout,
        };
        let plan = self.choose(&call, capturing)?;
        // 3. Run it (after the last check: all ranks' streams captured into a CUDA graph, or
        // none).
        if let Some(capture) = &checked.capture {
            self.keep_alive_in(capture)?;
        }
        let track = Tracked::new(io, streams, &checked.ptrs, capturing);
        // A PreMulSum's pre-step first: every held rank's input scaled (into a temporary freed
        // on the rank's stream after the call, or into the all-reduce's own buffers).
        let (ptrs, temps) = match &resolved.pre {
            None => (ptrs, exec::premul::Temps::none()),
            Some(pre) => self.prescale::<T, S>(c, pre, &ptrs, streams, &track)?,
        };
        let args = exec::Args {
            dtype: T::DTYPE,
            op: resolved.op,
            ptrs: &ptrs,
            streams,
            track: &track,
        };
        let ran = exec::run(&plan, self.handle(capturing), &args);
        // The temporaries (if any) go after the call, in stream order.
        let freed = temps.free();
        ran.and(freed)
    }

    /// The pre-step of a PreMulSum collective (step 3, before the sum): scales each held
    /// rank's input on its stream ([`premul`]), inside cudarc's tracking of its buffers;
    /// returns the pointers the sum runs on and the temporaries to free after it.
    fn prescale<'s, T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        c: Collective,
        pre: &exec::premul::Prescale,
        ptrs: &[RankPtrs],
        streams: &'s [S],
        track: &dyn exec::Track,
    ) -> Result<(PerRank<RankPtrs>, exec::premul::Temps<'s>)> {
        let ranks = self.local_ranks();
        let temps = if pre.into == exec::premul::Target::Temp {
            let bytes = pre.elems.saturating_mul(T::DTYPE.size());
            let pools: Vec<usize> = ranks.iter().map(|&r| self.resources(r).granted_pool).collect();
            exec::premul::Temps::alloc(streams.iter().map(AsRef::as_ref).collect(), &pools, ranks, bytes)?
        } else {
            exec::premul::Temps::none()
        };
        report!(
            self.config().debug,
            Info,
            "{} {} count {}: PreMulSum pre-step: {} elements per rank scaled by {:?} into {:?}, \
             then a sum",
            c.name(),
            T::DTYPE.name(),
            c.count(),
            pre.elems,
            pre.scalars,
            pre.into,
        );
        for (i, (&rank, p)) in ranks.iter().zip(ptrs).enumerate() {
            let (Some(stream), Some(&scalar)) = (streams.get(i), pre.scalars.get(i)) else {
                return Err(crate::Error::Internal {
                    reason: format!("no stream or scalar for rank {rank}'s PreMulSum"),
                });
            };
            let (src, dst) = pre.src_dst(p, temps.ptrs().get(i).copied().unwrap_or(0));
            let res = self.resources(rank);
            let cap = res.caps.for_traffic(crate::plan::tuning::Traffic::Local);
            track.rank(i, &|| {
                res.ctx
                    .bind_to_thread()
                    .map_err(|e| crate::Error::cuda("cuCtxSetCurrent", Some(rank), e))?;
                // SAFETY: `src` is the rank's validated send buffer of at least `elems`
                // elements; `dst` its validated receive buffer (all-reduce: `count` elements,
                // or the send buffer itself in place) or its temporary of `elems` elements,
                // alive until freed on this stream after the call; a device scalar was
                // promised readable until the call has run (`Op::pre_mul_sum_scalars`).
                unsafe {
                    exec::premul::scale(
                        &res.kernels,
                        stream.as_ref(),
                        T::DTYPE,
                        src,
                        dst,
                        pre.elems,
                        scalar,
                        cap,
                    )
                }
            })?;
        }
        Ok((pre.rewrite(ptrs, temps.ptrs()), temps))
    }

    /// Step 1 of a collective: checks the call against what this communicator holds (and, in
    /// a job of processes with [`Config::check_calls`](crate::Config::check_calls), against
    /// every rank's call). `None` for a count of 0 (nothing to enqueue).
    fn validate_collective<T: DeviceElement, S: AsRef<CudaStream>>(
        &self,
        c: Collective,
        io: &[Io<'_, T>],
        op: &Op,
        streams: &[S],
    ) -> Result<Option<(Checked, premul::Resolved)>> {
        self.health().check()?;
        let size = T::DTYPE.size();
        let devices = self.devices();
        let args: PerRank<RankArgs> = io.iter().map(Io::args).collect();
        let checked = match self.process() {
            None => validate(c, &args, &devices, &stream_devices(streams), size)?,
            Some(p) => {
                let held = Held {
                    nranks: p.nranks,
                    ranks: self.local_ranks(),
                    devices: &devices,
                };
                let checked = validate_held(c, &args, &held, &stream_devices(streams), size)?;
                if self.config().check_calls {
                    // Before the count-0 return: every rank takes part in the exchange. A
                    // PreMulSum compares as a sum (each rank's scalar is its own).
                    let op = c.kind().has_op().then(|| op.builtin().unwrap_or(RedOp::Sum));
                    let sig = check::CallSig::collective(c.name(), T::DTYPE, op, c.count(), c.root());
                    check::compare(p.rank, &p.boot.all_gather(&sig.encode())?)?;
                }
                checked
            }
        };
        let nranks = self.nranks();
        let resolved =
            premul::resolve(op, c, T::DTYPE, checked.layout, nranks, self.local_ranks().len())?;
        if c.count() == 0 {
            return Ok(None);
        }
        validate::context::check_contexts(
            &validate::context::rank_contexts(self),
            &checked.ptrs,
            streams,
        )?;
        // Whether the streams are being captured into a CUDA graph (all or none: checked here,
        // before anything is enqueued). In a job of processes only the one-shot and two-shot
        // kernels can be captured: the choice refuses the rest (`plan::call::capture_limit`).
        let capture = exec::capture(streams)?;
        Ok(Some((
            Checked {
                ptrs: checked.ptrs,
                layout: checked.layout,
                capture,
            },
            resolved,
        )))
    }

    /// Step 2: [`plan::call::choose`] on this communicator's view, reported at
    /// `RINGCCL_DEBUG=info` for each new call shape and at `trace` for every call.
    fn choose(&self, call: &CallShape, capturing: bool) -> Result<CallPlan> {
        let config = self.config();
        let (plan, new) = match self.kind() {
            Kind::Local { plans, .. } => {
                let sms = || {
                    self.local_ranks()
                        .iter()
                        .map(|&r| self.resources(r).kernels.sm_count())
                        .min()
                        .unwrap_or(u32::MAX)
                };
                let view = CommView::Local(LocalView {
                    ring: self.ring(),
                    oneshot_usable: self.oneshot_usable(),
                    copy_engine_usable: self.copy_engine_usable(),
                    capturing,
                    sms: &sms,
                    plans,
                });
                plan::call::choose(call, &view, config)?
            }
            Kind::Process(p) => {
                let remote_peer = || p.lock().windows.remote_peer();
                let sms = || p.lock().windows.two_shot_sms();
                let view = CommView::Process(ProcessView {
                    rank: p.rank,
                    nranks: p.nranks,
                    ring: self.ring(),
                    net: p.net.as_ref().map(|_| NetView {
                        all: p.net_all,
                        machines: &p.machines,
                    }),
                    remote_peer: &remote_peer,
                    sms: &sms,
                    plans: &p.plans,
                    capturing,
                });
                plan::call::choose(call, &view, config)?
            }
        };
        let c = call.collective;
        if new {
            report!(
                config.debug,
                Info,
                "{} {} count {} {:?}: ring {:?}: {plan:?}",
                c.name(),
                call.dtype.name(),
                c.count(),
                call.layout,
                self.ring(),
            );
        }
        report!(
            config.debug,
            Trace,
            "{} {} count {} {:?}: {plan:?}",
            c.name(),
            call.dtype.name(),
            c.count(),
            call.layout
        );
        Ok(plan)
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
        op: impl Into<Op>,
        streams: &[S],
    ) -> Result<()> {
        self.collective(Collective::AllReduce { count }, io, op.into(), streams)
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
        op: impl Into<Op>,
        streams: &[S],
    ) -> Result<()> {
        self.collective(Collective::ReduceScatter { recvcount }, io, op.into(), streams)
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
        self.collective(Collective::AllGather { sendcount }, io, RedOp::Sum.into(), streams)
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
            RedOp::Sum.into(),
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
        op: impl Into<Op>,
        root: usize,
        streams: &[S],
    ) -> Result<()> {
        self.collective(Collective::Reduce { count, root }, io, op.into(), streams)
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
            RedOp::Sum.into(),
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
            RedOp::Sum.into(),
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
            RedOp::Sum.into(),
            streams,
        )
    }
}
