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
    /// The reduction operator (a PreMulSum's scalar: its type, its device address, how many).
    Op,
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
    /// The bootstrap of ranks in several processes (the rendezvous that
    /// [`UniqueId`](crate::UniqueId) names, the TCP connections between the ranks, or an
    /// exchange over them) failed. Every rank waiting on the same world gets one within its
    /// timeout.
    Bootstrap {
        /// The rank that reports it (`None`: before a rank is known, e.g. a malformed id).
        rank: Option<usize>,
        /// What kind of failure.
        failure: BootstrapFailure,
        /// What was seen: addresses, ranks, the peer's own message.
        detail: String,
    },
    /// A wait did not end in time: a device-side wait for a peer's signal (the peer never
    /// arrived within [`Config::timeout`](crate::Config::timeout): its process died, it is
    /// stuck, or it did not make the same call), or a host wait
    /// ([`Communicator::synchronize_timeout`](crate::Communicator::synchronize_timeout)). After a
    /// device-side timeout the communicator is failed: every later call returns
    /// [`Error::Aborted`].
    Timeout {
        /// The rank whose wait gave up (or whose work had not finished), where known.
        rank: Option<usize>,
        /// The rank it waited for, where known.
        peer: Option<usize>,
        /// What waited.
        what: String,
    },
    /// The communicator was aborted ([`Communicator::abort`](crate::Communicator::abort)) or
    /// failed earlier (the first failure is in `reason`): it runs no more calls. Drop it and
    /// make a new one.
    Aborted {
        /// Why: "aborted by the caller", or the first failure.
        reason: String,
    },
    /// A call failed after part of its work was already enqueued on some ranks' streams (the
    /// other ranks got none): the communicator is failed (later calls return
    /// [`Error::Aborted`]), its enqueued device waits are released, and the buffers of the call
    /// hold no result.
    PartlyEnqueued {
        /// The ranks that got part of the work.
        enqueued: Vec<usize>,
        /// The failure that stopped the issue.
        cause: Box<Error>,
    },
    /// The network transport (UCX) failed: the library is missing, a UCX call failed (UCX's own
    /// text is kept), a peer was lost, or a wait on a network peer ran out of time.
    Network {
        /// The rank that reports it, where known.
        rank: Option<usize>,
        /// The peer involved, where known.
        peer: Option<usize>,
        /// What failed.
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
            Error::Bootstrap {
                rank,
                failure,
                detail,
            } => {
                match rank {
                    Some(r) => write!(f, "bootstrap failed on rank {r} ({failure}): ")?,
                    None => write!(f, "bootstrap failed ({failure}): ")?,
                }
                write!(f, "{detail}; {}", failure.advice())
            }
            Error::Timeout { rank, peer, what } => {
                match (rank, peer) {
                    (Some(r), Some(p)) => write!(f, "rank {r} timed out waiting for rank {p} ({what})")?,
                    (Some(r), None) => write!(f, "rank {r} timed out ({what})")?,
                    (None, Some(p)) => write!(f, "timed out waiting for rank {p} ({what})")?,
                    (None, None) => write!(f, "timed out ({what})")?,
                }
                write!(
                    f,
                    ": a rank is missing, stuck, dead or made another call; check every rank \
                     (or raise RINGCCL_TIMEOUT)"
                )
            }
            Error::Aborted { reason } => write!(
                f,
                "the communicator is aborted ({reason}); drop it and make a new one"
            ),
            Error::PartlyEnqueued { enqueued, cause } => write!(
                f,
                "a call failed after part of it was enqueued on rank(s) {enqueued:?}: {cause}; \
                 the communicator is aborted and the call's buffers hold no result"
            ),
            Error::Network { rank, peer, reason } => {
                write!(f, "network transport failed")?;
                if let Some(r) = rank {
                    write!(f, " on rank {r}")?;
                }
                if let Some(p) = peer {
                    write!(f, " with peer {p}")?;
                }
                write!(
                    f,
                    ": {reason}; check that every rank runs and that UCX reaches the others \
                     (UCX_TLS, UCX_NET_DEVICES)"
                )
            }
            Error::Internal { reason } => write!(
                f,
                "internal error in ringccl: {reason}; please report this message"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// What went wrong in a bootstrap ([`Error::Bootstrap`]).
///
/// ```
/// use ringccl::{BootstrapFailure, Error};
/// let e = Error::Bootstrap {
///     rank: Some(3),
///     failure: BootstrapFailure::DuplicateRank,
///     detail: "rank 3 joined twice".into(),
/// };
/// assert!(e.to_string().contains("distinct rank"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BootstrapFailure {
    /// Not every rank arrived (or answered) within the timeout.
    Timeout,
    /// A hello carried another world's key: a process of another job, or an id that is not
    /// this world's.
    WrongKey,
    /// A hello or an id of another ringccl protocol version.
    WrongVersion,
    /// Ranks disagree on the number of ranks.
    NranksMismatch,
    /// Two processes claimed the same rank.
    DuplicateRank,
    /// A rank outside `0..nranks`.
    RankOutOfRange,
    /// A rank (or the root) closed its connection before the bootstrap finished: its process
    /// exited or failed.
    PeerLost,
    /// A socket could not be opened, bound or connected (address, interface, firewall).
    Network,
    /// The bytes or text given as a [`UniqueId`](crate::UniqueId) are not one.
    InvalidId,
    /// A peer sent something that is not ringccl's bootstrap protocol, or the ranks called
    /// bootstrap operations in different orders.
    Protocol,
}

impl BootstrapFailure {
    /// What to do about it (the end of [`Error::Bootstrap`]'s message).
    fn advice(self) -> &'static str {
        match self {
            BootstrapFailure::Timeout => {
                "every rank must join with the same id within the timeout: check that every process started, that all can reach the root's address, or raise the timeout"
            }
            BootstrapFailure::WrongKey => {
                "pass every rank the same UniqueId (another job's process, or an id of another world, reached this one)"
            }
            BootstrapFailure::WrongVersion => "run the same ringccl version in every process",
            BootstrapFailure::NranksMismatch => {
                "every rank must pass the same number of ranks (WORLD_SIZE)"
            }
            BootstrapFailure::DuplicateRank => {
                "give every process a distinct rank in 0..nranks (RANK)"
            }
            BootstrapFailure::RankOutOfRange => {
                "ranks are 0..nranks-1: check RANK and WORLD_SIZE"
            }
            BootstrapFailure::PeerLost => {
                "a process of the job exited or lost its connection: look at that rank's own error or exit status, then restart the job"
            }
            BootstrapFailure::Network => {
                "check the address and port (RINGCCL_COMM_ID, MASTER_ADDR, MASTER_PORT), the network interface and firewalls"
            }
            BootstrapFailure::InvalidId => {
                "pass the 128 bytes or the text of an id made by UniqueId::new unchanged"
            }
            BootstrapFailure::Protocol => {
                "check that the address is this job's rendezvous and that every rank makes the same bootstrap calls in the same order"
            }
        }
    }
}

