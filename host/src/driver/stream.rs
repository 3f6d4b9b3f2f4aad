//! Which stream a handle names: `cuStreamGetId` (CUDA 12.0+), looked up in the driver with
//! `cuGetProcAddress` like the stream memory operations, so that a driver without it is an
//! error at the communicator's creation rather than at a call.

use std::ffi::c_void;

use cudarc::driver::{sys, CudaStream};

use crate::Result;

type GetId = unsafe extern "C" fn(sys::CUstream, *mut u64) -> sys::CUresult;

/// A stream as the driver names it: its handle and its unique id (never reused in a process,
/// so a stream destroyed and another created at the same handle differ).
pub type StreamKey = (usize, u64);

/// The driver's `cuStreamGetId`.
///
/// ```no_run
/// use ringccl::internals::driver::stream::StreamIds;
/// let ctx = cudarc::driver::CudaContext::new(0)?;
/// let ids = StreamIds::load()?;
/// let (a, b) = (ctx.new_stream()?, ctx.new_stream()?);
/// assert_ne!(ids.key(&a), ids.key(&b));
/// assert_eq!(ids.key(&a), ids.key(&a));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct StreamIds {
    get: GetId,
}

impl StreamIds {
    /// Looks the entry point up in the driver.
    pub fn load() -> Result<Self> {
        crate::driver::ensure_driver()?;
        let get = crate::driver::ipc::proc_address(c"cuStreamGetId")?;
        // SAFETY: the driver returned this entry point for the name above, whose C signature
        // is `CUresult (CUstream, unsigned long long *)`.
        Ok(StreamIds {
            get: unsafe { std::mem::transmute::<*mut c_void, GetId>(get) },
        })
    }

    /// The key of `stream`, or `None` for the legacy and per-thread default streams (one
    /// handle for different streams) and where the driver cannot tell.
    pub fn key(&self, stream: &CudaStream) -> Option<StreamKey> {
        let raw = stream.cu_stream();
        // `NULL`, `CU_STREAM_LEGACY` (1) and `CU_STREAM_PER_THREAD` (2).
        if (raw as usize) <= 2 {
            return None;
        }
        let mut id = 0u64;
        // SAFETY: `raw` is a live stream (the caller holds it); `id` is written by the call.
        let r = unsafe { (self.get)(raw, &mut id) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some((raw as usize, id))
    }
}
