//! Every PTX entry point against the CPU implementation in `gpu-kernels`, bit for bit.
//!
//! For each copy, reduce and reduce-copy entry point (every element type, fp8 included): sizes {1, 3, 1023, 2^20 + 7} × three alignments (all
//! pointers 16-byte aligned; all offset by one element, so a scalar head, 16-byte vectors and a
//! scalar tail; pointers with different misalignments, so the all-scalar path) × the primitive's
//! variants (reduce: 2, 3 and 8 sources; copy and reduce-copy: with and without `dst1`) × postdiv
//! (1, and 3 for avg). Inputs are random and non-zero (floats: a few NaN, ±inf, ±0, subnormals
//! and the largest finite value); outputs are poisoned with a byte pattern that changes every
//! launch, with guard elements before and after the range that must keep it. Results are
//! compared with `RedOp::combine` folded left to right plus `RedOp::finish`, using
//! `Element::same_result` (copies: identical bits).
//!
//! The scale entry points (`ringccl_scale_{ty}`, NCCL's PreMulSum pre-multiplication) run the
//! same sizes and alignments with the scalar as an immediate (garbage in the unused high bits)
//! and read from device memory (garbage in the immediate), in place and out of place, against
//! `Element::mul`, bit for bit (NaNs as NaNs).
//!
//! Needs a CUDA GPU: run with `cargo test -p ringccl-tests --release --test kernels --
//! --include-ignored`. Without a driver the tests fail (they do not pass vacuously).

use gpu_kernels::element::{Bf16, Element, F16, F8E4M3, F8E5M2};
use gpu_kernels::entry::{EntryKind, EntryPoint, ENTRY_POINTS};
use gpu_kernels::op::RedOp;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use ringccl_tests::{driver_present, DeviceBuffer, Gpu, KArg, Result};

/// The largest count tested (covers many grid-stride rounds and a ragged tail).
const MAXN: usize = (1 << 20) + 7;
/// Counts tested.
const SIZES: [usize; 4] = [1, 3, 1023, MAXN];
/// Poisoned elements before and after every destination range.
const GUARD: usize = 32;
/// Most element offsets used by an alignment case.
const MAX_OFFSET: usize = 2;
/// Element slots in one buffer slot: guard, offset, data, guard.
const SLOT_ELEMS: usize = GUARD + MAX_OFFSET + MAXN + GUARD;
/// Bytes of one slot (for 8-byte elements), rounded to 256 so every slot starts 256-aligned.
const SLOT_BYTES: usize = (SLOT_ELEMS * 8).div_ceil(256) * 256;
/// Source slots per alignment case.
const MAX_SRCS: usize = gpu_kernels::prim::MAX_SRCS;

/// Element offsets of every pointer in one alignment case.
struct Align {
    name: &'static str,
    src: [usize; MAX_SRCS],
    dst0: usize,
    dst1: usize,
}

const ALIGNS: [Align; 3] = [
    Align {
        name: "aligned",
        src: [0; MAX_SRCS],
        dst0: 0,
        dst1: 0,
    },
    Align {
        name: "offset1",
        src: [1; MAX_SRCS],
        dst0: 1,
        dst1: 1,
    },
    // Sources and destinations misaligned differently (mod 16 bytes): the scalar path.
    Align {
        name: "mixed",
        src: [1, 2, 0, 1, 2, 0, 1, 2],
        dst0: 0,
        dst1: 2,
    },
];

/// Launch shapes (blocks, threads) rotated through the cases; threads are clamped to the
/// kernel's maximum. The large size uses the last three (enough threads to finish quickly).
const SHAPES: [(u32, u32); 5] = [(1, 32), (3, 96), (64, 256), (264, 512), (132, 1024)];

// Slot indices in the arena: sources of alignment case `a` are `a * MAX_SRCS + k`, then dst0, dst1.
const DST0_SLOT: usize = ALIGNS.len() * MAX_SRCS;
const DST1_SLOT: usize = DST0_SLOT + 1;
const SLOTS: usize = DST1_SLOT + 1;

