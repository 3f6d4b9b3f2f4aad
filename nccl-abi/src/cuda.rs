//! The few CUDA driver calls the C API makes itself: the caller's current device, keeping the
//! caller's current context across a call, and `ncclMemAlloc`'s memory.

use std::sync::OnceLock;

use ringccl::cudarc::driver::sys;

use crate::error::{Fail, Result};

/// Whether `libcuda` can be loaded (probed once; cudarc panics on a missing library).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// `Ok` if the driver is loaded and initialised.
fn init() -> Result<()> {
    if !driver_present() {
        return Err(Fail::from(ringccl::Error::NoDriver));
    }
    // SAFETY: cuInit takes flags only; repeated calls are cheap no-ops.
    check("cuInit", unsafe { sys::cuInit(0) })
}

fn check(call: &str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Fail::new(
            crate::types::NCCL_UNHANDLED_CUDA_ERROR,
            format!("{call} failed: {r:?}"),
        ))
    }
}

/// The device of the calling thread's current context (what `cudaGetDevice` reports once the
/// runtime has run), or device 0 when no context is current, as the runtime assumes.
pub fn current_device() -> Result<usize> {
    init()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    if ctx.is_null() {
        return Ok(0);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one device handle of the current context.
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    // A `CUdevice` handle is the ordinal that `cuDeviceGet` was given; check rather than assume.
    let n = ringccl::device_count().map_err(Fail::from)?;
    for ordinal in 0..n {
        let mut d: sys::CUdevice = -1;
        // SAFETY: writes one device handle; `ordinal` is in range.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut d, ordinal as i32)
        })?;
        if d == dev {
            return Ok(ordinal);
        }
    }
    Err(Fail::new(
        crate::types::NCCL_INTERNAL_ERROR,
        "the current context's device is not among the visible devices",
    ))
}

/// The calling thread's current context when created; made current again when dropped (ringccl
/// binds each rank's context while it issues work, and NCCL's callers expect their own back).
pub struct KeepContext(Option<sys::CUcontext>);

impl KeepContext {
    /// Remembers the current context (nothing, if the driver is missing).
    pub fn new() -> KeepContext {
        if !driver_present() {
            return KeepContext(None);
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle; an error (driver not initialised) leaves nothing to restore.
        let r = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
        KeepContext((r == sys::CUresult::CUDA_SUCCESS).then_some(ctx))
    }
}

impl Default for KeepContext {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for KeepContext {
    fn drop(&mut self) {
        if let Some(ctx) = self.0 {
            let mut now: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: reads the current handle, then restores the remembered one (a context
            // the caller had current, so still alive: the call did not destroy it).
            unsafe {
                if sys::cuCtxGetCurrent(&mut now) == sys::CUresult::CUDA_SUCCESS && now != ctx {
                    let _ = sys::cuCtxSetCurrent(ctx);
                }
            }
        }
    }
}

/// `ncclMemAlloc`: `size` bytes of device memory in the current context (`cuMemAlloc`).
pub fn mem_alloc(size: usize) -> Result<u64> {
    init()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    if ctx.is_null() {
        return Err(Fail::usage(
            "no CUDA context is current: call cudaSetDevice (or use a device) first",
        ));
    }
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: writes one device address.
    check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, size) })?;
    Ok(ptr)
}

/// `ncclMemFree`: frees memory from [`mem_alloc`].
///
/// # Safety
///
/// `ptr` must come from [`mem_alloc`] and no work may still use it.
pub unsafe fn mem_free(ptr: u64) -> Result<()> {
    init()?;
    // Free in the memory's own context, whatever the calling thread has current (NCCL sets the
    // pointer's device first, too); the caller's context is restored afterwards.
    let _keep = KeepContext::new();
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle for a device address.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ctx as *mut sys::CUcontext).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
            ptr,
        )
    };
    check("cuPointerGetAttribute(CONTEXT)", r)?;
    if !ctx.is_null() {
        // SAFETY: the context owning live memory is alive; `_keep` restores the caller's.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
    }
    // SAFETY: the caller's contract.
    check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
}
