//! `prim::reduce_copy` executed on the CPU: a grid is emulated by calling it once per thread
//! index, for every element type and operator, 1..=`MAX_SRCS` sources, one or two destinations,
//! in place or not, counts around the vector width, and pointer offsets that take the vector
//! path (same offset modulo 16 bytes: head, vectors, tail) or the scalar path (different
//! offsets).
//!
//! Each result is compared with a plain fold (`RedOp::combine`, then `RedOp::finish` with
//! `postdiv`); every buffer is surrounded by guard elements holding a sentinel, and outputs are
//! poisoned with it first, so a check also proves that exactly `count` elements were written and
//! the sources were not.

use gpu_kernels::element::{Bf16, Element, F16, F8E4M3, F8E5M2};
use gpu_kernels::op::{Avg, Max, Min, Prod, ReduceOp, Sum};
use gpu_kernels::prim::{reduce_copy, scale, Grid, MAX_SRCS, VECTOR_BYTES};
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::fmt::Debug;
use std::marker::PhantomData;

/// Element types with a random non-zero generator and a sentinel no result can equal by chance
/// (a NaN with a payload for the floats, whose test data stays finite).
trait TestElem: Element + Debug {
    const SENTINEL: Self;
    fn gen(r: &mut SmallRng) -> Self;
}

macro_rules! int_test_elem {
    ($($t:ty = $s:expr;)*) => {$(
        impl TestElem for $t {
            const SENTINEL: Self = $s;
            fn gen(r: &mut SmallRng) -> Self {
                loop {
                    let x: $t = r.random();
                    if x != 0 {
                        return x;
                    }
                }
            }
        }
    )*};
}
int_test_elem! {
    i8 = 0xa5u8 as i8;
    u8 = 0xa5;
    i32 = 0xa5a5_a5a5u32 as i32;
    u32 = 0xa5a5_a5a5;
    i64 = 0xa5a5_a5a5_a5a5_a5a5u64 as i64;
    u64 = 0xa5a5_a5a5_a5a5_a5a5;
}

/// A finite non-zero value in ±[0.5, 2): products of eight stay finite, sums round.
fn gen_f64(r: &mut SmallRng) -> f64 {
    let x = r.random_range(0.5..2.0);
    if r.random() {
        x
    } else {
        -x
    }
}

impl TestElem for f32 {
    const SENTINEL: Self = f32::from_bits(0xffe5_a5a5);
    fn gen(r: &mut SmallRng) -> Self {
        gen_f64(r) as f32
    }
}
impl TestElem for f64 {
    const SENTINEL: Self = f64::from_bits(0xfffd_a5a5_a5a5_a5a5);
    fn gen(r: &mut SmallRng) -> Self {
        gen_f64(r)
    }
}
impl TestElem for F16 {
    const SENTINEL: Self = F16(0xfe5a);
    fn gen(r: &mut SmallRng) -> Self {
        F16::from_f32(gen_f64(r) as f32)
    }
}
impl TestElem for Bf16 {
    const SENTINEL: Self = Bf16(0xffe5);
    fn gen(r: &mut SmallRng) -> Self {
        Bf16::from_f32(gen_f64(r) as f32)
    }
}

impl TestElem for F8E4M3 {
    const SENTINEL: Self = F8E4M3(0xff); // NaN
    fn gen(r: &mut SmallRng) -> Self {
        F8E4M3::from_f32(gen_f64(r) as f32)
    }
}
impl TestElem for F8E5M2 {
    const SENTINEL: Self = F8E5M2(0xfe); // NaN
    fn gen(r: &mut SmallRng) -> Self {
        F8E5M2::from_f32(gen_f64(r) as f32)
    }
}

/// 16 bytes, 16-aligned: the unit buffers are allocated in.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Chunk([u8; 16]);

/// Guard bytes on each side of a buffer's data.
const GUARD: usize = 64;

/// `len` elements starting `off` elements past a 16-byte boundary, with sentinel guards.
struct Buf<T> {
    mem: Vec<Chunk>,
    start: usize, // element index of the data
    len: usize,
    _t: PhantomData<T>,
}