impl fmt::Display for BootstrapFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BootstrapFailure::Timeout => "timeout",
            BootstrapFailure::WrongKey => "wrong key",
            BootstrapFailure::WrongVersion => "wrong version",
            BootstrapFailure::NranksMismatch => "rank counts differ",
            BootstrapFailure::DuplicateRank => "duplicate rank",
            BootstrapFailure::RankOutOfRange => "rank out of range",
            BootstrapFailure::PeerLost => "peer lost",
            BootstrapFailure::Network => "network",
            BootstrapFailure::InvalidId => "invalid id",
            BootstrapFailure::Protocol => "protocol",
        })
    }
}

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

    /// The rank an error names, where it names one (the rank whose argument, device or wait
    /// failed; for [`Error::PartlyEnqueued`], its cause's).
    ///
    /// ```
    /// use ringccl::Error;
    /// let e = Error::Timeout { rank: Some(0), peer: Some(1), what: "a device wait".into() };
    /// assert_eq!(e.rank(), Some(0));
    /// assert_eq!(Error::NoDriver.rank(), None);
    /// ```
    pub fn rank(&self) -> Option<usize> {
        match self {
            Error::InvalidArgument { rank, .. }
            | Error::Cuda { rank, .. }
            | Error::Bootstrap { rank, .. }
            | Error::Timeout { rank, .. }
            | Error::Network { rank, .. } => *rank,
            Error::PartlyEnqueued { cause, .. } => cause.rank(),
            _ => None,
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
