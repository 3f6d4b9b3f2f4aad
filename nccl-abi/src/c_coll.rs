//! The C entry points for groups (`ncclGroupStart`/`End`), collectives and point-to-point
//! transfers (`ncclSend`/`ncclRecv`). Each checks its C arguments and queues the call through
//! [`crate::coll`] and [`crate::group`] inside [`guard`].

use std::ffi::{c_int, c_void};

use crate::coll::{CollCall, Kind, P2pCall};
use crate::comm::Handle;
use crate::cuda::KeepContext;
use crate::error::{guard, Fail, Result};
use crate::types::*;
use crate::{coll, group, ops, types};
use crate::{cudaStream_t, index, ncclComm_t};

// ---------------------------------------------------------------------------------------------
// Groups.

/// `ncclGroupStart`.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclGroupStart(), 0);
/// assert_eq!(ncclGroupEnd(), 0); // an empty group issues nothing
/// ```
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    guard("ncclGroupStart", || {
        group::start();
        Ok(())
    })
}

/// `ncclGroupEnd`: at the outermost level, waits for the blocking initialisations started in
/// the group, then issues the group's calls; if a call inside the group failed, nothing of
/// the group is issued and that first error is returned, as in NCCL.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclGroupEnd(), 5); // no group is open
/// ```
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclGroupEnd", coll::group_end)
}

/// `ncclGroupSimulateEnd`: with NULL, [`ncclGroupEnd`] (as NCCL). Otherwise the group ends as
/// NCCL's simulation ends it (the thread leaves the group; none of the group's calls is
/// issued), but ringccl has no cost model to fill in `estimatedTime`: the outermost call
/// returns `ncclInvalidUsage` (`ncclInvalidArgument` for a `simInfo` without
/// `NCCL_SIM_INFO_INITIALIZER`'s magic). An inner level returns `ncclSuccess`, as in NCCL.
///
/// # Safety
///
/// `sim_info` is NULL or points to an `ncclSimInfo_t` (at least its `size` field, and as many
/// bytes as it says, up to the struct's size).
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut sim = types::ncclSimInfo_t { size: 24, magic: 0x74685283, version: 22809, estimated_time: -1.0 };
/// assert_eq!(ncclGroupStart(), 0);
/// // SAFETY: a valid ncclSimInfo_t.
/// assert_eq!(unsafe { ncclGroupSimulateEnd(&mut sim) }, 5); // no cost model
/// assert_eq!(ncclGroupEnd(), 5); // the group did end: no group is open
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclGroupSimulateEnd(sim_info: *mut ncclSimInfo_t) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclGroupSimulateEnd", || {
        if sim_info.is_null() {
            return coll::group_end();
        }
        // SAFETY: the caller's contract: `size` comes first; `magic` is read only when the
        // caller's struct holds it.
        let valid = unsafe {
            let size = std::ptr::addr_of!((*sim_info).size).read_unaligned();
            size >= std::mem::offset_of!(ncclSimInfo_t, version)
                && std::ptr::addr_of!((*sim_info).magic).read_unaligned() == 0x7468_5283
        };
        coll::group_simulate_end(valid)
    })
}

// ---------------------------------------------------------------------------------------------
// Collectives and point-to-point.

/// One rank's collective call, as C passed it.
struct Args {
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    /// The operator (ignored by the collectives that do not reduce).
    op: ncclRedOp_t,
    /// The root (ignored by the collectives without one).
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
}

/// The body of every collective entry point: checks the call and queues it, inside [`guard`];
/// a failure inside a group also fails the group (NCCL's `ncclGroupErrCheck`).
fn run(function: &str, a: Args) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard(function, || collective(a).map_err(group::note_error))
}

