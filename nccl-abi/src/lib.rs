//! # ringccl's NCCL C API
//!
//! A shared library with the C ABI of NCCL 2.28 (`nccl.h`): built as `libringccl_nccl.so`
//! with the SONAME `libnccl.so.2`, it stands in for NCCL under programs written for NCCL, in
//! C or C++ (link it, or put it first on `LD_LIBRARY_PATH` as `libnccl.so.2`) and in PyTorch
//! (`LD_PRELOAD`). Every call goes to ringccl's [`ringccl::Communicator`].
//!
//! * Types and values are `nccl.h`'s ([`types`]); `ncclGetVersion` reports 2.28.9. That the
//!   library is ringccl shows in every error text (`ncclGetLastError` starts with
//!   `ringccl: `), in the banner printed with `NCCL_DEBUG=VERSION` (or `INFO`), and through the
//!   extra symbol `ringcclGetVersionString`.
//! * No panic crosses into C: every entry point runs in [`error::guard`].
//! * A function ringccl cannot honour returns `ncclInvalidUsage` and says why in
//!   `ncclGetLastError`; the table of what is supported is in `docs/NCCL_ABI.md`.
//!
//! ```
//! use std::ffi::CStr;
//! let mut v = 0;
//! // SAFETY: `v` is a valid int to write.
//! assert_eq!(unsafe { ringccl_nccl::ncclGetVersion(&mut v) }, 0);
//! assert_eq!(v, 22809);
//! // SAFETY: returns a static string.
//! let text = unsafe { CStr::from_ptr(ringccl_nccl::ncclGetErrorString(5)) };
//! assert!(text.to_str()?.starts_with("invalid usage"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![allow(non_snake_case, non_camel_case_types)]

mod coll;
mod comm;
mod cuda;
mod debug;
pub mod error;
mod group;
pub mod types;

use std::ffi::{c_char, c_int, c_void, CStr};

use ringccl::{Communicator, UniqueId};

use crate::coll::{CollCall, Kind, P2pCall};
use crate::comm::{Handle, Member, World};
use crate::cuda::KeepContext;
use crate::error::{guard, Fail, Result};
use crate::types::*;

/// `struct ncclComm`: opaque to C and to Rust callers (a ringccl rank behind it).
#[repr(C)]
pub struct ncclComm {
    _opaque: [u8; 0],
}

/// `ncclComm_t`.
pub type ncclComm_t = *mut ncclComm;
/// `ncclWindow_t` (never created by ringccl).
pub type ncclWindow_t = *mut c_void;
/// `cudaStream_t` (= the driver's `CUstream`).
pub type cudaStream_t = *mut c_void;

/// What the library is, as a C string.
pub const VERSION_TEXT: &CStr = match CStr::from_bytes_with_nul(
    concat!(
        "ringccl ",
        env!("CARGO_PKG_VERSION"),
        " (NCCL 2.28.9 C API)\0"
    )
    .as_bytes(),
) {
    Ok(s) => s,
    Err(_) => panic!("the version text has an interior NUL"),
};

/// Writes `v` through a C out-pointer, or fails with `ncclInvalidArgument` for NULL.
///
/// # Safety
///
/// `out` is NULL or valid to write.
unsafe fn put<T>(out: *mut T, name: &str, v: T) -> Result<()> {
    if out.is_null() {
        return Err(Fail::arg(format!("{name} is NULL")));
    }
    // SAFETY: non-null; the caller's contract.
    unsafe { out.write(v) };
    Ok(())
}

/// `ncclConfig_t`'s `blocking`, checked (NULL: the default, blocking).
///
/// # Safety
///
/// `config` is NULL or points to an `ncclConfig_t` made with `NCCL_CONFIG_INITIALIZER`.
unsafe fn blocking(config: *const ncclConfig_t) -> Result<bool> {
    if config.is_null() {
        return Ok(true);
    }
    // SAFETY: the caller's contract; `size` and `magic` come first in every version.
    let (size, magic) = unsafe { ((*config).size, (*config).magic) };
    if magic != NCCL_CONFIG_MAGIC {
        return Err(Fail::arg(format!(
            "config's magic is {magic:#x}, not {NCCL_CONFIG_MAGIC:#x}: initialise it with \
             NCCL_CONFIG_INITIALIZER"
        )));
    }
    if size < std::mem::offset_of!(ncclConfig_t, cga_cluster_size) {
        return Ok(true);
    }
    // SAFETY: `size` says the caller's struct holds `blocking`.
    let b = unsafe { (*config).blocking };
    Ok(b != 0)
}

