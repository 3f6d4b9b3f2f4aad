//! Element types and their arithmetic, shared by the GPU kernels and the host.
//!
//! [`Element`] is implemented for the twelve types ringccl moves; [`DataType`] names them at run
//! time (each `Element` type's [`Element::DTYPE`]).
//!
//! Every reduction step in ringccl combines two elements with one of these functions. The same
//! Rust source is compiled for the GPU (nvptx64) and for the host, so the host can compute the
//! exact bits a GPU step produces.
//!
//! # Rounding of one reduce step
//!
//! * **Integers** (`i8 u8 i32 u32 i64 u64`): sum and product wrap around (two's complement);
//!   min/max are exact; the average divides the (wrapped) sum by the rank count, truncating
//!   toward zero.
//! * **`f32`, `f64`**: IEEE 754 with round-to-nearest-even, subnormals kept (no flush to zero).
//! * **`F16`** (IEEE binary16) and **`Bf16`** (bfloat16): each sum or product is correctly rounded
//!   to the 16-bit type (round to nearest, ties to even), exactly as one hardware `add.rn.f16` /
//!   `add.rn.bf16` does. On the host it is computed in `f32` and rounded once more: `f32`'s
//!   24-bit significand has at least `2p + 2` bits of either type (`p` = 11 for binary16, 8 for
//!   bfloat16) and covers both exponent ranges, so the double rounding gives the correctly
//!   rounded result (Figueroa). On sm_90 the GPU uses the native f16/bf16 instructions; on
//!   sm_80 bf16 is computed the host's way, through `f32`.
//! * **`F8E4M3`, `F8E5M2`** (fp8): NCCL's arithmetic on sm_90 (`src/device/reduce_kernel.h`):
//!   both operands widened exactly to binary16, one binary16 sum, product, min or max (as
//!   above), and the result rounded back to fp8 (nearest, ties to even) with saturation: a
//!   result beyond the largest finite value (448, 57344), infinity included, becomes that
//!   value, so an E5M2 infinity entering a reduction leaves it as 57344, and E5M2 min/max give
//!   57344 where the binary16 step chose an infinity. NaN stays NaN. On sm_90 the conversions
//!   are the hardware's `cvt` instructions (as in NCCL); on the host and on sm_80 bit
//!   manipulation that gives the same bits (checked over every value against an independent
//!   reference below). `div_n` (avg's last step) divides in `f32` and rounds once to fp8, which
//!   is the correctly rounded quotient (24 >= 2 * 4 + 2 bits); NCCL's own avg multiplies each
//!   input by fp8(1/n) instead, a different result.
//! * **min / max** (all float types): a NaN operand is ignored (IEEE `minNum`/`maxNum`); two
//!   NaNs give NaN; `-0.0` is smaller than `+0.0`. These are exact and written as comparisons,
//!   so host and GPU agree bit for bit.
//! * **avg**: a sum in every step; the last step divides by the rank count (`div_n`), correctly
//!   rounded in the element's type: `f64` divides by the exact `n`; `f32` by `n as f32` (exact,
//!   so the quotient is correctly rounded, for `n <= 2^24`); f16/bf16 divide in `f32` and round
//!   once more, which is again the correctly rounded quotient (checked for every 16-bit value
//!   and rank counts up to 65536).
//!   `div_n(0)` and `div_n(1)` return the operand (a NaN may come back quieted from `div_n(1)`).
//! * NaN results are NaN on both sides, but their payload bits may differ (the GPU returns the
//!   canonical NaN). Bit-identity checks treat two NaNs as equal.
//!
//! The unit tests below check these rules against the `half` crate and exact `f64` references:
//! conversions over all 65536 bit patterns, every tie and overflow boundary, sums and products
//! of random and edge pairs, and the integer wrap-around and truncation at `MIN`/`MAX`.

/// The element type of a buffer, as a run-time value: one variant per [`Element`] type, in the
/// order of the kernel table ([`crate::ENTRY_POINTS`]).
///
/// ```
/// use gpu_kernels::element::{Bf16, Element};
/// use gpu_kernels::DataType;
/// assert_eq!(DataType::BF16.size(), 2);
/// assert_eq!(DataType::ALL.len(), 12);
/// assert_eq!(DataType::BF16.name(), "bf16");
/// assert_eq!(DataType::ALL[DataType::BF16.index()], DataType::BF16);
/// assert_eq!(Bf16::DTYPE, DataType::BF16);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`
    F32,
    /// `f64`
    F64,
    /// `half::f16` ([`F16`] here)
    F16,
    /// `half::bf16` ([`Bf16`] here)
    BF16,
    /// `i8`
    I8,
    /// `u8`
    U8,
    /// `i32`
    I32,
    /// `u32`
    U32,
    /// `i64`
    I64,
    /// `u64`
    U64,
    /// FP8 E4M3 ([`F8E4M3`]; NCCL's `ncclFloat8e4m3`)
    F8E4M3,
    /// FP8 E5M2 ([`F8E5M2`]; NCCL's `ncclFloat8e5m2`)
    F8E5M2,
}

impl DataType {
    /// Every type, in declaration order ([`DataType::index`] is the position here).
    pub const ALL: [DataType; 12] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F16 | DataType::BF16 => 2,
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
        }
    }

    /// The name used in kernel entry points (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::F16 => "f16",
            DataType::BF16 => "bf16",
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// The position of this type in [`DataType::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// An element type the kernels reduce. Sealed: implemented for the twelve types ringccl supports.
///
/// ```
/// use gpu_kernels::element::{Element, F16};
/// let a = F16::from_f32(1.5);
/// assert_eq!(a.add(a).to_f32(), 3.0);
/// assert_eq!(7u8.mul(40), 24); // 280 wraps to 24
/// ```
pub trait Element: Copy + PartialEq + sealed::Sealed + 'static {
    /// The run-time tag of this type.
    const DTYPE: DataType;
    /// Name used in kernel entry points and messages (`"f32"`, `"bf16"`, ...).
    const NAME: &'static str = Self::DTYPE.name();
    /// Size in bytes.
    const SIZE: usize = core::mem::size_of::<Self>();
    /// `self + other`, wrapping for integers, correctly rounded for floats.
    fn add(self, other: Self) -> Self;
    /// `self * other`, wrapping for integers, correctly rounded for floats.
    fn mul(self, other: Self) -> Self;
    /// The smaller of the two (NaN ignored, `-0.0 < +0.0`).
    fn min(self, other: Self) -> Self;
    /// The larger of the two (NaN ignored, `-0.0 < +0.0`).
    fn max(self, other: Self) -> Self;
    /// `self / n`: truncating for integers, correctly rounded for floats. `n == 0` returns `self`.
    fn div_n(self, n: u32) -> Self;
    /// Whether two values are the same result: equal bits, or both NaN.
    fn same_result(self, other: Self) -> bool;
    /// The value's bits, zero-extended to 64 (how the kernels move lanes inside a vector).
    fn to_raw(self) -> u64;
    /// The value whose bits are the low `8 * SIZE` bits of `raw`.
    fn from_raw(raw: u64) -> Self;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! int_element {
    ($($t:ty => $dtype:ident, $wide:ty, $unsigned:ty;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn add(self, other: Self) -> Self { self.wrapping_add(other) }
            #[inline(always)]
            fn mul(self, other: Self) -> Self { self.wrapping_mul(other) }
            #[inline(always)]
            fn min(self, other: Self) -> Self { if other < self { other } else { self } }
            #[inline(always)]
            fn max(self, other: Self) -> Self { if other > self { other } else { self } }
            #[inline(always)]
            fn div_n(self, n: u32) -> Self {
                if n == 0 { self } else { ((self as $wide) / (n as $wide)) as $t }
            }
            #[inline(always)]
            fn same_result(self, other: Self) -> bool { self == other }
            #[inline(always)]
            fn to_raw(self) -> u64 { self as $unsigned as u64 }
            #[inline(always)]
            fn from_raw(raw: u64) -> Self { raw as $unsigned as $t }
        }
    )*};
}

int_element! {
    i8 => I8, i64, u8;
    u8 => U8, u64, u8;
    i32 => I32, i64, u32;
    u32 => U32, u64, u32;
    i64 => I64, i64, u64;
    u64 => U64, u64, u64;
}

/// min/max for IEEE floats given their bit patterns: NaN ignored, `-0 < +0`, exact.
macro_rules! float_minmax {
    ($a:expr, $b:expr, $fa:expr, $fb:expr, $is_min:expr) => {{
        let (a, b, fa, fb) = ($a, $b, $fa, $fb);
        if fa != fa {
            b
        } else if fb != fb {
            a
        } else if fa < fb {
            if $is_min {
                a
            } else {
                b
            }
        } else if fb < fa {
            if $is_min {
                b
            } else {
                a
            }
        } else if $is_min {
            // Equal values: identical bits, or +0 and -0; the sign bit decides.
            Self::from_bits(a.to_bits() | b.to_bits())
        } else {
            Self::from_bits(a.to_bits() & b.to_bits())
        }
    }};
}

impl sealed::Sealed for f32 {}
impl Element for f32 {
    const DTYPE: DataType = DataType::F32;
    #[inline(always)]
    fn to_raw(self) -> u64 {
        self.to_bits() as u64
    }
    #[inline(always)]
    fn from_raw(raw: u64) -> Self {
        f32::from_bits(raw as u32)
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        self * other
    }
    #[inline(always)]
    fn min(self, other: Self) -> Self {
        float_minmax!(self, other, self, other, true)
    }
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        float_minmax!(self, other, self, other, false)
    }
    #[inline(always)]
    fn div_n(self, n: u32) -> Self {
        if n == 0 {
            self
        } else {
            self / n as f32
        }
    }
    #[inline(always)]
    fn same_result(self, other: Self) -> bool {
        self.to_bits() == other.to_bits() || (self.is_nan() && other.is_nan())
    }
}

impl sealed::Sealed for f64 {}
impl Element for f64 {
    const DTYPE: DataType = DataType::F64;
    #[inline(always)]
    fn to_raw(self) -> u64 {
        self.to_bits()
    }
    #[inline(always)]
    fn from_raw(raw: u64) -> Self {
        f64::from_bits(raw)
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        self * other
    }
    #[inline(always)]
    fn min(self, other: Self) -> Self {
        float_minmax!(self, other, self, other, true)
    }
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        float_minmax!(self, other, self, other, false)
    }
    #[inline(always)]
    fn div_n(self, n: u32) -> Self {
        if n == 0 {
            self
        } else {
            self / n as f64
        }
    }
    #[inline(always)]
    fn same_result(self, other: Self) -> bool {
        self.to_bits() == other.to_bits() || (self.is_nan() && other.is_nan())
    }
}

