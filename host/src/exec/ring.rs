//! The ring executor: a [`Prepared`] schedule as kernel launches, event records and event waits.
//!
//! For one call, on the streams the caller gave (one per rank):
//! 1. every rank's stream waits for the end of the communicator's previous call on that rank
//!    (so scratch is never reused early) and records a *start* event;
//! 2. rank `r`'s stream waits the start events of the ranks in `start_waits[r]` (their buffers
//!    are ready: the caller's earlier work on their streams is done);
//! 3. the steps, in order: the running rank's stream waits the events of the step's `deps` on
//!    other ranks, the primitive is launched with addresses resolved from the step's
//!    [`Region`]s (through the [transport](crate::transport): directly, or via staging), and
//!    an event is recorded if a later step on another rank or an end wait needs it
//!    ([`Prepared::needs_event`]);
//! 4. rank `r`'s stream waits the events of `end_waits[r]` and records the communicator's
//!    end-of-call event for `r`.
//!
//! While the streams are being captured into a CUDA graph, 1's wait and 4's record are left
//! out (see [`crate::exec`]).

use cudarc::driver::CudaStream;

use super::{internal, join_at_end, mark, partly_enqueued, prim_for, record, scratch_for_call, traffic, wait, RankPtrs};
use crate::plan::Prepared;
use crate::resources::Call;
use crate::schedule::{BufId, Region, Step};
use crate::transport::{is_staged, staging_offset, Path, Transport, STAGE_ALIGN};
use crate::{DataType, Error, RedOp, Result};

/// The device address of `region` (`None` if its rank has no entry): Send/Recv from the
/// caller's `ptrs`, Scratch from the `scratch` base of that rank, plus `offset × elem_size`
/// bytes.
pub(crate) fn region_addr(
    region: &Region,
    elem_size: usize,
    ptrs: &[RankPtrs],
    scratch: &[u64],
) -> Option<u64> {
    let base = match region.buf {
        BufId::Send => ptrs.get(region.rank)?.send,
        BufId::Recv => ptrs.get(region.rank)?.recv,
        BufId::Scratch => *scratch.get(region.rank)?,
    };
    let off = (region.offset as u64).checked_mul(elem_size as u64)?;
    base.checked_add(off)
}

/// Enqueues `p` for `dtype` and `op` on `streams` (one per rank, each on that rank's device)
/// with the caller's buffers `ptrs`. Returns once everything is enqueued.
///
/// `capturing`: whether the streams are being captured into a CUDA graph ([`super::capturing`],
/// checked by the caller before anything is enqueued).
pub(crate) fn execute<S: AsRef<CudaStream>>(
    call: &mut Call<'_>,
    p: &Prepared,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    streams: &[S],
    capturing: bool,
) -> Result<()> {
    let s = &p.schedule;
    let n = s.nranks;
    if call.nranks() != n
        || ptrs.len() != n
        || streams.len() != n
        || p.needs_event.len() != s.steps.len()
    {
        return Err(internal(format!(
            "{n} ranks in the schedule, {} in the communicator, {} buffers, {} streams",
            call.nranks(),
            ptrs.len(),
            streams.len()
        )));
    }
    if s.steps.is_empty() {
        return Ok(());
    }
    let size = dtype.size();
    let stage = call.transport().staging_bytes(s, size);
    let stage_off = staging_offset(s, size);

    let mut scratch = vec![0u64; n];
    for (r, base) in scratch.iter_mut().enumerate() {
        if s.scratch_len > 0 || stage[r] > 0 {
            *base = scratch_for_call(call, r, stage_off + stage[r], capturing)?;
        }
    }

    let mut enqueued = false;
    let issued = issue(
        call,
        p,
        dtype,
        op,
        ptrs,
        streams,
        &scratch,
        stage_off,
        capturing,
        &mut enqueued,
    );
    if issued.is_err() && !capturing {
        // Best effort: join every rank's stream with every other (steps already enqueued may
        // touch any rank's memory), then mark the end, so that the next call's start (and a
        // scratch reallocation) waits for all of it.
        let mut marks = Vec::with_capacity(n);
        for (q, stream) in streams.iter().enumerate() {
            marks.push(mark(call, q, stream.as_ref()));
        }
        join_at_end(call, streams, &marks);
    }
    match issued {
        // Part of the call went out: the caller must know its buffers hold no result, and the
        // communicator is failed (like a half-launched one-shot call).
        Err(cause) if enqueued && !matches!(cause, Error::PartlyEnqueued { .. }) => {
            Err(partly_enqueued(call.health(), (0..n).collect(), cause))
        }
        other => other,
    }
}

