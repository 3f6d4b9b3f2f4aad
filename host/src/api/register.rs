//! `Communicator::register`: a typed buffer registered for the peers to read in place (the
//! collective exchange itself is `comm::register`).

use super::DeviceSlice;
use crate::comm::Registered;
use crate::{Arg, Communicator, Error, Result};

impl Communicator {
    /// Registers `buf` so that the peers of this rank read it in place (collective, like
    /// NCCL's `ncclCommWindowRegister`: every rank registers one buffer at the same point, in
    /// the same order, and drops or deregisters its registrations in the same order).
    ///
    /// The buffer's whole allocation is mapped into every peer process once (CUDA IPC), so a
    /// later call whose input lies anywhere inside it is zero-copy. What gives zero-copy today:
    /// the input of a one-shot all-reduce among processes, fp8 averages excepted
    /// ([`Config::zero_copy_reads`](crate::Config::zero_copy_reads)), and a point-to-point
    /// receive of more than 64 KiB on the point-to-point kernel (eager at most
    /// [`Config::p2p_kernel_max_bytes_registered`](crate::Config::p2p_kernel_max_bytes_registered)), which
    /// the sender writes directly (other collectives, and the other outputs, are staged
    /// through the scratch as before). While any buffer is registered, such point-to-point
    /// transfers start with the receiver telling the sender where to write (one one-way trip,
    /// also for an unregistered receive buffer). The ranks need not agree on which buffers are
    /// registered. Memory CUDA IPC cannot export (stream-ordered pools, VMM allocations) stays
    /// unregistered, with a logged reason: the calls work, staged ([`Registered::zero_copy`]).
    /// cudarc's `CudaStream::alloc_zeros` (as in the example below) takes its memory from the
    /// stream-ordered pool wherever the device has one (`cuMemAllocAsync`), so for zero-copy
    /// register memory of `cuMemAlloc` (PyTorch's caching allocator, `ncclMemAlloc`, or
    /// `cudarc::driver::result::malloc_sync` wrapped with `CudaStream::upgrade_device_ptr`).
    /// A freed and re-allocated range is noticed (the allocation's buffer id) and staged. In a
    /// communicator of one process this does nothing: its kernels read the buffers directly.
    ///
    /// Under CUDA-graph capture: a buffer registered before the capture is used zero-copy by
    /// the captured call; once a call was captured, deregistering keeps the peers' mappings
    /// until the communicator's resources are released (after its last graph); the buffer
    /// itself must outlive the graphs, as with any captured buffer. Buffers are not registered
    /// automatically at capture.
    ///
    /// ```no_run
    /// # fn main() -> ringccl::Result<()> {
    /// use ringccl::{Communicator, Io, RedOp};
    /// # let (comm, stream): (Communicator, std::sync::Arc<cudarc::driver::CudaStream>) = todo!();
    /// let mut buf = stream.alloc_zeros::<f32>(1 << 16).unwrap();
    /// let reg = comm.register(&buf)?; // every rank, same order
    /// comm.all_reduce(&mut [Io::in_place(&mut buf)], 1 << 16, RedOp::Sum, &[&stream])?;
    /// reg.deregister()?; // every rank, same order
    /// # Ok(()) }
    /// ```
    pub fn register<T, B: DeviceSlice<T> + ?Sized>(&self, buf: &B) -> Result<Registered<'_>> {
        let raw = buf.raw();
        let bytes = raw.len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::invalid(None, Arg::Send, format!("{} elements overflow", raw.len))
        })?;
        let id = self.register_bytes(raw.ptr, bytes)?;
        Ok(Registered::new(self, id))
    }
}
