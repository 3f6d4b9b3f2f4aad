//! NCCL's primitives as plain generic Rust: one implementation behind every entry point.
//!
//! [`reduce_copy`] reads `nsrc` sources, folds them with a [`ReduceOp`], applies the operator's
//! final step, and writes the result to one or two destinations. Copy is the one-source case,
//! reduce the one-destination case, and reduce-copy the two-source case (a local buffer and a
//! peer's, written to the local output and optionally to the next peer).
//!
//! Each GPU thread calls the function with its [`Grid`] position and handles the elements
//! `thread, thread + threads, ...` (grid-stride). When every pointer has the same offset modulo
//! 16 bytes the bulk moves as 16-byte vectors (a scalar head brings the pointers to a 16-byte
//! boundary, a scalar tail finishes the count); otherwise every element moves on its own. The
//! same code runs on the host, one "thread" at a time, for the CPU tests.

use crate::element::Element;
use crate::op::ReduceOp;

/// Most sources one reduce kernel folds: the source slots (`s0..s7`) of the `ringccl_reduce_*`
/// entry points (see [`crate::entry`]).
pub const MAX_SRCS: usize = 8;

/// Bytes moved by one vector access.
pub const VECTOR_BYTES: usize = 16;

/// Vectors each thread keeps in flight per loop iteration.
const UNROLL: usize = 4;

/// A thread's position in the launch: global index and the total number of threads.
#[derive(Clone, Copy, Debug)]
pub struct Grid {
    /// `blockIdx.x * blockDim.x + threadIdx.x`.
    pub thread: usize,
    /// `gridDim.x * blockDim.x`.
    pub threads: usize,
}