/// Random test values for one element type.
trait Gen: Element + Send + Sync {
    fn gen(rng: &mut StdRng) -> Self;
}

macro_rules! gen_int {
    ($($t:ty)*) => {$(
        impl Gen for $t {
            fn gen(rng: &mut StdRng) -> Self {
                loop {
                    let v: $t = rng.random();
                    if v != 0 {
                        return v;
                    }
                }
            }
        }
    )*};
}
gen_int!(i8 u8 i32 u32 i64 u64);

/// A special value (by kind) for floats: NaN, ±inf, ±0, subnormals, largest finite.
fn special_bits(rng: &mut StdRng, exp_bits: u32, man_bits: u32) -> u64 {
    let sign = (rng.random::<bool>() as u64) << (exp_bits + man_bits);
    let inf = ((1u64 << exp_bits) - 1) << man_bits;
    let man_mask = (1u64 << man_bits) - 1;
    sign | match rng.random_range(0..7u32) {
        0 => inf | (1 << (man_bits - 1)),                       // quiet NaN
        1 => inf | Ord::max(rng.random::<u64>() & man_mask, 1), // any NaN (maybe signalling)
        2 => inf,                                               // ±inf
        3 => 0,                                                 // ±0
        4 => 1,                                                 // smallest subnormal
        5 => Ord::max(rng.random::<u64>() & man_mask, 1),       // a subnormal
        _ => inf - 1,                                           // largest finite
    }
}

/// A value `±(1 + u) · 2^e`, `u ∈ [0, 1)`, `e ∈ [-8, 8]`.
fn normal_f64(rng: &mut StdRng) -> f64 {
    let sign = if rng.random::<bool>() { -1.0 } else { 1.0 };
    sign * (1.0 + rng.random::<f64>()) * 2f64.powi(rng.random_range(-8..=8))
}

/// One element in 32 is a special value.
fn is_special(rng: &mut StdRng) -> bool {
    rng.random_range(0..32u32) == 0
}

impl Gen for f32 {
    fn gen(rng: &mut StdRng) -> Self {
        if is_special(rng) {
            f32::from_bits(special_bits(rng, 8, 23) as u32)
        } else {
            normal_f64(rng) as f32
        }
    }
}
impl Gen for f64 {
    fn gen(rng: &mut StdRng) -> Self {
        if is_special(rng) {
            f64::from_bits(special_bits(rng, 11, 52))
        } else {
            normal_f64(rng)
        }
    }
}
impl Gen for F16 {
    fn gen(rng: &mut StdRng) -> Self {
        if is_special(rng) {
            F16::from_bits(special_bits(rng, 5, 10) as u16)
        } else {
            F16::from_f32(normal_f64(rng) as f32)
        }
    }
}
impl Gen for Bf16 {
    fn gen(rng: &mut StdRng) -> Self {
        if is_special(rng) {
            Bf16::from_bits(special_bits(rng, 8, 7) as u16)
        } else {
            Bf16::from_f32(normal_f64(rng) as f32)
        }
    }
}

/// fp8: one element in 32 is an edge encoding (NaN, ±inf for E5M2, the largest finite value,
/// ±0, subnormals); the others ±[2^-8, 2^9), rounded (E4M3 saturates above 448).
macro_rules! gen_fp8 {
    ($($t:ident: $edges:expr;)*) => {$(
        impl Gen for $t {
            fn gen(rng: &mut StdRng) -> Self {
                if is_special(rng) {
                    let edges: &[u8] = &$edges;
                    $t(edges[rng.random_range(0..edges.len())])
                } else {
                    $t::from_f32(normal_f64(rng) as f32)
                }
            }
        }
    )*};
}
gen_fp8! {
    F8E4M3: [0x7f, 0xff, 0x7e, 0xfe, 0x00, 0x80, 0x01, 0x81, 0x07, 0x08];
    F8E5M2: [0x7c, 0xfc, 0x7d, 0x7f, 0xfe, 0x7b, 0xfb, 0x00, 0x80, 0x01, 0x03, 0x04];
}

