//! The executor of a rank's part of a group of point-to-point transfers among processes: the
//! copies, signals and waits of a [`P2pPlan`](crate::plan::p2p::P2pPlan) on the rank's stream.
//!
//! Copies are `cuMemcpyDtoDAsync` (a copy engine) from the caller's send buffers into the peers'
//! scratch, mapped in this process, and from this rank's scratch into the caller's receive
//! buffers; signals (stream memory writes) and waits (the bounded wait kernel) are those of
//! [`super::process`], on the same per-pair counters as the collectives among processes. Like a collective, the group
//! starts after this rank's previous call and records its end. CUDA-graph capture is refused
//! by the caller (the counters' values would be frozen into the graph).
//!
//! [`execute_kernel`] runs a group on the point-to-point kernel instead (communicators of up to
//! 8 ranks over CUDA IPC: [`crate::plan::p2p_kernel`]): ONE launch, its counters on the
//! device, which can be captured.

use cudarc::driver::CudaStream;

use super::net::Combine;
use super::process::ProcessCall;
use super::{internal, partly_enqueued};
use crate::plan::p2p::{Action, P2pPlan, Place};
use crate::plan::signals::Signal;
use crate::{Error, Result};

/// Enqueues `plan` on `stream`; `bufs[i]` is the address of the buffer of the plan's operation
/// `i` (validated by the caller to hold the operation's bytes).
pub(crate) fn execute(
    call: &mut ProcessCall<'_>,
    plan: &P2pPlan,
    bufs: &[u64],
    stream: &CudaStream,
) -> Result<()> {
    let r = call.state.rank;
    call.health.check()?;
    if plan.actions.is_empty() {
        return Ok(());
    }
    begin(call, stream)?;
    group(call, plan, bufs, stream, None)?;
    call.state.order.record(stream, r)
}

/// Enqueues this rank's group as ONE point-to-point kernel (`gpu_kernels::p2p`) on `stream`:
/// after the previous call's end and recording its own end when eager (the stream may differ
/// from the previous call's), neither while capturing (the graph's launches are ordered on
/// the streams by the caller, as with NCCL). The kernel reads and advances its counters in the
/// ranks' point-to-point buffers itself; the host's signal counters are not touched.
///
/// Where the previous call ran on the same stream, the wait is left out (stream order
/// suffices: [`crate::resources::order::CallOrder`]).
///
/// The local copies of `plan.copies` (a rank's sends to itself and receives from itself over
/// several buffers) are enqueued before the kernel (`cuMemcpyDtoDAsync`).
///
/// # Safety
/// `plan` comes from [`crate::plan::p2p_kernel::plan`] for this rank's windows: its user
/// addresses are the caller's validated buffers (tracked until the kernel has run), every other
/// address is a point-to-point buffer of the communicator, mapped for its life.
pub(crate) unsafe fn execute_kernel(
    call: &mut ProcessCall<'_>,
    plan: &crate::plan::p2p_kernel::KernelPlan,
    stream: &CudaStream,
) -> Result<()> {
    let r = call.state.rank;
    let args = &plan.args;
    call.health.check()?;
    if args.blocks() == 0 && plan.copies.is_empty() {
        return Ok(());
    }
    let capturing = call.capturing;
    if !capturing {
        begin(call, stream)?;
    }
    let copied = plan.copies.iter().try_for_each(|&(src, dst, bytes)| {
        // SAFETY: `src` and `dst` are `bytes` within this rank's validated send and receive
        // buffers (the caller's contract), which do not overlap.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
            .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", Some(r), e))
    });
    // SAFETY: the caller's contract.
    let launched = copied.and_then(|()| call.health.injected_failure(r)).and_then(|()| {
        if args.blocks() == 0 {
            return Ok(());
        }
        unsafe { call.me.kernels.launch_p2p(stream, args) }
    });
    if let Err(cause) = launched {
        if capturing {
            // Nothing ran: the peers' parts are only captured too; the caller has the error.
            return Err(cause);
        }
        // The peers' kernels wait for this one's chunks and credits (until their timeout):
        // the job cannot go on.
        let _ = call.state.order.record(stream, r);
        return Err(partly_enqueued(call.health, vec![r], cause));
    }
    if capturing {
        return Ok(());
    }
    call.state.order.record(stream, r)
}

