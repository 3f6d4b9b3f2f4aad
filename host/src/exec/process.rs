//! The executor of a rank whose peers are other processes: the schedule's steps of this rank,
//! ordered against the peers' steps by signals in device memory instead of events.
//!
//! The schedule has gone through [`crate::schedule::through_scratch`] (a peer's memory is reached only
//! in its scratch, which this process has mapped: [`crate::transport::ipc::Windows`]), and its
//! cross-rank orderings are numbered signals ([`crate::plan::signals::SignalPlan`]). On this
//! rank's stream, for one call:
//! 1. wait for the end of this rank's previous call (its scratch is free again);
//! 2. signal the peers that touch this rank's memory that it reached the call; wait for the
//!    peers whose memory it touches;
//! 3. per step of this rank: wait for the signals of its dependencies, launch it, signal the
//!    peers that wait for it;
//! 4. wait for the last signals of the peers that touched this rank's memory; record the end.
//!
//! A signal is a `cuStreamWriteValue64` of a growing counter into the peer's flag word (after
//! the stream's earlier work, with a memory fence), a wait is a one-thread kernel
//! (`gpu_kernels::oneshot::WAIT_ENTRY`) that polls this rank's flag word until it reaches it,
//! the communicator's abort word, and the clock: a peer that never signals (its process died)
//! ends the wait after [`crate::Config::timeout`] with a status the host reports as
//! [`Error::Timeout`], and an abort ends it at once (a `cuStreamWaitValue64` cannot be ended
//! either way). Nothing blocks the host. CUDA-graph capture of such a call is refused (the
//! counters' values would be frozen into the graph); the one-shot and two-shot kernels
//! ([`execute_oneshot`]) keep their barrier epochs on the device and can be captured.

use cudarc::driver::CudaStream;

use super::ring::region_addr;
use super::{internal, partly_enqueued, prim_for, traffic, RankPtrs};
use crate::driver::ipc::MemOps;
use crate::driver::launch::WaitArgs;
use crate::plan::signals::{Signal, SignalPlan};
use crate::plan::Prepared;
use std::sync::MutexGuard;

use crate::resources::{poll_until, Health, ProcessState, RankResources};
use crate::transport::ipc::Exchange;
use crate::schedule::{BufId, Region};
use crate::{DataType, Error, RedOp, Result};

/// What a call of a rank among processes works with: the rank's per-call handle, with its
/// per-call state locked for the call's issue.
pub struct ProcessCall<'a> {
    /// This rank's device, kernels and launch caps.
    pub me: &'a RankResources,
    /// The windows, the signal counters and the end of the previous call.
    pub state: MutexGuard<'a, ProcessState>,
    /// The stream memory operations.
    pub memops: &'a MemOps,
    /// The control block and timeout of the device waits, and the failure state.
    pub health: &'a Health,
    /// The ranks' exchange (the bootstrap), for growing the scratch.
    pub exchange: &'a dyn Exchange,
    /// Whether the stream is being captured into a CUDA graph: the previous call's end is
    /// then neither waited on nor recorded, and the scratch cannot grow.
    pub capturing: bool,
    /// Whether a one-shot input inside a registered buffer is read in place by the peers
    /// ([`crate::Config::zero_copy_reads`]).
    pub zero_copy_reads: bool,
}