/// IEEE 754 binary16, stored as its bits. Same layout as `half::f16` (and CUDA's `__half`).
///
/// ```
/// use gpu_kernels::element::F16;
/// assert_eq!(F16::from_f32(65504.0).to_bits(), 0x7bff); // largest finite
/// assert_eq!(F16::from_bits(0x3c00).to_f32(), 1.0);
/// ```
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct F16(pub u16);

/// bfloat16 (8 exponent bits, 7 mantissa bits), stored as its bits. Same layout as `half::bf16`.
///
/// ```
/// use gpu_kernels::element::Bf16;
/// assert_eq!(Bf16::from_f32(1.0).to_bits(), 0x3f80);
/// assert_eq!(Bf16::from_f32(1.00390625).to_bits(), 0x3f80); // tie to even
/// ```
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Bf16(pub u16);

/// The binary16 conversions: native `cvt` instructions on the GPU, bit manipulation on the host.
impl F16 {
    /// Exact widening to `f32`.
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        #[cfg(target_arch = "nvptx64")]
        {
            f16::from_bits(self.0) as f32 // cvt.f32.f16
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            f16_bits_to_f32(self.0)
        }
    }
    /// Rounds an `f32` to the nearest binary16 (ties to even; overflow gives infinity).
    #[inline(always)]
    pub fn from_f32(x: f32) -> Self {
        #[cfg(target_arch = "nvptx64")]
        {
            F16((x as f16).to_bits()) // cvt.rn.f16.f32
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            F16(f32_to_f16_bits(x))
        }
    }
}

/// The bfloat16 conversions (the same bit manipulation on both targets).
impl Bf16 {
    /// Exact widening to `f32`.
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    /// Rounds an `f32` to the nearest bfloat16 (ties to even; overflow gives infinity).
    #[inline(always)]
    pub fn from_f32(x: f32) -> Self {
        Bf16(f32_to_bf16_bits(x))
    }
}

/// What binary16 and bfloat16 share: the bit accessors and the [`Element`] impl, whose sum and
/// product are the target's (see `imp`) and whose min, max and `div_n` go through `f32`.
macro_rules! half_element {
    ($($t:ident => $dtype:ident, nan_above: $inf:literal, add: $add:path, mul: $mul:path;)*) => {$(
        impl $t {
            /// From raw bits.
            #[inline(always)]
            pub const fn from_bits(bits: u16) -> Self {
                $t(bits)
            }
            /// The raw bits.
            #[inline(always)]
            pub const fn to_bits(self) -> u16 {
                self.0
            }
            /// Whether the value is a NaN: the magnitude's bits are above infinity's.
            #[inline(always)]
            fn is_nan(self) -> bool {
                (self.0 & 0x7fff) > $inf
            }
        }

        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn to_raw(self) -> u64 {
                self.0 as u64
            }
            #[inline(always)]
            fn from_raw(raw: u64) -> Self {
                $t(raw as u16)
            }
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                $add(self, other)
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                $mul(self, other)
            }
            #[inline(always)]
            fn min(self, other: Self) -> Self {
                float_minmax!(self, other, self.to_f32(), other.to_f32(), true)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                float_minmax!(self, other, self.to_f32(), other.to_f32(), false)
            }
            #[inline(always)]
            fn div_n(self, n: u32) -> Self {
                if n == 0 {
                    self
                } else {
                    $t::from_f32(self.to_f32() / n as f32)
                }
            }
            #[inline(always)]
            fn same_result(self, other: Self) -> bool {
                self.0 == other.0 || (self.is_nan() && other.is_nan())
            }
        }
    )*};
}

half_element! {
    F16 => F16, nan_above: 0x7c00, add: imp::f16_add, mul: imp::f16_mul;
    Bf16 => BF16, nan_above: 0x7f80, add: imp::bf16_add, mul: imp::bf16_mul;
}

/// Exact conversion of binary16 bits to `f32`.
#[inline(always)]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0x1f {
        // inf / NaN (keep the payload, quiet it)
        sign | 0x7f80_0000 | (man << 13) | if man != 0 { 0x0040_0000 } else { 0 }
    } else if exp != 0 {
        sign | ((exp + 112) << 23) | (man << 13)
    } else if man == 0 {
        sign
    } else {
        // subnormal: value = man * 2^-24; normalise.
        let shift = man.leading_zeros() - 21; // bring the top set bit to bit 10
        let m = (man << shift) & 0x3ff;
        let e = 113 - shift; // biased f32 exponent
        sign | (e << 23) | (m << 13)
    };
    f32::from_bits(bits)
}

/// Rounds `f32` to binary16 bits, round to nearest, ties to even.
#[inline(always)]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return if man != 0 {
            sign | 0x7e00 | ((man >> 13) as u16 & 0x3ff)
        } else {
            sign | 0x7c00
        };
    }
    let e = exp - 127 + 15; // biased binary16 exponent
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal or zero in binary16: value = (1.man) * 2^(exp-127); target unit 2^-24.
        if e < -10 {
            return sign; // below half the smallest subnormal: rounds to zero
        }
        let m = man | 0x80_0000; // 24-bit significand
        let shift = (14 - e) as u32; // 13 + (1 - e)
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (r & 1) == 1) {
        r += 1; // may carry into the exponent, up to infinity: correct
    }
    sign | r as u16
}

/// Rounds `f32` to bfloat16 bits, round to nearest, ties to even (NaN stays NaN).
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// FP8 E4M3 (OCP `E4M3FN`, CUDA's `__nv_fp8_e4m3`, NCCL's `ncclFloat8e4m3`): 1 sign bit,
/// 4 exponent bits (bias 7), 3 mantissa bits, stored as its bits. No infinities; `S.1111.111`
/// is NaN; the largest finite value is 448 (`0x7e`), the smallest subnormal 2^-9 (`0x01`).
///
/// ```
/// use gpu_kernels::element::{Element, F8E4M3};
/// assert_eq!(F8E4M3::from_f32(1.0).to_bits(), 0x38);
/// assert_eq!(F8E4M3::from_f32(1e9).to_bits(), 0x7e); // saturates at 448
/// let max = F8E4M3::from_bits(0x7e);
/// assert_eq!(max.add(max), max); // 896 saturates, as NCCL's sum does
/// ```
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct F8E4M3(pub u8);

/// FP8 E5M2 (CUDA's `__nv_fp8_e5m2`, NCCL's `ncclFloat8e5m2`): 1 sign bit, 5 exponent bits
/// (bias 15), 2 mantissa bits, stored as its bits: the top byte of a binary16. `0x7c` is
/// infinity, `0x7d..=0x7f` NaN; the largest finite value is 57344 (`0x7b`).
///
/// ```
/// use gpu_kernels::element::{Element, F8E5M2};
/// assert_eq!(F8E5M2::from_f32(1.0).to_bits(), 0x3c);
/// let inf = F8E5M2::from_bits(0x7c);
/// // As in NCCL, every result goes back to fp8 with saturation: inf + 1 is the largest finite.
/// assert_eq!(inf.add(F8E5M2::from_f32(1.0)).to_bits(), 0x7b);
/// ```
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct F8E5M2(pub u8);

/// Rounds `f32` to an fp8 format with `man_bits` mantissa bits and exponent bias `bias`, to
/// nearest, ties to even, saturating to the largest finite encoding `max` (infinity included:
/// CUDA's `__NV_SATFINITE`); NaN gives `0x7f` with the sign. Bit manipulation only.
#[inline(always)]
#[cfg_attr(all(target_arch = "nvptx64", ringccl_sm90), allow(dead_code))]
fn f32_to_fp8_bits(x: f32, man_bits: u32, bias: i32, max: u8) -> u8 {
    let b = x.to_bits();
    let sign = ((b >> 24) & 0x80) as u8;
    let abs = b & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return sign | 0x7f;
    }
    if abs == 0x7f80_0000 {
        return sign | max;
    }
    let exp = (abs >> 23) as i32;
    if exp == 0 {
        // f32 subnormals (< 2^-126) are far below half the smallest fp8 subnormal.
        return sign;
    }
    let sig = (abs & 0x7f_ffff) | 0x80_0000; // value = sig * 2^(exp - 150)
    let e = exp - 127 + bias; // biased fp8 exponent
                              // Bits of `sig` below the fp8 unit: 23 - man_bits for a normal result, more below.
    let shift = if e >= 1 {
        23 - man_bits
    } else {
        (23 - man_bits as i32 + 1 - e) as u32
    };
    if shift >= 25 {
        return sign; // below half the smallest subnormal
    }
    let half = 1u32 << (shift - 1);
    let rest = sig & ((1u32 << shift) - 1);
    let mut r = sig >> shift;
    if rest > half || (rest == half && (r & 1) == 1) {
        r += 1;
    }
    // Normal: r = 2^man_bits + mantissa (a carry moves into the exponent); subnormal: r is the
    // encoding (reaching the smallest normal on a carry).
    let bits = if e >= 1 {
        (((e - 1) as u32) << man_bits) + r
    } else {
        r
    };
    if bits > max as u32 {
        sign | max
    } else {
        sign | bits as u8
    }
}

/// Exact E4M3 bits to binary16 bits (NaN gives a quiet NaN with the sign).
#[inline(always)]
#[cfg_attr(all(target_arch = "nvptx64", ringccl_sm90), allow(dead_code))]
pub(crate) fn e4m3_bits_to_f16_soft(x: u8) -> u16 {
    let sign = ((x & 0x80) as u16) << 8;
    let mag = x & 0x7f;
    if mag == 0x7f {
        return sign | 0x7e00;
    }
    let (e, m) = ((mag >> 3) as u16, (mag & 7) as u16);
    if e != 0 {
        return sign | ((e + 8) << 10) | (m << 7);
    }
    if m == 0 {
        return sign;
    }
    // Subnormal: m * 2^-9 with the top set bit of m at position p: a normal binary16.
    let p = 15 - m.leading_zeros() as u16;
    sign | ((p + 6) << 10) | ((m << (10 - p)) & 0x3ff)
}