#[allow(clippy::too_many_arguments)]
fn issue<S: AsRef<CudaStream>>(
    call: &mut Call<'_>,
    p: &Prepared,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    streams: &[S],
    scratch: &[u64],
    stage_off: usize,
    capturing: bool,
    enqueued: &mut bool,
) -> Result<()> {
    let s = &p.schedule;
    let n = s.nranks;
    // 1. Start events, after the previous call on each rank. While the streams are captured
    //    into a graph, the previous call's end event (recorded outside the capture) cannot be
    //    waited on (CUDA_ERROR_STREAM_CAPTURE_ISOLATION): the graph's own order stands in for it.
    let mut start = Vec::with_capacity(n);
    for (r, stream) in streams.iter().enumerate() {
        let stream = stream.as_ref();
        if !capturing {
            wait(stream, call.end_event(r)?, r)?;
        }
        let ix = call.next_event(r)?;
        record(call.event(r, ix)?, stream, r)?;
        // From here on a failure leaves part of the call enqueued.
        *enqueued = true;
        start.push(ix);
    }
    // 2. Wait for the ranks whose memory this rank touches to have reached this call.
    for (r, waits) in s.start_waits.iter().enumerate() {
        for &q in waits {
            wait(streams[r].as_ref(), call.event(q, start[q])?, r)?;
        }
    }
    // 3. The steps.
    let mut step_event: Vec<Option<usize>> = vec![None; s.steps.len()];
    for (i, step) in s.steps.iter().enumerate() {
        let e = step.exec;
        let stream = streams[e].as_ref();
        for &d in &step.deps {
            if s.steps[d].exec == e {
                continue; // same stream: already ordered
            }
            let ix = step_event[d]
                .ok_or_else(|| internal(format!("step {i} depends on {d}, which has no event")))?;
            wait(stream, call.event(s.steps[d].exec, ix)?, e)?;
        }
        issue_step(call, step, s.nranks, dtype, op, ptrs, scratch, stage_off, stream)?;
        if p.needs_event[i] {
            let ix = call.next_event(e)?;
            record(call.event(e, ix)?, stream, e)?;
            step_event[i] = Some(ix);
        }
    }
    // 4. Join the other ranks' steps that touched this rank's memory; mark the end.
    for (r, waits) in s.end_waits.iter().enumerate() {
        for &d in waits {
            if s.steps[d].exec == r {
                continue;
            }
            let ix = step_event[d].ok_or_else(|| {
                internal(format!("end of rank {r} waits step {d}, which has no event"))
            })?;
            wait(streams[r].as_ref(), call.event(s.steps[d].exec, ix)?, r)?;
        }
        // Not while capturing: the next eager call must not wait on an event recorded inside
        // a capture.
        if !capturing {
            record(call.end_event(r)?, streams[r].as_ref(), r)?;
        }
    }
    Ok(())
}

