//! What a communicator holds per rank, and the per-call handle through which an executor
//! touches it.
//!
//! * [`RankResources`], fixed at creation: the device's primary context and a stream of the
//!   communicator's own, ringccl's kernels loaded there, the launch caps, and the flag array of
//!   the one-shot all-reduce's device-side barrier (plain `cuMemAlloc`, zeroed once, read and
//!   written by every rank's one-shot kernels over peer access);
//! * [`RankState`], changing from call to call: a scratch buffer grown on demand (partial
//!   results, staging), a pool of events (`CU_EVENT_DISABLE_TIMING`) for ordering steps across
//!   GPUs, and the event that marks the end of the communicator's previous call on the rank;
//! * [`Health`]: the communicator's control block (host memory mapped into every device: the
//!   abort word and the status words of `gpu_kernels::oneshot`), its timeout, and its first
//!   failure; shared by all calls, read and written without the call lock;
//! * [`Call`]: both, for one call, with the state locked: what an executor may touch;
//! * [`GraphHold`]: where a dropped communicator's resources wait for the last CUDA graph that
//!   captured one of its calls;
//! * [`rank_threads::RankThreads`]: a host thread per GPU that issues its rank's part of a
//!   small eager call.

mod health;
pub mod order;
pub mod rank_threads;

pub(crate) use health::{watch_peers, Probe};
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use health::Control;
pub use health::{Health, CALLER_ABORT};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};

use crate::config::Config;
use crate::driver::Kernels;
use crate::plan::tuning::BlockCaps;
use crate::transport::ipc::Windows;
use crate::transport::Transport;
use crate::{Error, Result};

/// Scratch grows in steps of this many bytes, so slowly growing calls do not reallocate each time.
pub const SCRATCH_GRANULE: usize = 1 << 20;

/// What is fixed about one rank.
#[derive(Debug)]
pub struct RankResources {
    /// The device ordinal.
    pub ordinal: usize,
    /// The device's primary context.
    pub ctx: Arc<CudaContext>,
    /// A non-blocking stream of the communicator's own.
    pub stream: Arc<CudaStream>,
    /// A second stream of the communicator's own, for peer copies that overlap the caller's
    /// stream (the copy-engine all-reduce).
    pub copy_stream: Arc<CudaStream>,
    /// ringccl's kernels in `ctx`.
    pub kernels: Kernels,
    /// The device's name.
    pub name: String,
    /// The one-shot barrier's flags.
    pub flags: OneShotFlags,
    /// Launch caps on this device.
    pub caps: BlockCaps,
    /// The device's memory pool current at creation (as an address; 0: none), to which peer
    /// access is granted with the context's (see `driver::enable_peer_access`).
    pub granted_pool: usize,
}

impl RankResources {
    /// Sets up rank `rank` on device `ordinal`: context, stream, kernels (the driver compiles
    /// the embedded PTX), flags.
    pub fn new(rank: usize, ordinal: usize, config: &Config) -> Result<Self> {
        let r = Some(rank);
        let ctx =
            CudaContext::new(ordinal).map_err(|e| Error::cuda("cuDevicePrimaryCtxRetain", r, e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| Error::cuda("cuStreamCreate", r, e))?;
        let copy_stream = ctx
            .new_stream()
            .map_err(|e| Error::cuda("cuStreamCreate", r, e))?;
        let kernels = Kernels::load(&ctx, r)?;
        let name = ctx
            .name()
            .map_err(|e| Error::cuda("cuDeviceGetName", r, e))?;
        let flags = OneShotFlags::new(&ctx, &stream, rank)?;
        let caps = BlockCaps::new(kernels.sm_count(), config);
        let granted_pool = if ctx.has_async_alloc() {
            // SAFETY: `cu_device` comes from `cuDeviceGet` (inside `CudaContext::new`).
            unsafe { result::device::get_mem_pool(ctx.cu_device()) }.map_or(0, |p| p as usize)
        } else {
            0
        };
        Ok(RankResources {
            ordinal,
            ctx,
            stream,
            copy_stream,
            kernels,
            name,
            flags,
            caps,
            granted_pool,
        })
    }
}

/// One rank's flags for the one-shot and two-shot all-reduces: the one-shot kernel's array of
/// `gpu_kernels::oneshot::FLAG_WORDS` `u64` at [`OneShotFlags::ptr`], then the two-shot
/// kernel's region of `TWO_SHOT_FLAG_WORDS` at [`OneShotFlags::two_shot`], from plain
/// `cuMemAlloc` (peer access enabled with `cuCtxEnablePeerAccess` covers it), zeroed at
/// creation, freed on drop.
#[derive(Debug)]
pub struct OneShotFlags {
    ctx: Arc<CudaContext>,
    /// The device address.
    pub ptr: u64,
}

impl OneShotFlags {
    const BYTES: usize = (gpu_kernels::oneshot::FLAG_WORDS + gpu_kernels::oneshot::TWO_SHOT_FLAG_WORDS) * 8;