/// Exact E5M2 bits to binary16 bits: the top byte (a NaN is quieted).
#[inline(always)]
#[cfg_attr(all(target_arch = "nvptx64", ringccl_sm90), allow(dead_code))]
pub(crate) fn e5m2_bits_to_f16_soft(x: u8) -> u16 {
    let h = (x as u16) << 8;
    if (h & 0x7fff) > 0x7c00 {
        h | 0x0200
    } else {
        h
    }
}

/// How fp8 converts to and from binary16 on each target: sm_90 has the conversion
/// instructions NCCL's fp8 arithmetic uses (`cvt.rn.f16x2.e4m3x2`,
/// `cvt.rn.satfinite.e4m3x2.f16x2` and the E5M2 forms); the host and sm_80 use the bit
/// manipulation above, which gives the same bits (NaN payloads aside).
mod fp8_cvt {
    #[cfg(all(target_arch = "nvptx64", ringccl_sm90))]
    macro_rules! hw {
        ($to_f16:ident, $from_f16:ident, $from_f32:ident, $fmt:literal) => {
            #[inline(always)]
            pub fn $to_f16(x: u8) -> u16 {
                let r: u32;
                // SAFETY: a pure register-to-register instruction; no memory is touched.
                unsafe {
                    core::arch::asm!(
                        concat!("cvt.rn.f16x2.", $fmt, "x2 {0}, {1};"),
                        out(reg32) r, in(reg16) x as u16,
                        options(pure, nomem, nostack, preserves_flags)
                    )
                };
                r as u16
            }
            #[inline(always)]
            pub fn $from_f32(x: f32) -> u8 {
                let r: u16;
                let zero = 0u32;
                // SAFETY: a pure register-to-register instruction; no memory is touched.
                // `d = cvt(a) << 8 | cvt(b)`: the low byte is `x`'s.
                unsafe {
                    core::arch::asm!(
                        concat!("cvt.rn.satfinite.", $fmt, "x2.f32 {0}, {1}, {2};"),
                        out(reg16) r, in(reg32) zero, in(reg32) x.to_bits(),
                        options(pure, nomem, nostack, preserves_flags)
                    )
                };
                r as u8
            }
            #[inline(always)]
            pub fn $from_f16(h: u16) -> u8 {
                let r: u16;
                // SAFETY: a pure register-to-register instruction; no memory is touched.
                unsafe {
                    core::arch::asm!(
                        concat!("cvt.rn.satfinite.", $fmt, "x2.f16x2 {0}, {1};"),
                        out(reg16) r, in(reg32) h as u32,
                        options(pure, nomem, nostack, preserves_flags)
                    )
                };
                r as u8
            }
        };
    }
    #[cfg(all(target_arch = "nvptx64", ringccl_sm90))]
    hw!(e4m3_to_f16, f16_to_e4m3, f32_to_e4m3, "e4m3");
    #[cfg(all(target_arch = "nvptx64", ringccl_sm90))]
    hw!(e5m2_to_f16, f16_to_e5m2, f32_to_e5m2, "e5m2");

    #[cfg(not(all(target_arch = "nvptx64", ringccl_sm90)))]
    pub(super) use super::{
        e4m3_bits_to_f16_soft as e4m3_to_f16, e5m2_bits_to_f16_soft as e5m2_to_f16,
    };

    #[cfg(not(all(target_arch = "nvptx64", ringccl_sm90)))]
    #[inline(always)]
    pub fn f32_to_e4m3(x: f32) -> u8 {
        super::f32_to_fp8_bits(x, 3, 7, 0x7e)
    }
    #[cfg(not(all(target_arch = "nvptx64", ringccl_sm90)))]
    #[inline(always)]
    pub fn f32_to_e5m2(x: f32) -> u8 {
        super::f32_to_fp8_bits(x, 2, 15, 0x7b)
    }
    #[cfg(not(all(target_arch = "nvptx64", ringccl_sm90)))]
    #[inline(always)]
    pub fn f16_to_e4m3(h: u16) -> u8 {
        f32_to_e4m3(super::F16(h).to_f32())
    }
    #[cfg(not(all(target_arch = "nvptx64", ringccl_sm90)))]
    #[inline(always)]
    pub fn f16_to_e5m2(h: u16) -> u8 {
        f32_to_e5m2(super::F16(h).to_f32())
    }
}

/// What E4M3 and E5M2 share: conversions and the [`Element`] impl, whose every step is NCCL's
/// (`src/device/reduce_kernel.h`, sm_90): both operands widened exactly to binary16, one
/// binary16 operation (`__hadd`, `__hmul`, `__hmin`, `__hmax`: correctly rounded), and the
/// result rounded back to fp8 to nearest, ties to even, with saturation (`__NV_SATFINITE`: a
/// result beyond the largest finite value, infinity included, becomes the largest finite one).
macro_rules! fp8_element {
    ($($t:ident => $dtype:ident, max: $max:literal, nan: $is_nan:expr, sat: $sat:expr,
       to_f16: $to:path, from_f16: $from:path, from_f32: $from32:path;)*) => {$(
        impl $t {
            /// The largest finite value.
            pub const MAX: $t = $t($max);
            /// From raw bits.
            #[inline(always)]
            pub const fn from_bits(bits: u8) -> Self {
                $t(bits)
            }
            /// The raw bits.
            #[inline(always)]
            pub const fn to_bits(self) -> u8 {
                self.0
            }
            /// Whether the value is a NaN.
            #[inline(always)]
            pub fn is_nan(self) -> bool {
                let f = $is_nan;
                f(self.0)
            }
            /// NCCL's min or max: the binary16 `__hmin`/`__hmax` of the widened operands (NaN
            /// ignored, `-0 < +0`), rounded back with saturation; exact, so computed on the
            /// bits: the chosen operand, an E5M2 infinity saturated to the largest finite value.
            #[inline(always)]
            fn min_max(a: Self, b: Self, min: bool) -> Self {
                // An order-preserving key of the sign-magnitude bits (-0 < +0), with a NaN
                // placed where it never wins: last for min, first for max. Equal keys (the same
                // bits, or two NaNs) keep `a`.
                let key = |x: Self| {
                    let v = u32::from(x.0);
                    let k = if v & 0x80 != 0 {
                        0x80 - (v & 0x7f)
                    } else {
                        0x81 + v
                    };
                    if x.is_nan() {
                        if min {
                            0x200
                        } else {
                            0
                        }
                    } else {
                        k
                    }
                };
                let (ka, kb) = (key(a), key(b));
                let chosen = if (min && kb < ka) || (!min && kb > ka) {
                    b
                } else {
                    a
                };
                let sat = $sat;
                $t(sat(chosen.0))
            }
            /// Exact widening to binary16 (CUDA's `__nv_cvt_fp8_to_halfraw`).
            #[inline(always)]
            pub fn to_f16(self) -> F16 {
                F16($to(self.0))
            }
            /// Rounds binary16 to this format: nearest, ties to even, saturating to
            /// [`Self::MAX`] (CUDA's `__nv_cvt_halfraw_to_fp8` with `__NV_SATFINITE`).
            #[inline(always)]
            pub fn from_f16(h: F16) -> Self {
                $t($from(h.0))
            }
            /// Exact widening to `f32`.
            #[inline(always)]
            pub fn to_f32(self) -> f32 {
                self.to_f16().to_f32()
            }
            /// Rounds `f32` to this format: nearest, ties to even, saturating (CUDA's
            /// `__nv_cvt_float_to_fp8` with `__NV_SATFINITE`).
            #[inline(always)]
            pub fn from_f32(x: f32) -> Self {
                $t($from32(x))
            }
        }

        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn to_raw(self) -> u64 {
                self.0 as u64
            }
            #[inline(always)]
            fn from_raw(raw: u64) -> Self {
                $t(raw as u8)
            }
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                Self::from_f16(self.to_f16().add(other.to_f16()))
            }
            #[inline(always)]
            fn mul(self, other: Self) -> Self {
                Self::from_f16(self.to_f16().mul(other.to_f16()))
            }
            #[inline(always)]
            fn min(self, other: Self) -> Self {
                Self::min_max(self, other, true)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                Self::min_max(self, other, false)
            }
            #[inline(always)]
            fn div_n(self, n: u32) -> Self {
                if n <= 1 {
                    self
                } else {
                    Self::from_f32(self.to_f32() / n as f32)
                }
            }
            #[inline(always)]
            fn same_result(self, other: Self) -> bool {
                self.0 == other.0 || (self.is_nan() && other.is_nan())
            }
        }
    )*};
}

fp8_element! {
    F8E4M3 => F8E4M3, max: 0x7e, nan: |b: u8| b & 0x7f == 0x7f, sat: |b: u8| b,
        to_f16: fp8_cvt::e4m3_to_f16, from_f16: fp8_cvt::f16_to_e4m3,
        from_f32: fp8_cvt::f32_to_e4m3;
    F8E5M2 => F8E5M2, max: 0x7b, nan: |b: u8| b & 0x7f > 0x7c,
        sat: |b: u8| if b & 0x7f == 0x7c { b - 1 } else { b },
        to_f16: fp8_cvt::e5m2_to_f16, from_f16: fp8_cvt::f16_to_e5m2,
        from_f32: fp8_cvt::f32_to_e5m2;
}

/// How one f16/bf16 sum or product is computed on each target.
mod imp {
    use super::{Bf16, F16};

    // GPU: the native binary16 type lowers to `add.rn.f16` / `mul.rn.f16` (packed `f16x2`
    // where the compiler can pair lanes).
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn f16_add(a: F16, b: F16) -> F16 {
        F16((f16::from_bits(a.0) + f16::from_bits(b.0)).to_bits())
    }
    #[cfg(target_arch = "nvptx64")]
    #[inline(always)]
    pub fn f16_mul(a: F16, b: F16) -> F16 {
        F16((f16::from_bits(a.0) * f16::from_bits(b.0)).to_bits())
    }

    // Host: f32 arithmetic, one rounding (exact for binary16, see the module docs).
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    pub fn f16_add(a: F16, b: F16) -> F16 {
        F16::from_f32(a.to_f32() + b.to_f32())
    }
    #[cfg(not(target_arch = "nvptx64"))]
    #[inline(always)]
    pub fn f16_mul(a: F16, b: F16) -> F16 {
        F16::from_f32(a.to_f32() * b.to_f32())
    }

