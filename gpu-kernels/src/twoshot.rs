//! The two-shot all-reduce, and the other collectives on its barriers.
//!
//! For mid sizes one block per rank is too little bandwidth, and the event-ordered ring pays
//! host and cross-GPU event latency per step. The two-shot kernel ([`two_shot`], entry points
//! `ringccl_twoshot_{op}_{ty}`) is one kernel per rank of `B` blocks (the same `B` on every
//! rank, at most [`MAX_TWO_SHOT_BLOCKS`]). The count is cut into `nranks` shards and each shard
//! into `B` slices ([`two_shot_slice`], at 16-byte boundaries); block `b` of rank `r` owns
//! slice `b` of shard `r`. Each block runs the one-shot kernel's barrier ([`crate::oneshot`],
//! [`crate::ctl`]) with the same-numbered block of every peer, on a flag array of its own (block `b` uses words `b * FLAG_WORDS ..` of the
//! rank's two-shot flag region, so the blocks' epochs are independent):
//! 1. **arrive**: every rank's input (and output) is ready;
//! 2. **reduce and scatter**: fold slice `b` of shard `r` of every rank's input, in rank order,
//!    and write the result into that slice of every rank's output (its own, then each peer's);
//!    each element is computed once, so all ranks' results are bit-identical;
//! 3. **depart**: after a system-scope fence by every thread and `bar.sync`, tell every peer
//!    this slice is written (and its inputs read); wait until every peer's block `b` has said
//!    the same. Once every block has departed, every slice of this rank's output has been
//!    written and no peer reads its input any more.
//!
//! In place needs no staging: the slice a block writes into a rank's buffer is exactly the one
//! it read from it, and no other block of any rank reads it.
//!
//! # One kernel for the other collectives
//!
//! The same kernel, its barriers and its staging run five other collectives ([`what`]), each in
//! slices of `two_shot_slice(count, size, 1, 0, blocks, block)`:
//! * **reduce-scatter**: `count` is one rank's share and shard `q` is elements `q * count ..`
//!   of the inputs; block `b` of rank `r` folds slice `b` of shard `r` of every rank's input
//!   (rank order) into slice `b` of its own output;
//! * **all-gather**: block `b` of rank `r` copies slice `b` of its own input into slice `b` of
//!   shard `r` of every rank's output;
//! * **all-to-all**: block `b` of rank `r` copies slice `b` of block `q` of its own input into
//!   slice `b` of block `r` of rank `q`'s output, for every `q`;
//! * **broadcast**: block `b` of every rank copies slice `b` of the root's input (`srcs[root]`)
//!   into its own output (the root: unless that is its input, or absent);
//! * **reduce**: block `b` of the root folds slice `b` of every rank's input (rank order) into
//!   its output; the other ranks' blocks only meet it at the barriers.
//!
//! After the first barrier every peer's buffers are ready; after the second no peer reads
//! this rank's input or writes its output any more. In place (NCCL's layouts: the
//! reduce-scatter's output is shard `r` of its input, the all-gather's input is shard `r` of its
//! output, the root's buffers are one), a block writes only what it alone read.

use crate::ctl::FLAG_WORDS;

/// Most blocks of a two-shot kernel: each block has its own flag array of [`FLAG_WORDS`] words
/// in every rank's two-shot flag region ([`TWO_SHOT_FLAG_WORDS`] words).
pub const MAX_TWO_SHOT_BLOCKS: usize = 256;

/// `u64` words of a rank's two-shot flag region: one flag array per block.
pub const TWO_SHOT_FLAG_WORDS: usize = MAX_TWO_SHOT_BLOCKS * FLAG_WORDS;

/// Which collective a two-shot kernel runs (its `what` parameter; see the module docs, "One
/// kernel for the other collectives"). `count` is the length of the full buffers for
/// [`ALL_REDUCE`](what::ALL_REDUCE), [`BROADCAST`](what::BROADCAST) and
/// [`REDUCE`](what::REDUCE), and one rank's share (`recvcount`, `sendcount`, the count per
/// peer) for the others.
///
/// ```
/// use gpu_kernels::twoshot::what;
/// assert_eq!(what::ALL_REDUCE, 0);
/// assert!(what::REDUCE_SCATTER != what::ALL_GATHER);
/// ```
pub mod what {
    /// The all-reduce (reduce-scatter, then all-gather).
    pub const ALL_REDUCE: u32 = 0;
    /// The reduce-scatter: the first half alone.
    pub const REDUCE_SCATTER: u32 = 1;
    /// The all-gather: the second half alone.
    pub const ALL_GATHER: u32 = 2;
    /// The all-to-all: each rank writes block `q` of its input into block `rank` of rank `q`'s
    /// output.
    pub const ALL_TO_ALL: u32 = 3;
    /// The broadcast: every rank copies the root's input into its own output.
    pub const BROADCAST: u32 = 4;
    /// The reduce: the root folds every rank's input into its output.
    pub const REDUCE: u32 = 5;
}

