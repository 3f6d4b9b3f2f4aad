//! Holding a queued call's buffers until the call has run.
//!
//! A call that cannot be issued at once (a point-to-point call inside a group; any call of a
//! [`super::Comm::from_devices`] communicator before every rank has made it) returns while its
//! buffers' borrows end; the caller may then drop or reuse them. To keep that sound, the call
//! is queued behind a *gate*, a 32-bit word of device memory:
//!
//! * the rank's *side* stream `T`, which later runs the call, waits now for the earlier
//!   tracked writes (and, for an output, reads) of the buffers;
//! * the rank's *gate* stream `G` waits (`cuStreamWaitValue32`, ≥) until the word holds the
//!   call's generation, and the buffers' cudarc read/write events are recorded on `G` after
//!   that wait: every later tracked use of the buffers (a copy, a kernel of another stream,
//!   the free when a `CudaSlice` is dropped) waits for the gate;
//! * when the call is issued, `T` waits for the caller's stream as it was at the call, runs the
//!   call, and writes the generation (`cuStreamWriteValue32`): the gate opens once the call's
//!   work is done; the caller's stream then waits for `T`.
//!
//! The caller's stream itself is never blocked. A gate opens when its call is issued, when
//! issuing fails, or when the communicator is dropped.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use crate::{Error, Result};

/// Gate words of one rank: at most this many of its calls wait at once.
pub const GATE_WORDS: usize = 1024;

type WaitValue32 = unsafe extern "C" fn(sys::CUstream, sys::CUdeviceptr, u32, u32) -> sys::CUresult;
type WriteValue32 =
    unsafe extern "C" fn(sys::CUstream, sys::CUdeviceptr, u32, u32) -> sys::CUresult;

/// `cuStreamWaitValue32` and `cuStreamWriteValue32`, looked up once.
#[derive(Clone, Copy)]
struct MemOps {
    wait: WaitValue32,
    write: WriteValue32,
}

fn proc_address(name: &CStr) -> Result<*mut c_void> {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: `name` is NUL-terminated; `pfn` and `status` are valid out-pointers. The driver
    // is loaded (a communicator exists before any gate is made).
    let r = unsafe {
        sys::cuGetProcAddress_v2(
            name.as_ptr(),
            &mut pfn,
            13000,
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
                "the CUDA driver does not provide {} ({r:?}, {status:?}); queued calls of \
                 ringccl::nccl need a driver for CUDA 12 or newer",
                name.to_string_lossy()
            ),
        });
    }
    Ok(pfn)
}

fn memops() -> Result<MemOps> {
    static OPS: OnceLock<std::result::Result<MemOps, Error>> = OnceLock::new();
    OPS.get_or_init(|| {
        let wait = proc_address(c"cuStreamWaitValue32")?;
        let write = proc_address(c"cuStreamWriteValue32")?;
        // SAFETY: the driver returned these entry points for the names above, both of C
        // signature `CUresult (CUstream, CUdeviceptr, cuuint32_t, unsigned int)`.
        unsafe {
            Ok(MemOps {
                wait: std::mem::transmute::<*mut c_void, WaitValue32>(wait),
                write: std::mem::transmute::<*mut c_void, WriteValue32>(write),
            })
        }
    })
    .clone()
}

fn cuda(call: &'static str, rank: usize) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda {
        call,
        code: format!("{:?}", e.0),
        rank: Some(rank),
    }
}

/// One rank's side stream, gate stream and gate words.
pub struct Side {
    rank: usize,
    /// Runs the queued calls of the rank.
    pub t: Arc<CudaStream>,
    /// Waits at the gates; the queued buffers' events are recorded here.
    pub g: Arc<CudaStream>,
    /// The gate words: plain `cuMemAlloc` memory (stream memory operations refuse memory of
    /// the stream-ordered pool that `CudaStream::alloc_zeros` takes).
    base: u64,
    ops: MemOps,
}