/// 16 bytes as two 64-bit words (lane `j` of a `T` vector sits at bit `j * 8 * size_of::<T>()`,
/// little-endian as in memory), aligned so loads and stores are single vector accesses.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Pack([u64; 2]);

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn load_pack(p: *const Pack) -> Pack {
    let (a, b): (u64, u64);
    // SAFETY: the caller guarantees `p` is 16-byte aligned and readable for 16 bytes.
    unsafe {
        core::arch::asm!(
            "ld.v2.u64 {{{0}, {1}}}, [{2}];",
            out(reg64) a, out(reg64) b, in(reg64) p,
            options(readonly, nostack, preserves_flags)
        );
    }
    Pack([a, b])
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn store_pack(p: *mut Pack, v: Pack) {
    // SAFETY: the caller guarantees `p` is 16-byte aligned and writable for 16 bytes.
    unsafe {
        core::arch::asm!(
            "st.v2.u64 [{0}], {{{1}, {2}}};",
            in(reg64) p, in(reg64) v.0[0], in(reg64) v.0[1],
            options(nostack, preserves_flags)
        );
    }
}

// The host versions check the alignment the GPU's vector accesses need (a misaligned
// `ld.v2.u64` faults there, while x86 would silently accept it), so the CPU tests catch a
// pointer that reaches the vector path without being 16-byte aligned.
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
unsafe fn load_pack(p: *const Pack) -> Pack {
    debug_assert!(p.is_aligned(), "vector load from a misaligned address");
    // SAFETY: the caller guarantees `p` is aligned and readable for 16 bytes.
    unsafe { p.read() }
}

#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
unsafe fn store_pack(p: *mut Pack, v: Pack) {
    debug_assert!(p.is_aligned(), "vector store to a misaligned address");
    // SAFETY: the caller guarantees `p` is aligned and writable for 16 bytes.
    unsafe { p.write(v) }
}

/// Calls `f(i)` for `i = 0 .. min(n, MAX)` (at most 16), each `i` a literal. After inlining, `n` is a
/// constant or a uniform value and every array index is a constant, so the pointer arrays and
/// vectors stay in registers (a run-time index would put them in local memory, a stack frame).
#[inline(always)]
fn unrolled<const MAX: usize>(n: usize, mut f: impl FnMut(usize)) {
    macro_rules! each {
        ($($i:literal)*) => {$(
            if $i < MAX && $i < n {
                f($i);
            }
        )*};
    }
    each!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
}

/// Calls `f(k)` for the sources after the first: `k = 1 .. min(nsrc, NS)`.
#[inline(always)]
fn for_each_extra_source<const NS: usize>(nsrc: usize, mut f: impl FnMut(usize)) {
    unrolled::<NS>(nsrc, |k| {
        if k > 0 {
            f(k)
        }
    });
}

/// Calls `f(j)` for every lane `j < 16 / size_of::<T>()` of a vector.
#[inline(always)]
fn for_each_lane<T: Element>(f: impl FnMut(usize)) {
    unrolled::<VECTOR_BYTES>(VECTOR_BYTES / T::SIZE, f);
}

/// Lane `j` of a vector, as an element (pure shifts and masks: no memory).
#[inline(always)]
fn lane<T: Element>(p: &Pack, j: usize) -> T {
    let bit = j * T::SIZE * 8;
    let word = p.0[bit / 64];
    let raw = word >> (bit % 64);
    T::from_raw(if T::SIZE == 8 {
        raw
    } else {
        raw & ((1u64 << (T::SIZE * 8)) - 1)
    })
}

/// Replaces lane `j` of a vector.
#[inline(always)]
fn set_lane<T: Element>(p: &mut Pack, j: usize, x: T) {
    let bit = j * T::SIZE * 8;
    let shift = bit % 64;
    let mask = if T::SIZE == 8 {
        u64::MAX
    } else {
        ((1u64 << (T::SIZE * 8)) - 1) << shift
    };
    let w = &mut p.0[bit / 64];
    *w = (*w & !mask) | (x.to_raw() << shift);
}

/// Lane-wise `a = combine(a, b)` over the elements packed in two vectors.
#[inline(always)]
fn combine_pack<T: Element, O: ReduceOp>(a: &mut Pack, b: &Pack) {
    let mut out = Pack([0; 2]);
    for_each_lane::<T>(|j| set_lane(&mut out, j, O::combine(lane::<T>(a, j), lane::<T>(b, j))));
    *a = out;
}

/// Lane-wise final step (`avg`'s division) over one vector.
#[inline(always)]
fn finish_pack<T: Element, O: ReduceOp>(a: &mut Pack, postdiv: u32) {
    let mut out = Pack([0; 2]);
    for_each_lane::<T>(|j| set_lane(&mut out, j, O::finish(lane::<T>(a, j), postdiv)));
    *a = out;
}

/// `dst0[i] (and dst1[i]) = finish(srcs[0][i] ⊕ srcs[1][i] ⊕ … ⊕ srcs[nsrc-1][i])` for every
/// `i < count` this thread owns.
///
/// `NS` is the number of source slots (a compile-time bound), `nsrc` how many are used
/// (`1 ≤ nsrc ≤ NS`). `dst1` may be null. A destination may equal a source (in place).
///
/// # Safety
/// Every used source is readable and every destination writable for `count` elements of `T`,
/// each pointer aligned to `T`; destinations do not partially overlap sources or each other;
/// every thread of the grid calls this with the same arguments.
#[inline(always)]
pub unsafe fn reduce_copy<T: Element, O: ReduceOp, const NS: usize>(
    grid: Grid,
    srcs: [*const T; NS],
    nsrc: usize,
    dst0: *mut T,
    dst1: *mut T,
    count: usize,
    postdiv: u32,
) {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        if dst1.is_null() {
            run::<T, O, NS, false>(grid, srcs, nsrc, dst0, dst1, count, postdiv)
        } else {
            run::<T, O, NS, true>(grid, srcs, nsrc, dst0, dst1, count, postdiv)
        }
    }
}