    /// The device address of the two-shot flag region.
    pub fn two_shot(&self) -> u64 {
        self.ptr + (gpu_kernels::oneshot::FLAG_WORDS * 8) as u64
    }

    /// Allocates and zeroes the array (the zeroing is finished when this returns).
    fn new(ctx: &Arc<CudaContext>, stream: &CudaStream, rank: usize) -> Result<Self> {
        let r = Some(rank);
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", r, e))?;
        // SAFETY: `ctx` is current; the memory is zeroed below before any kernel reads it.
        let ptr = unsafe { result::malloc_sync(Self::BYTES) }
            .map_err(|e| Error::cuda("cuMemAlloc", r, e))?;
        let flags = OneShotFlags {
            ctx: ctx.clone(),
            ptr,
        };
        // SAFETY: `ptr` is `BYTES` bytes of live device memory of this context; `stream` is a
        // stream of this context, synchronised right after.
        unsafe { result::memset_d8_async(ptr, 0, Self::BYTES, stream.cu_stream()) }
            .map_err(|e| Error::cuda("cuMemsetD8Async", r, e))?;
        stream
            .synchronize()
            .map_err(|e| Error::cuda("cuStreamSynchronize", r, e))?;
        Ok(flags)
    }
}

impl Drop for OneShotFlags {
    fn drop(&mut self) {
        // The communicator's `drop` has waited for every call's end on this rank first.
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: `ptr` came from `cuMemAlloc` in this context and is freed once, here.
        self.ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}

/// Where a communicator's device resources go when it is dropped while CUDA graphs that
/// captured its calls still exist. Every captured call gives its graph a reference to the
/// communicator's `Arc<GraphHold>` (`driver::graph::keep_alive_in_graph`); the communicator's
/// drop moves its resources here if any such reference is left, and they are freed with the
/// last one (on a thread of their own, after the graphs' launches have finished).
#[derive(Default)]
pub struct GraphHold {
    remains: Mutex<Option<Box<dyn Send>>>,
}

impl GraphHold {
    /// Keeps `remains` until the last reference to this hold is dropped.
    pub fn hold(&self, remains: Box<dyn Send>) {
        *self.remains.lock().unwrap_or_else(|p| p.into_inner()) = Some(remains);
    }
}

impl std::fmt::Debug for GraphHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self
            .remains
            .lock()
            .map(|r| r.is_some())
            .unwrap_or(true);
        f.debug_struct("GraphHold").field("holds", &held).finish()
    }
}

/// What changes from call to call on one rank.
#[derive(Debug)]
pub struct RankState {
    scratch: Option<CudaSlice<u8>>,
    /// A CUDA graph captured a call that used `scratch`.
    scratch_captured: bool,
    /// Scratch buffers replaced while a captured graph may still use them; freed on drop.
    retired: Vec<CudaSlice<u8>>,
    scratch_ptr: u64,
    scratch_bytes: usize,
    events: Vec<CudaEvent>,
    next_event: usize,
    /// The end of the previous call on this rank.
    pub end: CudaEvent,
}

impl RankState {
    /// The state of a fresh rank (no scratch yet).
    pub fn new(ctx: &Arc<CudaContext>, rank: usize) -> Result<Self> {
        Ok(RankState {
            scratch: None,
            scratch_captured: false,
            retired: Vec::new(),
            scratch_ptr: 0,
            scratch_bytes: 0,
            events: Vec::new(),
            next_event: 0,
            end: new_event(ctx, Some(rank))?,
        })
    }
}

fn new_event(ctx: &Arc<CudaContext>, rank: Option<usize>) -> Result<CudaEvent> {
    ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(|e| Error::cuda("cuEventCreate", rank, e))
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to).saturating_mul(to)
}

/// One call's view of a communicator's resources, with the per-call state locked (calls from
/// several threads are issued one after the other).
pub struct Call<'a> {
    ranks: &'a [RankResources],
    transport: &'a Transport,
    state: MutexGuard<'a, Vec<RankState>>,
    oneshot_broken: &'a AtomicBool,
    health: &'a Health,
}

