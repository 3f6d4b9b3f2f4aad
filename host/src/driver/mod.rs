//! A thin, checked layer over `cudarc`'s driver API: everything ringccl asks of the CUDA driver
//! goes through here, and every failure comes back as an [`Error`] (never a panic).
//!
//! * this module: [`ensure_driver`] (is `libcuda.so` there at all? `cudarc` panics on first use
//!   without it, so every entry point of ringccl calls this first), [`device_count`], peer access
//!   ([`can_access_peer`], [`enable_peer_access`], only in `cudarc::driver::sys`), the link
//!   scores the ring order is chosen from ([`p2p_link_scores`]), copies between devices without
//!   peer access ([`memcpy_peer_async`]);
//! * [`module`]: the embedded PTX and [`Kernels`], the module loaded into one context with its
//!   functions looked up in O(1);
//! * [`launch`]: launch shapes and the one launcher;
//! * [`graph`]: which CUDA-graph capture a stream is in, and values a captured graph keeps
//!   alive.
//!
//! The driver layer reads no tuning: launch limits are its callers' arguments.
//!
//! ```no_run
//! use ringccl::internals::driver::{device_count, ensure_driver};
//! ensure_driver()?; // Err(Error::NoDriver) on a machine without the NVIDIA driver
//! println!("{} GPU(s)", device_count()?);
//! # Ok::<(), ringccl::Error>(())
//! ```

pub mod graph;
pub mod ipc;
pub mod launch;
pub(crate) mod ll;
pub mod module;
pub mod registered;
pub mod scale;
pub mod stream;
pub mod zc_counters;

pub use module::Kernels;

use std::sync::OnceLock;

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use crate::{Error, Result};

/// Checks that the CUDA driver library can be loaded and initialises it (`cuInit`).
///
/// Call this before anything else that touches CUDA: `cudarc` panics on first use when
/// `libcuda.so` is missing. The answer is computed once per process.
///
/// ```no_run
/// match ringccl::internals::driver::ensure_driver() {
///     Ok(()) => println!("driver present"),
///     Err(ringccl::Error::NoDriver) => println!("no NVIDIA driver on this machine"),
///     Err(e) => println!("{e}"),
/// }
/// ```
pub fn ensure_driver() -> Result<()> {
    static STATE: OnceLock<Result<()>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to open the library (and closes it again);
            // it calls no function in it.
            if !unsafe { sys::is_culib_present() } {
                return Err(Error::NoDriver);
            }
            result::init().map_err(|e| Error::cuda("cuInit", None, e))
        })
        .clone()
}