fn to_bytes<T: Element>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    for x in v {
        out.extend_from_slice(&x.to_raw().to_le_bytes()[..T::SIZE]);
    }
    out
}

fn element_at<T: Element>(bytes: &[u8], i: usize) -> T {
    let mut raw = [0u8; 8];
    raw[..T::SIZE].copy_from_slice(&bytes[i * T::SIZE..(i + 1) * T::SIZE]);
    T::from_raw(u64::from_le_bytes(raw))
}

/// What one test found.
#[derive(Default)]
struct Stats {
    entries: usize,
    launches: usize,
    elements: usize,
    mismatches: usize,
    report: Vec<String>,
}

impl Stats {
    fn mismatch(&mut self, line: impl FnOnce() -> String) {
        self.mismatches += 1;
        if self.report.len() < 25 {
            self.report.push(line());
        }
    }
}

/// Shared state of one test: the GPU, the arena, a counter for poison patterns and shapes.
struct Bench {
    gpu: Gpu,
    arena: DeviceBuffer,
    counter: usize,
    window: Vec<u8>,
    stats: Stats,
}

/// The CPU result: `finish(s0 ⊕ s1 ⊕ … ⊕ s{nsrc-1})` for every index (a copy for `op == None`),
/// computed on several threads (unoptimised test builds spend most of their time here).
fn expected<T: Gen>(srcs: &[Vec<T>], nsrc: usize, op: Option<RedOp>, postdiv: u32) -> Vec<T> {
    let Some(op) = op else {
        return srcs[0].clone();
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8);
    let chunk = MAXN.div_ceil(threads);
    let mut out = srcs[0].clone();
    std::thread::scope(|scope| {
        for (c, part) in out.chunks_mut(chunk).enumerate() {
            scope.spawn(move || {
                for (o, i) in part.iter_mut().zip(c * chunk..) {
                    let acc = srcs[1..nsrc]
                        .iter()
                        .fold(*o, |acc, s| op.combine(acc, s[i]));
                    *o = op.finish(acc, postdiv);
                }
            });
        }
    });
    out
}

/// The CPU's result for every index, also as the bytes the GPU should write.
struct Expected<T> {
    vals: Vec<T>,
    bytes: Vec<u8>,
}

impl<T: Element> Expected<T> {
    fn new(vals: Vec<T>) -> Self {
        let bytes = to_bytes(&vals);
        Expected { vals, bytes }
    }
}

/// One case's parameters, for the checker and for messages.
struct Case<'a> {
    entry: &'a EntryPoint,
    /// The scale's variant (scalar source, in place), else empty.
    variant: &'static str,
    nsrc: usize,
    two: bool,
    postdiv: u32,
    align: &'a Align,
    n: usize,
    shape: (u32, u32),
}

impl Bench {
    fn slot_ptr(&self, slot: usize, elem: usize, size: usize) -> u64 {
        self.arena.ptr() + (slot * SLOT_BYTES + elem * size) as u64
    }

