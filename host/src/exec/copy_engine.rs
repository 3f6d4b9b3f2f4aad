//! The copy-engine executor: a [`CePlan`] (an all-reduce, all-gather, broadcast or all-to-all)
//! on two streams per rank, the caller's (reductions)
//! and the rank's copy stream (`cuMemcpyDtoDAsync` into the next rank's memory over peer
//! access, carried by the GPU's copy engines), ordered by events.
//!
//! For one call:
//! 1. every rank's stream waits for the end of the communicator's previous call on that rank
//!    and records a *start* event;
//! 2. every rank's copy stream waits for the start of every rank whose memory it reads or
//!    writes (its own, and the next rank's: its earlier work on its slots and buffers is done);
//! 3. the operations in plan order, each on its lane's stream after the events of the
//!    operations it waits for, with an event recorded where another lane waits for it;
//! 4. every rank's stream waits for the last operation of every copy stream that touched its
//!    memory, and records the communicator's end-of-call event.
//!
//! CUDA-graph capture is not supported here (the caller runs the ring instead). Nothing blocks
//! the host.

use cudarc::driver::CudaStream;

use super::{internal, join_at_end, mark, record, scratch_for_call, wait, RankPtrs};
use crate::driver::launch::Prim;
use crate::plan::copy_engine::{CePlan, Lane, Loc, Work};
use crate::plan::tuning::Traffic;
use crate::resources::Call;
use crate::{DataType, Error, RedOp, Result};

/// Enqueues `p` for `dtype` and `op` on `streams` (one per rank) and the ranks' copy streams,
/// with the caller's buffers `ptrs`. Every rank must reach every other's memory directly.
pub(crate) fn execute<S: AsRef<CudaStream>>(
    call: &mut Call<'_>,
    p: &CePlan,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    streams: &[S],
) -> Result<()> {
    let n = p.nranks;
    if call.nranks() != n || ptrs.len() != n || streams.len() != n || p.needs_event.len() != p.ops.len() {
        return Err(internal(format!(
            "{n} ranks in the copy-engine plan, {} in the communicator, {} buffers, {} streams",
            call.nranks(),
            ptrs.len(),
            streams.len()
        )));
    }
    if !call.transport().all_direct() {
        return Err(internal("the copy-engine all-reduce needs peer access between every pair".into()));
    }
    if p.ops.is_empty() {
        return Ok(());
    }
    let size = dtype.size();
    let slot_bytes = p.slot_elems.saturating_mul(size);
    let mut scratch = vec![0u64; n];
    if slot_bytes > 0 && p.slots > 0 {
        for (r, base) in scratch.iter_mut().enumerate() {
            *base = scratch_for_call(call, r, slot_bytes.saturating_mul(p.slots), false)?;
        }
    }
    let mut events: Vec<Option<(usize, usize)>> = vec![None; p.ops.len()];
    let issued = issue(call, p, dtype, op, ptrs, streams, &scratch, slot_bytes, &mut events);
    if issued.is_err() {
        // Best effort: every rank's stream waits for everything recorded so far on every copy
        // stream (copies in flight may touch any rank's memory), then marks the end, so the
        // next call's start waits for all of it.
        let mut marks = Vec::with_capacity(n);
        for q in 0..n {
            let copy = call.rank(q).map(|r| r.copy_stream.clone());
            marks.push(copy.ok().and_then(|s| mark(call, q, &s)));
        }
        join_at_end(call, streams, &marks);
    }
    issued
}

