//! Turns a finished [`Schedule`] into kernel launches, event records and event waits.
//!
//! For one call, on the streams the caller gave (one per rank):
//! 1. every rank's stream waits for the end of the communicator's previous call on that rank
//!    (so scratch is never reused early) and records a *start* event;
//! 2. rank `r`'s stream waits the start events of the ranks in `start_waits[r]` (their buffers
//!    are ready: the caller's earlier work on their streams is done);
//! 3. the steps, in order: the exec rank's stream waits the events of the step's `deps` on
//!    other ranks, the primitive is launched with addresses resolved from the step's
//!    [`Region`]s, and an event is recorded if a later step on another rank or an end wait
//!    needs it ([`ExecPlan`]);
//! 4. rank `r`'s stream waits the events of `end_waits[r]` and records the communicator's
//!    end-of-call event for `r`.
//!
//! While the streams are being captured into a CUDA graph, 1's wait and 4's record are left
//! out (an event recorded outside a capture cannot be waited on inside it, and vice versa):
//! the graph's own order keeps scratch safe between its calls, and scratch cannot grow
//! during a capture (run the call once eagerly first). Every rank's stream must be captured,
//! in one capture, or none (a mix is rejected). A scratch buffer a graph captured is never
//! freed before the communicator. Launches of such a graph must be ordered (on the streams)
//! with the communicator's other calls, eager or graphed, like any two calls on it.
//!
//! Small all-reduces skip all of this: [`execute_oneshot`] enqueues one kernel per rank, which
//! meet at a device-side barrier (`gpu_kernels::oneshot`).
//!
//! Nothing here blocks the host. Between two ranks without peer access (or with
//! `RINGCCL_P2P_DISABLE=1`) a step does not touch the peer's memory directly: sources are
//! first copied with `cuMemcpyPeerAsync` into a staging area in the exec rank's scratch, and
//! destinations on the peer are written to staging and copied out after the kernel.

use cudarc::driver::{sys, CudaEvent, CudaStream};

use crate::comm::{CallGuard, Communicator};
use crate::driver::{self, Traffic};
use crate::schedule::{BufId, Region, Schedule, Step};
use crate::{Arg, DataType, Error, RedOp, Result};

/// Staging slots and the start of the staging area are aligned to this many bytes.
const STAGE_ALIGN: usize = 256;

/// The caller's buffers of one rank, as device addresses (0 where the rank has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RankPtrs {
    /// The send (input) buffer.
    pub send: u64,
    /// The receive (output) buffer.
    pub recv: u64,
}

/// What the executor precomputes once per schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ExecPlan {
    /// `needs_event[i]`: step `i` must record an event (a later step of another rank depends
    /// on it, or another rank's end waits for it).
    pub needs_event: Vec<bool>,
}

/// A schedule checked and planned for execution (what the communicator caches).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// The schedule.
    pub schedule: Schedule,
    /// Its plan.
    pub plan: ExecPlan,
}

impl Prepared {
    /// Checks and plans `schedule`.
    pub(crate) fn new(schedule: Schedule) -> Result<Self> {
        let plan = ExecPlan::new(&schedule)?;
        Ok(Prepared { schedule, plan })
    }
}

fn malformed(reason: String) -> Error {
    Error::invalid(
        None,
        Arg::Ranks,
        format!("internal error: malformed schedule: {reason}"),
    )
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to).saturating_mul(to)
}