/// Checks one rank's collective call and queues it.
fn collective(a: Args) -> Result<()> {
    let Args {
        kind,
        send,
        recv,
        count,
        datatype,
        op,
        root,
        comm,
        stream,
    } = a;
    let h = Handle::from_ptr(comm)?;
    let m = h.member()?;
    let dtype = types::data_type(datatype).map_err(Fail::arg)?;
    let reduces = matches!(kind, Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter);
    let (op, premul) = if reduces {
        // Built-ins, or an operator created on this communicator for this datatype; anything
        // else is refused here, before anything is queued.
        let resolved = h.ops().resolve(op, datatype)?;
        let premul = ops::premul_for(&resolved)?;
        match resolved {
            ops::Resolved::Builtin(r) => (r, premul),
            ops::Resolved::PreMul(_) => (ringccl::RedOp::Sum, premul),
        }
    } else {
        (ringccl::RedOp::Sum, None)
    };
    let n = m.world.comm.nranks();
    let root = if kind.rooted() {
        index(root, n, "root")?
    } else {
        0
    };
    if count > 0 {
        let is_root = m.rank == root;
        let (needs_send, needs_recv) = match kind {
            Kind::AllReduce | Kind::AllGather | Kind::ReduceScatter | Kind::AllToAll => {
                (true, true)
            }
            Kind::Broadcast | Kind::Scatter => (is_root, true),
            Kind::Reduce | Kind::Gather => (true, is_root),
        };
        if needs_send && send.is_null() {
            return Err(Fail::arg(format!("sendbuff is NULL on rank {}", m.rank)));
        }
        if needs_recv && recv.is_null() {
            return Err(Fail::arg(format!("recvbuff is NULL on rank {}", m.rank)));
        }
    }
    let call = CollCall {
        kind,
        count,
        dtype,
        op,
        premul,
        root,
        send: send as u64,
        recv: recv as u64,
        stream: stream as usize,
    };
    coll::submit(&m, call)
}

/// `ncclAllReduce`.
///
/// # Safety
///
/// nccl.h's contract: device buffers of `count` elements on the communicator's device, a
/// stream of that device.
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     // 1024 floats summed over the ranks, in place, on the legacy default stream.
///     assert_eq!(ncclAllReduce(buf, buf, 1024, 7, 0, comm, null_mut()), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclAllReduce",
        Args {
            kind: Kind::AllReduce,
            send: sendbuff,
            recv: recvbuff,
            count,
            datatype,
            op,
            root: 0,
            comm,
            stream,
        },
    )
}

/// `ncclBroadcast`.
///
/// # Safety
///
/// As [`ncclAllReduce`] (`sendbuff` is read on the root only).
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     assert_eq!(ncclBroadcast(buf, buf, 1024, 7, 0, comm, null_mut()), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclBroadcast",
        Args {
            kind: Kind::Broadcast,
            send: sendbuff,
            recv: recvbuff,
            count,
            datatype,
            op: 0,
            root,
            comm,
            stream,
        },
    )
}

/// `ncclBcast`: [`ncclBroadcast`] in place.
///
/// # Safety
///
/// As [`ncclAllReduce`].
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     assert_eq!(ncclBcast(buf, 1024, 7, 0, comm, null_mut()), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclBcast",
        Args {
            kind: Kind::Broadcast,
            send: buff,
            recv: buff,
            count,
            datatype,
            op: 0,
            root,
            comm,
            stream,
        },
    )
}

/// `ncclReduce`.
///
/// # Safety
///
/// As [`ncclAllReduce`] (`recvbuff` is written on the root only).
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     assert_eq!(ncclReduce(buf, buf, 1024, 7, 2, 0, comm, null_mut()), 0); // ncclMax to rank 0
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclReduce",
        Args {
            kind: Kind::Reduce,
            send: sendbuff,
            recv: recvbuff,
            count,
            datatype,
            op,
            root,
            comm,
            stream,
        },
    )
}

/// `ncclAllGather`: `recvbuff` holds `nranks * sendcount` elements; in place when
/// `sendbuff == recvbuff + rank * sendcount`.
///
/// # Safety
///
/// As [`ncclAllReduce`].
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     assert_eq!(ncclAllGather(buf, buf, 1024, 7, comm, null_mut()), 0); // in place, rank 0
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclAllGather",
        Args {
            kind: Kind::AllGather,
            send: sendbuff,
            recv: recvbuff,
            count: sendcount,
            datatype,
            op: 0,
            root: 0,
            comm,
            stream,
        },
    )
}

/// `ncclReduceScatter`: `sendbuff` holds `nranks * recvcount` elements; in place when
/// `recvbuff == sendbuff + rank * recvcount`.
///
/// # Safety
///
/// As [`ncclAllReduce`].
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     assert_eq!(ncclReduceScatter(buf, buf, 1024, 7, 0, comm, null_mut()), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclReduceScatter",
        Args {
            kind: Kind::ReduceScatter,
            send: sendbuff,
            recv: recvbuff,
            count: recvcount,
            datatype,
            op,
            root: 0,
            comm,
            stream,
        },
    )
}