/// The number of CUDA devices visible to this process (`CUDA_VISIBLE_DEVICES` applies).
///
/// ```no_run
/// let n = ringccl::internals::driver::device_count()?;
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn device_count() -> Result<usize> {
    ensure_driver()?;
    let n = result::device::get_count().map_err(|e| Error::cuda("cuDeviceGetCount", None, e))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

fn cu_device(ordinal: usize) -> Result<sys::CUdevice> {
    let as_int = i32::try_from(ordinal).map_err(|_| Error::BadDevice {
        ordinal,
        reason: "ordinal out of range".into(),
    })?;
    result::device::get(as_int).map_err(|e| Error::cuda("cuDeviceGet", None, e))
}

/// Whether device `dev_a` can read and write the memory of device `dev_b` directly
/// (`cuDeviceCanAccessPeer`). A device and itself: `true`.
///
/// ```no_run
/// if ringccl::internals::driver::can_access_peer(0, 1)? {
///     println!("GPU 0 can access GPU 1 directly");
/// }
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn can_access_peer(dev_a: usize, dev_b: usize) -> Result<bool> {
    ensure_driver()?;
    if dev_a == dev_b {
        return Ok(true);
    }
    let (a, b) = (cu_device(dev_a)?, cu_device(dev_b)?);
    let mut can: std::ffi::c_int = 0;
    // SAFETY: `can` is a valid out-pointer; `a` and `b` are device handles from `cuDeviceGet`.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a, b) }
        .result()
        .map_err(|e| Error::cuda("cuDeviceCanAccessPeer", None, e))?;
    Ok(can != 0)
}

/// Lets kernels and copies running in `ctx` access memory allocated on `peer`'s device, one
/// direction: `cuCtxEnablePeerAccess` (for `cuMemAlloc` memory; enabling twice is not an
/// error) and `cuMemPoolSetAccess` on the peer device's current memory pool (stream-ordered
/// allocations, which `cudarc`'s `CudaStream::alloc` makes, are not covered by context peer
/// access). The pool setting is process-wide and applies to the pool that is current now.
///
/// ```no_run
/// use cudarc::driver::CudaContext;
/// ringccl::internals::driver::ensure_driver()?;
/// let (a, b) = (CudaContext::new(0).unwrap(), CudaContext::new(1).unwrap());
/// ringccl::internals::driver::enable_peer_access(&a, &b)?;
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn enable_peer_access(ctx: &CudaContext, peer: &CudaContext) -> Result<()> {
    ctx.bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", None, e))?;
    // SAFETY: `ctx` is current on this thread and `peer.cu_ctx()` is a live context (the
    // `CudaContext` owns it for the duration of the call); flags must be 0.
    let r = unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) };
    match r {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
        other => {
            return Err(Error::cuda(
                "cuCtxEnablePeerAccess",
                None,
                result::DriverError(other),
            ));
        }
    }
    if !peer.has_async_alloc() {
        return Ok(());
    }
    // SAFETY: `cu_device` comes from `cuDeviceGet` (inside `CudaContext::new`).
    let pool = unsafe { result::device::get_mem_pool(peer.cu_device()) }
        .map_err(|e| Error::cuda("cuDeviceGetMemPool", None, e))?;
    let accessor = i32::try_from(ctx.ordinal()).map_err(|_| Error::BadDevice {
        ordinal: ctx.ordinal(),
        reason: "ordinal out of range".into(),
    })?;
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: accessor,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `pool` is the device's live current pool; `desc` is one valid descriptor.
    unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }
        .result()
        .map_err(|e| Error::cuda("cuMemPoolSetAccess", None, e))
}

/// Performance ranks (`CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`, 0 = best) that
/// [`link_score`] tells apart; worse ranks all score like this one.
pub const WORST_SCORED_PERF_RANK: i32 = 15;

/// The score of a directed link for [`crate::plan::topology::best_ring`]: 0 without peer access,
/// otherwise `1 + (WORST_SCORED_PERF_RANK - rank)` for the driver's performance rank (0 is the
/// best; ranks are clamped to `0..=WORST_SCORED_PERF_RANK`), so a better link scores higher and
/// every link with access scores at least 1.
///
/// ```
/// use ringccl::internals::driver::{link_score, WORST_SCORED_PERF_RANK};
/// assert_eq!(link_score(false, 0), 0);
/// assert!(link_score(true, 0) > link_score(true, 1));
/// assert_eq!(link_score(true, WORST_SCORED_PERF_RANK), 1);
/// assert_eq!(link_score(true, 1000), 1);
/// ```
pub fn link_score(access: bool, performance_rank: i32) -> u32 {
    if !access {
        return 0;
    }
    let rank = performance_rank.clamp(0, WORST_SCORED_PERF_RANK);
    // `rank` is within 0..=WORST_SCORED_PERF_RANK, so the difference is small and non-negative.
    1 + (WORST_SCORED_PERF_RANK - rank).unsigned_abs()
}

/// One `cuDeviceGetP2PAttribute` value for the directed pair `src -> dst` (distinct devices).
fn p2p_attribute(
    attrib: sys::CUdevice_P2PAttribute,
    src: sys::CUdevice,
    dst: sys::CUdevice,
) -> Result<i32> {
    let mut value: std::ffi::c_int = 0;
    // SAFETY: `value` is a valid out-pointer; `src` and `dst` are distinct device handles from
    // `cuDeviceGet`; `attrib` is a valid enumerator.
    unsafe { sys::cuDeviceGetP2PAttribute(&mut value, attrib, src, dst) }
        .result()
        .map_err(|e| Error::cuda("cuDeviceGetP2PAttribute", None, e))?;
    Ok(value)
}