    // sm_90: native bf16 add/mul (PTX ISA 7.8).
    #[cfg(all(target_arch = "nvptx64", ringccl_sm90))]
    #[inline(always)]
    pub fn bf16_add(a: Bf16, b: Bf16) -> Bf16 {
        let r: u16;
        // SAFETY: a pure register-to-register instruction; no memory is touched.
        unsafe {
            core::arch::asm!("add.rn.bf16 {0}, {1}, {2};", out(reg16) r, in(reg16) a.0, in(reg16) b.0)
        };
        Bf16(r)
    }
    #[cfg(all(target_arch = "nvptx64", ringccl_sm90))]
    #[inline(always)]
    pub fn bf16_mul(a: Bf16, b: Bf16) -> Bf16 {
        let r: u16;
        // SAFETY: a pure register-to-register instruction; no memory is touched.
        unsafe {
            core::arch::asm!("mul.rn.bf16 {0}, {1}, {2};", out(reg16) r, in(reg16) a.0, in(reg16) b.0)
        };
        Bf16(r)
    }

    // Host and sm_80: through f32, one rounding (exact for bfloat16).
    #[cfg(not(all(target_arch = "nvptx64", ringccl_sm90)))]
    #[inline(always)]
    pub fn bf16_add(a: Bf16, b: Bf16) -> Bf16 {
        Bf16::from_f32(a.to_f32() + b.to_f32())
    }
    #[cfg(not(all(target_arch = "nvptx64", ringccl_sm90)))]
    #[inline(always)]
    pub fn bf16_mul(a: Bf16, b: Bf16) -> Bf16 {
        Bf16::from_f32(a.to_f32() * b.to_f32())
    }
}

#[cfg(test)]
mod tests {
    //! The element math against independent references: the `half` crate, exact `f64`
    //! arithmetic, and values whose rounding is known by construction (ties, boundaries).
    extern crate std;

    use super::*;
    use half::{bf16, f16};
    use rand::{rngs::SmallRng, Rng, SeedableRng};
    use std::vec::Vec;

    fn f16_is_nan(h: u16) -> bool {
        (h & 0x7fff) > 0x7c00
    }
    fn bf16_is_nan(h: u16) -> bool {
        (h & 0x7fff) > 0x7f80
    }

    /// The value of finite binary16 bits, from the format's definition.
    fn f16_value(h: u16) -> f64 {
        let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
        let exp = i32::from((h >> 10) & 0x1f);
        let man = f64::from(h & 0x3ff);
        let mag = if exp == 0 {
            man * 2f64.powi(-24)
        } else {
            (1024.0 + man) * 2f64.powi(exp - 25)
        };
        sign * mag
    }

    /// `hi + lo` rounded to `f32` with round-to-odd, where `hi` is the `f64` nearest to the
    /// exact value `hi + lo` (`lo` may be only the error's sign). Rounding a round-to-odd
    /// result with >= p + 2 bits to p bits (round to nearest) equals rounding the exact value
    /// once (Boldo & Melquiond), so `half::*::from_f32` of this is the correctly rounded 16-bit
    /// value of `hi + lo`; no double rounding is involved.
    fn round_to_odd_f32(hi: f64, lo: f64) -> f32 {
        let t = hi as f32;
        if !hi.is_finite() {
            return t;
        }
        if t.is_infinite() {
            // Beyond f32::MAX: round-to-odd keeps the largest finite value (odd significand).
            return f32::MAX.copysign(t);
        }
        let d = hi - f64::from(t); // exact
        let dir = if d != 0.0 {
            d
        } else if lo != 0.0 {
            lo
        } else {
            return t; // exact
        };
        if t.to_bits() & 1 == 1 {
            t
        } else if dir > 0.0 {
            t.next_up()
        } else {
            t.next_down()
        }
    }

    /// Correctly rounded binary16 bits of the exact value `hi + lo` (see `round_to_odd_f32`).
    fn f16_of(hi: f64, lo: f64) -> u16 {
        f16::from_f32(round_to_odd_f32(hi, lo)).to_bits()
    }
    /// Correctly rounded bfloat16 bits of the exact value `hi + lo`.
    fn bf16_of(hi: f64, lo: f64) -> u16 {
        bf16::from_f32(round_to_odd_f32(hi, lo)).to_bits()
    }

    /// `a + b = s + err` exactly (Knuth's TwoSum), for finite `s`.
    fn two_sum(a: f64, b: f64) -> (f64, f64) {
        let s = a + b;
        if !s.is_finite() {
            return (s, 0.0);
        }
        let bb = s - a;
        (s, (a - (s - bb)) + (b - bb))
    }

    fn f16_add_ref(a: u16, b: u16) -> u16 {
        let (x, y) = (f16::from_bits(a).to_f64(), f16::from_bits(b).to_f64());
        let (s, err) = two_sum(x, y);
        // Sums of two binary16 values are multiples of 2^-24 below 2^17: exact in f64.
        assert!(
            err == 0.0 || err.is_nan(),
            "{a:#06x} + {b:#06x} inexact in f64"
        );
        f16_of(s, 0.0)
    }
    fn f16_mul_ref(a: u16, b: u16) -> u16 {
        // 22-bit significands, exponents far inside f64's range: exact.
        f16_of(f16::from_bits(a).to_f64() * f16::from_bits(b).to_f64(), 0.0)
    }
    fn bf16_add_ref(a: u16, b: u16) -> u16 {
        // Not always exact in f64 (exponent gaps up to 260 bits): carry TwoSum's error.
        let (s, err) = two_sum(bf16::from_bits(a).to_f64(), bf16::from_bits(b).to_f64());
        bf16_of(s, err)
    }
    fn bf16_mul_ref(a: u16, b: u16) -> u16 {
        // 16-bit significands, exponents >= -266: exact in f64.
        bf16_of(
            bf16::from_bits(a).to_f64() * bf16::from_bits(b).to_f64(),
            0.0,
        )
    }

    fn rng(seed: u64) -> SmallRng {
        SmallRng::seed_from_u64(seed)
    }

    /// A 16-bit float whose exponent is within `spread` of `a`'s (field of `exp_bits` bits
    /// above `man_bits` mantissa bits), random sign and mantissa: sums and products that round.
    fn near(r: &mut SmallRng, a: u16, man_bits: u32, spread: i32) -> u16 {
        let exp_max = (0x7fff_u16 >> man_bits) as i32; // all ones = inf/NaN
        let e = ((a & 0x7fff) >> man_bits) as i32 + r.random_range(-spread..=spread);
        let e = e.clamp(0, exp_max - 1) as u16;
        let man = r.random::<u16>() & ((1 << man_bits) - 1);
        (r.random::<u16>() & 0x8000) | (e << man_bits) | man
    }

    const F16_EDGES: &[u16] = &[
        0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x03ff, 0x83ff, 0x0400, 0x8400, 0x0401, 0x1000,
        0x3bff, 0x3c00, 0xbc00, 0x3c01, 0xbc01, 0x3e00, 0x4000, 0x4c00, 0x5800, 0x7800, 0x7bfe,
        0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7c01, 0x7e00, 0xfe00, 0x7fff, 0x2400, 0x2000, 0x1c00,
        0x0bff, 0x8bff, 0x5bff,
    ];
    const BF16_EDGES: &[u16] = &[
        0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x007f, 0x807f, 0x0080, 0x8080, 0x0081, 0x0100,
        0x3f7f, 0x3f80, 0xbf80, 0x3f81, 0xbf81, 0x3fc0, 0x4000, 0x4380, 0x7f00, 0x7f7e, 0x7f7f,
        0xff7f, 0x7f80, 0xff80, 0x7f81, 0x7fc0, 0xffc0, 0x7fff, 0x1f80, 0x1f00, 0x3380, 0x3380,
        0x0c00, 0x8c00, 0x5f7f,
    ];

    #[test]
    fn f16_to_f32_exhaustive() {
        for h in 0..=u16::MAX {
            let ours = F16::from_bits(h).to_f32();
            let theirs = f16::from_bits(h).to_f32();
            assert_eq!(ours.to_bits(), f16_bits_to_f32(h).to_bits());
            assert_eq!(ours.is_sign_negative(), h & 0x8000 != 0, "{h:#06x}");
            if f16_is_nan(h) {
                assert!(ours.is_nan() && theirs.is_nan(), "{h:#06x}");
                // Quieted, payload kept.
                assert_eq!(
                    (ours.to_bits() >> 13) & 0x3ff,
                    u32::from(h & 0x3ff) | 0x200,
                    "{h:#06x}"
                );
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#06x}");
                if h & 0x7fff == 0x7c00 {
                    assert!(ours.is_infinite());
                } else {
                    assert_eq!(f64::from(ours), f16_value(h), "{h:#06x}");
                }
            }
        }
    }

    #[test]
    fn f16_round_trip_exhaustive() {
        for h in 0..=u16::MAX {
            let back = F16::from_f32(F16::from_bits(h).to_f32()).to_bits();
            let via_half = F16::from_f32(f16::from_bits(h).to_f32()).to_bits();
            if f16_is_nan(h) {
                assert!(
                    f16_is_nan(back) && f16_is_nan(via_half),
                    "{h:#06x} -> {back:#06x}"
                );
                assert_eq!(back & 0x8000, h & 0x8000);
            } else {
                assert_eq!(back, h);
                assert_eq!(via_half, h);
            }
        }
    }

    #[test]
    fn bf16_to_f32_and_round_trip_exhaustive() {
        for h in 0..=u16::MAX {
            let ours = Bf16::from_bits(h).to_f32();
            let theirs = bf16::from_bits(h).to_f32();
            let back = Bf16::from_f32(ours).to_bits();
            assert_eq!(ours.is_sign_negative(), h & 0x8000 != 0, "{h:#06x}");
            if bf16_is_nan(h) {
                assert!(ours.is_nan() && theirs.is_nan(), "{h:#06x}");
                assert!(bf16_is_nan(back), "{h:#06x} -> {back:#06x}");
                assert_eq!(back & 0x8000, h & 0x8000);
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#06x}");
                assert_eq!(back, h);
            }
        }
    }

    /// Our rounding of `x` against half's, for both 16-bit types.
    #[track_caller]
    fn check_f32_rounding(x: f32) {
        let (ours, theirs) = (F16::from_f32(x).to_bits(), f16::from_f32(x).to_bits());
        if x.is_nan() {
            assert!(
                f16_is_nan(ours) && f16_is_nan(theirs),
                "{:#010x} -> {ours:#06x}",
                x.to_bits()
            );
            assert_eq!(ours & 0x8000 != 0, x.is_sign_negative());
        } else {
            assert_eq!(ours, theirs, "f16 of {:#010x} ({x:e})", x.to_bits());
        }
        let (ours, theirs) = (Bf16::from_f32(x).to_bits(), bf16::from_f32(x).to_bits());
        if x.is_nan() {
            assert!(
                bf16_is_nan(ours) && bf16_is_nan(theirs),
                "{:#010x} -> {ours:#06x}",
                x.to_bits()
            );
            assert_eq!(ours & 0x8000 != 0, x.is_sign_negative());
        } else {
            assert_eq!(ours, theirs, "bf16 of {:#010x} ({x:e})", x.to_bits());
        }
    }

