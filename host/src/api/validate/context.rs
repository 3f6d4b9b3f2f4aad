//! The checks of a call's streams and buffers that ask the driver (the rest of [`super`] is pure):
//! a stream must belong to the context the communicator uses on its rank's device (the primary
//! context), a buffer must belong to that context too, and a buffer from a memory pool must be
//! accessible from every peer device that reads or writes it directly. A device ordinal alone
//! does not say this: a stream of a non-primary context, a buffer of another context or from a
//! pool without peer access passes the ordinal checks and faults on the GPU. Each is rejected
//! with [`Error::InvalidArgument`] before anything is enqueued.
//!
//! The driver is asked only what it answers in a few hundred nanoseconds (`cuStreamGetCtx`,
//! one `cuPointerGetAttributes` per buffer, `cuMemPoolGetAccess` per peer for memory of a pool
//! other than the device's pool that ringccl granted its peers access to at creation), and
//! only positive evidence rejects: memory the driver does not describe (virtual memory
//! management mappings, registered host memory) is left to the ordinal checks.

use cudarc::driver::{sys, CudaContext, CudaStream};

use super::Ptrs;
use crate::per_rank::PerRank;
use crate::{Arg, Error, Result};

/// What one rank's context check needs: its context, and the device ordinals of the ranks whose
/// kernels read or write its buffers directly (none when peers reach it through staging or
/// scratch).
pub(crate) struct RankCtx<'a> {
    /// The rank (labels errors).
    pub rank: usize,
    /// The communicator's context on the rank's device.
    pub ctx: &'a CudaContext,
    /// Devices of the peers that access this rank's buffers directly.
    pub peer_devices: PerRank<usize>,
    /// The device's pool that ringccl granted those peers access to (0: none).
    pub granted_pool: usize,
}

