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

pub mod rank_threads;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// The control block: `gpu_kernels::oneshot::CTL_WORDS` `u64` of pinned host memory
/// (`cuMemHostAlloc`, portable and mapped into every context), zeroed at creation. The host
/// reads and writes it as atomics; kernels read and write it through its device address.
#[derive(Debug)]
pub struct Control {
    ctx: Arc<CudaContext>,
    host: NonNull<AtomicU64>,
    dev: u64,
}

// SAFETY: the block is plain pinned memory owned by this value; the host touches it only
// through `AtomicU64` (kernels through their own atomics/volatile accesses), so sharing the
// pointer between threads is sound.
unsafe impl Send for Control {}
// SAFETY: as above: every host access is atomic.
unsafe impl Sync for Control {}

impl Control {
    const WORDS: usize = gpu_kernels::oneshot::CTL_WORDS;

    /// Allocates and zeroes the block with `ctx` current (portable: every context sees it at
    /// the same device address under unified addressing).
    pub fn new(ctx: &Arc<CudaContext>, rank: Option<usize>) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", rank, e))?;
        let bytes = Self::WORDS * std::mem::size_of::<u64>();
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: `p` is a valid out-pointer; a context is current.
        unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) }
            .result()
            .map_err(|e| Error::cuda("cuMemHostAlloc", rank, e))?;
        let host = NonNull::new(p.cast::<AtomicU64>()).ok_or_else(|| Error::Internal {
            reason: "cuMemHostAlloc returned null".into(),
        })?;
        // SAFETY: `bytes` bytes of fresh host memory, 8-aligned (page-aligned), not yet shared.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `p` is mapped pinned memory from `cuMemHostAlloc` with `DEVICEMAP`.
        let got = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) }.result();
        let control = Control {
            ctx: ctx.clone(),
            host,
            dev,
        };
        got.map_err(|e| Error::cuda("cuMemHostGetDevicePointer", rank, e))?;
        Ok(control)
    }

    /// The block's device address (the same in every context).
    pub fn device_ptr(&self) -> u64 {
        self.dev
    }

    /// Word `i` (`None` past the end).
    pub fn word(&self, i: usize) -> Option<&AtomicU64> {
        // SAFETY: `i < WORDS` words of the live allocation, aligned; `AtomicU64` has the layout
        // of `u64`.
        (i < Self::WORDS).then(|| unsafe { &*self.host.as_ptr().add(i) })
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        // The communicator's drop has waited for every kernel that was given the block, or
        // leaked it.
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: the pointer came from `cuMemHostAlloc` and is freed once, here.
        let freed = unsafe { sys::cuMemFreeHost(self.host.as_ptr().cast()) }.result();
        self.ctx.record_err(freed);
    }
}

/// A communicator's health: the control block its kernels watch, the timeout they are given,
/// and its first failure. Once failed (an abort, a device-side timeout, a call that failed
/// half-issued, a dead context), the abort word is set, so every enqueued device wait ends, and
/// every later call is refused with [`Error::Aborted`].
#[derive(Debug)]
pub struct Health {
    control: Control,
    timeout: Option<Duration>,
    /// The rank of each status slot (a communicator's local ranks, in order).
    slot_ranks: Vec<usize>,
    failed: Mutex<Option<Error>>,
    /// Quick check of `failed`.
    is_failed: AtomicBool,
    /// Test hook: rank + 1 whose next kernel launch fails (0: none).
    fail_launch: AtomicUsize,
    /// Rank + 1 of a peer whose process is gone (its bootstrap connection closed without a
    /// goodbye), 0 while none: the next call fails ([`Health::peer_lost`]).
    lost: AtomicUsize,
}

/// The reason of [`Error::Aborted`] after the caller's own abort (`Communicator::abort`).
pub const CALLER_ABORT: &str = "aborted by the caller";

impl Health {
    /// The health of a fresh communicator whose status slots are `slot_ranks` (at most
    /// `gpu_kernels::oneshot::MAX_RANKS` slots are distinguished).
    pub fn new(
        ctx: &Arc<CudaContext>,
        slot_ranks: Vec<usize>,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let rank = slot_ranks.first().copied();
        Ok(Health {
            control: Control::new(ctx, rank)?,
            timeout,
            slot_ranks,
            failed: Mutex::new(None),
            is_failed: AtomicBool::new(false),
            fail_launch: AtomicUsize::new(0),
            lost: AtomicUsize::new(0),
        })
    }