    #[test]
    fn f32_to_16bit_random_vs_half() {
        let mut r = rng(1);
        for _ in 0..(1 << 21) {
            // Uniform bit patterns (every exponent, NaNs, subnormals) ...
            check_f32_rounding(f32::from_bits(r.random()));
            // ... and patterns whose exponent is near binary16's range, where it rounds.
            let exp = r.random_range(100u32..=145) << 23;
            check_f32_rounding(f32::from_bits((r.random::<u32>() & 0x807f_ffff) | exp));
        }
    }

    #[test]
    fn f32_to_f16_ties_and_boundaries() {
        // Between every pair of neighbouring binary16 values (the last pair is 65504 and the
        // overflow threshold's other side, 2^16): below the midpoint rounds down, above rounds
        // up, the midpoint itself goes to the even one. Known by construction, not by `half`.
        for v in 0u16..0x7c00 {
            let lo = f16_value(v);
            let hi = if v == 0x7bff {
                65536.0
            } else {
                f16_value(v + 1)
            };
            let mid = ((lo + hi) / 2.0) as f32; // 12 significant bits: exact
            assert_eq!(f64::from(mid), (lo + hi) / 2.0);
            let even = if v & 1 == 0 { v } else { v + 1 };
            for sign in [0u16, 0x8000] {
                let s = if sign == 0 { 1.0f32 } else { -1.0 };
                let cases = [
                    (lo as f32, v),
                    ((lo as f32).next_up(), v),
                    (mid.next_down(), v),
                    (mid, even),
                    (mid.next_up(), v + 1),
                ];
                for (x, want) in cases {
                    let x = s * x;
                    assert_eq!(
                        F16::from_f32(x).to_bits(),
                        sign | want,
                        "{:#010x}",
                        x.to_bits()
                    );
                    check_f32_rounding(x);
                }
            }
        }
        let p = |e: i32| 2f32.powi(e);
        let cases = [
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (65504.0, 0x7bff),
            (65520.0f32.next_down(), 0x7bff),
            (65520.0, 0x7c00), // 65504 + half an ulp: tie, to even (infinity)
            (-65520.0, 0xfc00),
            (f32::MAX, 0x7c00),
            (f32::MIN, 0xfc00),
            (f32::INFINITY, 0x7c00),
            (f32::NEG_INFINITY, 0xfc00),
            (f32::from_bits(1), 0x0000),
            (-f32::from_bits(1), 0x8000),
            (f32::MIN_POSITIVE, 0x0000),
            (p(-24), 0x0001), // the smallest subnormal
            (p(-25), 0x0000), // tie, to even (zero)
            (-p(-25), 0x8000),
            (p(-25).next_up(), 0x0001),
            (1.5 * p(-24), 0x0002),    // tie, to even
            (p(-14) - p(-24), 0x03ff), // the largest subnormal
            (p(-14) - p(-25), 0x0400), // tie, to even (the smallest normal)
            (p(-14), 0x0400),
            (1.0 + p(-11), 0x3c00),       // tie, to even
            (1.0 + 3.0 * p(-11), 0x3c02), // tie, to even
        ];
        for (x, want) in cases {
            assert_eq!(F16::from_f32(x).to_bits(), want, "{x:e}");
            check_f32_rounding(x);
        }
        for nan in [
            0x7fc0_0000u32,
            0x7f80_0001,
            0xff80_0001,
            0x7fff_ffff,
            0xffc0_0000,
            0x7f80_2000,
        ] {
            check_f32_rounding(f32::from_bits(nan));
        }
    }

    #[test]
    fn f32_to_bf16_ties_and_boundaries() {
        for v in 0u16..0x7f80 {
            // bfloat16 is the top half of an f32: the midpoint is `v` with bit 15 set.
            let lo = f32::from_bits(u32::from(v) << 16);
            let mid = f32::from_bits((u32::from(v) << 16) | 0x8000);
            let even = if v & 1 == 0 { v } else { v + 1 };
            for sign in [0u16, 0x8000] {
                let s = if sign == 0 { 1.0f32 } else { -1.0 };
                let cases = [
                    (lo, v),
                    (lo.next_up(), v),
                    (mid.next_down(), v),
                    (mid, even),
                    (mid.next_up(), v + 1),
                ];
                for (x, want) in cases {
                    let x = s * x;
                    assert_eq!(
                        Bf16::from_f32(x).to_bits(),
                        sign | want,
                        "{:#010x}",
                        x.to_bits()
                    );
                    check_f32_rounding(x);
                }
            }
        }
        let cases: &[(u32, u16)] = &[
            (0x7f7f_7fff, 0x7f7f), // just below the overflow threshold
            (0x7f7f_8000, 0x7f80), // the threshold: tie, to even (infinity)
            (0x7f7f_ffff, 0x7f80), // f32::MAX
            (0xff7f_ffff, 0xff80),
            (0x7f80_0000, 0x7f80),
            (0xff80_0000, 0xff80),
            (0x0000_8000, 0x0000), // half the smallest bf16 subnormal: tie, to even
            (0x0000_8001, 0x0001),
            (0x0001_8000, 0x0002),
            (0x007f_ffff, 0x0080), // largest f32 subnormal rounds up to the smallest normal
            (0x8000_0000, 0x8000),
        ];
        for &(x, want) in cases {
            assert_eq!(
                Bf16::from_f32(f32::from_bits(x)).to_bits(),
                want,
                "{x:#010x}"
            );
            check_f32_rounding(f32::from_bits(x));
        }
        for nan in [
            0x7fc0_0000u32,
            0x7f80_0001,
            0xff80_0001,
            0x7fff_ffff,
            0xffc0_0000,
            0x7f80_ffff,
        ] {
            check_f32_rounding(f32::from_bits(nan));
        }
    }

    #[track_caller]
    fn check_16bit_step(a: u16, b: u16) {
        let (fa, fb) = (F16::from_bits(a), F16::from_bits(b));
        for (got, want, what) in [
            (fa.add(fb), f16_add_ref(a, b), "+"),
            (fa.mul(fb), f16_mul_ref(a, b), "*"),
        ] {
            assert!(
                got.same_result(F16::from_bits(want)),
                "f16 {a:#06x} {what} {b:#06x} = {:#06x}, want {want:#06x}",
                got.to_bits()
            );
        }
        let (ba, bb) = (Bf16::from_bits(a), Bf16::from_bits(b));
        for (got, want, what) in [
            (ba.add(bb), bf16_add_ref(a, b), "+"),
            (ba.mul(bb), bf16_mul_ref(a, b), "*"),
        ] {
            assert!(
                got.same_result(Bf16::from_bits(want)),
                "bf16 {a:#06x} {what} {b:#06x} = {:#06x}, want {want:#06x}",
                got.to_bits()
            );
        }
    }

    #[test]
    fn f16_bf16_add_mul_edge_pairs() {
        for &a in F16_EDGES.iter().chain(BF16_EDGES) {
            for &b in F16_EDGES.iter().chain(BF16_EDGES) {
                check_16bit_step(a, b);
            }
        }
        // A few results known by hand, which also check the references.
        let f = |a: u16, b: u16| F16::from_bits(a).add(F16::from_bits(b)).to_bits();
        assert_eq!(f(0x3c00, 0x1000), 0x3c00); // 1 + 2^-11: tie, to even
        assert_eq!(f(0x3c01, 0x1000), 0x3c02); // tie, to even (up)
        assert_eq!(f(0x7bff, 0x4c00), 0x7c00); // 65504 + 16 = 65520: tie, to even = inf
        assert_eq!(f(0x7bff, 0x4bff), 0x7bff); // 65504 + 15.99: below the threshold
        assert_eq!(f(0x8000, 0x8000), 0x8000); // -0 + -0
        assert_eq!(f(0x0000, 0x8000), 0x0000); // +0 + -0
        assert_eq!(f(0x3c00, 0xbc00), 0x0000); // x - x = +0
        assert_eq!(f(0x0001, 0x0001), 0x0002); // subnormals add exactly
        assert!(f16_is_nan(f(0x7c00, 0xfc00)));
        let m = |a: u16, b: u16| F16::from_bits(a).mul(F16::from_bits(b)).to_bits();
        assert_eq!(m(0x0001, 0x3800), 0x0000); // 2^-24 * 0.5: tie, to even (zero)
        assert_eq!(m(0x0001, 0x3e00), 0x0002); // 2^-24 * 1.5: tie, to even
        assert_eq!(m(0x8001, 0x0001), 0x8000); // underflow keeps the sign
        assert!(f16_is_nan(m(0x0000, 0x7c00)));
        let b = |a: u16, b: u16| Bf16::from_bits(a).add(Bf16::from_bits(b)).to_bits();
        assert_eq!(b(0x3f80, 0x3b80), 0x3f80); // 1 + 2^-8: tie, to even
        assert_eq!(b(0x3f81, 0x3b80), 0x3f82);
        assert_eq!(b(0x7f7f, 0x7b00), 0x7f80); // max + 2^119 (half an ulp): tie, to even = inf
        assert_eq!(b(0x7f7f, 0x7a80), 0x7f7f); // max + a quarter ulp
        assert_eq!(b(0x7f7f, 0x0001), 0x7f7f); // a 254-bit exponent gap
        assert_eq!(b(0x0001, 0x0001), 0x0002);
    }

    #[test]
    fn f16_bf16_add_mul_random_pairs() {
        let mut r = rng(2);
        for a in 0..=u16::MAX {
            for _ in 0..4 {
                check_16bit_step(a, r.random());
                check_16bit_step(a, near(&mut r, a, 10, 12)); // binary16 exponents
                check_16bit_step(a, near(&mut r, a, 7, 9)); // bfloat16 exponents
            }
        }
    }

