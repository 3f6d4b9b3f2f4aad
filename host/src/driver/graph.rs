//! CUDA-graph capture, as the executors need it: which capture a stream is in
//! ([`capture_of`]), and tying a value's lifetime to the graph being captured
//! ([`keep_alive_in_graph`]) so that memory a captured call uses outlives every copy and
//! instantiation of the graph, however long the user keeps it.
//!
//! The second is CUDA's user objects: a reference-counted handle with a destructor, owned by
//! the graph (and by every executable graph instantiated from it, until its last launch has
//! finished). The destructor runs on a thread of the driver's, where no CUDA call may be made,
//! so the value is dropped on a thread of its own.
//!
//! ```no_run
//! use ringccl::internals::driver::graph::capture_of;
//! let ctx = ringccl::cudarc::driver::CudaContext::new(0)?;
//! let stream = ctx.new_stream()?;
//! assert!(capture_of(&stream, None)?.is_none()); // not being captured
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::{sys, CudaStream};

use crate::{Error, Result};

/// The capture a stream is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    /// The capture's id, unique in the process: streams joined into one capture share it.
    pub id: u64,
    /// The graph being captured.
    pub graph: sys::CUgraph,
}

/// The capture `stream` (rank `rank`'s, for the error) is in, `None` if it is not being
/// captured (or its capture was invalidated: then any work enqueued on it fails, as with any
/// other library).
pub fn capture_of(stream: &CudaStream, rank: Option<usize>) -> Result<Option<Capture>> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut ndeps: usize = 0;
    // SAFETY: the stream is alive (borrowed); every out-pointer is a valid local.
    let r = unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            stream.cu_stream(),
            &mut status,
            &mut id,
            &mut graph,
            &mut deps,
            &mut edges,
            &mut ndeps,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Cuda {
            call: "cuStreamGetCaptureInfo",
            code: format!("{r:?}"),
            rank,
        });
    }
    Ok((status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
        .then_some(Capture { id, graph }))
}

/// How many values [`keep_alive_in_graph`] holds for graphs that still exist (or whose last
/// launch has not finished).
static HELD: AtomicUsize = AtomicUsize::new(0);

/// The number of values held alive by CUDA graphs right now: each captured ringccl call holds
/// one, released when the last graph or executable graph that contains it is destroyed (and
/// its launches have finished). A diagnostic; 0 once every such graph is gone.
///
/// ```
/// // No graph has captured anything in this process.
/// assert_eq!(ringccl::internals::driver::graph::held_by_graphs(), 0);
/// ```
pub fn held_by_graphs() -> usize {
    HELD.load(Ordering::Acquire)
}

/// The user object's destructor: drops the boxed value on a thread of its own (no CUDA call
/// may be made on the driver's thread that runs this, and dropping the value may make some).
unsafe extern "C" fn release(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // The address crosses to the new thread as a number: if the thread cannot be made, the
    // closure (a number) is dropped here and the value is leaked, never freed on this thread.
    let addr = p as usize;
    let spawned = std::thread::Builder::new()
        .name("ringccl-graph-release".into())
        .spawn(move || {
            // Freeing device memory while another thread captures in the global mode would
            // invalidate that capture.
            let _relaxed = relaxed_capture_mode();
            // SAFETY: `addr` came from `Box::into_raw` in `keep_alive_in_graph`; the driver
            // calls the destructor once, and only this thread takes the box back.
            drop(unsafe { Box::<Box<dyn Send>>::from_raw(addr as *mut Box<dyn Send>) });
            HELD.fetch_sub(1, Ordering::AcqRel);
        });
    drop(spawned);
}