impl<T: TestElem> Buf<T> {
    fn new(len: usize, off: usize) -> Self {
        let bytes = GUARD + off * T::SIZE + len * T::SIZE + GUARD;
        let mut b = Buf {
            mem: vec![Chunk([0; 16]); bytes.div_ceil(16)],
            start: (GUARD + off * T::SIZE) / T::SIZE,
            len,
            _t: PhantomData,
        };
        b.poison();
        b
    }
    fn all(&mut self) -> &mut [T] {
        let n = self.mem.len() * 16 / T::SIZE;
        // SAFETY: the chunks are plain bytes, 16-aligned, and every bit pattern is a valid `T`.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<T>(), n) }
    }
    fn poison(&mut self) {
        self.all().fill(T::SENTINEL);
    }
    fn set(&mut self, data: &[T]) {
        self.poison();
        let (s, n) = (self.start, self.len);
        self.all()[s..s + n].copy_from_slice(data);
    }
    /// The data's address, derived without a reference (`Vec::as_mut_ptr` keeps earlier raw
    /// pointers valid, so source and in-place destination pointers may coexist).
    fn ptr(&mut self) -> *mut T {
        self.mem.as_mut_ptr().cast::<T>().wrapping_add(self.start)
    }
    /// Checks the data equals `want` and every guard element still holds the sentinel.
    #[track_caller]
    fn check(&mut self, want: &[T], what: &str, case: &dyn Fn() -> String) {
        let (s, n) = (self.start, self.len);
        for (i, x) in self.all().iter().enumerate() {
            let (expect, place) = if (s..s + n).contains(&i) {
                (want[i - s], "element")
            } else {
                (T::SENTINEL, "guard")
            };
            assert!(
                x.to_raw() == expect.to_raw(),
                "{what} {place} {} = {x:?}, want {expect:?}; {}",
                i as isize - s as isize,
                case()
            );
        }
    }
}

/// The destinations of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dsts {
    /// `dst0` only.
    One,
    /// `dst0` and `dst1`.
    Two,
    /// `dst0` is source `k` (in place), no `dst1`.
    InPlace(usize),
    /// `dst0` is source `k`, plus `dst1`.
    InPlaceTwo(usize),
}

impl Dsts {
    fn two(self) -> bool {
        matches!(self, Dsts::Two | Dsts::InPlaceTwo(_))
    }
    fn in_place(self) -> Option<usize> {
        match self {
            Dsts::InPlace(k) | Dsts::InPlaceTwo(k) => Some(k),
            _ => None,
        }
    }
}

/// The thread counts every case runs with.
const THREADS: [usize; 4] = [1, 3, 32, 257];
/// Element counts: empty, below, at and above one vector and the unroll, large and odd.
const COUNTS: [usize; 8] = [0, 1, 3, 15, 16, 17, 1023, 4099];

/// Runs one case (sources, destinations, offsets) for every thread count and checks it.
#[allow(clippy::too_many_arguments)]
fn run_case<T: TestElem, O: ReduceOp, const NS: usize>(
    r: &mut SmallRng,
    nsrc: usize,
    dsts: Dsts,
    count: usize,
    src_off: &[usize],
    dst_off: [usize; 2],
    postdiv: u32,
    reverse: bool,
) {
    let data: Vec<Vec<T>> = (0..nsrc)
        .map(|_| (0..count).map(|_| T::gen(r)).collect())
        .collect();
    let want: Vec<T> = (0..count)
        .map(|i| {
            let acc = (1..nsrc).fold(data[0][i], |acc, k| O::KIND.combine(acc, data[k][i]));
            O::KIND.finish(acc, postdiv)
        })
        .collect();
    let mut srcs: Vec<Buf<T>> = (0..nsrc).map(|k| Buf::new(count, src_off[k])).collect();
    let mut d0 = Buf::<T>::new(count, dst_off[0]);
    let mut d1 = Buf::<T>::new(count, dst_off[1]);
    for threads in THREADS {
        let case = || {
            format!(
                "{} {} NS={NS} nsrc={nsrc} {dsts:?} count={count} src_off={src_off:?} \
                 dst_off={dst_off:?} postdiv={postdiv} threads={threads} reverse={reverse}",
                T::NAME,
                O::NAME
            )
        };
        for (b, d) in srcs.iter_mut().zip(&data) {
            b.set(d);
        }
        d0.poison();
        d1.poison();
        let mut sp = [std::ptr::null::<T>(); NS];
        for (p, b) in sp.iter_mut().zip(srcs.iter_mut()) {
            *p = b.ptr();
        }
        let dst0 = match dsts.in_place() {
            Some(k) => srcs[k].ptr(),
            None => d0.ptr(),
        };
        let dst1 = if dsts.two() {
            d1.ptr()
        } else {
            std::ptr::null_mut()
        };
        let grid = std::panic::AssertUnwindSafe(|| {
            for i in 0..threads {
                let thread = if reverse { threads - 1 - i } else { i };
                // SAFETY: every used pointer is valid for `count` elements, aligned to `T`;
                // the destinations are distinct buffers or exactly one source.
                unsafe {
                    reduce_copy::<T, O, NS>(
                        Grid { thread, threads },
                        sp,
                        nsrc,
                        dst0,
                        dst1,
                        count,
                        postdiv,
                    )
                };
            }
        });
        // A panic inside (the host's alignment checks) is reported with the case.
        if std::panic::catch_unwind(grid).is_err() {
            panic!("reduce_copy panicked; {}", case());
        }
        for (k, (b, d)) in srcs.iter_mut().zip(&data).enumerate() {
            let expect = if dsts.in_place() == Some(k) { &want } else { d };
            b.check(expect, &format!("source {k}"), &case);
        }
        if dsts.in_place().is_none() {
            d0.check(&want, "dst0", &case);
        } else {
            d0.check(&vec![T::SENTINEL; count], "unused dst0", &case);
        }
        if dsts.two() {
            d1.check(&want, "dst1", &case);
        } else {
            d1.check(&vec![T::SENTINEL; count], "unused dst1", &case);
        }
    }
}