impl Side {
    /// The streams and words of `rank` on `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, rank: usize) -> Result<Side> {
        let ops = memops()?;
        let t = ctx.new_stream().map_err(cuda("cuStreamCreate", rank))?;
        let g = ctx.new_stream().map_err(cuda("cuStreamCreate", rank))?;
        ctx.bind_to_thread()
            .map_err(cuda("cuCtxSetCurrent", rank))?;
        // SAFETY: `ctx` is current on this thread.
        let base =
            unsafe { result::malloc_sync(GATE_WORDS * 4) }.map_err(cuda("cuMemAlloc", rank))?;
        // SAFETY: `base` is `GATE_WORDS` words of live memory of the current context; synchronous.
        if let Err(e) = unsafe { result::memset_d8_sync(base, 0, GATE_WORDS * 4) } {
            // SAFETY: allocated above, used by nothing yet.
            let _ = unsafe { result::free_sync(base) };
            return Err(cuda("cuMemsetD8", rank)(e));
        }
        Ok(Side {
            rank,
            t,
            g,
            base,
            ops,
        })
    }

    fn addr(&self, slot: usize) -> u64 {
        self.base + (slot % GATE_WORDS) as u64 * 4
    }

    /// Enqueues on `G` the wait for gate `slot` to reach `generation`.
    pub fn wait(&self, slot: usize, generation: u32) -> Result<()> {
        self.g
            .context()
            .bind_to_thread()
            .map_err(cuda("cuCtxSetCurrent", self.rank))?;
        // SAFETY: the word is device memory of this context, alive until `Drop` has
        // synchronised `G`; flags 0 = CU_STREAM_WAIT_VALUE_GEQ.
        unsafe { (self.ops.wait)(self.g.cu_stream(), self.addr(slot), generation, 0) }
            .result()
            .map_err(cuda("cuStreamWaitValue32", self.rank))
    }

    /// Enqueues on `T`, after its earlier work, the write that opens gate `slot` at
    /// `generation`.
    pub fn open(&self, slot: usize, generation: u32) -> Result<()> {
        self.t
            .context()
            .bind_to_thread()
            .map_err(cuda("cuCtxSetCurrent", self.rank))?;
        // SAFETY: as in `wait`; flags 0 = with a memory fence, after the stream's earlier work.
        unsafe { (self.ops.write)(self.t.cu_stream(), self.addr(slot), generation, 0) }
            .result()
            .map_err(cuda("cuStreamWriteValue32", self.rank))
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        // The owner opened every gate before; both streams finish before the words go.
        for s in [&self.t, &self.g] {
            if let Err(e) = s.synchronize() {
                log::error!(target: "ringccl", "ringccl::nccl: rank {}: {e:?} while draining a gate stream", self.rank);
            }
        }
        let ctx = self.t.context();
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: `base` came from `cuMemAlloc` in this context; both streams that use it have
        // finished (above), and it is freed once, here.
        ctx.record_err(unsafe { result::free_sync(self.base) });
    }
}

/// The gate words of a rank in use: which slot each queued call holds, and the generation it
/// waits for (pure bookkeeping, tested on the CPU).
#[derive(Debug)]
pub struct Slots {
    generation: Vec<u32>,
    busy: Vec<bool>,
    next: usize,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            generation: vec![0; GATE_WORDS],
            busy: vec![false; GATE_WORDS],
            next: 0,
        }
    }
}

impl Slots {
    /// A free slot and the generation to wait for there, or `None` when every slot is in use.
    pub fn take(&mut self) -> Option<(usize, u32)> {
        for k in 0..GATE_WORDS {
            let slot = (self.next + k) % GATE_WORDS;
            // A word at the largest generation is retired: a wrapped generation would find
            // the gate already open.
            if !self.busy[slot] && self.generation[slot] < u32::MAX {
                self.busy[slot] = true;
                self.generation[slot] += 1;
                self.next = slot + 1;
                return Some((slot, self.generation[slot]));
            }
        }
        None
    }

    /// Gives `slot` back once its gate-opening write is enqueued.
    pub fn give_back(&mut self, slot: usize) {
        if let Some(b) = self.busy.get_mut(slot) {
            *b = false;
        }
    }

    /// Slots in use.
    #[cfg(test)]
    pub fn in_use(&self) -> usize {
        self.busy.iter().filter(|&&b| b).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cycle_with_growing_generations_and_run_out() {
        let mut s = Slots::default();
        let (a, ga) = s.take().unwrap();
        let (b, gb) = s.take().unwrap();
        assert_ne!(a, b);
        assert_eq!((ga, gb), (1, 1));
        s.give_back(a);
        assert_eq!(s.in_use(), 1);
        let mut seen = Vec::new();
        while let Some(x) = s.take() {
            seen.push(x);
        }
        // Every slot but `b` came out once more; `a` again with a later generation.
        assert_eq!(seen.len(), GATE_WORDS - 1);
        assert!(seen.contains(&(a, 2)));
        assert_eq!(s.in_use(), GATE_WORDS);
        s.give_back(b);
        assert_eq!(s.take(), Some((b, 2)));
    }

    #[test]
    fn a_word_is_retired_before_its_generation_wraps() {
        let mut s = Slots::default();
        s.generation[0] = u32::MAX - 1;
        assert_eq!(s.take(), Some((0, u32::MAX)));
        s.give_back(0);
        // Slot 0 is never handed out again.
        s.next = 0;
        assert_eq!(s.take(), Some((1, 1)));
    }
}