/// Where this rank's point-to-point kernel finds its memory: the ranks' point-to-point
/// buffers, the channel cap (the same on every rank) and the control block.
pub(crate) fn kernel_env<'a>(call: &'a ProcessCall<'_>) -> crate::plan::p2p_kernel::KernelEnv<'a> {
    let w = &call.state.windows;
    crate::plan::p2p_kernel::KernelEnv {
        rank: call.state.rank,
        bufs: w.p2p(),
        cap: gpu_kernels::p2p::channel_cap(w.two_shot_sms() as usize, call.state.sent.len()),
        ctl: call.health.ctl(),
        timeout_ns: call.health.timeout_ns(),
        slot: 0,
        // Registrations are collective: every rank has the same ones, and so posts alike.
        posted: w.registry_ref().has_live(),
        direct: &[],
    }
}

/// Per operation of this rank's group `ops` (buffer `bufs[i]` for `ops[i]`), for a receive
/// from a peer of more than [`LL_MAX_BYTES`](gpu_kernels::p2p::LL_MAX_BYTES): its buffer as
/// that peer's process maps it, where it lies inside a registered allocation every peer
/// mapped and still the one registered ([`crate::transport::registry::Registry::publish_for`]:
/// no driver call unless it hits a registered range); else 0 (the bytes go through the slots).
/// The kernel's [`KernelEnv::direct`](crate::plan::p2p_kernel::KernelEnv::direct).
pub(crate) fn receive_targets(
    call: &mut ProcessCall<'_>,
    ops: &[crate::plan::p2p::P2pOp],
    bufs: &[u64],
) -> crate::per_rank::PerOp<u64> {
    use crate::driver::zc_counters;
    use crate::transport::registry::Input;
    let (r, n) = (call.state.rank, call.state.sent.len());
    let ctx = call.state.windows.context().clone();
    let registry = call.state.windows.registry();
    ops.iter()
        .zip(bufs)
        .map(|(o, &buf)| {
            if o.dir != crate::plan::p2p::Dir::Recv || o.peer == r || gpu_kernels::p2p::is_ll(o.bytes) {
                return 0;
            }
            let found = registry.publish_for(buf, o.bytes as u64, r, n, |base| {
                ctx.bind_to_thread().ok()?;
                crate::driver::registered::buffer_id(base)
            });
            match found {
                Input::ZeroCopy(at) => {
                    zc_counters::zero_copy_receive();
                    at.get(o.peer).copied().unwrap_or(0)
                }
                Input::Staged => {
                    zc_counters::staged_receive();
                    0
                }
            }
        })
        .collect()
}

/// Enqueues this rank's part of collective `c` (of `dtype`, on the buffers `mine`, validated
/// by the collective) as one point-to-point kernel group
/// ([`crate::plan::p2p_kernel::collective_ops`]): how a gather, scatter, all-to-all or
/// all-gather is captured into a CUDA graph where the two-shot kernel cannot take it; a
/// reduce-scatter receives the peers' blocks into a temporary (allocated and freed on the
/// stream) and reduces them with its own in rank order (`op`). Refused before anything is
/// enqueued where the communicator's groups cannot run on the kernel.
pub(crate) fn collective(
    call: &mut ProcessCall<'_>,
    c: crate::plan::collective::Collective,
    (dtype, op): (crate::DataType, crate::RedOp),
    mine: super::RankPtrs,
    stream: &CudaStream,
) -> Result<()> {
    let (r, n) = (call.state.rank, call.state.sent.len());
    let size = dtype.size();
    if !(call.me.kernels.has_p2p() && call.state.windows.p2p().len() == n) {
        return Err(not_on_the_kernel(r, c));
    }
    if let crate::plan::collective::Collective::ReduceScatter { recvcount } = c {
        return reduce_scatter(call, recvcount, (dtype, op), mine, stream);
    }
    let (ops, bufs) = crate::plan::p2p_kernel::collective_ops(c, r, n, size, (mine.send, mine.recv))?;
    kernel_group(call, c, &ops, &bufs, stream)
}