#[inline(always)]
unsafe fn run<T: Element, O: ReduceOp, const NS: usize, const TWO: bool>(
    grid: Grid,
    srcs: [*const T; NS],
    nsrc: usize,
    dst0: *mut T,
    dst1: *mut T,
    count: usize,
    postdiv: u32,
) {
    let nsrc = if nsrc > NS { NS } else { nsrc };
    let misalign = dst0 as usize % VECTOR_BYTES;
    let mut aligned = !TWO || dst1 as usize % VECTOR_BYTES == misalign;
    aligned &= srcs[0] as usize % VECTOR_BYTES == misalign;
    for_each_extra_source::<NS>(nsrc, |k| {
        aligned &= srcs[k] as usize % VECTOR_BYTES == misalign
    });
    // SAFETY (all blocks below): indices stay below `count`, per this function's contract.
    if !aligned {
        unsafe { scalar::<T, O, NS, TWO>(grid, srcs, nsrc, dst0, dst1, 0, count, postdiv) };
        return;
    }
    let lanes = VECTOR_BYTES / T::SIZE;
    let head = ((VECTOR_BYTES - misalign) % VECTOR_BYTES) / T::SIZE;
    let head = if head > count { count } else { head };
    let nvec = (count - head) / lanes;
    let tail = head + nvec * lanes;
    unsafe {
        scalar::<T, O, NS, TWO>(grid, srcs, nsrc, dst0, dst1, 0, head, postdiv);
        vectors::<T, O, NS, TWO>(grid, srcs, nsrc, dst0, dst1, head, nvec, postdiv);
        scalar::<T, O, NS, TWO>(grid, srcs, nsrc, dst0, dst1, tail, count, postdiv);
    }
}

/// Elements `begin..end`, one at a time, grid-stride.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scalar<T: Element, O: ReduceOp, const NS: usize, const TWO: bool>(
    grid: Grid,
    srcs: [*const T; NS],
    nsrc: usize,
    dst0: *mut T,
    dst1: *mut T,
    begin: usize,
    end: usize,
    postdiv: u32,
) {
    let mut i = begin + grid.thread;
    while i < end {
        // SAFETY: i < end <= count; see `reduce_copy`.
        unsafe {
            let mut acc = *srcs[0].add(i);
            for_each_extra_source::<NS>(nsrc, |k| acc = O::combine(acc, *srcs[k].add(i)));
            let v = O::finish(acc, postdiv);
            *dst0.add(i) = v;
            if TWO {
                *dst1.add(i) = v;
            }
        }
        i += grid.threads;
    }
}

/// `nvec` 16-byte vectors starting at element `first` (16-byte aligned for every pointer),
/// grid-stride, `UNROLL` vectors in flight per thread.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn vectors<T: Element, O: ReduceOp, const NS: usize, const TWO: bool>(
    grid: Grid,
    srcs: [*const T; NS],
    nsrc: usize,
    dst0: *mut T,
    dst1: *mut T,
    first: usize,
    nvec: usize,
    postdiv: u32,
) {
    // Unused slots become pointers that are never dereferenced.
    let s: [*const Pack; NS] = srcs.map(|p| p.wrapping_add(first) as *const Pack);
    let d0 = dst0.wrapping_add(first) as *mut Pack;
    let d1 = dst1.wrapping_add(first) as *mut Pack;
    let step = grid.threads;
    let mut v = grid.thread;
    // SAFETY (both loops): v + u * step < nvec, so every access is inside the vector range.
    while v + (UNROLL - 1) * step < nvec {
        let mut acc = [Pack([0; 2]); UNROLL];
        unrolled::<UNROLL>(UNROLL, |u| {
            acc[u] = unsafe { load_pack(s[0].add(v + u * step)) }
        });
        for_each_extra_source::<NS>(nsrc, |k| {
            let mut inc = [Pack([0; 2]); UNROLL];
            unrolled::<UNROLL>(UNROLL, |u| {
                inc[u] = unsafe { load_pack(s[k].add(v + u * step)) }
            });
            unrolled::<UNROLL>(UNROLL, |u| combine_pack::<T, O>(&mut acc[u], &inc[u]));
        });
        unrolled::<UNROLL>(UNROLL, |u| {
            finish_pack::<T, O>(&mut acc[u], postdiv);
            unsafe {
                store_pack(d0.add(v + u * step), acc[u]);
                if TWO {
                    store_pack(d1.add(v + u * step), acc[u]);
                }
            }
        });
        v += UNROLL * step;
    }
    while v < nvec {
        let mut acc = unsafe { load_pack(s[0].add(v)) };
        for_each_extra_source::<NS>(nsrc, |k| {
            let inc = unsafe { load_pack(s[k].add(v)) };
            combine_pack::<T, O>(&mut acc, &inc);
        });
        finish_pack::<T, O>(&mut acc, postdiv);
        unsafe {
            store_pack(d0.add(v), acc);
            if TWO {
                store_pack(d1.add(v), acc);
            }
        }
        v += step;
    }
}