impl ProcessCall<'_> {
    /// This rank and the job's size, checked for a kernel of 2 to `MAX_RANKS` ranks (`what`
    /// names the kernel in the error).
    pub fn kernel_ranks(&self, what: &str) -> Result<(usize, usize)> {
        let (r, n) = (self.state.rank, self.state.sent.len());
        if !(2..=gpu_kernels::oneshot::MAX_RANKS).contains(&n) || r >= n {
            return Err(internal(format!("{what} of {n} ranks")));
        }
        Ok((r, n))
    }

    /// Grows every rank's scratch to at least `bytes` if it is smaller (collective: every rank
    /// needs the same at the same call). Waits on the host for this rank's previous call first:
    /// its end means no peer still uses this rank's buffers and it no longer uses theirs.
    ///
    /// During a CUDA-graph capture the scratch cannot grow (the growth is a blocking exchange
    /// with every rank, which the peers would not join at the same call, and it would free the
    /// buffers other graphs hold): a call that needs more is refused before anything is
    /// enqueued, telling the caller to run one eager call of that size first. A captured call
    /// marks the scratch as held by a graph: a later growth keeps the old buffers and mappings
    /// ([`crate::transport::ipc::Windows::mark_captured`]).
    pub fn ensure_scratch(&mut self, bytes: usize) -> Result<()> {
        let have = self.state.windows.scratch_bytes();
        if self.capturing {
            if bytes > have {
                return Err(Error::invalid(
                    Some(self.state.rank),
                    crate::Arg::Stream,
                    format!(
                        "this call is being captured into a CUDA graph and needs {bytes} bytes of \
                         scratch memory, more than the communicator's {have}: the scratch grows \
                         only in an eager call (every rank at once), so run one eager call of \
                         this size on every rank before capturing"
                    ),
                ));
            }
            self.state.windows.mark_captured();
            return Ok(());
        }
        if bytes <= have {
            return Ok(());
        }
        let (rank, health) = (self.state.rank, self.health);
        let end = self.state.order.end();
        let done = poll_until(health.timeout(), || {
            health.check()?;
            if let Some(e) = health.device_status() {
                return Err(e);
            }
            match end.try_is_complete() {
                Ok(true) => Ok(Some(())),
                Ok(false) => Ok(None),
                Err(e) => Err(Error::cuda("cuEventQuery", Some(rank), e)),
            }
        });
        match done {
            Ok(Some(())) => {}
            Ok(None) => {
                return Err(Error::Timeout {
                    rank: Some(rank),
                    peer: None,
                    what: "the previous call before growing the scratch".into(),
                })
            }
            Err(e) => {
                health.fail(e.clone());
                return Err(e);
            }
        }
        let exchange = self.exchange;
        // A failed growth leaves the ranks' scratch out of step: the communicator is failed
        // (and its drop then leaks what the peers may still have mapped).
        self.state
            .windows
            .grow_scratch(bytes, exchange)
            .inspect_err(|e| health.fail(e.clone()))
    }
}

impl ProcessCall<'_> {
    pub(super) fn send(&self, stream: &CudaStream, s: Signal) -> Result<()> {
        let st = &self.state;
        let flag = st
            .windows
            .flag(s.peer, st.rank)
            .ok_or_else(|| internal(format!("no flag area for rank {}", s.peer)))?;
        let value = st.sent[s.peer] + s.k;
        // SAFETY: `flag` is a word of rank `s.peer`'s flag area, mapped in this process for the
        // communicator's life.
        unsafe { self.memops.write(stream, flag, value, st.rank) }
    }

    pub(super) fn wait_for(&self, stream: &CudaStream, s: Signal) -> Result<()> {
        let st = &self.state;
        let flag = st
            .windows
            .flag(st.rank, s.peer)
            .ok_or_else(|| internal(format!("no flag word for rank {}", s.peer)))?;
        let value = st.received[s.peer] + s.k;
        let args = WaitArgs {
            flag,
            value,
            ctl: self.health.ctl(),
            timeout_ns: self.health.timeout_ns(),
            slot: 0,
            peer: u32::try_from(s.peer).unwrap_or(u32::MAX),
        };
        // SAFETY: `flag` is a word of this rank's own flag area and the control block is the
        // communicator's, both alive until its drop waits for this call's end.
        unsafe { self.me.kernels.launch_wait(stream, &args) }
    }
}