    /// Runs every entry point of `kind` for element type `T`.
    fn run_type<T: Gen>(&mut self, kind: EntryKind, rng: &mut StdRng) -> Result<()> {
        let entries: Vec<&EntryPoint> = ENTRY_POINTS
            .iter()
            .filter(|e| e.kind == kind && e.dtype == T::DTYPE)
            .collect();
        let (nsrcs, twos): (&[usize], &[bool]) = match kind {
            EntryKind::Copy => (&[1], &[false, true]),
            EntryKind::Reduce => (&[2, 3, 8], &[false]),
            EntryKind::ReduceCopy => (&[2], &[false, true]),
            EntryKind::Scale => return self.run_scale::<T>(rng),
            EntryKind::OneShot | EntryKind::TwoShot | EntryKind::TwoShotColl | EntryKind::Ll => {
                return Err(ringccl_tests::Error::msg(
                    "one-shot and two-shot kernels need every rank: tests/tests/collectives.rs runs them",
                ))
            }
        };
        let used = nsrcs.iter().copied().max().unwrap_or(1);
        // The same logical sources at every alignment's offsets.
        let srcs: Vec<Vec<T>> = (0..used)
            .map(|_| (0..MAXN).map(|_| T::gen(rng)).collect())
            .collect();
        for (a, align) in ALIGNS.iter().enumerate() {
            for (k, s) in srcs.iter().enumerate() {
                let off = (a * MAX_SRCS + k) * SLOT_BYTES + (GUARD + align.src[k]) * T::SIZE;
                self.gpu.upload(&self.arena, off, &to_bytes(s))?;
            }
        }
        for entry in entries {
            let postdivs: &[u32] = if entry.op == Some(RedOp::Avg) {
                &[1, 3]
            } else {
                &[1]
            };
            for &postdiv in postdivs {
                for &nsrc in nsrcs {
                    let exp = Expected::new(expected(&srcs, nsrc, entry.op, postdiv));
                    for &two in twos {
                        for (a, align) in ALIGNS.iter().enumerate() {
                            for n in SIZES {
                                let c = self.counter;
                                self.counter += 1;
                                let shape = if n == MAXN {
                                    SHAPES[2 + c % 3]
                                } else {
                                    SHAPES[c % 5]
                                };
                                let case = Case {
                                    entry,
                                    variant: "",
                                    nsrc,
                                    two,
                                    postdiv,
                                    align,
                                    n,
                                    shape,
                                };
                                self.run_case(a, &case, &srcs, &exp)?;
                            }
                        }
                    }
                }
            }
            self.stats.entries += 1;
        }
        Ok(())
    }

    /// The scale entry point of `T`: every size, alignment, scalar source and in place or not.
    fn run_scale<T: Gen>(&mut self, rng: &mut StdRng) -> Result<()> {
        let entry = ENTRY_POINTS
            .iter()
            .find(|e| e.kind == EntryKind::Scale && e.dtype == T::DTYPE)
            .ok_or_else(|| ringccl_tests::Error::msg("no scale entry point"))?;
        let srcs: Vec<Vec<T>> = vec![(0..MAXN).map(|_| T::gen(rng)).collect()];
        for (a, align) in ALIGNS.iter().enumerate() {
            let off = a * MAX_SRCS * SLOT_BYTES + (GUARD + align.src[0]) * T::SIZE;
            self.gpu.upload(&self.arena, off, &to_bytes(&srcs[0]))?;
        }
        // Two scalars: a random one and (for floats) a special one now and then.
        for _ in 0..2 {
            let scalar = T::gen(rng);
            let exp = Expected::new(srcs[0].iter().map(|x| x.mul(scalar)).collect());
            // Unused bits of the immediate hold garbage: the kernel must ignore them.
            let high = if T::SIZE < 8 {
                !0u64 << (8 * T::SIZE)
            } else {
                0
            };
            for device in [false, true] {
                for in_place in [false, true] {
                    for (a, align) in ALIGNS.iter().enumerate() {
                        for n in SIZES {
                            let c = self.counter;
                            self.counter += 1;
                            let shape = if n == MAXN {
                                SHAPES[2 + c % 3]
                            } else {
                                SHAPES[c % 5]
                            };
                            let variant = match (device, in_place) {
                                (false, false) => "immediate",
                                (false, true) => "immediate in-place",
                                (true, false) => "device-scalar",
                                (true, true) => "device-scalar in-place",
                            };
                            let case = Case {
                                entry,
                                variant,
                                nsrc: 1,
                                two: false,
                                postdiv: 1,
                                align,
                                n,
                                shape,
                            };
                            let imm = if device {
                                0x5a5a_5a5a_5a5a_5a5a
                            } else {
                                scalar.to_raw() | high
                            };
                            self.run_scale_case(
                                a,
                                &case,
                                &srcs,
                                &exp,
                                (scalar, imm, device),
                                in_place,
                            )?;
                        }
                    }
                }
            }
        }
        self.stats.entries += 1;
        Ok(())
    }