/// Offsets (in elements) for the `nsrc` sources and two destinations: `None` puts every pointer
/// at `same` elements past a 16-byte boundary (the vector path with a head of
/// `lanes - same` elements); `Some(j)` moves pointer `j` (sources first, then dst0, dst1) to a
/// different offset, which forces the scalar path.
fn offsets<T: Element>(
    r: &mut SmallRng,
    nsrc: usize,
    dsts: Dsts,
    same: usize,
    odd_one: Option<usize>,
) -> (Vec<usize>, [usize; 2]) {
    let lanes = VECTOR_BYTES / T::SIZE;
    let mut all = vec![same; nsrc + 2];
    if let Some(j) = odd_one {
        all[j] = (same + r.random_range(1..lanes)) % lanes;
    }
    if let Some(k) = dsts.in_place() {
        all[nsrc] = all[k]; // dst0 is source k
    }
    (all[..nsrc].to_vec(), [all[nsrc], all[nsrc + 1]])
}

/// Every source/destination/count/offset combination for one type, operator and `NS`.
fn sweep<T: TestElem, O: ReduceOp, const NS: usize>(r: &mut SmallRng, nsrcs: &[usize]) {
    let lanes = VECTOR_BYTES / T::SIZE;
    let mut sames = vec![0, 1, lanes / 2, lanes - 1];
    sames.sort_unstable();
    sames.dedup();
    let mut n = 0usize;
    for &nsrc in nsrcs {
        for dsts in [
            Dsts::One,
            Dsts::Two,
            Dsts::InPlace(0),
            Dsts::InPlaceTwo(nsrc - 1),
        ] {
            for count in COUNTS {
                let postdiv = r.random_range(0..=nsrc as u32 + 1);
                // Small counts run every offset layout; the large ones (which cost 100x more)
                // one layout each, rotating, so every layout still meets every large count.
                let layouts = sames.len() + 1;
                let chosen: Vec<usize> = if count < 1000 {
                    (0..layouts).collect()
                } else {
                    vec![n % layouts]
                };
                for layout in chosen {
                    let (so, d) = if layout < sames.len() {
                        offsets::<T>(r, nsrc, dsts, sames[layout], None)
                    } else {
                        // The scalar path: a source, dst0 or dst1 (when used) off by some
                        // elements.
                        let mut candidates: Vec<usize> = (0..nsrc).collect();
                        if dsts.in_place().is_none() {
                            candidates.push(nsrc);
                        }
                        if dsts.two() {
                            candidates.push(nsrc + 1);
                        }
                        let odd = candidates[r.random_range(0..candidates.len())];
                        let same = r.random_range(0..lanes);
                        offsets::<T>(r, nsrc, dsts, same, Some(odd))
                    };
                    run_case::<T, O, NS>(r, nsrc, dsts, count, &so, d, postdiv, n % 2 == 1);
                    n += 1;
                }
            }
        }
    }
}

/// All operators and source layouts for one element type.
fn sweep_type<T: TestElem>(seed: u64) {
    let mut r = SmallRng::seed_from_u64(seed);
    macro_rules! ops {
        ($($o:ty),*) => {$(
            sweep::<T, $o, 1>(&mut r, &[1]);
            sweep::<T, $o, 2>(&mut r, &[2]);
            sweep::<T, $o, MAX_SRCS>(&mut r, &(1..=MAX_SRCS).collect::<Vec<_>>());
        )*};
    }
    ops!(Sum, Prod, Min, Max, Avg);
}

