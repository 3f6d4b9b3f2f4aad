//! The C entry points for communicators: creation (`ncclCommInitRank*`, `ncclCommInitAll`,
//! `ncclCommSplit` and the others of `c_split`), teardown (`ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`),
//! queries, buffer registration and memory (`ncclMemAlloc`), and reduction operators. Each
//! checks its C arguments and calls [`crate::comm`] inside [`guard`].

use std::ffi::{c_int, c_void};

use ringccl::{Communicator, UniqueId};

use crate::comm::{Handle, Member, World};
use crate::cuda::KeepContext;
use crate::error::{guard, Fail, Result};
use crate::types::*;
use crate::{blocking, index, ncclComm_t, ncclWindow_t, put};
use crate::{cuda, debug, group, ops, regs};

/// The shared part of `ncclCommInitRank*`.
///
/// # Safety
///
/// `out` NULL or valid to write; `config` as for [`blocking`].
pub(crate) unsafe fn init_rank(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    config: *const ncclConfig_t,
) -> Result<()> {
    // SAFETY: the caller's contract. A failure inside a group fails the group, as in NCCL.
    unsafe { init_rank_inner(out, nranks, id, rank, config) }.map_err(group::note_error)
}

/// [`init_rank`]'s body.
///
/// # Safety
///
/// As [`init_rank`].
unsafe fn init_rank_inner(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    config: *const ncclConfig_t,
) -> Result<()> {
    if out.is_null() {
        return Err(Fail::arg("comm is NULL"));
    }
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| Fail::arg(format!("nranks {nranks} must be at least 1")))?;
    let rank = index(rank, n, "rank")?;
    // SAFETY: the caller's contract.
    let blocking = unsafe { blocking(config) }?;
    let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
    let id = UniqueId::from_bytes(&bytes)
        .map_err(|e| Fail::arg(format!("commId is not an id from ncclGetUniqueId: {e}")))?;
    let device = cuda::current_device()?;
    debug::banner();
    debug::info(|| format!("ncclCommInitRank: rank {rank} of {n} on device {device}"));
    // SAFETY: checked non-null; the caller's contract.
    unsafe {
        start_member(out, blocking, format!("ringccl-init-{rank}"), move || {
            Communicator::init_rank(n, &id, rank, device).map_err(Fail::from)
        })
    }
}

/// Builds this rank's member of a new communicator (`build`, with a CUDA context kept
/// current) as the caller asked, and writes its handle to `out`: now (blocking, outside a
/// group), else in a thread of its own named `thread` (`ncclInProgress` for a non-blocking
/// config; at `ncclGroupEnd` in a group: several ranks of one world may be initialised from
/// one thread, as in NCCL). The member's rank is the communicator's first local rank.
///
/// # Safety
///
/// `out` is valid to write.
pub(crate) unsafe fn start_member(
    out: *mut ncclComm_t,
    blocking: bool,
    thread: String,
    build: impl FnOnce() -> Result<Communicator> + Send + 'static,
) -> Result<()> {
    let job = move || -> Result<Member> {
        let _keep = KeepContext::new();
        let comm = build()?;
        let rank = comm.local_ranks().first().copied().unwrap_or(0);
        Ok(Member {
            world: World::new(comm),
            rank,
            index: 0,
        })
    };
    if blocking && group::depth() == 0 {
        let m = job()?;
        // SAFETY: the caller's contract.
        unsafe { out.write(Handle::ready(m)) };
        return Ok(());
    }
    let thread = std::thread::Builder::new()
        .name(thread)
        .spawn(job)
        .map_err(|e| Fail::new(NCCL_SYSTEM_ERROR, format!("cannot start a thread: {e}")))?;
    let h = Handle::initializing(thread, blocking);
    // SAFETY: the caller's contract.
    unsafe { out.write(h) };
    if blocking {
        group::init_started(Handle::from_ptr(h)?);
        Ok(())
    } else {
        Err(Fail::new(NCCL_IN_PROGRESS, "initialising"))
    }
}

