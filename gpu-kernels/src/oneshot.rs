//! The one-shot all-reduce: one block per rank reads every rank's input over NVLink and folds it
//! into its own output, with a device-side barrier instead of host events; and the bounded
//! device-side wait that every kernel of ringccl's uses ([`wait_geq`]'s entry point
//! `ringccl_wait_geq`, for the ordering between processes).
//!
//! Each rank owns a flag array of [`FLAG_WORDS`] `u64` in its own memory (plain `cuMemAlloc`,
//! zeroed once when the communicator is built):
//! * word `2 * p`: the last call in which rank `p` *arrived* (its input is ready);
//! * word `2 * p + 1`: the last call in which rank `p` *departed* (it is done reading my input);
//! * word [`COUNTER`]: how many one-shot calls this rank has run (written by the kernel itself,
//!   so the epoch needs no host state and a CUDA graph that replays the kernel stays correct);
//! * word [`FAILED`]: the last epoch in which a wait of this rank's kernel gave up.
//!
//! One call, epoch `e = counter + 1` (the same on every rank: every rank runs the same sequence
//! of one-shot kernels):
//! 1. **arrive**: thread `t < nranks, t != rank` release-stores `e` (system scope) into word
//!    `2 * rank` of rank `t`'s flags, then waits until word `2 * t` of my flags is `≥ e`
//!    (acquire, system scope); a thread whose wait gives up writes `e` into word [`FAILED`];
//!    `bar.sync`, after which every thread reads whether any wait failed.
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
//! ## Bounded waits: the control block
//!
//! No wait lasts forever and no kernel traps (a `trap` kills the CUDA context of the whole
//! process). Every wait also watches a **control block** of [`CTL_WORDS`] `u64` in host memory
//! mapped into the device (`cuMemHostAlloc` with `DEVICEMAP`), which the host passes to every
//! kernel with a timeout in nanoseconds:
//! * word [`CTL_ABORT`]: the host (an abort) or a kernel (a timeout) sets it non-zero; every
//!   wait that is not already satisfied then gives up;
//! * words [`CTL_STATUS`]` + slot`: how a wait of the rank in `slot` gave up, the first time
//!   (see [`status`]): the host reads it and reports `Error::Timeout` or `Error::Aborted`.
//!
//! A wait first polls its flag [`SPIN_POLLS`] times (device memory only, the fast path of every
//! call); after that it reads the abort word and the global timer between polls, backing off with
//! `nanosleep` up to 1 µs. A wait that gives up writes its status, sets the abort word (on a
//! timeout), and the kernel skips its remaining work and ends normally.

/// `u64` words in one rank's flag array (256 bytes).
pub const FLAG_WORDS: usize = 32;

/// Index of the word that counts the rank's one-shot calls.
pub const COUNTER: usize = 16;

/// Index of the word in which a thread whose wait failed writes the call's epoch, so that after
/// the next barrier every thread of the block skips the rest of the call (epochs only grow:
/// nothing is cleared).
pub const FAILED: usize = 17;

/// Most ranks a one-shot all-reduce supports: the `ringccl_oneshot_*` entry points have one
/// source slot (`s0..s7`) and one flag slot (`f0..f7`) per rank (see [`crate::entry`]).
///
/// A limit of its own, equal to the reduce kernel's [`crate::prim::MAX_SRCS`] but not tied to
/// it.
pub const MAX_RANKS: usize = 8;

/// Polls of a flag (device memory only) before a wait starts reading the control block and the
/// clock, and backs off with `nanosleep`.
pub const SPIN_POLLS: u32 = 4096;

/// `u64` words in the control block (128 bytes).
pub const CTL_WORDS: usize = 16;

/// Index of the abort word in the control block.
pub const CTL_ABORT: usize = 0;

/// Index of the first status word in the control block: slot `s` (a rank, `< MAX_RANKS`) is
/// word `CTL_STATUS + s`; a larger slot uses the last one.
pub const CTL_STATUS: usize = 8;

/// How a wait gave up, as written into a status word: `code << 32 | peer`, 0 = none.
///
/// ```
/// use gpu_kernels::oneshot::status;
/// let w = status::encode(status::TIMEOUT, 1);
/// assert_eq!(status::decode(w), Some((status::TIMEOUT, 1)));
/// assert_eq!(status::decode(0), None);
/// ```
pub mod status {
    /// The wait reached the timeout the host passed: the peer never signalled.
    pub const TIMEOUT: u32 = 1;
    /// The wait saw the abort word set (by the host, or by another wait's timeout).
    pub const ABORTED: u32 = 2;

    /// The status word for `code` while waiting for `peer`.
    #[inline(always)]
    pub const fn encode(code: u32, peer: u32) -> u64 {
        ((code as u64) << 32) | peer as u64
    }

    /// `(code, peer)` of a status word; `None` when nothing was written.
    pub const fn decode(word: u64) -> Option<(u32, u32)> {
        if word >> 32 == 0 {
            None
        } else {
            Some(((word >> 32) as u32, word as u32))
        }
    }
}

