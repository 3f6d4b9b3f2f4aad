//! GPU tests of every collective against CPU references, on every visible GPU (2 or more).
//!
//! Run on a machine with 2+ GPUs: `cargo test -p ringccl-tests --test collectives --
//! --include-ignored --nocapture` (about 50 s on 2 × H200, debug build). Without the CUDA
//! driver, or with fewer than 2 GPUs, every GPU test fails with a message that says so. The
//! `checker` module's tests need no GPU: they check the checking code itself.
//!
//! # What is checked
//!
//! One test per collective iterates over the ten element types (`f32 f64 f16 bf16 i8 u8 i32 u32
//! i64 u64`), every operator where the collective reduces (`Sum Prod Min Max Avg`), the counts
//! {0, 1, 7, 4097, 2^20 + 3} and, for a subset (`f32`, `bf16`, `i32` with `Sum`, `f16` with
//! `Avg`; the same four types for the collectives that only move data), a count whose largest
//! per-rank buffer is 64 MiB; in place and out of place; every root for rooted collectives
//! (roots 0 and n − 1 for counts of 2^20 and more).
//!
//! Each case:
//! * fills every rank's inputs with seeded random values, never all zero: integers and the
//!   data-movement collectives take random bit patterns over the full range (NaN payloads
//!   included, which a copy must keep bit for bit); floats for `Sum`, `Avg`, `Min`, `Max` are
//!   `±m·2^e` with `m` in [1, 2) and `e` in [−4, 4]; floats for `Prod` are `±m` with `m` in
//!   [0.5, 2), so that products stay finite;
//! * poisons every output (a quiet NaN with a payload for floats, `0xa5…` for integers) and
//!   surrounds every buffer with [`GUARD`] poisoned elements on each side;
//! * after the call, downloads every buffer with its guards and compares all of it: the guards
//!   still poisoned (nothing written out of bounds), out-of-place inputs and buffers the
//!   collective does not use unchanged, every output element equal to the reference. An output
//!   element left unwritten keeps the poison, which never matches a float reference and matches
//!   an integer one with probability 2^-8 or less per element;
//! * for all-reduce, also compares the results of all ranks bit for bit.
//!
//! # References and error bounds
//!
//! Integer results are exact: wrapping sum and product (associative and commutative, so the
//! order of the ring does not matter), exact min and max, and the average as the wrapped sum
//! divided by the rank count, truncated toward zero (the kernels' `div_n`). Float `Min` and `Max`
//! are exact too (the result is one of the inputs, bit for bit), and so is every collective that
//! only moves data.
//!
//! Float `Sum`, `Avg` and `Prod` are compared with the `f64` fold of the `n` rank values of the
//! element, `S = Σ x_i` (`P = Π x_i`), with `A = Σ |x_i|`. Let `u` be the unit roundoff of the
//! type (2^-24 for `f32`, 2^-53 for `f64`, 2^-11 for `f16`, 2^-8 for `bf16`), `γ_k = k·u / (1 −
//! k·u)`, and `η` half the type's smallest subnormal. Whatever order the ring adds in, each of
//! the `n − 1` additions is correctly rounded in the type (see `gpu_kernels::element`), so:
//! * `Sum`: `|result − S| ≤ γ_{n−1}·A + u·|S| + (n − 1)·2^-53·A` (the last term covers the
//!   `f64` reference's own rounding; the `u·|S|` term is a margin for a final rounding);
//! * `Avg`: the sum above, divided by `n` once, correctly rounded: `|result − S/n| ≤ B_sum/n +
//!   u·(|S| + B_sum)/n + 2^-53·|S|/n + η`, with `B_sum` the sum's bound;
//! * `Prod`: `|result − P| ≤ γ_n·|P| + n·2^-53·|P| + n·η` (`n − 1` correctly rounded
//!   products and a margin of one more rounding; the inputs keep `P` far from underflow).
//!
//! The NCCL comparison ([`all_reduce_matches_nccl`]) checks NCCL's results against the same
//! bound and prints the largest difference between ringccl and NCCL.

use std::fmt::Debug;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut};
use half::{bf16, f16};
use ringccl::{Arg, Communicator, DeviceElement, Error, Io, RedOp, SendRecv};

// ---------------------------------------------------------------------------------------------
// Sizes
// ---------------------------------------------------------------------------------------------

/// Poisoned elements before and after every buffer a call sees.
const GUARD: usize = 64;

/// Counts every case runs at.
const SIZES: [usize; 5] = [0, 1, 7, 4097, (1 << 20) + 3];

/// Counts from here on count as large: rooted collectives try roots 0 and n − 1 only.
const LARGE: usize = 1 << 20;

/// The largest per-rank buffer of the 64 MiB cases.
const BIG_BYTES: usize = 64 << 20;

// ---------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------

/// What the tests need of an element type, beyond what ringccl needs.
trait Elem: DeviceElement {
    /// The value outputs are filled with before a call.
    const POISON: Self;
    /// Whether the type is a floating-point type.
    const FLOAT: bool;
    /// Unit roundoff (floats; 0 for integers).
    const U: f64;
    /// Half the smallest positive subnormal (floats; 0 for integers).
    const ETA: f64;
    /// The bits, zero-extended.
    fn bits(self) -> u64;
    /// The value made of the low bits of `b`.
    fn from_bits64(b: u64) -> Self;
    /// The value (floats: exact).
    fn to_f64(self) -> f64;
    /// The nearest value (floats).
    fn from_f64(x: f64) -> Self;
    /// One integer reduction step: wrapping sum (also for avg), wrapping product, min, max.
    fn int_combine(op: RedOp, a: Self, b: Self) -> Self;
    /// Integer division by the rank count, truncating toward zero.
    fn int_div(self, n: usize) -> Self;
}

/// `2^e` for a normal `f64` exponent, usable in constants.
const fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

macro_rules! float_elem {
    ($t:ty, $bits:ty, $poison:expr, $u:expr, $eta:expr, $to:expr, $from:expr) => {
        impl Elem for $t {
            const POISON: Self = <$t>::from_bits($poison);
            const FLOAT: bool = true;
            const U: f64 = $u;
            const ETA: f64 = $eta;
            fn bits(self) -> u64 {
                u64::from(self.to_bits())
            }
            fn from_bits64(b: u64) -> Self {
                <$t>::from_bits(b as $bits)
            }
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $to;
                f(self)
            }
            fn from_f64(x: f64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(x)
            }
            fn int_combine(_: RedOp, a: Self, _: Self) -> Self {
                a
            }
            fn int_div(self, _: usize) -> Self {
                self
            }
        }
    };
}

float_elem!(
    f32,
    u32,
    0x7fe5_a5a5,
    pow2(-24),
    pow2(-150),
    f64::from,
    |x| x as f32
);
float_elem!(
    f64,
    u64,
    0x7ffa_5a5a_5a5a_5a5a,
    pow2(-53),
    f64::from_bits(1),
    |x| x,
    |x| x
);
float_elem!(
    f16,
    u16,
    0x7e5a,
    pow2(-11),
    pow2(-25),
    f16::to_f64,
    f16::from_f64
);
float_elem!(
    bf16,
    u16,
    0x7fda,
    pow2(-8),
    pow2(-134),
    bf16::to_f64,
    bf16::from_f64
);

macro_rules! int_elem {
    ($t:ty, $u:ty, $poison:expr) => {
        impl Elem for $t {
            const POISON: Self = $poison as $u as $t;
            const FLOAT: bool = false;
            const U: f64 = 0.0;
            const ETA: f64 = 0.0;
            fn bits(self) -> u64 {
                u64::from(self as $u)
            }
            fn from_bits64(b: u64) -> Self {
                b as $u as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn int_combine(op: RedOp, a: Self, b: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => a.wrapping_add(b),
                    RedOp::Prod => a.wrapping_mul(b),
                    RedOp::Min => a.min(b),
                    RedOp::Max => a.max(b),
                }
            }
            fn int_div(self, n: usize) -> Self {
                self / n as $t
            }
        }
    };
}

int_elem!(i8, u8, 0xa5u8);
int_elem!(u8, u8, 0xa5u8);
int_elem!(i32, u32, 0xa5a5_a5a5u32);
int_elem!(u32, u32, 0xa5a5_a5a5u32);
int_elem!(i64, u64, 0xa5a5_a5a5_a5a5_a5a5u64);
int_elem!(u64, u64, 0xa5a5_a5a5_a5a5_a5a5u64);

fn type_name<T: Elem>() -> &'static str {
    T::DTYPE.name()
}

/// Whether (type, op) runs the 64 MiB case (`op` is `None` for the data-movement collectives).
fn big_subset<T: Elem>(op: Option<RedOp>) -> bool {
    let t = type_name::<T>();
    match op {
        Some(RedOp::Sum) => matches!(t, "f32" | "bf16" | "i32"),
        Some(RedOp::Avg) => t == "f16",
        Some(_) => false,
        None => matches!(t, "f32" | "bf16" | "i32" | "f16"),
    }
}

/// Elements of `T` in the 64 MiB case whose largest buffer is `factor * count` elements.
fn big_count<T: Elem>(factor: usize) -> usize {
    BIG_BYTES / std::mem::size_of::<T>() / factor
}

// ---------------------------------------------------------------------------------------------
// Random inputs
// ---------------------------------------------------------------------------------------------

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 * 2f64.powi(-53)
    }
}

/// A 64-bit hash of a label (FNV-1a), for seeds.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// How inputs are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Random bits (integers always; floats in the data-movement collectives).
    Bits,
    /// Floats `±m·2^e`, `m` in [1, 2), `e` in [−4, 4] (sum, avg, min, max).
    Wide,
    /// Floats `±m`, `m` in [0.5, 2) (prod).
    NearOne,
}