/// An int argument that must lie in `0..n`.
fn index(v: c_int, n: usize, what: &str) -> Result<usize> {
    match usize::try_from(v) {
        Ok(i) if i < n => Ok(i),
        _ => Err(Fail::arg(format!(
            "{what} {v} is out of range for {n} ranks"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Version, errors, ids.

/// `ncclGetVersion`: 22809 (NCCL 2.28.9, the header this library implements).
///
/// # Safety
///
/// `version` is NULL or valid to write.
///
/// ```
/// let mut v = 0;
/// // SAFETY: `v` is valid to write.
/// unsafe { ringccl_nccl::ncclGetVersion(&mut v) };
/// assert_eq!(v, 22809);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    // SAFETY: the caller's contract.
    guard("ncclGetVersion", || unsafe {
        put(version, "version", NCCL_VERSION_CODE)
    })
}

/// `ringcclGetVersionString` (not in nccl.h): what this library is, e.g.
/// `ringccl 0.1.0 (NCCL 2.28.9 C API)`. A program can look it up with `dlsym` to tell ringccl
/// from NCCL.
///
/// ```
/// // SAFETY: a static string.
/// let s = unsafe { std::ffi::CStr::from_ptr(ringccl_nccl::ringcclGetVersionString()) };
/// assert!(s.to_str()?.starts_with("ringccl "));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[no_mangle]
pub extern "C" fn ringcclGetVersionString() -> *const c_char {
    VERSION_TEXT.as_ptr()
}

/// `ncclGetErrorString`: NCCL's text for a result code (static).
///
/// ```
/// // SAFETY: a static string.
/// let s = unsafe { std::ffi::CStr::from_ptr(ringccl_nccl::ncclGetErrorString(0)) };
/// assert_eq!(s.to_str()?, "no error");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    error::result_cstr(result).as_ptr()
}

/// `ncclGetLastError`: the text of the calling thread's last failure (empty if none; `comm`
/// is not used, as in NCCL). Valid until the thread's next failing call.
///
/// ```
/// // SAFETY: a valid C string.
/// let s = unsafe { std::ffi::CStr::from_ptr(ringccl_nccl::ncclGetLastError(std::ptr::null_mut())) };
/// let _ = s.to_str()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    let _ = comm;
    error::last_ptr()
}

/// `ncclResetDebugInit` (deprecated in nccl.h): nothing to reset; kept for linking.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// ncclResetDebugInit();
/// ```
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {}

/// `ncclGetUniqueId`: starts a rendezvous service in this process (a background thread) and
/// returns its id; needs no GPU. The id carries this host's address (the interface of the
/// default route, else 127.0.0.1), a port and a random key.
///
/// # Safety
///
/// `unique_id` is NULL or valid to write.
///
/// ```
/// let mut id = ringccl_nccl::types::ncclUniqueId { internal: [0; 128] };
/// // SAFETY: `id` is valid to write.
/// assert_eq!(unsafe { ringccl_nccl::ncclGetUniqueId(&mut id) }, 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut ncclUniqueId) -> ncclResult_t {
    guard("ncclGetUniqueId", || {
        let id = UniqueId::new().map_err(Fail::from)?;
        let mut out = ncclUniqueId {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        };
        for (o, b) in out.internal.iter_mut().zip(id.as_bytes()) {
            *o = *b as c_char;
        }
        // SAFETY: the caller's contract.
        unsafe { put(unique_id, "uniqueId", out) }
    })
}

// ---------------------------------------------------------------------------------------------
// Communicators.

/// The shared part of `ncclCommInitRank*`.
///
/// # Safety
///
/// `out` NULL or valid to write; `config` as for [`blocking`].
unsafe fn init_rank(
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
    let job = move || -> Result<Member> {
        let _keep = KeepContext::new();
        let comm = Communicator::init_rank(n, &id, rank, device).map_err(Fail::from)?;
        Ok(Member {
            world: World::new(comm),
            rank,
            index: 0,
        })
    };
    if blocking && group::depth() == 0 {
        let m = job()?;
        // SAFETY: checked non-null; the caller's contract.
        unsafe { out.write(Handle::ready(m)) };
        return Ok(());
    }
    // Non-blocking, or inside a group (several ranks of one world may be initialised from
    // one thread, as in NCCL): initialise in a thread of its own.
    let thread = std::thread::Builder::new()
        .name(format!("ringccl-init-{rank}"))
        .spawn(job)
        .map_err(|e| Fail::new(NCCL_SYSTEM_ERROR, format!("cannot start a thread: {e}")))?;
    let h = Handle::initializing(thread, blocking);
    // SAFETY: checked non-null; the caller's contract.
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

/// `ncclCommInitRankScalable`: as [`ncclCommInitRankConfig`]; ringccl's rendezvous needs one
/// root, so the first of the `n_id` ids is used (every rank gets the same array).
///
/// # Safety
///
/// `newcomm` NULL or valid to write; `comm_ids` NULL or `n_id` ids; `config` as above.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut comm = null_mut();
/// // SAFETY: no ids: refused.
/// assert_eq!(unsafe { ncclCommInitRankScalable(&mut comm, 2, 0, 0, null_mut(), null_mut()) }, 4);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    comm_ids: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclCommInitRankScalable", || {
        if comm_ids.is_null() || n_id < 1 {
            return Err(Fail::arg(format!("commIds is NULL or nId {n_id} < 1")));
        }
        // SAFETY: non-null; the caller passes `n_id` >= 1 ids.
        let id = unsafe { *comm_ids };
        // SAFETY: the caller's contract.
        unsafe { init_rank(newcomm, nranks, &id, myrank, config) }
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

/// `ncclCommSplit`: not supported (`ncclInvalidUsage`).
///
/// # Safety
///
/// None of the pointers is read.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut out = null_mut();
/// // SAFETY: nothing is read.
/// assert_eq!(unsafe { ncclCommSplit(null_mut(), 0, 0, &mut out, null_mut()) }, 5); // ncclInvalidUsage
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    let _ = (comm, color, key, newcomm, config);
    guard("ncclCommSplit", || {
        Err(Fail::unsupported(
            "ncclCommSplit",
            "create the new communicator with ncclGetUniqueId and ncclCommInitRank",
        ))
    })
}

/// `ncclCommShrink`: not supported (`ncclInvalidUsage`).
///
/// # Safety
///
/// None of the pointers is read.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut out = null_mut();
/// // SAFETY: nothing is read.
/// assert_eq!(unsafe { ncclCommShrink(null_mut(), null_mut(), 0, &mut out, null_mut(), 0) }, 5);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    exclude_ranks_list: *mut c_int,
    exclude_ranks_count: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrink_flags: c_int,
) -> ncclResult_t {
    let _ = (
        comm,
        exclude_ranks_list,
        exclude_ranks_count,
        newcomm,
        config,
        shrink_flags,
    );
    guard("ncclCommShrink", || {
        Err(Fail::unsupported(
            "ncclCommShrink",
            "create the new communicator with ncclGetUniqueId and ncclCommInitRank",
        ))
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
/// `ncclCommDestroy` are allowed.
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
    let _keep = KeepContext::new();
    guard("ncclCommFinalize", || Handle::from_ptr(comm)?.finalize())
}

/// `ncclCommDestroy`: releases this rank (the communicator is freed with its last rank, after
/// its last work ends). A later use of the handle is `ncclInvalidUsage`.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommDestroy(null_mut()), 4); // ncclInvalidArgument: NULL
/// ```
#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclCommDestroy", || Handle::from_ptr(comm)?.destroy())
}

/// `ncclCommAbort`: cancels the communicator's pending and future work (ringccl's
/// `Communicator::abort`: device waits released, bounded by the timeout), then as
/// [`ncclCommDestroy`].
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommAbort(null_mut()), 4);
/// ```
#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclCommAbort", || Handle::from_ptr(comm)?.abort())
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

