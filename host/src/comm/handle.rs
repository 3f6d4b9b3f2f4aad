//! The per-call handles: what the executors work through for one call, per kind of
//! communicator, with the per-call state locked for the call's issue.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::{Communicator, Kind, ProcessRank};
use crate::exec::process::ProcessCall;
use crate::exec::Handle;
use crate::resources::rank_threads::RankThreads;
use crate::resources::{Call, RankState};

impl Communicator {
    /// Whether the one-shot all-reduce may be used: peer access everywhere and no earlier
    /// one-shot call failed half-launched.
    pub(crate) fn oneshot_usable(&self) -> bool {
        self.process().is_none()
            && !self.launch_blocking
            && self.transport.all_direct()
            && !self.oneshot_broken.load(Ordering::Acquire)
    }

    /// Whether the copy-engine all-reduce can run: one process, direct peer access between
    /// every pair.
    pub(crate) fn copy_engine_usable(&self) -> bool {
        self.process().is_none() && self.transport.all_direct()
    }

    pub(super) fn lock_state(&self) -> MutexGuard<'_, Vec<RankState>> {
        // A panic while the lock was held cannot leave the state inconsistent in a way that
        // matters (events and scratch are only ever replaced whole), so recover from poisoning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host threads of the ranks, if this communicator has them.
    pub(crate) fn rank_threads(&self) -> Option<&RankThreads> {
        match &self.kind {
            Kind::Local { rank_threads, .. } => rank_threads.as_ref(),
            Kind::Process(_) => None,
        }
    }

    /// Locks the communicator for one call's issue: the handle an executor works through.
    pub(crate) fn begin_call(&self) -> Call<'_> {
        Call::new(
            &self.ranks,
            &self.transport,
            self.lock_state(),
            &self.oneshot_broken,
            &self.health,
        )
    }

    /// The per-call handle of this communicator's kind, locked for one call's issue
    /// (`capturing`: the streams are being captured into a CUDA graph).
    pub(crate) fn handle(&self, capturing: bool) -> Handle<'_> {
        match self.process() {
            None => Handle::Local {
                call: self.begin_call(),
                threads: self.rank_threads(),
                capturing,
            },
            Some(p) => Handle::Process {
                call: ProcessCall {
                    capturing,
                    ..self.process_call(p)
                },
                net: p.net.as_ref(),
            },
        }
    }

    /// The per-call handle of this rank of a job of processes, locked for one call's issue (an
    /// eager one: see [`ProcessCall::capturing`]).
    pub(crate) fn process_call<'a>(&'a self, p: &'a ProcessRank) -> ProcessCall<'a> {
        ProcessCall {
            me: self.resources(p.rank),
            state: p.lock(),
            memops: &p.memops,
            health: &self.health,
            exchange: &p.boot,
            capturing: false,
            zero_copy_reads: self.config().zero_copy_reads,
        }
    }
}
