//! Results, the last error's text, and the guard every entry point runs in.
//!
//! Every exported function runs its body through [`guard`]: a panic is caught there (never
//! crossing into C) and becomes `ncclInternalError`; a failure's message is kept per thread
//! for `ncclGetLastError` and, with `NCCL_DEBUG=WARN` or `RINGCCL_DEBUG=warn` (or more), printed
//! on stderr.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::types::*;

/// A failed call: the code it returns and the message `ncclGetLastError` gives.
///
/// ```
/// use ringccl_nccl::error::Fail;
/// use ringccl_nccl::types::NCCL_INVALID_USAGE;
/// let f = Fail::usage("ncclCommSplit is not supported");
/// assert_eq!(f.code, NCCL_INVALID_USAGE);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fail {
    /// The `ncclResult_t`.
    pub code: ncclResult_t,
    /// What went wrong and what to do.
    pub message: String,
}

impl Fail {
    /// A failure with `code`.
    pub fn new(code: ncclResult_t, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }

    /// `ncclInvalidArgument`.
    pub fn arg(message: impl Into<String>) -> Fail {
        Fail::new(NCCL_INVALID_ARGUMENT, message)
    }

    /// `ncclInvalidUsage`.
    pub fn usage(message: impl Into<String>) -> Fail {
        Fail::new(NCCL_INVALID_USAGE, message)
    }

    /// `ncclInvalidUsage` for a function ringccl does not implement.
    pub fn unsupported(function: &str, why: &str) -> Fail {
        Fail::usage(format!("{function} is not supported by ringccl: {why}"))
    }
}

/// The NCCL code of a ringccl error.
///
/// ```
/// use ringccl_nccl::error::code_of;
/// let e = ringccl::Error::Internal { reason: "x".into() };
/// assert_eq!(code_of(&e), ringccl_nccl::types::NCCL_INTERNAL_ERROR);
/// assert_eq!(code_of(&ringccl::Error::NoDriver), ringccl_nccl::types::NCCL_SYSTEM_ERROR);
/// ```
pub fn code_of(e: &ringccl::Error) -> ncclResult_t {
    use ringccl::{BootstrapFailure, Error};
    match e {
        Error::InvalidArgument { .. } | Error::BadDevice { .. } | Error::Config { .. } => {
            NCCL_INVALID_ARGUMENT
        }
        Error::TooFewDevices { .. } => NCCL_INVALID_USAGE,
        Error::Cuda { .. } => NCCL_UNHANDLED_CUDA_ERROR,
        Error::NoDriver => NCCL_SYSTEM_ERROR,
        Error::Bootstrap { failure, .. } => match failure {
            BootstrapFailure::PeerLost => NCCL_REMOTE_ERROR,
            BootstrapFailure::Network | BootstrapFailure::Timeout => NCCL_SYSTEM_ERROR,
            _ => NCCL_INVALID_USAGE,
        },
        // A peer that never arrived or a link that failed: NCCL's "remote process exited or
        // there was a network error".
        Error::Timeout { .. } | Error::Network { .. } => NCCL_REMOTE_ERROR,
        Error::Aborted { .. } => NCCL_INVALID_USAGE,
        _ => NCCL_INTERNAL_ERROR,
    }
}

impl From<ringccl::Error> for Fail {
    fn from(e: ringccl::Error) -> Fail {
        Fail::new(code_of(&e), e.to_string())
    }
}

/// What an entry point's body returns.
pub type Result<T> = std::result::Result<T, Fail>;

thread_local! {
    /// The last failure's text on this thread, NUL-terminated (what `ncclGetLastError` returns).
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Keeps `message` as this thread's last error (and prints it if warnings are on).
///
/// ```
/// ringccl_nccl::error::set_last("ncclAllReduce: bad type");
/// assert_eq!(ringccl_nccl::error::last(), "ringccl: ncclAllReduce: bad type");
/// ```
pub fn set_last(message: &str) {
    let text = format!("ringccl: {message}");
    if crate::debug::warn_enabled() {
        eprintln!("NCCL WARN {text}");
    }
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error text (empty if none).
///
/// ```
/// let _ = ringccl_nccl::error::last();
/// ```
pub fn last() -> String {
    LAST.with(|l| l.borrow().to_string_lossy().into_owned())
}

/// A pointer to this thread's last error text, valid until the thread's next failure.
pub(crate) fn last_ptr() -> *const c_char {
    // The `CString`'s heap buffer does not move while it stays in the thread-local; it is
    // replaced only by a later failure on this thread.
    LAST.with(|l| l.borrow().as_ptr())
}

/// Runs an entry point's body: `Ok` → `ncclSuccess`; a failure → its code, its message kept
/// for `ncclGetLastError` (prefixed with `function`); a panic → `ncclInternalError`.
///
/// ```
/// use ringccl_nccl::error::{guard, Fail};
/// assert_eq!(guard("f", || Ok(())), 0);
/// assert_eq!(guard("f", || Err(Fail::arg("count"))), 4);
/// assert_eq!(ringccl_nccl::error::last(), "ringccl: f: count");
/// ```
pub fn guard(function: &str, body: impl FnOnce() -> Result<()>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        // `ncclInProgress` is a state, not a failure: no message.
        Ok(Err(f)) if f.code == NCCL_IN_PROGRESS => f.code,
        Ok(Err(f)) => {
            set_last(&format!("{function}: {}", f.message));
            f.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_last(&format!(
                "{function}: internal error (a panic inside ringccl: {what}); please report it"
            ));
            NCCL_INTERNAL_ERROR
        }
    }
}

/// The text of `ncclGetErrorString` for a result code (NCCL's own wording).
///
/// ```
/// assert_eq!(ringccl_nccl::error::result_text(0), "no error");
/// assert_eq!(ringccl_nccl::error::result_text(99), "unknown result code");
/// ```
pub fn result_text(r: ncclResult_t) -> &'static str {
    match r {
        NCCL_SUCCESS => "no error",
        NCCL_UNHANDLED_CUDA_ERROR => "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => "internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => "invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => "invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => "remote process exited or there was a network error",
        NCCL_IN_PROGRESS => "NCCL operation in progress",
        _ => "unknown result code",
    }
}

/// The same texts, NUL-terminated, for C.
pub(crate) fn result_cstr(r: ncclResult_t) -> &'static std::ffi::CStr {
    match r {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_error() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = guard("ncclTest", || panic!("boom"));
        std::panic::set_hook(prev);
        assert_eq!(r, NCCL_INTERNAL_ERROR);
        assert!(last().contains("boom"), "{}", last());
    }

    #[test]
    fn c_texts_match() {
        for r in -1..10 {
            assert_eq!(result_cstr(r).to_str().unwrap(), result_text(r));
        }
    }
}