/// The reduce-scatter of [`collective`]: `recvcount` elements per block.
fn reduce_scatter(
    call: &mut ProcessCall<'_>,
    recvcount: usize,
    (dtype, op): (crate::DataType, crate::RedOp),
    mine: super::RankPtrs,
    stream: &CudaStream,
) -> Result<()> {
    let (r, n) = (call.state.rank, call.state.sent.len());
    let bytes = recvcount.saturating_mul(dtype.size());
    let temps = super::premul::Temps::alloc(
        vec![stream],
        &[0],
        &[r],
        bytes.saturating_mul(n.saturating_sub(1)),
    )?;
    let temp = temps.ptrs().first().copied().unwrap_or(0);
    let (ops, bufs, srcs) = crate::plan::p2p_kernel::reduce_scatter_parts(r, n, bytes, mine.send, temp);
    let c = crate::plan::collective::Collective::ReduceScatter { recvcount };
    kernel_group(call, c, &ops, &bufs, stream)?;
    let cap = call.me.caps.for_traffic(crate::plan::tuning::Traffic::Local);
    let prim = crate::driver::launch::Prim::Reduce {
        srcs: &srcs,
        dst: mine.recv,
        postdiv: u32::try_from(n).unwrap_or(u32::MAX),
    };
    // SAFETY: the sources are this rank's own block of its validated send buffer and the
    // peers' blocks in the temporary (`n - 1` blocks of `bytes`, written by the group above on
    // this stream, freed after this kernel); the destination is its validated receive buffer,
    // equal to its own block in place and disjoint from the rest.
    unsafe { call.me.kernels.launch_prim(stream, dtype, op, prim, recvcount, cap) }?;
    temps.free()
}

/// The refusal of a collective whose point-to-point group cannot run on the kernel.
fn not_on_the_kernel(rank: usize, c: crate::plan::collective::Collective) -> Error {
    Error::invalid(
        Some(rank),
        crate::Arg::Stream,
        format!(
            "this {} cannot be captured into a CUDA graph in a job of processes: the \
             communicator's point-to-point groups do not run on the capturable kernel; call it \
             eagerly",
            c.name()
        ),
    )
}

/// Plans `ops` (buffers `bufs`, this rank's part of `c`) on the point-to-point kernel and
/// enqueues it.
fn kernel_group(
    call: &mut ProcessCall<'_>,
    c: crate::plan::collective::Collective,
    ops: &[crate::plan::p2p::P2pOp],
    bufs: &[u64],
    stream: &CudaStream,
) -> Result<()> {
    let (r, n) = (call.state.rank, call.state.sent.len());
    let planned = if call.me.kernels.has_p2p() && call.state.windows.p2p().len() == n {
        crate::plan::p2p_kernel::plan(ops, bufs, &kernel_env(call))?
    } else {
        None
    };
    let Some(plan) = planned else {
        return Err(not_on_the_kernel(r, c));
    };
    // SAFETY: the plan's user addresses are this rank's buffers of the collective, validated
    // by it to hold every block addressed (`collective_ops` stays inside them), receives
    // overlapping no send; under capture the caller keeps them alive as with NCCL; the other
    // addresses are the communicator's point-to-point buffers, mapped for its life (and a
    // graph's).
    unsafe { execute_kernel(call, &plan, stream) }
}

/// Orders `stream` after this rank's previous call (its context made current first).
pub(crate) fn begin(call: &ProcessCall<'_>, stream: &CudaStream) -> Result<()> {
    let r = call.state.rank;
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", Some(r), e))?;
    call.state.order.wait(stream, r)
}