/// Makes the graph `graph` (being captured) own `value`: it is dropped only after the graph,
/// every graph instantiated from it and their launches are gone. Errors leave `value` dropped
/// here, on the caller's thread.
///
/// # Safety
///
/// `graph` must be a live graph: the [`Capture::graph`] of a capture still in progress.
pub unsafe fn keep_alive_in_graph<T: Send + 'static>(graph: sys::CUgraph, value: T) -> Result<()> {
    let boxed: Box<Box<dyn Send>> = Box::new(Box::new(value));
    let p: *mut c_void = Box::into_raw(boxed).cast();
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    // SAFETY: `release` is a valid destructor for `p`; the one reference created is ours.
    let r = unsafe {
        sys::cuUserObjectCreate(
            &mut object,
            p,
            Some(release),
            1,
            sys::CUuserObject_flags_enum::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the driver did not take `p`: it is still ours alone.
        drop(unsafe { Box::<Box<dyn Send>>::from_raw(p.cast()) });
        return Err(Error::Cuda {
            call: "cuUserObjectCreate",
            code: format!("{r:?}"),
            rank: None,
        });
    }
    HELD.fetch_add(1, Ordering::AcqRel);
    // SAFETY: `graph` is live (the caller's promise); the reference we own moves to it.
    let r = unsafe {
        sys::cuGraphRetainUserObject(
            graph,
            object,
            1,
            sys::CUuserObjectRetain_flags_enum::CU_GRAPH_USER_OBJECT_MOVE as u32,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        // The reference is still ours: releasing it runs the destructor (on the driver's
        // thread, which hands the value to a thread of its own).
        // SAFETY: `object` is a live user object whose one reference we own.
        unsafe { sys::cuUserObjectRelease(object, 1) };
        return Err(Error::Cuda {
            call: "cuGraphRetainUserObject",
            code: format!("{r:?}"),
            rank: None,
        });
    }
    Ok(())
}

/// The calling thread's stream-capture mode set to relaxed, restored when dropped: while it
/// lives, the thread's queries and frees (`cuEventQuery`, `cuStreamQuery`, `cuMemFree`) are
/// allowed during another thread's capture in the global mode (PyTorch's default), instead of
/// failing and invalidating that capture. Without the CUDA driver, or if the mode cannot be
/// changed, the thread keeps its mode (the guard then restores nothing).
///
/// ```no_run
/// let _relaxed = ringccl::internals::driver::graph::relaxed_capture_mode();
/// // cuEventQuery here does not disturb another thread's global-mode capture.
/// ```
pub fn relaxed_capture_mode() -> RelaxedCaptureMode {
    // Without the driver (nothing captured, nothing to query) the call would not resolve.
    if super::ensure_driver().is_err() {
        return RelaxedCaptureMode(None);
    }
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `mode` is a valid local; the call exchanges the thread's mode for it.
    let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    RelaxedCaptureMode((r == sys::CUresult::CUDA_SUCCESS).then_some(mode))
}

/// See [`relaxed_capture_mode`]: holds the thread's previous capture mode.
#[must_use = "the mode is restored when the guard is dropped"]
pub struct RelaxedCaptureMode(Option<sys::CUstreamCaptureMode>);

impl Drop for RelaxedCaptureMode {
    fn drop(&mut self) {
        if let Some(mut mode) = self.0.take() {
            // SAFETY: `mode` is a valid local holding the mode this thread had before.
            unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread::ThreadId;

    use super::*;

    /// Sends the id of the thread that drops it.
    struct Witness(mpsc::Sender<ThreadId>);

    impl Drop for Witness {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().id());
        }
    }

    #[test]
    fn the_destructor_drops_the_value_on_a_thread_of_its_own() {
        let (tx, rx) = mpsc::channel();
        let boxed: Box<Box<dyn Send>> = Box::new(Box::new(Witness(tx)));
        HELD.fetch_add(1, Ordering::AcqRel);
        // SAFETY: `release` takes back a pointer made by `Box::into_raw` of this type, once,
        // as the driver would call it.
        unsafe { release(Box::into_raw(boxed).cast()) };
        let dropped_on = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the value is dropped");
        assert_ne!(dropped_on, std::thread::current().id(), "dropped on the driver's thread");
        // A null pointer is ignored.
        // SAFETY: null is checked first.
        unsafe { release(std::ptr::null_mut()) };
    }
}