/// Enqueues one step on `stream` (its running rank's stream).
#[allow(clippy::too_many_arguments)]
fn issue_step(
    call: &Call<'_>,
    step: &Step,
    nranks: usize,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    scratch: &[u64],
    stage_off: usize,
    stream: &CudaStream,
) -> Result<()> {
    let e = step.exec;
    let len = step.len();
    if len == 0 {
        return Ok(());
    }
    let size = dtype.size();
    let bytes = len * size;
    let me = call.rank(e)?;
    let transport: &Transport = call.transport();
    let addr = |r: &Region| {
        region_addr(r, size, ptrs, scratch).ok_or_else(|| internal(format!("no address for {r:?}")))
    };
    let mut cursor = scratch[e] + stage_off as u64;
    let (mut reads_peer, mut writes_peer) = (false, false);

    let mut srcs = [0u64; gpu_kernels::prim::MAX_SRCS];
    for (slot, r) in srcs.iter_mut().zip(&step.srcs) {
        let a = addr(r)?;
        *slot = if is_staged(transport, r, e) {
            let stage = cursor;
            cursor += bytes.div_ceil(STAGE_ALIGN).saturating_mul(STAGE_ALIGN) as u64;
            // SAFETY: `a` is `len` elements of rank `r.rank`'s buffer (validated by the caller of
            // the collective); `stage` lies in rank `e`'s scratch, sized by `staging_bytes`.
            unsafe { Transport::stage_in(stream, stage, &call.rank(r.rank)?.ctx, a, bytes, e)? };
            stage
        } else {
            reads_peer |= transport.path(e, r.rank) == Path::Direct;
            a
        };
    }
    let mut dsts = [0u64; 2];
    let mut copy_out: [Option<(u64, usize, u64)>; 2] = [None, None];
    for ((slot, out), r) in dsts.iter_mut().zip(copy_out.iter_mut()).zip(&step.dsts) {
        let a = addr(r)?;
        *slot = if is_staged(transport, r, e) {
            let stage = cursor;
            cursor += bytes.div_ceil(STAGE_ALIGN).saturating_mul(STAGE_ALIGN) as u64;
            *out = Some((stage, r.rank, a));
            stage
        } else {
            writes_peer |= transport.path(e, r.rank) == Path::Direct;
            a
        };
    }
    let traffic = traffic(reads_peer, writes_peer);

    let prim = prim_for(step, &srcs, &dsts, nranks);
    // SAFETY: every address is `len` elements of `dtype` in a live buffer of its rank (the
    // collective validated the caller's buffers; scratch and staging were sized above), and
    // every address is accessible from rank `e` (its own memory, a peer with peer access
    // enabled, or staging).
    unsafe {
        me.kernels
            .launch_prim(stream, dtype, op, prim, len, me.caps.for_traffic(traffic))?
    };
    for (stage, q, a) in copy_out.into_iter().flatten() {
        // SAFETY: as for the staged sources, in the other direction.
        unsafe { Transport::stage_out(stream, &call.rank(q)?.ctx, a, stage, bytes, e)? };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(rank: usize, buf: BufId, offset: usize, len: usize) -> Region {
        Region::new(rank, buf, offset, len)
    }

    #[test]
    fn regions_resolve_to_addresses() {
        let ptrs = [
            RankPtrs {
                send: 0x1000,
                recv: 0x2000,
            },
            RankPtrs {
                send: 0x7000_0000,
                recv: 0,
            },
        ];
        let scratch = [0xa000, 0xb000];
        let at = |r: Region, size| region_addr(&r, size, &ptrs, &scratch);
        assert_eq!(at(reg(0, BufId::Send, 0, 1), 4), Some(0x1000));
        assert_eq!(at(reg(0, BufId::Recv, 3, 1), 4), Some(0x2000 + 12));
        assert_eq!(at(reg(1, BufId::Send, 5, 1), 2), Some(0x7000_0000 + 10));
        assert_eq!(at(reg(1, BufId::Scratch, 7, 1), 8), Some(0xb000 + 56));
        assert_eq!(at(reg(0, BufId::Scratch, 1, 1), 1), Some(0xa001));
        assert_eq!(at(reg(2, BufId::Send, 0, 1), 4), None);
        assert_eq!(at(reg(2, BufId::Scratch, 0, 1), 4), None);
        assert_eq!(at(reg(0, BufId::Send, usize::MAX, 1), 8), None);
    }

    /// Runs a hand-built one-step two-rank all-reduce on real GPUs, with and without peer
    /// access.
    #[test]
    #[ignore = "needs 2+ CUDA GPUs"]
    fn two_gpu_all_reduce_with_and_without_peer_access() {
        use crate::schedule::Schedule;
        use crate::{Communicator, Config};
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let step = |exec, srcs, dsts| Step {
            exec,
            srcs,
            dsts,
            finish: true,
            deps: vec![],
        };
        use BufId::*;
        let s = Schedule {
            nranks: 2,
            steps: vec![
                step(0, vec![reg(0, Send, 0, 4), reg(1, Send, 0, 4)], vec![reg(0, Recv, 0, 4), reg(1, Recv, 0, 4)]),
                step(1, vec![reg(0, Send, 4, 4), reg(1, Send, 4, 4)], vec![reg(1, Recv, 4, 4), reg(0, Recv, 4, 4)]),
            ],
            scratch_len: 0,
            start_waits: vec![vec![1], vec![0]],
            end_waits: vec![vec![1], vec![0]],
        };
        let p = Prepared::new(s).unwrap();
        for disable in [false, true] {
            let config = Config {
                p2p_disable: disable,
                ..Config::default()
            };
            let comm = Communicator::with_config(&[0, 1], config).unwrap();
            assert_eq!(
                comm.peer_access(0, 1),
                !disable && crate::driver::can_access_peer(0, 1).unwrap()
            );
            for (op, call) in [(RedOp::Sum, 0), (RedOp::Avg, 1), (RedOp::Max, 2)] {
                let host: Vec<Vec<f32>> = (0..2)
                    .map(|r| (0..8).map(|i| (r * 10 + i + call) as f32).collect())
                    .collect();
                let send: Vec<_> = (0..2)
                    .map(|r| comm.stream(r).clone_htod(&host[r]).unwrap())
                    .collect();
                let mut recv: Vec<_> = (0..2)
                    .map(|r| comm.stream(r).alloc_zeros::<f32>(8).unwrap())
                    .collect();
                let mut ptrs = Vec::new();
                for r in 0..2 {
                    let st = comm.stream(r);
                    let (sp, _a) = send[r].device_ptr(st);
                    let (rp, _b) = recv[r].device_ptr_mut(st);
                    ptrs.push(RankPtrs { send: sp, recv: rp });
                }
                {
                    let mut c = comm.begin_call();
                    execute(&mut c, &p, DataType::F32, op, &ptrs, comm.streams(), false).unwrap();
                }
                comm.synchronize().unwrap();
                let want: Vec<f32> = (0..8)
                    .map(|i| {
                        let (a, b) = (host[0][i], host[1][i]);
                        match op {
                            RedOp::Sum => a + b,
                            RedOp::Avg => (a + b) / 2.0,
                            _ => a.max(b),
                        }
                    })
                    .collect();
                for (r, buf) in recv.iter().enumerate() {
                    let got = comm.stream(r).clone_dtoh(buf).unwrap();
                    assert_eq!(got, want, "rank {r} {op:?} p2p disabled: {disable}");
                }
            }
            // Scratch grows without host synchronisation and stays usable.
            let mut c = comm.begin_call();
            let a = c.scratch_ptr(0, 10).unwrap();
            assert_ne!(a, 0);
            assert_eq!(c.scratch_ptr(0, 100).unwrap(), a);
            let b = c.scratch_ptr(0, 5 << 20).unwrap();
            assert_ne!(b, 0);
            drop(c);
            comm.synchronize().unwrap();
        }
    }
}
