//! The result types of [`crate::nccl`], shaped like `cudarc::nccl::result`: [`NcclError`] (a
//! tuple struct whose `.0` is an [`ncclResult_t`] code), [`NcclStatus`], and the group calls
//! [`group_start`] / [`group_end`].
//!
//! Unlike cudarc's, an [`NcclError`] also carries the ringccl [`Error`] it came from, so its
//! `Debug` and `Display` say what went wrong and what to do, and `?` into
//! `Box<dyn std::error::Error>` or [`ringccl::Error`](crate::Error) works.

#![allow(non_camel_case_types)]

use std::fmt;

use crate::Error;

/// NCCL's result codes (`ncclResult_t`), with NCCL's names and values.
///
/// ```
/// use ringccl::nccl::result::ncclResult_t;
/// assert_eq!(ncclResult_t::ncclInvalidArgument as u32, 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ncclResult_t {
    /// `ncclSuccess`
    ncclSuccess = 0,
    /// `ncclUnhandledCudaError`: a CUDA call failed.
    ncclUnhandledCudaError = 1,
    /// `ncclSystemError`: the system (driver missing, sockets, devices) failed.
    ncclSystemError = 2,
    /// `ncclInternalError`: a bug in the library.
    ncclInternalError = 3,
    /// `ncclInvalidArgument`: a bad argument.
    ncclInvalidArgument = 4,
    /// `ncclInvalidUsage`: a call the library cannot make in this state.
    ncclInvalidUsage = 5,
    /// `ncclRemoteError`: another rank failed or cannot be reached.
    ncclRemoteError = 6,
    /// `ncclInProgress`
    ncclInProgress = 7,
    /// `ncclNumResults`
    ncclNumResults = 8,
}

/// An error of [`crate::nccl`]: `.0` is the NCCL code, as in `cudarc::nccl::result::NcclError`;
/// the ringccl [`Error`] behind it is kept ([`NcclError::error`]) and printed.
///
/// ```
/// use ringccl::nccl::result::{ncclResult_t, NcclError};
/// let e = NcclError::from(ringccl::Error::Internal { reason: "x".into() });
/// assert_eq!(e.0, ncclResult_t::ncclInternalError);
/// let back: ringccl::Error = e.into();
/// assert!(matches!(back, ringccl::Error::Internal { .. }));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct NcclError(pub ncclResult_t, Option<Box<Error>>);

impl NcclError {
    /// An error with `code` and the ringccl error that explains it.
    pub fn new(code: ncclResult_t, error: Error) -> Self {
        NcclError(code, Some(Box::new(error)))
    }

    /// The ringccl error behind this one, if it came from ringccl.
    ///
    /// ```
    /// use ringccl::nccl::result::NcclError;
    /// let e = NcclError::from(ringccl::Error::NoDriver);
    /// assert_eq!(e.error(), Some(&ringccl::Error::NoDriver));
    /// ```
    pub fn error(&self) -> Option<&Error> {
        self.1.as_deref()
    }

    /// An `ncclInvalidArgument` with `reason`.
    pub(crate) fn invalid(rank: Option<usize>, arg: crate::Arg, reason: String) -> Self {
        Error::InvalidArgument { rank, arg, reason }.into()
    }

    /// An `ncclInvalidUsage` with `reason`.
    pub(crate) fn usage(reason: String) -> Self {
        NcclError::new(ncclResult_t::ncclInvalidUsage, Error::Aborted { reason })
    }
}

impl fmt::Debug for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.1 {
            Some(e) => write!(f, "NcclError({:?}: {e})", self.0),
            None => write!(f, "NcclError({:?})", self.0),
        }
    }
}

impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.1 {
            Some(e) => write!(f, "{:?}: {e}", self.0),
            None => write!(f, "{:?}", self.0),
        }
    }
}

impl std::error::Error for NcclError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The NCCL code of a ringccl error (the codes `libnccl.so.2` returns for it).
pub fn code_of(e: &Error) -> ncclResult_t {
    use ncclResult_t::*;
    match e {
        Error::InvalidArgument { .. } | Error::Config { .. } | Error::BadDevice { .. } => {
            ncclInvalidArgument
        }
        Error::TooFewDevices { .. } | Error::NoDriver | Error::Kernel { .. } => ncclSystemError,
        Error::Cuda { .. } => ncclUnhandledCudaError,
        Error::Bootstrap { .. } | Error::Network { .. } | Error::Timeout { .. } => ncclRemoteError,
        Error::Aborted { .. } => ncclInvalidUsage,
        Error::PartlyEnqueued { cause, .. } => code_of(cause),
        Error::Internal { .. } => ncclInternalError,
    }
}