/// Vectors each thread keeps in flight per loop iteration of [`copy_deep`].
pub const DEEP_UNROLL: usize = 16;

/// `len` bytes from `src` to `dst` by the threads of `grid`, as [`reduce_copy`]'s one-source
/// copy but with [`DEEP_UNROLL`] 16-byte vectors in flight per thread instead of 4: for one
/// block moving a large range on its own (a point-to-point channel's share, written straight
/// into a peer's buffer), whose time is the loads' latency per loop iteration. Pointers not
/// aligned alike modulo 16, and ranges too short for one deep iteration of the grid, take
/// [`reduce_copy`].
///
/// ```
/// use gpu_kernels::prim::{copy_deep, Grid};
/// let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
/// let mut dst = vec![0u8; 5000];
/// // Two "threads", one after the other, as on the host.
/// for t in 0..2 {
///     // SAFETY: both ranges hold 4999 bytes from offset 1, and do not overlap.
///     unsafe { copy_deep(Grid { thread: t, threads: 2 }, src.as_ptr().add(1), dst.as_mut_ptr().add(1), 4999) };
/// }
/// assert_eq!(&dst[1..], &src[1..]);
/// ```
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping; every thread of the
/// grid calls this with the same arguments.
#[inline(always)]
pub unsafe fn copy_deep(grid: Grid, src: *const u8, dst: *mut u8, len: usize) {
    let mis = dst as usize % VECTOR_BYTES;
    let head = (VECTOR_BYTES - mis) % VECTOR_BYTES;
    let deep = grid.threads.saturating_mul(DEEP_UNROLL * VECTOR_BYTES);
    let plain = || {
        // SAFETY: per this function's contract.
        unsafe {
            reduce_copy::<u8, crate::op::Sum, 1>(grid, [src], 1, dst, core::ptr::null_mut(), len, 1)
        }
    };
    if src as usize % VECTOR_BYTES != mis || len < head.saturating_add(deep) {
        plain();
        return;
    }
    let nvec = (len - head) / VECTOR_BYTES;
    let tail = head + nvec * VECTOR_BYTES;
    // SAFETY (below): every access is inside the two ranges, per this function's contract;
    // `s` and `d` are 16-byte aligned (the head brings both to a boundary).
    unsafe {
        let one = |at: usize, n: usize| {
            reduce_copy::<u8, crate::op::Sum, 1>(
                grid,
                [src.add(at)],
                1,
                dst.add(at),
                core::ptr::null_mut(),
                n,
                1,
            )
        };
        one(0, head);
        let s = src.add(head) as *const Pack;
        let d = dst.add(head) as *mut Pack;
        let step = grid.threads;
        let mut v = grid.thread;
        while v + (DEEP_UNROLL - 1) * step < nvec {
            let mut p = [Pack([0; 2]); DEEP_UNROLL];
            unrolled::<DEEP_UNROLL>(DEEP_UNROLL, |u| p[u] = load_pack(s.add(v + u * step)));
            unrolled::<DEEP_UNROLL>(DEEP_UNROLL, |u| store_pack(d.add(v + u * step), p[u]));
            v += DEEP_UNROLL * step;
        }
        // The rest, 4 at a time, then one by one.
        while v + (UNROLL - 1) * step < nvec {
            let mut p = [Pack([0; 2]); UNROLL];
            unrolled::<UNROLL>(UNROLL, |u| p[u] = load_pack(s.add(v + u * step)));
            unrolled::<UNROLL>(UNROLL, |u| store_pack(d.add(v + u * step), p[u]));
            v += UNROLL * step;
        }
        while v < nvec {
            store_pack(d.add(v), load_pack(s.add(v)));
            v += step;
        }
        one(tail, len - tail);
    }
}