/// Checks the shape of a schedule, so that executing it cannot index out of range.
pub(crate) fn check_schedule(s: &Schedule) -> Result<()> {
    let n = s.nranks;
    if s.start_waits.len() != n || s.end_waits.len() != n {
        return Err(malformed(format!(
            "start/end waits for {} ranks",
            s.start_waits.len().min(s.end_waits.len())
        )));
    }
    if let Some(&q) = s.start_waits.iter().flatten().find(|&&q| q >= n) {
        return Err(malformed(format!("start wait on rank {q}")));
    }
    if let Some(&d) = s.end_waits.iter().flatten().find(|&&d| d >= s.steps.len()) {
        return Err(malformed(format!("end wait on step {d}")));
    }
    for (i, step) in s.steps.iter().enumerate() {
        let bad = |what: &str| malformed(format!("step {i}: {what}"));
        if step.exec >= n {
            return Err(bad("exec rank out of range"));
        }
        if !(1..=8).contains(&step.srcs.len()) || !(1..=2).contains(&step.dsts.len()) {
            return Err(bad("1..=8 sources and 1..=2 destinations"));
        }
        if step.srcs.len() > 2 && step.dsts.len() != 1 {
            return Err(bad("a reduce of more than 2 sources has one destination"));
        }
        let len = step.dsts[0].len;
        if step
            .srcs
            .iter()
            .chain(&step.dsts)
            .any(|r| r.rank >= n || r.len != len)
        {
            return Err(bad("region rank out of range or lengths differ"));
        }
        if step.deps.iter().any(|&d| d >= i) {
            return Err(bad("depends on a step that is not earlier"));
        }
    }
    Ok(())
}

impl ExecPlan {
    /// Checks `s` and computes which steps record an event.
    pub(crate) fn new(s: &Schedule) -> Result<Self> {
        check_schedule(s)?;
        let mut needs_event = vec![false; s.steps.len()];
        for step in &s.steps {
            for &d in &step.deps {
                if s.steps[d].exec != step.exec {
                    needs_event[d] = true;
                }
            }
        }
        for (r, waits) in s.end_waits.iter().enumerate() {
            for &d in waits {
                if s.steps[d].exec != r {
                    needs_event[d] = true;
                }
            }
        }
        Ok(ExecPlan { needs_event })
    }
}

/// The device address of `region` (`None` if its rank has no entry): Send/Recv from the
/// caller's `ptrs`, Scratch from the communicator's `scratch` base of that rank, plus
/// `offset × elem_size` bytes.
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

/// Whether `region`, touched by a step running on `exec`, must be staged (it lives on a rank
/// whose memory `exec` cannot access directly).
fn staged(region: &Region, exec: usize, peer: &impl Fn(usize, usize) -> bool) -> bool {
    region.rank != exec && !peer(exec, region.rank)
}

/// Bytes of staging one step needs on its exec rank.
fn step_staging(step: &Step, elem_size: usize, peer: &impl Fn(usize, usize) -> bool) -> usize {
    step.srcs
        .iter()
        .chain(&step.dsts)
        .filter(|r| staged(r, step.exec, peer))
        .map(|r| round_up(r.len * elem_size, STAGE_ALIGN))
        .sum()
}

/// For each rank, the staging bytes its steps need (the maximum over its steps: steps on one
/// stream reuse the same area one after the other).
pub(crate) fn staging_bytes(
    s: &Schedule,
    elem_size: usize,
    peer: impl Fn(usize, usize) -> bool,
) -> Vec<usize> {
    let mut out = vec![0; s.nranks];
    for step in &s.steps {
        if let Some(slot) = out.get_mut(step.exec) {
            *slot = (*slot).max(step_staging(step, elem_size, &peer));
        }
    }
    out
}

/// Where staging starts in a rank's scratch: after the schedule's own scratch elements.
pub(crate) fn staging_offset(s: &Schedule, elem_size: usize) -> usize {
    round_up(s.scratch_len * elem_size, STAGE_ALIGN)
}

/// Executes `s` (checked and planned here) for `dtype` and `op` on `streams` (one per rank, each
/// on that rank's device) with the caller's buffers `ptrs`. Returns once everything is enqueued.
pub(crate) fn execute(
    comm: &Communicator,
    s: &Schedule,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    streams: &[&CudaStream],
) -> Result<()> {
    let plan = ExecPlan::new(s)?;
    execute_planned(comm, s, &plan, dtype, op, ptrs, streams)
}

