//! The communicator: one rank per GPU, all in this process.
//!
//! A [`Communicator`] owns, for each rank (one per device ordinal it was built with):
//! * the device's primary context (`Arc<CudaContext>`) and a non-blocking stream of its own
//!   ([`Communicator::stream`], for callers that have none);
//! * ringccl's kernels loaded into that context ([`crate::driver::Kernels`]);
//! * a scratch buffer for partial results and staging, grown on demand;
//! * a pool of events (`CU_EVENT_DISABLE_TIMING`) for ordering steps across GPUs, and the event
//!   that marks the end of the communicator's previous call on that rank;
//! * its row of the peer-access matrix (which other ranks' memory it reads directly);
//! * the ring order of the ring collectives ([`Communicator::ring`]), chosen once at creation
//!   from the driver's peer-to-peer link scores ([`crate::topology::best_ring`]) or fixed by
//!   `RINGCCL_RING`;
//! * a small flag array in its own memory (plain `cuMemAlloc`, zeroed once) for the one-shot
//!   all-reduce's device-side barrier (`gpu_kernels::oneshot`), read and written by every
//!   rank's one-shot kernels over peer access.
//!
//! Collectives take `&self`; the mutable parts sit behind one mutex, held for the whole of a
//! call's issue, so calls from several threads are issued one after the other and each call
//! sees consistent scratch and events.
//!
//! ## cudarc's event tracking
//!
//! ringccl leaves cudarc's per-slice event tracking on (the default). Turning it off is an
//! `unsafe`, context-wide switch that would also change the caller's own `CudaSlice`s. Kernels
//! get raw addresses: the collectives take them from the caller's slices with
//! `device_ptr(&stream)` / `device_ptr_mut(&stream)`, which makes the call's stream wait for the
//! slice's last recorded write before the call and records the slice's read/write event on that
//! stream after it is enqueued. Every step of other ranks that touched a rank's buffers is joined
//! back into that rank's stream before the call ends (the schedule's `end_waits`), so the
//! recorded event covers the whole collective and cudarc's own multi-stream safety still holds
//! for the caller's buffers. The communicator's scratch is a `CudaSlice<u8>` allocated on the
//! rank's own stream; only its address is handed to kernels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};

use crate::driver::{self, Kernels};
use crate::exec::Prepared;
use crate::schedule::{Layout, Schedule};
use crate::topology::{self, RING_ENV};
use crate::{Error, Result};

/// Environment variable that, set to `1`, turns off direct peer access between all ranks
/// (every cross-GPU read and write then goes through `cuMemcpyPeerAsync` and local staging).
pub const P2P_DISABLE_ENV: &str = "RINGCCL_P2P_DISABLE";

/// Scratch grows in steps of this many bytes, so slowly growing calls do not reallocate each time.
const SCRATCH_GRANULE: usize = 1 << 20;

/// Schedules kept per communicator before the cache is emptied.
const SCHEDULE_CACHE_LIMIT: usize = 256;

/// What is fixed about one rank.
#[derive(Debug)]
struct Rank {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    name: String,
    flags: OneShotFlags,
}

/// One rank's flag array for the one-shot all-reduce: `gpu_kernels::oneshot::FLAG_WORDS` `u64`
/// from plain `cuMemAlloc` (peer access enabled with `cuCtxEnablePeerAccess` covers it), zeroed
/// at creation, freed on drop.
#[derive(Debug)]
struct OneShotFlags {
    ctx: Arc<CudaContext>,
    ptr: u64,
}

impl OneShotFlags {
    const BYTES: usize = gpu_kernels::oneshot::FLAG_WORDS * 8;

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

/// What changes from call to call on one rank.
#[derive(Debug)]
pub(crate) struct RankState {
    scratch: Option<CudaSlice<u8>>,
    /// A CUDA graph captured a call that used `scratch`.
    scratch_captured: bool,
    /// Scratch buffers replaced while a captured graph may still use them; freed on drop.
    retired: Vec<CudaSlice<u8>>,
    scratch_ptr: u64,
    scratch_bytes: usize,
    events: Vec<CudaEvent>,
    next_event: usize,
    end: CudaEvent,
}

/// The key of the communicator's schedule cache.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ScheduleKey {
    /// The collective (`"all_reduce"`, ...).
    pub collective: &'static str,
    /// Its counts (one for most collectives; the peers and counts of a send/recv group).
    pub counts: Vec<usize>,
    /// In-place or not.
    pub layout: Layout,
    /// Root rank, where the collective has one.
    pub root: Option<usize>,
    /// Elements per step.
    pub chunk: usize,
}

