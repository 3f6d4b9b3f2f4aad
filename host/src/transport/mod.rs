//! How a rank's kernels reach another rank's memory: the seam where each way of moving bytes
//! between GPUs is added.
//!
//! Today, in one process:
//! * [`Path::Direct`]: peer access (`cuCtxEnablePeerAccess`, over NVLink or PCIe). The kernels
//!   read and write the peer's memory with plain loads and stores;
//! * [`Path::Staged`]: no peer access (unsupported, refused, or `RINGCCL_P2P_DISABLE=1`). The
//!   executor copies a peer's source into a staging area of the running rank's scratch with
//!   `cuMemcpyPeerAsync` before the kernel ([`Transport::stage_in`]), and a destination on the
//!   peer is written to staging and copied out after it ([`Transport::stage_out`]).
//!
//! Between processes ([`ipc`]): each rank's scratch and flag area are exported once with CUDA
//! IPC and mapped by its peers ([`ipc::Windows`]); kernels then read and write a peer's scratch
//! like their own memory. Only scratch is reachable there, which the schedules for processes
//! respect (`crate::schedule::through_scratch`).
//!
//! Across the network ([`net`]): the same slots and counters in this rank's host memory, carried
//! to the peer by a proxy thread over UCX (loaded at run time).
//!
//! The executors ask only [`Transport::path`], the two staged copies, and the windows'
//! addresses; a new transport (copy engines, a network) adds a path here rather than changing
//! the executors.

pub mod ipc;
pub mod net;
pub mod registry;
pub mod room;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::config::DebugLevel;
use crate::debug::report;
use crate::driver;
use crate::schedule::{Region, Schedule, Step};
use crate::Result;

/// Staging slots and the start of the staging area are aligned to this many bytes.
pub const STAGE_ALIGN: usize = 256;

/// How the rank running a step reaches the memory of a region's rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Its own memory.
    Local,
    /// Another rank's memory, with peer access.
    Direct,
    /// Another rank's memory, through staged copies.
    Staged,
}

/// Which rank reaches which directly: the peer-access matrix of a communicator, fixed at
/// creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transport {
    n: usize,
    /// `direct[a * n + b]`: rank `a`'s kernels access rank `b`'s memory directly.
    direct: Vec<bool>,
}

impl Transport {
    /// Enables peer access between every pair of ranks that supports it, unless `disable`. A
    /// pair the driver calls capable but that refuses (e.g. too many peers) falls back to
    /// staged copies, with a warning, rather than failing.
    pub fn connect(
        ctxs: &[Arc<CudaContext>],
        disable: bool,
        debug: DebugLevel,
    ) -> Result<Transport> {
        let n = ctxs.len();
        let mut direct = vec![false; n * n];
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    direct[a * n + b] = true;
                    continue;
                }
                if disable || !driver::can_access_peer(ctxs[a].ordinal(), ctxs[b].ordinal())? {
                    continue;
                }
                match driver::enable_peer_access(&ctxs[a], &ctxs[b]) {
                    Ok(()) => direct[a * n + b] = true,
                    Err(e) => report!(
                        debug,
                        Warn,
                        "rank {a} cannot access rank {b}'s memory directly ({e}); using staged copies"
                    ),
                }
            }
        }
        Ok(Transport { n, direct })
    }

    /// A transport of `n` ranks with the given matrix (row-major, `direct[a * n + b]`).
    #[cfg(test)]
    pub fn from_matrix(n: usize, direct: Vec<bool>) -> Transport {
        Transport { n, direct }
    }

    /// Whether rank `a` accesses rank `b`'s memory directly (true for `a == b`; false out of
    /// range).
    pub fn direct(&self, a: usize, b: usize) -> bool {
        a < self.n && b < self.n && self.direct[a * self.n + b]
    }

    /// Whether every rank accesses every other rank's memory directly.
    pub fn all_direct(&self) -> bool {
        self.direct.iter().all(|&d| d)
    }

    /// How rank `exec` reaches rank `owner`'s memory.
    pub fn path(&self, exec: usize, owner: usize) -> Path {
        if exec == owner {
            Path::Local
        } else if self.direct(exec, owner) {
            Path::Direct
        } else {
            Path::Staged
        }
    }

    /// Bytes of staging one step needs on its running rank.
    fn step_staging(&self, step: &Step, elem_size: usize) -> usize {
        step.srcs
            .iter()
            .chain(&step.dsts)
            .filter(|r| self.path(step.exec, r.rank) == Path::Staged)
            .map(|r| round_up(r.len * elem_size, STAGE_ALIGN))
            .sum()
    }

    /// For each rank, the staging bytes its steps of `s` need (the maximum over its steps:
    /// steps on one stream reuse the same area one after the other).
    pub fn staging_bytes(&self, s: &Schedule, elem_size: usize) -> Vec<usize> {
        let mut out = vec![0; s.nranks];
        for step in &s.steps {
            if let Some(slot) = out.get_mut(step.exec) {
                *slot = (*slot).max(self.step_staging(step, elem_size));
            }
        }
        out
    }

    /// Copies `bytes` bytes of a peer's memory (`src` on `src_ctx`'s device) into staging
    /// (`stage` on the stream's device), on `stream`.
    ///
    /// # Safety
    /// Both ranges are live device memory of their contexts until the copy has run.
    pub unsafe fn stage_in(
        stream: &CudaStream,
        stage: u64,
        src_ctx: &CudaContext,
        src: u64,
        bytes: usize,
        rank: usize,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { driver::memcpy_peer_async(stream, stream.context(), stage, src_ctx, src, bytes, Some(rank)) }
    }

    /// Copies `bytes` bytes from staging (`stage` on the stream's device) to a peer's memory
    /// (`dst` on `dst_ctx`'s device), on `stream`.
    ///
    /// # Safety
    /// As for [`Transport::stage_in`].
    pub unsafe fn stage_out(
        stream: &CudaStream,
        dst_ctx: &CudaContext,
        dst: u64,
        stage: u64,
        bytes: usize,
        rank: usize,
    ) -> Result<()> {
        // SAFETY: forwarded.
        unsafe { driver::memcpy_peer_async(stream, dst_ctx, dst, stream.context(), stage, bytes, Some(rank)) }
    }
}