    /// One scale launch: out of place from the alignment's source slot into dst0, or in place
    /// on a copy of the source in dst0 (at the source's offset); the scalar in dst1's first
    /// element when read from the device.
    #[allow(clippy::too_many_arguments)]
    fn run_scale_case<T: Element>(
        &mut self,
        a: usize,
        case: &Case<'_>,
        srcs: &[Vec<T>],
        exp: &Expected<T>,
        (scalar, imm, device): (T, u64, bool),
        in_place: bool,
    ) -> Result<()> {
        let poison = (self.counter as u8).wrapping_mul(37) ^ 0x5b;
        let n = case.n;
        let dst_off = if in_place {
            case.align.src[0]
        } else {
            case.align.dst0
        };
        let window = GUARD + MAX_OFFSET + n + GUARD;
        self.gpu.fill(
            &self.arena,
            DST0_SLOT * SLOT_BYTES,
            window * T::SIZE,
            poison,
        )?;
        let dst = self.slot_ptr(DST0_SLOT, GUARD + dst_off, T::SIZE);
        let src = if in_place {
            let at = DST0_SLOT * SLOT_BYTES + (GUARD + dst_off) * T::SIZE;
            self.gpu.upload(&self.arena, at, &to_bytes(&srcs[0][..n]))?;
            dst
        } else {
            self.slot_ptr(a * MAX_SRCS, GUARD + case.align.src[0], T::SIZE)
        };
        let scalar_ptr = if device {
            let mut bytes = to_bytes(&[scalar]);
            bytes.resize(8, 0xa5);
            self.gpu
                .upload(&self.arena, DST1_SLOT * SLOT_BYTES, &bytes)?;
            self.slot_ptr(DST1_SLOT, 0, T::SIZE)
        } else {
            0
        };
        let args = [
            KArg::U64(src),
            KArg::U64(dst),
            KArg::U64(n as u64),
            KArg::U64(imm),
            KArg::U64(scalar_ptr),
        ];
        let kern = self.gpu.kernel(case.entry.name)?;
        // SAFETY: source and destination ranges (count `n` from their offsets) lie inside
        // their slots (the same range in place); the device scalar is one element of dst1's
        // slot.
        let threads = unsafe { self.gpu.launch(kern, case.shape.0, case.shape.1, &args)? };
        self.stats.launches += 1;
        let mut buf = std::mem::take(&mut self.window);
        buf.resize(window * T::SIZE, 0);
        self.gpu
            .download(&self.arena, DST0_SLOT * SLOT_BYTES, &mut buf)?;
        self.check(
            &buf,
            poison,
            dst_off,
            true,
            0,
            case,
            (case.shape.0, threads),
            srcs,
            exp,
        );
        self.window = buf;
        Ok(())
    }