fn class_of<T: Elem>(op: Option<RedOp>) -> Class {
    match op {
        _ if !T::FLOAT => Class::Bits,
        None => Class::Bits,
        Some(RedOp::Prod) => Class::NearOne,
        Some(_) => Class::Wide,
    }
}

/// Elements per independently seeded block (so the values do not depend on the thread count).
const BLOCK: usize = 1 << 16;

fn gen<T: Elem>(label: &str, len: usize, class: Class) -> Vec<T> {
    let seed = hash(label);
    let mut v = vec![T::POISON; len];
    par_fill(&mut v, |start, chunk| {
        for (j, blk) in chunk.chunks_mut(BLOCK).enumerate() {
            let mut rng =
                Rng(seed ^ ((start + j * BLOCK) as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
            for x in blk {
                let bits = rng.next();
                let sign = if bits & 1 == 1 { -1.0 } else { 1.0 };
                *x = match class {
                    Class::Bits => T::from_bits64(bits),
                    Class::Wide => {
                        let e = (bits >> 1) % 9;
                        T::from_f64(sign * (1.0 + rng.unit()) * 2f64.powi(e as i32 - 4))
                    }
                    Class::NearOne => T::from_f64(sign * (0.5 + 1.5 * rng.unit())),
                };
            }
        }
    });
    assert!(
        len == 0 || v.iter().any(|x| x.bits() != 0),
        "{label}: generated all zeros"
    );
    v
}

// ---------------------------------------------------------------------------------------------
// Parallel helpers (the host side dominates the run time)
// ---------------------------------------------------------------------------------------------

fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(32)
}

/// Calls `f(start, chunk)` over chunks of `out` (multiples of [`BLOCK`]), in parallel.
fn par_fill<X: Send>(out: &mut [X], f: impl Fn(usize, &mut [X]) + Sync) {
    let t = threads();
    if out.len() <= 2 * BLOCK || t == 1 {
        f(0, out);
        return;
    }
    let per = out.len().div_ceil(t).next_multiple_of(BLOCK);
    std::thread::scope(|s| {
        for (k, chunk) in out.chunks_mut(per).enumerate() {
            let f = &f;
            s.spawn(move || f(k * per, chunk));
        }
    });
}

/// `f` over ranges covering `0..len`, in parallel; results in order.
fn par_ranges<R: Send>(len: usize, f: impl Fn(Range<usize>) -> R + Sync) -> Vec<R> {
    let t = threads();
    if len <= 2 * BLOCK || t == 1 {
        return vec![f(0..len)];
    }
    let per = len.div_ceil(t).next_multiple_of(BLOCK);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..len)
            .step_by(per)
            .map(|a| {
                let f = &f;
                s.spawn(move || f(a..(a + per).min(len)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a checker thread panicked"))
            .collect()
    })
}

// ---------------------------------------------------------------------------------------------
// References
// ---------------------------------------------------------------------------------------------

/// A float reference value and the allowed absolute error.
#[derive(Clone, Copy, Debug, Default)]
struct Approx {
    value: f64,
    bound: f64,
}

/// The reduction of all ranks' inputs, element by element.
enum Ref<T> {
    /// Exact (integers, min/max).
    Bits(Vec<T>),
    /// Within a bound (float sum, avg, prod).
    Approx(Vec<Approx>),
}

impl<T: Elem> Ref<T> {
    fn seg(&self, r: Range<usize>) -> Seg<'_, T> {
        match self {
            Ref::Bits(v) => Seg::Bits(&v[r]),
            Ref::Approx(v) => Seg::Approx(&v[r]),
        }
    }
}

fn gamma(k: usize, u: f64) -> f64 {
    let ku = k as f64 * u;
    ku / (1.0 - ku)
}

/// The reference of one element from the ranks' values (floats, sum/avg/prod).
fn float_ref(op: RedOp, xs: &[f64], u: f64, eta: f64) -> Approx {
    let n = xs.len();
    let r64 = 2f64.powi(-53);
    match op {
        RedOp::Prod => {
            let p: f64 = xs.iter().product();
            Approx {
                value: p,
                bound: gamma(n, u) * p.abs() + n as f64 * r64 * p.abs() + n as f64 * eta,
            }
        }
        _ => {
            let s: f64 = xs.iter().sum();
            let a: f64 = xs.iter().map(|x| x.abs()).sum();
            let b_sum = gamma(n - 1, u) * a + u * s.abs() + (n - 1) as f64 * r64 * a;
            if op == RedOp::Avg {
                let nf = n as f64;
                Approx {
                    value: s / nf,
                    bound: b_sum / nf + u * (s.abs() + b_sum) / nf + r64 * s.abs() / nf + eta,
                }
            } else {
                Approx {
                    value: s,
                    bound: b_sum,
                }
            }
        }
    }
}

/// The exact reduction of one element (integers; float min/max).
fn exact_ref<T: Elem>(op: RedOp, xs: &[T]) -> T {
    let first = xs[0];
    if T::FLOAT {
        xs[1..].iter().fold(first, |a, &b| {
            let (x, y) = (a.to_f64(), b.to_f64());
            let take_b = match op {
                RedOp::Min => y < x,
                RedOp::Max => y > x,
                _ => unreachable!("exact_ref on a float {op:?}"),
            };
            if take_b {
                b
            } else {
                a
            }
        })
    } else {
        let s = xs[1..].iter().fold(first, |a, &b| T::int_combine(op, a, b));
        if op == RedOp::Avg {
            s.int_div(xs.len())
        } else {
            s
        }
    }
}

/// The reduction (`op`) over ranks of `inputs`, element by element.
fn reduce_ref<T: Elem>(op: RedOp, inputs: &[Vec<T>]) -> Ref<T> {
    let n = inputs.len();
    let len = inputs[0].len();
    let exact = !T::FLOAT || matches!(op, RedOp::Min | RedOp::Max);
    if exact {
        let mut out = vec![T::POISON; len];
        par_fill(&mut out, |start, chunk| {
            let mut xs = vec![T::POISON; n];
            for (k, o) in chunk.iter_mut().enumerate() {
                for (x, v) in xs.iter_mut().zip(inputs) {
                    *x = v[start + k];
                }
                *o = exact_ref(op, &xs);
            }
        });
        Ref::Bits(out)
    } else {
        let mut out = vec![Approx::default(); len];
        par_fill(&mut out, |start, chunk| {
            let mut xs = vec![0.0; n];
            for (k, o) in chunk.iter_mut().enumerate() {
                for (x, v) in xs.iter_mut().zip(inputs) {
                    *x = v[start + k].to_f64();
                }
                *o = float_ref(op, &xs, T::U, T::ETA);
            }
        });
        Ref::Approx(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Buffer images: what a buffer holds before and must hold after a call
// ---------------------------------------------------------------------------------------------

/// A run of elements of a buffer image.
#[derive(Clone, Copy)]
enum Seg<'a, T> {
    /// The poison value, this many times.
    Poison(usize),
    /// Exactly these bits.
    Bits(&'a [T]),
    /// Floats within these bounds.
    Approx(&'a [Approx]),
}

impl<'a, T: Elem> Seg<'a, T> {
    fn len(&self) -> usize {
        match self {
            Seg::Poison(n) => *n,
            Seg::Bits(s) => s.len(),
            Seg::Approx(s) => s.len(),
        }
    }

    fn cut(&self, r: Range<usize>) -> Seg<'a, T> {
        match *self {
            Seg::Poison(_) => Seg::Poison(r.len()),
            Seg::Bits(s) => Seg::Bits(&s[r]),
            Seg::Approx(s) => Seg::Approx(&s[r]),
        }
    }

    fn matches(&self, i: usize, x: T) -> bool {
        match self {
            Seg::Poison(_) => x.bits() == T::POISON.bits(),
            Seg::Bits(s) => x.bits() == s[i].bits(),
            Seg::Approx(s) => {
                let v = x.to_f64();
                v.is_finite() && (v - s[i].value).abs() <= s[i].bound
            }
        }
    }

    fn describe(&self, i: usize) -> String {
        match self {
            Seg::Poison(_) => format!("the poison {:?} (untouched)", T::POISON),
            Seg::Bits(s) => format!("{:?} (bits {:#x})", s[i], s[i].bits()),
            Seg::Approx(s) => format!("{:e} ± {:e}", s[i].value, s[i].bound),
        }
    }
}

/// The elements `r` of an image.
fn cut<'a, T: Elem>(segs: &[Seg<'a, T>], r: Range<usize>) -> Vec<Seg<'a, T>> {
    let mut out = Vec::new();
    let mut pos = 0;
    for s in segs {
        let (a, b) = (pos, pos + s.len());
        let (lo, hi) = (r.start.max(a), r.end.min(b));
        if lo < hi {
            out.push(s.cut(lo - a..hi - a));
        }
        pos = b;
    }
    out
}

fn total<T: Elem>(segs: &[Seg<'_, T>]) -> usize {
    segs.iter().map(Seg::len).sum()
}

/// `base` with the elements from `off` on replaced by `top`.
fn overlay<'a, T: Elem>(base: &[Seg<'a, T>], off: usize, top: &[Seg<'a, T>]) -> Vec<Seg<'a, T>> {
    let len = total(base);
    let end = off + total(top);
    assert!(end <= len, "overlay past the end");
    let mut out = cut(base, 0..off);
    out.extend_from_slice(top);
    out.extend(cut(base, end..len));
    out
}

/// One device buffer of a case: its length, contents before, and contents required after.
struct Image<'a, T> {
    len: usize,
    before: Vec<Seg<'a, T>>,
    after: Vec<Seg<'a, T>>,
}

impl<'a, T: Elem> Image<'a, T> {
    fn new(before: Vec<Seg<'a, T>>, after: Vec<Seg<'a, T>>) -> Self {
        let len = total(&before);
        assert_eq!(len, total(&after), "image lengths differ");
        Image { len, before, after }
    }
    /// A buffer the call must not change.
    fn unchanged(segs: Vec<Seg<'a, T>>) -> Self {
        Self::new(segs.clone(), segs)
    }
    /// A poisoned output.
    fn output(after: Vec<Seg<'a, T>>) -> Self {
        Self::new(vec![Seg::Poison(total(&after))], after)
    }
}

/// The host contents of an image (poison and bits only), with the guards.
fn materialise<T: Elem>(segs: &[Seg<'_, T>]) -> Vec<T> {
    let mut v = Vec::with_capacity(total(segs) + 2 * GUARD);
    v.resize(GUARD, T::POISON);
    for s in segs {
        match s {
            Seg::Poison(n) => v.resize(v.len() + n, T::POISON),
            Seg::Bits(b) => v.extend_from_slice(b),
            Seg::Approx(_) => unreachable!("an input image holds approximate values"),
        }
    }
    v.resize(v.len() + GUARD, T::POISON);
    v
}

// ---------------------------------------------------------------------------------------------
// Tallies
// ---------------------------------------------------------------------------------------------

static TOTAL_TESTS: AtomicU64 = AtomicU64::new(0);
static TOTAL_CASES: AtomicU64 = AtomicU64::new(0);
static TOTAL_ELEMS: AtomicU64 = AtomicU64::new(0);
static TOTAL_BAD: AtomicU64 = AtomicU64::new(0);

/// Counts of one test; mismatches are collected, not panicked on, so a run reports them all.
struct Tally {
    name: &'static str,
    start: Instant,
    cases: u64,
    elements: u64,
    mismatches: u64,
    notes: Vec<String>,
}

impl Tally {
    fn new(name: &'static str) -> Self {
        Tally {
            name,
            start: Instant::now(),
            cases: 0,
            elements: 0,
            mismatches: 0,
            notes: Vec::new(),
        }
    }

    fn fail(&mut self, msg: String) {
        self.mismatches += 1;
        self.note(msg);
    }

    fn note(&mut self, msg: String) {
        if self.notes.len() < 30 {
            self.notes.push(msg);
        }
    }

    /// Compares `got` (a buffer with its guards) with `want` (an image without them).
    fn compare<T: Elem>(&mut self, what: &str, got: &[T], want: &[Seg<'_, T>]) {
        let mut segs = vec![Seg::Poison(GUARD)];
        segs.extend_from_slice(want);
        segs.push(Seg::Poison(GUARD));
        assert_eq!(got.len(), total(&segs), "{what}: downloaded length");
        let mut pos = 0;
        for s in &segs {
            let g = &got[pos..pos + s.len()];
            let parts = par_ranges(g.len(), |r| {
                let mut bad = 0u64;
                let mut first = None;
                for i in r {
                    if !s.matches(i, g[i]) {
                        bad += 1;
                        first.get_or_insert(i);
                    }
                }
                (bad, first)
            });
            for (bad, first) in parts {
                self.mismatches += bad;
                if let Some(i) = first {
                    let at = pos + i;
                    let place = if at < GUARD {
                        format!("guard before, element {}", at as isize - GUARD as isize)
                    } else if at >= got.len() - GUARD {
                        format!("guard after, element {}", at - GUARD)
                    } else {
                        format!("element {}", at - GUARD)
                    };
                    self.note(format!(
                        "{what} {place}: got {:?} (bits {:#x}), expected {} [{bad} bad in this run]",
                        g[i],
                        g[i].bits(),
                        s.describe(i)
                    ));
                }
            }
            self.elements += g.len() as u64;
            pos += s.len();
        }
    }

    /// Prints the summary line and fails the test if anything mismatched.
    fn finish(self) {
        let secs = self.start.elapsed().as_secs_f64();
        println!(
            "{}: {} cases, {} elements checked, {} mismatches ({secs:.1} s)",
            self.name, self.cases, self.elements, self.mismatches
        );
        let tests = TOTAL_TESTS.fetch_add(1, Ordering::SeqCst) + 1;
        let cases = TOTAL_CASES.fetch_add(self.cases, Ordering::SeqCst) + self.cases;
        let elems = TOTAL_ELEMS.fetch_add(self.elements, Ordering::SeqCst) + self.elements;
        let bad = TOTAL_BAD.fetch_add(self.mismatches, Ordering::SeqCst) + self.mismatches;
        println!(
            "so far in this run: {tests} tests, {cases} cases, {elems} elements checked, {bad} mismatches"
        );
        assert!(
            self.mismatches == 0 && self.notes.is_empty(),
            "{}: {} mismatches; the first ones:\n{}",
            self.name,
            self.mismatches,
            self.notes.join("\n")
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The environment and one case
// ---------------------------------------------------------------------------------------------

struct Env {
    comm: Communicator,
    n: usize,
}

impl Env {
    /// A communicator over every GPU; fails the test without a driver or with fewer than 2.
    fn new() -> Self {
        let comm = Communicator::all().unwrap_or_else(|e| {
            panic!("these tests need 2+ CUDA GPUs and the CUDA driver, but creating the communicator failed: {e}")
        });
        let n = comm.nranks();
        assert!(
            n >= 2,
            "these tests need 2+ CUDA GPUs; {n} visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)"
        );
        Env { comm, n }
    }

    /// [`Env::new`] with the all-reduce algorithm forced to `algorithm`.
    fn forced(algorithm: ringccl::Algorithm) -> Self {
        let mut config = ringccl::Config::from_env().expect("the RINGCCL_* variables");
        config.algorithm = Some(algorithm);
        let count = ringccl::device_count().expect("the CUDA driver");
        let ordinals: Vec<usize> = (0..count).collect();
        let comm = Communicator::with_config(&ordinals, config)
            .unwrap_or_else(|e| panic!("these tests need 2+ CUDA GPUs: {e}"));
        let n = comm.nranks();
        assert!(n >= 2, "these tests need 2+ CUDA GPUs; {n} visible");
        Env { comm, n }
    }

    fn stream(&self, r: usize) -> &Arc<CudaStream> {
        self.comm.stream(r)
    }

    fn streams(&self) -> Vec<&Arc<CudaStream>> {
        (0..self.n).map(|r| self.comm.stream(r)).collect()
    }

    /// Per rank, one poisoned buffer of `cap + 2 * GUARD` elements for each entry of `caps`.
    fn alloc<T: Elem>(&self, caps: &[usize]) -> Vec<Vec<CudaSlice<T>>> {
        (0..self.n)
            .map(|r| {
                caps.iter()
                    .map(|&c| {
                        self.stream(r)
                            .clone_htod(&vec![T::POISON; c + 2 * GUARD])
                            .unwrap_or_else(|e| {
                                panic!("allocating {c} elements on rank {r}: {e:?}")
                            })
                    })
                    .collect()
            })
            .collect()
    }

    fn sync(&self) {
        self.comm
            .synchronize()
            .unwrap_or_else(|e| panic!("synchronize failed: {e}"));
    }
}

/// Views of a case's buffers: per rank, per buffer (`None` where the rank has no such buffer).
type Views<'v, T> = [Vec<Option<CudaViewMut<'v, T>>>];

/// What a call must return.
#[derive(Clone, Copy, Debug)]
enum Want {
    Ok,
    Invalid(Option<usize>, Arg),
}

/// Runs one case: uploads the `before` images (with guards), calls `call` on views of exactly the
/// images' lengths, synchronises, downloads every buffer with its guards and compares it with the
/// `after` image. Returns the downloaded buffers without guards (per rank, per buffer).
fn run_case<T: Elem>(
    env: &Env,
    bufs: &mut [Vec<CudaSlice<T>>],
    images: &[Vec<Option<Image<'_, T>>>],
    label: &str,
    want: Want,
    call: impl for<'v, 'b> FnOnce(&'v mut Views<'b, T>) -> ringccl::Result<()>,
    tally: &mut Tally,
) -> Vec<Vec<Option<Vec<T>>>> {
    tally.cases += 1;
    for (r, (bs, ims)) in bufs.iter_mut().zip(images).enumerate() {
        for (b, im) in bs.iter_mut().zip(ims) {
            if let Some(im) = im {
                let host = materialise(&im.before);
                env.stream(r)
                    .memcpy_htod(&host, &mut b.slice_mut(0..host.len()))
                    .unwrap_or_else(|e| panic!("{label}: upload to rank {r}: {e:?}"));
            }
        }
    }
    let result = {
        let mut views: Vec<Vec<Option<CudaViewMut<'_, T>>>> = bufs
            .iter_mut()
            .zip(images)
            .map(|(bs, ims)| {
                bs.iter_mut()
                    .enumerate()
                    .map(|(k, b)| {
                        ims.get(k)
                            .and_then(Option::as_ref)
                            .map(|im| b.slice_mut(GUARD..GUARD + im.len))
                    })
                    .collect()
            })
            .collect();
        call(&mut views)
    };
    match (want, &result) {
        (Want::Ok, Ok(())) => {}
        (
            Want::Invalid(rank, arg),
            Err(Error::InvalidArgument {
                rank: r, arg: a, ..
            }),
        ) if *a == arg && (rank.is_none() || *r == rank) => {}
        _ => tally.fail(format!("{label}: expected {want:?}, got {result:?}")),
    }
    env.sync();
    let mut out = Vec::with_capacity(bufs.len());
    for (r, (bs, ims)) in bufs.iter().zip(images).enumerate() {
        let mut per = Vec::with_capacity(bs.len());
        for (k, (b, im)) in bs.iter().zip(ims).enumerate() {
            let Some(im) = im else {
                per.push(None);
                continue;
            };
            let got = env
                .stream(r)
                .clone_dtoh(&b.slice(0..im.len + 2 * GUARD))
                .unwrap_or_else(|e| panic!("{label}: download from rank {r}: {e:?}"));
            tally.compare(&format!("{label}: rank {r} buffer {k}"), &got, &im.after);
            per.push(Some(got[GUARD..GUARD + im.len].to_vec()));
        }
        out.push(per);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The collectives, described once
// ---------------------------------------------------------------------------------------------

/// The collectives are ringccl's own list; this file adds what a test case needs to know.
use ringccl::CollectiveKind as Coll;

/// How one rank passes its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    InPlace,
    OutOfPlace,
    SendOnly,
    RecvOnly,
}

/// How all ranks pass their buffers in a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// NCCL's in-place layout on every rank.
    InPlace,
    /// Separate buffers; ranks that only send or only receive give only that buffer.
    OutOfPlace,
    /// Separate buffers, and ranks that only send or receive also give the buffer the
    /// collective does not use, which must stay untouched (rooted collectives).
    OutOfPlaceExtra,
    /// Broadcast: the root gives only its input.
    RootSendOnly,
}

/// What the cases need to know of a collective, beyond `CollectiveKind`'s own properties.
trait Case: Sized {
    fn reduces(self) -> bool;
    fn rooted(self) -> bool;
    fn in_len(self, n: usize, c: usize) -> usize;
    fn out_len(self, n: usize, c: usize) -> usize;
    fn factor(self, n: usize) -> usize;
    fn has_send(self, r: usize, root: usize) -> bool;
    fn has_recv(self, r: usize, root: usize) -> bool;
    fn placements(self, count: usize) -> Vec<Placement>;
    fn in_place_input_offset(self, r: usize, root: usize, c: usize) -> usize;
    fn in_place_output_offset(self, r: usize, root: usize, c: usize) -> usize;
    #[allow(clippy::too_many_arguments)]
    fn call<T: Elem>(
        self,
        comm: &Communicator,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        root: usize,
        streams: &[&Arc<CudaStream>],
    ) -> ringccl::Result<()>;
}

impl Case for Coll {
    fn reduces(self) -> bool {
        self.has_op()
    }
    fn rooted(self) -> bool {
        self.has_root()
    }
    /// Per-rank input length for `count`.
    fn in_len(self, n: usize, c: usize) -> usize {
        match self {
            Coll::ReduceScatter | Coll::AllToAll | Coll::Scatter => n * c,
            _ => c,
        }
    }
    /// Per-rank output length for `count`.
    fn out_len(self, n: usize, c: usize) -> usize {
        match self {
            Coll::AllGather | Coll::AllToAll | Coll::Gather => n * c,
            _ => c,
        }
    }
    /// Largest buffer over `count`.
    fn factor(self, n: usize) -> usize {
        if matches!(self, Coll::AllReduce | Coll::Broadcast | Coll::Reduce) {
            1
        } else {
            n
        }
    }
    fn has_send(self, r: usize, root: usize) -> bool {
        !matches!(self, Coll::Broadcast | Coll::Scatter) || r == root
    }
    fn has_recv(self, r: usize, root: usize) -> bool {
        !matches!(self, Coll::Reduce | Coll::Gather) || r == root
    }
    fn placements(self, count: usize) -> Vec<Placement> {
        let mut p = vec![Placement::OutOfPlace];
        if self.has_in_place() {
            p.push(Placement::InPlace);
        }
        if self.rooted() && count < LARGE {
            p.push(Placement::OutOfPlaceExtra);
        }
        if self == Coll::Broadcast {
            p.push(Placement::RootSendOnly);
        }
        p
    }
    /// Where the input sits in an in-place buffer.
    fn in_place_input_offset(self, r: usize, root: usize, c: usize) -> usize {
        match self {
            Coll::AllGather => r * c,
            Coll::Gather if r == root => root * c,
            _ => 0,
        }
    }
    /// Where the output sits in an in-place buffer.
    fn in_place_output_offset(self, r: usize, root: usize, c: usize) -> usize {
        match self {
            Coll::ReduceScatter => r * c,
            Coll::Scatter if r == root => root * c,
            _ => 0,
        }
    }

    fn call<T: Elem>(
        self,
        comm: &Communicator,
        io: &mut [Io<'_, T>],
        count: usize,
        op: RedOp,
        root: usize,
        streams: &[&Arc<CudaStream>],
    ) -> ringccl::Result<()> {
        match self {
            Coll::AllReduce => comm.all_reduce(io, count, op, streams),
            Coll::ReduceScatter => comm.reduce_scatter(io, count, op, streams),
            Coll::AllGather => comm.all_gather(io, count, streams),
            Coll::Broadcast => comm.broadcast(io, count, root, streams),
            Coll::Reduce => comm.reduce(io, count, op, root, streams),
            Coll::AllToAll => comm.all_to_all(io, count, streams),
            Coll::Gather => comm.gather(io, count, root, streams),
            Coll::Scatter => comm.scatter(io, count, root, streams),
            Coll::SendRecv => unreachable!("send/recv groups have cases of their own"),
        }
    }
}

/// The `Io` of one rank from its views (buffer 0: send or in-place buffer, 1: receive).
fn io_for<'v, 'b, T: Send + Sync>(
    role: Role,
    views: &'v mut [Option<CudaViewMut<'b, T>>],
) -> Io<'v, T> {
    let (a, b) = views.split_at_mut(1);
    let a = a[0].as_mut();
    let b = b.get_mut(0).and_then(Option::as_mut);
    let missing = || panic!("a {role:?} rank without its buffer");
    match role {
        Role::InPlace => Io::in_place(a.unwrap_or_else(missing)),
        Role::OutOfPlace => {
            Io::out_of_place(&*a.unwrap_or_else(missing), b.unwrap_or_else(missing))
        }
        Role::SendOnly => Io::send_only(&*a.unwrap_or_else(missing)),
        Role::RecvOnly => Io::recv_only(b.unwrap_or_else(missing)),
    }
}

/// Rank `r`'s expected output of collective `coll`.
fn expected<'a, T: Elem>(
    coll: Coll,
    r: usize,
    root: usize,
    c: usize,
    inputs: &'a [Vec<T>],
    red: Option<&'a Ref<T>>,
) -> Vec<Seg<'a, T>> {
    let n = inputs.len();
    let red = || red.expect("a reducing collective without its reference");
    match coll {
        Coll::AllReduce | Coll::Reduce => vec![red().seg(0..c)],
        Coll::ReduceScatter => vec![red().seg(r * c..(r + 1) * c)],
        Coll::AllGather | Coll::Gather => inputs.iter().map(|v| Seg::Bits(&v[..])).collect(),
        Coll::Broadcast => vec![Seg::Bits(&inputs[root][..])],
        Coll::Scatter => vec![Seg::Bits(&inputs[root][r * c..(r + 1) * c])],
        Coll::AllToAll => (0..n)
            .map(|i| Seg::Bits(&inputs[i][r * c..(r + 1) * c]))
            .collect(),
        Coll::SendRecv => unreachable!("send/recv groups have cases of their own"),
    }
}

/// Per rank: role and images (buffer 0, buffer 1) of one case.
#[allow(clippy::type_complexity)]
fn plan<'a, T: Elem>(
    coll: Coll,
    placement: Placement,
    root: usize,
    c: usize,
    inputs: &'a [Vec<T>],
    red: Option<&'a Ref<T>>,
) -> (Vec<Role>, Vec<Vec<Option<Image<'a, T>>>>) {
    let n = inputs.len();
    let mut roles = Vec::with_capacity(n);
    let mut images = Vec::with_capacity(n);
    for r in 0..n {
        let (s, q) = (coll.has_send(r, root), coll.has_recv(r, root));
        let input = vec![Seg::Bits(&inputs[r][..])];
        let out = || expected(coll, r, root, c, inputs, red);
        let (role, ims) = match placement {
            Placement::InPlace => {
                let len = if s && q {
                    coll.in_len(n, c).max(coll.out_len(n, c))
                } else if s {
                    coll.in_len(n, c)
                } else {
                    coll.out_len(n, c)
                };
                let mut before = vec![Seg::Poison(len)];
                if s {
                    before = overlay(&before, coll.in_place_input_offset(r, root, c), &input);
                }
                let after = if q {
                    overlay(&before, coll.in_place_output_offset(r, root, c), &out())
                } else {
                    before.clone()
                };
                (Role::InPlace, vec![Some(Image::new(before, after)), None])
            }
            Placement::OutOfPlace | Placement::RootSendOnly => {
                let root_alone = placement == Placement::RootSendOnly && r == root;
                let send = s.then(|| Image::unchanged(input.clone()));
                let recv = (q && !root_alone).then(|| Image::output(out()));
                let role = match (send.is_some(), recv.is_some()) {
                    (true, true) => Role::OutOfPlace,
                    (true, false) => Role::SendOnly,
                    _ => Role::RecvOnly,
                };
                (role, vec![send, recv])
            }
            Placement::OutOfPlaceExtra => {
                let send = Image::unchanged(input.clone());
                let recv = if q {
                    Image::output(out())
                } else {
                    Image::unchanged(vec![Seg::Poison(coll.out_len(n, c))])
                };
                (Role::OutOfPlace, vec![Some(send), Some(recv)])
            }
        };
        roles.push(role);
        images.push(ims);
    }
    (roles, images)
}

/// Every case of `coll` for element type `T`.
fn run_coll<T: Elem>(env: &Env, coll: Coll, tally: &mut Tally) {
    let n = env.n;
    let ty = type_name::<T>();
    let ops: Vec<Option<RedOp>> = if coll.reduces() {
        RedOp::ALL.iter().copied().map(Some).collect()
    } else {
        vec![None]
    };
    let big = big_count::<T>(coll.factor(n));
    let mut counts = SIZES.to_vec();
    if ops.iter().any(|&op| big_subset::<T>(op)) {
        counts.push(big);
    }
    let cap = counts
        .iter()
        .map(|&c| c * coll.factor(n))
        .max()
        .unwrap_or(0);
    let mut bufs = env.alloc::<T>(&[cap, cap]);
    let streams = env.streams();
    for &count in &counts {
        let ops_here: Vec<Option<RedOp>> = ops
            .iter()
            .copied()
            .filter(|&op| count <= SIZES[SIZES.len() - 1] || big_subset::<T>(op))
            .collect();
        for class in [Class::Bits, Class::Wide, Class::NearOne] {
            let ops_c: Vec<Option<RedOp>> = ops_here
                .iter()
                .copied()
                .filter(|&op| class_of::<T>(op) == class)
                .collect();
            if ops_c.is_empty() {
                continue;
            }
            let in_len = coll.in_len(n, count);
            let inputs: Vec<Vec<T>> = (0..n)
                .map(|r| {
                    gen(
                        &format!("{} {ty} {count} {class:?} rank {r}", coll.name()),
                        in_len,
                        class,
                    )
                })
                .collect();
            for op in ops_c {
                let red = op.map(|op| reduce_ref(op, &inputs));
                let roots: Vec<usize> = match (coll.rooted(), count >= LARGE) {
                    (false, _) => vec![0],
                    (true, false) => (0..n).collect(),
                    (true, true) => vec![0, n - 1],
                };
                for root in roots {
                    for placement in coll.placements(count) {
                        let (roles, images) =
                            plan(coll, placement, root, count, &inputs, red.as_ref());
                        let op_name = op.map_or("-", RedOp::name);
                        let label = format!(
                            "{} {ty} {op_name} count={count} root={root} {placement:?}",
                            coll.name()
                        );
                        let out = run_case(
                            env,
                            &mut bufs,
                            &images,
                            &label,
                            Want::Ok,
                            |views| {
                                let mut io: Vec<Io<'_, T>> = views
                                    .iter_mut()
                                    .zip(&roles)
                                    .map(|(v, &role)| io_for(role, v))
                                    .collect();
                                coll.call(
                                    &env.comm,
                                    &mut io,
                                    count,
                                    op.unwrap_or(RedOp::Sum),
                                    root,
                                    &streams,
                                )
                            },
                            tally,
                        );
                        if coll == Coll::AllReduce {
                            let k = usize::from(placement != Placement::InPlace);
                            check_identical(&label, &out, k, tally);
                        }
                    }
                }
            }
        }
    }
}

/// All ranks' buffer `k` bit for bit equal to rank 0's.
fn check_identical<T: Elem>(label: &str, out: &[Vec<Option<Vec<T>>>], k: usize, tally: &mut Tally) {
    let Some(Some(first)) = out[0].get(k) else {
        tally.fail(format!("{label}: rank 0 has no output to compare"));
        return;
    };
    for (r, per) in out.iter().enumerate().skip(1) {
        let Some(Some(v)) = per.get(k) else {
            tally.fail(format!("{label}: rank {r} has no output to compare"));
            continue;
        };
        let differ = v.iter().zip(first).position(|(a, b)| a.bits() != b.bits());
        if let Some(i) = differ {
            tally.fail(format!(
                "{label}: rank {r}'s result differs from rank 0's at element {i}: {:?} vs {:?}",
                v[i], first[i]
            ));
        }
        tally.elements += v.len() as u64;
    }
}

/// Runs `f::<T>` for every element type.
macro_rules! for_all_types {
    ($f:ident($($arg:expr),*)) => {{
        $f::<f32>($($arg),*);
        $f::<f64>($($arg),*);
        $f::<f16>($($arg),*);
        $f::<bf16>($($arg),*);
        $f::<i8>($($arg),*);
        $f::<u8>($($arg),*);
        $f::<i32>($($arg),*);
        $f::<u32>($($arg),*);
        $f::<i64>($($arg),*);
        $f::<u64>($($arg),*);
    }};
}

fn collective_test(coll: Coll) {
    let env = Env::new();
    let mut tally = Tally::new(coll.name());
    for_all_types!(run_coll(&env, coll, &mut tally));
    tally.finish();
}

/// All-reduce: every type × op × size, in and out of place; the float bound of the module docs;
/// all ranks' results bit-identical.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn all_reduce() {
    collective_test(Coll::AllReduce);
}

/// All-reduce forced onto the copy engines (peer copies on a second stream per rank, SM
/// reductions on the caller's): the same cases and checks as `all_reduce`.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn all_reduce_on_copy_engines() {
    let env = Env::forced(ringccl::Algorithm::CopyEngine);
    let mut tally = Tally::new("all_reduce (copy engines)");
    for_all_types!(run_coll(&env, Coll::AllReduce, &mut tally));
    tally.finish();
}