    /// The control block's device address.
    pub fn ctl(&self) -> u64 {
        self.control.device_ptr()
    }

    /// The timeout of device waits, in nanoseconds (0: none).
    pub fn timeout_ns(&self) -> u64 {
        self.timeout
            .map_or(0, |t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX).max(1))
    }

    /// The configured timeout.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// `Err` once the communicator has failed or been aborted: [`Error::Aborted`] naming the
    /// first failure, or, when a device-side wait gave up that the host had not yet been told
    /// about (a peer that stopped signalling: its timeout sets the control block's abort word),
    /// that failure itself ([`Error::Timeout`] naming the rank and the peer), which then fails
    /// the communicator. Costs one load of the control block (pinned host memory) per call.
    ///
    /// A peer whose process is gone ([`Health::peer_lost`]) fails the call too, with
    /// [`Error::Bootstrap`] (`BootstrapFailure::PeerLost`) naming it.
    pub fn check(&self) -> Result<()> {
        if !self.is_failed.load(Ordering::Acquire) {
            let abort = self
                .control
                .word(gpu_kernels::oneshot::CTL_ABORT)
                .map_or(0, |w| w.load(Ordering::Relaxed));
            if abort == 0 {
                let lost = self.lost.load(Ordering::Relaxed);
                if lost == 0 {
                    return Ok(());
                }
                let e = self.lost_error(lost - 1);
                self.fail(e.clone());
                return Err(e);
            }
            // The kernel wrote its status before the abort word (release, system scope).
            std::sync::atomic::fence(Ordering::Acquire);
            if !self.is_failed.load(Ordering::Acquire) {
                let e = control_failure(abort, &self.status_words(), &self.slot_ranks, self.timeout)
                    .unwrap_or_else(|| Error::Aborted {
                        reason: "the control block's abort word is set".into(),
                    });
                self.fail(e.clone());
                return Err(e);
            }
        }
        let reason = match &*self.failed.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(Error::Aborted { reason }) => reason.clone(),
            Some(e) => e.to_string(),
            None => "failed".into(),
        };
        Err(Error::Aborted { reason })
    }

    /// The status words of the control block, slot by slot.
    fn status_words(&self) -> [u64; gpu_kernels::oneshot::MAX_RANKS] {
        use gpu_kernels::oneshot::{CTL_STATUS, MAX_RANKS};
        let mut words = [0u64; MAX_RANKS];
        for (slot, w) in words.iter_mut().enumerate() {
            *w = self
                .control
                .word(CTL_STATUS + slot)
                .map_or(0, |x| x.load(Ordering::Acquire));
        }
        words
    }

    /// Notes that `peer`'s process is gone (its bootstrap connection closed without a
    /// goodbye): the next call fails with [`Health::lost_error`]. Work already enqueued is not
    /// ended here: it may not need the peer any more (the peer finished its part and exited
    /// without destroying its communicator); see [`Health::fail`].
    pub fn peer_lost(&self, peer: usize) {
        let _ = self
            .lost
            .compare_exchange(0, peer.saturating_add(1), Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The error of a lost `peer`, as this communicator's rank reports it.
    pub fn lost_error(&self, peer: usize) -> Error {
        Error::Bootstrap {
            rank: self.slot_ranks.first().copied(),
            failure: crate::error::BootstrapFailure::PeerLost,
            detail: format!(
                "the connection to rank {peer} closed without a goodbye: its process exited or \
                 crashed without destroying its communicator"
            ),
        }
    }

    /// Whether the communicator ends normally: not failed, or aborted by its caller only (its
    /// peers are then told goodbye rather than left to find the rank gone).
    pub fn ends_normally(&self) -> bool {
        match self.failure() {
            None => true,
            Some(Error::Aborted { reason }) => reason == CALLER_ABORT,
            Some(_) => false,
        }
    }

    /// The first failure, if any.
    pub fn failure(&self) -> Option<Error> {
        if !self.is_failed.load(Ordering::Acquire) {
            return None;
        }
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Marks the communicator failed with `cause` (the first cause is kept) and sets the abort
    /// word: every device wait of its kernels, enqueued or running, ends.
    pub fn fail(&self, cause: Error) {
        {
            let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            if failed.is_none() {
                *failed = Some(cause);
            }
        }
        self.is_failed.store(true, Ordering::Release);
        if let Some(w) = self.control.word(gpu_kernels::oneshot::CTL_ABORT) {
            w.store(1, Ordering::SeqCst);
        }
    }

    /// What the kernels reported in the status words, as an error (the first slot that has
    /// one, a timeout before an abort); `None` if no wait gave up.
    pub fn device_status(&self) -> Option<Error> {
        status_error(&self.status_words(), &self.slot_ranks, self.timeout)
    }

    /// Arms the test hook: the next kernel launch of `rank` by an executor fails.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn inject_launch_failure(&self, rank: usize) {
        self.fail_launch.store(rank.saturating_add(1), Ordering::SeqCst);
    }

    /// The test hook's injected failure for a launch on `rank`, once.
    pub fn injected_failure(&self, rank: usize) -> Result<()> {
        let want = rank.saturating_add(1);
        if self
            .fail_launch
            .compare_exchange(want, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Err(Error::Cuda {
                call: "cuLaunchKernel",
                code: "CUDA_ERROR_LAUNCH_FAILED (injected)".into(),
                rank: Some(rank),
            });
        }
        Ok(())
    }
}

/// A raw event handle, for the peer watcher's thread.
struct EndEvent(sys::CUevent);

// SAFETY: a CUDA event handle may be queried from any thread; the watcher that holds it is
// stopped before the event is destroyed (see [`watch_peers`]).
unsafe impl Send for EndEvent {}

/// Starts the watch over a rank's bootstrap connections ([`crate::bootstrap::Watcher`]): a
/// peer whose connection closes without a goodbye is lost ([`Health::peer_lost`]: the next
/// call fails); if this rank's enqueued work (whose end is `end`, an event of `ctx`) has not
/// ended `grace` later, it waits for the lost peer: the communicator is failed then (the abort
/// word ends its device waits at once).
///
/// # Safety
/// `end` must stay a live event of `ctx` until the returned watcher is dropped.
pub(crate) unsafe fn watch_peers(
    boot: &crate::bootstrap::Bootstrap,
    health: &Arc<Health>,
    ctx: &Arc<CudaContext>,
    end: sys::CUevent,
    grace: Duration,
) -> Result<crate::bootstrap::Watcher> {
    let (health, ctx, end) = (Arc::clone(health), Arc::clone(ctx), EndEvent(end));
    let on_lost = move |peer: usize| {
        health.peer_lost(peer);
        let end = &end;
        let _ = ctx.bind_to_thread();
        let t0 = std::time::Instant::now();
        loop {
            // SAFETY: the event is alive while the watcher runs (the caller's contract).
            match unsafe { sys::cuEventQuery(end.0) } {
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                // Done, or a dead context (which runs nothing any more).
                _ => return,
            }
            if t0.elapsed() >= grace {
                health.fail(health.lost_error(peer));
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    crate::bootstrap::Watcher::spawn(boot.peer_sockets()?, Duration::from_millis(10), on_lost)
}

/// What [`Health::check`] concludes from the control block: `None` while the abort word
/// (`abort`) is clear; otherwise what the status words say ([`status_error`]), or, when no
/// status was written (the word was set by the host, whose own failure record comes first),
/// `None` too: the caller decides.
fn control_failure(
    abort: u64,
    status: &[u64],
    slot_ranks: &[usize],
    timeout: Option<Duration>,
) -> Option<Error> {
    if abort == 0 {
        return None;
    }
    status_error(status, slot_ranks, timeout)
}

/// The status words of a control block (`status[slot]`) as an error: the first slot with a
/// timeout ([`Error::Timeout`] naming the slot's rank and the peer it waited for), else the
/// first with an abort ([`Error::Aborted`]), else `None`. A rank of a job of processes holds
/// one rank: every slot is its (`slot_ranks` of one element).
fn status_error(status: &[u64], slot_ranks: &[usize], timeout: Option<Duration>) -> Option<Error> {
    use gpu_kernels::oneshot::status;
    let mut aborted = None;
    for (slot, &word) in status.iter().enumerate() {
        let Some((code, peer)) = status::decode(word) else {
            continue;
        };
        let rank = match slot_ranks {
            [only] => Some(*only),
            all => all.get(slot).copied(),
        };
        let peer = usize::try_from(peer).ok();
        if code == status::TIMEOUT {
            let what = match timeout {
                Some(t) => format!("a device-side wait of {t:?}"),
                None => "a device-side wait".into(),
            };
            return Some(Error::Timeout { rank, peer, what });
        }
        aborted.get_or_insert(Error::Aborted {
            reason: format!(
                "a device-side wait of rank {} for rank {} was ended by an abort",
                rank.map_or_else(|| "?".into(), |r| r.to_string()),
                peer.map_or_else(|| "?".into(), |p| p.to_string()),
            ),
        });
    }
    aborted
}

/// What to query of one rank to see whether its context faulted: the end event of its last
/// call and a stream of its (handles alive for as long as the probe is used).
pub(crate) struct Probe {
    /// The rank, as errors name it.
    pub(crate) rank: usize,
    /// An event of the rank's context.
    pub(crate) event: sys::CUevent,
    /// A stream of the rank's context, if one is to be queried.
    pub(crate) stream: Option<sys::CUstream>,
}

impl Probe {
    /// Queries the event and the stream: `Ok(true)` if both are done, `Ok(false)` if work is
    /// pending, or the failing call and its code.
    pub(crate) fn query(&self) -> std::result::Result<bool, (&'static str, sys::CUresult)> {
        use sys::CUresult::{CUDA_ERROR_NOT_READY, CUDA_SUCCESS};
        // SAFETY: the event and the stream are alive (the probe's contract).
        let e = unsafe { sys::cuEventQuery(self.event) };
        if !matches!(e, CUDA_SUCCESS | CUDA_ERROR_NOT_READY) {
            return Err(("cuEventQuery", e));
        }
        let s = match self.stream {
            // SAFETY: as above.
            Some(stream) => unsafe { sys::cuStreamQuery(stream) },
            None => CUDA_SUCCESS,
        };
        if !matches!(s, CUDA_SUCCESS | CUDA_ERROR_NOT_READY) {
            return Err(("cuStreamQuery", s));
        }
        Ok(e == CUDA_SUCCESS && s == CUDA_SUCCESS)
    }

    /// [`Probe::query`] as an [`Error`] naming the probe's rank.
    ///
    /// Which GPU faulted cannot be told from such queries: measured on 2 × H200 (driver 580),
    /// after an illegal address in a kernel on GPU 1, every call in GPU 0's context of the same
    /// process fails with the same error too (a query of its streams, a new stream from a
    /// thread with no current context). The rank named is the first whose query fails.
    pub(crate) fn check(&self) -> Result<bool> {
        self.query().map_err(|(call, code)| Error::Cuda {
            call,
            code: format!("{code:?}"),
            rank: Some(self.rank),
        })
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
    /// The end of this rank's previous call.
    pub end: CudaEvent,
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
            end: new_event(ctx, Some(rank))?,
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
    fn a_device_side_timeout_is_reported_with_its_rank_and_peer() {
        use gpu_kernels::oneshot::{status, MAX_RANKS};
        let t = Some(Duration::from_secs(3));
        let mut words = [0u64; MAX_RANKS];
        // Abort word clear: nothing to report, whatever the status words hold (one load).
        words[0] = status::encode(status::TIMEOUT, 1);
        assert_eq!(control_failure(0, &words, &[5], t), None);
        // A rank of a job of processes (one slot rank): the timeout names it and the peer.
        let e = control_failure(1, &words, &[5], t).expect("a failure");
        assert_eq!(
            e,
            Error::Timeout {
                rank: Some(5),
                peer: Some(1),
                what: "a device-side wait of 3s".into()
            }
        );
        // A timeout comes before an abort of an earlier slot; slots name their ranks.
        let mut words = [0u64; MAX_RANKS];
        words[0] = status::encode(status::ABORTED, 2);
        words[1] = status::encode(status::TIMEOUT, 3);
        assert!(matches!(
            control_failure(1, &words, &[0, 1, 2, 3], None),
            Some(Error::Timeout { rank: Some(1), peer: Some(3), .. })
        ));
        // Only aborts: `Aborted`, naming the ranks.
        words[1] = 0;
        match control_failure(1, &words, &[0, 1, 2, 3], None) {
            Some(Error::Aborted { reason }) => assert!(reason.contains("rank 0 for rank 2"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // The abort word set with no status (the host's own abort): the caller decides.
        assert_eq!(control_failure(1, &[0; MAX_RANKS], &[0], None), None);
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
