//! The one-shot all-reduce: one block per rank reads every rank's input over NVLink and folds it
//! into its own output, with a device-side barrier instead of host events (the flag arrays,
//! the barrier and the control block are in [`crate::ctl`]).
//!
//! Each rank owns a flag array of [`FLAG_WORDS`] `u64` in its own memory (layout in
//! [`crate::ctl`]). One call, epoch `e = counter + 1` (the same on every rank: every rank runs
//! the same sequence of one-shot kernels):
//! 1. **arrive**: thread `t < nranks, t != rank` first stores `publish[t]` (the address, in rank
//!    `t`'s process, of this rank's input: its registered buffer as `t` mapped it, or 0 for
//!    "my scratch") into word [`PUBLISHED`]` + rank` of rank `t`'s flags, then release-stores `e` (system scope) into word
//!    `2 * rank` of rank `t`'s flags, then waits until word `2 * t` of my flags is `≥ e`
//!    (acquire, system scope); a thread whose wait gives up writes `e` into word [`FAILED`];
//!    `bar.sync`, after which every thread reads whether any wait failed, and takes rank `q`'s
//!    source from word [`PUBLISHED`]` + q` of its own flags where it is not 0 (zero-copy: the
//!    peer's registered input, read in place), else `s{q}`.
//! 2. **compute** (only if every wait succeeded): the whole block folds the `nranks` inputs in
//!    rank order `0..n` (the same on every rank, so all ranks' results are bit-identical) into
//!    `dst`, or into `tmp` when the call is in place (my input is my output, and peers are still
//!    reading it).
//! 3. **depart** (likewise): `bar.sync`; thread `t` release-stores `e` into word `2 * rank + 1`
//!    of rank `t`'s flags, then waits until word `2 * t + 1` of mine is `≥ e`; `bar.sync` and the
//!    failure check again. After this
//!    no peer reads my input any more, so the caller may overwrite it once the kernel is done.
//! 4. in place only (and only if every wait succeeded): copy `tmp` to `dst`. Thread 0 stores `e`
//!    into the counter.
//!
//! Flags only grow, so nothing is ever cleared.
//!
//! The two-shot kernel and the control block, once in this module, are [`crate::twoshot`] and
//! [`crate::ctl`]; their items are re-exported here under their old paths.

pub use crate::ctl::{
    status, COUNTER, CTL_ABORT, CTL_STATUS, CTL_WORDS, FAILED, FLAG_WORDS, MAX_RANKS, PUBLISHED,
    SPIN_POLLS, WAIT_ENTRY,
};
pub use crate::twoshot::{two_shot_slice, what, MAX_TWO_SHOT_BLOCKS, TWO_SHOT_FLAG_WORDS};

/// Whether the one-shot kernel for `dtype` and `op` reads the sources its peers publish
/// ([`PUBLISHED`]: zero-copy inputs): every pair but the fp8 averages, whose kernels would
/// then spill registers on sm_90 (their peers' inputs are always staged; the host checks this
/// before it publishes anything).
///
/// ```
/// use gpu_kernels::{oneshot::reads_published, op::RedOp, DataType};
/// assert!(reads_published(DataType::F32, RedOp::Avg));
/// assert!(!reads_published(DataType::F8E4M3, RedOp::Avg));
/// ```
pub const fn reads_published(dtype: crate::DataType, op: crate::op::RedOp) -> bool {
    !(matches!(op, crate::op::RedOp::Avg)
        && matches!(dtype, crate::DataType::F8E4M3 | crate::DataType::F8E5M2))
}

#[cfg(target_arch = "nvptx64")]
mod dev {
    use crate::ctl::{
        fence_sys, meet, pick, published, store_relaxed, COUNTER, MAX_RANKS, PUBLISHED,
    };
    use crate::element::Element;
    use crate::op::{ReduceOp, Sum};
    use crate::prim::{reduce_copy, Grid};
    use core::arch::nvptx::{_block_dim_x, _syncthreads, _thread_idx_x};