/// [`execute`] for a schedule prepared (and cached) earlier.
pub(crate) fn execute_prepared(
    comm: &Communicator,
    p: &Prepared,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    streams: &[&CudaStream],
) -> Result<()> {
    execute_planned(comm, &p.schedule, &p.plan, dtype, op, ptrs, streams)
}

fn event<'g>(g: &'g CallGuard<'_>, rank: usize, index: usize) -> Result<&'g CudaEvent> {
    g.event(rank, index)
        .ok_or_else(|| malformed(format!("no event {index} on rank {rank}")))
}

fn end_event<'g>(g: &'g CallGuard<'_>, rank: usize) -> Result<&'g CudaEvent> {
    g.end_event(rank)
        .ok_or_else(|| malformed(format!("no rank {rank}")))
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

#[allow(clippy::too_many_arguments)]
fn execute_planned(
    comm: &Communicator,
    s: &Schedule,
    plan: &ExecPlan,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    streams: &[&CudaStream],
) -> Result<()> {
    let n = s.nranks;
    if comm.nranks() != n
        || ptrs.len() != n
        || streams.len() != n
        || plan.needs_event.len() != s.steps.len()
    {
        return Err(malformed(format!(
            "{n} ranks in the schedule, {} in the communicator, {} buffers, {} streams",
            comm.nranks(),
            ptrs.len(),
            streams.len()
        )));
    }
    if s.steps.is_empty() {
        return Ok(());
    }
    let size = dtype.size();
    let stage = staging_bytes(s, size, |a, b| comm.peer_access(a, b));
    let stage_off = staging_offset(s, size);

    let capturing = capturing(streams)?;
    let mut g = comm.begin_call();
    let mut scratch = vec![0u64; n];
    for (r, base) in scratch.iter_mut().enumerate() {
        if s.scratch_len > 0 || stage[r] > 0 {
            *base = scratch_for_call(&mut g, r, stage_off + stage[r], capturing)?;
        }
    }

    let issued = issue(
        &mut g, s, plan, dtype, op, ptrs, streams, &scratch, stage_off, capturing,
    );
    if issued.is_err() && !capturing {
        // Best effort: join every rank's stream with every other (steps already enqueued may
        // touch any rank's memory), then mark the end, so that the next call's start (and a
        // scratch reallocation) waits for all of it.
        let mut marks = Vec::with_capacity(n);
        for (q, stream) in streams.iter().enumerate() {
            let ix = g.next_event(q).ok();
            let recorded = ix.and_then(|ix| g.event(q, ix).map(|e| e.record(stream).is_ok()));
            marks.push(ix.filter(|_| recorded == Some(true)));
        }
        for (r, stream) in streams.iter().enumerate() {
            for (q, ix) in marks.iter().enumerate() {
                if let Some(e) = ix.and_then(|ix| g.event(q, ix)) {
                    let _ = stream.wait(e);
                }
            }
            if let Some(end) = g.end_event(r) {
                let _ = end.record(stream);
            }
        }
    }
    issued
}

#[allow(clippy::too_many_arguments)]
fn issue(
    g: &mut CallGuard<'_>,
    s: &Schedule,
    plan: &ExecPlan,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    streams: &[&CudaStream],
    scratch: &[u64],
    stage_off: usize,
    capturing: bool,
) -> Result<()> {
    let n = s.nranks;
    // 1. Start events, after the previous call on each rank. While the streams are captured
    //    into a graph, the previous call's end event (recorded outside the capture) cannot be
    //    waited on (CUDA_ERROR_STREAM_CAPTURE_ISOLATION): the graph's own order stands in for it.
    let mut start = Vec::with_capacity(n);
    for (r, stream) in streams.iter().enumerate() {
        if !capturing {
            wait(stream, end_event(g, r)?, r)?;
        }
        let ix = g.next_event(r)?;
        record(event(g, r, ix)?, stream, r)?;
        start.push(ix);
    }
    // 2. Wait for the ranks whose memory this rank touches to have reached this call.
    for (r, waits) in s.start_waits.iter().enumerate() {
        for &q in waits {
            wait(streams[r], event(g, q, start[q])?, r)?;
        }
    }
    // 3. The steps.
    let mut step_event: Vec<Option<usize>> = vec![None; s.steps.len()];
    for (i, step) in s.steps.iter().enumerate() {
        let e = step.exec;
        let stream = streams[e];
        for &d in &step.deps {
            if s.steps[d].exec == e {
                continue; // same stream: already ordered
            }
            let ix = step_event[d]
                .ok_or_else(|| malformed(format!("step {i} depends on {d}, which has no event")))?;
            wait(stream, event(g, s.steps[d].exec, ix)?, e)?;
        }
        issue_step(
            g.comm(),
            step,
            s.nranks,
            dtype,
            op,
            ptrs,
            scratch,
            stage_off,
            stream,
        )?;
        if plan.needs_event[i] {
            let ix = g.next_event(e)?;
            record(event(g, e, ix)?, stream, e)?;
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
                malformed(format!(
                    "end of rank {r} waits step {d}, which has no event"
                ))
            })?;
            wait(streams[r], event(g, s.steps[d].exec, ix)?, r)?;
        }
        // Not while capturing: the next eager call must not wait on an event recorded inside
        // a capture.
        if !capturing {
            record(end_event(g, r)?, streams[r], r)?;
        }
    }
    Ok(())
}