/// All-reduce forced onto the two-shot kernel at every count (one kernel per rank of many
/// blocks, each folding a slice of its rank's shard and writing it into every rank's output):
/// the same cases and checks as `all_reduce`, from 0 and 1 element (empty slices) to the large
/// counts.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn all_reduce_two_shot() {
    let env = Env::forced(ringccl::Algorithm::TwoShot);
    let mut tally = Tally::new("all_reduce (two-shot)");
    for_all_types!(run_coll(&env, Coll::AllReduce, &mut tally));
    tally.finish();
}

/// Reduce-scatter, all-gather, all-to-all, broadcast and reduce forced onto the two-shot
/// kernel's barriers (one kernel per rank, each block a slice of the work: see
/// `gpu_kernels::oneshot`, "One kernel for the other collectives"): the same cases and checks
/// as their own tests, in and out of place, every root.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn other_collectives_two_shot() {
    let env = Env::forced(ringccl::Algorithm::TwoShot);
    for (coll, name) in [
        (Coll::ReduceScatter, "reduce_scatter (two-shot)"),
        (Coll::AllGather, "all_gather (two-shot)"),
        (Coll::AllToAll, "all_to_all (two-shot)"),
        (Coll::Broadcast, "broadcast (two-shot)"),
        (Coll::Reduce, "reduce (two-shot)"),
    ] {
        let mut tally = Tally::new(name);
        for_all_types!(run_coll(&env, coll, &mut tally));
        tally.finish();
    }
}