/// A group of GPUs in this process that run collectives together, one rank per GPU.
///
/// `Communicator` is `Send + Sync`: collectives take `&self` and may be called from several
/// threads (they are issued one after the other).
///
/// ```no_run
/// use ringccl::Communicator;
/// let comm = Communicator::all()?; // every visible GPU, rank i = device i
/// println!("{} ranks; rank 0 is {}", comm.nranks(), comm.device_name(0));
/// # Ok::<(), ringccl::Error>(())
/// ```
pub struct Communicator {
    ranks: Vec<Rank>,
    /// `peer[a * n + b]`: rank `a`'s kernels access rank `b`'s memory directly.
    peer: Vec<bool>,
    /// The ring order of the ring collectives: a permutation of `0..n`, fixed at creation.
    ring: Vec<usize>,
    state: Mutex<Vec<RankState>>,
    cache: Mutex<HashMap<ScheduleKey, Arc<Prepared>>>,
    /// Set when a one-shot call failed after some ranks' kernels were launched: their device
    /// epochs may disagree from then on, so this communicator uses the ring for good.
    oneshot_broken: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field(
                "ordinals",
                &self.ranks.iter().map(|r| r.ordinal).collect::<Vec<_>>(),
            )
            .field("peer", &self.peer)
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

/// Checks a list of device ordinals against the number of visible devices.
pub(crate) fn validate_ordinals(ordinals: &[usize], device_count: usize) -> Result<()> {
    if ordinals.is_empty() {
        return Err(Error::TooFewDevices {
            needed: 1,
            found: device_count,
        });
    }
    for (i, &o) in ordinals.iter().enumerate() {
        if o >= device_count {
            return Err(Error::BadDevice {
                ordinal: o,
                reason: format!(
                    "only {device_count} device(s) are visible (ordinals 0..{device_count})"
                ),
            });
        }
        if ordinals[..i].contains(&o) {
            return Err(Error::BadDevice {
                ordinal: o,
                reason: "it appears more than once".into(),
            });
        }
    }
    Ok(())
}

/// Whether the value of [`P2P_DISABLE_ENV`] disables peer access.
pub(crate) fn p2p_disabled(value: Option<&str>) -> bool {
    matches!(value.map(str::trim), Some("1") | Some("true") | Some("yes"))
}

/// The link scores the ring is chosen from: the driver's scores where the communicator uses
/// peer access (`peer[a * n + b]`), 0 where it does not (disabled, unsupported, or refused), so
/// with `RINGCCL_P2P_DISABLE=1` every link scores the same and the ring is the identity.
pub(crate) fn ring_scores(driver_scores: &[Vec<u32>], peer: &[bool], n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    let direct = a != b && peer.get(a * n + b).copied().unwrap_or(false);
                    let score = driver_scores.get(a).and_then(|r| r.get(b)).copied();
                    if direct {
                        score.unwrap_or(0)
                    } else {
                        0
                    }
                })
                .collect()
        })
        .collect()
}

/// The [`RING_ENV`] override for `n` ranks, read from the environment (see
/// [`topology::parse_ring`]); a value that is not Unicode is rejected like a malformed one.
fn ring_override(n: usize) -> Result<Option<Vec<usize>>> {
    match std::env::var_os(RING_ENV) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Some(v) => topology::parse_ring(Some(v), n),
            None => Err(Error::invalid(
                None,
                crate::Arg::Ranks,
                format!("{RING_ENV} is not valid Unicode; set it to a comma-separated permutation of 0..{n} or unset it"),
            )),
        },
    }
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to).saturating_mul(to)
}