/// Elements `[lo, hi)` that block `block` of `blocks` of rank `rank` (of `nranks`) owns in a
/// two-shot all-reduce of `count` elements of `size` bytes: the count in 16-byte units is cut
/// into `nranks` shards, each shard into `blocks` slices (both as evenly as whole units allow),
/// so every boundary but the last is 16-byte aligned. The slices of all ranks and blocks
/// partition `0..count`; a slice may be empty.
///
/// ```
/// use gpu_kernels::twoshot::two_shot_slice;
/// // 1000 f32 (250 units of 4), 2 ranks, 4 blocks: rank 1's shard is units 125..250.
/// assert_eq!(two_shot_slice(1000, 4, 2, 1, 4, 0), (500, 624));
/// assert_eq!(two_shot_slice(1000, 4, 2, 1, 4, 3), (872, 1000));
/// ```
#[inline(always)]
pub const fn two_shot_slice(
    count: usize,
    size: usize,
    nranks: usize,
    rank: usize,
    blocks: usize,
    block: usize,
) -> (usize, usize) {
    let per = if size == 0 || size >= 16 {
        1
    } else {
        16 / size
    };
    let units = count.div_ceil(per);
    let (nranks, blocks) = (
        if nranks == 0 { 1 } else { nranks },
        if blocks == 0 { 1 } else { blocks },
    );
    let shard_lo = units * rank / nranks;
    let shard = units * (rank + 1) / nranks - shard_lo;
    let lo = (shard_lo + shard * block / blocks) * per;
    let hi = (shard_lo + shard * (block + 1) / blocks) * per;
    (
        if lo < count { lo } else { count },
        if hi < count { hi } else { count },
    )
}