/// `ncclCommRegister`: accepted as a hint with no effect (ringccl moves data through its own
/// exported buffers); the handle it returns is the buffer's address.
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
    let _ = size;
    guard("ncclCommRegister", || {
        Handle::from_ptr(comm)?.member()?;
        if buff.is_null() {
            return Err(Fail::arg("buff is NULL"));
        }
        // SAFETY: the caller's contract.
        unsafe { put(handle, "handle", buff) }
    })
}

/// `ncclCommDeregister`: the end of [`ncclCommRegister`]'s hint.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommDeregister(null_mut(), null_mut()), 4);
/// ```
#[no_mangle]
pub extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    guard("ncclCommDeregister", || {
        Handle::from_ptr(comm)?.query()?;
        if handle.is_null() {
            return Err(Fail::arg("handle is NULL"));
        }
        Ok(())
    })
}

/// `ncclCommWindowRegister`: not supported (`ncclInvalidUsage`): ringccl has no symmetric
/// windows.
///
/// # Safety
///
/// None of the pointers is read.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut win = null_mut();
/// // SAFETY: nothing is read.
/// assert_eq!(unsafe { ncclCommWindowRegister(null_mut(), null_mut(), 0, &mut win, 0) }, 5);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    win_flags: c_int,
) -> ncclResult_t {
    let _ = (comm, buff, size, win, win_flags);
    guard("ncclCommWindowRegister", || {
        Err(Fail::unsupported(
            "ncclCommWindowRegister",
            "ringccl has no symmetric memory windows; plain buffers work with every collective",
        ))
    })
}