/// `ncclCommInitRank`: rank `rank` of `nranks` on the current CUDA device; returns once every
/// rank has joined (inside a group: at `ncclGroupEnd`).
///
/// # Safety
///
/// `comm` is NULL or valid to write.
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
///     let mut n = 0;
///     assert_eq!(ncclCommCount(comm, &mut n), 0);
///     assert_eq!(n, 1);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    // SAFETY: the caller's contract.
    guard("ncclCommInitRank", || unsafe {
        init_rank(comm, nranks, &comm_id, rank, std::ptr::null())
    })
}

/// `ncclCommInitRankConfig`: [`ncclCommInitRank`] with a config; `config.blocking = 0` makes
/// it return `ncclInProgress` at once (poll `ncclCommGetAsyncError`). Other fields are
/// accepted and ignored.
///
/// # Safety
///
/// `comm` is NULL or valid to write; `config` is NULL or an initialised `ncclConfig_t`.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let id = types::ncclUniqueId { internal: [0; 128] };
/// let mut comm = null_mut();
/// // SAFETY: all-zero bytes are a valid ncclConfig_t (integers and null pointers).
/// let mut config: types::ncclConfig_t = unsafe { std::mem::zeroed() };
/// // A config not made with NCCL_CONFIG_INITIALIZER (no magic) is refused before anything runs.
/// // SAFETY: valid pointers.
/// assert_eq!(unsafe { ncclCommInitRankConfig(&mut comm, 2, id, 0, &mut config) }, 4);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    comm_id: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    // SAFETY: the caller's contract.
    guard("ncclCommInitRankConfig", || unsafe {
        init_rank(comm, nranks, &comm_id, rank, config)
    })
}

/// `ncclCommInitAll`: one communicator of `ndev` ranks in this process, rank `i` on device
/// `devlist[i]` (or `i` when `devlist` is NULL); `comms[i]` is rank `i`.
///
/// # Safety
///
/// `comms` is NULL or valid for `ndev` writes; `devlist` is NULL or `ndev` ints.
///
/// ```no_run
/// use ringccl_nccl::*;
/// let mut comms = [std::ptr::null_mut(); 2];
/// // SAFETY: room for 2 handles; devices 0 and 1.
/// assert_eq!(unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, [0, 1].as_ptr()) }, 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclCommInitAll", || {
        if comms.is_null() {
            return Err(Fail::arg("comms is NULL"));
        }
        let n = usize::try_from(ndev)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| Fail::arg(format!("ndev {ndev} must be at least 1")))?;
        let ordinals: Vec<usize> = if devlist.is_null() {
            (0..n).collect()
        } else {
            // SAFETY: the caller passes `ndev` ints.
            let list = unsafe { std::slice::from_raw_parts(devlist, n) };
            list.iter()
                .map(|&d| usize::try_from(d).map_err(|_| Fail::arg(format!("devlist holds {d}"))))
                .collect::<Result<_>>()?
        };
        debug::banner();
        let world = World::new(Communicator::new(&ordinals).map_err(Fail::from)?);
        for rank in 0..n {
            let h = Handle::ready(Member {
                world: world.clone(),
                rank,
                index: rank,
            });
            // SAFETY: the caller passes room for `ndev` handles.
            unsafe { comms.add(rank).write(h) };
        }
        Ok(())
    })
}

/// `ncclCommRevoke`: not supported (`ncclInvalidUsage`); use `ncclCommAbort`.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommRevoke(null_mut(), 0), 5);
/// ```
#[no_mangle]
pub extern "C" fn ncclCommRevoke(comm: ncclComm_t, revoke_flags: c_int) -> ncclResult_t {
    let _ = (comm, revoke_flags);
    guard("ncclCommRevoke", || {
        Err(Fail::unsupported("ncclCommRevoke", "use ncclCommAbort"))
    })
}