#[cfg(target_arch = "nvptx64")]
mod dev {
    use crate::ctl::{fence_sys, meet, pick, COUNTER, FLAG_WORDS, MAX_RANKS};
    use crate::element::Element;
    use crate::op::{ReduceOp, Sum};
    use crate::prim::{reduce_copy, Grid};
    use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _syncthreads, _thread_idx_x};

    /// Every source at element `at`, the first `nsrc` (the rest null).
    #[inline(always)]
    fn inputs_at<T>(srcs: [*const T; MAX_RANKS], nsrc: usize, at: usize) -> [*const T; MAX_RANKS] {
        let mut out = [core::ptr::null::<T>(); MAX_RANKS];
        let mut k = 0;
        while k < MAX_RANKS {
            if k < nsrc {
                out[k] = srcs[k].wrapping_add(at);
            }
            k += 1;
        }
        out
    }

    /// The last step of the two-shot kernel's second half: `len` elements at `own` (this rank's
    /// output at element `lo`, already written, like the next rank's) copied to element `lo` of
    /// every other rank's output, two at a time.
    ///
    /// # Safety
    /// As for [`reduce_copy`]: `own` readable and every destination writable for `len`
    /// elements at `lo`; every thread of the block calls this.
    #[inline(always)]
    unsafe fn fan_out<T: Element>(
        grid: Grid,
        own: *mut T,
        dsts: [*mut T; MAX_RANKS],
        rank: usize,
        nsrc: usize,
        lo: usize,
        len: usize,
    ) {
        if nsrc <= 2 {
            return;
        }
        // My writes of `own` are visible to the whole block after the barrier.
        _syncthreads();
        let mut k = 2;
        while k < nsrc {
            // SAFETY: per this function's contract.
            unsafe {
                let a = pick(dsts, next_rank(rank, k, nsrc)).add(lo);
                let b = if k + 1 < nsrc {
                    pick(dsts, next_rank(rank, k + 1, nsrc)).add(lo)
                } else {
                    core::ptr::null_mut()
                };
                reduce_copy::<T, Sum, 1>(grid, [own as *const T], 1, a, b, len, 1);
            }
            k += 2;
        }
    }

    /// `(rank + k) mod n` for `rank, k < n` without a division (which could panic).
    #[inline(always)]
    fn next_rank(rank: usize, k: usize, n: usize) -> usize {
        let i = rank + k;
        if i >= n {
            i - n
        } else {
            i
        }
    }

    /// The kernel body of `ringccl_twoshot_{op}_{ty}` (see the module docs, "The two-shot
    /// all-reduce").
    ///
    /// # Safety
    /// Every rank launched with the same grid (at most `MAX_TWO_SHOT_BLOCKS` blocks of at least
    /// `nsrc` threads), `nsrc` and `count`; the first `nsrc` sources readable and the first
    /// `nsrc` destinations writable for `count` elements (rank order; a rank's destination
    /// either equals its source or does not overlap any source or destination);
    /// `flags[0..nsrc]` every rank's two-shot flag region (`flags[rank] == my_flags`), all
    /// accessible from this GPU; `2 ≤ nsrc ≤ MAX_RANKS`, `rank < nsrc`; `ctl` the control block;
    /// `stage_in` null or this rank's input (`count` elements, copied slice by slice into
    /// `srcs[rank]` before the first barrier), `stage_out` null or this rank's output (written
    /// from `dsts[rank]` after the second; it may equal `stage_in`).
    ///
    /// For another collective (`what`, see the module docs; `root < nsrc` for the rooted ones),
    /// the buffers it names instead, as long as that collective's buffers (in units of `count`,
    /// [`super::what`]); unused pointers may be null. `stage_in`, when not null, fills
    /// `srcs[rank]` with what the peers read of this rank's input (reduce-scatter, broadcast at
    /// the root, reduce away from it); `stage_out`, when not null, is written from `dsts[rank]`
    /// (all-gather, all-to-all: every rank's share).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn two_shot<T: Element, O: ReduceOp, const ALL_REDUCE: bool>(
        srcs: [*const T; MAX_RANKS],
        nsrc: usize,
        dsts: [*mut T; MAX_RANKS],
        count: usize,
        postdiv: u32,
        my_flags: *mut u64,
        flags: [*mut u64; MAX_RANKS],
        rank: usize,
        ctl: *mut u64,
        timeout_ns: u64,
        (stage_in, stage_out): (*const T, *mut T),
        (what, root): (u32, usize),
    ) {
        // SAFETY: reading special registers has no side effects.
        let (tid, threads, block, blocks) = unsafe {
            (
                _thread_idx_x() as usize,
                _block_dim_x() as usize,
                _block_idx_x() as usize,
                _grid_dim_x() as usize,
            )
        };
        let grid = Grid {
            thread: tid,
            threads,
        };
        use super::what as w;
        // The all-reduce's entry points run nothing else: with `what` a constant, the other
        // collectives' code is not in them (nor in their register count).
        let what = if ALL_REDUCE { w::ALL_REDUCE } else { what };
        // The all-reduce cuts `count` into `nsrc` shards; the calls of one share per rank have
        // `nsrc` shards of `count`; the broadcast and the reduce cut the whole count.
        let whole = what == w::BROADCAST || what == w::REDUCE;
        let shards = if whole { 1 } else { nsrc };
        // This block's slice of shard `q`, in elements of the full buffers.
        let slice_of = |q: usize| {
            if what == w::ALL_REDUCE {
                super::two_shot_slice(count, T::SIZE, nsrc, q, blocks, block)
            } else {
                let (a, b) = super::two_shot_slice(count, T::SIZE, 1, 0, blocks, block);
                (q * count + a, q * count + b)
            }
        };
        let (lo, hi) = slice_of(if whole { 0 } else { rank });
        // SAFETY (whole body): pointers per this function's contract; the block's counter is
        // written only by thread 0 after the last barrier, when every thread has read it.
        unsafe {
            let mine = my_flags.add(block * FLAG_WORDS);
            let epoch = core::ptr::read_volatile(mine.add(COUNTER)).wrapping_add(1);
            let peer = tid < nsrc && tid < MAX_RANKS && tid != rank;
            let theirs = pick(flags, tid).wrapping_add(block * FLAG_WORDS);

            // 0. Staged: the parts of my input the peers' block `block` reads (slice `block` of
            // every shard) first go where they read them (`srcs[rank]`).
            if !stage_in.is_null() {
                let to = pick(srcs, rank) as *mut T;
                let mut q = 0;
                while q < shards {
                    let (a, b) = slice_of(q);
                    if a < b {
                        let (from, at) = ([stage_in.add(a)], to.add(a));
                        reduce_copy::<T, Sum, 1>(
                            grid,
                            from,
                            1,
                            at,
                            core::ptr::null_mut(),
                            b - a,
                            1,
                        );
                    }
                    q += 1;
                }
                fence_sys();
                _syncthreads();
            }

            // 1. Arrive: my input and output are ready; wait until every peer's are.
            let pair = (theirs, mine);
            let failed = meet(peer, pair, 0, epoch, ctl, timeout_ns, rank, tid);

            // 2. My slice of the work (see the module docs).
            if !failed && lo < hi {
                let len = hi - lo;
                let none = core::ptr::null_mut();
                match what {
                    w::REDUCE_SCATTER | w::REDUCE => {
                        // Into my share of my output; the reduce: into the root's output.
                        if what == w::REDUCE_SCATTER || rank == root {
                            let at = if what == w::REDUCE {
                                lo
                            } else {
                                lo - rank * count
                            };
                            let own = pick(dsts, rank).add(at);
                            let from = inputs_at(srcs, nsrc, lo);
                            reduce_copy::<T, O, MAX_RANKS>(
                                grid, from, nsrc, own, none, len, postdiv,
                            );
                        }
                    }
                    w::BROADCAST => {
                        let from = pick(srcs, root);
                        let own = pick(dsts, rank);
                        if !own.is_null() && own as *const T != from {
                            let from = [from.add(lo)];
                            reduce_copy::<T, Sum, 1>(grid, from, 1, own.add(lo), none, len, 1);
                        }
                    }
                    w::ALL_TO_ALL => {
                        let mine = pick(srcs, rank);
                        let rel = lo - rank * count;
                        let mut q = 0;
                        while q < nsrc {
                            let from = [mine.add(q * count + rel)];
                            let to = pick(dsts, q).add(lo);
                            reduce_copy::<T, Sum, 1>(grid, from, 1, to, none, len, 1);
                            q += 1;
                        }
                    }
                    w::ALL_GATHER => {
                        // My own input's slice into my output and the next rank's, then the
                        // others'.
                        let own = pick(dsts, rank).add(lo);
                        let next = pick(dsts, next_rank(rank, 1, nsrc)).add(lo);
                        let from = [pick(srcs, rank).add(lo - rank * count)];
                        reduce_copy::<T, Sum, 1>(grid, from, 1, own, next, len, 1);
                        fan_out(grid, own, dsts, rank, nsrc, lo, len);
                    }
                    // (A constant condition: the other collectives' entry points leave the
                    // all-reduce's code out.)
                    _ if ALL_REDUCE => {
                        // The all-reduce: fold every input (rank order) into my output and the
                        // next rank's, then copy it into the others'.
                        let own = pick(dsts, rank).add(lo);
                        let next = pick(dsts, next_rank(rank, 1, nsrc)).add(lo);
                        let at = inputs_at(srcs, nsrc, lo);
                        reduce_copy::<T, O, MAX_RANKS>(grid, at, nsrc, own, next, len, postdiv);
                        fan_out(grid, own, dsts, rank, nsrc, lo, len);
                    }
                    _ => {}
                }
            }

            // 3. Depart: every thread's writes into the peers' outputs are ordered before the
            // flag; wait until every peer is done with my slice of its work.
            fence_sys();
            _syncthreads();
            let failed = meet(peer && !failed, pair, 1, epoch, ctl, timeout_ns, rank, tid);

            // 4. Staged: slice `block` of every shard of my result is in `dsts[rank]` now (the
            // peers' block `block` wrote it before departing); it goes to the caller's output.
            if !stage_out.is_null() && !failed {
                let from = pick(dsts, rank) as *const T;
                let mut q = 0;
                while q < shards {
                    let (a, b) = slice_of(q);
                    if a < b {
                        let at = stage_out.add(a);
                        reduce_copy::<T, Sum, 1>(
                            grid,
                            [from.add(a)],
                            1,
                            at,
                            core::ptr::null_mut(),
                            b - a,
                            1,
                        );
                    }
                    q += 1;
                }
            }
            if tid == 0 {
                core::ptr::write_volatile(mine.add(COUNTER), epoch);
            }
        }
    }
}