    /// Poisons both destination slots, launches one case, and checks it.
    fn run_case<T: Element>(
        &mut self,
        a: usize,
        case: &Case<'_>,
        srcs: &[Vec<T>],
        exp: &Expected<T>,
    ) -> Result<()> {
        let poison = (self.counter as u8).wrapping_mul(37) ^ 0x5b;
        let n = case.n;
        let window = GUARD + case.align.dst0.max(case.align.dst1) + n + GUARD;
        self.gpu.fill(
            &self.arena,
            DST0_SLOT * SLOT_BYTES,
            window * T::SIZE,
            poison,
        )?;
        self.gpu.fill(
            &self.arena,
            DST1_SLOT * SLOT_BYTES,
            window * T::SIZE,
            poison,
        )?;
        let src_ptrs: Vec<u64> = (0..case.nsrc)
            .map(|k| self.slot_ptr(a * MAX_SRCS + k, GUARD + case.align.src[k], T::SIZE))
            .collect();
        let dst0 = self.slot_ptr(DST0_SLOT, GUARD + case.align.dst0, T::SIZE);
        let dst1 = if case.two {
            self.slot_ptr(DST1_SLOT, GUARD + case.align.dst1, T::SIZE)
        } else {
            0
        };
        let args = match case.entry.kind {
            EntryKind::Copy => KArg::copy(src_ptrs[0], dst0, dst1, n as u64),
            EntryKind::Reduce => KArg::reduce(&src_ptrs, dst0, n as u64, case.postdiv)
                .ok_or_else(|| ringccl_tests::Error::msg("bad source count"))?,
            EntryKind::ReduceCopy => {
                KArg::reduce_copy(src_ptrs[0], src_ptrs[1], dst0, dst1, n as u64, case.postdiv)
            }
            EntryKind::Scale
            | EntryKind::OneShot
            | EntryKind::TwoShot
            | EntryKind::TwoShotColl
            | EntryKind::Ll => {
                return Err(ringccl_tests::Error::msg(
                    "scale, one-shot and two-shot kernels are not run by run_case",
                ))
            }
        };
        // SAFETY: every source range and destination range (count `n` from its offset) lies
        // inside its slot of the arena; destinations do not overlap sources or each other.
        let kern = self.gpu.kernel(case.entry.name)?;
        let threads = unsafe { self.gpu.launch(kern, case.shape.0, case.shape.1, &args)? };
        self.stats.launches += 1;
        let shape = (case.shape.0, threads);
        // dst0 always; dst1 when written, or (small sizes) to prove it was left alone.
        let mut dsts = vec![(0usize, case.align.dst0, true)];
        if case.two || n <= 1023 {
            dsts.push((1, case.align.dst1, case.two));
        }
        for (d, off, written) in dsts {
            let mut buf = std::mem::take(&mut self.window);
            buf.resize(window * T::SIZE, 0);
            let slot = if d == 0 { DST0_SLOT } else { DST1_SLOT };
            self.gpu
                .download(&self.arena, slot * SLOT_BYTES, &mut buf)?;
            self.check(&buf, poison, off, written, d, case, shape, srcs, exp);
            self.window = buf;
        }
        Ok(())
    }

    /// Checks one downloaded destination window: guards (and, when not written, everything)
    /// still poisoned; the range equal to the CPU's result.
    #[allow(clippy::too_many_arguments)]
    fn check<T: Element>(
        &mut self,
        buf: &[u8],
        poison: u8,
        off: usize,
        written: bool,
        d: usize,
        case: &Case<'_>,
        shape: (u32, u32),
        srcs: &[Vec<T>],
        exp: &Expected<T>,
    ) {
        let begin = GUARD + off;
        let end = begin + case.n;
        let elems = buf.len() / T::SIZE;
        let what = || {
            format!(
                "{}{}{} n={} align={} nsrc={} dst1={} postdiv={} shape={}x{}: dst{d}",
                case.entry.name,
                if case.variant.is_empty() { "" } else { " " },
                case.variant,
                case.n,
                case.align.name,
                case.nsrc,
                case.two,
                case.postdiv,
                shape.0,
                shape.1
            )
        };
        // Guards (everything when not written): a fast byte check, per element only on failure.
        let size = T::SIZE;
        let outside: Vec<(usize, usize)> = if written {
            vec![(0, begin), (end, elems)]
        } else {
            vec![(0, elems)]
        };
        for (lo, hi) in outside {
            if buf[lo * size..hi * size].iter().all(|&b| b == poison) {
                continue;
            }
            for i in lo..hi {
                let bytes = &buf[i * size..(i + 1) * size];
                if bytes.iter().any(|&b| b != poison) {
                    self.stats.mismatch(|| {
                        format!(
                            "{}: element {} outside the range was written ({:02x?})",
                            what(),
                            i as isize - begin as isize,
                            bytes
                        )
                    });
                }
            }
        }
        if !written {
            return;
        }
        // The range: chunks whose bytes equal the CPU's pass at once; the others (NaN payloads,
        // or real mismatches) are compared element by element.
        const CHUNK: usize = 16;
        let mut j0 = 0;
        while j0 < case.n {
            let j1 = (j0 + CHUNK).min(case.n);
            self.stats.elements += j1 - j0;
            let got = &buf[(begin + j0) * size..(begin + j1) * size];
            if got == &exp.bytes[j0 * size..j1 * size] {
                j0 = j1;
                continue;
            }
            for j in j0..j1 {
                let got: T = element_at(buf, begin + j);
                let want = exp.vals[j];
                let ok = if case.entry.kind == EntryKind::Copy {
                    got.to_raw() == want.to_raw()
                } else {
                    got.same_result(want)
                };
                if !ok {
                    self.stats.mismatch(|| {
                        let inputs: Vec<String> = srcs[..case.nsrc]
                            .iter()
                            .map(|s| format!("{:#x}", s[j].to_raw()))
                            .collect();
                        format!(
                            "{}[{j}]: got {:#x}, expected {:#x}, inputs [{}]",
                            what(),
                            got.to_raw(),
                            want.to_raw(),
                            inputs.join(", ")
                        )
                    });
                }
            }
            j0 = j1;
        }
    }
}

