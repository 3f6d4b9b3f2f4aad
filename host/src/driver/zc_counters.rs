#![cfg_attr(not(feature = "internals"), allow(dead_code))]
//! Counters of the driver work that zero-copy registration saves or costs, in this process:
//! relaxed atomics, incremented where the work is enqueued or done, read by tests (feature
//! `internals`) to show that a call on a registered buffer stages nothing.
//!
//! ```
//! use ringccl::internals::driver::zc_counters::{snapshot, Counters};
//! let before = snapshot();
//! // ... calls ...
//! let spent: Counters = snapshot().since(&before);
//! assert_eq!(spent.staged_inputs, 0);
//! ```

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

static STAGED_INPUTS: AtomicU64 = AtomicU64::new(0);
static ZERO_COPY_INPUTS: AtomicU64 = AtomicU64::new(0);
static POINTER_QUERIES: AtomicU64 = AtomicU64::new(0);
static IPC_OPENS: AtomicU64 = AtomicU64::new(0);
static ZERO_COPY_RECEIVES: AtomicU64 = AtomicU64::new(0);
static STAGED_RECEIVES: AtomicU64 = AtomicU64::new(0);

/// What was counted since the process started (or between two snapshots: [`Counters::since`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Calls among processes whose one-shot or two-shot kernel copied this rank's input into
    /// the scratch (in the kernel or with `cuMemcpyDtoDAsync` before it).
    pub staged_inputs: u64,
    /// One-shot calls among processes whose input the peers read in place (registered).
    pub zero_copy_inputs: u64,
    /// `cuPointerGetAttribute` / `cuMemGetAddressRange` queries made by the registration code
    /// (at registration, and per call only for a buffer inside a registered range).
    pub pointer_queries: u64,
    /// `cuIpcOpenMemHandle` calls made for registered buffers.
    pub ipc_opens: u64,
    /// Posted point-to-point receive buffers (in a communicator with registrations, more than
    /// `gpu_kernels::p2p::LL_MAX_BYTES`) inside a registered allocation: the sender writes
    /// them directly.
    pub zero_copy_receives: u64,
    /// Posted point-to-point receive buffers outside any usable registration: staged.
    pub staged_receives: u64,
}

impl Counters {
    /// What was counted between `before` and `self`.
    pub fn since(&self, before: &Counters) -> Counters {
        Counters {
            staged_inputs: self.staged_inputs.wrapping_sub(before.staged_inputs),
            zero_copy_inputs: self.zero_copy_inputs.wrapping_sub(before.zero_copy_inputs),
            pointer_queries: self.pointer_queries.wrapping_sub(before.pointer_queries),
            ipc_opens: self.ipc_opens.wrapping_sub(before.ipc_opens),
            zero_copy_receives: self.zero_copy_receives.wrapping_sub(before.zero_copy_receives),
            staged_receives: self.staged_receives.wrapping_sub(before.staged_receives),
        }
    }
}

/// The counters now.
pub fn snapshot() -> Counters {
    Counters {
        staged_inputs: STAGED_INPUTS.load(Relaxed),
        zero_copy_inputs: ZERO_COPY_INPUTS.load(Relaxed),
        pointer_queries: POINTER_QUERIES.load(Relaxed),
        ipc_opens: IPC_OPENS.load(Relaxed),
        zero_copy_receives: ZERO_COPY_RECEIVES.load(Relaxed),
        staged_receives: STAGED_RECEIVES.load(Relaxed),
    }
}

pub(crate) fn staged_input() {
    STAGED_INPUTS.fetch_add(1, Relaxed);
}

pub(crate) fn zero_copy_input() {
    ZERO_COPY_INPUTS.fetch_add(1, Relaxed);
}

pub(crate) fn pointer_query() {
    POINTER_QUERIES.fetch_add(1, Relaxed);
}

pub(crate) fn ipc_open() {
    IPC_OPENS.fetch_add(1, Relaxed);
}

pub(crate) fn zero_copy_receive() {
    ZERO_COPY_RECEIVES.fetch_add(1, Relaxed);
}

pub(crate) fn staged_receive() {
    STAGED_RECEIVES.fetch_add(1, Relaxed);
}