/// Checks every rank's stream and buffers against its context (see the module docs).
pub(crate) fn check_contexts<S: AsRef<CudaStream>>(
    ranks: &[RankCtx<'_>],
    ptrs: &[Ptrs],
    streams: &[S],
) -> Result<()> {
    for ((rc, p), stream) in ranks.iter().zip(ptrs).zip(streams) {
        check_stream(rc, stream.as_ref())?;
        if p.send != 0 {
            check_buffer(rc, p.send, Arg::Send)?;
        }
        // In place, the receive buffer is the send buffer: asked once.
        if p.recv != 0 && p.recv != p.send {
            check_buffer(rc, p.recv, Arg::Recv)?;
        }
    }
    Ok(())
}

/// [`check_contexts`] for buffers given as `(rank index, address, argument)`: every rank's
/// stream, then each buffer against its rank's context (send/recv groups).
pub(crate) fn check_buffers<S: AsRef<CudaStream>>(
    ranks: &[RankCtx<'_>],
    bufs: &[(usize, u64, Arg)],
    streams: &[S],
) -> Result<()> {
    for (rc, stream) in ranks.iter().zip(streams) {
        check_stream(rc, stream.as_ref())?;
    }
    for &(i, addr, arg) in bufs {
        if let (Some(rc), true) = (ranks.get(i), addr != 0) {
            check_buffer(rc, addr, arg)?;
        }
    }
    Ok(())
}

fn check_stream(rc: &RankCtx<'_>, stream: &CudaStream) -> Result<()> {
    let raw = stream.cu_stream();
    if raw.is_null() {
        // The legacy default stream belongs to whichever context is current: its device was
        // checked by ordinal.
        return Ok(());
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `raw` is a live stream (borrowed from the caller); `ctx` is a valid out-pointer.
    let r = unsafe { sys::cuStreamGetCtx(raw, &mut ctx) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(query_failed("cuStreamGetCtx", r, rc.rank, Arg::Stream));
    }
    if !ctx.is_null() && ctx != rc.ctx.cu_ctx() {
        return Err(Error::invalid(
            Some(rc.rank),
            Arg::Stream,
            "the stream belongs to another CUDA context than the one ringccl uses on this \
             device (the primary context): create it from Communicator::context(rank)",
        ));
    }
    Ok(())
}

fn check_buffer(rc: &RankCtx<'_>, addr: u64, arg: Arg) -> Result<()> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut ordinal: std::ffi::c_int = -1;
    let mut attrs = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ];
    let mut data: [*mut std::ffi::c_void; 3] = [
        (&mut ctx as *mut sys::CUcontext).cast(),
        (&mut pool as *mut sys::CUmemoryPool).cast(),
        (&mut ordinal as *mut std::ffi::c_int).cast(),
    ];
    // SAFETY: three attributes with one out-pointer each, of the attribute's type; an address
    // the driver does not know gets default values, not an error.
    let r = unsafe { sys::cuPointerGetAttributes(3, attrs.as_mut_ptr(), data.as_mut_ptr(), addr) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(query_failed("cuPointerGetAttributes", r, rc.rank, arg));
    }
    // Pool memory belongs to the pool, not to a context: its access is what matters.
    if !pool.is_null() && pool as usize != rc.granted_pool {
        check_pool(rc, pool, arg)?;
    }
    if pool.is_null() && !ctx.is_null() && ctx != rc.ctx.cu_ctx() {
        return Err(Error::invalid(
            Some(rc.rank),
            arg,
            "the buffer was allocated in another CUDA context than the one ringccl uses on this \
             device (the primary context): allocate it with a stream of Communicator::context(rank)",
        ));
    }
    if ordinal >= 0 && usize::try_from(ordinal).ok() != Some(rc.ctx.ordinal()) {
        return Err(Error::invalid(
            Some(rc.rank),
            arg,
            format!(
                "the buffer is memory of device {ordinal}, not of this rank's device {}",
                rc.ctx.ordinal()
            ),
        ));
    }
    Ok(())
}

/// Every peer device that touches this rank's buffers directly can read and write `pool`.
fn check_pool(rc: &RankCtx<'_>, pool: sys::CUmemoryPool, arg: Arg) -> Result<()> {
    for &peer in &rc.peer_devices {
        let mut flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        let mut loc = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: i32::try_from(peer).unwrap_or(i32::MAX),
        };
        // SAFETY: `pool` is the live pool the driver just named for a live buffer; `flags` and
        // `loc` are valid pointers.
        let r = unsafe { sys::cuMemPoolGetAccess(&mut flags, pool, &mut loc) };
        if r != sys::CUresult::CUDA_SUCCESS
            || flags != sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        {
            return Err(Error::invalid(
                Some(rc.rank),
                arg,
                format!(
                    "the buffer comes from a memory pool that device {peer} (a peer that reads \
                     or writes it) cannot access: grant it with cuMemPoolSetAccess, or allocate \
                     from the device's default pool"
                ),
            ));
        }
    }
    Ok(())
}

/// A driver query that failed: a bad handle is the caller's argument; anything else (a context
/// that faulted earlier: its errors are sticky) is the rank's CUDA error.
fn query_failed(call: &'static str, r: sys::CUresult, rank: usize, arg: Arg) -> Error {
    match r {
        sys::CUresult::CUDA_ERROR_INVALID_VALUE | sys::CUresult::CUDA_ERROR_INVALID_HANDLE => {
            Error::invalid(
                Some(rank),
                arg,
                format!("the driver does not know it ({call}: {r:?})"),
            )
        }
        _ => Error::Cuda {
            call,
            code: format!("{r:?}"),
            rank: Some(rank),
        },
    }
}

/// The [`RankCtx`] of every rank `comm` holds, in [`Communicator::local_ranks`] order.
///
/// [`Communicator::local_ranks`]: crate::Communicator::local_ranks
pub(crate) fn rank_contexts(comm: &crate::Communicator) -> PerRank<RankCtx<'_>> {
    let local = comm.local_ranks();
    let single_process = local.len() == comm.nranks();
    local
        .iter()
        .map(|&r| RankCtx {
            rank: r,
            ctx: comm.context(r),
            granted_pool: comm.resources(r).granted_pool,
            // Ranks of other processes reach this rank only in its scratch.
            peer_devices: if single_process {
                local
                    .iter()
                    .filter(|&&q| q != r && comm.peer_access(q, r))
                    .map(|&q| comm.ordinal(q))
                    .collect()
            } else {
                PerRank::new()
            },
        })
        .collect()
}