#[test]
fn grid_f32() {
    sweep_type::<f32>(1);
}
#[test]
fn grid_f64() {
    sweep_type::<f64>(2);
}
#[test]
fn grid_f16() {
    sweep_type::<F16>(3);
}
#[test]
fn grid_bf16() {
    sweep_type::<Bf16>(4);
}
#[test]
fn grid_i8() {
    sweep_type::<i8>(5);
}
#[test]
fn grid_u8() {
    sweep_type::<u8>(6);
}
#[test]
fn grid_i32() {
    sweep_type::<i32>(7);
}
#[test]
fn grid_u32() {
    sweep_type::<u32>(8);
}
#[test]
fn grid_i64() {
    sweep_type::<i64>(9);
}
#[test]
fn grid_u64() {
    sweep_type::<u64>(10);
}

#[test]
fn grid_f8e4m3() {
    sweep_type::<F8E4M3>(11);
}
#[test]
fn grid_f8e5m2() {
    sweep_type::<F8E5M2>(12);
}

/// `prim::scale` on an emulated grid: every element is `src[i].mul(scalar)` (NCCL's
/// pre-multiplication), exactly `count` elements written, in place or not, on the vector path
/// (same offsets modulo 16 bytes) and the scalar path (different offsets).
fn scale_type<T: TestElem>(seed: u64) {
    let mut r = SmallRng::seed_from_u64(seed);
    let lanes = VECTOR_BYTES / T::SIZE;
    for count in [0usize, 1, 2, 15, 16, 17, 63, 64, 65, 257, 1000, 4099] {
        for (src_off, dst_off) in [(0, 0), (1, 1), (lanes - 1, lanes - 1), (0, 1), (1, 0)] {
            for in_place in [false, true] {
                for threads in [1usize, 3, 64, 257] {
                    let scalar = T::gen(&mut r);
                    let data: Vec<T> = (0..count).map(|_| T::gen(&mut r)).collect();
                    let want: Vec<T> = data.iter().map(|x| x.mul(scalar)).collect();
                    let mut src = Buf::<T>::new(count, src_off);
                    let mut dst = Buf::<T>::new(count, dst_off);
                    src.set(&data);
                    let (s, d) = if in_place {
                        (src.ptr(), src.ptr())
                    } else {
                        (src.ptr(), dst.ptr())
                    };
                    for thread in 0..threads {
                        // SAFETY: both buffers hold `count` elements; in place they are one.
                        unsafe { scale(Grid { thread, threads }, s, d, count, scalar) };
                    }
                    let case = || {
                        format!(
                            "{} count={count} src_off={src_off} dst_off={dst_off} \
                             in_place={in_place} threads={threads} scalar={scalar:?}",
                            T::NAME
                        )
                    };
                    if in_place {
                        src.check(&want, "src (in place)", &case);
                    } else {
                        dst.check(&want, "dst", &case);
                        src.check(&data, "src", &case);
                    }
                }
            }
        }
    }
}

#[test]
fn scale_every_type() {
    scale_type::<f32>(21);
    scale_type::<f64>(22);
    scale_type::<F16>(23);
    scale_type::<Bf16>(24);
    scale_type::<i8>(25);
    scale_type::<u8>(26);
    scale_type::<i32>(27);
    scale_type::<u32>(28);
    scale_type::<i64>(29);
    scale_type::<u64>(30);
    scale_type::<F8E4M3>(31);
    scale_type::<F8E5M2>(32);
}

/// `nsrc` above `NS` folds the `NS` sources (the kernels clamp rather than read past the array).
#[test]
fn nsrc_above_ns_is_clamped() {
    let a = [1i32, 2, 3, 4, 5];
    let b = [10i32, 20, 30, 40, 50];
    let mut out = [0i32; 5];
    for nsrc in [2, 3, 9, usize::MAX] {
        // SAFETY: both sources and `out` hold 5 elements.
        unsafe {
            reduce_copy::<i32, Sum, 2>(
                Grid {
                    thread: 0,
                    threads: 1,
                },
                [a.as_ptr(), b.as_ptr()],
                nsrc,
                out.as_mut_ptr(),
                std::ptr::null_mut(),
                5,
                1,
            )
        };
        assert_eq!(out, [11, 22, 33, 44, 55], "nsrc = {nsrc}");
    }
}
