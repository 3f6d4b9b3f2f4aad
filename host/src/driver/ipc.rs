//! Memory shared between processes and ordering between their streams:
//! * [`DeviceAlloc`]: a plain `cuMemAlloc` allocation (what CUDA IPC can export), freed on drop;
//! * [`IpcHandle`], [`IpcHandle::open`] → [`Mapped`]: `cuIpcGetMemHandle` in the owner,
//!   `cuIpcOpenMemHandle` in a peer process (once: opening costs milliseconds), closed on drop;
//! * [`MemOps`]: `cuStreamWriteValue64`, a stream writing a flag in a peer's memory (after its
//!   earlier work, with a memory fence): how one process's stream signals another's without
//!   the host. It is looked up with `cuGetProcAddress`, so a driver without it is an error, not
//!   a panic. The waiting side is the bounded wait kernel (`gpu_kernels::oneshot::WAIT_ENTRY`),
//!   not `cuStreamWaitValue64`, which can neither time out nor be aborted.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use crate::{Error, Result};

/// `len` bytes of plain device memory (`cuMemAlloc`) in `ctx`, freed on drop.
#[derive(Debug)]
pub struct DeviceAlloc {
    ctx: Arc<CudaContext>,
    ptr: u64,
    len: usize,
}

impl DeviceAlloc {
    /// Allocates `len` bytes (at least 1) in `ctx` and zeroes them (finished when this returns).
    pub fn zeroed(ctx: &Arc<CudaContext>, len: usize, rank: Option<usize>) -> Result<Self> {
        let len = len.max(1);
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", rank, e))?;
        // SAFETY: `ctx` is current on this thread.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(|e| Error::cuda("cuMemAlloc", rank, e))?;
        let alloc = DeviceAlloc {
            ctx: ctx.clone(),
            ptr,
            len,
        };
        // SAFETY: `ptr` is `len` bytes of live memory of the current context; synchronous.
        unsafe { result::memset_d8_sync(ptr, 0, len) }
            .map_err(|e| Error::cuda("cuMemsetD8", rank, e))?;
        Ok(alloc)
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// The handle another process opens this allocation with.
    pub fn ipc_handle(&self, rank: Option<usize>) -> Result<IpcHandle> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", rank, e))?;
        let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
        // SAFETY: `handle` is a valid out-pointer; `ptr` is the base of a `cuMemAlloc`
        // allocation of the current context.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, self.ptr) }
            .result()
            .map_err(|e| Error::cuda("cuIpcGetMemHandle", rank, e))?;
        Ok(IpcHandle(handle.reserved.map(|b| b as u8)))
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // Users of the memory are done: its owner synchronises before dropping it.
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: `ptr` came from `cuMemAlloc` in this context and is freed once, here.
        self.ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}

/// A CUDA IPC memory handle: 64 opaque bytes another process of the same machine opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcHandle(pub [u8; 64]);

impl IpcHandle {
    /// Maps the memory this handle names into `ctx` (another process's allocation), enabling
    /// peer access to its device as needed. Costs milliseconds: do it once.
    pub fn open(&self, ctx: &Arc<CudaContext>, rank: Option<usize>) -> Result<Mapped> {
        ctx.bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", rank, e))?;
        let handle = sys::CUipcMemHandle_st {
            reserved: self.0.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: `ptr` is a valid out-pointer; the handle is plain data (the driver checks it).
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags) }
            .result()
            .map_err(|e| Error::cuda("cuIpcOpenMemHandle", rank, e))?;
        Ok(Mapped {
            ctx: ctx.clone(),
            ptr,
        })
    }
}

/// Another process's memory mapped into a context; unmapped on drop.
#[derive(Debug)]
pub struct Mapped {
    ctx: Arc<CudaContext>,
    ptr: u64,
}

impl Mapped {
    /// The address of the mapping in this process.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: `ptr` came from `cuIpcOpenMemHandle` in this context and is closed once.
        self.ctx
            .record_err(unsafe { sys::cuIpcCloseMemHandle(self.ptr) }.result());
    }
}

type WriteValue64 = unsafe extern "C" fn(sys::CUstream, sys::CUdeviceptr, u64, u32) -> sys::CUresult;

/// The stream memory operation `cuStreamWriteValue64`.
#[derive(Clone, Copy, Debug)]
pub struct MemOps {
    write: WriteValue64,
}

/// The CUDA version the entry points are asked for (13.0).
const PROC_VERSION: i32 = 13000;

/// The driver's entry point `name`, or an error naming it.
pub(crate) fn proc_address(name: &CStr) -> Result<*mut c_void> {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: `name` is NUL-terminated; `pfn` and `status` are valid out-pointers.
    let r = unsafe {
        sys::cuGetProcAddress_v2(
            name.as_ptr(),
            &mut pfn,
            PROC_VERSION,
            sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
            &mut status,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS
        || status != sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
        || pfn.is_null()
    {
        return Err(Error::Kernel {
            reason: format!(
                "the CUDA driver does not provide {} ({r:?}, {status:?}); one process per GPU \
                 needs a driver for CUDA 12 or newer",
                name.to_string_lossy()
            ),
        });
    }
    Ok(pfn)
}

impl MemOps {
    /// Looks the operations up in the driver.
    pub fn load() -> Result<Self> {
        crate::driver::ensure_driver()?;
        let write = proc_address(c"cuStreamWriteValue64")?;
        // SAFETY: the driver returned this entry point for the name above, whose C signature
        // is `CUresult (CUstream, CUdeviceptr, cuuint64_t, unsigned int)`.
        unsafe {
            Ok(MemOps {
                write: std::mem::transmute::<*mut c_void, WriteValue64>(write),
            })
        }
    }

    /// Enqueues on `stream`: after its earlier work (and a memory fence), write `value` to the
    /// 8-byte word at `addr`.
    ///
    /// # Safety
    /// `addr` is an 8-byte aligned word of device memory accessible from the stream's context
    /// (its own, a peer's with peer access, or mapped), alive until the write has run.
    pub unsafe fn write(&self, stream: &CudaStream, addr: u64, value: u64, rank: usize) -> Result<()> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| Error::cuda("cuCtxSetCurrent", Some(rank), e))?;
        // SAFETY: forwarded from the caller; flags 0 = with a memory fence.
        unsafe { (self.write)(stream.cu_stream(), addr, value, 0) }
            .result()
            .map_err(|e| Error::cuda("cuStreamWriteValue64", Some(rank), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_nothing_panics() {
        // SAFETY: only probes for the library.
        if unsafe { sys::is_culib_present() } {
            return; // covered by the GPU tests
        }
        assert!(matches!(MemOps::load(), Err(Error::NoDriver)));
    }
}