/// One group on `stream`, after whatever the caller enqueued there: its copies, signals and
/// waits, with the receives combined into their buffers by `combine` if given (a collective's
/// reducing group); then counts its signals.
pub(crate) fn group(
    call: &mut ProcessCall<'_>,
    plan: &P2pPlan,
    bufs: &[u64],
    stream: &CudaStream,
    combine: Option<Combine<'_>>,
) -> Result<()> {
    let (r, n) = (call.state.rank, call.state.sent.len());
    if plan.sent.len() != n || plan.received.len() != n || r >= n {
        return Err(internal(format!(
            "rank {r} of {n}: a point-to-point plan for {} ranks",
            plan.sent.len()
        )));
    }
    if plan.actions.is_empty() {
        return Ok(());
    }
    let scratch_bytes = call.state.windows.scratch_bytes();
    if plan.slot.saturating_mul(plan.slots).saturating_mul(n) > scratch_bytes {
        return Err(internal(format!(
            "slots of {} bytes for {n} ranks exceed the scratch of {scratch_bytes} bytes",
            plan.slot
        )));
    }
    if let Err(cause) = issue(call, plan, bufs, stream, combine) {
        // The end event covers what was enqueued, so that the communicator's drop waits for it
        // before it unmaps the peers' buffers (best effort: the communicator is failed anyway).
        let _ = call.state.order.record(stream, r);
        if let Some(first) = call.health.failure() {
            // The rest was not enqueued because the communicator failed meanwhile (the check
            // before each wait): that failure is the group's error.
            return Err(first);
        }
        // Signals already enqueued cannot be taken back: the peers' counters and ours no longer
        // agree. The communicator is failed; its abort word ends the waits already enqueued.
        return Err(partly_enqueued(call.health, vec![r], cause));
    }
    for q in 0..n {
        call.state.sent[q] += plan.sent[q];
        call.state.received[q] += plan.received[q];
    }
    Ok(())
}

fn issue(
    call: &ProcessCall<'_>,
    plan: &P2pPlan,
    bufs: &[u64],
    stream: &CudaStream,
    combine: Option<Combine<'_>>,
) -> Result<()> {
    let r = call.state.rank;
    let scratch = call.state.windows.scratch();
    let addr = |p: Place| -> Result<u64> {
        let (base, offset) = match p {
            Place::Op { op, offset } => (bufs.get(op).copied(), offset),
            Place::Scratch { rank, offset } => (scratch.get(rank).copied(), offset),
        };
        base.and_then(|b| b.checked_add(offset as u64))
            .ok_or_else(|| internal(format!("no address for {p:?}")))
    };
    for a in &plan.actions {
        match *a {
            Action::Signal { peer, k } => call.send(stream, Signal { peer, k })?,
            Action::Wait { peer, k, .. } => {
                // Once the communicator has failed, the rest is not enqueued: its copies would
                // run after waits that no longer wait (one load of the control block).
                call.health.check()?;
                call.wait_for(stream, Signal { peer, k })?
            }
            Action::WaitCarried { .. } => {
                return Err(internal("a network plan's carried wait in a CUDA IPC group".into()))
            }
            Action::Copy {
                from: from @ Place::Scratch { rank, .. },
                to: to @ Place::Op { .. },
                bytes,
            } if rank == r && combine.is_some() => {
                let (src, dst) = (addr(from)?, addr(to)?);
                if let Some(c) = combine {
                    // SAFETY: `src` is `bytes` of this rank's scratch (inside its slot, the
                    // slots inside the scratch: checked above) and `dst` `bytes` of the
                    // caller's validated buffer; the plan's signals keep the slot from being
                    // rewritten before the kernel has read it.
                    unsafe { c.launch(stream, src, dst, bytes)? };
                }
            }
            Action::Copy { from, to, bytes } => {
                let (src, dst) = (addr(from)?, addr(to)?);
                // SAFETY: `src` and `dst` are `bytes` within the caller's validated buffers or a
                // rank's scratch (the plan keeps every chunk inside its slot, and the slots
                // inside the scratch: checked above), mapped in this process for the
                // communicator's life; the plan's signals keep a slot from being written while
                // its peer still reads it.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream())
                }
                .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", Some(r), e))?;
            }
        }
    }
    Ok(())
}