/// All-gather, broadcast and all-to-all forced onto the copy engines (plain copies from each
/// input to the outputs on a second stream per rank): the same cases and checks as their own
/// tests.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn copies_on_copy_engines() {
    let env = Env::forced(ringccl::Algorithm::CopyEngine);
    for coll in [Coll::AllGather, Coll::Broadcast, Coll::AllToAll] {
        let name = match coll {
            Coll::AllGather => "all_gather (copy engines)",
            Coll::Broadcast => "broadcast (copy engines)",
            _ => "all_to_all (copy engines)",
        };
        let mut tally = Tally::new(name);
        for_all_types!(run_coll(&env, coll, &mut tally));
        tally.finish();
    }
}

/// Reduce-scatter: every type × op × size, in and out of place (the in-place buffer's other
/// blocks are inputs and must stay unchanged).
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn reduce_scatter() {
    collective_test(Coll::ReduceScatter);
}

/// All-gather: every type × size, in and out of place, bit-exact.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn all_gather() {
    collective_test(Coll::AllGather);
}

/// Broadcast: every type × size × root, in place, out of place, with unused buffers given, and
/// with the root giving only its input; bit-exact.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn broadcast() {
    collective_test(Coll::Broadcast);
}

/// Reduce: every type × op × size × root, in place, out of place, and with the non-roots'
/// unused output buffers given (which must stay poisoned).
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn reduce() {
    collective_test(Coll::Reduce);
}

