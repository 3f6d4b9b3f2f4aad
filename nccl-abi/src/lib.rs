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
//! * The entry points are in `c_comm` (communicators, memory, operators), `c_split` (split,
//!   shrink, scalable init) and `c_coll` (groups, collectives, send/recv), re-exported here;
//!   they check their C arguments and call the implementation. Its modules depend on each
//!   other one way: `queue` (queued calls, plain data), `ops` (reduction operators), `regs`
//!   (registrations) ← `comm` (handles) ← `group` (the thread's group) ← `coll` (issuing).
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

mod c_coll;
mod c_comm;
mod c_split;
mod coll;
mod comm;
mod cuda;
mod debug;
pub mod error;
mod group;
pub mod ops;
mod queue;
mod regs;
pub mod types;

use std::ffi::{c_char, c_int, c_void, CStr};

use ringccl::UniqueId;

use crate::error::{guard, Fail, Result};
use crate::types::*;

pub use c_coll::*;
pub use c_comm::*;
pub use c_split::*;

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
