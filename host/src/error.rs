//! The one public error type.

use std::fmt;

/// Which argument of a collective a validation error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// The send (input) buffer.
    Send,
    /// The receive (output) buffer.
    Recv,
    /// The stream.
    Stream,
    /// The root rank.
    Root,
    /// The peer rank of a send/recv.
    Peer,
    /// The element count.
    Count,
    /// The list of per-rank arguments itself.
    Ranks,
}

/// Everything that can go wrong in ringccl. `Display` says what happened and what to do.
///
/// ```
/// use ringccl::{Arg, Error};
/// let e = Error::InvalidArgument { rank: Some(1), arg: Arg::Recv, reason: "too small".into() };
/// assert!(e.to_string().contains("rank 1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA driver library (`libcuda.so`) could not be loaded.
    NoDriver,
    /// Fewer CUDA devices than needed (or none).
    TooFewDevices {
        /// Devices asked for.
        needed: usize,
        /// Devices visible.
        found: usize,
    },
    /// A device ordinal that does not exist or appears twice.
    BadDevice {
        /// The ordinal given.
        ordinal: usize,
        /// Why it was rejected.
        reason: String,
    },
    /// A call's argument is wrong; no kernel was launched.
    InvalidArgument {
        /// The rank whose argument is wrong (`None`: not rank-specific).
        rank: Option<usize>,
        /// Which argument.
        arg: Arg,
        /// What is wrong with it.
        reason: String,
    },
    /// A CUDA driver call failed.
    Cuda {
        /// The driver call (`"cuLaunchKernel"`, ...).
        call: &'static str,
        /// The `CUresult` code, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
        code: String,
        /// The rank whose device it happened on, where known.
        rank: Option<usize>,
    },
    /// ringccl's kernels cannot run on this device (too old, or the embedded PTX could not be
    /// loaded).
    Kernel {
        /// What failed.
        reason: String,
    },
    /// A setting is not understood: an environment variable (`RINGCCL_*`) or the matching
    /// [`Config`](crate::Config) field.
    Config {
        /// The environment variable (also for the matching `Config` field).
        variable: String,
        /// The value given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A bug in ringccl: an internal consistency check failed. Please report it with the
    /// message.
    Internal {
        /// What was found.
        reason: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDriver => write!(
                f,
                "the CUDA driver (libcuda.so) was not found: install the NVIDIA driver or run on a machine with a GPU"
            ),
            Error::TooFewDevices { needed, found } => write!(
                f,
                "{needed} CUDA device(s) needed but {found} visible: check CUDA_VISIBLE_DEVICES and nvidia-smi"
            ),
            Error::BadDevice { ordinal, reason } => {
                write!(f, "device {ordinal} cannot be used: {reason}")
            }
            Error::InvalidArgument { rank, arg, reason } => match rank {
                Some(r) => write!(f, "invalid {arg:?} argument on rank {r}: {reason} (no kernel was launched)"),
                None => write!(f, "invalid {arg:?} argument: {reason} (no kernel was launched)"),
            },
            Error::Cuda { call, code, rank } => match rank {
                Some(r) => write!(f, "CUDA call {call} failed on rank {r} with {code}"),
                None => write!(f, "CUDA call {call} failed with {code}"),
            },
            Error::Kernel { reason } => write!(f, "ringccl's kernels cannot run here: {reason}"),
            Error::Config {
                variable,
                value,
                reason,
            } => write!(
                f,
                "{variable}={value:?} is not understood: {reason}; fix or unset it"
            ),
            Error::Internal { reason } => write!(
                f,
                "internal error in ringccl: {reason}; please report this message"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// ringccl's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An [`Error::InvalidArgument`] for `rank`.
    pub(crate) fn invalid(rank: Option<usize>, arg: Arg, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            rank,
            arg,
            reason: reason.into(),
        }
    }

    /// An [`Error::Cuda`] from a cudarc driver error.
    pub(crate) fn cuda(
        call: &'static str,
        rank: Option<usize>,
        e: cudarc::driver::DriverError,
    ) -> Self {
        Error::Cuda {
            call,
            code: format!("{:?}", e.0),
            rank,
        }
    }
}
