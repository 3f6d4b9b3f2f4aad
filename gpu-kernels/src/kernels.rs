//! The shapes of the `extern "ptx-kernel"` entry points (nvptx64 only): one per [`EntryKind`]
//! variant, each a thin shell that computes the thread's grid position and calls
//! [`crate::prim`], [`crate::oneshot`] or [`crate::twoshot`]. The list of entry points, which instantiates these
//! shapes per type (and operator), is in `crate::entry`.
//!
//! [`EntryKind`]: crate::entry::EntryKind

use crate::prim::Grid;
use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _thread_idx_x};

/// This thread's position in the grid.
#[inline(always)]
pub(crate) fn grid() -> Grid {
    // SAFETY: reading special registers has no side effects.
    unsafe {
        let block = _block_dim_x() as usize;
        Grid {
            thread: _block_idx_x() as usize * block + _thread_idx_x() as usize,
            threads: _grid_dim_x() as usize * block,
        }
    }
}

/// One entry point: `kernel!(Kind, "symbol", T)` for a copy, `kernel!(Kind, "symbol", T, Op)`
/// for a reduction. Each kernel sits in its own anonymous `const` so that all can share one
/// Rust name; the symbol is its `export_name`. Paths are absolute: this expands in `crate::entry`.
/// The parameter lists spell out eight pointer slots; the arrays built from them have the type
/// `[_; MAX_SRCS]` or `[_; MAX_RANKS]`, so a change of either constant fails to compile here.
macro_rules! kernel {
    (Copy, $name:expr, $t:ty) => {
        const _: () = {
            /// `dst0[i] = src[i]` (and `dst1[i]` when `dst1` is not null) for `i < count`.
            ///
            /// # Safety
            /// Device pointers valid for `count` elements; `dst1` may be null.
            #[export_name = $name]
            pub unsafe extern "ptx-kernel" fn kernel(
                src: *const $t,
                dst0: *mut $t,
                dst1: *mut $t,
                count: u64,
            ) {
                // SAFETY: forwarded from the kernel's contract.
                unsafe {
                    crate::prim::reduce_copy::<$t, crate::op::Sum, 1>(
                        crate::kernels::grid(),
                        [src],
                        1,
                        dst0,
                        dst1,
                        count as usize,
                        1,
                    )
                }
            }
        };
    };
    (Scale, $name:expr, $t:ty) => {
        const _: () = {
            /// `dst[i] = src[i] * scalar` for `i < count`, the scalar `*scalar_ptr` or, when
            /// `scalar_ptr` is null, the low bits of `imm_bits` (see `crate::prim::scale`).
            ///
            /// # Safety
            /// Device pointers valid for `count` elements (`dst` equal to `src` or not
            /// overlapping it); `scalar_ptr` null or one readable element.
            #[export_name = $name]
            pub unsafe extern "ptx-kernel" fn kernel(
                src: *const $t,
                dst: *mut $t,
                count: u64,
                imm_bits: u64,
                scalar_ptr: *const $t,
            ) {
                // SAFETY: forwarded from the kernel's contract.
                unsafe {
                    let scalar = if scalar_ptr.is_null() {
                        <$t as crate::element::Element>::from_raw(imm_bits)
                    } else {
                        *scalar_ptr
                    };
                    crate::prim::scale::<$t>(
                        crate::kernels::grid(),
                        src,
                        dst,
                        count as usize,
                        scalar,
                    )
                }
            }
        };
    };
    (Reduce, $name:expr, $t:ty, $op:ty) => {
        const _: () = {
            /// `dst[i] = finish(s0[i] ⊕ … ⊕ s{nsrc-1}[i])` for `i < count`,
            /// `2 ≤ nsrc ≤ MAX_SRCS`.
            ///
            /// # Safety
            /// The first `nsrc` sources and `dst` valid for `count` elements.
            #[export_name = $name]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "ptx-kernel" fn kernel(
                s0: *const $t,
                s1: *const $t,
                s2: *const $t,
                s3: *const $t,
                s4: *const $t,
                s5: *const $t,
                s6: *const $t,
                s7: *const $t,
                nsrc: u32,
                dst: *mut $t,
                count: u64,
                postdiv: u32,
            ) {
                use crate::prim::MAX_SRCS;
                let srcs: [*const $t; MAX_SRCS] = [s0, s1, s2, s3, s4, s5, s6, s7];
                // SAFETY: forwarded from the kernel's contract.
                unsafe {
                    crate::prim::reduce_copy::<$t, $op, MAX_SRCS>(
                        crate::kernels::grid(),
                        srcs,
                        nsrc as usize,
                        dst,
                        core::ptr::null_mut(),
                        count as usize,
                        postdiv,
                    )
                }
            }
        };
    };
    (ReduceCopy, $name:expr, $t:ty, $op:ty) => {
        const _: () = {
            /// `dst0[i] = finish(a[i] ⊕ b[i])` (and `dst1[i]` when not null) for `i < count`.
            ///
            /// # Safety
            /// Device pointers valid for `count` elements; `dst1` may be null.
            #[export_name = $name]
            pub unsafe extern "ptx-kernel" fn kernel(
                a: *const $t,
                b: *const $t,
                dst0: *mut $t,
                dst1: *mut $t,
                count: u64,
                postdiv: u32,
            ) {
                // SAFETY: forwarded from the kernel's contract.
                unsafe {
                    crate::prim::reduce_copy::<$t, $op, 2>(
                        crate::kernels::grid(),
                        [a, b],
                        2,
                        dst0,
                        dst1,
                        count as usize,
                        postdiv,
                    )
                }
            }
        };
    };
    (OneShot, $name:expr, $t:ty, $op:ty) => {
        const _: () = {
            /// One-shot all-reduce of `count` elements over `nsrc ≤ MAX_RANKS` ranks (one block
            /// per rank; see `crate::oneshot`): `dst[i] = finish(s0[i] ⊕ … ⊕ s{nsrc-1}[i])`,
            /// sources in rank order.
            ///
            /// # Safety
            /// See `crate::oneshot::all_reduce`.
            #[export_name = $name]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "ptx-kernel" fn kernel(
                s0: *const $t,
                s1: *const $t,
                s2: *const $t,
                s3: *const $t,
                s4: *const $t,
                s5: *const $t,
                s6: *const $t,
                s7: *const $t,
                nsrc: u32,
                dst: *mut $t,
                tmp: *mut $t,
                count: u64,
                postdiv: u32,
                my_flags: *mut u64,
                f0: *mut u64,
                f1: *mut u64,
                f2: *mut u64,
                f3: *mut u64,
                f4: *mut u64,
                f5: *mut u64,
                f6: *mut u64,
                f7: *mut u64,
                rank: u32,
                ctl: *mut u64,
                timeout_ns: u64,
                stage: *const $t,
                p0: u64,
                p1: u64,
                p2: u64,
                p3: u64,
                p4: u64,
                p5: u64,
                p6: u64,
                p7: u64,
            ) {
                use crate::oneshot::MAX_RANKS;
                let srcs: [*const $t; MAX_RANKS] = [s0, s1, s2, s3, s4, s5, s6, s7];
                let publish: [u64; MAX_RANKS] = [p0, p1, p2, p3, p4, p5, p6, p7];
                let flags: [*mut u64; MAX_RANKS] = [f0, f1, f2, f3, f4, f5, f6, f7];
                // SAFETY: forwarded from the kernel's contract.
                unsafe {
                    crate::oneshot::all_reduce::<$t, $op>(
                        srcs,
                        nsrc as usize,
                        dst,
                        tmp,
                        count as usize,
                        postdiv,
                        my_flags,
                        flags,
                        rank as usize,
                        ctl,
                        timeout_ns,
                        stage,
                        publish,
                    )
                }
            }
        };
    };
    (Ll, $name:expr, $t:ty, $op:ty) => {
        const _: () = {
            /// LL push all-reduce of `count` elements over `nranks ≤ MAX_RANKS` ranks, or
            /// (`scatter` 1) reduce-scatter of `count` elements per rank (`crate::ll::ll_blocks`
            /// blocks per rank; see `crate::ll`).
            ///
            /// # Safety
            /// See `crate::ll::all_reduce`.
            #[export_name = $name]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "ptx-kernel" fn kernel(
                src: *const $t,
                dst: *mut $t,
                count: u64,
                scatter: u32,
                postdiv: u32,
                a0: *mut u8,
                a1: *mut u8,
                a2: *mut u8,
                a3: *mut u8,
                a4: *mut u8,
                a5: *mut u8,
                a6: *mut u8,
                a7: *mut u8,
                nranks: u32,
                rank: u32,
                ctl: *mut u64,
                timeout_ns: u64,
            ) {
                let areas: [*mut u8; crate::ctl::MAX_RANKS] = [a0, a1, a2, a3, a4, a5, a6, a7];
                // SAFETY: forwarded from the kernel's contract.
                unsafe {
                    crate::ll::all_reduce::<$t, $op>(
                        src,
                        dst,
                        count as usize,
                        scatter != 0,
                        postdiv,
                        areas,
                        nranks as usize,
                        rank as usize,
                        ctl,
                        timeout_ns,
                    )
                }
            }
        };
    };
    (TwoShot, $name:expr, $t:ty, $op:ty) => {
        crate::kernels::kernel!(@two_shot $name, $t, $op, true);
    };
    (TwoShotColl, $name:expr, $t:ty, $op:ty) => {
        crate::kernels::kernel!(@two_shot $name, $t, $op, false);
    };
    (@two_shot $name:expr, $t:ty, $op:ty, $all_reduce:literal) => {
        const _: () = {
            /// Two-shot all-reduce of `count` elements over `nsrc ≤ MAX_RANKS` ranks (`what`
            /// and `root` ignored), or (`twoshot_coll`) another collective on the same barriers
            /// (`what`, `root`; see `crate::twoshot::two_shot`), one slice per block.
            ///
            /// # Safety
            /// See `crate::twoshot::two_shot`.
            #[export_name = $name]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "ptx-kernel" fn kernel(
                s0: *const $t,
                s1: *const $t,
                s2: *const $t,
                s3: *const $t,
                s4: *const $t,
                s5: *const $t,
                s6: *const $t,
                s7: *const $t,
                nsrc: u32,
                d0: *mut $t,
                d1: *mut $t,
                d2: *mut $t,
                d3: *mut $t,
                d4: *mut $t,
                d5: *mut $t,
                d6: *mut $t,
                d7: *mut $t,
                count: u64,
                postdiv: u32,
                my_flags: *mut u64,
                f0: *mut u64,
                f1: *mut u64,
                f2: *mut u64,
                f3: *mut u64,
                f4: *mut u64,
                f5: *mut u64,
                f6: *mut u64,
                f7: *mut u64,
                rank: u32,
                ctl: *mut u64,
                timeout_ns: u64,
                stage_in: *const $t,
                stage_out: *mut $t,
                what: u32,
                root: u32,
            ) {
                use crate::ctl::MAX_RANKS;
                let srcs: [*const $t; MAX_RANKS] = [s0, s1, s2, s3, s4, s5, s6, s7];
                let dsts: [*mut $t; MAX_RANKS] = [d0, d1, d2, d3, d4, d5, d6, d7];
                let flags: [*mut u64; MAX_RANKS] = [f0, f1, f2, f3, f4, f5, f6, f7];
                // SAFETY: forwarded from the kernel's contract.
                unsafe {
                    crate::twoshot::two_shot::<$t, $op, $all_reduce>(
                        srcs,
                        nsrc as usize,
                        dsts,
                        count as usize,
                        postdiv,
                        my_flags,
                        flags,
                        rank as usize,
                        ctl,
                        timeout_ns,
                        (stage_in, stage_out),
                        (what, root as usize),
                    )
                }
            }
        };
    };
}