/// `ncclCommWindowDeregister`: not supported (no window is ever created).
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclCommWindowDeregister(null_mut(), null_mut()), 5);
/// ```
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    let _ = (comm, win);
    guard("ncclCommWindowDeregister", || {
        Err(Fail::unsupported(
            "ncclCommWindowDeregister",
            "ringccl never creates windows",
        ))
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

/// `ncclMemAlloc`: `size` bytes of device memory on the current device (`cuMemAlloc`).
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

/// `ncclRedOpCreatePreMulSum`: not supported (`ncclInvalidUsage`): ringccl has sum, prod,
/// max, min and avg only.
///
/// # Safety
///
/// None of the pointers is read.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// let mut op = 0;
/// let mut scalar = 0.5f32;
/// // SAFETY: nothing is read.
/// let r = unsafe { ncclRedOpCreatePreMulSum(&mut op, (&mut scalar as *mut f32).cast(), 7, 1, null_mut()) };
/// assert_eq!(r, 5);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    let _ = (op, scalar, datatype, residence, comm);
    guard("ncclRedOpCreatePreMulSum", || {
        Err(Fail::unsupported(
            "ncclRedOpCreatePreMulSum",
            "ringccl reduces with ncclSum, ncclProd, ncclMax, ncclMin and ncclAvg only",
        ))
    })
}

/// `ncclRedOpDestroy`: `ncclInvalidArgument` (no custom operator ever exists).
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclRedOpDestroy(5, null_mut()), 4);
/// ```
#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    let _ = comm;
    guard("ncclRedOpDestroy", || {
        Err(Fail::arg(format!(
            "operator {op} was not made by ncclRedOpCreatePreMulSum (ringccl makes none)"
        )))
    })
}

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
/// the group, then issues the group's calls.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// assert_eq!(ncclGroupEnd(), 5); // no group is open
/// ```
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    let _keep = KeepContext::new();
    guard("ncclGroupEnd", group::end)
}

