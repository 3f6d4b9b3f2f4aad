//! What every cross-process kernel of ringccl's shares: the flag arrays and the barrier the
//! one-shot and two-shot kernels meet at ([`crate::oneshot`], [`crate::twoshot`]), the control
//! block every wait watches, and the bounded wait kernel (`ringccl_wait_geq`, [`WAIT_ENTRY`])
//! that orders work between processes.
//!
//! ## Flag arrays
//!
//! Each rank owns a flag array of [`FLAG_WORDS`] `u64` in its own memory (plain `cuMemAlloc`,
//! zeroed once when the communicator is built):
//! * word `2 * p`: the last call in which rank `p` *arrived* (its input is ready);
//! * word `2 * p + 1`: the last call in which rank `p` *departed* (it is done reading my input);
//! * word [`COUNTER`]: how many calls this rank has run on the array (written by the kernel
//!   itself, so the epoch needs no host state and a CUDA graph that replays the kernel stays
//!   correct);
//! * word [`FAILED`]: the last epoch in which a wait of this rank's kernel gave up;
//! * words [`PUBLISHED`]` + p` (one-shot only): the address, in this process, where rank `p`'s
//!   input of the current call is read (`p`'s registered buffer as this process mapped it), or
//!   0: read `p`'s scratch as this rank mapped it (the one-shot kernel's `s{p}`). Rank `p`'s
//!   kernel writes it before its arrive flag's release, and this rank reads it after the
//!   acquire; the next call's word is written only after this rank departed.
//!
//! Flags only grow, so nothing is ever cleared. A barrier meeting (arrive or depart) of epoch
//! `e`: thread `t < nranks, t != rank` release-stores `e` (system scope) into word
//! `2 * rank (+ 1)` of rank `t`'s flags, then waits until word `2 * t (+ 1)` of my flags is
//! `≥ e` (acquire, system scope); a thread whose wait gives up writes `e` into word [`FAILED`];
//! `bar.sync`, after which every thread reads whether any wait failed.
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

/// Index of the first of the [`MAX_RANKS`] words in which the peers publish where this rank
/// reads their one-shot input (see the module docs): words `PUBLISHED..PUBLISHED + MAX_RANKS`
/// of the one-shot flag array.
pub const PUBLISHED: usize = 24;