/// `ncclCommFinalize`: waits for the communicator's work; afterwards only queries and
/// `ncclCommDestroy` are allowed. NULL is `ncclSuccess` and a second finalize
/// `ncclInvalidArgument`, as in NCCL (`src/init.cc`).
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
///     assert_eq!(ncclCommFinalize(comm), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    end_comm("ncclCommFinalize", comm, Handle::finalize)
}

/// `ncclCommDestroy`: releases this rank (the communicator is freed with its last rank, after
/// its last work ends). A later use of the handle is `ncclInvalidUsage`, a second destroy
/// `ncclInvalidArgument` (NCCL's "already destroyed"); NULL is `ncclSuccess`, as in NCCL
/// (`src/init.cc`).
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommDestroy(null_mut()), 0); // ncclSuccess: nothing to destroy
/// ```
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    end_comm("ncclCommDestroy", comm, Handle::destroy)
}

/// `ncclCommAbort`: cancels the communicator's pending and future work (ringccl's
/// `Communicator::abort`: device waits released, bounded by the timeout), then as
/// [`ncclCommDestroy`]. NULL is `ncclSuccess`, as in NCCL (PyTorch's watchdog aborts with
/// NULL); so is a handle aborted or destroyed already.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommAbort(null_mut()), 0);
/// ```
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    end_comm("ncclCommAbort", comm, Handle::abort)
}

/// The body of an entry that ends this rank of a communicator (`end`: finalize, destroy or
/// abort), with a CUDA context kept current; NULL is `ncclSuccess`, as in NCCL.
fn end_comm(function: &str, comm: ncclComm_t, end: fn(&Handle) -> Result<()>) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard(function, || {
        if comm.is_null() {
            return Ok(());
        }
        end(Handle::from_ptr(comm)?)
    })
}

/// `ncclCommGetAsyncError`: `ncclInProgress` while a non-blocking initialisation runs, its
/// error if it failed, the first failure of the communicator's work (a timeout, a device
/// fault, an abort: ringccl's `Communicator::async_error`), else `ncclSuccess`.
///
/// # Safety
///
/// `async_error` is NULL or valid to write.
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
///     let mut state = 0;
///     assert_eq!(ncclCommGetAsyncError(comm, &mut state), 0);
///     assert_eq!(state, 0); // ncclSuccess
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    async_error: *mut ncclResult_t,
) -> ncclResult_t {
    guard("ncclCommGetAsyncError", || {
        let e = Handle::from_ptr(comm)?.async_error()?;
        // SAFETY: the caller's contract.
        unsafe { put(async_error, "asyncError", e) }
    })
}

/// `ncclCommCount`: the number of ranks.
///
/// # Safety
///
/// `count` is NULL or valid to write.
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
///     let mut n = 0;
///     assert_eq!(ncclCommCount(comm, &mut n), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    guard("ncclCommCount", || {
        let m = Handle::from_ptr(comm)?.query()?;
        let n = c_int::try_from(m.world.comm.nranks()).unwrap_or(c_int::MAX);
        // SAFETY: the caller's contract.
        unsafe { put(count, "count", n) }
    })
}

/// `ncclCommCuDevice`: the rank's CUDA device ordinal.
///
/// # Safety
///
/// `device` is NULL or valid to write.
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
///     let mut d = -1;
///     assert_eq!(ncclCommCuDevice(comm, &mut d), 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    guard("ncclCommCuDevice", || {
        let m = Handle::from_ptr(comm)?.query()?;
        let d = c_int::try_from(m.world.comm.ordinal(m.rank)).unwrap_or(c_int::MAX);
        // SAFETY: the caller's contract.
        unsafe { put(device, "device", d) }
    })
}