/// All-to-all: every type × size, out of place (in place is refused, see
/// [`invalid_arguments_leave_buffers_untouched`]); bit-exact.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn all_to_all() {
    collective_test(Coll::AllToAll);
}

/// Gather: every type × size × root, in place, out of place, and with unused buffers given.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn gather() {
    collective_test(Coll::Gather);
}

/// Scatter: every type × size × root, in place, out of place, and with unused buffers given.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn scatter() {
    collective_test(Coll::Scatter);
}

// ---------------------------------------------------------------------------------------------
// send/recv
// ---------------------------------------------------------------------------------------------

/// Elements rank `from` sends to rank `to` in the all-pairs pattern of count `c`: `c`, `c − 1`
/// or `c − 2` (some transfers are empty for small counts, which a group must skip).
fn pair_count(from: usize, to: usize, c: usize) -> usize {
    c.saturating_sub((from + 2 * to) % 3)
}

/// send/recv groups, bit-exact, every type × size:
/// * all pairs: every rank sends a block of its buffer to every rank (itself included, a local
///   copy), counts varying per pair (some 0), each into its own receive buffer, in one group;
/// * a ring shift (rank r sends to r + 1), also at 64 MiB for the subset.
///
/// In place does not apply: a group's receive buffers must not overlap any of its buffers.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn send_recv() {
    let env = Env::new();
    let mut tally = Tally::new("send_recv");
    for_all_types!(send_recv_for(&env, &mut tally));
    tally.finish();
}