/// `ncclGroupSimulateEnd`: not supported (`ncclInvalidUsage`; the group stays open).
///
/// # Safety
///
/// `sim_info` is not read.
///
/// ```
/// use ringccl_nccl::*;
/// use std::ptr::null_mut;
/// // SAFETY: nothing is read.
/// assert_eq!(unsafe { ncclGroupSimulateEnd(null_mut()) }, 5);
/// ```
#[no_mangle]
pub unsafe extern "C" fn ncclGroupSimulateEnd(sim_info: *mut ncclSimInfo_t) -> ncclResult_t {
    let _ = sim_info;
    guard("ncclGroupSimulateEnd", || {
        Err(Fail::unsupported(
            "ncclGroupSimulateEnd",
            "ringccl has no cost model to report; end the group with ncclGroupEnd",
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// Collectives and point-to-point.

/// Checks one rank's collective call and queues it.
#[allow(clippy::too_many_arguments)]
fn collective(
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let m = Handle::from_ptr(comm)?.member()?;
    let dtype = types::data_type(datatype).map_err(Fail::arg)?;
    let reduces = matches!(kind, Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter);
    let op = if reduces {
        types::red_op(op).map_err(Fail::arg)?
    } else {
        ringccl::RedOp::Sum
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
    let _keep = KeepContext::new();
    guard("ncclAllReduce", || {
        collective(
            Kind::AllReduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            op,
            0,
            comm,
            stream,
        )
    })
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
    let _keep = KeepContext::new();
    guard("ncclBroadcast", || {
        collective(
            Kind::Broadcast,
            sendbuff,
            recvbuff,
            count,
            datatype,
            0,
            root,
            comm,
            stream,
        )
    })
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
    let _keep = KeepContext::new();
    guard("ncclBcast", || {
        collective(
            Kind::Broadcast,
            buff,
            buff,
            count,
            datatype,
            0,
            root,
            comm,
            stream,
        )
    })
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
    let _keep = KeepContext::new();
    guard("ncclReduce", || {
        collective(
            Kind::Reduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            op,
            root,
            comm,
            stream,
        )
    })
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
    let _keep = KeepContext::new();
    guard("ncclAllGather", || {
        collective(
            Kind::AllGather,
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            0,
            0,
            comm,
            stream,
        )
    })
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
    let _keep = KeepContext::new();
    guard("ncclReduceScatter", || {
        collective(
            Kind::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            op,
            0,
            comm,
            stream,
        )
    })
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
    let _keep = KeepContext::new();
    guard("ncclAlltoAll", || {
        collective(
            Kind::AllToAll,
            sendbuff,
            recvbuff,
            count,
            datatype,
            0,
            0,
            comm,
            stream,
        )
    })
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
    let _keep = KeepContext::new();
    guard("ncclGather", || {
        collective(
            Kind::Gather,
            sendbuff,
            recvbuff,
            count,
            datatype,
            0,
            root,
            comm,
            stream,
        )
    })
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
    let _keep = KeepContext::new();
    guard("ncclScatter", || {
        collective(
            Kind::Scatter,
            sendbuff,
            recvbuff,
            count,
            datatype,
            0,
            root,
            comm,
            stream,
        )
    })
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    type R = ncclResult_t;
    type S = cudaStream_t;
    type V = *mut c_void;
    type CV = *const c_void;
    type T = ncclDataType_t;
    type O = ncclRedOp_t;
    type C = ncclComm_t;

    /// nccl.h 2.28's prototypes, as Rust function pointer types: a drift of an exported
    /// function's signature fails to compile here (the C test checks the same against the
    /// header itself).
    #[test]
    fn exported_signatures_are_the_headers() {
        let all: Vec<usize> = vec![
            (ncclGetVersion as unsafe extern "C" fn(*mut c_int) -> R) as usize,
            (ncclGetUniqueId as unsafe extern "C" fn(*mut ncclUniqueId) -> R) as usize,
            (ncclCommInitRank as unsafe extern "C" fn(*mut C, c_int, ncclUniqueId, c_int) -> R)
                as usize,
            (ncclCommInitRankConfig
                as unsafe extern "C" fn(*mut C, c_int, ncclUniqueId, c_int, *mut ncclConfig_t) -> R)
                as usize,
            (ncclCommInitRankScalable
                as unsafe extern "C" fn(
                    *mut C,
                    c_int,
                    c_int,
                    c_int,
                    *mut ncclUniqueId,
                    *mut ncclConfig_t,
                ) -> R) as usize,
            (ncclCommInitAll as unsafe extern "C" fn(*mut C, c_int, *const c_int) -> R) as usize,
            (ncclCommSplit as unsafe extern "C" fn(C, c_int, c_int, *mut C, *mut ncclConfig_t) -> R)
                as usize,
            (ncclCommShrink
                as unsafe extern "C" fn(
                    C,
                    *mut c_int,
                    c_int,
                    *mut C,
                    *mut ncclConfig_t,
                    c_int,
                ) -> R) as usize,
            (ncclCommRevoke as extern "C" fn(C, c_int) -> R) as usize,
            (ncclCommFinalize as extern "C" fn(C) -> R) as usize,
            (ncclCommDestroy as extern "C" fn(C) -> R) as usize,
            (ncclCommAbort as extern "C" fn(C) -> R) as usize,
            (ncclCommGetAsyncError as unsafe extern "C" fn(C, *mut R) -> R) as usize,
            (ncclGetErrorString as extern "C" fn(R) -> *const c_char) as usize,
            (ncclGetLastError as extern "C" fn(C) -> *const c_char) as usize,
            (ncclCommCount as unsafe extern "C" fn(C, *mut c_int) -> R) as usize,
            (ncclCommCuDevice as unsafe extern "C" fn(C, *mut c_int) -> R) as usize,
            (ncclCommUserRank as unsafe extern "C" fn(C, *mut c_int) -> R) as usize,
            (ncclCommRegister as unsafe extern "C" fn(C, V, usize, *mut V) -> R) as usize,
            (ncclCommDeregister as extern "C" fn(C, V) -> R) as usize,
            (ncclCommWindowRegister
                as unsafe extern "C" fn(C, V, usize, *mut ncclWindow_t, c_int) -> R)
                as usize,
            (ncclCommWindowDeregister as extern "C" fn(C, ncclWindow_t) -> R) as usize,
            (ncclRedOpCreatePreMulSum
                as unsafe extern "C" fn(*mut O, V, T, ncclScalarResidence_t, C) -> R)
                as usize,
            (ncclRedOpDestroy as extern "C" fn(O, C) -> R) as usize,
            (ncclReduce as unsafe extern "C" fn(CV, V, usize, T, O, c_int, C, S) -> R) as usize,
            (ncclBcast as unsafe extern "C" fn(V, usize, T, c_int, C, S) -> R) as usize,
            (ncclBroadcast as unsafe extern "C" fn(CV, V, usize, T, c_int, C, S) -> R) as usize,
            (ncclAllReduce as unsafe extern "C" fn(CV, V, usize, T, O, C, S) -> R) as usize,
            (ncclReduceScatter as unsafe extern "C" fn(CV, V, usize, T, O, C, S) -> R) as usize,
            (ncclAllGather as unsafe extern "C" fn(CV, V, usize, T, C, S) -> R) as usize,
            (ncclAlltoAll as unsafe extern "C" fn(CV, V, usize, T, C, S) -> R) as usize,
            (ncclGather as unsafe extern "C" fn(CV, V, usize, T, c_int, C, S) -> R) as usize,
            (ncclScatter as unsafe extern "C" fn(CV, V, usize, T, c_int, C, S) -> R) as usize,
            (ncclSend as unsafe extern "C" fn(CV, usize, T, c_int, C, S) -> R) as usize,
            (ncclRecv as unsafe extern "C" fn(V, usize, T, c_int, C, S) -> R) as usize,
            (ncclGroupStart as extern "C" fn() -> R) as usize,
            (ncclGroupEnd as extern "C" fn() -> R) as usize,
            (ncclGroupSimulateEnd as unsafe extern "C" fn(*mut ncclSimInfo_t) -> R) as usize,
            (ncclMemAlloc as unsafe extern "C" fn(*mut V, usize) -> R) as usize,
            (ncclMemFree as unsafe extern "C" fn(V) -> R) as usize,
            (ncclDevCommCreate as unsafe extern "C" fn(C, CV, V) -> R) as usize,
            (ncclDevCommDestroy as unsafe extern "C" fn(C, CV) -> R) as usize,
        ];
        // The 42 functions of the C ABI check, each its own symbol.
        assert_eq!(all.iter().collect::<HashSet<_>>().len(), 42);
    }

    #[test]
    fn a_foreign_pointer_is_not_a_communicator() {
        let mut x = 0u64;
        let fake: ncclComm_t = (&mut x as *mut u64).cast();
        let mut n = 0;
        // SAFETY: `n` is valid to write; the pointer is checked before any use.
        assert_eq!(
            unsafe { ncclCommCount(fake, &mut n) },
            NCCL_INVALID_ARGUMENT
        );
        assert!(error::last().contains("not a communicator created by this library"));
        assert_eq!(x, 0);
    }

    #[test]
    fn in_progress_is_not_an_error_text() {
        error::set_last("before");
        let r = guard("f", || Err(Fail::new(NCCL_IN_PROGRESS, "initialising")));
        assert_eq!(r, NCCL_IN_PROGRESS);
        assert_eq!(error::last(), "ringccl: before");
    }
}