/// Where staging starts in a rank's scratch: after the schedule's own scratch elements.
pub fn staging_offset(s: &Schedule, elem_size: usize) -> usize {
    round_up(s.scratch_len * elem_size, STAGE_ALIGN)
}

/// Whether `region`, touched by a step running on `exec`, is staged.
pub fn is_staged(t: &Transport, region: &Region, exec: usize) -> bool {
    t.path(exec, region.rank) == Path::Staged
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to).saturating_mul(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::BufId;

    fn two_rank_schedule() -> Schedule {
        use BufId::*;
        let reg = Region::new;
        let step = |exec, srcs, dsts| Step {
            exec,
            srcs,
            dsts,
            finish: false,
            deps: vec![],
        };
        Schedule {
            nranks: 2,
            steps: vec![
                step(0, vec![reg(0, Send, 0, 4), reg(1, Send, 0, 4)], vec![reg(0, Recv, 0, 4), reg(1, Recv, 0, 4)]),
                step(1, vec![reg(0, Send, 4, 4), reg(1, Send, 4, 4)], vec![reg(1, Recv, 4, 4), reg(0, Recv, 4, 4)]),
                step(0, vec![reg(0, Recv, 4, 4)], vec![reg(0, Scratch, 0, 4)]),
            ],
            scratch_len: 8,
            start_waits: vec![vec![1], vec![0]],
            end_waits: vec![vec![1], vec![0]],
        }
    }

    #[test]
    fn paths_follow_the_matrix() {
        let t = Transport::from_matrix(2, vec![true, false, true, true]);
        assert_eq!(t.path(0, 0), Path::Local);
        assert_eq!(t.path(0, 1), Path::Staged);
        assert_eq!(t.path(1, 0), Path::Direct);
        assert!(!t.all_direct());
        assert!(!t.direct(0, 2) && !t.direct(5, 0));
        assert!(Transport::from_matrix(2, vec![true; 4]).all_direct());
    }

    #[test]
    fn staging_only_between_ranks_without_peer_access() {
        let s = two_rank_schedule();
        let all = Transport::from_matrix(2, vec![true; 4]);
        let none = Transport::from_matrix(2, vec![true, false, false, true]);
        let one_way = Transport::from_matrix(2, vec![true, false, true, true]);
        assert_eq!(all.staging_bytes(&s, 4), vec![0, 0]);
        // Step 0 on rank 0 stages 1 source and 1 destination of 16 B (256 B slots each).
        assert_eq!(none.staging_bytes(&s, 4), vec![512, 512]);
        // Only rank 1 may access rank 0.
        assert_eq!(one_way.staging_bytes(&s, 4), vec![512, 0]);
        // Larger elements: 100 elements of 8 B need 1024 B per slot.
        let mut big = s.clone();
        for st in &mut big.steps {
            for r in st.srcs.iter_mut().chain(st.dsts.iter_mut()) {
                r.len = 100;
            }
        }
        assert_eq!(none.staging_bytes(&big, 8), vec![2048, 2048]);
    }

    #[test]
    fn staging_starts_after_aligned_scratch() {
        let mut s = two_rank_schedule();
        assert_eq!(staging_offset(&s, 4), 256);
        s.scratch_len = 0;
        assert_eq!(staging_offset(&s, 4), 0);
        s.scratch_len = 65;
        assert_eq!(staging_offset(&s, 4), 512);
    }
}
