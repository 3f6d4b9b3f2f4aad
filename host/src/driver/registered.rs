//! The driver queries of buffer registration ([`crate::transport::registry`]): an allocation's
//! range, its buffer id (which the driver never reuses within a process, so a freed and
//! re-allocated range has another one) and its IPC handle.

use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::zc_counters;

/// One allocation as the driver describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The allocation's base address.
    pub base: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub buffer_id: u64,
}

/// The allocation that holds `ptr` in `ctx`, or why the driver would not say.
pub fn allocation_of(ctx: &Arc<CudaContext>, ptr: u64) -> std::result::Result<Allocation, String> {
    ctx.bind_to_thread().map_err(|e| format!("cuCtxSetCurrent: {e}"))?;
    let (mut base, mut bytes): (sys::CUdeviceptr, usize) = (0, 0);
    zc_counters::pointer_query();
    // SAFETY: both out-pointers are valid; the driver checks `ptr`.
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut bytes, ptr) }
        .result()
        .map_err(|e| format!("cuMemGetAddressRange: {e}"))?;
    let buffer_id = buffer_id(base).ok_or_else(|| "cuPointerGetAttribute(BUFFER_ID) failed".to_string())?;
    Ok(Allocation {
        base,
        bytes: bytes as u64,
        buffer_id,
    })
}

/// The buffer id of the allocation holding `ptr` (the current context's), `None` if the
/// driver knows no allocation there.
pub fn buffer_id(ptr: u64) -> Option<u64> {
    let mut id: u64 = 0;
    zc_counters::pointer_query();
    // SAFETY: `id` is a valid out-pointer of the attribute's type (`unsigned long long`).
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut id as *mut u64).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            ptr,
        )
    };
    r.result().ok().map(|()| id)
}

/// The IPC handle of the allocation at `base` (its base address), or why the driver refused
/// it (memory of a stream-ordered pool, a VMM allocation, host memory...).
pub fn ipc_handle_of(ctx: &Arc<CudaContext>, base: u64) -> std::result::Result<[u8; 64], String> {
    ctx.bind_to_thread().map_err(|e| format!("cuCtxSetCurrent: {e}"))?;
    let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: `handle` is a valid out-pointer; the driver checks `base`.
    unsafe { sys::cuIpcGetMemHandle(&mut handle, base) }
        .result()
        .map_err(|e| format!("cuIpcGetMemHandle: {e}"))?;
    Ok(handle.reserved.map(|b| b as u8))
}