/// `ncclCommUserRank`: the rank.
///
/// # Safety
///
/// `rank` is NULL or valid to write.
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
///     let mut r = -1;
///     assert_eq!(ncclCommUserRank(comm, &mut r), 0);
///     assert_eq!(r, 0);
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    guard("ncclCommUserRank", || {
        let m = Handle::from_ptr(comm)?.query()?;
        let r = c_int::try_from(m.rank).unwrap_or(c_int::MAX);
        // SAFETY: the caller's contract.
        unsafe { put(rank, "rank", r) }
    })
}

/// `ncclCommRegister`: accepted and tracked, with no effect on how data moves (ringccl stages
/// through its own buffers): `*handle` is an opaque non-NULL token for
/// [`ncclCommDeregister`]; the same range registered again gives the same handle with one
/// more reference, as NCCL's registration cache does.
///
/// # Safety
///
/// `handle` is NULL or valid to write.
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
///     let mut handle = null_mut();
///     assert_eq!(ncclCommRegister(comm, buf, 4096, &mut handle), 0);
///     assert_eq!(ncclCommDeregister(comm, handle), 0);
///     assert_eq!(ncclCommDeregister(comm, handle), 5); // twice: ncclInvalidUsage
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    guard("ncclCommRegister", || {
        let h = Handle::from_ptr(comm)?;
        h.member()?;
        if handle.is_null() {
            return Err(Fail::arg("handle is NULL"));
        }
        if buff.is_null() {
            return Err(Fail::arg("buff is NULL"));
        }
        let token = h.regs().register(regs::Kind::Buffer, buff as u64, size);
        // SAFETY: checked non-null; the caller's contract.
        unsafe { put(handle, "handle", token as *mut c_void) }
    })
}

/// `ncclCommDeregister`: releases one reference of a handle from [`ncclCommRegister`]. NULL
/// is `ncclSuccess` (nothing registered), a handle this communicator did not hand out, or one
/// released already, `ncclInvalidUsage`, as in NCCL (`src/register/register.cc`).
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommDeregister(null_mut(), null_mut()), 4); // no communicator
/// ```
#[no_mangle]
pub extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    guard("ncclCommDeregister", || {
        let h = Handle::from_ptr(comm)?;
        h.query()?;
        if handle.is_null() {
            return Ok(());
        }
        h.regs()
            .deregister(regs::Kind::Buffer, handle as usize)
            .map(|_| ())
    })
}

/// `ncclCommWindowRegister` (NCCL 2.27+; collective: every rank, in the same order): registers
/// the buffer with ringccl (`ringccl::Communicator::register_raw`): in a communicator of
/// processes its allocation is mapped into every peer, a one-shot all-reduce whose input lies
/// in it is read in place (zero-copy, with `RINGCCL_ZERO_COPY_READS=1`), and a receive of more
/// than 64 KiB into it on the point-to-point kernel is written by the sender directly; every
/// other call works as on any buffer. Memory
/// CUDA IPC cannot export (pool or VMM allocations) stays unregistered with a logged reason,
/// and its calls are staged: still `ncclSuccess`. `winFlags` may be `NCCL_WIN_DEFAULT` or
/// `NCCL_WIN_COLL_SYMMETRIC` (ringccl's kernels need no symmetric layout; both are accepted);
/// any other bit is `ncclInvalidArgument`. `*win` is an opaque non-NULL token for
/// [`ncclCommWindowDeregister`]. NULL `buff` or `size == 0` is `ncclSuccess` with `*win`
/// untouched, as in NCCL (`src/dev_runtime.cc`).
///
/// # Safety
///
/// `win` is NULL or valid to write.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut win = null_mut();
/// // SAFETY: a NULL communicator is refused before anything is written.
/// assert_eq!(unsafe { ncclCommWindowRegister(null_mut(), null_mut(), 0, &mut win, 0) }, 4);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    win_flags: c_int,
) -> ncclResult_t {
    guard("ncclCommWindowRegister", || {
        let h = Handle::from_ptr(comm)?;
        if buff.is_null() || size == 0 {
            return Ok(());
        }
        let m = h.member()?;
        if win.is_null() {
            return Err(Fail::arg("win is NULL"));
        }
        if win_flags & !NCCL_WIN_COLL_SYMMETRIC != 0 {
            return Err(Fail::arg(format!(
                "winFlags {win_flags:#x}: only NCCL_WIN_COLL_SYMMETRIC is defined"
            )));
        }
        let ring = m
            .world
            .comm
            .register_raw(buff as u64, size)
            .map_err(Fail::from)?;
        let token = h.regs().register_window(buff as u64, size, ring);
        // SAFETY: checked non-null; the caller's contract.
        unsafe { put(win, "win", token as ncclWindow_t) }
    })
}

