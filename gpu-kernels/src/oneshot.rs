//! The one-shot all-reduce: one block per rank reads every rank's input over NVLink and folds it
//! into its own output, with a device-side barrier instead of host events.
//!
//! Each rank owns a flag array of [`FLAG_WORDS`] `u64` in its own memory (plain `cuMemAlloc`,
//! zeroed once when the communicator is built):
//! * word `2 * p`: the last call in which rank `p` *arrived* (its input is ready);
//! * word `2 * p + 1`: the last call in which rank `p` *departed* (it is done reading my input);
//! * word [`COUNTER`]: how many one-shot calls this rank has run (written by the kernel itself,
//!   so the epoch needs no host state and a CUDA graph that replays the kernel stays correct).
//!
//! One call, epoch `e = counter + 1` (the same on every rank: every rank runs the same sequence
//! of one-shot kernels):
//! 1. **arrive**: thread `t < nranks, t != rank` release-stores `e` (system scope) into word
//!    `2 * rank` of rank `t`'s flags, then spins until word `2 * t` of my flags is `≥ e`
//!    (acquire, system scope); `bar.sync`.
//! 2. **compute**: the whole block folds the `nranks` inputs in rank order `0..n` (the same on
//!    every rank, so all ranks' results are bit-identical) into `dst`, or into `tmp` when the
//!    call is in place (my input is my output, and peers are still reading it).
//! 3. **depart**: `bar.sync`; thread `t` release-stores `e` into word `2 * rank + 1` of rank
//!    `t`'s flags, then spins until word `2 * t + 1` of mine is `≥ e`; `bar.sync`. After this no
//!    peer reads my input any more, so the caller may overwrite it once the kernel is done.
//! 4. in place only: copy `tmp` to `dst`. Thread 0 stores `e` into the counter.
//!
//! Flags only grow, so nothing is ever cleared. A spin that lasts longer than [`TIMEOUT_NS`]
//! (a peer that never arrives) executes `trap`: the launch fails with a CUDA error instead of
//! hanging forever.

/// `u64` words in one rank's flag array (256 bytes).
pub const FLAG_WORDS: usize = 32;

/// Index of the word that counts the rank's one-shot calls.
pub const COUNTER: usize = 16;

/// Most ranks a one-shot all-reduce supports: the `ringccl_oneshot_*` entry points have one
/// source slot (`s0..s7`) and one flag slot (`f0..f7`) per rank (see [`crate::entry`]).
///
/// A limit of its own, equal to the reduce kernel's [`crate::prim::MAX_SRCS`] but not tied to
/// it.
pub const MAX_RANKS: usize = 8;

/// Longest a thread waits for a peer's flag before the kernel traps (60 s).
pub const TIMEOUT_NS: u64 = 60_000_000_000;

/// Polls of a flag without sleeping before the wait backs off with `nanosleep`.
#[cfg_attr(not(target_arch = "nvptx64"), allow(dead_code))]
const SPIN_POLLS: u32 = 4096;

#[cfg(target_arch = "nvptx64")]
mod dev {
    use super::{COUNTER, MAX_RANKS, SPIN_POLLS, TIMEOUT_NS};
    use crate::element::Element;
    use crate::op::{ReduceOp, Sum};
    use crate::prim::{reduce_copy, Grid};
    use core::arch::asm;
    use core::arch::nvptx::{_block_dim_x, _syncthreads, _thread_idx_x};

    /// `*p = v` with release semantics at system scope.
    #[inline(always)]
    unsafe fn store_release(p: *mut u64, v: u64) {
        // SAFETY: the caller guarantees `p` is a valid, aligned `u64` (generic address).
        unsafe {
            asm!("st.release.sys.u64 [{0}], {1};", in(reg64) p, in(reg64) v,
                 options(nostack, preserves_flags))
        }
    }

    /// `*p` with acquire semantics at system scope (never elided or hoisted: no `pure`).
    #[inline(always)]
    unsafe fn load_acquire(p: *const u64) -> u64 {
        let v: u64;
        // SAFETY: the caller guarantees `p` is a valid, aligned `u64` (generic address).
        unsafe {
            asm!("ld.acquire.sys.u64 {0}, [{1}];", out(reg64) v, in(reg64) p,
                 options(nostack, preserves_flags))
        }
        v
    }

    #[inline(always)]
    fn global_timer() -> u64 {
        let t: u64;
        // SAFETY: reading a special register has no side effects.
        unsafe {
            asm!("mov.u64 {0}, %globaltimer;", out(reg64) t, options(nostack, preserves_flags))
        }
        t
    }

    #[inline(always)]
    fn nanosleep(ns: u32) {
        // SAFETY: only suspends the thread for about `ns` nanoseconds.
        unsafe { asm!("nanosleep.u32 {0};", in(reg32) ns, options(nostack, preserves_flags)) }
    }

    /// Spins until `*p >= epoch`; traps after [`TIMEOUT_NS`].
    #[inline(always)]
    unsafe fn wait_at_least(p: *const u64, epoch: u64) {
        let mut polls = 0u32;
        let mut start = 0u64;
        let mut sleep = 32u32;
        // SAFETY (loads): forwarded from the caller.
        while unsafe { load_acquire(p) } < epoch {
            if polls < SPIN_POLLS {
                polls += 1;
                continue;
            }
            let now = global_timer();
            if start == 0 {
                start = now;
            } else if now.wrapping_sub(start) > TIMEOUT_NS {
                // SAFETY: `trap` aborts the kernel with an error the host sees at its next
                // synchronisation; nothing else happens.
                unsafe { asm!("trap;", options(noreturn)) }
            }
            nanosleep(sleep);
            if sleep < 1024 {
                sleep *= 2;
            }
        }
    }

    /// The kernel body of `ringccl_oneshot_{op}_{ty}` (see the module docs).
    ///
    /// # Safety
    /// One block per rank, at least `nsrc` threads, every rank launched with the same `nsrc`
    /// and `count`; the first `nsrc` sources (rank order) readable for `count` elements, `dst`
    /// writable for `count`; `tmp` null (out of place) or writable for `count` and not
    /// overlapping anything else (in place: `dst == srcs[rank]`); `flags[0..nsrc]` every rank's
    /// flag array (`flags[rank] == my_flags`), all accessible from this GPU;
    /// `rank < nsrc ≤ MAX_RANKS`.
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
            // flags[tid] with constant indices only (a run-time index would need local memory).
            let mut theirs = flags[0];
            let mut i = 1;
            while i < MAX_RANKS {
                if tid == i {
                    theirs = flags[i];
                }
                i += 1;
            }

            // 1. Arrive: my input is ready; wait until every peer's is.
            if peer {
                store_release(theirs.add(2 * rank), epoch);
                wait_at_least(my_flags.add(2 * tid), epoch);
            }
            _syncthreads();

            // 2. Compute, in rank order.
            let out = if tmp.is_null() { dst } else { tmp };
            reduce_copy::<T, O, MAX_RANKS>(
                grid,
                srcs,
                nsrc,
                out,
                core::ptr::null_mut(),
                count,
                postdiv,
            );

            // 3. Depart: I am done reading your inputs; wait until everyone is done with mine.
            _syncthreads();
            if peer {
                store_release(theirs.add(2 * rank + 1), epoch);
                wait_at_least(my_flags.add(2 * tid + 1), epoch);
            }
            _syncthreads();

            // 4. In place: nobody reads my input any more; overwrite it with the result.
            if !tmp.is_null() {
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