/// `ncclAlltoAll`: both buffers hold `nranks * count` elements.
///
/// # Safety
///
/// As [`ncclAllReduce`].
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     let mut out = null_mut();
///     assert_eq!(ncclMemAlloc(&mut out, 4096), 0);
///     assert_eq!(ncclAlltoAll(buf, out, 1024, 7, comm, null_mut()), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclAlltoAll",
        Args {
            kind: Kind::AllToAll,
            send: sendbuff,
            recv: recvbuff,
            count,
            datatype,
            op: 0,
            root: 0,
            comm,
            stream,
        },
    )
}

/// `ncclGather`: the root's `recvbuff` holds `nranks * count` elements.
///
/// # Safety
///
/// As [`ncclAllReduce`].
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     assert_eq!(ncclGather(buf, buf, 1024, 7, 0, comm, null_mut()), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclGather",
        Args {
            kind: Kind::Gather,
            send: sendbuff,
            recv: recvbuff,
            count,
            datatype,
            op: 0,
            root,
            comm,
            stream,
        },
    )
}

/// `ncclScatter`: the root's `sendbuff` holds `nranks * count` elements.
///
/// # Safety
///
/// As [`ncclAllReduce`].
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     assert_eq!(ncclScatter(buf, buf, 1024, 7, 0, comm, null_mut()), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    run(
        "ncclScatter",
        Args {
            kind: Kind::Scatter,
            send: sendbuff,
            recv: recvbuff,
            count,
            datatype,
            op: 0,
            root,
            comm,
            stream,
        },
    )
}

/// Checks one rank's send or receive and queues it.
fn point_to_point(
    send: bool,
    buf: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let m = Handle::from_ptr(comm)?.member()?;
    let dtype = types::data_type(datatype).map_err(Fail::arg)?;
    let peer = index(peer, m.world.comm.nranks(), "peer")?;
    if count > 0 && buf.is_null() {
        return Err(Fail::arg(format!(
            "{} is NULL on rank {}",
            if send { "sendbuff" } else { "recvbuff" },
            m.rank
        )));
    }
    let call = P2pCall {
        send,
        rank: m.rank,
        peer,
        count,
        dtype,
        buf: buf as u64,
        stream: stream as usize,
    };
    coll::submit_p2p(&m, call)
}

/// `ncclSend`: matched with the peer's `ncclRecv` (ranks of one process, inside one group).
///
/// # Safety
///
/// As [`ncclAllReduce`].
///
/// ```no_run
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let (mut comm, mut id) = (null_mut(), types::ncclUniqueId { internal: [0; 128] });
/// let mut buf = null_mut();
/// // SAFETY: valid out-pointers; `buf` is 4 KiB of device memory on the current device.
/// unsafe {
///     assert_eq!(ncclGetUniqueId(&mut id), 0);
///     assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), 0); // a communicator of one rank
///     assert_eq!(ncclMemAlloc(&mut buf, 4096), 0);
///     // A rank sending to itself: both sides in one group.
///     assert_eq!(ncclGroupStart(), 0);
///     assert_eq!(ncclSend(buf, 512, 7, 0, comm, null_mut()), 0);
///     assert_eq!(ncclRecv(buf.cast::<u8>().add(2048).cast(), 512, 7, 0, comm, null_mut()), 0);
///     assert_eq!(ncclGroupEnd(), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclSend", || {
        point_to_point(true, sendbuff, count, datatype, peer, comm, stream)
            .map_err(group::note_error)
    })
}

/// `ncclRecv`: matched with the peer's `ncclSend`.
///
/// # Safety
///
/// As [`ncclAllReduce`].
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut b = [0f32; 4];
/// // SAFETY: a NULL communicator is refused before anything is read.
/// assert_eq!(unsafe { ncclRecv(b.as_mut_ptr().cast(), 4, 7, 0, null_mut(), null_mut()) }, 4);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclRecv", || {
        point_to_point(false, recvbuff, count, datatype, peer, comm, stream)
            .map_err(group::note_error)
    })
}