impl Communicator {
    /// A communicator over the given device ordinals; rank `i` is device `ordinals[i]`.
    ///
    /// Enables peer access between every pair of devices that supports it (unless
    /// `RINGCCL_P2P_DISABLE=1`), loads the kernels on each device, and chooses the ring order
    /// ([`Communicator::ring`]): `RINGCCL_RING` if it is set (e.g. `RINGCCL_RING=0,2,1,3`, a
    /// comma-separated permutation of the ranks `0..n`, where rank `i` is `ordinals[i]`),
    /// otherwise [`crate::topology::best_ring`] over the driver's link scores
    /// ([`crate::driver::p2p_link_scores`]) of the pairs that use peer access.
    ///
    /// Errors: [`Error::NoDriver`] without the CUDA driver, [`Error::TooFewDevices`] for an
    /// empty list, [`Error::BadDevice`] for an ordinal that is not visible or repeated,
    /// [`Error::InvalidArgument`] (naming `RINGCCL_RING`) if `RINGCCL_RING` is set but not a
    /// permutation of `0..n` (checked before any device is touched), [`Error::Kernel`] if the
    /// device cannot run the embedded PTX, [`Error::Cuda`] otherwise.
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::new(&[0, 1])?;
    /// assert_eq!(comm.nranks(), 2);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn new(ordinals: &[usize]) -> Result<Self> {
        driver::ensure_driver()?;
        validate_ordinals(ordinals, driver::device_count()?)?;
        let fixed_ring = ring_override(ordinals.len())?;
        let mut ranks = Vec::with_capacity(ordinals.len());
        let mut state = Vec::with_capacity(ordinals.len());
        for (rank, &ordinal) in ordinals.iter().enumerate() {
            let r = Some(rank);
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| Error::cuda("cuDevicePrimaryCtxRetain", r, e))?;
            let stream = ctx
                .new_stream()
                .map_err(|e| Error::cuda("cuStreamCreate", r, e))?;
            let kernels = Kernels::load(&ctx, r)?;
            let name = ctx
                .name()
                .map_err(|e| Error::cuda("cuDeviceGetName", r, e))?;
            let end = new_event(&ctx, r)?;
            let flags = OneShotFlags::new(&ctx, &stream, rank)?;
            state.push(RankState {
                scratch: None,
                scratch_captured: false,
                retired: Vec::new(),
                scratch_ptr: 0,
                scratch_bytes: 0,
                events: Vec::new(),
                next_event: 0,
                end,
            });
            ranks.push(Rank {
                ordinal,
                ctx,
                stream,
                kernels,
                name,
                flags,
            });
        }
        let n = ranks.len();
        let disabled = p2p_disabled(std::env::var(P2P_DISABLE_ENV).ok().as_deref());
        let mut peer = vec![false; n * n];
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    peer[a * n + b] = true;
                    continue;
                }
                if disabled || !driver::can_access_peer(ranks[a].ordinal, ranks[b].ordinal)? {
                    continue;
                }
                // A pair the driver says is capable but refuses (e.g. too many peers) falls
                // back to staged copies rather than failing the communicator.
                peer[a * n + b] = driver::enable_peer_access(&ranks[a].ctx, &ranks[b].ctx).is_ok();
            }
        }
        let ring = match fixed_ring {
            Some(ring) => ring,
            // Up to 3 ranks every ring is the same; without peer access every link scores 0.
            None if n <= 3 || disabled => (0..n).collect(),
            // The topology only ranks rings: if the driver cannot describe it (an attribute
            // unsupported in some setup), device order is still a correct ring.
            None => match driver::p2p_link_scores(ordinals) {
                Ok(links) => topology::best_ring(&ring_scores(&links, &peer, n)),
                Err(_) => (0..n).collect(),
            },
        };
        Ok(Communicator {
            ranks,
            peer,
            ring,
            state: Mutex::new(state),
            cache: Mutex::new(HashMap::new()),
            oneshot_broken: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A communicator over every visible device (rank `i` = device `i`).
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::all()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn all() -> Result<Self> {
        driver::ensure_driver()?;
        let n = driver::device_count()?;
        if n == 0 {
            return Err(Error::TooFewDevices {
                needed: 1,
                found: 0,
            });
        }
        Self::new(&(0..n).collect::<Vec<_>>())
    }

    /// The number of ranks.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// assert!(comm.nranks() >= 1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn nranks(&self) -> usize {
        self.ranks.len()
    }

    /// The device ordinal of `rank`.
    ///
    /// # Panics
    /// If `rank >= self.nranks()`, like slice indexing.
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::new(&[1, 0])?;
    /// assert_eq!(comm.ordinal(0), 1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn ordinal(&self, rank: usize) -> usize {
        self.ranks[rank].ordinal
    }

    /// The context of `rank`'s device (its primary context): allocate buffers for `rank` with
    /// a stream of this context.
    ///
    /// # Panics
    /// If `rank >= self.nranks()`.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// let buf = comm.stream(0).alloc_zeros::<f32>(1024).unwrap();
    /// assert_eq!(buf.context().ordinal(), comm.context(0).ordinal());
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn context(&self, rank: usize) -> &Arc<CudaContext> {
        &self.ranks[rank].ctx
    }

    /// A non-blocking stream of `rank` that the communicator created, for callers that do not
    /// bring their own.
    ///
    /// # Panics
    /// If `rank >= self.nranks()`.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// let s = comm.stream(0);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn stream(&self, rank: usize) -> &Arc<CudaStream> {
        &self.ranks[rank].stream
    }

    /// The device name of `rank` (e.g. `"NVIDIA H200"`).
    ///
    /// # Panics
    /// If `rank >= self.nranks()`.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// println!("{}", comm.device_name(0));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn device_name(&self, rank: usize) -> &str {
        &self.ranks[rank].name
    }

    /// Whether `rank`'s kernels read and write `peer`'s memory directly (always true for
    /// `rank == peer`; false everywhere else with `RINGCCL_P2P_DISABLE=1`, or out of range).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// if comm.nranks() > 1 && !comm.peer_access(0, 1) {
    ///     println!("ranks 0 and 1 exchange data through staged copies");
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn peer_access(&self, rank: usize, peer: usize) -> bool {
        let n = self.nranks();
        rank < n && peer < n && self.peer[rank * n + peer]
    }

    /// The ring order of the ring collectives (all but send/recv and the one-shot all-reduce):
    /// a permutation of the ranks `0..nranks()`; each step of a ring collective moves data
    /// between neighbours of this order (`ring[i]` and `ring[i + 1]`, wrapping round, so
    /// `ring[n - 1]` and `ring[0]` too). Fixed at creation: from
    /// `RINGCCL_RING` if set, otherwise the ring whose weakest link (then whose sum of links)
    /// is best by the driver's peer-to-peer performance ranks; the identity `0, 1, …` for 3
    /// ranks or fewer, with `RINGCCL_P2P_DISABLE=1`, or when all links are alike.
    ///
    /// ```no_run
    /// let comm = ringccl::Communicator::all()?;
    /// let ring = comm.ring();
    /// assert_eq!(ring.len(), comm.nranks());
    /// println!("ring order: {ring:?}");
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn ring(&self) -> &[usize] {
        &self.ring
    }

    /// Blocks until every call issued so far through this communicator is complete, on the
    /// caller's streams as well as on the communicator's own streams.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// comm.synchronize()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        let state = self.lock_state();
        for (r, (rank, st)) in self.ranks.iter().zip(state.iter()).enumerate() {
            st.end
                .synchronize()
                .map_err(|e| Error::cuda("cuEventSynchronize", Some(r), e))?;
            rank.stream
                .synchronize()
                .map_err(|e| Error::cuda("cuStreamSynchronize", Some(r), e))?;
        }
        Ok(())
    }

    /// Whether every rank accesses every other rank's memory directly.
    pub(crate) fn all_peer_access(&self) -> bool {
        self.peer.iter().all(|&p| p)
    }

    /// Whether the one-shot all-reduce may be used: peer access everywhere and no earlier
    /// one-shot call failed half-launched.
    pub(crate) fn oneshot_usable(&self) -> bool {
        self.all_peer_access()
            && !self
                .oneshot_broken
                .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops using the one-shot all-reduce on this communicator (see `oneshot_broken`).
    pub(crate) fn disable_oneshot(&self) {
        self.oneshot_broken
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The device address of `rank`'s one-shot flag array (`None` if out of range).
    pub(crate) fn oneshot_flags(&self, rank: usize) -> Option<u64> {
        self.ranks.get(rank).map(|r| r.flags.ptr)
    }

    /// The kernels loaded on `rank` (`None` if out of range).
    pub(crate) fn kernels(&self, rank: usize) -> Option<&Kernels> {
        self.ranks.get(rank).map(|r| &r.kernels)
    }

    fn lock_state(&self) -> MutexGuard<'_, Vec<RankState>> {
        // A panic while the lock was held cannot leave the state inconsistent in a way that
        // matters (events and scratch are only ever replaced whole), so recover from poisoning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Locks the communicator for one call's issue.
    pub(crate) fn begin_call(&self) -> CallGuard<'_> {
        let mut state = self.lock_state();
        for st in state.iter_mut() {
            st.next_event = 0;
        }
        CallGuard { comm: self, state }
    }

    /// The address of `rank`'s scratch, grown to at least `bytes` bytes (tests only; calls use
    /// [`CallGuard::scratch_ptr`]).
    #[cfg(test)]
    pub(crate) fn scratch_ptr(&self, rank: usize, bytes: usize) -> Result<u64> {
        let mut g = self.begin_call();
        g.scratch_ptr(rank, bytes)
    }

    /// The prepared schedule for `key`, built with `build` (and checked) the first time.
    pub(crate) fn prepared(
        &self,
        key: ScheduleKey,
        build: impl FnOnce() -> Schedule,
    ) -> Result<Arc<Prepared>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let p = Arc::new(Prepared::new(build())?);
        if cache.len() >= SCHEDULE_CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(key, p.clone());
        Ok(p)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Work of the last call may still run on the caller's streams and use the scratch and
        // the kernels' module: wait for it before they are freed. Errors cannot be reported
        // from `drop`; cudarc records them in the context.
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (rank, st) in self.ranks.iter().zip(state.iter()) {
            rank.ctx.record_err(st.end.synchronize());
        }
    }
}