impl From<Error> for NcclError {
    fn from(e: Error) -> Self {
        NcclError::new(code_of(&e), e)
    }
}

impl From<NcclError> for Error {
    fn from(e: NcclError) -> Self {
        match e.1 {
            Some(inner) => *inner,
            None => Error::Internal {
                reason: format!("NCCL error {:?}", e.0),
            },
        }
    }
}

impl From<cudarc::driver::DriverError> for NcclError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Cuda {
            call: "the CUDA driver",
            code: format!("{:?}", e.0),
            rank: None,
        }
        .into()
    }
}

/// What a successful call returns, as in `cudarc::nccl::result::NcclStatus`: ringccl's calls
/// are blocking-mode NCCL calls, so always [`NcclStatus::Success`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NcclStatus {
    /// The call was enqueued (or, in a group, queued).
    Success,
    /// Not returned by ringccl (NCCL's non-blocking mode).
    InProgress,
    /// Not returned by ringccl.
    NumResults,
}

/// Starts a group on this thread (`ncclGroupStart`): the calls of this thread up to the
/// matching [`group_end`] are queued and issued together there. Groups nest; only the
/// outermost [`group_end`] issues.
///
/// ```no_run
/// use ringccl::nccl::{group_end, group_start};
/// group_start().unwrap();
/// // comm.send(..), comm.recv(..), comm.all_reduce(..) ...
/// group_end().unwrap();
/// ```
pub fn group_start() -> Result<NcclStatus, NcclError> {
    super::group::start();
    Ok(NcclStatus::Success)
}

/// Ends a group of this thread (`ncclGroupEnd`); the outermost one issues what the group
/// queued (see [`crate::nccl`]). Without a [`group_start`] before it: `ncclInvalidUsage`.
/// An error of any call of the group is returned here, after the streams of every call were
/// released.
///
/// ```
/// use ringccl::nccl::{group_end, result::ncclResult_t};
/// assert_eq!(group_end().unwrap_err().0, ncclResult_t::ncclInvalidUsage);
/// ```
pub fn group_end() -> Result<NcclStatus, NcclError> {
    super::group::end()?;
    Ok(NcclStatus::Success)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arg, BootstrapFailure};

    #[test]
    fn every_error_maps_to_its_nccl_code_and_back() {
        use ncclResult_t::*;
        let cases = [
            (
                Error::InvalidArgument {
                    rank: Some(1),
                    arg: Arg::Count,
                    reason: "r".into(),
                },
                ncclInvalidArgument,
            ),
            (Error::NoDriver, ncclSystemError),
            (
                Error::Cuda {
                    call: "cuX",
                    code: "E".into(),
                    rank: None,
                },
                ncclUnhandledCudaError,
            ),
            (
                Error::Bootstrap {
                    rank: None,
                    failure: BootstrapFailure::Timeout,
                    detail: "d".into(),
                },
                ncclRemoteError,
            ),
            (
                Error::Timeout {
                    rank: None,
                    peer: Some(1),
                    what: "w".into(),
                },
                ncclRemoteError,
            ),
            (Error::Aborted { reason: "a".into() }, ncclInvalidUsage),
            (Error::Internal { reason: "i".into() }, ncclInternalError),
            (
                Error::PartlyEnqueued {
                    enqueued: vec![0],
                    cause: Box::new(Error::Cuda {
                        call: "c",
                        code: "e".into(),
                        rank: None,
                    }),
                },
                ncclUnhandledCudaError,
            ),
        ];
        for (e, code) in cases {
            let n = NcclError::from(e.clone());
            assert_eq!(n.0, code, "{e:?}");
            assert_eq!(n.error(), Some(&e));
            assert!(format!("{n:?}").contains(&format!("{code:?}")));
            assert!(n.to_string().contains(&e.to_string()));
            assert_eq!(Error::from(n), e);
        }
    }

    #[test]
    fn a_bare_code_converts_to_an_internal_error_naming_it() {
        let e = NcclError(ncclResult_t::ncclSystemError, None);
        assert_eq!(format!("{e:?}"), "NcclError(ncclSystemError)");
        match Error::from(e) {
            Error::Internal { reason } => assert!(reason.contains("ncclSystemError")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn question_mark_into_boxed_errors_and_ringccl_errors() {
        fn boxed() -> Result<(), Box<dyn std::error::Error>> {
            Err(NcclError::from(Error::NoDriver))?;
            Ok(())
        }
        fn ours() -> crate::Result<()> {
            Err(NcclError::from(Error::NoDriver))?;
            Ok(())
        }
        assert!(boxed().unwrap_err().to_string().contains("ncclSystemError"));
        assert_eq!(ours().unwrap_err(), Error::NoDriver);
    }
}