/// `ncclCommWindowDeregister` (collective, in registration order): releases a window from
/// [`ncclCommWindowRegister`], undoing its ringccl registration (after this rank's previous
/// call has ended). NULL is `ncclSuccess`; a window this communicator did not hand out, or one
/// released already, `ncclInvalidUsage`.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommWindowDeregister(null_mut(), null_mut()), 4); // no communicator
/// ```
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    guard("ncclCommWindowDeregister", || {
        let h = Handle::from_ptr(comm)?;
        if win.is_null() {
            return Ok(());
        }
        let m = h.query()?;
        let ring = h.regs().deregister(regs::Kind::Window, win as usize)?;
        match ring {
            Some(id) => m.world.comm.deregister_raw(id).map_err(Fail::from),
            None => Ok(()),
        }
    })
}

/// `ncclDevCommCreate` (nccl_device.h): not supported (`ncclInvalidUsage`): ringccl has no
/// device-side API.
///
/// # Safety
///
/// None of the pointers is read.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// // SAFETY: nothing is read.
/// assert_eq!(unsafe { ncclDevCommCreate(null_mut(), std::ptr::null(), null_mut()) }, 5);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const c_void,
    out_dev_comm: *mut c_void,
) -> ncclResult_t {
    let _ = (comm, reqs, out_dev_comm);
    guard("ncclDevCommCreate", || {
        Err(Fail::unsupported(
            "ncclDevCommCreate",
            "ringccl has no device-side API",
        ))
    })
}

/// `ncclDevCommDestroy` (nccl_device.h): not supported (`ncclInvalidUsage`).
///
/// # Safety
///
/// None of the pointers is read.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// // SAFETY: nothing is read.
/// assert_eq!(unsafe { ncclDevCommDestroy(null_mut(), std::ptr::null()) }, 5);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclDevCommDestroy(
    comm: ncclComm_t,
    dev_comm: *const c_void,
) -> ncclResult_t {
    let _ = (comm, dev_comm);
    guard("ncclDevCommDestroy", || {
        Err(Fail::unsupported(
            "ncclDevCommDestroy",
            "ringccl has no device-side API",
        ))
    })
}

/// `ncclMemAlloc`: `size` bytes of device memory on the current device (`cuMemAlloc`: plain
/// device memory, usable by any CUDA call; PyTorch's `torch.cuda.MemPool` on NCCL's allocator
/// gets it). `size == 0` gives NULL and `ncclSuccess`, as NCCL's fallback does.
///
/// # Safety
///
/// `ptr` is NULL or valid to write.
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
///     assert_eq!(ncclMemFree(buf), 0);
///     buf = null_mut();
///     assert_eq!(ncclCommDestroy(comm), 0);
/// }
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    guard("ncclMemAlloc", || {
        if ptr.is_null() {
            return Err(Fail::arg("ptr is NULL"));
        }
        if size == 0 {
            // As NCCL (its cudaMalloc fallback): nothing allocated, *ptr = NULL.
            // SAFETY: checked non-null; the caller's contract.
            return unsafe { put(ptr, "ptr", std::ptr::null_mut()) };
        }
        let p = cuda::mem_alloc(size)?;
        // SAFETY: checked non-null; the caller's contract.
        unsafe { put(ptr, "ptr", p as *mut c_void) }
    })
}

