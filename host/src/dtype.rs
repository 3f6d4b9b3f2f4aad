//! The element types ringccl moves, on the host side.

use gpu_kernels::element::{self as math, Bf16, Element, F16};

/// The element type of a buffer, as a run-time value (defined next to the kernels' math).
///
/// ```
/// use ringccl::DataType;
/// assert_eq!(DataType::BF16.size(), 2);
/// assert_eq!(DataType::ALL.len(), 12);
/// assert_eq!(DataType::F8E4M3.size(), 1);
/// ```
pub use gpu_kernels::DataType;

/// A Rust type ringccl can reduce: `f32 f64 half::f16 half::bf16 i8 u8 i32 u32 i64 u64`
/// and the fp8 types [`F8E4M3`] and [`F8E5M2`].
///
/// `Math` is the matching `gpu-kernels` type whose arithmetic is bit-identical to the GPU's;
/// the two have the same size and bits.
///
/// ```
/// use ringccl::{DataType, DeviceElement};
/// assert_eq!(<half::bf16 as DeviceElement>::DTYPE, DataType::BF16);
/// let x = half::f16::from_f32(1.5);
/// assert_eq!(x.to_math().to_f32(), 1.5);
/// ```
pub trait DeviceElement:
    cudarc::driver::DeviceRepr + Copy + Default + Send + Sync + std::fmt::Debug + 'static
{
    /// The bit-identical element type of `gpu-kernels`.
    type Math: Element;
    /// The run-time tag (the kernels' type's own).
    const DTYPE: DataType = <Self::Math as Element>::DTYPE;
    /// Same bits, as the kernels' type.
    fn to_math(self) -> Self::Math;
    /// Same bits, back.
    fn from_math(m: Self::Math) -> Self;
}

macro_rules! same_type {
    ($($t:ty;)*) => {$(
        impl DeviceElement for $t {
            type Math = $t;
            #[inline]
            fn to_math(self) -> $t { self }
            #[inline]
            fn from_math(m: $t) -> $t { m }
        }
    )*};
}

same_type! {
    f32; f64; i8; u8; i32; u32; i64; u64;
}

impl DeviceElement for half::f16 {
    type Math = F16;
    #[inline]
    fn to_math(self) -> F16 {
        F16(self.to_bits())
    }
    #[inline]
    fn from_math(m: F16) -> Self {
        half::f16::from_bits(m.0)
    }
}

impl DeviceElement for half::bf16 {
    type Math = Bf16;
    #[inline]
    fn to_math(self) -> Bf16 {
        Bf16(self.to_bits())
    }
    #[inline]
    fn from_math(m: Bf16) -> Self {
        half::bf16::from_bits(m.0)
    }
}

macro_rules! fp8_type {
    ($($t:ident, $nccl:literal, $cuda:literal, $max:literal, $one:literal;)*) => {$(
        #[doc = concat!("An fp8 element (NCCL's `", $nccl, "`), stored as its bits: the same layout")]
        #[doc = concat!("as CUDA's `", $cuda, "` type. Reductions follow NCCL's fp8")]
        /// arithmetic: each step widens both operands to binary16, computes one correctly
        /// rounded binary16 sum, product, min or max, and rounds back to fp8 (nearest, ties to
        /// even) saturating at the largest finite value (see `gpu_kernels::element`).
        ///
        /// ```
        #[doc = concat!("use ringccl::{DataType, DeviceElement, ", stringify!($t), "};")]
        #[doc = concat!("let one = ", stringify!($t), "::from_f32(1.0);")]
        #[doc = concat!("assert_eq!(one.to_bits(), ", $one, ");")]
        /// assert_eq!(one.to_f32(), 1.0);
        #[doc = concat!("assert_eq!(", stringify!($t), "::from_f32(1e9).to_f32(), ", $max, ".0); // saturates")]
        #[doc = concat!("assert_eq!(<", stringify!($t), " as DeviceElement>::DTYPE, DataType::", stringify!($t), ");")]
        /// ```
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $t(pub u8);

        impl $t {
            /// From raw bits.
            pub const fn from_bits(bits: u8) -> Self {
                $t(bits)
            }
            /// The raw bits.
            pub const fn to_bits(self) -> u8 {
                self.0
            }
            /// Rounds an `f32` to the nearest value, ties to even, saturating at the largest
            /// finite one (CUDA's `__nv_cvt_float_to_fp8` with `__NV_SATFINITE`); NaN stays NaN.
            pub fn from_f32(x: f32) -> Self {
                $t(math::$t::from_f32(x).0)
            }
            /// The exact value as an `f32`.
            pub fn to_f32(self) -> f32 {
                math::$t(self.0).to_f32()
            }
            /// Whether the value is a NaN.
            pub fn is_nan(self) -> bool {
                math::$t(self.0).is_nan()
            }
        }

        // SAFETY: a `repr(transparent)` wrapper of `u8`: plain bytes, any bit pattern valid.
        unsafe impl cudarc::driver::DeviceRepr for $t {}

        impl DeviceElement for $t {
            type Math = math::$t;
            #[inline]
            fn to_math(self) -> math::$t {
                math::$t(self.0)
            }
            #[inline]
            fn from_math(m: math::$t) -> Self {
                $t(m.0)
            }
        }
    )*};
}

fp8_type! {
    F8E4M3, "ncclFloat8e4m3", "__nv_fp8_e4m3", "448", "0x38";
    F8E5M2, "ncclFloat8e5m2", "__nv_fp8_e5m2", "57344", "0x3c";
}