/// The name of the bounded wait kernel (not in the entry table: it has no element type):
/// `ringccl_wait_geq(flag: u64, value: u64, ctl: u64, timeout_ns: u64, slot: u32, peer: u32)`,
/// one block of one thread or more (thread 0 waits). It ends once `*flag >= value`, or writes
/// its status and ends early (see the module docs).
pub const WAIT_ENTRY: &str = "ringccl_wait_geq";

#[cfg(target_arch = "nvptx64")]
mod dev {
    use super::{status, COUNTER, CTL_ABORT, CTL_STATUS, FAILED, MAX_RANKS, SPIN_POLLS};
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

    /// `*p`, relaxed at system scope (the host may write it at any time).
    #[inline(always)]
    unsafe fn load_relaxed(p: *const u64) -> u64 {
        let v: u64;
        // SAFETY: the caller guarantees `p` is a valid, aligned `u64` (generic address).
        unsafe {
            asm!("ld.relaxed.sys.u64 {0}, [{1}];", out(reg64) v, in(reg64) p,
                 options(nostack, preserves_flags))
        }
        v
    }

    /// A block-wide barrier (`bar.sync`: the compiler never duplicates it) after which every
    /// thread knows whether a wait of this call failed in any thread: a thread whose wait
    /// failed has written `epoch` into `fail` before it.
    ///
    /// # Safety
    /// `fail` is this rank's [`FAILED`](super::FAILED) word; every thread of the block calls
    /// this at the same point.
    #[inline(always)]
    unsafe fn sync_failed(fail: *const u64, epoch: u64) -> bool {
        _syncthreads();
        // SAFETY: per the caller; written before the barrier, which orders block-wide.
        unsafe { core::ptr::read_volatile(fail) == epoch }
    }

    /// Records how the wait of `slot` for `peer` gave up, unless an earlier cause is recorded.
    #[inline(always)]
    unsafe fn give_up(ctl: *mut u64, slot: usize, code: u32, peer: usize) {
        let slot = if slot < MAX_RANKS {
            slot
        } else {
            MAX_RANKS - 1
        };
        // SAFETY: `ctl` is the control block (`CTL_WORDS` words), per the caller.
        unsafe {
            let word = ctl.add(CTL_STATUS + slot);
            if load_relaxed(word) == 0 {
                store_release(word, status::encode(code, peer as u32));
            }
            if code == status::TIMEOUT {
                store_release(ctl.add(CTL_ABORT), 1);
            }
        }
    }

    /// Waits until `*p >= epoch`; `false` (with the status written) when the control block's
    /// abort word is set or `timeout_ns` (0: none) has passed first.
    ///
    /// # Safety
    /// `p` a valid `u64` flag; `ctl` the control block.
    #[inline(always)]
    pub(super) unsafe fn wait_at_least(
        p: *const u64,
        epoch: u64,
        ctl: *mut u64,
        timeout_ns: u64,
        slot: usize,
        peer: usize,
    ) -> bool {
        let mut polls = 0u32;
        let mut start = 0u64;
        let mut sleep = 32u32;
        // SAFETY (loads, stores): forwarded from the caller.
        while unsafe { load_acquire(p) } < epoch {
            if polls < SPIN_POLLS {
                polls += 1;
                continue;
            }
            if unsafe { load_relaxed(ctl.add(CTL_ABORT)) } != 0 {
                unsafe { give_up(ctl, slot, status::ABORTED, peer) };
                return false;
            }
            let now = global_timer();
            if start == 0 {
                start = now;
            } else if timeout_ns != 0 && now.wrapping_sub(start) > timeout_ns {
                unsafe { give_up(ctl, slot, status::TIMEOUT, peer) };
                return false;
            }
            nanosleep(sleep);
            if sleep < 1024 {
                sleep *= 2;
            }
        }
        true
    }

    /// The body of `ringccl_wait_geq` (see [`super::WAIT_ENTRY`]): thread 0 waits.
    ///
    /// # Safety
    /// `flag` a valid `u64`, `ctl` the control block, both accessible from this GPU.
    #[inline(always)]
    pub unsafe fn wait_geq(
        flag: *const u64,
        value: u64,
        ctl: *mut u64,
        timeout_ns: u64,
        slot: u32,
        peer: u32,
    ) {
        // SAFETY: reading a special register has no side effects.
        if unsafe { _thread_idx_x() } == 0 {
            // SAFETY: forwarded from the caller.
            unsafe {
                wait_at_least(flag, value, ctl, timeout_ns, slot as usize, peer as usize);
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
    /// `rank < nsrc ≤ MAX_RANKS`; `ctl` the control block (see the module docs).
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
            let fail = my_flags.add(FAILED);
            if peer {
                store_release(theirs.add(2 * rank), epoch);
                if !wait_at_least(my_flags.add(2 * tid), epoch, ctl, timeout_ns, rank, tid) {
                    core::ptr::write_volatile(fail, epoch);
                }
            }
            let failed = sync_failed(fail, epoch);

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
            if peer && !failed {
                store_release(theirs.add(2 * rank + 1), epoch);
                if !wait_at_least(my_flags.add(2 * tid + 1), epoch, ctl, timeout_ns, rank, tid) {
                    core::ptr::write_volatile(fail, epoch);
                }
            }
            let failed = sync_failed(fail, epoch);

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
pub(crate) use dev::{all_reduce, wait_geq};