const _: () = assert!(PUBLISHED > FAILED && PUBLISHED + MAX_RANKS <= FLAG_WORDS);

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
    use super::{status, CTL_ABORT, CTL_STATUS, FAILED, MAX_RANKS, SPIN_POLLS};
    use core::arch::asm;
    use core::arch::nvptx::{_syncthreads, _thread_idx_x};

    /// `*p = v` with release semantics at system scope.
    #[inline(always)]
    pub(crate) unsafe fn store_release(p: *mut u64, v: u64) {
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

    /// A fence of every memory access of this thread at system scope (`fence.acq_rel.sys`).
    #[inline(always)]
    pub(crate) fn fence_sys() {
        // SAFETY: a fence has no operands and no effect but ordering.
        unsafe { asm!("fence.acq_rel.sys;", options(nostack, preserves_flags)) }
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
    pub(crate) unsafe fn load_relaxed(p: *const u64) -> u64 {
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
    pub(crate) unsafe fn wait_at_least(
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

    /// One step of a bounded poll that another loop drives (the LL kernel's, whose condition
    /// is not a flag word): after [`SPIN_POLLS`] calls it reads the abort word and the clock
    /// and backs off like [`wait_at_least`]. `false` (with the status written) when the wait
    /// gives up; `clock` is `(start, sleep)`, `(0, 32)` at the first call.
    ///
    /// # Safety
    /// `ctl` the control block.
    #[inline(always)]
    pub(crate) unsafe fn wait_step(
        polls: &mut u32,
        clock: &mut (u64, u32),
        ctl: *mut u64,
        timeout_ns: u64,
        slot: usize,
        peer: usize,
    ) -> bool {
        if *polls < SPIN_POLLS {
            *polls += 1;
            return true;
        }
        // SAFETY (loads, stores): forwarded from the caller.
        if unsafe { load_relaxed(ctl.add(CTL_ABORT)) } != 0 {
            unsafe { give_up(ctl, slot, status::ABORTED, peer) };
            return false;
        }
        let now = global_timer();
        if clock.0 == 0 {
            clock.0 = now;
        } else if timeout_ns != 0 && now.wrapping_sub(clock.0) > timeout_ns {
            unsafe { give_up(ctl, slot, status::TIMEOUT, peer) };
            return false;
        }
        nanosleep(clock.1);
        if clock.1 < 1024 {
            clock.1 *= 2;
        }
        true
    }

    /// One meeting of a barrier (see the module docs): if `go`, tells the peer this thread
    /// stands for (`tid`, whose flag array is `theirs`) that this rank reached `word` (0:
    /// arrive, 1: depart) of `epoch`, and waits until that peer says the same in `mine`, this
    /// rank's flag array; a wait that gives up writes `epoch` into `mine`'s failure word. Then
    /// `bar.sync`; returns whether any thread's wait of this call failed.
    ///
    /// # Safety
    /// As for [`wait_at_least`] and [`sync_failed`]; `theirs` valid when `go`; every thread of
    /// the block calls this at the same point.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn meet(
        go: bool,
        (theirs, mine): (*mut u64, *mut u64),
        word: usize,
        epoch: u64,
        ctl: *mut u64,
        timeout_ns: u64,
        rank: usize,
        tid: usize,
    ) -> bool {
        // SAFETY: forwarded from the caller.
        unsafe {
            let fail = mine.add(FAILED);
            if go {
                store_release(theirs.add(2 * rank + word), epoch);
                if !wait_at_least(mine.add(2 * tid + word), epoch, ctl, timeout_ns, rank, tid) {
                    core::ptr::write_volatile(fail, epoch);
                }
            }
            sync_failed(fail, epoch)
        }
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

    /// `*p = v`, relaxed at system scope (a peer reads it after an acquire of a later
    /// release by this thread).
    ///
    /// # Safety
    /// `p` a valid, aligned `u64` (generic address).
    #[inline(always)]
    pub(crate) unsafe fn store_relaxed(p: *mut u64, v: u64) {
        // SAFETY: per the caller.
        unsafe {
            asm!("st.relaxed.sys.u64 [{0}], {1};", in(reg64) p, in(reg64) v,
                 options(nostack, preserves_flags))
        }
    }

    /// The sources of a one-shot call after its arrive barrier: `srcs[q]` replaced by the
    /// address rank `q` published in word [`PUBLISHED`](super::PUBLISHED)` + q` of `mine` when
    /// that word is not 0 (`q != rank`, `q < nsrc`).
    ///
    /// # Safety
    /// `mine` this rank's one-shot flag array; called after the arrive barrier, by every
    /// thread.
    #[inline(always)]
    pub(crate) unsafe fn published<P: Copy>(
        mut srcs: [*const P; MAX_RANKS],
        mine: *const u64,
        nsrc: usize,
        rank: usize,
    ) -> [*const P; MAX_RANKS] {
        let mut k = 0;
        while k < MAX_RANKS {
            if k < nsrc && k != rank {
                // SAFETY: per the caller; the word was written before the peer's release that
                // the arrive barrier acquired.
                let w = unsafe { load_relaxed(mine.add(super::PUBLISHED + k)) };
                if w != 0 {
                    srcs[k] = w as *const P;
                }
            }
            k += 1;
        }
        srcs
    }

    /// `arr[i]` for a run-time `i < MAX_RANKS` with constant indices only (a run-time index
    /// would put the array in local memory).
    #[inline(always)]
    pub(crate) fn pick<P: Copy>(arr: [P; MAX_RANKS], i: usize) -> P {
        let mut v = arr[0];
        let mut k = 1;
        while k < MAX_RANKS {
            if i == k {
                v = arr[k];
            }
            k += 1;
        }
        v
    }
}

#[cfg(target_arch = "nvptx64")]
pub(crate) use dev::{
    fence_sys, load_relaxed, meet, pick, published, store_relaxed, wait_geq, wait_step,
};
#[cfg(target_arch = "nvptx64")]
pub(crate) use dev::{store_release, wait_at_least};