fn no_rank(rank: usize) -> Error {
    Error::Internal {
        reason: format!("rank {rank} out of range"),
    }
}

impl<'a> Call<'a> {
    /// The handle for one call (event indices start again at 0).
    pub(crate) fn new(
        ranks: &'a [RankResources],
        transport: &'a Transport,
        mut state: MutexGuard<'a, Vec<RankState>>,
        oneshot_broken: &'a AtomicBool,
        health: &'a Health,
    ) -> Self {
        for st in state.iter_mut() {
            st.next_event = 0;
        }
        Call {
            ranks,
            transport,
            state,
            oneshot_broken,
            health,
        }
    }

    /// The communicator's health (control block, timeout, failure).
    pub fn health(&self) -> &'a Health {
        self.health
    }

    /// Checks every rank's context before anything is launched on the call's `streams`: a
    /// fault of earlier work is sticky, and the driver returns it from a query of the stream
    /// or of the rank's end event. Costs two queries per rank (see [`Probe::check`] for which
    /// rank an error names).
    ///
    /// Nothing is queried while the streams are being captured into a CUDA graph (a query of
    /// a capturing stream is refused and invalidates the capture): a fault then shows at the
    /// graph's launch or the next eager call.
    pub fn check_contexts<S: AsRef<CudaStream>>(&self, streams: &[S], capturing: bool) -> Result<()> {
        if capturing {
            return Ok(());
        }
        for (r, st) in self.state.iter().enumerate() {
            Probe {
                rank: r,
                event: st.end.cu_event(),
                stream: streams.get(r).map(|s| s.as_ref().cu_stream()),
            }
            .check()?;
        }
        Ok(())
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.ranks.len()
    }

    /// Rank `rank`'s fixed resources.
    pub fn rank(&self, rank: usize) -> Result<&'a RankResources> {
        self.ranks.get(rank).ok_or_else(|| no_rank(rank))
    }

    /// How the ranks reach each other.
    pub fn transport(&self) -> &'a Transport {
        self.transport
    }

    /// Stops using the one-shot all-reduce on this communicator: a one-shot call failed after
    /// some ranks' kernels were launched, so the ranks' device epochs may disagree from now on.
    pub fn disable_oneshot(&self) {
        self.oneshot_broken.store(true, Ordering::Release);
    }

    /// The address of `rank`'s scratch, grown to at least `bytes` bytes.
    ///
    /// Growing is stream-ordered, without blocking the host: the rank's own stream waits for
    /// the end of the previous call (the last user of the old buffer), frees it there, allocates
    /// the new one there, and the end-of-previous-call event is re-recorded after the
    /// allocation, so the next call's start (which waits on that event) sees the new memory.
    /// Once a CUDA graph has captured a call that used the scratch, the old buffer is kept
    /// (retired, freed with the communicator) instead: the graph holds its address.
    pub fn scratch_ptr(&mut self, rank: usize, bytes: usize) -> Result<u64> {
        let r = Some(rank);
        let (Some(info), Some(st)) = (self.ranks.get(rank), self.state.get_mut(rank)) else {
            return Err(no_rank(rank));
        };
        if bytes <= st.scratch_bytes {
            return Ok(st.scratch_ptr);
        }
        let new_bytes = round_up(bytes, SCRATCH_GRANULE);
        let stream = &info.stream;
        stream
            .wait(&st.end)
            .map_err(|e| Error::cuda("cuStreamWaitEvent", r, e))?;
        st.scratch_ptr = 0;
        st.scratch_bytes = 0;
        // Freed on `stream` (stream-ordered) after the wait above, unless a captured graph
        // holds its address.
        if let Some(old) = st.scratch.take() {
            if st.scratch_captured {
                st.retired.push(old);
            }
        }
        // SAFETY: the contents are never read before a step writes them.
        let slice = unsafe { stream.alloc::<u8>(new_bytes) }
            .map_err(|e| Error::cuda("cuMemAllocAsync", r, e))?;
        let ptr = {
            let (p, _record) = slice.device_ptr(stream);
            p
        };
        st.end
            .record(stream)
            .map_err(|e| Error::cuda("cuEventRecord", r, e))?;
        st.scratch = Some(slice);
        st.scratch_ptr = ptr;
        st.scratch_bytes = new_bytes;
        Ok(ptr)
    }

    /// The bytes of `rank`'s scratch allocated now (0 for none or a bad rank).
    pub fn scratch_bytes(&self, rank: usize) -> usize {
        self.state.get(rank).map_or(0, |st| st.scratch_bytes)
    }

    /// Notes that a CUDA graph captured a call using `rank`'s scratch (its buffer must then
    /// outlive the communicator's use of it: see [`Call::scratch_ptr`]).
    pub fn mark_scratch_captured(&mut self, rank: usize) {
        if let Some(st) = self.state.get_mut(rank) {
            st.scratch_captured = true;
        }
    }

    /// A fresh event of `rank`'s context, distinct from every other event handed out during
    /// this call; returns its index for [`Call::event`].
    pub fn next_event(&mut self, rank: usize) -> Result<usize> {
        let (Some(info), Some(st)) = (self.ranks.get(rank), self.state.get_mut(rank)) else {
            return Err(no_rank(rank));
        };
        let i = st.next_event;
        if i == st.events.len() {
            st.events.push(new_event(&info.ctx, Some(rank))?);
        }
        st.next_event += 1;
        Ok(i)
    }

    /// Event `index` of `rank`'s pool.
    pub fn event(&self, rank: usize, index: usize) -> Result<&CudaEvent> {
        self.state
            .get(rank)
            .and_then(|st| st.events.get(index))
            .ok_or_else(|| Error::Internal {
                reason: format!("no event {index} on rank {rank}"),
            })
    }

    /// The event that marks the end of the previous call on `rank` (recorded again at the end
    /// of this one).
    pub fn end_event(&self, rank: usize) -> Result<&CudaEvent> {
        self.state
            .get(rank)
            .map(|st| &st.end)
            .ok_or_else(|| no_rank(rank))
    }
}