/// The link scores between the given devices, for [`crate::plan::topology::best_ring`]:
/// `scores[a][b]` is [`link_score`] of `CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED` and
/// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` from device `ordinals[a]` to device `ordinals[b]`;
/// the diagonal is 0. This reads what the hardware supports; whether peer access is enabled
/// is the communicator's business.
///
/// Errors: [`Error::NoDriver`], [`Error::BadDevice`] for an ordinal the driver rejects,
/// [`Error::Cuda`] if the driver cannot answer.
///
/// ```no_run
/// let scores = ringccl::internals::driver::p2p_link_scores(&[0, 1, 2, 3])?;
/// println!("ring: {:?}", ringccl::internals::topology::best_ring(&scores));
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn p2p_link_scores(ordinals: &[usize]) -> Result<Vec<Vec<u32>>> {
    ensure_driver()?;
    let devs = ordinals
        .iter()
        .map(|&o| cu_device(o))
        .collect::<Result<Vec<_>>>()?;
    let n = devs.len();
    let mut scores = vec![vec![0u32; n]; n];
    for (a, row) in scores.iter_mut().enumerate() {
        for (b, cell) in row.iter_mut().enumerate() {
            if a == b || ordinals[a] == ordinals[b] {
                continue;
            }
            use sys::CUdevice_P2PAttribute as A;
            let access = p2p_attribute(
                A::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                devs[a],
                devs[b],
            )?;
            if access == 0 {
                continue;
            }
            let rank = p2p_attribute(
                A::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
                devs[a],
                devs[b],
            )?;
            *cell = link_score(true, rank);
        }
    }
    Ok(scores)
}

/// Copies `bytes` bytes from `src` (memory of `src_ctx`'s device) to `dst` (memory of
/// `dst_ctx`'s device) on `stream`, without peer access (`cuMemcpyPeerAsync`).
///
/// # Safety
/// Both ranges must be valid device memory of their contexts, alive until the copy has run.
pub unsafe fn memcpy_peer_async(
    stream: &CudaStream,
    dst_ctx: &CudaContext,
    dst: u64,
    src_ctx: &CudaContext,
    src: u64,
    bytes: usize,
    rank: Option<usize>,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", rank, e))?;
    // SAFETY: contexts and stream are live (borrowed); the caller guarantees the ranges.
    unsafe {
        result::memcpy_peer_async(
            dst_ctx.cu_ctx(),
            dst,
            src_ctx.cu_ctx(),
            src,
            bytes,
            stream.cu_stream(),
        )
    }
    .map_err(|e| Error::cuda("cuMemcpyPeerAsync", rank, e))
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_on_this_machine_is_an_error_not_a_panic() {
        // SAFETY: only probes for the library.
        let present = unsafe { sys::is_culib_present() };
        if present {
            // A machine with a driver: ensure_driver must succeed or report a CUDA error.
            assert!(!matches!(ensure_driver(), Err(Error::NoDriver)));
        } else {
            assert_eq!(ensure_driver(), Err(Error::NoDriver));
            assert_eq!(device_count(), Err(Error::NoDriver));
            assert_eq!(can_access_peer(0, 1), Err(Error::NoDriver));
            assert_eq!(p2p_link_scores(&[0, 1]), Err(Error::NoDriver));
        }
    }

    #[test]
    fn link_scores_order_by_performance_rank() {
        for rank in [-3, 0, 1, 7, WORST_SCORED_PERF_RANK, 16, i32::MAX] {
            assert_eq!(link_score(false, rank), 0);
            assert!(link_score(true, rank) >= 1);
        }
        for rank in 0..WORST_SCORED_PERF_RANK {
            assert_eq!(link_score(true, rank), link_score(true, rank + 1) + 1);
        }
        assert_eq!(link_score(true, -3), link_score(true, 0));
        assert_eq!(link_score(true, i32::MIN), link_score(true, 0));
        assert_eq!(link_score(true, i32::MAX), 1);
    }
}