pub(crate) use kernel;

/// `ringccl_wait_geq` ([`crate::ctl::WAIT_ENTRY`]): thread 0 waits until `*flag >= value`,
/// or gives up on the control block's abort word or after `timeout_ns` (0: never), writing its
/// status in `ctl` (see [`crate::ctl`]).
///
/// # Safety
/// `flag` a valid `u64` and `ctl` a control block, both accessible from this GPU.
#[export_name = "ringccl_wait_geq"]
pub unsafe extern "ptx-kernel" fn wait_geq(
    flag: *const u64,
    value: u64,
    ctl: *mut u64,
    timeout_ns: u64,
    slot: u32,
    peer: u32,
) {
    // SAFETY: forwarded from the kernel's contract.
    unsafe { crate::ctl::wait_geq(flag, value, ctl, timeout_ns, slot, peer) }
}

/// `ringccl_p2p` ([`crate::p2p::P2P_ENTRY`]): one rank's group of sends, receives and a local
/// copy among processes, its one parameter passed by value (see [`crate::p2p`]).
///
/// # Safety
/// As for [`crate::p2p`]'s device body: every address valid, the grid `args.blocks()` blocks.
#[export_name = "ringccl_p2p"]
pub unsafe extern "ptx-kernel" fn p2p(args: crate::p2p::P2pArgs) {
    // SAFETY: forwarded from the kernel's contract.
    unsafe { crate::p2p::p2p(&args) }
}