/// What changes from call to call for a rank whose peers are other processes.
#[derive(Debug)]
pub struct ProcessState {
    /// This rank.
    pub rank: usize,
    /// Every rank's scratch and flag area, as this process reaches them.
    pub windows: Windows,
    /// The end of this rank's previous call, and the stream it was recorded on.
    pub order: order::CallOrder,
    /// Signals this rank has sent to each rank, over all earlier calls.
    pub sent: Vec<u64>,
    /// Signals each rank has sent to this rank, over all earlier calls.
    pub received: Vec<u64>,
}

impl ProcessState {
    /// The state of rank `rank` of `nranks` with its windows, before its first call.
    pub fn new(ctx: &Arc<CudaContext>, rank: usize, nranks: usize, windows: Windows) -> Result<Self> {
        Ok(ProcessState {
            rank,
            windows,
            order: order::CallOrder::new(new_event(ctx, Some(rank))?, crate::driver::stream::StreamIds::load()?),
            sent: vec![0; nranks],
            received: vec![0; nranks],
        })
    }
}

/// Polls `done` with growing pauses (yields, then sleeps from 10 µs up to 1 ms: no busy spin)
/// until it returns `Some`, or `limit` (`None`: no limit) has passed: then `Ok(None)`.
pub(crate) fn poll_until<T>(
    limit: Option<Duration>,
    mut done: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    let start = Instant::now();
    let mut polls = 0u32;
    let mut pause = Duration::from_micros(10);
    loop {
        if let Some(v) = done()? {
            return Ok(Some(v));
        }
        if limit.is_some_and(|l| start.elapsed() >= l) {
            return Ok(None);
        }
        polls += 1;
        if polls < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_graph_hold_frees_what_it_holds_with_its_last_reference() {
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let freed = Arc::new(AtomicBool::new(false));
        let hold: Arc<GraphHold> = Arc::default();
        let graph_ref = Arc::clone(&hold); // what a captured call gives its graph
        hold.hold(Box::new(Flag(Arc::clone(&freed))));
        drop(hold); // the communicator's drop
        assert!(!freed.load(Ordering::SeqCst), "freed while a graph holds it");
        drop(graph_ref); // the last graph goes
        assert!(freed.load(Ordering::SeqCst));
    }

    #[test]
    fn scratch_rounds_to_granule() {
        assert_eq!(round_up(1, SCRATCH_GRANULE), SCRATCH_GRANULE);
        assert_eq!(round_up(SCRATCH_GRANULE, SCRATCH_GRANULE), SCRATCH_GRANULE);
        assert_eq!(
            round_up(SCRATCH_GRANULE + 1, SCRATCH_GRANULE),
            2 * SCRATCH_GRANULE
        );
    }
}
