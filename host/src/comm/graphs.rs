//! CUDA graphs that captured a communicator's calls: they keep its device resources alive, past
//! its drop if need be.

use std::sync::Arc;

use super::{Communicator, Kind};
use crate::driver::graph::{keep_alive_in_graph, Capture};
use crate::Result;

impl Communicator {
    /// How many references CUDA graphs hold to communicators' device resources in this
    /// process: one per captured call, dropped when the last graph or executable graph that
    /// contains the call is destroyed and its launches have finished. A dropped communicator's
    /// resources are freed when the last reference to them goes. A diagnostic: 0 when no graph
    /// that captured a ringccl call exists.
    ///
    /// ```
    /// // Nothing has been captured in this process.
    /// assert_eq!(ringccl::Communicator::held_by_graphs(), 0);
    /// ```
    pub fn held_by_graphs() -> usize {
        crate::driver::graph::held_by_graphs()
    }

    /// Gives the graph being captured (`capture`) a reference to this communicator's device
    /// resources, so that they outlive the graph's replays even if the communicator is dropped
    /// first. Called once per captured call, before anything of it is enqueued.
    pub(crate) fn keep_alive_in(&self, capture: &Capture) -> Result<()> {
        // SAFETY: `capture` was read from the call's streams just before (`exec::capture`),
        // in the caller's thread, which is inside the call: the capture is still in progress.
        unsafe { keep_alive_in_graph(capture.graph, Arc::clone(&self.graphs)) }
    }

    /// On drop, once no work of this communicator's own is left: if CUDA graphs that captured
    /// its calls still exist, moves the device resources they use (kernels, flags, scratch,
    /// events, control block, streams; a rank of a job of processes also its windows: its own
    /// exported flag area and scratch, its mappings of the peers', and the scratch buffers
    /// kept after growths) to the hold they share, to be freed with the last one. The windows
    /// are released then by the rule the drop set ([`crate::transport::ipc::Release`]): after
    /// a failure, what the peers mapped is still leaked.
    pub(super) fn hand_over_to_graphs(&mut self) {
        if Arc::strong_count(&self.graphs) == 1 {
            return;
        }
        let state = std::mem::take(&mut *self.state.get_mut().unwrap_or_else(|p| p.into_inner()));
        let windows = match &mut self.kind {
            Kind::Process(p) => {
                let st = p.state.get_mut().unwrap_or_else(|e| e.into_inner());
                Some(st.windows.detach())
            }
            Kind::Local { .. } => None,
        };
        // Dropped in this order when the last graph goes: the windows first (their drop frees
        // device memory of the rank's context, which the resources keep alive).
        let remains = (
            windows,
            std::mem::take(&mut self.ranks),
            std::mem::take(&mut self.streams),
            state,
            Arc::clone(&self.health),
        );
        self.graphs.hold(Box::new(remains));
    }
}