/// Enqueues a one-shot all-reduce of `count` elements (see `gpu_kernels::oneshot`): on each
/// rank's stream, a wait for the communicator's previous call on that rank, ONE kernel (one
/// block that reads every rank's input directly and meets the other ranks' kernels at a
/// device-side barrier), and the record of the end-of-call event. No event crosses GPUs.
///
/// `ptrs[r].send` is rank `r`'s input and `ptrs[r].recv` its output; `in_place` when they are
/// equal on every rank: each rank's result is then staged in its scratch (`count` elements)
/// until every peer is done reading its input. The caller checks that one-shot is possible
/// (2 to 8 ranks, peer access between every pair: [`crate::tuning::all_reduce_algo`]).
///
/// While capturing into a CUDA graph, the previous call's end is neither waited on nor
/// recorded (as for [`execute`]); the kernels keep their epoch on the device, so replays of
/// the graph stay in step.
#[allow(clippy::too_many_arguments)]
pub(crate) fn execute_oneshot(
    comm: &Communicator,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    in_place: bool,
    count: usize,
    streams: &[&CudaStream],
) -> Result<()> {
    let n = comm.nranks();
    if ptrs.len() != n || streams.len() != n || !(2..=8).contains(&n) {
        return Err(malformed(format!(
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
        .ok_or_else(|| malformed(format!("{count} elements overflow")))?;
    let mut flags = [0u64; 8];
    for (r, f) in flags.iter_mut().take(n).enumerate() {
        *f = comm
            .oneshot_flags(r)
            .ok_or_else(|| malformed(format!("no flags for rank {r}")))?;
    }
    let srcs: Vec<u64> = ptrs.iter().map(|p| p.send).collect();
    let postdiv = u32::try_from(n).unwrap_or(u32::MAX);

    let capturing = capturing(streams)?;
    let mut g = comm.begin_call();
    let mut tmp = vec![None; n];
    if in_place {
        for (r, t) in tmp.iter_mut().enumerate() {
            *t = Some(scratch_for_call(&mut g, r, bytes, capturing)?);
        }
    }

    // Everything that can fail without a launch is checked for every rank first: a one-shot
    // kernel launched on some ranks only would wait for the others until it traps.
    for r in 0..n {
        comm.kernels(r)
            .ok_or_else(|| malformed(format!("no rank {r}")))?
            .oneshot_ready(dtype, op, n)?;
        end_event(&g, r)?;
    }
    let mut launched = 0usize;
    let mut issue = || -> Result<()> {
        for (r, stream) in streams.iter().enumerate() {
            let kernels = comm
                .kernels(r)
                .ok_or_else(|| malformed(format!("no rank {r}")))?;
            if !capturing {
                wait(stream, end_event(&g, r)?, r)?;
            }
            // SAFETY: the collective validated every rank's `count`-element buffers (inputs
            // and outputs on their own devices, outputs not partially overlapping inputs);
            // `tmp` is `count` elements of rank `r`'s scratch, sized above; the flag arrays
            // are the communicator's, alive until its drop waits for this call's end; the
            // caller checked peer access between every pair of ranks.
            unsafe {
                kernels.oneshot(
                    stream,
                    dtype,
                    op,
                    &srcs,
                    ptrs[r].recv,
                    tmp[r],
                    count,
                    postdiv,
                    &flags[..n],
                    r,
                )?
            };
            launched += 1;
            if !capturing {
                record(end_event(&g, r)?, stream, r)?;
            }
        }
        Ok(())
    };
    let issued = issue();
    if issued.is_err() && launched > 0 {
        // The launched ranks' device epochs have moved on without the others: never pair them
        // again through the device barrier.
        comm.disable_oneshot();
    }
    if issued.is_err() && !capturing {
        // Best effort, as in `execute_planned`. A rank whose kernel went out without its peers'
        // traps after `gpu_kernels::oneshot::TIMEOUT_NS` instead of hanging.
        for (r, stream) in streams.iter().enumerate() {
            if let Some(end) = g.end_event(r) {
                let _ = end.record(stream);
            }
        }
    }
    issued
}

/// Rank `r`'s scratch of at least `bytes` for this call. During a CUDA-graph capture it cannot
/// grow (the allocation and the wait it needs would go into the graph): that is an error telling
/// the caller to run the call once before capturing.
fn scratch_for_call(g: &mut CallGuard<'_>, r: usize, bytes: usize, capturing: bool) -> Result<u64> {
    if capturing {
        if g.scratch_bytes(r) < bytes {
            return Err(Error::invalid(
                Some(r),
                Arg::Stream,
                "the stream is being captured into a CUDA graph and this call needs more scratch \
                 memory than the communicator has: run the same call once before capturing",
            ));
        }
        g.mark_scratch_captured(r);
    }
    g.scratch_ptr(r, bytes)
}

/// Whether the streams are being captured into a CUDA graph: all of them or none (a mix would
/// launch some ranks now and the others at graph launch, or fail half-issued on a cross-stream
/// wait, so it is rejected before anything is enqueued).
fn capturing(streams: &[&CudaStream]) -> Result<bool> {
    let mut statuses = Vec::with_capacity(streams.len());
    for (r, stream) in streams.iter().enumerate() {
        let status = stream
            .capture_status()
            .map_err(|e| Error::cuda("cuStreamIsCapturing", Some(r), e))?;
        statuses.push(status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE);
    }
    capture_state(&statuses)
}

/// All-or-none rule of [`capturing`], on the per-rank capture flags.
fn capture_state(active: &[bool]) -> Result<bool> {
    let any = active.iter().any(|&a| a);
    match active.iter().position(|&a| a != any) {
        Some(r) if any => Err(Error::invalid(
            Some(r),
            Arg::Stream,
            "some ranks' streams are being captured into a CUDA graph and this one is not: \
             capture every rank's stream (in one capture) or none",
        )),
        _ => Ok(any),
    }
}

/// Enqueues one step on `stream` (its exec rank's stream).
#[allow(clippy::too_many_arguments)]
fn issue_step(
    comm: &Communicator,
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
    let len = step.dsts[0].len;
    if len == 0 {
        return Ok(());
    }
    let size = dtype.size();
    let bytes = len * size;
    let kernels = comm
        .kernels(e)
        .ok_or_else(|| malformed(format!("no rank {e}")))?;
    let addr = |r: &Region| {
        region_addr(r, size, ptrs, scratch)
            .ok_or_else(|| malformed(format!("no address for {r:?}")))
    };
    let peer = |a: usize, b: usize| comm.peer_access(a, b);
    let mut cursor = scratch[e] + stage_off as u64;
    let (mut reads_peer, mut writes_peer) = (false, false);

    let mut srcs = [0u64; 8];
    for (slot, r) in srcs.iter_mut().zip(&step.srcs) {
        let a = addr(r)?;
        *slot = if staged(r, e, &peer) {
            let stage = cursor;
            cursor += round_up(bytes, STAGE_ALIGN) as u64;
            // SAFETY: `a` is `len` elements of rank `r.rank`'s buffer (validated by the caller of
            // the collective); `stage` lies in rank `e`'s scratch, sized by `staging_bytes`.
            unsafe {
                driver::memcpy_peer_async(
                    stream,
                    comm.context(e),
                    stage,
                    comm.context(r.rank),
                    a,
                    bytes,
                    Some(e),
                )?
            };
            stage
        } else {
            reads_peer |= r.rank != e;
            a
        };
    }
    let mut dsts = [0u64; 2];
    let mut copy_out: [Option<(u64, usize, u64)>; 2] = [None, None];
    for ((slot, out), r) in dsts.iter_mut().zip(copy_out.iter_mut()).zip(&step.dsts) {
        let a = addr(r)?;
        *slot = if staged(r, e, &peer) {
            let stage = cursor;
            cursor += round_up(bytes, STAGE_ALIGN) as u64;
            *out = Some((stage, r.rank, a));
            stage
        } else {
            writes_peer |= r.rank != e;
            a
        };
    }
    let traffic = match (reads_peer, writes_peer) {
        (true, true) => Traffic::PeerDuplex,
        (false, false) => Traffic::Local,
        _ => Traffic::Peer,
    };

    let nsrc = step.srcs.len();
    let dst1 = (step.dsts.len() == 2).then_some(dsts[1]);
    let postdiv = if step.finish {
        u32::try_from(nranks).unwrap_or(u32::MAX)
    } else {
        1
    };
    // SAFETY: every address is `len` elements of `dtype` in a live buffer of its rank (the
    // collective validated the caller's buffers; scratch and staging were sized above), and
    // every address is accessible from rank `e` (its own memory, or a peer with peer access
    // enabled, or staging).
    unsafe {
        match nsrc {
            1 => kernels.copy(stream, dtype, srcs[0], dsts[0], dst1, len, traffic)?,
            2 => kernels.reduce_copy(
                stream, dtype, op, srcs[0], srcs[1], dsts[0], dst1, len, postdiv, traffic,
            )?,
            _ => kernels.reduce(
                stream,
                dtype,
                op,
                &srcs[..nsrc],
                dsts[0],
                len,
                postdiv,
                traffic,
            )?,
        }
    }
    for (stage, q, a) in copy_out.into_iter().flatten() {
        // SAFETY: as for the staged sources, in the other direction.
        unsafe {
            driver::memcpy_peer_async(
                stream,
                comm.context(q),
                a,
                comm.context(e),
                stage,
                bytes,
                Some(e),
            )?
        };
    }
    Ok(())
}

#[cfg(test)]
mod capture_tests {
    use super::capture_state;
    use crate::{Arg, Error};

    #[test]
    fn capture_is_all_or_none() {
        assert_eq!(capture_state(&[false, false]).ok(), Some(false));
        assert_eq!(capture_state(&[true, true, true]).ok(), Some(true));
        assert_eq!(capture_state(&[]).ok(), Some(false));
        for mixed in [
            [true, false, true],
            [false, true, true],
            [true, true, false],
        ] {
            match capture_state(&mixed) {
                Err(Error::InvalidArgument {
                    rank: Some(r),
                    arg: Arg::Stream,
                    ..
                }) => {
                    assert!(!mixed[r], "names a rank that is not captured");
                }
                other => panic!("mixed capture accepted: {other:?}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(rank: usize, buf: BufId, offset: usize, len: usize) -> Region {
        Region {
            rank,
            buf,
            offset,
            len,
        }
    }

    fn step(exec: usize, srcs: Vec<Region>, dsts: Vec<Region>, deps: Vec<usize>) -> Step {
        Step {
            exec,
            srcs,
            dsts,
            finish: false,
            deps,
        }
    }

    /// Two ranks, one-step all-reduce of 8 elements: each rank reduces its half from both
    /// ranks and writes it to both.
    fn two_rank_schedule() -> Schedule {
        use BufId::*;
        Schedule {
            nranks: 2,
            steps: vec![
                step(
                    0,
                    vec![reg(0, Send, 0, 4), reg(1, Send, 0, 4)],
                    vec![reg(0, Recv, 0, 4), reg(1, Recv, 0, 4)],
                    vec![],
                ),
                step(
                    1,
                    vec![reg(0, Send, 4, 4), reg(1, Send, 4, 4)],
                    vec![reg(1, Recv, 4, 4), reg(0, Recv, 4, 4)],
                    vec![],
                ),
                // A follow-up local copy on rank 0 that reads what rank 1 wrote.
                step(
                    0,
                    vec![reg(0, Recv, 4, 4)],
                    vec![reg(0, Scratch, 0, 4)],
                    vec![1],
                ),
                // And another on rank 0 depending on its own earlier step only.
                step(
                    0,
                    vec![reg(0, Scratch, 0, 4)],
                    vec![reg(0, Scratch, 4, 4)],
                    vec![2],
                ),
            ],
            scratch_len: 8,
            start_waits: vec![vec![1], vec![0]],
            end_waits: vec![vec![1], vec![0]],
        }
    }

    #[test]
    fn events_only_where_another_rank_waits() {
        let plan = ExecPlan::new(&two_rank_schedule()).unwrap();
        // Step 0: rank 1's end waits it. Step 1: step 2 (rank 0) and rank 0's end wait it.
        // Steps 2 and 3: only same-rank successors.
        assert_eq!(plan.needs_event, vec![true, true, false, false]);
    }

    #[test]
    fn same_rank_end_waits_need_no_event() {
        let mut s = two_rank_schedule();
        s.end_waits = vec![vec![0, 3], vec![]];
        let plan = ExecPlan::new(&s).unwrap();
        assert_eq!(plan.needs_event, vec![false, true, false, false]);
    }

    #[test]
    fn malformed_schedules_are_rejected() {
        let base = two_rank_schedule();
        let mut bad = Vec::new();
        let mut s = base.clone();
        s.steps[2].deps = vec![2];
        bad.push(("self dependency", s));
        let mut s = base.clone();
        s.steps[0].srcs[1].rank = 2;
        bad.push(("rank out of range", s));
        let mut s = base.clone();
        s.steps[0].exec = 5;
        bad.push(("exec out of range", s));
        let mut s = base.clone();
        s.steps[0].srcs.push(reg(0, BufId::Scratch, 0, 4));
        bad.push(("3 sources, 2 destinations", s));
        let mut s = base.clone();
        s.steps[0].dsts[1].len = 3;
        bad.push(("lengths differ", s));
        let mut s = base.clone();
        s.steps[0].srcs.clear();
        bad.push(("no source", s));
        let mut s = base.clone();
        s.end_waits[0] = vec![9];
        bad.push(("end wait out of range", s));
        let mut s = base.clone();
        s.start_waits.pop();
        bad.push(("waits for one rank", s));
        for (what, s) in bad {
            assert!(
                matches!(ExecPlan::new(&s), Err(Error::InvalidArgument { .. })),
                "{what} accepted"
            );
        }
        assert!(ExecPlan::new(&base).is_ok());
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
        assert_eq!(
            region_addr(&reg(0, BufId::Send, 0, 1), 4, &ptrs, &scratch),
            Some(0x1000)
        );
        assert_eq!(
            region_addr(&reg(0, BufId::Recv, 3, 1), 4, &ptrs, &scratch),
            Some(0x2000 + 12)
        );
        assert_eq!(
            region_addr(&reg(1, BufId::Send, 5, 1), 2, &ptrs, &scratch),
            Some(0x7000_0000 + 10)
        );
        assert_eq!(
            region_addr(&reg(1, BufId::Scratch, 7, 1), 8, &ptrs, &scratch),
            Some(0xb000 + 56)
        );
        assert_eq!(
            region_addr(&reg(0, BufId::Scratch, 1, 1), 1, &ptrs, &scratch),
            Some(0xa001)
        );
        assert_eq!(
            region_addr(&reg(2, BufId::Send, 0, 1), 4, &ptrs, &scratch),
            None
        );
        assert_eq!(
            region_addr(&reg(2, BufId::Scratch, 0, 1), 4, &ptrs, &scratch),
            None
        );
        let huge = reg(0, BufId::Send, usize::MAX, 1);
        assert_eq!(region_addr(&huge, 8, &ptrs, &scratch), None);
    }

    #[test]
    fn staging_only_between_ranks_without_peer_access() {
        let s = two_rank_schedule();
        // Full peer access: nothing staged.
        assert_eq!(staging_bytes(&s, 4, |_, _| true), vec![0, 0]);
        // None: step 0 on rank 0 stages 1 source and 1 destination of 16 B (256 B slots each).
        assert_eq!(staging_bytes(&s, 4, |a, b| a == b), vec![512, 512]);
        // Only rank 1 may access rank 0.
        assert_eq!(
            staging_bytes(&s, 4, |a, b| a == b || (a, b) == (1, 0)),
            vec![512, 0]
        );
        // Larger elements: 4 × 8 B = 32 B still fit one slot; 100 elements of 8 B need 1024 B.
        let mut big = s.clone();
        for st in &mut big.steps {
            for r in st.srcs.iter_mut().chain(st.dsts.iter_mut()) {
                r.len = 100;
            }
        }
        assert_eq!(staging_bytes(&big, 8, |a, b| a == b), vec![2048, 2048]);
    }

    #[test]
    fn staging_starts_after_aligned_scratch() {
        let mut s = two_rank_schedule();
        assert_eq!(staging_offset(&s, 4), 256);
        s.scratch_len = 0;
        assert_eq!(staging_offset(&s, 4), 0);
        s.scratch_len = 65;
        assert_eq!(staging_offset(&s, 4), 512);
    }

    /// Runs the one-step two-rank all-reduce above on real GPUs, with and without peer access.
    #[test]
    #[ignore = "needs 2+ CUDA GPUs"]
    fn two_gpu_all_reduce_with_and_without_peer_access() {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        for disable in [false, true] {
            // SAFETY (edition 2021: safe): tests in this binary that read the variable run here only.
            std::env::set_var(
                crate::comm::P2P_DISABLE_ENV,
                if disable { "1" } else { "0" },
            );
            let comm = Communicator::new(&[0, 1]).unwrap();
            assert_eq!(
                comm.peer_access(0, 1),
                !disable && crate::driver::can_access_peer(0, 1).unwrap()
            );
            let mut s = two_rank_schedule();
            s.steps[0].finish = true;
            s.steps[1].finish = true;
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
                let streams = [&**comm.stream(0), &**comm.stream(1)];
                execute(&comm, &s, DataType::F32, op, &ptrs, &streams).unwrap();
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
            let a = comm.scratch_ptr(0, 10).unwrap();
            assert_ne!(a, 0);
            assert_eq!(comm.scratch_ptr(0, 100).unwrap(), a);
            let b = comm.scratch_ptr(0, 5 << 20).unwrap();
            assert_ne!(b, 0);
            comm.synchronize().unwrap();
        }
    }
}
