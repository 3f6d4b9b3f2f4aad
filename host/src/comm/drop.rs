//! The drop of a communicator: it waits for the work first (and aborts it past the timeout),
//! or hands the device resources over to CUDA graphs that still use them.

use std::time::Duration;

use super::wait::DRAIN_AFTER_ABORT;
use super::{Communicator, Kind};
use crate::plan::PlanCache;
use crate::debug::report;
use crate::resources::poll_until;
use crate::transport::ipc::Release;
use crate::Error;

impl Communicator {
    /// A rank of a job of processes whose work has ended: decides what the drop of its windows
    /// frees ([`Release::at_drop`]), reporting leaked memory at warn level.
    fn settle_windows(&mut self) {
        let debug = self.config.debug;
        // `check` also counts a lost peer, or a device wait that gave up, that no call has
        // seen yet.
        let failed = self.health.check().is_err() || self.health.failure().is_some();
        if let Kind::Process(p) = &mut self.kind {
            let state = p.state.get_mut().unwrap_or_else(|e| e.into_inner());
            state.windows.set_release(Release::at_drop(failed, true), debug);
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Work of the last call may still run on the caller's streams and use the scratch, the
        // flags, the control block and the kernels' module: wait for it before they are freed,
        // at most the timeout. If it does not end, abort (every device wait ends) and wait a
        // little more; if it still does not end (work of the caller's own that never ends),
        // leak the memory rather than free it under a running kernel. Errors cannot be reported
        // from `drop`; cudarc records them in the context.
        //
        // A rank of a job of processes: its last call's end also means every peer is done with
        // this rank's scratch and flags (the call's end waits for the peers' last touches), so
        // the windows can be freed after it, but only if no call failed: after a failure (a
        // timeout, a lost peer, an abort) a live peer's kernels may still read or write them,
        // and freeing memory under a kernel is a fatal GPU fault (under MPS it ends every
        // process on the GPU). They are leaked then (`Release::at_drop`); the mappings of the
        // peers' buffers are closed once this rank's own work has ended.
        //
        // CUDA graphs that captured calls of this communicator and still exist keep its device
        // resources: they are handed over to them (`hand_over_to_graphs`) instead of freed.
        let idle = |c: &Self, limit| {
            poll_until(Some(limit), || match c.pending_rank() {
                Ok(None) => Ok(Some(true)),
                Ok(Some(_)) => Ok(None),
                // A dead context runs nothing any more.
                Err(_) => Ok(Some(true)),
            })
            .ok()
            .flatten()
            .is_some()
        };
        let failed = self.health.failure().is_some();
        let first = if failed {
            DRAIN_AFTER_ABORT
        } else {
            self.config.timeout.unwrap_or(Duration::MAX)
        };
        if idle(self, first) {
            self.settle_windows();
            self.hand_over_to_graphs();
            return;
        }
        if !failed {
            self.health.fail(Error::Aborted {
                reason: "dropped with work that did not finish".into(),
            });
            if idle(self, DRAIN_AFTER_ABORT) {
                self.settle_windows();
                self.hand_over_to_graphs();
                return;
            }
        }
        report!(
            self.config.debug,
            Warn,
            "the communicator's work did not finish after an abort: its device memory is leaked"
        );
        std::mem::forget(std::mem::take(&mut self.ranks));
        std::mem::forget(std::mem::take(&mut *self.state.get_mut().unwrap_or_else(|p| p.into_inner())));
        if let Kind::Process(_) = &self.kind {
            let local = Kind::Local {
                plans: PlanCache::default(),
                rank_threads: None,
            };
            std::mem::forget(std::mem::replace(&mut self.kind, local));
        }
        std::mem::forget(self.health.clone());
    }
}