/// `dst[i] = src[i] * scalar` ([`Element::mul`]) for every `i < count` this thread owns:
/// NCCL's PreMulSum pre-multiplication (`FuncPreMulSum`'s `preOp` in
/// `src/device/reduce_kernel.h`), which for every type is that type's product: wrapping for
/// integers, IEEE for `f32`/`f64`, one correctly rounded `__hmul` for f16/bf16, and for fp8 the
/// binary16 product rounded back with saturation. Grid-stride; 16-byte vectors when `src` and
/// `dst` have the same offset modulo 16 bytes. `dst == src` (in place) is allowed.
///
/// # Safety
/// `src` readable and `dst` writable for `count` elements of `T`, each aligned to `T`; they
/// are equal or do not overlap; every thread of the grid calls this with the same arguments.
///
/// ```
/// use gpu_kernels::prim::{scale, Grid};
/// let src = [1.5f32, -2.0, 3.0];
/// let mut dst = [0.0f32; 3];
/// unsafe { scale(Grid { thread: 0, threads: 1 }, src.as_ptr(), dst.as_mut_ptr(), 3, 0.5) };
/// assert_eq!(dst, [0.75, -1.0, 1.5]);
/// ```
#[inline(always)]
pub unsafe fn scale<T: Element>(grid: Grid, src: *const T, dst: *mut T, count: usize, scalar: T) {
    let misalign = dst as usize % VECTOR_BYTES;
    let one = |i: usize| {
        // SAFETY: i < count; see this function's contract.
        unsafe { *dst.add(i) = (*src.add(i)).mul(scalar) }
    };
    let scalar_range = |begin: usize, end: usize| {
        let mut i = begin + grid.thread;
        while i < end {
            one(i);
            i += grid.threads;
        }
    };
    if src as usize % VECTOR_BYTES != misalign {
        scalar_range(0, count);
        return;
    }
    let lanes = VECTOR_BYTES / T::SIZE;
    let head = ((VECTOR_BYTES - misalign) % VECTOR_BYTES) / T::SIZE;
    let head = if head > count { count } else { head };
    let nvec = (count - head) / lanes;
    let tail = head + nvec * lanes;
    scalar_range(0, head);
    let s = src.wrapping_add(head) as *const Pack;
    let d = dst.wrapping_add(head) as *mut Pack;
    let mul_pack = |p: &Pack| {
        let mut out = Pack([0; 2]);
        for_each_lane::<T>(|j| set_lane(&mut out, j, lane::<T>(p, j).mul(scalar)));
        out
    };
    let step = grid.threads;
    let mut v = grid.thread;
    // SAFETY (both loops): v + u * step < nvec, so every access is inside the vector range.
    while v + (UNROLL - 1) * step < nvec {
        let mut acc = [Pack([0; 2]); UNROLL];
        unrolled::<UNROLL>(UNROLL, |u| {
            acc[u] = unsafe { load_pack(s.add(v + u * step)) }
        });
        unrolled::<UNROLL>(UNROLL, |u| {
            let out = mul_pack(&acc[u]);
            unsafe { store_pack(d.add(v + u * step), out) }
        });
        v += UNROLL * step;
    }
    while v < nvec {
        let out = mul_pack(&unsafe { load_pack(s.add(v)) });
        unsafe { store_pack(d.add(v), out) };
        v += step;
    }
    scalar_range(tail, count);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::{Bf16, F16};
    use crate::op::{Max, Sum};

    #[test]
    fn copy_deep_moves_every_byte_at_any_alignment_and_length() {
        // A 16-byte-aligned backing store, so the offsets below set the alignment.
        let mut src_store = [Pack([0; 2]); 4096];
        let mut dst_store = [Pack([0; 2]); 4096];
        let cap = 4096 * VECTOR_BYTES;
        for (i, b) in src_store
            .iter_mut()
            .flat_map(|p| p.0.iter_mut())
            .enumerate()
        {
            *b = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        for (so, doff) in [(0, 0), (3, 3), (5, 9), (15, 15), (1, 0)] {
            for len in [0, 1, 15, 16, 17, 255, 4096, 33 * 1024 + 7, cap - 32] {
                for threads in [1, 3, 64] {
                    for p in dst_store.iter_mut() {
                        *p = Pack([0; 2]);
                    }
                    let src = src_store.as_ptr() as *const u8;
                    let dst = dst_store.as_mut_ptr() as *mut u8;
                    for t in 0..threads {
                        // SAFETY: offsets + len stay inside the stores (len ≤ cap - 32).
                        unsafe {
                            copy_deep(Grid { thread: t, threads }, src.add(so), dst.add(doff), len)
                        };
                    }
                    // SAFETY: inside the stores.
                    let (a, b) = unsafe {
                        (
                            core::slice::from_raw_parts(src.add(so), len),
                            core::slice::from_raw_parts(dst as *const u8, cap),
                        )
                    };
                    assert_eq!(
                        &b[doff..doff + len],
                        a,
                        "{so}/{doff} {len} bytes, {threads} threads"
                    );
                    assert!(
                        b[..doff].iter().chain(&b[doff + len..]).all(|&x| x == 0),
                        "outside the range"
                    );
                }
            }
        }
    }

    /// `set_lane` writes exactly one lane and `lane` reads it back, for every lane of every type.
    fn check_lanes<T: Element + core::fmt::Debug>() {
        let lanes = VECTOR_BYTES / T::SIZE;
        let mut p = Pack([0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210]);
        let before = p;
        for j in 0..lanes {
            // The lane's own bytes, little-endian, as the memory layout has them.
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&before.0[0].to_le_bytes());
            bytes[8..].copy_from_slice(&before.0[1].to_le_bytes());
            let mut raw = 0u64;
            for (b, &byte) in bytes[j * T::SIZE..(j + 1) * T::SIZE].iter().enumerate() {
                raw |= u64::from(byte) << (8 * b);
            }
            assert_eq!(lane::<T>(&before, j).to_raw(), raw, "{} lane {j}", T::NAME);
        }
        for j in 0..lanes {
            let x = T::from_raw(0xa5a5_a5a5_a5a5_a5a5 ^ j as u64);
            set_lane(&mut p, j, x);
            for k in 0..lanes {
                let want = if k <= j {
                    T::from_raw(0xa5a5_a5a5_a5a5_a5a5 ^ k as u64)
                } else {
                    lane(&before, k)
                };
                assert_eq!(
                    lane::<T>(&p, k).to_raw(),
                    want.to_raw(),
                    "{} set {j} read {k}",
                    T::NAME
                );
            }
        }
    }

    #[test]
    fn lanes_of_every_type() {
        check_lanes::<f32>();
        check_lanes::<f64>();
        check_lanes::<F16>();
        check_lanes::<Bf16>();
        check_lanes::<i8>();
        check_lanes::<u8>();
        check_lanes::<i32>();
        check_lanes::<u32>();
        check_lanes::<i64>();
        check_lanes::<u64>();
        check_lanes::<crate::element::F8E4M3>();
        check_lanes::<crate::element::F8E5M2>();
    }

    #[test]
    fn combine_and_finish_packs_lane_wise() {
        let mut a = Pack([u64::from_le_bytes([1, 2, 3, 250, 5, 6, 7, 8]), u64::MAX]);
        let b = Pack([u64::from_le_bytes([10, 20, 30, 10, 50, 60, 70, 80]), 1]);
        combine_pack::<u8, Sum>(&mut a, &b);
        assert_eq!(a.0[0].to_le_bytes(), [11, 22, 33, 4, 55, 66, 77, 88]);
        assert_eq!(
            a.0[1],
            u64::from_le_bytes([0, 255, 255, 255, 255, 255, 255, 255])
        );
        let mut a = Pack([(-5i32 as u32 as u64) | (7u64 << 32), 3 | (9u64 << 32)]);
        let b = Pack([2 | (8u64 << 32), (-1i32 as u32 as u64) | (9u64 << 32)]);
        combine_pack::<i32, Max>(&mut a, &b);
        assert_eq!(a.0, [2 | (8u64 << 32), 3 | (9u64 << 32)]);
        let mut a = Pack([(-9i64) as u64, 9]);
        finish_pack::<i64, crate::op::Avg>(&mut a, 2);
        assert_eq!(a.0, [(-4i64) as u64, 4]);
    }
}