    #[test]
    fn f32_f64_add_mul_keep_subnormals() {
        let tiny = f32::from_bits(1);
        assert_eq!(tiny.add(tiny).to_bits(), 2);
        assert_eq!(f32::MIN_POSITIVE.mul(0.5).to_bits(), 0x0040_0000);
        assert_eq!(
            f32::MIN_POSITIVE
                .add(-f32::from_bits(0x0080_0001))
                .to_bits(),
            0x8000_0001
        );
        assert_eq!(tiny.mul(0.5).to_bits(), 0); // 2^-150: tie, to even
        assert_eq!(tiny.mul(1.5).to_bits(), 2); // tie, to even
        let tiny = f64::from_bits(1);
        assert_eq!(tiny.add(tiny).to_bits(), 2);
        assert_eq!(f64::MIN_POSITIVE.mul(0.5).to_bits(), 0x0008_0000_0000_0000);
        assert_eq!(tiny.mul(1.5).to_bits(), 2);
        let mut r = rng(3);
        for _ in 0..100_000 {
            let (a, b) = (f32::from_bits(r.random()), f32::from_bits(r.random()));
            assert!(a.add(b).same_result(a + b) && a.mul(b).same_result(a * b));
            // Subnormal operands (exponent field 0 or 1) and subnormal results: the f64
            // sum / product is exact, so converting it rounds once.
            let a = f32::from_bits(r.random::<u32>() & 0x80ff_ffff);
            let b = f32::from_bits(r.random::<u32>() & 0x80ff_ffff);
            let c = r.random_range(-4.0f32..4.0);
            assert_eq!(
                a.add(b).to_bits(),
                ((f64::from(a) + f64::from(b)) as f32).to_bits()
            );
            assert_eq!(
                a.mul(c).to_bits(),
                ((f64::from(a) * f64::from(c)) as f32).to_bits()
            );
        }
    }

    // ---- min / max / same_result ----

    /// Reference min/max: a NaN operand is ignored; otherwise the smaller (larger) value in
    /// IEEE's total order, where -0 < +0. Returns the chosen operand itself.
    fn minmax_ref<T: Copy>(a: T, b: T, va: f64, vb: f64, min: bool) -> T {
        if va.is_nan() {
            return b;
        }
        if vb.is_nan() {
            return a;
        }
        let a_first = va.total_cmp(&vb).is_le();
        if a_first == min {
            a
        } else {
            b
        }
    }

    /// Checks min and max of `a, b` (values `va, vb`) against the reference, both orders.
    #[track_caller]
    fn check_minmax<T: Element + core::fmt::Debug>(a: T, b: T, va: f64, vb: f64) {
        for (x, y, vx, vy) in [(a, b, va, vb), (b, a, vb, va)] {
            for min in [true, false] {
                let got = if min { x.min(y) } else { x.max(y) };
                if va.is_nan() && vb.is_nan() {
                    assert!(
                        got.same_result(x),
                        "both NaN must give NaN: {x:?} {y:?} -> {got:?}"
                    );
                } else {
                    let want = minmax_ref(x, y, vx, vy, min);
                    assert!(
                        got.to_raw() == want.to_raw(),
                        "{}({x:?}, {y:?}) = {got:?}, want {want:?}",
                        if min { "min" } else { "max" }
                    );
                }
            }
        }
    }