fn run(kind: EntryKind) -> Result<Stats> {
    let gpu = Gpu::open(0)?;
    let regs = gpu.kernels_summary();
    println!(
        "kernels[{kind:?}]: {} (sm_{}{}), {} SMs, PTX {}; {regs}",
        gpu.name,
        gpu.cc.0,
        gpu.cc.1,
        gpu.sms,
        if gpu.cc.0 >= 9 { "sm_90" } else { "sm_80" }
    );
    let arena = gpu.alloc(SLOTS * SLOT_BYTES)?;
    let seed = std::env::var("RINGCCL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0000 + kind as u64);
    println!("kernels[{kind:?}]: seed {seed} (set RINGCCL_TEST_SEED to change)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut b = Bench {
        gpu,
        arena,
        counter: 0,
        window: Vec::new(),
        stats: Stats::default(),
    };
    b.run_type::<f32>(kind, &mut rng)?;
    b.run_type::<f64>(kind, &mut rng)?;
    b.run_type::<F16>(kind, &mut rng)?;
    b.run_type::<Bf16>(kind, &mut rng)?;
    b.run_type::<i8>(kind, &mut rng)?;
    b.run_type::<u8>(kind, &mut rng)?;
    b.run_type::<i32>(kind, &mut rng)?;
    b.run_type::<u32>(kind, &mut rng)?;
    b.run_type::<i64>(kind, &mut rng)?;
    b.run_type::<u64>(kind, &mut rng)?;
    b.run_type::<F8E4M3>(kind, &mut rng)?;
    b.run_type::<F8E5M2>(kind, &mut rng)?;
    Ok(b.stats)
}

fn check_kind(kind: EntryKind) {
    assert!(
        driver_present(),
        "no CUDA driver (libcuda) found: the kernel tests need a CUDA GPU"
    );
    let t0 = std::time::Instant::now();
    let stats = run(kind).unwrap_or_else(|e| panic!("kernels[{kind:?}]: {e}"));
    println!(
        "kernels[{kind:?}]: {} entry points, {} launches, {} elements checked, {} mismatches ({:.1} s)",
        stats.entries,
        stats.launches,
        stats.elements,
        stats.mismatches,
        t0.elapsed().as_secs_f64()
    );
    let want = ENTRY_POINTS.iter().filter(|e| e.kind == kind).count();
    assert_eq!(
        stats.entries, want,
        "not every {kind:?} entry point was tested"
    );
    assert!(stats.elements > 0);
    assert_eq!(
        stats.mismatches,
        0,
        "kernels[{kind:?}]: first mismatches:\n{}",
        stats.report.join("\n")
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn copy_kernels_match_the_cpu() {
    check_kind(EntryKind::Copy);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reduce_kernels_match_the_cpu() {
    check_kind(EntryKind::Reduce);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reduce_copy_kernels_match_the_cpu() {
    check_kind(EntryKind::ReduceCopy);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scale_kernels_match_the_cpu() {
    check_kind(EntryKind::Scale);
}

/// ringccl's launcher (`driver::scale::launch_scale`) for one type: immediate and device
/// scalars, in place and out of place, against `Element::mul`; a bad argument is refused.
fn launcher_type<T: Gen>(gpu: &Gpu, buf: &DeviceBuffer, rng: &mut StdRng) -> Result<usize> {
    use ringccl::internals::driver::scale::{launch_scale, ScaleBy};
    const N: usize = 100_003;
    let size = T::SIZE;
    let (src_at, dst_at, scalar_at) = (0usize, N * 8 + 256, 2 * (N * 8 + 256));
    let data: Vec<T> = (0..N).map(|_| T::gen(rng)).collect();
    let mut mismatches = 0;
    for (device, in_place) in [(false, false), (false, true), (true, false), (true, true)] {
        let scalar = T::gen(rng);
        gpu.upload(buf, src_at, &to_bytes(&data))?;
        gpu.upload(buf, scalar_at, &to_bytes(&[scalar]))?;
        let src = buf.ptr() + src_at as u64;
        let dst = if in_place {
            src
        } else {
            buf.ptr() + dst_at as u64
        };
        let by = if device {
            ScaleBy::Device(buf.ptr() + scalar_at as u64)
        } else {
            ScaleBy::Immediate(scalar.to_raw())
        };
        // SAFETY: both ranges hold N elements inside `buf`; the scalar is one element of it.
        unsafe {
            launch_scale(
                gpu.ringccl_kernels(),
                &gpu.stream,
                T::DTYPE,
                src,
                dst,
                N,
                by,
                gpu.sms * 2,
            )
        }
        .map_err(|e| ringccl_tests::Error::msg(format!("launch_scale: {e}")))?;
        let mut out = vec![0u8; N * size];
        gpu.download(buf, (dst - buf.ptr()) as usize, &mut out)?;
        for (i, x) in data.iter().enumerate() {
            let got: T = element_at(&out, i);
            if !got.same_result(x.mul(scalar)) {
                mismatches += 1;
            }
        }
    }
    // A misaligned destination (for types wider than a byte) and a null device scalar: errors.
    let bad_dst = buf.ptr() + dst_at as u64 + u64::from(size > 1);
    // SAFETY: refused before any launch (the test asserts the error).
    let refused = unsafe {
        launch_scale(
            gpu.ringccl_kernels(),
            &gpu.stream,
            T::DTYPE,
            buf.ptr(),
            if size > 1 { bad_dst } else { 0 },
            N,
            ScaleBy::Device(0),
            1,
        )
    };
    assert!(refused.is_err(), "{}: a bad argument was accepted", T::NAME);
    Ok(mismatches)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn scale_launcher_matches_the_cpu() {
    assert!(
        driver_present(),
        "no CUDA driver (libcuda) found: the kernel tests need a CUDA GPU"
    );
    let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("{e}"));
    let buf = gpu
        .alloc(3 * (100_003 * 8 + 256))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut rng = StdRng::seed_from_u64(0x5ca1e);
    let mut bad = Vec::new();
    macro_rules! each {
        ($($t:ty),*) => {$(
            let m = launcher_type::<$t>(&gpu, &buf, &mut rng).unwrap_or_else(|e| panic!("{e}"));
            if m > 0 {
                bad.push(format!("{}: {m} mismatches", <$t as Element>::NAME));
            }
        )*};
    }
    each!(f32, f64, F16, Bf16, i8, u8, i32, u32, i64, u64, F8E4M3, F8E5M2);
    println!("scale launcher: 12 types x 4 variants x 100003 elements checked");
    assert!(bad.is_empty(), "{}", bad.join("; "));
}