    /// The kernel body of `ringccl_oneshot_{op}_{ty}` (see the module docs).
    ///
    /// # Safety
    /// One block per rank, at least `nsrc` threads, every rank launched with the same `nsrc`
    /// and `count`; the first `nsrc` sources (rank order) readable for `count` elements, `dst`
    /// writable for `count`; `tmp` null (out of place) or writable for `count` and not
    /// overlapping anything else (in place: `dst == srcs[rank]`); `flags[0..nsrc]` every rank's
    /// flag array (`flags[rank] == my_flags`), all accessible from this GPU;
    /// `rank < nsrc ≤ MAX_RANKS`; `ctl` the control block (see the module docs); `stage` null or
    /// this rank's input (`count` elements, copied into `srcs[rank]` before the barrier: ranks
    /// in other processes read the copy); `publish[q]` (`q != rank`) 0 or the address in rank
    /// `q`'s process of this rank's input (`count` elements, readable there until this rank's
    /// depart), every rank's flag array with [`PUBLISHED`] words that only this kernel writes.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce<T: Element, O: ReduceOp>(
        srcs: [*const T; MAX_RANKS],
        nsrc: usize,
        dst: *mut T,
        tmp: *mut T,
        count: usize,
        postdiv: u32,
        my_flags: *mut u64,
        flags: [*mut u64; MAX_RANKS],
        rank: usize,
        ctl: *mut u64,
        timeout_ns: u64,
        stage: *const T,
        publish: [u64; MAX_RANKS],
    ) {
        // SAFETY: reading special registers has no side effects.
        let (tid, threads) = unsafe { (_thread_idx_x() as usize, _block_dim_x() as usize) };
        let grid = Grid {
            thread: tid,
            threads,
        };
        // SAFETY (whole body): pointers per this function's contract; the counter is written
        // only by thread 0 after the last barrier, when every thread has read it.
        unsafe {
            let epoch = core::ptr::read_volatile(my_flags.add(COUNTER)).wrapping_add(1);
            let peer = tid < nsrc && tid < MAX_RANKS && tid != rank;
            let theirs = pick(flags, tid);

            // 0. Staged: my input first goes where the peers read it (`srcs[rank]`).
            if !stage.is_null() {
                let mine = pick(srcs, rank) as *mut T;
                reduce_copy::<T, Sum, 1>(grid, [stage], 1, mine, core::ptr::null_mut(), count, 1);
                fence_sys();
                _syncthreads();
            }

            // 1. Arrive: tell each peer where it reads my input (before the arrive flag's
            // release); my input is ready; wait until every peer's is.
            let zero_copy = super::reads_published(T::DTYPE, O::KIND);
            if zero_copy && peer {
                store_relaxed(theirs.add(PUBLISHED + rank), pick(publish, tid));
            }
            let pair = (theirs, my_flags);
            let failed = meet(peer, pair, 0, epoch, ctl, timeout_ns, rank, tid);
            let srcs = if zero_copy {
                published(srcs, my_flags, nsrc, rank)
            } else {
                srcs
            };

            // 2. Compute, in rank order (not after a failed wait: a peer's input may not be
            // ready, and the call has failed anyway).
            let out = if tmp.is_null() { dst } else { tmp };
            if !failed {
                reduce_copy::<T, O, MAX_RANKS>(
                    grid,
                    srcs,
                    nsrc,
                    out,
                    core::ptr::null_mut(),
                    count,
                    postdiv,
                );
            }

            // 3. Depart: I am done reading your inputs; wait until everyone is done with mine.
            _syncthreads();
            let failed = meet(peer && !failed, pair, 1, epoch, ctl, timeout_ns, rank, tid);

            // 4. In place: nobody reads my input any more; overwrite it with the result.
            if !tmp.is_null() && !failed {
                reduce_copy::<T, Sum, 1>(
                    grid,
                    [tmp as *const T],
                    1,
                    dst,
                    core::ptr::null_mut(),
                    count,
                    1,
                );
            }
            if tid == 0 {
                core::ptr::write_volatile(my_flags.add(COUNTER), epoch);
            }
        }
    }
}

#[cfg(target_arch = "nvptx64")]
pub(crate) use dev::all_reduce;