#[cfg(target_arch = "nvptx64")]
pub(crate) use dev::two_shot;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::MAX_RANKS;

    /// The slices of every rank and block partition `0..count` in order, and every boundary
    /// but `count` is a multiple of 16 bytes.
    #[test]
    fn two_shot_slices_partition_the_count_on_16_byte_boundaries() {
        for size in [1usize, 2, 4, 8] {
            for count in [
                0usize,
                1,
                3,
                15,
                16,
                17,
                100,
                1000,
                4097,
                1 << 20,
                (1 << 20) + 5,
            ] {
                for nranks in 1..=MAX_RANKS {
                    for blocks in [1usize, 2, 3, 7, 64, 132, MAX_TWO_SHOT_BLOCKS] {
                        let mut next = 0;
                        for rank in 0..nranks {
                            for block in 0..blocks {
                                let (lo, hi) =
                                    two_shot_slice(count, size, nranks, rank, blocks, block);
                                assert_eq!(
                                    lo, next,
                                    "{count} x {size} B, {nranks} ranks, {blocks} blocks"
                                );
                                assert!(hi >= lo && hi <= count);
                                assert!(lo == count || (lo * size) % 16 == 0);
                                next = hi;
                            }
                        }
                        assert_eq!(next, count);
                    }
                }
            }
        }
    }

    #[test]
    fn two_shot_shards_are_even() {
        // 1 MiB of f32 over 2 ranks and 64 blocks: 2048 elements (8 KiB) per block.
        for block in 0..64 {
            let (lo, hi) = two_shot_slice(1 << 18, 4, 2, 1, 64, block);
            assert_eq!(
                (lo, hi),
                ((1 << 17) + block * 2048, (1 << 17) + (block + 1) * 2048)
            );
        }
    }
}
