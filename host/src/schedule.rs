//! Ring schedules as pure data: which rank reads, reduces and writes which elements at which step.
//!
//! A [`Schedule`] is a list of [`Step`]s in an order that is safe to issue from the host (every
//! step comes after the steps it depends on). Each step is one primitive (copy, reduce or
//! reduce-copy, chosen from the number of sources and destinations) executed by the GPU of rank
//! `exec`, on that rank's stream. Sources and destinations are [`Region`]s of any rank's
//! buffers: a region on another rank is read or written directly over NVLink (peer access).
//!
//! Dependencies are derived, not written by hand: [`Schedule::finish`] compares the regions of
//! every pair of steps (read-after-write, write-after-read, write-after-write) and keeps, for each
//! step, the latest conflicting step of each *other* rank; steps of the same rank are ordered by
//! their stream. The executor turns those into event waits; the CPU simulator
//! ([`crate::sim`]) runs the same list on host arrays.
//!
//! Buffers are named per rank ([`BufId`]); in-place calls are described by [`Layout`], which
//! maps the send buffer onto the receive buffer, so aliasing is visible to the dependency pass.

/// A rank's buffers a step can touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufId {
    /// The caller's input.
    Send,
    /// The caller's output.
    Recv,
    /// The communicator's scratch space on that rank (for partial results).
    Scratch,
}

/// `len` elements at element `offset` of buffer `buf` on rank `rank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// Owner of the memory.
    pub rank: usize,
    /// Which of its buffers.
    pub buf: BufId,
    /// First element.
    pub offset: usize,
    /// Number of elements (equal across one step's regions).
    pub len: usize,
}

/// One primitive on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The rank whose GPU and stream run it.
    pub exec: usize,
    /// 1 source: copy; 2 sources: reduce-copy; 3..=8 sources: reduce (one destination).
    pub srcs: Vec<Region>,
    /// 1 or 2 destinations.
    pub dsts: Vec<Region>,
    /// Apply the operator's final step (avg's division by the rank count) to what is written.
    pub finish: bool,
    /// Indices of earlier steps on other ranks that must complete first (filled by
    /// [`Schedule::finish`]: at most one per other rank, the latest).
    pub deps: Vec<usize>,
}

/// How the send buffers relate to the receive buffers (NCCL's in-place conventions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Send and receive are distinct, non-overlapping buffers.
    OutOfPlace,
    /// The send buffer of every rank is the receive buffer starting at element
    /// `send_offset(rank)` = `rank * stride` (all-reduce, broadcast, reduce: stride 0;
    /// all-gather: stride = send count; reduce-scatter: the receive buffer lies in the send
    /// buffer, see [`Layout::RecvInSend`]).
    SendInRecv {
        /// Elements between consecutive ranks' send offsets.
        stride: usize,
    },
    /// The receive buffer of every rank is the send buffer starting at `rank * stride`
    /// (in-place reduce-scatter: recvbuff = sendbuff + rank * recvcount).
    RecvInSend {
        /// Elements between consecutive ranks' receive offsets.
        stride: usize,
    },
}

/// A complete collective as a list of steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Number of ranks.
    pub nranks: usize,
    /// The steps, in a safe issue order.
    pub steps: Vec<Step>,
    /// Scratch elements each rank needs (0 if none).
    pub scratch_len: usize,
    /// For each rank `r`, the ranks (other than `r`) that must have reached this call on their
    /// streams before any step touches their memory from `r`: filled by [`Schedule::finish`].
    pub start_waits: Vec<Vec<usize>>,
    /// For each rank `r`, the last step of each other rank that touched `r`'s memory; `r`'s
    /// stream waits for them at the end, so the call is complete on `r`'s stream when it is
    /// complete everywhere `r`'s buffers are concerned. Filled by [`Schedule::finish`].
    pub end_waits: Vec<Vec<usize>>,
}
