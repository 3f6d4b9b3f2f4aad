//! NCCL, for comparison: one communicator per rank of one process (`ncclCommInitAll`), or one
//! rank per process (`ncclCommInitRank`), driven through cudarc's raw `result` layer on the
//! same buffers and streams as ringccl.
//!
//! The raw layer is used rather than `cudarc::nccl::Comm` because `Comm`'s calls take their
//! counts from buffer lengths (no in-place all-gather/reduce-scatter at an offset) and its
//! `Drop` panics when the abort fails; [`Nccl`] destroys its communicators quietly.

use std::ffi::c_void;

use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};
use ringccl::{CollectiveKind, RedOp};

use super::coll::Shape;

/// An NCCL error as text (cudarc's `NcclError` has no `Display` and its `Debug` hides the code).
pub fn err_text(e: result::NcclError) -> String {
    format!("{:?}", e.0)
}

/// NCCL's version as `major.minor.patch` and its number, if the library loads.
pub fn version() -> Option<(String, i32)> {
    // SAFETY: only probes whether the library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    let v = result::get_nccl_version().ok()?;
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    let (major, minor, patch) = if v >= 10000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    };
    Some((format!("{major}.{minor}.{patch}"), v))
}

/// One NCCL communicator per rank of this process.
pub struct Nccl {
    comms: Vec<sys::ncclComm_t>,
    /// The rank of each communicator.
    ranks: Vec<usize>,
    /// The ranks of the world (in every process).
    nranks: usize,
}

/// Whether libnccl.so can be loaded (cudarc panics on a call otherwise).
pub fn check_loaded() -> Result<(), String> {
    // SAFETY: only probes whether the library can be loaded.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err("the NCCL library (libnccl.so) was not found".into())
    }
}

/// A new NCCL unique id (`ncclGetUniqueId`), as bytes.
pub fn unique_id() -> Result<[u8; 128], String> {
    check_loaded()?;
    let id = result::get_uniqueid()
        .map_err(|e| format!("ncclGetUniqueId failed with {}", err_text(e)))?;
    Ok(id.internal.map(|c| c as u8))
}

impl Nccl {
    /// Communicators over the devices `ordinals` (rank `r` on `ordinals[r]`).
    pub fn new(ordinals: &[usize]) -> Result<Nccl, String> {
        check_loaded()?;
        let devs: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for one communicator per device in `devs`.
        unsafe { result::comm_init_all(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr()) }
            .map_err(|e| format!("ncclCommInitAll failed with {}", err_text(e)))?;
        Ok(Nccl {
            comms,
            ranks: (0..devs.len()).collect(),
            nranks: devs.len(),
        })
    }