    fn f32_edges() -> Vec<f32> {
        let mut v = std::vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::EPSILON,
        ];
        v.extend([1u32, 0x8000_0001, 0x7f80_0001, 0xffc0_1234, 0x007f_ffff].map(f32::from_bits));
        v
    }
    fn f64_edges() -> Vec<f64> {
        let mut v = std::vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            f64::EPSILON,
        ];
        v.extend(
            [
                1u64,
                0x8000_0000_0000_0001,
                0x7ff0_0000_0000_0001,
                0xfff8_0000_0000_1234,
            ]
            .map(f64::from_bits),
        );
        v
    }

    #[test]
    fn float_min_max() {
        let mut r = rng(4);
        let f32s: Vec<f32> = f32_edges()
            .into_iter()
            .chain((0..300).map(|_| f32::from_bits(r.random())))
            .collect();
        let f64s: Vec<f64> = f64_edges()
            .into_iter()
            .chain((0..300).map(|_| f64::from_bits(r.random())))
            .collect();
        for &a in &f32s {
            for &b in &f32s {
                check_minmax(a, b, f64::from(a), f64::from(b));
            }
        }
        for &a in &f64s {
            for &b in &f64s {
                check_minmax(a, b, a, b);
            }
        }
        let h16: Vec<u16> = F16_EDGES
            .iter()
            .chain(BF16_EDGES)
            .copied()
            .chain((0..300).map(|_| r.random()))
            .collect();
        for &a in &h16 {
            for &b in &h16 {
                let (fa, fb) = (f16::from_bits(a).to_f64(), f16::from_bits(b).to_f64());
                check_minmax(F16(a), F16(b), fa, fb);
                let (fa, fb) = (bf16::from_bits(a).to_f64(), bf16::from_bits(b).to_f64());
                check_minmax(Bf16(a), Bf16(b), fa, fb);
            }
        }
        // Spelled out: NaN ignored, -0 < +0, both NaN gives NaN.
        assert_eq!(f32::NAN.min(2.0), 2.0);
        assert_eq!(Element::max(2.0f32, f32::NAN), 2.0);
        assert_eq!(Element::min(0.0f64, -0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(Element::max(-0.0f64, 0.0).to_bits(), 0);
        assert_eq!(F16(0x8000).max(F16(0x0000)), F16(0x0000));
        assert_eq!(F16(0x0000).min(F16(0x8000)), F16(0x8000));
        assert_eq!(Bf16(0x7fc1).min(Bf16(0xbf80)), Bf16(0xbf80));
        assert!(Bf16(0x7fc1).max(Bf16(0xffc0)).is_nan());
        assert!(F16(0x7e00).min(F16(0x7c01)).is_nan());
    }

    #[test]
    fn data_type_matches_the_element_types() {
        fn check<T: Element>(want: DataType) {
            assert_eq!(T::DTYPE, want);
            assert_eq!(T::DTYPE.size(), T::SIZE, "{}", T::NAME);
            assert_eq!(T::NAME, want.name());
        }
        check::<f32>(DataType::F32);
        check::<f64>(DataType::F64);
        check::<F16>(DataType::F16);
        check::<Bf16>(DataType::BF16);
        check::<i8>(DataType::I8);
        check::<u8>(DataType::U8);
        check::<i32>(DataType::I32);
        check::<u32>(DataType::U32);
        check::<i64>(DataType::I64);
        check::<u64>(DataType::U64);
        check::<F8E4M3>(DataType::F8E4M3);
        check::<F8E5M2>(DataType::F8E5M2);
        let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(
            names,
            [
                "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64", "f8e4m3",
                "f8e5m2"
            ]
        );
        for (i, d) in DataType::ALL.into_iter().enumerate() {
            assert_eq!(d.index(), i);
        }
    }

    #[test]
    fn same_result_rules() {
        assert!(1.0f32.same_result(1.0));
        assert!(!0.0f32.same_result(-0.0));
        assert!(f32::NAN.same_result(f32::from_bits(0xffc0_1234)));
        assert!(!f32::NAN.same_result(f32::INFINITY));
        assert!(!1.0f32.same_result(f32::NAN));
        assert!(!0.0f64.same_result(-0.0));
        assert!(f64::NAN.same_result(-f64::NAN));
        assert!(!f64::NAN.same_result(1.0));
        assert!(F16(0x7e00).same_result(F16(0xfc01)));
        assert!(!F16(0x7c00).same_result(F16(0x7c01)));
        assert!(!F16(0x0000).same_result(F16(0x8000)));
        assert!(Bf16(0x7fc0).same_result(Bf16(0xff81)));
        assert!(!Bf16(0x7f80).same_result(Bf16(0x7f81)));
        assert!(!Bf16(0x0000).same_result(Bf16(0x8000)));
        assert!(7i8.same_result(7) && !7u64.same_result(8));
        // Over every 16-bit pair class: same bits, or both NaN.
        for a in (0..=u16::MAX).step_by(97) {
            for b in (0..=u16::MAX).step_by(89) {
                let want = a == b || (f16_is_nan(a) && f16_is_nan(b));
                assert_eq!(F16(a).same_result(F16(b)), want, "{a:#06x} {b:#06x}");
                let want = a == b || (bf16_is_nan(a) && bf16_is_nan(b));
                assert_eq!(Bf16(a).same_result(Bf16(b)), want, "{a:#06x} {b:#06x}");
            }
        }
    }

    // ---- integers ----

    /// Edge values of an integer type as raw bits: 0, 1, 2, MAX, MIN, -1 / MAX, ... and randoms.
    fn int_samples<T: Element>(r: &mut SmallRng) -> Vec<T> {
        let mask = u64::MAX >> (64 - 8 * T::SIZE);
        let half = mask >> 1;
        let mut raws = std::vec![
            0,
            1,
            2,
            3,
            7,
            mask,
            mask - 1,
            mask - 2,
            half,
            half - 1,
            half + 1,
            half + 2
        ];
        raws.extend((0..40).map(|_| r.random::<u64>() & mask));
        raws.into_iter().map(T::from_raw).collect()
    }

    fn check_int_wrapping<T: Element + core::fmt::Debug>(r: &mut SmallRng) {
        let bits = 8 * T::SIZE as u32;
        let mask = u128::from(u64::MAX >> (64 - bits));
        for a in int_samples::<T>(r) {
            assert_eq!(T::from_raw(a.to_raw()), a);
            assert_eq!(u128::from(a.to_raw()) & !mask, 0, "to_raw zero-extends");
            for b in int_samples::<T>(r) {
                let (x, y) = (u128::from(a.to_raw()), u128::from(b.to_raw()));
                // Two's complement add and mul are the same mod 2^bits for signed and unsigned.
                let sum = T::from_raw(((x + y) & mask) as u64);
                let prod = T::from_raw(((x * y) & mask) as u64);
                assert_eq!(a.add(b), sum, "{}: {a:?} + {b:?}", T::NAME);
                assert_eq!(a.mul(b), prod, "{}: {a:?} * {b:?}", T::NAME);
            }
        }
    }

    macro_rules! int_checks {
        ($r:expr; $($t:ty),*) => {$({
            check_int_wrapping::<$t>($r);
            let samples = int_samples::<$t>($r);
            for &a in &samples {
                for &b in &samples {
                    assert_eq!(Element::min(a, b), Ord::min(a, b));
                    assert_eq!(Element::max(a, b), Ord::max(a, b));
                }
                // div_n: truncation toward zero, computed from |a| / n in i128.
                for n in [0u32, 1, 2, 3, 4, 7, 8, 100, 127, 128, 255, 256, 1000, 65536, 1 << 31, u32::MAX] {
                    let got = a.div_n(n);
                    let want = if n == 0 {
                        a
                    } else {
                        let q = (a as i128).unsigned_abs() / u128::from(n);
                        (if (a as i128) < 0 { -(q as i128) } else { q as i128 }) as $t
                    };
                    assert_eq!(got, want, "{}: {a} / {n}", <$t as Element>::NAME);
                }
            }
        })*};
    }

    #[test]
    fn integer_step() {
        let mut r = rng(5);
        int_checks!(&mut r; i8, u8, i32, u32, i64, u64);
        // Spelled out.
        assert_eq!(i8::MAX.add(1), i8::MIN);
        assert_eq!(i8::MIN.mul(-1), i8::MIN);
        assert_eq!(u8::MAX.add(1), 0);
        assert_eq!(16u8.mul(16), 0);
        assert_eq!(i32::MIN.add(-1), i32::MAX);
        assert_eq!(u32::MAX.mul(u32::MAX), 1);
        assert_eq!(i64::MIN.add(i64::MIN), 0);
        assert_eq!(i64::MAX.mul(2), -2);
        assert_eq!(u64::MAX.add(2), 1);
        assert_eq!((-7i32).div_n(2), -3);
        assert_eq!((-1i8).div_n(2), 0);
        assert_eq!(i8::MIN.div_n(128), -1);
        assert_eq!(i8::MIN.div_n(129), 0);
        assert_eq!(i64::MIN.div_n(1), i64::MIN);
        assert_eq!(i64::MIN.div_n(2), i64::MIN / 2);
        assert_eq!(i64::MIN.div_n(3), -3_074_457_345_618_258_602);
        assert_eq!(u64::MAX.div_n(3), 6_148_914_691_236_517_205);
        assert_eq!(u64::MAX.div_n(u32::MAX), 4_294_967_297);
        assert_eq!(u8::MAX.div_n(u32::MAX), 0);
        assert_eq!(i32::MIN.div_n(0), i32::MIN);
    }

    #[test]
    fn small_int_div_n_exhaustive() {
        for n in 0u32..=300 {
            for a in i8::MIN..=i8::MAX {
                let want = if n == 0 {
                    a
                } else {
                    (i32::from(a) / n as i32) as i8
                };
                assert_eq!(a.div_n(n), want, "{a} / {n}");
            }
            for a in 0..=u8::MAX {
                let want = u32::from(a).checked_div(n).map_or(a, |q| q as u8);
                assert_eq!(a.div_n(n), want, "{a} / {n}");
            }
        }
    }

    // ---- float div_n (avg's last step) ----

    /// Correctly rounded `x / n` for a 16-bit float: the f64 quotient plus the sign of the
    /// exact remainder, rounded to odd in f32, then to nearest in the 16-bit type.
    fn div_ref_f32(x: f64, n: u32) -> f32 {
        let q = x / f64::from(n);
        let rem = (-q).mul_add(f64::from(n), x); // x - q * n, exact
        round_to_odd_f32(q, rem)
    }

    /// Rank counts checked exhaustively for the 16-bit types.
    const DIV_NS: &[u32] = &[
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 24, 31, 32, 48, 63, 64, 100, 127,
        255, 256, 257, 1000, 1023, 1024, 2047, 2049, 4095, 4097, 10_000, 65535, 65536,
    ];

    #[test]
    fn f16_bf16_div_n_exhaustive() {
        for &n in DIV_NS {
            for h in 0..=u16::MAX {
                let got = F16(h).div_n(n);
                let x = f16::from_bits(h).to_f64();
                let want = F16(f16::from_f32(div_ref_f32(x, n)).to_bits());
                assert!(
                    got.same_result(want),
                    "f16 {h:#06x} / {n} = {got:?}, want {want:?}"
                );
                let got = Bf16(h).div_n(n);
                let x = bf16::from_bits(h).to_f64();
                let want = Bf16(bf16::from_f32(div_ref_f32(x, n)).to_bits());
                assert!(
                    got.same_result(want),
                    "bf16 {h:#06x} / {n} = {got:?}, want {want:?}"
                );
            }
        }
    }

    #[test]
    fn f32_f64_div_n() {
        let mut r = rng(6);
        let ns = [
            1u32,
            2,
            3,
            5,
            7,
            8,
            9,
            100,
            255,
            1000,
            4099,
            65537,
            (1 << 24) - 1,
            1 << 24,
        ];
        for x in f32_edges()
            .into_iter()
            .chain((0..20_000).map(|_| f32::from_bits(r.random())))
        {
            for n in ns {
                // f64 has >= 2 * 24 + 2 bits and n is exact in f32: the double rounding
                // through f64 is innocuous (Figueroa), so this is the correctly rounded x / n.
                let want = (f64::from(x) / f64::from(n)) as f32;
                assert!(x.div_n(n).same_result(want), "{x:e} / {n}");
            }
        }
        for x in f64_edges()
            .into_iter()
            .chain((0..20_000).map(|_| f64::from_bits(r.random())))
        {
            for n in ns.into_iter().chain([u32::MAX]) {
                assert!(x.div_n(n).same_result(x / f64::from(n)), "{x:e} / {n}");
            }
        }
        assert_eq!(1.0f64.div_n(3).to_bits(), 0x3fd5_5555_5555_5555);
        assert_eq!(1.0f32.div_n(3).to_bits(), 0x3eaa_aaab);
        assert_eq!(10.0f32.div_n(4), 2.5);
        assert_eq!(f32::from_bits(3).div_n(2).to_bits(), 2); // subnormal: 1.5 ulp, tie to even
        assert_eq!(f64::from_bits(3).div_n(2).to_bits(), 2);
        assert_eq!(F16(0x0003).div_n(2), F16(0x0002)); // 1.5 * 2^-24: tie, to even
        assert_eq!(F16(0x3c00).div_n(3), F16(0x3555)); // 1/3
        assert_eq!(Bf16(0x3f80).div_n(3), Bf16(0x3eab)); // 1/3
    }

    /// `n == 0` returns the operand unchanged; `n == 1` too, except that a NaN may be quieted.
    #[test]
    fn div_n_by_zero_and_one() {
        fn check<T: Element + core::fmt::Debug>(xs: impl IntoIterator<Item = T>) {
            for x in xs {
                assert_eq!(x.div_n(0).to_raw(), x.to_raw(), "{x:?} / 0");
                // Same bits, or both NaN.
                let one = x.div_n(1);
                assert!(one.same_result(x), "{x:?} / 1 = {one:?}");
            }
        }
        let mut r = rng(7);
        check(f32_edges());
        check(f64_edges());
        check((0..=u16::MAX).map(F16));
        check((0..=u16::MAX).map(Bf16));
        check((0..=u8::MAX).map(F8E4M3));
        check((0..=u8::MAX).map(F8E5M2));
        check(int_samples::<i8>(&mut r));
        check(int_samples::<u8>(&mut r));
        check(int_samples::<i32>(&mut r));
        check(int_samples::<u32>(&mut r));
        check(int_samples::<i64>(&mut r));
        check(int_samples::<u64>(&mut r));
    }
    // ---- fp8 ----

    /// The value of fp8 bits from the format's definition (`None` for NaN): `man` mantissa
    /// bits, exponent bias `bias`; `inf_exp` whether the all-ones exponent holds infinity and
    /// NaN (E5M2) or ordinary values with `S.1111.111` the only NaN (E4M3).
    fn fp8_value(x: u8, man: u32, bias: i32, ieee: bool) -> Option<f64> {
        let sign = if x & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp_bits = 7 - man;
        let e = i32::from((x & 0x7f) >> man);
        let m = f64::from(x & ((1 << man) - 1));
        let all_ones = (1 << exp_bits) - 1;
        if ieee && e == all_ones {
            return if m == 0.0 {
                Some(sign * f64::INFINITY)
            } else {
                None
            };
        }
        if !ieee && x & 0x7f == 0x7f {
            return None;
        }
        let scale = 2f64.powi(1 - bias - man as i32);
        let mag = if e == 0 {
            m * scale
        } else {
            (m + f64::from(1u32 << man)) * 2f64.powi(e - 1) * scale
        };
        Some(sign * mag)
    }
    fn e4m3_value(x: u8) -> Option<f64> {
        fp8_value(x, 3, 7, false)
    }
    fn e5m2_value(x: u8) -> Option<f64> {
        fp8_value(x, 2, 15, true)
    }

    /// The fp8 encoding nearest to `v` among the finite ones, ties to the even encoding, sign
    /// kept (CUDA's round-to-nearest with `__NV_SATFINITE`), by search over every encoding.
    /// `None` for NaN.
    fn fp8_round_ref(v: f64, value: fn(u8) -> Option<f64>) -> Option<u8> {
        if v.is_nan() {
            return None;
        }
        let sign = if v.is_sign_negative() { 0x80 } else { 0 };
        let a = v.abs();
        let finite: Vec<(u8, f64)> = (0u8..0x80)
            .filter_map(|c| value(c).filter(|x| x.is_finite()).map(|x| (c, x)))
            .collect();
        let largest = *finite.last().unwrap();
        if a >= largest.1 {
            // Beyond the largest finite value (infinity included): saturate. (A search would
            // see equal distances once they round in f64.)
            return Some(sign | largest.0);
        }
        let mut best = finite[0];
        for &(c, x) in &finite[1..] {
            let (d, db) = ((x - a).abs(), (best.1 - a).abs());
            if d < db || (d == db && c & 1 == 0) {
                best = (c, x);
            }
        }
        Some(sign | best.0)
    }

    /// NCCL's fp8 step by an independent route: exact values in f64, the binary16 operation
    /// rounded by the `half` crate, then the nearest finite fp8 by search.
    fn fp8_step_ref(a: u8, b: u8, op: usize, value: fn(u8) -> Option<f64>) -> Option<u8> {
        let (va, vb) = (value(a)?, value(b)?);
        let h = match op {
            0 => f16::from_f64(va + vb), // exact in f64: both have <= 4 bits, exponents in range
            1 => f16::from_f64(va * vb),
            _ => unreachable!(),
        };
        fp8_round_ref(h.to_f64(), value)
    }

    /// min/max reference: NaN ignored, -0 < +0, the chosen value back through the saturating
    /// conversion (an E5M2 infinity becomes the largest finite value, as in NCCL).
    fn fp8_minmax_ref(a: u8, b: u8, min: bool, value: fn(u8) -> Option<f64>) -> Option<u8> {
        let chosen = match (value(a), value(b)) {
            (None, None) => return None,
            (None, Some(_)) => b,
            (Some(_), None) => a,
            (Some(x), Some(y)) => {
                let a_first = x.total_cmp(&y).is_le();
                if a_first == min {
                    a
                } else {
                    b
                }
            }
        };
        fp8_round_ref(value(chosen).unwrap(), value)
    }

    fn check_fp8_exhaustive<T: Element + core::fmt::Debug>(value: fn(u8) -> Option<f64>) {
        let to = |r: Option<u8>| r.map_or(T::from_raw(0x7f), |b| T::from_raw(u64::from(b)));
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let (x, y) = (T::from_raw(a.into()), T::from_raw(b.into()));
                for (got, want, what) in [
                    (x.add(y), fp8_step_ref(a, b, 0, value), "+"),
                    (x.mul(y), fp8_step_ref(a, b, 1, value), "*"),
                    (x.min(y), fp8_minmax_ref(a, b, true, value), "min"),
                    (x.max(y), fp8_minmax_ref(a, b, false, value), "max"),
                ] {
                    assert!(
                        got.same_result(to(want)),
                        "{} {a:#04x} {what} {b:#04x} = {got:?}, want {want:?}",
                        T::NAME
                    );
                    // NaN results are NaN, and nothing else is.
                    assert_eq!(
                        want.is_none(),
                        got.same_result(T::from_raw(0x7f)) && value(got.to_raw() as u8).is_none()
                    );
                }
            }
        }
    }

    #[test]
    fn fp8_e4m3_steps_exhaustive() {
        check_fp8_exhaustive::<F8E4M3>(e4m3_value);
    }

    #[test]
    fn fp8_e5m2_steps_exhaustive() {
        check_fp8_exhaustive::<F8E5M2>(e5m2_value);
    }

    #[test]
    fn fp8_conversions_exhaustive() {
        for x in 0..=255u8 {
            // To binary16 and f32: exact.
            for (h, v) in [
                (F8E4M3(x).to_f16(), e4m3_value(x)),
                (F8E5M2(x).to_f16(), e5m2_value(x)),
            ] {
                match v {
                    None => assert!(f16::from_bits(h.0).is_nan(), "{x:#04x}"),
                    Some(v) => {
                        assert_eq!(
                            f16::from_bits(h.0).to_f64().to_bits(),
                            v.to_bits(),
                            "{x:#04x}"
                        )
                    }
                }
            }
            assert_eq!(
                F8E4M3(x).to_f32().to_bits(),
                F8E4M3(x).to_f16().to_f32().to_bits()
            );
            // Round trips.
            let back = F8E4M3::from_f16(F8E4M3(x).to_f16());
            assert!(back.same_result(F8E4M3(x)), "{x:#04x}");
            let back = F8E5M2::from_f16(F8E5M2(x).to_f16());
            let want = if x & 0x7f == 0x7c { x - 1 } else { x }; // inf saturates
            assert!(back.same_result(F8E5M2(want)), "{x:#04x} -> {back:?}");
        }
        // From every binary16 value, against the search.
        for h in 0..=u16::MAX {
            let v = f16::from_bits(h).to_f64();
            let got = F8E4M3::from_f16(F16(h));
            let want = fp8_round_ref(v, e4m3_value).map_or(F8E4M3(0x7f), F8E4M3);
            assert!(
                got.same_result(want),
                "e4m3 of f16 {h:#06x}: {got:?}, want {want:?}"
            );
            let got = F8E5M2::from_f16(F16(h));
            let want = fp8_round_ref(v, e5m2_value).map_or(F8E5M2(0x7f), F8E5M2);
            assert!(
                got.same_result(want),
                "e5m2 of f16 {h:#06x}: {got:?}, want {want:?}"
            );
        }
        // From f32: every tie and its neighbours, and random patterns.
        let mut r = rng(9);
        let mut xs: Vec<f32> = (0..200_000).map(|_| f32::from_bits(r.random())).collect();
        for c in 0u8..0x7f {
            for (value, man) in [(e4m3_value as fn(u8) -> Option<f64>, 3u32), (e5m2_value, 2)] {
                if let (Some(lo), Some(hi)) = (value(c), value(c + 1)) {
                    if hi.is_finite() {
                        let mid = ((lo + hi) / 2.0) as f32;
                        xs.extend([mid, mid.next_up(), mid.next_down(), -mid, lo as f32]);
                    }
                }
                let _ = man;
            }
        }
        xs.extend(f32_edges());
        for x in xs {
            let got = F8E4M3::from_f32(x);
            let want = fp8_round_ref(f64::from(x), e4m3_value).map_or(F8E4M3(0x7f), F8E4M3);
            assert!(
                got.same_result(want),
                "e4m3 of {:#010x}: {got:?}, want {want:?}",
                x.to_bits()
            );
            let got = F8E5M2::from_f32(x);
            let want = fp8_round_ref(f64::from(x), e5m2_value).map_or(F8E5M2(0x7f), F8E5M2);
            assert!(
                got.same_result(want),
                "e5m2 of {:#010x}: {got:?}, want {want:?}",
                x.to_bits()
            );
        }
    }

    #[test]
    fn fp8_edge_values_by_hand() {
        let e4 = |x: f32| F8E4M3::from_f32(x).to_bits();
        let e5 = |x: f32| F8E5M2::from_f32(x).to_bits();
        assert_eq!(
            (e4(448.0), e4(464.0), e4(464.1), e4(f32::INFINITY)),
            (0x7e, 0x7e, 0x7e, 0x7e)
        );
        assert_eq!((e4(-448.0), e4(f32::NEG_INFINITY)), (0xfe, 0xfe));
        assert_eq!(
            (
                e4(2f32.powi(-9)),
                e4(2f32.powi(-10)),
                e4(1.5 * 2f32.powi(-10))
            ),
            (0x01, 0x00, 0x01)
        );
        assert_eq!(
            (
                e4(-2f32.powi(-11)),
                e4(0.875 * 2f32.powi(-6)),
                e4(2f32.powi(-6))
            ),
            (0x80, 0x07, 0x08)
        );
        assert_eq!(
            (e4(1.0), e4(1.0625), e4(1.1875), e4(17.0)),
            (0x38, 0x38, 0x3a, 0x58)
        );
        assert_eq!(e4(f32::NAN) & 0x7f, 0x7f);
        assert_eq!(
            (e5(57344.0), e5(61439.0), e5(61440.0), e5(1e30)),
            (0x7b, 0x7b, 0x7b, 0x7b)
        );
        assert_eq!(
            (e5(f32::INFINITY), e5(2f32.powi(-16)), e5(2f32.powi(-17))),
            (0x7b, 0x01, 0x00)
        );
        assert_eq!(
            (e5(1.0), e5(1.125), e5(1.375), e5(-2.0)),
            (0x3c, 0x3c, 0x3e, 0xc0)
        );
        assert!(F8E5M2(e5(f32::NAN)).is_nan() && !F8E5M2(0x7c).is_nan() && F8E5M2(0xfd).is_nan());
        assert!(F8E4M3(0xff).is_nan() && !F8E4M3(0x7e).is_nan() && !F8E4M3(0x78).is_nan());
        // Steps (NCCL's semantics).
        let (a4, a5) = (
            |a: u8, b: u8| F8E4M3(a).add(F8E4M3(b)).0,
            |a: u8, b: u8| F8E5M2(a).add(F8E5M2(b)).0,
        );
        assert_eq!(a4(0x7e, 0x7e), 0x7e); // 448 + 448 saturates
        assert_eq!(a4(0x7e, 0xfe), 0x00); // 448 - 448 = +0
        assert_eq!(a4(0x01, 0x01), 0x02); // subnormals add exactly
        assert_eq!(a4(0x38, 0x18), 0x38); // 1 + 1/16: tie, to even
        assert_eq!(a4(0x39, 0x18), 0x3a); // 1.125 + 1/16: tie, to even (up)
        assert!(F8E4M3(a4(0x7f, 0x38)).is_nan());
        assert_eq!(a5(0x7c, 0x3c), 0x7b); // inf + 1 -> largest finite
        assert_eq!(a5(0x7b, 0x7b), 0x7b); // overflows binary16, saturates
        assert!(F8E5M2(a5(0x7c, 0xfc)).is_nan()); // inf - inf
        assert_eq!(F8E4M3(0x7e).mul(F8E4M3(0x7e)).0, 0x7e);
        assert_eq!(F8E4M3(0x01).mul(F8E4M3(0x30)).0, 0x00); // 2^-9 * 0.5: tie, to even (zero)
        assert_eq!(F8E4M3(0x81).mul(F8E4M3(0x01)).0, 0x80); // underflow keeps the sign
        assert_eq!(F8E5M2(0x7c).max(F8E5M2(0x3c)).0, 0x7b); // max(inf, 1) saturates
        assert_eq!(F8E5M2(0x7c).min(F8E5M2(0x3c)).0, 0x3c);
        assert_eq!(F8E4M3(0x7f).min(F8E4M3(0xb8)).0, 0xb8); // NaN ignored
        assert_eq!(F8E4M3(0x80).max(F8E4M3(0x00)).0, 0x00);
        assert_eq!(F8E4M3(0x38).div_n(3).0, F8E4M3::from_f32(1.0 / 3.0).0);
        assert_eq!(
            (F8E4M3(0x7f).div_n(0).0, F8E5M2(0x7c).div_n(1).0),
            (0x7f, 0x7c)
        );
    }

    #[test]
    fn fp8_div_n_is_the_correctly_rounded_quotient() {
        for &n in DIV_NS {
            for x in 0..=255u8 {
                if n <= 1 {
                    continue;
                }
                for (got, v, value) in [
                    (
                        F8E4M3(x).div_n(n).0,
                        e4m3_value(x),
                        e4m3_value as fn(u8) -> Option<f64>,
                    ),
                    (F8E5M2(x).div_n(n).0, e5m2_value(x), e5m2_value),
                ] {
                    let want = v.and_then(|v| fp8_round_ref(v / f64::from(n), value));
                    match want {
                        None => assert!(value(got).is_none(), "{x:#04x} / {n}"),
                        Some(w) => assert_eq!(got, w, "{x:#04x} / {n}"),
                    }
                }
            }
        }
    }
}