/// `ringccl_p2p_small` ([`crate::p2p::P2P_SMALL_ENTRY`]): the same kernel as `ringccl_p2p`
/// with the small parameter ([`crate::p2p::P2pArgsSmall`]).
///
/// # Safety
/// As for `ringccl_p2p`.
#[export_name = "ringccl_p2p_small"]
pub unsafe extern "ptx-kernel" fn p2p_small(args: crate::p2p::P2pArgsSmall) {
    // SAFETY: forwarded from the kernel's contract.
    unsafe { crate::p2p::p2p(&args) }
}

/// `ringccl_ll_gather` ([`crate::ll::LL_GATHER_ENTRY`]): the LL all-gather
/// ([`crate::ll::ll_blocks`] blocks per rank; see [`crate::ll`]).
///
/// # Safety
/// See `crate::ll::all_gather`.
#[export_name = "ringccl_ll_gather"]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn ll_gather(
    src: *const u8,
    dst: *mut u8,
    bytes: u64,
    a0: *mut u8,
    a1: *mut u8,
    a2: *mut u8,
    a3: *mut u8,
    a4: *mut u8,
    a5: *mut u8,
    a6: *mut u8,
    a7: *mut u8,
    nranks: u32,
    rank: u32,
    ctl: *mut u64,
    timeout_ns: u64,
) {
    let areas: [*mut u8; crate::ctl::MAX_RANKS] = [a0, a1, a2, a3, a4, a5, a6, a7];
    // SAFETY: forwarded from the kernel's contract.
    unsafe {
        crate::ll::all_gather(
            src,
            dst,
            bytes as usize,
            areas,
            nranks as usize,
            rank as usize,
            ctl,
            timeout_ns,
        )
    }
}