fn new_event(ctx: &Arc<CudaContext>, rank: Option<usize>) -> Result<CudaEvent> {
    ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(|e| Error::cuda("cuEventCreate", rank, e))
}

/// The communicator, locked for the issue of one call.
pub(crate) struct CallGuard<'a> {
    comm: &'a Communicator,
    state: MutexGuard<'a, Vec<RankState>>,
}

impl CallGuard<'_> {
    /// The address of `rank`'s scratch, grown to at least `bytes` bytes.
    ///
    /// Growing is stream-ordered, without blocking the host: the rank's own stream waits for
    /// the end of the previous call (the last user of the old buffer), frees it there, allocates
    /// the new one there, and the end-of-previous-call event is re-recorded after the
    /// allocation, so the next call's start (which waits on that event) sees the new memory.
    /// Once a CUDA graph has captured a call that used the scratch, the old buffer is kept
    /// (retired, freed with the communicator) instead: the graph holds its address.
    pub(crate) fn scratch_ptr(&mut self, rank: usize, bytes: usize) -> Result<u64> {
        let r = Some(rank);
        let (Some(info), Some(st)) = (self.comm.ranks.get(rank), self.state.get_mut(rank)) else {
            return Err(Error::invalid(
                None,
                crate::Arg::Ranks,
                format!("rank {rank} out of range"),
            ));
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
    pub(crate) fn scratch_bytes(&self, rank: usize) -> usize {
        self.state.get(rank).map_or(0, |st| st.scratch_bytes)
    }

    /// Notes that a CUDA graph captured a call using `rank`'s scratch (its buffer must then
    /// outlive the communicator's use of it: see [`CallGuard::scratch_ptr`]).
    pub(crate) fn mark_scratch_captured(&mut self, rank: usize) {
        if let Some(st) = self.state.get_mut(rank) {
            st.scratch_captured = true;
        }
    }

    /// A fresh event of `rank`'s context, distinct from every other event handed out during
    /// this call; returns its index for [`CallGuard::event`].
    pub(crate) fn next_event(&mut self, rank: usize) -> Result<usize> {
        let (Some(info), Some(st)) = (self.comm.ranks.get(rank), self.state.get_mut(rank)) else {
            return Err(Error::invalid(
                None,
                crate::Arg::Ranks,
                format!("rank {rank} out of range"),
            ));
        };
        let i = st.next_event;
        if i == st.events.len() {
            st.events.push(new_event(&info.ctx, Some(rank))?);
        }
        st.next_event += 1;
        Ok(i)
    }

    /// Event `index` of `rank`'s pool.
    pub(crate) fn event(&self, rank: usize, index: usize) -> Option<&CudaEvent> {
        self.state.get(rank).and_then(|st| st.events.get(index))
    }

    /// The event that marks the end of the previous call on `rank` (recorded again at the end
    /// of this one).
    pub(crate) fn end_event(&self, rank: usize) -> Option<&CudaEvent> {
        self.state.get(rank).map(|st| &st.end)
    }

    /// The communicator.
    pub(crate) fn comm(&self) -> &Communicator {
        self.comm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_are_checked() {
        assert_eq!(
            validate_ordinals(&[], 2),
            Err(Error::TooFewDevices {
                needed: 1,
                found: 2
            })
        );
        assert_eq!(validate_ordinals(&[0, 1], 2), Ok(()));
        assert_eq!(validate_ordinals(&[1, 0], 2), Ok(()));
        assert!(matches!(
            validate_ordinals(&[0, 2], 2),
            Err(Error::BadDevice { ordinal: 2, .. })
        ));
        assert!(matches!(
            validate_ordinals(&[0], 0),
            Err(Error::BadDevice { ordinal: 0, .. })
        ));
        let e = validate_ordinals(&[1, 0, 1], 2).unwrap_err();
        assert!(
            matches!(&e, Error::BadDevice { ordinal: 1, reason } if reason.contains("more than once"))
        );
    }

    #[test]
    fn p2p_env_values() {
        assert!(p2p_disabled(Some("1")));
        assert!(p2p_disabled(Some(" 1\n")));
        assert!(p2p_disabled(Some("true")));
        assert!(!p2p_disabled(Some("0")));
        assert!(!p2p_disabled(Some("")));
        assert!(!p2p_disabled(None));
    }

    #[test]
    fn ring_scores_keep_only_links_with_peer_access() {
        let driver = vec![vec![0, 16, 9], vec![16, 0, 1], vec![9, 5, 0]];
        // Rank 2 could not enable access to rank 1; the diagonal never counts.
        let mut peer = vec![true; 9];
        peer[2 * 3 + 1] = false;
        let s = ring_scores(&driver, &peer, 3);
        assert_eq!(s, vec![vec![0, 16, 9], vec![16, 0, 1], vec![9, 0, 0]]);
        // Peer access disabled everywhere: all links 0, so the best ring is the identity.
        let mut off = vec![false; 16];
        for a in 0..4 {
            off[a * 4 + a] = true;
        }
        let driver4 = vec![
            vec![0, 2, 16, 2],
            vec![2, 0, 2, 16],
            vec![16, 2, 0, 2],
            vec![2, 16, 2, 0],
        ];
        let s = ring_scores(&driver4, &off, 4);
        assert!(s.iter().flatten().all(|&x| x == 0));
        assert_eq!(topology::best_ring(&s), vec![0, 1, 2, 3]);
        assert_eq!(
            topology::best_ring(&ring_scores(&driver4, &[true; 16], 4)),
            vec![0, 1, 3, 2]
        );
        // A short driver matrix does not panic.
        assert_eq!(
            ring_scores(&[], &[true; 4], 2),
            vec![vec![0, 0], vec![0, 0]]
        );
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

    #[test]
    fn communicator_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Communicator>();
    }

    #[test]
    fn without_a_driver_construction_fails_cleanly() {
        // SAFETY: only probes for the library.
        if unsafe { sys::is_culib_present() } {
            return; // covered by the GPU tests
        }
        assert_eq!(Communicator::new(&[0]).unwrap_err(), Error::NoDriver);
        assert_eq!(Communicator::new(&[]).unwrap_err(), Error::NoDriver);
        assert_eq!(Communicator::all().unwrap_err(), Error::NoDriver);
    }
}