/// Enqueues this rank's part of `p` (a schedule for processes, with its signals `sig`) on
/// `stream`, with this rank's buffers `mine`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn execute(
    call: &mut ProcessCall<'_>,
    p: &Prepared,
    sig: &SignalPlan,
    dtype: DataType,
    op: RedOp,
    mine: RankPtrs,
    stream: &CudaStream,
) -> Result<()> {
    let s = &p.schedule;
    let (r, n) = (call.state.rank, s.nranks);
    call.health.check()?;
    if r >= n || call.state.sent.len() != n || sig.count.len() != n * n {
        return Err(internal(format!("rank {r} of {n}: signal counters do not match")));
    }
    if s.steps.is_empty() {
        return Ok(());
    }
    let size = dtype.size();
    let need = s.scratch_len.saturating_mul(size);
    if need > call.state.windows.scratch_bytes() {
        return Err(internal(format!(
            "the scratch of {} bytes is smaller than the {need} this call needs",
            call.state.windows.scratch_bytes()
        )));
    }
    let mut ptrs = vec![RankPtrs::default(); n];
    ptrs[r] = mine;
    let mut enqueued = false;
    let issued = issue(call, p, sig, dtype, op, &ptrs, stream, &mut enqueued);
    if let Err(cause) = issued {
        if !enqueued {
            return Err(cause);
        }
        if call.capturing {
            // Nothing ran, and a job of one rank has no peer whose counters could disagree.
            return Err(cause);
        }
        // The end event covers what was enqueued, so that the communicator's drop waits for it
        // before it unmaps the peers' buffers (best effort: the communicator is failed anyway).
        let _ = call.state.order.record(stream, r);
        if let Some(first) = call.health.failure() {
            // The rest of the call was not enqueued because the communicator failed meanwhile
            // (the check between steps): that failure (naming the rank or peer) is the call's
            // error.
            return Err(first);
        }
        // Signals already enqueued cannot be taken back: the peers' counters and ours no longer
        // agree. The communicator is failed; its abort word ends the waits already enqueued.
        return Err(partly_enqueued(call.health, vec![r], cause));
    }
    for q in 0..n {
        call.state.sent[q] += sig.count[r * n + q];
        call.state.received[q] += sig.count[q * n + r];
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn issue(
    call: &mut ProcessCall<'_>,
    p: &Prepared,
    sig: &SignalPlan,
    dtype: DataType,
    op: RedOp,
    ptrs: &[RankPtrs],
    stream: &CudaStream,
    enqueued: &mut bool,
) -> Result<()> {
    let s = &p.schedule;
    let r = call.state.rank;
    let size = dtype.size();
    let scratch = call.state.windows.scratch();
    // Captured (a job of one rank, whose ring has no signal), the previous call's end is
    // neither waited on nor recorded, as for the one-shot kernels.
    if !call.capturing {
        call.state.order.wait(stream, r)?;
    }
    // Anything after the first signal or wait leaves the ranks' counters out of step on failure.
    *enqueued = true;
    for &x in &sig.start_send[r] {
        call.send(stream, x)?;
    }
    for &x in &sig.start_wait[r] {
        call.wait_for(stream, x)?;
    }
    let me = call.me;
    for (i, step) in s.steps.iter().enumerate().filter(|(_, st)| st.exec == r) {
        // Once the communicator has failed (a device wait gave up, a peer was lost, an abort),
        // the rest of the call is not enqueued: its data kernels would run on the peers'
        // scratch after waits that no longer wait. One load of the control block per step.
        call.health.check()?;
        for &x in &sig.before[i] {
            call.wait_for(stream, x)?;
        }
        let len = step.len();
        if len > 0 {
            let addr = |reg: &Region| {
                if reg.rank != r && reg.buf != BufId::Scratch {
                    return Err(internal(format!(
                        "a schedule for processes touches another rank's {:?}",
                        reg.buf
                    )));
                }
                region_addr(reg, size, ptrs, scratch)
                    .ok_or_else(|| internal(format!("no address for {reg:?}")))
            };
            let mut srcs = [0u64; gpu_kernels::prim::MAX_SRCS];
            for (slot, reg) in srcs.iter_mut().zip(&step.srcs) {
                *slot = addr(reg)?;
            }
            let mut dsts = [0u64; 2];
            for (slot, reg) in dsts.iter_mut().zip(&step.dsts) {
                *slot = addr(reg)?;
            }
            let reads_peer = step.srcs.iter().any(|x| x.rank != r);
            let writes_peer = step.dsts.iter().any(|x| x.rank != r);
            let prim = prim_for(step, &srcs, &dsts, s.nranks);
            let cap = me.caps.for_traffic(traffic(reads_peer, writes_peer));
            // SAFETY: every address is `len` elements of `dtype`: this rank's own buffers
            // (validated by the collective), or a rank's scratch (sized for the schedule and
            // mapped in this process); the schedule for processes touches no other memory.
            unsafe { me.kernels.launch_prim(stream, dtype, op, prim, len, cap)? };
        }
        for &x in &sig.after[i] {
            call.send(stream, x)?;
        }
    }
    for &x in &sig.end_wait[r] {
        call.wait_for(stream, x)?;
    }
    if call.capturing {
        return Ok(());
    }
    call.state.order.record(stream, r)
}

/// Enqueues this rank's part of a one-shot or two-shot (`shot`) all-reduce of `count` elements
/// among processes, or of another collective on the two-shot kernel (`count` as
/// [`super::oneshot::TwoShotOf`] counts it; see `gpu_kernels::oneshot`): ONE kernel per rank,
/// which
/// * one-shot: copies the input into this rank's scratch (which the peers have mapped), reads
///   every rank's copy, meets the peers' kernels at the device-side barrier over the mapped
///   flag arrays, and writes `mine.recv`;
/// * two-shot: copies the input into the scratch; each block folds a slice of this rank's
///   shard of every rank's copy and writes it into every rank's scratch, past the copies
///   ([`twoshot_out_offset`]); after its second barrier each block copies its slices of this
///   rank's result from there to `mine.recv`;
/// * reduce-scatter: copies the input into the scratch; each block folds a slice of this
///   rank's shard of every rank's copy straight into `mine.recv`;
/// * all-gather (all-to-all): each block copies a slice of `mine.send` (of each of its blocks)
///   into this rank's shard of every rank's scratch; after the second barrier, its slices of
///   every shard from this rank's scratch to `mine.recv`;
/// * broadcast: the root copies its input into its scratch; every rank copies it from there
///   into `mine.recv` (the root: from its own scratch, where it has an output of its own);
/// * reduce: every rank but the root copies its input into its scratch; the root folds every
///   rank's copy and its own input into `mine.recv`.
///
/// The kernel ends only once every peer is done reading this rank's scratch (and, two-shot,
/// writing it), so the next call may overwrite it. No signal, no event crosses processes. The
/// caller checks that the kind is possible (2 to `MAX_RANKS` ranks) and that the scratch holds
/// the call ([`scratch_for`]).
pub(crate) fn execute_oneshot(
    call: &mut ProcessCall<'_>,
    shot: super::oneshot::Shot,
    dtype: DataType,
    op: RedOp,
    mine: RankPtrs,
    count: usize,
    stream: &CudaStream,
) -> Result<()> {
    use super::oneshot::{RankKernel, Shot, TwoShotOf};
    use crate::transport::registry::Input;
    use gpu_kernels::oneshot::MAX_RANKS;
    // A one-shot input inside a registered allocation is read in place by the peers: the
    // lookup asks nothing of the driver unless the input hits a registered range.
    let input = match (shot, count.checked_mul(dtype.size())) {
        (Shot::One, Some(bytes))
            if call.zero_copy_reads
                && mine.send != 0
                && gpu_kernels::oneshot::reads_published(dtype, op)
                && !call.state.windows.registry().is_empty() =>
        {
            let (r, n) = (call.state.rank, call.state.sent.len());
            let ctx = call.state.windows.context().clone();
            call.state.windows.registry().publish_for(mine.send, bytes as u64, r, n, |base| {
                ctx.bind_to_thread().ok()?;
                crate::driver::registered::buffer_id(base)
            })
        }
        _ => Input::Staged,
    };
    let (r, n) = call.kernel_ranks("one-shot all-reduce")?;
    let st = &call.state;
    if count == 0 {
        return Ok(());
    }
    let bytes = count
        .checked_mul(dtype.size())
        .ok_or_else(|| internal(format!("{count} elements overflow")))?;
    let needed = scratch_for(shot, bytes, n).ok_or_else(|| internal(format!("{bytes} bytes overflow")))?;
    if needed > st.windows.scratch_bytes() {
        return Err(internal(format!("a call of {bytes} bytes per rank exceeds the scratch")));
    }
    let mut srcs = [0u64; MAX_RANKS];
    let mut dsts = [0u64; MAX_RANKS];
    let mut flags = [0u64; MAX_RANKS];
    let scratch = st.windows.scratch();
    if scratch.len() != n {
        return Err(internal(format!("{} scratch windows for {n} ranks", scratch.len())));
    }
    for (q, flag) in flags.iter_mut().enumerate().take(n) {
        *flag = match shot {
            Shot::One => st.windows.oneshot_flags(q),
            Shot::Two { .. } => st.windows.twoshot_flags(q),
        }
        .ok_or_else(|| internal(format!("no flag array for rank {q}")))?;
    }
    // Where each rank's part is read and written: the peers reach only the ranks' scratch; this
    // rank's own buffers are used directly on a side that is not staged.
    let stage = match shot {
        Shot::One | Shot::Two { of: TwoShotOf::AllReduce, .. } => {
            let out = twoshot_out_offset(bytes) as u64;
            srcs[..n].copy_from_slice(scratch);
            for q in 0..n {
                dsts[q] = scratch[q] + out;
            }
            (shot != Shot::One).then_some((mine.send, mine.recv))
        }
        Shot::Two { of: TwoShotOf::ReduceScatter, .. } => {
            srcs[..n].copy_from_slice(scratch);
            dsts[r] = mine.recv;
            Some((mine.send, 0))
        }
        Shot::Two { of: TwoShotOf::AllGather | TwoShotOf::AllToAll, .. } => {
            srcs[r] = mine.send;
            dsts[..n].copy_from_slice(scratch);
            Some((0, mine.recv))
        }
        Shot::Two { of: TwoShotOf::Broadcast { root }, .. } => {
            let root_scratch = *scratch.get(root).ok_or_else(|| internal(format!("root {root}")))?;
            srcs[root] = root_scratch;
            // The root copies its input into its output only where it has another one.
            let own = r != root || (mine.recv != 0 && mine.recv != mine.send);
            dsts[r] = if own { mine.recv } else { 0 };
            Some((if r == root { mine.send } else { 0 }, 0))
        }
        Shot::Two { of: TwoShotOf::Reduce { root }, .. } => {
            if root >= n {
                return Err(internal(format!("root {root} of {n} ranks")));
            }
            srcs[..n].copy_from_slice(scratch);
            if r == root {
                srcs[r] = mine.send;
                dsts[r] = mine.recv;
                Some((0, 0))
            } else {
                Some((mine.send, 0))
            }
        }
    };
    call.health.check()?;
    super::oneshot::ready(&call.me.kernels, shot, dtype, op, n)?;
    // Captured, the previous call's end (an event recorded outside the capture) is not waited
    // on: the graph's launches are ordered on the streams by the caller, as with NCCL. The
    // kernel's barrier epochs live in its flag array, so a replay meets the peers' replays
    // whatever ran before.
    let capturing = call.capturing;
    if !capturing {
        st.order.wait(stream, r)?;
    }
    // Zero-copy (one-shot): this rank reads its own input in place, and so do the peers, at the
    // addresses the kernel publishes to them; in place, the result goes through this rank's
    // scratch (free: nobody reads it in this call) until every peer is done reading.
    let (publish, tmp) = match input {
        Input::ZeroCopy(at) => {
            srcs[r] = mine.send;
            let tmp = (mine.recv == mine.send).then_some(scratch[r]);
            (Some(at), tmp)
        }
        Input::Staged => (None, None),
    };
    // A one-shot kernel is one block: above `STAGE_IN_KERNEL_MAX_BYTES` its copy of the input
    // is slower than the driver's, which then runs before it on the stream.
    let stage_in_kernel = matches!(shot, Shot::Two { .. }) || bytes <= STAGE_IN_KERNEL_MAX_BYTES;
    let staged = match shot {
        Shot::One => publish.is_none(),
        Shot::Two { .. } => stage.is_some_and(|(send, _)| send != 0),
    };
    if publish.is_some() {
        crate::driver::zc_counters::zero_copy_input();
    } else if staged {
        crate::driver::zc_counters::staged_input();
    }
    if !stage_in_kernel && publish.is_none() {
        // SAFETY: `mine.send` is `count` elements of this rank's input (validated by the
        // collective) and `srcs[r]` this rank's own scratch of at least `needed` bytes
        // (checked above); the previous call's end (waited for above) means no peer still
        // reads it.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(srcs[r], mine.send, bytes, stream.cu_stream())
        }
        .map_err(|e| Error::cuda("cuMemcpyDtoDAsync", Some(r), e))?;
    }
    let (ctl, timeout_ns) = (call.health.ctl(), call.health.timeout_ns());
    // SAFETY (both kernels): every source is a rank's scratch mapped in this process (or, the
    // all-gather half, this rank's validated input), every destination this rank's validated
    // output or a rank's scratch, each as long as the kernel's contract says in units of
    // `count`, inside the scratch ([`scratch_for`], checked above); the staged input and
    // output are this rank's validated buffers, and its scratch is free (the previous call's
    // end, waited for above, means no peer still reads or writes it); the flag arrays are the
    // ranks' flag areas, mapped for the communicator's life and used by no one but its
    // one-shot (two-shot) kernels; the control block is the communicator's.
    let kernel = RankKernel {
        shot,
        srcs: &srcs[..n],
        dsts: &dsts[..n],
        flags: &flags[..n],
        rank: r,
        count,
        dst: mine.recv,
        tmp,
        stage: match shot {
            Shot::One => (stage_in_kernel && publish.is_none()).then_some((mine.send, 0)),
            Shot::Two { .. } => stage,
        },
        ctl,
        timeout_ns,
        publish: match &publish {
            Some(at) => &at[..n],
            None => &[],
        },
    };
    // SAFETY: see above (both kernels).
    let launched = call
        .health
        .injected_failure(r)
        .and_then(|()| unsafe { kernel.launch(&call.me.kernels, stream, dtype, op) });
    if let Err(cause) = launched {
        if capturing {
            // Nothing ran: the launch went into a capture (often one invalidated by another
            // call), and the peers' parts are only captured too; the caller has the error. A
            // graph made of that capture anyway lacks this rank's kernel: its peers' replays
            // then end at their barrier's timeout, with an error.
            return Err(cause);
        }
        // The peers' kernels wait at the barrier for this one (until their timeout): the job
        // cannot go on.
        return Err(partly_enqueued(call.health, vec![r], cause));
    }
    if capturing {
        // Nor is the end recorded inside the capture: the next eager call must not wait on an
        // event recorded in a graph.
        return Ok(());
    }
    call.state.order.record(stream, r)
}

/// Enqueues an all-reduce, broadcast or reduce of `count` elements as consecutive kernels of
/// `shot` over chunks of at most `chunk` elements ([`crate::plan::call::CallPlan::ProcessShotChunks`],
/// cut by [`chunks`]). Every rank cuts the call alike, so the kernels' epochs advance alike.
pub(crate) fn execute_chunks(
    call: &mut ProcessCall<'_>,
    shot: super::oneshot::Shot,
    dtype: DataType,
    op: RedOp,
    mine: RankPtrs,
    (count, chunk): (usize, usize),
    stream: &CudaStream,
) -> Result<()> {
    if chunk == 0 {
        return Err(internal("a chunked call with chunks of 0 elements".into()));
    }
    for (part, len) in chunks(mine, count, chunk, dtype.size()) {
        execute_oneshot(call, shot, dtype, op, part, len, stream)?;
    }
    Ok(())
}

/// The chunks of an elementwise call of `count` elements of `size` bytes on `mine`: chunk `k`
/// is elements `k * chunk ..` of both buffers, at most `chunk` of them (a buffer the rank does
/// not have, address 0, stays 0); none when `chunk` is 0.
///
/// ```
/// use ringccl::internals::exec::process::chunks;
/// use ringccl::internals::exec::RankPtrs;
/// let mine = RankPtrs { send: 0x1000, recv: 0 };
/// let c: Vec<_> = chunks(mine, 10, 4, 2).collect();
/// assert_eq!(c.len(), 3);
/// assert_eq!(c[1], (RankPtrs { send: 0x1008, recv: 0 }, 4));
/// assert_eq!(c[2], (RankPtrs { send: 0x1010, recv: 0 }, 2));
/// ```
pub fn chunks(mine: RankPtrs, count: usize, chunk: usize, size: usize) -> impl Iterator<Item = (RankPtrs, usize)> {
    let at = move |base: u64, first: usize| {
        if base == 0 {
            0
        } else {
            base + (first * size) as u64
        }
    };
    let step = chunk.max(1);
    (0..if chunk == 0 { 0 } else { count })
        .step_by(step)
        .map(move |first| {
            let part = RankPtrs {
                send: at(mine.send, first),
                recv: at(mine.recv, first),
            };
            (part, chunk.min(count - first))
        })
}

/// Largest one-shot all-reduce among processes whose kernel copies the input into the scratch
/// itself (one launch fewer); above it the driver's copy, on many more SMs, runs first. On one
/// H200 with two processes under MPS, the one-block copy made a 256 KiB call 22.5 µs against
/// 18.8 µs with the driver's (`docs/PERFORMANCE.md`).
pub const STAGE_IN_KERNEL_MAX_BYTES: usize = 64 << 10;

pub use crate::plan::call::{scratch_for, twoshot_out_offset};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_call_once_in_order() {
        for (count, chunk, size) in [(1, 1, 4), (10, 3, 2), (1 << 20, 1000, 4), (7, 100, 8), (0, 5, 4)] {
            let mine = RankPtrs { send: 1 << 40, recv: 2 << 40 };
            let mut next = 0usize;
            for (part, len) in chunks(mine, count, chunk, size) {
                assert!(len >= 1 && len <= chunk);
                assert_eq!(part.send, mine.send + (next * size) as u64);
                assert_eq!(part.recv - part.send, mine.recv - mine.send, "both buffers move alike");
                next += len;
            }
            assert_eq!(next, count, "{count} elements in chunks of {chunk}");
        }
        assert_eq!(chunks(RankPtrs::default(), 10, 0, 4).count(), 0);
        // A buffer the rank does not have stays 0.
        assert!(chunks(RankPtrs { send: 0, recv: 64 }, 9, 4, 4).all(|(p, _)| p.send == 0));
    }
}