#[allow(clippy::too_many_arguments)]
fn issue<S: AsRef<CudaStream>>(
    call: &mut Call<'_>,
    p: &CePlan,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    streams: &[S],
    scratch: &[u64],
    slot_bytes: usize,
    events: &mut [Option<(usize, usize)>],
) -> Result<()> {
    let n = p.nranks;
    let size = dtype.size() as u64;
    let addr = |loc: Loc| -> Result<u64> {
        let (base, off) = match loc {
            Loc::Send { rank, offset } => (ptrs.get(rank).map(|x| x.send), offset as u64 * size),
            Loc::Recv { rank, offset } => (ptrs.get(rank).map(|x| x.recv), offset as u64 * size),
            Loc::Slot { rank, slot } => (scratch.get(rank).copied(), (slot * slot_bytes) as u64),
        };
        base.filter(|&b| b != 0)
            .and_then(|b| b.checked_add(off))
            .ok_or_else(|| internal(format!("no address for {loc:?}")))
    };
    // Which ranks' memory each copy stream touches.
    let mut touches = vec![vec![false; n]; n];
    for o in &p.ops {
        if let Work::Copy { dst, .. } = o.work {
            touches[o.rank][o.rank] = true;
            let (Loc::Send { rank, .. } | Loc::Recv { rank, .. } | Loc::Slot { rank, .. }) = dst;
            touches[o.rank][rank] = true;
        }
    }
    // 1. Start.
    let mut start = vec![0usize; n];
    for (r, stream) in streams.iter().enumerate() {
        let s = stream.as_ref();
        wait(s, call.end_event(r)?, r)?;
        start[r] = call.next_event(r)?;
        record(call.event(r, start[r])?, s, r)?;
    }
    // 2. The copy streams follow the starts of the ranks they touch.
    for (a, row) in touches.iter().enumerate() {
        let copy = call.rank(a)?.copy_stream.clone();
        for (q, _) in row.iter().enumerate().filter(|(_, &t)| t) {
            wait(&copy, call.event(q, start[q])?, a)?;
        }
    }
    // 3. The operations.
    for (i, o) in p.ops.iter().enumerate() {
        let r = o.rank;
        let me = call.rank(r)?;
        let stream: &CudaStream = match o.lane {
            Lane::Compute => streams[r].as_ref(),
            Lane::Copy => &me.copy_stream,
        };
        for &w in &o.waits {
            let (q, ix) = events
                .get(w)
                .copied()
                .flatten()
                .ok_or_else(|| internal(format!("operation {i} waits for {w}, which has no event")))?;
            wait(stream, call.event(q, ix)?, r)?;
        }
        match o.work {
            Work::Copy { src, dst, elems } => {
                let (s, d) = (addr(src)?, addr(dst)?);
                stream
                    .context()
                    .bind_to_thread()
                    .map_err(|e| Error::cuda("cuCtxSetCurrent", Some(r), e))?;
                // SAFETY: `s` and `d` are `elems` elements inside the caller's validated
                // buffers or a rank's scratch (slots inside the scratch allocated above), all
                // reachable from this context (peer access between every pair, checked above);
                // the plan's waits order this copy after their last writers and before their
                // next ones.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        d,
                        s,
                        elems.saturating_mul(size as usize),
                        stream.cu_stream(),
                    )
                }
                .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", Some(r), e))?;
            }
            Work::Reduce {
                a,
                b,
                dst,
                elems,
                finish,
            } => {
                let postdiv = if finish {
                    u32::try_from(n).unwrap_or(u32::MAX)
                } else {
                    1
                };
                let prim = Prim::ReduceCopy {
                    a: addr(a)?,
                    b: addr(b)?,
                    dst0: addr(dst)?,
                    dst1: None,
                    postdiv,
                };
                let cap = me.caps.for_traffic(Traffic::Local);
                // SAFETY: the three addresses are `elems` elements of this rank's own buffers
                // and scratch slot (see above); `dst` is the rank's output, equal to `a` in
                // place (the kernel allows an exact alias) and disjoint from the slot.
                unsafe { me.kernels.launch_prim(stream, dtype, op, prim, elems, cap)? };
            }
        }
        if p.needs_event[i] {
            let ix = call.next_event(r)?;
            record(call.event(r, ix)?, stream, r)?;
            events[i] = Some((r, ix));
        }
    }
    // 4. End: each rank's stream waits for the copy streams that touched its memory.
    for (r, stream) in streams.iter().enumerate() {
        let s = stream.as_ref();
        for (q, row) in touches.iter().enumerate() {
            if !row[r] {
                continue;
            }
            if let Some(last) = p.last[CePlan::lane_index(q, Lane::Copy)] {
                let (eq, ix) = events[last]
                    .ok_or_else(|| internal(format!("the last copy of rank {q} has no event")))?;
                wait(s, call.event(eq, ix)?, r)?;
            }
        }
        record(call.end_event(r)?, s, r)?;
    }
    Ok(())
}