fn send_recv_for<T: Elem>(env: &Env, tally: &mut Tally) {
    let n = env.n;
    let ty = type_name::<T>();
    let small = SIZES[SIZES.len() - 1];
    let big = big_subset::<T>(None).then(|| big_count::<T>(1));
    // Buffer 0: send (n blocks); buffers 1..=n: one receive buffer per sender.
    let mut caps = vec![n * small];
    caps.extend(std::iter::repeat_n(small, n));
    if let Some(b) = big {
        caps[0] = caps[0].max(b);
        caps[1] = b;
    }
    let mut bufs = env.alloc::<T>(&caps);
    let streams = env.streams();

    for &c in SIZES.iter().chain(big.iter()) {
        let label = |what: &str| format!("send_recv {ty} {what} count={c}");
        let inputs: Vec<Vec<T>> = (0..n)
            .map(|r| gen(&format!("send_recv {ty} {c} rank {r}"), n * c, Class::Bits))
            .collect();

        // All pairs (small counts only).
        if c <= small {
            let images: Vec<Vec<Option<Image<'_, T>>>> = (0..n)
                .map(|to| {
                    let mut ims = vec![Some(Image::unchanged(vec![Seg::Bits(&inputs[to][..])]))];
                    for (from, input) in inputs.iter().enumerate() {
                        let k = pair_count(from, to, c);
                        ims.push(Some(Image::output(vec![
                            Seg::Bits(&input[to * c..to * c + k]),
                            Seg::Poison(c - k),
                        ])));
                    }
                    ims
                })
                .collect();
            run_case(
                env,
                &mut bufs,
                &images,
                &label("all pairs"),
                Want::Ok,
                |views| {
                    // Split each rank's views into its send view and its receive views.
                    let mut sends = Vec::with_capacity(n);
                    let mut recvs = Vec::with_capacity(n);
                    for v in views.iter_mut() {
                        let (s, r) = v.split_at_mut(1);
                        sends.push(s[0].as_ref().expect("send view"));
                        recvs.push(
                            r.iter_mut()
                                .map(|x| x.as_mut().expect("recv view"))
                                .collect::<Vec<_>>(),
                        );
                    }
                    let subs: Vec<Vec<_>> = sends
                        .iter()
                        .map(|s| (0..n).map(|to| s.slice(to * c..(to + 1) * c)).collect())
                        .collect();
                    let mut pairs = Vec::with_capacity(n * n);
                    for (to, rv) in recvs.into_iter().enumerate() {
                        for (from, recv) in rv.into_iter().enumerate() {
                            pairs.push(SendRecv::new(
                                from,
                                &subs[from][to],
                                to,
                                recv,
                                pair_count(from, to, c),
                            ));
                        }
                    }
                    env.comm.send_recv(&mut pairs, &streams)
                },
                tally,
            );
        }

        // Ring shift: rank r's first c elements to rank r + 1's buffer 1.
        let images: Vec<Vec<Option<Image<'_, T>>>> = (0..n)
            .map(|to| {
                let from = (to + n - 1) % n;
                vec![
                    Some(Image::unchanged(vec![Seg::Bits(&inputs[to][..c])])),
                    Some(Image::output(vec![Seg::Bits(&inputs[from][..c])])),
                ]
            })
            .collect();
        run_case(
            env,
            &mut bufs,
            &images,
            &label("ring shift"),
            Want::Ok,
            |views| {
                let mut sends = Vec::with_capacity(n);
                let mut recvs = Vec::with_capacity(n);
                for v in views.iter_mut() {
                    let (s, r) = v.split_at_mut(1);
                    sends.push(s[0].as_ref().expect("send view"));
                    recvs.push(r[0].as_mut().expect("recv view"));
                }
                let mut pairs: Vec<SendRecv<'_, T>> = recvs
                    .into_iter()
                    .enumerate()
                    .map(|(to, recv)| {
                        let from = (to + n - 1) % n;
                        SendRecv::new(from, sends[from], to, recv, c)
                    })
                    .collect();
                env.comm.send_recv(&mut pairs, &streams)
            },
            tally,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// One-shot all-reduce, back to back
// ---------------------------------------------------------------------------------------------

/// 1000 small all-reduces (one-shot under the default threshold: 4097 × 8 B = 32 KiB) enqueued
/// back to back with no host synchronisation, alternating in place (on `x`, which every call
/// turns into the sum over ranks) and out of place (distinct fixed inputs into `y`), then one
/// check: `x` equals the host's replay of the same sequence (wrapping u64 sums, exact), `y` the
/// sum of the fixed inputs, the fixed inputs unchanged, all ranks identical. A race between a
/// rank's in-place write and a peer's read, or a lost barrier epoch, changes `x`; a deadlock
/// ends in a timeout error instead of a result (`Config::timeout`). Prints the mean time per call.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn oneshot_all_reduce_back_to_back() {
    const CALLS: usize = 1000;
    const COUNT: usize = 4097;
    let env = Env::new();
    let n = env.n;
    let streams = env.streams();
    let x0: Vec<Vec<u64>> = (0..n)
        .map(|r| gen::<u64>(&format!("oneshot x {r}"), COUNT, Class::Bits))
        .collect();
    let fixed: Vec<Vec<u64>> = (0..n)
        .map(|r| gen::<u64>(&format!("oneshot fixed {r}"), COUNT, Class::Bits))
        .collect();
    let upload = |host: &[Vec<u64>]| -> Vec<CudaSlice<u64>> {
        (0..n)
            .map(|r| {
                env.stream(r)
                    .clone_htod(&host[r])
                    .unwrap_or_else(|e| panic!("upload to rank {r}: {e:?}"))
            })
            .collect()
    };
    let mut x = upload(&x0);
    let inputs = upload(&fixed);
    let mut y = upload(&vec![vec![0xa5a5_a5a5_a5a5_a5a5u64; COUNT]; n]);
    env.sync();

    let sum = |bufs: &[Vec<u64>]| -> Vec<u64> {
        (0..COUNT)
            .map(|i| bufs.iter().fold(0u64, |a, b| a.wrapping_add(b[i])))
            .collect()
    };
    let mut want_x = x0.clone();
    let start = Instant::now();
    for call in 0..CALLS {
        if call % 2 == 0 {
            let mut io: Vec<Io<u64>> = x.iter_mut().map(Io::in_place).collect();
            env.comm
                .all_reduce(&mut io, COUNT, RedOp::Sum, &streams)
                .unwrap_or_else(|e| panic!("call {call} (in place): {e}"));
            let s = sum(&want_x);
            want_x = vec![s; n];
        } else {
            let mut io: Vec<Io<u64>> = inputs
                .iter()
                .zip(y.iter_mut())
                .map(|(i, o)| Io::out_of_place(i, o))
                .collect();
            env.comm
                .all_reduce(&mut io, COUNT, RedOp::Sum, &streams)
                .unwrap_or_else(|e| panic!("call {call} (out of place): {e}"));
        }
    }
    env.sync();
    let elapsed = start.elapsed();
    println!(
        "{CALLS} back-to-back all-reduces of {COUNT} u64 on {n} GPUs: {:.2} us per call \
         (enqueue + run, host clock)",
        elapsed.as_secs_f64() * 1e6 / CALLS as f64
    );
    let want_y = sum(&fixed);
    let download = |b: &CudaSlice<u64>, r: usize| -> Vec<u64> {
        env.stream(r)
            .clone_dtoh(b)
            .unwrap_or_else(|e| panic!("download from rank {r}: {e:?}"))
    };
    for r in 0..n {
        let got_x = download(&x[r], r);
        let bad = (0..COUNT).filter(|&i| got_x[i] != want_x[r][i]).count();
        assert_eq!(bad, 0, "rank {r}: {bad} of {COUNT} in-place results wrong");
        let got_y = download(&y[r], r);
        let bad = (0..COUNT).filter(|&i| got_y[i] != want_y[i]).count();
        assert_eq!(
            bad, 0,
            "rank {r}: {bad} of {COUNT} out-of-place results wrong"
        );
        assert_eq!(download(&inputs[r], r), fixed[r], "rank {r}: input changed");
    }
}

// ---------------------------------------------------------------------------------------------
// NCCL comparison
// ---------------------------------------------------------------------------------------------

/// ringccl's and NCCL's sum all-reduce of the same f32, f16 and bf16 inputs (counts 4097,
/// 2^20 + 3 and 64 MiB): both within the bound of the module docs, and the largest difference
/// between them printed. Fails if libnccl cannot be loaded.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn all_reduce_matches_nccl() {
    let env = Env::new();
    // SAFETY: only tries to load the library, to report its absence instead of panicking later.
    let present = unsafe { cudarc::nccl::sys::is_culib_present() };
    assert!(
        present,
        "libnccl.so could not be loaded: this comparison needs NCCL (install libnccl2, or put \
         libnccl.so on LD_LIBRARY_PATH)"
    );
    let streams: Vec<Arc<CudaStream>> = (0..env.n).map(|r| env.stream(r).clone()).collect();
    // Kept alive to the end of the test: dropping a `Comm` aborts it (and panics on failure).
    let comms = cudarc::nccl::Comm::from_devices(streams)
        .unwrap_or_else(|e| panic!("ncclCommInitAll failed: {:?}", e.0));
    let mut tally = Tally::new("all_reduce vs NCCL");
    nccl_for::<f32>(&env, &comms, &mut tally);
    nccl_for::<f16>(&env, &comms, &mut tally);
    nccl_for::<bf16>(&env, &comms, &mut tally);
    env.sync();
    drop(comms);
    tally.finish();
}

fn nccl_for<T: Elem + cudarc::nccl::NcclType>(
    env: &Env,
    comms: &[cudarc::nccl::Comm],
    tally: &mut Tally,
) {
    let n = env.n;
    let ty = type_name::<T>();
    let counts = [4097, (1 << 20) + 3, big_count::<T>(1)];
    let cap = counts.iter().copied().max().unwrap_or(0);
    let mut bufs = env.alloc::<T>(&[cap, cap]);
    let streams = env.streams();
    for count in counts {
        let inputs: Vec<Vec<T>> = (0..n)
            .map(|r| gen(&format!("nccl {ty} {count} rank {r}"), count, Class::Wide))
            .collect();
        let red = reduce_ref(RedOp::Sum, &inputs);
        let images: Vec<Vec<Option<Image<'_, T>>>> = inputs
            .iter()
            .map(|x| {
                vec![
                    Some(Image::unchanged(vec![Seg::Bits(&x[..])])),
                    Some(Image::output(vec![red.seg(0..count)])),
                ]
            })
            .collect();
        let roles = vec![Role::OutOfPlace; n];
        let ours = run_case(
            env,
            &mut bufs,
            &images,
            &format!("ringccl {ty} sum count={count}"),
            Want::Ok,
            |views| {
                let mut io: Vec<Io<'_, T>> = views
                    .iter_mut()
                    .zip(&roles)
                    .map(|(v, &role)| io_for(role, v))
                    .collect();
                env.comm.all_reduce(&mut io, count, RedOp::Sum, &streams)
            },
            tally,
        );
        let theirs = run_case(
            env,
            &mut bufs,
            &images,
            &format!("NCCL {ty} sum count={count}"),
            Want::Ok,
            |views| {
                // The NCCL reference's failures are reported as failed calls of its API.
                let nccl = |e: cudarc::nccl::result::NcclError| Error::Cuda {
                    call: "nccl (reference)",
                    code: format!("{:?}", e.0),
                    rank: None,
                };
                cudarc::nccl::group_start().map_err(nccl)?;
                let mut result = Ok(());
                for (comm, v) in comms.iter().zip(views.iter_mut()) {
                    let (a, b) = v.split_at_mut(1);
                    let (Some(send), Some(recv)) = (a[0].as_ref(), b[0].as_mut()) else {
                        unreachable!("both buffers are given");
                    };
                    if let Err(e) = comm.all_reduce(send, recv, &cudarc::nccl::ReduceOp::Sum) {
                        result = Err(nccl(e));
                        break;
                    }
                }
                let end = cudarc::nccl::group_end().map_err(nccl);
                result.and(end.map(|_| ()))
            },
            tally,
        );
        let mut max_diff = 0f64;
        let mut differ = 0usize;
        for (o, t) in ours.iter().zip(&theirs) {
            let (Some(Some(o)), Some(Some(t))) = (o.get(1), t.get(1)) else {
                continue;
            };
            for (a, b) in o.iter().zip(t) {
                if a.bits() != b.bits() {
                    differ += 1;
                    max_diff = max_diff.max((a.to_f64() - b.to_f64()).abs());
                }
            }
        }
        println!(
            "NCCL {ty} sum count={count}: {differ} elements differ from ringccl in bits, max |ringccl − NCCL| = {max_diff:e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Validation on real GPUs
// ---------------------------------------------------------------------------------------------

/// Per rank: a send image (the first `send` inputs), a poisoned receive image of `recv`
/// elements and a poisoned spare of `spare` elements; none of them may change.
fn unchanged_images(
    inputs: &[Vec<f32>],
    send: usize,
    recv: usize,
    spare: usize,
) -> Vec<Vec<Option<Image<'_, f32>>>> {
    inputs
        .iter()
        .map(|x| {
            vec![
                Some(Image::unchanged(vec![Seg::Bits(&x[..send])])),
                Some(Image::unchanged(vec![Seg::Poison(recv)])),
                Some(Image::unchanged(vec![Seg::Poison(spare)])),
            ]
        })
        .collect()
}

/// Per rank: (send, recv, spare) views.
type Parts<'v, 'b> = Vec<(
    &'v CudaViewMut<'b, f32>,
    &'v mut CudaViewMut<'b, f32>,
    &'v mut CudaViewMut<'b, f32>,
)>;

fn parts<'v, 'b>(views: &'v mut Views<'b, f32>) -> Parts<'v, 'b> {
    views
        .iter_mut()
        .map(|v| {
            let [a, b, s] = &mut v[..] else {
                unreachable!("three buffers per rank")
            };
            (
                &*a.as_mut().expect("send"),
                b.as_mut().expect("recv"),
                s.as_mut().expect("spare"),
            )
        })
        .collect()
}

/// Out-of-place `Io`s from (send, recv) parts.
fn oop<'v, 'b>(p: Parts<'v, 'b>) -> Vec<Io<'v, f32>> {
    p.into_iter()
        .map(|(s, q, _)| Io::out_of_place(s, q))
        .collect()
}

/// Invalid calls on real GPU buffers return `InvalidArgument` (naming the argument, and the
/// rank where one is at fault) and leave every buffer as it was: outputs still poisoned, inputs
/// unchanged, nothing written anywhere.
#[test]
#[ignore = "needs 2+ CUDA GPUs"]
fn invalid_arguments_leave_buffers_untouched() {
    let env = Env::new();
    let n = env.n;
    let last = n - 1;
    let mut tally = Tally::new("invalid arguments");
    let c = 4097;
    // Per rank: 0 send, 1 recv, 2 a spare output.
    let mut bufs = env.alloc::<f32>(&[n * c, n * c, n * c]);
    let streams = env.streams();
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| gen(&format!("invalid rank {r}"), n * c, Class::Wide))
        .collect();
    let images = |send, recv, spare| unchanged_images(&inputs, send, recv, spare);

    run_case(
        &env,
        &mut bufs,
        &images(c, c, c),
        "all_reduce, rank 0's recv on another device",
        Want::Invalid(Some(0), Arg::Recv),
        |views| {
            let mut p = parts(views);
            // Rank 0's output becomes rank 1's spare buffer.
            let (p0, p1) = p.split_at_mut(1);
            std::mem::swap(&mut p0[0].1, &mut p1[0].2);
            env.comm.all_reduce(&mut oop(p), c, RedOp::Sum, &streams)
        },
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &{
            let mut im = images(c, c, c);
            im[last][1] = Some(Image::unchanged(vec![Seg::Poison(c - 1)]));
            im
        },
        "all_reduce, last rank's recv one element too small",
        Want::Invalid(Some(last), Arg::Recv),
        |views| {
            env.comm
                .all_reduce(&mut oop(parts(views)), c, RedOp::Sum, &streams)
        },
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &{
            let mut im = images(n * c, c, c);
            im[1][0] = Some(Image::unchanged(vec![Seg::Bits(&inputs[1][..n * c - 1])]));
            im
        },
        "reduce_scatter, rank 1's send one element too small",
        Want::Invalid(Some(1), Arg::Send),
        |views| {
            env.comm
                .reduce_scatter(&mut oop(parts(views)), c, RedOp::Max, &streams)
        },
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &images(c, n * c, c),
        "all_gather, last rank's send on another device",
        Want::Invalid(Some(last), Arg::Send),
        |views| {
            let mut p = parts(views);
            p[last].0 = p[0].0;
            env.comm.all_gather(&mut oop(p), c, &streams)
        },
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &images(c, c, c),
        "all_reduce, streams in reverse rank order",
        Want::Invalid(None, Arg::Stream),
        |views| {
            let rev: Vec<&Arc<CudaStream>> = streams.iter().rev().copied().collect();
            env.comm
                .all_reduce(&mut oop(parts(views)), c, RedOp::Sum, &rev)
        },
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &images(c, c, c),
        "broadcast, root out of range",
        Want::Invalid(None, Arg::Root),
        |views| env.comm.broadcast(&mut oop(parts(views)), c, n, &streams),
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &images(n * c, n * c, c),
        "all_to_all in place",
        Want::Invalid(None, Arg::Recv),
        |views| {
            let mut ios: Vec<Io<'_, f32>> =
                views.iter_mut().map(|v| io_for(Role::InPlace, v)).collect();
            env.comm.all_to_all(&mut ios, c, &streams)
        },
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &images(c, c, c),
        "all_reduce, rank 0 in place and the others out of place",
        Want::Invalid(None, Arg::Recv),
        |views| {
            let mut ios: Vec<Io<'_, f32>> = views
                .iter_mut()
                .enumerate()
                .map(|(r, v)| {
                    io_for(
                        if r == 0 {
                            Role::InPlace
                        } else {
                            Role::OutOfPlace
                        },
                        v,
                    )
                })
                .collect();
            env.comm.all_reduce(&mut ios, c, RedOp::Sum, &streams)
        },
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &images(c, c, c),
        "send_recv, receiver out of range",
        Want::Invalid(None, Arg::Peer),
        |views| {
            let mut pairs: Vec<SendRecv<'_, f32>> = parts(views)
                .into_iter()
                .enumerate()
                .map(|(r, (s, q, _))| SendRecv::new(r, s, if r == 0 { n } else { r }, q, c))
                .collect();
            env.comm.send_recv(&mut pairs, &streams)
        },
        &mut tally,
    );

    run_case(
        &env,
        &mut bufs,
        &{
            let mut im = images(c, c, c);
            im[1][1] = Some(Image::unchanged(vec![Seg::Poison(c - 1)]));
            im
        },
        "send_recv ring shift, rank 1's receive buffer one element too small",
        Want::Invalid(Some(1), Arg::Recv),
        |views| {
            let p = parts(views);
            let sends: Vec<&CudaViewMut<'_, f32>> = p.iter().map(|x| x.0).collect();
            let mut pairs: Vec<SendRecv<'_, f32>> = p
                .into_iter()
                .enumerate()
                .map(|(to, (_, q, _))| {
                    SendRecv::new((to + n - 1) % n, sends[(to + n - 1) % n], to, q, c)
                })
                .collect();
            env.comm.send_recv(&mut pairs, &streams)
        },
        &mut tally,
    );

    tally.finish();
}

// ---------------------------------------------------------------------------------------------
// The checker itself (CPU only): a GPU run that passes means something only if these hold
// ---------------------------------------------------------------------------------------------

mod checker {
    use super::*;

    #[test]
    fn compare_flags_changed_unwritten_and_out_of_bounds_elements() {
        let input: Vec<i32> = vec![1, 2, 3];
        let want = vec![Seg::Bits(&input[..])];
        let good = materialise(&want);
        let mut t = Tally::new("self-test");
        t.compare("good", &good, &want);
        assert_eq!((t.mismatches, t.elements), (0, 3 + 2 * GUARD as u64));

        let mut changed = good.clone();
        changed[GUARD + 1] = 7;
        t.compare("changed", &changed, &want);
        assert_eq!(t.mismatches, 1);

        let mut over = good.clone();
        over[GUARD + 3] = 0;
        t.compare("over", &over, &want);
        let mut under = good.clone();
        under[GUARD - 1] = 0;
        t.compare("under", &under, &want);
        assert_eq!(t.mismatches, 3);
        assert!(
            t.notes[1].contains("guard after, element 3"),
            "{}",
            t.notes[1]
        );
        assert!(
            t.notes[2].contains("guard before, element -1"),
            "{}",
            t.notes[2]
        );

        let unwritten = materialise::<i32>(&[Seg::Poison(3)]);
        t.compare("unwritten", &unwritten, &want);
        assert_eq!(t.mismatches, 6);
    }

    #[test]
    fn float_checks_reject_poison_and_values_outside_the_bound() {
        let r = [Approx {
            value: 1.0,
            bound: 0.25,
        }];
        let want = vec![Seg::Approx(&r[..])];
        let mut t = Tally::new("self-test");
        for (x, ok) in [
            (1.25f32, true),
            (0.75, true),
            (1.2501, false),
            (f32::POISON, false),
        ] {
            let mut got = materialise::<f32>(&[Seg::Poison(1)]);
            got[GUARD] = x;
            let before = t.mismatches;
            t.compare("approx", &got, &want);
            assert_eq!(t.mismatches == before, ok, "{x}");
        }
    }

    /// Sequential sums, products and averages rounded in the type at every step (one of the
    /// orders the ring may use) stay within the documented bound; a result a few units in the
    /// last place further away does not.
    #[test]
    fn float_bounds_hold_for_rounded_folds_and_are_tight() {
        fn check<T: Elem>() {
            for n in [2usize, 3, 8] {
                for i in 0..500 {
                    for op in [RedOp::Sum, RedOp::Avg, RedOp::Prod] {
                        let class = class_of::<T>(Some(op));
                        let xs: Vec<T> = (0..n)
                            .map(|r| gen::<T>(&format!("bound {n} {i} {r}"), 1, class)[0])
                            .collect();
                        let vals: Vec<f64> = xs.iter().map(|x| x.to_f64()).collect();
                        let reference = float_ref(op, &vals, T::U, T::ETA);
                        let fold = |f: fn(f64, f64) -> f64| {
                            vals[1..]
                                .iter()
                                .fold(vals[0], |a, &b| T::from_f64(f(a, b)).to_f64())
                        };
                        let got = match op {
                            RedOp::Prod => fold(|a, b| a * b),
                            RedOp::Sum => fold(|a, b| a + b),
                            _ => T::from_f64(fold(|a, b| a + b) / n as f64).to_f64(),
                        };
                        let err = (got - reference.value).abs();
                        assert!(
                            err <= reference.bound,
                            "{} {op:?} {vals:?}: {got} vs {reference:?}",
                            type_name::<T>()
                        );
                    }
                }
            }
            // Tight enough: for a sum of two values the bound is under 3 units in the last place
            // of the result, so an error of 4 units is caught.
            let vals = [1.0, 1.0];
            let r = float_ref(RedOp::Sum, &vals, T::U, T::ETA);
            let ulp = 2.0 * T::U * 2.0;
            assert!(r.bound < 3.0 * ulp, "{} {r:?}", type_name::<T>());
        }
        check::<f32>();
        check::<f16>();
        check::<bf16>();
        check::<f64>();
    }

    #[test]
    fn integer_references_wrap_and_truncate() {
        assert_eq!(exact_ref(RedOp::Sum, &[100i8, 100]), -56);
        assert_eq!(exact_ref(RedOp::Avg, &[100i8, 100]), -28);
        assert_eq!(exact_ref(RedOp::Avg, &[-3i32, 0]), -1);
        assert_eq!(exact_ref(RedOp::Avg, &[255u8, 1, 7]), 2);
        assert_eq!(exact_ref(RedOp::Prod, &[16u8, 16]), 0);
        assert_eq!(exact_ref(RedOp::Prod, &[u64::MAX, 3]), u64::MAX - 2);
        assert_eq!(exact_ref(RedOp::Min, &[5u32, 3, 9]), 3);
        assert_eq!(exact_ref(RedOp::Max, &[-5i64, -3, -9]), -3);
        let (a, b) = (f16::from_f32(1.5), f16::from_f32(-2.0));
        assert_eq!(exact_ref(RedOp::Min, &[a, b]), b);
        assert_eq!(exact_ref(RedOp::Max, &[a, b]), a);
    }

    #[test]
    fn inputs_are_deterministic_nonzero_and_in_range() {
        let a = gen::<bf16>("x", 3 * BLOCK + 5, Class::Wide);
        let b = gen::<bf16>("x", 3 * BLOCK + 5, Class::Wide);
        assert!(a.iter().zip(&b).all(|(x, y)| x.bits() == y.bits()));
        assert!(a
            .iter()
            .all(|x| (0.0625..=32.0).contains(&x.to_f64().abs())));
        let p = gen::<f16>("y", 1000, Class::NearOne);
        assert!(p.iter().all(|x| (0.5..=2.0).contains(&x.to_f64().abs())));
        assert!(p.iter().any(|x| x.to_f64() < 0.0) && p.iter().any(|x| x.to_f64() > 0.0));
        let u = gen::<u8>("z", 1000, Class::Bits);
        assert!(u.iter().any(|&x| x > 127) && u.iter().any(|&x| x != 0));
        // The poison is a NaN for floats, so it never passes a float check.
        assert!(f32::POISON.is_nan() && f64::POISON.is_nan());
        assert!(f16::POISON.is_nan() && bf16::POISON.is_nan());
    }

    #[test]
    fn images_overlay_and_cut() {
        let v: Vec<u8> = (0..10).collect();
        let base = vec![Seg::Poison(4), Seg::Bits(&v[..6])];
        let top = [Seg::Bits(&v[7..9])];
        let img = overlay(&base, 3, &top);
        let host = materialise(&img);
        let p = u8::POISON;
        assert_eq!(&host[GUARD..GUARD + 10], &[p, p, p, 7, 8, 1, 2, 3, 4, 5]);
        assert_eq!(total(&cut(&img, 2..9)), 7);
    }

    /// The in-place plan puts each rank's input and output where NCCL's layout says.
    #[test]
    fn in_place_plans_follow_the_layouts() {
        let n = 3;
        let c = 2;
        let inputs: Vec<Vec<u32>> = (0..n as u32)
            .map(|r| vec![10 * r + 1, 10 * r + 2])
            .collect();
        let (roles, images) = plan(Coll::AllGather, Placement::InPlace, 0, c, &inputs, None);
        assert!(roles.iter().all(|&r| r == Role::InPlace));
        let im = images[1][0].as_ref().expect("rank 1's buffer");
        let p = u32::POISON;
        assert_eq!(
            &materialise(&im.before)[GUARD..GUARD + 6],
            &[p, p, 11, 12, p, p]
        );
        let after: Vec<u32> = im
            .after
            .iter()
            .flat_map(|s| match s {
                Seg::Bits(b) => b.to_vec(),
                _ => panic!("all-gather output is exact"),
            })
            .collect();
        assert_eq!(after, vec![1, 2, 11, 12, 21, 22]);

        let inputs: Vec<Vec<u32>> = (0..n as u32)
            .map(|r| (0..6).map(|i| 10 * r + i).collect())
            .collect();
        let (roles, images) = plan(Coll::Scatter, Placement::OutOfPlace, 2, c, &inputs, None);
        assert_eq!(
            roles,
            vec![Role::RecvOnly, Role::RecvOnly, Role::OutOfPlace]
        );
        let im = images[1][1].as_ref().expect("rank 1's output");
        let Seg::Bits(b) = im.after[0] else {
            panic!("scatter output is exact")
        };
        assert_eq!(b, &[22, 23]);
    }
}
