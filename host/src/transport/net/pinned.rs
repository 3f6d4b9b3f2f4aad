//! A [`NetMem`] in pinned host memory mapped into a device (`cuMemHostAlloc` with
//! `CU_MEMHOSTALLOC_DEVICEMAP`): the proxy reads and writes it from the host, the rank's stream
//! through its device address (copies, `cuStreamWriteValue64`, the bounded wait kernel).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use super::NetMem;
use crate::{Error, Result};

/// A `cuMemHostAlloc` allocation, freed when dropped.
struct Pinned {
    ctx: Arc<CudaContext>,
    host: *mut c_void,
}

// SAFETY: pinned host memory is usable from any thread; only `Drop` touches the pointer.
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Nothing to report to from a destructor; a failed bind leaves the memory to the
        // process's end.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `cuMemHostAlloc`, freed once.
            let _ = unsafe { result::free_host(self.host) };
        }
    }
}

/// Allocates and zeroes, in `ctx`, the [`NetMem`] of `nranks` ranks with `scratch_bytes` of
/// scratch (a multiple of 8) in pinned host memory mapped into the device
/// ([`NetMem::device_base`]).
///
/// ```no_run
/// use ringccl::internals::transport::net::pinned::pinned;
/// let ctx = ringccl::cudarc::driver::CudaContext::new(0).expect("a GPU");
/// let m = pinned(&ctx, 2, 1 << 20, 0)?;
/// assert!(m.device_base().is_some());
/// # Ok::<(), ringccl::Error>(())
/// ```
pub fn pinned(
    ctx: &Arc<CudaContext>,
    nranks: usize,
    scratch_bytes: usize,
    rank: usize,
) -> Result<NetMem> {
    let bytes = NetMem::bytes(nranks, scratch_bytes)
        .filter(|_| scratch_bytes.is_multiple_of(8) && nranks > 0)
        .ok_or_else(|| Error::Internal {
            reason: format!("network memory for {nranks} ranks and {scratch_bytes} bytes"),
        })?;
    ctx.bind_to_thread()
        .map_err(|e| Error::cuda("cuCtxSetCurrent", Some(rank), e))?;
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: a plain allocation; zeroed below before any use.
    let host = unsafe { result::malloc_host(bytes, flags) }
        .map_err(|e| Error::cuda("cuMemHostAlloc", Some(rank), e))?;
    let owner = Pinned {
        ctx: ctx.clone(),
        host,
    };
    // SAFETY: `host` holds `bytes` bytes just allocated.
    unsafe { std::ptr::write_bytes(host as *mut u8, 0, bytes) };
    let mut device: sys::CUdeviceptr = 0;
    // SAFETY: `host` came from `cuMemHostAlloc` with DEVICEMAP; `device` valid for a write.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }
        .result()
        .map_err(|e| Error::cuda("cuMemHostGetDevicePointer", Some(rank), e))?;
    // SAFETY: page-aligned, zeroed, `bytes` long, alive while `owner` is (moved into the
    // `NetMem`), used through the `NetMem` only.
    Ok(unsafe {
        NetMem::from_raw(host as *mut u8, nranks, scratch_bytes, Some(device), Box::new(owner))
    })
}

/// Bytes of a rank's network scratch (and outbox): [`NET_SLOTS`](super::NET_SLOTS) slots per
/// peer (1 MiB chunks between two ranks).
pub const NET_SCRATCH_BYTES: usize = 16 << 20;

impl super::NetRank {
    /// Rank `rank` of `nranks` on `ctx`'s device: pinned, device-mapped memory of
    /// [`NET_SCRATCH_BYTES`] and a proxy connected to every other rank through `exchange`
    /// (collective), with the proxy's options `opts` (timeout, lanes, trace; UCX's settings).
    ///
    /// ```no_run
    /// # fn run(boot: &ringccl::bootstrap::Bootstrap) -> Result<(), ringccl::Error> {
    /// use ringccl::internals::transport::net::NetRank;
    /// let ctx = ringccl::cudarc::driver::CudaContext::new(0).expect("a GPU");
    /// let opts = ringccl::internals::transport::net::proxy::NetOptions::default();
    /// let net = NetRank::connect(&ctx, boot.rank(), boot.nranks(), boot, opts)?;
    /// # Ok(()) }
    /// ```
    pub fn connect(
        ctx: &Arc<CudaContext>,
        rank: usize,
        nranks: usize,
        exchange: &dyn crate::transport::ipc::Exchange,
        opts: super::proxy::NetOptions,
    ) -> Result<super::NetRank> {
        let mem = Arc::new(pinned(ctx, nranks, NET_SCRATCH_BYTES, rank)?);
        let proxy = super::proxy::Proxy::start(rank, nranks, mem, exchange, opts)?;
        Ok(super::NetRank::new(rank, nranks, proxy))
    }
}