    /// This process's communicator: rank `rank` of `nranks`, on the device of `ctx` (made
    /// current on this thread), joined with the id rank 0 made ([`unique_id`]). Returns once
    /// every rank has joined.
    pub fn init_rank(
        id: &[u8; 128],
        nranks: usize,
        rank: usize,
        ctx: &cudarc::driver::CudaContext,
    ) -> Result<Nccl, String> {
        check_loaded()?;
        ctx.bind_to_thread()
            .map_err(|e| format!("cuCtxSetCurrent failed with {:?}", e.0))?;
        let (n, r) = match (i32::try_from(nranks), i32::try_from(rank)) {
            (Ok(n), Ok(r)) => (n, r),
            _ => return Err(format!("rank {rank} of {nranks}: too many ranks for NCCL")),
        };
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` receives one communicator; the device is the current context's.
        unsafe { result::comm_init_rank(&mut comm, n, id, r) }
            .map_err(|e| format!("ncclCommInitRank failed with {}", err_text(e)))?;
        Ok(Nccl {
            comms: vec![comm],
            ranks: vec![rank],
            nranks,
        })
    }

    /// Enqueues one collective on every rank of this process inside one NCCL group.
    /// `send[i]`/`recv[i]` are the device addresses of the buffers of this process's `i`-th
    /// rank (equal, or at NCCL's in-place offset, for an in-place call); `streams[i]` its
    /// stream.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        kind: CollectiveKind,
        shape: &Shape,
        dtype: sys::ncclDataType_t,
        elt: usize,
        op: RedOp,
        root: usize,
        send: &[u64],
        recv: &[u64],
        streams: &[&CudaStream],
    ) -> Result<(), String> {
        result::group_start().map_err(|e| format!("ncclGroupStart: {}", err_text(e)))?;
        let mut first_err = None;
        for (i, (&comm, &r)) in self.comms.iter().zip(&self.ranks).enumerate() {
            let (Some(&sp), Some(&rp), Some(&st)) = (send.get(i), recv.get(i), streams.get(i))
            else {
                first_err = Some(format!("rank {r}: no buffers or stream given"));
                break;
            };
            if let Err(e) = self.one(kind, shape, dtype, elt, op, root, r, sp, rp, comm, st) {
                first_err = Some(format!("rank {r}: {e}"));
                break;
            }
        }
        let end = result::group_end().map_err(|e| format!("ncclGroupEnd: {}", err_text(e)));
        match first_err {
            Some(e) => Err(e),
            None => end.map(|_| ()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn one(
        &self,
        kind: CollectiveKind,
        shape: &Shape,
        dtype: sys::ncclDataType_t,
        elt: usize,
        op: RedOp,
        root: usize,
        rank: usize,
        send: u64,
        recv: u64,
        comm: sys::ncclComm_t,
        stream: &CudaStream,
    ) -> Result<(), String> {
        let s = stream.cu_stream() as sys::cudaStream_t;
        let sp = send as *const c_void;
        let rp = recv as *mut c_void;
        let red = match op {
            RedOp::Sum => sys::ncclRedOp_t::ncclSum,
            RedOp::Prod => sys::ncclRedOp_t::ncclProd,
            RedOp::Min => sys::ncclRedOp_t::ncclMin,
            RedOp::Max => sys::ncclRedOp_t::ncclMax,
            RedOp::Avg => sys::ncclRedOp_t::ncclAvg,
        };
        let root = root as i32;
        let c = shape.count;
        // SAFETY: the addresses are device buffers of this rank, large enough for `shape`
        // (allocated by the caller for the largest size); the stream belongs to the rank's
        // device; the communicator is alive.
        let res = unsafe {
            use CollectiveKind as K;
            match kind {
                K::AllReduce => result::all_reduce(sp, rp, c, dtype, red, comm, s),
                K::ReduceScatter => result::reduce_scatter(sp, rp, c, dtype, red, comm, s),
                K::AllGather => result::all_gather(sp, rp, c, dtype, comm, s),
                K::Broadcast => result::broadcast(sp, rp, c, dtype, root, comm, s),
                K::Reduce => result::reduce(sp, rp, c, dtype, red, root, comm, s),
                K::Gather | K::Scatter => {
                    return Err(format!("ringccl-perf does not measure {kind} with NCCL"));
                }
                K::SendRecv => {
                    // As nccl-tests' sendrecv_perf: to the next rank, from the previous one,
                    // inside the caller's group.
                    let n = self.nranks;
                    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
                    result::send(sp, c, dtype, next as i32, comm, s)
                        .and_then(|_| result::recv(rp, c, dtype, prev as i32, comm, s))
                }
                K::AllToAll => {
                    // As nccl-tests: one send and one receive per peer, in the group.
                    let block = (c * elt) as u64;
                    let mut res = Ok(result::NcclStatus::Success);
                    for peer in 0..self.nranks {
                        let off = peer as u64 * block;
                        res = result::send(
                            (send + off) as *const c_void,
                            c,
                            dtype,
                            peer as i32,
                            comm,
                            s,
                        )
                        .and_then(|_| {
                            result::recv(
                                (recv + off) as *mut c_void,
                                c,
                                dtype,
                                peer as i32,
                                comm,
                                s,
                            )
                        });
                        if res.is_err() {
                            break;
                        }
                    }
                    res
                }
            }
        };
        res.map(|_| ()).map_err(err_text)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        for &c in &self.comms {
            // SAFETY: each communicator was created by `comm_init_all` or `comm_init_rank` and
            // is destroyed once; the caller synchronises the streams before dropping. Errors
            // are ignored.
            let _ = unsafe { result::comm_destroy(c) };
        }
    }
}