/// `ncclMemFree`: frees memory from [`ncclMemAlloc`] (NULL: nothing).
///
/// # Safety
///
/// `ptr` is NULL or from [`ncclMemAlloc`], and no work still uses it.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// // SAFETY: NULL frees nothing.
/// assert_eq!(unsafe { ncclMemFree(null_mut()) }, 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    guard("ncclMemFree", || {
        if ptr.is_null() {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { cuda::mem_free(ptr as u64) }
    })
}

/// `ncclRedOpCreatePreMulSum`: a PreMulSum operator on `comm` (each input multiplied by the
/// scalar, then summed): `ncclScalarHostImmediate` copies the scalar (one element of
/// `datatype`) now, `ncclScalarDevice` keeps its device address, read when the collective runs.
/// The operator is valid on `comm` only, for collectives of `datatype` only (else
/// `ncclInvalidArgument`, as NCCL), until [`ncclRedOpDestroy`].
///
/// Whatever fails, `*op` (if `op` is not NULL) is set first to a value every collective
/// refuses (`ncclMaxRedOp`), never left at a built-in: a caller that ignores the return code
/// gets an error from the collective, not a plain sum.
///
/// A reducing collective given the operator (`ncclAllReduce`, `ncclReduceScatter`,
/// `ncclReduce`) multiplies each rank's input by its scalar, then sums (as NCCL; the caller's
/// input is left unchanged, except an all-reduce's in-place buffer, which the result
/// overwrites anyway).
///
/// # Safety
///
/// `op` is NULL or valid to write; `scalar` is NULL or, for `ncclScalarHostImmediate`, one
/// element of `datatype` to read (for `ncclScalarDevice`, device memory that stays valid
/// while the operator is used).
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut op = 0; // ncclSum
/// let mut scalar = 0.5f32;
/// // SAFETY: `op` is valid to write; `scalar` is one float. No communicator: refused.
/// let r = unsafe { ncclRedOpCreatePreMulSum(&mut op, (&mut scalar as *mut f32).cast(), 7, 1, null_mut()) };
/// assert_eq!(r, 4); // ncclInvalidArgument
/// assert_eq!(op, 0x7fff_ffff); // not ncclSum: every collective refuses it
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    guard("ncclRedOpCreatePreMulSum", || {
        if op.is_null() {
            return Err(Fail::arg("op is NULL"));
        }
        // SAFETY: checked non-null; the caller's contract. Written before anything can fail.
        unsafe { op.write(ops::FAILED_OP) };
        let h = Handle::from_ptr(comm)?;
        h.member()?;
        // SAFETY: the caller's contract.
        let p = unsafe { ops::premul_from_c(scalar, datatype, residence) }?;
        let v = h.ops().create(p)?;
        // SAFETY: as above.
        unsafe { op.write(v) };
        Ok(())
    })
}

/// `ncclRedOpDestroy`: forgets an operator from [`ncclRedOpCreatePreMulSum`]; later
/// collectives with it are refused. A built-in, a value not created on `comm`, one destroyed
/// already, or a NULL `comm` are `ncclInvalidArgument`, as in NCCL (`src/enqueue.cc`).
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclRedOpDestroy(0, null_mut()), 4); // ncclSum is a built-in
/// assert_eq!(ncclRedOpDestroy(5, null_mut()), 4); // no communicator
/// ```
#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    guard("ncclRedOpDestroy", || {
        if (0..ops::NCCL_NUM_OPS).contains(&op) || op < 0 {
            // The checks that need no communicator, first, as in NCCL.
            return ops::OpTable::default().destroy(op);
        }
        let h = Handle::from_ptr(comm)?;
        h.query()?;
        h.ops().destroy(op)
    })
}
