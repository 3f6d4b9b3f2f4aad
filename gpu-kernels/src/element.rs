//! Element types and their arithmetic, shared by the GPU kernels and the host.
//!
//! Every reduction step in ringccl combines two elements with one of these functions. The same
//! Rust source is compiled for the GPU (nvptx64) and for the host, so the host can compute the
//! exact bits a GPU step produces. The rules of one step:
//!
//! * **Integers** (`i8 u8 i32 u32 i64 u64`): sum and product wrap around (two's complement);
//!   min/max are exact; the average divides the (wrapped) sum by the rank count, truncating
//!   toward zero.
//! * **`f32`, `f64`**: IEEE 754 with round-to-nearest-even, subnormals kept (no flush to zero).
//! * **`F16`** (IEEE binary16) and **`Bf16`** (bfloat16): each sum or product is correctly rounded
//!   to the 16-bit type (round to nearest, ties to even), exactly as one hardware `add.rn.f16` /
//!   `add.rn.bf16` does. On the host it is computed in `f32` and rounded once: `f32` carries more
//!   than `2p + 2` bits of either type, so that double rounding is exact. On sm_90 the GPU uses
//!   the native f16/bf16 instructions; on sm_80 bf16 is computed the host's way, through `f32`.
//! * **min / max** (all float types): a NaN operand is ignored (IEEE `minNum`/`maxNum`); two
//!   NaNs give NaN; `-0.0` is smaller than `+0.0`. These are exact and written as comparisons,
//!   so host and GPU agree bit for bit.
//! * **avg**: a sum in every step; the last step divides by the rank count (`div_n`), correctly
//!   rounded in the element's type (`f32` arithmetic for f16/bf16).
//! * NaN results are NaN on both sides, but their payload bits may differ (the GPU returns the
//!   canonical NaN). Bit-identity checks treat two NaNs as equal.

/// An element type the kernels reduce. Sealed: implemented for the ten types ringccl supports.
///
/// ```
/// use gpu_kernels::element::{Element, F16};
/// let a = F16::from_f32(1.5);
/// assert_eq!(a.add(a).to_f32(), 3.0);
/// assert_eq!(7u8.mul(40), 24); // 280 wraps to 24
/// ```
pub trait Element: Copy + PartialEq + sealed::Sealed + 'static {
    /// Name used in kernel entry points and messages (`"f32"`, `"bf16"`, ...).
    const NAME: &'static str;
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
    ($($t:ty => $name:literal, $wide:ty, $unsigned:ty;)*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const NAME: &'static str = $name;
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
    i8 => "i8", i64, u8;
    u8 => "u8", u64, u8;
    i32 => "i32", i64, u32;
    u32 => "u32", u64, u32;
    i64 => "i64", i64, u64;
    u64 => "u64", u64, u64;
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
            if $is_min { a } else { b }
        } else if fb < fa {
            if $is_min { b } else { a }
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
    const NAME: &'static str = "f32";
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
        self.to_bits() == other.to_bits() || (self != self && other != other)
    }
}

impl sealed::Sealed for f64 {}
impl Element for f64 {
    const NAME: &'static str = "f64";
    #[inline(always)]
    fn to_raw(self) -> u64 {
        self.to_bits() as u64
    }
    #[inline(always)]
    fn from_raw(raw: u64) -> Self {
        f64::from_bits(raw as u64)
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
        self.to_bits() == other.to_bits() || (self != self && other != other)
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

impl F16 {
    /// From raw bits.
    #[inline(always)]
    pub const fn from_bits(bits: u16) -> Self {
        F16(bits)
    }
    /// The raw bits.
    #[inline(always)]
    pub const fn to_bits(self) -> u16 {
        self.0
    }
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
    #[inline(always)]
    fn is_nan(self) -> bool {
        (self.0 & 0x7fff) > 0x7c00
    }
}

impl Bf16 {
    /// From raw bits.
    #[inline(always)]
    pub const fn from_bits(bits: u16) -> Self {
        Bf16(bits)
    }
    /// The raw bits.
    #[inline(always)]
    pub const fn to_bits(self) -> u16 {
        self.0
    }
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
    #[inline(always)]
    fn is_nan(self) -> bool {
        (self.0 & 0x7fff) > 0x7f80
    }
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

impl sealed::Sealed for F16 {}
impl Element for F16 {
    const NAME: &'static str = "f16";
    #[inline(always)]
    fn to_raw(self) -> u64 {
        self.0 as u64
    }
    #[inline(always)]
    fn from_raw(raw: u64) -> Self {
        F16(raw as u16)
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        imp::f16_add(self, other)
    }
    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        imp::f16_mul(self, other)
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
            F16::from_f32(self.to_f32() / n as f32)
        }
    }
    #[inline(always)]
    fn same_result(self, other: Self) -> bool {
        self.0 == other.0 || (self.is_nan() && other.is_nan())
    }
}

impl sealed::Sealed for Bf16 {}
impl Element for Bf16 {
    const NAME: &'static str = "bf16";
    #[inline(always)]
    fn to_raw(self) -> u64 {
        self.0 as u64
    }
    #[inline(always)]
    fn from_raw(raw: u64) -> Self {
        Bf16(raw as u16)
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        imp::bf16_add(self, other)
    }
    #[inline(always)]
    fn mul(self, other: Self) -> Self {
        imp::bf16_mul(self, other)
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
            Bf16::from_f32(self.to_f32() / n as f32)
        }
    }
    #[inline(always)]
    fn same_result(self, other: Self) -> bool {
        self.0 == other.0 || (self.is_nan() && other.is_nan())
    }
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
