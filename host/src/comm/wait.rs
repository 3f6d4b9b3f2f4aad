//! Waiting for a communicator's work, aborting it, and the first error of its work.

use std::time::Duration;

use super::Communicator;
use crate::resources::{poll_until, Probe};
use crate::{Error, Result};

/// How long the communicator's drop waits for its work after an abort or a failure (the
/// device waits end within microseconds of the abort; only work of the caller's own on the
/// streams can take longer). Past it, the communicator's memory is leaked rather than freed
/// under a running kernel.
pub(super) const DRAIN_AFTER_ABORT: Duration = Duration::from_secs(10);

impl Communicator {
    /// Blocks until every call issued so far through this communicator is complete, on the
    /// caller's streams as well as on the communicator's own streams; at most
    /// [`Config::timeout`] (then [`Error::Timeout`]; the communicator stays usable). Polls with
    /// growing sleeps rather than spinning. A device-side wait that gave up (a peer that never
    /// came), a fault on a rank's GPU, or an earlier failure is returned as an error (and the
    /// communicator is failed: see [`Communicator::async_error`]).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// comm.synchronize()?;
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.wait_idle(self.config.timeout)
    }

    /// [`Communicator::synchronize`] with its own limit: waits at most `limit` for every call
    /// issued so far, then returns [`Error::Timeout`] naming the first rank whose work has not
    /// finished (nothing is aborted: call [`Communicator::abort`] to give up on the work).
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// match comm.synchronize_timeout(std::time::Duration::from_secs(5)) {
    ///     Ok(()) => {}
    ///     Err(ringccl::Error::Timeout { rank, .. }) => {
    ///         eprintln!("rank {rank:?} is not done after 5 s; giving up");
    ///         comm.abort()?;
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn synchronize_timeout(&self, limit: Duration) -> Result<()> {
        self.wait_idle(Some(limit))
    }

    /// The first error of this communicator's work that the host has not been told about
    /// through a call's return, without waiting (like `ncclCommGetAsyncError`): a device-side
    /// wait that timed out (a peer that never came: [`Error::Timeout`]), a fault on a rank's GPU
    /// ([`Error::Cuda`]), an earlier failure or an abort ([`Error::Aborted`], or the failure
    /// itself). `None` while everything is fine (work may still be running). Any error marks
    /// the communicator failed: its enqueued device waits end and later calls are refused.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// if let Some(e) = comm.async_error() {
    ///     eprintln!("the communicator failed: {e}");
    /// }
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn async_error(&self) -> Option<Error> {
        if let Some(e) = self.health.failure() {
            return Some(e);
        }
        if let Some(e) = self.health.device_status() {
            self.health.fail(e.clone());
            return Some(e);
        }
        if let Err(e) = self.pending_rank() {
            self.health.fail(e.clone());
            return Some(e);
        }
        None
    }

    /// Aborts the communicator (like `ncclCommAbort`, without freeing it): every rank's device
    /// waits, enqueued or running, end at once (their kernels skip the rest of their work), and
    /// every later call returns [`Error::Aborted`]. Then waits, at most [`Config::timeout`] (10 s
    /// if none), for the enqueued work to drain, so the communicator can be dropped without
    /// waiting; `Err(Error::Timeout)` if some rank's stream is still busy (with work of the
    /// caller's own: ringccl's work ends within microseconds of the abort). May be called from
    /// any thread, also while another thread is in a call or in `synchronize`. The results of
    /// aborted calls are undefined; the buffers stay valid.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// comm.abort()?;
    /// assert!(matches!(comm.synchronize(), Err(ringccl::Error::Aborted { .. })));
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    pub fn abort(&self) -> Result<()> {
        self.health.fail(Error::Aborted {
            reason: crate::resources::CALLER_ABORT.into(),
        });
        let limit = self.config.timeout.unwrap_or(DRAIN_AFTER_ABORT);
        // A rank whose context died runs nothing any more: count it as drained.
        let drained = || {
            Ok(match self.pending_rank() {
                Ok(Some(_)) => None,
                _ => Some(()),
            })
        };
        match poll_until(Some(limit), drained) {
            Ok(Some(())) => Ok(()),
            _ => Err(Error::Timeout {
                rank: self.pending_rank().ok().flatten(),
                peer: None,
                what: "draining the work of an aborted communicator".into(),
            }),
        }
    }

    /// Waits until no rank has pending work (see [`Communicator::synchronize`]).
    fn wait_idle(&self, limit: Option<Duration>) -> Result<()> {
        let done = poll_until(limit, || {
            // The first failure (it names its cause), then what the kernels reported.
            if let Some(e) = self.health.failure() {
                return Err(e);
            }
            if let Some(e) = self.health.device_status() {
                return Err(e);
            }
            Ok(self.pending_rank()?.is_none().then_some(()))
        });
        match done {
            Ok(Some(())) => Ok(()),
            Ok(None) => Err(Error::Timeout {
                rank: self.pending_rank().ok().flatten(),
                peer: None,
                what: format!(
                    "synchronize: the rank's work did not finish within {:?}",
                    limit.unwrap_or_default()
                ),
            }),
            Err(e) => {
                self.health.fail(e.clone());
                Err(e)
            }
        }
    }

    /// The first rank whose work has not finished (the end of its last call, the
    /// communicator's own stream), `None` if all are done; a CUDA error of any rank's context
    /// first (every rank is queried: a dead GPU is named even while another rank still waits).
    pub(super) fn pending_rank(&self) -> Result<Option<usize>> {
        // Called from any thread (`ncclCommGetAsyncError` from PyTorch's watchdog): its queries
        // must not fail, nor invalidate, another thread's capture in the global mode.
        let _relaxed = crate::driver::graph::relaxed_capture_mode();
        let mut pending = None;
        {
            let state = self.lock_state();
            for ((rank, st), &r) in self.ranks.iter().zip(state.iter()).zip(&self.local) {
                let probe = Probe {
                    rank: r,
                    event: st.end.cu_event(),
                    stream: Some(rank.stream.cu_stream()),
                };
                if !probe.check()? {
                    pending.get_or_insert(r);
                }
            }
        }
        if let Some(p) = self.process() {
            let done = p
                .lock()
                .order
                .end()
                .try_is_complete()
                .map_err(|e| Error::cuda("cuEventQuery", Some(p.rank), e))?;
            if !done && pending.is_none() {
                pending = Some(p.rank);
            }
        }
        Ok(pending)
    }

    /// Test hook (fault injection): the next kernel launch on `rank` by a one-shot all-reduce
    /// fails as if `cuLaunchKernel` had, after the ranks before it were launched.
    ///
    /// ```no_run
    /// # let comm = ringccl::Communicator::all()?;
    /// comm.inject_launch_failure(1);
    /// # Ok::<(), ringccl::Error>(())
    /// ```
    #[cfg(feature = "internals")]
    pub fn inject_launch_failure(&self, rank: usize) {
        self.health.inject_launch_failure(rank);
    }
}
