//! Plain `cuMemAlloc` memory as a ringccl buffer ([`ringccl::RawBuf`]): what CUDA IPC exports
//! (cudarc's own allocations may come from a stream-ordered pool, which it does not) and what
//! callers of the C ABI pass; no cudarc event tracking: the caller orders by hand.
//!
//! ```no_run
//! use ringccl_tests::plain::Plain;
//! let ctx = cudarc::driver::CudaContext::new(0)?;
//! ctx.bind_to_thread()?;
//! let buf = Plain::<f32>::new(1024, 0);
//! buf.upload(&vec![1.0; 1024]);
//! assert_eq!(buf.download()[0], 1.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::marker::PhantomData;

use cudarc::driver::result;
use ringccl::{DeviceSlice, DeviceSliceMut, RawBuf};

/// `len` elements of `T` in device memory of GPU `ordinal`, freed on drop.
pub struct Plain<T> {
    ptr: u64,
    len: usize,
    ordinal: usize,
    _t: PhantomData<T>,
}

impl<T: Copy + Default> Plain<T> {
    /// Allocates `len` elements (at least one byte) on the context current on this thread,
    /// that of GPU `ordinal`. Panics if the driver refuses.
    pub fn new(len: usize, ordinal: usize) -> Plain<T> {
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        // SAFETY: a context is current on this thread (the caller's contract).
        let ptr = unsafe { result::malloc_sync(bytes) }.expect("cuMemAlloc");
        Plain {
            ptr,
            len,
            ordinal,
            _t: PhantomData,
        }
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The length in elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes `v` (exactly `len` elements) and waits for the device: a pageable upload may
    /// return before its DMA lands, and the communicator's streams do not wait for the legacy
    /// stream.
    pub fn upload(&self, v: &[T]) {
        assert_eq!(v.len(), self.len);
        // SAFETY: `len` elements of live device memory; synchronous.
        unsafe { result::memcpy_htod_sync(self.ptr, v) }.expect("upload");
        result::ctx::synchronize().expect("synchronize after the upload");
    }

    /// Reads every element (after the device's earlier work on it: the caller synchronises).
    pub fn download(&self) -> Vec<T> {
        let mut v = vec![T::default(); self.len];
        // SAFETY: as above.
        unsafe { result::memcpy_dtoh_sync(&mut v, self.ptr) }.expect("download");
        v
    }
}

impl<T> Drop for Plain<T> {
    fn drop(&mut self) {
        // SAFETY: from `cuMemAlloc`, freed once; the caller synchronised its uses.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

// SAFETY: `raw` describes exactly the allocation; ordering is by hand (the caller synchronises).
unsafe impl<T> DeviceSlice<T> for Plain<T> {
    fn raw(&self) -> RawBuf {
        RawBuf::new(self.ptr, self.len, self.ordinal)
    }
}
// SAFETY: as above.
unsafe impl<T> DeviceSliceMut<T> for Plain<T> {}
