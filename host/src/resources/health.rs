//! A communicator's health ([`Health`]): its control block ([`Control`], host memory mapped
//! into every device), the decision what that block says ([`Health::check`]), the watch over
//! the peers' connections ([`watch_peers`]), and the probe of a rank's context ([`Probe`]).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{sys, CudaContext};

use crate::{Error, Result};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
